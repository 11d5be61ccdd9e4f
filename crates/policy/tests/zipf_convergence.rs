//! The bench's tiering workload in miniature, driven through the policy alone: Zipf reads
//! (open, then a 64 KiB read the policy sees only on the slow tier: the fast tier's are
//! served by kernel passthrough) over 160 files of 1 MiB, a fast tier of 10 % (watermarks 0.8/0.95), everything starting
//! on the slow tier, a mover that completes one 1 MiB move per [`move_time`] and asks for a
//! plan every 500 ms when idle. After a 25 s warm-up the fast tier must hold the best
//! placement the high watermark allows: the 15 hottest files.

use kaiso_policy::cache::rng::SplitMix64;
use kaiso_policy::default_policy::{KaisoConfig, KaisoPolicy};
use kaiso_policy::time::{MICROSECOND, MILLISECOND, SECOND};
use kaiso_policy::{Access, Move, Nanos, Op, PlacementPolicy, TierState};
use std::collections::VecDeque;

const MIB: u64 = 1 << 20;
const FILES: usize = 160;
/// Service time of a read of a fast-tier file and of a slow-tier (emulated HDD) one.
const FAST_READ: Nanos = 70 * MICROSECOND;
const SLOW_READ: Nanos = 13 * MILLISECOND;
/// A background move of 1 MiB: its requests yield to foreground ones on the HDD (the
/// store's emulation yields up to 1 s per MiB), so it takes longer the busier the HDD.
fn move_time(hdd_busy: f64) -> Nanos {
    ((0.1 + hdd_busy.clamp(0.0, 1.0)) * SECOND as f64) as Nanos
}
const PLAN_EVERY: Nanos = 500 * MILLISECOND;

/// Cumulative Zipf(s) over ranks 0..n.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

/// Runs `warmup_secs` of the workload; returns the popularity ranks on the fast tier and
/// the number of moves completed.
fn run(cfg: KaisoConfig, s: f64, seed: u64, warmup_secs: u64) -> (Vec<usize>, usize) {
    let mut p = KaisoPolicy::new(cfg).unwrap();
    let mut rng = SplitMix64::new(seed);
    // Rank -> object id: a seeded permutation, so the hot objects are not the low ids.
    let mut ids: Vec<u64> = (0..FILES as u64).collect();
    for i in (1..FILES).rev() {
        ids.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut rank_of = vec![0usize; FILES];
    for (r, &id) in ids.iter().enumerate() {
        rank_of[id as usize] = r;
    }
    let cdf = zipf_cdf(FILES, s);
    let mut on = [1u8; FILES];
    for id in 0..FILES as u64 {
        p.placed(id, MIB, 1);
    }
    let mut tiers = [
        TierState {
            capacity: 16 * MIB,
            used: 0,
            high_watermark: 0.95,
            low_watermark: 0.8,
            busy: 0.0,
        },
        TierState {
            capacity: 1 << 40,
            used: FILES as u64 * MIB,
            high_watermark: 0.95,
            low_watermark: 0.8,
            busy: 1.0,
        },
    ];
    let mut queue: VecDeque<Move> = VecDeque::new();
    let mut move_done_at: Nanos = 0;
    let mut next_plan: Nanos = PLAN_EVERY;
    let mut moves = 0;
    let mut now: Nanos = 0;
    let (mut slow_busy, mut window_start) = (0u64, 0u64);
    let end = warmup_secs * SECOND;
    while now < end {
        // One read: open and a 64 KiB read at a random aligned offset.
        let u = rng.unit();
        let rank = cdf.partition_point(|c| *c < u).min(FILES - 1);
        let id = ids[rank];
        let off = (rng.next_u64() % 16) * 65536;
        p.record(&Access {
            at: now,
            object: id,
            op: Op::Open,
            offset: 0,
            len: 0,
        });
        // Reads of fast-tier files go through kernel passthrough: the policy sees the open.
        if on[id as usize] != 0 {
            p.record(&Access {
                at: now,
                object: id,
                op: Op::Read,
                offset: off,
                len: 65536,
            });
        }
        let cost = if on[id as usize] == 0 {
            FAST_READ
        } else {
            slow_busy += SLOW_READ;
            SLOW_READ
        };
        now += cost;
        // The mover: one move at a time, in plan order.
        while let Some(m) = queue.front().copied() {
            if now < move_done_at {
                break;
            }
            queue.pop_front();
            tiers[m.from as usize].used -= m.bytes;
            tiers[m.to as usize].used += m.bytes;
            assert!(tiers[m.to as usize].used <= tiers[m.to as usize].capacity);
            on[m.object as usize] = m.to;
            p.placed(m.object, m.bytes, m.to);
            moves += 1;
            move_done_at = now + move_time(tiers[1].busy);
        }
        if queue.is_empty() && now >= next_plan {
            let span = now.saturating_sub(window_start).max(1);
            tiers[1].busy = (slow_busy as f64 / span as f64).min(1.0);
            (slow_busy, window_start) = (0, now);
            queue.extend(p.plan(now, &tiers, 4096 * MIB));
            move_done_at = now + move_time(tiers[1].busy);
            next_plan = now + PLAN_EVERY;
        }
    }
    let mut fast: Vec<usize> = (0..FILES)
        .filter(|&id| on[id] == 0)
        .map(|id| rank_of[id])
        .collect();
    fast.sort_unstable();
    (fast, moves)
}

fn bench_config() -> KaisoConfig {
    // The bench's 16 MiB stand-in fast tier gets a budget above one fill a day.
    KaisoConfig {
        promote_dwpd: 100.0,
        ..KaisoConfig::default()
    }
}

#[test]
fn at_high_skew_the_fast_tier_converges_to_the_hottest_files() {
    let mut exact = 0;
    for seed in 1..=6 {
        let (fast, moves) = run(bench_config(), 3.0, seed, 25);
        // Ranks 12..15 draw 0.02-0.05 % of the reads each: tens of touches in 25 s, so
        // which of them (or 16, 17) is on the fast tier is partly chance; the top 11 is not.
        assert_eq!(fast.len(), 15, "seed {seed}: fast tier holds {fast:?}");
        assert!(
            (0..11).all(|r| fast.contains(&r)),
            "seed {seed}: the 11 hottest are not all on the fast tier: {fast:?} ({moves} moves)"
        );
        let hits = fast.iter().filter(|&&r| r < 15).count();
        assert!(hits >= 13, "seed {seed}: {fast:?}");
        exact += usize::from(hits == 15);
    }
    // Measured: 5 of 6 seeds end with exactly the 15 hottest (the sixth lacks rank 12).
    assert!(
        exact >= 4,
        "only {exact} of 6 seeds reached the best placement"
    );
}

/// At s = 1.1 the HDD stays busy and moves are slow: the files on the fast tier draw
/// 97.8-98.2 % of the best 15 files' share on these seeds (the rules before the
/// corrections: 91-93 %).
#[test]
fn at_moderate_skew_the_fast_tier_holds_most_of_the_best_share() {
    let cdf = zipf_cdf(FILES, 1.1);
    let mass = |r: usize| if r == 0 { cdf[0] } else { cdf[r] - cdf[r - 1] };
    for seed in 1..=3 {
        let (fast, _) = run(bench_config(), 1.1, seed, 25);
        let share: f64 = fast.iter().map(|&r| mass(r)).sum();
        let best = cdf[14];
        assert!(
            share >= 0.97 * best,
            "seed {seed}: share {share:.3} of best {best:.3}: {fast:?}"
        );
    }
}

#[test]
fn a_queue_sized_to_the_slow_mover_picks_the_hottest_files_first_time() {
    // Plans that queue only what the mover does in max_in_flight_secs decide on fresher
    // heat: the 15 moves of the fill are the only ones, and they take the top 12.
    let cfg = KaisoConfig {
        queue_by_mover_rate: true,
        ..bench_config()
    };
    for seed in 1..=6 {
        let (fast, moves) = run(cfg.clone(), 3.0, seed, 25);
        assert_eq!(moves, 15, "seed {seed}: {fast:?}");
        assert!((0..12).all(|r| fast.contains(&r)), "seed {seed}: {fast:?}");
    }
}

#[test]
fn without_the_corrections_an_early_wrong_pick_is_frozen() {
    // The behaviour before young_swap_ratio and the fill to the high watermark: the first
    // pick stays, so some seed ends without one of the 12 hottest files.
    let old = KaisoConfig {
        young_swap_ratio: 0.0,
        promote_to_high_watermark: false,
        ..bench_config()
    };
    let missed = (1..=6)
        .filter(|&seed| {
            let (fast, _) = run(old.clone(), 3.0, seed, 25);
            !(0..12).all(|r| fast.contains(&r))
        })
        .count();
    assert!(missed > 0, "the old rules found the top 12 on every seed");
}
