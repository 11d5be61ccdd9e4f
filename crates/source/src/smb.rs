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

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use binrw::BinWrite;
use kaiso_store::migrate::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
use smb::binrw_util::file_time::FileTime;
use smb::{
    AdditionalInfo, Client, ClientConfig, Connection, FileAccessMask, FileAllInformation,
    FileAttributes, FileCreateArgs, FileIdBothDirectoryInformation, FileStreamInformation,
    Resource, UncPath,
};

/// The bytes one SMB2 credit pays for. A larger READ costs several credits, and the `smb`
/// crate (0.12) waits for them without asking the server for more: before Samba has
/// granted that many (it grants them gradually), a 1 MiB READ (16 credits) waits forever.
/// One-credit READs always progress, so READs are capped here and kept in flight instead.
pub const SMB_CREDIT_BYTES: usize = 64 << 10;

/// How long one SMB request may go unanswered by default before the call fails.
pub const SMB_DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

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
    /// Size of one READ request, at most [`SMB_CREDIT_BYTES`] (see there).
    pub read_size: usize,
    /// READ requests kept in flight for one `read` call.
    pub parallel_reads: usize,
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
            read_size: SMB_CREDIT_BYTES,
            parallel_reads: 16,
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

/// One authenticated session with the share over one TCP connection.
struct Link {
    client: Client,
    connection: Arc<Connection>,
    /// Set once a request failed for want of the server: the link is shut and replaced
    /// on the next call.
    broken: Arc<AtomicBool>,
    /// Handles to close: a call does not wait for its CLOSE round trip.
    closer: Mutex<Option<std::sync::mpsc::Sender<Resource>>>,
}

/// Threads closing handles in the background for one link.
const CLOSER_THREADS: usize = 4;

impl Link {
    fn connect(config: &SmbConfig, share: &UncPath) -> Result<Self, smb::Error> {
        let mut cc = ClientConfig::default();
        cc.connection.port = Some(config.port);
        cc.connection.timeout = Some(config.timeout);
        // Samba (and every SMB 2+ server) answers the SMB2 negotiate directly: this saves
        // the SMB1 round trip of the multi-protocol negotiation.
        cc.connection.smb2_only_negotiate = true;
        let client = Client::new(cc);
        // Connect first, then switch Nagle off on the socket before the session setup:
        // the crate writes each message as a 4-byte transport header and then the body,
        // so with Nagle on, the body waits for the ACK of the header, which the server
        // delays (40 ms on Linux): every request cost a delayed-ACK timeout.
        let connection = client.connect(&config.host)?;
        let addr = smb::transport::utils::TransportUtils::parse_socket_address(&config.host)?;
        set_nodelay_on_sockets_to(SocketAddr::new(addr.ip(), config.port));
        let broken = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel::<Resource>();
        let rx = Arc::new(Mutex::new(rx));
        for _ in 0..CLOSER_THREADS {
            let (rx, conn, broken) = (rx.clone(), connection.clone(), broken.clone());
            let _ = std::thread::Builder::new()
                .name("smb-close".into())
                .spawn(move || {
                    loop {
                        let next = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                        let Ok(r) = next else { break };
                        if let Err(e) = r.close_quietly()
                            && is_unreachable(&e)
                        {
                            shut_connection(&conn, &broken);
                        }
                    }
                });
        }
        let link = Self {
            client,
            connection,
            broken,
            closer: Mutex::new(Some(tx)),
        };
        if let Err(e) = link
            .client
            .share_connect(share, &config.user, config.password.clone())
        {
            link.shut();
            return Err(e);
        }
        Ok(link)
    }

    /// Passes `r` through; an error that means the server is gone or silent shuts the
    /// link at once, so the requests still to come on it (closes) fail without waiting.
    fn check<T>(&self, r: smb::Result<T>) -> smb::Result<T> {
        if let Err(e) = &r
            && is_unreachable(e)
        {
            self.shut();
        }
        r
    }

    /// Stops the connection's worker threads (no request is sent), so pending and later
    /// requests on this link fail immediately instead of each waiting for the timeout.
    fn shut(&self) {
        shut_connection(&self.connection, &self.broken);
    }

    /// Closes a handle in the background; a failure is of no consequence to the call
    /// (but a silent server still shuts the link).
    fn close(&self, r: Resource) {
        let queued = match self
            .closer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            Some(tx) => tx.send(r).map_err(|e| e.0),
            None => Err(r),
        };
        if let Err(r) = queued {
            let _ = self.check(r.close_quietly());
        }
    }

    /// Opens an existing object; a failure is labelled "open" for [`SmbSource::call`].
    fn open(
        &self,
        share: &UncPath,
        p: &str,
        access: FileAccessMask,
    ) -> Result<Resource, (String, smb::Error)> {
        let target = share.clone().with_path(p);
        self.check(
            self.client
                .create_file(&target, &FileCreateArgs::make_open_existing(access)),
        )
        .map_err(|e| ("open".into(), e))
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Ends the closer threads once they have closed what is queued.
        self.closer
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// Stops a connection's worker threads once (see [`Link::shut`]).
fn shut_connection(connection: &Connection, broken: &AtomicBool) {
    if broken.swap(true, Ordering::SeqCst) {
        return;
    }
    // smb 0.12's threaded worker `stop` unwraps a channel send that fails if its sender
    // thread already ended; that must not take the caller down.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = connection.close();
    }));
}

/// Sets TCP_NODELAY on this process's TCP sockets connected to `peer`. The `smb` crate
/// (0.12) does not set it and keeps its socket private; any other socket to the same SMB
/// server wants it too.
fn set_nodelay_on_sockets_to(peer: SocketAddr) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    let mut n = 0;
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        if peer_of(fd) == Some(peer) {
            let one: libc::c_int = 1;
            // SAFETY: plain setsockopt on a descriptor number; a descriptor closed and
            // reused meanwhile at worst gets TCP_NODELAY (or ENOTSOCK).
            let rc = unsafe {
                libc::setsockopt(
                    fd,
                    libc::IPPROTO_TCP,
                    libc::TCP_NODELAY,
                    (&one as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                )
            };
            if rc == 0 {
                n += 1;
            }
        }
    }
    n
}

/// The remote address of socket `fd`, if it is a connected TCP/IP socket.
fn peer_of(fd: i32) -> Option<SocketAddr> {
    // SAFETY: getpeername writes at most `len` bytes into the zeroed storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut ss as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match ss.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: libc::sockaddr_in =
                unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: libc::sockaddr_in6 =
                unsafe { std::ptr::read((&ss as *const libc::sockaddr_storage).cast()) };
            Some(SocketAddr::from((
                a.sin6_addr.s6_addr,
                u16::from_be(a.sin6_port),
            )))
        }
        _ => None,
    }
}

/// An SMB share read over one authenticated session, reconnected after a failure.
pub struct SmbSource {
    config: SmbConfig,
    share: UncPath,
    /// The current session; `None` or broken means the next call connects again.
    link: Mutex<Option<Arc<Link>>>,
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

impl SmbSource {
    /// Connects and authenticates (NTLM) to `\\host\share`.
    pub fn connect(config: SmbConfig) -> SourceResult<Self> {
        let root = SourcePath::root();
        if config.read_size == 0 || config.parallel_reads == 0 {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                &root,
                "read_size and parallel_reads must be > 0",
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
            config,
            share,
            link: Mutex::new(None),
        };
        source.link(&root)?;
        Ok(source)
    }

    /// The live session, connecting a new one if there is none or the last one broke.
    fn link(&self, path: &SourcePath) -> SourceResult<Arc<Link>> {
        let mut slot = self.link.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = slot.as_ref()
            && !l.broken.load(Ordering::SeqCst)
        {
            return Ok(l.clone());
        }
        if let Some(old) = slot.take() {
            drop_in_background(old);
        }
        let l = Arc::new(
            Link::connect(&self.config, &self.share)
                .map_err(|e| self.error(path, &format!("connect to share {}", self.share), &e))?,
        );
        *slot = Some(l.clone());
        Ok(l)
    }

    /// Runs one source call on the live session; errors name the server.
    fn call<T>(
        &self,
        path: &SourcePath,
        what: &str,
        f: impl FnOnce(&Link) -> Result<T, (String, smb::Error)>,
    ) -> SourceResult<T> {
        let link = self.link(path)?;
        f(&link).map_err(|(op, e)| {
            let op = if op.is_empty() { what.to_string() } else { op };
            self.error(path, &op, &e)
        })
    }

    fn error(&self, path: &SourcePath, what: &str, e: &smb::Error) -> SourceError {
        let mut err = smb_error(path, what, e);
        if err.kind == SourceErrorKind::Unreachable {
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

/// Errors that mean the server is gone, silent, or the link to it was shut.
fn is_unreachable(e: &smb::Error) -> bool {
    matches!(
        e,
        smb::Error::IoError(_)
            | smb::Error::ConnectionStopped
            | smb::Error::TransportError(_)
            | smb::Error::OperationTimeout(..)
            | smb::Error::ChannelRecvError(_)
            // What the crate returns once its worker threads are stopped.
            | smb::Error::MessageProcessingError(_)
    )
}

/// Drops a session on a thread of its own: a polite tree disconnect and logoff on a
/// link that has not noticed its server died would wait for the timeout twice.
fn drop_in_background(link: Arc<Link>) {
    if link.broken.load(Ordering::SeqCst) {
        drop(link);
        return;
    }
    let _ = std::thread::Builder::new()
        .name("smb-logoff".into())
        .spawn(move || drop(link));
}

impl Drop for SmbSource {
    fn drop(&mut self) {
        let slot = self.link.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = slot.take() {
            drop_in_background(l);
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

impl Source for SmbSource {
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
        let p = Self::win_path(path)?;
        let access = FileAccessMask::new().with_file_read_attributes(true);
        let info = self.call(path, "stat", |l| {
            let r = l.open(&self.share, &p, access)?;
            let info = l.check(r.as_handle_query_all());
            l.close(r);
            info.map_err(|e| ("query info".into(), e))
        })?;
        Ok(self.attr_from_all(&info))
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        let p = Self::win_path(path)?;
        let listed = self.call(path, "list", |l| {
            let dir = match l.open(&self.share, &p, Self::read_access())? {
                Resource::Directory(d) => d,
                other => {
                    l.close(other);
                    return Ok(None);
                }
            };
            let mut out = Vec::new();
            let mut failure = None;
            match l.check(dir.query::<FileIdBothDirectoryInformation>("*")) {
                Ok(iter) => {
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
                                out.push(SourceEntry {
                                    name: name.into_bytes(),
                                    attr,
                                });
                            }
                            Err(e) if status_of(&e) == Some(STATUS_NO_MORE_FILES) => break,
                            Err(e) => {
                                failure = Some(e);
                                break;
                            }
                        }
                    }
                }
                Err(e) if status_of(&e) == Some(STATUS_NO_MORE_FILES) => {}
                Err(e) => failure = Some(e),
            }
            let _ = l.check(dir.close());
            match failure {
                Some(e) => Err(("query directory".into(), e)),
                None => Ok(Some(out)),
            }
        })?;
        listed.ok_or_else(|| SourceError::new(SourceErrorKind::WrongKind, path, "not a directory"))
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.read_named(path, "", offset, len)
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "SMB servers follow symlinks; no link is ever visible",
        ))
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let p = Self::win_path(path)?;
        let res = self.call(path, "query EAs", |l| {
            let r = l.open(&self.share, &p, Self::read_access())?;
            let res = l.check(r.as_handle_query_eas());
            l.close(r);
            match res {
                Ok(eas) => Ok(eas),
                Err(e)
                    if matches!(
                        status_of(&e),
                        Some(
                            STATUS_NO_EAS_ON_FILE | STATUS_EAS_NOT_SUPPORTED | STATUS_NOT_SUPPORTED
                        )
                    ) =>
                {
                    Ok(Vec::new())
                }
                Err(e) => Err((String::new(), e)),
            }
        })?;
        let mut out: Vec<(Vec<u8>, Vec<u8>)> = res
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

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        let p = Self::win_path(path)?;
        let info = AdditionalInfo::new()
            .with_owner_security_information(true)
            .with_group_security_information(true)
            .with_dacl_security_information(true);
        let sd = self.call(path, "query security", |l| {
            let r = l.open(
                &self.share,
                &p,
                FileAccessMask::new().with_read_control(true),
            )?;
            let sd = l.check(r.as_handle_security(info));
            l.close(r);
            sd.map_err(|e| (String::new(), e))
        })?;
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

    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        let p = Self::win_path(path)?;
        let info = self.call(path, "query streams", |l| {
            let r = l.open(&self.share, &p, Self::read_access())?;
            if r.is_dir() {
                l.close(r);
                return Ok(None);
            }
            let info = l.check(r.as_handle_query_streams());
            l.close(r);
            match info {
                Ok(i) => Ok(Some(i)),
                Err(e) if matches!(status_of(&e), Some(STATUS_NOT_SUPPORTED)) => Ok(None),
                Err(e) => Err((String::new(), e)),
            }
        })?;
        let mut out = Vec::new();
        for s in info.iter().flat_map(|i| i.iter()) {
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
        self.read_named(path, &format!(":{stream}"), offset, len)
    }
}

impl SmbSource {
    /// Reads `len` bytes from `offset` of the main stream (`suffix` = "") or a named
    /// stream (`suffix` = ":name"), with up to `parallel_reads` READs in flight.
    fn read_named(
        &self,
        path: &SourcePath,
        suffix: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        let p = format!("{}{suffix}", Self::win_path(path)?);
        let piece = self.config.read_size.min(SMB_CREDIT_BYTES);
        let parallel = self.config.parallel_reads;
        let mut buf = vec![0u8; len];
        let total = self.call(path, "read", |l| {
            let file = match l.open(&self.share, &p, Self::read_access())? {
                Resource::File(f) => f,
                other => {
                    l.close(other);
                    return Ok(None);
                }
            };
            let result = read_pieces(l, &file, &mut buf, offset, piece, parallel);
            l.close(Resource::File(file));
            result.map(Some).map_err(|e| (String::new(), e))
        })?;
        let total = total.ok_or_else(|| {
            SourceError::new(SourceErrorKind::WrongKind, path, "read of a directory")
        })?;
        buf.truncate(total);
        Ok(buf)
    }
}

/// `File::read_block` (smb 0.12) turns every error into an `io::Error` holding only the
/// message; this recovers whether the server is unreachable from that message.
fn read_error(e: std::io::Error) -> smb::Error {
    const GONE: [&str; 6] = [
        "Operation timed out",
        "Client connection is stopped",
        "Transport error",
        "IO Error",
        "Message processing failed",
        "Channel recv error",
    ];
    let msg = e.to_string();
    if e.kind() != std::io::ErrorKind::InvalidData && GONE.iter().any(|g| msg.starts_with(g)) {
        smb::Error::IoError(e)
    } else {
        smb::Error::InvalidMessage(msg)
    }
}

/// Fills `buf` from `offset` of `file` in `piece`-sized READs, `parallel` at a time;
/// returns the bytes read (short at end of file).
fn read_pieces(
    l: &Link,
    file: &smb::File,
    buf: &mut [u8],
    offset: u64,
    piece: usize,
    parallel: usize,
) -> smb::Result<usize> {
    std::thread::scope(|s| {
        let mut chunks: Vec<(u64, &mut [u8])> = buf
            .chunks_mut(piece)
            .enumerate()
            .map(|(i, c)| (offset + (i * piece) as u64, c))
            .collect();
        let mut total = 0usize;
        // Waves of `parallel` concurrent READs; stop at the first short piece (EOF).
        while !chunks.is_empty() {
            let take = chunks.len().min(parallel);
            let wave: Vec<(u64, &mut [u8])> = chunks.drain(..take).collect();
            let handles: Vec<_> = wave
                .into_iter()
                .map(|(off, chunk)| {
                    s.spawn(move || -> smb::Result<(usize, usize)> {
                        let want = chunk.len();
                        let mut got = 0;
                        while got < want {
                            let n = l.check(
                                file.read_block(&mut chunk[got..], off + got as u64, None, false)
                                    .map_err(read_error),
                            )?;
                            if n == 0 {
                                break;
                            }
                            got += n;
                        }
                        Ok((got, want))
                    })
                })
                .collect();
            let mut short = false;
            let mut failure = None;
            for h in handles {
                match h.join() {
                    Ok(Ok((got, want))) => {
                        if !short {
                            total += got;
                        }
                        short |= got < want;
                    }
                    Ok(Err(e)) => {
                        failure.get_or_insert(e);
                    }
                    Err(_) => {
                        failure.get_or_insert(smb::Error::Other("read thread panicked"));
                    }
                }
            }
            if let Some(e) = failure {
                return Err(e);
            }
            if short {
                break;
            }
        }
        Ok(total)
    })
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
        let eas = self.handle().query_full_ea_info(Vec::new())?;
        Ok(eas
            .iter()
            .map(|e| (e.ea_name.to_string().into_bytes(), e.ea_value.clone()))
            .collect())
    }
    fn as_handle_security(&self, info: AdditionalInfo) -> smb::Result<smb::SecurityDescriptor> {
        self.handle().query_security_info(info)
    }
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
