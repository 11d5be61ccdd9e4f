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
/// A chunk is a full-size buffer and how many of its bytes are data, so buffers are
/// reused without being zeroed again.
type Pending = (VecDeque<(Instant, Vec<u8>, usize)>, bool);

/// Bytes one read may bring in.
const CHUNK: usize = 256 << 10;

struct Queue {
    chunks: Mutex<Pending>,
    ready: Condvar,
    /// Bytes read and not yet written, and the reader's wait for room: the queue is
    /// bounded like a socket buffer, so a fast sender is held back by a slow receiver
    /// (TCP flow control through the proxy) instead of the proxy buffering gigabytes
    /// in fresh memory, which cost rsync's single stream 4-7 CPU seconds per run.
    queued: AtomicU64,
    room: Condvar,
    /// Set when the writer ended (its peer is gone): the reader stops too.
    writer_gone: AtomicBool,
    /// Buffers written out, handed back to the reader: the proxy reads straight into
    /// them instead of copying each chunk into a freshly allocated one (the proxy's own
    /// cost is paid by both sides of the comparison, so it is kept small).
    spare: Mutex<Vec<Vec<u8>>>,
}

/// Forwards `from` → `to` through a delay queue: a reader thread stamps chunks, a writer
/// thread releases them when their time has come, all that are due in one write.
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
        queued: AtomicU64::new(0),
        room: Condvar::new(),
        writer_gone: AtomicBool::new(false),
        spare: Mutex::new(Vec::new()),
    });
    let qr = q.clone();
    let _ = std::thread::Builder::new()
        .name("proxy-read".into())
        .spawn(move || {
            loop {
                let mut buf = qr
                    .spare
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop()
                    .unwrap_or_else(|| vec![0u8; CHUNK]);
                let n = match rd.read(&mut buf) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                // A small piece is queued in a buffer of its own size and the big one goes
                // back: the queue's limit counts bytes, so a stream of small pieces must
                // not hold a whole CHUNK each (memory stays within 4 × MAX_QUEUED).
                let buf = if n > 0 && n < CHUNK / 4 {
                    let small = buf[..n].to_vec();
                    qr.spare.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
                    small
                } else {
                    buf
                };
                let mut g = qr.chunks.lock().unwrap_or_else(|e| e.into_inner());
                if n == 0 {
                    g.1 = true;
                    qr.ready.notify_all();
                    return;
                }
                READS.fetch_add(1, Ordering::Relaxed);
                g.0.push_back((Instant::now() + delay, buf, n));
                qr.ready.notify_all();
                if qr.queued.fetch_add(n as u64, Ordering::AcqRel) + n as u64 > MAX_QUEUED {
                    while qr.queued.load(Ordering::Acquire) > MAX_QUEUED
                        && !qr.writer_gone.load(Ordering::Acquire)
                    {
                        g = qr.room.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                }
                if qr.writer_gone.load(Ordering::Acquire) {
                    return;
                }
            }
        });
    let _ = std::thread::Builder::new()
        .name("proxy-write".into())
        .spawn(move || {
            let mut paced_until = Instant::now();
            let mut batch: Vec<(Vec<u8>, usize)> = Vec::new();
            loop {
                // Wait for the oldest chunk, then for its time.
                let first_due = {
                    let mut g = q.chunks.lock().unwrap_or_else(|e| e.into_inner());
                    loop {
                        if let Some(c) = g.0.front() {
                            break Some(c.0);
                        }
                        if g.1 {
                            break None;
                        }
                        g = q.ready.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                };
                let Some(due) = first_due else {
                    let _ = wr.shutdown(Shutdown::Write);
                    writer_done(&q);
                    return;
                };
                let now = Instant::now();
                let at = due.max(paced_until);
                if at > now {
                    std::thread::sleep(at - now);
                }
                // Every chunk whose time has come goes out in one write: a stream that
                // arrives in many small reads (rsync's) is not charged a thread wake-up
                // and a system call per piece, which no real link charges either.
                {
                    let now = Instant::now();
                    let mut g = q.chunks.lock().unwrap_or_else(|e| e.into_inner());
                    let mut size = 0;
                    while let Some(c) = g.0.front() {
                        if c.0 > now && !batch.is_empty() {
                            break;
                        }
                        if rate.is_some() && !batch.is_empty() {
                            break; // paced: one chunk at a time
                        }
                        let (_, buf, n) = g.0.pop_front().expect("front exists");
                        size += n;
                        batch.push((buf, n));
                        if size >= MAX_BATCH {
                            break;
                        }
                    }
                }
                let total: usize = batch.iter().map(|b| b.1).sum();
                if let Some(r) = rate {
                    let cost = Duration::from_secs_f64(total as f64 / r as f64);
                    paced_until = Instant::now().max(paced_until) + cost;
                }
                // Counted before the write: once the peer has read the bytes, they are counted.
                bytes.fetch_add(total as u64, Ordering::Relaxed);
                if write_all_vectored(&mut wr, &batch).is_err() {
                    let _ = wr.shutdown(Shutdown::Both);
                    writer_done(&q);
                    return;
                }
                {
                    let _g = q.chunks.lock().unwrap_or_else(|e| e.into_inner());
                    q.queued.fetch_sub(total as u64, Ordering::AcqRel);
                    q.room.notify_all();
                }
                let mut spare = q.spare.lock().unwrap_or_else(|e| e.into_inner());
                // Only whole CHUNKs are reused: a reader must be able to read a full one.
                spare.extend(batch.drain(..).map(|b| b.0).filter(|b| b.len() == CHUNK));
            }
        });
}

/// Reads and writes made by every proxy of this process (for `--timeline`).
static READS: AtomicU64 = AtomicU64::new(0);
static WRITES: AtomicU64 = AtomicU64::new(0);

/// (reads, writes) made so far by all proxies of this process.
pub fn io_counts() -> (u64, u64) {
    (
        READS.load(Ordering::Relaxed),
        WRITES.load(Ordering::Relaxed),
    )
}

/// Tells a reader waiting for room that no room will come.
fn writer_done(q: &Queue) {
    let _g = q.chunks.lock().unwrap_or_else(|e| e.into_inner());
    q.writer_gone.store(true, Ordering::Release);
    q.room.notify_all();
}

/// The most bytes queued per direction and connection (a generous socket buffer: at
/// 1 ms it allows 8 GB/s).
const MAX_QUEUED: u64 = 8 << 20;

/// The most bytes written by one batch.
const MAX_BATCH: usize = 4 << 20;

/// Writes the data parts of `chunks` (`buf[..n]` each) in order, in as few system calls
/// as the socket allows.
fn write_all_vectored(to: &mut TcpStream, chunks: &[(Vec<u8>, usize)]) -> std::io::Result<()> {
    let (mut i, mut off) = (0, 0);
    while i < chunks.len() {
        let slices: Vec<std::io::IoSlice<'_>> = chunks[i..]
            .iter()
            .enumerate()
            .map(|(k, (b, n))| std::io::IoSlice::new(&b[if k == 0 { off } else { 0 }..*n]))
            .take(64)
            .collect();
        WRITES.fetch_add(1, Ordering::Relaxed);
        let mut wrote = match to.write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(w) => w,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        while i < chunks.len() && wrote > 0 {
            let left = chunks[i].1 - off;
            if wrote >= left {
                wrote -= left;
                i += 1;
                off = 0;
            } else {
                off += wrote;
                wrote = 0;
            }
        }
    }
    Ok(())
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

    #[test]
    fn a_receiver_that_does_not_read_holds_the_sender_back() {
        // A server that accepts and never reads: without flow control through the
        // proxy, the proxy would take all 96 MiB into memory and the sender would finish.
        let sink = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = sink.local_addr().unwrap();
        let held = std::thread::spawn(move || sink.accept().map(|c| c.0));
        let p = DelayProxy::start(addr, Duration::from_millis(1), None).unwrap();
        let c = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let mut c2 = c.try_clone().unwrap();
        let w = std::thread::spawn(move || {
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..96 {
                if c2.write_all(&chunk).is_err() {
                    return;
                }
            }
            d.store(true, Ordering::Release);
        });
        std::thread::sleep(Duration::from_secs(1));
        assert!(!done.load(Ordering::Acquire), "96 MiB went into the proxy");
        // Closing everything ends the sender and the proxy's threads.
        let _ = c.shutdown(Shutdown::Both);
        drop(p);
        let _ = held.join();
        w.join().unwrap();
    }
}
