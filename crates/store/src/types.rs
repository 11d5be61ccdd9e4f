//! Plain value types shared by every face (FUSE, NFS, CLI): attributes, entries, handles.

use std::ffi::OsString;
use std::time::SystemTime;

/// A kaiso inode number. Stable across remounts and across moves between tiers.
pub type Ino = u64;

/// The root directory's inode number (the FUSE convention).
pub const ROOT_INO: Ino = 1;

/// An open file or directory handle, as returned by `open`, `create` and `opendir`.
pub type Fh = u64;

/// What kind of object an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// The kind encoded in a `st_mode` value.
    pub fn from_mode(mode: u32) -> FileKind {
        match mode & libc::S_IFMT {
            libc::S_IFDIR => FileKind::Dir,
            libc::S_IFLNK => FileKind::Symlink,
            libc::S_IFIFO => FileKind::Fifo,
            libc::S_IFSOCK => FileKind::Socket,
            libc::S_IFCHR => FileKind::CharDevice,
            libc::S_IFBLK => FileKind::BlockDevice,
            _ => FileKind::File,
        }
    }
}

/// Attributes of an inode, as `stat(2)` would report them through the mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileAttr {
    pub ino: Ino,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub kind: FileKind,
    /// Permission bits (including setuid/setgid/sticky), without the file-type bits.
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

/// Who asks: used for ownership of new inodes and for `access`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
}

impl Caller {
    /// The superuser (used by tests and operator commands).
    pub const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };
}

/// A time to set with `setattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    Now,
    At(SystemTime),
}

/// Changes requested by `setattr` (chmod, chown, truncate, utimens). `None` leaves a field.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (file-type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Truncate or extend to this size.
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    /// The handle the change was made through (ftruncate), if any.
    pub fh: Option<Fh>,
}

/// The result of `open`/`create`.
#[derive(Clone, Debug)]
pub struct Opened {
    pub fh: Fh,
    /// The backing file, when the face may hand it to the kernel for passthrough
    /// (resident file, non-emulated tier, passthrough enabled). The store keeps serving
    /// `read`/`write` on `fh` either way.
    pub passthrough: Option<std::sync::Arc<std::fs::File>>,
    /// Serve this handle without the kernel page cache (FUSE `FOPEN_DIRECT_IO`). The
    /// store does not ask for it at present: the kernel refuses a non-passthrough open,
    /// direct I/O included, while an inode has passthrough opens, so those opens are
    /// served through passthrough as well (see docs/tiering.md).
    pub direct_io: bool,
}

/// One directory entry from `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: Ino,
    /// Cookie to pass back to `readdir` to continue after this entry.
    pub offset: u64,
    pub kind: FileKind,
    pub name: OsString,
}

/// File system totals (`statfs`), summed over the tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatFs {
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub bsize: u32,
    pub namelen: u32,
    pub frsize: u32,
}

/// `rename` flags (renameat2).
pub mod rename_flags {
    pub const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
    pub const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
    pub const WHITEOUT: u32 = libc::RENAME_WHITEOUT;
}
