//! A write that has to spill a file with no name left (unlinked while open) moves it to
//! a hidden orphan copy on another tier instead of failing; the copy goes at the last
//! close, and a crash during such a move leaves nothing behind after the restart.

mod common;

use common::{TestStore, pattern};
use kaiso_store::{FailPoint, FsError, Ino, ROOT_INO, Store};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;

/// A store whose fast tier (256 KiB) holds `fill` (100 000 bytes) and `name` (50 000).
fn store_with(name: &str) -> (TestStore, Arc<Store>, Ino) {
    let t = TestStore::new(&["256KiB", "4MiB"]);
    let s = t.s().clone();
    t.put("fill", &pattern(100_000, 1));
    let ino = t.put(name, &pattern(50_000, 2));
    (t, s, ino)
}

/// Every entry (files and directories, hidden ones included) under tier `i`, relative.
fn tier_entries(t: &TestStore, i: usize) -> Vec<String> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(root.join(rel)) else {
            return;
        };
        for e in rd.flatten() {
            let child = rel.join(e.file_name());
            out.push(child.display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(root, &child, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&t.tier(i), Path::new(""), &mut out);
    out.sort();
    out
}

fn used(t: &TestStore) -> Vec<u64> {
    t.s().status().tiers.iter().map(|x| x.used).collect()
}

/// Reads `len` bytes of handle `fh` from 0.
fn read_all(t: &TestStore, fh: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < len {
        let b = t.s().read(fh, out.len() as u64, 1 << 20).unwrap();
        if b.is_empty() {
            break;
        }
        out.extend_from_slice(&b);
    }
    out
}

#[test]
fn an_unlinked_open_file_spills_and_leaves_nothing_after_close() {
    let (t, s, ino) = store_with("victim");
    let writer = s.open_file(ino, libc::O_RDWR, false).unwrap();
    let reader = s.open_file(ino, libc::O_RDONLY, false).unwrap();
    s.unlink(ROOT_INO, OsStr::new("victim")).unwrap();
    // Still open: its data still takes room on its tier.
    assert_eq!(used(&t), vec![150_000, 0]);

    // Past the fast tier's room: the write spills the nameless file to the next tier.
    let more = pattern(300_000, 3);
    assert_eq!(s.write(writer.fh, 50_000, &more).unwrap(), 300_000);
    let mut expect = pattern(50_000, 2);
    expect.extend_from_slice(&more);
    // Every handle follows the move, the reader included.
    assert_eq!(read_all(&t, reader.fh, 350_000), expect);
    assert_eq!(read_all(&t, writer.fh, 350_000), expect);
    assert_eq!(used(&t), vec![100_000, 350_000]);
    let a = s.getattr(ino, Some(writer.fh)).unwrap();
    assert_eq!((a.size, a.nlink), (350_000, 0));
    // The hidden copy is not visible through the store.
    let listed: Vec<String> = t
        .names(ROOT_INO)
        .into_iter()
        .filter(|n| n != "." && n != "..")
        .collect();
    assert_eq!(listed, vec!["fill".to_string()]);
    assert_eq!(
        s.lookup(ROOT_INO, OsStr::new(".kaiso-tmp-orphans"))
            .unwrap_err(),
        FsError::NOENT
    );
    assert_eq!(tier_entries(&t, 0), vec!["fill"]);
    assert_eq!(tier_entries(&t, 1).len(), 2, "{:?}", tier_entries(&t, 1));

    // Writes go on through both handles' new copy; one close keeps it for the other.
    s.write(writer.fh, 0, b"still writable").unwrap();
    s.release(writer.fh).unwrap();
    assert_eq!(&read_all(&t, reader.fh, 14)[..14], b"still writable");
    assert_eq!(tier_entries(&t, 1).len(), 2);
    s.release(reader.fh).unwrap();
    assert_eq!(tier_entries(&t, 0), vec!["fill"]);
    assert!(tier_entries(&t, 1).is_empty(), "{:?}", tier_entries(&t, 1));
    assert_eq!(used(&t), vec![100_000, 0]);
}

/// An orphan that outgrows its second tier too moves again, from its hidden copy.
#[test]
fn an_orphan_spills_again_from_its_hidden_copy() {
    let t = TestStore::new(&["128KiB", "256KiB", "4MiB"]);
    let s = t.s().clone();
    let ino = t.put("victim", &pattern(60_000, 4));
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.unlink(ROOT_INO, OsStr::new("victim")).unwrap();
    let a = pattern(140_000, 5);
    s.write(o.fh, 60_000, &a).unwrap();
    assert_eq!(used(&t), vec![0, 200_000, 0]);
    let b = pattern(300_000, 6);
    s.write(o.fh, 200_000, &b).unwrap();
    assert_eq!(used(&t), vec![0, 0, 500_000]);
    let mut expect = pattern(60_000, 4);
    expect.extend_from_slice(&a);
    expect.extend_from_slice(&b);
    assert_eq!(read_all(&t, o.fh, 500_000), expect);
    assert!(tier_entries(&t, 0).is_empty());
    assert!(tier_entries(&t, 1).is_empty(), "{:?}", tier_entries(&t, 1));
    s.release(o.fh).unwrap();
    for i in 0..3 {
        assert!(
            tier_entries(&t, i).is_empty(),
            "tier {i}: {:?}",
            tier_entries(&t, i)
        );
    }
    assert_eq!(used(&t), vec![0, 0, 0]);
}

/// Opens `ino`, unlinks its name `a`, writes 300 000 bytes at 50 000 (past the fast tier's
/// room, so the file spills) and closes it: the contents the file must now have.
fn grow_after_unlinking_a(s: &Store, ino: Ino) -> Vec<u8> {
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.unlink(ROOT_INO, OsStr::new("a")).unwrap();
    let more = pattern(300_000, 3);
    s.write(o.fh, 50_000, &more).unwrap();
    s.release(o.fh).unwrap();
    let mut expect = pattern(50_000, 2);
    expect.extend_from_slice(&more);
    expect
}

/// A file with two names, opened through the one that is then removed, spills under the
/// name it still has.
#[test]
fn a_hard_linked_file_whose_open_name_is_gone_spills_under_its_other_name() {
    let (t, s, ino) = store_with("a");
    s.link(ino, ROOT_INO, OsStr::new("b")).unwrap();
    let expect = grow_after_unlinking_a(&s, ino);
    assert_eq!(t.get("b"), expect);
    assert_eq!(t.holders("b", 2), vec![1]);
    assert_eq!(tier_entries(&t, 0), vec!["fill"]);
    assert_eq!(tier_entries(&t, 1), vec!["b"]);
    assert_eq!(used(&t), vec![100_000, 350_000]);
}

/// A crash at any step of an orphan's move: after the restart no copy of it is left on
/// any tier (nothing can hold it open any more) and the usage is that of the named files.
#[test]
fn a_crash_during_an_orphan_move_leaves_no_orphan_after_restart() {
    for fp in [
        Some(FailPoint::AfterJournal),
        Some(FailPoint::AfterCopy),
        Some(FailPoint::AfterVerify),
        Some(FailPoint::AfterRename),
        Some(FailPoint::AfterSwitch),
        Some(FailPoint::AfterDelete),
        // The move done, the file still open at the crash.
        None,
    ] {
        let (mut t, s, ino) = store_with("victim");
        let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
        s.unlink(ROOT_INO, OsStr::new("victim")).unwrap();
        s.set_fail_point(fp);
        assert_eq!(
            s.write(o.fh, 50_000, &pattern(300_000, 3)).is_err(),
            fp.is_some(),
            "{fp:?}: an injected crash stops the move"
        );
        if fp != Some(FailPoint::AfterJournal) {
            // The temporary copy or the hidden one is there at the crash.
            assert!(!tier_entries(&t, 1).is_empty(), "{fp:?}");
        }
        drop(s);
        let s = t.crash_and_reopen();
        assert_eq!(tier_entries(&t, 0), vec!["fill"], "{fp:?}");
        assert!(
            tier_entries(&t, 1).is_empty(),
            "{fp:?}: {:?}",
            tier_entries(&t, 1)
        );
        assert_eq!(used(&t), vec![100_000, 0], "{fp:?}");
        assert_eq!(t.get("fill"), pattern(100_000, 1));
        // The store works on: the next orphan spills normally.
        let ino = t.put("next", &pattern(10_000, 7));
        let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
        s.unlink(ROOT_INO, OsStr::new("next")).unwrap();
        s.write(o.fh, 10_000, &pattern(300_000, 8)).unwrap();
        s.release(o.fh).unwrap();
        assert!(tier_entries(&t, 1).is_empty(), "{fp:?}");
    }
}

/// `fsck` on a live store removes orphan copies no open file holds and keeps the others.
#[test]
fn fsck_removes_stray_orphans_and_keeps_held_ones() {
    let (t, s, ino) = store_with("victim");
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.unlink(ROOT_INO, OsStr::new("victim")).unwrap();
    s.write(o.fh, 50_000, &pattern(300_000, 3)).unwrap();
    let dir = t.tier(1).join(".kaiso-tmp-orphans");
    std::fs::write(dir.join("stray"), b"left by a crash").unwrap();
    let report = s.fsck().unwrap();
    assert_eq!(report.temp_removed, 1, "{report:?}");
    assert!(!dir.join("stray").exists());
    assert_eq!(used(&t), vec![100_000, 350_000]);
    let mut expect = pattern(50_000, 2);
    expect.extend_from_slice(&pattern(300_000, 3));
    assert_eq!(read_all(&t, o.fh, 350_000), expect);
    s.release(o.fh).unwrap();
    assert!(tier_entries(&t, 1).is_empty());
}

/// The file's last name goes while a spill is copying it: the move under way gives up
/// and the spill moves it again as a file with no name; the write succeeds either way.
#[test]
fn unlink_during_a_spill_still_lets_the_write_succeed() {
    for round in 0..8u64 {
        let t = TestStore::new(&["4MiB", "32MiB"]);
        let s = t.s().clone();
        t.put("fill", &pattern(1 << 20, 1));
        let ino = t.put("victim", &pattern(2 << 20, 2));
        let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
        let more = pattern(2 << 20, 3);
        let writer = {
            let (s, more) = (s.clone(), more.clone());
            std::thread::spawn(move || s.write(o.fh, 2 << 20, &more))
        };
        std::thread::sleep(std::time::Duration::from_micros(round * 500));
        s.unlink(ROOT_INO, OsStr::new("victim")).unwrap();
        assert_eq!(
            writer.join().unwrap(),
            Ok(2 << 20),
            "round {round}: the write must not fail"
        );
        let mut expect = pattern(2 << 20, 2);
        expect.extend_from_slice(&more);
        assert!(read_all(&t, o.fh, 4 << 20) == expect, "round {round}");
        s.release(o.fh).unwrap();
        assert_eq!(tier_entries(&t, 0), vec!["fill"], "round {round}");
        assert!(tier_entries(&t, 1).is_empty(), "round {round}");
        assert_eq!(used(&t), vec![1 << 20, 0], "round {round}");
    }
}

/// A file whose only remaining name is a hard link made directly in the tier directory
/// (unknown to the store until looked up) spills under that name, which keeps the data.
#[test]
fn a_file_whose_other_name_the_store_does_not_know_spills_under_that_name() {
    let (t, s, ino) = store_with("a");
    std::fs::hard_link(t.tier(0).join("a"), t.tier(0).join("direct")).unwrap();
    let expect = grow_after_unlinking_a(&s, ino);
    assert_eq!(tier_entries(&t, 0), vec!["fill"]);
    assert_eq!(tier_entries(&t, 1), vec!["direct"]);
    assert_eq!(t.get("direct"), expect);
}
