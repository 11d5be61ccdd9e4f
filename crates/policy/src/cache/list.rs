//! Intrusive doubly linked lists over one slab of nodes, addressed by `u32` index.
//!
//! Every queue-based policy keeps its objects in a [`Slab`] and threads them through one or
//! more [`List`]s (FIFO, LRU, ARC's four lists, …). Freed slots are reused, so after warm-up
//! the hot path allocates nothing and memory stays proportional to the cache footprint.
//! `head` is the most recently inserted end, `tail` the eviction end (libCacheSim's
//! `q_head`/`q_tail` orientation).

/// "No node": the null link.
pub const NIL: u32 = u32::MAX;

/// One slot: the links plus the policy's payload.
#[derive(Clone, Debug)]
pub struct Node<T> {
    pub prev: u32,
    pub next: u32,
    pub value: T,
}

/// Storage for nodes; free slots are chained through `next`.
#[derive(Clone, Debug)]
pub struct Slab<T> {
    nodes: Vec<Node<T>>,
    free: u32,
    live: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab::new()
    }
}

impl<T> Slab<T> {
    pub fn new() -> Self {
        Slab {
            nodes: Vec::new(),
            free: NIL,
            live: 0,
        }
    }

    pub fn with_capacity(n: usize) -> Self {
        Slab {
            nodes: Vec::with_capacity(n),
            free: NIL,
            live: 0,
        }
    }

    /// Stores `value` in a fresh unlinked node and returns its index.
    pub fn alloc(&mut self, value: T) -> u32 {
        self.live += 1;
        if self.free != NIL {
            let i = self.free;
            let node = &mut self.nodes[i as usize];
            self.free = node.next;
            node.prev = NIL;
            node.next = NIL;
            node.value = value;
            i
        } else {
            let i = u32::try_from(self.nodes.len()).expect("more than 2^32-1 cached objects");
            self.nodes.push(Node {
                prev: NIL,
                next: NIL,
                value,
            });
            i
        }
    }

    /// Returns the slot to the free chain. The node must already be unlinked.
    pub fn free(&mut self, i: u32) {
        self.live -= 1;
        let node = &mut self.nodes[i as usize];
        node.prev = NIL;
        node.next = self.free;
        self.free = i;
    }

    /// Number of allocated (live) nodes.
    pub fn live(&self) -> usize {
        self.live
    }

    #[inline]
    pub fn get(&self, i: u32) -> &T {
        &self.nodes[i as usize].value
    }

    #[inline]
    pub fn get_mut(&mut self, i: u32) -> &mut T {
        &mut self.nodes[i as usize].value
    }

    #[inline]
    pub fn prev(&self, i: u32) -> u32 {
        self.nodes[i as usize].prev
    }

    #[inline]
    pub fn next(&self, i: u32) -> u32 {
        self.nodes[i as usize].next
    }
}

/// A list threaded through a [`Slab`]. A node is in at most one list at a time.
#[derive(Clone, Copy, Debug)]
pub struct List {
    pub head: u32,
    pub tail: u32,
    pub len: usize,
}

impl Default for List {
    fn default() -> Self {
        List::new()
    }
}

impl List {
    pub const fn new() -> Self {
        List {
            head: NIL,
            tail: NIL,
            len: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Links unlinked node `i` at the head (most recent end).
    pub fn push_head<T>(&mut self, slab: &mut Slab<T>, i: u32) {
        {
            let n = &mut slab.nodes[i as usize];
            n.prev = NIL;
            n.next = self.head;
        }
        if self.head != NIL {
            slab.nodes[self.head as usize].prev = i;
        } else {
            self.tail = i;
        }
        self.head = i;
        self.len += 1;
    }

    /// Unlinks node `i`, which must be in this list.
    pub fn unlink<T>(&mut self, slab: &mut Slab<T>, i: u32) {
        let (p, n) = {
            let node = &slab.nodes[i as usize];
            (node.prev, node.next)
        };
        if p != NIL {
            slab.nodes[p as usize].next = n;
        } else {
            self.head = n;
        }
        if n != NIL {
            slab.nodes[n as usize].prev = p;
        } else {
            self.tail = p;
        }
        let node = &mut slab.nodes[i as usize];
        node.prev = NIL;
        node.next = NIL;
        self.len -= 1;
    }

    /// Moves node `i` (in this list) to the head.
    pub fn move_to_head<T>(&mut self, slab: &mut Slab<T>, i: u32) {
        if self.head != i {
            self.unlink(slab, i);
            self.push_head(slab, i);
        }
    }

    /// Unlinks and returns the tail (oldest) node, or `None` when empty.
    pub fn pop_tail<T>(&mut self, slab: &mut Slab<T>) -> Option<u32> {
        let t = self.tail;
        if t == NIL {
            None
        } else {
            self.unlink(slab, t);
            Some(t)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(list: &List, slab: &Slab<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        let mut i = list.head;
        while i != NIL {
            out.push(*slab.get(i));
            i = slab.next(i);
        }
        out
    }

    #[test]
    fn push_unlink_pop_keep_order_and_reuse_slots() {
        let mut slab = Slab::new();
        let mut list = List::new();
        let a = slab.alloc(1);
        let b = slab.alloc(2);
        let c = slab.alloc(3);
        for i in [a, b, c] {
            list.push_head(&mut slab, i);
        }
        assert_eq!(collect(&list, &slab), vec![3, 2, 1]);
        list.move_to_head(&mut slab, a);
        assert_eq!(collect(&list, &slab), vec![1, 3, 2]);
        list.unlink(&mut slab, c);
        slab.free(c);
        assert_eq!(collect(&list, &slab), vec![1, 2]);
        assert_eq!(list.pop_tail(&mut slab), Some(b));
        assert_eq!(list.pop_tail(&mut slab), Some(a));
        assert_eq!(list.pop_tail(&mut slab), None);
        assert!(list.is_empty());
        let d = slab.alloc(4);
        assert_eq!(d, c, "freed slot is reused");
        assert_eq!(slab.live(), 3);
    }
}
