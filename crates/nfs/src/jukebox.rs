//! NFS3ERR_JUKEBOX: answer "try again later" when a store call takes too long, and keep the
//! work going so the client's retry finds it finished (or joins it while it still runs).
//!
//! Every store call of the face runs on a blocking worker under a [`Key`] (operation,
//! inode, range or name). A request waits up to `after` for its result; past that it gets
//! NFS3ERR_JUKEBOX while the worker keeps running. A request with the same key that arrives
//! while the work is in flight (the retry) waits on that same work instead of starting it
//! again. Results nobody collected are dropped after [`KEEP_UNCLAIMED`], and as soon as the
//! inode is changed by another operation (so a late retry never sees stale data).

use nfs3_server::nfs3_types::nfs3::nfsstat3;
use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long a finished result waits for its retry. The Linux client retries JUKEBOX
/// after 5 s (NFS_JUKEBOX_RETRY_TIME), so this leaves room for several rounds.
pub const KEEP_UNCLAIMED: Duration = Duration::from_secs(30);

/// Which work a request asks for: equal keys share one in-flight store call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub op: &'static str,
    pub ino: u64,
    pub offset: u64,
    pub len: u64,
    /// Names (lookup, create, rename target…) or other distinguishing bytes.
    pub extra: Vec<u8>,
}

impl Key {
    pub fn new(op: &'static str, ino: u64) -> Key {
        Key {
            op,
            ino,
            offset: 0,
            len: 0,
            extra: Vec::new(),
        }
    }
    pub fn range(mut self, offset: u64, len: u64) -> Key {
        self.offset = offset;
        self.len = len;
        self
    }
    pub fn extra(mut self, bytes: &[u8]) -> Key {
        self.extra.extend_from_slice(bytes);
        self.extra.push(0);
        self
    }
}

type Outcome = Arc<dyn Any + Send + Sync>;

struct Work {
    done: watch::Sender<Option<Outcome>>,
    finished_at: Mutex<Option<Instant>>,
}

/// How long a store call that failed for a reason that passes (the migration source did
/// not answer a fetch, or the store was busy) is tried again by default (see
/// [`crate::fs`]'s `Retry`).
pub const RETRY_FOR: Duration = Duration::from_secs(60);

/// The in-flight table and the JUKEBOX deadline.
pub struct Jukebox {
    /// `None`: never answer JUKEBOX, wait for every call.
    after: Option<Duration>,
    /// How long a call failing for a reason that passes is tried again.
    retry_for: Duration,
    inflight: Mutex<HashMap<Key, Arc<Work>>>,
    replies: AtomicU64,
    joined: AtomicU64,
}

impl Jukebox {
    pub fn new(after: Option<Duration>) -> Jukebox {
        Jukebox::with_retry(after, RETRY_FOR)
    }

    /// As [`Jukebox::new`], trying a store call that fails for a reason that passes
    /// again for up to `retry_for`.
    pub fn with_retry(after: Option<Duration>, retry_for: Duration) -> Jukebox {
        Jukebox {
            after,
            retry_for,
            inflight: Mutex::new(HashMap::new()),
            replies: AtomicU64::new(0),
            joined: AtomicU64::new(0),
        }
    }

    /// How long a store call failing for a reason that passes is tried again.
    pub fn retry_for(&self) -> Duration {
        self.retry_for
    }

    /// The status a client gets for `e`, a failure of the work itself: "try again later"
    /// (a store call still busy when its retries ran out) only to clients that were
    /// promised JUKEBOX; with JUKEBOX off the face waits, so it must not answer it now.
    pub fn settle(&self, e: nfsstat3) -> nfsstat3 {
        if e == nfsstat3::NFS3ERR_JUKEBOX && self.after.is_none() {
            nfsstat3::NFS3ERR_IO
        } else {
            e
        }
    }

    /// NFS3ERR_JUKEBOX replies sent so far.
    pub fn replies(&self) -> u64 {
        self.replies.load(Ordering::Relaxed)
    }

    /// Requests that joined work already in flight (retries).
    pub fn joined(&self) -> u64 {
        self.joined.load(Ordering::Relaxed)
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Work>>> {
        self.inflight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forget finished, uncollected results about `ino` (it has just changed).
    pub fn invalidate(&self, ino: u64) {
        self.table()
            .retain(|k, w| k.ino != ino || w.done.borrow().is_none());
    }

    /// Run `work` under `key`, or join the same work already in flight.
    pub async fn run<T, F>(&self, key: Key, work: F) -> Result<T, nfsstat3>
    where
        T: Clone + Send + Sync + 'static,
        F: FnOnce() -> Result<T, nfsstat3> + Send + 'static,
    {
        let (entry, fresh) = {
            let mut table = self.table();
            let now = Instant::now();
            table.retain(|_, w| {
                w.finished_at
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .is_none_or(|t| now - t < KEEP_UNCLAIMED)
            });
            match table.get(&key) {
                Some(w) => (w.clone(), false),
                None => {
                    let w = Arc::new(Work {
                        done: watch::channel(None).0,
                        finished_at: Mutex::new(None),
                    });
                    table.insert(key.clone(), w.clone());
                    (w, true)
                }
            }
        };
        if fresh {
            let w = entry.clone();
            tokio::task::spawn_blocking(move || {
                // A panicking store call must still finish the work, or retries would wait forever.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                    .unwrap_or(Err(nfsstat3::NFS3ERR_SERVERFAULT));
                *w.finished_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                w.done.send_replace(Some(Arc::new(r) as Outcome));
            });
        } else {
            self.joined.fetch_add(1, Ordering::Relaxed);
        }
        let mut rx = entry.done.subscribe();
        let waited = match self.after {
            Some(after) => tokio::time::timeout(after, rx.wait_for(Option::is_some)).await,
            None => Ok(rx.wait_for(Option::is_some).await),
        };
        let outcome = match waited {
            Ok(Ok(v)) => v.clone().expect("wait_for returned a finished value"),
            Ok(Err(_)) => return Err(nfsstat3::NFS3ERR_SERVERFAULT),
            Err(_) => {
                self.replies.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(?key, "NFS3ERR_JUKEBOX: work continues in the background");
                return Err(nfsstat3::NFS3ERR_JUKEBOX);
            }
        };
        // Collected: the next identical request is new work.
        let mut table = self.table();
        if table.get(&key).is_some_and(|w| Arc::ptr_eq(w, &entry)) {
            table.remove(&key);
        }
        drop(table);
        outcome
            .downcast_ref::<Result<T, nfsstat3>>()
            .cloned()
            .unwrap_or(Err(nfsstat3::NFS3ERR_SERVERFAULT))
            .map_err(|e| self.settle(e))
    }

    /// Work in flight or finished and not collected yet.
    pub fn pending(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn fast_work_answers_directly() {
        rt().block_on(async {
            // A wait no scheduler delay reaches: instant work must be answered directly
            // (a short wait would also time out on a machine too busy to start it soon).
            let j = Jukebox::new(Some(Duration::from_secs(60)));
            assert_eq!(j.run(Key::new("read", 1), || Ok(7u32)).await, Ok(7));
            assert_eq!(j.replies(), 0);
            assert_eq!(j.pending(), 0, "collected results leave the table");
        });
    }

    #[test]
    fn slow_work_answers_jukebox_and_the_retry_joins_it() {
        rt().block_on(async {
            let j = Jukebox::new(Some(Duration::from_millis(100)));
            let runs = Arc::new(AtomicUsize::new(0));
            let job = |runs: Arc<AtomicUsize>| {
                move || {
                    runs.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(400));
                    Ok(vec![1u8, 2, 3])
                }
            };
            let key = Key::new("read", 5).range(0, 3);
            assert_eq!(
                j.run(key.clone(), job(runs.clone())).await,
                Err(nfsstat3::NFS3ERR_JUKEBOX)
            );
            let t0 = Instant::now();
            let mut got = Err(nfsstat3::NFS3ERR_JUKEBOX);
            while got == Err(nfsstat3::NFS3ERR_JUKEBOX) && t0.elapsed() < Duration::from_secs(5) {
                got = j.run(key.clone(), job(runs.clone())).await;
            }
            assert_eq!(got, Ok(vec![1, 2, 3]));
            assert_eq!(
                runs.load(Ordering::SeqCst),
                1,
                "retries joined the first run"
            );
            assert!(j.joined() >= 1);
            // A new request after collection runs again (its blocking thread may start
            // after the request's 100 ms wait on a busy machine: wait for it).
            let _ = j.run(key.clone(), job(runs.clone())).await;
            let t1 = Instant::now();
            while runs.load(Ordering::SeqCst) < 2 && t1.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(
                runs.load(Ordering::SeqCst),
                2,
                "a request after collection did not run the work again within 10 s"
            );
        });
    }

    #[test]
    fn invalidate_drops_finished_results() {
        rt().block_on(async {
            let j = Jukebox::new(Some(Duration::from_millis(20)));
            let key = Key::new("read", 9);
            let r = j
                .run(key.clone(), || {
                    std::thread::sleep(Duration::from_millis(100));
                    Ok(1u8)
                })
                .await;
            assert_eq!(r, Err(nfsstat3::NFS3ERR_JUKEBOX));
            // Wait for the work to finish (not a fixed sleep: its thread may start late on
            // a busy machine, and invalidation keeps work still in flight).
            let finished = || {
                j.table()
                    .get(&key)
                    .is_some_and(|w| w.done.borrow().is_some())
            };
            let t0 = Instant::now();
            while !finished() && t0.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert!(finished(), "the 100 ms work did not finish within 10 s");
            assert_eq!(j.pending(), 1);
            j.invalidate(9);
            assert_eq!(j.pending(), 0);
            assert_eq!(
                j.run(key, || Ok(2u8)).await,
                Ok(2),
                "fresh work after invalidation"
            );
        });
    }

    #[test]
    fn disabled_waits_and_panics_become_serverfault() {
        rt().block_on(async {
            let j = Jukebox::new(None);
            let r = j
                .run(Key::new("x", 1), || {
                    std::thread::sleep(Duration::from_millis(50));
                    Ok(3u8)
                })
                .await;
            assert_eq!(r, Ok(3));
            let p: Result<u8, _> = j.run(Key::new("y", 1), || panic!("boom")).await;
            assert_eq!(p, Err(nfsstat3::NFS3ERR_SERVERFAULT));
        });
    }
}
