//! Lending the pool while waiting for a child. A single-threaded owner with no private file
//! open (a shell that ran `cd` into the private directory or tested a file there) releases the
//! owner lock for as long as it blocks in wait*, so the child it waits for can open the pool;
//! afterwards it takes the lock back and rebuilds its view of the pool, which the child may
//! have changed.

use crate::real;
use crate::state::{Guard, state};
use std::ffi::c_int;

fn single_threaded() -> bool {
    let _g = Guard::enter();
    // Field 20 of /proc/self/stat is the thread count; the command name (field 2) may hold
    // spaces, so count from the closing parenthesis.
    let Ok(s) = std::fs::read_to_string("/proc/self/stat") else {
        return false;
    };
    let Some(rest) = s.rfind(')').map(|i| &s[i + 1..]) else {
        return false;
    };
    rest.split_whitespace().nth(17) == Some("1")
}

/// Runs a blocking wait with the pool lent out when that is safe.
fn lend_while(blocking: bool, wait: impl FnOnce() -> c_int) -> c_int {
    let Some(st) = state() else { return wait() };
    let Some(fs) = st.open_fs() else {
        return wait();
    };
    if !blocking || !single_threaded() || fs.suspend().is_err() {
        return wait();
    }
    let r = wait();
    let saved = unsafe { *libc::__errno_location() };
    let resumed = {
        let _g = Guard::enter();
        fs.resume(std::time::Duration::from_secs(10))
    };
    if let Err(e) = resumed {
        st.set_unavailable(format!(
            "private directory {} unavailable: {e}",
            String::from_utf8_lossy(&st.mount)
        ));
    }
    unsafe { *libc::__errno_location() = saved };
    r
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn waitpid(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
) -> libc::pid_t {
    lend_while(options & libc::WNOHANG == 0, || {
        real::waitpid()(pid, status, options)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wait(status: *mut c_int) -> libc::pid_t {
    lend_while(true, || real::wait()(status))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wait4(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
    ru: *mut libc::rusage,
) -> libc::pid_t {
    lend_while(options & libc::WNOHANG == 0, || {
        real::wait4()(pid, status, options, ru)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn waitid(
    idtype: libc::idtype_t,
    id: libc::id_t,
    info: *mut libc::siginfo_t,
    options: c_int,
) -> c_int {
    lend_while(options & libc::WNOHANG == 0, || {
        real::waitid()(idtype, id, info, options)
    })
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn wait3(
    status: *mut c_int,
    options: c_int,
    ru: *mut libc::rusage,
) -> libc::pid_t {
    lend_while(options & libc::WNOHANG == 0, || {
        real::wait3()(status, options, ru)
    })
}
