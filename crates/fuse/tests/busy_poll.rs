//! Busy-polling through a real mount (`kaiso_fuse::busy_poll`): a burst of requests is
//! polled for, an idle mount costs no CPU, the mount still serves requests and unmounts
//! cleanly, and a mount with polling off never polls. One test in this binary: it sets an
//! environment variable (polling whatever the machine's load) before any other thread runs.

mod common;
use common::{fuse_available, metadata_burst};
use kaiso_store::{Store, StoreConfig};
use std::time::{Duration, Instant};

/// CPU time (ns) of this process's FUSE threads (fuser workers and the gate's watchdog).
fn fuse_threads_cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm"))
                .is_ok_and(|c| c.starts_with("fuser-") || c.starts_with("kaiso-fuse"))
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn an_idle_mount_does_not_poll() {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for d in ["t0", "mnt"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"64MiB\"\n",
        dir.path().display()
    );
    // Poll even when the test machine is busy (the default holds off there).
    // SAFETY: no other thread of this test binary runs yet (its only test).
    unsafe { std::env::set_var(kaiso_fuse::busy_poll::ANY_LOAD_ENV, "1") };
    let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
    let opts = kaiso_fuse::MountOptions {
        threads: 4,
        ..Default::default()
    };
    let mnt = dir.path().join("mnt");
    // A long window, so that polling while idle would show.
    let window = Duration::from_micros(500);
    let m = kaiso_fuse::mount_with_busy_poll(store.clone(), &mnt, &opts, window).unwrap();

    metadata_burst(&mnt.join("a"), 500);
    let (caught, missed) = m.busy_polls();
    assert!(
        caught + missed > 0,
        "the workers never polled during a burst of 1,500 requests"
    );

    // Let the watchdog and the poll rule see the burst has ended, then stay idle.
    std::thread::sleep(Duration::from_millis(300));
    let (cpu0, t0) = (fuse_threads_cpu_ns(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let idle_cpu = fuse_threads_cpu_ns() - cpu0;
    let idle_wall = t0.elapsed();
    // A poll that never ended would burn the whole second; parked workers waking once
    // a second cost microseconds.
    assert!(
        idle_cpu < 20_000_000,
        "the FUSE threads used {} ms of CPU in {idle_wall:?} of idleness",
        idle_cpu / 1_000_000
    );

    // Still serving after the idle time.
    metadata_burst(&mnt.join("b"), 50);
    std::fs::write(mnt.join("data"), b"still served").unwrap();
    assert_eq!(std::fs::read(mnt.join("data")).unwrap(), b"still served");

    let t = Instant::now();
    m.unmount().unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "unmounting took {:?}",
        t.elapsed()
    );
    assert!(!kaiso_fuse::is_mountpoint(&mnt));

    // Busy-polling off (`kaiso mount --busy-poll-us 0`): the same burst is never polled
    // for, although this binary lets the workers poll whatever the machine's load.
    let m = kaiso_fuse::mount_with_busy_poll(store.clone(), &mnt, &opts, Duration::ZERO).unwrap();
    metadata_burst(&mnt.join("c"), 200);
    assert_eq!(m.busy_polls(), (0, 0));
    m.unmount().unwrap();
    store.shutdown();
}
