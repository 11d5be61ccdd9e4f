//! stdio on private files. glibc's FILE functions reach the kernel through internal calls
//! no preload library can interpose (why the thesis patched glibc); instead a private file's
//! FILE is built with fopencookie, so every fread/fwrite/fprintf/fgets/fseek on it calls back
//! into our read/write/lseek/close.

use crate::io::priv_open;
use crate::real;
use crate::run;
use crate::state::{Route, route, set_errno, state};
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

type P = *const c_char;

/// open(2) flags for an fopen mode string.
fn mode_flags(mode: &[u8]) -> Option<c_int> {
    let (first, rest) = mode.split_first()?;
    let plus = rest.iter().take_while(|&&c| c != b',').any(|&c| c == b'+');
    let mut f = match (first, plus) {
        (b'r', false) => libc::O_RDONLY,
        (b'r', true) => libc::O_RDWR,
        (b'w', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        (b'w', true) => libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
        (b'a', false) => libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        (b'a', true) => libc::O_RDWR | libc::O_CREAT | libc::O_APPEND,
        _ => return None,
    };
    for &c in rest.iter().take_while(|&&c| c != b',') {
        match c {
            b'x' => f |= libc::O_EXCL,
            b'e' => f |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    Some(f)
}

fn cookie_fd(cookie: *mut c_void) -> c_int {
    unsafe { &*(cookie as *const AtomicI32) }.load(Ordering::Relaxed)
}

unsafe extern "C" fn ck_read(cookie: *mut c_void, buf: *mut c_char, size: usize) -> isize {
    crate::io::read(cookie_fd(cookie), buf as *mut c_void, size)
}

unsafe extern "C" fn ck_write(cookie: *mut c_void, buf: *const c_char, size: usize) -> isize {
    let n = crate::io::write(cookie_fd(cookie), buf as *const c_void, size);
    n.max(0)
}

unsafe extern "C" fn ck_seek(cookie: *mut c_void, off: *mut i64, whence: c_int) -> c_int {
    let r = crate::io::lseek(cookie_fd(cookie), *off, whence);
    if r < 0 {
        return -1;
    }
    *off = r;
    0
}

unsafe extern "C" fn ck_close(cookie: *mut c_void) -> c_int {
    let cell = Arc::from_raw(cookie as *const AtomicI32);
    crate::io::close(cell.load(Ordering::Relaxed))
}

type ReadFn = unsafe extern "C" fn(*mut c_void, *mut c_char, usize) -> isize;
type WriteFn = unsafe extern "C" fn(*mut c_void, *const c_char, usize) -> isize;
type SeekFn = unsafe extern "C" fn(*mut c_void, *mut i64, c_int) -> c_int;
type CloseFn = unsafe extern "C" fn(*mut c_void) -> c_int;

/// glibc's cookie_io_functions_t.
#[repr(C)]
struct CookieIo {
    read: Option<ReadFn>,
    write: Option<WriteFn>,
    seek: Option<SeekFn>,
    close: Option<CloseFn>,
}

unsafe extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, funcs: CookieIo) -> *mut libc::FILE;
}

/// Detaches a cookie stream from its descriptor (closing the stream then closes nothing).
pub(crate) fn disown(f: *mut libc::FILE) {
    if let Some(st) = crate::state::state_raw()
        && let Some(c) = st.files.lock().remove(&(f as usize))
    {
        c.store(-1, Ordering::Relaxed);
    }
}

/// A FILE over descriptor `fd` (owned by the stream).
pub(crate) unsafe fn cookie_file(fd: c_int, mode: P) -> *mut libc::FILE {
    let Some(st) = crate::state::state_raw() else {
        return std::ptr::null_mut();
    };
    let cell = Arc::new(AtomicI32::new(fd));
    let funcs = CookieIo {
        read: Some(ck_read),
        write: Some(ck_write),
        seek: Some(ck_seek),
        close: Some(ck_close),
    };
    let raw = Arc::into_raw(cell.clone()) as *mut c_void;
    let f = fopencookie(raw, mode, funcs);
    if f.is_null() {
        drop(Arc::from_raw(raw as *const AtomicI32));
        return f;
    }
    st.files.lock().insert(f as usize, cell);
    f
}

unsafe fn open_stream(path: P, mode: P, kernel: impl Fn(P) -> *mut libc::FILE) -> *mut libc::FILE {
    let Some(st) = state() else {
        return kernel(path);
    };
    let abs = match route(st, libc::AT_FDCWD, path) {
        Route::Kernel => return kernel(path),
        Route::KernelPath(p) => return kernel(p.as_ptr()),
        Route::Private(abs) => abs,
    };
    let Some(flags) = (!mode.is_null())
        .then(|| mode_flags(CStr::from_ptr(mode).to_bytes()))
        .flatten()
    else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let fd = run(
        st,
        -1,
        |fs| priv_open(st, fs, &abs, flags, 0o666),
        |p| real::open()(p.as_ptr(), flags, 0o666),
    );
    if fd < 0 {
        return std::ptr::null_mut();
    }
    if !st.is_private_fd(fd) {
        return real::fdopen()(fd, mode);
    }
    let f = cookie_file(fd, mode);
    if f.is_null() {
        crate::io::close(fd);
    }
    f
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen(path: P, mode: P) -> *mut libc::FILE {
    open_stream(path, mode, |p| real::fopen()(p, mode))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fopen64(path: P, mode: P) -> *mut libc::FILE {
    open_stream(path, mode, |p| real::fopen64()(p, mode))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: P) -> *mut libc::FILE {
    match state().and_then(|s| s.file(fd)) {
        Some(f) => {
            if !mode.is_null() && CStr::from_ptr(mode).to_bytes().first() == Some(&b'a') {
                f.set_flags(f.flags() | libc::O_APPEND);
            }
            cookie_file(fd, mode)
        }
        None => real::fdopen()(fd, mode),
    }
}

/// freopen on one of our streams re-points its cookie; freopen of a libc stream onto a
/// private file cannot keep the FILE's identity and fails with ENOTSUP.
unsafe fn reopen(
    path: P,
    mode: P,
    stream: *mut libc::FILE,
    kernel: impl Fn() -> *mut libc::FILE,
) -> *mut libc::FILE {
    let Some(st) = state() else { return kernel() };
    let ours = st.files.lock().get(&(stream as usize)).cloned();
    let target = if path.is_null() {
        None
    } else {
        Some(route(st, libc::AT_FDCWD, path))
    };
    match (ours, target) {
        (None, None | Some(Route::Kernel) | Some(Route::KernelPath(_))) => kernel(),
        (None, Some(Route::Private(_))) => {
            set_errno(libc::ENOTSUP);
            std::ptr::null_mut()
        }
        (Some(cell), target) => {
            libc::fflush(stream);
            let Some(flags) = (!mode.is_null())
                .then(|| mode_flags(CStr::from_ptr(mode).to_bytes()))
                .flatten()
            else {
                set_errno(libc::EINVAL);
                return std::ptr::null_mut();
            };
            let fd = match target {
                None => return stream,
                Some(Route::Private(abs)) => run(
                    st,
                    -1,
                    |fs| priv_open(st, fs, &abs, flags, 0o666),
                    |p| real::open()(p.as_ptr(), flags, 0o666),
                ),
                Some(Route::KernelPath(p)) => real::open()(p.as_ptr(), flags, 0o666),
                Some(Route::Kernel) => real::open()(path, flags, 0o666),
            };
            if fd < 0 {
                return std::ptr::null_mut();
            }
            let old = cell.swap(fd, Ordering::Relaxed);
            crate::io::close(old);
            libc::clearerr(stream);
            stream
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn freopen(path: P, mode: P, stream: *mut libc::FILE) -> *mut libc::FILE {
    reopen(path, mode, stream, || real::freopen()(path, mode, stream))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn freopen64(path: P, mode: P, stream: *mut libc::FILE) -> *mut libc::FILE {
    reopen(path, mode, stream, || real::freopen64()(path, mode, stream))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fclose(stream: *mut libc::FILE) -> c_int {
    if let Some(st) = state() {
        st.files.lock().remove(&(stream as usize));
    }
    real::fclose()(stream)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno(stream: *mut libc::FILE) -> c_int {
    if let Some(st) = state()
        && let Some(c) = st.files.lock().get(&(stream as usize))
    {
        return c.load(Ordering::Relaxed);
    }
    real::fileno()(stream)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn fileno_unlocked(stream: *mut libc::FILE) -> c_int {
    if let Some(st) = state()
        && let Some(c) = st.files.lock().get(&(stream as usize))
    {
        return c.load(Ordering::Relaxed);
    }
    real::fileno_unlocked()(stream)
}

#[cfg(test)]
mod tests {
    use super::mode_flags;

    #[test]
    fn fopen_modes_map_to_open_flags() {
        assert_eq!(mode_flags(b"r"), Some(libc::O_RDONLY));
        assert_eq!(mode_flags(b"rb+"), Some(libc::O_RDWR));
        assert_eq!(
            mode_flags(b"we"),
            Some(libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC)
        );
        assert_eq!(
            mode_flags(b"a+x"),
            Some(libc::O_RDWR | libc::O_CREAT | libc::O_APPEND | libc::O_EXCL)
        );
        assert_eq!(mode_flags(b"q"), None);
    }
}
