//! SMB 2/3 straight from user space with the `smb` crate (no kernel cifs mount).
//!
//! What the protocol gives, and therefore what this source reports:
//! - Names are UTF-16 on the wire: every name is valid UTF-8 here. A server decides what
//!   to do with names it cannot express; Samba hides entries whose Unix name is not valid
//!   in its `unix charset` (they are invisible to every SMB client, not just to us).
//! - No Unix mode/uid/gid (the SMB3 POSIX extensions are not spoken by this client):
//!   permissions are synthesised from the DOS attributes (directories 0755, files 0644,
//!   read-only clears the write bits) and uid/gid are the ones configured for the share.
//!   The real owner, group and DACL come from [`Source::acl`] as an NT security descriptor.
//! - Samba follows symlinks on the server and shows FIFOs as empty files, so
//!   [`SourceFeatures::symlinks`] and [`SourceFeatures::special_files`] are false.
//! - Extended attributes are SMB EAs; Samba maps a Unix `user.NAME` xattr to the EA
//!   `NAME`, and this source reports it back as `user.NAME`.
//! - Alternate data streams are listed and read where the server has them (Samba with
//!   `vfs objects = streams_xattr`).
//! - Directory listings carry no link count: [`Source::read_dir`] reports nlink 1 for
//!   files and [`Source::stat`] (FileStandardInformation) gives the real count for files;
//!   Samba reports 1 for every directory.
//!
//! How it keeps the server busy (each request costs a network round trip):
//! - Several sessions, each on its own TCP connection ([`SmbConfig::connections`]; Samba
//!   serves each connection with a process of its own); a call takes the session with
//!   the fewest calls running. Each session also carries many requests at once (READs
//!   in flight, queries sent together).
//! - One handle per object for everything asked about it at once: the first of a
//!   file's EA / security descriptor / stream calls opens it once and sends the queries
//!   together; listing a directory also queries its attributes, EAs and descriptor on
//!   the listing's handle. The answers nobody asked for yet wait briefly for the calls
//!   that follow (see `prefetch`); one fetch per file, however many threads ask.
//! - Queries whose answer is already known are not sent: streams on a share whose file
//!   system has no named streams (asked once at connect), EAs of a file whose listing
//!   entry says EaSize 0 once the server has shown that it fills that field in.
//! - The handle of a file's metadata fetch is kept for its first read (see `handles`),
//!   which then needs no open of its own.
//! - Every regular file of a listing is queued for background threads (one per two
//!   sessions) that fetch its metadata on idle sessions, so the crawl's metadata pass
//!   finds it waiting; they wait for an idle session first, so a client's call does not
//!   queue behind them.
//! - Reads keep [`SmbConfig::parallel_reads`] READs of up to 1 MiB in flight (a sliding
//!   window) straight into the caller's buffer ([`Source::read_into`]), and ask for the
//!   file's attributes together with the last READ instead of a separate stat. Handles
//!   are closed in the background.
//! - The crate's receive thread waits for a reply as long as a request may (see
//!   `link::set_receive_timeout`: its own 100 ms poll lost the framing of replies that
//!   stalled half-way).
//! - A server found gone shuts every session at once, so the next call reconnects
//!   instead of each session waiting out the timeout on its own.

mod handles;
mod link;
mod prefetch;
mod read;

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use binrw::BinWrite;
use kaiso_store::migrate::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
use smb::binrw_util::file_time::FileTime;
use smb::{
    AdditionalInfo, FileAccessMask, FileAllInformation, FileAttributes,
    FileIdBothDirectoryInformation, FileStreamInformation, Resource, UncPath,
};

use handles::OpenFiles;
use link::{Link, Requests, drop_in_background, is_unreachable};
use prefetch::{Fetched, Prefetch};
use read::{ReadOutcome, read_pieces};

/// The bytes one SMB2 credit pays for; a READ of N bytes costs N / 64 KiB credits.
pub const SMB_CREDIT_BYTES: usize = 64 << 10;

/// The largest READ this source sends: 16 credits (1 MiB), and never more than the
/// server's negotiated maximum. The `smb` crate (0.12) waits for a READ's credits without
/// a timeout, and a session holds only the credits the server granted so far (Samba:
/// 33 after the session setup, then at most 32 more with each response, up to what the
/// client asks for; see `link`): a READ costing more than a session holds while nothing
/// else is in flight waits forever (a 4 MiB READ, 64 credits, did on a fresh session).
/// 16 credits always fit what a session holds after its setup; several READs are kept in
/// flight instead of larger ones.
pub const SMB_MAX_READ_PIECE: usize = 16 * SMB_CREDIT_BYTES;

/// How long one SMB request may go unanswered by default before the call fails.
pub const SMB_DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// Sessions (TCP connections) a source opens by default.
pub const SMB_DEFAULT_CONNECTIONS: usize = 8;

/// Where and how to reach an SMB share.
#[derive(Clone, Debug)]
pub struct SmbConfig {
    /// Server IP address or name.
    pub host: String,
    /// TCP port (445 unless the server listens elsewhere).
    pub port: u16,
    pub share: String,
    pub user: String,
    pub password: String,
    /// uid/gid given to every object (SMB has no Unix owners; see the module docs).
    pub uid: u32,
    pub gid: u32,
    /// Size of one READ request, at most [`SMB_MAX_READ_PIECE`] (see there).
    pub read_size: usize,
    /// READ requests kept in flight for one `read` call.
    pub parallel_reads: usize,
    /// Sessions, each on its own TCP connection, that concurrent calls share. They are
    /// opened as calls need them (the first one by [`SmbSource::connect`]).
    pub connections: usize,
    /// Bound on the TCP connect and on the wait for each SMB response. A call whose
    /// request is not answered in time fails as unreachable (naming the server), the
    /// connection is dropped, and the next call connects again.
    pub timeout: Duration,
}

impl SmbConfig {
    pub fn new(
        host: impl Into<String>,
        share: impl Into<String>,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        Self {
            host: host.into(),
            port: 445,
            share: share.into(),
            user: user.into(),
            password: password.into(),
            uid: 0,
            gid: 0,
            read_size: SMB_MAX_READ_PIECE,
            parallel_reads: 16,
            connections: SMB_DEFAULT_CONNECTIONS,
            timeout: SMB_DEFAULT_TIMEOUT,
        }
    }

    /// `host:port`, the name errors give for the server.
    fn server(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// An SMB share read over several authenticated sessions, each reconnected after a
/// failure.
pub struct SmbSource {
    shared: Arc<Shared>,
    /// Files whose metadata the prefetch threads fetch ahead; started by the first
    /// listing, ended when the source is dropped (the threads see the channel close).
    prefetch_jobs: OnceLock<SyncSender<SourcePath>>,
}

/// Threads fetching listed files' metadata ahead of the calls for it: one per two
/// sessions, so half the sessions at least have no background work queued on them, and
/// each job waits for an idle session: the calls somebody waits for (a client's, the
/// crawl's) go first.
const PREFETCH_THREADS_PER_2_LINKS: usize = 1;
/// How long a prefetch job waits for an idle session before it takes the least busy one
/// (so a busy crawl still sees its files fetched ahead).
const PREFETCH_YIELD: Duration = Duration::from_millis(5);
/// Handles kept open from metadata fetches for the files' reads, per source.
const KEPT_HANDLES: usize = 2048;
/// How many more calls than the least busy session a kept handle's session may be
/// running for a read to still use that handle (instead of opening the file anew).
const KEPT_HANDLE_BUSY_SLACK: usize = 4;
/// Files queued for them at most; more are left to the engine's own calls.
const PREFETCH_QUEUE: usize = 8192;

/// What the calls and the prefetch threads share.
struct Shared {
    config: SmbConfig,
    share: UncPath,
    /// The sessions; `None` or broken means the next call on that slot connects again.
    links: Arc<[Slot]>,
    /// Round-robin cursor over `links`.
    next_link: AtomicUsize,
    prefetch: Prefetch,
    /// Handles of metadata fetches kept for the files' first reads.
    open_files: OpenFiles,
    /// What the share's file system says it supports (asked once at connect).
    caps: OnceLock<ShareCaps>,
    /// What the calls cost in server round trips (see [`SmbStats`]).
    stats: Counters,
    /// Requests sent, by kind, on every session (see [`SmbStats`]).
    requests: Arc<Requests>,
    /// Set once a listing showed a nonzero EaSize: this server computes the EA sizes of
    /// its listings (ksmbd, for one, reports 0 for every file), so 0 means "no EAs".
    listing_ea_sizes: AtomicBool,
}

/// Counts of what a source sent, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmbStats {
    /// Opens of a file or directory to fetch its EAs, descriptor and streams.
    pub metadata_fetches: u64,
    /// Reads of a main stream on the handle kept from its metadata fetch (no open).
    pub reads_on_kept_handles: u64,
    /// Reads that opened the file themselves.
    pub reads_opened: u64,
    /// Reads of a later unit on the handle kept from the file's previous read.
    pub reads_continued: u64,
    /// Requests sent after the session setups, by kind (each one message and its reply;
    /// requests sent at the same time share a round trip). CREATE:
    pub creates: u64,
    /// QUERY_INFO (attributes, EAs, security descriptor, streams, file system).
    pub queries: u64,
    /// Directory listings; each is one QUERY_DIRECTORY per batch of entries plus the one
    /// answered "no more files".
    pub listings: u64,
    /// READ requests.
    pub reads: u64,
    /// CLOSE requests (sent in the background: no call waits for them).
    pub closes: u64,
}

#[derive(Default)]
struct Counters {
    metadata_fetches: AtomicU64,
    reads_on_kept_handles: AtomicU64,
    reads_opened: AtomicU64,
    reads_continued: AtomicU64,
}

/// The share's file system capabilities that spare per-file queries.
#[derive(Clone, Copy, Debug)]
struct ShareCaps {
    /// Named streams exist (FILE_NAMED_STREAMS): without them a file's stream list is
    /// known to be empty and is not asked for.
    named_streams: bool,
    /// EAs are stored (FILE_SUPPORTS_EXTENDED_ATTRIBUTES; Windows says so, Samba does
    /// not): a listing's EaSize of 0 then means the file has no EAs, and they are not
    /// asked for.
    eas: bool,
}

impl ShareCaps {
    /// What is assumed when the server does not say: ask for everything.
    const UNKNOWN: Self = Self {
        named_streams: true,
        eas: false,
    };
}

/// One session slot of a source.
type Slot = Mutex<Option<Arc<Link>>>;

/// The slot, unless it is locked right now (being connected or handed out).
fn try_slot(slot: &Slot) -> Option<std::sync::MutexGuard<'_, Option<Arc<Link>>>> {
    match slot.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

// NTSTATUS values this source distinguishes.
const STATUS_NO_SUCH_FILE: u32 = 0xC000_000F;
const STATUS_OBJECT_NAME_NOT_FOUND: u32 = 0xC000_0034;
const STATUS_OBJECT_PATH_NOT_FOUND: u32 = 0xC000_003A;
const STATUS_ACCESS_DENIED: u32 = 0xC000_0022;
const STATUS_NO_EAS_ON_FILE: u32 = 0xC000_0052;
const STATUS_EAS_NOT_SUPPORTED: u32 = 0xC000_004F;
const STATUS_NOT_SUPPORTED: u32 = 0xC000_00BB;
const STATUS_FILE_IS_A_DIRECTORY: u32 = 0xC000_00BA;
const STATUS_NOT_A_DIRECTORY: u32 = 0xC000_0103;
const STATUS_LOGON_FAILURE: u32 = 0xC000_006D;
const STATUS_BAD_NETWORK_NAME: u32 = 0xC000_00CC;
const STATUS_NO_MORE_FILES: u32 = 0x8000_0006;
const FILE_ATTRIBUTE_READONLY: u32 = 0x1;

/// A call's failure before it becomes a [`SourceError`]: what failed ("" = the call's
/// own name) and the crate's error.
type Failure = (String, smb::Error);

impl SmbSource {
    /// Connects and authenticates (NTLM) to `\\host\share`. One session is opened now (so
    /// a wrong address or password fails here); the others meanwhile in the background.
    pub fn connect(config: SmbConfig) -> SourceResult<Self> {
        Ok(Self {
            shared: Arc::new(Shared::connect(config)?),
            prefetch_jobs: OnceLock::new(),
        })
    }

    /// What this source sent so far.
    pub fn stats(&self) -> SmbStats {
        let (c, r) = (&self.shared.stats, &self.shared.requests);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SmbStats {
            metadata_fetches: get(&c.metadata_fetches),
            reads_on_kept_handles: get(&c.reads_on_kept_handles),
            reads_opened: get(&c.reads_opened),
            reads_continued: get(&c.reads_continued),
            creates: get(&r.creates),
            queries: get(&r.queries),
            listings: get(&r.listings),
            reads: get(&r.reads),
            closes: get(&r.closes),
        }
    }

    /// Queues the listed regular files of `dir` for the prefetch threads, which fetch
    /// each one's EAs, security descriptor and streams (two round trips, on sessions
    /// otherwise idle) before the engine asks: the crawl then finds them waiting.
    fn prefetch_listed(&self, dir: &SourcePath, entries: &[SourceEntry]) {
        let jobs = self.prefetch_jobs.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<SourcePath>(PREFETCH_QUEUE);
            let rx = Arc::new(Mutex::new(rx));
            let threads =
                (self.shared.config.connections * PREFETCH_THREADS_PER_2_LINKS / 2).max(1);
            for _ in 0..threads {
                let (rx, shared) = (rx.clone(), Arc::downgrade(&self.shared));
                let _ = std::thread::Builder::new()
                    .name("smb-prefetch".into())
                    .spawn(move || {
                        loop {
                            let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            let Ok(path) = next else { break };
                            let Some(shared) = shared.upgrade() else {
                                break;
                            };
                            shared.prefetch_one(&path);
                        }
                    });
            }
            tx
        });
        for e in entries {
            if e.attr.kind != FileKind::Regular {
                continue;
            }
            let Ok(path) = dir.join(&e.name) else {
                continue;
            };
            if jobs.try_send(path).is_err() {
                break; // queue full: the engine's calls fetch the rest themselves
            }
        }
    }
}

/// What the source sent over its life, for diagnostics (`KAISO_LOG=kaiso_source=debug`).
impl Drop for SmbSource {
    fn drop(&mut self) {
        tracing::debug!(stats = ?self.stats(), "smb: source closed");
    }
}

impl Shared {
    /// Fetches one file's metadata ahead unless it is already there or on its way; a
    /// failure leaves nothing (the engine's own call then reports it).
    fn prefetch_one(&self, path: &SourcePath) {
        if !self.prefetch.claim(path, true) {
            return;
        }
        let fetched = self.fetch_metadata(path, true).unwrap_or_default();
        self.prefetch.finish(path, fetched);
    }

    fn connect(config: SmbConfig) -> SourceResult<Self> {
        let root = SourcePath::root();
        if config.read_size == 0 || config.parallel_reads == 0 || config.connections == 0 {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                &root,
                "read_size, parallel_reads and connections must be > 0",
            ));
        }
        if config.timeout.is_zero() {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                &root,
                "the SMB timeout must be > 0 (0 would wait forever)",
            ));
        }
        let share =
            UncPath::from_str(&format!(r"\\{}\{}", config.host, config.share)).map_err(|e| {
                SourceError::new(SourceErrorKind::Invalid, &root, format!("share name: {e}"))
            })?;
        let source = Self {
            links: (0..config.connections).map(|_| Mutex::new(None)).collect(),
            next_link: AtomicUsize::new(0),
            prefetch: Prefetch::default(),
            open_files: OpenFiles::new(KEPT_HANDLES),
            caps: OnceLock::new(),
            listing_ea_sizes: AtomicBool::new(false),
            stats: Counters::default(),
            requests: Arc::default(),
            config,
            share,
        };
        let first = source.link_in(0, &root)?;
        // One round trip now spares one or two queries per file later; a server that
        // does not answer gets every query.
        let caps = first
            .fs_attributes(&source.share)
            .map(|a| ShareCaps {
                named_streams: a.named_streams(),
                eas: a.supports_extended_attributes(),
            })
            .unwrap_or(ShareCaps::UNKNOWN);
        tracing::debug!(?caps, "smb: share capabilities");
        let _ = source.caps.set(caps);
        // The other sessions connect meanwhile, so the first concurrent calls do not each
        // wait for a session setup (several round trips). A slot whose connect fails here
        // is connected again by the next call on it, which reports the error.
        for i in 1..source.links.len() {
            let (links, config, share, requests) = (
                source.links.clone(),
                source.config.clone(),
                source.share.clone(),
                source.requests.clone(),
            );
            let _ = std::thread::Builder::new()
                .name("smb-connect".into())
                .spawn(move || {
                    let mut slot = links[i].lock().unwrap_or_else(|p| p.into_inner());
                    if slot.is_none()
                        && let Ok(l) = Link::connect(&config, &share, requests)
                    {
                        *slot = Some(Arc::new(l));
                    }
                });
        }
        Ok(source)
    }

    /// The live session with the fewest calls running, the next in turn among equals. A
    /// slot that is being connected (locked for up to the timeout) is passed over; only
    /// if none is live does the call wait for its own slot (connecting it if needed).
    fn link(&self, path: &SourcePath) -> SourceResult<Arc<Link>> {
        let i = self.next_link.fetch_add(1, Ordering::Relaxed) % self.links.len();
        match self.least_busy(i) {
            Some(l) => Ok(l),
            None => self.link_in(i, path),
        }
    }

    /// The live session with the fewest calls running, scanning from slot `from`.
    fn least_busy(&self, from: usize) -> Option<Arc<Link>> {
        let n = self.links.len();
        let mut best: Option<Arc<Link>> = None;
        for k in 0..n {
            if let Ok(slot) = self.links[(from + k) % n].try_lock()
                && let Some(l) = slot.as_ref()
                && !l.broken.load(Ordering::SeqCst)
            {
                let busy = l.busy.load(Ordering::SeqCst);
                if busy == 0 {
                    return Some(l.clone());
                }
                if best
                    .as_ref()
                    .is_none_or(|b| busy < b.busy.load(Ordering::SeqCst))
                {
                    best = Some(l.clone());
                }
            }
        }
        best
    }

    /// A session for background work: an idle one, waiting up to [`PREFETCH_YIELD`] for
    /// one while every session has calls running (the calls of clients and the crawl go
    /// first), then the least busy.
    fn idle_link(&self, path: &SourcePath) -> SourceResult<Arc<Link>> {
        let started = std::time::Instant::now();
        loop {
            let i = self.next_link.fetch_add(1, Ordering::Relaxed) % self.links.len();
            match self.least_busy(i) {
                Some(l) if l.busy.load(Ordering::SeqCst) == 0 => return Ok(l),
                Some(l) if started.elapsed() >= PREFETCH_YIELD => return Ok(l),
                Some(_) => std::thread::sleep(Duration::from_micros(500)),
                None => return self.link_in(i, path),
            }
        }
    }

    /// The live session of slot `i`, connecting a new one if there is none or the last
    /// one broke. Only this slot waits for the connect.
    fn link_in(&self, i: usize, path: &SourcePath) -> SourceResult<Arc<Link>> {
        let mut slot = self.links[i].lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = slot.as_ref()
            && !l.broken.load(Ordering::SeqCst)
        {
            return Ok(l.clone());
        }
        if let Some(old) = slot.take() {
            drop_in_background(old);
        }
        let started = std::time::Instant::now();
        let l = match Link::connect(&self.config, &self.share, self.requests.clone()) {
            Ok(l) => Arc::new(l),
            Err(e) => {
                // Unlocked first: an unreachable server shuts every slot, this one too.
                drop(slot);
                return Err(self.error(path, &format!("connect to share {}", self.share), &e));
            }
        };
        tracing::debug!(slot = i, took = ?started.elapsed(), "smb: session connected");
        *slot = Some(l.clone());
        Ok(l)
    }

    /// The server is gone or silent: every session is shut now (their pending requests
    /// fail at once) and reconnected by the next call on it, instead of each waiting out
    /// the timeout on its own. What was fetched ahead is forgotten.
    /// A slot locked meanwhile is skipped: it is being connected (a session that fails
    /// on its own) or handed out this instant (its call notices the server by itself);
    /// waiting for it could mean waiting for a connect to a silent server.
    fn shut_all(&self) {
        for slot in self.links.iter().filter_map(try_slot) {
            if let Some(l) = slot.as_ref() {
                l.shut();
            }
        }
        self.prefetch.clear();
        self.open_files.close_all();
    }

    /// Runs one source call on a live session; errors name the server.
    fn call<T>(
        &self,
        path: &SourcePath,
        what: &str,
        f: impl FnOnce(&Arc<Link>) -> Result<T, Failure>,
    ) -> SourceResult<T> {
        self.call_on(self.link(path)?, path, what, f)
    }

    /// Like [`Shared::call`] for work nobody waits for yet: on an idle session.
    fn call_in_background<T>(
        &self,
        path: &SourcePath,
        what: &str,
        f: impl FnOnce(&Arc<Link>) -> Result<T, Failure>,
    ) -> SourceResult<T> {
        self.call_on(self.idle_link(path)?, path, what, f)
    }

    fn call_on<T>(
        &self,
        link: Arc<Link>,
        path: &SourcePath,
        what: &str,
        f: impl FnOnce(&Arc<Link>) -> Result<T, Failure>,
    ) -> SourceResult<T> {
        let _busy = link.busy_guard();
        let started = std::time::Instant::now();
        let r = f(&link).map_err(|(op, e)| {
            let op = if op.is_empty() { what.to_string() } else { op };
            self.error(path, &op, &e)
        });
        tracing::trace!(%path, what, took = ?started.elapsed(), ok = r.is_ok(), "smb call");
        r
    }

    /// Opens `path` with `access`, runs `query` on the handle and closes it: one call's
    /// worth of a single object query (the query's own failure is left to the caller).
    fn query_one<T>(
        &self,
        path: &SourcePath,
        what: &str,
        access: FileAccessMask,
        query: impl FnOnce(&Link, &Resource) -> T,
    ) -> SourceResult<T> {
        let p = Self::win_path(path)?;
        self.call(path, what, |l| {
            let r = l.open(&self.share, &p, access)?;
            let out = query(l, &r);
            l.close(r);
            Ok(out)
        })
    }

    /// The source error for `e`; an unreachable server also shuts every session.
    fn error(&self, path: &SourcePath, what: &str, e: &smb::Error) -> SourceError {
        let mut err = smb_error(path, what, e);
        if err.kind == SourceErrorKind::Unreachable {
            self.shut_all();
            let why = match e {
                smb::Error::OperationTimeout(..) => {
                    format!("no answer within {:?}", self.config.timeout)
                }
                _ => e.to_string(),
            };
            err = SourceError::new(
                SourceErrorKind::Unreachable,
                path,
                format!(
                    "SMB server {} unreachable ({what}): {why}; the next call reconnects",
                    self.config.server()
                ),
            );
        }
        err
    }

    /// The share-relative Windows path of `path`.
    fn win_path(path: &SourcePath) -> SourceResult<String> {
        let s = std::str::from_utf8(path.as_bytes()).map_err(|_| {
            SourceError::new(
                SourceErrorKind::Invalid,
                path,
                "SMB names must be valid UTF-8 (UTF-16 on the wire)",
            )
        })?;
        Ok(s.replace('/', "\\"))
    }

    fn read_access() -> FileAccessMask {
        FileAccessMask::new().with_generic_read(true)
    }

    /// The parts of the security descriptor that [`Source::acl`] reports.
    fn sd_info() -> AdditionalInfo {
        AdditionalInfo::new()
            .with_owner_security_information(true)
            .with_group_security_information(true)
            .with_dacl_security_information(true)
    }

    fn attr_from_all(&self, info: &FileAllInformation) -> SourceAttr {
        let attrs = info.basic.file_attributes;
        let dir = bool::from(info.standard.directory) || attrs.directory();
        self.make_attr(
            dir,
            attrs,
            info.standard.end_of_file,
            info.standard.number_of_links,
            info.internal.index_number,
            [
                &info.basic.last_access_time,
                &info.basic.last_write_time,
                &info.basic.change_time,
                &info.basic.creation_time,
            ],
        )
    }

    fn make_attr(
        &self,
        dir: bool,
        attrs: FileAttributes,
        size: u64,
        nlink: u32,
        ino: u64,
        times: [&FileTime; 4],
    ) -> SourceAttr {
        let dos = u32::from_le_bytes(attrs.into_bytes());
        let mut perm = if dir { 0o755 } else { 0o644 };
        if dos & FILE_ATTRIBUTE_READONLY != 0 {
            perm &= !0o222;
        }
        SourceAttr {
            kind: if dir {
                FileKind::Directory
            } else {
                FileKind::Regular
            },
            perm,
            uid: self.config.uid,
            gid: self.config.gid,
            size: if dir { 0 } else { size },
            nlink,
            ino,
            rdev: (0, 0),
            atime: unix_time(times[0]),
            mtime: unix_time(times[1]),
            ctime: unix_time(times[2]),
            btime: Some(unix_time(times[3])),
            dos_attributes: Some(dos),
        }
    }

    /// EAs as `user.NAME` xattrs, sorted; "no EAs" is an empty list.
    fn eas_result(
        &self,
        path: &SourcePath,
        r: smb::Result<Vec<(Vec<u8>, Vec<u8>)>>,
    ) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let eas = match r {
            Ok(eas) => eas,
            Err(e)
                if matches!(
                    status_of(&e),
                    Some(STATUS_NO_EAS_ON_FILE | STATUS_EAS_NOT_SUPPORTED | STATUS_NOT_SUPPORTED)
                ) =>
            {
                Vec::new()
            }
            Err(e) => return Err(self.error(path, "query EAs", &e)),
        };
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = eas
            .into_iter()
            .map(|(name, value)| {
                let mut n = b"user.".to_vec();
                n.extend_from_slice(&name);
                (n, value)
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The security descriptor as stored bytes plus the owner and group SIDs.
    fn acl_result(
        &self,
        path: &SourcePath,
        r: smb::Result<smb::SecurityDescriptor>,
    ) -> SourceResult<SourceAcl> {
        let sd = r.map_err(|e| self.error(path, "query security", &e))?;
        let mut bytes = std::io::Cursor::new(Vec::new());
        sd.write_le(&mut bytes).map_err(|e| {
            SourceError::new(
                SourceErrorKind::Io,
                path,
                format!("encode security descriptor: {e}"),
            )
        })?;
        Ok(SourceAcl {
            nt_security_descriptor: Some(bytes.into_inner()),
            owner_sid: sd.owner_sid.as_ref().map(|s| s.to_string()),
            group_sid: sd.group_sid.as_ref().map(|s| s.to_string()),
            ..SourceAcl::default()
        })
    }

    /// Named streams (not the main one), sorted; a server without streams has none.
    fn streams_result(
        &self,
        path: &SourcePath,
        r: smb::Result<FileStreamInformation>,
    ) -> SourceResult<Vec<SourceStream>> {
        let info = match r {
            Ok(i) => i,
            Err(e) if status_of(&e) == Some(STATUS_NOT_SUPPORTED) => return Ok(Vec::new()),
            Err(e) => return Err(self.error(path, "query streams", &e)),
        };
        let mut out = Vec::new();
        for s in info.iter() {
            let full = s.stream_name.to_string();
            // ":name:$DATA"; the unnamed main stream is "::$DATA".
            let name = full
                .strip_prefix(':')
                .and_then(|n| n.strip_suffix(":$DATA"))
                .unwrap_or(&full);
            if !name.is_empty() {
                out.push(SourceStream {
                    name: name.to_string(),
                    size: s.stream_size,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn caps(&self) -> ShareCaps {
        self.caps.get().copied().unwrap_or(ShareCaps::UNKNOWN)
    }

    /// Opens `path` once and sends the security descriptor query together with the EA
    /// and (files) stream queries that are still needed: the answers to a file's three
    /// metadata calls for the round trips of one. EAs a listing showed to be absent
    /// (kept in `prefetch`) and streams on a share without them are not asked for.
    /// `background`: nobody waits for the answers yet (see [`Shared::idle_link`]).
    fn fetch_metadata(&self, path: &SourcePath, background: bool) -> SourceResult<Fetched> {
        let p = Self::win_path(path)?;
        let caps = self.caps();
        let need_eas = !self.prefetch.has(path, |f| f.xattrs.is_some());
        let need_streams = caps.named_streams && !self.prefetch.has(path, |f| f.streams.is_some());
        let query = |l: &Arc<Link>| {
            self.stats.metadata_fetches.fetch_add(1, Ordering::Relaxed);
            let r = l.open(&self.share, &p, Self::read_access())?;
            let h = r.handle();
            let streams_too = need_streams && !r.is_dir();
            l.count_queries(1 + u64::from(need_eas) + u64::from(streams_too));
            let (eas, sd, streams) = std::thread::scope(|s| {
                let eas = need_eas.then(|| s.spawn(|| l.check(r.as_handle_query_eas())));
                let streams = streams_too.then(|| s.spawn(|| l.check(r.as_handle_query_streams())));
                let sd = l.check(h.query_security_info(Self::sd_info()));
                (eas.map(join), sd, streams.map(join))
            });
            let is_dir = r.is_dir();
            // The file's first read takes this handle instead of opening it again.
            self.open_files.keep(path, l, r);
            Ok((eas, sd, streams, is_dir))
        };
        let (eas, sd, streams, is_dir) = if background {
            self.call_in_background(path, "query metadata", query)?
        } else {
            self.call(path, "query metadata", query)?
        };
        Ok(Fetched {
            attr: None,
            xattrs: eas.map(|r| self.eas_result(path, r)),
            acl: Some(self.acl_result(path, sd)),
            streams: match streams {
                Some(r) => Some(self.streams_result(path, r)),
                None if is_dir || !caps.named_streams => Some(Ok(Vec::new())),
                None => None, // kept from before
            },
        })
    }

    /// One of a file's metadata answers: fetched ahead by an earlier call, or fetched now
    /// together with the others (kept for their calls). If the shared open is refused,
    /// `alone` asks with the narrowest access that answer needs.
    fn metadata<T>(
        &self,
        path: &SourcePath,
        pick: impl Fn(&mut Fetched) -> Option<SourceResult<T>>,
        alone: impl FnOnce() -> SourceResult<T>,
    ) -> SourceResult<T> {
        // Three rounds at most: the answer is here, or this call fetches it, or it waits
        // for the thread fetching it (bounded by the requests' own timeouts: an open and
        // one query round) and looks again.
        for _ in 0..3 {
            if let Some(r) = self.prefetch.take(path, &pick) {
                return r;
            }
            if self.prefetch.claim(path, false) {
                // The answer may have come between the look and the claim.
                if let Some(r) = self.prefetch.take(path, &pick) {
                    self.prefetch.finish(path, Fetched::default());
                    return r;
                }
                let fetched = self.fetch_metadata(path, false);
                return match fetched {
                    Ok(mut f) => {
                        let r = pick(&mut f);
                        self.prefetch.finish(path, f);
                        match r {
                            Some(r) => r,
                            // Kept from before and handed out meanwhile: ask alone.
                            None => alone(),
                        }
                    }
                    Err(e) => {
                        self.prefetch.finish(path, Fetched::default());
                        if e.kind == SourceErrorKind::PermissionDenied {
                            alone()
                        } else {
                            Err(e)
                        }
                    }
                };
            }
            self.prefetch.wait_for(path, 2 * self.config.timeout);
        }
        alone()
    }

    /// Fills `buf` from `offset` of the main stream (`suffix` = "") or a named stream
    /// (`suffix` = ":name"), with up to `parallel_reads` READs in flight; with
    /// `want_attr` also the file's attributes, asked together with the last READ.
    /// Returns the bytes read (fewer than `buf.len()` only at end of file).
    fn read_range(
        &self,
        path: &SourcePath,
        suffix: &str,
        offset: u64,
        buf: &mut [u8],
        want_attr: bool,
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        let p = format!("{}{suffix}", Self::win_path(path)?);
        // The kept handle is used unless its session is far busier than the least busy
        // one. Requests of several calls are in flight on a session at once, so a few
        // more calls there cost less than the open (a dependent round trip) and close
        // a fresh handle needs; requiring the very least busy session made most reads of
        // a crawl open anew (dataset (a): 1,474 of 2,031).
        let kept = if suffix.is_empty() {
            self.open_files.take(path).and_then(|(link, file)| {
                let busy = link.busy.load(Ordering::SeqCst);
                let least = self
                    .least_busy(0)
                    .map_or(0, |l| l.busy.load(Ordering::SeqCst));
                if busy <= least + KEPT_HANDLE_BUSY_SLACK {
                    Some((link, file))
                } else {
                    link.close(Resource::File(file));
                    None
                }
            })
        } else {
            None
        };
        if let Some((link, file)) = kept {
            let outcome = self.call_on(link, path, "read", |l| {
                let counter = if offset == 0 {
                    &self.stats.reads_on_kept_handles
                } else {
                    &self.stats.reads_continued
                };
                counter.fetch_add(1, Ordering::Relaxed);
                self.read_and_close(l, file, buf, offset, want_attr, Some(path))
            });
            match outcome {
                Ok(o) => return Ok((o.total, o.attr.map(|a| self.attr_from_all(&a)))),
                Err(e) if e.kind == SourceErrorKind::Unreachable => return Err(e),
                // The kept handle went bad: a fresh open below.
                Err(e) => tracing::debug!(%path, error = %e, "smb: kept handle failed"),
            }
        }
        let outcome = self.call(path, "read", |l| {
            self.stats.reads_opened.fetch_add(1, Ordering::Relaxed);
            let file = match l.open(&self.share, &p, Self::read_access())? {
                Resource::File(f) => f,
                other => {
                    l.close(other);
                    return Ok(None);
                }
            };
            let keep_for = suffix.is_empty().then_some(path);
            self.read_and_close(l, file, buf, offset, want_attr, keep_for)
                .map(Some)
        })?;
        let outcome = outcome.ok_or_else(|| {
            SourceError::new(SourceErrorKind::WrongKind, path, "read of a directory")
        })?;
        Ok((outcome.total, outcome.attr.map(|a| self.attr_from_all(&a))))
    }

    /// Reads into `buf` on `file` with up to `parallel_reads` READs of at most what the
    /// session takes in flight, then closes the handle (in the background), unless the
    /// file goes on past `buf` and `keep_for` names it: then the handle is kept for the
    /// read of its next unit, which needs no open of its own (a file of N units costs
    /// one CREATE, not N).
    fn read_and_close(
        &self,
        l: &Arc<Link>,
        file: smb::File,
        buf: &mut [u8],
        offset: u64,
        want_attr: bool,
        keep_for: Option<&SourcePath>,
    ) -> Result<ReadOutcome, Failure> {
        let piece = self.config.read_size.min(l.max_read());
        let parallel = self.config.parallel_reads;
        let result = read_pieces(l, &file, buf, offset, piece, parallel, want_attr);
        let end = offset + buf.len() as u64;
        let more = matches!(&result, Ok(o) if o.total == buf.len())
            && smb::GetLen::get_len(&file).is_ok_and(|len| len > end);
        match keep_for {
            Some(path) if more => self.open_files.keep(path, l, Resource::File(file)),
            _ => l.close(Resource::File(file)),
        }
        result.map_err(|e| (String::new(), e))
    }

    /// [`Shared::read_range`] into a new buffer of `len` bytes.
    fn read_vec(
        &self,
        path: &SourcePath,
        suffix: &str,
        offset: u64,
        len: usize,
        want_attr: bool,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        let mut buf = vec![0u8; len];
        let (n, attr) = self.read_range(path, suffix, offset, &mut buf, want_attr)?;
        buf.truncate(n);
        Ok((buf, attr))
    }
}

/// The result of a scoped query thread (a panic in it is an error, not ours).
fn join<T>(h: std::thread::ScopedJoinHandle<'_, smb::Result<T>>) -> smb::Result<T> {
    h.join()
        .unwrap_or(Err(smb::Error::Other("query thread panicked")))
}
/// FILETIME (100 ns since 1601) to Unix time.
fn unix_time(t: &FileTime) -> Timestamp {
    const EPOCH_DIFF_SECS: i64 = 11_644_473_600;
    let d = t.since_epoch();
    Timestamp {
        secs: d.as_secs() as i64 - EPOCH_DIFF_SECS,
        nanos: d.subsec_nanos(),
    }
}

fn status_of(e: &smb::Error) -> Option<u32> {
    match e {
        smb::Error::ReceivedErrorMessage(s, _) | smb::Error::UnexpectedMessageStatus(s) => Some(*s),
        _ => None,
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.open_files.close_all();
        // A slot still locked is being connected in the background: that thread holds
        // the slots and drops its session when it ends.
        for mut slot in self.links.iter().filter_map(try_slot) {
            if let Some(l) = slot.take() {
                drop_in_background(l);
            }
        }
    }
}

fn smb_error(path: &SourcePath, what: &str, e: &smb::Error) -> SourceError {
    let kind = match status_of(e) {
        Some(STATUS_NO_SUCH_FILE | STATUS_OBJECT_NAME_NOT_FOUND | STATUS_OBJECT_PATH_NOT_FOUND) => {
            SourceErrorKind::NotFound
        }
        Some(STATUS_ACCESS_DENIED | STATUS_LOGON_FAILURE) => SourceErrorKind::PermissionDenied,
        Some(STATUS_FILE_IS_A_DIRECTORY | STATUS_NOT_A_DIRECTORY) => SourceErrorKind::WrongKind,
        Some(STATUS_NOT_SUPPORTED | STATUS_EAS_NOT_SUPPORTED) => SourceErrorKind::Unsupported,
        Some(STATUS_BAD_NETWORK_NAME) => SourceErrorKind::NotFound,
        Some(_) => SourceErrorKind::Io,
        None if is_unreachable(e) => SourceErrorKind::Unreachable,
        None => SourceErrorKind::Io,
    };
    let status = status_of(e)
        .map(|s| format!(" (NTSTATUS {s:#010x})"))
        .unwrap_or_default();
    SourceError::new(kind, path, format!("{what}: {e}{status}"))
}

impl Shared {
    /// Lists `path` and, on the listing's handle and meanwhile, queries its attributes,
    /// EAs and security descriptor (the last two kept for the metadata calls).
    fn list(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, SourceResult<SourceAttr>)> {
        let p = Self::win_path(path)?;
        let listed = self.call(path, "list", |l| {
            let dir = match l.open(&self.share, &p, Self::read_access())? {
                Resource::Directory(d) => d,
                other => {
                    l.close(other);
                    return Ok(None);
                }
            };
            let h: &smb::ResourceHandle = &dir;
            l.count_queries(3);
            Requests::add(&l.requests.listings, 1);
            let (listing, all, eas, sd) = std::thread::scope(|s| {
                let all = s.spawn(|| l.check(h.query_info::<FileAllInformation>()));
                let eas = s.spawn(|| l.check(query_eas(h)));
                let sd = s.spawn(|| l.check(h.query_security_info(Self::sd_info())));
                let listing = self.list_entries(l, &dir);
                (listing, join(all), join(eas), join(sd))
            });
            l.close(Resource::Directory(dir));
            listing.map(|out| Some((out, all, eas, sd)))
        })?;
        let (listed, all, eas, sd) = listed
            .ok_or_else(|| SourceError::new(SourceErrorKind::WrongKind, path, "not a directory"))?;
        self.prefetch.put(
            path,
            Fetched {
                attr: None,
                xattrs: Some(self.eas_result(path, eas)),
                acl: Some(self.acl_result(path, sd)),
                streams: Some(Ok(Vec::new())),
            },
        );
        let caps = self.caps();
        if listed.iter().any(|(_, size)| size.is_some_and(|s| s > 0)) {
            self.listing_ea_sizes.store(true, Ordering::Relaxed);
        }
        let sizes_known = caps.eas || self.listing_ea_sizes.load(Ordering::Relaxed);
        let mut entries = Vec::with_capacity(listed.len());
        for (entry, ea_size) in listed {
            // What the listing already tells about a file's EAs and streams is kept for
            // its metadata calls, which then ask the server only for the rest.
            let no_eas = sizes_known && ea_size == Some(0);
            if entry.attr.kind == FileKind::Regular
                && (no_eas || !caps.named_streams)
                && let Ok(child) = path.join(&entry.name)
            {
                self.prefetch.put(
                    &child,
                    Fetched {
                        xattrs: no_eas.then(|| Ok(Vec::new())),
                        streams: (!caps.named_streams).then(|| Ok(Vec::new())),
                        ..Fetched::default()
                    },
                );
            }
            entries.push(entry);
        }
        let attr = all
            .map(|i| self.attr_from_all(&i))
            .map_err(|e| self.error(path, "query info", &e));
        Ok((entries, attr))
    }
}

impl Source for Shared {
    fn describe(&self) -> String {
        format!("smb://{}/{}", self.config.server(), self.config.share)
    }

    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            unix_ids: false,
            symlinks: false,
            special_files: false,
            xattrs: true,
            acls: true,
            streams: true,
            byte_names: false,
        }
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        if let Some(r) = self.prefetch.take(path, |f| f.attr.take()) {
            return r;
        }
        let access = FileAccessMask::new().with_file_read_attributes(true);
        let info = self.query_one(path, "stat", access, |l, r| {
            l.count_queries(1);
            l.check(r.as_handle_query_all())
        })?;
        let info = info.map_err(|e| self.error(path, "query info", &e))?;
        Ok(self.attr_from_all(&info))
    }

    /// Lists the directory; on the same handle and meanwhile, its attributes, EAs and
    /// security descriptor are asked for the stat and metadata calls that follow a
    /// listing.
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        let (entries, attr) = self.list(path)?;
        self.prefetch.put(
            path,
            Fetched {
                attr: Some(attr),
                ..Fetched::default()
            },
        );
        Ok(entries)
    }

    /// The listing and the directory's attributes, queried on the listing's handle.
    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        let (entries, attr) = self.list(path)?;
        // A failed attribute query is not the listing's failure: the engine then stats.
        Ok((entries, attr.ok()))
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        Ok(self.read_vec(path, "", offset, len, false)?.0)
    }

    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.read_vec(path, "", offset, len, true)
    }

    /// Straight into the caller's buffer: no buffer of our own to zero and copy out of.
    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        self.read_range(path, "", offset, buf, true)
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "SMB servers follow symlinks; no link is ever visible",
        ))
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.metadata(
            path,
            |f| f.xattrs.take(),
            || {
                let r = self.query_one(path, "query EAs", Self::read_access(), |l, r| {
                    l.count_queries(1);
                    l.check(r.as_handle_query_eas())
                })?;
                self.eas_result(path, r)
            },
        )
    }

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.metadata(
            path,
            |f| f.acl.take(),
            || {
                let access = FileAccessMask::new().with_read_control(true);
                let r = self.query_one(path, "query security", access, |l, r| {
                    l.count_queries(1);
                    l.check(r.handle().query_security_info(Self::sd_info()))
                })?;
                self.acl_result(path, r)
            },
        )
    }

    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.metadata(
            path,
            |f| f.streams.take(),
            || {
                let r = self.query_one(path, "query streams", Self::read_access(), |l, r| {
                    (!r.is_dir()).then(|| {
                        l.count_queries(1);
                        l.check(r.as_handle_query_streams())
                    })
                })?;
                match r {
                    Some(r) => self.streams_result(path, r),
                    None => Ok(Vec::new()),
                }
            },
        )
    }

    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        if stream.is_empty() || stream.contains([':', '\\', '/']) {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                path,
                format!("bad stream name {stream:?}"),
            ));
        }
        Ok(self
            .read_vec(path, &format!(":{stream}"), offset, len, false)?
            .0)
    }
}

/// Every call goes to the shared state; a listing also queues its files for prefetch.
impl Source for SmbSource {
    fn describe(&self) -> String {
        self.shared.describe()
    }
    fn features(&self) -> SourceFeatures {
        self.shared.features()
    }
    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.shared.stat(path)
    }
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        let entries = self.shared.read_dir(path)?;
        self.prefetch_listed(path, &entries);
        Ok(entries)
    }
    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        let (entries, attr) = self.shared.read_dir_with_attr(path)?;
        self.prefetch_listed(path, &entries);
        Ok((entries, attr))
    }
    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.shared.read(path, offset, len)
    }
    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.shared.read_with_attr(path, offset, len)
    }
    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        self.shared.read_into(path, offset, buf)
    }
    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        self.shared.read_link(path)
    }
    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.shared.xattrs(path)
    }
    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.shared.acl(path)
    }
    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.shared.streams(path)
    }
    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.shared.read_stream(path, stream, offset, len)
    }
}

impl Shared {
    /// Every entry of an open directory, without `.` and `..`, with the size of its EAs
    /// (none for a reparse point).
    fn list_entries(
        &self,
        l: &Link,
        dir: &smb::Directory,
    ) -> Result<Vec<(SourceEntry, Option<u32>)>, Failure> {
        let mut out = Vec::new();
        let iter = match l.check(dir.query::<FileIdBothDirectoryInformation>("*")) {
            Ok(iter) => iter,
            Err(e) if status_of(&e) == Some(STATUS_NO_MORE_FILES) => return Ok(out),
            Err(e) => return Err(("query directory".into(), e)),
        };
        for item in iter {
            match l.check(item) {
                Ok(e) => {
                    let name = e.file_name.to_string();
                    if name == "." || name == ".." {
                        continue;
                    }
                    let is_dir = e.file_attributes.directory();
                    let attr = self.make_attr(
                        is_dir,
                        e.file_attributes,
                        e.end_of_file,
                        1,
                        e.file_id,
                        [
                            &e.last_access_time,
                            &e.last_write_time,
                            &e.change_time,
                            &e.creation_time,
                        ],
                    );
                    out.push((
                        SourceEntry {
                            name: name.into_bytes(),
                            attr,
                        },
                        e.ea_size,
                    ));
                }
                Err(e) if status_of(&e) == Some(STATUS_NO_MORE_FILES) => break,
                Err(e) => return Err(("query directory".into(), e)),
            }
        }
        Ok(out)
    }
}

/// Small helpers over `Resource`, which wraps files and directories alike.
trait ResourceExt {
    fn handle(&self) -> &smb::ResourceHandle;
    fn close_quietly(&self) -> smb::Result<()> {
        self.handle().close()
    }
    fn as_handle_query_all(&self) -> smb::Result<FileAllInformation> {
        self.handle().query_info::<FileAllInformation>()
    }
    fn as_handle_query_streams(&self) -> smb::Result<FileStreamInformation> {
        self.handle().query_info::<FileStreamInformation>()
    }
    fn as_handle_query_eas(&self) -> smb::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        query_eas(self.handle())
    }
}

/// A handle's EAs as (name, value) pairs.
fn query_eas(h: &smb::ResourceHandle) -> smb::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let eas = h.query_full_ea_info(Vec::new())?;
    Ok(eas
        .iter()
        .map(|e| (e.ea_name.to_string().into_bytes(), e.ea_value.clone()))
        .collect())
}

impl ResourceExt for Resource {
    fn handle(&self) -> &smb::ResourceHandle {
        match self {
            Resource::File(f) => f,
            Resource::Directory(d) => d,
            Resource::Pipe(p) => p,
        }
    }
}
