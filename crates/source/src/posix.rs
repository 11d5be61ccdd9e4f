//! A source that is a directory on this host, typically an NFS or SMB mount of the old
//! server made with the operating system's own client.
//!
//! Names are raw bytes (`OsStr`), so names that are not valid UTF-8 round-trip exactly.
//! Symlinks are never followed: every path is resolved component by component with
//! `openat(O_NOFOLLOW)` under the root, so a symlink inside the share cannot lead a read
//! outside it.
//!
//! Files and directories are read with `O_NOATIME` (falling back without it where the
//! kernel refuses: not the owner, no CAP_FOWNER), so their access times stay as they
//! were on the old server's disk (a symlink's atime still moves: `readlink` has no such
//! flag). Through a kernel NFS/SMB mount the flag stays on this host: the server itself
//! updates atimes on its READs.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kaiso_store::migrate::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};

const ACL_ACCESS: &[u8] = b"system.posix_acl_access";
const ACL_DEFAULT: &[u8] = b"system.posix_acl_default";

/// A POSIX directory tree read with plain system calls.
pub struct PosixSource {
    root: PathBuf,
    root_fd: Arc<OwnedFd>,
    /// Open directories by source path (bounded; see `open_dir_chain`).
    dirs: Mutex<HashMap<SourcePath, Arc<OwnedFd>>>,
}

/// Directory descriptors kept open at most.
const DIR_CACHE: usize = 256;

impl PosixSource {
    /// Opens `root`, which must be a directory.
    pub fn open(root: impl AsRef<Path>) -> SourceResult<Self> {
        let root = root.as_ref().to_path_buf();
        let c = cstring(root.as_os_str().as_bytes(), &SourcePath::root())?;
        // SAFETY: c is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(errno_error(
                &SourcePath::root(),
                &format!("open root {}", root.display()),
            ));
        }
        // SAFETY: fd was just returned by open and is owned by nobody else.
        let root_fd = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(Self {
            root,
            root_fd,
            dirs: Mutex::new(HashMap::new()),
        })
    }

    /// Opens `path` below the root without following any symlink on the way. With
    /// `O_NOATIME` in `flags` the open falls back to a plain one where the kernel refuses
    /// it (EPERM: a file this process neither owns nor has CAP_FOWNER for). Directory
    /// descriptors on the way are cached (like an NFS client's file handles), so a deep
    /// path costs one `openat` once its parent was opened before, not one per component.
    fn open_path(&self, path: &SourcePath, flags: libc::c_int) -> SourceResult<OwnedFd> {
        let components: Vec<&[u8]> = path.components().collect();
        let Some((last, parents)) = components.split_last() else {
            // A new open file description of the root, not a `dup`: a dup shares the
            // directory offset, so a second listing of the root (or two at once) would
            // start where the last one stopped and miss entries.
            // SAFETY: root_fd is open; "." is NUL-terminated.
            let dir = unsafe {
                openat_noatime_fallback(
                    self.root_fd.as_raw_fd(),
                    c".".as_ptr(),
                    flags | libc::O_CLOEXEC,
                )
            };
            if dir < 0 {
                return Err(errno_error(path, "open root"));
            }
            // SAFETY: dir is a fresh descriptor we own.
            return Ok(unsafe { OwnedFd::from_raw_fd(dir) });
        };
        let dir = self.open_dir_chain(path, parents)?;
        let c = cstring(last, path)?;
        // SAFETY: dir is open, c is NUL-terminated.
        let fd = unsafe {
            openat_noatime_fallback(
                dir.as_raw_fd(),
                c.as_ptr(),
                flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(errno_error(path, "open"));
        }
        // SAFETY: fd was just returned by openat.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// The directory `parents` (components below the root), opened component by component
    /// with `O_NOFOLLOW` from its longest cached ancestor; every directory opened on the
    /// way is cached.
    fn open_dir_chain(&self, path: &SourcePath, parents: &[&[u8]]) -> SourceResult<Arc<OwnedFd>> {
        let key = |n: usize| SourcePath::parse(&parents[..n].join(&b'/'));
        let (mut dir, mut start) = (self.root_fd.clone(), 0);
        {
            let cache = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
            for n in (1..=parents.len()).rev() {
                if let Some(fd) = cache.get(&key(n)?) {
                    (dir, start) = (fd.clone(), n);
                    break;
                }
            }
        }
        for n in start + 1..=parents.len() {
            let c = cstring(parents[n - 1], path)?;
            // SAFETY: dir is open, c is NUL-terminated.
            let fd = unsafe {
                libc::openat(
                    dir.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                return Err(errno_error(path, "open"));
            }
            // SAFETY: fd was just returned by openat.
            dir = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
            let mut cache = self.dirs.lock().unwrap_or_else(|e| e.into_inner());
            if cache.len() >= DIR_CACHE {
                // Crude but bounded: the next lookups re-open what they need.
                cache.clear();
            }
            cache.insert(key(n)?, dir.clone());
        }
        Ok(dir)
    }

    /// `fstatat(parent, name, AT_SYMLINK_NOFOLLOW)`.
    fn lstat(&self, path: &SourcePath) -> SourceResult<libc::stat> {
        let (dir, name) = self.parent_and_name(path)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: dir is open, name is NUL-terminated, st is large enough.
        let r = unsafe {
            libc::fstatat(
                dir.as_raw_fd(),
                name.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            return Err(errno_error(path, "stat"));
        }
        // SAFETY: fstatat succeeded and filled st.
        Ok(unsafe { st.assume_init() })
    }

    /// The parent directory descriptor and the last name (`.` for the root).
    fn parent_and_name(&self, path: &SourcePath) -> SourceResult<(OwnedFd, CString)> {
        match path.parent() {
            None => Ok((
                self.open_path(path, libc::O_RDONLY | libc::O_DIRECTORY)?,
                CString::from(c"."),
            )),
            Some(parent) => {
                let dir = self.open_path(&parent, libc::O_RDONLY | libc::O_DIRECTORY)?;
                let name = cstring(path.file_name().unwrap_or(b"."), path)?;
                Ok((dir, name))
            }
        }
    }

    /// The `/proc/self/fd` path of an `O_PATH` descriptor, so that xattr calls act on the
    /// object itself (symlinks included) without following anything.
    fn xattr_handle(&self, path: &SourcePath) -> SourceResult<(OwnedFd, CString)> {
        let fd = self.open_path(path, libc::O_PATH)?;
        let p = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let c =
            CString::new(p).map_err(|_| SourceError::new(SourceErrorKind::Io, path, "fd path"))?;
        Ok((fd, c))
    }

    fn list_xattr_names(&self, path: &SourcePath, c: &CString) -> SourceResult<Vec<Vec<u8>>> {
        let mut buf = vec![0u8; 4096];
        loop {
            // SAFETY: c is NUL-terminated; buf is writable for its length.
            let n = unsafe { libc::listxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                buf.truncate(n as usize);
                return Ok(buf
                    .split(|b| *b == 0)
                    .filter(|n| !n.is_empty())
                    .map(<[u8]>::to_vec)
                    .collect());
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ERANGE) => buf.resize(buf.len() * 4, 0),
                Some(libc::ENOTSUP) => return Ok(Vec::new()),
                _ => return Err(errno_error(path, "listxattr")),
            }
        }
    }

    fn get_xattr(
        &self,
        path: &SourcePath,
        c: &CString,
        name: &[u8],
    ) -> SourceResult<Option<Vec<u8>>> {
        let cname = cstring(name, path)?;
        let mut buf = vec![0u8; 4096];
        loop {
            // SAFETY: both strings are NUL-terminated; buf is writable for its length.
            let n = unsafe {
                libc::getxattr(
                    c.as_ptr(),
                    cname.as_ptr(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                )
            };
            if n >= 0 {
                buf.truncate(n as usize);
                return Ok(Some(buf));
            }
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::ERANGE) => buf.resize(buf.len() * 4, 0),
                Some(libc::ENODATA) | Some(libc::ENOTSUP) => return Ok(None),
                _ => return Err(errno_error(path, "getxattr")),
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

impl Source for PosixSource {
    fn describe(&self) -> String {
        format!("posix:{}", self.root.display())
    }

    /// The root directory's inode number on its file system, and the file system's id
    /// (`statfs` f_fsid: derived from the UUID on ext4, XFS, btrfs, so it survives
    /// reboots and device renames; the device number where it is 0). The same tree
    /// reached by another path (a bind mount, a symlink, a new mount point) has the same
    /// identity; another directory has not.
    fn identity(&self) -> Option<String> {
        let fd = self.root_fd.as_raw_fd();
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fd is an open descriptor; st is written by fstat.
        if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
            return None;
        }
        // SAFETY: fstat succeeded and filled st.
        let st = unsafe { st.assume_init() };
        let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: as above, for fstatfs.
        let fsid = if unsafe { libc::fstatfs(fd, fs.as_mut_ptr()) } == 0 {
            // SAFETY: fstatfs succeeded and filled fs; fsid_t is two ints.
            let ids: [libc::c_int; 2] = unsafe {
                std::mem::transmute::<libc::fsid_t, [libc::c_int; 2]>(fs.assume_init().f_fsid)
            };
            ((ids[0] as u32 as u64) << 32) | ids[1] as u32 as u64
        } else {
            0
        };
        Some(if fsid != 0 {
            format!("posix:fsid={fsid:016x}:ino={}", st.st_ino)
        } else {
            format!("posix:dev={:x}:ino={}", st.st_dev, st.st_ino)
        })
    }

    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            unix_ids: true,
            symlinks: true,
            special_files: true,
            xattrs: true,
            acls: true,
            streams: false,
            byte_names: true,
        }
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        Ok(attr_from_stat(&self.lstat(path)?))
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.read_dir_with_attr(path).map(|(e, _)| e)
    }

    /// The directory's attributes come from `fstat` of the descriptor just listed.
    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        let fd = self.open_path(path, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOATIME)?;
        // SAFETY: fdopendir takes ownership of a descriptor we dup for it.
        let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(errno_error(path, "dup"));
        }
        // SAFETY: dup is an open directory descriptor; fdopendir owns it from now on.
        let dirp = unsafe { libc::fdopendir(dup) };
        if dirp.is_null() {
            // SAFETY: fdopendir failed, so dup is still ours to close.
            unsafe { libc::close(dup) };
            return Err(errno_error(path, "opendir"));
        }
        let mut entries = Vec::new();
        let mut failure = None;
        loop {
            // SAFETY: dirp is a valid DIR*; errno is reset to tell end from error.
            unsafe { *libc::__errno_location() = 0 };
            let ent = unsafe { libc::readdir64(dirp) };
            if ent.is_null() {
                if std::io::Error::last_os_error().raw_os_error().unwrap_or(0) != 0 {
                    failure = Some(errno_error(path, "readdir"));
                }
                break;
            }
            // SAFETY: d_name is NUL-terminated inside the dirent.
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) }
                .to_bytes()
                .to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            let c = match cstring(&name, path) {
                Ok(c) => c,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: fd is the open directory; c is NUL-terminated.
            let r = unsafe {
                libc::fstatat(
                    fd.as_raw_fd(),
                    c.as_ptr(),
                    st.as_mut_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() == Some(libc::ENOENT) {
                    continue; // vanished between readdir and stat
                }
                failure = Some(errno_error(
                    &path.join(&name).unwrap_or_else(|_| path.clone()),
                    "stat",
                ));
                break;
            }
            // SAFETY: fstatat succeeded.
            let attr = attr_from_stat(&unsafe { st.assume_init() });
            entries.push(SourceEntry { name, attr });
        }
        // SAFETY: dirp is valid and closed exactly once.
        unsafe { libc::closedir(dirp) };
        if let Some(e) = failure {
            return Err(e);
        }
        let dir = fstat_attr(&fd, path)?;
        Ok((entries, Some(dir)))
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.read_with_attr(path, offset, len).map(|(d, _)| d)
    }

    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        let mut buf = vec![0u8; len];
        let (n, attr) = self.read_into(path, offset, &mut buf)?;
        buf.truncate(n);
        Ok((buf, attr))
    }

    /// `pread` straight into the caller's buffer; the attributes come from `fstat` of the
    /// descriptor just read (no path lookup).
    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        let len = buf.len();
        // O_NONBLOCK so that a FIFO never blocks the open; it is then refused as not regular.
        let fd = self.open_path(path, libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOATIME)?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| io_error(path, "stat", &e))?;
        if !meta.is_file() {
            return Err(SourceError::new(
                SourceErrorKind::WrongKind,
                path,
                "read of a non-regular file",
            ));
        }
        let mut done = 0;
        while done < len {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(path, "read", &e)),
            }
        }
        let after = fstat_attr(&file, path)?;
        Ok((done, Some(after)))
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        let (dir, name) = self.parent_and_name(path)?;
        let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
        // SAFETY: dir is open; name is NUL-terminated; buf is writable for its length.
        let n = unsafe {
            libc::readlinkat(
                dir.as_raw_fd(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        };
        if n < 0 {
            return Err(errno_error(path, "readlink"));
        }
        buf.truncate(n as usize);
        Ok(buf)
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let (_fd, c) = self.xattr_handle(path)?;
        let mut out = Vec::new();
        for name in self.list_xattr_names(path, &c)? {
            if name == ACL_ACCESS || name == ACL_DEFAULT {
                continue;
            }
            if let Some(value) = self.get_xattr(path, &c, &name)? {
                out.push((name, value));
            }
        }
        out.sort();
        Ok(out)
    }

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        let (_fd, c) = self.xattr_handle(path)?;
        Ok(SourceAcl {
            posix_access: self.get_xattr(path, &c, ACL_ACCESS)?,
            posix_default: self.get_xattr(path, &c, ACL_DEFAULT)?,
            ..SourceAcl::default()
        })
    }

    fn streams(&self, _path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        Ok(Vec::new())
    }

    fn read_stream(
        &self,
        path: &SourcePath,
        _stream: &str,
        _offset: u64,
        _len: usize,
    ) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "POSIX sources have no alternate data streams",
        ))
    }
}

pub(crate) fn kind_from_mode(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Directory,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDevice,
        libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Regular,
    }
}

fn ts(secs: i64, nanos: i64) -> Timestamp {
    Timestamp {
        secs,
        nanos: nanos.clamp(0, 999_999_999) as u32,
    }
}

/// The attributes of the open file `fd` (of `path`, for the error).
fn fstat_attr(fd: &impl AsRawFd, path: &SourcePath) -> SourceResult<SourceAttr> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fd is open, st is large enough.
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(errno_error(path, "fstat"));
    }
    // SAFETY: fstat succeeded and filled st.
    Ok(attr_from_stat(&unsafe { st.assume_init() }))
}

fn attr_from_stat(st: &libc::stat) -> SourceAttr {
    SourceAttr {
        kind: kind_from_mode(st.st_mode),
        perm: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        nlink: st.st_nlink as u32,
        ino: st.st_ino,
        rdev: (libc::major(st.st_rdev), libc::minor(st.st_rdev)),
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        btime: None,
        dos_attributes: None,
    }
}

fn cstring(bytes: &[u8], path: &SourcePath) -> SourceResult<CString> {
    CString::new(bytes)
        .map_err(|_| SourceError::new(SourceErrorKind::Invalid, path, "name contains NUL"))
}

/// `openat`, retried without `O_NOATIME` if the kernel refuses that flag (EPERM), so that
/// reading the old server's files and directories leaves their access times as they were
/// where it may, and still reads those it may not.
///
/// # Safety
/// `dir` must be an open descriptor and `name` a NUL-terminated string.
unsafe fn openat_noatime_fallback(
    dir: libc::c_int,
    name: *const libc::c_char,
    flags: libc::c_int,
) -> libc::c_int {
    // SAFETY: the caller's guarantees.
    let fd = unsafe { libc::openat(dir, name, flags) };
    if fd < 0
        && flags & libc::O_NOATIME != 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    {
        // SAFETY: as above.
        return unsafe { libc::openat(dir, name, flags & !libc::O_NOATIME) };
    }
    fd
}

fn errno_error(path: &SourcePath, what: &str) -> SourceError {
    io_error(path, what, &std::io::Error::last_os_error())
}

pub(crate) fn io_error(path: &SourcePath, what: &str, e: &std::io::Error) -> SourceError {
    let kind = match e.raw_os_error() {
        Some(libc::ENOENT) => SourceErrorKind::NotFound,
        Some(libc::EACCES) | Some(libc::EPERM) => SourceErrorKind::PermissionDenied,
        Some(libc::ENOTDIR) | Some(libc::EISDIR) | Some(libc::ELOOP) => SourceErrorKind::WrongKind,
        Some(libc::ENOTCONN)
        | Some(libc::EHOSTDOWN)
        | Some(libc::EHOSTUNREACH)
        | Some(libc::ETIMEDOUT) => SourceErrorKind::Unreachable,
        _ => SourceErrorKind::Io,
    };
    SourceError::new(kind, path, format!("{what}: {e}"))
}

/// The name as an `OsStr`, for callers that build host paths from source names.
pub fn os_name(name: &[u8]) -> &OsStr {
    OsStr::from_bytes(name)
}
