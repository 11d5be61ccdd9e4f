//! The NFS source's own READ path (replies decoded straight into the caller's buffer)
//! against a real nfs-ganesha started by the test: unaligned offsets and lengths, short
//! reads at end of file, error replies that leave the pooled connections usable, and a
//! stopped server.

mod common;

use kaiso_source::NfsSource;
use kaiso_store::migrate::{Source, SourceErrorKind, SourcePath};

#[test]
fn read_into_lands_every_byte_and_keeps_the_pool_usable() {
    if !common::have(&["ganesha.nfsd", "rpcbind"]) {
        return;
    }
    let export = tempfile::tempdir().expect("tempdir");
    // 3.5 MiB + 123 bytes: pieces of 1 MiB, a partial one and a tail not a multiple of 4.
    let size = (7 << 19) + 123;
    let want = common::content(5, size);
    std::fs::write(export.path().join("odd.bin"), &want).unwrap();
    std::fs::create_dir(export.path().join("dir")).unwrap();
    let server = common::Ganesha::start(export.path());
    let mut cfg = server.config();
    cfg.connections = 3; // fewer connections than pieces: connections are reused
    let source = NfsSource::connect(cfg).expect("connect to ganesha");
    let file = SourcePath::parse(b"odd.bin").unwrap();

    // A 10 MiB unit over a smaller file: a short read at end of file, nothing written past.
    let mut unit = vec![0xAAu8; 10 << 20];
    let (n, attr) = source.read_into(&file, 0, &mut unit).unwrap();
    assert_eq!(n, size);
    assert!(unit[..n] == want[..], "bytes differ");
    assert!(
        unit[n..].iter().all(|b| *b == 0xAA),
        "written past end of file"
    );
    let attr = attr.expect("post-op attributes of the READ replies");
    assert_eq!(attr.size, size as u64);

    // Unaligned offsets and lengths, crossing 1 MiB piece boundaries.
    for (offset, len) in [(1, 3), (1_048_575, 2), (999_999, 2_100_001), (size - 5, 5)] {
        let mut buf = vec![0u8; len];
        let (n, _) = source.read_into(&file, offset as u64, &mut buf).unwrap();
        assert_eq!(n, len, "at {offset}");
        assert!(buf == want[offset..offset + len], "at {offset} len {len}");
    }
    // At and past end of file: nothing.
    let mut buf = vec![0u8; 4096];
    assert_eq!(source.read_into(&file, size as u64, &mut buf).unwrap().0, 0);
    assert_eq!(source.read_into(&file, 1 << 40, &mut buf).unwrap().0, 0);

    // An error reply (READ of a directory) maps to its kind and leaves the pool usable.
    let dir = SourcePath::parse(b"dir").unwrap();
    for _ in 0..4 {
        let e = source.read_into(&dir, 0, &mut buf).unwrap_err();
        assert_eq!(e.kind, SourceErrorKind::WrongKind, "{e}");
    }
    assert_eq!(source.read(&file, 7, 9).unwrap(), want[7..16]);

    // A stopped server breaks the pooled connections: calls fail as unreachable, never
    // as data.
    drop(server);
    for _ in 0..4 {
        let e = source.read_into(&file, 0, &mut buf).unwrap_err();
        assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    }
}
