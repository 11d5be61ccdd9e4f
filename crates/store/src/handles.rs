//! Open files: a per-inode shared state (the move gate, size, current tier, open handles)
//! and per-open handles holding the backing file descriptor.

use crate::stub::StubState;
use crate::types::{DirEntry, FileAttr, Ino};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

/// State shared by an inode's node and all its open handles, so the data path never needs
/// the namespace lock.
pub(crate) struct FileState {
    pub ino: Ino,
    /// Read/write/truncate/fallocate take it shared; the mover's switch takes it
    /// exclusively, so no request is ever served half from the old copy and half from the
    /// new one. Lock order: the gate before the namespace lock; never take the gate while
    /// holding the namespace lock.
    pub gate: RwLock<()>,
    /// Bumped (under the exclusive gate) each time the mover switches the file to another
    /// copy: a descriptor opened before a change of this counter may point at a deleted copy.
    pub moves: AtomicU64,
    /// Bumped by every data change: the mover redoes its copy if it changed meanwhile.
    pub write_gen: AtomicU64,
    /// Apparent size as kaiso accounts it.
    pub size: AtomicU64,
    /// Tier index holding the data.
    pub tier: AtomicU8,
    pub handles: Mutex<Vec<Weak<Handle>>>,
    /// Handles given to the kernel for passthrough (moves wait until they are closed).
    pub passthrough_open: AtomicU32,
    /// Missing ranges of a migration stub (None: fully resident).
    pub stub: Mutex<Option<StubState>>,
    /// Serialises stub fills of this inode.
    pub fill: Mutex<()>,
}

impl FileState {
    pub fn new(ino: Ino, tier: u8, size: u64) -> Arc<FileState> {
        Arc::new(FileState {
            ino,
            gate: RwLock::new(()),
            moves: AtomicU64::new(0),
            write_gen: AtomicU64::new(0),
            size: AtomicU64::new(size),
            tier: AtomicU8::new(tier),
            handles: Mutex::new(Vec::new()),
            passthrough_open: AtomicU32::new(0),
            stub: Mutex::new(None),
            fill: Mutex::new(()),
        })
    }

    pub fn tier(&self) -> u8 {
        self.tier.load(Ordering::Acquire)
    }

    pub fn open_handles(&self) -> Vec<Arc<Handle>> {
        let mut hs = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        hs.retain(|w| w.strong_count() > 0);
        hs.iter().filter_map(|w| w.upgrade()).collect()
    }

    pub fn has_open_handles(&self) -> bool {
        !self.open_handles().is_empty()
    }

    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        match &*self.stub.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(s) => crate::stub::missing_within(&s.missing, start, end),
            None => Vec::new(),
        }
    }
}

/// One open file.
pub(crate) struct Handle {
    pub state: Arc<FileState>,
    /// Backing file; swapped to the new copy when the mover switches tiers.
    pub file: RwLock<Arc<File>>,
    /// Flags the backing file was opened with (reused when reopening after a move).
    pub flags: i32,
    pub writable: bool,
    /// Served by kernel passthrough (cleared if the face could not set that up).
    pub passthrough: AtomicBool,
    /// Room this handle holds on tier `reserve_tier` (counted in that tier's usage) for a
    /// passthrough writer's growth, which the kernel writes without asking kaiso.
    pub reserved: AtomicU64,
    pub reserve_tier: u8,
}

impl Handle {
    pub fn is_passthrough(&self) -> bool {
        self.passthrough.load(Ordering::Acquire)
    }

    pub fn file(&self) -> Arc<File> {
        self.file.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One open directory: a snapshot of its entries, so listing is stable while it changes.
pub(crate) struct DirHandle {
    pub ino: Ino,
    pub entries: Vec<(DirEntry, Option<FileAttr>)>,
    pub read_once: bool,
}
