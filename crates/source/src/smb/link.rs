//! One SMB session on its own TCP connection (an `smb2::SmbClient` and its share's tree),
//! with what the source counts on it: calls running (to pick the least busy session) and
//! whether it broke (then the next call connects again).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use smb2::client::Connection;
use smb2::pack::Pack;
use smb2::types::{Command, CreditCharge, FileId, TreeId};
use smb2::{ClientConfig, Frame, SmbClient};

use super::SmbConfig;
use super::wire;

/// Requests sent, by kind, on every session of a source (see `Smb2Stats`).
#[derive(Default)]
pub struct Requests {
    pub compounds: AtomicU64,
    pub singles: AtomicU64,
    pub creates: AtomicU64,
    pub queries: AtomicU64,
    pub listings: AtomicU64,
    pub reads: AtomicU64,
    pub closes: AtomicU64,
}

impl Requests {
    pub fn count(&self, command: Command) {
        let c = match command {
            Command::Create => &self.creates,
            Command::QueryInfo => &self.queries,
            Command::QueryDirectory => &self.listings,
            Command::Read => &self.reads,
            Command::Close => &self.closes,
            _ => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Why a request failed, before it becomes a `SourceError`.
#[derive(Debug)]
pub enum Fail {
    /// The crate's error (transport, authentication, a status it checked itself).
    Smb(smb2::Error),
    /// No answer within the configured timeout.
    TimedOut,
    /// The server answered `op` with this NTSTATUS.
    Status { status: u32, op: &'static str },
    /// A reply this source could not decode.
    Malformed(&'static str),
    /// The connection failed (on a data connection of the source's own).
    Io(String),
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fail::Smb(e) => write!(f, "{e}"),
            Fail::TimedOut => write!(f, "no answer in time"),
            Fail::Status { status, op } => write!(f, "{op}: NTSTATUS {status:#010x}"),
            Fail::Malformed(what) => write!(f, "malformed {what} reply"),
            Fail::Io(e) => write!(f, "{e}"),
        }
    }
}

/// One request of a compound: command, body and credit charge.
pub type Op<'a> = (Command, &'a dyn Pack, u16);

pub struct Link {
    /// Kept alive for the session; requests go through `conn`.
    _client: SmbClient,
    conn: Connection,
    tree_id: TreeId,
    /// Largest READ the server takes (MaxReadSize).
    pub max_read: u32,
    /// Largest QUERY_DIRECTORY / QUERY_INFO output (MaxTransactSize).
    pub max_transact: u32,
    pub busy: AtomicUsize,
    pub broken: AtomicBool,
    requests: Arc<Requests>,
}

/// Decrements a session's running calls when a call ends, however it ends.
pub struct BusyGuard(Arc<Link>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Link {
    /// Connects, authenticates (NTLM) and connects the share, all within the timeout.
    /// The crate signs every message of an authenticated session (and seals them when
    /// the server asks); bulk data goes over the source's own connections (`data`).
    pub async fn connect(config: &SmbConfig, requests: Arc<Requests>) -> Result<Self, Fail> {
        tokio::time::timeout(config.timeout * 2, Self::setup(config, requests))
            .await
            .map_err(|_| Fail::TimedOut)?
    }

    async fn setup(config: &SmbConfig, requests: Arc<Requests>) -> Result<Self, Fail> {
        let client_config = ClientConfig {
            addr: config.server(),
            timeout: config.timeout,
            username: config.user.clone(),
            password: config.password.clone(),
            domain: config.domain.clone(),
            // The source reconnects itself (a broken session is replaced by the next
            // call), so a dead server fails calls instead of being redialled inside them.
            auto_reconnect: false,
            compression: false,
            dfs_enabled: false,
            response_timeout: Some(config.timeout),
            ..Default::default()
        };
        let mut client = SmbClient::connect(client_config).await.map_err(Fail::Smb)?;
        let tree = client
            .connect_share(&config.share)
            .await
            .map_err(Fail::Smb)?;
        let conn = client.connection().clone();
        Ok(Self::new(client, conn, tree.tree_id, config, requests))
    }

    fn new(
        client: SmbClient,
        conn: Connection,
        tree_id: TreeId,
        config: &SmbConfig,
        requests: Arc<Requests>,
    ) -> Self {
        // smb2 bounds its credit wait; a wait longer than a request may take is a hang.
        conn.set_credit_wait_timeout(config.timeout);
        let params = conn.params();
        tracing::debug!(dialect = ?params.as_ref().map(|p| p.dialect), "smb2: session up");
        Self {
            max_read: params.as_ref().map_or(64 << 10, |p| p.max_read_size),
            max_transact: params.as_ref().map_or(64 << 10, |p| p.max_transact_size),
            _client: client,
            conn,
            tree_id,
            busy: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            requests,
        }
    }

    pub fn busy_guard(self: &Arc<Self>) -> BusyGuard {
        self.busy.fetch_add(1, Ordering::SeqCst);
        BusyGuard(self.clone())
    }

    pub fn is_live(&self) -> bool {
        !self.broken.load(Ordering::SeqCst)
    }

    /// Stops the session: requests waiting on it fail at once, and it is not used again.
    pub fn shut(&self) {
        self.broken.store(true, Ordering::SeqCst);
        self.conn.mark_dead();
    }

    /// Sends `ops` as one related compound (one round trip) and waits at most `timeout`
    /// for every reply. A sub-request the server refused is a frame with that status, for
    /// the caller to judge; a transport failure is an error.
    pub async fn compound(&self, ops: &[Op<'_>], timeout: Duration) -> Result<Vec<Frame>, Fail> {
        let tree_id = Some(self.tree_id);
        let ops: Vec<smb2::CompoundOp<'_>> = ops
            .iter()
            .map(|(command, body, charge)| {
                self.requests.count(*command);
                smb2::CompoundOp {
                    command: *command,
                    body: *body,
                    tree_id,
                    credit_charge: CreditCharge(*charge),
                }
            })
            .collect();
        self.requests.compounds.fetch_add(1, Ordering::Relaxed);
        let frames = tokio::time::timeout(timeout, self.conn.execute_compound(&ops))
            .await
            .map_err(|_| Fail::TimedOut)?
            .map_err(Fail::Smb)?;
        frames.into_iter().map(|f| f.map_err(Fail::Smb)).collect()
    }

    /// Sends one request and waits at most `timeout` for its reply.
    pub async fn single(&self, op: Op<'_>, timeout: Duration) -> Result<Frame, Fail> {
        self.requests.count(op.0);
        self.requests.singles.fetch_add(1, Ordering::Relaxed);
        let sent =
            self.conn
                .execute_with_credits(op.0, op.1, Some(self.tree_id), CreditCharge(op.2));
        tokio::time::timeout(timeout, sent)
            .await
            .map_err(|_| Fail::TimedOut)?
            .map_err(Fail::Smb)
    }

    /// Closes a handle without anybody waiting for the answer.
    pub fn close_in_background(self: &Arc<Self>, rt: &tokio::runtime::Handle, file_id: FileId) {
        let link = self.clone();
        rt.spawn(async move {
            let close = wire::close(file_id);
            let r = link
                .single((Command::Close, &close, 1), Duration::from_secs(30))
                .await;
            if let Err(e) = r {
                tracing::debug!(error = %e, "smb2: background close failed");
            }
        });
    }
}
