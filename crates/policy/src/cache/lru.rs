//! LRU: a hit moves the object to the head; evict from the tail (libCacheSim `LRU`).

use super::queue_set::{Entry, QueueSet};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
}

impl Entry for Obj {
    fn id(&self) -> u64 {
        self.id
    }
    fn charge(&self) -> u64 {
        self.charge
    }
}

pub struct Lru {
    q: QueueSet<Obj>,
}

impl Lru {
    pub fn new(capacity: Capacity) -> Self {
        Lru {
            q: QueueSet::new(capacity, 1),
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("LRU", &[])?;
        Ok(Self::new(capacity))
    }

    fn evict(&mut self) {
        let i = self.q.victim(0, "LRU");
        self.q.evict_at(i);
    }
}

impl CachePolicy for Lru {
    fn name(&self) -> &str {
        "LRU"
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        if let Some(i) = self.q.slot(req.id) {
            self.q.move_to_head(i, 0);
            return true;
        }
        let charge = self.q.meter.charge(req);
        if !self.q.meter.fits(charge) {
            return false;
        }
        while self.q.meter.needs_room(charge) {
            self.evict();
        }
        self.q.admit(0, Obj { id: req.id, charge });
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.q.map.contains_key(id)
    }

    fn len(&self) -> usize {
        self.q.map.len()
    }

    fn remove(&mut self, id: u64) -> bool {
        self.q.slot(id).map(|i| self.q.remove_at(i)).is_some()
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
    fn hand_computed_sequence() {
        // cap 3: 1 2 3 1(hit, 1 MRU) 4(evict 2) 1(hit) 2(miss, evict 3) 3(miss, evict 4)
        let mut c = Lru::new(Capacity::objects(3));
        assert_eq!(run_ids(&mut c, &[1, 2, 3, 1, 4, 1, 2, 3]), "mmmhmhmm");
        assert!(c.contains(1) && c.contains(2) && c.contains(3) && !c.contains(4));
    }

    #[test]
    fn byte_capacity_evicts_until_the_new_object_fits() {
        let mut c = Lru::new(Capacity::bytes(10));
        c.set_eviction_log(true);
        for (id, size) in [(1, 4), (2, 4), (3, 6)] {
            c.access(&Request::new(0, id, size));
        }
        // 3 (6 B) needs 1 and 2 gone: 8 + 6 > 10, then 4 + 6 = 10 fits.
        let mut ev = Vec::new();
        c.drain_evictions(&mut ev);
        assert_eq!(ev.iter().map(|e| e.id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(c.used(), 10);
        // An object larger than the cache is a miss and is not admitted.
        assert!(!c.access(&Request::new(0, 9, 11)));
        assert!(!c.contains(9));
        assert_eq!(c.used(), 10);
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Lru::new(cap)));
    }
}
