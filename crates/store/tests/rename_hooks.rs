//! The migration `renamed` hook is called for every object a rename moves: the source of
//! a plain rename, and both names of a `RENAME_EXCHANGE` (also across tiers).

mod common;

use common::TestStore;
use kaiso_store::types::rename_flags;
use kaiso_store::{Caller, FsResult, Ino, ROOT_INO, Store, StubFiller};
use std::path::Path;
use std::sync::Mutex;

/// Records the hook calls; has nothing to fill.
#[derive(Default)]
struct Recorder {
    renamed: Mutex<Vec<(Ino, bool)>>,
}

impl StubFiller for Recorder {
    fn fill_dir(&self, _store: &Store, _ino: Ino, _path: &Path) -> FsResult<()> {
        Ok(())
    }
    fn fill_range(&self, _: &Store, _: Ino, _: &Path, _: u64, _: u64) -> FsResult<()> {
        Ok(())
    }
    fn renamed(&self, _store: &Store, ino: Ino, is_dir: bool) {
        self.renamed.lock().unwrap().push((ino, is_dir));
    }
}

impl Recorder {
    fn take(&self) -> Vec<(Ino, bool)> {
        let mut v = std::mem::take(&mut *self.renamed.lock().unwrap());
        v.sort();
        v
    }
}

fn file(s: &Store, name: &str) -> Ino {
    s.mknod(
        ROOT_INO,
        name.as_ref(),
        libc::S_IFREG | 0o644,
        0,
        0,
        Caller::ROOT,
    )
    .unwrap()
    .ino
}

fn dir(s: &Store, name: &str) -> Ino {
    s.mkdir(ROOT_INO, name.as_ref(), 0o755, 0, Caller::ROOT)
        .unwrap()
        .ino
}

fn exchange(s: &Store, a: &str, b: &str) -> FsResult<()> {
    s.rename(
        ROOT_INO,
        a.as_ref(),
        ROOT_INO,
        b.as_ref(),
        rename_flags::EXCHANGE,
    )
}

fn sorted(mut v: Vec<(Ino, bool)>) -> Vec<(Ino, bool)> {
    v.sort();
    v
}

#[test]
fn plain_rename_reports_the_moved_object() {
    let t = TestStore::new(&["4MiB"]);
    let s = t.s().clone();
    let a = file(&s, "a");
    let rec = std::sync::Arc::new(Recorder::default());
    s.set_stub_filler(rec.clone());
    s.rename(ROOT_INO, "a".as_ref(), ROOT_INO, "b".as_ref(), 0)
        .unwrap();
    assert_eq!(rec.take(), vec![(a, false)]);
}

#[test]
fn exchange_reports_both_objects() {
    let t = TestStore::new(&["4MiB"]);
    let s = t.s().clone();
    let f = file(&s, "f");
    let d = dir(&s, "d");
    let g = file(&s, "g");
    let rec = std::sync::Arc::new(Recorder::default());
    s.set_stub_filler(rec.clone());

    // File with directory.
    exchange(&s, "f", "d").unwrap();
    assert_eq!(rec.take(), sorted(vec![(f, false), (d, true)]));
    assert_eq!(t.lookup_path("d").unwrap().ino, f);
    assert_eq!(t.lookup_path("f").unwrap().ino, d);

    // File with file.
    exchange(&s, "d", "g").unwrap();
    assert_eq!(rec.take(), sorted(vec![(f, false), (g, false)]));

    // A failed exchange (missing target) reports nothing.
    assert!(exchange(&s, "g", "missing").is_err());
    assert_eq!(rec.take(), vec![]);
}

#[test]
fn exchange_across_tiers_reports_both_objects() {
    let t = TestStore::new(&["4MiB", "4MiB"]);
    let s = t.s().clone();
    let a = file(&s, "a");
    let b = file(&s, "b");
    s.move_now(Path::new("b"), "t1").unwrap();
    assert!(t.dir.path().join("t1/b").exists(), "b is on the slow tier");
    let rec = std::sync::Arc::new(Recorder::default());
    s.set_stub_filler(rec.clone());
    exchange(&s, "a", "b").unwrap();
    assert_eq!(rec.take(), sorted(vec![(a, false), (b, false)]));
    assert_eq!(t.lookup_path("a").unwrap().ino, b);
    assert_eq!(t.lookup_path("b").unwrap().ino, a);
}
