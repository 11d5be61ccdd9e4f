//! Scratch file systems for the benchmarks: a fresh ext4 on a loop device, and the mount
//! table lookup the benchmarks use to wait for (and clean up) their mounts.
//!
//! Why a fresh ext4: on a long-lived ext4 a create gets slower the more inodes were freed
//! in the last minutes (`recently_deleted()` in ext4's inode allocator, very visible on
//! this machine's journal-less root file system). Whatever a benchmark measures second
//! would inherit the files the first measurement just deleted; a file system of its own
//! gives every measurement the same start.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicPtr, Ordering};

use anyhow::{Context, Result, bail};

/// Whether `p` is a mount point in this process's mount namespace.
pub fn is_mounted(p: &Path) -> bool {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| Path::new(&m.replace("\\040", " ")) == p)
}

/// A fresh ext4 file system in a sparse image file, mounted on a loop device. Unmounted,
/// and its image and mount point removed, on drop.
pub struct FreshExt4 {
    image: PathBuf,
    mnt: PathBuf,
    /// Its entry in [`LIVE`], if one was free.
    slot: Option<usize>,
}

/// The live scratch file systems' mount points and images, for
/// [`detach_all_from_signal_handler`]. The strings are leaked on purpose: a signal
/// handler may read a pointer just as its file system is dropped, so none is ever freed
/// (a few bytes per file system a benchmark makes).
static LIVE: [(AtomicPtr<libc::c_char>, AtomicPtr<libc::c_char>); 16] = [const {
    (
        AtomicPtr::new(std::ptr::null_mut()),
        AtomicPtr::new(std::ptr::null_mut()),
    )
}; 16];

fn register(mnt: &Path, image: &Path) -> Option<usize> {
    let leak = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .ok()
            .map(CString::into_raw)
    };
    let (m, i) = (leak(mnt)?, leak(image)?);
    for (n, (slot_m, slot_i)) in LIVE.iter().enumerate() {
        if slot_m
            .compare_exchange(std::ptr::null_mut(), m, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            slot_i.store(i, Ordering::SeqCst);
            return Some(n);
        }
    }
    None
}

/// For a SIGINT/SIGTERM handler that is about to let the process die: lazily unmounts
/// every live scratch file system and removes its mount point and image, with
/// async-signal-safe calls only (`umount2(MNT_DETACH)`, `rmdir`, `unlink`; the loop
/// device goes when the detached mount does). A process killed by the signal runs no
/// `Drop`, so without this its loop mounts and images would stay behind.
pub fn detach_all_from_signal_handler() {
    for (mnt, image) in &LIVE {
        let m = mnt.swap(std::ptr::null_mut(), Ordering::SeqCst);
        let i = image.swap(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: non-null pointers come from `CString::into_raw` and are never freed.
        unsafe {
            if !m.is_null() {
                libc::umount2(m, libc::MNT_DETACH);
                libc::rmdir(m);
            }
            if !i.is_null() {
                libc::unlink(i);
            }
        }
    }
}

extern "C" fn detach_all_and_die(sig: libc::c_int) {
    detach_all_from_signal_handler();
    // SAFETY: async-signal-safe calls; the default action then ends the process.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// For a benchmark without a signal handler of its own: on a signal that ends the
/// process ([`ENDING_SIGNALS`]), detach every live scratch file system, then die of the
/// signal as usual.
pub fn install_signal_cleanup() {
    install_cleanup_handler(detach_all_and_die);
}

/// The signals a benchmark cleans up on before it dies: an interrupt or termination, a
/// lost terminal, and the crashes (abort, bad memory access) that would otherwise leave
/// its servers, mounts and loop devices behind.
pub const ENDING_SIGNALS: [libc::c_int; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGABRT,
    libc::SIGSEGV,
    libc::SIGBUS,
];

/// Installs `handler` for every one of [`ENDING_SIGNALS`]. It runs on the thread's
/// alternate signal stack (Rust gives every thread one, so a stack overflow's SIGSEGV can
/// still be handled) and once: the disposition goes back to the default as it starts, so
/// a second crash inside the clean-up ends the process at once. The handler must make only
/// async-signal-safe calls and end by raising the signal again.
pub fn install_cleanup_handler(handler: extern "C" fn(libc::c_int)) {
    for sig in ENDING_SIGNALS {
        // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = handler as libc::sighandler_t;
            action.sa_flags = libc::SA_ONSTACK | libc::SA_RESETHAND;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

impl FreshExt4 {
    /// Makes `image` (`bytes` long, sparse; `inodes` inodes, or mkfs's default) and mounts
    /// it on `mnt` (created if missing). Needs root and mkfs.ext4 (Debian: e2fsprogs).
    pub fn new(image: PathBuf, mnt: PathBuf, bytes: u64, inodes: Option<u64>) -> Result<Self> {
        let made_mnt = !mnt.exists();
        fs::create_dir_all(&mnt).with_context(|| format!("create {}", mnt.display()))?;
        // The mount table names the mount point by its canonical path: drop finds the
        // mount by that name (a relative or symlinked path would never match, and the
        // file system would stay mounted).
        let mnt = fs::canonicalize(&mnt).with_context(|| format!("resolve {}", mnt.display()))?;
        if let Err(e) = fs::File::create(&image).and_then(|f| f.set_len(bytes)) {
            if made_mnt {
                let _ = fs::remove_dir(&mnt);
            }
            return Err(e).with_context(|| format!("create {}", image.display()));
        }
        // From here on, drop cleans up whatever exists.
        let slot = register(&mnt, &image);
        let made = FreshExt4 { image, mnt, slot };
        let mut mkfs = Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F"]);
        if let Some(n) = inodes {
            mkfs.args(["-N", &n.to_string()]);
        }
        // Initialise everything now, so no background zeroing competes with the benchmark.
        let out = mkfs
            .args(["-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .arg(&made.image)
            .stdin(Stdio::null())
            .output()
            .context("run mkfs.ext4 (Debian package e2fsprogs)")?;
        if !out.status.success() {
            bail!(
                "mkfs.ext4 {}: {}",
                made.image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let out = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&made.image)
            .arg(&made.mnt)
            .stdin(Stdio::null())
            .output()
            .context("run mount")?;
        if !out.status.success() {
            bail!(
                "mount -o loop {}: {}",
                made.image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(made)
    }

    /// Where the file system is mounted.
    pub fn path(&self) -> &Path {
        &self.mnt
    }
}

impl Drop for FreshExt4 {
    fn drop(&mut self) {
        if let Some(n) = self.slot {
            LIVE[n].1.store(std::ptr::null_mut(), Ordering::SeqCst);
            LIVE[n].0.store(std::ptr::null_mut(), Ordering::SeqCst);
        }
        if is_mounted(&self.mnt) {
            // "target is busy" is expected here when a store's background threads still
            // hold files for a moment: the lazy unmount below handles it, so stay quiet.
            let _ = Command::new("umount")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = fs::remove_dir(&self.mnt);
        let _ = fs::remove_file(&self.image);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One fresh file system test at a time: the signal handler's cleanup detaches every
    /// live one in the process (only this module's tests make them).
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn the_root_is_mounted_and_a_fresh_directory_is_not() {
        assert!(is_mounted(Path::new("/")));
        let d = tempfile::tempdir().unwrap();
        assert!(!is_mounted(d.path()));
    }

    #[test]
    fn a_fresh_ext4_is_mounted_empty_and_gone_after_drop() {
        if unsafe { libc::geteuid() } != 0 || Command::new("mkfs.ext4").arg("-V").output().is_err()
        {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let _serial = one_at_a_time();
        let d = tempfile::tempdir().unwrap();
        let (image, mnt) = (d.path().join("t.ext4"), d.path().join("mnt"));
        let f = FreshExt4::new(image.clone(), mnt.clone(), 64 << 20, Some(4096)).unwrap();
        assert!(is_mounted(f.path()));
        let names: Vec<_> = fs::read_dir(f.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("lost+found")]);
        fs::write(f.path().join("x"), b"data").unwrap();
        drop(f);
        assert!(!is_mounted(&mnt));
        assert!(!image.exists() && !mnt.exists());
    }

    #[test]
    fn a_fresh_ext4_through_a_symlinked_path_is_unmounted_on_drop() {
        if unsafe { libc::geteuid() } != 0 || Command::new("mkfs.ext4").arg("-V").output().is_err()
        {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let _serial = one_at_a_time();
        let d = tempfile::tempdir().unwrap();
        let real = d.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, d.path().join("link")).unwrap();
        let f = FreshExt4::new(
            d.path().join("t.ext4"),
            d.path().join("link/mnt"),
            64 << 20,
            Some(4096),
        )
        .unwrap();
        let mounted_at = real.join("mnt");
        drop(f);
        let leaked = is_mounted(&mounted_at);
        if leaked {
            let _ = Command::new("umount").arg("-l").arg(&mounted_at).status();
        }
        assert!(!leaked, "{} stayed mounted", mounted_at.display());
        assert!(!mounted_at.exists());
    }

    #[test]
    fn the_signal_handler_cleanup_detaches_and_removes_every_live_one() {
        if unsafe { libc::geteuid() } != 0 || Command::new("mkfs.ext4").arg("-V").output().is_err()
        {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let _serial = one_at_a_time();
        let d = tempfile::tempdir().unwrap();
        let (image, mnt) = (d.path().join("s.ext4"), d.path().join("smnt"));
        let f = FreshExt4::new(image.clone(), mnt.clone(), 64 << 20, Some(4096)).unwrap();
        fs::write(f.path().join("x"), b"data").unwrap();
        detach_all_from_signal_handler();
        let (still_mounted, dir_left, image_left) =
            (is_mounted(&mnt), mnt.exists(), image.exists());
        // What a process killed right after the handler would leave; drop must still be
        // harmless afterwards.
        drop(f);
        assert!(!still_mounted, "still mounted after the handler's cleanup");
        assert!(!dir_left && !image_left, "mount point or image left");
    }

    #[test]
    fn a_crash_signal_still_detaches_every_live_one() {
        if unsafe { libc::geteuid() } != 0 || Command::new("mkfs.ext4").arg("-V").output().is_err()
        {
            eprintln!("skipped: needs root and mkfs.ext4");
            return;
        }
        let _serial = one_at_a_time();
        for sig in [libc::SIGSEGV, libc::SIGABRT, libc::SIGBUS] {
            let d = tempfile::tempdir().unwrap();
            let (image, mnt) = (d.path().join("c.ext4"), d.path().join("cmnt"));
            let f = FreshExt4::new(image.clone(), mnt.clone(), 64 << 20, Some(4096)).unwrap();
            // The child inherits the table of live file systems and shares the mounts; it
            // makes only async-signal-safe calls between fork and its death.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                unsafe {
                    let no_core = libc::rlimit {
                        rlim_cur: 0,
                        rlim_max: 0,
                    };
                    libc::setrlimit(libc::RLIMIT_CORE, &no_core);
                    install_signal_cleanup();
                    libc::raise(sig);
                    libc::_exit(0);
                }
            }
            let mut status = 0;
            assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
            let still_mounted = is_mounted(&mnt);
            drop(f);
            assert!(
                libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == sig,
                "the child must die of signal {sig} after the clean-up, status {status:#x}"
            );
            assert!(
                !still_mounted,
                "signal {sig}: still mounted after the handler"
            );
            assert!(!image.exists(), "signal {sig}: image left");
        }
    }

    #[test]
    fn a_bad_image_place_is_a_clear_error() {
        let d = tempfile::tempdir().unwrap();
        let err = FreshExt4::new(
            d.path().join("no/such/dir/t.ext4"),
            d.path().join("mnt"),
            1 << 20,
            None,
        )
        .err()
        .expect("must fail");
        assert!(format!("{err:#}").contains("no/such/dir/t.ext4"), "{err:#}");
        assert!(
            !d.path().join("mnt").exists(),
            "the mount point made for it is gone"
        );
    }
}
