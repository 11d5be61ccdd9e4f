//! Part 3 of `kaiso bench migrate`: total migration time against `rsync -aHAX` of the
//! same tree, over the same delayed path and locally.

use super::*;

/// Runs a migration to the end with the crawler; returns the elapsed time.
pub(super) fn migrate_all(
    s: &Setup,
    kind: SrcKind,
    sub: &str,
    order: CrawlOrder,
) -> Result<Duration> {
    let t = Instant::now();
    let dest = fresh_dest(s)?;
    let mut cfg = MigrationConfig::new("bench");
    cfg.order = order;
    cfg.crawl_workers = s.workers;
    let m = dest.attach(s.source(kind, sub)?, cfg)?;
    let crawler = Crawler::start(dest.store.clone(), m.clone());
    let st = crawler.wait(Duration::from_secs(6 * 3600));
    drop(crawler);
    if st != CrawlState::Done {
        bail!("crawl of {sub} ended {}", st.as_str());
    }
    let took = t.elapsed();
    let skipped = m.skipped();
    if !skipped.is_empty() {
        bail!("{} objects skipped, e.g. {:?}", skipped.len(), skipped[0]);
    }
    Ok(took)
}

fn rsync(from: &str, to: &Path) -> Result<Duration> {
    fs::create_dir_all(to)?;
    let t = Instant::now();
    let st = Command::new("rsync")
        .args(["-aHAX", from])
        .arg(format!("{}/", to.display()))
        .status()
        .context("run rsync")?;
    let took = t.elapsed();
    if !st.success() {
        bail!("rsync {from} failed: {st}");
    }
    let _ = fs::remove_dir_all(to);
    Ok(took)
}

/// One row of the total-time table: rsync time `r`, kaiso time `k`, and their ratio.
fn total_row(out: &mut String, head: &str, setup: &str, r: Duration, k: Duration) {
    let (r, k) = (r.as_secs_f64(), k.as_secs_f64());
    let _ = writeln!(out, "{head} {setup} | {r:.2} | {k:.2} | {:.2}× |", k / r);
}

/// 3. Total migration time vs rsync -aHAX, like for like.
pub(super) fn bench_total(
    s: &Setup,
    datasets: &[(Shape, String, dataset::Generated)],
    count_div: u64,
    size_div: u64,
) -> Result<String> {
    let mut out = format!(
        "## 3. Total migration time, Table 2.2-shaped datasets (counts / {count_div}, sizes / {size_div})\n\n\
         | dataset | dirs | files | GiB | mean depth | path | rsync -aHAX (s) | kaiso BFS+metadata-first (s) | kaiso / rsync |\n|---|---|---|---|---|---|---|---|---|\n"
    );
    // The delayed baseline: rsync's own daemon behind the same kind of proxy.
    let delayed = if s.ganesha.is_some() {
        let daemon = RsyncDaemon::start(&s.src())?;
        let up = SocketAddr::from(([127, 0, 0, 1], daemon.port));
        let proxy = DelayProxy::start(up, s.delay, s.rate)?;
        Some((daemon, proxy))
    } else {
        None
    };
    for (sc, sub, g) in datasets {
        let gib = g.bytes as f64 / (1u64 << 30) as f64;
        let head = format!(
            "| ({}) | {} | {} | {gib:.2} | {:.1} |",
            sc.name, g.dirs, g.files, g.mean_depth
        );
        if let Some((_, rproxy)) = &delayed {
            let r = rsync(
                &format!("rsync://127.0.0.1:{}/src/{sub}/", rproxy.port),
                &s.root.path().join("rsync-dst"),
            )?;
            let before = rproxy.bytes();
            let k = migrate_all(s, SrcKind::Nfs, sub, CrawlOrder::default())?;
            tracing::debug!(rsync_bytes = before, "delayed rsync moved this many bytes");
            total_row(
                &mut out,
                &head,
                "delayed: rsync daemon / NFSv3 ganesha, same proxy",
                r,
                k,
            );
        }
        let r = rsync(
            &format!("{}/", s.src().join(sub).display()),
            &s.root.path().join("rsync-dst"),
        )?;
        let k = migrate_all(s, SrcKind::Posix, sub, CrawlOrder::default())?;
        total_row(&mut out, &head, "local: directory → directory", r, k);
        println!("{}", out.lines().last().unwrap_or_default());
    }
    let _ = writeln!(
        out,
        "\nkaiso: {} crawler threads, 10 MiB units, from start (connect) to the last stub gone. \
         rsync: a fresh destination each time. Source trees are in the page cache for every row. \
         Delayed rows: {}.\n",
        s.workers,
        s.delay_note()
    );
    println!("{out}");
    Ok(out)
}
