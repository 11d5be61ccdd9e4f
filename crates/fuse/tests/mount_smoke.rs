//! Smoke tests through a real FUSE mount (the full POSIX suite lives in crates/kaiso/tests).

mod common;
use common::fuse_available;
use kaiso_store::{Store, StoreConfig};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Env {
    dir: tempfile::TempDir,
    store: Arc<Store>,
    mount: Option<kaiso_fuse::Mounted>,
}

impl Env {
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
    fn tier(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("t{i}"))
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

fn setup(passthrough: bool) -> Option<Env> {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    for d in ["t0", "t1", "mnt"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\npassthrough = {1}\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"1MiB\"\nhigh_watermark = 1.0\n\
         [[tier]]\nname = \"slow\"\npath = \"{0}/t1\"\ncapacity = \"64MiB\"\n",
        dir.path().display(),
        passthrough
    );
    let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
    let opts = kaiso_fuse::MountOptions {
        passthrough,
        ..Default::default()
    };
    let mount = kaiso_fuse::mount(store.clone(), &dir.path().join("mnt"), &opts).unwrap();
    Some(Env {
        dir,
        store,
        mount: Some(mount),
    })
}

fn basic_ops(e: &Env) {
    let m = e.mnt();
    std::fs::create_dir_all(m.join("a/b")).unwrap();
    std::fs::write(m.join("a/b/f"), b"hello").unwrap();
    assert_eq!(std::fs::read(m.join("a/b/f")).unwrap(), b"hello");
    std::fs::hard_link(m.join("a/b/f"), m.join("a/g")).unwrap();
    assert_eq!(std::fs::metadata(m.join("a/g")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("b/f", m.join("a/s")).unwrap();
    assert_eq!(std::fs::read(m.join("a/s")).unwrap(), b"hello");
    std::fs::rename(m.join("a/b/f"), m.join("a/renamed")).unwrap();
    let mut names: Vec<String> = std::fs::read_dir(m.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "g", "renamed", "s"]);
    // Spill: 3 MiB into a 1 MiB fast tier lands on the slow tier, no ENOSPC.
    let big: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
    std::fs::write(m.join("big"), &big).unwrap();
    assert_eq!(std::fs::read(m.join("big")).unwrap(), big);
    assert!(e.tier(1).join("big").exists() && !e.tier(0).join("big").exists());
    // O_APPEND, truncate, statfs.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.join("a/renamed"))
        .unwrap();
    f.write_all(b" world").unwrap();
    drop(f);
    assert_eq!(std::fs::read(m.join("a/g")).unwrap(), b"hello world");
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.join("a/g"))
        .unwrap()
        .set_len(2)
        .unwrap();
    assert_eq!(std::fs::read(m.join("a/renamed")).unwrap(), b"he");
    std::fs::remove_dir(m.join("a/b")).unwrap();
    assert_eq!(
        std::fs::remove_dir(m.join("a")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
}

#[test]
fn posix_basics_through_the_mount() {
    let Some(e) = setup(false) else { return };
    basic_ops(&e);
}

#[test]
fn posix_basics_with_passthrough() {
    let Some(e) = setup(true) else { return };
    basic_ops(&e);
}

#[test]
fn an_open_file_moves_and_keeps_working() {
    let Some(e) = setup(false) else { return };
    let m = e.mnt();
    std::fs::write(m.join("f"), b"0123456789").unwrap();
    let ino = std::fs::metadata(m.join("f")).unwrap().ino();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.join("f"))
        .unwrap();
    e.store.move_now(Path::new("f"), "slow").unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"abc").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "0123456789abc");
    drop(f);
    assert_eq!(
        std::fs::read(e.tier(1).join("f")).unwrap(),
        b"0123456789abc"
    );
    assert!(!e.tier(0).join("f").exists());
    assert_eq!(
        std::fs::metadata(m.join("f")).unwrap().ino(),
        ino,
        "inode number kept across the move"
    );
}

#[test]
fn busy_mountpoint_is_a_clear_error() {
    let Some(e) = setup(false) else { return };
    let err = kaiso_fuse::preflight(&e.mnt()).unwrap_err().to_string();
    assert!(err.contains("busy"), "{err}");
    let err = kaiso_fuse::preflight(&e.dir.path().join("nope"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
}

/// Names the kernel was told are missing are cached for at most a second: creating them
/// through the mount works at once, and one created directly in a tier directory shows up
/// within the negative-entry time. Closing never needs FLUSH (kaiso answers it ENOSYS).
#[test]
fn negative_entries_are_short_lived_and_creatable() {
    let Some(e) = setup(true) else { return };
    let p = e.mnt().join("later");
    assert_eq!(
        std::fs::metadata(&p).unwrap_err().kind(),
        std::io::ErrorKind::NotFound
    );
    // A cached negative entry must not stand in the way of a create through the mount.
    std::fs::write(&p, b"now").unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"now");
    std::fs::remove_file(&p).unwrap();
    assert!(std::fs::metadata(&p).is_err());
    std::fs::create_dir(&p).unwrap();
    assert!(std::fs::metadata(&p).unwrap().is_dir());

    // Created behind kaiso's back, in the slow tier: visible once the negative entry expires.
    let q = e.mnt().join("direct");
    assert!(std::fs::metadata(&q).is_err());
    std::fs::write(e.tier(1).join("direct"), b"adopted").unwrap();
    let deadline = std::time::Instant::now()
        + kaiso_fuse::MAX_NEGATIVE_TTL
        + std::time::Duration::from_secs(3);
    loop {
        if let Ok(d) = std::fs::read(&q) {
            assert_eq!(d, b"adopted");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a file created in a tier directory stayed hidden past the negative TTL"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Many opens and closes (each close used to cost a FLUSH round trip) keep working.
    for i in 0..50 {
        let f = e.mnt().join(format!("c{i}"));
        std::fs::File::create(&f).unwrap().write_all(b"x").unwrap();
        assert_eq!(std::fs::read(&f).unwrap(), b"x");
    }
}

/// An ioctl kaiso does not know gets what a plain file answers (ENOTTY: "not a terminal"),
/// not ENOSYS; every buffered Python open() asks TCGETS.
#[test]
fn unknown_ioctls_answer_enotty() {
    use std::os::fd::AsRawFd;
    let Some(e) = setup(false) else { return };
    let p = e.mnt().join("f");
    std::fs::write(&p, b"x").unwrap();
    let plain = e.tier(0).parent().unwrap().join("plain");
    std::fs::write(&plain, b"x").unwrap();
    let tcgets = |p: &Path| {
        let f = std::fs::File::open(p).unwrap();
        let mut termios = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: TCGETS writes at most one termios into the buffer given.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TCGETS, termios.as_mut_ptr()) };
        (r, std::io::Error::last_os_error().raw_os_error())
    };
    assert_eq!(tcgets(&plain), (-1, Some(libc::ENOTTY)));
    assert_eq!(tcgets(&p), (-1, Some(libc::ENOTTY)));
}
