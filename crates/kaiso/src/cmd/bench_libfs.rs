//! `kaiso bench libfs`: the library file system against tmpfs, ext4 (on a loop device
//! backed by /dev/shm, the same medium) and a kaiso FUSE mount (one tier on /dev/shm), all
//! measured in one run: a fileserver-like workload (1 thread and several), tar extraction of
//! a generated tree, and RocksDB db_bench. Prints ops/s, the private directory's ratio to
//! each baseline, and system calls and context switches per operation (perf stat, when
//! available; for the FUSE mount only the client's, not the daemon's).

use anyhow::{Context, bail};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::scratch_fs::{FreshExt4, is_mounted};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds per fileserver run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Files per fileserver run (split over the threads).
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// File sizes for the fileserver workload (KiB).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    sizes_kib: Vec<u64>,
    /// Thread counts for the fileserver workload.
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    threads: Vec<usize>,
    /// Files in the generated tree for the tar benchmark (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    tar_files: usize,
    /// Keys for db_bench (0 skips it).
    #[arg(long, default_value_t = 200_000)]
    db_num: u64,
    /// Scratch space (tmpfs baseline, pools, the ext4 image).
    #[arg(long, default_value = "/dev/shm")]
    scratch: PathBuf,
    /// Size of the private pool and of the ext4 image.
    #[arg(long, default_value = "8G")]
    pool_size: String,
    /// Leave out the kaiso FUSE mount baseline.
    #[arg(long)]
    no_fuse: bool,
    /// Runs of every workload on every target (interleaved); the median run is reported.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Internal: run one workload in this process (used under LD_PRELOAD).
    #[arg(long, hide = true)]
    worker: Option<String>,
    #[arg(long, hide = true)]
    dir: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 64)]
    size_kib: u64,
    #[arg(long, hide = true, default_value_t = 1)]
    nthreads: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let Some(w) = &args.worker {
        return worker(w, &args);
    }
    // Ctrl-C runs no `Drop`: the ext4 target's loop mount and image go in the handler.
    super::scratch_fs::install_signal_cleanup();
    Bench::new(&args)?.run_all(&args)
}

// ---- worker ------------------------------------------------------------------------------------

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn worker(kind: &str, a: &Args) -> anyhow::Result<()> {
    let dir = a.dir.clone().context("--dir is required")?;
    match kind {
        "fileserver" => {
            let per = (a.files / a.nthreads).max(1);
            let size = (a.size_kib << 10) as usize;
            // Prepopulation happens before the clock starts: the stop time is set after it.
            let secs = Duration::from_secs_f64(a.seconds);
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(a.nthreads + 1));
            let start_at = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
            let mut hs = Vec::new();
            for t in 0..a.nthreads {
                let d = dir.join(format!("t{t}"));
                let b = barrier.clone();
                let st = start_at.clone();
                hs.push(std::thread::spawn(move || -> std::io::Result<u64> {
                    // Populate, wait for everyone, then run until the shared stop time.
                    std::fs::create_dir_all(&d)?;
                    let data = vec![0x5au8; size];
                    for i in 0..per {
                        std::fs::write(d.join(format!("f{i}")), &data)?;
                    }
                    b.wait();
                    b.wait();
                    let stop = st.lock().unwrap().expect("start set") + secs;
                    fileserver_thread_run(&d, per, size, stop, 0x9e37_79b9 + t as u64)
                }));
            }
            barrier.wait();
            let t0 = Instant::now();
            *start_at.lock().unwrap() = Some(t0);
            barrier.wait();
            let mut ops = 0;
            for h in hs {
                ops += h.join().expect("worker thread")?;
            }
            println!("ops {ops} seconds {:.6}", t0.elapsed().as_secs_f64());
            Ok(())
        }
        other => bail!("unknown worker {other}"),
    }
}

/// filebench-fileserver-like loop over an already populated directory: delete + create
/// (write the whole file), append 16 KiB, read a whole file, stat; each counts as one op.
fn fileserver_thread_run(
    dir: &Path,
    files: usize,
    size: usize,
    stop: Instant,
    seed: u64,
) -> std::io::Result<u64> {
    let data = vec![0x5au8; size.max(16 << 10)];
    let name = |i: usize| dir.join(format!("f{i}"));
    let mut buf = vec![0u8; 1 << 20];
    let mut s = seed | 1;
    let mut ops = 0u64;
    while Instant::now() < stop {
        for _ in 0..8 {
            let i = xorshift(&mut s) as usize % files;
            std::fs::remove_file(name(i))?;
            let mut f = std::fs::File::create(name(i))?;
            f.write_all(&data[..size])?;
            drop(f);
            let j = xorshift(&mut s) as usize % files;
            let mut ap = std::fs::OpenOptions::new().append(true).open(name(j))?;
            ap.write_all(&data[..16 << 10])?;
            drop(ap);
            let k = xorshift(&mut s) as usize % files;
            let mut r = std::fs::File::open(name(k))?;
            while r.read(&mut buf)? > 0 {}
            drop(r);
            let l = xorshift(&mut s) as usize % files;
            std::fs::metadata(name(l))?;
            ops += 5;
        }
    }
    Ok(ops)
}

// ---- targets -------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Target {
    Private,
    Tmpfs,
    Ext4,
    Fuse,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Private => "private (kaiso libfs)",
            Target::Tmpfs => "tmpfs",
            Target::Ext4 => "ext4 (loop on /dev/shm)",
            Target::Fuse => "kaiso FUSE (/dev/shm tier)",
        }
    }
}

/// `kaiso mount` of a store with one tier on /dev/shm, run as our child; unmounted, stopped
/// and removed on drop.
struct FuseMount {
    root: PathBuf,
    mnt: PathBuf,
    child: Child,
}

impl FuseMount {
    fn new(exe: &Path, scratch: &Path, size: u64) -> anyhow::Result<FuseMount> {
        let root = scratch.join(format!("kaiso-bench-fuse-{}", std::process::id()));
        let mnt = std::env::temp_dir().join(format!("kaiso-bench-fuse-{}", std::process::id()));
        for d in [root.join("tier"), root.join("state"), mnt.clone()] {
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        }
        let cfg = root.join("store.toml");
        std::fs::write(
            &cfg,
            format!(
                "[store]\nstate_dir = {:?}\n\n[[tier]]\nname = \"shm\"\npath = {:?}\ncapacity = {size}\n",
                root.join("state").display().to_string(),
                root.join("tier").display().to_string(),
            ),
        )?;
        let log = std::fs::File::create(root.join("mount.log"))?;
        let child = Command::new(exe)
            .arg("mount")
            .arg(&cfg)
            .arg(&mnt)
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start kaiso mount")?;
        let mut m = FuseMount { root, mnt, child };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&m.mnt) {
            if let Some(st) = m.child.try_wait()? {
                let log = std::fs::read_to_string(m.root.join("mount.log")).unwrap_or_default();
                bail!("kaiso mount exited ({st}): {}", log.trim());
            }
            if Instant::now() > deadline {
                bail!("kaiso mount did not mount {} within 30 s", m.mnt.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(m)
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        for _ in 0..50 {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .stderr(Stdio::null())
                .status();
            if !is_mounted(&self.mnt) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while matches!(self.child.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir(&self.mnt);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

struct Bench {
    exe: PathBuf,
    preload: PathBuf,
    scratch: PathBuf,
    pool_size: u64,
    ext4: Option<FreshExt4>,
    ext4_error: Option<String>,
    fuse: Option<FuseMount>,
    fuse_error: Option<String>,
    perf: bool,
    run_id: u32,
}

/// One measurement: operations, seconds, system calls and context switches (if perf ran).
#[derive(Clone, Copy, Default)]
struct Sample {
    ops: f64,
    secs: f64,
    syscalls: Option<f64>,
    cswitches: Option<f64>,
}

impl Sample {
    fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.ops / self.secs
        } else {
            0.0
        }
    }
}

impl Bench {
    fn new(a: &Args) -> anyhow::Result<Bench> {
        let exe = std::env::current_exe()?;
        let preload = super::private::find_preload()?;
        let pool_size = parse_size(&a.pool_size)?;
        let (ext4, ext4_error) = match FreshExt4::new(
            a.scratch
                .join(format!("kaiso-bench-{}.ext4", std::process::id())),
            std::env::temp_dir().join(format!("kaiso-bench-ext4-{}", std::process::id())),
            pool_size,
            None,
        ) {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let (fuse, fuse_error) = if a.no_fuse {
            (None, None)
        } else {
            match FuseMount::new(&exe, &a.scratch, pool_size) {
                Ok(m) => (Some(m), None),
                Err(e) => (None, Some(format!("{e:#}"))),
            }
        };
        let perf = Command::new("perf")
            .args([
                "stat",
                "-x,",
                "-e",
                "raw_syscalls:sys_enter,context-switches",
                "--",
                "true",
            ])
            .output()
            .is_ok_and(|o| {
                o.status.success() && String::from_utf8_lossy(&o.stderr).contains("raw_syscalls")
            });
        Ok(Bench {
            exe,
            preload,
            scratch: a.scratch.clone(),
            pool_size,
            ext4,
            ext4_error,
            fuse,
            fuse_error,
            perf,
            run_id: 0,
        })
    }

    fn targets(&self) -> Vec<Target> {
        let mut t = vec![Target::Private, Target::Tmpfs];
        if self.ext4.is_some() {
            t.push(Target::Ext4);
        }
        if self.fuse.is_some() {
            t.push(Target::Fuse);
        }
        t
    }

    /// A fresh empty directory on `t`, and (for the private target) its pool file.
    fn fresh(&mut self, t: Target) -> anyhow::Result<(PathBuf, Option<PathBuf>)> {
        self.run_id += 1;
        let tag = format!("kaiso-bench-{}-{}", std::process::id(), self.run_id);
        Ok(match t {
            Target::Private => {
                let dir = std::env::temp_dir().join(&tag);
                std::fs::create_dir_all(&dir)?;
                (dir, Some(self.scratch.join(format!("{tag}.pool"))))
            }
            Target::Tmpfs => {
                let dir = self.scratch.join(&tag);
                std::fs::create_dir_all(&dir)?;
                (dir, None)
            }
            Target::Ext4 => {
                let dir = self.ext4.as_ref().expect("ext4 target").path().join(&tag);
                std::fs::create_dir_all(&dir)?;
                (dir, None)
            }
            Target::Fuse => {
                let dir = self.fuse.as_ref().expect("fuse target").mnt.join(&tag);
                std::fs::create_dir_all(&dir)?;
                (dir, None)
            }
        })
    }

    fn cleanup(dir: &Path, pool: &Option<PathBuf>) {
        let _ = std::fs::remove_dir_all(dir);
        if let Some(p) = pool {
            let _ = std::fs::remove_file(p);
        }
    }

    /// Runs `argv` (under the preload for the private target), inside perf stat if available.
    fn command(
        &self,
        t: Target,
        dir: &Path,
        pool: &Option<PathBuf>,
        argv: &[String],
        perf_out: &Path,
    ) -> Command {
        let mut c = if self.perf {
            let mut c = Command::new("perf");
            c.args([
                "stat",
                "-x,",
                "-e",
                "raw_syscalls:sys_enter,context-switches",
                "-o",
            ])
            .arg(perf_out)
            .arg("--");
            c.args(argv);
            c
        } else {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        };
        if t == Target::Private {
            c.env("LD_PRELOAD", &self.preload)
                .env("KAISO_PRIVATE_DIR", dir)
                .env(
                    "KAISO_POOL",
                    pool.as_ref().expect("private target has a pool"),
                )
                .env("KAISO_POOL_SIZE", self.pool_size.to_string())
                .env_remove("KAISO_INHERIT")
                .env_remove("KAISO_CWD");
        }
        c
    }

    fn perf_counts(&self, perf_out: &Path) -> (Option<f64>, Option<f64>) {
        if !self.perf {
            return (None, None);
        }
        let text = std::fs::read_to_string(perf_out).unwrap_or_default();
        let mut sys = None;
        let mut cs = None;
        for l in text.lines() {
            let f: Vec<&str> = l.split(',').collect();
            if f.len() > 2 {
                let v = f[0].parse::<f64>().ok();
                if f[2] == "raw_syscalls:sys_enter" {
                    sys = v;
                } else if f[2] == "context-switches" {
                    cs = v;
                }
            }
        }
        (sys, cs)
    }

    /// One fileserver worker run: (ops, seconds, system calls, context switches).
    fn fileserver_once(
        &mut self,
        t: Target,
        a: &Args,
        size_kib: u64,
        threads: usize,
        seconds: f64,
    ) -> anyhow::Result<Sample> {
        let (dir, pool) = self.fresh(t)?;
        let perf_out = self
            .scratch
            .join(format!("kaiso-bench-perf-{}.txt", std::process::id()));
        let argv: Vec<String> = vec![
            self.exe.display().to_string(),
            "bench".into(),
            "libfs".into(),
            "--worker".into(),
            "fileserver".into(),
            "--dir".into(),
            dir.display().to_string(),
            "--files".into(),
            a.files.to_string(),
            "--size-kib".into(),
            size_kib.to_string(),
            "--nthreads".into(),
            threads.to_string(),
            "--seconds".into(),
            seconds.to_string(),
        ];
        let out = self
            .command(t, &dir, &pool, &argv, &perf_out)
            .output()
            .context("run fileserver worker")?;
        Self::cleanup(&dir, &pool);
        if !out.status.success() {
            bail!(
                "fileserver worker on {} failed: {}",
                t.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let so = String::from_utf8_lossy(&out.stdout);
        let f: Vec<&str> = so.split_whitespace().collect();
        let ops: f64 = f
            .get(1)
            .and_then(|x| x.parse().ok())
            .context("worker output")?;
        let secs: f64 = f
            .get(3)
            .and_then(|x| x.parse().ok())
            .context("worker output")?;
        let (sys, cs) = self.perf_counts(&perf_out);
        let _ = std::fs::remove_file(&perf_out);
        Ok(Sample {
            ops,
            secs,
            syscalls: sys,
            cswitches: cs,
        })
    }

    /// The timed fileserver run; with perf, the system calls and context switches of start-up
    /// and prepopulation (a run of zero seconds) are subtracted.
    fn fileserver(
        &mut self,
        t: Target,
        a: &Args,
        size_kib: u64,
        threads: usize,
    ) -> anyhow::Result<Sample> {
        let mut s = self.fileserver_once(t, a, size_kib, threads, a.seconds)?;
        if self.perf {
            let base = self.fileserver_once(t, a, size_kib, threads, 0.0)?;
            let sub = |x: Option<f64>, y: Option<f64>| Some((x? - y?).max(0.0));
            s.syscalls = sub(s.syscalls, base.syscalls);
            s.cswitches = sub(s.cswitches, base.cswitches);
        }
        Ok(s)
    }

    fn tar(&mut self, t: Target, archive: &Path, files: usize) -> anyhow::Result<Sample> {
        let (dir, pool) = self.fresh(t)?;
        let perf_out = self
            .scratch
            .join(format!("kaiso-bench-perf-{}.txt", std::process::id()));
        // Kernel file systems: tar + sync, as in the thesis; the pool is written through.
        let script = if t == Target::Private {
            format!("tar -xf {} -C {}", archive.display(), dir.display())
        } else {
            format!(
                "tar -xf {} -C {} && sync -f {}",
                archive.display(),
                dir.display(),
                dir.display()
            )
        };
        let argv = vec!["sh".to_string(), "-c".to_string(), script];
        let t0 = Instant::now();
        let out = self.command(t, &dir, &pool, &argv, &perf_out).output()?;
        let secs = t0.elapsed().as_secs_f64();
        Self::cleanup(&dir, &pool);
        if !out.status.success() {
            bail!(
                "tar on {} failed: {}",
                t.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let (sys, cs) = self.perf_counts(&perf_out);
        let _ = std::fs::remove_file(&perf_out);
        Ok(Sample {
            ops: files as f64,
            secs,
            syscalls: sys,
            cswitches: cs,
        })
    }

    /// db_bench fillseq, fillrandom, readrandom: ops/s of each (perf counts the whole run).
    fn db_bench(&mut self, t: Target, num: u64) -> anyhow::Result<Vec<(String, Sample)>> {
        let (dir, pool) = self.fresh(t)?;
        let perf_out = self
            .scratch
            .join(format!("kaiso-bench-perf-{}.txt", std::process::id()));
        let argv: Vec<String> = vec![
            "db_bench".into(),
            format!("--db={}/db", dir.display()),
            "--benchmarks=fillseq,fillrandom,readrandom".into(),
            format!("--num={num}"),
            "--value_size=1024".into(),
            "--compression_type=none".into(),
            "--threads=1".into(),
        ];
        let out = self
            .command(t, &dir, &pool, &argv, &perf_out)
            .output()
            .context("run db_bench")?;
        Self::cleanup(&dir, &pool);
        if !out.status.success() {
            bail!(
                "db_bench on {} failed: {}",
                t.name(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let (sys, cs) = self.perf_counts(&perf_out);
        let _ = std::fs::remove_file(&perf_out);
        let so = String::from_utf8_lossy(&out.stdout);
        let mut res = Vec::new();
        let total_ops = 3.0 * num as f64;
        for name in ["fillseq", "fillrandom", "readrandom"] {
            let line = so
                .lines()
                .find(|l| l.trim_start().starts_with(name))
                .with_context(|| format!("db_bench printed no {name} line"))?;
            // "fillseq : 4.5 micros/op 220000 ops/sec ..."
            let w: Vec<&str> = line.split_whitespace().collect();
            let i = w.iter().position(|x| *x == "ops/sec").context("ops/sec")?;
            let rate: f64 = w[i - 1].parse()?;
            res.push((
                name.to_string(),
                Sample {
                    ops: rate,
                    secs: 1.0,
                    syscalls: sys.map(|s| s / total_ops * rate),
                    cswitches: cs.map(|c| c / total_ops * rate),
                },
            ));
        }
        Ok(res)
    }

    fn run_all(mut self, a: &Args) -> anyhow::Result<()> {
        println!(
            "kaiso bench libfs: the private directory's pool and every baseline live on /dev/shm (DRAM standing in for NVM)."
        );
        if let Some(e) = &self.ext4_error {
            println!("ext4 baseline unavailable: {e}");
        }
        if let Some(e) = &self.fuse_error {
            println!("kaiso FUSE baseline unavailable: {e}");
        }
        if !self.perf {
            println!("perf stat unavailable: no system-call or context-switch counts");
        }
        let targets = self.targets();
        let mut rows: Vec<(String, Vec<(Target, Sample)>)> = Vec::new();
        for &threads in &a.threads {
            for &kib in &a.sizes_kib {
                let mut runs = Vec::new();
                for _ in 0..a.repeat.max(1) {
                    for &t in &targets {
                        runs.push((t, self.fileserver(t, a, kib, threads)?));
                    }
                }
                let r = medians(&targets, runs);
                let label = format!(
                    "fileserver {kib} KiB, {threads} thread{}",
                    if threads == 1 { "" } else { "s" }
                );
                print_row(&label, "ops/s", &r);
                rows.push((label, r));
            }
        }
        if a.tar_files > 0 {
            let archive = make_archive(&self.scratch, a.tar_files)?;
            let mut runs = Vec::new();
            for _ in 0..a.repeat.max(1) {
                for &t in &targets {
                    runs.push((t, self.tar(t, &archive, a.tar_files)?));
                }
            }
            let r = medians(&targets, runs);
            let _ = std::fs::remove_file(&archive);
            let label = format!("tar -x of {} files (+sync on kernel fs)", a.tar_files);
            print_row(&label, "files/s", &r);
            rows.push((label, r));
        }
        if a.db_num > 0 {
            if Command::new("db_bench").arg("--help").output().is_err() {
                println!("db_bench not found (Debian package rocksdb-tools): skipped");
            } else {
                let mut per: Vec<(String, Vec<(Target, Sample)>)> = Vec::new();
                for _ in 0..a.repeat.max(1) {
                    for &t in &targets {
                        for (name, s) in self.db_bench(t, a.db_num)? {
                            match per.iter_mut().find(|x| x.0 == name) {
                                Some(x) => x.1.push((t, s)),
                                None => per.push((name, vec![(t, s)])),
                            }
                        }
                    }
                }
                for (name, runs) in per {
                    let r = medians(&targets, runs);
                    let label = format!("db_bench {name} ({} keys, 1 KiB values)", a.db_num);
                    print_row(&label, "ops/s", &r);
                    rows.push((label, r));
                }
            }
        }
        println!("\nsummary (private directory / baseline, higher is better):");
        for (label, r) in &rows {
            let p = r
                .iter()
                .find(|x| x.0 == Target::Private)
                .map(|x| x.1.rate())
                .unwrap_or(0.0);
            let mut line = format!("  {label:<48}");
            for (t, s) in r.iter().filter(|x| x.0 != Target::Private) {
                line.push_str(&format!(
                    "  {:.2}x {}",
                    p / s.rate().max(1e-9),
                    t.name().split(' ').next().unwrap_or("")
                ));
            }
            println!("{line}");
        }
        drop(self.fuse.take());
        drop(self.ext4.take());
        Ok(())
    }
}

/// Per target, the run with the median rate (runs are interleaved across targets, so a burst
/// of load from elsewhere on the machine hits one run of each rather than all runs of one).
fn medians(targets: &[Target], runs: Vec<(Target, Sample)>) -> Vec<(Target, Sample)> {
    targets
        .iter()
        .filter_map(|&t| {
            let mut v: Vec<Sample> = runs.iter().filter(|x| x.0 == t).map(|x| x.1).collect();
            v.sort_by(|x, y| x.rate().total_cmp(&y.rate()));
            v.get(v.len() / 2).map(|s| (t, *s))
        })
        .collect()
}

fn print_row(label: &str, unit: &str, r: &[(Target, Sample)]) {
    println!("\n{label}");
    for (t, s) in r {
        let per_op = |v: Option<f64>| {
            v.map(|x| format!("{:.2}", x / s.ops.max(1.0)))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "  {:<26} {:>12.0} {unit:<8} syscalls/op {:>8}  ctx-switches/op {:>8}",
            t.name(),
            s.rate(),
            per_op(s.syscalls),
            per_op(s.cswitches)
        );
    }
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Ok(num
        .parse::<u64>()
        .with_context(|| format!("bad size {s:?}"))?
        * mul)
}

/// A tar archive of `files` files (sizes 0..16 KiB, mean ~8 KiB) in ~files/30 directories.
fn make_archive(scratch: &Path, files: usize) -> anyhow::Result<PathBuf> {
    let src = scratch.join(format!("kaiso-bench-tree-{}", std::process::id()));
    let archive = scratch.join(format!("kaiso-bench-tree-{}.tar", std::process::id()));
    let _ = std::fs::remove_dir_all(&src);
    let dirs = (files / 30).max(1);
    let data = vec![0x61u8; 16 << 10];
    let mut s = 0x1234_5678u64;
    for i in 0..files {
        let d = src.join(format!("d{}/s{}", i % dirs / 10, i % dirs));
        if i < dirs {
            std::fs::create_dir_all(&d)?;
        }
        let len = (xorshift(&mut s) % (16 << 10)) as usize;
        std::fs::write(d.join(format!("file{i}.dat")), &data[..len])?;
    }
    let st = Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg(".")
        .status()?;
    let _ = std::fs::remove_dir_all(&src);
    if !st.success() {
        bail!("tar -c of the generated tree failed");
    }
    Ok(archive)
}
