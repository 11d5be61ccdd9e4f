//! Operator commands against a store: status, where, explain, pin/unpin, promote/demote.
//!
//! A running mount is reached through its control socket (`<state_dir>/control.sock`);
//! the state directory is found from the mount's source name (`kaiso:<state_dir>` in
//! /proc/self/mountinfo) or from `--config`. Without a running mount, `--config` opens the
//! store in this process (moves then run here, with the same code).

use anyhow::{Context, bail};
use kaiso_store::control::{Client, Request};
use kaiso_store::{Direction, Store};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Store configuration (TOML); default: every mounted kaiso store.
    pub config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PathArgs {
    /// A path inside a kaiso mount (or, with --config, relative to the store root).
    pub path: PathBuf,
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct PinArgs {
    pub path: PathBuf,
    #[arg(short, long)]
    pub recursive: bool,
    /// Tier to pin to (default: where each file is now).
    #[arg(long)]
    pub tier: Option<String>,
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct MoveArgs {
    pub path: PathBuf,
    #[arg(short, long)]
    pub recursive: bool,
    /// Target tier (default: one tier faster for promote, slower for demote).
    #[arg(long)]
    pub tier: Option<String>,
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start the move and return without waiting.
    #[arg(long)]
    pub no_wait: bool,
}

/// A kaiso mount as listed in /proc/self/mountinfo.
struct KaisoMount {
    mountpoint: PathBuf,
    state_dir: PathBuf,
}

fn kaiso_mounts() -> Vec<KaisoMount> {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let source = post.next()?;
            if !fstype.starts_with("fuse") || !source.starts_with("kaiso:") {
                return None;
            }
            let mp = pre.split(' ').nth(4)?;
            Some(KaisoMount {
                mountpoint: PathBuf::from(unescape(mp)),
                state_dir: PathBuf::from(unescape(source.strip_prefix("kaiso:")?)),
            })
        })
        .collect()
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut i = 0;
    let b = s.as_bytes();
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8)
        {
            out.push(v as char);
            i += 4;
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
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
    let abs = std::fs::canonicalize(&abs).unwrap_or(abs);
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

fn print_status(title: &str, s: &kaiso_store::StoreStatus) {
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
}

pub fn status(a: StatusArgs) -> anyhow::Result<()> {
    let mut targets: Vec<(String, Target)> = Vec::new();
    match &a.config {
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
            print_status(&title, &serde_json::from_value(v)?);
        }
    }
    Ok(())
}

pub fn where_is(a: PathArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = t.call(Request::Where { path: rel })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let p: kaiso_store::Placement = serde_json::from_value(v)?;
    println!(
        "{}: {} on tier {} ({}){}",
        a.path.display(),
        p.kind,
        p.tiers.join(","),
        p.backing_path,
        p.pinned
            .map(|t| format!(", pinned to {t}"))
            .unwrap_or_default()
    );
    Ok(())
}

pub fn explain(a: PathArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = t.call(Request::Explain { path: rel })?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let e: kaiso_store::Explanation = serde_json::from_value(v)?;
    println!(
        "{}: {} on tier {} ({}, {} bytes)",
        a.path.display(),
        e.placement.kind,
        e.placement.tiers.join(","),
        e.placement.backing_path,
        e.placement.size
    );
    println!("  rule:   {}", e.rule);
    println!("  policy: {}", e.policy);
    Ok(())
}

/// Follow a job with a progress bar (bytes, ETA) until it finishes.
fn follow(t: &mut Target, job: u64, what: &str) -> anyhow::Result<()> {
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    loop {
        let p: kaiso_store::JobProgress =
            serde_json::from_value(t.call(Request::Job { id: job })?)?;
        bar.set_length(p.bytes_total);
        bar.set_position(p.bytes_done);
        bar.set_message(format!("{what} {}/{} files", p.files_done, p.files_total));
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

pub fn pin(a: PinArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = t.call(Request::Pin {
        path: rel,
        tier: a.tier.clone(),
        recursive: a.recursive,
    })?;
    println!("pinned {} files", v["files"]);
    if let Some(job) = v["job"].as_u64() {
        follow(&mut t, job, "moving to the pin tier")?;
    }
    Ok(())
}

pub fn unpin(a: MoveArgs) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = t.call(Request::Unpin {
        path: rel,
        recursive: a.recursive,
    })?;
    println!("unpinned {} files", v["files"]);
    Ok(())
}

fn start_move(a: MoveArgs, direction: Direction) -> anyhow::Result<()> {
    let (mut t, rel) = resolve(&a.path, a.config.as_deref())?;
    let v = t.call(Request::Move {
        path: rel,
        direction,
        tier: a.tier.clone(),
        recursive: a.recursive,
    })?;
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
