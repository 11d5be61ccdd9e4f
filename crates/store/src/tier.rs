//! One tier: a directory on some local file system, a hard capacity, watermarks, counters,
//! and an optional emulated device in front of its data path.

use crate::config::TierConfig;
use crate::emulate::Emulator;
pub(crate) use crate::longpath::BackingPath;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) struct Tier {
    pub cfg: TierConfig,
    pub root: PathBuf,
    /// Bytes of file data (apparent sizes) kaiso accounts to this tier.
    pub used: AtomicU64,
    /// Read/write requests served.
    pub accesses: AtomicU64,
    /// Foreground bytes moved through this tier's data path (for busy estimates).
    pub fg_bytes: AtomicU64,
    /// Bytes the mover copied from or to this tier (so a real device's load that is the
    /// mover's own is not taken for foreground load).
    pub mover_bytes: AtomicU64,
    pub emu: Option<Emulator>,
    /// A real (not emulated) tier's device load: where its busy time is read, the last
    /// sample.
    device: Mutex<DeviceLoad>,
    /// (time, busy) snapshot for utilisation estimates (emulated tiers).
    pub busy_snap: Mutex<(u64, u64)>,
    pub last_busy: Mutex<f64>,
    /// What `used` may reach before the tier's file system is really full, from the last
    /// [`Tier::refresh_fs_room`]; `u64::MAX` before the first sample or when the file
    /// system cannot tell.
    fs_limit: AtomicU64,
    /// Migration stubs placed on this tier, with the tier index they were placed on:
    /// their missing bytes are in `used` (a stub counts its listed size from its
    /// creation) but not yet on the file system (see [`Tier::stub_pending`]).
    stubs: Mutex<Vec<(std::sync::Weak<crate::handles::FileState>, u8)>>,
    /// Held shared by each stub creation (from taking its room to noting it) and each
    /// fetch (from its data write to its missing-set update), exclusively by
    /// [`Tier::refresh_fs_room`]: the sample sees the file system's room and the stubs'
    /// missing bytes at one consistent point.
    stub_change: std::sync::RwLock<()>,
    /// The root directory's identity when last sampled, and a descriptor of the directory
    /// kaiso uses as the root (see [`RootState`], [`Tier::check_root`]).
    root_state: Mutex<RootState>,
    /// Set when an operation found the path showing another directory than the one
    /// kaiso holds: the next [`Tier::check_root`] reports the root as returned (its tree is
    /// walked again) even if the original directory is back by then.
    rewalk: AtomicBool,
    /// False while the root directory is missing: nothing is placed or moved there.
    online: AtomicBool,
    /// When [`Tier::check_root`] found the root missing (None while online).
    offline_since: Mutex<Option<std::time::SystemTime>>,
    /// The part of `used` that is room held for moves in flight onto this tier: their
    /// copies are hidden temporary files no scan counts (see [`Tier::set_scanned_used`]).
    move_reserved: AtomicU64,
    /// Held while a move's reservation changes `used` and `move_reserved` together, and
    /// while a scan sets `used`: a scan never sees one without the other.
    usage: Mutex<()>,
}

/// A tier root's identity: (device, inode, mount id).
pub(crate) type RootId = (u64, u64, u64);

/// What the tier knows of its root directory.
struct RootState {
    /// The identity of the directory at the root path when last sampled; None while the
    /// root is missing.
    id: Option<RootId>,
    /// An `O_PATH` descriptor of the directory kaiso serves as the tier, with its
    /// identity. It reaches that directory's files while the path does not (the directory
    /// renamed away for a moment), so a name missing by path can be told apart from a file
    /// that is really gone ([`Tier::root_now`]). Reopened when another directory stands
    /// at the path.
    held: Option<(std::os::fd::OwnedFd, RootId)>,
    /// Counts the changes of `id`: a walk of the tree after a return publishes the tier
    /// online only if no change came after the one it walked ([`Tier::publish_online`]).
    generation: u64,
}

/// What [`Tier::root_now`] found at the root path, compared with the directory kaiso holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RootNow {
    /// The path shows the held directory.
    Held,
    /// No directory at the path: the tier is offline now. `first`: this call took it
    /// offline (the caller records the files it held).
    Missing { first: bool },
    /// Another directory stands at the path: the next [`Tier::check_root`] walks it.
    Other,
    /// kaiso holds no descriptor of the root (it could not open one): nothing to compare.
    Unknown,
}

/// What [`Tier::check_root`] found since the previous sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RootChange {
    /// Same directory as before (or still missing).
    Unchanged,
    /// The root directory is gone (renamed away, its file system unmounted from under a
    /// missing mountpoint directory).
    Vanished,
    /// A root directory is there again, or a different one now stands at the path (a
    /// file system mounted or unmounted there): its tree must be looked at again, and
    /// only then is the tier published online ([`Tier::publish_online`] with `generation`).
    Returned { generation: u64 },
}

/// Room taken on a tier by [`Tier::hold`]: given back on drop unless kept.
pub(crate) struct Held<'a> {
    tier: &'a Tier,
    bytes: u64,
}

impl Held<'_> {
    /// The room stays taken (the bytes now belong to a file's accounted size).
    pub(crate) fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.tier.add_used(-(self.bytes as i64));
    }
}

/// (device, inode, mount id) of the directory at `root`, following a symlink; None if
/// there is no directory there now. The mount id is the kernel's unique one (Linux 6.8+,
/// never reused; else the reusable one of 5.8+, else 0): a file system unmounted and
/// another mounted at the path can get the same device and root inode numbers (tmpfs,
/// other anonymous devices: `umount; mount -t tmpfs` gives the same pair again), and only
/// the mount tells them apart.
fn root_identity(root: &Path) -> Option<RootId> {
    let c = crate::util::cpath(root).ok()?;
    statx_identity(libc::AT_FDCWD, &c, 0)
}

/// The identity of the directory `fd` refers to (see [`root_identity`]).
fn fd_identity(fd: std::os::fd::BorrowedFd<'_>) -> Option<RootId> {
    use std::os::fd::AsRawFd;
    statx_identity(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

fn statx_identity(dirfd: libc::c_int, path: &std::ffi::CStr, flags: libc::c_int) -> Option<RootId> {
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID_UNIQUE;
    // SAFETY: a valid C string and out pointer.
    if unsafe { libc::statx(dirfd, path.as_ptr(), flags, mask, &mut stx) } != 0 {
        return None;
    }
    if u32::from(stx.stx_mode) & libc::S_IFMT != libc::S_IFDIR {
        return None;
    }
    let dev = libc::makedev(stx.stx_dev_major, stx.stx_dev_minor);
    let mnt = if stx.stx_mask & (libc::STATX_MNT_ID_UNIQUE | libc::STATX_MNT_ID) != 0 {
        stx.stx_mnt_id
    } else {
        0
    };
    Some((dev, stx.stx_ino, mnt))
}

/// An `O_PATH` descriptor of the directory at `root` and its identity, or None.
fn open_root(root: &Path) -> Option<(std::os::fd::OwnedFd, RootId)> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let c = crate::util::cpath(root).ok()?;
    // SAFETY: a valid C string; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: just opened, owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let id = fd_identity(fd.as_fd())?;
    Some((fd, id))
}

impl Tier {
    pub fn new(cfg: TierConfig) -> Result<Tier, String> {
        let emu = match &cfg.device {
            Some(d) => {
                Some(Emulator::new(d).map_err(|e| format!("tier {}: device: {e}", cfg.name))?)
            }
            None => None,
        };
        let device = DeviceLoad::new(match &emu {
            Some(_) => None,
            None => device_busy_ticks(&cfg.name, &cfg.path),
        });
        let cfg_root = cfg.path.clone();
        Ok(Tier {
            root: cfg.path.clone(),
            cfg,
            used: AtomicU64::new(0),
            accesses: AtomicU64::new(0),
            fg_bytes: AtomicU64::new(0),
            mover_bytes: AtomicU64::new(0),
            emu,
            device: Mutex::new(device),
            busy_snap: Mutex::new((0, 0)),
            last_busy: Mutex::new(0.0),
            fs_limit: AtomicU64::new(u64::MAX),
            stubs: Mutex::new(Vec::new()),
            stub_change: std::sync::RwLock::new(()),
            root_state: Mutex::new(RootState {
                id: root_identity(&cfg_root),
                held: open_root(&cfg_root),
                generation: 0,
            }),
            rewalk: AtomicBool::new(false),
            online: AtomicBool::new(true),
            offline_since: Mutex::new(None),
            move_reserved: AtomicU64::new(0),
            usage: Mutex::new(()),
        })
    }

    /// The backing path of a store-relative path on this tier, usable in any path-taking
    /// call whatever its length: a plain path when it is short (the common case, one
    /// syscall per use), else one through a descriptor of a deep ancestor that lives as
    /// long as the returned guard (see [`crate::longpath`]). Keep the guard while the
    /// path is used; never copy the path out of it.
    pub fn backing(&self, rel: &Path) -> BackingPath {
        BackingPath::resolve(&self.root, rel)
    }

    /// The full backing path as text for people (`kaiso where`): not for system calls,
    /// which may refuse it when it is longer than PATH_MAX.
    pub fn display_path(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    /// `mkdir -p` of `rel` on this tier, at any depth.
    pub fn create_dir_all(&self, rel: &Path) -> std::io::Result<()> {
        crate::longpath::create_dir_all(&self.root, rel)
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The hard limit in force: the configured capacity, or less when the tier's file
    /// system has less real room (the disk is smaller than configured, or other data
    /// fills it). Every room check (placement, spills, passthrough reserves, moves) and
    /// the watermarks go through it.
    pub fn capacity(&self) -> u64 {
        self.cfg.capacity.min(self.fs_limit.load(Ordering::Relaxed))
    }

    /// Sample the real free space of the tier's file system (statvfs `f_bavail`, the room
    /// an unprivileged writer has). `pending` is the part of `used` not yet written to the
    /// file system (room reserved for passthrough writers): it is room already promised,
    /// so it does not count twice; the missing bytes of migration stubs on the tier
    /// ([`Tier::stub_pending`]) are promised the same way. The store calls this every
    /// second and before each planning round; between samples the tier's own growth is
    /// counted through `used`.
    pub fn refresh_fs_room(&self, pending: u64) {
        let _quiet = self.stub_change.write().unwrap_or_else(|e| e.into_inner());
        let pending = pending.saturating_add(self.stub_pending());
        let limit = match fs_avail(&self.root) {
            Some(avail) => self.used().saturating_sub(pending).saturating_add(avail),
            None => u64::MAX,
        };
        self.fs_limit.store(limit, Ordering::Relaxed);
    }

    /// Room left under the hard capacity.
    pub fn free(&self) -> u64 {
        self.capacity().saturating_sub(self.used())
    }

    /// Whether `bytes` more fit below the hard capacity (never while the tier's root
    /// directory is missing: new files and moves go to the other tiers).
    pub fn fits(&self, bytes: u64) -> bool {
        self.online() && self.used().saturating_add(bytes) <= self.capacity()
    }

    /// Whether `bytes` more fit below the high watermark (the placement threshold).
    pub fn fits_below_high(&self, bytes: u64) -> bool {
        self.online()
            && (self.used().saturating_add(bytes) as f64)
                <= self.cfg.high_watermark * self.capacity() as f64
    }

    pub fn add_used(&self, delta: i64) {
        if delta >= 0 {
            self.used.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            let d = (-delta) as u64;
            let _ = self
                .used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                    Some(u.saturating_sub(d))
                });
        }
    }

    /// Set `used` after a walk of the tier counted `counted` bytes (file data, open files
    /// with no name, passthrough reserves): room held for moves in flight onto the tier is
    /// added, since their copies are hidden temporary files the walk leaves out. Called
    /// with the namespace lock held, which every move's switch takes too.
    pub(crate) fn set_scanned_used(&self, counted: u64) {
        let _u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        self.used.store(
            counted.saturating_add(self.move_reserved.load(Ordering::Acquire)),
            Ordering::Release,
        );
    }

    /// Take `bytes` below the hard capacity for a move onto this tier (see
    /// [`Tier::set_scanned_used`]); false if they do not fit.
    pub(crate) fn reserve_for_move(&self, bytes: u64) -> bool {
        let _u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let ok = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u.saturating_add(bytes) <= self.capacity()).then_some(u + bytes)
            })
            .is_ok();
        if ok {
            self.move_reserved.fetch_add(bytes, Ordering::AcqRel);
        }
        ok
    }

    /// Give back `bytes` of a move's reservation (it failed, or its copy came out
    /// smaller).
    pub(crate) fn unreserve_for_move(&self, bytes: u64) {
        let _u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        self.add_used(-(bytes as i64));
        self.sub_move_reserved(bytes);
    }

    /// A move's `bytes` now belong to its file on this tier: they stay in `used` and are
    /// no longer a reservation (under the namespace lock, with the switch).
    pub(crate) fn keep_move_reservation(&self, bytes: u64) {
        let _u = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        self.sub_move_reserved(bytes);
    }

    fn sub_move_reserved(&self, bytes: u64) {
        let _ = self
            .move_reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(bytes))
            });
    }

    /// Take `bytes` of room below the hard capacity (and only while the tier is online),
    /// in one atomic step: two creators cannot both pass the check on the last room.
    /// The room goes back when the returned hold is dropped, unless it is kept.
    pub(crate) fn hold(&self, bytes: u64) -> Option<Held<'_>> {
        if !self.online() {
            return None;
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&n| n <= self.capacity())
            })
            .ok()
            .map(|_| Held { tier: self, bytes })
    }

    /// Held while a stub's accounting changes (see `stub_change`).
    pub(crate) fn stub_change(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.stub_change.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Count stub file `state`, placed on this tier (index `index`), in
    /// [`Tier::stub_pending`] until it is complete, gone or moved.
    pub(crate) fn note_stub(&self, index: u8, state: &std::sync::Arc<crate::handles::FileState>) {
        self.stubs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((std::sync::Arc::downgrade(state), index));
    }

    /// Bytes of the stub files on this tier still to be fetched: counted in `used`
    /// (listed sizes), not yet written to the file system. Forgets stubs that completed,
    /// moved or went away. One pass over the outstanding stubs (each sample of
    /// [`Tier::refresh_fs_room`]).
    pub(crate) fn stub_pending(&self) -> u64 {
        let mut stubs = self.stubs.lock().unwrap_or_else(|e| e.into_inner());
        let mut total = 0u64;
        stubs.retain(|(w, index)| {
            let Some(st) = w.upgrade() else { return false };
            if st.tier() != *index {
                return false;
            }
            let stub = st.stub.lock().unwrap_or_else(|e| e.into_inner());
            match stub.as_ref() {
                Some(s) if !s.missing.is_empty() => {
                    let size = st.size.load(Ordering::Acquire);
                    let missing: u64 = s
                        .missing
                        .iter()
                        .map(|&(a, b)| b.min(size).saturating_sub(a))
                        .sum();
                    total = total.saturating_add(missing);
                    true
                }
                _ => false,
            }
        });
        total
    }

    /// Whether the root directory was there at the last [`Tier::check_root`].
    pub fn online(&self) -> bool {
        self.online.load(Ordering::Acquire)
    }

    /// Since when the root directory has been missing (None while the tier is online).
    pub fn offline_since(&self) -> Option<std::time::SystemTime> {
        *self.offline_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the root directory may have changed since the last [`Tier::check_root`]
    /// (one `stat`, the state not changed): the store takes its namespace lock before the
    /// check that records a change, so taking the tier offline and recording its files
    /// are one step for every observer.
    pub(crate) fn root_may_have_changed(&self) -> bool {
        let st = self.root_state.lock().unwrap_or_else(|e| e.into_inner());
        let now = root_identity(&self.root);
        st.id != now
            || self.rewalk.load(Ordering::Acquire)
            || (now.is_some() && st.held.as_ref().map(|h| h.1) != now)
    }

    /// Sample the root directory's presence and identity (one `stat`, under the root
    /// state's lock, so samples and their effects are ordered as the `stat`s were): the
    /// store calls this every 100 ms. A root that vanished is reported (the store then
    /// records the tier's files and takes it offline in one step,
    /// [`crate::store::Store::note_tier_vanished`]); one that is back, or replaced by
    /// another directory at the same path, is reported as returned: the caller walks its
    /// tree again and then publishes the tier online ([`Tier::publish_online`]).
    pub(crate) fn check_root(&self) -> RootChange {
        let mut st = self.root_state.lock().unwrap_or_else(|e| e.into_inner());
        let now = root_identity(&self.root);
        let rewalk = now.is_some() && self.rewalk.load(Ordering::Acquire);
        if st.id == now && !rewalk {
            // A descriptor that could not be reopened at the last change: try again.
            if now.is_some() && st.held.as_ref().map(|h| h.1) != now {
                st.held = open_root(&self.root).or(st.held.take());
            }
            return RootChange::Unchanged;
        }
        self.rewalk.store(false, Ordering::Release);
        st.id = now;
        st.generation += 1;
        if now.is_some() {
            // Another directory at the path (a file system mounted there): hold that one.
            if st.held.as_ref().map(|h| h.1) != now {
                st.held = open_root(&self.root).or(st.held.take());
            }
            RootChange::Returned {
                generation: st.generation,
            }
        } else {
            RootChange::Vanished
        }
    }

    /// Mark the tier offline (its root is missing): nothing is placed or moved there.
    /// Called with the files it held recorded in the same step
    /// ([`crate::store::Store::note_tier_vanished`]).
    pub(crate) fn set_offline(&self) {
        let mut since = self.offline_since.lock().unwrap_or_else(|e| e.into_inner());
        if since.is_none() {
            *since = Some(std::time::SystemTime::now());
        }
        self.online.store(false, Ordering::Release);
    }

    /// Mark the tier online after the walk of its returned tree that [`Tier::check_root`]
    /// asked for with `generation`: only if the root is still the one that was walked (no
    /// vanishing or other directory since). False: left as it is (offline if it was), for
    /// the next check.
    pub(crate) fn publish_online(&self, generation: u64) -> bool {
        let st = self.root_state.lock().unwrap_or_else(|e| e.into_inner());
        if st.generation != generation
            || st.id.is_none()
            || self.rewalk.load(Ordering::Acquire)
            || root_identity(&self.root) != st.id
        {
            return false;
        }
        *self.offline_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.online.store(true, Ordering::Release);
        true
    }

    /// The root path compared with the directory kaiso holds, at once (an operation found
    /// a name of this tier missing by path): a root missing now is reported to the first
    /// caller that sees it (`first`), which records the tier's files and takes it offline
    /// in one step under the namespace lock it holds
    /// ([`crate::store::Store::note_tier_vanished`]), without waiting for the next
    /// [`Tier::check_root`]; another directory at the path makes that check walk the
    /// tier again.
    pub(crate) fn root_now(&self) -> RootNow {
        let mut st = self.root_state.lock().unwrap_or_else(|e| e.into_inner());
        let now = root_identity(&self.root);
        let Some(now) = now else {
            let first = st.id.is_some();
            if first {
                st.id = None;
                st.generation += 1;
            }
            return RootNow::Missing { first };
        };
        if st.held.as_ref().map(|h| h.1) == Some(now) {
            return RootNow::Held;
        }
        if st.id == Some(now) {
            // The change was seen, but its directory could not be opened then.
            st.held = open_root(&self.root).or(st.held.take());
            return if st.held.as_ref().map(|h| h.1) == Some(now) {
                RootNow::Held
            } else {
                RootNow::Unknown
            };
        }
        if st.held.is_none() {
            return RootNow::Unknown;
        }
        self.rewalk.store(true, Ordering::Release);
        RootNow::Other
    }

    /// `lstat` of `rel` in the directory kaiso holds as this tier's root, whatever its
    /// path shows now: None if kaiso holds none, Some(None) if the name is not there.
    pub(crate) fn lstat_held(&self, rel: &Path) -> Option<std::io::Result<Option<libc::stat>>> {
        use std::os::fd::AsRawFd;
        let fd = {
            let st = self.root_state.lock().unwrap_or_else(|e| e.into_inner());
            // A duplicate: the lookup below runs without the lock.
            match st.held.as_ref().map(|h| h.0.try_clone()) {
                Some(Ok(fd)) => fd,
                Some(Err(e)) => return Some(Err(e)),
                None => return None,
            }
        };
        let root = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        let p = BackingPath::resolve(&root, rel);
        Some(crate::util::lstat_opt(&p))
    }

    /// Emulated service time for one request, if the tier is emulated.
    pub fn emulate(&self, object: u64, offset: u64, len: u64, write: bool) {
        if let Some(e) = &self.emu {
            e.io(object, offset, len, write);
        }
    }

    pub fn emulated(&self) -> bool {
        self.emu.is_some()
    }

    /// Foreground utilisation since the previous call. Emulated tiers: the model's %util
    /// of user requests. Others: the share of the interval the backing block device was
    /// busy (`io_ticks`), not counted while that load is the mover's own (see
    /// [`DeviceLoad::sample`]); 0 where the tier has no block device of its own (tmpfs,
    /// overlay, btrfs, FUSE, NFS), since kaiso cannot see that load.
    pub fn sample_busy(&self) -> f64 {
        let v = match &self.emu {
            Some(e) => {
                let mut s = self.busy_snap.lock().unwrap_or_else(|e| e.into_inner());
                e.busy_fraction(&mut s)
            }
            None => {
                let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
                let Some(io_ticks) = d.source.as_ref().and_then(|read| read()) else {
                    return self.set_busy(0.0);
                };
                let now = LoadSample {
                    at: Instant::now(),
                    io_ticks,
                    fg_bytes: self.fg_bytes.load(Ordering::Relaxed),
                    mover_bytes: self.mover_bytes.load(Ordering::Relaxed),
                };
                match d.sample(now) {
                    Some(v) => v,
                    None => return self.busy(),
                }
            }
        };
        self.set_busy(v)
    }

    fn set_busy(&self, v: f64) -> f64 {
        *self.last_busy.lock().unwrap_or_else(|e| e.into_inner()) = v;
        v
    }

    /// Read this (real) tier's device busy time from `source` instead of its block
    /// device's statistics (tests and benchmarks inject load this way).
    pub fn set_busy_source(&self, source: BusyTicks) {
        let mut d = self.device.lock().unwrap_or_else(|e| e.into_inner());
        *d = DeviceLoad::new(Some(source));
    }

    pub fn busy(&self) -> f64 {
        *self.last_busy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Where a real tier's device busy time comes from: the device's cumulative busy
/// milliseconds (`io_ticks`), None when it cannot be read now.
pub type BusyTicks = Box<dyn Fn() -> Option<u64> + Send + Sync>;

/// Shortest window a real device's utilisation is computed over: `io_ticks` counts whole
/// jiffies (1-10 ms), and a few quiet milliseconds between a user's requests must not end
/// a back-off (the mover polls every 20 ms while it waits).
const MIN_WINDOW: Duration = Duration::from_millis(100);

/// For this long after the mover last copied from or to a tier, the tier's device load
/// counts only when foreground bytes went through kaiso in the same window: the device is
/// still busy with the mover's reads and its write-back then, and a move must not back
/// off because of itself.
const MOVER_GRACE: Duration = Duration::from_secs(5);

/// One reading of a real tier's load counters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LoadSample {
    pub at: Instant,
    /// Milliseconds the device has been busy, in all (`/sys/dev/block/M:m/stat` field 10).
    pub io_ticks: u64,
    /// Foreground bytes kaiso served from the tier, in all.
    pub fg_bytes: u64,
    /// Bytes the mover copied from or to the tier, in all.
    pub mover_bytes: u64,
}

/// A real tier's utilisation between consecutive samples.
pub(crate) struct DeviceLoad {
    source: Option<BusyTicks>,
    last: Option<LoadSample>,
    /// When a sample last saw the mover's bytes grow.
    mover_seen: Option<Instant>,
}

impl DeviceLoad {
    fn new(source: Option<BusyTicks>) -> DeviceLoad {
        DeviceLoad {
            source,
            last: None,
            mover_seen: None,
        }
    }

    /// The foreground utilisation since the previous sample (0 for the first), or None
    /// when the window is too short to tell (the previous figure stands, and the window
    /// goes on). The device's busy share of the wall time counts as foreground load
    /// unless the mover copied on the tier recently ([`MOVER_GRACE`]) and no foreground
    /// bytes went through kaiso in the window: then the load is taken for the mover's own.
    pub(crate) fn sample(&mut self, now: LoadSample) -> Option<f64> {
        let Some(prev) = self.last else {
            self.last = Some(now);
            return Some(0.0);
        };
        let wall = now.at.saturating_duration_since(prev.at);
        if wall < MIN_WINDOW {
            return None;
        }
        self.last = Some(now);
        if now.mover_bytes != prev.mover_bytes {
            self.mover_seen = Some(now.at);
        }
        let mover_recent = self
            .mover_seen
            .is_some_and(|t| now.at.saturating_duration_since(t) < MOVER_GRACE);
        if mover_recent && now.fg_bytes == prev.fg_bytes {
            return Some(0.0);
        }
        Some(busy_share(prev.io_ticks, now.io_ticks, wall))
    }
}

/// The share of `wall` a device was busy, from two `io_ticks` readings (ms); a counter
/// that went back (device re-attached) reads as idle.
pub(crate) fn busy_share(before: u64, after: u64, wall: Duration) -> f64 {
    let wall_ms = wall.as_secs_f64() * 1000.0;
    if wall_ms <= 0.0 {
        return 0.0;
    }
    (after.saturating_sub(before) as f64 / wall_ms).clamp(0.0, 1.0)
}

/// `io_ticks` (field 10: milliseconds spent doing I/O) of a block device `stat` file.
pub(crate) fn parse_io_ticks(stat: &str) -> Option<u64> {
    stat.split_whitespace().nth(9)?.parse().ok()
}

/// The `stat` file of the block device holding `root` (`st_dev`; a partition, loop or
/// device-mapper device has its own), or None when the file system has no block device
/// of its own (major 0: tmpfs, overlay, btrfs, FUSE, NFS) or sysfs does not show it.
pub(crate) fn device_stat_path(root: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(root).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major == 0 {
        return None;
    }
    let p = PathBuf::from(format!("/sys/dev/block/{major}:{minor}/stat"));
    std::fs::read_to_string(&p)
        .ok()
        .and_then(|s| parse_io_ticks(&s))
        .map(|_| p)
}

/// The busy-time source of a real tier at `root`: its block device's `io_ticks`, one
/// read of a small sysfs file per sample.
fn device_busy_ticks(name: &str, root: &Path) -> Option<BusyTicks> {
    let Some(p) = device_stat_path(root) else {
        tracing::debug!(
            tier = name,
            "no block device of its own: utilisation reads 0 (moves are paced by max_rate only)"
        );
        return None;
    };
    tracing::debug!(tier = name, stat = %p.display(), "utilisation from the block device");
    Some(Box::new(move || {
        parse_io_ticks(&std::fs::read_to_string(&p).ok()?)
    }))
}

/// Check a tier directory is usable: exists, is a directory, writable. One-line errors.
pub(crate) fn check_dir(name: &str, p: &Path) -> Result<(), String> {
    let md = std::fs::metadata(p).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("tier {name}: directory {} does not exist", p.display())
        }
        _ => format!("tier {name}: cannot access {}: {e}", p.display()),
    })?;
    if !md.is_dir() {
        return Err(format!("tier {name}: {} is not a directory", p.display()));
    }
    let c = crate::util::cpath(p).map_err(|e| e.to_string())?;
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "tier {name}: directory {} is not writable: {e}",
            p.display()
        ));
    }
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } == 0 && sv.f_flag & libc::ST_RDONLY != 0 {
        return Err(format!(
            "tier {name}: directory {} is on a read-only file system",
            p.display()
        ));
    }
    Ok(())
}

/// Bytes available to unprivileged writers on the file system holding `p` (`None` when
/// statvfs fails or reports no block size).
pub(crate) fn fs_avail(p: &Path) -> Option<u64> {
    let c = crate::util::cpath(p).ok()?;
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        return None;
    }
    let frsize = if sv.f_frsize > 0 {
        sv.f_frsize
    } else {
        sv.f_bsize
    };
    (frsize > 0).then(|| (sv.f_bavail as u64).saturating_mul(frsize as u64))
}

/// What a name missing from its tier by path means ([`Store::backing_missing`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Missing {
    /// The file is gone from the tier directory: its name goes.
    Gone,
    /// The tier's directory is not at its path (or another one stands there): the name
    /// drops out as for any offline tier, and the tier's next root check walks the tier
    /// when a directory is back, which puts it back.
    TierAway,
    /// The path reaches the file again (the directory was away for a moment): its
    /// `lstat`.
    Back(libc::stat),
}

impl crate::store::Store {
    /// `rel` was not found on tier `ti` by path (ENOENT or ENOTDIR) while the index holds a
    /// file there: say whether the file is really gone, or its tier directory was away.
    /// The root is checked at once (one `statx`), not only by the 100 ms root check, so
    /// an outage shorter than that is noticed too: a root missing now takes the tier
    /// offline here and records the files it held, and its return is then seen by the
    /// next root check, which puts the names back. `ns` is the held namespace lock.
    pub(crate) fn backing_missing(
        &self,
        ns: &crate::namespace::Namespace,
        ti: u8,
        rel: &Path,
    ) -> Missing {
        let Some(t) = self.tiers.get(ti as usize) else {
            return Missing::Gone;
        };
        if !t.online() {
            return Missing::TierAway;
        }
        match t.root_now() {
            RootNow::Held => match t.lstat_held(rel) {
                Some(Ok(Some(st))) => Missing::Back(st),
                _ => Missing::Gone,
            },
            RootNow::Missing { first } => {
                if first {
                    self.note_tier_vanished(ti, ns);
                }
                Missing::TierAway
            }
            RootNow::Other => Missing::TierAway,
            RootNow::Unknown => Missing::Gone,
        }
    }

    /// Tier `ti`'s root was just found missing: record the files it holds (shown as
    /// unreachable, and given their numbers back when it returns) and take it offline, in
    /// one step (under the table's lock). `ns` is the held namespace lock.
    pub(crate) fn note_tier_vanished(&self, ti: u8, ns: &crate::namespace::Namespace) {
        let held: std::collections::HashSet<crate::types::Ino> = ns
            .files
            .iter()
            .filter(|(_, f)| f.tier == ti)
            .map(|(i, _)| *i)
            .collect();
        let t = &self.tiers[ti as usize];
        tracing::warn!(
            tier = %t.cfg.name,
            path = %t.root.display(),
            files = held.len(),
            "tier directory vanished: its files are unavailable until it returns"
        );
        // One step for every observer: `tier_health` reads the table and the flag under
        // this lock, and operations look at the flag under the namespace lock `ns`.
        let mut vanished = self.vanished.lock().unwrap_or_else(|e| e.into_inner());
        vanished.insert(ti, held);
        t.set_offline();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier_at(path: &Path, capacity: u64) -> Tier {
        Tier::new(TierConfig {
            name: "t".into(),
            path: path.to_path_buf(),
            capacity,
            high_watermark: 0.8,
            low_watermark: 0.5,
            device: None,
        })
        .expect("tier")
    }

    /// What the store does with a root change (`Store::check_tier_roots`): a vanished
    /// root takes the tier offline (with its files recorded), a returned one is
    /// published online after the walk of its tree.
    fn apply(t: &Tier, c: RootChange) -> RootChange {
        match c {
            RootChange::Vanished => t.set_offline(),
            RootChange::Returned { generation } => {
                assert!(t.publish_online(generation), "published")
            }
            RootChange::Unchanged => {}
        }
        c
    }

    fn returned(c: RootChange) -> bool {
        matches!(c, RootChange::Returned { .. })
    }

    #[test]
    fn root_that_vanishes_takes_the_tier_offline_until_it_returns() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("t");
        std::fs::create_dir(&root).unwrap();
        let t = tier_at(&root, 1 << 30);
        assert_eq!(apply(&t, t.check_root()), RootChange::Unchanged);
        assert!(t.online() && t.fits(1) && t.fits_below_high(1));
        let away = d.path().join("away");
        std::fs::rename(&root, &away).unwrap();
        assert!(t.root_may_have_changed());
        assert!(t.online(), "a check alone does not take the tier offline");
        assert_eq!(apply(&t, t.check_root()), RootChange::Vanished);
        assert!(!t.online() && !t.fits(1) && !t.fits_below_high(1));
        assert!(!t.root_may_have_changed());
        assert_eq!(t.check_root(), RootChange::Unchanged);
        // The same directory back: its tree to be merged, online only once published.
        std::fs::rename(&away, &root).unwrap();
        let back = t.check_root();
        assert!(returned(back), "{back:?}");
        assert!(!t.online(), "online before the walk of the returned tree");
        apply(&t, back);
        assert!(t.online() && t.fits(1));
        assert_eq!(t.check_root(), RootChange::Unchanged);
        // Another directory at the same path (a file system mounted there): also a return.
        std::fs::rename(&root, &away).unwrap();
        std::fs::create_dir(&root).unwrap();
        assert!(returned(apply(&t, t.check_root())));
        assert!(t.online());
        // A file is no tier root.
        std::fs::remove_dir(&root).unwrap();
        std::fs::write(&root, b"x").unwrap();
        assert_eq!(apply(&t, t.check_root()), RootChange::Vanished);
        assert!(!t.online());
    }

    /// A walk after a return publishes the tier online only if its root did not change
    /// again meanwhile: a root that vanished (or was replaced) during the walk leaves the
    /// tier offline for the next check.
    #[test]
    fn a_return_is_published_only_for_the_root_that_was_walked() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("t");
        std::fs::create_dir(&root).unwrap();
        let t = tier_at(&root, 1 << 30);
        let away = d.path().join("away");
        std::fs::rename(&root, &away).unwrap();
        apply(&t, t.check_root());
        std::fs::rename(&away, &root).unwrap();
        let RootChange::Returned { generation } = t.check_root() else {
            panic!("a return expected")
        };
        // Gone again during the walk (not seen by any check yet).
        std::fs::rename(&root, &away).unwrap();
        assert!(
            !t.publish_online(generation),
            "published with the root missing"
        );
        assert!(!t.online());
        // Seen by an operation (`root_now`) during the walk, and back: still the old walk.
        assert_eq!(t.root_now(), RootNow::Missing { first: true });
        std::fs::rename(&away, &root).unwrap();
        assert!(
            !t.publish_online(generation),
            "published across another change"
        );
        assert!(!t.online() && t.offline_since().is_some());
        let RootChange::Returned { generation: next } = t.check_root() else {
            panic!("a new return expected")
        };
        assert!(next > generation);
        assert!(t.publish_online(next));
        assert!(t.online() && t.offline_since().is_none());
    }

    /// An operation that finds a name missing by path checks the root at once: a
    /// directory renamed away and back before the check still has the name (through the
    /// held descriptor); one still away takes the tier offline at once, and its return is
    /// then seen by the next root check; another directory at the path makes the next
    /// root check report a return even if the original is back by then.
    #[test]
    fn a_name_missing_by_path_checks_the_root_at_once() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("t");
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("a/f"), b"x").unwrap();
        let t = tier_at(&root, 1 << 30);
        let rel = Path::new("a/f");
        let away = d.path().join("away");
        // Away and back again before the check: the held directory still has the name.
        std::fs::rename(&root, &away).unwrap();
        assert!(crate::util::lstat_opt(&t.backing(rel)).unwrap().is_none());
        let held = t.lstat_held(rel).expect("a held root").unwrap();
        assert_eq!(
            held.map(|s| s.st_size),
            Some(1),
            "the held root reaches a/f"
        );
        std::fs::rename(&away, &root).unwrap();
        assert_eq!(t.root_now(), RootNow::Held);
        assert!(t.online());
        assert_eq!(t.check_root(), RootChange::Unchanged);
        // Still away at the check: offline at once (the first caller records the files).
        std::fs::rename(&root, &away).unwrap();
        assert_eq!(t.root_now(), RootNow::Missing { first: true });
        t.set_offline(); // as the first caller's `note_tier_vanished`
        assert!(!t.online() && t.offline_since().is_some());
        assert_eq!(t.root_now(), RootNow::Missing { first: false });
        assert_eq!(t.check_root(), RootChange::Unchanged);
        std::fs::rename(&away, &root).unwrap();
        assert!(returned(apply(&t, t.check_root())));
        assert!(t.online());
        // Really gone: not in the held directory either.
        std::fs::remove_file(root.join("a/f")).unwrap();
        assert_eq!(t.root_now(), RootNow::Held);
        assert!(t.lstat_held(rel).unwrap().unwrap().is_none());
        // Another directory at the path, and the original back before the root check:
        // the check still walks the tier (a name dropped meanwhile comes back).
        std::fs::rename(&root, &away).unwrap();
        std::fs::create_dir(&root).unwrap();
        assert_eq!(t.root_now(), RootNow::Other);
        std::fs::remove_dir(&root).unwrap();
        std::fs::rename(&away, &root).unwrap();
        assert!(returned(apply(&t, t.check_root())));
        assert_eq!(t.check_root(), RootChange::Unchanged);
        // A different directory that stays: held from its return on.
        std::fs::rename(&root, &away).unwrap();
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("new"), b"yz").unwrap();
        assert!(returned(apply(&t, t.check_root())));
        assert_eq!(t.root_now(), RootNow::Held);
        let st = t.lstat_held(Path::new("new")).unwrap().unwrap();
        assert_eq!(st.map(|s| s.st_size), Some(2), "the new root is held");
    }

    /// Room held for a move is kept by a recount of the tier (its copy is a hidden
    /// temporary file no walk counts), becomes the file's once kept, and goes when given
    /// back.
    #[test]
    fn a_recount_keeps_the_room_held_for_moves() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), 100);
        t.add_used(10);
        assert!(t.reserve_for_move(50));
        assert!(!t.reserve_for_move(41), "past the hard capacity");
        assert_eq!(t.used(), 60);
        t.set_scanned_used(10);
        assert_eq!(t.used(), 60, "the recount dropped the move's room");
        t.unreserve_for_move(20);
        assert_eq!(t.used(), 40);
        t.set_scanned_used(10);
        assert_eq!(t.used(), 40);
        t.keep_move_reservation(30);
        // Kept: the walk now finds the file (10 + 30).
        t.set_scanned_used(40);
        assert_eq!(t.used(), 40);
        assert!(t.reserve_for_move(7));
        t.unreserve_for_move(7);
        t.set_scanned_used(40);
        assert_eq!(t.used(), 40, "a released reservation is not counted again");
    }

    /// `umount` and a new `mount -t tmpfs` at a tier root give the same device and root
    /// inode numbers: only the mount id shows that another file system stands there now.
    /// Needs root (skipped, with a note, where mounting is not allowed).
    #[test]
    fn another_file_system_mounted_at_the_root_is_a_return_even_with_the_same_numbers() {
        let d = tempfile::tempdir().expect("tempdir");
        let root = d.path().join("t");
        std::fs::create_dir(&root).unwrap();
        let c = crate::util::cpath(&root).unwrap();
        let tmpfs = |on: bool| unsafe {
            if on {
                libc::mount(
                    c"none".as_ptr(),
                    c.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                ) == 0
            } else {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH) == 0
            }
        };
        if !tmpfs(true) {
            eprintln!("skipped: cannot mount tmpfs here (needs root)");
            return;
        }
        let t = tier_at(&root, 1 << 30);
        let first = root_identity(&root).expect("identity");
        assert_eq!(t.check_root(), RootChange::Unchanged);
        // Replaced between two samples.
        assert!(tmpfs(false) && tmpfs(true), "remount tmpfs");
        let second = root_identity(&root).expect("identity");
        let changed = apply(&t, t.check_root());
        assert!(tmpfs(false));
        assert_ne!(first, second, "same identity after a new mount");
        assert!(returned(changed), "{first:?} -> {second:?}: {changed:?}");
        assert!(t.online() && t.offline_since().is_none());
    }

    #[test]
    fn capacity_is_the_configured_one_until_the_file_system_is_sampled() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), u64::MAX / 2);
        assert_eq!(t.capacity(), u64::MAX / 2);
        t.refresh_fs_room(0);
        let avail = fs_avail(d.path()).expect("statvfs");
        // The sample and the check can differ by what other programs wrote meanwhile.
        assert!(
            t.capacity() <= avail + (64 << 20),
            "{} vs {avail}",
            t.capacity()
        );
        assert!(t.capacity() < u64::MAX / 2);
        assert_eq!(t.cfg.capacity, u64::MAX / 2);
    }

    #[test]
    fn a_small_configured_capacity_wins_over_a_large_file_system() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), 4096);
        t.refresh_fs_room(0);
        assert_eq!(t.capacity(), 4096);
    }

    #[test]
    fn own_growth_and_pending_reserves_count_against_the_real_room() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), u64::MAX / 2);
        t.add_used(1 << 30);
        t.refresh_fs_room(1 << 30);
        let before = t.free();
        // The reserve is room already promised: it is not room on top of `avail`.
        let avail = fs_avail(d.path()).expect("statvfs");
        assert!(before <= avail, "{before} > {avail}");
        t.add_used(1 << 20);
        assert_eq!(t.free(), before - (1 << 20));
    }

    #[test]
    fn a_hold_takes_room_atomically_and_gives_it_back_unless_kept() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), 100);
        let a = t.hold(60).expect("60 of 100 fit");
        assert!(
            t.hold(60).is_none(),
            "the second 60 must not fit beside the first"
        );
        assert_eq!(t.used(), 60);
        drop(a);
        assert_eq!(t.used(), 0);
        t.hold(100).expect("all of it fits").keep();
        assert_eq!(t.used(), 100);
        assert!(t.hold(1).is_none());
        assert!(
            t.hold(0).is_some() && t.fits(0),
            "as fits(0): exactly full still fits 0"
        );
    }

    #[test]
    fn missing_bytes_of_stubs_are_room_promised_on_the_file_system() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), u64::MAX / 2);
        let st = crate::handles::FileState::new(7, 0, 0);
        st.size.store(1 << 30, std::sync::atomic::Ordering::Release);
        *st.stub.lock().unwrap() = Some(crate::stub::StubState {
            unlisted_dir: false,
            missing: vec![(0, 1 << 29), (3 << 28, 1 << 30)],
            times: None,
        });
        t.add_used(1 << 30);
        t.note_stub(0, &st);
        assert_eq!(t.stub_pending(), 3 << 28);
        // The sample counts them as written: a 1 GiB sparse stub leaves no more room
        // than its fetched quarter took.
        t.refresh_fs_room(0);
        let avail = fs_avail(d.path()).expect("statvfs");
        let free = t.free();
        assert!(free <= avail.saturating_sub(3 << 28), "{free} > {avail}");
        // Complete, moved or gone: no longer counted.
        st.stub.lock().unwrap().as_mut().unwrap().missing.clear();
        assert_eq!(t.stub_pending(), 0);
        *st.stub.lock().unwrap() = Some(crate::stub::StubState {
            unlisted_dir: false,
            missing: vec![(0, 10)],
            times: None,
        });
        assert_eq!(t.stub_pending(), 0, "forgotten once complete");
        t.note_stub(0, &st);
        assert_eq!(t.stub_pending(), 10);
        st.tier.store(1, std::sync::atomic::Ordering::Release);
        assert_eq!(t.stub_pending(), 0, "moved away");
        st.tier.store(0, std::sync::atomic::Ordering::Release);
        t.note_stub(0, &st);
        drop(st);
        assert_eq!(t.stub_pending(), 0, "gone");
    }

    #[test]
    fn io_ticks_is_the_tenth_field_of_a_block_device_stat_file() {
        // A 17-field line (kernel 5.5+) and an 11-field one (older kernels).
        let new = "11542847   229349 639733442 77401484  9578735  3330494 3252894360 \
                   31398490        0  3779428 110544250  3966134    31331 3020035488  \
                   1282109  2562157   462165\n";
        assert_eq!(parse_io_ticks(new), Some(3779428));
        assert_eq!(parse_io_ticks("1 2 3 4 5 6 7 8 0 42 99"), Some(42));
        assert_eq!(parse_io_ticks("1 2 3 4 5 6 7 8 0"), None);
        assert_eq!(parse_io_ticks("1 2 3 4 5 6 7 8 0 x 99"), None);
        assert_eq!(parse_io_ticks(""), None);
    }

    #[test]
    fn busy_share_is_busy_milliseconds_over_wall_milliseconds() {
        let ms = Duration::from_millis;
        assert_eq!(busy_share(1000, 1450, ms(500)), 0.9);
        assert_eq!(busy_share(1000, 1000, ms(500)), 0.0);
        // Merged requests can add a little more than the wall time: at most 1.
        assert_eq!(busy_share(0, 520, ms(500)), 1.0);
        // A counter that went back (the device was re-attached) reads as idle.
        assert_eq!(busy_share(5000, 10, ms(500)), 0.0);
        assert_eq!(busy_share(0, 10, ms(0)), 0.0);
    }

    /// A sample `ms` after `t0` with the counters given.
    fn at(t0: Instant, ms: u64, io_ticks: u64, fg_bytes: u64, mover_bytes: u64) -> LoadSample {
        LoadSample {
            at: t0 + Duration::from_millis(ms),
            io_ticks,
            fg_bytes,
            mover_bytes,
        }
    }

    #[test]
    fn device_load_counts_foreground_and_outside_load_but_not_the_movers_own() {
        let t0 = Instant::now();
        let mut d = DeviceLoad::new(None);
        assert_eq!(
            d.sample(at(t0, 0, 100, 0, 0)),
            Some(0.0),
            "first: no window"
        );
        // Busy with no mover around: someone's load (kaiso's users, passthrough readers,
        // other programs) counts whether or not kaiso saw the bytes.
        assert_eq!(d.sample(at(t0, 1000, 1000, 0, 0)), Some(0.9));
        // Too short a window: the previous figure stands and the window goes on.
        assert_eq!(d.sample(at(t0, 1050, 1000, 0, 0)), None);
        assert_eq!(d.sample(at(t0, 1500, 1250, 0, 0)), Some(0.5));
        // The mover copies, nobody else goes through kaiso: the load is the mover's.
        assert_eq!(d.sample(at(t0, 2000, 1750, 0, 8 << 20)), Some(0.0));
        // The mover pauses; the device still writes its data back, no users: still its own.
        assert_eq!(d.sample(at(t0, 2500, 2200, 0, 8 << 20)), Some(0.0));
        // Users read through kaiso meanwhile: the device's load counts in full.
        assert_eq!(d.sample(at(t0, 3000, 2650, 4096, 9 << 20)), Some(0.9));
        // Long after the mover's last copy, outside load counts again.
        assert_eq!(d.sample(at(t0, 9000, 8050, 4096, 9 << 20)), Some(0.9));
    }

    #[test]
    fn a_real_tier_reads_its_device_and_an_injected_source_wins() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), 1 << 30);
        // Where the temporary directory has a block device, its stat file is found.
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(d.path()).expect("stat").dev();
        let stat = device_stat_path(d.path());
        if libc::major(dev) != 0 && Path::new("/sys/dev/block").exists() {
            let p = stat.expect("block device stat file");
            assert!(p.ends_with(format!("{}:{}/stat", libc::major(dev), libc::minor(dev))));
        }
        let s = t.sample_busy();
        assert!((0.0..=1.0).contains(&s), "{s}");
        // Injected: busy 90% of the time, as a clock in milliseconds.
        let start = Instant::now();
        t.set_busy_source(Box::new(move || {
            Some((start.elapsed().as_millis() as u64) * 9 / 10)
        }));
        assert_eq!(t.sample_busy(), 0.0, "first sample opens the window");
        std::thread::sleep(Duration::from_millis(200));
        let b = t.sample_busy();
        assert!((0.8..=0.95).contains(&b), "{b}");
        assert_eq!(t.busy(), b);
        // Unknown busy time (the source fails): 0, never a panic.
        t.set_busy_source(Box::new(|| None));
        assert_eq!(t.sample_busy(), 0.0);
    }

    #[test]
    fn a_missing_directory_leaves_the_configured_capacity() {
        let t = tier_at(Path::new("/nonexistent/kaiso-tier"), 1 << 40);
        t.refresh_fs_room(0);
        assert_eq!(t.capacity(), 1 << 40);
    }
}
