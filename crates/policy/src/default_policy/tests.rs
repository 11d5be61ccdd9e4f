use super::*;
use crate::engine::MoveReason;
use crate::time::{MINUTE, SECOND};

const MIB: u64 = 1 << 20;

fn tier(capacity: u64, used: u64) -> TierState {
    TierState {
        capacity,
        used,
        high_watermark: 0.9,
        low_watermark: 0.8,
        busy: 0.0,
    }
}

fn read(at: Nanos, object: ObjectId, offset: u64) -> Access {
    Access {
        at,
        object,
        op: Op::Read,
        offset,
        len: 4096,
    }
}

fn open(at: Nanos, object: ObjectId) -> Access {
    Access {
        at,
        object,
        op: Op::Open,
        offset: 0,
        len: 0,
    }
}

/// A tiny test world: objects on tiers, moves applied as the store would.
struct World {
    tiers: Vec<TierState>,
    sizes: Vec<u64>,
    on: Vec<u8>,
}

impl World {
    fn new(policy: &mut KaisoPolicy, caps: &[u64], sizes: &[u64], start_tier: u8) -> Self {
        let mut tiers: Vec<TierState> = caps.iter().map(|&c| tier(c, 0)).collect();
        for (i, &s) in sizes.iter().enumerate() {
            policy.placed(i as u64, s, start_tier);
            tiers[start_tier as usize].used += s;
        }
        World {
            tiers,
            sizes: sizes.to_vec(),
            on: vec![start_tier; sizes.len()],
        }
    }

    /// Applies `moves` in order, checking every intermediate state stays within capacity.
    fn apply(&mut self, policy: &mut KaisoPolicy, moves: &[Move]) {
        for m in moves {
            let i = m.object as usize;
            assert_eq!(self.on[i], m.from, "move from the wrong tier: {m:?}");
            assert_eq!(self.sizes[i], m.bytes);
            self.tiers[m.from as usize].used -= m.bytes;
            self.tiers[m.to as usize].used += m.bytes;
            for t in &self.tiers {
                assert!(t.used <= t.capacity, "capacity exceeded: {t:?} after {m:?}");
            }
            self.on[i] = m.to;
            policy.placed(m.object, m.bytes, m.to);
        }
    }
}

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

#[test]
fn capacity_is_never_exceeded_under_random_load() {
    for seed in 1..6u64 {
        let mut p = KaisoPolicy::default();
        let mut rng = Lcg(seed);
        let sizes: Vec<u64> = (0..200).map(|_| (1 + rng.next() % 8) * MIB).collect();
        let total: u64 = sizes.iter().sum();
        let mut w = World::new(&mut p, &[total / 5, total / 3, total * 2], &sizes, 2);
        let mut now = 0;
        for round in 0..60 {
            for _ in 0..300 {
                // Zipf-ish: low ids far more often.
                let r = rng.next() % 1000;
                let obj = (r * r / 5000) % 200;
                now += 10 * crate::time::MILLISECOND;
                p.record(&read(now, obj, (rng.next() % 64) * 4096));
            }
            for t in &mut w.tiers {
                t.busy = (round % 7) as f64 / 7.0;
            }
            now += MINUTE;
            let moves = p.plan(now, &w.tiers, 64 * MIB);
            let moved: u64 = moves.iter().map(|m| m.bytes).sum();
            assert!(moved <= 64 * MIB, "max_bytes exceeded: {moved}");
            w.apply(&mut p, &moves);
        }
        assert!(
            w.tiers[0].used > 0,
            "seed {seed}: nothing was ever promoted"
        );
    }
}

#[test]
fn a_tier_over_its_high_watermark_is_drained_to_its_low_watermark() {
    let mut p = KaisoPolicy::default();
    let sizes = vec![MIB; 100];
    let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &sizes, 0);
    // Tier 0 is 100% full; objects 0..10 are hot.
    for k in 0..5 {
        for o in 0..10 {
            p.record(&read(k * 10 * SECOND, o, o * 8192));
        }
    }
    let moves = p.plan(MINUTE, &w.tiers, 1000 * MIB);
    assert!(
        moves
            .iter()
            .all(|m| m.reason == MoveReason::DemoteOverWatermark)
    );
    assert!(
        moves.iter().all(|m| m.object >= 10),
        "a hot object was demoted"
    );
    w.apply(&mut p, &moves);
    assert_eq!(
        w.tiers[0].used,
        80 * MIB,
        "drained to exactly the low watermark"
    );
}

/// Objects placed empty and grown later (files created through a mount): the drain must
/// plan with the sizes `resized` reported, not empty the tier.
#[test]
fn objects_resized_after_placement_drain_to_the_low_watermark() {
    let mut p = KaisoPolicy::default();
    let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &[0; 100], 0);
    for o in 0..100 {
        p.resized(o, MIB);
        w.sizes[o as usize] = MIB;
    }
    w.tiers[0].used = 100 * MIB;
    p.resized(1000, MIB); // never placed: ignored
    assert!(p.explain(1000, MINUTE).contains("unknown"));
    let moves = p.plan(MINUTE, &w.tiers, 1000 * MIB);
    assert!(moves.iter().all(|m| m.bytes == MIB), "{moves:?}");
    w.apply(&mut p, &moves);
    assert_eq!(w.tiers[0].used, 80 * MIB, "drained to the low watermark");
    assert!(
        p.explain(0, MINUTE).contains("1.0 MiB"),
        "{}",
        p.explain(0, MINUTE)
    );
}

#[test]
fn resizing_keeps_a_planned_move_in_flight() {
    let mut p = KaisoPolicy::default();
    let w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &[MIB; 100], 0);
    let mut tiers = w.tiers.clone();
    tiers[0].used = 100 * MIB;
    let moves = p.plan(MINUTE, &tiers, 1000 * MIB);
    let m = moves[0];
    p.resized(m.object, 2 * MIB);
    assert!(
        p.explain(m.object, MINUTE).contains("in flight"),
        "{}",
        p.explain(m.object, MINUTE)
    );
    assert!(p.explain(m.object, MINUTE).contains("2.0 MiB"));
}

#[test]
fn pinned_objects_are_never_moved() {
    let mut p = KaisoPolicy::default();
    let sizes = vec![MIB; 50];
    let mut w = World::new(&mut p, &[20 * MIB, 1000 * MIB], &sizes, 1);
    for o in 0..50 {
        if o % 2 == 0 {
            p.pin(o, Some(1));
        }
    }
    // Everything hot, even-numbered hottest.
    let mut now = 0;
    for k in 0..20u64 {
        for o in 0..50 {
            now += SECOND;
            p.record(&read(now, o, k * 65536));
            if o % 2 == 0 {
                p.record(&read(now, o, k * 65536 + 999));
            }
        }
    }
    for round in 0..30 {
        let mut ts = w.tiers.clone();
        ts[1].busy = if round % 2 == 0 { 0.95 } else { 0.0 };
        let moves = p.plan(now + round * MINUTE * 11, &ts, 1000 * MIB);
        assert!(
            moves.iter().all(|m| m.object % 2 == 1),
            "pinned object moved: {moves:?}"
        );
        w.apply(&mut p, &moves);
    }
    assert!(w.tiers[0].used > 0);
}

fn scenario(p: &mut KaisoPolicy) -> Vec<Vec<Move>> {
    let mut rng = Lcg(42);
    let sizes: Vec<u64> = (0..300).map(|_| (1 + rng.next() % 4) * MIB).collect();
    let mut w = World::new(p, &[100 * MIB, 300 * MIB, 10_000 * MIB], &sizes, 2);
    let mut out = Vec::new();
    let mut now = 0;
    for round in 0..40 {
        for _ in 0..500 {
            now += 5 * crate::time::MILLISECOND;
            let obj = (rng.next() % 300).min(rng.next() % 300);
            p.record(&read(now, obj, rng.next() % 100 * 4096));
        }
        w.tiers[2].busy = if round % 9 < 3 { 0.9 } else { 0.3 };
        now += MINUTE;
        let moves = p.plan(now, &w.tiers, 50 * MIB);
        w.apply(p, &moves);
        out.push(moves);
    }
    out
}

#[test]
fn same_calls_give_the_same_plans() {
    let a = scenario(&mut KaisoPolicy::default());
    let b = scenario(&mut KaisoPolicy::default());
    assert!(a.iter().map(Vec::len).sum::<usize>() > 10);
    assert_eq!(a, b);
}

#[test]
fn objects_of_similar_heat_do_not_ping_pong() {
    let mut p = KaisoPolicy::default();
    // Room for 10 of 20 equal objects; all equally hot, the leading group shifting slightly.
    let sizes = vec![MIB; 20];
    let mut w = World::new(&mut p, &[12 * MIB, 100 * MIB], &sizes, 1);
    let mut now = 0;
    let mut moves_per_object = [0u32; 20];
    let mut last_move: [Option<(u8, Nanos)>; 20] = [None; 20];
    for round in 0..200u64 {
        for o in 0..20u64 {
            // Slightly uneven, rotating: each object is a little hotter in turn.
            let extra = u64::from((o + round) % 20 < 10);
            for k in 0..(2 + extra) {
                now += 100 * crate::time::MILLISECOND;
                p.record(&read(now, o, (k * 7 + round) % 50 * 65536));
            }
        }
        now += 30 * SECOND;
        let moves = p.plan(now, &w.tiers, 100 * MIB);
        for m in &moves {
            let i = m.object as usize;
            moves_per_object[i] += 1;
            if let Some((to, at)) = last_move[i] {
                assert!(
                    now - at >= 600 * SECOND,
                    "object {i} moved back to {} {}s after moving to {to}",
                    m.to,
                    (now - at) / SECOND
                );
            }
            last_move[i] = Some((m.to, now));
        }
        w.apply(&mut p, &moves);
    }
    let total: u32 = moves_per_object.iter().sum();
    // 200 plans, 100 minutes: a ping-ponging policy would move on nearly every plan.
    assert!(
        total <= 30,
        "too many moves for near-equal heat: {total} {moves_per_object:?}"
    );
}

#[test]
fn one_sequential_pass_does_not_make_an_object_hot() {
    let mut p = KaisoPolicy::default();
    let mut w = World::new(&mut p, &[100 * MIB, 10_000 * MIB], &[64 * MIB, MIB, MIB], 1);
    let mut now = 0;
    // Object 0: a 64 MiB file scanned once, 16 K reads in order.
    p.record(&open(now, 0));
    for k in 0..16_384u64 {
        now += 50 * crate::time::MICROSECOND;
        p.record(&read(now, 0, k * 4096));
    }
    // Object 1: three random reads a few seconds apart. Object 2: one read.
    for k in 0..3 {
        now += 5 * SECOND;
        p.record(&read(now, 1, (k * 37 % 16) * 4096));
    }
    p.record(&read(now, 2, 0));
    let moves = p.plan(now + SECOND, &w.tiers, 1000 * MIB);
    let promoted: Vec<ObjectId> = moves.iter().map(|m| m.object).collect();
    assert_eq!(promoted, vec![1], "{}", p.explain(0, now));
    w.apply(&mut p, &moves);
    assert!(p.score(0, now).unwrap() < p.config().promote_min_heat);
}

#[test]
fn a_busy_slow_tier_sends_its_hottest_objects_up_as_a_spike() {
    let mut p = KaisoPolicy::default();
    let sizes = vec![MIB; 10];
    let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &sizes, 1);
    let mut now = 0;
    // Objects 0 and 1 carry most of the load; 2..10 a little.
    for _ in 0..30 {
        for o in 0..10u64 {
            let n = if o < 2 { 20 } else { 1 };
            for k in 0..n {
                now += 100 * crate::time::MILLISECOND;
                p.record(&read(now, o, (k * 13 % 97) * 4096));
            }
        }
    }
    // Stop accessing long enough that heat promotions alone would be small, then spike.
    w.tiers[1].busy = 0.95;
    let moves = p.plan(now + SECOND, &w.tiers, 1000 * MIB);
    let mut spiked: Vec<ObjectId> = moves
        .iter()
        .filter(|m| m.reason == MoveReason::Spike)
        .map(|m| m.object)
        .collect();
    spiked.sort_unstable();
    assert_eq!(spiked, vec![0, 1], "{moves:?}");
    assert_eq!(
        moves[0].reason,
        MoveReason::Spike,
        "spike relief comes first"
    );
    w.apply(&mut p, &moves);
}

#[test]
fn the_flash_write_budget_limits_promotions() {
    let cfg = KaisoConfig {
        promote_bytes_per_day: 10 * MIB,
        promote_burst_fraction: 0.5,
        ..KaisoConfig::default()
    };
    let mut p = KaisoPolicy::new(cfg).unwrap();
    let sizes = vec![MIB; 40];
    let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &sizes, 1);
    let mut now = 0;
    for k in 0..5 {
        for o in 0..40 {
            now += SECOND;
            p.record(&read(now, o, k * 8192));
        }
    }
    let moves = p.plan(now, &w.tiers, 1000 * MIB);
    assert_eq!(moves.len(), 5, "burst of half a day's 10 MiB budget");
    w.apply(&mut p, &moves);
    let held = (0..40).find(|&o| w.on[o as usize] == 1).unwrap();
    assert!(
        p.explain(held, now).contains("budget"),
        "{}",
        p.explain(held, now)
    );
    // Twelve hours later another 5 MiB of budget has accrued; the objects are hot again.
    now += 12 * 3600 * SECOND;
    for k in 0..5 {
        for o in 0..40 {
            now += SECOND;
            p.record(&read(now, o, (k + 9) * 8192));
        }
    }
    let moves = p.plan(now, &w.tiers, 1000 * MIB);
    assert_eq!(moves.len(), 5);
    // No time passed: no budget left.
    w.apply(&mut p, &moves);
    assert!(p.plan(now, &w.tiers, 1000 * MIB).is_empty());
}

#[test]
fn moves_back_off_when_the_devices_are_busy() {
    let run = |busy: f64| {
        let mut p = KaisoPolicy::default();
        let sizes = vec![MIB; 40];
        let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &sizes, 1);
        for k in 0..4 {
            for o in 0..40 {
                p.record(&read(k * 50 * SECOND + o, o, k * 8192));
            }
        }
        w.tiers[0].busy = busy;
        p.plan(200 * SECOND, &w.tiers, 20 * MIB)
            .iter()
            .map(|m| m.bytes)
            .sum::<u64>()
    };
    assert_eq!(run(0.2), 20 * MIB);
    assert_eq!(run(0.99), 2 * MIB, "pace_floor of 10%");
    let mid = run(0.725);
    assert!(mid > 2 * MIB && mid < 20 * MIB, "{mid}");
}

#[test]
fn place_new_spills_down_and_never_past_capacity() {
    let mut p = KaisoPolicy::default();
    let tiers = [tier(100, 85), tier(1000, 100)];
    assert_eq!(p.place_new(0, 4, &tiers), 0);
    assert_eq!(
        p.place_new(0, 10, &tiers),
        1,
        "would cross tier 0's high watermark"
    );
    let full = [tier(100, 95), tier(100, 99)];
    assert_eq!(
        p.place_new(0, 3, &full),
        0,
        "over the watermark but under capacity"
    );
    assert_eq!(
        p.place_new(0, 50, &full),
        0,
        "nowhere fits: the emptiest tier"
    );
    assert_eq!(p.place_new(0, 1, &[]), 0);
}

#[test]
fn a_much_hotter_object_exchanges_with_a_cold_resident() {
    // Promotions fill only to the low watermark (8 MiB), so the tier is full for them.
    let mut p = KaisoPolicy::new(KaisoConfig {
        promote_dwpd: 100.0,
        promote_to_high_watermark: false,
        ..KaisoConfig::default()
    })
    .unwrap();
    let sizes = vec![MIB; 12];
    let mut w = World::new(&mut p, &[10 * MIB, 100 * MIB], &sizes, 1);
    // Fill tier 0 with 0..8 (warm), leave 8..12 on tier 1.
    let mut now = 0;
    for k in 0..3 {
        for o in 0..8 {
            now += SECOND;
            p.record(&read(now, o, k * 8192));
        }
    }
    let moves = p.plan(now, &w.tiers, 100 * MIB);
    assert_eq!(moves.len(), 8);
    w.apply(&mut p, &moves);
    // Later object 11 becomes very hot; the residents have cooled.
    now += 2 * 3600 * SECOND;
    for k in 0..30 {
        now += SECOND;
        p.record(&read(now, 11, k * 8192));
    }
    let moves = p.plan(now, &w.tiers, 100 * MIB);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert_eq!(moves[0].reason, MoveReason::Evict);
    assert_eq!(
        (moves[1].object, moves[1].reason),
        (11, MoveReason::Promote)
    );
    w.apply(&mut p, &moves);
}

#[test]
fn explain_shows_heat_rank_pin_and_decision() {
    let mut p = KaisoPolicy::default();
    p.placed(7, 3 * MIB, 1);
    p.pin(7, Some(1));
    p.record(&read(SECOND, 7, 0));
    let e = p.explain(7, 2 * SECOND);
    for word in [
        "tier 1",
        "3.0 MiB",
        "heat",
        "rank 1 of 1",
        "pinned to tier 1",
        "last decision",
    ] {
        assert!(e.contains(word), "{word:?} missing from {e}");
    }
    assert!(p.explain(8, 0).contains("unknown"));
}

#[test]
fn config_reads_from_serde_with_defaults_and_rejects_bad_values() {
    let cfg: KaisoConfig = serde_json::from_str(r#"{"promote_min_heat": 3.0}"#).unwrap();
    assert_eq!(cfg.promote_min_heat, 3.0);
    assert_eq!(
        cfg.heat_half_life_secs,
        KaisoConfig::default().heat_half_life_secs
    );
    assert!(serde_json::from_str::<KaisoConfig>(r#"{"promote_min_heta": 3.0}"#).is_err());
    let bad = KaisoConfig {
        spike_util_target: 0.9,
        ..KaisoConfig::default()
    };
    assert!(KaisoPolicy::new(bad).is_err());
    let bad = KaisoConfig {
        heat_half_life_secs: f64::NAN,
        ..KaisoConfig::default()
    };
    let err = KaisoPolicy::new(bad).err().unwrap();
    assert!(err.to_string().contains("heat_half_life_secs"));
}

#[test]
fn layout_prefetch_brings_file_neighbours_along() {
    let mut p = KaisoPolicy::default();
    let mut layout = RegionLayout::new(MIB).unwrap();
    // File 1 is chunks 10, 3, 7, 5 (scattered on the volume).
    for (i, chunk) in [10u64, 3, 7, 5].iter().enumerate() {
        layout.insert(*chunk, 1, i as u64 * MIB).unwrap();
    }
    p.set_layout(layout);
    let sizes = vec![MIB; 12];
    let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &sizes, 1);
    for k in 0..4 {
        p.record(&read(k * 10 * SECOND, 10, k * 8192));
    }
    let moves = p.plan(MINUTE, &w.tiers, 100 * MIB);
    let got: Vec<(ObjectId, MoveReason)> = moves.iter().map(|m| (m.object, m.reason)).collect();
    assert_eq!(
        got,
        vec![
            (10, MoveReason::Promote),
            (3, MoveReason::Prefetch),
            (7, MoveReason::Prefetch)
        ]
    );
    w.apply(&mut p, &moves);
}

#[test]
fn moves_in_flight_are_not_planned_twice_and_cap_the_queue() {
    let cfg = KaisoConfig {
        move_bytes_per_sec: 10 * MIB,
        max_in_flight_secs: 2.0,
        promote_dwpd: 100.0,
        ..KaisoConfig::default()
    };
    let mut p = KaisoPolicy::new(cfg).unwrap();
    let sizes = vec![MIB; 60];
    let w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &sizes, 1);
    let mut now = 0;
    for k in 0..3 {
        for o in 0..60 {
            now += 100 * crate::time::MILLISECOND;
            p.record(&read(now, o, k * 8192));
        }
    }
    // 2 s of 10 MiB/s may be in flight at most.
    let first = p.plan(now, &w.tiers, 15 * MIB);
    assert_eq!(first.len(), 15, "max_bytes");
    let second = p.plan(now + SECOND, &w.tiers, u64::MAX);
    assert_eq!(second.len(), 5, "only the in-flight cap's remainder");
    assert!(
        second
            .iter()
            .all(|m| first.iter().all(|f| f.object != m.object))
    );
    let e = p.explain(second[0].object, now + SECOND);
    assert!(e.contains("move to tier 0 in flight"), "{e}");
    // Nothing is done yet: the queue is full.
    assert!(p.plan(now + 2 * SECOND, &w.tiers, u64::MAX).is_empty());
    // The mover reports the first batch done: room for more.
    let mut w = w;
    w.apply(&mut p, &first);
    let third = p.plan(now + 3 * SECOND, &w.tiers, u64::MAX);
    assert_eq!(third.len(), 15);
    // A move never reported done stops being reserved after in_flight_timeout_secs.
    let late = now + 3 * SECOND + 121 * SECOND;
    for o in 0..60 {
        p.record(&read(late - SECOND, o, 999_999));
        p.record(&read(late, o, 1_999_999));
    }
    assert!(!p.plan(late, &w.tiers, u64::MAX).is_empty());
}

/// A promotion the mover could not carry out (it reports the object still on its tier)
/// is not a move: the next plan may promote the object again, instead of holding it for
/// `min_residency_secs` as if it had just arrived. Likewise for a move never reported.
#[test]
fn a_planned_move_that_did_not_happen_does_not_hold_the_object_back() {
    let cfg = KaisoConfig {
        promote_dwpd: 100.0,
        ..KaisoConfig::default()
    };
    for never_reported in [false, true] {
        let mut p = KaisoPolicy::new(cfg.clone()).unwrap();
        let sizes = vec![MIB; 20];
        let w = World::new(&mut p, &[10 * MIB, 1000 * MIB], &sizes, 1);
        let mut now = 0;
        for k in 0..4 {
            now += 3 * SECOND;
            p.record(&open(now, 7));
            p.record(&read(now, 7, k * 65536));
        }
        let first = p.plan(now, &w.tiers, u64::MAX);
        assert_eq!(
            first.iter().map(|m| (m.object, m.to)).collect::<Vec<_>>(),
            vec![(7, 0)]
        );
        let later = if never_reported {
            // The mover dropped it without a word: taken as not done after the timeout.
            now + 121 * SECOND
        } else {
            // The mover could not do it and says where the object still is.
            p.placed(7, MIB, 1);
            now + SECOND
        };
        p.record(&open(later, 7));
        let again = p.plan(later, &w.tiers, u64::MAX);
        assert_eq!(
            again.iter().map(|m| (m.object, m.to)).collect::<Vec<_>>(),
            vec![(7, 0)],
            "never reported: {never_reported}; {}",
            p.explain(7, later)
        );
        let mut w = w;
        w.apply(&mut p, &again);
        let e = p.explain(7, later + SECOND);
        assert!(e.contains("tier 0"), "{e}");
    }
}

#[test]
fn the_mover_rate_is_a_token_bucket_and_an_idle_mover_takes_a_big_object() {
    let cfg = KaisoConfig {
        move_bytes_per_sec: 100 * MIB,
        max_plan_gap_secs: 20.0,
        promote_dwpd: 1000.0,
        // This test is about the mover's pace: the copy-cost rule (which would hold back
        // 1 GiB objects with 3 touches) is tested on its own.
        copy_bytes_per_touch: 0,
        ..KaisoConfig::default()
    };
    let mut p = KaisoPolicy::new(cfg).unwrap();
    // 1 GiB objects, far above the 400 MiB in-flight cap.
    let mut w = World::new(&mut p, &[20 << 30, 100 << 30], &[1 << 30; 10], 1);
    for k in 0..3 {
        for o in 0..10 {
            p.record(&read(k * 10 * SECOND + o, o, k * 8192));
        }
    }
    let mut now = 30 * SECOND;
    // A full bucket (2000 MiB) but one object at a time: the cap is below one object.
    let m = p.plan(now, &w.tiers, u64::MAX);
    assert_eq!(m.len(), 1);
    w.apply(&mut p, &m);
    let m = p.plan(now, &w.tiers, u64::MAX);
    assert_eq!(m.len(), 0, "976 MiB of tokens left: not enough for 1 GiB");
    now += 5 * SECOND;
    let m = p.plan(now, &w.tiers, u64::MAX);
    assert_eq!(m.len(), 1, "500 MiB more refilled");
    w.apply(&mut p, &m);
}

#[test]
fn time_scale_compresses_the_heat_clock() {
    let cfg = KaisoConfig {
        time_scale: 0.1,
        recency_weight: 0.0,
        ..KaisoConfig::default()
    };
    let mut p = KaisoPolicy::new(cfg).unwrap();
    assert_eq!(p.config().time_scale, 0.1, "config() shows what was given");
    p.record(&read(0, 1, 0));
    let s = p.score(1, 360 * SECOND).unwrap();
    assert!(
        (s - 0.5).abs() < 1e-6,
        "one 360 s half-life at scale 0.1: {s}"
    );
}

#[test]
fn a_cold_region_of_a_hot_file_unit_rises_with_it() {
    let mut p = KaisoPolicy::new(KaisoConfig {
        prefetch_share: 0.0,
        ..KaisoConfig::default()
    })
    .unwrap();
    let mut layout = RegionLayout::new(MIB).unwrap();
    for (i, chunk) in [4u64, 0, 2].iter().enumerate() {
        layout.insert(*chunk, 9, i as u64 * MIB).unwrap();
    }
    p.set_layout(layout);
    let mut w = World::new(&mut p, &[100 * MIB, 1000 * MIB], &[MIB; 6], 1);
    // Chunks 4 and 0 (file 9, unit 0) are hot; chunk 2 of the same unit is touched once,
    // like chunk 5, which belongs to no file.
    for k in 0..6 {
        p.record(&read(k * 5 * SECOND, 4, k * 8192));
        p.record(&read(k * 5 * SECOND, 0, k * 8192));
    }
    p.record(&read(30 * SECOND, 2, 0));
    p.record(&read(30 * SECOND, 5, 0));
    let moves = p.plan(31 * SECOND, &w.tiers, 100 * MIB);
    let mut promoted: Vec<ObjectId> = moves.iter().map(|m| m.object).collect();
    promoted.sort_unstable();
    assert_eq!(promoted, vec![0, 2, 4], "{moves:?}");
    w.apply(&mut p, &moves);
}

#[test]
fn heat_survives_a_snapshot_and_restore() {
    let mut a = KaisoPolicy::default();
    for k in 0..4 {
        a.record(&read(k * 10 * SECOND, 3, k * 8192));
    }
    let (heat, last) = a.heat_snapshot(3, 100 * SECOND).unwrap();
    assert!(heat > 3.9 && heat < 4.0, "{heat}");
    let mut b = KaisoPolicy::default();
    b.restore_heat(3, heat, 100 * SECOND);
    b.restore_heat(4, f64::NAN, 0);
    assert!(b.heat_snapshot(4, 0).is_none());
    let later = 1000 * SECOND;
    let (ha, hb) = (a.score(3, later).unwrap(), b.score(3, later).unwrap());
    assert!((ha - hb).abs() < 0.05, "{ha} vs {hb} (last access {last})");
}

#[test]
fn odd_inputs_do_not_panic() {
    let mut p = KaisoPolicy::default();
    let weird = [
        TierState {
            capacity: u64::MAX,
            used: u64::MAX,
            high_watermark: f64::NAN,
            low_watermark: 2.0,
            busy: f64::INFINITY,
        },
        TierState {
            capacity: 0,
            used: 10,
            high_watermark: -1.0,
            low_watermark: f64::NAN,
            busy: -3.0,
        },
    ];
    p.placed(1, u64::MAX, 1);
    p.placed(2, 5, 9);
    p.record(&read(u64::MAX, 1, u64::MAX));
    p.record(&read(0, 1, 0));
    p.record(&read(5, 2, 0));
    p.pin(3, Some(u8::MAX));
    let _ = p.place_new(u64::MAX, u64::MAX, &weird);
    let _ = p.plan(u64::MAX, &weird, u64::MAX);
    let _ = p.plan(0, &weird, 0);
    let _ = p.plan(1, &[], u64::MAX);
    let _ = p.explain(1, 0);
}

#[test]
fn a_hot_small_file_beats_a_warmer_huge_one_per_byte() {
    let mut p = KaisoPolicy::new(KaisoConfig {
        promote_dwpd: 100.0,
        // The ranking by heat per byte, without the copy-cost rule (tested on its own).
        copy_bytes_per_touch: 0,
        ..KaisoConfig::default()
    })
    .unwrap();
    // Room to the low watermark: 80 MiB, not enough for the 80 MiB file after a smaller one.
    let mut w = World::new(
        &mut p,
        &[100 * MIB, 1000 * MIB],
        &[80 * MIB, 4 * MIB, 30 * MIB],
        1,
    );
    for k in 0..8 {
        p.record(&read(k * 10 * SECOND, 0, k * 65536)); // 8 touches, 80 MiB
        if k < 4 {
            p.record(&read(k * 10 * SECOND, 1, k * 65536)); // 4 touches, 4 MiB
        }
        if k < 3 {
            p.record(&read(k * 10 * SECOND, 2, k * 65536)); // 3 touches, 30 MiB
        }
    }
    let moves = p.plan(80 * SECOND, &w.tiers, u64::MAX);
    let order: Vec<ObjectId> = moves.iter().map(|m| m.object).collect();
    // Per MiB: file 1 ≈ 1.1, file 2 ≈ 0.12, file 0 ≈ 0.11 (hottest in total, last here).
    assert_eq!(order, vec![1, 2], "by heat per byte; 80 MiB no longer fits");
    w.apply(&mut p, &moves);
}

#[test]
fn per_object_state_stays_compact() {
    assert_eq!(std::mem::size_of::<object::ObjectState>(), 40);
}

#[test]
fn a_big_region_needs_touches_that_pay_for_its_copy() {
    // Two 64 MiB regions touched 5 times each (random offsets, seconds apart): enough for
    // promote_min_heat, not for a 64 MiB copy at 1 MiB per touch. A 1 MiB object with the
    // same touches is promoted; with the rule off both regions are.
    let run = |copy_bytes_per_touch: u64| {
        let mut p = KaisoPolicy::new(KaisoConfig {
            copy_bytes_per_touch,
            ..KaisoConfig::default()
        })
        .unwrap();
        let sizes = [64 * MIB, 64 * MIB, MIB];
        let mut w = World::new(&mut p, &[1 << 30, 1 << 40], &sizes, 1);
        for k in 0..5u64 {
            for o in 0..3u64 {
                p.record(&read(k * 10 * SECOND, o, (k * 7 + 1) * 65536));
            }
        }
        let now = 60 * SECOND;
        let moves = p.plan(now, &w.tiers, u64::MAX);
        w.apply(&mut p, &moves);
        let mut promoted: Vec<u64> = moves
            .iter()
            .filter(|m| m.to == 0)
            .map(|m| m.object)
            .collect();
        promoted.sort_unstable();
        promoted
    };
    assert_eq!(run(1 << 20), vec![2]);
    assert_eq!(run(0), vec![0, 1, 2]);
}

/// Records `touches` separate touches of `object` spaced `gap` apart from `*now`.
fn touch(p: &mut KaisoPolicy, now: &mut Nanos, object: ObjectId, touches: u64, gap: Nanos) {
    for k in 0..touches {
        *now += gap;
        p.record(&read(*now, object, (k % 64) * 65536));
    }
}

#[test]
fn promotions_fill_to_the_high_watermark() {
    // 20 MiB fast tier, watermarks 0.8/0.95: 16 objects of 1 MiB at the low watermark,
    // 19 at the high one. 30 hot objects on the slow tier.
    let run = |to_high: bool, slow_busy: f64| {
        let mut p = KaisoPolicy::new(KaisoConfig {
            promote_to_high_watermark: to_high,
            ..KaisoConfig::default()
        })
        .unwrap();
        let sizes = vec![MIB; 40];
        let mut w = World::new(&mut p, &[20 * MIB, 1000 * MIB], &sizes, 1);
        for t in &mut w.tiers {
            t.low_watermark = 0.8;
            t.high_watermark = 0.95;
        }
        // Below spike relief's threshold (0.7), above pace_busy_start (0.5) or not.
        w.tiers[1].busy = slow_busy;
        let mut now = 0;
        for o in 0..30 {
            touch(&mut p, &mut now, o, 3, SECOND);
        }
        let moves = p.plan(now, &w.tiers, 1000 * MIB);
        assert!(moves.iter().all(|m| m.reason == MoveReason::Promote));
        w.apply(&mut p, &moves);
        w.tiers[0].used / MIB
    };
    assert_eq!(run(true, 0.0), 19, "filled to the high watermark");
    assert_eq!(run(false, 0.0), 16, "filled to the low watermark");
    assert_eq!(
        run(true, 0.6),
        16,
        "the band is filled only from a source with time to spare"
    );
}

#[test]
fn after_a_drain_promotions_fill_only_to_the_low_watermark() {
    // A fast tier pushed over its high watermark (by writes) is drained to its low
    // watermark; refilling it to the high one at once would drain it again on the next
    // write: a drain-refill cycle. Promotions wait min_residency before filling past low.
    let mut p = KaisoPolicy::default();
    let sizes = vec![MIB; 40];
    let mut w = World::new(&mut p, &[20 * MIB, 1000 * MIB], &sizes, 1);
    for t in &mut w.tiers {
        t.low_watermark = 0.8;
        t.high_watermark = 0.95;
    }
    // 20 objects on the fast tier (100 % > 95 %), warm; 10 hotter ones on the slow tier.
    for o in 0..20 {
        p.placed(o, MIB, 0);
        w.on[o as usize] = 0;
    }
    w.tiers[0].used = 20 * MIB;
    w.tiers[1].used = 20 * MIB;
    let mut now = 0;
    for o in 0..20 {
        touch(&mut p, &mut now, o, 2, SECOND);
    }
    for o in 20..30 {
        touch(&mut p, &mut now, o, 5, SECOND);
    }
    let moves = p.plan(now, &w.tiers, 1000 * MIB);
    w.apply(&mut p, &moves);
    assert!(
        moves
            .iter()
            .any(|m| m.reason == MoveReason::DemoteOverWatermark),
        "{moves:?}"
    );
    assert!(
        w.tiers[0].used <= 16 * MIB,
        "drained then refilled past the low watermark: {} MiB",
        w.tiers[0].used / MIB
    );
    // A minute later, still within min_residency: no refill past the low watermark.
    now += MINUTE;
    let moves = p.plan(now, &w.tiers, 1000 * MIB);
    w.apply(&mut p, &moves);
    assert!(w.tiers[0].used <= 16 * MIB);
    // After min_residency the band may be filled again by heat.
    now += 11 * MINUTE;
    for o in 20..30 {
        touch(&mut p, &mut now, o, 5, SECOND);
    }
    let moves = p.plan(now, &w.tiers, 1000 * MIB);
    w.apply(&mut p, &moves);
    assert_eq!(w.tiers[0].used, 19 * MIB, "{moves:?}");
}

#[test]
fn a_much_hotter_newcomer_displaces_a_cold_young_resident() {
    // A fresh fast tier is filled on a few touches per object; one minute later another
    // object has clearly been much hotter. It must not wait min_residency (10 minutes) to
    // take the place of the coldest young resident.
    let mut p = KaisoPolicy::default();
    let sizes = vec![MIB; 20];
    let mut w = World::new(&mut p, &[10 * MIB, 100 * MIB], &sizes, 1);
    let mut now = 0;
    for o in 0..9 {
        touch(&mut p, &mut now, o, 2 + o % 2, SECOND);
    }
    let moves = p.plan(now, &w.tiers, 100 * MIB);
    assert_eq!(moves.len(), 9, "filled to the high watermark (90 %)");
    w.apply(&mut p, &moves);
    // The residents keep their pace; object 15 is read 40 times in the next minute.
    for o in 0..9 {
        touch(&mut p, &mut now, o, 2 + o % 2, SECOND);
    }
    touch(&mut p, &mut now, 15, 40, SECOND);
    let moves = p.plan(now, &w.tiers, 100 * MIB);
    assert_eq!(moves.len(), 2, "{moves:?}");
    assert_eq!(moves[0].reason, MoveReason::Evict);
    let victim = moves[0].object;
    assert!(victim % 2 == 0, "the coldest resident goes: {victim}");
    assert_eq!(
        (moves[1].object, moves[1].reason),
        (15, MoveReason::Promote)
    );
    w.apply(&mut p, &moves);
    assert!(
        p.explain(victim, now).contains("min_residency"),
        "{}",
        p.explain(victim, now)
    );
    // The victim, now hotter than the newcomer, still cannot come straight back.
    touch(&mut p, &mut now, victim, 200, SECOND);
    let moves = p.plan(now, &w.tiers, 100 * MIB);
    assert!(moves.iter().all(|m| m.object != victim), "{moves:?}");
}

#[test]
fn a_young_resident_is_not_displaced_by_noise_or_a_small_lead() {
    let setup = || {
        let mut p = KaisoPolicy::default();
        let sizes = vec![MIB; 20];
        let mut w = World::new(&mut p, &[10 * MIB, 100 * MIB], &sizes, 1);
        let mut now = 0;
        for o in 0..9 {
            touch(&mut p, &mut now, o, 3, SECOND);
        }
        let moves = p.plan(now, &w.tiers, 100 * MIB);
        assert_eq!(moves.len(), 9);
        w.apply(&mut p, &moves);
        (p, w, now)
    };
    // Twice as hot as the residents' 3 touches, but 6 vs 3 is within counting noise.
    let (mut p, w, mut now) = setup();
    touch(&mut p, &mut now, 15, 6, SECOND);
    assert!(p.plan(now, &w.tiers, 100 * MIB).is_empty());
    // A clear lead but less than young_swap_ratio: residents at 30 touches, newcomer 50.
    let (mut p, w, mut now) = setup();
    for o in 0..9 {
        touch(&mut p, &mut now, o, 27, 100 * crate::time::MILLISECOND);
    }
    touch(&mut p, &mut now, 15, 50, 100 * crate::time::MILLISECOND);
    assert!(p.plan(now, &w.tiers, 100 * MIB).is_empty());
    // The rule can be turned off.
    let mut p = KaisoPolicy::new(KaisoConfig {
        young_swap_ratio: 0.0,
        ..KaisoConfig::default()
    })
    .unwrap();
    let sizes = vec![MIB; 20];
    let mut w = World::new(&mut p, &[10 * MIB, 100 * MIB], &sizes, 1);
    let mut now = 0;
    for o in 0..9 {
        touch(&mut p, &mut now, o, 2, SECOND);
    }
    let moves = p.plan(now, &w.tiers, 100 * MIB);
    w.apply(&mut p, &moves);
    touch(&mut p, &mut now, 15, 100, SECOND);
    assert!(p.plan(now, &w.tiers, 100 * MIB).is_empty());
    assert!(
        KaisoPolicy::new(KaisoConfig {
            young_swap_ratio: 0.5,
            ..KaisoConfig::default()
        })
        .is_err()
    );
}

#[test]
fn an_open_counts_as_much_as_an_open_and_a_read() {
    // A file served by kernel passthrough shows the policy its opens only; one served by
    // the daemon shows the open and the read. The same use must give the same heat.
    let mut p = KaisoPolicy::default();
    let mut now = 0;
    for k in 0..100u64 {
        now += 10 * crate::time::MILLISECOND;
        for (object, with_read) in [(1, false), (2, true)] {
            p.record(&open(now, object));
            if with_read {
                p.record(&read(now, object, (k * 7 % 16) * 65536));
            }
        }
    }
    let (a, b) = (p.score(1, now).unwrap(), p.score(2, now).unwrap());
    assert!((a - b).abs() < 1e-6, "opens only {a}, opens and reads {b}");
    assert!(a > 90.0, "rapid re-opens must count: {a}");
    // A sequential pass after one open is still one touch.
    p.record(&open(now, 3));
    for k in 0..100u64 {
        p.record(&read(now + k, 3, k * 4096));
    }
    assert!(p.score(3, now + 100).unwrap() < 1.6);
}
