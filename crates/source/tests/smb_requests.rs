//! What the SMB source's crawl-shaped calls cost in requests, against a real Samba: one
//! listing, every file's metadata, then every file's data in 10 MiB units (the order of
//! a metadata-first crawl). Requests are counted by kind, so a change that adds a
//! request per file (a second open, a query nobody needs) fails here.

mod common;

use kaiso_source::SmbSource;
use kaiso_source::smb::SmbStats;
use kaiso_store::migrate::{Source, SourcePath};

/// Small files in the directory, every fourth with an EA.
const FILES: usize = 12;
/// The migration engine's default unit.
const UNIT: usize = 10 << 20;
/// A file of two and a half units.
const BIG: usize = 25 << 20;

fn since(a: SmbStats, b: SmbStats) -> SmbStats {
    SmbStats {
        metadata_fetches: a.metadata_fetches - b.metadata_fetches,
        reads_on_kept_handles: a.reads_on_kept_handles - b.reads_on_kept_handles,
        reads_opened: a.reads_opened - b.reads_opened,
        reads_continued: a.reads_continued - b.reads_continued,
        creates: a.creates - b.creates,
        queries: a.queries - b.queries,
        listings: a.listings - b.listings,
        reads: a.reads - b.reads,
        closes: a.closes - b.closes,
    }
}

#[test]
fn smb_requests_per_file_of_a_crawl() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(share.path().join("d")).unwrap();
    let mut files: Vec<(String, Vec<u8>)> = (0..FILES)
        .map(|i| {
            (
                format!("f{i:02}"),
                common::content(i as u64, 500 + i * 1000),
            )
        })
        .collect();
    files.push(("big".into(), common::content(99, BIG)));
    for (i, (name, data)) in files.iter().enumerate() {
        let p = share.path().join("d").join(name);
        std::fs::write(&p, data).unwrap();
        if i % 4 == 0 && i < FILES {
            common::set_xattr(&p, "user.tag", b"v");
        }
    }
    let server = common::Samba::start(share.path());
    let source = SmbSource::connect(server.config()).expect("connect");
    let before = source.stats();
    let dir = SourcePath::parse(b"d").unwrap();
    let (entries, dir_attr) = source.read_dir_with_attr(&dir).unwrap();
    assert_eq!(entries.len(), files.len());
    assert!(dir_attr.is_some());
    let path = |name: &str| dir.join(name.as_bytes()).unwrap();
    // Metadata pass.
    for (i, (name, _)) in files.iter().enumerate() {
        let p = path(name);
        let eas = source.xattrs(&p).unwrap();
        assert_eq!(
            eas.len(),
            usize::from(i % 4 == 0 && i < FILES),
            "EAs of {p}"
        );
        assert!(source.acl(&p).unwrap().owner_sid.is_some(), "owner of {p}");
        assert!(source.streams(&p).unwrap().is_empty(), "streams of {p}");
    }
    // Data pass, unit by unit, with the attributes the engine compares with the listing.
    let mut read_calls = 0u64;
    for (name, data) in &files {
        let p = path(name);
        let mut off = 0;
        while off < data.len() {
            let mut buf = vec![0u8; UNIT.min(data.len() - off)];
            let (n, attr) = source.read_into(&p, off as u64, &mut buf).unwrap();
            read_calls += 1;
            assert_eq!(n, buf.len(), "bytes of {p} at {off}");
            assert!(buf == data[off..off + n], "content of {p} at {off}");
            assert_eq!(attr.map(|a| a.size), Some(data.len() as u64), "size of {p}");
            off += n;
        }
    }
    let s = since(source.stats(), before);
    let n = files.len() as u64;
    assert_eq!(s.listings, 1, "{s:?}");
    // One open for the directory and one per file: the metadata fetch's handle serves
    // the file's first unit, and each unit's handle the next one.
    assert_eq!(s.creates, 1 + n, "{s:?}");
    assert_eq!(s.metadata_fetches, n, "{s:?}");
    assert_eq!(s.reads_on_kept_handles, n, "{s:?}");
    assert_eq!(s.reads_continued, (BIG.div_ceil(UNIT) - 1) as u64, "{s:?}");
    assert_eq!(s.reads_opened, 0, "{s:?}");
    // A READ per MiB (one for each small file).
    assert_eq!(s.reads, FILES as u64 + (BIG >> 20) as u64, "{s:?}");
    // The directory's attributes, EAs and descriptor; per file its descriptor, its EAs
    // only where the listing shows some, and the stream list where the share has
    // streams; per read call the attributes, asked together with its last READ. A file
    // whose "no EAs" from the listing was handed out before its fetch started has its
    // EAs asked again by that fetch (it cannot tell): at most one more per file.
    let eas = FILES.div_ceil(4) as u64;
    let least = 3 + n + eas + read_calls;
    assert!(
        (least..=least + 2 * n).contains(&s.queries),
        "{} queries, expected {least} (+{n} stream lists, +{n} EA lists at most): {s:?}",
        s.queries
    );
    // Every handle is closed once nothing more is read from it.
    assert_eq!(s.closes, s.creates, "{s:?}");
}
