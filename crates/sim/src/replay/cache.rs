//! Cache mode: replay requests through one `kaiso_policy::cache::CachePolicy` and count
//! hits, as libCacheSim's `cachesim` does (a miss admits the object).

use crate::trace::{IoRecord, NEVER};
use kaiso_policy::Op;
use kaiso_policy::cache::{
    CachePlacement, CachePolicy, Request, annotate_next_access, placement_by_name,
};
use serde::Serialize;
use std::time::Instant;

/// How trace records become cache objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Granularity {
    /// One object per record's `object` (file id, oracleGeneral id), size = record length.
    Object,
    /// One object per (object, offset) request, size = length: libCacheSim's MSR
    /// conversion (obj_id = byte offset), so results are comparable with its traces.
    Request,
    /// Fixed blocks of this many bytes: a record touching k blocks is k requests.
    Block(u64),
}

impl Granularity {
    /// `object`, `request`, or a block size such as `4k`, `1m`, `4096`.
    pub fn parse(s: &str) -> Option<Granularity> {
        match s {
            "object" => Some(Granularity::Object),
            "request" => Some(Granularity::Request),
            _ => parse_size(s).filter(|&b| b > 0).map(Granularity::Block),
        }
    }
}

/// `4096`, `4k`, `1m`, `2g` (binary multiples), `1.5g`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim().to_ascii_lowercase();
    let (num, mul) = match s.strip_suffix(['k', 'm', 'g', 't']) {
        Some(n) => (
            n,
            match s.as_bytes()[s.len() - 1] {
                b'k' => 1u64 << 10,
                b'm' => 1 << 20,
                b'g' => 1 << 30,
                _ => 1 << 40,
            },
        ),
        None => (s.strip_suffix('b').unwrap_or(&s), 1),
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * mul as f64) as u64)
}

/// Turn one record into cache requests.
#[inline]
pub fn split(r: &IoRecord, g: Granularity, mut emit: impl FnMut(Request)) {
    let op = if r.op == Op::Delete { Op::Delete } else { r.op };
    match g {
        Granularity::Object => emit(Request {
            time: r.time,
            id: r.object,
            size: r.len.max(1),
            op,
            next_access: r.next_access,
        }),
        Granularity::Request => emit(Request {
            time: r.time,
            id: r.object.rotate_left(48) ^ r.offset,
            size: r.len.max(1),
            op,
            next_access: NEVER,
        }),
        Granularity::Block(bs) => {
            let first = r.offset / bs;
            let last = (r.offset + r.len.max(1) - 1) / bs;
            for b in first..=last {
                emit(Request {
                    time: r.time,
                    id: (r.object << 44) ^ b,
                    size: bs,
                    op,
                    next_access: NEVER,
                });
            }
        }
    }
}

/// Materialise records as requests with `next_access` filled (needed by Belady).
pub fn to_requests(records: impl IntoIterator<Item = IoRecord>, g: Granularity) -> Vec<Request> {
    let mut out = Vec::new();
    for r in records {
        split(&r, g, |q| out.push(q));
    }
    annotate_next_access(&mut out);
    out
}

/// The next-access index of every policy `record` call the tier replay makes for
/// `records` (each split at `region_bytes` boundaries into regions
/// `object << 40 | offset / region_bytes`, deletes skipped), for an offline cache policy
/// run as a placement ([`tier_placement`]). Valid for open-loop replays, whose access
/// order does not depend on the policy.
pub fn region_future(records: &[IoRecord], region_bytes: u64) -> Vec<u64> {
    let rb = region_bytes.max(4096);
    let mut reqs = Vec::new();
    for r in records.iter().filter(|r| r.op != Op::Delete) {
        let (mut off, end) = (r.offset, r.offset + r.len.max(1));
        while off < end {
            reqs.push(Request::new(0, (r.object << 40) | (off / rb), 1));
            off = ((off / rb + 1) * rb).min(end);
        }
    }
    annotate_next_access(&mut reqs);
    reqs.iter().map(|q| q.next_access).collect()
}

/// `kaiso sim tier --policy cache:<spec>`: a cache policy (`lru`,
/// `s3fifo:small-size-ratio=0.2`, …) run as a two-tier placement whose cache is the fast
/// tier (`fast_tier_bytes`, region sizes counted). Belady is given the future computed from
/// `records` (the open-loop trace; required for it, ignored by the others).
pub fn tier_placement(
    spec: &str,
    fast_tier_bytes: u64,
    records: Option<&[IoRecord]>,
    region_bytes: u64,
) -> Result<CachePlacement, String> {
    let name = spec.split_once(':').map_or(spec, |(n, _)| n);
    let offline = matches!(name.to_ascii_lowercase().as_str(), "belady" | "opt");
    let future = records
        .filter(|_| offline)
        .map(|r| region_future(r, region_bytes));
    placement_by_name(spec, fast_tier_bytes, future).map_err(|e| format!("cache:{spec}: {e}"))
}

/// Result of one cache replay.
#[derive(Clone, Debug, Serialize)]
pub struct CacheResult {
    pub policy: String,
    /// Capacity limit and its unit ("bytes" or "objects").
    pub capacity: u64,
    pub unit: &'static str,
    pub requests: u64,
    pub hits: u64,
    pub miss_ratio: f64,
    pub bytes: u64,
    pub byte_hits: u64,
    pub byte_miss_ratio: f64,
    /// Wall-clock seconds of the replay loop and the resulting speed.
    pub seconds: f64,
    pub requests_per_sec: f64,
    /// Miss ratio in consecutive windows of `window` requests.
    pub window: u64,
    pub series: Vec<f64>,
}

/// `1 - hits / total`, or 0 when there was nothing to count.
pub(crate) fn miss_ratio(hits: u64, total: u64) -> f64 {
    if total > 0 {
        1.0 - hits as f64 / total as f64
    } else {
        0.0
    }
}

/// Replay `requests` through `policy`. The first `warmup` requests warm the cache but are
/// not counted. `window` > 0 records a miss-ratio time series.
pub fn replay_cache(
    policy: &mut dyn CachePolicy,
    requests: impl IntoIterator<Item = Request>,
    warmup: u64,
    window: u64,
) -> CacheResult {
    let (mut n, mut hits, mut bytes, mut byte_hits) = (0u64, 0u64, 0u64, 0u64);
    let (mut w_n, mut w_hits) = (0u64, 0u64);
    let mut series = Vec::new();
    let mut seen = 0u64;
    let started = Instant::now();
    for req in requests {
        let hit = policy.access(&req);
        seen += 1;
        if seen <= warmup {
            continue;
        }
        n += 1;
        bytes += req.size;
        if hit {
            hits += 1;
            byte_hits += req.size;
        }
        if window > 0 {
            w_n += 1;
            w_hits += hit as u64;
            if w_n == window {
                series.push(1.0 - w_hits as f64 / w_n as f64);
                w_n = 0;
                w_hits = 0;
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let cap = policy.capacity();
    CacheResult {
        policy: policy.name().to_string(),
        capacity: cap.limit,
        unit: match cap.unit {
            kaiso_policy::cache::Unit::Bytes => "bytes",
            kaiso_policy::cache::Unit::Objects => "objects",
        },
        requests: n,
        hits,
        miss_ratio: miss_ratio(hits, n),
        bytes,
        byte_hits,
        byte_miss_ratio: miss_ratio(byte_hits, bytes),
        seconds,
        requests_per_sec: if seconds > 0.0 {
            seen as f64 / seconds
        } else {
            0.0
        },
        window,
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaiso_policy::cache::{Capacity, by_name};

    #[test]
    fn sizes_and_granularities_parse() {
        assert_eq!(parse_size("4k"), Some(4096));
        assert_eq!(parse_size("1.5m"), Some(1_572_864));
        assert_eq!(parse_size("100"), Some(100));
        assert_eq!(parse_size("x"), None);
        assert_eq!(Granularity::parse("object"), Some(Granularity::Object));
        assert_eq!(Granularity::parse("4k"), Some(Granularity::Block(4096)));
        assert_eq!(Granularity::parse("0"), None);
    }

    #[test]
    fn block_split_covers_every_touched_block() {
        let r = IoRecord::new(0, 1, 4000, 200, Op::Read);
        let mut ids = Vec::new();
        split(&r, Granularity::Block(4096), |q| ids.push(q.id));
        assert_eq!(ids, vec![1 << 44, (1 << 44) ^ 1]);
    }

    #[test]
    fn region_future_links_region_accesses_in_replay_order() {
        let rb = 1 << 20;
        let recs = [
            IoRecord::new(0, 1, rb - 10, 20, Op::Read), // regions (1,0) and (1,1)
            IoRecord::new(1, 1, 5, 1, Op::Delete),      // no record call
            IoRecord::new(2, 1, rb + 7, 1, Op::Write),  // (1,1)
            IoRecord::new(3, 2, 0, 1, Op::Read),        // (2,0)
        ];
        assert_eq!(region_future(&recs, rb), vec![NEVER, 2, NEVER, NEVER]);
    }

    /// Every baseline runs as a two-tier placement through the tier engine (what
    /// `kaiso sim tier --policy cache:<name>` does): all requests complete, the fast tier is
    /// never over its capacity, and a skewed workload is partly served by the fast tier.
    #[test]
    fn every_cache_policy_runs_as_a_tier_placement() {
        use crate::replay::tier::{Placement, TierConfig, TierSpec, Workload, run_tiering};
        use kaiso_device::{DeviceSpec, HddParams, ParallelParams};
        use kaiso_policy::cache::POLICY_NAMES;
        use kaiso_policy::cache::rng::SplitMix64;
        let region = 64 << 10;
        let fast = 200 * region;
        let mut rng = SplitMix64::new(5);
        let records: Vec<IoRecord> = (0..6_000u64)
            .map(|i| {
                // Skewed: the product of two uniforms favours low region numbers.
                let a = rng.below(2_000);
                let b = rng.below(2_000);
                let reg = a * b / 2_000;
                IoRecord::new(i * 2_000_000, 0, reg * region, 4096, Op::Read)
            })
            .collect();
        for name in POLICY_NAMES {
            let mut cfg = TierConfig::new(
                vec![
                    TierSpec::new("ssd", DeviceSpec::Ssd(ParallelParams::ssd()), fast),
                    TierSpec::new("hdd", DeviceSpec::Hdd(HddParams::default()), 1 << 40),
                ],
                region,
            );
            cfg.sample_interval = 1_000_000_000;
            let mut p = tier_placement(name, fast, Some(&records), region)
                .unwrap_or_else(|e| panic!("{e}"));
            let r = run_tiering(
                &cfg,
                Placement::Policy(&mut p),
                Workload::Open {
                    records: Box::new(records.iter().copied()),
                    speed: 1.0,
                },
                |_| {},
            );
            assert_eq!(r.requests, records.len() as u64, "{name}");
            assert!(
                r.fast_tier_used <= fast,
                "{name}: {} > {fast}",
                r.fast_tier_used
            );
            assert!(
                r.moves > 0 && r.hit_ratio > 0.05,
                "{name}: hit ratio {}",
                r.hit_ratio
            );
            assert!(p.cache().used() <= fast, "{name}");
        }
        assert!(tier_placement("belady", fast, None, region).is_err());
        assert!(tier_placement("lru:bogus=1", fast, None, region).is_err());
    }

    #[test]
    fn lru_counts_hits_and_belady_is_a_lower_bound() {
        let recs: Vec<IoRecord> = (0..10_000u64)
            .map(|i| IoRecord::new(i, (i * 7919) % 97 % (1 + i % 50), 0, 1, Op::Read))
            .collect();
        let reqs = to_requests(recs, Granularity::Object);
        let mut lru = by_name("lru", Capacity::objects(10), "").unwrap();
        let l = replay_cache(lru.as_mut(), reqs.iter().copied(), 0, 1000);
        assert_eq!(l.requests, 10_000);
        assert_eq!(l.series.len(), 10);
        if let Ok(mut opt) = by_name("belady", Capacity::objects(10), "") {
            let o = replay_cache(opt.as_mut(), reqs.iter().copied(), 0, 0);
            assert!(o.hits >= l.hits);
        }
    }
}
