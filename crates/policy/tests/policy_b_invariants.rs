//! Invariants every policy of policy-b's modules must keep, driven through the trait
//! object exactly as the store and the simulator drive them: capacity never exceeded,
//! `max_bytes` respected, pinned objects never moved, moves consistent with placement,
//! identical answers for identical calls.

use kaiso_policy::default_policy::KaisoPolicy;
use kaiso_policy::prefetch::{PrefetchConfig, PrefetchPolicy, RateMode, RegionLayout, UnitMode};
use kaiso_policy::spike::{SpikeConfig, SpikePolicy};
use kaiso_policy::time::{MILLISECOND, SECOND};
use kaiso_policy::{Access, Move, ObjectId, Op, PlacementPolicy, TierState};

const MIB: u64 = 1 << 20;
const OBJECTS: u64 = 240;

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn layout() -> RegionLayout {
    // 8 files of 30 chunks each, interleaved on the disk in a fixed scrambled order.
    let mut l = RegionLayout::new(MIB).unwrap();
    for chunk in 0..OBJECTS {
        let slot = (chunk * 97) % OBJECTS;
        l.insert(chunk, slot % 8, (slot / 8) * MIB).unwrap();
    }
    l
}

fn policies() -> Vec<Box<dyn PlacementPolicy>> {
    let mut kaiso = KaisoPolicy::default();
    kaiso.set_layout(layout());
    let pf = |unit_mode, rate_mode| {
        let cfg = PrefetchConfig {
            unit_mode,
            rate_mode,
            window_secs: 5.0,
            ..PrefetchConfig::default()
        };
        Box::new(PrefetchPolicy::new(cfg, Some(layout())).unwrap()) as Box<dyn PlacementPolicy>
    };
    let spike = SpikeConfig {
        persistent_io: true,
        sample_secs: 10.0,
        move_interval_secs: 5.0,
        ..SpikeConfig::default()
    };
    vec![
        Box::new(kaiso),
        Box::new(SpikePolicy::new(spike).unwrap()),
        pf(UnitMode::LayoutAware, RateMode::Adaptive),
        pf(UnitMode::LayoutAware, RateMode::Fixed(0.4)),
        pf(UnitMode::Lba, RateMode::Fixed(0.4)),
    ]
}

/// Runs a seeded workload through `p`, applying its moves; returns every plan.
fn drive(p: &mut dyn PlacementPolicy, seed: u64) -> Vec<Vec<Move>> {
    let mut rng = Lcg(seed);
    let mut tiers = vec![
        TierState {
            capacity: 40 * MIB,
            used: 0,
            high_watermark: 0.9,
            low_watermark: 0.8,
            busy: 0.0,
        },
        TierState {
            capacity: 1000 * MIB,
            used: 0,
            high_watermark: 1.0,
            low_watermark: 1.0,
            busy: 0.0,
        },
    ];
    let mut on = vec![1u8; OBJECTS as usize];
    for o in 0..OBJECTS {
        p.placed(o, MIB, 1);
        tiers[1].used += MIB;
    }
    let pinned: Vec<ObjectId> = (0..OBJECTS).filter(|o| o % 17 == 0).collect();
    for &o in &pinned {
        p.pin(o, Some(1));
    }
    let mut now = 0;
    let mut plans = Vec::new();
    for round in 0..150u64 {
        // Load shifts between four groups of 60 objects every 30 rounds.
        let group = (round / 30) % 4;
        for _ in 0..200 {
            now += 5 * MILLISECOND;
            let r = rng.next() % 100;
            let object = if r < 80 {
                group * 60 + (rng.next() % 60).min(rng.next() % 60)
            } else {
                rng.next() % OBJECTS
            };
            p.record(&Access {
                at: now,
                object,
                op: if r.is_multiple_of(5) {
                    Op::Write
                } else {
                    Op::Read
                },
                offset: (rng.next() % 256) * 4096,
                len: 4096,
            });
        }
        now += SECOND;
        tiers[1].busy = if round % 40 < 10 { 0.9 } else { 0.3 };
        let max_bytes = (1 + rng.next() % 8) * MIB;
        let moves = p.plan(now, &tiers, max_bytes);
        let total: u64 = moves.iter().map(|m| m.bytes).sum();
        assert!(
            total <= max_bytes,
            "{}: planned {total} > {max_bytes}",
            p.name()
        );
        for m in &moves {
            let i = m.object as usize;
            assert!(
                !pinned.contains(&m.object),
                "{}: moved pinned {m:?}",
                p.name()
            );
            assert_eq!(on[i], m.from, "{}: stale source in {m:?}", p.name());
            assert_ne!(m.from, m.to);
            tiers[m.from as usize].used -= m.bytes;
            tiers[m.to as usize].used += m.bytes;
            for t in &tiers {
                assert!(
                    t.used <= t.capacity,
                    "{}: over capacity after {m:?}",
                    p.name()
                );
            }
            on[i] = m.to;
            p.placed(m.object, m.bytes, m.to);
        }
        plans.push(moves);
        assert!(!p.explain(1, now).is_empty());
    }
    assert!(tiers[0].used > 0, "{}: never promoted anything", p.name());
    plans
}

#[test]
fn every_policy_keeps_the_placement_invariants() {
    for seed in [1, 7, 99] {
        for mut p in policies() {
            drive(p.as_mut(), seed);
        }
    }
}

#[test]
fn every_policy_is_deterministic() {
    let a: Vec<_> = policies()
        .into_iter()
        .map(|mut p| drive(p.as_mut(), 5))
        .collect();
    let b: Vec<_> = policies()
        .into_iter()
        .map(|mut p| drive(p.as_mut(), 5))
        .collect();
    assert_eq!(a, b);
}

#[test]
fn names_are_distinct_and_stable() {
    let names: Vec<String> = policies().iter().map(|p| p.name().to_string()).collect();
    assert_eq!(
        names,
        [
            "kaiso",
            "spike-002",
            "prefetch-la-adaptive",
            "prefetch-la-fixed",
            "prefetch-lba-fixed"
        ]
    );
}
