//! Tiering replay details the suite relies on: the offline future for Belady, files laid out
//! back to back, and a block cache passing a missed request to the HDD whole.

use kaiso_device::{DeviceSpec, HddParams, ParallelParams};
use kaiso_policy::Op;
use kaiso_policy::cache::{Capacity, by_name};
use kaiso_policy::default_policy::{KaisoConfig, KaisoPolicy};
use kaiso_policy::time::{MILLISECOND, SECOND};
use kaiso_sim::IoRecord;
use kaiso_sim::replay::tier::{
    ObjectLayout, Placement, TierConfig, TierSpec, Workload, block_future, run_tiering,
};
use std::sync::Arc;

const KIB: u64 = 1024;

fn config(fast: u64) -> TierConfig {
    TierConfig::new(
        vec![
            TierSpec::new("ssd", DeviceSpec::Ssd(ParallelParams::ssd()), fast),
            TierSpec::new(
                "hdd",
                DeviceSpec::Hdd(HddParams {
                    capacity_bytes: 10 << 30,
                    ..HddParams::default()
                }),
                u64::MAX / 4,
            ),
        ],
        1 << 20,
    )
}

fn open(records: Vec<IoRecord>) -> Workload<'static> {
    Workload::Open {
        records: Box::new(records.into_iter()),
        speed: 1.0,
    }
}

#[test]
fn block_future_gives_each_access_its_next_use() {
    let r = |t, off, len| IoRecord::new(t, 0, off, len, Op::Read);
    // Blocks: [0], [1, 2], [0], [2]
    let recs = vec![r(0, 0, 4096), r(1, 4096, 8192), r(2, 0, 10), r(3, 8192, 1)];
    let f = block_future(&recs, 1 << 20, 4096);
    assert_eq!(f, vec![3, u64::MAX, 4, u64::MAX, u64::MAX]);
}

#[test]
fn a_missed_request_goes_to_the_hdd_whole() {
    // 200 random 64 KiB reads, never repeated: every one misses. The HDD must see 200
    // requests with a block cache in front, as without one.
    let recs: Vec<IoRecord> = (0..200u64)
        .map(|i| {
            IoRecord::new(
                i * 20 * MILLISECOND,
                0,
                (i * 7919 % 10_000) << 20, // region-aligned: one part each
                64 * KIB,
                Op::Read,
            )
        })
        .collect();
    let cfg = config(64 << 20);
    let bare = run_tiering(&cfg, Placement::HomeOnly, open(recs.clone()), |_| {});
    let mut lru = by_name("lru", Capacity::bytes(64 << 20), "").unwrap();
    let cached = run_tiering(
        &cfg,
        Placement::WriteBackCache {
            cache: lru.as_mut(),
            block: 4096,
            future: None,
        },
        open(recs),
        |_| {},
    );
    let hdd_ios = |r: &kaiso_sim::replay::tier::TierResult| r.devices[1].iops * r.simulated_s;
    // (The device counters are read at the last event, when the last IO may still run.)
    assert!(hdd_ios(&bare) > 190.0, "{}", hdd_ios(&bare));
    assert!(
        (hdd_ios(&cached) - hdd_ios(&bare)).abs() < 1.5,
        "cache {} vs bare {}",
        hdd_ios(&cached),
        hdd_ios(&bare)
    );
    // Every missed block was filled: 200 × 64 KiB moved to the SSD.
    assert_eq!(cached.bytes_moved, 200 * 64 * KIB);
}

#[test]
fn files_are_laid_out_back_to_back_and_regions_keep_their_size() {
    // Two files: 10 KiB and 3 MiB + 5 KiB; 1 MiB regions. Hot reads of the small file and
    // of the big file's last region: whatever the policy promotes, it moves exactly those
    // regions' bytes (10 KiB, 5 KiB), never a full 1 MiB for a short region.
    let layout = ObjectLayout::new(vec![10 * KIB, (3 << 20) + 5 * KIB]);
    assert_eq!(layout.total_bytes(), 12 * KIB + (3 << 20) + 5 * KIB);
    let mut recs = Vec::new();
    for i in 0..400u64 {
        let t = i * 100 * MILLISECOND;
        recs.push(IoRecord::new(t, 0, (i % 2) * 4096, 4096, Op::Read));
        recs.push(IoRecord::new(t + 1, 1, 3 << 20, 4096, Op::Read));
    }
    let mut cfg = config(1 << 30);
    cfg.object_bytes = Some(Arc::new(layout));
    let mut p = KaisoPolicy::new(KaisoConfig {
        time_scale: 0.01,
        ..KaisoConfig::default()
    })
    .unwrap();
    let r = run_tiering(&cfg, Placement::Policy(&mut p), open(recs), |_| {});
    assert!(r.simulated_s > 30.0 && r.simulated_s < 45.0 * SECOND as f64);
    assert!(r.moves >= 1, "hot regions were never promoted");
    assert!(r.fast_tier_used <= 15 * KIB, "{}", r.fast_tier_used);
    assert_eq!(r.bytes_moved % KIB, 0);
    assert!(r.bytes_moved <= 15 * KIB * r.moves);
    assert!(r.hit_ratio > 0.5, "{}", r.hit_ratio);
}
