//! SMB 2/3 straight from user space with the `smb2` crate (no kernel cifs mount),
//! sending compound requests: what a call needs from the server goes out as one chain of
//! related requests and costs one network round trip.
//!
//! What the protocol gives, and therefore what this source reports:
//! - Names are UTF-16 on the wire: every name is valid UTF-8 here (an unpaired surrogate,
//!   legal on NTFS, becomes U+FFFD). Names go over the wire unmapped (no macOS private-use
//!   mapping). A server decides what to do with names it cannot express; Samba hides
//!   entries whose Unix name is not valid in its `unix charset` (they are invisible to
//!   every SMB client, not just to us).
//! - No Unix mode/uid/gid (the SMB3 POSIX extensions are not spoken by this client):
//!   permissions are synthesised from the DOS attributes (directories 0755, files 0644,
//!   read-only clears the write bits) and uid/gid are the ones configured for the share.
//!   The real owner, group and DACL come from [`Source::acl`] as an NT security descriptor.
//! - Samba follows symlinks on the server and shows FIFOs as empty files, so
//!   [`SourceFeatures::symlinks`] and [`SourceFeatures::special_files`] are false.
//! - Extended attributes are SMB EAs; Samba maps a Unix `user.NAME` xattr to the EA
//!   `NAME`, and this source reports it back as `user.NAME`.
//! - Alternate data streams are listed and read where the server has them (Samba with
//!   `vfs objects = streams_xattr`; asked once at connect).
//! - Directory listings carry no link count: [`Source::read_dir`] reports nlink 1 for
//!   files and [`Source::stat`] (FileAllInformation) gives the real count for files;
//!   Samba reports 1 for every directory.
//!
//! Round trips per call:
//! - listing a directory: CREATE + QUERY_INFO (attributes, security descriptor, EAs) +
//!   QUERY_DIRECTORY ×2 + CLOSE, one round trip for up to a few thousand entries (more
//!   open the directory again and page through it);
//! - a file's metadata (the engine's `xattrs`, `acl` and `streams` calls): CREATE +
//!   QUERY_INFO ×4 (attributes, security descriptor, streams, EAs) + CLOSE. The EA query
//!   (of a file's or a directory's listing compound) is left out when the object's
//!   listing said EaSize 0 (Samba fills it in from the xattrs it would show as EAs);
//!   should FileAllInformation of the same compound then show an EA size (EAs set since
//!   the listing), the EAs are asked in a compound of their own. The answers
//!   the call did not ask for wait briefly for the calls that follow (see `prefetch`),
//!   and after a listing every listed file's metadata is fetched ahead in the background
//!   (at most 4 compounds in flight per session, 8,192 files queued). On the source's
//!   own data connections (below) the CREATE also asks for read access and the CLOSE is
//!   left out: the handle is kept for the file's first read (at most 1,024 per connection,
//!   closed after 30 s unread, checked every 5 s; `data::KEPT_PER_LINK`, `KEPT_TTL`), so
//!   smbd opens each file once instead of twice (its open is the dearest part of its
//!   work per small file); a read waits up to 1 s for the connection holding its handle.
//!   A read on such a handle compares the link count after the read with the one at the
//!   fetch: a file deleted or replaced by a rename over its name since (fewer links, 0 on
//!   a POSIX server) is read again by name, so the engine's completion check sees what
//!   the path names now; a file changed in place is the same file (its new size and
//!   mtime show). Not seen: a file renamed away and another created under its name
//!   (its link count is unchanged) between the metadata fetch and the read;
//! - `stat`: CREATE + QUERY_INFO (FileAllInformation) + CLOSE;
//! - reading a range that fits one READ (MaxReadSize, 8 MiB on Samba; what is left of
//!   the file by its listing's size, else the caller's buffer): CREATE + READ +
//!   QUERY_INFO (the attributes after the read) + CLOSE; when the file ends inside the
//!   range and not on an 8-byte boundary, its last (fewer than 8) bytes are asked by a
//!   READ of their own in the same compound (`wire::aligned_split`: Samba pads every
//!   reply of a compound to 8 bytes by copying a READ's data); a larger one: a CREATE (a
//!   round trip; none on a handle kept from the metadata fetch), then a sliding window of
//!   READs of [`SmbConfig::data_read_size`] (own connections) or [`SmbConfig::read_size`]
//!   (the crate's sessions) with [`SmbConfig::parallel_reads`] in flight, the attributes
//!   asked together with the last one; the handle is kept for the file's next unit (at
//!   most 256 per source or data connection, 30 s) and closed in the background. Both
//!   kinds of session build the read compound with one builder (`wire::ReadCompound`):
//!   on a kept handle it is READ (+ READ) + QUERY_INFO + CLOSE.
//!
//! File data (the main stream) goes over connections of the source's own (`data`, at most
//! [`SmbConfig::connections`]; the metadata fetched ahead uses at most that many at a
//! time, one call per connection): the same compounds and windows of READs, with each
//! READ reply decoded from the socket into the caller's buffer, unsigned; files'
//! metadata compounds go there too (their handles are kept for the reads). They are used only when the server requires neither
//! signing nor encryption and [`SmbConfig::sign`] is off (MS-SMB2 lets an authenticated
//! session go unsigned unless one side requires signing; the Linux kernel client also
//! signs only with `-o sign`). The trade-off: an attacker on the path between kaiso and
//! the old server could alter file data unnoticed, as with NFSv3 or an unsigned cifs
//! mount; with `sign=1`, or a server with `server signing = mandatory`, every message is
//! signed and reads go through the crate. The same holds for files' metadata (security
//! descriptors, EAs): unsigned on the data connections, signed with `sign=1` or when the
//! server requires it (then each file is opened twice, for its metadata and its read).
//! Listings, `stat` and directories' metadata always go through the crate's sessions,
//! which sign every message of an authenticated session (smb2 0.39 has no switch for
//! that; its SMB 3.1.1 TREE_CONNECT must be signed anyway).
//!
//! Every request's reply is awaited at most [`SmbConfig::timeout`]; smb2's credit wait is
//! bounded by the same timeout. A server found gone shuts every session at once, so the
//! next call reconnects instead of each session waiting out the timeout on its own.

mod cycle;
mod data;
mod link;
mod prefetch;
mod wire;

use crate::block_on;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaiso_store::migrate::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream,
};
use smb2::msg::query_info::InfoType;
use smb2::types::flags::FileAccessMask;
use smb2::types::status::NtStatus;
use smb2::types::{Command, FileId};
use smb2::{ErrorKind, Frame};

use link::{Fail, Link, Requests};
use prefetch::{Fetched, Prefetch, Xattrs};
use wire::{OpenFor, RawAttr};

/// The bytes one SMB2 credit pays for; a READ of N bytes costs N / 64 KiB credits.
pub const SMB_CREDIT_BYTES: usize = 64 << 10;

/// The READ size of a large file's window by default: 16 credits (1 MiB). Several READs
/// of 1 MiB in flight moved data faster for less CPU than 8 MiB ones (session 7's probe).
pub const SMB_MAX_READ_PIECE: usize = 16 * SMB_CREDIT_BYTES;

/// The READ size on the source's own data connections by default (capped by the
/// server's MaxReadSize, 8 MiB on Samba): a 10 MiB unit is two READs. smbd spent a third
/// less CPU per GiB than with 1 MiB READs, 16 in flight (0.38–0.46 against 0.56–0.78
/// CPU-s/GiB, `smb_read_cpu`, session 12); the caller's CPU is the same (the reply is
/// decoded straight into its buffer).
pub const SMB_DATA_READ_PIECE: usize = 8 << 20;

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
    /// The NTLM domain of `user` (empty: the server's own accounts).
    pub domain: String,
    /// uid/gid given to every object (SMB has no Unix owners; see the module docs).
    pub uid: u32,
    pub gid: u32,
    /// Size of one READ of a large file's window through the crate's sessions (at most
    /// the server's MaxReadSize).
    pub read_size: usize,
    /// Size of one READ of a large file's window on the source's own data connections
    /// (at most the server's MaxReadSize).
    pub data_read_size: usize,
    /// READ requests kept in flight for one `read` call.
    pub parallel_reads: usize,
    /// Sessions, each on its own TCP connection, that concurrent calls share. They are
    /// opened as calls need them (the first one by [`SmbSource::connect`]).
    pub connections: usize,
    /// Bound on the TCP connect and on the wait for each SMB response. A call whose
    /// request is not answered in time fails as unreachable (naming the server), the
    /// connection is dropped, and the next call connects again.
    pub timeout: Duration,
    /// Sign every message even when the server does not require it (URL `sign=1`):
    /// then all reads go through the crate's signed sessions. Off by default: file data
    /// and files' metadata are read over the source's own unsigned connections when the
    /// server requires neither signing nor encryption (as the Linux kernel client without
    /// `-o sign`); listings go over the crate's signed sessions. See the module docs.
    pub sign: bool,
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
            domain: String::new(),
            uid: 0,
            gid: 0,
            read_size: SMB_MAX_READ_PIECE,
            data_read_size: SMB_DATA_READ_PIECE,
            parallel_reads: 16,
            connections: SMB_DEFAULT_CONNECTIONS,
            timeout: SMB_DEFAULT_TIMEOUT,
            sign: false,
        }
    }

    /// `host:port`, the name errors give for the server.
    pub(crate) fn server(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Handles kept open for the next unit of a file being read, per source.
const KEPT_HANDLES: usize = 256;
/// How long a kept handle waits for its next unit before it is closed.
const KEPT_HANDLE_TTL: Duration = Duration::from_secs(30);
/// How often the handles kept on idle data connections are checked for expiry.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// File sizes remembered from listings and metadata fetches (to read a small file in one
/// compound); beyond it the table starts over.
const SIZE_HINTS: usize = 65_536;
/// Background metadata fetches in flight per session.
const PREFETCH_PER_LINK: usize = 4;
/// Files queued for a background metadata fetch at most; more are left to the engine's
/// own calls.
const PREFETCH_QUEUE: usize = 8192;
/// Metadata compounds a background fetch sends together on one data connection at most
/// (see `Shared::ahead_worker`).
const PREFETCH_BATCH: usize = 16;
/// Output buffer of one QUERY_DIRECTORY: about 2,000 entries.
const LIST_BUFFER: u32 = 256 << 10;

// NTSTATUS values this source tells apart.
const STATUS_NO_SUCH_FILE: u32 = 0xC000_000F;
const STATUS_OBJECT_NAME_NOT_FOUND: u32 = 0xC000_0034;
const STATUS_OBJECT_PATH_NOT_FOUND: u32 = 0xC000_003A;
const STATUS_ACCESS_DENIED: u32 = 0xC000_0022;
const STATUS_NO_EAS_ON_FILE: u32 = 0xC000_0052;
const STATUS_EAS_NOT_SUPPORTED: u32 = 0xC000_004F;
const STATUS_NOT_SUPPORTED: u32 = 0xC000_00BB;
const STATUS_INVALID_PARAMETER: u32 = 0xC000_000D;
const STATUS_FILE_IS_A_DIRECTORY: u32 = 0xC000_00BA;
const STATUS_NOT_A_DIRECTORY: u32 = 0xC000_0103;
const STATUS_LOGON_FAILURE: u32 = 0xC000_006D;
const STATUS_BAD_NETWORK_NAME: u32 = 0xC000_00CC;
const STATUS_NO_MORE_FILES: u32 = 0x8000_0006;
const STATUS_END_OF_FILE: u32 = 0xC000_0011;

/// Counts of what a source sent, for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SmbStats {
    /// Replies some call waited for before it could go on (a compound is one; READs sent
    /// together count once per window; background closes and prefetches count none).
    pub round_trips: u64,
    /// Compound chains sent.
    pub compounds: u64,
    /// Requests sent alone (READs of a window, background CLOSEs).
    pub singles: u64,
    /// Metadata fetches (one compound each), by calls and by the background prefetch.
    pub metadata_fetches: u64,
    /// Metadata compounds (files' and listings') sent without the EA query because the
    /// object's listing said it has no EAs (EaSize 0), and of those the ones whose
    /// FileAllInformation then showed EAs after all: asked in a compound of their own.
    pub eas_skipped: u64,
    pub eas_asked_apart: u64,
    /// Reads done in one CREATE+READ+QUERY_INFO+CLOSE compound.
    pub reads_compound: u64,
    /// Reads that opened the file and read it with a window of READs.
    pub reads_opened: u64,
    /// Reads of a later unit on the handle kept from the file's previous read.
    pub reads_continued: u64,
    /// Requests by kind (alone or in compounds). CREATE:
    pub creates: u64,
    /// QUERY_INFO.
    pub queries: u64,
    /// QUERY_DIRECTORY.
    pub listings: u64,
    /// READ.
    pub reads: u64,
    /// CLOSE.
    pub closes: u64,
    /// Reads done on the source's own data connections (READ replies decoded straight
    /// into the caller's buffer), and those connections set up.
    pub reads_direct: u64,
    pub data_connections: u64,
    /// Reads on a data connection that used the handle kept from the file's metadata
    /// fetch (no CREATE of their own), and those that then opened the path anew (the
    /// file was replaced or deleted since, or the handle failed).
    pub reads_on_metadata_handle: u64,
    pub reads_reopened: u64,
    /// Handles kept open on idle data connections when the counters were read.
    pub kept_handles: u64,
    /// Waits for metadata replies on the data connections: the files' metadata fetched
    /// ahead goes out several compounds at a time on one connection (up to 16), and
    /// each such batch (or a call's compound of its own) counts once.
    pub metadata_windows: u64,
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    metadata_fetches: AtomicU64,
    eas_skipped: AtomicU64,
    eas_asked_apart: AtomicU64,
    reads_compound: AtomicU64,
    reads_opened: AtomicU64,
    reads_continued: AtomicU64,
}

/// A handle kept between the units of one file's read.
struct Kept {
    link: Arc<Link>,
    file_id: FileId,
    at: Instant,
}

/// An SMB share read over several authenticated sessions with compound requests, each
/// session reconnected after a failure.
pub struct SmbSource {
    shared: Arc<Shared>,
    /// Runs the sessions' receive tasks and the background work; calls drive their own
    /// requests from the calling thread (`block_on`).
    runtime: Option<tokio::runtime::Runtime>,
}

struct Shared {
    config: SmbConfig,
    rt: tokio::runtime::Handle,
    slots: Arc<Slots>,
    next_link: AtomicUsize,
    prefetch: Prefetch,
    prefetch_slots: Arc<tokio::sync::Semaphore>,
    /// Listed files whose metadata is fetched ahead on the data connections, and the
    /// workers draining them (at most one per data connection: a data connection carries
    /// one call at a time; more would only wait in the pool).
    ahead: Mutex<Ahead>,
    /// Files waiting for or in a background metadata fetch.
    prefetch_queued: AtomicUsize,
    kept: Mutex<HashMap<SourcePath, Kept>>,
    sizes: Mutex<HashMap<SourcePath, u64>>,
    /// Objects whose listing said EaSize 0: their metadata compound leaves the EA query
    /// out (see `fetched`). Taken by the fetch; at most `SIZE_HINTS`, then it starts over.
    no_eas: Mutex<HashSet<SourcePath>>,
    /// The share has named streams (asked once at connect).
    named_streams: bool,
    stats: Counters,
    requests: Arc<Requests>,
    /// Connections of the source's own for large reads.
    data: data::DataPool,
    /// FileIds of directories seen lately, to tell a directory cycle (see `cycle`).
    dir_ids: cycle::DirIds,
}

/// The sessions; `None` or broken means the next call on that slot connects again.
struct Slots {
    links: Vec<Mutex<Option<Arc<Link>>>>,
    /// A background connect of the slot is under way.
    connecting: Vec<std::sync::atomic::AtomicBool>,
}

fn status_of(frame: &Frame) -> u32 {
    frame.header.status.0
}

fn is_ok(frame: &Frame) -> bool {
    frame.header.status == NtStatus::SUCCESS
}

/// The frame's output buffer if it succeeded, else its status as a failure of `op`.
fn buffer<'a>(frame: &'a Frame, op: &'static str) -> Result<&'a [u8], Fail> {
    if !is_ok(frame) {
        return Err(Fail::Status {
            status: status_of(frame),
            op,
        });
    }
    wire::output_buffer(&frame.body).ok_or(Fail::Malformed(op))
}

fn kind_of_status(status: u32) -> SourceErrorKind {
    match status {
        STATUS_NO_SUCH_FILE
        | STATUS_OBJECT_NAME_NOT_FOUND
        | STATUS_OBJECT_PATH_NOT_FOUND
        | STATUS_BAD_NETWORK_NAME => SourceErrorKind::NotFound,
        STATUS_ACCESS_DENIED | STATUS_LOGON_FAILURE => SourceErrorKind::PermissionDenied,
        STATUS_FILE_IS_A_DIRECTORY | STATUS_NOT_A_DIRECTORY => SourceErrorKind::WrongKind,
        STATUS_NOT_SUPPORTED | STATUS_EAS_NOT_SUPPORTED => SourceErrorKind::Unsupported,
        _ => SourceErrorKind::Io,
    }
}

fn kind_of(fail: &Fail) -> SourceErrorKind {
    match fail {
        Fail::Status { status, .. } => kind_of_status(*status),
        Fail::TimedOut | Fail::Io(_) => SourceErrorKind::Unreachable,
        Fail::Malformed(_) => SourceErrorKind::Io,
        Fail::Smb(e) => {
            if let Some(s) = e.status() {
                return kind_of_status(s.0);
            }
            match e.kind() {
                ErrorKind::ConnectionLost | ErrorKind::TimedOut => SourceErrorKind::Unreachable,
                ErrorKind::AuthRequired
                | ErrorKind::AccessDenied
                | ErrorKind::GuestSessionRefused
                | ErrorKind::SigningRequired => SourceErrorKind::PermissionDenied,
                ErrorKind::NotFound => SourceErrorKind::NotFound,
                _ if matches!(
                    e,
                    smb2::Error::Io(_)
                        | smb2::Error::Disconnected
                        | smb2::Error::ConnectFailed { .. }
                        | smb2::Error::Timeout
                ) =>
                {
                    SourceErrorKind::Unreachable
                }
                _ if matches!(e, smb2::Error::Auth { .. }) => SourceErrorKind::PermissionDenied,
                _ => SourceErrorKind::Io,
            }
        }
    }
}

impl SmbSource {
    /// Connects and authenticates (NTLM) to `\\host\share`. One session is opened now (so
    /// a wrong address, share or password fails here); the others meanwhile in the
    /// background.
    pub fn connect(config: SmbConfig) -> SourceResult<Self> {
        let root = SourcePath::root();
        let invalid = |m: &str| SourceError::new(SourceErrorKind::Invalid, &root, m);
        if config.read_size == 0
            || config.data_read_size == 0
            || config.parallel_reads == 0
            || config.connections == 0
        {
            return Err(invalid(
                "read_size, data_read_size, parallel_reads and connections must be > 0",
            ));
        }
        if config.timeout.is_zero() {
            return Err(invalid(
                "the SMB timeout must be > 0 (0 would wait forever)",
            ));
        }
        if config.share.is_empty() || config.share.contains(['/', '\\']) {
            return Err(invalid("share name: one name, no path"));
        }
        // Two workers run every session's receive task and the background work; the
        // calls drive their own requests from the engine's threads.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("smb2")
            .enable_all()
            .build()
            .map_err(|e| {
                SourceError::new(SourceErrorKind::Io, &root, format!("tokio runtime: {e}"))
            })?;
        let rt = runtime.handle().clone();
        let requests = Arc::new(Requests::default());
        let first = block_on(&rt, Link::connect(&config, requests.clone()))
            .map_err(|f| connect_error(&config, &f))?;
        let first = Arc::new(first);
        let named_streams = block_on(&rt, share_attributes(&first, config.timeout))
            .map(|a| a & wire::FILE_NAMED_STREAMS != 0)
            .unwrap_or(true);
        let slots = Arc::new(Slots {
            links: (0..config.connections).map(|_| Mutex::new(None)).collect(),
            connecting: (0..config.connections)
                .map(|_| std::sync::atomic::AtomicBool::new(false))
                .collect(),
        });
        *slots.links[0].lock().unwrap_or_else(|p| p.into_inner()) = Some(first);
        let data = data::DataPool::new(&config);
        let shared = Arc::new(Shared {
            prefetch_slots: Arc::new(tokio::sync::Semaphore::new(
                config.connections * PREFETCH_PER_LINK,
            )),
            ahead: Mutex::new(Ahead::default()),
            prefetch_queued: AtomicUsize::new(0),
            config,
            rt,
            slots,
            next_link: AtomicUsize::new(0),
            prefetch: Prefetch::default(),
            kept: Mutex::new(HashMap::new()),
            sizes: Mutex::new(HashMap::new()),
            no_eas: Mutex::new(HashSet::new()),
            named_streams,
            stats: Counters::default(),
            requests,
            data,
            dir_ids: cycle::DirIds::new(cycle::DIR_IDS_PER_GENERATION),
        });
        // The other sessions connect meanwhile; a slot whose connect fails is connected
        // again later (or by the next call that finds no session).
        shared.reconnect_idle_slots();
        // Handles kept on the data connections that nobody reads any more (a paused or
        // stopped crawl, skipped files) are closed once they expire.
        let weak = Arc::downgrade(&shared);
        shared.rt.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(s) = weak.upgrade() else { break };
                let sweep = tokio::task::spawn_blocking(move || s.data.sweep(&s.requests));
                if sweep.await.is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            shared,
            runtime: Some(runtime),
        })
    }

    /// What this source sent so far.
    /// As if `path`'s listing had said it has no EAs (EaSize 0): its next metadata
    /// compound leaves the EA query out. For tests of an EA set between a listing and
    /// the metadata fetch, which the background prefetch after a listing makes a race.
    #[doc(hidden)]
    pub fn assume_no_eas(&self, path: &SourcePath) {
        self.shared.hint_eas(path, 0);
    }

    pub fn stats(&self) -> SmbStats {
        let (c, r) = (&self.shared.stats, &self.shared.requests);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SmbStats {
            round_trips: get(&c.round_trips),
            compounds: get(&r.compounds),
            singles: get(&r.singles),
            metadata_fetches: get(&c.metadata_fetches),
            eas_skipped: get(&c.eas_skipped),
            eas_asked_apart: get(&c.eas_asked_apart),
            reads_compound: get(&c.reads_compound),
            reads_opened: get(&c.reads_opened),
            reads_continued: get(&c.reads_continued),
            creates: get(&r.creates),
            queries: get(&r.queries),
            listings: get(&r.listings),
            reads: get(&r.reads),
            closes: get(&r.closes),
            reads_direct: get(&self.shared.data.reads),
            data_connections: get(&self.shared.data.connects),
            reads_on_metadata_handle: get(&self.shared.data.reads_on_kept),
            reads_reopened: get(&self.shared.data.reads_again),
            kept_handles: self.shared.data.kept_handles() as u64,
            metadata_windows: get(&self.shared.data.metadata_windows),
        }
    }

    /// Fetches the metadata of the listed regular files ahead, on idle sessions, so the
    /// crawl's metadata pass finds it waiting: on the data connections when there are
    /// some (several files per round trip, see `Shared::ahead_worker`), else one task
    /// per file on the crate's sessions.
    fn prefetch_listed(&self, dir: &SourcePath, entries: &[SourceEntry]) {
        let mut paths = Vec::new();
        for e in entries {
            if e.attr.kind != FileKind::Regular {
                continue;
            }
            let Ok(path) = dir.join(&e.name) else {
                continue;
            };
            if self.shared.prefetch_queued.fetch_add(1, Ordering::SeqCst) >= PREFETCH_QUEUE {
                self.shared.prefetch_queued.fetch_sub(1, Ordering::SeqCst);
                break; // enough queued: the engine's own calls fetch the rest
            }
            paths.push(path);
        }
        if paths.is_empty() {
            return;
        }
        if !self.shared.data.is_off() {
            self.shared.queue_ahead(paths);
            return;
        }
        for path in paths {
            let s = self.shared.clone();
            self.shared.rt.spawn(async move {
                let eas = s.prefetch.claim(&path, true).then(|| s.ask_eas(&path));
                if let Some(eas) = eas {
                    s.prefetch_through_crate(&path, eas).await;
                }
                s.prefetch_queued.fetch_sub(1, Ordering::SeqCst);
            });
        }
    }
}

/// Listed files waiting for their metadata to be fetched ahead on the data connections,
/// and the workers fetching it.
#[derive(Default)]
struct Ahead {
    queue: std::collections::VecDeque<SourcePath>,
    workers: usize,
}

/// Takes up to `n` paths from `queue`: every `stride`-th, from the front, so that the
/// files of one directory (queued together) spread over the data connections whose
/// handles their reads will want, instead of waiting for one.
fn take_strided(
    queue: &mut std::collections::VecDeque<SourcePath>,
    n: usize,
    stride: usize,
) -> Vec<SourcePath> {
    let stride = stride.max(1);
    let mut out = Vec::with_capacity(n);
    let mut i = 0usize;
    queue.retain(|p| {
        let take = out.len() < n && i.is_multiple_of(stride);
        i += 1;
        if take {
            out.push(p.clone());
        }
        !take
    });
    out
}

fn connect_error(config: &SmbConfig, fail: &Fail) -> SourceError {
    let root = SourcePath::root();
    let kind = kind_of(fail);
    let server = config.server();
    let message = match kind {
        SourceErrorKind::PermissionDenied if matches!(fail, Fail::Smb(e) if e.status().is_some_and(|s| s.0 == STATUS_ACCESS_DENIED)) =>
        {
            format!(
                "SMB share {:?} on {server} refused to {:?}: {fail}",
                config.share, config.user
            )
        }
        SourceErrorKind::PermissionDenied => format!(
            "SMB login to {server} as {:?} refused: Logon Failure (wrong user or password?): \
             {fail}",
            config.user
        ),
        SourceErrorKind::NotFound => {
            format!("SMB share {:?} not found on {server}: {fail}", config.share)
        }
        SourceErrorKind::Unreachable => {
            format!("SMB server {server} unreachable: {fail}")
        }
        _ => format!("SMB connect to {server}: {fail}"),
    };
    let kind = match fail {
        Fail::Smb(smb2::Error::Auth { .. }) => SourceErrorKind::PermissionDenied,
        _ => kind,
    };
    SourceError::new(kind, &root, message)
}

/// The file system attribute bits of the share (FILE_NAMED_STREAMS, ...).
async fn share_attributes(link: &Link, timeout: Duration) -> Result<u32, Fail> {
    let create = wire::create(String::new(), OpenFor::Only(0x80));
    let q = wire::query(
        InfoType::Filesystem,
        wire::FILE_FS_ATTRIBUTE_INFORMATION,
        0,
        FileId::SENTINEL,
    );
    let close = wire::close(FileId::SENTINEL);
    let frames = link
        .compound(
            &[
                (Command::Create, &create, 1),
                (Command::QueryInfo, &q, 1),
                (Command::Close, &close, 1),
            ],
            timeout,
        )
        .await?;
    wire::fs_attributes(buffer(&frames[1], "query file system")?)
        .ok_or(Fail::Malformed("file system attributes"))
}

/// The share's identity, independent of the address it is reached at: the volume's
/// serial number and creation time (FileFsVolumeInformation) and the root directory's
/// FileId (FileInternalInformation). One compound.
async fn share_identity(link: &Link, timeout: Duration) -> Result<String, Fail> {
    let create = wire::create(String::new(), OpenFor::Only(0x80));
    let volume = wire::query(
        InfoType::Filesystem,
        wire::FILE_FS_VOLUME_INFORMATION,
        0,
        FileId::SENTINEL,
    );
    let internal = wire::query(
        InfoType::File,
        wire::FILE_INTERNAL_INFORMATION,
        0,
        FileId::SENTINEL,
    );
    let close = wire::close(FileId::SENTINEL);
    let frames = link
        .compound(
            &[
                (Command::Create, &create, 1),
                (Command::QueryInfo, &volume, 1),
                (Command::QueryInfo, &internal, 1),
                (Command::Close, &close, 1),
            ],
            timeout,
        )
        .await?;
    let (created, serial) = wire::volume_identity(buffer(&frames[1], "query volume")?)
        .ok_or(Fail::Malformed("FileFsVolumeInformation"))?;
    let root = wire::internal_id(buffer(&frames[2], "query root id")?)
        .ok_or(Fail::Malformed("FileInternalInformation"))?;
    Ok(format!(
        "smb:volume={serial:08x}:created={created:016x}:root={root:016x}"
    ))
}

impl Drop for SmbSource {
    fn drop(&mut self) {
        tracing::debug!(stats = ?self.stats(), "smb2: source closed");
        // Sessions end with their tasks (dropped, not run to their end: a dead server is
        // not waited for); the runtime's threads are joined.
        if let Some(rt) = self.runtime.take() {
            stop_runtime(rt, RUNTIME_STOP);
        }
    }
}

/// How long dropping a source waits for its runtime's threads to end. They end at once
/// (their tasks are dropped) unless a blocking task runs, e.g. a name lookup of a connect.
const RUNTIME_STOP: Duration = Duration::from_secs(5);

/// Stops `rt` and joins its threads, waiting at most `wait` for them to end.
///
/// Not `shutdown_background`: it wakes the worker threads to end and at once drops their
/// `JoinHandle`s, i.e. calls `pthread_detach` on threads that are exiting at that moment.
/// glibc 2.36 (Debian 12) reads the thread's descriptor (`cancelhandling`) after marking
/// it detached; if the exiting thread frees its stack in between (unmapped when glibc's
/// stack cache is over its 40 MiB) that read faults. `kaiso bench migrate` died once of
/// SIGSEGV in `pthread_detach` on its main thread during an SMB grid point (kernel log:
/// `segfault at ... in libc.so.6[8a28c,...]`, `pthread_detach+28` in Debian 12's libc),
/// most likely here: the one place that detaches threads just told to exit. Joined
/// threads are never detached; after `wait` the ones left (blocked, so not exiting just
/// then) are detached as before. Within an async context, where tokio must not block,
/// the wait runs on a scoped (joined) thread.
fn stop_runtime(rt: tokio::runtime::Runtime, wait: Duration) {
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| {
            s.spawn(move || rt.shutdown_timeout(wait));
        });
    } else {
        rt.shutdown_timeout(wait);
    }
}

impl Shared {
    /// The share-relative Windows path of `path`.
    fn win_path(path: &SourcePath) -> SourceResult<&str> {
        std::str::from_utf8(path.as_bytes()).map_err(|_| {
            SourceError::new(
                SourceErrorKind::Invalid,
                path,
                "SMB names must be valid UTF-8 (UTF-16 on the wire)",
            )
        })
    }

    /// The live session with the fewest calls running, scanning from slot `from`.
    fn least_busy(&self, from: usize) -> Option<Arc<Link>> {
        let n = self.slots.links.len();
        let mut best: Option<Arc<Link>> = None;
        for k in 0..n {
            if let Ok(slot) = self.slots.links[(from + k) % n].try_lock()
                && let Some(l) = slot.as_ref()
                && l.is_live()
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

    /// A session for a call: the least busy live one; if none is live, this call
    /// connects one (and reports the failure).
    fn link(&self, path: &SourcePath) -> SourceResult<Arc<Link>> {
        let i = self.next_link.fetch_add(1, Ordering::Relaxed) % self.slots.links.len();
        if let Some(l) = self.least_busy(i) {
            // An idle slot that is not connected yet is connected in the background.
            if l.busy.load(Ordering::SeqCst) > 0 {
                self.reconnect_idle_slots();
            }
            return Ok(l);
        }
        let mut slot = self.slots.links[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(l) = slot.as_ref().filter(|l| l.is_live()) {
            return Ok(l.clone());
        }
        let l = block_on(&self.rt, Link::connect(&self.config, self.requests.clone()))
            .map_err(|f| self.error(path, &format!("connect to share {}", self.config.share), f))?;
        let l = Arc::new(l);
        *slot = Some(l.clone());
        Ok(l)
    }

    /// Connects, in the background, the slots left empty or broken (one connect per
    /// slot at a time).
    fn reconnect_idle_slots(&self) {
        for i in 0..self.slots.links.len() {
            let live = match self.slots.links[i].try_lock() {
                Ok(s) => s.as_ref().is_some_and(|l| l.is_live()),
                Err(_) => true,
            };
            if live || self.slots.connecting[i].swap(true, Ordering::SeqCst) {
                continue;
            }
            let (slots, config, requests) = (
                self.slots.clone(),
                self.config.clone(),
                self.requests.clone(),
            );
            self.rt.spawn(async move {
                if let Ok(l) = Link::connect(&config, requests).await {
                    let mut slot = slots.links[i].lock().unwrap_or_else(|p| p.into_inner());
                    if !slot.as_ref().is_some_and(|l| l.is_live()) {
                        *slot = Some(Arc::new(l));
                    }
                }
                slots.connecting[i].store(false, Ordering::SeqCst);
            });
        }
    }

    /// Runs one call's future on `link` (counted busy meanwhile).
    fn run<T: Send>(&self, link: &Arc<Link>, f: impl Future<Output = T> + Send) -> T {
        let _busy = link.busy_guard();
        block_on(&self.rt, f)
    }

    /// The source error for a failed call; an unreachable server also shuts every session.
    fn error(&self, path: &SourcePath, what: &str, fail: Fail) -> SourceError {
        let kind = kind_of(&fail);
        if kind == SourceErrorKind::Unreachable {
            self.shut_all();
            let why = match fail {
                Fail::TimedOut => format!("no answer within {:?}", self.config.timeout),
                other => other.to_string(),
            };
            return SourceError::new(
                kind,
                path,
                format!(
                    "SMB server {} unreachable ({what}): {why}; the next call reconnects",
                    self.config.server()
                ),
            );
        }
        SourceError::new(kind, path, format!("{what}: {fail}"))
    }

    /// The server is gone or silent: every session is shut now (their pending requests
    /// fail at once) and reconnected by the next call on it. What was fetched ahead and
    /// the kept handles are forgotten.
    fn shut_all(&self) {
        for slot in &self.slots.links {
            if let Ok(mut s) = slot.try_lock()
                && let Some(l) = s.take()
            {
                l.shut();
            }
        }
        self.prefetch.clear();
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.data.clear();
    }

    fn attr(&self, raw: &RawAttr) -> SourceAttr {
        raw.to_attr(self.config.uid, self.config.gid)
    }

    fn hint_size(&self, path: &SourcePath, size: u64) {
        let mut sizes = self.sizes.lock().unwrap_or_else(|p| p.into_inner());
        if sizes.len() >= SIZE_HINTS {
            sizes.clear();
        }
        sizes.insert(path.clone(), size);
    }

    /// Remembers what `path`'s listing said of its EAs (EaSize 0: none).
    fn hint_eas(&self, path: &SourcePath, ea_size: u32) {
        let mut set = self.no_eas.lock().unwrap_or_else(|p| p.into_inner());
        if ea_size != 0 {
            set.remove(path);
            return;
        }
        if set.len() >= SIZE_HINTS {
            set.clear();
        }
        set.insert(path.clone());
    }

    /// Whether `path`'s metadata compound should ask for its EAs: unless its listing
    /// said it has none (the hint is used once).
    fn ask_eas(&self, path: &SourcePath) -> bool {
        !self
            .no_eas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path)
    }

    fn take_size_hint(&self, path: &SourcePath) -> Option<u64> {
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path)
    }

    // ---------------------------------------------------------------------------------
    // Metadata

    /// One compound for everything the engine asks about an object: CREATE, its
    /// attributes, security descriptor, streams (if the share has them), EAs (`eas`:
    /// unless its listing said it has none), CLOSE.
    async fn fetch_metadata(
        &self,
        link: &Link,
        path: &SourcePath,
        eas: bool,
    ) -> Result<Fetched, Fail> {
        let name = Self::win_path(path)
            .map_err(|_| Fail::Malformed("path"))?
            .replace('/', "\\");
        let requests =
            wire::metadata_requests(name.clone(), OpenFor::Metadata, self.named_streams, eas);
        self.stats.metadata_fetches.fetch_add(1, Ordering::Relaxed);
        let frames = link.compound(&requests.ops(), self.config.timeout).await?;
        let (mut fetched, eas_missing) = self.fetched(path, &frames, eas)?;
        if eas_missing {
            // EAs appeared since the listing: asked apart (rare).
            let create = wire::create(name, OpenFor::Only(FileAccessMask::FILE_READ_EA));
            let q = wire::query_eas(FileId::SENTINEL);
            let close = wire::close(FileId::SENTINEL);
            let ops: [link::Op<'_>; 3] = [
                (Command::Create, &create, 1),
                (Command::QueryInfo, &q, 1),
                (Command::Close, &close, 1),
            ];
            let frames = link.compound(&ops, self.config.timeout).await?;
            fetched.xattrs = Some(if is_ok(&frames[0]) {
                self.eas_from(path, &frames[1])
            } else {
                let fail = Fail::Status {
                    status: status_of(&frames[0]),
                    op: "open",
                };
                Err(self.error(path, "query EAs", fail))
            });
        }
        Ok(fetched)
    }

    /// The metadata compound on one of the source's own data connections, its handle
    /// kept there for the file's first read: smbd opens the file once, not once for the
    /// metadata and once for the data. `None`: that path is off or not usable for this
    /// file now (see `data::DataPool::metadata_batch`); the caller fetches through the crate.
    /// Blocking (the data connections are blocking sockets).
    fn fetch_metadata_direct(&self, path: &SourcePath, eas: bool) -> Option<Result<Fetched, Fail>> {
        self.fetch_metadata_direct_batch(vec![(path.clone(), eas)])
            .pop()
            .flatten()
    }

    /// [`Shared::fetch_metadata_direct`] for several files (`(path, eas)`) on one data
    /// connection, their compounds sent together (one round trip). One answer per item.
    fn fetch_metadata_direct_batch(
        &self,
        items: Vec<(SourcePath, bool)>,
    ) -> Vec<Option<Result<Fetched, Fail>>> {
        let mut out: Vec<Option<Result<Fetched, Fail>>> = items.iter().map(|_| None).collect();
        if self.data.is_off() {
            return out;
        }
        let mut at = Vec::with_capacity(items.len());
        let mut wire_items = Vec::with_capacity(items.len());
        for (i, (path, eas)) in items.iter().enumerate() {
            if let Ok(name) = Self::win_path(path) {
                at.push(i);
                wire_items.push((path.clone(), name.replace('/', "\\"), *eas));
            }
        }
        if wire_items.is_empty() {
            return out;
        }
        let answers = self
            .data
            .metadata_batch(wire_items, self.named_streams, &self.requests);
        for (i, answer) in at.into_iter().zip(answers) {
            let Some(frames) = answer else { continue };
            let (path, eas) = (&items[i].0, items[i].1);
            self.stats.metadata_fetches.fetch_add(1, Ordering::Relaxed);
            out[i] = Some(frames.and_then(|f| {
                let (mut fetched, eas_missing) = self.fetched(path, &f, eas)?;
                if eas_missing {
                    // EAs appeared since the listing: asked apart (rare), through the crate.
                    fetched.xattrs = Some(self.eas_alone(path));
                }
                Ok(fetched)
            }));
        }
        out
    }

    /// A file's EAs in a compound of its own (CREATE for EA access, the query, CLOSE).
    fn eas_alone(&self, path: &SourcePath) -> SourceResult<Xattrs> {
        let f = self.query_alone(
            path,
            "query EAs",
            FileAccessMask::FILE_READ_EA,
            wire::query_eas(FileId::SENTINEL),
        )?;
        self.eas_from(path, &f)
    }

    /// Decodes a metadata compound's replies: the CREATE's, FileAllInformation, the
    /// security descriptor, the streams (if the share has them), the EAs if `eas_asked`
    /// (a CLOSE's after them, if any, is not looked at). Also says whether the EAs are
    /// still to be asked: left out because the listing said EaSize 0, but
    /// FileAllInformation now gives a size (EAs set since the listing); then the answer
    /// holds no EAs and the caller asks for them apart.
    fn fetched(
        &self,
        path: &SourcePath,
        frames: &[Frame],
        eas_asked: bool,
    ) -> Result<(Fetched, bool), Fail> {
        let want = 3 + usize::from(self.named_streams) + usize::from(eas_asked);
        if frames.len() < want {
            return Err(Fail::Malformed("metadata compound"));
        }
        if !is_ok(&frames[0]) {
            return Err(Fail::Status {
                status: status_of(&frames[0]),
                op: "open",
            });
        }
        let raw = wire::parse_all_information(buffer(&frames[1], "query info")?)
            .ok_or(Fail::Malformed("FileAllInformation"))?;
        if !raw.directory {
            self.hint_size(path, raw.size);
        }
        let acl = self.acl_from(path, &frames[2]);
        let (streams, eas_at) = if self.named_streams {
            let s = if raw.directory {
                Ok(Vec::new())
            } else {
                self.streams_from(path, &frames[3])
            };
            (s, 4)
        } else {
            (Ok(Vec::new()), 3)
        };
        let (xattrs, eas_missing) = if raw.ea_size == 0 {
            (Some(Ok(Vec::new())), false)
        } else if eas_asked {
            (Some(self.eas_from(path, &frames[eas_at])), false)
        } else {
            self.stats.eas_asked_apart.fetch_add(1, Ordering::Relaxed);
            (None, true)
        };
        if !eas_asked {
            self.stats.eas_skipped.fetch_add(1, Ordering::Relaxed);
        }
        Ok((
            Fetched {
                attr: None,
                xattrs,
                acl: Some(acl),
                streams: Some(streams),
            },
            eas_missing,
        ))
    }

    fn eas_from(&self, path: &SourcePath, frame: &Frame) -> SourceResult<Xattrs> {
        if matches!(
            status_of(frame),
            STATUS_NO_EAS_ON_FILE | STATUS_EAS_NOT_SUPPORTED | STATUS_NOT_SUPPORTED
        ) {
            return Ok(Vec::new());
        }
        let b = buffer(frame, "query EAs").map_err(|f| self.error(path, "query EAs", f))?;
        let eas = wire::parse_eas(b).ok_or_else(|| {
            SourceError::new(
                SourceErrorKind::Io,
                path,
                "malformed EA list from the server",
            )
        })?;
        let mut out: Xattrs = eas
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

    fn acl_from(&self, path: &SourcePath, frame: &Frame) -> SourceResult<SourceAcl> {
        let sd =
            buffer(frame, "query security").map_err(|f| self.error(path, "query security", f))?;
        let (owner_sid, group_sid) = wire::descriptor_sids(sd);
        Ok(SourceAcl {
            nt_security_descriptor: Some(sd.to_vec()),
            owner_sid,
            group_sid,
            ..SourceAcl::default()
        })
    }

    fn streams_from(&self, path: &SourcePath, frame: &Frame) -> SourceResult<Vec<SourceStream>> {
        if matches!(
            status_of(frame),
            STATUS_NOT_SUPPORTED | STATUS_INVALID_PARAMETER
        ) {
            return Ok(Vec::new());
        }
        let b = buffer(frame, "query streams").map_err(|f| self.error(path, "query streams", f))?;
        wire::parse_streams(b).ok_or_else(|| {
            SourceError::new(
                SourceErrorKind::Io,
                path,
                "malformed stream list from the server",
            )
        })
    }

    /// A background fetch of one file's metadata (claimed by the caller) through the
    /// crate, on an idle session; a failure leaves nothing (the engine's own call then
    /// reports it).
    async fn prefetch_through_crate(self: &Arc<Self>, path: &SourcePath, eas: bool) {
        let permit = self.prefetch_slots.clone().acquire_owned().await;
        let i = self.next_link.fetch_add(1, Ordering::Relaxed) % self.slots.links.len();
        let fetched = match (permit, self.least_busy(i)) {
            (Ok(_permit), Some(link)) => {
                let _busy = link.busy_guard();
                self.fetch_metadata(&link, path, eas)
                    .await
                    .unwrap_or_default()
            }
            _ => Fetched::default(),
        };
        self.prefetch.finish(path, fetched);
    }

    /// Queues listed files for their metadata to be fetched ahead on the data
    /// connections, and starts workers for them (one per connection at most).
    fn queue_ahead(self: &Arc<Self>, paths: Vec<SourcePath>) {
        let mut a = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        a.queue.extend(paths);
        let want = self.data.max().min(a.queue.len());
        while a.workers < want {
            a.workers += 1;
            let s = self.clone();
            self.rt.spawn_blocking(move || s.ahead_worker());
        }
    }

    /// Fetches queued files' metadata ahead until the queue is empty: each turn takes a
    /// share of the queue (as many files as there are connections to share them, 1 to
    /// [`PREFETCH_BATCH`]) and sends their compounds together on one data connection,
    /// so a backlog costs one round trip per batch instead of one per file, while a
    /// short queue still spreads over every connection. A file that the data
    /// connection could not fetch goes through the crate.
    fn ahead_worker(self: &Arc<Self>) {
        let workers = self.data.max();
        loop {
            let batch = {
                let mut a = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
                if a.queue.is_empty() {
                    a.workers -= 1;
                    return;
                }
                let n = a.queue.len().div_ceil(workers).clamp(1, PREFETCH_BATCH);
                take_strided(&mut a.queue, n, workers)
            };
            let taken = batch.len();
            // A file fetched lately (by a call of the crawl's) or being fetched is skipped.
            let claimed: Vec<(SourcePath, bool)> = batch
                .into_iter()
                .filter(|p| self.prefetch.claim(p, true))
                .map(|p| {
                    let eas = self.ask_eas(&p);
                    (p, eas)
                })
                .collect();
            self.prefetch_queued
                .fetch_sub(taken - claimed.len(), Ordering::SeqCst);
            let answers = self.fetch_metadata_direct_batch(claimed.clone());
            for ((path, eas), answer) in claimed.into_iter().zip(answers) {
                match answer {
                    Some(r) => {
                        self.prefetch.finish(&path, r.unwrap_or_default());
                        self.prefetch_queued.fetch_sub(1, Ordering::SeqCst);
                    }
                    None => {
                        let s = self.clone();
                        self.rt.spawn(async move {
                            s.prefetch_through_crate(&path, eas).await;
                            s.prefetch_queued.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                }
            }
        }
    }

    /// One of an object's metadata answers: fetched ahead by an earlier call, or fetched
    /// now together with the others (kept for their calls). If the shared open is
    /// refused, `alone` asks with the narrowest access that answer needs.
    fn metadata<T>(
        &self,
        path: &SourcePath,
        pick: impl Fn(&mut Fetched) -> Option<SourceResult<T>>,
        alone: impl FnOnce() -> SourceResult<T>,
    ) -> SourceResult<T> {
        Self::win_path(path)?;
        for _ in 0..3 {
            if let Some(r) = self.prefetch.take(path, &pick) {
                return r;
            }
            if self.prefetch.claim(path, false) {
                if let Some(r) = self.prefetch.take(path, &pick) {
                    self.prefetch.finish(path, Fetched::default());
                    return r;
                }
                let eas = self.ask_eas(path);
                let fetched = match self.fetch_metadata_direct(path, eas) {
                    Some(r) => r.map_err(|f| self.error(path, "query metadata", f)),
                    None => self.link(path).and_then(|l| {
                        self.run(&l, self.fetch_metadata(&l, path, eas))
                            .map_err(|f| self.error(path, "query metadata", f))
                    }),
                };
                return match fetched {
                    Ok(mut f) => {
                        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
                        let r = pick(&mut f);
                        self.prefetch.finish(path, f);
                        r.unwrap_or_else(alone)
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

    /// Opens `path` with `access` alone, sends `q` and closes: one compound.
    fn query_alone(
        &self,
        path: &SourcePath,
        what: &'static str,
        access: u32,
        q: smb2::msg::query_info::QueryInfoRequest,
    ) -> SourceResult<Frame> {
        let name = Self::win_path(path)?.replace('/', "\\");
        let link = self.link(path)?;
        let create = wire::create(name, OpenFor::Only(access));
        let close = wire::close(FileId::SENTINEL);
        let ops: [link::Op<'_>; 3] = [
            (Command::Create, &create, 1),
            (Command::QueryInfo, &q, 1),
            (Command::Close, &close, 1),
        ];
        let mut frames = self
            .run(&link, link.compound(&ops, self.config.timeout))
            .map_err(|f| self.error(path, what, f))?;
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        if !is_ok(&frames[0]) {
            let fail = Fail::Status {
                status: status_of(&frames[0]),
                op: "open",
            };
            return Err(self.error(path, what, fail));
        }
        Ok(frames.swap_remove(1))
    }

    // ---------------------------------------------------------------------------------
    // Listing

    /// Lists `path` and, in the same compound, its attributes, security descriptor and
    /// EAs (the last two kept for the metadata calls that follow a listing).
    fn list(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, SourceResult<SourceAttr>)> {
        let name = Self::win_path(path)?.replace('/', "\\");
        let link = self.link(path)?;
        let buf = LIST_BUFFER.min(link.max_transact.max(64 << 10));
        let charge = wire::credit_charge(buf);
        let create = wire::create(name.clone(), OpenFor::List);
        let all = wire::query_all(FileId::SENTINEL);
        let sd = wire::query_security(FileId::SENTINEL);
        // The directory's EAs, unless its parent's listing said it has none (the root's
        // are always asked).
        let ask_eas = path.is_root() || self.ask_eas(path);
        let eas = wire::query_eas(FileId::SENTINEL);
        let first = wire::list(FileId::SENTINEL, true, buf);
        let second = wire::list(FileId::SENTINEL, false, buf);
        let close = wire::close(FileId::SENTINEL);
        let mut ops: Vec<link::Op<'_>> = vec![
            (Command::Create, &create, 1),
            (Command::QueryInfo, &all, 1),
            (Command::QueryInfo, &sd, 1),
        ];
        if ask_eas {
            ops.push((Command::QueryInfo, &eas, 1));
        }
        let listed_at = ops.len();
        ops.extend([
            (
                Command::QueryDirectory,
                &first as &dyn smb2::pack::Pack,
                charge,
            ),
            (Command::QueryDirectory, &second, charge),
            (Command::Close, &close, 1),
        ]);
        let frames = self
            .run(&link, link.compound(&ops, self.config.timeout))
            .map_err(|f| self.error(path, "list", f))?;
        self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
        if !is_ok(&frames[0]) {
            let status = status_of(&frames[0]);
            if status == STATUS_NOT_A_DIRECTORY {
                return Err(SourceError::new(
                    SourceErrorKind::WrongKind,
                    path,
                    "not a directory",
                ));
            }
            return Err(self.error(path, "list", Fail::Status { status, op: "open" }));
        }
        let raw_attr = buffer(&frames[1], "query info").and_then(|b| {
            wire::parse_all_information(b).ok_or(Fail::Malformed("FileAllInformation"))
        });
        // EAs left out (the parent's listing said none) but set since: asked apart.
        let eas_missing = !ask_eas && raw_attr.as_ref().is_ok_and(|r| r.ea_size != 0);
        let attr = raw_attr
            .map(|r| self.attr(&r))
            .map_err(|f| self.error(path, "query info", f));
        let own_id = match &attr {
            Ok(a) => a.ino,
            Err(_) => self.dir_ids.get(path).unwrap_or(0),
        };
        self.refuse_cycle(path, own_id)?;
        self.dir_ids.note(path, own_id);
        let mut raw = Vec::new();
        let mut complete = false;
        for f in &frames[listed_at..listed_at + 2] {
            match status_of(f) {
                STATUS_NO_MORE_FILES => {
                    complete = true;
                    break;
                }
                _ => {
                    let b = buffer(f, "query directory")
                        .map_err(|e| self.error(path, "query directory", e))?;
                    wire::parse_directory(b, &mut raw).ok_or_else(|| {
                        SourceError::new(SourceErrorKind::Io, path, "malformed directory listing")
                    })?;
                }
            }
        }
        if !complete {
            // More than two buffers' worth: page through the directory on a handle of its
            // own.
            raw.clear();
            let got = self.run(&link, self.list_long(&link, name, buf, &mut raw));
            got.map_err(|f| self.error(path, "query directory", f))?;
        }
        let xattrs = if ask_eas {
            self.eas_from(path, &frames[3])
        } else {
            self.stats.eas_skipped.fetch_add(1, Ordering::Relaxed);
            if eas_missing {
                self.stats.eas_asked_apart.fetch_add(1, Ordering::Relaxed);
                self.eas_alone(path)
            } else {
                Ok(Vec::new())
            }
        };
        self.prefetch.put(
            path,
            Fetched {
                attr: None,
                xattrs: Some(xattrs),
                acl: Some(self.acl_from(path, &frames[2])),
                streams: Some(Ok(Vec::new())),
            },
        );
        let mut entries = Vec::with_capacity(raw.len());
        for (name, r) in raw {
            if name == "." || name == ".." {
                continue;
            }
            let attr = self.attr(&r);
            if let Ok(child) = path.join(name.as_bytes()) {
                self.hint_eas(&child, r.ea_size);
                match attr.kind {
                    FileKind::Regular => self.hint_size(&child, attr.size),
                    FileKind::Directory => self.dir_ids.note(&child, attr.ino),
                    _ => {}
                }
            }
            entries.push(SourceEntry {
                name: name.into_bytes(),
                attr,
            });
        }
        Ok((entries, attr))
    }

    /// Refuses to list `path`, whose FileId is `id`, when it is one of its ancestors
    /// again (a symlink to an ancestor the server follows): see `cycle`. Ancestors whose
    /// FileId is not remembered are asked for (one compound each); one that cannot be
    /// asked is taken as no cycle.
    fn refuse_cycle(&self, path: &SourcePath, id: u64) -> SourceResult<()> {
        let same = match self.dir_ids.ancestor_with(path, id) {
            cycle::Ancestor::Same(a) => Some(a),
            cycle::Ancestor::Unknown(unknown) => unknown.into_iter().find(|a| {
                let got = self
                    .query_alone(
                        a,
                        "stat",
                        smb2::types::flags::FileAccessMask::FILE_READ_ATTRIBUTES,
                        wire::query_all(FileId::SENTINEL),
                    )
                    .ok()
                    .and_then(|f| {
                        buffer(&f, "query info")
                            .ok()
                            .and_then(wire::parse_all_information)
                    });
                match got {
                    Some(r) => {
                        self.dir_ids.note(a, r.file_id);
                        r.file_id == id
                    }
                    None => false,
                }
            }),
        };
        match same {
            Some(a) => Err(SourceError::new(
                SourceErrorKind::Unsupported,
                path,
                cycle::cycle_reason(&a, id),
            )),
            None => Ok(()),
        }
    }

    /// A long listing: opens the directory and asks for entries until there are no more.
    async fn list_long(
        &self,
        link: &Arc<Link>,
        name: String,
        buf: u32,
        out: &mut Vec<(String, RawAttr)>,
    ) -> Result<(), Fail> {
        let create = wire::create(name, OpenFor::List);
        let first = wire::list(FileId::SENTINEL, true, buf);
        let charge = wire::credit_charge(buf);
        let frames = link
            .compound(
                &[
                    (Command::Create, &create, 1),
                    (Command::QueryDirectory, &first, charge),
                ],
                self.config.timeout,
            )
            .await?;
        if !is_ok(&frames[0]) {
            return Err(Fail::Status {
                status: status_of(&frames[0]),
                op: "open",
            });
        }
        let file_id = wire::created_file_id(&frames[0].body).ok_or(Fail::Malformed("CREATE"))?;
        let mut frame = frames
            .into_iter()
            .nth(1)
            .ok_or(Fail::Malformed("listing"))?;
        let result = loop {
            if status_of(&frame) == STATUS_NO_MORE_FILES {
                break Ok(());
            }
            match buffer(&frame, "query directory") {
                Ok(b) => {
                    if wire::parse_directory(b, out).is_none() {
                        break Err(Fail::Malformed("directory listing"));
                    }
                }
                Err(e) => break Err(e),
            }
            self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
            let next = wire::list(file_id, false, buf);
            frame = match link
                .single(
                    (Command::QueryDirectory, &next, charge),
                    self.config.timeout,
                )
                .await
            {
                Ok(f) => f,
                Err(e) => break Err(e),
            };
        };
        link.close_in_background(&self.rt, file_id);
        result
    }

    // ---------------------------------------------------------------------------------
    // Reading

    /// Fills `buf` from `offset` of the main stream (`suffix` = "") or a named stream
    /// (`suffix` = ":name"); with `want_attr` also the attributes after the read.
    fn read_range(
        &self,
        path: &SourcePath,
        suffix: &str,
        offset: u64,
        buf: &mut [u8],
        want_attr: bool,
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        let name = wire::wire_name(Self::win_path(path)?, suffix);
        if buf.is_empty() {
            return Ok((0, None));
        }
        // The handle kept from this file's previous unit.
        let kept = if suffix.is_empty() {
            self.take_kept(path)
        } else {
            None
        };
        if let Some(k) = kept {
            self.stats.reads_continued.fetch_add(1, Ordering::Relaxed);
            let r = self.run(
                &k.link,
                self.read_window(&k.link, k.file_id, offset, buf, want_attr),
            );
            match r {
                Ok((n, attr)) => {
                    self.after_window(
                        path,
                        suffix,
                        &k.link,
                        k.file_id,
                        offset,
                        n,
                        buf.len(),
                        attr.as_ref(),
                    );
                    return Ok((n, attr.map(|a| self.attr(&a))));
                }
                Err(f) if kind_of(&f) == SourceErrorKind::Unreachable => {
                    return Err(self.error(path, "read", f));
                }
                Err(f) => {
                    // The kept handle went bad: a fresh open below.
                    tracing::debug!(%path, error = %f, "smb2: kept handle failed");
                    k.link.close_in_background(&self.rt, k.file_id);
                }
            }
        }
        let link = self.link(path)?;
        let max_read = link.max_read.max(64 << 10) as usize;
        let hint = if suffix.is_empty() {
            self.take_size_hint(path)
        } else {
            None
        };
        // One compound when the wanted range fits one READ: the whole buffer, or what the
        // listing says is left of the file (plus slack for a file that grew a little).
        let wanted = match hint {
            Some(size) => (size.saturating_sub(offset) as usize + (64 << 10)).min(buf.len()),
            None => buf.len(),
        };
        // A later unit of a file read on a data connection goes on with its handle.
        let direct = suffix.is_empty() && (wanted > max_read || self.data.holds(path));
        if !direct {
            let len = wanted.min(max_read);
            let split = wire::aligned_split(offset, len, hint);
            let on_data = if suffix.is_empty() {
                self.data
                    .read_small(path, &name, offset, &mut buf[..len], split, &self.requests)
            } else {
                None
            };
            let r = match on_data {
                Some(r) => r,
                None => self.run(
                    &link,
                    self.read_compound(&link, name, offset, &mut buf[..len], split),
                ),
            };
            let (n, attr) = r.map_err(|f| self.error(path, "read", f))?;
            self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
            self.stats.reads_compound.fetch_add(1, Ordering::Relaxed);
            if n == len && len < buf.len() {
                // The file is longer than the listing said: the rest with an open of its own.
                let (more, attr) =
                    self.read_range(path, suffix, offset + n as u64, &mut buf[n..], want_attr)?;
                return Ok((n + more, attr));
            }
            return Ok((n, attr.map(|a| self.attr(&a))));
        }
        if direct
            && let Some(r) = self
                .data
                .read(path, &name, offset, buf, want_attr, &self.requests)
        {
            let r = r.map_err(|f| self.error(path, "read", f))?;
            let way = if r.opened {
                &self.stats.reads_opened
            } else {
                &self.stats.reads_continued
            };
            way.fetch_add(1, Ordering::Relaxed);
            self.stats
                .round_trips
                .fetch_add(r.round_trips, Ordering::Relaxed);
            return Ok((r.n, r.attr.map(|a| self.attr(&a))));
        }
        self.stats.reads_opened.fetch_add(1, Ordering::Relaxed);
        let r = self.run(&link, async {
            let file_id = self.open_for_read(&link, name).await?;
            self.stats.round_trips.fetch_add(1, Ordering::Relaxed);
            match self
                .read_window(&link, file_id, offset, buf, want_attr)
                .await
            {
                Ok((n, attr)) => Ok((file_id, n, attr)),
                Err(e) => {
                    link.close_in_background(&self.rt, file_id);
                    Err(e)
                }
            }
        });
        let (file_id, n, attr) = r.map_err(|f| self.error(path, "read", f))?;
        self.after_window(
            path,
            suffix,
            &link,
            file_id,
            offset,
            n,
            buf.len(),
            attr.as_ref(),
        );
        Ok((n, attr.map(|a| self.attr(&a))))
    }

    /// Keeps the handle for the file's next unit when the read filled the buffer and the
    /// file goes on; closes it (in the background) otherwise.
    #[allow(clippy::too_many_arguments)]
    fn after_window(
        &self,
        path: &SourcePath,
        suffix: &str,
        link: &Arc<Link>,
        file_id: FileId,
        offset: u64,
        n: usize,
        len: usize,
        attr: Option<&RawAttr>,
    ) {
        let more = n == len && attr.is_none_or(|a| a.size > offset + n as u64);
        if suffix.is_empty() && more {
            self.keep(path, link.clone(), file_id);
        } else {
            link.close_in_background(&self.rt, file_id);
        }
    }

    fn keep(&self, path: &SourcePath, link: Arc<Link>, file_id: FileId) {
        let mut kept = self.kept.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if kept.len() >= KEPT_HANDLES {
            let old: Vec<SourcePath> = kept
                .iter()
                .filter(|(_, k)| now.duration_since(k.at) > KEPT_HANDLE_TTL)
                .map(|(p, _)| p.clone())
                .collect();
            for p in old {
                if let Some(k) = kept.remove(&p) {
                    k.link.close_in_background(&self.rt, k.file_id);
                }
            }
            if kept.len() >= KEPT_HANDLES {
                // Still full: this handle is not kept.
                link.close_in_background(&self.rt, file_id);
                return;
            }
        }
        if let Some(old) = kept.insert(
            path.clone(),
            Kept {
                link,
                file_id,
                at: now,
            },
        ) {
            old.link.close_in_background(&self.rt, old.file_id);
        }
    }

    fn take_kept(&self, path: &SourcePath) -> Option<Kept> {
        let k = self
            .kept
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(path)?;
        if k.link.is_live() && k.at.elapsed() < KEPT_HANDLE_TTL {
            Some(k)
        } else {
            k.link.close_in_background(&self.rt, k.file_id);
            None
        }
    }

    /// CREATE + READ + QUERY_INFO (attributes after the read) + CLOSE: one round trip.
    /// With `split` (see [`wire::aligned_split`]) the range is asked as two READs, the
    /// first ending on an 8-byte boundary.
    async fn read_compound(
        &self,
        link: &Link,
        name: String,
        offset: u64,
        buf: &mut [u8],
        split: Option<usize>,
    ) -> Result<(usize, Option<RawAttr>), Fail> {
        let chain = wire::ReadCompound::new(wire::ReadFrom::Name(name), offset, buf.len(), split);
        let frames = link.compound(&chain.ops(), self.config.timeout).await?;
        if let Some(c) = chain.create_at()
            && !is_ok(&frames[c])
        {
            return Err(Fail::Status {
                status: status_of(&frames[c]),
                op: "open",
            });
        }
        let first = chain.first;
        let mut n = copy_read(&frames[chain.read_at()], &mut buf[..first])?;
        if let Some(t) = chain.tail_at()
            && n == first
        {
            n += copy_read(&frames[t], &mut buf[first..])?;
        }
        let attr = buffer(&frames[chain.query_at()], "query info")
            .ok()
            .and_then(wire::parse_all_information);
        Ok((n, attr))
    }

    /// CREATE + QUERY_INFO, keeping the handle: one round trip.
    async fn open_for_read(&self, link: &Link, name: String) -> Result<FileId, Fail> {
        let create = wire::create(name, OpenFor::Read);
        let frame = link
            .single((Command::Create, &create, 1), self.config.timeout)
            .await?;
        if !is_ok(&frame) {
            return Err(Fail::Status {
                status: status_of(&frame),
                op: "open",
            });
        }
        wire::created_file_id(&frame.body).ok_or(Fail::Malformed("CREATE"))
    }

    /// Reads into `buf` from `offset` on an open handle with a sliding window of READs
    /// (each awaited at most the timeout), and with `want_attr` the attributes, asked
    /// together with the last READ. Returns the bytes read (fewer only at end of file).
    async fn read_window(
        &self,
        link: &Arc<Link>,
        file_id: FileId,
        offset: u64,
        buf: &mut [u8],
        want_attr: bool,
    ) -> Result<(usize, Option<RawAttr>), Fail> {
        let piece = self
            .config
            .read_size
            .min(link.max_read.max(64 << 10) as usize)
            .max(1);
        let parallel = self.config.parallel_reads;
        let timeout = self.config.timeout;
        let mut tasks = tokio::task::JoinSet::new();
        let mut next = 0usize;
        let mut eof_at: Option<usize> = None;
        let mut attr = None;
        let mut in_flight = 0usize;
        let mut pieces = 0usize;
        let mut asked_attr = false;
        loop {
            while in_flight < parallel && next < buf.len() && eof_at.is_none_or(|e| next < e) {
                let len = piece.min(buf.len() - next);
                let l = link.clone();
                let at = next;
                let last = next + len >= buf.len();
                tasks.spawn(async move {
                    let read = wire::read(file_id, offset + at as u64, len as u32);
                    let r = l
                        .single(
                            (Command::Read, &read, wire::credit_charge(len as u32)),
                            timeout,
                        )
                        .await;
                    (at, len, Some(r), None)
                });
                if last && want_attr {
                    asked_attr = true;
                    let l = link.clone();
                    tasks.spawn(async move {
                        let q = wire::query_all(file_id);
                        let r = l.single((Command::QueryInfo, &q, 1), timeout).await;
                        (0, 0, None, Some(r))
                    });
                    in_flight += 1;
                }
                next += len;
                in_flight += 1;
                pieces += 1;
            }
            if in_flight == 0 {
                break;
            }
            let joined = tokio::time::timeout(timeout * 2, tasks.join_next())
                .await
                .map_err(|_| Fail::TimedOut)?;
            let Some(joined) = joined else { break };
            in_flight -= 1;
            let (at, len, read, query) = joined.map_err(|_| Fail::Malformed("read task"))?;
            if let Some(r) = query {
                let frame = r?;
                attr = buffer(&frame, "query info")
                    .ok()
                    .and_then(wire::parse_all_information);
                continue;
            }
            if let Some(r) = read {
                let frame = r?;
                let got = copy_read(&frame, &mut buf[at..at + len])?;
                if got < len {
                    eof_at = Some(eof_at.map_or(at + got, |e| e.min(at + got)));
                }
            }
        }
        // With `parallel` READs in flight, a reply is waited for once per window.
        let mut windows = pieces.div_ceil(parallel) as u64;
        if want_attr && !asked_attr {
            // The end of file came before the last READ went out (the file shrank).
            let q = wire::query_all(file_id);
            let frame = link.single((Command::QueryInfo, &q, 1), timeout).await?;
            attr = buffer(&frame, "query info")
                .ok()
                .and_then(wire::parse_all_information);
            windows += 1;
        }
        self.stats.round_trips.fetch_add(windows, Ordering::Relaxed);
        Ok((eof_at.unwrap_or(buf.len()).min(buf.len()), attr))
    }

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

/// Copies a READ reply's data into `buf`; end of file is 0 bytes.
fn copy_read(frame: &Frame, buf: &mut [u8]) -> Result<usize, Fail> {
    match status_of(frame) {
        STATUS_END_OF_FILE => Ok(0),
        0 => {
            let data = wire::read_data(&frame.body).ok_or(Fail::Malformed("READ"))?;
            let n = data.len().min(buf.len());
            buf[..n].copy_from_slice(&data[..n]);
            Ok(n)
        }
        status => Err(Fail::Status { status, op: "read" }),
    }
}

impl Source for SmbSource {
    fn describe(&self) -> String {
        let c = &self.shared.config;
        format!("smb://{}/{}", c.server(), c.share)
    }

    fn identity(&self) -> Option<String> {
        let s = &self.shared;
        let root = SourcePath::root();
        let link = s.link(&root).ok()?;
        match s.run(&link, share_identity(&link, s.config.timeout)) {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::debug!(error = %e, "smb2: share identity unknown");
                None
            }
        }
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
        let s = &self.shared;
        if let Some(r) = s.prefetch.take(path, |f| f.attr.take()) {
            return r;
        }
        let frame = s.query_alone(
            path,
            "stat",
            smb2::types::flags::FileAccessMask::FILE_READ_ATTRIBUTES,
            wire::query_all(FileId::SENTINEL),
        )?;
        let raw = buffer(&frame, "query info")
            .and_then(|b| {
                wire::parse_all_information(b).ok_or(Fail::Malformed("FileAllInformation"))
            })
            .map_err(|f| s.error(path, "stat", f))?;
        Ok(s.attr(&raw))
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        let (entries, attr) = self.shared.list(path)?;
        self.shared.prefetch.put(
            path,
            Fetched {
                attr: Some(attr),
                ..Fetched::default()
            },
        );
        self.prefetch_listed(path, &entries);
        Ok(entries)
    }

    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        let (entries, attr) = self.shared.list(path)?;
        self.prefetch_listed(path, &entries);
        // A failed attribute query is not the listing's failure: the engine then stats.
        Ok((entries, attr.ok()))
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        Ok(self.shared.read_vec(path, "", offset, len, false)?.0)
    }

    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.shared.read_vec(path, "", offset, len, true)
    }

    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        self.shared.read_range(path, "", offset, buf, true)
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "SMB servers follow symlinks; no link is ever visible",
        ))
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let s = &self.shared;
        s.metadata(
            path,
            |f| f.xattrs.take(),
            || {
                let f = s.query_alone(
                    path,
                    "query EAs",
                    smb2::types::flags::FileAccessMask::FILE_READ_EA,
                    wire::query_eas(FileId::SENTINEL),
                )?;
                s.eas_from(path, &f)
            },
        )
    }

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        let s = &self.shared;
        s.metadata(
            path,
            |f| f.acl.take(),
            || {
                let f = s.query_alone(
                    path,
                    "query security",
                    smb2::types::flags::FileAccessMask::READ_CONTROL,
                    wire::query_security(FileId::SENTINEL),
                )?;
                s.acl_from(path, &f)
            },
        )
    }

    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        let s = &self.shared;
        if !s.named_streams {
            Shared::win_path(path)?;
            return Ok(Vec::new());
        }
        s.metadata(
            path,
            |f| f.streams.take(),
            || {
                let f = s.query_alone(
                    path,
                    "query streams",
                    smb2::types::flags::FileAccessMask::FILE_READ_ATTRIBUTES,
                    wire::query_streams(FileId::SENTINEL),
                )?;
                s.streams_from(path, &f)
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
            .shared
            .read_vec(path, &format!(":{stream}"), offset, len, false)?
            .0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads of this process whose name is `name`.
    fn threads_named(name: &str) -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim_end() == name)
            .count()
    }

    fn runtime(name: &str) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(name)
            .enable_all()
            .build()
            .unwrap()
    }

    /// A stopped runtime's threads are gone (joined, not detached while they exit: see
    /// `stop_runtime`), also one that was running a blocking task, and also when stopped
    /// from within an async context.
    #[test]
    fn stop_runtime_joins_its_threads() {
        for (name, in_async) in [("kaiso-t-stop-a", false), ("kaiso-t-stop-b", true)] {
            let rt = runtime(name);
            // A blocking task still running at the stop (a name lookup does that). 3 s: a
            // detached thread would still be sleeping after the 1.5 s wait below, however
            // late a loaded machine gets this thread there.
            let h = rt.spawn_blocking(|| std::thread::sleep(Duration::from_secs(3)));
            let t = Instant::now();
            while threads_named(name) < 3 && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(
                threads_named(name),
                3,
                "two workers and one blocking thread expected before the stop"
            );
            drop(h);
            if in_async {
                let outer = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap();
                outer.block_on(async move { stop_runtime(rt, Duration::from_secs(10)) });
            } else {
                stop_runtime(rt, Duration::from_secs(10));
            }
            // A joined thread leaves /proc a moment after pthread_join returns; a detached
            // one here still sleeps out its 3 s.
            let t = Instant::now();
            while threads_named(name) > 0 && t.elapsed() < Duration::from_millis(1500) {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(
                threads_named(name),
                0,
                "every thread of the runtime joined when stop_runtime returns (in_async: \
                 {in_async}); threads still running were left detached"
            );
        }
    }
}
