//! The libc functions behind ours, found once with dlsym(RTLD_NEXT) and cached.

use std::ffi::{c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

pub type Mode = libc::mode_t;

fn missing(name: &str) -> ! {
    let msg = format!("kaiso-preload: libc has no symbol {name}\n");
    unsafe {
        libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
        libc::abort()
    }
}

macro_rules! reals {
    ($( $name:ident ( $($arg:ty),* ) -> $ret:ty ; )*) => {
        $(
            #[inline]
            pub fn $name() -> unsafe extern "C" fn($($arg),*) -> $ret {
                static P: AtomicUsize = AtomicUsize::new(0);
                let mut p = P.load(Ordering::Relaxed);
                if p == 0 {
                    p = unsafe {
                        libc::dlsym(libc::RTLD_NEXT, concat!(stringify!($name), "\0").as_ptr() as *const c_char)
                    } as usize;
                    if p == 0 {
                        missing(stringify!($name));
                    }
                    P.store(p, Ordering::Relaxed);
                }
                unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
            }
        )*
    };
}

type Sz = libc::size_t;
type SSz = libc::ssize_t;
type Off = libc::off_t;
type P = *const c_char;

reals! {
    open(P, c_int, Mode) -> c_int;
    open64(P, c_int, Mode) -> c_int;
    __open_2(P, c_int) -> c_int;
    __open64_2(P, c_int) -> c_int;
    openat(c_int, P, c_int, Mode) -> c_int;
    openat64(c_int, P, c_int, Mode) -> c_int;
    __openat_2(c_int, P, c_int) -> c_int;
    __openat64_2(c_int, P, c_int) -> c_int;
    creat(P, Mode) -> c_int;
    creat64(P, Mode) -> c_int;
    close(c_int) -> c_int;
    close_range(c_uint, c_uint, c_int) -> c_int;
    closefrom(c_int) -> ();
    read(c_int, *mut c_void, Sz) -> SSz;
    __read_chk(c_int, *mut c_void, Sz, Sz) -> SSz;
    write(c_int, *const c_void, Sz) -> SSz;
    pread(c_int, *mut c_void, Sz, Off) -> SSz;
    pread64(c_int, *mut c_void, Sz, Off) -> SSz;
    __pread_chk(c_int, *mut c_void, Sz, Off, Sz) -> SSz;
    __pread64_chk(c_int, *mut c_void, Sz, Off, Sz) -> SSz;
    pwrite(c_int, *const c_void, Sz, Off) -> SSz;
    pwrite64(c_int, *const c_void, Sz, Off) -> SSz;
    readv(c_int, *const libc::iovec, c_int) -> SSz;
    writev(c_int, *const libc::iovec, c_int) -> SSz;
    preadv(c_int, *const libc::iovec, c_int, Off) -> SSz;
    preadv64(c_int, *const libc::iovec, c_int, Off) -> SSz;
    pwritev(c_int, *const libc::iovec, c_int, Off) -> SSz;
    pwritev64(c_int, *const libc::iovec, c_int, Off) -> SSz;
    preadv2(c_int, *const libc::iovec, c_int, Off, c_int) -> SSz;
    pwritev2(c_int, *const libc::iovec, c_int, Off, c_int) -> SSz;
    lseek(c_int, Off, c_int) -> Off;
    lseek64(c_int, Off, c_int) -> Off;
    fsync(c_int) -> c_int;
    fdatasync(c_int) -> c_int;
    syncfs(c_int) -> c_int;
    sync_file_range(c_int, Off, Off, c_uint) -> c_int;
    ftruncate(c_int, Off) -> c_int;
    ftruncate64(c_int, Off) -> c_int;
    truncate(P, Off) -> c_int;
    fallocate(c_int, c_int, Off, Off) -> c_int;
    fallocate64(c_int, c_int, Off, Off) -> c_int;
    posix_fallocate(c_int, Off, Off) -> c_int;
    posix_fallocate64(c_int, Off, Off) -> c_int;
    posix_fadvise(c_int, Off, Off, c_int) -> c_int;
    posix_fadvise64(c_int, Off, Off, c_int) -> c_int;
    dup(c_int) -> c_int;
    dup2(c_int, c_int) -> c_int;
    dup3(c_int, c_int, c_int) -> c_int;
    fcntl(c_int, c_int, usize) -> c_int;
    fcntl64(c_int, c_int, usize) -> c_int;
    flock(c_int, c_int) -> c_int;
    lockf(c_int, c_int, Off) -> c_int;
    lockf64(c_int, c_int, Off) -> c_int;
    ioctl(c_int, c_ulong, usize) -> c_int;
    mmap(*mut c_void, Sz, c_int, c_int, c_int, Off) -> *mut c_void;
    mmap64(*mut c_void, Sz, c_int, c_int, c_int, Off) -> *mut c_void;
    copy_file_range(c_int, *mut i64, c_int, *mut i64, Sz, c_uint) -> SSz;
    sendfile(c_int, c_int, *mut Off, Sz) -> SSz;
    sendfile64(c_int, c_int, *mut Off, Sz) -> SSz;
    fstat(c_int, *mut libc::stat) -> c_int;
    fstat64(c_int, *mut libc::stat) -> c_int;
    __fxstat(c_int, c_int, *mut libc::stat) -> c_int;
    __fxstat64(c_int, c_int, *mut libc::stat) -> c_int;
    stat(P, *mut libc::stat) -> c_int;
    stat64(P, *mut libc::stat) -> c_int;
    lstat(P, *mut libc::stat) -> c_int;
    lstat64(P, *mut libc::stat) -> c_int;
    __xstat(c_int, P, *mut libc::stat) -> c_int;
    __xstat64(c_int, P, *mut libc::stat) -> c_int;
    __lxstat(c_int, P, *mut libc::stat) -> c_int;
    __lxstat64(c_int, P, *mut libc::stat) -> c_int;
    fstatat(c_int, P, *mut libc::stat, c_int) -> c_int;
    fstatat64(c_int, P, *mut libc::stat, c_int) -> c_int;
    __fxstatat(c_int, c_int, P, *mut libc::stat, c_int) -> c_int;
    __fxstatat64(c_int, c_int, P, *mut libc::stat, c_int) -> c_int;
    statx(c_int, P, c_int, c_uint, *mut libc::statx) -> c_int;
    statfs(P, *mut libc::statfs) -> c_int;
    statfs64(P, *mut libc::statfs) -> c_int;
    fstatfs(c_int, *mut libc::statfs) -> c_int;
    fstatfs64(c_int, *mut libc::statfs) -> c_int;
    statvfs(P, *mut libc::statvfs) -> c_int;
    statvfs64(P, *mut libc::statvfs) -> c_int;
    fstatvfs(c_int, *mut libc::statvfs) -> c_int;
    fstatvfs64(c_int, *mut libc::statvfs) -> c_int;
    access(P, c_int) -> c_int;
    faccessat(c_int, P, c_int, c_int) -> c_int;
    euidaccess(P, c_int) -> c_int;
    eaccess(P, c_int) -> c_int;
    mkdir(P, Mode) -> c_int;
    mkdirat(c_int, P, Mode) -> c_int;
    rmdir(P) -> c_int;
    unlink(P) -> c_int;
    unlinkat(c_int, P, c_int) -> c_int;
    remove(P) -> c_int;
    rename(P, P) -> c_int;
    renameat(c_int, P, c_int, P) -> c_int;
    renameat2(c_int, P, c_int, P, c_uint) -> c_int;
    link(P, P) -> c_int;
    linkat(c_int, P, c_int, P, c_int) -> c_int;
    symlink(P, P) -> c_int;
    symlinkat(P, c_int, P) -> c_int;
    readlink(P, *mut c_char, Sz) -> SSz;
    readlinkat(c_int, P, *mut c_char, Sz) -> SSz;
    chmod(P, Mode) -> c_int;
    fchmod(c_int, Mode) -> c_int;
    fchmodat(c_int, P, Mode, c_int) -> c_int;
    chown(P, libc::uid_t, libc::gid_t) -> c_int;
    lchown(P, libc::uid_t, libc::gid_t) -> c_int;
    fchown(c_int, libc::uid_t, libc::gid_t) -> c_int;
    fchownat(c_int, P, libc::uid_t, libc::gid_t, c_int) -> c_int;
    utime(P, *const libc::utimbuf) -> c_int;
    utimes(P, *const libc::timeval) -> c_int;
    lutimes(P, *const libc::timeval) -> c_int;
    futimes(c_int, *const libc::timeval) -> c_int;
    futimesat(c_int, P, *const libc::timeval) -> c_int;
    utimensat(c_int, P, *const libc::timespec, c_int) -> c_int;
    futimens(c_int, *const libc::timespec) -> c_int;
    chdir(P) -> c_int;
    fchdir(c_int) -> c_int;
    getcwd(*mut c_char, Sz) -> *mut c_char;
    get_current_dir_name() -> *mut c_char;
    realpath(P, *mut c_char) -> *mut c_char;
    mknod(P, Mode, libc::dev_t) -> c_int;
    mknodat(c_int, P, Mode, libc::dev_t) -> c_int;
    mkfifo(P, Mode) -> c_int;
    mkfifoat(c_int, P, Mode) -> c_int;
    getxattr(P, P, *mut c_void, Sz) -> SSz;
    lgetxattr(P, P, *mut c_void, Sz) -> SSz;
    fgetxattr(c_int, P, *mut c_void, Sz) -> SSz;
    listxattr(P, *mut c_char, Sz) -> SSz;
    llistxattr(P, *mut c_char, Sz) -> SSz;
    flistxattr(c_int, *mut c_char, Sz) -> SSz;
    setxattr(P, P, *const c_void, Sz, c_int) -> c_int;
    lsetxattr(P, P, *const c_void, Sz, c_int) -> c_int;
    fsetxattr(c_int, P, *const c_void, Sz, c_int) -> c_int;
    removexattr(P, P) -> c_int;
    lremovexattr(P, P) -> c_int;
    fremovexattr(c_int, P) -> c_int;
    umask(Mode) -> Mode;
    opendir(P) -> *mut libc::DIR;
    fdopendir(c_int) -> *mut libc::DIR;
    readdir(*mut libc::DIR) -> *mut libc::dirent;
    readdir64(*mut libc::DIR) -> *mut libc::dirent64;
    readdir_r(*mut libc::DIR, *mut libc::dirent, *mut *mut libc::dirent) -> c_int;
    readdir64_r(*mut libc::DIR, *mut libc::dirent64, *mut *mut libc::dirent64) -> c_int;
    closedir(*mut libc::DIR) -> c_int;
    dirfd(*mut libc::DIR) -> c_int;
    rewinddir(*mut libc::DIR) -> ();
    telldir(*mut libc::DIR) -> c_long;
    seekdir(*mut libc::DIR, c_long) -> ();
    fopen(P, P) -> *mut libc::FILE;
    fopen64(P, P) -> *mut libc::FILE;
    fdopen(c_int, P) -> *mut libc::FILE;
    freopen(P, P, *mut libc::FILE) -> *mut libc::FILE;
    freopen64(P, P, *mut libc::FILE) -> *mut libc::FILE;
    fclose(*mut libc::FILE) -> c_int;
    fileno(*mut libc::FILE) -> c_int;
    fileno_unlocked(*mut libc::FILE) -> c_int;
    execve(P, *const *const c_char, *const *const c_char) -> c_int;
    execvpe(P, *const *const c_char, *const *const c_char) -> c_int;
    fexecve(c_int, *const *const c_char, *const *const c_char) -> c_int;
}

/// posix_spawn and its file actions; the two opaque glibc structures are passed as pointers.
pub type Actions = *mut c_void;
pub type Attr = *const c_void;

reals! {
    posix_spawn(*mut libc::pid_t, P, *const c_void, Attr, *const *mut c_char, *const *mut c_char) -> c_int;
    posix_spawnp(*mut libc::pid_t, P, *const c_void, Attr, *const *mut c_char, *const *mut c_char) -> c_int;
    posix_spawn_file_actions_init(Actions) -> c_int;
    posix_spawn_file_actions_destroy(Actions) -> c_int;
    posix_spawn_file_actions_adddup2(Actions, c_int, c_int) -> c_int;
    posix_spawn_file_actions_addclose(Actions, c_int) -> c_int;
    posix_spawn_file_actions_addopen(Actions, c_int, P, c_int, Mode) -> c_int;
    posix_spawn_file_actions_addclosefrom_np(Actions, c_int) -> c_int;
    posix_spawn_file_actions_addchdir_np(Actions, P) -> c_int;
    posix_spawn_file_actions_addfchdir_np(Actions, c_int) -> c_int;
}

reals! {
    waitpid(libc::pid_t, *mut c_int, c_int) -> libc::pid_t;
    wait(*mut c_int) -> libc::pid_t;
    wait4(libc::pid_t, *mut c_int, c_int, *mut libc::rusage) -> libc::pid_t;
    waitid(libc::idtype_t, libc::id_t, *mut libc::siginfo_t, c_int) -> c_int;
    wait3(*mut c_int, c_int, *mut libc::rusage) -> libc::pid_t;
}
