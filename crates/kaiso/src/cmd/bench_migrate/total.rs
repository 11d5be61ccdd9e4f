//! Part 3 of `kaiso bench migrate`: total migration time against `rsync -aHAX` of the
//! same tree, over the same delayed path and locally.

use super::*;

/// What one run cost: elapsed time, elapsed time until the copy is durable (the run, then
/// a `syncfs` of the destination's file system), and CPU time (user + system).
#[derive(Clone, Copy)]
struct Cost {
    wall: Duration,
    durable: Duration,
    cpu: Duration,
    /// Over the network: CPU of every process on the path (see [`PathCpu`]).
    path: Option<PathCpu>,
}

/// CPU seconds of a networked run by process: the client (kaiso's process without its
/// delay-proxy threads; rsync's client processes), the server (every process of smbd,
/// ganesha or the rsync daemon, forked per-connection ones included) and the delay
/// proxy between them.
#[derive(Clone, Copy)]
struct PathCpu {
    client: f64,
    server: f64,
    server_procs: usize,
    proxy: f64,
}

impl PathCpu {
    fn total(&self) -> f64 {
        self.client + self.server + self.proxy
    }

    /// `client 1.23 + smbd 0.45 (17 processes) + proxy 0.67 = 2.35`.
    fn line(&self, client: &str, server: &str) -> String {
        format!(
            "{client} {:.2} + {server} {:.2} ({} processes) + proxy {:.2} = {:.2}",
            self.client,
            self.server,
            self.server_procs,
            self.proxy,
            self.total()
        )
    }
}

/// `syncfs(2)` of the file system holding `dir`: what is still dirty of a run's copy is
/// written back. kaiso makes fetched data durable before the state that marks it present
/// (power loss), so part of its write-back is inside its elapsed time; rsync writes
/// nothing back itself. The "durable" columns compare both once the data is on disk.
fn sync_fs_of(dir: &Path) -> Result<Duration> {
    let t = Instant::now();
    let f = fs::File::open(dir).with_context(|| format!("open {}", dir.display()))?;
    // SAFETY: a valid descriptor, owned by `f` for the call.
    if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) } != 0 {
        return Err(std::io::Error::last_os_error()).context("syncfs");
    }
    Ok(t.elapsed())
}

/// CPU time (user + system) of this process (`RUSAGE_SELF`) or of its waited-for
/// descendants (`RUSAGE_CHILDREN`).
fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: all-zero is a valid `rusage`; getrusage only writes into it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid out pointer.
    unsafe { libc::getrusage(who, &mut ru) };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs a migration to the end with the crawler; returns the elapsed time, from attaching
/// the source (connect + migration open) to the last stub gone, and this process's CPU
/// time meanwhile. The destination store is created before the clock starts: a store
/// that takes over a share is already running, just as rsync's destination file system
/// is (on a fresh ext4 of its own unless `--shared-fs`, as rsync's destination).
fn migrate_all(s: &Setup, kind: SrcKind, sub: &str, bytes: u64) -> Result<Cost> {
    let dest = dest_on_own_fs(s, bytes)?;
    let cpu = cpu_time(libc::RUSAGE_SELF);
    let t = Instant::now();
    let mut cfg = MigrationConfig::new("bench");
    cfg.order = s.order;
    cfg.crawl_workers = s.workers;
    cfg.share_units = s.share_units;
    // `--timeline`: source calls logged, CPU by thread sampled before the threads end.
    let log = timeline::CallLog::new();
    let server_pid = match kind {
        SrcKind::Nfs => s.ganesha.as_ref().map(|g| g.pid()),
        SrcKind::Smb => s.samba.as_ref().map(|g| g.pid()),
        SrcKind::Posix => None,
    };
    let path_at_start = server_pid.map(|p| (timeline::tree_cpu(p), timeline::proxy_threads()));
    let cpu_at_start = s.timeline.then(|| {
        (
            timeline::ProcessCpu::sample(std::process::id()),
            server_pid.map(timeline::ProcessCpu::sample),
            proxy::io_counts(),
        )
    });
    let source = s.source(kind, sub)?;
    let source: Box<dyn Source> = if s.timeline {
        Box::new(timeline::Timed::new(source, log.clone()))
    } else {
        source
    };
    let m = dest.attach(source, cfg)?;
    let crawler = Crawler::start(dest.store.clone(), m.clone());
    // Polled finely: `Crawler::wait` looks every 20 ms, which would dominate small trees.
    let limit = Instant::now() + Duration::from_secs(6 * 3600);
    let st = loop {
        let st = crawler.state();
        if matches!(
            st,
            CrawlState::Done | CrawlState::Stuck | CrawlState::Stopped
        ) || Instant::now() >= limit
        {
            break st;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let wall = t.elapsed();
    let cpu = cpu_time(libc::RUSAGE_SELF).saturating_sub(cpu);
    // Sampled before the source is dropped: the server's per-connection processes are
    // still there (and so are the proxy threads of the source's connections).
    let path = server_pid
        .zip(path_at_start)
        .map(|(pid, ((server, _), proxy))| {
            let (server_now, procs) = timeline::tree_cpu(pid);
            let proxy = timeline::proxy_delta(&proxy, &timeline::proxy_threads());
            PathCpu {
                client: cpu.as_secs_f64() - proxy,
                server: server_now - server,
                server_procs: procs,
                proxy,
            }
        });
    let took = Cost {
        wall,
        durable: wall + sync_fs_of(&dest.dir)?,
        cpu,
        path,
    };
    if let Some((me, server, io)) = cpu_at_start {
        let io_now = proxy::io_counts();
        // Up to the crawl's end (`wall`), not past the durable `syncfs` above.
        println!("  {}", log.report(wall));
        println!(
            "  delay proxies: {} reads, {} writes",
            io_now.0 - io.0,
            io_now.1 - io.1
        );
        let me_now = timeline::ProcessCpu::sample(std::process::id());
        println!("  {}", me_now.delta_line("kaiso process", &me));
        if let (Some(pid), Some(server)) = (server_pid, server) {
            let now = timeline::ProcessCpu::sample(pid);
            println!("  {}", now.delta_line("old server", &server));
        }
        println!(
            "  {}",
            timeline::barrier_line(t, &dest.store.fetch_barrier().sync_log())
        );
    }
    drop(crawler);
    if st != CrawlState::Done {
        bail!("crawl of {sub} ended {}", st.as_str());
    }
    let skipped = m.skipped();
    if !skipped.is_empty() {
        bail!("{} objects skipped, e.g. {:?}", skipped.len(), skipped[0]);
    }
    Ok(took)
}

/// `rsync -aHAX from` into a fresh destination: a directory on a fresh ext4 of its own
/// (unless `--shared-fs`), made before the clock starts and removed after. With
/// `daemon` (the rsync daemon's pid, behind this process's delay proxy) the CPU of the
/// whole path is measured too.
fn rsync(s: &Setup, from: &str, bytes: u64, daemon: Option<u32>) -> Result<Cost> {
    let own = own_fs(s, "rsync-dst", bytes)?;
    let to = match &own {
        Some(f) => f.path().join("dst"),
        None => s.root.path().join("rsync-dst"),
    };
    let to = to.as_path();
    fs::create_dir_all(to)?;
    let cpu = cpu_time(libc::RUSAGE_CHILDREN);
    let at_start = daemon.map(|d| (timeline::tree_cpu(d).0, cpu_time(libc::RUSAGE_SELF)));
    let t = Instant::now();
    let st = Command::new("rsync")
        .args(["-aHAX", from])
        .arg(format!("{}/", to.display()))
        .status()
        .context("run rsync")?;
    let wall = t.elapsed();
    let cpu = cpu_time(libc::RUSAGE_CHILDREN).saturating_sub(cpu);
    if !st.success() {
        bail!("rsync {from} failed: {st}");
    }
    let path = daemon.zip(at_start).map(|(d, (server, me))| {
        // The daemon's per-connection process ends just after the client: wait (briefly)
        // until it is reaped, so its CPU is in the daemon's reaped-children fields.
        let until = Instant::now() + Duration::from_secs(2);
        while timeline::tree_cpu(d).1 > 1 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let (server_now, procs) = timeline::tree_cpu(d);
        PathCpu {
            client: cpu.as_secs_f64(),
            server: server_now - server,
            server_procs: procs,
            // This process runs only the delay proxy meanwhile.
            proxy: cpu_time(libc::RUSAGE_SELF).saturating_sub(me).as_secs_f64(),
        }
    });
    let took = Cost {
        wall,
        durable: wall + sync_fs_of(to)?,
        cpu,
        path,
    };
    // Removed before the unmount (`own` dropped here), so nothing is written back.
    let _ = fs::remove_dir_all(to);
    drop(own);
    Ok(took)
}

/// One row of the total-time table: rsync's cost `r`, kaiso's `k`, and their ratios.
/// CPU columns only where both CPU figures are like for like (`cpu`: the local rows;
/// over the network kaiso's process also runs the delay proxies, rsync's daemon is not
/// counted).
fn total_row(out: &mut String, head: &str, setup: &str, r: Cost, k: Result<Cost>, cpu: bool) {
    let rw = r.wall.as_secs_f64();
    let _ = match k {
        Ok(k) => {
            let kw = k.wall.as_secs_f64();
            let cpu_cols = match (r.path, k.path) {
                // Over the network: every process on the path, both sides.
                (Some(rp), Some(kp)) => {
                    let (rc, kc) = (rp.total(), kp.total());
                    format!("{rc:.2} | {kc:.2} | {:.2}×", kc / rc.max(1e-3))
                }
                _ if cpu => {
                    let (rc, kc) = (r.cpu.as_secs_f64(), k.cpu.as_secs_f64());
                    format!("{rc:.2} | {kc:.2} | {:.2}×", kc / rc.max(1e-3))
                }
                _ => "— | — | —".to_string(),
            };
            let (rd, kd) = (r.durable.as_secs_f64(), k.durable.as_secs_f64());
            writeln!(
                out,
                "{head} {setup} | {rw:.2} | {kw:.2} | {:.2}× | {rd:.2} | {kd:.2} | {:.2}× | {cpu_cols} |",
                kw / rw,
                kd / rd
            )
        }
        Err(e) => writeln!(
            out,
            "{head} {setup} | {rw:.2} | failed: {e:#} | — | — | — | — | — | — | — |"
        ),
    };
    println!("{}", out.lines().last().unwrap_or_default());
}

/// The best of `reps` runs of `f`, elapsed and CPU time each at its minimum: this
/// machine is shared, and the minimum is the figure least disturbed by other load, for
/// rsync and kaiso alike.
fn best_of(reps: usize, mut f: impl FnMut() -> Result<Cost>) -> Result<Cost> {
    let mut best = f()?;
    for _ in 1..reps {
        let c = f()?;
        best = Cost {
            wall: best.wall.min(c.wall),
            durable: best.durable.min(c.durable),
            cpu: best.cpu.min(c.cpu),
            // The breakdown of the run whose path took least CPU.
            path: match (best.path, c.path) {
                (Some(b), Some(n)) if n.total() < b.total() => Some(n),
                (b, n) => b.or(n),
            },
        };
    }
    Ok(best)
}

/// Part 3, total migration time vs rsync -aHAX, like for like: every networked source
/// kind against rsync's own daemon behind the same kind of delay proxy, and the POSIX
/// source against a local rsync.
pub(super) fn bench_total(
    s: &Setup,
    datasets: &[(Shape, String, dataset::Generated)],
    count_div: u64,
    size_div: u64,
) -> Result<String> {
    let reps = if s.quick { 3 } else { 1 };
    let mut out = format!(
        "## 3. Total migration time, Table 2.2-shaped datasets (counts / {count_div}, sizes / {size_div})\n\n\
         | dataset | dirs | files | GiB | mean depth | path | rsync -aHAX (s) | kaiso BFS+{} (s) | kaiso / rsync | rsync + syncfs (s) | kaiso + syncfs (s) | durable kaiso / rsync | rsync CPU (s) | kaiso CPU (s) | CPU kaiso / rsync |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        s.order.phasing.as_str()
    );
    let networked: Vec<SrcKind> = kinds(s)
        .into_iter()
        .filter(|k| *k != SrcKind::Posix)
        .collect();
    // The delayed baseline: rsync's own daemon behind the same kind of proxy.
    let delayed = if networked.is_empty() {
        None
    } else {
        let daemon = RsyncDaemon::start(&s.src())?;
        let up = SocketAddr::from(([127, 0, 0, 1], daemon.port));
        let proxy = DelayProxy::start(up, s.delay, s.rate)?;
        Some((daemon, proxy))
    };
    for (sc, sub, g) in datasets {
        let gib = g.bytes as f64 / (1u64 << 30) as f64;
        let head = format!(
            "| ({}) | {} | {} | {gib:.2} | {:.1} |",
            sc.name, g.dirs, g.files, g.mean_depth
        );
        if let Some((daemon, rproxy)) = &delayed {
            let from = format!("rsync://127.0.0.1:{}/src/{sub}/", rproxy.port);
            let before = s.timeline.then(|| {
                (
                    timeline::process_cpu(std::process::id(), false),
                    timeline::process_cpu(daemon.pid(), true),
                    proxy::io_counts(),
                    rproxy.bytes(),
                )
            });
            let r = best_of(reps, || rsync(s, &from, g.bytes, Some(daemon.pid())))?;
            if let Some(p) = r.path {
                println!("  CPU s, rsync: {}", p.line("client", "daemon"));
            }
            if let Some((me, d, io, by)) = before {
                let io_now = proxy::io_counts();
                // Over all `reps` runs; the bench process runs only the delay proxy then.
                println!(
                    "  rsync ({reps} runs): best {:.0} ms, client CPU {:.2} s (best), daemon CPU {:.2} s, delay proxy CPU {:.2} s, {:.0} MiB in {} reads and {} writes",
                    r.wall.as_secs_f64() * 1e3,
                    r.cpu.as_secs_f64(),
                    timeline::process_cpu(daemon.pid(), true) - d,
                    timeline::process_cpu(std::process::id(), false) - me,
                    (rproxy.bytes() - by) as f64 / (1 << 20) as f64,
                    io_now.0 - io.0,
                    io_now.1 - io.1
                );
            }
            tracing::debug!(bytes = rproxy.bytes(), "delayed rsync traffic so far");
            for &kind in &networked {
                let k = best_of(reps, || migrate_all(s, kind, sub, g.bytes));
                if let Ok(Cost { path: Some(p), .. }) = &k {
                    let server = if kind == SrcKind::Smb {
                        "smbd"
                    } else {
                        "ganesha"
                    };
                    println!("  CPU s, kaiso: {}", p.line("kaiso", server));
                }
                let setup = format!("delayed: rsync daemon vs {}, same proxy", kind.label());
                total_row(&mut out, &head, &setup, r, k, false);
            }
        }
        if s.posix {
            let from = format!("{}/", s.src().join(sub).display());
            let r = best_of(reps, || rsync(s, &from, g.bytes, None))?;
            let k = best_of(reps, || migrate_all(s, SrcKind::Posix, sub, g.bytes));
            total_row(&mut out, &head, "local: directory → directory", r, k, true);
        }
    }
    let _ = writeln!(
        out,
        "\nkaiso: {} crawler threads, bfs + {} crawl, 10 MiB units, from attaching the source (connect) to the last stub gone (the destination store exists before). \
         Destinations (rsync's and kaiso's): {}. Best of {reps} runs each (time and CPU each at \
         their minimum). Durable columns: each run followed by a `syncfs` of its destination's file system, timed \
         (kaiso orders fetched data before the state that marks it present, so part of its write-back is inside its own time; rsync writes nothing back itself). CPU: user + system time during the run; local rows: kaiso's process (every thread) and rsync's \
         processes; delayed rows: every process on the path (kaiso's process with its delay proxy and the \
         server's processes; rsync's client, the rsync daemon with its per-connection processes, and the \
         delay proxy), printed by process above the table. Source trees are in the page cache for every row. Delayed rows: {}.\n",
        s.workers,
        s.order.phasing.as_str(),
        if s.fresh_fs {
            "a fresh ext4 (loop device) each run"
        } else {
            "a fresh directory each run, all on the file system of --dir"
        },
        s.delay_note()
    );
    println!("{out}");
    Ok(out)
}
