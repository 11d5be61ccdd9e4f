//! Replay speed and miss ratio of our baselines vs libCacheSim on one generated trace,
//! without the full `kaiso` binary (`kaiso bench sim` is the complete benchmark):
//! `cargo run --release -p kaiso-sim --example bench -- [REQUESTS]`

use kaiso_sim::validate::{self, SHARED_POLICIES};

fn main() {
    let requests: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    if let Err(e) = validate::ensure_peer("python3") {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let dir = std::env::temp_dir().join(format!("kaiso-sim-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let traces = validate::write_traces(&dir, requests, 1).expect("traces");
    let t = &traces[0]; // Zipf(0.8)
    let objects = [(t.footprint / 100).max(1)];
    let res =
        validate::compare("python3", t, SHARED_POLICIES, &objects, 3, |_| {}).expect("peer run");
    println!(
        "{} ({} requests, cache {} objects)",
        t.name, t.requests, objects[0]
    );
    println!(
        "| policy | miss ratio ours | libCacheSim | ours Mreq/s | libCacheSim Mreq/s | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    for c in res {
        println!(
            "| {} | {:.4} | {:.4} | {:.2} | {:.2} | {:.2}× |",
            c.policy,
            c.ours,
            c.peer,
            c.ours_mreq_s,
            c.peer_mreq_s,
            c.ours_mreq_s / c.peer_mreq_s
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
