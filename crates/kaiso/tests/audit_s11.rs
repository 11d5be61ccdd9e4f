//! Session 11 audit of issue 2 with the real binary on a real mount: what an application
//! or an operator tripped over. Each test failed on the tree the audit started from; the
//! ones fixed during the session run normally, the others are ignored with the reason
//! (`cargo test --release -p kaiso --test audit_s11 -- --ignored`).

mod common;

use common::audit::{moving_files, pattern, wait_for};
use common::{Store, StoreSpec, TierSpec};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// A write that must spill its file finds the file being moved by an operator command
/// (`kaiso demote`) and fails with EBUSY. `spill` (crates/store/src/dataops.rs) returns
/// the mover's "already being moved" error to the writer instead of waiting for that
/// move and retrying; `write(2)` of a regular file never returns EBUSY on ext4.
/// Failed on the 19:30 UTC tree (base 398fafe) (EBUSY); passes with session 11's
/// `Store::spill` (waits for the move in flight).
#[test]
fn write_that_spills_a_file_being_moved_does_not_fail_with_ebusy() {
    fuse_or_skip!();
    let store = Store::new(
        "audit-spill-busy",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast").capacity(4 * MIB as u64),
            TierSpec::new("slow"),
        ])
        // Operator moves are paced at max_rate: 3 MiB at 512 KiB/s take about 6 s,
        // long enough for the writer below to fill the fast tier during the move.
        // Writers are served through kaiso (no passthrough reserve), as on any tier
        // too small for one.
        .extra("passthrough_writes = false\n[store.mover]\nenabled = false\nmax_rate = \"512KiB\""),
    );
    let original = pattern(1, 3 * MIB);
    store.seed(0, "f", &original);
    let m = store.mount();
    let f = m.path.join("f");
    let mut demote = Command::new(common::kaiso_bin())
        .args(["demote", "--tier", "slow"])
        .arg(&f)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kaiso demote");
    assert!(
        wait_for(Duration::from_secs(10), || moving_files(&store.config) > 0),
        "kaiso demote never showed a move in flight in `kaiso status --json`"
    );
    // 2 MiB more do not fit the 4 MiB fast tier: the write must spill the file to slow.
    let extra = pattern(2, 2 * MIB);
    let mut w = fs::OpenOptions::new().append(true).open(&f).unwrap();
    let mut errors = Vec::new();
    for (i, chunk) in extra.chunks(64 * KIB).enumerate() {
        if let Err(e) = w.write_all(chunk) {
            errors.push(format!("append {i} at {} KiB: {e}", 3 * 1024 + i * 64));
            break;
        }
    }
    drop(w);
    let _ = demote.wait();
    assert!(
        errors.is_empty(),
        "appends to a file being demoted, with the slow tier unlimited, must all succeed \
         (the spill should wait for the move in flight); got: {errors:?}"
    );
    let mut want = original;
    want.extend_from_slice(&extra);
    assert!(
        fs::read(&f).unwrap() == want,
        "content after the appends differs"
    );
}

/// Eight writers fill a store whose two fast tiers are tiny while the planner and an
/// operator loop move the same files. The slow tier has no limit, so no write may fail:
/// spills fail today with EBUSY (the file is being moved) and ENOSPC (the tier `spill`
/// chose filled before its move reserved room there; it does not try the next tier).
/// Failed on the 19:30 UTC tree (base 398fafe) in 3 of 3 runs; passes with session 11's
/// `Store::spill`.
#[test]
fn concurrent_writers_spill_without_errors_while_files_move() {
    fuse_or_skip!();
    let store = Store::new(
        "audit-spill-many",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast")
                .capacity(4 * MIB as u64)
                .watermarks(0.3, 0.6),
            TierSpec::new("mid")
                .capacity(8 * MIB as u64)
                .watermarks(0.3, 0.6),
            TierSpec::new("slow"),
        ])
        .extra("passthrough_writes = false")
        .mover_interval_ms(100),
    );
    let m = store.mount();
    let root = m.path.clone();
    let stop = Arc::new(AtomicBool::new(false));
    // The operator moves everything up and down meanwhile.
    let mover = {
        let root = root.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let cmd = if i.is_multiple_of(2) {
                    "demote"
                } else {
                    "promote"
                };
                let _ = Command::new(common::kaiso_bin())
                    .args([cmd, "-r", "--no-wait"])
                    .arg(&root)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
                i += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    // Rounds of 8 writers × 10 files of 1 MiB, deleted after each round so that new
    // files start on the fast tiers again and spill as they grow.
    let mut errors: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rounds = 0;
    while rounds < 8 && errors.is_empty() && Instant::now() < deadline {
        rounds += 1;
        let writers: Vec<_> = (0..8u8)
            .map(|w| {
                let root = root.clone();
                std::thread::spawn(move || {
                    let mut errors = Vec::new();
                    for i in 0..10u8 {
                        let p = root.join(format!("w{w}-{i}"));
                        let data = pattern(w.wrapping_mul(16).wrapping_add(i), MIB);
                        let r = (|| -> std::io::Result<()> {
                            let mut f = fs::OpenOptions::new()
                                .write(true)
                                .create(true)
                                .truncate(true)
                                .mode(0o644)
                                .open(&p)?;
                            for c in data.chunks(64 * KIB) {
                                f.write_all(c)?;
                            }
                            Ok(())
                        })();
                        if let Err(e) = r {
                            errors.push(format!("{}: {e}", p.display()));
                        } else if fs::read(&p).map(|d| d != data).unwrap_or(true) {
                            errors.push(format!("{}: content differs", p.display()));
                        }
                    }
                    errors
                })
            })
            .collect();
        errors.extend(writers.into_iter().flat_map(|h| h.join().unwrap()));
        for e in fs::read_dir(&root).unwrap().flatten() {
            let _ = fs::remove_file(e.path());
        }
    }
    stop.store(true, Ordering::Relaxed);
    mover.join().unwrap();
    assert!(
        errors.is_empty(),
        "rounds of 80 MiB written by 8 writers into a store whose slow tier is unlimited: \
         every write must succeed (writes spill); round {rounds} got {} failures: {errors:?}",
        errors.len()
    );
}

/// `kaiso mount CONFIG DIR` where DIR is a tier directory (e.g. right after `kaiso adopt
/// DIR`, to keep the data at its old path), lies inside one, contains one, or is the
/// state directory: kaiso reaches its tiers by path, so after mounting every access to
/// them went through its own mount and the first `ls` or `cat` hung for good (even
/// `kill -9` of the caller and the daemon did not end it; only an abort through
/// /sys/fs/fuse/connections did). Fixed in session 11 (`check_mountpoint_apart` in
/// crates/kaiso/src/cmd/mount.rs): refused before mounting, naming the tier.
#[test]
fn mountpoint_on_inside_or_above_a_tier_is_refused() {
    fuse_or_skip!();
    let store = Store::new("audit-mnt-in-tier", StoreSpec::tiers(2));
    store.seed(0, "file", b"data");
    fs::create_dir_all(store.tiers[1].join("sub")).unwrap();
    let cases = [
        (
            "the tier directory itself",
            store.tiers[0].clone(),
            "tier t0",
        ),
        (
            "a directory inside a tier",
            store.tiers[1].join("sub"),
            "tier t1",
        ),
        ("the state directory", store.state.clone(), "state_dir"),
        (
            "a directory containing the tiers",
            store.root.clone(),
            "tier t0",
        ),
    ];
    for (what, mountpoint, named) in cases {
        match store.try_mount_at(&mountpoint) {
            Ok(m) => {
                // Touch nothing below it: any access would hang.
                drop(m);
                panic!(
                    "kaiso mount on {what} ({}) mounted; expected a refusal naming {named}",
                    mountpoint.display()
                );
            }
            Err(log) => {
                assert!(
                    log.contains(named) && log.contains("mount it elsewhere"),
                    "mount on {what}: the refusal should name {named} and say to mount \
                     elsewhere, got:\n{log}"
                );
                assert!(!log.contains("panicked"), "{log}");
                assert!(!common::is_mounted(&mountpoint), "{what} left mounted");
            }
        }
    }
    // The store itself is fine: mounted at its own mountpoint it serves the file.
    let m = store.mount();
    assert_eq!(fs::read(m.path.join("file")).unwrap(), b"data");
}

/// `kaiso fsck CONFIG` on a mounted store (through its control socket) while a move is
/// copying: the scan treats the move's hidden temporary file on the destination
/// (`.kaiso-tmp-…`) as a leftover of an interrupted move and deletes it (`temp files
/// removed: 1`), so the move fails ("I/O error (No such file or directory)") and the
/// operator's `kaiso demote` exits 1. The scan (crates/store/src/store.rs, `scan`,
/// `EntryKind::Temp`) should spare the temporary files of moves in flight (the mover's
/// `moving` set or the journal rows not yet done).
/// Failed on the 19:30 UTC tree (base 398fafe); passes with session 11's
/// `move_temp_in_flight` check in the scan.
#[test]
fn live_fsck_does_not_break_a_move_in_flight() {
    fuse_or_skip!();
    let store = Store::new(
        "audit-fsck-move",
        StoreSpec::with_tiers(vec![TierSpec::new("fast"), TierSpec::new("slow")])
            // 3 MiB at 512 KiB/s: the demote copies for about 6 s.
            .extra("[store.mover]\nenabled = false\nmax_rate = \"512KiB\""),
    );
    let data = pattern(3, 3 * MIB);
    store.seed(0, "f", &data);
    let m = store.mount();
    let f = m.path.join("f");
    let demote = Command::new(common::kaiso_bin())
        .args(["demote", "--tier", "slow"])
        .arg(&f)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kaiso demote");
    assert!(
        wait_for(Duration::from_secs(10), || moving_files(&store.config) > 0),
        "kaiso demote never showed a move in flight in `kaiso status --json`"
    );
    let fsck = store.kaiso(&["fsck", store.config.to_str().unwrap()]);
    let fsck_out = String::from_utf8_lossy(&fsck.stdout).into_owned();
    assert!(fsck.status.success(), "kaiso fsck failed: {fsck:?}");
    let out = demote.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kaiso demote of a file must succeed although `kaiso fsck` ran meanwhile; demote \
         said {:?} {:?}; fsck reported:\n{fsck_out}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(store.tiers_holding("f"), vec![1], "f should be on slow now");
    assert!(fs::read(&f).unwrap() == data, "content changed");
}

/// A bad `metrics` address in the configuration is only found when the daemon binds it,
/// and the error names neither the file, the line nor the key (`kaiso: cannot serve
/// metrics on notanaddr / caused by: invalid socket address`), unlike every other bad
/// value (issue 2, item 8: "a bad config names the key and line"). It should be checked
/// when the configuration is loaded (crates/store/src/config.rs), like `placement`.
/// Failed on the 19:30 UTC tree (base 398fafe); passes with session 11's load-time check in
/// config.rs.
#[test]
fn bad_metrics_address_names_line_and_key() {
    fuse_or_skip!();
    let store = Store::new(
        "audit-metrics-cfg",
        StoreSpec::tiers(2).extra("metrics = \"notanaddr\""),
    );
    let err = match store.try_mount_at(&store.mountpoint) {
        Ok(_) => panic!("a mount with metrics = \"notanaddr\" must be refused"),
        Err(e) => e,
    };
    let line = fs::read_to_string(&store.config)
        .unwrap()
        .lines()
        .position(|l| l.starts_with("metrics"))
        .unwrap()
        + 1;
    assert!(
        err.contains(&format!("line {line}")) && err.contains("store.metrics"),
        "the refusal should name line {line} and key store.metrics, got:\n{err}"
    );
    // `kaiso fsck` loads the same file: it should refuse it too, before opening anything.
    let out = store.kaiso(&["fsck", store.config.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "kaiso fsck accepted metrics = \"notanaddr\": {out:?}"
    );
}

/// `kaiso pin --tier fast F` then `kaiso demote F`: the demote moves the pinned file to
/// slow and exits 0, and `kaiso where` then shows it "on tier slow …, pinned to fast"
/// for good: the pin no longer holds and nothing brings the file back. Either the demote
/// should be refused naming the pin (as `kaiso pin` of a directory without -r is), or it
/// should move the pin with the file.
#[test]
fn demote_of_a_pinned_file_does_not_leave_it_off_its_pin() {
    fuse_or_skip!();
    let store = Store::new(
        "audit-pin-demote",
        StoreSpec::with_tiers(vec![TierSpec::new("fast"), TierSpec::new("slow")])
            .mover_interval_ms(100),
    );
    store.seed(1, "f", b"pinned data");
    let m = store.mount();
    let f = m.path.join("f");
    let f_str = f.to_str().unwrap();
    let pin = store.kaiso(&["pin", "--tier", "fast", f_str]);
    assert!(pin.status.success(), "kaiso pin failed: {pin:?}");
    assert_eq!(
        store.tiers_holding("f"),
        vec![0],
        "pin --tier fast should move f"
    );
    let demote = store.kaiso(&["demote", f_str]);
    let where_json = || -> serde_json::Value {
        let out = store.kaiso(&["where", "--json", f_str]);
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    };
    if demote.status.success() {
        // Accepted: within a few planning rounds the file must be where its pin says, or
        // no longer pinned (30 s: a move copies and syncs the file, and each check runs
        // `kaiso where`; a loaded machine is slow at both).
        let consistent = wait_for(Duration::from_secs(30), || {
            let w = where_json();
            w["pinned"].is_null() || w["tiers"][0] == w["pinned"]
        });
        assert!(
            consistent,
            "after `kaiso demote` of a file pinned to fast, it stays {} (pinned to {}); \
             expected the demote refused, the pin moved, or the file back on fast",
            where_json()["tiers"],
            where_json()["pinned"]
        );
    } else {
        let err = String::from_utf8_lossy(&demote.stderr);
        assert!(err.contains("pinned"), "refusal should name the pin: {err}");
        assert_eq!(store.tiers_holding("f"), vec![0]);
    }
    assert_eq!(fs::read(&f).unwrap(), b"pinned data");
}

/// `kaiso mount` stopped by SIGTERM while a client's working directory is inside the
/// mount: the unmount is refused (EBUSY), and before the fix the daemon exited with
/// "Device or resource busy" and left a dead mount (`Transport endpoint is not
/// connected`) that refused the next mount. Expected: the mount is detached lazily, the
/// daemon exits 0, and the store mounts there again.
#[test]
fn sigterm_with_a_client_inside_the_mount_detaches_it() {
    fuse_or_skip!();
    let store = Store::new(
        "audit-mount-busy",
        StoreSpec::with_tiers(vec![TierSpec::new("fast"), TierSpec::new("slow")]),
    );
    store.seed(0, "dir/f", b"still here");
    let m = store.mount();
    let mut client = Command::new("sleep")
        .arg("60")
        .current_dir(m.path.join("dir"))
        .spawn()
        .expect("start a client inside the mount");
    std::thread::sleep(Duration::from_millis(200));
    unsafe { libc::kill(m.pid().expect("daemon pid") as i32, libc::SIGTERM) };
    let log_path = m.log.clone();
    let status = m.unmount_after_exit();
    let still_mounted = common::is_mounted(&store.mountpoint);
    let _ = client.kill();
    let _ = client.wait();
    if still_mounted {
        common::force_unmount(&store.mountpoint);
    }
    let log = fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        !still_mounted && status.success(),
        "SIGTERM with a client's working directory in the mount must detach it and exit 0 \
         (exit {status}, still mounted {still_mounted}):\n{log}"
    );
    let again = store.mount();
    assert_eq!(fs::read(again.path.join("dir/f")).unwrap(), b"still here");
    assert_eq!(again.unmount().code(), Some(0));
}
