//! Pacing of moves on real (not emulated) tiers (issue 2 item 4): background moves back
//! off while the tier's device is busy with foreground load, operator moves do not, a
//! move does not back off because of its own load, and `max_rate` bounds every copy.
//! Device load is injected as an `io_ticks`-like clock (the real source is the tier's
//! `/sys/dev/block/M:m/stat`), so the figures do not depend on what else uses the disk.

mod common;
use common::*;
use kaiso_store::{ROOT_INO, Store};
use std::ffi::OsStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// The longest a background copy waits for a busy tier before each 1 MiB piece (the
/// mover's bound: 100 polls of 20 ms).
const BACKOFF: Duration = Duration::from_secs(2);

/// A store over `t0` (`fast_cap`, watermarks 0.5/0.8) and `t1` (1 GiB), with `name` of
/// `len` bytes on `t0` and `user` (1 MiB) on `t1`, both put there before the store opens.
fn store(fast_cap: &str, max_rate: &str, name: &str, len: usize) -> TestStore {
    let mut t = TestStore::new(&[fast_cap, "1GiB"]);
    std::fs::write(t.dir.path().join("t0").join(name), pattern(len, 3)).unwrap();
    std::fs::write(t.dir.path().join("t1").join("user"), pattern(MIB, 5)).unwrap();
    t.cfg_text = t
        .cfg_text
        .replacen("high_watermark = 1.0", "high_watermark = 0.8", 1)
        .replace("max_rate = \"1GiB\"", &format!("max_rate = \"{max_rate}\""));
    t.reopen();
    t
}

/// Make tier `tier`'s device read as busy `share` of the time from now on, and take the
/// samples that show it (the first one only opens the window).
fn load_device(s: &Store, tier: &str, share: f64) {
    let start = Instant::now();
    s.set_device_busy_source(
        tier,
        Box::new(move || Some((start.elapsed().as_secs_f64() * 1000.0 * share) as u64)),
    )
    .unwrap();
    s.sample_utilisation();
    std::thread::sleep(Duration::from_millis(200));
    let idx = s.tier_names().iter().position(|n| n == tier).unwrap();
    let busy = s.sample_utilisation()[idx];
    assert!((share - 0.1..=share + 0.05).contains(&busy), "{busy}");
}

/// A user reading `user` on `t1` through the store, back to back, until `stop`.
fn reader(s: &Arc<Store>, stop: &Arc<AtomicBool>) -> JoinHandle<u64> {
    let (s, stop) = (s.clone(), stop.clone());
    let ino = s.lookup(ROOT_INO, OsStr::new("user")).unwrap().ino;
    std::thread::spawn(move || {
        let o = s.open_file(ino, libc::O_RDONLY, false).unwrap();
        let mut reads = 0u64;
        while !stop.load(Ordering::Relaxed) {
            s.read(o.fh, (reads % 16) * 65536, 65536).unwrap();
            reads += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        s.release(o.fh).unwrap();
        reads
    })
}

fn read_all(s: &Store, name: &str, len: usize) -> Vec<u8> {
    let ino = s.lookup(ROOT_INO, OsStr::new(name)).unwrap().ino;
    let o = s.open_file(ino, libc::O_RDONLY, false).unwrap();
    let got = s.read(o.fh, 0, len as u32).unwrap();
    s.release(o.fh).unwrap();
    got
}

fn tiers_of(s: &Store, name: &str) -> Vec<String> {
    s.where_is(name.as_ref()).unwrap().tiers
}

#[test]
fn a_background_move_waits_for_a_busy_device_and_an_operator_move_does_not() {
    // 1 MiB on a 1.2 MiB tier: over its high watermark, so the plan demotes it.
    let t = store("1200KiB", "1GiB", "f", MIB);
    let s = t.s();
    let stop = Arc::new(AtomicBool::new(false));
    let user = reader(s, &stop);
    load_device(s, "t1", 0.9);

    let started = Instant::now();
    let moved = s.plan_and_move(&AtomicBool::new(false));
    let background = started.elapsed();
    let backed_off = s.status().mover.backed_off_ms;

    // The operator takes it back at once, with the device just as busy.
    let started = Instant::now();
    let back = s.move_now("f".as_ref(), "t0").unwrap();
    let operator = started.elapsed();
    let operator_backed_off = s.status().mover.backed_off_ms - backed_off;
    stop.store(true, Ordering::Relaxed);
    let reads = user.join().unwrap();

    assert_eq!(moved, MIB as u64, "the plan demoted f");
    assert!(reads > 0);
    assert!(
        background >= BACKOFF - Duration::from_millis(100),
        "the background move did not back off: {background:?}"
    );
    assert!(backed_off >= 1900, "backed off for {backed_off} ms");
    assert_eq!(back, MIB as u64);
    assert_eq!(tiers_of(s, "f"), ["t0"]);
    // Counted, not timed (a slow disk's copy and fsync must not count as waiting): the
    // mover's waits add to its backoff time, and the operator's move added none.
    assert_eq!(
        operator_backed_off, 0,
        "the operator move backed off for {operator_backed_off} ms (took {operator:?})"
    );
    assert!(
        operator < Duration::from_secs(10),
        "the operator move took {operator:?}"
    );
    assert_eq!(read_all(s, "f", MIB), pattern(MIB, 3));
}

#[test]
fn a_move_does_not_back_off_for_its_own_load() {
    // 3.5 MiB (four 1 MiB pieces) on a 4 MiB tier: demoted by the plan. The device reads
    // 90% busy throughout but no user goes through kaiso: before the first piece the load
    // is someone else's (the mover was idle) and the move waits; once it copies, the load
    // is taken for its own, so the other three pieces do not wait.
    let len = 3 * MIB + MIB / 2;
    let t = store("4MiB", "1GiB", "f", len);
    let s = t.s();
    load_device(s, "t1", 0.9);
    let started = Instant::now();
    let moved = s.plan_and_move(&AtomicBool::new(false));
    let took = started.elapsed();
    assert_eq!(moved, len as u64);
    assert_eq!(tiers_of(s, "f"), ["t1"]);
    assert!(
        took >= BACKOFF - Duration::from_millis(100),
        "outside load before the move did not hold it back: {took:?}"
    );
    // Backing off before every piece would take at least 4 x 2 s; one backoff and the
    // copy take a little over 2 s, more on a loaded machine (its 100 polls of 20 ms
    // stretch): 7 s tells the two apart with room on both sides. The mover's own count
    // of its waits (20 ms a poll, whatever the machine) says the same without a clock:
    // one backoff (and a poll or so per later piece), not four.
    let backed_off = s.status().mover.backed_off_ms;
    assert!(
        backed_off < 2 * BACKOFF.as_millis() as u64,
        "the move backed off for its own load: {backed_off} ms in {took:?}"
    );
    assert!(
        took < BACKOFF * 7 / 2,
        "the move backed off for its own load: {took:?}"
    );
    assert_eq!(read_all(s, "f", len), pattern(len, 3));
}

#[test]
fn max_rate_bounds_a_copy() {
    // 6 MiB at 4 MiB/s: at least 1.5 s, whatever the disk could do.
    let len = 6 * MIB;
    let t = store("1GiB", "4MiB", "f", len);
    let s = t.s();
    let started = Instant::now();
    assert_eq!(s.move_now("f".as_ref(), "t1").unwrap(), len as u64);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1450),
        "6 MiB moved in {took:?} at max_rate 4 MiB/s"
    );
    assert_eq!(tiers_of(s, "f"), ["t1"]);
    // The same copy back without the limit is not held to it.
    let mut t = t;
    t.cfg_text = t
        .cfg_text
        .replace("max_rate = \"4MiB\"", "max_rate = \"1GiB\"");
    let s = t.reopen();
    let started = Instant::now();
    assert_eq!(s.move_now("f".as_ref(), "t0").unwrap(), len as u64);
    let unlimited = started.elapsed();
    assert!(unlimited < took, "{unlimited:?} vs {took:?}");
}

/// Reads `path` in 4 KiB `O_DIRECT` requests, back to back, until `stop`: load on the
/// real device kaiso cannot see (another program's). None when the file system does not
/// take `O_DIRECT` (tmpfs).
fn direct_reader(path: &std::path::Path, stop: &Arc<AtomicBool>) -> Option<JoinHandle<u64>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let f = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .ok()?;
    let blocks = f.metadata().ok()?.len() / 4096;
    let stop = stop.clone();
    Some(std::thread::spawn(move || {
        let mut buf = vec![0u8; 8192];
        let skew = buf.as_ptr().align_offset(4096);
        let mut reads = 0u64;
        while !stop.load(Ordering::Relaxed) {
            // Scattered blocks, so the device's read-ahead does not serve them.
            let block = reads.wrapping_mul(7919) % blocks.max(1);
            if f.read_at(&mut buf[skew..skew + 4096], block * 4096)
                .is_err()
            {
                break;
            }
            reads += 1;
        }
        reads
    }))
}

/// On the real block device under the test's directory (no injected load): another
/// program's `O_DIRECT` reads make the device busy, the tier's utilisation shows it, and
/// a background move waits. Skipped (with a note) where the directory has no block
/// device, does not take `O_DIRECT`, or the reads cannot keep the device over half busy.
#[test]
fn a_busy_real_device_holds_a_background_move_back() {
    let mut t = store("1200KiB", "1GiB", "f", MIB);
    t.cfg_text = t
        .cfg_text
        .replace("[store.mover]\n", "[store.mover]\nbusy_backoff = 0.3\n");
    let s = t.reopen();
    let s = &s;
    let load = t.dir.path().join("load");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&load).unwrap();
        for i in 0..64 {
            f.write_all(&pattern(MIB, i)).unwrap();
        }
        f.sync_all().unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    // Two readers: one request at a time left the device idle half of the time here.
    let others: Option<Vec<_>> = (0..2).map(|_| direct_reader(&load, &stop)).collect();
    let Some(others) = others else {
        stop.store(true, Ordering::Relaxed);
        eprintln!("skipped: no O_DIRECT on the test directory's file system");
        return;
    };
    s.sample_utilisation();
    std::thread::sleep(Duration::from_millis(300));
    let busy = s.sample_utilisation();
    if busy.iter().all(|&b| b <= 0.5) {
        stop.store(true, Ordering::Relaxed);
        for o in others {
            o.join().unwrap();
        }
        eprintln!("skipped: the device under the test directory reads {busy:?} busy");
        return;
    }
    let started = Instant::now();
    let moved = s.plan_and_move(&AtomicBool::new(false));
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = others.into_iter().map(|o| o.join().unwrap()).sum();
    let backed_off = s.status().mover.backed_off_ms;
    eprintln!(
        "real device: {busy:?} busy, {reads} direct reads, move took {took:?}, \
         backed off {backed_off} ms"
    );
    assert_eq!(moved, MIB as u64);
    // The first check uses the figure sampled above, so the move waits at least one
    // poll; how long depends on how busy the reads keep the device (up to 2 s; on a
    // loaded machine the readers may get too little CPU to keep it busy).
    assert!(
        backed_off >= 20 && took >= Duration::from_millis(20),
        "a move on a {busy:?} busy device did not wait: {took:?}, {backed_off} ms"
    );
}
