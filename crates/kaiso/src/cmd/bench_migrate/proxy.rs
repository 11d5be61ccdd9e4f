//! A user-space TCP delay proxy: emulates the network between the old server and kaiso.
//!
//! Every byte read from one side is forwarded to the other `delay` later (per direction,
//! so a request/response round trip costs 2 × `delay` extra). Chunks are queued with
//! their arrival time and written in order, so throughput is not limited by the delay
//! (like a long pipe, not a stop-and-wait link). An optional rate limit paces the writes.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A listening proxy; dropping it stops accepting and closes every forwarded connection.
pub struct DelayProxy {
    pub port: u16,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
    bytes: Arc<AtomicU64>,
}

impl DelayProxy {
    /// Listens on an ephemeral 127.0.0.1 port and forwards to `upstream` with `delay` each
    /// way and at most `rate` bytes/s per direction and connection (`None`: unlimited).
    pub fn start(upstream: SocketAddr, delay: Duration, rate: Option<u64>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").context("bind the delay proxy")?;
        let port = listener.local_addr()?.port();
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let bytes = Arc::new(AtomicU64::new(0));
        let (st, cs, by) = (stop.clone(), conns.clone(), bytes.clone());
        let acceptor = std::thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                while !st.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((client, _)) => {
                            let Ok(server) =
                                TcpStream::connect_timeout(&upstream, Duration::from_secs(5))
                            else {
                                let _ = client.shutdown(Shutdown::Both);
                                continue;
                            };
                            let _ = client.set_nonblocking(false);
                            let _ = client.set_nodelay(true);
                            let _ = server.set_nodelay(true);
                            if let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) {
                                let mut g = cs.lock().unwrap_or_else(|e| e.into_inner());
                                g.push(c2);
                                g.push(s2);
                            }
                            spawn_pipe(&client, &server, delay, rate, by.clone());
                            spawn_pipe(&server, &client, delay, rate, by.clone());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(5));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })?;
        Ok(Self {
            port,
            stop,
            conns,
            acceptor: Some(acceptor),
            bytes,
        })
    }
}

impl DelayProxy {
    /// Bytes forwarded so far, both directions.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for c in self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
    }
}

/// Chunks with the time they may be written, and whether the reader has seen EOF.
type Pending = (VecDeque<(Instant, Vec<u8>)>, bool);

struct Queue {
    chunks: Mutex<Pending>,
    ready: Condvar,
}

/// Forwards `from` → `to` through a delay queue: a reader thread stamps chunks, a writer
/// thread releases each one when its time has come.
fn spawn_pipe(
    from: &TcpStream,
    to: &TcpStream,
    delay: Duration,
    rate: Option<u64>,
    bytes: Arc<AtomicU64>,
) {
    let (Ok(mut rd), Ok(mut wr)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let q = Arc::new(Queue {
        chunks: Mutex::new((VecDeque::new(), false)),
        ready: Condvar::new(),
    });
    let qr = q.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        loop {
            let n = match rd.read(&mut buf) {
                Ok(0) | Err(_) => 0,
                Ok(n) => n,
            };
            let mut g = qr.chunks.lock().unwrap_or_else(|e| e.into_inner());
            if n == 0 {
                g.1 = true;
                qr.ready.notify_all();
                return;
            }
            g.0.push_back((Instant::now() + delay, buf[..n].to_vec()));
            qr.ready.notify_all();
        }
    });
    std::thread::spawn(move || {
        let mut paced_until = Instant::now();
        loop {
            let next = {
                let mut g = q.chunks.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(c) = g.0.pop_front() {
                        break Some(c);
                    }
                    if g.1 {
                        break None;
                    }
                    g = q.ready.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            };
            let Some((due, data)) = next else {
                let _ = wr.shutdown(Shutdown::Write);
                return;
            };
            let now = Instant::now();
            let at = due.max(paced_until);
            if at > now {
                std::thread::sleep(at - now);
            }
            if let Some(r) = rate {
                let cost = Duration::from_secs_f64(data.len() as f64 / r as f64);
                paced_until = Instant::now().max(paced_until) + cost;
            }
            // Counted before the write: once the peer has read the bytes, they are counted.
            bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
            if wr.write_all(&data).is_err() {
                let _ = wr.shutdown(Shutdown::Both);
                return;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_adds_the_delay_each_way_and_forwards_every_byte() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let p = DelayProxy::start(addr, Duration::from_millis(20), None).unwrap();
        let mut c = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
        let t = Instant::now();
        c.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).unwrap();
        let rtt = t.elapsed();
        assert_eq!(&got, b"ping");
        assert!(rtt >= Duration::from_millis(40), "round trip {rtt:?}");
        // Bulk data is pipelined, not one delay per chunk.
        let data: Vec<u8> = (0..4 << 20).map(|i| (i % 251) as u8).collect();
        let mut c2 = c.try_clone().unwrap();
        let d2 = data.clone();
        let w = std::thread::spawn(move || c2.write_all(&d2).unwrap());
        let t = Instant::now();
        let mut back = vec![0u8; data.len()];
        c.read_exact(&mut back).unwrap();
        w.join().unwrap();
        assert!(back == data);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(p.bytes() >= 2 * data.len() as u64);
    }
}
