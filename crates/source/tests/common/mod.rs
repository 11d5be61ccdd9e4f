//! Real servers for the source tests: nfs-ganesha (FSAL_VFS) and Samba, each started by
//! the test on loopback ports, waited for with a bounded loop, and stopped on drop.
//! Plus a generated source tree with every kind of object the migration must copy.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Skips (returns false) with a message when a required program is missing, so that a
/// developer machine without the Debian packages still runs the rest; CI installs them.
pub fn have(programs: &[&str]) -> bool {
    for p in programs {
        let found = std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|d| d.join(p).is_file()))
            .unwrap_or(false);
        if !found {
            // CI installs scripts/deps/*.list first, so there a missing program is a failure.
            assert!(
                std::env::var_os("CI").is_none(),
                "{p} is not installed (scripts/deps/source.list)"
            );
            eprintln!("SKIP: {p} is not installed (scripts/deps/source.list)");
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
    free_ports::<1>()[0]
}

/// `N` distinct TCP ports on 127.0.0.1 that nothing listens on right now: every listener
/// is held until all are chosen, so two calls in a row cannot hand out the same number.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port"))
        .collect();
    std::array::from_fn(|i| held[i].local_addr().expect("local addr").port())
}

/// Waits until `127.0.0.1:port` accepts connections, or fails after `limit`.
pub fn wait_for_port(port: u16, limit: Duration, child: &mut Child, log: &Path) {
    let start = Instant::now();
    while start.elapsed() < limit {
        if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200))
            .is_ok()
        {
            return;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "server exited with {status} before listening on {port}; log {}:\n{}",
                log.display(),
                tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "server did not listen on 127.0.0.1:{port} within {limit:?}; log:\n{}",
        tail(log)
    );
}

/// Waits until libnfs's `nfs-ls` (an independent client) can mount and list `url`.
fn wait_for_nfs_ls(url: &str, limit: Duration, child: &mut Child, log: &Path) {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < limit {
        let out = Command::new("timeout")
            .args(["10", "nfs-ls", url])
            .stdin(Stdio::null())
            .output()
            .expect("run nfs-ls");
        if out.status.success() {
            return;
        }
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Ok(Some(status)) = child.try_wait() {
            panic!("ganesha exited with {status}; log:\n{}", tail(log));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!(
        "nfs-ls {url} did not succeed within {limit:?}: {last}; log:\n{}",
        tail(log)
    );
}

fn tail(p: &Path) -> String {
    let s = fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

pub fn stop(child: &mut Child) {
    // SIGTERM first so the server can unregister; SIGKILL if it lingers.
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

/// rpcbind shared by the ganesha instances of this process; started only if nothing
/// already listens on port 111, stopped by the last user.
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
            let log = PathBuf::from("/dev/null");
            wait_for_port(111, Duration::from_secs(10), &mut child, &log);
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

/// nfs-ganesha exporting one directory read-only over NFSv3 on loopback ports.
pub struct Ganesha {
    child: Child,
    pub nfs_port: u16,
    pub mount_port: u16,
    pub pseudo: String,
    pub dir: tempfile::TempDir,
    _rpcbind: RpcbindRef,
    _lock: MutexGuard<'static, ()>,
}

impl Ganesha {
    pub fn start(export: &Path) -> Self {
        let lock = NFS_SERVER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let rpcbind = RpcbindRef::acquire();
        let dir = tempfile::tempdir().expect("tempdir");
        let [nfs_port, mount_port, nlm_port, rquota_port] = free_ports::<4>();
        let pseudo = "/kaiso_src".to_string();
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
    # NFSv3 MOUNT looks exports up by Path unless this is set; without it a MOUNT of
    # the Pseudo path is answered with MNT3ERR_ACCES.
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
    # The tests change files behind ganesha's back (a source that should be read-only
    # but is not): no attribute caching, so replies show the change (e.g. nlink 0).
    Attr_Expiration_Time = 0;
    FSAL {{ Name = VFS; }}
}}
"#,
            path = export.display()
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
            .arg("-N")
            .arg("NIV_EVENT")
            .arg("-p")
            .arg(dir.path().join("ganesha.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start ganesha.nfsd");
        wait_for_port(nfs_port, Duration::from_secs(30), &mut child, &log);
        wait_for_port(mount_port, Duration::from_secs(30), &mut child, &log);
        let url =
            format!("nfs://127.0.0.1{pseudo}?nfsport={nfs_port}&mountport={mount_port}&version=3");
        wait_for_nfs_ls(&url, Duration::from_secs(30), &mut child, &log);
        Ganesha {
            child,
            nfs_port,
            mount_port,
            pseudo,
            dir,
            _rpcbind: rpcbind,
            _lock: lock,
        }
    }

    pub fn config(&self) -> kaiso_source::NfsConfig {
        let mut c = kaiso_source::NfsConfig::new("127.0.0.1", self.pseudo.clone());
        c.nfs_port = Some(self.nfs_port);
        c.mount_port = Some(self.mount_port);
        c
    }

    pub fn url(&self) -> String {
        format!(
            "nfs://127.0.0.1{}?nfsport={}&mountport={}&version=3",
            self.pseudo, self.nfs_port, self.mount_port
        )
    }
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

pub const SMB_USER: &str = "root";
pub const SMB_SHARE: &str = "src";

/// Samba's smbd sharing one directory on a loopback port, with a generated smb.conf and
/// a password set with smbpasswd for the test account.
pub struct Samba {
    child: Child,
    pub port: u16,
    pub password: String,
    pub dir: tempfile::TempDir,
}

impl Samba {
    /// A writable share (tests set files up through it with smbclient).
    pub fn start(share: &Path) -> Self {
        Self::start_with(share, false)
    }

    /// A share clients cannot write to (a migration source that must stay untouched).
    pub fn start_read_only(share: &Path) -> Self {
        Self::start_with(share, true)
    }

    fn start_with(share: &Path, read_only: bool) -> Self {
        let read_only = if read_only { "yes" } else { "no" };
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for sub in ["private", "lock", "state", "cache", "pid", "ncalrpc", "log"] {
            fs::create_dir_all(d.join(sub)).expect("samba dirs");
        }
        let port = free_port();
        // Debugging aid: KAISO_TEST_SMB_LOG_LEVEL=10 makes smbd log every packet.
        let log_level = std::env::var("KAISO_TEST_SMB_LOG_LEVEL").unwrap_or_else(|_| "1".into());
        let conf = format!(
            r#"[global]
  log level = {log_level}
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
  vfs objects = acl_xattr streams_xattr
[{SMB_SHARE}]
  path = {share}
  read only = {read_only}
  valid users = {SMB_USER}
"#,
            d = d.display(),
            share = share.display()
        );
        let conf_path = d.join("smb.conf");
        fs::write(&conf_path, conf).expect("write smb.conf");
        let password = format!("Kaiso-{}-pw", std::process::id());
        let mut p = Command::new("smbpasswd")
            .arg("-c")
            .arg(&conf_path)
            .args(["-a", "-s", SMB_USER])
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
        let mut child = Command::new("smbd")
            // Its own process group: smbd's SIGTERM handler signals its whole process
            // group, which with --no-process-group is the test harness itself.
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

    pub fn config(&self) -> kaiso_source::SmbConfig {
        let mut c =
            kaiso_source::SmbConfig::new("127.0.0.1", SMB_SHARE, SMB_USER, self.password.clone());
        c.port = self.port;
        c
    }

    /// Runs smbclient commands against the share (the real client, for setup).
    pub fn smbclient(&self, commands: &str) -> String {
        let out = Command::new("smbclient")
            .arg(format!("//127.0.0.1/{SMB_SHARE}"))
            .args([
                "-p",
                &self.port.to_string(),
                "-U",
                &format!("{SMB_USER}%{}", self.password),
                "-c",
                commands,
            ])
            .output()
            .expect("run smbclient");
        assert!(
            out.status.success(),
            "smbclient {commands:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Samba {
    fn drop(&mut self) {
        stop(&mut self.child);
        if std::thread::panicking() {
            print_log_tails(&self.dir.path().join("log"));
        }
    }
}

/// The last lines of every log file in `dir` on stderr: a failing test shows what the
/// server said (its directory is removed right after).
pub fn print_log_tails(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let text = fs::read_to_string(e.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        eprintln!(
            "--- last lines of {} ---\n{}",
            e.path().display(),
            tail.join("\n")
        );
    }
}

/// The raw bytes of a name that is not valid UTF-8.
pub const NON_UTF8_NAME: &[u8] = b"caf\xe9-latin1.txt";

/// Deterministic, non-repeating content of `len` bytes for file `seed`.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Builds the test tree under `root`: nested directories, files of various sizes (empty,
/// tiny, just over 1 MiB, several MiB so reads span pieces), a sparse file, two hard links,
/// symlinks (relative and dangling), a FIFO, xattrs, a POSIX ACL (if setfacl exists), a
/// read-only file, a root-only file and a name that is not valid UTF-8.
pub fn build_tree(root: &Path) {
    let p = |rel: &str| root.join(rel);
    for d in ["a", "a/b", "a/b/c", "a/b/c/d", "empty", "wide"] {
        fs::create_dir_all(p(d)).expect("mkdir");
    }
    let sizes: [(&str, usize); 6] = [
        ("zero", 0),
        ("tiny.txt", 1),
        ("a/page", 4095),
        ("a/b/just-over-1m", (1 << 20) + 7),
        ("a/b/c/big.bin", (3 << 20) + 12345),
        ("a/b/c/d/deep.txt", 100),
    ];
    for (i, (name, len)) in sizes.iter().enumerate() {
        fs::write(p(name), content(i as u64 + 1, *len)).expect("write file");
    }
    for i in 0..40 {
        fs::write(
            p(&format!("wide/f{i:03}")),
            content(100 + i, (i * 37) as usize),
        )
        .expect("write wide");
    }
    // Sparse: 20 MiB with data only at 0 and at 15 MiB.
    let f = fs::File::create(p("sparse.img")).expect("sparse");
    f.set_len(20 << 20).expect("set_len");
    use std::os::unix::fs::FileExt;
    f.write_all_at(&content(77, 4096), 0).expect("write");
    f.write_all_at(&content(78, 5000), 15 << 20).expect("write");
    drop(f);
    fs::write(p("a/linked"), content(55, 3000)).expect("write");
    fs::hard_link(p("a/linked"), p("a/b/linked-too")).expect("hard link");
    symlink("../tiny.txt", p("a/to-tiny")).expect("symlink");
    symlink("/nonexistent/target", p("dangling")).expect("symlink");
    let fifo = std::ffi::CString::new(p("fifo").as_os_str().as_bytes()).expect("cstring");
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0, "mkfifo");
    fs::write(p("ro.txt"), b"read only").expect("write");
    fs::set_permissions(p("ro.txt"), fs::Permissions::from_mode(0o444)).expect("chmod");
    fs::write(p("secret"), b"root only").expect("write");
    fs::set_permissions(p("secret"), fs::Permissions::from_mode(0o600)).expect("chmod");
    fs::write(root.join(OsStr::from_bytes(NON_UTF8_NAME)), b"latin-1 name").expect("non-utf8 name");
    set_xattr(&p("tiny.txt"), "user.color", b"blue");
    set_xattr(&p("a/page"), "user.kaiso.test", &content(9, 300));
    set_xattr(&p("a"), "user.dir", b"on a directory");
    if Command::new("setfacl")
        .args(["-m", "u:1234:r--"])
        .arg(p("a/page"))
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
    {
        let _ = Command::new("setfacl")
            .args(["-d", "-m", "g:4321:rx"])
            .arg(p("a/b"))
            .status();
    }
    // Distinct, sub-second mtimes so time comparisons mean something.
    let t = std::ffi::CString::new(p("zero").as_os_str().as_bytes()).expect("cstring");
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 123_456_789,
        },
        libc::timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 987_654_321,
        },
    ];
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, t.as_ptr(), times.as_ptr(), 0) },
        0
    );
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("cstring");
    let n = std::ffi::CString::new(name).expect("cstring");
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {name} on {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

/// Every path under `root` (relative, as bytes), directories before their contents.
pub fn walk(root: &Path) -> Vec<(Vec<u8>, fs::Metadata)> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let mut names: Vec<_> = fs::read_dir(root.join(&rel))
            .expect("read_dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        names.sort();
        for name in names {
            let r = rel.join(&name);
            let m = fs::symlink_metadata(root.join(&r)).expect("lstat");
            if m.is_dir() {
                stack.push(r.clone());
            }
            out.push((r.as_os_str().as_bytes().to_vec(), m));
        }
    }
    out
}

pub fn mtime_ns(m: &fs::Metadata) -> (i64, u32) {
    (m.mtime(), m.mtime_nsec() as u32)
}

use kaiso_store::migrate::{FileKind, Source, SourceErrorKind, SourcePath};

pub fn kind_of(m: &fs::Metadata) -> FileKind {
    use std::os::unix::fs::FileTypeExt;
    let t = m.file_type();
    if t.is_dir() {
        FileKind::Directory
    } else if t.is_symlink() {
        FileKind::Symlink
    } else if t.is_fifo() {
        FileKind::Fifo
    } else if t.is_socket() {
        FileKind::Socket
    } else if t.is_char_device() {
        FileKind::CharDevice
    } else if t.is_block_device() {
        FileKind::BlockDevice
    } else {
        FileKind::Regular
    }
}

/// Checks that a source with Unix semantics (POSIX path, NFSv3) returns exactly what is
/// on disk: every entry of every directory with kind, mode, owner, size, link count,
/// inode number and mtime; stat of each; every byte of every regular file (whole, and
/// from an unaligned offset); every symlink target. Returns the number of objects checked.
pub fn check_exact(source: &dyn Source, root: &Path) -> usize {
    let disk = walk(root);
    let mut checked = 0;
    // Directory listings.
    let mut dirs: Vec<Vec<u8>> = vec![Vec::new()];
    dirs.extend(
        disk.iter()
            .filter(|(_, m)| m.is_dir())
            .map(|(p, _)| p.clone()),
    );
    for d in &dirs {
        let sp = SourcePath::parse(d).expect("path");
        let mut listed = source
            .read_dir(&sp)
            .unwrap_or_else(|e| panic!("read_dir {sp}: {e}"));
        listed.sort_by(|a, b| a.name.cmp(&b.name));
        let mut expect: Vec<(Vec<u8>, &fs::Metadata)> = disk
            .iter()
            .filter(|(p, _)| SourcePath::parse(p).expect("path").parent().as_ref() == Some(&sp))
            .map(|(p, m)| {
                (
                    SourcePath::parse(p)
                        .expect("path")
                        .file_name()
                        .expect("name")
                        .to_vec(),
                    m,
                )
            })
            .collect();
        expect.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<&[u8]> = listed.iter().map(|e| e.name.as_slice()).collect();
        let want: Vec<&[u8]> = expect.iter().map(|e| e.0.as_slice()).collect();
        assert_eq!(names, want, "entries of {sp}");
        // The listing with the directory's own attributes lists the same entries, and
        // the attributes are the directory's (what the engine restores its times from).
        let (mut again, own) = source
            .read_dir_with_attr(&sp)
            .unwrap_or_else(|e| panic!("read_dir_with_attr {sp}: {e}"));
        again.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(again, listed, "read_dir_with_attr entries of {sp}");
        if let Some(own) = own {
            let m = fs::symlink_metadata(root.join(std::ffi::OsStr::from_bytes(d)))
                .expect("directory metadata");
            assert_attr_matches(&own, &m, &format!("{sp} (its own attributes)"));
        }
        for (entry, (_, m)) in listed.iter().zip(&expect) {
            assert_attr_matches(
                &entry.attr,
                m,
                &format!("{sp}/{}", String::from_utf8_lossy(&entry.name)),
            );
        }
    }
    for (rel, m) in &disk {
        let sp = SourcePath::parse(rel).expect("path");
        let attr = source
            .stat(&sp)
            .unwrap_or_else(|e| panic!("stat {sp}: {e}"));
        assert_attr_matches(&attr, m, &sp.to_string());
        match kind_of(m) {
            FileKind::Regular => {
                let want = fs::read(root.join(OsStr::from_bytes(rel))).expect("read disk");
                let got = source
                    .read(&sp, 0, want.len() + 4096)
                    .unwrap_or_else(|e| panic!("read {sp}: {e}"));
                assert!(
                    got == want,
                    "content of {sp}: {} bytes read, {} on disk",
                    got.len(),
                    want.len()
                );
                if want.len() > 10 {
                    let off = want.len() / 3 + 1;
                    let part = source
                        .read(&sp, off as u64, want.len() - off - 3)
                        .expect("partial read");
                    assert!(part == want[off..want.len() - 3], "partial read of {sp}");
                }
                let past = source
                    .read(&sp, want.len() as u64 + 10, 100)
                    .expect("read past EOF");
                assert!(past.is_empty(), "read past EOF of {sp} returned data");
            }
            FileKind::Symlink => {
                let want = fs::read_link(root.join(OsStr::from_bytes(rel))).expect("readlink");
                let got = source
                    .read_link(&sp)
                    .unwrap_or_else(|e| panic!("readlink {sp}: {e}"));
                assert_eq!(got, want.as_os_str().as_bytes(), "symlink target of {sp}");
            }
            _ => {}
        }
        checked += 1;
    }
    // Clear errors for bad input.
    let missing = SourcePath::parse(b"no/such/file").expect("path");
    assert_eq!(
        source.stat(&missing).expect_err("missing").kind,
        SourceErrorKind::NotFound
    );
    let dir = SourcePath::parse(b"a").expect("path");
    assert!(
        source.read(&dir, 0, 10).is_err(),
        "read of a directory must fail"
    );
    checked
}

pub fn assert_attr_matches(a: &kaiso_store::migrate::SourceAttr, m: &fs::Metadata, what: &str) {
    assert_eq!(a.kind, kind_of(m), "kind of {what}");
    assert_eq!(a.perm, m.mode() & 0o7777, "mode of {what}");
    assert_eq!((a.uid, a.gid), (m.uid(), m.gid()), "owner of {what}");
    if !m.is_dir() {
        assert_eq!(a.size, m.size(), "size of {what}");
    }
    assert_eq!(u64::from(a.nlink), m.nlink(), "nlink of {what}");
    assert_eq!(a.ino, m.ino(), "inode number of {what}");
    assert_eq!(
        (a.mtime.secs, a.mtime.nanos),
        mtime_ns(m),
        "mtime of {what}"
    );
    if matches!(a.kind, FileKind::CharDevice | FileKind::BlockDevice) {
        assert_eq!(
            a.rdev,
            (libc::major(m.rdev()), libc::minor(m.rdev())),
            "rdev of {what}"
        );
    }
}

/// Runs `f` on a thread; fails if it does not return within `limit`. Returns its result
/// and how long it took.
pub fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let t = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => (v, t.elapsed()),
        Err(_) => panic!("{what} did not return within {limit:?}"),
    }
}

/// Waits (at most 60 s, polling every `poll`) until the migration has copied at least
/// `files` files and still has work left: the moment to kill its server mid-migration.
pub fn wait_for_files_done(
    m: &kaiso_store::migrate::Migration,
    store: &kaiso_store::Store,
    files: u64,
    poll: Duration,
) {
    let start = Instant::now();
    loop {
        let p = m.progress(store).unwrap();
        if p.files_done >= files {
            assert!(p.remaining > 0, "finished before the kill: {p:?}");
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no progress: {p:?}"
        );
        std::thread::sleep(poll);
    }
}

/// A client's read of the first 4 KiB of the file at `names` below the store's root, as
/// the FUSE face does it (lookups, open, read, release); the errno if any step fails.
pub fn client_read(store: &kaiso_store::Store, names: &[&str]) -> Result<Vec<u8>, i32> {
    let mut ino = kaiso_store::ROOT_INO;
    for c in names {
        let a = store.lookup(ino, OsStr::new(c)).map_err(|e| e.errno())?;
        ino = a.ino;
    }
    let o = store
        .open_file(ino, libc::O_RDONLY, false)
        .map_err(|e| e.errno())?;
    let r = store.read(o.fh, 0, 4096).map_err(|e| e.errno());
    let _ = store.release(o.fh);
    r
}

/// A source wrapper for tests that act inside the engine's reads of file data.
pub mod store_client;

/// A loop-mounted ext4 of a test's own.
pub mod loop_ext4;

pub mod read_hook {
    use std::sync::Arc;

    use kaiso_store::migrate::{
        Source, SourceAcl, SourceAttr, SourceEntry, SourceFeatures, SourcePath, SourceResult,
        SourceStream,
    };

    /// Test code run inside a source's data reads, to hold, slow down or race them.
    pub trait ReadHook: Send + Sync {
        /// Called at the start of every `read`, `read_with_attr` and `read_into`.
        fn before_read(&self);
    }

    /// A [`Source`] that hands every call to `inner`, running `hook` first in the data reads.
    pub struct HookedSource<H> {
        inner: Box<dyn Source>,
        hook: Arc<H>,
    }

    impl<H: ReadHook> HookedSource<H> {
        pub fn new(inner: Box<dyn Source>, hook: Arc<H>) -> Box<Self> {
            Box::new(HookedSource { inner, hook })
        }
    }

    impl<H: ReadHook> Source for HookedSource<H> {
        fn describe(&self) -> String {
            self.inner.describe()
        }
        fn features(&self) -> SourceFeatures {
            self.inner.features()
        }
        fn stat(&self, p: &SourcePath) -> SourceResult<SourceAttr> {
            self.inner.stat(p)
        }
        fn read_dir(&self, p: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
            self.inner.read_dir(p)
        }
        fn read_dir_with_attr(
            &self,
            p: &SourcePath,
        ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
            self.inner.read_dir_with_attr(p)
        }
        fn read(&self, p: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
            self.hook.before_read();
            self.inner.read(p, offset, len)
        }
        fn read_with_attr(
            &self,
            p: &SourcePath,
            offset: u64,
            len: usize,
        ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
            self.hook.before_read();
            self.inner.read_with_attr(p, offset, len)
        }
        fn read_into(
            &self,
            p: &SourcePath,
            offset: u64,
            buf: &mut [u8],
        ) -> SourceResult<(usize, Option<SourceAttr>)> {
            self.hook.before_read();
            self.inner.read_into(p, offset, buf)
        }
        fn read_link(&self, p: &SourcePath) -> SourceResult<Vec<u8>> {
            self.inner.read_link(p)
        }
        fn xattrs(&self, p: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
            self.inner.xattrs(p)
        }
        fn acl(&self, p: &SourcePath) -> SourceResult<SourceAcl> {
            self.inner.acl(p)
        }
        fn streams(&self, p: &SourcePath) -> SourceResult<Vec<SourceStream>> {
            self.inner.streams(p)
        }
        fn read_stream(&self, p: &SourcePath, s: &str, o: u64, l: usize) -> SourceResult<Vec<u8>> {
            self.inner.read_stream(p, s, o, l)
        }
    }
}
