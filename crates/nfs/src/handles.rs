//! Open store handles for a stateless protocol: NFS READ/WRITE name a file, not an open
//! file, so the face keeps one store handle per inode and closes it after a while idle.

use kaiso_store::{Fh, FsResult, Ino, Store};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One open store handle; released when the last user drops it.
pub struct OpenFile {
    store: Arc<Store>,
    pub fh: Fh,
    writable: bool,
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        if let Err(e) = self.store.release(self.fh) {
            tracing::debug!(fh = self.fh, error = %e, "release of an idle NFS handle");
        }
    }
}

struct Cached {
    file: Arc<OpenFile>,
    last_used: Instant,
}

/// Inode → open handle, closed after `idle` without use.
pub struct OpenFiles {
    store: Arc<Store>,
    idle: Duration,
    max: usize,
    map: Mutex<HashMap<Ino, Cached>>,
}

impl OpenFiles {
    pub fn new(store: Arc<Store>, idle: Duration, max: usize) -> OpenFiles {
        OpenFiles {
            store,
            idle,
            max,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// A handle on `ino`, writable if `write`. Read-only files (EACCES on O_RDWR at the
    /// backing file) still open for reading.
    pub fn get(&self, ino: Ino, write: bool) -> FsResult<Arc<OpenFile>> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get_mut(&ino)
            && (c.file.writable || !write)
        {
            c.last_used = Instant::now();
            return Ok(c.file.clone());
        }
        let (opened, writable) = match self.store.open_file(ino, libc::O_RDWR, false) {
            Ok(o) => (o, true),
            Err(e) if write => return Err(e),
            Err(_) => (self.store.open_file(ino, libc::O_RDONLY, false)?, false),
        };
        let file = Arc::new(OpenFile {
            store: self.store.clone(),
            fh: opened.fh,
            writable,
        });
        if map.len() >= self.max {
            Self::evict(&mut map, Duration::ZERO);
        }
        map.insert(
            ino,
            Cached {
                file: file.clone(),
                last_used: Instant::now(),
            },
        );
        Ok(file)
    }

    /// Stop caching `ino` (removed or replaced); in-flight users keep their handle.
    pub fn forget(&self, ino: Ino) {
        self.map
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&ino);
    }

    /// Close handles idle for longer than the limit.
    pub fn sweep(&self) {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        Self::evict(&mut map, self.idle);
    }

    fn evict(map: &mut HashMap<Ino, Cached>, idle: Duration) {
        let now = Instant::now();
        map.retain(|_, c| now - c.last_used < idle);
    }

    /// Drop every cached handle (shutdown).
    pub fn clear(&self) {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}
