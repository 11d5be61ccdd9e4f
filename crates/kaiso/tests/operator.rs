//! The operator surface through the real binary (issue 2, item 8): the Prometheus
//! endpoint, `kaiso status --json`, `pin`/`unpin`/`where` with `-r`, and JSON log lines.
//! The control protocol itself is tested in the store crate; these tests prove the
//! commands an operator types work end to end against a mounted store.

mod common;

use common::{Store, StoreSpec, TierSpec, kaiso_bin};
use std::fs;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// `GET path` over HTTP/1.0; returns (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The address the daemon printed for its metrics endpoint ("metrics on http://A/metrics").
fn metrics_addr(m: &common::Mount) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = m.log_text();
        if let Some(rest) = log.split("metrics on http://").nth(1) {
            return rest.split('/').next().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no metrics address in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn two_tiers(tag: &str, extra: &str) -> Store {
    Store::new(
        tag,
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast").capacity(64 * MIB),
            TierSpec::new("slow").capacity(256 * MIB),
        ])
        .extra(extra),
    )
}

#[test]
fn metrics_endpoint_serves_tier_and_mover_figures() {
    fuse_or_skip!();
    let store = two_tiers("metrics", "metrics = \"127.0.0.1:0\"\n");
    store.seed(1, "cold.bin", &vec![7u8; 3 * MIB as usize]);
    let m = store.mount();
    fs::write(m.path.join("new.txt"), b"hello").unwrap();
    assert_eq!(
        fs::read(m.path.join("cold.bin")).unwrap().len(),
        3 * MIB as usize
    );
    let addr = metrics_addr(&m);
    let (status, body) = http_get(&addr, "/metrics");
    assert!(status.contains("200"), "{status}\n{body}");
    for name in [
        "kaiso_tier_used_bytes",
        "kaiso_tier_capacity_bytes",
        "kaiso_mover_moved_files_total",
        "kaiso_ops_total",
    ] {
        assert!(body.contains(name), "{name} missing from /metrics:\n{body}");
    }
    // The slow tier holds the seeded 3 MiB file: its used bytes are reported per tier.
    let slow_used = body
        .lines()
        .find(|l| l.starts_with("kaiso_tier_used_bytes") && l.contains("\"slow\""))
        .unwrap_or_else(|| panic!("no used-bytes line for tier slow:\n{body}"));
    let v: f64 = slow_used.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(v >= (3 * MIB) as f64, "{slow_used}");
    let (status, _) = http_get(&addr, "/nothing-here");
    assert!(status.contains("404"), "{status}");
    assert!(m.unmount().success());
}

#[test]
fn status_json_and_recursive_pin_unpin_where_through_the_cli() {
    fuse_or_skip!();
    let store = two_tiers("operator", "");
    for i in 0..4 {
        store.seed(1, &format!("dir/f{i}"), &vec![i as u8; 64 * 1024]);
    }
    let m = store.mount();
    let cfg = store.config.to_str().unwrap();

    let out = store.kaiso(&["status", "--json", cfg]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tiers = v["tiers"].as_array().expect("tiers array");
    let names: Vec<_> = tiers.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["fast", "slow"]);
    assert!(tiers[1]["used"].as_u64().unwrap() >= 4 * 64 * 1024, "{v}");
    for key in ["capacity", "access_share", "busy"] {
        assert!(tiers[0].get(key).is_some(), "tier has no {key}: {v}");
    }
    assert!(v["mover"].get("queued_files").is_some(), "{v}");

    // The text form names every tier too.
    let out = store.kaiso(&["status", cfg]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("fast") && text.contains("slow"),
        "{text}"
    );

    let dir = m.path.join("dir");
    let dir_s = dir.to_str().unwrap();
    let out = store.kaiso(&["pin", "-r", "--tier", "fast", dir_s]);
    assert!(
        out.status.success(),
        "pin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for i in 0..4 {
        let f = dir.join(format!("f{i}"));
        let out = store.kaiso(&["where", "--json", f.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(p["tiers"][0], "fast", "f{i} not on the pinned tier: {p}");
        assert_eq!(p["pinned"], "fast", "f{i} not pinned: {p}");
        assert_eq!(fs::read(&f).unwrap(), vec![i as u8; 64 * 1024]);
    }
    let out = store.kaiso(&["unpin", "-r", dir_s]);
    assert!(
        out.status.success(),
        "unpin: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = store.kaiso(&["where", "--json", dir.join("f0").to_str().unwrap()]);
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(p["pinned"].is_null(), "still pinned after unpin -r: {p}");
    assert!(m.unmount().success());
}

#[test]
fn log_json_writes_one_json_object_per_line() {
    fuse_or_skip!();
    let store = two_tiers("logjson", "");
    let log = store.root.join("json.log");
    let mut child = Command::new(kaiso_bin())
        .args(["--log-json", "--log", "info", "mount"])
        .arg(&store.config)
        .arg(&store.mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !common::is_mounted(&store.mountpoint) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "kaiso mount exited:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "no mount within 20 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    fs::write(store.mountpoint.join("x"), b"x").unwrap();
    assert!(common::unmount_path(&store.mountpoint));
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "daemon did not exit after unmount"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let text = fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("kaiso: "))
        .collect();
    assert!(!lines.is_empty(), "no log lines at info level:\n{text}");
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}\nwhole log:\n{text}"));
        assert!(v.get("level").is_some(), "no level in {l}");
    }
    assert!(
        lines.iter().any(|l| l.contains("\"mounted\"")),
        "no 'mounted' event:\n{text}"
    );
}
