//! Sequential throughput of the NFS face against `cp` on the backing directory, in one run.
//!
//! `cargo run --release -p kaiso-nfs --example nfs_throughput -- [SIZE_MIB] [ROUNDS]`
//! Starts a two-tier store in a temp directory (under $TMPDIR), serves it on 127.0.0.1,
//! and times: nfs-cp local→NFS (write), nfs-cp NFS→local (read), and `cp` of the same file
//! into and out of the fastest tier's directory (the baseline). Needs libnfs-utils.

use kaiso_nfs::{NfsServer, ServeOptions};
use kaiso_store::{Store, StoreConfig};
use std::process::Command;
use std::time::Instant;

fn timed(args: &[&str]) -> f64 {
    let t0 = Instant::now();
    let st = Command::new(args[0])
        .args(&args[1..])
        .status()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", args[0]));
    assert!(st.success(), "{args:?} failed");
    t0.elapsed().as_secs_f64()
}

fn drop_caches() {
    // Best effort (root only): cold page cache for the reads on both paths.
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

fn main() {
    let mut a = std::env::args().skip(1);
    let mib: u64 = a.next().and_then(|s| s.parse().ok()).unwrap_or(512);
    let rounds: usize = a.next().and_then(|s| s.parse().ok()).unwrap_or(3);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for t in ["t0", "t1", "local"] {
        std::fs::create_dir(root.join(t)).unwrap();
    }
    let cfg = format!(
        "[store]\nstate_dir = \"{s}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{t0}\"\ncapacity = \"{c}MiB\"\n[[tier]]\nname = \"t1\"\npath = \"{t1}\"\ncapacity = \"{c}MiB\"\n",
        s = root.join("state").display(),
        t0 = root.join("t0").display(),
        t1 = root.join("t1").display(),
        c = mib * 4 + 64
    );
    let store = Store::open(StoreConfig::from_toml_str(&cfg, "bench.toml").unwrap()).unwrap();
    let server = NfsServer::start(store.clone(), ServeOptions::loopback(0)).unwrap();
    let port = server.local_addr().port();
    let url =
        |p: &str| format!("nfs://127.0.0.1/export/{p}?nfsport={port}&mountport={port}&version=3");

    let src = root.join("local/src.bin");
    let data: Vec<u8> = (0..mib * 1024 * 1024)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    drop(data);
    let s = src.to_str().unwrap();
    let (mut nw, mut nr, mut cw, mut cr) = (0.0, 0.0, 0.0, 0.0);
    for r in 0..rounds {
        let name = format!("f{r}.bin");
        let back = root.join(format!("local/back{r}.bin"));
        let tier_file = root.join("t0").join(format!("c{r}.bin"));
        let tier_back = root.join(format!("local/cback{r}.bin"));
        nw += timed(&["nfs-cp", s, &url(&name)]);
        drop_caches();
        nr += timed(&["nfs-cp", &url(&name), back.to_str().unwrap()]);
        cw += timed(&["cp", s, tier_file.to_str().unwrap()]);
        let _ = Command::new("sync")
            .arg(tier_file.to_str().unwrap())
            .status();
        drop_caches();
        cr += timed(&[
            "cp",
            tier_file.to_str().unwrap(),
            tier_back.to_str().unwrap(),
        ]);
        assert_eq!(std::fs::metadata(&back).unwrap().len(), mib * 1024 * 1024);
        for p in [&back, &tier_back] {
            let _ = std::fs::remove_file(p);
        }
    }
    let rate = |t: f64| (mib * rounds as u64) as f64 / t;
    println!("file {mib} MiB x {rounds} rounds, loopback, 1 MiB RPCs");
    println!(
        "write: nfs-cp {:8.1} MiB/s   cp to tier dir {:8.1} MiB/s   ratio {:.2}",
        rate(nw),
        rate(cw),
        rate(nw) / rate(cw)
    );
    println!(
        "read:  nfs-cp {:8.1} MiB/s   cp from tier dir {:8.1} MiB/s   ratio {:.2}",
        rate(nr),
        rate(cr),
        rate(nr) / rate(cr)
    );
    println!("jukebox replies: {}", server.jukebox_replies());
    server.stop();
    store.shutdown();
}
