//! `kaiso migrate` with the real binary: a POSIX-path source with a generated tree is
//! served at once through the FUSE mount and the embedded NFS server, read on demand,
//! paused/resumed/throttled, killed with SIGKILL mid-crawl, restarted, finished, and then
//! compared with the source entry by entry (kind, mode, owner, size, mtime, xattrs, link
//! targets, hard links, bytes). Samba exporting the FUSE mount reports stubs offline.
//! Every wait is bounded; daemons, mounts and servers are cleaned up on drop.

mod common;

use common::{Store, StoreSpec, force_unmount, is_mounted, kaiso_bin, temp_dir};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

// ---- the generated source tree ---------------------------------------------------------

/// Deterministic pseudo-random bytes.
fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn set_mtime(p: &Path, secs: i64, nsec: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: secs,
            tv_nsec: nsec,
        },
        libc::timespec {
            tv_sec: secs,
            tv_nsec: nsec,
        },
    ];
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
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
    assert_eq!(r, 0, "setxattr {name} on {}", p.display());
}

/// user.* xattrs of a path (name → value), sorted.
fn user_xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 64 << 10];
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    let mut out = BTreeMap::new();
    if n <= 0 {
        return out;
    }
    for name in names[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        if !name.starts_with(b"user.") {
            continue;
        }
        let cn = std::ffi::CString::new(name).unwrap();
        let mut v = vec![0u8; 64 << 10];
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if len >= 0 {
            v.truncate(len as usize);
            out.insert(String::from_utf8_lossy(name).into_owned(), v);
        }
    }
    out
}

/// Builds the source share: nested directories, files from 0 B to 5 MiB, hard links,
/// symlinks, a FIFO, xattrs, odd modes and owners, fixed mtimes, a non-UTF-8 name.
/// Returns the total number of data bytes.
fn make_source(root: &Path, with_fifo: bool) -> u64 {
    fs::create_dir_all(root).unwrap();
    let mut total = 0u64;
    let mut put = |rel: &Path, data: &[u8]| {
        let p = root.join(rel);
        fs::write(&p, data).unwrap();
        total += data.len() as u64;
    };
    put(Path::new("top.txt"), b"top level file\n");
    put(Path::new("empty"), b"");
    put(Path::new("big.bin"), &bytes(1, (5 << 20) + 123));
    for d in 0..4 {
        for e in 0..3 {
            let dir = PathBuf::from(format!("d{d}/e{e}"));
            fs::create_dir_all(root.join(&dir)).unwrap();
            for f in 0..5 {
                let len = (d * 97 + e * 31 + f * 17) % 9 * 40_000 + f;
                put(
                    &dir.join(format!("f{f}")),
                    &bytes((d * 100 + e * 10 + f) as u64 + 7, len),
                );
            }
        }
    }
    fs::create_dir_all(root.join("d0/e0/g/h")).unwrap();
    put(Path::new("d0/e0/g/h/deep.txt"), b"deep file\n");
    put(Path::new("d0/hard_a"), &bytes(99, 200_000));
    fs::hard_link(root.join("d0/hard_a"), root.join("d1/hard_b")).unwrap();
    symlink("../top.txt", root.join("d0/sym_rel")).unwrap();
    symlink("nowhere/at/all", root.join("sym_dangling")).unwrap();
    let fifo = std::ffi::CString::new(root.join("d2/pipe").as_os_str().as_bytes()).unwrap();
    if with_fifo {
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    }
    setxattr(&root.join("top.txt"), "user.tag", b"migrated-xattr");
    setxattr(&root.join("d1"), "user.dirtag", b"dir xattr");
    let owned = root.join("d3/owned");
    fs::write(&owned, b"owned by someone else").unwrap();
    fs::set_permissions(&owned, fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::lchown(&owned, Some(1234), Some(5678)).unwrap();
    fs::set_permissions(root.join("d2/e1"), fs::Permissions::from_mode(0o700)).unwrap();
    fs::set_permissions(root.join("top.txt"), fs::Permissions::from_mode(0o444)).unwrap();
    let latin1 = root.join(OsStr::from_bytes(b"d1/caf\xe9"));
    fs::write(&latin1, b"latin-1 name").unwrap();
    set_mtime(&root.join("big.bin"), 1_000_000_000, 123_456_789);
    set_mtime(&root.join("d0/e1/f2"), 1_234_567_890, 5);
    set_mtime(&root.join("d0/sym_rel"), 1_100_000_000, 0);
    // Directory times last (creating entries above changed them).
    set_mtime(&root.join("d3"), 1_300_000_000, 42);
    total
}

/// Relative path → description of every entry under `root` (not following symlinks),
/// plus hard-link groups (relative paths sharing an inode).
/// Relative path → description, and the hard-link groups.
type TreeDescription = (BTreeMap<Vec<u8>, String>, BTreeSet<Vec<Vec<u8>>>);

fn describe_tree(root: &Path) -> TreeDescription {
    let mut out = BTreeMap::new();
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let mut names: Vec<OsString> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()))
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        for name in names {
            let r = rel.join(&name);
            let p = root.join(&r);
            let md =
                fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                stack.push(r.clone());
                "dir".to_string()
            } else if ft.is_symlink() {
                format!("symlink -> {:?}", fs::read_link(&p).unwrap())
            } else if ft.is_file() {
                let mut data = Vec::new();
                fs::File::open(&p).unwrap().read_to_end(&mut data).unwrap();
                if md.nlink() > 1 {
                    by_ino
                        .entry(md.ino())
                        .or_default()
                        .push(r.as_os_str().as_bytes().to_vec());
                }
                format!("file {:?} nlink {}", common::fingerprint(&data), md.nlink())
            } else {
                format!("special {:o}", md.mode() & libc::S_IFMT)
            };
            // Directory mtimes are not compared: listing and the client's own reads legitimately leave them as the engine set them.
            let mtime = if ft.is_dir() {
                String::new()
            } else {
                format!(" mtime {}.{:09}", md.mtime(), md.mtime_nsec())
            };
            out.insert(
                r.as_os_str().as_bytes().to_vec(),
                format!(
                    "{kind} mode {:o} owner {}:{} size {}{mtime} xattrs {:?}",
                    md.mode() & 0o7777,
                    md.uid(),
                    md.gid(),
                    if ft.is_dir() { 0 } else { md.size() },
                    user_xattrs(&p)
                ),
            );
        }
    }
    (out, by_ino.into_values().collect())
}

fn assert_same_tree(source: &Path, copy: &Path) {
    let (a, la) = describe_tree(source);
    let (b, lb) = describe_tree(copy);
    let names =
        |m: &BTreeMap<Vec<u8>, String>| -> BTreeSet<Vec<u8>> { m.keys().cloned().collect() };
    let missing: Vec<_> = names(&a)
        .difference(&names(&b))
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    let extra: Vec<_> = names(&b)
        .difference(&names(&a))
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "missing {missing:?}, extra {extra:?}"
    );
    for (k, v) in &a {
        assert_eq!(Some(v), b.get(k), "{} differs", String::from_utf8_lossy(k));
    }
    assert_eq!(la, lb, "hard-link groups differ");
    assert!(!la.is_empty(), "the source has hard links");
}

// ---- the daemon and commands -------------------------------------------------------------

fn wait_child(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `kaiso ARGS`, killed after `limit`.
fn kaiso(args: &[&OsStr], limit: Duration) -> Output {
    let dir = temp_dir("migcli-out");
    let (o, e) = (dir.join("out"), dir.join("err"));
    let mut child = Command::new(kaiso_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&o).unwrap())
        .stderr(fs::File::create(&e).unwrap())
        .spawn()
        .expect("spawn kaiso");
    let status = match wait_child(&mut child, limit) {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let s = child.wait().unwrap();
            eprintln!("kaiso {args:?} killed after {limit:?}");
            s
        }
    };
    let out = Output {
        status,
        stdout: fs::read(&o).unwrap_or_default(),
        stderr: fs::read(&e).unwrap_or_default(),
    };
    let _ = fs::remove_dir_all(&dir);
    out
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Asserts the command failed and said `needle` on stderr.
#[track_caller]
fn assert_fails_with(o: &Output, needle: &str) {
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains(needle),
        "{}",
        text(o)
    );
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A running `kaiso migrate start`.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    mnt: Option<PathBuf>,
}

impl Daemon {
    /// Starts the daemon and waits (bounded) until it says it serves and the mount is up.
    fn start(args: &[&OsStr], log: PathBuf, mnt: Option<&Path>) -> Result<Daemon, String> {
        let f = fs::File::create(&log).unwrap();
        let child = Command::new(kaiso_bin())
            .arg("migrate")
            .arg("start")
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut d = Daemon {
            child: Some(child),
            log,
            mnt: mnt.map(Path::to_path_buf),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if d.log_text().contains("kaiso: serving after") && mnt.is_none_or(is_mounted) {
                return Ok(d);
            }
            if let Some(s) = d.child.as_mut().unwrap().try_wait().unwrap() {
                d.child = None;
                return Err(format!("daemon exited ({s}):\n{}", d.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!("daemon not serving within 30 s:\n{}", d.log_text()));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's own "serving after N ms".
    fn serving_ms(&self) -> u64 {
        let t = self.log_text();
        let rest = t
            .split("kaiso: serving after ")
            .nth(1)
            .expect("serving line");
        rest.split(' ').next().unwrap().parse().unwrap()
    }

    fn nfs_port(&self) -> u16 {
        let t = self.log_text();
        let rest = t
            .split("kaiso: nfs listening on ")
            .nth(1)
            .expect("nfs line");
        let addr = rest.lines().next().unwrap();
        addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(m) = &self.mnt {
            force_unmount(m);
        }
    }

    /// SIGTERM and a bounded wait: the daemon unmounts and exits.
    fn stop(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running daemon");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        match wait_child(&mut c, Duration::from_secs(30)) {
            Some(s) => s,
            None => {
                let _ = c.kill();
                panic!("daemon did not stop within 30 s:\n{}", self.log_text());
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if wait_child(&mut c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(m) = &self.mnt
            && is_mounted(m)
        {
            force_unmount(m);
        }
    }
}

fn status_json(config: &Path) -> serde_json::Value {
    let o = kaiso(
        &[
            os("migrate"),
            os("status"),
            config.as_os_str(),
            os("--json"),
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

fn share0(v: &serde_json::Value) -> &serde_json::Value {
    &v["shares"][0]
}

/// Polls status until `pred` holds (bounded).
fn wait_status(
    config: &Path,
    limit: Duration,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = status_json(config);
        if pred(share0(&v)) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}; last status {v:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `nfs-cat` of a path under the export (bounded).
fn nfs_cat(port: u16, rel: &str) -> Vec<u8> {
    let url = format!("nfs://127.0.0.1/export/{rel}?nfsport={port}&mountport={port}&version=3");
    let o = Command::new("timeout")
        .args(["60", "nfs-cat"])
        .arg(&url)
        .output()
        .expect("nfs-cat");
    assert!(
        o.status.success(),
        "nfs-cat {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

fn nfs_ls(port: u16, rel: &str) -> String {
    let url = format!("nfs://127.0.0.1/export/{rel}?nfsport={port}&mountport={port}&version=3");
    let o = Command::new("timeout")
        .args(["60", "nfs-ls"])
        .arg(&url)
        .output()
        .expect("nfs-ls");
    assert!(
        o.status.success(),
        "nfs-ls {url}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

// ---- the tests ----------------------------------------------------------------------------

#[test]
fn migrate_posix_serve_pause_kill_resume_finish() {
    fuse_or_skip!();
    let store = Store::new("migcli", StoreSpec::tiers(2));
    let src = store.root.join("old-server");
    make_source(&src, true);
    let mnt = store.mountpoint.clone();
    let cfg = store.config.clone();
    let start_args: Vec<&OsStr> = vec![
        src.as_os_str(),
        cfg.as_os_str(),
        os("--mount"),
        mnt.as_os_str(),
        os("--nfs"),
        os("127.0.0.1:0"),
        os("--chunk"),
        os("1MiB"),
    ];
    let mut first_args = start_args.clone();
    first_args.push(os("--paused"));
    let t0 = Instant::now();
    let mut d = Daemon::start(&first_args, store.root.join("daemon1.log"), Some(&mnt))
        .unwrap_or_else(|e| panic!("{e}"));
    let wall = t0.elapsed();
    eprintln!(
        "serving after {} ms (daemon), mount visible after {wall:?}",
        d.serving_ms()
    );
    assert!(d.serving_ms() < 1000, "{}", d.log_text());

    // Nothing copied yet: the root lists from the source on first access.
    let v = status_json(&cfg);
    let s = share0(&v);
    assert_eq!(s["state"], "paused", "{v:#}");
    assert_eq!(s["files_done"], 0, "{v:#}");

    // On-demand through FUSE: a deep file, a big file, a symlink.
    assert_eq!(
        fs::read(mnt.join("d0/e0/g/h/deep.txt")).unwrap(),
        b"deep file\n"
    );
    assert_eq!(
        fs::read(mnt.join("big.bin")).unwrap(),
        fs::read(src.join("big.bin")).unwrap()
    );
    assert_eq!(
        fs::read_link(mnt.join("d0/sym_rel")).unwrap(),
        Path::new("../top.txt")
    );
    let v = status_json(&cfg);
    let s = share0(&v);
    assert!(
        s["demand_fetches"].as_u64().unwrap() >= 6,
        "1 MiB units of big.bin: {v:#}"
    );
    assert!(s["remaining_stubs"].as_u64().unwrap() > 0, "{v:#}");
    assert_eq!(
        s["state"], "paused",
        "the crawl must not run while paused: {v:#}"
    );

    // On-demand through the NFS face (libnfs tools).
    if have("nfs-cat") && have("nfs-ls") {
        let port = d.nfs_port();
        assert_eq!(
            nfs_cat(port, "d2/e2/f4"),
            fs::read(src.join("d2/e2/f4")).unwrap()
        );
        let listing = nfs_ls(port, "d3/e1");
        for f in ["f0", "f1", "f4"] {
            assert!(listing.contains(f), "nfs-ls d3/e1: {listing}");
        }
    } else {
        eprintln!("notice: libnfs-utils absent, NFS face not exercised (scripts/deps/cli.list)");
    }

    // Text status names the share, progress and the skip report.
    let o = kaiso(
        &[os("migrate"), os("status"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success()
            && t.contains("share main:")
            && t.contains("stubs")
            && t.contains("skipped"),
        "{}",
        text(&o)
    );

    // Throttle and resume: the crawl makes progress slowly; pause stops it.
    let o = kaiso(
        &[os("migrate"), os("throttle"), cfg.as_os_str(), os("1MiB")],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = kaiso(
        &[os("migrate"), os("resume"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let before = share0(&status_json(&cfg))["bytes_done"].as_u64().unwrap();
    wait_status(&cfg, Duration::from_secs(60), "crawl progress", |s| {
        s["bytes_done"].as_u64().unwrap() >= before + (2 << 20) && s["state"] == "running"
    });
    let o = kaiso(
        &[os("migrate"), os("pause"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let v = wait_status(&cfg, Duration::from_secs(10), "paused", |s| {
        s["state"] == "paused"
    });
    let at_pause = share0(&v)["bytes_done"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let later = share0(&status_json(&cfg))["bytes_done"].as_u64().unwrap();
    // Stops within one unit per worker (2 workers × 1 MiB).
    assert!(
        later <= at_pause + (2 << 20),
        "paused crawl went on: {at_pause} → {later}"
    );
    let o = kaiso(
        &[os("migrate"), os("resume"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    wait_status(
        &cfg,
        Duration::from_secs(60),
        "progress after resume",
        |s| s["bytes_done"].as_u64().unwrap() > later + (1 << 20),
    );

    // kill -9 mid-crawl (throttled, so plenty is left).
    let v = status_json(&cfg);
    assert!(share0(&v)["remaining_stubs"].as_u64().unwrap() > 0, "{v:#}");
    d.kill9();
    let o = kaiso(
        &[os("migrate"), os("status"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && t.contains("no migration daemon is running"),
        "{}",
        text(&o)
    );

    // Stubs need their source: a plain NFS server refuses the half-migrated store.
    let o = kaiso(
        &[
            os("serve"),
            os("--nfs"),
            cfg.as_os_str(),
            os("--listen"),
            os("127.0.0.1:0"),
        ],
        Duration::from_secs(30),
    );
    assert_fails_with(&o, "is being migrated");

    // … and so does a plain FUSE mount (checked before the mountpoint is touched).
    let o = kaiso(
        &[os("mount"), cfg.as_os_str(), mnt.as_os_str()],
        Duration::from_secs(30),
    );
    assert_fails_with(&o, "is being migrated");

    // Restart (resume from the stubs), let it complete, finish.
    let mut d = Daemon::start(&start_args, store.root.join("daemon2.log"), Some(&mnt))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(d.serving_ms() < 1000, "{}", d.log_text());
    let o = kaiso(
        &[
            os("migrate"),
            os("finish"),
            cfg.as_os_str(),
            os("--wait"),
            os("180s"),
        ],
        Duration::from_secs(240),
    );
    assert!(
        o.status.success(),
        "{}\ndaemon log:\n{}",
        text(&o),
        d.log_text()
    );
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(t.contains("share main finished: verified"), "{}", text(&o));

    // Every entry equal to the source, seen through the mount.
    assert_same_tree(&src, &mnt);
    // No migration state left: no state directory, no offline attribute anywhere.
    assert!(!store.state.join("migrate/main").exists());
    assert!(store.state.join("migrate/main.finished.txt").exists());
    let v = status_json(&cfg);
    assert_eq!(share0(&v)["state"], "finished", "{v:#}");
    for f in ["big.bin", "d0/hard_a", "d3/e2/f1"] {
        assert!(
            !user_xattrs(&mnt.join(f)).contains_key("user.DOSATTRIB"),
            "{f} still offline"
        );
    }
    assert!(d.stop().success(), "{}", d.log_text());
    assert!(!is_mounted(&mnt));

    // The store is now an ordinary store: a plain mount serves the same tree.
    let m = store.mount();
    assert_same_tree(&src, &mnt);
    m.unmount();
}

/// A FIFO in the source: created as a FIFO, never opened by the crawl (opening it would
/// block until a writer appears).
#[test]
fn fifo_in_the_source_does_not_block_the_crawl() {
    fuse_or_skip!();
    let store = Store::new("migcli-fifo", StoreSpec::tiers(1));
    let src = store.root.join("old");
    make_source(&src, true);
    let mnt = store.mountpoint.clone();
    let cfg = store.config.clone();
    let _d = Daemon::start(
        &[
            src.as_os_str(),
            cfg.as_os_str(),
            os("--mount"),
            mnt.as_os_str(),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let o = kaiso(
        &[
            os("migrate"),
            os("finish"),
            cfg.as_os_str(),
            os("--wait"),
            os("120s"),
        ],
        Duration::from_secs(180),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_same_tree(&src, &mnt);
}

#[test]
fn migrate_errors_are_one_clear_line() {
    let store = Store::new("migcli-err", StoreSpec::tiers(1));
    let cfg = store.config.clone();
    let missing = store.root.join("no-such-dir");
    let cases: Vec<(Vec<&OsStr>, &str)> = vec![
        (vec![os("ftp://x/y"), cfg.as_os_str()], "unknown source"),
        (vec![missing.as_os_str(), cfg.as_os_str()], "no-such-dir"),
        // Nothing listens on port 1: unreachable.
        (
            vec![
                os("nfs://127.0.0.1:1/e?mountport=1&unprivileged=1"),
                cfg.as_os_str(),
            ],
            "source",
        ),
        (
            vec![os("/tmp"), cfg.as_os_str(), os("--order"), os("sideways")],
            "--order",
        ),
        (
            vec![os("/tmp"), cfg.as_os_str(), os("--chunk"), os("lots")],
            "--chunk",
        ),
        (
            vec![os("/tmp"), cfg.as_os_str(), os("--into"), os("../up")],
            "--into",
        ),
    ];
    for (args, want) in cases {
        let mut full = vec![os("migrate"), os("start")];
        full.extend(args);
        let o = kaiso(&full, Duration::from_secs(60));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{full:?} succeeded: {}", text(&o));
        assert!(
            err.contains(want),
            "{full:?}: expected {want:?} in {}",
            text(&o)
        );
        assert!(err.lines().count() <= 3, "{full:?}: not short: {err}");
    }
    // Commands without a daemon.
    let o = kaiso(
        &[os("migrate"), os("pause"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    assert_fails_with(&o, "no migration is running");
    let o = kaiso(
        &[os("migrate"), os("finish"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    assert_fails_with(&o, "nothing is being migrated");

    // Store busy: a plain `kaiso mount` serves the store.
    if common::fuse_unavailable().is_none() {
        let _m = store.mount();
        let o = kaiso(
            &[os("migrate"), os("start"), os("/tmp"), cfg.as_os_str()],
            Duration::from_secs(30),
        );
        assert_fails_with(&o, "store busy");
        let o = kaiso(
            &[os("migrate"), os("status"), cfg.as_os_str()],
            Duration::from_secs(30),
        );
        assert_fails_with(&o, "store busy");
    }
}

#[test]
fn two_shares_into_one_store() {
    fuse_or_skip!();
    let store = Store::new("migcli-n1", StoreSpec::tiers(1));
    let (a, b) = (store.root.join("srv-a"), store.root.join("srv-b"));
    make_source(&a, false);
    fs::create_dir_all(b.join("x")).unwrap();
    fs::write(b.join("x/only-in-b"), bytes(5, 70_000)).unwrap();
    let cfg = store.config.clone();
    let mnt = store.mountpoint.clone();
    let d = Daemon::start(
        &[
            a.as_os_str(),
            cfg.as_os_str(),
            os("--into"),
            os("a"),
            os("--mount"),
            mnt.as_os_str(),
            os("--paused"),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // Overlapping target refused; a second share added to the running daemon.
    let o = kaiso(
        &[
            os("migrate"),
            os("start"),
            b.as_os_str(),
            cfg.as_os_str(),
            os("--into"),
            os("a/b"),
        ],
        Duration::from_secs(30),
    );
    assert_fails_with(&o, "overlaps");
    let o = kaiso(
        &[
            os("migrate"),
            os("start"),
            b.as_os_str(),
            cfg.as_os_str(),
            os("--into"),
            os("b"),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        fs::read(mnt.join("b/x/only-in-b")).unwrap(),
        bytes(5, 70_000)
    );
    assert_eq!(
        fs::read(mnt.join("a/d0/e0/g/h/deep.txt")).unwrap(),
        b"deep file\n"
    );
    let o = kaiso(
        &[
            os("migrate"),
            os("resume"),
            cfg.as_os_str(),
            os("--share"),
            os("a"),
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = kaiso(
        &[
            os("migrate"),
            os("finish"),
            cfg.as_os_str(),
            os("--wait"),
            os("180s"),
        ],
        Duration::from_secs(240),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), d.log_text());
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("share a finished") && t.contains("share b finished"),
        "{}",
        text(&o)
    );
    assert_same_tree(&a, &mnt.join("a"));
    assert_eq!(
        fs::read(mnt.join("b/x/only-in-b")).unwrap(),
        bytes(5, 70_000)
    );
}

/// A free TCP port on 127.0.0.1 (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// smbd exporting a directory as share `s` to guests, on a private port.
struct Smbd {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Smbd {
    fn start(path: &Path) -> Smbd {
        let dir = temp_dir("migcli-smbd");
        for d in ["priv", "lock", "state", "cache", "pid"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        let port = free_port();
        let conf = dir.join("smb.conf");
        let t = dir.display();
        fs::write(
            &conf,
            format!(
                "[global]\n netbios name = KAISOTEST\n workgroup = WG\n server role = standalone server\n\
                 private dir = {t}/priv\n lock directory = {t}/lock\n state directory = {t}/state\n\
                 cache directory = {t}/cache\n pid directory = {t}/pid\n ncalrpc dir = {t}/state/ncalrpc\n\
                 smb ports = {port}\n bind interfaces only = yes\n interfaces = lo\n log file = {t}/log.%m\n\
                 map to guest = Bad User\n disable spoolss = yes\n load printers = no\n\
                 server min protocol = SMB2_02\n\
                 [s]\n path = {}\n guest ok = yes\n read only = yes\n store dos attributes = yes\n",
                path.display()
            ),
        )
        .unwrap();
        // Its own process group: smbd signals its group when it shuts down.
        let child = Command::new("smbd")
            .process_group(0)
            .args(["-F", "--no-process-group", "--debug-stdout", "-d1"])
            .arg(format!("--configfile={}", conf.display()))
            .stdin(Stdio::null())
            .stdout(fs::File::create(dir.join("smbd.out")).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn smbd");
        let s = Smbd {
            child: Some(child),
            dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "smbd did not listen on {port}: {}",
                fs::read_to_string(s.dir.join("smbd.out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// `smbclient -c 'allinfo NAME'` → the "attributes:" line.
    fn attributes(&self, name: &str) -> String {
        let o = Command::new("timeout")
            .args(["60", "smbclient", "-N", "-p"])
            .arg(self.port.to_string())
            .arg("//127.0.0.1/s")
            .arg("-c")
            .arg(format!("allinfo \"{name}\""))
            .output()
            .expect("smbclient");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines()
            .find(|l| l.starts_with("attributes:"))
            .unwrap_or_else(|| {
                panic!(
                    "no attributes for {name}: {out}{}",
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .to_string()
    }
}

impl Drop for Smbd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if wait_child(&mut c, Duration::from_secs(10)).is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Parses "attributes: OA (1020)" → 0x1020.
fn attr_bits(line: &str) -> u32 {
    let hex = line.rsplit('(').next().unwrap().trim_end_matches(')');
    u32::from_str_radix(hex, 16).unwrap()
}

#[test]
fn samba_on_the_mount_reports_stubs_offline() {
    fuse_or_skip!();
    if !have("smbd") || !have("smbclient") {
        eprintln!("notice: samba/smbclient absent (scripts/deps/cli.list); test not run");
        return;
    }
    let store = Store::new("migcli-smb", StoreSpec::tiers(1).allow_other());
    let src = store.root.join("old");
    make_source(&src, false);
    let mnt = store.mountpoint.clone();
    let _d = Daemon::start(
        &[
            src.as_os_str(),
            store.config.as_os_str(),
            os("--mount"),
            mnt.as_os_str(),
            os("--paused"),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let smbd = Smbd::start(&mnt);
    const OFFLINE: u32 = 0x1000;
    // Stubs: offline. Directories are never offline.
    assert_ne!(
        attr_bits(&smbd.attributes("big.bin")) & OFFLINE,
        0,
        "big.bin should be offline"
    );
    assert_ne!(attr_bits(&smbd.attributes("d1/e0/f3")) & OFFLINE, 0);
    assert_eq!(attr_bits(&smbd.attributes("d1")) & OFFLINE, 0);
    // Asking did not fetch the data.
    assert_ne!(attr_bits(&smbd.attributes("big.bin")) & OFFLINE, 0);
    // Once fetched (read through the mount), the file is an ordinary one.
    assert_eq!(
        fs::read(mnt.join("big.bin")).unwrap(),
        fs::read(src.join("big.bin")).unwrap()
    );
    assert_eq!(
        attr_bits(&smbd.attributes("big.bin")) & OFFLINE,
        0,
        "big.bin is complete"
    );
    assert_ne!(
        attr_bits(&smbd.attributes("d1/e0/f3")) & OFFLINE,
        0,
        "f3 is still a stub"
    );
}
