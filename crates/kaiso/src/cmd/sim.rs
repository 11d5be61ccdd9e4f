//! `kaiso sim`: replay traces or generated workloads through the policy code.
//! The logic lives in `kaiso_sim`; this module parses arguments, shows progress and prints.

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use kaiso_device::DeviceSpec;
use kaiso_policy::cache::{Capacity, Unit, by_name};
use kaiso_sim::replay::cache::{Granularity, parse_size, tier_placement, to_requests};
use kaiso_sim::replay::tier::{Placement, TierConfig, TierResult, TierSpec, Workload, run_tiering};
use kaiso_sim::report::{LineChart, write_csv, write_json};
use kaiso_sim::source::{Generator, Source};
use kaiso_sim::sweep::{CacheSize, SweepPoint, footprint, sweep};
use kaiso_sim::trace::{self, IoRecord, TraceFormat};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct SimArgs {
    #[command(subcommand)]
    pub command: SimCommand,
}

#[derive(Subcommand)]
pub enum SimCommand {
    /// Cache mode: miss ratios of cache policies × cache sizes (a sweep, with a progress bar).
    Cache(CacheArgs),
    /// Tiering mode: a policy over device-modelled tiers; iops, latency, utilisation, moves.
    Tier(TierArgs),
    /// Write a generated workload as a trace file (MSR CSV, oracleGeneral or kaiso).
    Generate(GenerateArgs),
    /// Run the reproduction experiments (002 Tables 4, 7, 8; ch.3) and print their tables.
    Repro(ReproArgs),
    /// The default policy against every baseline over the workloads, winner per workload.
    Suite(SuiteArgs),
}

#[derive(Args)]
pub struct SuiteArgs {
    /// Built-in workloads, comma-separated: usr1, web2, proj2, proj4, tpcxv, files (or "none").
    #[arg(long, default_value = "usr1,web2,proj2,proj4,tpcxv,files")]
    pub workloads: String,
    /// Policies, comma-separated (default: all): hdd-only, fifo, lru, clock, arc, twoq, lirs,
    /// s3fifo, sieve, smq, belady, spike-002, spike-002-persistent, prefetch-la-adaptive,
    /// prefetch-la-fixed, prefetch-lba-fixed, kaiso.
    #[arg(long)]
    pub policies: Option<String>,
    /// Run length: full (the documented figures), quick (minutes), tiny (a smoke test).
    #[arg(long, default_value = "full")]
    pub scale: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also replay these trace files (repeatable), open loop over the 002 drive models.
    #[arg(long)]
    pub trace: Vec<PathBuf>,
    /// Format of the --trace files (default: from each file name).
    #[arg(long)]
    pub format: Option<String>,
    /// Replay speed-up of the --trace files.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Fast tier size for --trace files, as a share of the trace's footprint.
    #[arg(long, default_value_t = 0.1)]
    pub fast_fraction: f64,
    /// The default policy's configuration as a JSON file (docs/policy-default.md keys).
    #[arg(long)]
    pub kaiso_config: Option<PathBuf>,
    /// Overrides of the default policy's keys: key=value,... (numbers or true/false).
    #[arg(long)]
    pub kaiso: Option<String>,
    /// Region size (MiB) the default policy places on the block volumes.
    #[arg(long, default_value_t = 64)]
    pub volume_region: u64,
    /// Write suite.json, suite.csv, suite.md and one SVG per workload here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args)]
pub struct ReproArgs {
    /// 002 (Tables 4, 7 and 8), t4, t7, t8, or ch3.
    pub experiment: String,
    /// Shortened runs (10-minute "hour", 15 s phases) for a quick look.
    #[arg(long)]
    pub quick: bool,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Args, Clone)]
pub struct InputArgs {
    /// Trace file to replay (`-` for standard input).
    #[arg(long, conflicts_with = "generate")]
    pub trace: Option<PathBuf>,
    /// Trace format: msr, blkparse, vscsi, oracle, kaiso (default: from the file name).
    #[arg(long)]
    pub format: Option<String>,
    /// Generated workload instead of a trace: usr1, web2, proj2, proj4, proj4-spike,
    /// proj4-short, tpcxv, files, zipf; parameters as NAME:key=value,...
    #[arg(long)]
    pub generate: Option<String>,
    /// Seed of the generator.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl InputArgs {
    pub fn source(&self) -> Result<Source> {
        match (&self.trace, &self.generate) {
            (Some(path), _) => Ok(Source::File {
                path: path.clone(),
                format: trace_format(self.format.as_deref(), path)?,
            }),
            (None, Some(g)) => Ok(Source::Generated {
                generator: Generator::parse(g).map_err(anyhow::Error::msg)?,
                seed: self.seed,
            }),
            (None, None) => bail!("give --trace FILE or --generate NAME"),
        }
    }
}

/// The format of trace `path`: `--format` if given, else guessed from the file name.
fn trace_format(format: Option<&str>, path: &Path) -> Result<TraceFormat> {
    match format {
        Some(f) => TraceFormat::parse(f).with_context(|| {
            format!(
                "unknown trace format {f:?}; known: {}",
                TraceFormat::NAMES.join(", ")
            )
        }),
        None => TraceFormat::from_path(path).with_context(|| {
            format!(
                "cannot tell the format of {} from its name; pass --format",
                path.display()
            )
        }),
    }
}

fn read_all(source: &Source) -> Result<Vec<IoRecord>> {
    source
        .records()
        .map_err(anyhow::Error::from)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(Into::into)
}

#[derive(Args)]
pub struct CacheArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// Cache policies, comma-separated, each NAME or NAME:key=value (libCacheSim-style).
    #[arg(
        long,
        default_value = "fifo,lru,clock,arc,twoq,lirs,s3fifo,sieve,smq,belady"
    )]
    pub policies: String,
    /// Cache sizes: fractions of the footprint (0.01) or amounts (1000, 64m).
    #[arg(long, default_value = "0.001,0.01,0.1")]
    pub sizes: String,
    /// Object granularity: object, request (libCacheSim's MSR convention) or a block size (4k).
    #[arg(long)]
    pub granularity: Option<String>,
    /// What the capacity counts: objects or bytes.
    #[arg(long, default_value = "objects")]
    pub unit: String,
    /// Requests that warm the cache before counting.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Write results.json, results.csv and miss_ratio.svg here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args)]
pub struct TierArgs {
    #[command(flatten)]
    pub input: InputArgs,
    /// none (slow tier only), spike, spike-persistent, kaiso, prefetch-*, writeback:<cache
    /// policy> (a write-back block cache), or cache:<cache policy> (the baseline deciding
    /// which regions live on the fast tier, e.g. cache:lru, cache:s3fifo, cache:belady).
    #[arg(long, default_value = "spike")]
    pub policy: String,
    /// Fast tier device (hdd, ssd, nvm, link, with :key=value parameters).
    #[arg(long, default_value = "ssd")]
    pub fast: String,
    /// Fast tier capacity (e.g. 6g).
    #[arg(long, default_value = "6g")]
    pub fast_capacity: String,
    /// Slow (home) tier device.
    #[arg(long, default_value = "hdd:capacity_gb=600")]
    pub slow: String,
    /// Region (segment/chunk) size the policy places (1g for the 002 rule).
    #[arg(long, default_value = "1g")]
    pub region: String,
    /// Block size of the writeback cache baseline.
    #[arg(long, default_value = "4k")]
    pub block: String,
    /// Replay speed-up: trace time / speed (as btreplay -x).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Simulated seconds to run (default: until the trace ends).
    #[arg(long)]
    pub horizon: Option<f64>,
    /// Open loop: user requests outstanding at most (a replay tool's queue); 0 = unbounded
    /// (an overloaded disk's backlog then grows without end and starves the mover).
    #[arg(long, default_value_t = 32)]
    pub queue_depth: usize,
    /// Seconds between policy plans.
    #[arg(long, default_value_t = 1.0)]
    pub plan_interval: f64,
    /// Seconds per time-series point.
    #[arg(long, default_value_t = 60.0)]
    pub sample_interval: f64,
    /// Write result.json, series.csv and series.svg here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// Generator spec, as for --generate.
    pub spec: String,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
    /// msr, oracle (block traces are written with one object per 4 KiB block) or kaiso.
    #[arg(long, default_value = "msr")]
    pub format: String,
}

pub fn run(a: SimArgs) -> Result<()> {
    match a.command {
        SimCommand::Cache(c) => cache(c),
        SimCommand::Tier(t) => tier(t),
        SimCommand::Generate(g) => generate(g),
        SimCommand::Repro(r) => repro(r),
        SimCommand::Suite(s) => suite(s),
    }
}

fn bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    pb
}

fn cache(a: CacheArgs) -> Result<()> {
    let source = a.input.source()?;
    let granularity = match &a.granularity {
        Some(g) => Granularity::parse(g).with_context(|| {
            format!("bad granularity {g:?}: object, request or a block size such as 4k")
        })?,
        None => source.default_granularity(),
    };
    let unit = match a.unit.as_str() {
        "objects" => Unit::Objects,
        "bytes" => Unit::Bytes,
        u => bail!("--unit must be objects or bytes, got {u:?}"),
    };
    let sizes = CacheSize::parse_list(&a.sizes).map_err(anyhow::Error::msg)?;
    let policies: Vec<String> = a
        .policies
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    // Check every policy name before the long part.
    for p in &policies {
        let (name, params) = kaiso_sim::sweep::split_policy(p);
        by_name(name, Capacity::objects(1), params).map_err(|e| anyhow::anyhow!("{p}: {e}"))?;
    }
    eprintln!("reading {} …", source.describe());
    let reqs = to_requests(read_all(&source)?, granularity);
    let fp = footprint(&reqs, unit);
    eprintln!("{} requests, footprint {fp} {}", reqs.len(), a.unit);
    let pb = bar((policies.len() * sizes.len()) as u64);
    let window = (reqs.len() as u64 / 100).max(1);
    let points = sweep(
        &reqs,
        &policies,
        &sizes,
        unit,
        a.warmup,
        window,
        |done, _, msg| {
            pb.set_position(done as u64);
            pb.set_message(msg.to_string());
        },
    )
    .map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    print_cache_table(&points);
    if let Some(dir) = &a.out {
        write_cache_outputs(dir, &points, fp)?;
        eprintln!(
            "wrote {}/results.json, results.csv, miss_ratio.svg",
            dir.display()
        );
    }
    Ok(())
}

fn print_cache_table(points: &[SweepPoint]) {
    println!(
        "{:<16} {:>10} {:>12} {:>11} {:>11} {:>12}",
        "policy", "size", "capacity", "miss ratio", "byte miss", "Mreq/s"
    );
    for p in points {
        let r = &p.result;
        println!(
            "{:<16} {:>10} {:>12} {:>11.4} {:>11.4} {:>12.2}",
            r.policy,
            p.size,
            r.capacity,
            r.miss_ratio,
            r.byte_miss_ratio,
            r.requests_per_sec / 1e6
        );
    }
}

fn write_cache_outputs(dir: &Path, points: &[SweepPoint], fp: u64) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_json(&dir.join("results.json"), &points)?;
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            let r = &p.result;
            vec![
                r.policy.clone(),
                p.size.clone(),
                r.capacity.to_string(),
                r.unit.into(),
                r.requests.to_string(),
                format!("{:.6}", r.miss_ratio),
                format!("{:.6}", r.byte_miss_ratio),
                format!("{:.0}", r.requests_per_sec),
            ]
        })
        .collect();
    write_csv(
        &dir.join("results.csv"),
        &[
            "policy",
            "size",
            "capacity",
            "unit",
            "requests",
            "miss_ratio",
            "byte_miss_ratio",
            "requests_per_sec",
        ],
        &rows,
    )?;
    let mut chart = LineChart::new(
        "Miss ratio by cache size",
        &format!("cache size (footprint {fp})"),
        "miss ratio",
    );
    chart.log_x = true;
    let mut names: Vec<&str> = points.iter().map(|p| p.result.policy.as_str()).collect();
    names.dedup();
    names.sort();
    names.dedup();
    for n in names {
        let pts = points
            .iter()
            .filter(|p| p.result.policy == n)
            .map(|p| (p.result.capacity as f64, p.result.miss_ratio))
            .collect();
        chart.add(n, pts);
    }
    chart.write(&dir.join("miss_ratio.svg"))?;
    Ok(())
}

fn size_arg(s: &str, what: &str) -> Result<u64> {
    parse_size(s).with_context(|| format!("bad {what} {s:?}: a size such as 4k, 1g"))
}

fn device(s: &str) -> Result<DeviceSpec> {
    s.parse::<DeviceSpec>()
        .map_err(|e| anyhow::anyhow!("{s}: {e}"))
}

fn tier(a: TierArgs) -> Result<()> {
    let source = a.input.source()?;
    let mut cfg = TierConfig::new(
        vec![
            TierSpec::new(
                "fast",
                device(&a.fast)?,
                size_arg(&a.fast_capacity, "--fast-capacity")?,
            ),
            TierSpec::new("slow", device(&a.slow)?, u64::MAX / 4),
        ],
        size_arg(&a.region, "--region")?,
    );
    cfg.plan_interval = (a.plan_interval.max(0.001) * 1e9) as u64;
    cfg.sample_interval = (a.sample_interval.max(0.001) * 1e9) as u64;
    cfg.horizon = a.horizon.map(|h| (h * 1e9) as u64);
    cfg.max_outstanding = (a.queue_depth > 0).then_some(a.queue_depth);
    let records = source.records()?;
    // A malformed record stops the replay with its error, reported after the run.
    let failure = std::sync::Mutex::new(None);
    let records = records.map_while(|r| match r {
        Ok(r) => Some(r),
        Err(e) => {
            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
            None
        }
    });
    let mut records: Box<dyn Iterator<Item = IoRecord> + '_> = Box::new(records);
    // A cache baseline used as a placement policy; Belady needs the future, so only then
    // are the records collected first (memory proportional to the trace, for the bound).
    let mut cache_placement = None;
    if let Some(spec) = a.policy.strip_prefix("cache:") {
        let name = spec.split(':').next().unwrap_or("").to_ascii_lowercase();
        let fast = cfg.tiers[0].capacity;
        let placement = if matches!(name.as_str(), "belady" | "opt") {
            let all: Vec<IoRecord> = records.collect();
            let p = tier_placement(spec, fast, Some(&all), cfg.region_bytes);
            records = Box::new(all.into_iter());
            p
        } else {
            tier_placement(spec, fast, None, cfg.region_bytes)
        };
        cache_placement = Some(placement.map_err(anyhow::Error::msg)?);
    }
    let workload = Workload::Open {
        records,
        speed: a.speed,
    };
    let spinner = ProgressBar::new_spinner();
    spinner.set_message(format!(
        "replaying {} with {} …",
        source.describe(),
        a.policy
    ));
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let result = if a.policy == "none" {
        run_tiering(&cfg, Placement::HomeOnly, workload, |_| {})
    } else if let Some(p) = cache_placement.as_mut() {
        run_tiering(&cfg, Placement::Policy(p), workload, |_| {})
    } else if let Some(cache) = a.policy.strip_prefix("writeback:") {
        let block = size_arg(&a.block, "--block")?;
        let (name, params) = kaiso_sim::sweep::split_policy(cache);
        let cap = Capacity::bytes(cfg.tiers[0].capacity);
        let mut c = by_name(name, cap, params).map_err(|e| anyhow::anyhow!("{cache}: {e}"))?;
        run_tiering(
            &cfg,
            Placement::WriteBackCache {
                cache: c.as_mut(),
                block,
                future: None,
            },
            workload,
            |_| {},
        )
    } else {
        let mut p = kaiso_sim::policies::placement(&a.policy).map_err(anyhow::Error::msg)?;
        run_tiering(&cfg, Placement::Policy(p.as_mut()), workload, |_| {})
    };
    spinner.finish_and_clear();
    if let Some(e) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(anyhow::Error::from(e).context("replay stopped at a malformed record"));
    }
    print_tier(&result);
    if let Some(dir) = &a.out {
        write_tier_outputs(dir, &result)?;
        eprintln!(
            "wrote {}/result.json, series.csv, series.svg",
            dir.display()
        );
    }
    Ok(())
}

fn print_tier(r: &TierResult) {
    println!("placement        {}", r.placement);
    println!("simulated        {:.0} s", r.simulated_s);
    println!("requests         {}", r.requests);
    println!("iops             {:.1}", r.iops);
    if r.transactions > 0 {
        println!("tps              {:.2}", r.tps);
    }
    println!("fast-tier share  {:.3}", r.hit_ratio);
    println!(
        "latency          mean {:.2} ms  p50 {:.2} ms  p99 {:.2} ms",
        r.latency.mean_ms, r.latency.p50_ms, r.latency.p99_ms
    );
    println!(
        "moved            {} moves, {:.2} GB; fast tier holds {:.2} GB",
        r.moves,
        r.bytes_moved as f64 / 1e9,
        r.fast_tier_used as f64 / 1e9
    );
    for d in &r.devices {
        println!(
            "device {:<9} util {:.3}  iops {:.1}  svctm {:.2} ms  await {:.2} ms",
            d.tier, d.util, d.iops, d.svctm_ms, d.await_ms
        );
    }
}

fn write_tier_outputs(dir: &Path, r: &TierResult) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_json(&dir.join("result.json"), r)?;
    let mut header = vec![
        "end_s".to_string(),
        "iops".into(),
        "tps".into(),
        "hit_ratio".into(),
        "mean_latency_ms".into(),
        "bytes_moved".into(),
    ];
    if let Some(s) = r.series.first() {
        for d in &s.devices {
            header.push(format!("{}_util", d.tier));
            header.push(format!("{}_svctm_ms", d.tier));
        }
    }
    let rows: Vec<Vec<String>> = r
        .series
        .iter()
        .map(|s| {
            let mut row = vec![
                format!("{:.0}", s.end_s),
                format!("{:.2}", s.iops),
                format!("{:.3}", s.tps),
                format!("{:.4}", s.hit_ratio),
                format!("{:.3}", s.mean_latency_ms),
                s.bytes_moved.to_string(),
            ];
            for d in &s.devices {
                row.push(format!("{:.4}", d.util));
                row.push(format!("{:.3}", d.svctm_ms));
            }
            row
        })
        .collect();
    let h: Vec<&str> = header.iter().map(String::as_str).collect();
    write_csv(&dir.join("series.csv"), &h, &rows)?;
    let mut chart = LineChart::new(
        &format!("{}: iops per interval", r.placement),
        "seconds",
        "iops",
    );
    chart.add(
        "user iops",
        r.series.iter().map(|s| (s.end_s, s.iops)).collect(),
    );
    chart.write(&dir.join("series.svg"))?;
    let mut util = LineChart::new(
        &format!("{}: device utilisation", r.placement),
        "seconds",
        "%util / 100",
    );
    if let Some(first) = r.series.first() {
        for (i, d) in first.devices.iter().enumerate() {
            util.add(
                &d.tier,
                r.series
                    .iter()
                    .map(|s| (s.end_s, s.devices[i].util))
                    .collect(),
            );
        }
    }
    util.write(&dir.join("util.svg"))?;
    Ok(())
}

fn generate(a: GenerateArgs) -> Result<()> {
    let g = Generator::parse(&a.spec).map_err(anyhow::Error::msg)?;
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let records = g.records(a.seed);
    match a.format.as_str() {
        "msr" => trace::write_msr_csv(file, records)?,
        "oracle" => {
            let gran = g.default_granularity();
            let mut reqs = Vec::new();
            for r in records {
                kaiso_sim::replay::cache::split(&r, gran, |q| {
                    reqs.push(((q.time / 1_000_000_000) as u32, q.id, q.size))
                });
            }
            trace::write_oracle_general(file, &reqs)?;
        }
        "kaiso" => {
            use std::io::Write;
            let mut w = std::io::BufWriter::new(file);
            // docs/dev/trace-format.md v1; generated records have no path or known size.
            writeln!(
                w,
                "#kaiso-trace v1\n#fields t_ns op object offset len size path"
            )?;
            for r in records {
                let op = match r.op {
                    kaiso_policy::Op::Write => "write",
                    _ => "read",
                };
                writeln!(
                    w,
                    "{} {op} {} {} {} {} ",
                    r.time,
                    r.object,
                    r.offset,
                    r.len,
                    r.offset + r.len
                )?;
            }
            w.flush()?;
        }
        f => bail!("--format must be msr, oracle or kaiso, got {f:?}"),
    }
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

fn repro(a: ReproArgs) -> Result<()> {
    use kaiso_sim::experiments::{Scale, ch3, table4, table7, table8};
    let scale = if a.quick { Scale::QUICK } else { Scale::FULL };
    let spinner = ProgressBar::new_spinner();
    spinner.enable_steady_tick(std::time::Duration::from_millis(200));
    let mut progress = |m: &str| spinner.set_message(m.to_string());
    let tables = match a.experiment.as_str() {
        "002" => vec![
            table4(scale, a.seed, &mut progress),
            table7(scale, a.seed, &mut progress),
            table8(scale, a.seed, &mut progress),
        ],
        "t4" => vec![table4(scale, a.seed, &mut progress)],
        "t7" => vec![table7(scale, a.seed, &mut progress)],
        "t8" => vec![table8(scale, a.seed, &mut progress)],
        "ch3" => ch3(scale, a.seed, &mut progress),
        e => bail!("unknown experiment {e:?}: 002, t4, t7, t8 or ch3"),
    };
    spinner.finish_and_clear();
    for t in tables {
        println!("{}", t.markdown());
    }
    Ok(())
}

fn kaiso_config(a: &SuiteArgs) -> Result<kaiso_policy::default_policy::KaisoConfig> {
    let mut value = match &a.kaiso_config {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str::<serde_json::Value>(&text)
                .with_context(|| format!("{}: not JSON", p.display()))?
        }
        None => serde_json::json!({}),
    };
    if let Some(over) = &a.kaiso {
        let map = value
            .as_object_mut()
            .context("the kaiso configuration must be a JSON object")?;
        for kv in over.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--kaiso: expected key=value, got {kv:?}"))?;
            let v = v.trim();
            let v = match v {
                "true" => serde_json::Value::Bool(true),
                "false" => serde_json::Value::Bool(false),
                n => serde_json::Value::from(
                    n.parse::<f64>()
                        .with_context(|| format!("--kaiso {k}: {n:?} is not a number"))?,
                ),
            };
            map.insert(k.trim().to_string(), v);
        }
    }
    // Integer keys given as 3.0 still parse: serde_json reads 3.0 as a float.
    if let Some(map) = value.as_object_mut() {
        for v in map.values_mut() {
            if let Some(f) = v.as_f64()
                && f.fract() == 0.0
                && (0.0..9.0e15).contains(&f)
            {
                *v = serde_json::Value::from(f as u64);
            }
        }
    }
    let cfg: kaiso_policy::default_policy::KaisoConfig =
        serde_json::from_value(value).context("default policy configuration")?;
    cfg.validate().map_err(|e| anyhow::anyhow!("{}", e.0))?;
    Ok(cfg)
}

fn suite(a: SuiteArgs) -> Result<()> {
    use kaiso_sim::suite::{POLICIES, SuiteScale, SuiteSpec, TraceWorkload, markdown, run_suite};
    let scale = match a.scale.as_str() {
        "full" => SuiteScale::FULL,
        "quick" => SuiteScale::QUICK,
        "tiny" => SuiteScale::TINY,
        s => bail!("--scale must be full, quick or tiny, got {s:?}"),
    };
    let list = |s: &str| -> Vec<String> {
        s.split(',')
            .map(|x| x.trim().to_string())
            .filter(|x| !x.is_empty() && x != "none")
            .collect()
    };
    let mut spec = SuiteSpec::new(scale, a.seed);
    spec.workloads = list(&a.workloads);
    if let Some(p) = &a.policies {
        spec.policies = list(p);
    } else {
        spec.policies = POLICIES.iter().map(|s| s.to_string()).collect();
    }
    spec.kaiso = kaiso_config(&a)?;
    if a.volume_region == 0 || a.volume_region > 1 << 20 {
        bail!("--volume-region must be 1..=1048576 MiB");
    }
    spec.volume_region = a.volume_region << 20;
    for path in &a.trace {
        let format = trace_format(a.format.as_deref(), path)?;
        spec.traces.push(TraceWorkload {
            name: path
                .file_name()
                .map_or("trace".into(), |n| n.to_string_lossy().into_owned()),
            path: path.clone(),
            format,
            speed: a.speed,
            fast_fraction: a.fast_fraction,
        });
    }
    spec.validate().map_err(anyhow::Error::msg)?;
    let pb = bar(spec.runs() as u64);
    let results = run_suite(&spec, &mut |done, _, msg| {
        pb.set_position(done as u64);
        pb.set_message(msg.to_string());
    })
    .map_err(anyhow::Error::msg)?;
    pb.finish_and_clear();
    let md = markdown(&results);
    println!("{md}");
    if let Some(dir) = &a.out {
        write_suite_outputs(dir, &results, &md)?;
        eprintln!(
            "wrote {}/suite.json, suite.csv, suite.md and one SVG per workload",
            dir.display()
        );
    }
    Ok(())
}

fn write_suite_outputs(
    dir: &Path,
    results: &[kaiso_sim::suite::SuiteWorkloadResult],
    md: &str,
) -> Result<()> {
    use kaiso_sim::report::BarChart;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_json(&dir.join("suite.json"), &results)?;
    std::fs::write(dir.join("suite.md"), md)?;
    let mut rows = Vec::new();
    for w in results {
        for r in &w.rows {
            rows.push(vec![
                r.workload.clone(),
                r.policy.clone(),
                r.skipped.clone().unwrap_or_default(),
                format!("{:.3}", r.throughput),
                r.throughput_unit.to_string(),
                format!("{:.5}", r.hit_ratio),
                format!("{:.4}", r.mean_ms),
                format!("{:.4}", r.p99_ms),
                r.bytes_moved.to_string(),
                format!("{:.4}", r.slow_util),
                (Some(&r.policy) == w.winner.as_ref()).to_string(),
            ]);
        }
    }
    write_csv(
        &dir.join("suite.csv"),
        &[
            "workload",
            "policy",
            "skipped",
            "throughput",
            "unit",
            "hit_ratio",
            "mean_ms",
            "p99_ms",
            "bytes_moved",
            "hdd_util",
            "winner",
        ],
        &rows,
    )?;
    for w in results {
        let unit = w.rows.first().map_or("iops", |r| r.throughput_unit);
        let mut chart = BarChart::new(&format!("{}: {unit} by policy", w.workload), unit);
        for r in w.rows.iter().filter(|r| r.skipped.is_none()) {
            chart.add(
                &r.policy,
                r.throughput,
                Some(&r.policy) == w.winner.as_ref(),
            );
        }
        let safe: String = w
            .workload
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        chart.write(&dir.join(format!("suite_{safe}.svg")))?;
    }
    Ok(())
}
