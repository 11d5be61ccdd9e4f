//! `kaiso mount`, `kaiso adopt`, `kaiso fsck`.

use anyhow::{Context, bail};
use kaiso_store::{Store, StoreConfig, TierConfig};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(clap::Args)]
pub struct MountArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Where to present the union namespace.
    pub mountpoint: PathBuf,
    /// FUSE worker threads (1 to 1024; each holds a /dev/fuse descriptor of its own).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Never use kernel passthrough, even when the configuration allows it.
    #[arg(long)]
    pub no_passthrough: bool,
    /// How long the kernel caches attributes and names, in milliseconds (negative entries:
    /// at most 1 s). kaiso is the only writer of its tiers, so this can be long; changes
    /// made directly in a tier directory while mounted show after at most this long.
    #[arg(long, default_value_t = kaiso_fuse::DEFAULT_TTL.as_millis() as u64)]
    pub ttl_ms: u64,
    /// Longest busy-poll of /dev/fuse after a reply, in microseconds (0: never). While
    /// requests come in bursts the worker that reads next polls for the next one instead
    /// of sleeping, which saves a thread wake-up per request; the window adapts to the
    /// gaps between requests and closes when they are sparse, so an idle mount costs
    /// no CPU, and nobody polls while other tasks wait for a CPU
    /// (KAISO_FUSE_POLL_UNDER_LOAD=1 polls anyway). At most 1000: a longer window would
    /// count requests a few milliseconds apart as a burst and keep a CPU spinning between
    /// them.
    #[arg(long, default_value_t = kaiso_fuse::busy_poll::DEFAULT_MAX.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub busy_poll_us: u64,
    /// Move the reading FUSE worker to the CPU of the process sending the requests while
    /// one caller dominates them (experimental, off by default; KAISO_FUSE_FOLLOW=1 does
    /// the same). It gives the CPU back when callers spread over CPUs, requests are
    /// sparse, the worker waits for its CPU or a request runs long.
    #[arg(long, conflicts_with = "no_follow_caller_cpu")]
    pub follow_caller_cpu: bool,
    /// Never move the reading FUSE worker to its caller's CPU (KAISO_FUSE_FOLLOW=0).
    #[arg(long)]
    pub no_follow_caller_cpu: bool,
}

#[derive(clap::Args)]
pub struct AdoptArgs {
    /// Existing directory to take in place as a tier (nothing is copied).
    pub dir: PathBuf,
    /// Configuration to create, or to extend with DIR as its slowest tier.
    #[arg(long)]
    pub config: PathBuf,
    /// Tier name for DIR (default: its directory name).
    #[arg(long)]
    pub name: Option<String>,
    /// Capacity of DIR's tier (default: the size of its file system).
    #[arg(long)]
    pub capacity: Option<String>,
    /// State directory for a new configuration (default: next to the config, `<stem>.state`).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Faster tiers to put in front of DIR in a new configuration: NAME=PATH:SIZE (repeat).
    #[arg(long = "faster", value_name = "NAME=PATH:SIZE")]
    pub faster: Vec<String>,
    /// Adopt even when paths in DIR also exist on another tier: kaiso then keeps the
    /// faster tier's copy visible and renames DIR's to `NAME.kaiso-conflict-TIER`.
    #[arg(long)]
    pub rename_conflicts: bool,
}

#[derive(clap::Args)]
pub struct FsckArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Catch SIGINT/SIGTERM/SIGHUP so the caller can clean up; returns the "signalled" flag.
pub(crate) fn catch_signals() -> &'static AtomicBool {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGHUP, handler);
    }
    &SIGNALLED
}

pub(crate) fn load_config(p: &Path) -> anyhow::Result<StoreConfig> {
    Ok(StoreConfig::from_toml_file(p)?)
}

/// How long a mount waits for the store's lock: `fusermount3 -u` returns before the
/// previous daemon has closed its store (about a second), so an immediate remount would
/// otherwise fail with "in use".
const PREVIOUS_DAEMON_EXIT: std::time::Duration = std::time::Duration::from_secs(3);

fn open_waiting_for_previous_daemon(
    cfg: kaiso_store::StoreConfig,
) -> anyhow::Result<std::sync::Arc<Store>> {
    let deadline = std::time::Instant::now() + PREVIOUS_DAEMON_EXIT;
    loop {
        match Store::open(cfg.clone()) {
            Err(kaiso_store::OpenError::Busy(_)) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            r => return Ok(r?),
        }
    }
}

/// Most FUSE worker threads a mount takes: one worker reads `/dev/fuse` and the others
/// stand by for requests that block, so a few suffice; each holds a cloned `/dev/fuse`
/// descriptor and a stack.
pub const MAX_THREADS: usize = 1024;

/// Descriptors a mount needs besides its workers' `/dev/fuse` clones (database, locks,
/// sockets, the backing files of passthrough and kaiso-served opens).
const OTHER_DESCRIPTORS: u64 = 256;

/// Checks `--threads` before anything is mounted: in range, and the open-file limit
/// leaves room for a descriptor per worker (raising the soft limit up to the hard one
/// when needed). Without this check a large count mounted, then failed in the session
/// with "Too many open files".
pub(crate) fn check_threads(threads: usize) -> anyhow::Result<()> {
    if !(1..=MAX_THREADS).contains(&threads) {
        bail!("--threads {threads}: give 1 to {MAX_THREADS} FUSE worker threads");
    }
    let need = threads as u64 + OTHER_DESCRIPTORS;
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 || rl.rlim_cur >= need {
        return Ok(());
    }
    if rl.rlim_max >= need {
        let raised = libc::rlimit {
            rlim_cur: need,
            rlim_max: rl.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return Ok(());
        }
    }
    bail!(
        "--threads {threads}: needs about {need} open files, but the limit is {} \
         (hard limit {}); raise it (ulimit -n) or give fewer threads",
        rl.rlim_cur,
        rl.rlim_max
    )
}

/// Refuses a mountpoint that is a tier or state directory, lies inside one or contains
/// one: kaiso reaches them by path, so through its own mount once mounted, and the first
/// access there waits on itself (a hang not even SIGKILL ends).
pub(crate) fn check_mountpoint_apart(cfg: &StoreConfig, mountpoint: &Path) -> anyhow::Result<()> {
    let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mp = canon(mountpoint);
    let dirs = cfg
        .tiers
        .iter()
        .map(|t| (format!("tier {}", t.name), &t.path));
    for (what, dir) in dirs.chain([("state_dir".to_string(), &cfg.state_dir)]) {
        let d = canon(dir);
        let how = if mp == d {
            "is"
        } else if mp.starts_with(&d) {
            "lies inside"
        } else if d.starts_with(&mp) {
            "contains"
        } else {
            continue;
        };
        bail!(
            "mountpoint {} {how} the directory of {what} ({}): kaiso reaches that \
             directory by path, so it would wait on its own mount; mount it elsewhere",
            mountpoint.display(),
            dir.display()
        );
    }
    Ok(())
}

/// A client still holds a file or its working directory on the mount, so the unmount at
/// SIGTERM is refused (EBUSY): the mount is detached lazily instead, so that the mount
/// point is free for the next mount or `start` (before, a dead mount stayed there, `Transport
/// endpoint is not connected`, and the next one refused the busy mount point until
/// the administrator unmounted it by hand). The client's open files and working directory
/// there fail from now on (ENOTCONN), as with any FUSE daemon that stopped. Found by the
/// session-11 audit.
pub(crate) fn detach_busy_mount(mp: &Path, busy: std::io::Error) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mp.as_os_str().as_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    let detached = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0
        // Not root: the setuid helper can detach a user's FUSE mount.
        || std::process::Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mp)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !detached {
        return Err(busy);
    }
    eprintln!(
        "kaiso: {} was still in use by a client: detached lazily (what the client still has open there stops working)",
        mp.display()
    );
    Ok(())
}

/// After `kill -9` of a daemon its mount stays behind, dead (every call on it fails with
/// ENOTCONN), and the next `kaiso mount` called the mountpoint busy (session 12). A dead
/// mount whose source names this store's state directory is this store's own: it is
/// detached lazily. A live daemon's mount never answers ENOTCONN, and the store's lock,
/// taken next, still refuses while another process serves the store.
fn detach_dead_mount_of_this_store(cfg: &StoreConfig, mountpoint: &Path) {
    let dead = std::fs::symlink_metadata(mountpoint)
        .err()
        .and_then(|e| e.raw_os_error())
        == Some(libc::ENOTCONN);
    let (Some(parent), Some(name)) = (mountpoint.parent(), mountpoint.file_name()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let (true, Ok(parent)) = (dead, std::fs::canonicalize(parent)) else {
        return;
    };
    let mp = parent.join(name);
    let same = |a: &Path, b: &Path| {
        a == b || std::fs::canonicalize(a).ok() == std::fs::canonicalize(b).ok()
    };
    let ours = super::ops::kaiso_mounts()
        .iter()
        .any(|m| m.mountpoint == mp && same(&m.state_dir, &cfg.state_dir));
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path.
    if ours
        && (unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0
            || std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(&mp)
                .status()
                .is_ok_and(|s| s.success()))
    {
        eprintln!(
            "kaiso: {} held a dead mount of this store (its daemon was killed): detached it",
            mountpoint.display()
        );
    }
}

pub fn mount(a: MountArgs) -> anyhow::Result<()> {
    check_threads(a.threads)?;
    let cfg = load_config(&a.config)?;
    super::migrate::refuse_if_migrating(
        &cfg.state_dir,
        &a.config,
        &format!("--mount {}", a.mountpoint.display()),
    )?;
    detach_dead_mount_of_this_store(&cfg, &a.mountpoint);
    kaiso_fuse::preflight(&a.mountpoint)?;
    check_mountpoint_apart(&cfg, &a.mountpoint)?;
    // kaiso sets every mode explicitly; the process umask must not interfere.
    unsafe { libc::umask(0) };
    let store = open_waiting_for_previous_daemon(cfg)?;
    let _background = store.start_background();
    let sock =
        kaiso_store::control::serve(store.clone()).context("cannot start the control socket")?;
    if let Some(addr) = &store.config().metrics {
        let bound = kaiso_store::metrics::serve(store.clone(), addr)
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        eprintln!("kaiso: metrics on http://{bound}/metrics");
    }
    // Every option is listed (no `..default()`): a new one must be given its flag here.
    let opts = kaiso_fuse::MountOptions {
        allow_other: store.config().allow_other,
        threads: a.threads,
        passthrough: !a.no_passthrough,
        ttl: Duration::from_millis(a.ttl_ms),
        busy_poll: kaiso_fuse::BusyPoll {
            max: Duration::from_micros(a.busy_poll_us),
            ..Default::default()
        },
        follow: kaiso_fuse::FollowCaller {
            enabled: if a.follow_caller_cpu {
                true
            } else if a.no_follow_caller_cpu {
                false
            } else {
                kaiso_fuse::FollowCaller::default().enabled
            },
            ..kaiso_fuse::FollowCaller::default()
        },
    };
    let signalled = catch_signals();
    let mounted = kaiso_fuse::mount(store.clone(), &a.mountpoint, &opts)?;
    println!(
        "kaiso: mounted {} on {}",
        a.config.display(),
        a.mountpoint.display()
    );
    tracing::info!(mountpoint = %a.mountpoint.display(), socket = %sock.display(), "mounted");
    while !signalled.load(Ordering::SeqCst) && !mounted.finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = match mounted.unmount() {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => detach_busy_mount(&a.mountpoint, e),
        r => r,
    };
    store.shutdown();
    let _ = std::fs::remove_file(&sock);
    // The error is the session's (a worker's) or the unmount's.
    r.with_context(|| format!("FUSE session on {}", a.mountpoint.display()))?;
    eprintln!("kaiso: unmounted {}", a.mountpoint.display());
    Ok(())
}

fn fs_size(p: &Path) -> anyhow::Result<u64> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        bail!(
            "cannot statfs {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(sv.f_blocks * sv.f_frsize)
}

fn tier_for(name: &str, path: &Path, capacity: Option<&str>) -> anyhow::Result<TierConfig> {
    let path =
        std::fs::canonicalize(path).with_context(|| format!("tier {name}: {}", path.display()))?;
    let capacity = match capacity {
        Some(c) => kaiso_store::config::parse_size_str(c)
            .map_err(|e| anyhow::anyhow!("tier {name}: capacity: {e}"))?,
        None => fs_size(&path)?,
    };
    Ok(TierConfig {
        name: name.into(),
        path,
        capacity,
        high_watermark: 0.9,
        low_watermark: 0.7,
        device: None,
    })
}

/// Directories `adopt` created, removed again when it fails (deepest first; only while
/// still empty, so nothing anyone put there is lost).
#[derive(Default)]
struct CreatedDirs(Vec<PathBuf>);

impl CreatedDirs {
    /// `create_dir_all`, remembering every directory it made.
    fn create(&mut self, p: &Path) -> std::io::Result<()> {
        let mut missing = Vec::new();
        let mut cur = Some(p);
        while let Some(c) = cur {
            if c.as_os_str().is_empty() || c.exists() {
                break;
            }
            missing.push(c.to_path_buf());
            cur = c.parent();
        }
        std::fs::create_dir_all(p)?;
        self.0.extend(missing.into_iter().rev());
        Ok(())
    }

    fn remove(&mut self) {
        for d in self.0.drain(..).rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The new configuration text, and the directories made for it (faster tiers').
fn adopt_text(a: &AdoptArgs, tier: &TierConfig, made: &mut CreatedDirs) -> anyhow::Result<String> {
    if a.config.exists() {
        if !a.faster.is_empty() || a.state_dir.is_some() {
            bail!(
                "{} exists: --faster/--state-dir only apply when creating a configuration",
                a.config.display()
            );
        }
        let cfg = load_config(&a.config)?;
        if let Some(t) = cfg.tiers.iter().find(|t| t.name == tier.name) {
            bail!(
                "{} already has a tier named {} ({}): give --name",
                a.config.display(),
                t.name,
                t.path.display()
            );
        }
        // Appended as it is, so the operator's comments and layout stay.
        let old = std::fs::read_to_string(&a.config)
            .with_context(|| format!("cannot read {}", a.config.display()))?;
        let sep = if old.ends_with('\n') || old.is_empty() {
            "\n"
        } else {
            "\n\n"
        };
        return Ok(format!("{old}{sep}{}", tier.to_toml()));
    }
    let stem = a
        .config
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kaiso".into());
    let base = a
        .config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let state_dir = std::path::absolute(
        a.state_dir
            .clone()
            .unwrap_or_else(|| base.join(format!("{stem}.state"))),
    )?;
    let mut text = format!(
        "[store]\nstate_dir = {}\n",
        kaiso_store::config::toml_quote(state_dir.to_str().ok_or_else(|| anyhow::anyhow!(
            "state directory {}: a configuration path must be UTF-8",
            state_dir.display()
        ))?)
    );
    for f in &a.faster {
        let bad = || anyhow::anyhow!("--faster {f:?}: expected NAME=PATH:SIZE");
        let (n, rest) = f.split_once('=').ok_or_else(bad)?;
        let (p, size) = rest.rsplit_once(':').ok_or_else(bad)?;
        made.create(Path::new(p))
            .with_context(|| format!("tier {n}: {p}"))?;
        text.push('\n');
        text.push_str(&tier_for(n, Path::new(p), Some(size))?.to_toml());
    }
    text.push('\n');
    text.push_str(&tier.to_toml());
    Ok(text)
}

/// Paths under `dir` that another tier also has (other than a directory on both), which
/// the store's scan would resolve by renaming the slower copy: how many, and the first
/// with the tier that has it. The walk goes from directory descriptors (`openat`), so
/// trees deeper than PATH_MAX are checked too (session 12: `read_dir` of the joined path
/// failed with "File name too long" and adopt refused such trees).
fn conflicts(
    dir: &Path,
    others: &[TierConfig],
) -> anyhow::Result<(u64, Option<(PathBuf, String)>)> {
    let root = open_dir(None, dir.as_os_str())
        .with_context(|| format!("cannot list {}", dir.display()))?;
    let other_roots: Vec<Option<std::os::fd::OwnedFd>> = others
        .iter()
        .map(|t| open_dir(None, t.path.as_os_str()).ok())
        .collect();
    let mut found = (0, None);
    conflicts_below(
        dir,
        &root,
        others,
        &other_roots,
        &mut PathBuf::new(),
        &mut found,
    )?;
    Ok(found)
}

/// `openat(O_DIRECTORY | O_NOFOLLOW)` of `name` in `at` (None: a path from the cwd).
fn open_dir(
    at: Option<&std::os::fd::OwnedFd>,
    name: &std::ffi::OsStr,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let c = std::ffi::CString::new(name.as_encoded_bytes())?;
    let at = at.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid NUL-terminated name; the descriptor returned is ours to own.
    let fd = unsafe { libc::openat(at, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// One directory of [`conflicts`]: `here` is `dir/rel`, `other_dirs[i]` the same
/// directory on `others[i]` (None where that tier has no such directory).
fn conflicts_below(
    dir: &Path,
    here: &std::os::fd::OwnedFd,
    others: &[TierConfig],
    other_dirs: &[Option<std::os::fd::OwnedFd>],
    rel: &mut PathBuf,
    found: &mut (u64, Option<(PathBuf, String)>),
) -> anyhow::Result<()> {
    use std::os::fd::AsRawFd;
    let list = |rel: &Path| format!("cannot list {}", dir.join(rel).display());
    let entries = std::fs::read_dir(format!("/proc/self/fd/{}", here.as_raw_fd()))
        .with_context(|| list(rel))?;
    for e in entries {
        let e = e.with_context(|| list(rel))?;
        let name = e.file_name();
        if name.as_encoded_bytes().starts_with(b".kaiso-tmp") {
            continue;
        }
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let c = std::ffi::CString::new(name.as_encoded_bytes())?;
        let mut below = Vec::new();
        let mut counted = false;
        for (t, at) in others.iter().zip(other_dirs) {
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: a valid descriptor, NUL-terminated name and stat buffer.
            let there = at.as_ref().is_some_and(|at| unsafe {
                libc::fstatat(
                    at.as_raw_fd(),
                    c.as_ptr(),
                    &mut st,
                    libc::AT_SYMLINK_NOFOLLOW,
                ) == 0
            });
            let there_dir = there && st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if there && !(is_dir && there_dir) && !counted {
                counted = true;
                found.0 += 1;
                found
                    .1
                    .get_or_insert_with(|| (rel.join(&name), t.name.clone()));
            }
            if is_dir {
                below.push(if there_dir {
                    open_dir(at.as_ref(), &name).ok()
                } else {
                    None
                });
            }
        }
        if is_dir {
            rel.push(&name);
            let sub = open_dir(Some(here), &name).with_context(|| list(rel))?;
            conflicts_below(dir, &sub, others, &below, rel, found)?;
            rel.pop();
        }
    }
    Ok(())
}

/// Replaces `path` by `text` atomically: a temporary file next to it (mode of the old
/// file), fsynced, renamed over it, and the directory fsynced.
struct PendingConfig {
    tmp: PathBuf,
    path: PathBuf,
    /// Renamed into place: nothing left to remove.
    committed: bool,
}

impl PendingConfig {
    fn write(path: &Path, text: &str) -> anyhow::Result<PendingConfig> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        // A configuration reached through a symlink is replaced where it really is.
        let real = std::fs::canonicalize(path).ok();
        let path = real.as_deref().unwrap_or(path);
        let name = path
            .file_name()
            .ok_or_else(|| anyhow::anyhow!("{}: not a file name", path.display()))?;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(".adopt-tmp");
        let tmp = path.with_file_name(tmp_name);
        let mode = std::fs::metadata(path)
            .map(|m| m.permissions().mode() & 0o7777)
            .unwrap_or(0o644);
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(&tmp)?;
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            std::io::Write::write_all(&mut f, text.as_bytes())?;
            f.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            bail!("cannot write {}: {e}", tmp.display());
        }
        Ok(PendingConfig {
            tmp,
            path: path.to_path_buf(),
            committed: false,
        })
    }

    fn commit(mut self) -> anyhow::Result<()> {
        std::fs::rename(&self.tmp, &self.path).with_context(|| {
            format!(
                "cannot rename {} to {}",
                self.tmp.display(),
                self.path.display()
            )
        })?;
        self.committed = true;
        let dir = self
            .path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", dir.display()))?;
        Ok(())
    }
}

impl Drop for PendingConfig {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// `kaiso adopt`: everything is checked and the store opened (which indexes DIR) with
/// the new configuration before the configuration file is replaced, atomically, as the
/// last step; on any failure the file is left exactly as it was.
pub fn adopt(a: AdoptArgs) -> anyhow::Result<()> {
    let mut made = CreatedDirs::default();
    let r = adopt_checked(&a, &mut made);
    if r.is_err() {
        made.remove();
    }
    r
}

fn adopt_checked(a: &AdoptArgs, made: &mut CreatedDirs) -> anyhow::Result<()> {
    if !a.dir.is_dir() {
        bail!("{} is not a directory", a.dir.display());
    }
    let name = a.name.clone().unwrap_or_else(|| {
        std::fs::canonicalize(&a.dir)
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "adopted".into())
    });
    let tier = tier_for(&name, &a.dir, a.capacity.as_deref())?;
    if tier.path.to_str().is_none() {
        bail!(
            "{}: a tier path must be UTF-8 to be written in a TOML configuration",
            tier.path.display()
        );
    }
    let text = adopt_text(a, &tier, made)?;
    let unchanged = || {
        if a.config.exists() {
            format!("{} is unchanged", a.config.display())
        } else {
            format!("{} was not created", a.config.display())
        }
    };
    // Validated as the file it will be (paths relative to its directory; tiers distinct).
    let cfg = StoreConfig::from_toml_text(&text, &a.config).map_err(|e| {
        anyhow::anyhow!(
            "{e} (in the configuration adopt would write; {})",
            unchanged()
        )
    })?;
    if kaiso_store::control::Client::connect(&cfg.state_dir).is_ok() {
        bail!(
            "the store of {} is in use by a running kaiso process (its control socket {} answers): unmount it first; {}",
            a.config.display(),
            kaiso_store::control::socket_path(&cfg.state_dir).display(),
            unchanged()
        );
    }
    super::migrate::refuse_if_migrating(&cfg.state_dir, &a.config, "--mount MOUNTPOINT")?;
    if !a.rename_conflicts {
        let others = &cfg.tiers[..cfg.tiers.len() - 1];
        let (n, first) = conflicts(&tier.path, others)?;
        if let Some((rel, other)) = first {
            bail!(
                "{n} paths in {} also exist on tier {other} (first: {}): the store would rename {}'s copies to NAME.kaiso-conflict-{}; move them first or give --rename-conflicts; {}",
                a.dir.display(),
                rel.display(),
                a.dir.display(),
                tier.name,
                unchanged()
            );
        }
    }
    let state_existed = cfg.state_dir.exists();
    let pending = PendingConfig::write(&a.config, &text)?;
    let store = match Store::open(cfg.clone()) {
        Ok(s) => s,
        Err(e) => {
            if !state_existed {
                let _ = std::fs::remove_dir_all(&cfg.state_dir);
            }
            bail!("{e}; {}", unchanged());
        }
    };
    let report = store.fsck();
    let committed = match &report {
        Ok(_) => pending.commit(),
        Err(_) => Ok(()),
    };
    store.shutdown();
    drop(store);
    let report = report
        .map_err(|e| anyhow::anyhow!("indexing {}: {e}; {}", a.dir.display(), unchanged()))?;
    committed?;
    println!(
        "kaiso: adopted {} as tier {name} in {} (nothing copied; the store now indexes {} files, {} directories)",
        a.dir.display(),
        a.config.display(),
        report.files_seen,
        report.dirs_seen
    );
    if report.conflicts > 0 {
        println!(
            "kaiso: {} paths were on two tiers: the slower copies were renamed NAME.kaiso-conflict-TIER",
            report.conflicts
        );
    }
    println!(
        "mount it with: kaiso mount {} MOUNTPOINT",
        a.config.display()
    );
    Ok(())
}

pub fn fsck(a: FsckArgs) -> anyhow::Result<()> {
    let cfg = load_config(&a.config)?;
    let report: kaiso_store::FsckReport =
        match kaiso_store::control::Client::connect(&cfg.state_dir) {
            Ok(mut c) => serde_json::from_value(c.call(&kaiso_store::control::Request::Fsck)?)?,
            Err(_) => {
                let store = Store::open(cfg)?;
                let r = store.fsck()?;
                store.shutdown();
                r
            }
        };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("files seen:          {}", report.files_seen);
    println!("directories seen:    {}", report.dirs_seen);
    println!("adopted (new files): {}", report.adopted);
    println!("stale records:       {}", report.dropped);
    println!("conflicts renamed:   {}", report.conflicts);
    println!("journal recovered:   {}", report.journal_recovered);
    println!("temp files removed:  {}", report.temp_removed);
    for (t, u) in &report.used {
        println!("tier {t}: {u} bytes");
    }
    Ok(())
}
