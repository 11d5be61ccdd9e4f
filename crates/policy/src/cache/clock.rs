//! CLOCK with an n-bit reference counter (libCacheSim `Clock`).
//!
//! Objects enter at the head with counter `init-freq` (default 0); a hit increments the
//! counter up to `2^n - 1` (n = `n-bit-counter`, default 1: the classic second-chance bit).
//! To evict, the hand looks at the tail: a non-zero counter is decremented and the object
//! goes back to the head; the first zero-counter object is evicted. Rotating the list is the
//! same as moving a hand around a ring, and keeps every step O(1).

use super::hash::FxHashMap;
use super::list::{List, Slab};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    freq: u32,
}

pub struct Clock {
    meter: Meter,
    slab: Slab<Obj>,
    map: FxHashMap<u64, u32>,
    queue: List,
    max_freq: u32,
    init_freq: u32,
    name: String,
}

impl Clock {
    /// `n_bits` in 1..=16; `init_freq` at most `2^n_bits - 1`.
    pub fn new(capacity: Capacity, n_bits: u32, init_freq: u32) -> Self {
        let max_freq = (1u32 << n_bits) - 1;
        let name = if n_bits == 1 && init_freq == 0 {
            "Clock".to_string()
        } else {
            format!("Clock-{n_bits}-{init_freq}")
        };
        Clock {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(capacity.reserve_hint()),
            map: super::hash::map_with_capacity(capacity.reserve_hint()),
            queue: List::new(),
            max_freq,
            init_freq: init_freq.min(max_freq),
            name,
        }
    }

    /// Parameters: `n-bit-counter` (1..=16, default 1), `init-freq` (default 0).
    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("Clock", &["n-bit-counter", "init-freq"])?;
        let bits = params.int("Clock", "n-bit-counter", 1, 1..=16, "an integer in 1..=16")? as u32;
        let max = (1u64 << bits) - 1;
        let init = params.int("Clock", "init-freq", 0, 0..=max, "an integer in 0..=2^n-1")? as u32;
        Ok(Self::new(capacity, bits, init))
    }

    fn evict(&mut self) {
        loop {
            let t = self.queue.tail;
            let obj = self.slab.get_mut(t);
            if obj.freq >= 1 {
                obj.freq -= 1;
                self.queue.move_to_head(&mut self.slab, t);
            } else {
                let obj = *obj;
                self.queue.unlink(&mut self.slab, t);
                self.slab.free(t);
                self.map.remove(&obj.id);
                self.meter.evicted(obj.id, obj.charge);
                return;
            }
        }
    }
}

impl CachePolicy for Clock {
    fn name(&self) -> &str {
        &self.name
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        if let Some(&i) = self.map.get(&req.id) {
            let obj = self.slab.get_mut(i);
            if obj.freq < self.max_freq {
                obj.freq += 1;
            }
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
            freq: self.init_freq,
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
    fn second_chance_by_hand() {
        // cap 3: 1 2 3, hit 1 (bit set), 4: tail 1 has bit -> cleared, to head; evict 2.
        // 2: miss; tail is 3 (bit 0) -> evict 3. 1: hit.
        let mut c = Clock::new(Capacity::objects(3), 1, 0);
        assert_eq!(run_ids(&mut c, &[1, 2, 3, 1, 4, 2, 1]), "mmmhmmh");
        assert!(!c.contains(3));
    }

    #[test]
    fn two_bit_counter_survives_two_sweeps() {
        // 2-bit: 1 hit three times -> counter 3; it survives several evictions.
        let mut c = Clock::new(Capacity::objects(2), 2, 0);
        assert_eq!(run_ids(&mut c, &[1, 1, 1, 1, 2, 3, 4, 5, 1]), "mhhhmmmmh");
        assert_eq!(c.name(), "Clock-2-0");
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Clock::new(cap, 1, 0)));
        check_invariants(|cap| Box::new(Clock::new(cap, 3, 1)));
    }
}
