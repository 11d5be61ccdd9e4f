//! FIFO: evict in insertion order; hits change nothing (libCacheSim `FIFO`).

use super::hash::FxHashMap;
use super::list::{List, Slab};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
}

pub struct Fifo {
    meter: Meter,
    slab: Slab<Obj>,
    map: FxHashMap<u64, u32>,
    queue: List,
}

impl Fifo {
    pub fn new(capacity: Capacity) -> Self {
        Fifo {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(capacity.reserve_hint()),
            map: super::hash::map_with_capacity(capacity.reserve_hint()),
            queue: List::new(),
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("FIFO", &[])?;
        Ok(Self::new(capacity))
    }

    fn evict(&mut self) {
        let i = self
            .queue
            .pop_tail(&mut self.slab)
            .expect("eviction from an empty FIFO");
        let obj = *self.slab.get(i);
        self.slab.free(i);
        self.map.remove(&obj.id);
        self.meter.evicted(obj.id, obj.charge);
    }
}

impl CachePolicy for Fifo {
    fn name(&self) -> &str {
        "FIFO"
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        if self.map.contains_key(&req.id) {
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
        // cap 3: 1 2 3 1(hit) 4(evict 1) 1(miss, evict 2) 2(miss, evict 3)
        let mut c = Fifo::new(Capacity::objects(3));
        assert_eq!(run_ids(&mut c, &[1, 2, 3, 1, 4, 1, 2]), "mmmhmmm");
        assert!(c.contains(4) && c.contains(1) && c.contains(2) && !c.contains(3));
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Fifo::new(cap)));
    }
}
