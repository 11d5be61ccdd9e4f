//! A client changing files while the migration fetches them: nothing the client wrote is
//! lost to a fetch in flight, and after `finish` every surviving path holds what the
//! client's operations and the source together say it must (bytes the client wrote win;
//! untouched ranges equal the source). Plus: the crawler's fetches are no client accesses.

mod common;

use kaiso_policy::cache::rng::SplitMix64;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kaiso_source::{NfsSource, PosixSource, SmbSource};
use kaiso_store::migrate::{CrawlState, Crawler, MigrationConfig, Source};
use kaiso_store::{Caller, FsResult, Ino, ROOT_INO, SetAttr, Store, StoreConfig};

use common::read_hook::{HookedSource, ReadHook};
use common::store_client::{attach, first_difference, join, lookup, read_all, split};

/// A destination store with one tier and no mover, in a temporary directory.
struct Dest {
    tmp: tempfile::TempDir,
}

impl Dest {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("t0")).unwrap();
        Dest { tmp }
    }
    fn open(&self) -> Arc<Store> {
        let root = self.tmp.path();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"4GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            root.join("state").display(),
            root.join("t0").display()
        );
        Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap()
    }
    fn tier(&self) -> PathBuf {
        self.tmp.path().join("t0")
    }
}

fn write_at(store: &Store, ino: Ino, flags: i32, offset: u64, data: &[u8]) -> FsResult<()> {
    let o = store.open_file(ino, flags, false)?;
    let r = if data.is_empty() {
        Ok(0)
    } else {
        store.write(o.fh, offset, data)
    };
    store.release(o.fh)?;
    assert_eq!(r? as usize, data.len(), "short write");
    Ok(())
}

fn set_size(store: &Store, ino: Ino, size: u64) -> FsResult<()> {
    let set = SetAttr {
        size: Some(size),
        ..SetAttr::default()
    };
    store.setattr(ino, &set, Caller::ROOT).map(|_| ())
}

// ---- a source whose data reads can be held ------------------------------------------

/// A read hook whose next data read, once armed, blocks until released: a fetch in
/// flight, held at the point where it has not yet written anything. Every data read can
/// also take `delay` (a remote server's latency: fetches stay in flight long enough for a
/// client's operations to land during them).
struct Held {
    delay: Duration,
    armed: AtomicBool,
    entered: (Mutex<bool>, Condvar),
    go: (Mutex<bool>, Condvar),
}

impl Held {
    fn new() -> Arc<Self> {
        Self::slow(Duration::ZERO)
    }
    fn slow(delay: Duration) -> Arc<Self> {
        Arc::new(Held {
            delay,
            armed: AtomicBool::new(false),
            entered: (Mutex::new(false), Condvar::new()),
            go: (Mutex::new(false), Condvar::new()),
        })
    }
    fn wait_entered(&self) {
        let (m, c) = &self.entered;
        let g = m.lock().unwrap();
        let (g, t) = c
            .wait_timeout_while(g, Duration::from_secs(10), |e| !*e)
            .unwrap();
        assert!(*g && !t.timed_out(), "the fetch never reached the source");
    }
    fn release(&self) {
        let (m, c) = &self.go;
        *m.lock().unwrap() = true;
        c.notify_all();
    }
}

impl ReadHook for Held {
    fn before_read(&self) {
        std::thread::sleep(self.delay);
        if !self.armed.swap(false, Ordering::SeqCst) {
            return;
        }
        {
            let (m, c) = &self.entered;
            *m.lock().unwrap() = true;
            c.notify_all();
        }
        let (m, c) = &self.go;
        let g = m.lock().unwrap();
        let _g = c
            .wait_timeout_while(g, Duration::from_secs(10), |go| !*go)
            .unwrap();
    }
}

/// Source file `f` of 3 MiB, fetched in one 4 MiB unit by a reader whose fetch is held
/// inside the source read while `client` runs (on its own thread: it may have to wait
/// for the fetch); then the fetch goes on. Returns the store, the file and the source's
/// bytes, with the reader and the client done.
fn with_a_fetch_held(
    name: &str,
    client: impl FnOnce(&Store, Ino) + Send,
) -> (Dest, Arc<Store>, Ino, Vec<u8>) {
    let src = tempfile::tempdir().unwrap();
    let data = common::content(7, 3 << 20);
    fs::write(src.path().join("f"), &data).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let held = Held::new();
    let mut cfg = MigrationConfig::new(name);
    cfg.unit_size = 4 << 20;
    let _m = attach(
        &store,
        HookedSource::new(
            Box::new(PosixSource::open(src.path()).unwrap()),
            held.clone(),
        ),
        cfg,
    );
    let f = lookup(&store, "f").unwrap();
    held.armed.store(true, Ordering::SeqCst);
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let o = store.open_file(f, libc::O_RDONLY, false).unwrap();
            let r = store.read(o.fh, 0, 10);
            store.release(o.fh).unwrap();
            r.map(|d| d.len())
        });
        held.wait_entered();
        let client = sc.spawn(|| client(&store, f));
        // Long enough for a client that does not wait for the fetch to be done.
        let deadline = Instant::now() + Duration::from_millis(300);
        while !client.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        held.release();
        client.join().unwrap();
        reader.join().unwrap().expect("the reader's read");
    });
    (dest, store, f, data)
}

/// The audit's scenario (issue 4, audit row #1): an editor's save (truncate to nothing,
/// write three bytes) while a reader's fetch of the same file is in flight. The fetch
/// used to write the whole unit afterwards: the file came back as 3 MiB of source bytes.
#[test]
fn a_truncate_and_rewrite_during_a_fetch_keeps_the_clients_bytes() {
    let (dest, store, f, _) = with_a_fetch_held("trunc", |s, f| {
        set_size(s, f, 0).unwrap();
        write_at(s, f, libc::O_WRONLY, 0, b"new").unwrap();
    });
    assert_eq!(store.getattr(f, None).unwrap().size, 3, "store size");
    assert_eq!(
        fs::read(dest.tier().join("f")).unwrap(),
        b"new",
        "backing file"
    );
    assert_eq!(read_all(&store, f).unwrap(), b"new");
    store.shutdown();
}

/// The same with `open(O_TRUNC)` and a write past the end of file the truncate left.
#[test]
fn an_o_trunc_rewrite_and_a_write_past_eof_during_a_fetch_keep_the_clients_bytes() {
    let far = (4u64 << 20) + 5;
    let (dest, store, f, _) = with_a_fetch_held("otrunc", |s, f| {
        write_at(s, f, libc::O_WRONLY | libc::O_TRUNC, 0, b"head").unwrap();
        write_at(s, f, libc::O_WRONLY, far, b"tail").unwrap();
    });
    let mut want = vec![0u8; far as usize + 4];
    want[..4].copy_from_slice(b"head");
    want[far as usize..].copy_from_slice(b"tail");
    assert_eq!(store.getattr(f, None).unwrap().size, far + 4);
    let got = read_all(&store, f).unwrap();
    assert!(got == want, "content: {}", first_difference(&got, &want));
    let backing = fs::read(dest.tier().join("f")).unwrap();
    assert!(
        backing == want,
        "backing: {}",
        first_difference(&backing, &want)
    );
    store.shutdown();
}

/// A truncate into the middle of the file during the fetch: the fetch writes the head
/// (still missing) and nothing past the new end.
#[test]
fn a_truncate_into_the_middle_during_a_fetch_keeps_the_new_size() {
    let cut = (1u64 << 20) + 77;
    let (_dest, store, f, data) = with_a_fetch_held("cut", |s, f| set_size(s, f, cut).unwrap());
    assert_eq!(store.getattr(f, None).unwrap().size, cut);
    let got = read_all(&store, f).unwrap();
    let want = &data[..cut as usize];
    assert!(got == want, "content: {}", first_difference(&got, want));
    store.shutdown();
}

/// A hole punched during the fetch (the client waits for the fetch of those bytes, then
/// punches): the hole stays zero, everything else is the source's.
#[test]
fn a_hole_punched_during_a_fetch_stays_a_hole() {
    let hole = (1u64 << 20, 64u64 << 10);
    let (_dest, store, f, data) = with_a_fetch_held("punch", |s, f| {
        let o = s.open_file(f, libc::O_RDWR, false).unwrap();
        s.fallocate(
            o.fh,
            hole.0,
            hole.1,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
        .unwrap();
        s.release(o.fh).unwrap();
    });
    let mut want = data.clone();
    want[hole.0 as usize..(hole.0 + hole.1) as usize].fill(0);
    let got = read_all(&store, f).unwrap();
    assert!(got == want, "content: {}", first_difference(&got, &want));
    store.shutdown();
}

// ---- a crawl while a client changes the tree -----------------------------------------

/// The policy crate's seeded generator (SplitMix64): the client's operations are
/// reproducible from the seed printed on failure (`KAISO_TEST_SEED=<seed>` runs the same
/// sequence again), with the picks these tests need on top.
struct Rng(SplitMix64);

impl Rng {
    fn seeded(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed))
    }
    /// Uniform in `[0, n)` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.below(n) }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.0.next_u64() as u8).collect()
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            Some(&items[self.below(items.len() as u64) as usize])
        }
    }
}

fn seed() -> u64 {
    match std::env::var("KAISO_TEST_SEED") {
        Ok(s) => s.parse().expect("KAISO_TEST_SEED: a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    }
}

/// What the tree must hold: each file's bytes, each directory (paths relative, no root).
#[derive(Default)]
struct Model {
    files: BTreeMap<String, Vec<u8>>,
    dirs: BTreeSet<String>,
}

impl Model {
    fn file_paths(&self) -> Vec<String> {
        self.files.keys().cloned().collect()
    }
    /// Every directory a new entry may go into, the root ("") included.
    fn parents(&self) -> Vec<String> {
        std::iter::once(String::new())
            .chain(self.dirs.iter().cloned())
            .collect()
    }
    /// Renames every path at or below `from` to the same place below `to`.
    fn move_prefix(&mut self, from: &str, to: &str) {
        let re = |p: &str| -> Option<String> {
            if p == from {
                Some(to.to_string())
            } else {
                p.strip_prefix(from)
                    .filter(|rest| rest.starts_with('/'))
                    .map(|rest| format!("{to}{rest}"))
            }
        };
        self.files = std::mem::take(&mut self.files)
            .into_iter()
            .map(|(p, d)| (re(&p).unwrap_or(p), d))
            .collect();
        self.dirs = std::mem::take(&mut self.dirs)
            .into_iter()
            .map(|p| re(&p).unwrap_or(p))
            .collect();
    }
}

/// Writes the source tree: four directories with a subdirectory each, files of sizes
/// around the unit (64 KiB) and several units long. Returns the model of it.
fn source_tree(root: &Path, rng: &mut Rng) -> Model {
    let sizes = [
        0u64,
        100,
        (64 << 10) - 1,
        (64 << 10) + 1,
        200 << 10,
        300 << 10,
        700 << 10,
        1 << 20,
        (3 << 20) / 2,
    ];
    let mut model = Model::default();
    let mut n = 0;
    for d in 0..4 {
        for dir in [format!("d{d}"), format!("d{d}/s")] {
            fs::create_dir_all(root.join(&dir)).unwrap();
            model.dirs.insert(dir.clone());
            for f in 0..8 {
                let size = sizes[rng.below(sizes.len() as u64) as usize];
                let data = common::content(1000 + n, size as usize);
                n += 1;
                let path = format!("{dir}/f{f}");
                fs::write(root.join(&path), &data).unwrap();
                model.files.insert(path, data);
            }
        }
    }
    model
}

/// One client operation through the store API, applied to the model too; a read checks
/// the file against the model at once. Returns a one-line description for the log.
fn client_op(store: &Store, model: &mut Model, rng: &mut Rng, serial: &mut u32) -> String {
    *serial += 1;
    let files = model.file_paths();
    // Fewer than 40 files left: creations instead of unlinks and replacing renames, so
    // the tree keeps files to check.
    let few = files.len() < 40;
    let roll = match rng.below(100) {
        66..=72 if few => 73,
        r => r,
    };
    let Some(path) = rng.pick(&files).cloned() else {
        // Everything was deleted: make a file.
        let data = rng.bytes(1000);
        let name = format!("n{serial}");
        let (_, o) = store
            .create(
                ROOT_INO,
                OsStr::new(&name),
                0o644,
                0,
                libc::O_RDWR,
                Caller::ROOT,
                false,
            )
            .unwrap();
        store.write(o.fh, 0, &data).unwrap();
        store.release(o.fh).unwrap();
        model.files.insert(name.clone(), data);
        return format!("create {name}");
    };
    let ino = lookup(store, &path).unwrap_or_else(|e| panic!("lookup {path}: {}", e.errno()));
    let len = model.files[&path].len() as u64;
    match roll {
        // A write at a random offset, sometimes past the end of file.
        0..=24 => {
            let offset = rng.below(len + 8192);
            let n = 1 + rng.below(16 << 10) as usize;
            let data = rng.bytes(n);
            write_at(store, ino, libc::O_WRONLY, offset, &data).unwrap();
            let m = model.files.get_mut(&path).unwrap();
            let end = offset as usize + data.len();
            if m.len() < end {
                m.resize(end, 0);
            }
            m[offset as usize..end].copy_from_slice(&data);
            format!("write {path} at {offset}, {} bytes", data.len())
        }
        25..=34 => {
            let size = rng.below(len + 1);
            set_size(store, ino, size).unwrap();
            model.files.get_mut(&path).unwrap().resize(size as usize, 0);
            format!("truncate {path} down to {size}")
        }
        35..=39 => {
            let size = len + 1 + rng.below(64 << 10);
            set_size(store, ino, size).unwrap();
            model.files.get_mut(&path).unwrap().resize(size as usize, 0);
            format!("truncate {path} up to {size}")
        }
        40..=47 => {
            let n = rng.below(100 << 10) as usize;
            let data = rng.bytes(n);
            write_at(store, ino, libc::O_WRONLY | libc::O_TRUNC, 0, &data).unwrap();
            let n = data.len();
            model.files.insert(path.clone(), data);
            format!("O_TRUNC rewrite of {path}, {n} bytes")
        }
        // A file renamed into a random directory, now and then over another file.
        48..=57 => {
            let (from_dir, from_name) = split(&path);
            let over = !few && rng.below(4) == 0;
            let to = match rng.pick(&files).filter(|t| over && **t != path) {
                Some(t) => t.clone(),
                None => {
                    let parents = model.parents();
                    join(rng.pick(&parents).unwrap(), &format!("r{serial}"))
                }
            };
            let (to_dir, to_name) = split(&to);
            let (a, b) = (
                lookup(store, from_dir).unwrap(),
                lookup(store, to_dir).unwrap(),
            );
            store
                .rename(a, OsStr::new(from_name), b, OsStr::new(to_name), 0)
                .unwrap_or_else(|e| panic!("rename {path} -> {to}: {}", e.errno()));
            let data = model.files.remove(&path).unwrap();
            model.files.insert(to.clone(), data);
            format!("rename {path} -> {to}")
        }
        // A directory renamed, sometimes under another one.
        58..=65 => {
            let dirs: Vec<String> = model.dirs.iter().cloned().collect();
            let Some(dir) = rng.pick(&dirs).cloned() else {
                return "no directory to rename".into();
            };
            let targets: Vec<String> = model
                .parents()
                .into_iter()
                .filter(|p| *p != dir && !p.starts_with(&format!("{dir}/")))
                .collect();
            let to = join(rng.pick(&targets).unwrap(), &format!("m{serial}"));
            let (from_dir, from_name) = split(&dir);
            let (to_dir, to_name) = split(&to);
            let (a, b) = (
                lookup(store, from_dir).unwrap(),
                lookup(store, to_dir).unwrap(),
            );
            store
                .rename(a, OsStr::new(from_name), b, OsStr::new(to_name), 0)
                .unwrap_or_else(|e| panic!("rename dir {dir} -> {to}: {}", e.errno()));
            model.move_prefix(&dir, &to);
            format!("rename directory {dir} -> {to}")
        }
        66..=72 => {
            let (dir, name) = split(&path);
            store
                .unlink(lookup(store, dir).unwrap(), OsStr::new(name))
                .unwrap();
            model.files.remove(&path);
            format!("unlink {path}")
        }
        73..=77 => {
            let parents = model.parents();
            let dir = rng.pick(&parents).unwrap().clone();
            let name = format!("c{serial}");
            let n = rng.below(200 << 10) as usize;
            let data = rng.bytes(n);
            let (_, o) = store
                .create(
                    lookup(store, &dir).unwrap(),
                    OsStr::new(&name),
                    0o644,
                    0,
                    libc::O_RDWR,
                    Caller::ROOT,
                    false,
                )
                .unwrap();
            if !data.is_empty() {
                store.write(o.fh, 0, &data).unwrap();
            }
            store.release(o.fh).unwrap();
            let p = join(&dir, &name);
            format!("create {p}, {} bytes", {
                model.files.insert(p.clone(), data);
                model.files[&p].len()
            })
        }
        // A read of part of the file (up to two units), checked against the model now.
        _ => {
            let offset = rng.below(len + 1);
            let n = 1 + rng.below(128 << 10) as u32;
            let o = store.open_file(ino, libc::O_RDONLY, false).unwrap();
            let got = store.read(o.fh, offset, n);
            store.release(o.fh).unwrap();
            let got = got.unwrap();
            let m = &model.files[&path];
            let want = &m[offset as usize..(offset as usize + n as usize).min(m.len())];
            assert!(
                got == *want,
                "read of {path} at {offset} during the crawl: {}",
                first_difference(&got, want)
            );
            format!("read {path} at {offset}, {} bytes, as expected", got.len())
        }
    }
}

/// A crawl (8 workers, 64 KiB units) while a client, for about two seconds, writes at
/// random offsets, truncates down and up, rewrites with O_TRUNC, renames files and
/// directories, unlinks and creates; then `finish`, and every surviving path of the
/// destination equals the model (bytes and size), nothing more, nothing less.
fn crawl_with_a_concurrent_client(
    name: &str,
    source: Box<dyn Source>,
    mut model: Model,
    seed: u64,
) {
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new(name);
    cfg.crawl_workers = 8;
    cfg.unit_size = 64 << 10;
    // Each data read takes 40 ms: fetches are in flight long enough for the client's
    // operations to land during them, and the crawl is still going while it works.
    let source = HookedSource::new(source, Held::slow(Duration::from_millis(40)));
    let m = attach(&store, source, cfg);
    let crawler = Crawler::start(store.clone(), m.clone());
    let mut rng = Rng::seeded(seed ^ 0x5EED);
    let mut log: Vec<String> = Vec::new();
    let mut serial = 0;
    let start = Instant::now();
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        while start.elapsed() < Duration::from_secs(2) {
            let op = client_op(&store, &mut model, &mut rng, &mut serial);
            log.push(op);
            // A client, not a benchmark: leaves the crawl its share of the two cores.
            std::thread::sleep(Duration::from_millis(1));
        }
    }));
    let tail = |log: &[String]| log[log.len().saturating_sub(8)..].join("; ");
    if let Err(e) = run {
        eprintln!("seed {seed}: the client failed after: {}", tail(&log));
        std::panic::resume_unwind(e);
    }
    // How much was left to crawl when the client stopped (shows the overlap).
    let unfetched_at_end = m.remaining();
    let state = crawler.wait(Duration::from_secs(120));
    drop(crawler);
    assert_eq!(state, CrawlState::Done, "seed {seed}: crawl state");
    assert_eq!(m.remaining(), 0, "seed {seed}: files left unfetched");
    let report = kaiso_store::migrate::finish(&store, &m)
        .unwrap_or_else(|e| panic!("seed {seed}: finish: {e}"));
    assert!(
        report.mismatches.is_empty(),
        "seed {seed}: finish found mismatches {:?}",
        report.mismatches
    );
    // The destination, as the tier holds it after finish.
    let tier = dest.tier();
    let mut files = BTreeMap::new();
    let mut dirs = BTreeSet::new();
    for (rel, meta) in common::walk(&tier) {
        let rel = String::from_utf8(rel).unwrap();
        if meta.is_dir() {
            dirs.insert(rel);
        } else {
            files.insert(rel.clone(), fs::read(tier.join(&rel)).unwrap());
        }
    }
    let names = |m: &BTreeMap<String, Vec<u8>>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        dirs,
        model.dirs,
        "seed {seed}: directories after {} client operations",
        log.len()
    );
    assert_eq!(
        names(&files),
        names(&model.files),
        "seed {seed}: files after {} client operations",
        log.len()
    );
    for (path, want) in &model.files {
        let got = &files[path];
        assert!(
            got == want,
            "seed {seed}: {path}: {}; the client's operations on it under this name: {:?}",
            first_difference(got, want),
            log.iter()
                .filter(|l| l.contains(path.as_str()))
                .collect::<Vec<_>>()
        );
        let a = store.getattr(lookup(&store, path).unwrap(), None).unwrap();
        assert_eq!(a.size, want.len() as u64, "seed {seed}: {path}: store size");
    }
    eprintln!(
        "seed {seed}: {} client operations in 2 s, {unfetched_at_end} files still unfetched at the end of them; {} files checked; finish: {} modified by clients",
        log.len(),
        model.files.len(),
        report.modified_by_clients
    );
    store.shutdown();
}

/// A random source tree from the run's seed in a new directory; the seed is printed so
/// that a failing run can be repeated.
fn seeded_source_tree() -> (u64, tempfile::TempDir, Model) {
    let seed = seed();
    eprintln!("seed {seed} (KAISO_TEST_SEED={seed} repeats this run)");
    let dir = tempfile::tempdir().unwrap();
    let model = source_tree(dir.path(), &mut Rng::seeded(seed));
    (seed, dir, model)
}

#[test]
fn concurrent_client_mutations_during_a_crawl_from_posix() {
    let (seed, src, model) = seeded_source_tree();
    let source = Box::new(PosixSource::open(src.path()).unwrap());
    crawl_with_a_concurrent_client("posix", source, model, seed);
}

#[test]
fn concurrent_client_mutations_during_a_crawl_from_ganesha() {
    if !common::have(&["ganesha.nfsd", "rpcbind", "nfs-ls"]) {
        return;
    }
    let (seed, export, model) = seeded_source_tree();
    let server = common::Ganesha::start(export.path());
    let source = Box::new(NfsSource::connect(server.config()).unwrap());
    crawl_with_a_concurrent_client("nfs", source, model, seed);
}

#[test]
fn concurrent_client_mutations_during_a_crawl_from_samba() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let (seed, share, model) = seeded_source_tree();
    let server = common::Samba::start(share.path());
    let source = Box::new(SmbSource::connect(server.config()).unwrap());
    crawl_with_a_concurrent_client("smb", source, model, seed);
}

// ---- the crawler's fetches are no client accesses ------------------------------------

/// A crawl of a share nobody touches leaves the placement policy and the tiers' access
/// counters as they were: the crawler's reads and opens are no client accesses (issue 4,
/// audit row #24). A client's read afterwards counts, for that file only.
///
/// The policy's heat of a file is compared before and after the crawl rather than with
/// zero: creating a file's stub when its directory is listed records a creation, the
/// same for every file, crawled or not.
#[test]
fn a_crawl_is_not_counted_as_client_access() {
    let src = tempfile::tempdir().unwrap();
    let model = source_tree(src.path(), &mut Rng::seeded(24));
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("heat");
    cfg.crawl_workers = 4;
    cfg.unit_size = 64 << 10;
    let m = attach(
        &store,
        Box::new(PosixSource::open(src.path()).unwrap()),
        cfg,
    );
    let accesses = |s: &Store| s.status().tiers.iter().map(|t| t.accesses).sum::<u64>();
    let heat = |s: &Store, path: &str| {
        let e = s.explain(Path::new(path)).unwrap();
        // "... (opens, decayed with half-life N s: H)"
        let h = e.policy.rsplit(": ").next().unwrap().trim_end_matches(')');
        h.parse::<f64>()
            .unwrap_or_else(|_| panic!("heat in {:?}", e.policy))
    };
    // Every directory listed (lookups only: no file opened or read).
    let before: BTreeMap<&String, f64> = model
        .files
        .keys()
        .map(|p| {
            lookup(&store, p).unwrap();
            (p, heat(&store, p))
        })
        .collect();
    assert_eq!(accesses(&store), 0, "tier accesses after listing");
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0);
    assert!(m.counters.bytes_fetched.load(Ordering::Relaxed) > 0);
    assert_eq!(accesses(&store), 0, "tier accesses after a crawl alone");
    for (path, h) in &before {
        assert_eq!(heat(&store, path), *h, "{path}: heat after a crawl alone");
    }
    // A client's read is an access.
    let (touched, data) = model.files.iter().find(|(_, d)| !d.is_empty()).unwrap();
    let got = read_all(&store, lookup(&store, touched).unwrap()).unwrap();
    assert!(got == *data);
    assert!(accesses(&store) > 0, "a client's read counts");
    assert!(
        heat(&store, touched) > before[touched],
        "{touched}: the client opened it"
    );
    for (path, h) in before.iter().filter(|(p, _)| **p != touched) {
        assert_eq!(heat(&store, path), *h, "{path}: untouched");
    }
    store.shutdown();
}
