//! The NFSv3 source against a real nfs-ganesha (FSAL_VFS) started by the test, with
//! libnfs-utils (nfs-ls, nfs-cat) as an independent client to cross-check the server.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use kaiso_source::{NfsConfig, NfsSource};
use kaiso_store::migrate::{Source, SourceErrorKind, SourcePath};

#[test]
fn nfs_source_against_ganesha() {
    if !common::have(&["ganesha.nfsd", "rpcbind", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let export = tempfile::tempdir().expect("tempdir");
    common::build_tree(export.path());
    let server = common::Ganesha::start(export.path());

    // Independent client: Ganesha::start already waited until libnfs's nfs-ls could
    // mount and list the export, so the server really serves it.
    let source = NfsSource::connect(server.config()).expect("connect to ganesha");
    let n = common::check_exact(&source, export.path());
    assert!(n > 60, "only {n} objects checked");

    // Non-UTF-8 names are opaque bytes in NFSv3 and round-trip.
    let odd = SourcePath::root().join(common::NON_UTF8_NAME).unwrap();
    assert_eq!(source.read(&odd, 0, 100).unwrap(), b"latin-1 name");
    assert!(source.describe().starts_with("nfs://127.0.0.1:"));

    // A 10 MiB-class fetch is served as 1 MiB READs in flight on several connections.
    let sparse = SourcePath::parse(b"sparse.img").unwrap();
    let t = Instant::now();
    let data = source.read(&sparse, 0, 20 << 20).unwrap();
    eprintln!("NFS read of 20 MiB in {:?}", t.elapsed());
    assert_eq!(data.len(), 20 << 20);
    assert_eq!(&data[..4096], &common::content(77, 4096)[..]);
    assert_eq!(
        &data[15 << 20..(15 << 20) + 5000],
        &common::content(78, 5000)[..]
    );
    assert!(
        data[4096..15 << 20].iter().all(|b| *b == 0),
        "hole reads as zeros"
    );

    // Concurrent callers share the pool.
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    let p = SourcePath::parse(b"a/b/c/big.bin").unwrap();
                    source.read(&p, 0, 4 << 20).unwrap()
                })
            })
            .collect();
        let want = std::fs::read(export.path().join("a/b/c/big.bin")).unwrap();
        for h in hs {
            assert!(h.join().unwrap() == want);
        }
    });

    // READDIRPLUS brings the directory's own attributes along (no GETATTR per listing).
    let (_, own) = source
        .read_dir_with_attr(&SourcePath::parse(b"a").unwrap())
        .unwrap();
    assert_eq!(
        own.map(|a| a.ino),
        Some(std::fs::metadata(export.path().join("a")).unwrap().ino())
    );

    // A directory inside the export migrated as the share: its paths are relative to it.
    let mut cfg = server.config();
    cfg.subdir = Some("a/b".into());
    let sub = NfsSource::connect(cfg).expect("connect to a subdirectory of the export");
    assert!(
        sub.describe().ends_with("?subdir=a/b"),
        "{}",
        sub.describe()
    );
    let n = common::check_exact(&sub, &export.path().join("a/b"));
    assert!(n > 2, "only {n} objects checked below a/b");
    let mut cfg = server.config();
    cfg.subdir = Some("no/such/dir".into());
    let e = NfsSource::connect(cfg).err().expect("missing subdirectory");
    assert_eq!(e.kind, SourceErrorKind::NotFound, "{e}");

    // Permission denied for an unprivileged AUTH_UNIX identity on a 0600 root file.
    let mut cfg = server.config();
    cfg.uid = 65534;
    cfg.gid = 65534;
    let nobody = NfsSource::connect(cfg).expect("connect as nobody");
    let e = nobody
        .read(&SourcePath::parse(b"secret").unwrap(), 0, 10)
        .unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::PermissionDenied, "{e}");
    assert_eq!(
        nobody
            .read(&SourcePath::parse(b"tiny.txt").unwrap(), 0, 10)
            .unwrap()
            .len(),
        1
    );

    // A source that changes although it should be read-only: a vanished file is reported.
    let gone = SourcePath::parse(b"a/b/c/d/deep.txt").unwrap();
    source.stat(&gone).unwrap();
    std::fs::remove_file(export.path().join("a/b/c/d/deep.txt")).unwrap();
    let e = source.read(&gone, 0, 10).unwrap_err();
    assert!(
        matches!(e.kind, SourceErrorKind::Changed | SourceErrorKind::NotFound),
        "{e}"
    );

    // Ports found through a portmapper (GETPORT for MOUNT v3 and NFS v3 over TCP, then
    // MNT, all over the source's own RPC code). The shared rpcbind may hold another test's
    // ganesha registrations, so a portmapper answering with this server's ports stands in.
    let pmap = PortmapperFor::start(server.mount_port, server.nfs_port);
    let mut cfg = server.config();
    cfg.mount_port = None;
    cfg.nfs_port = None;
    cfg.portmapper_port = pmap.port;
    let via_pmap = NfsSource::connect(cfg).expect("connect through the portmapper");
    assert!(
        via_pmap
            .describe()
            .starts_with(&format!("nfs://127.0.0.1:{}", server.nfs_port)),
        "{}",
        via_pmap.describe()
    );
    assert_eq!(via_pmap.read(&odd, 0, 100).unwrap(), b"latin-1 name");
    assert_eq!(pmap.asked(), vec![(100_005, 3, 6), (100_003, 3, 6)]);

    // Wrong export name and unreachable server give clear errors.
    let mut bad = server.config();
    bad.export = "/no/such/export".into();
    let e = NfsSource::connect(bad).err().expect("bad export");
    assert!(
        matches!(
            e.kind,
            SourceErrorKind::PermissionDenied
                | SourceErrorKind::Unreachable
                | SourceErrorKind::NotFound
        ),
        "{e}"
    );
    drop(server);
    let mut dead = NfsConfig::new("127.0.0.1", "/kaiso_src");
    dead.nfs_port = Some(common::free_port());
    dead.mount_port = Some(common::free_port());
    let e = NfsSource::connect(dead).err().expect("nothing listens");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
}

/// A portmapper (RFC 1833 version 2, TCP) that answers GETPORT from a fixed table
/// (MOUNT and NFS to the given ports, anything else 0: not registered) and records the
/// (program, version, protocol) asked for.
struct PortmapperFor {
    port: u16,
    asked: std::sync::Arc<std::sync::Mutex<Vec<(u32, u32, u32)>>>,
}

impl PortmapperFor {
    fn start(mount_port: u16, nfs_port: u16) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        // One connection (the source asks both questions on it), then the thread ends.
        std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            let word = |b: &[u8], i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
            loop {
                let mut mark = [0u8; 4];
                if conn.read_exact(&mut mark).is_err() {
                    return;
                }
                let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
                let mut call = vec![0u8; len];
                conn.read_exact(&mut call).unwrap();
                // xid, CALL, rpcvers, prog, vers, proc, then credential and verifier.
                let (xid, proc) = (word(&call, 0), word(&call, 20));
                assert_eq!(
                    (word(&call, 12), word(&call, 16), proc),
                    (100_000, 2, 3),
                    "portmapper v2 GETPORT"
                );
                let cred_len = word(&call, 28) as usize;
                let verf_at = 32 + cred_len.div_ceil(4) * 4;
                let args = verf_at + 8 + (word(&call, verf_at + 4) as usize).div_ceil(4) * 4;
                let (prog, vers, prot) = (
                    word(&call, args),
                    word(&call, args + 4),
                    word(&call, args + 8),
                );
                log.lock().unwrap().push((prog, vers, prot));
                let answer = match (prog, vers, prot) {
                    (100_005, 3, 6) => u32::from(mount_port),
                    (100_003, 3, 6) => u32::from(nfs_port),
                    _ => 0,
                };
                let mut reply = Vec::new();
                for w in [0x8000_0000 | 28, xid, 1, 0, 0, 0, 0, answer] {
                    reply.extend_from_slice(&u32::to_be_bytes(w));
                }
                conn.write_all(&reply).unwrap();
            }
        });
        Self { port, asked }
    }

    fn asked(&self) -> Vec<(u32, u32, u32)> {
        self.asked.lock().unwrap().clone()
    }
}
