//! Post-copy migration end to end through the store API: on-demand access, client
//! renames/writes/truncates/deletes during the migration, the background crawl, crash and
//! restart, and finish — from the POSIX source, from nfs-ganesha and from Samba.

mod common;

use common::store_client::attach;

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kaiso_source::{NfsSource, PosixSource, SmbSource};
use kaiso_store::migrate::{
    CrawlState, Crawler, Migration, MigrationConfig, Migrations, Source, SourceAttr, SourceEntry,
    SourcePath, SourceResult,
};
use kaiso_store::{Caller, Ino, ROOT_INO, SetAttr, Store, StoreConfig};

struct Dest {
    _tmp: Option<tempfile::TempDir>,
    root: PathBuf,
    cfg: String,
}

impl Dest {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("t0")).unwrap();
        let mut d = Self::at(tmp.path());
        d._tmp = Some(tmp);
        d
    }
    /// A destination in an existing directory (the crash child reuses its parent's).
    fn at(root: &Path) -> Self {
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"4GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            root.join("state").display(),
            root.join("t0").display()
        );
        Dest {
            _tmp: None,
            root: root.to_path_buf(),
            cfg,
        }
    }
    fn open(&self) -> Arc<Store> {
        Store::open(StoreConfig::from_toml_str(&self.cfg, "test.toml").unwrap()).unwrap()
    }
    fn tier(&self) -> PathBuf {
        self.root.join("t0")
    }
}

/// A POSIX source over `root`, boxed for [`attach`].
fn posix(root: &Path) -> Box<dyn Source> {
    Box::new(PosixSource::open(root).unwrap())
}

fn resolve(store: &Store, path: &[u8]) -> Ino {
    let mut ino = ROOT_INO;
    for c in path.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
        let a = store.lookup(ino, OsStr::from_bytes(c)).unwrap_or_else(|e| {
            panic!(
                "lookup {}: errno {}",
                String::from_utf8_lossy(path),
                e.errno()
            )
        });
        store.forget(a.ino, 1);
        ino = a.ino;
    }
    ino
}

fn read_all(store: &Store, ino: Ino) -> Vec<u8> {
    let size = store.getattr(ino, None).unwrap().size;
    let o = store.open_file(ino, libc::O_RDONLY, false).unwrap();
    let mut out = Vec::new();
    while (out.len() as u64) < size {
        let d = store.read(o.fh, out.len() as u64, 4 << 20).unwrap();
        if d.is_empty() {
            break;
        }
        out.extend_from_slice(&d);
    }
    store.release(o.fh).unwrap();
    out
}

/// Compares the tier tree (plain files after migration) with the source tree for every
/// path not in `changed`: kind, mode, owner, size, mtime, content, symlink target,
/// user xattrs, and hard links (same inode for paths sharing a source inode).
fn compare_trees(src: &Path, dst: &Path, changed: &[&[u8]], check_owner_mode: bool) -> usize {
    let mut n = 0;
    let mut links: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for (rel, sm) in common::walk(src) {
        if changed.iter().any(|c| rel.starts_with(c)) {
            continue;
        }
        let dp = dst.join(OsStr::from_bytes(&rel));
        let dm = fs::symlink_metadata(&dp)
            .unwrap_or_else(|e| panic!("{} missing on the destination: {e}", dp.display()));
        let what = String::from_utf8_lossy(&rel).into_owned();
        assert_eq!(common::kind_of(&dm), common::kind_of(&sm), "kind of {what}");
        if check_owner_mode {
            assert_eq!(dm.mode() & 0o7777, sm.mode() & 0o7777, "mode of {what}");
            assert_eq!(
                (dm.uid(), dm.gid()),
                (sm.uid(), sm.gid()),
                "owner of {what}"
            );
        }
        if sm.is_file() {
            assert_eq!(dm.size(), sm.size(), "size of {what}");
            assert_eq!(
                (dm.mtime(), dm.mtime_nsec()),
                (sm.mtime(), sm.mtime_nsec()),
                "mtime of {what}"
            );
            assert!(
                fs::read(&dp).unwrap() == fs::read(src.join(OsStr::from_bytes(&rel))).unwrap(),
                "content of {what}"
            );
            if sm.nlink() > 1 {
                let first = *links.entry(sm.ino()).or_insert(dm.ino());
                assert_eq!(first, dm.ino(), "hard link of {what}");
            }
        }
        if sm.file_type().is_symlink() {
            assert_eq!(
                fs::read_link(&dp).unwrap(),
                fs::read_link(src.join(OsStr::from_bytes(&rel))).unwrap(),
                "target of {what}"
            );
        }
        n += 1;
    }
    n
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let nm = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let r = unsafe { libc::lgetxattr(c.as_ptr(), nm.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return None;
    }
    buf.truncate(r as usize);
    Some(buf)
}

#[test]
fn posix_migration_with_concurrent_clients_then_finish() {
    let src = tempfile::tempdir().unwrap();
    common::build_tree(src.path());
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("share1");
    cfg.unit_size = 1 << 20; // small units so big files take several fetches
    let m = attach(&store, posix(src.path()), cfg);
    assert_eq!(m.remaining(), 1, "only the root dummy at start");

    // First access: the ancestors are listed on the way, the data fetched on demand.
    let big = resolve(&store, b"a/b/c/big.bin");
    let want_big = fs::read(src.path().join("a/b/c/big.bin")).unwrap();
    let o = store.open_file(big, libc::O_RDONLY, false).unwrap();
    assert_eq!(
        store.read(o.fh, 2_100_000, 1000).unwrap(),
        want_big[2_100_000..2_101_000]
    );
    store.release(o.fh).unwrap();
    let missing = store.stub_state(big).missing;
    assert!(!missing.is_empty(), "only one unit fetched");
    assert!(
        missing.iter().all(|&(s, e)| e <= 2 << 20 || s >= 3 << 20),
        "the unit around 2.1 MB is present: {missing:?}"
    );
    assert!(m.remaining() > 5);

    // Clients during the migration: rename an unlisted directory, write into a partial
    // file, truncate-and-extend, delete a stub.
    let a = resolve(&store, b"a");
    store
        .rename(a, OsStr::new("b"), ROOT_INO, OsStr::new("moved"), 0)
        .unwrap();
    let f = resolve(&store, b"moved/just-over-1m");
    let o = store.open_file(f, libc::O_RDWR, false).unwrap();
    store.write(o.fh, 1_000_000, b"CLIENT").unwrap();
    store.release(o.fh).unwrap();
    let tiny = resolve(&store, b"tiny.txt");
    store
        .setattr(
            tiny,
            &SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
            Caller::ROOT,
        )
        .unwrap();
    store
        .setattr(
            tiny,
            &SetAttr {
                size: Some(10),
                ..SetAttr::default()
            },
            Caller::ROOT,
        )
        .unwrap();
    store.unlink(ROOT_INO, OsStr::new("zero")).unwrap();

    // The renamed subtree still fetches from its source path.
    let deep = resolve(&store, b"moved/c/d/deep.txt");
    assert_eq!(
        read_all(&store, deep),
        common::content(6, 100),
        "skipped: {:?}",
        m.skipped()
    );
    let mut want = common::content(4, (1 << 20) + 7);
    want[1_000_000..1_000_006].copy_from_slice(b"CLIENT");
    assert_eq!(
        read_all(&store, f),
        want,
        "client write kept, the rest fetched around it"
    );
    assert_eq!(
        read_all(&store, tiny),
        vec![0u8; 10],
        "truncated then extended: zeros, not source bytes"
    );

    // Background crawl to the end.
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0);

    // Plain files on the tier equal the source (paths moved by the client mapped back).
    let tier = dest.tier();
    fs::rename(tier.join("moved"), tier.join("a/b")).unwrap();
    let n = compare_trees(
        src.path(),
        &tier,
        &[b"zero", b"tiny.txt", b"a/b/just-over-1m"],
        true,
    );
    assert!(n > 50, "{n} compared (all but the 3 paths clients changed)");
    fs::rename(tier.join("a/b"), tier.join("moved")).unwrap();
    assert_eq!(
        xattr(&tier.join("a/page"), "user.kaiso.test"),
        Some(common::content(9, 300))
    );
    assert_eq!(
        xattr(&tier.join("tiny.txt"), "user.color"),
        Some(b"blue".to_vec())
    );
    assert_eq!(
        fs::read(tier.join(OsStr::from_bytes(common::NON_UTF8_NAME))).unwrap(),
        b"latin-1 name"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(
        fs::symlink_metadata(tier.join("fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );

    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(report.verified_files > 40, "{report:?}");
    assert!(report.modified_by_clients >= 2, "{report:?}");
    assert!(report.mismatches.is_empty());
    assert!(!m.state_dir().exists(), "migration state removed");
    store.shutdown();
}

#[test]
fn crash_during_migration_then_restart_finishes_without_loss() {
    let src = tempfile::tempdir().unwrap();
    common::build_tree(src.path());
    let dest = Dest::new();
    {
        let store = dest.open();
        let mut cfg = MigrationConfig::new("crashy");
        cfg.unit_size = 512 << 10;
        // Throttled (the tree's 4.5 MB take seconds at 1 MiB/s): the crawl is surely
        // cut off mid-way below, however fast the machine.
        cfg.throttle_bytes_per_sec = Some(1 << 20);
        let m = attach(&store, posix(src.path()), cfg);
        let big = resolve(&store, b"a/b/c/big.bin");
        let o = store.open_file(big, libc::O_RDONLY, false).unwrap();
        store.read(o.fh, 0, 10).unwrap();
        store.release(o.fh).unwrap();
        let crawler = Crawler::start(store.clone(), m.clone());
        std::thread::sleep(Duration::from_millis(10));
        // As after kill -9: the crawler is cut off mid-way, no clean close of the
        // migration, no store shutdown (the in-process store lock must be released).
        drop(crawler);
        assert!(m.remaining() > 0, "crawl was cut off before the end");
        drop(m);
        drop(store);
    }
    let store = dest.open();
    let mut cfg = MigrationConfig::new("crashy");
    cfg.unit_size = 512 << 10;
    let m = attach(&store, posix(src.path()), cfg);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    let n = compare_trees(src.path(), &dest.tier(), &[], true);
    assert!(n > 60);
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(report.mismatches.is_empty());
    store.shutdown();
}

#[test]
fn nfs_migration_from_ganesha() {
    if !common::have(&["ganesha.nfsd", "rpcbind", "nfs-ls"]) {
        return;
    }
    let export = tempfile::tempdir().unwrap();
    common::build_tree(export.path());
    let server = common::Ganesha::start(export.path());
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("nfs");
    cfg.order = kaiso_policy::crawl::CrawlOrder::parse("dfs", "bulk").unwrap();
    cfg.crawl_workers = 3;
    let m = attach(
        &store,
        Box::new(NfsSource::connect(server.config()).unwrap()),
        cfg,
    );
    let crawler = Crawler::start(store.clone(), m.clone());
    let state = crawler.wait(Duration::from_secs(180));
    assert_eq!(
        state,
        CrawlState::Done,
        "{} stubs left after {} rounds; failures {:?}; skipped {:?}",
        m.remaining(),
        crawler.rounds(),
        crawler.failures(),
        m.skipped()
    );
    drop(crawler);
    let n = compare_trees(export.path(), &dest.tier(), &[], true);
    assert!(n > 60);
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(
        report.verified_files > 40 && report.mismatches.is_empty(),
        "{report:?}"
    );
    store.shutdown();
}

#[test]
fn smb_migration_from_samba() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().unwrap();
    common::build_tree(share.path());
    let server = common::Samba::start(share.path());
    let payload = common::content(31, 3000);
    let local = share.path().join("../kaiso-ads-payload-2");
    fs::write(&local, &payload).unwrap();
    server.smbclient(&format!("put {} tiny.txt:extra", local.display()));
    fs::remove_file(&local).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let m = attach(
        &store,
        Box::new(SmbSource::connect(server.config()).unwrap()),
        MigrationConfig::new("smb"),
    );
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(180)), CrawlState::Done);
    drop(crawler);
    let tier = dest.tier();
    for rel in ["a/b/c/big.bin", "sparse.img", "wide/f017", "a/b/linked-too"] {
        assert!(
            fs::read(tier.join(rel)).unwrap() == fs::read(share.path().join(rel)).unwrap(),
            "{rel}"
        );
    }
    assert_eq!(
        fs::metadata(tier.join("a/linked")).unwrap().ino(),
        fs::metadata(tier.join("a/b/linked-too")).unwrap().ino(),
        "hard link rebuilt"
    );
    assert_eq!(
        xattr(&tier.join("tiny.txt"), "user.color"),
        Some(b"blue".to_vec())
    );
    let mut stream = payload.clone();
    stream.push(0);
    assert_eq!(
        xattr(&tier.join("tiny.txt"), "user.DosStream.extra:$DATA"),
        Some(stream)
    );
    assert!(
        xattr(
            &tier.join("tiny.txt"),
            kaiso_store::migrate::engine::NT_SD_XATTR
        )
        .is_some()
    );
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(
        report.verified_files > 40 && report.mismatches.is_empty(),
        "{report:?}"
    );
    store.shutdown();
}

/// Runs `f` on a thread and fails the test if it does not return within `limit` (a
/// deadlock shows up as a failure, not as a hung test run).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .expect("did not finish in time: deadlock?")
}

fn write_tree(root: &Path, files: &[(&str, Vec<u8>)], dirs: &[&str]) {
    for d in dirs {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for (name, data) in files {
        fs::write(root.join(name), data).unwrap();
    }
}

fn ino_of(store: &Store, path: &[u8]) -> Ino {
    resolve(store, path)
}

#[test]
fn concurrent_lookups_wait_for_one_listing_and_hard_links_in_one_directory_do_not_deadlock() {
    let src = tempfile::tempdir().unwrap();
    let mut files = vec![
        ("h/x", common::content(1, 5000)),
        ("h/sub/s", common::content(2, 777)),
        ("h2/old", common::content(3, 10)),
    ];
    let names: Vec<String> = (0..50).map(|i| format!("h/f{i:02}")).collect();
    for (i, n) in names.iter().enumerate() {
        files.push((n.as_str(), common::content(10 + i as u64, i)));
    }
    write_tree(src.path(), &files, &["h/sub", "h2"]);
    // Two names of one file in the same directory: the second is created as a hard
    // link to the first while that directory is being listed (the old deadlock).
    fs::hard_link(src.path().join("h/x"), src.path().join("h/y")).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let m = attach(&store, posix(src.path()), MigrationConfig::new("gate"));
    let s2 = store.clone();
    let results = within(Duration::from_secs(60), move || {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let s = s2.clone();
                std::thread::spawn(move || {
                    let path: &[u8] = match i % 3 {
                        0 => b"h/sub/s",
                        1 => b"h/y",
                        _ => b"h/f49",
                    };
                    let ino = resolve(&s, path);
                    read_all(&s, ino)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (i, got) in results.iter().enumerate() {
        let want = match i % 3 {
            0 => common::content(2, 777),
            1 => common::content(1, 5000),
            _ => common::content(59, 49),
        };
        assert_eq!(*got, want, "reader {i}");
    }
    assert_eq!(
        m.counters
            .dirs_listed
            .load(std::sync::atomic::Ordering::SeqCst),
        3,
        "root, h and h/sub each listed exactly once"
    );
    assert_eq!(
        ino_of(&store, b"h/x"),
        ino_of(&store, b"h/y"),
        "hard link rebuilt"
    );
    // A client mkdir in an unlisted directory lists it first, then creates.
    let h2 = ino_of(&store, b"h2");
    let s3 = store.clone();
    within(Duration::from_secs(30), move || {
        s3.mkdir(h2, OsStr::new("new"), 0o755, 0, Caller::ROOT)
            .unwrap()
    });
    assert_eq!(
        read_all(&store, ino_of(&store, b"h2/old")),
        common::content(3, 10)
    );
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0);
    kaiso_store::migrate::finish(&store, &m).expect("finish");
    store.shutdown();
}

#[test]
fn client_unlink_rename_and_rmdir_keep_the_counter_right() {
    let src = tempfile::tempdir().unwrap();
    write_tree(
        src.path(),
        &[
            ("d/f1", common::content(1, 100)),
            ("d/f2", common::content(2, 2 << 20)),
            ("d/f3", common::content(3, 3000)),
            ("d/full/inner", common::content(4, 10)),
            ("d/deep/x/y", common::content(5, 10)),
        ],
        &["d/e", "d/full", "top", "d/deep/x"],
    );
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("counter");
    cfg.unit_size = 1 << 20;
    let m = attach(&store, posix(src.path()), cfg);
    let d = ino_of(&store, b"d");
    let top = ino_of(&store, b"top");
    let _ = ino_of(&store, b"d/f1"); // lists d
    let _ = store.lookup(top, OsStr::new("none")); // lists top (empty on the source)
    let r0 = m.remaining();
    // Deleting a dummy file.
    store.unlink(d, OsStr::new("f1")).unwrap();
    assert_eq!(m.remaining(), r0 - 1, "unlink of a dummy file");
    // Deleting a partial file (one unit of two fetched).
    let f2 = ino_of(&store, b"d/f2");
    let o = store.open_file(f2, libc::O_RDONLY, false).unwrap();
    store.read(o.fh, 0, 10).unwrap();
    store.release(o.fh).unwrap();
    assert!(!store.stub_state(f2).missing.is_empty());
    assert_eq!(m.remaining(), r0 - 1);
    store.unlink(d, OsStr::new("f2")).unwrap();
    assert_eq!(m.remaining(), r0 - 2, "unlink of a partial file");
    // Renaming a dummy file: counter unchanged, data still from its source path.
    store
        .rename(d, OsStr::new("f3"), top, OsStr::new("f3-moved"), 0)
        .unwrap();
    assert_eq!(m.remaining(), r0 - 2, "rename keeps the stub");
    assert_eq!(
        read_all(&store, ino_of(&store, b"top/f3-moved")),
        common::content(3, 3000)
    );
    assert_eq!(m.remaining(), r0 - 3, "completed after the read");
    // rmdir of a dummy directory empty on the source: listed, then removed.
    store.rmdir(d, OsStr::new("e")).unwrap();
    assert_eq!(m.remaining(), r0 - 4, "rmdir of a dummy directory");
    // rmdir of a dummy directory that is not empty on the source.
    assert_eq!(
        store.rmdir(d, OsStr::new("full")).unwrap_err(),
        kaiso_store::FsError::NOTEMPTY
    );
    // Renaming an empty client directory over a dummy directory that is not empty on
    // the source must fail like it would on the source.
    let deep = ino_of(&store, b"d/deep");
    let _ = deep;
    store
        .mkdir(ROOT_INO, OsStr::new("client-empty"), 0o755, 0, Caller::ROOT)
        .unwrap();
    assert_eq!(
        store
            .rename(
                ROOT_INO,
                OsStr::new("client-empty"),
                deep,
                OsStr::new("x"),
                0
            )
            .unwrap_err(),
        kaiso_store::FsError::NOTEMPTY,
        "d/deep/x has an entry on the source"
    );
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0);
    assert_eq!(
        fs::read(dest.tier().join("d/deep/x/y")).unwrap(),
        common::content(5, 10)
    );
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(report.mismatches.is_empty(), "{report:?}");
    store.shutdown();
}

/// A parallel crawl (4 workers) while a client renames directories back and forth,
/// renames files and deletes files: nothing missed (counter 0, every surviving file
/// equal to its source), nothing duplicated (no extra entries).
#[test]
fn parallel_crawl_with_concurrent_renames_and_deletes_misses_nothing() {
    let src = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for i in 0..6 {
        for j in 0..4 {
            dirs.push(format!("p{i}/q{j}"));
            for k in 0..6 {
                files.push((
                    format!("p{i}/q{j}/f{k}"),
                    common::content((i * 100 + j * 10 + k) as u64, 1000 * k + 17),
                ));
            }
        }
    }
    let dir_refs: Vec<&str> = dirs.iter().map(|s| s.as_str()).collect();
    let file_refs: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    write_tree(src.path(), &file_refs, &dir_refs);
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("parallel");
    cfg.crawl_workers = 4;
    cfg.unit_size = 4096;
    let m = attach(&store, posix(src.path()), cfg);
    let crawler = Crawler::start(store.clone(), m.clone());
    // The client: moves p0 under p1 and back, renames and deletes files in p2.
    let mut deleted = Vec::new();
    let mut renamed = Vec::new();
    let p1 = ino_of(&store, b"p1");
    for round in 0..6 {
        let (from, to, name) = if round % 2 == 0 {
            (ROOT_INO, p1, "p0")
        } else {
            (p1, ROOT_INO, "p0")
        };
        store
            .rename(from, OsStr::new(name), to, OsStr::new(name), 0)
            .unwrap();
        let q = ino_of(&store, format!("p2/q{}", round % 4).as_bytes());
        let f = format!("f{}", round % 6);
        if round < 4 {
            store.unlink(q, OsStr::new(&f)).unwrap();
            deleted.push(format!("p2/q{}/{f}", round % 4));
        } else {
            store
                .rename(q, OsStr::new(&f), q, OsStr::new("renamed"), 0)
                .unwrap();
            renamed.push((
                format!("p2/q{}/{f}", round % 4),
                format!("p2/q{}/renamed", round % 4),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0);
    let tier = dest.tier();
    let mut seen = 0;
    for (name, data) in &files {
        if deleted.contains(name) {
            assert!(!tier.join(name).exists(), "{name} deleted by the client");
            continue;
        }
        let here = renamed
            .iter()
            .find(|(a, _)| a == name)
            .map(|(_, b)| b.clone())
            .unwrap_or_else(|| name.clone());
        let got = fs::read(tier.join(&here)).unwrap();
        // Not assert_eq!: a diff of two byte vectors says nothing; where the bytes came
        // from does (zeros: a lost stub; another file's bytes: a reused inode number).
        if got != *data {
            let zeros = got.iter().filter(|b| **b == 0).count();
            let from = files.iter().find(|(_, d)| *d == got).map(|(n, _)| n);
            panic!(
                "{here}: wrong content ({zeros} of {} bytes zero, equal to {from:?}); deleted {deleted:?}; skipped {:?}",
                got.len(),
                m.skipped()
            );
        }
        seen += 1;
    }
    assert_eq!(seen, files.len() - deleted.len());
    // No duplicates: the destination holds exactly the surviving files.
    let dst_files = common::walk(&tier)
        .into_iter()
        .filter(|(_, m)| m.is_file())
        .count();
    assert_eq!(dst_files, seen, "no extra or duplicated files");
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(report.mismatches.is_empty());
    store.shutdown();
}

/// The POSIX source read as an unprivileged account ("nobody", through the per-thread
/// fs uid), as when the migration account cannot read every file: real EACCES from the
/// real file system.
struct AsNobody(PosixSource);

impl AsNobody {
    fn call<T>(&self, f: impl FnOnce(&PosixSource) -> T) -> T {
        // SAFETY: setfsuid only changes this thread's file-system identity.
        let old = unsafe { libc::setfsuid(65534) };
        let r = f(&self.0);
        unsafe { libc::setfsuid(old as u32) };
        r
    }
}

impl Source for AsNobody {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn features(&self) -> kaiso_store::migrate::SourceFeatures {
        self.0.features()
    }
    fn stat(&self, p: &SourcePath) -> SourceResult<SourceAttr> {
        self.call(|s| s.stat(p))
    }
    fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.call(|s| s.read_dir(p))
    }
    fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.call(|s| s.read(p, offset, len))
    }
    fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
        self.call(|s| s.read_link(p))
    }
    fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.call(|s| s.xattrs(p))
    }
    fn acl(&self, p: &SourcePath) -> SourceResult<kaiso_store::migrate::SourceAcl> {
        self.call(|s| s.acl(p))
    }
    fn streams(&self, p: &SourcePath) -> SourceResult<Vec<kaiso_store::migrate::SourceStream>> {
        self.call(|s| s.streams(p))
    }
    fn read_stream(
        &self,
        p: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.call(|s| s.read_stream(p, stream, offset, len))
    }
}

#[test]
fn bad_input_is_reported_never_silently_zero_filled() {
    if unsafe { libc::geteuid() } != 0 {
        return; // needs root to create files "nobody" cannot read
    }
    let src = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(src.path(), fs::Permissions::from_mode(0o755)).unwrap();
    write_tree(
        src.path(),
        &[
            ("ok.txt", common::content(1, 5000)),
            ("secret", common::content(2, 6000)),
            ("locked/inside", common::content(3, 10)),
            ("grows", common::content(4, 3000)),
            ("shrinks", common::content(5, 300_000)),
        ],
        &["locked"],
    );
    fs::write(
        src.path().join(OsStr::from_bytes(common::NON_UTF8_NAME)),
        b"latin-1 name",
    )
    .unwrap();
    fs::set_permissions(src.path().join("secret"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::set_permissions(src.path().join("locked"), fs::Permissions::from_mode(0o700)).unwrap();
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("bad");
    cfg.unit_size = 64 << 10;
    let m = attach(
        &store,
        Box::new(AsNobody(PosixSource::open(src.path()).unwrap())),
        cfg,
    );
    // Listed, then the "read-only" source changes under us before the data is fetched.
    let shrinks = ino_of(&store, b"shrinks");
    let o = store.open_file(shrinks, libc::O_RDONLY, false).unwrap();
    store.read(o.fh, 0, 10).unwrap();
    store.release(o.fh).unwrap();
    fs::write(src.path().join("shrinks"), common::content(6, 100_000)).unwrap();
    let f = fs::OpenOptions::new()
        .append(true)
        .open(src.path().join("grows"))
        .unwrap();
    use std::io::Write;
    (&f).write_all(b"more").unwrap();
    drop(f);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(m.remaining(), 0, "bad entries do not block completion");
    let tier = dest.tier();
    assert_eq!(
        fs::read(tier.join("ok.txt")).unwrap(),
        common::content(1, 5000)
    );
    assert_eq!(
        fs::read(tier.join(OsStr::from_bytes(common::NON_UTF8_NAME))).unwrap(),
        b"latin-1 name",
        "a name that is not UTF-8 is copied byte for byte"
    );
    assert_eq!(
        fs::metadata(tier.join("secret")).unwrap().len(),
        0,
        "unreadable file left empty, not 6000 zero bytes"
    );
    assert!(tier.join("locked").is_dir());
    let skipped = m.skipped();
    let find = |p: &str, kind: &str| {
        skipped
            .iter()
            .find(|s| s.src_path.as_bytes() == p.as_bytes() && s.kind == kind)
            .unwrap_or_else(|| panic!("{p} [{kind}] not in the skip report: {skipped:?}"))
            .reason
            .clone()
    };
    assert!(!find("secret", "PermissionDenied").is_empty());
    assert!(!find("locked", "PermissionDenied").is_empty());
    assert!(find("grows", "Changed").contains("3000 -> 3004"));
    find("shrinks", "Changed");
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish reports, not fails");
    assert!(report.mismatches.is_empty(), "{report:?}");
    assert!(report.skipped.len() >= 4, "{report:?}");
    store.shutdown();
}

const CRASH_CHILD_ENV: &str = "KAISO_MIGRATE_CRASH_CHILD";

fn crash_cfg(throttled: bool) -> MigrationConfig {
    let mut cfg = MigrationConfig::new("kill9");
    cfg.unit_size = 256 << 10;
    cfg.crawl_workers = 3;
    if throttled {
        cfg.throttle_bytes_per_sec = Some(8 << 20);
    }
    cfg
}

/// The body of the child process `kill_9_at_random_moments_then_restart_loses_nothing`
/// starts and kills: crawls (throttled, so kills land mid-way) while a client reads
/// random files and checks every byte against the source.
#[test]
#[ignore = "child process of kill_9_at_random_moments_then_restart_loses_nothing"]
fn crash_child_process() {
    let Ok(spec) = std::env::var(CRASH_CHILD_ENV) else {
        eprintln!("crash_child_process only runs as the child of the kill -9 test");
        return;
    };
    let (src, dst) = spec.split_once('\n').unwrap();
    let src = PathBuf::from(src);
    let dest = Dest::at(Path::new(dst));
    let store = dest.open();
    let m = attach(&store, posix(&src), crash_cfg(true));
    let crawler = Crawler::start(store.clone(), m.clone());
    let paths: Vec<Vec<u8>> = common::walk(&src)
        .into_iter()
        .filter(|(_, md)| md.is_file() && md.len() < (4 << 20))
        .map(|(p, _)| p)
        .collect();
    let mut x = std::process::id() as u64 | 1;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = &paths[(x % paths.len() as u64) as usize];
        let got = read_all(&store, resolve(&store, p));
        if got != fs::read(src.join(OsStr::from_bytes(p))).unwrap() {
            fs::write(
                dest.root.join("MISMATCH"),
                String::from_utf8_lossy(p).as_bytes(),
            )
            .unwrap();
            std::process::exit(3);
        }
        std::thread::sleep(Duration::from_millis(20));
        if crawler.state() == CrawlState::Done {
            fs::write(dest.root.join("DONE"), b"").unwrap();
        }
    }
}

#[test]
fn kill_9_at_random_moments_then_restart_loses_nothing() {
    let src = tempfile::tempdir().unwrap();
    common::build_tree(src.path());
    let dest = Dest::new();
    let exe = std::env::current_exe().unwrap();
    let spec = format!("{}\n{}", src.path().display(), dest.root.display());
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
        | 1;
    let mut kills = Vec::new();
    for _ in 0..6 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let after = Duration::from_millis(50 + x % 1500);
        let log = fs::File::create(dest.root.join("child.log")).unwrap();
        let mut child = std::process::Command::new(&exe)
            .args([
                "--ignored",
                "--exact",
                "crash_child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CRASH_CHILD_ENV, &spec)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        std::thread::sleep(after);
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "child exited by itself ({status}): {}",
                fs::read_to_string(dest.root.join("child.log")).unwrap_or_default()
            );
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills.push(after);
        assert!(
            !dest.root.join("MISMATCH").exists(),
            "a client read wrong bytes: {}",
            fs::read_to_string(dest.root.join("MISMATCH")).unwrap()
        );
        if dest.root.join("DONE").exists() {
            break;
        }
    }
    // Restart after the last kill: the counter is recomputed, the crawl resumes, and
    // nothing fetched before the kills is fetched again.
    let store = dest.open();
    let m = attach(&store, posix(src.path()), crash_cfg(false));
    // List every directory first (metadata only, no data), so that every file the kills
    // left unfetched has a stub row to count.
    for (p, _) in common::walk(src.path()) {
        resolve(&store, &p);
    }
    let to_fetch = m.missing_bytes(&store);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(
        crawler.wait(Duration::from_secs(120)),
        CrawlState::Done,
        "after kills at {kills:?}"
    );
    drop(crawler);
    assert_eq!(m.remaining(), 0);
    assert_eq!(
        m.counters
            .bytes_fetched
            .load(std::sync::atomic::Ordering::SeqCst),
        to_fetch,
        "exactly the missing bytes were fetched after the restart (kills at {kills:?})"
    );
    let tier = dest.tier();
    let n = compare_trees(src.path(), &tier, &[], true);
    assert!(n > 60);
    // Nothing duplicated: the destination has no entry the source lacks.
    let src_names: std::collections::HashSet<Vec<u8>> = common::walk(src.path())
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    for (p, _) in common::walk(&tier) {
        assert!(
            src_names.contains(&p),
            "extra entry {} after kills at {kills:?}",
            String::from_utf8_lossy(&p)
        );
    }
    // Directory times, xattrs on files and directories, POSIX ACLs.
    for (p, sm) in common::walk(src.path()) {
        if sm.is_dir() {
            let dm = fs::metadata(tier.join(OsStr::from_bytes(&p))).unwrap();
            assert_eq!(
                common::mtime_ns(&dm),
                common::mtime_ns(&sm),
                "mtime of directory {}",
                String::from_utf8_lossy(&p)
            );
        }
    }
    for (path, name) in [
        ("a/page", "user.kaiso.test"),
        ("tiny.txt", "user.color"),
        ("a", "user.dir"),
        ("a/page", "system.posix_acl_access"),
        ("a/b", "system.posix_acl_default"),
    ] {
        assert_eq!(
            xattr(&tier.join(path), name),
            xattr(&src.path().join(path), name),
            "{name} of {path}"
        );
    }
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(
        report.mismatches.is_empty() && report.verified_files > 40,
        "{report:?}"
    );
    store.shutdown();
}

/// Pause, throttle, stop within one unit, demand fetches ahead of a throttled crawl, and
/// resume after a stop without fetching anything twice.
#[test]
fn crawl_pauses_throttles_stops_within_one_unit_and_yields_to_demand() {
    use std::sync::atomic::Ordering::SeqCst;
    let src = tempfile::tempdir().unwrap();
    let big: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("big{i}"), common::content(40 + i, 6 << 20)))
        .collect();
    let refs: Vec<(&str, Vec<u8>)> = big.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    write_tree(src.path(), &refs, &[]);
    let dest = Dest::new();
    let store = dest.open();
    let unit = 256u64 << 10;
    let mut cfg = MigrationConfig::new("control");
    cfg.unit_size = unit;
    cfg.crawl_workers = 2;
    cfg.throttle_bytes_per_sec = Some(2 << 20);
    let workers = cfg.crawl_workers as u64;
    let m = attach(&store, posix(src.path()), cfg);
    let crawler = Crawler::start(store.clone(), m.clone());
    let fetched = || m.counters.bytes_fetched.load(SeqCst);
    // Throttle: the crawl stays under its budget (an upper bound, safe on a slow machine).
    let t0 = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    let rate = fetched() as f64 / t0.elapsed().as_secs_f64();
    assert!(
        rate < 1.5 * (2 << 20) as f64 + (workers * unit) as f64,
        "crawl at {rate} B/s despite a 2 MiB/s throttle"
    );
    // Demand fetches are not throttled and never wait behind the crawl's throttle: with
    // the crawl slowed to 32 KiB/s (8 s of throttle per 256 KiB unit), 2 MiB of every
    // file now, so the files the workers are inside are read too. Waiting behind one
    // throttled unit costs 8 s; the reads themselves take well under a second, and the
    // 6 s bound leaves room for a loaded machine's (or a slow CI disk's) writes.
    m.set_throttle(Some(32 << 10));
    let t1 = std::time::Instant::now();
    for (name, data) in &big {
        let ino = ino_of(&store, name.as_bytes());
        let o = store.open_file(ino, libc::O_RDONLY, false).unwrap();
        let got = store.read(o.fh, 4 << 20, 2 << 20).unwrap();
        store.release(o.fh).unwrap();
        assert_eq!(got, data[4 << 20..6 << 20]);
    }
    let demand_time = t1.elapsed();
    eprintln!("demand reads of 4 x 2 MiB beside a throttled crawl: {demand_time:?}");
    m.set_throttle(Some(2 << 20));
    assert!(
        demand_time < Duration::from_secs(6),
        "demand reads took {demand_time:?}: waited behind the throttled crawl?"
    );
    // Pause: nothing more is fetched once the units in flight are done. Their end is
    // awaited (no count moves for 500 ms), not guessed: a loaded machine's disk may take
    // long over them. A crawl that kept going (a 256 KiB unit every ~0.1 s at 2 MiB/s)
    // never stands still that long, and fails the 30 s bound.
    crawler.pause();
    assert_eq!(crawler.state(), CrawlState::Paused);
    let t_pause = std::time::Instant::now();
    let mut p0 = fetched();
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = fetched();
        if now == p0 {
            break;
        }
        assert!(
            t_pause.elapsed() < Duration::from_secs(30),
            "still fetching 30 s after the pause: {p0} then {now} bytes"
        );
        p0 = now;
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(fetched(), p0, "fetching while paused");
    crawler.resume();
    std::thread::sleep(Duration::from_millis(300));
    // Stop: at most the unit in progress per worker after the request.
    let s0 = fetched();
    let t2 = std::time::Instant::now();
    assert_eq!(crawler.stop(), CrawlState::Stopped);
    let stop_time = t2.elapsed();
    assert!(
        fetched() - s0 <= workers * unit,
        "{} bytes fetched after the stop request",
        fetched() - s0
    );
    assert!(
        stop_time < Duration::from_secs(5),
        "stop took {stop_time:?}"
    );
    assert!(m.remaining() > 0, "stopped before the end");
    // Resume after the stop: finishes, and fetches exactly what was missing.
    let missing = m.missing_bytes(&store);
    let before = fetched();
    m.set_throttle(None);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    assert_eq!(fetched() - before, missing, "nothing fetched twice");
    for (name, data) in &big {
        assert!(fs::read(dest.tier().join(name)).unwrap() == *data, "{name}");
    }
    store.shutdown();
}

/// A source that records when it is dropped (its connections closed).
struct DropWatch(PosixSource, Arc<std::sync::atomic::AtomicBool>);

impl Drop for DropWatch {
    fn drop(&mut self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Source for DropWatch {
    fn describe(&self) -> String {
        self.0.describe()
    }
    fn features(&self) -> kaiso_store::migrate::SourceFeatures {
        self.0.features()
    }
    fn stat(&self, p: &SourcePath) -> SourceResult<SourceAttr> {
        self.0.stat(p)
    }
    fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.0.read_dir(p)
    }
    fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.0.read(p, offset, len)
    }
    fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
        self.0.read_link(p)
    }
    fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.0.xattrs(p)
    }
    fn acl(&self, p: &SourcePath) -> SourceResult<kaiso_store::migrate::SourceAcl> {
        self.0.acl(p)
    }
    fn streams(&self, p: &SourcePath) -> SourceResult<Vec<kaiso_store::migrate::SourceStream>> {
        self.0.streams(p)
    }
    fn read_stream(
        &self,
        p: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.0.read_stream(p, stream, offset, len)
    }
}

#[test]
fn progress_query_follows_the_migration_and_finish_detaches_the_source() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    let src = tempfile::tempdir().unwrap();
    let a = common::content(7, 1 << 20);
    let b = common::content(8, 300_000);
    write_tree(src.path(), &[("a", a.clone()), ("d/b", b.clone())], &["d"]);
    let dest = Dest::new();
    let store = dest.open();
    let state_dir = dest.root.join("state");
    let unit = 256u64 << 10;
    let mut cfg = MigrationConfig::new("watched");
    cfg.unit_size = unit;
    let dropped = Arc::new(AtomicBool::new(false));
    let source = DropWatch(PosixSource::open(src.path()).unwrap(), dropped.clone());
    let m = Migration::open(&store, Box::new(source), cfg).unwrap();
    assert!(
        !m.recounted_at_open(),
        "a brand-new migration is not a crash"
    );
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all.clone());
    assert!(store.has_stub_filler());

    // Nothing listed yet: one pending directory (the share root), nothing known.
    let p = m.progress(&store).unwrap();
    assert_eq!((p.remaining, p.dirs_pending, p.file_stubs), (1, 1, 0));
    assert_eq!((p.files_done, p.bytes_done, p.bytes_known), (0, 0, 0));
    assert_eq!(
        Migration::saved_progress(&state_dir, "watched").unwrap(),
        p,
        "same figures from the saved state"
    );

    // Reading 10 bytes of `a` lists the root and fetches exactly one unit of `a`.
    let ia = ino_of(&store, b"a");
    let o = store.open_file(ia, libc::O_RDONLY, false).unwrap();
    assert_eq!(store.read(o.fh, 0, 10).unwrap(), a[..10]);
    store.release(o.fh).unwrap();
    let p = m.progress(&store).unwrap();
    assert_eq!(p.remaining, 2, "a (partial) and d (not listed)");
    assert_eq!((p.dirs_pending, p.file_stubs, p.files_done), (1, 1, 0));
    assert_eq!(p.bytes_known, a.len() as u64);
    assert_eq!(p.bytes_done, unit);
    assert_eq!(p.missing_bytes, a.len() as u64 - unit);
    assert_eq!(p.missing_bytes, m.missing_bytes(&store));
    // From the saved state alone (the store's database read-only), a partial file's
    // fetched part counts as done, as in the live figures (before session 12: 0).
    let saved = Migration::saved_progress(&state_dir, "watched").unwrap();
    assert_eq!(
        (saved.bytes_done, saved.missing_bytes),
        (unit, a.len() as u64 - unit)
    );
    assert!(Migration::saved_progress(&state_dir, "no-such-share").is_err());

    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    let p = m.progress(&store).unwrap();
    assert_eq!((p.remaining, p.dirs_pending, p.file_stubs), (0, 0, 0));
    assert_eq!(p.files_done, 2);
    assert_eq!(p.bytes_done, (a.len() + b.len()) as u64);
    assert_eq!((p.bytes_known, p.missing_bytes), (p.bytes_done, 0));
    assert!(p.skipped.is_empty());

    kaiso_store::migrate::finish(&store, &m).expect("finish");
    // Detach: the filler forgets the share, the last one, so it is unregistered; once
    // the last handle goes, the source is closed.
    let weak = Arc::downgrade(&m);
    let removed = all.remove(&store, "watched").expect("was attached");
    assert!(all.remove(&store, "watched").is_none());
    assert!(all.all().is_empty());
    assert!(
        !store.has_stub_filler(),
        "no share left: filler unregistered"
    );
    assert!(!dropped.load(SeqCst), "still held by the caller");
    drop(removed);
    drop(m);
    assert!(weak.upgrade().is_none(), "nothing else holds the migration");
    assert!(dropped.load(SeqCst), "source closed");
    // The store serves the plain files without any source.
    assert_eq!(read_all(&store, ino_of(&store, b"d/b")), b);
    assert_eq!(read_all(&store, ia), a);

    // A filler shared by two shares stays registered while one is left.
    let two = Migrations::new();
    for name in ["s1", "s2"] {
        let mut cfg = MigrationConfig::new(name);
        cfg.target = PathBuf::from(format!("new/{name}"));
        let m = Migration::open(&store, posix(src.path()), cfg).unwrap();
        two.add(m);
    }
    store.set_stub_filler(two.clone());
    assert!(two.remove(&store, "s1").is_some());
    assert!(store.has_stub_filler(), "s2 still needs the filler");
    // Another filler registered meanwhile is never unregistered by this one.
    store.set_stub_filler(all.clone());
    assert!(two.remove(&store, "s2").is_some());
    assert!(store.has_stub_filler());
    store.shutdown();
}

#[test]
fn only_an_unclean_stop_recounts_at_open() {
    let src = tempfile::tempdir().unwrap();
    write_tree(src.path(), &[("f", b"x".to_vec())], &[]);
    let dest = Dest::new();
    let store = dest.open();
    let open =
        || Migration::open(&store, posix(src.path()), MigrationConfig::new("restarts")).unwrap();
    let m = open();
    assert!(!m.recounted_at_open(), "brand-new: marked cleanly stopped");
    assert_eq!(m.remaining(), 1);
    m.close();
    drop(m);
    let m = open();
    assert!(!m.recounted_at_open(), "after a clean stop");
    // Dropped without close: as after kill -9.
    drop(m);
    let m = open();
    assert!(m.recounted_at_open(), "after an unclean stop");
    assert_eq!(m.remaining(), 1);
    m.close();
    store.shutdown();
}

/// The POSIX source behind a slow link whose file reads can be cut off: `read_delay`
/// per data read; while `down` is set, data reads fail as if the server were
/// unreachable (listings and stats still answer, so only data is stuck); while
/// `stat_down` is set, `stat` of a regular file fails the same way (data still flows).
struct SlowLink {
    inner: PosixSource,
    read_delay: Duration,
    down: Arc<std::sync::atomic::AtomicBool>,
    stat_down: Arc<std::sync::atomic::AtomicBool>,
}

fn link_down(p: &SourcePath) -> kaiso_store::migrate::SourceError {
    kaiso_store::migrate::SourceError::new(
        kaiso_store::migrate::SourceErrorKind::Unreachable,
        p,
        "link down (test)",
    )
}

impl Source for SlowLink {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn features(&self) -> kaiso_store::migrate::SourceFeatures {
        self.inner.features()
    }
    fn stat(&self, p: &SourcePath) -> SourceResult<SourceAttr> {
        let attr = self.inner.stat(p)?;
        if attr.kind == kaiso_store::migrate::FileKind::Regular
            && self.stat_down.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(link_down(p));
        }
        Ok(attr)
    }
    fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.inner.read_dir(p)
    }
    fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        std::thread::sleep(self.read_delay);
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(link_down(p));
        }
        self.inner.read(p, offset, len)
    }
    fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
        self.inner.read_link(p)
    }
    fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.inner.xattrs(p)
    }
    fn acl(&self, p: &SourcePath) -> SourceResult<kaiso_store::migrate::SourceAcl> {
        self.inner.acl(p)
    }
    fn streams(&self, p: &SourcePath) -> SourceResult<Vec<kaiso_store::migrate::SourceStream>> {
        self.inner.streams(p)
    }
    fn read_stream(
        &self,
        p: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.inner.read_stream(p, stream, offset, len)
    }
}

/// A wide directory of slow files next to a few small subtrees (the shape that made
/// `nfs_migration_from_ganesha` flaky): one worker lists `wide` and owns its files
/// while the others run out of directories. A round must not end while files handed out
/// in it are still being fetched; otherwise the idle workers close round after round
/// over the same in-flight files, see the counter not move, and call the crawl stuck.
fn wide_slow_tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = (0..24)
        .map(|i| (format!("wide/f{i:02}"), common::content(500 + i, 3000)))
        .collect();
    let mut dirs = vec!["wide".to_string()];
    for d in 0..4 {
        dirs.push(format!("small{d}"));
        files.push((format!("small{d}/x"), common::content(600 + d, 10)));
    }
    let dir_refs: Vec<&str> = dirs.iter().map(|s| s.as_str()).collect();
    let file_refs: Vec<(&str, Vec<u8>)> =
        files.iter().map(|(n, d)| (n.as_str(), d.clone())).collect();
    write_tree(root, &file_refs, &dir_refs);
    files
}

#[test]
fn parallel_crawl_over_slow_wide_directory_ends_done_not_stuck() {
    for (traversal, phasing) in [
        ("dfs", "bulk"),
        ("bfs", "metadata-first"),
        ("bfs", "metadata-priority"),
        ("bfs", "bulk"),
    ] {
        let src = tempfile::tempdir().unwrap();
        let files = wide_slow_tree(src.path());
        let dest = Dest::new();
        let store = dest.open();
        let mut cfg = MigrationConfig::new("slow");
        cfg.order = kaiso_policy::crawl::CrawlOrder::parse(traversal, phasing).unwrap();
        cfg.crawl_workers = 3;
        let source = SlowLink {
            inner: PosixSource::open(src.path()).unwrap(),
            read_delay: Duration::from_millis(25),
            down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            stat_down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        let m = attach(&store, Box::new(source), cfg);
        let crawler = Crawler::start(store.clone(), m.clone());
        let state = crawler.wait(Duration::from_secs(120));
        let rounds = crawler.rounds();
        drop(crawler);
        assert_eq!(
            state,
            CrawlState::Done,
            "{traversal}+{phasing}: {} stubs left after {rounds} rounds",
            m.remaining()
        );
        assert_eq!(m.remaining(), 0);
        assert_eq!(rounds, 1, "{traversal}+{phasing}: one round suffices");
        for (name, data) in &files {
            assert!(fs::read(dest.tier().join(name)).unwrap() == *data, "{name}");
        }
        store.shutdown();
    }
}

/// A source whose data cannot be read must still end the crawl `Stuck` (not spin, not
/// claim `Done`), with what failed reported; once the link is back a new crawl finishes.
#[test]
fn unreadable_source_ends_stuck_with_a_report_and_resumes_when_back() {
    use std::sync::atomic::Ordering::SeqCst;
    let src = tempfile::tempdir().unwrap();
    let files = wide_slow_tree(src.path());
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("down");
    cfg.crawl_workers = 3;
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let source = SlowLink {
        inner: PosixSource::open(src.path()).unwrap(),
        read_delay: Duration::from_millis(1),
        down: down.clone(),
        stat_down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
    };
    let m = attach(&store, Box::new(source), cfg);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Stuck);
    let failures = crawler.failures();
    drop(crawler);
    assert_eq!(m.remaining(), files.len() as u64, "every file still a stub");
    assert!(
        failures.len() >= files.len().min(kaiso_store::migrate::crawler::MAX_FAILURES),
        "the failed files are reported: {failures:?}"
    );
    assert!(
        failures.iter().all(|f| f.errno == libc::EIO),
        "{failures:?}"
    );
    down.store(false, SeqCst);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    assert!(crawler.failures().is_empty());
    drop(crawler);
    for (name, data) in &files {
        assert!(fs::read(dest.tier().join(name)).unwrap() == *data, "{name}");
    }
    store.shutdown();
}

/// The "did the source change under the copy?" check at a file's completion must not
/// take an unreachable source for a changed file: the file stays a stub (reported as
/// failing) instead of being skipped for good, and completes once the source is back.
/// (This link's reads return no attributes, so completion asks the source with `stat`.)
#[test]
fn unreachable_source_at_completion_keeps_the_stub_instead_of_skipping_it() {
    use std::sync::atomic::Ordering::SeqCst;
    let src = tempfile::tempdir().unwrap();
    let files = wide_slow_tree(src.path());
    let dest = Dest::new();
    let store = dest.open();
    let mut cfg = MigrationConfig::new("statdown");
    cfg.crawl_workers = 3;
    let stat_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let source = SlowLink {
        inner: PosixSource::open(src.path()).unwrap(),
        read_delay: Duration::from_millis(1),
        down: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        stat_down: stat_down.clone(),
    };
    let m = attach(&store, Box::new(source), cfg);
    stat_down.store(true, SeqCst);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Stuck);
    let failures = crawler.failures();
    drop(crawler);
    assert!(
        m.skipped().is_empty(),
        "nothing skipped as changed: {:?}",
        m.skipped()
    );
    assert_eq!(m.remaining(), files.len() as u64, "every file still a stub");
    assert!(!failures.is_empty(), "the failing files are reported");
    stat_down.store(false, SeqCst);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert!(m.skipped().is_empty(), "{:?}", m.skipped());
    for (name, data) in &files {
        assert!(fs::read(dest.tier().join(name)).unwrap() == *data, "{name}");
    }
    let report = kaiso_store::migrate::finish(&store, &m).expect("finish");
    assert!(report.mismatches.is_empty());
    store.shutdown();
}
