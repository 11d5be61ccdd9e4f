//! The tiering-benefit part of `kaiso bench fs`: a Zipf-skewed read workload over a fast
//! tier and an emulated HDD, against all-fast and all-HDD mounts of the same data.

use super::*;

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

struct SplitMix(u64);
impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
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
    rng: SplitMix,
    buf: Vec<u8>,
}

impl Workload {
    fn new(files: Vec<PathBuf>, file_size: u64, read_size: u64, s: f64, seed: u64) -> Workload {
        let mut rng = SplitMix(seed);
        let mut files = files;
        for i in (1..files.len()).rev() {
            let j = (rng.next() % (i as u64 + 1)) as usize;
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

    /// One request; its latency.
    fn request(&mut self) -> Result<Duration> {
        let rank = self.zipf.sample(self.rng.unit());
        let path = &self.files[rank];
        let slots = (self.file_size / self.read_size).max(1);
        let off = (self.rng.next() % slots) * self.read_size;
        let t = Instant::now();
        let f = fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
        use std::os::fd::AsRawFd;
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        let n = self.buf.len();
        f.read_exact_at(&mut self.buf[..n], off)
            .with_context(|| format!("read {}", path.display()))?;
        drop(f);
        Ok(t.elapsed())
    }

    /// Run for `secs`; latencies in microseconds.
    fn run_for(&mut self, secs: u64) -> Result<Vec<f64>> {
        let end = Instant::now() + Duration::from_secs(secs);
        let mut lat = Vec::new();
        while Instant::now() < end {
            check_interrupt()?;
            lat.push(self.request()?.as_secs_f64() * 1e6);
        }
        Ok(lat)
    }
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
    let mut rng = SplitMix(seed ^ 0xda7a);
    let mut buf = vec![0u8; size as usize];
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        check_interrupt()?;
        for c in buf.chunks_mut(8) {
            let v = rng.next().to_le_bytes();
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

pub(super) fn tiering(args: &Args, work: &WorkDir, report: &mut String) -> Result<()> {
    let data = args
        .tier_data
        .unwrap_or(if args.quick { 160 * MIB } else { 512 * MIB });
    let warmup = args.warmup.unwrap_or(if args.quick { 25 } else { 60 });
    let measure = args.measure.unwrap_or(if args.quick { 8 } else { 20 });
    let fsize = args.tier_file_size.max(4096);
    let n = (data / fsize).max(10) as usize;
    let fast_cap = (n as u64 * fsize) / 10;
    println!(
        "\ntiering: {n} files x {} KiB, Zipf s={}, {} KiB reads; fast tier {} MiB (10% of the data); \
         slow tier emulated {}; warm-up {warmup} s, measured {measure} s",
        fsize / 1024,
        args.zipf,
        args.read_size / 1024,
        fast_cap / MIB,
        args.slow_device
    );
    // One copy of the data in the slow tier's directory, used by all three configurations:
    // all-fast is that directory without emulation; all-slow with it; tiered adds a fast
    // tier in front and starts with everything on the slow tier.
    let slow = work.sub("slow")?;
    let fast = work.sub("fast")?;
    let names = write_data_set(&slow, n, fsize, args.seed)?;
    let big = data * 4;

    let run = |tag: &str, tiers: &[BenchTier], warm: u64| -> Result<LatStats> {
        let m = mount_kaiso(work, tag, tiers, 500)?;
        let files: Vec<PathBuf> = names.iter().map(|r| m.path.join(r)).collect();
        let mut w = Workload::new(files, fsize, args.read_size, args.zipf, args.seed);
        if warm > 0 {
            let t = Instant::now();
            let mut last = Instant::now();
            while t.elapsed() < Duration::from_secs(warm) {
                let l = stats(w.run_for(1)?);
                if last.elapsed() >= Duration::from_secs(5) {
                    println!(
                        "   {tag} warm-up {:>3} s: mean {:.0} us",
                        t.elapsed().as_secs(),
                        l.mean
                    );
                    last = Instant::now();
                }
            }
        }
        let s = stats(w.run_for(measure)?);
        println!(
            "   {tag}: {} reads, mean {:.0} us, p50 {:.0} us, p99 {:.0} us",
            s.n, s.mean, s.p50, s.p99
        );
        drop(m);
        Ok(s)
    };
    let all_fast = run(
        "all-fast",
        &[BenchTier {
            name: "fast",
            path: &slow,
            capacity: big,
            device: None,
            watermarks: None,
        }],
        warmup.min(5),
    )?;
    let all_slow = run(
        "all-slow",
        &[BenchTier {
            name: "slow",
            path: &slow,
            capacity: big,
            device: Some(&args.slow_device),
            watermarks: None,
        }],
        warmup.min(5),
    )?;
    let tiered = run(
        "tiered",
        &[
            BenchTier {
                name: "fast",
                path: &fast,
                capacity: fast_cap,
                device: None,
                watermarks: Some((0.8, 0.95)),
            },
            BenchTier {
                name: "slow",
                path: &slow,
                capacity: big,
                device: Some(&args.slow_device),
                watermarks: None,
            },
        ],
        warmup,
    )?;
    let on_fast = count_files(&fast);
    // Which ranks ended up on the fast tier: the share of reads they draw, next to the
    // share the best possible placement of as many files (and of a full fast tier) draws.
    let ranked = Workload::new(
        names.iter().map(PathBuf::from).collect(),
        fsize,
        args.read_size,
        args.zipf,
        args.seed,
    );
    let fast_names: std::collections::HashSet<PathBuf> = files_under(&fast)
        .into_iter()
        .filter_map(|p| p.strip_prefix(&fast).ok().map(Path::to_path_buf))
        .collect();
    let placed_share: f64 = ranked
        .files
        .iter()
        .enumerate()
        .filter(|(_, f)| fast_names.contains(*f))
        .map(|(r, _)| ranked.zipf.mass(r))
        .sum();
    let fit = (fast_cap / fsize) as usize;
    let a = Analysis {
        fast_mean: all_fast.mean,
        slow_mean: all_slow.mean,
        n,
        fit,
        zipf: args.zipf,
    };
    let mut t = String::new();
    writeln!(
        t,
        "\ntiering benefit (mean read latency after warm-up, {} KiB reads):",
        args.read_size / 1024
    )?;
    writeln!(
        t,
        "{:<24} {:>10} {:>10} {:>10} {:>8}",
        "configuration", "mean us", "p50 us", "p99 us", "reads"
    )?;
    for (name, s) in [
        ("all on fast tier", &all_fast),
        ("tiered (fast 10%)", &tiered),
        ("all on emulated slow", &all_slow),
    ] {
        writeln!(
            t,
            "{:<24} {:>10.0} {:>10.0} {:>10.0} {:>8}",
            name, s.mean, s.p50, s.p99, s.n
        )?;
    }
    writeln!(
        t,
        "tiered / all-fast = {:.2}x (target <= 1.5x); all-slow / tiered = {:.1}x; files on the fast tier after the run: {on_fast} of {n}",
        tiered.mean / all_fast.mean.max(1e-9),
        all_slow.mean / tiered.mean.max(1e-9)
    )?;
    let best_share = a.best_share(args.zipf);
    let best = a.mean_with_share(best_share);
    writeln!(
        t,
        "best possible (the {fit} hottest files on the fast tier, which then serves {:.1}% of \
         the reads; latencies as measured above): mean {best:.0} us = {:.2}x all-fast",
        100.0 * best_share,
        best / all_fast.mean.max(1e-9)
    )?;
    writeln!(
        t,
        "kaiso's placement: the {on_fast} files on the fast tier draw {:.1}% of the reads \
         (expected mean {:.0} us)",
        100.0 * placed_share,
        a.mean_with_share(placed_share)
    )?;
    match a.skew_needed(1.5) {
        Some(s) => writeln!(
            t,
            "for 1.5x of all-fast even with the best placement, the top {fit} of {n} files must \
             draw {:.2}% of the reads: Zipf s >= {s:.2} (this run: s = {})",
            100.0 * a.share_needed(1.5),
            args.zipf
        )?,
        None => writeln!(
            t,
            "1.5x of all-fast is out of reach for any Zipf skew up to 6 with this fast tier"
        )?,
    }
    println!("{t}");
    report.push_str(&t);
    Ok(())
}

/// What the best whole-file placement can reach on this workload, from the measured
/// all-fast and all-slow means: a read is served at the fast mean when its file is on the
/// fast tier, else at the slow mean.
struct Analysis {
    fast_mean: f64,
    slow_mean: f64,
    /// Files in the data set.
    n: usize,
    /// Files the fast tier can hold.
    fit: usize,
    zipf: f64,
}

impl Analysis {
    /// Share of reads the `fit` most popular files draw under Zipf(s).
    fn best_share(&self, s: f64) -> f64 {
        if self.fit == 0 {
            return 0.0;
        }
        Zipf::new(self.n, s).cdf[(self.fit - 1).min(self.n - 1)]
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

    /// Smallest Zipf exponent (to 0.01) at which the best placement is within `factor`.
    fn skew_needed(&self, factor: f64) -> Option<f64> {
        let need = self.share_needed(factor);
        if self.best_share(self.zipf) >= need {
            // Already reachable: search downwards for the least skew that still is.
            let mut s = self.zipf;
            while s > 0.01 && self.best_share(s - 0.01) >= need {
                s -= 0.01;
            }
            return Some(s);
        }
        (1..=600)
            .map(|i| i as f64 / 100.0)
            .find(|s| self.best_share(*s) >= need)
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

fn count_files(dir: &Path) -> usize {
    let Ok(rd) = fs::read_dir(dir) else { return 0 };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => count_files(&e.path()),
            Ok(_) if !e.file_name().as_bytes().starts_with(b".kaiso") => 1,
            _ => 0,
        })
        .sum()
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
        let mut rng = SplitMix(1);
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
            fit: 16,
            zipf: 1.1,
        };
        // Within 1.5x needs all but 0.5% of the reads on the fast tier.
        assert!((a.share_needed(1.5) - 0.995).abs() < 1e-9);
        let share = a.best_share(1.1);
        assert!(
            share > 0.6 && share < 0.7,
            "top 10% share at s=1.1: {share}"
        );
        assert!((a.mean_with_share(1.0) - 100.0).abs() < 1e-9);
        let s = a.skew_needed(1.5).expect("reachable for some skew");
        assert!(a.best_share(s) >= a.share_needed(1.5));
        assert!(a.best_share(s - 0.01) < a.share_needed(1.5));
        // Ranks' masses sum to one.
        let z = Zipf::new(160, 1.1);
        let total: f64 = (0..160).map(|r| z.mass(r)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert_eq!(z.mass(160), 0.0);
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
