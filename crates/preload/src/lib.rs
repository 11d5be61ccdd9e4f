//! LD_PRELOAD library that routes a private directory's file calls to the kaiso-libfs pool.
//!
//! Every exported function has the name and C signature of a libc entry point. It decides
//! whether its path or descriptor argument belongs to the private directory
//! (`KAISO_PRIVATE_DIR`, pool in `KAISO_POOL`): if so the call is served from the pool with
//! loads and stores, otherwise it goes to the next definition (libc) untouched. Calls made
//! by the library itself are passed through by a thread-local guard. Variadic entry points
//! (open, openat, fcntl, ioctl) are declared with their optional argument as a fixed one,
//! which the x86-64 and AArch64 Linux calling conventions make equivalent.
#![allow(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)]

mod dir;
mod io;
mod path;
mod proc;
mod real;
mod spawn;
mod state;
mod stdio;
mod stdstreams;
mod wait;

use state::{Fail, Guard, Res, State, set_errno};
use std::ffi::{CStr, c_int};

#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = {
    extern "C" fn init() {
        state::init();
        proc::capture_settings();
        proc::init_inherited();
    }
    init
};

/// Runs a private operation on the pool with the guard set and maps its result: an errno
/// becomes `err` with errno set; a resolution that left the private tree is redone by
/// `outside` in the kernel with the absolute path.
pub(crate) fn run<T>(
    st: &State,
    err: T,
    f: impl FnOnce(&kaiso_libfs::Fs) -> Res<T>,
    outside: impl FnOnce(&CStr) -> T,
) -> T {
    let fs = match st.fs() {
        Ok(fs) => fs,
        Err(e) => {
            set_errno(e);
            return err;
        }
    };
    let r = {
        let _g = Guard::enter();
        f(fs)
    };
    match r {
        Ok(v) => v,
        Err(Fail::Errno(e)) => {
            set_errno(e);
            err
        }
        Err(Fail::Outside(p)) => outside(&p),
    }
}

/// Maps an fd-level result.
pub(crate) fn ret<T>(r: Result<T, c_int>, err: T) -> T {
    match r {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            err
        }
    }
}
