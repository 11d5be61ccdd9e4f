//! What the SMB source's crawl-shaped calls cost in requests, against a real Samba: one
//! listing, every file's metadata, then every file's data in 10 MiB units (the order of
//! a metadata-first crawl). Round trips (replies a call waits for) and requests are
//! counted by kind, so a change that adds a round trip or a request per file (a second
//! open, a query nobody needs, a compound split in two) fails here. A file is opened
//! once: its metadata fetch's handle is kept for its first read, and a read on such a
//! handle still reads what the path names now (a file replaced or deleted since).

mod common;

use kaiso_source::SmbSource;
use kaiso_source::smb::{SMB_DATA_READ_PIECE, SmbStats};
use kaiso_store::migrate::{Source, SourcePath};

/// Small files in the directory, every fourth with an EA.
const FILES: usize = 12;
/// The migration engine's default unit.
const UNIT: usize = 10 << 20;
/// A file of two and a half units.
const BIG: usize = 25 << 20;

fn since(a: SmbStats, b: SmbStats) -> SmbStats {
    SmbStats {
        round_trips: a.round_trips - b.round_trips,
        compounds: a.compounds - b.compounds,
        singles: a.singles - b.singles,
        metadata_fetches: a.metadata_fetches - b.metadata_fetches,
        eas_skipped: a.eas_skipped - b.eas_skipped,
        eas_asked_apart: a.eas_asked_apart - b.eas_asked_apart,
        reads_compound: a.reads_compound - b.reads_compound,
        reads_opened: a.reads_opened - b.reads_opened,
        reads_continued: a.reads_continued - b.reads_continued,
        creates: a.creates - b.creates,
        queries: a.queries - b.queries,
        listings: a.listings - b.listings,
        reads: a.reads - b.reads,
        closes: a.closes - b.closes,
        reads_direct: a.reads_direct - b.reads_direct,
        data_connections: a.data_connections - b.data_connections,
        reads_on_metadata_handle: a.reads_on_metadata_handle - b.reads_on_metadata_handle,
        reads_reopened: a.reads_reopened - b.reads_reopened,
        kept_handles: a.kept_handles,
        metadata_windows: a.metadata_windows - b.metadata_windows,
    }
}

/// The source's counters once its background CLOSEs (sent after a call returned) have
/// gone out: every handle opened is closed.
fn settled(source: &SmbSource) -> SmbStats {
    let started = std::time::Instant::now();
    loop {
        let s = source.stats();
        if s.closes >= s.creates || started.elapsed() > std::time::Duration::from_secs(10) {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
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
    // As a crawl does, the root is listed first: a directory's cycle check then knows
    // its ancestors' FileIds and asks the server for none of them.
    source.read_dir_with_attr(&SourcePath::root()).unwrap();
    let before = settled(&source);
    let dir = SourcePath::parse(b"d").unwrap();
    let (entries, dir_attr) = source.read_dir_with_attr(&dir).unwrap();
    assert_eq!(entries.len(), files.len());
    assert!(dir_attr.is_some());
    let path = |name: &str| dir.join(name.as_bytes()).unwrap();
    // The listing starts metadata prefetches in the background; one on a data connection
    // counts its requests when it sends them and its fetch when the replies are in, so a
    // snapshot taken while one is in flight does not add up (a CREATE and no fetch). Take
    // one where every metadata compound sent is counted as a fetch (at most 10 s: at the
    // latest, once all prefetches are done).
    let listed = {
        let t = std::time::Instant::now();
        let mut tries = 0;
        loop {
            tries += 1;
            let s = source.stats();
            let l = since(s, before);
            if l.compounds == l.metadata_fetches + 1 && l.creates == l.metadata_fetches + 1 {
                if tries > 1 {
                    eprintln!(
                        "snapshot after the listing: {tries} tries, {:?}",
                        t.elapsed()
                    );
                }
                break s;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "no snapshot without a metadata prefetch in flight within 10 s: {l:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
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
    let described = source.stats();
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
    let read = source.stats();
    let n = files.len() as u64;
    let units = BIG.div_ceil(UNIT) as u64;

    // The listing: one compound of CREATE, the directory's attributes and descriptor
    // (not its EAs: the root's listing said it has none), two QUERY_DIRECTORYs (the
    // second says "no more files") and CLOSE.
    // The files' metadata prefetch starts in the background right after the listing, so
    // its compounds (CREATE and 3 or 4 QUERY_INFO each, no CLOSE: the handle is kept for
    // the read) may already be counted here.
    let l = since(listed, before);
    assert_eq!(l.round_trips, 1, "listing: {l:?}");
    let ahead = l.metadata_fetches;
    assert_eq!(
        (l.compounds - ahead, l.creates - ahead, l.listings, l.closes),
        (1, 1, 2, 1),
        "listing (less {ahead} metadata compounds fetched ahead): {l:?}"
    );
    // Metadata: one compound per file (CREATE, attributes, descriptor, streams, and the
    // EAs only for the files whose listing showed some; no CLOSE), fetched ahead in the
    // background or by the first of the file's three calls: at most one round trip per
    // file for the calls, never a second fetch.
    // (Those fetched ahead during the listing's window are counted there.)
    let m = since(described, listed);
    assert_eq!(m.metadata_fetches + ahead, n, "metadata: {m:?}");
    assert!(m.round_trips <= n, "metadata: {m:?}");
    assert_eq!(m.creates + ahead, n, "metadata: {m:?}");
    let with_eas = (0..FILES).filter(|i| i % 4 == 0).count() as u64;
    let lm = since(described, before);
    assert_eq!(
        lm.queries,
        2 + 3 * n + with_eas,
        "listing and metadata: 2 QUERY_INFOs for the directory, 3 per file and one more \
         per file with EAs ({with_eas}) expected: {lm:?}"
    );
    assert_eq!(
        (lm.eas_skipped, lm.eas_asked_apart),
        (1 + n - with_eas, 0),
        "EA queries left out (the directory and the files without EAs): {lm:?}"
    );
    assert_eq!(m.closes, 0, "metadata (handles kept for the reads): {m:?}");
    assert_eq!(
        described.kept_handles, n,
        "a handle kept per file after the metadata pass"
    );
    assert_eq!((m.reads, m.singles), (0, 0), "metadata: {m:?}");
    // Data: each small file in one round trip (READ, attributes, CLOSE on the handle its
    // metadata fetch left open: no CREATE); the big one a round trip per unit for its
    // window of READs with the attributes asked alongside the last, on the handle kept
    // from its metadata fetch and then between units.
    let d = since(read, described);
    assert_eq!(d.reads_compound, FILES as u64, "data: {d:?}");
    assert_eq!(d.reads_opened, 0, "data: {d:?}");
    assert_eq!(d.reads_continued, units, "data: {d:?}");
    assert_eq!(d.reads_on_metadata_handle, n, "data: {d:?}");
    assert_eq!(d.reads_reopened, 0, "data: {d:?}");
    assert_eq!(d.round_trips, FILES as u64 + units, "data: {d:?}");
    assert_eq!(d.creates, 0, "data (no second open of any file): {d:?}");
    // One CREATE per file in all, where the metadata and the read compounds opened each
    // file once of their own before (two per file).
    let files_opened = (l.creates - 1) + m.creates + d.creates;
    assert_eq!(
        files_opened, n,
        "CREATEs for {n} files (listing {l:?}, metadata {m:?}, data {d:?})"
    );
    // A small file whose end is not on an 8-byte boundary is asked as two READs (the
    // last bytes apart, so smbd need not copy the data to pad its reply): all twelve
    // here (500 + 1,000 i bytes). The big one: READs of SMB_DATA_READ_PIECE per unit.
    let unaligned = files[..FILES]
        .iter()
        .filter(|(_, d)| d.len() % 8 != 0 && d.len() >= 8)
        .count() as u64;
    let big_reads: u64 = (0..BIG)
        .step_by(UNIT)
        .map(|o| UNIT.min(BIG - o).div_ceil(SMB_DATA_READ_PIECE) as u64)
        .sum();
    assert_eq!(unaligned, FILES as u64);
    assert_eq!(d.reads, FILES as u64 + unaligned + big_reads, "data: {d:?}");
    assert_eq!(d.queries, read_calls, "data: {d:?}");
    // Samba here requires neither signing nor encryption: every read went over the
    // source's own data connections (replies decoded into the caller's buffer), set up
    // for the metadata fetches that kept the handles.
    assert_eq!(d.reads_direct, read_calls, "data: {d:?}");
    assert!(since(read, before).data_connections >= 1, "data: {d:?}");
    // Every handle is closed once nothing more is read from it.
    let s = since(settled(&source), before);
    assert_eq!(s.closes, s.creates, "{s:?}");
}

/// Handles kept open on the source's idle data connections.
fn read_handles(source: &SmbSource) -> u64 {
    source.stats().kept_handles
}

/// A file read on the handle its metadata fetch kept reads what its path names at the
/// read: a file grown in place since is read whole with its new size (the same file), a
/// file replaced by a rename over its name is read anew by name (the new file's bytes
/// and size, which the engine's completion check then compares with the listing), and
/// a file deleted since fails as not found. An unchanged file is read on the handle.
#[test]
fn smb_kept_handle_reads_what_the_path_names_now() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let old = |i: u64| common::content(i, 4000 + i as usize * 8);
    for (i, name) in ["same", "grown", "replaced", "gone"].iter().enumerate() {
        std::fs::write(share.path().join(name), old(i as u64)).unwrap();
    }
    let server = common::Samba::start(share.path());
    let source = SmbSource::connect(server.config()).expect("connect");
    source.read_dir(&SourcePath::root()).unwrap();
    let p = |name: &str| SourcePath::parse(name.as_bytes()).unwrap();
    for name in ["same", "grown", "replaced", "gone"] {
        source.acl(&p(name)).unwrap();
    }
    assert!(
        read_handles(&source) >= 4,
        "handles kept from the metadata fetches: {:?}",
        source.stats()
    );
    // Changes on the server itself, behind smbd's back.
    let grown_tail = common::content(50, 3001);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(share.path().join("grown"))
            .unwrap();
        f.write_all(&grown_tail).unwrap();
    }
    let new = common::content(60, 7777);
    std::fs::write(share.path().join("replaced.tmp"), &new).unwrap();
    std::fs::rename(
        share.path().join("replaced.tmp"),
        share.path().join("replaced"),
    )
    .unwrap();
    std::fs::remove_file(share.path().join("gone")).unwrap();

    let mut buf = vec![0u8; UNIT];
    let mut read = |name: &str| {
        let before = source.stats();
        let r = source.read_into(&p(name), 0, &mut buf);
        (
            r.map(|(n, a)| (buf[..n].to_vec(), a)),
            since(source.stats(), before),
        )
    };
    let (got, d) = read("same");
    let (data, attr) = got.expect("read of an unchanged file");
    assert!(data == old(0), "content of the unchanged file");
    assert_eq!(attr.map(|a| a.size), Some(old(0).len() as u64));
    assert_eq!(
        (d.reads_on_metadata_handle, d.reads_reopened, d.creates),
        (1, 0, 0),
        "unchanged file: read on its kept handle, no CREATE: {d:?}"
    );

    let (got, d) = read("grown");
    let (data, attr) = got.expect("read of a grown file");
    let mut whole = old(1);
    whole.extend_from_slice(&grown_tail);
    assert_eq!(
        attr.map(|a| a.size),
        Some(whole.len() as u64),
        "grown: new size"
    );
    assert!(
        data == whole,
        "grown file read whole ({} bytes)",
        data.len()
    );
    assert_eq!(d.reads_on_metadata_handle, 1, "grown: {d:?}");

    let (got, d) = read("replaced");
    let (data, attr) = got.expect("read of a replaced file");
    assert!(
        data == new,
        "replaced file: the new file's {} bytes expected, got {} (the old file's: {})",
        new.len(),
        data.len(),
        data == old(2)
    );
    assert_eq!(
        attr.map(|a| a.size),
        Some(new.len() as u64),
        "replaced: new size"
    );
    assert_eq!(
        (d.reads_reopened, d.creates),
        (1, 1),
        "replaced: the path opened anew: {d:?}"
    );

    let (got, d) = read("gone");
    let e = got.expect_err("a file deleted since its metadata fetch is not read");
    assert_eq!(
        e.kind,
        kaiso_store::migrate::SourceErrorKind::NotFound,
        "gone: {e}"
    );
    assert_eq!(d.reads_reopened, 1, "gone: {d:?}");
    // Nothing stays open: every handle kept was closed by its read.
    let s = settled(&source);
    assert_eq!(s.closes, s.creates, "{s:?}");
    assert_eq!(read_handles(&source), 0, "{s:?}");
}

/// A directory too large for the listing compound's two QUERY_DIRECTORY buffers is paged
/// through on a handle of its own: every entry once, none missing.
#[test]
fn smb_long_directory_is_listed_whole() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let dir = share.path().join("many");
    std::fs::create_dir(&dir).unwrap();
    // About 150 bytes an entry: 6,000 entries fill more than two 256 KiB buffers.
    let count = 6000;
    for i in 0..count {
        std::fs::write(dir.join(format!("a-rather-long-file-name-{i:05}")), b"x").unwrap();
    }
    let server = common::Samba::start(share.path());
    let source = SmbSource::connect(server.config()).expect("connect");
    let before = source.stats();
    let entries = source
        .read_dir(&SourcePath::parse(b"many").unwrap())
        .unwrap();
    let after = source.stats();
    let mut names: Vec<Vec<u8>> = entries.into_iter().map(|e| e.name).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), count, "distinct entries");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with(b"a-rather-long-file-name-")),
        "names"
    );
    // The compound found more than it could hold; the directory was opened again.
    let s = since(after, before);
    assert!(s.round_trips >= 3, "{s:?}");
    assert!(s.listings >= 5, "{s:?}");
}

/// Small files with every remainder of their size modulo 8, read as a crawl reads them
/// (listed first): every byte arrives, and a file whose end is not on an 8-byte
/// boundary (8 bytes or more) is asked as two READs of one compound, the first ending
/// on the boundary. smbd 4.17 pads each reply of a compound to 8 bytes by copying a
/// READ's data into a fresh zeroed buffer; asked in one READ, such a file cost smbd
/// 2.5-3 times the CPU per GiB (`smb_read_cpu`, `KAISO_SMB_CPU_FILE_BYTES`).
#[test]
fn smb_small_file_ends_are_read_apart() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let sizes: Vec<usize> = [0usize, 1, 7, 8, 9, 15, 16, 4093, 65_536, 65_541, 300_007]
        .into_iter()
        .chain((0..8).map(|r| 200_000 + r))
        .collect();
    let files: Vec<(String, Vec<u8>)> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| (format!("s{i:02}"), common::content(70 + i as u64, len)))
        .collect();
    for (name, data) in &files {
        std::fs::write(share.path().join(name), data).unwrap();
    }
    let server = common::Samba::start(share.path());
    let source = SmbSource::connect(server.config()).expect("connect");
    let listed = source.read_dir(&SourcePath::root()).unwrap();
    assert_eq!(listed.len(), files.len());
    let mut buf = vec![0u8; UNIT];
    for (name, data) in &files {
        let p = SourcePath::parse(name.as_bytes()).unwrap();
        let before = source.stats();
        buf.fill(0xEE);
        let (n, attr) = source.read_into(&p, 0, &mut buf).unwrap();
        let d = since(source.stats(), before);
        assert_eq!(n, data.len(), "bytes read of {name} ({} bytes)", data.len());
        assert!(
            buf[..n] == data[..],
            "content of {name} ({} bytes)",
            data.len()
        );
        assert_eq!(
            attr.map(|a| a.size),
            Some(data.len() as u64),
            "size of {name}"
        );
        let split = data.len() % 8 != 0 && data.len() >= 8;
        // Counters the listing's background metadata fetches do not touch (they send
        // compounds, but no READ and no round trip anybody waits for).
        assert_eq!(
            (d.round_trips, d.reads_compound, d.reads),
            (1, 1, 1 + u64::from(split)),
            "{name} of {} bytes: one compound, {} READ(s) expected: {d:?}",
            data.len(),
            1 + u64::from(split)
        );
    }
}

/// The EA query is left out of a metadata compound when the object's listing said it has
/// no EAs (EaSize 0), and EAs set after that listing are still copied: the compound's
/// FileAllInformation shows their size and they are asked apart. A directory is listed
/// with its own metadata, so its listing compound shows both: left out for a directory
/// without EAs, asked apart for one that got an EA after its parent was listed, asked in
/// the compound for one whose parent's listing showed EAs.
#[test]
fn smb_eas_are_asked_only_where_the_listing_shows_some() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    for d in ["plain", "later", "tagged"] {
        std::fs::create_dir(share.path().join(d)).unwrap();
    }
    common::set_xattr(&share.path().join("tagged"), "user.tag", b"t");
    let server = common::Samba::start(share.path());
    let source = SmbSource::connect(server.config()).expect("connect");
    // The root's listing gives each directory's EaSize; only then does "later" get an EA.
    source.read_dir(&SourcePath::root()).unwrap();
    common::set_xattr(&share.path().join("later"), "user.late", b"l");
    let p = |s: &str| SourcePath::parse(s.as_bytes()).unwrap();
    let list = |name: &str| {
        let before = source.stats();
        source.read_dir(&p(name)).unwrap();
        let eas = source.xattrs(&p(name)).unwrap();
        (eas, since(source.stats(), before))
    };
    let (eas, d) = list("plain");
    assert!(eas.is_empty(), "plain: {eas:?}");
    assert_eq!(
        (d.eas_skipped, d.eas_asked_apart, d.queries, d.compounds),
        (1, 0, 2, 1),
        "plain: listing compound without the EA query, nothing asked apart: {d:?}"
    );
    let (eas, d) = list("later");
    assert_eq!(
        eas,
        vec![(b"user.late".to_vec(), b"l".to_vec())],
        "later: the EA set after the parent's listing"
    );
    assert_eq!(
        (d.eas_skipped, d.eas_asked_apart, d.queries, d.compounds),
        (1, 1, 3, 2),
        "later: EA query left out, then asked apart in a compound of its own: {d:?}"
    );
    let (eas, d) = list("tagged");
    assert_eq!(eas, vec![(b"user.tag".to_vec(), b"t".to_vec())], "tagged");
    assert_eq!(
        (d.eas_skipped, d.eas_asked_apart, d.queries, d.compounds),
        (0, 0, 3, 1),
        "tagged: EA query in the listing compound: {d:?}"
    );
}

/// A file whose listing said "no EAs" but that has EAs when its metadata is fetched (set
/// in between) still has them copied: its metadata compound leaves the EA query out,
/// its FileAllInformation shows an EA size, and the EAs are asked apart; on the
/// source's own data connections and through the crate's signed sessions (`sign=1`).
/// The listing's hint is set directly (`assume_no_eas`): after a real listing the
/// background prefetch would race with the test's setxattr.
#[test]
fn smb_eas_set_after_a_files_listing_are_still_copied() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    for name in ["bare", "tagged"] {
        std::fs::write(share.path().join(name), b"data").unwrap();
    }
    common::set_xattr(&share.path().join("tagged"), "user.tag", b"t");
    let server = common::Samba::start(share.path());
    for sign in [false, true] {
        let mut config = server.config();
        config.sign = sign;
        let source = SmbSource::connect(config).expect("connect");
        let p = |s: &str| SourcePath::parse(s.as_bytes()).unwrap();
        for name in ["bare", "tagged"] {
            source.assume_no_eas(&p(name));
            let before = source.stats();
            let eas = source.xattrs(&p(name)).unwrap();
            assert!(source.acl(&p(name)).unwrap().owner_sid.is_some());
            let d = since(source.stats(), before);
            let want: Vec<(Vec<u8>, Vec<u8>)> = if name == "tagged" {
                vec![(b"user.tag".to_vec(), b"t".to_vec())]
            } else {
                Vec::new()
            };
            assert_eq!(eas, want, "EAs of {name} (sign={sign})");
            let apart = u64::from(name == "tagged");
            assert_eq!(
                (d.metadata_fetches, d.eas_skipped, d.eas_asked_apart),
                (1, 1, apart),
                "{name} (sign={sign}): one metadata fetch without the EA query, \
                 {apart} asked apart: {d:?}"
            );
        }
    }
}
