//! Library file system pool: process-private directories in one memory-mapped pool file.
//!
//! The pool holds a superblock, a redo log, an inode table (inodes with block maps), fixed-size
//! directory-entry arrays and data blocks; every reference is an offset from the pool start.
//! Data and metadata are reached with loads and stores; no system call is made for reads,
//! writes or namespace operations once the pool is open (the `msync` fallback for pools on
//! block file systems excepted). One process owns a pool at a time (an `flock` on the file).
//!
//! This crate interposes nothing: the `kaiso` binary links it for `kaiso private …`, and the
//! `kaiso-preload` cdylib puts it behind libc's file functions.

mod fs;
mod layout;
mod lock;
mod pool;
mod recover;

pub use fs::{DirEntry, Fs, FsError, FsStat, OpenFile, PoolOptions, Stat};
pub use layout::{NAME_MAX, ROOT_INO};
pub use lock::{SpinLock, SpinRwLock};
pub use pool::Persist;
pub use recover::Report;

use std::path::PathBuf;

/// Errors opening or checking a pool.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error(
        "pool {} is in use by another process{}; a pool has one owner at a time",
        path.display(),
        owner.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    Busy { path: PathBuf, owner: Option<u32> },
    #[error("not a usable kaiso pool: {0}")]
    Invalid(String),
}

/// Lexically normalises an absolute path: collapses `//`, `.` and `..` (`..` at the root
/// stays at the root). Symbolic links are not consulted.
pub fn normalize_abs(path: &[u8]) -> Vec<u8> {
    if is_normal_abs(path) {
        return path.to_vec();
    }
    // One pass into the output: a `..` cuts the output back to its previous slash.
    let mut s = Vec::with_capacity(path.len() + 1);
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                let cut = s.iter().rposition(|&b| b == b'/').unwrap_or(0);
                s.truncate(cut);
            }
            c => {
                s.push(b'/');
                s.extend_from_slice(c);
            }
        }
    }
    if s.is_empty() {
        s.push(b'/');
    }
    s
}

/// `path` normalised, without copying when it already is (the common case: paths built by
/// the library itself).
pub fn normalized(path: Vec<u8>) -> Vec<u8> {
    if is_normal_abs(&path) {
        path
    } else {
        normalize_abs(&path)
    }
}

/// True when `path` is absolute and has no empty, `.` or `..` component and no trailing
/// slash (so `normalize_abs` would return it unchanged).
pub fn is_normal_abs(path: &[u8]) -> bool {
    if path == b"/" {
        return true;
    }
    if path.first() != Some(&b'/') || path.last() == Some(&b'/') {
        return false;
    }
    path[1..]
        .split(|&b| b == b'/')
        .all(|c| !c.is_empty() && c != b"." && c != b"..")
}

/// The part of `abs` below `mount` (both normalised), or None when `abs` is outside.
pub fn strip_mount<'a>(mount: &[u8], abs: &'a [u8]) -> Option<&'a [u8]> {
    let m = if mount == b"/" { &b""[..] } else { mount };
    if abs == m || (m.is_empty() && abs == b"/") {
        return Some(b"");
    }
    if abs.len() > m.len() && abs.starts_with(m) && abs[m.len()] == b'/' {
        return Some(&abs[m.len() + 1..]);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_paths_are_recognised() {
        for p in [&b"/"[..], b"/a", b"/a/b.c/..d"] {
            assert!(is_normal_abs(p), "{p:?}");
            assert_eq!(normalize_abs(p), p);
        }
        for p in [&b""[..], b"a", b"/a/", b"//a", b"/a/./b", b"/a/..", b"/."] {
            assert!(!is_normal_abs(p), "{p:?}");
        }
        assert_eq!(normalized(b"/a/../b/".to_vec()), b"/b");
    }

    #[test]
    fn normalises_dots_and_slashes() {
        assert_eq!(normalize_abs(b"/a//b/./c/../d/"), b"/a/b/d");
        assert_eq!(normalize_abs(b"/../.."), b"/");
        assert_eq!(normalize_abs(b"/"), b"/");
    }

    #[test]
    fn strips_mount_prefix_only_at_component_boundary() {
        assert_eq!(strip_mount(b"/p", b"/p"), Some(&b""[..]));
        assert_eq!(strip_mount(b"/p", b"/p/x/y"), Some(&b"x/y"[..]));
        assert_eq!(strip_mount(b"/p", b"/px"), None);
        assert_eq!(strip_mount(b"/", b"/x"), Some(&b"x"[..]));
    }
}
