//! The old file servers the benchmark migrates from, started and stopped by it:
//! nfs-ganesha (FSAL_VFS, NFSv3, with rpcbind), Samba's smbd (SMB 2/3) and an rsync
//! daemon (the pre-copy baseline's server side), all on loopback ports.
//!
//! smbd runs in a process group of its own (its SIGTERM handler signals its whole group,
//! which must not be ours), so a Ctrl-C at the terminal does not reach it: the
//! benchmark's signal handler ([`install_signal_cleanup`]: SIGINT, SIGTERM and crashes)
//! stops every server registered here before the process dies.

use std::fs;
use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn have(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

/// Fails naming the first of `programs` that is not on `PATH`.
fn require(programs: &[&str]) -> Result<()> {
    match programs.iter().find(|p| !have(p)) {
        Some(p) => bail!("{p} is not installed (scripts/deps/source.list)"),
        None => Ok(()),
    }
}

fn wait_port(port: u16, limit: Duration, child: &mut Child, what: &str) -> Result<()> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .is_ok()
        {
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            bail!("{what} exited with {st} before listening on port {port}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("{what} did not listen on 127.0.0.1:{port} within {limit:?}")
}

/// `kill` targets (a pid, or minus a process group) of the running servers, for the
/// signal handler; 0 is a free slot.
static SERVERS: [AtomicI32; 8] = [const { AtomicI32::new(0) }; 8];

fn register(target: i32) {
    for slot in &SERVERS {
        if slot
            .compare_exchange(0, target, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return;
        }
    }
}

fn unregister(target: i32) {
    for slot in &SERVERS {
        let _ = slot.compare_exchange(target, 0, Ordering::SeqCst, Ordering::SeqCst);
    }
}

/// The FUSE mount point of the running `kaiso migrate start` (`--face fuse`), for the
/// signal handler; leaked on purpose (a handler may read it as it is replaced).
static DAEMON_MOUNT: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Registers a `kaiso migrate start` daemon (and its FUSE mount point, if any) for the
/// signal handler: SIGTERM to it, then a lazy unmount of its mount.
pub fn register_daemon(pid: i32, mnt: Option<&Path>) {
    register(pid);
    let p = mnt
        .and_then(|m| std::ffi::CString::new(m.as_os_str().as_encoded_bytes()).ok())
        .map_or(std::ptr::null_mut(), std::ffi::CString::into_raw);
    DAEMON_MOUNT.store(p, Ordering::SeqCst);
}

/// The daemon `pid` has stopped.
pub fn unregister_daemon(pid: i32) {
    unregister(pid);
    DAEMON_MOUNT.store(std::ptr::null_mut(), Ordering::SeqCst);
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe calls: kill, umount2, rmdir, unlink, signal, raise.
    for slot in &SERVERS {
        let t = slot.load(Ordering::SeqCst);
        if t != 0 {
            unsafe { libc::kill(t, libc::SIGTERM) };
        }
    }
    // The daemon unmounts on SIGTERM; should it hang, its mount must not stay behind.
    let m = DAEMON_MOUNT.swap(std::ptr::null_mut(), Ordering::SeqCst);
    if !m.is_null() {
        // SAFETY: a pointer from `CString::into_raw`, never freed.
        unsafe { libc::umount2(m, libc::MNT_DETACH) };
    }
    // The total-time rows' fresh ext4 destinations: no `Drop` runs after this.
    crate::cmd::scratch_fs::detach_all_from_signal_handler();
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// On SIGINT, SIGTERM or a crash (see `scratch_fs::ENDING_SIGNALS`), stops every server
/// started here and detaches the scratch file systems, then dies of the signal as usual.
pub fn install_signal_cleanup() {
    crate::cmd::scratch_fs::install_cleanup_handler(on_signal);
}

/// SIGTERM, then SIGKILL after 5 s.
fn stop(child: &mut Child) {
    unregister(child.id() as i32);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// nfs-ganesha exporting `export` read-only as NFSv3 `/kaiso_bench`, with rpcbind started
/// first if nothing listens on port 111.
pub struct Ganesha {
    child: Child,
    rpcbind: Option<Child>,
    pub nfs_port: u16,
    pub mount_port: u16,
    pub pseudo: String,
    _dir: tempfile::TempDir,
}

impl Ganesha {
    /// The server's process id (for its CPU time).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn start(export: &Path) -> Result<Self> {
        require(&["ganesha.nfsd", "rpcbind"])?;
        if unsafe { libc::geteuid() } != 0 {
            bail!("nfs-ganesha needs root");
        }
        let mut rpcbind = None;
        if TcpStream::connect_timeout(&([127, 0, 0, 1], 111).into(), Duration::from_millis(200))
            .is_err()
        {
            fs::create_dir_all("/run/rpcbind")?;
            let mut c = Command::new("rpcbind")
                .arg("-f")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("start rpcbind")?;
            register(c.id() as i32);
            wait_port(111, Duration::from_secs(10), &mut c, "rpcbind")?;
            rpcbind = Some(c);
        }
        let dir = tempfile::tempdir()?;
        let (nfs_port, mount_port, nlm, rq) =
            (free_port()?, free_port()?, free_port()?, free_port()?);
        let pseudo = "/kaiso_bench".to_string();
        // Mount_Path_Pseudo: NFSv3 MOUNT of the Pseudo path (else MNT3ERR_ACCES).
        let conf = format!(
            "NFS_CORE_PARAM {{ Protocols = 3; NFS_Port = {nfs_port}; MNT_Port = {mount_port}; \
             NLM_Port = {nlm}; Rquota_Port = {rq}; Bind_addr = 127.0.0.1; Enable_NLM = false; \
             Enable_RQUOTA = false; Mount_Path_Pseudo = true; }}\n\
             NFSV4 {{ Graceless = true; }}\nNFS_KRB5 {{ Active_krb5 = false; }}\n\
             EXPORT {{ Export_Id = 4712; Path = {}; Pseudo = {pseudo}; Access_Type = RO; \
             Squash = No_Root_Squash; Protocols = 3; Transports = TCP; SecType = sys; \
             FSAL {{ Name = VFS; }} }}\n",
            export.display()
        );
        let conf_path = dir.path().join("ganesha.conf");
        fs::write(&conf_path, conf)?;
        let mut child = Command::new("ganesha.nfsd")
            .arg("-F")
            .arg("-f")
            .arg(&conf_path)
            .arg("-L")
            .arg(dir.path().join("ganesha.log"))
            .args(["-N", "NIV_EVENT", "-p"])
            .arg(dir.path().join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start ganesha.nfsd")?;
        register(child.id() as i32);
        let ready = wait_port(nfs_port, Duration::from_secs(30), &mut child, "ganesha")
            .and_then(|_| wait_port(mount_port, Duration::from_secs(30), &mut child, "ganesha"));
        let mut g = Ganesha {
            child,
            rpcbind,
            nfs_port,
            mount_port,
            pseudo,
            _dir: dir,
        };
        if let Err(e) = ready {
            drop(g);
            return Err(e);
        }
        // The first MOUNT can race the export's setup: retry a direct connect briefly.
        let start = Instant::now();
        loop {
            let mut c = kaiso_source::NfsConfig::new("127.0.0.1", g.pseudo.clone());
            c.nfs_port = Some(g.nfs_port);
            c.mount_port = Some(g.mount_port);
            c.rpc_timeout = Duration::from_secs(5);
            match kaiso_source::NfsSource::connect(c) {
                Ok(_) => break,
                Err(e) if start.elapsed() > Duration::from_secs(30) => {
                    bail!("ganesha does not serve the export: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(300)),
            }
            if let Some(st) = g.child.try_wait()? {
                bail!("ganesha exited with {st}");
            }
        }
        Ok(g)
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        stop(&mut self.child);
        if let Some(mut r) = self.rpcbind.take() {
            stop(&mut r);
        }
    }
}

/// An rsync daemon serving `root` read-only as module `src`.
pub struct RsyncDaemon {
    child: Child,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl RsyncDaemon {
    /// The daemon's process id (its CPU time includes the per-connection children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn start(root: &Path) -> Result<Self> {
        require(&["rsync"])?;
        let dir = tempfile::tempdir()?;
        let port = free_port()?;
        let conf = format!(
            "use chroot = no\nuid = root\ngid = root\npid file = {pid}\n[src]\n  path = {root}\n  read only = yes\n",
            pid = dir.path().join("rsyncd.pid").display(),
            root = root.display()
        );
        let conf_path: PathBuf = dir.path().join("rsyncd.conf");
        fs::write(&conf_path, conf)?;
        let mut child = Command::new("rsync")
            .args(["--daemon", "--no-detach", "--address=127.0.0.1"])
            .arg(format!("--port={port}"))
            .arg(format!("--config={}", conf_path.display()))
            .arg(format!(
                "--log-file={}",
                dir.path().join("rsyncd.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start rsync --daemon")?;
        register(child.id() as i32);
        wait_port(port, Duration::from_secs(10), &mut child, "rsync daemon")?;
        Ok(Self {
            child,
            port,
            _dir: dir,
        })
    }
}

impl Drop for RsyncDaemon {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Samba's smbd sharing `root` read-only as `[src]` on a loopback port, user root with a
/// generated password (set with smbpasswd in a private passdb).
pub struct Samba {
    child: Child,
    pgid: i32,
    pub port: u16,
    pub share: String,
    pub user: String,
    pub password: String,
    _dir: tempfile::TempDir,
}

impl Samba {
    /// The main smbd's process id (it forks one process per client connection).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn start(root: &Path) -> Result<Self> {
        require(&["smbd", "smbpasswd"])?;
        if unsafe { libc::geteuid() } != 0 {
            bail!("smbd needs root");
        }
        let dir = tempfile::tempdir()?;
        let d = dir.path();
        for sub in ["private", "lock", "state", "cache", "pid", "ncalrpc", "log"] {
            fs::create_dir_all(d.join(sub))?;
        }
        let port = free_port()?;
        let conf = format!(
            "[global]\n  log level = 0\n  smb ports = {port}\n  interfaces = 127.0.0.1\n  \
             bind interfaces only = yes\n  private dir = {d}/private\n  lock directory = {d}/lock\n  \
             state directory = {d}/state\n  cache directory = {d}/cache\n  pid directory = {d}/pid\n  \
             ncalrpc dir = {d}/ncalrpc\n  log file = {d}/log/log.%m\n  \
             passdb backend = tdbsam:{d}/private/passdb.tdb\n  server role = standalone server\n  \
             disable netbios = yes\n  load printers = no\n  printcap name = /dev/null\n  \
             disable spoolss = yes\n  server min protocol = SMB2_02\n  ea support = yes\n\
             [src]\n  path = {root}\n  read only = yes\n  valid users = root\n",
            d = d.display(),
            root = root.display()
        );
        let conf_path = d.join("smb.conf");
        fs::write(&conf_path, conf)?;
        let password = format!("Kaiso-bench-{}", std::process::id());
        let mut p = Command::new("smbpasswd")
            .arg("-c")
            .arg(&conf_path)
            .args(["-a", "-s", "root"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("run smbpasswd")?;
        p.stdin
            .take()
            .context("smbpasswd stdin")?
            .write_all(format!("{password}\n{password}\n").as_bytes())?;
        let out = p.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "smbpasswd failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let child = Command::new("smbd")
            .args(["--foreground", "-s"])
            .arg(&conf_path)
            // Without --no-process-group smbd calls setsid() and so leads a group of its
            // own (id = its pid; it fails if it already leads one, so no process_group(0)
            // here). Its SIGTERM handler signals that whole group, which must not be ours.
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start smbd")?;
        let pgid = child.id() as i32;
        // Signals the group smbd creates (a no-op until it exists: a group id is a pid).
        register(-pgid);
        let mut s = Samba {
            child,
            pgid,
            port,
            share: "src".into(),
            user: "root".into(),
            password,
            _dir: dir,
        };
        if let Err(e) = wait_port(port, Duration::from_secs(30), &mut s.child, "smbd") {
            drop(s);
            return Err(e);
        }
        Ok(s)
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        // The whole group: smbd forks one process per client connection.
        unsafe { libc::kill(-self.pgid, libc::SIGTERM) };
        stop(&mut self.child);
        unsafe { libc::kill(-self.pgid, libc::SIGKILL) };
        unregister(-self.pgid);
    }
}
