//! Following the caller's CPU must never make a FUSE worker wait on a caller's exec.
//!
//! The deadlock this guards against (seen in session 15): an exec closes the process's
//! close-on-exec descriptors while it holds the process's `exec_update_lock`; closing one
//! on the mount sends FLUSH and waits for the reply; a FUSE worker that reads the caller's
//! `/proc/<pid>/stat` to learn its CPU waits for that same lock before it can reply. Here a
//! child opens a file on a fresh mount (following forced on, whatever the load) with
//! `O_CLOEXEC`, waits a little (so the FLUSH is the first request after a quiet spell,
//! which the session-15 rule sampled at once), and execs `true`. The kernel sends FLUSH
//! until the first ENOSYS answer, so each round mounts afresh. A round that does not end
//! within a generous bound is a deadlock: the test aborts the connection
//! (`umount2(MNT_FORCE)`), which frees the child and the worker, and fails.

mod common;
use common::fuse_available;
use kaiso_fuse::follow::FollowCaller;
use kaiso_store::{Store, StoreConfig};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rounds (fresh mounts), and how long one exec may take before it counts as a deadlock.
const ROUNDS: usize = 24;
const EXEC_BOUND: Duration = Duration::from_secs(30);

/// A one-tier store under `dir` (a directory of its own per round).
fn store(dir: &Path) -> Arc<Store> {
    for d in ["t0", "mnt"] {
        std::fs::create_dir(dir.join(d)).unwrap();
    }
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"64MiB\"\n",
        dir.display()
    );
    Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap()
}

/// Starts `true` from a child that first opens `file` close-on-exec and sleeps `gap`.
fn exec_with_cloexec_fd_on(file: &Path, gap: Duration) -> std::process::Child {
    let path = std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap();
    let ts = libc::timespec {
        tv_sec: gap.as_secs() as libc::time_t,
        tv_nsec: gap.subsec_nanos() as libc::c_long,
    };
    let mut cmd = Command::new("true");
    // SAFETY: only async-signal-safe calls (open, nanosleep) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::nanosleep(&ts, std::ptr::null_mut());
            Ok(())
        });
    }
    cmd.spawn()
        .expect("spawn `true` with a descriptor on the mount")
}

#[test]
fn a_caller_that_execs_with_a_cloexec_fd_on_the_mount_is_served() {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return;
    }
    let start = Instant::now();
    for round in 0..ROUNDS {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let mnt = dir.path().join("mnt");
        let opts = kaiso_fuse::MountOptions {
            threads: 4,
            follow: FollowCaller {
                enabled: true,
                under_load: true,
            },
            ..Default::default()
        };
        let m = kaiso_fuse::mount(store.clone(), &mnt, &opts).unwrap();
        // Made with MKNOD, not opened: the first close on the mount must be the exec's
        // (the kernel stops sending FLUSH after the first ENOSYS answer).
        let file = mnt.join("f");
        let c = std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid path.
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFREG | 0o644, 0) };
        assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
        // A burst first (the rule samples dense requests), then the exec: half the rounds
        // right after it, half after a quiet spell.
        for i in 0..64 {
            std::fs::metadata(&file).unwrap();
            let _ = std::fs::metadata(mnt.join(format!("missing{i}")));
        }
        let gap = if round % 2 == 0 {
            Duration::from_millis(120)
        } else {
            Duration::ZERO
        };
        // `spawn` returns once the exec is done (or failed): run it aside, bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let f2 = file.clone();
        let spawner = std::thread::spawn(move || {
            let status = exec_with_cloexec_fd_on(&f2, gap).wait().unwrap();
            let _ = tx.send(status);
        });
        let status = rx.recv_timeout(EXEC_BOUND).ok();
        if status.is_none() {
            // Abort the connection: the FLUSH fails, the exec and the worker go on.
            let c = std::ffi::CString::new(mnt.as_os_str().as_bytes()).unwrap();
            // SAFETY: a valid path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_FORCE) };
            let _ = spawner.join();
            let stats = m.follow_stats();
            drop(m);
            store.shutdown();
            panic!(
                "round {round}: a child exec'ing with a close-on-exec descriptor on the mount \
                 did not finish within {EXEC_BOUND:?} (a FUSE worker waits on the caller's \
                 exec); follow stats {stats:?}"
            );
        }
        spawner.join().unwrap();
        assert!(status.unwrap().success(), "round {round}: `true` failed");
        // The mount still serves.
        std::fs::metadata(&file).unwrap();
        m.unmount().unwrap();
        store.shutdown();
    }
    eprintln!("{ROUNDS} exec rounds in {:?}", start.elapsed());
}
