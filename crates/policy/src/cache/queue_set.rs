//! The bookkeeping FIFO, LRU and SIEVE share: cached objects in one slab-backed queue,
//! indexed by id and charged against a [`Meter`]. Each policy keeps only its own rules for
//! a hit and for choosing the victim.

use super::hash::FxHashMap;
use super::list::{List, NIL, Slab};
use super::{Capacity, Meter};

/// What the queue needs to know of a policy's per-object record.
pub trait Entry: Copy {
    fn id(&self) -> u64;
    fn charge(&self) -> u64;
}

pub struct QueueSet<T> {
    pub meter: Meter,
    pub slab: Slab<T>,
    pub map: FxHashMap<u64, u32>,
    /// Head = newest; policies evict from the tail side.
    pub queue: List,
}

impl<T: Entry> QueueSet<T> {
    pub fn new(capacity: Capacity) -> Self {
        QueueSet {
            meter: Meter::new(capacity),
            slab: Slab::with_capacity(capacity.reserve_hint()),
            map: super::hash::map_with_capacity(capacity.reserve_hint()),
            queue: List::new(),
        }
    }

    /// Slot of the cached object `id`, if any.
    pub fn slot(&self, id: u64) -> Option<u32> {
        self.map.get(&id).copied()
    }

    /// Admits `obj` at the head of the queue.
    pub fn push_head(&mut self, obj: T) -> u32 {
        let i = self.slab.alloc(obj);
        self.queue.push_head(&mut self.slab, i);
        self.map.insert(obj.id(), i);
        self.meter.add(obj.charge());
        i
    }

    /// The oldest object's slot; panics on an empty queue (callers evict only when full).
    pub fn tail(&self, policy: &str) -> u32 {
        assert!(self.queue.tail != NIL, "eviction from an empty {policy}");
        self.queue.tail
    }

    /// Evicts the object in slot `i` (recorded in the meter's eviction log).
    pub fn evict_at(&mut self, i: u32) {
        let obj = *self.slab.get(i);
        self.queue.unlink(&mut self.slab, i);
        self.slab.free(i);
        self.map.remove(&obj.id());
        self.meter.evicted(obj.id(), obj.charge());
    }

    /// Drops `id` without counting an eviction; returns its former slot.
    pub fn remove(&mut self, id: u64) -> Option<u32> {
        let i = self.map.remove(&id)?;
        self.queue.unlink(&mut self.slab, i);
        self.meter.sub(self.slab.get(i).charge());
        self.slab.free(i);
        Some(i)
    }
}
