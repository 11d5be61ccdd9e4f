//! Process-wide state: the private directory, the pool (opened on first use), the descriptor
//! table, the current directory, and the re-entrancy guard.

use crate::real;
use kaiso_libfs::{
    Fs, FsError, OpenFile, Persist, PoolOptions, SpinLock, normalize_abs, normalized, strip_mount,
};
use std::cell::Cell;
use std::collections::{BTreeSet, HashMap};
use std::ffi::{CStr, CString, c_char, c_int};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicU32, Ordering};

thread_local! {
    /// Set while this thread runs library code: libc calls made from inside go straight to libc.
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

pub fn in_lib() -> bool {
    IN_LIB.with(|c| c.get())
}

pub struct Guard(bool);

impl Guard {
    pub fn enter() -> Guard {
        Guard(IN_LIB.with(|c| c.replace(true)))
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let prev = self.0;
        IN_LIB.with(|c| c.set(prev));
    }
}

pub fn set_errno(e: c_int) {
    unsafe { *libc::__errno_location() = e };
}

pub fn errno() -> c_int {
    unsafe { *libc::__errno_location() }
}

/// One descriptor slot. `private` is read without the lock on every call that takes a
/// descriptor, so kernel descriptors pay one load.
pub struct Slot {
    pub private: AtomicBool,
    /// This number is one of the range reserved at start-up (its placeholder stays open).
    pub reserved: AtomicBool,
    pub cloexec: AtomicBool,
    pub file: SpinLock<Option<Arc<OpenFile>>>,
}

pub struct FdTable {
    pub slots: Box<[Slot]>,
    /// Reserved numbers not in use, ordered: the lowest is handed out first, as the kernel does.
    pub free: SpinLock<BTreeSet<c_int>>,
    /// A kernel descriptor used as the placeholder that keeps private numbers reserved:
    /// an O_PATH descriptor, so kernel I/O on a stray private number fails with EBADF.
    pub placeholder: c_int,
}

pub enum Pool {
    Ready(Fs),
    Unavailable(String),
}

pub struct State {
    pub mount: Vec<u8>,
    pool_state: AtomicU8,
    pool: AtomicPtr<Pool>,
    pub fds: AtomicPtr<FdTable>,
    /// Current directory when it is inside the private tree (the kernel's stays outside).
    pub vcwd: SpinLock<Option<Vec<u8>>>,
    /// The kernel's current directory, tracked through chdir/fchdir.
    pub kcwd: SpinLock<Vec<u8>>,
    pub umask: AtomicU32,
    pub warned: AtomicBool,
    /// Our DIR streams and FILE streams, by address.
    pub dirs: SpinLock<HashMap<usize, ()>>,
    pub files: SpinLock<HashMap<usize, Arc<AtomicI32>>>,
}

static STATE: AtomicPtr<State> = AtomicPtr::new(std::ptr::null_mut());

/// The state, once the library is configured (KAISO_PRIVATE_DIR set) and initialised.
#[inline]
pub fn state() -> Option<&'static State> {
    let p = STATE.load(Ordering::Acquire);
    if p.is_null() || in_lib() {
        None
    } else {
        Some(unsafe { &*p })
    }
}

/// A fork child does not own the pool (the lock stays with its parent): it forgets the
/// parent's pool state and descriptors, without touching the pool, and opens the pool itself
/// on first use like any other process; that succeeds once the parent lends it (see wait.rs)
/// or exits.
/// The state regardless of the re-entrancy guard (for library-internal bookkeeping).
pub fn state_raw() -> Option<&'static State> {
    unsafe { STATE.load(Ordering::Acquire).as_ref() }
}

extern "C" fn atfork_child() {
    if let Some(s) = unsafe { STATE.load(Ordering::Acquire).as_ref() } {
        if s.pool_state.load(Ordering::Acquire) != 0 {
            // Leaked on purpose: dropping would write the parent's pool.
            s.pool.store(std::ptr::null_mut(), Ordering::Release);
            s.pool_state.store(0, Ordering::Release);
        }
        if let Some(t) = s.table() {
            let mut free = BTreeSet::new();
            for (fd, slot) in t.slots.iter().enumerate() {
                if slot.private.swap(false, Ordering::AcqRel) {
                    std::mem::forget(slot.file.lock().take());
                }
                if slot.reserved.load(Ordering::Relaxed) {
                    free.insert(fd as c_int);
                }
            }
            *t.free.lock() = free;
        }
        // Streams stay registered: a child's readdir continues from its DRAM snapshot, and
        // its FILEs fail with EBADF on the now-kernel descriptor numbers.
    }
}

/// Runs from .init_array before main: reads the configuration; the pool itself is opened on
/// first use so that processes that never touch the private directory never lock it.
pub fn init() {
    let _g = Guard::enter();
    let Some(dir) = std::env::var_os("KAISO_PRIVATE_DIR") else {
        return;
    };
    use std::os::unix::ffi::OsStrExt;
    let dir = dir.as_bytes();
    if dir.first() != Some(&b'/') {
        return;
    }
    let mount = normalize_abs(dir);
    if mount == b"/" {
        return;
    }
    let mut buf = vec![0u8; 4096];
    let kcwd = unsafe {
        let p = real::getcwd()(buf.as_mut_ptr() as *mut c_char, buf.len());
        if p.is_null() {
            b"/".to_vec()
        } else {
            CStr::from_ptr(p).to_bytes().to_vec()
        }
    };
    let um = unsafe { libc::umask(0) };
    unsafe { libc::umask(um) };
    let st = Box::new(State {
        mount,
        pool_state: AtomicU8::new(0),
        pool: AtomicPtr::new(std::ptr::null_mut()),
        fds: AtomicPtr::new(std::ptr::null_mut()),
        vcwd: SpinLock::new(None),
        kcwd: SpinLock::new(kcwd),
        umask: AtomicU32::new(um),
        warned: AtomicBool::new(false),
        dirs: SpinLock::new(HashMap::new()),
        files: SpinLock::new(HashMap::new()),
    });
    unsafe { libc::pthread_atfork(None, None, Some(atfork_child)) };
    STATE.store(Box::into_raw(st), Ordering::Release);
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    let v = v.trim();
    let (num, mul) = match v.as_bytes().last()? {
        b'k' | b'K' => (&v[..v.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&v[..v.len() - 1], 1 << 20),
        b'g' | b'G' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mul)
}

impl State {
    /// The pool, opening it on first use. Errors are reported once on stderr.
    /// The pool if this process has it open now (no opening, no error report).
    pub fn open_fs(&self) -> Option<&Fs> {
        if self.pool_state.load(Ordering::Acquire) != 2 {
            return None;
        }
        match unsafe { &*self.pool.load(Ordering::Acquire) } {
            Pool::Ready(fs) => Some(fs),
            Pool::Unavailable(_) => None,
        }
    }

    /// Replaces the pool with an error (after a failed resume).
    pub fn set_unavailable(&self, msg: String) {
        self.pool.store(
            Box::into_raw(Box::new(Pool::Unavailable(msg))),
            Ordering::Release,
        );
    }

    pub fn fs(&self) -> Result<&Fs, c_int> {
        let mut round = 0u32;
        loop {
            match self.pool_state.load(Ordering::Acquire) {
                2 => {
                    return match unsafe { &*self.pool.load(Ordering::Acquire) } {
                        Pool::Ready(fs) => Ok(fs),
                        Pool::Unavailable(msg) => {
                            self.warn_once(msg);
                            Err(libc::EBUSY)
                        }
                    };
                }
                0 if self
                    .pool_state
                    .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok() =>
                {
                    let pool = Box::new(self.open_pool());
                    self.pool.store(Box::into_raw(pool), Ordering::Release);
                    self.pool_state.store(2, Ordering::Release);
                }
                _ => {
                    round += 1;
                    if round > 64 {
                        std::thread::yield_now();
                    }
                }
            }
        }
    }

    fn open_pool(&self) -> Pool {
        let _g = Guard::enter();
        let Some(path) = std::env::var_os("KAISO_POOL") else {
            return Pool::Unavailable(
                "KAISO_POOL is not set; start the program with `kaiso run`".into(),
            );
        };
        let mut opts = PoolOptions::default();
        if let Some(s) = env_u64("KAISO_POOL_SIZE") {
            opts.size = s;
        }
        if let Some(b) = env_u64("KAISO_BLOCK_SIZE") {
            opts.block_size = b as u32;
        }
        opts.inode_count = env_u64("KAISO_INODES");
        // KAISO_PREFAULT=1: madvise new pool memory in 2 MiB ahead of the allocator.
        opts.prefault = std::env::var("KAISO_PREFAULT").is_ok_and(|v| v == "1");
        opts.persist = match std::env::var("KAISO_PERSIST").as_deref() {
            Ok("pmem") => Some(Persist::Pmem),
            Ok("volatile") => Some(Persist::Volatile),
            Ok("msync") => Some(Persist::Msync),
            _ => None,
        };
        // A parent that owns the pool lends it while it waits for its child (wait.rs); the
        // child may get here first, so it waits a little for its parent.
        let start = std::time::Instant::now();
        let opened = loop {
            match Fs::open_pool(std::path::Path::new(&path), &opts, &self.mount) {
                Err(kaiso_libfs::PoolError::Busy { owner: Some(o), .. })
                    if o == unsafe { libc::getppid() } as u32
                        && start.elapsed() < std::time::Duration::from_secs(3) =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                r => break r,
            }
        };
        match opened {
            Ok((fs, report)) => {
                if !report.clean() || report.orphans_freed > 0 || report.log_replayed {
                    eprintln!(
                        "kaiso-preload: recovered pool {}: log replayed {}, {} orphans freed, {} repairs",
                        std::path::Path::new(&path).display(),
                        report.log_replayed,
                        report.orphans_freed,
                        report.fixes.len()
                    );
                }
                // A fork child keeps the table (and reserved numbers) it inherited.
                if self.table().is_none() {
                    match reserve_fds() {
                        Ok(t) => self
                            .fds
                            .store(Box::into_raw(Box::new(t)), Ordering::Release),
                        Err(msg) => return Pool::Unavailable(msg),
                    }
                }
                crate::proc::adopt_inherited(self, &fs);
                Pool::Ready(fs)
            }
            Err(e) => Pool::Unavailable(format!(
                "private directory {} unavailable: {e}",
                String::from_utf8_lossy(&self.mount)
            )),
        }
    }

    fn warn_once(&self, msg: &str) {
        if !self.warned.swap(true, Ordering::AcqRel) {
            let _g = Guard::enter();
            eprintln!("kaiso-preload: {msg}");
        }
    }

    #[inline]
    pub fn table(&self) -> Option<&FdTable> {
        let p = self.fds.load(Ordering::Acquire);
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// The open file behind a private descriptor.
    #[inline]
    pub fn file(&self, fd: c_int) -> Option<Arc<OpenFile>> {
        let t = self.table()?;
        let s = t.slots.get(usize::try_from(fd).ok()?)?;
        if !s.private.load(Ordering::Acquire) {
            return None;
        }
        s.file.lock().clone()
    }

    pub fn is_private_fd(&self, fd: c_int) -> bool {
        self.table()
            .and_then(|t| t.slots.get(usize::try_from(fd).ok()?))
            .is_some_and(|s| s.private.load(Ordering::Acquire))
    }

    /// Gives `file` a descriptor number from the reserved range (the lowest free one >= min).
    pub fn install(&self, file: Arc<OpenFile>, min: c_int, cloexec: bool) -> Result<c_int, c_int> {
        let t = self.table().ok_or(libc::EMFILE)?;
        let fd = {
            let mut free = t.free.lock();
            let pick = *free.range(min..).next().ok_or(libc::EMFILE)?;
            free.remove(&pick);
            pick
        };
        let s = &t.slots[fd as usize];
        *s.file.lock() = Some(file);
        s.cloexec.store(cloexec, Ordering::Relaxed);
        s.private.store(true, Ordering::Release);
        Ok(fd)
    }

    /// Makes `fd` (any number) refer to `file`, as dup2 does. A kernel descriptor there is
    /// replaced by the placeholder so the kernel cannot hand the number out.
    pub fn install_at(&self, fd: c_int, file: Arc<OpenFile>, cloexec: bool) -> Result<(), c_int> {
        let t = self.table().ok_or(libc::EBADF)?;
        let s = t
            .slots
            .get(usize::try_from(fd).map_err(|_| libc::EBADF)?)
            .ok_or(libc::EBADF)?;
        if !s.reserved.load(Ordering::Relaxed) && !s.private.load(Ordering::Acquire) {
            let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
            if unsafe { real::dup3()(t.placeholder, fd, flags) } < 0 {
                return Err(errno());
            }
        }
        if s.reserved.load(Ordering::Relaxed) && !s.private.load(Ordering::Acquire) {
            t.free.lock().remove(&fd);
        }
        let old = s.file.lock().replace(file);
        s.cloexec.store(cloexec, Ordering::Relaxed);
        s.private.store(true, Ordering::Release);
        drop(old);
        if fd <= 2 {
            unsafe { crate::stdstreams::attach(fd) };
        }
        Ok(())
    }

    /// Closes a private descriptor. Returns false when `fd` is not private.
    pub fn close_private(&self, fd: c_int) -> bool {
        let Some(t) = self.table() else { return false };
        let Some(s) = usize::try_from(fd).ok().and_then(|i| t.slots.get(i)) else {
            return false;
        };
        if !s.private.load(Ordering::Acquire) {
            return false;
        }
        if fd <= 2 {
            unsafe { crate::stdstreams::detach(fd) };
        }
        let old = {
            let mut f = s.file.lock();
            s.private.store(false, Ordering::Release);
            f.take()
        };
        if s.reserved.load(Ordering::Relaxed) {
            t.free.lock().insert(fd);
        } else {
            unsafe { real::close()(fd) };
        }
        drop(old);
        true
    }

    /// Gives a number back to the kernel (dup2 of a kernel descriptor onto it follows).
    pub fn release_number(&self, fd: c_int) {
        let Some(t) = self.table() else { return };
        let Some(s) = usize::try_from(fd).ok().and_then(|i| t.slots.get(i)) else {
            return;
        };
        if s.reserved.swap(false, Ordering::Relaxed) {
            t.free.lock().remove(&fd);
        }
        if fd <= 2 && s.private.load(Ordering::Acquire) {
            unsafe { crate::stdstreams::detach(fd) };
        }
        let old = {
            let mut f = s.file.lock();
            s.private.store(false, Ordering::Release);
            f.take()
        };
        drop(old);
    }

    /// Whether a descriptor number is one of ours (private, or a spare reserved number).
    pub fn owns_fd(&self, fd: c_int) -> bool {
        self.table()
            .and_then(|t| t.slots.get(usize::try_from(fd).ok()?))
            .is_some_and(|s| {
                s.reserved.load(Ordering::Relaxed) || s.private.load(Ordering::Acquire)
            })
    }

    /// The current directory as an absolute path.
    pub fn cwd(&self) -> Vec<u8> {
        if let Some(v) = self.vcwd.lock().as_ref() {
            return v.clone();
        }
        self.kcwd.lock().clone()
    }
}

/// Reserves a contiguous range of descriptor numbers at the top of the (raised) limit.
fn reserve_fds() -> Result<FdTable, String> {
    let want = std::env::var("KAISO_FDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1024)
        .clamp(16, 65536);
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    let target = (rl.rlim_cur + want).min(rl.rlim_max).min(1 << 20);
    if target > rl.rlim_cur {
        let new = libc::rlimit {
            rlim_cur: target,
            rlim_max: rl.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            rl.rlim_cur = target;
        }
    }
    let limit = rl.rlim_cur as c_int;
    let n = (want as c_int).min(limit / 2);
    let base = limit - n;
    let ph = unsafe { real::open()(c"/dev/null".as_ptr(), libc::O_PATH | libc::O_CLOEXEC, 0) };
    if ph < 0 {
        return Err("cannot open /dev/null for descriptor placeholders".into());
    }
    let slots: Box<[Slot]> = (0..limit)
        .map(|_| Slot {
            private: AtomicBool::new(false),
            reserved: AtomicBool::new(false),
            cloexec: AtomicBool::new(false),
            file: SpinLock::new(None),
        })
        .collect();
    let mut free = BTreeSet::new();
    for fd in (base..limit).rev() {
        if fd == ph || unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 {
            continue; // already in use by the program
        }
        if unsafe { real::dup3()(ph, fd, libc::O_CLOEXEC) } == fd {
            slots[fd as usize].reserved.store(true, Ordering::Relaxed);
            free.insert(fd);
        }
    }
    if free.is_empty() {
        return Err("could not reserve any descriptor numbers".into());
    }
    Ok(FdTable {
        slots,
        free: SpinLock::new(free),
        placeholder: ph,
    })
}

/// Where a path argument leads.
pub enum Route {
    /// Not ours: call libc with the original argument.
    Kernel,
    /// Not ours, but the original argument is relative to a private current directory or
    /// directory descriptor: call libc with this absolute path instead.
    KernelPath(CString),
    /// Inside the private directory: the normalised absolute path.
    Private(Vec<u8>),
}

/// Routes `path` relative to `dirfd` (AT_FDCWD or a descriptor).
pub fn route(st: &State, dirfd: c_int, path: *const c_char) -> Route {
    if path.is_null() {
        return Route::Kernel;
    }
    let p = unsafe { CStr::from_ptr(path) }.to_bytes();
    if p.is_empty() {
        return Route::Kernel;
    }
    let mut rebased = false;
    let abs = if p[0] == b'/' {
        // Fast exit for the common case: an absolute path not under the mount.
        if !p.starts_with(&st.mount) {
            return Route::Kernel;
        }
        p.to_vec()
    } else {
        let mut base = if dirfd == libc::AT_FDCWD {
            rebased = st.vcwd.lock().is_some();
            st.cwd()
        } else if let Some(f) = st.file(dirfd) {
            rebased = true;
            match st.fs() {
                Ok(fs) => fs.dir_path(f.ino()),
                Err(_) => return Route::Kernel,
            }
        } else {
            return Route::Kernel;
        };
        base.push(b'/');
        base.extend_from_slice(p);
        base
    };
    let norm = normalized(abs);
    if strip_mount(&st.mount, &norm).is_some() {
        Route::Private(norm)
    } else if rebased {
        Route::KernelPath(CString::new(norm).unwrap_or_default())
    } else {
        Route::Kernel
    }
}

/// The outcome of a private operation.
pub enum Fail {
    Errno(c_int),
    /// Resolution left the private directory (symlink or ..): redo the call in the kernel.
    Outside(CString),
}

impl From<FsError> for Fail {
    fn from(e: FsError) -> Fail {
        match e {
            FsError::Errno(x) => Fail::Errno(x),
            FsError::Outside(p) => Fail::Outside(CString::new(p).unwrap_or_default()),
        }
    }
}

impl From<c_int> for Fail {
    fn from(e: c_int) -> Fail {
        Fail::Errno(e)
    }
}

pub type Res<T> = Result<T, Fail>;
