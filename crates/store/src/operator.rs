//! Operator-facing value types: status, where, explain, pins and manual moves.

use crate::error::FsError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `kaiso status`: one row per tier plus the mover.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StoreStatus {
    pub tiers: Vec<TierStatus>,
    pub mover: MoverStatus,
    pub policy: String,
    pub files: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct TierStatus {
    pub name: String,
    pub path: String,
    /// Bytes of file data kaiso accounts to this tier.
    pub used: u64,
    pub capacity: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
    /// Read/write operations served from this tier since the store opened.
    pub accesses: u64,
    /// Share of all accesses served from this tier (0..1).
    pub access_share: f64,
    /// Foreground utilisation estimate over the last interval (0..1).
    pub busy: f64,
    /// Emulated device kind, if any.
    pub device: Option<String>,
}

/// Whether a tier's root directory is there (see docs/tiering.md *Known limits*: a tier
/// whose directory vanished is offline until it returns). `kaiso status` shows it beside
/// each tier's row; the control socket's status reply carries these fields in each tier's
/// object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct TierHealth {
    pub name: String,
    pub online: bool,
    /// When the root directory was found missing, seconds since the Unix epoch.
    #[serde(default)]
    pub offline_since_unix: Option<u64>,
    /// How long the tier has been offline, in seconds.
    #[serde(default)]
    pub offline_for_secs: Option<u64>,
    /// Files the tier held when its directory vanished: unreachable until it returns.
    #[serde(default)]
    pub unreachable_files: u64,
}

impl crate::Store {
    /// Each tier's health, fastest first (one lock of the vanished-files table).
    pub fn tier_health(&self) -> Vec<TierHealth> {
        let vanished = self.vanished.lock().unwrap_or_else(|e| e.into_inner());
        self.tiers
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let since = t.offline_since();
                let online = t.online();
                TierHealth {
                    name: t.cfg.name.clone(),
                    online,
                    offline_since_unix: since.map(|s| {
                        s.duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs())
                    }),
                    offline_for_secs: since.map(|s| s.elapsed().map_or(0, |d| d.as_secs())),
                    unreachable_files: if online {
                        0
                    } else {
                        vanished.get(&(i as u8)).map_or(0, |v| v.len() as u64)
                    },
                }
            })
            .collect()
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct MoverStatus {
    pub queued_files: u64,
    pub queued_bytes: u64,
    pub moved_files: u64,
    pub moved_bytes: u64,
    pub failed_moves: u64,
    /// Bytes per second over the last interval.
    pub rate: f64,
    /// True while background moves are paused because foreground I/O is busy.
    pub backing_off: bool,
    /// Plans asked of the policy since the store opened.
    #[serde(default)]
    pub plans: u64,
    /// How many of the latest plans in a row had no move (placement has settled when
    /// nothing is queued or moving and this is above zero; `kaiso bench fs` waits for it).
    #[serde(default)]
    pub empty_plans_in_a_row: u64,
    /// Files being moved right now.
    #[serde(default)]
    pub moving_files: u64,
    /// Planned moves waiting for a file's kernel passthrough opens to close.
    #[serde(default)]
    pub waiting_files: u64,
    /// Time background copies spent backing off for foreground I/O, in all, ms.
    #[serde(default)]
    pub backed_off_ms: u64,
}

/// `kaiso where PATH`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Placement {
    pub ino: u64,
    pub kind: String,
    /// For directories: every tier that holds a copy of it; for others: the one tier.
    pub tiers: Vec<String>,
    /// The backing path for display: valid UTF-8 always, with U+FFFD in place of bytes
    /// that are not (see `backing_path_bytes`).
    pub backing_path: String,
    /// The backing path's exact bytes, present only when it is not valid UTF-8 (JSON
    /// strings cannot carry such bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_path_bytes: Option<Vec<u8>>,
    pub size: u64,
    pub pinned: Option<String>,
}

impl Placement {
    /// Sets `backing_path` (lossy display) and, when needed, `backing_path_bytes`.
    pub fn set_backing_path(&mut self, p: &Path) {
        self.backing_path = p.to_string_lossy().into_owned();
        self.backing_path_bytes = match p.to_str() {
            Some(_) => None,
            None => Some(p.as_os_str().as_bytes().to_vec()),
        };
    }

    /// The backing path's exact bytes (from `backing_path_bytes` when present).
    pub fn backing_path_raw(&self) -> &[u8] {
        match &self.backing_path_bytes {
            Some(b) => b,
            None => self.backing_path.as_bytes(),
        }
    }
}

/// A failed operator request: what failed and why, in one line (without the path the
/// operator named, which the caller shows in front of it), and the errno it maps to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpError {
    pub errno: FsError,
    pub message: String,
}

impl OpError {
    pub fn new(errno: FsError, message: impl Into<String>) -> OpError {
        OpError {
            errno,
            message: message.into(),
        }
    }
}

impl fmt::Display for OpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OpError {}

impl From<OpError> for FsError {
    fn from(e: OpError) -> FsError {
        e.errno
    }
}

/// `kaiso explain PATH`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Explanation {
    pub placement: Placement,
    /// The rule that put it where it is (creation rule, move reason, adoption, pin).
    pub rule: String,
    /// The policy's own account (heat, rank, pin, last decision).
    pub policy: String,
}

/// Direction of a manual move.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum Direction {
    /// One tier faster (or to the named tier).
    Promote,
    /// One tier slower (or to the named tier).
    Demote,
}

/// Progress of a manual job (`promote`, `demote`), polled with `Store::job_progress`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct JobProgress {
    pub files_total: u64,
    pub files_done: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    pub failed: u64,
    pub finished: bool,
    /// Last error, if any.
    pub error: Option<String>,
}

/// Result of `fsck`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Default)]
pub struct FsckReport {
    pub files_seen: u64,
    pub dirs_seen: u64,
    /// Files found in tier directories that kaiso had no record of (now adopted).
    pub adopted: u64,
    /// Records whose file had vanished from the tiers (removed from the database).
    pub dropped: u64,
    /// Same path on two tiers: the slower copy was renamed `NAME.kaiso-conflict-TIER`.
    pub conflicts: u64,
    /// Journal entries completed or rolled back.
    pub journal_recovered: u64,
    /// Leftover temporary files of interrupted moves that were removed.
    pub temp_removed: u64,
    /// Accounted bytes per tier after the scan.
    pub used: Vec<(String, u64)>,
}
