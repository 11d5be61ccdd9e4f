//! The SMB source's large reads against a real Samba: many multi-credit READs in flight
//! on several sessions must neither stall waiting for credits (the `smb` crate, before
//! the port to `smb2`, waited for them without a timeout and hung) nor mix up pieces.

mod common;

use std::sync::Arc;
use std::time::Duration;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{Source, SourcePath};

#[test]
fn smb_large_reads_in_flight() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let len = 24 << 20;
    let data = common::content(7, len);
    std::fs::write(share.path().join("big"), &data).unwrap();
    let server = common::Samba::start(share.path());
    let source = Arc::new(SmbSource::connect(server.config()).expect("connect"));
    let data = Arc::new(data);
    let (tx, rx) = std::sync::mpsc::channel();
    // Four callers at once, each reading the whole file in 10 MiB units (a migration's
    // unit) from a different start: sessions are shared and READs queue for credits.
    for t in 0..4usize {
        let (source, data, tx) = (source.clone(), data.clone(), tx.clone());
        std::thread::spawn(move || {
            let p = SourcePath::parse(b"big").unwrap();
            let unit = 10 << 20;
            let mut off = ((t * 3) << 20) % len;
            let mut ok = true;
            for _ in 0..len.div_ceil(unit) + 1 {
                let want = unit.min(len - off);
                let (got, attr) = source.read_with_attr(&p, off as u64, unit).unwrap();
                ok &= got[..] == data[off..off + want];
                ok &= attr.is_some_and(|a| a.size == len as u64);
                off = (off + want) % len;
            }
            let _ = tx.send(ok);
        });
    }
    drop(tx);
    for _ in 0..4 {
        let ok = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a reader stalled (waiting for credits?)");
        assert!(ok, "wrong bytes or attributes");
    }
    // Past the end: short, then empty.
    let p = SourcePath::parse(b"big").unwrap();
    assert_eq!(
        source.read(&p, len as u64 - 5, 100).unwrap(),
        data[len - 5..]
    );
    assert!(source.read(&p, len as u64 + 1, 100).unwrap().is_empty());
}
