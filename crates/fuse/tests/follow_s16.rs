//! Following the caller's CPU through a real mount (`kaiso_fuse::follow`): a caller pinned
//! to CPU k gets the reading worker restricted to CPU k within a bounded number of
//! requests; two callers pinned to different CPUs, and busy loops on every CPU, make it
//! give the CPU back; an idle mount gives it back too. Nothing here depends on how fast
//! anything runs: every wait is for a condition, bounded by a count of requests or by a
//! generous time. The tests take turns (`SERIAL`): one's callers and busy loops would
//! disturb another's.

mod common;
use common::fuse_available;
use kaiso_fuse::Mounted;
use kaiso_fuse::follow::{CpuSet, FollowCaller, thread_name};
use kaiso_store::{Store, StoreConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

static SERIAL: Mutex<()> = Mutex::new(());

/// Most metadata steps (create, stat, unlink: about 6 requests) a caller takes before a
/// test gives up waiting for the rule.
const MAX_STEPS: usize = 20_000;

/// Waits for this binary's turn to mount; `None` (after saying so) without /dev/fuse or
/// with fewer than 2 CPUs to choose from (one CPU is every CPU: nothing to follow).
fn take_turn() -> Option<MutexGuard<'static, ()>> {
    if !fuse_available() {
        eprintln!("skipping: /dev/fuse is not available");
        return None;
    }
    if allowed().len() < 2 {
        eprintln!("skipping: this process may run on one CPU only");
        return None;
    }
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// The CPUs this process may run on (those of its main thread: the test's callers
/// restrict themselves).
fn allowed() -> Vec<u32> {
    CpuSet::of(std::process::id() as i32)
        .expect("sched_getaffinity")
        .cpus()
}

/// A one-tier store mounted with 4 workers following the caller (`under_load`: whatever
/// the machine's load).
fn mount(dir: &Path, under_load: bool) -> (Arc<Store>, PathBuf, Mounted) {
    for d in ["t0", "mnt"] {
        std::fs::create_dir(dir.join(d)).unwrap();
    }
    let text = format!(
        "[store]\nstate_dir = \"{0}/state\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"fast\"\npath = \"{0}/t0\"\ncapacity = \"64MiB\"\n",
        dir.display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
    let mnt = dir.join("mnt");
    let opts = kaiso_fuse::MountOptions {
        threads: 4,
        follow: FollowCaller {
            enabled: true,
            under_load,
        },
        ..Default::default()
    };
    let m = kaiso_fuse::mount(store.clone(), &mnt, &opts).unwrap();
    (store, mnt, m)
}

/// Thread ids of this process's FUSE workers (`fuser-N`) and the CPUs each may run on.
fn workers() -> Vec<(i32, Vec<u32>)> {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    tasks
        .flatten()
        .filter_map(|t| t.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&t| thread_name(t).is_some_and(|n| n.starts_with("fuser-")))
        .filter_map(|t| Some((t, CpuSet::of(t)?.cpus())))
        .collect()
}

/// The FUSE workers restricted to fewer CPUs than the process may use.
fn restricted_workers() -> Vec<(i32, Vec<u32>)> {
    let all = allowed();
    workers().into_iter().filter(|(_, c)| *c != all).collect()
}

/// Restricts this thread to `cpu`.
fn pin_me(cpu: u32) {
    CpuSet::one(cpu)
        .unwrap()
        .apply(0)
        .expect("sched_setaffinity of the test's caller");
}

/// One create-stat-unlink step in `dir` (name `i`).
fn step(dir: &Path, i: usize) {
    let p = dir.join(format!("f{i}"));
    std::fs::File::create(&p).unwrap();
    std::fs::metadata(&p).unwrap();
    std::fs::remove_file(&p).unwrap();
}

/// From a thread pinned to `cpu`, takes metadata steps in `dir` until `done` says so
/// (checked after every step) or `MAX_STEPS`; returns the steps taken and whether `done`
/// said so.
fn caller_until(
    cpu: u32,
    dir: PathBuf,
    done: impl Fn() -> bool + Send + 'static,
) -> std::thread::JoinHandle<(usize, bool)> {
    caller_for(cpu, dir, MAX_STEPS, done)
}

/// [`caller_until`] with at most `max` steps.
fn caller_for(
    cpu: u32,
    dir: PathBuf,
    max: usize,
    done: impl Fn() -> bool + Send + 'static,
) -> std::thread::JoinHandle<(usize, bool)> {
    std::thread::spawn(move || {
        pin_me(cpu);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..max {
            step(&dir, i);
            if done() {
                return (i + 1, true);
            }
        }
        (max, false)
    })
}

/// Waits up to 10 s for `cond` (checked every 5 ms).
fn eventually(cond: impl Fn() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A worker is restricted to `cpu`, and the rule says so.
fn followed_on(m: &Mounted, cpu: u32) -> bool {
    m.follow_stats().pinned_to == Some(cpu) && restricted_workers().iter().any(|(_, c)| *c == [cpu])
}

/// Has a caller pinned to `cpu` take steps until the reading worker follows it there;
/// panics (with what it saw) if it does not within `MAX_STEPS`.
fn follow_to(m: &Arc<Mounted>, mnt: &Path, cpu: u32, name: &str) -> usize {
    let m2 = m.clone();
    let (steps, followed) = caller_until(cpu, mnt.join(name), move || followed_on(&m2, cpu))
        .join()
        .unwrap();
    assert!(
        followed,
        "a caller pinned to CPU {cpu} took {steps} steps and no FUSE worker was restricted \
         to it: workers {:?}, {:?}",
        workers(),
        m.follow_stats()
    );
    steps
}

/// Unmounts (the mount is shared with finished callers only) and shuts the store down.
fn finish(m: Arc<Mounted>, store: Arc<Store>) {
    let m = Arc::into_inner(m).expect("a caller still holds the mount");
    m.unmount().unwrap();
    store.shutdown();
}

/// A single-threaded caller pinned to CPU k: the reading worker is restricted to CPU k
/// within `MAX_STEPS` steps, and gives it back once the mount is idle.
#[test]
fn the_reader_follows_a_pinned_caller_and_leaves_when_idle() {
    let Some(_turn) = take_turn() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt, m) = mount(dir.path(), true);
    let m = Arc::new(m);
    // Every worker starts on all the process's CPUs.
    assert!(
        restricted_workers().is_empty(),
        "{:?}",
        restricted_workers()
    );
    let cpus = allowed();
    let k = *cpus.last().unwrap();
    let steps = follow_to(&m, &mnt, k, "a");
    let stats = m.follow_stats();
    eprintln!("followed to CPU {k} after {steps} steps: {stats:?}");
    // One worker only: the one that reads.
    assert_eq!(restricted_workers().len(), 1, "{:?}", workers());

    // And to another CPU when the caller moves there and stays.
    let j = cpus[0];
    let steps = follow_to(&m, &mnt, j, "b");
    eprintln!(
        "followed to CPU {j} after {steps} steps: {:?}",
        m.follow_stats()
    );

    // Idle: the watchdog gives the CPU back (after about 200 ms without requests).
    assert!(
        eventually(|| restricted_workers().is_empty() && m.follow_stats().pinned_to.is_none()),
        "an idle mount kept a worker restricted: {:?}, {:?}",
        restricted_workers(),
        m.follow_stats()
    );
    // Still serving.
    step(&mnt, 0);
    finish(m, store);
}

/// Two callers pinned to two different CPUs: the reading worker, first following one of
/// them, gives its CPU back.
#[test]
fn two_callers_on_two_cpus_release_the_reader() {
    let Some(_turn) = take_turn() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt, m) = mount(dir.path(), true);
    let m = Arc::new(m);
    let cpus = allowed();
    let (a, b) = (cpus[0], *cpus.last().unwrap());
    follow_to(&m, &mnt, a, "warm");
    let before = m.follow_stats();

    let released = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = [(a, "a"), (b, "b")]
        .into_iter()
        .map(|(cpu, name)| {
            let (m, released) = (m.clone(), released.clone());
            caller_until(cpu, mnt.join(name), move || {
                if m.follow_stats().released_spread > before.released_spread {
                    released.store(true, Ordering::SeqCst);
                }
                released.load(Ordering::SeqCst)
            })
        })
        .collect();
    let steps: Vec<_> = callers.into_iter().map(|c| c.join().unwrap()).collect();
    let after = m.follow_stats();
    assert!(
        released.load(Ordering::SeqCst),
        "two callers on CPUs {a} and {b} took {steps:?} steps and the reader was never \
         released for spread callers: before {before:?}, after {after:?}"
    );
    eprintln!("released after {steps:?} steps: {after:?}");
    // The reader gives the CPU back at the end of its request, or when the mount idles.
    assert!(
        eventually(|| restricted_workers().is_empty()),
        "released, but a worker stayed restricted: {:?}, {:?}",
        restricted_workers(),
        m.follow_stats()
    );
    finish(m, store);
}

/// Busy loops on every CPU, stopped and joined on drop.
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hogs {
    fn start(cpus: &[u32]) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = cpus
            .iter()
            .map(|&cpu| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    pin_me(cpu);
                    // Bounded, in case the test never stops it.
                    let end = Instant::now() + Duration::from_secs(120);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The default rule (the restricted reader's own wait for its CPU counts): with a busy
/// loop on every CPU the reading worker gives its CPU back, and tries again rarely.
#[test]
fn busy_loops_on_every_cpu_release_the_reader() {
    let Some(_turn) = take_turn() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (store, mnt, m) = mount(dir.path(), false);
    let m = Arc::new(m);
    let cpus = allowed();
    let k = *cpus.last().unwrap();
    // On a machine busy with other work the rule may never follow (that is its point):
    // the hogs must then find nothing to release, which the end of the test checks.
    let m2 = m.clone();
    let (steps, followed) = caller_until(k, mnt.join("a"), move || followed_on(&m2, k))
        .join()
        .unwrap();
    let before = m.follow_stats();
    eprintln!("before the busy loops: followed {followed} after {steps} steps, {before:?}");

    let hogs = Hogs::start(&cpus);
    let m2 = m.clone();
    let (steps, released) = caller_until(k, mnt.join("b"), move || {
        // (Beside the busy loops the caller may also slow down enough to count as sparse.)
        let s = m2.follow_stats();
        s.pinned_to.is_none()
            && s.released_load + s.released_sparse > before.released_load + before.released_sparse
    })
    .join()
    .unwrap();
    let during = m.follow_stats();
    assert!(
        released || (!followed && during.pins == before.pins),
        "busy loops on CPUs {cpus:?}: {steps} steps and the reader still follows: before \
         {before:?}, during {during:?}"
    );
    // While they run (300 more steps) the rule may try again after its hold, but each
    // time the restricted reader waits for its CPU and is released for load, and the
    // holds grow (16, 32, 64, ... samples): few tries. Once the caller stops, no worker
    // stays restricted.
    let pins = during.pins + during.moves;
    let (steps, _) = caller_for(k, mnt.join("c"), 300, || false).join().unwrap();
    let after = m.follow_stats();
    let unrestricted = eventually(|| restricted_workers().is_empty());
    let restricted = restricted_workers();
    drop(hogs);
    let tries = after.pins + after.moves - pins;
    let load_releases = after.released_load - during.released_load;
    assert!(
        tries <= 12 && load_releases + u64::from(after.pinned_to.is_some()) >= tries,
        "beside busy loops on every CPU the reader was followed {tries} times and released \
         for load {load_releases} times (expected each try released, at most 12 tries): \
         during {during:?}, after {after:?}"
    );
    assert!(
        unrestricted,
        "a worker stayed restricted beside busy loops: {restricted:?}"
    );
    eprintln!("{steps} steps beside the busy loops: {after:?}");
    finish(m, store);
}
