//! The seed-002 spike tiering rule (Oe et al., 2012), as published.
//!
//! Objects are fixed-size *segments* (1 GB in the paper) of a volume whose home is the slow
//! tier (HDD). Every `sample_secs` (1 minute) the rule closes a sample: IOs per segment
//! (blktrace on the logical volume, so counts do not depend on where a segment lives) and the
//! HDD's %util and iops (iostat). It then averages the last `smoothing_samples` (2) samples and
//!
//! - if HDD %util > `util_upper` (70 %): sorts the HDD segments by iops, descending, and picks
//!   them until `%util − Σ iops_k × %util_per_iops` first drops below `util_middle` (50 %),
//!   that segment included, with `%util_per_iops = HDD %util / HDD iops`;
//! - if HDD %util < `util_lower` (10 %): sorts the SSD segments by iops, ascending, and picks
//!   them until `%util + Σ iops_k × %util_per_iops` first exceeds `util_middle`, that segment
//!   included;
//! - optionally (the §5.4 "persistent IO" rule, off by default): while %util is inside the
//!   band, promotes any HDD segment that had IO in `persistent_samples` (8) consecutive samples.
//!
//! Picked segments are queued and moved one per `move_interval_secs` (60 s). The queue is
//! recomputed at every sample (the paper leaves this open). HDD %util comes from
//! [`TierState::busy`] of the HDD tier at each `plan` call, or from
//! [`SpikePolicy::observe_utilisation`] when the caller has per-sample iostat figures.
//! Decisions the paper leaves open are configuration fields, documented below.

#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use serde::Deserialize;

use crate::default_policy::IdMap;
use crate::engine::{Access, Move, MoveReason, ObjectId, Op, PlacementPolicy, TierId, TierState};
use crate::time::{Nanos, SECOND};

/// Every constant of the 002 rule. Defaults are the paper's values.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpikeConfig {
    /// Length of one monitoring sample, seconds (paper: 1 minute).
    pub sample_secs: f64,
    /// Samples averaged for each decision (paper: n = 2).
    pub smoothing_samples: usize,
    /// `%util^h_up`: promote above this HDD utilisation (paper: 70 %).
    pub util_upper: f64,
    /// `%util^h_md`: the predicted utilisation a promotion or demotion batch aims at (50 %).
    pub util_middle: f64,
    /// `%util^h_lo`: demote below this HDD utilisation (paper: 10 %).
    pub util_lower: f64,
    /// Moves are serialised, one per this many seconds (paper: 60 s).
    pub move_interval_secs: f64,
    /// Enables the §5.4 persistent-IO promotion rule (the paper used it only against
    /// flashcache).
    pub persistent_io: bool,
    /// `m`: consecutive samples with IO that make a segment persistent (paper: 8).
    pub persistent_samples: u32,
    /// Restart every persistent-IO count when a move completes (the paper's Fig. 8 timing,
    /// 10 minutes after the first batch, suggests this; it is not stated).
    pub persistent_reset_on_move: bool,
    /// The fast tier (SSD).
    pub ssd_tier: TierId,
    /// The slow, home tier (HDD).
    pub hdd_tier: TierId,
}

impl Default for SpikeConfig {
    fn default() -> Self {
        Self {
            sample_secs: 60.0,
            smoothing_samples: 2,
            util_upper: 0.70,
            util_middle: 0.50,
            util_lower: 0.10,
            move_interval_secs: 60.0,
            persistent_io: false,
            persistent_samples: 8,
            persistent_reset_on_move: true,
            ssd_tier: 0,
            hdd_tier: 1,
        }
    }
}

impl SpikeConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.sample_secs.is_finite() && self.sample_secs > 0.0) {
            return Err(format!(
                "sample_secs must be positive, got {}",
                self.sample_secs
            ));
        }
        if !(self.move_interval_secs.is_finite() && self.move_interval_secs >= 0.0) {
            return Err(format!(
                "move_interval_secs must be >= 0, got {}",
                self.move_interval_secs
            ));
        }
        if self.smoothing_samples == 0 || self.smoothing_samples > 1024 {
            return Err(format!(
                "smoothing_samples must be within 1..=1024, got {}",
                self.smoothing_samples
            ));
        }
        let (lo, md, up) = (self.util_lower, self.util_middle, self.util_upper);
        if ![lo, md, up]
            .iter()
            .all(|v| v.is_finite() && (0.0..=1.0).contains(v))
        {
            return Err(format!(
                "utilisation thresholds must be within 0..=1: {lo} {md} {up}"
            ));
        }
        if !(lo < md && md < up) {
            return Err(format!(
                "need util_lower < util_middle < util_upper, got {lo} {md} {up}"
            ));
        }
        if self.persistent_samples == 0 {
            return Err("persistent_samples must be at least 1".into());
        }
        if self.ssd_tier == self.hdd_tier {
            return Err(format!("ssd_tier and hdd_tier are both {}", self.ssd_tier));
        }
        Ok(())
    }

    fn sample_nanos(&self) -> Nanos {
        ((self.sample_secs * SECOND as f64) as Nanos).max(1)
    }
}

/// One closed monitoring sample.
#[derive(Clone, Debug, Default)]
struct Sample {
    /// IOs per segment seen at the logical volume (segments with no IO are absent).
    ios: IdMap<u32>,
    /// IOs served by the HDD (segments then on the HDD tier).
    hdd_ios: u64,
    /// HDD utilisation, mean of the observations made during the sample.
    util: f64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Segment {
    size: u64,
    tier: TierId,
    /// Index of the last sample in which the segment had IO, and how many consecutive
    /// samples up to that one had IO.
    last_active: u64,
    consecutive: u32,
    last_reason: Option<MoveReason>,
}

/// The 002 rule as a [`PlacementPolicy`] over segments.
pub struct SpikePolicy {
    cfg: SpikeConfig,
    segments: IdMap<Segment>,
    pinned: IdMap<TierId>,
    /// Index (time / sample length) of the open sample.
    current: u64,
    open: Sample,
    util_sum: f64,
    util_n: u32,
    last_util: f64,
    closed: VecDeque<Sample>,
    closed_count: u64,
    decided_at: u64,
    queue: VecDeque<(ObjectId, MoveReason)>,
    last_move_at: Option<Nanos>,
    /// Moves handed out and not yet confirmed through `placed`, by time handed out: not
    /// handed out again until confirmed or `IN_FLIGHT_TIMEOUT` passes (the caller dropped it).
    in_flight: IdMap<Nanos>,
    last_decision: String,
}

/// How long a planned move may stay unconfirmed before the segment is eligible again.
const IN_FLIGHT_TIMEOUT: Nanos = 10 * crate::time::MINUTE;

/// The averaged view a decision is made on (also exposed for reports and tests).
#[derive(Clone, Debug, PartialEq)]
pub struct SpikeView {
    pub hdd_util: f64,
    pub hdd_iops: f64,
    /// Mean iops per segment over the smoothing window.
    pub segment_iops: Vec<(ObjectId, f64)>,
}

impl Default for SpikePolicy {
    fn default() -> Self {
        Self::build(SpikeConfig::default())
    }
}

impl SpikePolicy {
    pub fn new(cfg: SpikeConfig) -> Result<Self, String> {
        cfg.validate()?;
        Ok(Self::build(cfg))
    }

    fn build(cfg: SpikeConfig) -> Self {
        Self {
            cfg,
            segments: IdMap::default(),
            pinned: IdMap::default(),
            current: 0,
            open: Sample::default(),
            util_sum: 0.0,
            util_n: 0,
            last_util: 0.0,
            closed: VecDeque::new(),
            closed_count: 0,
            decided_at: 0,
            queue: VecDeque::new(),
            last_move_at: None,
            in_flight: IdMap::default(),
            last_decision: "no decision yet".into(),
        }
    }

    pub fn config(&self) -> &SpikeConfig {
        &self.cfg
    }

    /// An iostat-style utilisation figure (0..=1) of `tier`'s device at `at`, covering the
    /// time just before `at`. Only the HDD tier's figures are used.
    pub fn observe_utilisation(&mut self, at: Nanos, tier: TierId, util: f64) {
        if tier != self.cfg.hdd_tier || !util.is_finite() {
            return;
        }
        self.advance(at.saturating_sub(1));
        self.util_sum += util.clamp(0.0, 1.0);
        self.util_n += 1;
    }

    /// Closes every sample that ends at or before `now`.
    fn advance(&mut self, now: Nanos) {
        let idx = now / self.cfg.sample_nanos();
        if self.current >= idx {
            return;
        }
        let util = if self.util_n > 0 {
            self.util_sum / f64::from(self.util_n)
        } else {
            self.last_util
        };
        self.last_util = util;
        let mut s = std::mem::take(&mut self.open);
        s.util = util;
        for &id in s.ios.keys() {
            if let Some(seg) = self.segments.get_mut(&id) {
                seg.consecutive = if seg.consecutive > 0 && seg.last_active + 1 == self.current {
                    seg.consecutive.saturating_add(1)
                } else {
                    1
                };
                seg.last_active = self.current;
            }
        }
        self.closed.push_back(s);
        // Samples with no call at all had no IO; their utilisation is held from the last one.
        let gap = idx - self.current - 1;
        for _ in 0..gap.min(self.cfg.smoothing_samples as u64) {
            self.closed.push_back(Sample {
                util,
                ..Sample::default()
            });
        }
        while self.closed.len() > self.cfg.smoothing_samples {
            self.closed.pop_front();
        }
        self.closed_count += gap + 1;
        self.current = idx;
        self.util_sum = 0.0;
        self.util_n = 0;
    }

    /// The mean of the last `smoothing_samples` closed samples, or None before there are
    /// that many (the rule never acts on less: at least two minutes in the paper).
    pub fn view(&self) -> Option<SpikeView> {
        let n = self.cfg.smoothing_samples;
        if self.closed.len() < n {
            return None;
        }
        let window = self.closed.iter().rev().take(n);
        let secs = self.cfg.sample_secs * n as f64;
        let mut ios: IdMap<u64> = IdMap::default();
        let (mut util, mut hdd_ios) = (0.0, 0u64);
        for s in window {
            util += s.util;
            hdd_ios += s.hdd_ios;
            for (&id, &c) in &s.ios {
                *ios.entry(id).or_default() += u64::from(c);
            }
        }
        let mut segment_iops: Vec<(ObjectId, f64)> = ios
            .into_iter()
            .map(|(id, c)| (id, c as f64 / secs))
            .collect();
        segment_iops.sort_unstable_by_key(|e| e.0);
        Some(SpikeView {
            hdd_util: util / n as f64,
            hdd_iops: hdd_ios as f64 / secs,
            segment_iops,
        })
    }

    /// The paper's selection on `view`: segments to promote (when above `util_upper`) or
    /// demote (when below `util_lower`), in move order.
    pub fn select(&self, view: &SpikeView) -> Vec<(ObjectId, MoveReason)> {
        let cfg = &self.cfg;
        let util = view.hdd_util;
        let per = if view.hdd_iops > 0.0 {
            util / view.hdd_iops
        } else {
            0.0
        };
        let iops_of = |id: ObjectId| {
            view.segment_iops
                .binary_search_by_key(&id, |e| e.0)
                .map(|i| view.segment_iops[i].1)
                .unwrap_or(0.0)
        };
        let on = |tier: TierId| {
            let mut v: Vec<(ObjectId, f64)> = self
                .segments
                .iter()
                .filter(|(id, s)| s.tier == tier && !self.pinned.contains_key(id))
                .map(|(&id, _)| (id, iops_of(id)))
                .collect();
            v.sort_unstable_by_key(|e| e.0);
            v
        };
        let mut picked = Vec::new();
        if util > cfg.util_upper {
            let mut hdd = on(cfg.hdd_tier);
            hdd.sort_by(|a, b| b.1.total_cmp(&a.1));
            let mut del = 0.0;
            for (id, iops) in hdd {
                if util - del < cfg.util_middle || iops <= 0.0 {
                    break;
                }
                del += iops * per;
                picked.push((id, MoveReason::Spike));
            }
        } else if util < cfg.util_lower {
            let mut ssd = on(cfg.ssd_tier);
            ssd.sort_by(|a, b| a.1.total_cmp(&b.1));
            let mut add = 0.0;
            for (id, iops) in ssd {
                if util + add > cfg.util_middle {
                    break;
                }
                add += iops * per;
                picked.push((id, MoveReason::SpikeOver));
            }
        } else if cfg.persistent_io {
            let last = self.closed_count.saturating_sub(1);
            let mut steady: Vec<ObjectId> = self
                .segments
                .iter()
                .filter(|(id, s)| {
                    s.tier == cfg.hdd_tier
                        && !self.pinned.contains_key(id)
                        && s.last_active == last
                        && s.consecutive >= cfg.persistent_samples
                })
                .map(|(&id, _)| id)
                .collect();
            steady.sort_unstable();
            picked.extend(steady.into_iter().map(|id| (id, MoveReason::Promote)));
        }
        picked
    }

    fn decide(&mut self) {
        if self.closed_count == self.decided_at {
            return;
        }
        self.decided_at = self.closed_count;
        let Some(view) = self.view() else {
            self.last_decision = format!(
                "waiting: {} of {} samples",
                self.closed.len(),
                self.cfg.smoothing_samples
            );
            return;
        };
        let picked = self.select(&view);
        self.last_decision = format!(
            "HDD %util {:.1} at {:.1} iops: {} segment(s) queued",
            view.hdd_util * 100.0,
            view.hdd_iops,
            picked.len()
        );
        self.queue = picked.into();
    }
}

impl PlacementPolicy for SpikePolicy {
    fn name(&self) -> &str {
        "spike-002"
    }

    fn record(&mut self, access: &Access) {
        if !matches!(access.op, Op::Read | Op::Write) {
            return;
        }
        self.advance(access.at);
        let c = self.open.ios.entry(access.object).or_default();
        *c = c.saturating_add(1);
        let on_hdd = self
            .segments
            .get(&access.object)
            .is_none_or(|s| s.tier == self.cfg.hdd_tier);
        if on_hdd {
            self.open.hdd_ios += 1;
        }
    }

    fn placed(&mut self, object: ObjectId, size: u64, tier: TierId) {
        let moved = self.segments.get(&object).is_some_and(|s| s.tier != tier);
        self.in_flight.remove(&object);
        let seg = self.segments.entry(object).or_default();
        seg.size = size;
        seg.tier = tier;
        if moved && self.cfg.persistent_reset_on_move {
            for s in self.segments.values_mut() {
                s.consecutive = 0;
            }
        }
    }

    fn forget(&mut self, object: ObjectId) {
        self.segments.remove(&object);
        self.pinned.remove(&object);
        self.in_flight.remove(&object);
        self.queue.retain(|e| e.0 != object);
    }

    fn pin(&mut self, object: ObjectId, tier: Option<TierId>) {
        match tier {
            Some(t) => {
                self.pinned.insert(object, t);
            }
            None => {
                self.pinned.remove(&object);
            }
        }
    }

    /// Segments are created on their home, the HDD (the paper's identity mapping).
    fn place_new(&mut self, _now: Nanos, _size_hint: u64, tiers: &[TierState]) -> TierId {
        if usize::from(self.cfg.hdd_tier) < tiers.len() {
            self.cfg.hdd_tier
        } else {
            0
        }
    }

    fn plan(&mut self, now: Nanos, tiers: &[TierState], max_bytes: u64) -> Vec<Move> {
        let (ssd, hdd) = (
            usize::from(self.cfg.ssd_tier),
            usize::from(self.cfg.hdd_tier),
        );
        if ssd >= tiers.len() || hdd >= tiers.len() {
            return Vec::new();
        }
        self.observe_utilisation(now, self.cfg.hdd_tier, tiers[hdd].busy);
        self.advance(now);
        self.decide();
        let interval = (self.cfg.move_interval_secs * SECOND as f64) as Nanos;
        if self
            .last_move_at
            .is_some_and(|t| now.saturating_sub(t) < interval)
        {
            return Vec::new();
        }
        while let Some((id, reason)) = self.queue.pop_front() {
            let Some(seg) = self.segments.get(&id).copied() else {
                continue;
            };
            let (from, to) = match reason {
                MoveReason::SpikeOver => (self.cfg.ssd_tier, self.cfg.hdd_tier),
                _ => (self.cfg.hdd_tier, self.cfg.ssd_tier),
            };
            let dest = &tiers[usize::from(to)];
            let in_flight = self
                .in_flight
                .get(&id)
                .is_some_and(|&t| now.saturating_sub(t) < IN_FLIGHT_TIMEOUT);
            if seg.tier != from
                || in_flight
                || self.pinned.contains_key(&id)
                || seg.size > max_bytes
                || dest.used.saturating_add(seg.size) > dest.capacity
            {
                continue;
            }
            self.last_move_at = Some(now);
            self.in_flight.insert(id, now);
            if let Some(s) = self.segments.get_mut(&id) {
                s.last_reason = Some(reason);
            }
            return vec![Move {
                object: id,
                from,
                to,
                bytes: seg.size,
                reason,
            }];
        }
        Vec::new()
    }

    fn explain(&self, object: ObjectId, _now: Nanos) -> String {
        let Some(seg) = self.segments.get(&object) else {
            return format!("segment {object}: unknown to spike-002");
        };
        let iops = self
            .view()
            .and_then(|v| v.segment_iops.iter().find(|e| e.0 == object).map(|e| e.1))
            .unwrap_or(0.0);
        let queued = self.queue.iter().position(|e| e.0 == object);
        format!(
            "segment {object}: tier {}, {:.2} iops (mean of last {} samples), IO in {} consecutive samples, {}, {}; last move: {}; rule: {}",
            seg.tier,
            iops,
            self.cfg.smoothing_samples,
            seg.consecutive,
            match self.pinned.get(&object) {
                Some(t) => format!("pinned to tier {t}"),
                None => "not pinned".into(),
            },
            match queued {
                Some(i) => format!("queued at position {}", i + 1),
                None => "not queued".into(),
            },
            match seg.last_reason {
                Some(r) => format!("{r:?}"),
                None => "none".into(),
            },
            self.last_decision
        )
    }
}
