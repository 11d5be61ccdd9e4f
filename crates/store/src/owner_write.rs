//! Opening a backing file for the store's own writes (migration fetches) when its mode
//! denies its owner write.
//!
//! A migrated file gets the source's mode when its stub is created (`0444` for a
//! read-only file). A daemon running as root writes into it anyway (`CAP_DAC_OVERRIDE`);
//! one that is not root cannot open it for writing (EACCES), so the fetch fails, although
//! the daemon owns the file (it created it). [`open_write`] then adds `u+w` for the open
//! alone and puts the mode back through the descriptor at once: write permission is
//! checked only at `open(2)`, so the descriptor still writes. Nothing else changes: the
//! final mode is the one the file had. The mode is back before this returns, within the
//! caller's locks; the ctime moves (a chmod), so the caller gets the ctime from before to
//! keep showing clients (`crate::stub::StoreWrite`).
//!
//! Only when the open fails with EACCES and the mode lacks `u+w`: a chmod by a user that
//! does not own the file fails (EPERM) and the original EACCES is returned, as it is for
//! any other denial (a directory's mode, an ACL).

use std::fs::File;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::SystemTime;

/// A backing file opened for writing by [`open_write`].
#[derive(Debug)]
pub(crate) struct OwnerWrite {
    pub file: File,
    /// The file's ctime before [`open_write`] changed its mode (and with it the ctime),
    /// or `None` when it opened as it was.
    pub ctime_before: Option<SystemTime>,
}

/// Opens the existing regular file `path` write-only for the store's own write, adding
/// `u+w` to its mode for the open alone when that mode denies its owner write (see the
/// module).
pub(crate) fn open_write(path: &Path) -> io::Result<OwnerWrite> {
    let denied = match std::fs::OpenOptions::new().write(true).open(path) {
        Ok(file) => {
            return Ok(OwnerWrite {
                file,
                ctime_before: None,
            });
        }
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => e,
        Err(e) => return Err(e),
    };
    let Ok(md) = std::fs::symlink_metadata(path) else {
        return Err(denied);
    };
    let mode = md.mode() & 0o7777;
    if !md.file_type().is_file() || mode & 0o200 != 0 {
        // Denied for another reason than its owner's write bit: chmod would not help.
        return Err(denied);
    }
    let ctime_before = SystemTime::UNIX_EPOCH
        + std::time::Duration::new(md.ctime().max(0) as u64, md.ctime_nsec() as u32);
    if std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o200)).is_err() {
        // Not the owner (EPERM): the denial stands.
        return Err(denied);
    }
    let opened = std::fs::OpenOptions::new().write(true).open(path);
    // Back at once, through the descriptor when there is one (it keeps writing: write
    // permission is checked only at open).
    let restored = match &opened {
        Ok(f) => f.set_permissions(std::fs::Permissions::from_mode(mode)),
        Err(_) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)),
    };
    let file = opened?;
    restored?;
    Ok(OwnerWrite {
        file,
        ctime_before: Some(ctime_before),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// Runs `f` on a thread whose file-system identity is `uid`/`gid` when the test runs
    /// as root (setfsuid drops the file-system capabilities with it), else as it is.
    fn as_owner<T: Send + 'static>(
        uid: u32,
        gid: u32,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let root = unsafe { libc::geteuid() } == 0;
        std::thread::spawn(move || {
            if root {
                unsafe {
                    libc::setfsgid(gid);
                    libc::setfsuid(uid);
                }
            }
            f()
        })
        .join()
        .unwrap()
    }

    /// A scratch directory and a file in it with `mode`, both owned by `owner`.
    fn file_with_mode(mode: u32, owner: (u32, u32)) -> (tempfile::TempDir, std::path::PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(d.path(), Some(owner.0), Some(owner.1)).unwrap();
            std::os::unix::fs::chown(&p, Some(owner.0), Some(owner.1)).unwrap();
            // chown clears nothing here (no set-id bits), but say the mode again.
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        (d, p)
    }

    fn me() -> (u32, u32) {
        if unsafe { libc::geteuid() } == 0 {
            (65534, 65534)
        } else {
            unsafe { (libc::geteuid(), libc::getegid()) }
        }
    }

    #[test]
    fn the_owner_writes_into_its_read_only_file_and_the_mode_stays() {
        let owner = me();
        for mode in [0o444, 0o400, 0o000, 0o555] {
            let (_d, p) = file_with_mode(mode, owner);
            let before = std::fs::metadata(&p).unwrap();
            let q = p.clone();
            let r = as_owner(owner.0, owner.1, move || {
                // What a fetch did before: the plain open is refused.
                let plain = std::fs::OpenOptions::new().write(true).open(&q);
                let plain = plain.map(|_| ()).map_err(|e| e.raw_os_error());
                let mut w = open_write(&q).map_err(|e| e.to_string())?;
                w.file.write_all(b"ab").map_err(|e| e.to_string())?;
                Ok::<_, String>((plain, w.ctime_before))
            });
            let (plain, ctime_before) = r.unwrap_or_else(|e| panic!("mode {mode:o}: {e}"));
            assert_eq!(plain, Err(Some(libc::EACCES)), "mode {mode:o}: plain open");
            let after = std::fs::metadata(&p).unwrap();
            assert_eq!(
                after.mode() & 0o7777,
                mode,
                "mode {mode:o} must be the file's mode again"
            );
            let mut got = Vec::new();
            std::fs::File::open(&p)
                .unwrap()
                .read_to_end(&mut got)
                .unwrap();
            assert_eq!(got, b"ab23456789", "mode {mode:o}: written");
            let was = SystemTime::UNIX_EPOCH
                + std::time::Duration::new(before.ctime() as u64, before.ctime_nsec() as u32);
            assert_eq!(ctime_before, Some(was), "mode {mode:o}: ctime from before");
        }
    }

    #[test]
    fn a_writable_file_opens_as_it_is() {
        let owner = me();
        let (_d, p) = file_with_mode(0o644, owner);
        let q = p.clone();
        let before = std::fs::metadata(&p).unwrap();
        let ctime = as_owner(owner.0, owner.1, move || {
            open_write(&q).unwrap().ctime_before
        });
        assert_eq!(ctime, None);
        let after = std::fs::metadata(&p).unwrap();
        assert_eq!(
            (after.ctime(), after.ctime_nsec()),
            (before.ctime(), before.ctime_nsec()),
            "no chmod when none is needed"
        );
    }

    #[test]
    fn a_file_of_another_user_stays_refused() {
        let owner = me();
        // Owned by someone else than the writer: 0444 of uid 1 (root: of the writer
        // nobody, as root makes it); as a user that is not root, a root-owned file.
        let other = if unsafe { libc::geteuid() } == 0 {
            (1, 1)
        } else {
            (0, 0)
        };
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
        let can_chown = unsafe { libc::geteuid() } == 0;
        if can_chown {
            std::os::unix::fs::chown(d.path(), Some(owner.0), Some(owner.1)).unwrap();
            std::os::unix::fs::chown(&p, Some(other.0), Some(other.1)).unwrap();
        } else {
            eprintln!("not root: the file is the writer's own; nothing to check");
            return;
        }
        let q = p.clone();
        let r = as_owner(owner.0, owner.1, move || {
            open_write(&q).map(|_| ()).map_err(|e| e.raw_os_error())
        });
        assert_eq!(r, Err(Some(libc::EACCES)));
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o7777, 0o444);
        // A missing file is not found, as before.
        let q = d.path().join("missing");
        let r = as_owner(owner.0, owner.1, move || {
            open_write(&q).map(|_| ()).map_err(|e| e.raw_os_error())
        });
        assert_eq!(r, Err(Some(libc::ENOENT)));
    }
}
