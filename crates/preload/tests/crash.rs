//! Crash consistency: kill -9 a create/append/rename/unlink/mkdir loop at random moments,
//! then recover the pool and check it: no repairs beyond log replay and orphan collection,
//! every file made of whole, ordered records, and no leaked blocks.

mod common;
use common::*;
use kaiso_libfs::{Fs, PoolOptions, ROOT_INO};
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

fn check_pool(s: &Scratch, mount: &[u8]) -> (u64, u64, bool) {
    let opts = PoolOptions {
        size: 0,
        ..PoolOptions::default()
    };
    let (fs, rep) = Fs::open_pool(&s.pool, &opts, mount).expect("recover pool");
    assert!(rep.clean(), "recovery had to repair: {:?}", rep.fixes);
    let mut files = 0;
    let mut stack = vec![mount.to_vec()];
    while let Some(dir) = stack.pop() {
        let ino = fs.lookup(&dir).unwrap();
        for e in fs.read_dir(ino).unwrap().iter() {
            let mut p = dir.clone();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            if e.kind == libc::DT_DIR {
                stack.push(p);
                continue;
            }
            files += 1;
            let f = fs.open(&p, libc::O_RDONLY, 0).unwrap();
            let size = f.stat().size as usize;
            let mut data = vec![0u8; size];
            assert_eq!(f.pread(&mut data, 0).unwrap(), size);
            assert_eq!(
                size % 40,
                0,
                "{}: torn record (size {size})",
                String::from_utf8_lossy(&p)
            );
            if size == 0 {
                continue; // created, killed before its first record
            }
            let id = &data[..10];
            for (seq, rec) in data.chunks(40).enumerate() {
                assert_eq!(&rec[..10], id, "{}: mixed ids", String::from_utf8_lossy(&p));
                let n: usize = std::str::from_utf8(&rec[11..21]).unwrap().parse().unwrap();
                assert_eq!(
                    n,
                    seq,
                    "{}: record {seq} out of order",
                    String::from_utf8_lossy(&p)
                );
                assert_eq!(rec[39], b'\n');
            }
        }
    }
    // Delete everything: then only the root directory's own blocks may remain in use.
    let mut dirs = Vec::new();
    let mut stack = vec![mount.to_vec()];
    while let Some(dir) = stack.pop() {
        let ino = fs.lookup(&dir).unwrap();
        for e in fs.read_dir(ino).unwrap().iter() {
            let mut p = dir.clone();
            p.push(b'/');
            p.extend_from_slice(&e.name);
            if e.kind == libc::DT_DIR {
                stack.push(p.clone());
                dirs.push(p);
            } else {
                fs.unlink(&p).unwrap();
            }
        }
    }
    for d in dirs.iter().rev() {
        fs.rmdir(d).unwrap();
    }
    let st = fs.statfs();
    let root_blocks = fs.stat_ino(ROOT_INO).blocks / (fs.block_size() / 512);
    assert_eq!(st.blocks - st.blocks_free, root_blocks, "blocks leaked");
    assert_eq!(st.inodes - st.inodes_free, 1, "inodes leaked");
    (files, rep.orphans_freed, rep.log_replayed)
}

#[test]
fn killed_loops_leave_a_recoverable_pool() {
    let s = Scratch::new("crash");
    let prog = compile_c(&s, "crashloop");
    let private = s.sub("private");
    let mount = private.as_os_str().as_bytes().to_vec();
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut seed = 0x9e37_79b9u64;
    let mut orphans = 0;
    let mut rounds = 0;
    let mut seen_files = 0;
    while rounds < 12 && Instant::now() < deadline {
        // Several kills on the same pool, then a full check (which empties it).
        for k in 0..3u64 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut c = s.private_cmd(&private, &prog);
            if rounds % 2 == 1 {
                c.env("KAISO_PERSIST", "pmem"); // exercise the cache-line flush path too
            }
            let mut child = c
                .arg(&private)
                .arg((seed % 1000 + k).to_string())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(80 + (seed >> 20) % 400));
            unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
        let (files, o, _) = check_pool(&s, &mount);
        seen_files += files;
        orphans += o;
        rounds += 1;
    }
    assert!(rounds >= 3, "too few rounds in the time limit");
    assert!(seen_files > 0, "the loop never created files");
    eprintln!("{rounds} rounds, {seen_files} files checked, {orphans} orphans collected");
}
