//! FIFO: evict in insertion order; hits change nothing (libCacheSim `FIFO`).

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

pub struct Fifo {
    q: QueueSet<Obj>,
}

impl Fifo {
    pub fn new(capacity: Capacity) -> Self {
        Fifo {
            q: QueueSet::new(capacity, 1),
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("FIFO", &[])?;
        Ok(Self::new(capacity))
    }

    fn evict(&mut self) {
        let i = self.q.victim(0, "FIFO");
        self.q.evict_at(i);
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
        if self.q.map.contains_key(req.id) {
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
