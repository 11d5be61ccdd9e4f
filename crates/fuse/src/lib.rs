//! FUSE face: a thin adapter from fuser to the kaiso store.
//!
//! [`KaisoFs`] maps each FUSE request to one [`kaiso_store::Store`] method; [`mount`] checks
//! the environment first so the usual failures (no /dev/fuse, busy mountpoint) come back as
//! one-line errors instead of a panic or an opaque errno.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

pub mod busy_poll;
#[cfg(test)]
mod copy_tests;
pub mod follow;
mod fs;
pub mod gate;

pub use busy_poll::BusyPoll;
pub use follow::{FollowCaller, FollowStats};
pub use fs::{FaceStats, INIT_FLAGS, KaisoFs, negative_attr};
pub use gate::{PollStats, WorkerGate};

use kaiso_store::Store;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How to mount. Build it from [`MountOptions::default`] with the fields you set
/// (`MountOptions { threads: 8, ..MountOptions::default() }`), so new fields keep callers
/// compiling.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// Let other users than the mounter use the mount (`allow_other`).
    pub allow_other: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// Ask the kernel for passthrough of resident files (falls back cleanly if refused).
    pub passthrough: bool,
    /// How long the kernel may cache attributes and names it was given. kaiso is the only
    /// writer of its tiers and inode numbers survive moves, so a long time is safe; changes
    /// made directly in a tier directory while mounted show after at most this long.
    pub ttl: std::time::Duration,
    /// Busy-polling of `/dev/fuse` between the requests of a burst (see [`busy_poll`]).
    pub busy_poll: BusyPoll,
    /// Whether the reading worker follows the CPU of a dominant caller (see [`follow`]).
    pub follow: FollowCaller,
}

impl MountOptions {
    /// How long the kernel may remember that a name does not exist: `ttl`, at most
    /// [`MAX_NEGATIVE_TTL`] (a name created directly in a tier directory, or by a migration
    /// filler, must not stay hidden long).
    pub fn negative_ttl(&self) -> std::time::Duration {
        self.ttl.min(MAX_NEGATIVE_TTL)
    }
}

/// Default attribute and entry cache time (see [`MountOptions::ttl`]).
pub const DEFAULT_TTL: std::time::Duration = std::time::Duration::from_secs(60);
/// Longest negative entry cache time (see [`MountOptions::negative_ttl`]).
pub const MAX_NEGATIVE_TTL: std::time::Duration = std::time::Duration::from_secs(1);

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            allow_other: false,
            threads: 4,
            passthrough: true,
            ttl: DEFAULT_TTL,
            busy_poll: BusyPoll::default(),
            follow: FollowCaller::default(),
        }
    }
}

/// A mount error, phrased for the operator.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error(
        "cannot open /dev/fuse: {0} (load the fuse module, or give the container --device /dev/fuse)"
    )]
    NoDevFuse(std::io::Error),
    #[error("mountpoint {0} does not exist")]
    NoMountpoint(PathBuf),
    #[error("mountpoint {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error(
        "mountpoint {0} is busy: something is already mounted there (unmount it first: fusermount3 -u {0})"
    )]
    Busy(PathBuf),
    #[error("cannot mount on {0}: {1}")]
    Mount(PathBuf, std::io::Error),
}

/// Whether `p` is currently a mount point (listed in /proc/self/mountinfo).
pub fn is_mountpoint(p: &Path) -> bool {
    let Ok(canon) = std::fs::canonicalize(p) else {
        return false;
    };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .map(unescape_mountinfo)
            .is_some_and(|m| Path::new(&m) == canon)
    })
}

fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v as char);
                i += 4;
                continue;
            }
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

/// Check the environment before mounting.
pub fn preflight(mountpoint: &Path) -> Result<(), MountError> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(MountError::NoDevFuse)?;
    match std::fs::metadata(mountpoint) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::Busy(mountpoint.to_path_buf()));
        }
        Err(_) => return Err(MountError::NoMountpoint(mountpoint.to_path_buf())),
        Ok(m) if !m.is_dir() => return Err(MountError::NotADirectory(mountpoint.to_path_buf())),
        Ok(_) => {}
    }
    if is_mountpoint(mountpoint) {
        return Err(MountError::Busy(mountpoint.to_path_buf()));
    }
    Ok(())
}

/// kaiso's fuser session settings (mount options, threads, `clone_fd`) under `fsname`.
pub fn session_config(fsname: String, opts: &MountOptions) -> fuser::Config {
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(fsname),
        fuser::MountOption::Subtype("kaiso".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::Dev,
        fuser::MountOption::Suid,
        fuser::MountOption::RW,
    ];
    if opts.allow_other {
        cfg.acl = fuser::SessionACL::All;
    }
    cfg.n_threads = Some(opts.threads.max(1));
    cfg.clone_fd = true;
    cfg
}

/// A mounted store. Dropping it unmounts.
pub struct Mounted {
    session: Option<fuser::BackgroundSession>,
    gate: WorkerGate,
    stats: Arc<FaceStats>,
    pub mountpoint: PathBuf,
}

impl Mounted {
    /// Whether the session ended (e.g. `fusermount3 -u` from outside).
    pub fn finished(&self) -> bool {
        self.session.as_ref().is_none_or(|s| s.guard.is_finished())
    }

    /// What the face has served so far (READ/WRITE requests, ESTALE answers, whether the
    /// kernel accepted passthrough). Valid once the kernel's INIT was answered, i.e. after
    /// the first request through the mount returned.
    pub fn stats(&self) -> &FaceStats {
        &self.stats
    }

    /// How the busy polls so far ended (see [`busy_poll`]).
    pub fn busy_polls(&self) -> PollStats {
        self.gate.poll_stats()
    }

    /// How following the caller's CPU went so far (see [`follow`]).
    pub fn follow_stats(&self) -> FollowStats {
        self.gate.follow_stats()
    }

    /// Unmount and wait for the worker threads.
    pub fn unmount(mut self) -> std::io::Result<()> {
        let p = self.gate.poll_stats();
        let f = self.gate.follow_stats();
        tracing::info!(
            busy_polls_caught = p.caught,
            busy_polls_missed = p.missed,
            busy_polls_gave_way = p.gave_way,
            busy_polls_held_for_others = p.held_for_others,
            follow_samples = f.samples,
            follow_pins = f.pins,
            follow_moves = f.moves,
            follow_released_spread = f.released_spread,
            follow_released_load = f.released_load,
            follow_released_sparse = f.released_sparse,
            follow_unpinned_by_watchdog = f.unpinned_by_watchdog,
            follow_max_run_delay_permille = f.max_run_delay_milli,
            "unmounting"
        );
        // Parked workers go back to reading, where they see the unmount.
        self.gate.close();
        let ended = match self.session.take() {
            // Unmounted from outside already: just collect the threads.
            Some(s) if s.guard.is_finished() => s.join(),
            Some(s) => s.umount_and_join(),
            None => Ok(()),
        };
        match ended {
            // A worker still reading when the connection went away may be told
            // ECONNABORTED instead of ENODEV (seen with 1,024 workers): the session ended
            // as on any unmount.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => {
                tracing::debug!("a FUSE worker saw the connection aborted at the unmount");
                Ok(())
            }
            r => r,
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            self.gate.close();
            let _ = s.umount_and_join();
        }
    }
}

/// Mount `store` on `mountpoint` in background threads; after a reply the worker that
/// reads next busy-polls `/dev/fuse` as `opts.busy_poll` says (see [`busy_poll`]).
pub fn mount(
    store: Arc<Store>,
    mountpoint: &Path,
    opts: &MountOptions,
) -> Result<Mounted, MountError> {
    preflight(mountpoint)?;
    let fsname = format!("kaiso:{}", store.config().state_dir.display());
    let cfg = session_config(fsname, opts);
    let fs = KaisoFs::new(store, opts);
    let gate = fs.gate();
    let stats = fs.stats();
    let failed = |e| {
        // No session will close the gate: stop its watchdog thread here.
        gate.close();
        MountError::Mount(mountpoint.to_path_buf(), e)
    };
    let session = fuser::Session::new(fs, mountpoint, &cfg).map_err(failed)?;
    // Every worker's cloned descriptor shares the session's request queue, so polling
    // this one tells whether a request waits.
    if let Err(e) = gate.attach_device(&session) {
        tracing::warn!(error = %e, "cannot duplicate /dev/fuse; the workers will not busy-poll");
    }
    let session = session.spawn().map_err(failed)?;
    Ok(Mounted {
        session: Some(session),
        gate,
        stats,
        mountpoint: mountpoint.to_path_buf(),
    })
}
