//! Part 4 of `kaiso bench migrate`: response times of a replayed access pattern at
//! 0/25/50/75 % progress for each crawl order.

use super::total::migrate_all;
use super::*;

/// Part 4: replayed accesses (open → read 1 byte → close) at 0/25/50/75 % of each
/// strategy's own full crawl time, each checkpoint from a fresh cutover.
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
    let mut out = format!(
        "## 4. Response time of replayed accesses during migration ({} files, {} dirs, {:.0} MiB, shaped like (b); {} accesses, open → read 1 byte → close)\n\n\
         | strategy | progress | objects done | mean (ms) | p50 | p90 | p99 | max (ms) |\n|---|---|---|---|---|---|---|---|\n",
        g.files,
        g.dirs,
        g.bytes as f64 / (1 << 20) as f64,
        sample.len()
    );
    let total_objects = (g.files + g.dirs) as f64;
    for (order, phasing) in [
        ("dfs", "bulk"),
        ("bfs", "bulk"),
        ("dfs", "metadata-first"),
        ("bfs", "metadata-first"),
    ] {
        let co = CrawlOrder::parse(order, phasing).map_err(|e| anyhow!("{e}"))?;
        let full = migrate_all(s, kind, sub, co)?;
        for pct in [0u32, 25, 50, 75] {
            let dest = fresh_dest(s)?;
            let mut cfg = MigrationConfig::new("bench");
            cfg.order = co;
            cfg.crawl_workers = s.workers;
            let m = dest.attach(s.source(kind, sub)?, cfg)?;
            if pct > 0 {
                let crawler = Crawler::start(dest.store.clone(), m.clone());
                std::thread::sleep(full.mul_f64(f64::from(pct) / 100.0));
                crawler.stop();
            }
            let c = &m.counters;
            let done = c.files_completed.load(std::sync::atomic::Ordering::Relaxed)
                + c.dirs_listed.load(std::sync::atomic::Ordering::Relaxed);
            let mut lat = Vec::with_capacity(sample.len());
            for rel in &sample {
                let t = Instant::now();
                open_read(&dest.store, rel, 1)?;
                lat.push(t.elapsed());
            }
            lat.sort();
            let pick = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize];
            let mean = lat.iter().sum::<Duration>() / lat.len().max(1) as u32;
            let _ = writeln!(
                out,
                "| {order} + {phasing} | {pct} % | {:.0} % | {} | {} | {} | {} | {} |",
                100.0 * done as f64 / total_objects,
                ms(mean),
                ms(pick(0.5)),
                ms(pick(0.9)),
                ms(pick(0.99)),
                ms(*lat.last().unwrap_or(&Duration::ZERO))
            );
            println!("{}", out.lines().last().unwrap_or_default());
        }
    }
    let _ = writeln!(
        out,
        "\nProgress = elapsed share of that strategy's own full crawl time (the thesis used object \
         counts for BFS vs DFS and time for the data order); \"objects done\" = directories listed + \
         files complete when the crawl was stopped. Source: {}; {}. Mean file size {} KiB (sizes \
         of (b) scaled down so the 16 runs fit).\n",
        kind.label(),
        s.delay_note(),
        sc.mean_size >> 10
    );
    println!("{out}");
    Ok(out)
}
