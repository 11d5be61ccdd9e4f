//! Who is calling: the AUTH_SYS credential of an RPC after squashing (exports(5)
//! `root_squash`/`all_squash`), and the POSIX permission checks the face makes with it.
//!
//! The store trusts its faces (the FUSE face lets the kernel check permissions), so the
//! NFS face checks every operation against the caller itself, as knfsd does: mode bits,
//! POSIX access ACLs (`system.posix_acl_access`) where a file has one, the owner override
//! for READ/WRITE of one's own file, the sticky bit, the chown/chmod rules of setattr(2)
//! and Linux's protected hard links.

use crate::allow::AllowList;
use kaiso_store::{Caller, FileAttr, FileKind, SetAttr, TimeSet};
use nfs3_server::nfs3_types::nfs3::{
    ACCESS3_DELETE, ACCESS3_EXECUTE, ACCESS3_EXTEND, ACCESS3_LOOKUP, ACCESS3_MODIFY, ACCESS3_READ,
    nfsstat3,
};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The conventional anonymous user and group (`nobody`/`nogroup`).
pub const NOBODY: u32 = 65534;
/// AUTH_SYS carries at most 16 supplementary groups (RFC 5531, appendix A).
const MAX_GROUPS: usize = 16;

/// Permission bits as in a mode's "other" triple.
pub const R: u32 = 4;
pub const W: u32 = 2;
pub const X: u32 = 1;

/// Which callers are mapped to the anonymous user (exports(5)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Squash {
    /// `no_root_squash`: every credential is taken as sent.
    None,
    /// `root_squash`: uid 0 and gid 0 become the anonymous ids (except for clients in
    /// [`Identity::root_trusted`]).
    Root,
    /// `all_squash`: every caller is the anonymous user.
    All,
}

impl FromStr for Squash {
    type Err = String;
    fn from_str(s: &str) -> Result<Squash, String> {
        match s.trim() {
            "none" | "no_root_squash" => Ok(Squash::None),
            "root" | "root_squash" => Ok(Squash::Root),
            "all" | "all_squash" => Ok(Squash::All),
            _ => Err(format!(
                "bad squash mode {s:?}: expected none, root or all (no_root_squash, root_squash, all_squash)"
            )),
        }
    }
}

impl fmt::Display for Squash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Squash::None => "no_root_squash",
            Squash::Root => "root_squash",
            Squash::All => "all_squash",
        })
    }
}

/// How RPC credentials become the identity the face acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub squash: Squash,
    /// Clients whose root is not squashed by [`Squash::Root`] (default: loopback, whose
    /// root is this host's root and can read the tier directories anyway).
    pub root_trusted: AllowList,
    /// The anonymous ids: AUTH_NULL callers and squashed callers act as these.
    pub anon_uid: u32,
    pub anon_gid: u32,
}

impl Default for Identity {
    fn default() -> Identity {
        Identity {
            squash: Squash::Root,
            root_trusted: AllowList::loopback(),
            anon_uid: NOBODY,
            anon_gid: NOBODY,
        }
    }
}

/// An AUTH_SYS credential as sent by the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysCred {
    pub uid: u32,
    pub gid: u32,
    pub gids: Vec<u32>,
}

/// A POSIX access ACL, as the `system.posix_acl_access` xattr holds it (Linux's
/// `posix_acl_xattr` format: version 2, then tag/perm/id entries, little-endian).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<(u16, u16, u32)>,
}

const ACL_USER_OBJ: u16 = 0x01;
const ACL_USER: u16 = 0x02;
const ACL_GROUP_OBJ: u16 = 0x04;
const ACL_GROUP: u16 = 0x08;
const ACL_MASK: u16 = 0x10;
const ACL_OTHER: u16 = 0x20;

impl Acl {
    /// The xattr's ACL; `None` if it is not in the version-2 format.
    pub fn parse(b: &[u8]) -> Option<Acl> {
        let (head, rest) = b.split_at_checked(4)?;
        if u32::from_le_bytes(head.try_into().ok()?) != 2 || rest.len() % 8 != 0 {
            return None;
        }
        let entries = rest
            .chunks_exact(8)
            .map(|e| {
                (
                    u16::from_le_bytes([e[0], e[1]]),
                    u16::from_le_bytes([e[2], e[3]]),
                    u32::from_le_bytes([e[4], e[5], e[6], e[7]]),
                )
            })
            .collect();
        Some(Acl { entries })
    }

    /// The xattr bytes of an ACL (tests, tools).
    pub fn to_xattr(entries: &[(u16, u16, u32)]) -> Vec<u8> {
        let mut v = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in entries {
            v.extend_from_slice(&tag.to_le_bytes());
            v.extend_from_slice(&perm.to_le_bytes());
            v.extend_from_slice(&id.to_le_bytes());
        }
        v
    }

    /// POSIX.1e access check (as Linux `posix_acl_permission`): the owner entry for the
    /// owner; a named user entry (limited by the mask); else any matching group entry
    /// that grants all of `want` (limited by the mask), none granting means refused;
    /// else the other entry.
    fn permits(&self, c: &Cred, a: &FileAttr, want: u32) -> bool {
        let has = |perm: u16| perm as u32 & want == want;
        let mask = self
            .entries
            .iter()
            .find(|e| e.0 == ACL_MASK)
            .map_or(7, |e| e.1);
        if c.uid == a.uid {
            return self.entries.iter().any(|e| e.0 == ACL_USER_OBJ && has(e.1));
        }
        if let Some(e) = self
            .entries
            .iter()
            .find(|e| e.0 == ACL_USER && e.2 == c.uid)
        {
            return has(e.1 & mask);
        }
        let mut matched = false;
        for e in &self.entries {
            let member = match e.0 {
                ACL_GROUP_OBJ => c.in_group(a.gid),
                ACL_GROUP => c.in_group(e.2),
                _ => false,
            };
            if member {
                if has(e.1 & mask) {
                    return true;
                }
                matched = true;
            }
        }
        !matched && self.entries.iter().any(|e| e.0 == ACL_OTHER && has(e.1))
    }
}

/// An object as the permission checks see it: its attributes and access ACL, if any.
#[derive(Clone, Debug)]
pub struct Obj {
    pub attr: FileAttr,
    pub acl: Option<Acl>,
}

impl From<FileAttr> for Obj {
    fn from(attr: FileAttr) -> Obj {
        Obj { attr, acl: None }
    }
}

/// The identity one call is served as (after squashing).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (at most 16, sorted, without duplicates).
    pub gids: Vec<u32>,
}

impl Cred {
    pub const ROOT: Cred = Cred {
        uid: 0,
        gid: 0,
        gids: Vec::new(),
    };

    pub fn new(uid: u32, gid: u32, gids: &[u32]) -> Cred {
        let mut gids: Vec<u32> = gids.iter().copied().take(MAX_GROUPS).collect();
        gids.sort_unstable();
        gids.dedup();
        Cred { uid, gid, gids }
    }

    pub fn is_root(&self) -> bool {
        self.uid == 0
    }

    /// The store's notion of the caller (owner of new objects).
    pub fn caller(&self) -> Caller {
        Caller {
            uid: self.uid,
            gid: self.gid,
            pid: 0,
        }
    }

    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.gids.binary_search(&gid).is_ok()
    }

    /// Distinguishes callers in work keys, so one user never collects another's result.
    pub fn tag(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + 4 * self.gids.len());
        for id in [self.uid, self.gid].iter().chain(&self.gids) {
            v.extend_from_slice(&id.to_be_bytes());
        }
        v
    }

    /// The `rwx` bits (R|W|X) of the mode that apply to this caller: the owner, group or
    /// other triple; root reads and writes anything and executes what has an `x` bit
    /// (and searches every directory).
    fn mode_rights(&self, a: &FileAttr) -> u32 {
        let perm = a.perm as u32;
        if self.is_root() {
            let x = a.kind == FileKind::Dir || perm & 0o111 != 0;
            return R | W | if x { X } else { 0 };
        }
        if self.uid == a.uid {
            (perm >> 6) & 7
        } else if self.in_group(a.gid) {
            (perm >> 3) & 7
        } else {
            perm & 7
        }
    }

    /// Whether this caller has all of `want` (R|W|X) on `o`: by its ACL if it has one
    /// (root: by the mode, as the kernel's capability override).
    pub fn may(&self, o: &Obj, want: u32) -> bool {
        match &o.acl {
            Some(acl) if !self.is_root() => acl.permits(self, &o.attr, want),
            _ => self.mode_rights(&o.attr) & want == want,
        }
    }

    /// The single bits (R, W, X) this caller has on `o`.
    pub fn rights(&self, o: &Obj) -> u32 {
        [R, W, X]
            .into_iter()
            .filter(|&b| self.may(o, b))
            .fold(0, |acc, b| acc | b)
    }

    /// `want` on `o`, or NFS3ERR_ACCES.
    pub fn require(&self, o: &Obj, want: u32) -> Result<(), nfsstat3> {
        if self.may(o, want) {
            Ok(())
        } else {
            Err(nfsstat3::NFS3ERR_ACCES)
        }
    }

    /// READ of a file's data: read permission, or execute permission (a client loading a
    /// program reads it), or owning it (knfsd's owner override: a file created read-only
    /// stays readable through the descriptor that created it).
    pub fn may_read_data(&self, o: &Obj) -> Result<(), nfsstat3> {
        if self.uid == o.attr.uid || self.rights(o) & (R | X) != 0 {
            Ok(())
        } else {
            Err(nfsstat3::NFS3ERR_ACCES)
        }
    }

    /// WRITE (or truncation) of a file: write permission or owning it (owner override).
    pub fn may_write_data(&self, o: &Obj) -> Result<(), nfsstat3> {
        if self.uid == o.attr.uid || self.may(o, W) {
            Ok(())
        } else {
            Err(nfsstat3::NFS3ERR_ACCES)
        }
    }

    /// Removing or renaming away `victim` from directory `dir`: write and search on the
    /// directory, and with the sticky bit set, owning the directory or the victim.
    pub fn may_delete(&self, dir: &Obj, victim: &FileAttr) -> Result<(), nfsstat3> {
        self.require(dir, W | X)?;
        let sticky = dir.attr.perm as u32 & libc::S_ISVTX != 0;
        if sticky && !self.is_root() && self.uid != dir.attr.uid && self.uid != victim.uid {
            return Err(nfsstat3::NFS3ERR_PERM);
        }
        Ok(())
    }

    /// A new hard link to `src` (Linux `fs.protected_hardlinks`): its owner may; anyone
    /// else only to a regular file that is neither setuid nor executable-setgid and that
    /// they may read and write.
    pub fn may_link(&self, o: &Obj) -> Result<(), nfsstat3> {
        let src = &o.attr;
        if self.is_root() || self.uid == src.uid {
            return Ok(());
        }
        let perm = src.perm as u32;
        let setuid = perm & libc::S_ISUID != 0;
        let exec_setgid = perm & libc::S_ISGID != 0 && perm & 0o010 != 0;
        if src.kind == FileKind::File && !setuid && !exec_setgid && self.may(o, R | W) {
            Ok(())
        } else {
            Err(nfsstat3::NFS3ERR_PERM)
        }
    }

    /// Whether this caller may make the changes of `set` to an object with attributes
    /// `a` (the rules of chown(2), chmod(2), truncate(2), utimensat(2)). A mode with the
    /// setgid bit on a file whose group the caller is not in loses that bit, as chmod(2)
    /// does.
    pub fn check_setattr(&self, o: &Obj, set: &mut SetAttr) -> Result<(), nfsstat3> {
        if self.is_root() {
            return Ok(());
        }
        let a = &o.attr;
        let owner = self.uid == a.uid;
        if let Some(uid) = set.uid
            && !(owner && uid == a.uid)
        {
            return Err(nfsstat3::NFS3ERR_PERM);
        }
        if let Some(gid) = set.gid
            && !(owner && (gid == a.gid || self.in_group(gid)))
        {
            return Err(nfsstat3::NFS3ERR_PERM);
        }
        if let Some(mode) = set.mode.as_mut() {
            if !owner {
                return Err(nfsstat3::NFS3ERR_PERM);
            }
            let group = set.gid.unwrap_or(a.gid);
            if a.kind != FileKind::Dir && !self.in_group(group) {
                *mode &= !libc::S_ISGID;
            }
        }
        if set.size.is_some() {
            self.may_write_data(o)?;
        }
        for t in [set.atime, set.mtime].into_iter().flatten() {
            match t {
                TimeSet::At(_) if !owner => return Err(nfsstat3::NFS3ERR_PERM),
                TimeSet::Now if !owner && !self.may(o, W) => return Err(nfsstat3::NFS3ERR_ACCES),
                _ => {}
            }
        }
        Ok(())
    }

    /// The ACCESS3 bits of `asked` granted on `a` (RFC 1813 §3.3.4): for directories
    /// READ = list, LOOKUP = search, MODIFY/EXTEND/DELETE = write and search; for other
    /// objects READ, MODIFY/EXTEND = write, EXECUTE.
    pub fn access_bits(&self, o: &Obj, asked: u32) -> u32 {
        let has = |m: u32| self.may(o, m);
        let mut granted = 0;
        if o.attr.kind == FileKind::Dir {
            if has(R) {
                granted |= ACCESS3_READ;
            }
            if has(X) {
                granted |= ACCESS3_LOOKUP;
            }
            if has(W | X) {
                granted |= ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE;
            }
        } else {
            if has(R) {
                granted |= ACCESS3_READ;
            }
            if has(W) {
                granted |= ACCESS3_MODIFY | ACCESS3_EXTEND;
            }
            if has(X) {
                granted |= ACCESS3_EXECUTE;
            }
        }
        granted & asked
    }
}

impl Identity {
    /// The identity a call from `peer` with credential `sys` (None: AUTH_NULL) is served
    /// as. `daemon` is the server's own (uid, gid) when it is not root: such a server
    /// cannot act as anyone else (chown would fail), so every caller is its user.
    pub fn map(&self, peer: IpAddr, sys: Option<&SysCred>, daemon: Option<(u32, u32)>) -> Cred {
        if let Some((uid, gid)) = daemon {
            return Cred::new(uid, gid, &[]);
        }
        let anon = Cred::new(self.anon_uid, self.anon_gid, &[]);
        let Some(c) = sys else { return anon };
        match self.squash {
            Squash::All => anon,
            Squash::None => Cred::new(c.uid, c.gid, &c.gids),
            Squash::Root if self.root_trusted.allows(peer) => Cred::new(c.uid, c.gid, &c.gids),
            Squash::Root => {
                let g = |id: u32| if id == 0 { self.anon_gid } else { id };
                let uid = if c.uid == 0 { self.anon_uid } else { c.uid };
                let gids: Vec<u32> = c.gids.iter().map(|&id| g(id)).collect();
                Cred::new(uid, g(c.gid), &gids)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn attr(kind: FileKind, perm: u16, uid: u32, gid: u32) -> Obj {
        Obj::from(fattr(kind, perm, uid, gid))
    }

    fn fattr(kind: FileKind, perm: u16, uid: u32, gid: u32) -> FileAttr {
        let t = SystemTime::UNIX_EPOCH;
        FileAttr {
            ino: 2,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            kind,
            perm,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            blksize: 4096,
        }
    }

    fn sys(uid: u32, gid: u32, gids: &[u32]) -> SysCred {
        SysCred {
            uid,
            gid,
            gids: gids.to_vec(),
        }
    }

    #[test]
    fn squash_modes() {
        let remote: IpAddr = "10.0.0.9".parse().unwrap();
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let id = Identity::default();
        // root_squash: remote root becomes nobody, gid 0 in the groups too.
        assert_eq!(
            id.map(remote, Some(&sys(0, 0, &[0, 10])), None),
            Cred::new(NOBODY, NOBODY, &[NOBODY, 10])
        );
        // A trusted (loopback) client's root is kept; ordinary users are kept everywhere.
        assert_eq!(id.map(local, Some(&sys(0, 0, &[])), None), Cred::ROOT);
        assert_eq!(
            id.map(remote, Some(&sys(1234, 5678, &[7])), None),
            Cred::new(1234, 5678, &[7])
        );
        // AUTH_NULL is anonymous.
        assert_eq!(id.map(local, None, None), Cred::new(NOBODY, NOBODY, &[]));
        let all = Identity {
            squash: Squash::All,
            anon_uid: 99,
            anon_gid: 98,
            ..Identity::default()
        };
        assert_eq!(
            all.map(local, Some(&sys(1234, 5678, &[])), None),
            Cred::new(99, 98, &[])
        );
        let none = Identity {
            squash: Squash::None,
            root_trusted: "127.0.0.1".parse().unwrap(),
            ..Identity::default()
        };
        assert_eq!(none.map(remote, Some(&sys(0, 0, &[])), None), Cred::ROOT);
        // A server that is not root acts as itself for everyone.
        assert_eq!(
            id.map(local, Some(&sys(0, 0, &[])), Some((1000, 1000))),
            Cred::new(1000, 1000, &[])
        );
        assert_eq!("all_squash".parse::<Squash>(), Ok(Squash::All));
        assert_eq!("none".parse::<Squash>(), Ok(Squash::None));
        assert!(
            "sometimes"
                .parse::<Squash>()
                .unwrap_err()
                .contains("none, root or all")
        );
    }

    #[test]
    fn mode_bits_by_class() {
        let f = attr(FileKind::File, 0o640, 10, 20);
        assert_eq!(Cred::new(10, 1, &[]).rights(&f), R | W);
        assert_eq!(Cred::new(11, 20, &[]).rights(&f), R);
        assert_eq!(Cred::new(11, 1, &[20]).rights(&f), R, "supplementary group");
        assert_eq!(Cred::new(11, 1, &[]).rights(&f), 0);
        // The owner class decides for the owner even when "other" grants more.
        let g = attr(FileKind::File, 0o047, 10, 20);
        assert_eq!(Cred::new(10, 20, &[]).rights(&g), 0);
        // Root: rw always, x only with an x bit, search on directories.
        assert_eq!(Cred::ROOT.rights(&f), R | W);
        assert_eq!(Cred::ROOT.rights(&attr(FileKind::Dir, 0, 1, 1)), R | W | X);
        assert_eq!(
            Cred::ROOT.rights(&attr(FileKind::File, 0o100, 1, 1)),
            R | W | X
        );
    }

    #[test]
    fn owner_override_and_sticky_directories() {
        let ro = attr(FileKind::File, 0o444, 10, 20);
        assert!(Cred::new(10, 20, &[]).may_write_data(&ro).is_ok());
        assert_eq!(
            Cred::new(11, 20, &[]).may_write_data(&ro),
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        let exec_only = attr(FileKind::File, 0o711, 10, 20);
        assert!(Cred::new(11, 1, &[]).may_read_data(&exec_only).is_ok());
        assert!(
            Cred::new(11, 1, &[])
                .may_read_data(&attr(FileKind::File, 0o600, 10, 20))
                .is_err()
        );
        let tmp = attr(FileKind::Dir, 0o1777, 0, 0);
        let theirs = fattr(FileKind::File, 0o644, 10, 10);
        assert!(Cred::new(10, 10, &[]).may_delete(&tmp, &theirs).is_ok());
        assert_eq!(
            Cred::new(11, 11, &[]).may_delete(&tmp, &theirs),
            Err(nfsstat3::NFS3ERR_PERM)
        );
        assert!(Cred::ROOT.may_delete(&tmp, &theirs).is_ok());
        let closed = attr(FileKind::Dir, 0o755, 0, 0);
        assert_eq!(
            Cred::new(10, 10, &[]).may_delete(&closed, &theirs),
            Err(nfsstat3::NFS3ERR_ACCES)
        );
    }

    #[test]
    fn setattr_rules() {
        let f = attr(FileKind::File, 0o644, 10, 20);
        let owner = Cred::new(10, 20, &[30]);
        let other = Cred::new(11, 20, &[]);
        let ok = |c: &Cred, mut s: SetAttr| c.check_setattr(&f, &mut s).map(|()| s);
        // chown to someone else: root only.
        let give = SetAttr {
            uid: Some(11),
            ..Default::default()
        };
        assert_eq!(ok(&owner, give), Err(nfsstat3::NFS3ERR_PERM));
        assert!(ok(&Cred::ROOT, give).is_ok());
        // chgrp to a group the owner is in.
        let grp = |g| SetAttr {
            gid: Some(g),
            ..Default::default()
        };
        assert!(ok(&owner, grp(30)).is_ok());
        assert_eq!(ok(&owner, grp(31)), Err(nfsstat3::NFS3ERR_PERM));
        assert_eq!(ok(&other, grp(20)), Err(nfsstat3::NFS3ERR_PERM));
        // chmod: owner only; setgid dropped when not in the file's group.
        let m = |mode| SetAttr {
            mode: Some(mode),
            ..Default::default()
        };
        assert_eq!(ok(&other, m(0o600)), Err(nfsstat3::NFS3ERR_PERM));
        let outsider_owner = Cred::new(10, 99, &[]);
        assert_eq!(ok(&outsider_owner, m(0o2755)).unwrap().mode, Some(0o755));
        assert_eq!(ok(&owner, m(0o2755)).unwrap().mode, Some(0o2755));
        // truncate: write permission or ownership.
        let size = SetAttr {
            size: Some(0),
            ..Default::default()
        };
        assert!(ok(&owner, size).is_ok());
        assert_eq!(ok(&other, size), Err(nfsstat3::NFS3ERR_ACCES));
        // times: explicit values need ownership, "now" needs write permission.
        let at = SetAttr {
            mtime: Some(TimeSet::At(SystemTime::UNIX_EPOCH)),
            ..Default::default()
        };
        assert_eq!(ok(&other, at), Err(nfsstat3::NFS3ERR_PERM));
        let now = SetAttr {
            mtime: Some(TimeSet::Now),
            ..Default::default()
        };
        assert_eq!(ok(&other, now), Err(nfsstat3::NFS3ERR_ACCES));
        let writable = attr(FileKind::File, 0o666, 10, 20);
        assert!(other.check_setattr(&writable, &mut now.clone()).is_ok());
    }

    #[test]
    fn access_acls() {
        // rw for the owner, r-x for named user 11 and group 30, mask r--, other none.
        let acl = Acl::parse(&Acl::to_xattr(&[
            (ACL_USER_OBJ, 6, 0),
            (ACL_USER, 5, 11),
            (ACL_GROUP_OBJ, 0, 0),
            (ACL_GROUP, 5, 30),
            (ACL_MASK, 4, 0),
            (ACL_OTHER, 0, 0),
        ]))
        .unwrap();
        let o = Obj {
            attr: fattr(FileKind::File, 0o640, 10, 20),
            acl: Some(acl),
        };
        assert_eq!(Cred::new(10, 1, &[]).rights(&o), R | W, "owner entry");
        assert_eq!(Cred::new(11, 1, &[]).rights(&o), R, "named user, masked");
        assert_eq!(Cred::new(12, 1, &[30]).rights(&o), R, "named group, masked");
        assert_eq!(
            Cred::new(12, 20, &[]).rights(&o),
            0,
            "owning group entry grants nothing"
        );
        assert_eq!(Cred::new(12, 1, &[]).rights(&o), 0, "other");
        assert_eq!(Cred::ROOT.rights(&o), R | W);
        assert!(Acl::parse(&[1, 0, 0, 0]).is_none(), "wrong version");
        assert!(Acl::parse(&[2, 0, 0, 0, 1]).is_none(), "truncated entry");
    }

    #[test]
    fn protected_hardlinks() {
        let other = Cred::new(11, 1, &[]);
        assert!(other.may_link(&attr(FileKind::File, 0o666, 10, 20)).is_ok());
        assert_eq!(
            other.may_link(&attr(FileKind::File, 0o644, 10, 20)),
            Err(nfsstat3::NFS3ERR_PERM)
        );
        assert_eq!(
            other.may_link(&attr(FileKind::File, 0o4777, 10, 20)),
            Err(nfsstat3::NFS3ERR_PERM)
        );
        assert!(
            Cred::new(10, 1, &[])
                .may_link(&attr(FileKind::File, 0o600, 10, 20))
                .is_ok()
        );
    }

    #[test]
    fn access_bits_for_files_and_directories() {
        let all = ACCESS3_READ
            | ACCESS3_LOOKUP
            | ACCESS3_MODIFY
            | ACCESS3_EXTEND
            | ACCESS3_DELETE
            | ACCESS3_EXECUTE;
        let d = attr(FileKind::Dir, 0o755, 10, 20);
        assert_eq!(
            Cred::new(11, 1, &[]).access_bits(&d, all),
            ACCESS3_READ | ACCESS3_LOOKUP
        );
        assert_eq!(
            Cred::new(10, 1, &[]).access_bits(&d, all),
            ACCESS3_READ | ACCESS3_LOOKUP | ACCESS3_MODIFY | ACCESS3_EXTEND | ACCESS3_DELETE
        );
        let f = attr(FileKind::File, 0o750, 10, 20);
        assert_eq!(
            Cred::new(11, 20, &[]).access_bits(&f, all),
            ACCESS3_READ | ACCESS3_EXECUTE
        );
        assert_eq!(
            Cred::new(11, 20, &[]).access_bits(&f, ACCESS3_MODIFY),
            0,
            "only asked bits, only granted ones"
        );
    }
}
