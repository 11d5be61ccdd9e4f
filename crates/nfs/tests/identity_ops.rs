//! What the face does with the caller's AUTH_SYS credential, and the procedures kaiso
//! answers itself: LINK (hard links), MKNOD (FIFOs, sockets, devices), MKDIR with its
//! attributes, ACCESS; ownership of new objects, permission checks, root/all squash.

mod common;

use common::{Client, Served, auth_sys, connect_as, dirop, pattern, rt, status};
use kaiso_nfs::Squash;
use kaiso_store::{Caller, FileKind, ROOT_INO};
use nfs3_client::Nfs3ConnectionBuilder;
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::opaque_auth;
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::TokioConnector;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use tokio::net::TcpStream;

/// Acting as other users needs a server running as root (chown); CI runs as root.
fn running_as_root() -> bool {
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("notice: not root, the server cannot act as other users; skipping");
    }
    root
}

fn root_cred() -> opaque_auth<'static> {
    auth_sys(0, 0, &[])
}

fn mode(m: u32) -> sattr3 {
    sattr3 {
        mode: Nfs3Option::Some(m),
        ..Default::default()
    }
}

async fn lookup(c: &mut Client, dir: &nfs_fh3, name: &str) -> Result<nfs_fh3, nfsstat3> {
    let what = dirop(dir, name);
    status(c.lookup(&LOOKUP3args { what }).await.unwrap()).map(|ok| ok.object)
}

async fn mkdir(c: &mut Client, dir: &nfs_fh3, name: &str, m: u32) -> Result<nfs_fh3, nfsstat3> {
    let args = MKDIR3args {
        where_: dirop(dir, name),
        attributes: mode(m),
    };
    status(c.mkdir(&args).await.unwrap()).map(|ok| ok.obj.unwrap())
}

async fn create(c: &mut Client, dir: &nfs_fh3, name: &str, m: u32) -> Result<nfs_fh3, nfsstat3> {
    let args = CREATE3args {
        where_: dirop(dir, name),
        how: createhow3::GUARDED(mode(m)),
    };
    match status(c.create(&args).await.unwrap())?.obj {
        Nfs3Option::Some(fh) => Ok(fh),
        Nfs3Option::None => lookup(c, dir, name).await,
    }
}

async fn write(c: &mut Client, fh: &nfs_fh3, data: &[u8]) -> Result<(), nfsstat3> {
    let args = WRITE3args {
        file: fh.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: stable_how::FILE_SYNC,
        data: Opaque::borrowed(data),
    };
    status(c.write(&args).await.unwrap()).map(drop)
}

async fn read(c: &mut Client, fh: &nfs_fh3) -> Result<Vec<u8>, nfsstat3> {
    let args = READ3args {
        file: fh.clone(),
        offset: 0,
        count: 1 << 20,
    };
    status(c.read(&args).await.unwrap()).map(|ok| ok.data.as_ref().to_vec())
}

async fn mknod(
    c: &mut Client,
    dir: &nfs_fh3,
    name: &str,
    what: mknoddata3,
) -> Result<fattr3, nfsstat3> {
    let args = MKNOD3args {
        where_: dirop(dir, name),
        what,
    };
    status(c.mknod(&args).await.unwrap()).map(|ok| ok.obj_attributes.unwrap())
}

async fn link(c: &mut Client, file: &nfs_fh3, dir: &nfs_fh3, name: &str) -> Result<u32, nfsstat3> {
    let args = LINK3args {
        file: file.clone(),
        link: dirop(dir, name),
    };
    status(c.link(&args).await.unwrap()).map(|ok| ok.file_attributes.unwrap().nlink)
}

async fn setattr(c: &mut Client, fh: &nfs_fh3, set: sattr3) -> Result<(), nfsstat3> {
    let args = SETATTR3args {
        object: fh.clone(),
        new_attributes: set,
        guard: Nfs3Option::None,
    };
    status(c.setattr(&args).await.unwrap()).map(drop)
}

async fn remove(c: &mut Client, dir: &nfs_fh3, name: &str) -> Result<(), nfsstat3> {
    let object = dirop(dir, name);
    status(c.remove(&REMOVE3args { object }).await.unwrap()).map(drop)
}

async fn access(c: &mut Client, fh: &nfs_fh3, asked: u32) -> u32 {
    let args = ACCESS3args {
        object: fh.clone(),
        access: asked,
    };
    c.access(&args).await.unwrap().unwrap().access
}

/// The backing file of `rel` on whichever tier holds it.
fn on_tier(s: &Served, rel: &str) -> PathBuf {
    for t in ["t0", "t1"] {
        let p = s.dir.path().join(t).join(rel);
        if p.symlink_metadata().is_ok() {
            return p;
        }
    }
    panic!("{rel} is on no tier");
}

fn owner(s: &Served, rel: &str) -> (u32, u32) {
    let m = on_tier(s, rel).symlink_metadata().unwrap();
    (m.uid(), m.gid())
}

#[test]
fn link_makes_a_hard_link_in_the_store() {
    if !running_as_root() {
        return;
    }
    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        let d = mkdir(&mut c, &root, "d", 0o755).await.unwrap();
        let f = create(&mut c, &d, "f", 0o644).await.unwrap();
        let data = pattern(10_000, 1);
        write(&mut c, &f, &data).await.unwrap();
        assert_eq!(link(&mut c, &f, &root, "f2").await, Ok(2));

        // One inode, two names, in the store and on the tier.
        let ino = s.store.resolve(Path::new("d/f")).unwrap();
        assert_eq!(s.store.resolve(Path::new("f2")).unwrap(), ino);
        assert_eq!(s.store.getattr(ino, None).unwrap().nlink, 2);
        let (a, b) = (
            on_tier(&s, "d/f").metadata().unwrap(),
            on_tier(&s, "f2").metadata().unwrap(),
        );
        assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
        let f2 = lookup(&mut c, &root, "f2").await.unwrap();
        assert_eq!(read(&mut c, &f2).await.unwrap(), data);

        // An existing name, a directory, a foreign handle.
        assert_eq!(
            link(&mut c, &f, &root, "f2").await,
            Err(nfsstat3::NFS3ERR_EXIST)
        );
        assert!(link(&mut c, &d, &root, "dirlink").await.is_err());
        let bogus = nfs_fh3 {
            data: Opaque::owned(vec![0; 16]),
        };
        assert_eq!(
            link(&mut c, &bogus, &root, "x").await,
            Err(nfsstat3::NFS3ERR_STALE)
        );
        // Removing one name leaves the other.
        remove(&mut c, &d, "f").await.unwrap();
        assert_eq!(s.store.getattr(ino, None).unwrap().nlink, 1);
        assert_eq!(read(&mut c, &f2).await.unwrap(), data);
    });
}

#[test]
fn mknod_makes_fifos_sockets_and_devices() {
    if !running_as_root() {
        return;
    }
    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        let a = mknod(&mut c, &root, "pipe", mknoddata3::NF3FIFO(mode(0o640)))
            .await
            .unwrap();
        assert_eq!((a.type_, a.mode), (ftype3::NF3FIFO, 0o640));
        assert!(
            on_tier(&s, "pipe")
                .symlink_metadata()
                .unwrap()
                .file_type()
                .is_fifo()
        );
        let ino = s.store.resolve(Path::new("pipe")).unwrap();
        assert_eq!(s.store.getattr(ino, None).unwrap().kind, FileKind::Fifo);

        mknod(&mut c, &root, "sock", mknoddata3::NF3SOCK(mode(0o600)))
            .await
            .unwrap();
        assert!(
            on_tier(&s, "sock")
                .symlink_metadata()
                .unwrap()
                .file_type()
                .is_socket()
        );

        // A character device (like /dev/null, 1:3): root may.
        let null = devicedata3 {
            dev_attributes: mode(0o666),
            spec: specdata3 {
                specdata1: 1,
                specdata2: 3,
            },
        };
        let a = mknod(&mut c, &root, "null", mknoddata3::NF3CHR(null))
            .await
            .unwrap();
        assert_eq!(a.type_, ftype3::NF3CHR);
        assert_eq!((a.rdev.specdata1, a.rdev.specdata2), (1, 3));
        let m = on_tier(&s, "null").symlink_metadata().unwrap();
        assert!(m.file_type().is_char_device());
        assert_eq!(m.rdev(), libc::makedev(1, 3));
        assert_eq!(
            mknod(&mut c, &root, "pipe", mknoddata3::NF3FIFO(mode(0o640)))
                .await
                .err(),
            Some(nfsstat3::NFS3ERR_EXIST)
        );

        // Anyone else may not make devices (mknod(2) needs CAP_MKNOD), but FIFOs yes.
        let open = mkdir(&mut c, &root, "open", 0o777).await.unwrap();
        let (mut u, _) = connect_as(s.port(), auth_sys(1234, 5678, &[])).await;
        let zero = devicedata3 {
            dev_attributes: mode(0o666),
            spec: specdata3 {
                specdata1: 1,
                specdata2: 5,
            },
        };
        assert_eq!(
            mknod(&mut u, &open, "zero", mknoddata3::NF3CHR(zero))
                .await
                .err(),
            Some(nfsstat3::NFS3ERR_PERM)
        );
        mknod(&mut u, &open, "upipe", mknoddata3::NF3FIFO(mode(0o600)))
            .await
            .unwrap();
        assert_eq!(owner(&s, "open/upipe"), (1234, 5678));
    });
}

#[test]
fn new_objects_belong_to_the_auth_sys_caller() {
    if !running_as_root() {
        return;
    }
    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        // MKDIR's attributes are applied (mode 0777 here, despite no umask games).
        let shared = mkdir(&mut c, &root, "pub", 0o777).await.unwrap();
        let ino = s.store.resolve(Path::new("pub")).unwrap();
        assert_eq!(s.store.getattr(ino, None).unwrap().perm, 0o777);

        let (mut u, _) = connect_as(s.port(), auth_sys(1234, 5678, &[42])).await;
        let f = create(&mut u, &shared, "f", 0o640).await.unwrap();
        write(&mut u, &f, b"mine").await.unwrap();
        mkdir(&mut u, &shared, "d", 0o750).await.unwrap();
        u.symlink(&SYMLINK3args {
            where_: dirop(&shared, "l"),
            symlink: symlinkdata3 {
                symlink_attributes: sattr3::default(),
                symlink_data: nfspath3(Opaque::borrowed(b"f")),
            },
        })
        .await
        .unwrap()
        .unwrap();
        for rel in ["pub/f", "pub/d", "pub/l"] {
            assert_eq!(owner(&s, rel), (1234, 5678), "{rel} in the backing tier");
        }
        let fino = s.store.resolve(Path::new("pub/f")).unwrap();
        let a = s.store.getattr(fino, None).unwrap();
        assert_eq!((a.uid, a.gid, a.perm), (1234, 5678, 0o640));

        // chgrp to a supplementary group is allowed, giving the file away is not.
        let grp = sattr3 {
            gid: Nfs3Option::Some(42),
            ..Default::default()
        };
        setattr(&mut u, &f, grp).await.unwrap();
        assert_eq!(owner(&s, "pub/f"), (1234, 42));
        let give = || sattr3 {
            uid: Nfs3Option::Some(0),
            ..Default::default()
        };
        assert_eq!(
            setattr(&mut u, &f, give()).await,
            Err(nfsstat3::NFS3ERR_PERM)
        );
        // Root may.
        setattr(&mut c, &f, give()).await.unwrap();
        assert_eq!(owner(&s, "pub/f").0, 0);
    });
}

#[test]
fn callers_without_permission_are_refused() {
    if !running_as_root() {
        return;
    }
    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        let private = mkdir(&mut c, &root, "private", 0o700).await.unwrap();
        create(&mut c, &private, "inner", 0o644).await.unwrap();
        let secret = create(&mut c, &root, "secret", 0o600).await.unwrap();
        write(&mut c, &secret, b"top secret").await.unwrap();
        let tmp = mkdir(&mut c, &root, "tmp", 0o1777).await.unwrap();

        let (mut u, _) = connect_as(s.port(), auth_sys(1234, 1234, &[])).await;
        let (mut v, _) = connect_as(s.port(), auth_sys(4321, 4321, &[])).await;
        assert_eq!(
            lookup(&mut u, &private, "inner").await,
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        assert_eq!(read(&mut u, &secret).await, Err(nfsstat3::NFS3ERR_ACCES));
        assert_eq!(
            write(&mut u, &secret, b"x").await,
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        assert_eq!(
            create(&mut u, &root, "intruder", 0o644).await,
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        assert_eq!(
            mkdir(&mut u, &root, "intruder", 0o755).await,
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        assert_eq!(
            remove(&mut u, &root, "secret").await,
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        assert_eq!(
            setattr(&mut u, &secret, mode(0o666)).await,
            Err(nfsstat3::NFS3ERR_PERM)
        );
        assert_eq!(
            link(&mut u, &secret, &tmp, "stolen").await,
            Err(nfsstat3::NFS3ERR_PERM),
            "protected hard links: not the owner, no read/write"
        );
        // ACCESS reports what the caller really has.
        let all = ACCESS3_READ
            | ACCESS3_LOOKUP
            | ACCESS3_MODIFY
            | ACCESS3_EXTEND
            | ACCESS3_DELETE
            | ACCESS3_EXECUTE;
        assert_eq!(access(&mut u, &secret, all).await, 0);
        assert_eq!(
            access(&mut u, &root, all).await,
            ACCESS3_READ | ACCESS3_LOOKUP
        );
        assert_eq!(
            access(&mut c, &secret, ACCESS3_READ | ACCESS3_MODIFY).await,
            ACCESS3_READ | ACCESS3_MODIFY
        );
        // Nothing changed.
        assert_eq!(read(&mut c, &secret).await.unwrap(), b"top secret");
        assert!(s.store.resolve(Path::new("intruder")).is_err());

        // Sticky directory: only the owner of an entry (or of the directory) removes it.
        let mine = create(&mut u, &tmp, "mine", 0o666).await.unwrap();
        assert_eq!(
            remove(&mut v, &tmp, "mine").await,
            Err(nfsstat3::NFS3ERR_PERM)
        );
        let r = v
            .rename(&RENAME3args {
                from: dirop(&tmp, "mine"),
                to: dirop(&tmp, "theirs"),
            })
            .await
            .unwrap();
        assert!(
            matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_PERM, _))),
            "{r:?}"
        );
        // A file opened for writing stays writable by its owner after chmod 0444.
        setattr(&mut u, &mine, mode(0o444)).await.unwrap();
        write(&mut u, &mine, b"still mine").await.unwrap();
        assert_eq!(
            write(&mut v, &mine, b"not yours").await,
            Err(nfsstat3::NFS3ERR_ACCES)
        );
        remove(&mut u, &tmp, "mine").await.unwrap();
    });
}

#[test]
fn root_squash_and_all_squash() {
    if !running_as_root() {
        return;
    }
    // Loopback is normally trusted with root; trust only another host here.
    let s = Served::start(|o| o.root_trusted = "192.0.2.1".parse().unwrap());
    s.store
        .mkdir(
            ROOT_INO,
            "open".as_ref(),
            libc::S_IFDIR | 0o777,
            0,
            Caller::ROOT,
        )
        .unwrap();
    s.store
        .mknod(
            ROOT_INO,
            "rootonly".as_ref(),
            libc::S_IFREG | 0o600,
            0,
            0,
            Caller::ROOT,
        )
        .unwrap();
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        let open = lookup(&mut c, &root, "open").await.unwrap();
        create(&mut c, &open, "by-root", 0o644).await.unwrap();
        assert_eq!(owner(&s, "open/by-root"), (65534, 65534), "root squashed");
        let ro = lookup(&mut c, &root, "rootonly").await.unwrap();
        assert_eq!(read(&mut c, &ro).await, Err(nfsstat3::NFS3ERR_ACCES));
        // AUTH_NULL is the anonymous user as well.
        let (mut anon, _) = connect_as(s.port(), opaque_auth::default()).await;
        create(&mut anon, &open, "by-nobody", 0o644).await.unwrap();
        assert_eq!(owner(&s, "open/by-nobody"), (65534, 65534));
        // Other users are themselves.
        let (mut u, _) = connect_as(s.port(), auth_sys(1234, 5678, &[])).await;
        create(&mut u, &open, "by-user", 0o644).await.unwrap();
        assert_eq!(owner(&s, "open/by-user"), (1234, 5678));
    });
    drop(s);

    let s = Served::start(|o| {
        o.squash = Squash::All;
        o.anon_uid = 4321;
        o.anon_gid = 8765;
    });
    s.store
        .mkdir(
            ROOT_INO,
            "open".as_ref(),
            libc::S_IFDIR | 0o777,
            0,
            Caller::ROOT,
        )
        .unwrap();
    rt().block_on(async {
        let (mut u, root) = connect_as(s.port(), auth_sys(1234, 5678, &[])).await;
        let open = lookup(&mut u, &root, "open").await.unwrap();
        create(&mut u, &open, "f", 0o644).await.unwrap();
        assert_eq!(owner(&s, "open/f"), (4321, 8765), "all_squash");
        let (mut c, _) = connect_as(s.port(), root_cred()).await;
        assert_eq!(
            create(&mut c, &root, "g", 0o644).await,
            Err(nfsstat3::NFS3ERR_ACCES),
            "even root is anonymous"
        );
    });
}

#[test]
fn unsupported_credential_flavours_are_refused() {
    if !running_as_root() {
        return;
    }
    let s = Served::start(|_| {});
    rt().block_on(async {
        let des = opaque_auth {
            flavor: nfs3_client::nfs3_types::rpc::auth_flavor::AUTH_DES,
            body: Opaque::owned(vec![]),
        };
        let r = Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", "/export")
            .connect_from_privileged_port(false)
            .credential(des)
            .mount_port(s.port())
            .nfs3_port(s.port())
            .mount()
            .await;
        let e = r.err().expect("AUTH_DES is refused");
        assert!(format!("{e:?}").contains("Auth"), "{e:?}");
        // The server keeps serving others.
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        c.getattr(&GETATTR3args { object: root })
            .await
            .unwrap()
            .unwrap();
    });
}

/// One record-marked RPC call.
fn call_record(
    xid: u32,
    proc_: u32,
    cred: opaque_auth<'static>,
    args: &impl nfs3_client::nfs3_types::xdr_codec::Pack,
) -> Vec<u8> {
    use nfs3_client::nfs3_types::rpc::{call_body, msg_body, rpc_msg};
    use nfs3_client::nfs3_types::xdr_codec::Pack;
    let msg = rpc_msg {
        xid,
        body: msg_body::CALL(call_body {
            rpcvers: 2,
            prog: 100_003,
            vers: 3,
            proc: proc_,
            cred,
            verf: opaque_auth::default(),
        }),
    };
    let mut body = Vec::new();
    msg.pack(&mut body).unwrap();
    args.pack(&mut body).unwrap();
    let mut rec = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    rec.extend_from_slice(&body);
    rec
}

#[test]
fn pipelined_calls_of_several_users_on_one_connection_keep_their_identity() {
    if !running_as_root() {
        return;
    }
    use nfs3_client::nfs3_types::rpc::{msg_body, reply_body, rpc_msg};
    use nfs3_client::nfs3_types::xdr_codec::Unpack;
    use std::collections::HashMap;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        let open = mkdir(&mut c, &root, "open", 0o777).await.unwrap();
        let mut sock = TcpStream::connect(("127.0.0.1", s.port())).await.unwrap();
        // 30 CREATEs by three users and 3 ACCESS calls, all sent before any reply is read.
        let mut wire = Vec::new();
        let mut expect = HashMap::new();
        for i in 0..33u32 {
            let uid = 2000 + i % 3;
            let cred = auth_sys(uid, uid + 100, &[]);
            if i % 11 == 10 {
                let args = ACCESS3args {
                    object: open.clone(),
                    access: ACCESS3_MODIFY,
                };
                wire.extend(call_record(i, 4, cred, &args));
                expect.insert(i, None);
            } else {
                let name = format!("f{i}");
                let args = CREATE3args {
                    where_: dirop(&open, &name),
                    how: createhow3::UNCHECKED(mode(0o644)),
                };
                wire.extend(call_record(i, 8, cred, &args));
                expect.insert(i, Some((name, uid)));
            }
        }
        sock.write_all(&wire).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..33 {
            let mut hdr = [0u8; 4];
            sock.read_exact(&mut hdr).await.unwrap();
            let len = (u32::from_be_bytes(hdr) & 0x7fff_ffff) as usize;
            let mut body = vec![0u8; len];
            sock.read_exact(&mut body).await.unwrap();
            let mut cur = std::io::Cursor::new(&body[..]);
            let (msg, _) = rpc_msg::unpack(&mut cur).unwrap();
            assert!(matches!(
                msg.body,
                msg_body::REPLY(reply_body::MSG_ACCEPTED(_))
            ));
            match &expect[&msg.xid] {
                Some(_) => {
                    let (r, _) = CREATE3res::unpack(&mut cur).unwrap();
                    assert!(matches!(r, Nfs3Result::Ok(_)), "xid {}: {r:?}", msg.xid);
                }
                None => {
                    let (r, _) = ACCESS3res::unpack(&mut cur).unwrap();
                    assert_eq!(r.unwrap().access, ACCESS3_MODIFY);
                }
            }
            seen.push(msg.xid);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..33).collect::<Vec<_>>(), "one reply per call");
        for (name, uid) in expect.values().flatten() {
            assert_eq!(
                owner(&s, &format!("open/{name}")),
                (*uid, uid + 100),
                "{name} was created by uid {uid}"
            );
        }
    });
}

#[test]
fn posix_access_acls_decide_for_other_users() {
    if !running_as_root() {
        return;
    }
    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect_as(s.port(), root_cred()).await;
        let f = create(&mut c, &root, "acl.txt", 0o600).await.unwrap();
        write(&mut c, &f, b"shared with 1234").await.unwrap();
        // user::rw-, user:1234:r--, group::---, mask::r--, other::---
        let acl = kaiso_nfs::cred::Acl::to_xattr(&[
            (0x01, 6, 0),
            (0x02, 4, 1234),
            (0x04, 0, 0),
            (0x10, 4, 0),
            (0x20, 0, 0),
        ]);
        let ino = s.store.resolve(Path::new("acl.txt")).unwrap();
        if let Err(e) = s
            .store
            .setxattr(ino, "system.posix_acl_access".as_ref(), &acl, 0)
        {
            eprintln!("notice: the tier file system takes no POSIX ACLs ({e:?}); skipping");
            return;
        }
        let (mut u, _) = connect_as(s.port(), auth_sys(1234, 1234, &[])).await;
        let (mut v, _) = connect_as(s.port(), auth_sys(4321, 4321, &[])).await;
        assert_eq!(read(&mut u, &f).await.unwrap(), b"shared with 1234");
        assert_eq!(
            write(&mut u, &f, b"x").await,
            Err(nfsstat3::NFS3ERR_ACCES),
            "the ACL grants 1234 reading only"
        );
        assert_eq!(
            access(&mut u, &f, ACCESS3_READ | ACCESS3_MODIFY).await,
            ACCESS3_READ
        );
        assert_eq!(read(&mut v, &f).await, Err(nfsstat3::NFS3ERR_ACCES));
        assert_eq!(access(&mut v, &f, ACCESS3_READ).await, 0);
    });
}
