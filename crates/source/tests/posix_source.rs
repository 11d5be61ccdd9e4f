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

/// The access time of `p` (nanosecond resolution), symlinks not followed.
fn atime(p: &std::path::Path) -> std::time::SystemTime {
    std::fs::symlink_metadata(p).unwrap().accessed().unwrap()
}

/// Sets the access time of `p` (a file or directory) to `t`, leaving its mtime alone.
fn set_atime(p: &std::path::Path, t: std::time::SystemTime) {
    let f = std::fs::File::open(p).unwrap();
    f.set_times(std::fs::FileTimes::new().set_accessed(t))
        .unwrap();
}

/// Reading a file and listing a directory through the POSIX source leave their access
/// times as they were (O_NOATIME), also for a file the reader neither owns nor has
/// CAP_FOWNER for (O_NOATIME refused with EPERM: the open falls back and still reads).
#[test]
fn posix_source_reads_leave_atimes_alone() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    let file = sub.join("data");
    std::fs::write(&file, common::content(5, 10_000)).unwrap();
    std::fs::write(sub.join("other"), b"x").unwrap();
    // A year before the file's mtime: any atime update (relatime included) moves it.
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_600_000_000);

    // Does this file system record atimes at all? A plain read tells.
    set_atime(&file, old);
    std::fs::read(&file).unwrap();
    if atime(&file) == old {
        eprintln!(
            "skipped: {} does not update atimes on read (mounted noatime?)",
            dir.path().display()
        );
        return;
    }

    let source = PosixSource::open(dir.path()).expect("open");
    let data_path = SourcePath::parse(b"sub/data").unwrap();
    set_atime(&file, old);
    set_atime(&sub, old);
    assert!(source.read(&data_path, 0, 20_000).unwrap() == common::content(5, 10_000));
    let names: Vec<_> = source
        .read_dir(&SourcePath::parse(b"sub").unwrap())
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert_eq!(atime(&file), old, "read moved the file's atime");
    assert_eq!(atime(&sub), old, "listing moved the directory's atime");

    // Not the owner and no CAP_FOWNER (a thread whose fs uid is "nobody"; setfsuid is
    // per thread and drops CAP_FOWNER): O_NOATIME is refused, the read still works.
    if unsafe { libc::geteuid() } == 0 {
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let fresh = PosixSource::open(dir.path()).expect("open");
        let read = std::thread::scope(|s| {
            s.spawn(|| {
                unsafe { libc::setfsuid(65534) };
                let r = fresh.read(&data_path, 0, 20_000);
                let l = fresh.read_dir(&SourcePath::parse(b"sub").unwrap());
                unsafe { libc::setfsuid(0) };
                (r, l)
            })
            .join()
            .unwrap()
        });
        assert!(read.0.expect("read without O_NOATIME") == common::content(5, 10_000));
        assert_eq!(read.1.expect("listing without O_NOATIME").len(), 2);
    }
}
