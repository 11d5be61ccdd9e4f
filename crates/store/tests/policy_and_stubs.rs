//! The policy drives moves from recorded accesses; heat survives a restart; the migration
//! hook fills stub directories and ranges on demand.

mod common;
use common::*;
use kaiso_store::{FileKind, FsResult, Ino, Store, StubEntry, StubFiller};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Touch a file with reads at scattered offsets: each one starts a new episode.
fn heat_up(t: &TestStore, path: &str, n: u64) {
    let s = t.s();
    let a = t.lookup_path(path).unwrap();
    let o = s.open_file(a.ino, libc::O_RDONLY, false).unwrap();
    for i in 0..n {
        s.read(o.fh, (i * 7919) % a.size.max(1), 16).unwrap();
    }
    s.release(o.fh).unwrap();
}

#[test]
fn hot_file_on_slow_tier_is_promoted_by_the_policy() {
    let mut t = TestStore::new(&["1MiB", "8MiB"]);
    t.cfg_text = t
        .cfg_text
        .replace("[store]\n", "[store]\nplacement = \"tier:t1\"\n");
    t.reopen();
    t.put("cold", &pattern(100_000, 1));
    t.put("hot", &pattern(100_000, 2));
    assert_eq!(t.holders("hot", 2), vec![1]);
    heat_up(&t, "hot", 20);
    let moved = t.s().plan_and_move(&AtomicBool::new(false));
    assert!(
        moved > 0,
        "a plan with a hot file on the slow tier moves something"
    );
    assert_eq!(t.holders("hot", 2), vec![0]);
    assert_eq!(t.holders("cold", 2), vec![1]);
    let e = t.s().explain("hot".as_ref()).unwrap();
    assert!(e.rule.contains("promoted"), "{e:?}");
    // Heat survives a restart (checkpoint at shutdown, replay at open).
    let ino = t.lookup_path("hot").unwrap().ino;
    let before = t.s().explain("hot".as_ref()).unwrap().policy;
    t.reopen();
    let after = t.s().explain("hot".as_ref()).unwrap().policy;
    assert!(after.contains("heat"), "{after}");
    assert_eq!(t.lookup_path("hot").unwrap().ino, ino);
    assert!(
        !after.contains("heat 0.00"),
        "before: {before}; after: {after}"
    );
}

/// A fake remote source: one directory with one file whose bytes are computed.
struct Filler {
    dir_fills: AtomicU64,
    range_fills: Mutex<Vec<(u64, u64)>>,
}

const REMOTE_SIZE: u64 = 300_000;

impl StubFiller for Filler {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        self.dir_fills.fetch_add(1, Ordering::SeqCst);
        let now = std::time::SystemTime::now();
        let e = StubEntry {
            kind: FileKind::File,
            perm: 0o640,
            uid: 0,
            gid: 0,
            size: REMOTE_SIZE,
            mtime: now,
            atime: now,
            symlink_target: None,
            rdev: 0,
            unlisted: false,
        };
        store.stub_create(ino, "remote.bin".as_ref(), &e)?;
        let d = StubEntry {
            kind: FileKind::Dir,
            perm: 0o755,
            size: 0,
            unlisted: true,
            ..e.clone()
        };
        store.stub_create(ino, "sub".as_ref(), &d)?;
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
        self.range_fills.lock().unwrap().push((offset, len));
        let data = pattern(REMOTE_SIZE as usize, 9);
        store.stub_write(ino, offset, &data[offset as usize..(offset + len) as usize])
    }
}

#[test]
fn stubs_are_filled_on_demand_and_persist() {
    let mut t = TestStore::new(&["4MiB"]);
    let s = t.s().clone();
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
    let filler = Arc::new(Filler {
        dir_fills: AtomicU64::new(0),
        range_fills: Mutex::new(Vec::new()),
    });
    s.set_stub_filler(filler.clone());
    let a = t.lookup_path("mig/remote.bin").unwrap();
    assert_eq!(a.size, REMOTE_SIZE);
    assert_eq!(filler.dir_fills.load(Ordering::SeqCst), 1);
    let o = s.open_file(a.ino, libc::O_RDONLY, true).unwrap();
    assert!(
        o.passthrough.is_none(),
        "stubs are never handed to the kernel"
    );
    let got = s.read(o.fh, 1000, 500).unwrap();
    assert_eq!(got, &pattern(REMOTE_SIZE as usize, 9)[1000..1500]);
    assert_eq!(*filler.range_fills.lock().unwrap(), vec![(1000, 500)]);
    s.read(o.fh, 1200, 100).unwrap();
    assert_eq!(
        filler.range_fills.lock().unwrap().len(),
        1,
        "present ranges are not fetched again"
    );
    s.release(o.fh).unwrap();
    assert_eq!(
        s.stub_state(a.ino).missing,
        vec![(0, 1000), (1500, REMOTE_SIZE)]
    );
    assert!(
        s.stub_state(t.lookup_path("mig/sub").unwrap().ino)
            .unlisted_dir
    );
    // Not movable until complete.
    drop(s);
    let s = t.reopen();
    assert_eq!(
        s.stub_state(a.ino).missing,
        vec![(0, 1000), (1500, REMOTE_SIZE)]
    );
    let filler = Arc::new(Filler {
        dir_fills: AtomicU64::new(0),
        range_fills: Mutex::new(Vec::new()),
    });
    s.set_stub_filler(filler.clone());
    assert_eq!(t.get("mig/remote.bin"), pattern(REMOTE_SIZE as usize, 9));
    assert!(s.stub_state(a.ino).is_complete());
    assert_eq!(filler.dir_fills.load(Ordering::SeqCst), 0);
}
