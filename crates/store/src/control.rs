//! The control socket: how operator commands reach a running mount. A unix socket at
//! `<state_dir>/control.sock` speaking one JSON request per line and one JSON reply per
//! line (`{"ok": …}` or `{"error": "…"}`). Only its owner (root, normally) can connect.
//!
//! Paths travel as JSON strings when they are valid UTF-8 and as arrays of byte values
//! when they are not (a Linux name is any bytes but `/` and NUL; see [`path_bytes`]).

use crate::Store;
use crate::operator::Direction;
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A request to a running store.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    Where {
        #[serde(with = "path_bytes")]
        path: PathBuf,
    },
    Explain {
        #[serde(with = "path_bytes")]
        path: PathBuf,
    },
    Pin {
        #[serde(with = "path_bytes")]
        path: PathBuf,
        tier: Option<String>,
        recursive: bool,
    },
    Unpin {
        #[serde(with = "path_bytes")]
        path: PathBuf,
        recursive: bool,
    },
    Move {
        #[serde(with = "path_bytes")]
        path: PathBuf,
        direction: Direction,
        tier: Option<String>,
        recursive: bool,
    },
    Job {
        id: u64,
    },
    Fsck,
    TraceStart {
        #[serde(with = "path_bytes")]
        out: PathBuf,
    },
    TraceStop,
    /// A `kaiso migrate` command, answered by the handler the migration daemon registered
    /// for this store with [`set_migrate_handler`] (the request body is its own protocol).
    Migrate {
        args: serde_json::Value,
    },
}

/// Serde form of a path that may not be UTF-8: a string when it is valid UTF-8 (what
/// older clients send, and readable), otherwise an array of its bytes. Either form is
/// accepted.
pub mod path_bytes {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::{Path, PathBuf};

    pub fn serialize<S: Serializer>(p: &Path, s: S) -> Result<S::Ok, S::Error> {
        match p.to_str() {
            Some(text) => s.serialize_str(text),
            None => s.collect_seq(p.as_os_str().as_bytes()),
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        Text(String),
        Bytes(Vec<u8>),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PathBuf, D::Error> {
        Ok(match Form::deserialize(d)? {
            Form::Text(t) => PathBuf::from(t),
            Form::Bytes(b) => PathBuf::from(OsString::from_vec(b)),
        })
    }
}

/// Answers `kaiso migrate` requests inside the daemon that migrates into a store.
pub type MigrateHandler =
    Arc<dyn Fn(serde_json::Value) -> Result<serde_json::Value, String> + Send + Sync>;

/// Handlers by store state directory (one daemon per store; a map so that tests holding
/// several stores in one process do not mix them up).
static MIGRATE_HANDLERS: std::sync::Mutex<Vec<(PathBuf, MigrateHandler)>> =
    std::sync::Mutex::new(Vec::new());

/// Registers (or with `None` removes) the migration handler of the store at `state_dir`.
pub fn set_migrate_handler(state_dir: &Path, handler: Option<MigrateHandler>) {
    let mut list = MIGRATE_HANDLERS.lock().unwrap_or_else(|e| e.into_inner());
    list.retain(|(d, _)| d != state_dir);
    if let Some(h) = handler {
        list.push((state_dir.to_path_buf(), h));
    }
}

fn migrate_handler(state_dir: &Path) -> Option<MigrateHandler> {
    MIGRATE_HANDLERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|(d, _)| d == state_dir)
        .map(|(_, h)| h.clone())
}

/// The error a store served by a process that is not migrating answers migrate requests with.
pub const NOT_MIGRATING: &str =
    "this store is served by a kaiso process that is not migrating (kaiso mount or kaiso serve)";

/// The socket path of a store.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join("control.sock")
}

/// Answer a request against a store in this process (what the socket server does).
pub fn handle(store: &Arc<Store>, req: Request) -> Result<serde_json::Value, String> {
    let e = |x: crate::operator::OpError| x.to_string();
    let j = |v: Result<serde_json::Value, serde_json::Error>| v.map_err(|x| x.to_string());
    match req {
        Request::Status => status_value(store).map_err(|x| x.to_string()),
        Request::Where { path } => j(serde_json::to_value(store.where_is(&path).map_err(e)?)),
        Request::Explain { path } => j(serde_json::to_value(store.explain(&path).map_err(e)?)),
        Request::Pin {
            path,
            tier,
            recursive,
        } => {
            let (n, job) = store.pin(&path, tier.as_deref(), recursive).map_err(e)?;
            Ok(serde_json::json!({ "files": n, "job": job }))
        }
        Request::Unpin { path, recursive } => {
            Ok(serde_json::json!({ "files": store.unpin(&path, recursive).map_err(e)? }))
        }
        Request::Move {
            path,
            direction,
            tier,
            recursive,
        } => Ok(
            serde_json::json!({ "job": store.start_move(&path, direction, tier.as_deref(), recursive).map_err(e)? }),
        ),
        Request::Job { id } => j(serde_json::to_value(store.job_progress(id).ok_or_else(
            || format!("no job {id} (jobs end with the daemon that ran them)"),
        )?)),
        Request::Fsck => j(serde_json::to_value(
            store.fsck().map_err(|x| x.to_string())?,
        )),
        Request::TraceStart { out } => {
            store
                .trace_start(&out)
                .map_err(|x| format!("{}: {x}", out.display()))?;
            Ok(serde_json::json!({}))
        }
        Request::TraceStop => {
            Ok(serde_json::json!({ "records": store.trace_stop().map_err(|x| x.to_string())? }))
        }
        Request::Migrate { args } => match migrate_handler(&store.config().state_dir) {
            Some(h) => h(args),
            None => Err(NOT_MIGRATING.into()),
        },
    }
}

/// The status reply: [`Store::status`] with each tier's [`crate::operator::TierHealth`]
/// fields (`online`, `offline_since_unix`, `offline_for_secs`, `unreachable_files`) added to
/// its object, so older readers of the reply keep working.
pub fn status_value(store: &Store) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(store.status())?;
    let health = store.tier_health();
    if let Some(tiers) = v.get_mut("tiers").and_then(|t| t.as_array_mut()) {
        for (t, h) in tiers.iter_mut().zip(health) {
            let (Some(obj), serde_json::Value::Object(extra)) =
                (t.as_object_mut(), serde_json::to_value(h)?)
            else {
                continue;
            };
            for (k, val) in extra {
                if k != "name" {
                    obj.insert(k, val);
                }
            }
        }
    }
    Ok(v)
}

/// Serve the control socket in a background thread (removes a stale socket first).
pub fn serve(store: Arc<Store>) -> std::io::Result<PathBuf> {
    let path = socket_path(&store.config().state_dir);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::thread::Builder::new()
        .name("kaiso-control".into())
        .spawn(move || {
            for conn in l.incoming() {
                if store.stopping() {
                    break;
                }
                let Ok(c) = conn else { continue };
                let store = store.clone();
                std::thread::spawn(move || serve_conn(&store, c));
            }
        })?;
    Ok(path)
}

fn serve_conn(store: &Arc<Store>, c: UnixStream) {
    let Ok(w) = c.try_clone() else { return };
    let mut w = w;
    for line in BufReader::new(c).lines() {
        let Ok(line) = line else { return };
        let reply = match serde_json::from_str::<Request>(&line) {
            Ok(req) => match handle(store, req) {
                Ok(v) => serde_json::json!({ "ok": v }),
                Err(m) => serde_json::json!({ "error": m }),
            },
            Err(e) => serde_json::json!({ "error": format!("bad request: {e}") }),
        };
        if writeln!(w, "{reply}").is_err() {
            return;
        }
    }
}

/// How long a client waits (by default) for a running store to take a request, and to
/// answer one it answers at once ([`answered_at_once`]): a hung daemon gives an error
/// instead of hanging `kaiso status`.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether a store answers `req` at once (within [`CONTROL_TIMEOUT`]); not those whose
/// work is the answer (fsck, recursive pins and moves over a whole tree, migration
/// commands such as `finish`, which verifies every file against its source), which are
/// waited for without a limit.
pub fn answered_at_once(req: &Request) -> bool {
    match req {
        Request::Fsck | Request::Migrate { .. } => false,
        Request::Pin { recursive, .. }
        | Request::Unpin { recursive, .. }
        | Request::Move { recursive, .. } => !*recursive,
        _ => true,
    }
}

/// A connection to a running store.
pub struct Client {
    r: BufReader<UnixStream>,
    w: UnixStream,
    /// A request timed out: its late reply could be taken for the next one's.
    broken: bool,
    /// See [`CONTROL_TIMEOUT`].
    timeout: Duration,
}

impl Client {
    /// Connect to the store whose state directory is `state_dir`.
    pub fn connect(state_dir: &Path) -> std::io::Result<Client> {
        let s = UnixStream::connect(socket_path(state_dir))?;
        s.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        Ok(Client {
            r: BufReader::new(s.try_clone()?),
            w: s,
            broken: false,
            timeout: CONTROL_TIMEOUT,
        })
    }

    /// Wait `timeout` instead of [`CONTROL_TIMEOUT`] from now on.
    pub fn set_timeout(&mut self, timeout: Duration) -> std::io::Result<()> {
        self.w.set_write_timeout(Some(timeout))?;
        self.timeout = timeout;
        Ok(())
    }

    /// Send one request; the reply's `ok` value, or its error message. Fails with a
    /// clear error if the daemon does not take the request or answer it in time
    /// (see [`answered_at_once`]); the connection is not used again after that.
    pub fn call(&mut self, req: &Request) -> anyhow::Result<serde_json::Value> {
        if self.broken {
            anyhow::bail!("the control connection is unusable after an earlier timeout");
        }
        let timeout = answered_at_once(req).then_some(self.timeout);
        self.r.get_ref().set_read_timeout(timeout)?;
        let hung = |e: &std::io::Error| {
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        };
        if let Err(e) = writeln!(self.w, "{}", serde_json::to_string(req)?) {
            if hung(&e) {
                self.broken = true;
                anyhow::bail!(
                    "the kaiso daemon did not take the request within {:?} (is it hung?)",
                    self.timeout
                );
            }
            return Err(e.into());
        }
        let mut line = String::new();
        match self.r.read_line(&mut line) {
            Ok(0) => anyhow::bail!("the kaiso daemon closed the control connection"),
            Ok(_) => {}
            Err(e) if hung(&e) => {
                self.broken = true;
                anyhow::bail!(
                    "the kaiso daemon did not answer within {:?} (is it hung?)",
                    self.timeout
                );
            }
            Err(e) => return Err(e.into()),
        }
        let v: serde_json::Value = serde_json::from_str(&line)?;
        if let Some(e) = v.get("error") {
            anyhow::bail!("{}", e.as_str().unwrap_or("error"));
        }
        Ok(v.get("ok").cloned().unwrap_or(serde_json::Value::Null))
    }
}
