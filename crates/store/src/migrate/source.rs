//! The read-only view of an old file server that post-copy migration pulls from.
//!
//! The store holds a `Box<dyn Source>` per migrated share and never knows which protocol
//! is behind it: implementations (POSIX path, NFSv3, SMB 2/3) live in `kaiso-source`.
//! Every call is synchronous and may be made from many threads at once; an implementation
//! that talks to a server keeps several requests in flight across those callers.
//!
//! Paths are [`SourcePath`]s: byte strings relative to the share root, so names that are
//! not valid UTF-8 round-trip unchanged wherever the protocol carries bytes.

use std::fmt;

/// A path inside the source share, relative to its root, as raw bytes.
///
/// The root is the empty path. Components are joined with `/`; a component never contains
/// `/` or NUL and is never `.` or `..` (enforced by [`SourcePath::join`]).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourcePath(Vec<u8>);

impl SourcePath {
    /// The share root.
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// Parses a relative path such as `a/b/c` (leading/trailing/double slashes ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, SourceError> {
        let mut path = Self::root();
        for component in bytes.split(|b| *b == b'/').filter(|c| !c.is_empty()) {
            path = path.join(component)?;
        }
        Ok(path)
    }

    /// The child `name` of this directory path.
    pub fn join(&self, name: &[u8]) -> Result<Self, SourceError> {
        if name.is_empty()
            || name == b"."
            || name == b".."
            || name.contains(&b'/')
            || name.contains(&0)
        {
            return Err(SourceError::new(
                SourceErrorKind::Invalid,
                self,
                format!("invalid entry name {:?}", String::from_utf8_lossy(name)),
            ));
        }
        let mut bytes = self.0.clone();
        if !bytes.is_empty() {
            bytes.push(b'/');
        }
        bytes.extend_from_slice(name);
        Ok(Self(bytes))
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The components from the root down.
    pub fn components(&self) -> impl Iterator<Item = &[u8]> {
        self.0.split(|b| *b == b'/').filter(|c| !c.is_empty())
    }

    /// The last component, or `None` for the root.
    pub fn file_name(&self) -> Option<&[u8]> {
        self.components().last()
    }

    /// The parent path, or `None` for the root.
    pub fn parent(&self) -> Option<Self> {
        if self.is_root() {
            return None;
        }
        match self.0.iter().rposition(|b| *b == b'/') {
            Some(i) => Some(Self(self.0[..i].to_vec())),
            None => Some(Self::root()),
        }
    }
}

impl fmt::Debug for SourcePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Display for SourcePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "/{}", String::from_utf8_lossy(&self.0))
    }
}

/// What kind of object an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    Regular,
    Directory,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

/// A point in time as seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

/// The attributes of one source object, as the protocol reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceAttr {
    pub kind: FileKind,
    /// Permission bits including set-uid/set-gid/sticky (`0o7777`). Synthesised from the
    /// DOS attributes where the protocol has no Unix mode (SMB).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    /// The source's inode number (NFS fileid, SMB FileId): the key of hard-link anchors.
    pub ino: u64,
    /// Major and minor device numbers of character and block devices.
    pub rdev: (u32, u32),
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Creation (birth) time where the protocol has one (SMB).
    pub btime: Option<Timestamp>,
    /// SMB/NTFS file attribute bits (`FILE_ATTRIBUTE_*`), where the protocol has them.
    pub dos_attributes: Option<u32>,
}

impl SourceAttr {
    /// An object of `kind` owned by root, with one link, the usual mode of its kind (0755
    /// for a directory, 0644 else), no device numbers and every time `time`: the base of
    /// synthesised attributes (`SourceAttr { nlink: 2, ..SourceAttr::plain(…) }`).
    pub fn plain(kind: FileKind, ino: u64, size: u64, time: Timestamp) -> SourceAttr {
        SourceAttr {
            kind,
            perm: if kind == FileKind::Directory {
                0o755
            } else {
                0o644
            },
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            ino,
            rdev: (0, 0),
            atime: time,
            mtime: time,
            ctime: time,
            btime: None,
            dos_attributes: None,
        }
    }
}

/// One directory entry with its attributes, READDIRPLUS style.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceEntry {
    pub name: Vec<u8>,
    pub attr: SourceAttr,
}

/// Access-control data in the protocol's own encoding, to be stored unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceAcl {
    /// The Linux `system.posix_acl_access` xattr value, if the object has an extended ACL.
    pub posix_access: Option<Vec<u8>>,
    /// The Linux `system.posix_acl_default` xattr value (directories).
    pub posix_default: Option<Vec<u8>>,
    /// A self-relative NT security descriptor (owner, group, DACL) as SMB returns it.
    pub nt_security_descriptor: Option<Vec<u8>>,
    /// The owner and group SIDs in `S-1-…` form, parsed from the descriptor.
    pub owner_sid: Option<String>,
    pub group_sid: Option<String>,
}

impl SourceAcl {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A named data stream besides the main one (NTFS alternate data stream).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceStream {
    /// The stream name without the leading `:` and the `:$DATA` suffix.
    pub name: String,
    pub size: u64,
}

/// What a source can provide beyond the basic attributes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SourceFeatures {
    /// uid/gid/mode are the server's own (NFS, POSIX) rather than synthesised (SMB).
    pub unix_ids: bool,
    /// Symlinks are visible as symlinks (otherwise the server follows them).
    pub symlinks: bool,
    /// FIFOs, sockets and devices are visible as such.
    pub special_files: bool,
    /// Extended attributes can be listed.
    pub xattrs: bool,
    /// ACLs can be read (see [`SourceAcl`] for which encoding).
    pub acls: bool,
    /// Alternate data streams can be listed and read.
    pub streams: bool,
    /// Names are raw bytes (otherwise they are UTF-16 on the wire and always valid UTF-8).
    pub byte_names: bool,
}

/// Why a source operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SourceErrorKind {
    NotFound,
    PermissionDenied,
    /// The server could not be reached or the connection broke.
    Unreachable,
    /// The operation makes no sense for this object (e.g. read of a directory).
    WrongKind,
    /// The protocol or server does not offer this operation.
    Unsupported,
    /// Bad input: an invalid name or path.
    Invalid,
    /// The source changed under us although it should be read-only.
    Changed,
    /// Any other I/O or protocol failure.
    Io,
}

/// A failed source operation: what kind, on which path, and the server's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    pub kind: SourceErrorKind,
    pub path: SourcePath,
    pub message: String,
}

impl SourceError {
    pub fn new(kind: SourceErrorKind, path: &SourcePath, message: impl Into<String>) -> Self {
        Self {
            kind,
            path: path.clone(),
            message: message.into(),
        }
    }
}

impl fmt::Display for SourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} at {}: {}", self.kind, self.path, self.message)
    }
}

impl std::error::Error for SourceError {}

pub type SourceResult<T> = Result<T, SourceError>;

/// A read-only view of one share of an old file server.
pub trait Source: Send + Sync {
    /// A human-readable location, e.g. `nfs://127.0.0.1:2049/export`.
    fn describe(&self) -> String;

    /// A stable identity of the source's root, independent of the address it is reached
    /// at (a share re-pointed at its source under another address is accepted when both
    /// identities are known and equal). `None`: unknown (the address must not change).
    fn identity(&self) -> Option<String> {
        None
    }

    fn features(&self) -> SourceFeatures;

    /// Attributes of the object at `path` (symlinks are not followed).
    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr>;

    /// All entries of the directory at `path` with their attributes, without `.` and `..`,
    /// in the server's order.
    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>>;

    /// Like [`Source::read_dir`], plus the directory's own attributes as they were after
    /// the listing when the protocol returns them without another round trip (NFSv3
    /// READDIRPLUS post-op attributes, `fstat` of the descriptor just listed): the engine
    /// restores the directory's times from them instead of a `stat` per directory, which
    /// sat on the critical path of every level of a deep tree. Default: `read_dir` and
    /// no attributes (the engine then calls `stat`).
    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        Ok((self.read_dir(path)?, None))
    }

    /// Up to `len` bytes of the regular file at `path` from `offset`. Fewer bytes are
    /// returned only at end of file.
    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>>;

    /// Like [`Source::read`], plus the file's attributes as they were right after the
    /// read when the protocol returns them without another round trip (NFSv3 post-op
    /// attributes, `fstat` of the descriptor just read). The engine compares them with
    /// the listing to tell whether the source changed under the copy, instead of a
    /// separate `stat` per file. Default: `read` and no attributes.
    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        Ok((self.read(path, offset, len)?, None))
    }

    /// Like [`Source::read_with_attr`], into the caller's buffer: reads `buf.len()` bytes
    /// from `offset` (fewer only at end of file) and returns how many. The engine reuses
    /// its unit buffers, so a 10 MiB unit costs no allocation and, where the
    /// implementation reads straight into `buf`, no extra copy. Default: `read_with_attr`
    /// and a copy.
    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        let (data, attr) = self.read_with_attr(path, offset, buf.len())?;
        let n = data.len().min(buf.len());
        buf[..n].copy_from_slice(&data[..n]);
        Ok((n, attr))
    }

    /// The target of the symlink at `path`, as bytes.
    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>>;

    /// Extended attributes (name, value), excluding ACLs which [`Source::acl`] returns.
    /// Empty when the protocol has none.
    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Access-control data; empty when the object has none beyond its mode bits.
    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl>;

    /// Alternate data streams of the file at `path`; empty when the protocol has none.
    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>>;

    /// Up to `len` bytes of the alternate data stream `stream` from `offset`.
    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_parent_and_components_round_trip_bytes() {
        let p = SourcePath::root()
            .join(b"a")
            .unwrap()
            .join(b"\xff\xfe")
            .unwrap();
        assert_eq!(p.as_bytes(), b"a/\xff\xfe");
        assert_eq!(p.file_name(), Some(&b"\xff\xfe"[..]));
        assert_eq!(p.parent().unwrap().as_bytes(), b"a");
        assert_eq!(p.parent().unwrap().parent(), Some(SourcePath::root()));
        assert_eq!(SourcePath::root().parent(), None);
        assert_eq!(p.components().count(), 2);
        assert_eq!(SourcePath::parse(b"/a//\xff\xfe/").unwrap(), p);
    }

    #[test]
    fn join_rejects_bad_names() {
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            let e = SourcePath::root().join(bad).unwrap_err();
            assert_eq!(e.kind, SourceErrorKind::Invalid);
        }
        assert!(SourcePath::parse(b"a/../b").is_err());
    }
}
