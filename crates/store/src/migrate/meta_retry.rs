//! Metadata reads the source leaves unanswered, retried a bounded number of times.
//!
//! A metadata read (xattrs, ACL, streams, a symlink's target, a listed directory's own
//! times) that fails because the source is unreachable is not skipped but made again
//! later (see `engine::metadata_retried`). When the rest of the source answers and one
//! entry keeps failing, that would keep its stub for ever and `finish` could never
//! complete. So each failure of the crawl's (or `finish`'s) read is counted per source
//! path, when the share's root answers a `stat` right after it (a source that answers
//! nothing is an outage of the whole share: not counted, retried without end as
//! before); clients' reads are retried but never counted (see [`CountAttempts`]). Once an entry has failed
//! [`MigrationConfig::meta_give_up_attempts`](super::MigrationConfig) counted times over
//! at least [`MigrationConfig::meta_give_up_after`](super::MigrationConfig), its read is
//! given up: the skip report says "source unreachable after K attempts over T s: <last
//! error>" and the entry is migrated without that metadata. A read that succeeds clears
//! the entry's count.
//!
//! The counts are kept in the share's state database (meta key [`RECORD_KEY`], JSON), so
//! they survive kill -9 and a restart: without that, a daemon restarted more often than
//! the bound would never give up.
//!
//! Also here: which unlisted directories have had their own metadata copied (a client's
//! `getxattr`/`listxattr` of the directory before it is listed, see
//! `Migrations::fill_meta`).

use std::cell::Cell;
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::source::{SourceError, SourcePath};
use super::state::MigrationDb;

thread_local! {
    /// Set while this thread's metadata reads count as attempts (see [`CountAttempts`]).
    static COUNTED_HERE: Cell<bool> = const { Cell::new(false) };
}

/// While alive, the metadata reads this thread makes count as attempts (`finish`'s
/// retry; crawler threads always count). Clients' reads never do: a client's repeated
/// `ls -l` must neither hasten the give-up nor pay for the root `stat` that tells an
/// entry's failure from an outage of the whole source (with a dropped NFS or SMB server
/// that `stat` waits for a reconnect: a client's failing call would take two timeouts).
pub(crate) struct CountAttempts(bool);

impl CountAttempts {
    pub(crate) fn here() -> Self {
        Self(COUNTED_HERE.with(|c| c.replace(true)))
    }
}

impl Drop for CountAttempts {
    fn drop(&mut self) {
        COUNTED_HERE.with(|c| c.set(self.0));
    }
}

/// Whether this thread's metadata reads count as attempts (besides crawler threads).
pub(crate) fn counted_here() -> bool {
    COUNTED_HERE.with(Cell::get)
}

/// The state database's meta key holding the counts.
pub const RECORD_KEY: &str = "metadata_unreachable";

/// Counted failures of an entry's metadata read before it may be given up (see
/// [`MigrationConfig::meta_give_up_attempts`](super::MigrationConfig)).
pub const DEFAULT_GIVE_UP_ATTEMPTS: u32 = 5;

/// Time from an entry's first counted failure before it may be given up (see
/// [`MigrationConfig::meta_give_up_after`](super::MigrationConfig)).
pub const DEFAULT_GIVE_UP_AFTER: Duration = Duration::from_secs(900);

/// An entry whose metadata the source has not given yet, although the share's root
/// answered: retried until the bound, then skipped (for `kaiso migrate status`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataRetry {
    pub src_path: SourcePath,
    /// Counted failures so far.
    pub attempts: u32,
    /// The bound: given up at the first failure with at least this many attempts ...
    pub give_up_attempts: u32,
    /// ... and at least this long after the first one.
    pub give_up_after: Duration,
    /// Seconds since the Unix epoch of the first and the last counted failure.
    pub first_failed_unix: u64,
    pub last_failed_unix: u64,
    pub last_error: String,
}

impl MetadataRetry {
    /// One line for status and `finish`'s refusal.
    pub fn describe(&self) -> String {
        let ago = unix(SystemTime::now()).saturating_sub(self.first_failed_unix);
        format!(
            "{}: metadata unreachable {} times, the first {ago} s ago, while the source answers; retried, and skipped at a failure once {} attempts and {} s are reached: {}",
            self.src_path,
            self.attempts,
            self.give_up_attempts,
            self.give_up_after.as_secs(),
            self.last_error
        )
    }
}

/// One path's record as stored (JSON).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    /// The source path, hex.
    p: String,
    n: u32,
    t0: u64,
    t1: u64,
    e: String,
}

/// What to do after a failed read.
pub(crate) enum Verdict {
    /// Keep the metadata to do: it is read again later.
    Retry,
    /// Give it up; the skip report's reason.
    GiveUp(String),
}

/// The per-share bookkeeping (a field of `Migration`).
#[derive(Default)]
pub(crate) struct MetaRetries {
    /// The counts by source path, loaded from the database at first use.
    counts: Mutex<Option<BTreeMap<Vec<u8>, Record>>>,
    /// Unlisted directories (store inode, source path) whose own xattrs and ACL were
    /// copied (`getxattr` before the listing): not copied again until listed. In memory
    /// only: after a restart the copy is made once more, which is idempotent (the source
    /// is read-only, and no client can change an unlisted directory's metadata: every
    /// change lists it first).
    own_copied: Mutex<HashSet<(u64, Vec<u8>)>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn load(db: &MigrationDb) -> BTreeMap<Vec<u8>, Record> {
    let text = match db.meta(RECORD_KEY) {
        Ok(Some(t)) => t,
        Ok(None) => return BTreeMap::new(),
        Err(e) => {
            tracing::warn!("metadata retry counts not read (counting from 0): {e}");
            return BTreeMap::new();
        }
    };
    let records: Vec<Record> = serde_json::from_str(&text).unwrap_or_else(|e| {
        tracing::warn!("metadata retry counts unreadable (counting from 0): {e}");
        Vec::new()
    });
    records
        .into_iter()
        .filter_map(|r| Some((unhex(&r.p)?, r)))
        .collect()
}

fn save(db: &MigrationDb, counts: &BTreeMap<Vec<u8>, Record>) {
    let records: Vec<&Record> = counts.values().collect();
    let text = serde_json::to_string(&records).unwrap_or_else(|_| "[]".into());
    if let Err(e) = db.set_meta(RECORD_KEY, &text) {
        tracing::warn!("metadata retry counts not saved: {e}");
    }
}

fn entry(r: &Record, bound: (u32, Duration)) -> Option<MetadataRetry> {
    Some(MetadataRetry {
        src_path: SourcePath::parse(&unhex(&r.p)?).ok()?,
        attempts: r.n,
        give_up_attempts: bound.0,
        give_up_after: bound.1,
        first_failed_unix: r.t0,
        last_failed_unix: r.t1,
        last_error: r.e.clone(),
    })
}

impl MetaRetries {
    fn with<R>(&self, db: &MigrationDb, f: impl FnOnce(&mut BTreeMap<Vec<u8>, Record>) -> R) -> R {
        let mut g = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        f(g.get_or_insert_with(|| load(db)))
    }

    /// A metadata read of `src` failed with `e`, the source being unreachable.
    /// `counted`: the share's root answered right after (else nothing is counted).
    /// `bound`: (attempts, minimum time since the first counted failure).
    pub(crate) fn failed(
        &self,
        db: &MigrationDb,
        src: &SourcePath,
        e: &SourceError,
        counted: bool,
        bound: (u32, Duration),
        now: SystemTime,
    ) -> Verdict {
        if !counted {
            return Verdict::Retry;
        }
        let now = unix(now);
        self.with(db, |counts| {
            let r = counts
                .entry(src.as_bytes().to_vec())
                .or_insert_with(|| Record {
                    p: hex(src.as_bytes()),
                    n: 0,
                    t0: now,
                    t1: now,
                    e: String::new(),
                });
            r.n = r.n.saturating_add(1);
            r.t1 = now;
            r.e = e.to_string();
            let over = now.saturating_sub(r.t0);
            if r.n >= bound.0 && over >= bound.1.as_secs() {
                let reason = format!(
                    "source unreachable after {} attempts over {over} s: {}",
                    r.n, r.e
                );
                counts.remove(src.as_bytes());
                save(db, counts);
                return Verdict::GiveUp(reason);
            }
            save(db, counts);
            Verdict::Retry
        })
    }

    /// A metadata read of `src` succeeded: its count, if any, goes.
    pub(crate) fn answered(&self, db: &MigrationDb, src: &SourcePath) {
        self.with(db, |counts| {
            if counts.remove(src.as_bytes()).is_some() {
                save(db, counts);
            }
        })
    }

    /// Whether `src` or an entry directly in it is being retried (a directory listing
    /// stops at such an entry).
    pub(crate) fn blocks_listing(&self, db: &MigrationDb, dir: &SourcePath) -> bool {
        self.with(db, |counts| {
            counts.keys().any(|p| {
                SourcePath::parse(p)
                    .is_ok_and(|p| p == *dir || p.parent().is_some_and(|q| q == *dir))
            })
        })
    }

    pub(crate) fn list(&self, db: &MigrationDb, bound: (u32, Duration)) -> Vec<MetadataRetry> {
        self.with(db, |counts| {
            counts.values().filter_map(|r| entry(r, bound)).collect()
        })
    }

    /// The records of a share's database (offline status).
    pub(crate) fn saved(db: &MigrationDb, bound: (u32, Duration)) -> Vec<MetadataRetry> {
        load(db).values().filter_map(|r| entry(r, bound)).collect()
    }

    /// Whether unlisted directory `ino` (`src`) had its own metadata copied.
    pub(crate) fn own_copied(&self, ino: u64, src: &SourcePath) -> bool {
        self.own_copied
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&(ino, src.as_bytes().to_vec()))
    }

    pub(crate) fn set_own_copied(&self, ino: u64, src: &SourcePath, copied: bool) {
        let mut g = self.own_copied.lock().unwrap_or_else(|e| e.into_inner());
        if copied {
            g.insert((ino, src.as_bytes().to_vec()));
        } else if !g.is_empty() {
            g.remove(&(ino, src.as_bytes().to_vec()));
        }
    }
}
