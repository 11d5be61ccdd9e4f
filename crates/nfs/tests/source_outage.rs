//! The NFS face when a migration fetch fails for a reason that passes: the old server did
//! not answer (the store answers EIO and keeps the stub), or the store is busy (EAGAIN,
//! EBUSY). The face tries the store call again (bounded) instead of failing the client's
//! call at once; with JUKEBOX off it never answers NFS3ERR_JUKEBOX, which clients such as
//! libnfs do not retry. The outage is forced: the test source fails every fetch until the
//! test lets it go, which it does only after it has seen the face try again.

mod common;

use common::{Client, Served, connect_as, dirop, pattern, rt};
use kaiso_store::{FileKind, FsError, FsResult, Ino, ROOT_INO, Store, StubEntry, StubFiller};
use nfs3_client::nfs3_types::nfs3::*;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// A migration source whose fetches fail with `errno` until it is let go.
struct Outage {
    errno: i32,
    fetches: AtomicUsize,
    over: AtomicBool,
    data: Vec<u8>,
}

impl Outage {
    fn new(errno: i32, data: &[u8]) -> Arc<Outage> {
        Arc::new(Outage {
            errno,
            fetches: AtomicUsize::new(0),
            over: AtomicBool::new(false),
            data: data.to_vec(),
        })
    }

    /// Ends the outage once `n` fetches have been tried (so the face has tried again),
    /// from a thread of its own; bounded (30 s), after which it ends it anyway and the
    /// test's count check fails.
    fn end_after(self: &Arc<Self>, n: usize) -> std::thread::JoinHandle<()> {
        let me = self.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while me.fetches.load(Ordering::SeqCst) < n && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(5));
            }
            me.over.store(true, Ordering::SeqCst);
        })
    }
}

impl StubFiller for Outage {
    fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
        store.stub_dir_listed(ino)
    }
    fn fill_range(
        &self,
        store: &Store,
        ino: Ino,
        _path: &Path,
        _offset: u64,
        _len: u64,
    ) -> FsResult<()> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if !self.over.load(Ordering::SeqCst) {
            return Err(FsError(self.errno));
        }
        store.stub_write(ino, 0, &self.data)
    }
}

/// A served store with one stub file `remote.bin` of `data`, fetched from `source`.
fn serve_stub(tune: impl FnOnce(&mut kaiso_nfs::ServeOptions), source: Arc<Outage>) -> Served {
    let s = Served::start(tune);
    s.store.set_stub_filler(source.clone());
    let now = SystemTime::now();
    let entry = StubEntry {
        kind: FileKind::File,
        perm: 0o644,
        uid: 0,
        gid: 0,
        size: source.data.len() as u64,
        mtime: now,
        atime: now,
        symlink_target: None,
        rdev: 0,
        unlisted: false,
    };
    s.store
        .stub_create(ROOT_INO, "remote.bin".as_ref(), &entry)
        .unwrap();
    s
}

async fn open(port: u16) -> (Client, nfs_fh3) {
    let (mut c, root) = connect_as(port, common::auth_sys(0, 0, &[])).await;
    let fh = c
        .lookup(&LOOKUP3args {
            what: dirop(&root, "remote.bin"),
        })
        .await
        .unwrap()
        .unwrap()
        .object;
    (c, fh)
}

async fn read(c: &mut Client, fh: &nfs_fh3, count: u32) -> Result<Vec<u8>, nfsstat3> {
    let args = READ3args {
        file: fh.clone(),
        offset: 0,
        count,
    };
    match c.read(&args).await.unwrap() {
        Nfs3Result::Ok(ok) => Ok(ok.data.as_ref().to_vec()),
        Nfs3Result::Err((e, _)) => Err(e),
    }
}

/// JUKEBOX off (`--jukebox-after 0`): a READ of a stub whose fetch fails because the source
/// does not answer (EIO), or because the store is busy (EBUSY, EAGAIN), waits and gets the
/// data once the fetch works, in one call. (Before: NFS3ERR_IO, resp. NFS3ERR_JUKEBOX at
/// the first failure, which libnfs's nfs-cat reports as "Failed to read from file".)
#[test]
fn jukebox_off_a_read_waits_out_a_failing_fetch() {
    for errno in [libc::EIO, libc::EBUSY, libc::EAGAIN] {
        let data = pattern(100_000, 3);
        let source = Outage::new(errno, &data);
        let s = serve_stub(|o| o.jukebox_after = None, source.clone());
        let ender = source.end_after(3);
        let got = rt().block_on(async {
            let (mut c, fh) = open(s.port()).await;
            read(&mut c, &fh, 65536).await
        });
        ender.join().unwrap();
        let name = std::io::Error::from_raw_os_error(errno);
        assert!(
            got.as_deref() == Ok(&data[..65536]),
            "errno {name}: the READ must wait for the fetch to work and get its 65536 bytes, \
             got {:?}",
            got.map(|d| d.len())
        );
        assert!(
            source.fetches.load(Ordering::SeqCst) >= 4,
            "errno {name}: the face tried the fetch {} times, expected at least 4 (3 failed)",
            source.fetches.load(Ordering::SeqCst)
        );
        assert_eq!(
            s.server().jukebox_replies(),
            0,
            "errno {name}: JUKEBOX is off"
        );
    }
}

/// A failure that does not pass (permission denied by the source) is answered at once,
/// with one fetch; one that outlasts the retry bound is answered with its error (EIO:
/// NFS3ERR_IO; EBUSY with JUKEBOX off: NFS3ERR_IO too, not JUKEBOX).
#[test]
fn failures_that_do_not_pass_or_outlast_the_bound_are_answered() {
    let data = pattern(10_000, 5);
    let source = Outage::new(libc::EACCES, &data);
    let s = serve_stub(|o| o.jukebox_after = None, source.clone());
    let got = rt().block_on(async {
        let (mut c, fh) = open(s.port()).await;
        read(&mut c, &fh, 4096).await
    });
    assert_eq!(got.map(|d| d.len()), Err(nfsstat3::NFS3ERR_ACCES));
    assert_eq!(
        source.fetches.load(Ordering::SeqCst),
        1,
        "a refusal is not tried again"
    );
    drop(s);

    for errno in [libc::EIO, libc::EBUSY] {
        let source = Outage::new(errno, &data);
        let bound = Duration::from_secs(1);
        let s = serve_stub(
            |o| {
                o.jukebox_after = None;
                o.retry_for = bound;
            },
            source.clone(),
        );
        let t0 = Instant::now();
        let got = rt().block_on(async {
            let (mut c, fh) = open(s.port()).await;
            read(&mut c, &fh, 4096).await
        });
        let name = std::io::Error::from_raw_os_error(errno);
        assert_eq!(
            got.map(|d| d.len()),
            Err(nfsstat3::NFS3ERR_IO),
            "errno {name}"
        );
        assert!(
            t0.elapsed() >= bound,
            "errno {name}: answered after {:?}, before the {bound:?} retry bound",
            t0.elapsed()
        );
        assert!(source.fetches.load(Ordering::SeqCst) >= 2, "errno {name}");
        assert_eq!(s.server().jukebox_replies(), 0, "errno {name}");
    }
}

/// JUKEBOX on: the client gets NFS3ERR_JUKEBOX while the face keeps trying the fetch in
/// the background; the client's next call joins that work and gets the data.
#[test]
fn jukebox_on_the_retry_joins_the_work_that_outlasted_the_outage() {
    let data = pattern(50_000, 7);
    let source = Outage::new(libc::EIO, &data);
    let s = serve_stub(
        |o| o.jukebox_after = Some(Duration::from_millis(200)),
        source.clone(),
    );
    rt().block_on(async {
        let (mut c, fh) = open(s.port()).await;
        // The outage lasts until the client has had its JUKEBOX: the first READ cannot
        // get the data.
        assert_eq!(
            read(&mut c, &fh, 8192).await,
            Err(nfsstat3::NFS3ERR_JUKEBOX)
        );
        let fetches = source.fetches.load(Ordering::SeqCst);
        source.end_after(fetches + 1).join().unwrap();
        let t0 = Instant::now();
        let got = loop {
            match read(&mut c, &fh, 8192).await {
                Err(nfsstat3::NFS3ERR_JUKEBOX) if t0.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                r => break r,
            }
        };
        assert!(
            got.as_deref() == Ok(&data[..8192]),
            "the retry must get the 8192 bytes, got {:?}",
            got.map(|d| d.len())
        );
        assert!(s.server().jukebox_replies() >= 1);
    });
}
