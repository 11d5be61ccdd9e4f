//! The on-demand side of post-copy migration: the store's [`StubFiller`].
//!
//! - **Directories** are dummies (store: *unlisted*) until first looked up or listed; then
//!   the whole source listing is fetched in one call (READDIRPLUS style) and every entry
//!   is created at once with its attributes. Symlinks, FIFOs, sockets and devices are
//!   complete when created; directories and regular files become stub rows.
//! - **Files** go dummy (attributes from the listing) → partial (xattrs, ACLs and
//!   alternate data streams copied: on the first data access, the first reference to its
//!   xattrs — get, list, set or remove, so a client's change is made over the source's
//!   values and never overwritten by them — or by the crawler's metadata pass) → normal
//!   (no missing byte range; the row is deleted and the counter drops).
//! - **Where a share starts**: a fresh share only into a new or empty directory (see
//!   `check_target_empty`); the listing of each directory is recorded so `finish` can
//!   report entries the source gained or lost after it was listed.
//! - **Data** is fetched in units of `unit_size` (10 MiB by default) aligned to the unit,
//!   clamped to `minsize`. Only the parts the store still reports missing are written, so
//!   bytes a client wrote are never overwritten by a late fetch. Every unit fetch claims
//!   its unit first, so concurrent requests for the same unit wait for one fetch, while
//!   distinct units run in parallel: of different files, and of one large file, whose
//!   units the crawler's threads share. The crawler is admitted (demand priority,
//!   throttle) before it claims a unit, never while holding one, so a client never waits
//!   behind the crawl's throttle.
//! - **Hard links**: a regular file with link count ≥ 2 is recorded as an *anchor* keyed
//!   by its source inode; later paths with the same source inode become hard links to the
//!   anchor's store inode instead of new stubs.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::meta_retry::{self, MetaRetries, MetadataRetry, Verdict};
use super::readahead::{ListingCache, subdirectories};
use super::samba_meta::{self, DosAttrib, xattr_skip_reason};
use super::source::{
    FileKind as SrcKind, Source, SourceAttr, SourceEntry, SourceError, SourceErrorKind, SourcePath,
    Timestamp,
};
use super::state::{MigrationDb, Progress, StubKind, StubRow};
use crate::Store;
use crate::error::{FsError, FsResult};
use crate::stub::{BackingIdentity, DirFillGate, Stamp, StubEntry, StubFiller, StubState};
use crate::types::{Caller, FileKind, Ino, ROOT_INO, SetAttr, TimeSet};
use kaiso_policy::crawl::CrawlOrder;

/// Where an SMB source's NT security descriptor goes: Samba's vfs_acl_xattr blob, so a
/// Samba share of the destination shows and enforces it (see [`samba_meta`]).
pub const NT_SD_XATTR: &str = samba_meta::NTACL_XATTR;
/// Owner and group SIDs of a source that gives them without a descriptor (none does
/// today: SMB's are parsed from the descriptor, which already holds them). `trusted.*`:
/// Samba shows only `user.*` xattrs to SMB clients as EAs.
pub const OWNER_SID_XATTR: &str = "trusted.kaiso.owner_sid";
pub const GROUP_SID_XATTR: &str = "trusted.kaiso.group_sid";

/// Settings of one migrated share.
#[derive(Clone, Debug)]
pub struct MigrationConfig {
    /// Name of the migration (one per share), used for its state directory.
    pub name: String,
    /// Store-relative directory the share appears in (empty: the store root).
    pub target: PathBuf,
    /// Fetch unit in bytes (the thesis: 10 MiB, under 1 s even on 1 Gbit/s).
    pub unit_size: u64,
    pub order: CrawlOrder,
    /// Crawler threads (1 = the thesis's single crawler).
    pub crawl_workers: usize,
    /// Crawler bandwidth limit in bytes per second (demand fetches are never throttled).
    pub throttle_bytes_per_sec: Option<u64>,
    /// Idle crawler threads fetch other units of a large file a thread is fetching
    /// (default). Off: one thread fetches a file's units one after another (the crawl
    /// before session 9; for measuring the difference).
    pub share_units: bool,
    /// An entry whose metadata read keeps failing as unreachable while the share's root
    /// answers is given up (skip report, migrated without that metadata) at its first
    /// failure with at least this many counted failures ...
    pub meta_give_up_attempts: u32,
    /// ... and at least this long after its first one (see [`super::meta_retry`]).
    pub meta_give_up_after: Duration,
}

impl MigrationConfig {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            target: PathBuf::new(),
            unit_size: 10 << 20,
            order: CrawlOrder::default(),
            crawl_workers: 2,
            throttle_bytes_per_sec: None,
            share_units: true,
            meta_give_up_attempts: super::meta_retry::DEFAULT_GIVE_UP_ATTEMPTS,
            meta_give_up_after: super::meta_retry::DEFAULT_GIVE_UP_AFTER,
        }
    }
}

/// Live counters (for status, rates and the benchmark).
#[derive(Debug, Default)]
pub struct Counters {
    pub bytes_fetched: AtomicU64,
    pub demand_fetches: AtomicU64,
    pub crawl_fetches: AtomicU64,
    pub dirs_listed: AtomicU64,
    pub files_completed: AtomicU64,
    pub demand_in_flight: AtomicUsize,
}

thread_local! {
    /// Set on crawler threads, so their fetches yield to demand fetches and are throttled.
    static CRAWLER_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// What this thread holds that a client may wait for (a directory's fill gate, a
    /// file's metadata gate, a unit claim): a crawler thread holding any never waits for
    /// demand (the demand could be waiting for it).
    static HOLDING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one thing held by this thread (see `HOLDING`) while alive.
struct Holding;

impl Holding {
    fn new() -> Self {
        HOLDING.with(|h| h.set(h.get() + 1));
        Holding
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        HOLDING.with(|h| h.set(h.get().saturating_sub(1)));
    }
}

/// A client's source call (data unit, listing, metadata) in flight while alive: the
/// crawler's own calls wait meanwhile (see [`Migration::crawler_yield`]).
pub(crate) struct Demand<'a>(Option<&'a AtomicUsize>);

impl Drop for Demand<'_> {
    fn drop(&mut self) {
        if let Some(n) = self.0 {
            n.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

pub(crate) fn mark_crawler_thread() {
    CRAWLER_THREAD.with(|c| c.set(true));
    // Its reads and opens are not client accesses (heat, tier counters, trace).
    crate::Store::mark_background_thread();
}

fn on_crawler_thread() -> bool {
    CRAWLER_THREAD.with(|c| c.get())
}

/// How [`Migration::open`] is given the store: a `&Arc<Store>` lets it recount in the
/// background after an unclean stop (the share serves meanwhile); a plain `&Store`
/// recounts before `open` returns.
pub trait StoreHandle {
    fn store(&self) -> &Store;
    /// The store as shared, when it is.
    fn shared(&self) -> Option<Arc<Store>>;
}

impl StoreHandle for Store {
    fn store(&self) -> &Store {
        self
    }
    fn shared(&self) -> Option<Arc<Store>> {
        None
    }
}

impl StoreHandle for Arc<Store> {
    fn store(&self) -> &Store {
        self
    }
    fn shared(&self) -> Option<Arc<Store>> {
        Some(self.clone())
    }
}

/// The background recount after an unclean stop (see [`Migration::open`]).
#[derive(Default)]
struct Recount {
    running: Mutex<bool>,
    ended: Condvar,
    /// Asked to stop (a clean close): the counter stays unrecounted, `clean` stays 0.
    abort: AtomicBool,
    /// The last recount ran to its end.
    completed: AtomicBool,
}

/// Names of migrations whose background recount waits until released (tests).
static HELD_RECOUNTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Makes the background recount of migration `name` wait (`true`) until released
/// (`false`): tests of serving while the recount runs.
#[doc(hidden)]
pub fn hold_recount(name: &str, held: bool) {
    let mut h = HELD_RECOUNTS.lock().unwrap_or_else(|e| e.into_inner());
    h.retain(|n| n != name);
    if held {
        h.push(name.to_string());
    }
}

fn recount_held(name: &str) -> bool {
    HELD_RECOUNTS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|n| n == name)
}

/// One migrated share: its source, its state database and its counters.
pub struct Migration {
    pub(crate) cfg: MigrationConfig,
    pub(crate) source: Box<dyn Source>,
    pub(crate) db: MigrationDb,
    pub(crate) dir: PathBuf,
    pub(crate) root_ino: Ino,
    pub counters: Counters,
    /// Crawler bandwidth budget: when the budget is next free. Each admitted unit
    /// reserves the next `bytes / limit` of time from there, so `--rate` holds exactly
    /// however many threads ask (a window of one second let threads that charged late in
    /// a window sleep into the next ones: a third of the rate with 16 threads).
    throttle: Mutex<Instant>,
    pub(crate) stop: AtomicBool,
    pub(crate) paused: AtomicBool,
    throttle_limit: AtomicU64,
    /// Set by a running crawler: tells it about client renames.
    pub(crate) rename_hook: Mutex<Option<RenameHook>>,
    /// The last stop was unclean: the counter is recomputed (at open, or in the
    /// background after it).
    recounted: AtomicBool,
    recount: Recount,
    /// Source attributes a read of the file returned for free (NFS post-op attributes),
    /// by store inode: used by `complete` instead of another `stat` round trip.
    after_read: Mutex<HashMap<Ino, (SourcePath, SourceAttr)>>,
    /// Unit buffers, reused across fetches.
    buffers: BufferPool,
    /// Source listings of subdirectories read ahead of their expansion.
    listings: ListingCache,
    /// Listings made by crawler threads whose rows are not known durable yet: their
    /// directories are still unlisted in the store (see `expand_dir`).
    pending: Mutex<PendingListings>,
    /// Signalled when a listing is deferred (wakes the committer).
    pending_added: Condvar,
    /// One commit batch at a time (see `commit_listings`).
    commit_lock: Mutex<()>,
    /// Set while a crawler's committer runs: only then are crawler listings deferred.
    pub(crate) defer_listing_commits: AtomicBool,
    /// The notice "owners not kept" is in the report (once per share, see
    /// [`Migration::note_owner_not_given`]).
    owner_noticed: AtomicBool,
    /// Hard-link anchors made by this process's listings, by source inode, kept from
    /// their creation on (their rows reach the database only with their listing's chunk).
    /// Held across the "is there an anchor?" check and the creation, so two workers
    /// listing two directories of one link group at once agree on one anchor.
    /// With the anchor's backing identity, checked before a link is made to it.
    anchor_claims: Mutex<HashMap<u64, AnchorClaim>>,
    /// What this process's fetches into each file found (see [`FetchTrack`]), until its
    /// completion is recorded.
    fetch_tracks: Mutex<HashMap<Ino, FetchTrack>>,
    /// This migration, for read-ahead threads.
    me: Weak<Migration>,
    /// One metadata copy (dummy → partial) per file at a time.
    meta_gate: DirFillGate,
    /// Listed directories whose own times and metadata are still to be copied (their row
    /// stays): the copy found the source unreachable, or a crash came between marking
    /// them listed and removing their row. Retried by every [`Migration::reconcile`]
    /// (crawl rounds, `finish`). Rebuilt at open from the rows, which persist the mark.
    meta_retry: Mutex<HashSet<Ino>>,
    /// Counted failures of metadata reads, by source path, and unlisted directories whose
    /// own metadata was copied (see [`super::meta_retry`]).
    meta_retries: MetaRetries,
    /// Units being fetched (see [`UnitClaims`]).
    units: UnitClaims,
    /// Units a crawler thread is being admitted for (`begin_admission`): other threads
    /// pick other units, so no two wait for the throttle for the same one.
    admitting: Mutex<HashSet<(Ino, u64)>>,
    /// When completions last group-committed (see `group_commit_due`).
    last_group_commit: Mutex<Instant>,
}

/// A hard-link anchor: the store inode of the group's first link, and its backing
/// identity (if known).
type AnchorClaim = (Ino, Option<Vec<u8>>);

/// What the fetches into one file found, for its completion record: `finish` may fetch a
/// completed file again over a copy that differs from the source only if no client can
/// have changed it, which the tier file's ctime tells once the copy is complete — if the
/// ctime recorded then is the one right after the fetch that completed it and no client
/// changed the file while it was a stub.
struct FetchTrack {
    src: SourcePath,
    /// Every fetch into the file was made by this process, from the first (the file was
    /// wholly missing then), and none found a client change before it.
    clean: bool,
    /// The tier file's ctime right after the completing fetch.
    completed_ctime: Option<SystemTime>,
}

/// Units being fetched, by (file, unit start). A fetch of a unit claims it first: a
/// second request for the same unit (a client's read and the crawler, two clients) waits
/// for the first instead of reading it again, while distinct units of one file are
/// fetched at once (crawler threads share a large file's units: `crawler::visit_leaf`).
#[derive(Default)]
struct UnitClaims {
    busy: Mutex<std::collections::HashSet<(Ino, u64)>>,
    released: Condvar,
}

/// A claimed unit; released (and waiters woken) when dropped.
pub(crate) struct UnitClaim<'a> {
    claims: &'a UnitClaims,
    ino: Ino,
    at: u64,
    _held: Holding,
}

impl UnitClaims {
    /// Claims unit `at` of `ino`, waiting while another thread holds it.
    fn claim(&self, ino: Ino, at: u64) -> UnitClaim<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while busy.contains(&(ino, at)) {
            // Timed: a holder always releases, but a lost wakeup must not hang a read.
            busy = self
                .released
                .wait_timeout(busy, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        busy.insert((ino, at));
        UnitClaim {
            claims: self,
            ino,
            at,
            _held: Holding::new(),
        }
    }

    /// Claims unit `at` of `ino` unless another thread holds it.
    fn try_claim(&self, ino: Ino, at: u64) -> Option<UnitClaim<'_>> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if !busy.insert((ino, at)) {
            // (Never a claim made and dropped here: its drop would release the holder's.)
            return None;
        }
        Some(UnitClaim {
            claims: self,
            ino,
            at,
            _held: Holding::new(),
        })
    }

    fn is_busy(&self, ino: Ino, at: u64) -> bool {
        let busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.contains(&(ino, at))
    }

    fn busy_in(&self, ino: Ino) -> usize {
        let busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        busy.iter().filter(|(i, _)| *i == ino).count()
    }

    /// Waits until some unit is released or `limit` passes.
    fn wait_release(&self, limit: Duration) {
        let busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        if !busy.is_empty() {
            let _ = self.released.wait_timeout(busy, limit);
        }
    }
}

impl Drop for UnitClaim<'_> {
    fn drop(&mut self) {
        self.claims
            .busy
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(self.ino, self.at));
        self.claims.released.notify_all();
    }
}

/// A few unit-sized buffers kept for reuse: a fetch takes one and gives it back, so a
/// 10 MiB unit does not cost a fresh zeroed allocation (page faults, then unmapping)
/// each time. Keeps at most `keep` buffers; more fetches at once allocate their own.
/// A buffer never shrinks, so a short unit (a file's tail) followed by a full one does
/// not zero the difference again: callers use the first `len` bytes.
struct BufferPool {
    free: Mutex<Vec<Vec<u8>>>,
    keep: usize,
}

impl BufferPool {
    fn new(keep: usize) -> Self {
        Self {
            free: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A buffer of at least `len` bytes (contents unspecified).
    fn take(&self, len: usize) -> Vec<u8> {
        let reused = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match reused {
            Some(mut b) => {
                if b.len() < len {
                    b.resize(len, 0);
                }
                b
            }
            // Zeroed by the allocator (fresh pages), not written over.
            None => vec![0; len],
        }
    }

    fn give(&self, b: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.keep {
            free.push(b);
        }
    }
}

/// Deferred listings: waiting for the next commit, and in the batch being committed.
#[derive(Default)]
struct PendingListings {
    queued: Vec<Ino>,
    committing: Vec<Ino>,
}

pub(crate) type RenameHook = Arc<dyn Fn(Ino, bool) + Send + Sync>;

fn io(e: std::io::Error) -> FsError {
    tracing::error!("migration state: {e}");
    if e.kind() == std::io::ErrorKind::StorageFull {
        // A full state directory is ENOSPC, not a generic I/O error, in `status`.
        return FsError::NOSPC;
    }
    FsError::IO
}

fn to_system_time(t: Timestamp) -> SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(u64::from(t.nanos))
    }
}

fn store_kind(k: SrcKind) -> FileKind {
    match k {
        SrcKind::Regular => FileKind::File,
        SrcKind::Directory => FileKind::Dir,
        SrcKind::Symlink => FileKind::Symlink,
        SrcKind::Fifo => FileKind::Fifo,
        SrcKind::Socket => FileKind::Socket,
        SrcKind::CharDevice => FileKind::CharDevice,
        SrcKind::BlockDevice => FileKind::BlockDevice,
    }
}

impl Migration {
    /// Opens (or creates) the migration `cfg.name` of `store`, binding `source` to the
    /// store directory `cfg.target` (created if missing). A new migration starts with a
    /// single dummy: the target directory. After an unclean stop the remaining-stub
    /// counter is recomputed. Does not register the filler (see [`Migrations`]).
    ///
    /// The recount after an unclean stop visits every stub row (O(tree)); given the store
    /// as `&Arc<Store>` it runs in the background after `open` returns, so the share
    /// serves at once: [`Migration::recounting`] tells, [`Migration::remaining`] and
    /// [`Migration::reconcile`] (so `finish` and the crawl's end) wait for it.
    pub fn open(
        store: &(impl StoreHandle + ?Sized),
        source: Box<dyn Source>,
        cfg: MigrationConfig,
    ) -> Result<Arc<Self>, String> {
        let shared = store.shared();
        let store = store.store();
        if cfg.unit_size == 0 || cfg.crawl_workers == 0 {
            return Err("unit_size and crawl_workers must be > 0".into());
        }
        if cfg.name.is_empty() || cfg.name.contains(['/', '\0']) || cfg.name.starts_with('.') {
            return Err(format!("bad migration name {:?}", cfg.name));
        }
        // A finish interrupted after it detached its share: that share is finished.
        super::finish::clean_interrupted_finishes(&store.config().state_dir);
        // Clients keep seeing the ctimes partly fetched files showed before the restart.
        let masks = store.restore_ctime_masks();
        if masks > 0 {
            tracing::debug!(masks, "ctime masks of partly fetched files put back");
        }
        let dir = share_dir(&store.config().state_dir, &cfg.name);
        let had_db = dir.join(DB_FILE).exists();
        let db =
            MigrationDb::open(&dir.join(DB_FILE)).map_err(|e| format!("{}: {e}", dir.display()))?;
        let described = source.describe();
        let identity = source.identity();
        let cfg_workers = cfg.crawl_workers;
        let fresh = db.meta("source").map_err(|e| e.to_string())?.is_none();
        let target = ensure_target(store, &cfg.target).and_then(|ino| match fresh {
            true => check_target_empty(store, ino, &db, &cfg.target).map(|()| ino),
            false => Ok(ino),
        });
        let root_ino = match target {
            Ok(ino) => ino,
            Err(e) => {
                if !had_db {
                    // Refused before anything was recorded: leave no share state behind.
                    drop(db);
                    remove_new_share_dir(&dir);
                }
                return Err(e);
            }
        };
        let m = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            meta_gate: DirFillGate::new(),
            meta_retry: Mutex::new(HashSet::new()),
            meta_retries: MetaRetries::default(),
            units: UnitClaims::default(),
            admitting: Mutex::new(HashSet::new()),
            last_group_commit: Mutex::new(Instant::now()),
            listings: ListingCache::default(),
            anchor_claims: Mutex::new(HashMap::new()),
            fetch_tracks: Mutex::new(HashMap::new()),
            pending: Mutex::default(),
            pending_added: Condvar::new(),
            commit_lock: Mutex::new(()),
            defer_listing_commits: AtomicBool::new(false),
            owner_noticed: AtomicBool::new(false),
            throttle_limit: AtomicU64::new(cfg.throttle_bytes_per_sec.unwrap_or(0)),
            cfg,
            source,
            db,
            dir,
            root_ino,
            counters: Counters::default(),
            throttle: Mutex::new(Instant::now()),
            stop: AtomicBool::new(false),
            paused: AtomicBool::new(false),
            rename_hook: Mutex::new(None),
            recounted: AtomicBool::new(false),
            recount: Recount::default(),
            after_read: Mutex::new(HashMap::new()),
            buffers: BufferPool::new(cfg_workers + 2),
        });
        m.db.set_barrier(store.fetch_barrier());
        let e = |e: std::io::Error| e.to_string();
        match m.db.meta("source").map_err(e)? {
            None => {
                // Fresh: the source root exists and is a directory, or we refuse now.
                let attr = m
                    .source
                    .stat(&SourcePath::root())
                    .map_err(|e| format!("source {described}: {e}"))?;
                if attr.kind != SrcKind::Directory {
                    return Err(format!("source {described}: root is not a directory"));
                }
                m.db.insert(
                    &[StubRow {
                        ino: root_ino,
                        kind: StubKind::DummyDir,
                        src_path: SourcePath::root(),
                        src_ino: attr.ino,
                        minsize: 0,
                        listed_size: attr.size,
                        listed_mtime_ns: ns_of(attr.mtime),
                        ident: None,
                    }],
                    &[],
                )
                .map_err(e)?;
                m.db.sync().map_err(e)?;
                store
                    .stub_mark(
                        root_ino,
                        StubState {
                            unlisted_dir: true,
                            missing: Vec::new(),
                            times: None,
                        },
                    )
                    .map_err(|er| format!("mark target unlisted: {er:?}"))?;
                if let Some(id) = &identity {
                    m.db.set_meta(SOURCE_IDENTITY, id).map_err(e)?;
                }
                m.db.set_meta("source", &described).map_err(e)?;
                m.db.set_meta("started", &now_secs().to_string())
                    .map_err(e)?;
            }
            Some(prev) if prev != described => {
                // The same source under a new address (the old server renamed, a mount
                // moved) is accepted on its identity; anything else is refused.
                let recorded = m.db.meta(SOURCE_IDENTITY).map_err(e)?;
                match (&recorded, &identity) {
                    (Some(was), Some(now)) if was == now => {
                        tracing::warn!(
                            migration = %m.cfg.name,
                            from = %prev,
                            to = %described,
                            identity = %now,
                            "source re-pointed: same identity under a new address"
                        );
                        m.db.set_meta("source", &described).map_err(e)?;
                    }
                    _ => {
                        let shown = |id: &Option<String>| id.clone().unwrap_or("unknown".into());
                        return Err(format!(
                            "migration {:?} was started from {prev} (identity {}), not {described} (identity {}): a share follows its source to a new address only when both identities are known and equal",
                            m.cfg.name,
                            shown(&recorded),
                            shown(&identity)
                        ));
                    }
                }
            }
            Some(_) => {
                // A share started before identities were recorded learns it now.
                if let Some(id) = &identity
                    && m.db.meta(SOURCE_IDENTITY).map_err(e)?.is_none()
                {
                    m.db.set_meta(SOURCE_IDENTITY, id).map_err(e)?;
                }
            }
        }
        // A directory row whose directory the store holds listed: its times and metadata
        // are still to do (see `meta_retry`). Nothing lists or expands yet. (In memory
        // only: no call per directory into the tiers, so a large share opens as fast.)
        let pending_meta: HashSet<Ino> = {
            let dirs = m.db.dummy_dirs().map_err(e)?;
            let ns = store.ns();
            dirs.into_iter()
                .filter(|ino| ns.dirs.get(ino).is_some_and(|d| !d.unlisted))
                .collect()
        };
        if !pending_meta.is_empty() {
            tracing::info!(
                migration = %m.cfg.name,
                dirs = pending_meta.len(),
                "listed directories whose metadata is still to be copied: retried"
            );
        }
        *m.meta_retry.lock().unwrap_or_else(|e| e.into_inner()) = pending_meta;
        let unclean = m.db.meta("clean").map_err(e)?.as_deref() != Some("1");
        m.db.set_meta("clean", "0").map_err(e)?;
        if unclean {
            m.recounted.store(true, Ordering::Relaxed);
            let background = shared.and_then(|s| m.start_background_recount(&s).err());
            if let Some(why) = background {
                tracing::warn!(migration = %m.cfg.name, "recount before serving: {why}");
            }
            if !*m.recount.running.lock().unwrap_or_else(|e| e.into_inner()) {
                let n = m
                    .reconcile_inner(store, true)
                    .map_err(|er| format!("recount after unclean stop: {er:?}"))?;
                m.recount.completed.store(true, Ordering::Release);
                tracing::warn!(migration = %m.cfg.name, remaining = n, "unclean stop: stub counter recomputed");
            }
        }
        Ok(m)
    }

    /// Starts the recount after an unclean stop on its own thread. It holds neither the
    /// store nor the migration between rows (a store shut down or dropped meanwhile
    /// ends it, unfinished: the next open recounts again).
    fn start_background_recount(&self, store: &Arc<Store>) -> std::io::Result<()> {
        *self
            .recount
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = true;
        let (me, store) = (self.me.clone(), Arc::downgrade(store));
        let spawned = std::thread::Builder::new()
            .name("kaiso-recount".into())
            .spawn(move || Self::recount_in_background(me, store));
        if let Err(e) = spawned {
            *self
                .recount
                .running
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = false;
            return Err(e);
        }
        Ok(())
    }

    fn recount_in_background(me: Weak<Migration>, store: Weak<Store>) {
        let Some(m) = me.upgrade() else {
            return;
        };
        let name = m.cfg.name.clone();
        let rows = m.db.all();
        drop(m);
        let started = Instant::now();
        while recount_held(&name) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let result: Result<Option<u64>, String> = (|| {
            for row in rows.map_err(|e| e.to_string())? {
                let (Some(m), Some(s)) = (me.upgrade(), store.upgrade()) else {
                    return Ok(None);
                };
                if m.recount.abort.load(Ordering::Acquire) || s.stopping() {
                    return Ok(None);
                }
                m.reconcile_row(&s, &row, true)
                    .map_err(|e| format!("errno {}", e.errno()))?;
            }
            match me.upgrade() {
                Some(m) => m.db.recount().map(Some).map_err(|e| e.to_string()),
                None => Ok(None),
            }
        })();
        let Some(m) = me.upgrade() else {
            return;
        };
        match result {
            Ok(Some(n)) => {
                m.recount.completed.store(true, Ordering::Release);
                tracing::warn!(migration = %name, remaining = n, ms = started.elapsed().as_millis() as u64, "unclean stop: stub counter recomputed in the background");
            }
            Ok(None) => tracing::info!(migration = %name, "recount stopped before its end"),
            Err(e) => tracing::error!(migration = %name, "recount after unclean stop: {e}"),
        }
        *m.recount.running.lock().unwrap_or_else(|e| e.into_inner()) = false;
        m.recount.ended.notify_all();
    }

    /// Whether the recount after an unclean stop is still running (the counter is not
    /// known yet; `status` shows "recounting").
    pub fn recounting(&self) -> bool {
        *self
            .recount
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a background recount to end.
    fn wait_for_recount(&self) {
        let mut running = self
            .recount
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        while *running {
            running = self
                .recount
                .ended
                .wait(running)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    pub fn name(&self) -> &str {
        &self.cfg.name
    }

    /// Whether `open` found the previous run stopped uncleanly and recomputed the
    /// counter (never for a brand-new migration).
    pub fn recounted_at_open(&self) -> bool {
        self.recounted.load(Ordering::Relaxed)
    }

    /// Progress of this share: done and known files and bytes (bytes still missing in
    /// partial files exactly, from the store), stubs, pending directories, skip report.
    /// Reads through its own read-only connection, so it never holds up fetches.
    pub fn progress(&self, store: &Store) -> Result<Progress, String> {
        let path = self.dir.join(DB_FILE);
        let missing = |ino: Ino| store.stub_state(ino).missing;
        MigrationDb::open_read_only(&path)
            .and_then(|db| db.progress(Some(&missing)))
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Progress of share `name` of the store whose state directory is `state_dir`, from
    /// its saved state alone (no daemon, no store opened): partial files count as wholly
    /// missing. Reads only; fails if the share has no state.
    pub fn saved_progress(state_dir: &Path, name: &str) -> Result<Progress, String> {
        let path = share_dir(state_dir, name).join(DB_FILE);
        let db =
            MigrationDb::open_read_only(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // A partial file's fetched part is what the store's stub row says is no longer
        // missing (its database, read-only; audit s11: counting it all missing showed 0 B
        // done offline where the daemon had said 3 MiB). Without that database (a store
        // that never ran) every partial file counts as missing, as before.
        let store_db = state_dir.join("kaiso.db");
        let missing = super::state::store_missing_ranges(&store_db).unwrap_or_else(|e| {
            tracing::debug!("{}: {e}", store_db.display());
            None
        });
        let lookup = |ino: u64| -> Vec<(u64, u64)> {
            missing
                .as_ref()
                .and_then(|m| m.get(&ino).cloned())
                .unwrap_or_default()
        };
        let missing_of: Option<&dyn Fn(u64) -> Vec<(u64, u64)>> = match missing {
            Some(_) => Some(&lookup),
            None => None,
        };
        db.progress(missing_of)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn state_dir(&self) -> &Path {
        &self.dir
    }

    pub fn root_ino(&self) -> Ino {
        self.root_ino
    }

    pub fn source(&self) -> &dyn Source {
        &*self.source
    }

    pub fn config(&self) -> &MigrationConfig {
        &self.cfg
    }

    /// The remaining-stub counter: 0 means everything is migrated. Waits for a recount
    /// after an unclean stop (see [`Migration::remaining_now`]).
    pub fn remaining(&self) -> u64 {
        self.wait_for_recount();
        self.db.remaining().unwrap_or(u64::MAX)
    }

    /// The remaining-stub counter, or `None` while it is being recounted.
    pub fn remaining_now(&self) -> Option<u64> {
        if self.recounting() {
            return None;
        }
        Some(self.db.remaining().unwrap_or(u64::MAX))
    }

    /// Bytes of stub files still to be fetched (for status, ETA and tests).
    pub fn missing_bytes(&self, store: &Store) -> u64 {
        self.db
            .all()
            .unwrap_or_default()
            .iter()
            .filter(|r| r.kind != StubKind::DummyDir)
            .flat_map(|r| store.stub_state(r.ino).missing)
            .map(|(s, e)| e - s)
            .sum()
    }

    pub fn skipped(&self) -> Vec<super::state::Skipped> {
        self.db.skipped().unwrap_or_default()
    }

    pub fn set_throttle(&self, bytes_per_sec: Option<u64>) {
        // A new limit starts from now: reservations made under the old one end their
        // waits (see `throttle_wait`).
        *self.throttle.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.throttle_limit
            .store(bytes_per_sec.unwrap_or(0), Ordering::Relaxed);
    }

    /// Marks a clean stop (no recount needed at next open).
    pub fn close(&self) {
        // Completions deferred during a sync are committed before the clean flag (the
        // sync below covers both; it commits them itself if a sync runs now).
        if let Err(e) = self.commit_deferred_completions() {
            tracing::warn!(migration = %self.cfg.name, "deferred completions: {e:?}");
        }
        // A recount still running is stopped; then the counter is not known right and
        // the stop counts as unclean (the next open recounts).
        self.recount.abort.store(true, Ordering::Release);
        self.wait_for_recount();
        let recounted = !self.recounted.load(Ordering::Relaxed)
            || self.recount.completed.load(Ordering::Acquire);
        if recounted {
            let _ = self.db.set_meta("clean", "1");
        }
        if let Err(e) = self.db.sync() {
            tracing::warn!(migration = %self.cfg.name, "sync of the migration state: {e}");
        }
    }

    /// Drops rows of objects that no longer exist or are already complete in the store,
    /// then recomputes the counter. Called after an unclean stop and between crawl rounds
    /// (clients may delete or complete stubs without telling us).
    /// Waits for a background recount after an unclean stop first.
    pub fn reconcile(&self, store: &Store) -> FsResult<u64> {
        // A completion deferred during a sync still holds its row: committed first, or
        // the row would be dropped here without its completion record.
        self.commit_deferred_completions()?;
        self.wait_for_recount();
        let after_crash = self.recounted.load(Ordering::Relaxed)
            && !self.recount.completed.load(Ordering::Acquire);
        self.reconcile_inner(store, after_crash)
    }

    /// For `finish`, before it counts the stubs: when every stub left waits only for its
    /// metadata (a file whose data is all here, such as an empty file, a listed
    /// directory whose metadata copy found the source unreachable, or an unlisted one
    /// whose listing stopped at such an entry: see [`super::meta_retry`]), the copy is
    /// made now, so `finish` does not refuse over an outage that has passed, and an
    /// entry whose bound is reached is given up now rather than at the crawl's next
    /// round (listed directories by the reconcile that follows). With anything else
    /// left, the crawl's work, nothing is done here and `finish` refuses as before. A
    /// copy that fails again leaves its stub.
    pub(crate) fn retry_metadata_only_stubs(&self, store: &Store) -> FsResult<()> {
        self.wait_for_recount();
        let _counted = meta_retry::CountAttempts::here();
        let rows = self.db.all().map_err(io)?;
        let retry = self
            .meta_retry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let blocked = |r: &StubRow| {
            store.stub_state(r.ino).unlisted_dir
                && self.meta_retries.blocks_listing(&self.db, &r.src_path)
        };
        let metadata_only = |r: &StubRow| match r.kind {
            StubKind::DummyDir => retry.contains(&r.ino) || blocked(r),
            StubKind::DummyFile | StubKind::PartialFile => {
                store.stub_state(r.ino).missing.is_empty()
            }
        };
        if !rows.iter().all(metadata_only) {
            return Ok(());
        }
        for row in &rows {
            let done = match row.kind {
                StubKind::DummyFile => self.ensure_partial(store, row),
                // Listed as a client's `ls` would (the fill path, under its gate).
                StubKind::DummyDir if !retry.contains(&row.ino) => {
                    store.opendir(row.ino).and_then(|fh| store.releasedir(fh))
                }
                _ => Ok(()),
            };
            if let Err(e) = done {
                tracing::warn!(
                    errno = e.errno(),
                    "finish: metadata of {} still not copied",
                    row.src_path
                );
            }
        }
        Ok(())
    }

    fn reconcile_inner(&self, store: &Store, after_crash: bool) -> FsResult<u64> {
        for row in self.db.all().map_err(io)? {
            self.reconcile_row(store, &row, after_crash)?;
        }
        self.db.recount().map_err(io)
    }

    /// One row of [`Migration::reconcile`]. A row changed or gone since it was read is
    /// left alone by every step (they look at the current row).
    fn reconcile_row(&self, store: &Store, row: &StubRow, after_crash: bool) -> FsResult<()> {
        // An object with no name left is gone, even if a handle still holds it; so is one
        // whose number another file holds now.
        let exists = store.getattr(row.ino, None).is_ok_and(|a| a.nlink > 0)
            && !replaced(store, row.ino, row.ident.as_deref());
        let state = store.stub_state(row.ino);
        let meta_pending = row.kind == StubKind::DummyDir
            && self
                .meta_retry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&row.ino);
        if (after_crash || meta_pending)
            && exists
            && row.kind == StubKind::DummyDir
            && !state.unlisted_dir
        {
            // Crashed after its entries were all created and it was marked listed,
            // before its row went (or its metadata copy found the source unreachable):
            // clients may have used the entries since, so it is not listed again; only
            // the tail (times, metadata, row) is redone. (A crash before that point
            // leaves it unlisted: listed again, idempotently.)
            if self.db.get(row.ino).map_err(io)?.as_ref() == Some(row) {
                self.finish_dir(store, row.ino, row)?;
            }
            return Ok(());
        }
        let done = match row.kind {
            StubKind::DummyDir => false,
            StubKind::DummyFile => false,
            StubKind::PartialFile => state.missing.is_empty(),
        };
        if !exists {
            self.db.forget_object(row.ino, &row.src_path).map_err(io)?;
        } else if done && let Err(e) = self.complete(store, row) {
            // The source is unreachable now: the row stays for the crawl.
            tracing::warn!("{}: completion left to the crawl: {e}", row.src_path);
        }
        Ok(())
    }

    /// A client removed a name of `ino`: once it has no name left its stub row goes and
    /// the counter drops, even while a handle keeps it open (the store cannot fetch into
    /// a file without a name, and its inode number may be reused once it is closed).
    pub(crate) fn forget_if_gone(&self, store: &Store, ino: Ino) -> FsResult<()> {
        // Which object this is, read before looking at the store: once it is gone the
        // store may hand its inode number to a new object at any moment.
        let (src, ident) = match self.db.get(ino).map_err(io)? {
            Some(row) => (row.src_path, row.ident),
            None => match self.db.done_row(ino).map_err(io)? {
                Some(d) => (d.src_path, d.ident),
                None => return Ok(()),
            },
        };
        // A new file may hold the number already (the store dropped its lock before
        // telling us): then the file of the row is gone too.
        let gone = store
            .getattr(ino, None)
            .map(|a| a.nlink == 0)
            .unwrap_or(true)
            || replaced(store, ino, ident.as_deref());
        if gone {
            self.after_read
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ino);
            self.fetch_tracks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&ino);
            self.db.forget_object(ino, &src).map_err(io)?;
        }
        Ok(())
    }

    fn notify_crawler_of_rename(&self, ino: Ino, is_dir: bool) {
        let hook = self
            .rename_hook
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(hook) = hook {
            hook(ino, is_dir);
        }
    }

    fn owned_row(&self, ino: Ino) -> FsResult<Option<StubRow>> {
        self.db.get(ino).map_err(io)
    }

    /// Lists the source directory of dummy directory `ino` and creates every entry.
    fn expand_dir(&self, store: &Store, ino: Ino, row: &StubRow) -> FsResult<()> {
        let listed = match self.listings.take(&row.src_path) {
            Some(l) => Ok(l),
            None => self.source.read_dir_with_attr(&row.src_path),
        };
        let (entries, dir_attr) = match listed {
            Ok(e) => e,
            Err(e) => return self.give_up_or_retry(store, ino, &e, true),
        };
        self.read_ahead(&row.src_path, &entries);
        // Every entry is created while the directory is still unlisted, so a concurrent
        // lookup waits (per-directory fill gate) instead of seeing a half-listed directory;
        // the store's own fill path re-entered from here (a hard link into this directory)
        // is recognised by the gate and passes. Rows are stored after their entries'
        // creation, a chunk at a time: the store's stub rows of the chunk in one
        // transaction (`stub_batch`), then its migration rows in one (never a migration
        // row without the store's). This directory's own row is removed last, so a crash
        // anywhere in between re-expands it idempotently at the next start.
        // The names listed, stored with the last chunk's rows: `finish` lists the
        // directory again and reports what was added or removed on the source since.
        let names: Vec<&[u8]> = entries.iter().map(|e| e.name.as_slice()).collect();
        let chunks = entries.len().div_ceil(256);
        if chunks == 0 {
            self.db
                .insert_with_listing(&[], &[], Some((&row.src_path, &names)))
                .map_err(io)?;
        }
        for (n, chunk) in entries.chunks(256).enumerate() {
            let mut rows = Vec::new();
            let mut anchors = Vec::new();
            // A destination that cannot take an entry now (full tier, I/O error) stops
            // the listing: the directory stays unlisted with its row, so the crawl retries
            // it (and ends `stuck` with the reason while it keeps failing) and `finish`
            // refuses; an entry is never dropped for a condition that may pass.
            let mut retry_later = None;
            store.stub_batch(|| {
                for entry in chunk {
                    let name = OsStr::from_bytes(&entry.name);
                    let child_src = match row.src_path.join(&entry.name) {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = self.db.skip(&row.src_path, e.kind, &e.message);
                            continue;
                        }
                    };
                    match self.create_entry(store, ino, name, &child_src, &entry.attr, &mut anchors)
                    {
                        Ok(Some(r)) => rows.push(r),
                        Ok(None) => {}
                        Err(e) if creation_may_succeed_later(e) => {
                            tracing::warn!(
                                "{child_src}: not created completely (destination full or failing, or the source unreachable for its metadata): {e}; {} stays unlisted (retried)",
                                row.src_path
                            );
                            retry_later = Some(e);
                            break;
                        }
                        Err(e) => {
                            let _ = self.db.skip(
                                &child_src,
                                SourceErrorKind::Io,
                                &creation_skip_reason(e),
                            );
                        }
                    }
                }
                Ok(())
            })?;
            if let Some(e) = retry_later {
                // The entries made so far keep their rows (a new listing finds them).
                self.db.insert(&rows, &anchors).map_err(io)?;
                return Err(e);
            }
            let listing = (n + 1 == chunks).then_some((&row.src_path, names.as_slice()));
            self.db
                .insert_with_listing(&rows, &anchors, listing)
                .map_err(io)?;
        }
        // Creating the entries touched the directory: its own times and metadata now.
        // A source unreachable for them leaves the directory unlisted with its row (its
        // entries keep theirs): listed again by the next access or crawl round, so its
        // metadata is never skipped for an outage, and no client sees the directory
        // without it (a change a client made would be overwritten by a later copy).
        self.restore_dir_attrs(store, ino, &row.src_path, dir_attr)?;
        // The store must never hold a listed directory whose entries' rows a power loss
        // could take back (they would be stubs nobody can fill), so the directory is
        // marked listed only once its rows are durable. A crawler's listing leaves that to
        // the committer (see `commit_listings`) and goes on to the next level meanwhile;
        // nobody else can reach the entries before the commit, as every client access to
        // a directory still marked unlisted comes through `fill_dir`, which commits first.
        if on_crawler_thread() && self.defer_listing_commits.load(Ordering::Acquire) {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.queued.push(ino);
            self.pending_added.notify_all();
            return Ok(());
        }
        // One fsync, shared with concurrent listings (see `state`).
        self.db.sync().map_err(io)?;
        store.stub_dir_listed(ino)?;
        self.listing_done(ino)
    }

    /// Commits every deferred listing (see `expand_dir`): one fsync of the migration
    /// database makes all their rows durable, then each directory is marked listed and
    /// its row goes. One batch at a time; listings deferred meanwhile wait for the next.
    /// After a failed fsync the batch's directories stay unlisted with their rows, so
    /// their next access lists them again (idempotently).
    pub(crate) fn commit_listings(&self, store: &Store) -> FsResult<()> {
        let _one = self.commit_lock.lock().unwrap_or_else(|e| e.into_inner());
        let batch = {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            let batch = std::mem::take(&mut p.queued);
            p.committing.clone_from(&batch);
            batch
        };
        if batch.is_empty() {
            return Ok(());
        }
        let result = self.db.sync().map_err(io).and_then(|()| {
            // In listing order, so a parent is marked before its subdirectories.
            batch.iter().try_for_each(|&ino| {
                store.stub_dir_listed(ino)?;
                self.listing_done(ino)
            })
        });
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .committing
            .clear();
        result
    }

    /// Whether `ino` is a deferred listing: if so it is committed now (with every other
    /// one) and true is returned once it is listed. False: `ino` still needs listing.
    fn commit_if_pending(&self, store: &Store, ino: Ino) -> FsResult<bool> {
        let pending = {
            let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.queued.contains(&ino) || p.committing.contains(&ino)
        };
        if pending {
            // Waits for a batch holding `ino` that is under way, or commits it.
            self.commit_listings(store)?;
        }
        // A commit that completed since the caller looked has listed it; a failed one
        // left it unlisted (listed again by the caller).
        Ok(!store.stub_state(ino).unlisted_dir)
    }

    /// Wakes the committer (to stop).
    pub(crate) fn wake_committer(&self) {
        self.pending_added.notify_all();
    }

    /// Blocks until a listing is deferred or `limit` passes (for the committer).
    pub(crate) fn wait_for_deferred_listing(&self, limit: Duration) {
        let p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.queued.is_empty() {
            let _ = self.pending_added.wait_timeout(p, limit);
        }
    }

    /// A listing is durable and marked listed: the directory's row goes.
    fn listing_done(&self, ino: Ino) -> FsResult<()> {
        self.db.remove(ino).map_err(io)?;
        self.counters.dirs_listed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Starts background listings of the subdirectories of `dir` (see `readahead`), so
    /// the next level of a deep tree does not wait a source round trip per directory.
    /// A crawler's expansion reads nothing ahead while demand fetches are in flight or
    /// the crawl is paused or stopping (clients' expansions always may).
    fn read_ahead(&self, dir: &SourcePath, entries: &[SourceEntry]) {
        if on_crawler_thread()
            && (self.counters.demand_in_flight.load(Ordering::Acquire) > 0
                || self.paused.load(Ordering::Acquire)
                || self.stop.load(Ordering::Acquire))
        {
            return;
        }
        let claimed = subdirectories(dir, entries)
            .into_iter()
            .filter(|p| self.listings.claim(p))
            .collect();
        self.spawn_read_aheads(claimed);
    }

    /// One thread per claimed path, each running [`Migration::read_ahead_one`].
    fn spawn_read_aheads(&self, claimed: Vec<SourcePath>) {
        let me = self.me.upgrade();
        for path in claimed {
            let spawned = me.clone().map(|m| {
                let p = path.clone();
                std::thread::Builder::new()
                    .name("kaiso-readahead".into())
                    .spawn(move || m.read_ahead_one(&p))
            });
            if !matches!(spawned, Some(Ok(_))) {
                self.listings.fulfil(&path, None);
            }
        }
    }

    /// One read-ahead: the listing of `path`. While a crawl runs, the subdirectories
    /// are claimed as the listing is handed over and read ahead in turn (recursively,
    /// within the cache's bounds), so a deep tree's chain of dependent listings waits
    /// one source round trip per level, not a round trip plus an expansion's local
    /// work. Not while demand fetches are in flight or the crawl is paused or stopping.
    fn read_ahead_one(&self, path: &SourcePath) {
        let listing = self.source.read_dir_with_attr(path).ok();
        let deeper = self.defer_listing_commits.load(Ordering::Acquire)
            && self.counters.demand_in_flight.load(Ordering::Acquire) == 0
            && !self.paused.load(Ordering::Acquire)
            && !self.stop.load(Ordering::Acquire);
        let below = match &listing {
            Some((entries, _)) if deeper => subdirectories(path, entries),
            _ => Vec::new(),
        };
        let claimed = self.listings.fulfil_and_claim(path, listing, below);
        self.spawn_read_aheads(claimed);
    }

    /// The tail of a listing whose directory is already marked listed: its own times
    /// and metadata, then its row goes (after a crash between the two, or a metadata
    /// copy that found the source unreachable). While the source is unreachable the row
    /// stays, marked for the next [`Migration::reconcile`] (see `meta_retry`).
    /// One copy per directory at a time (its metadata gate): a reconcile and a client's
    /// xattr access ([`Migrations::fill_dir_meta`]) do not both copy, and neither after
    /// the other is done (its row is gone then).
    fn finish_dir(&self, store: &Store, ino: Ino, row: &StubRow) -> FsResult<()> {
        let Some(_copying) = self.meta_gate.enter(ino) else {
            return Ok(());
        };
        let _held = Holding::new();
        if self.db.get(ino).map_err(io)?.as_ref() != Some(row) {
            return Ok(()); // done meanwhile
        }
        let copied = self.restore_dir_attrs(store, ino, &row.src_path, None);
        let mut retry = self.meta_retry.lock().unwrap_or_else(|e| e.into_inner());
        if copied.is_err() {
            retry.insert(ino);
            return Ok(());
        }
        retry.remove(&ino);
        drop(retry);
        self.listing_done(ino)
    }

    /// For a client's xattr access of listed directory `row` whose row stays: if its
    /// times and metadata are still to do (`meta_retry`), they are copied now; EIO while
    /// the source cannot give them (a client's change must not come before the copy).
    /// A row that stays for another reason (its listing's commit is under way) needs
    /// nothing: its metadata is copied.
    fn finish_pending_dir_meta(&self, store: &Store, row: &StubRow) -> FsResult<()> {
        let pending = |m: &Self| {
            m.meta_retry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&row.ino)
        };
        if !pending(self) {
            return Ok(());
        }
        self.finish_dir(store, row.ino, row)?;
        if pending(self) && self.db.get(row.ino).map_err(io)?.is_some() {
            return Err(FsError::IO);
        }
        Ok(())
    }

    /// Gives a listed directory the source's times, xattrs and ACLs. `listed` are the
    /// directory's attributes the listing returned, if any (else one `stat` of the
    /// source). EIO when the source is unreachable (nothing is skipped for that: the
    /// caller keeps the directory's row, so the copy is done again).
    fn restore_dir_attrs(
        &self,
        store: &Store,
        ino: Ino,
        src: &SourcePath,
        listed: Option<SourceAttr>,
    ) -> FsResult<()> {
        let attr = match listed {
            Some(a) => Ok(a),
            None => self.source.stat(src),
        };
        let copied = match attr {
            Ok(attr) => {
                let set = SetAttr {
                    atime: Some(TimeSet::At(to_system_time(attr.atime))),
                    mtime: Some(TimeSet::At(to_system_time(attr.mtime))),
                    ..SetAttr::default()
                };
                let _ = store.stub_setattr(ino, &set, Caller::ROOT);
                self.copy_metadata(store, ino, src)
            }
            Err(e) if metadata_retried(&e) => {
                let e = SourceError {
                    message: format!("times: {}", e.message),
                    ..e
                };
                match self.metadata_unreachable(src, &e) {
                    // Given up: it keeps the times of its listing, and no metadata.
                    Some(reason) => {
                        let _ = self.db.skip(src, e.kind, &reason);
                        Ok(())
                    }
                    None => Err(e),
                }
            }
            // Gone from the source since its listing (reported by `finish`, which lists
            // its parent again), or unreadable: it keeps the times of its listing.
            Err(_) => Ok(()),
        };
        copied.map_err(|e| {
            tracing::warn!("source: {e} (times and metadata of directory {src} retried)");
            FsError::IO
        })
    }

    /// Creates one entry from its source attributes; returns its stub row, if any. A
    /// possible hard link is made under `anchor_claims` (see there).
    fn create_entry(
        &self,
        store: &Store,
        parent: Ino,
        name: &OsStr,
        src: &SourcePath,
        a: &SourceAttr,
        new_anchors: &mut Vec<(u64, Ino)>,
    ) -> FsResult<Option<StubRow>> {
        let mut claims = (a.kind == SrcKind::Regular && self.may_be_hard_link(a))
            .then(|| self.anchor_claims.lock().unwrap_or_else(|e| e.into_inner()));
        // Every anchor this process made is claimed; older ones are in the database.
        let known_anchor = || -> FsResult<Option<AnchorClaim>> {
            match claims.as_ref().and_then(|c| c.get(&a.ino)) {
                Some(claim) => Ok(Some(claim.clone())),
                None => self.db.anchor(a.ino).map_err(io),
            }
        };
        let mut anchor = None;
        if claims.is_some()
            && let Some((ino, ident)) = known_anchor()?
        {
            if replaced(store, ino, ident.as_deref()) {
                // The anchor's file is gone and a new file holds its number: no link to
                // that one; this path becomes the group's new anchor.
                tracing::warn!(ino, src = %src, "hard-link anchor of a removed file dropped");
                self.db.drop_anchor(a.ino, ino).map_err(io)?;
                if let Some(c) = claims.as_mut() {
                    c.remove(&a.ino);
                }
            } else {
                anchor = Some(ino);
            }
        }
        if let Some(anchor) = anchor
            && store.getattr(anchor, None).is_ok()
        {
            return match store.link(anchor, parent, name) {
                Ok(a) => {
                    store.forget(a.ino, 1);
                    Ok(None)
                }
                Err(FsError::EXIST) => Ok(None),
                Err(e) => Err(e),
            };
        }
        let symlink_target = if a.kind == SrcKind::Symlink {
            match self.source.read_link(src) {
                Ok(t) => {
                    self.metadata_answered(src);
                    Some(OsStr::from_bytes(&t).to_os_string())
                }
                // Its directory stays unlisted and is listed again (see `expand_dir`),
                // until the read is given up (see `Migration::metadata_unreachable`):
                // then the symlink is reported and left out, and the listing goes on.
                Err(e) if metadata_retried(&e) => {
                    let e = SourceError {
                        message: format!("symlink target: {}", e.message),
                        ..e
                    };
                    if let Some(reason) = self.metadata_unreachable(src, &e) {
                        let _ = self.db.skip(src, e.kind, &reason);
                        return Ok(None);
                    }
                    tracing::warn!("source: {e} (symlink {src} retried)");
                    return Err(FsError::IO);
                }
                Err(e) => {
                    let _ = self.db.skip(src, e.kind, &e.message);
                    return Ok(None);
                }
            }
        } else {
            None
        };
        let entry = StubEntry {
            kind: store_kind(a.kind),
            perm: a.perm & 0o7777,
            uid: a.uid,
            gid: a.gid,
            size: if a.kind == SrcKind::Regular {
                a.size
            } else {
                0
            },
            mtime: to_system_time(a.mtime),
            atime: to_system_time(a.atime),
            symlink_target,
            rdev: libc::makedev(a.rdev.0, a.rdev.1),
            unlisted: a.kind == SrcKind::Directory,
        };
        let ino = store.stub_create(parent, name, &entry)?;
        if a.kind == SrcKind::Directory && a.nlink > 2 {
            // Until it is listed, it shows its source's link count (2 + subdirectories),
            // not its empty backing directory's 2.
            store.stub_show_nlink(ino, a.nlink);
        }
        if let Some(n) = crate::stub::take_owner_not_given() {
            self.note_owner_not_given(src, n);
        }
        // Which file the rows are for: its number may go to another file once it is gone.
        let ident = (a.kind == SrcKind::Regular)
            .then(|| file_identity(store, ino))
            .flatten();
        self.copy_dos_attributes(store, ino, src, a);
        if matches!(a.kind, SrcKind::Regular | SrcKind::Directory)
            && self.db.get(ino).map_err(io)?.is_none()
        {
            // The entry exists without a stub row: created just before a crash that came
            // before its row was stored (the rows of a listing are stored in batches).
            // Its parent is still unlisted, so nobody can have used it: make sure it is a
            // full stub again, not an empty directory or a file of zeros, with the
            // source's times (a crash right after the creation, before the times were
            // set, left the time of the creation; a directory gets its times when it is
            // listed itself).
            let state = store.stub_state(ino);
            let now = store.getattr(ino, None).ok();
            let mut size = now.as_ref().map_or(0, |x| x.size);
            let mtime = to_system_time(a.mtime);
            // A crash between the creation and the `ftruncate` to the listed size left a
            // shorter file: give it the listed size (sparse) before marking it missing,
            // or it would stay short (a fetch writes nothing past the end).
            let resize = a.kind == SrcKind::Regular
                && state.missing.is_empty()
                && now.is_some()
                && size != a.size;
            if a.kind == SrcKind::Regular && (resize || now.is_some_and(|x| x.mtime != mtime)) {
                let set = SetAttr {
                    size: resize.then_some(a.size),
                    atime: Some(TimeSet::At(to_system_time(a.atime))),
                    mtime: Some(TimeSet::At(mtime)),
                    ..SetAttr::default()
                };
                store.stub_setattr(ino, &set, Caller::ROOT)?;
                if resize {
                    size = a.size;
                }
            }
            if a.kind == SrcKind::Directory && !state.unlisted_dir {
                store.stub_mark(
                    ino,
                    StubState {
                        unlisted_dir: true,
                        missing: Vec::new(),
                        times: None,
                    },
                )?;
            } else if a.kind == SrcKind::Regular && state.missing.is_empty() && size > 0 {
                store.stub_mark(
                    ino,
                    StubState {
                        unlisted_dir: false,
                        missing: vec![(0, size)],
                        times: None,
                    },
                )?;
            }
        }
        Ok(match a.kind {
            SrcKind::Directory => Some(StubRow {
                ino,
                kind: StubKind::DummyDir,
                src_path: src.clone(),
                src_ino: a.ino,
                minsize: 0,
                listed_size: a.size,
                listed_mtime_ns: ns_of(a.mtime),
                ident: None,
            }),
            SrcKind::Regular => {
                if let Some(claims) = claims.as_mut() {
                    // Stored with the rows (same transaction), never before them.
                    new_anchors.push((a.ino, ino));
                    claims.insert(a.ino, (ino, ident.clone()));
                }
                Some(StubRow {
                    ino,
                    kind: StubKind::DummyFile,
                    src_path: src.clone(),
                    src_ino: a.ino,
                    minsize: a.size,
                    listed_size: a.size,
                    listed_mtime_ns: ns_of(a.mtime),
                    ident,
                })
            }
            _ => {
                // A symlink, FIFO, socket or device is complete once created: while the
                // source is unreachable for its metadata its directory stays unlisted and
                // is listed again (see `expand_dir`), so the copy is retried.
                if let Err(e) = self.copy_metadata(store, ino, src) {
                    tracing::warn!("source: {e} (metadata of {src} retried)");
                    return Err(FsError::IO);
                }
                None
            }
        })
    }

    /// Reports, once per share, that entries could not be given their source owner
    /// (the daemon may not chown: not root): they are migrated owned by the daemon's
    /// user. A notice in the skip report (kind [`NOTICE_KIND`]), not a skip.
    fn note_owner_not_given(
        &self,
        src: &SourcePath,
        (uid, gid, to_uid, to_gid): (u32, u32, u32, u32),
    ) {
        if self.owner_noticed.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.db.meta(OWNER_NOTICE_META).ok().flatten().is_some() {
            return;
        }
        let reason = format!(
            "owners not kept: kaiso runs as uid {to_uid} and may not give files to other users \
             (chown: Operation not permitted), so entries are owned by uid {to_uid} and keep \
             their source group only where uid {to_uid} is a member of it (this one: uid {uid} \
             gid {gid} on the source, uid {to_uid} gid {to_gid} here); their data, modes and \
             times are migrated. Run the migration as root to keep the owners"
        );
        let _ = self.db.notice(src, &reason);
        let _ = self.db.set_meta(OWNER_NOTICE_META, "1");
    }

    /// Whether a regular file needs a hard-link anchor. Sources with Unix ids (POSIX,
    /// NFS) list the link count; SMB listings do not (they say 1), so there every file is
    /// anchored by its FileId and a second path with the same id still becomes a link.
    fn may_be_hard_link(&self, a: &SourceAttr) -> bool {
        a.kind == SrcKind::Regular
            && a.ino != 0
            && (a.nlink >= 2 || !self.source.features().unix_ids)
    }

    /// Copies xattrs, ACLs and alternate data streams; problems go to the skip report,
    /// except a source that is unreachable: then the copy stops there with that error,
    /// reports nothing, and the caller keeps the entry's metadata to do (its stub row),
    /// so the copy is made again, whole, once the source answers — until the entry has
    /// failed so too often over too long a time while the rest of the source answers
    /// (see [`Migration::metadata_unreachable`]): then that is reported and the copy
    /// counts as made (the caller goes on as after a success).
    fn copy_metadata(&self, store: &Store, ino: Ino, src: &SourcePath) -> Result<(), SourceError> {
        // A directory's listing copies all of it again (its default ACL was left out):
        // whatever happens, the mark of its own copy goes.
        self.meta_retries.set_own_copied(ino, src, false);
        self.copy_metadata_as(store, ino, src, CopyWhat::All)
    }

    /// [`Migration::copy_metadata`] of `what`.
    fn copy_metadata_as(
        &self,
        store: &Store,
        ino: Ino,
        src: &SourcePath,
        what: CopyWhat,
    ) -> Result<(), SourceError> {
        match self.copy_metadata_once(store, ino, src, what) {
            Ok(()) => {
                self.metadata_answered(src);
                Ok(())
            }
            Err(e) => match self.metadata_unreachable(src, &e) {
                Some(reason) => {
                    let _ = self.db.skip(src, e.kind, &reason);
                    Ok(())
                }
                None => Err(e),
            },
        }
    }

    /// A metadata read of `src` failed with `e`, an unreachable source. A crawler's (or
    /// `finish`'s) read is counted when the share's root answers a `stat` now (one call: a source that answers nothing is an
    /// outage of the whole share, retried without end); once the entry's counted failures
    /// reach the share's bound (`meta_give_up_attempts` over at least
    /// `meta_give_up_after`), the read is given up: returns the skip report's reason.
    /// The counts persist in the state database (see [`super::meta_retry`]).
    fn metadata_unreachable(&self, src: &SourcePath, e: &SourceError) -> Option<String> {
        if !on_crawler_thread() && !meta_retry::counted_here() {
            return None; // a client's read: retried, never counted
        }
        let counted = self.source.stat(&SourcePath::root()).is_ok();
        let bound = (self.cfg.meta_give_up_attempts, self.cfg.meta_give_up_after);
        match self
            .meta_retries
            .failed(&self.db, src, e, counted, bound, SystemTime::now())
        {
            Verdict::Retry => None,
            Verdict::GiveUp(reason) => {
                tracing::warn!("{src}: metadata given up: {reason}");
                Some(reason)
            }
        }
    }

    /// A metadata read of `src` succeeded: its failure count (if any) goes.
    fn metadata_answered(&self, src: &SourcePath) {
        self.meta_retries.answered(&self.db, src);
    }

    /// Entries whose metadata the source has not given although its root answers,
    /// retried until the share's bound (see [`super::meta_retry`]), for status.
    pub fn metadata_retries(&self) -> Vec<MetadataRetry> {
        let bound = (self.cfg.meta_give_up_attempts, self.cfg.meta_give_up_after);
        self.meta_retries.list(&self.db, bound)
    }

    /// [`Migration::metadata_retries`] of a share's saved state (no daemon), with the
    /// default bound.
    pub fn saved_metadata_retries(
        state_dir: &Path,
        name: &str,
    ) -> Result<Vec<MetadataRetry>, String> {
        let path = share_dir(state_dir, name).join(DB_FILE);
        let db =
            MigrationDb::open_read_only(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let bound = (
            super::meta_retry::DEFAULT_GIVE_UP_ATTEMPTS,
            super::meta_retry::DEFAULT_GIVE_UP_AFTER,
        );
        Ok(MetaRetries::saved(&db, bound))
    }

    /// Copies the own xattrs, access ACL, NT ACL and streams of unlisted directory `row`
    /// (a client asked for its xattrs before listing it), once: one xattrs + ACL (+
    /// streams) read of its path, no listing. Its default ACL is left to the listing,
    /// which copies everything after creating the entries: set before, it would be
    /// inherited by every entry the listing creates. The caller holds the directory's
    /// fill gate, so no listing runs meanwhile. EIO while the source is unreachable (as
    /// a dummy file's xattrs).
    fn copy_own_dir_metadata(&self, store: &Store, row: &StubRow) -> FsResult<()> {
        if self.meta_retries.own_copied(row.ino, &row.src_path) {
            return Ok(());
        }
        if let Err(e) =
            self.copy_metadata_as(store, row.ino, &row.src_path, CopyWhat::OwnOfUnlistedDir)
        {
            tracing::warn!(
                "source: {e} (metadata of directory {} retried)",
                row.src_path
            );
            return Err(FsError::IO);
        }
        self.meta_retries
            .set_own_copied(row.ino, &row.src_path, true);
        Ok(())
    }

    /// The copy of [`Migration::copy_metadata_as`], without the retry bound.
    fn copy_metadata_once(
        &self,
        store: &Store,
        ino: Ino,
        src: &SourcePath,
        what: CopyWhat,
    ) -> Result<(), SourceError> {
        let feats = self.source.features();
        if feats.xattrs {
            match self.source.xattrs(src) {
                Ok(list) => {
                    for (name, value) in list {
                        if let Err(e) =
                            store.stub_setxattr(ino, OsStr::from_bytes(&name), &value, 0)
                        {
                            let _ = self.db.skip(
                                src,
                                SourceErrorKind::Io,
                                &format!(
                                    "xattr {}: errno {}",
                                    String::from_utf8_lossy(&name),
                                    e.errno()
                                ),
                            );
                        }
                    }
                }
                Err(e) => self.metadata_skip(src, e, "xattrs")?,
            }
        }
        if feats.acls {
            match self.source.acl(src) {
                Ok(acl) => {
                    let set = |name: &str, v: &[u8]| {
                        if let Err(e) = store.stub_setxattr(ino, OsStr::new(name), v, 0) {
                            let _ = self.db.skip(
                                src,
                                SourceErrorKind::Io,
                                &xattr_skip_reason(name, e.errno()),
                            );
                        }
                    };
                    if let Some(v) = &acl.posix_access {
                        set("system.posix_acl_access", v);
                    }
                    if let Some(v) = &acl.posix_default
                        && what == CopyWhat::All
                    {
                        set("system.posix_acl_default", v);
                    }
                    match &acl.nt_security_descriptor {
                        Some(sd) => match samba_meta::ntacl_v1(sd) {
                            Ok(blob) => set(NT_SD_XATTR, &blob),
                            Err(e) => {
                                let _ = self.db.skip(src, SourceErrorKind::Invalid, &e.to_string());
                            }
                        },
                        None => {
                            if let Some(v) = &acl.owner_sid {
                                set(OWNER_SID_XATTR, v.as_bytes());
                            }
                            if let Some(v) = &acl.group_sid {
                                set(GROUP_SID_XATTR, v.as_bytes());
                            }
                        }
                    }
                }
                Err(e) => self.metadata_skip(src, e, "ACL")?,
            }
        }
        if feats.streams {
            match self.source.streams(src) {
                Ok(streams) => {
                    for s in streams {
                        // Samba's streams_xattr layout: the data plus a trailing NUL, so a
                        // Samba export of the destination shows the same streams.
                        match self.source.read_stream(src, &s.name, 0, s.size as usize) {
                            Ok(mut data) => {
                                data.push(0);
                                let name = format!("user.DosStream.{}:$DATA", s.name);
                                if let Err(e) =
                                    store.stub_setxattr(ino, OsStr::new(&name), &data, 0)
                                {
                                    let _ = self.db.skip(
                                        src,
                                        SourceErrorKind::Io,
                                        &format!(
                                            "stream {}: errno {} (xattr size limit?)",
                                            s.name,
                                            e.errno()
                                        ),
                                    );
                                }
                            }
                            Err(e) if metadata_retried(&e) => {
                                return Err(SourceError {
                                    message: format!("stream {}: {}", s.name, e.message),
                                    ..e
                                });
                            }
                            Err(e) => {
                                let _ = self.db.skip(
                                    src,
                                    e.kind,
                                    &format!("stream {}: {}", s.name, e.message),
                                );
                            }
                        }
                    }
                }
                Err(e) => self.metadata_skip(src, e, "streams")?,
            }
        }
        Ok(())
    }

    /// Stores the DOS attributes and creation time a source lists (SMB) where Samba keeps
    /// them (`user.DOSATTRIB`, see [`samba_meta`]), when the entry is created: they come
    /// with the listing, so this costs no request to the source. A tier that cannot hold
    /// the xattr is reported, never fatal.
    fn copy_dos_attributes(&self, store: &Store, ino: Ino, src: &SourcePath, a: &SourceAttr) {
        let Some(attributes) = a.dos_attributes else {
            return;
        };
        let blob = DosAttrib::from_source(attributes, a.btime).encode();
        let name = samba_meta::DOSATTRIB_XATTR;
        if let Err(e) = store.stub_setxattr(ino, OsStr::new(name), &blob, 0) {
            let _ = self.db.skip(
                src,
                SourceErrorKind::Io,
                &xattr_skip_reason(name, e.errno()),
            );
        }
    }

    /// Reports metadata the source would not give. A file the source no longer has is
    /// not reported here: its data fetch or completion reports it (removed on the source
    /// after listing), once. A source that is unreachable is not reported either: the
    /// error is returned, and the copy is made again later (see [`metadata_retried`]).
    fn metadata_skip(
        &self,
        src: &SourcePath,
        e: SourceError,
        what: &str,
    ) -> Result<(), SourceError> {
        if metadata_retried(&e) {
            // What failed, for the skip report should the read be given up.
            return Err(SourceError {
                message: format!("{what}: {}", e.message),
                ..e
            });
        }
        if e.kind != SourceErrorKind::NotFound {
            let _ = self.db.skip(src, e.kind, &format!("{what}: {}", e.message));
        }
        Ok(())
    }

    /// Dummy → partial: copies the file's metadata once. One copy per file at a time
    /// (a client's xattr change waits for a copy under way instead of being overwritten
    /// by it); a copy finished meanwhile is not repeated.
    pub(crate) fn ensure_partial(&self, store: &Store, row: &StubRow) -> FsResult<()> {
        if row.kind != StubKind::DummyFile {
            return Ok(());
        }
        // A client's metadata fetch goes first; the crawler's waits for it (bounded).
        let _demand = self.demand();
        self.crawler_yield();
        let Some(_copying) = self.meta_gate.enter(row.ino) else {
            return Ok(()); // this thread's own copy came back here
        };
        let _held = Holding::new();
        match self.db.get(row.ino).map_err(io)? {
            Some(cur) if cur.kind == StubKind::DummyFile && cur.src_path == row.src_path => {
                if self.row_outlived_its_file(store, &cur)? {
                    return Ok(());
                }
            }
            _ => return Ok(()),
        }
        if let Err(e) = self.copy_metadata(store, row.ino, &row.src_path) {
            // Still a dummy: its metadata is copied again, whole, by the next access, the
            // crawl's next visit or `finish` (never skipped for an outage). Until then
            // its data is not fetched and clients' xattr and mode changes fail (EIO),
            // so no later copy can overwrite them.
            tracing::warn!("source: {e} (metadata of {} retried)", row.src_path);
            return Err(FsError::IO);
        }
        self.db.hold_for_wal().map_err(io)?;
        self.db
            .set_kind(row.ino, StubKind::PartialFile)
            .map_err(io)?;
        if store.stub_state(row.ino).missing.is_empty() {
            self.complete(store, row)?;
        }
        Ok(())
    }

    /// The file's copy is complete: its row goes and the counter drops. It is recorded for
    /// `finish` with the size and mtime the source listed, so `finish` verifies it only
    /// if the destination still looks like that (a client that wrote or truncated it
    /// changed the mtime: counted as modified, not compared).
    fn complete(&self, store: &Store, row: &StubRow) -> FsResult<()> {
        let ino = row.ino;
        let after_read = self
            .after_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino)
            .filter(|(p, _)| *p == row.src_path)
            .map(|(_, a)| a);
        let track = self
            .fetch_tracks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino)
            .filter(|t| t.src == row.src_path);
        match self.db.get(ino).map_err(io)? {
            Some(cur) if cur.src_path == row.src_path => {
                if self.row_outlived_its_file(store, &cur)? {
                    return Ok(());
                }
            }
            // Completed or given up by someone else already, or (different source path)
            // a new object that got the inode number of a deleted one: not ours.
            _ => return Ok(()),
        }
        // The ctime `finish` compares with: only one this process saw right after a fetch
        // completed the file, with no client change before it.
        let ctime_ns = track
            .filter(|t| t.clean)
            .and_then(|t| t.completed_ctime)
            .map(ns_since_epoch);
        // Unreachable: the data is here, but whether the source kept still is not known.
        // EIO, and the row stays: the crawl reports it and completes it once the source
        // answers.
        let done = match self.source_changed(row, after_read)? {
            // The source changed during the copy (it should be read-only): the copy may
            // hold the listed size of the new contents, or a mix of old and new bytes.
            // Reported, and recorded as done with what the listing said, so `finish`
            // sees the source differ from it and fetches the file again whole (or
            // refuses when the copy may hold a client's bytes): never left torn.
            Some(SourceChange::Attributes(why)) => {
                self.db
                    .skip(&row.src_path, SourceErrorKind::Changed, &why)
                    .map_err(io)?;
                Some((row.listed_size, row.listed_mtime_ns, ctime_ns))
            }
            // Not recorded as done, so `finish` reports it instead of failing on it.
            Some(SourceChange::Unreadable(why)) => {
                self.db
                    .skip(&row.src_path, SourceErrorKind::Changed, &why)
                    .map_err(io)?;
                None
            }
            None => Some((row.listed_size, row.listed_mtime_ns, ctime_ns)),
        };
        // Row removal, counter and completion record: one transaction. While a crawl's
        // committer runs, a completion made during a sync is deferred to the group
        // transaction after it instead of waiting for it (the WAL's bound would hold
        // every crawler thread for the sync's `syncfs`; see
        // `MigrationDb::complete_unless_syncing`).
        let went = if self.defer_listing_commits.load(Ordering::Acquire) {
            self.db
                .complete_unless_syncing(ino, &row.src_path, done)
                .map_err(io)?
        } else {
            self.db.hold_for_wal().map_err(io)?;
            Some(self.db.complete(ino, &row.src_path, done).map_err(io)?)
        };
        if went == Some(true) {
            self.counters
                .files_completed
                .fetch_add(1, Ordering::Relaxed);
        }
        self.count_deferred_completions();
        // The database does not checkpoint by itself (see `state`): a group commit now
        // and then bounds its WAL and what a power loss can take back. While a crawl's
        // committer runs, it makes them (`periodic_syncs`), off the crawler threads,
        // which wait for one only past the WAL's bound (`hold_for_wal`).
        if self.defer_listing_commits.load(Ordering::Acquire) {
            if self.db.wal_sync_due() {
                self.wake_committer();
            }
        } else if self.group_commit_due() {
            self.db.sync_unless_busy().map_err(io)?;
        }
        Ok(())
    }

    /// The periodic syncs of a running crawl, for its committer thread: the migration
    /// database's group commit when due (see `group_commit_due`; it checkpoints a grown
    /// WAL) and the store database's checkpoint when due (see
    /// `crate::stub::FetchBarrier::commit_counted`). Both make the fetched data durable
    /// first (`syncfs`), which is slow under load: here no crawler thread waits for it
    /// until a WAL reaches its bound.
    pub(crate) fn periodic_syncs(&self, store: &Store) -> FsResult<()> {
        if self.group_commit_due() {
            self.db.sync().map_err(io)?;
        }
        self.flush_deferred_completions()?;
        store.checkpoint_if_due()
    }

    /// Commits the completions deferred during a sync (see `complete`) unless a sync
    /// is under way (it commits them at its end), and counts those whose row went.
    /// For the committer.
    pub(crate) fn flush_deferred_completions(&self) -> FsResult<()> {
        let r = self.db.flush_deferred().map_err(io);
        self.count_deferred_completions();
        r
    }

    /// Commits the completions deferred during a sync now, even while a sync is under
    /// way, and counts those whose row went: before the rows are counted or reconciled
    /// (a reconcile drops the row of a file the store holds whole, and a deferred
    /// completion's record would be lost with it), when a crawl stops, and at `close`.
    pub(crate) fn commit_deferred_completions(&self) -> FsResult<()> {
        let r = self.db.commit_deferred().map_err(io);
        self.count_deferred_completions();
        r
    }

    /// Adds the deferred completions committed since the last call to the count of
    /// completed files.
    fn count_deferred_completions(&self) {
        let n = self.db.take_deferred_completed();
        if n > 0 {
            self.counters
                .files_completed
                .fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Whether a completion should group-commit now: [`COMMITS_PER_GROUP_COMMIT`]
    /// commits gathered and [`GROUP_COMMIT_INTERVAL`] passed since the last one, or
    /// [`COMMITS_FORCING_GROUP_COMMIT`] gathered. Each group commit makes every fetched
    /// byte durable first (the fetch barrier's `syncfs`), so one every thousand files
    /// put the destination's write-back inside the crawl several times per gigabyte
    /// (measured: docs/reproduction/migration.md §3, session 9).
    fn group_commit_due(&self) -> bool {
        let unsynced = self.db.unsynced();
        if unsynced < COMMITS_PER_GROUP_COMMIT {
            return false;
        }
        let mut last = self
            .last_group_commit
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if last.elapsed() < GROUP_COMMIT_INTERVAL && unsynced < COMMITS_FORCING_GROUP_COMMIT {
            return false;
        }
        *last = Instant::now();
        true
    }

    /// Whether the source file no longer matches its listing (it should be read-only):
    /// a description for the skip report, or `None`. A file that cannot be stat'ed now is
    /// also reported (it vanished or became unreadable after its data was read); one that
    /// cannot be stat'ed because the source is unreachable is an error: its stub stays, so
    /// the crawl retries it instead of skipping it for good.
    fn source_changed(
        &self,
        row: &StubRow,
        after_read: Option<SourceAttr>,
    ) -> FsResult<Option<SourceChange>> {
        if row.kind == StubKind::DummyDir {
            return Ok(None);
        }
        let now = match after_read {
            Some(a) => Ok(a),
            None => self.source.stat(&row.src_path),
        };
        if let Err(e) = &now
            && matches!(e.kind, SourceErrorKind::Unreachable | SourceErrorKind::Io)
        {
            tracing::warn!("source: {e} (completion of {} retried)", row.src_path);
            return Err(FsError::IO);
        }
        Ok(match now {
            Ok(a) if a.size == row.listed_size && ns_of(a.mtime) == row.listed_mtime_ns => None,
            Ok(a) => Some(SourceChange::Attributes(format!(
                "{CHANGED_DURING_COPY}: size {} -> {}, mtime {} -> {} ns; the copy may mix old and new contents (finish fetches it again)",
                row.listed_size,
                a.size,
                row.listed_mtime_ns,
                ns_of(a.mtime)
            ))),
            Err(e) => Some(SourceChange::Unreadable(format!(
                "source file changed during migration: {e}"
            ))),
        })
    }

    /// What to do when the source refused: permanent problems are reported and the stub
    /// is given up (listed empty / left with zeros) so that migration can finish;
    /// transient ones (unreachable) fail the operation with EIO and keep the stub.
    fn give_up_or_retry(
        &self,
        store: &Store,
        ino: Ino,
        e: &SourceError,
        is_dir: bool,
    ) -> FsResult<()> {
        match e.kind {
            SourceErrorKind::Unreachable | SourceErrorKind::Io => {
                tracing::warn!("source: {e}");
                Err(FsError::IO)
            }
            _ if is_dir => {
                // Said in the report: the directory stands empty, its contents are not here.
                let reason = format!(
                    "{}; left here as an empty directory: nothing below it was copied",
                    e.message
                );
                let _ = self.db.skip(&e.path, e.kind, &reason);
                store.stub_dir_listed(ino)?;
                self.db.remove(ino).map_err(io)?;
                Ok(())
            }
            _ => {
                // Left empty rather than full of zeros that look like content, and
                // reported by name (never a silent empty file). Client-written bytes are
                // kept. A file gone from the source since its listing is reported as a
                // change of the source: it is left here, not removed, as a client may
                // have it open or have written to it.
                let missing = store.stub_state(ino).missing;
                store.stub_mark(ino, StubState::default())?;
                let untouched = store
                    .getattr(ino, None)
                    .is_ok_and(|a| missing == [(0, a.size)]);
                if untouched {
                    let set = SetAttr {
                        size: Some(0),
                        ..SetAttr::default()
                    };
                    let _ = store.stub_setattr(ino, &set, Caller::ROOT);
                }
                let (kind, reason) = if e.kind == SourceErrorKind::NotFound {
                    let left = if untouched {
                        "left here as an empty file"
                    } else {
                        "left here with the bytes clients wrote"
                    };
                    (
                        SourceErrorKind::Changed,
                        format!("{REMOVED_AFTER_LISTING}; {left} ({})", e.message),
                    )
                } else {
                    let left = if untouched {
                        "; left here as an empty file"
                    } else {
                        ""
                    };
                    (e.kind, format!("{}{left}", e.message))
                };
                let _ = self.db.skip(&e.path, kind, &reason);
                self.after_read
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&ino);
                self.fetch_tracks
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&ino);
                self.db.remove(ino).map_err(io)?;
                Ok(())
            }
        }
    }

    /// Brings in the unit-aligned units covering `[offset, offset+len)` of file `ino`.
    pub(crate) fn fetch_range(
        &self,
        store: &Store,
        row: &StubRow,
        offset: u64,
        len: u64,
    ) -> FsResult<()> {
        self.ensure_partial(store, row)?;
        // The store drops missing ranges past a truncation, so the missing set already
        // encodes the truncate rule; `minsize` only bounds what is read from the source.
        let minsize = row.minsize;
        let unit = self.cfg.unit_size;
        let mut at = offset / unit * unit;
        let end = (offset + len).div_ceil(unit).saturating_mul(unit);
        while at < end {
            // A unit another thread is fetching is waited for, not read again.
            let _claim = self.units.claim(row.ino, at);
            let missing = crate::stub::missing_within(
                &store.stub_state(row.ino).missing,
                at,
                (at + unit).min(end),
            );
            if !missing.is_empty() {
                self.fetch_unit(store, row, at, minsize, &missing)?;
            }
            at += unit;
        }
        if store.stub_state(row.ino).missing.is_empty() {
            self.complete(store, row)?;
        }
        Ok(())
    }

    /// The crawler's unit `at` of `ino` (unit-aligned), claimed unless another thread
    /// is fetching it (then `None`).
    pub(crate) fn try_claim_unit(&self, ino: Ino, at: u64) -> Option<UnitClaim<'_>> {
        self.units.try_claim(ino, at)
    }

    /// The first of `free` (unit start, missing bytes) of `ino` no other crawler thread is
    /// being admitted for, marked as this thread's until [`Migration::end_admission`].
    /// Without it every idle thread waited for the throttle for the same first unit and
    /// all but one then found it claimed: each unit paid for many times.
    pub(crate) fn begin_admission(&self, ino: Ino, free: &[(u64, u64)]) -> Option<(u64, u64)> {
        let mut admitting = self.admitting.lock().unwrap_or_else(|e| e.into_inner());
        let pick = free
            .iter()
            .find(|(at, _)| !admitting.contains(&(ino, *at)))?;
        admitting.insert((ino, pick.0));
        Some(*pick)
    }

    /// Ends this thread's admission for unit `at` of `ino` (claimed, or given up).
    pub(crate) fn end_admission(&self, ino: Ino, at: u64) {
        self.admitting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(ino, at));
    }

    /// Whether another thread is fetching unit `at` of `ino`.
    pub(crate) fn unit_busy(&self, ino: Ino, at: u64) -> bool {
        self.units.is_busy(ino, at)
    }

    /// Units of `ino` being fetched now.
    pub(crate) fn units_busy_in(&self, ino: Ino) -> usize {
        self.units.busy_in(ino)
    }

    /// Waits until a unit fetch ends somewhere or `limit` passes.
    pub(crate) fn wait_for_unit_release(&self, limit: Duration) {
        self.units.wait_release(limit);
    }

    /// The crawler's fetch of one claimed unit, outside the store's fill path (so that
    /// several crawler threads can fetch distinct units of one file at once; the unit
    /// claims order them with clients' fills instead of the store's per-file fill lock).
    /// Writes what is still missing of the unit; does not complete the file.
    pub(crate) fn fetch_claimed_unit(
        &self,
        store: &Store,
        row: &StubRow,
        claim: &UnitClaim<'_>,
    ) -> FsResult<()> {
        debug_assert_eq!(claim.ino, row.ino);
        self.ensure_partial(store, row)?;
        let unit = self.cfg.unit_size;
        let missing = crate::stub::missing_within(
            &store.stub_state(row.ino).missing,
            claim.at,
            claim.at.saturating_add(unit),
        );
        if missing.is_empty() {
            return Ok(());
        }
        let r = self.fetch_unit(store, row, claim.at, row.minsize, &missing);
        // A client fsync of the file must make this migration's state of it durable
        // (the store's fill path marks this for the fills it runs).
        if let Some(f) = store.ns().files.get(&row.ino) {
            f.state.mark_unsynced(crate::handles::FILLER_TOUCHED);
        }
        r
    }

    /// Fetches one unit and writes the parts of it that are still missing.
    fn fetch_unit(
        &self,
        store: &Store,
        row: &StubRow,
        at: u64,
        minsize: u64,
        missing: &[(u64, u64)],
    ) -> FsResult<()> {
        // A crawler was admitted (demand priority, throttle) before it asked the store
        // for this unit (see `crawl_admission`): nothing sleeps here, under the file's
        // fill lock, where a client's read of the same file would wait behind it.
        let crawler = on_crawler_thread();
        let demand = self.demand();
        // One source read covers every missing piece of the unit; nothing at or past
        // `minsize` is read (those bytes were cut by a client truncate: zeros here).
        let from = missing.iter().map(|m| m.0).min().unwrap_or(at);
        let to = missing.iter().map(|m| m.1).max().unwrap_or(at);
        let read_to = to.min(minsize.max(from));
        let mut buffer = self.buffers.take((to - from) as usize);
        let data = &mut buffer[..(to - from) as usize];
        let result = if from < read_to {
            self.source
                .read_into(&row.src_path, from, &mut data[..(read_to - from) as usize])
        } else {
            Ok((0, None))
        };
        drop(demand);
        let got = match result {
            Ok((n, attr)) => {
                if let Some(a) = attr {
                    self.after_read
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(row.ino, (row.src_path.clone(), a));
                }
                n
            }
            Err(e) => {
                self.buffers.give(buffer);
                return self.give_up_or_retry(store, row.ino, &e, false);
            }
        };
        if (got as u64) < read_to - from {
            let _ = self.db.skip(
                &row.src_path,
                SourceErrorKind::Changed,
                &format!(
                    "source file shorter than listed: {got} bytes at offset {from}, expected {}",
                    read_to - from
                ),
            );
        }
        // What the source did not give (past `minsize`, or a source shorter than listed)
        // is written as zeros.
        data[got..].fill(0);
        self.track_fetch(store, row);
        let written = missing.iter().try_for_each(|&(s, e)| -> FsResult<()> {
            // One call per missing range: the store writes it in pieces itself.
            // Counts only what was still missing when written (a client may have
            // written or truncated meanwhile).
            let w = store.stub_write_completing(
                row.ino,
                s,
                &data[(s - from) as usize..(e - from) as usize],
            )?;
            self.counters
                .bytes_fetched
                .fetch_add(w.written, Ordering::Relaxed);
            if w.client_changed || w.completed_ctime.is_some() {
                let mut tracks = self.fetch_tracks.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(t) = tracks.get_mut(&row.ino).filter(|t| t.src == row.src_path) {
                    t.clean &= !w.client_changed;
                    t.completed_ctime = w.completed_ctime.or(t.completed_ctime);
                }
            }
            Ok(())
        });
        self.buffers.give(buffer);
        written?;
        if crawler {
            self.counters.crawl_fetches.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.demand_fetches.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Starts tracking the fetches into `row`'s file (see [`FetchTrack`]) at the first
    /// of them in this process: clean only if the file is wholly missing then (no earlier
    /// fetch, by a process whose findings are lost, wrote any of it).
    fn track_fetch(&self, store: &Store, row: &StubRow) {
        let mut tracks = self.fetch_tracks.lock().unwrap_or_else(|e| e.into_inner());
        if tracks.get(&row.ino).is_some_and(|t| t.src == row.src_path) {
            return;
        }
        let missing = store.stub_state(row.ino).missing;
        let whole = store
            .getattr(row.ino, None)
            .is_ok_and(|a| missing == [(0, a.size)]);
        tracks.insert(
            row.ino,
            FetchTrack {
                src: row.src_path.clone(),
                clean: whole,
                completed_ctime: None,
            },
        );
    }

    /// Whether `row` (the current row of its inode) was made for a file that is gone,
    /// its number now another file's (see [`replaced`]): then the row is dropped, and the
    /// removed file counted as deleted by clients; nothing of it applies to the new file.
    fn row_outlived_its_file(&self, store: &Store, row: &StubRow) -> FsResult<bool> {
        if !replaced(store, row.ino, row.ident.as_deref()) {
            return Ok(false);
        }
        tracing::warn!(
            ino = row.ino,
            src = %row.src_path,
            "migration row of a removed file dropped: its inode number now belongs to another file"
        );
        self.after_read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&row.ino);
        self.fetch_tracks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&row.ino);
        self.db.forget_object(row.ino, &row.src_path).map_err(io)?;
        Ok(true)
    }

    /// Admits the crawler's next data unit of `bytes` missing bytes: waits while demand
    /// fetches are in flight, then for the crawl's bandwidth budget. Called by the
    /// crawler before it enters the store's fill path (never under a fill lock); false
    /// if the crawl was paused or stopped meanwhile (the unit is not fetched now).
    pub(crate) fn crawl_admission(&self, bytes: u64) -> bool {
        self.wait_for_demand();
        self.throttle_wait(bytes)
    }

    /// A client's source call of this share while alive (nothing on a crawler thread):
    /// counted in `demand_in_flight`, which crawler calls wait for.
    pub(crate) fn demand(&self) -> Demand<'_> {
        if on_crawler_thread() {
            return Demand(None);
        }
        let n = &self.counters.demand_in_flight;
        n.fetch_add(1, Ordering::AcqRel);
        Demand(Some(n))
    }

    /// On a crawler thread about to make a listing or metadata call to the source, and
    /// holding nothing a client may wait for: waits while clients' calls are in flight
    /// (bounded, see `wait_for_demand`). One atomic load when no client is active.
    pub(crate) fn crawler_yield(&self) {
        if on_crawler_thread() && HOLDING.with(|h| h.get()) == 0 {
            self.wait_for_demand();
        }
    }

    /// Crawler fetches wait while demand fetches are in flight (bounded: never starve).
    fn wait_for_demand(&self) {
        let start = Instant::now();
        while self.counters.demand_in_flight.load(Ordering::Acquire) > 0
            && start.elapsed() < Duration::from_secs(2)
        {
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Gives back the charge of a unit that was admitted but not fetched (another thread
    /// claimed it first, or the crawl paused meanwhile): only bytes actually read count
    /// against `--rate`. Without it, threads sharing a large file's units paid for each
    /// unit several times and the crawl ran at a third of its limit (session-11 audit).
    pub(crate) fn throttle_refund(&self, bytes: u64) {
        let limit = self.throttle_limit.load(Ordering::Relaxed);
        if limit == 0 {
            return;
        }
        let mut next = self.throttle.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let given_back = next
            .checked_sub(Duration::from_secs_f64(bytes as f64 / limit as f64))
            .unwrap_or(now);
        *next = given_back.max(now);
    }

    /// Waits for the crawler's bandwidth budget; false if paused or stopped meanwhile.
    /// The unit reserves the next `bytes / limit` of the budget's time and waits for the
    /// start of its reservation; a change of the limit ends the wait.
    fn throttle_wait(&self, bytes: u64) -> bool {
        let halted = || self.stop.load(Ordering::Acquire) || self.paused.load(Ordering::Acquire);
        let limit = self.throttle_limit.load(Ordering::Relaxed);
        if limit == 0 {
            return !halted();
        }
        let start = {
            let mut next = self.throttle.lock().unwrap_or_else(|e| e.into_inner());
            let slot = (*next).max(Instant::now());
            *next = slot + Duration::from_secs_f64(bytes as f64 / limit as f64);
            slot
        };
        // In slices, so a pause, stop or new limit is not held up by the throttle.
        while Instant::now() < start
            && !halted()
            && self.throttle_limit.load(Ordering::Relaxed) == limit
        {
            std::thread::sleep((start - Instant::now()).min(Duration::from_millis(20)));
        }
        !halted()
    }
}

/// What [`Migration::copy_metadata_as`] copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CopyWhat {
    All,
    /// All but the default ACL (see [`Migration::copy_own_dir_metadata`]).
    OwnOfUnlistedDir,
}

/// Whether a metadata read (xattrs, ACL, streams, a symlink's target, a listed
/// directory's attributes) that failed with `e` is made again later instead of being
/// reported as skipped: the source was unreachable (a hung mount past its deadline, a
/// dropped server), which passes. Permanent refusals (permission denied, unsupported,
/// bad data) and `Io` (a protocol failure that may repeat forever) are reported.
fn metadata_retried(e: &SourceError) -> bool {
    e.kind == SourceErrorKind::Unreachable
}

/// Whether an entry the destination could not create may be created by a later try
/// (room freed, a device back): then its directory's listing fails and is retried
/// instead of the entry being skipped for good.
fn creation_may_succeed_later(e: FsError) -> bool {
    [
        libc::ENOSPC,
        libc::EDQUOT,
        libc::EIO,
        libc::ENOMEM,
        libc::EAGAIN,
    ]
    .contains(&e.errno())
}

/// Skip-report reason of an entry the destination refused for good: the error in words.
fn creation_skip_reason(e: FsError) -> String {
    format!(
        "could not create on the destination: {}",
        std::io::Error::from_raw_os_error(e.errno())
    )
}

/// How a source file changed while it was copied (see `Migration::source_changed`),
/// with the skip report's reason.
enum SourceChange {
    /// Other size or mtime than listed: the copy may be torn; `finish` fetches it again.
    Attributes(String),
    /// It cannot be stat'ed any more (gone, or unreadable).
    Unreadable(String),
}

/// How the skip report's reason for a file whose source changed while it was copied
/// begins (`finish` looks for it: such a copy may mix old and new bytes).
pub(crate) const CHANGED_DURING_COPY: &str =
    "source changed during migration although it should be read-only";

/// Skip-report reason of an entry the source lost after it was listed.
pub(crate) const REMOVED_AFTER_LISTING: &str = "removed on the source after listing";
/// Skip-report reason of an entry the source gained after its directory was listed.
pub(crate) const ADDED_AFTER_LISTING: &str =
    "added on the source after listing; not migrated (start a new share for it)";

/// Migration-database commits after which a completion makes them durable (one group
/// commit: data, store rows, then this database's WAL), at most once per
/// [`GROUP_COMMIT_INTERVAL`] unless [`COMMITS_FORCING_GROUP_COMMIT`] have gathered.
const COMMITS_PER_GROUP_COMMIT: u64 = 1000;
const GROUP_COMMIT_INTERVAL: Duration = Duration::from_secs(5);
/// Bounds the WAL (a few KiB per commit) however fast completions come.
const COMMITS_FORCING_GROUP_COMMIT: u64 = 20_000;

/// The `meta` key of the source's identity (see `Source::identity`).
const SOURCE_IDENTITY: &str = "source_identity";

/// The state database's file name inside a share's state directory.
const DB_FILE: &str = "migrate.db";

/// The backing identity of file `ino` now, encoded (see [`BackingIdentity`]); `None`
/// for what is not a file of the store or lives on a file system without a stamp.
pub(crate) fn file_identity(store: &Store, ino: Ino) -> Option<Vec<u8>> {
    let (path, slot) = {
        let ns = store.ns();
        let f = ns.files.get(&ino)?;
        let rel = ns.file_path(ino)?;
        (
            store.tiers[f.tier as usize].backing(&rel),
            ns.slots[f.tier as usize],
        )
    };
    // Birth time where the file system has one (one `statx`), else the generation.
    let probe = |stamp| BackingIdentity {
        slot,
        bino: 0,
        stamp,
    };
    let (bino, stamp) = probe(Stamp::Birth(0, 0))
        .current(&path)
        .or_else(|| probe(Stamp::Generation(0)).current(&path))?;
    Some(BackingIdentity { slot, bino, stamp }.encode())
}

/// Whether the file holding number `ino` now is certainly another than the one whose
/// identity `ident` a row recorded: same tier slot and backing inode number, another
/// birth time or generation — the row's file is gone and the file system gave its
/// number to a new one. Unknown identities, and files found elsewhere (moved to another
/// tier: the number followed them), are taken as the same.
pub(crate) fn replaced(store: &Store, ino: Ino, ident: Option<&[u8]>) -> bool {
    let Some(id) = ident.and_then(BackingIdentity::decode) else {
        return false;
    };
    let (slot, bino, path) = {
        let ns = store.ns();
        let (Some(f), Some(rel)) = (ns.files.get(&ino), ns.file_path(ino)) else {
            return false;
        };
        (
            ns.slots[f.tier as usize],
            f.bino,
            store.tiers[f.tier as usize].backing(&rel),
        )
    };
    id.replaced_at(slot, bino, &path)
}

fn ns_since_epoch(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

/// `<state_dir>/migrate/<name>`: the state directory of one share.
/// The kind of skip-report entries that are notices (something migrated differently,
/// e.g. owners not kept), not entries left out: `finish` does not count them as skipped.
pub const NOTICE_KIND: &str = "Notice";

/// Meta key: the owner notice of this share is in its report.
const OWNER_NOTICE_META: &str = "owner_notice";

fn share_dir(state_dir: &Path, name: &str) -> PathBuf {
    state_dir.join("migrate").join(name)
}

fn ns_of(t: Timestamp) -> i64 {
    t.secs.saturating_mul(1_000_000_000) + i64::from(t.nanos)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The store directory a share is migrated into (created if missing).
fn ensure_target(store: &Store, target: &Path) -> Result<Ino, String> {
    let mut ino = ROOT_INO;
    for c in target.components() {
        let std::path::Component::Normal(name) = c else {
            return Err(format!(
                "target {} must be a relative path",
                target.display()
            ));
        };
        ino = match store.lookup(ino, name) {
            Ok(a) => {
                store.forget(a.ino, 1);
                if a.kind != FileKind::Dir {
                    return Err(format!(
                        "target {}: {} is not a directory",
                        target.display(),
                        name.to_string_lossy()
                    ));
                }
                a.ino
            }
            Err(FsError::NOENT) => {
                let a = store
                    .mkdir(ino, name, 0o755, 0, Caller::ROOT)
                    .map_err(|e| format!("create target {}: {e:?}", target.display()))?;
                store.forget(a.ino, 1);
                a.ino
            }
            Err(e) => return Err(format!("target {}: {e:?}", target.display())),
        };
    }
    Ok(ino)
}

/// A fresh share is never started into a directory that already holds entries: its
/// first listing would take them for entries of a half-done listing and make stubs of
/// them again, so the source's bytes would overwrite them (e.g. a second start after a
/// `finish`). An unlisted target is empty here; it is this share's own dummy (a start
/// interrupted before it was recorded) or else another share's, which is refused. A
/// `lost+found` directory at the root of a tier's file system does not count.
fn check_target_empty(
    store: &Store,
    ino: Ino,
    db: &MigrationDb,
    target: &Path,
) -> Result<(), String> {
    let not_empty = || {
        format!(
            "target /{} is not empty: migrate into a new or empty directory",
            target.display()
        )
    };
    if store.stub_state(ino).unlisted_dir {
        let ours = db.get(ino).map_err(|e| e.to_string())?.is_some();
        return if ours { Ok(()) } else { Err(not_empty()) };
    }
    let ns = store.ns();
    let children = ns.dirs.get(&ino).map(|d| &d.children);
    let holds_entries = children.is_some_and(|c| {
        c.iter().any(|(name, child)| {
            !(ino == ROOT_INO && name == OsStr::new("lost+found") && ns.dirs.contains_key(child))
        })
    });
    if holds_entries {
        Err(not_empty())
    } else {
        Ok(())
    }
}

/// Removes the state directory a refused fresh start created (nothing else was in it,
/// or only a caller's files written before the start: those are left).
fn remove_new_share_dir(dir: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.join(format!("{DB_FILE}{suffix}")));
    }
    let _ = std::fs::remove_dir(dir);
}

/// All migrations of one store: the store's single stub filler, dispatching each inode
/// to the migration whose database holds it (N shares into one store).
#[derive(Default)]
pub struct Migrations {
    list: Mutex<Vec<Arc<Migration>>>,
    /// One listing per directory at a time; the filler's own re-entry passes.
    dir_gate: DirFillGate,
}

impl Migrations {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Adds a migration; register `self` once with `Store::set_stub_filler`.
    pub fn add(&self, m: Arc<Migration>) {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).push(m);
    }

    pub fn all(&self) -> Vec<Arc<Migration>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Detaches migration `name` (after `finish`): the filler no longer dispatches to it,
    /// and once the caller drops the returned handle (and any crawler of it is stopped)
    /// its source and its database connection are closed. When no migration is left,
    /// `self` is unregistered from `store` (nothing is a stub any more); a later
    /// migration registers it again with `Store::set_stub_filler`.
    pub fn remove(&self, store: &Store, name: &str) -> Option<Arc<Migration>> {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        let at = list.iter().position(|m| m.name() == name)?;
        let m = list.remove(at);
        if list.is_empty() {
            store.unset_stub_filler(self);
            // Nothing fetches any more: the store database checkpoints by itself again.
            if let Err(e) = store.end_fetch_ordering() {
                tracing::warn!(errno = e.errno(), "fetch ordering not ended");
            }
        }
        Some(m)
    }

    /// A client reads the xattrs of directory `ino`, which has a stub row: unlisted, its
    /// own xattrs and ACL are copied from the source (once; no listing: `ls -l` reads
    /// every entry's ACL), so `getfattr`, `getfacl` and the kernel's ACL check see the
    /// source's; listed with its metadata still to do (a crash, or an outage of its
    /// copy), that copy is made now (as the next reconcile would), so a client's change
    /// that follows is never overwritten by it. Under the directory's fill gate: no
    /// listing runs meanwhile, and one that ran first leaves nothing to do.
    fn fill_dir_meta(&self, store: &Store, m: &Migration, ino: Ino) -> FsResult<()> {
        let _demand = m.demand();
        m.crawler_yield();
        let dummy_dir = |m: &Migration| -> FsResult<Option<StubRow>> {
            Ok(m.owned_row(ino)?.filter(|r| r.kind == StubKind::DummyDir))
        };
        if store.stub_state(ino).unlisted_dir {
            let Some(_gate) = self.dir_gate.enter(ino) else {
                return Ok(()); // this thread's own listing of `ino` copies it
            };
            let _held = Holding::new();
            if store.stub_state(ino).unlisted_dir {
                return match dummy_dir(m)? {
                    Some(row) => m.copy_own_dir_metadata(store, &row),
                    None => Ok(()),
                };
            }
            // Listed while we waited for the gate: as a listed one (its metadata gate;
            // the fill gate's mark on this thread is gone with `_gate`).
        }
        match dummy_dir(m)? {
            Some(row) => m.finish_pending_dir_meta(store, &row),
            None => Ok(()),
        }
    }

    fn owner(&self, ino: Ino) -> FsResult<Option<(Arc<Migration>, StubRow)>> {
        for m in self.all() {
            if let Some(row) = m.owned_row(ino)? {
                return Ok(Some((m, row)));
            }
        }
        Ok(None)
    }
}

impl StubFiller for Migrations {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        // A client's listing is demand from the start (also while it waits for another
        // caller's listing of the directory); a crawler's waits for clients' calls first,
        // before it holds the directory.
        let owner = self.owner(ino)?.map(|(m, _)| m);
        let _demand = owner.as_ref().map(|m| m.demand());
        if let Some(m) = &owner {
            m.crawler_yield();
        }
        let Some(_listing) = self.dir_gate.enter(ino) else {
            // Re-entered from this thread's own listing of `ino`: go on.
            return Ok(());
        };
        let _held = Holding::new();
        if !store.stub_state(ino).unlisted_dir {
            // Another caller listed it while we waited.
            return Ok(());
        }
        match self.owner(ino)? {
            Some((m, row)) if row.kind == StubKind::DummyDir => {
                if m.commit_if_pending(store, ino)? {
                    return Ok(());
                }
                m.expand_dir(store, ino, &row)
            }
            // Not ours (or already done): nothing to list.
            _ => store.stub_dir_listed(ino),
        }
    }

    fn fill_range(
        &self,
        store: &Store,
        ino: Ino,
        _path: &Path,
        offset: u64,
        len: u64,
    ) -> FsResult<()> {
        match self.owner(ino)? {
            Some((m, row)) => m.fetch_range(store, &row, offset, len),
            None => {
                tracing::error!(ino, "missing range of an inode no migration knows");
                Err(FsError::IO)
            }
        }
    }

    /// A dummy file's metadata is copied on first reference to its xattrs; so is a
    /// dummy directory's own (see [`Migrations::fill_dir_meta`]).
    fn fill_meta(&self, store: &Store, ino: Ino) -> FsResult<()> {
        match self.owner(ino)? {
            Some((m, row)) if row.kind == StubKind::DummyFile => m.ensure_partial(store, &row),
            Some((m, row)) if row.kind == StubKind::DummyDir => self.fill_dir_meta(store, &m, ino),
            _ => Ok(()),
        }
    }

    fn removed(&self, store: &Store, ino: Ino) {
        for m in self.all() {
            if let Err(e) = m.forget_if_gone(store, ino) {
                tracing::warn!(ino, errno = e.errno(), "stub removal not recorded");
            }
        }
    }

    /// The owner's state database is synced (group commit: one fsync of its WAL covers
    /// every change committed so far, e.g. this file's dummy → partial step).
    fn sync_state(&self, _store: &Store, ino: Ino) -> FsResult<()> {
        match self.owner(ino)? {
            Some((m, _)) => m.db.sync().map_err(io),
            None => Ok(()),
        }
    }

    fn renamed(&self, _store: &Store, ino: Ino, is_dir: bool) {
        for m in self.all() {
            m.notify_crawler_of_rename(ino, is_dir);
        }
    }
}
