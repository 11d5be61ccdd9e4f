//! Shared test helpers: seeded request streams and the invariants every policy must keep.

use super::rng::SplitMix64;
use super::{CachePolicy, Capacity, Request, annotate_next_access};

/// Runs unit-size reads of `ids` and returns one letter per request: `h` hit, `m` miss.
pub fn run_ids(cache: &mut dyn CachePolicy, ids: &[u64]) -> String {
    ids.iter()
        .map(|&id| {
            if cache.access(&Request::new(0, id, 1)) {
                'h'
            } else {
                'm'
            }
        })
        .collect()
}

/// A Zipf(alpha) sampler over `0..n` by inverse CDF.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, alpha: f64) -> Self {
        let mut cdf = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += 1.0 / (k as f64).powf(alpha);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        let u = rng.unit();
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1) as u64
    }
}

/// Stream shapes the property tests draw from.
#[derive(Clone, Copy, Debug)]
pub enum Shape {
    Uniform {
        objects: u64,
    },
    Zipf {
        objects: usize,
        alpha: f64,
    },
    /// Zipf with a sequential scan of fresh ids every `every` requests.
    ZipfScan {
        objects: usize,
        alpha: f64,
        every: usize,
        scan_len: u64,
    },
}

/// `n` requests of the given shape; sizes in 1..=max_size (a fixed size per object).
pub fn stream(seed: u64, n: usize, shape: Shape, max_size: u64) -> Vec<Request> {
    let mut rng = SplitMix64::new(seed);
    let zipf = match shape {
        Shape::Zipf { objects, alpha } | Shape::ZipfScan { objects, alpha, .. } => {
            Some(Zipf::new(objects, alpha))
        }
        Shape::Uniform { .. } => None,
    };
    let size_of = |id: u64| 1 + (id.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) % max_size;
    let mut out = Vec::with_capacity(n);
    let mut scan_next = 1u64 << 40;
    while out.len() < n {
        if let Shape::ZipfScan {
            every, scan_len, ..
        } = shape
            && out.len() % every == every - 1
        {
            for _ in 0..scan_len {
                out.push(Request::new(
                    out.len() as u64,
                    scan_next,
                    size_of(scan_next),
                ));
                scan_next += 1;
            }
            continue;
        }
        let id = match (&zipf, shape) {
            (Some(z), _) => z.sample(&mut rng),
            (None, Shape::Uniform { objects }) => rng.below(objects),
            _ => unreachable!(),
        };
        out.push(Request::new(out.len() as u64, id, size_of(id)));
    }
    out.truncate(n);
    annotate_next_access(&mut out);
    out
}

/// The streams `check_invariants` replays: every shape, unit and variable sizes.
pub fn standard_streams(seed: u64) -> Vec<(Vec<Request>, bool)> {
    let shapes = [
        Shape::Uniform { objects: 200 },
        Shape::Zipf {
            objects: 500,
            alpha: 0.9,
        },
        Shape::ZipfScan {
            objects: 300,
            alpha: 1.0,
            every: 400,
            scan_len: 120,
        },
    ];
    let mut out = Vec::new();
    for (k, shape) in shapes.into_iter().enumerate() {
        out.push((stream(seed + k as u64, 4000, shape, 1), true));
        out.push((stream(seed + 10 + k as u64, 4000, shape, 64), false));
    }
    out
}

/// Replays `reqs` and returns the hit/miss vector, checking on every request that the
/// answer matches `contains` just before, and that capacity is never exceeded.
pub fn replay_checked(cache: &mut dyn CachePolicy, reqs: &[Request]) -> Vec<bool> {
    replay_checked_with(cache, reqs, true)
}

/// As [`replay_checked`]; `strict` also checks that occupancy changes only by admissions
/// and logged evictions (libCacheSim's LIRS can re-count an object on a hit, see lirs.rs).
pub fn replay_checked_with(
    cache: &mut dyn CachePolicy,
    reqs: &[Request],
    strict: bool,
) -> Vec<bool> {
    let cap = cache.capacity();
    cache.set_eviction_log(true);
    let mut evictions = Vec::new();
    let mut out = Vec::with_capacity(reqs.len());
    for (n, r) in reqs.iter().enumerate() {
        let before = cache.contains(r.id);
        let used_before = cache.used();
        let hit = cache.access(r);
        assert_eq!(
            hit,
            before,
            "{}: request {n} hit={hit} but contains={before}",
            cache.name()
        );
        assert!(
            cache.used() <= cap.limit,
            "{}: used {} > capacity {} after request {n}",
            cache.name(),
            cache.used(),
            cap.limit
        );
        if hit {
            assert!(
                cache.contains(r.id),
                "{}: hit object vanished",
                cache.name()
            );
        }
        evictions.clear();
        cache.drain_evictions(&mut evictions);
        let freed: u64 = evictions.iter().map(|e| e.size).sum();
        let added = if !hit && cache.contains(r.id) {
            cap.charge(r.size)
        } else {
            0
        };
        assert!(
            !strict || used_before + added == cache.used() + freed,
            "{}: occupancy bookkeeping broke at request {n}: {used_before} + {added} != {} + {freed}",
            cache.name(),
            cache.used()
        );
        for e in &evictions {
            assert!(
                e.id == r.id || !cache.contains(e.id),
                "{}: evicted {} still cached",
                cache.name(),
                e.id
            );
        }
        out.push(hit);
    }
    assert!(cache.len() as u64 <= reqs.len() as u64);
    out
}

/// Capacity, hit-iff-contained, bookkeeping and determinism on the standard streams,
/// at byte and object capacities, small and large.
pub fn check_invariants(make: impl Fn(Capacity) -> Box<dyn CachePolicy>) {
    check_invariants_with(make, true)
}

/// As [`check_invariants`], with the occupancy bookkeeping check optional.
pub fn check_invariants_with(make: impl Fn(Capacity) -> Box<dyn CachePolicy>, strict: bool) {
    for (reqs, unit) in standard_streams(42) {
        let caps: Vec<Capacity> = if unit {
            vec![
                Capacity::objects(1),
                Capacity::objects(7),
                Capacity::objects(60),
                Capacity::bytes(60),
            ]
        } else {
            vec![
                Capacity::bytes(1),
                Capacity::bytes(100),
                Capacity::bytes(3000),
                Capacity::objects(40),
            ]
        };
        for cap in caps {
            let first = replay_checked_with(make(cap).as_mut(), &reqs, strict);
            let second = replay_checked_with(make(cap).as_mut(), &reqs, strict);
            assert_eq!(first, second, "not deterministic at {cap}");
            // Removing everything leaves an empty cache.
            let mut c = make(cap);
            for r in &reqs[..500] {
                c.access(r);
            }
            for r in &reqs[..500] {
                c.remove(r.id);
            }
            assert!(c.is_empty(), "{} not empty after removing all", c.name());
            assert_eq!(c.used(), 0);
        }
    }
}

/// Number of misses of `reqs` through a fresh cache.
pub fn misses(mut cache: Box<dyn CachePolicy>, reqs: &[Request]) -> usize {
    reqs.iter().filter(|r| !cache.access(r)).count()
}
