//! A tier that is full when the crawl lists a directory, then freed: `kaiso migrate
//! resume` must list the directory again and the migration must end with every source
//! file in the store exactly once (docs/migration.md, *Placement*). The session-11 audit
//! test (`migrate_audit.rs`, finding 1) checks that the crawl stops and `finish` refuses;
//! this one checks the way out an administrator takes after freeing space.
//!
//! Every wait is bounded; the daemon, its mount and the loop file system go on drop.

mod common;
#[path = "../../source/tests/common/mod.rs"]
mod source_servers;

use common::migrate_daemon::{Daemon, migrate_cmd, migrate_status_json, output_text, seeded_bytes};
use common::{Scratch, Store, StoreSpec, temp_dir};
use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Polls the first share's status until `done_when` holds, bounded by `limit`.
fn wait_share(
    config: &Path,
    limit: Duration,
    what: &str,
    done_when: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = migrate_status_json(config);
        if done_when(&v["shares"][0]) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "expected the share to be {what} within {limit:?}; last status {v:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Fills the file system of `dir` up to `leave` free bytes with one file, synced.
fn fill_leaving(path: &Path, free_now: u64, leave: u64) {
    let mut f = fs::File::create(path).unwrap();
    let chunk = vec![0x5a_u8; 1 << 20];
    let mut left = free_now.saturating_sub(leave);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        if f.write_all(&chunk[..n]).is_err() {
            break; // full already: what we wanted
        }
        left -= n as u64;
    }
    let _ = f.sync_all();
}

#[test]
fn resume_after_freeing_space_lists_the_directory_once_and_finish_completes() {
    fuse_or_skip!();
    if !source_servers::loop_ext4::available() {
        eprintln!("skipping: needs mkfs.ext4 and root");
        return;
    }
    let src = Scratch(temp_dir("full-resume-src"));
    let names: Vec<String> = (1..=3).map(|i| format!("f{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        fs::write(src.0.join(n), seeded_bytes(i as u64 + 21, 4 << 20)).unwrap();
    }
    let fsdir = Scratch(temp_dir("full-resume-fs"));
    let small = source_servers::loop_ext4::LoopExt4::new(&fsdir.0, 48 << 20);
    let tier = small.mnt.join("tier");
    fs::create_dir(&tier).unwrap();
    // Ballast next to the tier directory, outside the store: about 2 MiB stay free, so
    // the listing of the root (three stubs of 4 MiB, counted from creation) cannot fit.
    let ballast = small.mnt.join("ballast");
    fill_leaving(&ballast, small.avail(), 2 << 20);

    let store = Store::new("full-resume", StoreSpec::tiers(1));
    let cfg = fs::read_to_string(&store.config)
        .unwrap()
        .replace(&*store.tiers[0].to_string_lossy(), &tier.to_string_lossy());
    fs::write(&store.config, cfg).unwrap();

    let args: Vec<&OsStr> = vec![
        src.0.as_os_str(),
        store.config.as_os_str(),
        OsStr::new("--mount"),
        store.mountpoint.as_os_str(),
    ];
    let mut daemon = Daemon::start(
        &args,
        store.root.join("daemon.log"),
        Some(&store.mountpoint),
    )
    .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));

    let stuck = wait_share(&store.config, Duration::from_secs(120), "stuck", |s| {
        s["state"].as_str().unwrap_or("").starts_with("stuck")
    });
    let refused = migrate_cmd("finish", &store.config, &[], Duration::from_secs(60));
    assert!(
        !refused.status.success(),
        "finish must refuse while the root is unlisted; status {stuck:#}\n{}",
        output_text(&refused)
    );

    fs::remove_file(&ballast).unwrap();
    let resumed = migrate_cmd("resume", &store.config, &[], Duration::from_secs(60));
    assert!(resumed.status.success(), "{}", output_text(&resumed));
    let done = wait_share(&store.config, Duration::from_secs(120), "done", |s| {
        s["state"].as_str() == Some("done")
    });

    let mut listed: Vec<String> = fs::read_dir(&store.mountpoint)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        names,
        "after resume the root must list each source file exactly once; status {done:#}\n{}",
        daemon.log_text()
    );
    let fin = migrate_cmd("finish", &store.config, &[], Duration::from_secs(120));
    assert!(
        fin.status.success(),
        "finish after a completed resume must succeed: {}\n{}",
        output_text(&fin),
        daemon.log_text()
    );
    for (i, n) in names.iter().enumerate() {
        let got = fs::read(store.mountpoint.join(n)).unwrap();
        assert!(
            got == seeded_bytes(i as u64 + 21, 4 << 20),
            "{n}: bytes differ from the source after finish"
        );
    }
    let st = daemon.stop();
    assert!(st.success(), "daemon stop: {st}\n{}", daemon.log_text());
    // After the daemon is gone the tier holds the plain files.
    for n in &names {
        assert!(
            tier.join(n).is_file(),
            "{n} is not a plain file on the tier"
        );
    }
}
