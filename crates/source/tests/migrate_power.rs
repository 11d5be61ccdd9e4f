//! Power loss and restarts, measured: what ordering fetched data before the state that
//! vouches for it costs (a POSIX migration of a tree shaped like Table 2.2 (b), with the
//! ordering on and off, alternated), and how long `Migration::open` takes after an
//! unclean stop with many stub rows (recount before serving vs in the background).
//!
//! Programs, not timed tests: both are `#[ignore]`d and print their figures. Run by hand:
//!
//! ```text
//! cargo test --release -p kaiso-source --test migrate_power -- --ignored --nocapture
//! ```
//!
//! Knobs (environment): `KAISO_B_FILES` (default 882, Table 2.2 (b) / 400),
//! `KAISO_B_MEAN` (mean file size in bytes, default 1,123,328 = 1,097 KiB),
//! `KAISO_ROUNDS` (default 2), `KAISO_RECOUNT_ROWS` (default 100,000).

use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kaiso_source::PosixSource;
use kaiso_store::migrate::{CrawlState, Crawler, Migration, MigrationConfig, Migrations};
use kaiso_store::{ROOT_INO, Store, StoreConfig};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn store_at(dir: &Path) -> Arc<Store> {
    fs::create_dir_all(dir.join("t0")).unwrap();
    let cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"64GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
        dir.join("state").display(),
        dir.join("t0").display()
    );
    Store::open(StoreConfig::from_toml_str(&cfg, "power.toml").unwrap()).unwrap()
}

/// xorshift64*: the same tree every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// A tree of `files` files with Pareto sizes (shape 1.5, mean `mean`) in `files / 7.5`
/// directories nested up to 8 deep (Table 2.2 (b): 353k files, 47k directories, depth
/// 8.1). Returns the bytes written.
fn generate(root: &Path, files: u64, mean: u64) -> u64 {
    let mut rng = Rng(0x5eed_0b0b);
    let dirs = (files * 2 / 15).max(1);
    let mut paths = vec![root.to_path_buf()];
    for d in 0..dirs {
        let parent = paths[(rng.next() % paths.len() as u64) as usize].clone();
        let depth = parent.strip_prefix(root).unwrap().components().count();
        let parent = if depth >= 8 {
            root.to_path_buf()
        } else {
            parent
        };
        let p = parent.join(format!("d{d}"));
        fs::create_dir(&p).unwrap();
        paths.push(p);
    }
    let xm = mean as f64 / 3.0; // Pareto shape 1.5: mean = 3 xm
    let mut total = 0;
    let mut buf = Vec::new();
    for f in 0..files {
        let size = ((xm / rng.unit().powf(1.0 / 1.5)) as u64).min(mean * 64);
        buf.resize(size as usize, 0);
        for chunk in buf.chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        let dir = &paths[(rng.next() % paths.len() as u64) as usize];
        fs::write(dir.join(format!("f{f}")), &buf).unwrap();
        total += size;
    }
    total
}

fn uptime() -> String {
    fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// One whole migration of `src` into a fresh store under `work` (crawl to the end and
/// a clean close); the wall and the store's barrier counts.
fn migrate_once(src: &Path, work: &Path) -> (Duration, u64, u64, u64, f64, f64) {
    let store = store_at(work);
    let barrier = store.fetch_barrier();
    let started = Instant::now();
    let m = Migration::open(
        &store,
        Box::new(PosixSource::open(src).unwrap()),
        MigrationConfig::new("b"),
    )
    .unwrap();
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(3600)), CrawlState::Done);
    drop(crawler);
    m.close();
    let wall = started.elapsed();
    let c = barrier.counts();
    let counts = (
        c.data_syncs.load(Ordering::Relaxed),
        c.state_syncs.load(Ordering::Relaxed),
        c.unordered_state_syncs.load(Ordering::Relaxed),
    );
    let secs = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
    let (in_syncfs, held) = (secs(&c.data_sync_ns), secs(&c.held_ns));
    store.shutdown();
    (wall, counts.0, counts.1, counts.2, in_syncfs, held)
}

#[test]
#[ignore = "a measurement program: run by hand with --ignored --nocapture"]
fn measure_the_cost_of_ordering_fetched_data_before_state() {
    let files = env_or("KAISO_B_FILES", 882);
    let mean = env_or("KAISO_B_MEAN", 1_097 << 10);
    let rounds = env_or("KAISO_ROUNDS", 2);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let bytes = generate(&src, files, mean);
    println!("tree: {files} files, {bytes} bytes; load {}", uptime());
    for round in 0..rounds {
        for ordered in [true, false] {
            kaiso_store::stub::set_fetch_ordering(ordered);
            let work = tmp.path().join(format!("dst-{round}-{ordered}"));
            let (wall, data, state, bad, in_syncfs, held) = migrate_once(&src, &work);
            println!(
                "round {round} ordering {}: wall {:.3} s ({:.0} MiB/s); syncfs {data} ({:.2} per 1000 files, {in_syncfs:.3} s in them), barrier state syncs {state} ({:.2} per 1000 files), fetch writes held back {held:.3} s, unordered {bad}; load {}",
                if ordered { "on " } else { "off" },
                wall.as_secs_f64(),
                bytes as f64 / wall.as_secs_f64() / (1 << 20) as f64,
                data as f64 * 1000.0 / files as f64,
                state as f64 * 1000.0 / files as f64,
                uptime().trim()
            );
            if ordered {
                assert_eq!(bad, 0);
            }
            fs::remove_dir_all(&work).unwrap();
        }
    }
    kaiso_store::stub::set_fetch_ordering(true);
}

#[test]
#[ignore = "a measurement program: run by hand with --ignored --nocapture"]
fn measure_open_after_an_unclean_stop_with_many_stub_rows() {
    let rows = env_or("KAISO_RECOUNT_ROWS", 100_000);
    let per_dir = 1000;
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    fs::create_dir(&src).unwrap();
    let dirs = rows.div_ceil(per_dir);
    for d in 0..dirs {
        let dir = src.join(format!("d{d}"));
        fs::create_dir(&dir).unwrap();
        for f in 0..per_dir.min(rows - d * per_dir) {
            fs::write(dir.join(format!("f{f}")), b"x").unwrap();
        }
    }
    let work = tmp.path().join("dst");
    let source = || Box::new(PosixSource::open(&src).unwrap());
    {
        // Every directory listed: one stub row per file. Then dropped without a close.
        let store = store_at(&work);
        let m = Migration::open(&store, source(), MigrationConfig::new("many")).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        for d in 0..dirs {
            let a = store
                .lookup(ROOT_INO, OsStr::new(&format!("d{d}")))
                .unwrap();
            let fh = store.opendir(a.ino).unwrap();
            store.releasedir(fh).unwrap();
        }
        assert_eq!(m.remaining(), rows);
    }
    println!("{rows} stub rows in {dirs} directories; load {}", uptime());
    for background in [false, true, false, true] {
        let t = Instant::now();
        let store = store_at(&work);
        let store_open = t.elapsed();
        let t = Instant::now();
        let m = if background {
            Migration::open(&store, source(), MigrationConfig::new("many")).unwrap()
        } else {
            Migration::open(&*store, source(), MigrationConfig::new("many")).unwrap()
        };
        let open = t.elapsed();
        let t = Instant::now();
        assert_eq!(m.remaining(), rows);
        let counted = t.elapsed();
        println!(
            "recount {}: Store::open {:.3} s, Migration::open {:.3} s, then remaining() waited {:.3} s; load {}",
            if background {
                "in the background"
            } else {
                "before serving   "
            },
            store_open.as_secs_f64(),
            open.as_secs_f64(),
            counted.as_secs_f64(),
            uptime().trim()
        );
        // Dropped without a close again: the next open recounts too.
        drop(m);
        drop(store);
    }
}
