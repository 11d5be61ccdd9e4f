//! The migration hook: inodes that are stubs of a remote source, filled on demand.
//!
//! Post-copy migration (the `migrate` module) serves a namespace before its data is here.
//! An inode may carry stub state: a directory whose entries are not listed yet, or a file
//! whose data (some byte ranges) has not been fetched yet. Before the store serves
//! `lookup`/`readdir` in an unlisted directory, or `read`/`write` of an unfetched range,
//! it calls the registered [`StubFiller`], which brings the missing part in through the
//! `stub_*` methods of [`crate::Store`] (they never trigger the filler themselves).

use crate::error::FsResult;
use crate::types::{FileKind, Ino};
use std::path::Path;
use std::time::SystemTime;

/// Implemented by the migration module; registered with [`crate::Store::set_stub_filler`].
///
/// The store calls these with no store lock held, at most once at a time per inode for
/// the same purpose (concurrent callers wait for the first to finish).
pub trait StubFiller: Send + Sync {
    /// Directory `ino` (at `path`, relative to the store root) is unlisted: create its
    /// entries with [`crate::Store::stub_create`], then call
    /// [`crate::Store::stub_dir_listed`]. Entries that already exist are kept.
    fn fill_dir(&self, store: &crate::Store, ino: Ino, path: &Path) -> FsResult<()>;
    /// File `ino` needs the bytes `offset..offset+len` (clamped to its size): write them with
    /// [`crate::Store::stub_write`] (which marks them present). The filler may fetch more
    /// than asked (prefetch).
    fn fill_range(
        &self,
        store: &crate::Store,
        ino: Ino,
        path: &Path,
        offset: u64,
        len: u64,
    ) -> FsResult<()>;
    /// Attributes of `ino` may be stale (optional refresh before getattr); default: nothing.
    fn fill_attr(&self, _store: &crate::Store, _ino: Ino, _path: &Path) -> FsResult<()> {
        Ok(())
    }
}

/// What is known about an entry created by the filler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StubEntry {
    pub kind: FileKind,
    /// Permission bits.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    /// File size (the file is created sparse at this size, all of it unfetched).
    pub size: u64,
    pub mtime: SystemTime,
    pub atime: SystemTime,
    /// Target of a symlink.
    pub symlink_target: Option<std::ffi::OsString>,
    /// Device number for char/block devices.
    pub rdev: u64,
    /// For directories: whether its entries still have to be listed by `fill_dir`.
    pub unlisted: bool,
}

/// Stub state of an inode, as [`crate::Store::stub_state`] reports it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StubState {
    /// A directory whose entries are not listed yet.
    pub unlisted_dir: bool,
    /// Byte ranges `[start, end)` of a file that are NOT yet present, sorted, disjoint.
    pub missing: Vec<(u64, u64)>,
}

impl StubState {
    /// Nothing missing: the inode is an ordinary resident inode.
    pub fn is_complete(&self) -> bool {
        !self.unlisted_dir && self.missing.is_empty()
    }
}

/// Sorted, disjoint set of missing ranges with subtraction.
pub(crate) fn subtract(missing: &mut Vec<(u64, u64)>, start: u64, end: u64) {
    let mut out = Vec::with_capacity(missing.len() + 1);
    for &(s, e) in missing.iter() {
        if e <= start || s >= end {
            out.push((s, e));
            continue;
        }
        if s < start {
            out.push((s, start));
        }
        if e > end {
            out.push((end, e));
        }
    }
    *missing = out;
}

/// The parts of `[start, end)` that are missing.
pub(crate) fn missing_within(missing: &[(u64, u64)], start: u64, end: u64) -> Vec<(u64, u64)> {
    missing
        .iter()
        .filter(|(s, e)| *e > start && *s < end)
        .map(|(s, e)| ((*s).max(start), (*e).min(end)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn range_arithmetic() {
        let mut m = vec![(0, 100)];
        subtract(&mut m, 10, 20);
        assert_eq!(m, vec![(0, 10), (20, 100)]);
        assert_eq!(missing_within(&m, 5, 30), vec![(5, 10), (20, 30)]);
        subtract(&mut m, 0, 1000);
        assert!(m.is_empty());
    }
}
