//! Small wrappers over libc calls std does not offer (xattrs, utimensat, renameat2, mknod,
//! fallocate, SEEK_DATA/SEEK_HOLE) and the sparse, checksummed copy the mover uses.

use std::ffi::{CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub(crate) fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cstr(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// lstat, returning the raw `libc::stat`.
pub(crate) fn lstat(p: &Path) -> io::Result<libc::stat> {
    let c = cpath(p)?;
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::lstat(c.as_ptr(), &mut st) })?;
    Ok(st)
}

pub(crate) fn fstat(f: &File) -> io::Result<libc::stat> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(f.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// lstat that maps "not there" to None.
pub(crate) fn lstat_opt(p: &Path) -> io::Result<Option<libc::stat>> {
    match lstat(p) {
        Ok(s) => Ok(Some(s)),
        Err(e)
            if e.raw_os_error() == Some(libc::ENOENT)
                || e.raw_os_error() == Some(libc::ENOTDIR) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

pub(crate) fn ts(sec: i64, nsec: i64) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec as u32)
    } else {
        UNIX_EPOCH - Duration::new((-sec) as u64, 0) + Duration::from_nanos(nsec as u64)
    }
}

pub(crate) fn timespec_of(t: SystemTime) -> libc::timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => libc::timespec {
            tv_sec: d.as_secs() as i64,
            tv_nsec: d.subsec_nanos() as i64,
        },
        Err(e) => {
            let d = e.duration();
            let mut sec = -(d.as_secs() as i64);
            let mut nsec = -(d.subsec_nanos() as i64);
            if nsec < 0 {
                sec -= 1;
                nsec += 1_000_000_000;
            }
            libc::timespec {
                tv_sec: sec,
                tv_nsec: nsec,
            }
        }
    }
}

/// What to set a time to in utimensat.
#[derive(Clone, Copy)]
pub(crate) enum UTime {
    Omit,
    Now,
    At(SystemTime),
}

fn utime_spec(u: UTime) -> libc::timespec {
    match u {
        UTime::Omit => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        UTime::Now => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        UTime::At(t) => timespec_of(t),
    }
}

/// utimensat without following symlinks.
pub(crate) fn lutimens(p: &Path, atime: UTime, mtime: UTime) -> io::Result<()> {
    let c = cpath(p)?;
    let times = [utime_spec(atime), utime_spec(mtime)];
    check(unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

pub(crate) fn lchown(p: &Path, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let c = cpath(p)?;
    check(unsafe { libc::lchown(c.as_ptr(), uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX)) })
}

/// Sets both times of the open file `f`.
pub(crate) fn futimens(f: &File, atime: UTime, mtime: UTime) -> io::Result<()> {
    let times = [utime_spec(atime), utime_spec(mtime)];
    // SAFETY: f is open; times holds two valid timespecs.
    check(unsafe { libc::futimens(f.as_raw_fd(), times.as_ptr()) })
}

/// Owner and group of the open file `f`.
pub(crate) fn fchown(f: &File, uid: u32, gid: u32) -> io::Result<()> {
    check(unsafe { libc::fchown(f.as_raw_fd(), uid, gid) })
}

/// Permission bits of the open file `f`.
pub(crate) fn fchmod(f: &File, mode: u32) -> io::Result<()> {
    check(unsafe { libc::fchmod(f.as_raw_fd(), mode as libc::mode_t) })
}

pub(crate) fn chmod(p: &Path, mode: u32) -> io::Result<()> {
    let c = cpath(p)?;
    check(unsafe { libc::chmod(c.as_ptr(), mode as libc::mode_t) })
}

pub(crate) fn mknod(p: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let c = cpath(p)?;
    check(unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, rdev as libc::dev_t) })
}

pub(crate) fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let a = cpath(from)?;
    let b = cpath(to)?;
    check(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    })
}

pub(crate) fn lgetxattr(p: &Path, name: &OsStr) -> io::Result<Vec<u8>> {
    let c = cpath(p)?;
    let n = cstr(name)?;
    read_sized(|buf, len| unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf, len) })
}

/// `fgetxattr`: for files that are open but have no name left.
pub(crate) fn fgetxattr(f: &File, name: &OsStr) -> io::Result<Vec<u8>> {
    let n = cstr(name)?;
    read_sized(|buf, len| unsafe { libc::fgetxattr(f.as_raw_fd(), n.as_ptr(), buf, len) })
}

/// Runs a get-style xattr call (size query with a null buffer, then the read) until the
/// value fits (it may grow in between: ERANGE).
fn read_sized(call: impl Fn(*mut libc::c_void, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let size = call(std::ptr::null_mut(), 0);
        if size < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; size as usize];
        let got = call(buf.as_mut_ptr().cast(), buf.len());
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ERANGE) {
                continue;
            }
            return Err(e);
        }
        buf.truncate(got as usize);
        return Ok(buf);
    }
}

pub(crate) fn lsetxattr(p: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
    let c = cpath(p)?;
    let n = cstr(name)?;
    check(unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            flags,
        )
    })
}

pub(crate) fn lremovexattr(p: &Path, name: &OsStr) -> io::Result<()> {
    let c = cpath(p)?;
    let n = cstr(name)?;
    check(unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) })
}

/// The raw, NUL-separated list of xattr names.
pub(crate) fn llistxattr(p: &Path) -> io::Result<Vec<u8>> {
    let c = cpath(p)?;
    read_sized(|buf, len| unsafe { libc::llistxattr(c.as_ptr(), buf.cast(), len) })
}

/// `flistxattr`: for files that are open but have no name left.
pub(crate) fn flistxattr(f: &File) -> io::Result<Vec<u8>> {
    read_sized(|buf, len| unsafe { libc::flistxattr(f.as_raw_fd(), buf.cast(), len) })
}

pub(crate) fn xattr_names(p: &Path) -> io::Result<Vec<OsString>> {
    let raw = match llistxattr(p) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    Ok(raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect())
}

/// Copy every xattr (including `system.posix_acl_*`, i.e. ACLs) from one path to another.
pub(crate) fn copy_xattrs(from: &Path, to: &Path) -> io::Result<()> {
    for name in xattr_names(from)? {
        let v = match lgetxattr(from, &name) {
            Ok(v) => v,
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
            Err(e) => return Err(e),
        };
        lsetxattr(to, &name, &v, 0)?;
    }
    Ok(())
}

/// Copy owner, mode and times of `st` onto `to` (after its data and xattrs are written).
pub(crate) fn copy_meta(st: &libc::stat, to: &Path) -> io::Result<()> {
    lchown(to, Some(st.st_uid), Some(st.st_gid))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
        chmod(to, st.st_mode & 0o7777)?;
    }
    lutimens(
        to,
        UTime::At(ts(st.st_atime, st.st_atime_nsec)),
        UTime::At(ts(st.st_mtime, st.st_mtime_nsec)),
    )
}

/// `lseek` with SEEK_DATA / SEEK_HOLE; None when there is no more data (ENXIO).
pub(crate) fn seek(f: &File, offset: u64, whence: i32) -> io::Result<Option<u64>> {
    let r = unsafe { libc::lseek(f.as_raw_fd(), offset as i64, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(r as u64))
}

/// The data extents of a file as `[start, end)` ranges (holes skipped).
pub(crate) fn data_extents(f: &File, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < size {
        let start = match seek(f, pos, libc::SEEK_DATA) {
            Ok(Some(s)) => s,
            Ok(None) => break,
            // File systems without SEEK_DATA: the whole file is data.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(vec![(0, size)]),
            Err(e) => return Err(e),
        };
        if start >= size {
            break;
        }
        let end = seek(f, start, libc::SEEK_HOLE)?.unwrap_or(size).min(size);
        out.push((start, end));
        pos = end;
    }
    Ok(out)
}

pub(crate) fn fallocate(f: &File, mode: i32, offset: u64, len: u64) -> io::Result<()> {
    check(unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) })
}

/// Read exactly `buf.len()` bytes at `offset` unless EOF comes first; returns bytes read.
pub(crate) fn pread_full(f: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// crc32c of the file's bytes over `extents` (holes read as nothing; the extents list is
/// part of what is compared, so a hole turned into zeros is still detected by size checks).
pub(crate) fn crc_extents(f: &File, extents: &[(u64, u64)]) -> io::Result<u32> {
    let mut crc = 0u32;
    let mut buf = vec![0u8; 1 << 20];
    for &(s, e) in extents {
        let mut pos = s;
        while pos < e {
            let want = ((e - pos) as usize).min(buf.len());
            let n = pread_full(f, &mut buf[..want], pos)?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &buf[..n]);
            pos += n as u64;
        }
    }
    Ok(crc)
}

pub(crate) fn fsync_dir(p: &Path) -> io::Result<()> {
    File::open(p)?.sync_all()
}

pub(crate) fn name_bytes(n: &OsStr) -> &[u8] {
    n.as_bytes()
}

pub(crate) fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The creating caller's umask, applied by the backing file system itself.
///
/// POSIX applies the umask to a new inode only when its directory has no default ACL (else
/// the ACL decides). The backing file system knows that without asking: a thread with a
/// file-system context of its own (`unshare(CLONE_FS)`) can set the caller's umask just
/// around the `open(O_CREAT)`/`mknod`/`mkdir`, which saves reading the parent's default
/// ACL and a `chmod` per create. A thread that cannot unshare (never seen on Linux) is
/// told so and the store falls back to doing it by hand.
pub(crate) mod creation_umask {
    use std::cell::Cell;

    #[derive(Clone, Copy, PartialEq)]
    enum Ctx {
        Unknown,
        Private,
        Shared,
    }

    thread_local! {
        static CTX: Cell<Ctx> = const { Cell::new(Ctx::Unknown) };
    }

    /// Whether this thread's umask is its own (unsharing it on first use), so that
    /// [`with`] may set it around a create.
    pub(crate) fn available() -> bool {
        CTX.with(|c| {
            if c.get() == Ctx::Unknown {
                // Only the umask, cwd and root are unshared; kaiso uses absolute paths.
                let ok = unsafe { libc::unshare(libc::CLONE_FS) } == 0;
                c.set(if ok { Ctx::Private } else { Ctx::Shared });
            }
            c.get() == Ctx::Private
        })
    }

    /// Run `f` with this thread's umask set to `umask`, restoring it after.
    pub(crate) fn with<T>(umask: Option<u32>, f: impl FnOnce() -> T) -> T {
        let Some(m) = umask else {
            return f();
        };
        let old = unsafe { libc::umask(m as libc::mode_t) };
        let r = f();
        unsafe { libc::umask(old) };
        r
    }
}
