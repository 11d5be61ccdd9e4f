//! Namespace operations of the [`Store`]: lookup, attributes, create/remove, rename, link,
//! directories, xattrs, statfs, access.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

use crate::db::JournalRow;
use crate::error::{FsError, FsResult};
use crate::handles::{DirHandle, FileState};
use crate::namespace::{FileNode, Namespace};
use crate::store::{FailPoint, Store, TEMP_PREFIX};
use crate::tier::BackingPath;
use crate::types::{
    Caller, DirEntry, FileAttr, FileKind, Ino, ROOT_INO, SetAttr, StatFs, TimeSet, rename_flags,
};
use crate::util::{self, UTime};
use kaiso_policy::Op;
use std::ffi::{OsStr, OsString};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

pub(crate) fn check_name(name: &OsStr) -> FsResult<()> {
    let b = util::name_bytes(name);
    if b.is_empty() || b.contains(&b'/') || b == b"." || b == b".." {
        return Err(FsError::INVAL);
    }
    if b.len() > 255 {
        return Err(FsError::NAMETOOLONG);
    }
    Ok(())
}

/// A tier's file system has no room for a new entry (blocks or inodes, or the quota):
/// the entry goes to another tier.
fn no_room(e: FsError) -> bool {
    e == FsError::NOSPC || e.errno() == libc::EDQUOT
}

fn hidden(name: &OsStr) -> bool {
    util::name_bytes(name).starts_with(TEMP_PREFIX.as_bytes())
}

fn utime(t: Option<TimeSet>) -> UTime {
    match t {
        None => UTime::Omit,
        Some(TimeSet::Now) => UTime::Now,
        Some(TimeSet::At(t)) => UTime::At(t),
    }
}

/// How a new inode gets its mode bits (see [`Store::creation_mode`]).
pub(crate) struct NewMode {
    /// Bits to create it with.
    pub bits: u32,
    /// Whether to `chmod` it to `bits` after creation (umask applied by hand).
    pub chmod_after: bool,
    /// The caller's umask, to set around the create (the backing file system applies it,
    /// or the directory's default ACL).
    pub fs_umask: Option<u32>,
}

impl Store {
    /// Find `name` in `parent`: from the index, else by probing the tiers (files added
    /// directly to a tier directory are adopted on first sight).
    pub(crate) fn find_child(
        &self,
        ns: &mut Namespace,
        parent: Ino,
        name: &OsStr,
    ) -> FsResult<Option<Ino>> {
        if !ns.is_dir(parent) {
            return Err(if ns.files.contains_key(&parent) {
                FsError::NOTDIR
            } else {
                FsError::NOENT
            });
        }
        if hidden(name) {
            return Ok(None);
        }
        if let Some(i) = ns.child(parent, name) {
            return Ok(Some(i));
        }
        let rel = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        for (ti, t) in self.tiers.iter().enumerate() {
            let Some(st) = util::lstat_opt(&t.backing(&rel))? else {
                continue;
            };
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                let ino = self.assign_dir_ino(ns, &rel)?;
                ns.add_dir(ino, parent, name, rel, false);
                return Ok(Some(ino));
            }
            let ino = self.assign_file_ino(ns, ti as u8, st.st_ino)?;
            let size = st.st_size as u64;
            let kind = FileKind::from_mode(st.st_mode);
            let fresh = !ns.files.contains_key(&ino);
            ns.add_file_name(ino, parent, name, || FileNode {
                kind,
                tier: ti as u8,
                bino: st.st_ino,
                names: Vec::new(),
                state: FileState::new(ino, ti as u8, size),
                lookups: 0,
            });
            if fresh && kind == FileKind::File {
                t.add_used(size as i64);
                self.placer().placed(ino, size, ti as u8);
            }
            return Ok(Some(ino));
        }
        ns.recent_misses.record(parent, name);
        Ok(None)
    }

    /// Attributes of an inode as clients see them (index lock held).
    pub(crate) fn attr_locked(&self, ns: &mut Namespace, ino: Ino) -> FsResult<FileAttr> {
        self.attr_view(ns, ino, true)
    }

    /// Attributes of an inode (index lock held); `client`: as clients see them (a file
    /// the store wrote into shows the ctime from before, see [`crate::stub::CtimeMask`]),
    /// else with the backing file's ctime.
    fn attr_view(&self, ns: &mut Namespace, ino: Ino, client: bool) -> FsResult<FileAttr> {
        if let Some(d) = ns.dirs.get(&ino) {
            let unlisted = d.unlisted;
            let shown_nlink = d.shown_nlink.filter(|_| unlisted);
            let (_, st) = self.dir_stat(&d.path)?;
            let mut attr = Self::attr_of(ino, &st);
            if let Some(n) = shown_nlink {
                // Not listed yet: its source's link count (2 + its subdirectories),
                // not the 2 of its still empty backing directory.
                attr.nlink = attr.nlink.max(n);
            }
            if client {
                attr.ctime = self.dir_ctime_shown(ino, unlisted, attr.ctime);
            }
            return Ok(attr);
        }
        let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
        if let Some(path) = ns.file_path(ino) {
            let t = &self.tiers[f.tier as usize];
            let found = match util::lstat_opt(&t.backing(&path))? {
                Some(st) => Some(st),
                // Removed behind our back, or its tier directory is away (perhaps for
                // less than the 100 ms root check): the root is checked now.
                None => match self.backing_missing(ns, f.tier, &path) {
                    crate::tier::Missing::Back(st) => Some(st),
                    crate::tier::Missing::Gone | crate::tier::Missing::TierAway => None,
                },
            };
            let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
            match found {
                Some(st) => {
                    let mut attr = Self::attr_of(ino, &st);
                    Self::stub_view(&f.state, &mut attr, client);
                    return Ok(attr);
                }
                None => {
                    // Forget the name (a tier that is away shows it again when it
                    // returns).
                    let names = f.names.clone();
                    for (p, n) in names {
                        ns.remove_name(p, &n);
                    }
                }
            }
        }
        let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
        if let Some(h) = f.state.open_handles().first() {
            let st = util::fstat(&h.file())?;
            let mut attr = Self::attr_of(ino, &st);
            Self::stub_view(&h.state, &mut attr, client);
            return Ok(Self::orphan_attr(&h.state, attr));
        }
        Err(FsError::NOENT)
    }

    /// The ctime clients see of directory `ino` whose backing ctime is `real`: a
    /// directory first seen unlisted keeps showing that ctime while the migration lists
    /// it (creates its entries, restores its times and metadata), and after, until
    /// someone else changes it (see [`crate::stub::CtimeMask`]).
    fn dir_ctime_shown(
        &self,
        ino: Ino,
        unlisted: bool,
        real: std::time::SystemTime,
    ) -> std::time::SystemTime {
        let mut masks = self.dir_ctime.lock().unwrap_or_else(|e| e.into_inner());
        match masks.get_mut(&ino) {
            Some(m) => {
                let shown = m.shown(real);
                if m.is_void() {
                    masks.remove(&ino);
                }
                shown
            }
            None if unlisted => {
                masks.insert(ino, crate::stub::CtimeMask::pin(real));
                real
            }
            None => real,
        }
    }

    /// Directory `ino` (at `rel`) is listed: the store's changes to it are over (see
    /// [`Store::dir_ctime_shown`]).
    pub(crate) fn dir_listing_settled(&self, ino: Ino, rel: &Path) {
        if !self
            .dir_ctime
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&ino)
        {
            return;
        }
        let real = self
            .dir_stat(rel)
            .ok()
            .map(|(_, st)| util::ts(st.st_ctime, st.st_ctime_nsec));
        let mut masks = self.dir_ctime.lock().unwrap_or_else(|e| e.into_inner());
        match (masks.get_mut(&ino), real) {
            (Some(m), Some(real)) => m.settle(real),
            (Some(_), None) => {
                masks.remove(&ino);
            }
            (None, _) => {}
        }
    }

    /// What fetching into file `state` must not change of `attr` (its backing file's):
    /// a stub shows its pending mtime, also while a fetch has written a unit and not yet
    /// put the mtime back; and with `client`, the ctime from before the store's own
    /// writes ([`crate::stub::CtimeMask`]).
    fn stub_view(state: &FileState, attr: &mut FileAttr, client: bool) {
        let stub = state.stub.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, mtime)) = stub.as_ref().and_then(|s| s.times) {
            attr.mtime = mtime;
        }
        drop(stub);
        if client {
            let mut m = state.ctime.lock().unwrap_or_else(|e| e.into_inner());
            attr.ctime = m.shown(attr.ctime);
        }
    }

    /// A file with no name left shows no links, even once its data has a hidden name in
    /// an orphan directory.
    fn orphan_attr(state: &FileState, mut attr: FileAttr) -> FileAttr {
        if state.orphan_path().is_some() {
            attr.nlink = 0;
        }
        attr
    }

    pub(crate) fn fill_dir_if_stub(&self, ino: Ino) -> FsResult<()> {
        let path = {
            let ns = self.ns();
            match ns.dirs.get(&ino) {
                Some(d) if d.unlisted => d.path.clone(),
                _ => return Ok(()),
            }
        };
        let Some(filler) = self.stub_filler() else {
            return Ok(());
        };
        // No store-wide lock here: the filler serialises per directory and lets its own
        // re-entry through (see `stub::DirFillGate`), so listings of different
        // directories run in parallel and a filler's link into the directory it is
        // listing cannot deadlock.
        filler.fill_dir(self, ino, &path)
    }

    /// Look `name` up in directory `parent`. Counts one kernel lookup reference.
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> FsResult<FileAttr> {
        if util::name_bytes(name).len() > 255 {
            return Err(FsError::NAMETOOLONG);
        }
        self.fill_dir_if_stub(parent)?;
        let mut ns = self.ns();
        let ino = self
            .find_child(&mut ns, parent, name)?
            .ok_or(FsError::NOENT)?;
        let attr = self.attr_locked(&mut ns, ino)?;
        self.add_lookup(&mut ns, ino, 1);
        Ok(attr)
    }

    pub(crate) fn add_lookup(&self, ns: &mut Namespace, ino: Ino, n: u64) {
        if let Some(d) = ns.dirs.get_mut(&ino) {
            d.lookups += n;
        } else if let Some(f) = ns.files.get_mut(&ino) {
            f.lookups += n;
        }
    }

    /// The kernel dropped `n` lookup references.
    pub fn forget(&self, ino: Ino, n: u64) {
        let mut ns = self.ns();
        if let Some(d) = ns.dirs.get_mut(&ino) {
            d.lookups = d.lookups.saturating_sub(n);
        } else if let Some(f) = ns.files.get_mut(&ino) {
            f.lookups = f.lookups.saturating_sub(n);
            if f.lookups == 0 && f.names.is_empty() && !f.state.has_open_handles() {
                ns.files.remove(&ino);
            }
        }
    }

    /// Attributes of `ino` (through `fh` if given, which works for unlinked open files).
    /// As clients see them: a migration's fetches into a file change neither its mtime
    /// nor its ctime (see [`crate::stub::CtimeMask`]).
    pub fn getattr(&self, ino: Ino, fh: Option<u64>) -> FsResult<FileAttr> {
        if let Some(fh) = fh {
            if let Some(h) = self.handle(fh) {
                let st = util::fstat(&h.file())?;
                let mut attr = Self::attr_of(ino, &st);
                Self::stub_view(&h.state, &mut attr, true);
                return Ok(Self::orphan_attr(&h.state, attr));
            }
        }
        let mut ns = self.ns();
        self.attr_locked(&mut ns, ino)
    }

    /// [`Store::getattr`] with the backing file's own ctime, which every change moves,
    /// the store's fetches included (the migration's `finish` tells a copy nobody
    /// changed since its completion by it).
    pub fn getattr_backing(&self, ino: Ino) -> FsResult<FileAttr> {
        let mut ns = self.ns();
        self.attr_view(&mut ns, ino, false)
    }

    /// chmod, chown, truncate, utimens.
    pub fn setattr(&self, ino: Ino, set: &SetAttr, caller: Caller) -> FsResult<FileAttr> {
        let attrs = set.mode.is_some() || set.uid.is_some() || set.gid.is_some();
        if !attrs && set.atime.is_none() && set.mtime.is_none() {
            return self.stub_setattr(ino, set, caller);
        }
        self.fill_before_change_if_stub(ino)?;
        let attr = self.stub_setattr(ino, set, caller)?;
        // As for `setxattr`: a metadata copy redone after its record was lost would
        // undo this change (the ACL it writes sets the mode).
        self.mark_filler_touched(ino);
        Ok(attr)
    }

    /// [`Store::setattr`] for the stub filler (a listing's or fetch's own times and
    /// sizes): no filler call.
    pub fn stub_setattr(&self, ino: Ino, set: &SetAttr, _caller: Caller) -> FsResult<FileAttr> {
        if let Some(size) = set.size {
            self.truncate(ino, size, set.fh)?;
        }
        // New times of a stub file are the ones it keeps from now on: its pending times
        // are dropped, and the gate is held shared until the new times are on, so a
        // fetch cannot put the old ones back in between (see `stub_client_change`).
        let times_state = if set.atime.is_some() || set.mtime.is_some() {
            self.ns().files.get(&ino).map(|f| f.state.clone())
        } else {
            None
        };
        let _times_gate = times_state
            .as_ref()
            .map(|st| st.gate.read().unwrap_or_else(|e| e.into_inner()));
        if let Some(st) = &times_state {
            self.stub_client_change(st)?;
        }
        let mut ns = self.ns();
        let paths: Vec<BackingPath> = if let Some(d) = ns.dirs.get(&ino) {
            if set.size.is_some() {
                return Err(FsError::ISDIR);
            }
            let rel = d.path.clone();
            self.dir_tiers(&rel)
                .into_iter()
                .map(|t| self.tiers[t as usize].backing(&rel))
                .collect()
        } else {
            let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
            match ns.file_path(ino) {
                Some(p) => vec![self.tiers[f.tier as usize].backing(&p)],
                None => Vec::new(),
            }
        };
        if paths.is_empty() {
            // Unlinked but open: change it through the descriptor.
            let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
            let h = f
                .state
                .open_handles()
                .into_iter()
                .next()
                .ok_or(FsError::NOENT)?;
            let file = h.file();
            if let Some(m) = set.mode {
                file.set_permissions(std::fs::Permissions::from_mode(m & 0o7777))?;
            }
            if set.uid.is_some() || set.gid.is_some() {
                std::os::unix::fs::fchown(&*file, set.uid, set.gid)?;
            }
            if set.atime.is_some() || set.mtime.is_some() {
                let p = PathBuf::from(format!(
                    "/proc/self/fd/{}",
                    std::os::unix::io::AsRawFd::as_raw_fd(&*file)
                ));
                let c = util::cpath(&p)?;
                let times = [utime_spec(set.atime), utime_spec(set.mtime)];
                if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) } != 0 {
                    return Err(FsError::last());
                }
            }
            let st = util::fstat(&file)?;
            return Ok(Self::attr_of(ino, &st));
        }
        for p in &paths {
            if set.uid.is_some() || set.gid.is_some() {
                util::lchown(p, set.uid, set.gid)?;
            }
            if let Some(m) = set.mode {
                let st = util::lstat(p)?;
                if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
                    util::chmod(p, m & 0o7777)?;
                }
            }
            if set.atime.is_some() || set.mtime.is_some() {
                util::lutimens(p, utime(set.atime), utime(set.mtime))?;
            }
        }
        self.attr_locked(&mut ns, ino)
    }

    /// Which tier a new object goes to, by the configured rule, skipping full tiers.
    pub(crate) fn place_new(&self, size_hint: u64) -> FsResult<u8> {
        use crate::config::PlacementRule;
        let n = self.tiers.len() as u8;
        let start = match &self.cfg.placement {
            PlacementRule::FastestWithRoom => 0,
            PlacementRule::Tier(name) => self
                .tiers
                .iter()
                .position(|t| &t.cfg.name == name)
                .unwrap_or(0) as u8,
            PlacementRule::Policy => {
                let states = self.tier_states();
                let now = self.now();
                self.placer().place_new(now, size_hint, &states).min(n - 1)
            }
        };
        // Fastest from `start` below its high watermark; else any with room under the hard limit.
        for t in start..n {
            if self.tiers[t as usize].fits_below_high(size_hint.max(1)) {
                return Ok(t);
            }
        }
        for t in (start..n).chain(0..start) {
            if self.tiers[t as usize].fits(size_hint) {
                return Ok(t);
            }
        }
        Err(FsError::NOSPC)
    }

    /// Owner for a new inode: the caller, with the group of a setgid parent.
    fn owner_for(&self, ns: &Namespace, parent: Ino, caller: Caller) -> (u32, Option<u32>) {
        let sgid = ns
            .dirs
            .get(&parent)
            .and_then(|d| self.dir_stat(&d.path).ok())
            .is_some_and(|(_, st)| st.st_mode & libc::S_ISGID != 0);
        (caller.uid, if sgid { None } else { Some(caller.gid) })
    }

    /// Give the new inode at `p` (stat `st`, updated) to the caller, unless it already is
    /// theirs: a root daemon serving a root caller, the common case, changes nothing.
    fn give_to_caller(
        &self,
        ns: &Namespace,
        parent: Ino,
        caller: Caller,
        p: &Path,
        st: &mut libc::stat,
    ) -> std::io::Result<()> {
        if st.st_uid == caller.uid && st.st_gid == caller.gid {
            return Ok(());
        }
        let (uid, gid) = self.owner_for(ns, parent, caller);
        if st.st_uid == uid && gid.is_none_or(|g| st.st_gid == g) {
            return Ok(());
        }
        util::lchown(p, Some(uid), gid)?;
        *st = util::lstat(p)?;
        Ok(())
    }

    /// Create a non-directory entry on the placement tier with `make`, spilling down on ENOSPC.
    /// `umask`: set around `make` ([`NewMode::fs_umask`]), or None. Also returns the stat
    /// taken of the new entry (for the inode number), from which a caller that replies at
    /// once can build the attributes without asking the tier again.
    pub(crate) fn create_entry(
        &self,
        ns: &mut Namespace,
        parent: Ino,
        name: &OsStr,
        caller: Caller,
        umask: Option<u32>,
        make: &dyn Fn(&Path) -> std::io::Result<Option<std::fs::File>>,
    ) -> FsResult<(Ino, u8, Option<std::fs::File>, libc::stat)> {
        self.create_entry_sized(ns, parent, name, caller, umask, 0, make)
    }

    /// A create on tier `ti` found a name missing (ENOENT): whether that is because the
    /// tier's directory is not at its path now (gone, unmounted, another directory in
    /// its place). Checked at once ([`crate::tier::Tier::root_now`]); a root missing now
    /// takes the tier offline here and records the files it held, as a read that finds
    /// its file missing does ([`Store::backing_missing`]). `ns` is the held namespace
    /// lock.
    fn tier_away_now(&self, ns: &Namespace, ti: u8) -> bool {
        let t = &self.tiers[ti as usize];
        if !t.online() {
            return true;
        }
        match t.root_now() {
            crate::tier::RootNow::Missing { first } => {
                if first {
                    self.note_tier_vanished(ti, ns);
                }
                true
            }
            crate::tier::RootNow::Other => true,
            crate::tier::RootNow::Held | crate::tier::RootNow::Unknown => false,
        }
    }

    /// [`Store::create_entry`] of an entry that holds `size_hint` bytes from its creation
    /// (a migration stub at its listed size; 0 for ordinary creates): it is placed by
    /// that size, and the size is taken on the chosen tier in the same atomic step as
    /// the room check ([`crate::tier::Tier::hold`]), so creators racing for the last room
    /// of a tier cannot all pass. The bytes stay accounted to the tier (`used`) once the
    /// entry exists.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_entry_sized(
        &self,
        ns: &mut Namespace,
        parent: Ino,
        name: &OsStr,
        caller: Caller,
        umask: Option<u32>,
        size_hint: u64,
        make: &dyn Fn(&Path) -> std::io::Result<Option<std::fs::File>>,
    ) -> FsResult<(Ino, u8, Option<std::fs::File>, libc::stat)> {
        check_name(name)?;
        if hidden(name) {
            return Err(FsError::INVAL);
        }
        // The lookup the kernel sent before this create probed the tiers already.
        let probed = ns.is_dir(parent)
            && ns.child(parent, name).is_none()
            && ns.recent_misses.take(parent, name);
        if !probed && self.find_child(ns, parent, name)?.is_some() {
            return Err(FsError::EXIST);
        }
        let rel = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        let parent_rel = ns.dir_path(parent).ok_or(FsError::NOENT)?.to_path_buf();
        let first = self.place_new(size_hint)?;
        let n = self.tiers.len() as u8;
        let mut last_err = FsError::NOSPC;
        for tier in (first..n).chain(0..first) {
            // Given back if the create fails here (dropped), kept once the entry exists.
            let Some(held) = self.tiers[tier as usize].hold(size_hint) else {
                continue;
            };
            let p = self.tiers[tier as usize].backing(&rel);
            let made = match util::creation_umask::with(umask, || make(&p)) {
                // The tier's directory is away (removed, unmounted) and no root check
                // noticed yet: noticed now, and the next tier with room takes the file.
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOENT) && self.tier_away_now(ns, tier) =>
                {
                    continue;
                }
                // The directory has no copy on this tier yet.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match self.ensure_dir(tier, &parent_rel) {
                        Ok(()) => util::creation_umask::with(umask, || make(&p)),
                        // No room there for the directory either: the next tier.
                        Err(e) if no_room(e) => Err(e.into()),
                        Err(e) if e == FsError::NOENT && self.tier_away_now(ns, tier) => continue,
                        Err(e) => return Err(e),
                    }
                }
                r => r,
            };
            let file = match made {
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOENT) && self.tier_away_now(ns, tier) =>
                {
                    continue;
                }
                r => r,
            };
            let file = match file {
                Ok(f) => f,
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOSPC)
                        || e.raw_os_error() == Some(libc::EDQUOT) =>
                {
                    last_err = FsError::NOSPC;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let stat = match &file {
                Some(f) => util::fstat(f),
                None => util::lstat(&p),
            };
            let mut st = match stat {
                Ok(st) => st,
                Err(e) => {
                    let _ = std::fs::remove_file(&p);
                    return Err(e.into());
                }
            };
            if let Err(e) = self.give_to_caller(ns, parent, caller, &p, &mut st) {
                let _ = std::fs::remove_file(&p);
                return Err(e.into());
            }
            let ino = self.assign_file_ino(ns, tier, st.st_ino)?;
            let kind = FileKind::from_mode(st.st_mode);
            ns.add_file_name(ino, parent, name, || FileNode {
                kind,
                tier,
                bino: st.st_ino,
                names: Vec::new(),
                state: FileState::new(ino, tier, 0),
                lookups: 0,
            });
            let now = self.now();
            {
                let mut pl = self.placer();
                pl.placed(ino, 0, tier);
                pl.record(now, ino, Op::Create, 0, 0, 0);
                let rule = if tier == first {
                    format!(
                        "created on tier {} by rule {}",
                        self.tiers[tier as usize].cfg.name, self.cfg.placement
                    )
                } else {
                    format!(
                        "created on tier {} (spilled: faster tiers full)",
                        self.tiers[tier as usize].cfg.name
                    )
                };
                pl.reasons.insert(ino, rule);
            }
            self.trace_event(now, ino, Op::Create, 0, 0, 0, &rel);
            held.keep();
            return Ok((ino, tier, file, st));
        }
        Err(last_err)
    }

    /// Mode bits for a new inode in `parent`: the umask applies unless the parent has a
    /// default ACL (then the backing file system derives the mode from the ACL, as POSIX
    /// says).
    ///
    /// Where the thread can, the umask is left to the backing file system (see
    /// [`util::creation_umask`]): the bits come back unmasked with the umask to set around
    /// the create, and nothing to set after.
    pub(crate) fn creation_mode(
        &self,
        ns: &Namespace,
        parent: Ino,
        mode: u32,
        umask: u32,
    ) -> NewMode {
        if util::creation_umask::available() {
            return NewMode {
                bits: mode & 0o7777,
                chmod_after: false,
                fs_umask: Some(umask & 0o777),
            };
        }
        let has_default_acl = ns
            .dir_path(parent)
            .and_then(|p| {
                self.dir_stat(p)
                    .ok()
                    .map(|(t, _)| self.tiers[t as usize].backing(p))
            })
            .is_some_and(|p| util::lgetxattr(&p, OsStr::new("system.posix_acl_default")).is_ok());
        NewMode {
            bits: if has_default_acl {
                mode & 0o7777
            } else {
                mode & !umask & 0o7777
            },
            chmod_after: !has_default_acl,
            fs_umask: None,
        }
    }

    /// mknod: regular files, fifos, sockets, device nodes.
    pub fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u64,
        caller: Caller,
    ) -> FsResult<FileAttr> {
        self.fill_dir_if_stub(parent)?;
        let mut ns = self.ns();
        let new = self.creation_mode(&ns, parent, mode, umask);
        let (m, set) = (new.bits, new.chmod_after);
        let fmt = mode & libc::S_IFMT;
        let (ino, .., st) =
            self.create_entry(&mut ns, parent, name, caller, new.fs_umask, &|p| {
                if fmt == libc::S_IFREG || fmt == 0 {
                    use std::os::unix::fs::OpenOptionsExt;
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(m)
                        .open(p)?;
                } else {
                    util::mknod(p, fmt | m, rdev)?;
                }
                if set {
                    util::chmod(p, m)?;
                }
                Ok(None)
            })?;
        let attr = Self::attr_of(ino, &st);
        self.add_lookup(&mut ns, ino, 1);
        Ok(attr)
    }

    /// mkdir: on the fastest tier that holds the parent.
    pub fn mkdir(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> FsResult<FileAttr> {
        self.fill_dir_if_stub(parent)?;
        self.mkdir_nofill(parent, name, mode, umask, caller)
    }

    /// mkdir without consulting the stub filler (used by the filler itself).
    pub(crate) fn mkdir_nofill(
        &self,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        umask: u32,
        caller: Caller,
    ) -> FsResult<FileAttr> {
        check_name(name)?;
        if hidden(name) {
            return Err(FsError::INVAL);
        }
        let mut ns = self.ns();
        if self.find_child(&mut ns, parent, name)?.is_some() {
            return Err(FsError::EXIST);
        }
        let parent_rel = ns.dir_path(parent).ok_or(FsError::NOENT)?.to_path_buf();
        let rel = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        let (first, _) = self.dir_stat(&parent_rel)?;
        let new = self.creation_mode(&ns, parent, mode, umask);
        let (m, set) = (new.bits, new.chmod_after);
        // On the fastest tier holding the parent; a tier whose file system is full (no
        // free blocks or inodes: ENOSPC, EDQUOT) is passed over for the next one, slower
        // first, as file creates spill: ENOSPC only when no tier can hold the directory.
        let n = self.tiers.len() as u8;
        let mut made = None;
        for tier in (first..n).chain(0..first) {
            if tier != first {
                match self.ensure_dir(tier, &parent_rel) {
                    Ok(()) => {}
                    Err(e) if no_room(e) => continue,
                    Err(e) => return Err(e),
                }
            }
            let p = self.tiers[tier as usize].backing(&rel);
            match util::creation_umask::with(new.fs_umask, || {
                std::fs::DirBuilder::new().mode(m).create(&p)
            }) {
                Ok(()) => {
                    made = Some(p);
                    break;
                }
                Err(e) if no_room(FsError(e.raw_os_error().unwrap_or(libc::EIO))) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let p = made.ok_or(FsError::NOSPC)?;
        let (uid, gid) = self.owner_for(&ns, parent, caller);
        let r = util::lchown(&p, Some(uid), gid).and_then(|_| {
            // Keep a setgid bit inherited from the parent; apply the requested bits.
            let st = util::lstat(&p)?;
            if set {
                util::chmod(&p, m | (st.st_mode & libc::S_ISGID))
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            let _ = std::fs::remove_dir(&p);
            return Err(e.into());
        }
        let ino = self.assign_dir_ino(&mut ns, &rel)?;
        ns.add_dir(ino, parent, name, rel, false);
        let attr = self.attr_locked(&mut ns, ino)?;
        self.add_lookup(&mut ns, ino, 1);
        Ok(attr)
    }

    /// symlink `name` → `target`.
    pub fn symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> FsResult<FileAttr> {
        self.fill_dir_if_stub(parent)?;
        let mut ns = self.ns();
        let (ino, .., st) = self.create_entry(&mut ns, parent, name, caller, None, &|p| {
            std::os::unix::fs::symlink(target, p)?;
            Ok(None)
        })?;
        let attr = Self::attr_of(ino, &st);
        self.add_lookup(&mut ns, ino, 1);
        Ok(attr)
    }

    pub fn readlink(&self, ino: Ino) -> FsResult<OsString> {
        let ns = self.ns();
        let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
        if f.kind != FileKind::Symlink {
            return Err(FsError::INVAL);
        }
        let p = ns.file_path(ino).ok_or(FsError::NOENT)?;
        Ok(std::fs::read_link(self.tiers[f.tier as usize].backing(&p))?.into_os_string())
    }

    /// A name of file `ino` went away; `nlink_before` is the backing link count before.
    fn after_unlink(&self, ns: &mut Namespace, ino: Ino, nlink_before: u64) {
        let Some(f) = ns.files.get(&ino) else { return };
        if nlink_before > 1 && !f.names.is_empty() {
            return;
        }
        if nlink_before > 1 {
            return;
        }
        let size = f.state.size.load(Ordering::Relaxed);
        let open = f.state.has_open_handles();
        if f.kind == FileKind::File {
            if open {
                // Its data still takes room on the tier until the last handle closes
                // (`Store::orphan_closed` gives it back then).
                f.state.counted_unlinked.store(true, Ordering::Release);
            } else {
                self.tiers[f.tier as usize].add_used(-(size as i64));
            }
        }
        let lookups = f.lookups;
        let had_record = ns.taken.contains(&ino) || self.placer().pins.contains_key(&ino);
        if had_record {
            ns.remap.retain(|_, v| *v != ino);
            ns.taken.remove(&ino);
            let _ = self.db().forget_file(ino);
        } else if !open {
            // A stub's row must go with its last name: the file system hands the freed
            // inode number to the next new file, and the next open would load the row
            // onto it (an open stub keeps its row until its last close, see `release`).
            self.forget_stub_row_of_gone_file(&f.state);
        }
        self.placer().forget(ino);
        if !open && lookups == 0 {
            ns.files.remove(&ino);
        }
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        self.fill_dir_if_stub(parent)?;
        let mut ns = self.ns();
        let ino = self
            .find_child(&mut ns, parent, name)?
            .ok_or(FsError::NOENT)?;
        if ns.is_dir(ino) {
            return Err(FsError::ISDIR);
        }
        let rel = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        let tier = ns.files.get(&ino).map(|f| f.tier).ok_or(FsError::NOENT)?;
        let p = self.tiers[tier as usize].backing(&rel);
        let st = util::lstat(&p)?;
        std::fs::remove_file(&p)?;
        ns.remove_name(parent, name);
        self.after_unlink(&mut ns, ino, st.st_nlink);
        let now = self.now();
        self.trace_event(now, ino, Op::Delete, 0, 0, 0, &rel);
        drop(ns);
        self.stub_notify_removed(ino);
        Ok(())
    }

    /// Whether directory `rel` is empty on every tier.
    fn dir_empty(&self, rel: &Path) -> FsResult<bool> {
        for t in &self.tiers {
            match std::fs::read_dir(t.backing(rel)) {
                Ok(mut rd) => {
                    if rd.any(|e| e.map(|e| !hidden(&e.file_name())).unwrap_or(true)) {
                        return Ok(false);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(true)
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> FsResult<()> {
        self.fill_dir_if_stub(parent)?;
        let ino = {
            let mut ns = self.ns();
            self.find_child(&mut ns, parent, name)?
                .ok_or(FsError::NOENT)?
        };
        self.fill_dir_if_stub(ino)?;
        let mut ns = self.ns();
        if !ns.is_dir(ino) {
            return Err(FsError::NOTDIR);
        }
        let rel = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        if !self.dir_empty(&rel)? {
            return Err(FsError::NOTEMPTY);
        }
        for t in self.dir_tiers(&rel) {
            let p = self.tiers[t as usize].backing(&rel);
            // Remove our own leftovers first (they are never visible).
            if let Ok(rd) = std::fs::read_dir(&p) {
                for e in rd.flatten() {
                    let _ = std::fs::remove_file(e.path());
                }
            }
            std::fs::remove_dir(&p)?;
        }
        ns.remove_name(parent, name);
        ns.drop_dir(ino);
        self.db().remove_dir(&rel)?;
        drop(ns);
        self.stub_notify_removed(ino);
        Ok(())
    }

    fn is_ancestor(ns: &Namespace, anc: Ino, mut ino: Ino) -> bool {
        loop {
            if ino == anc {
                return true;
            }
            if ino == ROOT_INO {
                return false;
            }
            match ns.dirs.get(&ino) {
                Some(d) => ino = d.parent,
                None => return false,
            }
        }
    }

    /// rename / renameat2 (NOREPLACE, EXCHANGE). Atomic in the namespace whatever tiers the
    /// two names live on; never EXDEV.
    pub fn rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> FsResult<()> {
        check_name(newname)?;
        if hidden(newname) || hidden(name) {
            return Err(FsError::INVAL);
        }
        if flags & !(rename_flags::NOREPLACE | rename_flags::EXCHANGE) != 0
            || (flags & rename_flags::NOREPLACE != 0 && flags & rename_flags::EXCHANGE != 0)
        {
            return Err(FsError::INVAL);
        }
        self.fill_dir_if_stub(parent)?;
        self.fill_dir_if_stub(newparent)?;
        // An exchange of files on different tiers first brings them onto one tier.
        for _ in 0..4 {
            let mut ns = self.ns();
            let src = self
                .find_child(&mut ns, parent, name)?
                .ok_or(FsError::NOENT)?;
            let dst = self.find_child(&mut ns, newparent, newname)?;
            if flags & rename_flags::EXCHANGE != 0 {
                let dst = dst.ok_or(FsError::NOENT)?;
                if let (Some(a), Some(b)) = (ns.files.get(&src), ns.files.get(&dst)) {
                    if a.tier != b.tier {
                        let a = (src, a.tier, a.state.size.load(Ordering::Relaxed));
                        let b = (dst, b.tier, b.state.size.load(Ordering::Relaxed));
                        drop(ns);
                        self.bring_together(a, b)?;
                        continue;
                    }
                }
                // A file exchanged with a directory whose parent its tier cannot make
                // (no free inodes or space) moves to a tier that needs no new
                // directory first, as a rename's file does.
                if let Some((file, to)) =
                    self.exchange_preflight(&ns, parent, name, src, newparent, newname, dst)?
                {
                    drop(ns);
                    self.move_for_name(file, &to)?;
                    continue;
                }
                let (src_dir, dst_dir) = (ns.is_dir(src), ns.is_dir(dst));
                let r = self.exchange_locked(&mut ns, parent, name, src, newparent, newname, dst);
                drop(ns);
                // Both names moved: a crawler must learn about each of them.
                if r.is_ok() && src != dst {
                    self.stub_notify_renamed(src, src_dir);
                    self.stub_notify_renamed(dst, dst_dir);
                }
                return r;
            }
            // A dummy directory about to be replaced must be listed first: it is empty
            // here but maybe not on the migration source (then ENOTEMPTY).
            if let Some(d) = dst.filter(|d| ns.dirs.get(d).is_some_and(|n| n.unlisted)) {
                drop(ns);
                self.fill_dir_if_stub(d)?;
                continue;
            }
            let src_dir = ns.is_dir(src);
            // A file is renamed on its own tier: one whose file system has no room for
            // the target directory moves the file to a tier that has it, then renames.
            if !src_dir && let Some(to) = self.tiers_for_name(&mut ns, src, newparent)? {
                drop(ns);
                self.move_for_name(src, &to)?;
                continue;
            }
            let r = self.rename_locked(&mut ns, parent, name, src, newparent, newname, dst, flags);
            drop(ns);
            if r.is_ok() {
                self.stub_notify_renamed(src, src_dir);
                if let Some(d) = dst.filter(|d| *d != src) {
                    self.stub_notify_removed(d);
                }
            }
            return r;
        }
        Err(FsError::BUSY)
    }

    #[allow(clippy::too_many_arguments)]
    fn rename_locked(
        &self,
        ns: &mut Namespace,
        parent: Ino,
        name: &OsStr,
        src: Ino,
        newparent: Ino,
        newname: &OsStr,
        dst: Option<Ino>,
        flags: u32,
    ) -> FsResult<()> {
        let src_dir = ns.is_dir(src);
        if !ns.is_dir(newparent) {
            return Err(FsError::NOTDIR);
        }
        if let Some(d) = dst {
            if flags & rename_flags::NOREPLACE != 0 {
                return Err(FsError::EXIST);
            }
            if d == src {
                return Ok(());
            }
            let dst_dir = ns.is_dir(d);
            if src_dir && !dst_dir {
                return Err(FsError::NOTDIR);
            }
            if !src_dir && dst_dir {
                return Err(FsError::ISDIR);
            }
        }
        if src_dir && Self::is_ancestor(ns, src, newparent) {
            return Err(FsError::INVAL);
        }
        let sp = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        let dp = ns.child_path(newparent, newname).ok_or(FsError::NOENT)?;
        let dparent = ns.dir_path(newparent).ok_or(FsError::NOENT)?.to_path_buf();
        if src_dir {
            if let Some(d) = dst {
                if !self.dir_empty(&dp)? || ns.dirs.get(&d).is_some_and(|n| !n.children.is_empty())
                {
                    return Err(FsError::NOTEMPTY);
                }
            }
            let row = JournalRow {
                id: 0,
                kind: "dirrename".into(),
                ino: src,
                from_tier: 0,
                to_tier: 0,
                src_bino: 0,
                dst_bino: 0,
                names: vec![sp.clone(), dp.clone()],
                tmp: PathBuf::new(),
                state: "renaming".into(),
            };
            let id = self.commit_durable(|db| db.journal_add(&row))?;
            self.rename_fail_at(FailPoint::RenameAfterJournal)?;
            // All tiers or none: the tiers renamed so far, each with the empty directory
            // the rename replaced there (its metadata, to put it back on a rollback).
            let mut renamed: Vec<(usize, Option<libc::stat>)> = Vec::new();
            for (ti, t) in self.tiers.iter().enumerate() {
                let step = (|| -> FsResult<Option<Option<libc::stat>>> {
                    if util::lstat_opt(&t.backing(&sp))?.is_none() {
                        return Ok(None);
                    }
                    let replaced = util::lstat_opt(&t.backing(&dp))?;
                    self.ensure_dir(ti as u8, &dparent)?;
                    std::fs::rename(t.backing(&sp), t.backing(&dp))?;
                    Ok(Some(replaced))
                })();
                match step {
                    Ok(Some(replaced)) => {
                        renamed.push((ti, replaced));
                        if renamed.len() == 1 {
                            self.rename_fail_at(FailPoint::RenameAfterFirstTier)?;
                        }
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.undo_dir_rename(id, &sp, &dp, &renamed);
                        return Err(e);
                    }
                }
            }
            // The empty directory replaced, on the tiers the renamed one was not on.
            if dst.is_some() {
                for (ti, t) in self.tiers.iter().enumerate() {
                    if !renamed.iter().any(|(r, _)| *r == ti) {
                        let _ = std::fs::remove_dir(t.backing(&dp));
                    }
                }
            }
            self.rename_fail_at(FailPoint::RenameAfterRemoveTarget)?;
            if let Some(d) = dst {
                ns.remove_name(newparent, newname);
                ns.drop_dir(d);
                self.db().remove_dir(&dp)?;
            }
            ns.remove_name(parent, name);
            if let Some(p) = ns.dirs.get_mut(&newparent) {
                p.children.insert(newname.to_os_string(), src);
            }
            ns.rename_dir(src, newparent, newname);
            self.db().rename_dirs(&sp, &dp)?;
            self.rename_fail_at(FailPoint::RenameBeforeDone)?;
            self.db().journal_done(id)?;
            return Ok(());
        }
        let tier = ns.files.get(&src).map(|f| f.tier).ok_or(FsError::NOENT)?;
        let t = &self.tiers[tier as usize];
        self.ensure_dir(tier, &dparent)?;
        let replaced = dst.and_then(|d| ns.files.get(&d).map(|f| (d, f.tier, f.bino)));
        match replaced {
            Some((d, dtier, dbino)) if dtier != tier => {
                // The old target lives on another tier: journal its removal so a crash
                // between the two steps never leaves both names.
                let src_bino = ns.files.get(&src).map(|f| f.bino).unwrap_or(0);
                let row = JournalRow {
                    id: 0,
                    kind: "replace".into(),
                    ino: d,
                    from_tier: dtier,
                    to_tier: tier,
                    src_bino: dbino,
                    dst_bino: src_bino,
                    names: vec![dp.clone()],
                    tmp: PathBuf::new(),
                    state: "renaming".into(),
                };
                let id = self.commit_durable(|db| db.journal_add(&row))?;
                self.rename_fail_at(FailPoint::RenameAfterJournal)?;
                if let Err(e) = std::fs::rename(t.backing(&sp), t.backing(&dp)) {
                    // Nothing changed: the row has nothing to finish.
                    let _ = self.db().journal_done(id);
                    return Err(e.into());
                }
                self.rename_fail_at(FailPoint::RenameAfterFirstTier)?;
                let old = self.tiers[dtier as usize].backing(&dp);
                let nlink = util::lstat(&old).map(|s| s.st_nlink).unwrap_or(1);
                if let Err(e) = std::fs::remove_file(&old) {
                    // Both names would show: the source goes back to its old name.
                    match std::fs::rename(t.backing(&dp), t.backing(&sp)) {
                        Ok(()) => {
                            let _ = self.db().journal_done(id);
                        }
                        Err(back) => tracing::error!(
                            error = %back,
                            "rename over {} not rolled back; finished at the next start",
                            dp.display()
                        ),
                    }
                    return Err(e.into());
                }
                self.rename_fail_at(FailPoint::RenameAfterRemoveTarget)?;
                self.rename_fail_at(FailPoint::RenameBeforeDone)?;
                self.db().journal_done(id)?;
                ns.remove_name(newparent, newname);
                self.after_unlink(ns, d, nlink);
            }
            Some((d, _, _)) => {
                let nlink = util::lstat(&t.backing(&dp))
                    .map(|s| s.st_nlink)
                    .unwrap_or(1);
                std::fs::rename(t.backing(&sp), t.backing(&dp))?;
                ns.remove_name(newparent, newname);
                self.after_unlink(ns, d, nlink);
            }
            None => {
                util::renameat2(&t.backing(&sp), &t.backing(&dp), libc::RENAME_NOREPLACE).or_else(
                    |e| {
                        if e.raw_os_error() == Some(libc::EINVAL) {
                            std::fs::rename(t.backing(&sp), t.backing(&dp))
                        } else {
                            Err(e)
                        }
                    },
                )?;
            }
        }
        ns.remove_name(parent, name);
        let kind = ns.files.get(&src).map(|f| f.kind).unwrap_or(FileKind::File);
        ns.add_file_name(src, newparent, newname, || FileNode {
            kind,
            tier,
            bino: 0,
            names: Vec::new(),
            state: FileState::new(src, tier, 0),
            lookups: 0,
        });
        Ok(())
    }

    /// Puts back the tiers a directory rename had renamed when a later tier refused
    /// (`renamed`: tier, and the empty directory the rename replaced there), so the
    /// rename is all or nothing; then closes journal row `id`. Should a tier refuse to go
    /// back, the row stays: the next start finishes the rename on every tier.
    fn undo_dir_rename(
        &self,
        id: i64,
        sp: &Path,
        dp: &Path,
        renamed: &[(usize, Option<libc::stat>)],
    ) {
        let mut undone = true;
        for (ti, replaced) in renamed.iter().rev() {
            let t = &self.tiers[*ti];
            let back =
                std::fs::rename(t.backing(dp), t.backing(sp)).and_then(|()| match replaced {
                    Some(st) => {
                        std::fs::create_dir(t.backing(dp))?;
                        util::copy_meta(st, &t.backing(dp))
                    }
                    None => Ok(()),
                });
            if let Err(e) = back {
                undone = false;
                tracing::error!(
                    tier = %t.cfg.name,
                    error = %e,
                    "directory rename {} -> {} not rolled back; finished at the next start",
                    sp.display(),
                    dp.display()
                );
            }
        }
        if undone {
            if let Err(e) = self.db().journal_done(id) {
                tracing::warn!(error = %e, "journal row of a rolled-back rename left");
            }
        }
    }

    /// Stops a journalled rename at `fp` when a test asked for it (see
    /// [`Store::set_fail_point`]): the error a crash there would leave, nothing undone.
    fn rename_fail_at(&self, fp: FailPoint) -> FsResult<()> {
        if *self.fail.lock().unwrap_or_else(|e| e.into_inner()) == Some(fp) {
            tracing::warn!("injected failure {fp:?}");
            return Err(FsError::IO);
        }
        Ok(())
    }

    /// Runs `commit`, a database write that fsyncs the store's WAL (a journal row,
    /// `synchronous=FULL`). That fsync makes every stub row committed before it durable
    /// too, so while a migration fetches into this store it runs inside the fetch
    /// barrier: after the fetched bytes those rows mark present are on disk, with fetch
    /// writes held back until it is done (see [`crate::stub::FetchBarrier`]).
    pub(crate) fn commit_durable<T>(
        &self,
        commit: impl FnOnce(&crate::db::Db) -> rusqlite::Result<T>,
    ) -> FsResult<T> {
        let barrier = self
            .fetch_barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(barrier) = barrier else {
            return Ok(commit(&self.db())?);
        };
        barrier
            .sync_then(|| commit(&self.db()).map_err(std::io::Error::other))
            .map_err(|e| {
                tracing::error!(error = %e, "journal commit after fetched data");
                FsError::IO
            })
    }

    /// The copies an exchange of `a` (at `ap`) and `b` (at `bp`) swaps, tier by tier: a
    /// directory's copy on every tier that holds it, a file's on its own tier.
    fn exchange_steps(
        &self,
        ns: &Namespace,
        (a, ap): (Ino, &Path),
        (b, bp): (Ino, &Path),
    ) -> FsResult<Vec<ExchangeStep>> {
        let copy = |ti: usize, ino: Ino, p: &Path| -> FsResult<Option<u64>> {
            let on_tier = match ns.files.get(&ino) {
                Some(f) => f.tier as usize == ti,
                None => ns.is_dir(ino),
            };
            if !on_tier {
                return Ok(None);
            }
            let st = util::lstat_opt(&self.tiers[ti].backing(p))?;
            // A directory's copy is a directory (anything else there is shadowed).
            Ok(st
                .filter(|st| !ns.is_dir(ino) || st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                .map(|st| st.st_ino))
        };
        let mut steps = Vec::new();
        for ti in 0..self.tiers.len() {
            let (ca, cb) = (copy(ti, a, ap)?, copy(ti, b, bp)?);
            if ca.is_some() || cb.is_some() {
                steps.push(ExchangeStep {
                    tier: ti as u8,
                    a: ca,
                    b: cb,
                });
            }
        }
        Ok(steps)
    }

    /// Before an exchange changes anything: makes the parent directory each tier needs
    /// (a copy of one name that goes where the other name has no copy on that tier). A
    /// tier whose file system has no room for it (ENOSPC or EDQUOT, e.g. no free inodes)
    /// is not the end when the copy there is a regular file: Some((file, tiers)) asks the
    /// caller to move it first, to a tier holding the other name's directory (where the
    /// exchange needs no new directory) or its parent, else any with room. A directory's
    /// copy does not move between tiers: ENOSPC then, with nothing changed.
    #[allow(clippy::too_many_arguments)]
    fn exchange_preflight(
        &self,
        ns: &Namespace,
        parent: Ino,
        name: &OsStr,
        a: Ino,
        newparent: Ino,
        newname: &OsStr,
        b: Ino,
    ) -> FsResult<Option<(Ino, Vec<u8>)>> {
        if a == b {
            return Ok(None);
        }
        let ap = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        let bp = ns.child_path(newparent, newname).ok_or(FsError::NOENT)?;
        let a_parent = ns.dir_path(parent).ok_or(FsError::NOENT)?.to_path_buf();
        let b_parent = ns.dir_path(newparent).ok_or(FsError::NOENT)?.to_path_buf();
        let steps = self.exchange_steps(ns, (a, &ap), (b, &bp))?;
        for s in &steps {
            let (need, side, other) = match (s.a, s.b) {
                (Some(_), None) => (&b_parent, a, b),
                (None, Some(_)) => (&a_parent, b, a),
                _ => continue,
            };
            let e = match self.ensure_dir(s.tier, need) {
                Ok(()) => continue,
                Err(e) => e,
            };
            let file = ns.files.get(&side).filter(|f| f.kind == FileKind::File);
            let Some(f) = file.filter(|_| no_room(e)) else {
                return Err(e);
            };
            let size = f.state.size.load(Ordering::Relaxed);
            let holds_other = |t: u8| {
                steps.iter().any(|x| {
                    x.tier == t
                        && if other == a {
                            x.a.is_some()
                        } else {
                            x.b.is_some()
                        }
                })
            };
            let has_parent = |t: u8| {
                util::lstat_opt(&self.tiers[t as usize].backing(need))
                    .ok()
                    .flatten()
                    .is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            };
            let n = self.tiers.len() as u8;
            let mut to: Vec<u8> = (f.tier + 1..n)
                .chain(0..f.tier)
                .filter(|t| self.tiers[*t as usize].fits(size))
                .collect();
            to.sort_by_key(|&t| (!holds_other(t), !has_parent(t)));
            if to.is_empty() {
                return Err(FsError::NOSPC);
            }
            return Ok(Some((side, to)));
        }
        Ok(None)
    }

    /// One tier's part of an exchange (see [`ExchangeStep`]); undone by running it again
    /// with `undo` (an exchange is its own inverse, a one-sided rename goes back).
    fn exchange_step(
        &self,
        s: &ExchangeStep,
        (ap, a_parent): (&Path, &Path),
        (bp, b_parent): (&Path, &Path),
        undo: bool,
    ) -> FsResult<()> {
        let t = &self.tiers[s.tier as usize];
        match (s.a.is_some(), s.b.is_some(), undo) {
            (true, true, _) => {
                util::renameat2(&t.backing(ap), &t.backing(bp), libc::RENAME_EXCHANGE)?
            }
            (true, false, false) => {
                self.ensure_dir(s.tier, b_parent)?;
                std::fs::rename(t.backing(ap), t.backing(bp))?;
            }
            (false, true, false) => {
                self.ensure_dir(s.tier, a_parent)?;
                std::fs::rename(t.backing(bp), t.backing(ap))?;
            }
            (true, false, true) => std::fs::rename(t.backing(bp), t.backing(ap))?,
            (false, true, true) => std::fs::rename(t.backing(ap), t.backing(bp))?,
            (false, false, _) => {}
        }
        Ok(())
    }

    /// renameat2(RENAME_EXCHANGE) of `a` (parent/name) and `b` (newparent/newname), with
    /// the namespace lock held and [`Store::exchange_preflight`] passed. Each tier swaps
    /// its copies in one system call (`renameat2` exchange where it holds both, a rename
    /// where it holds one). Over several tiers the swap is all or nothing: journalled
    /// first (`exchange`: both paths and each tier's backing inode numbers, so the next
    /// start finishes an interrupted one), and a tier that refuses its part has the tiers
    /// already swapped swapped back, the error returned with the tree unchanged. The
    /// directory records are swapped in the same database transaction that closes the
    /// journal row. Never EXDEV.
    #[allow(clippy::too_many_arguments)]
    fn exchange_locked(
        &self,
        ns: &mut Namespace,
        parent: Ino,
        name: &OsStr,
        a: Ino,
        newparent: Ino,
        newname: &OsStr,
        b: Ino,
    ) -> FsResult<()> {
        if a == b {
            return Ok(());
        }
        let (a_dir, b_dir) = (ns.is_dir(a), ns.is_dir(b));
        if (a_dir && Self::is_ancestor(ns, a, newparent))
            || (b_dir && Self::is_ancestor(ns, b, parent))
        {
            return Err(FsError::INVAL);
        }
        let ap = ns.child_path(parent, name).ok_or(FsError::NOENT)?;
        let bp = ns.child_path(newparent, newname).ok_or(FsError::NOENT)?;
        let a_parent = ns.dir_path(parent).ok_or(FsError::NOENT)?.to_path_buf();
        let b_parent = ns.dir_path(newparent).ok_or(FsError::NOENT)?.to_path_buf();
        let steps = self.exchange_steps(ns, (a, &ap), (b, &bp))?;
        let journal = if steps.len() > 1 {
            let row = JournalRow {
                id: 0,
                kind: "exchange".into(),
                ino: a,
                from_tier: 0,
                to_tier: 0,
                src_bino: 0,
                dst_bino: 0,
                names: vec![ap.clone(), bp.clone()],
                tmp: PathBuf::from(ExchangeStep::encode(&steps)),
                state: "exchanging".into(),
            };
            let id = self.commit_durable(|db| db.journal_add(&row))?;
            self.rename_fail_at(FailPoint::RenameAfterJournal)?;
            Some(id)
        } else {
            None
        };
        for (i, s) in steps.iter().enumerate() {
            let r = self.exchange_step(s, (&ap, &a_parent), (&bp, &b_parent), false);
            if let Err(e) = r {
                let mut undone = true;
                for d in steps[..i].iter().rev() {
                    let back = self.exchange_step(d, (&ap, &a_parent), (&bp, &b_parent), true);
                    if let Err(u) = back {
                        undone = false;
                        tracing::error!(
                            tier = %self.tiers[d.tier as usize].cfg.name,
                            error = ?u,
                            "exchange of {} and {} not rolled back; finished at the next start",
                            ap.display(),
                            bp.display()
                        );
                    }
                }
                if let (true, Some(id)) = (undone, journal) {
                    if let Err(e) = self.db().journal_done(id) {
                        tracing::warn!(error = %e, "journal row of a rolled-back exchange left");
                    }
                }
                return Err(e);
            }
            if i == 0 && journal.is_some() {
                self.rename_fail_at(FailPoint::RenameAfterFirstTier)?;
            }
        }
        if journal.is_some() {
            self.rename_fail_at(FailPoint::RenameBeforeDone)?;
        }
        // Swap the names in the index.
        let placeholder = OsString::from("\0kaiso-exchange");
        for (ino, (p, n), (np, nn)) in [
            (a, (parent, name), (newparent, newname)),
            (b, (newparent, newname), (parent, name)),
        ] {
            if let Some(f) = ns.files.get_mut(&ino) {
                for e in f.names.iter_mut() {
                    if e.0 == p && e.1 == n {
                        *e = (np, nn.to_os_string());
                    }
                }
            }
        }
        if let Some(d) = ns.dirs.get_mut(&parent) {
            d.children.insert(name.to_os_string(), b);
        }
        if let Some(d) = ns.dirs.get_mut(&newparent) {
            d.children.insert(newname.to_os_string(), a);
        }
        if a_dir {
            ns.rename_dir(a, ROOT_INO, &placeholder);
        }
        if b_dir {
            ns.rename_dir(b, parent, name);
        }
        if a_dir {
            ns.rename_dir(a, newparent, newname);
        }
        if a_dir || b_dir || journal.is_some() {
            exchange_dir_rows(&self.db(), &ap, &bp, journal)?;
        }
        Ok(())
    }

    /// Hard link: a new name for `ino` on the tier it lives on.
    pub fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr) -> FsResult<FileAttr> {
        check_name(newname)?;
        if hidden(newname) {
            return Err(FsError::INVAL);
        }
        self.fill_dir_if_stub(newparent)?;
        let mut ns = self.ns();
        // A link is made on the file's tier: one with no room for the directory moves
        // the file to a tier that has it first (bounded, as renames).
        for _ in 0..4 {
            if ns.is_dir(ino) {
                return Err(FsError::PERM);
            }
            match self.tiers_for_name(&mut ns, ino, newparent)? {
                None => break,
                Some(to) => {
                    drop(ns);
                    self.move_for_name(ino, &to)?;
                    ns = self.ns();
                }
            }
        }
        if ns.is_dir(ino) {
            return Err(FsError::PERM);
        }
        if self.find_child(&mut ns, newparent, newname)?.is_some() {
            return Err(FsError::EXIST);
        }
        let tier = ns.files.get(&ino).map(|f| f.tier).ok_or(FsError::NOENT)?;
        let src = ns.file_path(ino).ok_or(FsError::NOENT)?;
        let dp = ns.child_path(newparent, newname).ok_or(FsError::NOENT)?;
        let dparent = ns.dir_path(newparent).ok_or(FsError::NOENT)?.to_path_buf();
        self.ensure_dir(tier, &dparent)?;
        let t = &self.tiers[tier as usize];
        std::fs::hard_link(t.backing(&src), t.backing(&dp))?;
        ns.add_file_name(ino, newparent, newname, || unreachable_node(ino, tier));
        let attr = self.attr_locked(&mut ns, ino)?;
        self.add_lookup(&mut ns, ino, 1);
        Ok(attr)
    }

    /// Whether file `file` can take a name in directory `dir` on its own tier: None when
    /// it can (the directory is there, or made there now), else the tiers to move the
    /// file to first, those that hold the directory already first (that tier's file
    /// system has no room for the directory: ENOSPC or EDQUOT, e.g. no free inodes).
    /// A rename or link then never fails with ENOSPC while a tier has room.
    fn tiers_for_name(&self, ns: &mut Namespace, file: Ino, dir: Ino) -> FsResult<Option<Vec<u8>>> {
        let Some(f) = ns.files.get(&file) else {
            return Ok(None);
        };
        let (tier, size, kind) = (f.tier, f.state.size.load(Ordering::Relaxed), f.kind);
        let dparent = ns.dir_path(dir).ok_or(FsError::NOENT)?.to_path_buf();
        match self.ensure_dir(tier, &dparent) {
            Ok(()) => return Ok(None),
            // Only regular files move between tiers.
            Err(e) if no_room(e) && kind == FileKind::File => {}
            Err(e) => return Err(e),
        }
        let n = self.tiers.len() as u8;
        let mut to: Vec<u8> = (tier + 1..n)
            .chain(0..tier)
            .filter(|t| self.tiers[*t as usize].fits(size))
            .collect();
        // Tiers without the directory last; stable: slower tiers first within each
        // group, as spills go.
        to.sort_by_key(|t| {
            util::lstat_opt(&self.tiers[*t as usize].backing(&dparent))
                .ok()
                .flatten()
                .is_none_or(|st| st.st_mode & libc::S_IFMT != libc::S_IFDIR)
        });
        if to.is_empty() {
            return Err(FsError::NOSPC);
        }
        Ok(Some(to))
    }

    /// For an exchange of files `a` and `b` (each: number, tier, size) on different
    /// tiers: moves one of them (journalled, by the mover) so that both share a tier,
    /// `b` onto `a`'s tier first. A tier whose file system cannot make the other file's
    /// directory (ENOSPC or EDQUOT, e.g. no free inodes) is not the end: then `a` goes
    /// to `b`'s tier, then `b` to any other tier with room for both (the caller looks
    /// again and brings `a` there too). Ok when the caller should look again; ENOSPC
    /// only when no tier took a file. The exchange itself stays one `renameat2` on the
    /// shared tier: atomic, never EXDEV.
    fn bring_together(&self, a: (Ino, u8, u64), b: (Ino, u8, u64)) -> FsResult<()> {
        let mut plans = vec![(b.0, a.1, b.2), (a.0, b.1, a.2)];
        for t in 0..self.tiers.len() as u8 {
            if t != a.1 && t != b.1 && self.tiers[t as usize].fits(a.2.saturating_add(b.2)) {
                plans.push((b.0, t, b.2));
            }
        }
        for (file, to, size) in plans {
            match self.move_file(file, to, "exchange with a file on another tier", size) {
                Ok(_) => return Ok(()),
                Err(e) if e.in_flight() => {
                    self.wait_for_move(file);
                    return Ok(());
                }
                Err(e) if no_room(e.errno()) => continue,
                Err(e) => return Err(e.errno()),
            }
        }
        Err(FsError::NOSPC)
    }

    /// Moves file `file` (journalled, by the mover) to the first of `to` that takes it,
    /// for [`Store::tiers_for_name`]; a move of it already in flight is waited for
    /// instead. Ok when the caller should look again; ENOSPC when no tier took it.
    fn move_for_name(&self, file: Ino, to: &[u8]) -> FsResult<()> {
        for &t in to {
            match self.move_file(
                file,
                t,
                "its tier has no room for a new name's directory",
                0,
            ) {
                Ok(_) => return Ok(()),
                Err(e) if e.in_flight() => {
                    self.wait_for_move(file);
                    return Ok(());
                }
                Err(e) if no_room(e.errno()) => continue,
                Err(e) => return Err(e.errno()),
            }
        }
        Err(FsError::NOSPC)
    }

    /// Open a directory: snapshots its entries so listing is stable while it changes.
    pub fn opendir(&self, ino: Ino) -> FsResult<u64> {
        self.fill_dir_if_stub(ino)?;
        let entries = self.dir_snapshot(ino)?;
        let fh = self.fh();
        self.dir_handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                fh,
                Arc::new(Mutex::new(DirHandle {
                    ino,
                    entries,
                    read_once: false,
                })),
            );
        Ok(fh)
    }

    fn dir_snapshot(&self, ino: Ino) -> FsResult<Vec<(DirEntry, Option<FileAttr>)>> {
        let ns = self.ns();
        let d = ns.dirs.get(&ino).ok_or(if ns.files.contains_key(&ino) {
            FsError::NOTDIR
        } else {
            FsError::NOENT
        })?;
        let mut out = Vec::with_capacity(d.children.len() + 2);
        out.push((
            DirEntry {
                ino,
                offset: 1,
                kind: FileKind::Dir,
                name: ".".into(),
            },
            None,
        ));
        out.push((
            DirEntry {
                ino: d.parent,
                offset: 2,
                kind: FileKind::Dir,
                name: "..".into(),
            },
            None,
        ));
        for (name, c) in &d.children {
            let kind = if ns.is_dir(*c) {
                FileKind::Dir
            } else {
                ns.files.get(c).map(|f| f.kind).unwrap_or(FileKind::File)
            };
            let off = out.len() as u64 + 1;
            out.push((
                DirEntry {
                    ino: *c,
                    offset: off,
                    kind,
                    name: name.clone(),
                },
                None,
            ));
        }
        Ok(out)
    }

    /// Entries after cookie `offset` (0 = from the start; restarting re-snapshots).
    pub fn readdir(&self, fh: u64, offset: u64) -> FsResult<Vec<DirEntry>> {
        let dh = self.dir_handle(fh)?;
        let mut d = dh.lock().unwrap_or_else(|e| e.into_inner());
        if offset == 0 && d.read_once {
            d.entries = self.dir_snapshot(d.ino)?;
        }
        d.read_once = true;
        Ok(d.entries
            .iter()
            .skip(offset as usize)
            .map(|(e, _)| e.clone())
            .collect())
    }

    /// Like `readdir`, with attributes. Every returned entry except "." and ".." counts
    /// one lookup reference; the face must `forget(ino, 1)` entries it could not send.
    pub fn readdirplus(&self, fh: u64, offset: u64) -> FsResult<Vec<(DirEntry, FileAttr)>> {
        let entries = self.readdir(fh, offset)?;
        let mut ns = self.ns();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let attr = match self.attr_locked(&mut ns, e.ino) {
                Ok(a) => a,
                Err(_) => continue,
            };
            if e.name != "." && e.name != ".." {
                self.add_lookup(&mut ns, e.ino, 1);
            }
            out.push((e, attr));
        }
        Ok(out)
    }

    pub fn releasedir(&self, fh: u64) -> FsResult<()> {
        self.dir_handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&fh);
        Ok(())
    }

    /// fsyncdir: sync every tier copy of the directory.
    pub fn fsyncdir(&self, ino: Ino) -> FsResult<()> {
        let rel = self.ns().dir_path(ino).ok_or(FsError::NOENT)?.to_path_buf();
        for t in self.dir_tiers(&rel) {
            util::fsync_dir(&self.tiers[t as usize].backing(&rel))?;
        }
        Ok(())
    }

    fn dir_handle(&self, fh: u64) -> FsResult<Arc<Mutex<DirHandle>>> {
        self.dir_handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&fh)
            .cloned()
            .ok_or(FsError::BADF)
    }

    /// File system totals: capacities and room summed over the tiers (each tier also
    /// bounded by the real free space of its file system).
    pub fn statfs(&self) -> FsResult<StatFs> {
        let bsize: u64 = 4096;
        // Tiers on one file system share its free space and inodes: count those once
        // per file system, or `df` on a store whose tiers share a disk would show that
        // disk's free space once per tier. Keyed by the root's device: `f_fsid` is 0 on
        // file systems that do not fill it in, which would merge distinct ones.
        struct Group {
            dev: u64,
            used: u64,
            room: u64,
            real_free: u64,
        }
        let mut groups: Vec<Group> = Vec::new();
        let (mut files, mut ffree) = (0u64, 0u64);
        for (i, t) in self.tiers.iter().enumerate() {
            let c = util::cpath(&t.root)?;
            let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
            let dev = std::fs::metadata(&t.root).map(|m| std::os::unix::fs::MetadataExt::dev(&m));
            let (dev, real_free) = match dev {
                Ok(dev) if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } == 0 => {
                    (dev, sv.f_bavail * sv.f_frsize)
                }
                // Unknown file system: its own group, bounded by kaiso's figures only.
                _ => (u64::MAX - i as u64, u64::MAX),
            };
            match groups.iter_mut().find(|g| g.dev == dev) {
                Some(g) => {
                    g.used += t.used();
                    g.room += t.free();
                }
                None => {
                    if real_free != u64::MAX {
                        files += sv.f_files;
                        ffree += sv.f_ffree;
                    }
                    groups.push(Group {
                        dev,
                        used: t.used(),
                        room: t.free(),
                        real_free,
                    });
                }
            }
        }
        // Size = what kaiso stores + what can still be written, so `used` in `df` is
        // kaiso's data, not other files on a shared disk.
        let (mut blocks, mut bfree) = (0u64, 0u64);
        for g in &groups {
            let free = g.room.min(g.real_free);
            blocks += (g.used + free) / bsize;
            bfree += free / bsize;
        }
        Ok(StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files,
            ffree,
            bsize: bsize as u32,
            namelen: 255,
            frsize: bsize as u32,
        })
    }

    /// Backing paths an xattr operation applies to (all copies for directories).
    fn xattr_paths(&self, ino: Ino) -> FsResult<Vec<BackingPath>> {
        let ns = self.ns();
        if let Some(d) = ns.dirs.get(&ino) {
            let rel = d.path.clone();
            return Ok(self
                .dir_tiers(&rel)
                .into_iter()
                .map(|t| self.tiers[t as usize].backing(&rel))
                .collect());
        }
        let f = ns.files.get(&ino).ok_or(FsError::NOENT)?;
        let p = ns.file_path(ino).ok_or(FsError::NOENT)?;
        Ok(vec![self.tiers[f.tier as usize].backing(&p)])
    }

    /// A migration stub's metadata (xattrs, ACLs) is copied from its source before any
    /// of its xattrs are read or changed: the first reference shows the source's, and a
    /// client's change is never overwritten by a later copy.
    fn fill_meta_if_stub(&self, ino: Ino) -> FsResult<()> {
        match self.stub_filler() {
            Some(filler) => filler.fill_meta(self, ino),
            None => Ok(()),
        }
    }

    /// Before a client changes `ino`'s attributes or xattrs (setattr, setxattr,
    /// removexattr): a migration stub gets the source's metadata first, so no later copy
    /// overwrites the change. A dummy directory is listed (its listing gives it the
    /// source's times, xattrs and ACL, as `rmdir` lists it first); a dummy file gets its
    /// xattrs and ACL (an ACL written after a chmod would set the mode back).
    fn fill_before_change_if_stub(&self, ino: Ino) -> FsResult<()> {
        self.fill_dir_if_stub(ino)?;
        self.fill_meta_if_stub(ino)
    }

    pub fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        self.fill_before_change_if_stub(ino)?;
        self.stub_setxattr(ino, name, value, flags)?;
        // A migration copies xattrs when a stub becomes partial: should its record of
        // that step be lost, redoing it would overwrite this value.
        self.mark_filler_touched(ino);
        Ok(())
    }

    /// Sets an xattr of `ino` for the stub filler (its metadata copy): no filler call.
    pub fn stub_setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32) -> FsResult<()> {
        let paths = self.xattr_paths(ino)?;
        for (i, p) in paths.iter().enumerate() {
            // XATTR_CREATE/REPLACE decide on the first copy; the others just follow.
            let f = if i == 0 { flags } else { 0 };
            util::lsetxattr(p, name, value, f)?;
        }
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> FsResult<Vec<u8>> {
        self.fill_meta_if_stub(ino)?;
        match self.xattr_paths(ino) {
            Ok(paths) => Ok(util::lgetxattr(paths.first().ok_or(FsError::NOENT)?, name)?),
            // Unlinked while open: the kernel still asks (e.g. `security.capability`
            // before every write), and the open descriptor answers.
            Err(e) => Ok(util::fgetxattr(&*self.open_unlinked(ino).ok_or(e)?, name)?),
        }
    }

    /// NUL-separated names.
    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.fill_meta_if_stub(ino)?;
        match self.xattr_paths(ino) {
            Ok(paths) => Ok(util::llistxattr(paths.first().ok_or(FsError::NOENT)?)?),
            Err(e) => Ok(util::flistxattr(&*self.open_unlinked(ino).ok_or(e)?)?),
        }
    }

    /// An open descriptor of a file that has no name left (unlinked while open).
    fn open_unlinked(&self, ino: Ino) -> Option<std::sync::Arc<std::fs::File>> {
        let state = self.ns().files.get(&ino)?.state.clone();
        state.open_handles().first().map(|h| h.file())
    }

    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> FsResult<()> {
        self.fill_before_change_if_stub(ino)?;
        let paths = self.xattr_paths(ino)?;
        for (i, p) in paths.iter().enumerate() {
            match util::lremovexattr(p, name) {
                Ok(()) => {}
                Err(e) if i > 0 && e.raw_os_error() == Some(libc::ENODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
        self.mark_filler_touched(ino);
        Ok(())
    }

    /// access(2) check by mode bits (faces using kernel default_permissions rarely need it).
    pub fn access(&self, ino: Ino, mask: i32, caller: Caller) -> FsResult<()> {
        let a = self.getattr(ino, None)?;
        if mask == libc::F_OK
            || caller.uid == 0
                && (mask & libc::X_OK == 0 || a.perm & 0o111 != 0 || a.kind == FileKind::Dir)
        {
            return Ok(());
        }
        let perm = a.perm as i32;
        let bits = if caller.uid == a.uid {
            (perm >> 6) & 7
        } else if caller.gid == a.gid {
            (perm >> 3) & 7
        } else {
            perm & 7
        };
        if bits & mask == mask {
            Ok(())
        } else {
            Err(FsError::ACCES)
        }
    }
}

fn utime_spec(t: Option<TimeSet>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSet::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSet::At(t)) => util::timespec_of(t),
    }
}

fn unreachable_node(ino: Ino, tier: u8) -> FileNode {
    FileNode {
        kind: FileKind::File,
        tier,
        bino: 0,
        names: Vec::new(),
        state: FileState::new(ino, tier, 0),
        lookups: 0,
    }
}

/// One tier's part of an exchange: the backing inode numbers of the copies of the two
/// names it holds (None: no copy of that name there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ExchangeStep {
    pub tier: u8,
    pub a: Option<u64>,
    pub b: Option<u64>,
}

impl ExchangeStep {
    /// The steps as an `exchange` journal row keeps them (in its `tmp` field):
    /// `tier:a:b` per tier, comma-separated, 0 for no copy.
    pub(crate) fn encode(steps: &[ExchangeStep]) -> String {
        steps
            .iter()
            .map(|s| format!("{}:{}:{}", s.tier, s.a.unwrap_or(0), s.b.unwrap_or(0)))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The steps of an `exchange` journal row (None if the text is not one).
    pub(crate) fn decode(text: &str) -> Option<Vec<ExchangeStep>> {
        text.split(',')
            .map(|part| {
                let mut it = part.split(':');
                let tier = it.next()?.parse().ok()?;
                let a: u64 = it.next()?.parse().ok()?;
                let b: u64 = it.next()?.parse().ok()?;
                it.next().is_none().then_some(ExchangeStep {
                    tier,
                    a: (a != 0).then_some(a),
                    b: (b != 0).then_some(b),
                })
            })
            .collect()
    }

    /// What a tier shows of this step, from the backing inode numbers at the two paths
    /// now: Some(true) swapped, Some(false) not yet, None neither (changed since).
    pub(crate) fn state(&self, (at_a, at_b): (Option<u64>, Option<u64>)) -> Option<bool> {
        let before =
            self.a.is_none_or(|a| at_a == Some(a)) && self.b.is_none_or(|b| at_b == Some(b));
        let after =
            self.a.is_none_or(|a| at_b == Some(a)) && self.b.is_none_or(|b| at_a == Some(b));
        match (before, after) {
            (true, false) => Some(false),
            (false, true) => Some(true),
            _ => None,
        }
    }
}

/// Swaps the `dirs` records of the directories at `ap` and `bp` (and everything below
/// them) and, if given, removes journal row `journal`, in one transaction: an
/// `exchange` row still there at the next start means the records were not swapped.
pub(crate) fn exchange_dir_rows(
    db: &crate::db::Db,
    ap: &Path,
    bp: &Path,
    journal: Option<i64>,
) -> rusqlite::Result<()> {
    let tx = db.conn.unchecked_transaction()?;
    let rows: Vec<(Vec<u8>, i64)> = {
        let mut st = tx.prepare("SELECT path, ino FROM dirs")?;
        let it = st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        it.collect::<rusqlite::Result<_>>()?
    };
    let (a, b) = (crate::db::pbytes(ap), crate::db::pbytes(bp));
    let under = |p: &[u8], f: &[u8]| {
        p == f || (p.len() > f.len() && p.starts_with(f) && p[f.len()] == b'/')
    };
    let mut moved = Vec::new();
    for (p, ino) in rows {
        let to = if under(&p, a) {
            Some([b, &p[a.len()..]].concat())
        } else if under(&p, b) {
            Some([a, &p[b.len()..]].concat())
        } else {
            None
        };
        if let Some(to) = to {
            tx.execute("DELETE FROM dirs WHERE path=?1", [&p])?;
            moved.push((to, ino));
        }
    }
    for (to, ino) in moved {
        tx.execute(
            "INSERT OR REPLACE INTO dirs(path, ino) VALUES(?1,?2)",
            rusqlite::params![to, ino],
        )?;
    }
    if let Some(id) = journal {
        tx.execute("DELETE FROM journal WHERE id=?1", [id])?;
    }
    tx.commit()
}

#[cfg(test)]
mod exchange_tests {
    use crate::types::{ROOT_INO, rename_flags};
    use crate::{FailPoint, Store, StoreConfig};
    use std::path::Path;

    /// Every file under `dir` (relative path, contents), sorted.
    fn files(dir: &Path) -> Vec<(String, String)> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if e.file_type().unwrap().is_dir() {
                    walk(base, &p, out);
                } else {
                    let rel = p.strip_prefix(base).unwrap().display().to_string();
                    out.push((rel, std::fs::read_to_string(&p).unwrap_or_default()));
                }
            }
        }
        let mut out = Vec::new();
        walk(dir, dir, &mut out);
        out.sort();
        out
    }

    /// Session 16: an exchange of directories whose copies are on several tiers is
    /// journalled, tier by tier. Stopped at each step (as a crash there leaves it: the
    /// store dropped, nothing undone) and reopened, the exchange is finished on every
    /// tier (or not begun, when stopped right after the journal row: rolled forward
    /// too), never half done.
    #[test]
    fn an_interrupted_exchange_of_directories_on_two_tiers_is_finished_at_the_next_open() {
        for fp in [
            FailPoint::RenameAfterJournal,
            FailPoint::RenameAfterFirstTier,
            FailPoint::RenameBeforeDone,
        ] {
            let dir = tempfile::tempdir().unwrap();
            let t = |i: usize| dir.path().join(format!("t{i}"));
            for (tier, rel) in [(0, "x/f0"), (1, "x/f1"), (1, "y/g")] {
                let p = t(tier).join(rel);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, rel).unwrap();
            }
            let mut text = format!(
                "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n",
                dir.path().join("state").display()
            );
            for i in 0..2 {
                text.push_str(&format!(
                    "[[tier]]\nname = \"t{i}\"\npath = \"{}\"\ncapacity = \"64MiB\"\n",
                    t(i).display()
                ));
            }
            let cfg = || StoreConfig::from_toml_str(&text, "test.toml").unwrap();
            let store = Store::open(cfg()).unwrap();
            store.set_fail_point(Some(fp));
            let r = store.rename(
                ROOT_INO,
                "x".as_ref(),
                ROOT_INO,
                "y".as_ref(),
                rename_flags::EXCHANGE,
            );
            assert!(
                r.is_err(),
                "{fp:?}: the injected failure stops the exchange"
            );
            drop(store);
            let store = Store::open(cfg()).unwrap();
            let done = (
                files(&t(0)),
                files(&t(1)),
                store.db().journal().unwrap().len(),
            );
            let expect = (
                vec![("y/f0".to_string(), "x/f0".to_string())],
                vec![
                    ("x/g".to_string(), "y/g".to_string()),
                    ("y/f1".to_string(), "x/f1".to_string()),
                ],
                0,
            );
            assert_eq!(done, expect, "{fp:?}: tiers and journal after the reopen");
            // The index agrees: y holds x's files, x holds y's.
            let y = store.lookup(ROOT_INO, "y".as_ref()).unwrap().ino;
            let x = store.lookup(ROOT_INO, "x".as_ref()).unwrap().ino;
            assert!(store.lookup(y, "f0".as_ref()).is_ok(), "{fp:?}: y/f0");
            assert!(store.lookup(y, "f1".as_ref()).is_ok(), "{fp:?}: y/f1");
            assert!(store.lookup(x, "g".as_ref()).is_ok(), "{fp:?}: x/g");
            store.shutdown();
        }
    }
}
