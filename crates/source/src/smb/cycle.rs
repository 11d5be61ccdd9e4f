//! Directory cycles of an SMB share.
//!
//! Samba follows symlinks on the server (`follow symlinks = yes` by default), so a
//! symlink to an ancestor (`d/self -> .`, `d/sub/up -> ..`) shows to an SMB client as a
//! directory that contains itself, and a crawl would go down `d/self/self/…` until the
//! server's path limit. A directory cannot be hard-linked, so a directory whose FileId is
//! the FileId of one of its ancestors is such a loop: the source refuses to list it (the
//! engine then reports it as skipped and leaves it an empty directory).
//!
//! The FileIds of directories are remembered from listings (each listed subdirectory's,
//! and each listed directory's own) in a bounded two-generation table; an ancestor that
//! is not in it (after a restart, or after the table turned over) is asked for with one
//! `stat`. FileId 0 means the server has none: never a cycle.

use std::collections::HashMap;
use std::sync::Mutex;

use kaiso_store::migrate::SourcePath;

/// Directory FileIds remembered per generation; at most twice as many are kept.
pub(crate) const DIR_IDS_PER_GENERATION: usize = 65_536;

/// The FileIds of directories seen lately, by path.
pub(crate) struct DirIds {
    cap: usize,
    gens: Mutex<Gens>,
}

#[derive(Default)]
struct Gens {
    now: HashMap<SourcePath, u64>,
    old: HashMap<SourcePath, u64>,
}

impl Gens {
    fn insert(&mut self, cap: usize, path: SourcePath, id: u64) {
        if self.now.len() >= cap && !self.now.contains_key(&path) {
            self.old = std::mem::take(&mut self.now);
        }
        self.now.insert(path, id);
    }

    /// The FileId of `path`, kept in the current generation once asked for (so the
    /// directories near the root, asked for by every listing below them, stay).
    fn get(&mut self, cap: usize, path: &SourcePath) -> Option<u64> {
        if let Some(&id) = self.now.get(path) {
            return Some(id);
        }
        let id = self.old.remove(path)?;
        self.insert(cap, path.clone(), id);
        Some(id)
    }
}

/// What [`DirIds::ancestor_with`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ancestor {
    /// This ancestor has the FileId: the directory is that ancestor again.
    Same(SourcePath),
    /// No remembered ancestor has it; these ancestors (nearest first) are not
    /// remembered and must be asked for.
    Unknown(Vec<SourcePath>),
}

impl DirIds {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            gens: Mutex::new(Gens::default()),
        }
    }

    /// Remembers that the directory at `path` has FileId `id` (0: unknown, ignored).
    pub(crate) fn note(&self, path: &SourcePath, id: u64) {
        if id == 0 {
            return;
        }
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        g.insert(self.cap, path.clone(), id);
    }

    pub(crate) fn get(&self, path: &SourcePath) -> Option<u64> {
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        g.get(self.cap, path)
    }

    /// The nearest ancestor of `path` whose remembered FileId is `id`, or the ancestors
    /// whose FileId is not remembered.
    pub(crate) fn ancestor_with(&self, path: &SourcePath, id: u64) -> Ancestor {
        let mut unknown = Vec::new();
        if id == 0 {
            return Ancestor::Unknown(unknown);
        }
        let mut g = self.gens.lock().unwrap_or_else(|p| p.into_inner());
        let mut at = path.parent();
        while let Some(a) = at {
            match g.get(self.cap, &a) {
                Some(x) if x == id => return Ancestor::Same(a),
                Some(_) => {}
                None => unknown.push(a.clone()),
            }
            at = a.parent();
        }
        Ancestor::Unknown(unknown)
    }
}

/// The reason a directory that is its ancestor `same` again is not listed.
pub(crate) fn cycle_reason(same: &SourcePath, id: u64) -> String {
    let same = if same.as_bytes().is_empty() {
        "the share's root".to_string()
    } else {
        format!("its ancestor {same}")
    };
    format!(
        "directory cycle: this directory is {same} again (same SMB FileId {id:#x}; the \
         server follows a symlink to an ancestor), not descended into"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SourcePath {
        SourcePath::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn a_directory_with_an_ancestors_file_id_is_that_ancestor() {
        let ids = DirIds::new(16);
        ids.note(&SourcePath::root(), 1);
        ids.note(&p("d"), 2);
        ids.note(&p("d/sub"), 3);
        // d/self -> . and d/sub/up -> .. and a link to the root.
        assert_eq!(ids.ancestor_with(&p("d/self"), 2), Ancestor::Same(p("d")));
        assert_eq!(ids.ancestor_with(&p("d/sub/up"), 2), Ancestor::Same(p("d")));
        assert_eq!(
            ids.ancestor_with(&p("d/sub/top"), 1),
            Ancestor::Same(SourcePath::root())
        );
        // A directory of its own, and one whose FileId the server does not give.
        assert_eq!(
            ids.ancestor_with(&p("d/sub/leaf"), 4),
            Ancestor::Unknown(vec![])
        );
        assert_eq!(
            ids.ancestor_with(&p("d/sub/x"), 0),
            Ancestor::Unknown(vec![])
        );
        // The same FileId elsewhere than on the path (a link to a sibling) is no cycle.
        assert_eq!(
            ids.ancestor_with(&p("e/x"), 3),
            Ancestor::Unknown(vec![p("e")])
        );
        assert!(cycle_reason(&p("d"), 2).contains("its ancestor /d again"));
        assert!(cycle_reason(&SourcePath::root(), 1).contains("the share's root again"));
    }

    #[test]
    fn ancestors_not_remembered_are_named_nearest_first() {
        let ids = DirIds::new(16);
        ids.note(&p("a"), 7);
        assert_eq!(
            ids.ancestor_with(&p("a/b/c/d"), 9),
            Ancestor::Unknown(vec![p("a/b/c"), p("a/b"), SourcePath::root()])
        );
    }

    #[test]
    fn the_table_is_bounded_and_keeps_what_is_asked_for() {
        let ids = DirIds::new(4);
        ids.note(&SourcePath::root(), 1);
        for i in 0..100u64 {
            ids.note(&p(&format!("x{i}")), 100 + i);
            // The root is asked for by every listing below it: it stays.
            assert_eq!(ids.get(&SourcePath::root()), Some(1), "after {i}");
        }
        let g = ids.gens.lock().unwrap();
        assert!(
            g.now.len() + g.old.len() <= 8,
            "{} kept",
            g.now.len() + g.old.len()
        );
    }
}
