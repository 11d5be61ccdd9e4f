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

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs kaiso with arguments that need not be UTF-8.
fn kaiso_os(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(kaiso_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kaiso")
}

/// The JSON `where` of a path: (tier, exact backing path bytes).
fn where_json(p: &std::path::Path) -> (String, Vec<u8>, serde_json::Value) {
    let out = kaiso_os(&["where".as_ref(), "--json".as_ref(), p.as_os_str()]);
    assert!(out.status.success(), "where: {}", stderr_of(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", out.stdout));
    let bytes = match v.get("backing_path_bytes") {
        Some(b) => b
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u8)
            .collect(),
        None => v["backing_path"].as_str().unwrap().as_bytes().to_vec(),
    };
    (v["tiers"][0].as_str().unwrap().to_string(), bytes, v)
}

/// Names that are not UTF-8 (here Latin-1 bytes) are served by the mount, so every
/// operator command must take them: where, explain, pin, unpin, promote, demote (-r),
/// through the mount path and with --config; JSON output stays valid.
#[test]
fn operator_commands_take_names_that_are_not_utf8() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    fuse_or_skip!();
    let store = two_tiers("latin1", "");
    let dir = OsStr::from_bytes(b"caf\xe9");
    let rel = std::path::Path::new(dir).join(OsStr::from_bytes(b"n\xe9e-\xff"));
    let data = vec![0xa5u8; 100_000];
    fs::create_dir_all(store.tiers[1].join(dir)).unwrap();
    fs::write(store.tiers[1].join(&rel), &data).unwrap();
    let m = store.mount();
    let p = m.path.join(&rel);
    let on_tier = |t: usize| {
        fs::canonicalize(&store.tiers[t])
            .unwrap()
            .join(&rel)
            .as_os_str()
            .as_bytes()
            .to_vec()
    };

    let (tier, backing, v) = where_json(&p);
    assert_eq!(tier, "slow", "{v}");
    assert_eq!(backing, on_tier(1), "{v}");
    assert!(
        v["backing_path"].as_str().unwrap().contains('\u{fffd}'),
        "{v}"
    );
    // Text output prints the path's bytes as they are.
    let out = kaiso_os(&["where".as_ref(), p.as_os_str()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        out.stdout.windows(backing.len()).any(|w| w == backing),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = kaiso_os(&["explain".as_ref(), p.as_os_str()]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("rule:"));
    let out = kaiso_os(&["explain".as_ref(), "--json".as_ref(), p.as_os_str()]);
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(e["placement"]["tiers"][0], "slow", "{e}");

    let out = kaiso_os(&["promote".as_ref(), p.as_os_str()]);
    assert!(out.status.success(), "promote: {}", stderr_of(&out));
    // Not on a terminal: progress comes as plain lines, the last one saying done.
    let progress = stderr_of(&out);
    assert!(
        progress.contains("promoting 1/1 files, 97.7 KiB/97.7 KiB") && progress.contains(", done"),
        "{progress}"
    );
    assert_eq!(where_json(&p).0, "fast");
    let out = kaiso_os(&[
        "demote".as_ref(),
        "-r".as_ref(),
        m.path.join(dir).as_os_str(),
    ]);
    assert!(out.status.success(), "demote -r: {}", stderr_of(&out));
    assert_eq!(where_json(&p).0, "slow");
    let out = kaiso_os(&[
        "pin".as_ref(),
        "--tier".as_ref(),
        "fast".as_ref(),
        p.as_os_str(),
    ]);
    assert!(out.status.success(), "pin: {}", stderr_of(&out));
    let (tier, backing, v) = where_json(&p);
    assert_eq!(
        (tier.as_str(), &v["pinned"]),
        ("fast", &serde_json::json!("fast"))
    );
    assert_eq!(backing, on_tier(0));
    let out = kaiso_os(&["unpin".as_ref(), p.as_os_str()]);
    assert!(out.status.success(), "unpin: {}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("unpinned 1 files"));
    // A store-relative path with --config reaches the same daemon.
    let out = kaiso_os(&[
        "demote".as_ref(),
        "--config".as_ref(),
        store.config.as_os_str(),
        rel.as_os_str(),
    ]);
    assert!(out.status.success(), "demote --config: {}", stderr_of(&out));
    assert_eq!(where_json(&p).0, "slow");
    assert_eq!(fs::read(&p).unwrap(), data);
    assert!(m.unmount().success());
    assert_eq!(fs::read(store.tiers[1].join(&rel)).unwrap(), data);
}

/// Operator mistakes get one line naming the path and what is wrong, never a bare errno
/// (audit2 #14a); `where` of a hard link shows the name asked for (#29).
#[test]
fn operator_errors_name_what_failed() {
    fuse_or_skip!();
    let store = two_tiers("operr", "");
    store.seed(0, "f", b"data");
    store.seed(1, "d/g", b"more");
    let m = store.mount();
    let f = m.path.join("f");
    let d = m.path.join("d");
    let missing = m.path.join("nonexist");
    let (f, d, missing) = (
        f.to_str().unwrap(),
        d.to_str().unwrap(),
        missing.to_str().unwrap(),
    );
    let cases: [(&[&str], &[&str]); 7] = [
        (
            &["promote", f, "--tier", "bogus"],
            &[f, "unknown tier \"bogus\"", "(tiers: fast, slow)"],
        ),
        (
            &["pin", f, "--tier", "bogus"],
            &[f, "unknown tier \"bogus\"", "(tiers: fast, slow)"],
        ),
        (&["demote", d], &[d, "is a directory", "-r"]),
        (&["pin", d], &[d, "is a directory", "-r"]),
        (
            &["where", missing],
            &[missing, "no such file or directory in the store"],
        ),
        (
            &["unpin", missing],
            &[missing, "no such file or directory in the store"],
        ),
        (
            &["explain", missing],
            &[missing, "no such file or directory in the store"],
        ),
    ];
    for (args, want) in cases {
        let out = store.kaiso(args);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(
            !err.contains("os error") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
        for w in want {
            assert!(err.contains(w), "{args:?}: {w:?} missing in {err}");
        }
    }
    // The rejected requests changed nothing.
    assert_eq!(where_json(std::path::Path::new(f)).0, "fast");

    fs::hard_link(m.path.join("d/g"), m.path.join("g-link")).unwrap();
    let (_, backing, v) = where_json(&m.path.join("g-link"));
    assert!(backing.ends_with(b"/g-link"), "{v}");
    let out = store.kaiso(&["explain", m.path.join("d/g").to_str().unwrap()]);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("/d/g, 4 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // `status --config CONFIG` works like `status CONFIG`.
    let out = store.kaiso(&[
        "status",
        "--config",
        store.config.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(m.unmount().success());
}

/// Tier directories that overlap (the same directory twice, one inside another, the
/// state directory inside a tier) are refused when the configuration is loaded, in one
/// line naming both keys and their lines (audit2 #13).
#[test]
fn overlapping_tier_paths_are_refused_at_load() {
    let root = common::temp_dir("overlap");
    let cfg = root.join("k.toml");
    let d = |p: &str| root.join(p).display().to_string();
    let cases = [
        (
            d("st"),
            d("t0"),
            d("t0"),
            "tier[1].path",
            "same directory as tier[0].path",
        ),
        (
            d("st"),
            d("t0"),
            d("t0/fast"),
            "tier[1].path",
            "is inside tier[0].path",
        ),
        (
            d("t1/st"),
            d("t0"),
            d("t1"),
            "store.state_dir",
            "is inside tier[1].path",
        ),
    ];
    for (state, a, b, key, what) in cases {
        fs::write(
            &cfg,
            format!(
                "[store]\nstate_dir = {state:?}\n\n[[tier]]\nname = \"fast\"\npath = {a:?}\ncapacity = 1000\n\n[[tier]]\nname = \"slow\"\npath = {b:?}\ncapacity = 1000\n"
            ),
        )
        .unwrap();
        let out = common::run_kaiso(&["fsck", cfg.to_str().unwrap()]);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(key) && err.contains(what), "{err}");
        let line_a = if key == "store.state_dir" {
            "line 2"
        } else {
            "line 11"
        };
        assert!(err.contains(line_a) && err.contains("(line "), "{err}");
        assert!(
            !root.join("st").exists() && !root.join("t1/st").exists(),
            "{err}"
        );
    }
    let _ = fs::remove_dir_all(&root);
}

/// Session 9: a tier whose directory vanished is shown offline by `kaiso status` (text and
/// JSON: since when, how many files it held) and by the `kaiso_tier_online` gauge, and
/// online again once the directory is back.
#[test]
fn status_and_metrics_show_an_offline_tier() {
    fuse_or_skip!();
    let store = two_tiers("offline-status", "metrics = \"127.0.0.1:0\"\n");
    for i in 0..3 {
        store.seed(1, &format!("cold{i}"), b"cold");
    }
    store.seed(0, "hot", b"hot");
    let m = store.mount();
    let addr = metrics_addr(&m);
    let cfg = store.config.to_str().unwrap();
    let online_gauge = |body: &str, tier: &str| -> String {
        body.lines()
            .find(|l| l.starts_with("kaiso_tier_online{") && l.contains(&format!("\"{tier}\"")))
            .unwrap_or_else(|| panic!("no kaiso_tier_online line for {tier}:\n{body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
    };
    let (_, body) = http_get(&addr, "/metrics");
    assert_eq!(online_gauge(&body, "slow"), "1", "{body}");

    let gone = store.root.join("slow-gone");
    fs::rename(&store.tiers[1], &gone).unwrap();
    let before_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // The store samples tier roots every 100 ms: wait for it to see the tier gone (a
    // loaded machine may delay the sampler; 20 s is far beyond it, not a fixed sleep).
    // The tier goes offline and its files are recorded unreachable in one step (since
    // session 16): every status shows either online with none, or offline with all 3.
    let t0 = Instant::now();
    let v = loop {
        let out = store.kaiso(&["status", "--json", cfg]);
        assert!(out.status.success(), "{}", stderr_of(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let slow = &v["tiers"][1];
        if slow["online"] == false {
            break v;
        }
        assert_eq!(
            slow["unreachable_files"], 0,
            "online with unreachable files: {v}"
        );
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "expected tier slow offline within 20 s of its directory being renamed away; \
             last status: {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let slow = &v["tiers"][1];
    assert_eq!(slow["name"], "slow", "{v}");
    assert_eq!(
        slow["unreachable_files"], 3,
        "the first status showing tier slow offline must count its 3 files unreachable: {v}"
    );
    let since = slow["offline_since_unix"]
        .as_u64()
        .expect("offline_since_unix");
    let seen_secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(since + 2 >= before_secs && since <= seen_secs + 1, "{v}");
    assert!(slow["offline_for_secs"].as_u64().is_some(), "{v}");
    assert_eq!(v["tiers"][0]["online"], true, "{v}");
    assert_eq!(v["tiers"][0]["unreachable_files"], 0, "{v}");

    let out = store.kaiso(&["status", cfg]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let line = text
        .lines()
        .find(|l| l.contains("OFFLINE"))
        .unwrap_or_else(|| panic!("no OFFLINE line:\n{text}"));
    assert!(
        line.contains("tier slow")
            && line.contains(" since ")
            && line.contains("3 files unreachable")
            && line.contains(store.tiers[1].to_str().unwrap()),
        "{line}"
    );
    let (_, body) = http_get(&addr, "/metrics");
    assert_eq!(online_gauge(&body, "slow"), "0", "{body}");
    assert_eq!(online_gauge(&body, "fast"), "1", "{body}");
    assert!(
        body.contains("kaiso_tier_unreachable_files{tier=\"slow\"} 3"),
        "{body}"
    );

    // Back: online, nothing unreachable, no OFFLINE line. Until then every status shows
    // the tier offline with its 3 files unreachable (the walk that puts them back ends
    // before the tier is shown online).
    fs::rename(&gone, &store.tiers[1]).unwrap();
    let t0 = Instant::now();
    loop {
        let out = store.kaiso(&["status", "--json", cfg]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["tiers"][1]["online"] == true {
            assert_eq!(v["tiers"][1]["unreachable_files"], 0, "{v}");
            assert!(v["tiers"][1]["offline_since_unix"].is_null(), "{v}");
            break;
        }
        assert_eq!(v["tiers"][1]["unreachable_files"], 3, "offline: {v}");
        assert!(t0.elapsed() < Duration::from_secs(20), "still offline: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = String::from_utf8_lossy(&store.kaiso(&["status", cfg]).stdout).into_owned();
    assert!(!text.contains("OFFLINE"), "{text}");
    // Shown online: its files are back (read once, not retried).
    let cold2 = fs::read(m.path.join("cold2"));
    assert_eq!(
        cold2.as_deref().ok(),
        Some(b"cold".as_slice()),
        "cold2 read once right after the slow tier is shown online again: {cold2:?}"
    );
    assert!(m.unmount().success());
}
