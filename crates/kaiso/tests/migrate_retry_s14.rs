//! Issue 4 (session 14), with the real `kaiso` binary: a metadata read that finds the
//! source unreachable is retried, not skipped for good. The source is a POSIX path on a
//! `kaiso mount` whose daemon is stopped with SIGSTOP (a hung mount), read with
//! `timeout=1`: a client's first xattr read of a file listed before the stop fails (EIO)
//! instead of reporting the file's xattrs as skipped; once the source answers, the
//! crawl copies them and `finish` succeeds without `--accept-skipped` — also when the
//! daemon was killed (-9) in between.
//!
//! The outage is forced (SIGSTOP), never timed; every wait is bounded; daemons, mounts
//! and stopped processes are cleaned up on drop.

mod common;

use common::migrate_daemon::{
    Daemon, migrate_cmd, migrate_status_json, output_text, seeded_bytes as bytes,
};
use common::{Mount, Store, StoreSpec, cstr, getxattr};
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

const XATTR: &str = "user.s14_tag";
const VALUE: &[u8] = b"kept across the outage";
const F1_LEN: usize = 200_000;

/// Sends SIGCONT to a stopped process when dropped (a test that fails must not leave a
/// stopped FUSE daemon, whose mount would hang everything that touches it).
struct Continue(u32);

impl Drop for Continue {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
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

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let c = cstr(p);
    let n = std::ffi::CString::new(name).unwrap();
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {name} on {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

#[track_caller]
fn migrate_ok(verb: &str, config: &Path, extra: &[&str]) {
    let o = migrate_cmd(verb, config, extra, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "kaiso migrate {verb}: {}",
        output_text(&o)
    );
}

/// The old server (a `kaiso mount` of a store holding `f1`, whose xattr is set on its
/// tier file before the mount adopts it, and `d/f2`) and the new store.
struct World {
    // Dropped first: the source mount before the directories under it.
    source_mount: Option<Mount>,
    _old: Store,
    store: Store,
    url: String,
}

impl World {
    fn new(tag: &str) -> Self {
        let old = Store::new(&format!("{tag}-src"), StoreSpec::tiers(1));
        old.seed(0, "f1", &bytes(41, F1_LEN));
        old.seed(0, "d/f2", &bytes(42, 30_000));
        setxattr(&old.tiers[0].join("f1"), XATTR, VALUE);
        let source_mount = old.mount();
        assert_eq!(
            getxattr(&old.mountpoint.join("f1"), XATTR).as_deref(),
            Ok(VALUE),
            "the source mount shows f1's xattr"
        );
        let store = Store::new(&format!("{tag}-dst"), StoreSpec::tiers(1));
        // A call into the hung mount fails after 1 s (later ones after a grace).
        let url = format!("{}?timeout=1", old.mountpoint.display());
        Self {
            _old: old,
            source_mount: Some(source_mount),
            store,
            url,
        }
    }

    fn source_pid(&self) -> u32 {
        self.source_mount
            .as_ref()
            .and_then(Mount::pid)
            .expect("source daemon pid")
    }

    /// `kaiso migrate start URL CONFIG --mount MNT --parallel 2 EXTRA…`, serving.
    fn start(&self, log: &str, extra: &[&str]) -> Daemon {
        let mut args: Vec<&OsStr> = vec![
            OsStr::new(&self.url),
            self.store.config.as_os_str(),
            OsStr::new("--mount"),
            self.store.mountpoint.as_os_str(),
            OsStr::new("--parallel"),
            OsStr::new("2"),
        ];
        args.extend(extra.iter().map(OsStr::new));
        Daemon::start(
            &args,
            self.store.root.join(log),
            Some(&self.store.mountpoint),
        )
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"))
    }

    fn mnt(&self, rel: &str) -> PathBuf {
        self.store.mountpoint.join(rel)
    }

    /// With the daemon started `--paused`: `f1` is listed (a client's stat) while the
    /// source answers, then the source hangs (SIGSTOP, undone when the returned value
    /// drops) and a client's first read of f1's xattr must fail with EIO (its metadata
    /// cannot be read now: it stays to do), not ENODATA (its xattrs skipped for good).
    /// The skip report stays empty and f1 stays a stub.
    fn xattr_read_through_the_hung_source(&self, d: &Daemon) -> Continue {
        let f1 = self.mnt("f1");
        assert_eq!(fs::metadata(&f1).unwrap().len(), F1_LEN as u64);
        let pid = self.source_pid();
        let cont = Continue(pid);
        common::sigstop_all_threads(pid as i32);
        let got = bounded(Duration::from_secs(60), move || getxattr(&f1, XATTR))
            .expect("an xattr read through a hung source returns");
        assert_eq!(
            got,
            Err(libc::EIO),
            "expected EIO for f1's xattr while its source hangs (the metadata copy left \
             to do), not ENODATA (copy skipped) nor a value; daemon log:\n{}",
            d.log_text()
        );
        let v = migrate_status_json(&self.store.config);
        let s = &v["shares"][0];
        assert!(
            s["skipped"].as_array().is_some_and(Vec::is_empty)
                && s["remaining_stubs"].as_u64().is_some_and(|n| n >= 1),
            "expected no skip report entry and f1 still a stub, got {s:#}"
        );
        cont
    }

    /// `finish --wait` without `--accept-skipped` succeeds; f1 has its data and its xattr
    /// through the new store's mount, d/f2 its data.
    fn finish_and_check(&self, d: &Daemon) {
        let o = migrate_cmd(
            "finish",
            &self.store.config,
            &["--wait", "120s"],
            Duration::from_secs(180),
        );
        assert!(
            o.status.success(),
            "expected finish without --accept-skipped to succeed once the source answers: {}\n\
             daemon log:\n{}",
            output_text(&o),
            d.log_text()
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("; 0 skipped"),
            "expected nothing skipped: {out}"
        );
        assert_eq!(
            getxattr(&self.mnt("f1"), XATTR).as_deref(),
            Ok(VALUE),
            "f1's xattr on the destination"
        );
        assert!(
            fs::read(self.mnt("f1")).unwrap() == bytes(41, F1_LEN),
            "f1's data"
        );
        assert!(
            fs::read(self.mnt("d/f2")).unwrap() == bytes(42, 30_000),
            "d/f2's data"
        );
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(m) = self.source_mount.take() {
            if let Some(pid) = m.pid() {
                unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            }
            drop(m); // unmounts (forcibly if need be)
        }
    }
}

/// The source answers again while the daemon runs: `resume` starts the crawl, which
/// copies f1's xattrs (its stub was kept), and `finish` needs no `--accept-skipped`.
/// (Session 13: "[Unreachable] xattrs: …" in the skip report, f1 migrated without its
/// xattr, `finish` refusing until `--accept-skipped`.)
#[test]
fn an_xattr_read_from_a_hung_source_is_retried_once_it_answers() {
    fuse_or_skip!();
    let w = World::new("s14-retry");
    let mut d = w.start("d.log", &["--paused"]);
    let cont = w.xattr_read_through_the_hung_source(&d);
    drop(cont); // the old server answers again
    migrate_ok("resume", &w.store.config, &[]);
    w.finish_and_check(&d);
    d.stop();
}

/// As above with the daemon killed (-9) while the source hangs: the metadata still to do
/// is in the saved state (f1 is still a stub after the restart, nothing skipped), and the
/// restarted daemon's crawl copies it; `finish` needs no `--accept-skipped`.
#[test]
fn an_xattr_read_from_a_hung_source_is_retried_after_a_kill_and_restart() {
    fuse_or_skip!();
    let w = World::new("s14-retry-kill");
    let mut d = w.start("d1.log", &["--paused"]);
    let cont = w.xattr_read_through_the_hung_source(&d);
    d.kill9();
    drop(cont); // the old server answers again
    let mut d = w.start("d2.log", &["--paused"]);
    let v = migrate_status_json(&w.store.config);
    let s = &v["shares"][0];
    assert!(
        s["skipped"].as_array().is_some_and(Vec::is_empty)
            && s["remaining_stubs"].as_u64().is_some_and(|n| n >= 1),
        "expected f1 still a stub and nothing skipped after kill -9 and restart, got {s:#}"
    );
    migrate_ok("resume", &w.store.config, &[]);
    w.finish_and_check(&d);
    d.stop();
}
