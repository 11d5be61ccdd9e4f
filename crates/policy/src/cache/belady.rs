//! Belady's offline optimum (MIN): evict the object whose next request is farthest away.
//!
//! Needs `Request::next_access` (fill it with [`annotate_next_access`](super::annotate_next_access)
//! or read it from an oracleGeneral trace). Two variants:
//! - default (`bypass=false`, libCacheSim `Belady`): every miss is admitted, then the
//!   farthest-next-access objects are evicted until it fits. Optimal among policies that
//!   admit every miss, for unit sizes.
//! - `bypass=true`: a miss is not admitted when its own next access is at least as far as
//!   that of the object it would displace. This is the true optimum for unit sizes, also
//!   against policies that may decline to admit (smq).
//!
//! With variable sizes both are the usual "farthest next access first" heuristic, not the
//! byte- or object-optimal schedule (that problem is NP-hard); libCacheSim's `BeladySize`
//! weighs by size instead and is not provided here. O(log n) per request (a B-tree ordered
//! by next access).

use std::collections::BTreeSet;

use super::hash::FxHashMap;
use super::{CachePolicy, Capacity, Error, Meter, NEVER, Op, Params, Request};

pub struct Belady {
    meter: Meter,
    /// id → (next access, charge).
    map: FxHashMap<u64, (u64, u64)>,
    /// (next access, id), farthest last.
    order: BTreeSet<(u64, u64)>,
    bypass: bool,
}

impl Belady {
    pub fn new(capacity: Capacity, bypass: bool) -> Self {
        Belady {
            meter: Meter::new(capacity),
            map: FxHashMap::default(),
            order: BTreeSet::new(),
            bypass,
        }
    }

    /// Parameter: `bypass` (default false).
    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("Belady", &["bypass"])?;
        Ok(Self::new(capacity, params.flag("Belady", "bypass", false)?))
    }

    fn evict_farthest(&mut self) {
        let (_next, id) = self
            .order
            .pop_last()
            .expect("eviction from an empty Belady cache");
        let (_, charge) = self.map.remove(&id).expect("order and map agree");
        self.meter.evicted(id, charge);
    }

    /// With bypass: would admitting an object with this next access and charge only
    /// displace objects needed sooner?
    fn worth_admitting(&self, next: u64, charge: u64) -> bool {
        if !self.meter.needs_room(charge) {
            return true;
        }
        if next == NEVER {
            return false;
        }
        // Sum the charges of the farthest objects until the new one would fit; admit only
        // if all of them are needed later than it.
        let mut freed = 0u64;
        let need = self.meter.used() + charge - self.meter.capacity().limit;
        for &(n, id) in self.order.iter().rev() {
            if n <= next {
                return false;
            }
            freed += self.map[&id].1;
            if freed >= need {
                return true;
            }
        }
        false
    }
}

impl CachePolicy for Belady {
    fn name(&self) -> &str {
        if self.bypass {
            "Belady-bypass"
        } else {
            "Belady"
        }
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        if let Some(entry) = self.map.get_mut(&req.id) {
            let old = entry.0;
            entry.0 = req.next_access;
            self.order.remove(&(old, req.id));
            self.order.insert((req.next_access, req.id));
            return true;
        }
        let charge = self.meter.charge(req);
        if !self.meter.fits(charge) {
            return false;
        }
        if self.bypass && !self.worth_admitting(req.next_access, charge) {
            return false;
        }
        while self.meter.needs_room(charge) {
            self.evict_farthest();
        }
        self.map.insert(req.id, (req.next_access, charge));
        self.order.insert((req.next_access, req.id));
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
        let Some((next, charge)) = self.map.remove(&id) else {
            return false;
        };
        self.order.remove(&(next, id));
        self.meter.sub(charge);
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
    use super::super::{annotate_next_access, by_name};
    use super::*;

    fn reqs(ids: &[u64]) -> Vec<Request> {
        let mut r: Vec<Request> = ids.iter().map(|&id| Request::new(0, id, 1)).collect();
        annotate_next_access(&mut r);
        r
    }

    #[test]
    fn evicts_farthest_next_access() {
        // cap 2: 1 2 3 (evict 2: next use of 1 is sooner) 1 2
        let r = reqs(&[1, 2, 3, 1, 2]);
        let mut c = Belady::new(Capacity::objects(2), false);
        let hits: String = r
            .iter()
            .map(|q| if c.access(q) { 'h' } else { 'm' })
            .collect();
        assert_eq!(hits, "mmmhm");
    }

    #[test]
    fn bypass_keeps_the_useful_object() {
        // cap 1: 1 2 1 2 1 -> always-admit misses everything; bypass keeps 1.
        let r = reqs(&[1, 2, 1, 2, 1]);
        assert_eq!(
            misses(Box::new(Belady::new(Capacity::objects(1), false)), &r),
            5
        );
        assert_eq!(
            misses(Box::new(Belady::new(Capacity::objects(1), true)), &r),
            3
        );
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Belady::new(cap, false)));
        check_invariants(|cap| Box::new(Belady::new(cap, true)));
    }

    /// Belady is a lower bound on misses, for unit sizes, on random and Zipf streams at
    /// several cache sizes: the always-admit variant against every always-admit policy,
    /// the bypass variant against every policy.
    #[test]
    fn belady_is_a_lower_bound_on_misses() {
        let shapes = [
            Shape::Uniform { objects: 150 },
            Shape::Zipf {
                objects: 400,
                alpha: 0.8,
            },
            Shape::Zipf {
                objects: 400,
                alpha: 1.2,
            },
            Shape::ZipfScan {
                objects: 300,
                alpha: 1.0,
                every: 300,
                scan_len: 80,
            },
        ];
        for seed in 0..6u64 {
            for (k, shape) in shapes.iter().enumerate() {
                let r = stream(seed * 31 + k as u64, 3000, *shape, 1);
                for cap in [1u64, 5, 20, 64, 200] {
                    let capacity = Capacity::objects(cap);
                    let opt = misses(Box::new(Belady::new(capacity, false)), &r);
                    let opt_bypass = misses(Box::new(Belady::new(capacity, true)), &r);
                    assert!(opt_bypass <= opt);
                    for name in super::super::POLICY_NAMES {
                        let m = misses(by_name(name, capacity, "").unwrap(), &r);
                        assert!(
                            opt_bypass <= m,
                            "{name}: {m} misses < Belady-bypass {opt_bypass} ({shape:?}, cap {cap})"
                        );
                        if *name != "smq" {
                            assert!(
                                opt <= m,
                                "{name}: {m} < Belady {opt} ({shape:?}, cap {cap})"
                            );
                        }
                    }
                }
            }
        }
    }
}
