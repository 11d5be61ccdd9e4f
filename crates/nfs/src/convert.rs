//! Store values ↔ NFSv3 values: errno → nfsstat3, FileAttr → fattr3, sattr3 → SetAttr.

use kaiso_store::{FileAttr, FileKind, FsError, SetAttr, TimeSet};
use nfs3_server::nfs3_types::nfs3::{
    Nfs3Option, fattr3, ftype3, nfsstat3, nfstime3, sattr3, set_atime, set_mtime, specdata3,
    wcc_attr,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The NFSv3 status for a store errno (RFC 1813 §2.6).
pub fn status(e: FsError) -> nfsstat3 {
    match e.errno() {
        libc::EPERM => nfsstat3::NFS3ERR_PERM,
        libc::ENOENT => nfsstat3::NFS3ERR_NOENT,
        libc::ENXIO => nfsstat3::NFS3ERR_NXIO,
        libc::EACCES => nfsstat3::NFS3ERR_ACCES,
        libc::EEXIST => nfsstat3::NFS3ERR_EXIST,
        libc::EXDEV => nfsstat3::NFS3ERR_XDEV,
        libc::ENODEV => nfsstat3::NFS3ERR_NODEV,
        libc::ENOTDIR => nfsstat3::NFS3ERR_NOTDIR,
        libc::EISDIR => nfsstat3::NFS3ERR_ISDIR,
        libc::EINVAL => nfsstat3::NFS3ERR_INVAL,
        libc::EFBIG => nfsstat3::NFS3ERR_FBIG,
        libc::ENOSPC => nfsstat3::NFS3ERR_NOSPC,
        libc::EROFS => nfsstat3::NFS3ERR_ROFS,
        libc::EMLINK => nfsstat3::NFS3ERR_MLINK,
        libc::ENAMETOOLONG => nfsstat3::NFS3ERR_NAMETOOLONG,
        libc::ENOTEMPTY => nfsstat3::NFS3ERR_NOTEMPTY,
        libc::EDQUOT => nfsstat3::NFS3ERR_DQUOT,
        libc::ESTALE => nfsstat3::NFS3ERR_STALE,
        libc::EBADF => nfsstat3::NFS3ERR_BADHANDLE,
        libc::ENOTSUP | libc::ENOSYS => nfsstat3::NFS3ERR_NOTSUPP,
        // "Try again later": only after the face's own retries ran out (`fs::Retry`),
        // and turned into NFS3ERR_IO when JUKEBOX is off (`Jukebox::settle`).
        libc::EAGAIN | libc::EBUSY => nfsstat3::NFS3ERR_JUKEBOX,
        _ => nfsstat3::NFS3ERR_IO,
    }
}

fn time(t: SystemTime) -> nfstime3 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    nfstime3 {
        seconds: d.as_secs().min(u32::MAX as u64) as u32,
        nseconds: d.subsec_nanos(),
    }
}

fn system_time(t: nfstime3) -> SystemTime {
    UNIX_EPOCH + Duration::new(t.seconds as u64, t.nseconds.min(999_999_999))
}

/// Attributes as NFSv3 reports them. `fsid` is fixed: the export is one file system.
pub fn fattr(a: &FileAttr) -> fattr3 {
    let type_ = match a.kind {
        FileKind::File => ftype3::NF3REG,
        FileKind::Dir => ftype3::NF3DIR,
        FileKind::Symlink => ftype3::NF3LNK,
        FileKind::Fifo => ftype3::NF3FIFO,
        FileKind::Socket => ftype3::NF3SOCK,
        FileKind::CharDevice => ftype3::NF3CHR,
        FileKind::BlockDevice => ftype3::NF3BLK,
    };
    let rdev = a.rdev as u64;
    fattr3 {
        type_,
        mode: a.perm as u32,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.blocks * 512,
        rdev: specdata3 {
            specdata1: (((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff)) as u32,
            specdata2: ((rdev & 0xff) | ((rdev >> 12) & !0xff)) as u32,
        },
        fsid: 0x6b61_6973_6f00_0001,
        fileid: a.ino,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

/// The pre-operation attributes of weak cache consistency data (RFC 1813 §2.6).
pub fn wcc_attr(a: &FileAttr) -> wcc_attr {
    wcc_attr {
        size: a.size,
        mtime: time(a.mtime),
        ctime: time(a.ctime),
    }
}

/// The store change a SETATTR (or the attributes of CREATE/MKDIR) asks for.
pub fn set_attr(s: &sattr3) -> SetAttr {
    let opt = |o: &Nfs3Option<u32>| match o {
        Nfs3Option::Some(v) => Some(*v),
        Nfs3Option::None => None,
    };
    SetAttr {
        mode: opt(&s.mode),
        uid: opt(&s.uid),
        gid: opt(&s.gid),
        size: match s.size {
            Nfs3Option::Some(v) => Some(v),
            Nfs3Option::None => None,
        },
        atime: match s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(TimeSet::Now),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(TimeSet::At(system_time(t))),
        },
        mtime: match s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(TimeSet::Now),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(TimeSet::At(system_time(t))),
        },
        fh: None,
    }
}

/// Whether a SetAttr changes anything.
pub fn is_empty(s: &SetAttr) -> bool {
    *s == SetAttr::default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(status(FsError::NOENT), nfsstat3::NFS3ERR_NOENT);
        assert_eq!(status(FsError::NOTEMPTY), nfsstat3::NFS3ERR_NOTEMPTY);
        assert_eq!(status(FsError::NOSPC), nfsstat3::NFS3ERR_NOSPC);
        assert_eq!(status(FsError::ACCES), nfsstat3::NFS3ERR_ACCES);
        assert_eq!(status(FsError(libc::ENOSYS)), nfsstat3::NFS3ERR_NOTSUPP);
        assert_eq!(status(FsError(libc::EILSEQ)), nfsstat3::NFS3ERR_IO);
    }

    #[test]
    fn sattr_roundtrip() {
        let s = sattr3 {
            mode: Nfs3Option::Some(0o640),
            size: Nfs3Option::Some(7),
            mtime: set_mtime::SET_TO_CLIENT_TIME(nfstime3 {
                seconds: 100,
                nseconds: 5,
            }),
            ..Default::default()
        };
        let a = set_attr(&s);
        assert_eq!(a.mode, Some(0o640));
        assert_eq!(a.size, Some(7));
        assert_eq!(a.uid, None);
        assert_eq!(
            a.mtime,
            Some(TimeSet::At(UNIX_EPOCH + Duration::new(100, 5)))
        );
        assert!(is_empty(&set_attr(&sattr3::default())));
    }
}
