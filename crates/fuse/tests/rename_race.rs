//! Rename-over seen by concurrent readers on a real mount: while one thread renames fresh
//! files over `target` (the write-temp-then-rename pattern of config reloaders and package
//! managers), others open+read and stat `target`. On a local file system the name never
//! disappears; the mount must not answer ENOENT either.

mod common;
use common::{MountedStore, fuse_available};
use kaiso_store::{Store, StoreConfig};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the renamer runs.
const RACE: Duration = Duration::from_millis(1500);

type Tally = Arc<Mutex<BTreeMap<String, u64>>>;

fn bump(tally: &Tally, what: String) {
    *tally.lock().unwrap().entry(what).or_default() += 1;
}

fn outcome(what: &str, e: &std::io::Error) -> String {
    format!("{what} {}", e.raw_os_error().map_or("?".into(), errno_name))
}

fn errno_name(n: i32) -> String {
    match n {
        libc::ENOENT => "ENOENT".into(),
        libc::ESTALE => "ESTALE".into(),
        n => format!("errno {n}"),
    }
}

/// Runs the race in `dir`; returns what the readers saw (`open ok`, `stat ok`, `open ENOENT`, ...).
fn race(dir: &Path) -> BTreeMap<String, u64> {
    std::fs::create_dir_all(dir).unwrap();
    let target = dir.join("target");
    std::fs::write(&target, b"target0").unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let tally: Tally = Arc::default();
    let mut readers = Vec::new();
    for i in 0..3 {
        let (stop, tally, target) = (stop.clone(), tally.clone(), target.clone());
        readers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if i == 2 {
                    match std::fs::metadata(&target) {
                        Ok(_) => bump(&tally, "stat ok".into()),
                        Err(e) => bump(&tally, outcome("stat", &e)),
                    }
                    continue;
                }
                match std::fs::File::open(&target) {
                    Ok(mut f) => {
                        let mut buf = Vec::new();
                        match f.read_to_end(&mut buf) {
                            Ok(_) if buf.starts_with(b"target") => bump(&tally, "open ok".into()),
                            Ok(_) => bump(&tally, "read wrong data".into()),
                            Err(e) => bump(&tally, outcome("read", &e)),
                        }
                    }
                    Err(e) => bump(&tally, outcome("open", &e)),
                }
            }
        }));
    }
    let start = Instant::now();
    let mut renames = 0u64;
    while start.elapsed() < RACE {
        renames += 1;
        let src = dir.join(format!("src{renames}"));
        std::fs::write(&src, format!("target{renames}")).unwrap();
        std::fs::rename(&src, &target).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    let mut seen = tally.lock().unwrap().clone();
    seen.insert("renames".into(), renames);
    seen
}

fn mounted() -> Option<MountedStore> {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    for d in ["t0", "t1", "mnt", "plain"] {
        std::fs::create_dir(dir.path().join(d)).unwrap();
    }
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"1GiB\"\n\
         [[tier]]\nname = \"slow\"\npath = \"{0}/t1\"\ncapacity = \"1GiB\"\n",
        dir.path().display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
    let mount = kaiso_fuse::mount(
        store.clone(),
        &dir.path().join("mnt"),
        &kaiso_fuse::MountOptions::default(),
    )
    .unwrap();
    Some(MountedStore {
        dir,
        store,
        mount: Some(mount),
    })
}

#[test]
fn rename_over_never_hides_the_target_from_readers() {
    let Some(env) = mounted() else { return };
    let plain = race(&env.dir.path().join("plain/r"));
    eprintln!("plain directory: {plain:?}");
    let mnt: PathBuf = env.dir.path().join("mnt/r");
    let seen = race(&mnt);
    let stale = env
        .mount
        .as_ref()
        .unwrap()
        .stats()
        .stale
        .load(Ordering::Relaxed);
    eprintln!("mount: {seen:?}; requests answered ESTALE: {stale}");
    // Neither ENOENT nor an ESTALE the kernel's one retry could not absorb.
    for (what, n) in &seen {
        assert!(
            ["open ok", "stat ok", "renames"].contains(&what.as_str()),
            "{n} x {what} on the mount (plain: {plain:?})"
        );
    }
    assert!(seen.get("open ok").copied().unwrap_or(0) > 0, "{seen:?}");
    assert!(seen.get("stat ok").copied().unwrap_or(0) > 0, "{seen:?}");
    // The target is whole and the last file renamed over it.
    let last = seen["renames"];
    assert_eq!(
        std::fs::read_to_string(mnt.join("target")).unwrap(),
        format!("target{last}")
    );
}

/// errno of `f`, or "ok".
fn result_name<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.raw_os_error().map_or("?".into(), errno_name),
    }
}

/// What a process sees of a directory removed under it (`fstat` and `openat(".")` through a
/// descriptor it holds, as a shell whose working directory was removed does).
fn removed_dir_view(dir: &Path) -> (String, String) {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(dir).unwrap();
    let d = dir.join("gone");
    std::fs::create_dir(&d).unwrap();
    let held = std::fs::File::open(&d).unwrap();
    std::fs::remove_dir(&d).unwrap();
    let stat = result_name(held.metadata());
    // SAFETY: the descriptor is open; "." is NUL-terminated.
    let fd = unsafe {
        libc::openat(
            held.as_raw_fd(),
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    let open = if fd < 0 {
        result_name::<()>(Err(std::io::Error::last_os_error()))
    } else {
        // SAFETY: fd was just opened here.
        unsafe { libc::close(fd) };
        "ok".into()
    };
    (stat, open)
}

#[test]
fn a_removed_directory_is_never_stale() {
    let Some(env) = mounted() else { return };
    let plain = removed_dir_view(&env.dir.path().join("plain/d"));
    let mnt = removed_dir_view(&env.dir.path().join("mnt/d"));
    eprintln!("plain directory: {plain:?}; mount: {mnt:?}");
    // ESTALE would tell the caller to look the name up again, which names nothing now.
    assert_ne!(mnt.0, "ESTALE", "fstat: plain {plain:?}, mount {mnt:?}");
    assert_ne!(mnt.1, "ESTALE", "openat: plain {plain:?}, mount {mnt:?}");
}
