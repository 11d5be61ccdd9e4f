//! The SMB source's metadata path against a real Samba: a file's EAs, descriptor and
//! streams are fetched with one compound however many threads ask (the calls and the
//! background prefetch), and a small file's read is one compound of its own.

mod common;

use std::sync::Arc;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourcePath};

const FILES: usize = 40;

fn name(i: usize) -> String {
    format!("d/f{i:03}")
}

/// A directory of files, every third with a user xattr (an SMB EA).
fn tree(root: &std::path::Path) -> Vec<Vec<u8>> {
    std::fs::create_dir(root.join("d")).unwrap();
    (0..FILES)
        .map(|i| {
            let data = common::content(i as u64, 1000 + i * 3000);
            let p = root.join(name(i));
            std::fs::write(&p, &data).unwrap();
            if i % 3 == 0 {
                common::set_xattr(&p, "user.tag", format!("v{i}").as_bytes());
            }
            data
        })
        .collect()
}

/// Every file's metadata (from several threads at once) and content, checked.
fn check_all(source: &Arc<SmbSource>, data: &[Vec<u8>]) {
    let entries = source.read_dir(&SourcePath::parse(b"d").unwrap()).unwrap();
    assert_eq!(entries.len(), FILES);
    std::thread::scope(|s| {
        for t in 0..4 {
            let source = source.clone();
            s.spawn(move || {
                for i in (t..FILES).step_by(4) {
                    let p = SourcePath::parse(name(i).as_bytes()).unwrap();
                    let eas = source.xattrs(&p).unwrap();
                    if i % 3 == 0 {
                        assert_eq!(
                            eas,
                            vec![(b"user.tag".to_vec(), format!("v{i}").into_bytes())],
                            "EAs of {p}"
                        );
                    } else {
                        assert!(eas.is_empty(), "EAs of {p}: {eas:?}");
                    }
                    let acl = source.acl(&p).unwrap();
                    assert!(acl.nt_security_descriptor.is_some_and(|sd| sd.len() > 20));
                    assert!(source.streams(&p).unwrap().is_empty(), "streams of {p}");
                }
            });
        }
    });
    for (i, want) in data.iter().enumerate() {
        let p = SourcePath::parse(name(i).as_bytes()).unwrap();
        let mut buf = vec![0u8; want.len() + 10];
        let (n, attr) = source.read_into(&p, 0, &mut buf).unwrap();
        assert!(n == want.len() && buf[..n] == want[..], "content of {p}");
        assert_eq!(attr.map(|a| a.size), Some(want.len() as u64), "size of {p}");
    }
}

#[test]
fn smb_metadata_is_fetched_once_and_a_small_read_is_one_compound() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let data = tree(share.path());
    let server = common::Samba::start(share.path());
    let source = Arc::new(SmbSource::connect(server.config()).expect("connect"));
    check_all(&source, &data);
    let stats = source.stats();
    // Three calls per file plus a prefetch job per file: one metadata compound each (the
    // connect's query of the share's file system is not a metadata fetch), and each
    // file's read one CREATE+READ+QUERY_INFO+CLOSE compound.
    assert_eq!(stats.metadata_fetches, FILES as u64, "{stats:?}");
    assert_eq!(stats.reads_compound, FILES as u64, "{stats:?}");
    assert_eq!(stats.reads_opened, 0, "{stats:?}");
    // A round trip for the listing, at most one per file for its metadata, one per read.
    assert!(
        stats.round_trips <= 1 + 2 * FILES as u64,
        "{} round trips: {stats:?}",
        stats.round_trips
    );
    // A second look asks the server again (answers are used once): a read is another
    // compound, a metadata call fetches anew.
    let p = SourcePath::parse(name(0).as_bytes()).unwrap();
    assert_eq!(source.read(&p, 0, 10).unwrap(), data[0][..10]);
    assert_eq!(source.xattrs(&p).unwrap().len(), 1);
    assert_eq!(source.read(&p, 0, 10).unwrap(), data[0][..10]);
    let after = source.stats();
    assert_eq!(
        after.metadata_fetches,
        stats.metadata_fetches + 1,
        "{after:?}"
    );
    assert_eq!(after.reads_compound, stats.reads_compound + 2, "{after:?}");
    assert_eq!(after.reads_opened, 0, "{after:?}");
}

#[test]
fn smb_many_callers_of_one_file_share_one_fetch() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::write(share.path().join("one"), b"x").unwrap();
    common::set_xattr(&share.path().join("one"), "user.k", b"v");
    let server = common::Samba::start(share.path());
    let source = Arc::new(SmbSource::connect(server.config()).expect("connect"));
    let p = SourcePath::parse(b"one").unwrap();
    // Eight threads ask for the three answers at once, without a listing first.
    std::thread::scope(|s| {
        for t in 0..8 {
            let (source, p) = (source.clone(), p.clone());
            s.spawn(move || match t % 3 {
                0 => assert_eq!(source.xattrs(&p).unwrap().len(), 1),
                1 => assert!(source.acl(&p).unwrap().owner_sid.is_some()),
                _ => assert!(source.streams(&p).unwrap().is_empty()),
            });
        }
    });
    // Each answer is handed out once and a fetch answers one call of each kind: three
    // calls for the EAs need three fetches, and the other calls share them (each asking
    // on its own would be eight).
    let n = source.stats().metadata_fetches;
    assert!((3..=5).contains(&n), "{n} fetches");
}
