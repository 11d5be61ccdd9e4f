//! Migration rows are keyed by the store's inode number, which the tier's file system
//! hands out again once a file is gone. A kill between a client's unlink of a stub and
//! the migration's clean-up of its rows leaves rows of a dead object; a new file that
//! then gets the number must inherit nothing of it: not the old source file's xattrs
//! (a stale dummy row would copy them onto it), and not its completion record (a stale
//! `done` row would make `finish` replace the new file's bytes with the old source's).
//!
//! Reproduced on a small journalled ext4 of the test's own (`-N 128`), which gives a freed
//! inode number to the next new file at once.

mod common;

use common::{TestStore, loop_ext4};
use kaiso_store::migrate::{
    CrawlState, Crawler, FileKind, Migration, MigrationConfig, Migrations, Source, SourceAcl,
    SourceAttr, SourceEntry, SourceError, SourceErrorKind, SourceFeatures, SourcePath,
    SourceResult, SourceStream, Timestamp, hold_recount,
};
use kaiso_store::{Caller, Ino, SetAttr, TimeSet};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::MetadataExt;
use std::time::{Duration, UNIX_EPOCH};

const FILES: usize = 24;
const SIZE: usize = 3000;
const XATTR: &str = "user.origin";
/// The source files' mtime (seconds since the epoch).
const MTIME: i64 = 1_000_000_000;

/// `d/f0` … `d/f23`, each with its own bytes and an xattr naming it.
struct Share;

fn bytes_of(i: usize) -> Vec<u8> {
    (0..SIZE).map(|k| (k * 7 + i * 13) as u8).collect()
}

fn index_of(path: &SourcePath) -> Option<usize> {
    let p = std::str::from_utf8(path.as_bytes()).ok()?;
    p.strip_prefix("d/f")?.parse().ok().filter(|&i| i < FILES)
}

fn attr(kind: FileKind, ino: u64, size: u64) -> SourceAttr {
    let t = Timestamp {
        secs: MTIME,
        nanos: 0,
    };
    SourceAttr::plain(kind, ino, size, t)
}

impl Source for Share {
    fn describe(&self) -> String {
        "memory:inode-reuse".into()
    }

    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            unix_ids: true,
            xattrs: true,
            ..SourceFeatures::default()
        }
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        match path.as_bytes() {
            b"" => Ok(attr(FileKind::Directory, 1, 0)),
            b"d" => Ok(attr(FileKind::Directory, 2, 0)),
            _ => match index_of(path) {
                Some(i) => Ok(attr(FileKind::Regular, 100 + i as u64, SIZE as u64)),
                None => Err(SourceError::new(SourceErrorKind::NotFound, path, "none")),
            },
        }
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        let names: Vec<String> = match path.as_bytes() {
            b"" => vec!["d".into()],
            b"d" => (0..FILES).map(|i| format!("f{i}")).collect(),
            _ => return Err(SourceError::new(SourceErrorKind::NotFound, path, "none")),
        };
        names
            .into_iter()
            .map(|n| {
                let p = path.join(n.as_bytes())?;
                Ok(SourceEntry {
                    name: n.into_bytes(),
                    attr: self.stat(&p)?,
                })
            })
            .collect()
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        let i = index_of(path)
            .ok_or_else(|| SourceError::new(SourceErrorKind::NotFound, path, "none"))?;
        let b = bytes_of(i);
        let from = (offset as usize).min(b.len());
        let to = from.saturating_add(len).min(b.len());
        Ok(b[from..to].to_vec())
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(SourceErrorKind::WrongKind, path, "none"))
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(match index_of(path) {
            Some(_) => vec![(XATTR.as_bytes().to_vec(), path.as_bytes().to_vec())],
            None => Vec::new(),
        })
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
        Err(SourceError::new(SourceErrorKind::Unsupported, path, "none"))
    }
}

fn config(name: &str) -> MigrationConfig {
    let mut mc = MigrationConfig::new(name);
    mc.target = "mig".into();
    mc.unit_size = 64 << 10;
    mc.crawl_workers = 1;
    mc
}

/// The xattr names of `ino` (through the store, as a client asks).
fn xattr_names(t: &TestStore, ino: Ino) -> Vec<String> {
    let list = t.s().listxattr(ino).unwrap();
    list.split(|&b| b == 0)
        .filter(|n| !n.is_empty())
        .map(|n| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// Stub rows of removed files (never read, and read to completion) survive a kill that
/// came right after the unlinks; after the restart clients create files that get the
/// freed numbers, one with the old file's size and mtime (a copy tool keeping times),
/// while the recount that would drop those rows has not run yet. Nothing of the removed
/// files' migration state may reach them: no source xattr on any reference, and `finish`
/// keeps every byte the client wrote and counts the removed files as deleted.
#[test]
fn a_migration_row_left_by_a_kill_does_not_pass_to_a_file_reusing_the_number() {
    if !loop_ext4::available() {
        eprintln!("skipped: needs root and mkfs.ext4");
        return;
    }
    let name = "inode-reuse";
    let scratch = tempfile::tempdir().unwrap();
    let ext4 = loop_ext4::LoopExt4::with_mkfs_args(scratch.path(), 64 << 20, &["-N", "128"]);
    let mut t = TestStore::new_in(&ext4.mnt, &["48MiB"]);
    let dir = t.tier(0).join("mig/d");
    // Every third file goes; of those, the odd ones are read to completion first.
    let removed: Vec<usize> = (0..FILES).step_by(3).collect();
    let completed: Vec<usize> = removed.iter().copied().filter(|i| i % 2 == 1).collect();
    {
        let m = Migration::open(t.s(), Box::new(Share), config(name)).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        t.s().set_stub_filler(all.clone());
        for i in 0..FILES {
            let ino = t.lookup_path(&format!("mig/d/f{i}")).unwrap().ino;
            assert_eq!(t.s().stub_state(ino).missing, vec![(0, SIZE as u64)]);
        }
        for &i in &completed {
            assert_eq!(t.get(&format!("mig/d/f{i}")), bytes_of(i));
        }
        // Killed: neither the share nor the store is closed.
        t.s().unset_stub_filler(&*all);
        drop((m, all));
    }
    let store = t.store.take().unwrap();
    drop(store);
    // What a kill right after the unlinks' `unlink(2)` leaves: the backing files gone,
    // every row of them (the store's and the migration's) still there.
    let mut freed = BTreeMap::new();
    for &i in &removed {
        let p = dir.join(format!("f{i}"));
        freed.insert(std::fs::metadata(&p).unwrap().ino(), i);
        std::fs::remove_file(&p).unwrap();
    }
    let s = t.crash_and_reopen();
    // The share serves while its recount after the kill is held back.
    hold_recount(name, true);
    let m = Migration::open(&s, Box::new(Share), config(name)).unwrap();
    assert!(m.recounted_at_open());
    let all = Migrations::new();
    all.add(m.clone());
    s.set_stub_filler(all.clone());
    // Clients create files; the file system gives them the freed numbers.
    let mut reused: Vec<(String, Ino, usize, Vec<u8>)> = Vec::new();
    let mut new_files = Vec::new();
    for k in 0..removed.len() {
        let path = format!("mig/d/new{k}");
        let data: Vec<u8> = (0..SIZE).map(|j| (j * 3 + k * 5 + 1) as u8).collect();
        let ino = t.put(&path, &data);
        // Kept at the source file's size and mtime, as `cp -p` of an old copy would.
        let set = SetAttr {
            mtime: Some(TimeSet::At(UNIX_EPOCH + Duration::from_secs(MTIME as u64))),
            ..SetAttr::default()
        };
        s.setattr(ino, &set, Caller::ROOT).unwrap();
        let bino = std::fs::metadata(dir.join(format!("new{k}")))
            .unwrap()
            .ino();
        if let Some(&i) = freed.get(&bino) {
            reused.push((path.clone(), ino, i, data.clone()));
        }
        new_files.push((path, ino, data));
    }
    eprintln!(
        "{} of {} new files got a removed stub's inode number",
        reused.len(),
        new_files.len()
    );
    assert!(
        reused.iter().any(|r| !completed.contains(&r.2))
            && reused.iter().any(|r| completed.contains(&r.2)),
        "the file system reused too few inode numbers (of a dummy and of a completed file): the test proves nothing here ({:?})",
        reused.iter().map(|r| r.2).collect::<Vec<_>>()
    );
    // A client's first look at the new files' xattrs (the share still recounting).
    for (path, ino, i, _) in &reused {
        let names = xattr_names(&t, *ino);
        assert!(
            !names.iter().any(|n| n == XATTR),
            "{path} got the xattrs of removed d/f{i} ({names:?})"
        );
    }
    hold_recount(name, false);
    let crawler = Crawler::start(s.clone(), m.clone());
    assert_eq!(crawler.wait(Duration::from_secs(60)), CrawlState::Done);
    drop(crawler);
    let report = kaiso_store::migrate::finish(&s, &m).expect("finish");
    for (path, ino, data) in &new_files {
        assert_eq!(&t.get(path), data, "{path}: the client's bytes");
        let names = xattr_names(&t, *ino);
        assert!(
            !names.iter().any(|n| n == XATTR),
            "{path}: a source xattr after finish ({names:?})"
        );
    }
    let kept: BTreeSet<usize> = (0..FILES).filter(|i| !removed.contains(i)).collect();
    for &i in &kept {
        assert_eq!(t.get(&format!("mig/d/f{i}")), bytes_of(i), "d/f{i}");
    }
    assert!(report.refetched.is_empty(), "{:?}", report.refetched);
    assert!(report.mismatches.is_empty(), "{:?}", report.mismatches);
    assert_eq!(
        (report.deleted_by_clients, report.verified_files),
        (removed.len() as u64, kept.len() as u64),
        "every removed file counted as deleted, every kept one verified ({report:?})"
    );
    s.unset_stub_filler(&*all);
    drop((m, all, s));
    t.reopen();
    drop(t);
    drop(ext4);
}
