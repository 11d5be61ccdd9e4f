//! A client fsync of a partially fetched file makes its stub state durable.
//!
//! The store's database commits without fsync (`synchronous=NORMAL`); after a power loss
//! an older stub row could come back and a later fetch would overwrite bytes the client
//! wrote and synced. What survives a power loss is what is in the main database file or
//! fsynced in its WAL; the test looks at the main database file alone (as if the WAL
//! were lost) right after the client's fsync, and at the filler's own sync.

mod common;

use common::TestStore;
use kaiso_store::{FileKind, FsResult, Ino, Store, StubEntry, StubFiller};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const SIZE: u64 = 300_000;

/// The remote file's modification time (a fixed one, unlike the time of its stub's creation).
fn remote_mtime() -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000)
}

fn byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// A remote directory holding one file whose bytes are computed; counts state syncs
/// (each waits while a test holds `sync_gate`).
#[derive(Default)]
struct Remote {
    state_syncs: AtomicU64,
    sync_gate: Mutex<()>,
}

impl StubFiller for Remote {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        let e = StubEntry {
            kind: FileKind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            size: SIZE,
            mtime: remote_mtime(),
            atime: remote_mtime(),
            symlink_target: None,
            rdev: 0,
            unlisted: false,
        };
        store.stub_create(ino, "f".as_ref(), &e)?;
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
        let data: Vec<u8> = (offset..offset + len).map(byte).collect();
        store.stub_write(ino, offset, &data)
    }

    fn sync_state(&self, _store: &Store, _ino: Ino) -> FsResult<()> {
        self.state_syncs.fetch_add(1, Ordering::SeqCst);
        drop(self.sync_gate.lock().unwrap_or_else(|e| e.into_inner()));
        Ok(())
    }
}

/// The missing ranges of `ino` as the main database file alone holds them (no WAL):
/// `None` when it has no row.
fn durable_missing(state_dir: &Path, ino: Ino) -> Option<Vec<(u64, u64)>> {
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(state_dir.join("kaiso.db"), copy.path().join("kaiso.db")).unwrap();
    let conn = rusqlite::Connection::open(copy.path().join("kaiso.db")).unwrap();
    let blob: Option<Vec<u8>> = conn
        .query_row(
            "SELECT missing FROM stubs WHERE ino=?1",
            [ino as i64],
            |r| r.get(0),
        )
        .ok();
    blob.map(|b| {
        b.chunks_exact(16)
            .map(|c| {
                (
                    u64::from_le_bytes(c[..8].try_into().unwrap()),
                    u64::from_le_bytes(c[8..].try_into().unwrap()),
                )
            })
            .collect()
    })
}

/// A store with the unlisted directory `mig` whose listing `remote` gives.
fn store_with_remote() -> (TestStore, Arc<Remote>) {
    let t = TestStore::new(&["64MiB"]);
    let s = t.s();
    let dir = s
        .mkdir(
            kaiso_store::ROOT_INO,
            "mig".as_ref(),
            0o755,
            0,
            kaiso_store::Caller::ROOT,
        )
        .unwrap()
        .ino;
    s.stub_mark(
        dir,
        kaiso_store::StubState {
            unlisted_dir: true,
            missing: vec![],
            times: None,
        },
    )
    .unwrap();
    let remote = Arc::new(Remote::default());
    s.set_stub_filler(remote.clone());
    (t, remote)
}

/// The first look at a file the listing created shows the remote's times, not those the
/// stub had when it was created (before its times were set).
#[test]
fn a_listed_stub_shows_the_remote_mtime() {
    let (t, _remote) = store_with_remote();
    assert_eq!(t.lookup_path("mig/f").unwrap().mtime, remote_mtime());
}

#[test]
fn client_fsync_of_a_partial_file_makes_its_ranges_durable() {
    let (t, remote) = store_with_remote();
    let s = t.s().clone();
    let ino = t.lookup_path("mig/f").unwrap().ino;
    let state_dir = t.dir.path().join("state");

    // A client writes into the middle: the overlapped range is fetched first, then
    // overwritten; the rest stays missing.
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.write(o.fh, 100_000, b"client bytes").unwrap();
    let expect = vec![(0, 100_000), (100_012, SIZE)];
    assert_eq!(s.stub_state(ino).missing, expect);
    assert_eq!(remote.state_syncs.load(Ordering::SeqCst), 0);

    s.fsync(o.fh, true).unwrap();
    assert_eq!(
        durable_missing(&state_dir, ino).as_deref(),
        Some(&expect[..]),
        "after fsync the main database file holds the file's current missing ranges"
    );
    assert_eq!(
        remote.state_syncs.load(Ordering::SeqCst),
        1,
        "the filler synced its own state"
    );

    // Completing the file and fsyncing again leaves no row behind (no stale ranges that
    // a later fetch could write over the client's bytes).
    let all = s.read(o.fh, 0, SIZE as u32).unwrap();
    assert_eq!(&all[100_000..100_012], b"client bytes");
    assert_eq!(all[0], byte(0));
    assert_eq!(all[SIZE as usize - 1], byte(SIZE - 1));
    assert!(s.stub_state(ino).missing.is_empty());
    s.fsync(o.fh, false).unwrap();
    assert_eq!(durable_missing(&state_dir, ino), None);
    s.release(o.fh).unwrap();
}

/// An fsync pays the database checkpoint (and the filler's sync) only when the file's
/// stub state changed since the last one; rewriting bytes already present, or syncing a
/// file that never was a stub, syncs the data only. The guarantee is unchanged: after
/// each fsync the main database file holds the file's current missing ranges.
#[test]
fn fsync_with_no_stub_change_makes_no_checkpoint() {
    let (t, remote) = store_with_remote();
    let s = t.s().clone();
    let ino = t.lookup_path("mig/f").unwrap().ino;
    let state_dir = t.dir.path().join("state");
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.write(o.fh, 100_000, b"client bytes").unwrap();
    s.fsync(o.fh, true).unwrap();
    let (ckpts, syncs) = (
        s.fsync_checkpoints(),
        remote.state_syncs.load(Ordering::SeqCst),
    );
    assert_eq!(
        (ckpts, syncs),
        (1, 1),
        "the first fsync makes the state durable"
    );

    // Present bytes rewritten: the missing ranges are what the last fsync made durable.
    s.write(o.fh, 100_000, b"CLIENT BYTES").unwrap();
    s.fsync(o.fh, true).unwrap();
    s.fsync(o.fh, false).unwrap();
    assert_eq!(
        s.fsync_checkpoints(),
        ckpts,
        "no checkpoint without a change"
    );
    assert_eq!(remote.state_syncs.load(Ordering::SeqCst), syncs);
    assert_eq!(
        durable_missing(&state_dir, ino).as_deref(),
        Some(&[(0, 100_000), (100_012, SIZE)][..])
    );
    assert_eq!(&s.read(o.fh, 100_000, 12).unwrap(), b"CLIENT BYTES");

    // A write into a missing range changes the state: the next fsync pays again.
    s.write(o.fh, 250_000, b"tail").unwrap();
    let expect = s.stub_state(ino).missing;
    assert!(expect.iter().all(|&(a, b)| b <= 250_000 || a >= 250_004));
    s.fsync(o.fh, true).unwrap();
    assert_eq!(s.fsync_checkpoints(), ckpts + 1);
    assert_eq!(remote.state_syncs.load(Ordering::SeqCst), syncs + 1);
    assert_eq!(durable_missing(&state_dir, ino), Some(expect));
    s.fsync(o.fh, true).unwrap();
    assert_eq!(s.fsync_checkpoints(), ckpts + 1);
    s.release(o.fh).unwrap();

    // A file that never was a stub: its fsyncs never checkpoint, migration or not.
    let (attr, o) = s
        .create(
            kaiso_store::ROOT_INO,
            "plain".as_ref(),
            0o644,
            0,
            libc::O_RDWR,
            kaiso_store::Caller::ROOT,
            false,
        )
        .unwrap();
    s.write(o.fh, 0, b"plain data").unwrap();
    s.fsync(o.fh, false).unwrap();
    assert_eq!(s.fsync_checkpoints(), ckpts + 1, "{attr:?}");
    assert_eq!(remote.state_syncs.load(Ordering::SeqCst), syncs + 1);
    s.release(o.fh).unwrap();
}

/// After a restart the stub state read back from the database may not be on disk yet
/// (its last commits were never synced): the first fsync of a stub makes it durable,
/// the next ones with no change do not checkpoint again.
#[test]
fn first_fsync_after_a_restart_makes_the_restored_state_durable() {
    let (mut t, remote) = store_with_remote();
    let ino = t.lookup_path("mig/f").unwrap().ino;
    {
        let s = t.s().clone();
        let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
        s.write(o.fh, 0, b"head").unwrap();
        s.release(o.fh).unwrap();
    }
    // A crash: nothing was fsynced.
    let s = t.crash_and_reopen();
    s.set_stub_filler(remote.clone());
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.fsync(o.fh, true).unwrap();
    assert_eq!(s.fsync_checkpoints(), 1);
    assert_eq!(
        durable_missing(&t.dir.path().join("state"), ino),
        Some(s.stub_state(ino).missing)
    );
    s.fsync(o.fh, true).unwrap();
    assert_eq!(s.fsync_checkpoints(), 1);
    s.release(o.fh).unwrap();
}

/// Two fsyncs of a changed file at once: the one that finds the change already taken by
/// the other returns only once that other one has made it durable.
#[test]
fn an_fsync_waits_for_a_concurrent_one_that_took_the_change() {
    let (t, remote) = store_with_remote();
    let s = t.s().clone();
    let ino = t.lookup_path("mig/f").unwrap().ino;
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.write(o.fh, 1_000, b"client bytes").unwrap();
    let gate = remote.sync_gate.lock().unwrap();
    let first = {
        let s = s.clone();
        std::thread::spawn(move || s.fsync(o.fh, true))
    };
    // The first fsync took the change and now waits in the filler's sync.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while remote.state_syncs.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the first fsync never synced"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let second = {
        let s = s.clone();
        std::thread::spawn(move || s.fsync(o.fh, true))
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        !second.is_finished(),
        "returned before the change it covers was durable"
    );
    drop(gate);
    assert_eq!(first.join().unwrap(), Ok(()));
    assert_eq!(second.join().unwrap(), Ok(()));
    assert_eq!(s.fsync_checkpoints(), 1);
    s.release(o.fh).unwrap();
}
