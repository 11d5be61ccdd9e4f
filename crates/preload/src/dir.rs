//! Directory streams on private directories: our own DIR objects, told apart from libc's by
//! a registry of their addresses. Entries come from the pool's per-directory readdir cache.

use crate::io::priv_open;
use crate::real;
use crate::run;
use crate::state::{Route, route, set_errno, state};
use kaiso_libfs::DirEntry;
use std::ffi::{c_char, c_int, c_long};
use std::sync::Arc;

type P = *const c_char;

struct PrivDir {
    fd: c_int,
    entries: Arc<Vec<DirEntry>>,
    ino: u64,
    parent: u64,
    /// 0 = ".", 1 = "..", n+2 = entries[n].
    pos: usize,
    ent: libc::dirent64,
}

fn registered(d: *mut libc::DIR) -> Option<&'static mut PrivDir> {
    let st = state()?;
    if d.is_null() || !st.dirs.lock().contains_key(&(d as usize)) {
        return None;
    }
    Some(unsafe { &mut *(d as *mut PrivDir) })
}

/// Wraps an open private directory descriptor (owned by the stream from now on).
fn new_stream(fd: c_int) -> *mut libc::DIR {
    let Some(st) = state() else {
        return std::ptr::null_mut();
    };
    let Some(f) = st.file(fd) else {
        set_errno(libc::EBADF);
        return std::ptr::null_mut();
    };
    let entries = match f.read_dir() {
        Ok(e) => e,
        Err(e) => {
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    let fs = f.fs();
    let d = Box::new(PrivDir {
        fd,
        entries,
        ino: f.ino(),
        parent: fs.parent_of(f.ino()),
        pos: 0,
        ent: unsafe { std::mem::zeroed() },
    });
    let p = Box::into_raw(d) as usize;
    st.dirs.lock().insert(p, ());
    p as *mut libc::DIR
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn opendir(path: P) -> *mut libc::DIR {
    let Some(st) = state() else {
        return real::opendir()(path);
    };
    let abs = match route(st, libc::AT_FDCWD, path) {
        Route::Kernel => return real::opendir()(path),
        Route::KernelPath(p) => return real::opendir()(p.as_ptr()),
        Route::Private(abs) => abs,
    };
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
    let fd = run(
        st,
        -1,
        |fs| priv_open(st, fs, &abs, flags, 0),
        |p| real::open()(p.as_ptr(), flags, 0),
    );
    if fd < 0 {
        return std::ptr::null_mut();
    }
    if !st.is_private_fd(fd) {
        // A symlink led outside: hand libc the descriptor.
        return real::fdopendir()(fd);
    }
    let d = new_stream(fd);
    if d.is_null() {
        crate::io::close(fd);
    }
    d
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fdopendir(fd: c_int) -> *mut libc::DIR {
    match state() {
        Some(st) if st.file(fd).is_some() => new_stream(fd),
        _ => real::fdopendir()(fd),
    }
}

/// Fills the stream's dirent with the next entry.
fn next(d: &mut PrivDir) -> Option<*mut libc::dirent64> {
    let (ino, kind, name): (u64, u8, &[u8]) = match d.pos {
        0 => (d.ino, libc::DT_DIR, b"."),
        1 => (d.parent, libc::DT_DIR, b".."),
        n => {
            let e = d.entries.get(n - 2)?;
            (e.ino, e.kind, &e.name)
        }
    };
    d.pos += 1;
    let ent = &mut d.ent;
    ent.d_ino = ino;
    ent.d_off = d.pos as i64;
    ent.d_type = kind;
    let n = name.len().min(255);
    for (i, &b) in name[..n].iter().enumerate() {
        ent.d_name[i] = b as c_char;
    }
    ent.d_name[n] = 0;
    ent.d_reclen = std::mem::size_of::<libc::dirent64>() as u16;
    Some(ent as *mut libc::dirent64)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir64(dir: *mut libc::DIR) -> *mut libc::dirent64 {
    match registered(dir) {
        Some(d) => next(d).unwrap_or(std::ptr::null_mut()),
        None => real::readdir64()(dir),
    }
}
/// On 64-bit glibc, struct dirent and struct dirent64 have the same layout.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir(dir: *mut libc::DIR) -> *mut libc::dirent {
    match registered(dir) {
        Some(d) => next(d).map_or(std::ptr::null_mut(), |p| p as *mut libc::dirent),
        None => real::readdir()(dir),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir64_r(
    dir: *mut libc::DIR,
    entry: *mut libc::dirent64,
    result: *mut *mut libc::dirent64,
) -> c_int {
    match registered(dir) {
        Some(d) => {
            match next(d) {
                Some(p) => {
                    std::ptr::copy_nonoverlapping(p, entry, 1);
                    *result = entry;
                }
                None => *result = std::ptr::null_mut(),
            }
            0
        }
        None => real::readdir64_r()(dir, entry, result),
    }
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn readdir_r(
    dir: *mut libc::DIR,
    entry: *mut libc::dirent,
    result: *mut *mut libc::dirent,
) -> c_int {
    match registered(dir) {
        Some(_) => readdir64_r(
            dir,
            entry as *mut libc::dirent64,
            result as *mut *mut libc::dirent64,
        ),
        None => real::readdir_r()(dir, entry, result),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn closedir(dir: *mut libc::DIR) -> c_int {
    match registered(dir) {
        Some(d) => {
            if let Some(st) = state() {
                st.dirs.lock().remove(&(dir as usize));
            }
            let fd = d.fd;
            drop(Box::from_raw(d as *mut PrivDir));
            crate::io::close(fd)
        }
        None => real::closedir()(dir),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn dirfd(dir: *mut libc::DIR) -> c_int {
    match registered(dir) {
        Some(d) => d.fd,
        None => real::dirfd()(dir),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rewinddir(dir: *mut libc::DIR) {
    match registered(dir) {
        Some(d) => {
            d.pos = 0;
            if let Some(f) = state().and_then(|s| s.file(d.fd))
                && let Ok(e) = f.read_dir()
            {
                d.entries = e;
            }
        }
        None => real::rewinddir()(dir),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn telldir(dir: *mut libc::DIR) -> c_long {
    match registered(dir) {
        Some(d) => d.pos as c_long,
        None => real::telldir()(dir),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn seekdir(dir: *mut libc::DIR, loc: c_long) {
    match registered(dir) {
        Some(d) => d.pos = loc.max(0) as usize,
        None => real::seekdir()(dir, loc),
    }
}
