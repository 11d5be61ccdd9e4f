//! Where new entries go: ordinary creates are placed as before (as empty files, the
//! fastest tier with room), migration stubs by their listed size, which their tier
//! accounts from the stub's creation (so a listing cannot put more on a tier than it
//! holds) and gets back when the stub goes.

mod common;
use common::*;
use kaiso_store::{Caller, FileKind, ROOT_INO, StubEntry};
use std::sync::Arc;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

fn stub_file(size: u64) -> StubEntry {
    let now = std::time::SystemTime::now();
    StubEntry {
        kind: FileKind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size,
        mtime: now,
        atime: now,
        symlink_target: None,
        rdev: 0,
        unlisted: false,
    }
}

fn used(t: &TestStore) -> Vec<u64> {
    t.s().status().tiers.iter().map(|t| t.used).collect()
}

#[test]
fn ordinary_creates_are_placed_as_before() {
    let t = TestStore::new(&["1MiB", "64MiB"]);
    // An empty create goes to the fastest tier, also when the file is about to outgrow
    // it: a write that does not fit spills it (unchanged behaviour).
    let s = t.s();
    let (a, o) = s
        .create(
            ROOT_INO,
            "new".as_ref(),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            false,
        )
        .unwrap();
    assert_eq!(t.holders("new", 2), vec![0]);
    assert_eq!(used(&t), vec![0, 0], "an empty create takes no room");
    s.release(o.fh).unwrap();
    assert_eq!(a.size, 0);
    // Filling the fast tier up to its capacity: creates still go there while it has room.
    t.put("fill", &pattern(900 * KIB as usize, 1));
    assert_eq!(t.holders("fill", 2), vec![0]);
    t.put("small", &pattern(50 * KIB as usize, 2));
    assert_eq!(t.holders("small", 2), vec![0]);
    // A write that does not fit moves its file to the next tier instead of failing.
    t.put("big", &pattern(200 * KIB as usize, 3));
    assert_eq!(t.holders("big", 2), vec![1]);
    assert_eq!(t.get("big"), pattern(200 * KIB as usize, 3));
    assert!(used(&t)[0] <= MIB);
}

#[test]
fn stubs_are_placed_by_their_listed_size_and_accounted_from_creation() {
    let t = TestStore::new(&["1MiB", "64MiB"]);
    let s = t.s();
    let a = s
        .stub_create(ROOT_INO, "a".as_ref(), &stub_file(600 * KIB))
        .unwrap();
    // Listed before any byte is fetched: the first takes 600 KiB of the fast tier, the
    // second does not fit beside it (it used to go there too, as an empty file).
    assert_eq!(t.holders("a", 2), vec![0]);
    assert_eq!(used(&t), vec![600 * KIB, 0]);
    s.stub_create(ROOT_INO, "b".as_ref(), &stub_file(600 * KIB))
        .unwrap();
    assert_eq!(t.holders("b", 2), vec![1]);
    assert_eq!(used(&t), vec![600 * KIB, 600 * KIB]);
    // A small one still fits on the fast tier; a symlink takes no room.
    s.stub_create(ROOT_INO, "c".as_ref(), &stub_file(300 * KIB))
        .unwrap();
    assert_eq!(t.holders("c", 2), vec![0]);
    let link = StubEntry {
        kind: FileKind::Symlink,
        symlink_target: Some("a".into()),
        size: 1,
        ..stub_file(0)
    };
    s.stub_create(ROOT_INO, "l".as_ref(), &link).unwrap();
    assert_eq!(t.holders("l", 2), vec![0]);
    assert_eq!(used(&t), vec![900 * KIB, 600 * KIB]);
    // Fetched bytes are not counted again.
    s.stub_write(a, 0, &pattern(600 * KIB as usize, 4)).unwrap();
    assert!(s.stub_state(a).missing.is_empty());
    assert_eq!(used(&t), vec![900 * KIB, 600 * KIB]);
    assert_eq!(t.get("a"), pattern(600 * KIB as usize, 4));
    // A stub removed gives its size back, fetched or not.
    s.unlink(ROOT_INO, "a".as_ref()).unwrap();
    s.unlink(ROOT_INO, "b".as_ref()).unwrap();
    assert_eq!(used(&t), vec![300 * KIB, 0]);
    // So is a truncated one's cut.
    let c = t.lookup_path("c").unwrap().ino;
    let o = s
        .open_file(c, libc::O_WRONLY | libc::O_TRUNC, false)
        .unwrap();
    s.release(o.fh).unwrap();
    assert_eq!(used(&t), vec![0, 0]);
}

#[test]
fn a_stub_larger_than_every_tier_fails_with_enospc() {
    let t = TestStore::new(&["1MiB", "2MiB"]);
    let e = t
        .s()
        .stub_create(ROOT_INO, "huge".as_ref(), &stub_file(3 * MIB))
        .unwrap_err();
    assert_eq!(e, kaiso_store::FsError::NOSPC);
    assert_eq!(used(&t), vec![0, 0]);
    assert_eq!(t.holders("huge", 2), Vec::<usize>::new());
}

#[test]
fn stubs_created_at_once_never_pass_the_capacity_together() {
    let t = TestStore::new(&["1MiB", "64MiB"]);
    let s = t.s().clone();
    // 8 listers create 100 KiB stubs at the same time: at most 10 fit on the fast tier.
    let threads: Vec<_> = (0..8)
        .map(|n| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                for i in 0..8 {
                    let name = format!("s{n}-{i}");
                    s.stub_create(ROOT_INO, name.as_ref(), &stub_file(100 * KIB))
                        .unwrap();
                }
            })
        })
        .collect();
    for th in threads {
        th.join().unwrap();
    }
    let u = used(&t);
    assert!(u[0] <= MIB, "fast tier over its capacity: {u:?}");
    assert_eq!(u[0] + u[1], 64 * 100 * KIB);
    let on_fast = (0..8)
        .flat_map(|n| (0..8).map(move |i| format!("s{n}-{i}")))
        .filter(|p| t.holders(p, 2) == vec![0])
        .count() as u64;
    assert_eq!(on_fast * 100 * KIB, u[0]);
}

/// A client write that grows a partially fetched stub past its tier's capacity spills the
/// stub to the next tier with its missing ranges, instead of failing with ENOSPC (the
/// mover refuses partial stubs otherwise).
#[test]
fn a_client_write_growing_a_partial_stub_spills_it_with_its_missing_ranges() {
    let t = TestStore::new(&["1MiB", "64MiB"]);
    let s = t.s();
    let ino = s
        .stub_create(ROOT_INO, "p".as_ref(), &stub_file(600 * KIB))
        .unwrap();
    assert_eq!(t.holders("p", 2), vec![0]);
    let head = pattern(100 * KIB as usize, 7);
    s.stub_write(ino, 0, &head).unwrap();
    assert_eq!(s.stub_state(ino).missing, vec![(100 * KIB, 600 * KIB)]);

    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    let tail = pattern(MIB as usize, 8);
    assert_eq!(
        s.write(o.fh, 600 * KIB, &tail).unwrap() as usize,
        tail.len(),
        "the write fits on the next tier"
    );
    assert_eq!(t.holders("p", 2), vec![1], "the partial stub spilled");
    assert_eq!(
        s.stub_state(ino).missing,
        vec![(100 * KIB, 600 * KIB)],
        "with its missing ranges"
    );
    assert_eq!(s.read(o.fh, 0, head.len() as u32).unwrap(), head);
    assert_eq!(
        s.read(o.fh, 600 * KIB, tail.len() as u32).unwrap(),
        tail,
        "the client's bytes"
    );
    s.release(o.fh).unwrap();
    assert!(used(&t)[0] <= MIB);
}
