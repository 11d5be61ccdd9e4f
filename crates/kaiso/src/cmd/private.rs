//! `kaiso run --private DIR -- PROGRAM` and `kaiso private ls|export|import|fsck POOL`.

use anyhow::{Context, bail};
use kaiso_libfs::{Fs, FsError, Persist, PoolOptions, Report};
use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct RunArgs {
    /// Directory the program sees as its private directory (created empty if missing).
    #[arg(long, value_name = "DIR")]
    private: PathBuf,
    /// Pool file (default: kaiso-<dir>.pool on a DAX file system if one is mounted, else /dev/shm).
    #[arg(long, value_name = "FILE")]
    pool: Option<PathBuf>,
    #[command(flatten)]
    new_pool: NewPoolArgs,
    /// Program to run and its arguments.
    #[arg(
        trailing_var_arg = true,
        required = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    command: Vec<OsString>,
}

#[derive(clap::Args, Clone)]
pub struct NewPoolArgs {
    /// Size of a new pool (K, M, G suffixes).
    #[arg(long, default_value = "4G")]
    pool_size: String,
    /// Block size of a new pool.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Inodes of a new pool (default: one per 16 KiB).
    #[arg(long)]
    inodes: Option<u64>,
    /// Persistence: auto (detected), pmem (cache-line flush + fence), volatile, msync.
    #[arg(long, default_value = "auto")]
    persist: String,
    /// Fault new pool memory in 2 MiB ahead of the allocator with one madvise each, instead
    /// of one page fault per page (a system call in the data path; no gain measured on tmpfs).
    #[arg(long)]
    prefault: bool,
}

#[derive(clap::Subcommand)]
pub enum PrivateCommand {
    /// List a pool's tree (type, mode, size, path).
    Ls {
        pool: PathBuf,
        /// Directory inside the pool to list.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Copy a pool's tree into a normal directory (created; must be empty if it exists).
    Export { pool: PathBuf, dest: PathBuf },
    /// Copy a normal directory tree into a pool (created if missing).
    Import {
        pool: PathBuf,
        src: PathBuf,
        #[command(flatten)]
        new_pool: NewPoolArgs,
    },
    /// Recover a pool (replay its log, collect orphans, repair) and report what was found.
    Fsck { pool: PathBuf },
}

fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 1 << 30),
        Some(b't' | b'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().with_context(|| format!("bad size {s:?}"))?;
    n.checked_mul(mul)
        .with_context(|| format!("size {s:?} overflows"))
}

impl NewPoolArgs {
    fn options(&self) -> anyhow::Result<PoolOptions> {
        let persist = match self.persist.as_str() {
            "auto" => None,
            "pmem" => Some(Persist::Pmem),
            "volatile" => Some(Persist::Volatile),
            "msync" => Some(Persist::Msync),
            other => bail!("--persist must be auto, pmem, volatile or msync, not {other:?}"),
        };
        Ok(PoolOptions {
            size: parse_size(&self.pool_size)?,
            block_size: self.block_size,
            inode_count: self.inodes,
            persist,
            prefault: self.prefault,
        })
    }
}

/// The first mounted file system with the dax option, else /dev/shm.
fn default_pool_dir() -> PathBuf {
    if let Ok(m) = std::fs::read_to_string("/proc/mounts") {
        for line in m.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() >= 4 && f[3].split(',').any(|o| o == "dax" || o == "dax=always") {
                return PathBuf::from(f[1]);
            }
        }
    }
    PathBuf::from("/dev/shm")
}

pub fn default_pool_for(dir: &Path) -> PathBuf {
    let name: String = dir
        .to_string_lossy()
        .trim_matches('/')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    default_pool_dir().join(format!("kaiso-{name}.pool"))
}

/// libkaiso_preload.so: $KAISO_PRELOAD, else next to this executable.
pub fn find_preload() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("KAISO_PRELOAD") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("KAISO_PRELOAD={} does not exist", p.display());
    }
    let exe = std::env::current_exe().context("locate the kaiso executable")?;
    let dir = exe.parent().context("kaiso executable has no directory")?;
    for cand in [
        dir.join("libkaiso_preload.so"),
        dir.join("../libkaiso_preload.so"),
    ] {
        if cand.is_file() {
            return Ok(cand.canonicalize()?);
        }
    }
    bail!(
        "libkaiso_preload.so not found next to {} (build it with `cargo build -p kaiso-preload` in the same profile, or set KAISO_PRELOAD)",
        exe.display()
    )
}

fn report_line(r: &Report) -> String {
    format!(
        "{} files ({} bytes), {} directories, {} symlinks; {} of {} blocks used; log replayed: {}; orphans freed: {}; repairs: {}",
        r.files,
        r.bytes,
        r.dirs,
        r.symlinks,
        r.blocks_used,
        r.blocks_total,
        if r.log_replayed { "yes" } else { "no" },
        r.orphans_freed,
        r.fixes.len()
    )
}

pub fn run_program(a: RunArgs) -> anyhow::Result<()> {
    let preload = find_preload()?;
    if !a.private.exists() {
        std::fs::create_dir_all(&a.private)
            .with_context(|| format!("create {}", a.private.display()))?;
    }
    let dir = a
        .private
        .canonicalize()
        .with_context(|| format!("resolve {}", a.private.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a directory", dir.display());
    }
    if dir == Path::new("/") {
        bail!("the root directory cannot be private");
    }
    if std::fs::read_dir(&dir)?.next().is_some() {
        bail!(
            "{} has files on disk that the private directory would hide; move them into the pool with `kaiso private import POOL {}` and empty it",
            dir.display(),
            dir.display()
        );
    }
    let pool = a.pool.clone().unwrap_or_else(|| default_pool_for(&dir));
    let opts = a.new_pool.options()?;
    // Open once here: creates and formats a new pool, recovers an old one, and reports a
    // busy or invalid pool before the program starts. Dropping it releases the lock.
    let (fs, report) = Fs::open_pool(&pool, &opts, dir.as_os_str().as_bytes())
        .with_context(|| format!("open pool {}", pool.display()))?;
    if report.log_replayed || report.orphans_freed > 0 || !report.clean() {
        eprintln!(
            "kaiso: recovered {}: {}",
            pool.display(),
            report_line(&report)
        );
    }
    let mode = fs.persist_mode();
    drop(fs);
    tracing::info!(pool = %pool.display(), persist = mode.name(), "private directory {}", dir.display());
    let mut preloads = preload.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preloads.push(":");
        preloads.push(old);
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("LD_PRELOAD", preloads)
        .env("KAISO_PRIVATE_DIR", &dir)
        .env("KAISO_POOL", &pool)
        .env("KAISO_POOL_SIZE", opts.size.to_string())
        .env("KAISO_BLOCK_SIZE", opts.block_size.to_string())
        .env_remove("KAISO_INHERIT")
        .env_remove("KAISO_CWD");
    if let Some(n) = opts.inode_count {
        cmd.env("KAISO_INODES", n.to_string());
    }
    if a.new_pool.persist != "auto" {
        cmd.env("KAISO_PERSIST", &a.new_pool.persist);
    }
    if opts.prefault {
        cmd.env("KAISO_PREFAULT", "1");
    }
    let err = cmd.exec();
    bail!("cannot run {}: {err}", a.command[0].to_string_lossy())
}

/// Opens an existing pool with its root at "/".
fn open_existing(pool: &Path) -> anyhow::Result<(Fs, Report)> {
    if !pool.exists() {
        bail!("pool {} does not exist", pool.display());
    }
    let opts = PoolOptions {
        size: 0,
        ..PoolOptions::default()
    };
    Fs::open_pool(pool, &opts, b"/").with_context(|| format!("open pool {}", pool.display()))
}

fn errno_err(e: FsError, what: &[u8]) -> anyhow::Error {
    match e {
        FsError::Errno(x) => anyhow::anyhow!(
            "{}: {}",
            String::from_utf8_lossy(what),
            std::io::Error::from_raw_os_error(x)
        ),
        FsError::Outside(p) => anyhow::anyhow!(
            "{}: link leads outside the pool to {}",
            String::from_utf8_lossy(what),
            String::from_utf8_lossy(&p)
        ),
    }
}

fn join(base: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = base.to_vec();
    if p.last() != Some(&b'/') {
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

/// Visits the pool tree below `dir` depth-first: (path, stat).
fn walk(
    fs: &Fs,
    dir: &[u8],
    f: &mut dyn FnMut(&[u8], &kaiso_libfs::Stat) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let ino = fs.lookup(dir).map_err(|e| errno_err(e, dir))?;
    for e in fs.read_dir(ino).map_err(|e| errno_err(e, dir))?.iter() {
        let p = join(dir, &e.name);
        let st = fs.stat(&p, false).map_err(|e| errno_err(e, &p))?;
        f(&p, &st)?;
        if st.mode & libc::S_IFMT == libc::S_IFDIR {
            walk(fs, &p, f)?;
        }
    }
    Ok(())
}

fn kind_char(mode: u32) -> char {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        _ => '-',
    }
}

pub fn run(c: PrivateCommand) -> anyhow::Result<()> {
    match c {
        PrivateCommand::Ls { pool, path } => {
            let (fs, _) = open_existing(&pool)?;
            walk(&fs, path.as_bytes(), &mut |p, st| {
                let mut line = format!(
                    "{}{:04o} {:>12} {}",
                    kind_char(st.mode),
                    st.mode & 0o7777,
                    st.size,
                    String::from_utf8_lossy(p)
                );
                if st.mode & libc::S_IFMT == libc::S_IFLNK {
                    let t = fs.readlink(p).map_err(|e| errno_err(e, p))?;
                    line.push_str(&format!(" -> {}", String::from_utf8_lossy(&t)));
                }
                println!("{line}");
                Ok(())
            })
        }
        PrivateCommand::Fsck { pool } => {
            let (_, r) = open_existing(&pool)?;
            println!("{}: {}", pool.display(), report_line(&r));
            for f in &r.fixes {
                println!("  repaired: {f}");
            }
            Ok(())
        }
        PrivateCommand::Export { pool, dest } => {
            let (fs, _) = open_existing(&pool)?;
            if dest.exists() && std::fs::read_dir(&dest)?.next().is_some() {
                bail!("{} is not empty", dest.display());
            }
            std::fs::create_dir_all(&dest)?;
            let mut n = 0u64;
            // Hard links stay hard links: later names of an inode link to its first copy.
            let mut first_name: std::collections::HashMap<u64, PathBuf> =
                std::collections::HashMap::new();
            walk(&fs, b"/", &mut |p, st| {
                let out = dest.join(Path::new(std::ffi::OsStr::from_bytes(&p[1..])));
                match st.mode & libc::S_IFMT {
                    libc::S_IFDIR => std::fs::create_dir(&out)?,
                    libc::S_IFLNK => {
                        let t = fs.readlink(p).map_err(|e| errno_err(e, p))?;
                        std::os::unix::fs::symlink(OsString::from_vec(t), &out)?;
                        return Ok(());
                    }
                    _ if st.nlink > 1 && first_name.contains_key(&st.ino) => {
                        std::fs::hard_link(&first_name[&st.ino], &out)
                            .with_context(|| format!("link {}", out.display()))?;
                        return Ok(());
                    }
                    _ => {
                        if st.nlink > 1 {
                            first_name.insert(st.ino, out.clone());
                        }
                        let f = fs.open(p, libc::O_RDONLY, 0).map_err(|e| errno_err(e, p))?;
                        let mut w = std::fs::File::create(&out)
                            .with_context(|| format!("create {}", out.display()))?;
                        let mut buf = vec![0u8; 1 << 20];
                        loop {
                            let k = f
                                .read(&mut buf)
                                .map_err(|e| errno_err(FsError::Errno(e), p))?;
                            if k == 0 {
                                break;
                            }
                            std::io::Write::write_all(&mut w, &buf[..k])?;
                        }
                        n += 1;
                    }
                }
                std::fs::set_permissions(&out, std::fs::Permissions::from_mode(st.mode & 0o7777))?;
                let t = |ns: i64| libc::timespec {
                    tv_sec: ns.div_euclid(1_000_000_000),
                    tv_nsec: ns.rem_euclid(1_000_000_000),
                };
                let times = [t(st.atime_ns), t(st.mtime_ns)];
                let c = std::ffi::CString::new(out.as_os_str().as_bytes())?;
                unsafe {
                    libc::utimensat(
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        times.as_ptr(),
                        libc::AT_SYMLINK_NOFOLLOW,
                    )
                };
                Ok(())
            })?;
            println!("exported {n} files to {}", dest.display());
            Ok(())
        }
        PrivateCommand::Import {
            pool,
            src,
            new_pool,
        } => {
            let opts = new_pool.options()?;
            let (fs, _) = Fs::open_pool(&pool, &opts, b"/")
                .with_context(|| format!("open pool {}", pool.display()))?;
            let mut n = 0u64;
            import_dir(&fs, &src, b"/", &mut n, &mut Default::default())?;
            println!("imported {n} files into {}", pool.display());
            Ok(())
        }
    }
}

/// Copies the tree at `src` into the pool at `at`; `links` maps a (device, inode) with several
/// names to the pool path of its first copy, so hard links are imported as hard links.
fn import_dir(
    fs: &Fs,
    src: &Path,
    at: &[u8],
    n: &mut u64,
    links: &mut std::collections::HashMap<(u64, u64), Vec<u8>>,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(src)
        .with_context(|| format!("read {}", src.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = join(at, e.file_name().as_bytes());
        let md = std::fs::symlink_metadata(e.path())?;
        let ft = md.file_type();
        if ft.is_dir() {
            match fs.mkdir(&p, md.mode() & 0o7777) {
                Ok(()) | Err(FsError::Errno(libc::EEXIST)) => {}
                Err(err) => return Err(errno_err(err, &p)),
            }
            import_dir(fs, &e.path(), &p, n, links)?;
        } else if ft.is_symlink() {
            let t = std::fs::read_link(e.path())?;
            fs.symlink(t.as_os_str().as_bytes(), &p)
                .map_err(|err| errno_err(err, &p))?;
            continue;
        } else if ft.is_file() && md.nlink() > 1 && links.contains_key(&(md.dev(), md.ino())) {
            fs.link(&links[&(md.dev(), md.ino())], &p, false)
                .map_err(|err| errno_err(err, &p))?;
            continue;
        } else if ft.is_file() {
            if md.nlink() > 1 {
                links.insert((md.dev(), md.ino()), p.clone());
            }
            let f = fs
                .open(
                    &p,
                    libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
                    md.mode() & 0o7777,
                )
                .map_err(|err| errno_err(err, &p))?;
            let mut r = std::fs::File::open(e.path())?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let k = std::io::Read::read(&mut r, &mut buf)?;
                if k == 0 {
                    break;
                }
                f.write(&buf[..k])
                    .map_err(|err| errno_err(FsError::Errno(err), &p))?;
            }
            *n += 1;
        } else {
            eprintln!(
                "kaiso: skipping {} (not a file, directory or symlink)",
                e.path().display()
            );
            continue;
        }
        let _ = fs.chmod(&p, md.mode() & 0o7777, false);
        let _ = fs.utimens(
            &p,
            Some(md.atime() * 1_000_000_000 + md.atime_nsec()),
            Some(md.mtime() * 1_000_000_000 + md.mtime_nsec()),
            false,
        );
    }
    Ok(())
}
