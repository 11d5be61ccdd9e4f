//! The SMB source's own data connections number at most `connections`, however many
//! threads read at once and however many metadata fetches a listing starts ahead: each
//! is a process of smbd's (session 13 allowed twice as many; smbd then ran 16 data
//! connections for the bench's 8 sessions and spent more CPU for no gain, session 14).

mod common;

use std::sync::{Arc, Barrier};

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourcePath};

const FILES: usize = 64;
const THREADS: usize = 8;
const CONNECTIONS: usize = 2;

fn path(i: usize) -> SourcePath {
    SourcePath::parse(format!("d/f{i:03}").as_bytes()).unwrap()
}

/// Reads every file (thread `t` takes every `THREADS`th) and checks its bytes; with
/// `metadata`, asks for its EAs and descriptor first (answered by the fetch ahead).
fn read_all(source: &Arc<SmbSource>, data: &[Vec<u8>], metadata: bool) {
    let barrier = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (source, barrier) = (source.clone(), &barrier);
            s.spawn(move || {
                // All at once: the first reads find no connection idle.
                barrier.wait();
                for i in (t..FILES).step_by(THREADS) {
                    let p = path(i);
                    if metadata {
                        assert!(source.xattrs(&p).unwrap().is_empty(), "EAs of {p}");
                        assert!(source.acl(&p).unwrap().nt_security_descriptor.is_some());
                    }
                    let mut buf = vec![0u8; data[i].len() + 10];
                    let (n, _) = source.read_into(&p, 0, &mut buf).unwrap();
                    assert!(
                        n == data[i].len() && buf[..n] == data[i][..],
                        "content of {p}"
                    );
                }
            });
        }
    });
}

#[test]
fn smb_data_connections_are_at_most_connections() {
    if !common::have(&["smbd", "smbpasswd"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(share.path().join("d")).unwrap();
    let data: Vec<Vec<u8>> = (0..FILES)
        .map(|i| {
            let d = common::content(i as u64, 3000 + i * 1001);
            std::fs::write(share.path().join(format!("d/f{i:03}")), &d).unwrap();
            d
        })
        .collect();
    let server = common::Samba::start_read_only(share.path());
    let mut config = server.config();
    config.connections = CONNECTIONS;
    let source = Arc::new(SmbSource::connect(config).expect("connect"));

    // Eight threads read at once before any data connection exists.
    read_all(&source, &data, false);
    let s = source.stats();
    assert!(
        s.reads_direct >= FILES as u64,
        "expected every read on the data connections: {s:?}"
    );
    assert!(
        (1..=CONNECTIONS as u64).contains(&s.data_connections),
        "expected 1 to {CONNECTIONS} data connections for {THREADS} threads reading at once, \
         got {}: {s:?}",
        s.data_connections
    );

    // A listing starts the files' metadata fetches in the background (handles kept for
    // the reads) while eight threads ask for the same metadata and read.
    let entries = source.read_dir(&SourcePath::parse(b"d").unwrap()).unwrap();
    assert_eq!(entries.len(), FILES);
    read_all(&source, &data, true);
    let s = source.stats();
    assert!(
        (1..=CONNECTIONS as u64).contains(&s.data_connections),
        "expected 1 to {CONNECTIONS} data connections with metadata fetched ahead, got {}: \
         {s:?}",
        s.data_connections
    );
    assert!(
        s.reads_on_metadata_handle >= 1,
        "expected reads on handles kept from the metadata fetches: {s:?}"
    );
}
