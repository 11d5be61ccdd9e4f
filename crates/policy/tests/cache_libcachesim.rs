//! Miss counts of every shared policy against libCacheSim (PyPI `libcachesim` 0.3.5), on two
//! seeded traces generated identically here and by the Python script in docs/policies.md
//! ("Checking against libCacheSim"), which printed the table below.

use kaiso_policy::cache::{Capacity, Request, annotate_next_access, by_name};

/// (trace, policy, misses at each of the trace's cache sizes), from libcachesim 0.3.5.
const EXPECTED: &[(&str, &str, [usize; 3])] = &[
    ("unit", "fifo", [5877, 5471, 4499]),
    ("unit", "lru", [5876, 5453, 4381]),
    ("unit", "clock", [5873, 5441, 4252]),
    ("unit", "clock-2", [5873, 5440, 4164]),
    ("unit", "arc", [5843, 5213, 3718]),
    ("unit", "twoq", [5837, 5282, 3962]),
    ("unit", "lirs", [5840, 5204, 3666]),
    ("unit", "s3fifo", [5813, 5140, 3680]),
    ("unit", "sieve", [5824, 5198, 3764]),
    ("unit", "belady", [5099, 3995, 2739]),
    ("sized", "fifo", [5917, 5658, 3963]),
    ("sized", "lru", [5917, 5655, 3728]),
    ("sized", "clock", [5916, 5652, 3660]),
    ("sized", "clock-2", [5916, 5652, 3587]),
    ("sized", "arc", [5881, 5511, 3207]),
    ("sized", "twoq", [5915, 5559, 3604]),
    ("sized", "lirs", [5756, 5077, 3150]),
    ("sized", "s3fifo", [5773, 5477, 3231]),
    ("sized", "sieve", [5905, 5454, 3337]),
    ("sized", "belady", [5353, 4446, 2471]),
];

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Product-of-uniforms popularity (skewed to low ids) with periodic scans of fresh ids.
fn trace(
    seed: u64,
    n: usize,
    objects: u64,
    max_size: u64,
    scan_every: usize,
    scan_len: u64,
) -> Vec<Request> {
    let mut rng = SplitMix(seed);
    let size = |i: u64| {
        if max_size == 1 {
            1
        } else {
            1 + (i.wrapping_mul(2_654_435_761) % (1 << 32)) % max_size
        }
    };
    let mut out = Vec::with_capacity(n);
    let mut scan = 1u64 << 40;
    while out.len() < n {
        if out.len() % scan_every == scan_every - 1 {
            for _ in 0..scan_len {
                out.push(Request::new(out.len() as u64, scan, size(scan)));
                scan += 1;
            }
            continue;
        }
        let a = rng.next() % objects;
        let b = rng.next() % objects;
        let i = (u128::from(a) * u128::from(b) / u128::from(objects)) as u64;
        out.push(Request::new(out.len() as u64, i, size(i)));
    }
    out.truncate(n);
    annotate_next_access(&mut out);
    out
}

#[test]
fn miss_counts_match_libcachesim() {
    let unit = trace(7, 6000, 1500, 1, 700, 150);
    let sized = trace(11, 6000, 1500, 100, 700, 150);
    let mut report = Vec::new();
    for (name, policy, expected) in EXPECTED {
        let (reqs, caps) = match *name {
            "unit" => (&unit, [20u64, 100, 400]),
            _ => (&sized, [600u64, 3000, 30000]),
        };
        let (pname, params) = match *policy {
            "clock-2" => ("clock", "n-bit-counter=2"),
            p => (p, ""),
        };
        for (cap, want) in caps.iter().zip(expected) {
            let mut c = by_name(pname, Capacity::bytes(*cap), params).unwrap();
            let got = reqs.iter().filter(|r| !c.access(r)).count();
            if got != *want {
                report.push(format!(
                    "{name} {policy} cap {cap}: ours {got}, libCacheSim {want}"
                ));
            }
        }
    }
    assert!(
        report.is_empty(),
        "differences from libCacheSim:\n{}",
        report.join("\n")
    );
}
