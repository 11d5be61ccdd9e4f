//! The mtime a stub file must show (the source's) is durable in its stub row: a crash
//! between a fetch's write and the restore of the mtime is undone at the next start, a
//! stat never sees the time of a fetch, and a client's change of a partial file sets the
//! time that later fetches keep (and a hole it punches into an unfetched range stays a
//! hole).

mod common;
use common::*;
use kaiso_store::{
    Caller, FailPoint, FileKind, FsResult, Ino, ROOT_INO, SetAttr, Store, StubEntry, StubFiller,
    StubState, TimeSet,
};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const SIZE: u64 = 3 << 20;
const UNIT: u64 = 1 << 20;

/// The source's times of the one file (with nanoseconds, as a real source has them).
fn source_mtime() -> SystemTime {
    UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789)
}

fn source_atime() -> SystemTime {
    UNIX_EPOCH + Duration::new(1_100_000_000, 5)
}

/// Bytes of the source file.
fn byte_at(i: u64) -> u8 {
    (i * 7 + 3) as u8
}

/// A source with one directory entry, `f`, whose bytes are computed; fills one unit at a
/// time through `Store::stub_write`.
struct OneFile;

impl StubFiller for OneFile {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        let e = StubEntry {
            kind: FileKind::File,
            perm: 0o640,
            uid: 0,
            gid: 0,
            size: SIZE,
            mtime: source_mtime(),
            atime: source_atime(),
            symlink_target: None,
            rdev: 0,
            unlisted: false,
        };
        store.stub_batch(|| store.stub_create(ino, "f".as_ref(), &e))?;
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
        let start = offset / UNIT * UNIT;
        let end = (offset + len).div_ceil(UNIT) * UNIT;
        for u in (start..end.min(SIZE)).step_by(UNIT as usize) {
            let data: Vec<u8> = (u..(u + UNIT).min(SIZE)).map(byte_at).collect();
            store.stub_write(ino, u, &data)?;
        }
        Ok(())
    }
}

/// A store whose root is an unlisted stub directory served by [`OneFile`].
fn migrating_store() -> TestStore {
    let t = TestStore::new(&["64MiB"]);
    attach(t.s());
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

fn attach(s: &Arc<Store>) {
    s.set_stub_filler(Arc::new(OneFile));
}

/// The backing file's mtime, as the tier shows it (no store in between).
fn backing_mtime(t: &TestStore) -> SystemTime {
    std::fs::metadata(t.tier(0).join("f"))
        .unwrap()
        .modified()
        .unwrap()
}

fn read(s: &Store, ino: Ino, offset: u64, len: u32) -> Vec<u8> {
    let fh = s.open_file(ino, libc::O_RDONLY, false).unwrap().fh;
    let d = s.read(fh, offset, len).unwrap();
    s.release(fh).unwrap();
    d
}

#[test]
fn a_crash_between_a_fetched_write_and_the_mtime_restore_is_undone_at_restart() {
    let mut t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    assert_eq!(f.mtime, source_mtime());
    assert_eq!(
        backing_mtime(&t),
        source_mtime(),
        "created with the source's mtime"
    );

    // The first unit is written, then the "crash" comes before the mtime goes back.
    t.s().set_fail_point(Some(FailPoint::StubAfterWrite));
    let fh = t.s().open_file(f.ino, libc::O_RDONLY, false).unwrap().fh;
    assert!(
        t.s().read(fh, 0, 4096).is_err(),
        "the injected crash fails the read"
    );
    t.s().release(fh).unwrap();
    assert_ne!(
        backing_mtime(&t),
        source_mtime(),
        "the fetch's write left the time of the write on the backing file"
    );
    // Even now a client sees the source's time, not the fetch's.
    assert_eq!(t.s().getattr(f.ino, None).unwrap().mtime, source_mtime());

    let s = t.crash_and_reopen();
    assert_eq!(
        backing_mtime(&t),
        source_mtime(),
        "start-up recovery put the pending mtime back"
    );
    attach(&s);
    assert_eq!(s.getattr(f.ino, None).unwrap().mtime, source_mtime());
    // The rest of the migration completes the file with the source's time and bytes.
    let all = read(&s, f.ino, 0, SIZE as u32);
    assert!(all.iter().enumerate().all(|(i, b)| *b == byte_at(i as u64)));
    assert!(s.stub_state(f.ino).is_complete());
    assert_eq!(s.getattr(f.ino, None).unwrap().mtime, source_mtime());
    assert_eq!(backing_mtime(&t), source_mtime());
    // Complete: no pending times survive a restart either.
    drop(s);
    let s = t.crash_and_reopen();
    assert!(s.stub_state(f.ino).is_complete());
    assert_eq!(s.getattr(f.ino, None).unwrap().mtime, source_mtime());
}

#[test]
fn a_client_write_into_a_partial_file_keeps_its_mtime_through_later_fetches() {
    let mut t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    // Partial: the first unit is fetched.
    assert_eq!(
        read(t.s(), f.ino, 0, 16),
        (0..16).map(byte_at).collect::<Vec<_>>()
    );
    assert_eq!(t.s().getattr(f.ino, None).unwrap().mtime, source_mtime());

    // A client writes into the fetched unit: a modification.
    let o = t.s().open_file(f.ino, libc::O_WRONLY, false).unwrap();
    t.s().write(o.fh, 10, b"client").unwrap();
    t.s().release(o.fh).unwrap();
    let written = t.s().getattr(f.ino, None).unwrap().mtime;
    assert!(written > source_mtime() + Duration::from_secs(3600));

    // Later fetches (a unit, then, after a crash, the rest) keep the client's time.
    read(t.s(), f.ino, UNIT, 16);
    assert_eq!(t.s().getattr(f.ino, None).unwrap().mtime, written);
    let s = t.crash_and_reopen();
    assert_eq!(
        backing_mtime(&t),
        written,
        "no source time put back at start-up"
    );
    attach(&s);
    let all = read(&s, f.ino, 0, SIZE as u32);
    assert_eq!(&all[10..16], b"client");
    assert_eq!(all[2 * UNIT as usize + 5], byte_at(2 * UNIT + 5));
    assert!(s.stub_state(f.ino).is_complete());
    assert_eq!(s.getattr(f.ino, None).unwrap().mtime, written);
}

#[test]
fn client_times_and_truncate_of_a_partial_file_replace_the_pending_mtime() {
    let mut t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    read(t.s(), f.ino, 0, 16);
    // utimens by a client: that time is kept through later fetches and a crash.
    let chosen = UNIX_EPOCH + Duration::new(1_500_000_000, 42);
    let set = SetAttr {
        mtime: Some(TimeSet::At(chosen)),
        ..SetAttr::default()
    };
    t.s().setattr(f.ino, &set, Caller::ROOT).unwrap();
    assert_eq!(t.s().getattr(f.ino, None).unwrap().mtime, chosen);
    read(t.s(), f.ino, UNIT, 16);
    assert_eq!(t.s().getattr(f.ino, None).unwrap().mtime, chosen);
    t.s().set_fail_point(Some(FailPoint::StubAfterWrite));
    let fh = t.s().open_file(f.ino, libc::O_RDONLY, false).unwrap().fh;
    assert!(t.s().read(fh, 2 * UNIT, 16).is_err());
    t.s().release(fh).unwrap();
    let s = t.crash_and_reopen();
    assert_eq!(
        backing_mtime(&t),
        chosen,
        "the client's time is the pending one now"
    );
    attach(&s);

    // A truncate is a modification too: its time holds afterwards.
    let set = SetAttr {
        size: Some(2 * UNIT + 100),
        ..SetAttr::default()
    };
    s.setattr(f.ino, &set, Caller::ROOT).unwrap();
    let truncated = s.getattr(f.ino, None).unwrap().mtime;
    assert!(truncated > chosen);
    let all = read(&s, f.ino, 0, (2 * UNIT + 100) as u32);
    assert_eq!(all.len() as u64, 2 * UNIT + 100);
    assert_eq!(all[(2 * UNIT + 99) as usize], byte_at(2 * UNIT + 99));
    assert!(s.stub_state(f.ino).is_complete());
    assert_eq!(s.getattr(f.ino, None).unwrap().mtime, truncated);
}

/// A client write that arrives while a fetch has written its unit but not yet put the
/// mtime back: the fetch read the times to keep before the write, so putting them back
/// after it would replace the client's mtime by the older one. The fetch is paused at
/// that point (`Store::set_stub_write_hook`) while the client writes.
#[test]
fn a_client_write_during_a_fetch_keeps_its_mtime() {
    use std::sync::mpsc;
    let t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    read(t.s(), f.ino, 0, 16);
    // A first client write: the file's own times hold from now on, so the next fetch
    // reads the times it keeps from the file.
    let o = t.s().open_file(f.ino, libc::O_WRONLY, false).unwrap();
    t.s().write(o.fh, 10, b"first").unwrap();
    let first = t.s().getattr(f.ino, None).unwrap().mtime;
    // The next write's mtime must be later than this one's.
    std::thread::sleep(Duration::from_millis(30));

    let (written_tx, written_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let written_tx = std::sync::Mutex::new(written_tx);
    t.s().set_stub_write_hook(Some(Arc::new(move |_| {
        let _ = written_tx.lock().unwrap().send(());
        let _ = go_rx.lock().unwrap().recv_timeout(Duration::from_secs(10));
    })));
    std::thread::scope(|sc| {
        // The crawler fetches the second unit.
        let fetch = sc.spawn(|| {
            let data: Vec<u8> = (UNIT..2 * UNIT).map(byte_at).collect();
            t.s().stub_write(f.ino, UNIT, &data)
        });
        written_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the fetch reached its pause");
        // The client writes into the fetched first unit meanwhile.
        let client = sc.spawn(|| t.s().write(o.fh, 20, b"second"));
        // Give the client time to finish if nothing holds it (it must not finish
        // before the fetch has put its times back).
        let deadline = std::time::Instant::now() + Duration::from_millis(500);
        while !client.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        go_tx.send(()).unwrap();
        fetch.join().unwrap().unwrap();
        client.join().unwrap().unwrap();
    });
    t.s().set_stub_write_hook(None);
    t.s().release(o.fh).unwrap();
    let after = t.s().getattr(f.ino, None).unwrap().mtime;
    assert!(
        after > first,
        "the client's second write keeps its mtime ({after:?}), not the one from before it ({first:?})"
    );
    assert_eq!(backing_mtime(&t), after);
    let all = read(t.s(), f.ino, 0, SIZE as u32);
    assert_eq!(&all[10..15], b"first");
    assert_eq!(&all[20..26], b"second");
    assert_eq!(all[UNIT as usize + 7], byte_at(UNIT + 7));
    assert_eq!(t.s().getattr(f.ino, None).unwrap().mtime, after);
}

#[test]
fn a_hole_punched_into_an_unfetched_range_stays_zero_and_keeps_the_clients_mtime() {
    let mut t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    // Partial: only the first unit is fetched.
    read(t.s(), f.ino, 0, 16);
    assert!(!t.s().stub_state(f.ino).is_complete());

    // A client punches a hole into the second unit, which was never fetched.
    let hole = (UNIT + 4096, 8192);
    let o = t.s().open_file(f.ino, libc::O_RDWR, false).unwrap();
    t.s()
        .fallocate(
            o.fh,
            hole.0,
            hole.1,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        )
        .unwrap();
    t.s().release(o.fh).unwrap();
    let punched = t.s().getattr(f.ino, None).unwrap().mtime;
    assert!(
        punched > source_mtime() + Duration::from_secs(3600),
        "punching a hole is a modification"
    );

    // The rest of the migration, after a crash, neither fetches the source's bytes back
    // over the hole nor puts the source's time back.
    let s = t.crash_and_reopen();
    attach(&s);
    let all = read(&s, f.ino, 0, SIZE as u32);
    assert!(s.stub_state(f.ino).is_complete());
    for (i, b) in all.iter().enumerate() {
        let i = i as u64;
        let want = if (hole.0..hole.0 + hole.1).contains(&i) {
            0
        } else {
            byte_at(i)
        };
        assert_eq!(*b, want, "byte {i}");
    }
    assert_eq!(s.getattr(f.ino, None).unwrap().mtime, punched);
}

/// The source's bytes of `[start, end)`.
fn source_bytes(start: u64, end: u64) -> Vec<u8> {
    (start..end).map(byte_at).collect()
}

/// A fetch reads the source with no lock on the file; a client that truncates and
/// rewrites the file meanwhile must keep its bytes and its size: the fetch writes only
/// what is still missing when it writes, and never past the file's current size.
#[test]
fn a_fetch_that_lands_after_a_truncate_and_rewrite_keeps_the_clients_bytes() {
    let t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    assert_eq!(t.s().stub_state(f.ino).missing, vec![(0, SIZE)]);
    // The fetch of the first unit has read the source (below); the client, meanwhile,
    // truncates the file to nothing and writes three bytes (an editor saving it).
    let fetched = source_bytes(0, UNIT);
    t.s()
        .setattr(
            f.ino,
            &SetAttr {
                size: Some(0),
                ..SetAttr::default()
            },
            Caller::ROOT,
        )
        .unwrap();
    let o = t.s().open_file(f.ino, libc::O_WRONLY, false).unwrap();
    t.s().write(o.fh, 0, b"new").unwrap();
    t.s().release(o.fh).unwrap();
    // Now the fetch writes what it read.
    let written = t.s().stub_write_counted(f.ino, 0, &fetched).unwrap();
    assert_eq!(written, 0, "nothing of the unit is missing any more");
    assert_eq!(t.s().getattr(f.ino, None).unwrap().size, 3);
    assert_eq!(std::fs::read(t.tier(0).join("f")).unwrap(), b"new");
    assert_eq!(t.get("f"), b"new");
    assert!(t.s().stub_state(f.ino).is_complete());
}

/// A truncate down to the middle of a unit, then a write past the new end of file: the
/// fetch writes the part below the truncation only (still missing), leaves the gap the
/// client's write made as zeros and the client's bytes as they are.
#[test]
fn a_fetch_after_a_truncate_and_a_write_past_eof_writes_only_the_missing_head() {
    let t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    let cut = 1000u64;
    let far = 2 * UNIT + 10;
    let fetched = source_bytes(0, UNIT);
    t.s()
        .setattr(
            f.ino,
            &SetAttr {
                size: Some(cut),
                ..SetAttr::default()
            },
            Caller::ROOT,
        )
        .unwrap();
    assert_eq!(t.s().stub_state(f.ino).missing, vec![(0, cut)]);
    let o = t.s().open_file(f.ino, libc::O_WRONLY, false).unwrap();
    t.s().write(o.fh, far, b"tail").unwrap();
    t.s().release(o.fh).unwrap();
    let written = t.s().stub_write_counted(f.ino, 0, &fetched).unwrap();
    assert_eq!(written, cut, "only the still-missing head is written");
    assert!(t.s().stub_state(f.ino).is_complete());
    let all = t.get("f");
    assert_eq!(all.len() as u64, far + 4);
    assert!(
        all[..cut as usize] == fetched[..cut as usize],
        "fetched head"
    );
    assert!(
        all[cut as usize..far as usize].iter().all(|b| *b == 0),
        "the range the client cut stays zero"
    );
    assert_eq!(&all[far as usize..], b"tail");
}

/// A fetch resolves its file's backing path and opens it; a client's rename swap in
/// between (the file renamed away, another file renamed onto its name) must not make the
/// fetch write into the other file. The swap is made from inside the fetch, at the
/// point just before it resolves the path (`Store::set_stub_resolve_hook`).
#[test]
fn a_fetch_writes_into_its_own_file_when_a_rename_swaps_its_name_meanwhile() {
    let t = migrating_store();
    let f = t.lookup_path("f").unwrap();
    let other = b"another file, renamed onto f's name".to_vec();
    t.put("g", &other);
    let s = t.s().clone();
    Store::set_stub_resolve_hook(Some(Box::new(move |_| {
        s.rename(ROOT_INO, "f".as_ref(), ROOT_INO, "f.moved".as_ref(), 0)
            .unwrap();
        s.rename(ROOT_INO, "g".as_ref(), ROOT_INO, "f".as_ref(), 0)
            .unwrap();
    })));
    let fetched = source_bytes(0, UNIT);
    let r = t.s().stub_write_counted(f.ino, 0, &fetched);
    Store::set_stub_resolve_hook(None);
    assert_eq!(r.unwrap(), UNIT);
    assert!(t.get("f") == other, "the file now named f is untouched");
    assert!(std::fs::read(t.tier(0).join("f")).unwrap() == other);
    assert_eq!(t.lookup_path("f.moved").unwrap().ino, f.ino);
    assert!(
        read(t.s(), f.ino, 0, UNIT as u32) == fetched,
        "the fetched bytes are in the renamed file"
    );
    assert_eq!(t.s().stub_state(f.ino).missing, vec![(UNIT, SIZE)]);
}

/// Collapsing a range out of a file, or inserting one, changes its size as the store
/// accounts it (a fetch writes nothing past the size it finds, so that size must be the
/// file's; the tier's usage follows it).
#[test]
fn collapse_and_insert_range_change_the_files_size() {
    let t = TestStore::new(&["64MiB"]);
    let data = pattern(64 << 10, 9);
    let ino = t.put("c", &data);
    let used = || t.s().status().tiers[0].used;
    let before = used();
    let o = t.s().open_file(ino, libc::O_RDWR, false).unwrap();
    match t
        .s()
        .fallocate(o.fh, 0, 4096, libc::FALLOC_FL_COLLAPSE_RANGE)
    {
        Err(e) if e.errno() == libc::EOPNOTSUPP => {
            eprintln!("the tier's file system cannot collapse ranges: nothing to check");
            t.s().release(o.fh).unwrap();
            return;
        }
        r => r.unwrap(),
    }
    assert_eq!(t.s().getattr(ino, None).unwrap().size, 60 << 10);
    assert_eq!(used(), before - 4096, "usage after collapsing 4 KiB");
    t.s()
        .fallocate(o.fh, 8192, 8192, libc::FALLOC_FL_INSERT_RANGE)
        .unwrap();
    t.s().release(o.fh).unwrap();
    assert_eq!(t.s().getattr(ino, None).unwrap().size, 68 << 10);
    assert_eq!(used(), before + 4096, "usage after inserting 8 KiB");
    let got = t.get("c");
    assert_eq!(got.len(), 68 << 10);
    assert!(
        got[..8192] == data[4096..4096 + 8192],
        "head after the collapse"
    );
    assert!(got[8192..16384].iter().all(|b| *b == 0), "inserted zeros");
    assert!(got[16384..] == data[4096 + 8192..], "tail shifted");
}
