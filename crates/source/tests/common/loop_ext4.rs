//! A fresh ext4 file system in an image file, loop-mounted for one test.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A fresh ext4 file system in an image file under a test's directory, loop-mounted;
/// unmounted and removed on drop.
pub struct LoopExt4 {
    image: PathBuf,
    pub mnt: PathBuf,
}

impl LoopExt4 {
    /// `bytes` of ext4 with mkfs's defaults (a journal, its own inode count).
    pub fn new(dir: &Path, bytes: u64) -> Self {
        Self::with_mkfs_args(dir, bytes, &[])
    }

    /// `bytes` of ext4 made with `extra` mkfs.ext4 arguments (`-N 64`: a tiny inode
    /// table, so freed inode numbers must be handed out again).
    pub fn with_mkfs_args(dir: &Path, bytes: u64, extra: &[&str]) -> Self {
        let image = dir.join("fs.ext4");
        let mnt = dir.join("fs-mnt");
        fs::create_dir(&mnt).unwrap();
        fs::File::create(&image).unwrap().set_len(bytes).unwrap();
        let made = LoopExt4 { image, mnt };
        let ok = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
            .args(extra)
            .arg(&made.image)
            .stdin(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mkfs.ext4 failed");
        let ok = Command::new("mount")
            .args(["-t", "ext4", "-o", "loop"])
            .arg(&made.image)
            .arg(&made.mnt)
            .stdin(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount -o loop failed");
        made
    }

    /// Bytes free to unprivileged writers.
    pub fn avail(&self) -> u64 {
        let c = std::ffi::CString::new(self.mnt.as_os_str().as_bytes()).unwrap();
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid NUL-terminated path and a statvfs to fill.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail * st.f_frsize
    }
}

impl Drop for LoopExt4 {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
        let mounted = fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split(' ').nth(4) == Some(&*self.mnt.to_string_lossy()));
        if mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = fs::remove_dir(&self.mnt);
        let _ = fs::remove_file(&self.image);
    }
}

/// Whether this machine can make and mount one: mkfs.ext4 on the PATH and root. Under
/// CI (which installs e2fsprogs and runs as root) a missing piece is a failure.
pub fn available() -> bool {
    let mkfs = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join("mkfs.ext4").is_file()))
        .unwrap_or(false);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !(mkfs && root) {
        assert!(
            std::env::var_os("CI").is_none(),
            "a loop-mounted ext4 needs mkfs.ext4 and root"
        );
        eprintln!("SKIP: a loop-mounted ext4 needs mkfs.ext4 and root");
    }
    mkfs && root
}
