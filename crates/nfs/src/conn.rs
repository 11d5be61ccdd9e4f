//! One client connection: kaiso reads the RPC records itself, learns each call's
//! credential, answers LINK/MKNOD/MKDIR/ACCESS itself ([`procs`]) and forwards every
//! other call to `nfs3_server` on a *lane*.
//!
//! Why lanes: `nfs3_server` hands its file-system methods no credential, so the identity
//! has to be in the file system value itself. A lane is one in-memory duplex stream into
//! the crate's connection handler (`process_socket`) whose file system is a [`KaisoNfs`]
//! acting for one identity; each connection keeps one lane per identity it has seen
//! (normally a handful: the users of one client host). Calls of one identity keep running
//! concurrently on their lane (the crate serves each call in its own task), so nothing is
//! serialised, and no call can be served as the wrong user. Idle lanes are closed.
//! Replies from all lanes and from [`procs`] are written back through one writer task.

use crate::cred::{Cred, Identity};
use crate::fs::KaisoNfs;
use crate::procs::{self, Handles};
use crate::rpc::{self, Credential};
use nfs3_server::nfs3_types::rpc::{accept_stat_data, auth_stat};
use nfs3_server::test_reexports::{RPCContext, process_socket};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufReader, DuplexStream, WriteHalf};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Identities one connection may use at once before new ones are refused (SYSTEM_ERR).
const MAX_LANES: usize = 64;
/// A lane with nothing in flight is closed after this long unused.
const LANE_IDLE: Duration = Duration::from_secs(60);
/// Buffer of a lane's in-memory stream (each direction): one 1 MiB WRITE or READ reply.
const LANE_BUFFER: usize = 1 << 20;
/// Replies queued for the client socket.
const REPLY_QUEUE: usize = 64;
const PORTMAP_PROGRAM: u32 = 100_000;

/// What every connection of one server shares.
pub struct Shared {
    /// The crate's context (export, duplicate-request cache, handle generation).
    pub base: RPCContext<KaisoNfs>,
    /// The face acting as root: the template each identity's face is made from.
    pub fs: KaisoNfs,
    pub identity: Identity,
    /// The server's own (uid, gid) when it is not root (see [`Identity::map`]).
    pub daemon: Option<(u32, u32)>,
    pub handles: Handles,
}

struct Lane {
    to_crate: WriteHalf<DuplexStream>,
    in_flight: Arc<AtomicUsize>,
    last_used: Instant,
}

/// Serve one accepted client until it disconnects (or the task is aborted at shutdown,
/// which ends every task this connection started).
pub async fn serve(
    socket: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let (rd, mut wr) = socket.into_split();
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(REPLY_QUEUE);
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        while let Some(buf) = rx.recv().await {
            if wr.write_all(&buf).await.is_err() {
                break;
            }
        }
    });
    let mut lanes: HashMap<Cred, Lane> = HashMap::new();
    let client_addr = peer.to_string();
    loop {
        while tasks.try_join_next().is_some() {}
        let Some(rec) = rpc::read_record(&mut rd, rpc::MAX_RECORD).await? else {
            return Ok(());
        };
        let Some(h) = rpc::parse_call(rec.body()) else {
            anyhow::bail!("not an RPC call; closing the connection");
        };
        if h.rpcvers != 2 {
            tx.send(rpc::rpc_mismatch(h.xid)).await?;
            continue;
        }
        let sys = match &h.cred {
            Credential::Null => None,
            Credential::Sys(c) => Some(c),
            // Portmap lookups need no identity; nothing else is served without one.
            Credential::Unsupported(_) | Credential::Malformed if h.prog == PORTMAP_PROGRAM => None,
            Credential::Malformed => {
                tx.send(rpc::auth_error(h.xid, auth_stat::AUTH_BADCRED))
                    .await?;
                continue;
            }
            Credential::Unsupported(flavor) => {
                tracing::debug!(%peer, flavor, "unsupported RPC credential flavour");
                tx.send(rpc::auth_error(h.xid, auth_stat::AUTH_TOOWEAK))
                    .await?;
                continue;
            }
        };
        let cred = shared.identity.map(peer.ip(), sys, shared.daemon);
        if procs::is_own(&h) {
            let fs = shared.fs.for_caller(cred);
            let (tx, shared) = (tx.clone(), shared.clone());
            tasks.spawn(async move {
                let reply = procs::answer(&fs, &shared.handles, &h, rec.body()).await;
                let _ = tx.send(reply).await;
            });
            continue;
        }
        if !lanes.contains_key(&cred) {
            close_idle(&mut lanes).await;
            if lanes.len() >= MAX_LANES {
                tracing::warn!(%peer, "too many distinct credentials on one connection");
                tx.send(rpc::accept_error(h.xid, accept_stat_data::SYSTEM_ERR))
                    .await?;
                continue;
            }
            let lane = open_lane(&shared, &client_addr, cred.clone(), &tx, &mut tasks);
            lanes.insert(cred.clone(), lane);
        }
        let Some(lane) = lanes.get_mut(&cred) else {
            continue;
        };
        lane.in_flight.fetch_add(1, Ordering::SeqCst);
        lane.last_used = Instant::now();
        lane.to_crate.write_all(&rec.into_framed()).await?;
    }
}

/// A new lane: the crate's connection handler over an in-memory stream, with a file
/// system acting as `cred`, and a task copying its replies to the client.
fn open_lane(
    shared: &Shared,
    client_addr: &str,
    cred: Cred,
    tx: &mpsc::Sender<Vec<u8>>,
    tasks: &mut JoinSet<()>,
) -> Lane {
    tracing::debug!(
        client = client_addr,
        uid = cred.uid,
        gid = cred.gid,
        "new NFS lane"
    );
    let (ours, theirs) = tokio::io::duplex(LANE_BUFFER);
    let mut ctx = shared.base.clone();
    ctx.vfs = Arc::new(shared.fs.for_caller(cred));
    // Same address on every lane: the crate's duplicate-request cache is keyed by it.
    ctx.client_addr = client_addr.to_owned();
    tasks.spawn(async move {
        if let Err(e) = process_socket(theirs, ctx).await {
            tracing::debug!(error = %e, "NFS lane closed");
        }
    });
    let (mut from_crate, to_crate) = tokio::io::split(ours);
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (count, tx) = (in_flight.clone(), tx.clone());
    tasks.spawn(async move {
        // Replies are whole records; pass them on unchanged.
        while let Ok(Some(reply)) = rpc::read_record(&mut from_crate, usize::MAX >> 1).await {
            let _ = count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if tx.send(reply.into_framed()).await.is_err() {
                break;
            }
        }
    });
    Lane {
        to_crate,
        in_flight,
        last_used: Instant::now(),
    }
}

/// Close lanes with no call in flight that have not been used for [`LANE_IDLE`]: the
/// crate's handler sees the end of its stream and returns, and so does the reply task.
async fn close_idle(lanes: &mut HashMap<Cred, Lane>) {
    let idle: Vec<Cred> = lanes
        .iter()
        .filter(|(_, l)| {
            l.in_flight.load(Ordering::SeqCst) == 0 && l.last_used.elapsed() > LANE_IDLE
        })
        .map(|(c, _)| c.clone())
        .collect();
    for c in idle {
        if let Some(mut lane) = lanes.remove(&c) {
            let _ = lane.to_crate.shutdown().await;
        }
    }
}
