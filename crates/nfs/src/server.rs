//! The listener: binds, refuses clients outside the allow list, serves the others
//! (`conn`: kaiso's own RPC layer in front of `nfs3_server`; NFSv3, MOUNT v3 and portmap
//! on one port), and stops cleanly.

use crate::allow::AllowList;
use crate::conn::{self, Shared};
use crate::cred::{Cred, Identity, Squash};
use crate::fs::KaisoNfs;
use crate::handles::OpenFiles;
use crate::jukebox::Jukebox;
use crate::procs::Handles;
use anyhow::Context;
use kaiso_store::Store;
use nfs3_server::test_reexports::RPCContext;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

/// How the server is exposed.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// Address and port to listen on (port 0: any free port).
    pub listen: SocketAddr,
    /// Clients allowed to connect; others are disconnected at accept.
    pub allow: AllowList,
    /// Answer NFS3ERR_JUKEBOX when a call takes longer than this; `None`: always wait.
    pub jukebox_after: Option<Duration>,
    /// How long a store call that failed for a reason that passes (the migration source
    /// did not answer a fetch: EIO on a stub; EAGAIN, EBUSY) is tried again before its
    /// error is answered.
    pub retry_for: Duration,
    /// Export path clients mount (`/export` → `nfs://host/export`).
    pub export: String,
    /// Close an NFS-opened store handle after this long without use.
    pub handle_idle: Duration,
    /// Which callers act as the anonymous user (exports(5) `root_squash`, …).
    pub squash: Squash,
    /// Clients whose root is not squashed by `Squash::Root` (default: loopback).
    pub root_trusted: AllowList,
    /// The anonymous user and group (AUTH_NULL and squashed callers); default 65534.
    pub anon_uid: u32,
    pub anon_gid: u32,
}

impl ServeOptions {
    /// 127.0.0.1:<port>, loopback clients only, JUKEBOX after 500 ms, failures that pass
    /// retried for [`crate::jukebox::RETRY_FOR`], export `/export`,
    /// root squashed except for loopback clients, anonymous user 65534:65534.
    pub fn loopback(port: u16) -> ServeOptions {
        let id = Identity::default();
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            allow: AllowList::loopback(),
            jukebox_after: Some(Duration::from_millis(500)),
            retry_for: crate::jukebox::RETRY_FOR,
            export: "/export".into(),
            handle_idle: Duration::from_secs(10),
            squash: id.squash,
            root_trusted: id.root_trusted,
            anon_uid: id.anon_uid,
            anon_gid: id.anon_gid,
        }
    }

    fn identity(&self) -> Identity {
        Identity {
            squash: self.squash,
            root_trusted: self.root_trusted.clone(),
            anon_uid: self.anon_uid,
            anon_gid: self.anon_gid,
        }
    }
}

/// Counters a running server exposes (tests, logs).
#[derive(Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub refused: AtomicU64,
}

/// A running NFS server; [`NfsServer::stop`] (or drop) shuts it down.
pub struct NfsServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    jukebox: Arc<Jukebox>,
    files: Arc<OpenFiles>,
    stats: Arc<ServerStats>,
}

impl NfsServer {
    /// Bind and start serving `store` on background threads. Errors are one line
    /// (e.g. "cannot listen on 127.0.0.1:2049: Address already in use").
    pub fn start(store: Arc<Store>, opts: ServeOptions) -> anyhow::Result<NfsServer> {
        let export = format!("/{}", opts.export.trim_matches('/'));
        let std_listener = std::net::TcpListener::bind(opts.listen)
            .with_context(|| format!("cannot listen on {}", opts.listen))?;
        let addr = std_listener.local_addr()?;
        std_listener.set_nonblocking(true)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(64)
            .thread_name("kaiso-nfs")
            .enable_all()
            .build()
            .context("cannot start the NFS runtime")?;
        let jukebox = Arc::new(Jukebox::with_retry(opts.jukebox_after, opts.retry_for));
        let files = Arc::new(OpenFiles::new(store.clone(), opts.handle_idle, 4096));
        let stats = Arc::new(ServerStats::default());
        let fs = KaisoNfs::new(store, jukebox.clone(), files.clone(), Cred::ROOT);
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        if euid != 0 {
            tracing::warn!(
                uid = euid,
                "NFS server not running as root: every client acts as this user"
            );
        }
        let mut base = RPCContext::test_ctx(&export, Arc::new(fs.for_caller(Cred::ROOT)));
        base.local_port = addr.port();
        let shared = Arc::new(Shared {
            handles: Handles::from_root(&base.root_dir()),
            base,
            fs,
            identity: opts.identity(),
            daemon: (euid != 0).then_some((euid, egid)),
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let listener = {
            let _g = runtime.enter();
            tokio::net::TcpListener::from_std(std_listener)?
        };
        let (allow, st, fl) = (opts.allow.clone(), stats.clone(), files.clone());
        let thread = std::thread::Builder::new()
            .name("kaiso-nfs-accept".into())
            .spawn(move || {
                runtime.block_on(accept_loop(listener, shared, allow, st, fl, stop_rx));
                // In-flight store calls finish on their own; do not wait for them forever.
                runtime.shutdown_timeout(Duration::from_secs(5));
            })?;
        tracing::info!(%addr, allow = %opts.allow, squash = %opts.squash, "NFSv3 server listening");
        Ok(NfsServer {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
            jukebox,
            files,
            stats,
        })
    }

    /// The bound address (the real port when 0 was asked).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// NFS3ERR_JUKEBOX replies sent so far.
    pub fn jukebox_replies(&self) -> u64 {
        self.jukebox.replies()
    }

    /// Requests that joined in-flight work instead of starting it again.
    pub fn jukebox_joined(&self) -> u64 {
        self.jukebox.joined()
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Store handles the face holds open right now.
    pub fn open_handles(&self) -> usize {
        self.files.len()
    }

    /// Stop accepting, drop connections and close the store handles the face opened.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.files.clear();
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    allow: AllowList,
    stats: Arc<ServerStats>,
    files: Arc<OpenFiles>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut conns = tokio::task::JoinSet::new();
    let mut sweep = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = sweep.tick() => files.sweep(),
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => {
                let (socket, peer) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if !allow.allows(peer.ip()) {
                    stats.refused.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, "NFS client refused: not in the allow list");
                    drop(socket);
                    continue;
                }
                stats.connections.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%peer, "NFS client connected");
                let _ = socket.set_nodelay(true);
                let shared = shared.clone();
                conns.spawn(async move {
                    if let Err(e) = conn::serve(socket, peer, shared).await {
                        tracing::debug!(%peer, error = %e, "NFS connection closed");
                    }
                });
            }
        }
    }
    conns.shutdown().await;
}
