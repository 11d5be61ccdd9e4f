//! `kaiso bench migrate`: post-copy migration from a real old server, in-process
//! (kaiso_store::migrate + kaiso_source), measured in one run against baselines measured
//! in the same run (thesis chapter 2, figures 2.6–2.16).
//!
//! The old servers are nfs-ganesha (FSAL_VFS, NFSv3) and Samba's smbd (SMB 2/3), both
//! started by the benchmark on loopback and sharing the same trees; the network between
//! each and kaiso is emulated by a user-space TCP delay proxy (`--delay-ms` one way,
//! optional `--rate-mbit`). The POSIX source (a local directory, no network) is the
//! last row. Measured:
//! 1. time from start to serving (source connect + store open + migration open + the
//!    first getattr of the share root), for a small and a large tree; with `--face fuse`
//!    / `nfs` also from spawning a real `kaiso migrate start` daemon until its FUSE
//!    mount / NFSv3 face answers (bench_migrate/faces.rs);
//! 2. first open + read after cutover over the depth × width grid (no client timeout),
//!    in-process and through the daemon's faces (open/read on the FUSE mount; LOOKUP
//!    chain + READ over NFSv3 with the JUKEBOX replies counted);
//! 3. total migration time of Table 2.2-shaped datasets against `rsync -aHAX` of the same
//!    tree over the same delayed path (rsync daemon behind the same proxy) and locally;
//! 4. response-time percentiles of a replayed access pattern at 0/25/50/75 % progress for
//!    BFS vs DFS and metadata-first vs bulk.

mod dataset;
mod faces;
mod proxy;
mod response;
mod servers;
mod subtree;
mod timeline;
mod total;

use std::fmt::Write as _;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::scratch_fs::FreshExt4;

use anyhow::{Context, Result, anyhow, bail};
use kaiso_policy::crawl::CrawlOrder;
use kaiso_source::{NfsConfig, NfsSource, PosixSource, SmbConfig, SmbSource};
use kaiso_store::migrate::{CrawlState, Crawler, Migration, MigrationConfig, Migrations, Source};
use kaiso_store::{Ino, ROOT_INO, Store, StoreConfig};

use dataset::{Rng, Shape, TABLE_2_2};
use faces::Face;
use proxy::DelayProxy;
use servers::{Ganesha, RsyncDaemon, Samba};
use subtree::Subtree;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where to create the source trees and destinations (removed at exit).
    #[arg(long, default_value_os_t = std::env::temp_dir())]
    pub dir: PathBuf,
    /// Smaller datasets and a trimmed grid (a few minutes in all).
    #[arg(long)]
    pub quick: bool,
    /// Emulated one-way delay between the old server and kaiso, in milliseconds.
    #[arg(long, default_value_t = 1.0)]
    pub delay_ms: f64,
    /// Emulated link rate per direction and connection, in Mbit/s (default: unlimited).
    #[arg(long)]
    pub rate_mbit: Option<u64>,
    /// Divide Table 2.2's file and directory counts by this [default: 400, quick 2000].
    #[arg(long)]
    pub count_div: Option<u64>,
    /// Divide Table 2.2's mean file sizes by this [default: 1, quick 4].
    #[arg(long)]
    pub size_div: Option<u64>,
    /// Crawler threads (1 = the thesis's single crawler). 8 measured fastest here (see
    /// docs/reproduction/migration.md §3).
    #[arg(long, default_value_t = 8)]
    pub workers: usize,
    /// Source kinds to measure (nfs, smb, posix); default all.
    #[arg(long, value_delimiter = ',')]
    pub sources: Vec<String>,
    /// Table 2.2 datasets to generate and measure (a, b, c); default all.
    #[arg(long, value_delimiter = ',')]
    pub datasets: Vec<String>,
    /// Files in the replayed access pattern [default: 1000, quick 200].
    #[arg(long)]
    pub replay_files: Option<usize>,
    /// Run only these parts (start, grid, total, response); default all.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// After each total-time row, print where kaiso's time went: source calls over time
    /// (listings, reads, idle gaps) and CPU by thread name, also the old server's.
    #[arg(long)]
    pub timeline: bool,
    /// Crawl phasing of the total-time rows: metadata-first (two strict passes),
    /// metadata-priority (data in the gaps of the metadata pass) or bulk.
    #[arg(long, default_value = "metadata-first")]
    pub phasing: String,
    /// Put the total-time rows' destinations (rsync's and kaiso's) in --dir itself instead
    /// of a fresh ext4 file system each (see `scratch_fs` for why fresh is the default).
    #[arg(long)]
    pub shared_fs: bool,
    /// Total-time rows: one crawler thread fetches a file's units one after another, as
    /// before session 9 (by default idle threads fetch other units of a large file).
    #[arg(long)]
    pub no_unit_sharing: bool,
    /// Total-time rows: fetch writes do not start their write-back at once (the fetch
    /// barrier's `syncfs` writes everything back instead); for measuring what early
    /// write-back costs or saves.
    #[arg(long)]
    pub no_early_writeback: bool,
    /// Where the start and grid parts are measured: store (in-process, the store API),
    /// fuse (a real `kaiso migrate start --mount` daemon, open/read on its mount), nfs
    /// (the daemon's NFSv3 face, JUKEBOX after 0.5 s, kaiso's NFS client retrying);
    /// default all three.
    #[arg(long, value_delimiter = ',')]
    pub face: Vec<String>,
}

struct Setup {
    quick: bool,
    delay: Duration,
    rate: Option<u64>,
    workers: usize,
    root: tempfile::TempDir,
    ganesha: Option<Ganesha>,
    /// Proxies in front of ganesha's MOUNT and NFS ports.
    proxies: Option<(DelayProxy, DelayProxy)>,
    samba: Option<Samba>,
    /// The proxy in front of smbd.
    smb_proxy: Option<DelayProxy>,
    /// Whether the POSIX (local) source is measured.
    posix: bool,
    /// `--timeline`: report where each total-time row's time went.
    timeline: bool,
    /// `--phasing`: the crawl order of the total-time rows.
    order: CrawlOrder,
    /// Whether each total-time destination gets a fresh ext4 (not `--shared-fs`, root).
    fresh_fs: bool,
    /// `--no-unit-sharing`: the crawler's threads do not share a large file's units.
    share_units: bool,
    /// `--face`: where the start and grid parts are measured.
    faces: Vec<Face>,
}

impl Setup {
    fn src(&self) -> PathBuf {
        self.root.path().join("src")
    }

    /// A fresh NFSv3 source through the delay proxy, rooted at `sub` of the export.
    fn nfs_source(&self, sub: &str) -> Result<Box<dyn Source>> {
        let (g, (mp, np)) = (
            self.ganesha
                .as_ref()
                .ok_or_else(|| anyhow!("no NFS server"))?,
            self.proxies.as_ref().ok_or_else(|| anyhow!("no proxy"))?,
        );
        let mut c = NfsConfig::new("127.0.0.1", g.pseudo.clone());
        c.mount_port = Some(mp.port);
        c.nfs_port = Some(np.port);
        c.subdir = Some(sub.to_string());
        let s = NfsSource::connect(c).map_err(|e| anyhow!("{e}"))?;
        Ok(Box::new(s))
    }

    /// A fresh SMB session through the delay proxy, rooted at `sub` of the share.
    fn smb_source(&self, sub: &str) -> Result<Box<dyn Source>> {
        let (smb, proxy) = (
            self.samba
                .as_ref()
                .ok_or_else(|| anyhow!("no SMB server"))?,
            self.smb_proxy.as_ref().ok_or_else(|| anyhow!("no proxy"))?,
        );
        let mut c = SmbConfig::new(
            "127.0.0.1",
            smb.share.clone(),
            smb.user.clone(),
            smb.password.clone(),
        );
        c.port = proxy.port;
        let s = SmbSource::connect(c).map_err(|e| anyhow!("{e}"))?;
        Ok(Box::new(
            Subtree::new(Box::new(s), sub).map_err(|e| anyhow!("{e}"))?,
        ))
    }

    fn posix_source(&self, sub: &str) -> Result<Box<dyn Source>> {
        Ok(Box::new(
            PosixSource::open(self.src().join(sub)).map_err(|e| anyhow!("{e}"))?,
        ))
    }

    fn source(&self, kind: SrcKind, sub: &str) -> Result<Box<dyn Source>> {
        match kind {
            SrcKind::Nfs => self.nfs_source(sub),
            SrcKind::Smb => self.smb_source(sub),
            SrcKind::Posix => self.posix_source(sub),
        }
    }

    /// The `kaiso migrate start` source URL (and environment) of `kind` rooted at `sub`;
    /// `None` for SMB with a `sub` (an smb:// URL names a whole share).
    fn daemon_url(&self, kind: SrcKind, sub: &str) -> Option<(String, Vec<(String, String)>)> {
        match kind {
            SrcKind::Nfs => {
                let (g, (mp, np)) = (self.ganesha.as_ref()?, self.proxies.as_ref()?);
                Some((
                    format!(
                        "nfs://127.0.0.1:{}{}?mountport={}&subdir={sub}",
                        np.port, g.pseudo, mp.port
                    ),
                    Vec::new(),
                ))
            }
            SrcKind::Smb => {
                let (smb, proxy) = (self.samba.as_ref()?, self.smb_proxy.as_ref()?);
                sub.is_empty().then(|| {
                    (
                        format!("smb://{}@127.0.0.1:{}/{}", smb.user, proxy.port, smb.share),
                        vec![("KAISO_SMB_PASSWORD".to_string(), smb.password.clone())],
                    )
                })
            }
            SrcKind::Posix => Some((self.src().join(sub).display().to_string(), Vec::new())),
        }
    }

    fn delay_note(&self) -> String {
        let rate = self
            .rate
            .map(|r| format!(", {} Mbit/s", r * 8 / 1_000_000))
            .unwrap_or_default();
        format!(
            "emulated: user-space TCP delay proxy, {:.2} ms each way (RTT +{:.2} ms){rate}",
            self.delay.as_secs_f64() * 1e3,
            self.delay.as_secs_f64() * 2e3
        )
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SrcKind {
    Nfs,
    Smb,
    Posix,
}

impl SrcKind {
    fn label(self) -> &'static str {
        match self {
            SrcKind::Nfs => "NFSv3 (ganesha) via delay proxy",
            SrcKind::Smb => "SMB3 (Samba) via delay proxy",
            SrcKind::Posix => "POSIX dir (local, no network)",
        }
    }
}

/// A fresh destination store (one tier, mover off) in `dir`, on a file system of its own
/// when `fs` is set (unmounted after the store's files are gone: see `Drop`).
struct Dest {
    dir: PathBuf,
    store: Arc<Store>,
    fs: Option<FreshExt4>,
}

impl Dest {
    fn new(dir: PathBuf, fs: Option<FreshExt4>) -> Result<Self> {
        fs::create_dir_all(dir.join("t0"))?;
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"256GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.join("state").display(),
            dir.join("t0").display()
        );
        let store = Store::open(StoreConfig::from_toml_str(&cfg, "bench.toml")?)
            .map_err(|e| anyhow!("open store: {e:?}"))?;
        Ok(Self { dir, store, fs })
    }

    fn attach(&self, source: Box<dyn Source>, cfg: MigrationConfig) -> Result<Arc<Migration>> {
        let m = Migration::open(&self.store, source, cfg).map_err(|e| anyhow!("{e}"))?;
        let all = Migrations::new();
        all.add(m.clone());
        self.store.set_stub_filler(all);
        Ok(m)
    }
}

impl Drop for Dest {
    fn drop(&mut self) {
        self.store.shutdown();
        // Removing the files first drops their dirty pages: the unmount that follows
        // (`self.fs`) then has nothing to write back.
        let _ = fs::remove_dir_all(&self.dir);
        self.fs.take();
    }
}

static DEST_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn fresh_dest(s: &Setup) -> Result<Dest> {
    let n = DEST_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Dest::new(s.root.path().join(format!("dest{n}")), None)
}

/// Like `fresh_dest`, but on a fresh ext4 of its own sized for `bytes` of data, unless
/// `--shared-fs` (or not root).
fn dest_on_own_fs(s: &Setup, bytes: u64) -> Result<Dest> {
    match own_fs(s, "dest", bytes)? {
        Some(f) => {
            let dir = f.path().join("dest");
            Dest::new(dir, Some(f))
        }
        None => fresh_dest(s),
    }
}

/// A fresh ext4 for one destination of `bytes` of data (sparse image in the bench's
/// directory), or `None` with `--shared-fs`.
fn own_fs(s: &Setup, tag: &str, bytes: u64) -> Result<Option<FreshExt4>> {
    if !s.fresh_fs {
        return Ok(None);
    }
    let n = DEST_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let base = s.root.path().join(format!("{tag}{n}"));
    // Room for the data twice over and a store's state; sparse, so only what is written
    // takes disk space.
    let size = (2 * bytes + (1 << 30)).max(4 << 30);
    FreshExt4::new(base.with_extension("ext4"), base, size, None).map(Some)
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1e3)
}

/// Looks up `rel` component by component from the root (what a client's path walk does).
fn resolve(store: &Store, rel: &Path) -> Result<Ino> {
    let mut ino = ROOT_INO;
    for c in rel.iter() {
        let a = store
            .lookup(ino, c)
            .map_err(|e| anyhow!("lookup {}: errno {}", rel.display(), e.errno()))?;
        store.forget(a.ino, 1);
        ino = a.ino;
    }
    Ok(ino)
}

/// Open + read `len` bytes at 0 + close; returns (open time, read time).
fn open_read(store: &Store, rel: &Path, len: u32) -> Result<(Duration, Duration)> {
    let t = Instant::now();
    let ino = resolve(store, rel)?;
    let o = store
        .open_file(ino, libc::O_RDONLY, false)
        .map_err(|e| anyhow!("open {}: errno {}", rel.display(), e.errno()))?;
    let opened = t.elapsed();
    let t = Instant::now();
    let r = store.read(o.fh, 0, len);
    let read = t.elapsed();
    let _ = store.release(o.fh);
    r.map_err(|e| anyhow!("read {}: errno {}", rel.display(), e.errno()))?;
    Ok((opened, read))
}

pub fn run(args: Args) -> Result<()> {
    let quick = args.quick;
    let want = |part: &str| args.only.is_empty() || args.only.iter().any(|p| p == part);
    for p in &args.only {
        if !["start", "grid", "total", "response"].contains(&p.as_str()) {
            bail!("--only: unknown part {p:?} (start, grid, total, response)");
        }
    }
    for k in &args.sources {
        if !["nfs", "smb", "posix"].contains(&k.as_str()) {
            bail!("--sources: unknown source {k:?} (nfs, smb, posix)");
        }
    }
    for d in &args.datasets {
        if !TABLE_2_2.iter().any(|s| s.name == d.as_str()) {
            bail!("--datasets: unknown dataset {d:?} (a, b, c)");
        }
    }
    let source_wanted = |k: &str| args.sources.is_empty() || args.sources.iter().any(|s| s == k);
    let mut faces = Vec::new();
    for f in &args.face {
        match Face::parse(f) {
            Some(f) if !faces.contains(&f) => faces.push(f),
            Some(_) => {}
            None => bail!("--face: unknown face {f:?} (store, fuse, nfs)"),
        }
    }
    if faces.is_empty() {
        faces = Face::ALL.to_vec();
    }
    if faces.contains(&Face::Fuse) && !Path::new("/dev/fuse").exists() {
        println!("FUSE rows skipped: no /dev/fuse");
        faces.retain(|f| *f != Face::Fuse);
    }
    servers::install_signal_cleanup();
    if !(args.delay_ms >= 0.0 && args.delay_ms < 10_000.0) || args.workers == 0 {
        bail!("--delay-ms must be in [0, 10000) and --workers > 0");
    }
    let root = tempfile::Builder::new()
        .prefix("kaiso-bench-migrate-")
        .tempdir_in(&args.dir)
        .with_context(|| format!("temp dir in {}", args.dir.display()))?;
    fs::create_dir_all(root.path().join("src"))?;
    let mut s = Setup {
        quick,
        delay: Duration::from_secs_f64(args.delay_ms / 1e3),
        rate: args.rate_mbit.map(|m| m * 1_000_000 / 8),
        workers: args.workers,
        root,
        ganesha: None,
        proxies: None,
        samba: None,
        smb_proxy: None,
        posix: source_wanted("posix"),
        timeline: args.timeline,
        order: CrawlOrder::parse("bfs", &args.phasing).map_err(|e| anyhow!("--phasing: {e}"))?,
        fresh_fs: !args.shared_fs && unsafe { libc::geteuid() } == 0,
        share_units: !args.no_unit_sharing,
        faces,
    };
    if args.no_early_writeback {
        kaiso_store::stub::set_early_writeback(false);
    }
    let count_div = args
        .count_div
        .unwrap_or(if quick { 2000 } else { 400 })
        .max(1);
    let size_div = args.size_div.unwrap_or(if quick { 4 } else { 1 }).max(1);
    let replay_files = args.replay_files.unwrap_or(if quick { 200 } else { 1000 });

    // Generate every tree first (ganesha exports the whole directory).
    println!(
        "kaiso bench migrate ({})",
        if quick { "quick" } else { "full" }
    );
    let grid = grid_points(quick);
    let t = Instant::now();
    let mut grid_targets = Vec::new();
    if want("grid") || want("start") {
        for &(d, w) in &grid {
            let sub = format!("grid/d{d}_w{w}");
            let target = dataset::grid_tree(&s.src().join(&sub), d, w, 16 << 20)?;
            grid_targets.push((d, w, sub, target));
        }
    }
    let mut datasets = Vec::new();
    if want("total") || want("start") {
        for (i, shape) in TABLE_2_2.iter().enumerate() {
            if !args.datasets.is_empty() && !args.datasets.iter().any(|d| d == shape.name) {
                continue;
            }
            let sc = shape.scaled(count_div, size_div);
            let sub = format!("table22_{}", sc.name);
            let g = dataset::generate(&s.src().join(&sub), &sc, 100 + i as u64)?;
            datasets.push((sc, sub, g));
        }
    }
    // The response-time dataset: shaped like (b) (the thesis used (b)), sizes / 16.
    let resp = if want("response") {
        let sc = TABLE_2_2[1].scaled((count_div / 4).max(1), size_div * 16);
        let sub = "response_b".to_string();
        let g = dataset::generate(&s.src().join(&sub), &sc, 200)?;
        Some((sc, sub, g))
    } else {
        None
    };
    println!(
        "generated the source trees in {:.1} s under {}",
        t.elapsed().as_secs_f64(),
        s.src().display()
    );

    if source_wanted("nfs") {
        match Ganesha::start(&s.src()) {
            Ok(g) => {
                let up = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
                let mp = DelayProxy::start(up(g.mount_port), s.delay, s.rate)?;
                let np = DelayProxy::start(up(g.nfs_port), s.delay, s.rate)?;
                s.proxies = Some((mp, np));
                s.ganesha = Some(g);
            }
            Err(e) => println!("NFS rows skipped: {e:#}"),
        }
    }
    if source_wanted("smb") {
        match Samba::start(&s.src()) {
            Ok(smb) => {
                let up = SocketAddr::from(([127, 0, 0, 1], smb.port));
                s.smb_proxy = Some(DelayProxy::start(up, s.delay, s.rate)?);
                s.samba = Some(smb);
            }
            Err(e) => println!("SMB rows skipped: {e:#}"),
        }
    }
    println!("network: {}", s.delay_note());
    let mut report = String::new();

    if want("start") {
        report += &bench_start(&s, &grid_targets, &datasets)?;
    }
    if want("grid") {
        report += &bench_grid(&s, &grid_targets)?;
    }
    if want("total") {
        report += &total::bench_total(&s, &datasets, count_div, size_div)?;
    }
    if let Some((sc, sub, g)) = &resp {
        report += &response::bench_response(&s, sc, sub, g, replay_files)?;
    }
    println!("\n{report}");
    Ok(())
}

fn grid_points(quick: bool) -> Vec<(usize, usize)> {
    let (depths, widths): (&[usize], &[usize]) = if quick {
        (&[1, 2, 4, 8, 16], &[10, 100])
    } else {
        (&[1, 2, 4, 8, 12, 16], &[10, 100, 1000])
    };
    let mut v = Vec::new();
    for &w in widths {
        for &d in depths {
            v.push((d, w));
        }
    }
    v
}

fn kinds(s: &Setup) -> Vec<SrcKind> {
    let mut k = Vec::new();
    if s.ganesha.is_some() {
        k.push(SrcKind::Nfs);
    }
    if s.samba.is_some() {
        k.push(SrcKind::Smb);
    }
    if s.posix {
        k.push(SrcKind::Posix);
    }
    k
}

/// Part 1, start to serving: connect, open the store and the migration, answer
/// getattr(root); through the faces: spawn `kaiso migrate start` until the face answers.
fn bench_start(
    s: &Setup,
    grid: &[(usize, usize, String, PathBuf)],
    datasets: &[(Shape, String, dataset::Generated)],
) -> Result<String> {
    let mut out = String::from(
        "## 1. Time from start to serving\n\n\
         | source | tree | objects in tree | face | start → serving (ms) | + first listing of the root (ms) | daemon's own \"serving after\" (ms) |\n|---|---|---|---|---|---|---|\n",
    );
    let mut trees: Vec<(String, String, u64)> = Vec::new();
    if let Some((_, _, sub, _)) = grid.iter().find(|g| g.0 == 1 && g.1 == 10) {
        trees.push(("small (grid d1 w10)".into(), sub.clone(), 10));
    }
    if let Some((sc, sub, g)) = datasets.iter().max_by_key(|d| d.2.files) {
        trees.push((
            format!("large (Table 2.2 ({}) scaled)", sc.name),
            sub.clone(),
            g.files + g.dirs,
        ));
    }
    let mut smb_whole_share = false;
    for kind in kinds(s) {
        for face in s.faces.iter().copied() {
            let mut whole_share_done = false;
            for (label, sub, objects) in &trees {
                // The daemon's source URL; smb:// names a whole share, so the SMB daemon
                // rows serve all of it (only its root is looked at, as for the other
                // trees): one row for it.
                let mut label = label.clone();
                let mut objects = objects.to_string();
                let daemon = match (face, s.daemon_url(kind, sub)) {
                    (Face::Store, _) => None,
                    (_, Some(u)) => Some(u),
                    (_, None) => {
                        if whole_share_done {
                            continue;
                        }
                        whole_share_done = true;
                        smb_whole_share = true;
                        label = "whole share".into();
                        objects = "(all trees)".into();
                        Some(
                            s.daemon_url(kind, "")
                                .ok_or_else(|| anyhow!("no SMB server"))?,
                        )
                    }
                };
                // The best of 3: (serving, listed, the daemon's own figure).
                let mut best = (Duration::MAX, Duration::MAX, None);
                for _ in 0..3 {
                    let got = if let Some((url, env)) = &daemon {
                        let r = faces::start_through(s.root.path(), url, env, face)
                            .with_context(|| format!("{} via {}", kind.label(), face.label()))?;
                        (r.serving, r.listed, r.daemon_ms)
                    } else {
                        let t = Instant::now();
                        let dest = fresh_dest(s)?;
                        let source = s.source(kind, sub)?;
                        dest.attach(source, MigrationConfig::new("bench"))?;
                        dest.store
                            .getattr(ROOT_INO, None)
                            .map_err(|e| anyhow!("getattr root: {e:?}"))?;
                        let serving = t.elapsed();
                        let h = dest
                            .store
                            .opendir(ROOT_INO)
                            .map_err(|e| anyhow!("opendir: {e:?}"))?;
                        let listed = t.elapsed();
                        let _ = dest.store.releasedir(h);
                        (serving, listed, None)
                    };
                    if got.0 < best.0 {
                        best = got;
                    }
                }
                let _ = writeln!(
                    out,
                    "| {} | {label} | {objects} | {} | {} | {} | {} |",
                    kind.label(),
                    face.label(),
                    ms(best.0),
                    ms(best.1),
                    best.2.map_or("—".to_string(), |m| m.to_string())
                );
                // Each row as soon as it is measured: a later failure keeps it.
                print!(
                    "{}",
                    out.lines()
                        .last()
                        .map_or(String::new(), |l| format!("{l}\n"))
                );
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
        }
    }
    let _ = writeln!(
        out,
        "\nBest of 3. In-process: connect + store open + migration open + getattr of the root. \
         Daemon rows: from spawning `kaiso migrate start --paused` (this binary, a fresh store) \
         until a stat of the FUSE mount point returns the mount's root / MOUNT + an NFSv3 \
         GETATTR of the export root answers (kaiso's NFS client, polling every 1 ms); the \
         daemon's own figure is from its process start to its faces being up. The tree size \
         does not enter: only the root is looked at.{} NFS and SMB rows: {}.\n",
        if smb_whole_share {
            " SMB daemon rows serve the whole share (an smb:// URL has no subdirectory)."
        } else {
            ""
        },
        s.delay_note()
    );
    println!("\n{out}");
    Ok(out)
}

/// 2. First open + read after cutover, depth × width grid.
fn bench_grid(s: &Setup, grid: &[(usize, usize, String, PathBuf)]) -> Result<String> {
    const LEN: usize = 64 << 10;
    let mut out = String::from(
        "## 2. First open + read (64 KiB) after cutover, target file 16 MiB, fetch unit 10 MiB\n\n\
         | source | face | depth | width | open (ms) | read (ms) | open+read (ms) | JUKEBOX replies |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut smb_skipped = false;
    for kind in kinds(s) {
        for face in s.faces.iter().copied() {
            for (d, w, sub, target) in grid {
                if kind == SrcKind::Posix && !(*d == 1 && *w == 10) && *d != 16 {
                    continue;
                }
                let (o, r, jukebox) = if face == Face::Store {
                    let dest = fresh_dest(s)?;
                    let m = dest.attach(s.source(kind, sub)?, MigrationConfig::new("bench"))?;
                    let (o, r) = open_read(&dest.store, target, LEN as u32)?;
                    drop(m);
                    (o, r, None)
                } else {
                    let Some((url, env)) = s.daemon_url(kind, sub) else {
                        smb_skipped = true;
                        continue;
                    };
                    let mut expect = vec![0u8; LEN];
                    std::io::Read::read_exact(
                        &mut fs::File::open(s.src().join(sub).join(target))?,
                        &mut expect,
                    )?;
                    let f =
                        faces::grid_through(s.root.path(), &url, &env, face, target, LEN, &expect)
                            .with_context(|| {
                                format!("d{d} w{w}: {} via {}", kind.label(), face.label())
                            })?;
                    (f.open, f.read, f.jukebox)
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {d} | {w} | {} | {} | {} | {} |",
                    kind.label(),
                    face.label(),
                    ms(o),
                    ms(r),
                    ms(o + r),
                    jukebox.map_or("—".to_string(), |j| j.to_string())
                );
                // Each row as soon as it is measured: a later failure keeps it.
                print!(
                    "{}",
                    out.lines()
                        .last()
                        .map_or(String::new(), |l| format!("{l}\n"))
                );
                let _ = std::io::Write::flush(&mut std::io::stdout());
            }
        }
    }
    let _ = writeln!(
        out,
        "\nNo client timeout applies: in-process access has none, the NFS client's call \
         timeout is one hour and it retries NFS3ERR_JUKEBOX (after 100 ms, doubling up to 5 s; \
         the Linux kernel client waits 5 s each time), the FUSE rows are plain open(2)/read(2). \
         Each point is a fresh cutover (fresh store, fresh source connection; daemon rows: a \
         fresh `kaiso migrate start --paused` process, started before the clock starts). FUSE \
         open = the kernel's LOOKUP chain + OPEN; NFS open = LOOKUP chain + GETATTR, NFS read = \
         ACCESS + READ; the NFS face answers JUKEBOX after its default 0.5 s, and its JUKEBOX \
         replies are the calls the client sent beyond the walk's own. POSIX rows: only depth 1 / \
         width 10 and depth 16.{} NFS and SMB rows: {}.{}\n",
        if smb_skipped {
            " SMB daemon rows: not measured (an smb:// URL names a whole share, not a grid subtree)."
        } else {
            ""
        },
        s.delay_note(),
        if s.quick {
            " Quick mode: depths {1,2,4,8,16} × widths {10,100}."
        } else {
            ""
        }
    );
    println!("\n{out}");
    Ok(out)
}
