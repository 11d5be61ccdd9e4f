//! The pool file: one memory mapping, the single-owner lock, and the persistence primitive
//! (cache-line write-back + fence on persistent memory, a store fence on DRAM-backed tmpfs,
//! `msync` on any other file system).

use crate::PoolError;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{Ordering, compiler_fence, fence};

/// How stores are made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// Persistent memory mapped with MAP_SYNC (or forced): flush lines, then fence.
    Pmem,
    /// tmpfs/ramfs: the page cache is the medium; a killed process loses nothing it stored,
    /// so ordering (a fence) is all that is needed.
    Volatile,
    /// A page-cached file on a block file system: msync the touched pages.
    Msync,
}

impl Persist {
    pub fn name(self) -> &'static str {
        match self {
            Persist::Pmem => "pmem (clwb/clflushopt + sfence)",
            Persist::Volatile => "volatile memory (store fence)",
            Persist::Msync => "page cache (msync)",
        }
    }
}

pub struct Mapping {
    pub base: *mut u8,
    pub len: usize,
    pub mode: Persist,
    /// Kept open: its open file description carries the single-owner flock.
    pub file: File,
    pub path: PathBuf,
    flush: FlushInsn,
}

unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

#[derive(Clone, Copy)]
enum FlushInsn {
    Clwb,
    ClflushOpt,
    Clflush,
}

fn detect_flush() -> FlushInsn {
    #[cfg(target_arch = "x86_64")]
    {
        let leaf7 = core::arch::x86_64::__cpuid_count(7, 0);
        if leaf7.ebx & (1 << 24) != 0 {
            return FlushInsn::Clwb;
        }
        if leaf7.ebx & (1 << 23) != 0 {
            return FlushInsn::ClflushOpt;
        }
    }
    FlushInsn::Clflush
}

const TMPFS_MAGIC: i64 = 0x0102_1994;
const RAMFS_MAGIC: i64 = 0x8584_58f6u32 as i64;

/// Opens (creating when missing) and exclusively locks the pool file. The lock is an
/// `flock` on the open file, so the kernel drops it if the owner dies.
pub fn open_locked(path: &Path, create_len: u64) -> Result<(File, bool), PoolError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(create_len > 0)
        .truncate(false)
        .open(path)
        .map_err(|e| PoolError::Io(format!("open pool {}", path.display()), e))?;
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(PoolError::Busy {
                path: path.to_path_buf(),
                owner: read_owner_pid(&file),
            });
        }
        return Err(PoolError::Io(format!("lock pool {}", path.display()), err));
    }
    let len = file
        .metadata()
        .map_err(|e| PoolError::Io(format!("stat pool {}", path.display()), e))?
        .len();
    let fresh = len == 0;
    if fresh {
        if create_len == 0 {
            return Err(PoolError::Invalid(format!(
                "{} is empty, not a pool",
                path.display()
            )));
        }
        file.set_len(create_len)
            .map_err(|e| PoolError::Io(format!("size pool {}", path.display()), e))?;
    }
    Ok((file, fresh))
}

fn read_owner_pid(file: &File) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 8];
    file.read_exact_at(&mut buf, crate::layout::SB_OWNER_PID)
        .ok()?;
    let pid = u64::from_le_bytes(buf);
    (pid != 0).then_some(pid as u32)
}

pub fn map(file: File, path: &Path, force: Option<Persist>) -> Result<Mapping, PoolError> {
    let len = file
        .metadata()
        .map_err(|e| PoolError::Io(format!("stat pool {}", path.display()), e))?
        .len() as usize;
    let fd = file.as_raw_fd();
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    // MAP_SYNC only succeeds on a DAX mapping: that is how persistent memory is recognised.
    let mut base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC,
            fd,
            0,
        )
    };
    let mut mode = Persist::Pmem;
    if base == libc::MAP_FAILED {
        base = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if base == libc::MAP_FAILED {
            return Err(PoolError::Io(
                format!("mmap pool {}", path.display()),
                std::io::Error::last_os_error(),
            ));
        }
        let mut st: libc::statfs = unsafe { std::mem::zeroed() };
        let memory = unsafe { libc::fstatfs(fd, &mut st) } == 0
            && (st.f_type as i64 == TMPFS_MAGIC || st.f_type as i64 == RAMFS_MAGIC);
        mode = if memory {
            Persist::Volatile
        } else {
            Persist::Msync
        };
    }
    if let Some(m) = force {
        mode = m;
    }
    Ok(Mapping {
        base: base as *mut u8,
        len,
        mode,
        file,
        path: path.to_path_buf(),
        flush: detect_flush(),
    })
}

impl Mapping {
    #[inline]
    pub fn ptr(&self, off: u64) -> *mut u8 {
        debug_assert!((off as usize) < self.len);
        unsafe { self.base.add(off as usize) }
    }

    /// Writes back the cache lines of [off, off+len) without waiting.
    #[inline]
    pub fn flush(&self, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        match self.mode {
            Persist::Pmem => self.flush_lines(off, len),
            Persist::Volatile => {}
            Persist::Msync => {
                let page = 4096u64;
                let start = off & !(page - 1);
                let end = (off + len).min(self.len as u64);
                unsafe {
                    libc::msync(
                        self.base.add(start as usize) as *mut libc::c_void,
                        (end - start) as usize,
                        libc::MS_SYNC,
                    );
                }
            }
        }
    }

    #[inline]
    fn flush_lines(&self, off: u64, len: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let mut line = off & !63;
            let end = off + len;
            while line < end {
                let p = unsafe { self.base.add(line as usize) };
                unsafe {
                    match self.flush {
                        FlushInsn::Clwb => {
                            core::arch::asm!("clwb [{0}]", in(reg) p, options(nostack))
                        }
                        FlushInsn::ClflushOpt => {
                            core::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack))
                        }
                        FlushInsn::Clflush => core::arch::x86_64::_mm_clflush(p),
                    }
                }
                line += 64;
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (off, len);
        }
    }

    /// Orders all earlier flushes and stores before any later store.
    ///
    /// On DRAM-backed tmpfs the only failure is the death of the process, and the CPU never
    /// discards a store that has executed: whatever the process stored before it was killed
    /// reaches the page cache. Program order is all that recovery relies on there, so a
    /// compiler barrier suffices (a hardware fence after copying a file's data would stall
    /// on the store buffer for nothing).
    #[inline]
    pub fn fence(&self) {
        match self.mode {
            #[cfg(target_arch = "x86_64")]
            Persist::Pmem => unsafe { core::arch::x86_64::_mm_sfence() },
            Persist::Volatile => compiler_fence(Ordering::SeqCst),
            _ => fence(Ordering::SeqCst),
        }
    }

    #[inline]
    pub fn persist(&self, off: u64, len: u64) {
        self.flush(off, len);
        self.fence();
    }

    /// Faults in [off, off+len) for writing with one system call, so that the stores that
    /// follow take no page faults (hundreds of kernel entries, each zeroing a page, are
    /// replaced by one). Best effort: on a kernel without MADV_POPULATE_WRITE (< 5.14) the
    /// pages are faulted on first touch as before.
    pub fn populate(&self, off: u64, len: u64) {
        let page = 4096u64;
        let start = off & !(page - 1);
        let end = (off + len).min(self.len as u64);
        if end <= start {
            return;
        }
        unsafe {
            libc::madvise(
                self.base.add(start as usize) as *mut libc::c_void,
                (end - start) as usize,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }

    /// The end of the last data in [off, off+len) of the pool file (a binary search with
    /// SEEK_DATA); `off + len` when the file system cannot say (nothing is then assumed zero).
    pub fn data_end(&self, off: u64, len: u64) -> u64 {
        let fd = self.file.as_raw_fd();
        let end = (off + len).min(self.len as u64);
        // Is there data at or after x (and before end)?
        let data_after = |x: u64| -> Option<bool> {
            let d = unsafe { libc::lseek(fd, x as libc::off_t, libc::SEEK_DATA) };
            if d < 0 {
                return match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENXIO) => Some(false),
                    _ => None,
                };
            }
            Some((d as u64) < end)
        };
        let page = 4096u64;
        let (mut lo, mut hi) = (off / page, end.div_ceil(page));
        match data_after(lo * page) {
            Some(false) => return off,
            None => return end,
            Some(true) => {}
        }
        // Invariant: data at or after page lo; none at or after page hi.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            match data_after(mid * page) {
                Some(true) => lo = mid,
                Some(false) => hi = mid,
                None => return end,
            }
        }
        (hi * page).min(end)
    }

    /// The parts of [off, off+len) that hold data in the pool file (holes read as zeros and
    /// need not be looked at). Falls back to the whole range when the file system cannot say.
    pub fn data_ranges(&self, off: u64, len: u64) -> Vec<(u64, u64)> {
        let fd = self.file.as_raw_fd();
        let end = (off + len).min(self.len as u64);
        let mut out = Vec::new();
        let mut pos = off;
        while pos < end {
            let d = unsafe { libc::lseek(fd, pos as libc::off_t, libc::SEEK_DATA) };
            if d < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                    break; // no data after pos
                }
                return vec![(off, end - off)];
            }
            let d = d as u64;
            if d >= end {
                break;
            }
            let h = unsafe { libc::lseek(fd, d as libc::off_t, libc::SEEK_HOLE) };
            if h < 0 {
                return vec![(off, end - off)];
            }
            let h = (h as u64).min(end);
            out.push((d, h - d));
            pos = h;
        }
        out
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}
