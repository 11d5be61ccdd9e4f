//! fork and exec.
//!
//! fork: the owner lock stays with the parent; the child forgets the parent's pool state
//! and opens the pool itself when it needs it, which succeeds when the parent lends the pool
//! while waiting for the child (wait.rs) or has exited; otherwise the child gets EBUSY and a
//! message. Threads share a private directory; processes take turns.
//!
//! exec: the pool's descriptor is close-on-exec, so exec releases the owner lock and the new
//! program opens the pool again. Private descriptors without FD_CLOEXEC are handed over in
//! KAISO_INHERIT (fd:inode:offset:flags,…) with their numbers kept open by placeholders; a
//! private current directory is handed over in KAISO_CWD.

use crate::real;
use crate::state::{State, state};
use kaiso_libfs::Fs;
use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::atomic::Ordering;

type P = *const c_char;

/// Re-creates descriptors handed over by the program that exec'ed us.
pub fn adopt_inherited(st: &State, fs: &Fs) {
    let Ok(list) = std::env::var("KAISO_INHERIT") else {
        return;
    };
    for item in list.split(',').filter(|s| !s.is_empty()) {
        let v: Vec<i64> = item.split(':').filter_map(|x| x.parse().ok()).collect();
        let [fd, ino, pos, flags] = v[..] else {
            continue;
        };
        if let Ok(f) = fs.open_ino(ino as u64, flags as c_int) {
            let _ = f.seek(pos, libc::SEEK_SET);
            let _ = st.install_at(fd as c_int, f, false);
        }
    }
}

/// Runs from the constructor: a program exec'ed with inherited private descriptors opens the pool
/// at once so the descriptors exist before main.
pub fn init_inherited() {
    // The current directory is set even if the pool turns out to be unavailable, so that
    // relative paths fail clearly instead of silently naming the kernel's directory.
    if let Some(cwd) = std::env::var_os("KAISO_CWD")
        && let Some(st) = state()
    {
        use std::os::unix::ffi::OsStrExt;
        *st.vcwd.lock() = Some(cwd.as_bytes().to_vec());
    }
    // Only inherited descriptors need the pool before main. A private current directory
    // alone does not: opening eagerly made every process started in it (the `head` and
    // `wc` of a pipeline) take the pool and shut out the sibling that really uses it.
    if std::env::var_os("KAISO_INHERIT").is_some()
        && let Some(st) = state()
    {
        let _ = st.fs();
    }
}

/// The environment entries to hand over, with the placeholders of inheritable private
/// descriptors made to survive exec. Returns the descriptors to restore if exec fails.
fn prepare(st: &State) -> (Vec<CString>, Vec<c_int>) {
    let mut env = Vec::new();
    let mut kept = Vec::new();
    let mut items = Vec::new();
    let slots = match st.table() {
        Some(t) => &t.slots[..],
        None => &[],
    };
    for (fd, s) in slots.iter().enumerate() {
        if !s.private.load(Ordering::Acquire) || s.cloexec.load(Ordering::Relaxed) {
            continue;
        }
        if let Some(f) = s.file.lock().clone() {
            items.push(format!("{fd}:{}:{}:{}", f.ino(), f.position(), f.flags()));
            unsafe { real::fcntl()(fd as c_int, libc::F_SETFD, 0) };
            kept.push(fd as c_int);
        }
    }
    if !items.is_empty() {
        env.push(CString::new(format!("KAISO_INHERIT={}", items.join(","))).unwrap_or_default());
    }
    if let Some(c) = st.vcwd.lock().as_ref() {
        let mut s = b"KAISO_CWD=".to_vec();
        s.extend_from_slice(c);
        env.push(CString::new(s).unwrap_or_default());
    }
    (env, kept)
}

fn undo(kept: &[c_int]) {
    for &fd in kept {
        unsafe { real::fcntl()(fd, libc::F_SETFD, libc::FD_CLOEXEC as usize) };
    }
}

/// A copy of `envp` without our hand-over variables, plus `extra`.
unsafe fn with_env(envp: *const *const c_char, extra: &[CString]) -> Vec<*const c_char> {
    let mut out = Vec::new();
    if !envp.is_null() {
        let mut p = envp;
        while !(*p).is_null() {
            let e = CStr::from_ptr(*p).to_bytes();
            if !e.starts_with(b"KAISO_INHERIT=") && !e.starts_with(b"KAISO_CWD=") {
                out.push(*p);
            }
            p = p.add(1);
        }
    }
    out.extend(extra.iter().map(|c| c.as_ptr()));
    out.push(std::ptr::null());
    out
}

unsafe extern "C" {
    static environ: *const *const c_char;
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: P, argv: *const P, envp: *const P) -> c_int {
    let Some(st) = state() else {
        return real::execve()(path, argv, envp);
    };
    let (extra, kept) = prepare(st);
    let env = with_env(envp, &extra);
    let r = real::execve()(path, argv, env.as_ptr());
    undo(&kept);
    r
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execv(path: P, argv: *const P) -> c_int {
    execve(path, argv, environ)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvpe(file: P, argv: *const P, envp: *const P) -> c_int {
    let Some(st) = state() else {
        return real::execvpe()(file, argv, envp);
    };
    let (extra, kept) = prepare(st);
    let env = with_env(envp, &extra);
    let r = real::execvpe()(file, argv, env.as_ptr());
    undo(&kept);
    r
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: P, argv: *const P) -> c_int {
    execvpe(file, argv, environ)
}
