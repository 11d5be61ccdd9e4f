//! Round trips per file on the NFS source's data path, counted against a real
//! nfs-ganesha: a listed file readable by everyone costs its READs only (no ACCESS), a
//! file whose mode bits do not grant read to everyone still gets its ACCESS check (and a
//! denial for an identity that may not read it), and a file never listed is looked up.

mod common;

use std::os::unix::fs::PermissionsExt;

use kaiso_source::NfsSource;
use kaiso_source::nfs::NfsCallCounts;
use kaiso_store::migrate::{Source, SourceErrorKind, SourcePath};

#[test]
fn a_listed_world_readable_file_costs_its_reads_only() {
    if !common::have(&["ganesha.nfsd", "rpcbind"]) {
        return;
    }
    let export = tempfile::tempdir().expect("tempdir");
    let mode_of = |i: usize| match i % 4 {
        0 => 0o600,
        1 => 0o640,
        _ => 0o644,
    };
    let files = 8;
    for i in 0..files {
        let p = export.path().join(format!("f{i}"));
        std::fs::write(&p, common::content(i as u64, 1000 + i)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode_of(i))).unwrap();
    }
    std::fs::create_dir(export.path().join("sub")).unwrap();
    std::fs::write(export.path().join("sub/unlisted"), b"abc").unwrap();
    let server = common::Ganesha::start(export.path());
    let source = NfsSource::connect(server.config()).expect("connect to ganesha");
    assert_eq!(source.call_counts(), NfsCallCounts::default());

    let (entries, _) = source.read_dir_with_attr(&SourcePath::root()).unwrap();
    assert_eq!(entries.len(), files + 1);
    let listed = source.call_counts();
    assert_eq!(listed.readdirplus, 1, "{listed:?}");

    for i in 0..files {
        let path = SourcePath::parse(format!("f{i}").as_bytes()).unwrap();
        let mut buf = vec![0u8; 64 << 10];
        let (n, attr) = source.read_into(&path, 0, &mut buf).unwrap();
        assert_eq!(n, 1000 + i);
        assert_eq!(buf[..n], common::content(i as u64, n)[..]);
        assert!(attr.is_some(), "post-op attributes");
        // A second read of the same file asks ACCESS no more.
        source.read_into(&path, 0, &mut buf[..10]).unwrap();
    }
    let after = source.call_counts();
    let not_for_everyone = (0..files).filter(|i| mode_of(*i) != 0o644).count() as u64;
    assert_eq!(after.read - listed.read, 2 * files as u64, "{after:?}");
    assert_eq!(
        after.access - listed.access,
        not_for_everyone,
        "ACCESS only for files whose mode does not grant read to everyone: {after:?}"
    );
    assert_eq!(
        (after.lookup, after.getattr),
        (0, 0),
        "handles and attributes came with the listing: {after:?}"
    );

    // Never listed (its directory's handle came with the root's listing): one LOOKUP,
    // and checked with ACCESS.
    let unlisted = SourcePath::parse(b"sub/unlisted").unwrap();
    assert_eq!(source.read(&unlisted, 0, 10).unwrap(), b"abc");
    let last = source.call_counts();
    assert_eq!(last.lookup - after.lookup, 1, "{last:?}");
    assert_eq!(last.access - after.access, 1, "{last:?}");

    // An identity the mode bits do not let read a 0600 root file is still refused after
    // a listing (its ACCESS check is not skipped), while a 0644 file reads.
    let mut cfg = server.config();
    cfg.uid = 65534;
    cfg.gid = 65534;
    let nobody = NfsSource::connect(cfg).expect("connect as nobody");
    nobody.read_dir(&SourcePath::root()).unwrap();
    let e = nobody
        .read(&SourcePath::parse(b"f0").unwrap(), 0, 10)
        .unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::PermissionDenied, "{e}");
    assert_eq!(
        nobody
            .read(&SourcePath::parse(b"f2").unwrap(), 0, 10)
            .unwrap()
            .len(),
        10
    );
    assert_eq!(nobody.call_counts().access, 1, "{:?}", nobody.call_counts());

    // The identity is the root's file handle: the same for every connection to this
    // export (another identity or port alike), another for a subdirectory.
    let id = source
        .identity()
        .expect("an NFS source knows its root's handle");
    assert!(
        id.starts_with("nfs-fh:") && id.len() > "nfs-fh:".len() + 8,
        "{id}"
    );
    assert_eq!(nobody.identity().as_deref(), Some(id.as_str()));
    let mut cfg = server.config();
    cfg.subdir = Some("sub".into());
    let sub = NfsSource::connect(cfg).expect("connect to sub");
    let sub_id = sub.identity().expect("identity of sub");
    assert_ne!(sub_id, id);
}
