//! Mover crash safety: stop the move at every step (as a crash would), reopen the store,
//! and check there is exactly one copy with every byte intact, under the same inode number.

mod common;
use common::*;
use kaiso_store::FailPoint;

const POINTS: [FailPoint; 7] = [
    FailPoint::AfterJournal,
    FailPoint::AfterCopy,
    FailPoint::AfterFsync,
    FailPoint::AfterVerify,
    FailPoint::AfterRename,
    FailPoint::AfterSwitch,
    FailPoint::AfterDelete,
];

fn count_files(dir: &std::path::Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            n += count_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

#[test]
fn crash_at_every_step_leaves_one_intact_copy() {
    for fp in POINTS {
        let mut t = TestStore::new(&["8MiB", "8MiB"]);
        let data = pattern(3 << 20, 7);
        let ino = t.put("d/file", &data);
        let link_dir = t
            .s()
            .mkdir(
                kaiso_store::ROOT_INO,
                "e".as_ref(),
                0o755,
                0,
                kaiso_store::Caller::ROOT,
            )
            .unwrap()
            .ino;
        t.s().link(ino, link_dir, "hard".as_ref()).unwrap();
        t.s().set_fail_point(Some(fp));
        let r = t.s().move_now("d/file".as_ref(), "t1");
        assert!(
            r.is_err(),
            "{fp:?}: the injected failure must stop the move"
        );
        let s = t.crash_and_reopen();
        assert_eq!(t.get("d/file"), data, "{fp:?}");
        assert_eq!(t.get("e/hard"), data, "{fp:?}");
        assert_eq!(
            t.lookup_path("d/file").unwrap().ino,
            ino,
            "{fp:?}: inode number kept"
        );
        assert_eq!(t.lookup_path("e/hard").unwrap().nlink, 2, "{fp:?}");
        let holders = t.holders("d/file", 2);
        assert_eq!(
            holders.len(),
            1,
            "{fp:?}: exactly one copy, found on {holders:?}"
        );
        assert_eq!(
            t.holders("e/hard", 2),
            holders,
            "{fp:?}: link group on one tier"
        );
        let expect_moved = matches!(fp, FailPoint::AfterSwitch | FailPoint::AfterDelete);
        assert_eq!(holders[0], if expect_moved { 1 } else { 0 }, "{fp:?}");
        // No leftovers, and accounting matches the one copy.
        assert_eq!(
            count_files(&t.tier(0)) + count_files(&t.tier(1)),
            2,
            "{fp:?}"
        );
        let st = s.status();
        assert_eq!(st.tiers[holders[0]].used, data.len() as u64, "{fp:?}");
        assert_eq!(st.tiers[1 - holders[0]].used, 0, "{fp:?}");
        // The move can be done afterwards.
        s.move_now("d/file".as_ref(), "t0").unwrap();
        s.move_now("d/file".as_ref(), "t1").unwrap();
        assert_eq!(t.get("e/hard"), data);
    }
}

#[test]
fn writes_during_a_move_are_not_lost() {
    let t = TestStore::new(&["64MiB", "64MiB"]);
    let ino = t.put("f", &pattern(16 << 20, 1));
    let s = t.s().clone();
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            for i in 0..200u64 {
                s.write(o.fh, (i * 65_536) % (16 << 20), &[0xAB; 4096])
                    .unwrap();
            }
        })
    };
    s.move_now("f".as_ref(), "t1").unwrap();
    writer.join().unwrap();
    s.release(o.fh).unwrap();
    let mut expect = pattern(16 << 20, 1);
    for i in 0..200u64 {
        let off = ((i * 65_536) % (16 << 20)) as usize;
        expect[off..off + 4096].fill(0xAB);
    }
    assert_eq!(t.get("f"), expect);
    assert_eq!(t.holders("f", 2), vec![1]);
}
