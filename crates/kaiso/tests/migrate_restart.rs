//! `kaiso migrate` with the real binary when a source is not there: a restart with one
//! of two shares' sources gone serves the store at once (the other share, complete
//! files, clients' files), fails that share's stubs promptly, says so in `status`, and
//! carries on once the source is back; a POSIX source on a hung mount (a `kaiso mount`
//! whose daemon is stopped with SIGSTOP) fails client reads after the source's
//! `timeout` instead of hanging them, and the crawl ends `stuck` instead of hanging.
//! Every wait is bounded; daemons, mounts and stopped processes are cleaned up on drop.

mod common;

use common::migrate_daemon::{Daemon, run_kaiso_env, seeded_bytes as bytes};
use common::{Store, StoreSpec, kaiso_bin};
use std::ffi::OsStr;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Runs `kaiso migrate VERB CONFIG EXTRA…`, killed after `limit`.
fn migrate(verb: &str, config: &Path, extra: &[&str], limit: Duration) -> Output {
    let mut args: Vec<&OsStr> = vec![os("migrate"), os(verb), config.as_os_str()];
    args.extend(extra.iter().map(|x| os(x)));
    run_kaiso_env(&args, &[], limit)
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[track_caller]
fn migrate_ok(verb: &str, config: &Path, extra: &[&str]) -> Output {
    let o = migrate(verb, config, extra, Duration::from_secs(60));
    assert!(o.status.success(), "{}", text(&o));
    o
}

/// The status of share `name`.
fn share_status(config: &Path, name: &str) -> serde_json::Value {
    let o = migrate_ok("status", config, &["--json"]);
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    v["shares"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == name))
        .cloned()
        .unwrap_or_else(|| panic!("no share {name} in {v:#}"))
}

/// Polls share `name`'s status until `pred` holds (bounded).
fn wait_share(
    config: &Path,
    name: &str,
    limit: Duration,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let s = share_status(config, name);
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}; last status {s:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `f` on its own thread and waits at most `limit` for it (a call into a hung
/// mount must not hang the test): `None` when it did not return in time.
fn bounded<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn a_restart_with_one_source_gone_serves_the_store_and_resumes_when_it_is_back() {
    fuse_or_skip!();
    let store = Store::new("migrestart-down", StoreSpec::tiers(1));
    let (a, b) = (store.root.join("srv-a"), store.root.join("srv-b"));
    fs::create_dir_all(a.join("d")).unwrap();
    fs::write(a.join("d/one"), bytes(1, 200_000)).unwrap();
    fs::write(a.join("two"), bytes(2, 50_000)).unwrap();
    fs::create_dir_all(b.join("x")).unwrap();
    fs::write(b.join("x/read-before"), bytes(3, 120_000)).unwrap();
    fs::write(b.join("x/stub"), bytes(4, 300_000)).unwrap();
    fs::write(b.join("top"), bytes(5, 10_000)).unwrap();
    let cfg = store.config.clone();
    let mnt = store.mountpoint.clone();
    let start_a = |log: &str, paused: bool| {
        let mut args = vec![
            a.as_os_str(),
            cfg.as_os_str(),
            os("--into"),
            os("a"),
            os("--mount"),
            mnt.as_os_str(),
        ];
        if paused {
            args.push(os("--paused"));
        }
        Daemon::start(&args, store.root.join(log), Some(&mnt)).unwrap_or_else(|e| panic!("{e}"))
    };
    let mut d = start_a("d1.log", true);
    let add = Command::new(kaiso_bin())
        .args(["migrate", "start"])
        .arg(&b)
        .arg(&cfg)
        .args(["--into", "b", "--paused"])
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", text(&add));
    // A client reads one file of each share (complete now), lists b/x (stubs), writes.
    assert_eq!(
        fs::read(mnt.join("b/x/read-before")).unwrap(),
        bytes(3, 120_000)
    );
    assert_eq!(fs::read(mnt.join("a/two")).unwrap(), bytes(2, 50_000));
    assert_eq!(fs::read_dir(mnt.join("b/x")).unwrap().count(), 2);
    fs::write(mnt.join("a/client.txt"), b"written by a client").unwrap();
    d.stop();
    drop(d);

    // Source b goes away; the restarted daemon serves anyway, at once.
    let away = store.root.join("srv-b.away");
    fs::rename(&b, &away).unwrap();
    let d = start_a("d2.log", false);
    eprintln!(
        "restart with source b gone: serving after {} ms",
        d.serving_ms()
    );
    // "At once": not waiting for the gone source. The daemon serves in well under 1 s
    // on an idle machine (printed above); a loaded 2-core machine took 713 ms, so the
    // bound that fails the test is 5 s (waiting for the source would be for ever).
    assert!(d.serving_ms() < 5000, "{}", d.log_text());
    // Samba on the mount would serve root only: the daemon says so.
    assert!(
        d.log_text().contains("allow_other is off"),
        "{}",
        d.log_text()
    );
    assert_eq!(
        fs::read(mnt.join("a/client.txt")).unwrap(),
        b"written by a client"
    );
    assert_eq!(fs::read(mnt.join("a/d/one")).unwrap(), bytes(1, 200_000));
    assert_eq!(
        fs::read(mnt.join("b/x/read-before")).unwrap(),
        bytes(3, 120_000)
    );
    let stub = mnt.join("b/x/stub");
    let t0 = Instant::now();
    let r = bounded(Duration::from_secs(20), move || fs::read(stub).map(|_| ()))
        .expect("a read of a stub whose source is gone returns");
    let e = r.expect_err("no bytes without the source");
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    eprintln!(
        "read of a stub of the gone source failed after {:?}",
        t0.elapsed()
    );
    // "Promptly": a few ms on an idle machine (printed above). The bound that fails the
    // test is 5 s, as for the serving time (up to 713 ms seen there at load 15-56 on 2
    // cores): it catches a read that waits for the gone source (for ever; `bounded`
    // gives up at 20 s).
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "a read of a stub of the gone source failed only after {:?}, expected at once \
         (< 5 s); daemon log:\n{}",
        t0.elapsed(),
        d.log_text()
    );
    let s = share_status(&cfg, "b");
    let state = s["state"].as_str().unwrap();
    assert!(
        state.starts_with("source unreachable since ") && state.contains("srv-b"),
        "{s:#}"
    );
    let o = migrate_ok("status", &cfg, &[]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("source unreachable since"),
        "{}",
        text(&o)
    );
    // The other share crawls meanwhile; finishing b is refused while its source is away.
    wait_share(&cfg, "a", Duration::from_secs(60), "share a done", |s| {
        s["remaining_stubs"] == 0
    });
    let o = migrate("finish", &cfg, &["--share", "b"], Duration::from_secs(60));
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("unreachable"),
        "{}",
        text(&o)
    );

    // The source is back: the daemon reconnects by itself and b's crawl carries on.
    fs::rename(&away, &b).unwrap();
    let t1 = Instant::now();
    wait_share(&cfg, "b", Duration::from_secs(30), "b reconnected", |s| {
        !s["state"]
            .as_str()
            .unwrap_or("")
            .starts_with("source unreachable")
    });
    eprintln!("source b back: reconnected after {:?}", t1.elapsed());
    assert!(d.log_text().contains("reachable again"), "{}", d.log_text());
    let o = migrate(
        "finish",
        &cfg,
        &["--wait", "120s"],
        Duration::from_secs(180),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), d.log_text());
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("share a finished") && t.contains("share b finished"),
        "{}",
        text(&o)
    );
    for (rel, data) in [
        ("b/x/stub", bytes(4, 300_000)),
        ("b/x/read-before", bytes(3, 120_000)),
        ("b/top", bytes(5, 10_000)),
        ("a/d/one", bytes(1, 200_000)),
        ("a/client.txt", b"written by a client".to_vec()),
    ] {
        assert_eq!(fs::read(mnt.join(rel)).unwrap(), data, "{rel}");
    }
}

/// Sends SIGCONT to a stopped process when dropped (a test that fails must not leave a
/// stopped FUSE daemon, whose mount would hang everything that touches it).
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

#[test]
fn a_posix_source_on_a_hung_mount_fails_calls_after_its_timeout() {
    fuse_or_skip!();
    // The old server: a kaiso mount of a store holding the share's files.
    let old = Store::new("migrestart-hung-src", StoreSpec::tiers(1));
    old.seed(0, "f1", &bytes(11, 250_000));
    old.seed(0, "d/f2", &bytes(12, 40_000));
    old.seed(0, "f3", &bytes(13, 1_000));
    let source_mount = old.mount();
    let pid = source_mount.pid().expect("source daemon pid");
    let store = Store::new("migrestart-hung-dst", StoreSpec::tiers(1));
    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    let url = format!("{}?timeout=1", old.mountpoint.display());
    let d = Daemon::start(
        &[
            os(&url),
            cfg.as_os_str(),
            os("--mount"),
            mnt.as_os_str(),
            os("--paused"),
            os("--parallel"),
            os("2"),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The root is not listed yet, so the read fails at its listing: one call. (A file
    // looked up before the stop fails at its metadata copy, whose first call the hung
    // source fails after the timeout; the copy is retried once the source answers,
    // never skipped: migrate_retry_s14.rs.)
    // The old server hangs: every call into its mount blocks.
    let cont = Continue(pid);
    common::sigstop_all_threads(pid as i32);
    let f1 = mnt.join("f1");
    let t0 = Instant::now();
    let r = bounded(Duration::from_secs(30), move || fs::read(f1).map(|_| ()))
        .expect("a client read through a hung source returns");
    assert!(r.is_err(), "no bytes from a hung source");
    eprintln!(
        "read through the hung source failed after {:?}",
        t0.elapsed()
    );
    // Failed by the URL's 1 s deadline: the daemon log names it. Not by the default 15 s
    // one nor by a hang (`bounded` gives up at 30 s): about 1.0 s on an idle machine, 6.1 s
    // once at load 56 on 2 cores (scheduling delay adds to the deadline), so the bound
    // that fails the test is 10 s, below the 15 s that an ignored `?timeout=1` costs.
    let took = t0.elapsed();
    // The log line may trail the client's error: waited for (bounded).
    let named = common::audit::wait_for(Duration::from_secs(10), || {
        d.log_text().contains("within 1.0 s")
    });
    let log = d.log_text();
    assert!(
        took < Duration::from_secs(10) && named,
        "expected the read through the hung source to fail by its 1.0 s deadline (named \
         in the daemon log, and < 10 s); it failed after {took:?}; daemon log:\n{log}"
    );
    migrate_ok("resume", &cfg, &[]);
    let t1 = Instant::now();
    let s = wait_share(&cfg, "main", Duration::from_secs(120), "crawl stuck", |s| {
        s["state"] == "stuck"
    });
    eprintln!("crawl over the hung source stuck after {:?}", t1.elapsed());
    let failures = s["crawl_failures"].as_array().cloned().unwrap_or_default();
    assert!(!failures.is_empty(), "{s:#}");
    // The log names the path and the deadline (the first call past it, or a later one
    // that failed after the grace: "… while an earlier call to it is hung (no return
    // within 1.0 s …").
    let log = d.log_text();
    assert!(
        log.contains("within 1.0 s") && log.contains(&*old.mountpoint.to_string_lossy()),
        "{log}"
    );
    // The old server answers again: resume, the crawl completes, finish verifies.
    drop(cont);
    migrate_ok("resume", &cfg, &[]);
    let o = migrate(
        "finish",
        &cfg,
        &["--wait", "120s"],
        Duration::from_secs(180),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), d.log_text());
    for (rel, data) in [
        ("f1", bytes(11, 250_000)),
        ("d/f2", bytes(12, 40_000)),
        ("f3", bytes(13, 1_000)),
    ] {
        assert_eq!(fs::read(mnt.join(rel)).unwrap(), data, "{rel}");
    }
    drop(d);
    source_mount.unmount();
}
