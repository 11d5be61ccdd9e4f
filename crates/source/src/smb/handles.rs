//! File handles kept open from a file's metadata fetch for its first read.
//!
//! A crawl asks for a file's EAs, security descriptor and streams in its metadata pass
//! and reads the file in its data pass; each needs an open handle. Keeping the handle of
//! the metadata fetch for the read spares the read its CREATE round trip and the CLOSE
//! of the first handle. Likewise a read that stops before the end of the file (one
//! unit of a bigger file) keeps its handle for the file's next unit. A kept handle is
//! used once (by the next read of the main stream) and only for a short while; older
//! ones are closed, and so is everything beyond a bound (a server limits the files one
//! client holds open).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kaiso_store::migrate::SourcePath;
use smb::Resource;

use super::link::Link;

/// How long a handle is kept for the read: a metadata-first crawl reads a file after the
/// whole tree's metadata pass, so this is a wait of seconds to minutes on a big tree.
const TTL: Duration = Duration::from_secs(60);

/// Handle kept on one session, with the session it belongs to.
struct Kept {
    at: Instant,
    link: Arc<Link>,
    file: smb::File,
}

/// Open handles by path, oldest first.
pub(super) struct OpenFiles {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_path: HashMap<SourcePath, Kept>,
    /// Paths in the order their handles were kept (a path may appear again after being
    /// taken and kept anew: stale positions are skipped).
    order: VecDeque<(Instant, SourcePath)>,
}

impl OpenFiles {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Keeps `r` (a regular file opened on `link`) for the next read of `path`; anything
    /// else, or beyond the bound, is closed.
    pub fn keep(&self, path: &SourcePath, link: &Arc<Link>, r: Resource) {
        let file = match r {
            Resource::File(f) if self.capacity > 0 => f,
            other => return link.close(other),
        };
        let now = Instant::now();
        let mut to_close = Vec::new();
        {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            // Expired, or too many: the oldest go.
            while let Some((at, p)) = inner.order.front().cloned() {
                let over = inner.by_path.len() >= self.capacity;
                if !over && now.duration_since(at) < TTL {
                    break;
                }
                inner.order.pop_front();
                if inner.by_path.get(&p).is_some_and(|k| k.at == at)
                    && let Some(k) = inner.by_path.remove(&p)
                {
                    to_close.push(k);
                }
            }
            inner.order.push_back((now, path.clone()));
            // Taken handles leave their positions behind until they expire: at a fast
            // crawl's pace that is many more than the handles kept, so drop them now
            // and then (amortised: at most once per `capacity` keeps).
            if inner.order.len() > 2 * self.capacity {
                let Inner { by_path, order } = &mut *inner;
                order.retain(|(at, p)| by_path.get(p).is_some_and(|k| k.at == *at));
            }
            if let Some(old) = inner.by_path.insert(
                path.clone(),
                Kept {
                    at: now,
                    link: link.clone(),
                    file,
                },
            ) {
                to_close.push(old);
            }
        }
        for k in to_close {
            k.link.close(Resource::File(k.file));
        }
    }

    /// The handle kept for `path`, if it is fresh and its session is still up.
    pub fn take(&self, path: &SourcePath) -> Option<(Arc<Link>, smb::File)> {
        let k = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .by_path
            .remove(path)?;
        if k.at.elapsed() >= TTL || k.link.is_broken() {
            k.link.close(Resource::File(k.file));
            return None;
        }
        Some((k.link, k.file))
    }

    /// Closes every kept handle (the source is going away, or its server broke).
    pub fn close_all(&self) {
        let kept: Vec<Kept> = {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            inner.order.clear();
            inner.by_path.drain().map(|(_, k)| k).collect()
        };
        for k in kept {
            k.link.close(Resource::File(k.file));
        }
    }
}
