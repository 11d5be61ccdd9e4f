//! A tier directory that vanishes and comes back (audit of session 7, #19): while it is
//! gone its files answer ENOENT and nothing is placed there; once it is back its files
//! are shown again, under their old numbers, without fsck or a reopen, and nothing is
//! lost or shown twice.

mod common;
use common::*;
use kaiso_store::{FsError, ROOT_INO, Store};
use std::path::Path;
use std::time::{Duration, Instant};

/// Poll `f` until it holds, for at most 20 s (the store samples tier roots every 100 ms;
/// a loaded machine can starve that thread for a while).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the store has seen tier `tier`'s root vanish (its root sampling marks
/// the tier offline and records the files it held; the tier holds some in every test
/// here), instead of sleeping for a time a loaded machine can exceed.
fn noticed_gone(s: &Store, tier: usize) {
    eventually(
        &format!("the store never saw tier {tier} go offline"),
        || {
            let h = &s.tier_health()[tier];
            !h.online && h.unreachable_files > 0
        },
    );
}

fn used(s: &Store, tier: usize) -> u64 {
    s.status().tiers[tier].used
}

/// `a/slow` (1 MiB) and `deep/er/x` on t1, `fast` and `a/` on t0.
fn seeded() -> (TestStore, Vec<u8>) {
    let t = TestStore::new(&["1GiB", "1GiB"]);
    let slow = pattern(1 << 20, 3);
    t.put("a/slow", &slow);
    t.put("deep/er/x", b"x-data");
    t.put("fast", b"fast");
    t.s().move_now(Path::new("a/slow"), "t1").unwrap();
    t.s().move_now(Path::new("deep/er/x"), "t1").unwrap();
    // Leave `deep` on t1 only, so a whole directory disappears with the tier.
    for d in ["deep/er", "deep"] {
        std::fs::remove_dir(t.tier(0).join(d)).unwrap();
    }
    assert_eq!(t.holders("a/slow", 2), vec![1]);
    (t, slow)
}

#[test]
fn vanished_tier_files_return_without_fsck() {
    let (t, slow) = seeded();
    let s = t.s();
    let before = t.lookup_path("a/slow").unwrap();
    let used_before = used(s, 1);
    let a = t.lookup_path("a").unwrap().ino;
    let gone = t.dir.path().join("t1-gone");
    std::fs::rename(t.tier(1), &gone).unwrap();
    noticed_gone(s, 1);

    // While gone: the file's name answers ENOENT, by name and by its number.
    assert_eq!(t.lookup_path("a/slow").unwrap_err(), FsError::NOENT);
    assert_eq!(s.getattr(before.ino, None).unwrap_err(), FsError::NOENT);
    assert_eq!(
        s.open_file(before.ino, libc::O_RDONLY, false).unwrap_err(),
        FsError::NOENT
    );
    assert!(!t.names(a).contains(&"slow".to_string()));
    // The other tier keeps serving, and the missing directory is not re-created.
    assert_eq!(t.get("fast"), b"fast");
    t.put("a/new", b"new");
    assert_eq!(t.get("a/new"), b"new");
    assert!(!t.tier(1).exists(), "kaiso re-created a missing tier root");
    // No move goes to the missing tier.
    let e = s.move_now(Path::new("a/new"), "t1").unwrap_err();
    assert_eq!(e.errno(), FsError::IO, "{e}");

    std::fs::rename(&gone, t.tier(1)).unwrap();
    // Listed again without a lookup (which would probe the tiers itself).
    eventually("a/slow listed again", || {
        t.names(a).contains(&"slow".into())
    });
    let after = t.lookup_path("a/slow").unwrap();
    assert_eq!(after.ino, before.ino, "the file got another inode number");
    assert_eq!(t.get("a/slow"), slow);
    assert_eq!(t.get("deep/er/x"), b"x-data");
    let names = t.names(a);
    for n in ["slow", "new"] {
        assert_eq!(names.iter().filter(|x| *x == n).count(), 1, "{names:?}");
    }
    assert_eq!(used(s, 1), used_before);
    // A full scan finds nothing left to repair.
    let r = s.fsck().unwrap();
    assert_eq!((r.adopted, r.dropped, r.conflicts), (0, 0, 0), "{r:?}");
    assert_eq!(t.get("a/slow"), slow);
}

#[test]
fn fast_tier_gone_sends_new_files_to_the_next_tier() {
    let t = TestStore::new(&["1GiB", "1GiB"]);
    t.put("old", b"old");
    let gone = t.dir.path().join("t0-gone");
    std::fs::rename(t.tier(0), &gone).unwrap();
    noticed_gone(t.s(), 0);
    let ino = t.put("made-while-gone", b"made");
    assert_eq!(t.holders("made-while-gone", 2), vec![1]);
    assert_eq!(t.lookup_path("old").unwrap_err(), FsError::NOENT);
    std::fs::rename(&gone, t.tier(0)).unwrap();
    eventually("old listed again", || {
        t.names(ROOT_INO).contains(&"old".into())
    });
    assert_eq!(t.get("old"), b"old");
    assert_eq!(t.get("made-while-gone"), b"made");
    assert_eq!(t.lookup_path("made-while-gone").unwrap().ino, ino);
    assert_eq!(t.names(ROOT_INO).len(), 4, "{:?}", t.names(ROOT_INO));
}

#[test]
fn name_reused_while_gone_shadows_the_returned_copy_until_fsck() {
    let (t, slow) = seeded();
    let s = t.s();
    let gone = t.dir.path().join("t1-gone");
    std::fs::rename(t.tier(1), &gone).unwrap();
    noticed_gone(s, 1);
    assert_eq!(t.lookup_path("a/slow").unwrap_err(), FsError::NOENT);
    t.put("a/slow", b"replacement");
    std::fs::rename(&gone, t.tier(1)).unwrap();
    let er = t.lookup_path("deep/er").unwrap().ino;
    eventually("deep/er/x listed again", || {
        t.names(er).contains(&"x".into())
    });
    // The name shows the file made while the tier was gone, once; the returned copy is
    // kept on its tier (not lost) …
    assert_eq!(t.get("a/slow"), b"replacement");
    let a = t.lookup_path("a").unwrap().ino;
    let names = t.names(a);
    assert_eq!(
        names.iter().filter(|n| *n == "slow").count(),
        1,
        "{names:?}"
    );
    assert_eq!(std::fs::read(t.tier(1).join("a/slow")).unwrap(), slow);
    // … and fsck makes both reachable.
    let r = s.fsck().unwrap();
    assert_eq!(r.conflicts, 1, "{r:?}");
    assert_eq!(t.get("a/slow.kaiso-conflict-t1"), slow);
    assert_eq!(t.get("a/slow"), b"replacement");
}

#[test]
fn tier_replaced_by_a_copy_shows_the_copy() {
    // A re-mounted or restored file system at the same path: another directory, other
    // inode numbers, the same tree.
    let (t, slow) = seeded();
    let gone = t.dir.path().join("t1-gone");
    std::fs::rename(t.tier(1), &gone).unwrap();
    noticed_gone(t.s(), 1);
    // Looked at while gone, so its name drops out of the listing.
    assert_eq!(t.lookup_path("a/slow").unwrap_err(), FsError::NOENT);
    let copy = t.dir.path().join("t1-copy");
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(&gone)
        .arg(&copy)
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let a = t.lookup_path("a").unwrap().ino;
    std::fs::rename(&copy, t.tier(1)).unwrap();
    eventually("a/slow listed again", || {
        t.names(a).contains(&"slow".into())
    });
    assert_eq!(t.get("a/slow"), slow);
    assert_eq!(t.get("deep/er/x"), b"x-data");
    // The index now matches what a full scan finds.
    let r = t.s().fsck().unwrap();
    assert_eq!((r.adopted, r.conflicts), (0, 0), "{r:?}");
}
