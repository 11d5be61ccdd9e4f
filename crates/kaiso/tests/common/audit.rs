//! Helpers of the audit tests: the mover's state through `kaiso status --json`, a bounded
//! poll, deterministic data.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// `kaiso status --json CONFIG` (None when the daemon did not answer).
pub fn status_json(config: &Path) -> Option<serde_json::Value> {
    let out = Command::new(super::kaiso_bin())
        .args(["status", "--json"])
        .arg(config)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    match v {
        serde_json::Value::Array(a) => a.into_iter().next(),
        other => Some(other),
    }
}

/// Files the mover is moving right now.
pub fn moving_files(config: &Path) -> u64 {
    status_json(config)
        .and_then(|s| {
            s.pointer("/mover/moving_files")
                .or_else(|| s.pointer("/status/mover/moving_files"))
                .and_then(|m| m.as_u64())
        })
        .unwrap_or(0)
}

/// Polls `cond` every 20 ms until it holds or `limit` passes; whether it held.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Deterministic test data: byte `i` of stream `seed`.
pub fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2654435761)
                .rotate_left(seed as u32 % 31) as u8
                ^ seed
        })
        .collect()
}

/// Whether tier `tier` (0 = the fastest) of the mounted store is online, as the store's
/// root check (every 100 ms) last saw it and `kaiso status --json` reports it; None when
/// the daemon did not answer.
pub fn tier_online(config: &Path, tier: usize) -> Option<bool> {
    status_json(config)?
        .pointer(&format!("/tiers/{tier}/online"))?
        .as_bool()
}

/// Waits until the store reports tier `tier` online (`online` true) or offline: the
/// condition a test needs after renaming a tier's directory away or back, instead of a
/// sleep that assumes the root check ran meanwhile. Bounded by `limit`; panics saying
/// what was expected.
pub fn wait_tier_online(config: &Path, tier: usize, online: bool, limit: Duration) {
    let mut last = None;
    let held = wait_for(limit, || {
        last = tier_online(config, tier);
        last == Some(online)
    });
    assert!(
        held,
        "tier {tier} of {}: expected the store to report online={online} within {limit:?} \
         (`kaiso status --json`); last seen {last:?}",
        config.display()
    );
}
