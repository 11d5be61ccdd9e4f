//! An smq-like stochastic multiqueue (after dm-cache's default `smq` policy).
//!
//! dm-cache smq is a block-device policy; this is an object-cache rendering of its three
//! ideas, not a line-by-line port (Linux has no object-level smq to compare with):
//! - **Multiqueue of cached objects.** `levels` LRU lists (default 8). New objects enter
//!   level 0. A hit moves the object to the MRU end of the next level up, and when that
//!   level holds more than its share (cached objects / levels) its LRU entry is swapped
//!   down into the level the hit object left — smq's "hits swap with the LRU entry one level
//!   up", with no per-object counters. Eviction takes the LRU entry of the lowest
//!   non-empty level.
//! - **Hotspot queue deciding promotion.** Misses do not enter the cache on their own: a
//!   table of coarse *hotspot regions* (object id >> `hotspot-shift`, default 4: 16
//!   adjacent ids, i.e. 16 blocks of a volume) keeps a small decaying counter per region.
//!   While the cache has free space every miss is admitted (as smq fills its free blocks);
//!   once full, a miss is admitted only if its region's counter has reached
//!   `promote-threshold` (default 2, the current access included).
//! - **Self-tuning speed.** The table's hit ratio over the last window is tracked; when it
//!   performs badly (below 50%: the workload moved) counters jump by 2 per access instead of
//!   1, so the new hot set is promoted sooner ("starts moving entries more quickly between
//!   levels … adapts to new IO patterns very quickly").
//!
//! The table is bounded (4 × cached objects + 64 regions), so memory follows the cache, not
//! the trace. Counters halve every time the table has seen as many accesses as it holds
//! entries (lazily, by epoch). When the table is full the victim is the colder of two
//! regions sampled with the seeded generator (`seed`, default 1): that sampling is the
//! "stochastic" part, O(1) and deterministic under the seed.

use super::id_map::IdMap;
use super::list::{List, Slab};
use super::rng::SplitMix64;
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    level: u8,
}

#[derive(Clone, Copy, Debug)]
struct Region {
    key: u64,
    count: u8,
    epoch: u32,
}

const MAX_COUNT: u8 = 15;

pub struct Smq {
    meter: Meter,
    slab: Slab<Obj>,
    map: IdMap,
    levels: Vec<List>,
    // Hotspot table: dense vector + index for O(1) random sampling.
    regions: Vec<Region>,
    region_index: IdMap,
    shift: u32,
    threshold: u8,
    epoch: u32,
    touches_this_epoch: u64,
    window_lookups: u32,
    window_found: u32,
    jump: u8,
    rng: SplitMix64,
}

impl Smq {
    pub fn new(capacity: Capacity, levels: usize, shift: u32, threshold: u8, seed: u64) -> Self {
        Smq {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(capacity.reserve_hint()),
            map: IdMap::with_capacity(capacity.reserve_hint()),
            levels: vec![List::new(); levels.max(1)],
            regions: Vec::new(),
            region_index: IdMap::with_capacity(4 * capacity.reserve_hint() + 64),
            shift,
            threshold,
            epoch: 0,
            touches_this_epoch: 0,
            window_lookups: 0,
            window_found: 0,
            jump: 1,
            rng: SplitMix64::new(seed),
        }
    }

    /// Parameters: `levels` (1..=64, default 8), `hotspot-shift` (0..=32, default 4),
    /// `promote-threshold` (1..=15, default 2), `seed` (default 1).
    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        const P: &str = "smq";
        params.check(P, &["levels", "hotspot-shift", "promote-threshold", "seed"])?;
        let levels = params.int(P, "levels", 8, 1..=64, "an integer in 1..=64")?;
        let shift = params.int(P, "hotspot-shift", 4, 0..=32, "an integer in 0..=32")?;
        let thr = params.int(P, "promote-threshold", 2, 1..=15, "an integer in 1..=15")?;
        let seed = params.int(P, "seed", 1, 0..=u64::MAX, "an unsigned integer")?;
        Ok(Self::new(
            capacity,
            levels as usize,
            shift as u32,
            thr as u8,
            seed,
        ))
    }

    fn table_limit(&self) -> usize {
        4 * self.map.len() + 64
    }

    fn decayed(&self, r: &Region) -> u8 {
        let age = self.epoch.wrapping_sub(r.epoch);
        if age >= 8 { 0 } else { r.count >> age }
    }

    /// Counts an access to the object's region and returns the region's counter after it.
    fn touch_region(&mut self, id: u64) -> u8 {
        let key = id >> self.shift;
        self.touches_this_epoch += 1;
        if self.touches_this_epoch >= self.regions.len().max(64) as u64 {
            self.touches_this_epoch = 0;
            self.epoch = self.epoch.wrapping_add(1);
        }
        self.window_lookups += 1;
        let count = if let Some(k) = self.region_index.get(key) {
            self.window_found += 1;
            let r = self.regions[k as usize];
            let c = self.decayed(&r).saturating_add(self.jump).min(MAX_COUNT);
            self.regions[k as usize] = Region {
                key,
                count: c,
                epoch: self.epoch,
            };
            c
        } else {
            if self.regions.len() >= self.table_limit() {
                self.drop_cold_region();
            }
            let c = self.jump.min(MAX_COUNT);
            self.region_index.insert(key, self.regions.len() as u32);
            self.regions.push(Region {
                key,
                count: c,
                epoch: self.epoch,
            });
            c
        };
        if self.window_lookups >= 1024 {
            // Performing badly (most regions unknown): move faster.
            self.jump = if self.window_found * 2 < self.window_lookups {
                2
            } else {
                1
            };
            self.window_lookups = 0;
            self.window_found = 0;
        }
        count
    }

    fn drop_cold_region(&mut self) {
        let n = self.regions.len() as u64;
        let a = self.rng.below(n) as usize;
        let b = self.rng.below(n) as usize;
        let victim = if self.decayed(&self.regions[a]) <= self.decayed(&self.regions[b]) {
            a
        } else {
            b
        };
        let key = self.regions[victim].key;
        self.region_index.remove(key);
        self.regions.swap_remove(victim);
        if victim < self.regions.len() {
            let moved = self.regions[victim].key;
            self.region_index.insert(moved, victim as u32);
        }
    }

    fn share(&self) -> usize {
        self.map.len().div_ceil(self.levels.len()).max(1)
    }

    fn evict(&mut self) {
        let level = self
            .levels
            .iter()
            .position(|l| !l.is_empty())
            .expect("eviction from an empty smq");
        let t = self.levels[level]
            .pop_tail(&mut self.slab)
            .expect("non-empty level");
        let obj = *self.slab.get(t);
        self.slab.free(t);
        self.map.remove(obj.id);
        self.meter.evicted(obj.id, obj.charge);
    }

    fn hit(&mut self, i: u32) {
        let level = self.slab.get(i).level as usize;
        let top = self.levels.len() - 1;
        if level == top {
            self.levels[top].move_to_head(&mut self.slab, i);
            return;
        }
        let up = level + 1;
        self.levels[level].unlink(&mut self.slab, i);
        if self.levels[up].len >= self.share() {
            // Swap: the LRU entry of the level above comes down to this level's MRU end.
            let d = self.levels[up]
                .pop_tail(&mut self.slab)
                .expect("non-empty level");
            self.slab.get_mut(d).level = level as u8;
            self.levels[level].push_head(&mut self.slab, d);
        }
        self.slab.get_mut(i).level = up as u8;
        self.levels[up].push_head(&mut self.slab, i);
    }
}

impl CachePolicy for Smq {
    fn name(&self) -> &str {
        "smq"
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        let count = self.touch_region(req.id);
        if let Some(i) = self.map.get(req.id) {
            self.hit(i);
            return true;
        }
        let charge = self.meter.charge(req);
        if !self.meter.fits(charge) {
            return false;
        }
        if self.meter.needs_room(charge) && count < self.threshold {
            return false;
        }
        while self.meter.needs_room(charge) {
            self.evict();
        }
        let i = self.slab.alloc(Obj {
            id: req.id,
            charge,
            level: 0,
        });
        self.levels[0].push_head(&mut self.slab, i);
        self.map.insert(req.id, i);
        self.meter.add(charge);
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(id)
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.map.remove(id) else {
            return false;
        };
        let obj = *self.slab.get(i);
        self.levels[obj.level as usize].unlink(&mut self.slab, i);
        self.slab.free(i);
        self.meter.sub(obj.charge);
        true
    }

    fn meter(&self) -> &Meter {
        &self.meter
    }

    fn meter_mut(&mut self) -> &mut Meter {
        &mut self.meter
    }
}

#[cfg(test)]
mod tests {
    use super::super::testkit::*;
    use super::*;

    #[test]
    fn admits_freely_until_full_then_needs_a_warm_region() {
        // shift 0: regions are single objects; threshold 2 = "second touch admits".
        let mut c = Smq::new(Capacity::objects(2), 4, 0, 2, 7);
        assert_eq!(run_ids(&mut c, &[1, 2, 3]), "mmm");
        assert!(
            !c.contains(3),
            "a cold miss is not admitted into a full cache"
        );
        assert_eq!(run_ids(&mut c, &[3, 3]), "mh", "the second touch admits it");
    }

    #[test]
    fn hits_climb_levels_and_protect_hot_objects_from_a_scan() {
        let mut c = Smq::new(Capacity::objects(4), 4, 0, 2, 7);
        run_ids(&mut c, &[1, 1, 1, 2, 2, 3, 4]);
        // A scan of new ids: none is admitted (cold regions), the hot set stays.
        let scan: Vec<u64> = (100..200).collect();
        assert_eq!(run_ids(&mut c, &scan), "m".repeat(100));
        assert!(c.contains(1) && c.contains(2));
        assert_eq!(c.slab.get(c.map.get(1).unwrap()).level, 2);
    }

    #[test]
    fn seed_changes_only_the_sampling() {
        let reqs = stream(
            5,
            5000,
            Shape::Zipf {
                objects: 2000,
                alpha: 0.7,
            },
            1,
        );
        let a = replay_checked(&mut Smq::new(Capacity::objects(50), 8, 0, 2, 1), &reqs);
        let b = replay_checked(&mut Smq::new(Capacity::objects(50), 8, 0, 2, 1), &reqs);
        assert_eq!(a, b);
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Smq::new(cap, 8, 4, 2, 1)));
        check_invariants(|cap| Box::new(Smq::new(cap, 1, 0, 1, 3)));
    }
}
