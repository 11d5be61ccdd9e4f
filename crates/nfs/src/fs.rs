//! The NFSv3 file-system trait of `nfs3_server`, implemented by calls to the store.
//!
//! NFS file handles carry kaiso inode numbers (stable across remounts and tier moves).
//! No placement or policy here: every operation is the same store method the FUSE face
//! calls, so accesses reach the policy exactly as through the mount. Every store call
//! runs through the [`Jukebox`] so that slow ones (on-demand fetches during a migration)
//! answer NFS3ERR_JUKEBOX instead of stalling the client.
//!
//! One `KaisoNfs` value serves one caller identity ([`Cred`]): the connection layer
//! (`conn`) keeps one per AUTH_SYS credential, so new objects belong to the caller and
//! every operation is checked against the caller's permissions (the store trusts faces).

use crate::convert::{fattr, is_empty, set_attr, status};
use crate::cred::{Acl, Cred, Obj, R, W, X};
use crate::handles::OpenFiles;
use crate::jukebox::{Jukebox, Key};
use kaiso_store::{
    Caller, DirEntry, FileAttr, FileKind, FsError, FsResult, Ino, ROOT_INO, SetAttr, Store,
};
use nfs3_server::nfs3_types::nfs3::{
    FSINFO3resok, createverf3, fattr3, filename3, nfspath3, nfsstat3, post_op_attr, sattr3,
    stable_how,
};
use nfs3_server::vfs::{
    DirEntryPlus, FileHandleU64, NextResult, NfsFileSystem, NfsReadFileSystem, ReadDirPlusIterator,
};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Entries fetched from the store per READDIR(PLUS) step.
const DIR_BATCH: usize = 512;
/// Largest READ/WRITE the server offers (FSINFO rtmax/wtmax).
const IO_MAX: u32 = 1 << 20;

type Res<T> = Result<T, nfsstat3>;

/// The NFSv3 face over one store, acting for one caller.
pub struct KaisoNfs {
    store: Arc<Store>,
    pub(crate) jukebox: Arc<Jukebox>,
    pub(crate) files: Arc<OpenFiles>,
    /// Who the calls come from (after squashing): owner of new objects, subject of the
    /// permission checks.
    cred: Arc<Cred>,
}

fn name_of(f: &filename3<'_>) -> Res<OsString> {
    let b = f.as_ref();
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(nfsstat3::NFS3ERR_INVAL);
    }
    if b == b"." || b == b".." {
        return Err(nfsstat3::NFS3ERR_INVAL);
    }
    Ok(OsString::from_vec(b.to_vec()))
}

fn st<T>(r: FsResult<T>) -> Res<T> {
    r.map_err(status)
}

/// Retries of store calls that failed for a reason that passes, within a bound.
///
/// Which failures pass: EAGAIN and EBUSY (e.g. a rename that kept meeting moves of the
/// file), and EIO from a call on an object that was a stub when the call began (a file
/// with data still on the migration source, a directory not listed yet): the store
/// answers EIO when the source did not answer a fetch (a timeout, a dropped connection)
/// and keeps the stub, so a later try can succeed. EIO on a resident object (a failing
/// disk) is not retried.
///
/// The call is tried again with a growing pause (20 ms … 1 s) until it succeeds, fails
/// otherwise, or `limit` has passed since the first try; the last answer stands. The
/// client meanwhile waits (`--jukebox-after 0`) or gets NFS3ERR_JUKEBOX and joins the
/// work when it asks again (see [`Jukebox`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Retry {
    pub limit: Duration,
}

impl Retry {
    /// `f` (store calls about `objects`), tried again while it fails for a reason that
    /// passes; `what` names the operation in the log. Call only around store calls that
    /// may be repeated (fail before they change anything, or repeat to the same result).
    pub(crate) fn run<T>(
        self,
        s: &Store,
        what: &str,
        objects: &[Ino],
        mut f: impl FnMut() -> FsResult<T>,
    ) -> FsResult<T> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(20);
        let mut tries = 0u32;
        loop {
            let stub = objects.iter().any(|&i| !s.stub_state(i).is_complete());
            let r = f();
            tries += 1;
            let e = match r {
                Err(e) if passes(e, stub) => e,
                r => {
                    if tries > 1 {
                        tracing::info!(
                            what,
                            ?objects,
                            tries,
                            ok = r.is_ok(),
                            "NFS: store call retried"
                        );
                    }
                    return r;
                }
            };
            let spent = start.elapsed();
            if spent >= self.limit {
                tracing::warn!(what, ?objects, tries, error = %e, "NFS: store call still failing after {spent:?}; giving up");
                return Err(e);
            }
            if tries == 1 {
                tracing::warn!(what, ?objects, error = %e, "NFS: store call failed (migration source unreachable or store busy); trying again for up to {:?}", self.limit);
            }
            std::thread::sleep(pause.min(self.limit - spent));
            pause = (pause * 2).min(Duration::from_secs(1));
        }
    }
}

/// Whether a store failure `e` passes (see [`Retry`]); `stub`: the call was about a stub.
fn passes(e: FsError, stub: bool) -> bool {
    match e.errno() {
        libc::EAGAIN | libc::EBUSY => true,
        libc::EIO => stub,
        _ => false,
    }
}

impl KaisoNfs {
    pub fn new(
        store: Arc<Store>,
        jukebox: Arc<Jukebox>,
        files: Arc<OpenFiles>,
        cred: Cred,
    ) -> KaisoNfs {
        KaisoNfs {
            store,
            jukebox,
            files,
            cred: Arc::new(cred),
        }
    }

    /// The same face acting for another caller.
    pub fn for_caller(&self, cred: Cred) -> KaisoNfs {
        KaisoNfs::new(
            self.store.clone(),
            self.jukebox.clone(),
            self.files.clone(),
            cred,
        )
    }

    /// Retries of store calls that fail for a reason that passes.
    pub(crate) fn retry(&self) -> Retry {
        Retry {
            limit: self.jukebox.retry_for(),
        }
    }

    /// A work key; callers other than root get their own (a permission decision is part
    /// of the result, so one user must not collect another's).
    fn key(&self, op: &'static str, ino: Ino) -> Key {
        let k = Key::new(op, ino);
        if self.cred.is_root() {
            k
        } else {
            k.extra(&self.cred.tag())
        }
    }

    async fn call<T, F>(&self, key: Key, f: F) -> Res<T>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce(&Store, &OpenFiles) -> Res<T> + Send + 'static,
    {
        let store = self.store.clone();
        let files = self.files.clone();
        self.jukebox.run(key, move || f(&store, &files)).await
    }

    /// Apply the attributes a CREATE/MKDIR/SYMLINK/MKNOD asked for, after the fact, as
    /// far as the caller may set them.
    fn apply(store: &Store, ino: Ino, mut set: SetAttr, cred: &Cred) -> Res<FileAttr> {
        if is_empty(&set) {
            return st(store.getattr(ino, None));
        }
        cred.check_setattr(&Self::obj(store, ino)?, &mut set)?;
        st(store.setattr(ino, &set, cred.caller()))
    }

    /// `ino` as the permission checks see it: attributes and access ACL.
    fn obj(store: &Store, ino: Ino) -> Res<Obj> {
        let attr = st(store.getattr(ino, None))?;
        let acl = match attr.kind {
            FileKind::Symlink => None,
            _ => store
                .getxattr(ino, OsStr::new("system.posix_acl_access"))
                .ok()
                .and_then(|b| Acl::parse(&b)),
        };
        Ok(Obj { attr, acl })
    }

    /// `want` (R|W|X) on `ino` for `cred`.
    fn check(store: &Store, cred: &Cred, ino: Ino, want: u32) -> Res<()> {
        if cred.is_root() {
            return Ok(());
        }
        cred.require(&Self::obj(store, ino)?, want)
    }

    /// Read a batch of directory entries after `cookie` (opendir … releasedir: NFS is stateless).
    fn list(
        store: &Store,
        cred: &Cred,
        retry: Retry,
        dir: Ino,
        cookie: u64,
    ) -> Res<(Vec<(DirEntry, FileAttr)>, bool)> {
        Self::check(store, cred, dir, R)?;
        let fh = st(retry.run(store, "opendir", &[dir], || store.opendir(dir)))?;
        let mut out = Vec::new();
        let mut at = cookie;
        let mut eof = false;
        let r = (|| {
            while out.len() < DIR_BATCH {
                let batch =
                    st(retry.run(store, "readdirplus", &[dir], || store.readdirplus(fh, at)))?;
                let Some(last) = batch.last() else {
                    eof = true;
                    break;
                };
                at = last.0.offset;
                out.extend(batch);
            }
            Ok(())
        })();
        let _ = store.releasedir(fh);
        r.map(|()| (out, eof))
    }
}

/// The directory attributes around a change (weak cache consistency data), and its result.
#[derive(Clone)]
pub(crate) struct DirChange<T> {
    pub before: Option<FileAttr>,
    pub after: Option<FileAttr>,
    pub result: Res<T>,
}

impl KaisoNfs {
    /// RENAME permissions: write and search on both directories, the sticky-bit rule for
    /// the moved entry and a replaced one, and write on a directory moved to a new parent
    /// (its ".." changes), as rename(2) on Linux.
    fn may_rename(
        s: &Store,
        cred: &Cred,
        from: Ino,
        name: &OsStr,
        to: Ino,
        newname: &OsStr,
    ) -> Res<()> {
        let src = st(s.lookup(from, name))?;
        s.forget(src.ino, 1);
        cred.may_delete(&Self::obj(s, from)?, &src)?;
        let to_attr = Self::obj(s, to)?;
        cred.require(&to_attr, W | X)?;
        if let Ok(victim) = s.lookup(to, newname) {
            s.forget(victim.ino, 1);
            cred.may_delete(&to_attr, &victim)?;
        }
        if src.kind == FileKind::Dir && from != to {
            cred.require(&Self::obj(s, src.ino)?, W)?;
        }
        Ok(())
    }

    /// Run a change of directory `dir` on the store and record the directory's attributes
    /// before and after it (for the reply's wcc_data).
    async fn dir_change<T, F>(&self, key: Key, dir: Ino, f: F) -> Res<DirChange<T>>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce(&Store, &OpenFiles) -> Res<T> + Send + 'static,
    {
        let jukebox = self.jukebox.clone();
        self.call(key, move |s, files| {
            let before = s.getattr(dir, None).ok();
            let result = f(s, files).map_err(|e| jukebox.settle(e));
            let after = s.getattr(dir, None).ok();
            Ok(DirChange {
                before,
                after,
                result,
            })
        })
        .await
    }

    /// Make a new entry in `dir` as the caller (who needs write and search permission on
    /// `dir`) with `make`, then apply the remaining requested attributes to it.
    async fn make_in<F>(
        &self,
        key: Key,
        dir: Ino,
        set: SetAttr,
        make: F,
    ) -> Res<DirChange<FileAttr>>
    where
        F: Fn(&Store, Caller) -> FsResult<FileAttr> + Send + 'static,
    {
        let cred = self.cred.clone();
        let retry = self.retry();
        self.dir_change(key, dir, move |s, _| {
            Self::check(s, &cred, dir, W | X)?;
            let a = st(retry.run(s, "make", &[dir], || make(s, cred.caller())))?;
            s.forget(a.ino, 1);
            Self::apply(s, a.ino, set, &cred)
        })
        .await
    }

    /// MKDIR with the requested attributes (mode, default 0755; owner and times as far
    /// as the caller may set them).
    async fn mkdir_with(&self, dir: Ino, name: &filename3<'_>, set: SetAttr) -> Res<FileAttr> {
        self.mkdir_change(dir, name, set).await?.result
    }

    pub(crate) async fn mkdir_change(
        &self,
        dir: Ino,
        name: &filename3<'_>,
        mut set: SetAttr,
    ) -> Res<DirChange<FileAttr>> {
        let name = name_of(name)?;
        let mode = set.mode.take().unwrap_or(0o755);
        set.size = None;
        let key = self.key("mkdir", dir).extra(name.as_bytes());
        self.make_in(key, dir, set, move |s, caller| {
            s.mkdir(dir, &name, libc::S_IFDIR | (mode & 0o7777), 0, caller)
        })
        .await
    }

    /// MKNOD: a FIFO, socket or (root only) device node, owned by the caller.
    pub(crate) async fn mknod(
        &self,
        dir: Ino,
        name: &filename3<'_>,
        kind: FileKind,
        rdev: u64,
        mut set: SetAttr,
    ) -> Res<DirChange<FileAttr>> {
        let name = name_of(name)?;
        let fmt = match kind {
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
            _ => return Err(nfsstat3::NFS3ERR_BADTYPE),
        };
        let device = matches!(kind, FileKind::CharDevice | FileKind::BlockDevice);
        if device && !self.cred.is_root() {
            return Err(nfsstat3::NFS3ERR_PERM); // mknod(2) needs CAP_MKNOD for devices
        }
        let mode = set.mode.take().unwrap_or(0o644);
        set.size = None;
        let rdev = if device { rdev } else { 0 };
        let key = self.key("mknod", dir).extra(name.as_bytes());
        self.make_in(key, dir, set, move |s, caller| {
            s.mknod(dir, &name, fmt | (mode & 0o7777), 0, rdev, caller)
        })
        .await
    }

    /// LINK: a new name `name` in `dir` for file `ino`; returns the file's attributes.
    pub(crate) async fn link(
        &self,
        ino: Ino,
        dir: Ino,
        name: &filename3<'_>,
    ) -> Res<DirChange<FileAttr>> {
        let name = name_of(name)?;
        let cred = self.cred.clone();
        let jukebox = self.jukebox.clone();
        let retry = self.retry();
        let key = self
            .key("link", ino)
            .extra(&dir.to_ne_bytes())
            .extra(name.as_bytes());
        let r = self
            .dir_change(key, dir, move |s, _| {
                if !cred.is_root() {
                    Self::check(s, &cred, dir, W | X)?;
                    cred.may_link(&Self::obj(s, ino)?)?;
                }
                let a = st(retry.run(s, "link", &[dir], || s.link(ino, dir, &name)))?;
                s.forget(a.ino, 1);
                Ok(a)
            })
            .await;
        // The link count and ctime changed: no cached result about the file is current.
        jukebox.invalidate(ino);
        r
    }

    /// ACCESS: the asked bits the caller has on `ino`, with its attributes.
    pub(crate) async fn access(&self, ino: Ino, asked: u32) -> Res<(FileAttr, u32)> {
        let cred = self.cred.clone();
        self.call(
            self.key("access", ino).range(asked as u64, 0),
            move |s, _| {
                let o = Self::obj(s, ino)?;
                let bits = cred.access_bits(&o, asked);
                Ok((o.attr, bits))
            },
        )
        .await
    }
}

impl NfsReadFileSystem for KaisoNfs {
    type Handle = FileHandleU64;

    fn root_dir(&self) -> FileHandleU64 {
        FileHandleU64::new(ROOT_INO)
    }

    async fn lookup(&self, dirid: &FileHandleU64, filename: &filename3<'_>) -> Res<FileHandleU64> {
        let dir = dirid.as_u64();
        let raw = filename.as_ref().to_vec();
        let key = self.key("lookup", dir).extra(&raw);
        let cred = self.cred.clone();
        let retry = self.retry();
        self.call(key, move |s, _| {
            Self::check(s, &cred, dir, X)?;
            match raw.as_slice() {
                b"." => return Ok(FileHandleU64::new(dir)),
                b".." => {
                    // The store answers ".." in listings; resolve it the same way.
                    let fh = st(s.opendir(dir))?;
                    let entries = s.readdir(fh, 0);
                    let _ = s.releasedir(fh);
                    let e = st(entries)?;
                    return e
                        .iter()
                        .find(|e| e.name == "..")
                        .map(|e| FileHandleU64::new(e.ino))
                        .ok_or(nfsstat3::NFS3ERR_NOENT);
                }
                _ => {}
            }
            let a = st(retry.run(s, "lookup", &[dir], || {
                s.lookup(dir, OsStr::from_bytes(&raw))
            }))?;
            // NFS holds no kernel-style lookup references.
            s.forget(a.ino, 1);
            Ok(FileHandleU64::new(a.ino))
        })
        .await
    }

    /// MOUNT of the export or a subdirectory. MOUNT v3 has no JUKEBOX status (the crate
    /// turns any error into MNT3ERR_NOENT), so this waits for the store, however long
    /// resolving takes (e.g. listing dummy directories from a migration source).
    async fn lookup_by_path(&self, path: &str) -> Res<FileHandleU64> {
        let rel = PathBuf::from(path.trim_start_matches('/'));
        if rel.as_os_str().is_empty() {
            return Ok(FileHandleU64::new(ROOT_INO));
        }
        let store = self.store.clone();
        let retry = self.retry();
        // Name by name through `lookup`, which lists dummy directories on the way.
        let walk = move || -> Res<FileHandleU64> {
            let mut ino = ROOT_INO;
            for c in rel.components() {
                let std::path::Component::Normal(name) = c else {
                    return Err(nfsstat3::NFS3ERR_NOENT);
                };
                let a = st(retry.run(&store, "mount", &[ino], || store.lookup(ino, name)))?;
                store.forget(a.ino, 1);
                ino = a.ino;
            }
            Ok(FileHandleU64::new(ino))
        };
        tokio::task::spawn_blocking(walk)
            .await
            .unwrap_or(Err(nfsstat3::NFS3ERR_SERVERFAULT))
    }

    async fn getattr(&self, id: &FileHandleU64) -> Res<fattr3> {
        let ino = id.as_u64();
        self.call(Key::new("getattr", ino), move |s, _| {
            st(s.getattr(ino, None)).map(|a| fattr(&a))
        })
        .await
    }

    async fn read(&self, id: &FileHandleU64, offset: u64, count: u32) -> Res<(Vec<u8>, bool)> {
        let ino = id.as_u64();
        let count = count.min(IO_MAX);
        let cred = self.cred.clone();
        let retry = self.retry();
        self.call(
            self.key("read", ino).range(offset, count as u64),
            move |s, files| {
                if !cred.is_root() {
                    cred.may_read_data(&Self::obj(s, ino)?)?;
                }
                let f = st(files.get(ino, false))?;
                // A stub's missing data is fetched from the migration source here.
                let data = st(retry.run(s, "read", &[ino], || s.read(f.fh, offset, count)))?;
                let size = st(s.getattr(ino, Some(f.fh)))?.size;
                let eof = offset + data.len() as u64 >= size;
                Ok((data, eof))
            },
        )
        .await
    }

    async fn readdirplus(
        &self,
        dirid: &FileHandleU64,
        cookie: u64,
    ) -> Res<impl ReadDirPlusIterator<FileHandleU64>> {
        let mut it = DirIter {
            fs: self.shared(),
            dir: dirid.as_u64(),
            buf: VecDeque::new(),
            cookie,
            eof: false,
        };
        it.fill().await?;
        Ok(it)
    }

    async fn readlink(&self, id: &FileHandleU64) -> Res<nfspath3<'_>> {
        let ino = id.as_u64();
        let target = self
            .call(Key::new("readlink", ino), move |s, _| {
                st(s.readlink(ino)).map(OsString::into_vec)
            })
            .await?;
        Ok(nfspath3::from(target))
    }

    async fn fsinfo(&self, root: &FileHandleU64) -> Res<FSINFO3resok> {
        use nfs3_server::nfs3_types::nfs3::{
            FSF3_CANSETTIME, FSF3_HOMOGENEOUS, FSF3_LINK, FSF3_SYMLINK, nfstime3,
        };
        let attr = self
            .getattr(root)
            .await
            .map_or(post_op_attr::None, post_op_attr::Some);
        Ok(FSINFO3resok {
            obj_attributes: attr,
            rtmax: IO_MAX,
            rtpref: IO_MAX,
            rtmult: 4096,
            wtmax: IO_MAX,
            wtpref: IO_MAX,
            wtmult: 4096,
            dtpref: 64 * 1024,
            maxfilesize: i64::MAX as u64,
            time_delta: nfstime3 {
                seconds: 0,
                nseconds: 1,
            },
            properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
        })
    }
}

impl KaisoNfs {
    fn shared(&self) -> KaisoNfs {
        KaisoNfs {
            store: self.store.clone(),
            jukebox: self.jukebox.clone(),
            files: self.files.clone(),
            cred: self.cred.clone(),
        }
    }
}

/// READDIRPLUS entries, fetched from the store in batches as the reply fills.
struct DirIter {
    fs: KaisoNfs,
    dir: Ino,
    buf: VecDeque<(DirEntry, FileAttr)>,
    cookie: u64,
    eof: bool,
}

impl DirIter {
    async fn fill(&mut self) -> Res<()> {
        let (dir, cookie) = (self.dir, self.cookie);
        let cred = self.fs.cred.clone();
        let retry = self.fs.retry();
        let (entries, eof) = self
            .fs
            .call(self.fs.key("readdir", dir).range(cookie, 0), move |s, _| {
                KaisoNfs::list(s, &cred, retry, dir, cookie)
            })
            .await?;
        self.eof = eof;
        if let Some(last) = entries.last() {
            self.cookie = last.0.offset;
        }
        self.buf.extend(entries);
        Ok(())
    }
}

impl ReadDirPlusIterator<FileHandleU64> for DirIter {
    async fn next(&mut self) -> NextResult<DirEntryPlus<FileHandleU64>> {
        if self.buf.is_empty()
            && !self.eof
            && let Err(e) = self.fill().await
        {
            return NextResult::Err(e);
        }
        match self.buf.pop_front() {
            None => NextResult::Eof,
            Some((e, a)) => NextResult::Ok(DirEntryPlus {
                fileid: e.ino,
                name: filename3::from(e.name.into_vec()),
                cookie: e.offset,
                name_attributes: Some(fattr(&a)),
                name_handle: Some(FileHandleU64::new(e.ino)),
            }),
        }
    }
}

impl NfsFileSystem for KaisoNfs {
    async fn setattr(&self, id: &FileHandleU64, setattr: sattr3) -> Res<fattr3> {
        let ino = id.as_u64();
        let set = set_attr(&setattr);
        let cred = self.cred.clone();
        let retry = self.retry();
        self.jukebox.invalidate(ino);
        let key = self
            .key("setattr", ino)
            .extra(format!("{set:?}").as_bytes());
        self.call(key, move |s, _| {
            let mut set = set;
            if !cred.is_root() {
                cred.check_setattr(&Self::obj(s, ino)?, &mut set)?;
            }
            st(retry.run(s, "setattr", &[ino], || s.setattr(ino, &set, cred.caller())))
                .map(|a| fattr(&a))
        })
        .await
    }

    async fn write(
        &self,
        id: &FileHandleU64,
        offset: u64,
        data: &[u8],
        stable: stable_how,
    ) -> Res<(fattr3, stable_how)> {
        let ino = id.as_u64();
        self.jukebox.invalidate(ino);
        let data = Arc::new(data.to_vec());
        // The data is part of the key: only a retry of the same write may join it.
        let digest = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            data.hash(&mut h);
            h.finish()
        };
        let key = self
            .key("write", ino)
            .range(offset, data.len() as u64)
            .extra(&[stable as u8])
            .extra(&digest.to_ne_bytes());
        let cred = self.cred.clone();
        let retry = self.retry();
        self.call(key, move |s, files| {
            if !cred.is_root() {
                cred.may_write_data(&Self::obj(s, ino)?)?;
            }
            let f = st(files.get(ino, true))?;
            let mut done = 0usize;
            while done < data.len() {
                let at = offset + done as u64;
                let n = st(retry.run(s, "write", &[ino], || s.write(f.fh, at, &data[done..])))?
                    as usize;
                if n == 0 {
                    return Err(nfsstat3::NFS3ERR_IO);
                }
                done += n;
            }
            match stable {
                stable_how::UNSTABLE => {}
                stable_how::DATA_SYNC => st(s.fsync(f.fh, true))?,
                stable_how::FILE_SYNC => st(s.fsync(f.fh, false))?,
            }
            let a = st(s.getattr(ino, Some(f.fh)))?;
            Ok((fattr(&a), stable))
        })
        .await
    }

    async fn create(
        &self,
        dirid: &FileHandleU64,
        filename: &filename3<'_>,
        attr: sattr3,
    ) -> Res<(FileHandleU64, fattr3)> {
        let dir = dirid.as_u64();
        let name = name_of(filename)?;
        let mut set = set_attr(&attr);
        let mode = set.mode.take().unwrap_or(0o644);
        let cred = self.cred.clone();
        let caller = self.cred.caller();
        let retry = self.retry();
        let key = self.key("create", dir).extra(name.as_bytes());
        self.call(key, move |s, files| {
            Self::check(s, &cred, dir, W | X)?;
            let made = retry.run(s, "create", &[dir], || {
                s.create(
                    dir,
                    &name,
                    libc::S_IFREG | (mode & 0o7777),
                    0,
                    libc::O_RDWR,
                    caller,
                    false,
                )
            });
            let ino = match made {
                Ok((a, opened)) => {
                    let _ = s.release(opened.fh);
                    s.forget(a.ino, 1);
                    a.ino
                }
                // UNCHECKED: an existing file is opened (and truncated if asked); GUARDED
                // was refused by the caller already when the name existed.
                Err(e) if e == FsError::EXIST => {
                    let a = st(s.lookup(dir, &name))?;
                    s.forget(a.ino, 1);
                    if a.kind != FileKind::File {
                        return Err(nfsstat3::NFS3ERR_EXIST);
                    }
                    a.ino
                }
                Err(e) => return Err(status(e)),
            };
            files.forget(ino);
            let a = Self::apply(s, ino, set, &cred)?;
            Ok((FileHandleU64::new(ino), fattr(&a)))
        })
        .await
    }

    async fn create_exclusive(
        &self,
        dirid: &FileHandleU64,
        filename: &filename3<'_>,
        _verf: createverf3,
    ) -> Res<FileHandleU64> {
        let dir = dirid.as_u64();
        let name = name_of(filename)?;
        let cred = self.cred.clone();
        let caller = self.cred.caller();
        let retry = self.retry();
        // A retransmitted EXCLUSIVE create is caught by the RPC layer's replay tracker or
        // joins the in-flight call here; otherwise an existing name is EXIST.
        self.call(
            self.key("create_excl", dir).extra(name.as_bytes()),
            move |s, _| {
                Self::check(s, &cred, dir, W | X)?;
                let (a, opened) = st(retry.run(s, "create", &[dir], || {
                    s.create(
                        dir,
                        &name,
                        libc::S_IFREG | 0o644,
                        0,
                        libc::O_RDWR,
                        caller,
                        false,
                    )
                }))?;
                let _ = s.release(opened.fh);
                s.forget(a.ino, 1);
                Ok(FileHandleU64::new(a.ino))
            },
        )
        .await
    }

    async fn mkdir(
        &self,
        dirid: &FileHandleU64,
        dirname: &filename3<'_>,
    ) -> Res<(FileHandleU64, fattr3)> {
        let dir = dirid.as_u64();
        let a = self.mkdir_with(dir, dirname, SetAttr::default()).await?;
        Ok((FileHandleU64::new(a.ino), fattr(&a)))
    }

    async fn remove(&self, dirid: &FileHandleU64, filename: &filename3<'_>) -> Res<()> {
        let dir = dirid.as_u64();
        let name = name_of(filename)?;
        let jukebox = self.jukebox.clone();
        let cred = self.cred.clone();
        let retry = self.retry();
        self.call(
            self.key("remove", dir).extra(name.as_bytes()),
            move |s, files| {
                // REMOVE and RMDIR both arrive here (the crate maps both to `remove`).
                let a = st(retry.run(s, "lookup", &[dir], || s.lookup(dir, &name)))?;
                s.forget(a.ino, 1);
                if !cred.is_root() {
                    cred.may_delete(&Self::obj(s, dir)?, &a)?;
                }
                if a.kind == FileKind::Dir {
                    st(retry.run(s, "rmdir", &[dir, a.ino], || s.rmdir(dir, &name)))?;
                } else {
                    st(retry.run(s, "unlink", &[dir], || s.unlink(dir, &name)))?;
                    files.forget(a.ino);
                }
                jukebox.invalidate(a.ino);
                Ok(())
            },
        )
        .await
    }

    async fn rename<'a>(
        &self,
        from_dirid: &FileHandleU64,
        from_filename: &filename3<'a>,
        to_dirid: &FileHandleU64,
        to_filename: &filename3<'a>,
    ) -> Res<()> {
        let (from, to) = (from_dirid.as_u64(), to_dirid.as_u64());
        let (name, newname) = (name_of(from_filename)?, name_of(to_filename)?);
        let key = self
            .key("rename", from)
            .extra(name.as_bytes())
            .extra(&to.to_ne_bytes())
            .extra(newname.as_bytes());
        let cred = self.cred.clone();
        let retry = self.retry();
        self.call(key, move |s, files| {
            if !cred.is_root() {
                Self::may_rename(s, &cred, from, &name, to, &newname)?;
            }
            let replaced = s.lookup(to, &newname).ok();
            if let Some(r) = &replaced {
                s.forget(r.ino, 1);
            }
            st(retry.run(s, "rename", &[from, to], || {
                s.rename(from, &name, to, &newname, 0)
            }))?;
            if let Some(r) = replaced {
                files.forget(r.ino);
            }
            Ok(())
        })
        .await
        .map_err(|e| {
            if e == nfsstat3::NFS3ERR_NOTEMPTY {
                nfsstat3::NFS3ERR_EXIST
            } else {
                e
            }
        })
    }

    async fn symlink<'a>(
        &self,
        dirid: &FileHandleU64,
        linkname: &filename3<'a>,
        symlink: &nfspath3<'a>,
        attr: &sattr3,
    ) -> Res<(FileHandleU64, fattr3)> {
        let dir = dirid.as_u64();
        let name = name_of(linkname)?;
        let target = PathBuf::from(OsString::from_vec(symlink.as_ref().to_vec()));
        let mut set = set_attr(attr);
        set.mode = None; // symlink permissions are not settable on Linux
        let cred = self.cred.clone();
        let caller = self.cred.caller();
        let retry = self.retry();
        self.call(
            self.key("symlink", dir).extra(name.as_bytes()),
            move |s, _| {
                Self::check(s, &cred, dir, W | X)?;
                let a = st(retry.run(s, "symlink", &[dir], || {
                    s.symlink(dir, &name, &target, caller)
                }))?;
                s.forget(a.ino, 1);
                let a = if set.uid.is_some() || set.gid.is_some() {
                    Self::apply(s, a.ino, set, &cred)?
                } else {
                    a
                };
                Ok((FileHandleU64::new(a.ino), fattr(&a)))
            },
        )
        .await
    }

    async fn commit(&self, id: &FileHandleU64, offset: u64, count: u32) -> Res<()> {
        let ino = id.as_u64();
        self.call(
            Key::new("commit", ino).range(offset, count as u64),
            move |s, files| {
                let f = st(files.get(ino, false))?;
                st(s.fsync(f.fh, false))
            },
        )
        .await
    }
}
