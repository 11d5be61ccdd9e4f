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
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]);
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
