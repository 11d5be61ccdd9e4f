//! NFSv3 straight from user space: no kernel client, no mount on the new host.
//!
//! - Listing uses READDIRPLUS, so one round trip brings names, file handles and full
//!   attributes (fileid = source inode number, nlink) for a whole batch of entries.
//! - Reads are split into `read_size` pieces (1 MiB by default) issued concurrently over
//!   a pool of TCP connections, so one 10 MiB fetch keeps several READs in flight.
//! - The source is read-only during migration, so file handles are cached by path for the
//!   life of the source (the thesis used a one-week attribute cache for the same reason).
//! - Names are opaque bytes in NFSv3 (`filename3`), so non-UTF-8 names round-trip exactly.
//! - Servers serve READ to any AUTH_UNIX identity, so a file's first READ goes out with
//!   an ACCESS check of the configured identity, except for files the listing showed
//!   readable by owner, group and others alike (one round trip per file less on the
//!   data pass). [`NfsSource::call_counts`] counts the calls by procedure.
//! - NFSv3 has no xattrs, and NFSACL is a side protocol this client does not speak: those
//!   calls return empty results and [`SourceFeatures`] says so.
//! - Everything speaks ONC RPC through this module's own transport ([`rpc`]): the
//!   portmapper and MOUNT at connect ([`mount`]), bounded by
//!   [`NfsConfig::connect_timeout`], and the pool's NFS connections, whose READ
//!   ([`read`]) decodes each reply's data straight into the caller's buffer. A server
//!   that closes a connection is an error at once.
//! - Every call, a new connection's connect included, is bounded by
//!   [`NfsConfig::rpc_timeout`] (`timeout=` in the URL, default 15 s): a server that
//!   stops answering fails the call as unreachable, naming the server, and so a client
//!   access through FUSE waits about one timeout, not more: calls queued for a
//!   connection behind calls that timed out fail with them. Idle connections the server
//!   closed (it died or restarted) are dropped before use, so the next call reconnects.

mod mount;
mod read;
mod rpc;

use crate::block_on;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kaiso_store::migrate::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
use nfs3_types::mount::mountstat3;
use nfs3_types::nfs3::{
    self, ACCESS3args, ACCESS3res, GETATTR3args, GETATTR3res, LOOKUP3args, LOOKUP3res, NFS_PROGRAM,
    Nfs3Option, Nfs3Result, READDIRPLUS3args, READDIRPLUS3res, READLINK3args, READLINK3res,
    diropargs3, fattr3, filename3, ftype3, nfs_fh3, nfsstat3,
};
use nfs3_types::portmap;
use nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_types::xdr_codec::Opaque;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use rpc::{RpcConn, RpcFailure};

type Client = RpcConn<TcpStream>;

/// Where and how to reach an NFSv3 export.
#[derive(Clone, Debug)]
pub struct NfsConfig {
    /// Server IP address (a literal address: the client does no name resolution).
    pub host: String,
    /// The export path as the server's MOUNT service knows it.
    pub export: String,
    /// Portmapper port, used when `mount_port` or `nfs_port` is not given.
    pub portmapper_port: u16,
    pub mount_port: Option<u16>,
    pub nfs_port: Option<u16>,
    /// TCP connections kept open, i.e. RPCs in flight at most.
    pub connections: usize,
    /// Size of one READ (the thesis used rsize = 1 MiB).
    pub read_size: u32,
    /// AUTH_UNIX identity presented to the server (0/0: the read-everything account).
    pub uid: u32,
    pub gid: u32,
    /// Bind the client sockets to a port below 1024, as many servers require.
    pub privileged_port: bool,
    /// How long one RPC may take before the server counts as unreachable (default 15 s,
    /// like the SMB source): a client access waiting on a hung server fails after this.
    pub rpc_timeout: Duration,
    /// How long connecting may take in all: portmapper, MOUNT and their TCP connects.
    /// Short, since these are a few round trips: a service that accepts and never
    /// answers fails the connect within this, not within `rpc_timeout`.
    pub connect_timeout: Duration,
    /// A directory inside the export (relative, `/`-separated) to migrate instead of the
    /// whole export: looked up once at connect and used as the share root.
    pub subdir: Option<String>,
}

impl NfsConfig {
    pub fn new(host: impl Into<String>, export: impl Into<String>) -> Self {
        Self {
            host: host.into(),
            export: export.into(),
            portmapper_port: 111,
            mount_port: None,
            nfs_port: None,
            connections: 16,
            read_size: 1 << 20,
            uid: 0,
            gid: 0,
            privileged_port: true,
            rpc_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
            subdir: None,
        }
    }
}

/// An NFSv3 export read over a pool of connections.
pub struct NfsSource {
    config: NfsConfig,
    runtime: tokio::runtime::Runtime,
    nfs_port: u16,
    root: nfs_fh3,
    /// The AUTH_UNIX credential and verifier every call carries, encoded once.
    auth: Arc<[u8]>,
    idle: Mutex<Vec<Client>>,
    slots: Semaphore,
    handles: Mutex<HashMap<SourcePath, nfs_fh3>>,
    /// Files ACCESS said the configured identity may read (asked once per file).
    readable: Mutex<HashSet<SourcePath>>,
    /// Calls that got no reply within `rpc_timeout` so far: a call that sees this move
    /// while it waited for a connection fails at once instead of waiting out a timeout of
    /// its own on a server that stopped answering.
    timeouts: AtomicU64,
    /// NFS calls sent so far, by procedure (round trips per file, for diagnostics).
    counts: CallCounters,
}

/// NFS calls a source has sent, by procedure (retries and calls that failed included;
/// the portmapper and MOUNT at connect not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NfsCallCounts {
    pub read: u64,
    pub access: u64,
    pub lookup: u64,
    pub getattr: u64,
    pub readdirplus: u64,
    pub readlink: u64,
}

#[derive(Default)]
struct CallCounters {
    read: AtomicU64,
    access: AtomicU64,
    lookup: AtomicU64,
    getattr: AtomicU64,
    readdirplus: AtomicU64,
    readlink: AtomicU64,
}

impl CallCounters {
    fn count(&self, what: &str) {
        let c = match what {
            "READ" => &self.read,
            "ACCESS" => &self.access,
            "LOOKUP" => &self.lookup,
            "GETATTR" => &self.getattr,
            "READDIRPLUS" => &self.readdirplus,
            "READLINK" => &self.readlink,
            _ => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> NfsCallCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NfsCallCounts {
            read: get(&self.read),
            access: get(&self.access),
            lookup: get(&self.lookup),
            getattr: get(&self.getattr),
            readdirplus: get(&self.readdirplus),
            readlink: get(&self.readlink),
        }
    }
}

/// Files remembered as readable at most (cleared when full).
const READABLE_CACHE: usize = 1 << 16;

/// JUKEBOX means "busy, retry later": retry this often before giving up.
const JUKEBOX_RETRIES: u32 = 20;

impl NfsSource {
    /// Mounts the export and opens the first connection.
    pub fn connect(config: NfsConfig) -> SourceResult<Self> {
        let root_path = SourcePath::root();
        if config.connections == 0 || config.read_size == 0 {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                &root_path,
                "connections and read_size must be > 0",
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kaiso-nfs-source")
            .enable_all()
            .build()
            .map_err(|e| {
                SourceError::new(
                    SourceErrorKind::Io,
                    &root_path,
                    format!("tokio runtime: {e}"),
                )
            })?;
        let auth: Arc<[u8]> = rpc::encode_auth(&credential(&config)).into();
        let (cfg, mount_auth) = (config.clone(), auth.clone());
        let (nfs_port, root) = block_on(runtime.handle(), async move {
            tokio::time::timeout(cfg.connect_timeout, mount_export(&cfg, mount_auth))
                .await
                .map_err(|_| {
                    mount_error(
                        &cfg,
                        SourceErrorKind::Unreachable,
                        format!(
                            "no answer from the portmapper or MOUNT service within {:?}",
                            cfg.connect_timeout
                        ),
                    )
                })?
        })?;
        let mut handles = HashMap::new();
        handles.insert(SourcePath::root(), root.clone());
        let mut source = Self {
            slots: Semaphore::new(config.connections),
            auth,
            config,
            runtime,
            nfs_port,
            root,
            idle: Mutex::new(Vec::new()),
            handles: Mutex::new(handles),
            readable: Mutex::new(HashSet::new()),
            timeouts: AtomicU64::new(0),
            counts: CallCounters::default(),
        };
        if let Some(sub) = source.config.subdir.clone() {
            let sub = SourcePath::parse(sub.as_bytes())?;
            if !sub.is_root() {
                // Resolved through the export root, then made the root itself: every
                // path of this source is relative to it.
                let fh = block_on(source.runtime.handle(), source.resolve(&sub))?;
                let mut handles = source.handles.lock().unwrap_or_else(|e| e.into_inner());
                handles.clear();
                handles.insert(SourcePath::root(), fh.clone());
                drop(handles);
                source.root = fh;
            }
        }
        Ok(source)
    }

    /// NFS calls sent so far, by procedure.
    pub fn call_counts(&self) -> NfsCallCounts {
        self.counts.snapshot()
    }

    /// Runs `f` with a pooled connection; a connection that failed at the transport level
    /// is dropped (and replaced on next use) instead of being returned to the pool. The
    /// whole call, a new connection's connect included, is bounded by `rpc_timeout`.
    async fn call<T, F, Fut>(&self, path: &SourcePath, what: &str, f: F) -> SourceResult<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = (Client, Result<T, RpcFailure>)>,
    {
        let timeouts = self.timeouts.load(Ordering::Acquire);
        let _permit = self
            .slots
            .acquire()
            .await
            .map_err(|_| self.io(path, "pool closed"))?;
        if self.timeouts.load(Ordering::Acquire) != timeouts {
            // The calls this one queued behind got no reply: so would this one.
            return Err(self.unreachable(
                path,
                what,
                "no reply to the calls ahead of this one".to_string(),
            ));
        }
        self.counts.count(what);
        let pooled = self.pooled_alive();
        let attempt = async {
            let client = match pooled {
                Some(c) => c,
                None => self.new_client(path, what).await?,
            };
            Ok(f(client).await)
        };
        match tokio::time::timeout(self.config.rpc_timeout, attempt).await {
            Err(_) => {
                self.timeouts.fetch_add(1, Ordering::AcqRel);
                Err(self.unreachable(
                    path,
                    what,
                    format!("no reply within {:?}", self.config.rpc_timeout),
                ))
            }
            Ok(Err(e)) => Err(e),
            Ok(Ok((client, Ok(v)))) => {
                self.idle
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(client);
                Ok(v)
            }
            Ok(Ok((_broken, Err(e)))) => Err(match e {
                RpcFailure::Io(e) => self.unreachable(path, what, e.to_string()),
                RpcFailure::Denied(_) => SourceError::new(
                    SourceErrorKind::PermissionDenied,
                    path,
                    format!("{what}: RPC failed: {e}"),
                ),
                RpcFailure::Protocol(_) => SourceError::new(
                    SourceErrorKind::Io,
                    path,
                    format!("{what}: RPC failed: {e}"),
                ),
            }),
        }
    }

    /// An idle connection the server has not closed, if any. A server that restarted
    /// while the pool sat idle closed them all; without this check each would fail one
    /// call before the pool drains.
    fn pooled_alive(&self) -> Option<Client> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(c) = idle.pop() {
            if still_open(c.stream_ref()) {
                return Some(c);
            }
        }
        None
    }

    /// The error for a server that did not answer or broke the connection. The idle
    /// connections go too: a server that died or restarted broke them all, and a stopped
    /// one may answer them late, so the next call starts on a fresh connection.
    fn unreachable(&self, path: &SourcePath, what: &str, why: String) -> SourceError {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
        SourceError::new(
            SourceErrorKind::Unreachable,
            path,
            format!(
                "NFS server {}:{} unreachable ({what}): {why}; the next call reconnects",
                self.config.host, self.nfs_port
            ),
        )
    }

    /// One more connection to the NFS service. The export is mounted once (at connect,
    /// which gave the root file handle), so a new connection needs no MOUNT call: one TCP
    /// connection and one source port per connection, not two, and no extra round trip.
    async fn new_client(&self, path: &SourcePath, what: &str) -> SourceResult<Client> {
        let ip = host_ip(&self.config, path)?;
        let stream = open_stream((ip, self.nfs_port).into(), self.config.privileged_port)
            .await
            .map_err(|e| self.unreachable(path, what, format!("connect: {e}")))?;
        Ok(RpcConn::new(stream, self.auth.clone(), first_xid()))
    }

    fn io(&self, path: &SourcePath, msg: &str) -> SourceError {
        SourceError::new(SourceErrorKind::Io, path, msg.to_string())
    }

    /// The file handle of `path`, looked up component by component from the longest
    /// cached ancestor.
    async fn resolve(&self, path: &SourcePath) -> SourceResult<nfs_fh3> {
        if let Some(fh) = self.cached(path) {
            return Ok(fh);
        }
        let components: Vec<&[u8]> = path.components().collect();
        let mut at = SourcePath::root();
        let mut fh = self.root.clone();
        let mut start = 0;
        for (i, _) in components.iter().enumerate().rev() {
            let prefix = SourcePath::parse(&components[..=i].join(&b'/'))?;
            if let Some(found) = self.cached(&prefix) {
                at = prefix;
                fh = found;
                start = i + 1;
                break;
            }
        }
        for name in &components[start..] {
            at = at.join(name)?;
            fh = self.lookup(&at, fh, name).await?;
            self.handles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(at.clone(), fh.clone());
        }
        Ok(fh)
    }

    fn cached(&self, path: &SourcePath) -> Option<nfs_fh3> {
        self.handles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()
    }

    async fn lookup(&self, path: &SourcePath, dir: nfs_fh3, name: &[u8]) -> SourceResult<nfs_fh3> {
        self.retry_jukebox(path, "LOOKUP", || {
            let (dir, name) = (dir.clone(), name.to_vec());
            async move {
                let r = self
                    .call(path, "LOOKUP", move |mut c| {
                        let (dir, name) = (dir.clone(), name.clone());
                        async move {
                            let args = LOOKUP3args {
                                what: diropargs3 {
                                    dir,
                                    name: filename3(Opaque::owned(name)),
                                },
                            };
                            let r = c
                                .call::<_, LOOKUP3res>(NFS_PROGRAM::NFSPROC3_LOOKUP as u32, &args)
                                .await;
                            (c, r)
                        }
                    })
                    .await?;
                Ok(match r {
                    Nfs3Result::Ok(ok) => Ok(ok.object),
                    Nfs3Result::Err((stat, _)) => Err(stat),
                })
            }
        })
        .await
    }

    /// Runs an NFS procedure, retrying while the server answers NFS3ERR_JUKEBOX.
    async fn retry_jukebox<T, F, Fut>(&self, path: &SourcePath, what: &str, f: F) -> SourceResult<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = SourceResult<Result<T, nfsstat3>>>,
    {
        let mut busy = Jukebox::default();
        loop {
            match f().await? {
                Ok(v) => return Ok(v),
                Err(nfsstat3::NFS3ERR_JUKEBOX) => busy.wait(path, what).await?,
                Err(stat) => return Err(stat_error(path, what, stat)),
            }
        }
    }

    async fn getattr(&self, path: &SourcePath) -> SourceResult<fattr3> {
        let fh = self.resolve(path).await?;
        self.retry_jukebox(path, "GETATTR", || {
            let fh = fh.clone();
            async move {
                let r = self
                    .call(path, "GETATTR", move |mut c| {
                        let args = GETATTR3args { object: fh.clone() };
                        async move {
                            let r = c
                                .call::<_, GETATTR3res>(NFS_PROGRAM::NFSPROC3_GETATTR as u32, &args)
                                .await;
                            (c, r)
                        }
                    })
                    .await?;
                Ok(match r {
                    Nfs3Result::Ok(ok) => Ok(ok.obj_attributes),
                    Nfs3Result::Err((stat, _)) => Err(stat),
                })
            }
        })
        .await
    }

    /// The entries of the directory at `path`, and its own attributes after the listing
    /// (the last READDIRPLUS reply's post-op attributes), if the server sent them.
    async fn read_dir_async(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        let dir = self.resolve(path).await?;
        let mut dir_attr = None;
        let mut cookie = 0u64;
        let mut verf = nfs3::cookieverf3::default();
        let mut out = Vec::new();
        let mut missing = Vec::new();
        loop {
            let args_dir = dir.clone();
            let page = self
                .retry_jukebox(path, "READDIRPLUS", || {
                    let dir = args_dir.clone();
                    async move {
                        let r = self
                            .call(path, "READDIRPLUS", move |mut c| {
                                let args = READDIRPLUS3args {
                                    dir: dir.clone(),
                                    cookie,
                                    cookieverf: verf,
                                    dircount: 64 * 1024,
                                    maxcount: 512 * 1024,
                                };
                                async move {
                                    let r = c
                                        .call::<_, READDIRPLUS3res>(
                                            NFS_PROGRAM::NFSPROC3_READDIRPLUS as u32,
                                            &args,
                                        )
                                        .await;
                                    (c, r)
                                }
                            })
                            .await?;
                        Ok(match r {
                            Nfs3Result::Ok(ok) => Ok(ok),
                            Nfs3Result::Err((stat, _)) => Err(stat),
                        })
                    }
                })
                .await?;
            verf = page.cookieverf;
            if let Nfs3Option::Some(a) = &page.dir_attributes {
                dir_attr = Some(attr_from_fattr(a));
            }
            let eof = page.reply.eof;
            let entries = page.reply.entries.into_inner();
            let progressed = !entries.is_empty();
            for e in entries {
                cookie = e.cookie;
                let name = e.name.0.to_vec();
                if name == b"." || name == b".." {
                    continue;
                }
                let child = path.join(&name)?;
                if let Nfs3Option::Some(fh) = e.name_handle {
                    self.handles
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(child.clone(), fh);
                }
                match e.name_attributes {
                    Nfs3Option::Some(a) => {
                        if readable_by_anyone(&a) {
                            self.remember_readable(&child);
                        }
                        out.push(SourceEntry {
                            name,
                            attr: attr_from_fattr(&a),
                        })
                    }
                    Nfs3Option::None => missing.push(name),
                }
            }
            if eof {
                break;
            }
            if !progressed {
                return Err(self.io(
                    path,
                    "READDIRPLUS returned no entries before end of directory",
                ));
            }
        }
        // Servers may omit attributes for some entries; fetch those one by one.
        for name in missing {
            let child = path.join(&name)?;
            match self.getattr(&child).await {
                Ok(a) => out.push(SourceEntry {
                    name,
                    attr: attr_from_fattr(&a),
                }),
                Err(e) if e.kind == SourceErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
        }
        Ok((out, dir_attr))
    }

    /// Reads `buf.len()` bytes from `offset` into `buf`; returns how many were read (fewer
    /// only at end of file) and the newest post-op attributes.
    async fn read_into_async(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        let fh = self.resolve(path).await?;
        // Servers may serve READ to anyone (ganesha does for AUTH_UNIX): like the kernel
        // client at open, ask ACCESS for the configured identity, in parallel with the
        // reads, once per file (the source is read-only during migration).
        let known = self
            .readable
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(path);
        let (allowed, data) = tokio::join!(
            async {
                if known {
                    Ok(true)
                } else {
                    self.may_read(path, &fh).await
                }
            },
            self.read_pieces(path, &fh, offset, buf)
        );
        if !allowed? {
            return Err(SourceError::new(
                SourceErrorKind::PermissionDenied,
                path,
                format!(
                    "ACCESS: uid {} gid {} may not read this file",
                    self.config.uid, self.config.gid
                ),
            ));
        }
        if !known {
            self.remember_readable(path);
        }
        data
    }

    /// Records that the configured identity may read `path` (no ACCESS needed for it).
    fn remember_readable(&self, path: &SourcePath) {
        let mut r = self.readable.lock().unwrap_or_else(|e| e.into_inner());
        if r.len() >= READABLE_CACHE {
            r.clear(); // bounded: at worst one more ACCESS per file
        }
        r.insert(path.clone());
    }

    async fn read_async(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        let mut buf = vec![0u8; len];
        let (n, attr) = self.read_into_async(path, offset, &mut buf).await?;
        buf.truncate(n);
        Ok((buf, attr))
    }

    /// Whether the server grants ACCESS3_READ on `fh` to the configured identity.
    async fn may_read(&self, path: &SourcePath, fh: &nfs_fh3) -> SourceResult<bool> {
        self.retry_jukebox(path, "ACCESS", || {
            let fh = fh.clone();
            async move {
                let r = self
                    .call(path, "ACCESS", move |mut c| {
                        let args = ACCESS3args {
                            object: fh.clone(),
                            access: nfs3::ACCESS3_READ,
                        };
                        async move {
                            let r = c
                                .call::<_, ACCESS3res>(NFS_PROGRAM::NFSPROC3_ACCESS as u32, &args)
                                .await;
                            (c, r)
                        }
                    })
                    .await?;
                Ok(match r {
                    Nfs3Result::Ok(ok) => Ok(ok.access & nfs3::ACCESS3_READ != 0),
                    Nfs3Result::Err((stat, _)) => Err(stat),
                })
            }
        })
        .await
    }

    /// Fills one `read_size` piece of the caller's buffer, each READ reply's data landing
    /// in it directly; a short reply that is not at end of file is completed with
    /// further READs. Returns the bytes read and the newest post-op attributes.
    async fn read_piece_into(
        &self,
        path: &SourcePath,
        fh: &nfs_fh3,
        offset: u64,
        out: &mut [u8],
    ) -> SourceResult<(usize, Option<fattr3>)> {
        let mut done = 0;
        let mut newest: Option<fattr3> = None;
        let mut busy = Jukebox::default();
        while done < out.len() {
            let at = offset + done as u64;
            let rest = &mut out[done..];
            let reply = self
                .call(path, "READ", move |mut c| async move {
                    let r = c.read3(fh, at, rest).await;
                    (c, r)
                })
                .await?;
            let reply = match reply {
                Ok(r) => r,
                Err(nfsstat3::NFS3ERR_JUKEBOX) => {
                    busy.wait(path, "READ").await?;
                    continue;
                }
                Err(stat) => return Err(stat_error(path, "READ", stat)),
            };
            if let Some(a) = reply.attr {
                // A server holding the file open keeps serving it after it was unlinked;
                // nlink 0 in the post-op attributes gives that away.
                if a.nlink == 0 {
                    return Err(SourceError::new(
                        SourceErrorKind::Changed,
                        path,
                        "READ: the file was removed on the source during migration",
                    ));
                }
                if newest.as_ref().is_none_or(|n| attr_key(&a) >= attr_key(n)) {
                    newest = Some(a);
                }
            }
            done += reply.len;
            if reply.eof || reply.len == 0 {
                break;
            }
        }
        Ok((done, newest))
    }

    /// Reads into `buf` in `read_size` pieces, all issued at once (the connection pool
    /// bounds what is in flight), each written straight into its part of `buf`.
    async fn read_pieces(
        &self,
        path: &SourcePath,
        fh: &nfs_fh3,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        let piece = self.config.read_size as usize;
        let reads = buf.chunks_mut(piece).enumerate().map(|(i, out)| {
            let at = offset + (i * piece) as u64;
            async move { self.read_piece_into(path, fh, at, out).await }
        });
        let results = join_all(reads).await;
        // The post-op attributes of every reply; the newest (by ctime, then mtime) is the
        // file as it was after the read, which tells whether it changed under us.
        let mut newest: Option<fattr3> = None;
        let mut total = 0;
        let mut short = false;
        for (i, r) in results.into_iter().enumerate() {
            let (n, attr) = r?;
            if let Some(a) = attr
                && newest.as_ref().is_none_or(|x| attr_key(&a) >= attr_key(x))
            {
                newest = Some(a);
            }
            if short {
                continue; // past end of file
            }
            total += n;
            let want = piece.min(buf.len() - i * piece);
            short = n < want;
        }
        Ok((total, newest.as_ref().map(attr_from_fattr)))
    }

    async fn read_link_async(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        let fh = self.resolve(path).await?;
        self.retry_jukebox(path, "READLINK", || {
            let fh = fh.clone();
            async move {
                let r = self
                    .call(path, "READLINK", move |mut c| {
                        let args = READLINK3args {
                            symlink: fh.clone(),
                        };
                        async move {
                            let r = c
                                .call::<_, READLINK3res>(
                                    NFS_PROGRAM::NFSPROC3_READLINK as u32,
                                    &args,
                                )
                                .await;
                            (c, r)
                        }
                    })
                    .await?;
                Ok(match r {
                    Nfs3Result::Ok(ok) => Ok(ok.data.0.to_vec()),
                    Nfs3Result::Err((stat, _)) => Err(stat),
                })
            }
        })
        .await
    }
}

/// Awaits all futures concurrently and returns their outputs in order.
async fn join_all<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futures.iter_mut().enumerate() {
            if outputs[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => outputs[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    outputs
        .into_iter()
        .map(|o| o.expect("every future completed"))
        .collect()
}

/// Backs off while the server answers NFS3ERR_JUKEBOX ("busy, retry later").
struct Jukebox {
    delay: Duration,
    retries: u32,
}

impl Default for Jukebox {
    fn default() -> Self {
        Self {
            delay: Duration::from_millis(100),
            retries: 0,
        }
    }
}

impl Jukebox {
    /// Waits before the next attempt, or gives up after [`JUKEBOX_RETRIES`] of them.
    async fn wait(&mut self, path: &SourcePath, what: &str) -> SourceResult<()> {
        self.retries += 1;
        if self.retries >= JUKEBOX_RETRIES {
            return Err(SourceError::new(
                SourceErrorKind::Unreachable,
                path,
                format!("{what}: server busy (JUKEBOX) after {JUKEBOX_RETRIES} retries"),
            ));
        }
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(5));
        Ok(())
    }
}

/// A fresh connection's first xid, random so that a server's duplicate-request cache
/// (keyed by address, port and xid) never mistakes a call on a reused port for a
/// retransmission of an earlier connection's call.
fn first_xid() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish() as u32
}

/// The AUTH_UNIX credential of the configured identity.
fn credential(cfg: &NfsConfig) -> opaque_auth<'static> {
    let auth = auth_unix {
        stamp: 0x6b61_6973,
        machinename: Opaque::owned(b"kaiso".to_vec()),
        uid: cfg.uid,
        gid: cfg.gid,
        gids: vec![],
    };
    opaque_auth::auth_unix(&auth)
}

/// Privileged source ports tried, like the kernel client (`xprt_minresvport` 665 ..
/// `xprt_maxresvport` 1023), from a rotating start so concurrent sources rarely collide.
const RESVPORT_MIN: u16 = 665;
const RESVPORT_MAX: u16 = 1023;

/// Connects to `to` from a free port below 1024 (servers that insist on a "secure"
/// port refuse others). `SO_REUSEADDR` lets a port whose earlier connection is in
/// TIME_WAIT be bound again (the 4-tuple differs once the peer port or address does, and
/// the kernel refuses an identical one with EADDRNOTAVAIL, which is skipped like
/// EADDRINUSE), so repeated short migrations do not run out of ports.
async fn connect_privileged(to: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let span = RESVPORT_MAX - RESVPORT_MIN + 1;
    let mut last = None;
    for _ in 0..span {
        let port = RESVPORT_MIN + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let socket = if to.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        let local = std::net::SocketAddr::new(
            if to.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            },
            port,
        );
        match socket.bind(local) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
                last = Some(e);
                continue;
            }
            Err(e) => return Err(e),
        }
        match socket.connect(to).await {
            Ok(s) => return Ok(s),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EADDRINUSE) | Some(libc::EADDRNOTAVAIL)
                ) =>
            {
                last = Some(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free privileged port")))
}

/// Whether an idle connection is still usable: nothing to read and no end of stream or
/// error pending (one non-blocking peek, no data consumed). An idle connection owes no
/// reply, so readable bytes, end of stream or a reset all mean the server is gone or
/// out of step with it.
fn still_open(stream: &TcpStream) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: the descriptor is open for the stream's life; the buffer is one byte.
    let n = unsafe {
        libc::recv(
            stream.as_raw_fd(),
            (&raw mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
}

/// The server's address (a literal IP: the client does no name resolution).
fn host_ip(cfg: &NfsConfig, path: &SourcePath) -> SourceResult<std::net::IpAddr> {
    cfg.host.parse().map_err(|e| {
        SourceError::new(
            SourceErrorKind::Invalid,
            path,
            format!("host {:?} is not an IP address: {e}", cfg.host),
        )
    })
}

/// A TCP connection to `to`, from a privileged port if asked, without Nagle's delay.
async fn open_stream(to: std::net::SocketAddr, privileged: bool) -> std::io::Result<TcpStream> {
    let stream = if privileged {
        connect_privileged(to).await?
    } else {
        TcpStream::connect(to).await?
    };
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Finds the MOUNT and NFS ports (asking the portmapper for those not configured) and
/// mounts the export with the encoded credential `auth`: returns the NFS port and the
/// export's root file handle.
async fn mount_export(cfg: &NfsConfig, auth: Arc<[u8]>) -> SourceResult<(u16, nfs_fh3)> {
    let ip = host_ip(cfg, &SourcePath::root())?;
    let (mount_port, nfs_port) = match (cfg.mount_port, cfg.nfs_port) {
        (Some(m), Some(n)) => (m, n),
        (m, n) => {
            let service = format!("portmapper at {}:{}", cfg.host, cfg.portmapper_port);
            let fail = |e| service_error(cfg, &service, e);
            // The portmapper needs no credential nor a privileged port.
            let stream = open_stream((ip, cfg.portmapper_port).into(), false)
                .await
                .map_err(|e| fail(RpcFailure::Io(e)))?;
            let none = rpc::encode_auth(&opaque_auth::default()).into();
            let mut pmap = RpcConn::new(stream, none, first_xid())
                .for_program(portmap::PROGRAM, portmap::VERSION);
            let mut port_of = async |given: Option<u16>, program: u32, name: &str| {
                if let Some(p) = given {
                    return Ok(p);
                }
                let port = mount::getport(&mut pmap, program, 3).await.map_err(fail)?;
                port.ok_or_else(|| {
                    mount_error(
                        cfg,
                        SourceErrorKind::Unreachable,
                        format!("{service}: {name} version 3 over TCP is not registered"),
                    )
                })
            };
            let m = port_of(m, mount::MOUNT_PROGRAM_NUMBER, "MOUNT").await?;
            let n = port_of(n, rpc::NFS_PROGRAM, "NFS").await?;
            (m, n)
        }
    };
    let service = format!("MOUNT service at {}:{mount_port}", cfg.host);
    let stream = open_stream((ip, mount_port).into(), cfg.privileged_port)
        .await
        .map_err(|e| service_error(cfg, &service, RpcFailure::Io(e)))?;
    let mut conn = RpcConn::new(stream, auth, first_xid())
        .for_program(mount::MOUNT_PROGRAM_NUMBER, mount::MOUNT_VERSION);
    match mount::mnt(&mut conn, &cfg.export)
        .await
        .map_err(|e| service_error(cfg, &service, e))?
    {
        Ok(fh) => Ok((nfs_port, fh)),
        Err(stat) => Err(mount_refused(cfg, stat)),
    }
}

/// A portmapper or MOUNT call that failed at the RPC level.
fn service_error(cfg: &NfsConfig, service: &str, e: RpcFailure) -> SourceError {
    let kind = match e {
        RpcFailure::Denied(_) => SourceErrorKind::PermissionDenied,
        RpcFailure::Io(_) | RpcFailure::Protocol(_) => SourceErrorKind::Unreachable,
    };
    mount_error(cfg, kind, format!("{service}: {e}"))
}

/// The MOUNT service answered, and refused the export.
fn mount_refused(cfg: &NfsConfig, stat: mountstat3) -> SourceError {
    let kind = match stat {
        mountstat3::MNT3ERR_PERM | mountstat3::MNT3ERR_ACCES => SourceErrorKind::PermissionDenied,
        mountstat3::MNT3ERR_NOENT | mountstat3::MNT3ERR_NOTDIR => SourceErrorKind::NotFound,
        mountstat3::MNT3ERR_INVAL | mountstat3::MNT3ERR_NAMETOOLONG => SourceErrorKind::Invalid,
        _ => SourceErrorKind::Io,
    };
    mount_error(cfg, kind, format!("the server refused: {stat}"))
}

/// Connecting failed: `msg` says where and why.
fn mount_error(cfg: &NfsConfig, kind: SourceErrorKind, msg: String) -> SourceError {
    SourceError::new(
        kind,
        &SourcePath::root(),
        format!("mount {}:{}: {msg}", cfg.host, cfg.export),
    )
}

fn stat_error(path: &SourcePath, what: &str, stat: nfsstat3) -> SourceError {
    let kind = match stat {
        nfsstat3::NFS3ERR_NOENT => SourceErrorKind::NotFound,
        nfsstat3::NFS3ERR_ACCES | nfsstat3::NFS3ERR_PERM => SourceErrorKind::PermissionDenied,
        nfsstat3::NFS3ERR_NOTDIR | nfsstat3::NFS3ERR_ISDIR | nfsstat3::NFS3ERR_INVAL => {
            SourceErrorKind::WrongKind
        }
        nfsstat3::NFS3ERR_STALE | nfsstat3::NFS3ERR_BADHANDLE => SourceErrorKind::Changed,
        nfsstat3::NFS3ERR_NOTSUPP => SourceErrorKind::Unsupported,
        _ => SourceErrorKind::Io,
    };
    SourceError::new(kind, path, format!("{what}: {stat:?}"))
}

/// Whether a regular file's mode bits let every identity read it (owner, group and
/// others all have `r`): then the server's ACCESS answer is known without asking, for
/// the configured identity and for whatever identity the server squashes it to. One RPC
/// per file less on the data pass (the usual 0644 file). A POSIX ACL entry naming the
/// identity could still deny it; NFSv3 attributes do not show ACLs, and the server
/// serves the READ all the same, so such a file is copied like the kernel client's
/// cached-mode check would.
fn readable_by_anyone(a: &fattr3) -> bool {
    a.type_ == ftype3::NF3REG && a.mode & 0o444 == 0o444
}

/// Orders post-op attributes by change time, then modification time.
fn attr_key(x: &fattr3) -> (u32, u32, u32, u32) {
    (
        x.ctime.seconds,
        x.ctime.nseconds,
        x.mtime.seconds,
        x.mtime.nseconds,
    )
}

fn nfs_time(t: &nfs3::nfstime3) -> Timestamp {
    Timestamp {
        secs: i64::from(t.seconds),
        nanos: t.nseconds.min(999_999_999),
    }
}

fn attr_from_fattr(a: &fattr3) -> SourceAttr {
    let kind = match a.type_ {
        ftype3::NF3REG => FileKind::Regular,
        ftype3::NF3DIR => FileKind::Directory,
        ftype3::NF3BLK => FileKind::BlockDevice,
        ftype3::NF3CHR => FileKind::CharDevice,
        ftype3::NF3LNK => FileKind::Symlink,
        ftype3::NF3SOCK => FileKind::Socket,
        ftype3::NF3FIFO => FileKind::Fifo,
    };
    SourceAttr {
        kind,
        perm: a.mode & 0o7777,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        nlink: a.nlink,
        ino: a.fileid,
        rdev: (a.rdev.specdata1, a.rdev.specdata2),
        atime: nfs_time(&a.atime),
        mtime: nfs_time(&a.mtime),
        ctime: nfs_time(&a.ctime),
        btime: None,
        dos_attributes: None,
    }
}

impl Source for NfsSource {
    fn describe(&self) -> String {
        let sub = match self.config.subdir.as_deref().map(|s| s.trim_matches('/')) {
            Some(s) if !s.is_empty() => format!("?subdir={s}"),
            _ => String::new(),
        };
        format!(
            "nfs://{}:{}{}{sub}",
            self.config.host, self.nfs_port, self.config.export
        )
    }

    /// The root's NFS file handle (after `subdir`), in hex: the server's own name for
    /// that directory, the same whatever address or port the server is reached at, and
    /// different for another export or subdirectory. Servers keep handles stable across
    /// restarts (NFSv3 clients rely on it), and a handle is opaque, so two different
    /// servers could in principle issue the same bytes: the share's own record of what it
    /// migrates (the source tree, its counts) guards that case, not this.
    fn identity(&self) -> Option<String> {
        let fh: &[u8] = self.root.data.as_ref();
        if fh.is_empty() {
            return None;
        }
        let hex: String = fh.iter().map(|b| format!("{b:02x}")).collect();
        Some(format!("nfs-fh:{hex}"))
    }

    fn features(&self) -> SourceFeatures {
        SourceFeatures {
            unix_ids: true,
            symlinks: true,
            special_files: true,
            xattrs: false,
            acls: false,
            streams: false,
            byte_names: true,
        }
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        block_on(self.runtime.handle(), async {
            self.getattr(path).await.map(|a| attr_from_fattr(&a))
        })
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        block_on(self.runtime.handle(), self.read_dir_async(path)).map(|(e, _)| e)
    }

    /// READDIRPLUS carries the directory's own post-op attributes: no GETATTR.
    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        block_on(self.runtime.handle(), self.read_dir_async(path))
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        block_on(self.runtime.handle(), self.read_async(path, offset, len)).map(|(d, _)| d)
    }

    /// The newest post-op attributes of the READ replies come with the data: no GETATTR.
    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        block_on(self.runtime.handle(), self.read_async(path, offset, len))
    }

    /// Each READ reply is copied straight into its part of `buf`.
    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        block_on(
            self.runtime.handle(),
            self.read_into_async(path, offset, buf),
        )
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        block_on(self.runtime.handle(), self.read_link_async(path))
    }

    fn xattrs(&self, _path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(Vec::new())
    }

    fn acl(&self, _path: &SourcePath) -> SourceResult<SourceAcl> {
        Ok(SourceAcl::default())
    }

    fn streams(&self, _path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        Ok(Vec::new())
    }

    fn read_stream(
        &self,
        path: &SourcePath,
        _stream: &str,
        _offset: u64,
        _len: usize,
    ) -> SourceResult<Vec<u8>> {
        Err(SourceError::new(
            SourceErrorKind::Unsupported,
            path,
            "NFSv3 has no alternate data streams",
        ))
    }
}
