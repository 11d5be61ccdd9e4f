//! Descriptor calls: open family, read/write family, seek, sync, truncate, allocate, dup,
//! fcntl (record locks), flock, fstat family, mmap/ioctl refusals.

use crate::real::{self, Mode};
use crate::state::{Route, State, errno, route, set_errno, state};
use crate::{ret, run};
use kaiso_libfs::{OpenFile, Stat};
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_void};
use std::sync::Arc;
use std::sync::atomic::Ordering;

type P = *const c_char;
type Off = libc::off_t;

/// The device number private files report (no real device has it).
pub const PRIVATE_DEV: u64 = 0x6b61_6973;

unsafe fn buf_mut<'a>(p: *mut c_void, n: usize) -> &'a mut [u8] {
    if n == 0 || p.is_null() {
        &mut []
    } else {
        std::slice::from_raw_parts_mut(p as *mut u8, n)
    }
}

unsafe fn buf<'a>(p: *const c_void, n: usize) -> &'a [u8] {
    if n == 0 || p.is_null() {
        &[]
    } else {
        std::slice::from_raw_parts(p as *const u8, n)
    }
}

fn file_of(fd: c_int) -> Option<Arc<OpenFile>> {
    state()?.file(fd)
}

// ---- open -----------------------------------------------------------------------------------

pub(crate) fn priv_open(
    st: &State,
    fs: &kaiso_libfs::Fs,
    abs: &[u8],
    flags: c_int,
    mode: Mode,
) -> crate::Res<c_int> {
    let mode = mode & !st.umask.load(Ordering::Relaxed);
    let of = fs.open(abs, flags, mode)?;
    Ok(st.install(of, 0, flags & libc::O_CLOEXEC != 0)?)
}

unsafe fn open_at(
    dirfd: c_int,
    path: P,
    flags: c_int,
    mode: Mode,
    kernel: impl Fn(P) -> c_int,
) -> c_int {
    let Some(st) = state() else {
        return kernel(path);
    };
    match route(st, dirfd, path) {
        Route::Kernel => kernel(path),
        Route::KernelPath(p) => kernel(p.as_ptr()),
        Route::Private(abs) => run(
            st,
            -1,
            |fs| priv_open(st, fs, &abs, flags, mode),
            |p| kernel(p.as_ptr()),
        ),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn open(path: P, flags: c_int, mode: Mode) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, mode, |p| {
        real::open()(p, flags, mode)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn open64(path: P, flags: c_int, mode: Mode) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, mode, |p| {
        real::open64()(p, flags, mode)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open_2(path: P, flags: c_int) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, 0, |p| {
        real::__open_2()(p, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __open64_2(path: P, flags: c_int) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, 0, |p| {
        real::__open64_2()(p, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat(dirfd: c_int, path: P, flags: c_int, mode: Mode) -> c_int {
    open_at(dirfd, path, flags, mode, |p| {
        real::openat()(dirfd, p, flags, mode)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn openat64(dirfd: c_int, path: P, flags: c_int, mode: Mode) -> c_int {
    open_at(dirfd, path, flags, mode, |p| {
        real::openat64()(dirfd, p, flags, mode)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: P, flags: c_int) -> c_int {
    open_at(dirfd, path, flags, 0, |p| {
        real::__openat_2()(dirfd, p, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: P, flags: c_int) -> c_int {
    open_at(dirfd, path, flags, 0, |p| {
        real::__openat64_2()(dirfd, p, flags)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat(path: P, mode: Mode) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    open_at(libc::AT_FDCWD, path, flags, mode, |p| {
        real::creat()(p, mode)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn creat64(path: P, mode: Mode) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    open_at(libc::AT_FDCWD, path, flags, mode, |p| {
        real::creat64()(p, mode)
    })
}

// ---- close ----------------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if let Some(st) = state() {
        if let Some(f) = st.file(fd) {
            // POSIX: closing any descriptor of a file drops the process's locks on it.
            f.posix_unlock_all();
        }
        if st.close_private(fd) {
            return 0;
        }
        if st.owns_fd(fd) {
            // A spare reserved number: to the program it is not open.
            set_errno(libc::EBADF);
            return -1;
        }
    }
    real::close()(fd)
}

/// Closes [first, last] except the numbers this library holds, which are closed privately
/// (private descriptors) or kept (spare reserved numbers).
unsafe fn close_span(st: &State, first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let Some(t) = st.table() else {
        return real::close_range()(first, last, flags);
    };
    let limit = t.slots.len() as c_uint;
    let mut start = first;
    let mut fd = first;
    while fd <= last && fd < limit {
        if st.owns_fd(fd as c_int) {
            if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
                st.close_private(fd as c_int);
            } else if let Some(s) = t.slots.get(fd as usize) {
                s.cloexec.store(true, Ordering::Relaxed);
            }
            if fd > start && real::close_range()(start, fd - 1, flags) != 0 {
                return -1;
            }
            start = fd + 1;
        }
        fd += 1;
    }
    if start <= last {
        return real::close_range()(start, last, flags);
    }
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    match state() {
        Some(st) if first <= last => close_span(st, first, last, flags),
        _ => real::close_range()(first, last, flags),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    match state() {
        Some(st) if low >= 0 => {
            close_span(st, low as c_uint, c_uint::MAX, 0);
        }
        _ => real::closefrom()(low),
    }
}

// ---- read / write -----------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, b: *mut c_void, n: usize) -> isize {
    if let Some(f) = file_of(fd) {
        return ret(f.read(buf_mut(b, n)).map(|x| x as isize), -1);
    }
    real::read()(fd, b, n)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __read_chk(fd: c_int, b: *mut c_void, n: usize, cap: usize) -> isize {
    if let Some(f) = file_of(fd) {
        if n > cap {
            libc::abort();
        }
        return ret(f.read(buf_mut(b, n)).map(|x| x as isize), -1);
    }
    real::__read_chk()(fd, b, n, cap)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, b: *const c_void, n: usize) -> isize {
    if let Some(f) = file_of(fd) {
        return ret(f.write(buf(b, n)).map(|x| x as isize), -1);
    }
    real::write()(fd, b, n)
}

fn check_off(off: Off) -> Result<u64, c_int> {
    if off < 0 {
        Err(libc::EINVAL)
    } else {
        Ok(off as u64)
    }
}

unsafe fn do_pread(f: &OpenFile, b: *mut c_void, n: usize, off: Off) -> isize {
    ret(
        check_off(off)
            .and_then(|o| f.pread(buf_mut(b, n), o))
            .map(|x| x as isize),
        -1,
    )
}
unsafe fn do_pwrite(f: &OpenFile, b: *const c_void, n: usize, off: Off) -> isize {
    ret(
        check_off(off)
            .and_then(|o| f.pwrite(buf(b, n), o))
            .map(|x| x as isize),
        -1,
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread(fd: c_int, b: *mut c_void, n: usize, off: Off) -> isize {
    match file_of(fd) {
        Some(f) => do_pread(&f, b, n, off),
        None => real::pread()(fd, b, n, off),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pread64(fd: c_int, b: *mut c_void, n: usize, off: Off) -> isize {
    match file_of(fd) {
        Some(f) => do_pread(&f, b, n, off),
        None => real::pread64()(fd, b, n, off),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    b: *mut c_void,
    n: usize,
    off: Off,
    cap: usize,
) -> isize {
    match file_of(fd) {
        Some(f) => do_pread(&f, b, n.min(cap), off),
        None => real::__pread_chk()(fd, b, n, off, cap),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    b: *mut c_void,
    n: usize,
    off: Off,
    cap: usize,
) -> isize {
    match file_of(fd) {
        Some(f) => do_pread(&f, b, n.min(cap), off),
        None => real::__pread64_chk()(fd, b, n, off, cap),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite(fd: c_int, b: *const c_void, n: usize, off: Off) -> isize {
    match file_of(fd) {
        Some(f) => do_pwrite(&f, b, n, off),
        None => real::pwrite()(fd, b, n, off),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwrite64(fd: c_int, b: *const c_void, n: usize, off: Off) -> isize {
    match file_of(fd) {
        Some(f) => do_pwrite(&f, b, n, off),
        None => real::pwrite64()(fd, b, n, off),
    }
}

unsafe fn iovs<'a>(iov: *const libc::iovec, cnt: c_int) -> Result<&'a [libc::iovec], c_int> {
    if !(0..=1024).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    Ok(if cnt == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(iov, cnt as usize)
    })
}

/// Vector read at `off` (None: at the file position).
unsafe fn vread(
    f: &OpenFile,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<u64>,
) -> Result<usize, c_int> {
    let mut total = 0usize;
    for v in iovs(iov, cnt)? {
        let b = buf_mut(v.iov_base, v.iov_len);
        let n = match off {
            Some(o) => f.pread(b, o + total as u64)?,
            None => f.read(b)?,
        };
        total += n;
        if n < v.iov_len {
            break;
        }
    }
    Ok(total)
}

/// Vector write, gathered into one write so that an append stays atomic.
unsafe fn vwrite(
    f: &OpenFile,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Option<u64>,
) -> Result<usize, c_int> {
    let v = iovs(iov, cnt)?;
    let joined: Vec<u8>;
    let data: &[u8] = if v.len() == 1 {
        buf(v[0].iov_base, v[0].iov_len)
    } else {
        joined = v
            .iter()
            .flat_map(|x| buf(x.iov_base, x.iov_len).iter().copied())
            .collect();
        &joined
    };
    match off {
        Some(o) => f.pwrite(data, o),
        None => f.write(data),
    }
}

macro_rules! vec_io {
    ($name:ident, $op:ident, $($off:ident)?) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, iov: *const libc::iovec, cnt: c_int $(, $off: Off)?) -> isize {
            if let Some(f) = file_of(fd) {
                #[allow(unused_mut, unused_assignments)]
                let mut at: Result<Option<u64>, c_int> = Ok(None);
                $( at = check_off($off).map(Some); )?
                return ret(at.and_then(|a| $op(&f, iov, cnt, a)).map(|x| x as isize), -1);
            }
            real::$name()(fd, iov, cnt $(, $off)?)
        }
    };
}
vec_io!(readv, vread,);
vec_io!(writev, vwrite,);
vec_io!(preadv, vread, off);
vec_io!(preadv64, vread, off);
vec_io!(pwritev, vwrite, off);
vec_io!(pwritev64, vwrite, off);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Off,
    flags: c_int,
) -> isize {
    if let Some(f) = file_of(fd) {
        let at = if off == -1 {
            Ok(None)
        } else {
            check_off(off).map(Some)
        };
        return ret(
            at.and_then(|a| vread(&f, iov, cnt, a)).map(|x| x as isize),
            -1,
        );
    }
    real::preadv2()(fd, iov, cnt, off, flags)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const libc::iovec,
    cnt: c_int,
    off: Off,
    flags: c_int,
) -> isize {
    if let Some(f) = file_of(fd) {
        let at = if off == -1 {
            Ok(None)
        } else {
            check_off(off).map(Some)
        };
        return ret(
            at.and_then(|a| vwrite(&f, iov, cnt, a)).map(|x| x as isize),
            -1,
        );
    }
    real::pwritev2()(fd, iov, cnt, off, flags)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek(fd: c_int, off: Off, whence: c_int) -> Off {
    match file_of(fd) {
        Some(f) => ret(f.seek(off, whence).map(|x| x as Off), -1),
        None => real::lseek()(fd, off, whence),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lseek64(fd: c_int, off: Off, whence: c_int) -> Off {
    match file_of(fd) {
        Some(f) => ret(f.seek(off, whence).map(|x| x as Off), -1),
        None => real::lseek64()(fd, off, whence),
    }
}

// ---- sync, size, allocation -------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    match file_of(fd) {
        Some(f) => ret(f.sync().map(|_| 0), -1),
        None => real::fsync()(fd),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    match file_of(fd) {
        Some(f) => ret(f.sync().map(|_| 0), -1),
        None => real::fdatasync()(fd),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    match file_of(fd) {
        Some(f) => ret(f.sync().map(|_| 0), -1),
        None => real::syncfs()(fd),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sync_file_range(fd: c_int, off: Off, n: Off, flags: c_uint) -> c_int {
    match file_of(fd) {
        Some(f) => ret(f.sync().map(|_| 0), -1),
        None => real::sync_file_range()(fd, off, n, flags),
    }
}

fn do_ftruncate(f: &OpenFile, len: Off) -> c_int {
    ret(check_off(len).and_then(|l| f.truncate(l)).map(|_| 0), -1)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => do_ftruncate(&f, len),
        None => real::ftruncate()(fd, len),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => do_ftruncate(&f, len),
        None => real::ftruncate64()(fd, len),
    }
}

fn do_allocate(f: &OpenFile, mode: c_int, off: Off, len: Off) -> Result<(), c_int> {
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    f.allocate(mode, off as u64, len as u64)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: Off, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => ret(do_allocate(&f, mode, off, len).map(|_| 0), -1),
        None => real::fallocate()(fd, mode, off, len),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: Off, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => ret(do_allocate(&f, mode, off, len).map(|_| 0), -1),
        None => real::fallocate64()(fd, mode, off, len),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: Off, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => do_allocate(&f, 0, off, len).err().unwrap_or(0),
        None => real::posix_fallocate()(fd, off, len),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: Off, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => do_allocate(&f, 0, off, len).err().unwrap_or(0),
        None => real::posix_fallocate64()(fd, off, len),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise(fd: c_int, off: Off, len: Off, advice: c_int) -> c_int {
    match file_of(fd) {
        Some(_) => 0,
        None => real::posix_fadvise()(fd, off, len, advice),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_fadvise64(fd: c_int, off: Off, len: Off, advice: c_int) -> c_int {
    match file_of(fd) {
        Some(_) => 0,
        None => real::posix_fadvise64()(fd, off, len, advice),
    }
}

// ---- dup, fcntl, locks --------------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    if let Some(st) = state()
        && let Some(f) = st.file(fd)
    {
        return ret(st.install(f, 0, false), -1);
    }
    real::dup()(fd)
}

unsafe fn dup_to(old: c_int, new: c_int, flags: c_int, kernel: impl Fn() -> c_int) -> c_int {
    let Some(st) = state() else { return kernel() };
    let cloexec = flags & libc::O_CLOEXEC != 0;
    if let Some(f) = st.file(old) {
        if old == new {
            return new;
        }
        return ret(st.install_at(new, f, cloexec).map(|_| new), -1);
    }
    if old != new && st.owns_fd(new) && !st.owns_fd(old) {
        st.release_number(new);
    }
    kernel()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    dup_to(old, new, 0, || real::dup2()(old, new))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old == new {
        set_errno(libc::EINVAL);
        return -1;
    }
    dup_to(old, new, flags, || real::dup3()(old, new, flags))
}

/// The byte range [start, end) a struct flock describes for this file.
fn lock_range(f: &OpenFile, l: &libc::flock) -> Result<(u64, u64), c_int> {
    let base = match l.l_whence as c_int {
        libc::SEEK_SET => 0i64,
        libc::SEEK_CUR => f.position() as i64,
        libc::SEEK_END => f.stat().size as i64,
        _ => return Err(libc::EINVAL),
    };
    let start = base.checked_add(l.l_start).ok_or(libc::EOVERFLOW)?;
    let (s, e) = match l.l_len {
        0 => (start, i64::MAX),
        n if n > 0 => (start, start.saturating_add(n)),
        n => (start + n, start),
    };
    if s < 0 {
        return Err(libc::EINVAL);
    }
    Ok((s as u64, if e == i64::MAX { u64::MAX } else { e as u64 }))
}

fn report_conflict(l: &mut libc::flock, c: Option<(u64, u64, bool)>) {
    match c {
        None => l.l_type = libc::F_UNLCK as i16,
        Some((cs, ce, excl)) => {
            l.l_type = if excl { libc::F_WRLCK } else { libc::F_RDLCK } as i16;
            l.l_whence = libc::SEEK_SET as i16;
            l.l_start = cs as i64;
            l.l_len = if ce == u64::MAX { 0 } else { (ce - cs) as i64 };
            l.l_pid = -1;
        }
    }
}

unsafe fn private_fcntl(
    st: &State,
    fd: c_int,
    f: Arc<OpenFile>,
    cmd: c_int,
    arg: usize,
) -> Result<c_int, c_int> {
    let t = st.table().ok_or(libc::EBADF)?;
    let slot = &t.slots[fd as usize];
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            st.install(f, arg as c_int, cmd == libc::F_DUPFD_CLOEXEC)
        }
        libc::F_GETFD => Ok(if slot.cloexec.load(Ordering::Relaxed) {
            libc::FD_CLOEXEC
        } else {
            0
        }),
        libc::F_SETFD => {
            slot.cloexec
                .store(arg as c_int & libc::FD_CLOEXEC != 0, Ordering::Relaxed);
            Ok(0)
        }
        libc::F_GETFL => Ok(f.flags() | libc::O_LARGEFILE),
        libc::F_SETFL => {
            f.set_flags(arg as c_int);
            Ok(0)
        }
        // Process-associated record locks: the only holder is this process, which never
        // conflicts with itself; they can conflict with open-file-description locks.
        libc::F_SETLK | libc::F_SETLKW => {
            let l = &*(arg as *const libc::flock);
            let (s, e) = lock_range(&f, l)?;
            f.posix_lock(s, e, l.l_type as c_int, cmd == libc::F_SETLKW)?;
            Ok(0)
        }
        libc::F_GETLK => {
            let l = &mut *(arg as *mut libc::flock);
            let (s, e) = lock_range(&f, l)?;
            report_conflict(l, f.posix_test(s, e, l.l_type as c_int));
            Ok(0)
        }
        libc::F_OFD_SETLK | libc::F_OFD_SETLKW => {
            let l = &*(arg as *const libc::flock);
            let (s, e) = lock_range(&f, l)?;
            f.ofd_lock(s, e, l.l_type as c_int, cmd == libc::F_OFD_SETLKW)?;
            Ok(0)
        }
        libc::F_OFD_GETLK => {
            let l = &mut *(arg as *mut libc::flock);
            let (s, e) = lock_range(&f, l)?;
            report_conflict(l, f.ofd_test(s, e, l.l_type as c_int));
            Ok(0)
        }
        _ => Err(libc::EINVAL),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if let Some(st) = state()
        && let Some(f) = st.file(fd)
    {
        return ret(private_fcntl(st, fd, f, cmd, arg), -1);
    }
    real::fcntl()(fd, cmd, arg)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    if let Some(st) = state()
        && let Some(f) = st.file(fd)
    {
        return ret(private_fcntl(st, fd, f, cmd, arg), -1);
    }
    real::fcntl64()(fd, cmd, arg)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn flock(fd: c_int, op: c_int) -> c_int {
    match file_of(fd) {
        Some(f) => ret(f.flock(op).map(|_| 0), -1),
        None => real::flock()(fd, op),
    }
}
/// lockf(3) as process-associated locks from the current position.
fn do_lockf(f: &OpenFile, cmd: c_int, len: Off) -> Result<c_int, c_int> {
    let pos = f.position() as i64;
    let (s, e) = match len {
        0 => (pos, i64::MAX),
        n if n > 0 => (pos, pos.saturating_add(n)),
        n => (pos + n, pos),
    };
    if s < 0 {
        return Err(libc::EINVAL);
    }
    let (s, e) = (s as u64, if e == i64::MAX { u64::MAX } else { e as u64 });
    match cmd {
        libc::F_LOCK => f.posix_lock(s, e, libc::F_WRLCK as c_int, true).map(|_| 0),
        libc::F_TLOCK => f.posix_lock(s, e, libc::F_WRLCK as c_int, false).map(|_| 0),
        libc::F_ULOCK => f.posix_lock(s, e, libc::F_UNLCK as c_int, false).map(|_| 0),
        libc::F_TEST => match f.posix_test(s, e, libc::F_WRLCK as c_int) {
            None => Ok(0),
            Some(_) => Err(libc::EACCES),
        },
        _ => Err(libc::EINVAL),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => ret(do_lockf(&f, cmd, len), -1),
        None => real::lockf()(fd, cmd, len),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: Off) -> c_int {
    match file_of(fd) {
        Some(f) => ret(do_lockf(&f, cmd, len), -1),
        None => real::lockf64()(fd, cmd, len),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: usize) -> c_int {
    if let Some(st) = state()
        && let Some(f) = st.file(fd)
    {
        let slot = &st.table().expect("private fd implies a table").slots[fd as usize];
        return match req {
            libc::FIOCLEX => {
                slot.cloexec.store(true, Ordering::Relaxed);
                0
            }
            libc::FIONCLEX => {
                slot.cloexec.store(false, Ordering::Relaxed);
                0
            }
            libc::FIONREAD => {
                let left = f.stat().size.saturating_sub(f.position());
                *(arg as *mut c_int) = left.min(c_int::MAX as u64) as c_int;
                0
            }
            _ => {
                set_errno(libc::ENOTTY);
                -1
            }
        };
    }
    real::ioctl()(fd, req, arg)
}

/// mmap of a private file. MAP_PRIVATE is served with anonymous memory filled from the file
/// (a copy-on-write mapping sees the file as of the mmap call; POSIX leaves it unspecified
/// whether later writes to the file show through); pages past the end of the file read as
/// zeros instead of raising SIGBUS. MAP_SHARED would need the pool's blocks at page-aligned,
/// contiguous addresses and kernel-visible coherence with write(): ENODEV, as in the thesis.
unsafe fn mmap_private(
    f: &OpenFile,
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    off: Off,
    kernel: unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, c_int, Off) -> *mut c_void,
) -> *mut c_void {
    let fail = |e: c_int| {
        set_errno(e);
        libc::MAP_FAILED
    };
    if flags & libc::MAP_TYPE != libc::MAP_PRIVATE {
        return fail(libc::ENODEV);
    }
    let page = 4096;
    if len == 0 || off < 0 || off % page != 0 {
        return fail(libc::EINVAL);
    }
    if f.flags() & libc::O_ACCMODE == libc::O_WRONLY || f.is_dir() {
        return fail(libc::EACCES);
    }
    let anon = (flags & !libc::MAP_TYPE) | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    let m = kernel(addr, len, libc::PROT_READ | libc::PROT_WRITE, anon, -1, 0);
    if m == libc::MAP_FAILED {
        return m;
    }
    let dst = std::slice::from_raw_parts_mut(m as *mut u8, len);
    let mut done = 0;
    while done < len {
        match f.pread(&mut dst[done..], off as u64 + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) => {
                libc::munmap(m, len);
                return fail(e);
            }
        }
    }
    if prot != libc::PROT_READ | libc::PROT_WRITE && libc::mprotect(m, len, prot) != 0 {
        let e = errno();
        libc::munmap(m, len);
        return fail(e);
    }
    m
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: Off,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0
        && let Some(f) = file_of(fd)
    {
        let _g = crate::state::Guard::enter();
        return mmap_private(&f, addr, len, prot, flags, off, real::mmap());
    }
    real::mmap()(addr, len, prot, flags, fd, off)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: Off,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0
        && let Some(f) = file_of(fd)
    {
        let _g = crate::state::Guard::enter();
        return mmap_private(&f, addr, len, prot, flags, off, real::mmap64());
    }
    real::mmap64()(addr, len, prot, flags, fd, off)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn copy_file_range(
    fin: c_int,
    oin: *mut i64,
    fout: c_int,
    oout: *mut i64,
    len: usize,
    flags: c_uint,
) -> isize {
    if let Some(st) = state()
        && (st.is_private_fd(fin) || st.is_private_fd(fout))
    {
        // Callers (cp, …) fall back to read/write on EXDEV.
        set_errno(libc::EXDEV);
        return -1;
    }
    real::copy_file_range()(fin, oin, fout, oout, len, flags)
}

/// sendfile with a private end: copied through a buffer with our read/write.
unsafe fn sendfile_copy(out: c_int, input: c_int, off: *mut Off, count: usize) -> isize {
    let mut b = vec![0u8; count.min(1 << 20)];
    let n = if off.is_null() {
        read(input, b.as_mut_ptr() as *mut c_void, b.len())
    } else {
        pread(input, b.as_mut_ptr() as *mut c_void, b.len(), *off)
    };
    if n <= 0 {
        return n;
    }
    let w = write(out, b.as_ptr() as *const c_void, n as usize);
    if w > 0 && !off.is_null() {
        *off += w as Off;
    }
    w
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile(out: c_int, input: c_int, off: *mut Off, count: usize) -> isize {
    if let Some(st) = state()
        && (st.is_private_fd(input) || st.is_private_fd(out))
    {
        return sendfile_copy(out, input, off, count);
    }
    real::sendfile()(out, input, off, count)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    input: c_int,
    off: *mut Off,
    count: usize,
) -> isize {
    if let Some(st) = state()
        && (st.is_private_fd(input) || st.is_private_fd(out))
    {
        return sendfile_copy(out, input, off, count);
    }
    real::sendfile64()(out, input, off, count)
}

// ---- stat ---------------------------------------------------------------------------------------

pub(crate) unsafe fn fill_stat(s: &Stat, out: *mut libc::stat) {
    let mut st: libc::stat = std::mem::zeroed();
    st.st_dev = PRIVATE_DEV;
    st.st_ino = s.ino;
    st.st_mode = s.mode;
    st.st_nlink = s.nlink as _;
    st.st_uid = s.uid;
    st.st_gid = s.gid;
    st.st_size = s.size as i64;
    st.st_blksize = s.blksize as _;
    st.st_blocks = s.blocks as i64;
    st.st_atime = s.atime_ns.div_euclid(1_000_000_000);
    st.st_atime_nsec = s.atime_ns.rem_euclid(1_000_000_000);
    st.st_mtime = s.mtime_ns.div_euclid(1_000_000_000);
    st.st_mtime_nsec = s.mtime_ns.rem_euclid(1_000_000_000);
    st.st_ctime = s.ctime_ns.div_euclid(1_000_000_000);
    st.st_ctime_nsec = s.ctime_ns.rem_euclid(1_000_000_000);
    out.write(st);
}

pub(crate) unsafe fn fill_statx(s: &Stat, out: *mut libc::statx) {
    let mut x: libc::statx = std::mem::zeroed();
    x.stx_mask = libc::STATX_BASIC_STATS;
    x.stx_blksize = s.blksize as u32;
    x.stx_nlink = s.nlink;
    x.stx_uid = s.uid;
    x.stx_gid = s.gid;
    x.stx_mode = s.mode as u16;
    x.stx_ino = s.ino;
    x.stx_size = s.size;
    x.stx_blocks = s.blocks;
    let ts = |ns: i64| {
        let mut t: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        t.tv_sec = ns.div_euclid(1_000_000_000);
        t.tv_nsec = ns.rem_euclid(1_000_000_000) as u32;
        t
    };
    x.stx_atime = ts(s.atime_ns);
    x.stx_mtime = ts(s.mtime_ns);
    x.stx_ctime = ts(s.ctime_ns);
    x.stx_dev_major = (PRIVATE_DEV >> 8) as u32;
    x.stx_dev_minor = (PRIVATE_DEV & 0xff) as u32;
    out.write(x);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat(fd: c_int, out: *mut libc::stat) -> c_int {
    match file_of(fd) {
        Some(f) => {
            fill_stat(&f.stat(), out);
            0
        }
        None => real::fstat()(fd, out),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fstat64(fd: c_int, out: *mut libc::stat) -> c_int {
    match file_of(fd) {
        Some(f) => {
            fill_stat(&f.stat(), out);
            0
        }
        None => real::fstat64()(fd, out),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat(ver: c_int, fd: c_int, out: *mut libc::stat) -> c_int {
    match file_of(fd) {
        Some(f) => {
            fill_stat(&f.stat(), out);
            0
        }
        None => real::__fxstat()(ver, fd, out),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn __fxstat64(ver: c_int, fd: c_int, out: *mut libc::stat) -> c_int {
    match file_of(fd) {
        Some(f) => {
            fill_stat(&f.stat(), out);
            0
        }
        None => real::__fxstat64()(ver, fd, out),
    }
}

pub(crate) fn statfs_of(fs: &kaiso_libfs::Fs) -> (libc::statfs, libc::statvfs) {
    let s = fs.statfs();
    let mut a: libc::statfs = unsafe { std::mem::zeroed() };
    a.f_type = 0x6b61_6973;
    a.f_bsize = s.block_size as _;
    a.f_frsize = s.block_size as _;
    a.f_blocks = s.blocks;
    a.f_bfree = s.blocks_free;
    a.f_bavail = s.blocks_free;
    a.f_files = s.inodes;
    a.f_ffree = s.inodes_free;
    a.f_namelen = s.name_max as _;
    let mut v: libc::statvfs = unsafe { std::mem::zeroed() };
    v.f_bsize = s.block_size;
    v.f_frsize = s.block_size;
    v.f_blocks = s.blocks;
    v.f_bfree = s.blocks_free;
    v.f_bavail = s.blocks_free;
    v.f_files = s.inodes;
    v.f_ffree = s.inodes_free;
    v.f_favail = s.inodes_free;
    v.f_fsid = PRIVATE_DEV;
    v.f_namemax = s.name_max;
    (a, v)
}

macro_rules! fstatfs_like {
    ($name:ident, $ty:ty, $idx:tt) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(fd: c_int, out: *mut $ty) -> c_int {
            match file_of(fd) {
                Some(f) => {
                    out.write(statfs_of(&f.fs()).$idx);
                    0
                }
                None => real::$name()(fd, out),
            }
        }
    };
}
fstatfs_like!(fstatfs, libc::statfs, 0);
fstatfs_like!(fstatfs64, libc::statfs, 0);
fstatfs_like!(fstatvfs, libc::statvfs, 1);
fstatfs_like!(fstatvfs64, libc::statvfs, 1);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: Mode) -> c_int {
    match file_of(fd) {
        Some(f) => {
            f.chmod(mode);
            0
        }
        None => real::fchmod()(fd, mode),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    match file_of(fd) {
        Some(f) => {
            f.chown(
                (uid != u32::MAX).then_some(uid),
                (gid != u32::MAX).then_some(gid),
            );
            0
        }
        None => real::fchown()(fd, uid, gid),
    }
}

/// Converts a timespec pair (UTIME_NOW/UTIME_OMIT aware) into optional nanosecond times.
pub(crate) unsafe fn times_of(ts: *const libc::timespec) -> (Option<i64>, Option<i64>) {
    let now = {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut t);
        t.tv_sec * 1_000_000_000 + t.tv_nsec
    };
    if ts.is_null() {
        return (Some(now), Some(now));
    }
    let one = |t: &libc::timespec| match t.tv_nsec {
        libc::UTIME_OMIT => None,
        libc::UTIME_NOW => Some(now),
        n => Some(t.tv_sec * 1_000_000_000 + n),
    };
    (one(&*ts), one(&*ts.add(1)))
}

pub(crate) unsafe fn timevals(tv: *const libc::timeval) -> Option<[libc::timespec; 2]> {
    if tv.is_null() {
        return None;
    }
    let c = |t: &libc::timeval| libc::timespec {
        tv_sec: t.tv_sec,
        tv_nsec: t.tv_usec * 1000,
    };
    Some([c(&*tv), c(&*tv.add(1))])
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimens(fd: c_int, ts: *const libc::timespec) -> c_int {
    match file_of(fd) {
        Some(f) => {
            let (a, m) = times_of(ts);
            f.utimens(a, m);
            0
        }
        None => real::futimens()(fd, ts),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn futimes(fd: c_int, tv: *const libc::timeval) -> c_int {
    match file_of(fd) {
        Some(f) => {
            let t = timevals(tv);
            let (a, m) = times_of(t.as_ref().map_or(std::ptr::null(), |x| x.as_ptr()));
            f.utimens(a, m);
            0
        }
        None => real::futimes()(fd, tv),
    }
}
