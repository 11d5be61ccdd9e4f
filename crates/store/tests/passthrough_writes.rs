//! Passthrough writers without a mount: the reserve a writable passthrough open needs and
//! holds on its tier, the accounting of growth the kernel writes without kaiso (simulated
//! here by writing to the backing file the store hands out), and FIFO opens that block.

mod common;

use common::TestStore;
use kaiso_store::{Caller, Ino, ROOT_INO, SetAttr, Store};
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

/// A store over tiers of the given capacities with `extra` added to `[store]`.
fn store_with(caps: &[&str], extra: &str) -> TestStore {
    let mut t = TestStore::new(caps);
    t.cfg_text = t
        .cfg_text
        .replacen("[store]\n", &format!("[store]\n{extra}\n"), 1);
    t.reopen();
    t
}

fn used(s: &Store) -> Vec<u64> {
    s.status().tiers.iter().map(|t| t.used).collect()
}

/// Create `name` in the root for writing, asking for passthrough as a face would.
fn create_pt(s: &Store, name: &str) -> (Ino, kaiso_store::Opened) {
    let (a, o) = s
        .create(
            ROOT_INO,
            OsStr::new(name),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            true,
        )
        .unwrap();
    (a.ino, o)
}

/// What the kernel does for a passthrough writer: write the backing file directly.
fn kernel_write(o: &kaiso_store::Opened, offset: u64, len: u64) {
    let f = o.passthrough.as_ref().expect("passthrough open");
    f.write_all_at(&vec![7u8; len as usize], offset).unwrap();
}

#[test]
fn writers_get_passthrough_only_while_the_reserve_fits() {
    let t = store_with(&["64MiB", "8MiB"], "passthrough_write_reserve = \"16MiB\"");
    let s = t.s();
    let mut opens = Vec::new();
    for i in 0..4 {
        let (_, o) = create_pt(s, &format!("w{i}"));
        assert!(o.passthrough.is_some(), "writer {i} should be passthrough");
        opens.push(o);
    }
    // Four reserves fill the 64 MiB tier: they count as its usage.
    assert_eq!(used(s)[0], 64 * MIB);
    // A fifth writer goes to the next tier, where a reserve does not fit: it is served
    // through kaiso, whose writes reserve room one by one.
    let (_, o5) = create_pt(s, "w4");
    assert!(o5.passthrough.is_none(), "no reserve left: through kaiso");
    s.write(o5.fh, 0, &vec![1u8; MIB as usize]).unwrap();
    assert_eq!(t.holders("w4", 2), vec![1]);
    s.release(o5.fh).unwrap();
    // Readers are not limited by the reserve.
    let (_, r) = {
        let a = s.lookup(ROOT_INO, OsStr::new("w4")).unwrap();
        (a.ino, s.open_file(a.ino, libc::O_RDONLY, true).unwrap())
    };
    assert!(r.passthrough.is_some());
    s.release(r.fh).unwrap();
    // Closing the writers gives their reserves back; usage is then the data alone.
    kernel_write(&opens[0], 0, 3 * MIB);
    for o in opens {
        s.release(o.fh).unwrap();
    }
    assert_eq!(used(s), vec![3 * MIB, MIB]);
    assert_eq!(t.lookup_path("w0").unwrap().size, 3 * MIB);
}

#[test]
fn growth_is_accounted_periodically_and_on_close() {
    let t = store_with(&["100MiB", "1GiB"], "passthrough_write_reserve = \"10MiB\"");
    let s = t.s();
    let (ino, o) = create_pt(s, "f");
    assert!(o.passthrough.is_some());
    assert_eq!(used(s)[0], 10 * MIB);
    // Growth within the reserve: the periodic check moves it from reserve to data and
    // tops the reserve up again.
    kernel_write(&o, 0, 4 * MIB);
    s.check_passthrough_writers();
    assert_eq!(used(s)[0], 14 * MIB);
    assert_eq!(s.getattr(ino, None).unwrap().size, 4 * MIB);
    // Growth past the reserve between two checks: the tier is charged all of it.
    kernel_write(&o, 4 * MIB, 25 * MIB);
    s.check_passthrough_writers();
    assert_eq!(used(s)[0], 39 * MIB);
    // The background check runs on its own too (every second; 20 s leaves room for a
    // loaded machine).
    kernel_write(&o, 29 * MIB, MIB);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while used(s)[0] != 40 * MIB && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        used(s)[0],
        40 * MIB,
        "background check accounted the growth"
    );
    s.release(o.fh).unwrap();
    assert_eq!(used(s)[0], 30 * MIB);
    assert_eq!(s.getattr(ino, None).unwrap().size, 30 * MIB);
}

#[test]
fn joined_writers_take_no_reserve_and_daemon_writes_respect_reserves() {
    let t = store_with(&["20MiB", "1GiB"], "passthrough_write_reserve = \"8MiB\"");
    let s = t.s();
    t.put("big", &vec![3u8; 10 * MIB as usize]);
    let (_, w) = create_pt(s, "w");
    assert!(w.passthrough.is_some());
    assert_eq!(used(s)[0], 18 * MIB);
    // A daemon-path write may not take the writer's reserve: 3 MiB more does not fit.
    let (_, c) = s
        .create(
            ROOT_INO,
            OsStr::new("c"),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            false,
        )
        .unwrap();
    s.write(c.fh, 0, &vec![1u8; 3 * MIB as usize]).unwrap();
    assert_eq!(t.holders("c", 2), vec![1]);
    s.release(c.fh).unwrap();
    // A second writer joining the first must be passthrough too (kernel rule), but takes
    // no reserve: the tier's last 2 MiB stay free for others (a periodic top-up is all or
    // nothing, so it does not take them either).
    let a = s.lookup(ROOT_INO, OsStr::new("w")).unwrap();
    let w2 = s.open_file(a.ino, libc::O_WRONLY, true).unwrap();
    assert!(w2.passthrough.is_some());
    assert_eq!(used(s)[0], 18 * MIB);
    s.check_passthrough_writers();
    assert_eq!(used(s)[0], 18 * MIB);
    kernel_write(&w, 0, MIB);
    s.release(w2.fh).unwrap();
    s.release(w.fh).unwrap();
    assert_eq!(used(s)[0], 11 * MIB);
}

#[test]
fn truncate_and_unlink_while_a_passthrough_writer_is_open() {
    let t = store_with(&["100MiB"], "passthrough_write_reserve = \"10MiB\"");
    let s = t.s();
    let (ino, o) = create_pt(s, "f");
    kernel_write(&o, 0, 6 * MIB);
    // truncate(2) by path, growth not yet accounted.
    let set = SetAttr {
        size: Some(2 * MIB),
        ..Default::default()
    };
    s.setattr(ino, &set, Caller::ROOT).unwrap();
    kernel_write(&o, 2 * MIB, MIB);
    s.check_passthrough_writers();
    s.release(o.fh).unwrap();
    assert_eq!(used(s)[0], 3 * MIB);
    assert_eq!(s.getattr(ino, None).unwrap().size, 3 * MIB);

    // Unlinked while open: growth after the unlink is not charged to anyone.
    let (_, o) = create_pt(s, "g");
    kernel_write(&o, 0, MIB);
    s.check_passthrough_writers();
    s.unlink(ROOT_INO, OsStr::new("g")).unwrap();
    kernel_write(&o, MIB, 4 * MIB);
    s.check_passthrough_writers();
    s.release(o.fh).unwrap();
    assert_eq!(used(s)[0], 3 * MIB);
}

#[test]
fn fsck_keeps_the_reserves_of_open_writers() {
    let t = store_with(&["100MiB"], "passthrough_write_reserve = \"10MiB\"");
    let s = t.s();
    let (_, o) = create_pt(s, "f");
    kernel_write(&o, 0, 2 * MIB);
    s.fsck().unwrap();
    // The scan counts the data (2 MiB) and the reserve still held (10 MiB).
    assert_eq!(used(s)[0], 12 * MIB);
    s.release(o.fh).unwrap();
    // The growth was counted by the scan, so closing gives back only the reserve.
    assert_eq!(used(s)[0], 2 * MIB);
}

#[test]
fn writers_go_through_kaiso_when_write_passthrough_is_off() {
    let t = store_with(&["100MiB"], "passthrough_writes = false");
    let s = t.s();
    let (_, o) = create_pt(s, "f");
    assert!(o.passthrough.is_none());
    assert_eq!(used(s)[0], 0);
    s.release(o.fh).unwrap();
    let a = s.lookup(ROOT_INO, OsStr::new("f")).unwrap();
    let r = s.open_file(a.ino, libc::O_RDONLY, true).unwrap();
    assert!(r.passthrough.is_some(), "readers still are passthrough");
    // A writer joining a passthrough reader must be passthrough too (the kernel's rule);
    // its growth is still accounted by the periodic check and at close.
    let w = s.open_file(a.ino, libc::O_WRONLY, true).unwrap();
    assert!(w.passthrough.is_some());
    kernel_write(&w, 0, 2 * MIB);
    s.check_passthrough_writers();
    assert_eq!(s.getattr(a.ino, None).unwrap().size, 2 * MIB);
    s.release(w.fh).unwrap();
    s.release(r.fh).unwrap();
    assert_eq!(used(s)[0], 2 * MIB);
}

#[test]
fn face_refusing_passthrough_gives_the_reserve_back() {
    let t = store_with(&["100MiB"], "passthrough_write_reserve = \"10MiB\"");
    let s = t.s();
    let (_, o) = create_pt(s, "f");
    assert_eq!(used(s)[0], 10 * MIB);
    s.passthrough_refused(o.fh);
    assert_eq!(used(s)[0], 0);
    s.write(o.fh, 0, b"abc").unwrap();
    assert_eq!(used(s)[0], 3);
    s.release(o.fh).unwrap();
    assert_eq!(used(s)[0], 3);
}

/// Opening a FIFO blocks until its peer opens: that must not block the namespace.
#[test]
fn fifo_open_waiting_for_its_peer_blocks_nothing_else() {
    let t = TestStore::new(&["100MiB"]);
    let s: Arc<Store> = t.s().clone();
    let fifo = s
        .mknod(
            ROOT_INO,
            OsStr::new("p"),
            libc::S_IFIFO | 0o644,
            0,
            0,
            Caller::ROOT,
        )
        .unwrap()
        .ino;
    let (tx, rx) = mpsc::channel();
    let reader = {
        let s = s.clone();
        let tx = tx.clone();
        std::thread::spawn(move || {
            let r = s.open_file(fifo, libc::O_RDONLY, true);
            let _ = tx.send(("reader", r.map(|o| o.fh)));
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // The reader is blocked in open(2); the namespace must still answer.
    let (done_tx, done_rx) = mpsc::channel();
    {
        let s = s.clone();
        std::thread::spawn(move || {
            let a = s.lookup(ROOT_INO, OsStr::new("p")).map(|a| a.ino);
            let c = s
                .create(
                    ROOT_INO,
                    OsStr::new("other"),
                    0o644,
                    0,
                    libc::O_RDWR,
                    Caller::ROOT,
                    false,
                )
                .map(|(_, o)| o.fh);
            let _ = done_tx.send((a, c));
        });
    }
    let ns_ok = done_rx.recv_timeout(Duration::from_secs(5));
    // A non-blocking writer open would fail (ENXIO) without a reader; a blocking one is
    // the peer that lets the reader through.
    let writer = {
        let s = s.clone();
        std::thread::spawn(move || {
            let r = s.open_file(fifo, libc::O_WRONLY, true);
            let _ = tx.send(("writer", r.map(|o| o.fh)));
        })
    };
    let mut opened = Vec::new();
    for _ in 0..2 {
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok((who, r)) => opened.push((who, r.expect("fifo open"))),
            Err(_) => break,
        }
    }
    if opened.len() < 2 {
        // Let a blocked open go (O_RDWR never blocks on a FIFO) before failing.
        let _peer = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(t.tier(0).join("p"));
    }
    let (a, c) = ns_ok.expect("lookup and create finished while a FIFO open waited");
    assert_eq!(a.unwrap(), fifo);
    s.release(c.unwrap()).unwrap();
    assert_eq!(opened.len(), 2, "both ends of the FIFO opened");
    reader.join().unwrap();
    writer.join().unwrap();
    for (_, fh) in opened {
        s.release(fh).unwrap();
    }
    // O_NONBLOCK is kept: a writer without a reader fails at once instead of waiting.
    let e = s
        .open_file(fifo, libc::O_WRONLY | libc::O_NONBLOCK, true)
        .unwrap_err();
    assert_eq!(e.errno(), libc::ENXIO);
}
