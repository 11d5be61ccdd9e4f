//! `kaiso bench fs`: the mount's data and metadata path against the backing directory and
//! mergerfs over the same directories, and the tiering benefit on a Zipf-skewed workload.
//!
//! Everything is measured in one run and printed with its ratio to the baseline measured
//! in that run:
//! - fio sequential 1 MiB write and read, random 4 KiB read (`fio` from Debian) on
//!   (a) the backing directory, (b) a kaiso mount over it, (c) mergerfs over the same tiers;
//! - a metadata test (create, stat, unlink N small files) on the same three;
//! - each target on a fresh ext4 of its own (loop device), the targets taking turns over
//!   several rounds, medians reported;
//! - tiering: Zipf-skewed reads over 2 tiers (fast; emulated HDD whose service times come
//!   from kaiso-device), the fast tier holding 10% of the data; after a warm-up, mean read
//!   latency against the same data all on the fast tier and all on the emulated HDD, next
//!   to the best mean any whole-file placement could reach and the skew 1.5x would need.
//!
//! Every mount it makes is unmounted, and every file removed, on exit and on Ctrl-C.
//! `--zipf-on DIR` runs only the skewed read workload on an existing tree (used by
//! scripts/demo.sh to show latency falling while kaiso promotes).

mod tiering;

use anyhow::{Context, Result, bail};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::scratch_fs::{FreshExt4, is_mounted};

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Where to create the benchmark's temporary directories (its file system is the
    /// "native" baseline).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Small sizes and short durations (about 2-3 minutes in all).
    #[arg(long)]
    pub quick: bool,
    /// fio file size for the sequential and random tests [default: 1GiB, quick 256MiB].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Seconds of random 4 KiB reads per target and round [default: 10, quick 3].
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Files in the metadata test [default: 100000, quick 10000].
    #[arg(long)]
    pub files: Option<u64>,
    /// Bytes written into each file of the metadata test's create phase (issue 2 asks
    /// for "small files"; 0 measures bare create + close, the bench's behaviour before
    /// session 7).
    #[arg(long, value_parser = parse_size, default_value = "4KiB")]
    pub meta_file_size: u64,
    /// Use O_DIRECT in fio (measures the device too; default measures the file-system
    /// path with a warm page cache).
    #[arg(long)]
    pub direct: bool,
    /// Skip the mergerfs comparison.
    #[arg(long)]
    pub no_mergerfs: bool,
    /// FUSE worker threads of the kaiso mounts [default: `kaiso mount`'s].
    #[arg(long)]
    pub kaiso_threads: Option<usize>,
    /// Longest busy-poll of the kaiso mounts, in µs (`kaiso mount --busy-poll-us`)
    /// [default: `kaiso mount`'s].
    #[arg(long)]
    pub kaiso_busy_poll_us: Option<u64>,
    /// Rounds of the data and metadata tests; the targets take turns within a round and
    /// the median of the rounds is reported [default: 3].
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Run every target on the directory given by --dir's file system instead of giving
    /// each target a fresh ext4 file system of its own (loop device; needs root).
    #[arg(long)]
    pub shared_fs: bool,
    /// Skip the fio and metadata tests (run only the tiering test).
    #[arg(long)]
    pub only_tiering: bool,
    /// Skip the tiering test.
    #[arg(long)]
    pub no_tiering: bool,
    /// Total data of the tiering test [default: 512MiB, quick 160MiB].
    #[arg(long, value_parser = parse_size)]
    pub tier_data: Option<u64>,
    /// Size of each file in the tiering test.
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub tier_file_size: u64,
    /// Zipf exponent of the skewed reads.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Repeat the tiering test for each of these Zipf exponents (e.g. 0.8,1.1,1.5,2,3)
    /// instead of the one --zipf.
    #[arg(long, value_delimiter = ',', value_name = "S,S,...")]
    pub zipf_sweep: Vec<f64>,
    /// Bytes per read in the tiering test.
    #[arg(long, value_parser = parse_size, default_value = "64KiB")]
    pub read_size: u64,
    /// Warm-up seconds before measuring (the mover promotes meanwhile) [default: 60, quick 25].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Longest wait, after the warm-up, for the tiered store's placement to settle (mover
    /// idle, the policy's plans empty) before measuring anyway [default: 60, quick 30].
    #[arg(long)]
    pub settle_max: Option<u64>,
    /// Measured seconds of the tiering test per configuration [default: 20, quick 8].
    #[arg(long)]
    pub measure: Option<u64>,
    /// Emulated device of the slow tier (kaiso device spec kind; `none`: a plain
    /// directory, for control runs).
    #[arg(long, default_value = "hdd")]
    pub slow_device: String,
    /// Flash write budget of the tiered store's fast tier in drive writes per day (the
    /// policy's `promote_dwpd`). At the default 1.0 a 16 MiB stand-in tier may take only
    /// 16 MiB of promotions a day: one fill and no correction.
    #[arg(long, default_value_t = 100.0)]
    pub tier_promote_dwpd: f64,
    /// Seed of the workload generators.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Run only the Zipf read workload on the files under DIR (e.g. a kaiso mount),
    /// printing the mean latency every --interval seconds for --seconds seconds.
    #[arg(long, value_name = "DIR")]
    pub zipf_on: Option<PathBuf>,
    #[arg(long, default_value_t = 60)]
    pub seconds: u64,
    #[arg(long, default_value_t = 5)]
    pub interval: u64,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown size unit {u:?} in {s:?}")),
    };
    Ok((n * mult as f64) as u64)
}

const MIB: u64 = 1 << 20;

/// Set by SIGINT/SIGTERM; long loops stop and the guards clean up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

fn check_interrupt() -> Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

pub fn run(args: Args) -> Result<()> {
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    if let Some(dir) = &args.zipf_on {
        return tiering::zipf_on_existing(dir, &args);
    }
    let work = WorkDir::new(&args.dir)?;
    let mut report = String::new();
    if !args.only_tiering {
        data_and_metadata(&args, &work, &mut report)?;
    }
    if !args.no_tiering {
        tiering::tiering(&args, &work, &mut report)?;
    }
    println!("\n==== summary ====\n{report}");
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Temporary directories and mounts, cleaned up on drop.

struct WorkDir {
    root: PathBuf,
}

impl WorkDir {
    fn new(base: &Path) -> Result<WorkDir> {
        let root = base.join(format!("kaiso-bench-{}", std::process::id()));
        fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        Ok(WorkDir { root })
    }
    fn sub(&self, name: &str) -> Result<PathBuf> {
        let p = self.root.join(name);
        fs::create_dir_all(&p).with_context(|| format!("create {}", p.display()))?;
        Ok(p)
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        for m in mounts_under(&self.root) {
            unmount(&m);
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(root))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    v
}

fn unmount(p: &Path) {
    for _ in 0..30 {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(p)
            .stderr(Stdio::null())
            .status();
        if !is_mounted(p) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = Command::new("umount").arg("-l").arg(p).status();
}

/// A FUSE daemon (kaiso or mergerfs) in the foreground as our child.
struct Mounted {
    path: PathBuf,
    child: Child,
    name: &'static str,
}

impl Mounted {
    /// Process id of the daemon (its CPU time is counted in the metadata test).
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn start(name: &'static str, mut cmd: Command, path: &Path, log: &Path) -> Result<Mounted> {
        let logf = fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf)
            .spawn()
            .with_context(|| format!("start {name}"))?;
        let mut m = Mounted {
            path: path.to_path_buf(),
            child,
            name,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(path) {
            if let Some(st) = m.child.try_wait()? {
                let log = fs::read_to_string(log).unwrap_or_default();
                bail!(
                    "{name} exited ({st}) before mounting {}:\n{log}",
                    path.display()
                );
            }
            if Instant::now() > deadline {
                bail!("{name} did not mount {} within 30 s", path.display());
            }
            check_interrupt()?;
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        unmount(&self.path);
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                eprintln!("{} did not exit after unmount; killing it", self.name);
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
    }
}

/// A kaiso store configuration for the benchmark (format: docs/tiering.md).
struct BenchTier<'a> {
    name: &'a str,
    path: &'a Path,
    capacity: u64,
    device: Option<&'a str>,
    watermarks: Option<(f64, f64)>,
}

fn write_config(path: &Path, state: &Path, tiers: &[BenchTier], mover_ms: u64) -> Result<()> {
    let mut s = String::new();
    writeln!(
        s,
        "[store]\nstate_dir = {:?}\n",
        state.display().to_string()
    )?;
    writeln!(
        s,
        "[store.mover]\ninterval_ms = {mover_ms}\nmax_rate = \"1GiB\""
    )?;
    for t in tiers {
        writeln!(
            s,
            "\n[[tier]]\nname = {:?}\npath = {:?}\ncapacity = {}",
            t.name,
            t.path.display().to_string(),
            t.capacity
        )?;
        if let Some((low, high)) = t.watermarks {
            writeln!(s, "low_watermark = {low}\nhigh_watermark = {high}")?;
        }
        if let Some(d) = t.device {
            writeln!(s, "[tier.device]\nkind = {d:?}")?;
        }
    }
    fs::write(path, s).with_context(|| format!("write {}", path.display()))
}

/// The `kaiso mount` arguments the bench's options ask for (threads, busy-poll).
fn kaiso_mount_args(args: &Args) -> Vec<String> {
    let mut extra: Vec<String> = match args.kaiso_threads {
        Some(n) => vec!["--threads".into(), n.to_string()],
        None => Vec::new(),
    };
    if let Some(us) = args.kaiso_busy_poll_us {
        extra.extend(["--busy-poll-us".into(), us.to_string()]);
    }
    extra
}

/// Mounts a kaiso store of `tiers` (mover planning every `mover_ms`) with `kaiso mount`,
/// passing `extra` arguments.
fn mount_kaiso_with(
    work: &WorkDir,
    tag: &str,
    tiers: &[BenchTier],
    mover_ms: u64,
    extra: &[String],
) -> Result<Mounted> {
    let state = work.sub(&format!("state-{tag}"))?;
    let cfg = work.root.join(format!("{tag}.toml"));
    write_config(&cfg, &state, tiers, mover_ms)?;
    start_kaiso_mount(work, tag, &cfg, extra)
}

/// Runs `kaiso mount` of the configuration `cfg` on a fresh mountpoint of `tag`, passing
/// `extra` arguments.
fn start_kaiso_mount(work: &WorkDir, tag: &str, cfg: &Path, extra: &[String]) -> Result<Mounted> {
    start_kaiso_mount_logging(work, tag, cfg, extra, None)
}

/// [`start_kaiso_mount`] with the daemon's log filter set to `log_filter` (its log is
/// `<work>/<tag>.log`).
fn start_kaiso_mount_logging(
    work: &WorkDir,
    tag: &str,
    cfg: &Path,
    extra: &[String],
    log_filter: Option<&str>,
) -> Result<Mounted> {
    let mnt = work.sub(&format!("mnt-{tag}"))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("mount").args(extra).arg(cfg).arg(&mnt);
    if let Some(f) = log_filter {
        cmd.env("KAISO_LOG", f);
    }
    Mounted::start("kaiso", cmd, &mnt, &work.root.join(format!("{tag}.log")))
}

// ---------------------------------------------------------------------------------------
// fio and metadata on native / kaiso / mergerfs.

#[derive(Default, Clone, Debug)]
struct Figures {
    seq_write_mibs: f64,
    seq_read_mibs: f64,
    rand_read_iops: f64,
    create_per_s: f64,
    stat_per_s: f64,
    unlink_per_s: f64,
    /// CPU µs per create, stat, unlink: the caller's and the daemon's (all its threads).
    /// The machine's load moves it much less than the rates.
    meta_cpu_us: [f64; 3],
}

impl Figures {
    fn values(&self) -> [f64; 6] {
        [
            self.seq_write_mibs,
            self.seq_read_mibs,
            self.rand_read_iops,
            self.create_per_s,
            self.stat_per_s,
            self.unlink_per_s,
        ]
    }

    fn from_values(v: [f64; 6]) -> Figures {
        Figures {
            seq_write_mibs: v[0],
            seq_read_mibs: v[1],
            rand_read_iops: v[2],
            create_per_s: v[3],
            stat_per_s: v[4],
            unlink_per_s: v[5],
            meta_cpu_us: [0.0; 3],
        }
    }

    /// Figure by figure median of several rounds.
    fn median(rounds: &[Figures]) -> Figures {
        let mut out = [0.0; 6];
        for (i, o) in out.iter_mut().enumerate() {
            *o = median_of(rounds.iter().map(|f| f.values()[i]).collect());
        }
        let mut f = Figures::from_values(out);
        for (i, c) in f.meta_cpu_us.iter_mut().enumerate() {
            *c = median_of(rounds.iter().map(|f| f.meta_cpu_us[i]).collect());
        }
        f
    }
}

fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Where one target keeps its data: a fresh file system, or a directory of --dir's.
fn target_root(
    args: &Args,
    work: &WorkDir,
    tag: &str,
    size: u64,
    files: u64,
    fresh: &mut Vec<FreshExt4>,
) -> Result<PathBuf> {
    if args.shared_fs {
        return work.sub(&format!("root-{tag}"));
    }
    // Sparse; large enough that mergerfs's default minfreespace (4 GiB) never refuses.
    let bytes = (2 * size + files * 8192 + (1 << 30)).max(8 << 30);
    let f = FreshExt4::new(
        work.root.join(format!("{tag}.ext4")),
        work.root.join(format!("fs-{tag}")),
        bytes,
        Some(files * 2 + 65_536),
    )?;
    let p = f.path().to_path_buf();
    fresh.push(f);
    Ok(p)
}

fn data_and_metadata(args: &Args, work: &WorkDir, report: &mut String) -> Result<()> {
    if Command::new("fio").arg("--version").output().is_err() {
        bail!("fio is not installed (apt-get install fio; scripts/install-deps.sh does it)");
    }
    let size = args
        .size
        .unwrap_or(if args.quick { 256 * MIB } else { 1 << 30 });
    let runtime = args.runtime.unwrap_or(if args.quick { 3 } else { 10 });
    let files = args
        .files
        .unwrap_or(if args.quick { 10_000 } else { 100_000 });
    let rounds = args.rounds.unwrap_or(3).max(1);
    let mut shared = args.shared_fs;
    if !shared && unsafe { libc::geteuid() } != 0 {
        println!(
            "not root: all targets share the file system of {}",
            args.dir.display()
        );
        shared = true;
    }
    let args_eff = Args {
        shared_fs: shared,
        ..args.clone()
    };
    let args = &args_eff;
    println!(
        "data path: fio file {} MiB, random reads {runtime} s, metadata {files} files of {} B, {}, \
         {rounds} round(s), {}",
        size / MIB,
        args.meta_file_size,
        if args.direct {
            "O_DIRECT"
        } else {
            "buffered, warm page cache"
        },
        if shared {
            "one shared file system".to_string()
        } else {
            "a fresh ext4 (loop device) per target".to_string()
        }
    );

    // Mounts and file systems live until the end; dropped in reverse order (mounts first).
    let mut fresh: Vec<FreshExt4> = Vec::new();
    let mut mounts: Vec<Mounted> = Vec::new();
    // (name, directory, daemon serving it)
    let mut targets: Vec<(&str, PathBuf, Option<u32>)> = Vec::new();

    let native_root = target_root(args, work, "native", size, files, &mut fresh)?;
    let native_dir = native_root.join("native");
    fs::create_dir_all(&native_dir)?;
    targets.push(("native", native_dir, None));

    let kaiso_root = target_root(args, work, "kaiso", size, files, &mut fresh)?;
    let (t0, t1) = (kaiso_root.join("t0"), kaiso_root.join("t1"));
    fs::create_dir_all(&t0)?;
    fs::create_dir_all(&t1)?;
    let cap = free_bytes(&t0)? / 2;
    let tiers = [
        BenchTier {
            name: "t0",
            path: &t0,
            capacity: cap,
            device: None,
            watermarks: None,
        },
        BenchTier {
            name: "t1",
            path: &t1,
            capacity: cap,
            device: None,
            watermarks: None,
        },
    ];
    let m = mount_kaiso_with(work, "kaiso", &tiers, 2000, &kaiso_mount_args(args))?;
    let dir = m.path.join("kaiso");
    fs::create_dir_all(&dir)?;
    targets.push(("kaiso", dir, Some(m.pid())));
    mounts.push(m);

    if !args.no_mergerfs {
        if Command::new("mergerfs").arg("--version").output().is_err() {
            println!("mergerfs is not installed: skipping it (apt-get install mergerfs)");
        } else {
            let root = target_root(args, work, "mergerfs", size, files, &mut fresh)?;
            let (b0, b1) = (root.join("t0"), root.join("t1"));
            fs::create_dir_all(&b0)?;
            fs::create_dir_all(&b1)?;
            let mnt = work.sub("mnt-mergerfs")?;
            let mut cmd = Command::new("mergerfs");
            // Foreground; new files on the first branch like kaiso's fastest-with-room;
            // page cache on, as mergerfs recommends for performance.
            cmd.args([
                "-f",
                "-o",
                "cache.files=partial,category.create=ff,fsname=mergerfs-bench",
            ])
            .arg(format!("{}:{}", b0.display(), b1.display()))
            .arg(&mnt);
            let m = Mounted::start("mergerfs", cmd, &mnt, &work.root.join("mergerfs.log"))?;
            let dir = m.path.join("mergerfs");
            fs::create_dir_all(&dir)?;
            targets.push(("mergerfs", dir, Some(m.pid())));
            mounts.push(m);
        }
    }

    // The targets take turns within each round, so slow drifts of the machine's load hit
    // them alike; the median of the rounds is reported.
    let mut per_target: Vec<Vec<Figures>> = vec![Vec::new(); targets.len()];
    let load_before = load_average();
    for round in 1..=rounds {
        println!(
            "round {round} of {rounds} (load average {})",
            load_average()
        );
        for (i, (name, dir, daemon)) in targets.iter().enumerate() {
            per_target[i].push(measure_target(
                name, dir, *daemon, size, runtime, files, args,
            )?);
        }
    }
    drop(mounts);
    drop(fresh);

    let rows: Vec<(&str, Figures)> = targets
        .iter()
        .zip(&per_target)
        .map(|((name, _, _), r)| (*name, Figures::median(r)))
        .collect();
    let native = rows[0].1.clone();
    let mut t = String::new();
    writeln!(
        t,
        "median of {rounds} round(s); {}; load average {load_before} before, {} after",
        if shared {
            "targets share one file system"
        } else {
            "each target on a fresh ext4 (loop device)"
        },
        load_average()
    )?;
    writeln!(
        t,
        "{:<12} {:>14} {:>14} {:>16} {:>12} {:>12} {:>12}",
        "target",
        "seq write MiB/s",
        "seq read MiB/s",
        "rand 4K read IOPS",
        "create/s",
        "stat/s",
        "unlink/s"
    )?;
    for (name, f) in &rows {
        writeln!(
            t,
            "{:<12} {:>14.0} {:>14.0} {:>16.0} {:>12.0} {:>12.0} {:>12.0}",
            name,
            f.seq_write_mibs,
            f.seq_read_mibs,
            f.rand_read_iops,
            f.create_per_s,
            f.stat_per_s,
            f.unlink_per_s
        )?;
    }
    for (name, f) in rows.iter().skip(1) {
        let r = |a: f64, b: f64| if b > 0.0 { 100.0 * a / b } else { 0.0 };
        writeln!(
            t,
            "{:<12} {:>13.0}% {:>13.0}% {:>15.0}% {:>11.0}% {:>11.0}% {:>11.0}%",
            format!("{name}/nat"),
            r(f.seq_write_mibs, native.seq_write_mibs),
            r(f.seq_read_mibs, native.seq_read_mibs),
            r(f.rand_read_iops, native.rand_read_iops),
            r(f.create_per_s, native.create_per_s),
            r(f.stat_per_s, native.stat_per_s),
            r(f.unlink_per_s, native.unlink_per_s)
        )?;
    }
    writeln!(
        t,
        "metadata CPU µs per operation (the caller's and the daemon's, all threads):"
    )?;
    for (name, f) in &rows {
        let [c, s, u] = f.meta_cpu_us;
        writeln!(
            t,
            "{name:<12} create {c:>6.1}  stat {s:>5.1}  unlink {u:>6.1}"
        )?;
    }
    println!("\n{t}");
    report.push_str(&t);
    Ok(())
}

/// The 1, 5 and 15 minute load averages (/proc/loadavg), to judge how busy the machine was.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn free_bytes(p: &Path) -> Result<u64> {
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        bail!(
            "statvfs {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(sv.f_bavail * sv.f_frsize)
}

#[allow(clippy::too_many_arguments)]
fn measure_target(
    name: &str,
    dir: &Path,
    daemon: Option<u32>,
    size: u64,
    runtime: u64,
    files: u64,
    args: &Args,
) -> Result<Figures> {
    println!("-- {name}: {}", dir.display());
    let file = dir.join("fio.dat");
    let mut f = Figures::default();
    let w = fio(&file, "write", "1M", size, None, args.direct)?;
    f.seq_write_mibs = w.write_bw / MIB as f64;
    println!("   seq write 1M: {:.0} MiB/s", f.seq_write_mibs);
    let r = fio(&file, "read", "1M", size, None, args.direct)?;
    f.seq_read_mibs = r.read_bw / MIB as f64;
    println!("   seq read 1M:  {:.0} MiB/s", f.seq_read_mibs);
    let rr = fio(&file, "randread", "4k", size, Some(runtime), args.direct)?;
    f.rand_read_iops = rr.read_iops;
    println!("   rand read 4K: {:.0} IOPS", f.rand_read_iops);
    let _ = fs::remove_file(&file);
    check_interrupt()?;
    let [c, s, u] = metadata(&dir.join("meta"), files, args.meta_file_size, daemon)?;
    f.create_per_s = c.rate;
    f.stat_per_s = s.rate;
    f.unlink_per_s = u.rate;
    f.meta_cpu_us = [c.cpu_us, s.cpu_us, u.cpu_us];
    println!(
        "   metadata: create {:.0}/s, stat {:.0}/s, unlink {:.0}/s; CPU µs per op \
         {:.1} / {:.1} / {:.1}",
        c.rate, s.rate, u.rate, c.cpu_us, s.cpu_us, u.cpu_us
    );
    Ok(f)
}

struct FioResult {
    read_bw: f64,
    read_iops: f64,
    write_bw: f64,
}

fn fio(
    file: &Path,
    rw: &str,
    bs: &str,
    size: u64,
    runtime: Option<u64>,
    direct: bool,
) -> Result<FioResult> {
    check_interrupt()?;
    let mut cmd = Command::new("fio");
    cmd.arg("--name=kaiso-bench")
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--size={size}"))
        .arg("--ioengine=psync")
        .arg("--numjobs=1")
        .arg(format!("--direct={}", u8::from(direct)))
        .arg("--output-format=json");
    if rw == "write" {
        cmd.arg("--end_fsync=1");
    } else {
        // Reads measure the file-system path with the data in the page cache (the write
        // just before put it there) unless --direct.
        cmd.arg("--invalidate=0");
    }
    if let Some(secs) = runtime {
        cmd.arg("--time_based").arg(format!("--runtime={secs}"));
    }
    let out = cmd.stdin(Stdio::null()).output().context("run fio")?;
    if !out.status.success() {
        bail!(
            "fio {rw} on {} failed: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print warnings before the JSON object.
    let start = text.find('{').context("fio printed no JSON")?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).context("parse fio JSON")?;
    let job = &v["jobs"][0];
    let num = |x: &serde_json::Value| x.as_f64().unwrap_or(0.0);
    Ok(FioResult {
        read_bw: num(&job["read"]["bw_bytes"]),
        read_iops: num(&job["read"]["iops"]),
        write_bw: num(&job["write"]["bw_bytes"]),
    })
}

/// One phase of the metadata test.
#[derive(Clone, Copy)]
struct Phase {
    /// Operations per second (wall clock).
    rate: f64,
    /// CPU µs per operation: this thread's and the daemon's (all its threads).
    cpu_us: f64,
}

/// CPU time of the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// CPU time of every thread of process `pid` so far, in nanoseconds (the scheduler's run
/// time of each thread, /proc/PID/task/*/schedstat).
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn timed_phase(
    n: u64,
    daemon: Option<u32>,
    mut op: impl FnMut(usize) -> Result<()>,
) -> Result<Phase> {
    let cpu = || thread_cpu_ns() + daemon.map_or(0, process_cpu_ns);
    let (t, c) = (Instant::now(), cpu());
    for i in 0..n as usize {
        op(i)?;
        if i % 1024 == 0 {
            check_interrupt()?;
        }
    }
    let wall = t.elapsed().as_secs_f64();
    Ok(Phase {
        rate: n as f64 / wall,
        cpu_us: cpu().saturating_sub(c) as f64 / 1e3 / n as f64,
    })
}

/// Create (with `file_size` bytes written in one `write`), stat and unlink `n` files in
/// `dir`, each phase timed; `daemon` is the process serving `dir` (its CPU time is
/// counted with the caller's).
fn metadata(dir: &Path, n: u64, file_size: u64, daemon: Option<u32>) -> Result<[Phase; 3]> {
    fs::create_dir_all(dir)?;
    let names: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("f{i:07}"))).collect();
    let payload = vec![0x6bu8; file_size as usize];
    let create = timed_phase(n, daemon, |i| {
        let mut f = fs::File::create(&names[i])
            .with_context(|| format!("create {}", names[i].display()))?;
        if !payload.is_empty() {
            f.write_all(&payload)
                .with_context(|| format!("write {}", names[i].display()))?;
        }
        Ok(())
    })?;
    let stat = timed_phase(n, daemon, |i| {
        fs::metadata(&names[i])
            .map(drop)
            .with_context(|| format!("stat {}", names[i].display()))
    })?;
    let unlink = timed_phase(n, daemon, |i| {
        fs::remove_file(&names[i]).with_context(|| format!("unlink {}", names[i].display()))
    })?;
    let _ = fs::remove_dir(dir);
    Ok([create, stat, unlink])
}

// ---------------------------------------------------------------------------------------
// Tiering benefit.

/// Zipf(s) over ranks 1..=n by inverse CDF (n is small: a table is fine).
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_rounds() {
        let f = |x: f64| Figures::from_values([x; 6]);
        assert_eq!(Figures::median(&[f(3.0), f(1.0), f(2.0)]).create_per_s, 2.0);
        assert_eq!(Figures::median(&[f(1.0), f(4.0)]).stat_per_s, 2.5);
        assert_eq!(Figures::median(&[]).unlink_per_s, 0.0);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1MiB"), Ok(MIB));
        assert_eq!(parse_size("256k"), Ok(256 << 10));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }
}
