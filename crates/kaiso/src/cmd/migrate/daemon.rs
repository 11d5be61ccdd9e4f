//! The migration daemon (`kaiso migrate start`): one per store, serving the store through
//! its faces while the shares' crawlers run, answering the other `kaiso migrate`
//! commands through the store's control socket.
//!
//! A resumed share whose source cannot be reached at start (the old server down after a
//! power failure, `$KAISO_SMB_PASSWORD` missing from a restarted daemon) does not keep
//! the store dark: it is served with a source that fails every call at once while the
//! connect is retried in the background; its crawl starts once the source connects.
//! A fresh share whose source cannot be reached is refused.

use super::progress::{apply_progress, crawl_failure_entries, skipped_entries, status_skeleton};
use super::protocol::{Call, FinishSummary, ShareSpec, ShareStatus, SkippedEntry, StatusReply};
use super::rate::{RateWindow, Reading};
use super::{StartArgs, call, connect, spec_of};
use crate::cmd::mount::{catch_signals, load_config};
use anyhow::{Context, bail};
use kaiso_nfs::NfsServer;
use kaiso_policy::crawl::CrawlOrder;
use kaiso_source::reconnect::{ReconnectWatch, ReconnectingSource};
use kaiso_store::Store;
use kaiso_store::migrate::{
    CrawlState, Crawler, Migration, MigrationConfig, Migrations, Source, SourceError, SourcePath,
    SourceResult,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// One share being migrated by the daemon.
struct Share {
    spec: ShareSpec,
    m: Arc<Migration>,
    /// None: not crawling (started --paused).
    crawler: Option<Crawler>,
    paused: bool,
    started: Instant,
    /// Counter readings since the crawl last started or resumed, for rates (empty while
    /// paused: a paused share has no rate). See `super::rate`.
    rate: RateWindow,
    /// Set while the share's source has not connected since the daemon started.
    source_down: Option<ReconnectWatch>,
    /// Whether the source answers the calls made through it (an outage mid-crawl).
    health: Arc<SourceHealth>,
    /// The background retry of a crawl stuck on an unreachable source.
    retry: AutoResume,
}

/// The first probe of a source a stuck crawl could not reach comes this long after the
/// crawl ended; each failed probe doubles the wait up to [`PROBE_MAX`] (as the
/// reconnect of a source down at start).
const PROBE_FIRST: Duration = Duration::from_millis(500);
const PROBE_MAX: Duration = Duration::from_secs(10);
/// A crawl resumed because its source answered again that ends stuck again without any
/// progress (the source answers, yet some object keeps failing as unreachable) is
/// resumed by itself at most this often: each resume walks the tree again.
const NO_PROGRESS_HOLD: Duration = Duration::from_secs(600);

/// See [`Share::retry`].
#[derive(Default)]
struct AutoResume {
    /// When to probe the source next (None: at once).
    next: Option<Instant>,
    wait: Duration,
    /// The last resume by the daemon: when, and what the crawl had done then.
    last: Option<(Instant, (u64, u64, u64))>,
}

/// A share's migration, its reconnect watch (source down at start) and its source health.
type OpenedShare = (Arc<Migration>, Option<ReconnectWatch>, Arc<SourceHealth>);

/// Whether a share's source answers, from the calls made through it: since when the
/// calls fail as unreachable and the last such error; cleared by a call that succeeds.
#[derive(Default)]
struct SourceHealth {
    failing: std::sync::atomic::AtomicBool,
    down: Mutex<Option<(std::time::SystemTime, String)>>,
}

impl SourceHealth {
    fn down(&self) -> Option<(std::time::SystemTime, String)> {
        if !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        self.down.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn note<T>(
        &self,
        r: kaiso_store::migrate::SourceResult<T>,
    ) -> kaiso_store::migrate::SourceResult<T> {
        match &r {
            Ok(_) => {
                if self.failing.load(Ordering::Relaxed) {
                    *self.down.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    self.failing.store(false, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind == kaiso_store::migrate::SourceErrorKind::Unreachable => {
                let mut d = self.down.lock().unwrap_or_else(|e| e.into_inner());
                let since = d.as_ref().map_or_else(std::time::SystemTime::now, |x| x.0);
                *d = Some((since, e.to_string()));
                self.failing.store(true, Ordering::Relaxed);
            }
            Err(_) => {}
        }
        r
    }
}

/// A share's source, telling [`SourceHealth`] whether it answers.
struct Watched {
    inner: Box<dyn Source>,
    health: Arc<SourceHealth>,
}

impl Source for Watched {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn identity(&self) -> Option<String> {
        self.inner.identity()
    }

    fn features(&self) -> kaiso_store::migrate::SourceFeatures {
        self.inner.features()
    }

    fn stat(&self, p: &SourcePath) -> SourceResult<kaiso_store::migrate::SourceAttr> {
        self.health.note(self.inner.stat(p))
    }

    fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<kaiso_store::migrate::SourceEntry>> {
        self.health.note(self.inner.read_dir(p))
    }

    fn read_dir_with_attr(
        &self,
        p: &SourcePath,
    ) -> SourceResult<(
        Vec<kaiso_store::migrate::SourceEntry>,
        Option<kaiso_store::migrate::SourceAttr>,
    )> {
        self.health.note(self.inner.read_dir_with_attr(p))
    }

    fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.health.note(self.inner.read(p, offset, len))
    }

    fn read_with_attr(
        &self,
        p: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<kaiso_store::migrate::SourceAttr>)> {
        self.health.note(self.inner.read_with_attr(p, offset, len))
    }

    fn read_into(
        &self,
        p: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<kaiso_store::migrate::SourceAttr>)> {
        self.health.note(self.inner.read_into(p, offset, buf))
    }

    fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
        self.health.note(self.inner.read_link(p))
    }

    fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.health.note(self.inner.xattrs(p))
    }

    fn acl(&self, p: &SourcePath) -> SourceResult<kaiso_store::migrate::SourceAcl> {
        self.health.note(self.inner.acl(p))
    }

    fn streams(&self, p: &SourcePath) -> SourceResult<Vec<kaiso_store::migrate::SourceStream>> {
        self.health.note(self.inner.streams(p))
    }

    fn read_stream(
        &self,
        p: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.health
            .note(self.inner.read_stream(p, stream, offset, len))
    }
}

/// A reading of the counters the rates are made of, now.
fn reading(m: &Migration) -> Reading {
    let k = &m.counters;
    Reading {
        at: Instant::now(),
        bytes: k.bytes_fetched.load(Ordering::Relaxed),
        files: k.files_completed.load(Ordering::Relaxed),
    }
}

/// What a crawl has done (directories listed, files completed, bytes fetched).
fn progress_mark(m: &Migration) -> (u64, u64, u64) {
    let k = &m.counters;
    (
        k.dirs_listed.load(Ordering::Relaxed),
        k.files_completed.load(Ordering::Relaxed),
        k.bytes_fetched.load(Ordering::Relaxed),
    )
}

/// A share whose `finish` succeeded: its source is detached, only the summary is kept
/// (for status).
struct Finished {
    spec: ShareSpec,
    started: Instant,
    summary: FinishSummary,
}

struct Daemon {
    me: Weak<Daemon>,
    store: Arc<Store>,
    migrations: Arc<Migrations>,
    /// Lock order: `shares` before `finished`.
    shares: Mutex<Vec<Share>>,
    finished: Mutex<Vec<Finished>>,
    /// Set by `stop_all`: no crawl starts any more.
    stopping: std::sync::atomic::AtomicBool,
}

fn spec_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("migrate").join(name).join("share.json")
}

/// Every share recorded under `<state_dir>/migrate/*/share.json` (unfinished ones).
pub fn saved_specs(state_dir: &Path) -> anyhow::Result<Vec<ShareSpec>> {
    let dir = state_dir.join("migrate");
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| dir.display().to_string()),
    };
    for e in rd.flatten() {
        let p = e.path().join("share.json");
        let Ok(text) = std::fs::read_to_string(&p) else {
            continue;
        };
        if finished_leftover(&e.path()) {
            // A finish of an older kaiso, interrupted while deleting the share's state:
            // its report exists and its database is gone, so the share is finished.
            tracing::warn!(dir = %e.path().display(), "removing a finished share's leftover state");
            let _ = std::fs::remove_dir_all(e.path());
            continue;
        }
        let spec: ShareSpec =
            serde_json::from_str(&text).with_context(|| format!("{}", p.display()))?;
        out.push(spec);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Finished shares of the store (`<state_dir>/migrate/NAME.finished.txt` without a live
/// share NAME), or only `only`: (name, report path), by name.
pub fn finished_reports(state_dir: &Path, only: Option<&str>) -> Vec<(String, PathBuf)> {
    let dir = state_dir.join("migrate");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e
                .file_name()
                .to_string_lossy()
                .strip_suffix(".finished.txt")?
                .to_string();
            let live = dir.join(&name).join("share.json").exists();
            (!live && only.is_none_or(|n| n == name)).then(|| (name, e.path()))
        })
        .collect();
    out.sort();
    out
}

/// Why a new share may not be called `name`: a finished share of that name left its
/// report (`<state_dir>/migrate/NAME.finished.txt`), which the new share's `finish`
/// would overwrite. The name is free again once the report is moved away.
fn finished_name_taken(state_dir: &Path, name: &str) -> Option<String> {
    let (_, report) = finished_reports(state_dir, Some(name)).into_iter().next()?;
    Some(format!(
        "share {name} is finished (its report: {}); give the new share another --share name, or move that report away first",
        report.display()
    ))
}

/// Whether the share directory `dir` is what an interrupted finish left: its finish
/// report written, its migration database already deleted.
fn finished_leftover(dir: &Path) -> bool {
    !dir.join("migrate.db").exists() && kaiso_store::migrate::report_path(dir).exists()
}

fn save_spec(state_dir: &Path, spec: &ShareSpec) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let p = spec_path(state_dir, &spec.name);
    let tmp = p.with_extension("json.tmp");
    // 0600 whatever the umask: the next root `start` resumes what it says.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(&serde_json::to_vec_pretty(spec)?)?;
    drop(f);
    std::fs::rename(&tmp, &p)
}

/// The saved spec of share `name`, if it has one that reads.
fn read_spec(state_dir: &Path, name: &str) -> Option<ShareSpec> {
    let text = std::fs::read_to_string(spec_path(state_dir, name)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Why `start` of a saved share with another `--into` is refused (one line).
fn into_mismatch(saved: &ShareSpec, spec: &ShareSpec) -> String {
    let keep = if saved.into.is_empty() {
        "without --into".to_string()
    } else {
        format!("with --into {}", saved.into)
    };
    format!(
        "share {} migrates into /{} (its stubs are there), not /{}: start it {keep}, or give the new target another --share name",
        saved.name, saved.into, spec.into
    )
}

/// Creates `dir` (and missing parents) 0700 whatever the process umask.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Makes the migration state of the store private, as this kaiso creates it: the
/// directories `<state_dir>/migrate`, `migrate.finishing` and each share's 0700, each
/// `share.json` 0600 (an older kaiso left them 0777/0666 under umask 0: any local user
/// could rewrite what the next root `start` migrates, or the stub database).
fn make_state_private(state_dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let chmod = |p: &Path, mode: u32| {
        let Ok(md) = std::fs::symlink_metadata(p) else {
            return;
        };
        if !md.file_type().is_symlink()
            && md.permissions().mode() & 0o7777 != mode
            && let Err(e) = std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        {
            tracing::warn!("chmod {mode:o} {}: {e}", p.display());
        }
    };
    for top in ["migrate", "migrate.finishing"] {
        let dir = state_dir.join(top);
        chmod(&dir, 0o700);
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                chmod(&p, 0o700);
                chmod(&p.join("share.json"), 0o600);
            } else if p.to_string_lossy().ends_with(".finished.txt") {
                chmod(&p, 0o644);
            }
        }
    }
}

fn overlaps(a: &str, b: &str) -> bool {
    let (a, b) = (Path::new(a), Path::new(b));
    a.starts_with(b) || b.starts_with(a)
}

/// What a resumed share's database recorded of its source: its description and
/// identity. `None` for a fresh share.
fn recorded_source(state_dir: &Path, name: &str) -> Option<(String, Option<String>)> {
    let path = state_dir.join("migrate").join(name).join("migrate.db");
    if !path.exists() {
        return None;
    }
    let db = kaiso_store::migrate::state::MigrationDb::open_read_only(&path).ok()?;
    let described = db.meta("source").ok()??;
    Some((described, db.meta("source_identity").ok().flatten()))
}

/// Connects to a share's source. The daemon connects, so its own environment must hold
/// an SMB password (a share added by a later `start` or resumed after a restart). The
/// error's message is the whole one-line explanation, naming the source.
fn connect_source(url: &str) -> Result<Box<dyn Source>, SourceError> {
    let no_password = |e: String| {
        SourceError::new(
            kaiso_store::migrate::SourceErrorKind::PermissionDenied,
            &kaiso_store::migrate::SourcePath::root(),
            format!("{e}; the migration daemon's environment lacks it"),
        )
    };
    super::smb_password_set(url).map_err(no_password)?;
    kaiso_source::open_source(url)
        .map_err(|e| SourceError::new(e.kind, &e.path, format!("source {url}: {e}")))
}

/// Opens the source and the migration state of one share (fresh or resumed). With the
/// store's `Arc` the recount after an unclean stop runs in the background, so the share
/// serves at once. With `on_connect`, a resumed share whose source cannot be reached is
/// opened anyway over a [`ReconnectingSource`] (returned watch: `Some`); `on_connect`
/// runs once it connects. Without it (or for a fresh share) an unreachable source is an
/// error.
fn open_share(
    store: &Arc<Store>,
    spec: &ShareSpec,
    on_connect: Option<Box<dyn FnOnce() + Send>>,
) -> Result<OpenedShare, String> {
    let order = CrawlOrder::parse(&spec.order, &spec.mode)?;
    let (source, watch) = match connect_source(&spec.url) {
        Ok(s) => (s, None),
        Err(e) => {
            let why = e.message;
            let resumed = recorded_source(&store.config().state_dir, &spec.name);
            match (on_connect, resumed) {
                (Some(on_connect), Some((described, identity))) => {
                    tracing::warn!(share = %spec.name, "{why}; serving the share without its source and reconnecting in the background");
                    let url = spec.url.clone();
                    let check_described = described.clone();
                    let (s, w) = ReconnectingSource::start(
                        described,
                        why,
                        Box::new(move || connect_source(&url)),
                        Box::new(move |s| same_source(s, &check_described, identity.as_deref())),
                        on_connect,
                    );
                    (Box::new(s) as Box<dyn Source>, Some(w))
                }
                _ => return Err(why),
            }
        }
    };
    let mut cfg = MigrationConfig::new(spec.name.clone());
    cfg.target = PathBuf::from(&spec.into);
    cfg.unit_size = spec.chunk;
    cfg.order = order;
    cfg.crawl_workers = spec.parallel;
    cfg.throttle_bytes_per_sec = spec.rate;
    cfg.meta_give_up_attempts = spec.meta_give_up_attempts;
    cfg.meta_give_up_after = Duration::from_millis(spec.meta_give_up_after_ms);
    let health = Arc::new(SourceHealth::default());
    let source = Box::new(Watched {
        inner: source,
        health: health.clone(),
    });
    Migration::open(store, source, cfg).map(|m| (m, watch, health))
}

/// Whether source `s`, connected late, is the one a share recorded: the same
/// description, or (re-pointed) the same known identity.
fn same_source(s: &dyn Source, described: &str, identity: Option<&str>) -> Result<(), String> {
    let now = s.describe();
    if now == described {
        return Ok(());
    }
    match (identity, s.identity()) {
        (Some(was), Some(is)) if was == is => Ok(()),
        (was, is) => Err(format!(
            "the share was started from {described} (identity {}), the source now answers as {now} (identity {})",
            was.unwrap_or("unknown"),
            is.as_deref().unwrap_or("unknown")
        )),
    }
}

/// `YYYY-MM-DD HH:MM:SS UTC` of `t`.
fn utc_text(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Civil date from days since the epoch (proleptic Gregorian calendar).
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
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The status state of a share whose source has not connected yet.
fn unreachable_state(w: &ReconnectWatch) -> Option<String> {
    w.down()
        .map(|(since, why)| format!("source unreachable since {}: {why}", utc_text(since)))
}

impl Daemon {
    fn state_dir(&self) -> PathBuf {
        self.store.config().state_dir.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Share>> {
        self.shares.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_finished(&self) -> std::sync::MutexGuard<'_, Vec<Finished>> {
        self.finished.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a share: binds its source, opens (or resumes) its state, starts its crawl.
    fn add(&self, spec: ShareSpec, paused: bool) -> Result<(), String> {
        let check = |shares: &[Share]| -> Result<(), String> {
            for s in shares {
                if s.spec.name == spec.name {
                    return Err(format!("share {} is already being migrated", spec.name));
                }
                if overlaps(&s.spec.into, &spec.into) {
                    return Err(format!(
                        "--into /{} overlaps share {} (/{}): give each share its own directory",
                        spec.into, s.spec.name, s.spec.into
                    ));
                }
            }
            Ok(())
        };
        check(&self.lock())?;
        // Registered again if a finish unregistered it (the last share had finished).
        self.store.set_stub_filler(self.migrations.clone());
        let (me, name) = (self.me.clone(), spec.name.clone());
        let on_connect: Box<dyn FnOnce() + Send> = Box::new(move || {
            if let Some(d) = me.upgrade() {
                d.source_connected(&name);
            }
        });
        // A share's settings are written before its database can exist, so a kill at
        // any point never leaves a database that `status` cannot name and `start` cannot
        // resume (a `migrate.db` without `share.json`); such a leftover of an older
        // kaiso gets its settings back here and is resumed.
        let spec_file = spec_path(&self.state_dir(), &spec.name);
        if let Some(saved) = read_spec(&self.state_dir(), &spec.name)
            && saved.into != spec.into
        {
            // The share's stubs are under its recorded target: another --into would
            // crawl an empty directory and leave them stranded (finish refused).
            return Err(into_mismatch(&saved, &spec));
        }
        let new_spec = !spec_file.exists();
        if new_spec {
            // A finished share's report stays where it is: its name is not reused.
            if let Some(why) = finished_name_taken(&self.state_dir(), &spec.name) {
                return Err(why);
            }
            if let Some(d) = spec_file.parent() {
                private_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
            }
            save_spec(&self.state_dir(), &spec)
                .map_err(|e| format!("save share {}: {e}", spec.name))?;
        }
        let (m, source_down, health) = match open_share(&self.store, &spec, Some(on_connect)) {
            Ok(x) => x,
            Err(e) => {
                if new_spec {
                    let _ = std::fs::remove_file(&spec_file);
                    if let Some(d) = spec_file.parent() {
                        // Only if empty: a database of an older run stays.
                        let _ = std::fs::remove_dir(d);
                    }
                }
                return Err(e);
            }
        };
        let mut shares = self.lock();
        check(&shares)?;
        save_spec(&self.state_dir(), &spec)
            .map_err(|e| format!("save share {}: {e}", spec.name))?;
        self.migrations.add(m.clone());
        // Without its source the crawl starts when the source connects.
        let reachable = source_down.as_ref().is_none_or(|w| w.down().is_none());
        let crawler = (!paused && reachable).then(|| Crawler::start(self.store.clone(), m.clone()));
        // Only once its report is gone (moved away by the administrator, see
        // `finished_name_taken`): the name is free again.
        self.lock_finished().retain(|f| f.spec.name != spec.name);
        let mut rate = RateWindow::default();
        if !paused {
            rate.restart(reading(&m));
        }
        shares.push(Share {
            spec,
            m,
            crawler,
            paused,
            started: Instant::now(),
            rate,
            source_down,
            health,
            retry: AutoResume::default(),
        });
        Ok(())
    }

    /// The source of share `name` connected late: its crawl starts (unless paused).
    fn source_connected(&self, name: &str) {
        if self.store.stopping() {
            return;
        }
        let mut shares = self.lock();
        let Some(s) = shares.iter_mut().find(|s| s.spec.name == name) else {
            return;
        };
        eprintln!("kaiso: share {name}: source {} reachable again", s.spec.url);
        let ended = s
            .crawler
            .as_ref()
            .is_none_or(|c| matches!(c.state(), CrawlState::Stuck | CrawlState::Stopped));
        if !s.paused && ended {
            drop(s.crawler.take());
            s.crawler = Some(Crawler::start(self.store.clone(), s.m.clone()));
        }
    }

    fn handle(&self, args: serde_json::Value) -> Result<serde_json::Value, String> {
        let call: Call =
            serde_json::from_value(args).map_err(|e| format!("bad migrate request: {e}"))?;
        match call {
            Call::Status { share } => {
                let named = |n: &str| share.as_deref().is_none_or(|want| want == n);
                let shares = self.lock();
                let mut list: Vec<ShareStatus> = shares
                    .iter()
                    .filter(|s| named(&s.spec.name))
                    .map(|s| self.status_of(s))
                    .collect();
                list.extend(
                    self.lock_finished()
                        .iter()
                        .filter(|f| named(&f.spec.name))
                        .map(finished_status),
                );
                if let Some(n) = &share
                    && list.is_empty()
                {
                    return Err(format!("no share {n:?} is being migrated here"));
                }
                let reply = StatusReply {
                    daemon: true,
                    shares: list,
                };
                serde_json::to_value(reply).map_err(|e| e.to_string())
            }
            Call::Pause { share } => {
                let dir = self.state_dir();
                self.each(share.as_deref(), |s| {
                    s.paused = true;
                    if let Some(c) = &s.crawler {
                        c.pause();
                    }
                    // No rate while paused; none of its readings count after `resume`.
                    s.rate.stop();
                    // Kept across a daemon restart.
                    s.spec.paused = true;
                    if let Err(e) = save_spec(&dir, &s.spec) {
                        tracing::warn!(share = %s.spec.name, "save the pause: {e}");
                    }
                })
            }
            Call::Resume { share } => {
                let store = self.store.clone();
                let dir = self.state_dir();
                self.each(share.as_deref(), move |s| {
                    if s.paused || !s.rate.running() {
                        s.rate.restart(reading(&s.m));
                    }
                    s.paused = false;
                    s.spec.paused = false;
                    if let Err(e) = save_spec(&dir, &s.spec) {
                        tracing::warn!(share = %s.spec.name, "save the resume: {e}");
                    }
                    if s.source_down.as_ref().is_some_and(|w| w.down().is_some()) {
                        // Its crawl starts when the source connects.
                        return;
                    }
                    let ended = s.crawler.as_ref().is_none_or(|c| {
                        matches!(c.state(), CrawlState::Stuck | CrawlState::Stopped)
                    });
                    if ended {
                        // Stop the old one (joins its workers) before a new round starts.
                        drop(s.crawler.take());
                        s.crawler = Some(Crawler::start(store.clone(), s.m.clone()));
                    }
                    if let Some(c) = &s.crawler {
                        c.resume();
                    }
                })
            }
            Call::Throttle {
                share,
                bytes_per_sec,
            } => {
                let dir = self.state_dir();
                self.each(share.as_deref(), move |s| {
                    s.m.set_throttle(bytes_per_sec);
                    s.spec.rate = bytes_per_sec;
                    let _ = save_spec(&dir, &s.spec);
                })
            }
            Call::Finish {
                share,
                accept_skipped,
            } => self.finish(share.as_deref(), accept_skipped),
            Call::Add { spec, paused } => {
                self.add(spec.clone(), paused)?;
                Ok(serde_json::json!({ "shares": [spec.name] }))
            }
        }
    }

    /// Applies `f` to the selected unfinished shares; replies with their names.
    fn each(
        &self,
        share: Option<&str>,
        mut f: impl FnMut(&mut Share),
    ) -> Result<serde_json::Value, String> {
        let mut shares = self.lock();
        let list = self.select(&shares, share)?;
        let mut names = Vec::new();
        for i in list {
            f(&mut shares[i]);
            names.push(shares[i].spec.name.clone());
        }
        Ok(serde_json::json!({ "shares": names }))
    }

    /// [`select`], with an error that says so when the share (or, without a name, every
    /// share) was finished already: a second `finish`, `pause`, … must not succeed
    /// silently with nothing done (audit s11).
    fn select(&self, shares: &[Share], name: Option<&str>) -> Result<Vec<usize>, String> {
        let list = match (select(shares, name), name) {
            (Err(e), Some(n)) => {
                // Lock order: `shares` (held by the caller) before `finished`.
                let finished = self.lock_finished();
                return Err(match finished.iter().find(|f| f.spec.name == n) {
                    Some(f) => format!(
                        "share {n} is already finished (report: {})",
                        f.summary.report
                    ),
                    None => e,
                });
            }
            (r, _) => r?,
        };
        if list.is_empty() {
            let finished = self.lock_finished();
            let names: Vec<&str> = finished.iter().map(|f| f.spec.name.as_str()).collect();
            return Err(if names.is_empty() {
                "no share is being migrated here".to_string()
            } else {
                format!(
                    "nothing left to migrate here: every share is finished ({})",
                    names.join(", ")
                )
            });
        }
        Ok(list)
    }

    fn finish(
        &self,
        share: Option<&str>,
        accept_skipped: bool,
    ) -> Result<serde_json::Value, String> {
        let picked: Vec<(String, Arc<Migration>, Option<Crawler>, bool)> = {
            let mut shares = self.lock();
            let list = self.select(&shares, share)?;
            if let Some((name, state)) = list.iter().find_map(|&i| {
                let s = &shares[i];
                let state = s.source_down.as_ref().and_then(unreachable_state)?;
                Some((s.spec.name.clone(), state))
            }) {
                return Err(format!(
                    "share {name}: {state}; finish it once its source is back"
                ));
            }
            list.into_iter()
                .map(|i| {
                    let s = &mut shares[i];
                    (s.spec.name.clone(), s.m.clone(), s.crawler.take(), s.paused)
                })
                .collect()
        };
        let mut done = Vec::new();
        let mut first_err = None;
        for (name, m, crawler, paused) in picked {
            let was_crawling = crawler.is_some();
            if let Some(c) = crawler {
                c.stop();
            }
            match finish_one(&self.store, &name, &m, accept_skipped) {
                Ok(summary) => {
                    // Detach: the filler forgets it and, with the last handle dropped
                    // below, its source (connections) and its database close.
                    self.migrations.remove(&self.store, &name);
                    let mut shares = self.lock();
                    if let Some(i) = shares.iter().position(|s| s.spec.name == name) {
                        let s = shares.remove(i);
                        self.lock_finished().push(Finished {
                            spec: s.spec,
                            started: s.started,
                            summary: summary.clone(),
                        });
                    }
                    drop(shares);
                    drop(m);
                    done.push(summary);
                }
                Err(e) => {
                    // Not finished: keep crawling as before.
                    if was_crawling
                        && let Some(s) = self.lock().iter_mut().find(|s| s.spec.name == name)
                    {
                        let c = Crawler::start(self.store.clone(), m.clone());
                        if paused {
                            c.pause();
                        }
                        s.crawler = Some(c);
                    }
                    first_err.get_or_insert(format!("share {name}: {e}"));
                }
            }
        }
        match first_err {
            Some(e) if done.is_empty() => Err(e),
            Some(e) => Err(format!(
                "{e} (finished meanwhile: {})",
                done.iter()
                    .map(|d| d.share.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            None => Ok(serde_json::json!({ "finished": done })),
        }
    }

    fn status_of(&self, s: &Share) -> ShareStatus {
        let mut st = status_skeleton(&s.spec);
        st.elapsed_secs = s.started.elapsed().as_secs_f64();
        st.state = match &s.crawler {
            None if s.paused => "paused".into(),
            None => "stopped".into(),
            Some(c) => c.state().as_str().into(),
        };
        if let Some(c) = &s.crawler {
            st.pass = c.pass().map(|p| format!("{p:?}").to_lowercase());
            st.rounds = c.rounds();
            st.crawl_failures = crawl_failure_entries(c.failures());
            if c.state() == CrawlState::Stuck
                && let Some((since, why)) = s.health.down()
            {
                st.source_problem = Some(format!(
                    "unreachable since {}: {why}; {}",
                    utc_text(since),
                    if s.paused {
                        "the share is paused: `kaiso migrate resume` restarts its crawl once the source answers"
                    } else {
                        "retried every 10 s at most, the crawl resumes by itself once the source answers (`kaiso migrate resume` retries at once)"
                    }
                ));
            }
        }
        st.metadata_retries = super::progress::metadata_retry_entries(s.m.metadata_retries());
        let unreachable = s.source_down.as_ref().and_then(unreachable_state);
        let k = &s.m.counters;
        // One reading for the bytes shown and the rate, so the two agree.
        let now = reading(&s.m);
        st.bytes_fetched = now.bytes;
        st.demand_fetches = k.demand_fetches.load(Ordering::Relaxed);
        st.crawl_fetches = k.crawl_fetches.load(Ordering::Relaxed);
        st.dirs_listed = k.dirs_listed.load(Ordering::Relaxed);
        match s.m.progress(&self.store) {
            Ok(p) => {
                apply_progress(&mut st, p);
                // The saved counter is stale until the background recount is done.
                if s.m.recounting() {
                    st.state = "recounting".into();
                }
                if let Some(u) = &unreachable {
                    st.state = u.clone();
                }
            }
            Err(e) => {
                st.remaining_stubs = s.m.remaining();
                st.skipped = vec![SkippedEntry {
                    path: String::new(),
                    kind: "status".into(),
                    reason: format!("cannot read the state database: {e}"),
                }];
            }
        }
        st.paused = s.paused;
        if let Some((bytes, files)) = s.rate.rate(now) {
            st.bytes_per_sec = bytes;
            st.files_per_sec = files;
        }
        // A paused share has no rate, so no ETA either (it does not end by itself).
        st.eta_secs = if s.paused { None } else { eta(&st) };
        st
    }

    /// Probes the source of each crawl that ended stuck on an unreachable source (not
    /// paused), with back-off; once it answers, the crawl starts again (as a share whose
    /// source was down at start). The probes run without the lock held.
    fn watch_sources(&self) {
        let now = Instant::now();
        let due: Vec<(String, Arc<Migration>)> = self
            .lock()
            .iter_mut()
            .filter_map(|s| {
                let stuck = s
                    .crawler
                    .as_ref()
                    .is_some_and(|c| c.state() == CrawlState::Stuck);
                let reconnecting = s.source_down.as_ref().is_some_and(|w| w.down().is_some());
                // Stuck on entries whose metadata the source does not give while it
                // answers (their retries' root `stat` leaves the health "answering"):
                // resumed too, at most every NO_PROGRESS_HOLD, so their bound is reached.
                let retrying = !s.m.metadata_retries().is_empty();
                if !stuck || s.paused || reconnecting || (s.health.down().is_none() && !retrying) {
                    s.retry.next = None;
                    s.retry.wait = Duration::ZERO;
                    return None;
                }
                if s.retry.next.is_none() {
                    s.retry.wait = PROBE_FIRST;
                    s.retry.next = Some(now + PROBE_FIRST);
                }
                (s.retry.next.is_some_and(|t| now >= t)).then(|| (s.spec.name.clone(), s.m.clone()))
            })
            .collect();
        for (name, m) in due {
            if self.store.stopping() {
                return;
            }
            let answered = m.source().stat(&SourcePath::root()).is_ok();
            let mut shares = self.lock();
            if self.stopping.load(Ordering::SeqCst) {
                return;
            }
            let Some(s) = shares.iter_mut().find(|s| s.spec.name == name) else {
                continue;
            };
            let stuck = s
                .crawler
                .as_ref()
                .is_some_and(|c| c.state() == CrawlState::Stuck);
            if !stuck || s.paused {
                continue;
            }
            if !answered {
                s.retry.wait = (s.retry.wait * 2).clamp(PROBE_FIRST, PROBE_MAX);
                s.retry.next = Some(Instant::now() + s.retry.wait);
                continue;
            }
            let mark = progress_mark(&s.m);
            if let Some((at, was)) = s.retry.last
                && was == mark
                && at.elapsed() < NO_PROGRESS_HOLD
            {
                // Resumed already and stuck again without progress: not over and over.
                s.retry.next = Some(at + NO_PROGRESS_HOLD);
                continue;
            }
            eprintln!(
                "kaiso: share {name}: source {} answers again; its crawl resumes",
                s.spec.url
            );
            drop(s.crawler.take());
            s.crawler = Some(Crawler::start(self.store.clone(), s.m.clone()));
            s.retry.last = Some((Instant::now(), mark));
            s.retry.next = None;
            s.retry.wait = Duration::ZERO;
        }
    }

    fn sample(&self) {
        for s in self.lock().iter_mut() {
            // Ignored while paused (the window is stopped).
            s.rate.sample(reading(&s.m));
        }
    }

    /// Stops every crawl (within one unit) and marks each migration cleanly stopped.
    fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let crawlers: Vec<(Crawler, Arc<Migration>)> = self
            .lock()
            .iter_mut()
            .filter_map(|s| s.crawler.take().map(|c| (c, s.m.clone())))
            .collect();
        for (c, _) in crawlers {
            c.stop();
        }
        for s in self.lock().iter() {
            s.m.close();
        }
    }
}

/// Seconds left at the current rates: the slower of bytes and files (None: no rate yet).
fn eta(s: &ShareStatus) -> Option<f64> {
    if s.remaining_stubs == 0 {
        return Some(0.0);
    }
    let by_bytes = (s.bytes_per_sec > 0.0)
        .then(|| s.bytes_known.saturating_sub(s.bytes_done) as f64 / s.bytes_per_sec);
    let by_files = (s.files_per_sec > 0.0)
        .then(|| s.files_known.saturating_sub(s.files_done) as f64 / s.files_per_sec);
    match (by_bytes, by_files) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// Status of a finished share: what `finish` verified.
fn finished_status(f: &Finished) -> ShareStatus {
    let mut st = status_skeleton(&f.spec);
    st.elapsed_secs = f.started.elapsed().as_secs_f64();
    st.state = "finished".into();
    st.files_done = f.summary.verified_files;
    st.files_known = f.summary.verified_files;
    st.bytes_done = f.summary.verified_bytes;
    st.bytes_known = f.summary.verified_bytes;
    st.skipped = f.summary.skipped.clone();
    st
}

/// Indices of the (unfinished) shares a command names (`None`: all).
fn select(shares: &[Share], name: Option<&str>) -> Result<Vec<usize>, String> {
    let list: Vec<usize> = shares
        .iter()
        .enumerate()
        .filter(|(_, s)| name.is_none_or(|n| s.spec.name == n))
        .map(|(i, _)| i)
        .collect();
    match name {
        Some(n) if list.is_empty() => Err(format!("no share {n:?} is being migrated here")),
        _ => Ok(list),
    }
}

/// Verifies and detaches one share (the engine removes its whole state directory).
fn finish_one(
    store: &Store,
    name: &str,
    m: &Migration,
    accept_skipped: bool,
) -> Result<FinishSummary, String> {
    let report_path = kaiso_store::migrate::report_path(m.state_dir());
    let r = kaiso_store::migrate::finish_with(
        store,
        m,
        kaiso_store::migrate::FinishOptions { accept_skipped },
    )?;
    // From the finish report, not the crawl's: it adds what changed on the source after
    // listing, which only finish's last look finds.
    let skipped = skipped_entries(r.skipped.clone());
    Ok(FinishSummary {
        share: name.to_string(),
        source: m.source().describe(),
        verified_files: r.verified_files,
        verified_bytes: r.verified_bytes,
        modified_by_clients: r.modified_by_clients,
        deleted_by_clients: r.deleted_by_clients,
        refetched: r.refetched.clone(),
        changed_on_source: r.changed_on_source.clone(),
        skipped,
        notices: skipped_entries(r.notices.clone()),
        report: report_path.display().to_string(),
    })
}

/// `finish` without a running daemon: opens the store and the shares' sources itself.
pub fn finish_offline(
    config: &Path,
    share: Option<&str>,
    accept_skipped: bool,
) -> anyhow::Result<serde_json::Value> {
    let cfg = load_config(config)?;
    let specs: Vec<ShareSpec> = saved_specs(&cfg.state_dir)?
        .into_iter()
        .filter(|s| share.is_none_or(|n| n == s.name))
        .collect();
    if specs.is_empty() {
        // A finish cut off (kill -9) after it detached the share's state: the share is
        // finished; what the cut-off finish did not delete goes now.
        kaiso_store::migrate::clean_interrupted_finishes(&cfg.state_dir);
        let finished = finished_reports(&cfg.state_dir, share);
        if let Some((name, report)) = finished.first() {
            bail!(
                "share {name} is already finished (report: {})",
                report.display()
            );
        }
        match share {
            Some(n) => bail!("no share {n:?} is being migrated into {}", config.display()),
            None => bail!("nothing is being migrated into {}", config.display()),
        }
    }
    unsafe { libc::umask(0) };
    make_state_private(&cfg.state_dir);
    let store = Store::open(cfg)?;
    let migrations = Migrations::new();
    store.set_stub_filler(migrations.clone());
    let mut done = Vec::new();
    let mut result = Ok(());
    for spec in &specs {
        let m = match open_share(&store, spec, None) {
            Ok((m, _, _)) => m,
            Err(e) => {
                result = Err(anyhow::anyhow!("share {}: {e}", spec.name));
                break;
            }
        };
        migrations.add(m.clone());
        match finish_one(&store, &spec.name, &m, accept_skipped) {
            Ok(s) => done.push(s),
            Err(e) => {
                m.close();
                result = Err(anyhow::anyhow!("share {}: {e}", spec.name));
                break;
            }
        }
    }
    store.shutdown();
    result?;
    Ok(serde_json::json!({ "finished": done }))
}

/// `kaiso migrate start`.
pub fn start(a: StartArgs) -> anyhow::Result<()> {
    let t0 = Instant::now();
    if a.mount.is_some() {
        // Before anything is opened, as `kaiso mount` does: a bad --threads is one line.
        crate::cmd::mount::check_threads(a.threads)?;
    }
    let mut spec = spec_of(&a)?;
    let cfg = load_config(&a.config)?;
    // A saved share keeps what was set at run time unless this command line says
    // otherwise: a `throttle` (an explicit --rate wins) and a `pause` (--paused or not,
    // it stays paused until `resume`). Another --into is refused (`Daemon::add`).
    let mut paused = a.paused;
    let mut kept_pause = false;
    let saved = read_spec(&cfg.state_dir, &spec.name);
    if saved.is_none()
        && let Some(why) = finished_name_taken(&cfg.state_dir, &spec.name)
    {
        // Before anything is opened or served (`Daemon::add` says the same to a share
        // added to a running daemon).
        bail!("{why}");
    }
    if let Some(saved) = saved {
        if saved.into != spec.into {
            bail!("{}", into_mismatch(&saved, &spec));
        }
        if a.rate.is_none() {
            spec.rate = saved.rate;
        }
        // Only a `pause` is kept (`start --paused` is for this start).
        spec.paused = saved.paused;
        kept_pause = saved.paused && !paused;
        paused |= saved.paused;
    }
    if let Some(mut c) = connect(&cfg.state_dir) {
        // A daemon serves this store already: add the share to it (N-to-1).
        if a.mount.is_some() || a.nfs.is_some() {
            bail!(
                "store busy: a kaiso process already serves {}; to add a share to its migration, run start without --mount/--nfs",
                a.config.display()
            );
        }
        call(
            &mut c,
            &Call::Add {
                spec: spec.clone(),
                paused,
            },
        )?;
        println!(
            "kaiso: share {} ({}) added to the running migration into {} at /{}",
            spec.name,
            spec.url,
            a.config.display(),
            spec.into
        );
        return Ok(());
    }
    // Check every option before touching anything.
    let nfs = match &a.nfs {
        Some(addr) => {
            let listen: SocketAddr = addr.parse().map_err(|_| {
                anyhow::anyhow!("bad --nfs {addr:?}: expected ADDR:PORT, e.g. 0.0.0.0:2049")
            })?;
            Some(a.access.options(listen)?)
        }
        None => None,
    };
    if let Some(mp) = &a.mount {
        kaiso_fuse::preflight(mp)?;
        crate::cmd::mount::check_mountpoint_apart(&cfg, mp)?;
    }
    let state_dir = cfg.state_dir.clone();
    // kaiso sets every mode explicitly; the process umask must not interfere.
    unsafe { libc::umask(0) };
    make_state_private(&state_dir);
    let store = Store::open(cfg)?;
    tracing::info!(ms = t0.elapsed().as_millis() as u64, "store opened");
    let migrations = Migrations::new();
    store.set_stub_filler(migrations.clone());
    let daemon = Arc::new_cyclic(|me| Daemon {
        me: me.clone(),
        store: store.clone(),
        migrations,
        shares: Mutex::new(Vec::new()),
        finished: Mutex::new(Vec::new()),
        stopping: std::sync::atomic::AtomicBool::new(false),
    });
    let stop_store = |store: &Arc<Store>, d: &Daemon| {
        d.stop_all();
        store.shutdown();
    };
    // Every other unfinished share of this store is resumed too: its stubs need a source.
    for saved in saved_specs(&state_dir)? {
        if saved.name != spec.name
            && let Err(e) = daemon.add(saved.clone(), saved.paused)
        {
            stop_store(&store, &daemon);
            bail!("cannot resume share {}: {e}", saved.name);
        }
        if saved.name != spec.name && saved.paused {
            println!(
                "kaiso: share {} stays paused (paused before this start: `kaiso migrate resume --share {}` starts it)",
                saved.name, saved.name
            );
        }
    }
    if let Err(e) = daemon.add(spec.clone(), paused) {
        stop_store(&store, &daemon);
        bail!("{e}");
    }
    tracing::info!(ms = t0.elapsed().as_millis() as u64, "sources bound");
    let background = store.start_background();
    let sock = match kaiso_store::control::serve(store.clone()) {
        Ok(s) => s,
        Err(e) => {
            stop_store(&store, &daemon);
            return Err(e).context("cannot start the control socket");
        }
    };
    let handler_daemon = Arc::downgrade(&daemon);
    kaiso_store::control::set_migrate_handler(
        &state_dir,
        Some(Arc::new(move |args| match handler_daemon.upgrade() {
            Some(d) => d.handle(args),
            None => Err("the migration daemon is stopping".into()),
        })),
    );
    let signalled = catch_signals();
    let cleanup = |d: &Daemon| {
        kaiso_store::control::set_migrate_handler(&state_dir, None);
        d.stop_all();
        store.shutdown();
        let _ = std::fs::remove_file(&sock);
    };
    let mounted = match &a.mount {
        Some(mp) => {
            if !store.config().allow_other {
                eprintln!("{}", ALLOW_OTHER_WARNING);
            }
            let opts = kaiso_fuse::MountOptions {
                allow_other: store.config().allow_other,
                threads: a.threads,
                // Complete files (fetched, or never stubs) are handed to the kernel like
                // in `kaiso mount`; the store serves stubs itself (`io_mode` refuses
                // passthrough while any range is missing), so their reads still fetch.
                passthrough: !a.no_passthrough,
                ttl: Duration::from_secs(1),
                ..kaiso_fuse::MountOptions::default()
            };
            match kaiso_fuse::mount(store.clone(), mp, &opts) {
                Ok(m) => Some(m),
                Err(e) => {
                    drop(background);
                    cleanup(&daemon);
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    tracing::info!(ms = t0.elapsed().as_millis() as u64, "FUSE mounted");
    let server = match nfs {
        Some(opts) => match NfsServer::start(store.clone(), opts) {
            Ok(s) => Some(s),
            Err(e) => {
                if let Some(m) = mounted {
                    let _ = m.unmount();
                }
                drop(background);
                cleanup(&daemon);
                return Err(e);
            }
        },
        None => None,
    };
    let mut faces = Vec::new();
    if let Some(mp) = &a.mount {
        faces.push(format!("FUSE {}", mp.display()));
    }
    if let Some(s) = &server {
        let b = s.local_addr();
        faces.push(format!(
            "NFSv3 {b} export /{}",
            a.access.export.trim_matches('/')
        ));
    }
    if faces.is_empty() {
        faces.push("no face (crawl only)".into());
    }
    println!(
        "kaiso: serving after {} ms: share {} from {} at /{} via {}; crawl {}",
        t0.elapsed().as_millis(),
        spec.name,
        spec.url,
        spec.into,
        faces.join(" and "),
        if kept_pause {
            "paused (paused before this start: `kaiso migrate resume` starts it)".to_string()
        } else if paused {
            "paused".to_string()
        } else {
            format!(
                "{} {} with {} workers",
                spec.order, spec.mode, spec.parallel
            )
        }
    );
    if let Some(s) = &server {
        println!("kaiso: nfs listening on {}", s.local_addr());
    }
    spawn_sampler(Arc::downgrade(&daemon), store.clone());
    spawn_source_watch(Arc::downgrade(&daemon), store.clone());
    loop {
        if signalled.load(Ordering::SeqCst) || mounted.as_ref().is_some_and(|m| m.finished()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Faces first (no new client requests), then crawls, then the store.
    if let Some(s) = server {
        s.stop();
    }
    let unmounted = match (mounted.map(|m| m.unmount()), &a.mount) {
        (Some(Err(e)), Some(mp)) if e.raw_os_error() == Some(libc::EBUSY) => {
            Some(crate::cmd::mount::detach_busy_mount(mp, e))
        }
        (r, _) => r,
    };
    drop(background);
    cleanup(&daemon);
    if let Some(r) = unmounted {
        r.context("unmount")?;
    }
    eprintln!("kaiso: migration daemon stopped");
    Ok(())
}

/// Samba (and NFS servers, other users) on the mount open files as the client's user:
/// FUSE refuses every uid but the mounting one without `allow_other`.
const ALLOW_OTHER_WARNING: &str = "kaiso: warning: allow_other is off in the store's configuration: only the user running kaiso can use the mount, so Samba exporting it serves no other SMB user (set allow_other = true under [store])";

/// Runs [`Daemon::watch_sources`] while the store serves.
fn spawn_source_watch(d: Weak<Daemon>, store: Arc<Store>) {
    let _ = std::thread::Builder::new()
        .name("kaiso-migrate-source-watch".into())
        .spawn(move || {
            while !store.stopping() {
                match d.upgrade() {
                    Some(d) => d.watch_sources(),
                    None => return,
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        });
}

fn spawn_sampler(d: Weak<Daemon>, store: Arc<Store>) {
    let _ = std::thread::Builder::new()
        .name("kaiso-migrate-rates".into())
        .spawn(move || {
            while !store.stopping() {
                match d.upgrade() {
                    Some(d) => d.sample(),
                    None => return,
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_overlap_by_component() {
        assert!(overlaps("", "a"));
        assert!(overlaps("a", "a/b"));
        assert!(!overlaps("a", "ab"));
        assert!(!overlaps("x/a", "x/b"));
    }

    #[test]
    fn a_finished_share_left_by_an_interrupted_finish_is_not_resumed() {
        let d = tempfile::tempdir().unwrap();
        let mig = d.path().join("migrate");
        let spec = |name: &str| {
            let dir = mig.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let spec = ShareSpec {
                name: name.to_string(),
                url: "/src".to_string(),
                into: name.to_string(),
                order: "bfs".to_string(),
                mode: "metadata-first".to_string(),
                parallel: 1,
                chunk: 1 << 20,
                rate: None,
                paused: false,
                meta_give_up_attempts: 5,
                meta_give_up_after_ms: 900_000,
            };
            std::fs::write(dir.join("share.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
            dir
        };
        // Unfinished: its database is there.
        let live = spec("live");
        std::fs::write(live.join("migrate.db"), b"").unwrap();
        // Finished, but the state removal was cut off after the database went.
        let done = spec("done");
        std::fs::write(kaiso_store::migrate::report_path(&done), b"report").unwrap();
        // No database and no report: a start that crashed before its database; kept.
        spec("young");
        let names: Vec<String> = match saved_specs(d.path()) {
            Ok(v) => v.into_iter().map(|s| s.name).collect(),
            Err(e) => panic!("{e:#}"),
        };
        assert_eq!(names, ["live", "young"]);
        assert!(!done.exists(), "the leftover state is removed");
        assert!(
            kaiso_store::migrate::report_path(&done).exists(),
            "the report stays"
        );
    }

    #[test]
    fn a_finished_shares_name_is_not_given_to_a_new_share() {
        let d = tempfile::tempdir().unwrap();
        let mig = d.path().join("migrate");
        std::fs::create_dir_all(mig.join("live")).unwrap();
        assert_eq!(finished_name_taken(d.path(), "old"), None, "no report yet");
        let report = kaiso_store::migrate::report_path(&mig.join("old"));
        std::fs::write(&report, b"report").unwrap();
        let why = finished_name_taken(d.path(), "old").expect("the name is taken");
        assert!(
            why.contains(&report.display().to_string()) && !why.contains('\n'),
            "one line naming the kept report: {why}"
        );
        // A share whose finish was cut off after its report is still live (resumed, and
        // its next finish completes it).
        std::fs::write(mig.join("live").join("share.json"), b"{}").unwrap();
        std::fs::write(kaiso_store::migrate::report_path(&mig.join("live")), b"r").unwrap();
        assert_eq!(finished_name_taken(d.path(), "live"), None);
        assert_eq!(finished_name_taken(d.path(), "other"), None);
    }

    #[test]
    fn source_health_is_down_from_the_first_unreachable_error_until_a_success() {
        use kaiso_store::migrate::SourceErrorKind;
        let h = SourceHealth::default();
        let err = |kind, msg: &str| -> SourceResult<()> {
            Err(SourceError::new(kind, &SourcePath::root(), msg))
        };
        assert!(h.down().is_none());
        // A permanent error of one object is not an outage.
        let _ = h.note(err(SourceErrorKind::PermissionDenied, "denied"));
        assert!(
            h.down().is_none(),
            "a permission error marked the source down"
        );
        let _ = h.note(err(SourceErrorKind::Unreachable, "no answer"));
        let (since, why) = h
            .down()
            .expect("an unreachable error marks the source down");
        assert!(why.contains("no answer"), "{why}");
        std::thread::sleep(Duration::from_millis(20));
        let _ = h.note(err(SourceErrorKind::Unreachable, "still no answer"));
        let (since2, why2) = h.down().expect("still down");
        assert_eq!(since, since2, "the outage's start moved with a later error");
        assert!(why2.contains("still no answer"), "{why2}");
        let _ = h.note(Ok(()));
        assert!(
            h.down().is_none(),
            "a call that succeeded did not clear the outage"
        );
    }

    #[test]
    fn utc_text_is_a_civil_date() {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(utc_text(t), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc_text(std::time::UNIX_EPOCH), "1970-01-01 00:00:00 UTC");
    }

    #[test]
    fn eta_is_the_slower_of_bytes_and_files() {
        let mut s = ShareStatus {
            remaining_stubs: 5,
            bytes_known: 100,
            bytes_done: 50,
            bytes_per_sec: 10.0,
            files_known: 10,
            files_done: 0,
            files_per_sec: 1.0,
            ..ShareStatus::default()
        };
        assert_eq!(eta(&s), Some(10.0));
        s.files_per_sec = 0.0;
        assert_eq!(eta(&s), Some(5.0));
        s.bytes_per_sec = 0.0;
        assert_eq!(eta(&s), None);
        s.remaining_stubs = 0;
        assert_eq!(eta(&s), Some(0.0));
    }
}
