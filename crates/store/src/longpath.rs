//! Backing paths of any length.
//!
//! The kernel refuses a path argument of PATH_MAX (4096) bytes or more with ENAMETOOLONG,
//! although a file system holds trees of any depth. A backing path that short is used as
//! it is (one syscall, as before). A longer one is walked with `openat` from the tier root
//! in chunks of up to PATH_MAX bytes (one syscall per chunk, many components each) to an
//! `O_PATH` descriptor of a deep ancestor, and presented as `/proc/self/fd/N/suffix`: every
//! path-taking call (stat, open, rename, link, xattrs, utimensat, ...) then resolves it
//! relative to that directory. The descriptor lives as long as the [`BackingPath`] (and its
//! clones and joins), so the path must not be copied out of it: the type derefs to `&Path`
//! for calls, while `join`, `parent` and `to_path_buf` return guards again.

use std::ffi::CString;
use std::fmt;
use std::ops::Deref;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Longest path argument the kernel takes (PATH_MAX less the terminating NUL).
pub(crate) const PATH_ARG_MAX: usize = 4095;

/// Longest suffix after `/proc/self/fd/N/` (N has at most 10 digits).
const SUFFIX_MAX: usize = PATH_ARG_MAX - 32;

/// A backing path valid while this value lives; see the module comment.
#[derive(Clone)]
pub(crate) struct BackingPath {
    path: PathBuf,
    /// The directory `path` is relative to when it is a `/proc/self/fd/N/...` path.
    anchor: Option<Arc<OwnedFd>>,
    /// The walk stopped early at a component that is not there (or not a directory, or
    /// not searchable): `path` then names that component and a few below it only, so
    /// every use fails as the full path would, but creating it makes only the top of it.
    partial: bool,
}

impl BackingPath {
    /// `base` joined with the relative `rel`, walked when the result is too long for one
    /// path argument. `base` must itself be short (a tier root).
    pub(crate) fn resolve(base: &Path, rel: &Path) -> BackingPath {
        if rel.as_os_str().is_empty() {
            return BackingPath::from(base.to_path_buf());
        }
        let full = base.join(rel);
        if full.as_os_str().len() <= PATH_ARG_MAX || base.as_os_str().len() > PATH_ARG_MAX {
            // Short (the common case), or nothing a walk could help: the kernel says why.
            return BackingPath::from(full);
        }
        walk(base, rel).unwrap_or_else(|| BackingPath::from(full))
    }

    /// This path joined with `p` (a guard again: the anchor stays alive).
    pub(crate) fn join(&self, p: impl AsRef<Path>) -> BackingPath {
        let p = p.as_ref();
        let joined = self.path.join(p);
        if joined.as_os_str().len() <= PATH_ARG_MAX || self.partial {
            return BackingPath {
                path: joined,
                anchor: self.anchor.clone(),
                partial: self.partial,
            };
        }
        // Too long again: walk on from this (short) path; the walk holds its own anchor.
        BackingPath::resolve(&self.path, p)
    }

    /// The parent directory (the anchor itself, as `/proc/self/fd/N/.`, when this path is
    /// one component below it: the bare `/proc/self/fd/N` is a symlink to `lstat`).
    #[allow(dead_code)] // shadows `Path::parent` for callers: see above
    pub(crate) fn parent(&self) -> Option<BackingPath> {
        let parent = self.path.parent()?;
        let path = match &self.anchor {
            Some(fd) if parent == fd_dir(fd) => parent.join("."),
            _ => parent.to_path_buf(),
        };
        Some(BackingPath {
            path,
            anchor: self.anchor.clone(),
            partial: false,
        })
    }

    /// Another guard for the same path (never a bare `PathBuf`: it would outlive the
    /// descriptor the path goes through).
    #[allow(dead_code)] // shadows `Path::to_path_buf`, so a copy keeps the descriptor
    pub(crate) fn to_path_buf(&self) -> BackingPath {
        self.clone()
    }

    /// Whether the path goes through a descriptor (the full path was too long).
    #[cfg(test)]
    pub(crate) fn is_anchored(&self) -> bool {
        self.anchor.is_some()
    }

    /// Whether the walk stopped at a missing (or unusable) ancestor.
    pub(crate) fn is_partial(&self) -> bool {
        self.partial
    }
}

impl From<PathBuf> for BackingPath {
    /// A plain path (no descriptor behind it).
    fn from(path: PathBuf) -> BackingPath {
        BackingPath {
            path,
            anchor: None,
            partial: false,
        }
    }
}

impl Deref for BackingPath {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for BackingPath {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl fmt::Debug for BackingPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.path.fmt(f)
    }
}

/// `/proc/self/fd/N` of a descriptor.
fn fd_dir(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// `open(O_PATH | O_DIRECTORY)` of `path` relative to `dir` (or the current directory).
fn open_dir(dir: Option<&OwnedFd>, path: &[u8]) -> Option<OwnedFd> {
    let c = CString::new(path).ok()?;
    let at = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    let fd = unsafe {
        libc::openat(
            at,
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    // SAFETY: a descriptor just returned by openat, owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Bytes of components joined with `/`.
fn joined_len(comps: &[&[u8]]) -> usize {
    comps.iter().map(|c| c.len()).sum::<usize>() + comps.len().saturating_sub(1)
}

fn join_bytes(comps: &[&[u8]]) -> Vec<u8> {
    comps.join(&b'/')
}

/// Walk `rel` from `base` to a descriptor whose remaining suffix fits; None when the
/// base cannot be opened or a single component is longer than any path argument.
fn walk(base: &Path, rel: &Path) -> Option<BackingPath> {
    let comps: Vec<&[u8]> = rel
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.as_bytes()),
            Component::ParentDir => Some(b"..".as_slice()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    let mut dir = open_dir(None, base.as_os_str().as_bytes())?;
    let mut at = 0;
    let mut partial = false;
    while joined_len(&comps[at..]) > SUFFIX_MAX {
        // The longest run of whole components that fits one argument, leaving the last.
        let mut end = at;
        while end + 1 < comps.len() && joined_len(&comps[at..end + 1]) <= PATH_ARG_MAX {
            end += 1;
        }
        if end == at {
            return None;
        }
        if let Some(next) = open_dir(Some(&dir), &join_bytes(&comps[at..end])) {
            dir = next;
            at = end;
            continue;
        }
        // Something in this run is missing: go one component at a time to the deepest
        // directory there is; the path then stops just below the first missing name.
        while at < end {
            match open_dir(Some(&dir), comps[at]) {
                Some(next) => {
                    dir = next;
                    at += 1;
                }
                None => break,
            }
        }
        if at < end {
            partial = true;
            break;
        }
    }
    let mut rest = comps.len();
    if partial {
        // Keep the missing name and at least one below it (so it is never the leaf).
        rest = at + 1;
        while rest < comps.len()
            && (rest == at + 1 || joined_len(&comps[at..rest + 1]) <= SUFFIX_MAX)
        {
            rest += 1;
        }
    }
    let mut path = fd_dir(&dir).into_os_string().into_vec();
    path.push(b'/');
    path.extend_from_slice(&join_bytes(&comps[at..rest]));
    Some(BackingPath {
        path: PathBuf::from(std::ffi::OsString::from_vec(path)),
        anchor: Some(Arc::new(dir)),
        partial,
    })
}

/// `mkdir -p` of `base/rel` for any length of `rel` (each pass creates what one walk
/// reaches, then walks again).
pub(crate) fn create_dir_all(base: &Path, rel: &Path) -> std::io::Result<()> {
    // Each pass gets at least one component further; bound the passes all the same.
    for _ in 0..=rel.components().count() {
        let p = BackingPath::resolve(base, rel);
        std::fs::create_dir_all(&p)?;
        if !p.is_partial() {
            return Ok(());
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// `depth` components of 200 bytes each, the i-th made of one letter.
    fn deep_rel(depth: usize) -> PathBuf {
        (0..depth)
            .map(|i| std::iter::repeat_n((b'a' + (i % 26) as u8) as char, 200).collect::<String>())
            .collect()
    }

    #[test]
    fn short_paths_are_plain_joins() {
        let p = BackingPath::resolve(Path::new("/t"), Path::new("a/b"));
        assert_eq!(&*p, Path::new("/t/a/b"));
        assert!(!p.is_anchored() && !p.is_partial());
        assert_eq!(
            &*BackingPath::resolve(Path::new("/t"), Path::new("")),
            Path::new("/t")
        );
        assert_eq!(&*p.join("c"), Path::new("/t/a/b/c"));
        assert_eq!(&*p.parent().unwrap(), Path::new("/t/a"));
    }

    #[test]
    fn a_deep_tree_is_reached_through_a_descriptor() {
        let d = tempfile::tempdir().unwrap();
        let rel = deep_rel(30);
        create_dir_all(d.path(), &rel).unwrap();
        let leaf = rel.join("leaf");
        let p = BackingPath::resolve(d.path(), &leaf);
        assert!(p.is_anchored() && !p.is_partial(), "{p:?}");
        assert!(p.as_os_str().len() <= PATH_ARG_MAX);
        std::fs::write(&p, b"deep").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"deep");
        // The same file as reached by walking one level at a time.
        let mut dir = std::fs::File::open(d.path()).unwrap();
        for c in rel.components() {
            let next = BackingPath::resolve(
                Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())),
                Path::new(c.as_os_str()),
            );
            dir = std::fs::File::open(&next).unwrap();
        }
        let step = std::fs::symlink_metadata(
            Path::new(&format!("/proc/self/fd/{}", dir.as_raw_fd())).join("leaf"),
        )
        .unwrap();
        assert_eq!(std::fs::symlink_metadata(&p).unwrap().ino(), step.ino());
        // Parents and joins keep working past the point the path was cut.
        let parent = p.parent().unwrap();
        assert_eq!(
            std::fs::symlink_metadata(&parent).unwrap().ino(),
            dir.metadata().unwrap().ino()
        );
        let again = parent.join("leaf");
        assert_eq!(std::fs::read(&again).unwrap(), b"deep");
        // A join that makes the suffix too long walks on.
        let deeper = p.parent().unwrap().join(deep_rel(25));
        std::fs::create_dir_all(&deeper).ok();
        assert!(deeper.as_os_str().len() <= PATH_ARG_MAX);
    }

    #[test]
    fn missing_ancestors_fail_as_the_full_path_would() {
        let d = tempfile::tempdir().unwrap();
        let rel = deep_rel(30);
        // Only the first 10 levels exist: the walk stops there.
        create_dir_all(d.path(), &deep_rel(10)).unwrap();
        let p = BackingPath::resolve(d.path(), &rel.join("leaf"));
        assert!(p.is_partial(), "{p:?}");
        let e = std::fs::symlink_metadata(&p).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(
            std::fs::write(&p, b"x").unwrap_err().raw_os_error(),
            Some(libc::ENOENT)
        );
        // A file where a directory should be: ENOTDIR, as with a short path.
        let half = deep_rel(25);
        create_dir_all(d.path(), half.parent().unwrap()).unwrap();
        std::fs::write(BackingPath::resolve(d.path(), &half), b"f").unwrap();
        let under = BackingPath::resolve(d.path(), &half.join(deep_rel(3)));
        assert_eq!(
            std::fs::symlink_metadata(&under)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOTDIR)
        );
        assert!(create_dir_all(d.path(), &half.join("y")).is_err());
    }

    #[test]
    fn the_descriptor_lives_as_long_as_the_guard_and_its_copies() {
        let d = tempfile::tempdir().unwrap();
        let rel = deep_rel(25);
        create_dir_all(d.path(), &rel).unwrap();
        let p = BackingPath::resolve(d.path(), &rel.join("f"));
        let copy = p.to_path_buf();
        let joined = BackingPath::resolve(d.path(), &rel).join("f");
        drop(p);
        std::fs::write(&copy, b"1").unwrap();
        assert_eq!(std::fs::read(&joined).unwrap(), b"1");
    }
}
