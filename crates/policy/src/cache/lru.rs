//! LRU: a hit moves the object to the head; evict from the tail (libCacheSim `LRU`).

use super::hash::FxHashMap;
use super::list::{List, Slab};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
}

pub struct Lru {
    meter: Meter,
    slab: Slab<Obj>,
    map: FxHashMap<u64, u32>,
    queue: List,
}

impl Lru {
    pub fn new(capacity: Capacity) -> Self {
        Lru {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(capacity.reserve_hint()),
            map: super::hash::map_with_capacity(capacity.reserve_hint()),
            queue: List::new(),
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("LRU", &[])?;
        Ok(Self::new(capacity))
    }

    fn evict(&mut self) {
        let i = self
            .queue
            .pop_tail(&mut self.slab)
            .expect("eviction from an empty LRU");
        let obj = *self.slab.get(i);
        self.slab.free(i);
        self.map.remove(&obj.id);
        self.meter.evicted(obj.id, obj.charge);
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
        if let Some(&i) = self.map.get(&req.id) {
            self.queue.move_to_head(&mut self.slab, i);
            return true;
        }
        let charge = self.meter.charge(req);
        if !self.meter.fits(charge) {
            return false;
        }
        while self.meter.needs_room(charge) {
            self.evict();
        }
        let i = self.slab.alloc(Obj { id: req.id, charge });
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
