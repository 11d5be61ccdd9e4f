//! A file held open through kernel passthrough cannot move (the kernel reads the backing
//! file itself). A planned move refused for that waits: new opens of the file go through
//! kaiso as soon as no passthrough handle is open, so the passthrough handles drain even
//! while readers keep re-opening the file, and the move goes through with the handles
//! served by kaiso re-pointed at the new copy.

mod common;
use common::*;
use kaiso_store::{Opened, ROOT_INO, Store, StoreConfig};
use std::ffi::OsStr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

const LEN: usize = 1 << 20;

/// A store over a fast tier t0 and a slow tier t1 (both plain directories, so opens may be
/// passthrough) holding `hot` on t1; the background mover is off (the test plans).
fn store_with_file_on_slow_tier(dir: &Path) -> (Arc<Store>, u64) {
    store_with_mover(dir, "enabled = false")
}

/// The same with `mover` in place of the `[store.mover]` line `enabled = false`.
fn store_with_mover(dir: &Path, mover: &str) -> (Arc<Store>, u64) {
    for t in ["t0", "t1"] {
        std::fs::create_dir(dir.join(t)).unwrap();
    }
    std::fs::write(dir.join("t1").join("hot"), pattern(LEN, 3)).unwrap();
    let text = config_text(dir, &["64MiB", "1GiB"]).replace("enabled = false", mover);
    let s = Store::open(StoreConfig::from_toml_str(&text, "test.toml").unwrap()).unwrap();
    let ino = s.lookup(ROOT_INO, OsStr::new("hot")).unwrap().ino;
    (s, ino)
}

fn tiers_of(s: &Store, name: &str) -> Vec<String> {
    s.where_is(Path::new(name)).unwrap().tiers
}

/// Makes `hot` hot (opened again and again: each open is a touch), then holds it through
/// passthrough while the mover plans its promotion, which is refused. Returns the handle.
fn hold_while_a_promotion_is_refused(s: &Store, ino: u64, stop: &AtomicBool) -> Opened {
    for _ in 0..5 {
        let o = s.open_file(ino, libc::O_RDONLY, true).unwrap();
        assert!(o.passthrough.is_some(), "a resident file on a plain tier");
        s.release(o.fh).unwrap();
    }
    let first = s.open_file(ino, libc::O_RDONLY, true).unwrap();
    assert!(first.passthrough.is_some());
    assert_eq!(
        s.plan_and_move(stop),
        0,
        "refused: open through passthrough"
    );
    first
}

#[test]
fn a_move_refused_for_passthrough_opens_drains_them_and_moves_the_file_while_open() {
    let dir = tempfile::tempdir().unwrap();
    let (s, ino) = store_with_file_on_slow_tier(dir.path());
    let stop = AtomicBool::new(false);
    let first = hold_while_a_promotion_is_refused(&s, ino, &stop);
    assert_eq!(tiers_of(&s, "hot"), ["t1"]);
    // While that handle is open, a new open must join it through passthrough (kernel
    // rule), and the move still cannot happen.
    let joined = s.open_file(ino, libc::O_RDONLY, true).unwrap();
    assert!(joined.passthrough.is_some(), "joins the passthrough open");
    assert_eq!(s.retry_waiting_moves(&stop), 0);
    s.release(joined.fh).unwrap();
    // The passthrough handles close while a reader opens the file again: that open is
    // served through kaiso, so nothing holds the move back any more.
    s.release(first.fh).unwrap();
    let second = s.open_file(ino, libc::O_RDONLY, true).unwrap();
    assert!(
        second.passthrough.is_none(),
        "a file whose move waits is opened through kaiso once no passthrough open is left"
    );
    // The waiting move goes through while that handle is open, without a new plan.
    assert_eq!(s.retry_waiting_moves(&stop), LEN as u64);
    assert_eq!(tiers_of(&s, "hot"), ["t0"]);
    assert!(!dir.path().join("t1").join("hot").exists());
    // The open handle was re-pointed at the new copy.
    assert_eq!(s.read(second.fh, 0, LEN as u32).unwrap(), pattern(LEN, 3));
    s.release(second.fh).unwrap();
    // Moved: the mark is gone and opens are passthrough again, on the fast tier.
    let again = s.open_file(ino, libc::O_RDONLY, true).unwrap();
    let pt = again
        .passthrough
        .as_ref()
        .expect("passthrough again after the move");
    let mut buf = vec![0u8; 16];
    std::os::unix::fs::FileExt::read_exact_at(&**pt, &mut buf, 0).unwrap();
    assert_eq!(buf, pattern(LEN, 3)[..16]);
    s.release(again.fh).unwrap();
    s.shutdown();
}

/// A waiting move of a file that is deleted meanwhile is dropped, and the mark goes with
/// it (no later move, nothing left behind).
#[test]
fn a_waiting_move_of_a_deleted_file_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (s, ino) = store_with_file_on_slow_tier(dir.path());
    let stop = AtomicBool::new(false);
    let first = hold_while_a_promotion_is_refused(&s, ino, &stop);
    s.unlink(ROOT_INO, OsStr::new("hot")).unwrap();
    s.release(first.fh).unwrap();
    assert_eq!(s.retry_waiting_moves(&stop), 0);
    assert_eq!(
        s.retry_waiting_moves(&stop),
        0,
        "dropped, not waiting any more"
    );
    assert!(!dir.path().join("t0").join("hot").exists());
    assert!(!dir.path().join("t1").join("hot").exists());
    s.shutdown();
}

/// The same with the background mover: the waiting move goes through by itself soon after
/// the passthrough handle closes, not only at a later plan.
#[test]
fn the_background_mover_retries_a_waiting_move_by_itself() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    // Plans every 60 s (the test plans once itself), so only the retry of the waiting
    // move can move the file in time.
    let (s, ino) = store_with_mover(dir.path(), "enabled = true\ninterval_ms = 60000");
    let stop = AtomicBool::new(false);
    let first = hold_while_a_promotion_is_refused(&s, ino, &stop);
    assert_eq!(s.status().mover.waiting_files, 1);
    let bg = s.start_background();
    s.release(first.fh).unwrap();
    let second = s.open_file(ino, libc::O_RDONLY, true).unwrap();
    assert!(second.passthrough.is_none());
    // The retry copies and syncs the file: 30 s bounds a loaded machine's disk (the
    // loop ends as soon as the file is moved).
    let t = Instant::now();
    while tiers_of(&s, "hot") != ["t0"] && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        tiers_of(&s, "hot"),
        ["t0"],
        "moved by the waiting move's retry"
    );
    assert_eq!(s.status().mover.waiting_files, 0);
    assert_eq!(s.read(second.fh, 0, 64).unwrap(), pattern(LEN, 3)[..64]);
    s.release(second.fh).unwrap();
    drop(bg);
    s.shutdown();
}
