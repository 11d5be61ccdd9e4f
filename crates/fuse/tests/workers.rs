//! The FUSE workers through a real mount: one reads while the others stand by
//! (`kaiso_fuse::gate`), yet a request that blocks never holds up the others, and an
//! unmount from outside still ends the session. Also: a create's reply carries the new
//! file's attributes (taken once, when it was made).

mod common;
use common::fuse_available;
use kaiso_store::{Store, StoreConfig};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

struct Env {
    dir: tempfile::TempDir,
    store: Arc<Store>,
    mount: Option<kaiso_fuse::Mounted>,
}

impl Env {
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
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

/// Two tiers, four workers; the slow tier's reads take `slow_read` each (an emulated SSD
/// with that latency). `seed` files are put into the slow tier before the store opens.
fn setup(slow_read: Duration, seed: &[(&str, &[u8])]) -> Option<Env> {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    for d in ["t0", "t1", "mnt"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    for (name, data) in seed {
        std::fs::write(dir.path().join("t1").join(name), data).unwrap();
    }
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"64MiB\"\n\
         [[tier]]\nname = \"slow\"\npath = \"{0}/t1\"\ncapacity = \"64MiB\"\n\
         [tier.device]\nkind = \"ssd\"\nread_latency_us = {1}\n",
        dir.path().display(),
        slow_read.as_micros()
    );
    let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
    let opts = kaiso_fuse::MountOptions {
        threads: 4,
        ..Default::default()
    };
    let mount = kaiso_fuse::mount(store.clone(), &dir.path().join("mnt"), &opts).unwrap();
    Some(Env {
        dir,
        store,
        mount: Some(mount),
    })
}

/// Serial requests (the workers then stand by), as in a metadata loop.
fn serial_ops(e: &Env, n: usize) {
    common::metadata_burst(&e.mnt().join("serial"), n);
}

/// A read from the slow tier occupies its worker for seconds; meanwhile other requests
/// are served (a parked worker is handed back to the kernel), not queued behind it.
#[test]
fn a_blocked_request_does_not_hold_up_the_others() {
    let slow = Duration::from_secs(3);
    let Some(e) = setup(slow, &[("cold", b"on the slow tier")]) else {
        return;
    };
    serial_ops(&e, 50);
    let cold = e.mnt().join("cold");
    let reader = std::thread::spawn(move || {
        let t = Instant::now();
        let mut s = String::new();
        std::fs::File::open(&cold)
            .unwrap()
            .read_to_string(&mut s)
            .unwrap();
        (s, t.elapsed())
    });
    // Let the read reach the daemon and start waiting for the emulated device.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    serial_ops(&e, 20);
    let others = t.elapsed();
    let (text, read_took) = reader.join().unwrap();
    assert_eq!(text, "on the slow tier");
    assert!(
        read_took >= slow - Duration::from_millis(500),
        "the read was not slow ({read_took:?}): the test proves nothing"
    );
    assert!(
        others < slow / 2,
        "requests waited {others:?} behind a read that took {read_took:?}"
    );
}

/// `fusermount3 -u` from outside ends the session although workers stand by.
#[test]
fn an_unmount_from_outside_ends_the_session() {
    let Some(mut e) = setup(Duration::from_micros(100), &[]) else {
        return;
    };
    serial_ops(&e, 50);
    let st = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(e.mnt())
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!("skipping: fusermount3 -u failed");
        return;
    }
    let m = e.mount.take().unwrap();
    let deadline = Instant::now() + kaiso_fuse::gate::PARK_TIMEOUT + Duration::from_secs(5);
    while !m.finished() {
        assert!(
            Instant::now() < deadline,
            "the session did not end after an outside unmount"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    m.unmount().unwrap();
}

/// The umask of this process (read without changing it).
fn current_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// What `stat` shows right after a create comes from the create's reply (the kernel
/// caches it): mode, owner, size and inode number of the new backing file.
#[test]
fn a_create_replies_with_the_new_files_attributes() {
    let Some(e) = setup(Duration::from_micros(100), &[]) else {
        return;
    };
    let umask = current_umask();
    for (i, mode) in [0o644u32, 0o600, 0o755, 0o4750].into_iter().enumerate() {
        let p = e.mnt().join(format!("new{i}"));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&p)
            .unwrap();
        let seen = std::fs::metadata(&p).unwrap();
        let backing = std::fs::symlink_metadata(e.dir.path().join("t0").join(format!("new{i}")))
            .expect("new files go to the fast tier");
        assert_eq!(
            seen.mode() & 0o7777,
            mode & !umask & 0o7777,
            "mode {mode:o}"
        );
        assert_eq!(seen.mode(), backing.mode());
        assert_eq!((seen.uid(), seen.gid()), (backing.uid(), backing.gid()));
        assert_eq!(seen.len(), 0);
        assert_eq!(seen.nlink(), 1);
        // The number the kernel got is the one a later lookup gives.
        f.write_all(b"x").unwrap();
        drop(f);
        let ino = seen.ino();
        assert_eq!(
            e.store
                .lookup(1, std::ffi::OsStr::new(&format!("new{i}")))
                .unwrap()
                .ino,
            ino
        );
    }
    // A symlink and a FIFO take the same path.
    std::os::unix::fs::symlink("new0", e.mnt().join("link")).unwrap();
    let l = std::fs::symlink_metadata(e.mnt().join("link")).unwrap();
    assert!(l.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(e.mnt().join("link")).unwrap(),
        PathBuf::from("new0")
    );
    let fifo =
        std::ffi::CString::new(e.mnt().join("fifo").into_os_string().into_encoded_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    let m = std::fs::metadata(e.mnt().join("fifo")).unwrap();
    assert_eq!(m.mode() & libc::S_IFMT, libc::S_IFIFO);
    assert_eq!(m.mode() & 0o777, 0o640 & !umask);
}
