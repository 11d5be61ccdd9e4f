//! stdin/stdout/stderr on private files. A program whose descriptor 0, 1 or 2 becomes a
//! private file (shell redirection `cmd > private/file`, a builtin's `echo > private/file`,
//! or a descriptor inherited across exec) would otherwise have glibc write its stdio buffers
//! to the kernel descriptor behind our back. glibc's standard streams are ordinary variables,
//! so while the descriptor is private the variable points at a cookie FILE over it, and the
//! original FILE comes back when the descriptor stops being private.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

unsafe extern "C" {
    static mut stdin: *mut libc::FILE;
    static mut stdout: *mut libc::FILE;
    static mut stderr: *mut libc::FILE;
}

static SAVED: [AtomicUsize; 3] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];

unsafe fn var(fd: c_int) -> *mut *mut libc::FILE {
    match fd {
        0 => &raw mut stdin,
        1 => &raw mut stdout,
        _ => &raw mut stderr,
    }
}

/// Descriptor `fd` (0..=2) has just become private.
pub unsafe fn attach(fd: c_int) {
    if !(0..=2).contains(&fd) || SAVED[fd as usize].load(Ordering::Acquire) != 0 {
        return;
    }
    let v = var(fd);
    let orig = *v;
    if !orig.is_null() {
        libc::fflush(orig);
    }
    let mode = if fd == 0 { c"r" } else { c"w" };
    let c = crate::stdio::cookie_file(fd, mode.as_ptr());
    if c.is_null() {
        return;
    }
    if fd == 2 {
        libc::setvbuf(c, std::ptr::null_mut(), libc::_IONBF, 0);
    }
    SAVED[fd as usize].store(orig as usize, Ordering::Release);
    *v = c;
}

/// Descriptor `fd` (0..=2) is about to stop being private.
pub unsafe fn detach(fd: c_int) {
    if !(0..=2).contains(&fd) {
        return;
    }
    let orig = SAVED[fd as usize].swap(0, Ordering::AcqRel);
    if orig == 0 {
        return;
    }
    let v = var(fd);
    let c = *v;
    libc::fflush(c);
    // The cookie must not close the descriptor: it is being handed on, not closed.
    crate::stdio::disown(c);
    libc::fclose(c);
    *v = orig as *mut libc::FILE;
}
