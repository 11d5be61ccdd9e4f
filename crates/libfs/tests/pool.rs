//! Pool behaviour through the library API: data, namespace, persistence across reopen.

use kaiso_libfs::{Fs, FsError, PoolError, PoolOptions};
use std::path::PathBuf;

struct TempPool(PathBuf);

impl TempPool {
    fn new(tag: &str) -> TempPool {
        let p = std::env::temp_dir().join(format!(
            "kaiso-libfs-test-{}-{tag}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        TempPool(p)
    }
    fn open(&self) -> Fs {
        let opts = PoolOptions {
            size: 64 << 20,
            ..PoolOptions::default()
        };
        Fs::open_pool(&self.0, &opts, b"/p").expect("open pool").0
    }
}

impl Drop for TempPool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const RW: i32 = libc::O_RDWR | libc::O_CREAT;

#[test]
fn write_read_sparse_and_append() {
    let t = TempPool::new("rw");
    let fs = t.open();
    let f = fs.open(b"/p/a", RW, 0o644).unwrap();
    assert_eq!(f.write(b"hello").unwrap(), 5);
    // Sparse: a hole of ~2 blocks and a partial block of stale data must read as zeros.
    assert_eq!(f.pwrite(b"X", 10_000).unwrap(), 1);
    let mut buf = vec![0xffu8; 10_001];
    assert_eq!(f.pread(&mut buf, 0).unwrap(), 10_001);
    assert_eq!(&buf[..5], b"hello");
    assert!(buf[5..10_000].iter().all(|&b| b == 0));
    assert_eq!(buf[10_000], b'X');
    // Shrink then grow: the old bytes past the new end must not come back.
    f.truncate(2).unwrap();
    f.truncate(5).unwrap();
    let mut b5 = [9u8; 5];
    f.pread(&mut b5, 0).unwrap();
    assert_eq!(&b5, b"he\0\0\0");
    let a = fs
        .open(b"/p/a", libc::O_WRONLY | libc::O_APPEND, 0)
        .unwrap();
    a.write(b"!").unwrap();
    assert_eq!(f.stat().size, 6);
}

#[test]
fn large_file_uses_indirect_blocks() {
    let t = TempPool::new("big");
    let fs = t.open();
    let f = fs.open(b"/p/big", RW, 0o644).unwrap();
    let chunk: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    for _ in 0..40 {
        f.write(&chunk).unwrap();
    }
    let mut back = vec![0u8; 65536];
    for i in 0..40 {
        f.pread(&mut back, i * 65536).unwrap();
        assert_eq!(back, chunk);
    }
    drop(f);
    fs.unlink(b"/p/big").unwrap();
    let st = fs.statfs();
    assert_eq!(
        st.blocks - st.blocks_free,
        1,
        "only the root directory block stays in use"
    );
}

#[test]
fn namespace_operations_and_errors() {
    let t = TempPool::new("ns");
    let fs = t.open();
    fs.mkdir(b"/p/d", 0o755).unwrap();
    assert_eq!(fs.mkdir(b"/p/d", 0o755), Err(FsError::Errno(libc::EEXIST)));
    fs.open(b"/p/d/x", RW, 0o600).unwrap().write(b"x").unwrap();
    fs.open(b"/p/d/y", RW, 0o600).unwrap().write(b"yy").unwrap();
    assert_eq!(fs.rmdir(b"/p/d"), Err(FsError::Errno(libc::ENOTEMPTY)));
    fs.rename(b"/p/d/x", b"/p/d/y", 0).unwrap();
    assert_eq!(fs.stat(b"/p/d/y", true).unwrap().size, 1);
    assert_eq!(fs.stat(b"/p/d/x", true), Err(FsError::Errno(libc::ENOENT)));
    fs.symlink(b"d/y", b"/p/link").unwrap();
    assert_eq!(fs.stat(b"/p/link", true).unwrap().size, 1);
    assert_eq!(fs.readlink(b"/p/link").unwrap(), b"d/y");
    fs.symlink(b"/etc", b"/p/out").unwrap();
    assert_eq!(
        fs.stat(b"/p/out/passwd", true),
        Err(FsError::Outside(b"/etc/passwd".to_vec()))
    );
    assert_eq!(
        fs.rename(b"/p/d", b"/p/d/sub", 0),
        Err(FsError::Errno(libc::EINVAL))
    );
    let names: Vec<_> = fs
        .read_dir(fs.lookup(b"/p/d").unwrap())
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert_eq!(names, vec![b"y".to_vec().into_boxed_slice()]);
}

#[test]
fn unlinked_open_file_keeps_data_until_close() {
    let t = TempPool::new("unl");
    let fs = t.open();
    let f = fs.open(b"/p/f", RW, 0o644).unwrap();
    f.write(&[7u8; 100_000]).unwrap();
    let used = fs.statfs().blocks_free;
    fs.unlink(b"/p/f").unwrap();
    let mut b = [0u8; 10];
    assert_eq!(f.pread(&mut b, 99_990).unwrap(), 10);
    assert_eq!(b, [7u8; 10]);
    assert_eq!(fs.statfs().blocks_free, used);
    drop(f);
    assert!(fs.statfs().blocks_free > used);
}

#[test]
fn contents_survive_reopen_and_second_owner_is_refused() {
    let t = TempPool::new("reopen");
    {
        let fs = t.open();
        fs.mkdir(b"/p/dir", 0o700).unwrap();
        for i in 0..500 {
            let name = format!("/p/dir/f{i}");
            fs.open(name.as_bytes(), RW, 0o644)
                .unwrap()
                .write(name.as_bytes())
                .unwrap();
        }
        let second = Fs::open_pool(&t.0, &PoolOptions::default(), b"/p");
        assert!(
            matches!(second, Err(PoolError::Busy { .. })),
            "second owner must be refused"
        );
    }
    let (fs, rep) = Fs::open_pool(&t.0, &PoolOptions::default(), b"/p").unwrap();
    assert!(rep.clean(), "{:?}", rep.fixes);
    assert_eq!(rep.files, 500);
    assert_eq!(rep.dirs, 2);
    let f = fs.open(b"/p/dir/f321", libc::O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; 64];
    let n = f.read(&mut b).unwrap();
    assert_eq!(&b[..n], b"/p/dir/f321");
}

#[test]
fn threads_create_write_delete_concurrently() {
    let t = TempPool::new("mt");
    let fs = t.open();
    let hs: Vec<_> = (0..4)
        .map(|k| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    let name = format!("/p/t{k}-{i}");
                    let f = fs.open(name.as_bytes(), RW, 0o644).unwrap();
                    f.write(&vec![k as u8; 5000]).unwrap();
                    if i % 2 == 0 {
                        fs.unlink(name.as_bytes()).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(fs.read_dir(1).unwrap().len(), 400);
}

#[test]
fn fsck_repairs_corrupt_pointers_and_entries() {
    use std::os::unix::fs::FileExt;
    let t = TempPool::new("fsck");
    {
        let fs = t.open();
        fs.open(b"/p/a", RW, 0o644)
            .unwrap()
            .write(&[1u8; 10_000])
            .unwrap();
        fs.open(b"/p/b", RW, 0o644).unwrap().write(b"bee").unwrap();
    }
    // Inode 2 is /p/a (the first one allocated); its first direct pointer sits 64 bytes in.
    // The inode table starts after the 4 KiB superblock and the 256 KiB log.
    let inode_table = 4096 + 256 * 1024;
    let f = std::fs::OpenOptions::new().write(true).open(&t.0).unwrap();
    f.write_all_at(&0xdead_beefu64.to_le_bytes(), inode_table + 2 * 256 + 64)
        .unwrap();
    // Make /p/b's inode look free: its directory entry now dangles.
    f.write_all_at(&0u32.to_le_bytes(), inode_table + 3 * 256)
        .unwrap();
    drop(f);
    let (fs, rep) = Fs::open_pool(&t.0, &PoolOptions::default(), b"/p").unwrap();
    assert!(!rep.clean());
    assert!(
        rep.fixes
            .iter()
            .any(|f| f.contains("invalid block pointers")),
        "{:?}",
        rep.fixes
    );
    assert!(
        rep.fixes.iter().any(|f| f.contains("removed bad entry")),
        "{:?}",
        rep.fixes
    );
    // The damaged block reads as a hole; the rest of the file is intact; /p/b is gone.
    let a = fs.open(b"/p/a", libc::O_RDONLY, 0).unwrap();
    let mut buf = vec![9u8; 10_000];
    assert_eq!(a.pread(&mut buf, 0).unwrap(), 10_000);
    assert!(buf[..4096].iter().all(|&x| x == 0));
    assert!(buf[4096..].iter().all(|&x| x == 1));
    assert_eq!(fs.stat(b"/p/b", true), Err(FsError::Errno(libc::ENOENT)));
    drop(a);
    drop(fs);
    // A second check finds nothing left to repair.
    let (_, again) = Fs::open_pool(&t.0, &PoolOptions::default(), b"/p").unwrap();
    assert!(again.clean(), "{:?}", again.fixes);
}

#[test]
fn reused_blocks_never_show_old_data() {
    // Blocks of a deleted file are handed out again: in the same session from the free list,
    // after a reopen from past the high-water mark. Either way the parts of a new block the
    // write does not cover must read as zeros, not as the deleted file's bytes.
    let t = TempPool::new("stale");
    let check = |fs: &Fs, name: &[u8]| {
        let f = fs.open(name, RW, 0o644).unwrap();
        f.pwrite(b"new", 5000).unwrap();
        let mut buf = vec![0xeeu8; 5003];
        assert_eq!(f.pread(&mut buf, 0).unwrap(), 5003);
        assert!(
            buf[..5000].iter().all(|&b| b == 0),
            "stale data before the write"
        );
        assert_eq!(&buf[5000..], b"new");
        f.truncate(8192).unwrap();
        let mut tail = vec![0xeeu8; 8192 - 5003];
        f.pread(&mut tail, 5003).unwrap();
        assert!(tail.iter().all(|&b| b == 0), "stale data after the write");
    };
    {
        let fs = t.open();
        let f = fs.open(b"/p/old", RW, 0o644).unwrap();
        f.write(&vec![0xffu8; 64 << 10]).unwrap();
        drop(f);
        fs.unlink(b"/p/old").unwrap();
        check(&fs, b"/p/same-session");
        let f = fs.open(b"/p/old2", RW, 0o644).unwrap();
        f.write(&vec![0xffu8; 64 << 10]).unwrap();
        drop(f);
        fs.unlink(b"/p/old2").unwrap();
        fs.unlink(b"/p/same-session").unwrap();
    }
    let fs = t.open();
    check(&fs, b"/p/after-reopen");
    for i in 0..20 {
        check(&fs, format!("/p/more{i}").as_bytes());
    }
}

#[test]
fn hard_links_share_the_inode_and_survive_reopen() {
    let t = TempPool::new("links");
    {
        let fs = t.open();
        let f = fs.open(b"/p/a", RW, 0o644).unwrap();
        f.write(b"data").unwrap();
        fs.link(b"/p/a", b"/p/b", false).unwrap();
        assert_eq!(f.stat().nlink, 2);
        assert!(matches!(
            fs.link(b"/p/a", b"/p/b", false),
            Err(FsError::Errno(libc::EEXIST))
        ));
        fs.mkdir(b"/p/d", 0o755).unwrap();
        assert!(matches!(
            fs.link(b"/p/d", b"/p/d2", false),
            Err(FsError::Errno(libc::EPERM))
        ));
        fs.unlink(b"/p/a").unwrap();
    }
    let fs = t.open();
    let st = fs.stat(b"/p/b", false).unwrap();
    assert_eq!((st.nlink, st.size), (1, 4));
    fs.link(b"/p/b", b"/p/c", false).unwrap();
    fs.unlink(b"/p/b").unwrap();
    fs.unlink(b"/p/c").unwrap();
    drop(fs);
    let (_, report) = Fs::open_pool(
        &t.0,
        &PoolOptions {
            size: 64 << 20,
            ..PoolOptions::default()
        },
        b"/p",
    )
    .unwrap();
    assert!(report.clean(), "{:?}", report.fixes);
    assert_eq!(report.files, 0);
}
