//! Engine tests over an in-memory source: crawler listings committed in the background
//! (never marked listed before their rows are durable; a client commits first), and the
//! hard-link anchor claim under a forced race of two listings.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::engine::mark_crawler_thread;
use super::source::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
use super::{CrawlState, Crawler, Migration, MigrationConfig, Migrations, hold_recount};
use crate::types::{Ino, ROOT_INO};
use crate::{Store, StoreConfig};

/// A read-only tree held in memory. Objects are keyed by path; a file's bytes by its
/// inode number (two paths with one inode are hard links).
struct MemSource {
    objects: HashMap<Vec<u8>, SourceAttr>,
    data: HashMap<u64, Vec<u8>>,
    unix_ids: bool,
    meet: Arc<MeetAt>,
}

/// The next `calls` calls of `features` meet (armed by a test).
#[derive(Default)]
struct MeetAt {
    calls: AtomicUsize,
    meeting: Meeting,
}

/// Two threads wait for each other (bounded: a thread that comes alone goes on after a
/// while, so a broken engine fails the test's assertions instead of hanging it).
#[derive(Default)]
struct Meeting {
    arrived: Mutex<usize>,
    all_here: Condvar,
}

impl Meeting {
    fn meet(&self, parties: usize) {
        let mut n = self.arrived.lock().unwrap();
        *n += 1;
        self.all_here.notify_all();
        let until = Instant::now() + Duration::from_secs(5);
        while *n < parties && Instant::now() < until {
            n = self
                .all_here
                .wait_timeout(n, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

fn attr(kind: FileKind, ino: u64, size: u64, nlink: u32) -> SourceAttr {
    let t = Timestamp {
        secs: 1_000_000_000,
        nanos: 0,
    };
    SourceAttr {
        nlink,
        ..SourceAttr::plain(kind, ino, size, t)
    }
}

/// The bytes of file `ino` (`len` of them).
fn content(ino: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + ino) as u8).collect()
}

impl MemSource {
    /// `dirs` and `files` (path, inode, size) below the root; a file's link count is the
    /// number of its paths when `unix_ids`, else 1 (as SMB listings say).
    fn new(dirs: &[&str], files: &[(&str, u64, usize)], unix_ids: bool) -> Self {
        let mut objects = HashMap::new();
        objects.insert(Vec::new(), attr(FileKind::Directory, 1, 0, 2));
        for (i, d) in dirs.iter().enumerate() {
            objects.insert(
                d.as_bytes().to_vec(),
                attr(FileKind::Directory, 100 + i as u64, 0, 2),
            );
        }
        let mut data = HashMap::new();
        for &(p, ino, len) in files {
            let links = files.iter().filter(|f| f.1 == ino).count() as u32;
            let nlink = if unix_ids { links } else { 1 };
            objects.insert(
                p.as_bytes().to_vec(),
                attr(FileKind::Regular, ino, len as u64, nlink),
            );
            data.insert(ino, content(ino, len));
        }
        Self {
            objects,
            data,
            unix_ids,
            meet: Arc::default(),
        }
    }

    fn get(&self, path: &SourcePath) -> SourceResult<&SourceAttr> {
        self.objects
            .get(path.as_bytes())
            .ok_or_else(|| SourceError::new(SourceErrorKind::NotFound, path, "no such object"))
    }
}

impl Source for MemSource {
    fn describe(&self) -> String {
        "memory".into()
    }

    fn features(&self) -> SourceFeatures {
        let armed = self
            .meet
            .calls
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        if armed {
            self.meet.meeting.meet(2);
        }
        SourceFeatures {
            unix_ids: self.unix_ids,
            symlinks: true,
            ..SourceFeatures::default()
        }
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.get(path).cloned()
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.get(path)?;
        let mut out: Vec<SourceEntry> = self
            .objects
            .iter()
            .filter_map(|(p, a)| {
                let p = SourcePath::parse(p).ok()?;
                (!p.is_root() && p.parent()? == *path).then(|| SourceEntry {
                    name: p.file_name().unwrap_or_default().to_vec(),
                    attr: a.clone(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        let a = self.get(path)?;
        let bytes = self.data.get(&a.ino).map(Vec::as_slice).unwrap_or_default();
        let from = (offset as usize).min(bytes.len());
        let to = from.saturating_add(len).min(bytes.len());
        Ok(bytes[from..to].to_vec())
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::WrongKind,
            path,
            "no symlinks here",
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

/// A fresh one-tier store with `source` attached as migration "t".
struct Setup {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    m: Arc<Migration>,
}

impl Setup {
    fn new(source: impl Source + 'static, workers: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t0")).unwrap();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.path().join("state").display(),
            dir.path().join("t0").display()
        );
        let store = Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap();
        let mut mc = MigrationConfig::new("t");
        mc.crawl_workers = workers;
        mc.unit_size = 64 << 10;
        let m = Migration::open(&store, Box::new(source), mc).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        Self {
            _dir: dir,
            store,
            m,
        }
    }

    fn lookup(&self, parent: Ino, name: &str) -> Ino {
        let a = self.store.lookup(parent, OsStr::new(name)).unwrap();
        self.store.forget(a.ino, 1);
        a.ino
    }

    fn resolve(&self, path: &str) -> Ino {
        path.split('/')
            .fold(ROOT_INO, |ino, name| self.lookup(ino, name))
    }

    fn read_all(&self, ino: Ino) -> Vec<u8> {
        let fh = self.store.open_file(ino, libc::O_RDONLY, false).unwrap().fh;
        let size = self.store.getattr(ino, None).unwrap().size;
        let data = self.store.read(fh, 0, size as u32).unwrap();
        self.store.release(fh).unwrap();
        data
    }

    /// Lists `dir` as a crawler worker does (on a crawler thread).
    fn list_as_crawler(&self, dir: Ino) {
        let store = self.store.clone();
        std::thread::spawn(move || {
            mark_crawler_thread();
            let fh = store.opendir(dir).unwrap();
            store.releasedir(fh).unwrap();
        })
        .join()
        .unwrap();
    }
}

#[test]
fn a_crawler_listing_is_marked_listed_only_once_durable_and_a_client_commits_it_first() {
    let s = Setup::new(MemSource::new(&["a", "a/b"], &[("a/f", 7, 1000)], true), 1);
    // What a running committer asks for, without the committer: nothing commits behind
    // the test's back.
    s.m.defer_listing_commits.store(true, Ordering::Release);
    s.list_as_crawler(ROOT_INO);
    let (committed, synced) = s.m.db.commit_marks();
    assert!(synced < committed, "the listing's rows are not durable yet");
    assert!(
        s.store.stub_state(ROOT_INO).unlisted_dir,
        "a listing whose rows are not durable is not marked listed"
    );
    assert_eq!(s.m.counters.dirs_listed.load(Ordering::Acquire), 0);

    // A client's lookup in it makes the rows durable, marks it listed and goes on.
    let a = s.lookup(ROOT_INO, "a");
    assert!(s.m.db.commit_marks().1 >= committed);
    assert!(!s.store.stub_state(ROOT_INO).unlisted_dir);
    assert_eq!(s.m.counters.dirs_listed.load(Ordering::Acquire), 1);
    assert!(s.m.db.get(ROOT_INO).unwrap().is_none(), "its row is gone");

    // A client's own listing is never deferred.
    let f = s.lookup(a, "f");
    assert!(!s.store.stub_state(a).unlisted_dir);
    assert_eq!(s.read_all(f), content(7, 1000));
    assert_eq!(s.m.remaining(), 1, "only a/b is left");
}

#[test]
fn a_crawl_of_a_deep_chain_commits_every_listing_in_the_background() {
    let depth = 30;
    let dirs: Vec<String> = (1..=depth)
        .map(|d| {
            (0..d)
                .map(|i| format!("d{i}"))
                .collect::<Vec<_>>()
                .join("/")
        })
        .collect();
    let files: Vec<(String, u64, usize)> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| (format!("{d}/f"), 1000 + i as u64, 3000 + i))
        .collect();
    let dir_refs: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let file_refs: Vec<(&str, u64, usize)> =
        files.iter().map(|(p, i, n)| (p.as_str(), *i, *n)).collect();
    let s = Setup::new(MemSource::new(&dir_refs, &file_refs, true), 4);
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    assert!(s.m.defer_listing_commits.load(Ordering::Acquire));
    drop(crawler);
    assert!(
        !s.m.defer_listing_commits.load(Ordering::Acquire),
        "listings commit inline again once the crawler is gone"
    );
    assert_eq!(s.m.remaining(), 0);
    assert_eq!(
        s.m.counters.dirs_listed.load(Ordering::Acquire),
        depth as u64 + 1
    );
    let (committed, synced) = s.m.db.commit_marks();
    assert!(committed > 0 && synced > 0);
    for (path, ino, len) in &files {
        let got = s.resolve(path);
        assert!(!s.store.stub_state(got).unlisted_dir);
        assert_eq!(s.read_all(got), content(*ino, *len), "{path}");
    }
}

#[test]
fn a_crawler_stopped_with_listings_deferred_commits_them_before_it_ends() {
    let s = Setup::new(
        MemSource::new(&["a", "b"], &[("a/f", 7, 10), ("b/g", 8, 10)], true),
        1,
    );
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    crawler.pause();
    // A listing on a crawler thread while the committer runs is deferred, then committed
    // in the background or, at the latest, when the crawler stops.
    s.list_as_crawler(ROOT_INO);
    drop(crawler);
    assert!(!s.store.stub_state(ROOT_INO).unlisted_dir);
    assert!(s.m.db.get(ROOT_INO).unwrap().is_none());
    let (committed, synced) = s.m.db.commit_marks();
    assert!(synced > 0 && synced <= committed);
}

/// Two workers list two directories of one link group at the same moment: the source
/// holds both right before the "is there an anchor?" check (its `features` call) until
/// the other arrives, so both look at once. They must agree on one anchor.
#[test]
fn two_listings_of_one_link_group_at_once_agree_on_one_anchor() {
    for round in 0..5 {
        // SMB-like: listings say one link, every file is anchored by its file id.
        let source = MemSource::new(
            &["d1", "d2"],
            &[("d1/f", 77, 5000), ("d2/f", 77, 5000)],
            false,
        );
        let meet = source.meet.clone();
        let s = Setup::new(source, 2);
        let (d1, d2) = (s.lookup(ROOT_INO, "d1"), s.lookup(ROOT_INO, "d2"));
        meet.calls.store(2, Ordering::Release);
        let listers: Vec<_> = [d1, d2]
            .into_iter()
            .map(|d| {
                let store = s.store.clone();
                std::thread::spawn(move || {
                    mark_crawler_thread();
                    let fh = store.opendir(d).unwrap();
                    store.releasedir(fh).unwrap();
                })
            })
            .collect();
        for l in listers {
            l.join().unwrap();
        }
        let (f1, f2) = (s.lookup(d1, "f"), s.lookup(d2, "f"));
        assert_eq!(f1, f2, "round {round}: one inode for both links");
        assert_eq!(s.store.getattr(f1, None).unwrap().nlink, 2, "round {round}");
        assert_eq!(s.read_all(f2), content(77, 5000));
    }
}

/// A crash between creating an entry and storing its row (or setting its times) leaves
/// an entry without a row in a directory that is still unlisted: listing it again makes
/// the entry a full stub again with the source's times.
/// What a crash in the middle of listing directory `a` can leave: entry `f` without its
/// row, `a` unlisted again with its row back.
fn lose_the_row_of(s: &Setup, a: crate::types::Ino, f: crate::types::Ino) {
    s.m.db.remove(f).unwrap();
    s.store
        .stub_mark(
            a,
            crate::stub::StubState {
                unlisted_dir: true,
                missing: Vec::new(),
                times: None,
            },
        )
        .unwrap();
    let dir_row = super::state::StubRow {
        ino: a,
        kind: super::state::StubKind::DummyDir,
        src_path: SourcePath::parse(b"a").unwrap(),
        src_ino: 100,
        minsize: 0,
        listed_size: 0,
        listed_mtime_ns: 0,
        ident: None,
    };
    s.m.db.insert(&[dir_row], &[]).unwrap();
}

#[test]
fn listing_again_after_a_crash_restubs_entries_without_rows_with_source_times() {
    let s = Setup::new(MemSource::new(&["a"], &[("a/f", 7, 3000)], true), 1);
    let a = s.lookup(ROOT_INO, "a");
    let f = s.lookup(a, "f");
    let row = s.m.db.get(f).unwrap().expect("a stub row for a/f");
    // What the crash left: the entry with the time of its creation and no row, its
    // directory unlisted with its row back.
    let set = crate::types::SetAttr {
        mtime: Some(crate::types::TimeSet::Now),
        ..Default::default()
    };
    s.store
        .setattr(f, &set, crate::types::Caller::ROOT)
        .unwrap();
    lose_the_row_of(&s, a, f);

    assert_eq!(s.lookup(a, "f"), f, "the entry is kept");
    assert_eq!(s.m.db.get(f).unwrap(), Some(row), "and is a stub again");
    let mtime = s.store.getattr(f, None).unwrap().mtime;
    assert_eq!(
        mtime,
        std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000),
        "with the source's mtime"
    );
    assert_eq!(s.read_all(f), content(7, 3000));
}

/// A crash between a stub file's creation and its `ftruncate` to the listed size leaves
/// a 0-byte file without a row: the next listing must make it a full stub at the listed
/// size (it used to stay a 0-byte file, and the crawl then found nothing to fetch).
#[test]
fn listing_again_after_a_crash_before_the_resize_gives_the_listed_size() {
    let s = Setup::new(MemSource::new(&["a"], &[("a/f", 7, 3000)], true), 1);
    let a = s.lookup(ROOT_INO, "a");
    let f = s.lookup(a, "f");
    let set = crate::types::SetAttr {
        size: Some(0),
        mtime: Some(crate::types::TimeSet::Now),
        ..Default::default()
    };
    s.store
        .stub_mark(f, crate::stub::StubState::default())
        .unwrap();
    s.store
        .setattr(f, &set, crate::types::Caller::ROOT)
        .unwrap();
    lose_the_row_of(&s, a, f);

    assert_eq!(s.lookup(a, "f"), f, "the entry is kept");
    assert_eq!(
        s.store.getattr(f, None).unwrap().size,
        3000,
        "at the listed size"
    );
    assert_eq!(s.read_all(f), content(7, 3000));
}

/// Power loss: a state sync (a WAL fsync or checkpoint of either database) makes stub
/// and completion rows durable, so the fetched bytes they vouch for must be durable
/// first. The store's fetch barrier counts its data syncs (`syncfs` of a tier holding
/// fetched bytes), its state syncs, and state syncs made while fetched bytes were not
/// known durable: those must never happen, on every path that syncs state.
#[test]
fn fetched_data_is_synced_before_every_state_sync_that_can_make_its_rows_durable() {
    let names: Vec<String> = (0..60).map(|i| format!("d/f{i}")).collect();
    let files: Vec<(&str, u64, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), 10 + i as u64, 20_000 + i))
        .collect();
    let s = Setup::new(MemSource::new(&["d"], &files, true), 2);
    let b = s.store.fetch_barrier();
    let counts = |b: &crate::stub::FetchBarrier| {
        let c = b.counts();
        (
            c.data_syncs.load(Ordering::Acquire),
            c.state_syncs.load(Ordering::Acquire),
            c.unordered_state_syncs.load(Ordering::Acquire),
        )
    };
    // Neither database checkpoints by itself (a checkpoint is a state sync too).
    let auto = |c: &rusqlite::Connection| -> i64 {
        c.pragma_query_value(None, "wal_autocheckpoint", |r| r.get(0))
            .unwrap()
    };
    assert_eq!(auto(&s.store.db().conn), 0);

    // A client's read fetches a file (its completion row is committed), then the
    // migration database syncs: the tier is synced first.
    let f0 = s.resolve("d/f0");
    assert_eq!(s.read_all(f0), content(10, 20_000));
    let (d0, st0, _) = counts(&b);
    s.m.db.sync().unwrap();
    let (d1, st1, bad) = counts(&b);
    assert!(d1 > d0, "a data sync before the state sync");
    assert!(st1 > st0);
    assert_eq!(bad, 0);

    // Nothing fetched since: a state sync costs no data sync.
    s.m.db.set_meta("probe", "1").unwrap();
    s.m.db.sync().unwrap();
    let (d2, st2, _) = counts(&b);
    assert_eq!(d2, d1, "no fetched bytes, no data sync");
    assert!(st2 > st1);

    // A client's fsync of a partly fetched file checkpoints the store database (every
    // file's rows): the other files' fetched bytes go first.
    let f1 = s.resolve("d/f1");
    let f2 = s.resolve("d/f2");
    assert_eq!(s.read_all(f1).len(), 20_001);
    let fh = s.store.open_file(f2, libc::O_RDWR, false).unwrap().fh;
    s.store.write(fh, 0, b"client").unwrap();
    let before = counts(&b);
    s.store.fsync(fh, false).unwrap();
    s.store.release(fh).unwrap();
    let after = counts(&b);
    assert!(after.0 > before.0 && after.1 > before.1);
    assert_eq!(after.2, 0);

    // A whole crawl (listings group-committed by the crawler's committer, completions,
    // the clean close): never a state sync ahead of fetched bytes.
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    s.m.close();
    let (d3, st3, bad) = counts(&b);
    assert!(d3 > d2 && st3 > st2);
    assert_eq!(bad, 0, "no state sync while fetched bytes were not durable");
    for (i, (path, ino, len)) in files.iter().enumerate() {
        if i != 2 {
            assert_eq!(s.read_all(s.resolve(path)), content(*ino, *len), "{path}");
        }
    }
}

/// Overwrites the fetched bytes of `name` (on tier `t0` of `s`) with zeros inside the
/// fetch that writes them, before the store restores the file's mtime and takes its
/// ctime: what a fetch whose bytes do not land (a lost write, bit rot) leaves, with no
/// client involved. Armed for the next fetch into that file only.
fn damage_next_fetch_into(s: &Setup, name: &str) {
    let backing = s._dir.path().join("t0").join(name);
    let armed = std::sync::atomic::AtomicBool::new(true);
    s.store.set_stub_write_hook(Some(Arc::new(move |_ino| {
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&backing)
            && armed.swap(false, Ordering::AcqRel)
        {
            use std::os::unix::fs::FileExt;
            let len = f.metadata().unwrap().len() as usize;
            f.write_all_at(&vec![0; len], 0).unwrap();
        }
    })));
}

/// A completed file's copy is damaged while nobody changed the file since (its bytes
/// went wrong inside the fetch that completed it, see `damage_next_fetch_into`): `finish`
/// finds the CRC differs while the ctime is the one recorded at completion, fetches it
/// again and verifies it, instead of failing for good.
#[test]
fn finish_fetches_again_a_completed_file_whose_bytes_were_lost() {
    let s = Setup::new(
        MemSource::new(&[], &[("a", 7, 150_000), ("b", 8, 3000)], true),
        1,
    );
    let a = s.resolve("a");
    // 150,000 bytes in 64 KiB units: the third fetch completes the file.
    let fh = s.store.open_file(a, libc::O_RDONLY, false).unwrap().fh;
    s.store.read(fh, 0, 100_000).unwrap();
    damage_next_fetch_into(&s, "a");
    s.store.read(fh, 140_000, 100).unwrap();
    s.store.release(fh).unwrap();
    s.store.set_stub_write_hook(None);
    assert!(s.store.stub_state(a).is_complete());
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_eq!(s.m.remaining(), 0);
    let backing = s._dir.path().join("t0/a");
    let mtime = std::fs::metadata(&backing).unwrap().modified().unwrap();
    assert_eq!(
        mtime,
        std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000),
        "the source's mtime"
    );
    assert_ne!(s.read_all(a), content(7, 150_000), "damaged");
    let report = super::finish(&s.store, &s.m).expect("finish repairs the file");
    assert_eq!(report.refetched, vec!["/a".to_string()]);
    assert!(report.mismatches.is_empty());
    assert_eq!((report.verified_files, report.modified_by_clients), (2, 0));
    assert_eq!(std::fs::read(&backing).unwrap(), content(7, 150_000));
    assert_eq!(
        std::fs::metadata(&backing).unwrap().modified().unwrap(),
        mtime,
        "the file keeps its times"
    );
}

/// Writes `data` into store file `ino` at 0 and puts its mtime back to `mtime`, as a
/// client's `cp -p`, `touch -r`, rsync or tar does.
fn rewrite_keeping_mtime(s: &Setup, ino: Ino, data: &[u8], mtime: std::time::SystemTime) {
    let fh = s.store.open_file(ino, libc::O_WRONLY, false).unwrap().fh;
    assert_eq!(s.store.write(fh, 0, data).unwrap() as usize, data.len());
    s.store.release(fh).unwrap();
    let set = crate::SetAttr {
        mtime: Some(crate::types::TimeSet::At(mtime)),
        ..crate::SetAttr::default()
    };
    s.store.setattr(ino, &set, crate::Caller::ROOT).unwrap();
}

/// A client rewrites files at the same size and puts their mtime back to the source's:
/// a completed file, a file still partial then (its other units fetched after), and a
/// dummy never read. `finish` keeps every byte the clients wrote and counts the three as
/// modified; only the untouched file is verified. (Before session 11 `finish` took the
/// completed file for a damaged copy and replaced the client's bytes with the source's.)
#[test]
fn finish_never_replaces_a_client_rewrite_that_kept_size_and_mtime() {
    let files = [
        ("done", 21, 3000),
        ("partial", 22, 200_000),
        ("dummy", 23, 3000),
        ("keep", 24, 3000),
    ];
    let s = Setup::new(MemSource::new(&[], &files, true), 1);
    let ino = |name: &str| s.lookup(ROOT_INO, name);
    let source_mtime = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let (done, partial, dummy) = (ino("done"), ino("partial"), ino("dummy"));
    assert_eq!(s.read_all(done), content(21, 3000));
    let client = |len: usize, seed: u8| -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
    };
    rewrite_keeping_mtime(&s, done, &client(3000, 0x5a), source_mtime);
    // Partial: the first unit written by the client, the rest fetched by the crawl.
    rewrite_keeping_mtime(&s, partial, &client(1000, 0x33), source_mtime);
    assert!(
        !s.store.stub_state(partial).missing.is_empty(),
        "still partial"
    );
    rewrite_keeping_mtime(&s, dummy, &client(3000, 0x11), source_mtime);
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    for i in [done, partial, dummy] {
        let a = s.store.getattr(i, None).unwrap();
        assert_eq!(a.mtime, source_mtime, "the client put the mtime back");
    }
    let report = super::finish(&s.store, &s.m).expect("finish");
    assert!(report.mismatches.is_empty(), "{:?}", report.mismatches);
    assert!(
        report.refetched.is_empty(),
        "refetched {:?}",
        report.refetched
    );
    assert_eq!(
        (report.modified_by_clients, report.verified_files),
        (3, 1),
        "{report:?}"
    );
    assert_eq!(s.read_all(done), client(3000, 0x5a), "the client's bytes");
    assert_eq!(s.read_all(dummy), client(3000, 0x11), "the client's bytes");
    let mut want = content(22, 200_000);
    want[..1000].copy_from_slice(&client(1000, 0x33));
    assert_eq!(
        s.read_all(partial),
        want,
        "the client's bytes, then the source's"
    );
    assert_eq!(s.read_all(ino("keep")), content(24, 3000));
}

/// A completed copy whose ctime moved for another reason than a client's write — the
/// tier mover copied it to another tier — is verified when its bytes equal the source's,
/// and, when they differ, kept and counted as modified, never fetched again.
#[test]
fn finish_verifies_a_moved_copy_and_never_fetches_it_again() {
    let dir = tempfile::tempdir().unwrap();
    for t in ["t0", "t1"] {
        std::fs::create_dir(dir.path().join(t)).unwrap();
    }
    let tier = |name: &str| {
        format!(
            "[[tier]]\nname = \"{name}\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.path().join(name).display()
        )
    };
    let cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n{}{}",
        dir.path().join("state").display(),
        tier("t0"),
        tier("t1")
    );
    let store = Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap();
    let mut mc = MigrationConfig::new("t");
    mc.unit_size = 64 << 10;
    let source = MemSource::new(&[], &[("same", 31, 5000), ("other", 32, 5000)], true);
    let m = Migration::open(&store, Box::new(source), mc).unwrap();
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    let ino = |name: &str| {
        let a = store.lookup(ROOT_INO, OsStr::new(name)).unwrap();
        store.forget(a.ino, 1);
        a.ino
    };
    let (same, other) = (ino("same"), ino("other"));
    // `other`'s bytes go wrong behind the store's back (its ctime moves with them), then
    // both move to the slow tier (a new file there: another ctime).
    {
        use std::os::unix::fs::FileExt;
        let p = dir.path().join("t0/other");
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[0xee; 100], 0).unwrap();
        f.set_modified(mtime).unwrap();
    }
    for i in [same, other] {
        store.move_file(i, 1, "test", 0).expect("moved to t1");
    }
    assert!(dir.path().join("t1/same").exists() && !dir.path().join("t0/same").exists());
    let report = super::finish(&store, &m).expect("finish");
    assert!(report.mismatches.is_empty(), "{:?}", report.mismatches);
    assert!(
        report.refetched.is_empty(),
        "refetched {:?}",
        report.refetched
    );
    assert_eq!(
        (report.verified_files, report.modified_by_clients),
        (1, 1),
        "{report:?}"
    );
    let fh = store.open_file(other, libc::O_RDONLY, false).unwrap().fh;
    assert_eq!(store.read(fh, 0, 100).unwrap(), vec![0xee; 100], "kept");
    store.release(fh).unwrap();
}

/// All-zero 4 KiB blocks of a fetched range stay holes: a sparse source file stays
/// sparse (at most one extra block per run of data), and reads back exactly.
#[test]
fn fetch_leaves_all_zero_blocks_as_holes() {
    let size = 3 << 20;
    let mut bytes = vec![0u8; size];
    // Runs of data: an unaligned head, one in the middle across a unit boundary, a tail.
    let runs = [
        (0usize, 5000usize),
        (64 << 10 | 100, 9000),
        (size - 3000, 3000),
    ];
    for &(at, len) in &runs {
        for (i, b) in bytes[at..at + len].iter_mut().enumerate() {
            *b = (i % 250 + 1) as u8;
        }
    }
    let mut source = MemSource::new(&[], &[("sparse.img", 9, size)], true);
    source.data.insert(9, bytes.clone());
    let s = Setup::new(source, 1);
    let f = s.resolve("sparse.img");
    assert_eq!(s.read_all(f), bytes);
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(s._dir.path().join("t0/sparse.img")).unwrap();
    assert_eq!(meta.len(), size as u64);
    let data: u64 = runs.iter().map(|r| r.1 as u64).sum();
    let allowed = data.div_ceil(512) + runs.len() as u64 * 2 * 8;
    assert!(
        meta.blocks() <= allowed,
        "{} blocks of 512 bytes allocated, {allowed} allowed",
        meta.blocks()
    );
}

/// After an unclean stop the recount of every stub row runs in the background: `open`
/// returns while it is held back, the share serves meanwhile, `remaining_now` says it is
/// recounting, and `remaining` waits for it and gets the right count (a row whose file
/// the store already holds complete was completed by it).
#[test]
fn after_an_unclean_stop_the_share_serves_while_its_counter_is_recounted() {
    let names: Vec<String> = (0..40).map(|i| format!("d/f{i}")).collect();
    let files: Vec<(&str, u64, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), 10 + i as u64, 5000))
        .collect();
    let source = || MemSource::new(&["d"], &files, true);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("t0")).unwrap();
    let cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
        dir.path().join("state").display(),
        dir.path().join("t0").display()
    );
    let open_store = || Store::open(StoreConfig::from_toml_str(&cfg, "t.toml").unwrap()).unwrap();
    let name = "recount-in-background";
    let mut mc = MigrationConfig::new(name);
    mc.unit_size = 64 << 10;
    let before;
    {
        let store = open_store();
        let m = Migration::open(&store, Box::new(source()), mc.clone()).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        let d = store.lookup(ROOT_INO, OsStr::new("d")).unwrap().ino;
        let f0 = store.lookup(d, OsStr::new("f0")).unwrap().ino;
        let fh = store.open_file(f0, libc::O_RDONLY, false).unwrap().fh;
        assert_eq!(store.read(fh, 0, 5000).unwrap(), content(10, 5000));
        store.release(fh).unwrap();
        // A file whose data the store holds complete while its row is left: what a
        // crash between the store's row and the completion leaves.
        let f1 = store.lookup(d, OsStr::new("f1")).unwrap().ino;
        m.db.set_kind(f1, super::state::StubKind::PartialFile)
            .unwrap();
        store
            .stub_mark(f1, crate::stub::StubState::default())
            .unwrap();
        before = m.remaining();
        assert_eq!(before, 39);
        // Dropped without `close`: an unclean stop.
    }
    let store = open_store();
    hold_recount(name, true);
    let opened = Instant::now();
    let m = Migration::open(&store, Box::new(source()), mc).unwrap();
    assert!(
        opened.elapsed() < Duration::from_secs(5),
        "open did not wait"
    );
    assert!(m.recounted_at_open());
    assert!(m.recounting());
    assert_eq!(m.remaining_now(), None);
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    let d = store.lookup(ROOT_INO, OsStr::new("d")).unwrap().ino;
    let f5 = store.lookup(d, OsStr::new("f5")).unwrap().ino;
    let fh = store.open_file(f5, libc::O_RDONLY, false).unwrap().fh;
    assert_eq!(
        store.read(fh, 0, 5000).unwrap(),
        content(15, 5000),
        "serves"
    );
    store.release(fh).unwrap();
    assert!(m.recounting(), "still held");
    hold_recount(name, false);
    // f1 completed by the recount, f5 by its read.
    assert_eq!(m.remaining(), before - 2);
    assert!(!m.recounting());
    assert_eq!(m.remaining_now(), Some(before - 2));
    m.close();
    assert_eq!(m.db.meta("clean").unwrap().as_deref(), Some("1"));
}

/// `finish` counts every file a client deleted or modified during the migration, whatever
/// its copy state then: deleted after its copy completed, deleted while still a dummy
/// (never read) or a partial file, overwritten (truncated and written) while a dummy,
/// written into while partial, written after its copy completed. Only the untouched file
/// is verified.
#[test]
fn finish_counts_client_deletes_and_writes_whatever_the_copy_state() {
    let files = [
        ("done_del", 11, 3000),
        ("dummy_del", 12, 3000),
        ("partial_del", 13, 200_000),
        ("dummy_over", 14, 3000),
        ("partial_write", 15, 200_000),
        ("done_write", 16, 3000),
        ("keep", 17, 3000),
    ];
    let s = Setup::new(MemSource::new(&[], &files, true), 1);
    let ino = |name: &str| s.lookup(ROOT_INO, name);
    let write = |ino: Ino, flags: i32, at: u64, data: &[u8]| {
        let fh = s.store.open_file(ino, flags, false).unwrap().fh;
        assert_eq!(s.store.write(fh, at, data).unwrap() as usize, data.len());
        s.store.release(fh).unwrap();
    };
    let (done_del, done_write) = (ino("done_del"), ino("done_write"));
    assert_eq!(s.read_all(done_del), content(11, 3000));
    assert_eq!(s.read_all(done_write), content(16, 3000));
    // One 64 KiB unit of each partial file fetched: the rest still missing.
    for name in ["partial_del", "partial_write"] {
        let i = ino(name);
        let fh = s.store.open_file(i, libc::O_RDONLY, false).unwrap().fh;
        s.store.read(fh, 0, 100).unwrap();
        s.store.release(fh).unwrap();
        assert!(
            !s.store.stub_state(i).missing.is_empty(),
            "{name} is still partial"
        );
    }
    for name in ["done_del", "dummy_del", "partial_del"] {
        s.store.unlink(ROOT_INO, OsStr::new(name)).unwrap();
    }
    write(
        ino("dummy_over"),
        libc::O_WRONLY | libc::O_TRUNC,
        0,
        b"the client's",
    );
    write(ino("partial_write"), libc::O_WRONLY, 150_000, b"client");
    write(done_write, libc::O_WRONLY, 10, b"client");
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    let report = super::finish(&s.store, &s.m).expect("finish");
    assert!(report.mismatches.is_empty(), "{:?}", report.mismatches);
    assert_eq!(
        (
            report.deleted_by_clients,
            report.modified_by_clients,
            report.verified_files
        ),
        (3, 3, 1),
        "deleted: done_del, dummy_del, partial_del; modified: dummy_over, partial_write, \
         done_write; verified: keep ({report:?})"
    );
}

/// What [`SlowListings`] saw.
#[derive(Default)]
struct ListingStats {
    client_in_flight: AtomicUsize,
    client_listings: AtomicUsize,
    started_during_client: AtomicUsize,
    started_by_others: AtomicUsize,
}

/// A source whose listings and xattr lists take time and that records, for every such
/// call a client thread (named `client`) makes, how many other threads (crawler workers,
/// read-ahead) started while it was in flight.
struct SlowListings {
    inner: MemSource,
    crawler_delay: Duration,
    client_delay: Duration,
    stats: Arc<ListingStats>,
}

impl Source for SlowListings {
    fn describe(&self) -> String {
        "slow listings".into()
    }
    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            xattrs: true,
            ..self.inner.features()
        }
    }
    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.inner.stat(path)
    }
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.slow_call();
        self.inner.read_dir(path)
    }
    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.inner.read(path, offset, len)
    }
    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        self.inner.read_link(path)
    }
    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.slow_call();
        self.inner.xattrs(path)
    }
    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.inner.acl(path)
    }
    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.inner.streams(path)
    }
    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.inner.read_stream(path, stream, offset, len)
    }
}

impl SlowListings {
    fn slow_call(&self) {
        let st = &self.stats;
        if std::thread::current().name() == Some("client") {
            st.client_in_flight.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(self.client_delay);
            st.client_listings.fetch_add(1, Ordering::SeqCst);
            st.client_in_flight.fetch_sub(1, Ordering::SeqCst);
        } else {
            st.started_by_others.fetch_add(1, Ordering::SeqCst);
            if st.client_in_flight.load(Ordering::SeqCst) > 0 {
                st.started_during_client.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(self.crawler_delay);
        }
    }
}

/// Demand priority for listings: while 8 crawler workers list a wide tree (each listing
/// 5 ms), a client lists three directories the crawl has not reached (each 150 ms, and
/// as long for each directory's own xattrs).
/// While a client's listing is in flight the crawl starts no listing of its own, except
/// those already past their check when the client's began (at most one per worker) and
/// read-ahead already under way (at most 8); before session 11 it went on listing,
/// about one per worker every 5 ms (some 240 during each client listing).
#[test]
fn client_listings_go_before_the_crawlers_listings() {
    let names: Vec<String> = (0..1200)
        .map(|i| format!("d{i:04}"))
        .chain((0..3).map(|i| format!("zz{i}")))
        .collect();
    let dirs: Vec<&str> = names.iter().map(String::as_str).collect();
    let stats = Arc::new(ListingStats::default());
    let source = SlowListings {
        inner: MemSource::new(&dirs, &[], true),
        crawler_delay: Duration::from_millis(5),
        client_delay: Duration::from_millis(150),
        stats: stats.clone(),
    };
    let s = Setup::new(source, 8);
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    // The crawl is under way (the root listed, its subdirectories being listed).
    let until = Instant::now() + Duration::from_secs(30);
    while s.m.counters.dirs_listed.load(Ordering::Acquire) < 20 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let store = s.store.clone();
    let client = std::thread::Builder::new()
        .name("client".into())
        .spawn(move || {
            // The `zz*` directories sort last: the crawl reaches them last.
            for i in 0..3 {
                let d = store
                    .lookup(ROOT_INO, OsStr::new(&format!("zz{i}")))
                    .unwrap()
                    .ino;
                let fh = store.opendir(d).unwrap();
                store.releasedir(fh).unwrap();
                store.forget(d, 1);
            }
        })
        .unwrap();
    client.join().unwrap();
    let crawl_running = s.m.counters.dirs_listed.load(Ordering::Acquire) < 1200;
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    let client_listings = stats.client_listings.load(Ordering::SeqCst);
    let during = stats.started_during_client.load(Ordering::SeqCst);
    let others = stats.started_by_others.load(Ordering::SeqCst);
    eprintln!(
        "{client_listings} client listings; {during} of {others} crawler listings started during them"
    );
    assert!(
        client_listings >= 3 && crawl_running,
        "the client's listings must reach the source while the crawl runs: {client_listings} did, crawl running {crawl_running}"
    );
    assert!(
        during <= 16 * client_listings,
        "{during} crawler listings started during {client_listings} client listings: the crawl did not yield"
    );
}

/// Demand priority for metadata: while 8 crawler workers copy the metadata of 1,200 files
/// (each xattr list 5 ms), a client reads the xattrs of three files the crawl has not
/// reached (each list 150 ms). While a client's call is in flight the crawl starts no
/// call of its own, except those already past their check (at most one per worker);
/// before session 11 it went on (about one per worker every 5 ms).
#[test]
fn client_metadata_fetches_go_before_the_crawlers() {
    let names: Vec<String> = (0..1200)
        .map(|i| format!("f{i:04}"))
        .chain((0..3).map(|i| format!("zz{i}")))
        .collect();
    let files: Vec<(&str, u64, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), 1000 + i as u64, 10))
        .collect();
    let stats = Arc::new(ListingStats::default());
    let source = SlowListings {
        inner: MemSource::new(&[], &files, true),
        crawler_delay: Duration::from_millis(5),
        client_delay: Duration::from_millis(150),
        stats: stats.clone(),
    };
    let s = Setup::new(source, 8);
    // The root listed before the crawl, so the crawl's calls are metadata only.
    let _ = s.lookup(ROOT_INO, "zz0");
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    let until = Instant::now() + Duration::from_secs(30);
    while stats.started_by_others.load(Ordering::SeqCst) < 20 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let store = s.store.clone();
    let client = std::thread::Builder::new()
        .name("client".into())
        .spawn(move || {
            for i in 0..3 {
                let f = store
                    .lookup(ROOT_INO, OsStr::new(&format!("zz{i}")))
                    .unwrap()
                    .ino;
                store.listxattr(f).unwrap();
                store.forget(f, 1);
            }
        })
        .unwrap();
    client.join().unwrap();
    let crawl_running = stats.started_by_others.load(Ordering::SeqCst) < 1200;
    assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
    drop(crawler);
    let client_calls = stats.client_listings.load(Ordering::SeqCst);
    let during = stats.started_during_client.load(Ordering::SeqCst);
    let others = stats.started_by_others.load(Ordering::SeqCst);
    eprintln!(
        "{client_calls} client xattr lists; {during} of {others} crawler calls started during them"
    );
    assert!(
        client_calls == 3 && crawl_running,
        "the client's calls must reach the source while the crawl runs: {client_calls} did, crawl running {crawl_running}"
    );
    assert!(
        during <= 8 * client_calls,
        "{during} crawler calls started during {client_calls} client calls: the crawl did not yield"
    );
}

/// The state directory stays small whatever the disk's speed: a crawl of 8,000 files of
/// 100 bytes (20 directories) with every `syncfs` slowed by 300 ms (a loaded CI disk;
/// each group commit and store checkpoint waits for one) keeps `migrate.db-wal` and
/// `kaiso.db-wal` each under 8 MiB, sampled all along (they grew to 25 and 22 MB on a
/// loaded machine, and filled a 64 MiB state directory on CI). Prints the WAL bytes each
/// database appended per file.
#[test]
fn the_wals_stay_bounded_during_a_crawl_of_many_small_files_on_a_slow_disk() {
    const BOUND: u64 = 8 << 20;
    let dirs: Vec<String> = (0..20).map(|d| format!("d{d}")).collect();
    let names: Vec<String> = (0..8000)
        .map(|i| format!("d{}/file-{i:05}", i % 20))
        .collect();
    let files: Vec<(&str, u64, usize)> = names
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), 100 + i as u64, 100))
        .collect();
    let dir_refs: Vec<&str> = dirs.iter().map(String::as_str).collect();
    let s = Setup::new(MemSource::new(&dir_refs, &files, true), 8);
    let b = s.store.fetch_barrier();
    b.slow_syncfs_ms.store(300, Ordering::Relaxed);
    let state = s._dir.path().join("state");
    let wals = [
        state.join("migrate").join("t").join("migrate.db-wal"),
        state.join("kaiso.db-wal"),
    ];
    assert!(
        wals[0].parent().unwrap().join("migrate.db").exists(),
        "the migration database is at {}",
        wals[0].display()
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        let wals = wals.clone();
        std::thread::spawn(move || {
            let mut peak = [0u64; 2];
            while !stop.load(Ordering::Acquire) {
                for (p, w) in peak.iter_mut().zip(&wals) {
                    *p = (*p).max(std::fs::metadata(w).map_or(0, |m| m.len()));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            peak
        })
    };
    let (m0, k0) = (
        s.m.db.wal_bytes_written(),
        crate::db::wal_bytes_written(&s.store.db().conn),
    );
    let t = Instant::now();
    let crawler = Crawler::start(s.store.clone(), s.m.clone());
    let end = crawler.wait(Duration::from_secs(300));
    let took = t.elapsed();
    drop(crawler);
    stop.store(true, Ordering::Release);
    let peak = sampler.join().unwrap();
    let (m1, k1) = (
        s.m.db.wal_bytes_written(),
        crate::db::wal_bytes_written(&s.store.db().conn),
    );
    let syncs = b.sync_log().len();
    eprintln!(
        "crawl of {} files: {took:?}, {syncs} barrier syncs, {} migration commits; WAL bytes per file: migrate.db {}, \
         kaiso.db {}; peak WAL sizes: migrate.db-wal {} B, kaiso.db-wal {} B",
        files.len(),
        s.m.db.commit_marks().0,
        (m1 - m0) / files.len() as u64,
        (k1 - k0) / files.len() as u64,
        peak[0],
        peak[1]
    );
    assert_eq!(end, CrawlState::Done);
    assert_eq!(s.m.db.remaining().unwrap(), 0);
    assert!(
        peak[0] <= BOUND && peak[1] <= BOUND,
        "each WAL must stay under {BOUND} B during the crawl, whatever the disk's speed; \
         peaks: migrate.db-wal {} B, kaiso.db-wal {} B",
        peak[0],
        peak[1]
    );
    s.m.close();
    for (path, ino, len) in files.iter().step_by(797) {
        assert_eq!(s.read_all(s.resolve(path)), content(*ino, *len), "{path}");
    }
}

// ---------------------------------------------------------------------------------------
// Metadata reads that find the source unreachable are retried, never skipped (issue 4).
// ---------------------------------------------------------------------------------------

/// A [`MemSource`] with xattrs and symlinks whose metadata reads (xattrs, symlink
/// targets) fail as unreachable for the paths in `down` and as permission denied for
/// those in `denied`, as a test switches them. Every object has one xattr, `name` (see
/// [`meta_xattr_name`]), whose value is `tag` followed by its path.
struct FlakyMeta {
    inner: MemSource,
    name: &'static str,
    links: HashMap<Vec<u8>, Vec<u8>>,
    down: Arc<Mutex<Vec<&'static str>>>,
    denied: Vec<&'static str>,
    tag: Arc<Mutex<Vec<u8>>>,
}

/// Switches of a [`FlakyMeta`], kept by the test.
#[derive(Clone)]
struct MetaSwitch {
    down: Arc<Mutex<Vec<&'static str>>>,
    tag: Arc<Mutex<Vec<u8>>>,
}

impl MetaSwitch {
    fn set_down(&self, paths: &[&'static str]) {
        *self.down.lock().unwrap() = paths.to_vec();
    }
    fn set_tag(&self, tag: &[u8]) {
        *self.tag.lock().unwrap() = tag.to_vec();
    }
    fn value(&self, path: &str) -> Vec<u8> {
        let mut v = self.tag.lock().unwrap().clone();
        v.extend_from_slice(path.as_bytes());
        v
    }
}

/// `user.kaiso_test`, or `trusted.kaiso_test` where the destination's file system takes
/// no user xattrs (tmpfs before Linux 6.6): probed in `dir`.
fn meta_xattr_name(dir: &std::path::Path) -> &'static str {
    let probe = dir.join("xattr-probe");
    std::fs::write(&probe, b"").unwrap();
    let user = crate::util::lsetxattr(&probe, OsStr::new("user.kaiso_probe"), b"1", 0).is_ok();
    std::fs::remove_file(&probe).unwrap();
    if user {
        "user.kaiso_test"
    } else {
        "trusted.kaiso_test"
    }
}

impl FlakyMeta {
    /// `links`: (path, target) symlinks added to `inner`.
    fn new(
        mut inner: MemSource,
        links: &[(&str, &str)],
        denied: &[&'static str],
        name: &'static str,
    ) -> (Self, MetaSwitch) {
        let mut targets = HashMap::new();
        for (i, (p, t)) in links.iter().enumerate() {
            inner.objects.insert(
                p.as_bytes().to_vec(),
                attr(FileKind::Symlink, 500 + i as u64, t.len() as u64, 1),
            );
            targets.insert(p.as_bytes().to_vec(), t.as_bytes().to_vec());
        }
        let switch = MetaSwitch {
            down: Arc::default(),
            tag: Arc::new(Mutex::new(b"v1:".to_vec())),
        };
        let s = Self {
            inner,
            name,
            links: targets,
            down: switch.down.clone(),
            denied: denied.to_vec(),
            tag: switch.tag.clone(),
        };
        (s, switch)
    }

    /// The path as the tests name it ("" for the root).
    fn rel(path: &SourcePath) -> String {
        String::from_utf8_lossy(path.as_bytes())
            .trim_start_matches('/')
            .to_string()
    }

    fn check(&self, path: &SourcePath) -> SourceResult<()> {
        let rel = Self::rel(path);
        if self.down.lock().unwrap().iter().any(|d| *d == rel) {
            return Err(SourceError::new(
                SourceErrorKind::Unreachable,
                path,
                "server not responding (test)",
            ));
        }
        Ok(())
    }
}

impl Source for FlakyMeta {
    fn describe(&self) -> String {
        "flaky metadata".into()
    }
    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            xattrs: true,
            ..self.inner.features()
        }
    }
    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.inner.stat(path)
    }
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.inner.read_dir(path)
    }
    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.inner.read(path, offset, len)
    }
    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        self.check(path)?;
        match self.links.get(path.as_bytes()) {
            Some(t) => Ok(t.clone()),
            None => self.inner.read_link(path),
        }
    }
    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.check(path)?;
        let rel = Self::rel(path);
        if self.denied.iter().any(|d| *d == rel) {
            return Err(SourceError::new(
                SourceErrorKind::PermissionDenied,
                path,
                "permission denied (test)",
            ));
        }
        if self.links.contains_key(path.as_bytes()) {
            return Ok(Vec::new()); // no user xattrs on symlinks
        }
        let mut v = self.tag.lock().unwrap().clone();
        v.extend_from_slice(rel.as_bytes());
        Ok(vec![(self.name.as_bytes().to_vec(), v)])
    }
    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.inner.acl(path)
    }
    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.inner.streams(path)
    }
    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.inner.read_stream(path, stream, offset, len)
    }
}

/// A store in `dir` (tier `t0`, state `state`) opened again and again over one share.
struct Reopen {
    dir: tempfile::TempDir,
    cfg: String,
}

impl Reopen {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t0")).unwrap();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.path().join("state").display(),
            dir.path().join("t0").display()
        );
        Self { dir, cfg }
    }

    fn name(&self) -> &'static str {
        meta_xattr_name(&self.dir.path().join("t0"))
    }

    /// The store and share "t" over `source`, registered as the store's filler.
    fn open(&self, source: impl Source + 'static) -> (Arc<Store>, Arc<Migration>) {
        let store = Store::open(StoreConfig::from_toml_str(&self.cfg, "t.toml").unwrap()).unwrap();
        let mut mc = MigrationConfig::new("t");
        mc.crawl_workers = 2;
        mc.unit_size = 64 << 10;
        let m = Migration::open(&store, Box::new(source), mc).expect("open the share");
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        (store, m)
    }
}

fn lookup_in(store: &Store, parent: Ino, name: &str) -> crate::FsResult<Ino> {
    let a = store.lookup(parent, OsStr::new(name))?;
    store.forget(a.ino, 1);
    Ok(a.ino)
}

fn xattr_of(store: &Store, ino: Ino, name: &str) -> crate::FsResult<Vec<u8>> {
    store.getxattr(ino, OsStr::new(name))
}

/// Nothing in the skip report (a transient failure must not go there).
fn assert_nothing_skipped(m: &Migration, when: &str) {
    let skipped = m.skipped();
    assert!(
        skipped.is_empty(),
        "{when}: expected an empty skip report (an unreachable source is retried, not \
         skipped), got {skipped:?}"
    );
}

fn finish_strict(store: &Store, m: &Migration) -> Result<super::FinishReport, String> {
    super::finish_with(
        store,
        m,
        super::FinishOptions {
            accept_skipped: false,
        },
    )
}

/// A directory's listing succeeds but its own xattrs find the source unreachable: the
/// lookup below it fails (EIO), the directory stays unlisted with its row (status: a
/// pending directory), nothing is skipped. Once the source answers, the next lookup
/// lists it again and copies its xattr; the crawl ends done and `finish` succeeds
/// without accepting skips. (Before: "xattrs: server not responding" in the skip
/// report, the directory listed without its xattr, `finish` refusing.)
#[test]
fn a_directorys_metadata_read_from_an_unreachable_source_is_retried_not_skipped() {
    let r = Reopen::new();
    let name = r.name();
    let (source, switch) = FlakyMeta::new(
        MemSource::new(&["d"], &[("d/f", 10, 3000)], true),
        &[],
        &[],
        name,
    );
    let (store, m) = r.open(source);
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    switch.set_down(&["d"]);
    let e = lookup_in(&store, d, "f")
        .expect_err("a lookup in a directory whose metadata the source cannot give now");
    assert_eq!(
        e.errno(),
        libc::EIO,
        "expected EIO, got errno {}",
        e.errno()
    );
    assert_nothing_skipped(&m, "after the failed metadata read");
    assert!(
        store.stub_state(d).unlisted_dir,
        "the directory must stay unlisted (its metadata still to do)"
    );
    let p = m.progress(&store).unwrap();
    assert_eq!(
        (p.dirs_pending, p.file_stubs),
        (1, 1),
        "status: d pending (and d/f, created by the interrupted listing): {p:?}"
    );
    switch.set_down(&[]);
    let f = lookup_in(&store, d, "f").expect("the lookup once the source answers");
    assert_eq!(xattr_of(&store, d, name).unwrap(), switch.value("d"));
    assert_eq!(xattr_of(&store, f, name).unwrap(), switch.value("d/f"));
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_nothing_skipped(&m, "after the crawl");
    finish_strict(&store, &m).expect("finish without accepting skips");
}

/// A symlink's target and a file's xattrs read while the source is unreachable: the
/// symlink's directory stays unlisted (its listing stops there), the file stays a dummy
/// whose reads and xattr calls fail with EIO; nothing is skipped. A permanent refusal
/// (permission denied) of another file's xattrs is still reported and does not stop it.
/// Across an unclean stop (the state as a kill -9 leaves it) the dummy stays a dummy;
/// once the source answers, a client read copies its xattr and data, and an empty file's
/// pending metadata is copied by `finish` itself (no crawl ran): `finish` then refuses
/// only over the refused file, which is the only entry of its report.
#[test]
fn file_and_symlink_metadata_from_an_unreachable_source_is_retried_across_a_restart() {
    let r = Reopen::new();
    let name = r.name();
    let source = || {
        FlakyMeta::new(
            MemSource::new(
                &["d"],
                &[
                    ("d/f", 10, 3000),
                    ("d/g", 11, 2000),
                    ("e", 12, 0),
                    ("h", 13, 100),
                ],
                true,
            ),
            &[("d/l", "f")],
            &["h"],
            name,
        )
    };
    let ((store, m), switch) = {
        let (s, switch) = source();
        (r.open(s), switch)
    };
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    let e = lookup_in(&store, ROOT_INO, "e").unwrap();
    let h = lookup_in(&store, ROOT_INO, "h").unwrap();
    // h: refused for good, reported, its data still read.
    assert!(matches!(xattr_of(&store, h, name), Err(x) if x.errno() == libc::ENODATA));
    let fh = store.open_file(h, libc::O_RDONLY, false).unwrap().fh;
    assert_eq!(store.read(fh, 0, 100).unwrap(), content(13, 100));
    store.release(fh).unwrap();
    let skipped = m.skipped();
    assert!(
        skipped.len() == 1 && skipped[0].kind == "PermissionDenied",
        "expected only h's refused xattrs in the skip report, got {skipped:?}"
    );
    // The symlink's target: the listing of d stops, d stays unlisted.
    switch.set_down(&["d/l", "e"]);
    let x = lookup_in(&store, d, "l").expect_err("a lookup in d while d/l cannot be read");
    assert_eq!(x.errno(), libc::EIO);
    assert!(store.stub_state(d).unlisted_dir);
    // The empty file's xattrs.
    let x = xattr_of(&store, e, name).expect_err("xattrs of e while the source cannot give them");
    assert_eq!(
        x.errno(),
        libc::EIO,
        "expected EIO, got errno {}",
        x.errno()
    );
    assert_eq!(skipped, m.skipped(), "nothing more skipped");
    drop(m);
    drop(store); // unclean: no `close`
    // Still down after the restart: nothing changed, nothing skipped.
    let ((store, m), switch) = {
        let (s, sw) = source();
        sw.set_down(&["d/l", "e"]);
        (r.open(s), sw)
    };
    let row =
        m.db.get(e)
            .unwrap()
            .expect("e keeps its stub row across the restart");
    assert_eq!(row.kind, super::state::StubKind::DummyFile);
    assert_eq!(
        xattr_of(&store, e, name).map_err(|x| x.errno()),
        Err(libc::EIO)
    );
    assert_eq!(
        skipped,
        m.skipped(),
        "nothing more skipped after the restart"
    );
    let p = m.progress(&store).unwrap();
    assert!(
        p.file_stubs >= 1 && p.dirs_pending == 1,
        "status: e and d pending: {p:?}"
    );
    // The source answers: d is listed with its symlink, d/f read by a client.
    switch.set_down(&[]);
    let l = lookup_in(&store, d, "l").expect("d/l once the source answers");
    assert_eq!(store.readlink(l).unwrap(), OsStr::new("f"));
    for (f, ino, len) in [("f", 10, 3000), ("g", 11, 2000)] {
        let f = lookup_in(&store, d, f).unwrap();
        let fh = store.open_file(f, libc::O_RDONLY, false).unwrap().fh;
        assert_eq!(store.read(fh, 0, len as u32).unwrap(), content(ino, len));
        store.release(fh).unwrap();
    }
    // Only e is left, its metadata pending: `finish` copies it, then finishes (accepting
    // h's refusal, which stays in its report).
    assert_eq!(m.remaining(), 1, "only e left");
    let strict = finish_strict(&store, &m).expect_err("h's refused xattrs are left out");
    assert!(
        strict.starts_with("1 source entries") && strict.contains("[PermissionDenied]"),
        "expected finish to refuse over h alone: {strict}"
    );
    assert_eq!(
        xattr_of(&store, e, name).unwrap(),
        switch.value("e"),
        "e's xattr, copied by the refused finish's retry"
    );
    let report = super::finish(&store, &m).expect("finish accepting h's skip");
    assert!(
        report.skipped.len() == 1 && report.skipped[0].src_path.as_bytes() == b"h",
        "only h in the finish report: {:?}",
        report.skipped
    );
    assert_eq!(xattr_of(&store, e, name).unwrap(), switch.value("e"));
}

/// A crash right after a directory was marked listed, before its row went, and the
/// source unreachable for the directory's xattrs at the restart: the share opens (the
/// recount does not fail), the row stays (status: pending), nothing is skipped, and it
/// stays so across a clean stop; once the source answers, the next reconcile (a crawl
/// round's end, `finish`) copies the xattr and the row goes.
#[test]
fn a_listed_directorys_metadata_left_by_a_crash_is_retried_once_the_source_answers() {
    let r = Reopen::new();
    let name = r.name();
    let source = || {
        FlakyMeta::new(
            MemSource::new(&["d"], &[("d/f", 10, 3000)], true),
            &[],
            &[],
            name,
        )
    };
    let (src, switch) = source();
    let (store, m) = r.open(src);
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    let f = lookup_in(&store, d, "f").unwrap();
    let fh = store.open_file(f, libc::O_RDONLY, false).unwrap().fh;
    assert_eq!(store.read(fh, 0, 3000).unwrap(), content(10, 3000));
    store.release(fh).unwrap();
    assert!(m.db.get(d).unwrap().is_none());
    // The crash: d listed in the store, its row back.
    m.db.insert(
        &[super::state::StubRow {
            ino: d,
            kind: super::state::StubKind::DummyDir,
            src_path: SourcePath::parse(b"/d").unwrap(),
            src_ino: 100,
            minsize: 0,
            listed_size: 0,
            listed_mtime_ns: 0,
            ident: None,
        }],
        &[],
    )
    .unwrap();
    m.db.sync().unwrap();
    assert!(!store.stub_state(d).unlisted_dir);
    drop(m);
    drop(store);
    for clean in [false, true] {
        let (src, sw) = source();
        sw.set_down(&["d"]);
        sw.set_tag(b"v2:");
        let (store, m) = r.open(src);
        assert_eq!(
            m.db.get(d).unwrap().map(|r| r.kind),
            Some(super::state::StubKind::DummyDir),
            "d's row stays while its metadata cannot be read (open after a {} stop)",
            if clean { "clean" } else { "unclean" }
        );
        assert_eq!(m.reconcile(&store).unwrap(), 1, "d pending");
        assert_nothing_skipped(&m, "while the source is unreachable");
        m.close();
    }
    let (src, sw) = source();
    sw.set_tag(b"v2:");
    let (store, m) = r.open(src);
    assert_eq!(
        m.reconcile(&store).unwrap(),
        0,
        "d's metadata copied, its row gone"
    );
    assert_eq!(xattr_of(&store, d, name).unwrap(), sw.value("d"));
    assert_nothing_skipped(&m, "after the retry");
    finish_strict(&store, &m).expect("finish without accepting skips");
    let _ = switch;
}

/// An unlisted directory shows the link count its source listed (2 + its
/// subdirectories), not 2 of its still empty backing directory; once listed, the same
/// count from its own subdirectories.
#[test]
fn an_unlisted_directory_shows_its_sources_link_count() {
    let mut source = MemSource::new(
        &["d", "d/a", "d/b", "d/a/x", "e"],
        &[("d/f", 10, 100)],
        true,
    );
    source.objects.get_mut(b"d".as_slice()).unwrap().nlink = 4;
    source.objects.get_mut(b"d/a".as_slice()).unwrap().nlink = 3;
    let s = Setup::new(source, 1);
    let d = s.lookup(ROOT_INO, "d");
    let e = s.lookup(ROOT_INO, "e");
    assert!(s.store.stub_state(d).unlisted_dir);
    let nlink = |ino| s.store.getattr(ino, None).unwrap().nlink;
    assert_eq!(
        (nlink(d), nlink(e)),
        (4, 2),
        "unlisted d (two subdirectories on the source) and e (none)"
    );
    let a = s.lookup(d, "a");
    assert!(!s.store.stub_state(d).unlisted_dir && s.store.stub_state(a).unlisted_dir);
    assert_eq!((nlink(d), nlink(a)), (4, 3), "listed d, unlisted d/a");
    s.lookup(a, "x");
    assert_eq!(nlink(a), 3, "listed d/a");
}

// ---------------------------------------------------------------------------------------
// Session 15 (metaretry): an unlisted directory's own metadata on getxattr; bounded
// retries of metadata the source keeps leaving unanswered.

/// A source wrapped to count calls per path, give directory `acl_dir` a POSIX access
/// and default ACL, and fail `stat` of the root as unreachable while `root_down`.
struct Counted<S> {
    inner: S,
    acl_dir: &'static str,
    calls: Arc<Mutex<Vec<(&'static str, String)>>>,
    root_down: Arc<std::sync::atomic::AtomicBool>,
}

/// The access ACL `Counted` gives: owner rwx, user 1234 none, group r-x, mask r-x,
/// other r-x (the Linux xattr form).
fn s15_access_acl() -> Vec<u8> {
    s15_acl(&[
        (0x01, 7, u32::MAX),
        (0x02, 0, 1234),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 5, u32::MAX),
    ])
}

/// The default ACL `Counted` gives: owner rwx, user 4321 rwx, group r-x, mask rwx, other none.
fn s15_default_acl() -> Vec<u8> {
    s15_acl(&[
        (0x01, 7, u32::MAX),
        (0x02, 7, 4321),
        (0x04, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 0, u32::MAX),
    ])
}

fn s15_acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

impl<S: Source> Counted<S> {
    fn new(inner: S, acl_dir: &'static str) -> Self {
        Self {
            inner,
            acl_dir,
            calls: Arc::default(),
            root_down: Arc::default(),
        }
    }
    fn note(&self, what: &'static str, path: &SourcePath) {
        self.calls
            .lock()
            .unwrap()
            .push((what, FlakyMeta::rel(path)));
    }
}

/// How many `what` calls `calls` holds for `path`.
fn s15_count(calls: &Mutex<Vec<(&'static str, String)>>, what: &str, path: &str) -> usize {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(w, p)| *w == what && p == path)
        .count()
}

impl<S: Source> Source for Counted<S> {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            acls: true,
            ..self.inner.features()
        }
    }
    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        if path.is_root() && self.root_down.load(Ordering::SeqCst) {
            return Err(SourceError::new(
                SourceErrorKind::Unreachable,
                path,
                "server not responding (test: whole source)",
            ));
        }
        self.inner.stat(path)
    }
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.note("read_dir", path);
        self.inner.read_dir(path)
    }
    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.inner.read(path, offset, len)
    }
    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        self.note("read_link", path);
        self.inner.read_link(path)
    }
    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.note("xattrs", path);
        self.inner.xattrs(path)
    }
    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.note("acl", path);
        let mut acl = self.inner.acl(path)?;
        if FlakyMeta::rel(path) == self.acl_dir {
            acl.posix_access = Some(s15_access_acl());
            acl.posix_default = Some(s15_default_acl());
        }
        Ok(acl)
    }
    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.inner.streams(path)
    }
    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.inner.read_stream(path, stream, offset, len)
    }
}

/// Whether the destination's file system in `dir` takes POSIX ACLs.
fn s15_tier_takes_acls(dir: &std::path::Path) -> bool {
    let probe = dir.join("acl-probe");
    std::fs::create_dir(&probe).unwrap();
    let ok = crate::util::lsetxattr(
        &probe,
        OsStr::new("system.posix_acl_access"),
        &s15_access_acl(),
        0,
    )
    .is_ok();
    std::fs::remove_dir(&probe).unwrap();
    ok
}

/// Share "t" of `r` over `source`, giving metadata up after `attempts` counted failures
/// and `after`.
fn s15_open(
    r: &Reopen,
    source: impl Source + 'static,
    attempts: u32,
    after: Duration,
) -> (Arc<Store>, Arc<Migration>) {
    let store = Store::open(StoreConfig::from_toml_str(&r.cfg, "t.toml").unwrap()).unwrap();
    let mut mc = MigrationConfig::new("t");
    mc.crawl_workers = 2;
    mc.unit_size = 64 << 10;
    mc.meta_give_up_attempts = attempts;
    mc.meta_give_up_after = after;
    let m = Migration::open(&store, Box::new(source), mc).expect("open the share");
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    (store, m)
}

/// `getxattr`/`listxattr` of a directory not listed yet show the source's xattrs and
/// access ACL (copied with one xattrs + one ACL read of the directory, no listing); the
/// directory stays unlisted, and asking again reads nothing more. Its default ACL comes
/// with the listing, after the entries were created: none of them inherits it. After the
/// listing everything is there, and the crawl and a strict `finish` complete.
/// (Before: no xattr and no ACL until the directory was listed.)
#[test]
fn getxattr_of_an_unlisted_directory_copies_its_own_xattrs_and_acl_without_listing_it() {
    let r = Reopen::new();
    let name = r.name();
    let acls = s15_tier_takes_acls(&r.dir.path().join("t0"));
    let (flaky, switch) = FlakyMeta::new(
        MemSource::new(&["d", "d/sub"], &[("d/f", 10, 3000)], true),
        &[],
        &[],
        name,
    );
    let source = Counted::new(flaky, "d");
    let calls = source.calls.clone();
    let (store, m) = s15_open(&r, source, 5, Duration::from_secs(900));
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    assert!(store.stub_state(d).unlisted_dir);
    assert_eq!(
        xattr_of(&store, d, name).expect("the source's xattr of unlisted d"),
        switch.value("d")
    );
    let names = store.listxattr(d).unwrap();
    assert!(
        names.split(|b| *b == 0).any(|n| n == name.as_bytes()),
        "listxattr of unlisted d names {name}: {:?}",
        String::from_utf8_lossy(&names)
    );
    if acls {
        assert_eq!(
            xattr_of(&store, d, "system.posix_acl_access").expect("d's access ACL"),
            s15_access_acl()
        );
        let mode = store.getattr(d, None).unwrap().perm & 0o777;
        assert_eq!(
            mode & 0o070,
            0o050,
            "group bits = the ACL mask r-x: {mode:o}"
        );
    } else {
        eprintln!("the destination takes no POSIX ACLs here: ACL part not checked");
    }
    assert!(
        store.stub_state(d).unlisted_dir,
        "d must stay unlisted (its own metadata only, not a listing)"
    );
    assert_eq!(
        (
            s15_count(&calls, "xattrs", "d"),
            s15_count(&calls, "acl", "d")
        ),
        (1, 1),
        "one xattrs and one ACL read of d for three xattr calls"
    );
    xattr_of(&store, d, name).unwrap();
    assert_eq!(s15_count(&calls, "xattrs", "d"), 1, "copied once");
    // The listing: d's entries, then all of d's metadata again (with its default ACL).
    let f = lookup_in(&store, d, "f").unwrap();
    let sub = lookup_in(&store, d, "sub").unwrap();
    assert!(!store.stub_state(d).unlisted_dir);
    assert_eq!(
        xattr_of(&store, d, name).unwrap(),
        switch.value("d"),
        "kept"
    );
    if acls {
        assert_eq!(
            xattr_of(&store, d, "system.posix_acl_access").unwrap(),
            s15_access_acl()
        );
        assert_eq!(
            xattr_of(&store, d, "system.posix_acl_default").expect("d's default ACL once listed"),
            s15_default_acl()
        );
        for (what, ino) in [("d/f", f), ("d/sub", sub)] {
            for acl in ["system.posix_acl_access", "system.posix_acl_default"] {
                let got = xattr_of(&store, ino, acl).map_err(|e| e.errno());
                assert_eq!(
                    got,
                    Err(libc::ENODATA),
                    "{what} must not inherit d's default ACL as {acl}"
                );
            }
        }
    }
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    assert_nothing_skipped(&m, "after the crawl");
    finish_strict(&store, &m).expect("finish without accepting skips");
    assert_eq!(xattr_of(&store, d, name).unwrap(), switch.value("d"));
}

/// `getxattr` of an unlisted directory while the source is unreachable for its xattrs:
/// EIO (not an empty answer), nothing skipped, still unlisted; once it answers, the copy
/// is made.
#[test]
fn getxattr_of_an_unlisted_directory_fails_while_the_source_cannot_give_its_metadata() {
    let r = Reopen::new();
    let name = r.name();
    let (flaky, switch) = FlakyMeta::new(MemSource::new(&["d"], &[], true), &[], &[], name);
    let (store, m) = s15_open(&r, flaky, 5, Duration::from_secs(900));
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    switch.set_down(&["d"]);
    assert_eq!(
        xattr_of(&store, d, name).map_err(|e| e.errno()),
        Err(libc::EIO),
        "expected EIO while d's xattrs cannot be read"
    );
    assert_nothing_skipped(&m, "after the failed read");
    assert!(store.stub_state(d).unlisted_dir);
    switch.set_down(&[]);
    assert_eq!(xattr_of(&store, d, name).unwrap(), switch.value("d"));
    assert!(store.stub_state(d).unlisted_dir);
    assert!(
        m.metadata_retries().is_empty(),
        "a success clears the count"
    );
}

/// A listed directory whose times and metadata a crash left to do (its row back, as in
/// `a_listed_directorys_metadata_left_by_a_crash_is_retried_once_the_source_answers`):
/// a client's `getxattr` copies them at once (no stale answer), and a client's
/// `setxattr` that follows is not overwritten by a later reconcile.
#[test]
fn a_listed_directorys_pending_metadata_is_copied_before_a_clients_xattr_call() {
    let r = Reopen::new();
    let name = r.name();
    let source = || {
        FlakyMeta::new(
            MemSource::new(&["d"], &[("d/f", 10, 3000)], true),
            &[],
            &[],
            name,
        )
    };
    let (src, _switch) = source();
    let (store, m) = r.open(src);
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    lookup_in(&store, d, "f").unwrap();
    assert!(m.db.get(d).unwrap().is_none());
    m.db.insert(
        &[super::state::StubRow {
            ino: d,
            kind: super::state::StubKind::DummyDir,
            src_path: SourcePath::parse(b"/d").unwrap(),
            src_ino: 100,
            minsize: 0,
            listed_size: 0,
            listed_mtime_ns: 0,
            ident: None,
        }],
        &[],
    )
    .unwrap();
    m.close();
    drop(m);
    drop(store);
    let (src, sw) = source();
    sw.set_tag(b"v2:");
    let (store, m) = r.open(src);
    assert!(m.db.get(d).unwrap().is_some(), "d's row is back");
    assert_eq!(
        xattr_of(&store, d, name).unwrap(),
        sw.value("d"),
        "getxattr shows the source's metadata, copied now"
    );
    assert!(m.db.get(d).unwrap().is_none(), "its row went with the copy");
    store
        .setxattr(d, OsStr::new(name), b"client", 0)
        .expect("a client's setxattr");
    assert_eq!(m.reconcile(&store).unwrap(), 1, "d/f left (its data)");
    assert_eq!(
        xattr_of(&store, d, name).unwrap(),
        b"client".to_vec(),
        "the client's value stays"
    );
}

/// Metadata unreachable fewer times than the bound, then answered: copied, nothing
/// skipped, the count cleared. Attempts are counted for the crawl's and `finish`'s reads
/// (here `finish`'s: both entries wait only for their metadata), never for a client's.
/// The count survives an unclean stop (kill -9): after a restart, the failure that
/// reaches the bound gives the entry up — reported with its attempts and last error,
/// migrated without that metadata, plain `finish` refusing over it by name, `finish`
/// accepting skips completing. Before the bound, plain `finish` names what it waits for.
#[test]
fn metadata_unreachable_below_the_bound_is_retried_and_the_count_survives_a_restart() {
    let r = Reopen::new();
    let name = r.name();
    let source = || {
        FlakyMeta::new(
            MemSource::new(&[], &[("e", 12, 0), ("f", 13, 0)], true),
            &[],
            &[],
            name,
        )
    };
    let (src, switch) = source();
    let (store, m) = s15_open(&r, src, 3, Duration::ZERO);
    let e = lookup_in(&store, ROOT_INO, "e").unwrap();
    let f = lookup_in(&store, ROOT_INO, "f").unwrap();
    switch.set_down(&["e", "f"]);
    for n in 1..=2 {
        let strict = finish_strict(&store, &m).expect_err("e and f remain");
        assert!(
            strict.contains("2 stubs remain")
                && strict.contains("2 entries wait for metadata")
                && strict.contains("attempt"),
            "finish {n} names what it waits for: {strict}"
        );
    }
    let attempts = |m: &Migration| -> Vec<(Vec<u8>, u32)> {
        m.metadata_retries()
            .into_iter()
            .map(|r| (r.src_path.as_bytes().to_vec(), r.attempts))
            .collect()
    };
    assert_eq!(attempts(&m), [(b"e".to_vec(), 2), (b"f".to_vec(), 2)]);
    assert_eq!(
        xattr_of(&store, f, name).map_err(|x| x.errno()),
        Err(libc::EIO),
        "a client's read while f is down"
    );
    assert_eq!(
        attempts(&m),
        [(b"e".to_vec(), 2), (b"f".to_vec(), 2)],
        "a client's failed read is not counted"
    );
    switch.set_down(&["e"]);
    assert_eq!(xattr_of(&store, f, name).unwrap(), switch.value("f"));
    assert_nothing_skipped(&m, "after f answered below the bound");
    assert_eq!(attempts(&m), [(b"e".to_vec(), 2)], "f's count cleared");
    drop(m);
    drop(store); // unclean
    let (src, switch) = source();
    switch.set_down(&["e"]);
    let (store, m) = s15_open(&r, src, 3, Duration::ZERO);
    assert_eq!(
        attempts(&m),
        [(b"e".to_vec(), 2)],
        "e's count kept across the restart"
    );
    // The third failure (finish's) reaches the bound: e given up, so finish refuses
    // over it as left out, not as a stub.
    let strict = finish_strict(&store, &m).expect_err("e was left out");
    assert!(
        strict.starts_with("1 source entries")
            && strict.contains("/e")
            && strict.contains("source unreachable after 3 attempts"),
        "plain finish names e: {strict}"
    );
    let skipped = m.skipped();
    assert!(
        skipped.len() == 1
            && skipped[0].src_path.as_bytes() == b"e"
            && skipped[0].kind == "Unreachable"
            && skipped[0]
                .reason
                .contains("source unreachable after 3 attempts over")
            && skipped[0]
                .reason
                .contains("xattrs: server not responding (test)"),
        "expected e in the skip report with its attempts and last error: {skipped:?}"
    );
    assert!(m.metadata_retries().is_empty());
    assert_eq!(
        xattr_of(&store, e, name).map_err(|x| x.errno()),
        Err(libc::ENODATA),
        "e migrated without the source's xattr"
    );
    let report = super::finish(&store, &m).expect("finish accepting skips");
    assert_eq!(report.skipped.len(), 1, "{:?}", report.skipped);
}

/// An entry the source never gives metadata for while the rest answers (a file's
/// xattrs, a symlink's target, which stops its directory's listing): the crawl, which
/// retries them every round, gives them up at the bound and ends done instead of stuck;
/// plain `finish` refuses naming them, `finish` accepting skips completes, and the rest
/// (the directory's other entries) is all migrated.
#[test]
fn metadata_never_given_is_skipped_at_the_bound_and_the_crawl_and_finish_complete() {
    let r = Reopen::new();
    let name = r.name();
    let (src, switch) = FlakyMeta::new(
        MemSource::new(&["d"], &[("d/f", 10, 3000), ("e", 12, 100)], true),
        &[("d/l", "f")],
        &[],
        name,
    );
    switch.set_down(&["d/l", "e"]);
    let (store, m) = s15_open(&r, src, 3, Duration::ZERO);
    let crawler = Crawler::start(store.clone(), m.clone());
    assert_eq!(
        crawler.wait(Duration::from_secs(120)),
        CrawlState::Done,
        "the crawl gives the two entries up and ends done: {:?}",
        crawler.failures()
    );
    drop(crawler);
    let skipped = m.skipped();
    let paths: Vec<&[u8]> = skipped.iter().map(|s| s.src_path.as_bytes()).collect();
    assert_eq!(paths, [b"d/l".as_slice(), b"e"], "{skipped:?}");
    assert!(
        skipped
            .iter()
            .all(|s| s.reason.contains("source unreachable after 3 attempts")),
        "{skipped:?}"
    );
    assert!(
        skipped[0].reason.contains("symlink target"),
        "says what was not read: {skipped:?}"
    );
    let strict = finish_strict(&store, &m).expect_err("two entries left out");
    assert!(strict.starts_with("2 source entries"), "{strict}");
    super::finish(&store, &m).expect("finish accepting skips");
    let d = lookup_in(&store, ROOT_INO, "d").unwrap();
    let f = lookup_in(&store, d, "f").unwrap();
    let fh = store.open_file(f, libc::O_RDONLY, false).unwrap().fh;
    assert_eq!(store.read(fh, 0, 3000).unwrap(), content(10, 3000));
    store.release(fh).unwrap();
    assert_eq!(xattr_of(&store, f, name).unwrap(), switch.value("d/f"));
    assert_eq!(
        lookup_in(&store, d, "l").map_err(|x| x.errno()),
        Err(libc::ENOENT),
        "the symlink whose target was never given is left out"
    );
    let e = lookup_in(&store, ROOT_INO, "e").unwrap();
    let fh = store.open_file(e, libc::O_RDONLY, false).unwrap().fh;
    assert_eq!(
        store.read(fh, 0, 100).unwrap(),
        content(12, 100),
        "e's data"
    );
    store.release(fh).unwrap();
}

/// Failures while the whole source is down (its root does not answer either) are an
/// outage, not an entry's problem: never counted, never given up. Nor is an entry given
/// up before the bound's time has passed, however often it fails.
#[test]
fn metadata_is_not_given_up_during_a_whole_source_outage_nor_before_the_bounds_time() {
    let r = Reopen::new();
    let name = r.name();
    let (flaky, switch) =
        FlakyMeta::new(MemSource::new(&[], &[("e", 12, 0)], true), &[], &[], name);
    let source = Counted::new(flaky, "none");
    let root_down = source.root_down.clone();
    let (store, m) = s15_open(&r, source, 2, Duration::from_secs(3600));
    lookup_in(&store, ROOT_INO, "e").unwrap();
    switch.set_down(&["e"]);
    root_down.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        let strict = finish_strict(&store, &m).expect_err("e remains");
        assert!(strict.contains("1 stubs remain"), "{strict}");
    }
    assert!(
        m.metadata_retries().is_empty(),
        "nothing counted while the root does not answer: {:?}",
        m.metadata_retries()
    );
    root_down.store(false, Ordering::SeqCst);
    for _ in 0..5 {
        let strict = finish_strict(&store, &m).expect_err("not given up before an hour");
        assert!(strict.contains("1 stubs remain"), "{strict}");
    }
    let retries = m.metadata_retries();
    assert!(
        retries.len() == 1 && retries[0].attempts == 5,
        "five counted failures: {retries:?}"
    );
    assert_nothing_skipped(&m, "below the bound's time");
    assert_eq!(m.remaining(), 1);
}
