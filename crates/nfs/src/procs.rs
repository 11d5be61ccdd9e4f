//! The NFSv3 procedures the face answers itself instead of `nfs3_server`: LINK and MKNOD
//! (which the crate does not implement), MKDIR (the crate drops its attributes) and
//! ACCESS (the crate grants every bit; here the caller's permissions decide).

use crate::convert::{fattr, set_attr, wcc_attr};
use crate::fs::{DirChange, KaisoNfs};
use crate::rpc::{self, CallHeader};
use kaiso_store::{FileAttr, FileKind, Ino};
use nfs3_server::nfs3_types::nfs3::{
    ACCESS3args, ACCESS3res, ACCESS3resfail, ACCESS3resok, LINK3args, LINK3res, LINK3resfail,
    LINK3resok, MKDIR3args, MKDIR3res, MKDIR3resfail, MKDIR3resok, MKNOD3args, MKNOD3res,
    MKNOD3resfail, MKNOD3resok, Nfs3Option, Nfs3Result, mknoddata3, nfs_fh3, nfsstat3,
    post_op_attr, post_op_fh3, specdata3, wcc_data,
};
use nfs3_server::nfs3_types::rpc::accept_stat_data;
use nfs3_server::nfs3_types::xdr_codec::Opaque;

/// NFS program number and the procedures answered here (RFC 1813).
pub const NFS_PROGRAM: u32 = 100_003;
pub const PROC_ACCESS: u32 = 4;
pub const PROC_MKDIR: u32 = 9;
pub const PROC_MKNOD: u32 = 11;
pub const PROC_LINK: u32 = 15;

/// Whether this call is answered here rather than by `nfs3_server`.
pub fn is_own(h: &CallHeader) -> bool {
    h.prog == NFS_PROGRAM
        && h.vers == 3
        && matches!(h.proc_, PROC_ACCESS | PROC_MKDIR | PROC_MKNOD | PROC_LINK)
}

/// NFS file handles as `nfs3_server` makes them: its 8-byte generation, then the 8-byte
/// kaiso inode number (`FileHandleU64`, native byte order).
#[derive(Clone, Copy, Debug)]
pub struct Handles {
    prefix: [u8; 8],
}

impl Handles {
    /// From the root handle the crate issues (its first 8 bytes are the generation).
    pub fn from_root(root: &nfs_fh3) -> Handles {
        let mut prefix = [0u8; 8];
        let n = root.data.len().min(8);
        prefix[..n].copy_from_slice(&root.data[..n]);
        Handles { prefix }
    }

    pub fn ino(&self, fh: &nfs_fh3) -> Result<Ino, nfsstat3> {
        let d: &[u8] = &fh.data;
        if d.len() < 8 {
            return Err(nfsstat3::NFS3ERR_BADHANDLE);
        }
        if d[..8] != self.prefix {
            let generation = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0xff; 8]));
            // An older server's handle is stale; anything else is not ours.
            return Err(if generation(&d[..8]) < generation(&self.prefix) {
                nfsstat3::NFS3ERR_STALE
            } else {
                nfsstat3::NFS3ERR_BADHANDLE
            });
        }
        let id: [u8; 8] = d[8..].try_into().map_err(|_| nfsstat3::NFS3ERR_BADHANDLE)?;
        Ok(u64::from_ne_bytes(id))
    }

    pub fn fh(&self, ino: Ino) -> nfs_fh3 {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&self.prefix);
        v.extend_from_slice(&ino.to_ne_bytes());
        nfs_fh3 {
            data: Opaque::owned(v),
        }
    }
}

fn post(a: Option<FileAttr>) -> Nfs3Option<nfs3_server::nfs3_types::nfs3::fattr3> {
    match a {
        Some(a) => Nfs3Option::Some(fattr(&a)),
        None => Nfs3Option::None,
    }
}

fn wcc<T>(c: &DirChange<T>) -> wcc_data {
    wcc_data {
        before: match &c.before {
            Some(a) => Nfs3Option::Some(wcc_attr(a)),
            None => Nfs3Option::None,
        },
        after: post(c.after),
    }
}

/// The reply parts of a call that makes an object in a directory (MKDIR, MKNOD): its
/// handle, its attributes and the directory's wcc data, or the status and that wcc data.
fn made(
    handles: &Handles,
    r: Result<DirChange<FileAttr>, nfsstat3>,
) -> Nfs3Result<(post_op_fh3, post_op_attr, wcc_data), wcc_data> {
    let c = match r {
        Ok(c) => c,
        Err(e) => return Nfs3Result::Err((e, wcc_data::default())),
    };
    match &c.result {
        Ok(obj) => Nfs3Result::Ok((
            Nfs3Option::Some(handles.fh(obj.ino)),
            Nfs3Option::Some(fattr(obj)),
            wcc(&c),
        )),
        Err(e) => Nfs3Result::Err((*e, wcc(&c))),
    }
}

/// Answer one of the [`is_own`] calls as `fs` (which acts for the caller). Returns the
/// framed reply.
pub async fn answer(fs: &KaisoNfs, handles: &Handles, h: &CallHeader, rec: &[u8]) -> Vec<u8> {
    let xid = h.xid;
    let garbage = || rpc::accept_error(xid, accept_stat_data::GARBAGE_ARGS);
    match h.proc_ {
        PROC_ACCESS => {
            let Some(a) = rpc::args::<ACCESS3args>(rec, h.args_at) else {
                return garbage();
            };
            let r = match handles.ino(&a.object) {
                Ok(ino) => fs.access(ino, a.access).await,
                Err(e) => Err(e),
            };
            let res = match r {
                Ok((attr, bits)) => ACCESS3res::Ok(ACCESS3resok {
                    obj_attributes: Nfs3Option::Some(fattr(&attr)),
                    access: bits,
                }),
                Err(e) => ACCESS3res::Err((e, ACCESS3resfail::default())),
            };
            rpc::success(xid, &res)
        }
        PROC_MKDIR => {
            let Some(a) = rpc::args::<MKDIR3args<'static>>(rec, h.args_at) else {
                return garbage();
            };
            let r = match handles.ino(&a.where_.dir) {
                Ok(dir) => {
                    fs.mkdir_change(dir, &a.where_.name, set_attr(&a.attributes))
                        .await
                }
                Err(e) => Err(e),
            };
            let res = match made(handles, r) {
                Nfs3Result::Ok((obj, obj_attributes, dir_wcc)) => MKDIR3res::Ok(MKDIR3resok {
                    obj,
                    obj_attributes,
                    dir_wcc,
                }),
                Nfs3Result::Err((e, dir_wcc)) => MKDIR3res::Err((e, MKDIR3resfail { dir_wcc })),
            };
            rpc::success(xid, &res)
        }
        PROC_MKNOD => {
            let Some(a) = rpc::args::<MKNOD3args<'static>>(rec, h.args_at) else {
                return garbage();
            };
            let dev = |s: &specdata3| libc::makedev(s.specdata1, s.specdata2);
            let (kind, rdev, attrs) = match &a.what {
                mknoddata3::NF3CHR(d) => (FileKind::CharDevice, dev(&d.spec), &d.dev_attributes),
                mknoddata3::NF3BLK(d) => (FileKind::BlockDevice, dev(&d.spec), &d.dev_attributes),
                mknoddata3::NF3SOCK(s) => (FileKind::Socket, 0, s),
                mknoddata3::NF3FIFO(s) => (FileKind::Fifo, 0, s),
                mknoddata3::default => {
                    let res = MKNOD3res::Err((
                        nfsstat3::NFS3ERR_BADTYPE,
                        MKNOD3resfail {
                            dir_wcc: wcc_data::default(),
                        },
                    ));
                    return rpc::success(xid, &res);
                }
            };
            let r = match handles.ino(&a.where_.dir) {
                Ok(dir) => {
                    fs.mknod(dir, &a.where_.name, kind, rdev, set_attr(attrs))
                        .await
                }
                Err(e) => Err(e),
            };
            let res = match made(handles, r) {
                Nfs3Result::Ok((obj, obj_attributes, dir_wcc)) => MKNOD3res::Ok(MKNOD3resok {
                    obj,
                    obj_attributes,
                    dir_wcc,
                }),
                Nfs3Result::Err((e, dir_wcc)) => MKNOD3res::Err((e, MKNOD3resfail { dir_wcc })),
            };
            rpc::success(xid, &res)
        }
        PROC_LINK => {
            let Some(a) = rpc::args::<LINK3args<'static>>(rec, h.args_at) else {
                return garbage();
            };
            let r = match (handles.ino(&a.file), handles.ino(&a.link.dir)) {
                (Ok(ino), Ok(dir)) => fs.link(ino, dir, &a.link.name).await,
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            let res = match r {
                Ok(c) => match &c.result {
                    Ok(obj) => LINK3res::Ok(LINK3resok {
                        file_attributes: Nfs3Option::Some(fattr(obj)),
                        linkdir_wcc: wcc(&c),
                    }),
                    Err(e) => LINK3res::Err((
                        *e,
                        LINK3resfail {
                            file_attributes: Nfs3Option::None,
                            linkdir_wcc: wcc(&c),
                        },
                    )),
                },
                Err(e) => LINK3res::Err((
                    e,
                    LINK3resfail {
                        file_attributes: Nfs3Option::None,
                        linkdir_wcc: wcc_data::default(),
                    },
                )),
            };
            rpc::success(xid, &res)
        }
        _ => rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_foreign_ones() {
        let gen_now = 1_000u64.to_le_bytes();
        let mut root = gen_now.to_vec();
        root.extend_from_slice(&1u64.to_ne_bytes());
        let h = Handles::from_root(&nfs_fh3 {
            data: Opaque::owned(root),
        });
        assert_eq!(h.ino(&h.fh(42)), Ok(42));
        let with = |g: u64, tail: &[u8]| {
            let mut v = g.to_le_bytes().to_vec();
            v.extend_from_slice(tail);
            nfs_fh3 {
                data: Opaque::owned(v),
            }
        };
        assert_eq!(
            h.ino(&with(999, &7u64.to_ne_bytes())),
            Err(nfsstat3::NFS3ERR_STALE)
        );
        assert_eq!(
            h.ino(&with(1001, &7u64.to_ne_bytes())),
            Err(nfsstat3::NFS3ERR_BADHANDLE)
        );
        assert_eq!(
            h.ino(&with(1000, &[1, 2])),
            Err(nfsstat3::NFS3ERR_BADHANDLE)
        );
        assert_eq!(
            h.ino(&nfs_fh3 {
                data: Opaque::owned(vec![1])
            }),
            Err(nfsstat3::NFS3ERR_BADHANDLE)
        );
    }
}
