//! Answers fetched ahead on a handle that was open anyway.
//!
//! The engine asks for a file's EAs, security descriptor and streams in three calls, and
//! for a directory's attributes, EAs and descriptor right after listing it. Each call on
//! its own would open a handle (a round trip), query (another) and close. Instead the
//! first call opens once and sends every query at the same time; the answers the caller
//! did not ask for wait here for the calls that follow. Each answer is handed out once
//! and only for a short while, so a later call (a `finish` check, a second look at the
//! same path) asks the server again. One thread at a time fetches a path (the others
//! wait for its answers), and a background job skips a path fetched lately.

use std::collections::{HashMap, HashSet};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use kaiso_store::migrate::{SourceAcl, SourceAttr, SourcePath, SourceResult, SourceStream};

/// How long a fetched-ahead answer may wait for its call (a crawl's metadata pass comes
/// soon after the listing; an answer not used by then is dropped and asked again).
const TTL: Duration = Duration::from_secs(30);
/// Paths kept at most; beyond it the expired ones go, then everything.
const CAPACITY: usize = 16_384;

/// Extended attributes as (name, value) pairs.
pub(super) type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// The answers for one path; `None` = not fetched, or already handed out.
#[derive(Default)]
pub(super) struct Fetched {
    pub attr: Option<SourceResult<SourceAttr>>,
    pub xattrs: Option<SourceResult<Xattrs>>,
    pub acl: Option<SourceResult<SourceAcl>>,
    pub streams: Option<SourceResult<Vec<SourceStream>>>,
}

impl Fetched {
    fn is_empty(&self) -> bool {
        self.attr.is_none() && self.xattrs.is_none() && self.acl.is_none() && self.streams.is_none()
    }

    /// Takes every answer `other` has over the one kept here.
    fn merge(&mut self, other: Fetched) {
        fn over<T>(old: &mut Option<T>, new: Option<T>) {
            if new.is_some() {
                *old = new;
            }
        }
        over(&mut self.attr, other.attr);
        over(&mut self.xattrs, other.xattrs);
        over(&mut self.acl, other.acl);
        over(&mut self.streams, other.streams);
    }

    /// Drops failed answers: a failure is not kept for later (it may be transient, and a
    /// call of its own gives it with its own label).
    fn only_successes(mut self) -> Self {
        fn keep<T>(r: &mut Option<SourceResult<T>>) {
            if matches!(r, Some(Err(_))) {
                *r = None;
            }
        }
        keep(&mut self.attr);
        keep(&mut self.xattrs);
        keep(&mut self.acl);
        keep(&mut self.streams);
        self
    }
}

/// Fetched-ahead answers by path, the paths being fetched right now, and the paths
/// fetched lately (so a background job queued before the crawl got there does not fetch
/// a file a second time).
#[derive(Default)]
pub(super) struct Prefetch {
    map: Mutex<HashMap<SourcePath, (Instant, Fetched)>>,
    pending: Mutex<Pending>,
    done: Condvar,
}

/// Paths being fetched, and paths fetched (by anyone) within the last [`TTL`].
#[derive(Default)]
struct Pending {
    fetching: HashSet<SourcePath>,
    fetched: HashMap<SourcePath, Instant>,
}

impl Prefetch {
    /// Claims `path` for one fetch of its metadata: false while another thread fetches
    /// it. A background claim is also refused for a path fetched within the last
    /// [`TTL`] (its answers were kept, or already handed out to the calls).
    pub fn claim(&self, path: &SourcePath, background: bool) -> bool {
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if p.fetching.contains(path) {
            return false;
        }
        if background && p.fetched.get(path).is_some_and(|at| at.elapsed() < TTL) {
            return false;
        }
        p.fetching.insert(path.clone())
    }

    /// Ends a [`Prefetch::claim`]: keeps what was fetched and wakes the callers waiting.
    pub fn finish(&self, path: &SourcePath, f: Fetched) {
        self.put(path, f);
        let mut p = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        p.fetching.remove(path);
        if p.fetched.len() >= CAPACITY {
            p.fetched.retain(|_, at| at.elapsed() < TTL);
            if p.fetched.len() >= CAPACITY {
                p.fetched.clear();
            }
        }
        p.fetched.insert(path.clone(), Instant::now());
        drop(p);
        self.done.notify_all();
    }

    /// Waits (at most `limit`) while `path` is being fetched ahead, so a call does not
    /// ask the server a second time for what is already on its way.
    pub fn wait_for(&self, path: &SourcePath, limit: Duration) {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .done
            .wait_timeout_while(pending, limit, |p| p.fetching.contains(path))
            .unwrap_or_else(|p| p.into_inner());
    }

    /// Keeps the successful answers in `f` for the calls to come, next to those already
    /// kept for `path` (a new answer replaces an old one).
    pub fn put(&self, path: &SourcePath, f: Fetched) {
        let f = f.only_successes();
        if f.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= CAPACITY {
            map.retain(|_, (at, _)| now.duration_since(*at) < TTL);
            if map.len() >= CAPACITY {
                map.clear();
            }
        }
        match map.get_mut(path) {
            Some((at, old)) if now.duration_since(*at) < TTL => {
                *at = now;
                old.merge(f);
            }
            _ => {
                map.insert(path.clone(), (now, f));
            }
        }
    }

    /// Hands out one answer (`pick` takes it out of the entry), if it is there and fresh.
    pub fn take<T>(
        &self,
        path: &SourcePath,
        pick: impl FnOnce(&mut Fetched) -> Option<SourceResult<T>>,
    ) -> Option<SourceResult<T>> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (at, f) = map.get_mut(path)?;
        if at.elapsed() >= TTL {
            map.remove(path);
            return None;
        }
        let got = pick(f);
        if f.is_empty() {
            map.remove(path);
        }
        got
    }

    /// Forgets everything (after the connection to the server broke).
    pub fn clear(&self) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .fetched
            .clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaiso_store::migrate::{SourceError, SourceErrorKind};

    fn p(s: &str) -> SourcePath {
        SourcePath::parse(s.as_bytes()).unwrap()
    }

    #[test]
    fn answers_are_handed_out_once_and_failures_are_not_kept() {
        let cache = Prefetch::default();
        let path = p("a/b");
        cache.put(
            &path,
            Fetched {
                xattrs: Some(Ok(vec![(b"user.x".to_vec(), b"1".to_vec())])),
                acl: Some(Err(SourceError::new(SourceErrorKind::Io, &path, "boom"))),
                streams: Some(Ok(Vec::new())),
                ..Fetched::default()
            },
        );
        assert!(
            cache.take(&path, |f| f.acl.take()).is_none(),
            "failure kept"
        );
        assert!(cache.take(&p("a"), |f| f.xattrs.take()).is_none());
        let x = cache.take(&path, |f| f.xattrs.take()).unwrap().unwrap();
        assert_eq!(x, vec![(b"user.x".to_vec(), b"1".to_vec())]);
        assert!(
            cache.take(&path, |f| f.xattrs.take()).is_none(),
            "given twice"
        );
        assert!(
            cache
                .take(&path, |f| f.streams.take())
                .unwrap()
                .unwrap()
                .is_empty()
        );
        assert!(cache.map.lock().unwrap().is_empty(), "empty entry left");
    }

    #[test]
    fn one_fetch_at_a_time_and_background_jobs_skip_fetched_paths() {
        let cache = Prefetch::default();
        let path = p("f");
        assert!(cache.claim(&path, true));
        assert!(!cache.claim(&path, false), "claimed twice while fetching");
        // What a listing knew stays next to what the fetch brings.
        cache.put(
            &path,
            Fetched {
                xattrs: Some(Ok(Vec::new())),
                ..Fetched::default()
            },
        );
        cache.finish(
            &path,
            Fetched {
                streams: Some(Ok(Vec::new())),
                ..Fetched::default()
            },
        );
        assert!(cache.take(&path, |f| f.streams.take()).is_some());
        assert!(cache.take(&path, |f| f.xattrs.take()).is_some());
        assert!(!cache.claim(&path, true), "background job fetched it again");
        assert!(cache.claim(&path, false), "a call may always ask again");
        cache.finish(&path, Fetched::default());
        cache.clear();
        assert!(cache.claim(&path, true), "forgotten after clear");
    }

    #[test]
    fn expired_answers_are_not_handed_out() {
        let cache = Prefetch::default();
        let path = p("old");
        cache.put(
            &path,
            Fetched {
                streams: Some(Ok(Vec::new())),
                ..Fetched::default()
            },
        );
        let Some(then) = Instant::now().checked_sub(TTL) else {
            return; // the clock started less than TTL ago: nothing to age
        };
        cache.map.lock().unwrap().get_mut(&path).unwrap().0 = then;
        assert!(cache.take(&path, |f| f.streams.take()).is_none());
        assert!(cache.map.lock().unwrap().is_empty());
    }
}
