//! CPU cost of creating a listed directory's stub entries (issue 4, metadata pass).
//!
//! Phase `kernel` first creates the same directories and files with plain
//! `open(O_CREAT|O_EXCL)` + `close`: the file system's own floor.
//! A store on a real disk (a temporary directory under `$TMPDIR`, or the directory given
//! with `--dir`) migrates an in-memory source of `--dirs` directories of `--files` small
//! files each (the source costs next to nothing, so what is measured is the store and the
//! engine). Phase `list`: one client thread lists every directory (`opendir`), which
//! creates the entries, stores their rows in the store DB and the migration DB and marks
//! the directory listed (one fsync of the migration DB each). Phase `crawl` (with
//! `--crawl`): a fresh store is crawled to the end by the real crawler (metadata-first
//! BFS, `--workers` threads), i.e. listing plus each file's metadata and data. Phase
//! `rewalk` (with `--rewalk`): after the listing, a client reads every file but one, then
//! a crawler starts from the root, as after a restart of `kaiso migrate`: the cost of
//! walking the local tree again to find what is left.
//! Printed per phase: user and system CPU seconds of the whole process (getrusage, all
//! threads) and CPU per entry.
//!
//! Run: `cargo run --release -p kaiso-store --example entry_cpu -- [--dirs 200] [--files 100] [--crawl] [--rewalk] [--workers 8] [--dir DIR]`

use kaiso_store::migrate::{
    CrawlState, Crawler, FileKind, Migration, MigrationConfig, Migrations, Source, SourceAcl,
    SourceAttr, SourceEntry, SourceError, SourceErrorKind, SourceFeatures, SourcePath,
    SourceResult, SourceStream, Timestamp,
};
use kaiso_store::{ROOT_INO, Store, StoreConfig};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes per source file (small: the metadata cost dominates).
const FILE_SIZE: u64 = 100;

/// `dirs` directories `d0..` under the root, each with `files` files `f0..`.
struct FlatSource {
    listings: HashMap<Vec<u8>, Vec<SourceEntry>>,
    attrs: HashMap<Vec<u8>, SourceAttr>,
}

fn attr(kind: FileKind, ino: u64, size: u64) -> SourceAttr {
    let t = Timestamp {
        secs: 1_000_000_000,
        nanos: 123_456_789,
    };
    SourceAttr {
        uid: 1000,
        gid: 1000,
        ..SourceAttr::plain(kind, ino, size, t)
    }
}

impl FlatSource {
    fn new(dirs: usize, files: usize) -> Self {
        let mut listings = HashMap::new();
        let mut attrs = HashMap::new();
        attrs.insert(Vec::new(), attr(FileKind::Directory, 1, 0));
        let mut root = Vec::new();
        let mut ino = 2;
        for d in 0..dirs {
            let dname = format!("d{d}").into_bytes();
            let da = attr(FileKind::Directory, ino, 4096);
            ino += 1;
            let mut entries = Vec::new();
            for f in 0..files {
                let name = format!("f{f}").into_bytes();
                let a = attr(FileKind::Regular, ino, FILE_SIZE);
                ino += 1;
                let mut p = dname.clone();
                p.push(b'/');
                p.extend_from_slice(&name);
                attrs.insert(p, a.clone());
                entries.push(SourceEntry { name, attr: a });
            }
            attrs.insert(dname.clone(), da.clone());
            listings.insert(dname.clone(), entries);
            root.push(SourceEntry {
                name: dname,
                attr: da,
            });
        }
        listings.insert(Vec::new(), root);
        Self { listings, attrs }
    }
}

impl Source for FlatSource {
    fn describe(&self) -> String {
        "memory:flat".into()
    }
    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            unix_ids: true,
            symlinks: true,
            byte_names: true,
            ..SourceFeatures::default()
        }
    }
    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.attrs
            .get(path.as_bytes())
            .cloned()
            .ok_or_else(|| SourceError::new(SourceErrorKind::NotFound, path, "no such object"))
    }
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        Ok(self
            .listings
            .get(path.as_bytes())
            .cloned()
            .unwrap_or_default())
    }
    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        let size = self.stat(path)?.size;
        let n = size.saturating_sub(offset).min(len as u64) as usize;
        Ok(vec![b'x'; n])
    }
    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::WrongKind,
            path,
            "no symlinks",
        ))
    }
    fn xattrs(&self, _path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(Vec::new())
    }
    fn acl(&self, _path: &SourcePath) -> SourceResult<SourceAcl> {
        Ok(SourceAcl::default())
    }
    fn streams(&self, _path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        Ok(Vec::new())
    }
    fn read_stream(
        &self,
        path: &SourcePath,
        _stream: &str,
        _offset: u64,
        _len: usize,
    ) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "no streams",
        ))
    }
}

/// User and system CPU seconds of this process so far (all threads).
fn cpu() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

/// A fresh one-tier store in `dir` migrating a new flat source.
fn setup(dir: &Path, dirs: usize, files: usize, workers: usize) -> (Arc<Store>, Arc<Migration>) {
    std::fs::create_dir_all(dir.join("t0")).expect("tier dir");
    let cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"64GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
        dir.join("state").display(),
        dir.join("t0").display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&cfg, "entry_cpu.toml").expect("config"))
        .expect("open store");
    let mut mc = MigrationConfig::new("bench");
    mc.crawl_workers = workers;
    let m = Migration::open(&store, Box::new(FlatSource::new(dirs, files)), mc)
        .expect("open migration");
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    (store, m)
}

fn report(phase: &str, entries: usize, wall: Duration, before: (f64, f64)) {
    let (u, s) = cpu();
    let (du, ds) = (u - before.0, s - before.1);
    println!(
        "{phase:6} entries {entries:6}  wall {:7.3} s  cpu user {du:6.3} s sys {ds:6.3} s  \
         = {:6.1} us/entry (user {:5.1}, sys {:5.1})",
        wall.as_secs_f64(),
        (du + ds) * 1e6 / entries as f64,
        du * 1e6 / entries as f64,
        ds * 1e6 / entries as f64,
    );
}

/// Runs a crawl of `m` to its end and reports its CPU time as `phase`.
fn timed_crawl(phase: &str, store: &Arc<Store>, m: &Arc<Migration>, entries: usize) {
    let before = cpu();
    let t = Instant::now();
    let c = Crawler::start(store.clone(), m.clone());
    let state = c.wait(Duration::from_secs(600));
    report(phase, entries, t.elapsed(), before);
    assert_eq!(state, CrawlState::Done, "crawl ended {state:?}");
}

fn main() {
    let mut dirs = 200usize;
    let mut files = 100usize;
    let mut crawl = false;
    let mut rewalk = false;
    let mut workers = 8usize;
    let mut base: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |what: &str| -> usize {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{what} needs a number"))
        };
        match a.as_str() {
            "--dirs" => dirs = num("--dirs"),
            "--files" => files = num("--files"),
            "--workers" => workers = num("--workers"),
            "--crawl" => crawl = true,
            "--rewalk" => rewalk = true,
            "--dir" => base = Some(PathBuf::from(args.next().expect("--dir needs a path"))),
            other => panic!("unknown argument {other}"),
        }
    }
    let entries = dirs * files + dirs;
    let tmp = match &base {
        Some(b) => tempfile::tempdir_in(b),
        None => tempfile::tempdir(),
    }
    .expect("temporary directory");

    // Phase kernel: the same files created directly (open O_CREAT|O_EXCL, close), the
    // floor the backing file system sets for any copier.
    {
        let base = tmp.path().join("kernel");
        let before = cpu();
        let t = Instant::now();
        for d in 0..dirs {
            let dir = base.join(format!("d{d}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            for f in 0..files {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(dir.join(format!("f{f}")))
                    .expect("create");
            }
        }
        report("kernel", entries, t.elapsed(), before);
    }

    // Phase list: a client lists every directory once.
    let (store, m) = setup(&tmp.path().join("list"), dirs, files, workers);
    let before = cpu();
    let t = Instant::now();
    let fh = store.opendir(ROOT_INO).expect("list root");
    store.releasedir(fh).expect("release root");
    for d in 0..dirs {
        let a = store
            .lookup(ROOT_INO, OsStr::new(&format!("d{d}")))
            .expect("lookup");
        let fh = store.opendir(a.ino).expect("list dir");
        store.releasedir(fh).expect("release dir");
        store.forget(a.ino, 1);
    }
    report("list", entries, t.elapsed(), before);
    assert_eq!(
        m.remaining(),
        (dirs * files) as u64,
        "every file is a stub, no directory left unlisted"
    );
    if rewalk {
        // What a restarted crawl costs when (nearly) everything is done: a client reads
        // every file but one, then a crawler starts from the root as after a restart
        // and walks the whole local tree to find the one stub left.
        for d in 0..dirs {
            let a = store
                .lookup(ROOT_INO, OsStr::new(&format!("d{d}")))
                .expect("lookup");
            for f in 0..files {
                if d == dirs - 1 && f == files - 1 {
                    continue;
                }
                let e = store
                    .lookup(a.ino, OsStr::new(&format!("f{f}")))
                    .expect("lookup file");
                let fh = store
                    .open_file(e.ino, libc::O_RDONLY, false)
                    .expect("open")
                    .fh;
                store.read(fh, 0, FILE_SIZE as u32).expect("read");
                store.release(fh).expect("release");
                store.forget(e.ino, 1);
            }
            store.forget(a.ino, 1);
        }
        assert_eq!(m.remaining(), 1);
        timed_crawl("rewalk", &store, &m, entries);
    }
    m.close();
    drop(m);
    store.shutdown();
    drop(store);

    if crawl {
        let (store, m) = setup(&tmp.path().join("crawl"), dirs, files, workers);
        timed_crawl("crawl", &store, &m, entries);
        assert_eq!(m.remaining(), 0);
        m.close();
        store.shutdown();
    }
}
