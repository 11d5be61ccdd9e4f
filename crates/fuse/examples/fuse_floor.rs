//! The cost floor of a FUSE metadata operation on this machine.
//!
//! Mounts a file system that answers LOOKUP, CREATE, GETATTR, UNLINK, MKDIR, RELEASE from
//! memory (no I/O at all), with kaiso's mount options (`default_permissions`, `clone_fd`,
//! the same worker threads, init flags and entry/attribute/negative TTLs), then runs
//! `kaiso bench fs`'s metadata loop (create+close, stat, unlink of N files, one thread) on
//! it and on a native directory, alternating, and prints the rates and ratios. Whatever
//! kaiso does per request comes on top of this, so `floor / native` bounds what any FUSE
//! file system can reach here.
//!
//! ```sh
//! cargo run --release -p kaiso-fuse --example fuse_floor -- \
//!     [-n FILES] [-r ROUNDS] [-t THREADS] [--no-floor] [--all-read] BASELINE_DIR [OTHER_DIR...]
//! ```
//!
//! `--kaiso CONFIG` also mounts that kaiso store in this process (as `kaiso mount` does,
//! with the same thread count) and measures it in the same rounds. `--serve MOUNTPOINT`
//! only mounts the floor, in a process of its own like `kaiso mount`, until it is
//! unmounted (`fusermount3 -u MOUNTPOINT`), for loops run from other processes: a
//! request that crosses processes costs more than one between threads of a process.
//! `--all-read` lets every worker read from the kernel (kaiso's default keeps one
//! reading, see `kaiso_fuse::gate`).
//! BASELINE_DIR is the directory to compare with (e.g. a fresh ext4); OTHER_DIRs (e.g. a
//! kaiso mount) are measured in the same rounds, the targets taking turns. The floor's
//! mountpoint is a temporary directory. Needs root (or fusermount3) and /dev/fuse.

use fuser::{
    Errno, FileHandle, FileType, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyCreate, ReplyEmpty, ReplyEntry, ReplyOpen, Request, TimeOrNow,
};
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

const TTL: Duration = kaiso_fuse::DEFAULT_TTL;
const NEGATIVE_TTL: Duration = kaiso_fuse::MAX_NEGATIVE_TTL;

#[derive(Default)]
struct Tree {
    next: u64,
    names: HashMap<(u64, OsString), u64>,
    attrs: HashMap<u64, fuser::FileAttr>,
}

/// Metadata only, in memory.
struct MemFs {
    tree: Mutex<Tree>,
    /// kaiso's worker stand-by rule (a gate for one thread does nothing).
    gate: kaiso_fuse::WorkerGate,
}

fn new_attr(ino: u64, kind: FileType, perm: u16, uid: u32, gid: u32) -> fuser::FileAttr {
    let now = SystemTime::now();
    fuser::FileAttr {
        ino: INodeNo(ino),
        size: if kind == FileType::Directory { 4096 } else { 0 },
        blocks: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        kind,
        perm,
        nlink: if kind == FileType::Directory { 2 } else { 1 },
        uid,
        gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

impl MemFs {
    fn new(gate: kaiso_fuse::WorkerGate) -> MemFs {
        let mut t = Tree {
            next: 2,
            ..Tree::default()
        };
        t.attrs
            .insert(1, new_attr(1, FileType::Directory, 0o755, 0, 0));
        MemFs {
            tree: Mutex::new(t),
            gate,
        }
    }

    fn make(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        kind: FileType,
        perm: u16,
    ) -> Result<fuser::FileAttr, Errno> {
        let mut t = self.tree.lock().unwrap();
        let key = (parent.0, name.to_os_string());
        if t.names.contains_key(&key) {
            return Err(Errno::EEXIST);
        }
        let ino = t.next;
        t.next += 1;
        let a = new_attr(ino, kind, perm, req.uid(), req.gid());
        t.names.insert(key, ino);
        t.attrs.insert(ino, a);
        if let Some(p) = t.attrs.get_mut(&parent.0) {
            p.mtime = SystemTime::now();
            p.ctime = p.mtime;
        }
        Ok(a)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr) -> Result<(), Errno> {
        let mut t = self.tree.lock().unwrap();
        let ino = t
            .names
            .remove(&(parent.0, name.to_os_string()))
            .ok_or(Errno::ENOENT)?;
        t.attrs.remove(&ino);
        if let Some(p) = t.attrs.get_mut(&parent.0) {
            p.mtime = SystemTime::now();
            p.ctime = p.mtime;
        }
        Ok(())
    }
}

impl fuser::Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // The same capabilities kaiso asks for.
        let _ = config.add_capabilities(kaiso_fuse::INIT_FLAGS & config.capabilities());
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _serving = self.gate.serve();
        let t = self.tree.lock().unwrap();
        match t
            .names
            .get(&(parent.0, name.to_os_string()))
            .and_then(|i| t.attrs.get(i))
        {
            Some(a) => reply.entry(&TTL, a, Generation(0)),
            None => reply.entry(&NEGATIVE_TTL, &kaiso_fuse::negative_attr(), Generation(0)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _serving = self.gate.serve();
        match self.tree.lock().unwrap().attrs.get(&ino.0) {
            Some(a) => reply.attr(&TTL, a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _serving = self.gate.serve();
        let mut t = self.tree.lock().unwrap();
        let Some(a) = t.attrs.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(m) = mode {
            a.perm = (m & 0o7777) as u16;
        }
        if let Some(u) = uid {
            a.uid = u;
        }
        if let Some(g) = gid {
            a.gid = g;
        }
        if let Some(s) = size {
            a.size = s;
        }
        reply.attr(&TTL, a);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let _serving = self.gate.serve();
        let perm = (mode & !umask & 0o7777) as u16;
        match self.make(req, parent, name, FileType::Directory, perm) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let _serving = self.gate.serve();
        let perm = (mode & !umask & 0o7777) as u16;
        match self.make(req, parent, name, FileType::RegularFile, perm) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.gate.serve();
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn flush(&self, _: &Request, _: INodeNo, _: FileHandle, _: LockOwner, reply: ReplyEmpty) {
        let _serving = self.gate.serve();
        reply.error(Errno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _serving = self.gate.serve();
        reply.ok();
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.gate.serve();
        match self.remove(parent, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.unlink(req, parent, name, reply)
    }
}

/// CPU time this process used so far (all threads: the loop and any FUSE daemon in it).
fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One phase's wall-clock rate (ops/s) and CPU time per op (µs, all threads of this
/// process): under a busy machine the rate swings, the CPU time much less.
#[derive(Clone, Copy)]
struct Phase {
    rate: f64,
    cpu_us: f64,
}

fn phase(n: usize, mut op: impl FnMut(usize) -> std::io::Result<()>) -> std::io::Result<Phase> {
    let (t, c) = (Instant::now(), cpu_time());
    for i in 0..n {
        op(i)?;
    }
    Ok(Phase {
        rate: n as f64 / t.elapsed().as_secs_f64(),
        cpu_us: (cpu_time() - c).as_secs_f64() * 1e6 / n as f64,
    })
}

/// `kaiso bench fs`'s metadata loop: create+close, stat, unlink of `n` files.
fn metadata(dir: &Path, n: usize) -> std::io::Result<[Phase; 3]> {
    std::fs::create_dir_all(dir)?;
    let names: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("f{i:07}"))).collect();
    let create = phase(n, |i| std::fs::File::create(&names[i]).map(drop))?;
    let stat = phase(n, |i| std::fs::metadata(&names[i]).map(drop))?;
    let unlink = phase(n, |i| std::fs::remove_file(&names[i]))?;
    std::fs::remove_dir(dir)?;
    Ok([create, stat, unlink])
}

/// Mounts the floor on `mp` as `kaiso_fuse::mount` mounts kaiso (same options, worker
/// gate and busy-poll).
fn mount_floor(
    mp: &Path,
    threads: usize,
    busy_poll: Duration,
) -> std::io::Result<(fuser::BackgroundSession, kaiso_fuse::WorkerGate)> {
    let opts = floor_options(threads, busy_poll);
    let cfg = kaiso_fuse::session_config("fuse-floor".into(), &opts);
    let gate = kaiso_fuse::WorkerGate::with_busy_poll(threads, opts.busy_poll);
    let session = fuser::Session::new(MemFs::new(gate.clone()), mp, &cfg)?;
    gate.attach_device(&session)?;
    Ok((session.spawn()?, gate))
}

/// kaiso's mount options with `threads` workers polling for at most `busy_poll`.
fn floor_options(threads: usize, busy_poll: Duration) -> kaiso_fuse::MountOptions {
    let mut opts = kaiso_fuse::MountOptions {
        threads,
        ..kaiso_fuse::MountOptions::default()
    };
    opts.busy_poll.max = busy_poll;
    opts
}

/// `--serve`: the floor as a process of its own (as `kaiso mount` is), until unmounted.
fn serve(mp: &Path, threads: usize, busy_poll: Duration) -> Result<(), Box<dyn std::error::Error>> {
    let (session, gate) = mount_floor(mp, threads, busy_poll)?;
    println!(
        "floor mounted on {} (pid {})",
        mp.display(),
        std::process::id()
    );
    while !session.guard.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    gate.close();
    session.join()?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Args {
    n: usize,
    rounds: usize,
    threads: usize,
    floor: bool,
    all_read: bool,
    busy_poll: Duration,
    serve: Option<PathBuf>,
    kaiso: Vec<PathBuf>,
    dirs: Vec<PathBuf>,
}

const USAGE: &str = "usage: fuse_floor [-n FILES=10000] [-r ROUNDS=3] [-t THREADS=4] [--no-floor] [--all-read] \
                     [--busy-poll-us US=50] BASELINE_DIR [OTHER_DIR...]  |  \
                     fuse_floor [-t THREADS] [--all-read] [--busy-poll-us US] --serve MOUNTPOINT";

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        n: 10_000,
        rounds: 3,
        threads: 4,
        floor: true,
        all_read: false,
        busy_poll: kaiso_fuse::busy_poll::DEFAULT_MAX,
        serve: None,
        kaiso: Vec::new(),
        dirs: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(s) = it.next() {
        let mut num = |what: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0)
                .ok_or(format!("{what} needs a positive number"))
        };
        match s.as_str() {
            "-n" => a.n = num("-n")?,
            "-r" => a.rounds = num("-r")?,
            "-t" => a.threads = num("-t")?,
            "--no-floor" => a.floor = false,
            "--all-read" => a.all_read = true,
            "--busy-poll-us" => {
                let us: u64 = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .ok_or("--busy-poll-us needs a number of µs")?;
                a.busy_poll = Duration::from_micros(us);
            }
            "--serve" => a.serve = Some(it.next().ok_or("--serve needs a mountpoint")?.into()),
            "--kaiso" => a
                .kaiso
                .push(it.next().ok_or("--kaiso needs a store config")?.into()),
            "-h" | "--help" => return Err(USAGE.into()),
            _ => a.dirs.push(PathBuf::from(s)),
        }
    }
    if a.dirs.is_empty() && a.serve.is_none() {
        return Err(USAGE.into());
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    // As kaiso does: modes are set explicitly, so the process umask must not interfere.
    unsafe { libc::umask(0) };
    if args.all_read {
        // Every worker reads from the kernel (no stand-by), here and in the kaiso mounts.
        unsafe { std::env::set_var(kaiso_fuse::gate::ALL_READ_ENV, "1") };
    }
    if let Some(mp) = &args.serve {
        return serve(mp, args.threads, args.busy_poll);
    }
    let label = |t: usize| {
        let rule = if args.all_read || t == 1 {
            ""
        } else {
            ", one reads"
        };
        format!("{t} threads{rule}")
    };
    let mnt = tempfile::tempdir()?;
    let mut targets: Vec<(String, PathBuf)> = args
        .dirs
        .iter()
        .map(|d| (d.display().to_string(), d.clone()))
        .collect();
    let session = if args.floor {
        targets.push((
            format!("floor ({})", label(args.threads)),
            mnt.path().to_path_buf(),
        ));
        Some(mount_floor(mnt.path(), args.threads, args.busy_poll)?)
    } else {
        None
    };
    // kaiso stores mounted in this process, as `kaiso mount` does (background mover on).
    let mut kaiso_mounts = Vec::new();
    for (i, cfg) in args.kaiso.iter().enumerate() {
        let cfg = kaiso_store::StoreConfig::from_toml_file(cfg)?;
        let store = kaiso_store::Store::open(cfg)?;
        let background = store.start_background();
        let dir = tempfile::tempdir()?;
        let opts = floor_options(args.threads, args.busy_poll);
        let mounted = kaiso_fuse::mount(store, dir.path(), &opts)?;
        targets.push((
            format!("kaiso {i} ({})", label(args.threads)),
            dir.path().to_path_buf(),
        ));
        kaiso_mounts.push((mounted, background, dir));
    }
    let mut rates = vec![[Vec::new(), Vec::new(), Vec::new()]; targets.len()];
    let mut cpu = rates.clone();
    for r in 0..args.rounds {
        for (t, (_, dir)) in targets.iter().enumerate() {
            let got = metadata(&dir.join(format!("fuse-floor-r{r}")), args.n)?;
            for i in 0..3 {
                rates[t][i].push(got[i].rate);
                cpu[t][i].push(got[i].cpu_us);
            }
        }
    }
    if let Some((s, gate)) = session {
        let (parked, released) = gate.stats();
        let p = gate.poll_stats();
        eprintln!(
            "floor workers: {parked} parked at the end, {released} handed back by the watchdog; \
             busy polls: {} saw the next request, {} did not, {} gave way to another task, \
             {} not started while tasks waited for a CPU",
            p.caught, p.missed, p.gave_way, p.held_for_others
        );
        gate.close();
        s.umount_and_join()?;
    }
    for (mounted, background, _dir) in kaiso_mounts {
        mounted.unmount()?;
        drop(background);
    }
    println!(
        "{} files, median of {} rounds: ops/s (share of {}; best round), CPU µs per op \
         (all threads)",
        args.n, args.rounds, targets[0].0
    );
    let base: Vec<f64> = (0..3).map(|i| median(rates[0][i].clone())).collect();
    for (t, (name, _)) in targets.iter().enumerate() {
        print!("{name:<32}");
        for (i, op) in ["create", "stat", "unlink"].iter().enumerate() {
            let v = median(rates[t][i].clone());
            let best = rates[t][i].iter().copied().fold(0.0, f64::max);
            let c = median(cpu[t][i].clone());
            print!(
                " | {op} {v:>7.0}/s {:>4.0}% (best {best:>7.0}) cpu {c:>5.1}µs",
                100.0 * v / base[i]
            );
        }
        println!();
    }
    Ok(())
}
