//! Crash tests (issue 2, item 10): kill -9 the mount daemon at random moments while the
//! mover is moving files, remount, and verify every byte, mode, link and name against a
//! snapshot taken before; after a clean unmount, every file is a plain file on exactly
//! one tier and the tiers' union is the same tree.
//!
//! Moves are driven two ways at once: the fast tier starts above its high watermark (so
//! the planner demotes on its own) and `kaiso promote/demote -r` requests run in the
//! background. `KAISO_TEST_SEED` replays the kill timings and the data set.

mod common;

use common::rng::{Rng, test_seed};
use common::{Store, StoreSpec, TierSpec, tree_snapshot};
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const ROUNDS: usize = 6;

/// Writes the data set straight into the tiers (kaiso adopts it at mount): files of
/// many sizes on both tiers, nested directories, a hard-link pair, a symlink, xattrs,
/// a sparse file and odd modes.
fn seed_tree(store: &Store, rng: &mut Rng) {
    for i in 0..48 {
        let size = match i % 4 {
            0 => rng.below(4096),
            1 => rng.below(256 * 1024),
            2 => 512 * 1024 + rng.below(512 * 1024),
            _ => rng.below(64 * 1024),
        } as usize;
        let tier = if i % 3 == 0 { 1 } else { 0 };
        let rel = format!("d{}/s{}/f{i:02}", i % 5, i % 3);
        store.seed(tier, &rel, &rng.bytes(size));
        let p = store.tiers[tier].join(&rel);
        if i % 7 == 0 {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        }
        if i % 5 == 0 {
            let v = format!("value-{i}");
            let name = std::ffi::CString::new("user.kaiso_test").unwrap();
            let cp = common::cstr(&p);
            unsafe { libc::setxattr(cp.as_ptr(), name.as_ptr(), v.as_ptr().cast(), v.len(), 0) };
        }
    }
    store.seed(0, "links/a", &rng.bytes(300 * 1024));
    fs::hard_link(
        store.tiers[0].join("links/a"),
        store.tiers[0].join("links/b"),
    )
    .unwrap();
    std::os::unix::fs::symlink("../d0/s0/f00", store.tiers[0].join("links/sym")).unwrap();
    let sparse = store.tiers[1].join("sparse");
    let f = fs::File::create(&sparse).unwrap();
    f.set_len(8 * MIB).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_at(b"end of a sparse file", 8 * MIB - 20).unwrap();
}

/// xattr values of every file, for the comparison after each crash.
fn xattrs(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in tree_snapshot(root) {
        let rel = line.split(' ').next().unwrap().to_string();
        if !line.contains(" file ") {
            continue;
        }
        let name = std::ffi::CString::new("user.kaiso_test").unwrap();
        let mut buf = [0u8; 64];
        let cp = common::cstr(&root.join(&rel));
        let n = unsafe { libc::getxattr(cp.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), 64) };
        if n >= 0 {
            out.insert(
                rel,
                String::from_utf8_lossy(&buf[..n as usize]).into_owned(),
            );
        }
    }
    out
}

/// `kaiso promote|demote -r --config CONFIG DIR` against the running mount.
fn spawn_mover_request(config: &Path, dir: &str, up: bool) -> Option<Child> {
    Command::new(common::kaiso_bin())
        .args([if up { "promote" } else { "demote" }, "-r", "--config"])
        .arg(config)
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

#[test]
fn kill9_during_moves_loses_nothing() {
    fuse_or_skip!();
    let seed = test_seed("kill9_during_moves_loses_nothing");
    let mut rng = Rng::new(seed);
    // The fast tier holds far more than its high watermark allows, so the planner starts
    // demoting as soon as the store is up.
    let store = Store::new(
        "crash",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast")
                .capacity(24 * MIB)
                .watermarks(0.1, 0.2),
            TierSpec::new("slow"),
        ])
        .mover_interval_ms(100),
    );
    seed_tree(&store, &mut rng);
    let before = store.files_per_tier();

    let mount = store.mount();
    let want = tree_snapshot(&mount.path);
    let want_x = xattrs(&mount.path);
    let link_ino = |root: &Path| {
        let a = fs::metadata(root.join("links/a")).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        let b = fs::metadata(root.join("links/b")).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
        matches!((a, b), (Ok(x), Ok(y)) if x == y)
    };
    assert!(
        link_ino(&mount.path),
        "hard link pair not one inode on first mount"
    );
    mount.kill9();

    for round in 0..ROUNDS {
        let mount = store.mount();
        let mut request =
            spawn_mover_request(&store.config, &format!("d{}", round % 5), round % 2 == 1);
        // Kill somewhere in the first moments of the moves (0-600 ms, seeded).
        let delay = rng.below(600);
        std::thread::sleep(Duration::from_millis(delay));
        let pid = mount.pid();
        mount.kill9();
        if let Some(c) = request.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        eprintln!("round {round}: killed daemon {pid:?} after {delay} ms");

        // Recovery happens on the next mount: the tree must be exactly as before.
        let mount = store.mount();
        let got = tree_snapshot(&mount.path);
        assert_eq!(
            diff(&want, &got),
            Vec::<String>::new(),
            "round {round}: tree differs after kill -9 at {delay} ms (seed {seed})"
        );
        assert_eq!(xattrs(&mount.path), want_x, "round {round}: xattrs differ");
        assert!(link_ino(&mount.path), "round {round}: hard link pair split");
        mount.unmount();

        // Unmounted, the tiers are plain trees: each name on exactly one tier.
        let mut seen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (t, files) in store.files_per_tier().into_iter().enumerate() {
            for f in files {
                seen.entry(f).or_default().push(t);
            }
        }
        let dup: Vec<_> = seen.iter().filter(|(_, t)| t.len() > 1).collect();
        assert!(dup.is_empty(), "round {round}: names on two tiers: {dup:?}");
        let total: usize = seen.len();
        let expected: usize = before.iter().map(|v| v.len()).sum();
        assert_eq!(
            total, expected,
            "round {round}: file count changed on the tiers"
        );
    }

    // The mover did move something over the rounds (else the test proved nothing).
    let after = store.files_per_tier();
    assert_ne!(before, after, "no file changed tier in {ROUNDS} rounds");

    // The tiers' union read directly (no kaiso) is the same tree as before.
    let union = common::temp_dir("crash-union");
    let _cleanup = RemoveOnDrop(union.clone());
    for t in &store.tiers {
        let out = Command::new("cp")
            .arg("-a")
            .arg(format!("{}/.", t.display()))
            .arg(&union)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "copying tier {} failed: {}",
            t.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let plain = tree_snapshot(&union);
    let plain: Vec<String> = plain
        .into_iter()
        .filter(|l| !l.starts_with(".kaiso"))
        .collect();
    assert_eq!(
        diff(&want, &plain),
        Vec::<String>::new(),
        "tiers' union differs from the tree"
    );
}

fn diff(want: &[String], got: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for w in want {
        if !got.contains(w) {
            out.push(format!("missing or changed: {w}"));
        }
    }
    for g in got {
        if !want.contains(g) {
            out.push(format!("unexpected: {g}"));
        }
    }
    out
}

/// Removes a directory when dropped, also while the test panics.
struct RemoveOnDrop(std::path::PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
