//! Open files: a per-inode shared state (the move gate, size, current tier, open handles)
//! and per-open handles holding the backing file descriptor.

use crate::stub::StubState;
use crate::types::{DirEntry, FileAttr, Ino};
use std::fs::File;
use std::path::PathBuf;
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
    /// A planned move of this file was refused for its passthrough handles and waits for
    /// them to close: new opens go through kaiso meanwhile (once no passthrough handle is
    /// open), so the passthrough handles drain even while readers keep re-opening it.
    /// Set and cleared by the mover (`mover.rs`, waiting moves).
    pub move_waiting: AtomicBool,
    /// Missing ranges of a migration stub (None: fully resident).
    pub stub: Mutex<Option<StubState>>,
    /// Serialises stub fills of this inode.
    pub fill: Mutex<()>,
    /// Migration state of this file that a client fsync has not made durable yet
    /// ([`STUB_ROW_CHANGED`], [`FILLER_TOUCHED`]); a bit is set after the change it
    /// stands for and cleared by the fsync that makes it durable.
    pub unsynced: AtomicU8,
    /// Client fsyncs making this file's migration state durable right now: bits they
    /// cleared from `unsynced` stand for changes not durable until they finish, so
    /// another fsync may not take the fast path meanwhile.
    pub syncing: AtomicU32,
    /// The file's last name went while handles were open: its size still counts on its
    /// tier (the data still takes room there) until the last handle closes.
    pub counted_unlinked: AtomicBool,
    /// Tier-relative path of the hidden copy of a file with no name left, once the mover
    /// has put it in its tier's orphan directory (see `orphan.rs`); None otherwise.
    /// Changed under the namespace lock.
    pub orphan: Mutex<Option<PathBuf>>,
    /// The ctime clients see while the store's own writes (migration fetches) move the
    /// backing file's (see [`crate::stub::CtimeMask`]).
    pub ctime: Mutex<crate::stub::CtimeMask>,
}

/// [`FileState::unsynced`]: the file's missing ranges changed since a client fsync last
/// made them durable (in memory or in a row committed without fsync).
pub(crate) const STUB_ROW_CHANGED: u8 = 1;
/// [`FileState::unsynced`]: the stub filler was called about this file (its own state of
/// the file may have changed) since a client fsync last synced the filler's state.
pub(crate) const FILLER_TOUCHED: u8 = 2;

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
            move_waiting: AtomicBool::new(false),
            stub: Mutex::new(None),
            fill: Mutex::new(()),
            unsynced: AtomicU8::new(0),
            syncing: AtomicU32::new(0),
            counted_unlinked: AtomicBool::new(false),
            orphan: Mutex::new(None),
            ctime: Mutex::new(crate::stub::CtimeMask::default()),
        })
    }

    /// Record a change of this file's migration state that a client fsync must make
    /// durable. Call after the change.
    pub fn mark_unsynced(&self, bits: u8) {
        self.unsynced.fetch_or(bits, Ordering::AcqRel);
    }

    /// The hidden copy's tier-relative path, if the file lives in an orphan directory.
    pub fn orphan_path(&self) -> Option<PathBuf> {
        self.orphan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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
