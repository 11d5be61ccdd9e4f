//! Trees deeper than PATH_MAX through the store API: every backing path here is longer
//! than any path argument the kernel takes (30 levels of 200-byte names, ~6 KB), so each
//! operation must reach its backing file through a directory descriptor.

mod common;
use common::*;
use kaiso_store::{Caller, FileKind, FsError, Ino, ROOT_INO};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

const DEPTH: usize = 30;

/// Name of level `i`: 200 bytes of one letter.
fn level(i: usize) -> String {
    std::iter::repeat_n((b'a' + (i % 26) as u8) as char, 200).collect()
}

/// Store-relative path of the first `n` levels.
fn levels(n: usize) -> String {
    (0..n).map(level).collect::<Vec<_>>().join("/")
}

/// Opens `rel` under `root` one component at a time (the test's own walk, independent
/// of the store's), or None when some component is missing.
fn open_deep(root: &Path, rel: &str) -> Option<File> {
    let mut cur = File::open(root).ok()?;
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        cur = File::open(format!("/proc/self/fd/{}/{c}", cur.as_raw_fd())).ok()?;
    }
    Some(cur)
}

/// Whether a regular file is at `rel` on tier `i` (looked at through the test's walk).
fn on_tier(t: &TestStore, i: usize, rel: &str) -> bool {
    let (dir, name) = rel.rsplit_once('/').unwrap();
    let Some(d) = open_deep(&t.tier(i), dir) else {
        return false;
    };
    std::fs::symlink_metadata(format!("/proc/self/fd/{}/{name}", d.as_raw_fd()))
        .is_ok_and(|m| m.is_file())
}

/// Makes the first `DEPTH` levels through the store; returns each level's inode
/// (index 0 is the root).
fn make_tree(t: &TestStore) -> Vec<Ino> {
    let s = t.s();
    let mut inos = vec![ROOT_INO];
    for i in 0..DEPTH {
        let a = s
            .mkdir(inos[i], OsStr::new(&level(i)), 0o755, 0, Caller::ROOT)
            .unwrap_or_else(|e| panic!("mkdir level {i}: {e:?}"));
        inos.push(a.ino);
    }
    inos
}

fn names(t: &TestStore, dir: Ino) -> Vec<String> {
    let mut v: Vec<String> = t
        .names(dir)
        .into_iter()
        .filter(|n| n != "." && n != "..")
        .map(|n| {
            if n.len() > 20 {
                format!("{}x{}", &n[..1], n.len())
            } else {
                n
            }
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_tree_deeper_than_path_max_works_through_the_store() {
    let mut t = TestStore::new(&["64MiB", "64MiB"]);
    let inos = make_tree(&t);
    let deep = inos[DEPTH];
    let deep_rel = levels(DEPTH);
    assert!(t.tier(0).join(&deep_rel).as_os_str().len() > 4096);
    let s = t.s().clone();

    // Create, write, read.
    let leaf = t.put(&format!("{deep_rel}/leaf"), b"deep data");
    assert_eq!(t.get(&format!("{deep_rel}/leaf")), b"deep data");
    assert!(on_tier(&t, 0, &format!("{deep_rel}/leaf")));
    assert_eq!(s.getattr(leaf, None).unwrap().size, 9);

    // Renames across levels, both paths long.
    s.rename(deep, OsStr::new("leaf"), inos[15], OsStr::new("moved"), 0)
        .unwrap();
    assert_eq!(
        s.lookup(deep, OsStr::new("leaf")).unwrap_err(),
        FsError::NOENT
    );
    assert_eq!(t.get(&format!("{}/moved", levels(15))), b"deep data");
    s.rename(
        inos[15],
        OsStr::new("moved"),
        inos[29],
        OsStr::new("leaf2"),
        0,
    )
    .unwrap();
    let leaf2 = format!("{}/leaf2", levels(29));
    assert_eq!(s.lookup(inos[29], OsStr::new("leaf2")).unwrap().ino, leaf);

    // A hard link at another level.
    let a = s.link(leaf, inos[10], OsStr::new("hard")).unwrap();
    assert_eq!((a.ino, a.nlink), (leaf, 2));

    // xattrs on the deep file and a deep directory.
    s.setxattr(leaf, OsStr::new("user.deep"), b"v1", 0).unwrap();
    s.setxattr(deep, OsStr::new("user.deep"), b"dv", 0).unwrap();
    assert_eq!(s.getxattr(leaf, OsStr::new("user.deep")).unwrap(), b"v1");
    assert_eq!(s.getxattr(deep, OsStr::new("user.deep")).unwrap(), b"dv");
    assert!(
        s.listxattr(leaf)
            .unwrap()
            .split(|b| *b == 0)
            .any(|n| n == b"user.deep")
    );

    // A symlink, attributes, a listing, statfs.
    let sl = s
        .symlink(deep, OsStr::new("sl"), Path::new("../x"), Caller::ROOT)
        .unwrap();
    assert_eq!(sl.kind, FileKind::Symlink);
    assert_eq!(s.readlink(sl.ino).unwrap(), OsStr::new("../x"));
    let mode = kaiso_store::SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    assert_eq!(s.setattr(leaf, &mode, Caller::ROOT).unwrap().perm, 0o600);
    assert_eq!(names(&t, deep), vec!["sl"]);
    assert_eq!(names(&t, inos[29]), vec!["dx200", "leaf2"]);
    assert_eq!(names(&t, inos[10]), vec!["hard", "kx200"]);
    assert!(s.statfs().unwrap().blocks > 0);

    // The mover: demote and promote the deep leaf (copy, verify, switch, delete), its
    // link moving with it.
    s.move_now(Path::new(&leaf2), "t1").unwrap();
    assert!(on_tier(&t, 1, &leaf2) && !on_tier(&t, 0, &leaf2));
    assert!(on_tier(&t, 1, &format!("{}/hard", levels(10))));
    assert_eq!(t.get(&leaf2), b"deep data");
    assert_eq!(s.getxattr(leaf, OsStr::new("user.deep")).unwrap(), b"v1");
    s.move_now(Path::new(&leaf2), "t0").unwrap();
    assert!(on_tier(&t, 0, &leaf2) && !on_tier(&t, 1, &leaf2));
    assert_eq!(t.get(&format!("{}/hard", levels(10))), b"deep data");
    let w = s.where_is(Path::new(&leaf2)).unwrap();
    assert_eq!(w.tiers, vec!["t0".to_string()]);
    assert!(w.backing_path.ends_with("/leaf2") && w.backing_path.len() > 4096);

    // A deep directory renamed to a shallow level with its subtree (both paths long).
    s.rename(
        inos[25],
        OsStr::new(&level(25)),
        inos[5],
        OsStr::new("moveddir"),
        0,
    )
    .unwrap();
    let moved_deep = format!(
        "{}/moveddir/{}",
        levels(5),
        (26..DEPTH).map(level).collect::<Vec<_>>().join("/")
    );
    t.put(&format!("{moved_deep}/after"), b"after the move");

    // Reopen: the scan walks the deep tree and keeps every inode.
    let deep_ino = t.lookup_path(&moved_deep).unwrap().ino;
    drop(s);
    t.reopen();
    let s = t.s().clone();
    assert_eq!(t.lookup_path(&moved_deep).unwrap().ino, deep_ino);
    assert_eq!(t.get(&format!("{moved_deep}/after")), b"after the move");
    let moved_leaf2 = format!(
        "{}/moveddir/{}/leaf2",
        levels(5),
        (26..29).map(level).collect::<Vec<_>>().join("/")
    );
    assert_eq!(t.lookup_path(&moved_leaf2).unwrap().ino, leaf);
    assert_eq!(t.lookup_path(&moved_leaf2).unwrap().nlink, 2);
    assert_eq!(
        s.getxattr(deep_ino, OsStr::new("user.deep")).unwrap(),
        b"dv"
    );

    // A file put straight into the tier at depth is adopted by fsck; nothing conflicts.
    let d = open_deep(&t.tier(1), &moved_deep);
    assert!(d.is_none(), "the deep directory is on tier 0 only");
    let d = open_deep(&t.tier(0), &moved_deep).unwrap();
    std::fs::write(
        format!("/proc/self/fd/{}/outside", d.as_raw_fd()),
        b"made outside",
    )
    .unwrap();
    drop(d);
    let r = s.fsck().unwrap();
    assert_eq!((r.conflicts, r.dropped), (0, 0), "{r:?}");
    assert_eq!(r.adopted, 1, "{r:?}");
    assert_eq!(t.get(&format!("{moved_deep}/outside")), b"made outside");

    // Unlinks and rmdirs at depth.
    let dir = t.lookup_path(&moved_deep).unwrap().ino;
    for n in ["after", "outside", "sl"] {
        s.unlink(dir, OsStr::new(n)).unwrap();
    }
    assert!(names(&t, dir).is_empty());
    let parent = PathBuf::from(&moved_deep);
    let parent = parent.parent().unwrap().to_str().unwrap();
    let pino = t.lookup_path(parent).unwrap().ino;
    s.rmdir(pino, OsStr::new(&level(29))).unwrap();
    assert_eq!(t.lookup_path(&moved_deep).unwrap_err(), FsError::NOENT);
    assert!(open_deep(&t.tier(0), &moved_deep).is_none());
}
