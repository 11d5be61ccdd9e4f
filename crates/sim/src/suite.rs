//! The policy suite (`kaiso sim suite`): kaiso's default policy and every baseline over
//! the workloads of issue 3, with the same device models, one table row per run and a
//! winner per workload.
//!
//! Workloads (each a named entry; a trace file can be added as another):
//! - `usr1`, `web2`, `proj2`, `proj4`: MSR-like volumes with spikes (002), replayed open
//!   loop at the paper's speed-ups over the paper's drives (10k rpm HDD, X25-E SSD), with the
//!   SSD capacity the 002 rule used on each (Table 4: 6, 27, 23, 23 GB);
//! - `tpcxv`: the TPCx-V-like multi-VM workload (ch.3), closed loop, 16 clients, cache of
//!   13.3 % of the data, 7200 rpm HDD and an NVMe-like SSD; result in transactions/s;
//! - `files`: Zipf(0.9) file workload with cold scans, files laid out back to back on a
//!   7200 rpm HDD, SSD of 5 % of the data.
//!
//! Policies: `hdd-only`; the write-back block caches `fifo lru clock arc twoq lirs s3fifo
//! sieve smq` and `belady` (an offline bound, open loop only) in front of the HDD
//! (flashcache-like, 4 KiB blocks); `spike-002` and `spike-002-persistent` (1 GB segments);
//! `prefetch-la-adaptive`, `prefetch-la-fixed`, `prefetch-lba-fixed` (ch.3, 1 MiB chunks,
//! 3-chunk units; layout-aware needs a file layout, so not on block volumes); `kaiso`.
//!
//! Winner: closed loop, the highest transactions/s; open loop, the highest completed iops
//! (a policy that keeps up with the offered load completes all of it), ties within 1 %
//! broken by the lower mean latency. `belady` is a bound, never a winner.

use crate::experiments::{Ch3, paper_002_devices};
use crate::policies::Shared;
use crate::replay::tier::{
    ObjectLayout, Placement, TierConfig, TierResult, TierSpec, Workload, block_future, run_tiering,
};
use crate::trace::{IoRecord, TraceFormat};
use crate::workload::files::FileWorkloadSpec;
use crate::workload::speed_up;
use crate::workload::tpcxv::TpcxvSpec;
use crate::workload::volume::VolumeSpec;
use kaiso_device::{DeviceSpec, HddParams, ParallelParams};
use kaiso_policy::cache::{Capacity, by_name};
use kaiso_policy::default_policy::{KaisoConfig, KaisoPolicy};
use kaiso_policy::prefetch::{PrefetchConfig, PrefetchPolicy, RateMode, RegionLayout, UnitMode};
use kaiso_policy::spike::{SpikeConfig, SpikePolicy};
use kaiso_policy::time::SECOND;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;

const GB: u64 = 1_000_000_000;
const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const CACHES: &[&str] = &[
    "fifo", "lru", "clock", "arc", "twoq", "lirs", "s3fifo", "sieve", "smq", "belady",
];

/// Every policy the suite knows, in table order.
pub const POLICIES: &[&str] = &[
    "hdd-only",
    "fifo",
    "lru",
    "clock",
    "arc",
    "twoq",
    "lirs",
    "s3fifo",
    "sieve",
    "smq",
    "belady",
    "spike-002",
    "spike-002-persistent",
    "prefetch-la-adaptive",
    "prefetch-la-fixed",
    "prefetch-lba-fixed",
    "kaiso",
];

/// Every built-in workload, in table order.
pub const WORKLOADS: &[&str] = &["usr1", "web2", "proj2", "proj4", "tpcxv", "files"];

/// How long the runs are.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SuiteScale {
    /// Simulated seconds of each volume replay.
    pub volume_s: f64,
    /// TPCx-V phase length and count.
    pub phase_s: f64,
    pub phases: u32,
    /// Files and requests of the file workload.
    pub files: u64,
    pub file_requests: u64,
}

impl SuiteScale {
    /// The figures of docs/policy-default.md.
    pub const FULL: SuiteScale = SuiteScale {
        volume_s: 1200.0,
        phase_s: 60.0,
        phases: 20,
        files: 20_000,
        file_requests: 3_000_000,
    };
    /// A few minutes in release mode.
    pub const QUICK: SuiteScale = SuiteScale {
        volume_s: 300.0,
        phase_s: 15.0,
        phases: 20,
        files: 5_000,
        file_requests: 600_000,
    };
    /// Seconds in a debug build: the test suite's smoke run.
    pub const TINY: SuiteScale = SuiteScale {
        volume_s: 20.0,
        phase_s: 2.0,
        phases: 3,
        files: 300,
        file_requests: 8_000,
    };
}

/// A trace file run as one more workload (open loop, a block volume unless it is a
/// file-level format).
#[derive(Clone, Debug)]
pub struct TraceWorkload {
    pub name: String,
    pub path: PathBuf,
    pub format: TraceFormat,
    pub speed: f64,
    /// Fast tier size as a share of the trace's footprint (distinct 4 KiB blocks).
    pub fast_fraction: f64,
}

/// What to run.
#[derive(Clone, Debug)]
pub struct SuiteSpec {
    pub workloads: Vec<String>,
    pub traces: Vec<TraceWorkload>,
    pub policies: Vec<String>,
    pub scale: SuiteScale,
    pub seed: u64,
    /// The default policy's configuration (the suite sets only `time_scale`, from each
    /// workload's time compression, unless the caller's value differs from 1).
    pub kaiso: KaisoConfig,
    /// Region size of kaiso on block volumes (default 64 MiB).
    pub volume_region: u64,
}

impl SuiteSpec {
    pub fn new(scale: SuiteScale, seed: u64) -> Self {
        SuiteSpec {
            workloads: WORKLOADS.iter().map(|s| s.to_string()).collect(),
            traces: Vec::new(),
            policies: POLICIES.iter().map(|s| s.to_string()).collect(),
            scale,
            seed,
            kaiso: KaisoConfig::default(),
            volume_region: 64 * MIB,
        }
    }

    /// Checks names before the long part.
    pub fn validate(&self) -> Result<(), String> {
        for w in &self.workloads {
            if !WORKLOADS.contains(&w.as_str()) {
                return Err(format!(
                    "unknown suite workload {w:?}; known: {}",
                    WORKLOADS.join(", ")
                ));
            }
        }
        for p in &self.policies {
            if !POLICIES.contains(&p.as_str()) {
                return Err(format!(
                    "unknown suite policy {p:?}; known: {}",
                    POLICIES.join(", ")
                ));
            }
        }
        for t in &self.traces {
            if !(t.speed.is_finite() && t.speed > 0.0) {
                return Err(format!("{}: speed must be positive", t.name));
            }
            if !(t.fast_fraction > 0.0 && t.fast_fraction <= 1.0) {
                return Err(format!("{}: fast fraction must be within (0, 1]", t.name));
            }
        }
        KaisoPolicy::new(self.kaiso.clone())
            .map(|_| ())
            .map_err(|e| e.0)
    }

    /// Number of runs (for a progress bar).
    pub fn runs(&self) -> usize {
        (self.workloads.len() + self.traces.len()) * self.policies.len()
    }
}

/// One run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteRow {
    pub workload: String,
    pub policy: String,
    /// Why the run was skipped (None: it ran).
    pub skipped: Option<String>,
    /// Closed loop: transactions/s; open loop: completed requests/s.
    pub throughput: f64,
    pub throughput_unit: &'static str,
    /// Share of requests served wholly by the fast tier.
    pub hit_ratio: f64,
    pub mean_ms: f64,
    pub p99_ms: f64,
    /// Bytes copied between tiers (moves, cache fills and write-backs).
    pub bytes_moved: u64,
    pub slow_util: f64,
    pub simulated_s: f64,
}

/// One workload's rows and its winner.
#[derive(Clone, Debug, Serialize)]
pub struct SuiteWorkloadResult {
    pub workload: String,
    pub description: String,
    pub rows: Vec<SuiteRow>,
    /// Best policy (not counting `belady`).
    pub winner: Option<String>,
    /// Best baseline other than `kaiso` (and not `belady`), for the "kaiso vs best" column.
    pub best_baseline: Option<String>,
}

/// How to compare two rows: true if `a` beats `b`.
fn beats(a: &SuiteRow, b: &SuiteRow) -> bool {
    let (x, y) = (a.throughput, b.throughput);
    if (x - y).abs() > 0.01 * x.max(y) {
        return x > y;
    }
    a.mean_ms < b.mean_ms
}

fn best<'a>(rows: impl Iterator<Item = &'a SuiteRow>) -> Option<&'a SuiteRow> {
    rows.filter(|r| r.skipped.is_none() && r.policy != "belady")
        .fold(None, |acc: Option<&SuiteRow>, r| match acc {
            Some(b) if !beats(r, b) => Some(b),
            _ => Some(r),
        })
}

impl SuiteWorkloadResult {
    fn finish(mut self) -> Self {
        self.winner = best(self.rows.iter()).map(|r| r.policy.clone());
        self.best_baseline =
            best(self.rows.iter().filter(|r| r.policy != "kaiso")).map(|r| r.policy.clone());
        self
    }

    pub fn row(&self, policy: &str) -> Option<&SuiteRow> {
        self.rows
            .iter()
            .find(|r| r.policy == policy && r.skipped.is_none())
    }
}

/// One workload's environment: devices, sizes, how requests come.
struct Env {
    description: String,
    fast: DeviceSpec,
    fast_capacity: u64,
    slow: DeviceSpec,
    slow_capacity: u64,
    /// Region size of kaiso and the prefetchers; the 002 rule uses `spike_region`.
    region: u64,
    spike_region: u64,
    plan_interval: u64,
    sample_interval: u64,
    horizon: Option<u64>,
    objects: Option<Arc<ObjectLayout>>,
    /// Prefetch chunk layout (file → chunks); None: no file layout (block volume).
    layout: Option<RegionLayout>,
    /// Workload time per simulated second of real life (the kaiso `time_scale`).
    time_scale: f64,
    input: Input,
}

enum Input {
    /// Open loop: records already speed-scaled.
    Open(Arc<Vec<IoRecord>>),
    Closed(Box<Ch3>),
}

fn volume_env(name: &str, scale: &SuiteScale, seed: u64, region: u64) -> Env {
    let (speed, ssd_gb) = match name {
        "usr1" => (8.0, 6),
        "web2" => (8.0, 27),
        "proj2" => (2.0, 23),
        _ => (2.0, 23),
    };
    let mut v = VolumeSpec::preset(name).expect("known preset");
    v.duration_s = scale.volume_s * speed * 1.2;
    let horizon = (scale.volume_s * SECOND as f64) as u64;
    let records: Vec<IoRecord> = speed_up(v.generate(seed), speed)
        .take_while(|r| r.time <= horizon)
        .collect();
    let (hdd, ssd) = paper_002_devices(v.capacity);
    Env {
        description: format!(
            "{name}-like volume ×{speed}, {} GB, open loop, SSD {ssd_gb} GB (002 Table 4)",
            v.capacity / GB
        ),
        fast: ssd,
        fast_capacity: ssd_gb * GB,
        slow: hdd,
        slow_capacity: v.capacity * 2,
        region: region.max(BLOCK),
        spike_region: GB,
        plan_interval: 5 * SECOND,
        sample_interval: 60 * SECOND,
        horizon: Some(horizon),
        objects: None,
        layout: None,
        time_scale: 1.0 / speed,
        input: Input::Open(Arc::new(records)),
    }
}

fn tpcxv_env(scale: &SuiteScale, seed: u64) -> Env {
    let ch3 = Ch3::with_spec(
        TpcxvSpec {
            phase_s: scale.phase_s,
            phases: scale.phases,
            ..TpcxvSpec::default()
        },
        seed,
    );
    let data = ch3.workload.disk_bytes();
    let chunk = ch3.workload.spec.chunk_bytes;
    Env {
        description: format!(
            "TPCx-V-like, {} VMs, {:.1} GiB, {} phases of {} s, closed loop {} clients, SSD 13.3 %",
            ch3.workload.vms(),
            data as f64 / (1u64 << 30) as f64,
            scale.phases,
            scale.phase_s,
            ch3.clients
        ),
        fast: ch3.ssd.clone(),
        fast_capacity: data * 133 / 1000,
        slow: ch3.hdd.clone(),
        slow_capacity: data * 2,
        region: chunk,
        spike_region: chunk,
        plan_interval: SECOND / 2,
        sample_interval: SECOND,
        horizon: None,
        objects: None,
        layout: Some(ch3.layout()),
        // TPCx-V phases last 12 minutes; ours are compressed to `phase_s`.
        time_scale: scale.phase_s / 720.0,
        input: Input::Closed(Box::new(ch3)),
    }
}

fn files_env(scale: &SuiteScale, seed: u64) -> Env {
    let spec = FileWorkloadSpec {
        files: scale.files,
        requests: scale.file_requests,
        // 2 000 requests/s: near the HDD's limit for 64 KiB random reads.
        rate: 2_000.0,
        ..FileWorkloadSpec::default()
    };
    let sizes = spec.file_sizes(seed);
    let objects = ObjectLayout::new(sizes.clone());
    let data = objects.total_bytes();
    let records: Vec<IoRecord> = spec.generate(seed).collect();
    let chunk = MIB;
    let mut layout = RegionLayout::new(chunk).expect("chunk > 0");
    for (file, &size) in sizes.iter().enumerate() {
        for k in 0..size.div_ceil(chunk) {
            layout
                .insert(((file as u64) << 40) | k, file as u64, k * chunk)
                .expect("each chunk once");
        }
    }
    Env {
        description: format!(
            "Zipf({}) over {} files ({:.1} GB) with scans of {} files, {} req/s open loop, SSD 5 %",
            spec.zipf,
            spec.files,
            data as f64 / GB as f64,
            spec.scan_files,
            spec.rate
        ),
        fast: DeviceSpec::Ssd(ParallelParams::ssd()),
        fast_capacity: data / 20,
        slow: DeviceSpec::Hdd(HddParams {
            capacity_bytes: (data * 2).max(GB),
            ..HddParams::default()
        }),
        slow_capacity: data * 4,
        region: 64 * MIB,
        spike_region: 64 * MIB,
        plan_interval: SECOND,
        sample_interval: 10 * SECOND,
        horizon: None,
        objects: Some(Arc::new(objects)),
        layout: Some(layout),
        // The generator's minutes stand for a working day of a file server.
        time_scale: 0.1,
        input: Input::Open(Arc::new(records)),
    }
}

fn trace_env(t: &TraceWorkload) -> Result<Env, String> {
    let stream =
        crate::trace::open(&t.path, t.format).map_err(|e| format!("{}: {e}", t.path.display()))?;
    let mut records = Vec::new();
    for r in stream {
        records.push(r.map_err(|e| format!("{}: {e}", t.path.display()))?);
    }
    let records: Vec<IoRecord> = speed_up(records.into_iter(), t.speed).collect();
    let mut blocks = std::collections::HashSet::new();
    let mut end = 0u64;
    for r in &records {
        end = end.max(r.offset + r.len);
        for b in r.offset / BLOCK..=(r.offset + r.len.max(1) - 1) / BLOCK {
            blocks.insert((r.object, b));
        }
    }
    let footprint = blocks.len() as u64 * BLOCK;
    let fast_capacity = ((footprint as f64 * t.fast_fraction) as u64).max(BLOCK);
    // Regions small enough that the fast tier holds several of them.
    let region = (fast_capacity / 8)
        .clamp(BLOCK * 16, 64 * MIB)
        .next_power_of_two()
        / 2;
    let spike_region = GB.min((fast_capacity / 4).max(region));
    let (hdd, ssd) = paper_002_devices(end.max(GB));
    Ok(Env {
        description: format!(
            "trace {} ×{}, {} requests, footprint {:.2} GB, SSD {:.0} %",
            t.path.display(),
            t.speed,
            records.len(),
            footprint as f64 / GB as f64,
            t.fast_fraction * 100.0
        ),
        fast: ssd,
        fast_capacity,
        slow: hdd,
        slow_capacity: u64::MAX / 4,
        region,
        spike_region,
        plan_interval: SECOND,
        sample_interval: 60 * SECOND,
        horizon: None,
        objects: None,
        layout: None,
        time_scale: 1.0 / t.speed,
        input: Input::Open(Arc::new(records)),
    })
}

impl Env {
    fn config(&self, region: u64) -> TierConfig {
        let mut cfg = TierConfig::new(
            vec![
                TierSpec::new("ssd", self.fast.clone(), self.fast_capacity),
                TierSpec::new("hdd", self.slow.clone(), self.slow_capacity),
            ],
            region,
        );
        cfg.plan_interval = self.plan_interval;
        cfg.sample_interval = self.sample_interval;
        cfg.horizon = self.horizon;
        cfg.object_bytes = self.objects.clone();
        cfg
    }

    fn workload(&self, seed: u64) -> Workload<'_> {
        match &self.input {
            Input::Open(records) => {
                let records = records.clone();
                Workload::Open {
                    records: Box::new((0..records.len()).map(move |i| records[i])),
                    speed: 1.0,
                }
            }
            Input::Closed(ch3) => {
                let w = &ch3.workload;
                Workload::Closed {
                    clients: ch3.clients,
                    think: 0,
                    duration: w.duration_ns(),
                    seed,
                    txn: Box::new(move |rng, now| w.txn(rng, now).ios),
                }
            }
        }
    }

    fn closed(&self) -> bool {
        matches!(self.input, Input::Closed(_))
    }

    /// Runs one policy, or says why it does not apply.
    fn run(&self, policy: &str, spec: &SuiteSpec) -> Result<TierResult, String> {
        let seed = spec.seed;
        if policy == "hdd-only" {
            return Ok(run_tiering(
                &self.config(self.region),
                Placement::HomeOnly,
                self.workload(seed),
                |_| {},
            ));
        }
        if CACHES.contains(&policy) {
            let cfg = self.config(self.region);
            let future = match (&self.input, policy) {
                (Input::Open(records), "belady") => {
                    Some(block_future(records, cfg.region_bytes, BLOCK))
                }
                (Input::Closed(_), "belady") => {
                    return Err("offline bound needs the future, which a closed loop's own latencies decide".into());
                }
                _ => None,
            };
            let mut c = by_name(policy, Capacity::bytes(self.fast_capacity), "")
                .map_err(|e| e.to_string())?;
            return Ok(run_tiering(
                &cfg,
                Placement::WriteBackCache {
                    cache: c.as_mut(),
                    block: BLOCK,
                    future: future.as_deref(),
                },
                self.workload(seed),
                |_| {},
            ));
        }
        match policy {
            "spike-002" | "spike-002-persistent" => {
                let mut p = SpikePolicy::new(SpikeConfig {
                    persistent_io: policy.ends_with("persistent"),
                    ..SpikeConfig::default()
                })?;
                Ok(run_tiering(
                    &self.config(self.spike_region),
                    Placement::Policy(&mut p),
                    self.workload(seed),
                    |_| {},
                ))
            }
            "prefetch-la-adaptive" | "prefetch-la-fixed" | "prefetch-lba-fixed" => {
                let layout_aware = policy.starts_with("prefetch-la-");
                if layout_aware && self.layout.is_none() {
                    return Err("no file layout on a block volume".into());
                }
                let chunk = self.layout.as_ref().map_or(MIB, |l| l.chunk_bytes());
                let cfg = PrefetchConfig {
                    unit_mode: if layout_aware {
                        UnitMode::LayoutAware
                    } else {
                        UnitMode::Lba
                    },
                    rate_mode: if policy.ends_with("adaptive") {
                        RateMode::Adaptive
                    } else {
                        RateMode::Fixed(0.4)
                    },
                    ..PrefetchConfig::default()
                };
                let p = PrefetchPolicy::new(cfg, self.layout.clone().filter(|_| layout_aware))?;
                self.run_feedback(p, chunk, seed, |p, at, n| p.observe_transactions(at, n))
            }
            "kaiso" => {
                let mut cfg = spec.kaiso.clone();
                if cfg.time_scale == 1.0 {
                    cfg.time_scale = self.time_scale;
                }
                let mut p = KaisoPolicy::new(cfg).map_err(|e| e.0)?;
                if self.region == self.layout.as_ref().map_or(0, |l| l.chunk_bytes())
                    && let Some(l) = &self.layout
                {
                    p.set_layout(l.clone());
                }
                self.run_feedback(p, self.region, seed, |_, _, _| {})
            }
            _ => Err(format!("unknown policy {policy:?}")),
        }
    }

    /// A policy run whose policy also hears the closed loop's transactions.
    fn run_feedback<P: kaiso_policy::PlacementPolicy + 'static>(
        &self,
        policy: P,
        region: u64,
        seed: u64,
        feed: impl Fn(&mut P, u64, u64),
    ) -> Result<TierResult, String> {
        let mut shared = Shared::new(policy);
        let handle = shared.handle();
        let cfg = self.config(region);
        let closed = self.closed();
        let interval = cfg.sample_interval as f64 / 1e9;
        Ok(run_tiering(
            &cfg,
            Placement::Policy(&mut shared),
            self.workload(seed),
            |s| {
                if closed {
                    let txns = (s.tps * interval).round() as u64;
                    let mut p = handle.lock().unwrap_or_else(|p| p.into_inner());
                    feed(&mut p, (s.end_s * 1e9) as u64, txns);
                }
            },
        ))
    }
}

fn row(workload: &str, policy: &str, closed: bool, r: &TierResult) -> SuiteRow {
    SuiteRow {
        workload: workload.into(),
        policy: policy.into(),
        skipped: None,
        throughput: if closed { r.tps } else { r.iops },
        throughput_unit: if closed { "tps" } else { "iops" },
        hit_ratio: r.hit_ratio,
        mean_ms: r.latency.mean_ms,
        p99_ms: r.latency.p99_ms,
        bytes_moved: r.bytes_moved,
        slow_util: r.devices.last().map_or(0.0, |d| d.util),
        simulated_s: r.simulated_s,
    }
}

fn skipped(workload: &str, policy: &str, closed: bool, why: String) -> SuiteRow {
    SuiteRow {
        workload: workload.into(),
        policy: policy.into(),
        skipped: Some(why),
        throughput: 0.0,
        throughput_unit: if closed { "tps" } else { "iops" },
        hit_ratio: 0.0,
        mean_ms: 0.0,
        p99_ms: 0.0,
        bytes_moved: 0,
        slow_util: 0.0,
        simulated_s: 0.0,
    }
}

/// Runs the suite; `progress(done, total, message)` after each run.
pub fn run_suite(
    spec: &SuiteSpec,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Vec<SuiteWorkloadResult>, String> {
    spec.validate()?;
    let total = spec.runs();
    let mut done = 0;
    let mut out = Vec::new();
    let mut names: Vec<(String, Option<&TraceWorkload>)> =
        spec.workloads.iter().map(|w| (w.clone(), None)).collect();
    names.extend(spec.traces.iter().map(|t| (t.name.clone(), Some(t))));
    for (name, trace) in names {
        progress(done, total, &format!("{name}: generating"));
        let env = match trace {
            Some(t) => trace_env(t)?,
            None => match name.as_str() {
                "tpcxv" => tpcxv_env(&spec.scale, spec.seed),
                "files" => files_env(&spec.scale, spec.seed),
                v => volume_env(v, &spec.scale, spec.seed, spec.volume_region),
            },
        };
        let mut result = SuiteWorkloadResult {
            workload: name.clone(),
            description: env.description.clone(),
            rows: Vec::new(),
            winner: None,
            best_baseline: None,
        };
        for p in &spec.policies {
            progress(done, total, &format!("{name}: {p}"));
            let r = match env.run(p, spec) {
                Ok(r) => row(&name, p, env.closed(), &r),
                Err(why) => skipped(&name, p, env.closed(), why),
            };
            result.rows.push(r);
            done += 1;
        }
        out.push(result.finish());
    }
    progress(done, total, "done");
    Ok(out)
}

/// The suite as markdown: one table per workload, then the summary of kaiso vs the best
/// baseline.
pub fn markdown(results: &[SuiteWorkloadResult]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for w in results {
        let unit = w.rows.first().map_or("iops", |r| r.throughput_unit);
        let _ = writeln!(s, "### {}: {}\n", w.workload, w.description);
        let _ = writeln!(
            s,
            "| policy | {unit} | hit ratio | mean ms | p99 ms | GB moved | HDD util |\n|---|---|---|---|---|---|---|"
        );
        for r in &w.rows {
            let mark = if Some(&r.policy) == w.winner.as_ref() {
                " **(winner)**"
            } else if r.policy == "belady" {
                " (bound)"
            } else {
                ""
            };
            match &r.skipped {
                Some(why) => {
                    let _ = writeln!(s, "| {} | – | – | – | – | – | n/a: {why} |", r.policy);
                }
                None => {
                    let _ = writeln!(
                        s,
                        "| {}{mark} | {:.1} | {:.3} | {:.2} | {:.1} | {:.2} | {:.2} |",
                        r.policy,
                        r.throughput,
                        r.hit_ratio,
                        r.mean_ms,
                        r.p99_ms,
                        r.bytes_moved as f64 / GB as f64,
                        r.slow_util
                    );
                }
            }
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "### Summary: kaiso vs the best other policy\n\n| workload | winner | best other | kaiso | best other | kaiso vs best |\n|---|---|---|---|---|---|"
    );
    for w in results {
        let (Some(k), Some(b)) = (
            w.row("kaiso"),
            w.best_baseline.as_ref().and_then(|b| w.row(b)),
        ) else {
            continue;
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {:.1} {u} / {:.2} ms | {:.1} {u} / {:.2} ms | {:+.1}% {u}, {:+.1}% mean latency |",
            w.workload,
            w.winner.as_deref().unwrap_or("–"),
            b.policy,
            k.throughput,
            k.mean_ms,
            b.throughput,
            b.mean_ms,
            (k.throughput / b.throughput.max(1e-9) - 1.0) * 100.0,
            (k.mean_ms / b.mean_ms.max(1e-9) - 1.0) * 100.0,
            u = k.throughput_unit,
        );
    }
    s
}
