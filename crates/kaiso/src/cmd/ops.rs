//! Operator commands against a store: status, where, explain, pin/unpin, promote/demote.
//!
//! A running mount is reached through its control socket (`<state_dir>/control.sock`);
//! the state directory is found from the mount's source name (`kaiso:<state_dir>` in
//! /proc/self/mountinfo) or from `--config`. Without a running mount, `--config` opens the
//! store in this process (moves then run here, with the same code).
//!
//! Paths are bytes end to end (a name need not be UTF-8): the control protocol carries
//! them as such, text output prints them as they are, and JSON output shows a lossy
//! string plus the exact bytes where they differ (`backing_path_bytes`).

use anyhow::{Context, bail};
use kaiso_store::control::{Client, Request};
use kaiso_store::{Direction, Store};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Store configuration (TOML); default: every mounted kaiso store.
    pub config: Option<PathBuf>,
    /// The same as CONFIG (every other operator command takes `--config`).
    #[arg(long = "config", value_name = "CONFIG", conflicts_with = "config")]
    pub config_flag: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PathArgs {
    /// A path inside a kaiso mount (or, with --config, relative to the store root).
    pub path: PathBuf,
    /// Store configuration: open the store (or reach its running mount) from it; PATH is
    /// then relative to the store root.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PinArgs {
    /// A path inside a kaiso mount (or, with --config, relative to the store root).
    pub path: PathBuf,
    /// Every file below the directory PATH.
    #[arg(short, long)]
    pub recursive: bool,
    /// Tier to pin to (default: where each file is now).
    #[arg(long)]
    pub tier: Option<String>,
    /// Store configuration: open the store (or reach its running mount) from it; PATH is
    /// then relative to the store root.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct UnpinArgs {
    /// A path inside a kaiso mount (or, with --config, relative to the store root).
    pub path: PathBuf,
    /// Every file below the directory PATH.
    #[arg(short, long)]
    pub recursive: bool,
    /// Store configuration: open the store (or reach its running mount) from it; PATH is
    /// then relative to the store root.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct MoveArgs {
    /// A path inside a kaiso mount (or, with --config, relative to the store root).
    pub path: PathBuf,
    /// Every file below the directory PATH.
    #[arg(short, long)]
    pub recursive: bool,
    /// Target tier (default: one tier faster for promote, slower for demote).
    #[arg(long)]
    pub tier: Option<String>,
    /// Store configuration: open the store (or reach its running mount) from it; PATH is
    /// then relative to the store root.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start the move and return without waiting.
    #[arg(long)]
    pub no_wait: bool,
}

/// A kaiso mount as listed in /proc/self/mountinfo.
pub(crate) struct KaisoMount {
    pub(crate) mountpoint: PathBuf,
    pub(crate) state_dir: PathBuf,
}

pub(crate) fn kaiso_mounts() -> Vec<KaisoMount> {
    // Bytes, not text: a mount point's name need not be UTF-8.
    let Ok(info) = std::fs::read("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.split(|b| *b == b'\n')
        .filter_map(|l| {
            let sep = l.windows(3).position(|w| w == b" - ")?;
            let (pre, post) = (&l[..sep], &l[sep + 3..]);
            let mut post = post.split(|b| *b == b' ');
            let fstype = post.next()?;
            let source = post.next()?;
            if !fstype.starts_with(b"fuse") || !source.starts_with(b"kaiso:") {
                return None;
            }
            let mp = pre.split(|b| *b == b' ').nth(4)?;
            Some(KaisoMount {
                mountpoint: unescape(mp),
                state_dir: unescape(&source[b"kaiso:".len()..]),
            })
        })
        .collect()
}

/// Decodes mountinfo's octal escapes (`\040` for a space, …) into the path's bytes.
fn unescape(s: &[u8]) -> PathBuf {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = s[i + 1..i + 4]
                .iter()
                .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
            if let Ok(v) = u8::try_from(v) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(s[i]);
        i += 1;
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Where requests go: a running daemon, or a store opened here.
pub(crate) enum Target {
    Remote(Client),
    Local(Arc<Store>),
}

impl Target {
    pub(crate) fn call(&mut self, req: Request) -> anyhow::Result<serde_json::Value> {
        match self {
            Target::Remote(c) => c.call(&req),
            Target::Local(s) => {
                kaiso_store::control::handle(s, req).map_err(|e| anyhow::anyhow!(e))
            }
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Target::Local(s) = self {
            s.shutdown();
        }
    }
}

fn connect(state_dir: &Path) -> anyhow::Result<Client> {
    Client::connect(state_dir).with_context(|| {
        format!(
            "cannot reach the kaiso daemon of {} (is it mounted, and are you root?)",
            state_dir.display()
        )
    })
}

/// Target and store-relative path for a PATH argument.
pub(crate) fn resolve(path: &Path, config: Option<&Path>) -> anyhow::Result<(Target, PathBuf)> {
    if let Some(cfg) = config {
        let cfg = crate::cmd::mount::load_config(cfg)?;
        let rel = path.strip_prefix("/").unwrap_or(path).to_path_buf();
        return match Client::connect(&cfg.state_dir) {
            Ok(c) => Ok((Target::Remote(c), rel)),
            Err(_) => Ok((Target::Local(Store::open(cfg)?), rel)),
        };
    }
    let abs = std::path::absolute(path)?;
    // Resolve symlinks above the named entry only: `where LINK` describes the link.
    let abs = match (abs.parent(), abs.file_name()) {
        (Some(dir), Some(name)) => std::fs::canonicalize(dir)
            .map(|d| d.join(name))
            .unwrap_or(abs.clone()),
        _ => std::fs::canonicalize(&abs).unwrap_or(abs),
    };
    let best = kaiso_mounts()
        .into_iter()
        .filter(|m| abs.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.as_os_str().len());
    let Some(m) = best else {
        bail!(
            "{} is not inside a kaiso mount (give --config CONFIG and a store-relative path)",
            path.display()
        );
    };
    let rel = abs.strip_prefix(&m.mountpoint)?.to_path_buf();
    Ok((Target::Remote(connect(&m.state_dir)?), rel))
}

/// Sends a request about the operator's PATH; an error names that path first, in one line.
fn call_for(t: &mut Target, path: &Path, req: Request) -> anyhow::Result<serde_json::Value> {
    t.call(req)
        .map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))
}

/// Prints byte strings as one line (paths exactly as they are, like `find`).
fn print_bytes(parts: &[&[u8]]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    for p in parts {
        out.write_all(p)?;
    }
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

fn human(b: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in seconds.
fn utc_time(secs: u64) -> String {
    // Days to a civil date (proleptic Gregorian), after H. Hinnant's days_from_civil inverse.
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The line `kaiso status` prints under an offline tier's row (None while it is online),
/// from the tier's object in the status reply (older daemons send no `online`: online).
fn offline_line(t: &serde_json::Value) -> Option<String> {
    if t.get("online").and_then(|v| v.as_bool()).unwrap_or(true) {
        return None;
    }
    let num = |k: &str| t.get(k).and_then(|v| v.as_u64());
    let name = t.get("name").and_then(|v| v.as_str()).unwrap_or("?");
    let path = t.get("path").and_then(|v| v.as_str()).unwrap_or("?");
    let since = match (num("offline_since_unix"), num("offline_for_secs")) {
        (Some(at), Some(f)) => format!(" since {} UTC ({f} s)", utc_time(at)),
        _ => String::new(),
    };
    Some(format!(
        "  ! tier {name} OFFLINE{since}: directory {path} is missing; {} files unreachable until it returns",
        num("unreachable_files").unwrap_or(0)
    ))
}

fn print_status(title: &str, v: &serde_json::Value) -> anyhow::Result<()> {
    let s: kaiso_store::StoreStatus = serde_json::from_value(v.clone())?;
    println!("{title}  (policy {}, {} files)", s.policy, s.files);
    println!(
        "  {:<10} {:>10} {:>10} {:>6} {:>9} {:>7} {:>6}  device",
        "tier", "used", "capacity", "use%", "accesses", "share", "busy"
    );
    for t in &s.tiers {
        println!(
            "  {:<10} {:>10} {:>10} {:>5.1}% {:>9} {:>6.1}% {:>5.0}%  {}",
            t.name,
            human(t.used),
            human(t.capacity),
            100.0 * t.used as f64 / t.capacity.max(1) as f64,
            t.accesses,
            100.0 * t.access_share,
            100.0 * t.busy,
            t.device.as_deref().unwrap_or("-")
        );
    }
    let rows = v.get("tiers").and_then(|t| t.as_array());
    for line in rows.into_iter().flatten().filter_map(offline_line) {
        println!("{line}");
    }
    let m = &s.mover;
    println!(
        "  mover: queue {} files / {}, moved {} files / {}, failed {}, rate {}/s{}",
        m.queued_files,
        human(m.queued_bytes),
        m.moved_files,
        human(m.moved_bytes),
        m.failed_moves,
        human(m.rate as u64),
        if m.backing_off {
            " (backing off: foreground busy)"
        } else {
            ""
        }
    );
    Ok(())
}

pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    let mut targets: Vec<(String, Target)> = Vec::new();
    match a.config.as_ref().or(a.config_flag.as_ref()) {
        Some(c) => {
            let (t, _) = resolve(Path::new(""), Some(c))?;
            targets.push((c.display().to_string(), t));
        }
        None => {
            let mounts = kaiso_mounts();
            if mounts.is_empty() {
                bail!("no kaiso mount found (give a CONFIG to inspect an unmounted store)");
            }
            for m in mounts {
                targets.push((
                    m.mountpoint.display().to_string(),
                    Target::Remote(connect(&m.state_dir)?),
                ));
            }
        }
    }
    for (title, mut t) in targets {
        let v = t.call(Request::Status)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            print_status(&title, &v)?;
        }
    }
    Ok(())
}

pub fn where_is(a: PathArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = call_for(&mut t, &a.path, Request::Where { path: rel })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let p: kaiso_store::Placement = serde_json::from_value(v)?;
    let tail = format!(
        "){}",
        p.pinned
            .as_ref()
            .map(|t| format!(", pinned to {t}"))
            .unwrap_or_default()
    );
    print_bytes(&[
        a.path.as_os_str().as_bytes(),
        format!(": {} on tier {} (", p.kind, p.tiers.join(",")).as_bytes(),
        p.backing_path_raw(),
        tail.as_bytes(),
    ])
}

pub fn explain(a: PathArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = call_for(&mut t, &a.path, Request::Explain { path: rel })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let e: kaiso_store::Explanation = serde_json::from_value(v)?;
    print_bytes(&[
        a.path.as_os_str().as_bytes(),
        format!(
            ": {} on tier {} (",
            e.placement.kind,
            e.placement.tiers.join(",")
        )
        .as_bytes(),
        e.placement.backing_path_raw(),
        format!(", {} bytes)", e.placement.size).as_bytes(),
    ])?;
    println!("  rule:   {}", e.rule);
    println!("  policy: {}", e.policy);
    Ok(())
}

/// Follow a job with a progress bar (bytes, ETA) until it finishes.
fn follow(t: &mut Target, job: u64, what: &str) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    // On a terminal a bar; otherwise (logs, pipes, cron) a plain line a second.
    let tty = std::io::stderr().is_terminal();
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let start = std::time::Instant::now();
    let mut last_line: Option<std::time::Instant> = None;
    loop {
        let p: kaiso_store::JobProgress =
            serde_json::from_value(t.call(Request::Job { id: job })?)?;
        bar.set_length(p.bytes_total.max(p.bytes_done));
        bar.set_position(p.bytes_done);
        bar.set_message(format!("{what} {}/{} files", p.files_done, p.files_total));
        if !tty && (p.finished || last_line.is_none_or(|l| l.elapsed() >= Duration::from_secs(1))) {
            eprintln!("{}", progress_line(what, &p, start.elapsed()));
            last_line = Some(std::time::Instant::now());
        }
        if p.finished {
            bar.finish();
            if p.failed > 0 {
                bail!(
                    "{} of {} files not moved; last error: {}",
                    p.failed,
                    p.files_total,
                    p.error.unwrap_or_default()
                );
            }
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One progress line: files, bytes, rate so far and the time left at that rate.
fn progress_line(what: &str, p: &kaiso_store::JobProgress, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 {
        p.bytes_done as f64 / secs
    } else {
        0.0
    };
    let left = p.bytes_total.saturating_sub(p.bytes_done);
    let eta = if p.finished && p.failed > 0 {
        format!("done, {} not moved", p.failed)
    } else if p.finished {
        "done".to_string()
    } else if rate > 0.0 {
        format!("ETA {:.0} s", left as f64 / rate)
    } else {
        "ETA unknown".to_string()
    };
    format!(
        "{what} {}/{} files, {}/{}, {}/s, {eta}",
        p.files_done,
        p.files_total,
        human(p.bytes_done),
        // Files that grew while they moved count their copied size.
        human(p.bytes_total.max(p.bytes_done)),
        human(rate as u64)
    )
}

pub fn pin(a: PinArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = call_for(
        &mut t,
        &a.path,
        Request::Pin {
            path: rel,
            tier: a.tier.clone(),
            recursive: a.recursive,
        },
    )?;
    println!("pinned {} files", v["files"]);
    if let Some(job) = v["job"].as_u64() {
        follow(&mut t, job, "moving to the pin tier")?;
    }
    Ok(())
}

pub fn unpin(a: UnpinArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = call_for(
        &mut t,
        &a.path,
        Request::Unpin {
            path: rel,
            recursive: a.recursive,
        },
    )?;
    println!("unpinned {} files", v["files"]);
    Ok(())
}

fn start_move(a: MoveArgs, direction: Direction) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = call_for(
        &mut t,
        &a.path,
        Request::Move {
            path: rel,
            direction,
            tier: a.tier.clone(),
            recursive: a.recursive,
        },
    )?;
    let job = v["job"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("no job id in reply"))?;
    if a.no_wait && matches!(t, Target::Remote(_)) {
        println!("job {job} started");
        return Ok(());
    }
    follow(
        &mut t,
        job,
        if direction == Direction::Promote {
            "promoting"
        } else {
            "demoting"
        },
    )
}

pub fn promote(a: MoveArgs) -> anyhow::Result<()> {
    start_move(a, Direction::Promote)
}

pub fn demote(a: MoveArgs) -> anyhow::Result<()> {
    start_move(a, Direction::Demote)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_give_counts_rate_and_eta() {
        let mut p = kaiso_store::JobProgress {
            files_total: 4,
            files_done: 1,
            bytes_total: 4 << 20,
            bytes_done: 1 << 20,
            ..Default::default()
        };
        let l = progress_line("demoting", &p, Duration::from_secs(2));
        assert_eq!(
            l,
            "demoting 1/4 files, 1.0 MiB/4.0 MiB, 512.0 KiB/s, ETA 6 s"
        );
        p.bytes_done = 0;
        assert!(progress_line("x", &p, Duration::ZERO).ends_with("ETA unknown"));
        p.finished = true;
        assert!(progress_line("x", &p, Duration::from_secs(1)).ends_with(", done"));
        // A finished job with failures says so; a file that grew while it moved never
        // shows more bytes done than in total.
        p.failed = 1;
        assert!(progress_line("x", &p, Duration::from_secs(1)).ends_with(", done, 1 not moved"));
        p.bytes_done = 5 << 20;
        assert!(progress_line("x", &p, Duration::from_secs(1)).contains("5.0 MiB/5.0 MiB"));
    }

    #[test]
    fn mountinfo_escapes_decode_to_the_path_bytes() {
        assert_eq!(
            unescape(b"/mnt/my\\040data\\134x"),
            PathBuf::from("/mnt/my data\\x")
        );
        // Bytes that are not UTF-8 come through raw, escapes that are not octal stay.
        assert_eq!(
            unescape(b"/mnt/caf\xe9\\9zz").as_os_str().as_bytes(),
            b"/mnt/caf\xe9\\9zz"
        );
        assert_eq!(unescape(b"tail\\04").as_os_str().as_bytes(), b"tail\\04");
    }
}
