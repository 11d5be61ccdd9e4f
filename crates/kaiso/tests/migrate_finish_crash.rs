//! `kaiso migrate finish` killed (SIGKILL) at each step of its removal of the share's
//! state, then run again: the second `finish` completes the job, or says in one line
//! that the share is finished; either way nothing of the migration is left in the state
//! directory but the report, `status` names the share, and the tier holds the source's
//! files. The kill comes from the finishing process itself (`KAISO_FINISH_CRASH_AT`, see
//! `kaiso_store::migrate::finish`), at the exact step, in a child process.
//!
//! Also: `finish` refuses while source entries were left out unless `--accept-skipped`.
//!
//! Every wait is bounded; daemons are stopped and scratch directories removed on drop.

mod common;

use common::migrate_daemon::{Daemon, migrate_cmd, migrate_status_json, output_text};
use common::{Scratch, Store, StoreSpec, temp_dir};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A small source: two files and a directory with one file (and `extra` names).
fn source(tag: &str, extra: &[&str]) -> Scratch {
    let s = Scratch(temp_dir(tag));
    fs::create_dir_all(s.0.join("d")).unwrap();
    fs::write(s.0.join("a"), b"alpha\n").unwrap();
    fs::write(s.0.join("b"), vec![7u8; 100_000]).unwrap();
    fs::write(s.0.join("d/c"), b"gamma\n").unwrap();
    for n in extra {
        fs::write(s.0.join(n), b"x").unwrap();
    }
    s
}

/// Runs a daemon for `src` over `store` (NFS face only: no FUSE needed) until the crawl
/// is done, then stops it cleanly.
fn migrate_to_done(src: &Path, store: &Store) {
    let args: Vec<&OsStr> = vec![
        src.as_os_str(),
        store.config.as_os_str(),
        OsStr::new("--nfs"),
        OsStr::new("127.0.0.1:0"),
    ];
    let mut d = Daemon::start(&args, store.root.join("daemon.log"), None)
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = migrate_status_json(&store.config);
        let sh = &v["shares"][0];
        if sh["state"] == "done" && sh["remaining_stubs"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the crawl was not done within 60 s: {v:#}\n{}",
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let st = d.stop();
    assert!(st.success(), "daemon stop: {st}\n{}", d.log_text());
}

fn finish_env(config: &Path, extra: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut args = vec![
        OsStr::new("migrate"),
        OsStr::new("finish"),
        config.as_os_str(),
    ];
    args.extend(extra.iter().map(OsStr::new));
    common::migrate_daemon::run_kaiso_bounded(&args, env, Duration::from_secs(120))
}

const STEPS: [&str; 6] = [
    "verified", "anchors", "report", "detached", "removing", "removed",
];

#[test]
fn a_finish_killed_at_any_step_is_completed_by_the_next() {
    for step in STEPS {
        let src = source(&format!("fincrash-src-{step}"), &[]);
        let store = Store::new(&format!("fincrash-{step}"), StoreSpec::tiers(1));
        migrate_to_done(&src.0, &store);
        let killed = finish_env(&store.config, &[], &[("KAISO_FINISH_CRASH_AT", step)]);
        assert_eq!(
            killed.status.signal(),
            Some(libc::SIGKILL),
            "step {step}: the first finish must be killed at the step: {}",
            output_text(&killed)
        );
        let migrate_dir = store.state.join("migrate");
        let report = migrate_dir.join("main.finished.txt");
        // What the kill left must be something status can name.
        let v = migrate_status_json(&store.config);
        assert_eq!(
            v["shares"][0]["name"], "main",
            "step {step}: status after the kill must name the share: {v:#}"
        );
        let again = finish_env(&store.config, &[], &[]);
        let out = output_text(&again);
        let detached = matches!(step, "detached" | "removing" | "removed");
        if detached {
            // The first finish got past the point of no return: the share is finished.
            let err = String::from_utf8_lossy(&again.stderr);
            assert!(
                !again.status.success()
                    && err.contains("already finished")
                    && err.trim().lines().count() == 1,
                "step {step}: the second finish must say in one line that the share is finished: {out}"
            );
            assert_eq!(v["shares"][0]["state"], "finished", "step {step}: {v:#}");
        } else {
            assert!(
                again.status.success() && out.contains("share main finished"),
                "step {step}: the second finish must complete: {out}"
            );
        }
        // Nothing of the migration left but the report; the files are plain and equal.
        assert!(
            report.exists(),
            "step {step}: no report {}",
            report.display()
        );
        let left: Vec<_> = fs::read_dir(&migrate_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "main.finished.txt")
            .collect();
        assert!(left.is_empty(), "step {step}: left in migrate/: {left:?}");
        assert!(
            !store.state.join("migrate.finishing").exists(),
            "step {step}: migrate.finishing/ left behind"
        );
        for r in ["a", "b", "d/c"] {
            assert_eq!(
                fs::read(store.tiers[0].join(r)).ok(),
                fs::read(src.0.join(r)).ok(),
                "step {step}: {r} differs from the source"
            );
        }
        // And a third finish says the share is finished.
        let third = finish_env(&store.config, &[], &[]);
        assert!(
            !third.status.success()
                && String::from_utf8_lossy(&third.stderr).contains("already finished"),
            "step {step}: a finish after completion must say the share is finished: {}",
            output_text(&third)
        );
    }
}

/// A source name the store may not create (its temporary-file prefix) is left out and
/// reported: `finish` refuses then, changing nothing, and finishes with
/// `--accept-skipped`, counting it.
#[test]
fn finish_refuses_left_out_entries_unless_accepted() {
    let src = source("fincrash-skip-src", &[".kaiso-tmp-x"]);
    let store = Store::new("fincrash-skip", StoreSpec::tiers(1));
    migrate_to_done(&src.0, &store);
    let refused = migrate_cmd("finish", &store.config, &[], Duration::from_secs(120));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && err.contains("--accept-skipped")
            && err.contains(".kaiso-tmp-x"),
        "finish with an entry left out must refuse and name it and the flag: {}",
        output_text(&refused)
    );
    assert!(
        store.state.join("migrate/main/migrate.db").exists(),
        "a refused finish must leave the share's state"
    );
    let done = migrate_cmd(
        "finish",
        &store.config,
        &["--accept-skipped"],
        Duration::from_secs(120),
    );
    let out = output_text(&done);
    assert!(
        done.status.success() && out.contains("; 1 skipped") && out.contains(".kaiso-tmp-x"),
        "finish --accept-skipped must finish and list the entry: {out}"
    );
}
