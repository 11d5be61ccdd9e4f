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
//! - [`Phasing::MetadataPriority`] is metadata-first with the data pass overlapped: metadata
//!   work (listings, leaf metadata) keeps strict priority, but a worker that finds none
//!   during pass 1 fetches the data of a leaf whose metadata is already done, in traversal
//!   order, instead of idling while a deep, narrow frontier has little to list. Pass 2
//!   then skips the leaves fetched early (each leaf's data is handed out once per round).
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
    /// Metadata first, data of metadata-complete leaves in the gaps of pass 1.
    MetadataPriority,
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
    /// Parses `bfs|dfs` and `metadata-first|metadata-priority|bulk`.
    pub fn parse(traversal: &str, phasing: &str) -> Result<Self, String> {
        let traversal = match traversal {
            "bfs" | "breadth-first" => Traversal::BreadthFirst,
            "dfs" | "depth-first" => Traversal::DepthFirst,
            other => return Err(format!("unknown traversal {other:?} (bfs or dfs)")),
        };
        let phasing = match phasing {
            "metadata-first" | "meta" => Phasing::MetadataFirst,
            "metadata-priority" | "overlap" => Phasing::MetadataPriority,
            "bulk" => Phasing::Bulk,
            other => {
                return Err(format!(
                    "unknown phasing {other:?} (metadata-first, metadata-priority or bulk)"
                ));
            }
        };
        Ok(Self { traversal, phasing })
    }

    /// The passes one complete crawl consists of.
    pub fn passes(&self) -> &'static [Pass] {
        match self.phasing {
            Phasing::MetadataFirst | Phasing::MetadataPriority => &[Pass::Metadata, Pass::Data],
            Phasing::Bulk => &[Pass::Bulk],
        }
    }

    /// Whether idle workers fetch data during the metadata pass.
    pub fn overlapped(&self) -> bool {
        self.phasing == Phasing::MetadataPriority
    }
}

impl Phasing {
    /// The name [`CrawlOrder::parse`] accepts.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phasing::MetadataFirst => "metadata-first",
            Phasing::MetadataPriority => "metadata-priority",
            Phasing::Bulk => "bulk",
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
    /// ([`Pass::Bulk`]), then report with [`CrawlPartition::on_fetched`].
    Fetch(K, Pass),
}

/// Counters for status and ETA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrawlStats {
    pub pass_index: usize,
    pub dirs_listed: u64,
    pub leaves_claimed: u64,
    /// Directories waiting to be listed.
    pub queued_dirs: usize,
    /// Directories being listed.
    pub in_flight: usize,
    /// Leaves claimed and waiting for a worker.
    pub queued_leaves: usize,
    /// Leaves a worker is fetching.
    pub leaves_in_flight: usize,
    pub rescued_by_rename: u64,
    /// Data fetches handed out during the metadata pass ([`Phasing::MetadataPriority`]).
    pub early_data_fetches: u64,
    /// Leaves the data pass skipped because their data was fetched early.
    pub early_data_skipped: u64,
}

/// The shared frontier of a (possibly parallel) crawl over object ids `K`.
///
/// It holds *all* work of a pass, leaves included: a worker takes a leaf or a directory
/// with [`CrawlPartition::take`] and reports it done ([`CrawlPartition::on_fetched`],
/// [`CrawlPartition::on_listed`]). A pass is done only when nothing is queued **and**
/// nothing handed out is unreported, so a round never ends while another worker is still
/// fetching files of it (ending early made the next round start over the same in-flight
/// files, and a round that found the counter unchanged called a healthy crawl stuck).
/// Leaves are handed out before further directories: with one worker this is exactly
/// "list a directory, fetch its files, go on" in the chosen traversal order; with more,
/// idle workers help with a wide directory instead of waiting for its lister.
#[derive(Clone, Debug)]
pub struct CrawlPartition<K: Eq + Hash + Clone> {
    order: CrawlOrder,
    root: K,
    pass_index: usize,
    frontier: VecDeque<K>,
    leaves: VecDeque<K>,
    claimed: HashSet<K>,
    listing: HashSet<K>,
    fetching: HashSet<K>,
    /// Overlapped mode: leaves whose metadata is done, waiting for an idle worker (pass 1).
    early_data: VecDeque<K>,
    /// Early data fetches handed out and not yet reported; they keep the round open.
    early_fetching: HashSet<K>,
    /// Leaves whose data was handed out early this round; pass 2 does not hand them out.
    early_handed: HashSet<K>,
    /// At most this many early data fetches in flight at once, so workers stay free for
    /// listings that appear meanwhile (a data fetch holds a worker for a whole file).
    early_limit: usize,
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
            leaves: VecDeque::new(),
            claimed: HashSet::new(),
            listing: HashSet::new(),
            fetching: HashSet::new(),
            early_data: VecDeque::new(),
            early_fetching: HashSet::new(),
            early_handed: HashSet::new(),
            early_limit: usize::MAX,
            stats: CrawlStats::default(),
        };
        c.start_pass(0);
        c
    }

    pub fn order(&self) -> CrawlOrder {
        self.order
    }

    /// Caps the early data fetches in flight (overlapped mode; at least 1).
    pub fn set_early_data_limit(&mut self, limit: usize) {
        self.early_limit = limit.max(1);
    }

    /// The pass under way, or `None` when all passes of this round are done (the round
    /// is being closed: see [`CrawlPartition::next_pass`]).
    pub fn pass(&self) -> Option<Pass> {
        self.order.passes().get(self.pass_index).copied()
    }

    fn start_pass(&mut self, index: usize) {
        // Early data fetches belong to the round: they survive into pass 2 (still in
        // flight, and skipped there) and end with it. Leaves still waiting for an early
        // fetch are simply found again by pass 2's listings.
        self.early_data.clear();
        if index == 0 {
            self.early_fetching.clear();
            self.early_handed.clear();
        }
        self.pass_index = index;
        self.frontier.clear();
        self.leaves.clear();
        self.claimed.clear();
        self.listing.clear();
        self.fetching.clear();
        self.claimed.insert(self.root.clone());
        self.frontier.push_back(self.root.clone());
        self.stats.pass_index = index;
        self.update_stats();
    }

    fn update_stats(&mut self) {
        self.stats.in_flight = self.listing.len();
        self.stats.queued_dirs = self.frontier.len();
        self.stats.queued_leaves = self.leaves.len();
        self.stats.leaves_in_flight = self.fetching.len() + self.early_fetching.len();
    }

    /// Starts a new round from the root (after a round ended with stubs left, or on
    /// resume after a restart): nothing already copied is copied again, because the store
    /// skips objects whose stub state is already normal.
    pub fn restart(&mut self) {
        self.start_pass(0);
    }

    /// The next work for an idle worker: a claimed leaf if any is waiting, else the next
    /// directory in traversal order, else (overlapped mode, pass 1 only) the data of a
    /// leaf whose metadata is done. `None` means nothing to hand out right now (others
    /// may still be working: see [`CrawlPartition::pass_done`]).
    pub fn take(&mut self) -> Option<CrawlWork<K>> {
        let pass = self.pass()?;
        let work = if let Some(leaf) = self.leaves.pop_front() {
            self.fetching.insert(leaf.clone());
            CrawlWork::Fetch(leaf, pass)
        } else {
            let dir = match self.order.traversal {
                Traversal::BreadthFirst => self.frontier.pop_front(),
                Traversal::DepthFirst => self.frontier.pop_back(),
            };
            match dir {
                Some(dir) => {
                    self.listing.insert(dir.clone());
                    CrawlWork::List(dir)
                }
                None => {
                    if self.early_fetching.len() >= self.early_limit {
                        return None;
                    }
                    let leaf = self.early_data.pop_front()?;
                    self.early_fetching.insert(leaf.clone());
                    self.early_handed.insert(leaf.clone());
                    self.stats.early_data_fetches += 1;
                    CrawlWork::Fetch(leaf, Pass::Data)
                }
            }
        };
        self.update_stats();
        Some(work)
    }

    /// Pass 2 of the overlapped mode: a leaf whose data was handed out early is claimed
    /// but not queued again.
    fn fetched_early(&mut self, leaf: &K) -> bool {
        if self.pass() == Some(Pass::Data) && self.early_handed.contains(leaf) {
            self.stats.early_data_skipped += 1;
            return true;
        }
        false
    }

    /// Reports the children of a listed directory; returns how many leaves it queued
    /// (each child is claimed at most once per pass).
    pub fn on_listed(&mut self, dir: &K, children: &[(K, ChildKind)]) -> usize {
        if !self.listing.remove(dir) {
            return 0; // not handed out in this pass (a report from before a restart)
        }
        self.stats.dirs_listed += 1;
        let mut new_dirs = Vec::new();
        let mut new_leaves = 0;
        for (child, kind) in children {
            if !self.claimed.insert(child.clone()) {
                continue;
            }
            match kind {
                ChildKind::Directory => new_dirs.push(child.clone()),
                ChildKind::Leaf => {
                    self.stats.leaves_claimed += 1;
                    if self.fetched_early(child) {
                        continue;
                    }
                    new_leaves += 1;
                    self.leaves.push_back(child.clone());
                }
            }
        }
        match self.order.traversal {
            Traversal::BreadthFirst => self.frontier.extend(new_dirs),
            // Reversed so that the first child is the next popped from the back.
            Traversal::DepthFirst => self.frontier.extend(new_dirs.into_iter().rev()),
        }
        self.update_stats();
        new_leaves
    }

    /// A leaf handed out by [`CrawlPartition::take`] was visited (copied, found already
    /// complete, gone, or failed: a failure is for the caller's round check, not a
    /// reason to keep the pass open).
    ///
    /// In the overlapped mode a leaf whose metadata is done is queued for an early data
    /// fetch, in the order its metadata completed (which follows the traversal order).
    pub fn on_fetched(&mut self, leaf: &K) {
        if self.early_fetching.remove(leaf) {
            // An early data fetch (its metadata fetch was reported before it was handed out).
        } else if self.fetching.remove(leaf)
            && self.order.overlapped()
            && self.pass() == Some(Pass::Metadata)
        {
            self.early_data.push_back(leaf.clone());
        }
        self.update_stats();
    }

    /// A taken directory could not be listed (it no longer exists, or the source failed:
    /// the stub counter still holds it, so the next round tries again).
    pub fn on_gone(&mut self, dir: &K) {
        self.listing.remove(dir);
        self.update_stats();
    }

    /// A taken directory could not be listed for a transient reason (worker stopped,
    /// source unreachable): put it back so no entry is lost.
    pub fn give_back(&mut self, dir: K) {
        if self.listing.remove(&dir) {
            self.frontier.push_front(dir);
        }
        self.update_stats();
    }

    /// A client renamed (moved) `obj`: an unclaimed object is claimed and queued here,
    /// because its new parent may be listed already. Returns whether it was queued.
    pub fn on_rename(&mut self, obj: &K, kind: ChildKind) -> bool {
        if self.pass().is_none() || !self.claimed.insert(obj.clone()) {
            return false;
        }
        if kind == ChildKind::Leaf && self.fetched_early(obj) {
            return false; // its data was handed out early: claimed, nothing to queue
        }
        self.stats.rescued_by_rename += 1;
        match kind {
            ChildKind::Directory => self.frontier.push_back(obj.clone()),
            ChildKind::Leaf => {
                self.stats.leaves_claimed += 1;
                self.leaves.push_back(obj.clone());
            }
        }
        self.update_stats();
        true
    }

    /// True when the current pass has nothing queued and nothing handed out unreported.
    /// The caller then calls [`CrawlPartition::next_pass`].
    ///
    /// Pass 1 of the overlapped mode ends with its metadata work, not with the early data
    /// fetches (so they never delay the metadata pass); those still in flight keep the
    /// data pass, and so the round, open instead.
    pub fn pass_done(&self) -> bool {
        self.frontier.is_empty()
            && self.leaves.is_empty()
            && self.listing.is_empty()
            && self.fetching.is_empty()
            && (self.pass() == Some(Pass::Metadata) || self.early_fetching.is_empty())
    }

    /// Moves to the next pass of the round; returns false when the round is complete
    /// ([`CrawlPartition::pass`] is then `None` until [`CrawlPartition::restart`]). Does
    /// nothing while the pass still has work queued or handed out.
    pub fn next_pass(&mut self) -> bool {
        if !self.pass_done() || self.pass().is_none() {
            return false;
        }
        if self.pass_index + 1 < self.order.passes().len() {
            self.start_pass(self.pass_index + 1);
            true
        } else {
            self.pass_index = self.order.passes().len();
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
    use std::collections::{BTreeMap, HashMap};

    /// A model namespace: id → (parent, is_dir, children).
    #[derive(Clone)]
    struct Model {
        parent: HashMap<u64, u64>,
        /// Ordered, so [`Model::all`] needs no sort (the model tests call it at every
        /// client operation).
        is_dir: BTreeMap<u64, bool>,
        children: HashMap<u64, Vec<u64>>,
        next_id: u64,
    }

    impl Model {
        fn new() -> Self {
            let mut m = Self {
                parent: HashMap::new(),
                is_dir: BTreeMap::new(),
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
            self.is_dir.keys().copied().collect()
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

    /// One random client operation: a rename (reported to the crawl), a delete or a create.
    fn client_op(rng: &mut Rng, m: &mut Model, crawl: &mut CrawlPartition<u64>) {
        let ids = m.all();
        let obj = ids[rng.below(ids.len() as u64) as usize];
        match rng.below(10) {
            0..=5 => {
                // `is_dir` is ordered: the directories in id order, as `ids` filtered.
                let dirs: Vec<u64> = m
                    .is_dir
                    .iter()
                    .filter(|(_, d)| **d)
                    .map(|(i, _)| *i)
                    .collect();
                let to = dirs[rng.below(dirs.len() as u64) as usize];
                if m.mv(obj, to) {
                    let kind = if m.is_dir[&obj] {
                        ChildKind::Directory
                    } else {
                        ChildKind::Leaf
                    };
                    crawl.on_rename(&obj, kind);
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
        // Each worker holds at most one piece of work (a directory it is listing or a
        // leaf it is fetching) for a random number of steps.
        let mut holding: Vec<Option<CrawlWork<u64>>> = vec![None; workers];
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 200_000, "model did not terminate");
            if client_ops && rng.below(3) == 0 {
                client_op(&mut rng, &mut m, &mut crawl);
                continue;
            }
            let w = rng.below(workers as u64) as usize;
            match holding[w].take() {
                None => {
                    if let Some(work) = crawl.take() {
                        let (CrawlWork::List(k) | CrawlWork::Fetch(k, _)) = &work;
                        *visits.entry(*k).or_default() += 1;
                        holding[w] = Some(work);
                    } else if crawl.pass_done() {
                        assert!(
                            holding.iter().all(Option::is_none),
                            "pass done while work is still handed out (seed {seed})"
                        );
                        break;
                    }
                }
                Some(CrawlWork::List(d)) => match m.list(d) {
                    Some(children) => {
                        crawl.on_listed(&d, &children);
                    }
                    None => crawl.on_gone(&d),
                },
                Some(CrawlWork::Fetch(k, _)) => {
                    // Fetching takes a while: sometimes report it, sometimes keep at it.
                    if rng.below(3) == 0 {
                        holding[w] = Some(CrawlWork::Fetch(k, Pass::Bulk));
                    } else {
                        assert!(!crawl.pass_done(), "pass done during a fetch (seed {seed})");
                        crawl.on_fetched(&k);
                    }
                }
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
        assert_eq!(crawl.take(), Some(CrawlWork::List(0)));
        assert_eq!(
            crawl.on_listed(&0, &[(1, ChildKind::Directory), (2, ChildKind::Directory)]),
            0
        );
        assert_eq!(crawl.take(), Some(CrawlWork::List(1)));
        assert_eq!(crawl.take(), Some(CrawlWork::List(2)));
        crawl.on_listed(&2, &[]);
        assert!(crawl.on_rename(&3, ChildKind::Directory));
        crawl.on_listed(&1, &[]); // A no longer contains X
        assert_eq!(
            crawl.take(),
            Some(CrawlWork::List(3)),
            "the moved subtree is still crawled"
        );
        assert_eq!(crawl.stats().rescued_by_rename, 1);
        // Renaming it again does not queue it twice.
        assert!(!crawl.on_rename(&3, ChildKind::Directory));
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
            while let Some(CrawlWork::List(d)) = c.take() {
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
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        assert_eq!(c.on_listed(&0, &[(5, ChildKind::Leaf)]), 1);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(5, Pass::Metadata)));
        c.on_fetched(&5);
        assert!(c.pass_done());
        assert!(c.next_pass());
        assert_eq!(c.pass(), Some(Pass::Data));
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(&0, &[(5, ChildKind::Leaf)]);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(5, Pass::Data)));
        c.on_fetched(&5);
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
        b.take();
        b.on_listed(&0, &[(5, ChildKind::Leaf)]);
        assert_eq!(b.take(), Some(CrawlWork::Fetch(5, Pass::Bulk)));
        b.on_fetched(&5);
        assert!(!b.next_pass());
    }

    /// The root cause of the flaky `nfs_migration_from_ganesha`: a pass must stay open
    /// while a leaf handed out in it is still being fetched by another worker, and its
    /// leaves go to any idle worker before more directories are listed.
    #[test]
    fn a_pass_stays_open_while_a_handed_out_leaf_is_being_fetched() {
        let mut c = CrawlPartition::new(
            CrawlOrder {
                traversal: Traversal::DepthFirst,
                phasing: Phasing::Bulk,
            },
            0u64,
        );
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(
            &0,
            &[
                (1, ChildKind::Leaf),
                (2, ChildKind::Leaf),
                (3, ChildKind::Directory),
            ],
        );
        // Worker A takes leaf 1, worker B leaf 2 (not the directory: files first).
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Bulk)));
        assert_eq!(c.take(), Some(CrawlWork::Fetch(2, Pass::Bulk)));
        assert_eq!(c.take(), Some(CrawlWork::List(3)));
        c.on_listed(&3, &[]);
        c.on_fetched(&2);
        // Nothing left to hand out, but leaf 1 is still being fetched.
        assert_eq!(c.take(), None);
        assert!(!c.pass_done(), "pass ended while leaf 1 is in flight");
        assert!(!c.next_pass(), "next_pass refuses while work is in flight");
        assert_eq!(c.pass(), Some(Pass::Bulk));
        c.on_fetched(&1);
        assert!(c.pass_done());
        assert!(!c.next_pass(), "bulk: the round is complete");
        assert_eq!(c.pass(), None);
        assert!(
            !c.on_rename(&9, ChildKind::Leaf),
            "no pass: nothing claimed"
        );
        assert_eq!(c.stats().leaves_in_flight, 0);
    }

    #[test]
    fn give_back_keeps_the_directory_and_restart_begins_at_root() {
        let mut c = CrawlPartition::new(CrawlOrder::default(), 0u64);
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.give_back(0);
        assert!(!c.pass_done());
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(&0, &[(1, ChildKind::Directory)]);
        c.restart();
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        // A report from before the restart changes nothing.
        assert_eq!(c.on_listed(&7, &[(8, ChildKind::Leaf)]), 0);
        assert_eq!(c.stats().queued_leaves, 0);
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
        let o = CrawlOrder::parse("bfs", "metadata-priority").unwrap();
        assert_eq!(o.phasing, Phasing::MetadataPriority);
        assert!(o.overlapped() && !CrawlOrder::default().overlapped());
        assert_eq!(o.passes(), &[Pass::Metadata, Pass::Data]);
        for p in [
            Phasing::MetadataFirst,
            Phasing::MetadataPriority,
            Phasing::Bulk,
        ] {
            assert_eq!(CrawlOrder::parse("bfs", p.as_str()).unwrap().phasing, p);
        }
    }

    fn overlapped(traversal: Traversal) -> CrawlOrder {
        CrawlOrder {
            traversal,
            phasing: Phasing::MetadataPriority,
        }
    }

    /// Runs a whole round (every pass) with `workers` interleaved workers and random
    /// client renames, deletes and creates. Checks: metadata work is always handed out
    /// before early data; every object that existed at the start and still exists is
    /// listed (directories) or has its metadata fetched (leaves) once per expanding pass,
    /// and every such leaf's data is handed out exactly once in the round; nothing is
    /// handed out twice; the round ends only when nothing handed out is unreported.
    fn run_round(seed: u64, order: CrawlOrder, workers: usize, client_ops: bool) -> CrawlStats {
        let mut rng = Rng(seed | 1);
        let mut m = random_tree(&mut rng, 400);
        let original: HashSet<u64> = m.all().into_iter().collect();
        let mut crawl = CrawlPartition::new(order, 0u64);
        if seed.is_multiple_of(4) {
            crawl.set_early_data_limit(1 + (seed as usize / 4) % 3);
        }
        // (pass index, id) → lists and metadata fetches; id → data (or bulk) fetches.
        let mut visits: HashMap<(usize, u64), u32> = HashMap::new();
        let mut data: HashMap<u64, u32> = HashMap::new();
        let mut holding: Vec<Option<CrawlWork<u64>>> = vec![None; workers];
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 400_000, "model did not terminate (seed {seed})");
            if client_ops && rng.below(3) == 0 {
                client_op(&mut rng, &mut m, &mut crawl);
                continue;
            }
            let w = rng.below(workers as u64) as usize;
            match holding[w].take() {
                None => {
                    let before = crawl.stats();
                    let pass = crawl.pass();
                    if let Some(work) = crawl.take() {
                        match &work {
                            CrawlWork::Fetch(k, p @ (Pass::Data | Pass::Bulk)) => {
                                if pass == Some(Pass::Metadata) {
                                    assert!(order.overlapped() && *p == Pass::Data);
                                    assert_eq!(
                                        (before.queued_dirs, before.queued_leaves),
                                        (0, 0),
                                        "early data handed out before metadata work (seed {seed})"
                                    );
                                }
                                *data.entry(*k).or_default() += 1;
                            }
                            CrawlWork::List(k) | CrawlWork::Fetch(k, Pass::Metadata) => {
                                *visits.entry((before.pass_index, *k)).or_default() += 1;
                            }
                        }
                        holding[w] = Some(work);
                    } else if crawl.pass().is_some() && crawl.pass_done() {
                        // Only early data fetches may outlive the metadata pass.
                        for h in holding.iter().flatten() {
                            assert!(
                                crawl.pass() == Some(Pass::Metadata)
                                    && matches!(h, CrawlWork::Fetch(_, Pass::Data)),
                                "pass done while {h:?} is handed out (seed {seed})"
                            );
                        }
                        if !crawl.next_pass() {
                            assert!(holding.iter().all(Option::is_none));
                            break;
                        }
                    }
                }
                Some(CrawlWork::List(d)) => match m.list(d) {
                    Some(children) => {
                        crawl.on_listed(&d, &children);
                    }
                    None => crawl.on_gone(&d),
                },
                Some(CrawlWork::Fetch(k, p)) => {
                    if rng.below(3) == 0 {
                        holding[w] = Some(CrawlWork::Fetch(k, p));
                    } else {
                        assert!(
                            !crawl.pass_done()
                                || (crawl.pass() == Some(Pass::Metadata) && p == Pass::Data),
                            "pass done during a fetch (seed {seed})"
                        );
                        crawl.on_fetched(&k);
                    }
                }
            }
        }
        for (key, n) in &visits {
            assert_eq!(*n, 1, "{key:?} visited {n} times (seed {seed})");
        }
        for (id, n) in &data {
            assert_eq!(*n, 1, "data of {id} handed out {n} times (seed {seed})");
        }
        let expanding_passes = order.passes().len();
        for id in m.all() {
            if !original.contains(&id) {
                continue;
            }
            if m.is_dir[&id] {
                for pass in 0..expanding_passes {
                    assert!(
                        visits.contains_key(&(pass, id)),
                        "dir {id} missed in pass {pass} (seed {seed})"
                    );
                }
            } else {
                if order.phasing != Phasing::Bulk {
                    assert!(
                        visits.contains_key(&(0, id)),
                        "metadata of {id} missed (seed {seed})"
                    );
                }
                assert!(
                    data.contains_key(&id),
                    "data of {id} missed (seed {seed}, {workers} workers)"
                );
            }
        }
        crawl.stats()
    }

    #[test]
    fn whole_rounds_with_renames_fetch_every_leafs_data_exactly_once_in_every_phasing() {
        let mut early = 0;
        for seed in 1..50 {
            let traversal = if seed % 2 == 0 {
                Traversal::BreadthFirst
            } else {
                Traversal::DepthFirst
            };
            for phasing in [
                Phasing::MetadataFirst,
                Phasing::MetadataPriority,
                Phasing::Bulk,
            ] {
                let order = CrawlOrder { traversal, phasing };
                let stats = run_round(
                    seed * 104_729,
                    order,
                    1 + (seed as usize % 6),
                    seed % 3 != 0,
                );
                if phasing == Phasing::MetadataPriority {
                    early += stats.early_data_fetches;
                } else {
                    assert_eq!(stats.early_data_fetches, 0);
                }
            }
        }
        assert!(early > 0, "the overlapped mode never fetched data early");
    }

    #[test]
    fn an_idle_worker_in_the_metadata_pass_fetches_data_of_a_metadata_complete_leaf() {
        // 0 → {1 leaf, 2 leaf, 3 dir}; 3 → {4 leaf}
        let mut c = CrawlPartition::new(overlapped(Traversal::BreadthFirst), 0u64);
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(
            &0,
            &[
                (1, ChildKind::Leaf),
                (2, ChildKind::Leaf),
                (3, ChildKind::Directory),
            ],
        );
        // Metadata work first: both leaves' metadata, then the directory.
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Metadata)));
        assert_eq!(c.take(), Some(CrawlWork::Fetch(2, Pass::Metadata)));
        assert_eq!(c.take(), Some(CrawlWork::List(3)));
        // Nothing's metadata is done yet: an idle worker gets nothing.
        assert_eq!(c.take(), None);
        c.on_fetched(&2);
        c.on_fetched(&1);
        // An idle worker now fetches data, in the order metadata completed.
        assert_eq!(c.take(), Some(CrawlWork::Fetch(2, Pass::Data)));
        assert_eq!(c.stats().early_data_fetches, 1);
        // A listing arrives: its leaf's metadata goes before the queued early data.
        c.on_listed(&3, &[(4, ChildKind::Leaf)]);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(4, Pass::Metadata)));
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Data)));
        c.on_fetched(&1);
        assert_eq!(c.take(), None, "leaf 4's metadata is still in flight");
        c.on_fetched(&4);
        // Metadata work is all done: the pass ends although early data (2) and queued
        // early data (4) remain; the data pass finds 4 again and skips 1 and 2.
        assert!(c.pass_done());
        assert!(c.next_pass());
        assert_eq!(c.pass(), Some(Pass::Data));
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(
            &0,
            &[
                (1, ChildKind::Leaf),
                (2, ChildKind::Leaf),
                (3, ChildKind::Directory),
            ],
        );
        assert_eq!(c.take(), Some(CrawlWork::List(3)));
        c.on_listed(&3, &[(4, ChildKind::Leaf)]);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(4, Pass::Data)));
        c.on_fetched(&4);
        assert_eq!(c.take(), None);
        assert_eq!(c.stats().early_data_skipped, 2);
        // Leaf 2's early fetch is still in flight: the round must not end.
        assert!(
            !c.pass_done(),
            "round ended while an early data fetch is in flight"
        );
        assert!(!c.next_pass());
        // A rename of a leaf fetched early does not queue it again.
        assert!(!c.on_rename(&2, ChildKind::Leaf));
        c.on_fetched(&2);
        assert!(c.pass_done());
        assert!(!c.next_pass(), "the round is complete");
        assert_eq!(c.pass(), None);
        // A new round starts clean: data is fetched again only if the store still has
        // stubs (it skips complete files itself).
        c.restart();
        assert_eq!(c.stats().leaves_in_flight, 0);
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(&0, &[(1, ChildKind::Leaf)]);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Metadata)));
    }

    #[test]
    fn early_data_fetches_in_flight_are_capped() {
        let mut c = CrawlPartition::new(overlapped(Traversal::BreadthFirst), 0u64);
        c.set_early_data_limit(2);
        c.take();
        c.on_listed(
            &0,
            &[
                (1, ChildKind::Leaf),
                (2, ChildKind::Leaf),
                (3, ChildKind::Leaf),
            ],
        );
        for leaf in 1..=3 {
            assert_eq!(c.take(), Some(CrawlWork::Fetch(leaf, Pass::Metadata)));
            c.on_fetched(&leaf);
        }
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Data)));
        assert_eq!(c.take(), Some(CrawlWork::Fetch(2, Pass::Data)));
        assert_eq!(c.take(), None, "two early fetches in flight: the cap");
        c.on_fetched(&1);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(3, Pass::Data)));
        assert_eq!(c.stats().early_data_fetches, 3);
    }

    #[test]
    fn strict_metadata_first_never_fetches_data_in_the_metadata_pass() {
        let mut c = CrawlPartition::new(CrawlOrder::default(), 0u64);
        assert_eq!(c.take(), Some(CrawlWork::List(0)));
        c.on_listed(&0, &[(1, ChildKind::Leaf), (2, ChildKind::Directory)]);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Metadata)));
        c.on_fetched(&1);
        assert_eq!(c.take(), Some(CrawlWork::List(2)));
        assert_eq!(c.take(), None, "an idle worker waits in the strict mode");
        c.on_listed(&2, &[]);
        assert!(c.next_pass());
        c.take();
        c.on_listed(&0, &[(1, ChildKind::Leaf), (2, ChildKind::Directory)]);
        assert_eq!(c.take(), Some(CrawlWork::Fetch(1, Pass::Data)));
        assert_eq!(c.stats().early_data_fetches, 0);
    }
}
