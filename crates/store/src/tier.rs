//! One tier: a directory on some local file system, a hard capacity, watermarks, counters,
//! and an optional emulated device in front of its data path.

use crate::config::TierConfig;
use crate::emulate::Emulator;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct Tier {
    pub cfg: TierConfig,
    pub root: PathBuf,
    /// Bytes of file data (apparent sizes) kaiso accounts to this tier.
    pub used: AtomicU64,
    /// Read/write requests served.
    pub accesses: AtomicU64,
    /// Foreground bytes moved through this tier's data path (for busy estimates).
    pub fg_bytes: AtomicU64,
    pub emu: Option<Emulator>,
    /// (time, busy) snapshot for utilisation estimates.
    pub busy_snap: Mutex<(u64, u64)>,
    pub last_busy: Mutex<f64>,
    /// What `used` may reach before the tier's file system is really full, from the last
    /// [`Tier::refresh_fs_room`]; `u64::MAX` before the first sample or when the file
    /// system cannot tell.
    fs_limit: AtomicU64,
}

impl Tier {
    pub fn new(cfg: TierConfig) -> Result<Tier, String> {
        let emu = match &cfg.device {
            Some(d) => {
                Some(Emulator::new(d).map_err(|e| format!("tier {}: device: {e}", cfg.name))?)
            }
            None => None,
        };
        Ok(Tier {
            root: cfg.path.clone(),
            cfg,
            used: AtomicU64::new(0),
            accesses: AtomicU64::new(0),
            fg_bytes: AtomicU64::new(0),
            emu,
            busy_snap: Mutex::new((0, 0)),
            last_busy: Mutex::new(0.0),
            fs_limit: AtomicU64::new(u64::MAX),
        })
    }

    /// The backing path of a store-relative path on this tier.
    pub fn path(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The hard limit in force: the configured capacity, or less when the tier's file
    /// system has less real room (the disk is smaller than configured, or other data
    /// fills it). Every room check (placement, spills, passthrough reserves, moves) and
    /// the watermarks go through it.
    pub fn capacity(&self) -> u64 {
        self.cfg.capacity.min(self.fs_limit.load(Ordering::Relaxed))
    }

    /// Sample the real free space of the tier's file system (statvfs `f_bavail`, the room
    /// an unprivileged writer has). `pending` is the part of `used` not yet written to the
    /// file system (room reserved for passthrough writers): it is room already promised,
    /// so it does not count twice. The store calls this every second and before each
    /// planning round; between samples the tier's own growth is counted through `used`.
    pub fn refresh_fs_room(&self, pending: u64) {
        let limit = match fs_avail(&self.root) {
            Some(avail) => self.used().saturating_sub(pending).saturating_add(avail),
            None => u64::MAX,
        };
        self.fs_limit.store(limit, Ordering::Relaxed);
    }

    /// Room left under the hard capacity.
    pub fn free(&self) -> u64 {
        self.capacity().saturating_sub(self.used())
    }

    /// Whether `bytes` more fit below the hard capacity.
    pub fn fits(&self, bytes: u64) -> bool {
        self.used().saturating_add(bytes) <= self.capacity()
    }

    /// Whether `bytes` more fit below the high watermark (the placement threshold).
    pub fn fits_below_high(&self, bytes: u64) -> bool {
        (self.used().saturating_add(bytes) as f64)
            <= self.cfg.high_watermark * self.capacity() as f64
    }

    pub fn add_used(&self, delta: i64) {
        if delta >= 0 {
            self.used.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            let d = (-delta) as u64;
            let _ = self
                .used
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                    Some(u.saturating_sub(d))
                });
        }
    }

    /// Emulated service time for one request, if the tier is emulated.
    pub fn emulate(&self, object: u64, offset: u64, len: u64, write: bool) {
        if let Some(e) = &self.emu {
            e.io(object, offset, len, write);
        }
    }

    pub fn emulated(&self) -> bool {
        self.emu.is_some()
    }

    /// Foreground utilisation since the previous call (emulated tiers: the model's %util;
    /// others: 0, since a real device's load is not visible from here).
    pub fn sample_busy(&self) -> f64 {
        let v = match &self.emu {
            Some(e) => {
                let mut s = self.busy_snap.lock().unwrap_or_else(|e| e.into_inner());
                e.busy_fraction(&mut s)
            }
            None => 0.0,
        };
        *self.last_busy.lock().unwrap_or_else(|e| e.into_inner()) = v;
        v
    }

    pub fn busy(&self) -> f64 {
        *self.last_busy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Check a tier directory is usable: exists, is a directory, writable. One-line errors.
pub(crate) fn check_dir(name: &str, p: &Path) -> Result<(), String> {
    let md = std::fs::metadata(p).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            format!("tier {name}: directory {} does not exist", p.display())
        }
        _ => format!("tier {name}: cannot access {}: {e}", p.display()),
    })?;
    if !md.is_dir() {
        return Err(format!("tier {name}: {} is not a directory", p.display()));
    }
    let c = crate::util::cpath(p).map_err(|e| e.to_string())?;
    if unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "tier {name}: directory {} is not writable: {e}",
            p.display()
        ));
    }
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } == 0 && sv.f_flag & libc::ST_RDONLY != 0 {
        return Err(format!(
            "tier {name}: directory {} is on a read-only file system",
            p.display()
        ));
    }
    Ok(())
}

/// Bytes available to unprivileged writers on the file system holding `p` (`None` when
/// statvfs fails or reports no block size).
pub(crate) fn fs_avail(p: &Path) -> Option<u64> {
    let c = crate::util::cpath(p).ok()?;
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        return None;
    }
    let frsize = if sv.f_frsize > 0 {
        sv.f_frsize
    } else {
        sv.f_bsize
    };
    (frsize > 0).then(|| (sv.f_bavail as u64).saturating_mul(frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier_at(path: &Path, capacity: u64) -> Tier {
        Tier::new(TierConfig {
            name: "t".into(),
            path: path.to_path_buf(),
            capacity,
            high_watermark: 0.8,
            low_watermark: 0.5,
            device: None,
        })
        .expect("tier")
    }

    #[test]
    fn capacity_is_the_configured_one_until_the_file_system_is_sampled() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), u64::MAX / 2);
        assert_eq!(t.capacity(), u64::MAX / 2);
        t.refresh_fs_room(0);
        let avail = fs_avail(d.path()).expect("statvfs");
        // The sample and the check can differ by what other programs wrote meanwhile.
        assert!(
            t.capacity() <= avail + (64 << 20),
            "{} vs {avail}",
            t.capacity()
        );
        assert!(t.capacity() < u64::MAX / 2);
        assert_eq!(t.cfg.capacity, u64::MAX / 2);
    }

    #[test]
    fn a_small_configured_capacity_wins_over_a_large_file_system() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), 4096);
        t.refresh_fs_room(0);
        assert_eq!(t.capacity(), 4096);
    }

    #[test]
    fn own_growth_and_pending_reserves_count_against_the_real_room() {
        let d = tempfile::tempdir().expect("tempdir");
        let t = tier_at(d.path(), u64::MAX / 2);
        t.add_used(1 << 30);
        t.refresh_fs_room(1 << 30);
        let before = t.free();
        // The reserve is room already promised: it is not room on top of `avail`.
        let avail = fs_avail(d.path()).expect("statvfs");
        assert!(before <= avail, "{before} > {avail}");
        t.add_used(1 << 20);
        assert_eq!(t.free(), before - (1 << 20));
    }

    #[test]
    fn a_missing_directory_leaves_the_configured_capacity() {
        let t = tier_at(Path::new("/nonexistent/kaiso-tier"), 1 << 40);
        t.refresh_fs_room(0);
        assert_eq!(t.capacity(), 1 << 40);
    }
}
