//! Listing read-ahead: when a directory is listed, the source listings of its
//! subdirectories are fetched in the background, so the next level's expansion finds its
//! listing ready instead of waiting a round trip for it.
//!
//! A deep tree's metadata pass is a chain of dependent listings (a directory's children
//! are known only once it is listed); each link cost a source round trip plus the local
//! work. With read-ahead the round trip of level k+1 overlaps the local work of level k.
//! While a crawl runs, a read-ahead goes on down the tree by itself: once a directory's
//! listing arrives, its subdirectories are claimed (before that listing is handed out, so
//! the expansion never lists one of them a second time) and read ahead in turn. The
//! chain of dependent listings then runs at one round trip per level, ahead of the
//! crawl's expansions, which find every level ready (measured:
//! docs/reproduction/migration.md §3, session 14). It stops while demand fetches are in
//! flight, or the crawl is paused or stopping.
//!
//! The source is read-only during migration, so a listing read a moment early is as good
//! as one read now; listings older than [`FRESH`] are not used. Bounded: at most
//! [`MAX_PENDING`] read-aheads in flight and [`MAX_READY`] listings kept. A failed
//! read-ahead is dropped: the expansion then lists the directory itself and reports what
//! the source says.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::source::{FileKind, SourceAttr, SourceEntry, SourcePath};

/// A directory's entries and its own attributes, as `Source::read_dir_with_attr` gives.
pub(crate) type Listing = (Vec<SourceEntry>, Option<SourceAttr>);

/// Read-aheads in flight at most.
pub(crate) const MAX_PENDING: usize = 8;
/// Listings kept ready at most.
pub(crate) const MAX_READY: usize = 256;
/// A listing read ahead is used only this long.
pub(crate) const FRESH: Duration = Duration::from_secs(30);
/// How long an expansion waits for a read-ahead of its directory already in flight.
const WAIT: Duration = Duration::from_secs(5);

#[derive(Default)]
pub(crate) struct ListingCache {
    inner: Mutex<Inner>,
    done: Condvar,
}

#[derive(Default)]
struct Inner {
    ready: HashMap<SourcePath, (Instant, Listing)>,
    pending: HashSet<SourcePath>,
}

impl ListingCache {
    /// The listing of `path` if it was read ahead (waiting for one in flight); it is
    /// handed out once.
    pub(crate) fn take(&self, path: &SourcePath) -> Option<Listing> {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (mut g, _) = self
            .done
            .wait_timeout_while(g, WAIT, |g| g.pending.contains(path))
            .unwrap_or_else(|e| e.into_inner());
        match g.ready.remove(path) {
            Some((at, listing)) if at.elapsed() < FRESH => Some(listing),
            _ => None,
        }
    }

    /// Claims `path` for a read-ahead: false if it is ready or in flight already, or the
    /// bounds are reached (stale listings are dropped first).
    pub(crate) fn claim(&self, path: &SourcePath) -> bool {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.claim(path)
    }

    /// The read-ahead of `path` ended: its listing, or `None` if the source failed.
    pub(crate) fn fulfil(&self, path: &SourcePath, listing: Option<Listing>) {
        self.fulfil_and_claim(path, listing, Vec::new());
    }

    /// [`ListingCache::fulfil`], claiming `below` (`path`'s subdirectories) in the same
    /// step; returns those claimed, for the caller to read ahead. In one step, so the
    /// expansion of `path` finds them in flight (it never lists one of them a second
    /// time), and `path`'s own slot is free again (a chain of read-aheads holds one slot
    /// per listing in flight, however late the threads run).
    pub(crate) fn fulfil_and_claim(
        &self,
        path: &SourcePath,
        listing: Option<Listing>,
        below: Vec<SourcePath>,
    ) -> Vec<SourcePath> {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.pending.remove(path);
        if let Some(l) = listing {
            g.ready.insert(path.clone(), (Instant::now(), l));
        }
        let claimed = below.into_iter().filter(|p| g.claim(p)).collect();
        drop(g);
        self.done.notify_all();
        claimed
    }
}

impl Inner {
    fn claim(&mut self, path: &SourcePath) -> bool {
        self.ready.retain(|_, (at, _)| at.elapsed() < FRESH);
        if self.pending.len() >= MAX_PENDING
            || self.ready.len() + self.pending.len() >= MAX_READY
            || self.pending.contains(path)
            || self.ready.contains_key(path)
        {
            return false;
        }
        self.pending.insert(path.clone());
        true
    }
}

/// The paths of the subdirectories among `dir`'s `entries` (names that do not make a
/// path are left out: the expansion reports them).
pub(crate) fn subdirectories(dir: &SourcePath, entries: &[SourceEntry]) -> Vec<SourcePath> {
    entries
        .iter()
        .filter(|e| e.attr.kind == FileKind::Directory)
        .filter_map(|e| dir.join(&e.name).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn p(s: &str) -> SourcePath {
        SourcePath::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn listings_are_handed_out_once_and_failures_are_not_kept() {
        let c = ListingCache::default();
        assert!(c.take(&p("a")).is_none(), "nothing read ahead");
        assert!(c.claim(&p("a")));
        assert!(!c.claim(&p("a")), "claimed once");
        c.fulfil(&p("a"), Some((Vec::new(), None)));
        assert!(!c.claim(&p("a")), "ready: not read again");
        assert!(c.take(&p("a")).is_some());
        assert!(c.take(&p("a")).is_none(), "handed out once");
        assert!(c.claim(&p("b")));
        c.fulfil(&p("b"), None);
        assert!(c.take(&p("b")).is_none(), "a failed read-ahead is not kept");
    }

    #[test]
    fn a_chain_of_read_aheads_holds_one_slot_per_listing_in_flight() {
        let c = ListingCache::default();
        let mut at = p("d");
        assert!(c.claim(&at));
        // Each level's listing arrives and claims the next in one step: far more levels
        // than MAX_PENDING pass, with a single slot taken at any time.
        for _ in 0..4 * MAX_PENDING {
            let next = at.join(b"d").unwrap();
            let claimed = c.fulfil_and_claim(&at, Some((Vec::new(), None)), vec![next.clone()]);
            assert_eq!(claimed, vec![next.clone()], "the level below {at} claimed");
            assert!(!c.claim(&next), "in flight: not claimed twice");
            at = next;
        }
        // Ready (not yet taken) listings are not handed out twice, nor claimed again.
        let top = p("d");
        assert!(c.take(&top).is_some());
        assert!(!c.claim(&top.join(b"d").unwrap()), "ready: not read again");
    }

    #[test]
    fn bounded_and_take_waits_for_one_in_flight() {
        let c = Arc::new(ListingCache::default());
        for i in 0..MAX_PENDING {
            assert!(c.claim(&p(&format!("d{i}"))));
        }
        assert!(!c.claim(&p("more")), "at most MAX_PENDING in flight");
        let t = {
            let c = c.clone();
            std::thread::spawn(move || c.take(&p("d0")).is_some())
        };
        std::thread::sleep(Duration::from_millis(30));
        c.fulfil(&p("d0"), Some((Vec::new(), None)));
        assert!(t.join().unwrap(), "the waiting expansion got the listing");
    }
}
