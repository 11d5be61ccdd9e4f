//! Validation against libCacheSim (PyPI `libcachesim`): the same oracleGeneral traces
//! (generated ones, and any real trace the user names) replayed by our policies and by
//! libCacheSim at the same cache sizes in bytes. Miss ratios must agree within
//! [`TOLERANCE`]; replay speeds are measured in the same run, like for like (see
//! [`compare`]).
//!
//! libCacheSim runs out of process through the Python script [`PEER_SCRIPT`] (written to a
//! temporary file), so nothing GPL is linked into kaiso.

use crate::source::Generator;
use crate::trace::write_oracle_general;
use kaiso_policy::cache::{CachePolicy, Capacity, NEVER, Request, by_name};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Largest accepted miss-ratio difference (0.5 percentage points).
pub const TOLERANCE: f64 = 0.005;

/// The policies both simulators have.
pub const SHARED_POLICIES: &[&str] = &[
    "fifo", "lru", "clock", "arc", "twoq", "lirs", "s3fifo", "sieve", "belady",
];

/// Replays an oracleGeneral trace through libcachesim and prints one JSON line per
/// (policy, cache size in bytes): miss ratios, requests, and the wall-clock and thread-CPU
/// seconds of `process_trace` alone (the C++ loop that decodes each record from the
/// memory-mapped file and serves it; opening the reader and building the cache are not
/// timed). Best of `--repeat` by CPU time. Exit code 3: libcachesim is not importable.
pub const PEER_SCRIPT: &str = r#"
import argparse, json, sys, time
NAMES = {"fifo": "FIFO", "lru": "LRU", "clock": "Clock", "arc": "ARC", "twoq": "TwoQ",
         "lirs": "LIRS", "s3fifo": "S3FIFO", "sieve": "Sieve", "belady": "Belady"}
ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--sizes", required=True)
ap.add_argument("--policies", default=",".join(NAMES))
ap.add_argument("--repeat", type=int, default=1)
args = ap.parse_args()
try:
    import libcachesim as lcs
except ImportError as e:
    print(f"libcachesim is not importable: {e}", file=sys.stderr)
    sys.exit(3)
sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
    cls = NAMES.get(name)
    if cls is None or not hasattr(lcs, cls):
        print(json.dumps({"policy": name, "unsupported": True}), flush=True)
        continue
    for size in sizes:
        best = None
        for _ in range(max(1, args.repeat)):
            reader = lcs.TraceReader(args.trace, lcs.TraceType.ORACLE_GENERAL_TRACE)
            n = reader.get_num_of_req()
            cache = getattr(lcs, cls)(cache_size=size)
            t0, c0 = time.perf_counter(), time.thread_time()
            miss, byte_miss = cache.process_trace(reader)
            dt, dc = time.perf_counter() - t0, time.thread_time() - c0
            if best is None or dc < best[3]:
                best = (miss, byte_miss, dt, dc, n)
        miss, byte_miss, dt, dc, n = best
        print(json.dumps({"policy": name, "size": size, "miss_ratio": miss,
                          "byte_miss_ratio": byte_miss, "requests": n, "seconds": dt,
                          "cpu_seconds": dc}), flush=True)
"#;

/// All objects of the generated validation traces have this size, so a cache of k objects
/// is k × SIZE bytes on both sides.
pub const OBJECT_SIZE: u64 = 4096;

/// One oracleGeneral trace both simulators replay.
pub struct ValidationTrace {
    pub name: String,
    pub path: PathBuf,
    pub requests: u64,
    /// Distinct objects.
    pub footprint: u64,
    /// Sum of the distinct objects' sizes (an object's size is its first request's).
    pub footprint_bytes: u64,
}

impl ValidationTrace {
    /// Describes an existing oracleGeneral file (a real trace), named after its file stem.
    pub fn from_file(path: &Path) -> std::io::Result<ValidationTrace> {
        let bytes = std::fs::read(path)?;
        if bytes.len() % RECORD_BYTES != 0 {
            return Err(std::io::Error::other(format!(
                "{}: {} bytes is not a whole number of 24-byte oracleGeneral records \
                 (compressed .zst traces must be decompressed first)",
                path.display(),
                bytes.len()
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let mut footprint_bytes = 0;
        for rec in bytes.chunks_exact(RECORD_BYTES) {
            let r = decode(rec);
            if seen.insert(r.id) {
                footprint_bytes += r.size;
            }
        }
        Ok(ValidationTrace {
            name: path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "trace".to_string()),
            path: path.to_path_buf(),
            requests: (bytes.len() / RECORD_BYTES) as u64,
            footprint: seen.len() as u64,
            footprint_bytes,
        })
    }

    /// Cache size in bytes for a fraction of this trace's footprint (at least one byte).
    pub fn cache_bytes(&self, fraction: f64) -> u64 {
        ((self.footprint_bytes as f64 * fraction) as u64).max(1)
    }

    /// Roughly how many objects `bytes` of cache hold (exact for the generated traces).
    pub fn objects_for(&self, bytes: u64) -> u64 {
        let mean = self.footprint_bytes as f64 / self.footprint.max(1) as f64;
        (bytes as f64 / mean.max(1.0)).round() as u64
    }
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
        reqs.truncate(requests as usize);
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
            footprint_bytes: footprint * OBJECT_SIZE,
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
    cpu_seconds: f64,
    #[serde(default)]
    unsupported: bool,
}

/// Our figure and the peer's for one (trace, policy, cache size).
#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub trace: String,
    pub policy: String,
    /// The cache size both simulators used, in bytes.
    pub cache_bytes: u64,
    /// About how many objects that is (exact for the generated traces).
    pub objects: u64,
    pub ours: f64,
    pub peer: f64,
    /// Requests per wall-clock second (millions).
    pub ours_mreq_s: f64,
    pub peer_mreq_s: f64,
    /// Requests per CPU-second of the replaying thread (millions); 0 when unavailable.
    pub ours_cpu_mreq_s: f64,
    pub peer_cpu_mreq_s: f64,
    /// Why this point is not held to the tolerance (a known libCacheSim limitation).
    pub excluded: Option<&'static str>,
}

/// libCacheSim's LIRS sizes its resident-HIR list as 1% of the cache; below 100 objects
/// that is smaller than one object and it admits nothing (miss ratio 1.0). Ours does the
/// same now that both count bytes, so this only names the effect if it shows up.
pub const LIRS_SMALL_CACHE: &str =
    "LIRS admits nothing below 100 objects (HIR list = 1% of the cache < one object)";

impl Comparison {
    pub fn diff(&self) -> f64 {
        (self.ours - self.peer).abs()
    }

    pub fn agrees(&self) -> bool {
        self.excluded.is_some() || self.diff() <= TOLERANCE
    }

    /// Our speed over the peer's: per CPU-second when both sides have it (robust when other
    /// processes share the cores), else per wall-clock second.
    pub fn speed_ratio(&self) -> f64 {
        if self.ours_cpu_mreq_s > 0.0 && self.peer_cpu_mreq_s > 0.0 {
            self.ours_cpu_mreq_s / self.peer_cpu_mreq_s
        } else {
            self.ours_mreq_s / self.peer_mreq_s.max(1e-9)
        }
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
            // Pinned: the miss counts the tests compare with come from this release.
            "libcachesim==0.3.5",
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

const RECORD_BYTES: usize = 24;

/// Decodes one 24-byte oracleGeneral record (`u32 time, u64 id, u32 size, i64 next`) into a
/// request, as libCacheSim's reader does: time in seconds, −1 or `i64::MAX` = never again.
#[inline(always)]
fn decode(rec: &[u8]) -> Request {
    let u32_at = |at: usize| u32::from_le_bytes(rec[at..at + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |at: usize| u64::from_le_bytes(rec[at..at + 8].try_into().unwrap_or([0; 8]));
    let next = u64_at(16) as i64;
    let mut r = Request::new(
        u64::from(u32_at(0)) * 1_000_000_000,
        u64_at(4),
        u64::from(u32_at(12)),
    );
    r.next_access = if next < 0 || next == i64::MAX {
        NEVER
    } else {
        next as u64
    };
    r
}

/// CPU time of the calling thread in ns: `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, the
/// clock Python's `time.thread_time()` reads on the peer's side (exact, unlike
/// `/proc/thread-self/schedstat`, which lags by up to a scheduler tick).
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec (two 64-bit fields on 64-bit Linux, the
    // only targets kaiso builds for) and the clock id is a Linux constant.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (rc == 0).then(|| t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// What one timed replay of ours measured.
struct OurRun {
    miss_ratio: f64,
    seconds: f64,
    cpu_seconds: Option<f64>,
}

/// Our side of the timed comparison: decode each record of the trace file (held in memory,
/// as libCacheSim's reader maps it) and serve it, counting hits and bytes — the same work
/// libCacheSim's `process_trace` loop does. Building the cache is not timed.
fn replay_records(cache: &mut dyn CachePolicy, trace: &[u8]) -> OurRun {
    let (mut n, mut hits, mut bytes, mut byte_hits) = (0u64, 0u64, 0u64, 0u64);
    let cpu0 = thread_cpu_ns();
    let t0 = Instant::now();
    for rec in trace.chunks_exact(RECORD_BYTES) {
        let req = decode(rec);
        let hit = cache.access(&req);
        n += 1;
        bytes += req.size;
        hits += u64::from(hit);
        byte_hits += if hit { req.size } else { 0 };
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu_seconds = match (cpu0, thread_cpu_ns()) {
        (Some(a), Some(b)) if b > a => Some((b - a) as f64 / 1e9),
        _ => None,
    };
    std::hint::black_box((bytes, byte_hits));
    OurRun {
        miss_ratio: crate::replay::cache::miss_ratio(hits, n),
        seconds,
        cpu_seconds,
    }
}

/// Replay every (policy, cache size in bytes) through ours and the peer and pair the
/// results. Like for like: the same file, the same byte capacity (libCacheSim's default,
/// object sizes counted), both timing only the loop that decodes records already in memory
/// and serves them (libCacheSim: `process_trace` on an opened reader; ours: the loop in
/// `replay_records` over the file's bytes read beforehand), each the best of `repeat` runs
/// by thread CPU time, with wall-clock time reported too.
pub fn compare(
    python: &str,
    trace: &ValidationTrace,
    policies: &[&str],
    cache_bytes: &[u64],
    repeat: u32,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Comparison>, PeerError> {
    let script = std::env::temp_dir().join(format!(
        "kaiso-libcachesim-compare-{}.py",
        std::process::id()
    ));
    std::fs::write(&script, PEER_SCRIPT).map_err(|e| PeerError::Failed(e.to_string()))?;
    progress(&format!("{}: libCacheSim", trace.name));
    let sizes: Vec<String> = cache_bytes.iter().map(u64::to_string).collect();
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
        .map_err(|e| PeerError::Failed(e.to_string()));
    let _ = std::fs::remove_file(&script);
    let out = out?;
    if !out.status.success() {
        return Err(PeerError::Failed(
            String::from_utf8_lossy(&out.stderr).to_string(),
        ));
    }
    let peer: Vec<PeerLine> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let bytes = std::fs::read(&trace.path).map_err(|e| PeerError::Failed(e.to_string()))?;
    let mut result = Vec::new();
    for &p in policies {
        for &size in cache_bytes {
            let Some(peer) = peer
                .iter()
                .find(|l| l.policy == p && !l.unsupported && l.size == size)
            else {
                continue;
            };
            let objects = trace.objects_for(size);
            progress(&format!("{}: {p} @ {objects} objects", trace.name));
            let mut best: Option<OurRun> = None;
            for _ in 0..repeat.max(1) {
                let Ok(mut c) = by_name(p, Capacity::bytes(size), "") else {
                    break;
                };
                let r = replay_records(c.as_mut(), &bytes);
                let key = |r: &OurRun| r.cpu_seconds.unwrap_or(r.seconds);
                if best.as_ref().is_none_or(|b| key(&r) < key(b)) {
                    best = Some(r);
                }
            }
            let Some(ours) = best else { continue };
            let rate = |secs: f64| peer.requests as f64 / secs.max(1e-9) / 1e6;
            let ours_rate = |secs: f64| trace.requests as f64 / secs.max(1e-9) / 1e6;
            result.push(Comparison {
                trace: trace.name.clone(),
                policy: p.to_string(),
                cache_bytes: size,
                objects,
                ours: ours.miss_ratio,
                peer: peer.miss_ratio,
                ours_mreq_s: ours_rate(ours.seconds),
                peer_mreq_s: rate(peer.seconds),
                ours_cpu_mreq_s: ours.cpu_seconds.map_or(0.0, ours_rate),
                peer_cpu_mreq_s: if peer.cpu_seconds > 0.0 {
                    rate(peer.cpu_seconds)
                } else {
                    0.0
                },
                excluded: (p == "lirs"
                    && (ours.miss_ratio - peer.miss_ratio).abs() > TOLERANCE
                    && peer.miss_ratio >= 1.0
                    && objects < 100)
                    .then_some(LIRS_SMALL_CACHE),
            });
        }
    }
    Ok(result)
}

/// The comparison as text: the traces, one row per point (miss ratios, difference in
/// percentage points, both speeds per wall-clock and per CPU second, and the CPU-second
/// ratio), then per policy the geometric-mean and the slowest ratio, and the verdicts.
pub fn report(traces: &[ValidationTrace], policies: &[&str], all: &[Comparison]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    for t in traces {
        let _ = writeln!(
            o,
            "trace {:<22} {:>9} requests {:>8} objects {:>12} bytes footprint",
            t.name, t.requests, t.footprint, t.footprint_bytes
        );
    }
    let _ = writeln!(
        o,
        "\n{:<14} {:<7} {:>8} {:>8} {:>8} {:>6} {:>8} {:>8} {:>8} {:>8} {:>6}",
        "trace",
        "policy",
        "objects",
        "ours",
        "libCS",
        "Δ pp",
        "ours",
        "libCS",
        "ours",
        "libCS",
        "speed"
    );
    let _ = writeln!(
        o,
        "{:<14} {:<7} {:>8} {:>8} {:>8} {:>6} {:>17} {:>17} {:>6}",
        "", "", "(cache)", "miss", "miss", "", "Mreq/s (wall)", "Mreq/cpu-s", "(cpu)"
    );
    for c in all {
        let _ = writeln!(
            o,
            "{:<14} {:<7} {:>8} {:>8.4} {:>8.4} {:>6.3} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>5.2}×{}",
            c.trace,
            c.policy,
            c.objects,
            c.ours,
            c.peer,
            c.diff() * 100.0,
            c.ours_mreq_s,
            c.peer_mreq_s,
            c.ours_cpu_mreq_s,
            c.peer_cpu_mreq_s,
            c.speed_ratio(),
            match (c.excluded, c.diff() <= TOLERANCE) {
                (Some(_), _) => "  (excluded: libCacheSim limitation, see below)",
                (None, true) => "",
                (None, false) => "  DISAGREES",
            }
        );
    }
    let _ = writeln!(
        o,
        "\nspeed ours/libCacheSim by policy (per CPU-second; geometric mean and slowest point):"
    );
    for p in policies {
        let rows: Vec<&Comparison> = all.iter().filter(|c| c.policy == *p).collect();
        let Some(slowest) = rows
            .iter()
            .min_by(|x, y| x.speed_ratio().total_cmp(&y.speed_ratio()))
        else {
            continue;
        };
        let geo = (rows
            .iter()
            .map(|c| c.speed_ratio().max(1e-9).ln())
            .sum::<f64>()
            / rows.len() as f64)
            .exp();
        let _ = writeln!(
            o,
            "  {p:<7} geomean {geo:5.2}×  slowest {:5.2}× ({} @ {} objects)",
            slowest.speed_ratio(),
            slowest.trace,
            slowest.objects
        );
    }
    let slower = all.iter().filter(|c| c.speed_ratio() < 1.0).count();
    let _ = writeln!(
        o,
        "{slower} of {} points slower than libCacheSim per CPU-second",
        all.len()
    );
    let bad = all.iter().filter(|c| !c.agrees()).count();
    let excluded = all.iter().filter(|c| c.excluded.is_some()).count();
    let _ = writeln!(
        o,
        "{} of {} points agree within {:.1} pp; {excluded} excluded",
        all.len() - bad - excluded,
        all.len() - excluded,
        TOLERANCE * 100.0
    );
    if excluded > 0 {
        let _ = writeln!(o, "excluded: {LIRS_SMALL_CACHE}");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_matches_the_streaming_reader() {
        let dir = std::env::temp_dir().join(format!("kaiso-validate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.oracleGeneral");
        let reqs = [(3u32, 7u64 << 44, 4096u64), (5, 9, 512), (9, 7 << 44, 100)];
        write_oracle_general(std::fs::File::create(&path).unwrap(), &reqs).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let ours: Vec<Request> = bytes.chunks_exact(RECORD_BYTES).map(decode).collect();
        let reader: Vec<_> = crate::trace::OracleReader::new(&bytes[..])
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(ours.len(), 3);
        for (q, r) in ours.iter().zip(&reader) {
            assert_eq!(
                (q.id, q.size, q.next_access),
                (r.object, r.len, r.next_access)
            );
        }
        assert_eq!(ours[0].next_access, 2);
        assert_eq!(ours[1].next_access, NEVER);
        let t = ValidationTrace::from_file(&path).unwrap();
        assert_eq!((t.requests, t.footprint, t.footprint_bytes), (3, 2, 4608));
        assert_eq!(t.name, "t");
        std::fs::write(dir.join("bad.oracleGeneral"), [0u8; 25]).unwrap();
        assert!(ValidationTrace::from_file(&dir.join("bad.oracleGeneral")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn thread_cpu_clock_advances_with_work() {
        let Some(a) = thread_cpu_ns() else { return };
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let b = thread_cpu_ns().unwrap_or(0);
        assert!(b > a, "thread CPU clock did not advance ({a} -> {b}, {x})");
    }

    #[test]
    fn replay_counts_misses_like_the_policy() {
        let reqs = [
            (0u32, 1u64, 1u64),
            (0, 2, 1),
            (0, 1, 1),
            (0, 3, 1),
            (0, 2, 1),
        ];
        let mut bytes = Vec::new();
        write_oracle_general(&mut bytes, &reqs).unwrap();
        let mut lru = by_name("lru", Capacity::bytes(2), "").unwrap();
        // 1 2 1(hit) 3(evicts 2) 2(miss): 4 misses of 5.
        let r = replay_records(lru.as_mut(), &bytes);
        assert!((r.miss_ratio - 0.8).abs() < 1e-12);
    }
}
