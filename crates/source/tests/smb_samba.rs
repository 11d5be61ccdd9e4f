//! The SMB source against a real Samba smbd started by the test, with smbclient as an
//! independent client (it also writes the alternate data stream).

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{FileKind, Source, SourceErrorKind, SourcePath};

#[test]
fn smb_source_against_samba() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    common::build_tree(share.path());
    let server = common::Samba::start(share.path());

    // An alternate data stream written by the real client.
    let local = share.path().join("../kaiso-ads-payload");
    // streams_xattr keeps a stream in one xattr: on ext4 without ea_inode a value must
    // fit in a 4 KiB block (a 70 KB stream fails with NT_STATUS_FILE_SYSTEM_LIMITATION).
    let payload = common::content(4242, 3_500);
    std::fs::write(&local, &payload).unwrap();
    server.smbclient(&format!("put {} tiny.txt:extra", local.display()));
    std::fs::remove_file(&local).unwrap();
    assert!(
        server.smbclient("allinfo tiny.txt").contains(":extra"),
        "smbclient sees the stream"
    );

    // The DOS read-only attribute, set the way a Windows client sets it (Samba keeps it
    // in its DOS attribute xattr; Unix mode 0444 alone does not set it).
    server.smbclient("setmode ro.txt +r");

    let source = SmbSource::connect(server.config()).expect("connect to samba");
    let root = share.path();

    // Every entry with a valid UTF-8 name is listed; Samba hides the latin-1 name.
    let disk = common::walk(root);
    let mut checked = 0;
    for (rel, m) in &disk {
        let sp = SourcePath::parse(rel).unwrap();
        let parent = sp.parent().unwrap();
        let listed = source
            .read_dir(&parent)
            .unwrap_or_else(|e| panic!("read_dir {parent}: {e}"));
        let entry = listed
            .iter()
            .find(|e| Some(e.name.as_slice()) == sp.file_name());
        if std::str::from_utf8(rel).is_err() {
            assert!(entry.is_none(), "Samba shows a non-UTF-8 name?");
            continue;
        }
        let kind = common::kind_of(m);
        if kind == FileKind::Symlink {
            // Samba follows links: a dangling one is not shown, a good one shows its target.
            if std::fs::metadata(root.join(OsStr::from_bytes(rel))).is_err() {
                assert!(entry.is_none(), "dangling symlink {sp} listed");
            } else {
                assert_eq!(
                    entry.expect("followed symlink listed").attr.kind,
                    FileKind::Regular
                );
            }
            continue;
        }
        let entry = entry.unwrap_or_else(|| panic!("{sp} not listed"));
        let attr = source
            .stat(&sp)
            .unwrap_or_else(|e| panic!("stat {sp}: {e}"));
        for a in [&entry.attr, &attr] {
            let want_kind = if kind == FileKind::Directory {
                FileKind::Directory
            } else {
                FileKind::Regular
            };
            assert_eq!(a.kind, want_kind, "kind of {sp}");
            if kind == FileKind::Regular {
                assert_eq!(a.size, m.size(), "size of {sp}");
            }
            assert_eq!(a.mtime.secs, m.mtime(), "mtime of {sp}");
            // FILETIME has 100 ns resolution.
            assert_eq!(
                a.mtime.nanos / 100,
                m.mtime_nsec() as u32 / 100,
                "mtime ns of {sp}"
            );
            assert!(a.dos_attributes.is_some());
        }
        // Samba reports NumberOfLinks 1 for every directory (Windows semantics).
        let want_nlink = if kind == FileKind::Directory {
            1
        } else {
            m.nlink()
        };
        assert_eq!(attr.nlink as u64, want_nlink, "nlink of {sp} (stat)");
        assert_eq!(entry.attr.ino, attr.ino, "file id of {sp}: listing vs stat");
        if kind == FileKind::Regular {
            let want = std::fs::read(root.join(OsStr::from_bytes(rel))).unwrap();
            let got = source
                .read(&sp, 0, want.len() + 100)
                .unwrap_or_else(|e| panic!("read {sp}: {e}"));
            assert!(got == want, "content of {sp}");
        }
        checked += 1;
    }
    // Everything but the two symlinks and the non-UTF-8 name was checked in full.
    assert_eq!(checked, disk.len() - 3, "objects checked");
    // Hard links share a file id.
    let a = source
        .stat(&SourcePath::parse(b"a/linked").unwrap())
        .unwrap();
    let b = source
        .stat(&SourcePath::parse(b"a/b/linked-too").unwrap())
        .unwrap();
    assert_eq!((a.ino, a.nlink), (b.ino, 2));
    // Read-only DOS attribute from mode 0444.
    assert_eq!(
        source
            .stat(&SourcePath::parse(b"ro.txt").unwrap())
            .unwrap()
            .perm
            & 0o222,
        0
    );

    // EAs (user.* xattrs), the security descriptor, and the alternate data stream.
    let tiny = SourcePath::parse(b"tiny.txt").unwrap();
    let eas = source.xattrs(&tiny).unwrap();
    assert!(
        eas.contains(&(b"user.color".to_vec(), b"blue".to_vec())),
        "EAs: {eas:?}"
    );
    let acl = source.acl(&tiny).unwrap();
    assert!(
        acl.nt_security_descriptor
            .as_ref()
            .is_some_and(|sd| sd.len() > 20)
    );
    assert!(
        acl.owner_sid
            .as_deref()
            .is_some_and(|s| s.starts_with("S-1-")),
        "{acl:?}"
    );
    let streams = source.streams(&tiny).unwrap();
    assert_eq!(streams.len(), 1, "{streams:?}");
    assert_eq!(
        (streams[0].name.as_str(), streams[0].size),
        ("extra", payload.len() as u64)
    );
    assert_eq!(
        source.read_stream(&tiny, "extra", 0, 1 << 20).unwrap(),
        payload
    );
    assert_eq!(
        source.read_stream(&tiny, "extra", 1000, 10).unwrap(),
        payload[1000..1010]
    );

    // Large read in parallel pieces, concurrent callers.
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    source
                        .read(&SourcePath::parse(b"sparse.img").unwrap(), 0, 20 << 20)
                        .unwrap()
                })
            })
            .collect();
        let want = std::fs::read(root.join("sparse.img")).unwrap();
        for h in hs {
            assert!(h.join().unwrap() == want);
        }
    });

    // Clear errors.
    assert_eq!(
        source
            .stat(&SourcePath::parse(b"no/such").unwrap())
            .unwrap_err()
            .kind,
        SourceErrorKind::NotFound
    );
    let odd = SourcePath::root().join(common::NON_UTF8_NAME).unwrap();
    assert_eq!(
        source.stat(&odd).unwrap_err().kind,
        SourceErrorKind::Invalid
    );
    let mut wrong = server.config();
    wrong.password = "wrong".into();
    assert_eq!(
        SmbSource::connect(wrong).err().expect("bad password").kind,
        SourceErrorKind::PermissionDenied
    );
    // Close the session while the server is up: the smb crate's logoff against a dead
    // server waits for its full timeout (about 2 minutes).
    drop(source);
    drop(server);
    let mut dead = kaiso_source::SmbConfig::new("127.0.0.1", "src", "root", "x");
    dead.port = common::free_port();
    assert_eq!(
        SmbSource::connect(dead)
            .err()
            .expect("nothing listens")
            .kind,
        SourceErrorKind::Unreachable
    );
}
