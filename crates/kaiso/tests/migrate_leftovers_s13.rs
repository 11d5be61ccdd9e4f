//! Issue 4 leftovers of the session-12 audit (session 13), with the real `kaiso` binary:
//! status figures of a paused share and right after a burst, a finished share's name
//! taken by a new share, and a daemon that is not root fetching into read-only files.
//!
//! Every wait is bounded; daemons and mounts are stopped on drop.

mod common;

use common::migrate_daemon::{
    Daemon, migrate_cmd, migrate_status_json, output_text, seeded_bytes as bytes,
    wait_logged_serving, wait_share_status, write_numbered_files,
};
use common::{Scratch, Store, StoreSpec};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// `kaiso migrate start SOURCE CONFIG [--mount MNT] EXTRA…`, serving.
fn start(source: &Path, store: &Store, extra: &[&str], mounted: bool) -> Result<Daemon, String> {
    let mut args: Vec<&OsStr> = vec![source.as_os_str(), store.config.as_os_str()];
    if mounted {
        args.push(OsStr::new("--mount"));
        args.push(store.mountpoint.as_os_str());
    }
    args.extend(extra.iter().map(OsStr::new));
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = store.root.join(format!("daemon-{n}.log"));
    Daemon::start(&args, log, mounted.then_some(store.mountpoint.as_path()))
}

fn run_ok(verb: &str, config: &Path, extra: &[&str]) {
    let o = migrate_cmd(verb, config, extra, Duration::from_secs(30));
    assert!(
        o.status.success(),
        "kaiso migrate {verb}: {}",
        output_text(&o)
    );
}

/// `kaiso migrate status CONFIG` (text), which must succeed.
fn status_text(config: &Path) -> String {
    let o = migrate_cmd("status", config, &[], Duration::from_secs(30));
    assert!(o.status.success(), "{}", output_text(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn f64_of(v: &serde_json::Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// Waits (bounded) until the first share's `bytes_fetched` holds still for 1 s (a unit
/// in flight at `pause` completes after it) and returns it.
fn settled_bytes(config: &Path) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = migrate_status_json(config)["shares"][0]["bytes_fetched"]
        .as_u64()
        .unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = migrate_status_json(config)["shares"][0]["bytes_fetched"]
            .as_u64()
            .unwrap();
        if now == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "bytes_fetched still moving 30 s after pause"
        );
        last = now;
    }
}

// ---------------------------------------------------------------------------------------
// 1. A paused share has no rate and no ETA.
// ---------------------------------------------------------------------------------------

/// A crawl throttled to 1 MiB/s runs until `status` shows a rate, then is paused.
/// Expected at once (well within the 10 s rate window): `status --json` says
/// `paused: true`, rates 0 and `eta_secs` null; the text's rate line says `paused` and
/// shows neither a rate nor an ETA. (Session 12: the rate of the last 10 s before the
/// pause and an ETA from it.)
#[test]
fn a_paused_share_shows_no_rate_and_no_eta() {
    let src = Scratch::new("s13-pause-src");
    write_numbered_files(&src.0, "d", 40, MIB / 2);
    let store = Store::new("s13-pause", StoreSpec::tiers(1));
    let mut d = start(
        &src.0,
        &store,
        &["--rate", "1MiB", "--chunk", "256KiB", "--parallel", "2"],
        false,
    )
    .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    wait_share_status(
        &store.config,
        Duration::from_secs(60),
        "a crawl rate shown",
        |s| s["state"] == "running" && f64_of(&s["bytes_per_sec"]) > 0.0,
    );
    run_ok("pause", &store.config, &[]);
    let v = migrate_status_json(&store.config);
    let text = status_text(&store.config);
    d.stop();
    let s = &v["shares"][0];
    assert!(
        s["state"] == "paused"
            && s["paused"] == true
            && f64_of(&s["bytes_per_sec"]) == 0.0
            && f64_of(&s["files_per_sec"]) == 0.0
            && s["eta_secs"].is_null(),
        "expected a paused share to show paused: true, rates 0 and no ETA in \
         `status --json`, got {s:#}"
    );
    let rate_line = text
        .lines()
        .find(|l| l.trim_start().starts_with("rate"))
        .unwrap_or_else(|| panic!("no rate line in\n{text}"));
    assert!(
        rate_line.contains("paused") && !rate_line.contains("/s") && !rate_line.contains("second"),
        "expected the rate line of a paused share to say paused, with no rate and no ETA: \
         {rate_line:?}\n{text}"
    );
}

// ---------------------------------------------------------------------------------------
// 2. The rate right after a resume and a burst is bytes over the time they took.
// ---------------------------------------------------------------------------------------

/// The crawl (1 MiB/s) runs a few seconds, is paused 2 s, resumed, and right after the
/// resume a client reads a 6 MiB file (`z/y/burst`, not crawled yet) through the mount (a burst of on-demand fetches,
/// not throttled). 1.5 s after the resume, `status` must show as rate the bytes fetched
/// since the resume over the time since the resume: the test brackets both (the bytes
/// are the status's own `bytes_fetched`, the time lies between the end of `resume` and
/// the start of `status`, and between the start of `resume` and the end of `status`).
/// Session 12 divided the counters' growth over its once-a-second samples of the last
/// 10 s by their span: the bytes fetched before the pause counted, the ones since the
/// last sample did not.
#[test]
fn the_rate_after_a_resume_and_a_burst_is_bytes_over_the_time_they_took() {
    fuse_or_skip!();
    let src = Scratch::new("s13-burst-src");
    write_numbered_files(&src.0, "d", 40, MIB / 2);
    let burst = bytes(777, 6 * MIB);
    // Deeper than the 20 MiB of `d/`: the crawl (BFS, 1 MiB/s) does not reach it first.
    fs::create_dir_all(src.0.join("z/y")).unwrap();
    fs::write(src.0.join("z/y/burst"), &burst).unwrap();
    let store = Store::new("s13-burst", StoreSpec::tiers(1));
    let mut d = start(
        &src.0,
        &store,
        &["--rate", "1MiB", "--chunk", "256KiB", "--parallel", "2"],
        true,
    )
    .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    wait_share_status(
        &store.config,
        Duration::from_secs(60),
        "a crawl rate shown",
        |s| s["state"] == "running" && f64_of(&s["bytes_per_sec"]) > 0.0,
    );
    // A few seconds of crawling go into the samples before the pause.
    std::thread::sleep(Duration::from_secs(3));
    run_ok("pause", &store.config, &[]);
    settled_bytes(&store.config);
    std::thread::sleep(Duration::from_secs(1));
    let b0 = migrate_status_json(&store.config)["shares"][0]["bytes_fetched"]
        .as_u64()
        .unwrap();
    let before_resume = Instant::now();
    run_ok("resume", &store.config, &[]);
    let after_resume = Instant::now();
    let read = fs::read(store.mountpoint.join("z/y/burst")).expect("read the burst file");
    assert!(
        read == burst,
        "the burst file read back differs from the source"
    );
    let ask_at = after_resume + Duration::from_millis(1500);
    std::thread::sleep(ask_at.saturating_duration_since(Instant::now()));
    let before_status = Instant::now();
    let v = migrate_status_json(&store.config);
    let after_status = Instant::now();
    d.stop();
    let s = &v["shares"][0];
    let b1 = s["bytes_fetched"].as_u64().unwrap();
    let rate = f64_of(&s["bytes_per_sec"]);
    let grown = (b1 - b0) as f64;
    let low = grown / (after_status - before_resume).as_secs_f64();
    let high = grown / (before_status - after_resume).as_secs_f64();
    assert!(
        b1 - b0 >= burst.len() as u64,
        "the burst's on-demand fetches must be counted: {} bytes since the resume",
        b1 - b0
    );
    assert!(
        rate >= low * 0.999 && rate <= high * 1.001,
        "expected the rate 1.5 s after the resume to be the {grown} bytes fetched since \
         the resume over the time since the resume, i.e. between {low:.0} and {high:.0} \
         B/s; status shows {rate:.0} B/s ({s:#})"
    );
}

// ---------------------------------------------------------------------------------------
// 3. A finished share's name is not given to a new share.
// ---------------------------------------------------------------------------------------

/// Share `a` is migrated and finished; its report is `<state_dir>/migrate/a.finished.txt`.
/// A new share from another source, into another directory, is then started under the
/// same name: added to the running daemon, and as a fresh daemon. Session 12 accepted
/// it, and its `finish` overwrote `a`'s report. Expected: refused in one line that names
/// the kept report, the report unchanged, and `status` still listing `a` as finished.
#[test]
fn a_finished_shares_name_is_refused_for_a_new_share() {
    let src1 = Scratch::new("s13-name-src1");
    write_numbered_files(&src1.0, "d", 3, 1000);
    let src2 = Scratch::new("s13-name-src2");
    write_numbered_files(&src2.0, "e", 2, 500);
    let store = Store::new("s13-name", StoreSpec::tiers(1));
    let mut d = start(&src1.0, &store, &["--into", "a", "--share", "a"], false)
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    let o = migrate_cmd(
        "finish",
        &store.config,
        &["--share", "a", "--wait", "60s"],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "finish a: {}", output_text(&o));
    let report = store.state.join("migrate").join("a.finished.txt");
    let kept = fs::read(&report).expect("a's finish report");
    let refused = |o: &std::process::Output, how: &str| {
        let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
        assert!(
            !o.status.success()
                && err.lines().count() == 1
                && err.contains(&report.display().to_string()),
            "expected {how} of a new share named like finished share a to be refused in \
             one line naming a's report {}: {}",
            report.display(),
            output_text(o)
        );
        assert_eq!(
            fs::read(&report).unwrap(),
            kept,
            "a's report changed ({how})"
        );
    };
    // Added to the running daemon.
    let args: Vec<&OsStr> = vec![
        OsStr::new("migrate"),
        OsStr::new("start"),
        src2.0.as_os_str(),
        store.config.as_os_str(),
        OsStr::new("--into"),
        OsStr::new("b"),
        OsStr::new("--share"),
        OsStr::new("a"),
    ];
    let o = common::migrate_daemon::run_kaiso_bounded(&args, &[], Duration::from_secs(30));
    if o.status.success() {
        // Show what the reuse leads to: a's report is replaced by the new share's.
        let f = migrate_cmd(
            "finish",
            &store.config,
            &["--share", "a", "--wait", "60s"],
            Duration::from_secs(90),
        );
        let now = fs::read(&report).unwrap_or_default();
        panic!(
            "a new share took finished share a's name (added to the running daemon); its \
             finish exited {} and a's report was {}",
            f.status,
            if now == kept { "kept" } else { "overwritten" }
        );
    }
    refused(&o, "adding it to the running daemon");
    let v = migrate_status_json(&store.config);
    assert!(
        v["shares"].as_array().is_some_and(|a| a
            .iter()
            .any(|s| s["name"] == "a" && s["state"] == "finished")),
        "status must still list a as finished: {v:#}"
    );
    d.stop();
    // A fresh daemon.
    let o = common::migrate_daemon::run_kaiso_bounded(&args, &[], Duration::from_secs(30));
    refused(&o, "a fresh start");
    assert!(
        !store.state.join("migrate").join("a").exists(),
        "a refused start must leave no state for the new share"
    );
}

// ---------------------------------------------------------------------------------------
// 4. A daemon that is not root fetches into files whose mode denies their owner write.
// ---------------------------------------------------------------------------------------

/// `kaiso migrate start` as uid/gid 65534 (NFS face only: no FUSE needed) over a POSIX
/// source whose root-owned, world-readable files are 0444, 0555 and 0644. The stubs are
/// created with the source's mode, owned by the daemon's user; session 12's fetch then
/// opened a 0444 stub for writing and got EACCES: the crawl ended stuck and `finish`
/// was refused. Expected: every file migrated with its bytes, the source's mode, owned
/// by uid 65534, and `finish` succeeds.
#[test]
fn a_daemon_that_is_not_root_fetches_into_read_only_files() {
    use std::os::unix::process::CommandExt;
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: needs root to start the daemon as another user");
        return;
    }
    let src = Scratch::new("s13-ro-src");
    fs::create_dir_all(src.0.join("sub")).unwrap();
    let files: [(&str, u32, Vec<u8>); 4] = [
        ("ro", 0o444, bytes(1, 300_000)),
        ("rx", 0o555, bytes(2, 5000)),
        ("rw", 0o644, bytes(3, 7000)),
        ("sub/ro", 0o444, bytes(4, 1_500_000)),
    ];
    for (rel, mode, data) in &files {
        let p = src.0.join(rel);
        fs::write(&p, data).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(*mode)).unwrap();
    }
    fs::set_permissions(src.0.join("sub"), fs::Permissions::from_mode(0o755)).unwrap();
    let store = Store::new("s13-ro", StoreSpec::tiers(1));
    for d in [&store.tiers[0], &store.state] {
        std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
    }
    fs::set_permissions(&store.config, fs::Permissions::from_mode(0o644)).unwrap();
    let log = store.root.join("daemon.log");
    let f = fs::File::create(&log).unwrap();
    let child = std::process::Command::new(common::kaiso_bin())
        .args(["migrate", "start"])
        .arg(&src.0)
        .arg(&store.config)
        .args(["--nfs", "127.0.0.1:0", "--chunk", "256KiB"])
        .uid(65534)
        .gid(65534)
        .env_remove("KAISO_SMB_PASSWORD")
        .stdin(std::process::Stdio::null())
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .expect("spawn kaiso as uid 65534");
    // The daemon as uid 65534, stopped with SIGTERM (bounded) on drop (the common
    // `Daemon` starts as the test's user only).
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
            if common::migrate_daemon::wait_child(&mut self.0, Duration::from_secs(10)).is_none() {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let guard = Stop(child);
    wait_logged_serving(&log);
    let v = wait_share_status(
        &store.config,
        Duration::from_secs(60),
        "the crawl ends (done or stuck)",
        |s| s["state"] == "done" || s["state"].as_str().is_some_and(|t| t.starts_with("stuck")),
    );
    let fin = migrate_cmd("finish", &store.config, &[], Duration::from_secs(120));
    drop(guard);
    let got: Vec<String> = files
        .iter()
        .map(|(rel, mode, data)| {
            let p = store.tiers[0].join(rel);
            let same = fs::read(&p).is_ok_and(|d| d == *data);
            let m = fs::metadata(&p)
                .map(|m| format!("mode {:o} uid {}", m.mode() & 0o7777, m.uid()))
                .unwrap_or_else(|e| e.to_string());
            format!("{rel}: bytes equal {same}, {m} (source mode {mode:o})")
        })
        .collect();
    let all_good = files.iter().all(|(rel, mode, data)| {
        let p = store.tiers[0].join(rel);
        fs::read(&p).is_ok_and(|d| d == *data)
            && fs::metadata(&p).is_ok_and(|m| m.mode() & 0o7777 == *mode && m.uid() == 65534)
    });
    assert!(
        v["shares"][0]["state"] == "done" && fin.status.success() && all_good,
        "a daemon running as uid 65534 must fetch into the 0444/0555 files it created and \
         leave the source's modes: crawl {}, failures {:#}\nfinish: {}\nfiles:\n{}",
        v["shares"][0]["state"],
        v["shares"][0]["crawl_failures"],
        output_text(&fin),
        got.join("\n")
    );
}
