//! The NFSv3 source against a real nfs-ganesha (FSAL_VFS) started by the test, with
//! libnfs-utils (nfs-ls, nfs-cat) as an independent client to cross-check the server.

mod common;

use std::os::unix::fs::MetadataExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kaiso_source::{NfsConfig, NfsSource};
use kaiso_store::migrate::{
    CrawlState, Crawler, Migration, MigrationConfig, Migrations, Source, SourceErrorKind,
    SourcePath,
};
use kaiso_store::{Store, StoreConfig};

#[test]
fn nfs_source_against_ganesha() {
    if !common::have(&["ganesha.nfsd", "rpcbind", "nfs-ls", "nfs-cat"]) {
        return;
    }
    let export = tempfile::tempdir().expect("tempdir");
    common::build_tree(export.path());
    let server = common::Ganesha::start(export.path());

    // Independent client: Ganesha::start already waited until libnfs's nfs-ls could
    // mount and list the export, so the server really serves it.
    let source = NfsSource::connect(server.config()).expect("connect to ganesha");
    let n = common::check_exact(&source, export.path());
    assert!(n > 60, "only {n} objects checked");

    // Non-UTF-8 names are opaque bytes in NFSv3 and round-trip.
    let odd = SourcePath::root().join(common::NON_UTF8_NAME).unwrap();
    assert_eq!(source.read(&odd, 0, 100).unwrap(), b"latin-1 name");
    assert!(source.describe().starts_with("nfs://127.0.0.1:"));

    // A 10 MiB-class fetch is served as 1 MiB READs in flight on several connections.
    let sparse = SourcePath::parse(b"sparse.img").unwrap();
    let t = Instant::now();
    let data = source.read(&sparse, 0, 20 << 20).unwrap();
    eprintln!("NFS read of 20 MiB in {:?}", t.elapsed());
    assert_eq!(data.len(), 20 << 20);
    assert_eq!(&data[..4096], &common::content(77, 4096)[..]);
    assert_eq!(
        &data[15 << 20..(15 << 20) + 5000],
        &common::content(78, 5000)[..]
    );
    assert!(
        data[4096..15 << 20].iter().all(|b| *b == 0),
        "hole reads as zeros"
    );

    // Concurrent callers share the pool.
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    let p = SourcePath::parse(b"a/b/c/big.bin").unwrap();
                    source.read(&p, 0, 4 << 20).unwrap()
                })
            })
            .collect();
        let want = std::fs::read(export.path().join("a/b/c/big.bin")).unwrap();
        for h in hs {
            assert!(h.join().unwrap() == want);
        }
    });

    // READDIRPLUS brings the directory's own attributes along (no GETATTR per listing).
    let (_, own) = source
        .read_dir_with_attr(&SourcePath::parse(b"a").unwrap())
        .unwrap();
    assert_eq!(
        own.map(|a| a.ino),
        Some(std::fs::metadata(export.path().join("a")).unwrap().ino())
    );

    // A directory inside the export migrated as the share: its paths are relative to it.
    let mut cfg = server.config();
    cfg.subdir = Some("a/b".into());
    let sub = NfsSource::connect(cfg).expect("connect to a subdirectory of the export");
    assert!(
        sub.describe().ends_with("?subdir=a/b"),
        "{}",
        sub.describe()
    );
    let n = common::check_exact(&sub, &export.path().join("a/b"));
    assert!(n > 2, "only {n} objects checked below a/b");
    let mut cfg = server.config();
    cfg.subdir = Some("no/such/dir".into());
    let e = NfsSource::connect(cfg).err().expect("missing subdirectory");
    assert_eq!(e.kind, SourceErrorKind::NotFound, "{e}");

    // Permission denied for an unprivileged AUTH_UNIX identity on a 0600 root file.
    let mut cfg = server.config();
    cfg.uid = 65534;
    cfg.gid = 65534;
    let nobody = NfsSource::connect(cfg).expect("connect as nobody");
    let e = nobody
        .read(&SourcePath::parse(b"secret").unwrap(), 0, 10)
        .unwrap_err();
    assert_eq!(e.kind, SourceErrorKind::PermissionDenied, "{e}");
    assert_eq!(
        nobody
            .read(&SourcePath::parse(b"tiny.txt").unwrap(), 0, 10)
            .unwrap()
            .len(),
        1
    );

    // A source that changes although it should be read-only: a vanished file is reported.
    let gone = SourcePath::parse(b"a/b/c/d/deep.txt").unwrap();
    source.stat(&gone).unwrap();
    std::fs::remove_file(export.path().join("a/b/c/d/deep.txt")).unwrap();
    let e = source.read(&gone, 0, 10).unwrap_err();
    assert!(
        matches!(e.kind, SourceErrorKind::Changed | SourceErrorKind::NotFound),
        "{e}"
    );

    // Ports found through a portmapper (GETPORT for MOUNT v3 and NFS v3 over TCP, then
    // MNT, all over the source's own RPC code). The shared rpcbind may hold another test's
    // ganesha registrations, so a portmapper answering with this server's ports stands in.
    let pmap = PortmapperFor::start(server.mount_port, server.nfs_port);
    let mut cfg = server.config();
    cfg.mount_port = None;
    cfg.nfs_port = None;
    cfg.portmapper_port = pmap.port;
    let via_pmap = NfsSource::connect(cfg).expect("connect through the portmapper");
    assert!(
        via_pmap
            .describe()
            .starts_with(&format!("nfs://127.0.0.1:{}", server.nfs_port)),
        "{}",
        via_pmap.describe()
    );
    assert_eq!(via_pmap.read(&odd, 0, 100).unwrap(), b"latin-1 name");
    assert_eq!(pmap.asked(), vec![(100_005, 3, 6), (100_003, 3, 6)]);

    // Wrong export name and unreachable server give clear errors.
    let mut bad = server.config();
    bad.export = "/no/such/export".into();
    let e = NfsSource::connect(bad).err().expect("bad export");
    assert!(
        matches!(
            e.kind,
            SourceErrorKind::PermissionDenied
                | SourceErrorKind::Unreachable
                | SourceErrorKind::NotFound
        ),
        "{e}"
    );
    drop(server);
    let mut dead = NfsConfig::new("127.0.0.1", "/kaiso_src");
    dead.nfs_port = Some(common::free_port());
    dead.mount_port = Some(common::free_port());
    let e = NfsSource::connect(dead).err().expect("nothing listens");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
}

/// A portmapper (RFC 1833 version 2, TCP) that answers GETPORT from a fixed table
/// (MOUNT and NFS to the given ports, anything else 0: not registered) and records the
/// (program, version, protocol) asked for.
struct PortmapperFor {
    port: u16,
    asked: std::sync::Arc<std::sync::Mutex<Vec<(u32, u32, u32)>>>,
}

impl PortmapperFor {
    fn start(mount_port: u16, nfs_port: u16) -> Self {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = asked.clone();
        // One connection (the source asks both questions on it), then the thread ends.
        std::thread::spawn(move || {
            let Ok((mut conn, _)) = listener.accept() else {
                return;
            };
            conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            let word = |b: &[u8], i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
            loop {
                let mut mark = [0u8; 4];
                if conn.read_exact(&mut mark).is_err() {
                    return;
                }
                let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
                let mut call = vec![0u8; len];
                conn.read_exact(&mut call).unwrap();
                // xid, CALL, rpcvers, prog, vers, proc, then credential and verifier.
                let (xid, proc) = (word(&call, 0), word(&call, 20));
                assert_eq!(
                    (word(&call, 12), word(&call, 16), proc),
                    (100_000, 2, 3),
                    "portmapper v2 GETPORT"
                );
                let cred_len = word(&call, 28) as usize;
                let verf_at = 32 + cred_len.div_ceil(4) * 4;
                let args = verf_at + 8 + (word(&call, verf_at + 4) as usize).div_ceil(4) * 4;
                let (prog, vers, prot) = (
                    word(&call, args),
                    word(&call, args + 4),
                    word(&call, args + 8),
                );
                log.lock().unwrap().push((prog, vers, prot));
                let answer = match (prog, vers, prot) {
                    (100_005, 3, 6) => u32::from(mount_port),
                    (100_003, 3, 6) => u32::from(nfs_port),
                    _ => 0,
                };
                let mut reply = Vec::new();
                for w in [0x8000_0000 | 28, xid, 1, 0, 0, 0, 0, answer] {
                    reply.extend_from_slice(&u32::to_be_bytes(w));
                }
                conn.write_all(&reply).unwrap();
            }
        });
        Self { port, asked }
    }

    fn asked(&self) -> Vec<(u32, u32, u32)> {
        self.asked.lock().unwrap().clone()
    }
}

/// The process id ganesha wrote to its pid file, checked to be ganesha.
fn ganesha_pid(server: &common::Ganesha) -> i32 {
    let pidfile = server.dir.path().join("ganesha.pid");
    let start = Instant::now();
    loop {
        if let Some(pid) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "ganesha.nfsd" {
                return pid;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no ganesha pid in {pidfile:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(pid: i32, sig: i32) {
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0, "kill -{sig} {pid}");
}

/// Waits until every thread of `pid` is in group stop: SIGSTOP takes effect as each
/// thread is next scheduled, and a call sent before that may still be answered.
fn wait_all_threads_stopped(pid: i32) {
    let start = Instant::now();
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("ganesha threads");
        let running: Vec<String> = tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
            // The state follows the parenthesised command name, which may hold spaces.
            .filter_map(|stat| stat[stat.rfind(')')? + 2..].chars().next())
            .filter(|state| *state != 'T')
            .map(|state| state.to_string())
            .collect();
        if running.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "ganesha threads not stopped: states {running:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends SIGCONT when dropped, so a failing assertion never leaves ganesha stopped.
struct ContinueOnDrop(i32);

impl Drop for ContinueOnDrop {
    fn drop(&mut self) {
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A ganesha restarted by the test on the killed one's configuration (same ports, same
/// export id, so its file handles stay valid), and the rpcbind started for it if none
/// was running; both killed and reaped when dropped.
struct Restarted {
    ganesha: Child,
    rpcbind: Option<Child>,
}

/// How many times ganesha logged finishing its start (after registering with rpcbind).
fn starts_logged(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches("NFS SERVER INITIALIZED")
        .count()
}

impl Restarted {
    /// Starts ganesha and waits until it logs that it is initialized and its NFS port
    /// accepts. Ganesha exits if it cannot register with rpcbind; when tests of another
    /// process share the machine, the rpcbind it used may have been stopped by them, so
    /// a start that exits early is retried with an rpcbind of its own if none listens.
    fn start(server: &common::Ganesha) -> Self {
        let dir = server.dir.path();
        let log = dir.join("ganesha.log");
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut rpcbind = None;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let before = starts_logged(&log);
            let mut ganesha = Command::new("ganesha.nfsd")
                .arg("-F")
                .arg("-f")
                .arg(dir.join("ganesha.conf"))
                .arg("-L")
                .arg(&log)
                .arg("-N")
                .arg("NIV_EVENT")
                .arg("-p")
                .arg(dir.join("ganesha.pid"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("restart ganesha.nfsd");
            loop {
                if starts_logged(&log) > before
                    && std::net::TcpStream::connect(("127.0.0.1", server.nfs_port)).is_ok()
                {
                    return Restarted { ganesha, rpcbind };
                }
                if let Ok(Some(status)) = ganesha.try_wait() {
                    eprintln!("ganesha restart {attempt} exited ({status}); again");
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = ganesha.kill();
                    let _ = ganesha.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(
                Instant::now() < deadline,
                "ganesha did not come back within 30 s ({attempt} starts); log {}",
                log.display()
            );
            if rpcbind
                .as_mut()
                .is_some_and(|c: &mut Child| c.try_wait().ok().flatten().is_some())
            {
                rpcbind = None; // lost the race for port 111 to another rpcbind
            }
            if rpcbind.is_none() && std::net::TcpStream::connect(("127.0.0.1", 111)).is_err() {
                std::fs::create_dir_all("/run/rpcbind").expect("create /run/rpcbind");
                rpcbind = Some(
                    Command::new("rpcbind")
                        .arg("-f")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .expect("start rpcbind"),
                );
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Restarted {
    fn drop(&mut self) {
        for child in std::iter::once(&mut self.ganesha).chain(self.rpcbind.as_mut()) {
            common::stop(child);
        }
    }
}

/// A ganesha that stops answering (SIGSTOP) makes a call fail as unreachable within the
/// configured RPC timeout, naming the server, and the next call after it answers again
/// (SIGCONT) works. A ganesha killed in the middle of a migration fails the calls at
/// once: the crawl ends stuck with the failing files listed, a client read of a file not
/// fetched yet fails instead of hanging, and after ganesha is back a new crawl ends done.
#[test]
fn nfs_timeout_and_reconnect() {
    if !common::have(&["ganesha.nfsd", "rpcbind", "nfs-ls"]) {
        return;
    }
    let test_start = Instant::now();
    let export = tempfile::tempdir().expect("tempdir");
    let bulk = export.path().join("bulk");
    std::fs::create_dir(&bulk).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..80u64)
        .map(|i| (format!("bulk/f{i:02}"), common::content(900 + i, 700_000)))
        .collect();
    for (name, data) in &files {
        std::fs::write(export.path().join(name), data).unwrap();
    }
    let server = common::Ganesha::start(export.path());
    let pid = ganesha_pid(&server);
    let timeout = Duration::from_secs(2);
    let mut cfg = server.config();
    cfg.rpc_timeout = timeout;
    // The client's source comes from a URL: `timeout=` sets the RPC timeout.
    let url = format!(
        "nfs://127.0.0.1:{}{}?mountport={}&timeout=2",
        server.nfs_port, server.pseudo, server.mount_port
    );
    let source: Arc<dyn Source> = Arc::from(kaiso_source::open_source(&url).expect("connect"));
    let f0 = SourcePath::parse(b"bulk/f00").unwrap();
    assert_eq!(source.stat(&f0).unwrap().size, 700_000);
    let server_name = format!("127.0.0.1:{}", server.nfs_port);

    // Two connections for six callers: four wait for a connection.
    let mut narrow_cfg = cfg.clone();
    narrow_cfg.connections = 2;
    let narrow = Arc::new(NfsSource::connect(narrow_cfg).expect("connect"));

    // A silent server: the call ends with Unreachable after about the timeout.
    signal(pid, libc::SIGSTOP);
    wait_all_threads_stopped(pid);
    let resume = ContinueOnDrop(pid);
    let s = source.clone();
    let p = f0.clone();
    let (r, took) = common::within(timeout * 3, "stat on a stopped server", move || s.stat(&p));
    // Callers queued behind calls that time out fail with them: each waits about one
    // timeout, not one per round of calls ahead of it (three rounds here).
    let n = narrow.clone();
    let (queued, _) = common::within(timeout * 4, "queued stats on a stopped server", move || {
        std::thread::scope(|scope| {
            let waits: Vec<_> = (0..6)
                .map(|i| {
                    let n = &n;
                    scope.spawn(move || {
                        let t = Instant::now();
                        let p = SourcePath::parse(format!("bulk/f{i:02}").as_bytes()).unwrap();
                        (n.stat(&p).map(|a| a.size), t.elapsed())
                    })
                })
                .collect();
            waits
                .into_iter()
                .map(|w| w.join().unwrap())
                .collect::<Vec<_>>()
        })
    });
    drop(resume);
    for (r, took) in &queued {
        let e = r.as_ref().expect_err("a stopped server answered");
        assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
        assert!(
            // Served one after another they would wait 3 timeouts (6 s); failing with
            // the calls ahead they wait about one (2 s). 5 s: 2.5x that, below 6 s.
            *took < timeout * 5 / 2,
            "a queued call waited {took:?}: {e}"
        );
    }
    eprintln!(
        "stopped server, 6 callers on 2 connections: waited {:?}",
        queued.iter().map(|q| q.1).collect::<Vec<_>>()
    );
    let e = r.expect_err("a stopped server answered");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    assert!(e.to_string().contains(&server_name), "{e}");
    assert!(
        took >= timeout - Duration::from_millis(100),
        "failed early: {took:?}: {e}"
    );
    eprintln!("stopped server: {took:?}: {e}");
    // The next call works again.
    assert_eq!(source.stat(&f0).expect("after SIGCONT").size, 700_000);
    assert!(source.read(&f0, 0, 100).unwrap() == files[0].1[..100]);

    // A source left idle over the kill and restart below, holding several pooled
    // connections (64 KiB READs of a 700 kB file run in parallel).
    let mut warm_cfg = cfg.clone();
    warm_cfg.read_size = 64 << 10;
    let warm = NfsSource::connect(warm_cfg).expect("connect");
    assert!(warm.read(&f0, 0, 700_000).unwrap() == files[0].1);

    // Mid-migration kill.
    let dest = tempfile::tempdir().unwrap();
    let tier = dest.path().join("t0");
    std::fs::create_dir(&tier).unwrap();
    let store_cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"4GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
        dest.path().join("state").display(),
        tier.display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&store_cfg, "test.toml").unwrap()).unwrap();
    let mut mcfg = MigrationConfig::new("nfs");
    mcfg.crawl_workers = 2;
    let m = Migration::open(&store, Box::new(NfsSource::connect(cfg).unwrap()), mcfg).unwrap();
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    let crawler = Crawler::start(store.clone(), m.clone());
    common::wait_for_files_done(&m, &store, 3, Duration::from_millis(2));
    signal(pid, libc::SIGKILL);
    let (state, took) = common::within(
        timeout * 4 + Duration::from_secs(15),
        "crawler",
        move || {
            let state = crawler.wait(Duration::from_secs(600));
            (state, crawler.failures())
        },
    );
    let (state, failures) = state;
    assert_eq!(state, CrawlState::Stuck, "after {took:?}");
    assert!(!failures.is_empty(), "the failing files are listed");
    assert!(
        failures.iter().all(|f| f.errno == libc::EIO),
        "{failures:?}"
    );
    let left = m.remaining();
    assert!(left > 0, "nothing left after the kill");
    eprintln!(
        "killed server: crawler stuck after {took:?}, {left} files left, {} failures listed",
        failures.len()
    );
    // A client reading a file not fetched yet gets an error, not a hang.
    let s2 = store.clone();
    let (r, took) = common::within(
        timeout * 2 + Duration::from_secs(5),
        "client read",
        move || common::client_read(&s2, &["bulk", "f79"]),
    );
    assert!(r.is_err(), "read of an unfetched file after the kill");
    eprintln!("killed server: client read failed after {took:?}");
    // The source connected before the kill fails at once and names the server.
    let s = source.clone();
    let p = f0.clone();
    let (r, took) = common::within(timeout * 2, "stat after kill", move || s.stat(&p));
    let e = r.expect_err("a killed server answered");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    assert!(e.to_string().contains(&server_name), "{e} after {took:?}");
    assert!(took < timeout, "a refused connect waited {took:?}");
    eprintln!("killed server, idle source: {took:?}: {e}");

    // Ganesha back on the same ports: the same sources reconnect and a new crawl of the
    // same migration (resume) ends done, every file byte for byte.
    let restarted = Restarted::start(&server);
    // Its pooled connections were closed by the killed server: none is used.
    let f1 = SourcePath::parse(b"bulk/f01").unwrap();
    assert!(
        warm.read(&f1, 0, 700_000)
            .expect("idle source after restart")
            == files[1].1
    );
    assert_eq!(source.stat(&f0).expect("after restart").size, 700_000);
    let crawler = Crawler::start(store.clone(), m.clone());
    let (state, failures) = common::within(Duration::from_secs(60), "resumed crawl", move || {
        let state = crawler.wait(Duration::from_secs(600));
        (state, crawler.failures())
    })
    .0;
    assert_eq!(state, CrawlState::Done, "failures {failures:?}");
    assert_eq!(m.remaining(), 0);
    assert!(m.skipped().is_empty(), "{:?}", m.skipped());
    for (name, data) in &files {
        assert!(std::fs::read(tier.join(name)).unwrap() == *data, "{name}");
    }
    eprintln!("nfs_timeout_and_reconnect took {:?}", test_start.elapsed());
    drop(m);
    store.shutdown();
    drop(restarted);
}
