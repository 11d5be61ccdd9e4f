//! Replay speed of every cache policy on a synthetic Zipf trace, one core.
//!
//! `cargo bench -p kaiso-policy --bench cache_throughput [-- REQUESTS OBJECTS CACHE ALPHA]`
//! (defaults: 10,000,000 requests over 1,000,000 objects, a 100,000-object cache,
//! Zipf 0.8 — the shape of the libCacheSim measurement in shared/anchors/nvm-and-sim.md),
//! or `… -- --og FILE CACHE` to replay an uncompressed libCacheSim oracleGeneral file
//! (24-byte records: u32 time, u64 id, u32 size, i64 next access) with the cache counted
//! in objects. Only the replay loop is timed; the trace is read into memory first.
//! Prints Mreq/s (wall clock) and Mreq per CPU-second of the replaying thread (robust when
//! other processes compete for the core), the miss ratio per policy, and each policy's
//! wall-clock speed relative to LRU measured in the same run.

use std::time::Instant;

use kaiso_policy::cache::{Capacity, POLICY_NAMES, Request, annotate_next_access, by_name};

/// SplitMix64, so the trace is reproducible without dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn zipf_trace(n: usize, objects: usize, alpha: f64, seed: u64) -> Vec<Request> {
    let mut cdf = Vec::with_capacity(objects);
    let mut sum = 0.0;
    for k in 1..=objects {
        sum += 1.0 / (k as f64).powf(alpha);
        cdf.push(sum);
    }
    let mut rng = Rng(seed);
    // Scatter ranks over the id space so hashing sees realistic ids.
    let mut reqs: Vec<Request> = (0..n)
        .map(|i| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * sum;
            let rank = cdf.partition_point(|&c| c < u) as u64;
            Request::new(
                i as u64,
                rank.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8,
                4096,
            )
        })
        .collect();
    annotate_next_access(&mut reqs);
    reqs
}

fn read_oracle_general(path: &str) -> Vec<Request> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    bytes
        .chunks_exact(24)
        .map(|r| {
            let time = u64::from(u32::from_le_bytes(r[0..4].try_into().unwrap()));
            let id = u64::from_le_bytes(r[4..12].try_into().unwrap());
            let size = u64::from(u32::from_le_bytes(r[12..16].try_into().unwrap()));
            let next = i64::from_le_bytes(r[16..24].try_into().unwrap());
            let mut req = Request::new(time, id, size);
            req.next_access = if next < 0 { u64::MAX } else { next as u64 };
            req
        })
        .collect()
}

fn main() {
    let all: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = all.iter().position(|a| a == "--og") {
        let path = all.get(i + 1).expect("--og FILE CACHE");
        let cache = all
            .get(i + 2)
            .and_then(|s| s.parse().ok())
            .unwrap_or(100_000u64);
        let reqs = read_oracle_general(path);
        println!(
            "{path}: {} requests, cache = {cache} objects, one core",
            reqs.len()
        );
        run(&reqs, cache);
        return;
    }
    let args: Vec<String> = all.into_iter().filter(|a| !a.starts_with("--")).collect();
    let arg = |i: usize, d: f64| args.get(i).and_then(|s| s.parse::<f64>().ok()).unwrap_or(d);
    let n = arg(0, 10_000_000.0) as usize;
    let objects = arg(1, 1_000_000.0) as usize;
    let cache = arg(2, 100_000.0) as u64;
    let alpha = arg(3, 0.8);
    eprintln!("generating {n} requests over {objects} objects (Zipf {alpha}) …");
    let reqs = zipf_trace(n, objects, alpha, 42);
    println!("cache = {cache} objects, {n} requests, Zipf {alpha}, one core");
    run(&reqs, cache);
}

/// CPU time this thread has run (ns), from `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`, so the
/// rate is not skewed by other processes competing for the core. None elsewhere.
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        tv_sec: i64,
        tv_nsec: i64,
    }
    unsafe extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid, writable timespec (64-bit Linux); 3 is CLOCK_THREAD_CPUTIME_ID.
    let rc = unsafe { clock_gettime(3, &mut t) };
    (rc == 0).then(|| t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

fn run(reqs: &[Request], cache: u64) {
    let n = reqs.len();
    println!(
        "{:<10} {:>9} {:>11} {:>11} {:>9}",
        "policy", "Mreq/s", "Mreq/cpu-s", "miss ratio", "vs LRU"
    );
    let mut lru_rate = None;
    let mut order: Vec<&str> = vec!["lru"];
    order.extend(POLICY_NAMES.iter().copied().filter(|p| *p != "lru"));
    for name in order {
        let mut c = by_name(name, Capacity::objects(cache), "").expect("known policy");
        let cpu0 = thread_cpu_ns();
        let start = Instant::now();
        let mut misses = 0u64;
        for r in reqs {
            misses += u64::from(!c.access(r));
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = match (cpu0, thread_cpu_ns()) {
            (Some(a), Some(b)) if b > a => {
                format!("{:.2}", n as f64 / ((b - a) as f64 / 1e9) / 1e6)
            }
            _ => "n/a".to_string(),
        };
        let rate = n as f64 / secs / 1e6;
        let base = *lru_rate.get_or_insert(rate);
        println!(
            "{:<10} {:>9.2} {:>11} {:>11.4} {:>8.2}x",
            name,
            rate,
            cpu,
            misses as f64 / n as f64,
            rate / base
        );
    }
}
