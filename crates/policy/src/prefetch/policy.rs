//! The ch.3 prefetching SSD cache as a [`PlacementPolicy`] over fixed-size chunks.
//!
//! - Per-chunk read counts are collected per window and kept as the `2^-i` weighted history
//!   (`freq ← freq / 2 + window reads`), aggregated per cache unit and ranked, descending.
//! - A cache unit is N chunks contiguous in a guest file ([`UnitMode::LayoutAware`], needs a
//!   [`RegionLayout`]) or N chunks contiguous in volume LBA, i.e. chunk ids `kN..kN+N−1`
//!   ([`UnitMode::Lba`], the "simple prefetch" it is compared with).
//! - Prefetch runs only during the first `p·r` seconds of each window of `p` seconds, at the
//!   slow device's migration bandwidth; r is fixed ([`RateMode::Fixed`]) or adapted at each
//!   window end by the easing function ([`RateMode::Adaptive`], [`super::RateController`]).
//! - Only prefetch fills the cache tier; room is made by evicting the least recently
//!   accessed chunk (the thesis's LRU over logical chunks).

use serde::Deserialize;

use super::layout::{FileChunk, RegionLayout};
use super::rate::{EasingConfig, EasingRule, RateController, WindowMeasure};
use crate::default_policy::IdMap;
use crate::engine::{Access, Move, MoveReason, ObjectId, Op, PlacementPolicy, TierId, TierState};
use crate::time::{Nanos, SECOND};

/// How chunks group into cache units.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnitMode {
    /// `U(file, k)`: N chunks contiguous in a file (the thesis's layout awareness).
    LayoutAware,
    /// N chunks contiguous on the volume (chunk ids `kN..kN+N−1`): simple prefetch.
    Lba,
}

/// How the prefetch share r of each window is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RateMode {
    /// r never changes (the thesis's fixed-r runs; 0.4 in its Fig. 3.7).
    Fixed(f64),
    /// r adapted by the easing function.
    Adaptive,
}

/// Configuration of the ch.3 prefetcher.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrefetchConfig {
    /// Chunks per cache unit (the thesis's best: 3 chunks of 1 MB).
    pub unit_chunks: u32,
    pub unit_mode: UnitMode,
    pub rate_mode: RateMode,
    /// Window length p in seconds (not given in the thesis; 10 s is ours).
    pub window_secs: f64,
    /// Migration bandwidth while prefetching, bytes/s: what p·r seconds of prefetch can move
    /// (the thesis measured 33–79 MB/s of migration on its RAID; 50 MB/s is ours).
    pub prefetch_bytes_per_sec: f64,
    /// The cache tier (SSD) and the backing tier (HDD).
    pub cache_tier: TierId,
    pub backing_tier: TierId,
    /// [ours, off by default] Never evict a chunk whose frequency is at least the candidate
    /// unit's hottest chunk's (the thesis uses plain LRU).
    pub evict_guard: bool,
    pub easing: EasingConfig,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        Self {
            unit_chunks: 3,
            unit_mode: UnitMode::LayoutAware,
            rate_mode: RateMode::Adaptive,
            window_secs: 10.0,
            prefetch_bytes_per_sec: 50e6,
            cache_tier: 0,
            backing_tier: 1,
            evict_guard: false,
            easing: EasingConfig::default(),
        }
    }
}

impl PrefetchConfig {
    pub fn validate(&self) -> Result<(), String> {
        if self.unit_chunks == 0 {
            return Err("unit_chunks must be at least 1".into());
        }
        if !(self.window_secs.is_finite() && self.window_secs > 0.0) {
            return Err(format!(
                "window_secs must be positive, got {}",
                self.window_secs
            ));
        }
        if !(self.prefetch_bytes_per_sec.is_finite() && self.prefetch_bytes_per_sec > 0.0) {
            return Err(format!(
                "prefetch_bytes_per_sec must be positive, got {}",
                self.prefetch_bytes_per_sec
            ));
        }
        if let RateMode::Fixed(r) = self.rate_mode
            && !(r.is_finite() && (0.0..=1.0).contains(&r))
        {
            return Err(format!("fixed r must be within 0..=1, got {r}"));
        }
        if self.cache_tier == self.backing_tier {
            return Err("cache_tier and backing_tier must differ".into());
        }
        self.easing.validate()
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Chunk {
    size: u64,
    tier: TierId,
    last_access: Nanos,
    /// Weighted read history up to the last closed window.
    freq: f32,
    /// Reads in the open window.
    window_reads: u32,
    last_reason: Option<MoveReason>,
}

/// One closed window, for time series (r(t), CHR, M).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowReport {
    pub start: Nanos,
    pub measure: WindowMeasure,
    /// r used in the window that follows.
    pub r: f64,
    pub rule: Option<EasingRule>,
    pub prefetched_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum UnitKey {
    File(FileChunk),
    Lba(u64),
}

/// The ch.3 prefetcher.
pub struct PrefetchPolicy {
    cfg: PrefetchConfig,
    layout: Option<RegionLayout>,
    chunks: IdMap<Chunk>,
    pinned: IdMap<TierId>,
    rate: RateController,
    fixed_r: Option<f64>,
    window: u64,
    window_started: bool,
    reads: u64,
    hits: u64,
    transactions: Option<f64>,
    /// Units ranked at the last window end, hottest first, and how far prefetch got.
    ranked: Vec<UnitKey>,
    cursor: usize,
    window_bytes: u64,
    /// Moves handed out and not yet reported done: (from, to, bytes, when).
    in_flight: IdMap<(TierId, TierId, u64, Nanos)>,
    reports: Vec<WindowReport>,
}

impl PrefetchPolicy {
    /// A prefetcher; `layout` is required for [`UnitMode::LayoutAware`].
    pub fn new(cfg: PrefetchConfig, layout: Option<RegionLayout>) -> Result<Self, String> {
        cfg.validate()?;
        if cfg.unit_mode == UnitMode::LayoutAware && layout.is_none() {
            return Err("layout-aware prefetch needs a chunk layout".into());
        }
        let fixed_r = match cfg.rate_mode {
            RateMode::Fixed(r) => Some(r),
            RateMode::Adaptive => None,
        };
        Ok(Self {
            rate: RateController::new(cfg.easing.clone())?,
            fixed_r,
            cfg,
            layout,
            chunks: IdMap::default(),
            pinned: IdMap::default(),
            window: 0,
            window_started: false,
            reads: 0,
            hits: 0,
            transactions: None,
            ranked: Vec::new(),
            cursor: 0,
            window_bytes: 0,
            in_flight: IdMap::default(),
            reports: Vec::new(),
        })
    }

    /// The prefetch share of the current window.
    pub fn r(&self) -> f64 {
        self.fixed_r.unwrap_or_else(|| self.rate.r())
    }

    /// Every closed window so far, oldest first.
    pub fn reports(&self) -> &[WindowReport] {
        &self.reports
    }

    /// Application throughput: `count` transactions completed at `at` (closed-loop callers).
    /// Without it, TPS is the rate of read and write accesses.
    pub fn observe_transactions(&mut self, at: Nanos, count: u64) {
        self.advance(at);
        *self.transactions.get_or_insert(0.0) += count as f64;
    }

    fn window_nanos(&self) -> Nanos {
        ((self.cfg.window_secs * SECOND as f64) as Nanos).max(1)
    }

    fn unit_key(&self, id: ObjectId) -> UnitKey {
        let n = u64::from(self.cfg.unit_chunks);
        match (self.cfg.unit_mode, &self.layout) {
            (UnitMode::LayoutAware, Some(l)) => match l.locate(id) {
                Some(p) => UnitKey::File(FileChunk {
                    file: p.file,
                    index: p.index / n,
                }),
                None => UnitKey::Lba(id),
            },
            _ => UnitKey::Lba(id / n),
        }
    }

    fn members(&self, key: UnitKey) -> Vec<ObjectId> {
        let n = u64::from(self.cfg.unit_chunks);
        match key {
            UnitKey::File(u) => match &self.layout {
                Some(l) => (u.index * n..=(u.index * n).saturating_add(n - 1))
                    .filter_map(|index| {
                        l.chunk_at(FileChunk {
                            file: u.file,
                            index,
                        })
                    })
                    .collect(),
                None => Vec::new(),
            },
            UnitKey::Lba(k) => match self.cfg.unit_mode {
                UnitMode::Lba => (k * n..=(k * n).saturating_add(n - 1)).collect(),
                // An unmapped chunk under layout awareness is its own unit.
                UnitMode::LayoutAware => vec![k],
            },
        }
    }

    /// Closes every window that ended at or before `now`.
    fn advance(&mut self, now: Nanos) {
        let idx = now / self.window_nanos();
        if !self.window_started {
            self.window_started = true;
            self.window = idx;
            return;
        }
        if idx <= self.window {
            return;
        }
        let secs = self.cfg.window_secs;
        let tps = match self.transactions.take() {
            Some(t) => t / secs,
            None => self.reads as f64 / secs,
        };
        let chr = if self.reads > 0 {
            self.hits as f64 / self.reads as f64
        } else {
            0.0
        };
        let measure = WindowMeasure { tps, chr };
        let (r, rule) = match self.fixed_r {
            Some(r) => (r, None),
            None => (self.rate.end_window(measure), Some(self.rate.last_rule())),
        };
        self.reports.push(WindowReport {
            start: self.window * self.window_nanos(),
            measure,
            r,
            rule,
            prefetched_bytes: self.window_bytes,
        });
        // Weighted history: one halving per window passed.
        let halvings = (idx - self.window).min(64) as i32;
        let scale = 0.5f64.powi(halvings - 1);
        let mut agg: std::collections::HashMap<UnitKey, f64> = std::collections::HashMap::new();
        let keys: Vec<ObjectId> = self.chunks.keys().copied().collect();
        for id in keys {
            let Some(c) = self.chunks.get_mut(&id) else {
                continue;
            };
            c.freq = ((f64::from(c.freq) * 0.5 + f64::from(c.window_reads)) * scale) as f32;
            c.window_reads = 0;
            let f = f64::from(c.freq);
            if f > 1e-6 {
                *agg.entry(self.unit_key(id)).or_default() += f;
            }
        }
        let mut ranked: Vec<(UnitKey, f64)> = agg.into_iter().collect();
        ranked.sort_by(|a, b| {
            b.1.total_cmp(&a.1)
                .then_with(|| unit_order(&a.0).cmp(&unit_order(&b.0)))
        });
        self.ranked = ranked.into_iter().map(|e| e.0).collect();
        self.cursor = 0;
        self.reads = 0;
        self.hits = 0;
        self.window_bytes = 0;
        self.window = idx;
    }

    /// Chunks on the cache tier, least recently accessed first.
    fn lru_victims(&self) -> Vec<ObjectId> {
        let mut v: Vec<(Nanos, ObjectId)> = self
            .chunks
            .iter()
            .filter(|(id, c)| c.tier == self.cfg.cache_tier && !self.pinned.contains_key(id))
            .map(|(&id, c)| (c.last_access, id))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|e| e.1).collect()
    }
}

fn unit_order(k: &UnitKey) -> (u8, u64, u64) {
    match *k {
        UnitKey::File(f) => (0, f.file, f.index),
        UnitKey::Lba(i) => (1, i, 0),
    }
}

impl PlacementPolicy for PrefetchPolicy {
    fn name(&self) -> &str {
        match (self.cfg.unit_mode, self.cfg.rate_mode) {
            (UnitMode::LayoutAware, RateMode::Adaptive) => "prefetch-la-adaptive",
            (UnitMode::LayoutAware, RateMode::Fixed(_)) => "prefetch-la-fixed",
            (UnitMode::Lba, RateMode::Adaptive) => "prefetch-lba-adaptive",
            (UnitMode::Lba, RateMode::Fixed(_)) => "prefetch-lba-fixed",
        }
    }

    fn record(&mut self, access: &Access) {
        self.advance(access.at);
        if !matches!(access.op, Op::Read | Op::Write) {
            return;
        }
        let cache = self.cfg.cache_tier;
        let c = self.chunks.entry(access.object).or_insert(Chunk {
            tier: self.cfg.backing_tier,
            ..Chunk::default()
        });
        c.last_access = c.last_access.max(access.at);
        // CHR and ranking count reads only (the thesis: synchronous small reads dominate).
        if access.op == Op::Read {
            c.window_reads = c.window_reads.saturating_add(1);
            self.reads += 1;
            if c.tier == cache {
                self.hits += 1;
            }
        }
    }

    fn placed(&mut self, object: ObjectId, size: u64, tier: TierId) {
        self.in_flight.remove(&object);
        let c = self.chunks.entry(object).or_default();
        c.size = size;
        c.tier = tier;
    }

    fn forget(&mut self, object: ObjectId) {
        self.in_flight.remove(&object);
        self.chunks.remove(&object);
        self.pinned.remove(&object);
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

    /// New chunks start on the backing tier: only prefetch fills the cache.
    fn place_new(&mut self, now: Nanos, _size_hint: u64, tiers: &[TierState]) -> TierId {
        self.advance(now);
        if usize::from(self.cfg.backing_tier) < tiers.len() {
            self.cfg.backing_tier
        } else {
            0
        }
    }

    fn plan(&mut self, now: Nanos, tiers: &[TierState], max_bytes: u64) -> Vec<Move> {
        self.advance(now);
        let (ct, bt) = (self.cfg.cache_tier, self.cfg.backing_tier);
        let Some(cache) = tiers.get(usize::from(ct)) else {
            return Vec::new();
        };
        if usize::from(bt) >= tiers.len() {
            return Vec::new();
        }
        // Prefetch only during the first p·r seconds of the window, at the migration rate.
        let into_window = now.saturating_sub(self.window * self.window_nanos()) as f64 / 1e9;
        let slice = self.cfg.window_secs * self.r();
        let allowed = (into_window.min(slice) * self.cfg.prefetch_bytes_per_sec) as u64;
        // Moves not reported done within two windows were dropped by the caller.
        let expiry = 2 * self.window_nanos();
        self.in_flight
            .retain(|_, m| now.saturating_sub(m.3) < expiry);
        // Projected cache use once the moves in flight are done; and never more queued
        // than one slice's worth, so a slow mover is not handed stale work.
        let mut used = cache.used;
        let mut in_flight_bytes = 0u64;
        for &(from, to, bytes, _) in self.in_flight.values() {
            if to == ct {
                used = used.saturating_add(bytes);
            } else if from == ct {
                used = used.saturating_sub(bytes);
            }
            in_flight_bytes = in_flight_bytes.saturating_add(bytes);
        }
        let slice_bytes = (slice * self.cfg.prefetch_bytes_per_sec) as u64;
        let mut budget = allowed
            .saturating_sub(self.window_bytes)
            .min(max_bytes)
            .min(slice_bytes.saturating_sub(in_flight_bytes));
        let limit = ((cache.capacity as f64) * cache.high_watermark.clamp(0.0, 1.0)) as u64;
        let mut moves = Vec::new();
        let mut victims: Option<Vec<ObjectId>> = None;
        let mut victim_at = 0;
        let mut planned: Vec<ObjectId> = Vec::new();
        while budget > 0 && self.cursor < self.ranked.len() {
            let key = self.ranked[self.cursor];
            let members: Vec<(ObjectId, Chunk)> = self
                .members(key)
                .into_iter()
                .filter_map(|id| self.chunks.get(&id).map(|c| (id, *c)))
                .filter(|(id, c)| {
                    c.tier == bt
                        && c.size > 0
                        && !self.pinned.contains_key(id)
                        && !self.in_flight.contains_key(id)
                })
                .collect();
            let need: u64 = members.iter().map(|m| m.1.size).sum();
            if members.is_empty() {
                self.cursor += 1;
                continue;
            }
            let unit_heat = members
                .iter()
                .map(|m| f64::from(m.1.freq))
                .fold(0.0, f64::max);
            // Make room: evict LRU chunks (4 I/Os each if dirty, modelled by the caller).
            let mut evict = Vec::new();
            let mut freed = 0u64;
            if used.saturating_add(need) > limit {
                let list = victims.get_or_insert_with(|| self.lru_victims());
                let mut at = victim_at;
                while used.saturating_sub(freed).saturating_add(need) > limit && at < list.len() {
                    let v = list[at];
                    at += 1;
                    let Some(vc) = self.chunks.get(&v) else {
                        continue;
                    };
                    if vc.tier != ct || planned.contains(&v) || self.in_flight.contains_key(&v) {
                        continue;
                    }
                    if self.cfg.evict_guard && f64::from(vc.freq) >= unit_heat {
                        break;
                    }
                    freed += vc.size;
                    evict.push((v, vc.size));
                }
                if used.saturating_sub(freed).saturating_add(need) > limit {
                    // This unit cannot fit; the rest of the ranking is colder.
                    break;
                }
                victim_at = at;
            }
            let bytes = need + evict.iter().map(|e| e.1).sum::<u64>();
            if bytes > budget {
                break;
            }
            for (v, size) in evict {
                moves.push(Move {
                    object: v,
                    from: ct,
                    to: bt,
                    bytes: size,
                    reason: MoveReason::Evict,
                });
                planned.push(v);
                self.in_flight.insert(v, (ct, bt, size, now));
                if let Some(c) = self.chunks.get_mut(&v) {
                    c.last_reason = Some(MoveReason::Evict);
                }
            }
            for (id, c) in members {
                moves.push(Move {
                    object: id,
                    from: bt,
                    to: ct,
                    bytes: c.size,
                    reason: MoveReason::Prefetch,
                });
                planned.push(id);
                self.in_flight.insert(id, (bt, ct, c.size, now));
                if let Some(c) = self.chunks.get_mut(&id) {
                    c.last_reason = Some(MoveReason::Prefetch);
                }
            }
            used = used.saturating_sub(freed).saturating_add(need);
            budget -= bytes;
            self.window_bytes += bytes;
            self.cursor += 1;
        }
        moves
    }

    fn explain(&self, object: ObjectId, _now: Nanos) -> String {
        let Some(c) = self.chunks.get(&object) else {
            return format!("chunk {object}: unknown to {}", self.name());
        };
        let key = self.unit_key(object);
        let rank = self.ranked.iter().position(|k| *k == key);
        format!(
            "chunk {object}: tier {}, read frequency {:.2} (2^-i weighted), unit {} of {} chunks, unit rank {}, {}, r {:.2}, last move: {}",
            c.tier,
            c.freq,
            match key {
                UnitKey::File(f) => format!("file {} #{}", f.file, f.index),
                UnitKey::Lba(k) => format!("lba #{k}"),
            },
            self.cfg.unit_chunks,
            rank.map_or("unranked".to_string(), |r| (r + 1).to_string()),
            match self.pinned.get(&object) {
                Some(t) => format!("pinned to tier {t}"),
                None => "not pinned".into(),
            },
            self.r(),
            c.last_reason
                .map_or("none".to_string(), |r| format!("{r:?}"))
        )
    }
}
