//! One planning pass of [`KaisoPolicy`]: drain tiers over their high watermark, relieve
//! spikes, promote hot objects (exchanging with much colder residents), prefetch the
//! file-contiguous neighbours of promoted regions.

use std::cmp::Ordering;

use super::object::{Decision, UNPLACED, secs};
use super::{IdMap, InFlight, KaisoPolicy};
use crate::engine::{Move, MoveReason, ObjectId, TierId, TierState};
use crate::time::Nanos;

/// First tier with room for `size` under its high watermark, else the first with room under
/// its hard capacity, else the tier with the most free bytes (the caller's allocation then
/// fails cleanly on a full system instead of the policy inventing room).
pub(super) fn place_new(size: u64, tiers: &[TierState]) -> TierId {
    if tiers.is_empty() {
        return 0;
    }
    let fits = |t: &TierState, limit: u64| t.used.saturating_add(size) <= limit;
    let pick = tiers
        .iter()
        .position(|t| fits(t, high_bytes(t)))
        .or_else(|| tiers.iter().position(|t| fits(t, t.capacity)))
        .unwrap_or_else(|| {
            let mut best = 0;
            for (i, t) in tiers.iter().enumerate() {
                let free = t.capacity.saturating_sub(t.used);
                if free > tiers[best].capacity.saturating_sub(tiers[best].used) {
                    best = i;
                }
            }
            best
        });
    pick.min(TierId::MAX as usize) as TierId
}

fn frac_bytes(capacity: u64, f: f64) -> u64 {
    let f = if f.is_finite() {
        f.clamp(0.0, 1.0)
    } else {
        1.0
    };
    ((capacity as f64) * f) as u64
}

fn high_bytes(t: &TierState) -> u64 {
    frac_bytes(t.capacity, t.high_watermark).min(t.capacity)
}

fn low_bytes(t: &TierState) -> u64 {
    frac_bytes(t.capacity, t.low_watermark.min(t.high_watermark)).min(high_bytes(t))
}

fn policy_spend_tokens(policy: &mut KaisoPolicy, spent: u64) {
    policy.move_tokens = (policy.move_tokens - spent as f64).max(0.0);
}

/// Touches an object of `size` bytes needs before its copy is likely to pay back
/// (`copy_bytes_per_touch`; 0 = no such requirement).
fn copy_touches(cfg: &super::KaisoConfig, size: u64) -> f64 {
    if cfg.copy_bytes_per_touch == 0 {
        0.0
    } else {
        size as f64 / cfg.copy_bytes_per_touch as f64
    }
}

/// Whether a candidate scoring `cand` leads a resident scoring `resident` by more than
/// `z` standard deviations of the difference of two Poisson touch counts (scores in
/// touches of `touch_weight`).
fn clear_of_noise(cand: f64, resident: f64, touch_weight: f64, z: f64) -> bool {
    let unit = if touch_weight > 0.0 {
        touch_weight
    } else {
        1.0
    };
    let (c, r) = (cand.max(0.0) / unit, resident.max(0.0) / unit);
    c - r > z * (c + r).sqrt()
}

/// Residents an exchange looks past (not cold enough) before giving up.
const EXCHANGE_SCAN: usize = 32;

fn merit_is_score_only(merit: Merit, on_rate: bool) -> bool {
    matches!(merit, Merit::Score) && !on_rate
}

/// What an exchange compares.
#[derive(Clone, Copy)]
enum Merit {
    Score,
    Rate,
}

/// Objects smaller than this rank as if they were this big: a tiny file is not worth
/// infinitely more per byte than a 1 MiB one (moves have a fixed cost too).
const DENSITY_FLOOR_BYTES: f64 = 1_048_576.0;

/// A placed, unpinned object as seen by this pass.
struct Cand {
    id: ObjectId,
    size: u64,
    tier: u8,
    score: f64,
    rate: f64,
    residency_ok: bool,
    moved: bool,
}

impl Cand {
    /// Heat per byte (per MiB, floored): what a byte of the faster tier earns by holding
    /// this object. Ranks promotions, drains and exchanges, so a hot small file beats a
    /// lukewarm huge one and draining sheds big cold objects first. Equal-size regions rank
    /// exactly as by score.
    fn density(&self) -> f64 {
        self.score / (self.size as f64).max(DENSITY_FLOOR_BYTES) * DENSITY_FLOOR_BYTES
    }
}

pub(super) struct Planner<'a> {
    policy: &'a mut KaisoPolicy,
    now: Nanos,
    tiers: &'a [TierState],
    /// This pass's byte budget: `max_bytes`, capped by `move_bytes_per_sec` over the time
    /// since the previous plan.
    max_bytes: u64,
    /// Bytes the mover's queue may take in this pass ([`KaisoPolicy::slow_mover_cap`]).
    queue_room: u64,
    used: Vec<u64>,
    spent: u64,
    cands: Vec<Cand>,
    index: IdMap<usize>,
    /// Per tier, its objects at the start of the pass, coldest first (built on first use).
    cold: Vec<Option<Vec<usize>>>,
    prefetch_spent: u64,
    moves: Vec<Move>,
}

impl<'a> Planner<'a> {
    pub(super) fn run(
        policy: &'a mut KaisoPolicy,
        now: Nanos,
        tiers: &'a [TierState],
        max_bytes: u64,
    ) -> Vec<Move> {
        let ntiers = tiers.len().min(UNPLACED as usize);
        let tiers = &tiers[..ntiers];
        let mut used: Vec<u64> = tiers.iter().map(|t| t.used).collect();
        let in_flight = policy.reserve_in_flight(now, &mut used);
        let tokens = policy.refill_move_tokens(now);
        let slow_cap = policy.slow_mover_cap();
        let queue_full = in_flight > 0
            && (in_flight >= policy.in_flight_limit() || slow_cap.is_some_and(|c| in_flight >= c));
        if tiers.len() < 2 || max_bytes == 0 || tokens == 0 || queue_full {
            return Vec::new();
        }
        let mut cands = Vec::new();
        for (&id, s) in &policy.objects {
            if s.tier == UNPLACED
                || s.pinned()
                || usize::from(s.tier) >= ntiers
                || policy.in_flight.contains_key(&id)
            {
                continue;
            }
            cands.push(Cand {
                id,
                size: s.size,
                tier: s.tier,
                score: policy.score_of(s, now),
                rate: policy.rate_of(s, now),
                residency_ok: policy.residency_ok(s, now),
                moved: false,
            });
        }
        // The queue of moves in flight is capped, but an idle mover may always take one
        // object, however large (1 GiB segments with a 512 MiB cap).
        let largest = cands.iter().map(|c| c.size).max().unwrap_or(0);
        let limit = policy.in_flight_limit();
        let room = if in_flight == 0 {
            limit.max(largest)
        } else {
            limit.saturating_sub(in_flight)
        };
        let max_bytes = max_bytes.min(tokens).min(room);
        if max_bytes == 0 {
            return Vec::new();
        }
        // A slow mover's queue holds what it does in max_in_flight_secs (an idle one still
        // takes the largest object), whatever the pacing allows.
        let queue_room = match slow_cap {
            Some(c) if in_flight == 0 => c.max(largest),
            Some(c) => c.saturating_sub(in_flight),
            None => u64::MAX,
        };
        // Id order first: every later sort is stable, so ties always break by id.
        cands.sort_unstable_by_key(|c| c.id);
        policy.pool_unit_heat(&mut cands);
        let index = cands.iter().enumerate().map(|(i, c)| (c.id, i)).collect();
        let mut p = Planner {
            policy,
            now,
            tiers,
            max_bytes,
            queue_room,
            used,
            spent: 0,
            cands,
            index,
            cold: (0..ntiers).map(|_| None).collect(),
            prefetch_spent: 0,
            moves: Vec::new(),
        };
        p.drain_over_high_watermark();
        p.relieve_spikes();
        p.promote_hot();
        let spent = p.spent;
        policy_spend_tokens(p.policy, spent);
        p.moves
    }

    fn busy(&self, t: usize) -> f64 {
        self.tiers[t].busy
    }

    /// Room left in this plan's byte budget for a move paced at `pace`.
    fn allowance(&self, pace: f64) -> u64 {
        ((self.max_bytes as f64) * pace) as u64
    }

    fn fits_budget(&self, bytes: u64, pace: f64) -> bool {
        self.spent.saturating_add(bytes) <= self.allowance(pace).min(self.queue_room)
    }

    /// Takes tier `t`'s list of objects at the start of the pass, coldest first, recently
    /// moved ones last (drained only if nothing else can go); entries already moved by this
    /// pass are dropped from the front. Give it back with `put_cold`.
    fn take_cold(&mut self, t: usize) -> Vec<usize> {
        let mut v = match self.cold[t].take() {
            Some(v) => v,
            None => {
                let mut v: Vec<usize> = (0..self.cands.len())
                    .filter(|&i| usize::from(self.cands[i].tier) == t)
                    .collect();
                v.sort_by(|&a, &b| {
                    let (ca, cb) = (&self.cands[a], &self.cands[b]);
                    cb.residency_ok
                        .cmp(&ca.residency_ok)
                        .then(ca.density().total_cmp(&cb.density()))
                });
                v
            }
        };
        let skip = v.iter().take_while(|&&i| self.cands[i].moved).count();
        v.drain(..skip);
        v
    }

    fn put_cold(&mut self, t: usize, v: Vec<usize>) {
        self.cold[t] = Some(v);
    }

    /// A slower tier than `t` with room for `size`: under its high watermark if possible,
    /// else under its hard capacity.
    fn room_below(&self, t: usize, size: u64) -> Option<usize> {
        let n = self.tiers.len();
        let fits = |d: usize, limit: u64| self.used[d].saturating_add(size) <= limit;
        (t + 1..n)
            .find(|&d| fits(d, high_bytes(&self.tiers[d])))
            .or_else(|| (t + 1..n).find(|&d| fits(d, self.tiers[d].capacity)))
    }

    fn commit(&mut self, i: usize, to: usize, reason: MoveReason, decision: Decision) {
        let c = &mut self.cands[i];
        let from = usize::from(c.tier);
        self.used[from] = self.used[from].saturating_sub(c.size);
        self.used[to] = self.used[to].saturating_add(c.size);
        self.spent = self.spent.saturating_add(c.size);
        c.moved = true;
        self.moves.push(Move {
            object: c.id,
            from: c.tier,
            to: to as TierId,
            bytes: c.size,
            reason,
        });
        if let Some(b) = self.policy.buckets.get_mut(to).filter(|_| to < from) {
            b.tokens -= c.size as f64;
        }
        let moved_at = secs(self.now).saturating_add(1);
        let mut prev_move_secs = 0;
        if let Some(s) = self.policy.objects.get_mut(&c.id) {
            s.decision = decision;
            prev_move_secs = s.last_move_secs;
            s.last_move_secs = moved_at;
        }
        self.policy.in_flight.insert(
            c.id,
            InFlight {
                from: from as TierId,
                to: to as TierId,
                bytes: c.size,
                at: self.now,
                prev_move_secs,
            },
        );
    }

    fn note(&mut self, i: usize, decision: Decision) {
        if let Some(s) = self.policy.objects.get_mut(&self.cands[i].id) {
            s.decision = decision;
        }
    }

    /// Watermarks: any tier above its high watermark sheds its coldest objects to slower
    /// tiers until it is at its low watermark. Fastest first, so cascades settle in one pass.
    fn drain_over_high_watermark(&mut self) {
        let n = self.tiers.len();
        for t in 0..n - 1 {
            if self.used[t] <= high_bytes(&self.tiers[t]) {
                continue;
            }
            let low = low_bytes(&self.tiers[t]);
            let cold = self.take_cold(t);
            for &i in &cold {
                if self.used[t] <= low {
                    break;
                }
                let size = self.cands[i].size;
                let Some(d) = self.room_below(t, size) else {
                    continue;
                };
                let pace = self.policy.pace(self.busy(t).max(self.busy(d)));
                if !self.fits_budget(size, pace) {
                    continue;
                }
                if self.cands[i].moved {
                    continue;
                }
                self.commit(i, d, MoveReason::DemoteOverWatermark, Decision::Demoted);
                self.policy.note_drained(t, self.now);
            }
            self.put_cold(t, cold);
        }
    }

    /// The 002 rule inside the default policy: a slower tier busier than `spike_util_high`
    /// sends its highest-rate objects up until the predicted utilisation (`%util per
    /// touch-rate`) falls to `spike_util_target`. Spike promotions may fill the faster tier up
    /// to its high watermark (not just the low one) and are paced by the destination only,
    /// since they unload the busy source.
    fn relieve_spikes(&mut self) {
        let n = self.tiers.len();
        let cfg = self.policy.cfg.clone();
        for s in 1..n {
            let busy = self.busy(s);
            if busy.is_nan() || busy <= cfg.spike_util_high {
                continue;
            }
            let total_rate: f64 = self
                .cands
                .iter()
                .filter(|c| usize::from(c.tier) == s)
                .map(|c| c.rate)
                .sum::<f64>()
                + self.policy.pinned_rate_on(s, self.now);
            if total_rate <= 0.0 {
                continue;
            }
            let util_per_rate = busy / total_rate;
            let mut hot: Vec<usize> = (0..self.cands.len())
                .filter(|&i| {
                    let c = &self.cands[i];
                    usize::from(c.tier) == s
                        && !c.moved
                        && c.rate >= cfg.spike_min_rate.max(copy_touches(&cfg, c.size))
                })
                .collect();
            hot.sort_by(|&a, &b| {
                self.cands[b]
                    .rate
                    .partial_cmp(&self.cands[a].rate)
                    .unwrap_or(Ordering::Equal)
            });
            let mut predicted = busy;
            for i in hot {
                if predicted <= cfg.spike_util_target {
                    break;
                }
                let rate = self.cands[i].rate;
                let moved = (0..s).find(|&t| {
                    let limit = high_bytes(&self.tiers[t]);
                    let pace = self.policy.pace(self.busy(t));
                    self.try_promote(
                        i,
                        t,
                        limit,
                        pace,
                        Merit::Rate,
                        MoveReason::Spike,
                        Decision::SpikePromoted,
                    )
                });
                if let Some(t) = moved {
                    predicted -= rate * util_per_rate;
                    self.prefetch_unit_of(i, t);
                }
            }
        }
    }

    /// Objects scoring at least `promote_min_heat` on slower tiers move up, hottest first,
    /// filling each faster tier to its fill limit ([`KaisoPolicy::fill_limit`]: the high
    /// watermark, or the low one) and beyond that only by exchange with residents
    /// `swap_ratio` times colder (`young_swap_ratio` for residents moved recently).
    fn promote_hot(&mut self) {
        let n = self.tiers.len();
        let min_heat = self.policy.cfg.promote_min_heat;
        for t in 0..n - 1 {
            let mut hot: Vec<usize> = (0..self.cands.len())
                .filter(|&i| {
                    let c = &self.cands[i];
                    usize::from(c.tier) > t
                        && !c.moved
                        && c.score >= min_heat.max(copy_touches(&self.policy.cfg, c.size))
                })
                .collect();
            hot.sort_by(|&a, &b| self.cands[b].density().total_cmp(&self.cands[a].density()));
            let fill = self.policy.fill_limit(t, &self.tiers[t], self.now);
            let low = low_bytes(&self.tiers[t]);
            let spare = self.policy.cfg.pace_busy_start;
            let mut misses = 0;
            for i in hot {
                if self.spent >= self.max_bytes.min(self.queue_room) || misses >= 64 {
                    break;
                }
                let src = usize::from(self.cands[i].tier);
                let pace = self.policy.pace(self.busy(t).max(self.busy(src)));
                // The band above the low watermark is filled only from a source with time
                // to spare: on a saturated device the copy costs its users more than the
                // band's lukewarm objects give back.
                let limit = if self.busy(src) <= spare { fill } else { low };
                if self.try_promote(
                    i,
                    t,
                    limit,
                    pace,
                    Merit::Score,
                    MoveReason::Promote,
                    Decision::Promoted,
                ) {
                    misses = 0;
                    self.prefetch_unit_of(i, t);
                } else {
                    misses += 1;
                }
            }
        }
    }

    /// Layout-aware prefetch: the rest of a promoted region's cache unit follows it, within
    /// `prefetch_share` of the plan budget, into free room only (never by exchange).
    fn prefetch_unit_of(&mut self, i: usize, t: usize) {
        let cfg = &self.policy.cfg;
        let n = u64::from(cfg.prefetch_unit_regions);
        let share = cfg.prefetch_share;
        let Some(layout) = self.policy.layout.as_ref() else {
            return;
        };
        if n <= 1 {
            return;
        }
        let unit = layout.unit_of(self.cands[i].id, n);
        let limit = low_bytes(&self.tiers[t]);
        for id in unit {
            let Some(&j) = self.index.get(&id) else {
                continue;
            };
            let c = &self.cands[j];
            if c.moved || usize::from(c.tier) <= t || !c.residency_ok {
                continue;
            }
            let size = c.size;
            if self.used[t].saturating_add(size) > limit {
                return;
            }
            let src = usize::from(c.tier);
            let pace = self.policy.pace(self.busy(t).max(self.busy(src)));
            let share_bytes = self.allowance(pace * share);
            if self.prefetch_spent.saturating_add(size) > share_bytes
                || self.spent.saturating_add(size) > self.max_bytes.min(self.queue_room)
            {
                return;
            }
            if !self.has_tokens(t, size) {
                return;
            }
            self.prefetch_spent += size;
            self.commit(j, t, MoveReason::Prefetch, Decision::Prefetched);
        }
    }

    fn has_tokens(&self, t: usize, size: u64) -> bool {
        self.policy
            .buckets
            .get(t)
            .is_none_or(|b| b.tokens >= size as f64)
    }

    /// Moves candidate `i` up to tier `t`, into free room up to `limit` bytes or by exchange
    /// with colder residents. All-or-nothing: either every move of the exchange is planned or
    /// none is.
    /// Exchanges compare `merit`: the score for heat promotions, the spike rate for spike
    /// relief (a spike must be able to displace yesterday's heat).
    #[allow(clippy::too_many_arguments)]
    fn try_promote(
        &mut self,
        i: usize,
        t: usize,
        limit: u64,
        pace: f64,
        merit: Merit,
        reason: MoveReason,
        decision: Decision,
    ) -> bool {
        let c = &self.cands[i];
        if c.moved || usize::from(c.tier) <= t {
            return false;
        }
        if !c.residency_ok {
            self.note(i, Decision::HeldResidency);
            return false;
        }
        let size = c.size;
        let (c_density, c_rate) = (c.density(), c.rate);
        if !self.has_tokens(t, size) {
            self.note(i, Decision::HeldBudget);
            return false;
        }
        if !self.fits_budget(size, pace) {
            return false;
        }
        let high = high_bytes(&self.tiers[t]);
        if self.used[t].saturating_add(size) <= limit.min(high) {
            self.commit(i, t, reason, decision);
            return true;
        }
        // Exchange: evict residents at least swap_ratio times colder until the candidate
        // fits without raising the tier above max(limit, its current use).
        let target = limit.max(self.used[t]).min(high);
        let ratio = self.policy.cfg.swap_ratio;
        let min_rate = self.policy.cfg.spike_min_rate;
        let on_rate = self.policy.cfg.exchange_on_rate;
        // The candidate displaces a resident `ratio` times colder by long-term score, or,
        // when `exchange_on_rate`, by short-term rate if the candidate is busy now: a shift
        // of the working set need not wait for yesterday's heat to decay.
        let beats = |v: &Cand| match merit {
            Merit::Rate => v.rate * ratio + min_rate <= c_rate,
            Merit::Score => {
                v.density() * ratio <= c_density
                    || (on_rate && c_rate >= min_rate && v.rate * ratio <= c_rate)
            }
        };
        // A resident moved within min_residency is displaced only by heat, by a candidate
        // young_swap_ratio times hotter whose lead is clear of counting noise.
        let young_ratio = self.policy.cfg.young_swap_ratio;
        let touch = self.policy.cfg.touch_weight;
        let z = self.policy.cfg.exchange_confidence;
        let c_score = c.score;
        let beats_young = |v: &Cand| {
            matches!(merit, Merit::Score)
                && young_ratio >= 1.0
                && v.density() * young_ratio <= c_density
                && clear_of_noise(c_score, v.score, touch, z)
        };
        let mut skipped = 0;
        let mut victims = Vec::new();
        let mut freed = 0u64;
        let mut extra_below: Vec<(usize, u64)> = Vec::new();
        let mut bytes = size;
        let cold = self.take_cold(t);
        for &v in &cold {
            if self.used[t].saturating_sub(freed).saturating_add(size) <= target {
                break;
            }
            let vc = &self.cands[v];
            if vc.moved {
                continue;
            }
            let young = !vc.residency_ok;
            if young && !beats_young(vc) {
                // Young residents come last, coldest first: none further can be beaten.
                break;
            }
            if !young && !beats(vc) {
                // Coldest first by score; a few hotter-by-score residents may still be idle now.
                skipped += 1;
                if skipped > EXCHANGE_SCAN || merit_is_score_only(merit, on_rate) {
                    break;
                }
                continue;
            }
            // Find room below for the victim, counting victims already chosen.
            let vsize = vc.size;
            let dest = (t + 1..self.tiers.len()).find(|&d| {
                let pending: u64 = extra_below.iter().filter(|e| e.0 == d).map(|e| e.1).sum();
                self.used[d].saturating_add(pending).saturating_add(vsize) <= self.tiers[d].capacity
            });
            let Some(d) = dest else {
                break;
            };
            bytes = bytes.saturating_add(vsize);
            extra_below.push((d, vsize));
            victims.push((v, d, young));
            freed = freed.saturating_add(vsize);
        }
        self.put_cold(t, cold);
        if self.used[t].saturating_sub(freed).saturating_add(size) > target
            || !self.fits_budget(bytes, pace)
        {
            self.note(i, Decision::HeldNoRoom);
            return false;
        }
        for (v, d, young) in victims {
            let decision = if young {
                Decision::EvictedYoung
            } else {
                Decision::Evicted
            };
            self.commit(v, d, MoveReason::Evict, decision);
        }
        self.commit(i, t, reason, decision);
        true
    }
}

impl KaisoPolicy {
    /// With a layout, blends each region's score and rate with its cache unit's mean
    /// (`unit_heat_weight`): a few IOs per region are a noisy estimate, the unit of
    /// file-contiguous regions pools them (the ch.3 ranking by unit frequency), and the
    /// untouched regions of a hot unit rise with it (prefetch through ordinary promotion).
    fn pool_unit_heat(&self, cands: &mut [Cand]) {
        let w = self.cfg.unit_heat_weight;
        let n = u64::from(self.cfg.prefetch_unit_regions);
        let Some(layout) = self.layout.as_ref() else {
            return;
        };
        if w <= 0.0 || n <= 1 {
            return;
        }
        let key = |id: ObjectId| layout.locate(id).map(|p| (p.file, p.index / n));
        let mut units: std::collections::HashMap<(u64, u64), (f64, f64, u32)> =
            std::collections::HashMap::new();
        for c in cands.iter() {
            if let Some(k) = key(c.id) {
                let e = units.entry(k).or_default();
                e.0 += c.score;
                e.1 += c.rate;
                e.2 += 1;
            }
        }
        for c in cands.iter_mut() {
            if let Some(&(score, rate, count)) = key(c.id).and_then(|k| units.get(&k)) {
                let count = f64::from(count.max(1));
                c.score = (1.0 - w) * c.score + w * score / count;
                c.rate = (1.0 - w) * c.rate + w * rate / count;
            }
        }
    }

    /// Drops in-flight moves older than `in_flight_timeout_secs` (the caller dropped them),
    /// projects the others as done (the caller carries moves out in plan order, so a move
    /// planned after them finds their room), and returns their total bytes.
    fn reserve_in_flight(&mut self, now: Nanos, used: &mut [u64]) -> u64 {
        let timeout = (self.cfg.in_flight_timeout_secs * 1e9) as Nanos;
        let objects = &mut self.objects;
        // A move never reported is taken as not done: its object is not young because of it.
        self.in_flight.retain(|id, m| {
            let live = now.saturating_sub(m.at) < timeout;
            if !live {
                m.undo(*id, objects);
            }
            live
        });
        let mut total = 0u64;
        for m in self.in_flight.values() {
            if let Some(u) = used.get_mut(usize::from(m.from)) {
                *u = u.saturating_sub(m.bytes);
            }
            if let Some(u) = used.get_mut(usize::from(m.to)) {
                *u = u.saturating_add(m.bytes);
            }
            total = total.saturating_add(m.bytes);
        }
        total
    }

    /// Remembers that a plan at `now` drained tier `t` over its high watermark.
    fn note_drained(&mut self, t: usize, now: Nanos) {
        if self.drained_at.len() <= t {
            self.drained_at.resize(t + 1, None);
        }
        self.drained_at[t] = Some(now);
    }

    /// Bytes of tier `t` that heat promotions may fill with free room: its high watermark
    /// (`promote_to_high_watermark`) unless a plan drained it within `min_residency_secs`,
    /// else its low watermark.
    fn fill_limit(&self, t: usize, tier: &TierState, now: Nanos) -> u64 {
        let hold = (self.cfg.min_residency_secs * 1e9) as Nanos;
        let drained_recently = self
            .drained_at
            .get(t)
            .copied()
            .flatten()
            .is_some_and(|at| now.saturating_sub(at) < hold);
        if self.cfg.promote_to_high_watermark && !drained_recently {
            high_bytes(tier)
        } else {
            low_bytes(tier)
        }
    }

    /// Bytes that may be in flight at once: `max_in_flight_secs` of `move_bytes_per_sec`.
    fn in_flight_limit(&self) -> u64 {
        if self.cfg.move_bytes_per_sec == 0 {
            return u64::MAX;
        }
        (self.cfg.move_bytes_per_sec as f64 * self.cfg.max_in_flight_secs) as u64
    }

    /// With `queue_by_mover_rate`: `max_in_flight_secs` of the mover's observed
    /// throughput, when that is less than half of `move_bytes_per_sec` (None otherwise).
    /// A mover yielding to a busy HDD may do 1 MiB/s: a plan queueing
    /// `move_bytes_per_sec`' worth would be carried out on heat tens of seconds stale,
    /// while the plans after it would know better.
    fn slow_mover_cap(&self) -> Option<u64> {
        let configured = self.cfg.move_bytes_per_sec as f64;
        match self.mover_rate {
            Some(r) if self.cfg.queue_by_mover_rate && configured > 0.0 && r < 0.5 * configured => {
                Some((r * self.cfg.max_in_flight_secs) as u64)
            }
            _ => None,
        }
    }

    /// Refills the mover's token bucket at `move_bytes_per_sec` (holding at most
    /// `max_plan_gap_secs` of it; full at the first plan) and returns the tokens.
    fn refill_move_tokens(&mut self, now: Nanos) -> u64 {
        let rate = self.cfg.move_bytes_per_sec as f64;
        let cap = rate * self.cfg.max_plan_gap_secs;
        self.move_tokens = match self.last_plan {
            Some(t) => (self.move_tokens + rate * now.saturating_sub(t) as f64 / 1e9).min(cap),
            None => cap,
        };
        self.last_plan = Some(self.last_plan.map_or(now, |t| t.max(now)));
        if self.cfg.move_bytes_per_sec == 0 {
            return u64::MAX;
        }
        self.move_tokens as u64
    }

    /// Spike rate of pinned objects on tier `t`: they load the tier but cannot move.
    fn pinned_rate_on(&self, t: usize, now: Nanos) -> f64 {
        self.objects
            .values()
            .filter(|s| s.pinned() && usize::from(s.tier) == t)
            .map(|s| self.rate_of(s, now))
            .sum()
    }
}
