//! One tier directory, one store. Two stores (different configurations and state
//! directories) naming the same tier directory, or one inside the other's, would each
//! place, move and delete files the other indexes. While a store is open it holds
//! `flock(LOCK_EX)` on each tier root's directory descriptor and `flock(LOCK_SH)` on every
//! directory above it, so a second store refuses to open when its tier is the same
//! directory (exclusive against exclusive), lies inside another store's tier (its shared
//! lock on that tier fails) or contains one (its exclusive lock fails against the other's
//! shared one). Nothing is written into the tree; the locks go with the descriptors, when
//! the store is dropped or its process dies.
//!
//! Directories on network or FUSE file systems are not locked: `flock` there may reach a
//! server (and hang while it is away) or a FUSE daemon. The holder of a conflicting lock is
//! named from this process's own table or from /proc/locks and the holder's descriptors.

use crate::config::TierConfig;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// The locks one store holds; dropping it releases them.
pub(crate) struct TierLocks {
    token: u64,
    _held: Vec<OwnedFd>,
}

impl Drop for TierLocks {
    fn drop(&mut self) {
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|h| h.token != self.token);
    }
}

/// A lock this process holds, so that a conflict between two stores of one process (tests,
/// or a daemon serving several) names the other store exactly.
struct Held {
    token: u64,
    dev: u64,
    ino: u64,
    exclusive: bool,
    state_dir: PathBuf,
    tier_root: PathBuf,
}

static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// File systems whose `flock` is not a local kernel lock: NFS, SMB/CIFS, Ceph, AFS, FUSE.
const REMOTE_MAGICS: &[i64] = &[
    0x6969,      // NFS
    0x517B,      // SMB
    0xFF53_4D42, // CIFS
    0xFE53_4D42, // SMB2
    0x00C3_6400, // Ceph
    0x5346_414F, // AFS
    0x6573_5546, // FUSE
];

/// Take the locks of every tier of the store whose state directory is `state_dir`, or
/// explain in one line which tier is already another store's.
pub(crate) fn lock_tiers(tiers: &[TierConfig], state_dir: &Path) -> Result<TierLocks, String> {
    let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
    let mut locks = TierLocks {
        token,
        _held: Vec::new(),
    };
    for t in tiers {
        let root = std::fs::canonicalize(&t.path).unwrap_or_else(|_| t.path.clone());
        // The tier root itself, exclusively.
        if let Some(fd) = open_dir(&root) {
            match try_flock(&fd, true) {
                Ok(true) => locks.keep(fd, true, state_dir, &root),
                Ok(false) => return Err(conflict(t, &root, &root, true, &fd)),
                Err(e) => {
                    tracing::warn!(tier = %t.name, path = %root.display(), error = %e,
                        "cannot lock the tier directory; another store could use it too")
                }
            }
        }
        // Every directory above it, shared.
        for dir in root.ancestors().skip(1) {
            let Some(fd) = open_dir(dir) else { continue };
            match try_flock(&fd, false) {
                Ok(true) => locks.keep(fd, false, state_dir, &root),
                Ok(false) => return Err(conflict(t, &root, dir, false, &fd)),
                Err(_) => {}
            }
        }
    }
    Ok(locks)
}

impl TierLocks {
    fn keep(&mut self, fd: OwnedFd, exclusive: bool, state_dir: &Path, tier_root: &Path) {
        if let Some((dev, ino)) = fd_identity(&fd) {
            HELD.lock().unwrap_or_else(|e| e.into_inner()).push(Held {
                token: self.token,
                dev,
                ino,
                exclusive,
                state_dir: state_dir.to_path_buf(),
                tier_root: tier_root.to_path_buf(),
            });
        }
        self._held.push(fd);
    }
}

/// A read-only descriptor of the directory `p` (close-on-exec), or None when it cannot be
/// opened (no read permission above the tier, for one) or lies on a file system whose
/// locks are not local.
fn open_dir(p: &Path) -> Option<OwnedFd> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes()).ok()?;
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        return None;
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut sf) } != 0 {
        return None;
    }
    (!REMOTE_MAGICS.contains(&(sf.f_type as i64))).then_some(fd)
}

/// `flock` without waiting: Ok(false) when another open file holds a conflicting lock.
fn try_flock(fd: &OwnedFd, exclusive: bool) -> std::io::Result<bool> {
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        if unsafe { libc::flock(fd.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

fn fd_identity(fd: &OwnedFd) -> Option<(u64, u64)> {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// Who holds the lock that conflicts with ours on a directory.
#[derive(Default)]
struct Holder {
    /// The other store's state directory, when it can be found.
    state_dir: Option<PathBuf>,
    /// The other store's tier root, when known (same process only).
    tier_root: Option<PathBuf>,
    pid: Option<u32>,
    /// The conflicting lock is a shared one: the other store's tier is below the directory.
    shared: bool,
}

/// The one-line refusal: tier `t` (root `root`) cannot take its lock on `locked` (the root
/// itself when `on_root`, else a directory above it).
fn conflict(t: &TierConfig, root: &Path, locked: &Path, on_root: bool, fd: &OwnedFd) -> String {
    let h = fd_identity(fd)
        .map(|(dev, ino)| holder(dev, ino, on_root))
        .unwrap_or_default();
    let who = match (&h.state_dir, h.pid) {
        (Some(s), Some(p)) => format!("another kaiso store (state dir {}, pid {p})", s.display()),
        (Some(s), None) => format!("another kaiso store (state dir {})", s.display()),
        (None, Some(p)) => format!("another kaiso store (pid {p})"),
        (None, None) => "another kaiso store".to_string(),
    };
    let what = match (on_root, h.shared, &h.tier_root) {
        (false, _, _) => format!(
            "lies inside {}, a tier directory of {who}",
            locked.display()
        ),
        (true, true, Some(other)) => {
            format!("contains {}, a tier directory of {who}", other.display())
        }
        (true, true, None) => format!("contains a tier directory of {who}"),
        (true, false, _) => format!("is already a tier directory of {who}"),
    };
    format!(
        "tier {}: directory {} {what}; a tier directory serves one store only",
        t.name,
        root.display()
    )
}

/// Finds the holder of a lock on (dev, ino) conflicting with ours (`exclusive`: we asked
/// for an exclusive lock, so any holder conflicts; else only an exclusive one does).
fn holder(dev: u64, ino: u64, exclusive: bool) -> Holder {
    {
        let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        let mine: Vec<&Held> = held
            .iter()
            .filter(|h| h.dev == dev && h.ino == ino && (exclusive || h.exclusive))
            .collect();
        // An exclusive holder first: it names the same directory.
        if let Some(h) = mine.iter().find(|h| h.exclusive).or(mine.first()) {
            return Holder {
                state_dir: Some(h.state_dir.clone()),
                tier_root: Some(h.tier_root.clone()),
                pid: Some(std::process::id()),
                shared: !h.exclusive,
            };
        }
    }
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    let me = std::process::id();
    let found: Vec<ProcLock> = parse_proc_locks(&locks)
        .into_iter()
        .filter(|l| l.matches(dev, ino) && (exclusive || l.write) && l.pid != me)
        .collect();
    let pick = found.iter().find(|l| l.write).or(found.first());
    let pid = pick.map(|l| l.pid);
    Holder {
        state_dir: pid.and_then(state_dir_of),
        tier_root: None,
        pid,
        shared: pick.is_some_and(|l| !l.write),
    }
}

/// One `FLOCK` line of /proc/locks.
#[derive(Debug, PartialEq, Eq)]
struct ProcLock {
    write: bool,
    pid: u32,
    major: u32,
    minor: u32,
    ino: u64,
}

impl ProcLock {
    fn matches(&self, dev: u64, ino: u64) -> bool {
        self.ino == ino && self.major == libc::major(dev) && self.minor == libc::minor(dev)
    }
}

/// The granted `flock` locks in /proc/locks text (`1: FLOCK  ADVISORY  WRITE 1234
/// 08:01:131074 0 EOF`; device numbers in hex, the inode in decimal; waiters, marked
/// `->`, are skipped).
fn parse_proc_locks(text: &str) -> Vec<ProcLock> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 6 || f[1] != "FLOCK" {
                return None;
            }
            let mut id = f[5].split(':');
            Some(ProcLock {
                write: f[3] == "WRITE",
                pid: f[4].parse().ok()?,
                major: u32::from_str_radix(id.next()?, 16).ok()?,
                minor: u32::from_str_radix(id.next()?, 16).ok()?,
                ino: id.next()?.parse().ok()?,
            })
        })
        .collect()
}

/// The state directory of a kaiso store open in process `pid`: the directory of an open
/// `lock` file next to a `kaiso.db` (the store's own lock). None when the process cannot
/// be inspected (another user's, without privilege) or holds none or several.
fn state_dir_of(pid: u32) -> Option<PathBuf> {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    let mut found: Vec<PathBuf> = fds
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter(|p| p.file_name().is_some_and(|n| n == "lock"))
        .filter_map(|p| p.parent().map(Path::to_path_buf))
        .filter(|d| d.join("kaiso.db").exists())
        .collect();
    found.sort();
    found.dedup();
    (found.len() == 1).then(|| found.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(name: &str, path: &Path) -> TierConfig {
        TierConfig {
            name: name.into(),
            path: path.to_path_buf(),
            capacity: 1 << 30,
            high_watermark: 0.8,
            low_watermark: 0.5,
            device: None,
        }
    }

    #[test]
    fn proc_locks_lines_are_parsed() {
        let text = "1: FLOCK  ADVISORY  WRITE 1234 08:01:131074 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 99 08:01:131074 0 EOF\n\
                    2: POSIX  ADVISORY  READ 333 fd:01:5678 0 EOF\n\
                    3: FLOCK  ADVISORY  READ 77 00:2b:42 0 EOF\n";
        let l = parse_proc_locks(text);
        assert_eq!(
            l,
            vec![
                ProcLock {
                    write: true,
                    pid: 1234,
                    major: 8,
                    minor: 1,
                    ino: 131074
                },
                ProcLock {
                    write: false,
                    pid: 77,
                    major: 0,
                    minor: 0x2b,
                    ino: 42
                },
            ]
        );
        assert!(l[1].matches(libc::makedev(0, 0x2b), 42));
        assert!(!l[1].matches(libc::makedev(0, 0x2b), 43));
    }

    #[test]
    fn same_nested_and_sibling_tier_directories() {
        let d = tempfile::tempdir().unwrap();
        let (a, b, sub) = (
            d.path().join("a"),
            d.path().join("b"),
            d.path().join("a/sub"),
        );
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let (s1, s2) = (d.path().join("s1"), d.path().join("s2"));
        let first = lock_tiers(&[tier("fast", &a)], &s1).expect("first store");
        // The same directory.
        let e = lock_tiers(&[tier("x", &a)], &s2)
            .err()
            .expect("same dir refused");
        assert!(
            e.contains("tier x") && e.contains("is already a tier directory"),
            "{e}"
        );
        assert!(e.contains(&s1.display().to_string()), "{e}");
        // Inside it.
        let e = lock_tiers(&[tier("y", &sub)], &s2)
            .err()
            .expect("inside refused");
        assert!(
            e.contains("lies inside") && e.contains(&s1.display().to_string()),
            "{e}"
        );
        // Containing it.
        let e = lock_tiers(&[tier("z", d.path())], &s2)
            .err()
            .expect("container refused");
        assert!(
            e.contains("contains") && e.contains(&a.display().to_string()),
            "{e}"
        );
        // A sibling is fine, and a refused store left no lock behind.
        let sibling = lock_tiers(&[tier("b", &b)], &s2).expect("sibling");
        drop(first);
        let again = lock_tiers(&[tier("x", &a)], &s2).expect("after the first closed");
        drop((sibling, again));
        assert!(
            HELD.lock()
                .unwrap()
                .iter()
                .all(|h| h.state_dir != s1 && h.state_dir != s2)
        );
    }
}
