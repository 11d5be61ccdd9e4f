//! Session 12 audit of issue 2 with the real binary on a real mount: what the session-11
//! audit (`audit_s11.rs`) did not try. Each test failed on the tree the audit started
//! from (base 912bd1c); the ones fixed during the session run normally, the others are
//! ignored with the reason (`cargo test --release -p kaiso --test audit_s12 -- --ignored`).

mod common;

#[allow(dead_code)]
#[path = "../../source/tests/common/loop_ext4.rs"]
mod loop_ext4;

use common::audit::{moving_files, pattern, wait_for};
use common::{Store, StoreSpec, TierSpec};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: usize = 1 << 20;

fn text(out: &std::process::Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The value of xattr `name` of `p` (not following symlinks), or the errno name.
fn lgetxattr(p: &Path, name: &str) -> Result<Vec<u8>, String> {
    let c = common::cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 65536];
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        Err(common::errno_name(common::errno()))
    } else {
        buf.truncate(r as usize);
        Ok(buf)
    }
}

fn run(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
}

/// A directory that a move creates on a faster tier is made inside that tier's copy of
/// its parent. When the parent carries a default ACL, the new copy inherits it (the
/// backing `mkdir` applies the parent's default ACL), and because a directory shows the
/// attributes of its fastest copy, the directory suddenly has an access and a default
/// ACL it never had: new files made in it then inherit entries nobody set. Expected: a
/// move leaves a directory's ACLs as they were (none here), like `rsync -A` of the tree.
/// Found with `kaiso adopt` of a tree where `setfacl -d` was set on a parent after its
/// subdirectory was made, then `kaiso promote -r`.
#[test]
fn a_move_does_not_give_a_directory_the_default_acl_of_its_parent() {
    fuse_or_skip!();
    let store = Store::new(
        "audit12-dir-acl",
        StoreSpec::tiers(2).extra("[store.mover]\nenabled = false"),
    );
    // The tree as an administrator had it before adopting it: d/sub made first, then a
    // default ACL put on d (sub keeps none).
    store.seed(1, "d/sub/f", &pattern(1, 64 << 10));
    let d = store.tiers[1].join("d");
    let out = run(
        "setfacl",
        &["-d", "-m", "u:nobody:rwx", d.to_str().unwrap()],
    );
    assert!(out.status.success(), "setfacl -d: {}", text(&out));
    assert_eq!(
        lgetxattr(&store.tiers[1].join("d/sub"), "system.posix_acl_default"),
        Err("ENODATA".into()),
        "test setup: d/sub must have no default ACL"
    );
    let m = store.mount();
    let sub = m.path.join("d/sub");
    let before = (
        lgetxattr(&sub, "system.posix_acl_access"),
        lgetxattr(&sub, "system.posix_acl_default"),
    );
    assert_eq!(
        before,
        (Err("ENODATA".into()), Err("ENODATA".into())),
        "d/sub through the mount before any move"
    );
    let out = store.kaiso(&[
        "promote",
        "--tier",
        "t0",
        m.path.join("d/sub/f").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "kaiso promote: {}", text(&out));
    assert_eq!(
        store.tiers_holding("d/sub/f"),
        vec![0],
        "f must be on t0 now"
    );
    let after = (
        lgetxattr(&sub, "system.posix_acl_access"),
        lgetxattr(&sub, "system.posix_acl_default"),
    );
    // A file made in d/sub after the move must not inherit an ACL either.
    fs::write(sub.join("new"), b"n").unwrap();
    let new_acl = lgetxattr(&sub.join("new"), "system.posix_acl_access");
    assert!(
        after == before && new_acl == Err("ENODATA".into()),
        "after promoting d/sub/f, d/sub must keep no ACL (access, default) as before: got \
         {after:?}; a file created in it then got access ACL {new_acl:?} (expected ENODATA)"
    );
}

/// A move re-creates the file's parent directories on the destination tier and puts
/// their times back. Below PATH_MAX that holds; for directories whose backing path is
/// longer than PATH_MAX (reached through `/proc/self/fd`, see docs/tiering.md, *Trees
/// deeper than PATH_MAX*) the new copies keep the time of the move, so `ls -l` of the
/// deep directories shows a new mtime after a `kaiso promote`. Expected: every directory
/// keeps its mtime, whatever its depth.
#[test]
fn a_move_keeps_the_mtime_of_directories_deeper_than_path_max() {
    fuse_or_skip!();
    let store = Store::new(
        "audit12-deep-mtime",
        StoreSpec::tiers(2).extra("[store.mover]\nenabled = false"),
    );
    // 25 levels of 204-byte names (~5.1 KB) on t1, built with *at calls.
    let levels: Vec<String> = (0..25)
        .map(|i| format!("L{i:02}{}", "y".repeat(200)))
        .collect();
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut rel = PathBuf::new();
    unsafe {
        let mut fd = libc::open(common::cstr(&store.tiers[1]).as_ptr(), libc::O_RDONLY);
        assert!(fd >= 0);
        for n in &levels {
            let c = CString::new(n.as_str()).unwrap();
            assert_eq!(libc::mkdirat(fd, c.as_ptr(), 0o755), 0, "mkdirat");
            let nfd = libc::openat(fd, c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
            assert!(nfd >= 0);
            libc::close(fd);
            fd = nfd;
            rel.push(n);
            dirs.push(rel.clone());
        }
        let leaf = CString::new("leaf").unwrap();
        let w = libc::openat(fd, leaf.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
        assert!(w >= 0);
        assert_eq!(libc::write(w, b"deep".as_ptr().cast(), 4), 4);
        libc::close(w);
        let leaf2 = CString::new("leaf2").unwrap();
        assert_eq!(
            libc::linkat(fd, leaf.as_ptr(), fd, leaf2.as_ptr(), 0),
            0,
            "linkat"
        );
        libc::close(fd);
    }
    // Old times on every directory (deepest first, so setting one does not touch the
    // parent's), through a descriptor walk.
    let old = libc::timespec {
        tv_sec: 1_000_000_000,
        tv_nsec: 0,
    };
    let times = [old, old];
    for d in dirs.iter().rev() {
        let fd = open_deep(&store.tiers[1], d);
        assert_eq!(unsafe { libc::futimens(fd, times.as_ptr()) }, 0, "futimens");
        unsafe { libc::close(fd) };
    }
    let m = store.mount();
    let deep_leaf = dirs.last().unwrap().join("leaf");
    let mtimes = |root: &Path| -> Vec<(usize, i64)> {
        dirs.iter()
            .enumerate()
            .map(|(i, d)| {
                let fd = open_deep(root, d);
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
                unsafe { libc::close(fd) };
                (i, st.st_mtime)
            })
            .collect()
    };
    let before = mtimes(&m.path);
    assert!(
        before.iter().all(|&(_, t)| t == 1_000_000_000),
        "test setup: every directory through the mount must show the old mtime: {before:?}"
    );
    // Promote the deep leaf by its store-relative path (a mount path would be too long).
    let out = Command::new(common::kaiso_bin())
        .arg("promote")
        .arg("--tier")
        .arg("t0")
        .arg("--config")
        .arg(&store.config)
        .arg(&deep_leaf)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "kaiso promote: {}", text(&out));
    // The directory's attributes through the mount are those of its copy on the fastest
    // tier (docs/tiering.md, *POSIX semantics*); the kernel may still cache the old ones
    // for the attribute TTL, so look at that copy, which the next mount shows.
    let after = mtimes(&store.tiers[0]);
    let changed: Vec<usize> = after
        .iter()
        .filter(|&&(_, t)| t != 1_000_000_000)
        .map(|&(i, _)| i)
        .collect();
    assert!(
        changed.is_empty(),
        "after promoting the deep leaf every directory must keep mtime 1000000000; levels \
         whose mtime changed (0 = top; backing paths pass PATH_MAX at about level 19): \
         {changed:?}"
    );
}

/// Opens directory `rel` below `root` with one `openat` per component (any depth).
fn open_deep(root: &Path, rel: &Path) -> libc::c_int {
    unsafe {
        let mut fd = libc::open(
            common::cstr(root).as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY,
        );
        assert!(fd >= 0, "open {}", root.display());
        for c in rel.components() {
            let n = CString::new(c.as_os_str().as_bytes()).unwrap();
            let nfd = libc::openat(fd, n.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
            assert!(
                nfd >= 0,
                "openat {:?}: {}",
                c,
                common::errno_name(common::errno())
            );
            libc::close(fd);
            fd = nfd;
        }
        fd
    }
}

/// An operator move (`kaiso demote`) of a file that the background mover is moving at
/// that moment fails: `kaiso: 1 of 1 files not moved; last error: already being moved
/// (Device or resource busy (os error 16))`, exit 1. Seen first as `kaiso demote -r DIR`
/// leaving files behind right after they were written. Expected: the operator's move
/// waits for the move in flight and then moves the file where it was asked to (as a
/// spilling write does since session 11), exit 0; and no "os error" in a message.
#[test]
fn operator_move_of_a_file_the_planner_is_moving_waits_for_it() {
    fuse_or_skip!();
    let store = Store::new(
        "audit12-op-busy",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast")
                .capacity(4 * MIB as u64)
                .watermarks(0.3, 0.6),
            TierSpec::new("mid"),
            TierSpec::new("slow"),
        ])
        // The planner demotes f (75 % of fast, above its 60 % watermark) to mid at
        // 512 KiB/s: about 6 s in flight.
        .extra("[store.mover]\ninterval_ms = 200\nmax_rate = \"512KiB\"\nbusy_backoff = 1.0"),
    );
    let data = pattern(3, 3 * MIB);
    store.seed(0, "f", &data);
    let m = store.mount();
    let f = m.path.join("f");
    assert!(
        wait_for(Duration::from_secs(20), || moving_files(&store.config) > 0),
        "the planner never started demoting f (fast above its high watermark); log:\n{}",
        m.log_text()
    );
    let out = store.kaiso(&["demote", "--tier", "slow", f.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let on = store.tiers_holding("f");
    assert!(
        out.status.success() && on == vec![2] && !stderr.contains("os error"),
        "kaiso demote --tier slow of a file the planner is demoting must wait for that move \
         and end with f on slow (tier 2), exit 0, no \"os error\" in the message; got {} and \
         f on tiers {on:?}",
        text(&out)
    );
    assert!(fs::read(&f).unwrap() == data, "content of f changed");
}

/// The fast tier's file system has bytes but no free inodes (many small files, or other
/// programs). New files spill to the next tier, but `mkdir` on the mount fails with
/// ENOSPC while the slower tier has plenty of room, and so does a rename into a directory
/// the fast tier does not have yet (the file is renamed on its own tier, which must make
/// the directory). Expected: the directory is made on a
/// tier that can hold it, as files are (issue 2: ENOSPC only when no tier has room).
#[test]
fn mkdir_succeeds_when_the_fast_tier_has_no_free_inodes() {
    fuse_or_skip!();
    if !loop_ext4::available() {
        return;
    }
    let scratch = common::temp_dir("audit12-inodes-fs");
    let small = loop_ext4::LoopExt4::with_mkfs_args(&scratch, 16 << 20, &["-N", "256"]);
    let fast_dir = small.mnt.join("tier");
    fs::create_dir(&fast_dir).unwrap();
    fs::write(fast_dir.join("a"), b"on t0").unwrap();
    // Use up every free inode of the small file system outside the tier directory.
    common::fill_inodes(&small.mnt);
    let store = Store::new("audit12-inodes", StoreSpec::tiers(2));
    // Point tier 0 at the directory on the full file system.
    let cfg = fs::read_to_string(&store.config).unwrap().replace(
        &store.tiers[0].to_string_lossy().into_owned(),
        &fast_dir.to_string_lossy(),
    );
    fs::write(&store.config, cfg).unwrap();
    store.seed(1, "only/x", b"on t1");
    let m = store.mount();
    // Files spill (this part works).
    fs::write(m.path.join("file"), b"x").expect("a new file spills to t1");
    let mkdir = fs::create_dir(m.path.join("newdir"));
    let inner = mkdir
        .as_ref()
        .ok()
        .map(|_| fs::write(m.path.join("newdir/f"), b"y"));
    // A rename of a file on t0 into a directory only t1 has needs that directory on t0.
    let rename = fs::rename(m.path.join("a"), m.path.join("only/a"));
    drop(m);
    drop(store);
    drop(small);
    let _ = fs::remove_dir_all(&scratch);
    assert!(
        mkdir.is_ok() && matches!(inner, Some(Ok(()))) && rename.is_ok(),
        "with t0's file system out of inodes and t1 nearly empty, mkdir on the mount must \
         succeed (and a file inside it), and so must a rename of a t0 file into a directory \
         only t1 has: mkdir {mkdir:?}, file inside {inner:?}, rename {rename:?}"
    );
}

/// `kaiso adopt DIR` of a tree deeper than PATH_MAX fails before adopting anything:
/// `kaiso: cannot list DIR/L00…/…/L19…` / `caused by: File name too long (os error 36)`.
/// Its check for paths another tier also has walks DIR by absolute path. Store open,
/// fsck, the mount and the mover all handle such trees (docs/tiering.md, *Trees deeper
/// than PATH_MAX*); adopt must too.
#[test]
fn adopt_takes_a_tree_deeper_than_path_max() {
    let root = common::temp_dir("audit12-adopt-deep");
    let dir = root.join("data");
    fs::create_dir(&dir).unwrap();
    let fast = root.join("fast");
    let mut depth = 0;
    unsafe {
        let mut fd = libc::open(common::cstr(&dir).as_ptr(), libc::O_RDONLY);
        for i in 0..25 {
            let c = CString::new(format!("L{i:02}{}", "y".repeat(200))).unwrap();
            assert_eq!(libc::mkdirat(fd, c.as_ptr(), 0o755), 0);
            let nfd = libc::openat(fd, c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY);
            assert!(nfd >= 0);
            libc::close(fd);
            fd = nfd;
            depth += 1;
        }
        let leaf = CString::new("leaf").unwrap();
        let w = libc::openat(fd, leaf.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
        assert!(w >= 0);
        libc::close(w);
        libc::close(fd);
    }
    assert_eq!(depth, 25);
    let config = root.join("k.toml");
    let out = Command::new(common::kaiso_bin())
        .arg("adopt")
        .arg(&dir)
        .arg("--config")
        .arg(&config)
        .arg("--faster")
        .arg(format!("fast={}:16MiB", fast.display()))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let ok = out.status.success() && config.exists();
    let _ = fs::remove_dir_all(&root);
    assert!(
        ok,
        "kaiso adopt of a tree 25 levels of 203-byte names deep (~5 KB paths) must adopt it \
         (exit 0, config written): {}",
        text(&out)
    );
}

/// After `kill -9` of the daemon its mount stays behind, dead (ENOTCONN), and `kaiso
/// mount` of the same store on the same mountpoint is refused with "mountpoint … is busy:
/// something is already mounted there". The store's own lock shows no daemon serves it,
/// and the mount's source names this store's state directory: kaiso can detach its own
/// dead mount and mount again (what an operator restarting a crashed service needs).
#[test]
fn mount_after_kill9_replaces_the_dead_mount_of_the_same_store() {
    fuse_or_skip!();
    let store = Store::new("audit12-kill9", StoreSpec::tiers(2));
    store.seed(1, "f", b"kept");
    let m = store.mount();
    let pid = m.pid().expect("daemon pid") as libc::pid_t;
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(
        wait_for(Duration::from_secs(10), || {
            fs::metadata(&store.mountpoint)
                .err()
                .and_then(|e| e.raw_os_error())
                == Some(libc::ENOTCONN)
        }),
        "after kill -9 the mount should be dead (ENOTCONN)"
    );
    // The harness's mount helper would take the dead mount for a live one: start the
    // daemon here and wait until it serves f (or exits).
    let log = store.root.join("second-mount.log");
    let mut child = Command::new(common::kaiso_bin())
        .arg("mount")
        .arg(&store.config)
        .arg(&store.mountpoint)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&log).unwrap())
        .stderr(fs::File::create(store.root.join("second-mount.err")).unwrap())
        .spawn()
        .expect("spawn kaiso mount");
    let mut exited = None;
    let served = wait_for(Duration::from_secs(20), || {
        if let Ok(Some(st)) = child.try_wait() {
            exited = Some(st);
            return true;
        }
        fs::read(store.mountpoint.join("f")).is_ok_and(|d| d == b"kept")
    }) && exited.is_none();
    let err = fs::read_to_string(store.root.join("second-mount.err")).unwrap_or_default();
    if exited.is_none() {
        common::unmount_path(&store.mountpoint);
        if !wait_for(Duration::from_secs(10), || {
            matches!(child.try_wait(), Ok(Some(_)))
        }) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
    drop(m);
    assert!(
        served,
        "kaiso mount after kill -9 of the previous daemon must replace its dead mount and \
         serve the store within 20 s: exited {exited:?}, stderr: {err}"
    );
}

/// `kaiso unpin --help` offered `--tier` ("Target tier (default: one tier faster for
/// promote, slower for demote)") and `--no-wait`, which unpin ignores; `kaiso unpin
/// --tier fast PATH` was accepted. Expected: unpin lists only what it does, and
/// `pin`/`unpin`/`where`/`explain` describe their PATH, `-r` and `--config`.
#[test]
fn operator_command_help_matches_what_each_command_does() {
    let help = |cmd: &str| {
        let out = common::run_kaiso(&[cmd, "--help"]);
        assert!(out.status.success(), "kaiso {cmd} --help: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let unpin = help("unpin");
    let mut problems = Vec::new();
    for bad in ["--no-wait", "--tier", "Target tier"] {
        if unpin.contains(bad) {
            problems.push(format!("unpin --help offers {bad:?}"));
        }
    }
    let out = common::run_kaiso(&["unpin", "--tier", "fast", "/nonexistent"]);
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() != Some(2) || !err.contains("--tier") {
        problems.push(format!(
            "`kaiso unpin --tier fast PATH` must be a usage error naming --tier: {}",
            text(&out)
        ));
    }
    for cmd in ["pin", "unpin", "where", "explain", "promote", "demote"] {
        let h = help(cmd);
        for line in h.lines() {
            let t = line.trim();
            // An option or argument line with nothing after its name has no description.
            let undocumented =
                ["--config <CONFIG>", "-r, --recursive", "--json", "<PATH>"].contains(&t);
            if undocumented {
                problems.push(format!("kaiso {cmd} --help: {t:?} has no description"));
            }
        }
    }
    assert!(problems.is_empty(), "operator --help texts: {problems:#?}");
}
