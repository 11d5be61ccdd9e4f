//! Issue-2 store gaps left from session 12, with the real binary on a real mount
//! (`cargo test --release -p kaiso --test tiering_gaps_s13`).

mod common;

#[allow(dead_code)]
#[path = "../../source/tests/common/loop_ext4.rs"]
mod loop_ext4;

use common::{Store, StoreSpec, exchange, fill_inodes};
use std::fs;
use std::time::Duration;

/// Session 12 made a rename or link whose file's tier cannot make the target directory
/// (no free inodes there) move the file to a tier that can first. An exchange of two
/// files on different tiers brings them onto one tier first, always the first file's:
/// when that tier cannot make the second file's directory, `renameat2(RENAME_EXCHANGE)`
/// failed with ENOSPC while the second file's tier had plenty of room. Expected: the
/// exchange succeeds (both files on a tier that holds both directories), contents swapped.
#[test]
fn exchange_succeeds_when_the_first_files_tier_has_no_free_inodes() {
    fuse_or_skip!();
    if !loop_ext4::available() {
        return;
    }
    let scratch = common::temp_dir("gaps13-exchange-fs");
    let small = loop_ext4::LoopExt4::with_mkfs_args(&scratch, 16 << 20, &["-N", "256"]);
    let fast_dir = small.mnt.join("tier");
    fs::create_dir(&fast_dir).unwrap();
    fs::write(fast_dir.join("a"), b"a, on t0").unwrap();
    fill_inodes(&small.mnt);
    let store = Store::new("gaps13-exchange", StoreSpec::tiers(2));
    let cfg = fs::read_to_string(&store.config).unwrap().replace(
        &store.tiers[0].to_string_lossy().into_owned(),
        &fast_dir.to_string_lossy(),
    );
    fs::write(&store.config, cfg).unwrap();
    store.seed(1, "only/b", b"b, on t1 in a directory only t1 has");
    let m = store.mount();
    let r = exchange(&m.path.join("a"), &m.path.join("only/b"));
    let a = fs::read(m.path.join("a"));
    let b = fs::read(m.path.join("only/b"));
    drop(m);
    drop(store);
    drop(small);
    let _ = fs::remove_dir_all(&scratch);
    assert!(
        r.is_ok(),
        "exchange of a (t0, out of inodes) and only/b (t1, only t1 has only/): {r:?}; \
         expected success, the files brought together on t1"
    );
    assert_eq!(
        (a.ok(), b.ok()),
        (
            Some(b"b, on t1 in a directory only t1 has".to_vec()),
            Some(b"a, on t0".to_vec())
        ),
        "contents after the exchange"
    );
}

/// A create on the fastest tier while its directory is away (renamed, removed or
/// unmounted) and the store's root check (every 100 ms) has not noticed yet failed with
/// ENOENT; reads of files there notice at once (session 12). Expected: the create notices
/// at once too and makes the file on the next tier with room. Three rounds, each right
/// after the directory went (well inside the root check's period), each followed by the
/// directory's return.
#[test]
fn a_create_while_the_fast_tiers_directory_is_away_lands_on_the_next_tier() {
    fuse_or_skip!();
    let store = Store::new("gaps13-away", StoreSpec::tiers(2));
    store.seed(0, "old", b"on t0");
    let m = store.mount();
    let t0 = store.tiers[0].clone();
    let away = t0.with_extension("away");
    let mut results = Vec::new();
    for i in 0..3 {
        fs::rename(&t0, &away).unwrap();
        let name = format!("new{i}");
        let data = format!("created while t0 was away, round {i}");
        let w = fs::write(m.path.join(&name), &data);
        let back = fs::read(m.path.join(&name));
        fs::rename(&away, &t0).unwrap();
        results.push((
            name,
            w.map_err(|e| e.to_string()),
            back.ok() == Some(data.into_bytes()),
        ));
        // The return is noticed by the next root check (every 100 ms): each round (and
        // the read of `old` below) starts with the store seeing t0 online again, waited
        // for rather than assumed after a sleep (a loaded machine delays the check).
        common::audit::wait_tier_online(&store.config, 0, true, Duration::from_secs(20));
    }
    // Read once: t0 is shown online only after the walk of its tree that puts its names
    // back, and root checks apply their samples in the order they were taken (session
    // 16; before, this had to be polled).
    let old = fs::read(m.path.join("old"));
    let on: Vec<Vec<usize>> = (0..3)
        .map(|i| store.tiers_holding(&format!("new{i}")))
        .collect();
    drop(m);
    for (name, w, read_back) in &results {
        assert!(
            w.is_ok() && *read_back,
            "{name}: create on the mount while t0's directory was away: {w:?}, read back \
             {read_back}; expected the file made on t1 (all: {results:?})"
        );
    }
    assert_eq!(on, vec![vec![1]; 3], "tiers holding new0..new2");
    assert_eq!(
        old.ok(),
        Some(b"on t0".to_vec()),
        "t0's file after it returned"
    );
}
