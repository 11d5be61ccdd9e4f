//! posix_spawn and posix_spawnp, with the same hand-over as exec (proc.rs).
//!
//! The child's file actions run in the kernel-facing child before it executes, so they can
//! move private descriptors only as numbers: the library records the actions a program adds
//! (keyed by the address of its `posix_spawn_file_actions_t`) and replays their effect on the
//! private descriptors to know which numbers, with which files, the new program starts with.
//! `adddup2` of a private descriptor, `addclose`, `addclosefrom_np` and kernel `addopen`s are
//! followed; `addopen` of a private path, and `addchdir_np`/`addfchdir_np` into the private
//! directory, cannot be carried out by the child's kernel and make posix_spawn fail with
//! ENOTSUP (and one line on stderr) instead of starting a program on the wrong file.

use crate::proc::{handover_env, keep_open, private_fds, private_image_at, undo, with_env};
use crate::real::{self, Actions, Attr, Mode};
use crate::state::{Guard, Route, State, route, state};
use kaiso_libfs::SpinLock;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString, c_char, c_int, c_void};

type P = *const c_char;

#[derive(Clone)]
enum Act {
    Dup2(c_int, c_int),
    Close(c_int),
    CloseFrom(c_int),
    /// A kernel open onto this number.
    Open(c_int),
    /// What the child's kernel cannot do: the reason.
    Unsupported(&'static str),
    /// The child's current directory moves to a kernel directory.
    KernelChdir,
}

/// Recorded actions by file-actions address.
static ACTIONS: SpinLock<Option<HashMap<usize, Vec<Act>>>> = SpinLock::new(None);

fn record(fa: Actions, act: Act) {
    let mut t = ACTIONS.lock();
    t.get_or_insert_with(HashMap::new)
        .entry(fa as usize)
        .or_default()
        .push(act);
}

/// Records the action `act` describes once the real call `r` succeeded (with the library on).
fn recorded_after(fa: Actions, r: c_int, act: impl FnOnce(&State) -> Act) -> c_int {
    if r == 0
        && let Some(st) = state()
    {
        record(fa, act(st));
    }
    r
}

fn forget(fa: Actions) {
    if let Some(t) = ACTIONS.lock().as_mut() {
        t.remove(&(fa as usize));
    }
}

fn is_private(st: &State, path: P) -> bool {
    matches!(route(st, libc::AT_FDCWD, path), Route::Private(_))
}

fn recorded(fa: *const c_void) -> Vec<Act> {
    if fa.is_null() {
        return Vec::new();
    }
    ACTIONS
        .lock()
        .as_ref()
        .and_then(|t| t.get(&(fa as usize)).cloned())
        .unwrap_or_default()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_init(fa: Actions) -> c_int {
    forget(fa);
    real::posix_spawn_file_actions_init()(fa)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_destroy(fa: Actions) -> c_int {
    forget(fa);
    real::posix_spawn_file_actions_destroy()(fa)
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: Actions,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    let r = real::posix_spawn_file_actions_adddup2()(fa, fd, newfd);
    recorded_after(fa, r, |_| Act::Dup2(fd, newfd))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addclose(fa: Actions, fd: c_int) -> c_int {
    let r = real::posix_spawn_file_actions_addclose()(fa, fd);
    recorded_after(fa, r, |_| Act::Close(fd))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addclosefrom_np(
    fa: Actions,
    from: c_int,
) -> c_int {
    let r = real::posix_spawn_file_actions_addclosefrom_np()(fa, from);
    recorded_after(fa, r, |_| Act::CloseFrom(from))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addopen(
    fa: Actions,
    fd: c_int,
    path: P,
    oflag: c_int,
    mode: Mode,
) -> c_int {
    let r = real::posix_spawn_file_actions_addopen()(fa, fd, path, oflag, mode);
    recorded_after(fa, r, |st| {
        if is_private(st, path) {
            Act::Unsupported("posix_spawn_file_actions_addopen of a private path")
        } else {
            Act::Open(fd)
        }
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addchdir_np(fa: Actions, path: P) -> c_int {
    let r = real::posix_spawn_file_actions_addchdir_np()(fa, path);
    recorded_after(fa, r, |st| {
        if is_private(st, path) {
            Act::Unsupported("posix_spawn_file_actions_addchdir_np into the private directory")
        } else {
            Act::KernelChdir
        }
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_addfchdir_np(fa: Actions, fd: c_int) -> c_int {
    let r = real::posix_spawn_file_actions_addfchdir_np()(fa, fd);
    recorded_after(fa, r, |st| {
        if st.is_private_fd(fd) {
            Act::Unsupported("posix_spawn_file_actions_addfchdir_np to a private directory")
        } else {
            Act::KernelChdir
        }
    })
}

/// The private descriptors the new program starts with, after the file actions: hand-over
/// items and the parent's numbers whose placeholders must stay open across exec.
fn child_fds(st: &State, acts: &[Act]) -> Result<(Vec<String>, Vec<c_int>, bool), &'static str> {
    // number -> (inode:offset:flags, close-on-exec, parent number to keep open)
    let mut m: BTreeMap<c_int, (String, bool, c_int)> = BTreeMap::new();
    for (fd, item, cloexec) in private_fds(st) {
        let rest = item
            .split_once(':')
            .map(|x| x.1.to_string())
            .unwrap_or_default();
        m.insert(fd, (rest, cloexec, fd));
    }
    let mut kernel_cwd = false;
    for a in acts {
        match *a {
            Act::Dup2(from, to) => {
                if let Some((rest, _, src)) = m.get(&from).cloned() {
                    // dup2 onto itself clears close-on-exec (glibc >= 2.29), like any dup2.
                    m.insert(to, (rest, false, src));
                } else {
                    m.remove(&to);
                }
            }
            Act::Close(fd) | Act::Open(fd) => {
                m.remove(&fd);
            }
            Act::CloseFrom(from) => m.retain(|&fd, _| fd < from),
            Act::Unsupported(why) => return Err(why),
            Act::KernelChdir => kernel_cwd = true,
        }
    }
    let mut items = Vec::new();
    let mut keep = Vec::new();
    for (fd, (rest, cloexec, src)) in m {
        if !cloexec {
            items.push(format!("{fd}:{rest}"));
            // The child's dup2 copies the placeholder before exec; only a number that is
            // itself inherited needs its placeholder kept open.
            if fd == src {
                keep.push(fd);
            }
        }
    }
    Ok((items, keep, kernel_cwd))
}

unsafe fn spawn(
    pid: *mut libc::pid_t,
    path: P,
    fa: *const c_void,
    attr: Attr,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
    search: bool,
) -> c_int {
    let call = |p: P, env: *const *mut c_char| {
        if search {
            real::posix_spawnp()(pid, p, fa, attr, argv, env)
        } else {
            real::posix_spawn()(pid, p, fa, attr, argv, env)
        }
    };
    let Some(st) = state() else {
        return call(path, envp);
    };
    let (items, keep, kernel_cwd) = match child_fds(st, &recorded(fa)) {
        Ok(x) => x,
        Err(why) => {
            let _g = Guard::enter();
            eprintln!(
                "kaiso-preload: {why} is not supported (the child's kernel cannot reach the pool)"
            );
            return libc::ENOTSUP;
        }
    };
    let cwd = if kernel_cwd {
        None
    } else {
        st.vcwd.lock().clone()
    };
    let extra = handover_env(&items, cwd.as_deref());
    let mut hold = Vec::new();
    let env = with_env(envp as *const P, &extra, &mut hold);
    // A private program runs from a memfd copy, reached through /proc/self/fd.
    let mut image = None;
    let mut target: Option<CString> = None;
    let name = if path.is_null() {
        &b""[..]
    } else {
        CStr::from_ptr(path).to_bytes()
    };
    if !search || name.contains(&b'/') {
        match route(st, libc::AT_FDCWD, path) {
            Route::Private(abs) => match private_image_at(st, &abs) {
                Ok(fd) => {
                    image = Some(fd);
                    target = CString::new(format!("/proc/self/fd/{fd}")).ok();
                }
                Err(e) => return e,
            },
            Route::KernelPath(p) => target = Some(p),
            Route::Kernel => {}
        }
    }
    let kept = keep_open(&keep);
    let r = call(
        target.as_ref().map_or(path, |c| c.as_ptr()),
        env.as_ptr() as *const *mut c_char,
    );
    undo(&kept);
    if let Some(fd) = image {
        real::close()(fd);
    }
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: P,
    fa: *const c_void,
    attr: Attr,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    spawn(pid, path, fa, attr, argv, envp, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: P,
    fa: *const c_void,
    attr: Attr,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    spawn(pid, file, fa, attr, argv, envp, true)
}
