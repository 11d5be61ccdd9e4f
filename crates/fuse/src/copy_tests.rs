//! copy_file_range on a real mount: `cp` of a big file sends its bytes from backing file to
//! backing file (COPY_FILE_RANGE requests), none through the daemon as WRITE requests, and
//! the destination's tier accounts the copy.

use crate::{MountOptions, Mounted};
use kaiso_store::{Store, StoreConfig};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SIZE: usize = 64 << 20;

fn fuse_available() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

/// A store of two plain tiers ("fast" on t0, "slow" on t1) mounted on `mnt`; unmounted and
/// shut down on drop.
struct Env {
    dir: tempfile::TempDir,
    store: Arc<Store>,
    mount: Option<Mounted>,
}

impl Env {
    fn new(passthrough: bool, seed: &[u8]) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["t0", "t1", "mnt"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        std::fs::write(root.join("t0/big"), seed).unwrap();
        std::fs::write(root.join("t1/slow-dst"), b"").unwrap();
        let text = format!(
            "[store]\nstate_dir = \"{0}/state\"\npassthrough = {passthrough}\n\
             [store.mover]\nenabled = false\n\
             [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"8GiB\"\n\
             [[tier]]\nname = \"slow\"\npath = \"{0}/t1\"\ncapacity = \"8GiB\"\n",
            root.display()
        );
        let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
        let opts = MountOptions {
            passthrough,
            ..MountOptions::default()
        };
        let mount = crate::mount(store.clone(), &root.join("mnt"), &opts).unwrap();
        // The first request waits for INIT.
        std::fs::metadata(root.join("mnt/big")).unwrap();
        Env {
            dir,
            store,
            mount: Some(mount),
        }
    }

    fn p(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }

    fn counts(&self) -> (u64, u64) {
        let s = self.mount.as_ref().unwrap().stats();
        (
            s.writes.load(Ordering::Relaxed),
            s.copies.load(Ordering::Relaxed),
        )
    }

    /// Waits (up to 10 s) for the tiers' usage to read `want` (a closed file's RELEASE
    /// reaches the daemon after close(2) returned).
    fn wait_used(&self, want: [u64; 2]) -> [u64; 2] {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let t = self.store.status().tiers;
            let got = [t[0].used, t[1].used];
            if got == want || Instant::now() > end {
                return got;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(m) = self.mount.take() {
            let _ = m.unmount();
        }
        self.store.shutdown();
    }
}

fn pattern() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 7 % 251) as u8).collect()
}

/// Compares a backing file with `want` (read beside the mount: no READ counted).
fn assert_same(p: &Path, want: &[u8]) {
    let got = std::fs::read(p).unwrap();
    assert_eq!(got.len(), want.len(), "{}: size", p.display());
    assert!(
        got == want,
        "{}: contents differ from the source",
        p.display()
    );
}

/// `cp` of a 64 MiB file on the mount, with and without passthrough: no WRITE reaches the
/// daemon, the copy is whole, and the tier accounts it.
#[test]
fn cp_of_a_big_file_sends_no_write_through_the_daemon() {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return;
    }
    let data = pattern();
    for passthrough in [false, true] {
        let env = Env::new(passthrough, &data);
        let (w0, c0) = env.counts();
        let out = std::process::Command::new("cp")
            .arg(env.p("mnt/big"))
            .arg(env.p("mnt/copy"))
            .output()
            .expect("cp runs");
        assert!(
            out.status.success(),
            "cp failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let (w1, c1) = env.counts();
        assert_eq!(
            w1 - w0,
            0,
            "cp (passthrough {passthrough}) sent {} WRITE requests through the daemon",
            w1 - w0
        );
        assert!(
            c1 > c0,
            "cp (passthrough {passthrough}) sent no COPY_FILE_RANGE request (coreutils \
             without copy_file_range?)"
        );
        assert_same(&env.p("t0/copy"), &data);
        let used = env.wait_used([2 * SIZE as u64, 0]);
        assert_eq!(
            used,
            [2 * SIZE as u64, 0],
            "tier usage after cp (passthrough {passthrough}): source and copy on the fast tier"
        );
    }
}

/// copy_file_range(2) on the mount into a file on another tier, in one call: the copy
/// lands on that tier, whole, accounted there, without WRITE requests.
#[test]
fn copy_into_a_file_on_another_tier() {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return;
    }
    let data = pattern();
    let env = Env::new(false, &data);
    let (w0, c0) = env.counts();
    let src = std::fs::File::open(env.p("mnt/big")).unwrap();
    let dst = std::fs::OpenOptions::new()
        .write(true)
        .open(env.p("mnt/slow-dst"))
        .unwrap();
    let mut done = 0usize;
    while done < SIZE {
        let r = unsafe {
            libc::copy_file_range(
                src.as_raw_fd(),
                std::ptr::null_mut(),
                dst.as_raw_fd(),
                std::ptr::null_mut(),
                SIZE - done,
                0,
            )
        };
        assert!(
            r > 0,
            "copy_file_range returned {r} ({}) after {done} bytes",
            std::io::Error::last_os_error()
        );
        done += r as usize;
    }
    drop((src, dst));
    let (w1, c1) = env.counts();
    assert_eq!(w1 - w0, 0, "WRITE requests reached the daemon");
    assert!(c1 > c0, "no COPY_FILE_RANGE request reached the daemon");
    assert_same(&env.p("t1/slow-dst"), &data);
    let used = env.wait_used([SIZE as u64, SIZE as u64]);
    assert_eq!(
        used,
        [SIZE as u64, SIZE as u64],
        "tier usage: the source on the fast tier, the copy on the slow one"
    );
}
