//! The in-memory namespace index: every directory and file of the union, by inode number
//! and by (parent, name). Built by a scan of the tiers at open, then kept up to date by the
//! store's own operations. The tier directories stay the truth on disk; this index is what
//! makes lookups and directory listings cheap and lets slow tiers stay idle (R14).
//!
//! Inode numbers: the root is 1. A file's number is derived from where it was first seen,
//! `slot << 48 | backing inode`, so creating files needs no database write; when a file
//! moves to another tier its number is kept through a `remap` row, and numbers held that
//! way are never handed out again. Directories get numbers from a counter below 2^48,
//! persisted with their path.

use crate::handles::FileState;
use crate::types::{FileKind, Ino, ROOT_INO};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub(crate) const SLOT_SHIFT: u32 = 48;
pub(crate) const BINO_MASK: u64 = (1 << SLOT_SHIFT) - 1;

pub(crate) struct DirNode {
    pub path: PathBuf,
    pub parent: Ino,
    /// Entries of the union directory, by name.
    pub children: BTreeMap<OsString, Ino>,
    /// Migration stub: entries not listed yet.
    pub unlisted: bool,
    /// Migration stub: the link count its source gave (its parent's listing), shown
    /// while it is unlisted (its backing directory has no subdirectories yet). Not
    /// persisted: the stub filler gives it again (see `Store::stub_show_nlink`).
    pub shown_nlink: Option<u32>,
    pub lookups: u64,
}

pub(crate) struct FileNode {
    pub kind: FileKind,
    /// Index of the tier holding it.
    pub tier: u8,
    /// Backing inode number on that tier.
    pub bino: u64,
    /// Every name (hard links); empty once unlinked while still open.
    pub names: Vec<(Ino, OsString)>,
    pub state: Arc<FileState>,
    pub lookups: u64,
}

pub(crate) struct Namespace {
    pub dirs: HashMap<Ino, DirNode>,
    pub files: HashMap<Ino, FileNode>,
    /// Tier index → stable slot.
    pub slots: Vec<u8>,
    pub remap: HashMap<(u8, u64), Ino>,
    pub taken: HashSet<Ino>,
    pub dir_ids: HashMap<PathBuf, Ino>,
    pub next_ino: u64,
    /// Allocations since the counter was last persisted.
    pub next_ino_dirty: bool,
    /// Names just probed missing on every tier (see [`RecentMisses`]).
    pub recent_misses: RecentMisses,
}

/// Names a lookup just probed missing on every tier, so the create that follows it (the
/// kernel always looks a new name up first) need not probe the tiers again. An entry is
/// used once, by a create within [`RecentMisses::FRESH`]; the probe it saves could only
/// find a file placed directly into a tier directory within that moment (the kernel
/// itself caches the same miss for up to a second).
#[derive(Default)]
pub(crate) struct RecentMisses {
    entries: std::collections::VecDeque<(Ino, OsString, std::time::Instant)>,
}

impl RecentMisses {
    const CAPACITY: usize = 32;
    const FRESH: std::time::Duration = std::time::Duration::from_millis(500);

    /// `name` in `parent` was probed missing on every tier just now.
    pub fn record(&mut self, parent: Ino, name: &OsStr) {
        if self.entries.len() >= Self::CAPACITY {
            self.entries.pop_front();
        }
        self.entries
            .push_back((parent, name.to_os_string(), std::time::Instant::now()));
    }

    /// Whether `name` in `parent` was probed missing moments ago (forgetting it).
    pub fn take(&mut self, parent: Ino, name: &OsStr) -> bool {
        let Some(i) = self
            .entries
            .iter()
            .rposition(|(p, n, _)| *p == parent && n == name)
        else {
            return false;
        };
        self.entries
            .remove(i)
            .is_some_and(|(_, _, at)| at.elapsed() < Self::FRESH)
    }
}

/// What the caller must persist after assigning a number.
pub(crate) enum Assigned {
    Known(Ino),
    /// A new remap row (slot, bino, ino).
    NewRemap(Ino, u8, u64),
}

impl Namespace {
    pub fn new(slots: Vec<u8>, next_ino: u64) -> Namespace {
        let mut dirs = HashMap::new();
        dirs.insert(
            ROOT_INO,
            DirNode {
                path: PathBuf::new(),
                parent: ROOT_INO,
                children: BTreeMap::new(),
                unlisted: false,
                shown_nlink: None,
                lookups: 1,
            },
        );
        let mut dir_ids = HashMap::new();
        dir_ids.insert(PathBuf::new(), ROOT_INO);
        Namespace {
            dirs,
            files: HashMap::new(),
            slots,
            remap: HashMap::new(),
            taken: HashSet::new(),
            dir_ids,
            next_ino: next_ino.max(2),
            next_ino_dirty: false,
            recent_misses: RecentMisses::default(),
        }
    }

    pub fn alloc_ino(&mut self) -> Ino {
        let i = self.next_ino;
        self.next_ino += 1;
        self.next_ino_dirty = true;
        i
    }

    /// The number of the file with backing inode `bino` on tier `tier`.
    ///
    /// The natural number is not used when a node already holds it for another backing
    /// file: backing inode numbers are reused once a file is deleted, while kaiso keeps
    /// the node of an unlinked file as long as the kernel still refers to it (lookups,
    /// open handles), or the file lives on another tier now.
    pub fn file_ino(&mut self, tier: u8, bino: u64) -> Assigned {
        let slot = self.slots[tier as usize];
        if let Some(&i) = self.remap.get(&(slot, bino)) {
            return Assigned::Known(i);
        }
        let natural = ((slot as u64) << SLOT_SHIFT) | bino;
        let held_by_other = self
            .files
            .get(&natural)
            .is_some_and(|f| f.tier != tier || f.bino != bino || f.names.is_empty());
        if bino <= BINO_MASK && !self.taken.contains(&natural) && !held_by_other {
            return Assigned::Known(natural);
        }
        let i = self.alloc_ino();
        self.remap.insert((slot, bino), i);
        self.taken.insert(i);
        Assigned::NewRemap(i, slot, bino)
    }

    /// Record that file `ino` now lives at (tier, bino) (after a move). Returns the slot.
    pub fn set_file_location(&mut self, ino: Ino, tier: u8, bino: u64) -> u8 {
        let slot = self.slots[tier as usize];
        self.remap.retain(|_, v| *v != ino);
        let natural = ((slot as u64) << SLOT_SHIFT) | bino;
        if natural != ino {
            self.remap.insert((slot, bino), ino);
            self.taken.insert(ino);
        }
        slot
    }

    pub fn dir_path(&self, ino: Ino) -> Option<&Path> {
        self.dirs.get(&ino).map(|d| d.path.as_path())
    }

    /// Store-relative path of a child.
    pub fn child_path(&self, parent: Ino, name: &OsStr) -> Option<PathBuf> {
        self.dir_path(parent).map(|p| {
            if p.as_os_str().is_empty() {
                PathBuf::from(name)
            } else {
                p.join(name)
            }
        })
    }

    /// A usable path of a file (its first name).
    pub fn file_path(&self, ino: Ino) -> Option<PathBuf> {
        let f = self.files.get(&ino)?;
        let (p, n) = f.names.first()?;
        self.child_path(*p, n)
    }

    /// All paths of a file (link group).
    pub fn file_paths(&self, ino: Ino) -> Vec<PathBuf> {
        match self.files.get(&ino) {
            Some(f) => f
                .names
                .iter()
                .filter_map(|(p, n)| self.child_path(*p, n))
                .collect(),
            None => Vec::new(),
        }
    }

    /// Path of any inode (dir or file).
    pub fn path_of(&self, ino: Ino) -> Option<PathBuf> {
        if let Some(d) = self.dirs.get(&ino) {
            return Some(d.path.clone());
        }
        self.file_path(ino)
    }

    pub fn child(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        self.dirs.get(&parent)?.children.get(name).copied()
    }

    pub fn is_dir(&self, ino: Ino) -> bool {
        self.dirs.contains_key(&ino)
    }

    /// Add a directory node (its path must be new).
    pub fn add_dir(&mut self, ino: Ino, parent: Ino, name: &OsStr, path: PathBuf, unlisted: bool) {
        self.dir_ids.insert(path.clone(), ino);
        self.dirs.insert(
            ino,
            DirNode {
                path,
                parent,
                children: BTreeMap::new(),
                unlisted,
                shown_nlink: None,
                lookups: 0,
            },
        );
        if let Some(p) = self.dirs.get_mut(&parent) {
            p.children.insert(name.to_os_string(), ino);
        }
    }

    /// Add a name for a file (creating the node if new).
    pub fn add_file_name(
        &mut self,
        ino: Ino,
        parent: Ino,
        name: &OsStr,
        make: impl FnOnce() -> FileNode,
    ) {
        let f = self.files.entry(ino).or_insert_with(make);
        if !f.names.iter().any(|(p, n)| *p == parent && n == name) {
            f.names.push((parent, name.to_os_string()));
        }
        if let Some(p) = self.dirs.get_mut(&parent) {
            p.children.insert(name.to_os_string(), ino);
        }
    }

    /// Remove a name from its directory and from its node. Returns the inode it named.
    pub fn remove_name(&mut self, parent: Ino, name: &OsStr) -> Option<Ino> {
        let ino = self.dirs.get_mut(&parent)?.children.remove(name)?;
        if let Some(f) = self.files.get_mut(&ino) {
            f.names.retain(|(p, n)| !(*p == parent && n == name));
        }
        Some(ino)
    }

    /// Drop a directory node (after rmdir) and its id mapping.
    pub fn drop_dir(&mut self, ino: Ino) {
        if let Some(d) = self.dirs.remove(&ino) {
            self.dir_ids.remove(&d.path);
        }
    }

    /// A directory moved: rewrite its path and every descendant's.
    pub fn rename_dir(&mut self, ino: Ino, new_parent: Ino, new_name: &OsStr) {
        let Some(old) = self.dirs.get(&ino).map(|d| d.path.clone()) else {
            return;
        };
        let newp = self
            .child_path(new_parent, new_name)
            .unwrap_or_else(|| PathBuf::from(new_name));
        let mut stack = vec![ino];
        while let Some(i) = stack.pop() {
            let Some(d) = self.dirs.get_mut(&i) else {
                continue;
            };
            let rest = d
                .path
                .strip_prefix(&old)
                .map(|r| r.to_path_buf())
                .unwrap_or_default();
            let np = if rest.as_os_str().is_empty() {
                newp.clone()
            } else {
                newp.join(rest)
            };
            self.dir_ids.remove(&d.path);
            d.path = np.clone();
            self.dir_ids.insert(np, i);
            for c in d.children.values() {
                stack.push(*c);
            }
        }
        if let Some(d) = self.dirs.get_mut(&ino) {
            d.parent = new_parent;
        }
    }

    /// Descendant files of a directory (for recursive operator commands).
    pub fn files_under(&self, dir: Ino) -> Vec<Ino> {
        let mut out = Vec::new();
        let mut stack = vec![dir];
        let mut seen = HashSet::new();
        while let Some(i) = stack.pop() {
            let Some(d) = self.dirs.get(&i) else { continue };
            for c in d.children.values() {
                if self.dirs.contains_key(c) {
                    stack.push(*c);
                } else if seen.insert(*c) {
                    out.push(*c);
                }
            }
        }
        out
    }

    /// Resolve a store-relative path to an inode.
    pub fn resolve(&self, rel: &Path) -> Option<Ino> {
        let mut cur = ROOT_INO;
        for c in rel.components() {
            match c {
                std::path::Component::Normal(n) => cur = self.child(cur, n)?,
                std::path::Component::CurDir | std::path::Component::RootDir => {}
                std::path::Component::ParentDir => cur = self.dirs.get(&cur).map(|d| d.parent)?,
                std::path::Component::Prefix(_) => return None,
            }
        }
        Some(cur)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(tier: u8, bino: u64, ino: Ino) -> FileNode {
        FileNode {
            kind: FileKind::File,
            tier,
            bino,
            names: Vec::new(),
            state: FileState::new(ino, tier, 0),
            lookups: 1,
        }
    }

    /// A backing inode number reused after an unlink must not hand the new file the number
    /// of the unlinked one while the kernel still refers to it, nor the number of a file
    /// that has moved to another tier.
    #[test]
    fn reused_backing_inodes_get_their_own_number() {
        let mut ns = Namespace::new(vec![1, 2], 2);
        let Assigned::Known(x) = ns.file_ino(0, 42) else {
            panic!("a fresh backing inode gets its natural number")
        };
        ns.add_file_name(x, ROOT_INO, OsStr::new("old"), || node(0, 42, x));
        assert!(matches!(ns.file_ino(0, 42), Assigned::Known(i) if i == x));
        // Unlinked, still looked up: backing inode 42 now belongs to a new file.
        ns.remove_name(ROOT_INO, OsStr::new("old"));
        let Assigned::NewRemap(y, 1, 42) = ns.file_ino(0, 42) else {
            panic!("the number of a referenced unlinked file was reused")
        };
        assert_ne!(x, y);
        // A file whose node moved to tier 1 keeps its number; its old backing inode on
        // tier 0 is another file's now.
        let Assigned::Known(z) = ns.file_ino(0, 77) else {
            panic!()
        };
        ns.add_file_name(z, ROOT_INO, OsStr::new("moved"), || node(1, 5, z));
        assert!(matches!(ns.file_ino(0, 77), Assigned::NewRemap(..)));
    }
}
