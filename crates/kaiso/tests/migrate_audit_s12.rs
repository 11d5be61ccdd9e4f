//! Audit of issue 4 (session 12): what an administrator still finds broken when running
//! `kaiso migrate` with the real binary and real servers, beyond the session-11 audit
//! (migrate_audit.rs). Each test reproduces one finding and fails today with a message
//! saying what was expected; it is `#[ignore]`d with the finding's one-line summary until
//! the bug is fixed (then remove the `ignore`).
//!
//! Every wait is bounded; daemons, mounts and servers are stopped on drop.

mod common;
#[path = "../../source/tests/common/mod.rs"]
mod source_servers;

use common::migrate_daemon::{
    Daemon, migrate_cmd, migrate_status_json, output_text, seeded_bytes as bytes,
    write_numbered_files,
};
use common::{Scratch, Store, StoreSpec};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// A source tree of `n` files of `size` bytes in `dir/`.
/// `kaiso migrate start SRC CONFIG --into b --share b EXTRA…` against the running daemon:
/// adds share b to it (the command returns once the daemon took the share).
fn add_share_b(src: &Path, store: &Store, extra: &[&str]) {
    let mut args: Vec<&OsStr> = vec![
        os("migrate"),
        os("start"),
        src.as_os_str(),
        store.config.as_os_str(),
        os("--into"),
        os("b"),
        os("--share"),
        os("b"),
    ];
    args.extend(extra.iter().map(|a| os(a)));
    let o = common::migrate_daemon::run_kaiso_bounded(&args, &[], Duration::from_secs(30));
    assert!(o.status.success(), "add share b: {}", output_text(&o));
}

/// `kaiso migrate start SOURCE CONFIG EXTRA…` (EXTRA names the faces), serving.
fn start(source: &str, store: &Store, extra: &[&str], mounted: bool) -> Result<Daemon, String> {
    let mut args: Vec<&OsStr> = vec![os(source), store.config.as_os_str()];
    if mounted {
        args.push(os("--mount"));
        args.push(store.mountpoint.as_os_str());
    }
    args.extend(extra.iter().map(|s| os(s)));
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = store.root.join(format!("daemon-{n}.log"));
    Daemon::start(&args, log, mounted.then_some(store.mountpoint.as_path()))
}

/// The status of share `name` (daemon running).
fn share_status(config: &Path, name: &str) -> serde_json::Value {
    let v = migrate_status_json(config);
    v["shares"]
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == name).cloned())
        .unwrap_or_else(|| panic!("no share {name} in status {v:#}"))
}

/// Polls share `name` until `pred` holds, at most `limit`; `None` (with the last status)
/// if it never did.
fn poll_share(
    config: &Path,
    name: &str,
    limit: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Result<serde_json::Value, serde_json::Value> {
    let deadline = Instant::now() + limit;
    loop {
        let s = share_status(config, name);
        if pred(&s) {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err(s);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn state_of(s: &serde_json::Value) -> String {
    s["state"].as_str().unwrap_or("").to_string()
}

// ---------------------------------------------------------------------------------------
// Finding 1: the migration's state files are writable by every local user.
// ---------------------------------------------------------------------------------------

/// The daemon runs as root with `umask(0)` and creates `<state_dir>/migrate`, the share's
/// directory and `share.json` with the default modes, i.e. 0777 and 0666, and `finish`
/// leaves its report 0666. Any local user can then rewrite `share.json` (the URL and
/// target the next root `start` resumes), replace or delete `migrate.db` (stub rows and
/// their source paths) or forge the report. Expected: user `nobody` can neither create
/// a file in nor open a file for writing under `<state_dir>/migrate` (the state
/// directory itself is 0755 here, as an administrator would make it).
#[test]
fn migration_state_is_not_writable_by_other_users() {
    fuse_or_skip!();
    let src = Scratch::new("s12-perm-src");
    write_numbered_files(&src.0, "d", 3, 1000);
    let store = Store::new("s12-perm", StoreSpec::tiers(1));
    let mut d = start(src.0.to_str().unwrap(), &store, &["--paused"], true)
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    // What user `nobody` can change under <state_dir>/migrate: create a file in each
    // directory, open each file for writing (nothing is written).
    let writable = |root: &Path| -> Vec<String> {
        let root = root.to_path_buf();
        common::as_nobody(move || {
            let mut bad = Vec::new();
            let mut stack = vec![root];
            while let Some(p) = stack.pop() {
                let Ok(m) = fs::symlink_metadata(&p) else {
                    continue;
                };
                if m.is_dir() {
                    let probe = p.join(".nobody-was-here");
                    if fs::File::create(&probe).is_ok() {
                        let _ = fs::remove_file(&probe);
                        bad.push(format!("{}/ (created a file)", p.display()));
                    }
                    if let Ok(rd) = fs::read_dir(&p) {
                        stack.extend(rd.flatten().map(|e| e.path()));
                    }
                } else if m.is_file() && fs::OpenOptions::new().append(true).open(&p).is_ok() {
                    bad.push(format!("{} (opened for writing)", p.display()));
                }
            }
            bad
        })
    };
    let during = writable(&store.state.join("migrate"));
    let o = migrate_cmd("resume", &store.config, &[], Duration::from_secs(30));
    assert!(o.status.success(), "{}", output_text(&o));
    let o = migrate_cmd(
        "finish",
        &store.config,
        &["--wait", "60s"],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "finish: {}", output_text(&o));
    let after = writable(&store.state.join("migrate"));
    d.stop();
    assert!(
        during.is_empty() && after.is_empty(),
        "expected user nobody to be unable to change anything under <state_dir>/migrate \
         (a root daemon's state: share.json decides what the next start migrates); \
         during the migration: {during:?}; after finish: {after:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Finding 2: a restart with another --into silently retargets the share and strands it.
// ---------------------------------------------------------------------------------------

/// A share migrated into the store root is stopped and started again with the same
/// source and share name but `--into x` (a typo in a service file, or an operator who
/// thinks `--into` may be changed). Seen: `start` accepts it, rewrites `share.json` to
/// `/x`, makes an empty `/x`, the crawl walks `/x`, never visits the stubs under `/` and
/// ends `stuck` with no failure listed; `finish` is refused ("N stubs remain") for as
/// long as the wrong `--into` is used. Expected: `start` refuses in one line naming the
/// share's recorded target (or keeps it), and the crawl ends `done`.
#[test]
fn a_restart_with_another_into_does_not_strand_the_share() {
    fuse_or_skip!();
    let src = Scratch::new("s12-into-src");
    write_numbered_files(&src.0, "d", 4, 1000);
    fs::write(src.0.join("top"), bytes(99, 5000)).unwrap();
    let store = Store::new("s12-into", StoreSpec::tiers(1));
    let source = src.0.to_str().unwrap();
    let mut d = start(source, &store, &["--paused"], true)
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    // The root is listed (its stubs exist), nothing is copied yet.
    assert_eq!(fs::read_dir(&store.mountpoint).unwrap().count(), 2);
    d.stop();
    drop(d);
    match start(source, &store, &["--into", "x", "--share", "main"], true) {
        Err(e) => {
            // A refusal is a fix if it says why.
            assert!(
                e.contains("into") || e.contains("/x"),
                "start with another --into was refused, but without naming --into: {e}"
            );
        }
        Ok(mut d) => {
            let s = poll_share(&store.config, "main", Duration::from_secs(90), |s| {
                let st = state_of(s);
                st == "done" || st.starts_with("stuck")
            })
            .unwrap_or_else(|s| panic!("the crawl did not end within 90 s: {s:#}"));
            let files: Vec<_> = fs::read_dir(&store.mountpoint)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            d.stop();
            assert!(
                state_of(&s) == "done" && s["remaining_stubs"] == 0,
                "expected `start --into x` of a share recorded into / to be refused or to \
                 keep migrating into /, ending done; the crawl ended {:?} with {} stubs \
                 remaining, status into {:?}, store root holds {files:?}",
                state_of(&s),
                s["remaining_stubs"],
                s["into"]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Finding 3: a paused share crawls again after a daemon restart.
// ---------------------------------------------------------------------------------------

/// Two shares in one store (N-to-1); the operator pauses share `b` (e.g. to keep the old
/// server quiet during office hours). The daemon is restarted (reboot, service restart)
/// with share `a`'s command line, the only one a service file has. Seen: `b` is resumed
/// with its crawl running (`daemon.rs` `start` adds every saved share with
/// `paused = false`; the pause is not in `share.json`). Expected: `b` still `paused`.
#[test]
fn a_paused_share_stays_paused_across_a_daemon_restart() {
    fuse_or_skip!();
    let (sa, sb) = (Scratch::new("s12-pause-a"), Scratch::new("s12-pause-b"));
    write_numbered_files(&sa.0, "d", 4, 1000);
    write_numbered_files(&sb.0, "d", 40, 256 * 1024);
    let store = Store::new("s12-pause", StoreSpec::tiers(1));
    let a_args = ["--into", "a", "--share", "a"];
    let mut d = start(sa.0.to_str().unwrap(), &store, &a_args, true)
        .unwrap_or_else(|e| panic!("kaiso migrate start a: {e}"));
    add_share_b(&sb.0, &store, &["--rate", "256KiB", "--chunk", "256KiB"]);
    let o = migrate_cmd(
        "pause",
        &store.config,
        &["--share", "b"],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "pause b: {}", output_text(&o));
    let s = share_status(&store.config, "b");
    assert_eq!(state_of(&s), "paused", "{s:#}");
    d.stop();
    drop(d);
    let mut d = start(sa.0.to_str().unwrap(), &store, &a_args, true)
        .unwrap_or_else(|e| panic!("kaiso migrate start a again: {e}"));
    let before = share_status(&store.config, "b");
    std::thread::sleep(Duration::from_secs(3));
    let after = share_status(&store.config, "b");
    d.stop();
    assert!(
        state_of(&after) == "paused" && after["bytes_fetched"] == before["bytes_fetched"],
        "expected share b, paused by `kaiso migrate pause --share b`, to stay paused when \
         the daemon is restarted with share a's command line; it is {:?} and fetched {} \
         bytes in 3 s after the restart",
        state_of(&after),
        after["bytes_fetched"].as_u64().unwrap_or(0)
            - before["bytes_fetched"].as_u64().unwrap_or(0)
    );
}

// ---------------------------------------------------------------------------------------
// Finding 4: after an outage of the old server mid-crawl, the crawl stays `stuck` (no
// self-recovery) and `status` does not say that the source is unreachable.
// ---------------------------------------------------------------------------------------

/// ganesha's pid, from the pid file the test server writes.
fn ganesha_pid(g: &source_servers::Ganesha) -> i32 {
    let p = g.dir.path().join("ganesha.pid");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(pid) = fs::read_to_string(&p)
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "no ganesha pid file {}",
            p.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGCONTs ganesha on drop, so a failing test never leaves a stopped server behind.
struct Stopped(i32);

impl Stopped {
    fn new(pid: i32) -> Stopped {
        common::sigstop_all_threads(pid);
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A ganesha source (`timeout=2`) being crawled at 256 KiB/s in 256 KiB units; the
/// server is stopped (SIGSTOP: it accepts nothing and answers nothing, as a crashed or
/// cut-off host) until the crawl ends `stuck`. Returns the pieces and that status.
fn crawl_stuck_on_a_stopped_ganesha(
    tag: &str,
) -> Option<(
    Scratch,
    source_servers::Ganesha,
    Store,
    Daemon,
    Stopped,
    serde_json::Value,
)> {
    if !source_servers::have(&["ganesha.nfsd", "rpcbind", "nfs-ls"]) {
        eprintln!("skipping: needs ganesha.nfsd, rpcbind and libnfs-utils");
        return None;
    }
    let src = Scratch::new(&format!("{tag}-src"));
    write_numbered_files(&src.0, "d", 10, 256 * 1024);
    let ganesha = source_servers::Ganesha::start(&src.0);
    let url = format!(
        "nfs://127.0.0.1:{}{}?mountport={}&timeout=2",
        ganesha.nfs_port, ganesha.pseudo, ganesha.mount_port
    );
    let store = Store::new(tag, StoreSpec::tiers(1));
    let d = start(
        &url,
        &store,
        &["--rate", "256KiB", "--chunk", "256KiB", "--parallel", "2"],
        true,
    )
    .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    poll_share(&store.config, "main", Duration::from_secs(60), |s| {
        s["files_done"].as_u64().unwrap_or(0) >= 2
    })
    .unwrap_or_else(|s| panic!("no file copied within 60 s: {s:#}"));
    let stopped = Stopped::new(ganesha_pid(&ganesha));
    let s = poll_share(&store.config, "main", Duration::from_secs(240), |s| {
        state_of(s).starts_with("stuck")
    })
    .unwrap_or_else(|s| panic!("the crawl did not end stuck within 240 s of the outage: {s:#}"));
    Some((src, ganesha, store, d, stopped, s))
}

/// While the old server does not answer, the crawl ends `stuck` and `status` lists
/// `inode N (fetch data): Input/output error (os error 5)` per file — nothing says that
/// the *source* cannot be reached, nor which server, nor that `resume` is needed once it
/// answers (the state line for a source down at a restart does say it: "source
/// unreachable since …: <error>"). Expected: the status (text) names the cause —
/// "unreachable" (or the server's address) — for a crawl stuck on an unreachable source.
#[test]
fn a_crawl_stuck_on_an_unreachable_source_says_so() {
    fuse_or_skip!();
    let Some((_src, ganesha, store, mut d, stopped, _)) =
        crawl_stuck_on_a_stopped_ganesha("s12-why")
    else {
        return;
    };
    let o = migrate_cmd("status", &store.config, &[], Duration::from_secs(30));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    drop(stopped);
    d.stop();
    drop(ganesha);
    // The share line carries the source URL (with its address): look below it only.
    let below: String = text.lines().skip(1).collect::<Vec<_>>().join("\n");
    let says_why = [
        "unreachable",
        "cannot be reached",
        "not answer",
        "timed out",
    ]
    .iter()
    .any(|w| below.contains(w));
    assert!(
        o.status.success() && says_why,
        "expected `kaiso migrate status` of a crawl stuck because the NFS server stopped \
         answering to say, below the share line, that the source is unreachable (or timed \
         out); it printed:\n{text}"
    );
}

/// The old server is down for a while mid-crawl (SIGSTOP until the crawl is `stuck`),
/// then answers again. Seen: the crawl stays `stuck` until an operator runs `kaiso
/// migrate resume` — an overnight migration stalls for good after a one-minute network
/// outage — whereas a share whose source is down at a *restart* is reconnected in the
/// background (0.5 s doubling to 10 s) and its crawl started by itself. Expected: the
/// same here: once the source answers, the crawl resumes without `resume` and ends
/// `done` (bounded: 90 s).
#[test]
fn a_crawl_stuck_on_an_outage_resumes_when_the_source_is_back() {
    fuse_or_skip!();
    let Some((_src, ganesha, store, mut d, stopped, _)) =
        crawl_stuck_on_a_stopped_ganesha("s12-back")
    else {
        return;
    };
    drop(stopped); // SIGCONT: the server answers again.
    let r = poll_share(&store.config, "main", Duration::from_secs(90), |s| {
        state_of(s) == "done"
    });
    d.stop();
    drop(ganesha);
    if let Err(s) = r {
        panic!(
            "expected the crawl, stuck while the NFS server did not answer, to resume by \
             itself once the server answers again and end done within 90 s (as a share \
             whose source is down at a restart does); last status {s:#}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Finding 5: a stub moved by a client into another share's directory strands its share.
// ---------------------------------------------------------------------------------------

/// N-to-1: shares `a` (into /a) and `b` (into /b) in one store, both paused. A client
/// moves a never-read file and a never-listed directory from /a to /b (users reorganise
/// the new server at once: that is what cutover before copying is for). The rename
/// succeeds. Seen: share `a`'s crawl walks /a only, never finds the two stubs, ends
/// `stuck` with `2 remaining` and no failure listed, and `finish --share a` is refused
/// ("2 stubs remain") until a client happens to read every moved file and list every
/// moved directory. Expected: either the move is refused (EXDEV across shares, so `mv`
/// copies, which fetches) or share `a`'s crawl completes what it owns wherever it now
/// is: both crawls end `done` and the moved file holds the source's bytes.
#[test]
fn a_stub_moved_into_another_shares_directory_still_completes() {
    fuse_or_skip!();
    let (sa, sb) = (Scratch::new("s12-xmv-a"), Scratch::new("s12-xmv-b"));
    write_numbered_files(&sa.0, "d", 3, 100_000);
    write_numbered_files(&sa.0, "sub/deep", 2, 1000);
    write_numbered_files(&sb.0, "e", 3, 1000);
    let store = Store::new("s12-xmv", StoreSpec::tiers(1));
    let mut d = start(
        sa.0.to_str().unwrap(),
        &store,
        &["--into", "a", "--share", "a", "--paused"],
        true,
    )
    .unwrap_or_else(|e| panic!("kaiso migrate start a: {e}"));
    add_share_b(&sb.0, &store, &["--paused"]);
    let m = &store.mountpoint;
    // List /a and /a/d (so the file exists as a stub) and /b; do not read anything.
    assert_eq!(fs::read_dir(m.join("a/d")).unwrap().count(), 3);
    assert_eq!(fs::read_dir(m.join("b")).unwrap().count(), 1);
    let moved_file = fs::rename(m.join("a/d/f000"), m.join("b/f000"));
    let moved_dir = fs::rename(m.join("a/sub"), m.join("b/sub"));
    for r in [&moved_file, &moved_dir] {
        if let Err(e) = r {
            assert_eq!(
                e.raw_os_error(),
                Some(libc::EXDEV),
                "a move across shares may be refused, but with EXDEV (so mv copies): {e}"
            );
        }
    }
    let o = migrate_cmd("resume", &store.config, &[], Duration::from_secs(30));
    assert!(o.status.success(), "resume: {}", output_text(&o));
    let ended = |s: &serde_json::Value| {
        let st = state_of(s);
        st == "done" || st.starts_with("stuck")
    };
    let a = poll_share(&store.config, "a", Duration::from_secs(120), ended)
        .unwrap_or_else(|s| panic!("share a's crawl did not end within 120 s: {s:#}"));
    let b = poll_share(&store.config, "b", Duration::from_secs(60), ended)
        .unwrap_or_else(|s| panic!("share b's crawl did not end within 60 s: {s:#}"));
    let finish_a = migrate_cmd(
        "finish",
        &store.config,
        &["--share", "a"],
        Duration::from_secs(60),
    );
    let bytes_ok =
        moved_file.is_err() || fs::read(m.join("b/f000")).ok() == Some(bytes(1, 100_000));
    d.stop();
    assert!(
        state_of(&a) == "done" && state_of(&b) == "done" && finish_a.status.success() && bytes_ok,
        "expected both crawls to end done after a client moved a stub file and an unlisted \
         directory from share a's /a into share b's /b (renames: file {moved_file:?}, dir \
         {moved_dir:?}), and `finish --share a` to succeed; share a ended {:?} with {} stubs \
         remaining and failures {}, share b {:?}; finish a: {}",
        state_of(&a),
        a["remaining_stubs"],
        a["crawl_failures"],
        state_of(&b),
        output_text(&finish_a)
    );
}

// ---------------------------------------------------------------------------------------
// Finding 6: a client's changes to a directory not listed yet are undone by its listing.
// ---------------------------------------------------------------------------------------

fn get_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (r >= 0).then(|| {
        buf.truncate(r as usize);
        buf
    })
}

fn set_mtime(p: &Path, secs: i64) {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let t = libc::timespec {
        tv_sec: secs,
        tv_nsec: 0,
    };
    let r = unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), [t, t].as_ptr(), 0) };
    assert_eq!(
        r,
        0,
        "utimensat {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// A client changes two directories that are still dummies (never listed: a `stat` of
/// them does not list them) — `touch -d`, `setfattr user.tag=client`, and `chmod 0711` of
/// one whose source has a POSIX ACL — and then lists them. Seen: the listing copies the
/// source directory's times, xattrs and ACL over the client's changes: the mtime is the
/// source's again, `user.tag` is `src` again, and the ACL copy sets the mode back to
/// 0755 (a client's `chmod go-r` undone: a permission change lost). Files do not have this
/// (a file's metadata copy runs before a client's change and never overwrites it).
/// Expected: the client's mtime, xattr value and mode survive the listing.
#[test]
fn client_changes_to_an_unlisted_directory_survive_its_listing() {
    fuse_or_skip!();
    let src = Scratch::new("s12-dirmeta-src");
    write_numbered_files(&src.0, "dd/inner", 1, 10);
    write_numbered_files(&src.0, "dacl", 1, 10);
    source_servers::set_xattr(&src.0.join("dd"), "user.tag", b"src");
    let o = std::process::Command::new("setfacl")
        .args(["-m", "u:1234:rx"])
        .arg(src.0.join("dacl"))
        .output()
        .expect("setfacl (package acl)");
    assert!(o.status.success(), "setfacl: {o:?}");
    let store = Store::new("s12-dirmeta", StoreSpec::tiers(1));
    let mut d = start(src.0.to_str().unwrap(), &store, &["--paused"], true)
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    let (dd, dacl) = (store.mountpoint.join("dd"), store.mountpoint.join("dacl"));
    let t2000 = 946_782_245; // 2000-01-02 03:04:05 UTC
    set_mtime(&dd, t2000);
    source_servers::set_xattr(&dd, "user.tag", b"client");
    fs::set_permissions(&dacl, fs::Permissions::from_mode(0o711)).unwrap();
    // Now the client lists them.
    assert_eq!(fs::read_dir(&dd).unwrap().count(), 1);
    assert_eq!(fs::read_dir(&dacl).unwrap().count(), 1);
    // Past the FUSE attribute cache.
    std::thread::sleep(Duration::from_secs(2));
    use std::os::unix::fs::MetadataExt;
    let mtime = fs::metadata(&dd).unwrap().mtime();
    let tag = get_xattr(&dd, "user.tag");
    let mode = fs::metadata(&dacl).unwrap().permissions().mode() & 0o7777;
    d.stop();
    assert!(
        mtime == t2000 && tag.as_deref() == Some(&b"client"[..]) && mode == 0o711,
        "expected a client's changes to a directory made before it was listed to survive \
         the listing: mtime {t2000} (got {mtime}), user.tag \"client\" (got {:?}), mode \
         0711 after chmod of a directory with a source ACL (got {mode:o})",
        tag.map(|t| String::from_utf8_lossy(&t).into_owned())
    );
}

/// The file counterpart: a client makes a never-read file private (`chmod 0600`) before
/// anything read its xattrs; the source file has a POSIX ACL (`u:1234:rw`, mode 0664).
/// Seen: the metadata copy at the first read writes the source's ACL, which sets the
/// mode back to 0664 — the file is world-readable again and nobody is told. Expected:
/// the client's mode 0600 survives (the copy runs before the client's change, as it does
/// for `setxattr`, or leaves the client's mode alone).
#[test]
fn a_clients_chmod_of_a_never_read_file_survives_its_metadata_copy() {
    fuse_or_skip!();
    let src = Scratch::new("s12-fchmod-src");
    fs::write(src.0.join("facl"), b"secret\n").unwrap();
    let o = std::process::Command::new("setfacl")
        .args(["-m", "u:1234:rw"])
        .arg(src.0.join("facl"))
        .output()
        .expect("setfacl (package acl)");
    assert!(o.status.success(), "setfacl: {o:?}");
    let store = Store::new("s12-fchmod", StoreSpec::tiers(1));
    let mut d = start(src.0.to_str().unwrap(), &store, &["--paused"], true)
        .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"));
    let f = store.mountpoint.join("facl");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    let right_after = fs::metadata(&f).unwrap().permissions().mode() & 0o7777;
    assert_eq!(fs::read(&f).unwrap(), b"secret\n");
    std::thread::sleep(Duration::from_secs(2)); // past the FUSE attribute cache
    let mode = fs::metadata(&f).unwrap().permissions().mode() & 0o7777;
    d.stop();
    assert!(
        right_after == 0o600 && mode == 0o600,
        "expected a client's chmod 0600 of a never-read file to survive its first read \
         (the metadata copy); mode right after chmod {right_after:o}, after the read \
         {mode:o} (the source's ACL brought group/other read back)"
    );
}
