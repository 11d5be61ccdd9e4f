//! ARC (FAST'03), with libCacheSim's byte-capacity generalisation (`ARC`).
//!
//! T1 holds objects seen once recently, T2 objects seen at least twice; B1/B2 are their
//! ghost (id-only) histories. The target size `p` of T1 grows on a B1 ghost hit by
//! max(|B2|/|B1|, 1) and shrinks on a B2 ghost hit by max(|B1|/|B2|, 1), sizes in charge
//! units (so with byte capacities `p` moves by at least one byte per ghost hit, exactly as
//! libCacheSim does). Eviction runs only when the cache is full: on a ghost hit it is the
//! paper's REPLACE; on a plain miss it is case IV (trim B1 when T1+B1 would exceed C, or
//! trim B2 when all four lists reach 2C, then REPLACE).

use super::queue_set::{Entry, QueueSet};
use super::{CachePolicy, Capacity, Error, Meter, Op, Params, Request};

/// Queue numbers in the [`QueueSet`]: the cached lists T1, T2 and their ghosts B1, B2.
const T1: usize = 0;
const T2: usize = 1;
const B1: usize = 2;
const B2: usize = 3;

#[derive(Clone, Copy, Debug)]
struct Obj {
    id: u64,
    charge: u64,
    at: u32,
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
        self.at = q as u32;
    }
}

pub struct Arc {
    q: QueueSet<Obj, 4>,
    p: f64,
    /// Set when the current request hit a ghost (libCacheSim keeps these flags across
    /// requests and re-checks them; we mirror that to reproduce its choices exactly).
    in_b1: bool,
    in_b2: bool,
    ghost_hit_now: bool,
}

impl Arc {
    pub fn new(capacity: Capacity) -> Self {
        Arc {
            q: QueueSet::new(capacity, 2),
            p: 0.0,
            in_b1: false,
            in_b2: false,
            ghost_hit_now: false,
        }
    }

    pub fn with_params(capacity: Capacity, params: &Params) -> Result<Self, Error> {
        params.check("ARC", &[])?;
        Ok(Self::new(capacity))
    }

    #[inline]
    fn size(&self, q: usize) -> u64 {
        self.q.used[q]
    }

    /// Moves the tail of T1 (or T2) into B1 (or B2): an eviction from the cache.
    fn demote_tail(&mut self, from: usize, to: usize) {
        let t = self.q.victim(from, "ARC");
        self.q.move_to_head(t, to);
        let obj = *self.q.get(t);
        self.q.meter.evicted(obj.id, obj.charge);
    }

    fn replace(&mut self) {
        let t1 = self.size(T1) as f64;
        let cond =
            (t1 > 0.0 && (t1 > self.p || (t1 == self.p && self.in_b2))) || self.size(T2) == 0;
        if cond {
            self.demote_tail(T1, B1);
        } else {
            self.demote_tail(T2, B2);
        }
    }

    fn evict(&mut self, incoming: u64) {
        if self.ghost_hit_now && (self.in_b1 || self.in_b2) {
            self.replace();
            return;
        }
        let c = self.q.meter.capacity().limit;
        if self.size(T1) + self.size(B1) + incoming > c {
            if self.size(B1) > 0 {
                let t = self.q.victim(B1, "ARC");
                self.q.drop_at(t);
                self.replace();
            } else {
                let t = self.q.victim(T1, "ARC");
                self.q.evict_at(t);
            }
        } else {
            if self.q.used.iter().sum::<u64>() >= 2 * c && self.size(B2) > 0 {
                let t = self.q.victim(B2, "ARC");
                self.q.drop_at(t);
            }
            self.replace();
        }
    }
}

impl CachePolicy for Arc {
    fn name(&self) -> &str {
        "ARC"
    }

    fn access(&mut self, req: &Request) -> bool {
        if req.op == Op::Delete {
            self.remove(req.id);
            return false;
        }
        self.ghost_hit_now = false;
        if let Some(i) = self.q.slot(req.id) {
            self.in_b1 = false;
            self.in_b2 = false;
            match self.q.get(i).queue() {
                T1 | T2 => {
                    self.q.move_to_head(i, T2);
                    return true;
                }
                B1 => {
                    self.in_b1 = true;
                    let (b1, b2) = (self.size(B1) as f64, self.size(B2) as f64);
                    let delta = (b2 / b1).max(1.0);
                    self.p = (self.p + delta).min(self.q.meter.capacity().limit as f64);
                }
                _ => {
                    self.in_b2 = true;
                    let (b1, b2) = (self.size(B1) as f64, self.size(B2) as f64);
                    let delta = (b1 / b2).max(1.0);
                    self.p = (self.p - delta).max(0.0);
                }
            }
            self.q.drop_at(i);
            self.ghost_hit_now = true;
        }
        let charge = self.q.meter.charge(req);
        if !self.q.meter.fits(charge) {
            return false;
        }
        while self.q.meter.needs_room(charge) {
            self.evict(charge);
        }
        let to = if self.ghost_hit_now && (self.in_b1 || self.in_b2) {
            self.in_b1 = false;
            self.in_b2 = false;
            T2
        } else {
            T1
        };
        self.q.admit(
            to,
            Obj {
                id: req.id,
                charge,
                at: to as u32,
            },
        );
        false
    }

    fn contains(&self, id: u64) -> bool {
        self.q.slot(id).is_some_and(|i| self.q.get(i).queue() <= T2)
    }

    fn len(&self) -> usize {
        self.q.count(T1) + self.q.count(T2)
    }

    fn remove(&mut self, id: u64) -> bool {
        let Some(i) = self.q.slot(id) else {
            return false;
        };
        if self.q.get(i).queue() <= T2 {
            self.q.remove_at(i);
            true
        } else {
            self.q.drop_at(i);
            false
        }
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
    fn ghost_hits_adapt_p_and_enter_t2() {
        let mut c = Arc::new(Capacity::objects(2));
        // 1 2 fill T1; 3 evicts 1 to B1 (case IV: T1+B1+1 > 2 with B1 empty -> drop T1
        // tail without ghost? No: T1(2)+B1(0)+1 > 2 and B1 empty -> 1 evicted, no ghost).
        assert_eq!(run_ids(&mut c, &[1, 2, 3]), "mmm");
        assert!(!c.contains(1));
        // 2 hit moves to T2. 4: T1={3}, B1={} -> T1+B1+1 = 2 <= 2 -> REPLACE: T1 (1) > p (0)
        // -> 3 goes to B1.
        assert_eq!(run_ids(&mut c, &[2, 4]), "hm");
        // 3 again: ghost hit in B1 -> p grows to 1; REPLACE: T1 (1) is not > p (1), so
        // T2's tail (2) goes to B2 and 3 enters T2.
        assert_eq!(run_ids(&mut c, &[3]), "m");
        assert_eq!(c.p, 1.0);
        assert!(c.contains(3) && c.contains(4) && !c.contains(2));
    }

    #[test]
    fn invariants() {
        check_invariants(|cap| Box::new(Arc::new(cap)));
    }
}
