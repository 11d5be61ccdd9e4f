//! Data operations of the [`Store`]: open/create, read/write, truncate, fallocate, lseek,
//! fsync, release; the migration stub API; access recording.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

use crate::error::{FsError, FsResult};
use crate::handles::{FILLER_TOUCHED, FileState, Handle, STUB_ROW_CHANGED};
use crate::store::Store;
use crate::stub::{CheckpointDue, FetchBarrier, StubEntry, StubState};
use crate::types::{Caller, FileAttr, FileKind, Ino, Opened};
use crate::util;
use kaiso_policy::{Op, TierState};
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// Flags the backing file is opened with: access mode widened to read-write (the kernel
/// may read through a write-only handle for mmap), append/sync kept, creation flags dropped.
fn backing_flags(flags: i32) -> i32 {
    let keep = libc::O_APPEND | libc::O_SYNC | libc::O_DSYNC | libc::O_NOATIME;
    let acc = if flags & libc::O_ACCMODE == libc::O_RDONLY {
        libc::O_RDONLY
    } else {
        libc::O_RDWR
    };
    acc | (flags & keep)
}

/// A test hook of [`Store::stub_write`] ([`Store::set_stub_resolve_hook`]).
type StubResolveHook = std::rc::Rc<dyn Fn(Ino)>;

thread_local! {
    /// Stub rows of a [`Store::stub_batch`] under way on this thread.
    static STUB_ROWS: std::cell::RefCell<Option<Vec<crate::db::StubRow>>> =
        const { std::cell::RefCell::new(None) };
    /// A test hook of [`Store::stub_write`] on this thread ([`Store::set_stub_resolve_hook`]).
    static STUB_RESOLVE_HOOK: std::cell::RefCell<Option<StubResolveHook>> =
        const { std::cell::RefCell::new(None) };
    /// Whether this thread's accesses are not a client's ([`Store::mark_background_thread`]).
    static BACKGROUND_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// How an open is served by the kernel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IoMode {
    /// Through kaiso, with the kernel page cache.
    Cached,
    /// Kernel passthrough to the backing file.
    Passthrough,
}

/// A write the kernel did to a passthrough file, as its backing file shows it.
struct KernelWrite {
    /// Where the growth starts (the size before); the offset of an overwrite is unknown.
    offset: u64,
    /// Bytes the file grew by (0 for an overwrite in place).
    len: u64,
    /// The size after.
    size: u64,
}

impl KernelWrite {
    /// The writes two handles of one file show, as one.
    fn merge(a: Option<KernelWrite>, b: Option<KernelWrite>) -> Option<KernelWrite> {
        match (a, b) {
            (Some(a), Some(b)) => Some(KernelWrite {
                offset: a.offset.min(b.offset),
                len: a.len + b.len,
                size: a.size.max(b.size),
            }),
            (a, b) => a.or(b),
        }
    }
}

/// A sequential pass over a file through passthrough is assumed to read at least this
/// many bytes per second (a slow disk's streaming rate); see `record_passthrough_use`.
const SCAN_RATE: u64 = 100 << 20;

/// Whether a backing file was modified within the last `PASSTHROUGH_CHECK`.
fn modified_lately(s: &libc::stat) -> bool {
    let mtime = std::time::Duration::new(
        s.st_mtime.max(0) as u64,
        s.st_mtime_nsec.clamp(0, 999_999_999) as u32,
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    now.saturating_sub(mtime) <= crate::store::PASSTHROUGH_CHECK
}

pub(crate) fn open_backing(path: &Path, bflags: i32) -> std::io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if bflags & libc::O_ACCMODE == libc::O_RDWR {
        o.write(true);
    }
    o.custom_flags(bflags & !libc::O_ACCMODE & !libc::O_NOATIME);
    o.open(path)
}

impl Store {
    pub(crate) fn handle(&self, fh: u64) -> Option<Arc<Handle>> {
        self.handles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
    }

    fn handle_or_badf(&self, fh: u64) -> FsResult<Arc<Handle>> {
        self.handle(fh).ok_or(FsError::BADF)
    }

    pub(crate) fn tier_states(&self) -> Vec<TierState> {
        self.tiers
            .iter()
            .map(|t| TierState {
                capacity: t.capacity(),
                used: t.used(),
                high_watermark: t.cfg.high_watermark,
                low_watermark: t.cfg.low_watermark,
                busy: t.busy(),
            })
            .collect()
    }

    /// Count an access: per-tier counters, the policy, the trace.
    /// Nothing is counted on a background thread (the crawler's fetches are no accesses).
    pub(crate) fn record(&self, ino: Ino, tier: u8, op: Op, offset: u64, len: u64, size: u64) {
        if on_background_thread() {
            return;
        }
        self.count_access(
            ino,
            tier,
            op,
            offset,
            len,
            size,
            matches!(op, Op::Read | Op::Write),
        );
    }

    /// [`Self::record`] on any thread; `request`: the access counts on the tier's access
    /// counters (`kaiso status`).
    #[allow(clippy::too_many_arguments)]
    fn count_access(
        &self,
        ino: Ino,
        tier: u8,
        op: Op,
        offset: u64,
        len: u64,
        size: u64,
        request: bool,
    ) {
        let now = self.now();
        if let Some(t) = self.tiers.get(tier as usize) {
            if request {
                t.accesses.fetch_add(1, Ordering::Relaxed);
                t.fg_bytes.fetch_add(len, Ordering::Relaxed);
            }
        }
        self.ops.fetch_add(1, Ordering::Relaxed);
        self.placer().record(now, ino, op, offset, len, size);
        if self.trace.lock().map(|t| t.is_some()).unwrap_or(false) {
            let path = self.ns().path_of(ino).unwrap_or_default();
            self.trace_event(now, ino, op, offset, len, size, &path);
        }
    }

    fn register_handle(
        &self,
        state: &Arc<FileState>,
        file: File,
        flags: i32,
        mode: IoMode,
        reserved: u64,
    ) -> u64 {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let passthrough = mode == IoMode::Passthrough;
        let h = Arc::new(Handle {
            state: state.clone(),
            file: std::sync::RwLock::new(Arc::new(file)),
            flags: backing_flags(flags),
            writable,
            passthrough: std::sync::atomic::AtomicBool::new(passthrough),
            reserved: std::sync::atomic::AtomicU64::new(reserved),
            reserve_tier: state.tier(),
        });
        if passthrough {
            state.passthrough_open.fetch_add(1, Ordering::SeqCst);
        }
        state
            .handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(&h));
        let fh = self.fh();
        self.handles
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(fh, h);
        fh
    }

    /// How a new open of this inode is served, and the room (bytes, already added to the
    /// tier's usage) a passthrough writer holds for its growth.
    ///
    /// - Readers of a resident file on a non-emulated tier that no one else has open:
    ///   passthrough.
    /// - Writers likewise, but only while their tier can set `passthrough_write_reserve`
    ///   bytes aside under its hard capacity (usage and other writers' reserves counted).
    ///   The kernel then writes without kaiso: the reserve is the growth that cannot break
    ///   the capacity; growth is accounted when the writer closes and every second
    ///   meanwhile (`check_passthrough_writers`, which also tops the reserve up). Writers
    ///   that find no such room go through kaiso, which spills to another tier when full.
    /// - The kernel allows only passthrough opens of an inode while one is open (any
    ///   other open fails with EIO, and a different backing file with EBUSY), so any open
    ///   arriving while passthrough handles are open is passthrough too, on the same
    ///   backing file (a writer joining that way holds no reserve). An open arriving
    ///   while handles served through kaiso are open is served through kaiso.
    /// - A file whose planned move waits for its passthrough handles to close
    ///   ([`FileState::move_waiting`]) is served through kaiso as soon as none is open,
    ///   so a file that readers keep re-opening drains its passthrough handles and moves
    ///   (the mover re-points handles served through kaiso).
    ///
    /// The store's view of open handles is never smaller than the kernel's (the kernel
    /// closes first), so these choices never contradict the kernel's state.
    fn io_mode(&self, state: &FileState, want: bool, writable: bool) -> (IoMode, u64) {
        let open = state.open_handles();
        let tier = state.tier();
        let any_pt = open.iter().any(|h| h.is_passthrough());
        if any_pt && want {
            // A writer joining passthrough opens must be passthrough too (kernel rule),
            // whatever room there is. It takes no reserve: on a nearly full tier that
            // would starve every other writer. Its growth is accounted every second and
            // when it closes.
            return (IoMode::Passthrough, 0);
        }
        let eligible = want
            && open.is_empty()
            && !state.move_waiting.load(Ordering::Acquire)
            && self.cfg.passthrough
            && !self.tiers[tier as usize].emulated()
            && !state
                .stub
                .lock()
                .map(|s| s.as_ref().is_some_and(|s| !s.is_complete()))
                .unwrap_or(true);
        if !eligible {
            return (IoMode::Cached, 0);
        }
        if !writable {
            return (IoMode::Passthrough, 0);
        }
        let need = self.cfg.passthrough_write_reserve;
        if self.cfg.passthrough_writes && self.reserve(tier, need) {
            (IoMode::Passthrough, need)
        } else {
            (IoMode::Cached, 0)
        }
    }

    /// Give back the room a handle holds for passthrough growth.
    fn release_reserve(&self, h: &Handle) {
        let r = h.reserved.swap(0, Ordering::AcqRel);
        if r > 0 {
            self.tiers[h.reserve_tier as usize].add_used(-(r as i64));
        }
    }

    /// Bring a passthrough writer's growth (the kernel wrote without kaiso) into the size
    /// and tier accounting; the growth uses up the handle's reserve first. With `top_up`,
    /// the reserve is then refilled from the tier's room as far as it goes.
    /// Returns the write the kernel did since the last check, if the backing file shows
    /// one: it grew, or its modification time lies within the last `PASSTHROUGH_CHECK`.
    /// Call with the file's gate held shared.
    fn account_passthrough_writer(&self, h: &Handle, top_up: bool) -> Option<KernelWrite> {
        let st = &h.state;
        let Ok(s) = util::fstat(&h.file()) else {
            return None;
        };
        let new = s.st_size as u64;
        let mut seen = None;
        {
            // Under the namespace lock, so an unlink (which takes the accounted size off
            // the tier) sees either the old size and no growth counted, or both.
            let ns = self.ns();
            // An unlinked file still counts on its tier while it is open.
            let linked = ns.files.get(&st.ino).is_some_and(|f| !f.names.is_empty())
                || st.counted_unlinked.load(Ordering::Acquire);
            let old = st.size.swap(new, Ordering::AcqRel);
            if new != old {
                // Makes a copy in progress start over.
                st.write_gen.fetch_add(1, Ordering::AcqRel);
            }
            if new > old || modified_lately(&s) {
                seen = Some(KernelWrite {
                    offset: old.min(new),
                    len: new.saturating_sub(old),
                    size: new,
                });
            }
            if linked {
                let growth = new as i64 - old as i64;
                let mut consumed = 0u64;
                if growth > 0 {
                    let _ = h
                        .reserved
                        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                            consumed = r.min(growth as u64);
                            Some(r - consumed)
                        });
                }
                self.tiers[st.tier() as usize].add_used(growth - consumed as i64);
            }
        }
        if top_up {
            // All or nothing: a writer never takes a tier's last scraps of room (joined
            // writers, which hold no reserve, then never take any).
            let want = self
                .cfg
                .passthrough_write_reserve
                .saturating_sub(h.reserved.load(Ordering::Acquire));
            if want > 0 && self.reserve(h.reserve_tier, want) {
                h.reserved.fetch_add(want, Ordering::AcqRel);
            }
        }
        seen
    }

    /// Give the policy, the trace and the tier's counters one check interval's use of a
    /// file open through passthrough (the kernel serves its reads and writes without
    /// kaiso, so this is all they learn of them), in use for `streak` intervals in a row,
    /// and the write the backing file shows (`written`), if any.
    ///
    /// The use is one touch, recorded as an `Open` access (the policy weighs it as a fresh
    /// open; a read would continue the open's episode and add no heat) once the file has
    /// been in use longer than one sequential pass over it at `SCAN_RATE` would take;
    /// until then as a `read` of 0 bytes, which keeps its recency but adds no heat. So a
    /// file used again and again (a database, an image, a log) gets hotter each second,
    /// while one read once from end to end (`cp`, backups) counts as the one open it was,
    /// as through kaiso (docs/policy-default.md).
    ///
    /// `streak` None: the check sees the file open for the first time and no use yet (its
    /// watch is armed only now). It gets the 0-byte read alone, not counted on the tier:
    /// the open's episode goes on (the use the next check sees continues it, as a read
    /// through kaiso would) instead of ending before any use could be seen.
    fn record_passthrough_use(
        &self,
        st: &FileState,
        written: Option<KernelWrite>,
        streak: Option<u32>,
    ) {
        let linked = {
            let ns = self.ns();
            ns.files.get(&st.ino).is_some_and(|f| !f.names.is_empty())
        };
        if !linked {
            // Unlinked: the policy has forgotten it, and must not learn of it again.
            return;
        }
        let tier = st.tier();
        let size = st.size.load(Ordering::Acquire);
        let Some(streak) = streak else {
            self.count_access(st.ino, tier, Op::Read, 0, 0, size, false);
            return;
        };
        let in_use = crate::store::PASSTHROUGH_CHECK.as_secs_f64() * f64::from(streak);
        let op = if in_use * SCAN_RATE as f64 > size as f64 {
            Op::Open
        } else {
            Op::Read
        };
        self.count_access(st.ino, tier, op, 0, 0, size, true);
        if let Some(w) = written {
            self.count_access(st.ino, tier, Op::Write, w.offset, w.len, w.size, false);
        }
    }

    /// Account the growth of every open passthrough writer and top up its reserve, and
    /// record the use of every file open through passthrough. The store runs this every
    /// `PASSTHROUGH_CHECK` while open.
    ///
    /// Use is what the kernel shows: a one-shot inotify watch on each such backing file,
    /// armed at every check, reports whether the kernel read or wrote it since (only the
    /// first access of each interval costs the kernel an event); a writer's growth or
    /// fresh modification time counts too. A file that is open but idle gets no touch.
    /// Where no watch can be set (inotify unavailable, watch limit reached) each check
    /// the file stays open counts as one touch.
    pub fn check_passthrough_writers(&self) {
        let open: Vec<Arc<Handle>> = self
            .handles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|h| h.is_passthrough())
            .cloned()
            .collect();
        let mut files: std::collections::BTreeMap<Ino, (Arc<Handle>, Option<KernelWrite>)> =
            Default::default();
        for h in open {
            let written = {
                let _g = h.state.gate.read().unwrap_or_else(|e| e.into_inner());
                if !h.is_passthrough() {
                    continue;
                }
                if h.writable {
                    self.account_passthrough_writer(&h, true)
                } else {
                    None
                }
            };
            let e = files
                .entry(h.state.ino)
                .or_insert_with(|| (h.clone(), None));
            e.1 = KernelWrite::merge(e.1.take(), written);
        }
        let fds: Vec<(Ino, Arc<File>)> = files.iter().map(|(i, (h, _))| (*i, h.file())).collect();
        let seen = use_watch::seen_and_rearm(self as *const Store as usize, &fds);
        drop(fds);
        let used = |ino: &Ino, written: &Option<KernelWrite>| {
            written.is_some() || seen.used.contains(ino) || seen.unwatched.contains(ino)
        };
        let in_use: Vec<Ino> = files
            .iter()
            .filter(|(ino, (_, w))| used(ino, w))
            .map(|(ino, _)| *ino)
            .collect();
        let streaks = use_watch::streaks(self as *const Store as usize, in_use.iter());
        for (ino, (h, written)) in files {
            if used(&ino, &written) {
                let streak = streaks.get(&ino).copied().unwrap_or(1);
                self.record_passthrough_use(&h.state, written, Some(streak));
            } else if seen.first_seen.contains(&ino) {
                self.record_passthrough_use(&h.state, None, None);
            }
        }
    }

    /// Room held for passthrough writers, per tier (bytes included in the tiers' usage).
    pub(crate) fn passthrough_reserved(&self) -> Vec<u64> {
        let mut r = vec![0u64; self.tiers.len()];
        for h in self
            .handles
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            if let Some(v) = r.get_mut(h.reserve_tier as usize) {
                *v += h.reserved.load(Ordering::Acquire);
            }
        }
        r
    }

    /// The face could not hand `fh` to the kernel for passthrough and serves it through
    /// kaiso instead (the kernel then treats the open as a cached one).
    pub fn passthrough_refused(&self, fh: u64) {
        if let Some(h) = self.handle(fh) {
            let _g = h.state.gate.read().unwrap_or_else(|e| e.into_inner());
            if h.passthrough.swap(false, Ordering::AcqRel) {
                h.state.passthrough_open.fetch_sub(1, Ordering::SeqCst);
            }
            // Served through kaiso now: its writes reserve room one by one.
            self.release_reserve(&h);
        }
    }

    fn opened(&self, fh: u64, mode: IoMode) -> Opened {
        let pt = if mode == IoMode::Passthrough {
            self.handle(fh).map(|h| h.file())
        } else {
            None
        };
        Opened {
            fh,
            passthrough: pt,
            direct_io: false,
        }
    }

    /// Open file `ino`. `want_passthrough`: the face can hand the backing file to the kernel.
    pub fn open_file(&self, ino: Ino, flags: i32, want_passthrough: bool) -> FsResult<Opened> {
        let ns = self.ns();
        if ns.is_dir(ino) {
            return Err(FsError::ISDIR);
        }
        let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
        let state = f.state.clone();
        let tier = f.tier;
        if f.kind != FileKind::File {
            // Opening a FIFO blocks until a peer opens it (a device may block too): never
            // while holding the namespace lock.
            let (kind, bino) = (f.kind, f.bino);
            let path = ns
                .file_path(ino)
                .map(|p| self.tiers[tier as usize].backing(&p))
                .ok_or(FsError::NOENT)?;
            drop(ns);
            return self.open_special(&state, kind, tier, bino, &path, flags);
        }
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (mode, reserved) = self.io_mode(&state, want_passthrough, writable);
        // An unlinked file still open elsewhere is reopened through that descriptor. The
        // handle is kept until the open is done: a concurrent release could otherwise
        // close the descriptor, and its number be reused for another file, in between.
        let mut reopen_through = None;
        let path = match ns.file_path(ino) {
            Some(p) => self.tiers[tier as usize].backing(&p),
            None => match state.open_handles().first().cloned() {
                Some(h) => {
                    let fd = std::os::unix::io::AsRawFd::as_raw_fd(&*h.file());
                    reopen_through = Some(h);
                    crate::tier::BackingPath::from(std::path::PathBuf::from(format!(
                        "/proc/self/fd/{fd}"
                    )))
                }
                None => return Err(FsError::NOENT),
            },
        };
        // The kernel binds one backing file to an inode for all its passthrough opens, and a
        // writer may join readers later (see `io_mode`): so a passthrough backing file is
        // opened read-write when it can be.
        let file = if mode == IoMode::Passthrough {
            let keep = backing_flags(flags) & !libc::O_ACCMODE;
            open_backing(&path, libc::O_RDWR | keep)
                .or_else(|_| open_backing(&path, backing_flags(flags)))
        } else {
            open_backing(&path, backing_flags(flags))
        };
        drop(reopen_through);
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                self.tiers[tier as usize].add_used(-(reserved as i64));
                return Err(e.into());
            }
        };
        let fh = self.register_handle(&state, file, flags, mode, reserved);
        drop(ns);
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            self.truncate(ino, 0, Some(fh))?;
        }
        self.record(
            ino,
            tier,
            Op::Open,
            0,
            0,
            state.size.load(Ordering::Relaxed),
        );
        Ok(self.opened(fh, mode))
    }

    /// Open a FIFO, socket or device node (the caller has dropped the namespace lock, so
    /// a FIFO waiting for its peer blocks nothing else). The access mode and O_NONBLOCK
    /// are kept as asked: a FIFO's semantics depend on them.
    fn open_special(
        &self,
        state: &Arc<FileState>,
        kind: FileKind,
        tier: u8,
        bino: u64,
        path: &Path,
        flags: i32,
    ) -> FsResult<Opened> {
        let acc = flags & libc::O_ACCMODE;
        let file = std::fs::OpenOptions::new()
            .read(acc != libc::O_WRONLY)
            .write(acc != libc::O_RDONLY)
            .custom_flags(flags & libc::O_NONBLOCK)
            .open(path)?;
        // The name may have been renamed or replaced while unlocked.
        let st = util::fstat(&file)?;
        if st.st_ino != bino || FileKind::from_mode(st.st_mode) != kind {
            return Err(FsError::NOENT);
        }
        let fh = self.register_handle(state, file, flags, IoMode::Cached, 0);
        self.record(state.ino, tier, Op::Open, 0, 0, 0);
        Ok(self.opened(fh, IoMode::Cached))
    }

    /// Create and open a regular file (O_CREAT|O_EXCL semantics: fails if the name exists).
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        caller: Caller,
        want_passthrough: bool,
    ) -> FsResult<(FileAttr, Opened)> {
        self.fill_dir_if_stub(parent)?;
        let mut ns = self.ns();
        let new = self.creation_mode(&ns, parent, mode, umask);
        let (m, set) = (new.bits, new.chmod_after);
        let bflags = backing_flags(flags);
        let (ino, _tier, file, st) =
            self.create_entry(&mut ns, parent, name, caller, new.fs_umask, &|p| {
                let mut o = std::fs::OpenOptions::new();
                o.read(true).write(true).create_new(true).mode(m);
                o.custom_flags(bflags & !libc::O_ACCMODE & !libc::O_NOATIME);
                let f = o.open(p)?;
                if set {
                    util::chmod(p, m)?;
                }
                Ok(Some(f))
            })?;
        let file = file.ok_or(FsError::IO)?;
        let state = ns
            .files
            .get(&ino)
            .map(|f| f.state.clone())
            .ok_or(FsError::IO)?;
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (mode, reserved) = self.io_mode(&state, want_passthrough, writable);
        let fh = self.register_handle(&state, file, flags, mode, reserved);
        let attr = Self::attr_of(ino, &st);
        self.add_lookup(&mut ns, ino, 1);
        Ok((attr, self.opened(fh, mode)))
    }

    /// Bring missing stub ranges of `[start, end)` in through the filler.
    pub(crate) fn fill_range(&self, state: &FileState, start: u64, end: u64) -> FsResult<()> {
        if end <= start || state.missing(start, end).is_empty() {
            return Ok(());
        }
        let Some(filler) = self.stub_filler() else {
            return Err(FsError::IO);
        };
        let _g = state.fill.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.ns().path_of(state.ino).unwrap_or_default();
        for (s, e) in state.missing(start, end) {
            let r = filler.fill_range(self, state.ino, &path, s, e - s);
            // The filler's own state of the file may have changed, even on failure.
            state.mark_unsynced(FILLER_TOUCHED);
            r?;
        }
        if !state.missing(start, end).is_empty() {
            return Err(FsError::IO);
        }
        Ok(())
    }

    /// Read up to `size` bytes at `offset`.
    pub fn read(&self, fh: u64, offset: u64, size: u32) -> FsResult<Vec<u8>> {
        let h = self.handle_or_badf(fh)?;
        let st = &h.state;
        let fsize = st.size.load(Ordering::Relaxed);
        self.fill_range(st, offset, (offset + size as u64).min(fsize))?;
        let (n, tier, buf) = {
            let _g = st.gate.read().unwrap_or_else(|e| e.into_inner());
            let mut buf = vec![0u8; size as usize];
            let n = util::pread_full(&h.file(), &mut buf, offset)?;
            buf.truncate(n);
            (n, st.tier(), buf)
        };
        self.tiers[tier as usize].emulate(st.ino, offset, n as u64, false);
        self.record(st.ino, tier, Op::Read, offset, n as u64, fsize);
        Ok(buf)
    }

    /// Reserve `bytes` on a tier without passing its hard capacity.
    pub(crate) fn reserve(&self, tier: u8, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let t = &self.tiers[tier as usize];
        t.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                if u.saturating_add(bytes) <= t.capacity() {
                    Some(u + bytes)
                } else {
                    None
                }
            })
            .is_ok()
    }

    /// Tries of a write, truncate or fallocate that spills its file ([`Store::spill`]):
    /// each try after the first follows a move of the file (or the end of one in flight),
    /// so files that moves keep bringing back to a full tier (an operator's promotions)
    /// still get their write in; past this many the write fails with ENOSPC.
    const SPILL_ATTEMPTS: u32 = 32;

    /// A write or extension needs `need` bytes for the whole file: move it to another tier
    /// with room (slower ones first) instead of failing with ENOSPC. Returns Ok once the
    /// caller should try again on the tier the file is on by then.
    ///
    /// - A tier that fills before the move reserved room there is passed over for the
    ///   next one with room.
    /// - A file being moved already (the planner's move, an operator's, another writer's
    ///   spill) is not moved twice: the spill waits for that move, which then finishes
    ///   its copy unpaced ([`Store::wait_for_move`]), and the caller tries again where
    ///   the file landed (spilling again if it does not fit there either).
    /// - ENOSPC only when no tier has room for the file; never EBUSY (`write(2)` of a
    ///   regular file does not return it).
    ///
    /// A file that has no name left (unlinked while open) moves too: the mover copies it
    /// from an open descriptor into the other tier's orphan directory (`orphan.rs`).
    pub(crate) fn spill(&self, ino: Ino, from: u8, need: u64) -> FsResult<()> {
        let n = self.tiers.len() as u8;
        let reason = format!(
            "spilled: tier {} is full",
            self.tiers[from as usize].cfg.name
        );
        for t in (from + 1..n).chain(0..from) {
            if !self.tiers[t as usize].fits(need) {
                continue;
            }
            let mut tries = 0;
            loop {
                // A partially fetched stub moves too (its missing ranges go with it).
                let moved = crate::mover::allowing_partial_stub_move(|| {
                    self.move_file(ino, t, &reason, need)
                });
                match moved {
                    Ok(_) => return Ok(()),
                    Err(e) if e.in_flight() => {
                        self.wait_for_move(ino);
                        return Ok(());
                    }
                    // Filled meanwhile (by other writers or moves): the next tier.
                    Err(e) if e.errno() == FsError::NOSPC => break,
                    // Its last name went during the copy: the next try moves it as a
                    // file with no name (it fails alike if no handle holds it either).
                    // A rename during the copy (EBUSY) is tried again likewise.
                    Err(e)
                        if (e.errno() == FsError::NOENT || e.errno() == FsError::BUSY)
                            && tries < 2 =>
                    {
                        tries += 1
                    }
                    Err(e) if e.errno() == FsError::BUSY => {
                        // The file cannot move now (open through kernel passthrough by
                        // another process): the write finds no room.
                        tracing::warn!(ino, to = t, error = %e, "{reason}: file not movable");
                        return Err(FsError::NOSPC);
                    }
                    Err(e) => return Err(e.errno()),
                }
            }
        }
        Err(FsError::NOSPC)
    }

    /// Write `data` at `offset` (appends when the file was opened O_APPEND).
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> FsResult<u32> {
        let h = self.handle_or_badf(fh)?;
        let st = &h.state;
        let append = h.flags & libc::O_APPEND != 0;
        {
            let fsize = st.size.load(Ordering::Relaxed);
            // Partial blocks of unfetched ranges must be fetched before being overwritten.
            self.fill_range(st, offset, (offset + data.len() as u64).min(fsize))?;
        }
        for _attempt in 0..Self::SPILL_ATTEMPTS {
            let g = st.gate.read().unwrap_or_else(|e| e.into_inner());
            // Under the gate, with the write: a fetch restores a stub's mtime only while
            // holding the gate exclusively (`stub_write`), so never over this write.
            self.stub_client_change(st)?;
            let tier = st.tier();
            let size = st.size.load(Ordering::Acquire);
            let start = if append { size } else { offset };
            let end = start + data.len() as u64;
            let growth = end.saturating_sub(size);
            if !self.reserve(tier, growth) {
                drop(g);
                self.spill(st.ino, tier, end.max(size))?;
                continue;
            }
            let file = h.file();
            let r = if append {
                use std::io::Write;
                (&*file).write_all(data)
            } else {
                file.write_all_at(data, offset)
            };
            if let Err(e) = r {
                self.tiers[tier as usize].add_used(-(growth as i64));
                if e.raw_os_error() == Some(libc::ENOSPC) || e.raw_os_error() == Some(libc::EDQUOT)
                {
                    drop(g);
                    self.spill(st.ino, tier, end.max(size))?;
                    continue;
                }
                return Err(e.into());
            }
            let prev = st.size.fetch_max(end, Ordering::AcqRel);
            // Another writer may have grown the file meanwhile: give back what we over-reserved.
            let actual = end.saturating_sub(prev);
            if actual < growth {
                self.tiers[tier as usize].add_used(-((growth - actual) as i64));
            }
            st.write_gen.fetch_add(1, Ordering::AcqRel);
            if let Some(s) = st.stub.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                if crate::stub::subtract(&mut s.missing, start, end) {
                    st.mark_unsynced(STUB_ROW_CHANGED);
                }
            }
            drop(g);
            self.tiers[tier as usize].emulate(st.ino, start, data.len() as u64, true);
            self.record(
                st.ino,
                tier,
                Op::Write,
                start,
                data.len() as u64,
                end.max(size),
            );
            return Ok(data.len() as u32);
        }
        Err(FsError::NOSPC)
    }

    /// Truncate or extend file `ino` (through `fh` when given).
    pub(crate) fn truncate(&self, ino: Ino, size: u64, fh: Option<u64>) -> FsResult<()> {
        for _attempt in 0..Self::SPILL_ATTEMPTS {
            // What to truncate is resolved under the namespace lock, which is dropped before
            // the gate is taken (lock order: gate, then namespace). A path is opened right
            // away, so a later rename cannot make it name another file.
            let (st, by_path, moves0) = {
                let ns = self.ns();
                if ns.is_dir(ino) {
                    return Err(FsError::ISDIR);
                }
                let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
                if f.kind != FileKind::File {
                    return Err(FsError::INVAL);
                }
                let st = f.state.clone();
                let moves0 = st.moves.load(Ordering::Acquire);
                let by_path = match (fh.and_then(|fh| self.handle(fh)), ns.file_path(ino)) {
                    (None, Some(p)) => Some(
                        std::fs::OpenOptions::new()
                            .write(true)
                            .open(self.tiers[f.tier as usize].backing(&p))?,
                    ),
                    _ => None,
                };
                (st, by_path, moves0)
            };
            let g = st.gate.read().unwrap_or_else(|e| e.into_inner());
            if by_path.is_some() && st.moves.load(Ordering::Acquire) != moves0 {
                // Moved in between: the descriptor is the old copy's.
                drop(g);
                continue;
            }
            // Under the gate, with the truncate (see `write`).
            self.stub_client_change(&st)?;
            let file: Arc<File> = match fh.and_then(|fh| self.handle(fh)) {
                Some(h) => h.file(),
                None => match by_path {
                    Some(f) => Arc::new(f),
                    None => match st.open_handles().first() {
                        Some(h) => h.file(),
                        None => return Err(FsError::NOENT),
                    },
                },
            };
            let tier = st.tier();
            let old = st.size.load(Ordering::Acquire);
            let growth = size.saturating_sub(old);
            if !self.reserve(tier, growth) {
                drop(g);
                self.spill(ino, tier, size)?;
                continue;
            }
            if let Err(e) = file.set_len(size) {
                self.tiers[tier as usize].add_used(-(growth as i64));
                return Err(e.into());
            }
            // `growth` was reserved against the size seen before; a passthrough writer's
            // growth may have been accounted meanwhile: settle against the size replaced.
            let prev = st.size.swap(size, Ordering::AcqRel);
            self.tiers[tier as usize].add_used(size as i64 - prev as i64 - growth as i64);
            st.write_gen.fetch_add(1, Ordering::AcqRel);
            let stub_changed = match st.stub.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                Some(s) => {
                    // Marked before the change can be seen, and again below.
                    st.mark_unsynced(STUB_ROW_CHANGED);
                    crate::stub::subtract(&mut s.missing, size, u64::MAX);
                    Some((s.missing.clone(), s.times))
                }
                None => None,
            };
            drop(g);
            if let Some((m, times)) = stub_changed {
                // Marked even if the row is not written: the ranges changed in memory.
                let r = self.db().set_stub(ino, false, &m, times);
                st.mark_unsynced(STUB_ROW_CHANGED);
                r?;
            }
            self.record(ino, tier, Op::Truncate, size, 0, size);
            return Ok(());
        }
        Err(FsError::NOSPC)
    }

    /// flush (close of one descriptor): nothing is buffered in kaiso.
    pub fn flush(&self, fh: u64) -> FsResult<()> {
        self.handle_or_badf(fh).map(|_| ())
    }

    /// fsync / fdatasync.
    ///
    /// During a migration the file's stub state is part of what must survive: its missing
    /// ranges live in the database, committed without fsync (`synchronous=NORMAL`), so
    /// after a power loss an older row could come back and a later fetch would overwrite
    /// bytes the client wrote and synced. So once the data is on disk (fetched units
    /// included: they are the same inode), the file's current missing ranges are written
    /// and made durable, and the filler syncs its own state, before fsync returns.
    ///
    /// That costs a checkpoint of the store database, so it is paid only when there is
    /// something to make durable: the file's [`FileState::unsynced`] bits record a change
    /// of its missing ranges, or a call to the filler about it, since the last fsync that
    /// made its state durable (or since the store was opened). An fsync after rewriting
    /// bytes already present, or of a file that never was a stub, syncs the data only.
    pub fn fsync(&self, fh: u64, datasync: bool) -> FsResult<()> {
        let h = self.handle_or_badf(fh)?;
        let f = h.file();
        if datasync {
            f.sync_data()?
        } else {
            f.sync_all()?
        }
        let st = &h.state;
        // Nothing changed, and no other fsync holds bits it cleared but has not made
        // durable yet (SeqCst pairs these loads with the increment and swap below).
        if st.unsynced.load(Ordering::SeqCst) == 0 && st.syncing.load(Ordering::SeqCst) == 0 {
            return Ok(());
        }
        if let Some(filler) = self.stub_filler() {
            // Serialised with fills of this file, so the row written is not older than
            // one a fill commits meanwhile (and with other fsyncs: one that finds no bit
            // left returns only once the fsync that cleared them is done).
            let _fill = st.fill.lock().unwrap_or_else(|e| e.into_inner());
            st.syncing.fetch_add(1, Ordering::SeqCst);
            // Cleared before the state is read: a change made meanwhile sets its bit
            // again, so the next fsync covers what this one may miss.
            let bits = st.unsynced.swap(0, Ordering::SeqCst);
            let r = (|| -> FsResult<()> {
                if bits & STUB_ROW_CHANGED != 0 {
                    let (missing, times) = st
                        .stub
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .as_ref()
                        .map(|s| (s.missing.clone(), s.times))
                        .unwrap_or_default();
                    self.stub_state_durable(st.ino, &missing, times)?;
                }
                if bits != 0 {
                    filler.sync_state(self, st.ino)?;
                }
                Ok(())
            })();
            if r.is_err() {
                st.mark_unsynced(bits);
            }
            st.syncing.fetch_sub(1, Ordering::SeqCst);
            r?;
        }
        Ok(())
    }

    /// How many database checkpoints client fsyncs have made to persist stub state
    /// (tests and diagnostics: an fsync with nothing to make durable makes none).
    pub fn fsync_checkpoints(&self) -> u64 {
        self.fsync_checkpoints.load(Ordering::Relaxed)
    }

    /// Writes file `ino`'s stub row (`missing` empty: no row) and makes it and every
    /// earlier commit durable: a checkpoint of the WAL into the main database file, which
    /// SQLite fsyncs (WAL before, database after). Should the checkpoint not complete
    /// (a reader in the way), the WAL itself is fsynced instead.
    fn stub_state_durable(
        &self,
        ino: Ino,
        missing: &[(u64, u64)],
        times: Option<crate::db::StubTimes>,
    ) -> FsResult<()> {
        self.db().set_stub(ino, false, missing, times)?;
        self.fsync_checkpoints.fetch_add(1, Ordering::Relaxed);
        // The checkpoint makes every file's stub rows durable, not only this one's: the
        // fetched bytes they vouch for go first (the barrier).
        self.checkpoint_after_fetched_data("FULL")
    }

    /// This store's [`FetchBarrier`] if fetches are ordered now (none is created).
    pub(crate) fn current_fetch_barrier(&self) -> Option<Arc<FetchBarrier>> {
        self.fetch_barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// This store's [`FetchBarrier`] (created on first use). While fetches are ordered
    /// the store database does not checkpoint by itself: a checkpoint would make stub
    /// rows durable ahead of the fetched bytes they mark present. Its checkpoints go
    /// through the barrier instead (on the barrier's schedule,
    /// [`FetchBarrier::commit_counted`]; client fsyncs; [`Store::sync_fetched_data`]) until [`Store::end_fetch_ordering`].
    pub fn fetch_barrier(&self) -> Arc<FetchBarrier> {
        let mut slot = self.fetch_barrier.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(b) = &*slot {
            return b.clone();
        }
        let tiers: Vec<std::path::PathBuf> = self.tiers.iter().map(|t| t.root.clone()).collect();
        let barrier = Arc::new(FetchBarrier::new(
            tiers,
            self.cfg.state_dir.join("kaiso.db-wal"),
        ));
        // Before anyone can fetch under it (lock order: this slot, then the database).
        if let Err(e) = self.db().conn.pragma_update(None, "wal_autocheckpoint", 0) {
            tracing::error!("store database: automatic checkpoint not turned off: {e}");
        }
        // The WAL file is cut back after each checkpoint, so a small state directory
        // does not keep the largest WAL a burst of fetches made (and its size tells what
        // it holds, see `commit_counted`).
        let _ = self.db().conn.pragma_update(
            None,
            "journal_size_limit",
            crate::stub::STORE_WAL_KEPT_BYTES,
        );
        *slot = Some(barrier.clone());
        barrier
    }

    /// Makes every fetched byte written so far durable, then the store database's stub
    /// rows (one `syncfs` per tier that received fetched bytes, one WAL fsync).
    /// [`Store::sync_fetched_data`] when this store has fetched into stubs (a migration
    /// ordered its writes); nothing otherwise. For a final checkpoint or a journal commit
    /// that would make completion rows durable.
    pub fn sync_fetched_data_if_ordered(&self) -> FsResult<()> {
        let ordered = self
            .fetch_barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some();
        if ordered {
            self.sync_fetched_data()?;
        }
        Ok(())
    }

    pub fn sync_fetched_data(&self) -> FsResult<()> {
        drain_writeback();
        self.fetch_barrier().sync_then(|| Ok(()))?;
        Ok(())
    }

    /// Fetched bytes first, then a checkpoint of the store database (`mode`: PASSIVE or
    /// FULL); should a FULL checkpoint not complete (a reader in the way), its WAL was
    /// fsynced by the barrier already.
    fn checkpoint_after_fetched_data(&self, mode: &str) -> FsResult<()> {
        let sql = format!("PRAGMA wal_checkpoint({mode})");
        self.fetch_barrier()
            .sync_then(|| {
                self.db()
                    .conn
                    .query_row(&sql, [], |r| r.get::<_, i64>(0))
                    .map_err(|e| {
                        std::io::Error::other(format!("checkpoint of the store database: {e}"))
                    })
            })
            .map_err(|e| {
                tracing::error!("{e}");
                FsError::IO
            })?;
        Ok(())
    }

    /// No migration fetches into this store any more: the last fetched bytes are made
    /// durable and the store database checkpoints by itself again.
    pub fn end_fetch_ordering(&self) -> FsResult<()> {
        drain_writeback();
        self.checkpoint_after_fetched_data("PASSIVE")?;
        *self.fetch_barrier.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.db()
            .conn
            .pragma_update(None, "wal_autocheckpoint", 1000)
            .map_err(|e| {
                tracing::error!("store database: automatic checkpoint not restored: {e}");
                FsError::IO
            })
    }

    /// Last close of a handle.
    pub fn release(&self, fh: u64) -> FsResult<()> {
        let Some(h) = self
            .handles
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh)
        else {
            return Err(FsError::BADF);
        };
        let st = h.state.clone();
        let mut kernel_write = None;
        if h.is_passthrough() {
            // Under the gate, so a move sees either this handle still open or its writes
            // counted in the write generation.
            let _g = st.gate.read().unwrap_or_else(|e| e.into_inner());
            if h.writable {
                // The kernel wrote without us: bring the size accounting up to date, and
                // make any copy in progress start over.
                if let Some(w) = self.account_passthrough_writer(&h, false) {
                    kernel_write = Some(w);
                }
                st.write_gen.fetch_add(1, Ordering::AcqRel);
            }
            if h.passthrough.swap(false, Ordering::AcqRel) {
                st.passthrough_open.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.release_reserve(&h);
        if let Some(w) = kernel_write {
            // The last writes since the previous check (`check_passthrough_writers`).
            if !on_background_thread() {
                self.count_access(st.ino, st.tier(), Op::Write, w.offset, w.len, w.size, false);
            }
        }
        {
            let me = Arc::downgrade(&h);
            st.handles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .retain(|w| !Weak::ptr_eq(w, &me) && w.strong_count() > 0);
        }
        drop(h);
        let mut ns = self.ns();
        let unlinked = ns
            .files
            .get(&st.ino)
            .map(|f| (f.names.is_empty(), f.lookups));
        if let Some((true, lookups)) = unlinked {
            if !st.has_open_handles() {
                // The last handle of a file with no name left.
                self.orphan_closed(&mut ns, &st);
                self.forget_stub_row_of_gone_file(&st);
                if lookups == 0 {
                    ns.files.remove(&st.ino);
                }
            }
        }
        Ok(())
    }

    /// fallocate (mode: FALLOC_FL_* bits).
    pub fn fallocate(&self, fh: u64, offset: u64, len: u64, mode: i32) -> FsResult<()> {
        let h = self.handle_or_badf(fh)?;
        let st = h.state.clone();
        let keep = mode & (libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE) != 0;
        // Modes that change bytes (zero them, or shift what follows) must find a stub's
        // bytes there first, as a write does: a later fetch would put the source's bytes
        // back over the zeros, or fetch them into the shifted places.
        let size = st.size.load(Ordering::Relaxed);
        if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 {
            self.fill_range(&st, offset, offset.saturating_add(len).min(size))?;
        } else if mode & (libc::FALLOC_FL_COLLAPSE_RANGE | libc::FALLOC_FL_INSERT_RANGE) != 0 {
            self.fill_range(&st, offset, size)?;
        }
        for _attempt in 0..Self::SPILL_ATTEMPTS {
            let g = st.gate.read().unwrap_or_else(|e| e.into_inner());
            // A modification: the file's own times hold from now on (see `write`).
            self.stub_client_change(&st)?;
            let tier = st.tier();
            let size = st.size.load(Ordering::Acquire);
            let end = offset.saturating_add(len);
            // The size after the call: inserting shifts the tail up by `len`, collapsing
            // down by `len`; other modes extend to `end` unless told to keep the size.
            let new_size = if mode & libc::FALLOC_FL_INSERT_RANGE != 0 {
                size.saturating_add(len)
            } else if mode & libc::FALLOC_FL_COLLAPSE_RANGE != 0 {
                size.saturating_sub(len)
            } else if keep {
                size
            } else {
                end.max(size)
            };
            let growth = new_size.saturating_sub(size);
            if !self.reserve(tier, growth) {
                drop(g);
                self.spill(st.ino, tier, new_size)?;
                continue;
            }
            if let Err(e) = util::fallocate(&h.file(), mode, offset, len) {
                self.tiers[tier as usize].add_used(-(growth as i64));
                if e.raw_os_error() == Some(libc::ENOSPC) {
                    drop(g);
                    self.spill(st.ino, tier, new_size.max(size))?;
                    continue;
                }
                return Err(e.into());
            }
            if mode & (libc::FALLOC_FL_INSERT_RANGE | libc::FALLOC_FL_COLLAPSE_RANGE) != 0 {
                // A fetch writes nothing past the size it finds (`stub_write_counted`),
                // so a collapsed file must show its new size before the gate is dropped.
                // Settled against the size replaced, as `truncate` does.
                let prev = st.size.swap(new_size, Ordering::AcqRel);
                self.tiers[tier as usize].add_used(new_size as i64 - prev as i64 - growth as i64);
            } else if !keep {
                // Another writer may have grown the file meanwhile (see `write`).
                let prev = st.size.fetch_max(end, Ordering::AcqRel);
                let actual = end.saturating_sub(prev);
                if actual < growth {
                    self.tiers[tier as usize].add_used(-((growth - actual) as i64));
                }
            }
            st.write_gen.fetch_add(1, Ordering::AcqRel);
            // Not an access, but a size change the policy must know of.
            self.placer()
                .note_size(st.ino, st.size.load(Ordering::Acquire));
            return Ok(());
        }
        Err(FsError::NOSPC)
    }

    /// lseek, including SEEK_DATA / SEEK_HOLE (answered by the backing file).
    pub fn lseek(&self, fh: u64, offset: i64, whence: i32) -> FsResult<i64> {
        let h = self.handle_or_badf(fh)?;
        let st = &h.state;
        let size = st.size.load(Ordering::Relaxed);
        if whence == libc::SEEK_DATA || whence == libc::SEEK_HOLE {
            // A stub's unfetched ranges would look like holes: fetch them first.
            self.fill_range(st, 0, size)?;
        }
        let _g = st.gate.read().unwrap_or_else(|e| e.into_inner());
        let r = unsafe {
            libc::lseek(
                std::os::unix::io::AsRawFd::as_raw_fd(&*h.file()),
                offset,
                whence,
            )
        };
        if r < 0 { Err(FsError::last()) } else { Ok(r) }
    }

    // ---- migration stubs -------------------------------------------------------------

    /// A client is about to modify stub file `st` (write, truncate, new times): from now
    /// on the file's own times hold, so its pending times (the source's) are dropped
    /// first, in memory and in its row; kept, a crash or the next fetch would put them
    /// back over the client's change. A fetch after this keeps the times it finds.
    ///
    /// Call with the file's gate held shared, and keep it until the modification is
    /// done: a fetch reads the times to keep and puts them back with the gate held
    /// exclusively (`stub_write`), so a modification can never land between the two
    /// (the fetch would put the time from before it back over it).
    pub(crate) fn stub_client_change(&self, st: &FileState) -> FsResult<()> {
        self.set_stub_times(st, None)
    }

    /// Sets the pending times of stub file `st` to `times`, in memory and then in its row;
    /// nothing to do if `st` is no stub or already has them.
    fn set_stub_times(&self, st: &FileState, times: Option<crate::db::StubTimes>) -> FsResult<()> {
        let missing = match st.stub.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            Some(x) if x.times != times => {
                x.times = times;
                x.missing.clone()
            }
            _ => return Ok(()),
        };
        // Marked before the row is written and again after (see `stub_write`).
        st.mark_unsynced(STUB_ROW_CHANGED);
        let r = self.db().set_stub(st.ino, false, &missing, times);
        st.mark_unsynced(STUB_ROW_CHANGED);
        r?;
        Ok(())
    }

    /// Stub state of an inode (complete/default for ordinary inodes).
    pub fn stub_state(&self, ino: Ino) -> StubState {
        let ns = self.ns();
        if let Some(d) = ns.dirs.get(&ino) {
            return StubState {
                unlisted_dir: d.unlisted,
                missing: Vec::new(),
                times: None,
            };
        }
        ns.files
            .get(&ino)
            .and_then(|f| f.state.stub.lock().ok().and_then(|s| s.clone()))
            .unwrap_or_default()
    }

    /// Drops the stored stub row of a file with no name and no handle left, if it had
    /// stub state: its inode number may be reused by a new file.
    pub(crate) fn forget_stub_row_of_gone_file(&self, st: &crate::handles::FileState) {
        let was_stub = st
            .stub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        if was_stub {
            if let Err(e) = self.db().set_stub(st.ino, false, &[], None) {
                tracing::warn!(ino = st.ino, error = %e, "cannot drop the stub row of a removed file");
            }
        }
    }

    /// Set an inode's stub state (persisted).
    pub fn stub_mark(&self, ino: Ino, state: StubState) -> FsResult<()> {
        let mut ns = self.ns();
        let mut listed_dir = None;
        let fstate = if let Some(d) = ns.dirs.get_mut(&ino) {
            if d.unlisted && !state.unlisted_dir {
                listed_dir = Some(d.path.clone());
            }
            d.unlisted = state.unlisted_dir;
            None
        } else if let Some(f) = ns.files.get(&ino) {
            // Marked before the change can be seen, and again once the row is written.
            f.state.mark_unsynced(STUB_ROW_CHANGED | FILLER_TOUCHED);
            *f.state.stub.lock().unwrap_or_else(|e| e.into_inner()) = if state.is_complete() {
                None
            } else {
                Some(state.clone())
            };
            Some(f.state.clone())
        } else {
            return Err(FsError::NOENT);
        };
        let r = self
            .db()
            .set_stub(ino, state.unlisted_dir, &state.missing, state.times);
        if let Some(st) = fstate {
            st.mark_unsynced(STUB_ROW_CHANGED | FILLER_TOUCHED);
        }
        if let Some(rel) = listed_dir {
            // Its listing's changes are over: the ctime clients see stays (see
            // `Store::dir_ctime_shown`).
            self.dir_listing_settled(ino, &rel);
        }
        r?;
        Ok(())
    }

    /// The link count unlisted directory `ino` shows until it is listed: its source's
    /// (from its parent's listing), for `find`, `ls -l` and the like. Kept in memory
    /// only (the stub filler gives it again after a restart); ignored for a directory
    /// already listed and for anything else.
    pub fn stub_show_nlink(&self, ino: Ino, nlink: u32) {
        let mut ns = self.ns();
        if let Some(d) = ns.dirs.get_mut(&ino)
            && d.unlisted
        {
            d.shown_nlink = Some(nlink);
        }
    }

    /// The filler listed directory `ino`.
    pub fn stub_dir_listed(&self, ino: Ino) -> FsResult<()> {
        self.stub_mark(ino, StubState::default())
    }

    /// Create an entry as the filler saw it on the source; never calls the filler.
    /// Files are created sparse at their size with every byte marked missing. Returns the
    /// inode (an existing entry of that name is kept and returned).
    ///
    /// The entry gets the source's owner when this process may give files away (see
    /// [`crate::stub::owner_to_give`]); otherwise, or when the chown is refused with
    /// `EPERM` anyway, the process's own user and the source's group if it is a member
    /// (else its own group), as `rsync -a` run by a user does. Such a substitution is
    /// noted for the filler to report ([`crate::stub::take_owner_not_given`]).
    pub fn stub_create(&self, parent: Ino, name: &OsStr, e: &StubEntry) -> FsResult<Ino> {
        let wanted = (e.uid, e.gid);
        let given = crate::stub::owner_to_give(e.uid, e.gid, false);
        let (r, given) = match self.stub_create_owned(parent, name, e, given) {
            Err(err) if err.errno() == libc::EPERM && given == wanted => {
                let fallback = crate::stub::owner_to_give(e.uid, e.gid, true);
                if fallback == given {
                    return Err(err);
                }
                (self.stub_create_owned(parent, name, e, fallback), fallback)
            }
            r => (r, given),
        };
        if r.is_ok() && given != wanted {
            crate::stub::note_owner_not_given(wanted, given);
        }
        r
    }

    /// [`Store::stub_create`] with owner `owner` (uid, gid).
    fn stub_create_owned(
        &self,
        parent: Ino,
        name: &OsStr,
        e: &StubEntry,
        owner: (u32, u32),
    ) -> FsResult<Ino> {
        let mut ns = self.ns();
        if let Some(i) = self.find_child(&mut ns, parent, name)? {
            return Ok(i);
        }
        let caller = Caller {
            uid: owner.0,
            gid: owner.1,
            pid: 0,
        };
        let ino = match e.kind {
            FileKind::Dir => {
                drop(ns);
                let a = self.mkdir_nofill(parent, name, e.perm, 0, caller)?;
                let mut ns = self.ns();
                if let Some(d) = ns.dirs.get_mut(&a.ino) {
                    d.unlisted = e.unlisted;
                    d.lookups = d.lookups.saturating_sub(1);
                }
                drop(ns);
                a.ino
            }
            kind => {
                let size = e.size;
                let target = e.symlink_target.clone();
                let perm = e.perm & 0o7777;
                let rdev = e.rdev;
                let (uid, gid) = owner;
                let (atime, mtime) = (e.atime, e.mtime);
                // Owner, mode and times are set inside the creation (a regular file through
                // its descriptor: no path lookups), so `create_entry` finds the entry as
                // the source has it and changes nothing after. Owner before mode: a chown
                // clears set-id bits.
                // A file is placed by its listed size, which its tier accounts from now on
                // (`used` holds apparent sizes; fetched bytes do not change them), so a
                // listing cannot put more on a tier than it holds.
                let listed = if kind == FileKind::File { size } else { 0 };
                // From taking the room to noting the stub (its tier is not known yet).
                let _stub_change: Vec<_> = match listed {
                    0 => Vec::new(),
                    _ => self.tiers.iter().map(|t| t.stub_change()).collect(),
                };
                let (ino, tier, made, _) =
                    self.create_entry_sized(&mut ns, parent, name, caller, None, listed, &|p| {
                        match kind {
                            FileKind::File => {
                                let f = std::fs::OpenOptions::new()
                                    .write(true)
                                    .create_new(true)
                                    .mode(perm)
                                    .open(p)?;
                                let made = util::fstat(&f)?;
                                let chown = made.st_uid != uid || made.st_gid != gid;
                                if chown && let Err(e) = util::fchown(&f, uid, gid) {
                                    // Not left behind: the owner may be retried.
                                    let _ = std::fs::remove_file(p);
                                    return Err(e);
                                }
                                if chown || made.st_mode & 0o7777 != perm {
                                    util::fchmod(&f, perm)?;
                                }
                                if size > 0 {
                                    f.set_len(size)?;
                                }
                                util::futimens(&f, util::UTime::At(atime), util::UTime::At(mtime))?;
                                return Ok(Some(f));
                            }
                            FileKind::Symlink => {
                                std::os::unix::fs::symlink(target.clone().unwrap_or_default(), p)?
                            }
                            FileKind::Fifo => util::mknod(p, libc::S_IFIFO | perm, 0)?,
                            FileKind::Socket => util::mknod(p, libc::S_IFSOCK | perm, 0)?,
                            FileKind::CharDevice => util::mknod(p, libc::S_IFCHR | perm, rdev)?,
                            FileKind::BlockDevice => util::mknod(p, libc::S_IFBLK | perm, rdev)?,
                            FileKind::Dir => unreachable!(),
                        }
                        let st = util::lstat(p)?;
                        if (st.st_uid != uid || st.st_gid != gid)
                            && let Err(e) = util::lchown(p, Some(uid), Some(gid))
                        {
                            // Not left behind: the owner may be retried.
                            let _ = std::fs::remove_file(p);
                            return Err(e);
                        }
                        util::lutimens(p, util::UTime::At(atime), util::UTime::At(mtime))?;
                        Ok(None)
                    })?;
                if kind == FileKind::File && size > 0 {
                    if let Some(f) = ns.files.get(&ino) {
                        // Its missing bytes are room promised on the tier's file system.
                        self.tiers[tier as usize].note_stub(tier, &f.state);
                        f.state.size.store(size, Ordering::Release);
                        // The crawler's accesses are not recorded: tell the policy here.
                        self.placer().note_size(ino, size);
                        f.state.mark_unsynced(STUB_ROW_CHANGED | FILLER_TOUCHED);
                        *f.state.stub.lock().unwrap_or_else(|e| e.into_inner()) = Some(StubState {
                            unlisted_dir: false,
                            missing: vec![(0, size)],
                            times: Some((atime, mtime)),
                        });
                    }
                }
                let fstate = ns.files.get(&ino).map(|f| f.state.clone());
                let identity = made.as_ref().and_then(|f| {
                    crate::stub::BackingIdentity::of_file(f, ns.slots[tier as usize])
                });
                // The row is written with the namespace unlocked (other listings go on
                // meanwhile) and before this call returns (before the filler marks the
                // parent listed).
                drop(ns);
                if kind == FileKind::File && size > 0 {
                    // The row records which backing file it is for (`BackingIdentity`).
                    if let Some(id) = identity {
                        crate::db::note_stub_identity(ino, id.encode());
                    }
                    let r = self.put_stub_row(ino, false, vec![(0, size)], Some((atime, mtime)));
                    if let Some(st) = &fstate {
                        st.mark_unsynced(STUB_ROW_CHANGED | FILLER_TOUCHED);
                    }
                    r?;
                }
                ino
            }
        };
        if e.kind == FileKind::Dir {
            if e.unlisted {
                self.put_stub_row(ino, true, Vec::new(), None)?;
            }
            let p = self.ns().dir_path(ino).map(|p| p.to_path_buf());
            if let Some(p) = p {
                if let Some(t) = self.dir_tiers(&p).first() {
                    util::lutimens(
                        &self.tiers[*t as usize].backing(&p),
                        util::UTime::At(e.atime),
                        util::UTime::At(e.mtime),
                    )?;
                }
            }
        }
        Ok(ino)
    }

    /// Runs `f` (which creates entries with [`Store::stub_create`]) with the stub rows
    /// those creations write collected on this thread and committed in one transaction
    /// when `f` returns, instead of one commit each: a listing's entries cost one commit.
    /// The rows are committed whether `f` succeeds or not (its entries exist either way),
    /// before this returns, so a filler marks the directory listed only after them. An
    /// entry created without its row (a crash inside `f`) looks complete to the store;
    /// its directory is still unlisted then and is listed again, and the filler marks
    /// such an entry a stub again. Nested calls join the outer batch.
    pub fn stub_batch<T>(&self, f: impl FnOnce() -> FsResult<T>) -> FsResult<T> {
        let outer = STUB_ROWS.with(|b| {
            let mut b = b.borrow_mut();
            if b.is_some() {
                true
            } else {
                *b = Some(Vec::new());
                false
            }
        });
        if outer {
            return f();
        }
        let r = f();
        let rows = STUB_ROWS
            .with(|b| b.borrow_mut().take())
            .unwrap_or_default();
        let committed = self.commit_stub_rows(&rows);
        let v = r?;
        committed?;
        Ok(v)
    }

    /// Writes one stub row now, or queues it when this thread is in a [`Store::stub_batch`].
    fn put_stub_row(
        &self,
        ino: Ino,
        unlisted: bool,
        missing: Vec<(u64, u64)>,
        times: Option<crate::db::StubTimes>,
    ) -> FsResult<()> {
        let row = (ino, unlisted, missing, times);
        let queued = STUB_ROWS.with(|b| match b.borrow_mut().as_mut() {
            Some(rows) => {
                rows.push(row.clone());
                true
            }
            None => false,
        });
        if !queued {
            self.db().set_stub(row.0, row.1, &row.2, row.3)?;
        }
        Ok(())
    }

    fn commit_stub_rows(&self, rows: &[crate::db::StubRow]) -> FsResult<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let db = self.db();
        let tx = db.conn.unchecked_transaction()?;
        for (ino, unlisted, missing, times) in rows {
            db.set_stub(*ino, *unlisted, missing, *times)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Write fetched bytes into a stub file and mark them present; never calls the filler.
    /// Same as [`Store::stub_write_counted`], without the count.
    pub fn stub_write(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<()> {
        self.stub_write_counted(ino, offset, data).map(|_| ())
    }

    /// Write the fetched bytes `data` (the source's bytes at `offset`) into stub file
    /// `ino`, only where they are still missing, and mark them present; never calls the
    /// filler. Returns how many bytes were written.
    ///
    /// A fetch reads the source without any lock on the file, so a client may change it
    /// meanwhile: bytes it wrote are no longer missing, and a truncate drops the missing
    /// ranges past the new size. Writing only what is missing *now*, under the gate held
    /// exclusively, keeps every byte a client wrote and never regrows a file a client
    /// shrank (the fetch used to write its whole range, then subtract it).
    ///
    /// Fetching is not a modification: the file keeps the mtime it must show (its pending
    /// times, see [`StubState::times`]), which are durable in its row before the bytes
    /// are written, so a crash between the write and the restore of the mtime is undone
    /// at the next start ([`Store::open`]). Writes do not change the atime.
    pub fn stub_write_counted(&self, ino: Ino, offset: u64, data: &[u8]) -> FsResult<u64> {
        self.stub_write_completing(ino, offset, data)
            .map(|w| w.written)
    }

    /// [`Store::stub_write_counted`], also telling what the migration's `finish` needs to
    /// tell a client's change from a damaged copy (see [`StubWrite`]).
    pub(crate) fn stub_write_completing(
        &self,
        ino: Ino,
        offset: u64,
        data: &[u8],
    ) -> FsResult<StubWrite> {
        let state = {
            let ns = self.ns();
            ns.files.get(&ino).ok_or(FsError::NOENT)?.state.clone()
        };
        let barrier = self.fetch_barrier();
        let written = match self.stub_write_ordered(ino, &state, &barrier, offset, data) {
            Err(e) if e == FsError::NOSPC || e == FsError(libc::EDQUOT) => {
                self.move_stub_for_room(ino, &state)?;
                self.stub_write_ordered(ino, &state, &barrier, offset, data)?
            }
            r => r?,
        };
        // Now and then the store database is checkpointed (it does not do so by itself
        // while fetches are ordered), with no lock of this file held.
        match barrier.commit_counted() {
            CheckpointDue::No => {}
            // A crawl's committer runs it (see `checkpoint_if_due`): crawler threads are
            // not stalled in its `syncfs` while the WAL is under its bound.
            CheckpointDue::Due if barrier.background_checkpointers.load(Ordering::Acquire) > 0 => {}
            // One fetch runs it; the others go on (each used to start a `syncfs` of its
            // own, and all crawler threads stalled there for seconds).
            CheckpointDue::Due => {
                if let Ok(_claim) = barrier.checkpoint_claim.try_lock() {
                    self.checkpoint_after_fetched_data("PASSIVE")?;
                }
            }
            // Past the WAL's hard bound: this fetch waits for the checkpoint under way
            // instead of appending more, and runs one itself if the WAL is still past
            // the bound then (the state directory must never fill, see
            // `crate::stub::HOLD_WAL_BYTES`).
            CheckpointDue::Hold => {
                let _claim = barrier
                    .checkpoint_claim
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                if barrier.checkpoint_due() == CheckpointDue::Hold {
                    self.checkpoint_after_fetched_data("PASSIVE")?;
                }
            }
        }
        Ok(written)
    }

    /// The store database's periodic checkpoint, if one is due (see
    /// [`FetchBarrier::commit_counted`]) and no other thread runs one: for a background
    /// thread registered in [`FetchBarrier::background_checkpointers`] (a crawl's
    /// committer), so crawler threads do not stall in its `syncfs`. Nothing while
    /// fetches are not ordered (the database checkpoints by itself then).
    pub(crate) fn checkpoint_if_due(&self) -> FsResult<()> {
        let Some(barrier) = self.current_fetch_barrier() else {
            return Ok(());
        };
        if barrier.checkpoint_due() == CheckpointDue::No {
            return Ok(());
        }
        if let Ok(_claim) = barrier.checkpoint_claim.try_lock() {
            self.checkpoint_after_fetched_data("PASSIVE")?;
        }
        Ok(())
    }

    /// A fetch into stub file `state` found the file system of its tier full (filled by
    /// others than this store: its accounting keeps a stub's listed size on the tier):
    /// the partial stub moves to the next tier with room for its whole size, slower ones
    /// first, its present ranges and holes as they are and its missing set unchanged
    /// (see [`crate::mover::allowing_partial_stub_move`]), so the fetch goes on there
    /// instead of failing, as a client's write spills.
    fn move_stub_for_room(&self, ino: Ino, state: &Arc<FileState>) -> FsResult<()> {
        // The tiers' real room now, not at the last sample.
        self.refresh_fs_room();
        let from = state.tier();
        let size = state.size.load(Ordering::Acquire);
        let n = self.tiers.len() as u8;
        let reason = format!(
            "a fetch found the file system of tier {} full",
            self.tiers[from as usize].cfg.name
        );
        let mut last = FsError::NOSPC;
        for t in (from + 1..n).chain(0..from) {
            if !self.tiers[t as usize].fits(size) {
                continue;
            }
            match crate::mover::allowing_partial_stub_move(|| {
                self.move_file_inner(ino, t, &reason, None)
            }) {
                Ok(_) => {
                    tracing::warn!(ino, from, to = t, "{reason}: stub moved, fetch retried");
                    self.tiers[t as usize].note_stub(t, state);
                    self.renote_stub_identity(ino, state);
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(ino, to = t, error = %e, "{reason}: stub not moved");
                    last = e.errno();
                }
            }
        }
        Err(last)
    }

    /// After a move of stub file `state`, its row records the new backing file's identity
    /// (see [`crate::stub::BackingIdentity`]), so the check against inode reuse at open
    /// keeps covering it. Best effort: a row keeping the old identity is trusted.
    fn renote_stub_identity(&self, ino: Ino, state: &Arc<FileState>) {
        // Shared: no fetch changes the row meanwhile.
        let _g = state.gate.read().unwrap_or_else(|e| e.into_inner());
        let id = {
            let ns = self.ns();
            let tier = state.tier() as usize;
            ns.file_path(ino).and_then(|p| {
                let f = std::fs::File::open(self.tiers[tier].backing(&p)).ok()?;
                crate::stub::BackingIdentity::of_file(&f, ns.slots[tier])
            })
        };
        let Some(id) = id else { return };
        let Some(s) = state.stub.lock().unwrap_or_else(|e| e.into_inner()).clone() else {
            return;
        };
        crate::db::note_stub_identity(ino, id.encode());
        if let Err(e) = self.db().set_stub(ino, s.unlisted_dir, &s.missing, s.times) {
            tracing::warn!(ino, error = %e, "stub row keeps its old backing identity");
        }
        state.mark_unsynced(STUB_ROW_CHANGED);
    }

    /// [`Store::stub_write_counted`] of file `state`: its data write and the commit of
    /// its row under `barrier`'s write guard (see [`FetchBarrier`]).
    fn stub_write_ordered(
        &self,
        ino: Ino,
        state: &Arc<FileState>,
        barrier: &FetchBarrier,
        offset: u64,
        data: &[u8],
    ) -> FsResult<StubWrite> {
        // Exclusively, from reading the times to keep until they are back on: a client's
        // write, truncate or utimens (each under the gate shared, with its
        // `stub_client_change`) lands before the times are read or after they are put
        // back, never in between, where its mtime would be replaced by the older one.
        // Only stub files are fetched into, so other files never wait for this.
        let _g = state.gate.write().unwrap_or_else(|e| e.into_inner());
        run_stub_resolve_hook(ino);
        // The path is resolved and opened under the namespace lock, with the gate held
        // (lock order: gate, then namespace): a client's rename cannot make it name
        // another file between the two, and a move cannot switch the tier (it switches
        // under the gate).
        // What is still missing of the range, within the current size (before the open:
        // with nothing to write, nothing is opened, and no mode changed for the open).
        let size = state.size.load(Ordering::Acquire);
        let end = offset.saturating_add(data.len() as u64).min(size);
        let (pieces, pending) = match state
            .stub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(s) => (
                crate::stub::missing_within(&s.missing, offset, end),
                s.times,
            ),
            None => (Vec::new(), None),
        };
        if pieces.is_empty() {
            return Ok(StubWrite::default());
        }
        let (f, ctime_before, tier) = {
            let ns = self.ns();
            let entry = ns.files.get(&ino).ok_or(FsError::NOENT)?;
            if !Arc::ptr_eq(&entry.state, state) {
                return Err(FsError::NOENT);
            }
            let p = ns.file_path(ino).ok_or(FsError::NOENT)?;
            // A daemon that is not root opens a stub whose source mode denies its owner
            // write (0444) with u+w added for the open alone and the mode put back at
            // once, under the namespace lock (`crate::owner_write`).
            let w = crate::owner_write::open_write(&self.tiers[entry.tier as usize].backing(&p))?;
            (w.file, w.ctime_before, entry.tier as usize)
        };
        // Until the store's last change below (dropped before the gate): clients keep
        // seeing the ctime from before (see `crate::stub::CtimeMask`), the one from before
        // the open's mode change if there was one.
        let _ctime = crate::stub::StoreWrite::begin_at(state, &f, ctime_before);
        let client_changed = pending.is_none();
        let times = match pending {
            Some(t) => t,
            None => {
                // A client changed the file (or its row predates pending times): the
                // times it has now are the ones to keep, made pending (and persisted)
                // before the write.
                let before = util::fstat(&f)?;
                let t = (
                    util::ts(before.st_atime, before.st_atime_nsec),
                    util::ts(before.st_mtime, before.st_mtime_nsec),
                );
                self.set_stub_times(state, Some(t))?;
                t
            }
        };
        // From the data write through the row commit (see `FetchBarrier`).
        let _ordered = barrier.write_guard();
        // From the data write to the missing-set update (see `Tier::refresh_fs_room`).
        let _stub_change = self.tiers[tier].stub_change();
        // In pieces: one multi-megabyte write(2) into the page cache cost up to several
        // times the CPU of the same bytes written a megabyte at a time (measured:
        // docs/reproduction/migration.md §3), and a crawl is CPU-bound.
        // All-zero blocks stay holes (a sparse source stays sparse).
        let mut written = 0;
        for &(s, e) in &pieces {
            write_keeping_holes(&f, &data[(s - offset) as usize..(e - offset) as usize], s)?;
            written += e - s;
            if crate::stub::fetch_ordering_on() {
                // Write-back starts now, so the barrier's `syncfs` finds little left to
                // write (it would otherwise write everything fetched since the last one
                // while a fetch waits for it).
                start_writeback(&f, s, e - s);
            }
        }
        barrier.mark_dirty(tier);
        // A move's copy of this file that began before these bytes is redone.
        state.write_gen.fetch_add(1, Ordering::AcqRel);
        if *self.fail.lock().unwrap_or_else(|e| e.into_inner())
            == Some(crate::store::FailPoint::StubAfterWrite)
        {
            return Err(FsError::IO);
        }
        // Only while still pending: no client change can have dropped them since they
        // were read (the gate), but the filler may have marked the file meanwhile.
        let still_pending = state
            .stub
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|s| s.times.is_some());
        self.run_stub_write_hook(ino);
        if still_pending {
            util::futimens(&f, util::UTime::Omit, util::UTime::At(times.1))?;
        }
        // Marked before the change can be seen (a client may write over these bytes as
        // soon as they are marked present, then fsync) and again once the row is written.
        state.mark_unsynced(STUB_ROW_CHANGED);
        let (missing, times, completed_ctime) = {
            let mut s = state.stub.lock().unwrap_or_else(|e| e.into_inner());
            match s.as_mut() {
                Some(st) => {
                    for &(a, b) in &pieces {
                        crate::stub::subtract(&mut st.missing, a, b);
                    }
                    let m = st.missing.clone();
                    let t = st.times;
                    let mut ctime = None;
                    if m.is_empty() {
                        // After the store's last change to the file, before it stops
                        // being a stub (no client can change it in between).
                        ctime = util::fstat(&f)
                            .ok()
                            .map(|x| util::ts(x.st_ctime, x.st_ctime_nsec));
                        *s = None;
                    }
                    (m, t, ctime)
                }
                None => (Vec::new(), None, None),
            }
        };
        let r = self.db().set_stub(ino, false, &missing, times);
        state.mark_unsynced(STUB_ROW_CHANGED);
        r?;
        Ok(StubWrite {
            written,
            client_changed,
            completed_ctime,
        })
    }

    /// Run `hook` inside every [`Store::stub_write`] made on the calling thread, with the
    /// file's gate held exclusively, before the file's backing path is resolved (tests of
    /// a rename racing a fetch). Per thread, so tests running side by side do not see it.
    pub fn set_stub_resolve_hook(hook: Option<Box<dyn Fn(Ino)>>) {
        STUB_RESOLVE_HOOK.with(|h| *h.borrow_mut() = hook.map(std::rc::Rc::from));
    }

    /// Mark the calling thread as a background one (the migration crawler): its reads
    /// and opens are not client accesses, so they do not count in the placement policy's
    /// heat, the tiers' foreground counters or the access trace.
    pub fn mark_background_thread() {
        BACKGROUND_THREAD.with(|b| b.set(true));
    }
}

fn run_stub_resolve_hook(ino: Ino) {
    if let Some(h) = STUB_RESOLVE_HOOK.with(|h| h.borrow().clone()) {
        h(ino);
    }
}

/// Whether the calling thread does background work ([`Store::mark_background_thread`]).
fn on_background_thread() -> bool {
    BACKGROUND_THREAD.with(|b| b.get())
}

/// What [`Store::stub_write_completing`] wrote and found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StubWrite {
    /// Bytes written (what was still missing).
    pub written: u64,
    /// The file had no pending times: a client changed it (write, truncate, new times)
    /// since the last fetch into it, or its row predates pending times.
    pub client_changed: bool,
    /// This write completed the file: its backing file's ctime right after the store's
    /// last change to it (data, then mtime restored), taken before the file stopped being
    /// a stub. A later change by anyone (client, tier move) gives another ctime.
    pub completed_ctime: Option<std::time::SystemTime>,
}

/// Largest piece of a fetched unit written to a stub file in one `write(2)` (see
/// `Store::stub_write`).
const STUB_WRITE_PIECE: usize = 1 << 20;

/// Block size below which zeros are written rather than left as a hole.
const HOLE_BLOCK: u64 = 4096;

/// Writes the fetched bytes `data` at `at` into a still-missing range of a stub file,
/// leaving each run of all-zero blocks (aligned to [`HOLE_BLOCK`] in the file) a hole:
/// punched, so it reads as zeros whatever the range held (it was created sparse by the
/// file's `ftruncate`; punching a hole that is one costs no allocation). A file system
/// that cannot punch gets the zeros written.
fn write_keeping_holes(f: &File, data: &[u8], at: u64) -> std::io::Result<()> {
    let end = at + data.len() as u64;
    let mut pos = at;
    while pos < end {
        // The next block boundary, or the end.
        let block_end = ((pos / HOLE_BLOCK + 1) * HOLE_BLOCK).min(end);
        let whole = pos.is_multiple_of(HOLE_BLOCK) && block_end - pos == HOLE_BLOCK;
        let zero = whole && is_zero(&data[(pos - at) as usize..(block_end - at) as usize]);
        // The run of blocks of the same kind starting here.
        let mut run_end = block_end;
        while run_end < end {
            let next = (run_end + HOLE_BLOCK).min(end);
            let next_whole = next - run_end == HOLE_BLOCK;
            let next_zero =
                next_whole && is_zero(&data[(run_end - at) as usize..(next - at) as usize]);
            if next_zero != zero || (!zero && run_end - pos >= STUB_WRITE_PIECE as u64) {
                break;
            }
            run_end = next;
        }
        let bytes = &data[(pos - at) as usize..(run_end - at) as usize];
        if zero {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            if let Err(e) = util::fallocate(f, mode, pos, run_end - pos) {
                if !matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)
                ) {
                    return Err(e);
                }
                f.write_all_at(bytes, pos)?;
            }
        } else {
            // In pieces of at most `STUB_WRITE_PIECE` (see there).
            f.write_all_at(bytes, pos)?;
        }
        pos = run_end;
    }
    Ok(())
}

/// Ranges waiting for [`start_writeback`]'s thread at most: a full queue drops the hint
/// (the barrier's `syncfs` writes those bytes back instead).
const WRITEBACK_QUEUE: usize = 256;

/// The thread that starts the write-back of fetched ranges (see [`start_writeback`]).
struct Writeback {
    queue: std::sync::mpsc::SyncSender<(File, u64, u64, u64)>,
    /// Ranges queued and ranges the thread is done with (started or dropped).
    sent: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicU64,
    /// Queued ranges of an earlier epoch are dropped unstarted (see [`drain_writeback`]).
    epoch: std::sync::atomic::AtomicU64,
}

/// The write-back thread, started by the first fetch that needs it (`None`: it could
/// not be started, and fetches start no write-back).
static WRITEBACK: std::sync::OnceLock<Option<Writeback>> = std::sync::OnceLock::new();

fn writeback() -> Option<&'static Writeback> {
    WRITEBACK
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(File, u64, u64, u64)>(WRITEBACK_QUEUE);
            std::thread::Builder::new()
                .name("kaiso-writeback".into())
                .spawn(move || {
                    use std::os::fd::AsRawFd;
                    for (f, offset, len, epoch) in rx {
                        if let Some(wb) = WRITEBACK.get().and_then(Option::as_ref) {
                            if epoch == wb.epoch.load(Ordering::Acquire) {
                                // SAFETY: a descriptor this thread owns; no memory is passed.
                                unsafe {
                                    libc::sync_file_range(
                                        f.as_raw_fd(),
                                        offset as i64,
                                        len as i64,
                                        libc::SYNC_FILE_RANGE_WRITE,
                                    )
                                };
                            }
                            drop(f);
                            wb.done.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                })
                .ok()
                .map(|_| Writeback {
                    queue: tx,
                    sent: Default::default(),
                    done: Default::default(),
                    epoch: Default::default(),
                })
        })
        .as_ref()
}

/// Starts the write-back of a range of fetched bytes without the calling fetch waiting
/// for it: the `kaiso-writeback` thread issues the `sync_file_range(SYNC_FILE_RANGE_WRITE)`
/// on a duplicate of the descriptor. Issued by the fetch itself, it blocked whenever the
/// device's queue was full (block-layer write throttling, `rq_qos_wait`), with the file's
/// gate and the barrier's write guard held: the crawl went at the speed of the
/// destination's disk, where rsync's copy goes at the page cache's (measured:
/// docs/reproduction/migration.md §3, session 10). A hint: failures, and ranges dropped
/// when the queue is full, are left to the barrier's `syncfs`.
fn start_writeback(f: &File, offset: u64, len: u64) {
    let Some(wb) = writeback() else { return };
    let Ok(dup) = f.try_clone() else { return };
    let epoch = wb.epoch.load(Ordering::Acquire);
    if wb.queue.try_send((dup, offset, len, epoch)).is_ok() {
        wb.sent.fetch_add(1, Ordering::AcqRel);
    }
}

/// Drops the queued write-back hints unstarted and waits (briefly) until the thread
/// holds no descriptor of a range queued before this call: a store that stops fetching
/// keeps no tier file open through the queue (an unmount of the tier would fail busy).
fn drain_writeback() {
    let Some(wb) = WRITEBACK.get().and_then(Option::as_ref) else {
        return;
    };
    wb.epoch.fetch_add(1, Ordering::AcqRel);
    let sent = wb.sent.load(Ordering::Acquire);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while wb.done.load(Ordering::Acquire) < sent && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn is_zero(b: &[u8]) -> bool {
    let (head, words, tail) = unsafe { b.align_to::<u128>() };
    head.iter().all(|&x| x == 0) && words.iter().all(|&x| x == 0) && tail.iter().all(|&x| x == 0)
}

/// Which files open through passthrough the kernel read or wrote between two checks
/// (`Store::check_passthrough_writers`), from one-shot inotify watches on their backing
/// files. The kernel's passthrough I/O goes through the backing file, so it raises
/// IN_ACCESS / IN_MODIFY there, while kaiso's own descriptor keeps its offset and relatime
/// moves the atime about once. One-shot: after the first event of an interval the watch
/// is gone, so further reads cost nothing until the next check re-arms it.
mod use_watch {
    use crate::types::Ino;
    use std::cell::RefCell;
    use std::collections::{HashMap, HashSet};
    use std::fs::File;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::sync::Arc;

    struct Watch {
        /// The store the watches belong to (its address; the checks of a store run on its
        /// checker thread, tests may call them on their own).
        store: usize,
        /// None: no inotify instance could be made (warned once per store).
        fd: Option<OwnedFd>,
        /// Watch descriptor -> file, as armed at the last check.
        armed: HashMap<i32, Ino>,
    }

    thread_local! {
        static WATCH: RefCell<Option<Watch>> = const { RefCell::new(None) };
        /// (store, checks in a row each file open through passthrough was seen in use).
        static STREAKS: RefCell<(usize, HashMap<Ino, u32>)> = RefCell::new((0, HashMap::new()));
    }

    /// Count one more check in a row for each file in `used`; forget the others.
    pub(super) fn streaks<'a>(
        store: usize,
        used: impl Iterator<Item = &'a Ino>,
    ) -> HashMap<Ino, u32> {
        STREAKS.with_borrow_mut(|(owner, streaks)| {
            if *owner != store {
                *owner = store;
                streaks.clear();
            }
            let next: HashMap<Ino, u32> = used
                .map(|ino| (*ino, streaks.get(ino).map_or(1, |n| n.saturating_add(1))))
                .collect();
            *streaks = next.clone();
            next
        })
    }

    /// What one check learns of the files open through passthrough.
    pub(super) struct Seen {
        /// Read or written by the kernel since the last check.
        pub used: HashSet<Ino>,
        /// Not watched (no inotify, or no watch could be set): use unknown.
        pub unwatched: HashSet<Ino>,
        /// Watched from this check on, not at the last one.
        pub first_seen: HashSet<Ino>,
    }

    /// The files with an event since the last call; then arm a watch on each of `files`
    /// (file, backing file) and drop the others.
    pub(super) fn seen_and_rearm(store: usize, files: &[(Ino, Arc<File>)]) -> Seen {
        WATCH.with_borrow_mut(|w| {
            let w = match w {
                Some(w) if w.store == store => w,
                _ => w.insert(Watch::new(store)),
            };
            if w.fd.is_none() {
                return Seen {
                    used: HashSet::new(),
                    unwatched: files.iter().map(|f| f.0).collect(),
                    first_seen: HashSet::new(),
                };
            }
            let used = w.drain();
            let before: HashSet<Ino> = w.armed.values().copied().collect();
            let unwatched = w.arm(files);
            let first_seen = files
                .iter()
                .map(|f| f.0)
                .filter(|i| !before.contains(i) && !unwatched.contains(i))
                .collect();
            Seen {
                used,
                unwatched,
                first_seen,
            }
        })
    }

    impl Watch {
        fn new(store: usize) -> Watch {
            // SAFETY: plain syscall; a valid descriptor is owned from here on.
            let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
            let fd = if fd < 0 {
                tracing::warn!(
                    error = %std::io::Error::last_os_error(),
                    "no inotify: files open through passthrough count as used while open"
                );
                None
            } else {
                // SAFETY: `fd` was just returned by inotify_init1 and is owned by nobody else.
                Some(unsafe { OwnedFd::from_raw_fd(fd) })
            };
            Watch {
                store,
                fd,
                armed: HashMap::new(),
            }
        }

        fn raw(&self) -> i32 {
            self.fd.as_ref().map_or(-1, |f| f.as_raw_fd())
        }

        fn drain(&mut self) -> HashSet<Ino> {
            let mut seen = HashSet::new();
            let mut buf = [0u8; 4096];
            loop {
                // SAFETY: reads into a buffer of the given length.
                let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    return seen;
                }
                let n = n as usize;
                let mut at = 0;
                // struct inotify_event: wd i32, mask u32, cookie u32, len u32, name[len].
                while at + 16 <= n {
                    let field = |o: usize| {
                        let b: [u8; 4] = buf[at + o..at + o + 4].try_into().unwrap_or_default();
                        u32::from_ne_bytes(b)
                    };
                    let wd = field(0) as i32;
                    let mask = field(4);
                    at += 16 + field(12) as usize;
                    if mask & (libc::IN_ACCESS | libc::IN_MODIFY) != 0 {
                        if let Some(&ino) = self.armed.get(&wd) {
                            seen.insert(ino);
                        }
                    }
                }
            }
        }

        fn arm(&mut self, files: &[(Ino, Arc<File>)]) -> HashSet<Ino> {
            let mut armed = HashMap::new();
            let mut failed = HashSet::new();
            let mask = libc::IN_ACCESS | libc::IN_MODIFY | libc::IN_ONESHOT;
            for (ino, file) in files {
                // The descriptor names the open file's inode whatever its path now is.
                let path = format!("/proc/self/fd/{}\0", file.as_raw_fd());
                // SAFETY: `path` is NUL-terminated and outlives the call.
                let wd = unsafe { libc::inotify_add_watch(self.raw(), path.as_ptr().cast(), mask) };
                if wd < 0 {
                    failed.insert(*ino);
                } else {
                    armed.insert(wd, *ino);
                }
            }
            for wd in self.armed.keys() {
                if !armed.contains_key(wd) {
                    // Fails harmlessly for a watch that fired (one-shot watches go away).
                    // SAFETY: plain syscall on our own descriptor.
                    unsafe { libc::inotify_rm_watch(self.raw(), *wd) };
                }
            }
            self.armed = armed;
            failed
        }
    }
}

#[cfg(test)]
mod writeback_tests {
    use super::*;

    /// Descriptors of this process open on `path`.
    fn open_on(path: &std::path::Path) -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|target| target == path)
            .count()
    }

    #[test]
    fn draining_the_write_back_queue_closes_its_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fetched");
        let f = File::create(&path).unwrap();
        f.write_all_at(&vec![7u8; 1 << 20], 0).unwrap();
        // More hints than the queue holds: the fetch never waits, the excess is dropped.
        let t = std::time::Instant::now();
        for _ in 0..WRITEBACK_QUEUE * 4 {
            start_writeback(&f, 0, 1 << 20);
        }
        let queued = t.elapsed();
        drop(f);
        drain_writeback();
        assert_eq!(
            open_on(&path),
            0,
            "no descriptor of a fetched file is left open after a drain (queued {:?})",
            queued
        );
        // The queue works on after a drain.
        let f = File::open(&path).unwrap();
        start_writeback(&f, 0, 4096);
        drop(f);
        drain_writeback();
        assert_eq!(open_on(&path), 0, "closed after a second drain");
    }
}
