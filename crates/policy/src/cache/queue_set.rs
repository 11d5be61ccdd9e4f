//! The bookkeeping the queue-based policies share: one slab of per-object records threaded
//! through `N` intrusive queues (FIFO/LRU/SIEVE/CLOCK: one; 2Q and S3-FIFO: three; ARC:
//! four), an [`IdMap`] from object id to slab slot, the charge held by each queue, and the
//! [`Meter`]. Queues may hold ghost entries (ids only, not charged to the meter): the
//! policy says which by calling [`QueueSet::admit`] / [`QueueSet::evict_at`] for cached
//! objects and [`QueueSet::push_head`] / [`QueueSet::drop_at`] for ghosts. Each policy
//! keeps only its own rules for hits, admission and choosing the victim.

use super::id_map::IdMap;
use super::list::{List, NIL, Slab};
use super::{Capacity, Meter};

/// What the queues need to know of a policy's per-object record.
pub trait Entry: Copy {
    fn id(&self) -> u64;
    fn charge(&self) -> u64;
    /// Which of the `N` queues the record is in (single-queue policies keep the default).
    #[inline(always)]
    fn queue(&self) -> usize {
        0
    }
    #[inline(always)]
    fn set_queue(&mut self, _q: usize) {}
}

pub struct QueueSet<T, const N: usize = 1> {
    pub meter: Meter,
    pub slab: Slab<T>,
    pub map: IdMap,
    /// Head = newest; policies evict from the tail side.
    pub queues: [List; N],
    /// Charge held by each queue (cached objects and ghosts alike).
    pub used: [u64; N],
}

impl<T: Entry, const N: usize> QueueSet<T, N> {
    /// `entries_per_object` sizes the slab and index up front: 1 without ghosts, 2 when
    /// ghost ids may be as many as the cached objects.
    pub fn new(capacity: Capacity, entries_per_object: usize) -> Self {
        let n = entries_per_object * capacity.reserve_hint();
        QueueSet {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(n),
            map: IdMap::with_capacity(n),
            queues: [List::new(); N],
            used: [0; N],
        }
    }

    /// Slot of `id` (cached or ghost), if any.
    #[inline]
    pub fn slot(&self, id: u64) -> Option<u32> {
        self.map.get(id)
    }

    #[inline]
    pub fn get(&self, i: u32) -> &T {
        self.slab.get(i)
    }

    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut T {
        self.slab.get_mut(i)
    }

    /// Oldest entry of queue `q`, [`NIL`] when empty.
    #[inline]
    pub fn tail(&self, q: usize) -> u32 {
        self.queues[q].tail
    }

    /// Oldest entry of queue `q`; panics on an empty queue (callers evict only when full).
    #[inline]
    pub fn victim(&self, q: usize, policy: &str) -> u32 {
        let t = self.queues[q].tail;
        assert!(t != NIL, "eviction from an empty {policy} queue");
        t
    }

    /// Links `obj` at the head of queue `q` without charging the meter (a ghost, or an
    /// object the caller charges itself).
    #[inline]
    pub fn push_head(&mut self, q: usize, mut obj: T) -> u32 {
        obj.set_queue(q);
        let i = self.slab.alloc(obj);
        self.queues[q].push_head(&mut self.slab, i);
        self.used[q] += obj.charge();
        self.map.insert(obj.id(), i);
        i
    }

    /// Admits `obj` into the cache at the head of queue `q`.
    #[inline]
    pub fn admit(&mut self, q: usize, obj: T) -> u32 {
        self.meter.add(obj.charge());
        self.push_head(q, obj)
    }

    /// Moves entry `i` to the head of queue `to` (its own queue or another).
    #[inline]
    pub fn move_to_head(&mut self, i: u32, to: usize) {
        let obj = self.slab.get_mut(i);
        let from = obj.queue();
        if from == to {
            self.queues[to].move_to_head(&mut self.slab, i);
            return;
        }
        obj.set_queue(to);
        let charge = obj.charge();
        self.queues[from].unlink(&mut self.slab, i);
        self.used[from] -= charge;
        self.queues[to].push_head(&mut self.slab, i);
        self.used[to] += charge;
    }

    /// Unlinks and forgets entry `i` without touching the meter (a ghost, or an object the
    /// caller accounts for); returns the record.
    #[inline]
    pub fn drop_at(&mut self, i: u32) -> T {
        let obj = *self.slab.get(i);
        let q = obj.queue();
        self.queues[q].unlink(&mut self.slab, i);
        self.used[q] -= obj.charge();
        self.slab.free(i);
        self.map.remove(obj.id());
        obj
    }

    /// Evicts the cached object in slot `i` (recorded in the meter's eviction log).
    #[inline]
    pub fn evict_at(&mut self, i: u32) -> T {
        let obj = self.drop_at(i);
        self.meter.evicted(obj.id(), obj.charge());
        obj
    }

    /// Drops the cached object in slot `i` without counting an eviction.
    #[inline]
    pub fn remove_at(&mut self, i: u32) -> T {
        let obj = self.drop_at(i);
        self.meter.sub(obj.charge());
        obj
    }

    /// Number of entries (cached and ghost) in queue `q`.
    #[inline]
    pub fn count(&self, q: usize) -> usize {
        self.queues[q].len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug)]
    struct Rec {
        id: u64,
        q: usize,
    }

    impl Entry for Rec {
        fn id(&self) -> u64 {
            self.id
        }
        fn charge(&self) -> u64 {
            2
        }
        fn queue(&self) -> usize {
            self.q
        }
        fn set_queue(&mut self, q: usize) {
            self.q = q;
        }
    }

    #[test]
    fn queues_track_membership_charge_and_meter() {
        let mut s: QueueSet<Rec, 2> = QueueSet::new(Capacity::bytes(10), 2);
        let a = s.admit(0, Rec { id: 1, q: 9 });
        let b = s.admit(0, Rec { id: 2, q: 9 });
        let g = s.push_head(1, Rec { id: 3, q: 9 });
        assert_eq!((s.used, s.meter.used()), ([4, 2], 4));
        s.move_to_head(a, 1);
        assert_eq!(s.get(a).q, 1);
        assert_eq!((s.used, s.count(0), s.count(1)), ([2, 4], 1, 2));
        assert_eq!(s.tail(1), g);
        s.drop_at(g);
        assert_eq!(s.slot(3), None);
        s.evict_at(b);
        s.remove_at(a);
        assert_eq!((s.used, s.meter.used(), s.map.len()), ([0, 0], 0, 0));
        assert_eq!(s.tail(0), NIL);
    }
}
