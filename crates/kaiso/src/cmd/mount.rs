//! `kaiso mount`, `kaiso adopt`, `kaiso fsck`.

use anyhow::{Context, bail};
use kaiso_store::{Store, StoreConfig, TierConfig};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(clap::Args)]
pub struct MountArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Where to present the union namespace.
    pub mountpoint: PathBuf,
    /// FUSE worker threads.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Never use kernel passthrough, even when the configuration allows it.
    #[arg(long)]
    pub no_passthrough: bool,
    /// How long the kernel caches attributes and names, in milliseconds (negative entries:
    /// at most 1 s). kaiso is the only writer of its tiers, so this can be long; changes
    /// made directly in a tier directory while mounted show after at most this long.
    #[arg(long, default_value_t = kaiso_fuse::DEFAULT_TTL.as_millis() as u64)]
    pub ttl_ms: u64,
    /// Longest busy-poll of /dev/fuse after a reply, in microseconds (0: never). While
    /// requests come in bursts the worker that reads next polls for the next one instead
    /// of sleeping, which saves a thread wake-up per request; the window adapts to the
    /// gaps between requests and closes when they are sparse, so an idle mount costs
    /// no CPU, and nobody polls while other tasks wait for a CPU
    /// (KAISO_FUSE_POLL_UNDER_LOAD=1 polls anyway). At most 1000: a longer window would
    /// count requests a few milliseconds apart as a burst and keep a CPU spinning between
    /// them.
    #[arg(long, default_value_t = kaiso_fuse::busy_poll::DEFAULT_MAX.as_micros() as u64,
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub busy_poll_us: u64,
}

#[derive(clap::Args)]
pub struct AdoptArgs {
    /// Existing directory to take in place as a tier (nothing is copied).
    pub dir: PathBuf,
    /// Configuration to create, or to extend with DIR as its slowest tier.
    #[arg(long)]
    pub config: PathBuf,
    /// Tier name for DIR (default: its directory name).
    #[arg(long)]
    pub name: Option<String>,
    /// Capacity of DIR's tier (default: the size of its file system).
    #[arg(long)]
    pub capacity: Option<String>,
    /// State directory for a new configuration (default: next to the config, `<stem>.state`).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Faster tiers to put in front of DIR in a new configuration: NAME=PATH:SIZE (repeat).
    #[arg(long = "faster", value_name = "NAME=PATH:SIZE")]
    pub faster: Vec<String>,
}

#[derive(clap::Args)]
pub struct FsckArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

static SIGNALLED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SIGNALLED.store(true, Ordering::SeqCst);
}

/// Catch SIGINT/SIGTERM/SIGHUP so the caller can clean up; returns the "signalled" flag.
pub(crate) fn catch_signals() -> &'static AtomicBool {
    let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGHUP, handler);
    }
    &SIGNALLED
}

pub(crate) fn load_config(p: &Path) -> anyhow::Result<StoreConfig> {
    Ok(StoreConfig::from_toml_file(p)?)
}

pub fn mount(a: MountArgs) -> anyhow::Result<()> {
    let cfg = load_config(&a.config)?;
    super::migrate::refuse_if_migrating(
        &cfg.state_dir,
        &a.config,
        &format!("--mount {}", a.mountpoint.display()),
    )?;
    kaiso_fuse::preflight(&a.mountpoint)?;
    // kaiso sets every mode explicitly; the process umask must not interfere.
    unsafe { libc::umask(0) };
    let store = Store::open(cfg)?;
    let _background = store.start_background();
    let sock =
        kaiso_store::control::serve(store.clone()).context("cannot start the control socket")?;
    if let Some(addr) = &store.config().metrics {
        let bound = kaiso_store::metrics::serve(store.clone(), addr)
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        eprintln!("kaiso: metrics on http://{bound}/metrics");
    }
    // Every option is listed (no `..default()`): a new one must be given its flag here.
    let opts = kaiso_fuse::MountOptions {
        allow_other: store.config().allow_other,
        threads: a.threads,
        passthrough: !a.no_passthrough,
        ttl: Duration::from_millis(a.ttl_ms),
        busy_poll: kaiso_fuse::BusyPoll {
            max: Duration::from_micros(a.busy_poll_us),
            ..Default::default()
        },
    };
    let signalled = catch_signals();
    let mounted = kaiso_fuse::mount(store.clone(), &a.mountpoint, &opts)?;
    println!(
        "kaiso: mounted {} on {}",
        a.config.display(),
        a.mountpoint.display()
    );
    tracing::info!(mountpoint = %a.mountpoint.display(), socket = %sock.display(), "mounted");
    while !signalled.load(Ordering::SeqCst) && !mounted.finished() {
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = mounted.unmount();
    store.shutdown();
    let _ = std::fs::remove_file(&sock);
    r.context("unmount")?;
    eprintln!("kaiso: unmounted {}", a.mountpoint.display());
    Ok(())
}

fn fs_size(p: &Path) -> anyhow::Result<u64> {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes())?;
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        bail!(
            "cannot statfs {}: {}",
            p.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(sv.f_blocks * sv.f_frsize)
}

fn tier_for(name: &str, path: &Path, capacity: Option<&str>) -> anyhow::Result<TierConfig> {
    let path =
        std::fs::canonicalize(path).with_context(|| format!("tier {name}: {}", path.display()))?;
    let capacity = match capacity {
        Some(c) => kaiso_store::config::parse_size_str(c)
            .map_err(|e| anyhow::anyhow!("tier {name}: capacity: {e}"))?,
        None => fs_size(&path)?,
    };
    Ok(TierConfig {
        name: name.into(),
        path,
        capacity,
        high_watermark: 0.9,
        low_watermark: 0.7,
        device: None,
    })
}

pub fn adopt(a: AdoptArgs) -> anyhow::Result<()> {
    if !a.dir.is_dir() {
        bail!("{} is not a directory", a.dir.display());
    }
    let name = a.name.clone().unwrap_or_else(|| {
        a.dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "adopted".into())
    });
    let tier = tier_for(&name, &a.dir, a.capacity.as_deref())?;
    let mut cfg = if a.config.exists() {
        if !a.faster.is_empty() || a.state_dir.is_some() {
            bail!(
                "{} exists: --faster/--state-dir only apply when creating a configuration",
                a.config.display()
            );
        }
        load_config(&a.config)?
    } else {
        let stem = a
            .config
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kaiso".into());
        let base = a
            .config
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let state_dir = a
            .state_dir
            .clone()
            .unwrap_or_else(|| base.join(format!("{stem}.state")));
        std::fs::create_dir_all(&state_dir)
            .with_context(|| format!("state directory {}", state_dir.display()))?;
        let mut cfg = StoreConfig::from_toml_str(
            &format!(
                "[store]\nstate_dir = {:?}\n[[tier]]\nname = \"x\"\npath = \"/\"\ncapacity = 1\n",
                std::fs::canonicalize(&state_dir)?.display().to_string()
            ),
            "adopt",
        )?;
        cfg.tiers.clear();
        for f in &a.faster {
            let (n, rest) = f
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--faster {f:?}: expected NAME=PATH:SIZE"))?;
            let (p, size) = rest
                .rsplit_once(':')
                .ok_or_else(|| anyhow::anyhow!("--faster {f:?}: expected NAME=PATH:SIZE"))?;
            std::fs::create_dir_all(p).with_context(|| format!("tier {n}: {p}"))?;
            cfg.tiers.push(tier_for(n, Path::new(p), Some(size))?);
        }
        cfg
    };
    if cfg
        .tiers
        .iter()
        .any(|t| t.path == tier.path || t.name == tier.name)
    {
        bail!(
            "{} (tier {}) is already a tier of {}",
            tier.path.display(),
            tier.name,
            a.config.display()
        );
    }
    cfg.tiers.push(tier);
    // Validate by round-tripping through the parser before writing anything.
    let text = cfg.to_toml();
    StoreConfig::from_toml_str(&text, &a.config.display().to_string())?;
    let tmp = a.config.with_extension("toml.tmp");
    std::fs::write(&tmp, &text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &a.config)?;
    let cfg = load_config(&a.config)?;
    let store = Store::open(cfg)?;
    let report = store.fsck()?;
    store.shutdown();
    println!(
        "kaiso: adopted {} as tier {name} in {} ({} files, {} directories indexed; nothing copied)",
        a.dir.display(),
        a.config.display(),
        report.files_seen,
        report.dirs_seen
    );
    println!(
        "mount it with: kaiso mount {} MOUNTPOINT",
        a.config.display()
    );
    Ok(())
}

pub fn fsck(a: FsckArgs) -> anyhow::Result<()> {
    let cfg = load_config(&a.config)?;
    let report: kaiso_store::FsckReport =
        match kaiso_store::control::Client::connect(&cfg.state_dir) {
            Ok(mut c) => serde_json::from_value(c.call(&kaiso_store::control::Request::Fsck)?)?,
            Err(_) => {
                let store = Store::open(cfg)?;
                let r = store.fsck()?;
                store.shutdown();
                r
            }
        };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("files seen:          {}", report.files_seen);
    println!("directories seen:    {}", report.dirs_seen);
    println!("adopted (new files): {}", report.adopted);
    println!("stale records:       {}", report.dropped);
    println!("conflicts renamed:   {}", report.conflicts);
    println!("journal recovered:   {}", report.journal_recovered);
    println!("temp files removed:  {}", report.temp_removed);
    for (t, u) in &report.used {
        println!("tier {t}: {u} bytes");
    }
    Ok(())
}
