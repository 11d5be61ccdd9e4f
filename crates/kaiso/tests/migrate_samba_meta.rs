//! Windows metadata of an SMB source through `kaiso migrate`, seen by SMB clients of a
//! second Samba that exports the FUSE mount (`vfs objects = acl_xattr`, `store dos
//! attributes = yes`): DOS attributes (hidden, system), the creation time and an NT ACL
//! set with `smbcacls` (one user denied, another granted) are the source's, stubs are
//! offline besides, the denied user is refused, and after `finish` the same holds with
//! no `user.kaiso.*` EA left.
//!
//! `smbcacls` only talks to port 445, so the test runs its two smbds in a private network
//! namespace of the test thread (the source on 127.0.0.1:445, the mount's on
//! 127.0.0.2:445); everything it starts inherits the namespace. The ACEs name the
//! "Unix User" SIDs (S-1-22-1-UID) of `daemon` and `bin`, which every Samba maps the
//! same way, so the two standalone servers agree on who is who.

mod common;

use common::migrate_daemon::Daemon;
use common::{Store, StoreSpec, kaiso_bin};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PASSWORD: &str = "Kaiso-meta-1pw";
/// Denied every access to `secret.txt` by its ACL.
const DENIED_USER: &str = "daemon";
/// Granted read access to `secret.txt` by its ACL.
const GRANTED_USER: &str = "bin";
const SECRET_ACL: &str = "REVISION:1,OWNER:S-1-22-1-0,GROUP:S-1-22-2-0,\
     ACL:S-1-22-1-1:DENIED/0x0/FULL,ACL:S-1-22-1-2:ALLOWED/0x0/READ,\
     ACL:S-1-22-1-0:ALLOWED/0x0/FULL";
const FILE_ATTRIBUTE_OFFLINE: u32 = 0x1000;
const FILE_ATTRIBUTE_NORMAL: u32 = 0x80;
const FILE_ATTRIBUTE_HIDDEN: u32 = 0x2;

/// The attributes an SMB client sees for a file with `attrs` once it is offline (NORMAL
/// means "no other bit": it goes when OFFLINE comes).
fn offline(attrs: u32) -> u32 {
    (attrs & !FILE_ATTRIBUTE_NORMAL) | FILE_ATTRIBUTE_OFFLINE
}

/// Whether the programs are installed (in CI, where scripts/deps/*.list is installed
/// first, a missing one is a failure).
fn programs_present(programs: &[&str]) -> bool {
    for p in programs {
        let found = std::env::var_os("PATH")
            .is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(p).is_file()));
        if !found {
            assert!(
                std::env::var_os("CI").is_none(),
                "{p} is missing (scripts/deps/cli.list)"
            );
            eprintln!("notice: {p} absent; test not run");
            return false;
        }
    }
    true
}

fn run(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Moves the calling thread (and whatever it starts from now on) into a new network
/// namespace with loopback up and 127.0.0.2 on it. Needs root.
fn private_network() -> Result<(), String> {
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(format!(
            "unshare(CLONE_NEWNET): {}",
            std::io::Error::last_os_error()
        ));
    }
    for args in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", "127.0.0.2/8", "dev", "lo"],
    ] {
        let o = run(Command::new("ip").args(args), Duration::from_secs(10));
        if !o.status.success() {
            return Err(format!("ip {args:?}: {}", text(&o)));
        }
    }
    Ok(())
}

/// smbd on `ip`:445 sharing `path` as `share`, with Samba's own places for Windows
/// metadata, and the given users (Unix accounts) in its password database.
struct Smbd {
    child: Option<Child>,
    dir: tempfile::TempDir,
    ip: &'static str,
    share: &'static str,
}

impl Smbd {
    fn start(ip: &'static str, share: &'static str, path: &Path, users: &[&str]) -> Smbd {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display().to_string();
        for sub in ["private", "lock", "state", "cache", "pid", "ncalrpc", "log"] {
            fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        let conf = dir.path().join("smb.conf");
        fs::write(
            &conf,
            format!(
                "[global]\n  log level = 1\n  smb ports = 445\n  interfaces = {ip}/8\n\
                 bind interfaces only = yes\n  private dir = {d}/private\n\
                 lock directory = {d}/lock\n  state directory = {d}/state\n\
                 cache directory = {d}/cache\n  pid directory = {d}/pid\n\
                 ncalrpc dir = {d}/ncalrpc\n  log file = {d}/log/log.%m\n\
                 passdb backend = tdbsam:{d}/private/passdb.tdb\n\
                 server role = standalone server\n  disable netbios = yes\n\
                 load printers = no\n  printcap name = /dev/null\n  disable spoolss = yes\n\
                 server min protocol = SMB2_02\n  ea support = yes\n\
                 vfs objects = acl_xattr\n  store dos attributes = yes\n\
                 [{share}]\n  path = {}\n  read only = no\n",
                path.display()
            ),
        )
        .unwrap();
        for user in users {
            let mut p = Command::new("smbpasswd")
                .arg("-c")
                .arg(&conf)
                .args(["-a", "-s", user])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("smbpasswd");
            use std::io::Write;
            p.stdin
                .take()
                .unwrap()
                .write_all(format!("{PASSWORD}\n{PASSWORD}\n").as_bytes())
                .unwrap();
            let o = p.wait_with_output().unwrap();
            assert!(o.status.success(), "smbpasswd -a {user}: {}", text(&o));
        }
        // Its own process group: smbd signals its group when it shuts down.
        let child = Command::new("smbd")
            .process_group(0)
            .args(["--foreground", "--no-process-group", "-s"])
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn smbd");
        let s = Smbd {
            child: Some(child),
            dir,
            ip,
            share,
        };
        let addr = format!("{ip}:445").parse().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "smbd on {ip} did not listen: {}",
                fs::read_to_string(s.dir.path().join("log/log.smbd")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn unc(&self) -> String {
        format!("//{}/{}", self.ip, self.share)
    }

    /// `smbclient -c COMMANDS` as `user`.
    fn client(&self, user: &str, commands: &str) -> Output {
        run(
            Command::new("smbclient")
                .arg(self.unc())
                .arg("-U")
                .arg(format!("{user}%{PASSWORD}"))
                .arg("-c")
                .arg(commands),
            Duration::from_secs(60),
        )
    }

    #[track_caller]
    fn client_ok(&self, user: &str, commands: &str) -> String {
        let o = self.client(user, commands);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success() && !out.contains("NT_STATUS_"),
            "smbclient {commands:?} as {user} on {}: {}",
            self.ip,
            text(&o)
        );
        out
    }

    /// `smbcacls` as root; `extra` e.g. `["-S", ACL]`, or nothing to show the ACL.
    #[track_caller]
    fn cacls(&self, file: &str, extra: &[&str]) -> String {
        let o = run(
            Command::new("smbcacls")
                .arg(self.unc())
                .arg(file)
                .args(["--numeric", "-U"])
                .arg(format!("root%{PASSWORD}"))
                .args(extra),
            Duration::from_secs(60),
        );
        assert!(
            o.status.success(),
            "smbcacls {file} {extra:?}: {}",
            text(&o)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The `create_time:` and `attributes:` lines of `allinfo FILE`.
    #[track_caller]
    fn dos_info(&self, file: &str) -> (String, u32) {
        let out = self.client_ok("root", &format!("allinfo {file}"));
        let line = |key: &str| {
            out.lines()
                .find(|l| l.starts_with(key))
                .unwrap_or_else(|| panic!("no {key} for {file}: {out}"))
                .to_string()
        };
        let attrs = line("attributes:");
        let hex = attrs
            .rsplit('(')
            .next()
            .unwrap()
            .trim_end_matches(')')
            .trim();
        let bits = u32::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("{attrs}"));
        (line("create_time:"), bits)
    }
}

impl Drop for Smbd {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn kaiso_migrate(args: &[&OsStr], limit: Duration) -> Output {
    run(
        Command::new(kaiso_bin())
            .env("KAISO_SMB_PASSWORD", PASSWORD)
            .arg("migrate")
            .args(args),
        limit,
    )
}

const FILES: [&str; 4] = ["hidden.txt", "born.txt", "secret.txt", "plain.txt"];

/// `secret.txt` through the mount's Samba: the source's ACL, enforced.
#[track_caller]
fn assert_same_acl(source_acl: &str, mount: &Smbd) {
    assert_eq!(
        mount.cacls("secret.txt", &[]),
        source_acl,
        "secret.txt: ACL"
    );
    let denied = mount.client(DENIED_USER, "get secret.txt /dev/null");
    assert!(
        String::from_utf8_lossy(&denied.stdout).contains("NT_STATUS_ACCESS_DENIED")
            || String::from_utf8_lossy(&denied.stderr).contains("NT_STATUS_ACCESS_DENIED"),
        "{DENIED_USER} must be refused: {}",
        text(&denied)
    );
    let got = mount.client_ok(GRANTED_USER, "get secret.txt /dev/stdout");
    assert!(
        got.contains("secret data"),
        "{GRANTED_USER} reads it: {got}"
    );
}

#[test]
fn windows_metadata_of_an_smb_source_shows_through_samba_on_the_mount() {
    fuse_or_skip!();
    if !programs_present(&[
        "smbd",
        "smbpasswd",
        "smbclient",
        "smbcacls",
        "ip",
        "getfattr",
    ]) {
        return;
    }
    if let Err(e) = private_network() {
        assert!(std::env::var_os("CI").is_none(), "{e}");
        eprintln!("notice: no private network namespace ({e}); test not run");
        return;
    }
    let store = Store::new("migsmbmeta", StoreSpec::tiers(1).allow_other());
    let src = store.root.join("src");
    fs::create_dir_all(&src).unwrap();
    for f in FILES {
        fs::write(src.join(f), format!("{f}: not secret\n")).unwrap();
    }
    fs::write(src.join("secret.txt"), "secret data\n").unwrap();
    // A file big enough to stay partly on the source while the others are read.
    fs::write(src.join("big.bin"), vec![7u8; 3 << 20]).unwrap();

    let source = Smbd::start("127.0.0.1", "src", &src, &["root"]);
    source.client_ok("root", "setmode hidden.txt +hs");
    source.client_ok("root", "setea plain.txt colour blue");
    source.client_ok("root", "utimes born.txt 2019:04:17-18:40:00 -1 -1 -1");
    source.cacls("secret.txt", &["-S", SECRET_ACL]);
    let source_info: Vec<(String, u32)> = FILES.iter().map(|f| source.dos_info(f)).collect();
    let source_acl = source.cacls("secret.txt", &[]);
    assert!(source_info[0].1 & 0x6 == 0x6, "{source_info:?}");
    assert!(source_info[1].0.contains("2019"), "{source_info:?}");
    assert!(source_acl.contains("S-1-22-1-1:1/"), "{source_acl}");

    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    let url = "smb://root@127.0.0.1:445/src";
    let daemon = Daemon::start_env(
        &[
            OsStr::new(url),
            cfg.as_os_str(),
            OsStr::new("--mount"),
            mnt.as_os_str(),
            OsStr::new("--paused"),
        ],
        &[("KAISO_SMB_PASSWORD", PASSWORD)],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let mount = Smbd::start("127.0.0.2", "m", &mnt, &["root", DENIED_USER, GRANTED_USER]);

    // Stubs: the source's metadata, plus offline.
    for (file, (created, attrs)) in FILES.iter().zip(&source_info) {
        let (m_created, m_attrs) = mount.dos_info(file);
        assert_eq!(&m_created, created, "{file} (stub): creation time");
        assert_eq!(
            m_attrs,
            offline(*attrs),
            "{file} (stub): attributes {m_attrs:#x}, source {attrs:#x}"
        );
    }
    assert_ne!(mount.dos_info("big.bin").1 & FILE_ATTRIBUTE_OFFLINE, 0);
    // The ACL is the source's and enforced; the granted read completes the file: its
    // own attributes again, nothing synthesised. The others stay offline.
    assert_same_acl(&source_acl, &mount);
    assert_eq!(mount.dos_info("secret.txt"), source_info[2]);
    assert_eq!(
        mount.dos_info("hidden.txt"),
        (source_info[0].0.clone(), offline(source_info[0].1))
    );

    // A client's attribute change on an offline file (Samba rewrites user.DOSATTRIB):
    // kept, with OFFLINE only as long as the file is a stub.
    mount.client_ok("root", "setmode plain.txt +h");
    let plain = (source_info[3].1 & !FILE_ATTRIBUTE_NORMAL) | FILE_ATTRIBUTE_HIDDEN;
    assert_eq!(mount.dos_info("plain.txt").1, offline(plain));

    let o = kaiso_migrate(
        &[OsStr::new("resume"), cfg.as_os_str()],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = kaiso_migrate(
        &[
            OsStr::new("finish"),
            cfg.as_os_str(),
            OsStr::new("--wait"),
            OsStr::new("120s"),
        ],
        Duration::from_secs(180),
    );
    assert!(o.status.success(), "{}\n{}", text(&o), daemon.log_text());

    // After finish: the same, nothing offline, and no kaiso EA for SMB clients.
    let finished: Vec<(String, u32)> = FILES.iter().map(|f| mount.dos_info(f)).collect();
    let mut want = source_info.clone();
    want[3].1 = plain;
    assert_eq!(finished, want);
    assert_same_acl(&source_acl, &mount);
    assert_eq!(mount.dos_info("big.bin").1 & FILE_ATTRIBUTE_OFFLINE, 0);
    for f in FILES {
        let o = mount.client("root", &format!("geteas {f}"));
        let eas = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success() || eas.contains("NT_STATUS_NO_EAS_ON_FILE"),
            "geteas {f}: {}",
            text(&o)
        );
        assert!(!eas.contains("kaiso"), "{f}: {eas}");
        // The source's own EA is there: the listing shows EAs through the mount.
        assert_eq!(eas.contains("colour"), f == "plain.txt", "{f}: {eas}");
        let names = xattr_names(&mnt.join(f));
        assert!(
            !names.iter().any(|n| n.starts_with("user.kaiso.")),
            "{f}: {names:?}"
        );
    }
    drop(mount);
    drop(daemon);
    drop(source);
}

fn xattr_names(p: &Path) -> Vec<String> {
    let o = run(
        Command::new("getfattr")
            .args(["--absolute-names", "-d", "-m", "-"])
            .arg(p),
        Duration::from_secs(10),
    );
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(n, _)| n.to_string()))
        .collect()
}
