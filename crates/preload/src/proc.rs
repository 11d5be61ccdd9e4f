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
//! private current directory is handed over in KAISO_CWD. Every exec entry point does this
//! (execve, execv, execvp, execvpe, execl, execlp, execle, fexecve; posix_spawn and
//! posix_spawnp in spawn.rs), and each puts the library's own settings (LD_PRELOAD and the
//! KAISO_* pool settings) back into an environment the program built without them. A program
//! that is itself a private file is run from a memfd copy.

use crate::real;
use crate::state::{Guard, Route, State, route, set_errno, state};
use kaiso_libfs::Fs;
use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::OnceLock;
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

/// The settings a new program needs to run on the private directory, as found when this
/// process started: LD_PRELOAD with this library, and the KAISO_* pool settings.
static SETTINGS: OnceLock<Settings> = OnceLock::new();

struct Settings {
    /// "NAME=value" entries.
    vars: Vec<CString>,
    /// The path of this library (for LD_PRELOAD).
    lib: Vec<u8>,
}

const SETTING_NAMES: [&str; 9] = [
    "LD_PRELOAD",
    "KAISO_PRIVATE_DIR",
    "KAISO_POOL",
    "KAISO_POOL_SIZE",
    "KAISO_BLOCK_SIZE",
    "KAISO_INODES",
    "KAISO_PERSIST",
    "KAISO_FDS",
    "KAISO_PREFAULT",
];

/// Records the settings (from the constructor, before the program can change its environment).
pub fn capture_settings() {
    use std::os::unix::ffi::OsStrExt;
    let lib = unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(capture_settings as *const libc::c_void, &mut info) != 0
            && !info.dli_fname.is_null()
        {
            CStr::from_ptr(info.dli_fname).to_bytes().to_vec()
        } else {
            Vec::new()
        }
    };
    let mut vars = Vec::new();
    for name in SETTING_NAMES {
        if let Some(v) = std::env::var_os(name) {
            let mut e = format!("{name}=").into_bytes();
            e.extend_from_slice(v.as_bytes());
            if let Ok(c) = CString::new(e) {
                vars.push(c);
            }
        }
    }
    let _ = SETTINGS.set(Settings { vars, lib });
}

/// One private descriptor as the new program must re-create it: "fd:inode:offset:flags".
fn handover_item(fd: c_int, f: &kaiso_libfs::OpenFile) -> String {
    format!("{fd}:{}:{}:{}", f.ino(), f.position(), f.flags())
}

/// Every private descriptor: (number, hand-over item, close-on-exec).
pub(crate) fn private_fds(st: &State) -> Vec<(c_int, String, bool)> {
    let mut out = Vec::new();
    let Some(t) = st.table() else { return out };
    for (fd, s) in t.slots.iter().enumerate() {
        if !s.private.load(Ordering::Acquire) {
            continue;
        }
        if let Some(f) = s.file.lock().clone() {
            out.push((
                fd as c_int,
                handover_item(fd as c_int, &f),
                s.cloexec.load(Ordering::Relaxed),
            ));
        }
    }
    out
}

/// The hand-over entries for `items` and a current directory.
pub(crate) fn handover_env(items: &[String], cwd: Option<&[u8]>) -> Vec<CString> {
    let mut env = Vec::new();
    if !items.is_empty() {
        env.push(CString::new(format!("KAISO_INHERIT={}", items.join(","))).unwrap_or_default());
    }
    if let Some(c) = cwd {
        let mut s = b"KAISO_CWD=".to_vec();
        s.extend_from_slice(c);
        env.push(CString::new(s).unwrap_or_default());
    }
    env
}

/// Makes the placeholders of `fds` survive exec. Returns them for `undo`.
pub(crate) fn keep_open(fds: &[c_int]) -> Vec<c_int> {
    for &fd in fds {
        unsafe { real::fcntl()(fd, libc::F_SETFD, 0) };
    }
    fds.to_vec()
}

/// The environment entries to hand over, with the placeholders of inheritable private
/// descriptors made to survive exec. Returns the descriptors to restore if exec fails.
fn prepare(st: &State) -> (Vec<CString>, Vec<c_int>) {
    let fds: Vec<_> = private_fds(st).into_iter().filter(|x| !x.2).collect();
    let items: Vec<String> = fds.iter().map(|x| x.1.clone()).collect();
    let numbers: Vec<c_int> = fds.iter().map(|x| x.0).collect();
    let env = handover_env(&items, st.vcwd.lock().as_deref());
    (env, keep_open(&numbers))
}

/// Runs `exec` with the hand-over environment built from `envp` and the placeholders kept
/// open; when it returns (exec failed) the placeholders are restored and errno is kept.
unsafe fn with_handover(st: &State, envp: *const P, exec: impl FnOnce(*const P) -> c_int) -> c_int {
    let (extra, kept) = prepare(st);
    let mut hold = Vec::new();
    let env = with_env(envp, &extra, &mut hold);
    let r = exec(env.as_ptr());
    let e = crate::state::errno();
    undo(&kept);
    set_errno(e);
    r
}

pub(crate) fn undo(kept: &[c_int]) {
    for &fd in kept {
        unsafe { real::fcntl()(fd, libc::F_SETFD, libc::FD_CLOEXEC as usize) };
    }
}

/// The environment for a new program: `envp` without stale hand-over entries, plus `extra`,
/// plus any of this library's settings the program left out (a program that builds its own
/// environment, e.g. `env -i` or a daemon cleaning up, would otherwise start the new program
/// on the kernel's empty directory). A program's own value of a setting is kept, except that
/// an LD_PRELOAD without this library gets it added in front. The strings live in `hold`.
pub(crate) unsafe fn with_env(
    envp: *const *const c_char,
    extra: &[CString],
    hold: &mut Vec<CString>,
) -> Vec<*const c_char> {
    let mut out = Vec::new();
    let settings = SETTINGS.get();
    let mut have = [false; SETTING_NAMES.len()];
    if !envp.is_null() {
        let mut p = envp;
        while !(*p).is_null() {
            let e = CStr::from_ptr(*p).to_bytes();
            p = p.add(1);
            if e.starts_with(b"KAISO_INHERIT=") || e.starts_with(b"KAISO_CWD=") {
                continue;
            }
            if let Some(i) = SETTING_NAMES.iter().position(|n| {
                e.len() > n.len() && e.starts_with(n.as_bytes()) && e[n.len()] == b'='
            }) {
                have[i] = true;
                if i == 0
                    && let Some(s) = settings
                    && !s.lib.is_empty()
                    && !e[11..]
                        .split(|&b| b == b':' || b == b' ')
                        .any(|x| x == &s.lib[..])
                {
                    // Their LD_PRELOAD, with this library in front.
                    let mut v = b"LD_PRELOAD=".to_vec();
                    v.extend_from_slice(&s.lib);
                    if e.len() > 11 {
                        v.push(b':');
                        v.extend_from_slice(&e[11..]);
                    }
                    hold.push(CString::new(v).unwrap_or_default());
                    out.push(hold.last().expect("pushed").as_ptr());
                    continue;
                }
            }
            out.push(e.as_ptr() as *const c_char);
        }
    }
    if let Some(s) = settings {
        for v in &s.vars {
            let b = v.as_bytes();
            if let Some(i) = SETTING_NAMES
                .iter()
                .position(|n| b.starts_with(n.as_bytes()) && b.get(n.len()) == Some(&b'='))
                && !have[i]
            {
                out.push(v.as_ptr());
            }
        }
    }
    out.extend(extra.iter().map(|c| c.as_ptr()));
    out.push(std::ptr::null());
    out
}

unsafe extern "C" {
    static environ: *const *const c_char;
}

/// A memfd holding a copy of a private file, for the kernel to execute. Scripts keep the
/// descriptor across exec (the interpreter opens the script through /dev/fd/N); binaries get
/// a close-on-exec one. Checks execute permission as the kernel would.
pub(crate) fn private_image(f: &kaiso_libfs::OpenFile) -> Result<c_int, c_int> {
    let stat = f.stat();
    if stat.mode & libc::S_IFMT != libc::S_IFREG {
        return Err(libc::EACCES);
    }
    if stat.mode & 0o111 == 0 {
        return Err(libc::EACCES);
    }
    let mut head = [0u8; 2];
    let script = f.pread(&mut head, 0).unwrap_or(0) == 2 && &head == b"#!";
    let flags = if script { 0 } else { libc::MFD_CLOEXEC };
    let fd = unsafe { libc::memfd_create(c"kaiso-private-exec".as_ptr(), flags) };
    if fd < 0 {
        return Err(crate::state::errno());
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let n = match f.pread(&mut buf, off) {
            Ok(n) => n,
            Err(e) => {
                unsafe { real::close()(fd) };
                return Err(e);
            }
        };
        if n == 0 {
            break;
        }
        let mut done = 0;
        while done < n {
            let w = unsafe { libc::syscall(libc::SYS_write, fd, buf[done..n].as_ptr(), n - done) };
            if w <= 0 {
                let e = crate::state::errno();
                unsafe { real::close()(fd) };
                return Err(e);
            }
            done += w as usize;
        }
        off += n as u64;
    }
    Ok(fd)
}

/// Opens the private program at `abs` and copies it into a memfd.
pub(crate) fn private_image_at(st: &State, abs: &[u8]) -> Result<c_int, c_int> {
    let fs = st.fs()?;
    let _g = Guard::enter();
    let f = fs.open(abs, libc::O_RDONLY, 0).map_err(|e| match e {
        kaiso_libfs::FsError::Errno(x) => x,
        kaiso_libfs::FsError::Outside(_) => libc::ENOENT,
    })?;
    private_image(&f)
}

/// execveat(fd, "", …, AT_EMPTY_PATH): runs the memfd image.
unsafe fn exec_fd(fd: c_int, argv: *const P, env: *const P) -> c_int {
    let r = libc::syscall(
        libc::SYS_execveat,
        fd,
        c"".as_ptr(),
        argv,
        env,
        libc::AT_EMPTY_PATH,
    ) as c_int;
    let e = crate::state::errno();
    real::close()(fd);
    set_errno(e);
    r
}

/// execve with the hand-over: a private program runs from a memfd copy; a path relative to
/// a private current directory that leads outside is resolved first.
unsafe fn exec_path(st: &State, path: P, argv: *const P, envp: *const P) -> c_int {
    with_handover(st, envp, |env| match route(st, libc::AT_FDCWD, path) {
        Route::Private(abs) => match private_image_at(st, &abs) {
            Ok(fd) => exec_fd(fd, argv, env),
            Err(e) => {
                set_errno(e);
                -1
            }
        },
        Route::KernelPath(p) => real::execve()(p.as_ptr(), argv, env),
        Route::Kernel => real::execve()(path, argv, env),
    })
}

/// The directories of PATH (the default glibc uses when unset).
fn search_path() -> Vec<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::env::var_os("PATH")
        .map(|p| p.as_bytes().to_vec())
        .unwrap_or_else(|| b"/bin:/usr/bin".to_vec());
    path.split(|&b| b == b':')
        .map(|d| {
            if d.is_empty() {
                b".".to_vec()
            } else {
                d.to_vec()
            }
        })
        .collect()
}

/// True when some PATH directory lies in the private tree (then the search is ours).
fn path_has_private(st: &State) -> bool {
    search_path().iter().any(|d| {
        CString::new(d.clone())
            .map(|c| matches!(route(st, libc::AT_FDCWD, c.as_ptr()), Route::Private(_)))
            .unwrap_or(false)
    })
}

/// execvpe's PATH search over private and kernel directories alike: the first candidate that
/// exists is executed; EACCES is remembered and the search goes on, as glibc does.
unsafe fn exec_search(st: &State, file: P, argv: *const P, envp: *const P) -> c_int {
    let name = CStr::from_ptr(file).to_bytes();
    let mut denied = false;
    for dir in search_path() {
        let mut cand = dir;
        cand.push(b'/');
        cand.extend_from_slice(name);
        let Ok(c) = CString::new(cand) else { continue };
        let r = exec_path(st, c.as_ptr(), argv, envp);
        let e = crate::state::errno();
        if r == -1 && e == libc::ENOEXEC {
            // Not a binary and no #!: glibc runs it with /bin/sh.
            let mut args: Vec<P> = vec![c"/bin/sh".as_ptr(), c.as_ptr()];
            let mut p = argv.add(1);
            while !argv.is_null() && !(*p).is_null() {
                args.push(*p);
                p = p.add(1);
            }
            args.push(std::ptr::null());
            return exec_path(st, c"/bin/sh".as_ptr(), args.as_ptr(), envp);
        }
        match e {
            libc::EACCES => denied = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            _ => return -1,
        }
    }
    set_errno(if denied { libc::EACCES } else { libc::ENOENT });
    -1
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn execve(path: P, argv: *const P, envp: *const P) -> c_int {
    let Some(st) = state() else {
        return real::execve()(path, argv, envp);
    };
    exec_path(st, path, argv, envp)
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
    if file.is_null() || CStr::from_ptr(file).to_bytes().is_empty() {
        set_errno(libc::ENOENT);
        return -1;
    }
    if CStr::from_ptr(file).to_bytes().contains(&b'/') {
        return exec_path(st, file, argv, envp);
    }
    if path_has_private(st) {
        return exec_search(st, file, argv, envp);
    }
    with_handover(st, envp, |env| real::execvpe()(file, argv, env))
}
#[unsafe(no_mangle)]
pub unsafe extern "C" fn execvp(file: P, argv: *const P) -> c_int {
    execvpe(file, argv, environ)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn fexecve(fd: c_int, argv: *const P, envp: *const P) -> c_int {
    let Some(st) = state() else {
        return real::fexecve()(fd, argv, envp);
    };
    if let Some(f) = st.file(fd) {
        let image = {
            let _g = Guard::enter();
            private_image(&f)
        };
        let img = match image {
            Ok(i) => i,
            Err(e) => {
                set_errno(e);
                return -1;
            }
        };
        return with_handover(st, envp, |env| exec_fd(img, argv, env));
    }
    with_handover(st, envp, |env| real::fexecve()(fd, argv, env))
}

// ---- execl, execlp, execle ---------------------------------------------------------------------
//
// glibc's execl* build an argv and call the kernel internally, past any interposed execve, so
// they are interposed themselves. They are variadic, which stable Rust cannot define: a naked
// x86-64 entry stores the register arguments next to the stack arguments (the System V ABI
// passes the first six integer arguments in registers, the rest on the stack in order) and
// hands both to `execl_common`, which walks them like a va_list.

/// Argument `i` (counting from the one after `path`) of a variadic call.
unsafe fn vararg(regs: *const P, stack: *const P, i: usize) -> P {
    if i < 5 {
        *regs.add(i)
    } else {
        *stack.add(i - 5)
    }
}

/// `kind`: 0 execl, 1 execlp, 2 execle.
unsafe extern "C" fn execl_common(path: P, regs: *const P, stack: *const P, kind: c_int) -> c_int {
    let mut argv: Vec<P> = Vec::new();
    let mut i = 0;
    loop {
        let a = vararg(regs, stack, i);
        i += 1;
        argv.push(a);
        if a.is_null() {
            break;
        }
        if argv.len() > 1 << 20 {
            set_errno(libc::E2BIG);
            return -1;
        }
    }
    match kind {
        0 => execve(path, argv.as_ptr(), environ),
        1 => execvpe(path, argv.as_ptr(), environ),
        _ => {
            let envp = vararg(regs, stack, i) as *const P;
            execve(path, argv.as_ptr(), envp)
        }
    }
}

#[cfg(target_arch = "x86_64")]
macro_rules! execl_entry {
    ($name:ident, $kind:literal) => {
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(path: P, arg0: P) -> c_int {
            core::arch::naked_asm!(
                "push r9",
                "push r8",
                "push rcx",
                "push rdx",
                "push rsi",
                "mov rsi, rsp",
                "lea rdx, [rsp + 48]",
                concat!("mov ecx, ", $kind),
                "call {common}",
                "add rsp, 40",
                "ret",
                common = sym execl_common,
            )
        }
    };
}

#[cfg(target_arch = "x86_64")]
execl_entry!(execl, 0);
#[cfg(target_arch = "x86_64")]
execl_entry!(execlp, 1);
#[cfg(target_arch = "x86_64")]
execl_entry!(execle, 2);
