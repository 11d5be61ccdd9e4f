//! Placement: drives a `kaiso_policy::PlacementPolicy` (the default is kaiso-policy's
//! `KaisoPolicy`), keeps a compact heat summary per file so heat survives restarts, and
//! remembers why each file is where it is (for `kaiso explain`).

use crate::types::Ino;
use kaiso_policy::default_policy::{KaisoConfig, KaisoPolicy};
use kaiso_policy::{Access, Move, Nanos, Op, PlacementPolicy, TierId, TierState};
use std::collections::HashMap;

/// Replayed touches are spaced this far apart so each counts as its own episode.
const REPLAY_GAP_NS: u64 = 5_000_000_000;
const MAX_REPLAY: u32 = 64;

pub(crate) struct Placer {
    pub policy: Box<dyn PlacementPolicy>,
    /// Decayed touch count and last access time per file.
    heat: HashMap<Ino, (f32, Nanos)>,
    /// Why a file is where it is.
    pub reasons: HashMap<Ino, String>,
    pub pins: HashMap<Ino, u8>,
    /// The size the policy was last told for each placed file.
    sizes: HashMap<Ino, u64>,
    /// Half-life of the heat summary: the policy's heat half-life (`[policy]`), in ns.
    half_life_ns: f64,
}

fn decay(age_ns: u64, half_life_ns: f64) -> f64 {
    0.5f64.powf(age_ns as f64 / half_life_ns)
}

impl Placer {
    /// A placer driving kaiso's default policy with `cfg` (already validated by the
    /// configuration parser; an invalid one falls back to the defaults).
    pub fn new(cfg: &KaisoConfig) -> Placer {
        let policy = match KaisoPolicy::new(cfg.clone()) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "policy configuration rejected; using the defaults");
                KaisoPolicy::default()
            }
        };
        let c = policy.config();
        let half_life_ns = (c.heat_half_life_secs * c.time_scale * 1e9).max(1.0);
        Placer {
            policy: Box::new(policy),
            heat: HashMap::new(),
            reasons: HashMap::new(),
            pins: HashMap::new(),
            sizes: HashMap::new(),
            half_life_ns,
        }
    }

    /// An access to `ino`, whose size is now `size` (every size change of a file comes
    /// with an access: a write, a truncate, a passthrough writer's growth).
    pub fn record(&mut self, at: Nanos, ino: Ino, op: Op, offset: u64, len: u64, size: u64) {
        self.note_size(ino, size);
        self.policy.record(&Access {
            at,
            object: ino,
            op,
            offset,
            len,
        });
        if matches!(op, Op::Open | Op::Create) {
            let e = self.heat.entry(ino).or_insert((0.0, at));
            let h = e.0 as f64 * decay(at.saturating_sub(e.1), self.half_life_ns) + 1.0;
            *e = (h.min(1e6) as f32, at);
        } else if let Some(e) = self.heat.get_mut(&ino) {
            e.1 = e.1.max(at);
        }
    }

    pub fn forget(&mut self, ino: Ino) {
        self.policy.forget(ino);
        self.heat.remove(&ino);
        self.reasons.remove(&ino);
        self.pins.remove(&ino);
        self.sizes.remove(&ino);
    }

    pub fn placed(&mut self, ino: Ino, size: u64, tier: u8) {
        self.policy.placed(ino, size, tier as TierId);
        self.sizes.insert(ino, size);
    }

    /// Tell the policy a placed file's size changed where it is (files grow after
    /// `placed`: created empty, then written, truncated, or grown by passthrough writers).
    /// Files the policy never placed are skipped.
    pub fn note_size(&mut self, ino: Ino, size: u64) {
        if let Some(known) = self.sizes.get_mut(&ino)
            && *known != size
        {
            *known = size;
            self.policy.resized(ino, size);
        }
    }

    pub fn pin(&mut self, ino: Ino, tier: Option<u8>) {
        match tier {
            Some(t) => {
                self.pins.insert(ino, t);
            }
            None => {
                self.pins.remove(&ino);
            }
        }
        self.policy.pin(ino, tier.map(|t| t as TierId));
    }

    pub fn place_new(&mut self, now: Nanos, size: u64, tiers: &[TierState]) -> u8 {
        self.policy.place_new(now, size, tiers)
    }

    pub fn plan(&mut self, now: Nanos, tiers: &[TierState], max_bytes: u64) -> Vec<Move> {
        self.policy.plan(now, tiers, max_bytes)
    }

    /// The heat summary of `ino` at `now`: its opens, decayed with the policy's heat
    /// half-life (the policy's own heat counts the same touches).
    pub fn heat_of(&self, ino: Ino, now: Nanos) -> f64 {
        self.heat.get(&ino).map_or(0.0, |(h, l)| {
            *h as f64 * decay(now.saturating_sub(*l), self.half_life_ns)
        })
    }

    /// The `k` hottest files by [`Self::heat_of`] at `now`, hottest first.
    pub fn hottest(&self, now: Nanos, k: usize) -> Vec<(Ino, f64)> {
        let mut v: Vec<(Ino, f64)> = self
            .heat
            .keys()
            .map(|&ino| (ino, self.heat_of(ino, now)))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(k);
        v
    }

    pub fn explain(&self, ino: Ino, now: Nanos) -> String {
        let h = self.heat_of(ino, now);
        format!(
            "{} (opens, decayed with half-life {:.0} s: {h:.2})",
            self.policy.explain(ino, now),
            self.half_life_ns / 1e9
        )
    }

    /// Heat rows for the checkpoint.
    pub fn heat_rows(&self) -> Vec<(u64, f64, u64)> {
        self.heat
            .iter()
            .map(|(i, (h, l))| (*i, *h as f64, *l))
            .collect()
    }

    /// Restore heat from a checkpoint by replaying a compact summary of touches.
    pub fn restore(&mut self, rows: &[(u64, f64, u64)]) {
        for &(ino, h, last) in rows {
            let n = (h.round() as u32).clamp(1, MAX_REPLAY);
            for k in 0..n {
                let at = last.saturating_sub(REPLAY_GAP_NS * (n - 1 - k) as u64);
                self.policy.record(&Access {
                    at,
                    object: ino,
                    op: Op::Open,
                    offset: 0,
                    len: 0,
                });
            }
            self.heat.insert(ino, (h as f32, last));
        }
    }
}
