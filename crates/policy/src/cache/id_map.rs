//! An open-addressing index from object id (`u64`) to slab slot (`u32`), the one hash
//! table every queue-based cache policy consults on each request.
//!
//! Linear probing over one power-of-two array of `(id, slot)` pairs, at most half full, with
//! backward-shift deletion (no tombstones, so lookups never slow down as objects churn).
//! The bucket is the high bits of a multiplicative mix of the whole id: trace ids often
//! vary only in their high bits (`object << 44 | block`), which a hash that keeps the low
//! bits would send to one bucket. Memory: 16 bytes × 2–4 per entry, sized from the cache
//! and grown by doubling, never shrunk.

use super::list::NIL;

#[derive(Clone, Copy)]
struct Bucket {
    id: u64,
    /// [`NIL`] marks an empty bucket.
    slot: u32,
    /// The id's home bucket, kept in what would be padding so deletion need not re-hash
    /// the entries it shifts.
    home: u32,
}

const EMPTY: Bucket = Bucket {
    id: 0,
    slot: NIL,
    home: 0,
};

#[derive(Clone)]
pub struct IdMap {
    buckets: Vec<Bucket>,
    mask: usize,
    /// 64 − log2(buckets): the shift that turns a mixed id into a bucket index.
    shift: u32,
    len: usize,
}

impl Default for IdMap {
    fn default() -> Self {
        IdMap::with_capacity(0)
    }
}

/// Mixes all 64 bits of the id into the high bits (murmur3's finaliser, first half).
#[inline(always)]
fn mix(id: u64) -> u64 {
    let h = (id ^ (id >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
    (h ^ (h >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl IdMap {
    /// Room for `n` entries before the first growth.
    pub fn with_capacity(n: usize) -> Self {
        let buckets = (2 * n).max(16).next_power_of_two();
        IdMap {
            buckets: vec![EMPTY; buckets],
            mask: buckets - 1,
            shift: 64 - buckets.trailing_zeros(),
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline(always)]
    fn home(&self, id: u64) -> usize {
        (mix(id) >> self.shift) as usize
    }

    /// The bucket holding `id`, or the empty bucket where it would go.
    #[inline(always)]
    fn probe(&self, id: u64) -> usize {
        self.probe_from(self.home(id), id)
    }

    #[inline(always)]
    fn probe_from(&self, home: usize, id: u64) -> usize {
        let mut b = home;
        loop {
            let e = self.buckets[b];
            if e.slot == NIL || e.id == id {
                return b;
            }
            b = (b + 1) & self.mask;
        }
    }

    /// The slot stored for `id`.
    #[inline]
    pub fn get(&self, id: u64) -> Option<u32> {
        let e = self.buckets[self.probe(id)];
        (e.slot != NIL).then_some(e.slot)
    }

    #[inline]
    pub fn contains_key(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    /// Stores `slot` for `id` (`slot` must not be [`NIL`]); returns the slot it replaces.
    #[inline]
    pub fn insert(&mut self, id: u64, slot: u32) -> Option<u32> {
        debug_assert!(slot != NIL);
        let mut home = self.home(id);
        let mut b = self.probe_from(home, id);
        let old = self.buckets[b].slot;
        if old != NIL {
            self.buckets[b].slot = slot;
            return Some(old);
        }
        if 2 * (self.len + 1) > self.buckets.len() {
            self.grow();
            home = self.home(id);
            b = self.probe_from(home, id);
        }
        self.buckets[b] = Bucket {
            id,
            slot,
            home: home as u32,
        };
        self.len += 1;
        None
    }

    /// Drops `id`; returns its slot.
    #[inline]
    pub fn remove(&mut self, id: u64) -> Option<u32> {
        let mut hole = self.probe(id);
        let slot = self.buckets[hole].slot;
        if slot == NIL {
            return None;
        }
        self.len -= 1;
        // Backward shift: pull later members of the run into the hole when the hole lies
        // on their probe path (between their home bucket and where they sit).
        let mut b = hole;
        loop {
            b = (b + 1) & self.mask;
            let e = self.buckets[b];
            if e.slot == NIL {
                break;
            }
            let home = e.home as usize;
            if (b.wrapping_sub(home) & self.mask) >= (b.wrapping_sub(hole) & self.mask) {
                self.buckets[hole] = e;
                hole = b;
            }
        }
        self.buckets[hole] = EMPTY;
        Some(slot)
    }

    fn grow(&mut self) {
        let old = std::mem::take(&mut self.buckets);
        let n = old.len() * 2;
        assert!(n <= 1 << 32, "IdMap: more than 2^31 entries");
        self.buckets = vec![EMPTY; n];
        self.mask = n - 1;
        self.shift = 64 - n.trailing_zeros();
        for e in old.into_iter().filter(|e| e.slot != NIL) {
            let home = self.home(e.id);
            let b = self.probe_from(home, e.id);
            self.buckets[b] = Bucket {
                home: home as u32,
                ..e
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::rng::SplitMix64;
    use std::collections::HashMap;

    #[test]
    fn agrees_with_std_hashmap_under_random_churn() {
        // Ids in a small range collide often; shifted ids stress the mixing.
        for shift in [0u32, 12, 44] {
            let mut rng = SplitMix64::new(u64::from(shift) + 1);
            let mut ours = IdMap::with_capacity(4);
            let mut std: HashMap<u64, u32> = HashMap::new();
            for step in 0..200_000u32 {
                let id = (rng.next_u64() % 3_000) << shift;
                match rng.next_u64() % 3 {
                    0 => assert_eq!(ours.remove(id), std.remove(&id), "step {step}"),
                    _ => assert_eq!(ours.insert(id, step), std.insert(id, step), "step {step}"),
                }
                assert_eq!(ours.len(), std.len());
            }
            for id in 0..3_000u64 {
                let id = id << shift;
                assert_eq!(ours.get(id), std.get(&id).copied());
            }
        }
    }

    #[test]
    fn high_bit_ids_spread_over_buckets() {
        // Ids that differ only above bit 44 (object << 44) must not share a home bucket.
        let m = IdMap::with_capacity(1024);
        let homes: std::collections::HashSet<usize> =
            (0..1024u64).map(|i| m.home(i << 44)).collect();
        assert!(
            homes.len() > 500,
            "only {} distinct home buckets",
            homes.len()
        );
    }

    #[test]
    fn stays_at_most_half_full() {
        let mut m = IdMap::with_capacity(0);
        for id in 0..10_000u64 {
            m.insert(id * 7, id as u32);
            assert!(2 * m.len() <= m.buckets.len());
        }
        assert_eq!(m.get(70), Some(10));
        assert_eq!(m.get(71), None);
    }
}
