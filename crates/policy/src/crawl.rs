//! Background-crawl order for post-copy migration, and a parallel crawl partition that
//! neither misses nor duplicates objects while clients rename and delete.
//!
//! Pure: the store owns the namespace and the threads; it tells this module what a
//! listing returned and what clients did, and asks it what to do next.
//!
//! # Order (thesis ch. 2)
//! - [`Traversal::BreadthFirst`] (default) copies directories near the root first, which
//!   lowers the *worst* first-access time fastest; [`Traversal::DepthFirst`] uses less
//!   memory and lowers the mean sooner where its first subtrees are the hot ones.
//! - [`Phasing::MetadataFirst`] (default) runs two passes: pass 1 expands every directory
//!   and copies every file's metadata, pass 2 copies data. [`Phasing::Bulk`] copies a
//!   file's metadata and data together in one pass.
//!
//! # Parallel crawl without misses or duplicates
//! Work items are *object identities* (the store's inode ids), never paths, so a rename
//! does not change what an item refers to. Every object is **claimed** at most once per
//! pass (`claimed` set, reset when a pass starts):
//! - a worker takes an unlisted directory from the shared frontier, lists it, and reports
//!   the children; each child not yet claimed is claimed now (directories go to the
//!   frontier, files become fetch work). Claiming is what prevents duplicates: a file that
//!   a rename shows in two listings is fetched once.
//! - the store calls [`CrawlPartition::on_rename`] when a client moves an object. If the
//!   object is still unclaimed it is claimed and queued at once. Without this a subtree
//!   moved from a not-yet-listed directory into an already-listed one would be missed.
//! - deletes need no bookkeeping: a queued directory that vanished lists as "not found"
//!   ([`CrawlPartition::on_gone`]), and the store's stub counter already dropped it.
//! - objects clients create are never stubs and need no crawl; stubs moved under them are
//!   covered by the rename rule.
//!
//! Completeness is still confirmed by the store's remaining-stub counter: a pass that ends
//! with the counter above zero is followed by another (the thesis's rule), so even an
//! event the store failed to report costs time, not correctness.

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;

/// Directory traversal order.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Traversal {
    #[default]
    BreadthFirst,
    DepthFirst,
}

/// Whether metadata and data are copied in separate passes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Phasing {
    #[default]
    MetadataFirst,
    Bulk,
}

/// The crawl strategy: default BFS + metadata-first, as the thesis recommends.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct CrawlOrder {
    pub traversal: Traversal,
    pub phasing: Phasing,
}

impl CrawlOrder {
    /// Parses `bfs|dfs` and `metadata-first|bulk`.
    pub fn parse(traversal: &str, phasing: &str) -> Result<Self, String> {
        let traversal = match traversal {
            "bfs" | "breadth-first" => Traversal::BreadthFirst,
            "dfs" | "depth-first" => Traversal::DepthFirst,
            other => return Err(format!("unknown traversal {other:?} (bfs or dfs)")),
        };
        let phasing = match phasing {
            "metadata-first" | "meta" => Phasing::MetadataFirst,
            "bulk" => Phasing::Bulk,
            other => {
                return Err(format!(
                    "unknown phasing {other:?} (metadata-first or bulk)"
                ));
            }
        };
        Ok(Self { traversal, phasing })
    }

    /// The passes one complete crawl consists of.
    pub fn passes(&self) -> &'static [Pass] {
        match self.phasing {
            Phasing::MetadataFirst => &[Pass::Metadata, Pass::Data],
            Phasing::Bulk => &[Pass::Bulk],
        }
    }
}

/// What one traversal copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pass {
    /// Expand directories and copy file metadata only.
    Metadata,
    /// Copy file data (directories are already expanded).
    Data,
    /// Expand directories and copy metadata and data of each file together.
    Bulk,
}

/// What a listing reported about one child.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildKind {
    Directory,
    /// Anything that is not a directory (files, symlinks, special files).
    Leaf,
}

/// Work for a crawler worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CrawlWork<K> {
    /// Expand (if still a dummy) and list this directory, then report with
    /// [`CrawlPartition::on_listed`].
    List(K),
    /// Copy this leaf's metadata (pass [`Pass::Metadata`]), data ([`Pass::Data`]) or both
    /// ([`Pass::Bulk`]).
    Fetch(K, Pass),
}

/// Counters for status and ETA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrawlStats {
    pub pass_index: usize,
    pub dirs_listed: u64,
    pub leaves_claimed: u64,
    pub queued_dirs: usize,
    pub in_flight: usize,
    pub rescued_by_rename: u64,
}

/// The shared frontier of a (possibly parallel) crawl over object ids `K`.
#[derive(Clone, Debug)]
pub struct CrawlPartition<K: Eq + Hash + Clone> {
    order: CrawlOrder,
    root: K,
    pass_index: usize,
    frontier: VecDeque<K>,
    claimed: HashSet<K>,
    in_flight: HashSet<K>,
    stats: CrawlStats,
}

impl<K: Eq + Hash + Clone> CrawlPartition<K> {
    /// A crawl starting its first pass at `root`.
    pub fn new(order: CrawlOrder, root: K) -> Self {
        let mut c = Self {
            order,
            root,
            pass_index: 0,
            frontier: VecDeque::new(),
            claimed: HashSet::new(),
            in_flight: HashSet::new(),
            stats: CrawlStats::default(),
        };
        c.start_pass(0);
        c
    }

    pub fn order(&self) -> CrawlOrder {
        self.order
    }

    /// The pass under way, or `None` when all passes of this round are done.
    pub fn pass(&self) -> Option<Pass> {
        self.order.passes().get(self.pass_index).copied()
    }

    fn start_pass(&mut self, index: usize) {
        self.pass_index = index;
        self.frontier.clear();
        self.claimed.clear();
        self.in_flight.clear();
        self.claimed.insert(self.root.clone());
        self.frontier.push_back(self.root.clone());
        self.stats.pass_index = index;
    }

    /// Starts a new round from the root (after a round ended with stubs left, or on
    /// resume after a restart): nothing already copied is copied again, because the store
    /// skips objects whose stub state is already normal.
    pub fn restart(&mut self) {
        self.start_pass(0);
    }

    /// The next directory to list, for any idle worker. `None` means: nothing to list
    /// right now (others may still be listing; see [`CrawlPartition::pass_done`]).
    pub fn take(&mut self) -> Option<K> {
        let next = match self.order.traversal {
            Traversal::BreadthFirst => self.frontier.pop_front(),
            Traversal::DepthFirst => self.frontier.pop_back(),
        }?;
        self.in_flight.insert(next.clone());
        self.stats.in_flight = self.in_flight.len();
        self.stats.queued_dirs = self.frontier.len();
        Some(next)
    }

    /// Reports the children of a listed directory; returns the leaves this worker should
    /// now fetch (each claimed exactly once per pass).
    pub fn on_listed(&mut self, dir: &K, children: &[(K, ChildKind)]) -> Vec<CrawlWork<K>> {
        self.in_flight.remove(dir);
        self.stats.dirs_listed += 1;
        let pass = self.pass().unwrap_or(Pass::Bulk);
        let mut work = Vec::new();
        let mut new_dirs = Vec::new();
        for (child, kind) in children {
            if !self.claimed.insert(child.clone()) {
                continue;
            }
            match kind {
                ChildKind::Directory => new_dirs.push(child.clone()),
                ChildKind::Leaf => {
                    self.stats.leaves_claimed += 1;
                    work.push(CrawlWork::Fetch(child.clone(), pass));
                }
            }
        }
        match self.order.traversal {
            Traversal::BreadthFirst => self.frontier.extend(new_dirs),
            // Reversed so that the first child is the next popped from the back.
            Traversal::DepthFirst => self.frontier.extend(new_dirs.into_iter().rev()),
        }
        self.stats.in_flight = self.in_flight.len();
        self.stats.queued_dirs = self.frontier.len();
        work
    }

    /// A taken directory could not be listed because it no longer exists.
    pub fn on_gone(&mut self, dir: &K) {
        self.in_flight.remove(dir);
        self.stats.in_flight = self.in_flight.len();
    }

    /// A taken directory could not be listed for a transient reason (worker stopped,
    /// source unreachable): put it back so no entry is lost.
    pub fn give_back(&mut self, dir: K) {
        self.in_flight.remove(&dir);
        self.frontier.push_front(dir);
        self.stats.in_flight = self.in_flight.len();
        self.stats.queued_dirs = self.frontier.len();
    }

    /// A client renamed (moved) `obj`. Returns the work it now needs, if any: an
    /// unclaimed object is claimed here, because its new parent may be listed already.
    pub fn on_rename(&mut self, obj: &K, kind: ChildKind) -> Option<CrawlWork<K>> {
        if self.pass().is_none() || !self.claimed.insert(obj.clone()) {
            return None;
        }
        self.stats.rescued_by_rename += 1;
        match kind {
            ChildKind::Directory => {
                self.frontier.push_back(obj.clone());
                self.stats.queued_dirs = self.frontier.len();
                None
            }
            ChildKind::Leaf => {
                self.stats.leaves_claimed += 1;
                Some(CrawlWork::Fetch(
                    obj.clone(),
                    self.pass().unwrap_or(Pass::Bulk),
                ))
            }
        }
    }

    /// True when the current pass has nothing queued and nothing being listed. The caller
    /// then calls [`CrawlPartition::next_pass`].
    pub fn pass_done(&self) -> bool {
        self.frontier.is_empty() && self.in_flight.is_empty()
    }

    /// Moves to the next pass of the round; returns false when the round is complete.
    pub fn next_pass(&mut self) -> bool {
        if self.pass_index + 1 < self.order.passes().len() {
            self.start_pass(self.pass_index + 1);
            true
        } else {
            self.pass_index = self.order.passes().len();
            self.frontier.clear();
            self.stats.pass_index = self.pass_index;
            false
        }
    }

    pub fn stats(&self) -> CrawlStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A model namespace: id → (parent, is_dir, children).
    #[derive(Clone)]
    struct Model {
        parent: HashMap<u64, u64>,
        is_dir: HashMap<u64, bool>,
        children: HashMap<u64, Vec<u64>>,
        next_id: u64,
    }

    impl Model {
        fn new() -> Self {
            let mut m = Self {
                parent: HashMap::new(),
                is_dir: HashMap::new(),
                children: HashMap::new(),
                next_id: 1,
            };
            m.is_dir.insert(0, true);
            m.children.insert(0, Vec::new());
            m
        }
        fn add(&mut self, parent: u64, dir: bool) -> u64 {
            let id = self.next_id;
            self.next_id += 1;
            self.parent.insert(id, parent);
            self.is_dir.insert(id, dir);
            if dir {
                self.children.insert(id, Vec::new());
            }
            self.children.get_mut(&parent).unwrap().push(id);
            id
        }
        fn exists(&self, id: u64) -> bool {
            self.is_dir.contains_key(&id)
        }
        fn list(&self, dir: u64) -> Option<Vec<(u64, ChildKind)>> {
            let c = self.children.get(&dir)?;
            Some(
                c.iter()
                    .map(|&k| {
                        (
                            k,
                            if self.is_dir[&k] {
                                ChildKind::Directory
                            } else {
                                ChildKind::Leaf
                            },
                        )
                    })
                    .collect(),
            )
        }
        fn is_ancestor(&self, a: u64, mut b: u64) -> bool {
            loop {
                if a == b {
                    return true;
                }
                match self.parent.get(&b) {
                    Some(&p) => b = p,
                    None => return false,
                }
            }
        }
        fn mv(&mut self, obj: u64, new_parent: u64) -> bool {
            if obj == 0
                || !self.exists(obj)
                || !self.is_dir.get(&new_parent).copied().unwrap_or(false)
                || self.is_ancestor(obj, new_parent)
            {
                return false;
            }
            let old = self.parent[&obj];
            self.children.get_mut(&old).unwrap().retain(|&c| c != obj);
            self.children.get_mut(&new_parent).unwrap().push(obj);
            self.parent.insert(obj, new_parent);
            true
        }
        fn remove(&mut self, obj: u64) {
            if obj == 0 || !self.exists(obj) {
                return;
            }
            let p = self.parent[&obj];
            self.children.get_mut(&p).unwrap().retain(|&c| c != obj);
            let mut stack = vec![obj];
            while let Some(x) = stack.pop() {
                if let Some(c) = self.children.remove(&x) {
                    stack.extend(c);
                }
                self.is_dir.remove(&x);
                self.parent.remove(&x);
            }
        }
        fn all(&self) -> Vec<u64> {
            let mut v: Vec<u64> = self.is_dir.keys().copied().collect();
            v.sort();
            v
        }
    }

    /// Deterministic xorshift so the model test needs no dependency.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    fn random_tree(rng: &mut Rng, n: usize) -> Model {
        let mut m = Model::new();
        let mut dirs = vec![0];
        for _ in 0..n {
            let parent = dirs[rng.below(dirs.len() as u64) as usize];
            let dir = rng.below(4) == 0;
            let id = m.add(parent, dir);
            if dir {
                dirs.push(id);
            }
        }
        m
    }

    /// Runs one pass with `workers` interleaved workers and random client renames,
    /// deletes and creates; checks every object that existed at the start and still exists
    /// at the end was visited exactly once, and nothing was visited twice.
    fn run_model(seed: u64, order: CrawlOrder, workers: usize, client_ops: bool) {
        let mut rng = Rng(seed | 1);
        let mut m = random_tree(&mut rng, 400);
        let original: HashSet<u64> = m.all().into_iter().collect();
        let mut crawl = CrawlPartition::new(order, 0u64);
        let mut visits: HashMap<u64, u32> = HashMap::new();
        // Each worker holds at most one directory it is "listing".
        let mut holding: Vec<Option<u64>> = vec![None; workers];
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 200_000, "model did not terminate");
            if client_ops && rng.below(3) == 0 {
                let ids = m.all();
                let obj = ids[rng.below(ids.len() as u64) as usize];
                match rng.below(10) {
                    0..=5 => {
                        let dirs: Vec<u64> = ids.iter().copied().filter(|i| m.is_dir[i]).collect();
                        let to = dirs[rng.below(dirs.len() as u64) as usize];
                        if m.mv(obj, to) {
                            let kind = if m.is_dir[&obj] {
                                ChildKind::Directory
                            } else {
                                ChildKind::Leaf
                            };
                            if let Some(CrawlWork::Fetch(k, _)) = crawl.on_rename(&obj, kind) {
                                *visits.entry(k).or_default() += 1;
                            }
                        }
                    }
                    6 => m.remove(obj),
                    _ => {
                        // Clients create plain (non-stub) objects; the crawl may or may not see them.
                        if m.is_dir.get(&obj).copied().unwrap_or(false) {
                            m.add(obj, rng.below(2) == 0);
                        }
                    }
                }
                continue;
            }
            let w = rng.below(workers as u64) as usize;
            match holding[w].take() {
                None => {
                    if let Some(d) = crawl.take() {
                        *visits.entry(d).or_default() += 1;
                        holding[w] = Some(d);
                    } else if crawl.pass_done() {
                        break;
                    }
                }
                Some(d) => match m.list(d) {
                    Some(children) => {
                        for work in crawl.on_listed(&d, &children) {
                            if let CrawlWork::Fetch(k, _) = work {
                                *visits.entry(k).or_default() += 1;
                            }
                        }
                    }
                    None => crawl.on_gone(&d),
                },
            }
        }
        for (id, n) in &visits {
            assert_eq!(*n, 1, "object {id} visited {n} times (seed {seed})");
        }
        for id in m.all() {
            if original.contains(&id) {
                assert!(
                    visits.contains_key(&id),
                    "object {id} missed (seed {seed}, {workers} workers)"
                );
            }
        }
    }

    #[test]
    fn single_worker_without_clients_visits_everything_once() {
        for seed in 1..20 {
            run_model(seed, CrawlOrder::default(), 1, false);
            run_model(
                seed,
                CrawlOrder {
                    traversal: Traversal::DepthFirst,
                    phasing: Phasing::Bulk,
                },
                1,
                false,
            );
        }
    }

    #[test]
    fn parallel_workers_with_renames_and_deletes_miss_nothing_and_duplicate_nothing() {
        for seed in 1..200 {
            let order = if seed % 2 == 0 {
                CrawlOrder::default()
            } else {
                CrawlOrder {
                    traversal: Traversal::DepthFirst,
                    phasing: Phasing::MetadataFirst,
                }
            };
            run_model(seed * 7919, order, 1 + (seed as usize % 6), true);
        }
    }

    #[test]
    fn a_subtree_moved_into_a_listed_directory_is_rescued_by_the_rename_rule() {
        // root ─ A(1) ─ X(3) ; root ─ B(2). X moves from A into B after B was listed.
        let mut crawl = CrawlPartition::new(CrawlOrder::default(), 0u64);
        let root = crawl.take().unwrap();
        assert!(
            crawl
                .on_listed(
                    &root,
                    &[(1, ChildKind::Directory), (2, ChildKind::Directory)]
                )
                .is_empty()
        );
        assert_eq!(crawl.take(), Some(1));
        assert_eq!(crawl.take(), Some(2));
        crawl.on_listed(&2, &[]);
        assert_eq!(crawl.on_rename(&3, ChildKind::Directory), None);
        crawl.on_listed(&1, &[]); // A no longer contains X
        assert_eq!(crawl.take(), Some(3), "the moved subtree is still crawled");
        assert_eq!(crawl.stats().rescued_by_rename, 1);
        // Renaming it again does not queue it twice.
        assert_eq!(crawl.on_rename(&3, ChildKind::Directory), None);
        crawl.on_listed(&3, &[]);
        assert!(crawl.pass_done());
    }

    #[test]
    fn bfs_lists_level_by_level_and_dfs_goes_deep_first() {
        // 0 → {1, 2}; 1 → {3}; 2 → {4}
        let tree: HashMap<u64, Vec<(u64, ChildKind)>> = [
            (
                0,
                vec![(1, ChildKind::Directory), (2, ChildKind::Directory)],
            ),
            (1, vec![(3, ChildKind::Directory)]),
            (2, vec![(4, ChildKind::Directory)]),
            (3, vec![]),
            (4, vec![]),
        ]
        .into_iter()
        .collect();
        let order_of = |t: Traversal| {
            let mut c = CrawlPartition::new(
                CrawlOrder {
                    traversal: t,
                    phasing: Phasing::Bulk,
                },
                0u64,
            );
            let mut seen = Vec::new();
            while let Some(d) = c.take() {
                seen.push(d);
                c.on_listed(&d, &tree[&d]);
            }
            seen
        };
        assert_eq!(order_of(Traversal::BreadthFirst), vec![0, 1, 2, 3, 4]);
        assert_eq!(order_of(Traversal::DepthFirst), vec![0, 1, 3, 2, 4]);
    }

    #[test]
    fn metadata_first_runs_two_passes_and_bulk_one() {
        let mut c = CrawlPartition::new(CrawlOrder::default(), 0u64);
        assert_eq!(c.pass(), Some(Pass::Metadata));
        let d = c.take().unwrap();
        assert_eq!(
            c.on_listed(&d, &[(5, ChildKind::Leaf)]),
            vec![CrawlWork::Fetch(5, Pass::Metadata)]
        );
        assert!(c.pass_done());
        assert!(c.next_pass());
        assert_eq!(c.pass(), Some(Pass::Data));
        let d = c.take().unwrap();
        assert_eq!(
            c.on_listed(&d, &[(5, ChildKind::Leaf)]),
            vec![CrawlWork::Fetch(5, Pass::Data)]
        );
        assert!(!c.next_pass());
        assert_eq!(c.pass(), None);
        assert_eq!(c.take(), None);

        let mut b = CrawlPartition::new(
            CrawlOrder {
                traversal: Traversal::BreadthFirst,
                phasing: Phasing::Bulk,
            },
            0u64,
        );
        let d = b.take().unwrap();
        assert_eq!(
            b.on_listed(&d, &[(5, ChildKind::Leaf)]),
            vec![CrawlWork::Fetch(5, Pass::Bulk)]
        );
        assert!(!b.next_pass());
    }

    #[test]
    fn give_back_keeps_the_directory_and_restart_begins_at_root() {
        let mut c = CrawlPartition::new(CrawlOrder::default(), 0u64);
        let d = c.take().unwrap();
        c.give_back(d);
        assert!(!c.pass_done());
        assert_eq!(c.take(), Some(0));
        c.on_listed(&0, &[(1, ChildKind::Directory)]);
        c.restart();
        assert_eq!(c.take(), Some(0));
    }

    #[test]
    fn parse_names() {
        assert_eq!(
            CrawlOrder::parse("bfs", "metadata-first").unwrap(),
            CrawlOrder::default()
        );
        assert_eq!(
            CrawlOrder::parse("dfs", "bulk").unwrap(),
            CrawlOrder {
                traversal: Traversal::DepthFirst,
                phasing: Phasing::Bulk
            }
        );
        assert!(CrawlOrder::parse("zigzag", "bulk").is_err());
        assert!(CrawlOrder::parse("bfs", "eventually").is_err());
    }
}
