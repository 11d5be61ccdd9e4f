//! kaiso's default placement policy: frequency + recency heat, watermarks, exchange with
//! hysteresis, spike reaction (the 002 rule's thresholds), a flash write budget, scan
//! resistance and pacing against foreground load.
//!
//! The user-facing description of every rule and parameter is docs/policy-default.md.
//!
//! Per object the policy keeps 40 bytes ([`object::ObjectState`]): two decayed touch counters
//! (a long one for heat and a short one for spike rate) stored as of the last access and
//! decayed lazily when read, so time passing costs nothing until an object is looked at.

mod config;
mod object;
mod planner;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

pub use config::{ConfigError, KaisoConfig};
use object::{JUST_OPENED, NO_PIN, ObjectState, UNPLACED, decay, secs};

use crate::engine::{Access, Move, ObjectId, Op, PlacementPolicy, TierId, TierState};
use crate::prefetch::RegionLayout;
use crate::time::Nanos;

/// A fast, deterministic hasher for object ids (no per-process random seed, so two runs
/// of the same calls give the same answers even before sorting).
#[derive(Default, Clone, Copy)]
pub(crate) struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing mixes sequential ids across the whole table.
        self.0 = (self.0 ^ n)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .rotate_left(29);
    }
}

pub(crate) type IdMap<V> = HashMap<ObjectId, V, std::hash::BuildHasherDefault<IdHasher>>;

/// Flash write budget of one destination tier: a token bucket in bytes.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    last_refill: Nanos,
}

/// A move handed out and not yet reported done through `placed`.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    from: TierId,
    to: TierId,
    bytes: u64,
    at: Nanos,
    /// The object's `last_move_secs` before this move was planned: restored if the move
    /// does not happen.
    prev_move_secs: u32,
}

impl InFlight {
    /// Takes the move of `object` as not done: if the object is still where it was, its
    /// previous move date is back.
    fn undo(&self, object: ObjectId, objects: &mut IdMap<ObjectState>) {
        if let Some(s) = objects.get_mut(&object).filter(|s| s.tier == self.from) {
            s.last_move_secs = self.prev_move_secs;
        }
    }
}

/// kaiso's default [`PlacementPolicy`]. Deterministic; `record` is O(1).
pub struct KaisoPolicy {
    /// The configuration as given.
    user_cfg: KaisoConfig,
    /// The configuration in effect: `time_scale` applied to the workload-time constants.
    cfg: KaisoConfig,
    objects: IdMap<ObjectState>,
    buckets: Vec<Bucket>,
    /// Latest time seen in any call; dates `placed` (which carries no time).
    clock: Nanos,
    /// Time of the previous plan (for `move_bytes_per_sec`).
    last_plan: Option<Nanos>,
    /// The mover's token bucket in bytes (`move_bytes_per_sec`).
    move_tokens: f64,
    in_flight: IdMap<InFlight>,
    layout: Option<RegionLayout>,
    /// Per tier, when a plan last drained it over its high watermark (promotions then fill
    /// it only to its low watermark for `min_residency_secs`).
    drained_at: Vec<Option<Nanos>>,
    /// The mover's observed throughput in bytes/s (moving average over completed moves),
    /// and when the last planned move was reported done.
    mover_rate: Option<f64>,
    last_move_done: Nanos,
    /// Moves reported done at the same time form one batch: its start, bytes, and the
    /// average before it.
    batch: (Nanos, u64, Option<f64>),
}

impl Default for KaisoPolicy {
    fn default() -> Self {
        Self::with_valid_config(KaisoConfig::default())
    }
}

impl KaisoPolicy {
    /// A policy with `cfg`, or an error naming the first out-of-range field.
    pub fn new(cfg: KaisoConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        Ok(Self::with_valid_config(cfg))
    }

    fn with_valid_config(cfg: KaisoConfig) -> Self {
        Self {
            user_cfg: cfg.clone(),
            cfg: cfg.scaled(),
            objects: IdMap::default(),
            buckets: Vec::new(),
            clock: 0,
            last_plan: None,
            move_tokens: 0.0,
            in_flight: IdMap::default(),
            layout: None,
            drained_at: Vec::new(),
            mover_rate: None,
            last_move_done: 0,
            batch: (0, 0, None),
        }
    }

    /// The configuration as given (before `time_scale` is applied).
    pub fn config(&self) -> &KaisoConfig {
        &self.user_cfg
    }

    /// Objects are regions of files laid out as `layout` says: promotions then bring the
    /// file-contiguous rest of each hot region's cache unit along (the ch.3 idea).
    pub fn set_layout(&mut self, layout: RegionLayout) {
        self.layout = Some(layout);
    }

    /// Number of objects the policy holds state for.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// The object's decayed touch count at `now` (heat without the recency term) and the
    /// time of its last access, for a caller that persists heat across restarts.
    pub fn heat_snapshot(&self, object: ObjectId, now: Nanos) -> Option<(f64, Nanos)> {
        let s = self.objects.get(&object).filter(|s| s.touched)?;
        let age = now.saturating_sub(s.last_access);
        Some((
            f64::from(s.heat) * decay(age, self.cfg.heat_half_life_secs),
            s.last_access,
        ))
    }

    /// Restores heat saved by [`Self::heat_snapshot`]: `heat` touches as of time `at` (the
    /// snapshot's `now`, or the saved last access with the heat decayed to it). The spike
    /// rate starts at zero (a restart is not a spike). Non-finite or negative heat is ignored.
    pub fn restore_heat(&mut self, object: ObjectId, heat: f64, at: Nanos) {
        let last_access = at;
        if !(heat.is_finite() && heat >= 0.0) {
            return;
        }
        self.observe_time(last_access);
        let s = self.objects.entry(object).or_insert_with(ObjectState::new);
        s.heat = heat.min(f64::from(f32::MAX)) as f32;
        s.rate = 0.0;
        s.last_access = last_access;
        s.touched = true;
    }

    /// The object's score at `now` (decayed heat plus recency), or None if unknown.
    pub fn score(&self, object: ObjectId, now: Nanos) -> Option<f64> {
        self.objects.get(&object).map(|s| self.score_of(s, now))
    }

    fn score_of(&self, s: &ObjectState, now: Nanos) -> f64 {
        if !s.touched {
            return 0.0;
        }
        let age = now.saturating_sub(s.last_access);
        f64::from(s.heat) * decay(age, self.cfg.heat_half_life_secs)
            + self.cfg.recency_weight * decay(age, self.cfg.recency_half_life_secs)
    }

    fn rate_of(&self, s: &ObjectState, now: Nanos) -> f64 {
        if !s.touched {
            return 0.0;
        }
        let age = now.saturating_sub(s.last_access);
        f64::from(s.rate) * decay(age, self.cfg.spike_half_life_secs)
    }

    fn residency_ok(&self, s: &ObjectState, now: Nanos) -> bool {
        s.last_move_secs == 0
            || f64::from(secs(now).saturating_add(1).saturating_sub(s.last_move_secs))
                >= self.cfg.min_residency_secs
    }

    /// Share of `max_bytes` usable by a move whose busier device is `busy` utilised.
    fn pace(&self, busy: f64) -> f64 {
        let c = &self.cfg;
        let busy = if busy.is_finite() {
            busy.clamp(0.0, 1.0)
        } else {
            1.0
        };
        if busy <= c.pace_busy_start {
            1.0
        } else if busy >= c.pace_busy_stop {
            c.pace_floor
        } else {
            let t = (busy - c.pace_busy_start) / (c.pace_busy_stop - c.pace_busy_start);
            (1.0 - t * (1.0 - c.pace_floor)).max(c.pace_floor)
        }
    }

    fn budget_per_day(&self, tier: &TierState) -> f64 {
        if self.cfg.promote_bytes_per_day > 0 {
            self.cfg.promote_bytes_per_day as f64
        } else {
            self.cfg.promote_dwpd * tier.capacity as f64
        }
    }

    fn refill_buckets(&mut self, now: Nanos, tiers: &[TierState]) {
        const DAY_SECS: f64 = 86_400.0;
        for (i, t) in tiers.iter().enumerate() {
            let per_day = self.budget_per_day(t);
            let cap = per_day * self.cfg.promote_burst_fraction;
            if i >= self.buckets.len() {
                self.buckets.push(Bucket {
                    tokens: cap,
                    last_refill: now,
                });
                continue;
            }
            let b = &mut self.buckets[i];
            let elapsed = now.saturating_sub(b.last_refill) as f64 / 1e9;
            b.tokens = (b.tokens + per_day * elapsed / DAY_SECS).min(cap);
            b.last_refill = b.last_refill.max(now);
        }
    }

    fn observe_time(&mut self, now: Nanos) {
        self.clock = self.clock.max(now);
    }

    /// A planned move was reported done at `clock` (the latest time seen, so a move is never
    /// taken as slower than it was): its time is from when it was planned, or from the
    /// previous completion if the mover was busy with that one. Moves reported at the same
    /// time count as one batch.
    fn observe_move_done(&mut self, m: InFlight, clock: Nanos) {
        if clock > self.last_move_done || self.batch.1 == 0 {
            self.batch = (m.at.max(self.last_move_done), 0, self.mover_rate);
            self.last_move_done = self.last_move_done.max(clock);
        }
        self.batch.1 = self.batch.1.saturating_add(m.bytes);
        let took = clock.saturating_sub(self.batch.0);
        if took == 0 || self.batch.1 == 0 {
            return;
        }
        let sample = self.batch.1 as f64 / (took as f64 / 1e9);
        self.mover_rate = Some(match self.batch.2 {
            Some(r) => 0.5 * r + 0.5 * sample,
            None => sample,
        });
    }
}

fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl PlacementPolicy for KaisoPolicy {
    fn name(&self) -> &str {
        "kaiso"
    }

    fn record(&mut self, access: &Access) {
        self.observe_time(access.at);
        let cfg = &self.cfg;
        let s = self
            .objects
            .entry(access.object)
            .or_insert_with(ObjectState::new);
        if access.op == Op::Delete {
            return;
        }
        let elapsed = access.at.saturating_sub(s.last_access);
        let in_episode =
            s.touched && (elapsed as f64) <= cfg.episode_gap_secs * crate::time::SECOND as f64;
        // Every open is a touch, and the first read or write after it belongs to it
        // wherever it starts: a file served by kernel passthrough shows the policy its opens
        // only, and must not look colder than one whose reads the daemon sees.
        let continues = match access.op {
            Op::Read | Op::Write => access.offset == s.seq_next || s.seq_next == JUST_OPENED,
            Op::Open => false,
            Op::Create | Op::Truncate | Op::Delete => true,
        };
        let weight = if in_episode && continues {
            cfg.sequential_weight
        } else {
            cfg.touch_weight
        };
        if s.touched {
            s.heat = (f64::from(s.heat) * decay(elapsed, cfg.heat_half_life_secs) + weight) as f32;
            s.rate = (f64::from(s.rate) * decay(elapsed, cfg.spike_half_life_secs) + weight) as f32;
        } else {
            s.heat = weight as f32;
            s.rate = weight as f32;
            s.touched = true;
        }
        s.last_access = s.last_access.max(access.at);
        s.seq_next = match access.op {
            Op::Read | Op::Write => access.offset.saturating_add(access.len),
            Op::Open => JUST_OPENED,
            Op::Create => 0,
            Op::Truncate | Op::Delete => s.seq_next,
        };
    }

    fn placed(&mut self, object: ObjectId, size: u64, tier: TierId) {
        let clock = self.clock;
        match self.in_flight.remove(&object) {
            Some(m) if m.to == tier => self.observe_move_done(m, clock),
            // Reported where it was: the planned move did not happen (the caller could not
            // carry it out). It must not count as a move, or the object would be held
            // where it is for `min_residency_secs` as if it had just arrived.
            Some(m) if m.from == tier => m.undo(object, &mut self.objects),
            _ => {}
        }
        let s = self.objects.entry(object).or_insert_with(ObjectState::new);
        if s.tier != UNPLACED && s.tier != tier {
            s.last_move_secs = secs(clock).saturating_add(1);
        }
        s.size = size;
        s.tier = tier;
    }

    fn resized(&mut self, object: ObjectId, size: u64) {
        if let Some(s) = self.objects.get_mut(&object)
            && s.tier != UNPLACED
        {
            s.size = size;
        }
    }

    fn forget(&mut self, object: ObjectId) {
        self.objects.remove(&object);
        self.in_flight.remove(&object);
    }

    fn pin(&mut self, object: ObjectId, tier: Option<TierId>) {
        let s = self.objects.entry(object).or_insert_with(ObjectState::new);
        // Tier 255 cannot be pinned to (it is the "not pinned" marker); treat as unpin.
        s.pin = tier.unwrap_or(NO_PIN);
    }

    fn place_new(&mut self, now: Nanos, size_hint: u64, tiers: &[TierState]) -> TierId {
        self.observe_time(now);
        planner::place_new(size_hint, tiers)
    }

    fn plan(&mut self, now: Nanos, tiers: &[TierState], max_bytes: u64) -> Vec<Move> {
        self.observe_time(now);
        self.refill_buckets(now, tiers);
        planner::Planner::run(self, now, tiers, max_bytes)
    }

    fn explain(&self, object: ObjectId, now: Nanos) -> String {
        let Some(s) = self.objects.get(&object) else {
            return format!(
                "object {object}: unknown to the kaiso policy (never accessed or placed)"
            );
        };
        let score = self.score_of(s, now);
        let rank = 1 + self
            .objects
            .iter()
            .filter(|(id, o)| {
                o.tier != UNPLACED && {
                    let os = self.score_of(o, now);
                    os > score || (os == score && **id < object)
                }
            })
            .count();
        let placed = self.objects.values().filter(|o| o.tier != UNPLACED).count();
        let tier = if s.tier == UNPLACED {
            "unplaced".to_string()
        } else {
            format!("tier {}", s.tier)
        };
        let pin = if s.pinned() {
            format!("pinned to tier {}", s.pin)
        } else {
            "not pinned".to_string()
        };
        let age = if s.touched {
            format!(
                "last access {:.1}s ago",
                now.saturating_sub(s.last_access) as f64 / 1e9
            )
        } else {
            "never accessed".to_string()
        };
        let in_flight = match self.in_flight.get(&object) {
            Some(m) => format!(" (move to tier {} in flight)", m.to),
            None => String::new(),
        };
        format!(
            "object {object}: {tier}, {}, heat {score:.2} (promote at {:.2}), spike rate {:.2}, rank {rank} of {placed}, {pin}, {age}; last decision: {}{in_flight}",
            fmt_bytes(s.size),
            self.cfg.promote_min_heat,
            self.rate_of(s, now),
            s.decision.describe()
        )
    }
}
