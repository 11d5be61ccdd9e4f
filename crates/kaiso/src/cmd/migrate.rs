//! `kaiso migrate start|status|pause|resume|throttle|finish`: post-copy migration of a live
//! file server into a store (docs/migration.md).
//!
//! `start` is the daemon: it opens the store, binds each share's source, serves the
//! store at once (FUSE mount and/or the embedded NFSv3 server; the share roots are dummy
//! directories, so this takes well under a second whatever the tree size) and crawls in
//! the background. The other commands talk to it over the store's control socket
//! (`Request::Migrate`); `start` against a running daemon adds a share to it (N-to-1).
//! The engine itself is `kaiso_store::migrate`; the sources are `kaiso-source`.

mod daemon;
mod progress;
mod protocol;
mod rate;

use anyhow::{Context, bail};
use kaiso_store::control::{Client, NOT_MIGRATING, Request};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use protocol::{Call, ShareSpec, StatusReply};

// Parsed once per process: the size difference between variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand)]
pub enum MigrateCommand {
    /// Serve a store at once and migrate SOURCE into it (on demand + background crawl).
    Start(StartArgs),
    /// Progress of the running migration: files/bytes done, remaining stubs, rates, ETA.
    Status(StatusArgs),
    /// Pause the background crawl (client accesses are still fetched on demand).
    Pause(ShareArgs),
    /// Resume (or restart) the background crawl.
    Resume(ShareArgs),
    /// Limit the crawl's bandwidth, e.g. `50MiB` (per second) or `off`.
    Throttle(ThrottleArgs),
    /// Verify against the source, remove all migration state and detach the source.
    Finish(FinishArgs),
}

#[derive(clap::Args, Clone)]
pub struct StartArgs {
    /// The old server: /PATH, posix:/PATH, nfs://HOST[:PORT]/EXPORT?…, smb://USER@HOST/SHARE
    pub source: String,
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Name of this share's migration (default: the last component of --into, or "main").
    #[arg(long)]
    pub share: Option<String>,
    /// Store directory the share appears in (relative to the store root; default: the root).
    #[arg(long, default_value = "", value_name = "SUBDIR")]
    pub into: String,
    /// Present the store through a FUSE mount here.
    #[arg(long, value_name = "MOUNTPOINT")]
    pub mount: Option<PathBuf>,
    /// Serve the store over NFSv3 on this address (e.g. 0.0.0.0:2049).
    #[arg(long, value_name = "ADDR:PORT")]
    pub nfs: Option<String>,
    #[command(flatten)]
    pub access: super::serve::NfsAccessArgs,
    /// Crawl order: bfs (breadth-first) or dfs (depth-first).
    #[arg(long, default_value = "bfs")]
    pub order: String,
    /// metadata-first (two strict passes), metadata-priority (metadata first, data of
    /// metadata-complete files in the gaps) or bulk (metadata and data together).
    #[arg(long, default_value = "metadata-first")]
    pub mode: String,
    /// Crawler threads (8 measured fastest on a 2-core machine: they mostly wait on the
    /// source; docs/reproduction/migration.md §3).
    #[arg(long, default_value_t = 8)]
    pub parallel: usize,
    /// Fetch unit (on demand and crawl).
    #[arg(long, default_value = "10MiB")]
    pub chunk: String,
    /// Crawl bandwidth limit per second, e.g. 50MiB (demand fetches are never limited).
    #[arg(long, value_name = "LIMIT")]
    pub rate: Option<String>,
    /// Serve, but do not crawl until `kaiso migrate resume`.
    #[arg(long)]
    pub paused: bool,
    /// A source entry whose metadata (xattrs, ACL, streams, symlink target, a directory's
    /// times) keeps failing as unreachable while the rest of the source answers is given
    /// up (reported as skipped, migrated without it) after this many counted failures
    /// (1 to 1000000) ...
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub meta_give_up_attempts: u32,
    /// ... and at least this long after its first one (e.g. 15m, 90s; 0: attempts only).
    #[arg(long, default_value = "15m", value_name = "DUR")]
    pub meta_give_up_after: String,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Never use kernel passthrough on the FUSE mount (by default complete files are read
    /// and written by the kernel directly, like `kaiso mount`; stubs never are).
    #[arg(long)]
    pub no_passthrough: bool,
}

#[derive(clap::Args)]
pub struct ShareArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Only this share (default: every share of the store).
    #[arg(long)]
    pub share: Option<String>,
}

#[derive(clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: ShareArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Show a live progress bar until the crawl ends (Ctrl-C to leave).
    #[arg(long)]
    pub watch: bool,
    /// Refresh interval of --watch.
    #[arg(long, default_value = "1s")]
    pub interval: String,
}

#[derive(clap::Args)]
pub struct ThrottleArgs {
    #[command(flatten)]
    pub target: ShareArgs,
    /// Bytes per second (e.g. 50MiB) or `off`.
    pub rate: String,
}

#[derive(clap::Args)]
pub struct FinishArgs {
    #[command(flatten)]
    pub target: ShareArgs,
    /// Wait up to this long for the crawl to complete first (e.g. 10m); default: do not wait.
    #[arg(long, value_name = "DUR")]
    pub wait: Option<String>,
    /// Finish although source entries could not be migrated (permission denied, not
    /// creatable here…, listed by `status`); without it `finish` refuses then.
    #[arg(long)]
    pub accept_skipped: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(c: MigrateCommand) -> anyhow::Result<()> {
    match c {
        MigrateCommand::Start(a) => daemon::start(a),
        MigrateCommand::Status(a) => status(a),
        MigrateCommand::Pause(a) => simple(&a, |share| Call::Pause { share }, "paused"),
        MigrateCommand::Resume(a) => simple(&a, |share| Call::Resume { share }, "resumed"),
        MigrateCommand::Throttle(a) => {
            let bytes_per_sec = parse_rate(&a.rate)?;
            simple(
                &a.target,
                move |share| Call::Throttle {
                    share,
                    bytes_per_sec,
                },
                "throttled",
            )
        }
        MigrateCommand::Finish(a) => finish(a),
    }
}

/// `50MiB` → Some(52428800) bytes per second; `off`/`0`/`none` → None.
pub(crate) fn parse_rate(s: &str) -> anyhow::Result<Option<u64>> {
    let t = s.trim().trim_end_matches("/s");
    if matches!(t, "off" | "none" | "0" | "unlimited") {
        return Ok(None);
    }
    let n = kaiso_store::config::parse_size_str(t)
        .map_err(|e| anyhow::anyhow!("bad rate {s:?}: {e} (e.g. 50MiB or off)"))?;
    Ok((n > 0).then_some(n))
}

/// Names of the shares still being migrated into the store at `state_dir`.
pub(crate) fn unfinished_shares(state_dir: &Path) -> anyhow::Result<Vec<String>> {
    Ok(daemon::saved_specs(state_dir)?
        .into_iter()
        .map(|s| s.name)
        .collect())
}

/// Refuses to open a store that is still being migrated outside the migration daemon:
/// its stubs need their source, which only the daemon has. `face` is the daemon flag
/// that serves the same way (`--mount MOUNTPOINT`, `--nfs ADDR`).
pub(crate) fn refuse_if_migrating(
    state_dir: &Path,
    config: &Path,
    face: &str,
) -> anyhow::Result<()> {
    let unfinished = unfinished_shares(state_dir)?;
    if !unfinished.is_empty() {
        bail!(
            "{} is being migrated (share {}): serve it with `kaiso migrate start SOURCE {} {face}` until `kaiso migrate finish`",
            config.display(),
            unfinished.join(", "),
            config.display(),
        );
    }
    Ok(())
}

/// The state directory of the store a configuration names.
fn state_dir(config: &Path) -> anyhow::Result<PathBuf> {
    Ok(super::mount::load_config(config)?.state_dir)
}

/// Connects to the running migration daemon of a store, if any.
pub(crate) fn connect(state_dir: &Path) -> Option<Client> {
    Client::connect(state_dir).ok()
}

/// One migrate call to the daemon; "not migrating" becomes the store-busy error.
pub(crate) fn call(client: &mut Client, c: &Call) -> anyhow::Result<serde_json::Value> {
    let args = serde_json::to_value(c)?;
    client
        .call(&Request::Migrate { args })
        .map_err(|e| match e.to_string() {
            m if m == NOT_MIGRATING => anyhow::anyhow!("store busy: {m}; stop it first"),
            m => anyhow::anyhow!("{m}"),
        })
}

fn daemon_for(config: &Path) -> anyhow::Result<Client> {
    let dir = state_dir(config)?;
    connect(&dir).ok_or_else(|| {
        anyhow::anyhow!(
            "no migration is running for {} (start one with `kaiso migrate start SOURCE {}`)",
            config.display(),
            config.display()
        )
    })
}

fn simple(a: &ShareArgs, make: impl Fn(Option<String>) -> Call, what: &str) -> anyhow::Result<()> {
    let mut c = daemon_for(&a.config)?;
    let v = call(&mut c, &make(a.share.clone()))?;
    let names: Vec<String> =
        serde_json::from_value(v.get("shares").cloned().unwrap_or_default()).unwrap_or_default();
    println!("kaiso: {what} {}", names.join(", "));
    Ok(())
}

fn fetch_status(a: &ShareArgs) -> anyhow::Result<StatusReply> {
    let dir = state_dir(&a.config)?;
    match connect(&dir) {
        Some(mut c) => {
            let v = call(
                &mut c,
                &Call::Status {
                    share: a.share.clone(),
                },
            )?;
            Ok(serde_json::from_value(v).context("status reply")?)
        }
        // No daemon: what the state databases say (e.g. after a crash, before a restart).
        None => progress::offline_status(&dir, a.share.as_deref()),
    }
}

fn status(a: StatusArgs) -> anyhow::Result<()> {
    let interval = kaiso_nfs::parse_duration(&a.interval)
        .map_err(|e| anyhow::anyhow!("--interval: {e}"))?
        .max(Duration::from_millis(100));
    if !a.watch {
        let s = fetch_status(&a.target)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print!("{}", progress::render(&s));
        }
        return Ok(());
    }
    progress::watch(|| fetch_status(&a.target), interval, a.json)
}

fn finish(a: FinishArgs) -> anyhow::Result<()> {
    let dir = state_dir(&a.target.config)?;
    if let Some(limit) = &a.wait {
        let limit = kaiso_nfs::parse_duration(limit).map_err(|e| anyhow::anyhow!("--wait: {e}"))?;
        wait_crawled(&a.target, limit)?;
    }
    let report = match connect(&dir) {
        Some(mut c) => call(
            &mut c,
            &Call::Finish {
                share: a.target.share.clone(),
                accept_skipped: a.accept_skipped,
            },
        )?,
        None => daemon::finish_offline(
            &a.target.config,
            a.target.share.as_deref(),
            a.accept_skipped,
        )?,
    };
    let reports: Vec<protocol::FinishSummary> =
        serde_json::from_value(report.get("finished").cloned().unwrap_or_default())
            .context("finish reply")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&reports)?);
        return Ok(());
    }
    for r in &reports {
        println!(
            "kaiso: share {} finished: verified {} files ({} bytes) against {}; {} modified and {} deleted by clients; {} changed on the source; {} skipped",
            r.share,
            r.verified_files,
            r.verified_bytes,
            r.source,
            r.modified_by_clients,
            r.deleted_by_clients,
            r.changed_on_source.len(),
            r.skipped.len()
        );
        for f in &r.refetched {
            println!("  fetched again (its copy differed from the source): {f}");
        }
        for c in &r.changed_on_source {
            println!("  fetched again (changed on the source after its copy): {c}");
        }
        for s in &r.skipped {
            println!("  skipped {} [{}] {}", s.path, s.kind, s.reason);
        }
        for s in &r.notices {
            println!("  notice {} {}", s.path, s.reason);
        }
        println!("  report: {}", r.report);
    }
    Ok(())
}

/// Polls status until every selected share's crawl is done (remaining 0), bounded.
fn wait_crawled(a: &ShareArgs, limit: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let s = fetch_status(a)?;
        if s.shares.iter().all(|sh| sh.remaining_stubs == 0) {
            return Ok(());
        }
        // A paused crawl never completes by itself: say so now rather than at the limit.
        if let Some(paused) = s
            .shares
            .iter()
            .find(|sh| sh.state == "paused" && sh.remaining_stubs > 0)
        {
            bail!(
                "share {}: the crawl is paused with {} stubs left; run `kaiso migrate resume --share {}` first",
                paused.name,
                paused.remaining_stubs,
                paused.name
            );
        }
        if let Some(stuck) = s.shares.iter().find(|sh| sh.state == "stuck") {
            bail!(
                "share {}: the crawl is stuck with {} stubs left (source unreachable?); see kaiso migrate status",
                stuck.name,
                stuck.remaining_stubs
            );
        }
        if start.elapsed() >= limit {
            // A share waiting for its source says so (its state names the error).
            let waiting: Vec<String> = s
                .shares
                .iter()
                .filter(|sh| sh.state.starts_with("source unreachable"))
                .map(|sh| format!("; share {}: {}", sh.name, sh.state))
                .collect();
            bail!(
                "the crawl did not complete within {limit:?} ({} stubs left){}",
                s.shares.iter().map(|sh| sh.remaining_stubs).sum::<u64>(),
                waiting.concat()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An smb:// source reads its password from `$KAISO_SMB_PASSWORD` of the process that
/// connects: refuse clearly when it is not set (an empty value is a deliberate empty
/// password) rather than fail later with the server's logon error.
pub(crate) fn smb_password_set(url: &str) -> Result<(), String> {
    let is_smb = matches!(
        kaiso_source::SourceUrl::parse(url),
        Ok(kaiso_source::SourceUrl::Smb { .. })
    );
    if is_smb && std::env::var_os("KAISO_SMB_PASSWORD").is_none() {
        return Err(format!(
            "source {url}: set the SMB password in $KAISO_SMB_PASSWORD (it is never taken from the command line)"
        ));
    }
    Ok(())
}

/// The spec a start command describes (validated).
pub(crate) fn spec_of(a: &StartArgs) -> anyhow::Result<ShareSpec> {
    kaiso_source::SourceUrl::parse(&a.source).map_err(|e| anyhow::anyhow!("{}", e.message))?;
    smb_password_set(&a.source).map_err(|e| anyhow::anyhow!("{e}"))?;
    let into = a.into.trim_matches('/').to_string();
    if Path::new(&into)
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        bail!("--into {:?}: give a relative path without . or ..", a.into);
    }
    let name = match &a.share {
        Some(n) => n.clone(),
        None => Path::new(&into)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "main".into()),
    };
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\0']) {
        bail!("--share {name:?}: a share name is a plain file name");
    }
    kaiso_policy::crawl::CrawlOrder::parse(&a.order, &a.mode)
        .map_err(|e| anyhow::anyhow!("--order/--mode: {e}"))?;
    if a.parallel == 0 {
        bail!("--parallel must be at least 1");
    }
    let chunk = kaiso_store::config::parse_size_str(&a.chunk)
        .map_err(|e| anyhow::anyhow!("--chunk: {e}"))?;
    if chunk < 4096 {
        bail!("--chunk {}: at least 4KiB", a.chunk);
    }
    if !(1..=1_000_000).contains(&a.meta_give_up_attempts) {
        bail!(
            "--meta-give-up-attempts {}: give 1 to 1000000 failures",
            a.meta_give_up_attempts
        );
    }
    let give_up_after = kaiso_nfs::parse_duration(&a.meta_give_up_after)
        .map_err(|e| anyhow::anyhow!("--meta-give-up-after: {e}"))?;
    Ok(ShareSpec {
        name,
        url: a.source.clone(),
        into,
        order: a.order.clone(),
        mode: a.mode.clone(),
        parallel: a.parallel,
        chunk,
        rate: a.rate.as_deref().map(parse_rate).transpose()?.flatten(),
        // Set by `pause` only (`--paused` holds for this start): see `daemon::start`.
        paused: false,
        meta_give_up_attempts: a.meta_give_up_attempts,
        meta_give_up_after_ms: give_up_after.as_millis().min(u64::MAX as u128) as u64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        assert_eq!(parse_rate("off").unwrap(), None);
        assert_eq!(parse_rate("0").unwrap(), None);
        assert_eq!(parse_rate("50MiB").unwrap(), Some(50 << 20));
        assert_eq!(parse_rate("1GiB/s").unwrap(), Some(1 << 30));
        assert!(parse_rate("fast").is_err());
    }
}
