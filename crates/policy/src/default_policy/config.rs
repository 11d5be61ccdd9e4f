//! Every tunable of [`super::KaisoPolicy`], with its default and the reason for it.
//! docs/policy-default.md is the user-facing version of this file.

use serde::Deserialize;

/// Configuration of kaiso's default placement policy.
///
/// Deserialises from any serde format (the store reads it from TOML); missing fields take
/// their defaults and unknown fields are an error, so a typo never silently does nothing.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KaisoConfig {
    /// Half-life of the frequency part of heat, in seconds. One hour: long enough that an
    /// object used every few minutes stays hot, short enough that yesterday's working set
    /// cools within a working day (autotier's week-long damping reacts far too slowly).
    pub heat_half_life_secs: f64,
    /// Half-life of the short-term rate used to detect spikes, in seconds. Two minutes:
    /// the 002 rule smooths over the last two one-minute samples.
    pub spike_half_life_secs: f64,
    /// Weight of the recency term added to heat; it decays with `recency_half_life_secs`.
    /// 0.5: breaks ties between equally frequent objects in favour of the recent one, but is
    /// never enough on its own to reach `promote_min_heat`.
    pub recency_weight: f64,
    /// Half-life of the recency term, in seconds (10 minutes).
    pub recency_half_life_secs: f64,
    /// Multiplies the workload-time constants (`heat_half_life_secs`,
    /// `recency_half_life_secs`, `min_residency_secs`) and divides the day of the flash write
    /// budget. 1.0 for a live system; a simulator replaying a workload compressed 10× in time
    /// sets 0.1 so the policy sees the same workload in its own terms. The spike half-life is
    /// not scaled: it is a measurement window that must hold enough IOs to be more than noise
    /// (the 002 paper's reason for one-minute samples).
    pub time_scale: f64,
    /// Heat added by one *touch*: an open, or an access that starts a new episode (random
    /// offset, or a gap longer than `episode_gap_secs`); the first read or write after an
    /// open belongs to the open's touch. 1.0 makes heat read as "decayed touch count".
    pub touch_weight: f64,
    /// Heat added by an access that continues a sequential run within the same episode.
    /// 0.0: a sequential pass counts once however long it is (scan resistance).
    pub sequential_weight: f64,
    /// Accesses to the same object closer together than this, continuing where the last
    /// one ended, belong to one episode (seconds). 2 s covers readahead bursts.
    pub episode_gap_secs: f64,
    /// Score an object needs before it may be promoted. 2.0: at least two separate touches
    /// within about a half-life, so one read (or one scan) never promotes.
    pub promote_min_heat: f64,
    /// Hysteresis for exchanges: a cold resident is evicted for a candidate only if the
    /// candidate's score is at least `swap_ratio` times the resident's. 3.0 keeps two
    /// objects of similar heat from trading places back and forth (3.0 beat 1.5 and 2.0 in
    /// the TPCx-V-like simulation: fewer moves, each worth more).
    pub swap_ratio: f64,
    /// Exchanges may also compare short-term spike rates: a candidate busy now (rate at least
    /// `spike_min_rate`) displaces a resident `swap_ratio` times less busy now, even if the
    /// resident's long-term heat is higher. Lets the fast tier follow a shifting working set.
    pub exchange_on_rate: bool,
    /// An object moved less than this many seconds ago is not moved again by heat (it may
    /// still be drained if its tier is over its high watermark and nothing else can go, or
    /// displaced by a much hotter candidate: `young_swap_ratio`).
    /// 10 minutes: longer than a plan period, so no ping-pong between consecutive plans.
    pub min_residency_secs: f64,
    /// A resident moved less than `min_residency_secs` ago may still be displaced by a
    /// candidate whose score is at least this many times its own, when the difference is
    /// also clear of counting noise (`exchange_confidence`). 2.0: a fast tier filled early
    /// on a few touches per object (a fresh mount, a warm-up) corrects its mistakes as soon
    /// as the counts show them, instead of holding a wrong pick for `min_residency_secs`.
    /// The evicted object cannot come back before `min_residency_secs` (it was just moved),
    /// and the newcomer is itself displaced only by another twice as hot: no ping-pong.
    /// 0 turns the rule off (young residents are never displaced).
    pub young_swap_ratio: f64,
    /// Noise guard of `young_swap_ratio`, in standard deviations of a touch count: the
    /// candidate's decayed touches must exceed the resident's by at least this times
    /// `sqrt(sum of both)` (both read as Poisson counts). 3.0: two objects of equal
    /// popularity pass it about once in a thousand comparisons, while a true 2x difference
    /// passes once both have ~20 touches.
    pub exchange_confidence: f64,
    /// Heat promotions fill free room of a faster tier up to its high watermark (true) or
    /// only to its low watermark (false). true: the band between the watermarks holds hot
    /// objects rather than staying empty for new files (which then go to the next tier
    /// with room and earn their promotion). The band is filled only from a source tier at
    /// most `pace_busy_start` busy: on a saturated HDD the copies cost its users more than
    /// the band's lukewarm objects give back (filling it regardless cost 2 % of the iops of
    /// `kaiso sim suite`'s files workload). After a drain of the tier (it went over its
    /// high watermark) promotions fill only to the low watermark for `min_residency_secs`,
    /// so a tier that grows by writes does not cycle between draining and refilling.
    pub promote_to_high_watermark: bool,
    /// Flash write budget: promotions into a tier may write at most this many times that
    /// tier's capacity per day (drive writes per day). 1.0 matches common TLC endurance.
    pub promote_dwpd: f64,
    /// Absolute flash write budget in bytes per day per destination tier; overrides
    /// `promote_dwpd` when set (non-zero).
    pub promote_bytes_per_day: u64,
    /// The budget bucket holds at most this fraction of a day's budget (burst size).
    /// 1.0 lets a fresh mount fill an empty fast tier once (one drive write), then paces
    /// at `promote_dwpd`. A smaller burst left a new tier mostly empty for hours while
    /// the slow tier served the hot set (measured: 4 of 160 hot files promoted).
    pub promote_burst_fraction: f64,
    /// Moves are planned at most at this rate, bytes per second (a token bucket, before the
    /// load-based factor below). 128 MiB/s is about what one HDD streams, so a mover never
    /// asks more of the slow tier than it can give. 0 = only `max_bytes` limits.
    pub move_bytes_per_sec: u64,
    /// The bucket holds at most this many seconds of `move_bytes_per_sec` (60 s), so a long
    /// pause does not release a flood of moves. Objects larger than that never move.
    pub max_plan_gap_secs: f64,
    /// Planned moves not yet reported done may add up to this many seconds of
    /// `move_bytes_per_sec` (4 s); the next plan waits for the mover instead of queueing
    /// decisions that will be stale by the time they run. An idle mover may always take
    /// one object, however large.
    pub max_in_flight_secs: f64,
    /// Limit the moves queued by a plan to what the mover was observed to move in
    /// `max_in_flight_secs`, when it moves less than half of `move_bytes_per_sec` (a mover
    /// yielding to a busy emulated HDD does about 1 MiB/s). Off by default: it lets a plan
    /// decide on fresher heat (in a policy-only replay of the tiering bench at Zipf s = 3
    /// the fast tier then needed no correction at all), but in `kaiso sim suite` it cost
    /// raised usr1's mean latency by half and cost proj4 12 % of its iops (and gained
    /// 4-7 % on web2, proj2 and tpcxv).
    pub queue_by_mover_rate: bool,
    /// A planned move not reported done within this many seconds is taken as dropped by the
    /// caller (its room is no longer reserved).
    pub in_flight_timeout_secs: f64,
    /// Pacing: below this foreground utilisation of the busier tier of a move, moves use all
    /// of `max_bytes`. 0.5: half-busy devices still have room for background work.
    pub pace_busy_start: f64,
    /// Pacing: at or above this utilisation moves use only `pace_floor` of `max_bytes`.
    pub pace_busy_stop: f64,
    /// Pacing floor: the share of `max_bytes` still allowed at full load, so draining and
    /// spike relief never stop completely (002 keeps moving, one segment per minute).
    pub pace_floor: f64,
    /// Spike reaction: when a slower tier's utilisation exceeds this, its objects with the
    /// highest short-term rate are promoted (002's `%util^h_up` = 70 %).
    pub spike_util_high: f64,
    /// ...until the predicted utilisation of that tier falls to this (002's middle, 50 %).
    pub spike_util_target: f64,
    /// Minimum short-term rate (decayed touches) for a spike candidate; keeps one-off
    /// accesses out of spike promotions. 1.5: more than one touch in the last minutes.
    pub spike_min_rate: f64,
    /// Prefetch: when a region of a laid-out file is promoted, up to this many
    /// file-contiguous neighbours (the rest of its cache unit) follow it. Used only when a
    /// layout is set (see `KaisoPolicy::set_layout`).
    pub prefetch_unit_regions: u32,
    /// With a layout, a region's score and spike rate are blended with the mean of its cache
    /// unit's regions with this weight (0.5): unit-level statistics are less noisy, and the
    /// cold regions of a hot unit rise with it.
    pub unit_heat_weight: f64,
    /// Share of a plan's byte budget that prefetch may use. 0.25 keeps prefetch from
    /// crowding out promotions of objects that are hot themselves.
    pub prefetch_share: f64,
    /// Copy cost of a move in touches: an object must have at least `size / this` heat to be
    /// promoted, and a short-term rate of at least `size / this` to be a spike candidate
    /// (besides `promote_min_heat` and `spike_min_rate`). A move reads the object from the
    /// slower device; 1 MiB is about what an HDD streams in the time of one random IO, so a
    /// 64 MiB region must have had ~64 touches before its copy is likely to pay back. Small
    /// objects are unaffected; 0 turns the rule off.
    pub copy_bytes_per_touch: u64,
}

impl Default for KaisoConfig {
    fn default() -> Self {
        Self {
            heat_half_life_secs: 3600.0,
            spike_half_life_secs: 120.0,
            recency_weight: 0.5,
            recency_half_life_secs: 600.0,
            time_scale: 1.0,
            touch_weight: 1.0,
            sequential_weight: 0.0,
            episode_gap_secs: 2.0,
            promote_min_heat: 2.0,
            swap_ratio: 3.0,
            exchange_on_rate: true,
            min_residency_secs: 600.0,
            young_swap_ratio: 2.0,
            exchange_confidence: 3.0,
            promote_to_high_watermark: true,
            promote_dwpd: 1.0,
            promote_bytes_per_day: 0,
            promote_burst_fraction: 1.0,
            move_bytes_per_sec: 128 << 20,
            max_plan_gap_secs: 60.0,
            max_in_flight_secs: 4.0,
            queue_by_mover_rate: false,
            in_flight_timeout_secs: 120.0,
            pace_busy_start: 0.5,
            pace_busy_stop: 0.95,
            pace_floor: 0.1,
            spike_util_high: 0.7,
            spike_util_target: 0.5,
            spike_min_rate: 1.5,
            prefetch_unit_regions: 3,
            unit_heat_weight: 0.5,
            prefetch_share: 0.25,
            copy_bytes_per_touch: 1 << 20,
        }
    }
}

/// A configuration value out of its allowed range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid kaiso policy configuration: {}", self.0)
    }
}

impl std::error::Error for ConfigError {}

impl KaisoConfig {
    /// The configuration in effect: `time_scale` applied.
    pub(crate) fn scaled(&self) -> KaisoConfig {
        let s = self.time_scale;
        KaisoConfig {
            heat_half_life_secs: self.heat_half_life_secs * s,
            recency_half_life_secs: self.recency_half_life_secs * s,
            min_residency_secs: self.min_residency_secs * s,
            promote_dwpd: self.promote_dwpd / s,
            promote_bytes_per_day: (self.promote_bytes_per_day as f64 / s) as u64,
            ..self.clone()
        }
    }

    /// Checks every field's range; [`super::KaisoPolicy::new`] calls this.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let positive = [
            ("heat_half_life_secs", self.heat_half_life_secs),
            ("spike_half_life_secs", self.spike_half_life_secs),
            ("recency_half_life_secs", self.recency_half_life_secs),
            ("swap_ratio", self.swap_ratio),
            ("time_scale", self.time_scale),
        ];
        for (name, v) in positive {
            if !(v.is_finite() && v > 0.0) {
                return Err(ConfigError(format!(
                    "{name} must be a positive number, got {v}"
                )));
            }
        }
        let non_negative = [
            ("recency_weight", self.recency_weight),
            ("touch_weight", self.touch_weight),
            ("sequential_weight", self.sequential_weight),
            ("episode_gap_secs", self.episode_gap_secs),
            ("promote_min_heat", self.promote_min_heat),
            ("min_residency_secs", self.min_residency_secs),
            ("young_swap_ratio", self.young_swap_ratio),
            ("exchange_confidence", self.exchange_confidence),
            ("promote_dwpd", self.promote_dwpd),
            ("spike_min_rate", self.spike_min_rate),
            ("max_plan_gap_secs", self.max_plan_gap_secs),
            ("max_in_flight_secs", self.max_in_flight_secs),
            ("in_flight_timeout_secs", self.in_flight_timeout_secs),
        ];
        for (name, v) in non_negative {
            if !(v.is_finite() && v >= 0.0) {
                return Err(ConfigError(format!(
                    "{name} must be a number >= 0, got {v}"
                )));
            }
        }
        let fractions = [
            ("promote_burst_fraction", self.promote_burst_fraction),
            ("pace_busy_start", self.pace_busy_start),
            ("pace_busy_stop", self.pace_busy_stop),
            ("pace_floor", self.pace_floor),
            ("spike_util_high", self.spike_util_high),
            ("spike_util_target", self.spike_util_target),
            ("prefetch_share", self.prefetch_share),
            ("unit_heat_weight", self.unit_heat_weight),
        ];
        for (name, v) in fractions {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(ConfigError(format!("{name} must be within 0..=1, got {v}")));
            }
        }
        if self.pace_busy_start >= self.pace_busy_stop {
            return Err(ConfigError(format!(
                "pace_busy_start ({}) must be below pace_busy_stop ({})",
                self.pace_busy_start, self.pace_busy_stop
            )));
        }
        if self.spike_util_target >= self.spike_util_high {
            return Err(ConfigError(format!(
                "spike_util_target ({}) must be below spike_util_high ({})",
                self.spike_util_target, self.spike_util_high
            )));
        }
        if self.young_swap_ratio > 0.0 && self.young_swap_ratio < 1.0 {
            return Err(ConfigError(format!(
                "young_swap_ratio must be 0 (off) or at least 1, got {}",
                self.young_swap_ratio
            )));
        }
        if self.promote_burst_fraction <= 0.0 {
            return Err(ConfigError("promote_burst_fraction must be above 0".into()));
        }
        Ok(())
    }
}
