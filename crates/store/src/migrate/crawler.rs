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
    /// Files whose data a worker is fetching with more than one unit missing: idle
    /// workers fetch other units of them meanwhile (see `help_with`).
    offered: Mutex<Vec<Ino>>,
    /// Stubs the walk from the share's root cannot reach (see `strays`), found when the
    /// last round closed: queued at the start of every pass of the next round.
    strays: Mutex<Vec<(Ino, ChildKind)>>,
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
        let mut part = self.part.lock().unwrap_or_else(|e| e.into_inner());
        part.restart();
        self.queue_strays(&mut part);
    }

    /// Queues the stubs out of the walk's reach in the pass just started (each is
    /// visited once per pass, like an object a client moved during the pass).
    fn queue_strays(&self, part: &mut CrawlPartition<Ino>) {
        for (ino, kind) in self.strays.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            part.on_rename(ino, *kind);
        }
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
                // It also runs the periodic syncs of both databases (see
                // `periodic_syncs`): the store's fetches leave their checkpoints to it
                // while it is registered with their barrier (from the first fetch on).
                let mut registered: Option<Arc<crate::stub::FetchBarrier>> = None;
                while !halt.load(Ordering::Acquire) {
                    if registered.is_none() {
                        registered = store.current_fetch_barrier();
                        if let Some(b) = &registered {
                            b.background_checkpointers.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                    m2.wait_for_deferred_listing(Duration::from_millis(50));
                    if let Err(e) = m2.periodic_syncs(&store) {
                        tracing::warn!(errno = e.errno(), "crawler: periodic sync failed");
                        sh.fail(0, e.errno(), "sync state");
                    }
                    if let Err(e) = m2.commit_listings(&store) {
                        tracing::warn!(errno = e.errno(), "crawler: committing listings failed");
                        sh.fail(0, e.errno(), "commit listings");
                    }
                }
                // Fetches checkpoint by themselves again.
                if let Some(b) = registered {
                    b.background_checkpointers.fetch_sub(1, Ordering::AcqRel);
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
            offered: Mutex::new(Vec::new()),
            strays: Mutex::new(Vec::new()),
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
        // Completions the workers deferred during a sync (none are deferred from now on:
        // no committer runs).
        if let Err(e) = self.migration.commit_deferred_completions() {
            tracing::warn!(errno = e.errno(), "crawler: committing completions failed");
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

/// What a worker does next: work of the partition, or units of a file another worker
/// is fetching.
enum Job {
    Work(CrawlWork<Ino>),
    Help(Ino),
}

fn worker(store: &Store, m: &Migration, sh: &Shared) {
    // Whether this worker committed the deferred listings at the end of the metadata
    // pass (see below).
    let mut listings_committed = false;
    loop {
        if !wait_while_paused(m) {
            return;
        }
        let job = {
            let mut part = sh.part.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if should_stop(m) || sh.ended() {
                    return;
                }
                if let Some(w) = part.take() {
                    break Job::Work(w);
                }
                if part.pass().is_some() && part.pass_done() {
                    // The listings still deferred are committed before the data pass
                    // starts: then the fetch barrier's sync of that commit finds no
                    // fetched bytes to write back. Committed once the data pass had
                    // begun, it ran a `syncfs` chasing the fetches (seconds, measured:
                    // docs/reproduction/migration.md §3, session 10), and the fetches
                    // of files in those directories waited for it.
                    if part.pass() == Some(Pass::Metadata) && !listings_committed {
                        listings_committed = true;
                        drop(part);
                        if let Err(e) = m.commit_listings(store) {
                            tracing::warn!(
                                errno = e.errno(),
                                "crawler: committing listings failed"
                            );
                            sh.fail(0, e.errno(), "commit listings");
                        }
                        part = sh.part.lock().unwrap_or_else(|e| e.into_inner());
                        continue;
                    }
                    listings_committed = false;
                    if part.next_pass() {
                        sh.queue_strays(&mut part);
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
                // Others are still listing, fetching or closing the round: help with the
                // units of a large file one of them is fetching, or wait for them.
                if !sh
                    .offered
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_empty()
                {
                    drop(part);
                    if let Some(ino) = pick_file_to_help(store, m, sh) {
                        break Job::Help(ino);
                    }
                    part = sh.part.lock().unwrap_or_else(|e| e.into_inner());
                    if part.pass().is_none() || part.pass_done() {
                        continue;
                    }
                }
                part = sh
                    .wake
                    .wait_timeout(part, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let go_on = match job {
            Job::Help(ino) => help_with(store, m, sh, ino),
            Job::Work(CrawlWork::List(dir)) => {
                visit_dir(store, sh, dir);
                true
            }
            Job::Work(CrawlWork::Fetch(leaf, pass)) => {
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
    // Listings still waiting for their commit hold rows, and completions deferred during
    // a sync still hold theirs: commit both before counting.
    let reconciled = m
        .commit_listings(store)
        .and_then(|()| m.commit_deferred_completions())
        .and_then(|()| m.reconcile(store));
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
    let strays = if remaining == 0 {
        Vec::new()
    } else {
        strays(store, m)
    };
    if !strays.is_empty() {
        tracing::info!(
            strays = strays.len(),
            "crawler: stubs out of the share's tree (moved by clients) are visited by inode"
        );
    }
    *sh.strays.lock().unwrap_or_else(|e| e.into_inner()) = strays;
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

/// The share's stubs a walk from its root does not reach: objects a client moved out of
/// the share's tree (into another share's directory, or anywhere else in the store),
/// also while no crawler ran (started `--paused`, or before a restart), when no rename
/// hook could queue them. Their rows are keyed by inode, so they are visited by inode:
/// a directory is listed from its row's source path wherever it is now, a file fetched.
/// Called when a round closes with stubs left: every stub the walk reached was visited
/// then, so a stub whose place is unknown to the namespace is taken as out of reach too
/// (visiting it once more is harmless). Cost: one pass over the rows, as the reconcile.
fn strays(store: &Store, m: &Migration) -> Vec<(Ino, ChildKind)> {
    let rows = match m.db.all() {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!("crawler: reading the stub rows: {e}");
            return Vec::new();
        }
    };
    let root = m.root_ino();
    let mut out = Vec::new();
    // The namespace lock is taken per chunk, not for the whole scan.
    for chunk in rows.chunks(1024) {
        let ns = store.ns();
        for row in chunk {
            let parents: Vec<Ino> = if let Some(d) = ns.dirs.get(&row.ino) {
                vec![row.ino, d.parent]
            } else if let Some(f) = ns.files.get(&row.ino) {
                f.names.iter().map(|(p, _)| *p).collect()
            } else {
                Vec::new()
            };
            if parents.into_iter().any(|p| within(&ns, root, p)) {
                continue;
            }
            let kind = if row.kind == StubKind::DummyDir {
                ChildKind::Directory
            } else {
                ChildKind::Leaf
            };
            out.push((row.ino, kind));
        }
    }
    out
}

/// Whether directory `dir` is `root` or below it (by the namespace's parent links).
fn within(ns: &crate::namespace::Namespace, root: Ino, mut dir: Ino) -> bool {
    // Bounded: a parent link loop (never expected) cannot hang a worker.
    for _ in 0..4096 {
        if dir == root {
            return true;
        }
        match ns.dirs.get(&dir) {
            Some(d) if dir != crate::types::ROOT_INO => dir = d.parent,
            _ => return false,
        }
    }
    false
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
    let go_on = visit_leaf(store, m, sh, ino, pass);
    let _ = store.release(opened.fh);
    go_on
}

fn visit_leaf(store: &Store, m: &Migration, sh: &Shared, ino: Ino, pass: Pass) -> bool {
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
    // Data, unit by unit, checking pause/stop between units: the first missing unit no
    // other thread is fetching. A file with more units to go is offered to idle workers,
    // which fetch other units of it meanwhile (a large file is not left to one worker
    // while the others idle at the end of the pass); this worker completes it.
    let mut offered = false;
    let go_on = loop {
        if !wait_while_paused(m) {
            break false;
        }
        let Ok(Some(row)) = m.db.get(ino) else {
            break true;
        };
        let missing = store.stub_state(ino).missing;
        if missing.is_empty() {
            // All data is here: completion (it checks the source did not change).
            if let Err(e) = m.fetch_range(store, &row, 0, 0) {
                tracing::warn!(ino, errno = e.errno(), "crawler completion failed");
                sh.fail(ino, e.errno(), "complete");
            }
            break true;
        }
        let unit = m.cfg.unit_size;
        let free = free_units(m, ino, &missing, unit);
        let Some((unit_start, unit_missing)) = m.begin_admission(ino, &free) else {
            // Every missing unit is being fetched or admitted (by helpers or a client):
            // wait for one.
            m.wait_for_unit_release(Duration::from_millis(20));
            continue;
        };
        if !offered && free.len() > 1 && m.cfg.share_units {
            offered = true;
            sh.offered
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ino);
            sh.wake.notify_all();
        }
        // Admission (demand priority, throttle) before the unit is claimed, never while
        // holding it: a client reading this unit must not wait behind the crawler's
        // sleep. Charged with the unit's missing bytes (what will be read).
        let admitted = m.crawl_admission(unit_missing);
        let claim = admitted
            .then(|| m.try_claim_unit(ino, unit_start))
            .flatten();
        m.end_admission(ino, unit_start);
        let Some(claim) = claim else {
            // Paused or stopped while throttled (the loop waits, then retries the unit),
            // or taken meanwhile by a client: only bytes read count against `--rate`.
            m.throttle_refund(unit_missing);
            continue;
        };
        if let Err(e) = m.fetch_claimed_unit(store, &row, &claim) {
            tracing::warn!(ino, errno = e.errno(), "crawler fetch failed");
            sh.fail(ino, e.errno(), "fetch data");
            break !should_stop(m);
        }
    };
    if offered {
        withdraw_offer(m, sh, ino);
    }
    go_on
}

/// The unit-aligned units of `missing` no thread is fetching, in file order, each with
/// its missing bytes.
fn free_units(m: &Migration, ino: Ino, missing: &[(u64, u64)], unit: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(s, e) in missing {
        let mut at = s / unit * unit;
        while at < e {
            let bytes = e.min(at.saturating_add(unit)) - s.max(at);
            match out.last_mut() {
                Some(last) if last.0 == at => last.1 += bytes,
                _ if m.unit_busy(ino, at) => {}
                _ => out.push((at, bytes)),
            }
            at = at.saturating_add(unit);
        }
    }
    out
}

/// Ends the offer of `ino`'s units and waits (bounded) for helpers still fetching one,
/// so the file's visit, and with it the pass, ends only after their writes.
fn withdraw_offer(m: &Migration, sh: &Shared, ino: Ino) {
    sh.offered
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&i| i != ino);
    let until = Instant::now() + Duration::from_secs(600);
    while m.units_busy_in(ino) > 0 && Instant::now() < until {
        m.wait_for_unit_release(Duration::from_millis(20));
    }
}

/// The offered file with the most missing bytes that has a unit no one is fetching.
fn pick_file_to_help(store: &Store, m: &Migration, sh: &Shared) -> Option<Ino> {
    let offered = sh.offered.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let unit = m.cfg.unit_size;
    offered
        .into_iter()
        .filter_map(|ino| {
            let missing = store.stub_state(ino).missing;
            let free = free_units(m, ino, &missing, unit);
            (!free.is_empty()).then(|| (ino, missing.iter().map(|(s, e)| e - s).sum::<u64>()))
        })
        .max_by_key(|&(_, bytes)| bytes)
        .map(|(ino, _)| ino)
}

/// Fetches units of `ino`, a file another worker is fetching (it completes the file),
/// while it is offered and has units no one is fetching; returns false when the crawler
/// must stop.
fn help_with(store: &Store, m: &Migration, sh: &Shared, ino: Ino) -> bool {
    // Held open, as the owner's visit holds it (see `fetch_leaf`).
    let Ok(opened) = store.open_file(ino, libc::O_RDONLY | libc::O_NONBLOCK, false) else {
        return !should_stop(m);
    };
    let unit = m.cfg.unit_size;
    let go_on = loop {
        if !wait_while_paused(m) {
            break false;
        }
        let Ok(Some(row)) = m.db.get(ino) else {
            break true;
        };
        let missing = store.stub_state(ino).missing;
        let free = free_units(m, ino, &missing, unit);
        let Some((unit_start, unit_missing)) = m.begin_admission(ino, &free) else {
            break true;
        };
        let admitted = m.crawl_admission(unit_missing);
        let claim = admitted
            .then(|| m.try_claim_unit(ino, unit_start))
            .flatten();
        m.end_admission(ino, unit_start);
        let Some(claim) = claim else {
            m.throttle_refund(unit_missing);
            continue;
        };
        // Only while still offered, checked with the unit claimed: the owner withdraws
        // the offer before it waits for the claims on the file, so it never ends its
        // visit with a helper's write still to come.
        let still_offered = sh
            .offered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&ino);
        if !still_offered {
            m.throttle_refund(unit_missing);
            break true;
        }
        if let Err(e) = m.fetch_claimed_unit(store, &row, &claim) {
            tracing::warn!(ino, errno = e.errno(), "crawler fetch failed (helping)");
            sh.fail(ino, e.errno(), "fetch data");
            break !should_stop(m);
        }
    };
    let _ = store.release(opened.fh);
    go_on
}

#[cfg(test)]
mod tests {
    //! The crawler's threads sharing the units of one large file, over a slow in-memory
    //! source that records every read.

    use super::*;
    use crate::migrate::source::{
        FileKind as SrcKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError,
        SourceErrorKind, SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
    };
    use crate::migrate::{MigrationConfig, Migrations};
    use crate::types::ROOT_INO;
    use crate::{Store, StoreConfig};
    use std::collections::HashMap;

    const UNIT: u64 = 64 << 10;

    /// The root holds `files` (name, size); every read sleeps `delay` and is recorded.
    struct SlowSource {
        files: Vec<(String, u64)>,
        delay: Duration,
        reads: Arc<Reads>,
    }

    #[derive(Default)]
    struct Reads {
        /// (file, offset) → reads of it so far.
        count: Mutex<HashMap<(String, u64), u32>>,
        /// Reads in flight now, and the most seen at once.
        in_flight: Mutex<(Vec<(String, u64)>, usize)>,
    }

    fn attr(kind: SrcKind, ino: u64, size: u64) -> SourceAttr {
        let t = Timestamp {
            secs: 1_000_000_000,
            nanos: 0,
        };
        SourceAttr {
            perm: 0o755,
            ..SourceAttr::plain(kind, ino, size, t)
        }
    }

    fn byte(name: &str, at: u64) -> u8 {
        (at as u8).wrapping_mul(7).wrapping_add(name.len() as u8)
    }

    impl SlowSource {
        fn get(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
            if path.is_root() {
                return Ok(attr(SrcKind::Directory, 1, 0));
            }
            let name = String::from_utf8_lossy(path.as_bytes()).into_owned();
            self.files
                .iter()
                .position(|(n, _)| *n == name)
                .map(|i| attr(SrcKind::Regular, 10 + i as u64, self.files[i].1))
                .ok_or_else(|| SourceError::new(SourceErrorKind::NotFound, path, "no such file"))
        }
    }

    impl Source for SlowSource {
        fn describe(&self) -> String {
            "slow memory".into()
        }
        fn features(&self) -> SourceFeatures {
            SourceFeatures {
                unix_ids: true,
                ..SourceFeatures::default()
            }
        }
        fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
            self.get(path)
        }
        fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
            self.get(path)?;
            Ok(self
                .files
                .iter()
                .enumerate()
                .map(|(i, (n, size))| SourceEntry {
                    name: n.as_bytes().to_vec(),
                    attr: attr(SrcKind::Regular, 10 + i as u64, *size),
                })
                .collect())
        }
        fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
            let size = self.get(path)?.size;
            let name = String::from_utf8_lossy(path.as_bytes()).into_owned();
            {
                let mut f = self.reads.in_flight.lock().unwrap();
                f.0.push((name.clone(), offset));
                f.1 = f.1.max(f.0.len());
            }
            *self
                .reads
                .count
                .lock()
                .unwrap()
                .entry((name.clone(), offset))
                .or_default() += 1;
            std::thread::sleep(self.delay);
            self.reads
                .in_flight
                .lock()
                .unwrap()
                .0
                .retain(|r| *r != (name.clone(), offset));
            let end = offset.saturating_add(len as u64).min(size);
            Ok((offset.min(end)..end).map(|at| byte(&name, at)).collect())
        }
        source_without_metadata!();
    }

    struct Setup {
        _dir: tempfile::TempDir,
        store: Arc<Store>,
        m: Arc<Migration>,
        reads: Arc<Reads>,
    }

    fn setup(files: &[(&str, u64)], delay_ms: u64, workers: usize, share: bool) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t0")).unwrap();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.path().join("state").display(),
            dir.path().join("t0").display()
        );
        let store = Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap();
        let reads = Arc::new(Reads::default());
        let source = SlowSource {
            files: files.iter().map(|(n, s)| (n.to_string(), *s)).collect(),
            delay: Duration::from_millis(delay_ms),
            reads: reads.clone(),
        };
        let mut mc = MigrationConfig::new("t");
        mc.crawl_workers = workers;
        mc.unit_size = UNIT;
        mc.share_units = share;
        let m = Migration::open(&store, Box::new(source), mc).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        Setup {
            _dir: dir,
            store,
            m,
            reads,
        }
    }

    impl Setup {
        fn ino(&self, name: &str) -> Ino {
            let a = self.store.lookup(ROOT_INO, OsStr::new(name)).unwrap();
            self.store.forget(a.ino, 1);
            a.ino
        }

        fn read(&self, ino: Ino, offset: u64, len: u32) -> Vec<u8> {
            let fh = self.store.open_file(ino, libc::O_RDONLY, false).unwrap().fh;
            let data = self.store.read(fh, offset, len).unwrap();
            self.store.release(fh).unwrap();
            data
        }

        fn expect_content(&self, name: &str, size: u64) {
            let data = self.read(self.ino(name), 0, size as u32);
            assert_eq!(data.len() as u64, size);
            assert!(
                data.iter()
                    .enumerate()
                    .all(|(i, b)| *b == byte(name, i as u64)),
                "{name}: bytes differ from the source"
            );
        }

        /// Every unit of `name` (`size` bytes) was read from the source exactly once.
        fn expect_each_unit_read_once(&self, name: &str, size: u64) {
            let count = self.reads.count.lock().unwrap();
            for at in (0..size).step_by(UNIT as usize) {
                assert_eq!(
                    count.get(&(name.to_string(), at)),
                    Some(&1),
                    "{name}: unit at {at} read once"
                );
            }
            let total: u32 = count
                .iter()
                .filter(|((n, _), _)| n == name)
                .map(|(_, c)| c)
                .sum();
            assert_eq!(total as u64, size.div_ceil(UNIT), "{name}: no other reads");
        }
    }

    fn crawl_to_the_end(s: &Setup) {
        let crawler = Crawler::start(s.store.clone(), s.m.clone());
        assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
        drop(crawler);
        assert_eq!(s.m.remaining(), 0);
    }

    /// A chain of `levels` directories named `d` below the root, each level (the root
    /// too) holding a file `f` of 100 bytes; every listing is recorded with whether a
    /// read-ahead thread made it.
    struct ChainSource {
        levels: usize,
        listings: Arc<Mutex<Vec<(SourcePath, bool)>>>,
    }

    impl ChainSource {
        /// (depth, is the file `f`) of `path`, if it exists.
        fn at(&self, path: &SourcePath) -> SourceResult<(usize, bool)> {
            let names: Vec<&[u8]> = path.components().collect();
            let (dirs, file) = match names.split_last() {
                Some((last, rest)) if *last == b"f" => (rest, true),
                _ => (&names[..], false),
            };
            if dirs.len() > self.levels || dirs.iter().any(|n| *n != b"d") {
                return Err(SourceError::new(SourceErrorKind::NotFound, path, "none"));
            }
            Ok((dirs.len(), file))
        }

        fn attr_of(depth: usize, file: bool) -> SourceAttr {
            if file {
                attr(SrcKind::Regular, 1000 + depth as u64, 100)
            } else {
                attr(SrcKind::Directory, 1 + depth as u64, 0)
            }
        }
    }

    impl Source for ChainSource {
        fn describe(&self) -> String {
            "chain".into()
        }
        fn features(&self) -> SourceFeatures {
            SourceFeatures {
                unix_ids: true,
                ..SourceFeatures::default()
            }
        }
        fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
            let (depth, file) = self.at(path)?;
            Ok(Self::attr_of(depth, file))
        }
        fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
            let (depth, file) = self.at(path)?;
            if file {
                return Err(SourceError::new(SourceErrorKind::WrongKind, path, "file"));
            }
            let ahead = std::thread::current().name() == Some("kaiso-readahead");
            self.listings.lock().unwrap().push((path.clone(), ahead));
            let mut out = vec![SourceEntry {
                name: b"f".to_vec(),
                attr: Self::attr_of(depth, true),
            }];
            if depth < self.levels {
                out.push(SourceEntry {
                    name: b"d".to_vec(),
                    attr: Self::attr_of(depth + 1, false),
                });
            }
            Ok(out)
        }
        fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
            self.at(path)?;
            let end = offset.saturating_add(len as u64).min(100);
            Ok((offset.min(end)..end).map(|at| byte("f", at)).collect())
        }
        source_without_metadata!();
    }

    /// The listing read-ahead of a crawl runs down a deep chain by itself: with the
    /// crawl's expansions held (the store's namespace locked by the test), every level
    /// below is still listed, each exactly once, and the crawl then uses those listings.
    #[test]
    fn listing_read_ahead_runs_down_a_deep_chain_while_the_crawl_is_held() {
        const LEVELS: usize = 40;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t0")).unwrap();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"1GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.path().join("state").display(),
            dir.path().join("t0").display()
        );
        let store = Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap();
        let listings = Arc::new(Mutex::new(Vec::new()));
        let source = ChainSource {
            levels: LEVELS,
            listings: listings.clone(),
        };
        let mut mc = MigrationConfig::new("t");
        mc.crawl_workers = 2;
        let m = Migration::open(&store, Box::new(source), mc).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        let depth_of = |p: &SourcePath| p.components().count();
        let listed = |at_least: usize| {
            let until = Instant::now() + Duration::from_secs(60);
            loop {
                let got: std::collections::HashSet<usize> = listings
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(p, _)| depth_of(p))
                    .collect();
                if got.len() >= at_least || Instant::now() >= until {
                    return got.len();
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let crawler = Crawler::start(store.clone(), m.clone());
        // Once level 2 is listed the crawl runs (and its read-ahead with it); from then
        // on no expansion can go further while the namespace is locked.
        assert!(listed(3) >= 3, "the crawl never listed level 2");
        let held = store.ns();
        let levels = listed(LEVELS + 1);
        drop(held);
        assert_eq!(
            levels,
            LEVELS + 1,
            "with the crawl's expansions held, the listing read-ahead listed {levels} of \
             {} levels: expected it to run down the whole chain by itself; listings \
             (depth, by a read-ahead thread): {:?}",
            LEVELS + 1,
            listings
                .lock()
                .unwrap()
                .iter()
                .map(|(p, ahead)| (depth_of(p), *ahead))
                .collect::<Vec<_>>()
        );
        assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
        drop(crawler);
        assert_eq!(m.remaining(), 0);
        let l = listings.lock().unwrap();
        assert_eq!(l.len(), LEVELS + 1, "each level listed exactly once: {l:?}");
        assert!(
            l.iter().filter(|(_, ahead)| *ahead).count() >= LEVELS - 2,
            "the levels below the top were listed by read-ahead threads: {l:?}"
        );
        // The deepest file arrived whole.
        let mut ino = ROOT_INO;
        for _ in 0..LEVELS {
            let a = store.lookup(ino, OsStr::new("d")).unwrap();
            store.forget(a.ino, 1);
            ino = a.ino;
        }
        let f = store.lookup(ino, OsStr::new("f")).unwrap();
        store.forget(f.ino, 1);
        let fh = store.open_file(f.ino, libc::O_RDONLY, false).unwrap().fh;
        let data = store.read(fh, 0, 200).unwrap();
        store.release(fh).unwrap();
        assert_eq!(data, (0..100).map(|at| byte("f", at)).collect::<Vec<u8>>());
    }

    #[test]
    fn idle_workers_fetch_distinct_units_of_one_large_file_at_once() {
        let size = 12 * UNIT + 100;
        let s = setup(&[("big", size), ("small", 1000)], 40, 4, true);
        crawl_to_the_end(&s);
        let most = s.reads.in_flight.lock().unwrap().1;
        assert!(
            most >= 2,
            "units of one file fetched at once ({most} at most)"
        );
        s.expect_each_unit_read_once("big", size);
        s.expect_content("big", size);
        s.expect_content("small", 1000);
    }

    #[test]
    fn without_unit_sharing_one_worker_fetches_a_files_units_one_after_another() {
        // The counterpart of the test above: what it measures is the sharing.
        let size = 8 * UNIT;
        let s = setup(&[("big", size)], 20, 4, false);
        crawl_to_the_end(&s);
        assert_eq!(s.reads.in_flight.lock().unwrap().1, 1);
        s.expect_each_unit_read_once("big", size);
        s.expect_content("big", size);
    }

    #[test]
    fn a_client_read_of_a_unit_being_fetched_waits_for_that_fetch_and_others_go_first() {
        let size = 16 * UNIT;
        let s = setup(&[("big", size)], 150, 2, true);
        let big = s.ino("big");
        let crawler = Crawler::start(s.store.clone(), s.m.clone());
        // A unit the crawler is reading now.
        let until = Instant::now() + Duration::from_secs(30);
        let busy = loop {
            let f = s.reads.in_flight.lock().unwrap().0.first().cloned();
            if let Some((_, at)) = f {
                break at;
            }
            assert!(Instant::now() < until, "the crawl never read");
            std::thread::sleep(Duration::from_millis(2));
        };
        let data = s.read(big, busy, 100);
        assert!(
            data.iter()
                .enumerate()
                .all(|(i, b)| *b == byte("big", busy + i as u64))
        );
        // The last unit, which the crawler reaches last: served at once, ahead of it.
        let last = size - UNIT;
        let data = s.read(big, last, 100);
        assert_eq!(data[0], byte("big", last));
        assert!(
            !s.store.stub_state(big).missing.is_empty(),
            "the client's read was served before the crawl fetched the rest"
        );
        assert_eq!(crawler.wait(Duration::from_secs(120)), CrawlState::Done);
        drop(crawler);
        // Neither the unit both wanted nor any other was read twice.
        s.expect_each_unit_read_once("big", size);
        s.expect_content("big", size);
    }
}
