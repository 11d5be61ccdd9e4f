use super::*;
use crate::engine::{Access, MoveReason, ObjectId, Op, PlacementPolicy, TierState};
use crate::time::{Nanos, SECOND};

const MB: u64 = 1_000_000;

fn read(at: Nanos, object: ObjectId) -> Access {
    Access {
        at,
        object,
        op: Op::Read,
        offset: 0,
        len: 8192,
    }
}

fn tiers(cache_cap: u64, cache_used: u64) -> Vec<TierState> {
    let t = |capacity, used| TierState {
        capacity,
        used,
        high_watermark: 1.0,
        low_watermark: 1.0,
        busy: 0.0,
    };
    vec![t(cache_cap, cache_used), t(1000 * MB, 100 * MB)]
}

#[test]
fn weighted_history_halves_each_window_back() {
    assert_eq!(weighted_history([]), None);
    let v = weighted_history([1.0, 0.0, 0.0]).unwrap();
    assert!((v - 0.5 / 0.875).abs() < 1e-12);
    let v = weighted_history([4.0, 2.0]).unwrap();
    assert!((v - (0.5 * 4.0 + 0.25 * 2.0) / 0.75).abs() < 1e-12);
}

#[test]
fn easing_follows_the_four_rules() {
    // Explicit constants, so the test checks the rules, not the defaults.
    let cfg = EasingConfig {
        initial_r: 0.5,
        min_r: 0.05,
        max_r: 1.0,
        history_windows: 8,
        abrupt_chr_change: 0.15,
        abrupt_step: 0.5,
        chr_rise: 0.01,
        m_rise: 0.05,
        rise_step: 0.1,
        fall_step: 0.05,
    };
    let mut rc = RateController::new(cfg.clone()).unwrap();
    let w = |tps, chr| WindowMeasure { tps, chr };
    assert_eq!(rc.easing(w(100.0, 0.5)).1, EasingRule::Warmup);
    rc.end_window(w(100.0, 0.5));
    assert_eq!(rc.r(), 0.5, "no history: unchanged");
    // Rule 1: CHR rising a little.
    assert_eq!(rc.end_window(w(100.0, 0.55)), 0.6);
    assert_eq!(rc.last_rule(), EasingRule::ChrRising);
    // Rule 2: CHR flat, M = TPS (1 - CHR) up by > 5 %.
    rc.end_window(w(130.0, 0.54));
    assert_eq!(rc.last_rule(), EasingRule::MRising);
    // Rule 3: flat: ease off gradually.
    let mut rc2 = RateController::new(EasingConfig {
        initial_r: 1.0,
        ..cfg.clone()
    })
    .unwrap();
    for _ in 0..10 {
        rc2.end_window(w(100.0, 0.6));
    }
    assert_eq!(rc2.last_rule(), EasingRule::Flat);
    assert!((rc2.r() - (1.0 - 9.0 * 0.05)).abs() < 1e-9, "{}", rc2.r());
    // Rule 4: abrupt CHR drop (the hot group moved): large step up.
    let before = rc2.r();
    rc2.end_window(w(100.0, 0.2));
    assert_eq!(rc2.last_rule(), EasingRule::AbruptChange);
    assert!((rc2.r() - (before + 0.5).min(1.0)).abs() < 1e-9);
    assert!(rc2.r() > before);
    // Clamped.
    for _ in 0..100 {
        rc2.end_window(w(100.0, 0.2));
    }
    assert_eq!(rc2.r(), cfg.min_r);
}

fn scattered_layout() -> RegionLayout {
    // File 1 occupies chunks 10, 3, 7, 5, 20, 21 (file order); file 2 chunks 11, 9, 4.
    let mut l = RegionLayout::new(MB).unwrap();
    for (i, c) in [10u64, 3, 7, 5, 20, 21].iter().enumerate() {
        l.insert(*c, 1, i as u64 * MB).unwrap();
    }
    for (i, c) in [11u64, 9, 4].iter().enumerate() {
        l.insert(*c, 2, i as u64 * MB).unwrap();
    }
    l
}

#[test]
fn layout_rejects_bad_entries_and_forms_file_units() {
    let mut l = scattered_layout();
    assert_eq!(l.unit_of(7, 3), vec![10, 3, 7]);
    assert_eq!(l.unit_of(20, 3), vec![5, 20, 21]);
    assert_eq!(l.unit_of(99, 3), vec![99], "unmapped chunk: its own unit");
    assert!(matches!(
        l.insert(30, 1, 5),
        Err(LayoutError::Unaligned { .. })
    ));
    assert!(matches!(
        l.insert(10, 2, 8 * MB),
        Err(LayoutError::ChunkRemapped { .. })
    ));
    assert!(matches!(
        l.insert(31, 1, 0),
        Err(LayoutError::PlaceTaken { other: 10, .. })
    ));
    assert!(l.insert(10, 1, 0).is_ok(), "same mapping again is fine");
    assert!(RegionLayout::new(0).is_err());
}

fn policy(mode: UnitMode, rate: RateMode) -> PrefetchPolicy {
    let cfg = PrefetchConfig {
        unit_mode: mode,
        rate_mode: rate,
        ..PrefetchConfig::default()
    };
    let mut p = PrefetchPolicy::new(cfg, Some(scattered_layout())).unwrap();
    for c in 0..30 {
        p.placed(c, MB, 1);
    }
    p
}

fn prefetched(moves: &[crate::engine::Move]) -> Vec<ObjectId> {
    let mut v: Vec<ObjectId> = moves
        .iter()
        .filter(|m| m.reason == MoveReason::Prefetch)
        .map(|m| m.object)
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn layout_aware_units_follow_the_file_and_lba_units_follow_the_disk() {
    for (mode, want) in [
        (UnitMode::LayoutAware, vec![3, 7, 10]),
        (UnitMode::Lba, vec![9, 10, 11]),
    ] {
        let mut p = policy(mode, RateMode::Fixed(0.4));
        // Window 0: chunk 10 is read a lot.
        for k in 0..20 {
            p.record(&read(k * 100_000_000, 10));
        }
        // Window 1 starts at 10 s; 1 s into it 50 MB may have been prefetched.
        let moves = p.plan(11 * SECOND, &tiers(100 * MB, 0), u64::MAX);
        assert_eq!(prefetched(&moves), want, "{mode:?}");
    }
}

#[test]
fn prefetch_runs_only_in_the_first_p_r_seconds_of_a_window() {
    let cfg = PrefetchConfig {
        rate_mode: RateMode::Fixed(0.2),
        prefetch_bytes_per_sec: 1.0 * MB as f64,
        unit_chunks: 1,
        ..PrefetchConfig::default()
    };
    let mut p = PrefetchPolicy::new(cfg, Some(scattered_layout())).unwrap();
    for c in 0..30 {
        p.placed(c, MB, 1);
        for k in 0..(30 - c) {
            p.record(&read(k * 1000 + c, c));
        }
    }
    // Window 1 = [10 s, 20 s); slice = 0.2 × 10 s = 2 s at 1 MB/s = 2 chunks.
    let at = |s: f64| (s * SECOND as f64) as Nanos;
    assert_eq!(p.plan(at(10.0), &tiers(100 * MB, 0), u64::MAX).len(), 0);
    assert_eq!(
        prefetched(&p.plan(at(11.0), &tiers(100 * MB, 0), u64::MAX)),
        vec![0]
    );
    p.placed(0, MB, 0);
    assert_eq!(
        prefetched(&p.plan(at(15.0), &tiers(100 * MB, MB), u64::MAX)),
        vec![1]
    );
    p.placed(1, MB, 0);
    assert!(
        p.plan(at(19.0), &tiers(100 * MB, 2 * MB), u64::MAX)
            .is_empty(),
        "slice over"
    );
    // max_bytes caps a plan too.
    assert!(
        p.plan(at(21.5), &tiers(100 * MB, 2 * MB), MB - 1)
            .is_empty()
    );
}

#[test]
fn a_full_cache_evicts_the_least_recently_used_chunks() {
    let mut p = policy(UnitMode::LayoutAware, RateMode::Fixed(1.0));
    // Cache holds 2 chunks: 0 (used long ago) and 1 (used recently).
    p.placed(0, MB, 0);
    p.placed(1, MB, 0);
    p.record(&read(SECOND, 0));
    p.record(&read(8 * SECOND, 1));
    for k in 0..5 {
        p.record(&read(9 * SECOND + k, 11));
    }
    // File 2's unit 0 = chunks 11, 9, 4: needs 3 MB in a 3 MB cache holding 2 MB.
    let moves = p.plan(12 * SECOND, &tiers(3 * MB, 2 * MB), u64::MAX);
    let evicted: Vec<ObjectId> = moves
        .iter()
        .filter(|m| m.reason == MoveReason::Evict)
        .map(|m| m.object)
        .collect();
    assert_eq!(evicted, vec![0, 1], "{moves:?}");
    assert_eq!(prefetched(&moves), vec![4, 9, 11]);
    let mut used: i64 = 2;
    for m in &moves {
        used += if m.to == 0 { 1 } else { -1 };
        assert!(used <= 3);
    }
}

#[test]
fn fixed_r_stays_and_adaptive_r_moves() {
    let mut fixed = policy(UnitMode::LayoutAware, RateMode::Fixed(0.4));
    let mut adaptive = policy(UnitMode::LayoutAware, RateMode::Adaptive);
    for w in 0..30u64 {
        for k in 0..50 {
            let a = read(w * 10 * SECOND + k * 1000, k % 7);
            fixed.record(&a);
            adaptive.record(&a);
        }
    }
    fixed.plan(300 * SECOND, &tiers(100 * MB, 0), u64::MAX);
    adaptive.plan(300 * SECOND, &tiers(100 * MB, 0), u64::MAX);
    assert_eq!(fixed.r(), 0.4);
    assert!(
        fixed
            .reports()
            .iter()
            .all(|r| r.r == 0.4 && r.rule.is_none())
    );
    // Nothing was ever prefetched in this test, so CHR is flat: r eases down from 1.
    assert!(adaptive.r() < 0.5, "{}", adaptive.r());
    assert_eq!(adaptive.reports().len(), 30);
}

#[test]
fn pinned_chunks_are_neither_prefetched_nor_evicted() {
    let mut p = policy(UnitMode::LayoutAware, RateMode::Fixed(1.0));
    p.pin(3, Some(1));
    p.placed(0, MB, 0);
    p.pin(0, Some(0));
    for k in 0..5 {
        p.record(&read(k, 10));
    }
    let moves = p.plan(11 * SECOND, &tiers(3 * MB, MB), u64::MAX);
    assert_eq!(prefetched(&moves), vec![7, 10]);
    assert!(moves.iter().all(|m| m.object != 0));
}

#[test]
fn config_errors_are_reported() {
    assert!(PrefetchPolicy::new(PrefetchConfig::default(), None).is_err());
    let lba = PrefetchConfig {
        unit_mode: UnitMode::Lba,
        ..PrefetchConfig::default()
    };
    assert!(PrefetchPolicy::new(lba, None).is_ok());
    for bad in [
        PrefetchConfig {
            unit_chunks: 0,
            ..PrefetchConfig::default()
        },
        PrefetchConfig {
            rate_mode: RateMode::Fixed(1.5),
            ..PrefetchConfig::default()
        },
        PrefetchConfig {
            window_secs: 0.0,
            ..PrefetchConfig::default()
        },
    ] {
        assert!(PrefetchPolicy::new(bad, Some(scattered_layout())).is_err());
    }
    let cfg: PrefetchConfig =
        serde_json::from_str(r#"{"unit_mode": "lba", "rate_mode": {"fixed": 0.6}}"#).unwrap();
    assert_eq!(cfg.rate_mode, RateMode::Fixed(0.6));
}

#[test]
fn extreme_ids_and_offsets_do_not_panic() {
    let mut l = RegionLayout::new(1).unwrap();
    l.insert(u64::MAX, 1, u64::MAX).unwrap();
    assert_eq!(l.unit_of(u64::MAX, 3), vec![u64::MAX]);
    for mode in [UnitMode::LayoutAware, UnitMode::Lba] {
        let cfg = PrefetchConfig {
            unit_mode: mode,
            rate_mode: RateMode::Fixed(1.0),
            ..PrefetchConfig::default()
        };
        let mut p = PrefetchPolicy::new(cfg, Some(l.clone())).unwrap();
        p.placed(u64::MAX, MB, 1);
        p.record(&read(u64::MAX - 20 * SECOND, u64::MAX));
        p.record(&read(0, u64::MAX));
        let _ = p.plan(u64::MAX, &tiers(100 * MB, 0), u64::MAX);
        let _ = p.explain(u64::MAX, u64::MAX);
    }
}
