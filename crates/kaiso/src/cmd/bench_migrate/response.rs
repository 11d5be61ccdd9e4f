//! Part 4 of `kaiso bench migrate`: response times of a replayed access pattern during
//! migration, by crawl order, following the thesis's method (section 2.6.5):
//! - a fixed random sample of files (1000 in the full run), accessed serially by one
//!   client, open → read 1 byte → close, each run from a fresh cutover;
//! - **one crawler thread** (the thesis's crawler), whatever `--workers` says;
//! - (1) directory order, bulk fixed: BFS vs DFS stopped at 0/25/50/75/100 % *object*
//!   progress, (files + directories migrated) / (files + directories in the tree);
//! - (2) data order, BFS fixed: bulk vs metadata-first stopped at 0/25/50/75 % of each
//!   strategy's own full crawl *time* (metadata-first copies all metadata first, so the
//!   thesis measured its progress in time, not objects).

use std::sync::atomic::Ordering;

use super::*;

/// The thesis's single crawler thread.
const CRAWLERS: usize = 1;

/// Latencies of one replay, sorted, and the directories each access had to list on its
/// way (a cost independent of the machine's load: the thesis's latency grows with it).
struct Replay {
    open: Vec<Duration>,
    open_read: Vec<Duration>,
    listings: Vec<u64>,
}

impl Replay {
    /// The client is alone (the crawl is stopped), so the listing counter's growth
    /// during an access is that access's own listings.
    fn run(store: &Store, m: &Migration, sample: &[&PathBuf]) -> Result<Self> {
        let mut open = Vec::with_capacity(sample.len());
        let mut with_read = Vec::with_capacity(sample.len());
        let mut listings = Vec::with_capacity(sample.len());
        for rel in sample {
            let before = m.counters.dirs_listed.load(Ordering::Acquire);
            let (o, r) = open_read(store, rel, 1)?;
            listings.push(m.counters.dirs_listed.load(Ordering::Acquire) - before);
            open.push(o);
            with_read.push(o + r);
        }
        open.sort();
        with_read.sort();
        listings.sort();
        Ok(Self {
            open,
            open_read: with_read,
            listings,
        })
    }

    fn listings_mean(&self) -> f64 {
        self.listings.iter().sum::<u64>() as f64 / self.listings.len().max(1) as f64
    }

    fn listings_at(&self, q: f64) -> u64 {
        pct(&self.listings, q)
    }
}

fn mean(v: &[Duration]) -> Duration {
    v.iter().sum::<Duration>() / v.len().max(1) as u32
}

/// The `q` quantile of the sorted `v` (zero when empty).
fn pct<T: Copy + Default>(v: &[T], q: f64) -> T {
    v.get(((v.len().max(1) as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// Objects migrated so far: directories listed + files complete.
fn objects_done(m: &Migration) -> (u64, u64) {
    (
        m.counters.dirs_listed.load(Ordering::Acquire),
        m.counters.files_completed.load(Ordering::Acquire),
    )
}

fn config(order: CrawlOrder) -> MigrationConfig {
    let mut cfg = MigrationConfig::new("bench");
    cfg.order = order;
    cfg.crawl_workers = CRAWLERS;
    cfg
}

/// A fresh cutover whose crawl ran until `stop_at` says so (never started for 0 %).
fn cutover(
    s: &Setup,
    kind: SrcKind,
    sub: &str,
    order: CrawlOrder,
    mut stop_at: impl FnMut(&Migration, Duration) -> bool,
) -> Result<(Dest, Arc<Migration>)> {
    let dest = fresh_dest(s)?;
    let m = dest.attach(s.source(kind, sub)?, config(order))?;
    let t = Instant::now();
    if !stop_at(&m, Duration::ZERO) {
        let crawler = Crawler::start(dest.store.clone(), m.clone());
        loop {
            let st = crawler.state();
            if st == CrawlState::Stuck {
                bail!("crawl of {sub} got stuck: {:?}", crawler.failures());
            }
            if st == CrawlState::Done || stop_at(&m, t.elapsed()) {
                break;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
        crawler.stop();
    }
    Ok((dest, m))
}

/// Part 4: both sub-studies, each from fresh cutovers.
pub(super) fn bench_response(
    s: &Setup,
    sc: &Shape,
    sub: &str,
    g: &dataset::Generated,
    n: usize,
) -> Result<String> {
    let kind = if s.ganesha.is_some() {
        SrcKind::Nfs
    } else {
        SrcKind::Posix
    };
    let mut rng = Rng::new(4242);
    let sample: Vec<&PathBuf> = (0..n.min(g.file_paths.len()))
        .map(|_| &g.file_paths[rng.below(g.file_paths.len())])
        .collect();
    // The share root is a directory to migrate too.
    let (total_dirs, total_files) = (g.dirs + 1, g.files);
    let total = total_dirs + total_files;
    let mut out = format!(
        "## 4. Response time of replayed accesses during migration ({} files, {} dirs, {:.0} MiB, mean file depth {:.1}, shaped like (b); {} accesses, open → read 1 byte → close; {CRAWLERS} crawler thread)\n\n",
        g.files,
        g.dirs,
        g.bytes as f64 / (1 << 20) as f64,
        g.mean_depth,
        sample.len()
    );

    // (1) BFS vs DFS, bulk, at object progress.
    out += "### 4.1 Directory order (bulk), stopped at object progress (thesis Figs. 2.13, 2.14)\n\n\
            | order | progress (objects) | dirs done | files done | open mean (ms) | p50 | p90 | p99 | max (ms) | open+read mean (ms) | listings per open: mean | p99 | max |\n\
            |---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
    let mut means: Vec<(&str, u32, Duration, f64)> = Vec::new();
    for order in ["dfs", "bfs"] {
        let co = CrawlOrder::parse(order, "bulk").map_err(|e| anyhow!("{e}"))?;
        for p in [0u32, 25, 50, 75, 100] {
            let target = total * u64::from(p) / 100;
            let (dest, m) = cutover(s, kind, sub, co, |m, _| {
                let (d, f) = objects_done(m);
                p < 100 && d + f >= target
            })?;
            let (d, f) = objects_done(&m);
            let r = Replay::run(&dest.store, &m, &sample)?;
            means.push((order, p, mean(&r.open), r.listings_mean()));
            let _ = writeln!(
                out,
                "| {order} | {:.0} % | {:.0} % | {:.0} % | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                100.0 * (d + f) as f64 / total as f64,
                100.0 * d as f64 / total_dirs as f64,
                100.0 * f as f64 / total_files as f64,
                ms(mean(&r.open)),
                ms(pct(&r.open, 0.5)),
                ms(pct(&r.open, 0.9)),
                ms(pct(&r.open, 0.99)),
                ms(*r.open.last().unwrap_or(&Duration::ZERO)),
                ms(mean(&r.open_read)),
                r.listings_mean(),
                r.listings_at(0.99),
                r.listings.last().copied().unwrap_or_default(),
            );
            println!("{}", out.lines().last().unwrap_or_default());
        }
    }
    out += "\nBFS against DFS at equal progress (negative = BFS better), mean open time / mean listings per open:";
    for p in [0u32, 25, 50, 75] {
        let get = |o: &str| means.iter().find(|x| x.0 == o && x.1 == p);
        if let (Some(b), Some(d)) = (get("bfs"), get("dfs")) {
            let (bt, dt) = (b.2.as_secs_f64(), d.2.as_secs_f64());
            let _ = write!(
                out,
                " {p} %: {:+.0} % / {:+.0} %;",
                100.0 * (bt - dt) / dt.max(1e-9),
                100.0 * (b.3 - d.3) / d.3.max(1e-9)
            );
        }
    }
    out += "\nMean open time against the same order's own 0 % row (the thesis's \"−51 % at 50 %\"), DFS / BFS:";
    for p in [25u32, 50, 75] {
        let change = |o: &str| {
            let at = |q: u32| {
                means
                    .iter()
                    .find(|x| x.0 == o && x.1 == q)
                    .map(|x| x.2.as_secs_f64())
            };
            match (at(0), at(p)) {
                (Some(z), Some(v)) if z > 0.0 => format!("{:+.0} %", 100.0 * (v - z) / z),
                _ => "—".to_string(),
            }
        };
        let _ = write!(out, " {p} %: {} / {};", change("dfs"), change("bfs"));
    }
    out += "\n\n";

    // (2) bulk vs metadata-first, BFS, at time progress.
    out += "### 4.2 Data order (BFS), stopped at elapsed share of the full crawl time (thesis Figs. 2.15, 2.16)\n\n\
            | phasing | progress (time) | objects done | open+read mean (ms) | p50 | p90 | p99 | max (ms) | listings per open: mean | max |\n\
            |---|---|---|---|---|---|---|---|---|---|\n";
    for phasing in ["bulk", "metadata-first"] {
        let co = CrawlOrder::parse("bfs", phasing).map_err(|e| anyhow!("{e}"))?;
        let t = Instant::now();
        let (full_dest, _) = cutover(s, kind, sub, co, |_, _| false)?;
        let full = t.elapsed();
        drop(full_dest);
        for p in [0u32, 25, 50, 75] {
            let stop = full.mul_f64(f64::from(p) / 100.0);
            let (dest, m) = cutover(s, kind, sub, co, |_, el| p == 0 || el >= stop)?;
            let (d, f) = objects_done(&m);
            let r = Replay::run(&dest.store, &m, &sample)?;
            let _ = writeln!(
                out,
                "| bfs + {phasing} | {p} % of {:.1} s | {:.0} % | {} | {} | {} | {} | {} | {:.2} | {} |",
                full.as_secs_f64(),
                100.0 * (d + f) as f64 / total as f64,
                ms(mean(&r.open_read)),
                ms(pct(&r.open_read, 0.5)),
                ms(pct(&r.open_read, 0.9)),
                ms(pct(&r.open_read, 0.99)),
                ms(*r.open_read.last().unwrap_or(&Duration::ZERO)),
                r.listings_mean(),
                r.listings.last().copied().unwrap_or_default(),
            );
            println!("{}", out.lines().last().unwrap_or_default());
        }
    }
    let _ = writeln!(
        out,
        "\n\"open\" = path walk from the root (each unlisted ancestor is listed on the way) + open; \
         \"listings per open\" = directories that access had to list from the source; \
         objects done = directories listed + files complete when the crawl was stopped. \
         Source: {}; {}. Mean file size {} KiB (sizes of (b) scaled down).\n",
        kind.label(),
        s.delay_note(),
        sc.mean_size >> 10
    );
    println!("{out}");
    Ok(out)
}
