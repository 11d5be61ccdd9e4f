//! Measures kaiso's SMB source (`SmbSource`; on the `smb` crate until session 8, on the
//! `smb2` crate with compound requests since) against the bare `smb2` crate on the same
//! share: data reads and per-file metadata, as the migration engine asks for
//! them (8 plain threads, one connection each, 10 MiB unit buffers).
//!
//! Run through `benches/smb-probe/run.sh`, which starts smbd on a generated tree. By hand:
//! `kaiso-smb-probe --port P --password PW --client kaiso|smb2 --test large|small|meta|verify`
//! (also `--host`, `--share`, `--user`, `--threads`, `--piece` in bytes, and
//! `--no-compound 1`: smb2 opens and READs small files instead of one compound, and
//! `--workers N`: tokio worker threads for smb2, default one per CPU, and
//! `--per-thread-runtime 1`: every smb2 connection on a current-thread runtime of its
//! own, driven by its calling thread; `--mallopt 1`: glibc's mmap threshold 32 MiB and
//! trim threshold 256 MiB, set with mallopt at start).
//! `smb_probe --proxy-to PORT [--delay-ms 1]` is a delay proxy instead: it listens on a
//! loopback port (printed as `proxy_port=N`) and forwards every byte to PORT and back,
//! each way `delay-ms` later, until killed (the script runs it as a process of its own,
//! so its CPU is not the client's).
//!
//! The tree it expects under the share: `large/fNN` (25 MiB files) and
//! `small/dNN/fNNN` (~800 KiB files, some with EAs and a named stream).
//! Every run prints one line of `key=value` figures:
//! wall seconds of the measured phase, the probe's CPU seconds (getrusage RUSAGE_SELF,
//! every thread), smbd's CPU seconds (utime+stime+cutime+cstime of every process named
//! smbd in the session `--smbd-sid` names, else of every smbd, read from /proc before and
//! after), peak RSS, and the requests each client sent.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kaiso_source::smb::SmbStats;
use kaiso_source::{SmbConfig, SmbSource, Source, SourcePath};
use smb2::msg::close::CloseRequest;
use smb2::msg::create::{
    CreateDisposition, CreateRequest, CreateResponse, ImpersonationLevel, ShareAccess,
};
use smb2::msg::query_info::{InfoType, QueryInfoRequest, QueryInfoResponse};
use smb2::pack::{ReadCursor, Unpack};
use smb2::types::flags::FileAccessMask;
use smb2::types::status::NtStatus;
use smb2::types::{Command, CreditCharge, FileId, OplockLevel};
use smb2::{ClientConfig, CompoundOp, Frame, SmbClient, Tree};

const UNIT: usize = 10 << 20;
const LARGE_DIR: &str = "large";
const SMALL_DIR: &str = "small";

// FileInformationClass values (MS-FSCC 2.4).
const FILE_ALL_INFORMATION: u8 = 18;
const FILE_FULL_EA_INFORMATION: u8 = 15;
const FILE_STREAM_INFORMATION: u8 = 22;
// Security information wanted: owner, group, DACL (MS-DTYP 2.4.7).
const OWNER_GROUP_DACL: u32 = 0x1 | 0x2 | 0x4;
const SL_RESTART_SCAN: u8 = 0x1;
/// Output buffer asked for each query: one credit's worth.
const QUERY_BUFFER: u32 = 64 << 10;

#[derive(Clone)]
struct Args {
    host: String,
    port: u16,
    share: String,
    user: String,
    password: String,
    client: String,
    test: String,
    threads: usize,
    piece: usize,
    /// smb2 data: open every file and read it with READs (no CREATE+READ+CLOSE compound).
    no_compound: bool,
    /// smb2: tokio worker threads (0: tokio's default, one per CPU).
    workers: usize,
    /// smb2: each connection on a current-thread runtime of its own, driven only by its
    /// calling thread (no hand-off to a worker thread), instead of one shared runtime.
    per_thread_runtime: bool,
    /// Fix glibc's mmap and trim thresholds (mallopt) before anything is allocated, so
    /// freed reply buffers are reused instead of returned to the kernel.
    mallopt: bool,
    /// Count only the smbd processes of this session (smbd's own pid: it calls setsid),
    /// so another smbd on the machine is not counted.
    smbd_sid: Option<i32>,
    /// Proxy mode: forward a loopback port to this one, `delay_ms` later each way.
    proxy_to: Option<u16>,
    delay_ms: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        host: "127.0.0.1".into(),
        port: 445,
        share: "src".into(),
        user: "root".into(),
        password: String::new(),
        client: "kaiso".into(),
        test: "large".into(),
        threads: 8,
        piece: 1 << 20,
        no_compound: false,
        proxy_to: None,
        delay_ms: 1,
        workers: 0,
        per_thread_runtime: false,
        smbd_sid: None,
        mallopt: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--host" => a.host = value,
            "--port" => a.port = num(&value)? as u16,
            "--share" => a.share = value,
            "--user" => a.user = value,
            "--password" => a.password = value,
            "--client" => a.client = value,
            "--test" => a.test = value,
            "--threads" => a.threads = num(&value)?.max(1),
            "--piece" => a.piece = num(&value)?.clamp(64 << 10, 8 << 20),
            "--no-compound" => a.no_compound = num(&value)? != 0,
            "--proxy-to" => a.proxy_to = Some(num(&value)? as u16),
            "--delay-ms" => a.delay_ms = num(&value)? as u64,
            "--workers" => a.workers = num(&value)?,
            "--per-thread-runtime" => a.per_thread_runtime = num(&value)? != 0,
            "--smbd-sid" => a.smbd_sid = Some(num(&value)? as i32),
            "--mallopt" => a.mallopt = num(&value)? != 0,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if !["kaiso", "smb2"].contains(&a.client.as_str()) {
        return Err(format!("--client {}: kaiso or smb2", a.client));
    }
    if !["large", "small", "meta", "verify"].contains(&a.test.as_str()) {
        return Err(format!("--test {}: large, small, meta or verify", a.test));
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("smb_probe: {e}");
            std::process::exit(2);
        }
    };
    if args.mallopt {
        // 32 MiB: above every buffer either client allocates per READ; 256 MiB of free
        // heap may stay mapped.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        }
    }
    let result = match (args.test.as_str(), args.client.as_str()) {
        _ if args.proxy_to.is_some() => run_proxy(&args),
        ("verify", _) => verify(&args),
        (_, "kaiso") => run_kaiso(&args),
        _ => run_smb2(&args),
    };
    if let Err(e) = result {
        eprintln!("smb_probe: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------
// Measuring

/// CPU seconds of this process (all threads).
fn self_cpu() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Peak resident memory of this process, MiB.
fn max_rss_mib() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    ru.ru_maxrss as f64 / 1024.0
}

/// CPU seconds of every smbd process (of session `sid` if given), including its reaped
/// children.
fn smbd_cpu(sid: Option<i32>) -> f64 {
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let mut total = 0u64;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    for e in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid ... utime(14) stime(15) cutime(16) cstime(17)
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if &stat[open + 1..close] != "smbd" {
            continue;
        }
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        // state(0) ppid(1) pgrp(2) session(3)
        if sid.is_some_and(|sid| fields.get(3).and_then(|f| f.parse().ok()) != Some(sid)) {
            continue;
        }
        for i in 11..15 {
            total += fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total as f64 / tick
}

struct Meter {
    wall: Instant,
    cpu: f64,
    smbd: f64,
    sid: Option<i32>,
}

impl Meter {
    fn start(args: &Args) -> Self {
        Self {
            wall: Instant::now(),
            cpu: self_cpu(),
            smbd: smbd_cpu(args.smbd_sid),
            sid: args.smbd_sid,
        }
    }
    /// wall, own CPU, smbd CPU, all in seconds.
    fn stop(&self) -> (f64, f64, f64) {
        (
            self.wall.elapsed().as_secs_f64(),
            self_cpu() - self.cpu,
            smbd_cpu(self.sid) - self.smbd,
        )
    }
}

fn report(args: &Args, phase: &str, items: usize, bytes: u64, m: (f64, f64, f64), extra: &str) {
    let (wall, cpu, smbd) = m;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let mut line = format!(
        "client={} test={} phase={phase} items={items} wall_s={wall:.3} cpu_s={cpu:.3} \
         smbd_cpu_s={smbd:.3} max_rss_MiB={:.0}",
        args.client,
        args.test,
        max_rss_mib()
    );
    if bytes > 0 {
        line += &format!(
            " MiB={:.0} MiB_per_s={:.0} cpu_s_per_GiB={:.3} smbd_cpu_s_per_GiB={:.3}",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / (1 << 20) as f64 / wall,
            cpu / gib,
            smbd / gib
        );
    } else if items > 0 {
        line += &format!(
            " wall_us_per_item={:.0} cpu_us_per_item={:.0} smbd_cpu_us_per_item={:.0}",
            wall * 1e6 / items as f64,
            cpu * 1e6 / items as f64,
            smbd * 1e6 / items as f64
        );
    }
    println!("{line} {extra}");
}

/// Runs `work(thread, next)` on `threads` threads, each taking items from a shared cursor.
fn on_threads<S: Send>(
    states: Vec<S>,
    work: impl Fn(&mut S, &AtomicUsize) -> Result<u64, String> + Sync,
) -> Result<(u64, Vec<S>), String> {
    let next = AtomicUsize::new(0);
    let results: Vec<(Result<u64, String>, S)> = std::thread::scope(|s| {
        let handles: Vec<_> = states
            .into_iter()
            .map(|mut st| {
                let (work, next) = (&work, &next);
                s.spawn(move || (work(&mut st, next), st))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("worker"))
            .collect()
    });
    let mut total = 0;
    let mut states = Vec::new();
    for (r, st) in results {
        total += r?;
        states.push(st);
    }
    Ok((total, states))
}

// ---------------------------------------------------------------------------------------
// The tree

/// Files of one data test, as share-relative paths with '/' separators, and their sizes
/// (the engine has them from its listing). Listed before anything is measured, on a
/// connection of its own that is gone (and its smbd process with it) before the
/// measured clients connect, so neither client's source sees the listing (kaiso's would
/// start fetching every listed file's metadata in the background).
fn data_files(args: &Args, dir: &str) -> Result<Vec<(String, u64)>, String> {
    let rt = runtime(args.workers)?;
    let files = rt.block_on(async {
        let mut conn = smb2_connect(args).await?;
        smb2_files(&mut conn, dir).await
    })?;
    drop(rt);
    std::thread::sleep(Duration::from_secs(1));
    Ok(files)
}

/// The directory a data test reads, `None` for the metadata test.
fn data_dir(args: &Args) -> Option<&'static str> {
    match args.test.as_str() {
        "large" => Some(LARGE_DIR),
        "small" => Some(SMALL_DIR),
        _ => None,
    }
}

fn small_dirs(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{SMALL_DIR}/d{i:02}")).collect()
}

// ---------------------------------------------------------------------------------------
// kaiso's SmbSource

fn kaiso_connect(args: &Args) -> Result<SmbSource, String> {
    let mut c = SmbConfig::new(&args.host, &args.share, &args.user, &args.password);
    c.port = args.port;
    c.connections = args.threads;
    let source = SmbSource::connect(c).map_err(|e| format!("connect: {e}"))?;
    // Open every session before measuring: calls on all threads at once.
    let root = SourcePath::root();
    std::thread::scope(|s| {
        for _ in 0..args.threads * 2 {
            s.spawn(|| {
                for _ in 0..4 {
                    let _ = source.stat(&root);
                }
            });
        }
    });
    Ok(source)
}

fn stats_delta(a: SmbStats, b: SmbStats) -> String {
    format!(
        "round_trips={} compounds={} creates={} queries={} listings={} reads={} closes={} metadata_fetches={} reads_opened={}",
        b.round_trips - a.round_trips,
        b.compounds - a.compounds,
        b.creates - a.creates,
        b.queries - a.queries,
        b.listings - a.listings,
        b.reads - a.reads,
        b.closes - a.closes,
        b.metadata_fetches - a.metadata_fetches,
        b.reads_opened - a.reads_opened
    )
}

fn run_kaiso(args: &Args) -> Result<(), String> {
    let data_dir = data_dir(args);
    let files = match data_dir {
        Some(dir) => data_files(args, dir)?,
        None => Vec::new(),
    };
    let source = kaiso_connect(args)?;
    match data_dir {
        Some(_) => {
            let before = source.stats();
            let m = Meter::start(args);
            let states = (0..args.threads).map(|_| vec![0u8; UNIT]).collect();
            let (bytes, _) = on_threads(states, |buf, next| {
                let mut done = 0u64;
                while let Some((path, size)) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let p = SourcePath::parse(path.as_bytes()).map_err(|e| e.to_string())?;
                    let mut off = 0u64;
                    while off < *size {
                        let (n, _) = source
                            .read_into(&p, off, buf)
                            .map_err(|e| format!("read {path}: {e}"))?;
                        if n == 0 {
                            break;
                        }
                        off += n as u64;
                    }
                    if off != *size {
                        return Err(format!("{path}: read {off} of {size} bytes"));
                    }
                    done += off;
                }
                Ok(done)
            })?;
            let m = m.stop();
            let extra = stats_delta(before, source.stats());
            report(args, "data", files.len(), bytes, m, &extra);
        }
        _ => {
            let dirs = small_dirs(20);
            let before = source.stats();
            let m = Meter::start(args);
            let states = (0..args.threads).map(|_| Vec::new()).collect();
            let (_, lists) = on_threads(states, |found: &mut Vec<String>, next| {
                while let Some(d) = dirs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let p = SourcePath::parse(d.as_bytes()).map_err(|e| e.to_string())?;
                    let (entries, _) = source
                        .read_dir_with_attr(&p)
                        .map_err(|e| format!("list {d}: {e}"))?;
                    for e in entries {
                        found.push(format!("{d}/{}", String::from_utf8_lossy(&e.name)));
                    }
                }
                Ok(0)
            })?;
            let listed = m.stop();
            let after_list = source.stats();
            let files: Vec<String> = lists.into_iter().flatten().collect();
            report(
                args,
                "list",
                dirs.len(),
                0,
                listed,
                &stats_delta(before, after_list),
            );
            // What the engine asks per file after the listing (engine.rs copy_metadata).
            let m = Meter::start(args);
            let states = (0..args.threads).map(|_| ()).collect();
            on_threads(states, |_, next| {
                while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let p = SourcePath::parse(path.as_bytes()).map_err(|e| e.to_string())?;
                    source.xattrs(&p).map_err(|e| format!("EAs {path}: {e}"))?;
                    source.acl(&p).map_err(|e| format!("acl {path}: {e}"))?;
                    source
                        .streams(&p)
                        .map_err(|e| format!("streams {path}: {e}"))?;
                }
                Ok(0)
            })?;
            let m = m.stop();
            let extra = stats_delta(after_list, source.stats());
            report(args, "metadata", files.len(), 0, m, &extra);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// smb2

struct Smb2Conn {
    /// The connection's own runtime (`--per-thread-runtime`), else the shared one drives it.
    rt: Option<Arc<tokio::runtime::Runtime>>,
    client: SmbClient,
    tree: Tree,
    /// Standalone CLOSEs sent after a compound's own CLOSE failed.
    extra_closes: u64,
}

fn runtime(workers: usize) -> Result<tokio::runtime::Runtime, String> {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    if workers > 0 {
        b.worker_threads(workers);
    }
    b.enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))
}

async fn smb2_connect(args: &Args) -> Result<Smb2Conn, String> {
    let config = ClientConfig {
        addr: format!("{}:{}", args.host, args.port),
        timeout: Duration::from_secs(15),
        username: args.user.clone(),
        password: args.password.clone(),
        compression: false,
        dfs_enabled: false,
        ..Default::default()
    };
    let mut client = SmbClient::connect(config)
        .await
        .map_err(|e| format!("smb2 connect: {e}"))?;
    let tree = client
        .connect_share(&args.share)
        .await
        .map_err(|e| format!("smb2 tree connect: {e}"))?;
    Ok(Smb2Conn {
        rt: None,
        client,
        tree,
        extra_closes: 0,
    })
}

/// Every file under `dir`, with its size.
async fn smb2_files(conn: &mut Smb2Conn, dir: &str) -> Result<Vec<(String, u64)>, String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_string()];
    while let Some(d) = dirs.pop() {
        let entries = conn
            .client
            .list_directory(&mut conn.tree, &d)
            .await
            .map_err(|e| format!("smb2 list {d}: {e}"))?;
        for e in entries
            .into_iter()
            .filter(|e| e.name != "." && e.name != "..")
        {
            let name = format!("{d}/{}", e.name);
            if e.is_directory {
                dirs.push(name);
            } else {
                out.push((name, e.size));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Requests and compound chains sent so far on this connection.
fn smb2_counts(conns: &[Smb2Conn]) -> (u64, u64) {
    conns.iter().fold((0, 0), |(r, c), x| {
        let m = x.client.diagnostics().primary.metrics;
        (r + m.requests_sent, c + m.compound_requests_sent)
    })
}

fn smb2_conns(
    rt: &tokio::runtime::Runtime,
    args: &Args,
) -> Result<(Vec<Smb2Conn>, String), String> {
    let mut conns = Vec::new();
    for _ in 0..args.threads {
        if args.per_thread_runtime {
            let own = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("tokio runtime: {e}"))?;
            let mut conn = own.block_on(smb2_connect(args))?;
            conn.rt = Some(Arc::new(own));
            conns.push(conn);
        } else {
            conns.push(rt.block_on(smb2_connect(args))?);
        }
    }
    let d = conns[0].client.diagnostics().primary;
    let about = format!(
        "dialect={:?} signing={:?} max_read={}",
        d.negotiated.as_ref().map(|n| n.dialect),
        d.signing.algorithm,
        d.negotiated.as_ref().map(|n| n.max_read_size).unwrap_or(0)
    );
    Ok((conns, about))
}

/// Runs `f` to completion on the connection's own runtime if it has one, else on the
/// shared runtime, from the calling (plain) thread.
fn drive<F: std::future::Future>(
    own: Option<Arc<tokio::runtime::Runtime>>,
    shared: &tokio::runtime::Handle,
    f: F,
) -> F::Output {
    match own {
        Some(rt) => rt.block_on(f),
        None => shared.block_on(f),
    }
}

fn run_smb2(args: &Args) -> Result<(), String> {
    let data_dir = data_dir(args);
    let files = match data_dir {
        Some(dir) => data_files(args, dir)?,
        None => Vec::new(),
    };
    let rt = runtime(args.workers)?;
    let handle = rt.handle().clone();
    let (conns, about) = smb2_conns(&rt, args)?;
    eprintln!("smb2: {about}");
    match data_dir {
        Some(_) => {
            let before = smb2_counts(&conns);
            let m = Meter::start(args);
            let states = conns.into_iter().map(|c| (c, vec![0u8; UNIT])).collect();
            let (bytes, conns) = on_threads(states, |(conn, buf), next| {
                let mut done = 0u64;
                while let Some((path, size)) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let own = conn.rt.clone();
                    let read =
                        smb2_read_file(conn, path, *size, buf, args.piece, !args.no_compound);
                    done += drive(own, &handle, read)?;
                }
                Ok(done)
            })?;
            let m = m.stop();
            let conns: Vec<Smb2Conn> = conns.into_iter().map(|(c, _)| c).collect();
            let after = smb2_counts(&conns);
            let extra = format!(
                "piece={} no_compound={} requests={} compounds={} {about}",
                args.piece,
                args.no_compound,
                after.0 - before.0,
                after.1 - before.1
            );
            report(args, "data", files.len(), bytes, m, &extra);
        }
        _ => {
            let dirs = small_dirs(20);
            let before = smb2_counts(&conns);
            let m = Meter::start(args);
            let states = conns.into_iter().map(|c| (c, Vec::new())).collect();
            let (_, lists) = on_threads(states, |(conn, found), next| {
                while let Some(d) = dirs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let own = conn.rt.clone();
                    let entries =
                        drive(own, &handle, conn.client.list_directory(&mut conn.tree, d))
                            .map_err(|e| format!("smb2 list {d}: {e}"))?;
                    // smb2 returns "." and ".." too.
                    for e in entries
                        .into_iter()
                        .filter(|e| e.name != "." && e.name != "..")
                    {
                        found.push(format!("{d}/{}", e.name));
                    }
                }
                Ok(0)
            })?;
            let listed = m.stop();
            let mut conns = Vec::new();
            let mut files = Vec::new();
            for (c, f) in lists {
                conns.push(c);
                files.extend(f);
            }
            let after_list = smb2_counts(&conns);
            let extra = format!(
                "requests={} compounds={}",
                after_list.0 - before.0,
                after_list.1 - before.1
            );
            report(args, "list", dirs.len(), 0, listed, &extra);
            let m = Meter::start(args);
            let (_, conns) = on_threads(conns, |conn, next| {
                while let Some(path) = files.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let own = conn.rt.clone();
                    drive(own, &handle, smb2_metadata(conn, path))?;
                }
                Ok(0)
            })?;
            let m = m.stop();
            let after = smb2_counts(&conns);
            let extra_closes: u64 = conns.iter().map(|c| c.extra_closes).sum();
            let extra = format!(
                "requests={} compounds={} extra_closes={extra_closes}",
                after.0 - after_list.0,
                after.1 - after_list.1
            );
            report(args, "metadata", files.len(), 0, m, &extra);
        }
    }
    Ok(())
}

/// Reads the whole file in 10 MiB units into `buf`, the way a port would: a file that
/// fits one READ is CREATE+READ+CLOSE in one compound; a larger one is opened once and
/// each unit read as `piece`-sized READs all in flight at once.
async fn smb2_read_file(
    conn: &mut Smb2Conn,
    path: &str,
    size: u64,
    buf: &mut [u8],
    piece: usize,
    compound: bool,
) -> Result<u64, String> {
    let max_read = conn
        .client
        .connection()
        .params()
        .map(|p| p.max_read_size as u64)
        .unwrap_or(65536);
    if compound && size <= max_read.min(buf.len() as u64) {
        let (data, _info) = conn
            .tree
            .read_file_compound_sized_with_info(conn.client.connection_mut(), path, size.max(1))
            .await
            .map_err(|e| format!("smb2 compound read {path}: {e}"))?;
        buf[..data.len()].copy_from_slice(&data);
        return Ok(data.len() as u64);
    }
    let reader = Arc::new(
        conn.client
            .open_file_reader(&conn.tree, path)
            .await
            .map_err(|e| format!("smb2 open {path}: {e}"))?,
    );
    let mut off = 0u64;
    while off < size {
        let unit = (size - off).min(buf.len() as u64) as usize;
        let mut tasks = tokio::task::JoinSet::new();
        for start in (0..unit).step_by(piece) {
            let len = piece.min(unit - start);
            let r = Arc::clone(&reader);
            let at = off + start as u64;
            tasks.spawn(async move { (start, r.read_at(at, len as u64).await) });
        }
        let mut got = 0;
        while let Some(joined) = tasks.join_next().await {
            let (start, data) = joined.map_err(|e| format!("read task: {e}"))?;
            let data = data.map_err(|e| format!("smb2 read {path}: {e}"))?;
            buf[start..start + data.len()].copy_from_slice(&data);
            got += data.len();
        }
        if got != unit {
            return Err(format!("{path}: short read at {off}: {got} of {unit}"));
        }
        off += unit as u64;
    }
    let reader = Arc::into_inner(reader).ok_or("reader still shared")?;
    reader
        .close()
        .await
        .map_err(|e| format!("smb2 close {path}: {e}"))?;
    Ok(off)
}

/// What kaiso needs about one file, as one compound.
#[derive(Debug, PartialEq)]
struct Smb2Meta {
    size: u64,
    nlink: u32,
    file_id: u64,
    mtime: u64,
    ea_size: u32,
    security_descriptor: Vec<u8>,
    eas: Vec<(Vec<u8>, Vec<u8>)>,
    streams: Vec<(String, u64)>,
}

fn query(info_type: InfoType, class: u8, additional: u32, flags: u8) -> QueryInfoRequest {
    QueryInfoRequest {
        info_type,
        file_info_class: class,
        output_buffer_length: QUERY_BUFFER,
        additional_information: additional,
        flags: flags as u32,
        file_id: FileId::SENTINEL,
        input_buffer: vec![],
    }
}

/// CREATE, QUERY_INFO FileAllInformation, security (owner, group, DACL), streams, EAs,
/// CLOSE: one round trip. The EA query goes last before the CLOSE: a file without EAs
/// answers it with an error status, which must not cost the answers before it.
async fn smb2_metadata(conn: &mut Smb2Conn, path: &str) -> Result<Smb2Meta, String> {
    let create = CreateRequest {
        requested_oplock_level: OplockLevel::None,
        impersonation_level: ImpersonationLevel::Impersonation,
        desired_access: FileAccessMask::new(
            FileAccessMask::FILE_READ_ATTRIBUTES
                | FileAccessMask::FILE_READ_EA
                | FileAccessMask::READ_CONTROL
                | FileAccessMask::SYNCHRONIZE,
        ),
        file_attributes: 0,
        share_access: ShareAccess(
            ShareAccess::FILE_SHARE_READ
                | ShareAccess::FILE_SHARE_WRITE
                | ShareAccess::FILE_SHARE_DELETE,
        ),
        create_disposition: CreateDisposition::FileOpen,
        create_options: 0,
        name: smb2::encode_path(path),
        create_contexts: vec![],
    };
    let all = query(InfoType::File, FILE_ALL_INFORMATION, 0, 0);
    let security = query(InfoType::Security, 0, OWNER_GROUP_DACL, 0);
    let streams = query(InfoType::File, FILE_STREAM_INFORMATION, 0, 0);
    let eas = query(InfoType::File, FILE_FULL_EA_INFORMATION, 0, SL_RESTART_SCAN);
    let close = CloseRequest {
        flags: 0,
        file_id: FileId::SENTINEL,
    };
    let tree_id = Some(conn.tree.tree_id);
    let op = |command, body| CompoundOp {
        command,
        body,
        tree_id,
        credit_charge: CreditCharge(1),
    };
    let ops = [
        op(Command::Create, &create),
        op(Command::QueryInfo, &all),
        op(Command::QueryInfo, &security),
        op(Command::QueryInfo, &streams),
        op(Command::QueryInfo, &eas),
        op(Command::Close, &close),
    ];
    let frames = conn
        .client
        .connection()
        .execute_compound(&ops)
        .await
        .map_err(|e| format!("smb2 compound {path}: {e}"))?;
    let frames: Vec<Frame> = frames
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("smb2 compound {path}: {e}"))?;
    let status = |i: usize| frames[i].header.status;
    if status(0) != NtStatus::SUCCESS {
        return Err(format!("{path}: CREATE {:?}", status(0)));
    }
    if status(5) != NtStatus::SUCCESS {
        let created = CreateResponse::unpack(&mut ReadCursor::new(&frames[0].body))
            .map_err(|e| format!("{path}: CREATE reply: {e}"))?;
        conn.extra_closes += 1;
        conn.tree
            .close_handle(conn.client.connection_mut(), created.file_id)
            .await
            .map_err(|e| format!("{path}: close: {e}"))?;
    }
    let buffer = |i: usize, what: &str| -> Result<Vec<u8>, String> {
        if status(i) != NtStatus::SUCCESS {
            return Err(format!("{path}: {what} {:?}", status(i)));
        }
        QueryInfoResponse::unpack(&mut ReadCursor::new(&frames[i].body))
            .map(|r| r.output_buffer)
            .map_err(|e| format!("{path}: {what} reply: {e}"))
    };
    let all = buffer(1, "FileAllInformation")?;
    if all.len() < 76 {
        return Err(format!("{path}: FileAllInformation of {} bytes", all.len()));
    }
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
    // Basic (40 bytes), Standard (24), Internal (8), Ea (4), ... (MS-FSCC 2.4.2).
    let ea_size = u32_at(&all, 72);
    let eas = if ea_size > 0 {
        parse_eas(&buffer(4, "EAs")?)
    } else {
        Vec::new()
    };
    Ok(Smb2Meta {
        mtime: u64_at(&all, 16),
        size: u64_at(&all, 48),
        nlink: u32_at(&all, 56),
        file_id: u64_at(&all, 64),
        ea_size,
        security_descriptor: buffer(2, "security")?,
        eas,
        streams: parse_streams(&buffer(3, "streams")?),
    })
}

/// FILE_FULL_EA_INFORMATION entries (MS-FSCC 2.4.15).
fn parse_eas(b: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 8 <= b.len() {
        let next = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let name_len = b[at + 5] as usize;
        let value_len = u16::from_le_bytes([b[at + 6], b[at + 7]]) as usize;
        let name_at = at + 8;
        let value_at = name_at + name_len + 1;
        if value_at + value_len > b.len() {
            break;
        }
        out.push((
            b[name_at..name_at + name_len].to_vec(),
            b[value_at..value_at + value_len].to_vec(),
        ));
        if next == 0 {
            break;
        }
        at += next;
    }
    out
}

/// FILE_STREAM_INFORMATION entries (MS-FSCC 2.4.43): name and size.
fn parse_streams(b: &[u8]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 24 <= b.len() {
        let next = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let name_len = u32::from_le_bytes(b[at + 4..at + 8].try_into().unwrap()) as usize;
        let size = u64::from_le_bytes(b[at + 8..at + 16].try_into().unwrap());
        if at + 24 + name_len > b.len() {
            break;
        }
        let units: Vec<u16> = b[at + 24..at + 24 + name_len]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        out.push((String::from_utf16_lossy(&units), size));
        if next == 0 {
            break;
        }
        at += next;
    }
    out
}

// ---------------------------------------------------------------------------------------
// Same answers from both clients

/// For every file of the metadata tree, compares what the smb2 compound returns with
/// what kaiso's source returns: size, link count, file id, security descriptor, EAs and
/// named streams.
fn verify(args: &Args) -> Result<(), String> {
    let source = kaiso_connect(args)?;
    let rt = runtime(args.workers)?;
    let mut conn = rt.block_on(smb2_connect(args))?;
    let (mut checked, mut with_eas, mut with_streams) = (0, 0, 0);
    for d in small_dirs(20) {
        let p = SourcePath::parse(d.as_bytes()).map_err(|e| e.to_string())?;
        for e in source.read_dir(&p).map_err(|e| format!("list {d}: {e}"))? {
            let path = format!("{d}/{}", String::from_utf8_lossy(&e.name));
            let sp = SourcePath::parse(path.as_bytes()).map_err(|e| e.to_string())?;
            let attr = source.stat(&sp).map_err(|e| format!("stat {path}: {e}"))?;
            let acl = source.acl(&sp).map_err(|e| format!("acl {path}: {e}"))?;
            let xattrs = source.xattrs(&sp).map_err(|e| format!("EAs {path}: {e}"))?;
            let streams = source
                .streams(&sp)
                .map_err(|e| format!("streams {path}: {e}"))?;
            let m = rt.block_on(smb2_metadata(&mut conn, &path))?;
            let mismatch = |what: &str| Err(format!("{path}: {what} differs: smb2 {m:?}"));
            if (m.size, m.nlink, m.file_id) != (attr.size, attr.nlink, attr.ino) {
                return mismatch(&format!("size/nlink/id (kaiso {attr:?})"));
            }
            if acl.nt_security_descriptor.as_deref() != Some(&m.security_descriptor[..]) {
                return mismatch("security descriptor");
            }
            let kaiso_eas: Vec<(Vec<u8>, Vec<u8>)> = xattrs
                .into_iter()
                .map(|(n, v)| (n.strip_prefix(b"user.").unwrap_or(&n).to_vec(), v))
                .collect();
            if kaiso_eas != m.eas {
                return mismatch(&format!("EAs (kaiso {kaiso_eas:?})"));
            }
            // kaiso lists named streams only; smb2 sees "::$DATA" too.
            let named: Vec<(String, u64)> = m
                .streams
                .iter()
                .filter(|(n, _)| n != "::$DATA")
                .map(|(n, s)| {
                    (
                        n.trim_start_matches(':').trim_end_matches(":$DATA").into(),
                        *s,
                    )
                })
                .collect();
            let kaiso_streams: Vec<(String, u64)> =
                streams.into_iter().map(|s| (s.name, s.size)).collect();
            if named != kaiso_streams {
                return mismatch(&format!("streams (kaiso {kaiso_streams:?})"));
            }
            checked += 1;
            with_eas += usize::from(!m.eas.is_empty());
            with_streams += usize::from(!named.is_empty());
        }
    }
    println!(
        "verify: {checked} files agree (size, nlink, file id, security descriptor, EAs, \
         streams); {with_eas} with EAs, {with_streams} with named streams; extra_closes={}",
        conn.extra_closes
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Delay proxy

/// Forwards every connection to `127.0.0.1:proxy_to`, each direction `delay_ms` late (a
/// long pipe: bytes are queued with their due time, so throughput is not stop-and-wait).
fn run_proxy(args: &Args) -> Result<(), String> {
    use std::io::Write;
    let upstream = args.proxy_to.unwrap_or(445);
    let delay = Duration::from_millis(args.delay_ms);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    println!("proxy_port={port}");
    std::io::stdout().flush().map_err(|e| e.to_string())?;
    for client in listener.incoming() {
        let client = client.map_err(|e| format!("accept: {e}"))?;
        let server = std::net::TcpStream::connect(("127.0.0.1", upstream))
            .map_err(|e| format!("connect to {upstream}: {e}"))?;
        for s in [&client, &server] {
            s.set_nodelay(true).map_err(|e| e.to_string())?;
        }
        let clone = |s: &std::net::TcpStream| s.try_clone().map_err(|e| e.to_string());
        delayed_pipe(clone(&client)?, clone(&server)?, delay);
        delayed_pipe(server, client, delay);
    }
    Ok(())
}

/// One direction: a reader thread stamps each chunk with its due time, a writer thread
/// sends it then. The writer half-closes its side once the reader saw the end.
fn delayed_pipe(mut from: std::net::TcpStream, mut to: std::net::TcpStream, delay: Duration) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 << 10];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0
                || tx
                    .send((Instant::now() + delay, buf[..n].to_vec()))
                    .is_err()
            {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        for (due, data) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to.write_all(&data).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}
