//! Shared harness for the integration tests of the `kaiso` binary.
//!
//! It builds nothing itself: every test drives the real binary (`CARGO_BIN_EXE_kaiso`).
//! A [`Store`] is a temporary directory holding N tier directories, a TOML configuration
//! and a state directory; [`Store::mount`] starts `kaiso mount` in the background and
//! waits (bounded) for the FUSE mount to appear. Dropping a [`Mount`] or a [`Store`]
//! unmounts (fusermount3 -u, then a lazy umount), kills the daemon and removes the
//! directory, also when the test panics.
//!
//! Every test first calls [`fuse_or_skip!`]: the only reason to skip is a missing
//! /dev/fuse.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod audit;
pub mod migrate_daemon;
pub mod rng;

use std::ffi::CString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn kaiso_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_kaiso"))
}

/// Why FUSE tests cannot run here, if they cannot.
pub fn fuse_unavailable() -> Option<String> {
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is absent".into());
    }
    None
}

/// Skips the calling test (returning early) when /dev/fuse is absent.
#[macro_export]
macro_rules! fuse_or_skip {
    () => {
        if let Some(reason) = $crate::common::fuse_unavailable() {
            eprintln!("skipping: {reason}");
            return;
        }
    };
}

/// How long `kaiso mount` may take before the mount must be visible.
pub const MOUNT_TIMEOUT: Duration = Duration::from_secs(20);

/// One tier of a test store.
#[derive(Clone, Debug)]
pub struct TierSpec {
    pub name: String,
    /// Hard capacity limit in bytes; `None` leaves the store's default.
    pub capacity: Option<u64>,
    /// Watermarks as fractions of the capacity; `None` leaves the defaults.
    pub high_watermark: Option<f64>,
    pub low_watermark: Option<f64>,
    /// Emulated device (`hdd`, `ssd`, `nvm`, or a spec such as `hdd:seek_ms=4`).
    pub device: Option<String>,
}

impl TierSpec {
    pub fn new(name: &str) -> Self {
        TierSpec {
            name: name.into(),
            capacity: None,
            high_watermark: None,
            low_watermark: None,
            device: None,
        }
    }
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = Some(bytes);
        self
    }
    pub fn watermarks(mut self, low: f64, high: f64) -> Self {
        self.low_watermark = Some(low);
        self.high_watermark = Some(high);
        self
    }
    pub fn device(mut self, spec: &str) -> Self {
        self.device = Some(spec.into());
        self
    }
}

/// What a test store looks like.
#[derive(Clone, Debug)]
pub struct StoreSpec {
    pub tiers: Vec<TierSpec>,
    /// Let other users (e.g. `nobody`) into the mount: needed by permission tests.
    pub allow_other: bool,
    /// Extra TOML appended verbatim inside `[store]`.
    pub extra_toml: String,
    /// Planning interval of the background mover (`[store.mover] interval_ms`).
    pub mover_interval_ms: Option<u64>,
}

impl StoreSpec {
    /// `n` plain tiers named t0, t1, … without limits.
    pub fn tiers(n: usize) -> Self {
        StoreSpec {
            tiers: (0..n).map(|i| TierSpec::new(&format!("t{i}"))).collect(),
            allow_other: false,
            extra_toml: String::new(),
            mover_interval_ms: None,
        }
    }
    pub fn with_tiers(tiers: Vec<TierSpec>) -> Self {
        StoreSpec {
            tiers,
            allow_other: false,
            extra_toml: String::new(),
            mover_interval_ms: None,
        }
    }
    pub fn allow_other(mut self) -> Self {
        self.allow_other = true;
        self
    }
    pub fn mover_interval_ms(mut self, ms: u64) -> Self {
        self.mover_interval_ms = Some(ms);
        self
    }
    pub fn extra(mut self, toml: &str) -> Self {
        self.extra_toml.push_str(toml);
        self.extra_toml.push('\n');
        self
    }
}

/// The one place that knows kaiso's configuration format (crates/store/src/config.rs,
/// docs/tiering.md): a `[store]` table, optional `[store.mover]`, then `[[tier]]`s.
pub fn write_config(
    spec: &StoreSpec,
    state_dir: &Path,
    tier_dirs: &[PathBuf],
    config: &Path,
) -> io::Result<()> {
    fs::write(config, config_text(spec, state_dir, tier_dirs))
}

/// Capacity written for tiers the test leaves unlimited.
pub const UNLIMITED: u64 = 1 << 40;

pub fn config_text(spec: &StoreSpec, state_dir: &Path, tier_dirs: &[PathBuf]) -> String {
    let mut s = String::from("[store]\n");
    s.push_str(&format!(
        "state_dir = {}\n",
        toml_str(&state_dir.to_string_lossy())
    ));
    s.push_str(&format!("allow_other = {}\n", spec.allow_other));
    s.push_str(&spec.extra_toml);
    if let Some(ms) = spec.mover_interval_ms {
        s.push_str(&format!("\n[store.mover]\ninterval_ms = {ms}\n"));
    }
    for (tier, dir) in spec.tiers.iter().zip(tier_dirs) {
        s.push_str("\n[[tier]]\n");
        s.push_str(&format!("name = {}\n", toml_str(&tier.name)));
        s.push_str(&format!("path = {}\n", toml_str(&dir.to_string_lossy())));
        s.push_str(&format!(
            "capacity = {}\n",
            tier.capacity.unwrap_or(UNLIMITED)
        ));
        if let Some(h) = tier.high_watermark {
            s.push_str(&format!("high_watermark = {h}\n"));
        }
        if let Some(l) = tier.low_watermark {
            s.push_str(&format!("low_watermark = {l}\n"));
        }
        if let Some(d) = &tier.device {
            // "hdd" or "hdd:seek_ms=4,rpm=5400" → [tier.device] kind + params.
            let (kind, params) = d.split_once(':').unwrap_or((d, ""));
            s.push_str(&format!("[tier.device]\nkind = {}\n", toml_str(kind)));
            for kv in params.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, v)) = kv.split_once('=') {
                    s.push_str(&format!("{k} = {v}\n"));
                }
            }
        }
    }
    s
}

fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A scratch directory outside any store (a migration's source, say), removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        Scratch(temp_dir(tag))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A fresh, world-traversable temporary directory (nobody must be able to reach the
/// mount points and plain directories inside it).
pub fn temp_dir(tag: &str) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "kaiso-test-{tag}-{}-{n}-{nanos:x}",
        std::process::id()
    ));
    fs::create_dir_all(&dir).expect("create temp dir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    dir
}

/// A temporary store: tier directories, configuration and state directory.
pub struct Store {
    pub root: PathBuf,
    pub tiers: Vec<PathBuf>,
    pub state: PathBuf,
    pub config: PathBuf,
    pub mountpoint: PathBuf,
    pub spec: StoreSpec,
}

impl Store {
    pub fn new(tag: &str, spec: StoreSpec) -> Store {
        let root = temp_dir(tag);
        let tiers: Vec<PathBuf> = spec
            .tiers
            .iter()
            .map(|t| root.join(format!("tier-{}", t.name)))
            .collect();
        for t in &tiers {
            fs::create_dir_all(t).expect("create tier dir");
            fs::set_permissions(t, fs::Permissions::from_mode(0o755)).expect("chmod tier");
        }
        let state = root.join("state");
        fs::create_dir_all(&state).expect("create state dir");
        let mountpoint = root.join("mnt");
        fs::create_dir_all(&mountpoint).expect("create mountpoint");
        fs::set_permissions(&mountpoint, fs::Permissions::from_mode(0o755)).expect("chmod mnt");
        let config = root.join("kaiso.toml");
        write_config(&spec, &state, &tiers, &config).expect("write config");
        Store {
            root,
            tiers,
            state,
            config,
            mountpoint,
            spec,
        }
    }

    /// Writes a file directly into tier `tier` (before mounting: kaiso adopts it).
    pub fn seed(&self, tier: usize, rel: &str, data: &[u8]) {
        let p = self.tiers[tier].join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("seed parent");
        }
        fs::write(&p, data).expect("seed file");
    }

    /// Mounts at the store's mountpoint and waits for the mount to appear.
    pub fn mount(&self) -> Mount {
        self.mount_at(&self.mountpoint)
    }

    pub fn mount_at(&self, mountpoint: &Path) -> Mount {
        match self.try_mount_at(mountpoint) {
            Ok(m) => m,
            Err(e) => panic!("kaiso mount failed: {e}"),
        }
    }

    /// Starts `kaiso mount`; Err carries the daemon's exit status and stderr when it
    /// exits or the mount does not appear within [`MOUNT_TIMEOUT`].
    pub fn try_mount_at(&self, mountpoint: &Path) -> Result<Mount, String> {
        let log = self.root.join(format!(
            "mount-{}.log",
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let logf = fs::File::create(&log).map_err(|e| e.to_string())?;
        let child = Command::new(kaiso_bin())
            .arg("mount")
            .arg(&self.config)
            .arg(mountpoint)
            .env(
                "KAISO_LOG",
                std::env::var("KAISO_LOG").unwrap_or("warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(logf.try_clone().map_err(|e| e.to_string())?)
            .stderr(logf)
            .spawn()
            .map_err(|e| format!("spawn kaiso: {e}"))?;
        let mut mount = Mount {
            child: Some(child),
            path: mountpoint.to_path_buf(),
            log,
        };
        let deadline = Instant::now() + MOUNT_TIMEOUT;
        loop {
            if is_mounted(mountpoint) {
                return Ok(mount);
            }
            if let Some(status) = mount
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                mount.child = None;
                return Err(format!(
                    "kaiso mount exited ({status}) before mounting:\n{}",
                    mount.log_text()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "mount did not appear within {MOUNT_TIMEOUT:?}:\n{}",
                    mount.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs a `kaiso` subcommand with `--config`-free arguments as given.
    pub fn kaiso(&self, args: &[&str]) -> Output {
        run_kaiso(args)
    }

    /// Relative paths of regular files and symlinks on each tier (ignoring kaiso's own
    /// hidden bookkeeping entries, which start with `.kaiso`).
    pub fn files_per_tier(&self) -> Vec<Vec<String>> {
        self.tiers
            .iter()
            .map(|t| {
                let mut out = Vec::new();
                walk_files(t, t, &mut out);
                out.sort();
                out
            })
            .collect()
    }

    /// Which tiers hold the file `rel` (for placement assertions).
    pub fn tiers_holding(&self, rel: &str) -> Vec<usize> {
        self.tiers
            .iter()
            .enumerate()
            .filter(|(_, t)| t.join(rel).symlink_metadata().is_ok())
            .map(|(i, _)| i)
            .collect()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        cleanup_mounts_under(&self.root);
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn walk_files(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let name = e.file_name();
        if name.as_bytes().starts_with(b".kaiso") {
            continue;
        }
        let p = e.path();
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk_files(base, &p, out);
        } else {
            out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
        }
    }
}

/// Runs the kaiso binary and returns its output.
pub fn run_kaiso(args: &[&str]) -> Output {
    Command::new(kaiso_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kaiso")
}

/// A running `kaiso mount`.
pub struct Mount {
    child: Option<Child>,
    pub path: PathBuf,
    pub log: PathBuf,
}

impl Mount {
    pub fn log_text(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Is the daemon still running?
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Clean unmount: fusermount3 -u, then wait (bounded) for the daemon to exit.
    /// Returns the daemon's exit status.
    pub fn unmount(mut self) -> ExitStatus {
        let status = unmount_path(&self.path);
        assert!(
            status,
            "unmounting {} failed (busy?); log:\n{}",
            self.path.display(),
            self.log_text()
        );
        let child = self.child.take().expect("daemon handle");
        wait_bounded(child, Duration::from_secs(20), &self.log)
    }

    /// Waits (bounded) for a daemon that unmounts by itself (e.g. after SIGTERM).
    pub fn unmount_after_exit(mut self) -> ExitStatus {
        let child = self.child.take().expect("daemon handle");
        wait_bounded(child, Duration::from_secs(20), &self.log)
    }

    /// kill -9 the daemon and detach the dead mount, as after a crash.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        force_unmount(&self.path);
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.child.is_none() && !is_mounted(&self.path) {
            return;
        }
        if is_mounted(&self.path) && !unmount_path(&self.path) {
            force_unmount(&self.path);
        }
        if let Some(c) = self.child.take() {
            let _ = wait_bounded(c, Duration::from_secs(10), &self.log);
        }
    }
}

fn wait_bounded(mut child: Child, limit: Duration, log: &Path) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return s;
        }
        if Instant::now() > deadline {
            eprintln!(
                "kaiso daemon did not exit within {limit:?} after unmount; killing it (log {})",
                log.display()
            );
            let _ = child.kill();
            return child.wait().expect("wait daemon");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// fusermount3 -u; true if the path is no longer a mount point afterwards.
pub fn unmount_path(path: &Path) -> bool {
    for _ in 0..50 {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(path)
            .stderr(Stdio::null())
            .status();
        if !is_mounted(path) {
            return true;
        }
        // Busy: a test thread may still be closing a file.
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Lazy unmount as the last resort (dead daemon, busy mount).
pub fn force_unmount(path: &Path) {
    let _ = Command::new("fusermount3")
        .arg("-uz")
        .arg(path)
        .stderr(Stdio::null())
        .status();
    if is_mounted(path) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(path)
            .stderr(Stdio::null())
            .status();
    }
}

/// Mount points from /proc/self/mountinfo (octal escapes decoded).
pub fn mount_points() -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .collect()
}

fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 4 <= b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn is_mounted(path: &Path) -> bool {
    let want = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    mount_points().iter().any(|m| *m == want || m == path)
}

/// Unmounts every mount at or below `root` (deepest first).
pub fn cleanup_mounts_under(root: &Path) {
    let mut mine: Vec<PathBuf> = mount_points()
        .into_iter()
        .filter(|m| m.starts_with(root))
        .collect();
    mine.sort_by_key(|m| std::cmp::Reverse(m.as_os_str().len()));
    for m in mine {
        if !unmount_path_once(&m) {
            force_unmount(&m);
        }
    }
}

fn unmount_path_once(path: &Path) -> bool {
    let _ = Command::new("fusermount3")
        .arg("-u")
        .arg(path)
        .stderr(Stdio::null())
        .status();
    if is_mounted(path) {
        let _ = Command::new("umount")
            .arg(path)
            .stderr(Stdio::null())
            .status();
    }
    !is_mounted(path)
}

// ---------------------------------------------------------------------------------------
// Small libc helpers shared by the suites.

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

/// The value of xattr `name` of `p` (not following a symlink), or the errno.
pub fn getxattr(p: &Path, name: &str) -> Result<Vec<u8>, i32> {
    let c = cstr(p);
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if r < 0 {
        return Err(errno());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// The calling thread's errno.
pub fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Symbolic name of an errno (for readable observations).
pub fn errno_name(e: i32) -> String {
    let name = match e {
        0 => "OK",
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ERANGE => "ERANGE",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOSYS => "ENOSYS",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOTCONN => "ENOTCONN",
        libc::ENXIO => "ENXIO",
        libc::ETXTBSY => "ETXTBSY",
        _ => return format!("errno{e}"),
    };
    name.to_string()
}

/// Result of a raw libc call: "OK" or the errno name.
pub fn rc(ret: libc::c_int) -> String {
    if ret < 0 {
        errno_name(errno())
    } else {
        "OK".into()
    }
}

/// Like [`rc`] for calls returning ssize_t/off_t.
pub fn rcl(ret: i64) -> String {
    if ret < 0 {
        errno_name(errno())
    } else {
        "OK".into()
    }
}

/// lstat a path; Err(errno name).
pub fn lstat(p: &Path) -> Result<libc::stat, String> {
    let c = cstr(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::lstat(c.as_ptr(), &mut st) } < 0 {
        Err(errno_name(errno()))
    } else {
        Ok(st)
    }
}

pub fn stat(p: &Path) -> Result<libc::stat, String> {
    let c = cstr(p);
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(c.as_ptr(), &mut st) } < 0 {
        Err(errno_name(errno()))
    } else {
        Ok(st)
    }
}

/// CRC-free content fingerprint used by crash tests: FNV-1a 64 over the bytes, plus the
/// length (collisions are irrelevant at this scale; any changed byte changes it).
pub fn fingerprint(data: &[u8]) -> (u64, u64) {
    let mut h: u64 = 0xcbf29ce484222325;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (data.len() as u64, h)
}

/// Relative path → (kind, mode, size, fingerprint or link target) of every entry under
/// `root`, sorted: a tree snapshot to compare before and after a crash.
pub fn tree_snapshot(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    snapshot_dir(root, root, &mut out);
    out.sort();
    out
}

fn snapshot_dir(base: &Path, dir: &Path, out: &mut Vec<String>) {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            out.push(format!("{}: readdir error {e}", dir.display()));
            return;
        }
    };
    for e in rd.flatten() {
        let p = e.path();
        let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
        let md = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) => {
                out.push(format!("{rel}: stat error {e}"));
                continue;
            }
        };
        let mode = md.permissions().mode() & 0o7777;
        if md.is_dir() {
            out.push(format!("{rel} dir {mode:o}"));
            snapshot_dir(base, &p, out);
        } else if md.file_type().is_symlink() {
            let t = fs::read_link(&p).map(|t| t.display().to_string());
            out.push(format!("{rel} symlink -> {t:?}"));
        } else {
            let fp = fs::read(&p).map(|d| fingerprint(&d));
            out.push(format!("{rel} file {mode:o} {fp:?}"));
        }
    }
}

/// Runs `f` on a fresh thread whose credentials are those of `nobody` (uid/gid 65534).
/// The raw set*id syscalls change only the calling thread, so the test process keeps root.
pub fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        unsafe {
            let none: [libc::gid_t; 0] = [];
            assert_eq!(libc::syscall(libc::SYS_setgroups, 0, none.as_ptr()), 0);
            assert_eq!(libc::syscall(libc::SYS_setresgid, 65534, 65534, 65534), 0);
            assert_eq!(libc::syscall(libc::SYS_setresuid, 65534, 65534, 65534), 0);
        }
        f()
    })
    .join()
    .expect("nobody thread panicked")
}

/// Stops process `pid` with SIGSTOP and waits (at most 10 s) until every one of its
/// threads is in group stop. `kill` returns before that: the stop takes effect as each
/// thread is next scheduled, and on a busy machine a FUSE or NFS server can still read
/// and answer a request meanwhile (a test then sees an answer from a "stopped" server,
/// or a client blocked on a request the server read just before stopping).
pub fn sigstop_all_threads(pid: i32) {
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGSTOP) },
        0,
        "kill -STOP {pid}"
    );
    let start = std::time::Instant::now();
    loop {
        let tasks = fs::read_dir(format!("/proc/{pid}/task")).expect("threads of a process");
        let running: Vec<char> = tasks
            .filter_map(|t| fs::read_to_string(t.ok()?.path().join("stat")).ok())
            // The state follows the parenthesised command name, which may hold spaces.
            .filter_map(|stat| stat[stat.rfind(')')? + 2..].chars().next())
            .filter(|state| *state != 'T')
            .collect();
        if running.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "threads of {pid} not stopped within 10 s of SIGSTOP: states {running:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// `renameat2(a, b, RENAME_EXCHANGE)`.
pub fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    let (a, b) = (
        CString::new(a.as_os_str().as_bytes()).unwrap(),
        CString::new(b.as_os_str().as_bytes()).unwrap(),
    );
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Uses up every free inode of the file system mounted at `mnt` (in `mnt/filler`).
pub fn fill_inodes(mnt: &Path) {
    let filler = mnt.join("filler");
    fs::create_dir(&filler).unwrap();
    let mut made = 0u32;
    loop {
        match fs::File::create(filler.join(format!("i{made}"))) {
            Ok(_) => made += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(e) => panic!("filling inodes: {e}"),
        }
        assert!(
            made < 100_000,
            "the small file system never ran out of inodes"
        );
    }
}
