//! A per-call deadline for sources whose calls can block forever: a POSIX path on a hard
//! NFS mount whose server died, a FUSE mount whose daemon is stopped. Such a call sits in
//! the kernel uninterruptibly; nothing can cancel it. So every call runs on a small pool
//! of worker threads and the caller waits at most `timeout`: then the call fails as
//! `Unreachable` naming the path, the worker stuck in it is abandoned (it rejoins the
//! pool if the call ever returns), and the pool starts another one, up to a bound: when
//! every worker is stuck, calls wait in the queue and fail at their deadline too, so a
//! hung mount costs a bounded number of threads, never a hung client or crawler.
//!
//! One client operation can take several calls in a row (a file's first read copies its
//! xattrs and ACL, then reads; the kernel retries a failed readahead with a read of its
//! own). So once a call passed its deadline, the source counts as hung until some call
//! returns (the stuck one, or any other): meanwhile each call waits only a short grace
//! ([`grace`]: a tenth of the timeout, at least 0.1 s) before it fails too. One client
//! operation thus fails within about one timeout, not one per call (measured before:
//! 4 s for a client's first read of a file with `timeout=1`). A call that answers within
//! its grace ends the hung state (one stuck file does not fail the rest of the source).
//!
//! POSIX sources are wrapped where they are built ([`open_posix`]): by default when the
//! directory is on a file system that can hang (anything but local disk and memory file
//! systems), always with `?timeout=SECONDS`, never with `?timeout=off`.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use kaiso_store::migrate::{
    Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind, SourceFeatures,
    SourcePath, SourceResult, SourceStream,
};

use crate::PosixSource;

/// Default deadline of one call (as the NFS and SMB clients' request timeout).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// Worker threads at most, stuck ones included.
const MAX_WORKERS: usize = 64;

/// An idle worker exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(30);

/// How long a call waits while the source counts as hung (see the module text): a tenth
/// of the timeout, at least 0.1 s (a healthy call under load), at most the timeout.
fn grace(timeout: Duration) -> Duration {
    (timeout / 10).max(Duration::from_millis(100)).min(timeout)
}

/// Whether a source's calls hang: set when a call passes its deadline, cleared when any
/// call returns (see the module text).
#[derive(Default)]
struct Hung {
    /// Since a call passed its deadline, with no call returned since.
    hung: Mutex<bool>,
}

impl Hung {
    fn lock(&self) -> std::sync::MutexGuard<'_, bool> {
        self.hung.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on `pool`, waiting `timeout`, or only [`grace`] while the source counts
    /// as hung. `Err` holds how long it waited and whether that was a grace.
    fn run<T: Send + 'static>(
        self: &Arc<Self>,
        pool: &Arc<Pool>,
        timeout: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, (Duration, bool)> {
        let hung = *self.lock();
        let wait = if hung { grace(timeout) } else { timeout };
        let returned = Arc::new(AtomicBool::new(false));
        let (me, done) = (self.clone(), returned.clone());
        let r = pool.run(wait, move || {
            let v = f();
            // Under the lock: the caller that gave up decides on `returned` under it too.
            let mut h = me.lock();
            done.store(true, Ordering::SeqCst);
            *h = false;
            v
        });
        r.ok_or_else(|| {
            let mut h = self.lock();
            if !returned.load(Ordering::SeqCst) {
                *h = true;
            }
            (wait, hung)
        })
    }
}

/// Read buffers kept for reuse (a 10 MiB unit must not cost an allocation per call).
const SPARE_BUFFERS: usize = 8;

type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    /// Waiting jobs with their ids (a caller whose deadline passed takes its job back).
    jobs: VecDeque<(u64, Job)>,
    next_id: u64,
    /// Workers waiting for a job.
    idle: usize,
    /// Workers alive, stuck ones included.
    workers: usize,
}

/// A bounded pool of threads that run calls for callers who wait with a deadline.
struct Pool {
    queue: Mutex<Queue>,
    ready: Condvar,
    max_workers: usize,
}

impl Pool {
    fn new(max_workers: usize) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                next_id: 0,
                idle: 0,
                workers: 0,
            }),
            ready: Condvar::new(),
            max_workers,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on a worker; `None` when it did not finish within `timeout` (it may
    /// still run to its end, unobserved).
    fn run<T: Send + 'static>(
        self: &Arc<Self>,
        timeout: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = mpsc::sync_channel(1);
        let id = {
            let mut q = self.lock();
            let id = q.next_id;
            q.next_id += 1;
            q.jobs.push_back((
                id,
                Box::new(move || {
                    let _ = tx.send(f());
                }),
            ));
            if q.jobs.len() > q.idle && q.workers < self.max_workers {
                q.workers += 1;
                let pool = self.clone();
                let spawned = std::thread::Builder::new()
                    .name("kaiso-src-call".into())
                    .spawn(move || pool.work());
                if spawned.is_err() {
                    q.workers -= 1;
                }
            }
            self.ready.notify_one();
            id
        };
        match rx.recv_timeout(timeout) {
            Ok(v) => Some(v),
            Err(_) => {
                // Still queued (every worker stuck): it must not run later for nobody.
                self.lock().jobs.retain(|(j, _)| *j != id);
                None
            }
        }
    }

    fn work(self: Arc<Self>) {
        let mut q = self.lock();
        loop {
            if let Some((_, job)) = q.jobs.pop_front() {
                drop(q);
                job();
                q = self.lock();
                continue;
            }
            q.idle += 1;
            let (g, waited) = self
                .ready
                .wait_timeout(q, IDLE_EXIT)
                .unwrap_or_else(|e| e.into_inner());
            q = g;
            q.idle -= 1;
            if waited.timed_out() && q.jobs.is_empty() {
                q.workers -= 1;
                return;
            }
        }
    }
}

/// A source whose every call fails `Unreachable` after `timeout` instead of blocking
/// its caller for as long as the call blocks.
pub struct DeadlineSource {
    inner: Arc<dyn Source>,
    /// What the error names (the directory, for a POSIX source).
    location: String,
    timeout: Duration,
    pool: Arc<Pool>,
    hung: Arc<Hung>,
    buffers: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl DeadlineSource {
    /// Wraps `inner`; errors name `location`.
    pub fn new(inner: Box<dyn Source>, location: String, timeout: Duration) -> Self {
        Self::with_pool(Arc::from(inner), location, timeout, Pool::new(MAX_WORKERS))
    }

    fn with_pool(
        inner: Arc<dyn Source>,
        location: String,
        timeout: Duration,
        pool: Arc<Pool>,
    ) -> Self {
        Self {
            inner,
            location,
            timeout,
            pool,
            hung: Arc::default(),
            buffers: Arc::new(Mutex::new(Vec::new())),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn call<T: Send + 'static>(
        &self,
        what: &str,
        path: &SourcePath,
        f: impl FnOnce(&dyn Source, &SourcePath) -> SourceResult<T> + Send + 'static,
    ) -> SourceResult<T> {
        let (inner, p) = (self.inner.clone(), path.clone());
        self.hung
            .run(&self.pool, self.timeout, move || f(&*inner, &p))
            .unwrap_or_else(|(waited, hung)| {
                Err(if hung {
                    hung_again_error(&self.location, what, path, waited, self.timeout)
                } else {
                    hung_error(&self.location, what, path, self.timeout)
                })
            })
    }
}

fn hung_error(location: &str, what: &str, path: &SourcePath, timeout: Duration) -> SourceError {
    SourceError::new(
        SourceErrorKind::Unreachable,
        path,
        format!(
            "{what} of {location}{path} did not return within {:.1} s (hung mount?); the call is abandoned",
            timeout.as_secs_f64()
        ),
    )
}

/// A call that failed after its [`grace`]: an earlier one passed its whole deadline.
fn hung_again_error(
    location: &str,
    what: &str,
    path: &SourcePath,
    waited: Duration,
    timeout: Duration,
) -> SourceError {
    SourceError::new(
        SourceErrorKind::Unreachable,
        path,
        format!(
            "{what} of {location}{path} did not return within {:.1} s while an earlier call to it is hung (no return within {:.1} s; hung mount?); the call is abandoned",
            waited.as_secs_f64(),
            timeout.as_secs_f64()
        ),
    )
}

impl Source for DeadlineSource {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn identity(&self) -> Option<String> {
        let inner = self.inner.clone();
        self.hung
            .run(&self.pool, self.timeout, move || inner.identity())
            .ok()
            .flatten()
    }

    fn features(&self) -> SourceFeatures {
        self.inner.features()
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.call("stat", path, |s, p| s.stat(p))
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.call("listing", path, |s, p| s.read_dir(p))
    }

    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        self.call("listing", path, |s, p| s.read_dir_with_attr(p))
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.call("read", path, move |s, p| s.read(p, offset, len))
    }

    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.call("read", path, move |s, p| s.read_with_attr(p, offset, len))
    }

    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        // The worker may outlive this call: it reads into a buffer of its own, copied
        // here (and kept for the next call) when it answers in time.
        let len = buf.len();
        let spare = self.buffers.clone();
        let mut own = spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_default();
        let (n, attr, own) = self.call("read", path, move |s, p| {
            own.resize(len, 0);
            let (n, attr) = s.read_into(p, offset, &mut own)?;
            Ok((n, attr, own))
        })?;
        let n = n.min(len);
        buf[..n].copy_from_slice(&own[..n]);
        let mut kept = spare.lock().unwrap_or_else(|e| e.into_inner());
        if kept.len() < SPARE_BUFFERS {
            kept.push(own);
        }
        Ok((n, attr))
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        self.call("readlink", path, |s, p| s.read_link(p))
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.call("xattr listing", path, |s, p| s.xattrs(p))
    }

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.call("ACL read", path, |s, p| s.acl(p))
    }

    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.call("stream listing", path, |s, p| s.streams(p))
    }

    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        let stream = stream.to_string();
        self.call("stream read", path, move |s, p| {
            s.read_stream(p, &stream, offset, len)
        })
    }
}

/// When a POSIX source gets a deadline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PosixDeadline {
    /// Only on file systems that can hang (network, FUSE, unknown), [`DEFAULT_TIMEOUT`].
    Auto,
    Always(Duration),
    Never,
}

/// Splits a POSIX location `PATH[?timeout=SECONDS|off]` into the path and its deadline.
pub fn parse_posix(location: &Path) -> Result<(PathBuf, PosixDeadline), SourceError> {
    let invalid = |m: String| SourceError::new(SourceErrorKind::Invalid, &SourcePath::root(), m);
    let Some(text) = location.to_str() else {
        return Ok((location.to_path_buf(), PosixDeadline::Auto));
    };
    let Some((path, value)) = text.rsplit_once("?timeout=") else {
        return Ok((location.to_path_buf(), PosixDeadline::Auto));
    };
    let deadline = match value {
        "off" => PosixDeadline::Never,
        v => match v.parse::<f64>() {
            Ok(t) if t.is_finite() && t > 0.0 && t <= 3600.0 => {
                PosixDeadline::Always(Duration::from_secs_f64(t))
            }
            _ => {
                return Err(invalid(format!(
                    "bad timeout={v} for a POSIX path (seconds, more than 0, at most 3600, or off)"
                )));
            }
        },
    };
    Ok((PathBuf::from(path), deadline))
}

/// File systems whose calls do not hang on a lost server: local disks and memory.
fn never_hangs(fs_type: i64) -> bool {
    const LOCAL: &[i64] = &[
        0xEF53,      // ext2/3/4
        0x5846_5342, // xfs
        0x9123_683E, // btrfs
        0x0102_1994, // tmpfs
        0x8584_58f6, // ramfs
        0x794C_7630, // overlayfs
        0x2FC1_2FC1, // zfs
        0xF2F5_2010, // f2fs
        0xCA45_1A4E, // bcachefs
        0x3153_464A, // jfs
    ];
    LOCAL.contains(&fs_type)
}

fn fs_type(root: &Path) -> Option<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(root.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st a valid out-pointer.
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0).then_some(st.f_type as i64)
}

/// Opens the POSIX source at `location` (`PATH[?timeout=SECONDS|off]`), with a per-call
/// deadline unless the directory is on a local disk or memory file system (or `off`).
/// The open itself (and the file-system check) is bounded by the deadline too.
pub fn open_posix(location: &Path) -> SourceResult<Box<dyn Source>> {
    let (root, deadline) = parse_posix(location)?;
    if deadline == PosixDeadline::Never {
        return Ok(Box::new(PosixSource::open(&root)?));
    }
    let timeout = match deadline {
        PosixDeadline::Always(t) => t,
        _ => DEFAULT_TIMEOUT,
    };
    let pool = Pool::new(MAX_WORKERS);
    let opened = {
        let root = root.clone();
        pool.run(timeout, move || {
            let local = fs_type(&root).is_some_and(never_hangs);
            PosixSource::open(&root).map(|s| (s, local))
        })
    };
    let (source, local) = match opened {
        Some(r) => r?,
        None => {
            return Err(hung_error(
                &root.display().to_string(),
                "open",
                &SourcePath::root(),
                timeout,
            ));
        }
    };
    if local && deadline == PosixDeadline::Auto {
        return Ok(Box::new(source));
    }
    Ok(Box::new(DeadlineSource::with_pool(
        Arc::new(source),
        root.display().to_string(),
        timeout,
        pool,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    #[test]
    fn posix_timeout_option_parses() {
        let p = |s: &str| parse_posix(Path::new(s));
        assert_eq!(
            p("/srv/old").unwrap(),
            ("/srv/old".into(), PosixDeadline::Auto)
        );
        assert_eq!(
            p("/srv/old?timeout=2.5").unwrap(),
            (
                "/srv/old".into(),
                PosixDeadline::Always(Duration::from_millis(2500))
            )
        );
        assert_eq!(
            p("/srv/old?timeout=off").unwrap(),
            ("/srv/old".into(), PosixDeadline::Never)
        );
        for bad in ["0", "-1", "soon", "", "7200", "nan"] {
            let e = p(&format!("/x?timeout={bad}")).unwrap_err();
            assert_eq!(e.kind, SourceErrorKind::Invalid);
            assert!(e.message.contains("timeout"), "{e}");
        }
    }

    #[test]
    fn a_call_that_blocks_fails_at_its_deadline_and_the_pool_stays_bounded() {
        let pool = Pool::new(4);
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let ran = Arc::new(AtomicUsize::new(0));
        let block = |release: Arc<(Mutex<bool>, Condvar)>, ran: Arc<AtomicUsize>| {
            move || {
                let (m, c) = &*release;
                let mut g = m.lock().unwrap();
                while !*g {
                    g = c.wait(g).unwrap();
                }
                ran.fetch_add(1, Ordering::SeqCst);
            }
        };
        // Six blocking calls: four workers stuck, two calls queued; all fail in time.
        let t0 = Instant::now();
        let waits: Vec<_> = (0..6)
            .map(|_| {
                let (pool, f) = (pool.clone(), block(release.clone(), ran.clone()));
                std::thread::spawn(move || pool.run(Duration::from_millis(200), f))
            })
            .collect();
        for w in waits {
            assert!(w.join().unwrap().is_none());
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(pool.lock().workers, 4, "bounded");
        assert!(
            pool.lock().jobs.is_empty(),
            "timed-out jobs leave the queue"
        );
        // Stuck workers come back when their calls return, and serve again.
        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        assert_eq!(pool.run(Duration::from_secs(5), || 7), Some(7));
        let t0 = Instant::now();
        while ran.load(Ordering::SeqCst) < 4 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(ran.load(Ordering::SeqCst), 4, "queued calls never ran late");
    }

    /// A source whose `stat` of `/stuck` blocks until released (a hung mount), of `/slow`
    /// answers after 300 ms; every other `stat` answers at once.
    struct Blocking {
        release: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Source for Blocking {
        fn describe(&self) -> String {
            "blocking".into()
        }
        fn features(&self) -> SourceFeatures {
            SourceFeatures::default()
        }
        fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
            match path.to_string().as_str() {
                "/stuck" => {
                    let (m, c) = &*self.release;
                    let mut g = m.lock().unwrap();
                    while !*g {
                        g = c.wait(g).unwrap();
                    }
                }
                "/slow" => std::thread::sleep(Duration::from_millis(300)),
                _ => {}
            }
            Ok(SourceAttr::plain(
                kaiso_store::migrate::FileKind::Regular,
                1,
                0,
                Default::default(),
            ))
        }
        fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
        fn read(&self, path: &SourcePath, _: u64, _: usize) -> SourceResult<Vec<u8>> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
        fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
        fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
        fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
        fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
        fn read_stream(
            &self,
            path: &SourcePath,
            _: &str,
            _: u64,
            _: usize,
        ) -> SourceResult<Vec<u8>> {
            Err(SourceError::new(SourceErrorKind::Unsupported, path, "no"))
        }
    }

    /// Releases the blocked calls when dropped (a failing test leaves no stuck thread).
    struct Release(Arc<(Mutex<bool>, Condvar)>);

    impl Drop for Release {
        fn drop(&mut self) {
            *self.0.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
            self.0.1.notify_all();
        }
    }

    #[test]
    fn calls_after_one_hung_call_fail_within_a_grace_not_a_deadline_each() {
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let _release = Release(release.clone());
        // 2 s: the 300 ms call below must fit its deadline on a busy machine too (6x).
        let timeout = Duration::from_secs(2);
        let s = DeadlineSource::with_pool(
            Arc::new(Blocking {
                release: release.clone(),
            }),
            "/old".into(),
            timeout,
            Pool::new(MAX_WORKERS),
        );
        let p = |n: &[u8]| SourcePath::parse(n).unwrap();
        // One client operation that makes six calls in a row into a hung mount (metadata,
        // then reads, then the kernel's retry): it fails within about one deadline, not six.
        let t0 = Instant::now();
        for i in 0..6 {
            let e = s.stat(&p(b"stuck")).unwrap_err();
            assert_eq!(e.kind, SourceErrorKind::Unreachable, "call {i}: {e}");
            assert!(e.message.contains("did not return within"), "{e}");
        }
        let took = t0.elapsed();
        // Expected: one deadline and five graces (1.5 deadlines). A deadline each would
        // take at least 6 deadlines (the pool enforces that), so the bound sits at 5: over
        // 3x the expected time for scheduling delays, and still below the failure.
        assert!(
            took >= timeout && took < timeout * 5,
            "six calls into a hung source failed after {took:?} in all: expected one \
             deadline ({timeout:?}) and a short grace for each further call, not a deadline each"
        );
        // Another file answers at once: the source is not wholly hung, so the next calls
        // get their whole deadline again (a call slower than the grace succeeds).
        // (Bounded retries: on a loaded machine a worker may start later than the grace;
        // the call then still returns and ends the hung state.)
        let answered = (0..50).any(|_| s.stat(&p(b"fast")).is_ok());
        assert!(
            answered,
            "a call that answers at once failed 50 times in a row"
        );
        s.stat(&p(b"slow"))
            .expect("a 300 ms call after the source answered again gets its whole deadline");
        // The stuck calls return: the source serves again.
        drop(_release);
        assert!(s.stat(&p(b"stuck")).is_ok());
        assert!(s.stat(&p(b"slow")).is_ok());
    }

    #[test]
    fn calls_on_a_local_directory_go_through() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"bytes").unwrap();
        let loc = format!("{}?timeout=5", d.path().display());
        let s = open_posix(Path::new(&loc)).unwrap();
        assert_eq!(s.describe(), format!("posix:{}", d.path().display()));
        let f = SourcePath::parse(b"f").unwrap();
        let mut buf = vec![0; 16];
        let (n, _) = s.read_into(&f, 1, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"ytes");
        assert_eq!(s.stat(&f).unwrap().size, 5);
        let e = s.stat(&SourcePath::parse(b"nope").unwrap()).unwrap_err();
        assert_eq!(e.kind, SourceErrorKind::NotFound);
    }
}
