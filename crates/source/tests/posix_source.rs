//! The POSIX-path source against a generated tree on the local file system.

mod common;

use kaiso_source::PosixSource;
use kaiso_store::migrate::{Source, SourceErrorKind, SourcePath};

#[test]
fn posix_source_returns_exactly_what_is_on_disk() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::build_tree(dir.path());
    let source = PosixSource::open(dir.path()).expect("open");
    let n = common::check_exact(&source, dir.path());
    assert!(n > 60, "only {n} objects checked");

    // xattrs and ACLs, byte for byte.
    let tiny = SourcePath::parse(b"tiny.txt").unwrap();
    assert_eq!(
        source.xattrs(&tiny).unwrap(),
        vec![(b"user.color".to_vec(), b"blue".to_vec())]
    );
    let page = SourcePath::parse(b"a/page").unwrap();
    let x = source.xattrs(&page).unwrap();
    assert_eq!(
        x,
        vec![(b"user.kaiso.test".to_vec(), common::content(9, 300))]
    );
    if common::have(&["setfacl"]) {
        let acl = source.acl(&page).unwrap();
        assert!(acl.posix_access.is_some(), "extended ACL of a/page");
        let b = source.acl(&SourcePath::parse(b"a/b").unwrap()).unwrap();
        assert!(b.posix_default.is_some(), "default ACL of a/b");
    }
    assert!(source.acl(&tiny).unwrap().is_empty());

    // The non-UTF-8 name round-trips as bytes.
    let odd = SourcePath::root().join(common::NON_UTF8_NAME).unwrap();
    assert_eq!(source.read(&odd, 0, 100).unwrap(), b"latin-1 name");

    // A FIFO is listed but never opened for reading (that would block).
    let fifo = SourcePath::parse(b"fifo").unwrap();
    assert_eq!(
        source.read(&fifo, 0, 10).unwrap_err().kind,
        SourceErrorKind::WrongKind
    );

    // Symlinks are not followed on the way to a path.
    let through_link = SourcePath::parse(b"a/to-tiny").unwrap();
    assert_eq!(
        source.read(&through_link, 0, 10).unwrap_err().kind,
        SourceErrorKind::WrongKind
    );
}

#[test]
fn posix_source_reports_missing_root_and_permission_denied() {
    let e = PosixSource::open("/nonexistent/kaiso/source")
        .err()
        .expect("missing root");
    assert_eq!(e.kind, SourceErrorKind::NotFound);

    // Permission denied is only observable as a non-root user: drop privileges in a child.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("secret"), b"x").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        dir.path().join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    if unsafe { libc::geteuid() } == 0 {
        let source = PosixSource::open(dir.path()).expect("open");
        // Run the read on a thread whose fs uid is "nobody" (setfsuid is per thread).
        let kind = std::thread::scope(|s| {
            s.spawn(|| {
                unsafe { libc::setfsuid(65534) };
                let r = source.read(&SourcePath::parse(b"secret").unwrap(), 0, 1);
                unsafe { libc::setfsuid(0) };
                r.unwrap_err().kind
            })
            .join()
            .unwrap()
        });
        assert_eq!(kind, SourceErrorKind::PermissionDenied);
    }
}
