//! Start-up recovery and fsck: replay the redo log, walk the tree from the root, repair what
//! a crash can leave (orphaned inodes, blocks linked past the end of a file, stale link
//! counts) and what corruption could (bad or doubly used pointers, bad entries), then rebuild
//! the DRAM state: directory indexes, parent map, free lists and counters.

use crate::fs::{Alloc, Dir, Inner, Ino, dtype_of};
use crate::layout::*;
use std::collections::HashMap;

/// What recovery found and did.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub log_replayed: bool,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub bytes: u64,
    pub blocks_used: u64,
    pub blocks_total: u64,
    pub inodes_total: u64,
    /// In-use inodes no directory refers to (unlinked while open, then a crash): freed.
    pub orphans_freed: u64,
    /// Repairs beyond orphan collection, one line each.
    pub fixes: Vec<String>,
}

impl Report {
    /// True when the pool needed no repair beyond the normal crash cleanup.
    pub fn clean(&self) -> bool {
        self.fixes.is_empty()
    }
}

/// Calls `f(slot, pointer, is_index)` for every pointer of an inode's block map; a pointer for
/// which `f` returns false is cleared (and an index block's children are then not visited).
fn visit(inner: &Inner, ino: Ino, f: &mut dyn FnMut(u64, u64, bool) -> bool) {
    let ioff = inner.g.inode(ino);
    let per = inner.g.per_index();
    let clear = |s: u64| {
        inner.st64(s, 0);
        inner.m.persist(s, 8);
    };
    for i in 0..N_DIRECT {
        let s = ioff + I_DIRECT + i * 8;
        let p = inner.ld64(s);
        if p != 0 && !f(s, p, false) {
            clear(s);
        }
    }
    let s = ioff + I_INDIRECT;
    let ind = inner.ld64(s);
    if ind != 0 {
        if f(s, ind, true) {
            for j in 0..per {
                let s2 = ind + j * 8;
                let q = inner.ld64(s2);
                if q != 0 && !f(s2, q, false) {
                    clear(s2);
                }
            }
        } else {
            clear(s);
        }
    }
    let s = ioff + I_DINDIRECT;
    let dind = inner.ld64(s);
    if dind != 0 {
        if f(s, dind, true) {
            for k in 0..per {
                let s2 = dind + k * 8;
                let ind2 = inner.ld64(s2);
                if ind2 == 0 {
                    continue;
                }
                if f(s2, ind2, true) {
                    for j in 0..per {
                        let s3 = ind2 + j * 8;
                        let q = inner.ld64(s3);
                        if q != 0 && !f(s3, q, false) {
                            clear(s3);
                        }
                    }
                } else {
                    clear(s2);
                }
            }
        } else {
            clear(s);
        }
    }
}

/// Clears pointers that are not block starts inside the data area, then cuts blocks past
/// the end of the file.
fn sanitize(inner: &Inner, ino: Ino, fixes: &mut Vec<String>) {
    let mut bad = 0;
    visit(inner, ino, &mut |_, p, _| {
        let ok = inner.g.block_index(p).is_some();
        if !ok {
            bad += 1;
        }
        ok
    });
    if bad > 0 {
        fixes.push(format!("inode {ino}: cleared {bad} invalid block pointers"));
    }
    let size = inner.iget(ino, I_SIZE);
    // Blocks past the end: left by a crash in the middle of an extending write or a
    // truncate. They hold no file data; free them.
    let _ = inner.cut_blocks(ino, size.div_ceil(inner.g.block_size));
}

pub(crate) fn recover(inner: &Inner) -> Result<Report, String> {
    let mut rep = Report {
        log_replayed: inner.replay_log()?,
        blocks_total: inner.g.block_count,
        inodes_total: inner.g.inode_count - 1,
        ..Report::default()
    };
    let n = inner.g.inode_count as usize;
    let bs = inner.g.block_size;
    let mut in_use = vec![false; n];
    // Only the parts of the inode table that were ever written: reading a hole of a fresh,
    // sparse pool would fault in (and zero) the whole table.
    let table = inner.g.inode(0);
    for (off, len) in inner.m.data_ranges(table, n as u64 * INODE_SIZE) {
        let first = ((off - table) / INODE_SIZE).max(1);
        let last = ((off + len - table).div_ceil(INODE_SIZE)).min(n as u64);
        for ino in first..last {
            in_use[ino as usize] = inner.imode(ino) != 0;
        }
    }
    if !in_use[ROOT_INO as usize] || inner.imode(ROOT_INO) & libc::S_IFMT != libc::S_IFDIR {
        return Err("the root directory inode is missing or not a directory".into());
    }
    let mut reached = vec![false; n];
    let mut links = vec![0u32; n];
    let mut subdirs = vec![0u32; n];
    let mut dirs: HashMap<Ino, Dir> = HashMap::new();
    let mut parent: HashMap<Ino, (Ino, Box<[u8]>)> = HashMap::new();
    let mut queue = vec![ROOT_INO];
    reached[ROOT_INO as usize] = true;
    while let Some(d) = queue.pop() {
        sanitize(inner, d, &mut rep.fixes);
        let dio = inner.g.inode(d);
        let size = inner.ld64(dio + I_SIZE);
        let mut nslots = size / DIRENT_SIZE;
        if !size.is_multiple_of(DIRENT_SIZE) {
            rep.fixes.push(format!(
                "directory {d}: size {size} is not a whole number of entries"
            ));
        }
        let mut dir = Dir::new();
        for slot in 0..nslots {
            let pos = slot * DIRENT_SIZE;
            let b = inner.bget(d, pos / bs);
            if b == 0 {
                rep.fixes.push(format!(
                    "directory {d}: entry array has a hole at slot {slot}; truncated"
                ));
                nslots = slot;
                break;
            }
            let off = b + pos % bs;
            let ino = inner.ld64(off + D_INO);
            if ino == 0 {
                dir.free.push(slot as u32);
                continue;
            }
            let nlen = u16::from_le_bytes([unsafe { *inner.m.ptr(off + D_NAMELEN) }, unsafe {
                *inner.m.ptr(off + D_NAMELEN + 1)
            }]) as usize;
            let name: Box<[u8]> = if (1..=NAME_MAX).contains(&nlen) {
                unsafe { std::slice::from_raw_parts(inner.m.ptr(off + D_NAME), nlen) }.into()
            } else {
                Box::new([])
            };
            let valid_name = !name.is_empty()
                && !name.contains(&b'/')
                && !name.contains(&0)
                && &*name != b"."
                && &*name != b"..";
            let idx = ino as usize;
            let valid = idx < n
                && ino != ROOT_INO
                && in_use[idx]
                && valid_name
                && !dir.entries.contains_key(&name)
                && !(inner.imode(ino) & libc::S_IFMT == libc::S_IFDIR && reached[idx]);
            if !valid {
                rep.fixes.push(format!(
                    "directory {d}: removed bad entry {:?} -> inode {ino}",
                    String::from_utf8_lossy(&name)
                ));
                inner.st64(off + D_INO, 0);
                inner.m.persist(off, 8);
                dir.free.push(slot as u32);
                continue;
            }
            let mode = inner.imode(ino);
            let kind = dtype_of(mode);
            if unsafe { *inner.m.ptr(off + D_TYPE) } != kind {
                unsafe { *inner.m.ptr(off + D_TYPE) = kind };
                inner.m.persist(off + D_TYPE, 1);
            }
            links[idx] += 1;
            reached[idx] = true;
            if mode & libc::S_IFMT == libc::S_IFDIR {
                subdirs[d as usize] += 1;
                queue.push(ino);
                parent.insert(ino, (d, name.clone()));
            }
            dir.entries.insert(name, (ino, slot as u32, kind));
        }
        dir.nslots = nslots as u32;
        if nslots * DIRENT_SIZE != size {
            inner.st64(dio + I_SIZE, nslots * DIRENT_SIZE);
            inner.m.persist(dio + I_SIZE, 8);
            let _ = inner.cut_blocks(d, (nslots * DIRENT_SIZE).div_ceil(bs));
        }
        dirs.insert(d, dir);
    }

    // Orphans: allocated, unreachable. Normal after a crash with unlinked-but-open files.
    for ino in 1..n {
        if in_use[ino] && !reached[ino] {
            let ioff = inner.g.inode(ino as Ino);
            inner.st32(ioff + I_MODE, 0);
            inner.m.persist(ioff, 8);
            in_use[ino] = false;
            rep.orphans_freed += 1;
        }
    }

    // Link counts, block maps, block usage.
    let mut used = vec![0u64; (inner.g.block_count as usize).div_ceil(64)];
    let mut used_blocks = 0u64;
    let mut used_inodes = 0u64;
    for (ino, _) in in_use.iter().enumerate().skip(1).filter(|(_, u)| **u) {
        used_inodes += 1;
        let ino = ino as Ino;
        let ioff = inner.g.inode(ino);
        let mode = inner.imode(ino);
        let is_dir = mode & libc::S_IFMT == libc::S_IFDIR;
        let want = if is_dir {
            2 + subdirs[ino as usize]
        } else {
            links[ino as usize]
        };
        let have = inner.ld32(ioff + I_NLINK);
        if have != want {
            if !(is_dir || have == want + 1) {
                rep.fixes
                    .push(format!("inode {ino}: link count {have}, found {want}"));
            }
            inner.st32(ioff + I_NLINK, want);
            inner.m.persist(ioff + I_NLINK, 4);
        }
        if !is_dir {
            sanitize(inner, ino, &mut rep.fixes);
        }
        let mut count = 0u64;
        let mut dups = 0;
        visit(inner, ino, &mut |_, p, _| {
            let b = inner.g.block_index(p).expect("sanitized") as usize;
            if used[b / 64] & (1 << (b % 64)) != 0 {
                dups += 1;
                return false;
            }
            used[b / 64] |= 1 << (b % 64);
            count += 1;
            true
        });
        if dups > 0 {
            rep.fixes.push(format!(
                "inode {ino}: dropped {dups} blocks also used by another inode"
            ));
        }
        if inner.ld64(ioff + I_BLOCKS) != count {
            inner.st64(ioff + I_BLOCKS, count);
            inner.m.persist(ioff + I_BLOCKS, 8);
        }
        used_blocks += count;
        match mode & libc::S_IFMT {
            libc::S_IFDIR => rep.dirs += 1,
            libc::S_IFLNK => rep.symlinks += 1,
            _ => {
                rep.files += 1;
                rep.bytes += inner.ld64(ioff + I_SIZE);
            }
        }
    }
    rep.blocks_used = used_blocks;

    // Free lists, lowest numbers handed out first.
    let mut block_hwm = 0u64;
    for (w, &word) in used.iter().enumerate().rev() {
        if word != 0 {
            block_hwm = w as u64 * 64 + 64 - word.leading_zeros() as u64;
            break;
        }
    }
    let free_blocks: Vec<u64> = (0..block_hwm)
        .rev()
        .filter(|&b| used[b as usize / 64] & (1 << (b % 64)) == 0)
        .collect();
    let inode_hwm = (1..n).rev().find(|&i| in_use[i]).unwrap_or(1) as u64 + 1;
    let free_inodes: Vec<u64> = (2..inode_hwm)
        .rev()
        .filter(|&i| !in_use[i as usize])
        .collect();
    *inner.alloc.lock() = Alloc {
        free_blocks,
        block_hwm,
        block_count: inner.g.block_count,
        free_inodes,
        inode_hwm,
        inode_count: inner.g.inode_count,
        used_blocks,
        used_inodes,
        blocks_ready: block_hwm,
        inodes_ready: inode_hwm,
        // Past the last byte of data in the pool file every block reads as zeros.
        zero_from: {
            let g = &inner.g;
            let end = inner.m.data_end(g.data_off, g.block_count * g.block_size);
            block_hwm.max((end.saturating_sub(g.data_off)).div_ceil(g.block_size))
        },
    };
    let mut ns = inner.ns.write();
    ns.dirs = dirs;
    ns.parent = parent;
    Ok(rep)
}
