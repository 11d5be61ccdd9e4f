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
//! - Each round restarts from the root (nothing already copied is copied again). Rounds
//!   repeat until the remaining-stub counter is 0; a round that makes no progress ends the
//!   crawl with `stuck` (e.g. the source is unreachable) instead of spinning.

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kaiso_policy::crawl::{ChildKind, CrawlPartition, CrawlWork, Pass};

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

struct Shared {
    part: Mutex<CrawlPartition<Ino>>,
    /// Leaves claimed because a client moved them (fetched before the next listing).
    rescued: Mutex<Vec<(Ino, Pass)>>,
    wake: Condvar,
    state: Mutex<CrawlState>,
    rounds: Mutex<u32>,
}

/// A running crawl; dropping it stops the workers (within one unit) and joins them.
pub struct Crawler {
    migration: Arc<Migration>,
    shared: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Crawler {
    pub fn start(store: Arc<Store>, migration: Arc<Migration>) -> Self {
        migration.stop.store(false, Ordering::Release);
        let shared = Arc::new(Shared {
            part: Mutex::new(CrawlPartition::new(
                migration.cfg.order,
                migration.root_ino(),
            )),
            wake: Condvar::new(),
            state: Mutex::new(CrawlState::Running),
            rounds: Mutex::new(0),
            rescued: Mutex::new(Vec::new()),
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
            let work = sh
                .part
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .on_rename(&ino, kind);
            if let Some(CrawlWork::Fetch(leaf, pass)) = work {
                sh.rescued
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((leaf, pass));
            }
            sh.wake.notify_all();
        }));
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

    pub fn rounds(&self) -> u32 {
        *self.shared.rounds.lock().unwrap_or_else(|e| e.into_inner())
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
    let mut last_remaining = u64::MAX;
    loop {
        if !wait_while_paused(m) {
            return;
        }
        let rescued = sh.rescued.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some((leaf, pass)) = rescued {
            if !fetch_leaf(store, m, leaf, pass) {
                return;
            }
            continue;
        }
        let next = {
            let mut part = sh.part.lock().unwrap_or_else(|e| e.into_inner());
            loop {
                if should_stop(m) {
                    return;
                }
                if let Some(d) = part.take() {
                    break Some((d, part.pass()));
                }
                if part.pass_done() {
                    if part.next_pass() {
                        continue;
                    }
                    // End of a round: finished, stuck, or go again from the root.
                    let remaining = m.reconcile(store).unwrap_or(u64::MAX);
                    *sh.rounds.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                    if remaining == 0 {
                        *sh.state.lock().unwrap_or_else(|e| e.into_inner()) = CrawlState::Done;
                        sh.wake.notify_all();
                        return;
                    }
                    if remaining >= last_remaining {
                        *sh.state.lock().unwrap_or_else(|e| e.into_inner()) = CrawlState::Stuck;
                        sh.wake.notify_all();
                        return;
                    }
                    last_remaining = remaining;
                    part.restart();
                    continue;
                }
                if matches!(
                    *sh.state.lock().unwrap_or_else(|e| e.into_inner()),
                    CrawlState::Done | CrawlState::Stuck
                ) {
                    return;
                }
                // Others are still listing: wait for their results.
                part = sh
                    .wake
                    .wait_timeout(part, Duration::from_millis(50))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };
        let Some((dir, pass)) = next else { return };
        let pass = pass.unwrap_or(Pass::Bulk);
        match list(store, dir) {
            Ok(children) => {
                let work = sh
                    .part
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_listed(&dir, &children);
                sh.wake.notify_all();
                for w in work {
                    if let CrawlWork::Fetch(ino, _) = w
                        && !fetch_leaf(store, m, ino, pass)
                    {
                        return;
                    }
                }
            }
            Err(crate::FsError::NOENT) | Err(crate::FsError::NOTDIR) => {
                sh.part
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_gone(&dir);
                sh.wake.notify_all();
            }
            Err(e) => {
                // Transient (source unreachable): give it back; the round's progress check
                // ends the crawl as stuck if nothing moves.
                tracing::warn!(dir, errno = e.errno(), "crawler could not list a directory");
                sh.part
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .on_gone(&dir);
                sh.wake.notify_all();
            }
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
fn fetch_leaf(store: &Store, m: &Migration, ino: Ino, pass: Pass) -> bool {
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
    let go_on = visit_leaf(store, m, ino, pass, opened.fh);
    let _ = store.release(opened.fh);
    go_on
}

fn visit_leaf(store: &Store, m: &Migration, ino: Ino, pass: Pass, fh: u64) -> bool {
    let Ok(Some(row)) = m.db.get(ino) else {
        return !should_stop(m);
    };
    if pass == Pass::Metadata || row.kind == StubKind::DummyFile {
        if let Err(e) = m.ensure_partial(store, &row) {
            tracing::warn!(ino, errno = e.errno(), "metadata fetch failed");
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
        let Some(&(start, _)) = store.stub_state(ino).missing.first() else {
            let _ = m.fetch_range(store, &row, 0, 0);
            return true;
        };
        // Through the store's fill path so the per-file fill lock orders us with clients.
        let unit = m.cfg.unit_size.min(u32::MAX as u64) as u32;
        let aligned = start / m.cfg.unit_size * m.cfg.unit_size;
        match store.read(fh, aligned, unit) {
            Ok(_) => {}
            // Paused or stopped while throttled: the loop waits, then retries the unit.
            Err(crate::FsError::BUSY) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => {
                tracing::warn!(ino, errno = e.errno(), "crawler fetch failed");
                return !should_stop(m);
            }
        }
    }
}
