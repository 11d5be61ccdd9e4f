//! One authenticated SMB session over one TCP connection, and what keeps it honest:
//! TCP_NODELAY, background closes, and shutting it at once when the server is gone.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use smb::{Client, ClientConfig, Connection, FileAccessMask, FileCreateArgs, Resource, UncPath};

use super::{ResourceExt, SmbConfig};

/// Requests a source sent after its session setups, by kind: each is one message to the
/// server and one reply (see [`super::SmbStats`]).
#[derive(Debug, Default)]
pub(super) struct Requests {
    pub creates: AtomicU64,
    pub queries: AtomicU64,
    pub listings: AtomicU64,
    pub reads: AtomicU64,
    pub closes: AtomicU64,
}

impl Requests {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

/// One authenticated session with the share over one TCP connection.
pub(super) struct Link {
    client: Client,
    connection: Arc<Connection>,
    /// The connection's socket (descriptor and local address), when it was found.
    socket: Option<(i32, SocketAddr)>,
    /// The server's address: with the local one, what tells our socket from another
    /// that reused its descriptor number.
    peer: SocketAddr,
    /// Set once a request failed for want of the server: the link is shut and replaced
    /// on the next call.
    pub(super) broken: Arc<AtomicBool>,
    /// Handles to close: a call does not wait for its CLOSE round trip.
    closer: Mutex<Option<std::sync::mpsc::Sender<Resource>>>,
    /// Source calls running on this link now (see [`Link::busy_guard`]).
    pub(super) busy: AtomicUsize,
    /// The source's request counts, shared by its links.
    pub(super) requests: Arc<Requests>,
}

/// Counts one call on a link while it lives.
pub(super) struct BusyGuard<'a>(&'a AtomicUsize);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Credits a session asks the server to keep granted (the crate's default is 128): room
/// for [`super::SMB_MAX_READ_PIECE`] READs of several calls in flight on one session.
const CREDITS_BACKLOG: u16 = 512;

/// Threads closing handles in the background for one link (a source has several links).
const CLOSER_THREADS: usize = 2;

impl Link {
    pub(super) fn connect(
        config: &SmbConfig,
        share: &UncPath,
        requests: Arc<Requests>,
    ) -> Result<Self, smb::Error> {
        let mut cc = ClientConfig::default();
        cc.connection.port = Some(config.port);
        cc.connection.timeout = Some(config.timeout);
        // Samba (and every SMB 2+ server) answers the SMB2 negotiate directly: this saves
        // the SMB1 round trip of the multi-protocol negotiation.
        cc.connection.smb2_only_negotiate = true;
        cc.connection.credits_backlog = Some(CREDITS_BACKLOG);
        let client = Client::new(cc);
        // Connect first, then switch Nagle off on the socket before the session setup:
        // the crate writes each message as a 4-byte transport header and then the body,
        // so with Nagle on, the body waits for the ACK of the header, which the server
        // delays (40 ms on Linux): every request cost a delayed-ACK timeout.
        let addr = smb::transport::utils::TransportUtils::parse_socket_address(&config.host)?;
        let peer = SocketAddr::new(addr.ip(), config.port);
        // The socket this connect makes: the ones to the server after it, less those
        // before (connects are one at a time in this process, so no other appears).
        let (connection, socket) = {
            let _one = CONNECTING.lock().unwrap_or_else(|p| p.into_inner());
            let before = sockets_to(peer);
            let connection = client.connect(&config.host)?;
            let socket = sockets_to(peer)
                .into_iter()
                .find(|s| !before.iter().any(|b| b.1 == s.1));
            (connection, socket)
        };
        set_nodelay_on_sockets_to(peer);
        if let Some(s) = socket {
            set_receive_timeout(s, config.timeout);
        }
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
            socket,
            peer,
            broken,
            closer: Mutex::new(Some(tx)),
            busy: AtomicUsize::new(0),
            requests,
        };
        if let Err(e) = link
            .client
            .share_connect(share, &config.user, config.password.clone())
        {
            link.shut();
            return Err(e);
        }
        if let Some(info) = link.connection.conn_info() {
            let n = &info.negotiation;
            tracing::debug!(
                dialect = ?n.dialect_rev,
                signing = ?n.signing_algo,
                cipher = ?n.encryption_cipher,
                max_read = n.max_read_size,
                "smb: session negotiated"
            );
        }
        Ok(link)
    }

    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    /// Counts a call on this link until the guard is dropped.
    pub(super) fn busy_guard(&self) -> BusyGuard<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard(&self.busy)
    }

    /// The largest READ the server takes on this connection: its negotiated maximum, and
    /// one credit's worth without the large-MTU capability (SMB 2.0.2).
    pub(super) fn max_read(&self) -> usize {
        let Some(info) = self.connection.conn_info() else {
            return super::SMB_CREDIT_BYTES;
        };
        let neg = &info.negotiation;
        let most = if neg.caps.large_mtu() {
            super::SMB_MAX_READ_PIECE
        } else {
            super::SMB_CREDIT_BYTES
        };
        most.min(neg.max_read_size as usize).max(1)
    }

    /// The share's file system attributes (one open of its root, a query, a close).
    pub(super) fn fs_attributes(
        &self,
        share: &UncPath,
    ) -> Result<smb::FileSystemAttributes, smb::Error> {
        let access = FileAccessMask::new().with_file_read_attributes(true);
        let r = self.open(share, "", access).map_err(|(_, e)| e)?;
        self.count_queries(1);
        let info = self.check(
            r.handle()
                .query_fs_info::<smb::FileFsAttributeInformation>(),
        );
        self.close(r);
        Ok(info?.attributes)
    }

    /// Passes `r` through; an error that means the server is gone or silent shuts the
    /// link at once, so the requests still to come on it (closes) fail without waiting.
    pub(super) fn check<T>(&self, r: smb::Result<T>) -> smb::Result<T> {
        if let Err(e) = &r
            && is_unreachable(e)
        {
            self.shut();
        }
        r
    }

    /// Stops the connection's worker threads (no request is sent), so pending and later
    /// requests on this link fail immediately instead of each waiting for the timeout.
    pub(super) fn shut(&self) {
        if !self.broken.load(Ordering::SeqCst)
            && let Some((fd, local)) = self.socket
            && local_of(fd) == Some(local)
            && peer_of(fd) == Some(self.peer)
        {
            // Wakes the crate's receive thread at once (its read waits up to the
            // timeout now, see `set_receive_timeout`); checked to still be our socket,
            // as a descriptor number can be reused once the crate closed it.
            // SAFETY: shutdown on a descriptor that is this connection's socket.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        shut_connection(&self.connection, &self.broken);
    }

    /// Counts `n` QUERY_INFO requests about to be sent.
    pub(super) fn count_queries(&self, n: u64) {
        Requests::add(&self.requests.queries, n);
    }

    /// Closes a handle in the background; a failure is of no consequence to the call
    /// (but a silent server still shuts the link).
    pub(super) fn close(&self, r: Resource) {
        Requests::add(&self.requests.closes, 1);
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
    pub(super) fn open(
        &self,
        share: &UncPath,
        p: &str,
        access: FileAccessMask,
    ) -> Result<Resource, (String, smb::Error)> {
        let target = share.clone().with_path(p);
        Requests::add(&self.requests.creates, 1);
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

/// Serialises connects, so the socket a connect makes can be told from the others.
static CONNECTING: Mutex<()> = Mutex::new(());

/// This process's TCP sockets connected to `peer`: descriptor and local address.
fn sockets_to(peer: SocketAddr) -> Vec<(i32, SocketAddr)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&fd| peer_of(fd) == Some(peer))
        .filter_map(|fd| Some((fd, local_of(fd)?)))
        .collect()
}

/// Makes the crate's receive thread wait for data as long as a request may (its 100 ms
/// poll of the socket loses framing when it expires in the middle of a message: the
/// bytes read so far are dropped, the next read starts inside the message, and the
/// connection fails with "bad magic" until the request times out; seen with 1 MiB READ
/// replies on a loaded machine). The wait only delays noticing a stop, which
/// [`Link::shut`] shortens by shutting the socket down.
fn set_receive_timeout(socket: (i32, SocketAddr), timeout: std::time::Duration) {
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: timeout.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt with a timeval of the right size on the connection's socket.
    unsafe {
        libc::setsockopt(
            socket.0,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

/// Sets TCP_NODELAY on this process's TCP sockets connected to `peer`. The `smb` crate
/// (0.12) does not set it and keeps its socket private; any other socket to the same SMB
/// server wants it too.
pub(super) fn set_nodelay_on_sockets_to(peer: SocketAddr) -> usize {
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
    socket_addr(fd, libc::getpeername)
}

/// The local address of socket `fd`, if it is a TCP/IP socket.
fn local_of(fd: i32) -> Option<SocketAddr> {
    socket_addr(fd, libc::getsockname)
}

type NameFn = unsafe extern "C" fn(i32, *mut libc::sockaddr, *mut libc::socklen_t) -> i32;

fn socket_addr(fd: i32, name: NameFn) -> Option<SocketAddr> {
    // SAFETY: get{peer,sock}name writes at most `len` bytes into the zeroed storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe {
        name(
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

/// Errors that mean the server is gone, silent, or the link to it was shut.
pub(super) fn is_unreachable(e: &smb::Error) -> bool {
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
pub(super) fn drop_in_background(link: Arc<Link>) {
    if link.broken.load(Ordering::SeqCst) {
        drop(link);
        return;
    }
    let _ = std::thread::Builder::new()
        .name("smb-logoff".into())
        .spawn(move || drop(link));
}
