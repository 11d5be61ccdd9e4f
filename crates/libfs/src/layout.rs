//! On-pool layout. Every reference inside the pool is a byte offset from the pool start, so
//! the pool may be mapped anywhere.
//!
//! ```text
//! 0          superblock (4 KiB)
//! 4 KiB      redo log (256 KiB): header line, then records {offset u64, len u64, bytes…}
//! LOG_END    inode table: inode_count × 256 B (inode 0 unused, 1 is the root directory)
//! data_off   data blocks (block_size each): file data, directory entry arrays, index blocks
//! ```
//!
//! Allocation state is the inode table itself (mode != 0 means in use) plus the block maps
//! of in-use inodes; the free lists are rebuilt from them at start-up, like the thesis's
//! statistics, so no bitmap can disagree with the tree.

pub const MAGIC: [u8; 8] = *b"KAISOLFS";
pub const VERSION: u32 = 1;

pub const SB_MAGIC: u64 = 0;
pub const SB_VERSION: u64 = 8;
pub const SB_BLOCK_SIZE: u64 = 12;
pub const SB_POOL_SIZE: u64 = 16;
pub const SB_INODE_COUNT: u64 = 24;
pub const SB_INODE_OFF: u64 = 32;
pub const SB_LOG_OFF: u64 = 40;
pub const SB_LOG_SIZE: u64 = 48;
pub const SB_DATA_OFF: u64 = 56;
pub const SB_BLOCK_COUNT: u64 = 64;
pub const SB_OWNER_PID: u64 = 72;
pub const SB_CREATED_NS: u64 = 80;

pub const SB_SIZE: u64 = 4096;
pub const LOG_OFF: u64 = SB_SIZE;
pub const LOG_SIZE: u64 = 256 * 1024;
pub const LOG_HEADER: u64 = 64;
/// Log header fields.
pub const LOG_STATE: u64 = 0;
pub const LOG_NREC: u64 = 8;
pub const LOG_BYTES: u64 = 16;
pub const LOG_SUM: u64 = 24;
pub const LOG_COMMITTED: u64 = 0x434f_4d4d_4954_5445; // "COMMITTE"

pub const INODE_OFF: u64 = LOG_OFF + LOG_SIZE;
pub const INODE_SIZE: u64 = 256;
pub const ROOT_INO: u64 = 1;

/// Inode fields (byte offsets inside the 256-byte inode).
pub const I_MODE: u64 = 0;
pub const I_NLINK: u64 = 4;
pub const I_UID: u64 = 8;
pub const I_GID: u64 = 12;
pub const I_SIZE: u64 = 16;
pub const I_BLOCKS: u64 = 24;
pub const I_ATIME: u64 = 32;
pub const I_MTIME: u64 = 40;
pub const I_CTIME: u64 = 48;
pub const I_GEN: u64 = 56;
pub const I_DIRECT: u64 = 64;
pub const N_DIRECT: u64 = 22;
pub const I_INDIRECT: u64 = 240;
pub const I_DINDIRECT: u64 = 248;

/// Directory entries: fixed 256-byte slots in the directory's data blocks.
pub const DIRENT_SIZE: u64 = 256;
pub const D_INO: u64 = 0;
pub const D_NAMELEN: u64 = 8;
pub const D_TYPE: u64 = 10;
pub const D_NAME: u64 = 16;
pub const NAME_MAX: usize = (DIRENT_SIZE - D_NAME) as usize;

pub const MIN_BLOCK_SIZE: u32 = 4096;
pub const MAX_BLOCK_SIZE: u32 = 1 << 20;

/// Geometry derived from the superblock.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub block_size: u64,
    pub pool_size: u64,
    pub inode_count: u64,
    pub data_off: u64,
    pub block_count: u64,
}

impl Geometry {
    pub fn new(pool_size: u64, block_size: u32, inode_count: u64) -> Option<Geometry> {
        let bs = block_size as u64;
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) || !bs.is_power_of_two() {
            return None;
        }
        if inode_count < 16 {
            return None;
        }
        let table_end = INODE_OFF.checked_add(inode_count.checked_mul(INODE_SIZE)?)?;
        let data_off = table_end.div_ceil(bs) * bs;
        if pool_size <= data_off + 16 * bs {
            return None;
        }
        let block_count = (pool_size - data_off) / bs;
        Some(Geometry {
            block_size: bs,
            pool_size,
            inode_count,
            data_off,
            block_count,
        })
    }

    #[inline]
    pub fn inode(&self, ino: u64) -> u64 {
        INODE_OFF + ino * INODE_SIZE
    }

    #[inline]
    pub fn block_off(&self, index: u64) -> u64 {
        self.data_off + index * self.block_size
    }

    /// The block number of a data-block offset, if it is a valid block start.
    pub fn block_index(&self, off: u64) -> Option<u64> {
        if off < self.data_off || !(off - self.data_off).is_multiple_of(self.block_size) {
            return None;
        }
        let i = (off - self.data_off) / self.block_size;
        (i < self.block_count).then_some(i)
    }

    /// Pointers per index block.
    #[inline]
    pub fn per_index(&self) -> u64 {
        self.block_size / 8
    }

    pub fn max_file_blocks(&self) -> u64 {
        let p = self.per_index();
        N_DIRECT + p + p * p
    }
}

/// Default inode count for a pool of this size: one inode per 16 KiB.
pub fn default_inode_count(pool_size: u64) -> u64 {
    (pool_size / 16384).clamp(1024, 1 << 24)
}
