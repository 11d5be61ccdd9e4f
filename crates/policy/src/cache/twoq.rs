//! 2Q (VLDB'94, "full version"; libCacheSim `TwoQ`).
//!
//! A1in is a FIFO of first-time objects (⌊C·`Ain-size-ratio`⌋, default 0.25), A1out a FIFO
//! of ghost ids (⌊C·`Aout-size-ratio`⌋, default 0.5) and Am an LRU of objects re-referenced
//! after leaving A1in (C − A1in). A hit in A1in changes nothing; a hit in Am moves it to
//! Am's head; a miss whose id is in A1out enters Am, any other miss enters A1in. When room
//! is needed, A1in's tail moves to A1out if A1in is over its share, else Am's tail is
//! evicted. As in libCacheSim, Am also enforces its own share when a ghost hit enters it,
//! and objects larger than A1in are never admitted.

use super::queue_set::{Entry, QueueSet};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

/// Queue numbers in the [`QueueSet`].
const IN: usize = 0;
const OUT: usize = 1;
const MAIN: usize = 2;

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    at: u8,
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
        self.at = q as u8;
    }
}

pub struct TwoQ {
    q: QueueSet<Obj, 3>,
    in_cap: u64,
    out_cap: u64,
    m_cap: u64,
}

impl TwoQ {
    pub fn new(capacity: Capacity, in_ratio: f64, out_ratio: f64) -> Self {
        let c = capacity.limit;
        let in_cap = (c as f64 * in_ratio) as u64;
        TwoQ {
            q: QueueSet::new(capacity, 2),
            in_cap,
            out_cap: (c as f64 * out_ratio) as u64,
            m_cap: c - in_cap,
        }
    }

    /// Parameters: `Ain-size-ratio` (default 0.25), `Aout-size-ratio` (default 0.5).
    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("TwoQ", &["ain-size-ratio", "aout-size-ratio"])?;
        let a_in = params.ratio("TwoQ", "ain-size-ratio", 0.25, false)?;
        let a_out = params.ratio("TwoQ", "aout-size-ratio", 0.5, true)?;
        Ok(Self::new(capacity, a_in, a_out))
    }

    fn evict_main_tail(&mut self) {
        let t = self.q.victim(MAIN, "TwoQ Am");
        self.q.evict_at(t);
    }

    fn evict(&mut self) {
        if self.q.used[IN] > self.in_cap || self.q.count(MAIN) == 0 {
            let t = self.q.victim(IN, "TwoQ A1in");
            let obj = self.q.evict_at(t);
            // The id enters A1out (a FIFO with its own capacity).
            if obj.charge <= self.out_cap {
                while self.q.used[OUT] + obj.charge > self.out_cap {
                    let g = self.q.victim(OUT, "TwoQ A1out");
                    self.q.drop_at(g);
                }
                self.q.push_head(OUT, obj);
            }
        } else {
            self.evict_main_tail();
        }
    }
}

impl CachePolicy for TwoQ {
    fn name(&self) -> &str {
        "TwoQ"
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        let mut ghost_hit = false;
        if let Some(i) = self.q.slot(req.id) {
            match self.q.get(i).queue() {
                IN => return true,
                MAIN => {
                    self.q.move_to_head(i, MAIN);
                    return true;
                }
                _ => {
                    self.q.drop_at(i);
                    ghost_hit = true;
                }
            }
        }
        let charge = self.q.meter.charge(req);
        if charge > self.in_cap {
            return false;
        }
        while self.q.meter.needs_room(charge) {
            self.evict();
        }
        let obj = Obj {
            id: req.id,
            charge,
            at: IN as u8,
        };
        if ghost_hit {
            // Am admits through its own LRU: it makes room within its share first.
            while self.q.used[MAIN] + charge > self.m_cap {
                self.evict_main_tail();
            }
            self.q.admit(MAIN, obj);
        } else {
            self.q.admit(IN, obj);
        }
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.q
            .slot(id)
            .is_some_and(|i| self.q.get(i).queue() != OUT)
    }

    fn len(&self) -> usize {
        self.q.count(IN) + self.q.count(MAIN)
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.q.slot(id) else {
            return false;
        };
        if self.q.get(i).queue() == OUT {
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
    fn reference_after_a1in_eviction_enters_am() {
        // C = 4: A1in 1, A1out 2, Am 3.
        let mut c = TwoQ::new(Capacity::objects(4), 0.25, 0.5);
        // 1..4 fill (A1in grows past its share while Am is empty). 5: A1in over share ->
        // 1 goes to A1out. 1 again: ghost hit -> Am (evicting 2 to A1out first).
        assert_eq!(run_ids(&mut c, &[1, 2, 3, 4, 5, 1]), "mmmmmm");
        assert!(c.contains(1) && !c.contains(2));
        assert_eq!(c.q.used[MAIN], 1);
        // 1 hits in Am; 3 hits in A1in without moving.
        assert_eq!(run_ids(&mut c, &[1, 3]), "hh");
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(TwoQ::new(cap, 0.25, 0.5)));
    }
}
