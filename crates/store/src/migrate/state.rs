//! Persistent migration state: one SQLite database per migrated share,
//! `<state_dir>/migrate/<name>/migrate.db`, separate from the store's own database.
//!
//! Stub info lives here, keyed by the store inode number, because inode numbers survive
//! renames and tier moves while destination paths do not:
//!
//! | table     | row                                                                 |
//! |-----------|---------------------------------------------------------------------|
//! | `stubs`   | one per object still a stub: state (dummy/partial), **source path** (derived from the parent's source path when the parent was listed, so client renames never change it), source inode, kind, `minsize` |
//! | `anchors` | hard-link anchors: source inode → the store inode of its first link (and that file's backing identity) |
//! | `done`    | files whose copy completed: source path, size and mtime listed, the tier file's ctime right after the completing fetch (NULL: unknown), backing identity |
//! | `skipped` | what could not be copied and why (the bad-input report)            |
//! | `meta`    | the remaining-stub counter, the clean-shutdown flag, the source URL, the count of files clients deleted |
//!
//! Rows keyed by inode number also record the **backing identity** of the file they were
//! made for (`ident`: tier slot, backing inode number, birth time or inode generation;
//! `crate::stub::BackingIdentity`, as the store's own stub rows): the file system hands
//! a freed number to the next new file, and a row that outlived its file (a kill between
//! a client's unlink and the row's removal) must not pass to it. The engine checks it
//! before a row's state is applied (see `Migration::row_outlived_its_file`). NULL (rows
//! from before, directories, file systems without a stamp): trusted as before.
//!
//! Which byte ranges of a partial file are still missing is tracked exactly by the store
//! (its `stubs` table, through `Store::stub_state`), not here.
//!
//! The counter is `COUNT(*)` of `stubs` kept in `meta.remaining` and updated in the same
//! transaction as every row change, so it is always right after a clean stop. After an
//! unclean stop (`meta.clean` = 0 at open) it is recomputed from the rows and reconciled
//! with the store (see `Migration::open`). 0 means the share is fully migrated.
//!
//! # What is durable when
//!
//! The database runs in WAL mode with `synchronous=NORMAL`: every change is one
//! transaction committed into the WAL before the call returns, without an fsync.
//!
//! - **Process crash (kill -9)**: every change whose call returned survives (the WAL is in
//!   the OS page cache), exactly as with `synchronous=FULL`. Nothing is buffered in the
//!   process, so there is no window in which an acknowledged change lives only in memory.
//! - **OS crash / power loss**: the WAL is a log, so what can be lost is a *suffix* of the
//!   commits since the last fsync of the WAL; the database then looks like it did a moment
//!   earlier. [`MigrationDb::sync`] fsyncs the WAL once for every commit made before it
//!   (group commit: concurrent callers share one fsync). The engine calls it where an
//!   older state would be wrong rather than merely old: before the store marks a listed
//!   directory as listed (the store must never hold an expanded entry whose stub row could
//!   vanish), after the share's root row is created, at a clean close, and when a client
//!   fsyncs a file of the share (`StubFiller::sync_state`; the store makes the file's
//!   missing ranges durable itself, see `Store::fsync`). Every other
//!   change only moves a stub forward (dummy → partial → gone, `done` records, skip
//!   report); losing it puts the stub back a step, and redoing that step is idempotent: a
//!   partial file's data is taken from the ranges *the store* reports missing, never from
//!   this database, so a fetch redone after a crash writes only bytes still missing and
//!   never overwrites a byte a client wrote. Stale rows of completed or deleted objects are
//!   dropped by the reconciliation that runs after every unclean stop.
//!
//! This replaces one fsync per row change (`synchronous=FULL`, 3–4 per file) with one per
//! listed directory, which is what made a migration slower than `rsync`.
//!
//! One exception to "committed before the call returns": a crawl's completion made while
//! a sync is under way ([`MigrationDb::complete_unless_syncing`]) is *deferred*, queued
//! and committed by the group transaction after that sync. Nothing is acknowledged by it:
//! until then the file's row stays (in the database and the mirror) exactly as between
//! its last fetched byte and its completion, and a kill in between leaves that state,
//! from which the crawl completes the file again (the store holds its data; nothing is
//! fetched). Every sync commits the deferred completions queued before it first, a
//! reconcile and a clean close commit them before they read or mark anything.
//!
//! # How large the state directory grows
//!
//! The WAL is checkpointed only by a sync (a checkpoint makes rows durable, so it must
//! come after the fetched data, see `sync`), and a sync waits for a `syncfs` of every
//! tier, which takes seconds on a loaded disk. So the WAL is bounded by size, not by
//! time: a sync is due past [`SYNC_WAL_BYTES`] (a crawl's committer thread makes it, off
//! the crawler threads), and past [`HOLD_WAL_BYTES`] the crawl's writers wait for it
//! ([`MigrationDb::hold_for_wal`]) instead of appending more. The store's WAL has the
//! same bound (`crate::stub::HOLD_WAL_BYTES`), so both stay under about 13 MiB together
//! whatever the disk's speed. A file completed outside a sync costs about 6 KB of WAL
//! (1 KiB pages, [`PAGE_SIZE`]; per-file row changes of concurrent callers share one
//! transaction, [`MigrationDb::grouped`]); a completion deferred during a sync under
//! 100 B, as the completions of one sync share pages in one transaction (about 3.3 KB
//! per file over a crawl of small files on a slow disk, measured by
//! `the_wals_stay_bounded_…` in `migrate::tests`). While a sync runs, the crawl's
//! completions are deferred rather than held, so its writers wait for the sync only if
//! its dummy → partial changes alone (about 1 KB a file) take the WAL past the bound.
//!
//! Reads never touch SQLite: the stub rows are mirrored in memory (loaded at open and
//! updated after each commit under the same lock), so lookups on the fetch path cost a
//! hash probe. The read-only handle used by `status` has no mirror and reads SQL.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::source::{SourceErrorKind, SourcePath};
use crate::stub::FetchBarrier;
use std::sync::{Arc, Mutex};

/// Stub state of one object (normal objects have no row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StubKind {
    /// A directory not listed yet.
    DummyDir,
    /// A file created from its parent's listing: attributes only.
    DummyFile,
    /// A file whose xattrs, ACLs and streams are copied; data may still be missing.
    PartialFile,
}

impl StubKind {
    fn code(self) -> i64 {
        match self {
            StubKind::DummyDir => 0,
            StubKind::DummyFile => 1,
            StubKind::PartialFile => 2,
        }
    }
    fn from_code(c: i64) -> Self {
        match c {
            0 => StubKind::DummyDir,
            1 => StubKind::DummyFile,
            _ => StubKind::PartialFile,
        }
    }
}

/// One stub row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubRow {
    pub ino: u64,
    pub kind: StubKind,
    pub src_path: SourcePath,
    pub src_ino: u64,
    /// The smallest size this file had since migration started: source bytes at or past
    /// it are never fetched (the thesis's truncate rule).
    pub minsize: u64,
    /// Size and mtime (ns) the source listing reported: a file whose source no longer
    /// matches them when its copy completes changed under us (reported, not verified).
    pub listed_size: u64,
    pub listed_mtime_ns: i64,
    /// The backing identity of the file the row was made for (encoded
    /// `crate::stub::BackingIdentity`), if known.
    pub ident: Option<Vec<u8>>,
}

/// One completion record (see [`MigrationDb::complete`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoneRow {
    pub ino: u64,
    pub src_path: SourcePath,
    /// Size and mtime (ns) the source listed, which the copy has.
    pub size: u64,
    pub mtime_ns: i64,
    /// The tier file's ctime (ns) right after the fetch that completed it; `None` when
    /// not known (completed otherwise, or a client changed it while it was a stub, or a
    /// database from before): `finish` then never fetches it again over what it holds.
    pub ctime_ns: Option<i64>,
    pub ident: Option<Vec<u8>>,
}

/// One entry of the skip report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    pub src_path: SourcePath,
    pub kind: String,
    pub reason: String,
}

/// Progress of one share (for `kaiso migrate status`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Files whose copy completed, and their bytes plus the bytes fetched of file stubs.
    pub files_done: u64,
    pub bytes_done: u64,
    /// Bytes known so far: completed files plus every file stub (grows with listings).
    pub bytes_known: u64,
    /// Bytes of file stubs still to be fetched.
    pub missing_bytes: u64,
    /// Files that are still stubs (dummy or partial).
    pub file_stubs: u64,
    /// Directories not listed yet.
    pub dirs_pending: u64,
    /// Stub rows (file stubs + pending directories): the remaining-stub counter.
    pub remaining: u64,
    /// The skip report.
    pub skipped: Vec<Skipped>,
}

pub struct MigrationDb {
    inner: Mutex<Inner>,
    /// The WAL file `sync` fsyncs (None for the read-only handle).
    wal: Option<PathBuf>,
    /// Group commit: commits made so far, and how many of them are known durable.
    committed: AtomicU64,
    synced: AtomicU64,
    /// One fsync at a time; callers that queued behind it find their commits covered.
    sync_lock: Mutex<()>,
    /// The store's fetch barrier: fetched bytes and the store's rows are made durable
    /// before this database's WAL (see `sync`).
    barrier: Mutex<Option<Arc<FetchBarrier>>>,
    /// Row changes waiting to join the next group transaction (see `grouped`).
    queue: Mutex<Queue>,
    /// Deferred completions (see [`MigrationDb::complete_unless_syncing`]) whose row
    /// went when their group committed, not yet taken by
    /// [`MigrationDb::take_deferred_completed`].
    deferred_completed: AtomicU64,
}

/// A per-file row change that joins a group transaction (see [`MigrationDb::grouped`]).
enum Queued {
    /// Dummy → partial.
    Kind(u64, StubKind),
    /// The row goes (if it is still the one for `src`), with its completion record.
    Remove {
        ino: u64,
        src: Option<SourcePath>,
        done: Option<(u64, i64, Option<i64>)>,
    },
}

/// The group transaction's queue: changes not taken yet, in call order, and the results
/// of changes another caller committed (by ticket).
#[derive(Default)]
struct Queue {
    next: u64,
    ops: Vec<(u64, Queued)>,
    results: HashMap<u64, Result<bool, (std::io::ErrorKind, String)>>,
    /// Tickets of deferred completions: no caller waits for their result, and they stay
    /// queued while a sync is under way (see [`MigrationDb::complete_unless_syncing`]).
    deferred: std::collections::HashSet<u64>,
}

struct Inner {
    conn: Connection,
    /// Mirror of the `stubs` table (None on the read-only handle).
    rows: Option<HashMap<u64, StubRow>>,
}

/// The `meta` key counting files clients deleted (see [`MigrationDb::forget_object`]).
const DELETED_BY_CLIENTS: &str = "deleted_by_clients";

/// WAL size past which `sync` checkpoints it into the main database file.
const CHECKPOINT_WAL_BYTES: u64 = 2 << 20;

/// WAL size past which a sync is due whatever the number of commits (see
/// [`MigrationDb::unsynced`]). A commit appends every page it touched to the WAL (a file's
/// completion about 6.7 KB with 1 KiB pages, 23 KiB with SQLite's default 4 KiB), so
/// counting commits alone let 8,000 small files grow the WAL to 180 MB before the first
/// sync (audit s11): the state directory must stay small.
const SYNC_WAL_BYTES: u64 = 3 << 20;

/// The WAL's hard bound: past it, the crawl's writers ([`MigrationDb::hold_for_wal`])
/// wait for the sync under way, which checkpoints the WAL, instead of appending more.
///
/// A sync makes the fetched data durable first (`syncfs` of every tier), which takes
/// seconds on a loaded disk; small files complete faster than that, and the WAL grew to
/// 25 MB meanwhile and filled a 64 MiB state directory together with the store's WAL
/// (CI, session 13). With 6 MiB here and in the store (`crate::stub::HOLD_WAL_BYTES`),
/// the two WALs stay under about 13 MiB whatever the disk's speed (a few writes outside
/// the crawl may pass the bound by a transaction each), so a 64 MiB state directory
/// keeps room for both databases and ext4's own overhead. It is twice the size that
/// makes a sync due, and the crawl's completions are deferred while a sync runs
/// ([`MigrationDb::complete_unless_syncing`]), so the crawl is held only when a sync is
/// slower than its dummy → partial changes take to append 3 MiB (about 3,000 files;
/// about 450 when completions were held too, session 14).
pub(crate) const HOLD_WAL_BYTES: u64 = 6 << 20;

/// Unsynced commits below which [`MigrationDb::unsynced`] does not look at the WAL's size.
const WAL_SIZE_CHECK_AFTER: u64 = 64;

/// The size the WAL file is cut back to when SQLite starts it over after a complete
/// checkpoint (`journal_size_limit`): without it the file keeps its largest size. Below
/// [`CHECKPOINT_WAL_BYTES`], so the file's size tells how much the WAL holds.
const WAL_KEPT_BYTES: u64 = 1 << 20;

/// The page size of new migration databases. Every commit appends each page it changed
/// to the WAL, whole: a completion changes a few rows of 50-200 bytes in 3-4 tables, so
/// with SQLite's default 4 KiB pages it cost about 23 KiB of WAL per file, with 1 KiB
/// pages about 6.7 KB (measured, `the_wals_stay_bounded_…` in `migrate::tests`). The
/// stub rows are mirrored in memory, so lookups never walk the deeper B-trees. A
/// database created before keeps its page size.
const PAGE_SIZE: u64 = 1024;

/// Missing byte ranges of file stubs, by store inode number.
pub(crate) type MissingByIno = HashMap<u64, Vec<(u64, u64)>>;

/// The missing ranges of every file stub in the store database `kaiso_db` (its `stubs`
/// table, read-only), for progress figures without a running store. `None` when the
/// database does not exist.
pub(crate) fn store_missing_ranges(kaiso_db: &Path) -> std::io::Result<Option<MissingByIno>> {
    if !kaiso_db.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        kaiso_db,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sql_err)?;
    conn.busy_timeout(std::time::Duration::from_secs(2))
        .map_err(sql_err)?;
    let mut st = conn
        .prepare("SELECT ino, missing FROM stubs WHERE unlisted=0")
        .map_err(sql_err)?;
    let rows = st
        .query_map([], |r| {
            let b: Vec<u8> = r.get(1)?;
            let ranges = b
                .chunks_exact(16)
                .map(|c| {
                    (
                        u64::from_le_bytes(c[..8].try_into().unwrap_or_default()),
                        u64::from_le_bytes(c[8..].try_into().unwrap_or_default()),
                    )
                })
                .collect::<Vec<_>>();
            Ok((r.get::<_, i64>(0)? as u64, ranges))
        })
        .map_err(sql_err)?
        .collect::<Result<HashMap<_, _>, _>>()
        .map_err(sql_err)?;
    Ok(Some(rows))
}

fn sql_err(e: rusqlite::Error) -> std::io::Error {
    sql_err_in(None, e)
}

/// Like [`sql_err`], naming the state directory `dir` when it is full (SQLITE_FULL): the
/// error's kind is then `StorageFull` and its words say which directory to free.
fn sql_err_in(dir: Option<&Path>, e: rusqlite::Error) -> std::io::Error {
    if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
        let dir = dir.map_or_else(String::new, |d| format!("{} ", d.display()));
        return std::io::Error::new(
            std::io::ErrorKind::StorageFull,
            format!("migration database: state directory {dir}full: No space left on device ({e})"),
        );
    }
    std::io::Error::other(format!("migration database: {e}"))
}

impl MigrationDb {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            // Private whatever the process umask (the daemons run with umask 0): the
            // share's state decides what a root daemon fetches and where.
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        let conn = Connection::open(path).map_err(sql_err)?;
        conn.execute_batch(
            &"PRAGMA page_size=%p;
             PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA wal_autocheckpoint=0;
             PRAGMA journal_size_limit=%d;
             CREATE TABLE IF NOT EXISTS stubs(ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, src_path BLOB NOT NULL, src_ino INTEGER NOT NULL, minsize INTEGER NOT NULL, listed_size INTEGER NOT NULL DEFAULT 0, listed_mtime INTEGER NOT NULL DEFAULT 0, ident BLOB);
             CREATE TABLE IF NOT EXISTS anchors(src_ino INTEGER PRIMARY KEY, ino INTEGER NOT NULL, ident BLOB);
             CREATE TABLE IF NOT EXISTS skipped(src_path BLOB NOT NULL, kind TEXT NOT NULL, reason TEXT NOT NULL, PRIMARY KEY(src_path, kind));
             CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS done(ino INTEGER PRIMARY KEY, src_path BLOB NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, ctime_ns INTEGER, ident BLOB);
             CREATE TABLE IF NOT EXISTS listed(src_path BLOB PRIMARY KEY, names BLOB NOT NULL);"
                .replace("%d", &WAL_KEPT_BYTES.to_string())
                .replace("%p", &PAGE_SIZE.to_string()),
        )
        .map_err(|e| sql_err_in(path.parent(), e))?;
        // Columns older databases lack: the listed size/mtime (first version), the
        // backing identities and the completion ctime (session 11; NULL: unknown).
        for (table, col, decl) in [
            ("stubs", "listed_size", "INTEGER NOT NULL DEFAULT 0"),
            ("stubs", "listed_mtime", "INTEGER NOT NULL DEFAULT 0"),
            ("stubs", "ident", "BLOB"),
            ("anchors", "ident", "BLOB"),
            ("done", "ctime_ns", "INTEGER"),
            ("done", "ident", "BLOB"),
        ] {
            let has: bool = conn
                .prepare(&format!(
                    "SELECT 1 FROM pragma_table_info('{table}') WHERE name=?1"
                ))
                .and_then(|mut st| st.exists([col]))
                .map_err(sql_err)?;
            if !has {
                conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {col} {decl}"))
                    .map_err(sql_err)?;
            }
        }
        // A brand-new database has nothing to recount: it starts cleanly stopped with a
        // zero counter. (Every open by the engine sets `clean` afterwards, so a missing
        // key means the database was created just now.)
        conn.execute_batch(
            "INSERT OR IGNORE INTO meta(key,value) SELECT 'clean','1' WHERE NOT EXISTS (SELECT 1 FROM stubs);
             INSERT OR IGNORE INTO meta(key,value) SELECT 'remaining','0' WHERE NOT EXISTS (SELECT 1 FROM stubs);",
        )
        .map_err(sql_err)?;
        let rows = select_rows(&conn)?
            .into_iter()
            .map(|r| (r.ino, r))
            .collect();
        let mut wal = path.as_os_str().to_owned();
        wal.push("-wal");
        Ok(Self::with(conn, Some(rows), Some(PathBuf::from(wal))))
    }

    /// Opens an existing database read-only (status without the engine; never creates or
    /// changes anything, readers do not block the engine in WAL mode).
    pub fn open_read_only(path: &Path) -> std::io::Result<Self> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(sql_err)?;
        conn.busy_timeout(std::time::Duration::from_secs(2))
            .map_err(sql_err)?;
        Ok(Self::with(conn, None, None))
    }

    fn with(conn: Connection, rows: Option<HashMap<u64, StubRow>>, wal: Option<PathBuf>) -> Self {
        Self {
            inner: Mutex::new(Inner { conn, rows }),
            wal,
            committed: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            sync_lock: Mutex::new(()),
            queue: Mutex::new(Queue::default()),
            barrier: Mutex::new(None),
            deferred_completed: AtomicU64::new(0),
        }
    }

    /// Orders this database's syncs after the store's fetched data (see `sync`).
    pub fn set_barrier(&self, barrier: Arc<FetchBarrier>) {
        *self.barrier.lock().unwrap_or_else(|e| e.into_inner()) = Some(barrier);
    }

    /// Commits not yet known durable (a caller syncs once enough have gathered: the
    /// database does not checkpoint by itself, see `sync`) — or `u64::MAX` once the WAL
    /// has grown past [`SYNC_WAL_BYTES`]: a sync (which checkpoints it) is due now, however
    /// few commits that took, so the state directory stays small.
    pub fn unsynced(&self) -> u64 {
        let n = self
            .committed
            .load(Ordering::Acquire)
            .saturating_sub(self.synced.load(Ordering::Acquire));
        if n >= WAL_SIZE_CHECK_AFTER && self.wal_len() > SYNC_WAL_BYTES {
            return u64::MAX;
        }
        n
    }

    /// Back-pressure for the crawl's writers (completions, dummy → partial): past
    /// [`HOLD_WAL_BYTES`] of WAL, waits for the sync under way (or makes one), which
    /// checkpoints the WAL, so the WAL never grows without bound while a slow sync runs.
    /// Call with no lock held that a fetch's write or a sync takes.
    pub fn hold_for_wal(&self) -> std::io::Result<()> {
        if self.wal_len() > HOLD_WAL_BYTES {
            self.sync()?;
        }
        Ok(())
    }

    /// Whether a sync is due because of the WAL's size alone (see [`SYNC_WAL_BYTES`]).
    pub fn wal_sync_due(&self) -> bool {
        self.wal_len() > SYNC_WAL_BYTES
    }

    /// The WAL file's size now (0: none, or the read-only handle).
    fn wal_len(&self) -> u64 {
        self.wal
            .as_ref()
            .and_then(|w| std::fs::metadata(w).ok())
            .map_or(0, |m| m.len())
    }

    /// The state directory (the database's), for error messages.
    fn dir(&self) -> Option<&Path> {
        self.wal.as_deref().and_then(Path::parent)
    }

    /// Makes every change committed before this call durable against power loss: one
    /// fsync of the WAL, shared by all callers whose commits it covers (group commit).
    /// A no-op when nothing was committed since the last sync.
    ///
    /// Completions deferred while an earlier sync was under way are committed first, so
    /// this one covers them; those deferred during this one are committed after it (see
    /// [`MigrationDb::complete_unless_syncing`]).
    pub fn sync(&self) -> std::io::Result<()> {
        if self.wal.is_none() {
            return Ok(());
        }
        self.flush_deferred()?;
        self.sync_covered()?;
        self.flush_deferred()
    }

    /// [`MigrationDb::sync`] without committing deferred completions.
    fn sync_covered(&self) -> std::io::Result<()> {
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        let want = self.committed.load(Ordering::Acquire);
        if self.synced.load(Ordering::Acquire) >= want {
            return Ok(());
        }
        let _one = self.sync_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.synced.load(Ordering::Acquire) >= want {
            return Ok(()); // the fsync we queued behind covered our commits
        }
        let upto = self.committed.load(Ordering::Acquire);
        // Completion rows vouch for fetched bytes and for the store's rows of them: those
        // are made durable first, and no fetch writes until this WAL is (power loss).
        let barrier = self
            .barrier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match barrier {
            Some(b) => b.sync_then(|| self.sync_wal(wal))?,
            None => self.sync_wal(wal)?,
        }
        self.synced.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }

    /// [`MigrationDb::sync`] unless a sync is already under way (then its caller returns
    /// at once: the running one covers most commits, and the next trigger the rest). For
    /// periodic group commits, which bound the WAL and what a power loss can take back;
    /// a caller that needs its own commits durable uses `sync`. Past [`HOLD_WAL_BYTES`] of
    /// WAL the caller waits for the running sync instead (and syncs again if that one
    /// did not cover its commits): small files complete faster than a sync's `syncfs`
    /// under load, and the WAL grew by tens of MB meanwhile (audit s11).
    pub fn sync_unless_busy(&self) -> std::io::Result<()> {
        match self.sync_lock.try_lock() {
            Ok(g) => {
                drop(g);
                self.sync()
            }
            Err(_) if self.wal_len() > HOLD_WAL_BYTES => self.sync(),
            Err(_) => Ok(()),
        }
    }

    /// One fsync of the WAL; a WAL grown past [`CHECKPOINT_WAL_BYTES`] is checkpointed
    /// into the main file then (the database never checkpoints by itself: a checkpoint
    /// makes rows durable, and must come after the fetched data, see `sync`).
    fn sync_wal(&self, wal: &Path) -> std::io::Result<()> {
        // A second descriptor on the WAL is safe to close: SQLite keeps its POSIX locks on
        // the database and `-shm` files, never on the WAL, so closing ours drops none.
        let len = match std::fs::File::open(wal) {
            Ok(f) => {
                f.sync_data()?;
                f.metadata()?.len()
            }
            // No WAL: everything was checkpointed into the main file, which SQLite syncs
            // at every checkpoint.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        if len > CHECKPOINT_WAL_BYTES {
            // The next commit starts the WAL over from its beginning (and cuts the file
            // back to `WAL_KEPT_BYTES`) once every frame is in the main file.
            self.lock()
                .conn
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get::<_, i64>(0))
                .map_err(|e| sql_err_in(self.dir(), e))?;
        }
        Ok(())
    }

    /// Counts a commit for [`MigrationDb::sync`].
    fn committed(&self) {
        self.committed.fetch_add(1, Ordering::AcqRel);
    }

    /// Bytes this handle appended to its WAL so far (see `crate::db::wal_bytes_written`).
    #[cfg(test)]
    pub(crate) fn wal_bytes_written(&self) -> u64 {
        crate::db::wal_bytes_written(&self.lock().conn)
    }

    /// Commits made so far, and how many of them are known durable.
    #[cfg(test)]
    pub(crate) fn commit_marks(&self) -> (u64, u64) {
        (
            self.committed.load(Ordering::Acquire),
            self.synced.load(Ordering::Acquire),
        )
    }

    /// Progress figures. `missing_of(ino)` gives the byte ranges the store still misses
    /// of a partial file; without it (no store at hand) a partial file counts as wholly
    /// missing. Dummy files have nothing fetched yet. Every figure is clamped to the
    /// file's `minsize` (bytes past it are never fetched).
    pub fn progress(
        &self,
        missing_of: Option<&dyn Fn(u64) -> Vec<(u64, u64)>>,
    ) -> std::io::Result<Progress> {
        let mut out = Progress::default();
        let stubs: Vec<(u64, StubKind, u64)> = {
            let c = self.lock();
            let (n, sum): (i64, Option<i64>) = c
                .conn
                .query_row("SELECT COUNT(*), SUM(size) FROM done", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(sql_err)?;
            out.files_done = n as u64;
            out.bytes_done = sum.unwrap_or(0) as u64;
            let mut st = c
                .conn
                .prepare("SELECT ino, kind, minsize FROM stubs")
                .map_err(sql_err)?;
            st.query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    StubKind::from_code(r.get(1)?),
                    r.get::<_, i64>(2)? as u64,
                ))
            })
            .map_err(sql_err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql_err)?
        };
        // The store is asked with the connection released (it may be slow, and the
        // engine must not wait for a status query).
        out.bytes_known = out.bytes_done;
        for (ino, kind, minsize) in stubs {
            out.remaining += 1;
            if kind == StubKind::DummyDir {
                out.dirs_pending += 1;
                continue;
            }
            out.file_stubs += 1;
            out.bytes_known += minsize;
            let missing = match missing_of {
                Some(f) if kind == StubKind::PartialFile => f(ino)
                    .iter()
                    .map(|&(a, b)| b.min(minsize).saturating_sub(a.min(minsize)))
                    .sum(),
                _ => minsize,
            };
            out.missing_bytes += missing;
            out.bytes_done += minsize.saturating_sub(missing);
        }
        out.skipped = self.skipped()?;
        Ok(out)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` in one transaction and counts the commit; `f`'s result is returned only
    /// once committed (callers update the mirror after that).
    fn write<T>(
        &self,
        inner: &mut Inner,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let full = |e| sql_err_in(self.dir(), e);
        let tx = inner.conn.transaction().map_err(full)?;
        let v = f(&tx)?;
        tx.commit().map_err(full)?;
        self.committed();
        Ok(v)
    }

    pub fn meta(&self, key: &str) -> std::io::Result<Option<String>> {
        self.lock()
            .conn
            .prepare_cached("SELECT value FROM meta WHERE key=?1")
            .and_then(|mut st| st.query_row([key], |r| r.get(0)).optional())
            .map_err(sql_err)
    }

    pub fn set_meta(&self, key: &str, value: &str) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.prepare_cached("INSERT OR REPLACE INTO meta(key,value) VALUES(?1,?2)")
                .and_then(|mut st| st.execute(params![key, value]))
                .map_err(sql_err)
        })?;
        Ok(())
    }

    /// The persisted remaining-stub counter.
    pub fn remaining(&self) -> std::io::Result<u64> {
        Ok(self
            .meta("remaining")?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// Recomputes the counter from the rows (after an unclean stop) and stores it.
    pub fn recount(&self) -> std::io::Result<u64> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            let n: i64 = tx
                .query_row("SELECT COUNT(*) FROM stubs", [], |r| r.get(0))
                .map_err(sql_err)?;
            tx.execute(
                "INSERT OR REPLACE INTO meta(key,value) VALUES('remaining',?1)",
                [n.to_string()],
            )
            .map_err(sql_err)?;
            Ok(n as u64)
        })
    }

    /// Inserts stub rows and hard-link anchors (source inode, store inode) and adds the
    /// rows to the counter, in one transaction.
    pub fn insert(&self, rows: &[StubRow], anchors: &[(u64, u64)]) -> std::io::Result<()> {
        self.insert_with_listing(rows, anchors, None)
    }

    /// [`Self::insert`], plus (in the same transaction) the names a listing of source
    /// directory `listing.0` returned, so `finish` can tell what changed there since.
    pub fn insert_with_listing(
        &self,
        rows: &[StubRow],
        anchors: &[(u64, u64)],
        listing: Option<(&SourcePath, &[&[u8]])>,
    ) -> std::io::Result<()> {
        if rows.is_empty() && anchors.is_empty() && listing.is_none() {
            return Ok(());
        }
        let mut g = self.lock();
        let inner = &mut *g;
        let mut fresh: Vec<&StubRow> = Vec::new();
        let mut reused = Vec::new();
        for r in rows {
            match existing(inner, r.ino)? {
                // Listed again after a crash: the row is already there.
                Some(p) if p == r.src_path => {}
                // A stale row of a dead object whose inode number the store reused.
                Some(_) => reused.push(r),
                None if fresh.iter().any(|f| f.ino == r.ino) => {}
                None => fresh.push(r),
            }
        }
        self.write(inner, |tx| {
            let mut put = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO stubs(ino,kind,src_path,src_ino,minsize,listed_size,listed_mtime,ident) VALUES(?1,?2,?3,?4,?5,?6,?7,?8)",
                )
                .map_err(sql_err)?;
            for r in fresh.iter().chain(reused.iter()) {
                put.execute(params![
                    r.ino as i64,
                    r.kind.code(),
                    r.src_path.as_bytes(),
                    r.src_ino as i64,
                    r.minsize as i64,
                    r.listed_size as i64,
                    r.listed_mtime_ns,
                    r.ident
                ])
                .map_err(sql_err)?;
            }
            for r in &reused {
                tx.execute("DELETE FROM done WHERE ino=?1", [r.ino as i64])
                    .map_err(sql_err)?;
            }
            // With the identity of the row stored above for the same file.
            let mut anchor = tx
                .prepare_cached(
                    "INSERT OR REPLACE INTO anchors(src_ino,ino,ident) VALUES(?1,?2,(SELECT ident FROM stubs WHERE ino=?2))",
                )
                .map_err(sql_err)?;
            for (src_ino, ino) in anchors {
                anchor
                    .execute(params![*src_ino as i64, *ino as i64])
                    .map_err(sql_err)?;
            }
            if let Some((dir, names)) = listing {
                tx.prepare_cached("INSERT OR REPLACE INTO listed(src_path,names) VALUES(?1,?2)")
                    .and_then(|mut st| st.execute(params![dir.as_bytes(), names.join(&0u8)]))
                    .map_err(sql_err)?;
            }
            bump(tx, fresh.len() as i64)
        })?;
        if let Some(m) = inner.rows.as_mut() {
            for r in fresh.into_iter().chain(reused) {
                m.insert(r.ino, r.clone());
            }
        }
        Ok(())
    }

    pub fn get(&self, ino: u64) -> std::io::Result<Option<StubRow>> {
        let g = self.lock();
        if let Some(m) = &g.rows {
            return Ok(m.get(&ino).cloned());
        }
        g.conn
            .query_row(
                "SELECT ino,kind,src_path,src_ino,minsize,listed_size,listed_mtime,ident FROM stubs WHERE ino=?1",
                [ino as i64],
                row,
            )
            .optional()
            .map_err(sql_err)
    }

    /// Dummy → partial (a group transaction, see [`MigrationDb::grouped`]).
    pub fn set_kind(&self, ino: u64, kind: StubKind) -> std::io::Result<()> {
        self.grouped(Queued::Kind(ino, kind)).map(|_| ())
    }

    pub fn lower_minsize(&self, ino: u64, size: u64) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute(
                "UPDATE stubs SET minsize=MIN(minsize,?2) WHERE ino=?1",
                params![ino as i64, size as i64],
            )
            .map_err(sql_err)
        })?;
        if let Some(r) = g.rows.as_mut().and_then(|m| m.get_mut(&ino)) {
            r.minsize = r.minsize.min(size);
        }
        Ok(())
    }

    /// The object is normal now (or gone): drop its row and decrement the counter.
    pub fn remove(&self, ino: u64) -> std::io::Result<bool> {
        self.remove_where(ino, None, None)
    }

    /// A file's copy is complete: in one transaction its row goes (if it is still the one
    /// for `src`), the counter drops and, with `done` = (size, mtime_ns, ctime_ns), it is
    /// recorded for `finish` with the row's backing identity. True if the row went.
    pub fn complete(
        &self,
        ino: u64,
        src: &SourcePath,
        done: Option<(u64, i64, Option<i64>)>,
    ) -> std::io::Result<bool> {
        self.remove_where(ino, Some(src), done)
    }

    fn remove_where(
        &self,
        ino: u64,
        src: Option<&SourcePath>,
        done: Option<(u64, i64, Option<i64>)>,
    ) -> std::io::Result<bool> {
        self.grouped(Queued::Remove {
            ino,
            src: src.cloned(),
            done,
        })
    }

    /// [`MigrationDb::complete`] for a crawl's completions, which must not wait for a
    /// sync: while one is under way (its `syncfs` takes seconds on a loaded disk, and
    /// past [`HOLD_WAL_BYTES`] every writer would wait for it), the completion is
    /// *deferred* instead: queued, not committed, and `None` is returned at once. Its
    /// row stays (in the database and in the mirror) until the group transaction after
    /// that sync commits every completion deferred during it ([`MigrationDb::sync`]
    /// does at its end; [`MigrationDb::flush_deferred`] or any other group change
    /// once no sync runs). A deferred completion is the state a file is in between its
    /// last fetched byte and its completion, only longer: a kill loses it, and the
    /// crawl completes the file again (the store holds all its data); nothing returned
    /// to a caller depends on it. So the WAL grows during a sync by the crawl's
    /// dummy → partial changes only, and the deferred completions share pages in one
    /// transaction. Otherwise (no sync under way): [`MigrationDb::hold_for_wal`], then
    /// [`MigrationDb::complete`], whose result is returned.
    pub fn complete_unless_syncing(
        &self,
        ino: u64,
        src: &SourcePath,
        done: Option<(u64, i64, Option<i64>)>,
    ) -> std::io::Result<Option<bool>> {
        if self.wal.is_some() && self.sync_under_way() {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let t = q.next;
            q.next += 1;
            q.deferred.insert(t);
            q.ops.push((
                t,
                Queued::Remove {
                    ino,
                    src: Some(src.clone()),
                    done,
                },
            ));
            return Ok(None);
        }
        self.hold_for_wal()?;
        self.complete(ino, src, done).map(Some)
    }

    /// Commits the deferred completions (see [`MigrationDb::complete_unless_syncing`])
    /// in one transaction, unless a sync is under way (it commits them at its end).
    pub fn flush_deferred(&self) -> std::io::Result<()> {
        if self.deferred() == 0 || self.sync_under_way() {
            return Ok(());
        }
        self.group(None, false).map(|_| ())
    }

    /// [`MigrationDb::flush_deferred`], also while a sync is under way: for a caller
    /// about to read the rows (a reconcile would otherwise drop a completed file's row
    /// without its completion record) or to mark a clean stop. The WAL may pass
    /// [`HOLD_WAL_BYTES`] by this one transaction.
    pub fn commit_deferred(&self) -> std::io::Result<()> {
        if self.deferred() == 0 {
            return Ok(());
        }
        self.group(None, true).map(|_| ())
    }

    /// Deferred completions not committed yet.
    pub fn deferred(&self) -> usize {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .deferred
            .len()
    }

    /// Deferred completions whose row went since the last call (for the engine's count
    /// of completed files).
    pub fn take_deferred_completed(&self) -> u64 {
        self.deferred_completed.swap(0, Ordering::AcqRel)
    }

    /// Whether a sync holds `sync_lock` now.
    fn sync_under_way(&self) -> bool {
        matches!(
            self.sync_lock.try_lock(),
            Err(std::sync::TryLockError::WouldBlock)
        )
    }

    /// Group commit of the per-file row changes of concurrent callers (crawler threads
    /// completing files): each queues its change, and whoever gets the connection next
    /// commits every change queued so far in one transaction and hands the others their
    /// results. Each change is committed before its call returns, as with one
    /// transaction per change, but the pages they share (the counter's, the last page of
    /// `done`, neighbouring stub rows) go to the WAL once per group instead of once per
    /// file.
    ///
    /// Deferred completions (see [`MigrationDb::complete_unless_syncing`]) join the
    /// group too, unless a sync is under way: then they stay queued.
    fn grouped(&self, op: Queued) -> std::io::Result<bool> {
        self.group(Some(op), false)
    }

    /// [`MigrationDb::grouped`]; `None`: commits what is queued (the deferred
    /// completions), returning whether anything was. `all`: the deferred completions
    /// join even while a sync is under way.
    fn group(&self, op: Option<Queued>, all: bool) -> std::io::Result<bool> {
        let queue = || self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let ticket = op.map(|op| {
            let mut q = queue();
            let t = q.next;
            q.next += 1;
            q.ops.push((t, op));
            t
        });
        let mut g = self.lock();
        let ops = {
            let mut q = queue();
            // A caller that had the connection before committed ours (it hands the
            // results out before it lets the connection go).
            if let Some(r) = ticket.and_then(|t| q.results.remove(&t)) {
                return r.map_err(|(kind, msg)| std::io::Error::new(kind, msg));
            }
            if !all && !q.deferred.is_empty() && self.sync_under_way() {
                let (keep, take): (Vec<_>, Vec<_>) = std::mem::take(&mut q.ops)
                    .into_iter()
                    .partition(|(t, _)| q.deferred.contains(t));
                q.ops = keep;
                take
            } else {
                std::mem::take(&mut q.ops)
            }
        };
        if ops.is_empty() {
            return Ok(false);
        }
        let inner = &mut *g;
        // Which removals apply: the row is still the one for their source path, and no
        // earlier change of this group removed it. (Every queued change gets a result,
        // an error included: its caller waits for it.)
        let mut gone = std::collections::HashSet::new();
        let mut applies = Vec::with_capacity(ops.len());
        let mut r = Ok(());
        for (_, op) in &ops {
            applies.push(match op {
                Queued::Kind(..) => true,
                Queued::Remove { ino, src, .. } => {
                    // Completed or given up by someone else already, or a new object
                    // that got the inode number of a deleted one: nothing to record.
                    let row = if gone.contains(ino) {
                        None
                    } else {
                        existing(inner, *ino).unwrap_or_else(|e| {
                            r = Err(e);
                            None
                        })
                    };
                    let ours = row.is_some_and(|p| src.as_ref().is_none_or(|s| *s == p));
                    if ours {
                        gone.insert(*ino);
                    }
                    ours
                }
            });
        }
        let removed = gone.len() as i64;
        let r = if r.is_err() {
            r
        } else if applies.iter().any(|a| *a) {
            self.write(inner, |tx| {
                for ((_, op), ours) in ops.iter().zip(&applies) {
                    match op {
                        Queued::Kind(ino, kind) => {
                            tx.prepare_cached("UPDATE stubs SET kind=?2 WHERE ino=?1")
                                .and_then(|mut st| st.execute(params![*ino as i64, kind.code()]))
                                .map_err(sql_err)?;
                        }
                        Queued::Remove { ino, src, done } if *ours => {
                            if let (Some((size, mtime_ns, ctime_ns)), Some(src)) = (done, src) {
                                // The stub row's identity goes with it (deleted below).
                                tx.prepare_cached(
                                    "INSERT OR REPLACE INTO done(ino,src_path,size,mtime_ns,ctime_ns,ident) VALUES(?1,?2,?3,?4,?5,(SELECT ident FROM stubs WHERE ino=?1))",
                                )
                                .and_then(|mut st| {
                                    st.execute(params![
                                        *ino as i64,
                                        src.as_bytes(),
                                        *size as i64,
                                        mtime_ns,
                                        ctime_ns
                                    ])
                                })
                                .map_err(sql_err)?;
                            }
                            tx.prepare_cached("DELETE FROM stubs WHERE ino=?1")
                                .and_then(|mut st| st.execute([*ino as i64]))
                                .map_err(sql_err)?;
                        }
                        Queued::Remove { .. } => {}
                    }
                }
                bump(tx, -removed)
            })
        } else {
            Ok(())
        };
        if r.is_ok()
            && let Some(m) = inner.rows.as_mut()
        {
            for ((_, op), ours) in ops.iter().zip(&applies) {
                match op {
                    Queued::Kind(ino, kind) => {
                        if let Some(row) = m.get_mut(ino) {
                            row.kind = *kind;
                        }
                    }
                    Queued::Remove { ino, .. } if *ours => {
                        m.remove(ino);
                    }
                    Queued::Remove { .. } => {}
                }
            }
        }
        let result = |ours: bool| match &r {
            Ok(()) => Ok(ours),
            Err(e) => Err((e.kind(), e.to_string())),
        };
        // Ours is among them (queued before we had the connection, and not taken by
        // another caller, who would have left its result).
        let mut mine = match ticket {
            Some(_) => Err((
                std::io::ErrorKind::Other,
                "migration database: change lost from its group".to_string(),
            )),
            None => Ok(true),
        };
        let mut q = queue();
        for ((t, _), ours) in ops.iter().zip(&applies) {
            if Some(*t) == ticket {
                mine = result(*ours);
            } else if q.deferred.remove(t) {
                // Nobody waits for it: counted, or (failed) left to the crawl, which
                // completes the file again (its row stays).
                match &r {
                    Ok(()) if *ours => {
                        self.deferred_completed.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(()) => {}
                    Err(e) => tracing::warn!("a deferred completion was not committed: {e}"),
                }
            } else {
                q.results.insert(*t, result(*ours));
            }
        }
        drop(q);
        drop(g);
        mine.map_err(|(kind, msg)| std::io::Error::new(kind, msg))
    }

    /// A client deleted the object that was copied from `src`: its row (counter drops),
    /// its completion record and any hard-link anchor pointing at it go, so a later
    /// object that gets the same inode number inherits nothing. Rows of another source
    /// path are left alone: a new object may have got the inode number already.
    ///
    /// A file (a file stub's row or a completion record went) is counted, in the same
    /// transaction, in [`MigrationDb::deleted_by_clients`]: once its rows are gone
    /// nothing else remembers it, whatever its copy state was.
    pub fn forget_object(&self, ino: u64, src: &SourcePath) -> std::io::Result<bool> {
        let mut g = self.lock();
        let inner = &mut *g;
        let n = self.write(inner, |tx| {
            let file_stub: bool = tx
                .prepare_cached("SELECT 1 FROM stubs WHERE ino=?1 AND src_path=?2 AND kind<>?3")
                .and_then(|mut st| {
                    st.exists(params![
                        ino as i64,
                        src.as_bytes(),
                        StubKind::DummyDir.code()
                    ])
                })
                .map_err(sql_err)?;
            let n = tx
                .execute(
                    "DELETE FROM stubs WHERE ino=?1 AND src_path=?2",
                    params![ino as i64, src.as_bytes()],
                )
                .map_err(sql_err)? as i64;
            let done = tx
                .execute(
                    "DELETE FROM done WHERE ino=?1 AND src_path=?2",
                    params![ino as i64, src.as_bytes()],
                )
                .map_err(sql_err)?;
            if file_stub || done > 0 {
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO meta(key,value) VALUES(?1, COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key=?1), 0) + 1)",
                )
                .and_then(|mut st| st.execute([DELETED_BY_CLIENTS]))
                .map_err(sql_err)?;
            }
            let other: bool = tx
                .prepare("SELECT 1 FROM stubs WHERE ino=?1")
                .and_then(|mut st| st.exists([ino as i64]))
                .map_err(sql_err)?;
            if !other {
                tx.execute("DELETE FROM anchors WHERE ino=?1", [ino as i64])
                    .map_err(sql_err)?;
            }
            bump(tx, -n)?;
            Ok(n)
        })?;
        if n > 0
            && let Some(m) = inner.rows.as_mut()
        {
            m.remove(&ino);
        }
        Ok(n > 0)
    }

    /// Files clients deleted during the migration, whatever their copy state then
    /// (counted by [`MigrationDb::forget_object`]).
    pub fn deleted_by_clients(&self) -> std::io::Result<u64> {
        Ok(self
            .meta(DELETED_BY_CLIENTS)?
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    /// The source path `ino` was copied from, if its copy completed.
    pub fn done_path(&self, ino: u64) -> std::io::Result<Option<SourcePath>> {
        let p: Option<Vec<u8>> = self
            .lock()
            .conn
            .prepare_cached("SELECT src_path FROM done WHERE ino=?1")
            .and_then(|mut st| st.query_row([ino as i64], |r| r.get(0)).optional())
            .map_err(sql_err)?;
        Ok(p.map(|p| SourcePath::parse(&p).unwrap_or_default()))
    }

    /// Remembers a file that became normal, with its destination size and mtime at that
    /// moment, so `finish` can tell client-modified files from ones to verify.
    pub fn record_done(
        &self,
        ino: u64,
        src: &SourcePath,
        size: u64,
        mtime_ns: i64,
    ) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute(
                "INSERT OR REPLACE INTO done(ino,src_path,size,mtime_ns) VALUES(?1,?2,?3,?4)",
                params![ino as i64, src.as_bytes(), size as i64, mtime_ns],
            )
            .map_err(sql_err)
        })?;
        Ok(())
    }

    /// The completion record of `ino`, if its copy completed.
    pub fn done_row(&self, ino: u64) -> std::io::Result<Option<DoneRow>> {
        self.lock()
            .conn
            .prepare_cached(
                "SELECT ino,src_path,size,mtime_ns,ctime_ns,ident FROM done WHERE ino=?1",
            )
            .and_then(|mut st| st.query_row([ino as i64], done_row).optional())
            .map_err(sql_err)
    }

    /// Every completion record, by inode.
    pub fn done(&self) -> std::io::Result<Vec<DoneRow>> {
        let g = self.lock();
        let mut st = g
            .conn
            .prepare("SELECT ino,src_path,size,mtime_ns,ctime_ns,ident FROM done ORDER BY ino")
            .map_err(sql_err)?;
        let rows = st
            .query_map([], done_row)
            .map_err(sql_err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql_err)?;
        Ok(rows)
    }

    /// Every source directory listed so far, with the names its listing returned.
    pub fn listings(&self) -> std::io::Result<Vec<(SourcePath, Vec<Vec<u8>>)>> {
        self.listings_after(None, u32::MAX)
    }

    /// Up to `limit` listed directories whose path sorts after `after` (from the first
    /// when None), in path order: a share's listings hold every name it listed, too many
    /// to load at once on a large share.
    pub fn listings_after(
        &self,
        after: Option<&SourcePath>,
        limit: u32,
    ) -> std::io::Result<Vec<(SourcePath, Vec<Vec<u8>>)>> {
        let g = self.lock();
        let mut st = g
            .conn
            .prepare_cached(
                "SELECT src_path,names FROM listed WHERE ?1 IS NULL OR src_path > ?1 \
                 ORDER BY src_path LIMIT ?2",
            )
            .map_err(sql_err)?;
        let rows = st
            .query_map(params![after.map(SourcePath::as_bytes), limit], |r| {
                let p: Vec<u8> = r.get(0)?;
                let names: Vec<u8> = r.get(1)?;
                Ok((
                    SourcePath::parse(&p).unwrap_or_default(),
                    names
                        .split(|&b| b == 0)
                        .filter(|n| !n.is_empty())
                        .map(<[u8]>::to_vec)
                        .collect(),
                ))
            })
            .map_err(sql_err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql_err)?;
        Ok(rows)
    }

    /// The inodes of every directory row (not listed yet, or listed with its own
    /// metadata still to copy): from the mirror, without copying the other rows.
    pub fn dummy_dirs(&self) -> std::io::Result<Vec<u64>> {
        let g = self.lock();
        if let Some(m) = &g.rows {
            return Ok(m
                .values()
                .filter(|r| r.kind == StubKind::DummyDir)
                .map(|r| r.ino)
                .collect());
        }
        Ok(select_rows(&g.conn)?
            .into_iter()
            .filter(|r| r.kind == StubKind::DummyDir)
            .map(|r| r.ino)
            .collect())
    }

    /// Every stub row, by inode (for reconciliation and the final sweep).
    pub fn all(&self) -> std::io::Result<Vec<StubRow>> {
        let g = self.lock();
        if let Some(m) = &g.rows {
            let mut v: Vec<StubRow> = m.values().cloned().collect();
            v.sort_by_key(|r| r.ino);
            return Ok(v);
        }
        select_rows(&g.conn)
    }

    /// The store inode anchoring source inode `src_ino`'s link group, with the backing
    /// identity of its file (if known).
    pub fn anchor(&self, src_ino: u64) -> std::io::Result<Option<(u64, Option<Vec<u8>>)>> {
        self.lock()
            .conn
            .prepare_cached("SELECT ino, ident FROM anchors WHERE src_ino=?1")
            .and_then(|mut st| {
                st.query_row([src_ino as i64], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
                })
                .optional()
            })
            .map_err(sql_err)
    }

    /// Drops the anchor of `src_ino` if it still names `ino` (whose file is gone).
    pub fn drop_anchor(&self, src_ino: u64, ino: u64) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute(
                "DELETE FROM anchors WHERE src_ino=?1 AND ino=?2",
                params![src_ino as i64, ino as i64],
            )
            .map_err(sql_err)
        })?;
        Ok(())
    }

    pub fn set_anchor(&self, src_ino: u64, ino: u64) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute(
                "INSERT OR REPLACE INTO anchors(src_ino,ino) VALUES(?1,?2)",
                params![src_ino as i64, ino as i64],
            )
            .map_err(sql_err)
        })?;
        Ok(())
    }

    pub fn clear_anchors(&self) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute("DELETE FROM anchors", []).map_err(sql_err)
        })?;
        Ok(())
    }

    pub fn skip(
        &self,
        path: &SourcePath,
        kind: SourceErrorKind,
        reason: &str,
    ) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute(
                "INSERT OR REPLACE INTO skipped(src_path,kind,reason) VALUES(?1,?2,?3)",
                params![path.as_bytes(), format!("{kind:?}"), reason],
            )
            .map_err(sql_err)
        })?;
        Ok(())
    }

    /// Records a notice in the skip report (kind [`super::engine::NOTICE_KIND`]): an
    /// entry migrated differently from the source (e.g. its owner), not left out.
    pub fn notice(&self, path: &SourcePath, reason: &str) -> std::io::Result<()> {
        let mut g = self.lock();
        self.write(&mut g, |tx| {
            tx.execute(
                "INSERT OR REPLACE INTO skipped(src_path,kind,reason) VALUES(?1,?2,?3)",
                params![path.as_bytes(), super::engine::NOTICE_KIND, reason],
            )
            .map_err(sql_err)
        })?;
        Ok(())
    }

    pub fn skipped(&self) -> std::io::Result<Vec<Skipped>> {
        let g = self.lock();
        let mut st = g
            .conn
            .prepare("SELECT src_path,kind,reason FROM skipped ORDER BY src_path")
            .map_err(sql_err)?;
        let rows = st
            .query_map([], |r| {
                let p: Vec<u8> = r.get(0)?;
                Ok(Skipped {
                    src_path: SourcePath::parse(&p).unwrap_or_default(),
                    kind: r.get(1)?,
                    reason: r.get(2)?,
                })
            })
            .map_err(sql_err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(sql_err)?;
        Ok(rows)
    }
}

/// The source path of `ino`'s row, if it has one (from the mirror when there is one).
fn existing(inner: &Inner, ino: u64) -> std::io::Result<Option<SourcePath>> {
    if let Some(m) = &inner.rows {
        return Ok(m.get(&ino).map(|r| r.src_path.clone()));
    }
    let p: Option<Vec<u8>> = inner
        .conn
        .query_row(
            "SELECT src_path FROM stubs WHERE ino=?1",
            [ino as i64],
            |x| x.get(0),
        )
        .optional()
        .map_err(sql_err)?;
    Ok(p.map(|p| SourcePath::parse(&p).unwrap_or_default()))
}

fn select_rows(conn: &Connection) -> std::io::Result<Vec<StubRow>> {
    let mut st = conn
        .prepare("SELECT ino,kind,src_path,src_ino,minsize,listed_size,listed_mtime,ident FROM stubs ORDER BY ino")
        .map_err(sql_err)?;
    let rows = st
        .query_map([], row)
        .map_err(sql_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(sql_err)?;
    Ok(rows)
}

fn bump(tx: &rusqlite::Transaction<'_>, delta: i64) -> std::io::Result<()> {
    if delta == 0 {
        return Ok(());
    }
    // An update in place rewrites one page; `INSERT OR REPLACE` deleted and reinserted
    // the row, rewriting the key's index page as well (a WAL frame each, every file).
    let n = tx
        .prepare_cached(
            "UPDATE meta SET value=MAX(0, CAST(value AS INTEGER) + ?1) WHERE key='remaining'",
        )
        .and_then(|mut st| st.execute([delta]))
        .map_err(sql_err)?;
    if n == 0 {
        tx.prepare_cached("INSERT INTO meta(key,value) VALUES('remaining', MAX(0, ?1))")
            .and_then(|mut st| st.execute([delta]))
            .map_err(sql_err)?;
    }
    Ok(())
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StubRow> {
    let p: Vec<u8> = r.get(2)?;
    Ok(StubRow {
        ino: r.get::<_, i64>(0)? as u64,
        kind: StubKind::from_code(r.get(1)?),
        src_path: SourcePath::parse(&p).unwrap_or_default(),
        src_ino: r.get::<_, i64>(3)? as u64,
        minsize: r.get::<_, i64>(4)? as u64,
        listed_size: r.get::<_, i64>(5)? as u64,
        listed_mtime_ns: r.get(6)?,
        ident: r.get(7)?,
    })
}

fn done_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DoneRow> {
    let p: Vec<u8> = r.get(1)?;
    Ok(DoneRow {
        ino: r.get::<_, i64>(0)? as u64,
        src_path: SourcePath::parse(&p).unwrap_or_default(),
        size: r.get::<_, i64>(2)? as u64,
        mtime_ns: r.get(3)?,
        ctime_ns: r.get(4)?,
        ident: r.get(5)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One completion per small file, syncing as the engine does within 5 s of its last
    /// group commit (at 20,000 commits, or when `unsynced` says a sync is due): the WAL must stay
    /// near [`SYNC_WAL_BYTES`], where counting commits alone let it reach ~23 KiB per
    /// file (audit s11: 180 MB for 8,000 files, a 64 MiB state directory overflowed).
    #[test]
    fn the_wal_stays_small_with_many_small_completions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("migrate.db");
        let wal = dir.path().join("migrate.db-wal");
        let db = MigrationDb::open(&path).unwrap();
        let files = 12_000u64;
        let row = |ino: u64| StubRow {
            ino,
            kind: StubKind::DummyFile,
            src_path: SourcePath::parse(format!("d{}/file-{ino:05}", ino / 400).as_bytes())
                .unwrap(),
            src_ino: ino + 1_000_000,
            minsize: 100,
            listed_size: 100,
            listed_mtime_ns: 1_000_000_007,
            ident: None,
        };
        // Listed as the engine does, 256 rows a transaction.
        let rows: Vec<StubRow> = (1..=files).map(row).collect();
        for chunk in rows.chunks(256) {
            db.insert(chunk, &[]).unwrap();
        }
        db.sync().unwrap();
        let (mut peak, mut syncs) = (0u64, 0u32);
        for r in &rows {
            assert!(
                db.complete(r.ino, &r.src_path, Some((100, 1_000_000_007, Some(5))))
                    .unwrap()
            );
            if db.unsynced() >= 20_000 {
                db.sync().unwrap();
                syncs += 1;
            }
            peak = peak.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        let bound = SYNC_WAL_BYTES + (4 << 20);
        assert!(
            peak <= bound,
            "the WAL of {files} completions peaked at {peak} bytes ({syncs} syncs); \
             expected at most {bound} (a sync, which checkpoints it, is due past \
             {SYNC_WAL_BYTES})"
        );
        assert!(
            syncs >= 2,
            "{syncs} syncs: the test did not exercise the WAL bound"
        );
        eprintln!("WAL peak {peak} bytes for {files} completions, {syncs} syncs");
        // Grown past the size from which a sync checkpoints (below it, a sync only
        // fsyncs the WAL).
        let mut i = 0;
        while std::fs::metadata(&wal).map_or(0, |m| m.len()) <= CHECKPOINT_WAL_BYTES {
            db.set_meta(&format!("pad{i}"), "x").unwrap();
            i += 1;
        }
        db.sync().unwrap();
        // The next commit starts the WAL over.
        db.skip(&rows[0].src_path, SourceErrorKind::Changed, "test")
            .unwrap();
        let after = std::fs::metadata(&wal).map_or(0, |m| m.len());
        assert!(
            after <= WAL_KEPT_BYTES,
            "after a checkpoint and a commit the WAL file is {after} bytes; expected it cut \
             back to at most {WAL_KEPT_BYTES}"
        );
        assert_eq!(db.remaining().unwrap(), 0);
    }

    /// A crawl's completions made while a sync is under way are deferred, not held: with
    /// the WAL past [`HOLD_WAL_BYTES`] (where every writer used to wait for the sync's
    /// `syncfs`, 1.1 s of 1.5 s idle in a loaded NFS run, session 14) and the sync held,
    /// they return at once and add nothing to the WAL; the rows stay until the sync
    /// ends, then one transaction commits them at a fraction of the WAL bytes per file.
    #[test]
    fn completions_during_a_sync_are_deferred_not_held() {
        let dir = tempfile::tempdir().unwrap();
        let wal = dir.path().join("migrate.db-wal");
        let db = MigrationDb::open(&dir.path().join("migrate.db")).unwrap();
        let files = 1200u64;
        let rows: Vec<StubRow> = (1..=files)
            .map(|ino| StubRow {
                ino,
                kind: StubKind::PartialFile,
                src_path: SourcePath::parse(
                    format!("dir-{:03}/some-file-name-{ino:05}.dat", ino / 8).as_bytes(),
                )
                .unwrap(),
                src_ino: ino + 1_000_000,
                minsize: 100,
                listed_size: 100,
                listed_mtime_ns: 1_000_000_007,
                ident: Some(vec![7; 24]),
            })
            .collect();
        for chunk in rows.chunks(8) {
            db.insert(chunk, &[]).unwrap();
        }
        db.sync().unwrap();
        let done = Some((100, 1_000_000_007, Some(5)));
        // Reference: completions committed one by one (no sync under way).
        let (single, rest) = rows.split_at(200);
        let w0 = db.wal_bytes_written();
        for r in single {
            assert_eq!(
                db.complete_unless_syncing(r.ino, &r.src_path, done)
                    .unwrap(),
                Some(true),
                "no sync under way: committed at once"
            );
        }
        let per_single = (db.wal_bytes_written() - w0) / single.len() as u64;
        // The WAL past its bound, and a sync that does not end (its `syncfs` on a slow
        // disk): `hold_for_wal` would wait for it.
        let mut i = 0;
        while std::fs::metadata(&wal).map_or(0, |m| m.len()) <= HOLD_WAL_BYTES {
            db.set_meta(&format!("pad{i}"), &"x".repeat(64 << 10))
                .unwrap();
            i += 1;
        }
        let remaining = db.remaining().unwrap();
        let held = db.sync_lock.lock().unwrap();
        let w1 = db.wal_bytes_written();
        let gone = rest[0].ino;
        std::thread::scope(|scope| {
            let (tx, rx) = std::sync::mpsc::channel();
            let db = &db;
            scope.spawn(move || {
                for r in rest {
                    let _ = tx.send(db.complete_unless_syncing(r.ino, &r.src_path, done));
                }
            });
            let mut deferred = 0;
            for r in rest {
                match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                    Ok(Ok(None)) => deferred += 1,
                    other => {
                        drop(held);
                        panic!(
                            "completion of {} while a sync is under way: {other:?}; \
                             expected it deferred at once (None), not waiting for the sync",
                            r.ino
                        );
                    }
                }
            }
            assert_eq!(deferred, rest.len());
            // A client deletes one of them meanwhile: its deferred completion records
            // nothing.
            assert!(db.forget_object(gone, &rest[0].src_path).unwrap());
            // Not committed yet: the rows stay, in the database and in the mirror.
            assert_eq!(db.deferred(), rest.len());
            assert!(db.get(rest[1].ino).unwrap().is_some());
            assert_eq!(db.remaining().unwrap(), remaining - 1);
            // Nor while the sync is under way.
            db.flush_deferred().unwrap();
            assert_eq!(db.deferred(), rest.len());
            drop(held);
        });
        let w2 = db.wal_bytes_written();
        // Only the client's delete reached the WAL while the sync ran.
        assert!(
            w2 - w1 < 16 << 10,
            "{} WAL bytes while the sync was held; expected only the delete's",
            w2 - w1
        );
        // The sync over: one transaction commits them, sharing pages.
        db.flush_deferred().unwrap();
        assert_eq!(db.deferred(), 0);
        assert_eq!(db.take_deferred_completed(), rest.len() as u64 - 1);
        let per_deferred = (db.wal_bytes_written() - w2) / rest.len() as u64;
        assert_eq!(db.remaining().unwrap(), 0);
        assert!(db.done_row(gone).unwrap().is_none(), "deleted by a client");
        for r in &rest[1..] {
            assert!(db.get(r.ino).unwrap().is_none());
            let d = db.done_row(r.ino).unwrap().expect("completion record");
            assert_eq!((d.size, d.ctime_ns), (100, Some(5)));
            assert_eq!(d.ident.as_deref(), Some(&[7u8; 24][..]));
        }
        eprintln!("WAL bytes per completion: one by one {per_single}, deferred {per_deferred}");
        assert!(
            per_deferred * 4 <= per_single,
            "WAL bytes per deferred completion {per_deferred}, one by one {per_single}: \
             expected the group transaction to cost at most a quarter"
        );
        // A sync commits those deferred before it (so it covers them).
        let last = &rest[1];
        db.insert(std::slice::from_ref(last), &[]).unwrap();
        let held = db.sync_lock.lock().unwrap();
        assert_eq!(
            db.complete_unless_syncing(last.ino, &last.src_path, done)
                .unwrap(),
            None
        );
        drop(held);
        db.sync().unwrap();
        assert_eq!(db.deferred(), 0);
        let (committed, synced) = db.commit_marks();
        assert_eq!(committed, synced, "the sync covers the deferred completion");
        assert!(db.get(last.ino).unwrap().is_none());
    }

    #[test]
    fn a_full_state_directory_is_named() {
        let full = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            Some("database or disk is full".into()),
        );
        let e = sql_err_in(Some(Path::new("/var/lib/kaiso/state")), full);
        assert_eq!(e.kind(), std::io::ErrorKind::StorageFull);
        let text = e.to_string();
        assert!(
            text.contains("state directory /var/lib/kaiso/state full: No space left on device"),
            "{text}"
        );
        let other = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
            None,
        );
        assert_eq!(sql_err(other).kind(), std::io::ErrorKind::Other);
    }

    #[test]
    fn counter_follows_rows_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/migrate.db");
        let db = MigrationDb::open(&path).unwrap();
        let r = |ino, kind| StubRow {
            ino,
            kind,
            src_path: SourcePath::parse(b"a/\xff").unwrap(),
            src_ino: ino * 10,
            minsize: 5,
            listed_size: 5,
            listed_mtime_ns: 1_000_000_007,
            ident: None,
        };
        db.insert(
            &[
                r(1, StubKind::DummyDir),
                r(2, StubKind::DummyFile),
                r(2, StubKind::DummyFile),
            ],
            &[(88, 2)],
        )
        .unwrap();
        assert_eq!(db.anchor(88).unwrap(), Some((2, None)));
        assert_eq!(db.remaining().unwrap(), 2, "duplicate insert not counted");
        db.set_kind(2, StubKind::PartialFile).unwrap();
        db.lower_minsize(2, 3).unwrap();
        db.lower_minsize(2, 9).unwrap();
        let got = db.get(2).unwrap().unwrap();
        assert_eq!((got.listed_size, got.listed_mtime_ns), (5, 1_000_000_007));
        assert_eq!(
            (got.kind, got.minsize, got.src_path.as_bytes()),
            (StubKind::PartialFile, 3, &b"a/\xff"[..])
        );
        assert!(db.remove(1).unwrap());
        assert!(!db.remove(1).unwrap());
        assert_eq!(db.remaining().unwrap(), 1);
        drop(db);
        let db = MigrationDb::open(&path).unwrap();
        assert_eq!(db.remaining().unwrap(), 1);
        db.set_meta("remaining", "999").unwrap();
        assert_eq!(db.recount().unwrap(), 1);
        db.set_anchor(77, 5).unwrap();
        assert_eq!(db.anchor(77).unwrap(), Some((5, None)));
        db.skip(
            &SourcePath::parse(b"x").unwrap(),
            SourceErrorKind::PermissionDenied,
            "EACCES",
        )
        .unwrap();
        assert_eq!(db.skipped().unwrap().len(), 1);
    }

    #[test]
    fn new_database_starts_clean_and_progress_reads_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/migrate.db");
        assert!(MigrationDb::open_read_only(&path).is_err(), "never creates");
        let db = MigrationDb::open(&path).unwrap();
        assert_eq!(db.meta("clean").unwrap().as_deref(), Some("1"));
        assert_eq!(db.remaining().unwrap(), 0);
        let r = |ino, kind, minsize| StubRow {
            ino,
            kind,
            src_path: SourcePath::parse(format!("f{ino}").as_bytes()).unwrap(),
            src_ino: ino,
            minsize,
            listed_size: minsize,
            listed_mtime_ns: 0,
            ident: None,
        };
        db.insert(
            &[
                r(1, StubKind::DummyDir, 0),
                r(2, StubKind::DummyFile, 100),
                r(3, StubKind::PartialFile, 50),
            ],
            &[],
        )
        .unwrap();
        db.record_done(4, &SourcePath::parse(b"f4").unwrap(), 1000, 0)
            .unwrap();
        db.set_meta("clean", "0").unwrap();
        drop(db);
        // Reopened: an existing database keeps its unclean flag.
        let db = MigrationDb::open(&path).unwrap();
        assert_eq!(db.meta("clean").unwrap().as_deref(), Some("0"));
        let ro = MigrationDb::open_read_only(&path).unwrap();
        // 20 of the partial file's 50 bytes missing (a range past minsize is ignored).
        let missing = |ino: u64| {
            assert_eq!(ino, 3, "only partial files are asked");
            vec![(10, 30), (60, 90)]
        };
        let p = ro.progress(Some(&missing)).unwrap();
        assert_eq!((p.remaining, p.dirs_pending, p.file_stubs), (3, 1, 2));
        assert_eq!((p.files_done, p.bytes_known), (1, 1150));
        assert_eq!((p.missing_bytes, p.bytes_done), (120, 1030));
        let p = ro.progress(None).unwrap();
        assert_eq!((p.missing_bytes, p.bytes_done), (150, 1000));
    }

    #[test]
    fn completion_is_one_change_and_sync_covers_earlier_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/migrate.db");
        let db = MigrationDb::open(&path).unwrap();
        db.sync().unwrap(); // nothing committed yet: a no-op
        let src = SourcePath::parse(b"d/f").unwrap();
        let row = StubRow {
            ino: 7,
            kind: StubKind::DummyFile,
            src_path: src.clone(),
            src_ino: 70,
            minsize: 9,
            listed_size: 9,
            listed_mtime_ns: 5,
            ident: None,
        };
        db.insert(std::slice::from_ref(&row), &[]).unwrap();
        assert_eq!(
            db.get(7).unwrap(),
            Some(row.clone()),
            "served from the mirror"
        );
        let other = SourcePath::parse(b"d/g").unwrap();
        assert!(
            !db.complete(7, &other, Some((9, 5, None))).unwrap(),
            "another object's completion touches nothing"
        );
        assert_eq!(db.done_path(7).unwrap(), None);
        db.sync().unwrap();
        assert_eq!(
            db.synced.load(Ordering::Acquire),
            db.committed.load(Ordering::Acquire)
        );
        assert!(db.complete(7, &src, Some((9, 5, None))).unwrap());
        assert!(
            !db.complete(7, &src, Some((9, 5, None))).unwrap(),
            "only once"
        );
        assert_eq!((db.get(7).unwrap(), db.remaining().unwrap()), (None, 0));
        assert_eq!(db.done_path(7).unwrap(), Some(src.clone()));
        db.sync().unwrap();
        drop(db);
        // The mirror is rebuilt from the table at open, and agrees with it.
        let db = MigrationDb::open(&path).unwrap();
        db.insert(&[StubRow { ino: 8, ..row }], &[]).unwrap();
        let ro = MigrationDb::open_read_only(&path).unwrap();
        assert_eq!(db.all().unwrap(), ro.all().unwrap());
        assert_eq!(ro.get(8).unwrap(), db.get(8).unwrap());
        assert_eq!(db.remaining().unwrap(), 1);
    }

    #[test]
    fn forgotten_files_are_counted_as_deleted_by_clients_once_whatever_their_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/migrate.db");
        let p = |s: &str| SourcePath::parse(s.as_bytes()).unwrap();
        let r = |ino, kind, src: &str| StubRow {
            ino,
            kind,
            src_path: p(src),
            src_ino: ino,
            minsize: 10,
            listed_size: 10,
            listed_mtime_ns: 0,
            ident: None,
        };
        {
            let db = MigrationDb::open(&path).unwrap();
            db.insert(
                &[
                    r(1, StubKind::DummyDir, "d"),
                    r(2, StubKind::DummyFile, "dummy"),
                    r(3, StubKind::PartialFile, "partial"),
                    r(4, StubKind::PartialFile, "done"),
                ],
                &[],
            )
            .unwrap();
            assert!(db.complete(4, &p("done"), Some((10, 0, None))).unwrap());
            assert_eq!(db.deleted_by_clients().unwrap(), 0);
            // Another object's path (a reused inode number): nothing of ours goes.
            assert!(!db.forget_object(2, &p("other")).unwrap());
            assert!(!db.forget_object(4, &p("other")).unwrap());
            assert_eq!(db.deleted_by_clients().unwrap(), 0);
            assert!(db.forget_object(1, &p("d")).unwrap());
            assert_eq!(
                db.deleted_by_clients().unwrap(),
                0,
                "a directory is no file"
            );
            assert!(db.forget_object(2, &p("dummy")).unwrap());
            assert!(db.forget_object(3, &p("partial")).unwrap());
            db.forget_object(4, &p("done")).unwrap();
            assert_eq!(db.done_path(4).unwrap(), None);
            assert_eq!(db.deleted_by_clients().unwrap(), 3);
            // Told twice (the hook, then a reconciliation): counted once.
            db.forget_object(3, &p("partial")).unwrap();
            db.forget_object(4, &p("done")).unwrap();
            assert_eq!(db.deleted_by_clients().unwrap(), 3);
            assert_eq!(db.remaining().unwrap(), 0);
        }
        let db = MigrationDb::open(&path).unwrap();
        assert_eq!(db.deleted_by_clients().unwrap(), 3, "survives reopen");
    }

    #[test]
    fn listed_names_survive_reopen_and_a_listing_again_replaces_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/migrate.db");
        let d = SourcePath::parse(b"d").unwrap();
        {
            let db = MigrationDb::open(&path).unwrap();
            let names: [&[u8]; 3] = [b"a", b"caf\xe9", b"z"];
            db.insert_with_listing(&[], &[], Some((&d, &names)))
                .unwrap();
            db.insert_with_listing(&[], &[], Some((&SourcePath::root(), &[])))
                .unwrap();
        }
        let db = MigrationDb::open(&path).unwrap();
        let listed = db.listings().unwrap();
        assert_eq!(
            listed,
            vec![
                (SourcePath::root(), vec![]),
                (
                    d.clone(),
                    vec![b"a".to_vec(), b"caf\xe9".to_vec(), b"z".to_vec()]
                ),
            ]
        );
        // Listed again after a crash: the newer names replace the older ones.
        db.insert_with_listing(&[], &[], Some((&d, &[&b"b"[..]])))
            .unwrap();
        assert_eq!(db.listings().unwrap()[1].1, vec![b"b".to_vec()]);
        assert_eq!(db.remaining().unwrap(), 0, "a listing is no stub row");
    }

    /// A database from before session 11 gains the identity and ctime columns, its rows
    /// reading as unknown; new rows carry a stub's identity on to its completion record
    /// and its anchor.
    #[test]
    fn identities_and_completion_ctimes_are_added_to_old_databases_and_follow_the_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m/migrate.db");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        {
            let old = Connection::open(&path).unwrap();
            old.execute_batch(
                "CREATE TABLE stubs(ino INTEGER PRIMARY KEY, kind INTEGER NOT NULL, src_path BLOB NOT NULL, src_ino INTEGER NOT NULL, minsize INTEGER NOT NULL, listed_size INTEGER NOT NULL DEFAULT 0, listed_mtime INTEGER NOT NULL DEFAULT 0);
                 CREATE TABLE anchors(src_ino INTEGER PRIMARY KEY, ino INTEGER NOT NULL);
                 CREATE TABLE done(ino INTEGER PRIMARY KEY, src_path BLOB NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL);
                 INSERT INTO stubs VALUES(3, 1, X'61', 30, 9, 9, 5);
                 INSERT INTO anchors VALUES(30, 3);
                 INSERT INTO done VALUES(4, X'62', 7, 6);",
            )
            .unwrap();
        }
        let db = MigrationDb::open(&path).unwrap();
        let p = |s: &str| SourcePath::parse(s.as_bytes()).unwrap();
        assert_eq!(
            db.done().unwrap(),
            vec![DoneRow {
                ino: 4,
                src_path: p("b"),
                size: 7,
                mtime_ns: 6,
                ctime_ns: None,
                ident: None
            }]
        );
        assert_eq!(db.get(3).unwrap().unwrap().ident, None);
        assert_eq!(db.anchor(30).unwrap(), Some((3, None)));
        let row = StubRow {
            ino: 8,
            kind: StubKind::DummyFile,
            src_path: p("c"),
            src_ino: 80,
            minsize: 10,
            listed_size: 10,
            listed_mtime_ns: 11,
            ident: Some(b"id-8".to_vec()),
        };
        db.insert(std::slice::from_ref(&row), &[(80, 8)]).unwrap();
        assert_eq!(db.anchor(80).unwrap(), Some((8, Some(b"id-8".to_vec()))));
        assert!(db.complete(8, &p("c"), Some((10, 11, Some(-12)))).unwrap());
        assert!(db.complete(3, &p("a"), Some((9, 5, None))).unwrap());
        drop(db);
        let db = MigrationDb::open(&path).unwrap();
        let done = db.done_row(8).unwrap().unwrap();
        assert_eq!(
            (done.size, done.mtime_ns, done.ctime_ns, done.ident),
            (10, 11, Some(-12), Some(b"id-8".to_vec()))
        );
        assert_eq!(db.done_row(3).unwrap().unwrap().ctime_ns, None);
        db.drop_anchor(80, 9).unwrap();
        assert!(
            db.anchor(80).unwrap().is_some(),
            "another inode's anchor stays"
        );
        db.drop_anchor(80, 8).unwrap();
        assert_eq!(db.anchor(80).unwrap(), None);
    }

    #[test]
    fn listings_come_in_pages_in_path_order() {
        let dir = tempfile::tempdir().unwrap();
        let db = MigrationDb::open(&dir.path().join("m/migrate.db")).unwrap();
        let dirs: Vec<SourcePath> = [&b"b"[..], b"a", b"a/c", b"c"]
            .iter()
            .map(|p| SourcePath::parse(p).unwrap())
            .collect();
        for d in &dirs {
            db.insert_with_listing(&[], &[], Some((d, &[d.as_bytes()])))
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = db.listings_after(after.as_ref(), 3).unwrap();
            assert!(page.len() <= 3);
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            seen.extend(page);
        }
        assert_eq!(seen, db.listings().unwrap());
        let paths: Vec<&[u8]> = seen.iter().map(|(p, _)| p.as_bytes()).collect();
        assert_eq!(paths, [&b"a"[..], b"a/c", b"b", b"c"]);
        assert!(
            seen.iter()
                .all(|(p, names)| names == &[p.as_bytes().to_vec()])
        );
    }
}
