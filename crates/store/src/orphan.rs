//! Files that have no name left but are still open ("orphans").
//!
//! Such a file's data is reachable only through its open descriptors, so when it has to
//! move (a write spills it to another tier) the mover copies from a descriptor and gives
//! the copy a hidden name in the destination tier's orphan directory,
//! `<tier>/.kaiso-tmp-orphans/<ino>-<nanos>`. The directory belongs to kaiso: its name
//! starts with the temporary prefix, so lookups, listings, creates and renames never show
//! or accept it, and the tier scan never adopts it. An orphan copy goes when the file's
//! last handle closes (the namespace lock orders that against the mover's switch); no
//! copy survives a restart (nothing can hold the file open across it), so the scan at
//! open removes every one, and `fsck` removes those no open file holds.

use crate::handles::FileState;
use crate::namespace::Namespace;
use crate::operator::FsckReport;
use crate::store::Store;
use crate::tier::Tier;
use crate::util;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::io::AsRawFd;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;

/// Name of the orphan directory at the root of each tier.
pub(crate) const ORPHAN_DIR: &str = ".kaiso-tmp-orphans";

/// A new tier-relative name for an orphan copy of file `ino`.
pub(crate) fn new_name(ino: u64) -> PathBuf {
    Path::new(ORPHAN_DIR).join(format!("{ino}-{}", util::now_nanos()))
}

/// Whether a tier-relative path is inside the orphan directory.
pub(crate) fn is_orphan_path(rel: &Path) -> bool {
    let mut c = rel.components();
    c.next() == Some(Component::Normal(ORPHAN_DIR.as_ref())) && c.next().is_some()
}

/// Make sure `tier` has its orphan directory (only kaiso's own user may enter it).
pub(crate) fn ensure_dir(tier: &Tier) -> std::io::Result<()> {
    match std::fs::DirBuilder::new()
        .mode(0o700)
        .create(tier.backing(Path::new(ORPHAN_DIR)))
    {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// A fresh read-only descriptor of the file behind `f` (which may have no name).
pub(crate) fn reopen(f: &File) -> std::io::Result<File> {
    File::open(format!("/proc/self/fd/{}", f.as_raw_fd()))
}

/// Copy every xattr (ACLs included) of the open file `from` onto the path `to`.
pub(crate) fn copy_xattrs_from(from: &File, to: &Path) -> std::io::Result<()> {
    let raw = match util::flistxattr(from) {
        Ok(r) => r,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(()),
        Err(e) => return Err(e),
    };
    for name in raw.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::ffi::OsStr::from_bytes(name);
        let v = match util::fgetxattr(from, name) {
            Ok(v) => v,
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
            Err(e) => return Err(e),
        };
        util::lsetxattr(to, name, &v, 0)?;
    }
    Ok(())
}

impl Store {
    /// The last handle of file `st`, which has no name left, closed: its hidden copy (if
    /// the mover made one) goes, and the room its data took is given back. `_ns` is the
    /// held namespace lock (the mover switches orphans under it too).
    pub(crate) fn orphan_closed(&self, _ns: &mut Namespace, st: &FileState) {
        let tier = &self.tiers[st.tier() as usize];
        if let Some(rel) = st.orphan.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let p = tier.backing(&rel);
            if let Err(e) = std::fs::remove_file(&p) {
                tracing::warn!(path = %p.display(), error = %e, "cannot remove an orphan copy");
            }
            // Gone when empty; another orphan keeps it (ENOTEMPTY).
            let _ = std::fs::remove_dir(tier.backing(Path::new(ORPHAN_DIR)));
        }
        if st.counted_unlinked.swap(false, Ordering::AcqRel) {
            tier.add_used(-(st.size.load(Ordering::Acquire) as i64));
        }
    }

    /// Remove the orphan copies no open file holds, on every tier (all of them at open),
    /// and orphan directories left empty. Call with the namespace lock held.
    pub(crate) fn clean_orphans(&self, ns: &Namespace, report: &mut FsckReport) {
        // Usually no tier has one: then skip the pass over every file of the index.
        let dirs: Vec<crate::longpath::BackingPath> = self
            .tiers
            .iter()
            .map(|t| t.backing(Path::new(ORPHAN_DIR)))
            .collect();
        if !dirs.iter().any(|d| d.symlink_metadata().is_ok()) {
            return;
        }
        let mut held: HashSet<(u8, PathBuf)> = HashSet::new();
        for f in ns.files.values() {
            if let Some(rel) = f.state.orphan_path() {
                held.insert((f.state.tier(), rel));
            }
        }
        for (ti, dir) in dirs.iter().enumerate() {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            for e in rd.flatten() {
                let rel = Path::new(ORPHAN_DIR).join(e.file_name());
                if held.contains(&(ti as u8, rel)) {
                    continue;
                }
                let p = e.path();
                let gone = if e.file_type().is_ok_and(|t| t.is_dir()) {
                    std::fs::remove_dir_all(&p)
                } else {
                    std::fs::remove_file(&p)
                };
                match gone {
                    Ok(()) => report.temp_removed += 1,
                    Err(err) => {
                        tracing::warn!(path = %p.display(), error = %err, "cannot remove an orphan copy")
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orphan_directory_is_hidden_and_recognised() {
        // Hidden from lookups, listings, creates and the tier scan's adoption.
        assert!(ORPHAN_DIR.starts_with(crate::store::TEMP_PREFIX));
        let n = new_name(42);
        assert!(is_orphan_path(&n), "{}", n.display());
        assert!(n.file_name().unwrap().to_str().unwrap().starts_with("42-"));
        assert!(!is_orphan_path(Path::new(ORPHAN_DIR)));
        assert!(!is_orphan_path(Path::new("dir/.kaiso-tmp-orphans/1-2")));
        assert!(!is_orphan_path(Path::new("a/b")));
    }
}
