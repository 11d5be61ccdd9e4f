//! The tiering-benefit part of `kaiso bench fs`: a Zipf-skewed read workload over a fast
//! tier and an emulated HDD, against all-fast and all-HDD mounts of the same data.

use super::*;
use kaiso_policy::cache::rng::SplitMix64;

struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0;
        for k in 1..=n {
            acc += 1.0 / (k as f64).powf(s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }
    /// Probability of rank `r` (0-based).
    fn mass(&self, r: usize) -> f64 {
        match r {
            0 => self.cdf[0],
            r if r < self.cdf.len() => self.cdf[r] - self.cdf[r - 1],
            _ => 0.0,
        }
    }

    /// Rank in 0..n from a uniform sample in [0, 1).
    fn sample(&self, u: f64) -> usize {
        self.cdf.partition_point(|c| *c < u).min(self.cdf.len() - 1)
    }
}

/// The skewed read workload: which file each rank is (a seeded permutation, so the hot
/// files are not simply the first ones written), one read of `read_size` at a random
/// aligned offset per request, each through a fresh open with the page cache of the file
/// dropped first so every read reaches the file system.
struct Workload {
    files: Vec<PathBuf>,
    file_size: u64,
    read_size: u64,
    zipf: Zipf,
    rng: SplitMix64,
    buf: Vec<u8>,
}

impl Workload {
    fn new(files: Vec<PathBuf>, file_size: u64, read_size: u64, s: f64, seed: u64) -> Workload {
        let mut rng = SplitMix64::new(seed);
        let mut files = files;
        for i in (1..files.len()).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            files.swap(i, j);
        }
        let n = files.len();
        Workload {
            files,
            file_size,
            read_size: read_size.min(file_size).max(1),
            zipf: Zipf::new(n, s),
            rng,
            buf: vec![0u8; read_size as usize],
        }
    }

    /// One request: the rank of the file it read, its latency, and the time of each of
    /// its steps (open, fadvise, read, close).
    fn request(&mut self) -> Result<Ranked> {
        let rank = self.zipf.sample(self.rng.unit());
        let path = &self.files[rank];
        let slots = (self.file_size / self.read_size).max(1);
        let off = (self.rng.next_u64() % slots) * self.read_size;
        let t = Instant::now();
        let f = fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
        let opened = Instant::now();
        use std::os::fd::AsRawFd;
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let advised = Instant::now();
        let n = self.buf.len();
        f.read_exact_at(&mut self.buf[..n], off)
            .with_context(|| format!("read {}", path.display()))?;
        let read = Instant::now();
        drop(f);
        let closed = Instant::now();
        let us = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e6;
        Ok(Ranked {
            rank,
            us: us(t, closed),
            steps_us: [
                us(t, opened),
                us(opened, advised),
                us(advised, read),
                us(read, closed),
            ],
            at: t,
        })
    }

    /// Run for `secs`: every read, with its rank and times.
    fn run_ranked(&mut self, secs: f64) -> Result<Vec<Ranked>> {
        let end = Instant::now() + Duration::from_secs_f64(secs);
        let mut lat = Vec::new();
        while Instant::now() < end {
            check_interrupt()?;
            lat.push(self.request()?);
        }
        Ok(lat)
    }

    /// Run for `secs`; latencies in microseconds.
    fn run_for(&mut self, secs: u64) -> Result<Vec<f64>> {
        Ok(self
            .run_ranked(secs as f64)?
            .into_iter()
            .map(|r| r.us)
            .collect())
    }
}

/// One read: the rank of its file, its latency and the time of each step (open, fadvise,
/// read, close), in microseconds.
#[derive(Clone, Copy)]
struct Ranked {
    rank: usize,
    us: f64,
    steps_us: [f64; 4],
    /// When it started.
    at: Instant,
}

/// Environment variable naming a file to which the measured reads are written, one per
/// line (configuration, start in µs since the first, rank, open, fadvise, read and close
/// µs), for looking at their time line.
const READS_DUMP_ENV: &str = "KAISO_BENCH_READS";

fn dump_reads(s: f64, sets: &[(&str, &[Ranked])]) -> Result<()> {
    let Some(path) = std::env::var_os(READS_DUMP_ENV) else {
        return Ok(());
    };
    let Some(t0) = sets.iter().flat_map(|(_, v)| v.iter().map(|r| r.at)).min() else {
        return Ok(());
    };
    let mut out = String::new();
    for (name, reads) in sets {
        for r in *reads {
            let [o, f, rd, c] = r.steps_us;
            writeln!(
                out,
                "{s} {name} {:.0} {} {o:.1} {f:.1} {rd:.1} {c:.1}",
                (r.at - t0).as_secs_f64() * 1e6,
                r.rank
            )?;
        }
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| {
            format!(
                "{READS_DUMP_ENV}: cannot open {}",
                Path::new(&path).display()
            )
        })?;
    f.write_all(out.as_bytes())?;
    Ok(())
}

/// Mean time of each step (open, fadvise, read, close) of `reads`, µs.
fn step_means<'a>(reads: impl Iterator<Item = &'a Ranked>) -> [f64; 4] {
    let (mut sum, mut n) = ([0.0; 4], 0usize);
    for r in reads {
        for (s, v) in sum.iter_mut().zip(r.steps_us) {
            *s += v;
        }
        n += 1;
    }
    sum.map(|s| s / n.max(1) as f64)
}

struct LatStats {
    n: usize,
    mean: f64,
    p50: f64,
    p99: f64,
}

fn stats(mut v: Vec<f64>) -> LatStats {
    if v.is_empty() {
        return LatStats {
            n: 0,
            mean: 0.0,
            p50: 0.0,
            p99: 0.0,
        };
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    LatStats {
        n,
        mean: v.iter().sum::<f64>() / n as f64,
        p50: v[n / 2],
        p99: v[(n * 99 / 100).min(n - 1)],
    }
}

fn write_data_set(dir: &Path, n: usize, size: u64, seed: u64) -> Result<Vec<String>> {
    let mut rng = SplitMix64::new(seed ^ 0xda7a);
    let mut buf = vec![0u8; size as usize];
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        check_interrupt()?;
        for c in buf.chunks_mut(8) {
            let v = rng.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
        let rel = format!("d{:02}/file{i:05}", i % 16);
        let p = dir.join(&rel);
        fs::create_dir_all(p.parent().unwrap())?;
        fs::write(&p, &buf).with_context(|| format!("write {}", p.display()))?;
        names.push(rel);
    }
    Ok(names)
}

/// Skews of one bench run: `--zipf-sweep` when given, else `--zipf`.
fn skews(args: &Args) -> Result<Vec<f64>> {
    if args.zipf_sweep.is_empty() {
        return Ok(vec![args.zipf]);
    }
    if let Some(bad) = args
        .zipf_sweep
        .iter()
        .find(|s| !(s.is_finite() && **s >= 0.0))
    {
        bail!("--zipf-sweep: {bad} is not a Zipf exponent (a number >= 0)");
    }
    Ok(args.zipf_sweep.clone())
}

/// The three configurations take turns of a quarter second each while measured, so
/// bursts of load on a shared machine fall on all three alike.
const TURNS_PER_SEC: u64 = 4;

/// The shape of the tiering test.
struct Setup {
    n: usize,
    fsize: u64,
    fast_cap: u64,
    low_wm: f64,
    high_wm: f64,
    warmup: u64,
    /// Longest wait after the warm-up for placement to settle, s.
    settle_max: u64,
    measure: u64,
    /// The tiered store's flash write budget (`promote_dwpd`).
    promote_dwpd: f64,
}

impl Setup {
    /// Files the fast tier holds: under its low watermark, its high watermark (heat
    /// promotions fill up to it), and its hard capacity.
    fn fits(&self) -> [usize; 3] {
        let files = |f: f64| ((self.fast_cap as f64 * f) as u64 / self.fsize) as usize;
        [files(self.low_wm), files(self.high_wm), files(1.0)]
    }
}

/// One skew's measurements.
struct SkewRow {
    s: f64,
    all_fast: LatStats,
    tiered: LatStats,
    all_slow: LatStats,
    /// Tiered reads of files that were on the fast tier / on the slow tier at the end.
    fast_served: LatStats,
    slow_served: LatStats,
    /// Mean µs of each step (open, fadvise, read, close) of the all-fast reads and of the
    /// tiered reads of fast-tier files.
    steps_all_fast: [f64; 4],
    steps_fast_served: [f64; 4],
    /// Files on the fast tier at the end, and the share of reads they draw.
    on_fast: usize,
    kaiso_share: f64,
    /// Popularity ranks (0-based) of the files on the fast tier at the end.
    fast_ranks: Vec<usize>,
    /// Moves (files, bytes) during the warm-up and during the measured window.
    moves_warm: Option<(u64, u64)>,
    moves_measured: Option<(u64, u64)>,
    /// uptime's 1-minute load average at the start and end of the measurement.
    load: (f64, f64),
    /// How the wait for settled placement after the warm-up ended.
    settle: Settle,
}

fn load_average_1min() -> f64 {
    fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// The mover's counters (files, bytes moved since mount) of the store mounted with `cfg`,
/// through `kaiso status CONFIG --json` (the running daemon's control socket).
fn moved_so_far(cfg: &Path) -> Option<(u64, u64)> {
    let m = mover_status(cfg)?;
    Some((m["moved_files"].as_u64()?, m["moved_bytes"].as_u64()?))
}

/// The `mover` part of `kaiso status CONFIG --json` of the running daemon.
fn mover_status(cfg: &Path) -> Option<serde_json::Value> {
    let out = Command::new(std::env::current_exe().ok()?)
        .arg("status")
        .arg(cfg)
        .arg("--json")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["mover"].take())
}

/// Plans in a row with no move before placement counts as settled (plans come every
/// 500 ms in the bench's stores).
const SETTLED_EMPTY_PLANS: u64 = 3;

/// Whether the mover's status says placement has settled: nothing queued, being moved or
/// waiting for passthrough handles to close (a waiting move counts as handed out, so plans
/// stay empty meanwhile), and the latest [`SETTLED_EMPTY_PLANS`] plans empty. None if the
/// daemon does not report plans (an older binary); a daemon without waiting moves counts
/// none.
fn placement_settled(mover: &serde_json::Value) -> Option<bool> {
    let empty = mover["empty_plans_in_a_row"].as_u64()?;
    let waiting = mover["waiting_files"].as_u64().unwrap_or(0);
    let busy = mover["queued_files"].as_u64()? + mover["moving_files"].as_u64()? + waiting;
    Some(busy == 0 && empty >= SETTLED_EMPTY_PLANS)
}

/// How the wait for settled placement ended.
#[derive(Clone, Debug, PartialEq)]
enum Settle {
    /// Settled this many seconds after the warm-up ended.
    After(f64),
    /// Still moving when the bound ran out: the last status seen.
    GaveUp { secs: f64, last: String },
    /// The daemon did not say.
    Unknown,
}

impl Settle {
    fn text(&self) -> String {
        match self {
            Settle::After(s) => format!(
                "placement settled {s:.1} s after the warm-up (mover idle, {SETTLED_EMPTY_PLANS} \
                 plans in a row empty)"
            ),
            Settle::GaveUp { secs, last } => format!(
                "placement had NOT settled {secs:.0} s after the warm-up; measured anyway \
                 (last mover status: {last})"
            ),
            Settle::Unknown => "placement settling unknown (the daemon reports no plans)".into(),
        }
    }
}

fn mover_summary(m: &serde_json::Value) -> String {
    let n = |k: &str| m[k].as_u64().map_or("?".into(), |v| v.to_string());
    format!(
        "queued {}, moving {}, waiting {}, empty plans in a row {}, moved {}, failed {}",
        n("queued_files"),
        n("moving_files"),
        n("waiting_files"),
        n("empty_plans_in_a_row"),
        n("moved_files"),
        n("failed_moves")
    )
}

/// UTC time of day now, `HH:MM:SS.mmm` (to line the bench's phases up with the daemon's
/// log, whose times are UTC).
fn utc_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let s = d.as_secs() % 86_400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        s / 3600,
        s / 60 % 60,
        s % 60,
        d.subsec_millis()
    )
}

/// Environment variable naming a file to which the tiered store's daemon log is appended
/// after each skew: its plans with each file's heat, the hottest files every plan, and
/// every move started, skipped or finished, after the bench's own phase times.
const TIER_LOG_ENV: &str = "KAISO_BENCH_TIER_LOG";

/// The tiered daemon's log filter when [`TIER_LOG_ENV`] is set.
const TIER_LOG_FILTER: &str = "warn,kaiso_store::mover=info,kaiso_store::plan=debug";

fn save_tier_log(work: &WorkDir, tag: &str, phases: &[(String, String)]) -> Result<()> {
    let Some(path) = std::env::var_os(TIER_LOG_ENV) else {
        return Ok(());
    };
    let mut out = String::new();
    writeln!(out, "=== kaiso bench fs: tiered store {tag}")?;
    for (what, at) in phases {
        writeln!(out, "=== {at} UTC {what}")?;
    }
    out.push_str(&fs::read_to_string(work.root.join(format!("{tag}.log"))).unwrap_or_default());
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("{TIER_LOG_ENV}: cannot open {}", Path::new(&path).display()))?;
    f.write_all(out.as_bytes())?;
    Ok(())
}

fn delta(a: Option<(u64, u64)>, b: Option<(u64, u64)>) -> Option<(u64, u64)> {
    let (a, b) = (a?, b?);
    Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1)))
}

/// Copy every file named in `names` from `from` to `to` (same relative paths).
fn copy_data_set(from: &Path, to: &Path, names: &[String]) -> Result<()> {
    for rel in names {
        check_interrupt()?;
        let d = to.join(rel);
        fs::create_dir_all(d.parent().unwrap_or(to))?;
        fs::copy(from.join(rel), &d).with_context(|| format!("copy {}", d.display()))?;
    }
    Ok(())
}

/// Put every file the tiered mount left on the fast tier back on the slow tier, so the
/// next skew starts, like the first, with everything on the HDD.
fn reset_tiers(fast: &Path, slow: &Path) -> Result<()> {
    for p in files_under(fast) {
        let rel = p.strip_prefix(fast)?;
        let d = slow.join(rel);
        fs::create_dir_all(d.parent().unwrap_or(slow))?;
        fs::rename(&p, &d).with_context(|| format!("move {} back", p.display()))?;
    }
    fs::remove_dir_all(fast)?;
    fs::create_dir_all(fast)?;
    Ok(())
}

pub(super) fn tiering(args: &Args, work: &WorkDir, report: &mut String) -> Result<()> {
    let data = args
        .tier_data
        .unwrap_or(if args.quick { 160 * MIB } else { 512 * MIB });
    let fsize = args.tier_file_size.max(4096);
    let n = (data / fsize).max(10) as usize;
    let setup = Setup {
        n,
        fsize,
        fast_cap: (n as u64 * fsize) / 10,
        low_wm: 0.8,
        high_wm: 0.95,
        warmup: args.warmup.unwrap_or(if args.quick { 25 } else { 60 }),
        settle_max: args.settle_max.unwrap_or(if args.quick { 30 } else { 60 }),
        measure: args
            .measure
            .unwrap_or(if args.quick { 8 } else { 20 })
            .max(1),
        promote_dwpd: args.tier_promote_dwpd,
    };
    if !(setup.promote_dwpd.is_finite() && setup.promote_dwpd >= 0.0) {
        bail!(
            "--tier-promote-dwpd: {} is not a number of drive writes per day (>= 0)",
            setup.promote_dwpd
        );
    }
    let skews = skews(args)?;
    println!(
        "\ntiering: {n} files x {} KiB, Zipf s={}, {} KiB reads; fast tier {} MiB (10% of the data, \
         watermarks {}/{}, flash write budget {} drive writes/day); slow tier emulated {}; \
         warm-up {} s, then {} s per configuration measured in turns of 1/4 s",
        fsize / 1024,
        skews
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(","),
        args.read_size / 1024,
        setup.fast_cap / MIB,
        setup.low_wm,
        setup.high_wm,
        setup.promote_dwpd,
        args.slow_device,
        setup.warmup,
        setup.measure,
    );
    // Three copies of the data: the tiered store's slow tier (everything starts there),
    // and one each for the all-fast and all-slow stores, so that all three are mounted at
    // once and measured in alternating 1 s turns (a shared, loaded machine then weighs on
    // each configuration alike).
    let slow = work.sub("slow")?;
    let fast = work.sub("fast")?;
    let ref_fast = work.sub("ref-fast")?;
    let ref_slow = work.sub("ref-slow")?;
    let names = write_data_set(&slow, n, fsize, args.seed)?;
    copy_data_set(&slow, &ref_fast, &names)?;
    copy_data_set(&slow, &ref_slow, &names)?;
    let dirs = Dirs {
        slow: &slow,
        fast: &fast,
        ref_fast: &ref_fast,
        ref_slow: &ref_slow,
    };
    let mut rows = Vec::new();
    for (i, &s) in skews.iter().enumerate() {
        if i > 0 {
            reset_tiers(&fast, &slow)?;
        }
        rows.push(run_skew(args, work, &setup, &dirs, &names, s, i)?);
    }
    let t = render(args, &setup, &rows)?;
    println!("{t}");
    report.push_str(&t);
    Ok(())
}

/// Mounts the tiered store: the bench's usual configuration (mover planning every
/// 500 ms) plus the fast tier's flash write budget.
fn mount_tiered(
    work: &WorkDir,
    tag: &str,
    setup: &Setup,
    tiers: &[BenchTier],
    extra: &[String],
) -> Result<Mounted> {
    let state = work.sub(&format!("state-{tag}"))?;
    let cfg = work.root.join(format!("{tag}.toml"));
    write_config(&cfg, &state, tiers, 500)?;
    let mut text = fs::read_to_string(&cfg)?;
    writeln!(text, "\n[policy]\npromote_dwpd = {:?}", setup.promote_dwpd)?;
    fs::write(&cfg, text).with_context(|| format!("write {}", cfg.display()))?;
    let filter = std::env::var_os(TIER_LOG_ENV).map(|_| TIER_LOG_FILTER);
    start_kaiso_mount_logging(work, tag, &cfg, extra, filter)
}

struct Dirs<'a> {
    slow: &'a Path,
    fast: &'a Path,
    ref_fast: &'a Path,
    ref_slow: &'a Path,
}

fn run_skew(
    args: &Args,
    work: &WorkDir,
    setup: &Setup,
    dirs: &Dirs,
    names: &[String],
    s: f64,
    i: usize,
) -> Result<SkewRow> {
    let big = setup.n as u64 * setup.fsize * 4;
    println!("  Zipf s = {s}:");
    let extra = kaiso_mount_args(args);
    let one = |tag: &str, path: &Path, device: Option<&str>| -> Result<Mounted> {
        mount_kaiso_with(
            work,
            &format!("{tag}-{i}"),
            &[BenchTier {
                name: tag,
                path,
                capacity: big,
                device,
                watermarks: None,
            }],
            500,
            &extra,
        )
    };
    let m_fast = one("fast", dirs.ref_fast, None)?;
    // `--slow-device none`: the slow tier is a plain directory too (a control run: the
    // tiered mount without the emulated device's slow requests).
    let slow_device = (args.slow_device != "none").then_some(args.slow_device.as_str());
    let m_slow = one("slow", dirs.ref_slow, slow_device)?;
    let tag = format!("tiered-{i}");
    let m_tiered = mount_tiered(
        work,
        &tag,
        setup,
        &[
            BenchTier {
                name: "fast",
                path: dirs.fast,
                capacity: setup.fast_cap,
                device: None,
                watermarks: Some((setup.low_wm, setup.high_wm)),
            },
            BenchTier {
                name: "slow",
                path: dirs.slow,
                capacity: big,
                device: slow_device,
                watermarks: None,
            },
        ],
        &extra,
    )?;
    let cfg = work.root.join(format!("{tag}.toml"));
    let workload = |m: &Mounted| {
        let files = names.iter().map(|r| m.path.join(r)).collect();
        Workload::new(files, setup.fsize, args.read_size, s, args.seed)
    };
    let (mut w_fast, mut w_slow, mut w_tiered) =
        (workload(&m_fast), workload(&m_slow), workload(&m_tiered));
    // Warm-up: the tiered store learns the heat and promotes; the other two only settle.
    let mut phases = vec![("warm-up starts".to_string(), utc_now())];
    let moved0 = moved_so_far(&cfg);
    let t = Instant::now();
    let mut last = Instant::now();
    while t.elapsed() < Duration::from_secs(setup.warmup) {
        let l = stats(w_tiered.run_for(1)?);
        if last.elapsed() >= Duration::from_secs(5) {
            println!(
                "   tiered warm-up {:>3} s: mean {:.0} us, {} files moved",
                t.elapsed().as_secs(),
                l.mean,
                moved_so_far(&cfg).map_or("?".into(), |m| m.0.to_string())
            );
            last = Instant::now();
        }
    }
    // Then, still reading, wait (bounded) until placement has settled: measuring while
    // promotions are still under way would charge the policy for the mover's backlog.
    phases.push((
        "warm-up ends; waiting for placement to settle".into(),
        utc_now(),
    ));
    let settle = wait_settled(&mut w_tiered, &cfg, setup.settle_max)?;
    println!("   {}", settle.text());
    phases.push((settle.text(), utc_now()));
    w_fast.run_for(2)?;
    w_slow.run_for(2)?;
    let moved1 = moved_so_far(&cfg);
    phases.push(("measured window starts".into(), utc_now()));
    println!(
        "   measured window starts {} UTC",
        phases[phases.len() - 1].1
    );
    let load0 = load_average_1min();
    let (mut l_fast, mut l_slow, mut l_tiered) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..setup.measure * TURNS_PER_SEC {
        let turn = 1.0 / TURNS_PER_SEC as f64;
        l_fast.extend(w_fast.run_ranked(turn)?);
        l_tiered.extend(w_tiered.run_ranked(turn)?);
        l_slow.extend(w_slow.run_ranked(turn)?);
    }
    let moved2 = moved_so_far(&cfg);
    let load1 = load_average_1min();
    phases.push(("measured window ends".into(), utc_now()));
    drop(m_tiered);
    save_tier_log(work, &tag, &phases)?;
    drop(m_fast);
    drop(m_slow);
    // Which ranks ended up on the fast tier.
    let on_fast: std::collections::HashSet<PathBuf> = files_under(dirs.fast)
        .into_iter()
        .filter_map(|p| p.strip_prefix(dirs.fast).ok().map(Path::to_path_buf))
        .collect();
    let ranked = Workload::new(
        names.iter().map(PathBuf::from).collect(),
        setup.fsize,
        args.read_size,
        s,
        args.seed,
    );
    let fast_rank: Vec<bool> = ranked.files.iter().map(|f| on_fast.contains(f)).collect();
    let fast_ranks: Vec<usize> = (0..setup.n).filter(|&r| fast_rank[r]).collect();
    let kaiso_share = (0..setup.n)
        .filter(|&r| fast_rank[r])
        .map(|r| ranked.zipf.mass(r))
        .sum();
    let (served_fast, served_slow): (Vec<Ranked>, Vec<Ranked>) =
        l_tiered.iter().partition(|r| fast_rank[r.rank]);
    dump_reads(
        s,
        &[("fast", &l_fast), ("tiered", &l_tiered), ("slow", &l_slow)],
    )?;
    let us = |v: &[Ranked]| v.iter().map(|x| x.us).collect::<Vec<_>>();
    let row = SkewRow {
        s,
        all_fast: stats(us(&l_fast)),
        tiered: stats(us(&l_tiered)),
        all_slow: stats(us(&l_slow)),
        fast_served: stats(us(&served_fast)),
        slow_served: stats(us(&served_slow)),
        steps_all_fast: step_means(l_fast.iter()),
        steps_fast_served: step_means(served_fast.iter()),
        on_fast: on_fast.len(),
        kaiso_share,
        fast_ranks,
        moves_warm: delta(moved0, moved1),
        moves_measured: delta(moved1, moved2),
        load: (load0, load1),
        settle,
    };
    for (name, st) in [
        ("all-fast", &row.all_fast),
        ("tiered", &row.tiered),
        ("all-slow", &row.all_slow),
    ] {
        println!(
            "   {name}: {} reads, mean {:.0} us, p50 {:.0} us, p99 {:.0} us",
            st.n, st.mean, st.p50, st.p99
        );
    }
    Ok(row)
}

/// Keeps reading the tiered store in 1/4 s steps until its placement has settled (see
/// [`placement_settled`]), at most `max_secs`.
fn wait_settled(w: &mut Workload, cfg: &Path, max_secs: u64) -> Result<Settle> {
    let t = Instant::now();
    let mut last = None;
    loop {
        let m = mover_status(cfg);
        match m.as_ref().map(placement_settled) {
            Some(Some(true)) => return Ok(Settle::After(t.elapsed().as_secs_f64())),
            Some(None) => return Ok(Settle::Unknown),
            _ => {}
        }
        if m.is_some() {
            last = m;
        }
        if t.elapsed() >= Duration::from_secs(max_secs) {
            return Ok(Settle::GaveUp {
                secs: t.elapsed().as_secs_f64(),
                last: last.as_ref().map_or("none".into(), mover_summary),
            });
        }
        w.run_ranked(0.25)?;
    }
}

/// What a read of a file left on the slow tier costs: the tiered run's own slow-tier
/// reads when there are enough of them; the all-slow mean is lower at high skew, where the
/// head mostly stays on one hot file.
fn cold_read_mean(r: &SkewRow) -> f64 {
    if r.slow_served.n >= 30 {
        r.slow_served.mean
    } else {
        r.all_slow.mean
    }
}

fn moves_text(m: Option<(u64, u64)>) -> String {
    match m {
        Some((f, b)) => format!("{f} ({} MiB)", b / MIB),
        None => "?".into(),
    }
}

fn render(args: &Args, setup: &Setup, rows: &[SkewRow]) -> Result<String> {
    let [_, fit_fill, fit_hard] = setup.fits();
    let mut t = String::new();
    writeln!(
        t,
        "\ntiering benefit ({} x {} KiB files, fast tier {} MiB = 10% of the data, watermarks \
         {}/{}, flash write budget {} drive writes/day; {} KiB reads; slow tier: emulated {}, \
         so every figure below depends on that device model):",
        setup.n,
        setup.fsize / 1024,
        setup.fast_cap / MIB,
        setup.low_wm,
        setup.high_wm,
        setup.promote_dwpd,
        args.read_size / 1024,
        args.slow_device
    )?;
    for r in rows {
        writeln!(
            t,
            "Zipf s = {} (load average {:.1} -> {:.1}):",
            r.s, r.load.0, r.load.1
        )?;
        writeln!(
            t,
            "  {:<30} {:>9} {:>9} {:>9} {:>8}",
            "configuration", "mean us", "p50 us", "p99 us", "reads"
        )?;
        for (name, s) in [
            ("all on fast tier", &r.all_fast),
            ("tiered (fast 10%)", &r.tiered),
            ("  of it: files on fast tier", &r.fast_served),
            ("  of it: files on slow tier", &r.slow_served),
            ("all on emulated slow", &r.all_slow),
        ] {
            writeln!(
                t,
                "  {:<30} {:>9.0} {:>9.0} {:>9.0} {:>8}",
                name, s.mean, s.p50, s.p99, s.n
            )?;
        }
        let steps = |v: [f64; 4]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        writeln!(
            t,
            "  steps (open / fadvise / read / close, mean us): all-fast {}; tiered, fast-tier files {}",
            steps(r.steps_all_fast),
            steps(r.steps_fast_served)
        )?;
        writeln!(
            t,
            "  files moved during warm-up: {}; during the measured window: {}",
            moves_text(r.moves_warm),
            moves_text(r.moves_measured)
        )?;
        writeln!(t, "  {}", r.settle.text())?;
        writeln!(t, "  placement: {}", placement_text(r, fit_fill))?;
    }
    writeln!(
        t,
        "\nsummary (best N = the N hottest files on the fast tier, each read at the all-fast \
         mean, every other read at the mean of the tiered run's slow-tier reads (the \
         all-slow mean if fewer than 30); promotions may fill the fast tier to its high \
         watermark: {fit_fill} files; hard capacity: {fit_hard} files; \"captured\": kaiso's \
         share of the reads over the best {fit_fill} files' share):"
    )?;
    writeln!(
        t,
        "{:>5} {:>12} {:>15} {:>15} {:>12} {:>8} {:>12} {:>12} {:>9} {:>10}",
        "s",
        "tiered/fast",
        format!("best{fit_fill}/fast"),
        format!("best{fit_hard}/fast"),
        "slow/tiered",
        "on fast",
        "kaiso share",
        format!("best{fit_fill} sh"),
        "captured",
        "best?",
    )?;
    let mut met = Vec::new();
    for r in rows {
        let a = Analysis {
            fast_mean: r.all_fast.mean,
            slow_mean: cold_read_mean(r),
            n: setup.n,
        };
        let ratio = r.tiered.mean / r.all_fast.mean.max(1e-9);
        if ratio <= 1.5 {
            met.push(r.s);
        }
        let best_fill = a.best_share(fit_fill, r.s);
        writeln!(
            t,
            "{:>5} {:>11.2}x {:>14.2}x {:>14.2}x {:>11.1}x {:>8} {:>11.2}% {:>11.2}% {:>8.1}% {:>10}",
            r.s,
            ratio,
            a.mean_with_share(best_fill) / r.all_fast.mean.max(1e-9),
            a.mean_with_share(a.best_share(fit_hard, r.s)) / r.all_fast.mean.max(1e-9),
            r.all_slow.mean / r.tiered.mean.max(1e-9),
            r.on_fast,
            100.0 * r.kaiso_share,
            100.0 * best_fill,
            100.0 * r.kaiso_share / best_fill.max(1e-12),
            if reached_best(r, fit_fill) {
                "yes"
            } else {
                "no"
            },
        )?;
    }
    writeln!(
        t,
        "target: tiered within 1.5x of all-fast. Met at s = {}.",
        if met.is_empty() {
            "none of the skews measured".to_string()
        } else {
            met.iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        }
    )?;
    for r in rows {
        let a = Analysis {
            fast_mean: r.all_fast.mean,
            slow_mean: cold_read_mean(r),
            n: setup.n,
        };
        let need = a.share_needed(1.5);
        let verdict = |fit: usize| match a.skew_needed(fit, 1.5) {
            Some(x) if x <= r.s => format!("reachable (from s = {x:.2})"),
            Some(x) => format!("out of reach (needs s >= {x:.2})"),
            None => "out of reach for any s <= 6".into(),
        };
        writeln!(
            t,
            "s = {}: 1.5x needs {:.2}% of the reads on the fast tier; with {fit_fill} files \
             {}, with {fit_hard} files {}",
            r.s,
            100.0 * need,
            verdict(fit_fill),
            verdict(fit_hard)
        )?;
        if a.skew_needed(fit_hard, 1.5).is_none_or(|x| x > r.s) {
            writeln!(
                t,
                "  at s = {}, no whole-file placement within the fast tier's capacity can \
                 meet 1.5x on this device model: the target is out of reach for any policy",
                r.s
            )?;
        }
    }
    Ok(t)
}

/// Whether kaiso ended with exactly the `fill` hottest files on the fast tier.
fn reached_best(r: &SkewRow, fill: usize) -> bool {
    r.fast_ranks.len() == fill && r.fast_ranks.iter().all(|&k| k < fill)
}

/// Which of the `fill` hottest files kaiso left off the fast tier, and which colder ones
/// it holds instead (1-based popularity ranks).
fn placement_text(r: &SkewRow, fill: usize) -> String {
    let missing: Vec<String> = (0..fill)
        .filter(|k| !r.fast_ranks.contains(k))
        .map(|k| (k + 1).to_string())
        .collect();
    let extra: Vec<String> = r
        .fast_ranks
        .iter()
        .filter(|&&k| k >= fill)
        .map(|k| (k + 1).to_string())
        .collect();
    if missing.is_empty() && extra.is_empty() {
        format!("the {fill} hottest files, exactly (best possible)")
    } else {
        format!(
            "{} files; of the {fill} hottest, missing rank(s) {}; holds rank(s) {} instead",
            r.fast_ranks.len(),
            if missing.is_empty() {
                "none".into()
            } else {
                missing.join(",")
            },
            if extra.is_empty() {
                "none".into()
            } else {
                extra.join(",")
            }
        )
    }
}

/// What the best whole-file placement can reach on this workload, from the measured
/// all-fast and all-slow means: a read is served at the fast mean when its file is on the
/// fast tier, else at the slow mean.
struct Analysis {
    fast_mean: f64,
    slow_mean: f64,
    /// Files in the data set.
    n: usize,
}

impl Analysis {
    /// Share of reads the `fit` most popular files draw under Zipf(s).
    fn best_share(&self, fit: usize, s: f64) -> f64 {
        if fit == 0 || self.n == 0 {
            return 0.0;
        }
        Zipf::new(self.n, s).cdf[(fit - 1).min(self.n - 1)]
    }

    fn mean_with_share(&self, share: f64) -> f64 {
        share * self.fast_mean + (1.0 - share) * self.slow_mean
    }

    /// Share of reads the fast tier must serve for a mean within `factor` of all-fast.
    fn share_needed(&self, factor: f64) -> f64 {
        let span = self.slow_mean - self.fast_mean;
        if span <= 0.0 {
            return 0.0;
        }
        (1.0 - (factor - 1.0) * self.fast_mean / span).clamp(0.0, 1.0)
    }

    /// Smallest Zipf exponent (to 0.01, up to 6) at which the `fit` hottest files draw
    /// enough reads for a mean within `factor` of all-fast.
    fn skew_needed(&self, fit: usize, factor: f64) -> Option<f64> {
        let need = self.share_needed(factor);
        (0..=600)
            .map(|i| i as f64 / 100.0)
            .find(|s| self.best_share(fit, *s) >= need)
    }
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    let _ = collect_files(dir, &mut v);
    v.retain(|p| {
        !p.file_name()
            .is_some_and(|n| n.as_bytes().starts_with(b".kaiso"))
    });
    v
}

/// `--zipf-on DIR`: the skewed workload over the regular files already under DIR.
pub(super) fn zipf_on_existing(dir: &Path, args: &Args) -> Result<()> {
    let mut files = Vec::new();
    collect_files(dir, &mut files)?;
    if files.is_empty() {
        bail!("no files under {}", dir.display());
    }
    files.sort();
    let size = fs::metadata(&files[0])?.len().max(1);
    let mut w = Workload::new(files, size, args.read_size, args.zipf, args.seed);
    println!(
        "zipf reads (s={}) over {} files under {}, {} KiB each, for {} s",
        args.zipf,
        w.files.len(),
        dir.display(),
        args.read_size / 1024,
        args.seconds
    );
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(args.seconds) {
        let s = stats(w.run_for(args.interval.max(1))?);
        println!(
            "t={:>4}s  reads {:>6}  mean {:>8.0} us  p50 {:>8.0} us  p99 {:>8.0} us",
            start.elapsed().as_secs(),
            s.n,
            s.mean,
            s.p50,
            s.p99
        );
        std::io::stdout().flush()?;
    }
    Ok(())
}

fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            collect_files(&e.path(), out)?;
        } else if t.is_file() {
            out.push(e.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_is_skewed_and_in_range() {
        let z = Zipf::new(100, 1.1);
        let mut rng = SplitMix64::new(1);
        let mut counts = [0u32; 100];
        for _ in 0..100_000 {
            counts[z.sample(rng.unit())] += 1;
        }
        let top10: u32 = counts[..10].iter().sum();
        assert!(top10 > 50_000, "top 10% of ranks got {top10} of 100000");
        assert!(counts[0] > counts[50]);
    }

    #[test]
    fn best_placement_analysis() {
        let a = Analysis {
            fast_mean: 100.0,
            slow_mean: 10_100.0,
            n: 160,
        };
        // Within 1.5x needs all but 0.5% of the reads on the fast tier.
        assert!((a.share_needed(1.5) - 0.995).abs() < 1e-9);
        let share = a.best_share(16, 1.1);
        assert!(
            share > 0.6 && share < 0.7,
            "top 10% share at s=1.1: {share}"
        );
        // Fewer files (a low watermark) draw less.
        assert!(a.best_share(12, 1.1) < share);
        assert_eq!(a.best_share(0, 1.1), 0.0);
        assert!((a.mean_with_share(1.0) - 100.0).abs() < 1e-9);
        let s = a.skew_needed(16, 1.5).expect("reachable for some skew");
        assert!(a.best_share(16, s) >= a.share_needed(1.5));
        assert!(a.best_share(16, s - 0.01) < a.share_needed(1.5));
        // Fewer files need more skew.
        assert!(a.skew_needed(12, 1.5).expect("reachable") > s);
        // Ranks' masses sum to one.
        let z = Zipf::new(160, 1.1);
        let total: f64 = (0..160).map(|r| z.mass(r)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(z.mass(160), 0.0);
    }

    #[test]
    fn watermark_fits() {
        let s = Setup {
            n: 160,
            fsize: 1 << 20,
            fast_cap: 16 << 20,
            low_wm: 0.8,
            high_wm: 0.95,
            warmup: 1,
            settle_max: 1,
            measure: 1,
            promote_dwpd: 1.0,
        };
        assert_eq!(s.fits(), [12, 15, 16]);
    }

    #[test]
    fn step_means_average_each_step() {
        let at = Instant::now();
        let r = |o: f64, c: f64| Ranked {
            rank: 0,
            us: o + c,
            steps_us: [o, 0.0, 1.0, c],
            at,
        };
        let reads = [r(10.0, 2.0), r(30.0, 4.0)];
        assert_eq!(step_means(reads.iter()), [20.0, 0.0, 1.0, 3.0]);
        assert_eq!(step_means([].iter()), [0.0; 4]);
    }

    #[test]
    fn placement_report_names_missing_and_extra_ranks() {
        let row = |ranks: Vec<usize>| SkewRow {
            s: 3.0,
            all_fast: stats(vec![1.0]),
            tiered: stats(vec![1.0]),
            all_slow: stats(vec![1.0]),
            fast_served: stats(vec![]),
            slow_served: stats(vec![]),
            steps_all_fast: [0.0; 4],
            steps_fast_served: [0.0; 4],
            on_fast: ranks.len(),
            kaiso_share: 0.0,
            fast_ranks: ranks,
            moves_warm: None,
            moves_measured: None,
            load: (0.0, 0.0),
            settle: Settle::Unknown,
        };
        let best = row((0..15).collect());
        assert!(reached_best(&best, 15));
        assert!(placement_text(&best, 15).contains("exactly"));
        let off = row((0..11).chain([12, 13, 14, 17]).collect());
        assert!(!reached_best(&off, 15));
        let t = placement_text(&off, 15);
        assert!(t.contains("missing rank(s) 12;"), "{t}");
        assert!(t.contains("holds rank(s) 18 instead"), "{t}");
        // Fewer files than the fill is not the best placement either.
        assert!(!reached_best(&row((0..12).collect()), 15));
    }

    #[test]
    fn placement_settles_only_with_an_idle_mover_and_empty_plans() {
        let m = |queued: u64, moving: u64, empty: u64| {
            serde_json::json!({
                "queued_files": queued,
                "moving_files": moving,
                "empty_plans_in_a_row": empty,
            })
        };
        assert_eq!(placement_settled(&m(0, 0, SETTLED_EMPTY_PLANS)), Some(true));
        assert_eq!(placement_settled(&m(1, 0, 9)), Some(false));
        assert_eq!(placement_settled(&m(0, 1, 9)), Some(false));
        let mut waiting = m(0, 0, 9);
        waiting["waiting_files"] = 1.into();
        assert_eq!(placement_settled(&waiting), Some(false));
        assert_eq!(
            placement_settled(&m(0, 0, SETTLED_EMPTY_PLANS - 1)),
            Some(false)
        );
        // A daemon that does not report its plans: unknown, not settled.
        assert_eq!(
            placement_settled(&serde_json::json!({"queued_files": 0})),
            None
        );
        let gave_up = Settle::GaveUp {
            secs: 30.0,
            last: mover_summary(&m(2, 1, 0)),
        };
        let t = gave_up.text();
        assert!(t.contains("NOT settled 30 s"), "{t}");
        assert!(t.contains("queued 2, moving 1"), "{t}");
        assert!(Settle::After(1.5).text().contains("settled 1.5 s"));
    }

    #[test]
    fn latency_stats() {
        let s = stats((1..=100).map(|x| x as f64).collect());
        assert_eq!(s.n, 100);
        assert!((s.mean - 50.5).abs() < 1e-9);
        assert_eq!(s.p99, 100.0);
        assert_eq!(stats(vec![]).n, 0);
    }
}
