//! Scratch file systems for the benchmarks: a fresh ext4 on a loop device, and the mount
//! table lookup the benchmarks use to wait for (and clean up) their mounts.
//!
//! Why a fresh ext4: on a long-lived ext4 a create gets slower the more inodes were freed
//! in the last minutes (`recently_deleted()` in ext4's inode allocator, very visible on
//! this machine's journal-less root file system). Whatever a benchmark measures second
//! would inherit the files the first measurement just deleted; a file system of its own
//! gives every measurement the same start.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
}

impl FreshExt4 {
    /// Makes `image` (`bytes` long, sparse; `inodes` inodes, or mkfs's default) and mounts
    /// it on `mnt` (created if missing). Needs root and mkfs.ext4 (Debian: e2fsprogs).
    pub fn new(image: PathBuf, mnt: PathBuf, bytes: u64, inodes: Option<u64>) -> Result<Self> {
        fs::create_dir_all(&mnt).with_context(|| format!("create {}", mnt.display()))?;
        fs::File::create(&image)
            .and_then(|f| f.set_len(bytes))
            .with_context(|| format!("create {}", image.display()))?;
        // From here on, drop cleans up whatever exists.
        let made = FreshExt4 { image, mnt };
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
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg(&self.mnt).status();
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
    }
}
