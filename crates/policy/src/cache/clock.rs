//! CLOCK with an n-bit reference counter (libCacheSim `Clock`).
//!
//! Objects enter at the head with counter `init-freq` (default 0); a hit increments the
//! counter up to `2^n - 1` (n = `n-bit-counter`, default 1: the classic second-chance bit).
//! To evict, the hand looks at the tail: a non-zero counter is decremented and the object
//! goes back to the head; the first zero-counter object is evicted. Rotating the list is the
//! same as moving a hand around a ring, and keeps every step O(1).

use super::queue_set::{Entry, QueueSet};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    freq: u32,
}

impl Entry for Obj {
    fn id(&self) -> u64 {
        self.id
    }
    fn charge(&self) -> u64 {
        self.charge
    }
}

pub struct Clock {
    q: QueueSet<Obj>,
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
            q: QueueSet::new(capacity, 1),
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
            let t = self.q.victim(0, "Clock");
            let obj = self.q.get_mut(t);
            if obj.freq >= 1 {
                obj.freq -= 1;
                self.q.move_to_head(t, 0);
            } else {
                self.q.evict_at(t);
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
        if let Some(i) = self.q.slot(req.id) {
            let obj = self.q.get_mut(i);
            if obj.freq < self.max_freq {
                obj.freq += 1;
            }
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
                freq: self.init_freq,
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
