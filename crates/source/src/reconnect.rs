//! A share's source that could not be reached when the migration daemon started: the
//! share is served anyway. Until the source connects, every call fails `Unreachable` at
//! once (the store answers EIO for what only the source has, JUKEBOX on NFS; complete
//! files and every other share are served as usual), while a background thread retries
//! the connect with back-off. Once connected, calls go to the real source and the
//! caller's `on_connect` runs (the daemon resumes the crawl).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, SystemTime};

use kaiso_store::migrate::{
    Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind, SourceFeatures,
    SourcePath, SourceResult, SourceStream,
};

/// The first retry comes after this long; each failure doubles the wait up to
/// [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Refused credentials are retried more slowly (an account lockout policy counts them).
const MAX_BACKOFF_REFUSED: Duration = Duration::from_secs(60);

/// Makes a connection to the real source (e.g. `open_source` of the share's URL); the
/// error's message is what `status` shows.
pub type Connect = Box<dyn Fn() -> Result<Box<dyn Source>, SourceError> + Send + Sync>;

/// Checks a connected source before it is used (e.g. that it describes itself as the
/// share recorded); an error keeps the share disconnected and is retried.
pub type Check = Box<dyn Fn(&dyn Source) -> Result<(), String> + Send + Sync>;

struct Shared {
    described: String,
    connected: RwLock<Option<Arc<dyn Source>>>,
    /// Since when the source is unreachable and the last error (None once connected).
    down: Mutex<Option<(SystemTime, String)>>,
    stop: AtomicBool,
}

/// Whether a [`ReconnectingSource`] is connected yet; stops its retries when dropped.
pub struct ReconnectWatch {
    shared: Arc<Shared>,
}

impl ReconnectWatch {
    /// Since when the source cannot be reached and why (None: connected).
    pub fn down(&self) -> Option<(SystemTime, String)> {
        self.shared
            .down
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for ReconnectWatch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

/// A source that is not connected yet and connects in the background.
pub struct ReconnectingSource {
    shared: Arc<Shared>,
}

impl ReconnectingSource {
    /// Starts retrying `connect` (first retry after [`FIRST_BACKOFF`]); `first_error` is
    /// why the first attempt failed, `described` what [`Source::describe`] answers
    /// meanwhile (the share's recorded source). `on_connect` runs once, on the retry
    /// thread, after the source connected and passed `check`.
    pub fn start(
        described: String,
        first_error: String,
        connect: Connect,
        check: Check,
        on_connect: Box<dyn FnOnce() + Send>,
    ) -> (Self, ReconnectWatch) {
        let shared = Arc::new(Shared {
            described,
            connected: RwLock::new(None),
            down: Mutex::new(Some((SystemTime::now(), first_error))),
            stop: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&shared);
        let _ = std::thread::Builder::new()
            .name("kaiso-reconnect".into())
            .spawn(move || retry(weak, connect, check, on_connect));
        (
            Self {
                shared: shared.clone(),
            },
            ReconnectWatch { shared },
        )
    }

    fn source(&self, path: &SourcePath) -> SourceResult<Arc<dyn Source>> {
        if let Some(s) = &*self
            .shared
            .connected
            .read()
            .unwrap_or_else(|e| e.into_inner())
        {
            return Ok(s.clone());
        }
        let why = match &*self.shared.down.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((_, e)) => e.clone(),
            None => "not connected".into(),
        };
        Err(SourceError::new(
            SourceErrorKind::Unreachable,
            path,
            format!(
                "source {} unreachable (reconnecting in the background): {why}",
                self.shared.described
            ),
        ))
    }
}

/// The retry loop: ends when connected, or when the share is gone (source dropped) or
/// its watch dropped.
fn retry(weak: Weak<Shared>, connect: Connect, check: Check, on_connect: Box<dyn FnOnce() + Send>) {
    let mut wait = FIRST_BACKOFF;
    loop {
        // Sleep in small steps: a finished or stopped share ends the thread promptly.
        let mut slept = Duration::ZERO;
        while slept < wait {
            let step = Duration::from_millis(100).min(wait - slept);
            std::thread::sleep(step);
            slept += step;
            match weak.upgrade() {
                Some(s) if !s.stop.load(Ordering::Relaxed) => {}
                _ => return,
            }
        }
        let (error, refused) = match connect() {
            Ok(source) => match check(&*source) {
                Ok(()) => {
                    let Some(shared) = weak.upgrade() else {
                        return;
                    };
                    *shared.connected.write().unwrap_or_else(|e| e.into_inner()) =
                        Some(Arc::from(source));
                    *shared.down.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    tracing::info!(source = %shared.described, "source reachable again");
                    drop(shared);
                    on_connect();
                    return;
                }
                Err(e) => (e, false),
            },
            Err(e) => {
                let refused = e.kind == SourceErrorKind::PermissionDenied;
                (e.message, refused)
            }
        };
        let Some(shared) = weak.upgrade() else {
            return;
        };
        tracing::debug!(source = %shared.described, %error, "source still unreachable");
        if let Some((_, last)) = &mut *shared.down.lock().unwrap_or_else(|e| e.into_inner()) {
            *last = error;
        }
        let cap = if refused {
            MAX_BACKOFF_REFUSED
        } else {
            MAX_BACKOFF
        };
        wait = (wait * 2).min(cap);
    }
}

impl Source for ReconnectingSource {
    fn describe(&self) -> String {
        self.shared.described.clone()
    }

    fn identity(&self) -> Option<String> {
        self.source(&SourcePath::root()).ok()?.identity()
    }

    /// Nothing is read before the source connects, so what it offers matters only then.
    fn features(&self) -> SourceFeatures {
        self.source(&SourcePath::root())
            .map(|s| s.features())
            .unwrap_or_default()
    }

    fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
        self.source(path)?.stat(path)
    }

    fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
        self.source(path)?.read_dir(path)
    }

    fn read_dir_with_attr(
        &self,
        path: &SourcePath,
    ) -> SourceResult<(Vec<SourceEntry>, Option<SourceAttr>)> {
        self.source(path)?.read_dir_with_attr(path)
    }

    fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
        self.source(path)?.read(path, offset, len)
    }

    fn read_with_attr(
        &self,
        path: &SourcePath,
        offset: u64,
        len: usize,
    ) -> SourceResult<(Vec<u8>, Option<SourceAttr>)> {
        self.source(path)?.read_with_attr(path, offset, len)
    }

    fn read_into(
        &self,
        path: &SourcePath,
        offset: u64,
        buf: &mut [u8],
    ) -> SourceResult<(usize, Option<SourceAttr>)> {
        self.source(path)?.read_into(path, offset, buf)
    }

    fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
        self.source(path)?.read_link(path)
    }

    fn xattrs(&self, path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.source(path)?.xattrs(path)
    }

    fn acl(&self, path: &SourcePath) -> SourceResult<SourceAcl> {
        self.source(path)?.acl(path)
    }

    fn streams(&self, path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
        self.source(path)?.streams(path)
    }

    fn read_stream(
        &self,
        path: &SourcePath,
        stream: &str,
        offset: u64,
        len: usize,
    ) -> SourceResult<Vec<u8>> {
        self.source(path)?.read_stream(path, stream, offset, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Instant;

    #[test]
    fn calls_fail_at_once_until_the_source_connects_then_go_through() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("src");
        let (tx, rx) = mpsc::channel();
        // The retry is held back until the test lets it go (or 30 s pass): a call that
        // waited for a retry would take that long, however fast or slow the machine.
        let (go, held) = mpsc::channel::<()>();
        let held = std::sync::Mutex::new(held);
        let r2 = root.clone();
        let (s, watch) = ReconnectingSource::start(
            format!("posix:{}", root.display()),
            "first error".into(),
            Box::new(move || {
                let _ = held
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .recv_timeout(Duration::from_secs(30));
                crate::PosixSource::open(&r2).map(|s| Box::new(s) as Box<dyn Source>)
            }),
            Box::new(|_| Ok(())),
            Box::new(move || {
                let _ = tx.send(());
            }),
        );
        let f = SourcePath::parse(b"f").unwrap();
        let t0 = Instant::now();
        let e = s.stat(&f).unwrap_err();
        assert_eq!(e.kind, SourceErrorKind::Unreachable);
        assert!(e.message.contains("first error"), "{e}");
        // At once: no wait for the retry (held back above for 30 s).
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the first call waited for the retry: {:?}",
            t0.elapsed()
        );
        assert!(watch.down().is_some());
        assert_eq!(s.describe(), format!("posix:{}", root.display()));
        // The source appears: the retry connects and says so.
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("f"), b"bytes").unwrap();
        let _ = go.send(());
        rx.recv_timeout(Duration::from_secs(10)).expect("connected");
        assert!(watch.down().is_none());
        assert_eq!(s.stat(&f).unwrap().size, 5);
    }

    #[test]
    fn a_failed_check_keeps_it_down_with_the_reason() {
        let (s, watch) = ReconnectingSource::start(
            "posix:/nowhere".into(),
            "first".into(),
            Box::new(|| {
                let d = std::env::temp_dir();
                crate::PosixSource::open(d).map(|s| Box::new(s) as Box<dyn Source>)
            }),
            Box::new(|_| Err("another tree".into())),
            Box::new(|| panic!("must not connect")),
        );
        let t0 = Instant::now();
        while watch.down().is_some_and(|(_, e)| e == "first") {
            assert!(t0.elapsed() < Duration::from_secs(10));
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(watch.down().unwrap().1, "another tree");
        let e = s.read_dir(&SourcePath::root()).unwrap_err();
        assert!(e.message.contains("another tree"), "{e}");
    }
}
