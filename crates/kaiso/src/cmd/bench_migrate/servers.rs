//! The old file servers the benchmark migrates from, started and stopped by it:
//! nfs-ganesha (FSAL_VFS, NFSv3, with rpcbind) and an rsync daemon (the pre-copy
//! baseline's server side), both on loopback ports.

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
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

/// SIGTERM, then SIGKILL after 5 s.
fn stop(child: &mut Child) {
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
    pub fn start(export: &Path) -> Result<Self> {
        for p in ["ganesha.nfsd", "rpcbind"] {
            if !have(p) {
                bail!("{p} is not installed (scripts/deps/source.list)");
            }
        }
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
    pub fn start(root: &Path) -> Result<Self> {
        if !have("rsync") {
            bail!("rsync is not installed (scripts/deps/source.list)");
        }
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
