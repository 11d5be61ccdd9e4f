//! Opt-in Prometheus metrics: a tiny HTTP endpoint serving the text exposition format.

use crate::Store;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The metrics in Prometheus text format.
pub fn render(store: &Store) -> String {
    let s = store.status();
    let mut o = String::new();
    let mut metric = |name: &str, help: &str, kind: &str, rows: Vec<(String, f64)>| {
        o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (labels, v) in rows {
            o.push_str(&format!("{name}{labels} {v}\n"));
        }
    };
    let unlabelled = |v: f64| vec![(String::new(), v)];
    let per_tier = |f: &dyn Fn(&crate::TierStatus) -> f64| -> Vec<(String, f64)> {
        s.tiers
            .iter()
            .map(|t| (format!("{{tier=\"{}\"}}", t.name), f(t)))
            .collect()
    };
    metric(
        "kaiso_tier_used_bytes",
        "Bytes of file data on the tier",
        "gauge",
        per_tier(&|t| t.used as f64),
    );
    metric(
        "kaiso_tier_capacity_bytes",
        "Hard capacity of the tier",
        "gauge",
        per_tier(&|t| t.capacity as f64),
    );
    metric(
        "kaiso_tier_accesses_total",
        "Read and write requests served by the tier",
        "counter",
        per_tier(&|t| t.accesses as f64),
    );
    metric(
        "kaiso_tier_busy_ratio",
        "Foreground utilisation of the tier's (emulated) device",
        "gauge",
        per_tier(&|t| t.busy),
    );
    let health = store.tier_health();
    let per_tier_health = |f: &dyn Fn(&crate::operator::TierHealth) -> f64| -> Vec<(String, f64)> {
        health
            .iter()
            .map(|h| (format!("{{tier=\"{}\"}}", h.name), f(h)))
            .collect()
    };
    metric(
        "kaiso_tier_online",
        "1 while the tier's directory is there, 0 while it is missing (offline)",
        "gauge",
        per_tier_health(&|h| if h.online { 1.0 } else { 0.0 }),
    );
    metric(
        "kaiso_tier_unreachable_files",
        "Files of an offline tier, unreachable until its directory returns",
        "gauge",
        per_tier_health(&|h| h.unreachable_files as f64),
    );
    metric(
        "kaiso_mover_moved_files_total",
        "Files moved",
        "counter",
        unlabelled(s.mover.moved_files as f64),
    );
    metric(
        "kaiso_mover_moved_bytes_total",
        "Bytes moved",
        "counter",
        unlabelled(s.mover.moved_bytes as f64),
    );
    metric(
        "kaiso_mover_failed_total",
        "Planned moves not carried out",
        "counter",
        unlabelled(s.mover.failed_moves as f64),
    );
    metric(
        "kaiso_mover_queued_files",
        "Moves waiting in the current plan",
        "gauge",
        unlabelled(s.mover.queued_files as f64),
    );
    metric(
        "kaiso_mover_rate_bytes",
        "Mover throughput over the last interval, bytes/s",
        "gauge",
        unlabelled(s.mover.rate),
    );
    metric(
        "kaiso_ops_total",
        "File operations served",
        "counter",
        unlabelled(store.ops.load(Ordering::Relaxed) as f64),
    );
    metric(
        "kaiso_files",
        "Files in the namespace",
        "gauge",
        unlabelled(s.files as f64),
    );
    o
}

/// Serve `GET /metrics` on `addr` in a background thread.
/// Reads an HTTP request head (up to the blank line, at most 8 KiB): a client may send
/// it in several TCP segments, and answering after the first would cut its request off.
fn read_request_head(c: &mut impl Read) -> Vec<u8> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while head.len() < 8192 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    head
}

pub fn serve(store: Arc<Store>, addr: &str) -> std::io::Result<std::net::SocketAddr> {
    let l = TcpListener::bind(addr)?;
    let local = l.local_addr()?;
    std::thread::Builder::new().name("kaiso-metrics".into()).spawn(move || {
        for conn in l.incoming() {
            if store.stopping() {
                break;
            }
            let Ok(mut c) = conn else { continue };
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let req = read_request_head(&mut c);
            let req = String::from_utf8_lossy(&req);
            let (status, body) = if req.starts_with("GET /metrics") || req.starts_with("GET / ") {
                ("200 OK", render(&store))
            } else {
                ("404 Not Found", "not found\n".to_string())
            };
            let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        }
    })?;
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::read_request_head;
    use std::io::Read;

    /// A reader handing out its bytes a few at a time, as TCP segments may arrive.
    struct Trickle(Vec<u8>, usize);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.len().min(3).min(buf.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0.drain(..n);
            self.1 += 1;
            Ok(n)
        }
    }

    #[test]
    fn a_request_head_in_pieces_is_read_whole() {
        let mut r = Trickle(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n".to_vec(), 0);
        let head = read_request_head(&mut r);
        assert!(head.starts_with(b"GET /metrics HTTP/1.0"));
        assert!(head.ends_with(b"\r\n\r\n"));
        assert!(r.1 > 1, "should have taken several reads");
    }

    #[test]
    fn a_head_without_end_is_bounded() {
        let mut r = std::io::repeat(b'a');
        assert!(read_request_head(&mut r).len() <= 8192 + 1024);
    }
}
