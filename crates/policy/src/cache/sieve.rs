//! SIEVE (NSDI'24; libCacheSim `Sieve`): a FIFO queue with one visited bit and a hand.
//!
//! New objects enter at the head unvisited; a hit sets the bit and moves nothing. The hand
//! starts at the tail and walks towards the head, clearing visited bits, and evicts the
//! first unvisited object; it then rests on that object's newer neighbour (wrapping to the
//! tail past the head). Survivors stay in place, unlike CLOCK's rotation.

use super::hash::FxHashMap;
use super::list::{List, NIL, Slab};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    visited: bool,
}

pub struct Sieve {
    meter: Meter,
    slab: Slab<Obj>,
    map: FxHashMap<u64, u32>,
    queue: List,
    /// Next object the hand examines; NIL means "start from the tail".
    hand: u32,
}

impl Sieve {
    pub fn new(capacity: Capacity) -> Self {
        Sieve {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(capacity.reserve_hint()),
            map: super::hash::map_with_capacity(capacity.reserve_hint()),
            queue: List::new(),
            hand: NIL,
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("Sieve", &[])?;
        Ok(Self::new(capacity))
    }

    fn evict(&mut self) {
        let mut i = if self.hand == NIL {
            self.queue.tail
        } else {
            self.hand
        };
        while self.slab.get(i).visited {
            self.slab.get_mut(i).visited = false;
            let p = self.slab.prev(i);
            i = if p == NIL { self.queue.tail } else { p };
        }
        self.hand = self.slab.prev(i);
        let obj = *self.slab.get(i);
        self.queue.unlink(&mut self.slab, i);
        self.slab.free(i);
        self.map.remove(&obj.id);
        self.meter.evicted(obj.id, obj.charge);
    }
}

impl CachePolicy for Sieve {
    fn name(&self) -> &str {
        "Sieve"
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        if let Some(&i) = self.map.get(&req.id) {
            self.slab.get_mut(i).visited = true;
            return true;
        }
        let charge = self.meter.charge(req);
        if !self.meter.fits(charge) {
            return false;
        }
        while self.meter.needs_room(charge) {
            self.evict();
        }
        let i = self.slab.alloc(Obj {
            id: req.id,
            charge,
            visited: false,
        });
        self.queue.push_head(&mut self.slab, i);
        self.map.insert(req.id, i);
        self.meter.add(charge);
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.map.contains_key(&id)
    }

    fn len(&self) -> usize {
        self.map.len()
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.map.remove(&id) else {
            return false;
        };
        if self.hand == i {
            self.hand = self.slab.prev(i);
        }
        self.queue.unlink(&mut self.slab, i);
        self.meter.sub(self.slab.get(i).charge);
        self.slab.free(i);
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
    fn hand_stays_where_it_evicted() {
        // cap 3: 1 2 3; hit 1 and 2. 4: hand at tail 1 (visited, clear) -> 2 (visited,
        // clear) -> 3 evicted, hand rests at 3's newer neighbour = none -> wraps next time.
        // 5: hand from tail: 1 (clear now) evicted. 2: hit. 1: miss.
        let mut c = Sieve::new(Capacity::objects(3));
        assert_eq!(run_ids(&mut c, &[1, 2, 3, 1, 2, 4, 5, 2, 1]), "mmmhhmmhm");
        assert!(!c.contains(3));
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Sieve::new(cap)));
    }
}
