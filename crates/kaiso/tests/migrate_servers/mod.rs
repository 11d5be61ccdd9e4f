//! Real source servers for the `kaiso migrate` CLI tests: nfs-ganesha (FSAL_VFS, NFSv3
//! over TCP) and Samba's smbd with a password account, each exporting a directory on
//! loopback ports, waited for with bounded loops and stopped on drop. The recipes are
//! those of crates/source/tests/common (a test crate cannot import another's helpers).

#![allow(dead_code)]

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Whether the servers can run here: the programs are installed and we are root. In CI
/// (`$CI` set, scripts/deps/*.list installed, root) a missing one is a failure.
pub fn servers_available(programs: &[&str]) -> bool {
    for p in programs {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(p).is_file()));
        if !found {
            assert!(
                std::env::var_os("CI").is_none(),
                "{p} is not installed (scripts/deps/migrate.list)"
            );
            eprintln!("SKIP: {p} is not installed (scripts/deps/migrate.list)");
            return false;
        }
    }
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "these tests start servers and need root"
        );
        eprintln!("SKIP: these tests start servers and need root");
        return false;
    }
    true
}

/// A TCP port on 127.0.0.1 that nothing listens on right now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    l.local_addr().expect("local addr").port()
}

fn tail(p: &Path) -> String {
    let s = fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Waits until `127.0.0.1:port` accepts connections (bounded).
fn wait_for_port(port: u16, limit: Duration, child: &mut Child, log: &Path) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .is_ok()
        {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "server exited with {status} before listening on {port}:\n{}",
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "server did not listen on 127.0.0.1:{port} within {limit:?}:\n{}",
        tail(log)
    );
}

/// SIGTERM, then SIGKILL if the server lingers.
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

/// One ganesha at a time per test binary: every instance registers the same RPC program
/// numbers with rpcbind.
static NFS_SERVER_LOCK: Mutex<()> = Mutex::new(());

/// rpcbind for the ganesha instances of this process; started only if nothing listens on
/// port 111 yet, stopped by the last user.
static RPCBIND: Mutex<(usize, Option<Child>)> = Mutex::new((0, None));

struct RpcbindRef;

impl RpcbindRef {
    fn acquire() -> Self {
        let mut g = RPCBIND.lock().unwrap_or_else(|e| e.into_inner());
        if g.0 == 0
            && TcpStream::connect_timeout(&([127, 0, 0, 1], 111).into(), Duration::from_millis(200))
                .is_err()
        {
            fs::create_dir_all("/run/rpcbind").expect("create /run/rpcbind");
            let mut child = Command::new("rpcbind")
                .arg("-f")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start rpcbind");
            wait_for_port(
                111,
                Duration::from_secs(10),
                &mut child,
                Path::new("/dev/null"),
            );
            g.1 = Some(child);
        }
        g.0 += 1;
        RpcbindRef
    }
}

impl Drop for RpcbindRef {
    fn drop(&mut self) {
        let mut g = RPCBIND.lock().unwrap_or_else(|e| e.into_inner());
        g.0 -= 1;
        if g.0 == 0
            && let Some(mut c) = g.1.take()
        {
            stop(&mut c);
        }
    }
}

/// nfs-ganesha exporting one directory read-only over NFSv3 as `/kaiso_src`.
pub struct Ganesha {
    child: Child,
    pub nfs_port: u16,
    pub mount_port: u16,
    dir: tempfile::TempDir,
    _rpcbind: RpcbindRef,
    _lock: MutexGuard<'static, ()>,
}

impl Ganesha {
    pub const EXPORT: &'static str = "/kaiso_src";

    pub fn start(export: &Path) -> Ganesha {
        let lock = NFS_SERVER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let rpcbind = RpcbindRef::acquire();
        let dir = tempfile::tempdir().expect("tempdir");
        let (nfs_port, mount_port, nlm_port, rquota_port) =
            (free_port(), free_port(), free_port(), free_port());
        let conf = format!(
            r#"NFS_CORE_PARAM {{
    Protocols = 3;
    NFS_Port = {nfs_port};
    MNT_Port = {mount_port};
    NLM_Port = {nlm_port};
    Rquota_Port = {rquota_port};
    Bind_addr = 127.0.0.1;
    Enable_NLM = false;
    Enable_RQUOTA = false;
    # NFSv3 MOUNT of the Pseudo path (otherwise MNT3ERR_ACCES).
    Mount_Path_Pseudo = true;
}}
NFSV4 {{ Graceless = true; }}
NFS_KRB5 {{ Active_krb5 = false; }}
EXPORT {{
    Export_Id = 4711;
    Path = {path};
    Pseudo = {pseudo};
    Access_Type = RO;
    Squash = No_Root_Squash;
    Protocols = 3;
    Transports = TCP;
    SecType = sys;
    FSAL {{ Name = VFS; }}
}}
"#,
            path = export.display(),
            pseudo = Self::EXPORT,
        );
        let conf_path = dir.path().join("ganesha.conf");
        fs::write(&conf_path, conf).expect("write ganesha.conf");
        let log = dir.path().join("ganesha.log");
        let mut child = Command::new("ganesha.nfsd")
            .arg("-F")
            .arg("-f")
            .arg(&conf_path)
            .arg("-L")
            .arg(&log)
            .args(["-N", "NIV_EVENT", "-p"])
            .arg(dir.path().join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ganesha.nfsd");
        wait_for_port(nfs_port, Duration::from_secs(30), &mut child, &log);
        wait_for_port(mount_port, Duration::from_secs(30), &mut child, &log);
        let g = Ganesha {
            child,
            nfs_port,
            mount_port,
            dir,
            _rpcbind: rpcbind,
            _lock: lock,
        };
        g.wait_until_listable(&log);
        g
    }

    /// The source URL of an export path of this server (for `kaiso migrate start`).
    pub fn url_of(&self, export: &str) -> String {
        format!(
            "nfs://127.0.0.1:{}{export}?mountport={}",
            self.nfs_port, self.mount_port
        )
    }

    pub fn url(&self) -> String {
        self.url_of(Self::EXPORT)
    }

    /// ganesha answers MOUNT some time after it listens: wait until libnfs's `nfs-ls`
    /// (an independent client) lists the export.
    fn wait_until_listable(&self, log: &Path) {
        let url = format!(
            "nfs://127.0.0.1{}?nfsport={}&mountport={}&version=3",
            Self::EXPORT,
            self.nfs_port,
            self.mount_port
        );
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < Duration::from_secs(30) {
            let out = Command::new("timeout")
                .args(["10", "nfs-ls"])
                .arg(&url)
                .stdin(Stdio::null())
                .output()
                .expect("run nfs-ls");
            if out.status.success() {
                return;
            }
            last = String::from_utf8_lossy(&out.stderr).into_owned();
            std::thread::sleep(Duration::from_millis(300));
        }
        panic!(
            "nfs-ls {url} did not succeed within 30 s: {last}\n{}",
            tail(log)
        );
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Samba's smbd sharing one directory read-only as `src` to user root with a password.
pub struct Samba {
    child: Child,
    pub port: u16,
    pub password: String,
    dir: tempfile::TempDir,
}

impl Samba {
    pub const USER: &'static str = "root";
    pub const SHARE: &'static str = "src";

    pub fn start(share: &Path) -> Samba {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for sub in ["private", "lock", "state", "cache", "pid", "ncalrpc", "log"] {
            fs::create_dir_all(d.join(sub)).expect("samba dirs");
        }
        let port = free_port();
        let conf = format!(
            r#"[global]
  log level = 1
  smb ports = {port}
  interfaces = 127.0.0.1
  bind interfaces only = yes
  private dir = {d}/private
  lock directory = {d}/lock
  state directory = {d}/state
  cache directory = {d}/cache
  pid directory = {d}/pid
  ncalrpc dir = {d}/ncalrpc
  log file = {d}/log/log.%m
  passdb backend = tdbsam:{d}/private/passdb.tdb
  server role = standalone server
  disable netbios = yes
  load printers = no
  printcap name = /dev/null
  disable spoolss = yes
  server min protocol = SMB2_02
  ea support = yes
[{share_name}]
  path = {share}
  read only = yes
  valid users = {user}
"#,
            d = d.display(),
            share = share.display(),
            share_name = Self::SHARE,
            user = Self::USER,
        );
        let conf_path = d.join("smb.conf");
        fs::write(&conf_path, conf).expect("write smb.conf");
        let password = format!("Kaiso-cli-{}-pw", std::process::id());
        let mut p = Command::new("smbpasswd")
            .arg("-c")
            .arg(&conf_path)
            .args(["-a", "-s", Self::USER])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run smbpasswd");
        p.stdin
            .take()
            .expect("stdin")
            .write_all(format!("{password}\n{password}\n").as_bytes())
            .expect("password");
        let out = p.wait_with_output().expect("smbpasswd");
        assert!(
            out.status.success(),
            "smbpasswd failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let log = d.join("log/log.smbd");
        // Without --no-process-group: smbd's SIGTERM handler signals its whole process
        // group, which would otherwise be the test harness itself.
        let mut child = Command::new("smbd")
            .args(["--foreground", "-s"])
            .arg(&conf_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start smbd");
        wait_for_port(port, Duration::from_secs(30), &mut child, &log);
        Samba {
            child,
            port,
            password,
            dir,
        }
    }

    /// The source URL (the password goes in `$KAISO_SMB_PASSWORD`).
    pub fn url(&self) -> String {
        format!(
            "smb://{}@127.0.0.1:{}/{}",
            Self::USER,
            self.port,
            Self::SHARE
        )
    }

    pub fn log_dir(&self) -> PathBuf {
        self.dir.path().join("log")
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}
