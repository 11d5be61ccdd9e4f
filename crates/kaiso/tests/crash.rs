//! Crash tests (issue 2, item 10): kill -9 the mount daemon while the mover is moving
//! files, remount, and verify every byte, mode, owner, mtime, link and name against the
//! model; after a clean unmount, every file is a plain file on exactly one tier and the
//! tiers' union is the same tree.
//!
//! Every round writes new files through the mount (fsync'd, so their bytes are
//! acknowledged), asks for a move of them (`kaiso promote/demote -r`, paced at
//! `max_rate` so a move lasts a while) on top of the planner's own demotions (the fast
//! tier is kept above its high watermark), waits until `kaiso status` shows a move in
//! flight and kills the daemon then. The next mount reports how many journalled moves it
//! finished or rolled back; the test requires that most kills interrupted a move.
//! `KAISO_TEST_SEED` replays the data set and the kill timings.

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

/// Files written through the mount per round, each this big: at the `max_rate` below a
/// move of one takes about 250 ms.
const ROUND_FILES: usize = 2;
const ROUND_FILE_SIZE: usize = 4 << 20;
/// Rounds whose kill must have interrupted a move (seen by the next mount's recovery).
const MIN_INTERRUPTED: usize = 4;

/// (uid, gid, mtime in ns) of every regular file: moves and their recovery keep them.
fn owners_and_times(root: &Path) -> BTreeMap<String, (u32, u32, i128)> {
    use std::os::unix::fs::MetadataExt;
    let mut out = BTreeMap::new();
    for line in tree_snapshot(root) {
        if !line.contains(" file ") {
            continue;
        }
        let rel = line.split(' ').next().unwrap().to_string();
        if let Ok(m) = fs::symlink_metadata(root.join(&rel)) {
            let mtime = m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128;
            out.insert(rel, (m.uid(), m.gid(), mtime));
        }
    }
    out
}

/// `kaiso status --json CONFIG`: files the mover is moving right now (None if the
/// daemon did not answer).
fn moving_files(config: &Path) -> Option<u64> {
    let out = Command::new(common::kaiso_bin())
        .args(["status", "--json"])
        .arg(config)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let stores = match &v {
        serde_json::Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    };
    stores
        .iter()
        .filter_map(|s| {
            s.pointer("/mover/moving_files")
                .or_else(|| s.pointer("/status/mover/moving_files"))
                .and_then(|m| m.as_u64())
        })
        .max()
}

/// The journal rows the store's open finished or rolled back, from the daemon's
/// "store opened" log line (logged at info by kaiso_store::store).
fn recovered_at_open(log: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains("store opened"))?;
    let plain = strip_ansi(line);
    let v = plain.split("recovered=").nth(1)?;
    v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

/// `s` without terminal colour sequences (ESC [ … m).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn kill9_during_moves_loses_nothing() {
    fuse_or_skip!();
    // The daemons log their open (with the journal rows recovered) at info.
    let log = match std::env::var("KAISO_LOG") {
        Ok(l) => format!("{l},kaiso_store::store=info"),
        Err(_) => "warn,kaiso_store::store=info".into(),
    };
    // SAFETY: set before any thread of this test binary (one test) reads the environment.
    unsafe { std::env::set_var("KAISO_LOG", log) };
    let seed = test_seed("kill9_during_moves_loses_nothing");
    let mut rng = Rng::new(seed);
    // The fast tier holds more than its high watermark allows, so the planner starts
    // demoting as soon as the store is up; moves are paced so that they last a while.
    let store = Store::new(
        "crash",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast")
                .capacity(64 * MIB)
                .watermarks(0.05, 0.1),
            TierSpec::new("slow"),
        ])
        .extra("\n[store.mover]\ninterval_ms = 100\nmax_rate = \"16MiB\"\n"),
    );
    seed_tree(&store, &mut rng);
    let before = store.files_per_tier();
    let mut expected_files: usize = before.iter().map(|v| v.len()).sum();

    let mount = store.mount();
    let mut want = tree_snapshot(&mount.path);
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

    // What was written through the mount and acknowledged (fsync returned).
    let mut written: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut interrupted = 0;
    let mut mount = store.mount();
    let started = std::time::Instant::now();
    for round in 0..ROUNDS {
        // New data each round, so the mover has work however the earlier rounds ended.
        let dir = format!("w{round}");
        fs::create_dir(mount.path.join(&dir)).unwrap();
        for k in 0..ROUND_FILES {
            let rel = format!("{dir}/f{k}");
            let data = rng.bytes(ROUND_FILE_SIZE);
            let mut f = fs::File::create(mount.path.join(&rel)).unwrap();
            std::io::Write::write_all(&mut f, &data).unwrap();
            f.sync_all().unwrap();
            written.insert(rel, data);
            expected_files += 1;
        }
        want = tree_snapshot(&mount.path);
        let want_meta = owners_and_times(&mount.path);
        // Move the new files off the tier they landed on.
        let on_fast = store.tiers_holding(&format!("{dir}/f0")) == [0];
        let mut request = spawn_mover_request(&store.config, &dir, !on_fast);
        // Kill while a move is in flight (seen by `kaiso status`), a seeded 0-40 ms in.
        let t0 = std::time::Instant::now();
        let mut seen_moving = false;
        while t0.elapsed() < Duration::from_secs(10) {
            if moving_files(&store.config).unwrap_or(0) > 0 {
                seen_moving = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let delay = rng.below(40);
        std::thread::sleep(Duration::from_millis(delay));
        let pid = mount.pid();
        mount.kill9();
        if let Some(c) = request.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }

        // Recovery happens on the next mount: the tree must be exactly the model.
        mount = store.mount();
        let log = mount.log_text();
        let recovered = recovered_at_open(&log);
        eprintln!(
            "round {round}: killed daemon {pid:?} {delay} ms after a move was seen \
             ({seen_moving}); the next open recovered {recovered:?} journal rows"
        );
        if recovered.unwrap_or(0) > 0 {
            interrupted += 1;
        }
        let got = tree_snapshot(&mount.path);
        assert_eq!(
            diff(&want, &got),
            Vec::<String>::new(),
            "round {round}: tree differs after kill -9 (seed {seed})"
        );
        for (rel, data) in &written {
            let got = fs::read(mount.path.join(rel)).unwrap();
            assert!(
                got == *data,
                "round {round}: {rel}: acknowledged bytes differ (seed {seed})"
            );
        }
        assert_eq!(
            owners_and_times(&mount.path),
            want_meta,
            "round {round}: owner or mtime changed (seed {seed})"
        );
        assert_eq!(xattrs(&mount.path), want_x, "round {round}: xattrs differ");
        assert!(link_ino(&mount.path), "round {round}: hard link pair split");
    }
    mount.unmount();
    eprintln!(
        "{interrupted} of {ROUNDS} kills interrupted a move ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert!(
        interrupted >= MIN_INTERRUPTED,
        "only {interrupted} of {ROUNDS} kills landed during a move (seed {seed})"
    );

    // Unmounted, the tiers are plain trees: each name on exactly one tier.
    let mut seen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (t, files) in store.files_per_tier().into_iter().enumerate() {
        for f in files {
            seen.entry(f).or_default().push(t);
        }
    }
    let dup: Vec<_> = seen.iter().filter(|(_, t)| t.len() > 1).collect();
    assert!(dup.is_empty(), "names on two tiers: {dup:?}");
    assert_eq!(
        seen.len(),
        expected_files,
        "file count changed on the tiers"
    );

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
