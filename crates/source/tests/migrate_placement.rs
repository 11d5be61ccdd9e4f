//! Migrating a share into a store whose fast tier is smaller than the share: stubs are
//! placed by their listed size, so the crawl ends `Done` with no tier ever above its
//! capacity (sampled through `Store::status` during the crawl), every byte equal to the
//! source and `finish` verifying. Once with the fast tier's capacity configured smaller
//! than the share, once on a real small file system (a loop-mounted ext4 whose room, not
//! the configured capacity, is the limit: the fetches would fail with ENOSPC there).
//! POSIX source over a temporary directory.

mod common;

use common::loop_ext4::LoopExt4;

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kaiso_source::PosixSource;
use kaiso_store::migrate::{CrawlState, Crawler, Migration, MigrationConfig, Migrations, finish};
use kaiso_store::{Ino, ROOT_INO, Store, StoreConfig};

const MIB: u64 = 1024 * 1024;

/// The share: 48 MiB in six files, two of them in a directory.
const FILES: &[(&str, u64)] = &[
    ("a", 12 * MIB),
    ("b", 12 * MIB),
    ("d/c", 12 * MIB),
    ("d/e", 8 * MIB),
    ("f", 3 * MIB),
    ("g", MIB),
];

fn source() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("d")).unwrap();
    for (seed, (name, len)) in FILES.iter().enumerate() {
        fs::write(
            src.path().join(name),
            common::content(seed as u64 + 1, *len as usize),
        )
        .unwrap();
    }
    src
}

/// A store with a fast tier at `fast` (capacity `fast_capacity`) and a 1 GiB slow tier.
fn open_store(dir: &Path, fast: &Path, fast_capacity: &str) -> Arc<Store> {
    let slow = dir.join("slow");
    fs::create_dir_all(fast).unwrap();
    fs::create_dir_all(&slow).unwrap();
    let cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{}\"\ncapacity = \"{fast_capacity}\"\nhigh_watermark = 0.9\nlow_watermark = 0.5\n\
         [[tier]]\nname = \"slow\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 0.9\nlow_watermark = 0.5\n",
        dir.join("state").display(),
        fast.display(),
        slow.display()
    );
    Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap()
}

fn resolve(store: &Store, path: &str) -> Ino {
    let mut ino = ROOT_INO;
    for c in path.split('/') {
        let a = store.lookup(ino, OsStr::new(c)).unwrap();
        store.forget(a.ino, 1);
        ino = a.ino;
    }
    ino
}

fn read_whole(store: &Store, ino: Ino) -> Vec<u8> {
    let o = store.open_file(ino, libc::O_RDONLY, false).unwrap();
    let mut out = Vec::new();
    loop {
        let d = store.read(o.fh, out.len() as u64, 4 << 20).unwrap();
        if d.is_empty() {
            break;
        }
        out.extend_from_slice(&d);
    }
    store.release(o.fh).unwrap();
    out
}

/// Every tier's used bytes against its capacity, sampled every 2 ms until stopped (at
/// most 5 minutes): the first sample above capacity, if any, and the number of samples.
/// Tiers from `first` on are checked.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(Option<String>, u64)>,
}

impl Sampler {
    fn start(store: Arc<Store>, first: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let mut samples = 0;
            while !flag.load(Ordering::Acquire) && start.elapsed() < Duration::from_secs(300) {
                for t in store.status().tiers.into_iter().skip(first) {
                    if t.used > t.capacity {
                        return (Some(format!("{t:?}")), samples);
                    }
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (None, samples)
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> (Option<String>, u64) {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap()
    }
}

/// Migrates [`FILES`] into a store whose fast tier is at `fast`, checking all of the
/// above. `others` runs once the root's stubs are placed: what others than the store do
/// meanwhile (then the fast tier is not checked against its capacity: others fill its
/// file system). Returns (fast tier used, slow tier used) at the end.
fn migrate_into_small_fast_tier(
    dir: &Path,
    fast: &Path,
    fast_capacity: &str,
    others: Option<&dyn Fn()>,
) -> (u64, u64) {
    let src = source();
    let store = open_store(dir, fast, fast_capacity);
    let m = Migration::open(
        &store,
        Box::new(PosixSource::open(src.path()).unwrap()),
        MigrationConfig::new("main"),
    )
    .expect("open migration");
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    let sampler = Sampler::start(store.clone(), usize::from(others.is_some()));
    // A client looks at the share first: the root is listed (its stubs placed), then the
    // store samples its tiers' real room (every second) before the crawl lists the rest.
    // Stubs take no room on the file system until fetched, so the sample must count
    // their missing bytes as promised or the rest would be placed into room they hold.
    resolve(&store, "a");
    if let Some(f) = others {
        f();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let crawler = Crawler::start(store.clone(), m.clone());
    let state = crawler.wait(Duration::from_secs(180));
    let (over, samples) = sampler.finish();
    assert_eq!(
        state,
        CrawlState::Done,
        "status: {:?}",
        store.status().tiers
    );
    drop(crawler);
    assert!(
        over.is_none(),
        "a tier above its capacity: {}",
        over.unwrap()
    );
    assert!(samples > 0);
    for (seed, (name, len)) in FILES.iter().enumerate() {
        let got = read_whole(&store, resolve(&store, name));
        assert!(
            got == common::content(seed as u64 + 1, *len as usize),
            "{name}: {} bytes differ from the source",
            got.len()
        );
    }
    let report = finish(&store, &m).expect("finish");
    assert_eq!(report.verified_files, FILES.len() as u64, "{report:?}");
    assert!(report.mismatches.is_empty(), "{report:?}");
    let tiers = store.status().tiers;
    // As for the sampler: a fast tier whose file system others filled has a capacity
    // (its real room) below what it held before they did.
    for t in tiers.iter().skip(usize::from(others.is_some())) {
        assert!(t.used <= t.capacity, "{t:?}");
    }
    let total: u64 = FILES.iter().map(|(_, l)| l).sum();
    assert_eq!(tiers[0].used + tiers[1].used, total, "{tiers:?}");
    let used = (tiers[0].used, tiers[1].used);
    drop(m);
    store.shutdown();
    used
}

#[test]
fn a_share_larger_than_the_fast_tiers_capacity_spills_to_the_next_tier() {
    let dir = tempfile::tempdir().unwrap();
    let fast = dir.path().join("fast");
    let (on_fast, on_slow) = migrate_into_small_fast_tier(dir.path(), &fast, "20MiB", None);
    // The fast tier takes what fits under its high watermark (18 MiB), not nothing.
    assert!((12 * MIB..=18 * MIB).contains(&on_fast), "fast {on_fast}");
    assert!(on_slow >= 30 * MIB, "slow {on_slow}");
}

#[test]
fn a_share_larger_than_the_fast_tiers_file_system_spills_instead_of_failing_with_enospc() {
    if !common::have(&["mkfs.ext4", "mount", "umount"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = LoopExt4::new(dir.path(), 24 * MIB);
    let room = fs.avail();
    assert!(
        room > 12 * MIB && room < 24 * MIB,
        "room {room} on a 24 MiB ext4"
    );
    // The configured capacity is far above the file system's room: the room is the limit
    // (sparse stubs take none of it until fetched, so their missing bytes must count).
    let (on_fast, on_slow) =
        migrate_into_small_fast_tier(dir.path(), &fs.mnt.join("fast"), "1GiB", None);
    assert!(
        (12 * MIB..=room).contains(&on_fast),
        "fast {on_fast}, room {room}"
    );
    assert!(on_slow >= 48 * MIB - room, "slow {on_slow}");
    drop(fs);
}

#[test]
fn a_fetch_that_finds_its_tiers_file_system_full_moves_the_stub_and_goes_on() {
    if !common::have(&["mkfs.ext4", "mount", "umount"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let fs = LoopExt4::new(dir.path(), 24 * MIB);
    let room = fs.avail();
    // Once the root's stubs are placed (one of the 12 MiB files `a`, `b` and smaller ones
    // on the fast tier), another program leaves 8 MiB of the file system's room: too
    // little for the 12 MiB stub, whose fetch fails with ENOSPC there. The stub moves to
    // the slow tier, partial as it is, and the crawl ends `Done`.
    let outside = fs.mnt.join("not-the-store");
    let big_on_fast = std::cell::Cell::new(None);
    let fill = || {
        let on_fast: Vec<_> = ["a", "b"]
            .into_iter()
            .filter(|n| fs.mnt.join("fast").join(n).exists())
            .collect();
        assert_eq!(
            on_fast.len(),
            1,
            "one 12 MiB stub on the fast tier: {on_fast:?}"
        );
        big_on_fast.set(Some(on_fast[0]));
        let room = fs.avail();
        assert!(room > 8 * MIB, "room {room}");
        let f = fs::File::create(&outside).unwrap();
        let buf = vec![0x5a; MIB as usize];
        let mut left = room - 8 * MIB;
        while left > 0 {
            let n = left.min(MIB);
            std::io::Write::write_all(&mut &f, &buf[..n as usize]).unwrap();
            left -= n;
        }
        f.sync_all().unwrap();
    };
    let (on_fast, on_slow) =
        migrate_into_small_fast_tier(dir.path(), &fs.mnt.join("fast"), "1GiB", Some(&fill));
    let big = big_on_fast.get().unwrap();
    assert!(
        !fs.mnt.join("fast").join(big).exists() && dir.path().join("slow").join(big).exists(),
        "`{big}` moved to the slow tier"
    );
    assert!(on_fast <= 8 * MIB, "fast {on_fast}, room {room}");
    assert!(on_slow >= 40 * MIB, "slow {on_slow}");
    drop(fs);
}
