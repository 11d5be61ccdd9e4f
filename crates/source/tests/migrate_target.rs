//! Migration engine correctness at the edges of a share's life: where it may start, how
//! a `finish` interrupted by a crash ends, a source that changes after its listing, a
//! client writing a file while `finish` verifies it, and demand reads while the crawler
//! is throttled inside the same file. POSIX source over temporary directories.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use kaiso_source::PosixSource;
use kaiso_store::migrate::{
    CrawlState, Crawler, FinishStop, Migration, MigrationConfig, Migrations, Source, finish,
    finish_stopping_at,
};
use kaiso_store::{Caller, Ino, ROOT_INO, Store, StoreConfig};

use common::read_hook::{HookedSource, ReadHook};

/// A destination store with one tier in a temporary directory.
struct Dest {
    tmp: tempfile::TempDir,
    cfg: String,
}

impl Dest {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("t0")).unwrap();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"4GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            tmp.path().join("state").display(),
            tmp.path().join("t0").display()
        );
        Dest { tmp, cfg }
    }
    fn open(&self) -> Arc<Store> {
        Store::open(StoreConfig::from_toml_str(&self.cfg, "test.toml").unwrap()).unwrap()
    }
    /// A restart: shuts `store` down (the caller has dropped its other handles) and opens
    /// the destination again.
    fn reopen(&self, store: Arc<Store>) -> Arc<Store> {
        store.shutdown();
        drop(store);
        self.open()
    }
    fn tier(&self) -> PathBuf {
        self.tmp.path().join("t0")
    }
    fn state(&self) -> PathBuf {
        self.tmp.path().join("state")
    }
}

fn posix(root: &Path) -> Box<dyn Source> {
    Box::new(PosixSource::open(root).unwrap())
}

fn attach(store: &Arc<Store>, source: Box<dyn Source>, cfg: MigrationConfig) -> Arc<Migration> {
    let m = Migration::open(store, source, cfg).expect("open migration");
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    m
}

fn resolve(store: &Store, path: &[u8]) -> Ino {
    let mut ino = ROOT_INO;
    for c in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        let a = store.lookup(ino, OsStr::from_bytes(c)).unwrap();
        store.forget(a.ino, 1);
        ino = a.ino;
    }
    ino
}

fn read_all(store: &Store, ino: Ino) -> Vec<u8> {
    let o = store.open_file(ino, libc::O_RDONLY, false).unwrap();
    let d = store.read(o.fh, 0, 1 << 24).unwrap();
    store.release(o.fh).unwrap();
    d
}

fn write_file(store: &Store, parent: Ino, name: &str, data: &[u8]) {
    let (_, o) = store
        .create(
            parent,
            OsStr::new(name),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            false,
        )
        .unwrap();
    store.write(o.fh, 0, data).unwrap();
    store.release(o.fh).unwrap();
}

fn rewrite(store: &Store, ino: Ino, data: &[u8]) {
    let o = store
        .open_file(ino, libc::O_WRONLY | libc::O_TRUNC, false)
        .unwrap();
    store.write(o.fh, 0, data).unwrap();
    store.release(o.fh).unwrap();
}

/// A small source tree: `f`, `d/g`.
fn small_source() -> tempfile::TempDir {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("f"), b"source bytes").unwrap();
    fs::create_dir(src.path().join("d")).unwrap();
    fs::write(src.path().join("d/g"), b"source g").unwrap();
    src
}

/// Migrates `src` into the root of `store` completely (crawl done).
fn migrate_all(store: &Arc<Store>, src: &Path, name: &str) -> Arc<Migration> {
    let m = attach(store, posix(src), MigrationConfig::new(name));
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0);
    m
}

const NOT_EMPTY: &str = "is not empty: migrate into a new or empty directory";

#[test]
fn a_fresh_start_into_a_non_empty_target_is_refused_and_changes_nothing() {
    let src = small_source();
    let dest = Dest::new();
    let store = dest.open();
    let client = b"client data written after finish";
    write_file(&store, ROOT_INO, "f", client);
    let sub = store
        .mkdir(ROOT_INO, OsStr::new("sub"), 0o755, 0, Caller::ROOT)
        .unwrap();
    write_file(&store, sub.ino, "kept", b"kept");
    for (target, shown) in [("", "/"), ("sub", "/sub")] {
        let mut cfg = MigrationConfig::new("again");
        cfg.target = PathBuf::from(target);
        let e = match Migration::open(&store, posix(src.path()), cfg) {
            Ok(_) => panic!("a fresh share was started into the non-empty {shown}"),
            Err(e) => e,
        };
        assert_eq!(e, format!("target {shown} {NOT_EMPTY}"));
        assert!(!e.contains('\n'), "one line: {e}");
    }
    // Nothing was re-stubbed or overwritten, and no share state was left behind.
    assert_eq!(read_all(&store, resolve(&store, b"f")), client);
    assert_eq!(read_all(&store, resolve(&store, b"sub/kept")), b"kept");
    assert!(store.stub_state(resolve(&store, b"f")).is_complete());
    assert!(!dest.state().join("migrate/again").exists());
    assert_eq!(fs::read(dest.tier().join("f")).unwrap(), client);
    // A new directory (created by the start) and an existing empty one are fine.
    store
        .mkdir(ROOT_INO, OsStr::new("empty"), 0o755, 0, Caller::ROOT)
        .unwrap();
    for (name, target) in [("new", "brand/new"), ("empty", "empty")] {
        let mut cfg = MigrationConfig::new(name);
        cfg.target = PathBuf::from(target);
        let m = Migration::open(&store, posix(src.path()), cfg).expect("empty target");
        m.close();
    }
    store.shutdown();
}

#[test]
fn a_share_resumed_into_its_own_target_is_not_refused() {
    let src = small_source();
    let dest = Dest::new();
    let store = dest.open();
    let m = attach(&store, posix(src.path()), MigrationConfig::new("s"));
    // Listed (entries exist now), then stopped before the crawl.
    assert_eq!(read_all(&store, resolve(&store, b"f")), b"source bytes");
    m.close();
    drop(m);
    let store = dest.reopen(store);
    let m = attach(&store, posix(src.path()), MigrationConfig::new("s"));
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(read_all(&store, resolve(&store, b"d/g")), b"source g");
    finish(&store, &m).expect("finish");
    store.shutdown();
}

#[test]
fn a_finish_interrupted_after_detaching_leaves_a_finished_share() {
    let src = small_source();
    let dest = Dest::new();
    let store = dest.open();
    let m = migrate_all(&store, src.path(), "s");
    // What the CLI keeps in the share's directory (it resumes every share.json).
    let share_dir = dest.state().join("migrate/s");
    fs::write(share_dir.join("share.json"), b"{}").unwrap();
    let e = finish_stopping_at(&store, &m, FinishStop::AfterDetach).unwrap_err();
    assert!(e.contains("stopped"), "{e}");
    // Nothing under migrate/ names the share any more: no start can resume it.
    assert!(!share_dir.exists(), "share state still under migrate/");
    assert!(dest.state().join("migrate/s.finished.txt").exists());
    drop(m);
    store.shutdown();
    drop(store);
    // "Restart": a client edits the finished tree, then the share is started again.
    let store = dest.open();
    let f = resolve(&store, b"f");
    rewrite(&store, f, b"edited after finish");
    let e = match Migration::open(&store, posix(src.path()), MigrationConfig::new("s")) {
        Ok(_) => panic!("the finished share started again as a fresh one"),
        Err(e) => e,
    };
    assert_eq!(e, format!("target / {NOT_EMPTY}"));
    // The interrupted finish's remains are gone; no file was re-stubbed or overwritten.
    assert!(!dest.state().join("migrate.finishing").exists());
    assert!(!share_dir.exists());
    assert_eq!(read_all(&store, f), b"edited after finish");
    for p in [&b"f"[..], b"d", b"d/g"] {
        assert!(store.stub_state(resolve(&store, p)).is_complete());
    }
    assert_eq!(read_all(&store, resolve(&store, b"d/g")), b"source g");
    store.shutdown();
}

#[test]
fn a_finish_interrupted_before_detaching_resumes_and_completes() {
    let src = small_source();
    let dest = Dest::new();
    let store = dest.open();
    let m = migrate_all(&store, src.path(), "s");
    finish_stopping_at(&store, &m, FinishStop::AfterReport).unwrap_err();
    drop(m);
    let store = dest.reopen(store);
    let m = attach(&store, posix(src.path()), MigrationConfig::new("s"));
    assert_eq!(m.remaining(), 0);
    let r = finish(&store, &m).expect("finish again");
    assert_eq!(r.verified_files, 2);
    assert!(!dest.state().join("migrate/s").exists());
    assert!(!dest.state().join("migrate.finishing").exists());
    store.shutdown();
}

#[test]
fn a_share_dir_without_its_database_never_restubs_a_finished_tree() {
    // What an interrupted finish of earlier versions could leave: share.json without
    // migrate.db. The start is then fresh, and refused over the finished tree.
    let src = small_source();
    let dest = Dest::new();
    let store = dest.open();
    let m = migrate_all(&store, src.path(), "s");
    let share_dir = dest.state().join("migrate/s");
    drop(m);
    store.shutdown();
    drop(store);
    for f in ["migrate.db", "migrate.db-wal", "migrate.db-shm"] {
        let _ = fs::remove_file(share_dir.join(f));
    }
    fs::write(share_dir.join("share.json"), b"{}").unwrap();
    let store = dest.open();
    let f = resolve(&store, b"f");
    rewrite(&store, f, b"edited");
    let e = Migration::open(&store, posix(src.path()), MigrationConfig::new("s"))
        .err()
        .expect("refused");
    assert_eq!(e, format!("target / {NOT_EMPTY}"));
    assert_eq!(read_all(&store, f), b"edited");
    assert!(
        share_dir.join("share.json").exists(),
        "the caller's file is left"
    );
    assert!(!share_dir.join("migrate.db").exists(), "no new database");
    store.shutdown();
}

/// A read hook that, once armed, runs `on_read` inside the next data read (`finish`
/// verifies with such reads).
struct Hooked {
    on_read: OnceLock<Box<dyn Fn() + Send + Sync>>,
    armed: AtomicBool,
}

impl ReadHook for Hooked {
    fn before_read(&self) {
        if self.armed.swap(false, Ordering::SeqCst)
            && let Some(hook) = self.on_read.get()
        {
            hook();
        }
    }
}

#[test]
fn finish_counts_a_file_written_during_its_verification_as_modified() {
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("only"), common::content(7, 100_000)).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let hooked = Arc::new(Hooked {
        on_read: OnceLock::new(),
        armed: AtomicBool::new(false),
    });
    let m = attach(
        &store,
        HookedSource::new(posix(src.path()), hooked.clone()),
        MigrationConfig::new("v"),
    );
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    let ino = resolve(&store, b"only");
    // While finish reads the file back, a client rewrites it (its own thread, as a
    // client would; finish holds no lock the write needs).
    let writer_store = store.clone();
    let _ = hooked.on_read.set(Box::new(move || {
        let s = writer_store.clone();
        std::thread::spawn(move || {
            // A different mtime than the completion recorded, whatever the clock.
            std::thread::sleep(Duration::from_millis(20));
            rewrite(&s, ino, b"a client's new content")
        })
        .join()
        .unwrap();
    }));
    hooked.armed.store(true, Ordering::SeqCst);
    let r = finish(&store, &m).expect("a client's write during verification is no mismatch");
    assert!(!hooked.armed.load(Ordering::SeqCst), "the hook ran");
    assert_eq!(r.modified_by_clients, 1, "{r:?}");
    assert_eq!(r.verified_files, 0, "{r:?}");
    assert!(r.mismatches.is_empty(), "{r:?}");
    assert_eq!(read_all(&store, ino), b"a client's new content");
    store.shutdown();
}

#[test]
fn source_entries_added_or_removed_after_listing_are_reported() {
    let src = tempfile::tempdir().unwrap();
    fs::create_dir(src.path().join("d")).unwrap();
    fs::create_dir(src.path().join("d/sub")).unwrap();
    fs::write(src.path().join("d/old"), b"old").unwrap();
    fs::write(src.path().join("d/gone"), b"gone").unwrap();
    fs::write(src.path().join("d/copied"), b"copied, then removed").unwrap();
    fs::write(src.path().join("d/sub/x"), b"x").unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let m = attach(&store, posix(src.path()), MigrationConfig::new("c"));
    let dd = resolve(&store, b"d");
    let h = store.opendir(dd).unwrap();
    store.releasedir(h).unwrap();
    let sub = resolve(&store, b"d/sub");
    let h = store.opendir(sub).unwrap();
    store.releasedir(h).unwrap();
    assert_eq!(
        read_all(&store, resolve(&store, b"d/copied")),
        b"copied, then removed"
    );
    // The "read-only" source changes after the listings.
    fs::write(src.path().join("d/new"), b"new").unwrap();
    fs::remove_file(src.path().join("d/gone")).unwrap();
    fs::remove_file(src.path().join("d/copied")).unwrap();
    fs::remove_dir_all(src.path().join("d/sub")).unwrap();
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    let r = finish(&store, &m).expect("changes of the source are reported, not failures");
    let find = |p: &str| {
        r.skipped
            .iter()
            .find(|s| s.src_path.as_bytes() == p.as_bytes())
            .unwrap_or_else(|| panic!("{p} not reported: {:?}", r.skipped))
    };
    let new = find("d/new");
    assert_eq!(new.kind, "Changed");
    assert!(
        new.reason.starts_with("added on the source after listing"),
        "{new:?}"
    );
    for p in ["d/gone", "d/copied", "d/sub"] {
        let s = find(p);
        assert_eq!(s.kind, "Changed", "{s:?}");
        assert!(
            s.reason.starts_with("removed on the source after listing"),
            "{s:?}"
        );
    }
    // Never fetched: left as an empty file, and the report says so by name.
    assert!(find("d/gone").reason.contains("left here as an empty file"));
    assert_eq!(fs::metadata(dest.tier().join("d/gone")).unwrap().len(), 0);
    // Copied before its removal: kept, not a mismatch.
    assert_eq!(
        fs::read(dest.tier().join("d/copied")).unwrap(),
        b"copied, then removed"
    );
    // One report per path: no duplicate for a path the crawl reported already (nor
    // a report of its metadata that the source could not find).
    for p in [&b"d/gone"[..], b"d/sub/x"] {
        let n = r
            .skipped
            .iter()
            .filter(|s| s.src_path.as_bytes() == p)
            .count();
        assert_eq!(n, 1, "{:?}", r.skipped);
    }
    // Under the removed directory only what the crawl itself found missing.
    let under: Vec<_> = r
        .skipped
        .iter()
        .filter(|s| s.src_path.as_bytes().starts_with(b"d/sub/"))
        .collect();
    assert!(
        under.iter().all(|s| s.src_path.as_bytes() == b"d/sub/x"),
        "{under:?}"
    );
    let summary = fs::read_to_string(dest.state().join("migrate/c.finished.txt")).unwrap();
    assert!(summary.contains("d/new [Changed] added on the source after listing"));
    assert!(summary.contains("d/gone [Changed] removed on the source after listing"));
    store.shutdown();
}

#[test]
fn a_demand_read_never_waits_behind_a_throttled_crawl_unit_of_the_same_file() {
    let src = tempfile::tempdir().unwrap();
    let data = common::content(3, 16 << 20);
    fs::write(src.path().join("big"), &data).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("prio");
    cfg.unit_size = 4 << 20;
    cfg.crawl_workers = 1;
    // 4 s of throttle per 4 MiB unit: a demand read behind one would take seconds.
    cfg.throttle_bytes_per_sec = Some(1 << 20);
    let m = attach(&store, posix(src.path()), cfg);
    let big = resolve(&store, b"big");
    let crawler = Crawler::start(store.clone(), m.clone());
    // The crawler is inside `big` (its first unit fetched, the next one throttled).
    let t = Instant::now();
    while m
        .counters
        .bytes_fetched
        .load(std::sync::atomic::Ordering::SeqCst)
        == 0
        && t.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut worst = Duration::ZERO;
    for at in [12u64 << 20, 8 << 20] {
        let o = store.open_file(big, libc::O_RDONLY, false).unwrap();
        let t0 = Instant::now();
        let got = store.read(o.fh, at, 4096).unwrap();
        worst = worst.max(t0.elapsed());
        store.release(o.fh).unwrap();
        assert_eq!(got, data[at as usize..at as usize + 4096]);
    }
    let fetched_by_crawl = m
        .counters
        .crawl_fetches
        .load(std::sync::atomic::Ordering::SeqCst);
    crawler.stop();
    assert!(fetched_by_crawl >= 1, "the crawler never got into the file");
    eprintln!("slowest demand read beside a throttled crawl: {worst:?}");
    // Behind the throttle: 4 s less the 0.3 s waited above; a demand fetch of one 4 MiB
    // unit is far quicker, even on a loaded machine's (or a slow CI) disk.
    assert!(
        worst < Duration::from_secs(3),
        "a demand read waited {worst:?} behind the throttled crawl"
    );
    store.shutdown();
}

fn posix_acl_of(path: &Path) -> Option<Vec<u8>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new("system.posix_acl_access").unwrap();
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r > 0).then(|| buf[..r as usize].to_vec())
}

#[test]
fn xattrs_and_acls_of_a_dummy_file_are_there_on_first_reference_and_client_changes_hold() {
    let src = tempfile::tempdir().unwrap();
    for name in ["doc", "doc2", "doc3", "empty"] {
        let data: &[u8] = if name == "empty" { b"" } else { b"hello" };
        fs::write(src.path().join(name), data).unwrap();
        common::set_xattr(&src.path().join(name), "user.tag", b"source");
    }
    // A POSIX ACL granting a named user, where setfacl exists (Debian: acl).
    let acl = common::have(&["setfacl"])
        && std::process::Command::new("setfacl")
            .args(["-m", "u:65534:r"])
            .arg(src.path().join("doc"))
            .status()
            .is_ok_and(|s| s.success());
    let dest = Dest::new();
    let store = dest.open();
    let m = attach(&store, posix(src.path()), MigrationConfig::new("meta"));
    let doc = resolve(&store, b"doc");
    let doc2 = resolve(&store, b"doc2");
    let doc3 = resolve(&store, b"doc3");
    let empty = resolve(&store, b"empty");
    // First reference: nothing of the data is here yet, the metadata is.
    assert_eq!(
        store.getxattr(doc, OsStr::new("user.tag")).ok(),
        Some(b"source".to_vec())
    );
    let names = store.listxattr(empty).unwrap();
    assert!(
        names.split(|b| *b == 0).any(|n| n == b"user.tag"),
        "{:?}",
        String::from_utf8_lossy(&names)
    );
    if acl {
        let want = posix_acl_of(&src.path().join("doc")).expect("source ACL");
        assert_eq!(
            store
                .getxattr(doc, OsStr::new("system.posix_acl_access"))
                .ok(),
            Some(want),
            "ACL of a never-read file"
        );
    } else {
        eprintln!("ACL part skipped: setfacl missing or not supported here");
    }
    assert!(
        !store.stub_state(doc).missing.is_empty(),
        "data still unfetched"
    );
    // A client's changes on dummies hold: a set value and a removed name.
    store
        .setxattr(doc2, OsStr::new("user.tag"), b"client", 0)
        .unwrap();
    store.removexattr(doc3, OsStr::new("user.tag")).unwrap();
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(read_all(&store, doc2), b"hello");
    assert_eq!(
        store.getxattr(doc2, OsStr::new("user.tag")).unwrap(),
        b"client"
    );
    assert!(store.getxattr(doc3, OsStr::new("user.tag")).is_err());
    assert_eq!(
        store.getxattr(doc, OsStr::new("user.tag")).unwrap(),
        b"source"
    );
    let r = finish(&store, &m).expect("finish");
    assert!(r.skipped.is_empty(), "{:?}", r.skipped);
    store.shutdown();
}

/// A share follows its source to a new address when the source's identity (POSIX: the
/// root's file system id and inode number) is the same: the same tree reached through a
/// symlinked path resumes (the recorded address is updated); another tree with the
/// layout of the first is refused, with both addresses and identities in the message.
#[test]
fn a_share_resumes_from_its_source_under_a_new_path_and_refuses_another_tree() {
    let src = small_source();
    let other = small_source();
    let links = tempfile::tempdir().unwrap();
    let moved = links.path().join("moved");
    std::os::unix::fs::symlink(src.path(), &moved).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let m = attach(&store, posix(src.path()), MigrationConfig::new("s"));
    assert_eq!(read_all(&store, resolve(&store, b"f")), b"source bytes");
    m.close();
    drop(m);
    let store = dest.reopen(store);

    let err = match Migration::open(&store, posix(other.path()), MigrationConfig::new("s")) {
        Ok(_) => panic!("another tree was accepted as the share's source"),
        Err(e) => e,
    };
    let id_of = |p: &Path| PosixSource::open(p).unwrap().identity().unwrap();
    for needle in [
        format!("posix:{}", src.path().display()),
        format!("posix:{}", other.path().display()),
        id_of(src.path()),
        id_of(other.path()),
    ] {
        assert!(err.contains(&needle), "{needle:?} missing from: {err}");
    }
    assert_eq!(id_of(src.path()), id_of(&moved), "same tree, same identity");

    let m = attach(&store, posix(&moved), MigrationConfig::new("s"));
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(read_all(&store, resolve(&store, b"d/g")), b"source g");
    m.close();
    drop(m);
    // The new address is the recorded one now: a restart from it is a plain resume.
    let store = dest.reopen(store);
    let m = attach(&store, posix(&moved), MigrationConfig::new("s"));
    finish(&store, &m).expect("finish");
    store.shutdown();
}

/// A sparse source file stays sparse: all-zero blocks are left as holes, so the
/// migrated file allocates no more than the source (plus a block per run of data).
#[test]
fn a_sparse_source_file_is_migrated_sparse() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let src = tempfile::tempdir().unwrap();
    let img = src.path().join("sparse.img");
    let size: u64 = 20 << 20;
    let runs: [(u64, usize); 3] = [(0, 4096), (7 << 20 | 1000, 20_000), (size - 512, 512)];
    {
        let f = fs::File::create(&img).unwrap();
        f.set_len(size).unwrap();
        for &(at, len) in &runs {
            f.write_all_at(&vec![0x5a; len], at).unwrap();
        }
    }
    let dest = Dest::new();
    let store = dest.open();
    let m = migrate_all(&store, src.path(), "sparse");
    let here = fs::metadata(dest.tier().join("sparse.img")).unwrap();
    let there = fs::metadata(&img).unwrap();
    assert_eq!(here.len(), size);
    let allowed = there.blocks() + runs.len() as u64 * 8;
    assert!(
        here.blocks() <= allowed,
        "{} blocks here, source {}, allowed {allowed}",
        here.blocks(),
        there.blocks()
    );
    assert_eq!(
        fs::read(dest.tier().join("sparse.img")).unwrap(),
        fs::read(&img).unwrap()
    );
    finish(&store, &m).expect("finish");
    store.shutdown();
}

#[test]
fn finish_fetches_again_what_changed_on_the_source_after_its_copy_completed() {
    use std::os::unix::fs::MetadataExt;
    let src = tempfile::tempdir().unwrap();
    fs::write(src.path().join("grows"), common::content(1, 50_000)).unwrap();
    fs::write(src.path().join("same_size"), common::content(2, 30_000)).unwrap();
    fs::write(src.path().join("kept"), b"never changes").unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let m = migrate_all(&store, src.path(), "chg");
    // The "read-only" source changes after the copies completed: one file grows, one is
    // rewritten at the same size (with another mtime, whatever the clock's resolution).
    fs::write(src.path().join("grows"), common::content(3, 3_000_000)).unwrap();
    fs::write(src.path().join("same_size"), common::content(4, 30_000)).unwrap();
    let old = filetime_of(&src.path().join("kept"));
    set_mtime(&src.path().join("same_size"), old.0 + 1000, 0);
    let r = finish(&store, &m).expect("a source that changed is reported, not a failure");
    assert!(r.mismatches.is_empty(), "{r:?}");
    assert_eq!(
        r.verified_files, 1,
        "only the unchanged file is verified: {r:?}"
    );
    assert_eq!(r.modified_by_clients, 0, "{r:?}");
    assert_eq!(r.changed_on_source.len(), 2, "{r:?}");
    let grows = r
        .changed_on_source
        .iter()
        .find(|c| c.starts_with("/grows"))
        .unwrap_or_else(|| panic!("{r:?}"));
    assert!(grows.contains("size 50000 → 3000000"), "{grows}");
    let same = r
        .changed_on_source
        .iter()
        .find(|c| c.starts_with("/same_size"))
        .unwrap_or_else(|| panic!("{r:?}"));
    assert!(same.contains("mtime ") && !same.contains("size "), "{same}");
    for name in ["grows", "same_size"] {
        let s = r
            .skipped
            .iter()
            .find(|s| s.src_path.as_bytes() == name.as_bytes())
            .unwrap_or_else(|| panic!("{name} not reported: {:?}", r.skipped));
        assert_eq!(s.kind, "Changed", "{s:?}");
        assert!(s.reason.contains("after its copy completed"), "{s:?}");
        // The copy holds the source's bytes and mtime now.
        let (here, there) = (dest.tier().join(name), src.path().join(name));
        assert_eq!(
            fs::read(&here).unwrap(),
            fs::read(&there).unwrap(),
            "{name}"
        );
        let (h, t) = (fs::metadata(&here).unwrap(), fs::metadata(&there).unwrap());
        assert_eq!(
            (h.mtime(), h.mtime_nsec()),
            (t.mtime(), t.mtime_nsec()),
            "{name}"
        );
    }
    let summary = fs::read_to_string(dest.state().join("migrate/chg.finished.txt")).unwrap();
    assert!(summary.contains("changed on the source 2"), "{summary}");
    store.shutdown();
}

fn filetime_of(p: &Path) -> (i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

fn set_mtime(p: &Path, secs: i64, nanos: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: nanos,
        },
    ];
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(r, 0, "utimensat {}", p.display());
}
