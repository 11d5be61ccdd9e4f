//! Real NFSv3 client tools (libnfs-utils: nfs-cp, nfs-cat, nfs-ls) against the face.

mod common;

use common::{Served, pattern};
use std::process::{Command, Output};
use std::time::Duration;

fn have_tools() -> bool {
    let ok = Command::new("nfs-ls").arg("--help").output().is_ok();
    if !ok {
        // CI installs libnfs-utils (scripts/deps/nfs.list); a bare dev box may not have it.
        eprintln!("libnfs-utils missing (apt-get install libnfs-utils); skipping");
    }
    ok
}

/// Run a client tool with a time bound, so a hung server fails the test instead of the run.
/// Output goes to files: a pipe nobody drains would block a large `nfs-cat`.
fn run(args: &[&str]) -> Output {
    let out = tempfile::tempfile().unwrap();
    let err = tempfile::tempfile().unwrap();
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .stdout(out.try_clone().unwrap())
        .stderr(err.try_clone().unwrap())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let read = |mut f: std::fs::File| {
        use std::io::{Read, Seek};
        let mut v = Vec::new();
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.read_to_end(&mut v).unwrap();
        v
    };
    Output {
        status,
        stdout: read(out),
        stderr: read(err),
    }
}

fn ok(args: &[&str]) -> Vec<u8> {
    let o = run(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

#[test]
fn write_list_read_back_rename_remove() {
    if !have_tools() {
        return;
    }
    let s = Served::start(|_| {});
    let work = tempfile::tempdir().unwrap();
    // Bigger than one 1 MiB RPC, not a multiple of it.
    let data = pattern(3 * 1024 * 1024 + 12345, 7);
    let src = work.path().join("in.bin");
    std::fs::write(&src, &data).unwrap();
    ok(&["nfs-cp", src.to_str().unwrap(), &s.url("/big.bin")]);

    // The bytes landed in the store (and on a tier as a plain file).
    let ino = s.store.resolve("big.bin".as_ref()).unwrap();
    assert_eq!(s.store.getattr(ino, None).unwrap().size, data.len() as u64);
    let on_tier = ["t0", "t1"]
        .iter()
        .map(|t| s.dir.path().join(t).join("big.bin"))
        .find(|p| p.exists())
        .expect("file on a tier");
    assert_eq!(std::fs::read(on_tier).unwrap(), data);

    // Read back with two different tools.
    let back = work.path().join("out.bin");
    ok(&["nfs-cp", &s.url("/big.bin"), back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), data);
    assert_eq!(ok(&["nfs-cat", &s.url("/big.bin")]), data);

    // A file written into the store directly shows up in the listing.
    let (a, o) = s
        .store
        .create(
            kaiso_store::ROOT_INO,
            "local.txt".as_ref(),
            0o644,
            0,
            libc::O_RDWR,
            kaiso_store::Caller::ROOT,
            false,
        )
        .unwrap();
    s.store.write(o.fh, 0, b"from the store").unwrap();
    s.store.release(o.fh).unwrap();
    let listing = String::from_utf8(ok(&["nfs-ls", &s.url("/")])).unwrap();
    assert!(
        listing.contains("big.bin") && listing.contains("local.txt"),
        "{listing}"
    );
    assert_eq!(ok(&["nfs-cat", &s.url("/local.txt")]), b"from the store");
    let _ = a;

    // Rename and remove through the store's namespace; the NFS view follows.
    s.store
        .rename(
            kaiso_store::ROOT_INO,
            "big.bin".as_ref(),
            kaiso_store::ROOT_INO,
            "renamed.bin".as_ref(),
            0,
        )
        .unwrap();
    s.store
        .unlink(kaiso_store::ROOT_INO, "local.txt".as_ref())
        .unwrap();
    let listing = String::from_utf8(ok(&["nfs-ls", &s.url("/")])).unwrap();
    assert!(
        listing.contains("renamed.bin")
            && !listing.contains("big.bin")
            && !listing.contains("local.txt"),
        "{listing}"
    );
    assert_eq!(ok(&["nfs-cat", &s.url("/renamed.bin")]), data);
    assert!(
        !run(&["nfs-cat", &s.url("/local.txt")]).status.success(),
        "a removed file cannot be read"
    );
}

#[test]
fn subdirectories_and_recursive_listing() {
    if !have_tools() {
        return;
    }
    let s = Served::start(|_| {});
    let work = tempfile::tempdir().unwrap();
    let d = s
        .store
        .mkdir(
            kaiso_store::ROOT_INO,
            "sub".as_ref(),
            0o755,
            0,
            kaiso_store::Caller::ROOT,
        )
        .unwrap();
    s.store
        .mkdir(
            d.ino,
            "deeper".as_ref(),
            0o755,
            0,
            kaiso_store::Caller::ROOT,
        )
        .unwrap();
    for i in 0..40 {
        let f = work.path().join(format!("f{i}"));
        std::fs::write(&f, pattern(1000 + i, i as u8)).unwrap();
        ok(&[
            "nfs-cp",
            f.to_str().unwrap(),
            &s.url(&format!("/sub/deeper/f{i:02}")),
        ]);
    }
    let listing = String::from_utf8(ok(&["nfs-ls", "-R", &s.url("/")])).unwrap();
    for i in 0..40 {
        assert!(
            listing.contains(&format!("f{i:02}")),
            "f{i:02} missing from\n{listing}"
        );
    }
    assert_eq!(
        ok(&["nfs-cat", &s.url("/sub/deeper/f17")]),
        pattern(1017, 17)
    );
}

#[test]
fn files_written_by_a_user_belong_to_that_user() {
    // The server can act as another user only when it runs as root (as in CI).
    if !have_tools() || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let s = Served::start(|_| {});
    let work = tempfile::tempdir().unwrap();
    for (name, mode) in [("home", 0o777), ("locked", 0o755)] {
        s.store
            .mkdir(
                kaiso_store::ROOT_INO,
                name.as_ref(),
                libc::S_IFDIR | mode,
                0,
                kaiso_store::Caller::ROOT,
            )
            .unwrap();
    }
    let src = work.path().join("in.bin");
    std::fs::write(&src, pattern(200_000, 5)).unwrap();
    // libnfs sends AUTH_SYS with the uid/gid given in the URL.
    let as_user = |path: &str| format!("{}&uid=1234&gid=5678", s.url(path));
    ok(&["nfs-cp", src.to_str().unwrap(), &as_user("/home/f.bin")]);
    let on_tier = ["t0", "t1"]
        .iter()
        .map(|t| s.dir.path().join(t).join("home/f.bin"))
        .find(|p| p.exists())
        .expect("file on a tier");
    let m = std::fs::metadata(&on_tier).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
    assert_eq!(std::fs::read(&on_tier).unwrap(), pattern(200_000, 5));
    assert_eq!(
        ok(&["nfs-cat", &as_user("/home/f.bin")]),
        pattern(200_000, 5)
    );
    // A directory only root may write into refuses the user.
    let refused = run(&["nfs-cp", src.to_str().unwrap(), &as_user("/locked/f.bin")]);
    assert!(
        !refused.status.success(),
        "write into a root-only directory"
    );
    assert!(s.store.resolve("locked/f.bin".as_ref()).is_err());
}
