//! `--face fuse|nfs`: the start and grid parts measured the way a client of kaiso sees
//! them, through a real `kaiso migrate start` daemon (this very binary, spawned as a
//! process of its own) and one of its faces:
//!
//! - FUSE: start → serving ends when a `stat` of the mount point returns the mount's
//!   root (a device other than the directory's underneath); the grid's first open + read
//!   are `open(2)` and `read(2)` of the target file on the mount;
//! - NFSv3: start → serving ends when MOUNT of the export and a GETATTR of its root
//!   answer (kaiso's own user-space NFSv3 client, `kaiso_source::NfsSource`, used
//!   read-only); the grid's open is the LOOKUP chain + GETATTR of the target, its read
//!   ACCESS + READ. The face answers NFS3ERR_JUKEBOX after its default 0.5 s and the
//!   client retries (after 100 ms, doubling up to 5 s); the JUKEBOX replies are counted
//!   from the calls the client sent beyond the ones the walk needs, and their waits are
//!   in the times. The client has no call timeout (one hour).
//!
//! The daemon is started `--paused` (no background crawl competes with the measured
//! access, as in the in-process rows) on a fresh store of its own, and stopped with
//! SIGTERM (it unmounts itself) after each measurement; SIGKILL and a lazy unmount if it
//! does not stop within 30 s. On SIGINT/SIGTERM of the benchmark the signal handler of
//! `servers` stops it and detaches its mount.

use std::fs;
use std::io::Read as _;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use kaiso_source::{NfsConfig, NfsSource};
use kaiso_store::migrate::{Source, SourcePath};

use super::servers;

/// Where the start and grid parts are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Face {
    /// In-process: the store API called by the benchmark (no face, no daemon).
    Store,
    /// A `kaiso migrate start --mount` daemon, through its FUSE mount.
    Fuse,
    /// A `kaiso migrate start --nfs` daemon, through its NFSv3 face.
    Nfs,
}

impl Face {
    pub const ALL: [Face; 3] = [Face::Store, Face::Fuse, Face::Nfs];

    pub fn parse(s: &str) -> Option<Face> {
        match s {
            "store" => Some(Face::Store),
            "fuse" => Some(Face::Fuse),
            "nfs" => Some(Face::Nfs),
            _ => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Face::Store => "in-process (store API)",
            Face::Fuse => "daemon, FUSE mount",
            Face::Nfs => "daemon, NFSv3 face",
        }
    }
}

/// How long a daemon may take to serve before the measurement fails.
const SERVE_LIMIT: Duration = Duration::from_secs(60);

/// "No client timeout": the NFS client's per-call bound.
const NO_TIMEOUT: Duration = Duration::from_secs(3600);

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A running `kaiso migrate start` serving a fresh store through one face.
pub struct FaceDaemon {
    child: Option<Child>,
    face: Face,
    dir: PathBuf,
    mnt: PathBuf,
    nfs_port: u16,
    log: PathBuf,
    spawned: Instant,
    /// The NFS client that saw the face serve (NFS face only).
    client: Option<NfsSource>,
}

/// What `start` measured through a face.
pub struct Serving {
    /// From just before the spawn until the face answered.
    pub serving: Duration,
    /// From just before the spawn until the root's first listing returned.
    pub listed: Duration,
    /// The daemon's own "serving after N ms" line.
    pub daemon_ms: Option<u64>,
}

/// What one grid point measured through a face.
pub struct FirstRead {
    pub open: Duration,
    pub read: Duration,
    /// NFS3ERR_JUKEBOX replies the client got (NFS face only).
    pub jukebox: Option<u64>,
}

impl FaceDaemon {
    /// Spawns `BIN migrate start URL` (BIN: the kaiso binary) on a fresh store under
    /// `scratch`, serving through `face` (not `Face::Store`), with `env` added to its
    /// environment and `extra` arguments.
    pub fn spawn(
        bin: &Path,
        scratch: &Path,
        url: &str,
        env: &[(String, String)],
        face: Face,
        extra: &[&str],
    ) -> Result<Self> {
        if face == Face::Store {
            bail!("the store face has no daemon");
        }
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = scratch.join(format!("face{n}"));
        let mnt = dir.join("mnt");
        fs::create_dir_all(dir.join("t0"))?;
        fs::create_dir_all(&mnt)?;
        let config = dir.join("store.toml");
        fs::write(
            &config,
            format!(
                "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"256GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
                dir.join("state").display(),
                dir.join("t0").display()
            ),
        )?;
        let nfs_port = servers::free_port()?;
        let log = dir.join("daemon.log");
        let out = fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.env_remove("KAISO_SMB_PASSWORD")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(["migrate", "start", "--paused", "--share", "bench"])
            .arg(url)
            .arg(&config)
            .args(extra);
        match face {
            Face::Fuse => {
                cmd.arg("--mount").arg(&mnt);
            }
            _ => {
                cmd.arg("--nfs").arg(format!("127.0.0.1:{nfs_port}"));
            }
        }
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let spawned = Instant::now();
        let child = cmd.spawn().context("spawn kaiso migrate start")?;
        servers::register_daemon(child.id() as i32, (face == Face::Fuse).then_some(&mnt));
        Ok(Self {
            child: Some(child),
            face,
            dir,
            mnt,
            nfs_port,
            log,
            spawned,
            client: None,
        })
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails if the daemon exited (with its log), or took longer than `SERVE_LIMIT`.
    fn check_alive(&mut self, what: &str) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(st) = c.try_wait()?
        {
            self.child = None;
            bail!(
                "kaiso migrate start exited ({st}) before {what}:\n{}",
                self.log_text()
            );
        }
        if self.spawned.elapsed() > SERVE_LIMIT {
            bail!(
                "kaiso migrate start: no {what} within {SERVE_LIMIT:?}:\n{}",
                self.log_text()
            );
        }
        Ok(())
    }

    /// Polls the face (every millisecond) until it serves the share's root; returns the
    /// time since the spawn.
    pub fn wait_serving(&mut self) -> Result<Duration> {
        match self.face {
            Face::Fuse => {
                let under = fs::metadata(&self.dir)?.dev();
                loop {
                    if let Ok(m) = fs::metadata(&self.mnt)
                        && m.dev() != under
                    {
                        if !m.is_dir() {
                            bail!("the mount's root is not a directory");
                        }
                        return Ok(self.spawned.elapsed());
                    }
                    self.check_alive("its FUSE mount answered")?;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            _ => {
                let addr = SocketAddr::from(([127, 0, 0, 1], self.nfs_port));
                loop {
                    // Refused at once until the face listens; then MOUNT + GETATTR(root).
                    if TcpStream::connect(addr).is_ok() {
                        let got = nfs_client(self.nfs_port).and_then(|c| {
                            c.stat(&SourcePath::root())
                                .map_err(|e| anyhow!("GETATTR of the export root: {e}"))?;
                            Ok(c)
                        });
                        match got {
                            Ok(c) => {
                                let t = self.spawned.elapsed();
                                self.client = Some(c);
                                return Ok(t);
                            }
                            Err(e) if self.spawned.elapsed() > SERVE_LIMIT => return Err(e),
                            Err(_) => {}
                        }
                    }
                    self.check_alive("its NFS face answered")?;
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    /// Lists the share's root through the face; returns the entries seen.
    pub fn list_root(&self) -> Result<usize> {
        match &self.client {
            Some(c) => Ok(c
                .read_dir(&SourcePath::root())
                .map_err(|e| anyhow!("READDIRPLUS of the export root: {e}"))?
                .len()),
            None => Ok(fs::read_dir(&self.mnt)?.count()),
        }
    }

    /// The daemon's own "kaiso: serving after N ms".
    pub fn daemon_ms(&self) -> Option<u64> {
        let t = self.log_text();
        let rest = t.split("kaiso: serving after ").nth(1)?;
        rest.split(' ').next()?.parse().ok()
    }

    /// First open + read of `len` bytes at 0 of `rel` through the face; the bytes must
    /// equal `expect`.
    pub fn first_read(&self, rel: &Path, len: usize, expect: &[u8]) -> Result<FirstRead> {
        let (open, read, data, jukebox) = match &self.client {
            Some(_) => {
                // A client of its own that knows only the export root (as after a mount),
                // so that every component costs exactly one LOOKUP.
                let c = &nfs_client(self.nfs_port)?;
                let path = SourcePath::parse(rel.as_os_str().as_bytes())
                    .map_err(|e| anyhow!("{}: {e}", rel.display()))?;
                let before = c.call_counts();
                let t = Instant::now();
                c.stat(&path)
                    .map_err(|e| anyhow!("LOOKUP/GETATTR {}: {e}", rel.display()))?;
                let open = t.elapsed();
                let t = Instant::now();
                let data = c
                    .read(&path, 0, len)
                    .map_err(|e| anyhow!("READ {}: {e}", rel.display()))?;
                let read = t.elapsed();
                let after = c.call_counts();
                let sent = |x: &kaiso_source::nfs::NfsCallCounts| {
                    x.lookup + x.getattr + x.access + x.read + x.readdirplus + x.readlink
                };
                // One LOOKUP per component, a GETATTR, an ACCESS and one READ (the read
                // size is 1 MiB): every call beyond those was a retry after JUKEBOX.
                let needed = rel.components().count() as u64 + 3;
                let calls = sent(&after) - sent(&before);
                (open, read, data, Some(calls.saturating_sub(needed)))
            }
            None => {
                let p = self.mnt.join(rel);
                let t = Instant::now();
                let mut f = fs::File::open(&p).with_context(|| format!("open {}", p.display()))?;
                let open = t.elapsed();
                let mut data = vec![0u8; len];
                let t = Instant::now();
                f.read_exact(&mut data)
                    .with_context(|| format!("read {}", p.display()))?;
                let read = t.elapsed();
                (open, read, data, None)
            }
        };
        if data != expect {
            bail!(
                "{} through the {:?} face: the first {len} bytes differ from the source's",
                rel.display(),
                self.face
            );
        }
        Ok(FirstRead {
            open,
            read,
            jukebox,
        })
    }

    /// SIGTERM and a bounded wait (the daemon unmounts itself), else SIGKILL and a lazy
    /// unmount; then the store is removed.
    fn stop(&mut self) {
        self.client.take();
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            unsafe { libc::kill(pid, libc::SIGTERM) };
            let t = Instant::now();
            let mut exited = false;
            while t.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = c.try_wait() {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            if !exited {
                eprintln!(
                    "kaiso migrate start (pid {pid}) did not stop within 30 s: killed\n{}",
                    self.log_text()
                );
                let _ = c.kill();
                let _ = c.wait();
            }
            servers::unregister_daemon(pid);
        }
        if super::super::scratch_fs::is_mounted(&self.mnt)
            && let Ok(p) = std::ffi::CString::new(self.mnt.as_os_str().as_bytes())
        {
            unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

impl Drop for FaceDaemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// kaiso's NFSv3 client on the face at 127.0.0.1:`port` (MOUNT, portmap and NFS share the
/// port), one connection, no call timeout.
fn nfs_client(port: u16) -> Result<NfsSource> {
    let mut c = NfsConfig::new("127.0.0.1", "/export");
    c.mount_port = Some(port);
    c.nfs_port = Some(port);
    c.connections = 1;
    c.rpc_timeout = NO_TIMEOUT;
    c.privileged_port = unsafe { libc::geteuid() } == 0;
    NfsSource::connect(c).map_err(|e| anyhow!("MOUNT of the NFS face: {e}"))
}

/// Start → serving through `face`: spawn, wait until the face serves, list the root.
pub fn start_through(
    scratch: &Path,
    url: &str,
    env: &[(String, String)],
    face: Face,
) -> Result<Serving> {
    let bin = std::env::current_exe().context("the kaiso binary")?;
    let mut d = FaceDaemon::spawn(&bin, scratch, url, env, face, &[])?;
    let serving = d.wait_serving()?;
    d.list_root()?;
    let listed = d.spawned.elapsed();
    // The line is printed right after the face is up: give it a moment.
    let mut daemon_ms = d.daemon_ms();
    let t = Instant::now();
    while daemon_ms.is_none() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
        daemon_ms = d.daemon_ms();
    }
    Ok(Serving {
        serving,
        listed,
        daemon_ms,
    })
}

/// A fresh cutover through `face`, then the first open + read of `rel`.
pub fn grid_through(
    scratch: &Path,
    url: &str,
    env: &[(String, String)],
    face: Face,
    rel: &Path,
    len: usize,
    expect: &[u8],
) -> Result<FirstRead> {
    let bin = std::env::current_exe().context("the kaiso binary")?;
    let mut d = FaceDaemon::spawn(&bin, scratch, url, env, face, &[])?;
    d.wait_serving()?;
    d.first_read(rel, len, expect)
}

#[cfg(test)]
mod tests {
    use super::super::dataset;
    use super::*;

    /// The kaiso binary of this build (`cargo test` builds it next to the test binary's
    /// `deps/` directory).
    fn kaiso_bin() -> PathBuf {
        let exe = std::env::current_exe().unwrap();
        let bin = exe.parent().unwrap().parent().unwrap().join("kaiso");
        assert!(
            bin.is_file(),
            "expected the kaiso binary at {} (build it: cargo build --release -p kaiso)",
            bin.display()
        );
        bin
    }

    /// A depth-3, width-10 grid under `scratch`/src with a 4 MiB target: the source
    /// directory, the target's relative path and its first 64 KiB.
    fn grid_source(scratch: &Path) -> (PathBuf, PathBuf, Vec<u8>) {
        let src = scratch.join("src");
        let rel = dataset::grid_tree(&src, 3, 10, 4 << 20).unwrap();
        let mut expect = vec![0u8; 64 << 10];
        fs::File::open(src.join(&rel))
            .unwrap()
            .read_exact(&mut expect)
            .unwrap();
        (src, rel, expect)
    }

    fn mounts() -> String {
        fs::read_to_string("/proc/self/mountinfo").unwrap()
    }

    /// Through each face: the daemon serves, the first open + read of a grid target
    /// returns the source's bytes, and stopping it leaves no process and no mount.
    #[test]
    fn faces_serve_read_count_jukebox_and_clean_up() {
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            // FUSE mounts and the privileged NFS client port need root (CI runs as root).
            panic!("this test needs root and /dev/fuse");
        }
        let bin = kaiso_bin();
        let tmp = tempfile::tempdir().unwrap();
        let (src, rel, expect) = grid_source(tmp.path());
        let url = src.display().to_string();
        for face in [Face::Fuse, Face::Nfs] {
            let mut d = FaceDaemon::spawn(&bin, tmp.path(), &url, &[], face, &[]).unwrap();
            let serving = d.wait_serving().unwrap();
            assert!(serving < SERVE_LIMIT, "{face:?}: serving after {serving:?}");
            assert_eq!(
                d.list_root().unwrap(),
                10,
                "{face:?}: the root's 10 entries"
            );
            let r = d.first_read(&rel, expect.len(), &expect).unwrap();
            match face {
                Face::Fuse => assert!(r.jukebox.is_none()),
                _ => assert!(r.jukebox.is_some()),
            }
            // A wrong expectation is reported, not passed.
            if face == Face::Fuse {
                let wrong = vec![0xAAu8; expect.len()];
                assert!(d.first_read(&rel, wrong.len(), &wrong).is_err());
            }
            let pid = d.child.as_ref().unwrap().id() as i32;
            let (dir, mnt) = (d.dir.clone(), d.mnt.clone());
            drop(d);
            assert!(
                unsafe { libc::kill(pid, 0) } != 0,
                "{face:?}: the daemon (pid {pid}) still runs after drop"
            );
            assert!(
                !mounts().contains(&format!(" {} ", mnt.display())),
                "{face:?}: {} still mounted after drop",
                mnt.display()
            );
            assert!(!dir.exists(), "{face:?}: {} left behind", dir.display());
        }
    }

    /// SIGSTOP to `pid`, then a wait (at most 10 s) until every thread of it is in group
    /// stop: `kill` returns before that, and a thread not stopped yet could still answer.
    fn stop_all_threads(pid: i32) {
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        let t = Instant::now();
        loop {
            let running = fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .filter_map(|e| fs::read_to_string(e.ok()?.path().join("stat")).ok())
                .filter_map(|stat| stat[stat.rfind(')')? + 2..].chars().next())
                .filter(|state| *state != 'T')
                .count();
            if running == 0 {
                return;
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{running} threads of {pid} not stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Sends SIGCONT to a stopped process when dropped (also when the test fails).
    struct Continue(i32);

    impl Drop for Continue {
        fn drop(&mut self) {
            unsafe { libc::kill(self.0, libc::SIGCONT) };
        }
    }

    /// With JUKEBOX after 1 ms, a READ whose fetch waits on a source that does not answer
    /// gets JUKEBOX replies, the client retries until the data is there, and the retries
    /// are counted. The source is another kaiso daemon's NFS face, stopped (SIGSTOP) from
    /// before the READ until the face has logged a JUKEBOX reply, so the reply does not
    /// depend on how fast the machine copies.
    #[test]
    fn jukebox_replies_while_the_source_is_stopped_are_counted() {
        if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
            panic!("this test needs root and /dev/fuse");
        }
        let bin = kaiso_bin();
        let tmp = tempfile::tempdir().unwrap();
        let (src, rel, expect) = grid_source(tmp.path());
        let src_url = src.display().to_string();
        let mut old_server =
            FaceDaemon::spawn(&bin, tmp.path(), &src_url, &[], Face::Nfs, &[]).unwrap();
        old_server.wait_serving().unwrap();
        let port = old_server.nfs_port;
        let url = format!("nfs://127.0.0.1:{port}/export?mountport={port}");
        // The face logs each JUKEBOX reply at debug level.
        let env = [("KAISO_LOG".to_string(), "warn,kaiso_nfs=debug".to_string())];
        let jukebox_args = ["--jukebox-after", "1ms"];
        let mut d =
            FaceDaemon::spawn(&bin, tmp.path(), &url, &env, Face::Nfs, &jukebox_args).unwrap();
        d.wait_serving().unwrap();
        // The target's metadata is fetched now, while the old server answers, so that only
        // the READ's data fetch needs it below.
        let path = SourcePath::parse(rel.as_os_str().as_bytes()).unwrap();
        let size = d.client.as_ref().unwrap().stat(&path).unwrap().size;
        assert_eq!(size, 4 << 20, "the target's size through the NFS face");

        let old_pid = old_server.child.as_ref().unwrap().id() as i32;
        let resume = Continue(old_pid);
        stop_all_threads(old_pid);
        let log = d.log.clone();
        let waker = std::thread::spawn(move || {
            let t = Instant::now();
            let seen = loop {
                let text = fs::read_to_string(&log).unwrap_or_default();
                if text.contains("NFS3ERR_JUKEBOX") {
                    break true;
                }
                if t.elapsed() > Duration::from_secs(60) {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(5));
            };
            drop(resume);
            seen
        });
        let r = d.first_read(&rel, expect.len(), &expect);
        let logged = waker.join().unwrap();
        let r = r.unwrap();
        assert!(
            logged,
            "no JUKEBOX reply logged within 60 s:\n{}",
            d.log_text()
        );
        assert!(
            r.jukebox.unwrap() >= 1,
            "a JUKEBOX reply was logged, but the read counted {:?} retries",
            r.jukebox
        );
    }
}
