//! SIEVE (NSDI'24; libCacheSim `Sieve`): a FIFO queue with one visited bit and a hand.
//!
//! New objects enter at the head unvisited; a hit sets the bit and moves nothing. The hand
//! starts at the tail and walks towards the head, clearing visited bits, and evicts the
//! first unvisited object; it then rests on that object's newer neighbour (wrapping to the
//! tail past the head). Survivors stay in place, unlike CLOCK's rotation.

use super::list::NIL;
use super::queue_set::{Entry, QueueSet};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    visited: bool,
}

impl Entry for Obj {
    fn id(&self) -> u64 {
        self.id
    }
    fn charge(&self) -> u64 {
        self.charge
    }
}

pub struct Sieve {
    q: QueueSet<Obj>,
    /// Next object the hand examines; NIL means "start from the tail".
    hand: u32,
}

impl Sieve {
    pub fn new(capacity: Capacity) -> Self {
        Sieve {
            q: QueueSet::new(capacity, 1),
            hand: NIL,
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("Sieve", &[])?;
        Ok(Self::new(capacity))
    }

    fn evict(&mut self) {
        let mut i = if self.hand == NIL {
            self.q.victim(0, "Sieve")
        } else {
            self.hand
        };
        while self.q.slab.get(i).visited {
            self.q.slab.get_mut(i).visited = false;
            let p = self.q.slab.prev(i);
            i = if p == NIL { self.q.tail(0) } else { p };
        }
        self.hand = self.q.slab.prev(i);
        self.q.evict_at(i);
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
        if let Some(i) = self.q.slot(req.id) {
            self.q.slab.get_mut(i).visited = true;
            return true;
        }
        let charge = self.q.meter.charge(req);
        if !self.q.meter.fits(charge) {
            return false;
        }
        while self.q.meter.needs_room(charge) {
            self.evict();
        }
        self.q.admit(
            0,
            Obj {
                id: req.id,
                charge,
                visited: false,
            },
        );
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.q.map.contains_key(id)
    }

    fn len(&self) -> usize {
        self.q.map.len()
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.q.slot(id) else {
            return false;
        };
        if self.hand == i {
            self.hand = self.q.slab.prev(i);
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
