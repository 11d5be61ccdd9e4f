//! The fuser `Filesystem` implementation: one store call per request.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

use crate::MountOptions;
use crate::gate::WorkerGate;
use fuser::{
    AccessFlags, BackingId, CopyFileRangeFlags, Errno, FileHandle, FileType, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use kaiso_store::migrate::samba_meta::{self, DosAttrib};
use kaiso_store::{Caller, FileAttr, FileKind, FsError, Ino, SetAttr, Store, TimeSet};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// Passthrough backing ids: the kernel wants one per inode while any handle uses it.
#[derive(Default)]
struct Backing {
    by_ino: HashMap<Ino, (Arc<BackingId>, usize)>,
    by_fh: HashMap<u64, Ino>,
}

/// What the face has served, shared with the mount handle (tests read it to tell whether
/// the kernel did I/O itself, through passthrough, or sent it to kaiso).
#[derive(Debug, Default)]
pub struct FaceStats {
    /// READ requests answered.
    pub reads: AtomicU64,
    /// WRITE requests answered.
    pub writes: AtomicU64,
    /// COPY_FILE_RANGE requests answered (the bytes go from backing file to backing file,
    /// not through the face).
    pub copies: AtomicU64,
    /// Requests on a node id the store no longer knows, answered ESTALE.
    pub stale: AtomicU64,
    /// Whether the kernel accepted passthrough at init.
    pub passthrough: AtomicBool,
}

/// The FUSE face over a store.
pub struct KaisoFs {
    store: Arc<Store>,
    ttl: Duration,
    negative_ttl: Duration,
    want_passthrough: bool,
    stats: Arc<FaceStats>,
    backing: Mutex<Backing>,
    /// Regular files a rename replaced, held open by the face (see [`KaisoFs::hold_rename_target`]):
    /// inode -> (handle, since when).
    replaced: Mutex<HashMap<Ino, (u64, Instant)>>,
    /// Directories rmdir removed, until the kernel forgets them: a process may still hold
    /// one (its working directory, an open descriptor). Requests on them are answered
    /// ENOENT, not ESTALE: a new path walk cannot find anything better.
    removed_dirs: Mutex<HashSet<Ino>>,
    /// Keeps one worker reading and the others standing by (see [`crate::gate`]).
    gate: WorkerGate,
}

/// Longest time the face holds a file a rename replaced (normally the kernel's FORGET of
/// it comes first): a caller's path walk that found the old file sends its OPEN or GETATTR
/// microseconds later, unless it was descheduled.
const HOLD_REPLACED: Duration = Duration::from_secs(30);

/// The capabilities asked for at init (those the kernel offers), besides passthrough.
/// FUSE_DONT_MASK: the kernel sends the mode unmasked (with the umask beside it), so the
/// store can apply the umask only where no default ACL says otherwise.
pub const INIT_FLAGS: InitFlags = InitFlags::FUSE_POSIX_ACL
    .union(InitFlags::FUSE_DONT_MASK)
    .union(InitFlags::FUSE_PARALLEL_DIROPS)
    .union(InitFlags::FUSE_DO_READDIRPLUS)
    .union(InitFlags::FUSE_READDIRPLUS_AUTO);

fn errno(e: FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn kind(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

fn attr(a: &FileAttr) -> fuser::FileAttr {
    fuser::FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The attributes sent with a negative entry (inode 0): only the inode number matters.
pub fn negative_attr() -> fuser::FileAttr {
    let epoch = SystemTime::UNIX_EPOCH;
    fuser::FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: epoch,
        mtime: epoch,
        ctime: epoch,
        crtime: epoch,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

fn time(t: Option<TimeOrNow>) -> Option<TimeSet> {
    t.map(|t| match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(s) => TimeSet::At(s),
    })
}

impl KaisoFs {
    /// The FUSE face over `store`, mounted as `opts` says (busy-polling as
    /// `opts.busy_poll` says, see [`crate::busy_poll`]).
    pub fn new(store: Arc<Store>, opts: &MountOptions) -> KaisoFs {
        KaisoFs {
            store,
            ttl: opts.ttl,
            negative_ttl: opts.negative_ttl(),
            want_passthrough: opts.passthrough,
            stats: Arc::default(),
            backing: Mutex::new(Backing::default()),
            replaced: Mutex::default(),
            removed_dirs: Mutex::default(),
            gate: WorkerGate::with_options(opts.threads, opts.busy_poll, opts.follow),
        }
    }

    /// What this face has served (shared: it stays readable after the mount took the face).
    pub fn stats(&self) -> Arc<FaceStats> {
        self.stats.clone()
    }

    /// The errno for a failed request on node id `ino`. ENOENT there means the inode, not a
    /// name, is gone: a rename replaced it or an unlink removed it after the caller's path
    /// walk had found it. ESTALE makes the kernel redo the walk once with LOOKUP_REVAL
    /// (open, stat, chmod/chown/utimes, truncate, xattrs, readlink, access, link all do), so
    /// the caller sees the name's current file, as on a local file system, instead of a
    /// spurious ENOENT. A known inode keeps its ENOENT (e.g. a stub whose source is gone).
    fn ino_errno(&self, ino: Ino, e: FsError) -> Errno {
        if e == FsError::NOENT && !self.store_knows(ino) {
            return self.gone_errno(ino);
        }
        errno(e)
    }

    /// The errno for a request on node id `ino`, which the store no longer knows: ESTALE
    /// (see [`KaisoFs::ino_errno`]), or ENOENT for a directory rmdir removed.
    fn gone_errno(&self, ino: Ino) -> Errno {
        if self.removed_dirs_lock().contains(&ino) {
            return Errno::ENOENT;
        }
        self.stats.stale.fetch_add(1, Ordering::Relaxed);
        Errno::ESTALE
    }

    fn removed_dirs_lock(&self) -> std::sync::MutexGuard<'_, HashSet<Ino>> {
        self.removed_dirs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store_knows(&self, ino: Ino) -> bool {
        !matches!(self.store.getattr(ino, None), Err(e) if e == FsError::NOENT)
    }

    fn ino_empty(&self, ino: Ino, reply: ReplyEmpty, r: Result<(), FsError>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(self.ino_errno(ino, e)),
        }
    }

    fn xattr_reply(&self, ino: Ino, reply: ReplyXattr, size: u32, r: Result<Vec<u8>, FsError>) {
        match r {
            Ok(v) if size == 0 => reply.size(v.len() as u32),
            Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
            Ok(v) => reply.data(&v),
            Err(e) => reply.error(self.ino_errno(ino, e)),
        }
    }

    /// Before a rename over an existing regular file: open that file, so that a caller
    /// whose path walk found it just before the rename can still open and stat it, as on a
    /// local file system (the store keeps an open file with no name reachable). Without
    /// this the caller's request on the old node id is answered ESTALE and the kernel
    /// walks again, which a second rename in that moment can make fail for good.
    /// Returns the inode it now holds.
    fn hold_rename_target(&self, newparent: Ino, newname: &OsStr) -> Option<Ino> {
        let a = self.store.lookup(newparent, newname).ok()?;
        // The lookup counted a kernel reference the kernel does not hold: give it back
        // after the open, so the file cannot be forgotten in between.
        let ino = a.ino;
        // A file with another name left stays reachable anyway.
        let holdable = a.kind == FileKind::File
            && a.nlink == 1
            && !self.replaced_lock().contains_key(&ino)
            && self.store.stub_state(ino).missing.is_empty();
        let mut held = None;
        if holdable {
            if let Ok(o) = self.store.open_file(ino, libc::O_RDONLY, false) {
                let earlier = self.replaced_lock().insert(ino, (o.fh, Instant::now()));
                if let Some((fh, _)) = earlier {
                    let _ = self.store.release(fh);
                }
                held = Some(ino);
            }
        }
        self.store.forget(ino, 1);
        held
    }

    /// Release held replaced files: `ino`'s (the kernel forgot it) and those held longer
    /// than [`HOLD_REPLACED`].
    fn release_replaced(&self, ino: Option<Ino>) {
        self.release_replaced_if(|i, since| Some(i) == ino || since.elapsed() >= HOLD_REPLACED);
    }

    fn release_replaced_if(&self, done_with: impl Fn(Ino, Instant) -> bool) {
        let done: Vec<u64> = {
            let mut held = self.replaced_lock();
            if held.is_empty() {
                return;
            }
            let mut done = Vec::new();
            held.retain(|i, (fh, since)| {
                let keep = !done_with(*i, *since);
                if !keep {
                    done.push(*fh);
                }
                keep
            });
            done
        };
        for fh in done {
            let _ = self.store.release(fh);
        }
    }

    fn replaced_lock(&self) -> std::sync::MutexGuard<'_, HashMap<Ino, (u64, Instant)>> {
        self.replaced.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The gate of this file system's workers (the mount closes it before unmounting).
    pub fn gate(&self) -> WorkerGate {
        self.gate.clone()
    }

    fn entry(&self, reply: ReplyEntry, r: Result<FileAttr, FsError>) {
        match r {
            Ok(a) => reply.entry(&self.ttl, &attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn empty(reply: ReplyEmpty, r: Result<(), FsError>) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// The backing id for a passthrough open of `ino` (shared by its handles).
    fn backing_for(
        &self,
        ino: Ino,
        fh: u64,
        file: &std::fs::File,
        open: impl FnOnce(&std::fs::File) -> std::io::Result<BackingId>,
    ) -> Option<Arc<BackingId>> {
        let mut b = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        let id = match b.by_ino.get_mut(&ino) {
            Some((id, n)) => {
                *n += 1;
                id.clone()
            }
            None => match open(file) {
                Ok(id) => {
                    let id = Arc::new(id);
                    b.by_ino.insert(ino, (id.clone(), 1));
                    id
                }
                Err(e) => {
                    tracing::debug!(ino, error = %e, "passthrough refused; serving through FUSE");
                    return None;
                }
            },
        };
        b.by_fh.insert(fh, ino);
        Some(id)
    }

    fn drop_backing(&self, fh: u64) {
        let mut b = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ino) = b.by_fh.remove(&fh) {
            if let Some((_, n)) = b.by_ino.get_mut(&ino) {
                *n -= 1;
                if *n == 0 {
                    b.by_ino.remove(&ino);
                }
            }
        }
    }

    fn passthrough_on(&self) -> bool {
        self.stats.passthrough.load(Ordering::Relaxed)
    }
}

impl fuser::Filesystem for KaisoFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        if config.add_capabilities(INIT_FLAGS & caps).is_err() {
            tracing::warn!("kernel refused some FUSE capabilities");
        }
        if self.want_passthrough
            && self.store.config().passthrough
            && caps.contains(InitFlags::FUSE_PASSTHROUGH)
        {
            let ok = config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
                && config.set_max_stack_depth(2).is_ok();
            self.stats.passthrough.store(ok, Ordering::Relaxed);
        }
        tracing::info!(
            passthrough = self.passthrough_on(),
            "FUSE session initialised"
        );
        Ok(())
    }

    fn destroy(&mut self) {
        self.release_replaced_if(|_, _| true);
        self.gate.close();
        self.store.shutdown();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.lookup(parent.0, name) {
            // Inode 0 with a timeout: the kernel caches the negative entry, so repeated
            // lookups of a missing name (and the lookup before a create) cost no round trip.
            Err(e) if e.errno() == libc::ENOENT && !self.negative_ttl.is_zero() => {
                reply.entry(&self.negative_ttl, &negative_attr(), Generation(0))
            }
            r => self.entry(reply, r),
        }
    }

    /// Gated (so the worker may busy-poll after it: an unlink's FORGET comes between its
    /// UNLINK and the caller's next request), but never parks: fuser hands a
    /// BATCH_FORGET to `forget` node by node (see [`WorkerGate::serve_forget`]).
    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        let _serving = self.gate.serve_forget(req.unique().0);
        self.store.forget(ino.0, nlookup);
        self.release_replaced(Some(ino.0));
        self.removed_dirs_lock().remove(&ino.0);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(a) => reply.attr(&self.ttl, &attr(&a)),
            Err(e) if e == FsError::NOENT && fh.is_none() => reply.error(self.gone_errno(ino.0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: time(atime),
            mtime: time(mtime),
            fh: fh.map(|f| f.0),
        };
        match self.store.setattr(ino.0, &set, caller(req)) {
            Ok(a) => reply.attr(&self.ttl, &attr(&a)),
            Err(e) => reply.error(self.ino_errno(ino.0, e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.readlink(ino.0) {
            Ok(t) => reply.data(t.as_encoded_bytes()),
            Err(e) => reply.error(self.ino_errno(ino.0, e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        self.entry(
            reply,
            self.store
                .mknod(parent.0, name, mode, umask, rdev as u64, caller(req)),
        );
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        self.entry(
            reply,
            self.store.mkdir(parent.0, name, mode, umask, caller(req)),
        );
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.gate.serve_for(req.pid());
        Self::empty(reply, self.store.unlink(parent.0, name));
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.gate.serve_for(req.pid());
        // The directory's node id, to remember it removed (the lookup's reference is
        // given back below: the kernel holds its own).
        let ino = self.store.lookup(parent.0, name).ok().map(|a| a.ino);
        let r = self.store.rmdir(parent.0, name);
        if let Some(ino) = ino {
            if r.is_ok() {
                self.removed_dirs_lock().insert(ino);
            }
            self.store.forget(ino, 1);
        }
        Self::empty(reply, r);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        self.entry(
            reply,
            self.store.symlink(parent.0, link_name, target, caller(req)),
        );
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        // Only a plain rename replaces its target (NOREPLACE fails, EXCHANGE keeps both).
        let held = if flags.is_empty() {
            self.hold_rename_target(newparent.0, newname)
        } else {
            None
        };
        let r = self
            .store
            .rename(parent.0, name, newparent.0, newname, flags.bits());
        let failed = r.is_err();
        Self::empty(reply, r);
        if failed {
            // Nothing was replaced: the target keeps its name, no need to hold it.
            self.release_replaced(held);
        } else if held.is_some() {
            self.release_replaced(None);
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.link(ino.0, newparent.0, newname) {
            Ok(a) => reply.entry(&self.ttl, &attr(&a), Generation(0)),
            Err(e) => reply.error(self.ino_errno(ino.0, e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.open_file(ino.0, flags.0, self.passthrough_on()) {
            Ok(o) => {
                if let Some(file) = &o.passthrough {
                    if let Some(id) = self.backing_for(ino.0, o.fh, file, |f| reply.open_backing(f))
                    {
                        reply.opened_passthrough(FileHandle(o.fh), FopenFlags::empty(), &id);
                        return;
                    }
                    self.store.passthrough_refused(o.fh);
                }
                reply.opened(
                    FileHandle(o.fh),
                    if o.direct_io {
                        FopenFlags::FOPEN_DIRECT_IO
                    } else {
                        FopenFlags::empty()
                    },
                );
            }
            Err(e) => reply.error(self.ino_errno(ino.0, e)),
        }
    }

    fn read(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        match self.store.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        match self.store.write(fh.0, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(e)),
        }
    }

    /// kaiso buffers nothing and leaves POSIX locks to the kernel (FUSE_POSIX_LOCKS is not
    /// asked for), so a close has nothing to tell it: ENOSYS makes the kernel stop sending
    /// FLUSH, which saves one round trip per close(2). The kernel still writes back its own
    /// dirty pages before close returns.
    fn flush(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        // The backing id goes first: once the store counts the handle closed the file may
        // move, and a later open must not get this (old) copy's backing id.
        self.drop_backing(fh.0);
        let r = self.store.release(fh.0);
        Self::empty(reply, r);
    }

    fn fsync(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        Self::empty(reply, self.store.fsync(fh.0, datasync));
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(self.ino_errno(ino.0, e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.readdir(fh.0, offset) {
            Ok(entries) => {
                for e in entries {
                    if reply.add(INodeNo(e.ino), e.offset, kind(e.kind), &e.name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.readdirplus(fh.0, offset) {
            Ok(entries) => {
                let mut full = false;
                for (e, a) in entries {
                    let counted = e.name != "." && e.name != "..";
                    if full
                        || reply.add(
                            INodeNo(e.ino),
                            e.offset,
                            &e.name,
                            &self.ttl,
                            &attr(&a),
                            Generation(0),
                        )
                    {
                        // Not sent: give back the lookup reference readdirplus took.
                        full = true;
                        if counted {
                            self.store.forget(e.ino, 1);
                        }
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn releasedir(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        Self::empty(reply, self.store.releasedir(fh.0));
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        Self::empty(reply, self.store.fsyncdir(ino.0));
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        let value = dosattrib_to_store(&self.store, ino.0, name, value);
        let r = self.store.setxattr(ino.0, name, &value, flags);
        self.ino_empty(ino.0, reply, r);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _serving = self.gate.serve_for(req.pid());
        let stored = self.store.getxattr(ino.0, name);
        let r = offline_dosattrib(&self.store, ino.0, name, stored, req.pid());
        self.xattr_reply(ino.0, reply, size, r);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _serving = self.gate.serve_for(req.pid());
        // Only what is stored: the OFFLINE bit is Samba's alone (see `offline_dosattrib`).
        let r = self.store.listxattr(ino.0);
        self.xattr_reply(ino.0, reply, size, r);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.gate.serve_for(req.pid());
        self.ino_empty(ino.0, reply, self.store.removexattr(ino.0, name));
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _serving = self.gate.serve_for(req.pid());
        self.ino_empty(
            ino.0,
            reply,
            self.store.access(ino.0, mask.bits(), caller(req)),
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.create(
            parent.0,
            name,
            mode,
            umask,
            flags,
            caller(req),
            self.passthrough_on(),
        ) {
            Ok((a, o)) => {
                if let Some(file) = &o.passthrough {
                    if let Some(id) = self.backing_for(a.ino, o.fh, file, |f| reply.open_backing(f))
                    {
                        reply.created_passthrough(
                            &self.ttl,
                            &attr(&a),
                            Generation(0),
                            FileHandle(o.fh),
                            FopenFlags::empty(),
                            &id,
                        );
                        return;
                    }
                    self.store.passthrough_refused(o.fh);
                }
                reply.created(
                    &self.ttl,
                    &attr(&a),
                    Generation(0),
                    FileHandle(o.fh),
                    if o.direct_io {
                        FopenFlags::FOPEN_DIRECT_IO
                    } else {
                        FopenFlags::empty()
                    },
                );
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    /// kaiso implements no ioctl: answer what a plain file does for one it does not know
    /// (ENOTTY), not fuser's ENOSYS with a WARN per call (every buffered Python open() asks
    /// TCGETS to see whether the file is a terminal).
    fn ioctl(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        reply.error(Errno::ENOTTY);
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        Self::empty(reply, self.store.fallocate(fh.0, offset, length, mode));
    }

    /// copy_file_range(2) between two files of the mount: the store copies between the
    /// backing files (in the kernel where they share a file system), so `cp` sends no
    /// READ or WRITE through the daemon. The kernel has already checked the handles'
    /// modes and cut the length at the source's end (as it knew the size).
    fn copy_file_range(
        &self,
        req: &Request,
        _ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        _ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        self.stats.copies.fetch_add(1, Ordering::Relaxed);
        if !flags.is_empty() {
            reply.error(Errno::EINVAL);
            return;
        }
        match self
            .store
            .copy_file_range(fh_in.0, offset_in, fh_out.0, offset_out, len)
        {
            // The store copies at most `u32::MAX & PAGE_MASK` bytes per call.
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let _serving = self.gate.serve_for(req.pid());
        match self.store.lseek(fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(errno(e)),
        }
    }
}

/// Samba ("store dos attributes", its default) reads DOS attributes from `user.DOSATTRIB`.
/// A file whose data is still on a migration source is reported FILE_ATTRIBUTE_OFFLINE
/// to Samba, so Explorer skips it for thumbnails: the stored value (the SMB source's
/// attributes and creation time, or what Samba wrote) is read with OFFLINE added, in its
/// own encoding; without one, a version-5 value with ARCHIVE|OFFLINE is synthesised. The
/// bit is never stored: nothing of it remains once the file is whole.
///
/// Only Samba is told (a request from an `smbd` process, by its `/proc/PID/comm`), and
/// the made-up name is never listed: Samba reads `user.DOSATTRIB` by name (and hides it
/// from SMB clients' EA lists), while copy tools (`rsync -aX`, `tar --xattrs`, `cp -a`)
/// list the names and copy every value they get, so a copy taken from the mount during
/// the migration would claim to be offline for good.
const DOSATTRIB: &str = samba_meta::DOSATTRIB_XATTR;

fn offline(store: &Store, ino: Ino) -> bool {
    !store.stub_state(ino).missing.is_empty()
}

/// `stored` (the value of xattr `name` of `ino`), as process `pid` must see it.
fn offline_dosattrib(
    store: &Store,
    ino: Ino,
    name: &OsStr,
    stored: Result<Vec<u8>, FsError>,
    pid: u32,
) -> Result<Vec<u8>, FsError> {
    if name != DOSATTRIB || !offline(store, ino) || !is_samba(pid) {
        return stored;
    }
    with_offline(stored)
}

/// Whether process (thread) `pid` is Samba's file server: its command name is `smbd` or
/// starts so (smbd 4.15+ names its client processes `smbd[ADDRESS]`, `smbd-…` its
/// helpers). A pid the mount's pid namespace does not see (0) is not.
fn is_samba(pid: u32) -> bool {
    pid != 0 && std::fs::read(format!("/proc/{pid}/comm")).is_ok_and(|c| is_samba_comm(&c))
}

fn is_samba_comm(comm: &[u8]) -> bool {
    comm.starts_with(b"smbd")
}

/// A stored `user.DOSATTRIB` (or its absence) with FILE_ATTRIBUTE_OFFLINE added.
fn with_offline(stored: Result<Vec<u8>, FsError>) -> Result<Vec<u8>, FsError> {
    let value = match stored {
        Ok(blob) => match DosAttrib::decode(&blob) {
            Ok(v) => v,
            // Not a form we know: Samba's own, unchanged, beats a guess.
            Err(_) => return Ok(blob),
        },
        Err(e) if e == FsError::NODATA || e.errno() == libc::EOPNOTSUPP => DosAttrib::V5 {
            valid_flags: samba_meta::XATTR_DOSINFO_ATTRIB,
            attrib: samba_meta::FILE_ATTRIBUTE_ARCHIVE,
            create_time: 0,
        },
        Err(e) => return Err(e),
    };
    let attrib = value.attrib().unwrap_or(samba_meta::FILE_ATTRIBUTE_ARCHIVE);
    Ok(value
        .with_attrib(attrib | samba_meta::FILE_ATTRIBUTE_OFFLINE)
        .encode())
}

/// What a writer of `user.DOSATTRIB` stores for a file that is offline: its value without
/// the OFFLINE bit this face added. (smbd 4.17 masks OFFLINE out itself when it sets
/// attributes; Samba versions whose attribute mask keeps it write back what they read.)
fn dosattrib_to_store<'a>(
    store: &Store,
    ino: Ino,
    name: &OsStr,
    value: &'a [u8],
) -> std::borrow::Cow<'a, [u8]> {
    if name != DOSATTRIB || !offline(store, ino) {
        return value.into();
    }
    without_offline(value)
}

fn without_offline(value: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    match DosAttrib::decode(value) {
        Ok(v) => match v.attrib() {
            Some(a) if a & samba_meta::FILE_ATTRIBUTE_OFFLINE != 0 => v
                .with_attrib(a & !samba_meta::FILE_ATTRIBUTE_OFFLINE)
                .encode()
                .into(),
            _ => value.into(),
        },
        Err(_) => value.into(),
    }
}

#[cfg(test)]
mod dosattrib_tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// smbd 4.17 wrote this one for a hidden+system+archive file (version 5).
    const HSA: &str = "00000500050000001100000026000000dbebfb9a7e7add01";
    const HSA_OFFLINE: &str = "00000500050000001100000026100000dbebfb9a7e7add01";

    #[test]
    fn offline_is_added_in_the_stored_encoding_and_taken_off_on_write() {
        assert_eq!(with_offline(Ok(hex(HSA))).unwrap(), hex(HSA_OFFLINE));
        assert_eq!(without_offline(&hex(HSA_OFFLINE)).into_owned(), hex(HSA));
        assert_eq!(without_offline(&hex(HSA)).into_owned(), hex(HSA));
        // Samba 3's hex form stays a hex form.
        assert_eq!(with_offline(Ok(b"0x22\0".to_vec())).unwrap(), b"0x1022\0");
    }

    #[test]
    fn only_smbd_processes_are_samba() {
        assert!(is_samba_comm(b"smbd\n"));
        assert!(is_samba_comm(b"smbd[127.0.0.1]\n"));
        assert!(!is_samba_comm(b"rsync\n"));
        assert!(!is_samba_comm(b"tar\n"));
        assert!(!is_samba_comm(b"nmbd\n"));
        // This test's own process is no Samba, nor is a pid outside the namespace.
        assert!(!is_samba(std::process::id()));
        assert!(!is_samba(0));
    }

    #[test]
    fn nothing_stored_gives_archive_offline_and_unknown_forms_pass() {
        let made = DosAttrib::decode(&with_offline(Err(FsError::NODATA)).unwrap()).unwrap();
        assert_eq!(made.attrib(), Some(0x1020));
        assert_eq!(made.create_time(), None);
        let odd = b"not samba".to_vec();
        assert_eq!(with_offline(Ok(odd.clone())).unwrap(), odd);
        assert_eq!(without_offline(&odd).into_owned(), odd);
        assert!(with_offline(Err(FsError::NOENT)).is_err());
    }
}
