//! NFSv3 operations through a Rust client (`nfs3_client`): what libnfs-utils cannot do
//! (SETATTR, SYMLINK, READDIRPLUS, unstable WRITE + COMMIT, RENAME, REMOVE/RMDIR), the
//! JUKEBOX behaviour during a slow on-demand fetch, and the client-address allow list.

mod common;

use common::{Client, Served, connect_as, dirop, pattern, rt};
use kaiso_store::{FileKind, FsResult, Ino, ROOT_INO, Store, StubEntry, StubFiller};
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Mount as root (AUTH_SYS uid 0 from loopback, which is not squashed by default).
async fn connect(port: u16) -> (Client, nfs_fh3) {
    connect_as(port, common::auth_sys(0, 0, &[])).await
}

async fn lookup(c: &mut Client, dir: &nfs_fh3, name: &str) -> Result<(nfs_fh3, fattr3), nfsstat3> {
    match c
        .lookup(&LOOKUP3args {
            what: dirop(dir, name),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => {
            let attr = match ok.obj_attributes {
                Nfs3Option::Some(a) => a,
                Nfs3Option::None => {
                    c.getattr(&GETATTR3args {
                        object: ok.object.clone(),
                    })
                    .await
                    .unwrap()
                    .unwrap()
                    .obj_attributes
                }
            };
            Ok((ok.object, attr))
        }
        Nfs3Result::Err((e, _)) => Err(e),
    }
}

async fn create(c: &mut Client, dir: &nfs_fh3, name: &str, mode: u32) -> nfs_fh3 {
    let attrs = sattr3 {
        mode: Nfs3Option::Some(mode),
        ..Default::default()
    };
    let r = c
        .create(&CREATE3args {
            where_: dirop(dir, name),
            how: createhow3::GUARDED(attrs),
        })
        .await
        .unwrap()
        .unwrap();
    match r.obj {
        Nfs3Option::Some(fh) => fh,
        Nfs3Option::None => lookup(c, dir, name).await.unwrap().0,
    }
}

/// Reads the whole file, retrying a JUKEBOX reply as a client does (a face with a short
/// JUKEBOX deadline may answer one for resident data on a loaded machine), for 30 s.
async fn read_all(c: &mut Client, fh: &nfs_fh3) -> Vec<u8> {
    let mut out = Vec::new();
    let t0 = Instant::now();
    loop {
        let args = READ3args {
            file: fh.clone(),
            offset: out.len() as u64,
            count: 256 * 1024,
        };
        let r = match c.read(&args).await.unwrap() {
            Nfs3Result::Ok(r) => r,
            Nfs3Result::Err((nfsstat3::NFS3ERR_JUKEBOX, _)) => {
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "READ still answered JUKEBOX after 30 s"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Nfs3Result::Err((e, _)) => panic!("READ at {}: {e:?}", out.len()),
        };
        out.extend_from_slice(&r.data);
        if r.eof || r.data.is_empty() {
            return out;
        }
    }
}

async fn names(c: &mut Client, dir: &nfs_fh3) -> Vec<(String, u64, Option<fattr3>)> {
    let mut out = Vec::new();
    let mut cookie = 0;
    let t0 = Instant::now();
    loop {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "READDIRPLUS did not reach EOF"
        );
        let args = READDIRPLUS3args {
            dir: dir.clone(),
            cookie,
            cookieverf: cookieverf3::default(),
            dircount: 4096,
            maxcount: 16 * 1024,
        };
        let r = c.readdirplus(&args).await.unwrap().unwrap();
        for e in &r.reply.entries.0 {
            let attr = match &e.name_attributes {
                Nfs3Option::Some(a) => Some(a.clone()),
                Nfs3Option::None => None,
            };
            out.push((
                String::from_utf8_lossy(e.name.as_ref()).into_owned(),
                e.fileid,
                attr,
            ));
            cookie = e.cookie;
        }
        if r.reply.eof {
            return out;
        }
    }
}

#[test]
fn namespace_and_data_operations() {
    let s = Served::start(|_| {});
    rt().block_on(async {
        let (mut c, root) = connect(s.port()).await;
        let info = c
            .fsinfo(&FSINFO3args {
                fsroot: root.clone(),
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info.rtmax, 1 << 20);
        c.fsstat(&FSSTAT3args {
            fsroot: root.clone(),
        })
        .await
        .unwrap()
        .unwrap();
        c.pathconf(&PATHCONF3args {
            object: root.clone(),
        })
        .await
        .unwrap()
        .unwrap();

        // MKDIR + CREATE + unstable WRITEs + COMMIT + READ.
        let d = c
            .mkdir(&MKDIR3args {
                where_: dirop(&root, "docs"),
                attributes: sattr3::default(),
            })
            .await
            .unwrap()
            .unwrap();
        let dfh = match d.obj {
            Nfs3Option::Some(fh) => fh,
            Nfs3Option::None => panic!("mkdir returned no handle"),
        };
        let f = create(&mut c, &dfh, "a.bin", 0o640).await;
        let data = pattern(300_000, 3);
        for (i, chunk) in data.chunks(64 * 1024).enumerate() {
            let w = c
                .write(&WRITE3args {
                    file: f.clone(),
                    offset: (i * 64 * 1024) as u64,
                    count: chunk.len() as u32,
                    stable: stable_how::UNSTABLE,
                    data: Opaque::borrowed(chunk),
                })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(w.count as usize, chunk.len());
        }
        c.commit(&COMMIT3args {
            file: f.clone(),
            offset: 0,
            count: 0,
        })
        .await
        .unwrap()
        .unwrap();
        assert_eq!(read_all(&mut c, &f).await, data);
        // Visible through the store, with the mode asked at CREATE.
        let ino = s.store.resolve(Path::new("docs/a.bin")).unwrap();
        let a = s.store.getattr(ino, None).unwrap();
        assert_eq!((a.size, a.perm), (data.len() as u64, 0o640));

        // The NFS file id is the kaiso inode number.
        let (_, attr) = lookup(&mut c, &dfh, "a.bin").await.unwrap();
        assert_eq!(attr.fileid, ino);

        // SETATTR: truncate and chmod.
        let set = sattr3 {
            size: Nfs3Option::Some(1000),
            mode: Nfs3Option::Some(0o600),
            ..Default::default()
        };
        c.setattr(&SETATTR3args {
            object: f.clone(),
            new_attributes: set,
            guard: Nfs3Option::None,
        })
        .await
        .unwrap()
        .unwrap();
        let a = s.store.getattr(ino, None).unwrap();
        assert_eq!((a.size, a.perm), (1000, 0o600));
        assert_eq!(read_all(&mut c, &f).await, data[..1000]);
        // Extend with a hole.
        let set = sattr3 {
            size: Nfs3Option::Some(5000),
            ..Default::default()
        };
        c.setattr(&SETATTR3args {
            object: f.clone(),
            new_attributes: set,
            guard: Nfs3Option::None,
        })
        .await
        .unwrap()
        .unwrap();
        let back = read_all(&mut c, &f).await;
        assert_eq!(back.len(), 5000);
        assert!(back[1000..].iter().all(|&b| b == 0));

        // SYMLINK + READLINK.
        let sl = SYMLINK3args {
            where_: dirop(&dfh, "link"),
            symlink: symlinkdata3 {
                symlink_attributes: sattr3::default(),
                symlink_data: nfspath3(Opaque::borrowed(b"a.bin")),
            },
        };
        let r = c.symlink(&sl).await.unwrap().unwrap();
        let lfh = match r.obj {
            Nfs3Option::Some(fh) => fh,
            Nfs3Option::None => lookup(&mut c, &dfh, "link").await.unwrap().0,
        };
        let rl = c
            .readlink(&READLINK3args { symlink: lfh })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rl.data.as_ref(), b"a.bin");
        let lino = s.store.resolve(Path::new("docs/link")).unwrap();
        assert_eq!(s.store.getattr(lino, None).unwrap().kind, FileKind::Symlink);

        // READDIRPLUS over a directory bigger than one reply, with attributes and handles.
        for i in 0..300 {
            create(&mut c, &dfh, &format!("n{i:03}"), 0o644).await;
        }
        let listed = names(&mut c, &dfh).await;
        let mut plain: Vec<&str> = listed
            .iter()
            .map(|(n, _, _)| n.as_str())
            .filter(|n| *n != "." && *n != "..")
            .collect();
        plain.sort();
        assert_eq!(plain.len(), 302, "300 files + a.bin + link, each once");
        plain.dedup();
        assert_eq!(plain.len(), 302, "no duplicates across READDIRPLUS pages");
        let (_, id, attr) = listed.iter().find(|(n, _, _)| n == "a.bin").unwrap();
        assert_eq!(*id, ino);
        assert_eq!(attr.as_ref().unwrap().size, 5000);

        // GUARDED create of an existing name fails with EXIST.
        let r = c
            .create(&CREATE3args {
                where_: dirop(&dfh, "a.bin"),
                how: createhow3::GUARDED(sattr3::default()),
            })
            .await
            .unwrap();
        assert!(matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_EXIST, _))));

        // RENAME across directories, then REMOVE and RMDIR.
        let r = c
            .rename(&RENAME3args {
                from: dirop(&dfh, "a.bin"),
                to: dirop(&root, "moved.bin"),
            })
            .await
            .unwrap();
        assert!(matches!(r, Nfs3Result::Ok(_)));
        assert_eq!(
            s.store.resolve(Path::new("moved.bin")).unwrap(),
            ino,
            "rename keeps the inode number"
        );
        assert_eq!(
            lookup(&mut c, &dfh, "a.bin").await.unwrap_err(),
            nfsstat3::NFS3ERR_NOENT
        );
        let r = c
            .rmdir(&RMDIR3args {
                object: dirop(&root, "docs"),
            })
            .await
            .unwrap();
        assert!(
            matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_NOTEMPTY, _))),
            "{r:?}"
        );
        for (n, _, _) in names(&mut c, &dfh).await {
            if n != "." && n != ".." {
                c.remove(&REMOVE3args {
                    object: dirop(&dfh, &n),
                })
                .await
                .unwrap()
                .unwrap();
            }
        }
        c.rmdir(&RMDIR3args {
            object: dirop(&root, "docs"),
        })
        .await
        .unwrap()
        .unwrap();
        c.remove(&REMOVE3args {
            object: dirop(&root, "moved.bin"),
        })
        .await
        .unwrap()
        .unwrap();
        assert!(s.store.resolve(Path::new("docs")).is_err());
        assert!(s.store.resolve(Path::new("moved.bin")).is_err());

        // Bad names are refused, not passed to the store.
        let r = c
            .create(&CREATE3args {
                where_: dirop(&root, "a/b"),
                how: createhow3::UNCHECKED(sattr3::default()),
            })
            .await
            .unwrap();
        assert!(matches!(r, Nfs3Result::Err((nfsstat3::NFS3ERR_INVAL, _))));
        // LINK: answered by kaiso itself (the protocol crate has no LINK).
        let g = create(&mut c, &root, "g", 0o644).await;
        let r = c
            .link(&LINK3args {
                file: g,
                link: dirop(&root, "g2"),
            })
            .await
            .unwrap()
            .unwrap();
        let Nfs3Option::Some(fa) = r.file_attributes else {
            panic!("LINK reply without attributes")
        };
        assert_eq!(fa.nlink, 2);
        assert_eq!(
            s.store.resolve(Path::new("g")).unwrap(),
            s.store.resolve(Path::new("g2")).unwrap()
        );
    });
}

/// A migration source that takes 1.5 s to deliver any range (a slow old server).
struct SlowSource {
    calls: AtomicUsize,
    data: Vec<u8>,
}

impl StubFiller for SlowSource {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        store.stub_dir_listed(ino)
    }
    fn fill_range(
        &self,
        store: &Store,
        ino: Ino,
        _path: &Path,
        _offset: u64,
        _len: u64,
    ) -> FsResult<()> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1500));
        store.stub_write(ino, 0, &self.data)
    }
}

#[test]
fn slow_fetch_answers_jukebox_then_the_retry_gets_the_data() {
    let s = Served::start(|o| o.jukebox_after = Some(Duration::from_millis(500)));
    let data = pattern(200_000, 9);
    let source = Arc::new(SlowSource {
        calls: AtomicUsize::new(0),
        data: data.clone(),
    });
    s.store.set_stub_filler(source.clone());
    let now = SystemTime::now();
    let entry = StubEntry {
        kind: FileKind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size: data.len() as u64,
        mtime: now,
        atime: now,
        symlink_target: None,
        rdev: 0,
        unlisted: false,
    };
    s.store
        .stub_create(ROOT_INO, "remote.bin".as_ref(), &entry)
        .unwrap();
    rt().block_on(async {
        let (mut c, root) = connect(s.port()).await;
        let (fh, attr) = lookup(&mut c, &root, "remote.bin").await.unwrap();
        assert_eq!(
            attr.size,
            data.len() as u64,
            "metadata is served before the data is here"
        );
        let args = READ3args {
            file: fh.clone(),
            offset: 0,
            count: 65536,
        };
        let t0 = Instant::now();
        let first = c.read(&args).await.unwrap();
        let waited = t0.elapsed();
        assert!(
            matches!(first, Nfs3Result::Err((nfsstat3::NFS3ERR_JUKEBOX, _))),
            "first reply: {first:?}"
        );
        assert!(
            waited >= Duration::from_millis(450),
            "JUKEBOX only after the 0.5 s threshold, got {waited:?}"
        );
        // Retry like a client would (the Linux client waits 5 s; we poll faster).
        let mut got = None;
        while t0.elapsed() < Duration::from_secs(20) {
            tokio::time::sleep(Duration::from_millis(300)).await;
            match c.read(&args).await.unwrap() {
                Nfs3Result::Ok(ok) => {
                    got = Some(ok.data.as_ref().to_vec());
                    break;
                }
                Nfs3Result::Err((nfsstat3::NFS3ERR_JUKEBOX, _)) => continue,
                Nfs3Result::Err((e, _)) => panic!("retry failed: {e:?}"),
            }
        }
        assert_eq!(got.expect("data within 20 s"), data[..65536]);
        assert_eq!(
            source.calls.load(Ordering::SeqCst),
            1,
            "retries joined the fetch instead of starting it again"
        );
        assert!(s.server().jukebox_replies() >= 1);
        // Now resident: the rest reads without another fetch.
        assert_eq!(read_all(&mut c, &fh).await, data);
        assert_eq!(source.calls.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn clients_outside_the_allow_list_are_disconnected() {
    let s = Served::start(|o| o.allow = "127.0.0.1/32".parse().unwrap());
    let port = s.port();
    rt().block_on(async {
        // 127.0.0.2 is loopback too, but not in 127.0.0.1/32.
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut stream = sock
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        // Read the socket itself: the server closes it, which shows as end of stream (no
        // request reached it yet) or as a reset (one did). `nfs3_client` is not used
        // here because it does not end a call at end of stream.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = stream.write_all(&[0x80, 0, 0, 0]).await;
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("refusal is immediate");
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "a refused client gets no RPC reply: {r:?}"
        );
        // The allowed address works.
        let (mut c, root) = connect(port).await;
        c.getattr(&GETATTR3args { object: root })
            .await
            .unwrap()
            .unwrap();
    });
    assert_eq!(s.server().stats().refused.load(Ordering::Relaxed), 1);
}

#[test]
fn busy_port_is_a_clear_error() {
    let s = Served::start(|_| {});
    let mut opts = kaiso_nfs::ServeOptions::loopback(s.port());
    opts.jukebox_after = None;
    let e = kaiso_nfs::NfsServer::start(s.store.clone(), opts)
        .err()
        .expect("second bind fails");
    let msg = format!("{e:#}");
    assert!(
        msg.contains("cannot listen on 127.0.0.1:") && msg.to_lowercase().contains("in use"),
        "{msg}"
    );
}
