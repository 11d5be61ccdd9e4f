//! Path calls: stat family, access, mkdir/rmdir/unlink/rename, links, permissions, times,
//! current directory, realpath, statvfs, and refusals for what the pool does not hold
//! (hard links, device nodes, FIFOs, extended attributes).

use crate::io::{fill_stat, fill_statx, statfs_of, times_of, timevals};
use crate::real::{self, Mode};
use crate::run;
use crate::state::{Fail, Res, Route, State, route, set_errno, state};
use kaiso_libfs::Fs;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::atomic::Ordering;

type P = *const c_char;

/// Routes a path call: the private closure runs on the pool; `kernel` gets the original or
/// rewritten path otherwise.
unsafe fn path_op<T>(
    dirfd: c_int,
    path: P,
    err: T,
    kernel: impl Fn(P) -> T,
    private: impl FnOnce(&State, &Fs, &[u8]) -> Res<T>,
) -> T {
    let Some(st) = state() else {
        return kernel(path);
    };
    match route(st, dirfd, path) {
        Route::Kernel => kernel(path),
        Route::KernelPath(p) => kernel(p.as_ptr()),
        Route::Private(abs) => run(st, err, |fs| private(st, fs, &abs), |p| kernel(p.as_ptr())),
    }
}

fn empty(path: P) -> bool {
    !path.is_null() && unsafe { *path == 0 }
}

// ---- stat -------------------------------------------------------------------------------------

unsafe fn stat_at(
    dirfd: c_int,
    path: P,
    out: *mut libc::stat,
    flags: c_int,
    kernel: impl Fn(P) -> c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0
        && empty(path)
        && let Some(f) = state().and_then(|s| s.file(dirfd))
    {
        fill_stat(&f.stat(), out);
        return 0;
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    path_op(dirfd, path, -1, kernel, |_, fs, abs| {
        fill_stat(&fs.stat(abs, follow)?, out);
        Ok(0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat(path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, 0, |p| real::stat()(p, out))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn stat64(path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, 0, |p| real::stat64()(p, out))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat(path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW, |p| {
        real::lstat()(p, out)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lstat64(path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW, |p| {
        real::lstat64()(p, out)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat(ver: c_int, path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, 0, |p| {
        real::__xstat()(ver, p, out)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __xstat64(ver: c_int, path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, 0, |p| {
        real::__xstat64()(ver, p, out)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat(ver: c_int, path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW, |p| {
        real::__lxstat()(ver, p, out)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __lxstat64(ver: c_int, path: P, out: *mut libc::stat) -> c_int {
    stat_at(libc::AT_FDCWD, path, out, libc::AT_SYMLINK_NOFOLLOW, |p| {
        real::__lxstat64()(ver, p, out)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: P,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    stat_at(dirfd, path, out, flags, |p| {
        real::fstatat()(dirfd, p, out, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: P,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    stat_at(dirfd, path, out, flags, |p| {
        real::fstatat64()(dirfd, p, out, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat(
    ver: c_int,
    dirfd: c_int,
    path: P,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    stat_at(dirfd, path, out, flags, |p| {
        real::__fxstatat()(ver, dirfd, p, out, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstatat64(
    ver: c_int,
    dirfd: c_int,
    path: P,
    out: *mut libc::stat,
    flags: c_int,
) -> c_int {
    stat_at(dirfd, path, out, flags, |p| {
        real::__fxstatat64()(ver, dirfd, p, out, flags)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: P,
    flags: c_int,
    mask: u32,
    out: *mut libc::statx,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0
        && empty(path)
        && let Some(f) = state().and_then(|s| s.file(dirfd))
    {
        fill_statx(&f.stat(), out);
        return 0;
    }
    let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
    path_op(
        dirfd,
        path,
        -1,
        |p| real::statx()(dirfd, p, flags, mask, out),
        |_, fs, abs| {
            fill_statx(&fs.stat(abs, follow)?, out);
            Ok(0)
        },
    )
}

macro_rules! statfs_like {
    ($name:ident, $ty:ty, $idx:tt) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: P, out: *mut $ty) -> c_int {
            path_op(
                libc::AT_FDCWD,
                path,
                -1,
                |p| real::$name()(p, out),
                |_, fs, abs| {
                    fs.stat(abs, true)?;
                    out.write(statfs_of(fs).$idx);
                    Ok(0)
                },
            )
        }
    };
}
statfs_like!(statfs, libc::statfs, 0);
statfs_like!(statfs64, libc::statfs, 0);
statfs_like!(statvfs, libc::statvfs, 1);
statfs_like!(statvfs64, libc::statvfs, 1);

// ---- access -------------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn access(path: P, mode: c_int) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::access()(p, mode),
        |_, fs, abs| {
            fs.access(abs, mode)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn euidaccess(path: P, mode: c_int) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::euidaccess()(p, mode),
        |_, fs, abs| {
            fs.access(abs, mode)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn eaccess(path: P, mode: c_int) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::eaccess()(p, mode),
        |_, fs, abs| {
            fs.access(abs, mode)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: P, mode: c_int, flags: c_int) -> c_int {
    path_op(
        dirfd,
        path,
        -1,
        |p| real::faccessat()(dirfd, p, mode, flags),
        |_, fs, abs| {
            fs.access(abs, mode)?;
            Ok(0)
        },
    )
}

// ---- namespace ----------------------------------------------------------------------------------

fn umasked(st: &State, mode: Mode) -> u32 {
    mode & !st.umask.load(Ordering::Relaxed)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdir(path: P, mode: Mode) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::mkdir()(p, mode),
        |st, fs, abs| {
            fs.mkdir(abs, umasked(st, mode))?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mkdirat(dirfd: c_int, path: P, mode: Mode) -> c_int {
    path_op(
        dirfd,
        path,
        -1,
        |p| real::mkdirat()(dirfd, p, mode),
        |st, fs, abs| {
            fs.mkdir(abs, umasked(st, mode))?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rmdir(path: P) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::rmdir()(p),
        |_, fs, abs| {
            fs.rmdir(abs)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlink(path: P) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::unlink()(p),
        |_, fs, abs| {
            fs.unlink(abs)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn unlinkat(dirfd: c_int, path: P, flags: c_int) -> c_int {
    path_op(
        dirfd,
        path,
        -1,
        |p| real::unlinkat()(dirfd, p, flags),
        |_, fs, abs| {
            if flags & libc::AT_REMOVEDIR != 0 {
                fs.rmdir(abs)?;
            } else {
                fs.unlink(abs)?;
            }
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn remove(path: P) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::remove()(p),
        |_, fs, abs| {
            match fs.unlink(abs) {
                Err(kaiso_libfs::FsError::Errno(libc::EISDIR)) => fs.rmdir(abs)?,
                r => r?,
            }
            Ok(0)
        },
    )
}

/// Routes a call with two paths: both private, both kernel, or EXDEV.
unsafe fn two_paths(
    d1: c_int,
    p1: P,
    d2: c_int,
    p2: P,
    kernel: impl Fn(P, P) -> c_int,
    private: impl FnOnce(&Fs, &[u8], &[u8]) -> Res<c_int>,
) -> c_int {
    let Some(st) = state() else {
        return kernel(p1, p2);
    };
    let (r1, r2) = (route(st, d1, p1), route(st, d2, p2));
    match (r1, r2) {
        (Route::Private(a), Route::Private(b)) => run(
            st,
            -1,
            |fs| private(fs, &a, &b),
            |_| {
                set_errno(libc::EXDEV);
                -1
            },
        ),
        (Route::Private(_), _) | (_, Route::Private(_)) => {
            set_errno(libc::EXDEV);
            -1
        }
        (a, b) => {
            let k1 = match &a {
                Route::KernelPath(c) => c.as_ptr(),
                _ => p1,
            };
            let k2 = match &b {
                Route::KernelPath(c) => c.as_ptr(),
                _ => p2,
            };
            kernel(k1, k2)
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rename(old: P, new: P) -> c_int {
    two_paths(
        libc::AT_FDCWD,
        old,
        libc::AT_FDCWD,
        new,
        |a, b| real::rename()(a, b),
        |fs, a, b| {
            fs.rename(a, b, 0)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat(d1: c_int, old: P, d2: c_int, new: P) -> c_int {
    two_paths(
        d1,
        old,
        d2,
        new,
        |a, b| real::renameat()(d1, a, d2, b),
        |fs, a, b| {
            fs.rename(a, b, 0)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn renameat2(d1: c_int, old: P, d2: c_int, new: P, flags: u32) -> c_int {
    two_paths(
        d1,
        old,
        d2,
        new,
        |a, b| real::renameat2()(d1, a, d2, b, flags),
        |fs, a, b| {
            fs.rename(a, b, flags)?;
            Ok(0)
        },
    )
}
/// Hard links are not supported in the pool (as in the thesis): EPERM.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn link(old: P, new: P) -> c_int {
    two_paths(
        libc::AT_FDCWD,
        old,
        libc::AT_FDCWD,
        new,
        |a, b| real::link()(a, b),
        |fs, a, b| Ok(fs.link(a, b, false).map(|_| 0)?),
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn linkat(d1: c_int, old: P, d2: c_int, new: P, flags: c_int) -> c_int {
    two_paths(
        d1,
        old,
        d2,
        new,
        |a, b| real::linkat()(d1, a, d2, b, flags),
        |fs, a, b| {
            if flags & !(libc::AT_SYMLINK_FOLLOW | libc::AT_EMPTY_PATH) != 0 {
                return Err(Fail::Errno(libc::EINVAL));
            }
            Ok(fs
                .link(a, b, flags & libc::AT_SYMLINK_FOLLOW != 0)
                .map(|_| 0)?)
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlink(target: P, linkpath: P) -> c_int {
    let t = if target.is_null() {
        &[][..]
    } else {
        CStr::from_ptr(target).to_bytes()
    };
    path_op(
        libc::AT_FDCWD,
        linkpath,
        -1,
        |p| real::symlink()(target, p),
        |_, fs, abs| {
            fs.symlink(t, abs)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn symlinkat(target: P, dirfd: c_int, linkpath: P) -> c_int {
    let t = if target.is_null() {
        &[][..]
    } else {
        CStr::from_ptr(target).to_bytes()
    };
    path_op(
        dirfd,
        linkpath,
        -1,
        |p| real::symlinkat()(target, dirfd, p),
        |_, fs, abs| {
            fs.symlink(t, abs)?;
            Ok(0)
        },
    )
}

unsafe fn copy_link(fs: &Fs, abs: &[u8], out: *mut c_char, size: usize) -> Res<isize> {
    let t = fs.readlink(abs)?;
    let n = t.len().min(size);
    std::ptr::copy_nonoverlapping(t.as_ptr(), out as *mut u8, n);
    Ok(n as isize)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlink(path: P, out: *mut c_char, size: usize) -> isize {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::readlink()(p, out, size),
        |_, fs, abs| copy_link(fs, abs, out, size),
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readlinkat(dirfd: c_int, path: P, out: *mut c_char, size: usize) -> isize {
    path_op(
        dirfd,
        path,
        -1,
        |p| real::readlinkat()(dirfd, p, out, size),
        |_, fs, abs| copy_link(fs, abs, out, size),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate(path: P, len: libc::off_t) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::truncate()(p, len),
        |_, fs, abs| {
            if len < 0 {
                return Err(Fail::Errno(libc::EINVAL));
            }
            fs.open(abs, libc::O_WRONLY, 0)?.truncate(len as u64)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn truncate64(path: P, len: libc::off_t) -> c_int {
    truncate(path, len)
}

// ---- permissions and times --------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn chmod(path: P, mode: Mode) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::chmod()(p, mode),
        |_, fs, abs| {
            fs.chmod(abs, mode, true)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmodat(dirfd: c_int, path: P, mode: Mode, flags: c_int) -> c_int {
    path_op(
        dirfd,
        path,
        -1,
        |p| real::fchmodat()(dirfd, p, mode, flags),
        |_, fs, abs| {
            fs.chmod(abs, mode, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
            Ok(0)
        },
    )
}
fn ids(uid: libc::uid_t, gid: libc::gid_t) -> (Option<u32>, Option<u32>) {
    (
        (uid != u32::MAX).then_some(uid),
        (gid != u32::MAX).then_some(gid),
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn chown(path: P, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::chown()(p, uid, gid),
        |_, fs, abs| {
            let (u, g) = ids(uid, gid);
            fs.chown(abs, u, g, true)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lchown(path: P, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::lchown()(p, uid, gid),
        |_, fs, abs| {
            let (u, g) = ids(uid, gid);
            fs.chown(abs, u, g, false)?;
            Ok(0)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchownat(
    dirfd: c_int,
    path: P,
    uid: libc::uid_t,
    gid: libc::gid_t,
    flags: c_int,
) -> c_int {
    if flags & libc::AT_EMPTY_PATH != 0
        && empty(path)
        && state().and_then(|s| s.file(dirfd)).is_some()
    {
        return crate::io::fchown(dirfd, uid, gid);
    }
    path_op(
        dirfd,
        path,
        -1,
        |p| real::fchownat()(dirfd, p, uid, gid, flags),
        |_, fs, abs| {
            let (u, g) = ids(uid, gid);
            fs.chown(abs, u, g, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
            Ok(0)
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimensat(
    dirfd: c_int,
    path: P,
    ts: *const libc::timespec,
    flags: c_int,
) -> c_int {
    if path.is_null() {
        return crate::io::futimens(dirfd, ts);
    }
    path_op(
        dirfd,
        path,
        -1,
        |p| real::utimensat()(dirfd, p, ts, flags),
        |_, fs, abs| {
            let (a, m) = times_of(ts);
            fs.utimens(abs, a, m, flags & libc::AT_SYMLINK_NOFOLLOW == 0)?;
            Ok(0)
        },
    )
}
unsafe fn utimes_tv(
    dirfd: c_int,
    path: P,
    tv: *const libc::timeval,
    follow: bool,
    kernel: impl Fn(P) -> c_int,
) -> c_int {
    path_op(dirfd, path, -1, kernel, |_, fs, abs| {
        let t = timevals(tv);
        let (a, m) = times_of(t.as_ref().map_or(std::ptr::null(), |x| x.as_ptr()));
        fs.utimens(abs, a, m, follow)?;
        Ok(0)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utimes(path: P, tv: *const libc::timeval) -> c_int {
    utimes_tv(libc::AT_FDCWD, path, tv, true, |p| real::utimes()(p, tv))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lutimes(path: P, tv: *const libc::timeval) -> c_int {
    utimes_tv(libc::AT_FDCWD, path, tv, false, |p| real::lutimes()(p, tv))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimesat(dirfd: c_int, path: P, tv: *const libc::timeval) -> c_int {
    utimes_tv(dirfd, path, tv, true, |p| real::futimesat()(dirfd, p, tv))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn utime(path: P, ub: *const libc::utimbuf) -> c_int {
    path_op(
        libc::AT_FDCWD,
        path,
        -1,
        |p| real::utime()(p, ub),
        |_, fs, abs| {
            let (a, m) = if ub.is_null() {
                times_of(std::ptr::null())
            } else {
                (
                    Some((*ub).actime * 1_000_000_000),
                    Some((*ub).modtime * 1_000_000_000),
                )
            };
            fs.utimens(abs, a, m, true)?;
            Ok(0)
        },
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn umask(mask: Mode) -> Mode {
    if let Some(st) = state() {
        st.umask.store(mask & 0o777, Ordering::Relaxed);
    }
    real::umask()(mask)
}

// ---- refusals ---------------------------------------------------------------------------------

macro_rules! refuse_path {
    ($name:ident ( $($a:ident : $t:ty),* ), $path:ident, $dirfd:expr, $errno:expr, $ok:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> isize {
            path_op($dirfd, $path, -1, |p| {
                let $path = p;
                real::$name()($($a),*) as isize
            }, |_, fs, abs| {
                fs.stat(abs, false)?;
                match $ok {
                    Some(v) => Ok(v),
                    None => Err(Fail::Errno($errno)),
                }
            })
        }
    };
}
refuse_path!(getxattr(path: P, name: P, value: *mut c_void, size: usize), path, libc::AT_FDCWD, libc::ENOTSUP, None::<isize>);
refuse_path!(lgetxattr(path: P, name: P, value: *mut c_void, size: usize), path, libc::AT_FDCWD, libc::ENOTSUP, None::<isize>);
refuse_path!(listxattr(path: P, list: *mut c_char, size: usize), path, libc::AT_FDCWD, 0, Some(0isize));
refuse_path!(llistxattr(path: P, list: *mut c_char, size: usize), path, libc::AT_FDCWD, 0, Some(0isize));

macro_rules! refuse_path_int {
    ($name:ident ( $($a:ident : $t:ty),* ), $path:ident, $dirfd:expr, $errno:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            path_op($dirfd, $path, -1, |p| {
                let $path = p;
                real::$name()($($a),*)
            }, |_, _, _| Err(Fail::Errno($errno)))
        }
    };
}
refuse_path_int!(setxattr(path: P, name: P, value: *const c_void, size: usize, flags: c_int), path, libc::AT_FDCWD, libc::ENOTSUP);
refuse_path_int!(lsetxattr(path: P, name: P, value: *const c_void, size: usize, flags: c_int), path, libc::AT_FDCWD, libc::ENOTSUP);
refuse_path_int!(removexattr(path: P, name: P), path, libc::AT_FDCWD, libc::ENOTSUP);
refuse_path_int!(lremovexattr(path: P, name: P), path, libc::AT_FDCWD, libc::ENOTSUP);
refuse_path_int!(mknod(path: P, mode: Mode, dev: libc::dev_t), path, libc::AT_FDCWD, libc::EPERM);
refuse_path_int!(mknodat(dirfd: c_int, path: P, mode: Mode, dev: libc::dev_t), path, dirfd, libc::EPERM);
refuse_path_int!(mkfifo(path: P, mode: Mode), path, libc::AT_FDCWD, libc::EPERM);
refuse_path_int!(mkfifoat(dirfd: c_int, path: P, mode: Mode), path, dirfd, libc::EPERM);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fgetxattr(fd: c_int, name: P, value: *mut c_void, size: usize) -> isize {
    if state().and_then(|s| s.file(fd)).is_some() {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    real::fgetxattr()(fd, name, value, size)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn flistxattr(fd: c_int, list: *mut c_char, size: usize) -> isize {
    if state().and_then(|s| s.file(fd)).is_some() {
        return 0;
    }
    real::flistxattr()(fd, list, size)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: P,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    if state().and_then(|s| s.file(fd)).is_some() {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    real::fsetxattr()(fd, name, value, size, flags)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: P) -> c_int {
    if state().and_then(|s| s.file(fd)).is_some() {
        set_errno(libc::ENOTSUP);
        return -1;
    }
    real::fremovexattr()(fd, name)
}

// ---- current directory ---------------------------------------------------------------------------

fn refresh_kcwd(st: &State) {
    let mut buf = vec![0u8; 4096];
    let p = unsafe { real::getcwd()(buf.as_mut_ptr() as *mut c_char, buf.len()) };
    if !p.is_null() {
        *st.kcwd.lock() = unsafe { CStr::from_ptr(p) }.to_bytes().to_vec();
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn chdir(path: P) -> c_int {
    let Some(st) = state() else {
        return real::chdir()(path);
    };
    let kernel = |p: P| {
        let r = real::chdir()(p);
        if r == 0 {
            *st.vcwd.lock() = None;
            refresh_kcwd(st);
        }
        r
    };
    path_op(libc::AT_FDCWD, path, -1, kernel, |st, fs, abs| {
        let canon = fs.canonical(abs)?;
        if fs.stat(&canon, true)?.mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(Fail::Errno(libc::ENOTDIR));
        }
        *st.vcwd.lock() = Some(canon);
        Ok(0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let Some(st) = state() else {
        return real::fchdir()(fd);
    };
    if let Some(f) = st.file(fd) {
        if !f.is_dir() {
            set_errno(libc::ENOTDIR);
            return -1;
        }
        let p = f.fs().dir_path(f.ino());
        *st.vcwd.lock() = Some(p);
        return 0;
    }
    let r = real::fchdir()(fd);
    if r == 0 {
        *st.vcwd.lock() = None;
        refresh_kcwd(st);
    }
    r
}

unsafe fn out_path(p: &[u8], buf: *mut c_char, size: usize) -> *mut c_char {
    if buf.is_null() {
        let cap = if size == 0 { p.len() + 1 } else { size };
        if cap < p.len() + 1 {
            set_errno(libc::ERANGE);
            return std::ptr::null_mut();
        }
        let m = libc::malloc(cap) as *mut c_char;
        if m.is_null() {
            set_errno(libc::ENOMEM);
            return m;
        }
        std::ptr::copy_nonoverlapping(p.as_ptr(), m as *mut u8, p.len());
        *m.add(p.len()) = 0;
        return m;
    }
    if size < p.len() + 1 {
        set_errno(if size == 0 {
            libc::EINVAL
        } else {
            libc::ERANGE
        });
        return std::ptr::null_mut();
    }
    std::ptr::copy_nonoverlapping(p.as_ptr(), buf as *mut u8, p.len());
    *buf.add(p.len()) = 0;
    buf
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn getcwd(buf: *mut c_char, size: usize) -> *mut c_char {
    if let Some(st) = state() {
        let v = st.vcwd.lock().clone();
        if let Some(v) = v {
            return out_path(&v, buf, size);
        }
    }
    real::getcwd()(buf, size)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn get_current_dir_name() -> *mut c_char {
    if let Some(st) = state() {
        let v = st.vcwd.lock().clone();
        if let Some(v) = v {
            return out_path(&v, std::ptr::null_mut(), 0);
        }
    }
    real::get_current_dir_name()()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn realpath(path: P, resolved: *mut c_char) -> *mut c_char {
    path_op(
        libc::AT_FDCWD,
        path,
        std::ptr::null_mut(),
        |p| real::realpath()(p, resolved),
        |_, fs, abs| {
            let c = fs.canonical(abs)?;
            let r = out_path(
                &c,
                resolved,
                if resolved.is_null() {
                    0
                } else {
                    libc::PATH_MAX as usize
                },
            );
            if r.is_null() {
                return Err(Fail::Errno(libc::ENAMETOOLONG));
            }
            Ok(r)
        },
    )
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn canonicalize_file_name(path: P) -> *mut c_char {
    realpath(path, std::ptr::null_mut())
}
