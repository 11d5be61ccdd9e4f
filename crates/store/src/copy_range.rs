//! `copy_file_range` between two open handles of the [`Store`]: the bytes go from one
//! backing file to the other with `copy_file_range(2)` (in the kernel: ext4, XFS and btrfs
//! copy or share extents; across file systems a read/write loop in kaiso takes over), not
//! through the face. Every rule a read of the source and a write of the destination
//! follow holds: stub ranges fetched first, the destination's tier capacity (spilling
//! the file to another tier instead of ENOSPC), emulated device time, access records,
//! the write generation and the stub's missing ranges.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

use crate::error::{FsError, FsResult};
use crate::handles::{FileState, Handle, STUB_ROW_CHANGED};
use crate::store::Store;
use kaiso_policy::Op;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLockReadGuard};

/// Bytes copied under one hold of the files' gates: a long copy lets the mover switch a
/// file in between (a write request is at most 1 MiB; this keeps the hold of the same
/// order of time on a disk while costing few round trips).
const CHUNK: u64 = 16 << 20;

/// Longest copy one call does: the FUSE reply carries the count in 32 bits, and the
/// kernel asks for no more than `UINT_MAX & PAGE_MASK`.
const MAX_COPY: u64 = u32::MAX as u64 & !0xfff;

/// Tries of one chunk that spills its destination (as [`Store::write`] does).
const SPILL_ATTEMPTS: u32 = 32;

/// The gates of the source and the destination, held shared (one, if they are one file).
/// Taken in inode order, so two copies in opposite directions never wait for each other
/// behind a mover waiting for one of the gates.
struct Gates<'a> {
    _first: RwLockReadGuard<'a, ()>,
    _second: Option<RwLockReadGuard<'a, ()>>,
}

fn gates<'a>(a: &'a FileState, b: &'a FileState) -> Gates<'a> {
    let read = |s: &'a FileState| s.gate.read().unwrap_or_else(|e| e.into_inner());
    if std::ptr::eq(a, b) {
        return Gates {
            _first: read(a),
            _second: None,
        };
    }
    let (x, y) = if a.ino <= b.ino { (a, b) } else { (b, a) };
    let first = read(x);
    Gates {
        _first: first,
        _second: Some(read(y)),
    }
}

/// How many bytes one backing copy moved before it stopped, and why it stopped early.
struct Copied {
    n: u64,
    err: Option<std::io::Error>,
}

/// Copies `len` bytes from `fin` at `off_in` to `fout` at `off_out`: `copy_file_range(2)`,
/// or a pread/pwrite loop where the kernel cannot copy between the two (another file
/// system, a kernel or file system without it). Stops early at the source's end.
/// `kernel`: try `copy_file_range(2)` first (tests pass false to exercise the loop).
fn copy_backing(
    fin: &File,
    off_in: u64,
    fout: &File,
    off_out: u64,
    len: u64,
    mut kernel: bool,
) -> Copied {
    let mut done = 0u64;
    let mut buf = Vec::new();
    while done < len {
        let want = (len - done).min(isize::MAX as u64) as usize;
        if kernel {
            let mut i = (off_in + done) as libc::loff_t;
            let mut o = (off_out + done) as libc::loff_t;
            let r = unsafe {
                libc::copy_file_range(fin.as_raw_fd(), &mut i, fout.as_raw_fd(), &mut o, want, 0)
            };
            if r > 0 {
                done += r as u64;
                continue;
            }
            if r == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) | Some(libc::EAGAIN) => continue,
                // Not between these two files: copy them through kaiso.
                Some(libc::EXDEV)
                | Some(libc::ENOSYS)
                | Some(libc::EOPNOTSUPP)
                | Some(libc::EINVAL) => kernel = false,
                _ => {
                    return Copied {
                        n: done,
                        err: Some(e),
                    };
                }
            }
        }
        if buf.is_empty() {
            buf = vec![0u8; (1 << 20).min(len as usize)];
        }
        let want = want.min(buf.len());
        let n = match fin.read_at(&mut buf[..want], off_in + done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                return Copied {
                    n: done,
                    err: Some(e),
                };
            }
        };
        // A short write leaves `done` at what landed (the next round writes the rest).
        let mut w = 0;
        while w < n {
            match fout.write_at(&buf[w..n], off_out + done + w as u64) {
                Ok(0) => {
                    return Copied {
                        n: done + w as u64,
                        err: Some(std::io::Error::from_raw_os_error(libc::ENOSPC)),
                    };
                }
                Ok(k) => w += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Copied {
                        n: done + w as u64,
                        err: Some(e),
                    };
                }
            }
        }
        done += n as u64;
    }
    Copied { n: done, err: None }
}

impl Store {
    /// copy_file_range(2): copy up to `len` bytes of handle `fh_in` at `offset_in` to
    /// handle `fh_out` at `offset_out`; returns the bytes copied (0 when `offset_in` is at
    /// or past the source's end). At most [`MAX_COPY`] bytes per call, as the kernel asks.
    ///
    /// As the system call does: EBADF when `fh_out` is not open for writing or was opened
    /// O_APPEND; EINVAL for overlapping ranges of one file; the copy is cut at the
    /// source's end; copying past the destination's end extends it (with a hole between).
    ///
    /// Store rules, as a read of the source and a write of the destination follow them:
    /// - stub ranges of either file are fetched first (of the destination, what the copy
    ///   overwrites inside its current size, as a write does);
    /// - the destination's growth is reserved on its tier; a full tier spills the file
    ///   to another tier with room (never ENOSPC while one has room);
    /// - emulated tiers are charged the bytes read and written, and the policy sees a
    ///   read of the source and a write of the destination;
    /// - the destination's write generation moves (a copy by the mover in progress
    ///   starts over), and the bytes copied are no longer missing in a stub.
    ///
    /// The backing files' times change as the copy writes them (mtime and ctime of the
    /// destination). The copy goes in chunks of 16 MiB, each under the files' gates.
    pub fn copy_file_range(
        &self,
        fh_in: u64,
        offset_in: u64,
        fh_out: u64,
        offset_out: u64,
        len: u64,
    ) -> FsResult<u64> {
        let hin = self.handle(fh_in).ok_or(FsError::BADF)?;
        let hout = self.handle(fh_out).ok_or(FsError::BADF)?;
        if !hout.writable || hout.flags & libc::O_APPEND != 0 {
            return Err(FsError::BADF);
        }
        let (src, dst) = (&hin.state, &hout.state);
        let src_size = src.size.load(Ordering::Acquire);
        if offset_in >= src_size || len == 0 {
            return Ok(0);
        }
        let len = len.min(src_size - offset_in).min(MAX_COPY);
        if offset_in.checked_add(len).is_none() || offset_out.checked_add(len).is_none() {
            return Err(FsError(libc::EOVERFLOW));
        }
        if Arc::ptr_eq(src, dst) && offset_out < offset_in + len && offset_in < offset_out + len {
            return Err(FsError::INVAL);
        }
        let mut total = 0u64;
        while total < len {
            let n = (len - total).min(CHUNK);
            match self.copy_chunk(&hin, offset_in + total, &hout, offset_out + total, n) {
                Ok(0) => break,
                Ok(k) => total += k,
                // Bytes already copied are the answer; the error comes with the next call.
                Err(_) if total > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(total)
    }

    /// One chunk of [`Store::copy_file_range`]: up to `n` bytes, under the gates.
    fn copy_chunk(
        &self,
        hin: &Handle,
        off_in: u64,
        hout: &Handle,
        off_out: u64,
        n: u64,
    ) -> FsResult<u64> {
        let (src, dst) = (&hin.state, &hout.state);
        // Fetched before the gates are taken, as reads and writes do (a fetch takes the
        // gate exclusively to write).
        let src_size = src.size.load(Ordering::Acquire);
        self.fill_range(src, off_in, (off_in + n).min(src_size))?;
        let dst_size = dst.size.load(Ordering::Acquire);
        self.fill_range(dst, off_out, (off_out + n).min(dst_size))?;
        for _attempt in 0..SPILL_ATTEMPTS {
            let g = gates(src, dst);
            // Under the gate, with the change (see `write`).
            self.stub_client_change(dst)?;
            let (src_tier, dst_tier) = (src.tier(), dst.tier());
            let src_size = src.size.load(Ordering::Acquire);
            let size = dst.size.load(Ordering::Acquire);
            // Cut at the source's end as it is now (it may have shrunk since).
            let n = n.min(src_size.saturating_sub(off_in));
            if n == 0 {
                return Ok(0);
            }
            let end = off_out + n;
            let growth = end.saturating_sub(size);
            if !self.reserve(dst_tier, growth) {
                drop(g);
                self.spill(dst.ino, dst_tier, end.max(size))?;
                continue;
            }
            let c = copy_backing(&hin.file(), off_in, &hout.file(), off_out, n, true);
            if c.n == 0 {
                self.tiers[dst_tier as usize].add_used(-(growth as i64));
                match c.err {
                    Some(e)
                        if e.raw_os_error() == Some(libc::ENOSPC)
                            || e.raw_os_error() == Some(libc::EDQUOT) =>
                    {
                        drop(g);
                        self.spill(dst.ino, dst_tier, end.max(size))?;
                        continue;
                    }
                    Some(e) => return Err(e.into()),
                    None => return Ok(0),
                }
            }
            // What landed counts; an error after it comes back with the next chunk (a
            // full file system then spills as above).
            let end = off_out + c.n;
            let prev = dst.size.fetch_max(end, Ordering::AcqRel);
            // Another writer may have grown the file meanwhile, or the copy came out
            // short: give back what was reserved and not used (see `write`).
            let actual = end.saturating_sub(prev);
            if actual < growth {
                self.tiers[dst_tier as usize].add_used(-((growth - actual) as i64));
            }
            dst.write_gen.fetch_add(1, Ordering::AcqRel);
            if let Some(s) = dst.stub.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                if crate::stub::subtract(&mut s.missing, off_out, end) {
                    dst.mark_unsynced(STUB_ROW_CHANGED);
                }
            }
            drop(g);
            self.tiers[src_tier as usize].emulate(src.ino, off_in, c.n, false);
            self.tiers[dst_tier as usize].emulate(dst.ino, off_out, c.n, true);
            self.record(src.ino, src_tier, Op::Read, off_in, c.n, src_size);
            self.record(dst.ino, dst_tier, Op::Write, off_out, c.n, end.max(size));
            return Ok(c.n);
        }
        Err(FsError::NOSPC)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StoreConfig;
    use crate::stub::{StubEntry, StubFiller, StubState};
    use crate::types::{Caller, FileKind, Ino, ROOT_INO};
    use std::path::Path;
    use std::time::{Duration, UNIX_EPOCH};

    const SIZE: u64 = 3 << 20;
    const UNIT: u64 = 1 << 20;

    /// Byte `i` of the source's file `name` ("a" or "b").
    fn byte_at(name: &Path, i: u64) -> u8 {
        let seed = if name.ends_with("a") { 7 } else { 13 };
        (i * seed + i / 251) as u8
    }

    /// A migration source of two files, `a` and `b`, fetched one unit at a time.
    struct Source;

    impl StubFiller for Source {
        fn fill_dir(&self, store: &Store, ino: Ino, _path: &Path) -> FsResult<()> {
            let e = StubEntry {
                kind: FileKind::File,
                perm: 0o644,
                uid: 0,
                gid: 0,
                size: SIZE,
                mtime: UNIX_EPOCH + Duration::from_secs(1_000_000_000),
                atime: UNIX_EPOCH + Duration::from_secs(1_000_000_000),
                symlink_target: None,
                rdev: 0,
                unlisted: false,
            };
            store.stub_batch(|| {
                store.stub_create(ino, "a".as_ref(), &e)?;
                store.stub_create(ino, "b".as_ref(), &e)
            })?;
            store.stub_dir_listed(ino)
        }

        fn fill_range(
            &self,
            store: &Store,
            ino: Ino,
            path: &Path,
            offset: u64,
            len: u64,
        ) -> FsResult<()> {
            let start = offset / UNIT * UNIT;
            let end = (offset + len).div_ceil(UNIT) * UNIT;
            for u in (start..end.min(SIZE)).step_by(UNIT as usize) {
                let data: Vec<u8> = (u..(u + UNIT).min(SIZE))
                    .map(|i| byte_at(path, i))
                    .collect();
                store.stub_write(ino, u, &data)?;
            }
            Ok(())
        }
    }

    /// A store of two 64 MiB tiers whose root lists the [`Source`]'s stubs.
    fn migrating() -> (tempfile::TempDir, Arc<Store>) {
        let dir = tempfile::tempdir().unwrap();
        let mut text = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n",
            dir.path().join("state").display()
        );
        for i in 0..2 {
            let t = dir.path().join(format!("t{i}"));
            std::fs::create_dir(&t).unwrap();
            text.push_str(&format!(
                "[[tier]]\nname = \"t{i}\"\npath = \"{}\"\ncapacity = \"64MiB\"\n",
                t.display()
            ));
        }
        let s = Store::open(StoreConfig::from_toml_str(&text, "t").unwrap()).unwrap();
        s.set_stub_filler(Arc::new(Source));
        s.stub_mark(
            ROOT_INO,
            StubState {
                unlisted_dir: true,
                ..StubState::default()
            },
        )
        .unwrap();
        (dir, s)
    }

    fn open(s: &Store, name: &str, flags: i32) -> (Ino, u64) {
        let ino = s.lookup(ROOT_INO, name.as_ref()).unwrap().ino;
        (ino, s.open_file(ino, flags, false).unwrap().fh)
    }

    fn read_all(s: &Store, ino: Ino) -> Vec<u8> {
        let fh = s.open_file(ino, libc::O_RDONLY, false).unwrap().fh;
        let d = s.read(fh, 0, 8 << 20).unwrap();
        s.release(fh).unwrap();
        d
    }

    fn accesses(s: &Store) -> u64 {
        s.status().tiers.iter().map(|t| t.accesses).sum()
    }

    /// Source and destination stubs: the copy fetches what it reads and what it partly
    /// overwrites, marks what it wrote present, and leaves the rest to later fetches.
    #[test]
    fn stubs_are_fetched_and_the_copied_range_is_present() {
        let (_dir, s) = migrating();
        let (a, fa) = open(&s, "a", libc::O_RDONLY);
        let (attr, opened) = s
            .create(
                ROOT_INO,
                "c".as_ref(),
                0o644,
                0o022,
                libc::O_RDWR,
                Caller::ROOT,
                false,
            )
            .unwrap();
        let (c, fc) = (attr.ino, opened.fh);
        let before = accesses(&s);
        let from = UNIT / 2 + 5;
        assert_eq!(s.copy_file_range(fa, from, fc, 0, UNIT).unwrap(), UNIT);
        assert_eq!(
            accesses(&s) - before,
            2,
            "one read of the source and one write of the copy counted"
        );
        let want: Vec<u8> = (from..from + UNIT)
            .map(|i| byte_at("a".as_ref(), i))
            .collect();
        assert!(read_all(&s, c) == want, "the copy holds the source's bytes");
        assert!(
            crate::stub::missing_within(&s.stub_state(a).missing, from, from + UNIT).is_empty(),
            "the source's copied range was fetched"
        );

        // Into the stub b, inside its size: b's own bytes around the copy stay b's.
        let (b, fb) = open(&s, "b", libc::O_RDWR);
        let at = UNIT + 10;
        assert_eq!(s.copy_file_range(fc, 0, fb, at, 1000).unwrap(), 1000);
        assert!(
            crate::stub::missing_within(&s.stub_state(b).missing, at, at + 1000).is_empty(),
            "the range copied into b is present"
        );
        let got = read_all(&s, b);
        assert_eq!(got.len() as u64, SIZE);
        for i in 0..SIZE {
            let w = if (at..at + 1000).contains(&i) {
                want[(i - at) as usize]
            } else {
                byte_at("b".as_ref(), i)
            };
            assert_eq!(got[i as usize], w, "byte {i} of b");
        }
        for fh in [fa, fb, fc] {
            s.release(fh).unwrap();
        }
        s.shutdown();
    }

    /// The rules the system call has: overlap in one file, append and read-only
    /// destinations, the source's end, growth accounted on the destination's tier.
    #[test]
    fn refusals_ends_and_accounting() {
        let (_dir, s) = migrating();
        let (_, fa) = open(&s, "a", libc::O_RDWR);
        assert_eq!(s.copy_file_range(fa, 0, fa, 100, 200), Err(FsError::INVAL));
        assert_eq!(
            s.copy_file_range(fa, 250, fa, 100, 200),
            Err(FsError::INVAL)
        );
        assert_eq!(s.copy_file_range(fa, 0, fa, 200, 200).unwrap(), 200);
        assert_eq!(s.copy_file_range(fa, SIZE, fa, 0, 10).unwrap(), 0);
        assert_eq!(s.copy_file_range(fa, SIZE - 4, fa, 0, 10).unwrap(), 4);
        let (_, ro) = open(&s, "b", libc::O_RDONLY);
        assert_eq!(s.copy_file_range(fa, 0, ro, 0, 10), Err(FsError::BADF));
        let (b, app) = open(&s, "b", libc::O_WRONLY | libc::O_APPEND);
        assert_eq!(s.copy_file_range(fa, 0, app, 0, 10), Err(FsError::BADF));
        let used = |s: &Store| s.status().tiers.iter().map(|t| t.used).sum::<u64>();
        let u0 = used(&s);
        let (_, fb) = open(&s, "b", libc::O_RDWR);
        // Past b's end: b grows by the hole and the copy.
        assert_eq!(s.copy_file_range(fa, 0, fb, SIZE + 100, 50).unwrap(), 50);
        assert_eq!(used(&s) - u0, 150, "growth accounted on the tiers");
        assert_eq!(read_all(&s, b).len() as u64, SIZE + 150);
        for fh in [fa, ro, app, fb] {
            s.release(fh).unwrap();
        }
        s.shutdown();
    }

    /// The read/write loop (files on two file systems) copies what the kernel would.
    #[test]
    fn the_loop_copies_like_the_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(3u32 << 20) + 17).map(|i| (i % 241) as u8).collect();
        std::fs::write(dir.path().join("in"), &data).unwrap();
        let fin = File::open(dir.path().join("in")).unwrap();
        for kernel in [true, false] {
            let p = dir.path().join(format!("out-{kernel}"));
            std::fs::write(&p, b"head").unwrap();
            let fout = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            let c = copy_backing(&fin, 9, &fout, 4, data.len() as u64, kernel);
            assert!(c.err.is_none(), "kernel {kernel}: {:?}", c.err);
            assert_eq!(
                c.n,
                data.len() as u64 - 9,
                "kernel {kernel}: stops at the end"
            );
            let got = std::fs::read(&p).unwrap();
            assert!(
                got[..4] == *b"head" && got[4..] == data[9..],
                "kernel {kernel}: bytes"
            );
        }
    }
}
