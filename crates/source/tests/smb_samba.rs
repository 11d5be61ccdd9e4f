//! The SMB source against a real Samba smbd started by the test, with smbclient as an
//! independent client (it also writes the alternate data stream).

mod common;

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;

use std::time::Duration;

use kaiso_source::SmbSource;
use kaiso_store::migrate::{
    CrawlState, Crawler, FileKind, Migration, MigrationConfig, Migrations, Source, SourceErrorKind,
    SourcePath,
};
use kaiso_store::{Store, StoreConfig};

#[test]
fn smb_source_against_samba() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    common::build_tree(share.path());
    let server = common::Samba::start(share.path());

    // An alternate data stream written by the real client.
    let local = share.path().join("../kaiso-ads-payload");
    // streams_xattr keeps a stream in one xattr: on ext4 without ea_inode a value must
    // fit in a 4 KiB block (a 70 KB stream fails with NT_STATUS_FILE_SYSTEM_LIMITATION).
    let payload = common::content(4242, 3_500);
    std::fs::write(&local, &payload).unwrap();
    server.smbclient(&format!("put {} tiny.txt:extra", local.display()));
    std::fs::remove_file(&local).unwrap();
    assert!(
        server.smbclient("allinfo tiny.txt").contains(":extra"),
        "smbclient sees the stream"
    );

    // The DOS read-only attribute, set the way a Windows client sets it (Samba keeps it
    // in its DOS attribute xattr; Unix mode 0444 alone does not set it).
    server.smbclient("setmode ro.txt +r");

    let source = SmbSource::connect(server.config()).expect("connect to samba");
    let root = share.path();

    // Every entry with a valid UTF-8 name is listed; Samba hides the latin-1 name.
    let disk = common::walk(root);
    let mut checked = 0;
    for (rel, m) in &disk {
        let sp = SourcePath::parse(rel).unwrap();
        let parent = sp.parent().unwrap();
        let listed = source
            .read_dir(&parent)
            .unwrap_or_else(|e| panic!("read_dir {parent}: {e}"));
        let entry = listed
            .iter()
            .find(|e| Some(e.name.as_slice()) == sp.file_name());
        if std::str::from_utf8(rel).is_err() {
            assert!(entry.is_none(), "Samba shows a non-UTF-8 name?");
            continue;
        }
        let kind = common::kind_of(m);
        if kind == FileKind::Symlink {
            // Samba follows links: a dangling one is not shown, a good one shows its target.
            if std::fs::metadata(root.join(OsStr::from_bytes(rel))).is_err() {
                assert!(entry.is_none(), "dangling symlink {sp} listed");
            } else {
                assert_eq!(
                    entry.expect("followed symlink listed").attr.kind,
                    FileKind::Regular
                );
            }
            continue;
        }
        let entry = entry.unwrap_or_else(|| panic!("{sp} not listed"));
        let attr = source
            .stat(&sp)
            .unwrap_or_else(|e| panic!("stat {sp}: {e}"));
        for a in [&entry.attr, &attr] {
            let want_kind = if kind == FileKind::Directory {
                FileKind::Directory
            } else {
                FileKind::Regular
            };
            assert_eq!(a.kind, want_kind, "kind of {sp}");
            if kind == FileKind::Regular {
                assert_eq!(a.size, m.size(), "size of {sp}");
            }
            assert_eq!(a.mtime.secs, m.mtime(), "mtime of {sp}");
            // FILETIME has 100 ns resolution.
            assert_eq!(
                a.mtime.nanos / 100,
                m.mtime_nsec() as u32 / 100,
                "mtime ns of {sp}"
            );
            assert!(a.dos_attributes.is_some());
        }
        // Samba reports NumberOfLinks 1 for every directory (Windows semantics).
        let want_nlink = if kind == FileKind::Directory {
            1
        } else {
            m.nlink()
        };
        assert_eq!(attr.nlink as u64, want_nlink, "nlink of {sp} (stat)");
        assert_eq!(entry.attr.ino, attr.ino, "file id of {sp}: listing vs stat");
        if kind == FileKind::Regular {
            let want = std::fs::read(root.join(OsStr::from_bytes(rel))).unwrap();
            let got = source
                .read(&sp, 0, want.len() + 100)
                .unwrap_or_else(|e| panic!("read {sp}: {e}"));
            assert!(got == want, "content of {sp}");
        }
        checked += 1;
    }
    // Everything but the two symlinks and the non-UTF-8 name was checked in full.
    assert_eq!(checked, disk.len() - 3, "objects checked");
    // Hard links share a file id.
    let a = source
        .stat(&SourcePath::parse(b"a/linked").unwrap())
        .unwrap();
    let b = source
        .stat(&SourcePath::parse(b"a/b/linked-too").unwrap())
        .unwrap();
    assert_eq!((a.ino, a.nlink), (b.ino, 2));
    // Read-only DOS attribute from mode 0444.
    assert_eq!(
        source
            .stat(&SourcePath::parse(b"ro.txt").unwrap())
            .unwrap()
            .perm
            & 0o222,
        0
    );

    // EAs (user.* xattrs), the security descriptor, and the alternate data stream.
    let tiny = SourcePath::parse(b"tiny.txt").unwrap();
    let eas = source.xattrs(&tiny).unwrap();
    assert!(
        eas.contains(&(b"user.color".to_vec(), b"blue".to_vec())),
        "EAs: {eas:?}"
    );
    let acl = source.acl(&tiny).unwrap();
    assert!(
        acl.nt_security_descriptor
            .as_ref()
            .is_some_and(|sd| sd.len() > 20)
    );
    assert!(
        acl.owner_sid
            .as_deref()
            .is_some_and(|s| s.starts_with("S-1-")),
        "{acl:?}"
    );
    let streams = source.streams(&tiny).unwrap();
    assert_eq!(streams.len(), 1, "{streams:?}");
    assert_eq!(
        (streams[0].name.as_str(), streams[0].size),
        ("extra", payload.len() as u64)
    );
    assert_eq!(
        source.read_stream(&tiny, "extra", 0, 1 << 20).unwrap(),
        payload
    );
    assert_eq!(
        source.read_stream(&tiny, "extra", 1000, 10).unwrap(),
        payload[1000..1010]
    );

    // Large read in parallel pieces, concurrent callers.
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    source
                        .read(&SourcePath::parse(b"sparse.img").unwrap(), 0, 20 << 20)
                        .unwrap()
                })
            })
            .collect();
        let want = std::fs::read(root.join("sparse.img")).unwrap();
        for h in hs {
            assert!(h.join().unwrap() == want);
        }
    });

    // Clear errors.
    assert_eq!(
        source
            .stat(&SourcePath::parse(b"no/such").unwrap())
            .unwrap_err()
            .kind,
        SourceErrorKind::NotFound
    );
    let odd = SourcePath::root().join(common::NON_UTF8_NAME).unwrap();
    assert_eq!(
        source.stat(&odd).unwrap_err().kind,
        SourceErrorKind::Invalid
    );
    let mut wrong = server.config();
    wrong.password = "wrong".into();
    let e = SmbSource::connect(wrong).err().expect("bad password");
    assert_eq!(e.kind, SourceErrorKind::PermissionDenied, "{e}");
    // `kaiso migrate start` shows it as is (crates/kaiso/tests/migrate_cli.rs looks for it).
    assert!(
        e.message.contains("Logon Failure") && !e.message.contains('\n'),
        "{e}"
    );
    eprintln!("bad password: {e}");
    let mut unknown = server.config();
    unknown.share = "no-such-share".into();
    let e = SmbSource::connect(unknown).err().expect("unknown share");
    assert_eq!(e.kind, SourceErrorKind::NotFound, "{e}");
    assert!(
        e.message.contains("no-such-share") && !e.message.contains('\n'),
        "one line naming the share: {e}"
    );
    eprintln!("unknown share: {e}");
    // Dropping the source logs off on a thread of its own (against a dead server the
    // logoff would wait for the timeout), so this returns at once.
    drop(source);
    drop(server);
    let mut dead = kaiso_source::SmbConfig::new("127.0.0.1", "src", "root", "x");
    dead.port = common::free_port();
    let e = SmbSource::connect(dead).err().expect("nothing listens");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    assert!(!e.message.contains('\n'), "{e}");
    eprintln!("unreachable: {e}");
}

/// Per-request latency on loopback: a stat is three SMB requests (CREATE, QUERY_INFO,
/// CLOSE). Nagle's algorithm with the server's delayed ACK made each cost ~40 ms.
#[test]
fn smb_request_latency() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    common::build_tree(share.path());
    let server = common::Samba::start(share.path());
    let source = SmbSource::connect(server.config()).expect("connect to samba");
    let p = SourcePath::parse(b"a/page").unwrap();
    source.stat(&p).unwrap();
    let n = 50;
    let t = std::time::Instant::now();
    for _ in 0..n {
        source.stat(&p).unwrap();
    }
    let stat = t.elapsed() / n;
    let t = std::time::Instant::now();
    for _ in 0..n {
        source.read(&p, 0, 8192).unwrap();
    }
    let read = t.elapsed() / n;
    eprintln!("SMB loopback: stat {stat:?}, open+read+close {read:?}");
    // With Nagle on, each of the three requests waited for a delayed ACK: 130-140 ms a
    // stat here (at least 3 x 40 ms, Linux's shortest delayed ACK). Without it a stat is
    // about 1 ms; 60 ms (half the Nagle cost) leaves room for a loaded machine.
    assert!(
        stat < Duration::from_millis(60) && read < Duration::from_millis(60),
        "SMB requests are slow again: stat {stat:?}, read {read:?}"
    );
    drop(source);
}

/// smbd's process group (it makes itself a group leader; its per-client children are in
/// it), checked to be neither ours nor init's before anything is signalled.
fn smbd_group(server: &common::Samba) -> i32 {
    let pidfile = server.dir.path().join("pid/smbd.pid");
    let start = std::time::Instant::now();
    let pid: i32 = loop {
        if let Some(p) = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            break p;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no {pidfile:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let pgid = unsafe { libc::getpgid(pid) };
    assert!(
        pgid > 1 && pgid != unsafe { libc::getpgrp() },
        "smbd group {pgid}"
    );
    pgid
}

fn signal_group(pgid: i32, sig: i32) {
    assert_eq!(unsafe { libc::kill(-pgid, sig) }, 0, "kill -{sig} -{pgid}");
}

/// The fields of a `/proc/.../stat` line after the command name (which is in
/// parentheses and may hold spaces): state, ppid, pgrp, ...
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 2..].split(' ').collect())
}

/// Every thread of every process in group `pgid` with its state (`/proc`).
fn group_thread_states(pgid: i32) -> Vec<(i32, i32, char)> {
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(p.path().join("stat")) else {
            continue; // gone meanwhile
        };
        let in_group = stat_fields(&stat)
            .and_then(|f| f.get(2).and_then(|g| g.parse::<i32>().ok()))
            == Some(pgid);
        if !in_group {
            continue;
        }
        let Ok(tasks) = std::fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let tid = t
                .file_name()
                .to_str()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            if let Some(state) = std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|st| stat_fields(&st)?.first()?.chars().next())
            {
                out.push((pid, tid, state));
            }
        }
    }
    out
}

/// Stops every process of group `pgid` (smbd and its children) with SIGSTOP and waits
/// (at most 10 s) until every thread of every one of them is in group stop ('T'; a
/// zombie counts as stopped). `kill` returns before that: the stop takes effect as each
/// thread is next scheduled, and on a busy machine a "stopped" smbd can still read and
/// answer a request meanwhile.
fn stop_group(pgid: i32) {
    signal_group(pgid, libc::SIGSTOP);
    let start = std::time::Instant::now();
    loop {
        let states = group_thread_states(pgid);
        assert!(
            !states.is_empty(),
            "no process left in smbd's group {pgid} to stop"
        );
        let running: Vec<_> = states
            .iter()
            .filter(|(_, _, s)| !matches!(s, 'T' | 'Z' | 'X'))
            .collect();
        if running.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "threads of smbd's group {pgid} not stopped within 10 s of SIGSTOP \
             (pid, tid, state): {running:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A server that stops answering (SIGSTOP) makes a call fail within the configured
/// timeout with an error naming the server, and the next call after it answers again
/// reconnects. A server killed in the middle of a migration (kill -9 of smbd and its
/// children) fails the in-flight and later calls at once: the crawler ends stuck instead
/// of hanging and a client access fails instead of blocking.
#[test]
fn smb_timeout_and_reconnect() {
    if !common::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let share = tempfile::tempdir().expect("tempdir");
    let bulk = share.path().join("bulk");
    std::fs::create_dir(&bulk).unwrap();
    for i in 0..60u64 {
        std::fs::write(bulk.join(format!("f{i:02}")), common::content(i, 600_000)).unwrap();
    }
    let server = common::Samba::start(share.path());
    let pgid = smbd_group(&server);
    let timeout = Duration::from_secs(2);
    let mut cfg = server.config();
    cfg.timeout = timeout;
    let source = std::sync::Arc::new(SmbSource::connect(cfg.clone()).expect("connect"));
    let f0 = SourcePath::parse(b"bulk/f00").unwrap();
    assert_eq!(source.stat(&f0).unwrap().size, 600_000);

    // A silent server: the call ends with Unreachable after about the timeout.
    stop_group(pgid);
    let s = source.clone();
    let p = f0.clone();
    let (r, took) = common::within(timeout * 3, "stat on a stopped server", move || s.stat(&p));
    signal_group(pgid, libc::SIGCONT);
    let e = r.expect_err("a stopped server answered");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    let server_name = format!("127.0.0.1:{}", server.port);
    assert!(e.to_string().contains(&server_name), "{e}");
    assert!(
        took >= timeout - Duration::from_millis(100),
        "failed early: {took:?}: {e}"
    );
    eprintln!("stopped server: {took:?}: {e}");
    // The next call reconnects.
    assert_eq!(source.stat(&f0).expect("reconnected").size, 600_000);
    assert!(source.read(&f0, 0, 100).unwrap() == common::content(0, 100));

    // Mid-migration kill.
    let dest = tempfile::tempdir().unwrap();
    std::fs::create_dir(dest.path().join("t0")).unwrap();
    let store_cfg = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"4GiB\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
        dest.path().join("state").display(),
        dest.path().join("t0").display()
    );
    let store = Store::open(StoreConfig::from_toml_str(&store_cfg, "test.toml").unwrap()).unwrap();
    let m = Migration::open(
        &store,
        Box::new(SmbSource::connect(cfg).unwrap()),
        MigrationConfig::new("smb"),
    )
    .unwrap();
    let all = Migrations::new();
    all.add(m.clone());
    store.set_stub_filler(all);
    let crawler = Crawler::start(store.clone(), m.clone());
    common::wait_for_files_done(&m, &store, 3, Duration::from_millis(5));
    signal_group(pgid, libc::SIGKILL);
    let (state, took) = common::within(
        timeout * 4 + Duration::from_secs(10),
        "crawler",
        move || crawler.wait(Duration::from_secs(600)),
    );
    assert_eq!(state, CrawlState::Stuck, "after {took:?}");
    eprintln!("killed server: crawler stuck after {took:?}");
    // A client reading a file not fetched yet gets an error, not a hang.
    let s2 = store.clone();
    let (r, _) = common::within(
        timeout * 2 + Duration::from_secs(5),
        "client read",
        move || common::client_read(&s2, &["bulk", "f59"]),
    );
    assert!(r.is_err(), "read of an unfetched file after the kill");
    // The source connected before the kill also fails at once and names the server.
    let s = source.clone();
    let (r, took) = common::within(
        timeout * 2 + Duration::from_secs(5),
        "stat after kill",
        move || s.stat(&f0),
    );
    let e = r.expect_err("a killed server answered");
    assert_eq!(e.kind, SourceErrorKind::Unreachable, "{e}");
    assert!(e.to_string().contains(&server_name), "{e} after {took:?}");
    eprintln!("killed server, idle source: {took:?}: {e}");
    drop(m);
    store.shutdown();
}
