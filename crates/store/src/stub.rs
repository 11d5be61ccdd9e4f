//! The migration hook: inodes that are stubs of a remote source, filled on demand.
//!
//! Post-copy migration (the `migrate` module) serves a namespace before its data is here.
//! An inode may carry stub state: a directory whose entries are not listed yet, or a file
//! whose data (some byte ranges) has not been fetched yet. Before the store serves
//! `lookup`/`readdir` in an unlisted directory, or `read`/`write` of an unfetched range,
//! it calls the registered [`StubFiller`], which brings the missing part in through the
//! `stub_*` methods of [`crate::Store`] (they never trigger the filler themselves).

use crate::error::FsResult;
use crate::types::{FileKind, Ino};
use std::collections::HashSet;
use std::path::Path;
use std::sync::{Condvar, Mutex};
use std::time::SystemTime;

/// Implemented by the migration module; registered with [`crate::Store::set_stub_filler`].
///
/// The store calls these with no store lock held. `fill_range` is called at most once at
/// a time per file (the store's per-file fill lock). `fill_dir` is NOT serialised by the
/// store: concurrent lookups in one unlisted directory may call it together, and it is
/// re-entered when the filler's own store calls (e.g. `link` into the directory being
/// listed) reach the fill path. A filler serialises per directory and recognises its own
/// re-entry with [`DirFillGate`].
pub trait StubFiller: Send + Sync {
    /// Directory `ino` (at `path`, relative to the store root) is unlisted: create its
    /// entries with [`crate::Store::stub_create`], then call
    /// [`crate::Store::stub_dir_listed`]. Entries that already exist are kept.
    fn fill_dir(&self, store: &crate::Store, ino: Ino, path: &Path) -> FsResult<()>;
    /// File `ino` needs the bytes `offset..offset+len` (clamped to its size): write them with
    /// [`crate::Store::stub_write`] (which marks them present). The filler may fetch more
    /// than asked (prefetch).
    fn fill_range(
        &self,
        store: &crate::Store,
        ino: Ino,
        path: &Path,
        offset: u64,
        len: u64,
    ) -> FsResult<()>;
    /// `ino`'s xattrs are about to be read or changed (getxattr, listxattr, setxattr,
    /// removexattr): a stub whose metadata (xattrs, ACLs) has not been copied yet copies
    /// it now, with [`crate::Store::stub_setxattr`]. Called for every such operation
    /// while a filler is registered, so it must be cheap for everything else. Default:
    /// nothing to copy.
    fn fill_meta(&self, _store: &crate::Store, _ino: Ino) -> FsResult<()> {
        Ok(())
    }
    /// Attributes of `ino` may be stale (optional refresh before getattr); default: nothing.
    fn fill_attr(&self, _store: &crate::Store, _ino: Ino, _path: &Path) -> FsResult<()> {
        Ok(())
    }
    /// A client removed a name of `ino` (unlink, rmdir, or a rename over it); the object
    /// may still exist (other hard links, open handles). Called after the removal with no
    /// store lock held, so the filler can keep its remaining-stub counter right.
    fn removed(&self, _store: &crate::Store, _ino: Ino) {}
    /// A client fsynced file `ino`: make the filler's own state of it durable before the
    /// fsync returns (the store has already made the data and its missing ranges
    /// durable). Default: nothing to sync.
    fn sync_state(&self, _store: &crate::Store, _ino: Ino) -> FsResult<()> {
        Ok(())
    }
    /// A client moved `ino` (`is_dir`: a directory) to another name or directory. Stub
    /// state is keyed by inode, so nothing has to be rewritten; a crawler uses this to
    /// visit an object moved from a part of the tree it has not reached into one it has.
    fn renamed(&self, _store: &crate::Store, _ino: Ino, _is_dir: bool) {}
}

/// Per-directory serialisation of `fill_dir` with re-entry detection, for fillers.
///
/// [`DirFillGate::enter`] returns `None` when this thread is already filling `ino` (the
/// filler's own store call came back to the fill path: nothing to do), otherwise waits
/// until no other thread fills `ino` and returns a guard. Different directories are
/// filled in parallel.
#[derive(Default)]
pub struct DirFillGate {
    busy: Mutex<HashSet<Ino>>,
    done: Condvar,
}

thread_local! {
    /// Directories this thread is filling right now (nested fills of other directories
    /// are allowed, e.g. a hard link whose anchor lives in another unlisted directory).
    static FILLING: std::cell::RefCell<Vec<Ino>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Held while one directory is being filled; releases the directory on drop.
pub struct DirFillGuard<'a> {
    gate: &'a DirFillGate,
    ino: Ino,
}

impl DirFillGate {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn enter(&self, ino: Ino) -> Option<DirFillGuard<'_>> {
        if FILLING.with(|f| f.borrow().contains(&ino)) {
            return None;
        }
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while busy.contains(&ino) {
            busy = self.done.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        busy.insert(ino);
        FILLING.with(|f| f.borrow_mut().push(ino));
        Some(DirFillGuard { gate: self, ino })
    }

    /// Number of directories being filled right now.
    pub fn busy(&self) -> usize {
        self.busy.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for DirFillGuard<'_> {
    fn drop(&mut self) {
        FILLING.with(|f| f.borrow_mut().retain(|i| *i != self.ino));
        self.gate
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.ino);
        self.gate.done.notify_all();
    }
}

/// What is known about an entry created by the filler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubEntry {
    pub kind: FileKind,
    /// Permission bits.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    /// File size (the file is created sparse at this size, all of it unfetched).
    pub size: u64,
    pub mtime: SystemTime,
    pub atime: SystemTime,
    /// Target of a symlink.
    pub symlink_target: Option<std::ffi::OsString>,
    /// Device number for char/block devices.
    pub rdev: u64,
    /// For directories: whether its entries still have to be listed by `fill_dir`.
    pub unlisted: bool,
}

/// Stub state of an inode, as [`crate::Store::stub_state`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StubState {
    /// A directory whose entries are not listed yet.
    pub unlisted_dir: bool,
    /// Byte ranges `[start, end)` of a file that are NOT yet present, sorted, disjoint.
    pub missing: Vec<(u64, u64)>,
    /// (atime, mtime) a stub file must show whatever fetching does to it: the source's
    /// times from its creation, persisted in its stub row, put back after every fetched
    /// unit, reported by `getattr` meanwhile and applied again at start-up (a crash
    /// between a fetch's write and the restore of the times). `None`: the file's own
    /// times hold (a client modified it; a fetch then keeps the times it finds).
    pub times: Option<(SystemTime, SystemTime)>,
}

impl StubState {
    /// Nothing missing: the inode is an ordinary resident inode.
    pub fn is_complete(&self) -> bool {
        !self.unlisted_dir && self.missing.is_empty()
    }
}

/// The owner a stub created for a source entry owned by `uid`/`gid` can be given by this
/// process, as chown(2) allows it: the source's owner when the process may give files
/// away (root, or `CAP_CHOWN`); otherwise (a daemon that is not root) the process's own
/// user, with the source's group if the process is a member of it, else its own group —
/// what `rsync -a` run by a user does. With `assume_no_chown` the capability is taken as
/// missing (a chown that was refused anyway, e.g. by a root-squashing tier).
pub(crate) fn owner_to_give(uid: u32, gid: u32, assume_no_chown: bool) -> (u32, u32) {
    if !assume_no_chown && can_chown() {
        return (uid, gid);
    }
    let (me, my_gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let gid = if gid == my_gid || my_groups().contains(&gid) {
        gid
    } else {
        my_gid
    };
    (me, gid)
}

/// Whether this process may give files to any owner (`CAP_CHOWN` in its effective set).
fn can_chown() -> bool {
    static CAN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CAN.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
        match eff {
            // CAP_CHOWN is capability 0.
            Some(bits) => bits & 1 != 0,
            None => (unsafe { libc::geteuid() }) == 0,
        }
    })
}

/// The supplementary groups of this process.
fn my_groups() -> &'static [u32] {
    static GROUPS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    GROUPS.get_or_init(|| {
        let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
        if n <= 0 {
            return Vec::new();
        }
        let mut v = vec![0 as libc::gid_t; n as usize];
        let got = unsafe { libc::getgroups(n, v.as_mut_ptr()) };
        v.truncate(got.max(0) as usize);
        v
    })
}

thread_local! {
    /// The first source owner this thread's `Store::stub_create` could not give (the
    /// process may not chown): (source uid, gid, given uid, gid). Taken by the filler
    /// with [`take_owner_not_given`] to report it.
    static OWNER_NOT_GIVEN: std::cell::Cell<Option<(u32, u32, u32, u32)>> =
        const { std::cell::Cell::new(None) };
}

/// Notes that an entry owned by `wanted` on the source was given `given` instead.
pub(crate) fn note_owner_not_given(wanted: (u32, u32), given: (u32, u32)) {
    OWNER_NOT_GIVEN.with(|c| {
        if c.get().is_none() {
            c.set(Some((wanted.0, wanted.1, given.0, given.1)));
        }
    });
}

/// The first source owner this thread's stub creations could not give since the last
/// call (see [`owner_to_give`]): (source uid, gid, given uid, gid).
pub(crate) fn take_owner_not_given() -> Option<(u32, u32, u32, u32)> {
    OWNER_NOT_GIVEN.with(|c| c.take())
}

/// The ctime clients see of a file the store itself writes into (migration fetches).
///
/// A fetch writes the source's bytes into a stub's backing file and puts its mtime back;
/// both move the backing file's ctime, which no one can set. Shown as it is, a client's
/// read (which fetches) would change the file's ctime under it: `tar` reports "file
/// changed as we read it", incremental backups take the file for changed. So the ctime
/// from before the store's first write stays the one clients see, as long as the backing
/// file's ctime is the one the store's last write left: `(shown, real)`. Any other
/// change (a client's write, chmod, link, a tier move) gives the backing file another
/// ctime, which is then shown; the next store write keeps showing that one. A partly
/// fetched file's mask is written with its stub row and put back when a migration opens
/// after a restart ([`crate::Store::restore_ctime_masks`]); it goes with the row when the
/// file is complete, so a file completed before a restart shows its backing ctime after
/// it (one change, at the restart), as does a directory.
/// The migration's `finish` compares the backing file's real ctime
/// ([`crate::Store::getattr_backing`]).
#[derive(Debug, Default)]
pub(crate) struct CtimeMask {
    /// (shown, real), see above.
    mask: Option<(SystemTime, SystemTime)>,
    /// A store write is under way (its gate held exclusively): `shown` holds whatever
    /// the backing file says meanwhile.
    writing: bool,
}

impl CtimeMask {
    /// A directory clients saw, with backing ctime `real`, before the migration listed
    /// it: everything until the listing ends is the store's own change (see
    /// [`CtimeMask::settle`]), so `real` is what they see meanwhile.
    pub(crate) fn pin(real: SystemTime) -> Self {
        CtimeMask {
            mask: Some((real, real)),
            writing: true,
        }
    }

    /// The store's changes to a pinned directory are over (it is listed, its times and
    /// metadata restored): they left backing ctime `real`.
    pub(crate) fn settle(&mut self, real: SystemTime) {
        if let Some((shown, _)) = self.mask {
            self.mask = Some((shown, real));
        }
        self.writing = false;
    }

    /// Nothing to remember any more.
    pub(crate) fn is_void(&self) -> bool {
        self.mask.is_none() && !self.writing
    }

    /// What clients see for backing ctime `real`. A mask that no longer applies (someone
    /// else changed the file since the store's last write) is dropped.
    pub(crate) fn shown(&mut self, real: SystemTime) -> SystemTime {
        match self.mask {
            Some((shown, _)) if self.writing => shown,
            Some((shown, r)) if r == real => shown,
            Some(_) => {
                self.mask = None;
                real
            }
            None => real,
        }
    }
}

/// Held by a store write into backing file `f` of `state` (the file's gate held
/// exclusively, so no client write, truncate or utimens lands meanwhile): from before the
/// write until its drop, after the last change the store makes (data, then mtime).
pub(crate) struct StoreWrite<'a> {
    state: &'a crate::handles::FileState,
    f: &'a std::fs::File,
    /// The thread's store write before this one (see `STORE_WRITE`), put back at drop.
    prev_thread_write: Option<(Ino, SystemTime, std::os::fd::RawFd)>,
}

impl<'a> StoreWrite<'a> {
    /// Begins a store write into `f`, whose ctime before the store's first change is
    /// `before`, or the one `f` has now if `None` (`before` is given when the store
    /// changed the file already to open it: `crate::owner_write`).
    pub(crate) fn begin_at(
        state: &'a crate::handles::FileState,
        f: &'a std::fs::File,
        before: Option<SystemTime>,
    ) -> Self {
        let before = before.or_else(|| ctime_of(f));
        let mut m = state.ctime.lock().unwrap_or_else(|e| e.into_inner());
        m.mask = before.map(|b| match m.mask {
            // Only the store changed the file since its last write: still the old one.
            Some((shown, real)) if real == b => (shown, b),
            // First store write, or someone changed the file since: what it shows now.
            _ => (b, b),
        });
        m.writing = true;
        let shown = m.mask.map(|(shown, _)| shown);
        drop(m);
        // The stub row this write commits carries the mask (see `store_write_mask`).
        let prev = STORE_WRITE.with(|c| {
            c.replace(shown.map(|shown| {
                use std::os::fd::AsRawFd;
                (state.ino, shown, f.as_raw_fd())
            }))
        });
        StoreWrite {
            state,
            f,
            prev_thread_write: prev,
        }
    }
}

thread_local! {
    /// The store write under way on this thread: (inode, ctime shown, backing file's
    /// descriptor), for [`store_write_mask`].
    static STORE_WRITE: std::cell::Cell<Option<(Ino, SystemTime, std::os::fd::RawFd)>> =
        const { std::cell::Cell::new(None) };
}

/// The ctime mask (shown, real) that the store write into file `ino` under way on this
/// thread leaves, its backing file's ctime now being the real one: written with the
/// file's stub row (`Db::set_stub`), so a restart keeps showing clients the ctime from
/// before the store's writes ([`crate::Store::restore_ctime_masks`]). `None` outside
/// such a write.
pub(crate) fn store_write_mask(ino: Ino) -> Option<(SystemTime, SystemTime)> {
    let (w, shown, fd) = STORE_WRITE.with(|c| c.get())?;
    if w != ino {
        return None;
    }
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return None;
    }
    Some((shown, crate::util::ts(st.st_ctime, st.st_ctime_nsec)))
}

impl crate::Store {
    /// Puts back the ctime masks recorded with the stub rows of partly fetched files
    /// (see [`CtimeMask`]): after a restart, clients keep seeing the ctime a file had
    /// before the store's first write into it, as long as nobody else changed it since
    /// (its backing file's ctime is still the one the store's last write left). A file
    /// that already has a mask in memory keeps it. Called when a migration opens (and
    /// idempotent); returns how many were put back.
    pub fn restore_ctime_masks(&self) -> usize {
        let rows = match self.db().stub_ctimes() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("ctime masks of stub rows: {e}");
                return 0;
            }
        };
        let ns = self.ns();
        let mut n = 0;
        for (ino, (shown, real)) in rows {
            let Some(f) = ns.files.get(&ino) else {
                continue;
            };
            if f.state
                .stub
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .is_none()
            {
                continue;
            }
            let Some(rel) = ns.file_path(ino) else {
                continue;
            };
            let now = crate::util::lstat(&self.tiers[f.tier as usize].backing(&rel))
                .map(|st| crate::util::ts(st.st_ctime, st.st_ctime_nsec));
            if now.ok() != Some(real) {
                // Changed by someone else since (or gone): its real ctime shows.
                continue;
            }
            let mut m = f.state.ctime.lock().unwrap_or_else(|e| e.into_inner());
            if m.is_void() {
                m.mask = Some((shown, real));
                n += 1;
            }
        }
        n
    }
}

impl Drop for StoreWrite<'_> {
    fn drop(&mut self) {
        STORE_WRITE.with(|c| c.set(self.prev_thread_write));
        let after = ctime_of(self.f);
        let mut m = self.state.ctime.lock().unwrap_or_else(|e| e.into_inner());
        m.mask = match (m.mask, after) {
            (Some((shown, _)), Some(a)) => Some((shown, a)),
            _ => None,
        };
        m.writing = false;
    }
}

fn ctime_of(f: &std::fs::File) -> Option<SystemTime> {
    crate::util::fstat(f)
        .ok()
        .map(|st| crate::util::ts(st.st_ctime, st.st_ctime_nsec))
}

/// The store's side of the filler hooks (called from the namespace operations with no
/// store lock held).
impl crate::Store {
    pub(crate) fn stub_filler(&self) -> Option<std::sync::Arc<dyn StubFiller>> {
        self.filler
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Unregisters `filler` if it is the registered one (a migration daemon whose last
    /// share finished); true if it was. Another registered filler is left alone.
    pub fn unset_stub_filler(&self, filler: &dyn StubFiller) -> bool {
        let mut slot = self.filler.write().unwrap_or_else(|e| e.into_inner());
        let same = slot.as_ref().is_some_and(|f| {
            std::ptr::addr_eq(std::sync::Arc::as_ptr(f), filler as *const dyn StubFiller)
        });
        if same {
            *slot = None;
        }
        same
    }

    /// Whether a stub filler is registered.
    pub fn has_stub_filler(&self) -> bool {
        self.stub_filler().is_some()
    }

    /// A client removed a name of `ino`: tell the filler (its counter may drop).
    pub(crate) fn stub_notify_removed(&self, ino: Ino) {
        if let Some(f) = self.stub_filler() {
            f.removed(self, ino);
            self.mark_filler_touched(ino);
        }
    }

    /// While a migration runs, a change to file `ino` that the filler's own state of it
    /// must not lose (the filler was told of it, or would redo a step over it after
    /// losing that state): the next client fsync of the file syncs the filler's state.
    /// Call without the namespace lock, after the change.
    pub(crate) fn mark_filler_touched(&self, ino: Ino) {
        if self.stub_filler().is_none() {
            return;
        }
        let state = self.ns().files.get(&ino).map(|f| f.state.clone());
        if let Some(st) = state {
            st.mark_unsynced(crate::handles::FILLER_TOUCHED);
        }
    }

    /// A client moved `ino`: tell the filler (its crawler may have to visit it).
    pub(crate) fn stub_notify_renamed(&self, ino: Ino, is_dir: bool) {
        if let Some(f) = self.stub_filler() {
            f.renamed(self, ino, is_dir);
        }
    }
}

/// Orders fetched data before the state that says it is present (power loss).
///
/// A fetched unit is written into a tier file's page cache, then the store's stub row
/// (and later the migration's completion row) records it as present. Both databases
/// commit without fsync; their rows become durable at the next fsync of their WAL or
/// checkpoint. Should a row become durable before the bytes it vouches for, a power loss
/// leaves a "complete" file full of zeros. So every such sync goes through
/// [`FetchBarrier::sync_then`]: `syncfs(2)` of each tier that received fetched bytes
/// since the last one (one call covers every file of the tier), then the store's WAL,
/// then the caller's own sync, with fetch writes held back meanwhile. A fetch write
/// holds [`FetchBarrier::write_guard`] from its data write through its row commit and
/// marks its tier dirty in between, so no row reaches a WAL fsync ahead of its data.
/// The store's database does not checkpoint by itself while this is in use (see
/// `Store::fetch_barrier`): its checkpoints go through the barrier too.
pub struct FetchBarrier {
    /// Tier roots, by tier index.
    tiers: Vec<std::path::PathBuf>,
    /// The store database's WAL.
    store_wal: std::path::PathBuf,
    /// Per tier: dirty marks so far, and how many of them a completed `syncfs` covers.
    marks: Mutex<Vec<(u64, u64)>>,
    /// Shared: one fetch write and its row commit; exclusive: the syncs.
    order: std::sync::RwLock<()>,
    /// Store row commits of fetches since the last barrier (for a periodic checkpoint).
    pub(crate) commits_since: std::sync::atomic::AtomicU64,
    /// Held by the one thread that runs the periodic checkpoint: the others go on
    /// fetching instead of each starting a `syncfs` of its own, until the WAL reaches
    /// [`HOLD_WAL_BYTES`]; then they wait for it here (back-pressure).
    pub(crate) checkpoint_claim: Mutex<()>,
    /// Background threads that run the periodic checkpoints (a crawl's committer, see
    /// [`crate::Store::checkpoint_if_due`]): while one runs, fetches leave the due
    /// checkpoints to it and only wait for it past [`HOLD_WAL_BYTES`].
    pub(crate) background_checkpointers: std::sync::atomic::AtomicUsize,
    counts: BarrierCounts,
    /// The first [`SYNC_LOG_MAX`] syncs, oldest first (timelines, diagnostics).
    log: Mutex<Vec<BarrierSync>>,
    /// When the last sync made the store's rows durable (see `commit_counted`).
    last_sync: Mutex<std::time::Instant>,
    /// Milliseconds each `syncfs` of a tier takes on top of its own time (tests: a disk
    /// slowed by load, as on a busy CI machine).
    #[cfg(test)]
    pub(crate) slow_syncfs_ms: std::sync::atomic::AtomicU64,
}

/// Fetch commits and time that make a periodic checkpoint due, and the store-WAL size
/// that makes it due whatever they are (see [`FetchBarrier::commit_counted`]).
const CHECKPOINT_MIN_COMMITS: u64 = 1000;
const CHECKPOINT_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
const CHECKPOINT_WAL_BYTES: u64 = 3 << 20;

/// The store WAL's hard bound: past it a fetch's row commit waits for the checkpoint
/// under way (or runs one) instead of appending more.
///
/// A periodic checkpoint first makes every fetched byte durable (`syncfs` of each tier),
/// which takes seconds on a loaded disk; fetches of small files kept appending about
/// 5 KB each meanwhile, and the WAL reached 22 MB and filled a 64 MiB state directory
/// together with the migration database's (CI, session 13); about 2 KB a file since new
/// store databases use 1 KiB pages (`crate::db::PAGE_SIZE`, session 16). With this
/// bound, the migration database's (`crate::migrate::state`, also 6 MiB) and the WAL file kept
/// after a checkpoint ([`STORE_WAL_KEPT_BYTES`]), the two WALs never hold more than about
/// 13 MiB, whatever the disk's speed: a 64 MiB state directory keeps room for both
/// databases and ext4's own overhead. Above [`CHECKPOINT_WAL_BYTES`] and the size the
/// WAL is cut back to, so a checkpoint is due before writers are held.
pub(crate) const HOLD_WAL_BYTES: u64 = 6 << 20;

/// The size the store's WAL file is cut back to when SQLite starts it over after a
/// checkpoint (`journal_size_limit`, set while fetches are ordered): below
/// [`CHECKPOINT_WAL_BYTES`], so the file's size tells how much the WAL holds.
pub(crate) const STORE_WAL_KEPT_BYTES: i64 = 1 << 20;

/// Whether a store checkpoint is due after a fetch's row commit (see
/// [`FetchBarrier::commit_counted`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckpointDue {
    /// Not yet.
    No,
    /// Due: whoever is free to (a background thread, else the fetch) runs it.
    Due,
    /// The WAL is past [`HOLD_WAL_BYTES`]: the fetch waits for a checkpoint before it
    /// goes on.
    Hold,
}

/// One [`FetchBarrier::sync_then`]: when it started, how long it spent in `syncfs` and
/// how long fetch writes were held back (the held part includes the caller's sync).
#[derive(Clone, Copy, Debug)]
pub struct BarrierSync {
    pub started: std::time::Instant,
    pub syncfs_calls: u32,
    pub syncfs: std::time::Duration,
    pub held: std::time::Duration,
    pub total: std::time::Duration,
}

/// Syncs kept in a barrier's log (a migration makes a few per thousand files).
const SYNC_LOG_MAX: usize = 4096;

/// What the barrier did (tests, diagnostics, the cost figures).
#[derive(Debug, Default)]
pub struct BarrierCounts {
    /// `syncfs` calls of tiers holding fetched bytes.
    pub data_syncs: std::sync::atomic::AtomicU64,
    /// State syncs (WAL fsyncs, checkpoints) that went through the barrier.
    pub state_syncs: std::sync::atomic::AtomicU64,
    /// State syncs made while some fetched bytes were not known durable (must stay 0).
    pub unordered_state_syncs: std::sync::atomic::AtomicU64,
    /// Nanoseconds spent in data syncs and, separately, with fetch writes held back.
    pub data_sync_ns: std::sync::atomic::AtomicU64,
    pub held_ns: std::sync::atomic::AtomicU64,
}

impl FetchBarrier {
    pub(crate) fn new(tiers: Vec<std::path::PathBuf>, store_wal: std::path::PathBuf) -> Self {
        let marks = Mutex::new(vec![(0, 0); tiers.len()]);
        Self {
            tiers,
            store_wal,
            marks,
            order: std::sync::RwLock::new(()),
            commits_since: std::sync::atomic::AtomicU64::new(0),
            checkpoint_claim: Mutex::new(()),
            background_checkpointers: std::sync::atomic::AtomicUsize::new(0),
            counts: BarrierCounts::default(),
            log: Mutex::new(Vec::new()),
            last_sync: Mutex::new(std::time::Instant::now()),
            #[cfg(test)]
            slow_syncfs_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts one fetch's row commit and tells whether a periodic checkpoint of the
    /// store database is due: [`CHECKPOINT_MIN_COMMITS`] commits since the last sync and
    /// [`CHECKPOINT_INTERVAL`] passed since it, or the store's WAL grew past
    /// [`CHECKPOINT_WAL_BYTES`] ([`CheckpointDue::Hold`] past [`HOLD_WAL_BYTES`]). Every
    /// checkpoint makes all fetched bytes durable first (a `syncfs` of each tier in the
    /// middle of the crawl, which the crawl's writes wait behind), so it bounds the WAL
    /// and what a power loss can take back, not more often than that needs.
    pub fn commit_counted(&self) -> CheckpointDue {
        let n = self
            .commits_since
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        self.due_after(n)
    }

    /// [`FetchBarrier::commit_counted`] without counting a commit (for a background
    /// checkpointer).
    pub fn checkpoint_due(&self) -> CheckpointDue {
        self.due_after(
            self.commits_since
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    fn due_after(&self, commits: u64) -> CheckpointDue {
        if commits == 0 {
            return CheckpointDue::No;
        }
        // One `stat` per fetch: the bound must hold whatever the fetch rate.
        let wal = std::fs::metadata(&self.store_wal).map_or(0, |m| m.len());
        if wal > HOLD_WAL_BYTES {
            return CheckpointDue::Hold;
        }
        if wal >= CHECKPOINT_WAL_BYTES {
            return CheckpointDue::Due;
        }
        if commits < CHECKPOINT_MIN_COMMITS {
            return CheckpointDue::No;
        }
        let since = self
            .last_sync
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed();
        if since >= CHECKPOINT_INTERVAL {
            CheckpointDue::Due
        } else {
            CheckpointDue::No
        }
    }

    /// The syncs made so far (the first [`SYNC_LOG_MAX`]), oldest first.
    pub fn sync_log(&self) -> Vec<BarrierSync> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Held by a fetch from its data write through the commit of its row.
    pub(crate) fn write_guard(&self) -> std::sync::RwLockReadGuard<'_, ()> {
        self.order.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Fetched bytes were written into tier `tier` (after the write, before the row).
    pub(crate) fn mark_dirty(&self, tier: usize) {
        let mut m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = m.get_mut(tier) {
            t.0 += 1;
        }
    }

    /// What this barrier did so far.
    pub fn counts(&self) -> &BarrierCounts {
        &self.counts
    }

    /// Dirty marks so far, summed over the tiers (to tell whether writes arrived).
    fn dirty_marks(&self) -> u64 {
        let m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(dirty, _)| dirty).sum()
    }

    /// `syncfs` of every tier with marks not yet covered; a failed one stays dirty.
    fn sync_dirty(&self, tally: &mut BarrierSync) -> std::io::Result<()> {
        let todo: Vec<(usize, u64)> = {
            let m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
            m.iter()
                .enumerate()
                .filter(|(_, (dirty, synced))| dirty > synced)
                .map(|(i, (dirty, _))| (i, *dirty))
                .collect()
        };
        for (tier, upto) in todo {
            let t = std::time::Instant::now();
            #[cfg(test)]
            std::thread::sleep(std::time::Duration::from_millis(
                self.slow_syncfs_ms
                    .load(std::sync::atomic::Ordering::Relaxed),
            ));
            syncfs(&self.tiers[tier])?;
            tally.syncfs_calls += 1;
            tally.syncfs += t.elapsed();
            self.counts.data_sync_ns.fetch_add(
                t.elapsed().as_nanos() as u64,
                std::sync::atomic::Ordering::Relaxed,
            );
            self.counts
                .data_syncs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
            m[tier].1 = m[tier].1.max(upto);
        }
        Ok(())
    }

    /// Makes every fetched byte written so far durable, then the store's WAL, then runs
    /// `state_sync` (the caller's WAL fsync or checkpoint), with fetch writes held back
    /// from the last data sync through `state_sync`. The bulk of the write-back is done
    /// before fetches are held back, so they stop only for what was written meanwhile.
    pub fn sync_then<T>(
        &self,
        state_sync: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        if FETCH_ORDERING_OFF.load(std::sync::atomic::Ordering::Relaxed) {
            return state_sync();
        }
        let mut tally = BarrierSync {
            started: std::time::Instant::now(),
            syncfs_calls: 0,
            syncfs: std::time::Duration::ZERO,
            held: std::time::Duration::ZERO,
            total: std::time::Duration::ZERO,
        };
        let r = self.sync_then_timed(state_sync, &mut tally);
        tally.total = tally.started.elapsed();
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() < SYNC_LOG_MAX {
            log.push(tally);
        }
        r
    }

    /// [`FetchBarrier::sync_then`]'s work, counted in `tally`.
    fn sync_then_timed<T>(
        &self,
        state_sync: impl FnOnce() -> std::io::Result<T>,
        tally: &mut BarrierSync,
    ) -> std::io::Result<T> {
        // Write back unlocked until a pass finds (almost) nothing new, so the pass with
        // fetch writes held back covers only what arrived during the last one.
        for _ in 0..3 {
            let before = self.dirty_marks();
            self.sync_dirty(tally)?;
            if self.dirty_marks() == before {
                break;
            }
        }
        let _held = self.order.write().unwrap_or_else(|e| e.into_inner());
        let held = std::time::Instant::now();
        let _count_held = Elapsed(held, &self.counts.held_ns);
        self.sync_dirty(tally)?;
        let unordered = {
            let m = self.marks.lock().unwrap_or_else(|e| e.into_inner());
            m.iter().any(|(dirty, synced)| dirty > synced)
        };
        if unordered {
            self.counts
                .unordered_state_syncs
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // The store's rows of those bytes before any other state that relies on them
        // (a migration's completion row must never be durable without its store row).
        match std::fs::File::open(&self.store_wal) {
            Ok(w) => w.sync_data()?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        self.commits_since
            .store(0, std::sync::atomic::Ordering::Relaxed);
        *self.last_sync.lock().unwrap_or_else(|e| e.into_inner()) = std::time::Instant::now();
        self.counts
            .state_syncs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let r = state_sync();
        tally.held = held.elapsed();
        r
    }
}

#[cfg(test)]
mod barrier_schedule_tests {
    use super::*;

    fn barrier(dir: &Path) -> FetchBarrier {
        FetchBarrier::new(vec![dir.to_path_buf()], dir.join("kaiso.db-wal"))
    }

    #[test]
    fn a_checkpoint_is_due_after_enough_commits_and_time_or_wal_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let b = barrier(dir.path());
        let no = CheckpointDue::No;
        // Commits alone, right after a sync: not yet (the WAL is small).
        for _ in 0..CHECKPOINT_MIN_COMMITS * 3 {
            assert_eq!(b.commit_counted(), no);
        }
        // The WAL grown past its checkpoint size: due; past its bound: writers hold.
        let wal = std::fs::File::create(dir.path().join("kaiso.db-wal")).unwrap();
        wal.set_len(CHECKPOINT_WAL_BYTES).unwrap();
        assert_eq!(b.commit_counted(), CheckpointDue::Due);
        assert_eq!(b.checkpoint_due(), CheckpointDue::Due);
        wal.set_len(HOLD_WAL_BYTES + 1).unwrap();
        assert_eq!(b.commit_counted(), CheckpointDue::Hold);
        // A sync resets both; time alone makes it due again once there are commits.
        wal.set_len(0).unwrap();
        b.sync_then(|| Ok(())).unwrap();
        assert_eq!(b.checkpoint_due(), no, "no commit since the sync");
        assert_eq!(b.commit_counted(), no);
        *b.last_sync.lock().unwrap() = std::time::Instant::now() - CHECKPOINT_INTERVAL;
        for _ in 1..CHECKPOINT_MIN_COMMITS - 1 {
            assert_eq!(b.commit_counted(), no, "too few commits");
        }
        assert_eq!(b.commit_counted(), CheckpointDue::Due);
    }

    #[test]
    fn each_sync_is_logged_with_its_syncfs_calls() {
        let dir = tempfile::tempdir().unwrap();
        let b = barrier(dir.path());
        b.sync_then(|| Ok(())).unwrap();
        b.mark_dirty(0);
        b.sync_then(|| Ok(())).unwrap();
        let log = b.sync_log();
        assert_eq!(log.len(), 2);
        assert_eq!(log[0].syncfs_calls, 0, "nothing fetched: no syncfs");
        assert!(
            log[1].syncfs_calls >= 1,
            "fetched bytes: a syncfs of the tier"
        );
        assert!(log[1].started >= log[0].started);
        assert!(log[1].total >= log[1].held);
    }
}

/// Set by [`set_fetch_ordering`]`(false)`: barriers run the state sync alone.
static FETCH_ORDERING_OFF: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Turns the ordering of fetched data before state syncs off (`false`) or on again, in
/// this process: only for measuring what the ordering costs (a benchmark's "before"
/// run). Off, a power loss can leave rows saying present over bytes that never reached
/// the disk.
#[doc(hidden)]
pub fn set_fetch_ordering(on: bool) {
    FETCH_ORDERING_OFF.store(!on, std::sync::atomic::Ordering::Relaxed);
}

/// Adds the time since `.0` to `.1` when dropped.
struct Elapsed<'a>(std::time::Instant, &'a std::sync::atomic::AtomicU64);

impl Drop for Elapsed<'_> {
    fn drop(&mut self) {
        self.1.fetch_add(
            self.0.elapsed().as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// Set by [`set_early_writeback`]`(false)`.
static EARLY_WRITEBACK_OFF: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Turns off (`false`) or on the write-back that each fetch write starts at once while
/// fetched data is ordered (so a barrier's `syncfs` finds little left to write), in this
/// process: only for measuring what it costs. The ordering itself is unchanged (the
/// barrier's `syncfs` then writes back everything fetched since the last one).
#[doc(hidden)]
pub fn set_early_writeback(on: bool) {
    EARLY_WRITEBACK_OFF.store(!on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether a fetch write starts its write-back at once: fetched data is ordered before
/// state syncs (see [`set_fetch_ordering`]) and early write-back is not turned off
/// ([`set_early_writeback`]).
pub(crate) fn fetch_ordering_on() -> bool {
    !FETCH_ORDERING_OFF.load(std::sync::atomic::Ordering::Relaxed)
        && !EARLY_WRITEBACK_OFF.load(std::sync::atomic::Ordering::Relaxed)
}

/// `syncfs(2)` of the file system holding `dir`.
fn syncfs(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = std::fs::File::open(dir)?;
    if unsafe { libc::syncfs(d.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Which backing file a stub row was written for.
///
/// Stub rows are keyed by the store's inode number, derived from the backing file's
/// inode number, which the file system hands out again once the file is gone. A row
/// whose delete was lost (a crash between the unlink of the backing file and the row's
/// durable delete) would otherwise make the next file given that number a stub at the
/// next start. So the row records, at the stub's creation, where its backing file was
/// (tier slot and backing inode number) and a stamp that differs between two files ever
/// given the same inode number: its birth time (`statx`: ext4, xfs, btrfs, tmpfs of
/// recent kernels) or else its inode generation (`FS_IOC_GETVERSION`: ext2/3/4, xfs,
/// btrfs). A file system offering neither records no identity: such rows, and rows
/// from before identities, are trusted as they are. So is a row whose file is found at
/// another slot or backing inode than recorded (the row followed its number). A
/// partial stub moves only when a fetch or a client write finds its tier's file
/// system full; a fetch's move records the new backing file's identity, a client
/// write's spill does not, so such a row is then trusted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BackingIdentity {
    pub slot: u8,
    pub bino: u64,
    pub stamp: Stamp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stamp {
    /// Birth time: seconds, nanoseconds.
    Birth(i64, u32),
    /// Inode generation.
    Generation(u32),
}

impl BackingIdentity {
    /// The identity of open backing file `f` on the tier of slot `slot`; `None` when its
    /// file system offers no stamp.
    pub(crate) fn of_file(f: &std::fs::File, slot: u8) -> Option<Self> {
        use std::os::fd::AsRawFd;
        let (bino, birth) = statx_birth(f.as_raw_fd(), c"", libc::AT_EMPTY_PATH)?;
        let stamp = match birth {
            Some((s, ns)) => Stamp::Birth(s, ns),
            None => Stamp::Generation(generation(f)?),
        };
        Some(Self { slot, bino, stamp })
    }

    /// The stamp of the backing file at `path` made the way `self`'s was, with its
    /// inode number; `None` when it cannot be read (then nothing can be told).
    pub(crate) fn current(&self, path: &Path) -> Option<(u64, Stamp)> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
        match self.stamp {
            Stamp::Birth(..) => {
                let (bino, birth) = statx_birth(libc::AT_FDCWD, &c, libc::AT_SYMLINK_NOFOLLOW)?;
                birth.map(|(s, ns)| (bino, Stamp::Birth(s, ns)))
            }
            Stamp::Generation(_) => {
                use std::os::unix::fs::OpenOptionsExt;
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOATIME)
                    .open(path)
                    .or_else(|_| {
                        // O_NOATIME is refused on files the caller does not own.
                        std::fs::OpenOptions::new()
                            .read(true)
                            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                            .open(path)
                    })
                    .ok()?;
                let st = crate::util::fstat(&f).ok()?;
                Some((st.st_ino, Stamp::Generation(generation(&f)?)))
            }
        }
    }

    /// Whether the backing file at `path` is certainly another file than the one this
    /// identity was taken of (same place, another stamp).
    pub(crate) fn replaced_at(&self, slot: u8, bino: u64, path: &Path) -> bool {
        if (slot, bino) != (self.slot, self.bino) {
            return false;
        }
        match self.current(path) {
            Some((now_bino, stamp)) => now_bino == self.bino && stamp != self.stamp,
            None => false,
        }
    }

    /// As stored: a kind byte, the slot, the backing inode number, the stamp.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(22);
        match self.stamp {
            Stamp::Birth(..) => b.push(b'b'),
            Stamp::Generation(_) => b.push(b'g'),
        }
        b.push(self.slot);
        b.extend_from_slice(&self.bino.to_le_bytes());
        match self.stamp {
            Stamp::Birth(s, ns) => {
                b.extend_from_slice(&s.to_le_bytes());
                b.extend_from_slice(&ns.to_le_bytes());
            }
            Stamp::Generation(g) => b.extend_from_slice(&g.to_le_bytes()),
        }
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<Self> {
        let (&kind, rest) = b.split_first()?;
        let (&slot, rest) = rest.split_first()?;
        let bino = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
        let rest = &rest[8..];
        let stamp = match (kind, rest.len()) {
            (b'b', 12) => Stamp::Birth(
                i64::from_le_bytes(rest[..8].try_into().ok()?),
                u32::from_le_bytes(rest[8..].try_into().ok()?),
            ),
            (b'g', 4) => Stamp::Generation(u32::from_le_bytes(rest.try_into().ok()?)),
            _ => return None,
        };
        Some(Self { slot, bino, stamp })
    }
}

/// `statx` of (`dirfd`, `path`, `flags`): inode number and birth time, if the file
/// system reports one.
fn statx_birth(
    dirfd: libc::c_int,
    path: &std::ffi::CStr,
    flags: libc::c_int,
) -> Option<(u64, Option<(i64, u32)>)> {
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_INO | libc::STATX_BTIME;
    if unsafe { libc::statx(dirfd, path.as_ptr(), flags, mask, &mut stx) } != 0 {
        return None;
    }
    let birth = (stx.stx_mask & libc::STATX_BTIME != 0)
        .then_some((stx.stx_btime.tv_sec, stx.stx_btime.tv_nsec));
    Some((stx.stx_ino, birth))
}

/// The inode generation of `f` (`FS_IOC_GETVERSION`), if its file system has one.
fn generation(f: &std::fs::File) -> Option<u32> {
    use std::os::fd::AsRawFd;
    // The kernel writes an int whatever the request's encoded size says.
    let mut g: libc::c_int = 0;
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETVERSION, &mut g) } != 0 {
        return None;
    }
    Some(g as u32)
}

/// Removes `[start, end)` from a sorted, disjoint set of missing ranges; returns whether
/// anything was removed.
pub(crate) fn subtract(missing: &mut Vec<(u64, u64)>, start: u64, end: u64) -> bool {
    if missing.iter().all(|&(s, e)| e <= start || s >= end) {
        return false;
    }
    let mut out = Vec::with_capacity(missing.len() + 1);
    for &(s, e) in missing.iter() {
        if e <= start || s >= end {
            out.push((s, e));
            continue;
        }
        if s < start {
            out.push((s, start));
        }
        if e > end {
            out.push((end, e));
        }
    }
    *missing = out;
    true
}

/// The parts of `[start, end)` that are missing.
pub(crate) fn missing_within(missing: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    missing
        .iter()
        .filter(|(s, e)| *e > start && *s < end)
        .map(|(s, e)| ((*s).max(start), (*e).min(end)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn range_arithmetic() {
        let mut m = vec![(0, 100)];
        assert!(subtract(&mut m, 10, 20));
        assert_eq!(m, vec![(0, 10), (20, 100)]);
        assert_eq!(missing_within(&m, 5, 30), vec![(5, 10), (20, 30)]);
        // Nothing missing there: no change reported (no stub state to make durable).
        assert!(!subtract(&mut m, 10, 20));
        assert_eq!(m, vec![(0, 10), (20, 100)]);
        assert!(subtract(&mut m, 0, 1000));
        assert!(m.is_empty());
    }

    #[test]
    fn dir_fill_gate_serialises_per_directory_and_allows_reentry() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let gate = Arc::new(DirFillGate::new());
        let g = gate.enter(7).expect("first entry");
        assert!(gate.enter(7).is_none(), "re-entry on the same thread");
        let other = gate.enter(8).expect("another directory is independent");
        drop(other);
        let entered = Arc::new(AtomicUsize::new(0));
        let t = {
            let (gate, entered) = (gate.clone(), entered.clone());
            std::thread::spawn(move || {
                let _g = gate.enter(7).expect("other thread waits, then enters");
                entered.fetch_add(1, Ordering::SeqCst);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(entered.load(Ordering::SeqCst), 0, "waits while 7 is filled");
        drop(g);
        t.join().unwrap();
        assert_eq!(entered.load(Ordering::SeqCst), 1);
        assert_eq!(gate.busy(), 0);
        assert!(gate.enter(7).is_some(), "free again after the guard");
    }
}

#[cfg(test)]
mod identity_tests {
    use super::{BackingIdentity, Stamp};

    #[test]
    fn a_backing_identity_tells_its_file_from_another_at_the_same_place() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let f = std::fs::File::create(&p).unwrap();
        let Some(id) = BackingIdentity::of_file(&f, 3) else {
            eprintln!("skipped: the temporary directory's file system offers no stamp");
            return;
        };
        let bino = crate::util::fstat(&f).unwrap().st_ino;
        assert_eq!((id.slot, id.bino), (3, bino));
        assert_eq!(BackingIdentity::decode(&id.encode()), Some(id));
        assert!(!id.replaced_at(3, bino, &p), "the same file");
        // Another file at the same place (as one reusing the number would be).
        let other = BackingIdentity {
            stamp: match id.stamp {
                Stamp::Birth(s, ns) => Stamp::Birth(s - 1, ns),
                Stamp::Generation(g) => Stamp::Generation(g.wrapping_add(1)),
            },
            ..id
        };
        assert!(other.replaced_at(3, bino, &p));
        // Elsewhere (another tier or backing inode): not checked.
        assert!(!other.replaced_at(4, bino, &p));
        assert!(!other.replaced_at(3, bino + 1, &p));
        // Unreadable now: nothing can be told.
        std::fs::remove_file(&p).unwrap();
        assert!(!other.replaced_at(3, bino, &p));
        assert_eq!(BackingIdentity::decode(b"x"), None);
        assert_eq!(BackingIdentity::decode(&[b'b', 3, 0, 0]), None);
    }
}
