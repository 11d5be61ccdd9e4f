//! Validation against libCacheSim (PyPI `libcachesim`): the same generated traces, written
//! as oracleGeneral, replayed by our policies and by libCacheSim at the same cache sizes.
//! Miss ratios must agree within [`TOLERANCE`]; replay speeds are measured in the same run.
//!
//! libCacheSim runs out of process through `scripts/libcachesim_compare.py` (embedded here,
//! written to a temporary file), so nothing GPL is linked into kaiso.

use crate::replay::cache::replay_cache;
use crate::source::Generator;
use crate::trace::{OracleReader, write_oracle_general};
use kaiso_policy::cache::{Capacity, Request, by_name};
use serde::{Deserialize, Serialize};
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Largest accepted miss-ratio difference (0.5 percentage points).
pub const TOLERANCE: f64 = 0.005;

/// The policies both simulators have.
pub const SHARED_POLICIES: &[&str] = &[
    "fifo", "lru", "clock", "arc", "twoq", "lirs", "s3fifo", "sieve", "belady",
];

const SCRIPT: &str = include_str!("../../../scripts/libcachesim_compare.py");

/// All objects of the validation traces have this size, so a byte capacity of k × SIZE in
/// libCacheSim is a k-object cache in ours.
pub const OBJECT_SIZE: u64 = 4096;

/// A generated validation trace.
pub struct ValidationTrace {
    pub name: String,
    pub path: PathBuf,
    pub requests: u64,
    pub footprint: u64,
}

/// Write the standard validation traces into `dir`: Zipf(0.8) and Zipf(1.0) objects, a
/// Zipf workload with scans, and the TPCx-V-like block trace in 4 KiB blocks.
pub fn write_traces(dir: &Path, requests: u64, seed: u64) -> std::io::Result<Vec<ValidationTrace>> {
    let objects = (requests / 10).max(100);
    let specs = [
        (
            "zipf0.8",
            format!("zipf:objects={objects},alpha=0.8,requests={requests}"),
        ),
        (
            "zipf1.0",
            format!("zipf:objects={objects},alpha=1.0,requests={requests}"),
        ),
        (
            "zipf-scan",
            format!(
                "zipf:objects={objects},alpha=0.9,requests={requests},scan=0.002,scan_files=100"
            ),
        ),
        (
            "tpcxv-4k",
            format!(
                "tpcxv:tps={},phase=30,phases=20",
                (requests as f64 / 600.0 / 5.0).max(1.0)
            ),
        ),
    ];
    let mut out = Vec::new();
    for (name, spec) in specs {
        let g = Generator::parse(&spec).map_err(std::io::Error::other)?;
        let mut reqs: Vec<(u32, u64, u64)> = Vec::new();
        for r in g.records(seed) {
            crate::replay::cache::split(
                &r,
                crate::replay::cache::Granularity::Block(OBJECT_SIZE),
                |q| {
                    reqs.push(((q.time / 1_000_000_000) as u32, q.id, OBJECT_SIZE));
                },
            );
            if reqs.len() as u64 >= requests {
                break;
            }
        }
        let footprint = reqs
            .iter()
            .map(|r| r.1)
            .collect::<std::collections::HashSet<_>>()
            .len() as u64;
        let path = dir.join(format!("{name}.oracleGeneral"));
        write_oracle_general(std::fs::File::create(&path)?, &reqs)?;
        out.push(ValidationTrace {
            name: name.to_string(),
            path,
            requests: reqs.len() as u64,
            footprint,
        });
    }
    Ok(out)
}

/// One line of the script's output.
#[derive(Clone, Debug, Deserialize)]
struct PeerLine {
    policy: String,
    #[serde(default)]
    size: u64,
    #[serde(default)]
    miss_ratio: f64,
    #[serde(default)]
    requests: u64,
    #[serde(default)]
    seconds: f64,
    #[serde(default)]
    unsupported: bool,
}

/// Our figure and the peer's for one (trace, policy, size).
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub trace: String,
    pub policy: String,
    pub objects: u64,
    pub ours: f64,
    pub peer: f64,
    pub ours_mreq_s: f64,
    pub peer_mreq_s: f64,
    /// Why this point is not held to the tolerance (a known libCacheSim limitation).
    pub excluded: Option<&'static str>,
}

/// libCacheSim's LIRS sizes its resident-HIR list as 1% of the cache *bytes*; below 100
/// objects that is smaller than one object, it logs "object size too large" and admits
/// nothing (miss ratio 1.0). Observed with libcachesim 0.3.5.
pub const LIRS_SMALL_CACHE: &str =
    "libCacheSim LIRS admits nothing below 100 objects (HIR list = 1% of bytes < one object)";

impl Comparison {
    pub fn diff(&self) -> f64 {
        (self.ours - self.peer).abs()
    }
    pub fn agrees(&self) -> bool {
        self.excluded.is_some() || self.diff() <= TOLERANCE
    }
}

/// Why the peer could not be run.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("libcachesim is not installed and `pip install libcachesim` failed: {0}")]
    NotInstalled(String),
    #[error("running the libCacheSim script: {0}")]
    Failed(String),
}

/// Make sure `python3 -c 'import libcachesim'` works, installing it with pip if needed.
pub fn ensure_peer(python: &str) -> Result<(), PeerError> {
    let importable = |p: &str| {
        Command::new(p)
            .args(["-c", "import libcachesim"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if importable(python) {
        return Ok(());
    }
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "libcachesim",
        ])
        .output()
        .map_err(|e| PeerError::NotInstalled(format!("cannot run {python}: {e}")))?;
    if !out.status.success() || !importable(python) {
        return Err(PeerError::NotInstalled(
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
                .to_string(),
        ));
    }
    Ok(())
}

/// Read an oracleGeneral trace into requests (our in-memory replay input).
pub fn load(path: &Path) -> std::io::Result<Vec<Request>> {
    let f = BufReader::new(std::fs::File::open(path)?);
    OracleReader::new(f)
        .map(|r| {
            r.map(|r| Request {
                time: r.time,
                id: r.object,
                size: r.len,
                op: r.op,
                next_access: r.next_access,
            })
            .map_err(std::io::Error::other)
        })
        .collect()
}

/// Replay every (policy, size in objects) through ours and the peer and pair the results.
/// Our speed is the best of `repeat` in-memory replays; the peer's the best of `repeat`
/// `process_trace` calls.
pub fn compare(
    python: &str,
    trace: &ValidationTrace,
    policies: &[&str],
    objects: &[u64],
    repeat: u32,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Comparison>, PeerError> {
    let script = std::env::temp_dir().join(format!(
        "kaiso-libcachesim-compare-{}.py",
        std::process::id()
    ));
    std::fs::write(&script, SCRIPT).map_err(|e| PeerError::Failed(e.to_string()))?;
    progress(&format!("{}: libCacheSim", trace.name));
    let sizes: Vec<String> = objects
        .iter()
        .map(|o| (o * OBJECT_SIZE).to_string())
        .collect();
    let out = Command::new(python)
        .arg(&script)
        .arg(&trace.path)
        .args([
            "--sizes",
            &sizes.join(","),
            "--policies",
            &policies.join(","),
            "--repeat",
            &repeat.to_string(),
        ])
        .output()
        .map_err(|e| PeerError::Failed(e.to_string()))?;
    let _ = std::fs::remove_file(&script);
    if !out.status.success() {
        return Err(PeerError::Failed(
            String::from_utf8_lossy(&out.stderr).to_string(),
        ));
    }
    let peer: Vec<PeerLine> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let reqs = load(&trace.path).map_err(|e| PeerError::Failed(e.to_string()))?;
    let mut result = Vec::new();
    for &p in policies {
        for &k in objects {
            let Some(peer) = peer
                .iter()
                .find(|l| l.policy == p && !l.unsupported && l.size == k * OBJECT_SIZE)
            else {
                continue;
            };
            progress(&format!("{}: {p} @ {k}", trace.name));
            let mut best: Option<(f64, f64)> = None;
            for _ in 0..repeat.max(1) {
                let Ok(mut c) = by_name(p, Capacity::objects(k), "") else {
                    break;
                };
                let r = replay_cache(c.as_mut(), reqs.iter().copied(), 0, 0);
                if best.is_none_or(|b| r.seconds < b.1) {
                    best = Some((r.miss_ratio, r.seconds));
                }
            }
            let Some((ours, secs)) = best else { continue };
            result.push(Comparison {
                trace: trace.name.clone(),
                policy: p.to_string(),
                objects: k,
                ours,
                peer: peer.miss_ratio,
                ours_mreq_s: reqs.len() as f64 / secs.max(1e-9) / 1e6,
                peer_mreq_s: peer.requests as f64 / peer.seconds.max(1e-9) / 1e6,
                excluded: (p == "lirs" && k < 100 && peer.miss_ratio >= 1.0)
                    .then_some(LIRS_SMALL_CACHE),
            });
        }
    }
    Ok(result)
}
