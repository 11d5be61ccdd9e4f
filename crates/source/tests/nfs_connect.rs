//! Connecting the NFSv3 source to services that are not what they claim: a port that
//! accepts and closes at once, and one that accepts and never answers, as portmapper and
//! as MOUNT service. Each must fail with a clear error within a second or two, never hang
//! or spin (a crate used before looped on the closed connection until a 60 s timeout).

use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kaiso_source::{NfsConfig, NfsSource};
use kaiso_store::migrate::{SourceError, SourceErrorKind};

/// How a fake service treats each connection it accepts.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Closes the connection as soon as it is accepted.
    CloseAtOnce,
    /// Reads and discards what the client sends and never writes a byte.
    NeverAnswer,
}

/// A loopback listener serving `Behaviour` on a thread until dropped.
struct FakeService {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeService {
    fn start(behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            while !st.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((conn, _)) => match behaviour {
                        Behaviour::CloseAtOnce => drop(conn),
                        Behaviour::NeverAnswer => {
                            conn.set_nonblocking(true).unwrap();
                            held.push(conn);
                        }
                    },
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
                let mut sink = [0u8; 4096];
                for c in &mut held {
                    while matches!(c.read(&mut sink), Ok(n) if n > 0) {}
                }
            }
        });
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Connects with `config` and returns the error and how long it took to come.
fn connect_error(config: NfsConfig) -> (SourceError, Duration) {
    let t = Instant::now();
    let e = NfsSource::connect(config)
        .err()
        .expect("connect must fail against a fake service");
    (e, t.elapsed())
}

/// A transport error saying the peer closed: end of stream, or a reset when the close
/// raced the call's write.
fn closed(msg: &str) -> bool {
    msg.contains("transport:")
        && (msg.contains("closed the connection") || msg.contains("reset by peer"))
}

fn base_config() -> NfsConfig {
    let mut c = NfsConfig::new("127.0.0.1", "/export");
    // Unprivileged: the test must not depend on which low ports are free.
    c.privileged_port = false;
    c
}

/// Connecting with `c` fails at once, naming `service` and the closed connection.
fn fails_at_once(mut c: NfsConfig, service: &str) {
    // Long timeouts: waiting for one instead of failing at once takes 30 s, far from the
    // 10 s bound below, whatever the machine's speed or load.
    c.connect_timeout = Duration::from_secs(30);
    c.rpc_timeout = Duration::from_secs(60);
    let (e, took) = connect_error(c);
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    let msg = e.to_string();
    assert!(msg.contains(service) && closed(&msg), "{msg}");
    assert!(
        took < Duration::from_secs(10),
        "took {took:?} (expected at once, not the 30 s connect timeout): {msg}"
    );
}

#[test]
fn a_portmapper_that_closes_at_once_fails_at_once() {
    let fake = FakeService::start(Behaviour::CloseAtOnce);
    let mut c = base_config();
    c.portmapper_port = fake.port;
    fails_at_once(c, "portmapper");
}

#[test]
fn a_mount_service_that_closes_at_once_fails_at_once() {
    let fake = FakeService::start(Behaviour::CloseAtOnce);
    let mut c = base_config();
    c.mount_port = Some(fake.port);
    c.nfs_port = Some(fake.port);
    fails_at_once(c, "MOUNT service");
}

#[test]
fn services_that_never_answer_fail_within_the_connect_timeout() {
    let fake = FakeService::start(Behaviour::NeverAnswer);
    // As portmapper, then as MOUNT service.
    for via_portmapper in [true, false] {
        let mut c = base_config();
        c.connect_timeout = Duration::from_secs(1);
        // Far from the bound below: a call that waited for the RPC timeout fails it.
        c.rpc_timeout = Duration::from_secs(60);
        if via_portmapper {
            c.portmapper_port = fake.port;
        } else {
            c.mount_port = Some(fake.port);
            c.nfs_port = Some(fake.port);
        }
        let (e, took) = connect_error(c);
        assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("no answer"), "{msg}");
        // At least the 1 s connect timeout; at most a few of them (5 s: room for a
        // loaded machine), far below the 60 s RPC timeout.
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(5),
            "took {took:?}: {msg}"
        );
    }
}

#[test]
fn the_default_connect_timeout_is_short() {
    // Seconds, not the minute an RPC of a running migration may take.
    let c = NfsConfig::new("127.0.0.1", "/export");
    assert!(c.connect_timeout <= Duration::from_secs(5));
    assert!(c.connect_timeout < c.rpc_timeout);
}
