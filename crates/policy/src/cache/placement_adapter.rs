//! Runs any [`CachePolicy`] as a two-tier [`PlacementPolicy`]: tier 0 is the cache, tier 1
//! the backing store.
//!
//! Every access is replayed into the cache (sized by the object's placed size, or by the
//! access length while the object is unknown). The cache's verdict defines where each
//! object *should* live: cached objects on tier 0, the rest on tier 1, pinned objects on
//! their pin. Objects whose verdict may have changed (admitted, evicted, placed, pinned)
//! are queued; [`PlacementPolicy::plan`] turns the queue into moves — demotions first, to
//! make room, then promotions — within the byte budget and the tiers' hard capacities.
//! Moves that do not fit stay queued for the next plan. New objects are created on tier 1
//! and earn tier 0 through the cache, like a write-allocate cache filling on first access.
//!
//! [`placement_by_name`] builds one from a policy name for `kaiso sim tier --policy
//! cache:<name>`; an offline policy (Belady) is given the future with
//! [`CachePlacement::set_future`], since an access carries no next-access index.

use std::collections::VecDeque;

use super::hash::{FxHashMap, FxHashSet};
use super::{CachePolicy, Capacity, Error, Eviction, NEVER, Request, by_name};
use crate::engine::{Access, Move, MoveReason, ObjectId, Op, PlacementPolicy, TierId, TierState};
use crate::time::Nanos;

/// Where an object is, as reported by the caller.
#[derive(Clone, Copy, Debug)]
struct Placed {
    size: u64,
    tier: TierId,
}

/// A [`CachePolicy`] driving two tiers. Build it with [`as_placement`].
pub struct CachePlacement {
    cache: Box<dyn CachePolicy>,
    name: String,
    placed: FxHashMap<ObjectId, Placed>,
    pinned: FxHashMap<ObjectId, TierId>,
    queue: VecDeque<ObjectId>,
    queued: FxHashSet<ObjectId>,
    evicted: Vec<Eviction>,
    /// Next-access index of each `record` call, in call order (offline policies).
    future: Option<Vec<u64>>,
    recorded: usize,
}

/// Builds a cache policy as a two-tier placement: `spec` is a [`by_name`] policy name with
/// optional parameters after a colon (`lru`, `s3fifo:small-size-ratio=0.2`), the cache
/// holding `fast_tier_bytes` (object sizes counted). Belady needs `future` (see
/// [`CachePlacement::set_future`]) and is refused without it; other policies ignore it.
pub fn placement_by_name(
    spec: &str,
    fast_tier_bytes: u64,
    future: Option<Vec<u64>>,
) -> Result<CachePlacement, Error> {
    let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
    let cache = by_name(name, Capacity::bytes(fast_tier_bytes), params)?;
    let offline = cache.name().starts_with("Belady");
    if offline && future.is_none() {
        return Err(Error::NeedsFuture(name.to_string()));
    }
    let mut p = as_placement(cache);
    if let Some(f) = future {
        p.set_future(f);
    }
    Ok(p)
}

/// Wraps a cache as a two-tier placement policy (tier 0 = cache, tier 1 = backing store).
pub fn as_placement(cache: Box<dyn CachePolicy>) -> CachePlacement {
    let mut cache = cache;
    cache.set_eviction_log(true);
    let name = format!("cache:{}", cache.name());
    CachePlacement {
        cache,
        name,
        placed: FxHashMap::default(),
        pinned: FxHashMap::default(),
        queue: VecDeque::new(),
        queued: FxHashSet::default(),
        evicted: Vec::new(),
        future: None,
        recorded: 0,
    }
}

impl CachePlacement {
    /// Gives an offline policy (Belady) the future: `next[i]` is the index of the next
    /// `record` call for the same object as the `i`-th one ([`NEVER`] if none), counting
    /// only `record` calls that are not deletes (fill it with
    /// [`annotate_next_access`](super::annotate_next_access) over the accessed object ids).
    /// Calls past the end of `next` are treated as "never again".
    pub fn set_future(&mut self, next: Vec<u64>) {
        self.future = Some(next);
        self.recorded = 0;
    }

    /// The wrapped cache (hit statistics, occupancy).
    pub fn cache(&self) -> &dyn CachePolicy {
        self.cache.as_ref()
    }

    fn enqueue(&mut self, id: ObjectId) {
        if self.queued.insert(id) {
            self.queue.push_back(id);
        }
    }

    /// The tier the object should be on now.
    fn wanted(&self, id: ObjectId) -> TierId {
        match self.pinned.get(&id) {
            Some(&t) => t,
            None if self.cache.contains(id) => 0,
            None => 1,
        }
    }
}

impl PlacementPolicy for CachePlacement {
    fn name(&self) -> &str {
        &self.name
    }

    fn record(&mut self, access: &Access) {
        if access.op == Op::Delete {
            self.forget(access.object);
            return;
        }
        let size = match self.placed.get(&access.object) {
            Some(p) => p.size,
            None => access.len.max(1),
        };
        let mut req = Request::new(access.at, access.object, size);
        if let Some(f) = &self.future {
            req.next_access = f.get(self.recorded).copied().unwrap_or(NEVER);
            self.recorded += 1;
        }
        let hit = self.cache.access(&req);
        let mut evicted = std::mem::take(&mut self.evicted);
        self.cache.drain_evictions(&mut evicted);
        for e in evicted.drain(..) {
            if self.placed.contains_key(&e.id) {
                self.enqueue(e.id);
            }
        }
        self.evicted = evicted;
        if !hit && self.placed.contains_key(&access.object) && self.cache.contains(access.object) {
            self.enqueue(access.object);
        }
    }

    fn placed(&mut self, object: ObjectId, size: u64, tier: TierId) {
        self.placed.insert(object, Placed { size, tier });
        if self.wanted(object) != tier {
            self.enqueue(object);
        }
    }

    fn forget(&mut self, object: ObjectId) {
        self.cache.remove(object);
        self.placed.remove(&object);
        self.pinned.remove(&object);
        // A queued id without placement is skipped by plan.
    }

    fn pin(&mut self, object: ObjectId, tier: Option<TierId>) {
        match tier {
            Some(t) => {
                self.pinned.insert(object, t.min(1));
            }
            None => {
                self.pinned.remove(&object);
            }
        }
        self.enqueue(object);
    }

    fn place_new(&mut self, _now: Nanos, _size_hint: u64, tiers: &[TierState]) -> TierId {
        if tiers.len() > 1 { 1 } else { 0 }
    }

    fn plan(&mut self, _now: Nanos, tiers: &[TierState], max_bytes: u64) -> Vec<Move> {
        let mut used: Vec<u64> = tiers.iter().map(|t| t.used).collect();
        let mut budget = max_bytes;
        let mut moves = Vec::new();
        let mut retry = Vec::new();
        let pending: Vec<ObjectId> = self.queue.drain(..).collect();
        self.queued.clear();
        // Two passes: demotions (to tier 1) first so promotions find the room they free.
        for pass_to in [1u8, 0u8] {
            for &id in &pending {
                let Some(p) = self.placed.get(&id).copied() else {
                    continue;
                };
                let to = self.wanted(id);
                if to != pass_to || to == p.tier {
                    continue;
                }
                let (from, t) = (p.tier as usize, to as usize);
                let fits = t < tiers.len() && used[t] + p.size <= tiers[t].capacity;
                if !fits || p.size > budget {
                    retry.push(id);
                    continue;
                }
                budget -= p.size;
                used[t] += p.size;
                if from < used.len() {
                    used[from] = used[from].saturating_sub(p.size);
                }
                let reason = if self.pinned.contains_key(&id) {
                    MoveReason::Manual
                } else if to == 0 {
                    MoveReason::Promote
                } else {
                    MoveReason::Evict
                };
                moves.push(Move {
                    object: id,
                    from: p.tier,
                    to,
                    bytes: p.size,
                    reason,
                });
            }
        }
        for id in retry {
            self.enqueue(id);
        }
        moves
    }

    fn explain(&self, object: ObjectId, _now: Nanos) -> String {
        let cached = if self.cache.contains(object) {
            "cached"
        } else {
            "not cached"
        };
        let on = match self.placed.get(&object) {
            Some(p) => format!("on tier {} ({} bytes)", p.tier, p.size),
            None => "not placed".to_string(),
        };
        let pin = match self.pinned.get(&object) {
            Some(t) => format!(", pinned to tier {t}"),
            None => String::new(),
        };
        format!(
            "{}: {cached} ({}/{} used), {on}{pin}",
            self.name,
            self.cache.used(),
            self.cache.capacity()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Capacity, by_name};
    use super::*;

    fn tiers(used0: u64, cap0: u64) -> Vec<TierState> {
        let t = |used, capacity| TierState {
            capacity,
            used,
            high_watermark: 0.9,
            low_watermark: 0.8,
            busy: 0.0,
        };
        vec![t(used0, cap0), t(0, u64::MAX / 2)]
    }

    fn read(at: Nanos, object: ObjectId) -> Access {
        Access {
            at,
            object,
            op: Op::Read,
            offset: 0,
            len: 10,
        }
    }

    #[test]
    fn misses_promote_and_evictions_demote() {
        let mut p = as_placement(by_name("lru", Capacity::bytes(20), "").unwrap());
        assert_eq!(p.place_new(0, 10, &tiers(0, 20)), 1);
        for id in 1..=3 {
            p.placed(id, 10, 1);
        }
        p.record(&read(1, 1));
        p.record(&read(2, 2));
        let moves = p.plan(3, &tiers(0, 20), u64::MAX);
        assert_eq!(moves.len(), 2);
        assert!(
            moves
                .iter()
                .all(|m| m.from == 1 && m.to == 0 && m.reason == MoveReason::Promote)
        );
        for m in &moves {
            p.placed(m.object, m.bytes, m.to);
        }
        // 3 evicts 1 (LRU): plan demotes 1 before promoting 3.
        p.record(&read(4, 3));
        let moves = p.plan(5, &tiers(20, 20), u64::MAX);
        assert_eq!(
            moves,
            vec![
                Move {
                    object: 1,
                    from: 0,
                    to: 1,
                    bytes: 10,
                    reason: MoveReason::Evict
                },
                Move {
                    object: 3,
                    from: 1,
                    to: 0,
                    bytes: 10,
                    reason: MoveReason::Promote
                },
            ]
        );
        assert!(p.explain(3, 5).contains("cached"));
    }

    #[test]
    fn placement_by_name_builds_every_baseline() {
        for name in super::super::POLICY_NAMES {
            let p = placement_by_name(name, 1 << 20, None);
            if *name == "belady" {
                let e = p.err().expect("belady without a future is refused");
                assert!(matches!(e, Error::NeedsFuture(_)), "{e}");
                assert!(e.to_string().contains("offline"));
                continue;
            }
            let p = p.unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(p.name().starts_with("cache:"), "{}", p.name());
            assert_eq!(p.cache().capacity(), Capacity::bytes(1 << 20));
        }
        let p = placement_by_name("s3fifo:small-size-ratio=0.2", 1000, None).unwrap();
        assert_eq!(p.name(), "cache:S3FIFO-0.2000-2");
        assert!(placement_by_name("nope", 1000, None).is_err());
        assert!(placement_by_name("lru:x=1", 1000, None).is_err());
        assert!(placement_by_name("lru", 0, None).is_err());
    }

    #[test]
    fn belady_placement_uses_the_future_it_is_given() {
        // Cache of 2 objects; accesses 1 2 3 1 2: with the future, Belady keeps 1 and 2
        // (3 is never used again) so the 4th and 5th accesses hit.
        let ids = [1u64, 2, 3, 1, 2];
        let mut reqs: Vec<Request> = ids.iter().map(|&id| Request::new(0, id, 10)).collect();
        super::super::annotate_next_access(&mut reqs);
        let future: Vec<u64> = reqs.iter().map(|r| r.next_access).collect();
        let mut p = placement_by_name("belady", 20, Some(future)).unwrap();
        for &id in &ids {
            p.placed(id, 10, 1);
        }
        for (t, &id) in ids.iter().enumerate() {
            p.record(&read(t as Nanos, id));
        }
        assert!(p.cache().contains(1) && p.cache().contains(2) && !p.cache().contains(3));
        let moves = p.plan(9, &tiers(0, 20), u64::MAX);
        let mut promoted: Vec<ObjectId> = moves.iter().map(|m| m.object).collect();
        promoted.sort_unstable();
        assert_eq!(promoted, vec![1, 2]);
    }

    #[test]
    fn budget_and_capacity_defer_moves() {
        let mut p = as_placement(by_name("fifo", Capacity::bytes(100), "").unwrap());
        for id in 1..=3 {
            p.placed(id, 10, 1);
            p.record(&read(id, id));
        }
        let moves = p.plan(9, &tiers(0, 100), 15);
        assert_eq!(moves.len(), 1, "a 15-byte budget moves one 10-byte object");
        let moves = p.plan(10, &tiers(10, 25), u64::MAX);
        assert_eq!(moves.len(), 1, "tier 0 has room for one more");
        p.placed(1, 10, 0);
        p.placed(2, 10, 0);
        p.pin(1, Some(1));
        let moves = p.plan(11, &tiers(20, 100), u64::MAX);
        assert_eq!(
            moves,
            vec![
                Move {
                    object: 1,
                    from: 0,
                    to: 1,
                    bytes: 10,
                    reason: MoveReason::Manual
                },
                Move {
                    object: 3,
                    from: 1,
                    to: 0,
                    bytes: 10,
                    reason: MoveReason::Promote
                },
            ]
        );
        p.forget(2);
        assert!(!p.cache().contains(2));
    }
}
