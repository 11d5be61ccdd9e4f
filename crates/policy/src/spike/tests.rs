use super::*;
use crate::time::MINUTE;

const GB: u64 = 1 << 30;

fn tiers(ssd_used: u64, busy: f64) -> Vec<TierState> {
    vec![
        TierState {
            capacity: 10 * GB,
            used: ssd_used,
            high_watermark: 1.0,
            low_watermark: 1.0,
            busy: 0.0,
        },
        TierState {
            capacity: 200 * GB,
            used: 100 * GB,
            high_watermark: 1.0,
            low_watermark: 1.0,
            busy,
        },
    ]
}

/// Sample `k` (minute k): `iops` per segment for the whole minute, HDD %util `util`.
fn feed(p: &mut SpikePolicy, k: u64, iops: &[(ObjectId, u64)], util: f64) {
    let start = k * MINUTE;
    for &(seg, rate) in iops {
        let n = rate * 60;
        for i in 0..n {
            p.record(&Access {
                at: start + i * (MINUTE / n.max(1)),
                object: seg,
                op: Op::Read,
                offset: i * 4096,
                len: 4096,
            });
        }
    }
    p.observe_utilisation(start + MINUTE, 1, util);
}

fn with_segments(cfg: SpikeConfig, hdd: &[ObjectId], ssd: &[ObjectId]) -> SpikePolicy {
    let mut p = SpikePolicy::new(cfg).unwrap();
    for &s in hdd {
        p.placed(s, GB, 1);
    }
    for &s in ssd {
        p.placed(s, GB, 0);
    }
    p
}

const LOAD: [(ObjectId, u64); 5] = [(0, 60), (1, 50), (2, 40), (3, 30), (4, 20)];

#[test]
fn promotion_picks_top_iops_until_predicted_util_drops_below_middle() {
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4, 5], &[]);
    feed(&mut p, 0, &LOAD, 0.9);
    feed(&mut p, 1, &LOAD, 0.9);
    p.advance(2 * MINUTE);
    let view = p.view().unwrap();
    assert!((view.hdd_util - 0.9).abs() < 1e-9);
    assert!((view.hdd_iops - 200.0).abs() < 1e-9);
    // %util per iops = 0.9 / 200 = 0.0045. After segment 0: 0.9 - 0.27 = 0.63 (>= 0.5);
    // after segment 1: 0.63 - 0.225 = 0.405 < 0.5, so segments 0 and 1, in that order.
    let picked: Vec<ObjectId> = p.select(&view).into_iter().map(|e| e.0).collect();
    assert_eq!(picked, vec![0, 1]);
}

#[test]
fn demotion_picks_lowest_iops_ssd_segments_until_predicted_util_exceeds_middle() {
    let mut p = with_segments(SpikeConfig::default(), &[9], &[10, 11, 12, 13]);
    // HDD: segment 9 at 10 iops and 5 % util, so 0.005 %util per iops.
    let load = [(9, 10), (10, 100), (11, 5), (12, 80), (13, 20)];
    feed(&mut p, 0, &load, 0.05);
    feed(&mut p, 1, &load, 0.05);
    p.advance(2 * MINUTE);
    let view = p.view().unwrap();
    assert!((view.hdd_iops - 10.0).abs() < 1e-9, "SSD IO is not HDD IO");
    // Ascending: 11 (5 iops) -> 0.075, 13 (20) -> 0.175, 12 (80) -> 0.575 > 0.5: stop there.
    let picked = p.select(&view);
    assert_eq!(
        picked,
        vec![
            (11, MoveReason::SpikeOver),
            (13, MoveReason::SpikeOver),
            (12, MoveReason::SpikeOver)
        ]
    );
}

#[test]
fn nothing_moves_inside_the_band() {
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4], &[7]);
    for k in 0..20 {
        feed(&mut p, k, &LOAD, 0.45);
        assert!(
            p.plan((k + 1) * MINUTE, &tiers(GB, 0.45), 100 * GB)
                .is_empty()
        );
    }
}

#[test]
fn no_decision_before_two_samples_and_one_move_per_interval() {
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4], &[]);
    let mut moves = Vec::new();
    // Plans every 20 s for 6 minutes under a steady 90 % load.
    for step in 1..=18u64 {
        let now = step * 20 * crate::time::SECOND;
        if step % 3 == 1 {
            feed(&mut p, (now - 1) / MINUTE, &LOAD, 0.9);
        }
        for m in p.plan(now, &tiers(0, 0.9), 100 * GB) {
            moves.push((now, m));
        }
    }
    let first = moves.first().expect("a promotion").0;
    assert!(
        first >= 2 * MINUTE,
        "moved at {first} before two samples closed"
    );
    for w in moves.windows(2) {
        assert!(
            w[1].0 - w[0].0 >= MINUTE,
            "two moves within a minute: {moves:?}"
        );
    }
    let order: Vec<ObjectId> = moves.iter().map(|m| m.1.object).collect();
    assert_eq!(&order[..2], &[0, 1]);
    assert!(
        moves
            .iter()
            .all(|m| m.1.reason == MoveReason::Spike && m.1.to == 0)
    );
}

#[test]
fn a_promoted_spike_is_not_sent_back_while_the_hdd_stays_above_lower() {
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4], &[]);
    let mut ssd_used = 0;
    let mut demotions = 0;
    for k in 0..30u64 {
        // Once segment 0 is on the SSD, HDD util falls to 30 %, well inside the band.
        let util = if ssd_used > 0 { 0.3 } else { 0.9 };
        feed(&mut p, k, &LOAD, util);
        for m in p.plan((k + 1) * MINUTE, &tiers(ssd_used, util), 100 * GB) {
            if m.to == 0 {
                ssd_used += m.bytes;
            } else {
                demotions += 1;
            }
            p.placed(m.object, m.bytes, m.to);
        }
    }
    assert_eq!(demotions, 0);
    assert!(ssd_used > 0);
}

#[test]
fn the_persistent_io_rule_promotes_after_m_consecutive_samples() {
    let cfg = SpikeConfig {
        persistent_io: true,
        ..SpikeConfig::default()
    };
    let mut p = with_segments(cfg, &[0, 1], &[]);
    let mut promoted_at = None;
    for k in 0..12u64 {
        // Segment 0 has a little IO every minute; segment 1 skips every fourth minute.
        let mut load = vec![(0, 2)];
        if k % 4 != 3 {
            load.push((1, 3));
        }
        feed(&mut p, k, &load, 0.3);
        for m in p.plan((k + 1) * MINUTE, &tiers(0, 0.3), 100 * GB) {
            assert_eq!((m.object, m.reason), (0, MoveReason::Promote));
            promoted_at.get_or_insert(k + 1);
            p.placed(m.object, m.bytes, m.to);
        }
    }
    assert_eq!(promoted_at, Some(8), "after 8 consecutive samples with IO");
    // Off by default.
    let mut p = with_segments(SpikeConfig::default(), &[0], &[]);
    for k in 0..12u64 {
        feed(&mut p, k, &[(0, 2)], 0.3);
        assert!(
            p.plan((k + 1) * MINUTE, &tiers(0, 0.3), 100 * GB)
                .is_empty()
        );
    }
}

#[test]
fn a_full_ssd_or_small_budget_skips_the_segment() {
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4], &[]);
    feed(&mut p, 0, &LOAD, 0.9);
    feed(&mut p, 1, &LOAD, 0.9);
    assert!(
        p.plan(2 * MINUTE, &tiers(10 * GB, 0.9), 100 * GB)
            .is_empty()
    );
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4], &[]);
    feed(&mut p, 0, &LOAD, 0.9);
    feed(&mut p, 1, &LOAD, 0.9);
    assert!(p.plan(2 * MINUTE, &tiers(0, 0.9), GB - 1).is_empty());
}

#[test]
fn pinned_segments_never_move() {
    let mut p = with_segments(SpikeConfig::default(), &[0, 1, 2, 3, 4], &[]);
    p.pin(0, Some(1));
    feed(&mut p, 0, &LOAD, 0.9);
    feed(&mut p, 1, &LOAD, 0.9);
    let m = p.plan(2 * MINUTE, &tiers(0, 0.9), 100 * GB);
    assert_eq!(m[0].object, 1);
    assert!(p.explain(0, 2 * MINUTE).contains("pinned to tier 1"));
}

#[test]
fn config_is_validated_and_reads_from_serde() {
    let cfg: SpikeConfig =
        serde_json::from_str(r#"{"util_upper": 0.8, "persistent_io": true}"#).unwrap();
    assert_eq!(cfg.util_upper, 0.8);
    assert_eq!(cfg.smoothing_samples, 2);
    assert!(SpikePolicy::new(cfg).is_ok());
    for bad in [
        SpikeConfig {
            util_middle: 0.8,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            smoothing_samples: 0,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            sample_secs: -1.0,
            ..SpikeConfig::default()
        },
        SpikeConfig {
            hdd_tier: 0,
            ..SpikeConfig::default()
        },
    ] {
        assert!(SpikePolicy::new(bad).is_err());
    }
}
