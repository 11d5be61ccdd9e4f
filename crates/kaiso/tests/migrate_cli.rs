//! `kaiso migrate` with the real binary: a POSIX-path source with a generated tree is
//! served at once through the FUSE mount and the embedded NFS server, read on demand,
//! paused/resumed/throttled, killed with SIGKILL mid-crawl, restarted, finished, and then
//! compared with the source entry by entry (kind, mode, owner, size, mtime, xattrs, link
//! targets, hard links, bytes). Samba exporting the FUSE mount reports stubs offline.
//! With real servers (nfs-ganesha, smbd; `migrate_servers`): an NFS and an SMB share into
//! one store, and the bad inputs only a server can give. Complete files are served by
//! kernel passthrough, stubs by the store; libnfs clients and JUKEBOX; `status --watch`.
//! Every wait is bounded; daemons, mounts and servers are cleaned up on drop.

mod common;
mod migrate_servers;

use common::migrate_daemon::{Daemon, run_kaiso_env, seeded_bytes as bytes, wait_child};
use common::{Store, StoreSpec, is_mounted, kaiso_bin, temp_dir};
use migrate_servers::{Ganesha, Samba, servers_available};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

// ---- the generated source tree ---------------------------------------------------------

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

/// What a tree comparison looks at besides names, kinds, sizes, bytes and link targets.
#[derive(Clone, Copy, PartialEq)]
enum Detail {
    /// Mode, owner, mtime and user xattrs too.
    Full,
    /// Mode, owner and mtime (NFSv3 carries no xattrs).
    NoXattrs,
    /// Content only (an SMB source maps owners and modes).
    Content,
}

fn describe_tree_as(root: &Path, detail: Detail) -> TreeDescription {
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
            let size = if ft.is_dir() { 0 } else { md.size() };
            let line = match detail {
                Detail::Full => format!(
                    "{kind} mode {:o} owner {}:{} size {size}{mtime} xattrs {:?}",
                    md.mode() & 0o7777,
                    md.uid(),
                    md.gid(),
                    user_xattrs(&p)
                ),
                Detail::NoXattrs => format!(
                    "{kind} mode {:o} owner {}:{} size {size}{mtime}",
                    md.mode() & 0o7777,
                    md.uid(),
                    md.gid(),
                ),
                Detail::Content => format!("{kind} size {size}"),
            };
            out.insert(r.as_os_str().as_bytes().to_vec(), line);
        }
    }
    (out, by_ino.into_values().collect())
}

fn assert_same_tree(source: &Path, copy: &Path) {
    assert_same_tree_as(source, copy, Detail::Full, true);
}

fn assert_same_tree_as(source: &Path, copy: &Path, detail: Detail, has_links: bool) {
    let (a, la) = describe_tree_as(source, detail);
    let (b, lb) = describe_tree_as(copy, detail);
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
    assert_eq!(!la.is_empty(), has_links, "the source has hard links");
}

// ---- the daemon and commands -------------------------------------------------------------

/// Runs `kaiso ARGS`, killed after `limit`.
fn kaiso(args: &[&OsStr], limit: Duration) -> Output {
    kaiso_env(args, &[], limit)
}

/// Runs `kaiso ARGS` with extra environment variables (`None`: removed), killed after
/// `limit`.
fn kaiso_env(args: &[&OsStr], env: &[(&str, Option<&str>)], limit: Duration) -> Output {
    run_kaiso_env(args, env, limit)
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// Runs `kaiso migrate VERB CONFIG EXTRA…`, killed after `limit`.
fn migrate(verb: &str, config: &Path, extra: &[&str], limit: Duration) -> Output {
    let mut args = vec![os("migrate"), os(verb), config.as_os_str()];
    args.extend(extra.iter().map(|a| os(a)));
    kaiso(&args, limit)
}

/// `kaiso migrate VERB CONFIG EXTRA…` that must succeed within 30 s.
#[track_caller]
fn migrate_ok(verb: &str, config: &Path, extra: &[&str]) {
    let o = migrate(verb, config, extra, Duration::from_secs(30));
    assert!(o.status.success(), "{}", text(&o));
}

/// `kaiso migrate finish CONFIG --wait <wait_secs>s`, with a minute of slack on top.
fn finish_waiting(config: &Path, wait_secs: u64) -> Output {
    let wait = format!("{wait_secs}s");
    migrate(
        "finish",
        config,
        &["--wait", &wait],
        Duration::from_secs(wait_secs + 60),
    )
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

fn status_json(config: &Path) -> serde_json::Value {
    let o = migrate("status", config, &["--json"], Duration::from_secs(30));
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

/// The daemon's own "serving after N ms" must be below this (see its use).
const SERVE_BOUND_MS: u64 = 5000;

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
        // nfs-cat and nfs-ls below (libnfs) do not retry JUKEBOX: a demand fetch or a
        // listing slower than the default 500 ms (a loaded machine) would fail them.
        os("--jukebox-after"),
        os("0"),
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
    // Under 1 s on an idle machine (printed above; docs/migration.md); the bound that
    // fails the test leaves room for a loaded machine (713 ms seen at load 15 on 2
    // cores), and still catches a start that waits for something.
    assert!(d.serving_ms() < SERVE_BOUND_MS, "{}", d.log_text());

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

    // `finish --wait` of a paused share says so at once instead of waiting out its limit.
    let asked = Instant::now();
    let o = finish_waiting(&cfg, 60);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("paused"),
        "finish --wait of a paused share must refuse naming the pause: {}",
        text(&o)
    );
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "finish --wait 60s of a paused share took {:?}: it must not wait out the limit",
        asked.elapsed()
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
    let o = migrate("status", &cfg, &[], Duration::from_secs(30));
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
    migrate_ok("throttle", &cfg, &["1MiB"]);
    migrate_ok("resume", &cfg, &[]);
    let before = share0(&status_json(&cfg))["bytes_done"].as_u64().unwrap();
    wait_status(&cfg, Duration::from_secs(60), "crawl progress", |s| {
        s["bytes_done"].as_u64().unwrap() >= before + (2 << 20) && s["state"] == "running"
    });
    migrate_ok("pause", &cfg, &[]);
    let v = wait_status(&cfg, Duration::from_secs(10), "paused", |s| {
        s["state"] == "paused"
    });
    let at_pause = share0(&v)["bytes_done"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let later = share0(&status_json(&cfg))["bytes_done"].as_u64().unwrap();
    // Stops within about one unit: of the 8 workers (the default --parallel) only the
    // one inside a 1 MiB unit may finish it; the others wait for the 1 MiB/s throttle,
    // and a throttle wait gives up on pause.
    assert!(
        later <= at_pause + (2 << 20),
        "paused crawl went on: {at_pause} → {later}"
    );
    migrate_ok("resume", &cfg, &[]);
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
    let o = migrate("status", &cfg, &[], Duration::from_secs(30));
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
    assert!(d.serving_ms() < SERVE_BOUND_MS, "{}", d.log_text());
    let o = finish_waiting(&cfg, 180);
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

/// `--meta-give-up-attempts` and `--meta-give-up-after` reach the share's spec (which a
/// restarted daemon reads again): the values given, and the defaults (5, 15 min) when
/// not given; `--help` shows both flags.
#[test]
fn meta_give_up_flags_reach_the_share_spec() {
    let help = kaiso_env(
        &[os("migrate"), os("start"), os("--help")],
        &[],
        Duration::from_secs(30),
    );
    let help_text = String::from_utf8_lossy(&help.stdout);
    assert!(
        help_text.contains("--meta-give-up-attempts <N>")
            && help_text.contains("--meta-give-up-after <DUR>"),
        "migrate start --help: {help_text}"
    );
    for (flags, attempts, after_ms) in [
        (
            &[
                "--meta-give-up-attempts",
                "2",
                "--meta-give-up-after",
                "90s",
            ][..],
            2,
            90_000,
        ),
        (&[][..], 5, 900_000),
    ] {
        let store = Store::new("migcli-giveup", StoreSpec::tiers(1));
        let src = store.root.join("old");
        fs::create_dir_all(&src).unwrap();
        fs::write(src.join("f"), b"source file").unwrap();
        let mut args = vec![src.as_os_str(), store.config.as_os_str(), os("--paused")];
        args.extend(flags.iter().map(|f| os(f)));
        let _d =
            Daemon::start(&args, store.root.join("d.log"), None).unwrap_or_else(|e| panic!("{e}"));
        let spec_path = store.state.join("migrate/main/share.json");
        let t0 = Instant::now();
        while !spec_path.exists() && t0.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(50));
        }
        let spec: serde_json::Value = serde_json::from_slice(
            &fs::read(&spec_path).unwrap_or_else(|e| panic!("{}: {e}", spec_path.display())),
        )
        .unwrap();
        assert_eq!(spec["meta_give_up_attempts"], attempts, "{flags:?}: {spec}");
        assert_eq!(spec["meta_give_up_after_ms"], after_ms, "{flags:?}: {spec}");
    }
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
    let o = finish_waiting(&cfg, 120);
    assert!(o.status.success(), "{}", text(&o));
    assert_same_tree(&src, &mnt);
}

/// Asserts a command failed with one short message containing `want` and no panic.
#[track_caller]
fn assert_one_clear_line(args: &[&OsStr], o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{args:?}: {}", err.trim());
    assert!(!o.status.success(), "{args:?} succeeded: {}", text(o));
    assert!(
        err.contains(want),
        "{args:?}: expected {want:?} in {}",
        text(o)
    );
    assert!(!err.contains("panicked"), "{args:?}: {}", text(o));
    assert!(err.lines().count() <= 3, "{args:?}: not short: {err}");
}

#[test]
fn migrate_errors_are_one_clear_line() {
    let store = Store::new("migcli-err", StoreSpec::tiers(1));
    let cfg = store.config.clone();
    let missing = store.root.join("no-such-dir");
    store.seed(0, "afile", b"a file");
    store.seed(0, "full/keep", b"data already here");
    let src = store.root.join("old");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), b"source file").unwrap();
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
        (
            vec![os("/tmp"), cfg.as_os_str(), os("--parallel"), os("0")],
            "--parallel must be at least 1",
        ),
        (
            vec![os("/tmp"), cfg.as_os_str(), os("--rate"), os("fast")],
            "bad rate \"fast\"",
        ),
        (
            vec![
                os("/tmp"),
                cfg.as_os_str(),
                os("--meta-give-up-attempts"),
                os("0"),
            ],
            "--meta-give-up-attempts 0: give 1 to 1000000 failures",
        ),
        (
            vec![
                os("/tmp"),
                cfg.as_os_str(),
                os("--meta-give-up-attempts"),
                os("many"),
            ],
            "--meta-give-up-attempts",
        ),
        (
            vec![
                os("/tmp"),
                cfg.as_os_str(),
                os("--meta-give-up-after"),
                os("soon"),
            ],
            "--meta-give-up-after: bad duration \"soon\"",
        ),
        // A regular file where the share's directory should be.
        (
            vec![src.as_os_str(), cfg.as_os_str(), os("--into"), os("afile")],
            "afile",
        ),
        // A directory that already holds data: a migration would re-stub it.
        (
            vec![src.as_os_str(), cfg.as_os_str(), os("--into"), os("full")],
            "is not empty",
        ),
        // No $KAISO_SMB_PASSWORD (removed below): refused before connecting.
        (
            vec![os("smb://root@127.0.0.1:1/s"), cfg.as_os_str()],
            "KAISO_SMB_PASSWORD",
        ),
    ];
    for (args, want) in cases {
        let mut full = vec![os("migrate"), os("start")];
        full.extend(args);
        let o = kaiso_env(
            &full,
            &[("KAISO_SMB_PASSWORD", None)],
            Duration::from_secs(60),
        );
        assert_one_clear_line(&full, &o, want);
    }
    // Nothing was attached by the refused starts: the file is untouched.
    assert_eq!(fs::read(store.tiers[0].join("afile")).unwrap(), b"a file");
    assert_eq!(
        fs::read(store.tiers[0].join("full/keep")).unwrap(),
        b"data already here"
    );
    let o = migrate(
        "finish",
        &cfg,
        &["--share", "unknown"],
        Duration::from_secs(30),
    );
    assert_one_clear_line(&[], &o, "no share \"unknown\"");
    // Bad input only a real server can give: a wrong SMB password, an NFS path the
    // server does not export.
    if servers_available(&["ganesha.nfsd", "rpcbind", "nfs-ls", "smbd", "smbpasswd"]) {
        let samba = Samba::start(&src);
        let url = samba.url();
        let full = [os("migrate"), os("start"), os(&url), cfg.as_os_str()];
        let o = kaiso_env(
            &full,
            &[("KAISO_SMB_PASSWORD", Some("not-the-password"))],
            Duration::from_secs(60),
        );
        assert_one_clear_line(&full, &o, "Logon Failure");
        drop(samba);
        let ganesha = Ganesha::start(&src);
        let url = ganesha.url_of("/not_exported");
        let full = [os("migrate"), os("start"), os(&url), cfg.as_os_str()];
        let o = kaiso(&full, Duration::from_secs(60));
        assert_one_clear_line(&full, &o, "not_exported");
    }
    // Commands without a daemon.
    let o = migrate("pause", &cfg, &[], Duration::from_secs(30));
    assert_fails_with(&o, "no migration is running");
    let o = migrate("finish", &cfg, &[], Duration::from_secs(30));
    assert_fails_with(&o, "nothing is being migrated");

    // Store busy: a plain `kaiso mount` serves the store.
    if common::fuse_unavailable().is_none() {
        let _m = store.mount();
        let o = kaiso(
            &[os("migrate"), os("start"), os("/tmp"), cfg.as_os_str()],
            Duration::from_secs(30),
        );
        assert_fails_with(&o, "store busy");
        let o = migrate("status", &cfg, &[], Duration::from_secs(30));
        assert_fails_with(&o, "store busy");
    }

    // An SMB share added to a running daemon is opened by the daemon, so the password
    // must be in the daemon's environment, not only in the caller's.
    let _d = Daemon::start_env(
        &[src.as_os_str(), cfg.as_os_str(), os("--into"), os("posix")],
        &[],
        store.root.join("d.log"),
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let full = [
        os("migrate"),
        os("start"),
        os("smb://root@127.0.0.1:1/s"),
        cfg.as_os_str(),
        os("--into"),
        os("smb"),
    ];
    let o = kaiso_env(
        &full,
        &[("KAISO_SMB_PASSWORD", Some("pw"))],
        Duration::from_secs(60),
    );
    assert_one_clear_line(&full, &o, "the migration daemon's environment lacks it");
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
    migrate_ok("resume", &cfg, &["--share", "a"]);
    let o = finish_waiting(&cfg, 180);
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

/// Sum of the store's per-tier `accesses` (reads and writes the store served itself; a
/// read the kernel serves by passthrough does not reach it).
fn store_accesses(config: &Path) -> u64 {
    let o = kaiso(
        &[os("status"), config.as_os_str(), os("--json")],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    v["tiers"]
        .as_array()
        .unwrap_or_else(|| panic!("no tiers: {v:#}"))
        .iter()
        .map(|t| t["accesses"].as_u64().unwrap())
        .sum()
}

/// The migration daemon's mount hands complete files to the kernel (passthrough) like a
/// plain `kaiso mount`, during the migration and after `finish`; a stub's reads go
/// through the store, which fetches the missing ranges.
#[test]
fn complete_files_are_served_by_passthrough_stubs_are_not() {
    fuse_or_skip!();
    let store = Store::new("migcli-pt", StoreSpec::tiers(1));
    let src = store.root.join("old");
    make_source(&src, false);
    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    let _d = Daemon::start(
        &[
            src.as_os_str(),
            cfg.as_os_str(),
            os("--mount"),
            mnt.as_os_str(),
            os("--paused"),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let stub = "d1/e0/f3";
    let want = fs::read(src.join(stub)).unwrap();
    assert!(!want.is_empty());
    let before = store_accesses(&cfg);
    assert_eq!(fs::read(mnt.join(stub)).unwrap(), want);
    let after_stub = store_accesses(&cfg);
    assert!(
        after_stub > before,
        "a stub's read must be served by the store: accesses {before} → {after_stub}"
    );
    // Now complete: a new open is passthrough, the store serves no read.
    for _ in 0..3 {
        assert_eq!(fs::read(mnt.join(stub)).unwrap(), want);
    }
    let after_complete = store_accesses(&cfg);
    assert_eq!(
        after_complete, after_stub,
        "reads of a complete file went through the store"
    );

    // After finish, every migrated file is served by passthrough.
    migrate_ok("resume", &cfg, &[]);
    let o = finish_waiting(&cfg, 180);
    assert!(o.status.success(), "{}", text(&o));
    let before = store_accesses(&cfg);
    let big = fs::read(src.join("big.bin")).unwrap();
    for _ in 0..2 {
        assert!(fs::read(mnt.join("big.bin")).unwrap() == big);
        assert_eq!(fs::read(mnt.join(stub)).unwrap(), want);
    }
    assert_eq!(
        store_accesses(&cfg),
        before,
        "after finish, reads of migrated files went through the store"
    );

    // --no-passthrough: the store serves complete files too.
    let store = Store::new("migcli-nopt", StoreSpec::tiers(1));
    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    let _d = Daemon::start(
        &[
            src.as_os_str(),
            cfg.as_os_str(),
            os("--mount"),
            mnt.as_os_str(),
            os("--paused"),
            os("--no-passthrough"),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(fs::read(mnt.join(stub)).unwrap(), want);
    let complete = store_accesses(&cfg);
    assert_eq!(fs::read(mnt.join(stub)).unwrap(), want);
    assert!(
        store_accesses(&cfg) > complete,
        "--no-passthrough: the read of a complete file did not reach the store"
    );
}

/// `nfs-cat` of `url`, unchecked (bounded by `timeout`).
/// A process stopped (SIGSTOP) until this is dropped (SIGCONT), also when a test panics.
struct SourceStopped(u32);

impl SourceStopped {
    fn new(pid: u32) -> Self {
        common::sigstop_all_threads(pid as i32);
        SourceStopped(pid)
    }
}

impl Drop for SourceStopped {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

fn nfs_cat_raw(url: &str) -> Output {
    Command::new("timeout")
        .args(["60", "nfs-cat"])
        .arg(url)
        .output()
        .expect("nfs-cat")
}

/// libnfs clients (nfs-cat, nfs-cp) do not retry NFS3ERR_JUKEBOX: with a fetch slower
/// than `--jukebox-after` they fail with EAGAIN (-11); a retry joins the fetch the first
/// call started, so repeating the command gets the data. With `--jukebox-after 0` the
/// face waits for the fetch and one call returns every byte.
///
/// The source is a kaiso mount whose daemon is stopped (SIGSTOP) for the first call, so
/// that call is slower than the 300 ms deadline whatever the machine's speed, and every
/// later call, once the source runs again, is far below it even on a loaded machine. (With
/// a 1 ms deadline and a quick source, a loaded machine answered JUKEBOX to nearly every
/// call: each retry claimed one finished call and lost the next, and nfs-cat never got
/// past the LOOKUP in 100 runs.)
#[test]
fn libnfs_clients_fail_on_jukebox_and_read_everything_with_jukebox_after_0() {
    if !have("nfs-cat") {
        assert!(std::env::var_os("CI").is_none(), "nfs-cat is not installed");
        eprintln!("notice: libnfs-utils absent; test not run (scripts/deps/cli.list)");
        return;
    }
    fuse_or_skip!();
    let data = bytes(3, 32 << 20);
    for jukebox_after in ["300ms", "0"] {
        let old = Store::new("migcli-jb-src", StoreSpec::tiers(1));
        old.seed(0, "big", &data);
        let source_mount = old.mount();
        let source_pid = source_mount.pid().expect("source daemon pid");
        let src = old.mountpoint.clone();
        let store = Store::new("migcli-jb", StoreSpec::tiers(1));
        // The face logs each JUKEBOX answer at debug level.
        let d = Daemon::start_env(
            &[
                src.as_os_str(),
                store.config.as_os_str(),
                os("--nfs"),
                os("127.0.0.1:0"),
                os("--paused"),
                os("--jukebox-after"),
                os(jukebox_after),
            ],
            &[("KAISO_LOG", "warn,kaiso_nfs::jukebox=debug")],
            store.root.join("d.log"),
            None,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let port = d.nfs_port();
        let url = format!("nfs://127.0.0.1/export/big?nfsport={port}&mountport={port}&version=3");
        // The JUKEBOX case: the first call finds the source hung, so its listing or fetch
        // outlasts the deadline; the source runs again as soon as nfs-cat returned.
        let hung = (jukebox_after != "0").then(|| SourceStopped::new(source_pid));
        let first = nfs_cat_raw(&url);
        drop(hung);
        let err = String::from_utf8_lossy(&first.stderr).into_owned();
        eprintln!(
            "--jukebox-after {jukebox_after}: nfs-cat exit {:?}, {} bytes, stderr {err:?}",
            first.status.code(),
            first.stdout.len()
        );
        let jukeboxes = || d.log_text().matches("NFS3ERR_JUKEBOX").count();
        if jukebox_after == "0" {
            assert_eq!(jukeboxes(), 0, "{}", d.log_text());
            assert!(
                first.status.success() && first.stdout == data,
                "--jukebox-after 0: nfs-cat exit {}, {} of {} bytes, stderr {err}",
                first.status,
                first.stdout.len(),
                data.len()
            );
            continue;
        }
        // The hung source holds the root's listing (or the fetch) past 300 ms: JUKEBOX,
        // which libnfs hands to the caller as EAGAIN (-11). nfs-cat then names the failed
        // step: a LOOKUP ("NFS3ERR_JUKEBOX(-11)") or the READ ("Failed to read from file").
        assert!(
            !first.status.success()
                && first.stdout.is_empty()
                && (err.contains("NFS3ERR_JUKEBOX") || err.contains("Failed to read")),
            "expected a JUKEBOX failure: {} {err}",
            first.status
        );
        assert!(jukeboxes() > 0, "no JUKEBOX answered: {}", d.log_text());
        // Repeating the command joins the fetches the earlier calls started.
        let mut tries = 1;
        loop {
            let answered = jukeboxes();
            let o = nfs_cat_raw(&url);
            tries += 1;
            if o.status.success() {
                assert!(o.stdout == data, "bytes differ after {tries} tries");
                break;
            }
            let e = String::from_utf8_lossy(&o.stderr);
            // A GETATTR that waits behind a fetch's write gets JUKEBOX too, which nfs-cat
            // reports as "Failed to stat": accepted when the daemon did answer JUKEBOX.
            let jukebox_stat = e.contains("Failed to stat") && jukeboxes() > answered;
            assert!(
                (e.contains("NFS3ERR_JUKEBOX") || e.contains("Failed to read") || jukebox_stat)
                    && tries < 100,
                "try {tries}: {e}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "--jukebox-after 300ms: every byte after {tries} nfs-cat runs, {} JUKEBOX answers",
            jukeboxes()
        );
    }
}

/// `kaiso migrate status --watch`: JSON lines with rising progress while the crawl runs,
/// exit 0 once it is done; the text mode ends with the final status.
#[test]
fn status_watch_follows_the_crawl_and_exits_when_done() {
    let store = Store::new("migcli-watch", StoreSpec::tiers(1));
    let src = store.root.join("old");
    for i in 0..8u64 {
        let dir = src.join(format!("d{}", i % 2));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("f{i}")), bytes(i + 40, 1 << 20)).unwrap();
    }
    let cfg = store.config.clone();
    let _d = Daemon::start(
        &[
            src.as_os_str(),
            cfg.as_os_str(),
            os("--paused"),
            os("--chunk"),
            os("256KiB"),
            os("--rate"),
            os("4MiB"),
        ],
        store.root.join("d.log"),
        None,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let out = store.root.join("watch.out");
    let mut watch = Command::new(kaiso_bin())
        .args([os("migrate"), os("status"), cfg.as_os_str()])
        .args(["--watch", "--json", "--interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kaiso migrate status --watch");
    // Paused: the watch keeps going.
    std::thread::sleep(Duration::from_millis(600));
    assert!(
        watch.try_wait().unwrap().is_none(),
        "--watch ended while paused"
    );
    migrate_ok("resume", &cfg, &[]);
    let status = wait_child(&mut watch, Duration::from_secs(120)).unwrap_or_else(|| {
        let _ = watch.kill();
        let _ = watch.wait();
        panic!("--watch did not end within 120 s after the crawl started");
    });
    assert!(status.success(), "--watch: {status}");
    let lines: Vec<serde_json::Value> = fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let done: Vec<u64> = lines
        .iter()
        .map(|v| share0(v)["bytes_done"].as_u64().unwrap())
        .collect();
    assert!(
        done.windows(2).all(|w| w[0] <= w[1]),
        "bytes_done went down: {done:?}"
    );
    let distinct: BTreeSet<u64> = done.iter().copied().collect();
    assert!(distinct.len() >= 3, "no progress seen: {done:?}");
    let last = share0(lines.last().unwrap());
    assert_eq!(last["remaining_stubs"], 0, "{last:#}");
    assert_eq!(last["bytes_done"], 8 << 20, "{last:#}");
    // Text mode with the crawl done: ends at once with the final status.
    let o = migrate("status", &cfg, &["--watch"], Duration::from_secs(30));
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("share main:"),
        "{}",
        text(&o)
    );
}

/// A source for the SMB share: directories and regular files, small to multi-MiB.
fn make_smb_source(root: &Path) {
    for d in ["a/b", "c", "empty-dir"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join("a/b/big"), bytes(61, (6 << 20) + 17)).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    for i in 0..30u64 {
        fs::write(
            root.join(format!("c/f{i:02}")),
            bytes(200 + i, (i * 7919) as usize),
        )
        .unwrap();
    }
}

/// The binary end to end with real servers: one NFSv3 share from nfs-ganesha and one
/// SMB3 share from smbd (password from `$KAISO_SMB_PASSWORD`) migrated into one store
/// (N-to-1), read through the FUSE mount, finished, and compared with the sources.
#[test]
fn nfs_and_smb_shares_into_one_store_with_the_binary() {
    fuse_or_skip!();
    if !servers_available(&["ganesha.nfsd", "rpcbind", "nfs-ls", "smbd", "smbpasswd"]) {
        return;
    }
    let store = Store::new("migcli-srv", StoreSpec::tiers(1));
    let (nfs_src, smb_src) = (store.root.join("nfs-src"), store.root.join("smb-src"));
    make_source(&nfs_src, true);
    make_smb_source(&smb_src);
    let ganesha = Ganesha::start(&nfs_src);
    let samba = Samba::start(&smb_src);
    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    let env = [("KAISO_SMB_PASSWORD", samba.password.as_str())];
    let nfs_url = ganesha.url();
    let d = Daemon::start_env(
        &[
            os(&nfs_url),
            cfg.as_os_str(),
            os("--into"),
            os("nfs"),
            os("--mount"),
            mnt.as_os_str(),
            os("--chunk"),
            os("1MiB"),
            os("--paused"),
        ],
        &env,
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let smb_url = samba.url();
    let o = kaiso_env(
        &[
            os("migrate"),
            os("start"),
            os(&smb_url),
            cfg.as_os_str(),
            os("--into"),
            os("smb"),
            os("--paused"),
        ],
        &[("KAISO_SMB_PASSWORD", Some(&samba.password))],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), d.log_text());
    // On demand through the mount, from both servers.
    assert_eq!(
        fs::read(mnt.join("nfs/d0/e0/g/h/deep.txt")).unwrap(),
        b"deep file\n"
    );
    assert!(
        fs::read(mnt.join("nfs/big.bin")).unwrap() == fs::read(nfs_src.join("big.bin")).unwrap()
    );
    assert!(
        fs::read(mnt.join("smb/a/b/big")).unwrap() == fs::read(smb_src.join("a/b/big")).unwrap()
    );
    let v = status_json(&cfg);
    for s in v["shares"].as_array().unwrap() {
        assert!(s["demand_fetches"].as_u64().unwrap() > 0, "{v:#}");
        assert_eq!(s["state"], "paused", "{v:#}");
    }
    let o = migrate(
        "finish",
        &cfg,
        &["--share", "unknown"],
        Duration::from_secs(30),
    );
    assert_one_clear_line(&[], &o, "no share \"unknown\" is being migrated here");
    migrate_ok("resume", &cfg, &[]);
    let o = finish_waiting(&cfg, 300);
    assert!(o.status.success(), "{}\n{}", text(&o), d.log_text());
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("share nfs finished") && t.contains("share smb finished"),
        "{}",
        text(&o)
    );
    // NFSv3 carries modes, owners, times, links and special files, but no xattrs.
    assert_same_tree_as(&nfs_src, &mnt.join("nfs"), Detail::NoXattrs, true);
    assert_same_tree_as(&smb_src, &mnt.join("smb"), Detail::Content, false);
}

// ---- kill -9 of the daemon at random moments, a client writing through the mount -------

/// A client's change of a file in `w/` through the mount (data are kept, for checks).
#[derive(Clone, Debug)]
enum ClientOp {
    Write {
        path: String,
        offset: u64,
        data: Vec<u8>,
    },
    Truncate {
        path: String,
        size: u64,
    },
    Rewrite {
        path: String,
        data: Vec<u8>,
    },
    Rename {
        from: String,
        to: String,
    },
    Create {
        path: String,
        data: Vec<u8>,
    },
    Unlink {
        path: String,
    },
}

/// What `w/` must hold: path (relative to the share) → bytes.
type WorkModel = BTreeMap<String, Vec<u8>>;

impl ClientOp {
    /// One line for messages (without the data).
    fn describe(&self) -> String {
        match self {
            ClientOp::Write { path, offset, data } => {
                format!("write {path} at {offset}, {} bytes", data.len())
            }
            ClientOp::Truncate { path, size } => format!("truncate {path} to {size}"),
            ClientOp::Rewrite { path, data } => format!("rewrite {path}, {} bytes", data.len()),
            ClientOp::Rename { from, to } => format!("rename {from} {to}"),
            ClientOp::Create { path, data } => format!("create {path}, {} bytes", data.len()),
            ClientOp::Unlink { path } => format!("unlink {path}"),
        }
    }

    /// Performs the change and makes it durable; `Ok` is the client's acknowledgement.
    fn perform(&self, mnt: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        match self {
            ClientOp::Write { path, offset, data } => {
                let f = fs::OpenOptions::new().write(true).open(mnt.join(path))?;
                f.write_all_at(data, *offset)?;
                f.sync_all()
            }
            ClientOp::Truncate { path, size } => {
                let f = fs::OpenOptions::new().write(true).open(mnt.join(path))?;
                f.set_len(*size)?;
                f.sync_all()
            }
            ClientOp::Rewrite { path, data } => {
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(mnt.join(path))?;
                std::io::Write::write_all(&mut f, data)?;
                f.sync_all()
            }
            ClientOp::Rename { from, to } => {
                fs::rename(mnt.join(from), mnt.join(to))?;
                fs::File::open(mnt.join("w"))?.sync_all()
            }
            ClientOp::Create { path, data } => {
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(mnt.join(path))?;
                std::io::Write::write_all(&mut f, data)?;
                f.sync_all()?;
                fs::File::open(mnt.join("w"))?.sync_all()
            }
            ClientOp::Unlink { path } => {
                fs::remove_file(mnt.join(path))?;
                fs::File::open(mnt.join("w"))?.sync_all()
            }
        }
    }

    /// The model after the change.
    fn apply(&self, model: &mut WorkModel) {
        match self {
            ClientOp::Write { path, offset, data } => {
                let f = model.get_mut(path).unwrap();
                let end = *offset as usize + data.len();
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[*offset as usize..end].copy_from_slice(data);
            }
            ClientOp::Truncate { path, size } => {
                model.get_mut(path).unwrap().resize(*size as usize, 0)
            }
            ClientOp::Rewrite { path, data } => {
                model.insert(path.clone(), data.clone());
            }
            ClientOp::Rename { from, to } => {
                let d = model.remove(from).unwrap();
                model.insert(to.clone(), d);
            }
            ClientOp::Create { path, data } => {
                model.insert(path.clone(), data.clone());
            }
            ClientOp::Unlink { path } => {
                model.remove(path);
            }
        }
    }

    /// After a kill cut this change off before its acknowledgement: what the restarted
    /// mount shows must be the state before it, after it, or — for data — each byte of
    /// the written range either old or new (the kernel may have sent part of the pages),
    /// and the model takes what is there. `Err(Ok(io))`: the mount is not back yet.
    fn resolve(
        &self,
        mnt: &Path,
        model: &mut WorkModel,
    ) -> Result<(), Result<std::io::Error, String>> {
        let read = |p: &str| fs::read(mnt.join(p)).map_err(Ok);
        match self {
            ClientOp::Write { path, offset, data } => {
                let got = read(path)?;
                let before = &model[path];
                let (off, end) = (*offset as usize, *offset as usize + data.len());
                let ok_len = got.len() >= before.len() && got.len() <= before.len().max(end);
                let old = |i: usize| before.get(i).copied().unwrap_or(0);
                let ok = ok_len
                    && got.iter().enumerate().all(|(i, b)| {
                        *b == old(i) || ((off..end).contains(&i) && *b == data[i - off])
                    });
                if !ok {
                    return Err(Err(format!(
                        "{path}: an unacknowledged write of {} bytes at {off} left bytes that are neither old nor new (size {} → {})",
                        data.len(),
                        before.len(),
                        got.len()
                    )));
                }
                model.insert(path.clone(), got);
            }
            ClientOp::Truncate { path, size } => {
                let got = read(path)?;
                let mut after = model[path].clone();
                after.resize(*size as usize, 0);
                if got != model[path] && got != after {
                    return Err(Err(format!(
                        "{path}: neither before nor after truncate({size})"
                    )));
                }
                model.insert(path.clone(), got);
            }
            ClientOp::Rewrite { path, data } => {
                let got = read(path)?;
                let partial = got.len() <= data.len()
                    && got.iter().zip(data).all(|(b, d)| *b == *d || *b == 0);
                if got != model[path] && !partial {
                    return Err(Err(format!(
                        "{path}: neither before nor (part of) the rewrite"
                    )));
                }
                model.insert(path.clone(), got);
            }
            ClientOp::Rename { from, to } => {
                fs::metadata(mnt.join("w")).map_err(Ok)?;
                let applied = !mnt.join(from).exists();
                let mut after = model.clone();
                if applied {
                    self.apply(&mut after);
                }
                for p in [from, to] {
                    match after.get(p) {
                        Some(want) => {
                            if read(p)? != *want {
                                return Err(Err(format!(
                                    "{p} after rename {from} {to}: wrong bytes"
                                )));
                            }
                        }
                        None => {
                            if mnt.join(p).exists() {
                                return Err(Err(format!("{p} exists after rename {from} {to}")));
                            }
                        }
                    }
                }
                *model = after;
            }
            ClientOp::Create { path, data } => {
                fs::metadata(mnt.join("w")).map_err(Ok)?;
                if !mnt.join(path).exists() {
                    return Ok(());
                }
                let got = read(path)?;
                let partial = got.len() <= data.len()
                    && got.iter().zip(data).all(|(b, d)| *b == *d || *b == 0);
                if !partial {
                    return Err(Err(format!("{path}: created with bytes not its own")));
                }
                model.insert(path.clone(), got);
            }
            ClientOp::Unlink { path } => {
                fs::metadata(mnt.join("w")).map_err(Ok)?;
                if mnt.join(path).exists() {
                    if read(path)? != model[path] {
                        return Err(Err(format!("{path}: wrong bytes after a cut-off unlink")));
                    }
                } else {
                    model.remove(path);
                }
            }
        }
        Ok(())
    }
}

/// The next change (or `None`: a read check instead).
fn next_client_op(model: &WorkModel, rng: &mut common::rng::Rng, serial: u64) -> Option<ClientOp> {
    let files: Vec<&String> = model.keys().collect();
    let path = files[rng.below(files.len() as u64) as usize].clone();
    let len = model[&path].len() as u64;
    Some(match rng.below(100) {
        0..=34 => ClientOp::Write {
            path,
            offset: rng.below(len + 4096),
            data: {
                let n = 1 + rng.below(300 << 10) as usize;
                rng.bytes(n)
            },
        },
        35..=49 => ClientOp::Truncate {
            size: rng.below(len + (1 << 20)),
            path,
        },
        50..=59 => ClientOp::Rewrite {
            path,
            data: {
                let n = rng.below(2 << 20) as usize;
                rng.bytes(n)
            },
        },
        60..=74 => {
            let to = if rng.chance(30) && files.len() > 6 {
                files[rng.below(files.len() as u64) as usize].clone()
            } else {
                format!("w/r{serial}")
            };
            if to == path {
                return None;
            }
            ClientOp::Rename { from: path, to }
        }
        // New files take the inode numbers removed files leave (a restart must not mix
        // them up).
        75..=82 => ClientOp::Create {
            path: format!("w/c{serial}"),
            data: {
                let n = rng.below(1 << 20) as usize;
                rng.bytes(n)
            },
        },
        83..=88 if files.len() > 6 => ClientOp::Unlink { path },
        _ => return None,
    })
}

/// A read of a random range of a random file, compared with the model; I/O errors (the
/// daemon was just killed) are no failure.
fn client_read_check(
    mnt: &Path,
    model: &WorkModel,
    rng: &mut common::rng::Rng,
) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let files: Vec<&String> = model.keys().collect();
    let path = files[rng.below(files.len() as u64) as usize];
    let want = &model[path];
    let offset = rng.below(want.len() as u64 + 1) as usize;
    let n = (1 + rng.below(2 << 20) as usize).min(want.len() - offset);
    let Ok(f) = fs::File::open(mnt.join(path)) else {
        return Ok(());
    };
    let mut buf = vec![0u8; n];
    let mut got = 0;
    while got < n {
        match f.read_at(&mut buf[got..], (offset + got) as u64) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(_) => return Ok(()),
        }
    }
    if buf[..got] != want[offset..offset + n] {
        return Err(format!(
            "read of {path} at {offset}, {n} bytes: got {got} bytes that differ from the model"
        ));
    }
    Ok(())
}

/// The client thread: changes and reads files in `w/` while the daemon lives; an
/// operation that fails (the daemon was killed) stays pending and is resolved through
/// the next mount. Holds `gate` shared during each operation, so that it never runs
/// against the bare mountpoint directory while the test restarts the daemon.
fn writing_client(
    mnt: &Path,
    mut model: WorkModel,
    seed: u64,
    gate: &std::sync::RwLock<()>,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(WorkModel, u64, u64), String> {
    let mut rng = common::rng::Rng::new(seed);
    let (mut acked, mut resolved, mut serial) = (0u64, 0u64, 0u64);
    let mut pending: Option<ClientOp> = None;
    // Operations cut off (each should be one a kill interrupted), for messages.
    let mut failures: Vec<String> = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        let g = gate.read().unwrap();
        if let Some(op) = pending.take() {
            match op.resolve(mnt, &mut model) {
                Ok(()) => resolved += 1,
                Err(Ok(_)) => pending = Some(op),
                Err(Err(e)) => return Err(format!("seed {seed}: after a kill: {e}")),
            }
        } else {
            serial += 1;
            match next_client_op(&model, &mut rng, serial) {
                Some(op) => match op.perform(mnt) {
                    Ok(()) => {
                        op.apply(&mut model);
                        acked += 1;
                    }
                    Err(e) => {
                        failures.push(format!("{}: {e}", op.describe()));
                        pending = Some(op);
                    }
                },
                None => client_read_check(mnt, &model, &mut rng)
                    .map_err(|e| format!("seed {seed}: {e}"))?,
            }
        }
        drop(g);
        std::thread::sleep(Duration::from_millis(if pending.is_some() {
            20
        } else {
            3
        }));
    }
    if let Some(op) = pending {
        op.resolve(mnt, &mut model).map_err(|e| {
            let names: BTreeSet<String> = fs::read_dir(mnt.join("w"))
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| format!("w/{}", e.file_name().to_string_lossy()))
                        .collect()
                })
                .unwrap_or_default();
            let w = fs::metadata(mnt.join("w")).map(|m| m.ino());
            let top: Vec<String> = fs::read_dir(mnt)
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            format!(
                "seed {seed}: at the end, resolving {}: {e:?}; failed operations {failures:?}; w/ holds {names:?} ({w:?}; top {top:?}; mounted {}), the model {:?}",
                op.describe(),
                is_mounted(mnt),
                model.keys().collect::<Vec<_>>()
            )
        })?;
        resolved += 1;
    }
    Ok((model, acked, resolved))
}

/// Issue 4 §7 with the real binary: `kaiso migrate start --mount` is killed with SIGKILL
/// three times at random 100-1500 ms points while a client reads and writes files of a
/// few MiB through the mount (so kills land mid-fetch), restarted each time, then
/// `finish --wait`: the tree is the source plus the client's acknowledged changes (and
/// whatever the kill made of the one change in flight, checked to be old or new bytes),
/// and no mount is left behind.
#[test]
fn kill9_of_the_daemon_at_random_moments_while_a_client_writes() {
    fuse_or_skip!();
    let seed = common::rng::test_seed("kill9_of_the_daemon_at_random_moments");
    let mut rng = common::rng::Rng::new(seed ^ 0x4b11);
    let store = Store::new("migcli-kill9", StoreSpec::tiers(2));
    let src = store.root.join("old");
    make_source(&src, true);
    let mut model = WorkModel::new();
    fs::create_dir_all(src.join("w")).unwrap();
    for i in 0..8u64 {
        let path = format!("w/f{i}");
        let data = bytes(700 + i, ((1 + i % 5) << 20) as usize + i as usize * 1000);
        fs::write(src.join(&path), &data).unwrap();
        model.insert(path, data);
    }
    let mnt = store.mountpoint.clone();
    let cfg = store.config.clone();
    let args: Vec<&OsStr> = vec![
        src.as_os_str(),
        cfg.as_os_str(),
        os("--mount"),
        mnt.as_os_str(),
        os("--chunk"),
        os("1MiB"),
        os("--rate"),
        os("6MiB"),
    ];
    let mut d = Daemon::start(&args, store.root.join("daemon0.log"), Some(&mnt))
        .unwrap_or_else(|e| panic!("{e}"));
    let gate = std::sync::RwLock::new(());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut kills = Vec::new();
    let (model, acked, resolved) = std::thread::scope(|sc| {
        let client = sc.spawn(|| writing_client(&mnt, model, seed, &gate, &stop));
        for round in 1..=3 {
            let after = Duration::from_millis(100 + rng.below(1400));
            std::thread::sleep(after);
            let pid = d.child.as_ref().map(|c| c.id() as i32).expect("daemon");
            unsafe { libc::kill(pid, libc::SIGKILL) };
            kills.push(after);
            // The client's operation in flight fails; then no operation until the
            // daemon serves again.
            let _g = gate.write().unwrap();
            d.kill9();
            assert!(!is_mounted(&mnt), "mount left after kill {round}");
            d = Daemon::start(
                &args,
                store.root.join(format!("daemon{round}.log")),
                Some(&mnt),
            )
            .unwrap_or_else(|e| panic!("restart {round} after kills at {kills:?}: {e}"));
        }
        // The client goes on against the last daemon for a moment, then stops.
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        client.join().unwrap()
    })
    .unwrap_or_else(|e| panic!("kills at {kills:?}: {e}"));
    assert!(acked > 0, "the client made no change: seed {seed}");
    let o = finish_waiting(&cfg, 180);
    assert!(
        o.status.success(),
        "seed {seed}, kills at {kills:?}: {}\ndaemon log:\n{}",
        text(&o),
        d.log_text()
    );
    // w/ is the model, exactly: no file lost, none extra, every byte.
    let mut got = WorkModel::new();
    for e in fs::read_dir(mnt.join("w")).unwrap() {
        let e = e.unwrap();
        let p = format!("w/{}", e.file_name().to_string_lossy());
        got.insert(p, fs::read(e.path()).unwrap());
    }
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        model.keys().collect::<Vec<_>>(),
        "seed {seed}, kills at {kills:?}: files of w/"
    );
    for (p, want) in &model {
        assert!(
            got[p] == *want,
            "seed {seed}, kills at {kills:?}: {p}: {} bytes, want {}",
            got[p].len(),
            want.len()
        );
    }
    // Everything else equals the source in every attribute.
    let (mut a, la) = describe_tree_as(&src, Detail::Full);
    let (mut b, lb) = describe_tree_as(&mnt, Detail::Full);
    for t in [&mut a, &mut b] {
        t.retain(|k, _| k.as_slice() != b"w" && !k.starts_with(b"w/"));
    }
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (k, v) in &a {
        assert_eq!(Some(v), b.get(k), "{} differs", String::from_utf8_lossy(k));
    }
    assert_eq!(la, lb, "hard-link groups");
    assert!(d.stop().success(), "{}", d.log_text());
    assert!(!is_mounted(&mnt), "mount left behind");
    eprintln!(
        "seed {seed}: kills at {kills:?}; {acked} acknowledged changes, {resolved} cut off by a kill and resolved; {} files in w/",
        model.len()
    );
}
