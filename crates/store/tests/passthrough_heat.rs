//! Heat of files served by kernel passthrough. The kernel reads and writes such a file
//! without kaiso, so the store's once-a-second check gives the policy, the trace and the
//! tier counters what it can see: one touch per second in which the kernel read or wrote
//! the backing file (inotify), and the writes the backing file shows. Simulated here, as
//! in passthrough_writes.rs, by reading and writing the backing file the store hands out,
//! which is what the kernel does (its passthrough I/O goes through the backing file and
//! raises the same inotify events there; checked by hand on a real mount, Linux 6.18).

mod common;

use common::{TestStore, pattern};
use kaiso_policy::Op;
use kaiso_store::trace::Record;
use kaiso_store::{Caller, ROOT_INO, Store};
use std::ffi::OsStr;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

const LEN: usize = 1 << 20;

/// A store over two plain tiers (opens may be passthrough) with `held` and `once` on the
/// slow tier t1, written there directly (found by the scan at open).
fn store_with_two_files() -> TestStore {
    let mut t = TestStore::new(&["64MiB", "1GiB"]);
    for name in ["held", "once"] {
        std::fs::write(t.tier(1).join(name), pattern(LEN, 5)).unwrap();
    }
    t.reopen();
    t
}

fn ino_of(s: &Store, name: &str) -> u64 {
    s.lookup(ROOT_INO, OsStr::new(name)).unwrap().ino
}

/// `(heat, seconds since the last access)` from the policy's account in `kaiso explain`.
fn heat_and_age(s: &Store, name: &str) -> (f64, f64) {
    let policy = s.explain(Path::new(name)).unwrap().policy;
    let after = |key: &str| -> f64 {
        let rest = &policy[policy
            .find(key)
            .unwrap_or_else(|| panic!("{key} in {policy}"))
            + key.len()..];
        let num: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        num.parse()
            .unwrap_or_else(|_| panic!("number after {key} in {policy}"))
    };
    (after("heat "), after("last access "))
}

fn tier_accesses(s: &Store, tier: usize) -> u64 {
    s.status().tiers[tier].accesses
}

#[test]
fn a_file_held_open_and_read_through_passthrough_gets_hotter_than_one_opened_once() {
    let t = store_with_two_files();
    let s = t.s();
    let once = s
        .open_file(ino_of(s, "once"), libc::O_RDONLY, true)
        .unwrap();
    assert!(
        once.passthrough.is_some(),
        "a resident file on a plain tier"
    );
    s.release(once.fh).unwrap();
    let held = s
        .open_file(ino_of(s, "held"), libc::O_RDONLY, true)
        .unwrap();
    let backing = held.passthrough.clone().expect("passthrough open");
    let (opened_heat, _) = heat_and_age(s, "held");
    let (once_heat, _) = heat_and_age(s, "once");
    assert!(
        (opened_heat - once_heat).abs() < 0.01,
        "one open each: {opened_heat} vs {once_heat}"
    );
    assert_eq!(tier_accesses(s, 1), 0, "passthrough opens are no requests");

    // What the kernel does for the application: read the backing file (the store's
    // background check runs every second meanwhile), until two seconds of use have
    // counted or 15 s have passed (a loaded machine delays the checks).
    let mut buf = vec![0u8; 4096];
    let start = Instant::now();
    let mut reads = 0u64;
    while start.elapsed() < Duration::from_secs(15) {
        let off = (reads * 4096) % LEN as u64;
        backing.read_exact_at(&mut buf, off).unwrap();
        reads += 1;
        if reads.is_multiple_of(256) {
            std::thread::sleep(Duration::from_millis(5));
            if heat_and_age(s, "held").0 >= once_heat + 2.0 {
                break;
            }
        }
    }
    let read_for = start.elapsed().as_secs_f64();
    let (held_heat, held_age) = heat_and_age(s, "held");
    let (once_heat, once_age) = heat_and_age(s, "once");
    assert!(
        held_heat >= once_heat + 2.0,
        "held open and read for {read_for:.1} s: heat {held_heat}, opened once: {once_heat}"
    );
    assert!(
        held_age <= 1.0,
        "last access of the held file {held_age} s ago"
    );
    assert!(
        once_age >= read_for - 0.2,
        "last access of the closed file {once_age} s ago, after {read_for:.1} s of reads"
    );
    assert!(
        tier_accesses(s, 1) >= 2,
        "held-open seconds count as accesses on the slow tier"
    );

    // Closed: no more touches.
    s.release(held.fh).unwrap();
    let (closed_heat, _) = heat_and_age(s, "held");
    std::thread::sleep(Duration::from_millis(1500));
    let (later_heat, later_age) = heat_and_age(s, "held");
    assert!(
        later_heat <= closed_heat,
        "no touches after the close: {closed_heat} then {later_heat}"
    );
    assert!(later_age >= 1.4, "last access {later_age} s ago");
}

#[test]
fn an_idle_held_open_file_gets_no_touches_until_the_kernel_reads_it() {
    let t = store_with_two_files();
    let s = t.s();
    // `once` opened twice and closed; `held` opened by two handles and kept open.
    for _ in 0..2 {
        let o = s
            .open_file(ino_of(s, "once"), libc::O_RDONLY, true)
            .unwrap();
        s.release(o.fh).unwrap();
    }
    let a = s
        .open_file(ino_of(s, "held"), libc::O_RDONLY, true)
        .unwrap();
    let b = s
        .open_file(ino_of(s, "held"), libc::O_RDONLY, true)
        .unwrap();
    assert!(a.passthrough.is_some() && b.passthrough.is_some());
    let (opened, _) = heat_and_age(s, "held");
    // Idle: checks by hand and in the background see no access (the first check to see
    // the file open records a 0-byte read that continues the open's episode: no heat).
    s.check_passthrough_writers();
    std::thread::sleep(Duration::from_millis(2500));
    s.check_passthrough_writers();
    let (idle, idle_age) = heat_and_age(s, "held");
    assert!(
        (idle - opened).abs() < 0.01,
        "no touches while idle: {opened} then {idle}"
    );
    assert!(idle_age >= 1.0, "last access {idle_age} s ago");
    // One read by the kernel through one of the handles: the next check counts one
    // touch for the file (the background check may count it too, once).
    let mut buf = [0u8; 512];
    a.passthrough
        .as_ref()
        .unwrap()
        .read_exact_at(&mut buf, 0)
        .unwrap();
    s.check_passthrough_writers();
    let (read, read_age) = heat_and_age(s, "held");
    assert!(
        read >= idle + 0.99 && read <= idle + 2.01,
        "one read, one or two touches: {idle} then {read}"
    );
    assert!(read_age < 0.5, "last access {read_age} s ago");
    let (twice, _) = heat_and_age(s, "once");
    assert!(read > twice, "held and read {read} vs opened twice {twice}");
    s.release(a.fh).unwrap();
    s.release(b.fh).unwrap();
}

#[test]
fn passthrough_writes_and_held_opens_reach_the_trace() {
    let t = TestStore::new(&["1GiB", "1GiB"]);
    let s = t.s();
    let trace = t.dir.path().join("trace.txt");
    s.trace_start(&trace).unwrap();
    let (attr, o) = s
        .create(
            ROOT_INO,
            OsStr::new("log"),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            true,
        )
        .unwrap();
    let backing = o.passthrough.clone().expect("passthrough writer");
    // The kernel appends for the application; the check sees the growth.
    backing.write_all_at(&vec![1u8; 8192], 0).unwrap();
    s.check_passthrough_writers();
    backing.write_all_at(&vec![2u8; 4096], 8192).unwrap();
    s.release(o.fh).unwrap();
    s.trace_stop().unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    let recs: Vec<Record> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| Record::parse(l).unwrap_or_else(|| panic!("bad line {l}")))
        .filter(|r| r.object == attr.ino)
        .collect();
    let writes: Vec<(u64, u64, u64)> = recs
        .iter()
        .filter(|r| r.op == Op::Write)
        .map(|r| (r.offset, r.len, r.size))
        .collect();
    // Each check (by hand or in the background) sees the growth since the one before;
    // the close sees the rest. Together they cover the 12 KiB written, in order.
    let total: u64 = writes.iter().map(|w| w.1).sum();
    assert_eq!(total, 12288, "writes in the trace: {writes:?}");
    assert_eq!(writes.last().map(|w| w.2), Some(12288), "{writes:?}");
    assert!(
        recs.iter().filter(|r| r.op == Op::Open).count() >= 1,
        "the held-open touch of the check: {recs:?}"
    );
    assert_eq!(recs.first().map(|r| r.op), Some(Op::Create));
    assert_eq!(recs.iter().filter(|r| r.path == b"log").count(), recs.len());
}

#[test]
fn an_unlinked_file_held_open_is_not_touched() {
    let t = store_with_two_files();
    let s = t.s();
    let ino = ino_of(s, "held");
    let o = s.open_file(ino, libc::O_RDONLY, true).unwrap();
    assert!(o.passthrough.is_some());
    s.unlink(ROOT_INO, OsStr::new("held")).unwrap();
    let trace = t.dir.path().join("trace.txt");
    s.trace_start(&trace).unwrap();
    // Arm the watch, read as the kernel would, check again: used, but unlinked.
    s.check_passthrough_writers();
    let mut buf = [0u8; 512];
    o.passthrough
        .as_ref()
        .unwrap()
        .read_exact_at(&mut buf, 0)
        .unwrap();
    s.check_passthrough_writers();
    s.trace_stop().unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(
        !text.lines().any(|l| !l.starts_with('#')),
        "no access recorded for an unlinked file: {text}"
    );
    s.release(o.fh).unwrap();
}

#[test]
fn a_long_sequential_pass_over_a_big_file_keeps_recency_but_adds_no_heat() {
    // 2 GiB (sparse): one pass at `SCAN_RATE` (100 MiB/s) takes about 20 s, so uses of
    // the first 20 s count as the open's pass, as a sequential read through kaiso does.
    let mut t = TestStore::new(&["64MiB", "8GiB"]);
    let big = std::fs::File::create(t.tier(1).join("big")).unwrap();
    big.set_len(2 << 30).unwrap();
    drop(big);
    t.reopen();
    let s = t.s();
    let o = s.open_file(ino_of(s, "big"), libc::O_RDONLY, true).unwrap();
    let backing = o.passthrough.clone().expect("passthrough open");
    let (opened, _) = heat_and_age(s, "big");
    // Checks of our own as well as the store's once-a-second thread, so a loaded machine
    // that delays that thread cannot make the recency check fail: arm the watch now, and
    // look once more after the reads.
    s.check_passthrough_writers();
    let mut buf = vec![0u8; 1 << 16];
    let mut off = 0u64;
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(3000) {
        backing.read_exact_at(&mut buf, off).unwrap();
        off += buf.len() as u64;
        std::thread::sleep(Duration::from_millis(1));
    }
    s.check_passthrough_writers();
    let (scanned, age) = heat_and_age(s, "big");
    assert!(
        (scanned - opened).abs() < 0.01,
        "a sequential pass adds no heat: {opened} then {scanned}"
    );
    assert!(age <= 2.5, "but its last access is recent: {age} s ago");
    assert!(
        s.status().tiers[1].accesses >= 1,
        "the use counts on the tier"
    );
    s.release(o.fh).unwrap();
}
