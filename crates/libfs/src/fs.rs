//! The file system proper: path walk, namespace operations (through the redo log), file data
//! (in place, ordered: data, then block pointer, then size), open files and locks.
//!
//! Locking: one readers-writer spin lock over the namespace (directory indexes in DRAM);
//! one readers-writer spin lock per inode for its data and block map; one spin lock for the
//! block/inode free lists; one for the log. Order: namespace → inode → allocator → log.

use crate::layout::*;
use crate::lock::{SpinLock, SpinRwLock};
use crate::pool::{self, Mapping, Persist};
use crate::recover::{self, Report};
use crate::{PoolError, is_normal_abs, normalize_abs, strip_mount};
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

pub type Ino = u64;

/// Failure of a path or file operation: an errno, or "this path leads outside the private
/// directory" (through a symbolic link or `..`), with the normalised absolute path to use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsError {
    Errno(i32),
    Outside(Vec<u8>),
}

fn e<T>(errno: i32) -> Result<T, FsError> {
    Err(FsError::Errno(errno))
}

impl From<i32> for FsError {
    fn from(errno: i32) -> Self {
        FsError::Errno(errno)
    }
}

/// How to open or create a pool.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Size of a new pool file (0: open an existing pool only).
    pub size: u64,
    pub block_size: u32,
    /// Inodes of a new pool (None: one per 16 KiB).
    pub inode_count: Option<u64>,
    /// Override the persistence mode detected from the mapping.
    pub persist: Option<Persist>,
    /// Fault never-used pool memory in 2 MiB at a time (one madvise system call) ahead of
    /// the allocator, instead of one page fault per 4 KiB page on first store. Off by
    /// default: on tmpfs it made tar extraction no faster (the kernel's cost is allocating
    /// and zeroing the pages, not the fault), and it puts a system call in the data path.
    pub prefault: bool,
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            size: 4 << 30,
            block_size: 4096,
            inode_count: None,
            persist: None,
            prefault: false,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub ino: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// 512-byte units, like st_blocks.
    pub blocks: u64,
    pub blksize: u64,
    pub atime_ns: i64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct FsStat {
    pub block_size: u64,
    pub blocks: u64,
    pub blocks_free: u64,
    pub inodes: u64,
    pub inodes_free: u64,
    pub name_max: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// DT_* type.
    pub kind: u8,
    pub name: Box<[u8]>,
}

pub(crate) struct Dir {
    pub entries: HashMap<Box<[u8]>, (Ino, u32, u8)>,
    pub free: Vec<u32>,
    pub nslots: u32,
    pub cache: Option<Arc<Vec<DirEntry>>>,
}

impl Dir {
    pub fn new() -> Dir {
        Dir {
            entries: HashMap::new(),
            free: Vec::new(),
            nslots: 0,
            cache: None,
        }
    }
}

pub(crate) struct Namespace {
    pub dirs: HashMap<Ino, Dir>,
    /// Directory → (parent, name in parent).
    pub parent: HashMap<Ino, (Ino, Box<[u8]>)>,
}

pub(crate) struct Alloc {
    pub free_blocks: Vec<u64>,
    pub block_hwm: u64,
    pub block_count: u64,
    pub free_inodes: Vec<u64>,
    pub inode_hwm: u64,
    pub inode_count: u64,
    pub used_blocks: u64,
    pub used_inodes: u64,
    /// Blocks and inodes below these numbers have been faulted in (see `Inner::prefault`).
    pub blocks_ready: u64,
    pub inodes_ready: u64,
    /// Blocks from this number up have never held data (the pool file has no data there).
    pub zero_from: u64,
}

/// How far ahead of the high-water marks the pool is faulted in, in bytes.
const PREFAULT_BYTES: u64 = 2 << 20;

impl Alloc {
    /// Claims the next range of never-used blocks and inodes to fault in, once the
    /// high-water marks come within half a chunk of what was faulted in already.
    fn prefault_claim(&mut self, g: &Geometry) -> [Option<(u64, u64)>; 2] {
        let bchunk = (PREFAULT_BYTES / g.block_size).max(1);
        let ichunk = PREFAULT_BYTES / INODE_SIZE;
        let mut out = [None, None];
        if self.block_hwm + bchunk / 2 > self.blocks_ready && self.blocks_ready < self.block_count {
            let from = self.blocks_ready.max(self.block_hwm);
            let to = (from + bchunk).min(self.block_count);
            self.blocks_ready = to;
            out[0] = Some((g.block_off(from), (to - from) * g.block_size));
        }
        if self.inode_hwm + ichunk / 2 > self.inodes_ready && self.inodes_ready < self.inode_count {
            let from = self.inodes_ready.max(self.inode_hwm);
            let to = (from + ichunk).min(self.inode_count);
            self.inodes_ready = to;
            out[1] = Some((g.inode(from), (to - from) * INODE_SIZE));
        }
        out
    }

    fn block(&mut self) -> Option<u64> {
        self.block_and_zeroed().map(|(b, _)| b)
    }
    /// A free block, and whether it is known to hold zeros (never used since the pool file
    /// was created: a hole, or a page the kernel zeroed when it was faulted in).
    fn block_and_zeroed(&mut self) -> Option<(u64, bool)> {
        let b = match self.free_blocks.pop() {
            Some(b) => (b, false),
            None if self.block_hwm < self.block_count => {
                self.block_hwm += 1;
                let b = self.block_hwm - 1;
                (b, b >= self.zero_from)
            }
            None => return None,
        };
        self.used_blocks += 1;
        Some(b)
    }
    fn inode(&mut self) -> Option<u64> {
        let i = match self.free_inodes.pop() {
            Some(i) => i,
            None if self.inode_hwm < self.inode_count => {
                self.inode_hwm += 1;
                self.inode_hwm - 1
            }
            None => return None,
        };
        self.used_inodes += 1;
        Some(i)
    }
}

pub(crate) struct InodeRt {
    pub lock: SpinRwLock<()>,
    pub open: AtomicU32,
}

#[derive(Clone, Copy)]
struct RangeLock {
    owner: u64,
    start: u64,
    end: u64,
    exclusive: bool,
}

pub(crate) struct Inner {
    pub m: Mapping,
    pub g: Geometry,
    pub ns: SpinRwLock<Namespace>,
    pub alloc: SpinLock<Alloc>,
    log: SpinLock<()>,
    pub rt: Vec<InodeRt>,
    locks: SpinLock<HashMap<Ino, Vec<RangeLock>>>,
    mount: Vec<u8>,
    uid: u32,
    gid: u32,
    next_ofd: AtomicU64,
    /// Open files of all inodes (suspend requires none).
    open_files: AtomicU64,
    prefault: bool,
}

/// A directory entry as written to its slot: the bytes and how many of them count.
pub(crate) struct DirentRecord([u8; DIRENT_SIZE as usize], usize);

impl std::ops::Deref for DirentRecord {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0[..self.1]
    }
}

/// A redo-log transaction: the bytes to write, gathered before anything is written in place.
/// All records' bytes live in one buffer: a create makes five records, and one allocation
/// for all of them instead of one each is measurable in tar extraction.
#[derive(Default)]
pub(crate) struct Tx {
    /// (pool offset, start in `bytes`, length)
    recs: Vec<(u64, usize, usize)>,
    bytes: Vec<u8>,
}

impl Tx {
    pub fn put(&mut self, off: u64, bytes: &[u8]) {
        if self.recs.is_empty() {
            self.recs.reserve(8);
            self.bytes.reserve(1024);
        }
        self.recs.push((off, self.bytes.len(), bytes.len()));
        self.bytes.extend_from_slice(bytes);
    }
    fn records(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.recs
            .iter()
            .map(|&(off, at, len)| (off, &self.bytes[at..at + len]))
    }
    pub fn put_u64(&mut self, off: u64, v: u64) {
        self.put(off, &v.to_le_bytes());
    }
    pub fn put_u32(&mut self, off: u64, v: u32) {
        self.put(off, &v.to_le_bytes());
    }
}

pub(crate) fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // vDSO, no system call. The coarse clock (one tick) is what the kernel stamps inodes
    // with too (current_time()), and it is cheaper: a write reads the clock every time.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// The log checksum: eight bytes at a time (a byte-wise hash of every record was a visible
/// share of a file create), the last partial word zero-padded.
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("8 bytes"))).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56)).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    }
    h
}
const FNV_SEED: u64 = 0xcbf2_9ce4_8422_2325;

pub(crate) fn dtype_of(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFREG => libc::DT_REG,
        _ => libc::DT_UNKNOWN,
    }
}

impl Inner {
    #[inline]
    pub fn a64(&self, off: u64) -> &AtomicU64 {
        unsafe { &*(self.m.ptr(off) as *const AtomicU64) }
    }
    #[inline]
    pub fn a32(&self, off: u64) -> &AtomicU32 {
        unsafe { &*(self.m.ptr(off) as *const AtomicU32) }
    }
    #[inline]
    pub fn ld64(&self, off: u64) -> u64 {
        self.a64(off).load(Ordering::Relaxed)
    }
    #[inline]
    pub fn st64(&self, off: u64, v: u64) {
        self.a64(off).store(v, Ordering::Relaxed)
    }
    #[inline]
    pub fn ld32(&self, off: u64) -> u32 {
        self.a32(off).load(Ordering::Relaxed)
    }
    #[inline]
    pub fn st32(&self, off: u64, v: u32) {
        self.a32(off).store(v, Ordering::Relaxed)
    }
    #[inline]
    pub fn iget(&self, ino: Ino, field: u64) -> u64 {
        self.ld64(self.g.inode(ino) + field)
    }
    #[inline]
    pub fn imode(&self, ino: Ino) -> u32 {
        self.ld32(self.g.inode(ino) + I_MODE)
    }

    pub fn write_bytes(&self, off: u64, bytes: &[u8]) {
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.m.ptr(off), bytes.len()) };
    }
    pub fn zero(&self, off: u64, len: u64) {
        unsafe { std::ptr::write_bytes(self.m.ptr(off), 0, len as usize) };
    }

    // ---- redo log -------------------------------------------------------------------------

    pub fn commit(&self, tx: Tx) {
        let _g = self.log.lock();
        let start = LOG_OFF + LOG_HEADER;
        let mut p = start;
        let mut sum = FNV_SEED;
        for (off, data) in tx.records() {
            let len = data.len() as u64;
            assert!(
                p + 16 + len.div_ceil(8) * 8 <= LOG_OFF + LOG_SIZE,
                "transaction larger than the log"
            );
            self.st64(p, off);
            self.st64(p + 8, len);
            self.write_bytes(p + 16, data);
            sum = fnv(fnv(fnv(sum, &off.to_le_bytes()), &len.to_le_bytes()), data);
            p += 16 + len.div_ceil(8) * 8;
        }
        self.m.flush(start, p - start);
        self.st64(LOG_OFF + LOG_NREC, tx.recs.len() as u64);
        self.st64(LOG_OFF + LOG_BYTES, p - start);
        self.st64(LOG_OFF + LOG_SUM, sum);
        self.m.persist(LOG_OFF + 8, 24);
        // The commit point: one aligned 8-byte store.
        self.st64(LOG_OFF + LOG_STATE, LOG_COMMITTED);
        self.m.persist(LOG_OFF, 8);
        for (off, data) in tx.records() {
            self.write_bytes(off, data);
            self.m.flush(off, data.len() as u64);
        }
        self.m.fence();
        self.st64(LOG_OFF + LOG_STATE, 0);
        self.m.persist(LOG_OFF, 8);
    }

    /// Applies a committed log left by a crash. Returns whether anything was replayed.
    pub fn replay_log(&self) -> Result<bool, String> {
        if self.ld64(LOG_OFF + LOG_STATE) != LOG_COMMITTED {
            return Ok(false);
        }
        let n = self.ld64(LOG_OFF + LOG_NREC);
        let bytes = self.ld64(LOG_OFF + LOG_BYTES);
        let want = self.ld64(LOG_OFF + LOG_SUM);
        if bytes > LOG_SIZE - LOG_HEADER {
            return Err("log header is corrupt".into());
        }
        let start = LOG_OFF + LOG_HEADER;
        let mut p = start;
        let mut recs = Vec::new();
        let mut sum = FNV_SEED;
        for _ in 0..n {
            if p + 16 > start + bytes {
                return Err("log record runs past the log".into());
            }
            let off = self.ld64(p);
            let len = self.ld64(p + 8);
            if p + 16 + len > start + bytes || off + len > self.g.pool_size || off < SB_SIZE {
                return Err("log record out of range".into());
            }
            let mut data = vec![0u8; len as usize];
            unsafe {
                std::ptr::copy_nonoverlapping(self.m.ptr(p + 16), data.as_mut_ptr(), len as usize)
            };
            sum = fnv(fnv(fnv(sum, &off.to_le_bytes()), &len.to_le_bytes()), &data);
            recs.push((off, data));
            p += 16 + len.div_ceil(8) * 8;
        }
        if sum != want {
            return Err("log checksum mismatch".into());
        }
        for (off, data) in &recs {
            self.write_bytes(*off, data);
            self.m.flush(*off, data.len() as u64);
        }
        self.m.fence();
        self.st64(LOG_OFF + LOG_STATE, 0);
        self.m.persist(LOG_OFF, 8);
        Ok(true)
    }

    // ---- block maps ------------------------------------------------------------------------

    /// Offset of the slot holding block `idx`'s pointer, without allocating (0 if absent).
    fn bslot(&self, ino: Ino, idx: u64) -> u64 {
        let ioff = self.g.inode(ino);
        if idx < N_DIRECT {
            return ioff + I_DIRECT + idx * 8;
        }
        let per = self.g.per_index();
        let i = idx - N_DIRECT;
        if i < per {
            let ind = self.ld64(ioff + I_INDIRECT);
            return if ind == 0 { 0 } else { ind + i * 8 };
        }
        let i = i - per;
        if i < per * per {
            let dind = self.ld64(ioff + I_DINDIRECT);
            if dind == 0 {
                return 0;
            }
            let ind = self.ld64(dind + (i / per) * 8);
            return if ind == 0 { 0 } else { ind + (i % per) * 8 };
        }
        0
    }

    #[inline]
    pub fn bget(&self, ino: Ino, idx: u64) -> u64 {
        let s = self.bslot(ino, idx);
        if s == 0 { 0 } else { self.ld64(s) }
    }

    pub fn alloc_block(&self) -> Result<u64, i32> {
        let (b, ahead) = {
            let mut a = self.alloc.lock();
            (a.block(), a.prefault_claim(&self.g))
        };
        self.prefault(ahead);
        Ok(self.g.block_off(b.ok_or(libc::ENOSPC)?))
    }

    /// A new inode number (the caller initialises the inode through the log).
    pub fn alloc_inode(&self) -> Result<u64, i32> {
        let (i, ahead) = {
            let mut a = self.alloc.lock();
            (a.inode(), a.prefault_claim(&self.g))
        };
        self.prefault(ahead);
        i.ok_or(libc::ENOSPC)
    }

    /// Faults in, outside the allocator lock, the ranges `prefault_claim` handed out: new
    /// blocks and inodes are then written without page faults. One system call per 2 MiB of
    /// never-used pool, instead of one page fault per 4 KiB page.
    fn prefault(&self, ranges: [Option<(u64, u64)>; 2]) {
        if !self.prefault {
            return;
        }
        for (off, len) in ranges.into_iter().flatten() {
            self.m.populate(off, len);
        }
    }

    /// Up to `n` free blocks (fewer when the pool is full), lowest first when popped, each
    /// with whether it is known to hold zeros already.
    fn alloc_blocks(&self, n: u64) -> Vec<(u64, bool)> {
        let mut v = Vec::with_capacity(n as usize);
        if n == 0 {
            return v;
        }
        let mut a = self.alloc.lock();
        for _ in 0..n {
            match a.block_and_zeroed() {
                Some((b, z)) => v.push((self.g.block_off(b), z)),
                None => break,
            }
        }
        let ahead = a.prefault_claim(&self.g);
        drop(a);
        self.prefault(ahead);
        v.reverse();
        v
    }

    pub fn release_blocks(&self, offs: &[u64]) {
        if offs.is_empty() {
            return;
        }
        let mut a = self.alloc.lock();
        for &o in offs {
            if let Some(i) = self.g.block_index(o) {
                a.free_blocks.push(i);
                a.used_blocks -= 1;
            }
        }
    }

    /// A zeroed index block, persisted before it is linked.
    fn new_index_block(&self, ino: Ino) -> Result<u64, i32> {
        let b = self.alloc_block()?;
        self.zero(b, self.g.block_size);
        self.m.persist(b, self.g.block_size);
        self.a64(self.g.inode(ino) + I_BLOCKS)
            .fetch_add(1, Ordering::Relaxed);
        Ok(b)
    }

    /// Links data block `off` as block `idx` of `ino` (caller holds the inode lock and has
    /// already persisted the block's contents). Each pointer store is one atomic 8-byte store.
    fn bset(&self, ino: Ino, idx: u64, off: u64) -> Result<(), i32> {
        let ioff = self.g.inode(ino);
        let per = self.g.per_index();
        let slot = if idx < N_DIRECT {
            ioff + I_DIRECT + idx * 8
        } else if idx - N_DIRECT < per {
            let mut ind = self.ld64(ioff + I_INDIRECT);
            if ind == 0 {
                ind = self.new_index_block(ino)?;
                self.st64(ioff + I_INDIRECT, ind);
                self.m.persist(ioff + I_INDIRECT, 8);
            }
            ind + (idx - N_DIRECT) * 8
        } else {
            let i = idx - N_DIRECT - per;
            if i >= per * per {
                return Err(libc::EFBIG);
            }
            let mut dind = self.ld64(ioff + I_DINDIRECT);
            if dind == 0 {
                dind = self.new_index_block(ino)?;
                self.st64(ioff + I_DINDIRECT, dind);
                self.m.persist(ioff + I_DINDIRECT, 8);
            }
            let mut ind = self.ld64(dind + (i / per) * 8);
            if ind == 0 {
                ind = self.new_index_block(ino)?;
                self.st64(dind + (i / per) * 8, ind);
                self.m.persist(dind + (i / per) * 8, 8);
            }
            ind + (i % per) * 8
        };
        self.st64(slot, off);
        self.m.persist(slot, 8);
        Ok(())
    }

    /// Unlinks every block with index >= `first` (and index blocks that become unused);
    /// returns them for the caller to release once this is persistent.
    pub fn cut_blocks(&self, ino: Ino, first: u64) -> Vec<u64> {
        let ioff = self.g.inode(ino);
        let per = self.g.per_index();
        let mut freed = Vec::new();
        for idx in first.min(N_DIRECT)..N_DIRECT {
            let s = ioff + I_DIRECT + idx * 8;
            let p = self.ld64(s);
            if p != 0 {
                self.st64(s, 0);
                self.m.flush(s, 8);
                freed.push(p);
            }
        }
        let cut_index = |ind: u64, base: u64, freed: &mut Vec<u64>| -> bool {
            // Returns whether the whole index block is now unused.
            let from = first.saturating_sub(base).min(per);
            for j in from..per {
                let s = ind + j * 8;
                let p = self.ld64(s);
                if p != 0 {
                    self.st64(s, 0);
                    self.m.flush(s, 8);
                    freed.push(p);
                }
            }
            from == 0
        };
        let ind = self.ld64(ioff + I_INDIRECT);
        if ind != 0 && cut_index(ind, N_DIRECT, &mut freed) {
            self.st64(ioff + I_INDIRECT, 0);
            self.m.flush(ioff + I_INDIRECT, 8);
            freed.push(ind);
        }
        let dind = self.ld64(ioff + I_DINDIRECT);
        if dind != 0 {
            let base0 = N_DIRECT + per;
            for k in 0..per {
                let s = dind + k * 8;
                let ind2 = self.ld64(s);
                if ind2 != 0 && cut_index(ind2, base0 + k * per, &mut freed) {
                    self.st64(s, 0);
                    self.m.flush(s, 8);
                    freed.push(ind2);
                }
            }
            if first <= base0 {
                self.st64(ioff + I_DINDIRECT, 0);
                self.m.flush(ioff + I_DINDIRECT, 8);
                freed.push(dind);
            }
        }
        self.m.fence();
        if !freed.is_empty() {
            self.a64(ioff + I_BLOCKS)
                .fetch_sub(freed.len() as u64, Ordering::Relaxed);
        }
        freed
    }

    // ---- file data --------------------------------------------------------------------------

    pub fn read_at(&self, ino: Ino, buf: &mut [u8], off: u64) -> usize {
        let _l = self.rt[ino as usize].lock.read();
        let size = self.iget(ino, I_SIZE);
        if off >= size || buf.is_empty() {
            return 0;
        }
        let n = (buf.len() as u64).min(size - off) as usize;
        let bs = self.g.block_size;
        let mut done = 0usize;
        while done < n {
            let pos = off + done as u64;
            let within = pos % bs;
            let chunk = ((bs - within) as usize).min(n - done);
            let b = self.bget(ino, pos / bs);
            let dst = &mut buf[done..done + chunk];
            if b == 0 {
                dst.fill(0);
            } else {
                unsafe {
                    std::ptr::copy_nonoverlapping(self.m.ptr(b + within), dst.as_mut_ptr(), chunk)
                };
            }
            done += chunk;
        }
        n
    }

    /// Writes at `at` (None: at the end, atomically with respect to other appends).
    /// Returns the position after the write.
    pub fn write_at(&self, ino: Ino, buf: &[u8], at: Option<u64>) -> Result<(u64, u64), i32> {
        let _l = self.rt[ino as usize].lock.write();
        let ioff = self.g.inode(ino);
        let size = self.ld64(ioff + I_SIZE);
        let off = at.unwrap_or(size);
        let bs = self.g.block_size;
        let end = off.checked_add(buf.len() as u64).ok_or(libc::EFBIG)?;
        if end > self.g.max_file_blocks() * bs {
            return Err(libc::EFBIG);
        }
        if buf.is_empty() {
            return Ok((off, off));
        }
        if off > size {
            self.zero_tail(ino, size, off);
        }
        // Take every block the write needs in one go: one allocator lock per write, not per
        // block (threads writing large files would otherwise contend on it).
        let holes = (off / bs..end.div_ceil(bs))
            .filter(|&i| self.bget(ino, i) == 0)
            .count() as u64;
        let mut spare = self.alloc_blocks(holes);
        let mut done = 0usize;
        let mut new_blocks = 0u64;
        while done < buf.len() {
            let pos = off + done as u64;
            let idx = pos / bs;
            let within = pos % bs;
            let chunk = ((bs - within) as usize).min(buf.len() - done);
            let src = &buf[done..done + chunk];
            let b = self.bget(ino, idx);
            if b == 0 {
                let Some((nb, zeroed)) = spare.pop() else {
                    if done == 0 {
                        return Err(libc::ENOSPC);
                    }
                    break;
                };
                // A block that may hold old data is cleared around the write; a fresh one
                // (most blocks of a growing pool) is zero already.
                if within > 0 && !zeroed {
                    self.zero(nb, within);
                }
                self.write_bytes(nb + within, src);
                let tail = within + chunk as u64;
                if tail < bs && !zeroed {
                    self.zero(nb + tail, bs - tail);
                }
                self.m.persist(nb, bs);
                if let Err(err) = self.bset(ino, idx, nb) {
                    spare.push((nb, false));
                    self.release_blocks(&spare.iter().map(|x| x.0).collect::<Vec<_>>());
                    if done == 0 {
                        return Err(err);
                    }
                    spare.clear();
                    break;
                }
                new_blocks += 1;
            } else {
                self.write_bytes(b + within, src);
                self.m.flush(b + within, chunk as u64);
            }
            done += chunk;
        }
        if !spare.is_empty() {
            self.release_blocks(&spare.iter().map(|x| x.0).collect::<Vec<_>>());
        }
        self.m.fence();
        let endpos = off + done as u64;
        if new_blocks > 0 {
            // A plain load and store (the inode's write lock is held): an atomic add would
            // wait for the store buffer to drain the data just copied.
            self.st64(ioff + I_BLOCKS, self.ld64(ioff + I_BLOCKS) + new_blocks);
        }
        let now = now_ns() as u64;
        self.st64(ioff + I_MTIME, now);
        self.st64(ioff + I_CTIME, now);
        if endpos > size {
            self.st64(ioff + I_SIZE, endpos);
        }
        self.m.persist(ioff, 64);
        Ok((off, endpos))
    }

    /// Zeroes [size, upto) inside the block holding `size`: bytes past the end of a file are
    /// undefined in the pool and must read back as zeros once the file grows over them.
    fn zero_tail(&self, ino: Ino, size: u64, upto: u64) {
        let bs = self.g.block_size;
        if size.is_multiple_of(bs) {
            return;
        }
        let b = self.bget(ino, size / bs);
        if b != 0 {
            let stop = upto.min((size / bs + 1) * bs);
            self.zero(b + size % bs, stop - size);
            self.m.flush(b + size % bs, stop - size);
        }
    }

    pub fn truncate(&self, ino: Ino, len: u64) -> Result<(), i32> {
        if len > self.g.max_file_blocks() * self.g.block_size {
            return Err(libc::EFBIG);
        }
        let freed;
        {
            let _l = self.rt[ino as usize].lock.write();
            let ioff = self.g.inode(ino);
            let size = self.ld64(ioff + I_SIZE);
            if len < size {
                self.st64(ioff + I_SIZE, len);
                self.m.persist(ioff + I_SIZE, 8);
                freed = self.cut_blocks(ino, len.div_ceil(self.g.block_size));
            } else {
                self.zero_tail(ino, size, len);
                self.m.fence();
                self.st64(ioff + I_SIZE, len);
                freed = Vec::new();
            }
            let now = now_ns() as u64;
            self.st64(ioff + I_MTIME, now);
            self.st64(ioff + I_CTIME, now);
            self.m.persist(ioff, 64);
        }
        self.release_blocks(&freed);
        Ok(())
    }

    /// Allocates zeroed blocks over the holes of [off, off+len) and extends the size.
    pub fn allocate(&self, ino: Ino, off: u64, len: u64, keep_size: bool) -> Result<(), i32> {
        let end = off.checked_add(len).ok_or(libc::EFBIG)?;
        let bs = self.g.block_size;
        if end > self.g.max_file_blocks() * bs {
            return Err(libc::EFBIG);
        }
        if keep_size {
            // Blocks past the end would be trimmed at the next start; preallocation is a hint.
            return Ok(());
        }
        let _l = self.rt[ino as usize].lock.write();
        let ioff = self.g.inode(ino);
        let size = self.ld64(ioff + I_SIZE);
        if end <= size {
            return Ok(());
        }
        self.zero_tail(ino, size, end);
        let mut added = 0;
        for idx in size.div_ceil(bs)..end.div_ceil(bs) {
            if self.bget(ino, idx) == 0 {
                let nb = self.alloc_block()?;
                self.zero(nb, bs);
                self.m.persist(nb, bs);
                self.bset(ino, idx, nb)?;
                added += 1;
            }
        }
        self.a64(ioff + I_BLOCKS)
            .fetch_add(added, Ordering::Relaxed);
        self.m.fence();
        self.st64(ioff + I_SIZE, end);
        self.st64(ioff + I_CTIME, now_ns() as u64);
        self.m.persist(ioff, 64);
        Ok(())
    }

    pub fn stat_ino(&self, ino: Ino) -> Stat {
        let ioff = self.g.inode(ino);
        Stat {
            ino,
            mode: self.ld32(ioff + I_MODE),
            nlink: self.ld32(ioff + I_NLINK),
            uid: self.ld32(ioff + I_UID),
            gid: self.ld32(ioff + I_GID),
            size: self.ld64(ioff + I_SIZE),
            blocks: self.ld64(ioff + I_BLOCKS) * (self.g.block_size / 512),
            blksize: self.g.block_size,
            atime_ns: self.ld64(ioff + I_ATIME) as i64,
            mtime_ns: self.ld64(ioff + I_MTIME) as i64,
            ctime_ns: self.ld64(ioff + I_CTIME) as i64,
        }
    }

    // ---- inodes -----------------------------------------------------------------------------

    /// Returns an inode and all its blocks to the free lists (nothing references it).
    pub fn free_inode(&self, ino: Ino) {
        let freed = {
            let _l = self.rt[ino as usize].lock.write();
            let ioff = self.g.inode(ino);
            let freed = self.cut_blocks(ino, 0);
            self.st32(ioff + I_MODE, 0);
            self.m.persist(ioff, 8);
            freed
        };
        self.release_blocks(&freed);
        let mut a = self.alloc.lock();
        a.free_inodes.push(ino);
        a.used_inodes -= 1;
    }

    fn inode_record(
        &self,
        ino: Ino,
        mode: u32,
        nlink: u32,
        size: u64,
        first_block: u64,
    ) -> [u8; INODE_SIZE as usize] {
        let mut r = [0u8; INODE_SIZE as usize];
        let now = now_ns() as u64;
        let generation = self.iget(ino, I_GEN) + 1;
        let put32 = |r: &mut [u8; INODE_SIZE as usize], at: u64, v: u32| {
            r[at as usize..at as usize + 4].copy_from_slice(&v.to_le_bytes())
        };
        let put64 = |r: &mut [u8; INODE_SIZE as usize], at: u64, v: u64| {
            r[at as usize..at as usize + 8].copy_from_slice(&v.to_le_bytes())
        };
        put32(&mut r, I_MODE, mode);
        put32(&mut r, I_NLINK, nlink);
        put32(&mut r, I_UID, self.uid);
        put32(&mut r, I_GID, self.gid);
        put64(&mut r, I_SIZE, size);
        put64(&mut r, I_BLOCKS, u64::from(first_block != 0));
        put64(&mut r, I_ATIME, now);
        put64(&mut r, I_MTIME, now);
        put64(&mut r, I_CTIME, now);
        put64(&mut r, I_GEN, generation);
        put64(&mut r, I_DIRECT, first_block);
        r
    }

    // ---- directories --------------------------------------------------------------------------

    fn slot_off(&self, dir: Ino, slot: u32) -> u64 {
        let pos = slot as u64 * DIRENT_SIZE;
        let b = self.bget(dir, pos / self.g.block_size);
        debug_assert!(b != 0);
        b + pos % self.g.block_size
    }

    /// Picks a free slot in `dir`, growing its entry array by one zeroed block when full.
    fn take_slot(&self, d: &mut Dir, dir: Ino, tx: &mut Tx) -> Result<u32, i32> {
        if let Some(s) = d.free.pop() {
            return Ok(s);
        }
        let slot = d.nslots;
        let pos = slot as u64 * DIRENT_SIZE;
        let bs = self.g.block_size;
        if pos.is_multiple_of(bs) {
            let _l = self.rt[dir as usize].lock.write();
            if self.bget(dir, pos / bs) == 0 {
                let nb = self.alloc_block()?;
                self.zero(nb, bs);
                self.m.persist(nb, bs);
                if let Err(err) = self.bset(dir, pos / bs, nb) {
                    self.release_blocks(&[nb]);
                    return Err(err);
                }
                self.a64(self.g.inode(dir) + I_BLOCKS)
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        d.nslots += 1;
        tx.put_u64(self.g.inode(dir) + I_SIZE, d.nslots as u64 * DIRENT_SIZE);
        Ok(slot)
    }

    /// A directory entry (header and name; the rest of the 256-byte slot is not written).
    fn dirent_record(ino: Ino, kind: u8, name: &[u8]) -> DirentRecord {
        let mut r = [0u8; DIRENT_SIZE as usize];
        r[0..8].copy_from_slice(&ino.to_le_bytes());
        r[8..10].copy_from_slice(&(name.len() as u16).to_le_bytes());
        r[10] = kind;
        r[D_NAME as usize..D_NAME as usize + name.len()].copy_from_slice(name);
        DirentRecord(r, D_NAME as usize + name.len())
    }

    pub fn path_of(&self, ns: &Namespace, mut ino: Ino) -> Vec<u8> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(8);
        while ino != ROOT_INO {
            match ns.parent.get(&ino) {
                Some((p, name)) => {
                    parts.push(name);
                    ino = *p;
                }
                None => break,
            }
        }
        let mut s = self.mount.clone();
        for p in parts.iter().rev() {
            s.push(b'/');
            s.extend_from_slice(p);
        }
        if s.is_empty() {
            s.push(b'/');
        }
        s
    }

    fn read_link(&self, ino: Ino) -> Vec<u8> {
        let size = self.iget(ino, I_SIZE) as usize;
        let b = self.bget(ino, 0);
        let mut v = vec![0u8; size];
        if b != 0 {
            unsafe { std::ptr::copy_nonoverlapping(self.m.ptr(b), v.as_mut_ptr(), size) };
        }
        v
    }

    /// Resolves an absolute path. Returns (parent dir, last name, inode if it exists).
    /// The root resolves to (ROOT, "", Some(ROOT)).
    pub fn walk(&self, ns: &Namespace, abs: &[u8], follow_last: bool) -> Result<Walked, FsError> {
        // Paths from the preload are already normal: walk them in place, without copies.
        let mut cur_path: std::borrow::Cow<[u8]> = if is_normal_abs(abs) {
            std::borrow::Cow::Borrowed(abs)
        } else {
            std::borrow::Cow::Owned(normalize_abs(abs))
        };
        let mut hops = 0;
        'restart: loop {
            let Some(rel) = strip_mount(&self.mount, &cur_path) else {
                return Err(FsError::Outside(cur_path.into_owned()));
            };
            let mut cur = ROOT_INO;
            let mut pos = 0;
            loop {
                while rel.get(pos) == Some(&b'/') {
                    pos += 1;
                }
                if pos >= rel.len() {
                    break;
                }
                let end = rel[pos..]
                    .iter()
                    .position(|&b| b == b'/')
                    .map_or(rel.len(), |i| pos + i);
                let c = &rel[pos..end];
                let rest = &rel[end..];
                let last = rest.iter().all(|&b| b == b'/');
                pos = end;
                let Some(dir) = ns.dirs.get(&cur) else {
                    return e(libc::ENOTDIR);
                };
                if c.len() > NAME_MAX {
                    return e(libc::ENAMETOOLONG);
                }
                match dir.entries.get(c) {
                    None => {
                        if last {
                            return Ok(Walked {
                                parent: cur,
                                name: c.to_vec(),
                                ino: None,
                            });
                        }
                        return e(libc::ENOENT);
                    }
                    Some(&(ino, _, kind)) => {
                        if kind == libc::DT_LNK && (!last || follow_last) {
                            hops += 1;
                            if hops > 40 {
                                return e(libc::ELOOP);
                            }
                            let target = self.read_link(ino);
                            let mut next = if target.first() == Some(&b'/') {
                                target
                            } else {
                                let mut p = self.path_of(ns, cur);
                                p.push(b'/');
                                p.extend_from_slice(&target);
                                p
                            };
                            next.extend_from_slice(rest);
                            cur_path = std::borrow::Cow::Owned(normalize_abs(&next));
                            continue 'restart;
                        }
                        if last {
                            return Ok(Walked {
                                parent: cur,
                                name: c.to_vec(),
                                ino: Some(ino),
                            });
                        }
                        cur = ino;
                    }
                }
            }
            return Ok(Walked {
                parent: ROOT_INO,
                name: Vec::new(),
                ino: Some(ROOT_INO),
            });
        }
    }

    fn locks_release(&self, ino: Ino, owner: u64) {
        let mut t = self.locks.lock();
        if let Some(v) = t.get_mut(&ino) {
            v.retain(|l| l.owner != owner);
            if v.is_empty() {
                t.remove(&ino);
            }
        }
    }

    /// Takes, converts or releases a byte-range lock. `kind` is F_RDLCK/F_WRLCK/F_UNLCK.
    fn range_lock(
        &self,
        ino: Ino,
        owner: u64,
        start: u64,
        end: u64,
        kind: i32,
    ) -> Result<(), RangeLock> {
        let mut t = self.locks.lock();
        let v = t.entry(ino).or_default();
        if kind != libc::F_UNLCK {
            let exclusive = kind == libc::F_WRLCK;
            if let Some(c) = v.iter().find(|l| {
                l.owner != owner && l.start < end && start < l.end && (exclusive || l.exclusive)
            }) {
                return Err(*c);
            }
        }
        // Drop this owner's overlap, keeping the parts outside [start, end).
        let mut kept = Vec::with_capacity(v.len() + 2);
        for l in v.drain(..) {
            if l.owner != owner || l.end <= start || end <= l.start {
                kept.push(l);
                continue;
            }
            if l.start < start {
                kept.push(RangeLock { end: start, ..l });
            }
            if end < l.end {
                kept.push(RangeLock { start: end, ..l });
            }
        }
        if kind != libc::F_UNLCK {
            kept.push(RangeLock {
                owner,
                start,
                end,
                exclusive: kind == libc::F_WRLCK,
            });
        }
        *v = kept;
        Ok(())
    }
}

pub(crate) struct Walked {
    pub parent: Ino,
    pub name: Vec<u8>,
    pub ino: Option<Ino>,
}

/// A handle on a pool. Cloning shares it.
#[derive(Clone)]
pub struct Fs {
    pub(crate) inner: Arc<Inner>,
}

/// An open file description: shared by dup'ed descriptors, owns the offset and status flags.
pub struct OpenFile {
    fs: Arc<Inner>,
    ino: Ino,
    id: u64,
    flags: AtomicI32,
    pos: SpinLock<u64>,
    dir: bool,
}

const FLOCK_OWNER: u64 = 1 << 63;
const OFD_OWNER: u64 = 1 << 62;
/// All process-associated (POSIX) record locks belong to the one owning process.
const POSIX_OWNER: u64 = 1 << 61;

impl Fs {
    /// Opens the pool at `path` (creating and formatting it when missing and `opts.size` > 0),
    /// takes the single-owner lock, replays the log and rebuilds the in-DRAM state.
    /// `mount` is the absolute path under which the pool's root appears.
    pub fn open_pool(
        path: &Path,
        opts: &PoolOptions,
        mount: &[u8],
    ) -> Result<(Fs, Report), PoolError> {
        let mount = normalize_abs(mount);
        let (file, fresh) = pool::open_locked(path, opts.size)?;
        let m = pool::map(file, path, opts.persist)?;
        let uid = unsafe { libc::geteuid() };
        let gid = unsafe { libc::getegid() };
        let g = if fresh || is_unformatted(&m) {
            let inodes = opts
                .inode_count
                .unwrap_or_else(|| default_inode_count(m.len as u64));
            let g = Geometry::new(m.len as u64, opts.block_size, inodes).ok_or_else(|| {
                PoolError::Invalid(format!(
                    "cannot lay out {} inodes of a {}-byte pool with {}-byte blocks",
                    inodes, m.len, opts.block_size
                ))
            })?;
            format(&m, &g, uid, gid);
            g
        } else {
            read_geometry(&m)?
        };
        let rt = (0..g.inode_count)
            .map(|_| InodeRt {
                lock: SpinRwLock::new(()),
                open: AtomicU32::new(0),
            })
            .collect();
        let inner = Inner {
            m,
            g,
            ns: SpinRwLock::new(Namespace {
                dirs: HashMap::new(),
                parent: HashMap::new(),
            }),
            alloc: SpinLock::new(Alloc {
                free_blocks: Vec::new(),
                block_hwm: 0,
                block_count: g.block_count,
                free_inodes: Vec::new(),
                inode_hwm: 0,
                inode_count: g.inode_count,
                used_blocks: 0,
                used_inodes: 0,
                blocks_ready: 0,
                inodes_ready: 0,
                zero_from: u64::MAX,
            }),
            log: SpinLock::new(()),
            rt,
            locks: SpinLock::new(HashMap::new()),
            mount: if mount == b"/" { Vec::new() } else { mount },
            uid,
            gid,
            next_ofd: AtomicU64::new(1),
            open_files: AtomicU64::new(0),
            prefault: opts.prefault,
        };
        let report = recover::recover(&inner).map_err(PoolError::Invalid)?;
        inner.st64(SB_OWNER_PID, std::process::id() as u64);
        inner.m.persist(SB_OWNER_PID, 8);
        Ok((
            Fs {
                inner: Arc::new(inner),
            },
            report,
        ))
    }

    /// Lends the pool to another process: releases the owner lock. Only allowed with no file
    /// open; the caller must not touch the pool until [`Fs::resume`] returns.
    pub fn suspend(&self) -> Result<(), i32> {
        if self.inner.open_files.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        use std::os::fd::AsRawFd;
        if unsafe { libc::flock(self.inner.m.file.as_raw_fd(), libc::LOCK_UN) } != 0 {
            return Err(libc::EIO);
        }
        Ok(())
    }

    /// Takes the owner lock back (waiting up to `timeout`) and rebuilds the DRAM state from
    /// the pool, which another process may have changed meanwhile.
    pub fn resume(&self, timeout: std::time::Duration) -> Result<Report, PoolError> {
        use std::os::fd::AsRawFd;
        let fd = self.inner.m.file.as_raw_fd();
        let start = std::time::Instant::now();
        loop {
            if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                break;
            }
            if start.elapsed() > timeout {
                return Err(PoolError::Busy {
                    path: self.inner.m.path.clone(),
                    owner: Some(self.inner.ld64(SB_OWNER_PID) as u32),
                });
            }
            std::thread::sleep(std::time::Duration::from_micros(500));
        }
        let report = recover::recover(&self.inner).map_err(PoolError::Invalid)?;
        self.inner.st64(SB_OWNER_PID, std::process::id() as u64);
        self.inner.m.persist(SB_OWNER_PID, 8);
        Ok(report)
    }

    pub fn persist_mode(&self) -> Persist {
        self.inner.m.mode
    }

    pub fn pool_path(&self) -> &Path {
        &self.inner.m.path
    }

    /// The absolute path at which the pool's root appears.
    pub fn mount(&self) -> Vec<u8> {
        if self.inner.mount.is_empty() {
            b"/".to_vec()
        } else {
            self.inner.mount.clone()
        }
    }

    pub fn block_size(&self) -> u64 {
        self.inner.g.block_size
    }

    pub fn open(&self, path: &[u8], flags: i32, mode: u32) -> Result<Arc<OpenFile>, FsError> {
        let inner = &self.inner;
        let acc = flags & libc::O_ACCMODE;
        let writable = acc == libc::O_WRONLY || acc == libc::O_RDWR;
        if flags & libc::O_TMPFILE == libc::O_TMPFILE {
            return e(libc::EOPNOTSUPP);
        }
        let follow = flags & libc::O_NOFOLLOW == 0
            && !(flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0);
        let ino;
        let mut created = false;
        if flags & libc::O_CREAT != 0 {
            let mut ns = inner.ns.write();
            let w = inner.walk(&ns, path, follow)?;
            match w.ino {
                Some(i) => {
                    if flags & libc::O_EXCL != 0 {
                        return e(libc::EEXIST);
                    }
                    ino = i;
                }
                None => {
                    if path.ends_with(b"/") {
                        return e(libc::EISDIR);
                    }
                    ino = self.create_locked(
                        &mut ns,
                        w.parent,
                        &w.name,
                        libc::S_IFREG | (mode & 0o7777),
                        None,
                    )?;
                    created = true;
                }
            }
            inner.rt[ino as usize].open.fetch_add(1, Ordering::AcqRel);
            inner.open_files.fetch_add(1, Ordering::AcqRel);
        } else {
            let ns = inner.ns.read();
            let w = inner.walk(&ns, path, follow)?;
            ino = w.ino.ok_or(FsError::Errno(libc::ENOENT))?;
            inner.rt[ino as usize].open.fetch_add(1, Ordering::AcqRel);
            inner.open_files.fetch_add(1, Ordering::AcqRel);
        }
        let of = Arc::new(OpenFile {
            fs: inner.clone(),
            ino,
            id: inner.next_ofd.fetch_add(1, Ordering::Relaxed),
            flags: AtomicI32::new(
                flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_CLOEXEC),
            ),
            pos: SpinLock::new(0),
            dir: inner.imode(ino) & libc::S_IFMT == libc::S_IFDIR,
        });
        let kind = inner.imode(ino) & libc::S_IFMT;
        if flags & libc::O_PATH != 0 {
            return Ok(of);
        }
        if kind == libc::S_IFLNK {
            return e(libc::ELOOP);
        }
        if flags & libc::O_DIRECTORY != 0 && kind != libc::S_IFDIR {
            return e(libc::ENOTDIR);
        }
        if kind == libc::S_IFDIR && (writable || flags & libc::O_CREAT != 0 && created) {
            return e(libc::EISDIR);
        }
        if flags & libc::O_TRUNC != 0 && writable && kind == libc::S_IFREG && !created {
            inner.truncate(ino, 0)?;
        }
        Ok(of)
    }

    /// Creates an inode and its directory entry in one transaction (namespace lock held).
    fn create_locked(
        &self,
        ns: &mut Namespace,
        parent: Ino,
        name: &[u8],
        mode: u32,
        link_target: Option<&[u8]>,
    ) -> Result<Ino, FsError> {
        let inner = &self.inner;
        if name.len() > NAME_MAX {
            return e(libc::ENAMETOOLONG);
        }
        if name.is_empty() {
            return e(libc::EEXIST);
        }
        // A directory being deleted while open keeps its inode but takes no new entries.
        if inner.ld32(inner.g.inode(parent) + I_NLINK) == 0 {
            return e(libc::ENOENT);
        }
        let ino = inner.alloc_inode()?;
        let mut first_block = 0;
        let mut size = 0;
        if let Some(t) = link_target {
            match inner.alloc_block() {
                Ok(b) => {
                    inner.write_bytes(b, t);
                    inner.m.persist(b, t.len() as u64);
                    first_block = b;
                    size = t.len() as u64;
                }
                Err(err) => {
                    let mut a = inner.alloc.lock();
                    a.free_inodes.push(ino);
                    a.used_inodes -= 1;
                    return e(err);
                }
            }
        }
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let mut tx = Tx::default();
        let d = ns
            .dirs
            .get_mut(&parent)
            .ok_or(FsError::Errno(libc::ENOTDIR))?;
        let slot = match inner.take_slot(d, parent, &mut tx) {
            Ok(s) => s,
            Err(err) => {
                if first_block != 0 {
                    inner.release_blocks(&[first_block]);
                }
                let mut a = inner.alloc.lock();
                a.free_inodes.push(ino);
                a.used_inodes -= 1;
                return e(err);
            }
        };
        let kind = dtype_of(mode);
        tx.put(
            inner.g.inode(ino),
            &inner.inode_record(ino, mode, if is_dir { 2 } else { 1 }, size, first_block),
        );
        tx.put(
            inner.slot_off(parent, slot),
            &Inner::dirent_record(ino, kind, name),
        );
        let pi = inner.g.inode(parent);
        let now = now_ns() as u64;
        tx.put_u64(pi + I_MTIME, now);
        tx.put_u64(pi + I_CTIME, now);
        if is_dir {
            tx.put_u32(pi + I_NLINK, inner.ld32(pi + I_NLINK) + 1);
        }
        inner.commit(tx);
        let d = ns.dirs.get_mut(&parent).expect("parent checked above");
        d.entries.insert(name.into(), (ino, slot, kind));
        d.cache = None;
        if is_dir {
            ns.dirs.insert(ino, Dir::new());
            ns.parent.insert(ino, (parent, name.into()));
        }
        Ok(ino)
    }

    pub fn stat(&self, path: &[u8], follow: bool) -> Result<Stat, FsError> {
        let ns = self.inner.ns.read();
        let w = self.inner.walk(&ns, path, follow)?;
        let ino = w.ino.ok_or(FsError::Errno(libc::ENOENT))?;
        Ok(self.inner.stat_ino(ino))
    }

    /// The inode a path names, if any (following links).
    pub fn lookup(&self, path: &[u8]) -> Result<Ino, FsError> {
        let ns = self.inner.ns.read();
        let w = self.inner.walk(&ns, path, true)?;
        w.ino.ok_or(FsError::Errno(libc::ENOENT))
    }

    /// The path with every symbolic link resolved (realpath(3)); the file must exist.
    pub fn canonical(&self, path: &[u8]) -> Result<Vec<u8>, FsError> {
        let ns = self.inner.ns.read();
        let w = self.inner.walk(&ns, path, true)?;
        let ino = w.ino.ok_or(FsError::Errno(libc::ENOENT))?;
        if ns.dirs.contains_key(&ino) {
            return Ok(self.inner.path_of(&ns, ino));
        }
        let mut p = self.inner.path_of(&ns, w.parent);
        if p != b"/" {
            p.push(b'/');
        }
        p.extend_from_slice(&w.name);
        Ok(p)
    }

    pub fn mkdir(&self, path: &[u8], mode: u32) -> Result<(), FsError> {
        let mut ns = self.inner.ns.write();
        let w = self.inner.walk(&ns, path, false)?;
        if w.ino.is_some() {
            return e(libc::EEXIST);
        }
        self.create_locked(
            &mut ns,
            w.parent,
            &w.name,
            libc::S_IFDIR | (mode & 0o7777),
            None,
        )?;
        Ok(())
    }

    pub fn symlink(&self, target: &[u8], path: &[u8]) -> Result<(), FsError> {
        if target.is_empty() {
            return e(libc::ENOENT);
        }
        if target.len() as u64 >= self.inner.g.block_size.min(4096) {
            return e(libc::ENAMETOOLONG);
        }
        let mut ns = self.inner.ns.write();
        let w = self.inner.walk(&ns, path, false)?;
        if w.ino.is_some() {
            return e(libc::EEXIST);
        }
        self.create_locked(
            &mut ns,
            w.parent,
            &w.name,
            libc::S_IFLNK | 0o777,
            Some(target),
        )?;
        Ok(())
    }

    /// link(2)/linkat(2): a second name for a file (`follow`: AT_SYMLINK_FOLLOW on `old`).
    /// Directories cannot be linked (EPERM, as on Linux).
    pub fn link(&self, old: &[u8], new: &[u8], follow: bool) -> Result<(), FsError> {
        let inner = &self.inner;
        let mut ns = inner.ns.write();
        let src = inner.walk(&ns, old, follow)?;
        let ino = src.ino.ok_or(FsError::Errno(libc::ENOENT))?;
        let mode = inner.imode(ino);
        if mode & libc::S_IFMT == libc::S_IFDIR {
            return e(libc::EPERM);
        }
        let dst = inner.walk(&ns, new, false)?;
        if dst.ino.is_some() {
            return e(libc::EEXIST);
        }
        if dst.name.is_empty() || new.ends_with(b"/") {
            return e(libc::ENOENT);
        }
        if dst.name.len() > NAME_MAX {
            return e(libc::ENAMETOOLONG);
        }
        let ii = inner.g.inode(ino);
        let nlink = inner.ld32(ii + I_NLINK);
        if nlink == 0 {
            return e(libc::ENOENT); // unlinked while open: no new names (Linux: ENOENT)
        }
        if nlink >= u16::MAX as u32 {
            return e(libc::EMLINK);
        }
        let pi = inner.g.inode(dst.parent);
        if inner.ld32(pi + I_NLINK) == 0 {
            return e(libc::ENOENT);
        }
        let kind = dtype_of(mode);
        let mut tx = Tx::default();
        let d = ns
            .dirs
            .get_mut(&dst.parent)
            .ok_or(FsError::Errno(libc::ENOTDIR))?;
        let slot = inner.take_slot(d, dst.parent, &mut tx)?;
        tx.put(
            inner.slot_off(dst.parent, slot),
            &Inner::dirent_record(ino, kind, &dst.name),
        );
        let now = now_ns() as u64;
        tx.put_u32(ii + I_NLINK, nlink + 1);
        tx.put_u64(ii + I_CTIME, now);
        tx.put_u64(pi + I_MTIME, now);
        tx.put_u64(pi + I_CTIME, now);
        inner.commit(tx);
        let d = ns.dirs.get_mut(&dst.parent).expect("parent checked above");
        d.entries.insert(dst.name.into(), (ino, slot, kind));
        d.cache = None;
        Ok(())
    }

    pub fn readlink(&self, path: &[u8]) -> Result<Vec<u8>, FsError> {
        let ns = self.inner.ns.read();
        let w = self.inner.walk(&ns, path, false)?;
        let ino = w.ino.ok_or(FsError::Errno(libc::ENOENT))?;
        if self.inner.imode(ino) & libc::S_IFMT != libc::S_IFLNK {
            return e(libc::EINVAL);
        }
        Ok(self.inner.read_link(ino))
    }

    pub fn unlink(&self, path: &[u8]) -> Result<(), FsError> {
        self.remove(path, false)
    }

    pub fn rmdir(&self, path: &[u8]) -> Result<(), FsError> {
        self.remove(path, true)
    }

    fn remove(&self, path: &[u8], want_dir: bool) -> Result<(), FsError> {
        let inner = &self.inner;
        let free;
        let ino;
        {
            let mut ns = inner.ns.write();
            let w = inner.walk(&ns, path, false)?;
            ino = w.ino.ok_or(FsError::Errno(libc::ENOENT))?;
            if ino == ROOT_INO {
                return e(libc::EBUSY);
            }
            let is_dir = inner.imode(ino) & libc::S_IFMT == libc::S_IFDIR;
            if want_dir && !is_dir {
                return e(libc::ENOTDIR);
            }
            if !want_dir && is_dir {
                return e(libc::EISDIR);
            }
            if is_dir && !ns.dirs.get(&ino).is_some_and(|d| d.entries.is_empty()) {
                return e(libc::ENOTEMPTY);
            }
            let d = ns
                .dirs
                .get(&w.parent)
                .ok_or(FsError::Errno(libc::ENOTDIR))?;
            let (_, slot, _) = d.entries[w.name.as_slice()];
            let mut tx = Tx::default();
            tx.put_u64(inner.slot_off(w.parent, slot) + D_INO, 0);
            let now = now_ns() as u64;
            let pi = inner.g.inode(w.parent);
            tx.put_u64(pi + I_MTIME, now);
            tx.put_u64(pi + I_CTIME, now);
            let ii = inner.g.inode(ino);
            if is_dir {
                tx.put_u32(pi + I_NLINK, inner.ld32(pi + I_NLINK).saturating_sub(1));
                tx.put_u32(ii + I_NLINK, 0);
            } else {
                tx.put_u32(ii + I_NLINK, inner.ld32(ii + I_NLINK).saturating_sub(1));
            }
            tx.put_u64(ii + I_CTIME, now);
            inner.commit(tx);
            let d = ns.dirs.get_mut(&w.parent).expect("looked up above");
            d.entries.remove(w.name.as_slice());
            d.free.push(slot);
            d.cache = None;
            if is_dir {
                ns.dirs.remove(&ino);
                ns.parent.remove(&ino);
            }
            free = inner.ld32(ii + I_NLINK) == 0
                && inner.rt[ino as usize].open.load(Ordering::Acquire) == 0;
        }
        if free {
            inner.free_inode(ino);
        }
        Ok(())
    }

    /// rename(2)/renameat2(2): `flags` may hold RENAME_NOREPLACE.
    pub fn rename(&self, from: &[u8], to: &[u8], flags: u32) -> Result<(), FsError> {
        let inner = &self.inner;
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return e(libc::EINVAL);
        }
        let mut victim = None;
        {
            let mut ns = inner.ns.write();
            let src = inner.walk(&ns, from, false)?;
            let sino = src.ino.ok_or(FsError::Errno(libc::ENOENT))?;
            let dst = inner.walk(&ns, to, false)?;
            if sino == ROOT_INO || dst.ino == Some(ROOT_INO) {
                return e(libc::EBUSY);
            }
            if dst.ino == Some(sino) {
                return Ok(());
            }
            if dst.ino.is_some() && flags & libc::RENAME_NOREPLACE != 0 {
                return e(libc::EEXIST);
            }
            let s_dir = inner.imode(sino) & libc::S_IFMT == libc::S_IFDIR;
            if s_dir {
                // The destination may not lie inside the directory being moved.
                let mut p = dst.parent;
                loop {
                    if p == sino {
                        return e(libc::EINVAL);
                    }
                    if p == ROOT_INO {
                        break;
                    }
                    p = ns.parent.get(&p).map(|x| x.0).unwrap_or(ROOT_INO);
                }
            }
            if let Some(dino) = dst.ino {
                let d_dir = inner.imode(dino) & libc::S_IFMT == libc::S_IFDIR;
                if s_dir && !d_dir {
                    return e(libc::ENOTDIR);
                }
                if !s_dir && d_dir {
                    return e(libc::EISDIR);
                }
                if d_dir && !ns.dirs.get(&dino).is_some_and(|d| d.entries.is_empty()) {
                    return e(libc::ENOTEMPTY);
                }
            }
            let kind = dtype_of(inner.imode(sino));
            let mut tx = Tx::default();
            let now = now_ns() as u64;
            let (_, sslot, _) = ns.dirs[&src.parent].entries[src.name.as_slice()];
            let dslot;
            if let Some(dino) = dst.ino {
                let (_, s, _) = ns.dirs[&dst.parent].entries[dst.name.as_slice()];
                dslot = s;
                let so = inner.slot_off(dst.parent, s);
                tx.put_u64(so + D_INO, sino);
                tx.put(so + D_TYPE, &[kind]);
                let di = inner.g.inode(dino);
                if s_dir {
                    tx.put_u32(di + I_NLINK, 0);
                } else {
                    tx.put_u32(di + I_NLINK, inner.ld32(di + I_NLINK).saturating_sub(1));
                }
                tx.put_u64(di + I_CTIME, now);
            } else {
                let d = ns
                    .dirs
                    .get_mut(&dst.parent)
                    .ok_or(FsError::Errno(libc::ENOTDIR))?;
                dslot = inner.take_slot(d, dst.parent, &mut tx)?;
                tx.put(
                    inner.slot_off(dst.parent, dslot),
                    &Inner::dirent_record(sino, kind, &dst.name),
                );
            }
            tx.put_u64(inner.slot_off(src.parent, sslot) + D_INO, 0);
            let sp = inner.g.inode(src.parent);
            let dp = inner.g.inode(dst.parent);
            if s_dir && src.parent != dst.parent {
                tx.put_u32(sp + I_NLINK, inner.ld32(sp + I_NLINK).saturating_sub(1));
                if dst.ino.is_none() {
                    tx.put_u32(dp + I_NLINK, inner.ld32(dp + I_NLINK) + 1);
                }
            } else if s_dir && dst.ino.is_some() {
                // Same parent, replacing an empty directory: one subdirectory fewer.
                tx.put_u32(dp + I_NLINK, inner.ld32(dp + I_NLINK).saturating_sub(1));
            }
            for p in [sp, dp] {
                tx.put_u64(p + I_MTIME, now);
                tx.put_u64(p + I_CTIME, now);
            }
            tx.put_u64(inner.g.inode(sino) + I_CTIME, now);
            inner.commit(tx);
            // DRAM indexes.
            let sd = ns.dirs.get_mut(&src.parent).expect("source parent");
            sd.entries.remove(src.name.as_slice());
            sd.free.push(sslot);
            sd.cache = None;
            let dd = ns.dirs.get_mut(&dst.parent).expect("destination parent");
            dd.entries
                .insert(dst.name.clone().into(), (sino, dslot, kind));
            dd.cache = None;
            if let Some(dino) = dst.ino {
                if inner.imode(dino) & libc::S_IFMT == libc::S_IFDIR {
                    ns.dirs.remove(&dino);
                    ns.parent.remove(&dino);
                }
                if inner.ld32(inner.g.inode(dino) + I_NLINK) == 0
                    && inner.rt[dino as usize].open.load(Ordering::Acquire) == 0
                {
                    victim = Some(dino);
                }
            }
            if s_dir {
                ns.parent.insert(sino, (dst.parent, dst.name.into()));
            }
        }
        if let Some(v) = victim {
            inner.free_inode(v);
        }
        Ok(())
    }

    fn with_inode<T>(
        &self,
        path: &[u8],
        follow: bool,
        f: impl FnOnce(Ino) -> T,
    ) -> Result<T, FsError> {
        let ns = self.inner.ns.read();
        let w = self.inner.walk(&ns, path, follow)?;
        let ino = w.ino.ok_or(FsError::Errno(libc::ENOENT))?;
        Ok(f(ino))
    }

    pub fn chmod(&self, path: &[u8], mode: u32, follow: bool) -> Result<(), FsError> {
        self.with_inode(path, follow, |ino| self.inner.set_mode(ino, mode))
    }

    pub fn chown(
        &self,
        path: &[u8],
        uid: Option<u32>,
        gid: Option<u32>,
        follow: bool,
    ) -> Result<(), FsError> {
        self.with_inode(path, follow, |ino| self.inner.set_owner(ino, uid, gid))
    }

    /// Sets access and modification times (nanoseconds since the epoch; None leaves one as is).
    pub fn utimens(
        &self,
        path: &[u8],
        atime: Option<i64>,
        mtime: Option<i64>,
        follow: bool,
    ) -> Result<(), FsError> {
        self.with_inode(path, follow, |ino| self.inner.set_times(ino, atime, mtime))
    }

    /// access(2) for the owner of the pool (the only user the directory has).
    pub fn access(&self, path: &[u8], mode: i32) -> Result<(), FsError> {
        let st = self.stat(path, true)?;
        if mode == libc::F_OK {
            return Ok(());
        }
        let root = self.inner.uid == 0;
        let bits = st.mode;
        if mode & libc::X_OK != 0 && bits & 0o111 == 0 && bits & libc::S_IFMT != libc::S_IFDIR {
            return e(libc::EACCES);
        }
        if !root {
            if mode & libc::R_OK != 0 && bits & 0o400 == 0 {
                return e(libc::EACCES);
            }
            if mode & libc::W_OK != 0 && bits & 0o200 == 0 {
                return e(libc::EACCES);
            }
            if mode & libc::X_OK != 0 && bits & 0o100 == 0 {
                return e(libc::EACCES);
            }
        }
        Ok(())
    }

    pub fn statfs(&self) -> FsStat {
        let a = self.inner.alloc.lock();
        FsStat {
            block_size: self.inner.g.block_size,
            blocks: a.block_count,
            blocks_free: a.block_count - a.used_blocks,
            inodes: a.inode_count - 1,
            inodes_free: a.inode_count - 1 - a.used_inodes,
            name_max: NAME_MAX as u64,
        }
    }

    /// Entries of a directory (without "." and ".."), in slot order; cached until it changes.
    pub fn read_dir(&self, ino: Ino) -> Result<Arc<Vec<DirEntry>>, FsError> {
        {
            let ns = self.inner.ns.read();
            let d = ns.dirs.get(&ino).ok_or(FsError::Errno(libc::ENOTDIR))?;
            if let Some(c) = &d.cache {
                return Ok(c.clone());
            }
        }
        let mut ns = self.inner.ns.write();
        let d = ns.dirs.get_mut(&ino).ok_or(FsError::Errno(libc::ENOTDIR))?;
        let mut v: Vec<(u32, DirEntry)> = d
            .entries
            .iter()
            .map(|(name, &(ino, slot, kind))| {
                (
                    slot,
                    DirEntry {
                        ino,
                        kind,
                        name: name.clone(),
                    },
                )
            })
            .collect();
        v.sort_unstable_by_key(|x| x.0);
        let c = Arc::new(v.into_iter().map(|x| x.1).collect::<Vec<_>>());
        d.cache = Some(c.clone());
        Ok(c)
    }

    /// Parent of a directory inode (the root is its own parent).
    pub fn parent_of(&self, ino: Ino) -> Ino {
        self.inner
            .ns
            .read()
            .parent
            .get(&ino)
            .map(|x| x.0)
            .unwrap_or(ROOT_INO)
    }

    /// Current absolute path of a directory inode.
    pub fn dir_path(&self, ino: Ino) -> Vec<u8> {
        let ns = self.inner.ns.read();
        self.inner.path_of(&ns, ino)
    }

    pub fn stat_ino(&self, ino: Ino) -> Stat {
        self.inner.stat_ino(ino)
    }

    /// Opens an inode directly (used to re-create inherited descriptors after exec).
    pub fn open_ino(&self, ino: Ino, flags: i32) -> Result<Arc<OpenFile>, FsError> {
        if ino == 0 || ino >= self.inner.g.inode_count || self.inner.imode(ino) == 0 {
            return e(libc::EBADF);
        }
        let _ns = self.inner.ns.read();
        self.inner.rt[ino as usize]
            .open
            .fetch_add(1, Ordering::AcqRel);
        self.inner.open_files.fetch_add(1, Ordering::AcqRel);
        Ok(Arc::new(OpenFile {
            fs: self.inner.clone(),
            ino,
            id: self.inner.next_ofd.fetch_add(1, Ordering::Relaxed),
            flags: AtomicI32::new(flags),
            pos: SpinLock::new(0),
            dir: self.inner.imode(ino) & libc::S_IFMT == libc::S_IFDIR,
        }))
    }
}

impl Inner {
    fn set_mode(&self, ino: Ino, mode: u32) {
        let ioff = self.g.inode(ino);
        let _l = self.rt[ino as usize].lock.write();
        let old = self.ld32(ioff + I_MODE);
        self.st32(ioff + I_MODE, (old & libc::S_IFMT) | (mode & 0o7777));
        self.st64(ioff + I_CTIME, now_ns() as u64);
        self.m.persist(ioff, 64);
    }
    fn set_owner(&self, ino: Ino, uid: Option<u32>, gid: Option<u32>) {
        let ioff = self.g.inode(ino);
        let _l = self.rt[ino as usize].lock.write();
        if let Some(u) = uid {
            self.st32(ioff + I_UID, u);
        }
        if let Some(g) = gid {
            self.st32(ioff + I_GID, g);
        }
        self.st64(ioff + I_CTIME, now_ns() as u64);
        self.m.persist(ioff, 64);
    }
    fn set_times(&self, ino: Ino, atime: Option<i64>, mtime: Option<i64>) {
        let ioff = self.g.inode(ino);
        let _l = self.rt[ino as usize].lock.write();
        if let Some(a) = atime {
            self.st64(ioff + I_ATIME, a as u64);
        }
        if let Some(m) = mtime {
            self.st64(ioff + I_MTIME, m as u64);
        }
        self.st64(ioff + I_CTIME, now_ns() as u64);
        self.m.persist(ioff, 64);
    }
}

impl OpenFile {
    pub fn ino(&self) -> Ino {
        self.ino
    }
    pub fn is_dir(&self) -> bool {
        self.dir
    }
    /// Status flags (access mode, O_APPEND, O_NONBLOCK, …).
    pub fn flags(&self) -> i32 {
        self.flags.load(Ordering::Relaxed)
    }
    /// F_SETFL: only O_APPEND, O_NONBLOCK, O_DIRECT, O_NOATIME and O_ASYNC may change.
    pub fn set_flags(&self, f: i32) {
        let changeable = libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT | libc::O_NOATIME;
        let old = self.flags();
        self.flags
            .store((old & !changeable) | (f & changeable), Ordering::Relaxed);
    }
    fn can_read(&self) -> Result<(), i32> {
        let f = self.flags();
        if f & libc::O_PATH != 0 || f & libc::O_ACCMODE == libc::O_WRONLY {
            return Err(libc::EBADF);
        }
        if self.dir {
            return Err(libc::EISDIR);
        }
        Ok(())
    }
    fn can_write(&self) -> Result<(), i32> {
        let f = self.flags();
        if f & libc::O_PATH != 0 || f & libc::O_ACCMODE == libc::O_RDONLY {
            return Err(libc::EBADF);
        }
        Ok(())
    }

    pub fn read(&self, buf: &mut [u8]) -> Result<usize, i32> {
        self.can_read()?;
        let mut pos = self.pos.lock();
        let n = self.fs.read_at(self.ino, buf, *pos);
        *pos += n as u64;
        Ok(n)
    }

    pub fn pread(&self, buf: &mut [u8], off: u64) -> Result<usize, i32> {
        self.can_read()?;
        Ok(self.fs.read_at(self.ino, buf, off))
    }

    pub fn write(&self, buf: &[u8]) -> Result<usize, i32> {
        self.can_write()?;
        let mut pos = self.pos.lock();
        let at = if self.flags() & libc::O_APPEND != 0 {
            None
        } else {
            Some(*pos)
        };
        let (start, end) = self.fs.write_at(self.ino, buf, at)?;
        *pos = end;
        Ok((end - start) as usize)
    }

    /// pwrite(2). Like Linux, an O_APPEND descriptor appends whatever the offset.
    pub fn pwrite(&self, buf: &[u8], off: u64) -> Result<usize, i32> {
        self.can_write()?;
        if self.flags() & libc::O_APPEND != 0 {
            let _pos = self.pos.lock();
            let (start, end) = self.fs.write_at(self.ino, buf, None)?;
            return Ok((end - start) as usize);
        }
        let (start, end) = self.fs.write_at(self.ino, buf, Some(off))?;
        Ok((end - start) as usize)
    }

    pub fn seek(&self, off: i64, whence: i32) -> Result<u64, i32> {
        let mut pos = self.pos.lock();
        let size = self.fs.iget(self.ino, I_SIZE) as i64;
        let new = match whence {
            libc::SEEK_SET => off,
            libc::SEEK_CUR => (*pos as i64).checked_add(off).ok_or(libc::EOVERFLOW)?,
            libc::SEEK_END => size.checked_add(off).ok_or(libc::EOVERFLOW)?,
            libc::SEEK_DATA => {
                if off >= size {
                    return Err(libc::ENXIO);
                }
                off
            }
            libc::SEEK_HOLE => {
                if off >= size {
                    return Err(libc::ENXIO);
                }
                size
            }
            _ => return Err(libc::EINVAL),
        };
        if new < 0 {
            return Err(libc::EINVAL);
        }
        *pos = new as u64;
        Ok(*pos)
    }

    pub fn position(&self) -> u64 {
        *self.pos.lock()
    }

    pub fn stat(&self) -> Stat {
        self.fs.stat_ino(self.ino)
    }

    pub fn truncate(&self, len: u64) -> Result<(), i32> {
        if self.dir {
            return Err(libc::EISDIR);
        }
        self.can_write().map_err(|_| libc::EINVAL)?;
        self.fs.truncate(self.ino, len)
    }

    pub fn allocate(&self, mode: i32, off: u64, len: u64) -> Result<(), i32> {
        self.can_write()?;
        if self.dir {
            return Err(libc::EISDIR);
        }
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        self.fs
            .allocate(self.ino, off, len, mode & libc::FALLOC_FL_KEEP_SIZE != 0)
    }

    /// fsync: data and metadata were persisted by the operations themselves; on an msync pool
    /// the whole mapping is synced once more to cover everything written through this file.
    pub fn sync(&self) -> Result<(), i32> {
        if self.fs.m.mode == Persist::Msync {
            let r = unsafe {
                libc::msync(
                    self.fs.m.base as *mut libc::c_void,
                    self.fs.m.len,
                    libc::MS_SYNC,
                )
            };
            if r != 0 {
                return Err(libc::EIO);
            }
        }
        self.fs.m.fence();
        Ok(())
    }

    pub fn chmod(&self, mode: u32) {
        self.fs.set_mode(self.ino, mode)
    }
    pub fn chown(&self, uid: Option<u32>, gid: Option<u32>) {
        self.fs.set_owner(self.ino, uid, gid)
    }
    pub fn utimens(&self, atime: Option<i64>, mtime: Option<i64>) {
        self.fs.set_times(self.ino, atime, mtime)
    }

    /// flock(2): whole-file lock owned by this open file description.
    pub fn flock(&self, op: i32) -> Result<(), i32> {
        let owner = FLOCK_OWNER | self.id;
        let kind = match op & !libc::LOCK_NB {
            libc::LOCK_SH => libc::F_RDLCK,
            libc::LOCK_EX => libc::F_WRLCK,
            libc::LOCK_UN => libc::F_UNLCK,
            _ => return Err(libc::EINVAL),
        };
        self.wait_lock(
            owner,
            0,
            u64::MAX,
            kind,
            op & libc::LOCK_NB == 0,
            libc::EWOULDBLOCK,
        )
    }

    /// Open-file-description byte-range locks (F_OFD_SETLK/SETLKW). `end` is exclusive.
    pub fn ofd_lock(&self, start: u64, end: u64, kind: i32, wait: bool) -> Result<(), i32> {
        self.wait_lock(OFD_OWNER | self.id, start, end, kind, wait, libc::EAGAIN)
    }

    /// Process-associated record locks (F_SETLK/F_SETLKW): they never conflict with each
    /// other (one process) but do with open-file-description locks, as on Linux.
    pub fn posix_lock(&self, start: u64, end: u64, kind: i32, wait: bool) -> Result<(), i32> {
        self.wait_lock(POSIX_OWNER, start, end, kind, wait, libc::EAGAIN)
    }

    /// Drops every process-associated lock on this file (close(2) of any of its descriptors).
    pub fn posix_unlock_all(&self) {
        self.fs.locks_release(self.ino, POSIX_OWNER);
    }

    /// F_OFD_GETLK: the first conflicting lock as (start, end, exclusive), if any.
    pub fn ofd_test(&self, start: u64, end: u64, kind: i32) -> Option<(u64, u64, bool)> {
        self.test_lock(OFD_OWNER | self.id, start, end, kind)
    }

    /// F_GETLK: the first conflicting lock (only open-file-description locks can conflict).
    pub fn posix_test(&self, start: u64, end: u64, kind: i32) -> Option<(u64, u64, bool)> {
        self.test_lock(POSIX_OWNER, start, end, kind)
    }

    fn test_lock(&self, owner: u64, start: u64, end: u64, kind: i32) -> Option<(u64, u64, bool)> {
        let exclusive = kind == libc::F_WRLCK;
        let t = self.fs.locks.lock();
        t.get(&self.ino)?
            .iter()
            .find(|l| {
                l.owner != owner && l.start < end && start < l.end && (exclusive || l.exclusive)
            })
            .map(|l| (l.start, l.end, l.exclusive))
    }

    fn wait_lock(
        &self,
        owner: u64,
        start: u64,
        end: u64,
        kind: i32,
        wait: bool,
        busy: i32,
    ) -> Result<(), i32> {
        let mut round = 0u32;
        loop {
            // flock and fcntl locks are independent on Linux: compare within one family.
            let r = self.fs.range_lock_family(self.ino, owner, start, end, kind);
            match r {
                Ok(()) => return Ok(()),
                Err(()) if !wait => return Err(busy),
                Err(()) => {
                    round += 1;
                    if round < 100 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(std::time::Duration::from_micros(200));
                    }
                }
            }
        }
    }

    /// Entries of this directory.
    pub fn read_dir(&self) -> Result<Arc<Vec<DirEntry>>, i32> {
        if !self.dir {
            return Err(libc::ENOTDIR);
        }
        let fs = Fs {
            inner: self.fs.clone(),
        };
        fs.read_dir(self.ino).map_err(|err| match err {
            FsError::Errno(x) => x,
            FsError::Outside(_) => libc::EIO,
        })
    }

    pub fn fs(&self) -> Fs {
        Fs {
            inner: self.fs.clone(),
        }
    }
}

impl Inner {
    fn range_lock_family(
        &self,
        ino: Ino,
        owner: u64,
        start: u64,
        end: u64,
        kind: i32,
    ) -> Result<(), ()> {
        // Locks of the other family are invisible: give each family its own table key.
        let key = if owner & FLOCK_OWNER != 0 {
            ino | (1 << 63)
        } else {
            ino
        };
        self.range_lock(key, owner, start, end, kind)
            .map_err(|_| ())
    }
}

impl Drop for OpenFile {
    fn drop(&mut self) {
        let inner = &self.fs;
        inner.locks_release(self.ino | (1 << 63), FLOCK_OWNER | self.id);
        inner.locks_release(self.ino, OFD_OWNER | self.id);
        let free = {
            let _ns = inner.ns.read();
            let left = inner.rt[self.ino as usize]
                .open
                .fetch_sub(1, Ordering::AcqRel)
                - 1;
            inner.open_files.fetch_sub(1, Ordering::AcqRel);
            left == 0
                && inner.ld32(inner.g.inode(self.ino) + I_NLINK) == 0
                && inner.imode(self.ino) != 0
        };
        if free {
            // Only one closer can see the count reach zero on an unlinked inode.
            inner.free_inode(self.ino);
        }
    }
}

fn is_unformatted(m: &Mapping) -> bool {
    // A crash while formatting leaves the superblock without its magic but otherwise zero.
    let sb = unsafe { std::slice::from_raw_parts(m.base, SB_SIZE as usize) };
    sb.iter().all(|&b| b == 0)
}

fn format(m: &Mapping, g: &Geometry, uid: u32, gid: u32) {
    let w64 = |off: u64, v: u64| unsafe { (m.ptr(off) as *mut u64).write(v) };
    let w32 = |off: u64, v: u32| unsafe { (m.ptr(off) as *mut u32).write(v) };
    unsafe { std::ptr::write_bytes(m.base, 0, (LOG_OFF + LOG_HEADER) as usize) };
    w32(SB_VERSION, VERSION);
    w32(SB_BLOCK_SIZE, g.block_size as u32);
    w64(SB_POOL_SIZE, g.pool_size);
    w64(SB_INODE_COUNT, g.inode_count);
    w64(SB_INODE_OFF, INODE_OFF);
    w64(SB_LOG_OFF, LOG_OFF);
    w64(SB_LOG_SIZE, LOG_SIZE);
    w64(SB_DATA_OFF, g.data_off);
    w64(SB_BLOCK_COUNT, g.block_count);
    w64(SB_CREATED_NS, now_ns() as u64);
    let root = g.inode(ROOT_INO);
    unsafe { std::ptr::write_bytes(m.ptr(root), 0, INODE_SIZE as usize) };
    w32(root + I_MODE, libc::S_IFDIR | 0o755);
    w32(root + I_NLINK, 2);
    w32(root + I_UID, uid);
    w32(root + I_GID, gid);
    let now = now_ns() as u64;
    w64(root + I_ATIME, now);
    w64(root + I_MTIME, now);
    w64(root + I_CTIME, now);
    m.persist(0, SB_SIZE);
    m.persist(LOG_OFF, LOG_HEADER);
    m.persist(root, INODE_SIZE);
    // The magic goes last: a pool is valid only once everything above is durable.
    unsafe { std::ptr::copy_nonoverlapping(MAGIC.as_ptr(), m.ptr(SB_MAGIC), 8) };
    m.persist(0, 8);
}

fn read_geometry(m: &Mapping) -> Result<Geometry, PoolError> {
    let r64 = |off: u64| unsafe { (m.ptr(off) as *const u64).read() };
    let r32 = |off: u64| unsafe { (m.ptr(off) as *const u32).read() };
    let magic = unsafe { std::slice::from_raw_parts(m.ptr(SB_MAGIC), 8) };
    if magic != MAGIC {
        return Err(PoolError::Invalid(format!(
            "{} has no kaiso pool superblock",
            m.path.display()
        )));
    }
    if r32(SB_VERSION) != VERSION {
        return Err(PoolError::Invalid(format!(
            "pool version {} (this build reads {})",
            r32(SB_VERSION),
            VERSION
        )));
    }
    let g = Geometry::new(r64(SB_POOL_SIZE), r32(SB_BLOCK_SIZE), r64(SB_INODE_COUNT))
        .ok_or_else(|| PoolError::Invalid("superblock geometry is inconsistent".into()))?;
    if g.pool_size != m.len as u64 {
        return Err(PoolError::Invalid(format!(
            "pool file is {} bytes but its superblock says {}",
            m.len, g.pool_size
        )));
    }
    if r64(SB_DATA_OFF) != g.data_off || r64(SB_BLOCK_COUNT) != g.block_count {
        return Err(PoolError::Invalid(
            "superblock layout fields disagree".into(),
        ));
    }
    Ok(g)
}
