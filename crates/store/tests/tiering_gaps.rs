//! Placement and mover gaps of issue 2 (audit of session 7): the planner plans with the
//! sizes files grew to after creation; a tier's room is bounded by its file system's real
//! free space; the state directory is private whatever the umask; moves keep atime and
//! file capabilities; `where` shows the name asked for.

mod common;
use common::*;
use kaiso_store::{Caller, ROOT_INO, Store, StoreConfig};
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

const MIB: u64 = 1 << 20;

fn running_as_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A store over `t0` (10 MiB, watermarks 0.5/0.8) and `t1` (1 GiB), `extra` added to
/// `[store]`.
fn watermark_store(extra: &str) -> TestStore {
    let mut t = TestStore::new(&["10MiB", "1GiB"]);
    t.cfg_text = t
        .cfg_text
        .replacen("high_watermark = 1.0", "high_watermark = 0.8", 1)
        .replace("[store]\n", &format!("[store]\n{extra}"));
    t.reopen();
    t
}

/// Create `name` in the root for reading and writing, asking for passthrough when
/// `passthrough` (as a face would).
fn create_in_root(
    s: &Store,
    name: &str,
    passthrough: bool,
) -> (kaiso_store::FileAttr, kaiso_store::Opened) {
    s.create(
        ROOT_INO,
        OsStr::new(name),
        0o644,
        0,
        libc::O_RDWR,
        Caller::ROOT,
        passthrough,
    )
    .unwrap()
}

/// Create `name` empty (the policy is told 0 bytes), then write `len` bytes to it through
/// a second open: the way files written through a mount grow.
fn create_then_grow(t: &TestStore, name: &str, len: usize) -> u64 {
    let s = t.s();
    let (attr, o) = create_in_root(s, name, false);
    s.release(o.fh).unwrap();
    append(t, name, len);
    attr.ino
}

fn append(t: &TestStore, name: &str, len: usize) {
    let s = t.s();
    let a = t.lookup_path(name).unwrap();
    let o = s.open_file(a.ino, libc::O_RDWR, false).unwrap();
    let data = pattern(len, a.ino as u8);
    assert_eq!(s.write(o.fh, a.size, &data).unwrap() as usize, len);
    s.release(o.fh).unwrap();
}

fn used(s: &Store, tier: usize) -> u64 {
    s.status().tiers[tier].used
}

#[test]
fn files_grown_after_creation_drain_to_the_low_watermark_not_to_empty() {
    let t = watermark_store("");
    for i in 1..=8 {
        create_then_grow(&t, &format!("f{i}"), MIB as usize);
    }
    assert_eq!(used(t.s(), 0), 8 * MIB, "all eight files on the fast tier");
    // 9 MiB: over the high watermark (8 MiB).
    append(&t, "f1", MIB as usize);
    t.s().plan_and_move(&AtomicBool::new(false));
    let fast = used(t.s(), 0);
    assert!(
        (4 * MIB..=5 * MIB).contains(&fast),
        "fast tier drained to about its low watermark (5 MiB), not emptied: {fast} bytes"
    );
    assert_eq!(used(t.s(), 0) + used(t.s(), 1), 9 * MIB);
    let e = t.s().explain("f2".as_ref()).unwrap();
    assert!(e.policy.contains("1.0 MiB"), "{e:?}");
}

#[test]
fn promotions_of_grown_files_stop_at_the_high_watermark() {
    let t = watermark_store("placement = \"tier:t1\"\n");
    for i in 1..=12 {
        create_then_grow(&t, &format!("f{i}"), MIB as usize);
    }
    assert_eq!(used(t.s(), 1), 12 * MIB);
    for i in 1..=12 {
        let s = t.s();
        let a = t.lookup_path(&format!("f{i}")).unwrap();
        for k in 0..4u64 {
            let o = s.open_file(a.ino, libc::O_RDONLY, false).unwrap();
            s.read(o.fh, (k * 7919) % a.size, 16).unwrap();
            s.release(o.fh).unwrap();
        }
    }
    for _ in 0..3 {
        t.s().plan_and_move(&AtomicBool::new(false));
        let fast = used(t.s(), 0);
        assert!(fast <= 8 * MIB, "promoted past the high watermark: {fast}");
    }
    let st = t.s().status();
    assert!(st.tiers[0].used > 0, "hot files were promoted: {st:?}");
    assert_eq!(st.mover.failed_moves, 0, "{st:?}");
}

/// A tmpfs of `size` mounted on a new directory; unmounted when dropped. None when
/// mounting is not possible here (not root, no tmpfs).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        if !running_as_root() {
            return None;
        }
        let d = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(d.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Tmpfs(d))
    }
    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// A store whose fast tier is a 4 MiB tmpfs configured as 10 GiB (passthrough writers on).
fn store_on_small_fs(fs: &Tmpfs, slow: &Path, state: &Path) -> Arc<Store> {
    let cfg = format!(
        "[store]\nstate_dir = \"{}\"\npassthrough = true\npassthrough_writes = true\n\
         [store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{}\"\ncapacity = \"10GiB\"\n\
         [[tier]]\nname = \"slow\"\npath = \"{}\"\ncapacity = \"1GiB\"\n",
        state.display(),
        fs.path().display(),
        slow.display()
    );
    Store::open(StoreConfig::from_toml_str(&cfg, "small.toml").unwrap()).unwrap()
}

/// A store over a fresh 4 MiB tmpfs and a slow tier in a temporary directory, with that
/// directory (which holds `slow/` and the state); None (test skipped) without root.
fn small_fs_store() -> Option<(Tmpfs, tempfile::TempDir, Arc<Store>)> {
    let Some(fs) = Tmpfs::mount("4M") else {
        eprintln!("skipped: needs root to mount a tmpfs");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let slow = dir.path().join("slow");
    std::fs::create_dir(&slow).unwrap();
    let s = store_on_small_fs(&fs, &slow, &dir.path().join("state"));
    Some((fs, dir, s))
}

#[test]
fn a_nearly_full_file_system_refuses_passthrough_writers_and_writes_spill() {
    let Some((_fs, dir, s)) = small_fs_store() else {
        return;
    };
    let slow = dir.path().join("slow");
    let room = s.status().tiers[0].capacity;
    assert!(
        room <= 4 * MIB,
        "the fast tier's room is its file system's: {room}"
    );
    let (attr, o) = create_in_root(&s, "big", true);
    assert!(
        o.passthrough.is_none(),
        "a 1 GiB passthrough reserve does not fit a 4 MiB file system"
    );
    let data = pattern(8 * MIB as usize, 7);
    for (k, chunk) in data.chunks(MIB as usize).enumerate() {
        let n = s.write(o.fh, k as u64 * MIB, chunk).unwrap();
        assert_eq!(n as usize, chunk.len());
    }
    s.release(o.fh).unwrap();
    assert_eq!(s.where_is("big".as_ref()).unwrap().tiers, vec!["slow"]);
    assert_eq!(std::fs::read(slow.join("big")).unwrap(), data);
    assert_eq!(s.getattr(attr.ino, None).unwrap().size, 8 * MIB);
    s.shutdown();
}

#[test]
fn new_files_avoid_a_file_system_filled_by_others() {
    let Some((fs, _dir, s)) = small_fs_store() else {
        return;
    };
    // Another program fills the tier's file system (a hidden name kaiso does not index
    // until a scan; the point is the space it takes).
    let filler = fs.path().join(".other-program");
    let _ = std::fs::write(&filler, vec![1u8; 4 * MIB as usize]);
    // The store samples real free space every second (20 s: room for a loaded machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while s.status().tiers[0].capacity > MIB && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(s.status().tiers[0].capacity <= MIB, "{:?}", s.status());
    let (_, o) = create_in_root(&s, "new", false);
    s.write(o.fh, 0, &pattern(MIB as usize, 3)).unwrap();
    s.release(o.fh).unwrap();
    assert_eq!(s.where_is("new".as_ref()).unwrap().tiers, vec!["slow"]);
    s.shutdown();
}

#[test]
fn the_state_directory_and_its_lock_are_private_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("t0")).unwrap();
    let state = dir.path().join("deep/state");
    let cfg = config_text(dir.path(), &["1GiB"]).replace(
        &format!("\"{}\"", dir.path().join("state").display()),
        &format!("\"{}\"", state.display()),
    );
    // The daemons run with umask 0. (The umask is per process: this test binary's other
    // tests create nothing whose mode they check.)
    let old = unsafe { libc::umask(0) };
    let s = Store::open(StoreConfig::from_toml_str(&cfg, "t.toml").unwrap());
    unsafe { libc::umask(old) };
    let s = s.unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("lock")), 0o600);
    s.shutdown();
    drop(s);
    // An existing, group-writable state directory is used as it is (with a warning).
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o770)).unwrap();
    let s = Store::open(StoreConfig::from_toml_str(&cfg, "t.toml").unwrap()).unwrap();
    assert_eq!(mode(&state), 0o770);
    s.shutdown();
}

fn set_times(p: &Path, atime: i64, mtime: i64) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    let ts = [
        libc::timespec {
            tv_sec: atime,
            tv_nsec: 0,
        },
        libc::timespec {
            tv_sec: mtime,
            tv_nsec: 0,
        },
    ];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ts.as_ptr(), 0) },
        0
    );
}

#[test]
fn a_move_keeps_atime_and_mtime() {
    let t = TestStore::new(&["1GiB", "1GiB"]);
    t.put("f", &pattern(300_000, 4));
    // An old atime: reading the file would update it (relatime).
    set_times(&t.tier(0).join("f"), 1_000_000, 2_000_000);
    t.s().move_now("f".as_ref(), "t1").unwrap();
    let md = std::fs::metadata(t.tier(1).join("f")).unwrap();
    assert_eq!((md.atime(), md.mtime()), (1_000_000, 2_000_000));
    assert_eq!(t.get("f"), pattern(300_000, 4));
}

#[test]
fn a_move_keeps_file_capabilities() {
    if !running_as_root() {
        eprintln!("skipped: setting security.capability needs root");
        return;
    }
    let t = TestStore::new(&["1GiB", "1GiB"]);
    let ino = t.put("tool", &pattern(4096, 5));
    // VFS_CAP_REVISION_2, effective, CAP_NET_BIND_SERVICE permitted.
    let mut cap = Vec::new();
    for w in [0x0200_0001u32, 1 << 10, 0, 0, 0] {
        cap.extend_from_slice(&w.to_le_bytes());
    }
    let name = OsStr::new("security.capability");
    if let Err(e) = t.s().setxattr(ino, name, &cap, 0) {
        eprintln!("skipped: the tier's file system refuses security.capability: {e:?}");
        return;
    }
    // Owned by someone else, so the move's chown is a real one.
    std::os::unix::fs::lchown(t.tier(0).join("tool"), Some(1234), Some(1234)).unwrap();
    // The chown itself dropped it; set it again.
    t.s().setxattr(ino, name, &cap, 0).unwrap();
    t.s().move_now("tool".as_ref(), "t1").unwrap();
    assert_eq!(t.holders("tool", 2), vec![1]);
    assert_eq!(t.s().getxattr(ino, name).unwrap(), cap);
    let md = std::fs::metadata(t.tier(1).join("tool")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 1234));
}

#[test]
fn where_of_a_hard_link_shows_the_name_asked_for() {
    let t = TestStore::new(&["1GiB"]);
    let ino = t.put("p/a", b"hi");
    let q = t
        .s()
        .mkdir(ROOT_INO, OsStr::new("q"), 0o755, 0, Caller::ROOT)
        .unwrap()
        .ino;
    t.s().link(ino, q, OsStr::new("b")).unwrap();
    let w = t.s().where_is("q/b".as_ref()).unwrap();
    assert!(w.backing_path.ends_with("q/b"), "{w:?}");
    assert!(Path::new(&w.backing_path).exists());
    let e = t.s().explain("/p/a".as_ref()).unwrap();
    assert!(e.placement.backing_path.ends_with("p/a"), "{e:?}");
}

#[test]
fn a_move_keeps_its_directories_times() {
    let t = TestStore::new(&["1GiB", "1GiB"]);
    t.put("d/e/f", &pattern(100_000, 6));
    let secs = |p: &Path| {
        let md = std::fs::metadata(p).unwrap();
        (md.atime(), md.mtime())
    };
    for d in ["d", "d/e"] {
        set_times(&t.tier(0).join(d), 1_000_000, 2_000_000);
    }
    let e = t.lookup_path("d/e").unwrap().ino;
    let shown = |s: &Store| s.getattr(e, None).unwrap().mtime;
    let before = shown(t.s());
    // Demote: the slow tier creates d/e; the fast tier loses d/e/f.
    t.s().move_now("d/e/f".as_ref(), "t1").unwrap();
    assert_eq!(t.holders("d/e/f", 2), vec![1]);
    for d in ["d", "d/e"] {
        assert_eq!(secs(&t.tier(0).join(d)), (1_000_000, 2_000_000), "t0 {d}");
        assert_eq!(secs(&t.tier(1).join(d)), (1_000_000, 2_000_000), "t1 {d}");
    }
    assert_eq!(shown(t.s()), before);
    // And back.
    t.s().move_now("d/e/f".as_ref(), "t0").unwrap();
    assert_eq!(secs(&t.tier(0).join("d/e")), (1_000_000, 2_000_000));
    assert_eq!(shown(t.s()), before);
}

/// A move that fails after it created the destination's directories (here: a stray file
/// sits where its second name goes) takes its new name away again, and must leave the
/// directories' times as the mount showed them. Known broken: the rollback in
/// `move_file_inner` (mover.rs) does not restore them, so `d` now shows the time the
/// failed move created its copy on the fast tier.
#[test]
fn a_failed_move_keeps_its_directories_times() {
    let t = TestStore::new(&["1GiB", "1GiB"]);
    let ino = t.put("d/f", &pattern(10_000, 7));
    let g = t
        .s()
        .mkdir(ROOT_INO, OsStr::new("g"), 0o755, 0, Caller::ROOT)
        .unwrap()
        .ino;
    t.s().link(ino, g, OsStr::new("y")).unwrap();
    t.s().move_now("d/f".as_ref(), "t1").unwrap();
    assert_eq!(t.holders("d/f", 2), vec![1]);
    // `d` only on the slow tier, as for files placed there from the start.
    std::fs::remove_dir(t.tier(0).join("d")).unwrap();
    set_times(&t.tier(1).join("d"), 1_000_000, 2_000_000);
    let d = t.lookup_path("d").unwrap().ino;
    let before = t.s().getattr(d, None).unwrap().mtime;
    // Something unknown to the index where the second name would go on the fast tier.
    std::fs::write(t.tier(0).join("g/y"), b"stray").unwrap();
    assert!(t.s().move_now("d/f".as_ref(), "t0").is_err());
    assert_eq!(t.holders("d/f", 2), vec![1]);
    assert_eq!(t.s().getattr(d, None).unwrap().mtime, before);
}

/// Tiers sharing a file system share its free space: `df` shows it once, not once per
/// tier.
#[test]
fn statfs_counts_a_shared_file_systems_free_space_once() {
    let t = TestStore::new(&["1PiB", "1PiB"]);
    let st = t.s().statfs().unwrap();
    let c = std::ffi::CString::new(t.tier(0).as_os_str().as_encoded_bytes()).unwrap();
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    let avail = sv.f_bavail * sv.f_frsize;
    let shown = st.bfree * st.bsize as u64;
    // Other programs may write or free space between the two samples.
    let slack = 256 * MIB;
    assert!(shown <= avail + slack, "{shown} shown, {avail} free");
    assert!(shown + slack >= avail, "{shown} shown, {avail} free");
    assert_eq!(st.files, sv.f_files, "the file system's inodes, once");
}
