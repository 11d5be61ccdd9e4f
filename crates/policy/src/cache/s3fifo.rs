//! S3-FIFO (SOSP'23; libCacheSim `S3FIFO`): a small FIFO, a main FIFO and a ghost FIFO.
//!
//! - Sizes: small = ⌊C·`small-size-ratio`⌋ (default 0.10), main = C − small, ghost =
//!   ⌊C·`ghost-size-ratio`⌋ (default 0.90) of *ids* (charged like the objects they name).
//! - Miss: an id found in the ghost is admitted straight into main; otherwise into small
//!   (while the cache has never evicted, into main once small holds its share — the warm-up
//!   rule of libcachesim 0.3.5). As in libCacheSim, an object larger than the small queue is
//!   never admitted, and one exactly the small queue's size makes room but is not inserted.
//! - Hit (small or main): the object's counter is incremented; nothing moves.
//! - Eviction: if main is over its share (or small is empty), main's tail is examined: a
//!   counter ≥ 1 reinserts it at main's head with counter min(c, 3) − 1, else it is evicted.
//!   Otherwise small's tail is examined: a counter ≥ `move-to-main-threshold` (default 2,
//!   libCacheSim's default) moves it to main's head; else it is evicted and its id enters
//!   the ghost.

use super::hash::FxHashMap;
use super::list::{List, Slab};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    Small,
    Main,
    Ghost,
}

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    freq: u32,
    at: Where,
}

pub struct S3Fifo {
    meter: Meter,
    slab: Slab<Obj>,
    map: FxHashMap<u64, u32>,
    small: List,
    main: List,
    ghost: List,
    small_cap: u64,
    main_cap: u64,
    ghost_cap: u64,
    small_used: u64,
    main_used: u64,
    ghost_used: u64,
    threshold: u32,
    /// Until the first eviction, new objects overflow from a full small queue into main
    /// (libcachesim 0.3.5 behaviour, confirmed by hit-for-hit comparison).
    has_evicted: bool,
    name: String,
}

impl S3Fifo {
    pub fn new(capacity: Capacity, small_ratio: f64, ghost_ratio: f64, threshold: u32) -> Self {
        let c = capacity.limit;
        let small_cap = (c as f64 * small_ratio) as u64;
        S3Fifo {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(2 * capacity.reserve_hint()),
            map: super::hash::map_with_capacity(2 * capacity.reserve_hint()),
            small: List::new(),
            main: List::new(),
            ghost: List::new(),
            small_cap,
            main_cap: c - small_cap,
            ghost_cap: (c as f64 * ghost_ratio) as u64,
            small_used: 0,
            main_used: 0,
            ghost_used: 0,
            threshold,
            has_evicted: false,
            name: format!("S3FIFO-{small_ratio:.4}-{threshold}"),
        }
    }

    /// Parameters: `small-size-ratio` (alias `fifo-size-ratio`, default 0.10),
    /// `ghost-size-ratio` (default 0.90, 0 disables the ghost), `move-to-main-threshold`
    /// (default 2).
    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        const P: &str = "S3FIFO";
        params.check(
            P,
            &[
                "small-size-ratio",
                "fifo-size-ratio",
                "ghost-size-ratio",
                "move-to-main-threshold",
            ],
        )?;
        let small = params.ratio(P, "fifo-size-ratio", 0.10, false)?;
        let small = params.ratio(P, "small-size-ratio", small, false)?;
        let ghost = params.int_or_ratio_ghost(P)?;
        let thr = params.int(
            P,
            "move-to-main-threshold",
            2,
            1..=1_000_000,
            "an integer ≥ 1",
        )?;
        Ok(Self::new(capacity, small, ghost, thr as u32))
    }

    fn list(&mut self, at: Where) -> &mut List {
        match at {
            Where::Small => &mut self.small,
            Where::Main => &mut self.main,
            Where::Ghost => &mut self.ghost,
        }
    }

    fn used_mut(&mut self, at: Where) -> &mut u64 {
        match at {
            Where::Small => &mut self.small_used,
            Where::Main => &mut self.main_used,
            Where::Ghost => &mut self.ghost_used,
        }
    }

    /// Unlinks node `i` from its queue and drops it entirely (map and slab).
    fn drop_node(&mut self, i: u32) -> Obj {
        let obj = *self.slab.get(i);
        let mut list = *self.list(obj.at);
        list.unlink(&mut self.slab, i);
        *self.list(obj.at) = list;
        *self.used_mut(obj.at) -= obj.charge;
        self.slab.free(i);
        self.map.remove(&obj.id);
        obj
    }

    /// Links a node for `id` at the head of `at`.
    fn push(&mut self, id: u64, charge: u64, freq: u32, at: Where) -> u32 {
        let i = self.slab.alloc(Obj {
            id,
            charge,
            freq,
            at,
        });
        let mut list = *self.list(at);
        list.push_head(&mut self.slab, i);
        *self.list(at) = list;
        *self.used_mut(at) += charge;
        self.map.insert(id, i);
        i
    }

    /// Moves node `i` (in small or main) to main's head with counter `freq`.
    fn move_to_main_head(&mut self, i: u32, freq: u32) {
        let obj = *self.slab.get(i);
        let mut list = *self.list(obj.at);
        list.unlink(&mut self.slab, i);
        *self.list(obj.at) = list;
        *self.used_mut(obj.at) -= obj.charge;
        self.main.push_head(&mut self.slab, i);
        self.main_used += obj.charge;
        let o = self.slab.get_mut(i);
        o.at = Where::Main;
        o.freq = freq;
    }

    /// Records `id` in the ghost FIFO (a FIFO cache of ids with its own capacity).
    fn ghost_insert(&mut self, id: u64, charge: u64) {
        if charge > self.ghost_cap {
            return;
        }
        while self.ghost_used + charge > self.ghost_cap {
            let t = self.ghost.tail;
            self.drop_node(t);
        }
        self.push(id, charge, 0, Where::Ghost);
    }

    fn evict_main(&mut self) {
        while self.main_used > 0 {
            let t = self.main.tail;
            let freq = self.slab.get(t).freq;
            if freq >= 1 {
                self.move_to_main_head(t, freq.min(3) - 1);
            } else {
                let obj = self.drop_node(t);
                self.meter.evicted(obj.id, obj.charge);
                return;
            }
        }
    }

    fn evict_small(&mut self) {
        while self.small_used > 0 {
            let t = self.small.tail;
            let obj = *self.slab.get(t);
            if obj.freq >= self.threshold {
                self.move_to_main_head(t, 0);
            } else {
                self.drop_node(t);
                self.meter.evicted(obj.id, obj.charge);
                self.ghost_insert(obj.id, obj.charge);
                return;
            }
        }
    }

    fn evict(&mut self) {
        self.has_evicted = true;
        if self.main_used > self.main_cap || self.small_used == 0 {
            self.evict_main();
        } else {
            self.evict_small();
        }
    }
}

impl Params {
    /// S3-FIFO's ghost ratio may be 0 (no ghost), unlike the other ratios.
    fn int_or_ratio_ghost(&self, policy: &'static str) -> Result<f64, Error> {
        self.ratio(policy, "ghost-size-ratio", 0.90, true)
    }
}

impl CachePolicy for S3Fifo {
    fn name(&self) -> &str {
        &self.name
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        let mut ghost_hit = false;
        if let Some(&i) = self.map.get(&req.id) {
            let obj = self.slab.get_mut(i);
            if obj.at != Where::Ghost {
                obj.freq += 1;
                return true;
            }
            self.drop_node(i);
            ghost_hit = true;
        }
        let charge = self.meter.charge(req);
        if charge > self.small_cap {
            return false;
        }
        while self.meter.needs_room(charge) {
            self.evict();
        }
        if ghost_hit {
            self.push(req.id, charge, 0, Where::Main);
        } else if charge >= self.small_cap {
            return false;
        } else if !self.has_evicted && self.small_used >= self.small_cap {
            self.push(req.id, charge, 0, Where::Main);
        } else {
            self.push(req.id, charge, 0, Where::Small);
        }
        self.meter.add(charge);
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&i| self.slab.get(i).at != Where::Ghost)
    }

    fn len(&self) -> usize {
        self.map.len() - self.ghost.len
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(&i) = self.map.get(&id) else {
            return false;
        };
        let obj = self.drop_node(i);
        if obj.at == Where::Ghost {
            return false;
        }
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
    fn one_hit_wonders_leave_through_small_and_ghost_hits_go_to_main() {
        // C = 10 objects: small 1, main 9, ghost 9.
        let mut c = S3Fifo::new(Capacity::objects(10), 0.1, 0.9, 2);
        // small cap is 1: an object of charge 1 is not < 1, so nothing enters small...
        assert_eq!(run_ids(&mut c, &[1, 1]), "mm");
        assert!(c.is_empty());
        // With C = 20: small 2, main 18. 1 and 2 fill small; until the first eviction the
        // next objects overflow into main (100..117). 118 needs room: small's tail (1,
        // never hit) leaves to the ghost, and 118 enters small.
        let mut c = S3Fifo::new(Capacity::objects(20), 0.1, 0.9, 2);
        assert_eq!(run_ids(&mut c, &[1, 2]), "mm");
        for id in 100..119 {
            c.access(&Request::new(0, id, 1));
        }
        assert!(!c.contains(1));
        assert_eq!((c.small_used, c.main_used), (2, 18));
        // 1 is in the ghost now: a miss that lands in main (2 leaves small to make room).
        assert!(!c.access(&Request::new(0, 1, 1)));
        assert!(c.contains(1) && !c.contains(2));
        assert_eq!(c.main_used, 19);
    }

    #[test]
    fn small_queue_hits_promote_at_threshold() {
        // C = 30: small 3. 1 hit twice in small -> moves to main when small evicts.
        let mut c = S3Fifo::new(Capacity::objects(30), 0.1, 0.9, 2);
        run_ids(&mut c, &[1, 1, 1, 2]);
        // Fill: the total passes 30 only after main receives objects, so drive 60 misses.
        for id in 100..160 {
            c.access(&Request::new(0, id, 1));
        }
        assert!(
            c.contains(1),
            "a twice-hit small object survives by moving to main"
        );
        assert!(!c.contains(2), "a one-hit object leaves through small");
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(S3Fifo::new(cap, 0.1, 0.9, 2)));
        check_invariants(|cap| Box::new(S3Fifo::new(cap, 0.25, 0.0, 1)));
    }
}
