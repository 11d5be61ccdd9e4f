//! Issue-2 store gaps found in session 16, with the real binary on a real mount
//! (`cargo test --release -p kaiso --test tiering_gaps_s16`): `renameat2(RENAME_EXCHANGE)`
//! involving a directory whose copies live on different tiers.

mod common;

#[allow(dead_code)]
#[path = "../../source/tests/common/loop_ext4.rs"]
mod loop_ext4;

use common::{Store, StoreSpec, exchange, fill_inodes};
use std::fs;
use std::path::{Path, PathBuf};

/// Every entry under `root` as "path dir" or "path = contents", sorted (no modes or
/// times: the mount and a plain directory are compared).
fn tree(root: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                out.push(format!("{rel} dir"));
                walk(base, &p, out);
            } else {
                let data = fs::read(&p).map(|d| String::from_utf8_lossy(&d).into_owned());
                out.push(format!("{rel} = {data:?}"));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

/// Writes `rel` under `root` with `data`, making its directories.
fn put(root: &Path, rel: &str, data: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, data).unwrap();
}

/// A two-tier store whose tier `small` is a directory on a 16 MiB ext4 file system with
/// 256 inodes (filled by the caller once seeded); None where loop devices are missing.
struct SmallTierStore {
    store: Store,
    small: Option<loop_ext4::LoopExt4>,
    scratch: PathBuf,
    /// The tier directories, fastest first (`small`'s is on the small file system).
    tiers: [PathBuf; 2],
}

impl SmallTierStore {
    fn new(tag: &str, small_tier: usize) -> Option<SmallTierStore> {
        if !loop_ext4::available() {
            eprintln!("skipped: no loop devices / mkfs.ext4");
            return None;
        }
        let scratch = common::temp_dir(&format!("{tag}-fs"));
        let small = loop_ext4::LoopExt4::with_mkfs_args(&scratch, 16 << 20, &["-N", "256"]);
        let dir = small.mnt.join("tier");
        fs::create_dir(&dir).unwrap();
        let store = Store::new(tag, StoreSpec::tiers(2));
        let cfg = fs::read_to_string(&store.config).unwrap().replace(
            &store.tiers[small_tier].to_string_lossy().into_owned(),
            &dir.to_string_lossy(),
        );
        fs::write(&store.config, cfg).unwrap();
        let mut tiers = [store.tiers[0].clone(), store.tiers[1].clone()];
        tiers[small_tier] = dir;
        Some(SmallTierStore {
            store,
            small: Some(small),
            scratch,
            tiers,
        })
    }

    fn fill(&self) {
        fill_inodes(&self.small.as_ref().unwrap().mnt);
    }
}

impl Drop for SmallTierStore {
    fn drop(&mut self) {
        drop(self.small.take());
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

/// An exchange of a file with a directory held by another tier answered ENOSPC when the
/// file's tier could not make the directory's parent (no free inodes): the directory's
/// copy must go to the file's parent there and the file to the directory's. Expected
/// (session 16): the file is moved (journalled, by the mover) onto the directory's tier
/// first and the exchange is one `renameat2` there, as on a plain directory.
#[test]
fn exchange_of_a_file_and_a_directory_on_another_tier_when_the_files_tier_is_out_of_inodes() {
    fuse_or_skip!();
    let Some(s) = SmallTierStore::new("gaps16-xfd", 0) else {
        return;
    };
    let plain = common::temp_dir("gaps16-xfd-plain");
    for root in [&s.tiers[0], &plain] {
        put(root, "a", "a, a file on t0");
    }
    for root in [&s.tiers[1], &plain] {
        put(root, "only/d/inner", "inside d, a directory only t1 has");
    }
    s.fill();
    let m = s.store.mount();
    let r = exchange(&m.path.join("a"), &m.path.join("only/d"));
    let on_mount = tree(&m.path);
    let holding = s.store.tiers_holding("only/d");
    drop(m);
    exchange(&plain.join("a"), &plain.join("only/d")).expect("exchange on a plain directory");
    let expected = tree(&plain);
    let _ = fs::remove_dir_all(&plain);
    assert!(
        r.is_ok(),
        "exchange of a (file, t0 out of inodes) and only/d (directory on t1 only): {r:?}; \
         expected success, the file brought onto t1 first"
    );
    assert_eq!(
        on_mount, expected,
        "the tree after the exchange, mount vs plain directory"
    );
    assert_eq!(holding, vec![1], "tiers holding only/d (the file now)");
}

/// Directories with copies on both tiers and on one, exchanged across directories:
/// the same tree as on a plain directory, every copy moved (each tier swaps its copies),
/// and a file under each reachable at its new path.
#[test]
fn exchange_of_directories_on_different_tiers_matches_a_plain_directory() {
    fuse_or_skip!();
    let store = Store::new("gaps16-xdd", StoreSpec::tiers(2));
    let plain = common::temp_dir("gaps16-xdd-plain");
    let layout: [(usize, &str, &str); 4] = [
        (0, "p/x/f0", "x's file on t0"),
        (1, "p/x/f1", "x's file on t1"),
        (1, "q/y/g", "y's file on t1"),
        (1, "q/y/sub/h", "deeper in y, on t1"),
    ];
    for (tier, rel, data) in layout {
        store.seed(tier, rel, data.as_bytes());
        put(&plain, rel, data);
    }
    let m = store.mount();
    let r = exchange(&m.path.join("p/x"), &m.path.join("q/y"));
    let on_mount = tree(&m.path);
    let reads: Vec<_> = ["p/x/g", "p/x/sub/h", "q/y/f0", "q/y/f1"]
        .iter()
        .map(|p| fs::read_to_string(m.path.join(p)).map_err(|e| e.to_string()))
        .collect();
    drop(m);
    exchange(&plain.join("p/x"), &plain.join("q/y")).expect("exchange on a plain directory");
    let expected = tree(&plain);
    let _ = fs::remove_dir_all(&plain);
    assert!(r.is_ok(), "exchange of p/x (t0+t1) and q/y (t1): {r:?}");
    assert_eq!(
        on_mount, expected,
        "the tree after the exchange, mount vs plain directory"
    );
    assert!(
        reads.iter().all(|r| r.is_ok()),
        "reads at the new paths: {reads:?}"
    );
    // Each tier swapped its own copies: no copy left at an old place.
    let files = store.files_per_tier();
    assert!(
        files[0].iter().any(|f| f == "q/y/f0") && files[1].iter().any(|f| f == "q/y/f1"),
        "x's files on their tiers under q/y: {files:?}"
    );
    assert!(
        files[1].iter().any(|f| f == "p/x/g"),
        "y's files under p/x on t1: {files:?}"
    );
}

/// An exchange of two directories where a tier holding a copy of one cannot make the
/// other's parent directory (no free inodes) cannot be done: a directory's copy does not
/// move between tiers. Before session 16 the tiers were swapped one by one, and the
/// refusal of the second left the first swapped: half an exchange, the union showing
/// a mix of both directories. Expected: ENOSPC with the tree unchanged (checked before
/// anything is swapped, and a tier refusing later swaps the others back).
#[test]
fn an_exchange_of_directories_that_a_full_tier_refuses_changes_nothing() {
    fuse_or_skip!();
    let Some(s) = SmallTierStore::new("gaps16-xnospc", 1) else {
        return;
    };
    put(&s.tiers[0], "x/f0", "x's file on t0");
    put(&s.tiers[1], "x/f1", "x's file on t1 (out of inodes)");
    put(&s.tiers[0], "only/y/g", "y's file, only on t0");
    s.fill();
    let m = s.store.mount();
    let before = tree(&m.path);
    let r = exchange(&m.path.join("x"), &m.path.join("only/y"));
    let after = tree(&m.path);
    drop(m);
    let after_remount = {
        let m = s.store.mount();
        tree(&m.path)
    };
    assert_eq!(
        r.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOSPC)),
        "exchange of x (t0+t1, t1 out of inodes) and only/y (t0 only): {r:?}; expected \
         ENOSPC (t1 cannot make only/ for x's copy there)"
    );
    assert_eq!(after, before, "the tree after the refused exchange");
    assert_eq!(after_remount, before, "the tree after a remount");
}
