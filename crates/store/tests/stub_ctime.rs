//! A migration's own writes into the store (fetches into a stub file, the listing of a
//! stub directory) do not change the ctime clients see: a client reading a stub (which
//! fetches it) or listing a directory (which lists it) must find the file as it was, or
//! `tar` reports "file changed as we read it". Only changes by others move it. The
//! backing file's own ctime (what `finish` compares) moves with every write.

mod common;
use common::*;
use kaiso_store::{
    Caller, FileKind, FsResult, Ino, ROOT_INO, SetAttr, Store, StubEntry, StubFiller, StubState,
};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SIZE: u64 = 3 << 20;
const UNIT: u64 = 1 << 20;

fn byte_at(i: u64) -> u8 {
    (i * 11 + 5) as u8
}

fn entry(kind: FileKind, size: u64) -> StubEntry {
    StubEntry {
        kind,
        perm: if kind == FileKind::Dir { 0o755 } else { 0o640 },
        uid: 0,
        gid: 0,
        size,
        mtime: UNIX_EPOCH + Duration::new(1_000_000_000, 7),
        atime: UNIX_EPOCH + Duration::new(1_000_000_000, 7),
        symlink_target: None,
        rdev: 0,
        unlisted: kind == FileKind::Dir,
    }
}

/// A source: `/f` (3 units) and `/d/g` (one byte); fills one unit at a time.
struct Source;

impl StubFiller for Source {
    fn fill_dir(&self, store: &Store, ino: Ino, path: &Path) -> FsResult<()> {
        store.stub_batch(|| {
            if path.as_os_str().is_empty() || path == Path::new("/") {
                store.stub_create(ino, "f".as_ref(), &entry(FileKind::File, SIZE))?;
                store.stub_create(ino, "d".as_ref(), &entry(FileKind::Dir, 0))?;
            } else {
                store.stub_create(ino, "g".as_ref(), &entry(FileKind::File, 1))?;
            }
            Ok(())
        })?;
        store.stub_dir_listed(ino)
    }

    fn fill_range(
        &self,
        store: &Store,
        ino: Ino,
        _path: &Path,
        offset: u64,
        len: u64,
    ) -> FsResult<()> {
        let size = store.getattr(ino, None)?.size;
        let start = offset / UNIT * UNIT;
        let end = (offset + len).div_ceil(UNIT) * UNIT;
        for u in (start..end.min(size)).step_by(UNIT as usize) {
            let data: Vec<u8> = (u..(u + UNIT).min(size)).map(byte_at).collect();
            store.stub_write(ino, u, &data)?;
        }
        Ok(())
    }
}

fn migrating_store() -> TestStore {
    let t = TestStore::new(&["64MiB"]);
    t.s().set_stub_filler(Arc::new(Source));
    t.s()
        .stub_mark(
            ROOT_INO,
            StubState {
                unlisted_dir: true,
                ..StubState::default()
            },
        )
        .unwrap();
    t
}

fn read(s: &Store, ino: Ino, offset: u64, len: u32) -> Vec<u8> {
    let fh = s.open_file(ino, libc::O_RDONLY, false).unwrap().fh;
    let d = s.read(fh, offset, len).unwrap();
    s.release(fh).unwrap();
    d
}

fn ctimes(s: &Store, ino: Ino) -> (SystemTime, SystemTime) {
    (
        s.getattr(ino, None).unwrap().ctime,
        s.getattr_backing(ino).unwrap().ctime,
    )
}

/// Long enough for the file system's clock (coarse: a few ms) to tick between writes.
fn tick() {
    std::thread::sleep(Duration::from_millis(30));
}

#[test]
fn fetching_a_stub_file_does_not_change_the_ctime_clients_see() {
    let t = migrating_store();
    let s = t.s();
    let f = t.lookup_path("f").unwrap();
    let (seen, _) = ctimes(s, f.ino);
    tick();
    assert_eq!(
        read(s, f.ino, 0, 16),
        (0..16).map(byte_at).collect::<Vec<_>>()
    );
    let (shown, backing) = ctimes(s, f.ino);
    assert_ne!(backing, seen, "the fetch moved the backing file's ctime");
    assert_eq!(
        shown, seen,
        "a partial fetch must not change the ctime clients see"
    );
    // Through a handle too (fstat), and across the completing fetch.
    tick();
    let fh = s.open_file(f.ino, libc::O_RDONLY, false).unwrap().fh;
    let all = s.read(fh, 0, SIZE as u32).unwrap();
    assert!(all.iter().enumerate().all(|(i, b)| *b == byte_at(i as u64)));
    assert!(s.stub_state(f.ino).is_complete());
    assert_eq!(
        s.getattr(f.ino, Some(fh)).unwrap().ctime,
        seen,
        "fstat after completion"
    );
    s.release(fh).unwrap();
    let (shown, backing) = ctimes(s, f.ino);
    assert_eq!(
        shown, seen,
        "completion must not change the ctime clients see"
    );
    assert!(backing > seen);
    // A client's change shows.
    tick();
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    s.setattr(f.ino, &set, Caller::ROOT).unwrap();
    let (shown, backing) = ctimes(s, f.ino);
    assert_eq!(shown, backing, "after a client's chmod, the real ctime");
    assert!(shown > seen, "a client's chmod changes the ctime");
}

#[test]
fn a_client_write_between_fetches_shows_and_later_fetches_keep_it() {
    let t = migrating_store();
    let s = t.s();
    let f = t.lookup_path("f").unwrap();
    read(s, f.ino, 0, 16);
    tick();
    let o = s.open_file(f.ino, libc::O_WRONLY, false).unwrap();
    s.write(o.fh, 10, b"client").unwrap();
    s.release(o.fh).unwrap();
    let (written, backing) = ctimes(s, f.ino);
    assert_eq!(written, backing, "the client's write shows");
    tick();
    read(s, f.ino, UNIT, 16);
    let (shown, backing) = ctimes(s, f.ino);
    assert_ne!(backing, written, "the fetch moved the backing file's ctime");
    assert_eq!(
        shown, written,
        "the fetch after the write keeps the write's ctime"
    );
}

#[test]
fn listing_a_stub_directory_does_not_change_the_ctime_clients_see() {
    let t = migrating_store();
    let s = t.s();
    let d = t.lookup_path("d").unwrap();
    assert!(s.stub_state(d.ino).unlisted_dir);
    let (seen, _) = ctimes(s, d.ino);
    tick();
    // Listed by a lookup in it: entries created, times restored.
    let g = t.lookup_path("d/g").unwrap();
    assert!(!s.stub_state(d.ino).unlisted_dir);
    let (shown, backing) = ctimes(s, d.ino);
    assert_ne!(
        backing, seen,
        "the listing moved the backing directory's ctime"
    );
    assert_eq!(shown, seen, "listing must not change the ctime clients see");
    // A client's entry shows.
    tick();
    s.mkdir(d.ino, "new".as_ref(), 0o755, 0, Caller::ROOT)
        .unwrap();
    let (shown, backing) = ctimes(s, d.ino);
    assert_eq!(shown, backing, "after a client's mkdir, the real ctime");
    assert!(shown > seen);
    let _ = g;
}

/// Reopens `t`'s store (`crash`: without shutdown, as kill -9 leaves it) and resumes the
/// migration as `Migration::open` does: the filler registered, the recorded ctime masks
/// put back.
fn resume(t: &mut TestStore, crash: bool) {
    let s = if crash {
        t.crash_and_reopen()
    } else {
        t.reopen()
    };
    s.set_stub_filler(Arc::new(Source));
    s.restore_ctime_masks();
}

#[test]
fn a_partly_fetched_file_keeps_its_shown_ctime_across_a_restart() {
    for crash in [false, true] {
        let mut t = migrating_store();
        let f = t.lookup_path("f").unwrap();
        let (seen, _) = ctimes(t.s(), f.ino);
        tick();
        read(t.s(), f.ino, 0, 16);
        let (shown, backing) = ctimes(t.s(), f.ino);
        assert!(backing != seen && shown == seen, "before the restart");
        resume(&mut t, crash);
        let s = t.s().clone();
        let f = t.lookup_path("f").unwrap();
        assert!(!s.stub_state(f.ino).is_complete(), "still partly fetched");
        let (shown, real) = ctimes(&s, f.ino);
        assert_eq!(real, backing, "nothing changed the file over the restart");
        assert_eq!(
            shown, seen,
            "after a restart (crash: {crash}) a partly fetched file must still show the \
             ctime from before the store's writes, not its backing ctime"
        );
        // Fetches after the restart and the completion keep it.
        tick();
        read(&s, f.ino, UNIT, 16);
        assert_eq!(ctimes(&s, f.ino).0, seen, "a fetch after the restart");
        let all = read(&s, f.ino, 0, SIZE as u32);
        assert!(all.iter().enumerate().all(|(i, b)| *b == byte_at(i as u64)));
        assert!(s.stub_state(f.ino).is_complete());
        assert_eq!(ctimes(&s, f.ino).0, seen, "completion after the restart");
        // Someone else's change shows.
        tick();
        let set = SetAttr {
            mode: Some(0o600),
            ..SetAttr::default()
        };
        s.setattr(f.ino, &set, Caller::ROOT).unwrap();
        let (shown, backing) = ctimes(&s, f.ino);
        assert!(shown == backing && shown > seen, "a client's chmod shows");
    }
}

#[test]
fn a_client_change_before_a_restart_is_not_masked_after_it() {
    let mut t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    read(t.s(), f.ino, 0, 16);
    tick();
    let set = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    t.s().setattr(f.ino, &set, Caller::ROOT).unwrap();
    let (changed, backing) = ctimes(t.s(), f.ino);
    assert_eq!(changed, backing, "the client's chmod shows");
    resume(&mut t, false);
    let f = t.lookup_path("f").unwrap();
    let (shown, backing) = ctimes(t.s(), f.ino);
    assert_eq!(
        shown, backing,
        "a mask recorded before a client's change must not come back after a restart"
    );
    assert_eq!(shown, changed);
}
