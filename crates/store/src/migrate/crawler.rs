//! The background crawler: walks the *destination* namespace by inode and triggers the
//! same fetch path as client accesses, in the order [`CrawlOrder`] asks for, with
//! `crawl_workers` threads sharing one [`CrawlPartition`].
//!
//! - Listing a directory goes through `Store::opendir`, which expands a dummy directory
//!   exactly as a client `ls` would. Leaves are fetched through the migration engine:
//!   metadata (dummy → partial) and then data unit by unit.
//! - Demand fetches take priority: a crawler unit waits while a demand fetch is in flight.
//! - Pause and stop are checked between units, so the crawler stops within one unit
//!   (10 MiB) even inside a huge file; a partial file resumes from its missing ranges.
//! - Each round restarts from the root (nothing already copied is copied again). A round
//!   ends only when every directory and file handed out in it has been visited (not
//!   merely when nothing is left to hand out), and exactly one worker closes it. Rounds
//!   repeat until the remaining-stub counter is 0; a round that makes no progress (counter
//!   not lower, nothing listed, completed or fetched meanwhile) is retried a few times
//!   after growing pauses (a source hiccup is not a stuck crawl); if none of those rounds
//!   progresses either, the crawl ends `stuck` (e.g. the source is unreachable) instead of
//!   spinning, and [`Crawler::failures`] says what failed in the last round.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kaiso_policy::crawl::{ChildKind, CrawlPartition, CrawlStats, CrawlWork, Pass};

use super::engine::{Migration, mark_crawler_thread};
use super::state::StubKind;
use crate::Store;
use crate::types::{FileKind, Ino};

/// Where the crawl is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrawlState {
    Running,
    Paused,
    /// Everything is migrated (counter 0).
    Done,
    /// Stopped on request; resumes without losing anything.
    Stopped,
    /// A whole round made no progress; the counter says how much is left.
    Stuck,
}

impl CrawlState {
    pub fn as_str(&self) -> &'static str {
        match self {
            CrawlState::Running => "running",
            CrawlState::Paused => "paused",
            CrawlState::Done => "done",
            CrawlState::Stopped => "stopped",
            CrawlState::Stuck => "stuck",
        }
    }
}

/// Failures reported per round, at most (the rest are counted in the log only).
pub const MAX_FAILURES: usize = 100;

/// Pauses before each new round after rounds without progress; once they are used up
/// the crawl ends `Stuck` (about 7.5 s of a source that answers nothing useful).
const STUCK_RETRIES: [Duration; 4] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
];

/// Something the crawler could not do in the current (or, once stuck, the last) round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrawlFailure {
    /// The store inode (0 for the state database itself).
    pub ino: Ino,
    pub errno: i32,
    pub what: &'static str,
}

/// What the migration had done when a round closed: a later round that changes none of
/// it made no progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RoundMark {
    remaining: u64,
    dirs_listed: u64,
    files_completed: u64,
    bytes_fetched: u64,
}

impl RoundMark {
    fn of(m: &Migration, remaining: u64) -> Self {
        let c = &m.counters;
        Self {
            remaining,
            dirs_listed: c.dirs_listed.load(Ordering::Acquire),
            files_completed: c.files_completed.load(Ordering::Acquire),
            bytes_fetched: c.bytes_fetched.load(Ordering::Acquire),
        }
    }

    /// Progress since `before`: fewer stubs, or anything listed, completed or fetched
    /// (listing a directory that failed before may add stubs, yet is progress).
    fn progressed_since(&self, before: &RoundMark) -> bool {
        self.remaining < before.remaining
            || self.dirs_listed > before.dirs_listed
            || self.files_completed > before.files_completed
            || self.bytes_fetched > before.bytes_fetched
    }
}

struct Shared {
    part: Mutex<CrawlPartition<Ino>>,
    wake: Condvar,
    state: Mutex<CrawlState>,
    rounds: Mutex<u32>,
    /// The mark of the last closed round (`None` before the first), and how many rounds
    /// in a row made no progress.
    last_round: Mutex<(Option<RoundMark>, u32)>,
    failures: Mutex<Vec<CrawlFailure>>,
}

impl Shared {
    fn ended(&self) -> bool {
        matches!(
            *self.state.lock().unwrap_or_else(|e| e.into_inner()),
            CrawlState::Done | CrawlState::Stuck
        )
    }

    /// Starts a new round from the root; the failures of the last one are dropped.
    fn new_round(&self) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.part
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .restart();
    }

    fn fail(&self, ino: Ino, errno: i32, what: &'static str) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if f.len() < MAX_FAILURES {
            f.push(CrawlFailure { ino, errno, what });
        }
    }
}

/// A running crawl; dropping it stops the workers (within one unit) and joins them.
pub struct Crawler {
    migration: Arc<Migration>,
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    committer: Option<Committer>,
}

/// The thread that makes the workers' listings durable in the background (see
/// `Migration::commit_listings`), so a deep tree's chain of listings does not wait for
/// an fsync per level.
struct Committer {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Committer {
    fn start(store: Arc<Store>, m: Arc<Migration>, sh: Arc<Shared>) -> Option<Self> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let halt = stop.clone();
        let m2 = m.clone();
        let thread = std::thread::Builder::new()
            .name("kaiso-commit".into())
            .spawn(move || {
                while !halt.load(Ordering::Acquire) {
                    m2.wait_for_deferred_listing(Duration::from_millis(50));
                    if let Err(e) = m2.commit_listings(&store) {
                        tracing::warn!(errno = e.errno(), "crawler: committing listings failed");
                        sh.fail(0, e.errno(), "commit listings");
                    }
                }
                // Whatever was deferred before the workers stopped.
                if let Err(e) = m2.commit_listings(&store) {
                    tracing::warn!(errno = e.errno(), "crawler: committing listings failed");
                }
            })
            .ok()?;
        // Deferred only once a committer runs (without one, listings commit inline).
        m.defer_listing_commits.store(true, Ordering::Release);
        Some(Self { stop, thread })
    }

    /// Called after the workers are joined: later listings commit inline again, and
    /// the committer commits what is left before it ends.
    fn stop(self, m: &Migration) {
        m.defer_listing_commits.store(false, Ordering::Release);
        self.stop.store(true, Ordering::Release);
        m.wake_committer();
        let _ = self.thread.join();
    }
}

impl Crawler {
    pub fn start(store: Arc<Store>, migration: Arc<Migration>) -> Self {
        migration.stop.store(false, Ordering::Release);
        let mut part = CrawlPartition::new(migration.cfg.order, migration.root_ino());
        // Overlapped phasing: half the workers at most fetch data during the metadata
        // pass, so listings that appear meanwhile find a free worker.
        part.set_early_data_limit(migration.cfg.crawl_workers / 2);
        let shared = Arc::new(Shared {
            part: Mutex::new(part),
            wake: Condvar::new(),
            state: Mutex::new(CrawlState::Running),
            rounds: Mutex::new(0),
            last_round: Mutex::new((None, 0)),
            failures: Mutex::new(Vec::new()),
        });
        // Client renames reach the partition, so an object moved from a part of the tree
        // not crawled yet into one already crawled is still visited in this pass.
        let weak = Arc::downgrade(&shared);
        *migration
            .rename_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(move |ino: Ino, is_dir: bool| {
            let Some(sh) = weak.upgrade() else { return };
            let kind = if is_dir {
                ChildKind::Directory
            } else {
                ChildKind::Leaf
            };
            let queued = sh
                .part
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_rename(&ino, kind);
            if queued {
                sh.wake.notify_all();
            }
        }));
        let committer = Committer::start(store.clone(), migration.clone(), shared.clone());
        let workers = (0..migration.cfg.crawl_workers)
            .map(|i| {
                let (store, m, sh) = (store.clone(), migration.clone(), shared.clone());
                std::thread::Builder::new()
                    .name(format!("kaiso-crawl-{i}"))
                    .spawn(move || {
                        mark_crawler_thread();
                        worker(&store, &m, &sh);
                    })
                    .expect("spawn crawler thread")
            })
            .collect();
        Self {
            migration,
            shared,
            workers,
            committer,
        }
    }

    pub fn state(&self) -> CrawlState {
        let s = *self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if s == CrawlState::Running && self.migration.paused.load(Ordering::Acquire) {
            CrawlState::Paused
        } else {
            s
        }
    }

    pub fn pause(&self) {
        self.migration.paused.store(true, Ordering::Release);
    }

    pub fn resume(&self) {
        self.migration.paused.store(false, Ordering::Release);
        self.shared.wake.notify_all();
    }

    /// Which pass is under way (for status).
    pub fn pass(&self) -> Option<Pass> {
        self.shared
            .part
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pass()
    }

    /// Rounds closed so far.
    pub fn rounds(&self) -> u32 {
        *self.shared.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What failed in the current round, or in the last one once the crawl is stuck (at
    /// most [`MAX_FAILURES`]).
    pub fn failures(&self) -> Vec<CrawlFailure> {
        self.shared
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Work queued and in flight (for status).
    pub fn stats(&self) -> CrawlStats {
        self.shared
            .part
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats()
    }

    /// Waits until the crawl ends (done, stuck or stopped) or `limit` passes.
    pub fn wait(&self, limit: Duration) -> CrawlState {
        let start = Instant::now();
        loop {
            let s = self.state();
            if matches!(
                s,
                CrawlState::Done | CrawlState::Stuck | CrawlState::Stopped
            ) || start.elapsed() >= limit
            {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the workers within one unit and joins them.
    pub fn stop(mut self) -> CrawlState {
        self.halt();
        self.state()
    }

    fn halt(&mut self) {
        *self
            .migration
            .rename_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        self.migration.stop.store(true, Ordering::Release);
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(c) = self.committer.take() {
            c.stop(&self.migration);
        }
        let mut s = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if *s == CrawlState::Running {
            *s = CrawlState::Stopped;
        }
    }
}

impl Drop for Crawler {
    fn drop(&mut self) {
        self.halt();
    }
}

fn should_stop(m: &Migration) -> bool {
    m.stop.load(Ordering::Acquire)
}

/// Blocks while paused; returns false if asked to stop.
fn wait_while_paused(m: &Migration) -> bool {
    while m.paused.load(Ordering::Acquire) {
        if should_stop(m) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !should_stop(m)
}

fn worker(store: &Store, m: &Migration, sh: &Shared) {
    loop {
        if !wait_while_paused(m) {
            return;
        }
        let work = {
            let mut part = sh.part.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if should_stop(m) || sh.ended() {
                    return;
                }
                if let Some(w) = part.take() {
                    break w;
                }
                if part.pass().is_some() && part.pass_done() {
                    if part.next_pass() {
                        sh.wake.notify_all();
                        continue;
                    }
                    // This worker completed the round (`pass()` is now `None`, so no
                    // other worker closes it too); the reconcile runs unlocked, so client
                    // renames are not held up by it.
                    drop(part);
                    close_round(store, m, sh);
                    sh.wake.notify_all();
                    part = sh.part.lock().unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                // Others are still listing, fetching or closing the round: wait for them.
                part = sh
                    .wake
                    .wait_timeout(part, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let go_on = match work {
            CrawlWork::List(dir) => {
                visit_dir(store, sh, dir);
                true
            }
            CrawlWork::Fetch(leaf, pass) => {
                let go_on = fetch_leaf(store, m, sh, leaf, pass);
                sh.part
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_fetched(&leaf);
                go_on
            }
        };
        sh.wake.notify_all();
        if !go_on {
            return;
        }
    }
}

/// Ends a round whose work is all done: done (counter 0), stuck (no progress since the
/// last round), or a new round from the root.
fn close_round(store: &Store, m: &Migration, sh: &Shared) {
    // Listings still waiting for their commit hold rows: commit them before counting.
    let reconciled = m.commit_listings(store).and_then(|()| m.reconcile(store));
    *sh.rounds.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    let remaining = match reconciled {
        Ok(n) => n,
        Err(e) => {
            // The state database failed: nothing can be trusted to progress.
            tracing::error!(
                errno = e.errno(),
                "crawler: reconciling the stub counter failed"
            );
            sh.fail(0, e.errno(), "reconcile the stub counter");
            *sh.state.lock().unwrap_or_else(|e| e.into_inner()) = CrawlState::Stuck;
            return;
        }
    };
    let mark = RoundMark::of(m, remaining);
    let idle_rounds = {
        let mut last = sh.last_round.lock().unwrap_or_else(|e| e.into_inner());
        let progressed = last.0.is_none_or(|before| mark.progressed_since(&before));
        last.0 = Some(mark);
        last.1 = if progressed { 0 } else { last.1 + 1 };
        last.1
    };
    if remaining != 0 && (1..=STUCK_RETRIES.len() as u32).contains(&idle_rounds) {
        // A hiccup of the source (a reconnect refused, a server restarting) is not a
        // stuck crawl: try again after a pause (this round's failures stay readable
        // during it; the next round reports its own).
        let pause = STUCK_RETRIES[idle_rounds as usize - 1];
        tracing::info!(
            remaining,
            ?pause,
            "crawler: a round made no progress; retrying"
        );
        let until = Instant::now() + pause;
        while Instant::now() < until && !should_stop(m) {
            std::thread::sleep(Duration::from_millis(20));
        }
        sh.new_round();
        return;
    }
    let mut state = sh.state.lock().unwrap_or_else(|e| e.into_inner());
    if remaining == 0 {
        *state = CrawlState::Done;
    } else if idle_rounds > 0 {
        tracing::warn!(
            remaining,
            failures = sh.failures.lock().unwrap_or_else(|e| e.into_inner()).len(),
            "crawler: a whole round made no progress; stuck"
        );
        *state = CrawlState::Stuck;
    } else {
        drop(state);
        sh.new_round();
    }
}

/// Lists `dir` (expanding it if it is a dummy) and reports its children.
fn visit_dir(store: &Store, sh: &Shared, dir: Ino) {
    match list(store, dir) {
        Ok(children) => {
            sh.part
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_listed(&dir, &children);
        }
        Err(e) => {
            if e != crate::FsError::NOENT && e != crate::FsError::NOTDIR {
                // Transient (source unreachable): the counter still holds it, so the next
                // round tries again, and a round with no progress ends the crawl stuck.
                tracing::warn!(dir, errno = e.errno(), "crawler could not list a directory");
                sh.fail(dir, e.errno(), "list directory");
            }
            sh.part
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_gone(&dir);
        }
    }
}

/// Lists a directory through the store (expanding it if it is a dummy).
fn list(store: &Store, dir: Ino) -> crate::FsResult<Vec<(Ino, ChildKind)>> {
    let fh = store.opendir(dir)?;
    let mut out = Vec::new();
    let mut offset = 0;
    let result = loop {
        match store.readdir(fh, offset) {
            Ok(entries) if entries.is_empty() => break Ok(()),
            Ok(entries) => {
                for e in &entries {
                    offset = e.offset;
                    if e.name == OsStr::new(".") || e.name == OsStr::new("..") {
                        continue;
                    }
                    out.push((
                        e.ino,
                        if e.kind == FileKind::Dir {
                            ChildKind::Directory
                        } else {
                            ChildKind::Leaf
                        },
                    ));
                }
            }
            Err(e) => break Err(e),
        }
    };
    let _ = store.releasedir(fh);
    result.map(|_| out)
}

/// Fetches one leaf for `pass`; returns false when the crawler must stop.
///
/// The file is held open for the whole visit, so a client deleting it meanwhile cannot
/// let the store hand its inode number to a new object that this visit would then
/// treat with the old row (copying the old file's metadata or completing the new
/// file's row without data). The row is read only once the file is open.
fn fetch_leaf(store: &Store, m: &Migration, sh: &Shared, ino: Ino, pass: Pass) -> bool {
    // Only regular files have stub rows; never open anything else (opening a FIFO
    // would block).
    let is_stub_file = matches!(m.db.get(ino), Ok(Some(_)))
        && store
            .getattr(ino, None)
            .is_ok_and(|a| a.kind == FileKind::File);
    if !is_stub_file {
        return !should_stop(m);
    }
    let Ok(opened) = store.open_file(ino, libc::O_RDONLY | libc::O_NONBLOCK, false) else {
        return !should_stop(m); // gone, or not a regular file
    };
    let go_on = visit_leaf(store, m, sh, ino, pass, opened.fh);
    let _ = store.release(opened.fh);
    go_on
}

fn visit_leaf(store: &Store, m: &Migration, sh: &Shared, ino: Ino, pass: Pass, fh: u64) -> bool {
    let Ok(Some(row)) = m.db.get(ino) else {
        return !should_stop(m);
    };
    if pass == Pass::Metadata || row.kind == StubKind::DummyFile {
        if let Err(e) = m.ensure_partial(store, &row) {
            tracing::warn!(ino, errno = e.errno(), "metadata fetch failed");
            sh.fail(ino, e.errno(), "copy metadata");
        }
        if pass == Pass::Metadata {
            return !should_stop(m);
        }
    }
    // Data, unit by unit, checking pause/stop between units.
    loop {
        if !wait_while_paused(m) {
            return false;
        }
        let Ok(Some(row)) = m.db.get(ino) else {
            return true;
        };
        let missing = store.stub_state(ino).missing;
        let Some(&(start, _)) = missing.first() else {
            // All data is here: completion (it checks the source did not change).
            if let Err(e) = m.fetch_range(store, &row, 0, 0) {
                tracing::warn!(ino, errno = e.errno(), "crawler completion failed");
                sh.fail(ino, e.errno(), "complete");
            }
            return true;
        };
        // Admission (demand priority, throttle) before the fill path, never inside it:
        // the store holds the file's fill lock for the whole fill, and a client reading
        // another part of this file must not wait behind the crawler's sleep. Charged
        // with the unit's missing bytes (what the fill will read from the source).
        let unit = m.cfg.unit_size;
        let unit_start = start / unit * unit;
        let unit_missing: u64 =
            crate::stub::missing_within(&missing, unit_start, unit_start.saturating_add(unit))
                .iter()
                .map(|(s, e)| e - s)
                .sum();
        if !m.crawl_admission(unit_missing) {
            // Paused or stopped while throttled: the loop waits, then retries the unit.
            continue;
        }
        // Through the store's fill path so the per-file fill lock orders us with clients.
        // Reading the first missing byte makes the filler fetch its whole unit; reading
        // the unit back would only copy what was just written.
        match store.read(fh, start, 1) {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(ino, errno = e.errno(), "crawler fetch failed");
                sh.fail(ino, e.errno(), "fetch data");
                return !should_stop(m);
            }
        }
    }
}
