//! 2Q (VLDB'94, "full version"; libCacheSim `TwoQ`).
//!
//! A1in is a FIFO of first-time objects (⌊C·`Ain-size-ratio`⌋, default 0.25), A1out a FIFO
//! of ghost ids (⌊C·`Aout-size-ratio`⌋, default 0.5) and Am an LRU of objects re-referenced
//! after leaving A1in (C − A1in). A hit in A1in changes nothing; a hit in Am moves it to
//! Am's head; a miss whose id is in A1out enters Am, any other miss enters A1in. When room
//! is needed, A1in's tail moves to A1out if A1in is over its share, else Am's tail is
//! evicted. As in libCacheSim, Am also enforces its own share when a ghost hit enters it,
//! and objects larger than A1in are never admitted.

use super::hash::FxHashMap;
use super::list::{List, Slab};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Where {
    In,
    Out,
    Main,
}

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    at: Where,
}

pub struct TwoQ {
    meter: Meter,
    slab: Slab<Obj>,
    map: FxHashMap<u64, u32>,
    a_in: List,
    a_out: List,
    a_m: List,
    in_cap: u64,
    out_cap: u64,
    m_cap: u64,
    in_used: u64,
    out_used: u64,
    m_used: u64,
}

impl TwoQ {
    pub fn new(capacity: Capacity, in_ratio: f64, out_ratio: f64) -> Self {
        let c = capacity.limit;
        let in_cap = (c as f64 * in_ratio) as u64;
        TwoQ {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(2 * capacity.reserve_hint()),
            map: super::hash::map_with_capacity(2 * capacity.reserve_hint()),
            a_in: List::new(),
            a_out: List::new(),
            a_m: List::new(),
            in_cap,
            out_cap: (c as f64 * out_ratio) as u64,
            m_cap: c - in_cap,
            in_used: 0,
            out_used: 0,
            m_used: 0,
        }
    }

    /// Parameters: `Ain-size-ratio` (default 0.25), `Aout-size-ratio` (default 0.5).
    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("TwoQ", &["ain-size-ratio", "aout-size-ratio"])?;
        let a_in = params.ratio("TwoQ", "ain-size-ratio", 0.25, false)?;
        let a_out = params.ratio("TwoQ", "aout-size-ratio", 0.5, true)?;
        Ok(Self::new(capacity, a_in, a_out))
    }

    fn parts(&mut self, at: Where) -> (&mut List, &mut u64) {
        match at {
            Where::In => (&mut self.a_in, &mut self.in_used),
            Where::Out => (&mut self.a_out, &mut self.out_used),
            Where::Main => (&mut self.a_m, &mut self.m_used),
        }
    }

    fn drop_node(&mut self, i: u32) -> Obj {
        let obj = *self.slab.get(i);
        let mut l = *self.parts(obj.at).0;
        l.unlink(&mut self.slab, i);
        let (list, used) = self.parts(obj.at);
        *list = l;
        *used -= obj.charge;
        self.map.remove(&obj.id);
        self.slab.free(i);
        obj
    }

    fn push(&mut self, id: u64, charge: u64, at: Where) {
        let i = self.slab.alloc(Obj { id, charge, at });
        let mut l = *self.parts(at).0;
        l.push_head(&mut self.slab, i);
        *self.parts(at).0 = l;
        *self.parts(at).1 += charge;
        self.map.insert(id, i);
    }

    fn evict_main_tail(&mut self) {
        let t = self.a_m.tail;
        let obj = self.drop_node(t);
        self.meter.evicted(obj.id, obj.charge);
    }

    fn evict(&mut self) {
        if self.in_used > self.in_cap || self.a_m.is_empty() {
            let t = self.a_in.tail;
            let obj = self.drop_node(t);
            self.meter.evicted(obj.id, obj.charge);
            // The id enters A1out (a FIFO with its own capacity).
            if obj.charge <= self.out_cap {
                while self.out_used + obj.charge > self.out_cap {
                    let g = self.a_out.tail;
                    self.drop_node(g);
                }
                self.push(obj.id, obj.charge, Where::Out);
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
        if let Some(&i) = self.map.get(&req.id) {
            match self.slab.get(i).at {
                Where::In => return true,
                Where::Main => {
                    self.a_m.move_to_head(&mut self.slab, i);
                    return true;
                }
                Where::Out => {
                    self.drop_node(i);
                    ghost_hit = true;
                }
            }
        }
        let charge = self.meter.charge(req);
        if charge > self.in_cap {
            return false;
        }
        while self.meter.needs_room(charge) {
            self.evict();
        }
        if ghost_hit {
            // Am admits through its own LRU: it makes room within its share first.
            while self.m_used + charge > self.m_cap {
                self.evict_main_tail();
            }
            self.push(req.id, charge, Where::Main);
        } else {
            self.push(req.id, charge, Where::In);
        }
        self.meter.add(charge);
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.map
            .get(&id)
            .is_some_and(|&i| self.slab.get(i).at != Where::Out)
    }

    fn len(&self) -> usize {
        self.a_in.len + self.a_m.len
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(&i) = self.map.get(&id) else {
            return false;
        };
        let obj = self.drop_node(i);
        if obj.at == Where::Out {
            return false;
        }
        self.meter.sub(obj.charge);
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
    fn reference_after_a1in_eviction_enters_am() {
        // C = 4: A1in 1, A1out 2, Am 3.
        let mut c = TwoQ::new(Capacity::objects(4), 0.25, 0.5);
        // 1..4 fill (A1in grows past its share while Am is empty). 5: A1in over share ->
        // 1 goes to A1out. 1 again: ghost hit -> Am (evicting 2 to A1out first).
        assert_eq!(run_ids(&mut c, &[1, 2, 3, 4, 5, 1]), "mmmmmm");
        assert!(c.contains(1) && !c.contains(2));
        assert_eq!(c.m_used, 1);
        // 1 hits in Am; 3 hits in A1in without moving.
        assert_eq!(run_ids(&mut c, &[1, 3]), "hh");
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(TwoQ::new(cap, 0.25, 0.5)));
    }
}
