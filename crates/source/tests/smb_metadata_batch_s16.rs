//! The metadata fetched ahead after a listing goes out several compounds at a time on
//! one data connection (session 16): a crawl's metadata pass over SMB was bound by one
//! round trip per file on each connection (dataset (a): 2,005 compounds, about 1 s
//! before the first read), where NFS needs one READDIRPLUS per directory. Counted
//! against a real Samba: the waits for metadata replies on the data connections
//! (`SmbStats::metadata_windows`) for a directory of many files, which were one per file
//! before; every answer is still right (EAs where there are some, the descriptor, no
//! streams), the handles are kept for the reads, and no file is opened twice.

mod common;

use std::time::{Duration, Instant};

use kaiso_source::SmbSource;
use kaiso_source::smb::SmbStats;
use kaiso_store::migrate::{Source, SourcePath};

/// Files in the directory, every eighth with an EA.
const FILES: usize = 128;
/// Data connections (the workers fetching ahead, at most one per connection).
const CONNECTIONS: usize = 4;

fn path(i: usize) -> SourcePath {
    SourcePath::parse(format!("d/f{i:03}").as_bytes()).unwrap()
}

/// The counters once every file's metadata fetched ahead is in and no compound is in
/// flight (each compound's requests are counted when sent, its fetch when its replies
/// are in), at most 30 s after the listing.
fn after_prefetch(source: &SmbSource, listed_creates: u64) -> SmbStats {
    let started = Instant::now();
    loop {
        let s = source.stats();
        if s.metadata_fetches == FILES as u64 && s.creates == listed_creates + FILES as u64 {
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "expected the {FILES} files' metadata fetched ahead within 30 s of the listing: \
             {s:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn smb_metadata_fetched_ahead_goes_several_files_per_round_trip() {
    if !common::have(&["smbd", "smbpasswd"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(share.path().join("d")).unwrap();
    let data: Vec<Vec<u8>> = (0..FILES)
        .map(|i| {
            let p = share.path().join(format!("d/f{i:03}"));
            let d = common::content(i as u64, 100 + i * 37);
            std::fs::write(&p, &d).unwrap();
            if i % 8 == 0 {
                common::set_xattr(&p, "user.tag", format!("v{i}").as_bytes());
            }
            d
        })
        .collect();
    let server = common::Samba::start_read_only(share.path());
    let mut config = server.config();
    config.connections = CONNECTIONS;
    let source = SmbSource::connect(config).expect("connect");
    source.read_dir_with_attr(&SourcePath::root()).unwrap();
    let before = source.stats();
    assert_eq!(before.metadata_fetches, 0, "{before:?}");

    // The listing queues every file's metadata to be fetched ahead.
    let entries = source.read_dir(&SourcePath::parse(b"d").unwrap()).unwrap();
    assert_eq!(entries.len(), FILES);
    let listed_creates = before.creates + 1;
    let ahead = after_prefetch(&source, listed_creates);
    let windows = ahead.metadata_windows - before.metadata_windows;
    // One batch takes a share of the queue (1 to 16 files, as many as the connections
    // can share): 128 files on 4 connections need at least 8 waits and, however the
    // workers interleave, fewer than 32 (each takes at least a quarter of what is left
    // down to the last 4 files). One wait per file (128) was the behaviour before.
    assert!(
        (FILES / 16..=FILES / 4).contains(&(windows as usize)),
        "expected {}..={} waits for the {FILES} metadata compounds fetched ahead (several \
         per round trip), got {windows}: {ahead:?}",
        FILES / 16,
        FILES / 4
    );
    assert_eq!(
        ahead.kept_handles, FILES as u64,
        "a handle kept per file for its read: {ahead:?}"
    );

    // The crawl's metadata pass finds every answer waiting: no request, no round trip.
    for i in 0..FILES {
        let p = path(i);
        let eas = source.xattrs(&p).unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = if i % 8 == 0 {
            vec![(b"user.tag".to_vec(), format!("v{i}").into_bytes())]
        } else {
            Vec::new()
        };
        assert_eq!(eas, want, "EAs of {p}");
        let acl = source.acl(&p).unwrap();
        assert!(
            acl.nt_security_descriptor.is_some() && acl.owner_sid.is_some(),
            "descriptor of {p}: {acl:?}"
        );
        assert!(source.streams(&p).unwrap().is_empty(), "streams of {p}");
    }
    let described = source.stats();
    assert_eq!(
        (
            described.round_trips - ahead.round_trips,
            described.compounds - ahead.compounds,
            described.metadata_fetches,
        ),
        (0, 0, FILES as u64),
        "the metadata pass should be answered from what was fetched ahead: {described:?}"
    );

    // Each read uses its file's handle (no CREATE of its own) and gets the right bytes.
    for (i, d) in data.iter().enumerate() {
        let p = path(i);
        let mut buf = vec![0u8; d.len() + 10];
        let (n, attr) = source.read_into(&p, 0, &mut buf).unwrap();
        assert!(n == d.len() && buf[..n] == d[..], "content of {p}");
        assert_eq!(attr.map(|a| a.size), Some(d.len() as u64), "size of {p}");
    }
    let read = source.stats();
    assert_eq!(
        (
            read.creates - listed_creates,
            read.reads_on_metadata_handle,
            read.reads_reopened
        ),
        (FILES as u64, FILES as u64, 0),
        "one CREATE per file (its metadata fetch's), each read on that handle: {read:?}"
    );
}

#[test]
fn smb_a_short_queue_still_spreads_over_the_connections() {
    if !common::have(&["smbd", "smbpasswd"]) {
        return;
    }
    // Fewer files than connections: one compound per wait (no batch waits for another
    // file), each answer right.
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(share.path().join("d")).unwrap();
    for i in 0..CONNECTIONS - 1 {
        std::fs::write(share.path().join(format!("d/f{i:03}")), vec![i as u8; 10]).unwrap();
    }
    let server = common::Samba::start_read_only(share.path());
    let mut config = server.config();
    config.connections = CONNECTIONS;
    let source = SmbSource::connect(config).expect("connect");
    source.read_dir_with_attr(&SourcePath::root()).unwrap();
    let before = source.stats();
    source.read_dir(&SourcePath::parse(b"d").unwrap()).unwrap();
    let started = Instant::now();
    let s = loop {
        let s = source.stats();
        if s.metadata_fetches == (CONNECTIONS - 1) as u64
            && s.creates == before.creates + 1 + (CONNECTIONS - 1) as u64
        {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "expected {} metadata fetches ahead within 30 s: {s:?}",
            CONNECTIONS - 1
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(
        s.metadata_windows - before.metadata_windows,
        (CONNECTIONS - 1) as u64,
        "one file per wait when the queue is shorter than the connections: {s:?}"
    );
    for i in 0..CONNECTIONS - 1 {
        let mut buf = vec![0u8; 20];
        let (n, _) = source.read_into(&path(i), 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], &vec![i as u8; 10][..], "content of {}", path(i));
    }
}
