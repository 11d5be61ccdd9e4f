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

use super::queue_set::{Entry, QueueSet};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

/// Queue numbers in the [`QueueSet`].
const SMALL: usize = 0;
const MAIN: usize = 1;
const GHOST: usize = 2;

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    freq: u32,
    at: u32,
}

impl Entry for Obj {
    fn id(&self) -> u64 {
        self.id
    }
    fn charge(&self) -> u64 {
        self.charge
    }
    fn queue(&self) -> usize {
        self.at as usize
    }
    fn set_queue(&mut self, q: usize) {
        self.at = q as u32;
    }
}

pub struct S3Fifo {
    q: QueueSet<Obj, 3>,
    small_cap: u64,
    main_cap: u64,
    ghost_cap: u64,
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
            q: QueueSet::new(capacity, 2),
            small_cap,
            main_cap: c - small_cap,
            ghost_cap: (c as f64 * ghost_ratio) as u64,
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

    /// Records `obj`'s id in the ghost FIFO (a FIFO cache of ids with its own capacity).
    fn ghost_insert(&mut self, obj: Obj) {
        if obj.charge > self.ghost_cap {
            return;
        }
        while self.q.used[GHOST] + obj.charge > self.ghost_cap {
            let t = self.q.victim(GHOST, "S3FIFO ghost");
            self.q.drop_at(t);
        }
        self.q.push_head(GHOST, Obj { freq: 0, ..obj });
    }

    fn evict_main(&mut self) {
        while self.q.used[MAIN] > 0 {
            let t = self.q.tail(MAIN);
            let obj = self.q.get_mut(t);
            if obj.freq >= 1 {
                obj.freq = obj.freq.min(3) - 1;
                self.q.move_to_head(t, MAIN);
            } else {
                self.q.evict_at(t);
                return;
            }
        }
    }

    fn evict_small(&mut self) {
        while self.q.used[SMALL] > 0 {
            let t = self.q.tail(SMALL);
            let obj = self.q.get_mut(t);
            if obj.freq >= self.threshold {
                obj.freq = 0;
                self.q.move_to_head(t, MAIN);
            } else {
                let obj = self.q.evict_at(t);
                self.ghost_insert(obj);
                return;
            }
        }
    }

    fn evict(&mut self) {
        self.has_evicted = true;
        if self.q.used[MAIN] > self.main_cap || self.q.used[SMALL] == 0 {
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
        if let Some(i) = self.q.slot(req.id) {
            let obj = self.q.get_mut(i);
            if obj.at != GHOST as u32 {
                obj.freq += 1;
                return true;
            }
            self.q.drop_at(i);
            ghost_hit = true;
        }
        let charge = self.q.meter.charge(req);
        if charge > self.small_cap {
            return false;
        }
        while self.q.meter.needs_room(charge) {
            self.evict();
        }
        let to = if ghost_hit {
            MAIN
        } else if charge >= self.small_cap {
            return false;
        } else if !self.has_evicted && self.q.used[SMALL] >= self.small_cap {
            MAIN
        } else {
            SMALL
        };
        self.q.admit(
            to,
            Obj {
                id: req.id,
                charge,
                freq: 0,
                at: to as u32,
            },
        );
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.q
            .slot(id)
            .is_some_and(|i| self.q.get(i).queue() != GHOST)
    }

    fn len(&self) -> usize {
        self.q.count(SMALL) + self.q.count(MAIN)
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.q.slot(id) else {
            return false;
        };
        if self.q.get(i).queue() == GHOST {
            self.q.drop_at(i);
            return false;
        }
        self.q.remove_at(i);
        true
    }

    fn meter(&self) -> &Meter {
        &self.q.meter
    }

    fn meter_mut(&mut self) -> &mut Meter {
        &mut self.q.meter
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
        assert_eq!((c.q.used[SMALL], c.q.used[MAIN]), (2, 18));
        // 1 is in the ghost now: a miss that lands in main (2 leaves small to make room).
        assert!(!c.access(&Request::new(0, 1, 1)));
        assert!(c.contains(1) && !c.contains(2));
        assert_eq!(c.q.used[MAIN], 19);
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
