//! The caller's layout map: which file, and where in it, each chunk of a volume holds.
//!
//! In the thesis the guest agent reports `FIEMAP` extents and the host inverts them into an
//! LBA → (file, file offset) table. Here the caller (the simulator's generator, or the store
//! for regions of big files) fills the same table directly.

use std::collections::HashMap;

use crate::default_policy::IdMap;
use crate::engine::ObjectId;

/// Where a chunk sits inside a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileChunk {
    /// Caller-chosen file identity.
    pub file: u64,
    /// Chunk index inside the file: file offset / chunk size.
    pub index: u64,
}

/// A bad layout entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// The chunk size is zero.
    ZeroChunkSize,
    /// The file offset is not a multiple of the chunk size.
    Unaligned {
        chunk: ObjectId,
        file_offset: u64,
        chunk_bytes: u64,
    },
    /// The chunk was already mapped to a different place.
    ChunkRemapped { chunk: ObjectId },
    /// Another chunk already holds this place of the file.
    PlaceTaken { chunk: ObjectId, other: ObjectId },
}

impl std::fmt::Display for LayoutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LayoutError::ZeroChunkSize => write!(f, "layout chunk size must be above zero"),
            LayoutError::Unaligned {
                chunk,
                file_offset,
                chunk_bytes,
            } => write!(
                f,
                "chunk {chunk}: file offset {file_offset} is not a multiple of the chunk size {chunk_bytes}"
            ),
            LayoutError::ChunkRemapped { chunk } => {
                write!(f, "chunk {chunk} is already mapped to another file place")
            }
            LayoutError::PlaceTaken { chunk, other } => {
                write!(
                    f,
                    "chunk {chunk}: its file place is already held by chunk {other}"
                )
            }
        }
    }
}

impl std::error::Error for LayoutError {}

/// Chunk → (file, chunk index in file), and back. Chunks absent from the map belong to no
/// known file (free space, metadata): layout-aware units then fall back to the chunk alone.
#[derive(Clone, Debug)]
pub struct RegionLayout {
    chunk_bytes: u64,
    forward: IdMap<FileChunk>,
    reverse: HashMap<FileChunk, ObjectId>,
}

impl RegionLayout {
    /// An empty layout of chunks of `chunk_bytes` bytes.
    pub fn new(chunk_bytes: u64) -> Result<Self, LayoutError> {
        if chunk_bytes == 0 {
            return Err(LayoutError::ZeroChunkSize);
        }
        Ok(Self {
            chunk_bytes,
            forward: IdMap::default(),
            reverse: HashMap::new(),
        })
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Number of mapped chunks.
    pub fn len(&self) -> usize {
        self.forward.len()
    }

    pub fn is_empty(&self) -> bool {
        self.forward.is_empty()
    }

    /// Records that `chunk` holds the bytes of `file` starting at `file_offset`.
    /// Re-inserting the same mapping is a no-op.
    pub fn insert(
        &mut self,
        chunk: ObjectId,
        file: u64,
        file_offset: u64,
    ) -> Result<(), LayoutError> {
        if !file_offset.is_multiple_of(self.chunk_bytes) {
            return Err(LayoutError::Unaligned {
                chunk,
                file_offset,
                chunk_bytes: self.chunk_bytes,
            });
        }
        let place = FileChunk {
            file,
            index: file_offset / self.chunk_bytes,
        };
        match self.forward.get(&chunk) {
            Some(p) if *p == place => return Ok(()),
            Some(_) => return Err(LayoutError::ChunkRemapped { chunk }),
            None => {}
        }
        if let Some(&other) = self.reverse.get(&place) {
            return Err(LayoutError::PlaceTaken { chunk, other });
        }
        self.forward.insert(chunk, place);
        self.reverse.insert(place, chunk);
        Ok(())
    }

    /// Where `chunk` sits, if it belongs to a known file.
    pub fn locate(&self, chunk: ObjectId) -> Option<FileChunk> {
        self.forward.get(&chunk).copied()
    }

    /// The chunk holding `place`, if any.
    pub fn chunk_at(&self, place: FileChunk) -> Option<ObjectId> {
        self.reverse.get(&place).copied()
    }

    /// The members of the size-`n` layout-aware cache unit holding `chunk`:
    /// `U(file, k) = { B(file, kN), …, B(file, kN + N − 1) }` (thesis §3.4.2), restricted to
    /// chunks that exist. A chunk of no known file is a unit of its own.
    pub fn unit_of(&self, chunk: ObjectId, n: u64) -> Vec<ObjectId> {
        let n = n.max(1);
        let Some(place) = self.locate(chunk) else {
            return vec![chunk];
        };
        let first = place.index - place.index % n;
        (first..=first.saturating_add(n - 1))
            .filter_map(|index| {
                self.chunk_at(FileChunk {
                    file: place.file,
                    index,
                })
            })
            .collect()
    }
}
