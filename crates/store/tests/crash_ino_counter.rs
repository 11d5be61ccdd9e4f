//! The inode-number counter after a crash (kill -9 of the process holding the store).
//!
//! Directory numbers and the numbers of remapped files are allocated from a counter kept
//! in the store database (`meta.next_ino`). An allocation writes the row that uses the
//! number (`dirs`, `remap`) and the advanced counter in two commits; a kill between the
//! two left a row holding a number the counter would hand out again. The next
//! allocation then gave a second object the same number: `dirs` and `remap` keep inode
//! numbers unique (`INSERT OR REPLACE` deleted the first object's row), and every row
//! keyed by the number (stub rows, migration rows, pins) passed to the other object.
//!
//! Here the window is reproduced exactly (the counter set back to the number its row
//! holds, as such a kill leaves it); the next allocations must give new numbers and the
//! first object must keep its own.

mod common;

use common::*;
use kaiso_store::{Caller, ROOT_INO};
use std::ffi::OsStr;

/// Sets the stored counter as a kill between a row's commit and the counter's left it.
fn set_counter(t: &TestStore, value: u64) {
    let db = rusqlite::Connection::open(t.dir.path().join("state/kaiso.db")).unwrap();
    db.execute(
        "UPDATE meta SET value=?1 WHERE key='next_ino'",
        [value.to_string()],
    )
    .unwrap();
}

fn counter(t: &TestStore) -> u64 {
    let db = rusqlite::Connection::open(t.dir.path().join("state/kaiso.db")).unwrap();
    db.query_row("SELECT value FROM meta WHERE key='next_ino'", [], |r| {
        r.get::<_, String>(0)
    })
    .unwrap()
    .parse()
    .unwrap()
}

#[test]
fn a_number_whose_counter_commit_a_crash_lost_is_not_handed_out_again() {
    let mut t = TestStore::new(&["1GiB"]);
    let a = t
        .s()
        .mkdir(ROOT_INO, OsStr::new("a"), 0o755, 0, Caller::ROOT)
        .unwrap()
        .ino;
    t.put("a/x", b"first directory's file");
    assert!(counter(&t) > a, "the counter is past the number just used");
    // Crash in the window: the directory's row is there, the counter is not past it.
    drop(t.store.take());
    set_counter(&t, a);
    for round in 0..2 {
        let s = t.crash_and_reopen();
        assert_eq!(
            t.lookup_path("a").unwrap().ino,
            a,
            "open {round}: a keeps its number"
        );
        if round == 0 {
            let b = s
                .mkdir(ROOT_INO, OsStr::new("b"), 0o755, 0, Caller::ROOT)
                .unwrap()
                .ino;
            assert_ne!(b, a, "a new directory got the number of an existing one");
            t.put("b/y", b"second directory's file");
        }
        assert_eq!(t.get("a/x"), b"first directory's file", "open {round}");
        assert_eq!(t.get("b/y"), b"second directory's file", "open {round}");
        assert_ne!(t.lookup_path("b").unwrap().ino, a, "open {round}");
    }
}

/// The remapped-file side of the same window, as the kill test with a writing client
/// meets it: a client's file is created while an unlinked file that the kernel still
/// references (a lookup not forgotten) holds its natural number, so it gets a remapped
/// number from the counter. A crash between the remap row's commit and the counter's,
/// then the same situation again after the restart: the old code gave the new file
/// the same number, its name joined the first file's inode, and every read, write or
/// truncate through the new name went to the first file (a client file read back
/// empty after an O_TRUNC meant for another; an untouched file showing another's bytes).
#[test]
fn a_file_remapped_after_a_crash_in_the_window_keeps_its_own_bytes() {
    if !loop_ext4::available() {
        return;
    }
    // A journalled ext4 with a tiny inode table hands a freed inode number out again
    // at once (first free bit), as the client's create needs it here.
    let scratch = tempfile::tempdir().unwrap();
    let ext4 = loop_ext4::LoopExt4::with_mkfs_args(scratch.path(), 32 << 20, &["-N", "128"]);
    let mut t = TestStore::new_in(&ext4.mnt, &["16MiB"]);
    // `put` creates through `Store::create`, which counts a kernel lookup the test
    // never forgets: unlinked, the file keeps its number while its inode is freed.
    let remapped = |t: &TestStore, gone: &str, new: &str, data: &[u8]| {
        t.put(gone, b"unlinked");
        let (dir, name) = gone.rsplit_once('/').unwrap();
        let d = t.lookup_path(dir).unwrap().ino;
        t.s().unlink(d, OsStr::new(name)).unwrap();
        let ino = t.put(new, data);
        (ino < 1 << 48).then_some(ino)
    };
    let Some(first) = remapped(&t, "d/gone1", "d/first", b"first file's bytes") else {
        eprintln!("SKIP: the file system did not hand the freed inode out again");
        return;
    };
    // Crash in the window: the remap row is there, the counter is not past it.
    drop(t.store.take());
    set_counter(&t, first);
    t.crash_and_reopen();
    assert_eq!(t.lookup_path("d/first").unwrap().ino, first);
    let Some(second) = remapped(&t, "d/gone2", "d/second", b"second") else {
        eprintln!("SKIP: the file system did not hand the freed inode out again");
        return;
    };
    assert_ne!(second, first, "two files got one number");
    // Through the second name, as a client's O_TRUNC rewrite does.
    let o = t
        .s()
        .open_file(second, libc::O_WRONLY | libc::O_TRUNC, false)
        .unwrap();
    t.s().release(o.fh).unwrap();
    for round in 0..2 {
        assert_eq!(t.get("d/first"), b"first file's bytes", "open {round}");
        assert_eq!(t.get("d/second"), b"", "open {round}");
        t.crash_and_reopen();
    }
}

/// A moved file keeps its number, a natural one (tier slot in the high bits) that its
/// remap row then holds: the counter raised at open must not jump past it into the
/// natural range, where a new directory's number could equal a file's.
#[test]
fn a_moved_files_number_does_not_move_the_counter_into_the_natural_range() {
    let mut t = TestStore::new(&["1GiB", "1GiB"]);
    t.put("d/file", b"moved");
    t.s().move_now("d/file".as_ref(), "t1").unwrap();
    let file = t.lookup_path("d/file").unwrap().ino;
    assert!(file >= 1 << 48, "a natural number: {file:#x}");
    t.crash_and_reopen();
    let d = t
        .s()
        .mkdir(ROOT_INO, OsStr::new("e"), 0o755, 0, Caller::ROOT)
        .unwrap()
        .ino;
    assert!(d < 1 << 48, "a directory number from the counter: {d:#x}");
    assert_eq!(t.lookup_path("d/file").unwrap().ino, file);
    assert_eq!(t.get("d/file"), b"moved");
}
