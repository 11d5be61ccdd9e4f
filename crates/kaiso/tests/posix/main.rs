//! POSIX behaviour suite (issue 2, item 3): every case runs on a plain directory and on a
//! kaiso mount with three tiers, and both must show the same errnos, contents and
//! attributes. Seeds place files on chosen tiers so cross-tier renames and links are
//! exercised. See docs/testing.md.

#[path = "../common/mod.rs"]
mod common;
mod harness;

use common::{as_nobody, cstr, errno_name, lstat, rc, stat};
use harness::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

macro_rules! posix_case {
    ($(#[$attr:meta])* $name:ident, $seeds:expr) => {
        $(#[$attr])*
        #[test]
        fn $name() {
            run_case(stringify!($name), $seeds, cases::$name);
        }
    };
}

const NONE: Seeds = &[];

posix_case!(create_and_open_flags, NONE);
posix_case!(
    #[ignore = "not supported: fuser 0.18.0 answers FUSE_TMPFILE (opcode 51) with ENOSYS, so \
                the kernel fails open(O_TMPFILE) with EOPNOTSUPP (see docs/tiering.md, \
                Known limits; needs a fuser with a tmpfile operation, cberner/fuser#740)"]
    o_tmpfile,
    NONE
);
posix_case!(mkdir_rmdir, NONE);
posix_case!(unlink_and_open_unlinked, NONE);
posix_case!(rename_basic, NONE);
posix_case!(
    rename_across_tiers,
    &[
        (0, "a", b"on tier zero"),
        (1, "b", b"on tier one"),
        (2, "c", b"on tier two"),
        (0, "d/x", b"x on t0"),
        (1, "d/y", b"y on t1"),
        (2, "d/sub/z", b"z on t2"),
        (2, "e/keep", b"keep"),
    ]
);
posix_case!(
    renameat2_noreplace,
    &[(0, "a", b"alpha"), (2, "b", b"beta")]
);
posix_case!(
    renameat2_exchange,
    &[
        (0, "a", b"alpha on t0"),
        (2, "b", b"beta on t2"),
        (1, "dir/inside", b"in dir on t1"),
    ]
);
posix_case!(
    hard_links,
    &[(1, "t1file", b"seeded on tier one"), (0, "dir/.keep", b"")]
);
posix_case!(symlinks, NONE);
posix_case!(mknod_and_fifo, NONE);
posix_case!(xattrs, &[(2, "slow", b"on the slowest tier")]);
posix_case!(posix_acls, NONE);
posix_case!(default_acl_inheritance, NONE);
posix_case!(chmod_chown_utimens, NONE);
posix_case!(truncate, &[(2, "slow", b"0123456789abcdef")]);
posix_case!(fallocate_and_punch_hole, NONE);
posix_case!(fsync_family, NONE);
posix_case!(o_append_shared, NONE);
posix_case!(
    writer_joins_open_readers,
    &[(1, "seeded", b"seeded on tier one")]
);
posix_case!(readdir_while_changing, NONE);
posix_case!(
    mmap_read_write,
    &[(1, "m", b"seeded content for mmap on tier one")]
);
posix_case!(flock_and_fcntl_locks, NONE);
posix_case!(
    stable_inodes_across_remount,
    &[(0, "a", b"a"), (1, "d/b", b"b"), (2, "d/e/c", b"c")]
);
posix_case!(permissions_as_nobody, NONE);
posix_case!(large_offsets, NONE);
posix_case!(
    copy_file_range,
    &[
        (0, "src", b"0123456789abcdefghijklmnopqrstuvwxyz"),
        (2, "far", b"ZYXWVUTSRQPONMLKJIHGFEDCBA"),
        (1, "mid", b"on the middle tier"),
    ]
);
posix_case!(deep_tree, NONE);

/// statfs on the mount reports the tiers' capacities summed (mount-only: a plain
/// directory has no tiers to sum).
#[test]
fn statfs_sums_tiers() {
    fuse_or_skip!();
    use common::{Store, StoreSpec, TierSpec};
    const MIB: u64 = 1 << 20;
    let store = Store::new(
        "statfs",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast").capacity(64 * MIB),
            TierSpec::new("mid").capacity(128 * MIB),
            TierSpec::new("slow").capacity(256 * MIB),
        ]),
    );
    let m = store.mount();
    fs::write(m.path.join("f"), vec![7u8; 4 * MIB as usize]).unwrap();
    let c = cstr(&m.path);
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    let total = sv.f_blocks * sv.f_frsize;
    let free = sv.f_bfree * sv.f_frsize;
    let want = 448 * MIB;
    assert!(
        total.abs_diff(want) <= want / 100,
        "statfs total {total} bytes, expected the sum of tier capacities {want}"
    );
    assert!(
        free <= want - 4 * MIB && free + 8 * MIB >= want - 4 * MIB,
        "statfs free {free}: expected about {} after writing 4 MiB",
        want - 4 * MIB
    );
    m.unmount();
}

/// Tiers sharing one file system count its free space once: with capacities far above
/// the disk, `df` on the mount shows the disk's free space (not once per tier) and, as
/// used, only what kaiso stores.
#[test]
fn statfs_counts_a_shared_file_system_once() {
    fuse_or_skip!();
    use common::{Store, StoreSpec, TierSpec};
    const MIB: u64 = 1 << 20;
    const TIB: u64 = 1 << 40;
    let store = Store::new(
        "statfs-shared",
        StoreSpec::with_tiers(vec![
            TierSpec::new("a").capacity(TIB),
            TierSpec::new("b").capacity(TIB),
            TierSpec::new("c").capacity(TIB),
        ]),
    );
    let m = store.mount();
    fs::write(m.path.join("f"), vec![7u8; 4 * MIB as usize]).unwrap();
    let stat = |p: &Path| {
        let c = cstr(p);
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
        sv
    };
    let (mnt, disk) = (stat(&m.path), stat(&store.tiers[0]));
    let mnt_free = mnt.f_bavail * mnt.f_frsize;
    let disk_free = disk.f_bavail * disk.f_frsize;
    // Other processes write to the same disk meanwhile: allow 256 MiB of drift.
    assert!(
        mnt_free <= disk_free + 256 * MIB,
        "mount shows {mnt_free} bytes free, the one disk under all tiers {disk_free}"
    );
    let used = (mnt.f_blocks - mnt.f_bfree) * mnt.f_frsize;
    assert!(
        (4 * MIB..=8 * MIB).contains(&used),
        "mount shows {used} bytes used; kaiso stores 4 MiB"
    );
    assert!(
        mnt.f_files <= disk.f_files,
        "inodes counted once per tier: {} > {}",
        mnt.f_files,
        disk.f_files
    );
    m.unmount();
}

/// A copy_file_range(2) that does not fit on its destination's tier spills the destination
/// to a tier with room, as a write does, instead of failing with ENOSPC; the copy is
/// whole. Mount-only: a plain directory has no tiers (the case above covers the calls).
#[test]
fn copy_file_range_spills_from_a_full_tier() {
    fuse_or_skip!();
    use common::{Store, StoreSpec, TierSpec};
    const MIB: usize = 1 << 20;
    let store = Store::new(
        "cfr-spill",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast").capacity(8 * MIB as u64),
            TierSpec::new("slow").capacity(256 * MIB as u64),
        ])
        // No planned moves: only the spill may move a file.
        .extra("[store.mover]\nenabled = false"),
    );
    let data: Vec<u8> = (0..6 * MIB + 123).map(|i| (i * 31 % 253) as u8).collect();
    store.seed(0, "filler", &vec![1u8; 4 * MIB]);
    store.seed(1, "src", &data);
    let m = store.mount();
    let dst = open(&m.path.join("dst"), libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap();
    assert_eq!(
        store.tiers_holding("dst"),
        vec![0],
        "a new file should start on the fast tier (the copy must fill it)"
    );
    let src = open(&m.path.join("src"), libc::O_RDONLY, 0).unwrap();
    let mut copied = 0usize;
    for _ in 0..100 {
        if copied == data.len() {
            break;
        }
        let n = unsafe {
            libc::copy_file_range(
                src.0,
                std::ptr::null_mut(),
                dst.0,
                std::ptr::null_mut(),
                data.len() - copied,
                0,
            )
        };
        assert!(
            n > 0,
            "copy_file_range after {copied} of {} bytes: {} (expected the destination to \
             spill to the slow tier)",
            data.len(),
            if n < 0 {
                errno_name(common::errno())
            } else {
                "0 bytes".into()
            }
        );
        copied += n as usize;
    }
    assert_eq!(copied, data.len(), "bytes copied");
    drop((src, dst));
    assert!(
        fs::read(m.path.join("dst")).unwrap() == data,
        "the copy differs from the source"
    );
    assert_eq!(
        store.tiers_holding("dst"),
        vec![1],
        "the destination should have spilled to the slow tier"
    );
    assert_eq!(store.tiers_holding("filler"), vec![0], "the filler moved");
    m.unmount();
}

/// The cases. Each takes the tree under test and records what it observes.
mod cases {
    use super::*;

    pub fn create_and_open_flags(e: &mut Env, r: &mut Rec) {
        let f = e.p("f");
        let fd = open(&f, libc::O_CREAT | libc::O_WRONLY, 0o640).unwrap();
        r.want("create mode", kind_mode(&fstat(&fd)), "file 640");
        r.want("write", write(&fd, b"hello"), "5");
        drop(fd);
        r.want("content", content(&f), "\"hello\"");
        r.want(
            "O_CREAT|O_EXCL on existing",
            open_rc(&f, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644),
            "EEXIST",
        );
        r.want(
            "O_CREAT on existing keeps data",
            {
                let _fd = open(&f, libc::O_CREAT | libc::O_WRONLY, 0o600).unwrap();
                content(&f)
            },
            "\"hello\"",
        );
        r.want(
            "mode unchanged by O_CREAT of existing",
            lstat_desc(&f),
            "file 640 size=5 nlink=1",
        );
        let fd = open(&f, libc::O_WRONLY | libc::O_TRUNC, 0).unwrap();
        r.want("O_TRUNC size", fstat(&fd).st_size, 0);
        drop(fd);
        r.want(
            "open missing",
            open_rc(&e.p("missing"), libc::O_RDONLY, 0),
            "ENOENT",
        );
        r.want(
            "create in missing dir",
            open_rc(&e.p("nodir/f"), libc::O_CREAT | libc::O_WRONLY, 0o644),
            "ENOENT",
        );
        let long = "n".repeat(256);
        r.want(
            "name too long",
            open_rc(&e.p(&long), libc::O_CREAT | libc::O_WRONLY, 0o644),
            "ENAMETOOLONG",
        );
        let ok255 = "m".repeat(255);
        r.want(
            "255-byte name",
            open_rc(&e.p(&ok255), libc::O_CREAT | libc::O_WRONLY, 0o644),
            "OK",
        );
        std::os::unix::fs::symlink("dangling-target", e.p("dangling")).unwrap();
        r.want(
            "O_EXCL on dangling symlink",
            open_rc(
                &e.p("dangling"),
                libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
                0o644,
            ),
            "EEXIST",
        );
        r.want(
            "O_CREAT through dangling symlink creates target",
            open_rc(&e.p("dangling"), libc::O_CREAT | libc::O_WRONLY, 0o644),
            "OK",
        );
        r.want(
            "dangling target now exists",
            lstat_desc(&e.p("dangling-target")),
            "file 644 size=0 nlink=1",
        );
        r.want(
            "O_DIRECTORY on a file",
            open_rc(&f, libc::O_RDONLY | libc::O_DIRECTORY, 0),
            "ENOTDIR",
        );
        fs::create_dir(e.p("d")).unwrap();
        r.want(
            "open dir for writing",
            open_rc(&e.p("d"), libc::O_WRONLY, 0),
            "EISDIR",
        );
        r.want(
            "O_CREAT on existing dir",
            open_rc(&e.p("d"), libc::O_CREAT | libc::O_RDONLY, 0o644),
            "EISDIR",
        );
        r.want(
            "file as a directory component",
            open_rc(&e.p("f/x"), libc::O_CREAT | libc::O_WRONLY, 0o644),
            "ENOTDIR",
        );
        let fd = open(&f, libc::O_RDONLY, 0).unwrap();
        r.want("write to O_RDONLY fd", write(&fd, b"x"), "EBADF");
        let fd = open(&f, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600);
        r.want("O_EXCL again", fd.err().unwrap_or_default(), "EEXIST");
    }

    /// O_TMPFILE: an unnamed file, linked in later with linkat(AT_EMPTY_PATH) via /proc.
    pub fn o_tmpfile(e: &mut Env, r: &mut Rec) {
        fs::create_dir(e.p("d")).unwrap();
        let tmp = open(&e.p("d"), libc::O_TMPFILE | libc::O_RDWR, 0o600);
        r.want(
            "O_TMPFILE",
            tmp.as_ref()
                .map(|_| "OK".to_string())
                .unwrap_or_else(|e| e.clone()),
            "OK",
        );
        let Ok(fd) = tmp else { return };
        r.want("write", write(&fd, b"anon"), "4");
        r.want("invisible", fs::read_dir(e.p("d")).unwrap().count(), 0);
        let proc_path = CString::new(format!("/proc/self/fd/{}", fd.0)).unwrap();
        let ret = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                proc_path.as_ptr(),
                libc::AT_FDCWD,
                e.c("d/named").as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        r.want("link it in", rc(ret), "OK");
        r.want("named content", content(&e.p("d/named")), "\"anon\"");
    }

    pub fn mkdir_rmdir(e: &mut Env, r: &mut Rec) {
        let mk = |p: &Path, m: u32| rc(unsafe { libc::mkdir(cstr(p).as_ptr(), m) });
        r.want("mkdir", mk(&e.p("d"), 0o750), "OK");
        r.want("mode", kind_mode(&lstat(&e.p("d")).unwrap()), "dir 750");
        r.want("mkdir existing", mk(&e.p("d"), 0o755), "EEXIST");
        r.want("mkdir missing parent", mk(&e.p("x/y"), 0o755), "ENOENT");
        r.want("mkdir nested", mk(&e.p("d/s1"), 0o755), "OK");
        r.want("mkdir nested 2", mk(&e.p("d/s2"), 0o755), "OK");
        r.want(
            "dir nlink counts subdirs",
            lstat(&e.p("d")).unwrap().st_nlink,
            4,
        );
        write_file(&e.p("d/s1/f"), b"f");
        let rm = |p: &Path| rc(unsafe { libc::rmdir(cstr(p).as_ptr()) });
        r.want("rmdir non-empty", rm(&e.p("d/s1")), "ENOTEMPTY");
        r.want("rmdir a file", rm(&e.p("d/s1/f")), "ENOTDIR");
        r.want("rmdir missing", rm(&e.p("d/zz")), "ENOENT");
        r.want("rmdir empty", rm(&e.p("d/s2")), "OK");
        r.want("gone", lstat_desc(&e.p("d/s2")), "ENOENT");
        r.want("nlink after rmdir", lstat(&e.p("d")).unwrap().st_nlink, 3);
        r.want("rmdir .", rm(&e.p("d/.")), "EINVAL");
        fs::remove_file(e.p("d/s1/f")).unwrap();
        r.want("rmdir now empty", rm(&e.p("d/s1")), "OK");
        let mut names: Vec<String> = fs::read_dir(e.p("d"))
            .unwrap()
            .map(|x| x.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        r.want("listing", format!("{names:?}"), "[]");
    }

    pub fn unlink_and_open_unlinked(e: &mut Env, r: &mut Rec) {
        let ul = |p: &Path| rc(unsafe { libc::unlink(cstr(p).as_ptr()) });
        write_file(&e.p("f"), b"data");
        r.want("unlink", ul(&e.p("f")), "OK");
        r.want("unlink again", ul(&e.p("f")), "ENOENT");
        fs::create_dir(e.p("d")).unwrap();
        r.want("unlink a dir", ul(&e.p("d")), "EISDIR");
        // A file stays usable through its descriptor after its last name is gone.
        write_file(&e.p("g"), b"still here");
        let fd = open(&e.p("g"), libc::O_RDWR, 0).unwrap();
        r.want("unlink open file", ul(&e.p("g")), "OK");
        r.want("name gone", lstat_desc(&e.p("g")), "ENOENT");
        r.want(
            "read via fd",
            String::from_utf8_lossy(&pread(&fd, 100, 0).unwrap()),
            "still here",
        );
        r.want("write via fd", pwrite(&fd, b"!", 10), "1");
        r.want(
            "read again",
            String::from_utf8_lossy(&pread(&fd, 100, 0).unwrap()),
            "still here!",
        );
        r.want("fstat nlink", fstat(&fd).st_nlink, 0);
        r.want("fstat size", fstat(&fd).st_size, 11);
        // A new file may take the name while the old one is still open.
        write_file(&e.p("g"), b"new");
        r.want("new g", content(&e.p("g")), "\"new\"");
        r.want(
            "old fd unaffected",
            String::from_utf8_lossy(&pread(&fd, 100, 0).unwrap()),
            "still here!",
        );
        drop(fd);
        let listing: Vec<String> = {
            let mut v: Vec<String> = fs::read_dir(e.p(""))
                .unwrap()
                .map(|x| x.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        r.want("listing", format!("{listing:?}"), "[\"d\", \"g\"]");
    }

    fn rename(e: &Env, a: &str, b: &str) -> String {
        rc(unsafe { libc::rename(e.c(a).as_ptr(), e.c(b).as_ptr()) })
    }

    fn renameat2(e: &Env, a: &str, b: &str, flags: u32) -> String {
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                e.c(a).as_ptr(),
                libc::AT_FDCWD,
                e.c(b).as_ptr(),
                flags,
            )
        };
        rc(r as i32)
    }

    pub fn rename_basic(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("a"), b"A");
        write_file(&e.p("b"), b"B");
        r.want("rename", rename(e, "a", "c"), "OK");
        r.want("old gone", lstat_desc(&e.p("a")), "ENOENT");
        r.want("new there", content(&e.p("c")), "\"A\"");
        r.want("rename over file", rename(e, "c", "b"), "OK");
        r.want("replaced", content(&e.p("b")), "\"A\"");
        r.want("source gone", lstat_desc(&e.p("c")), "ENOENT");
        r.want("rename missing", rename(e, "nope", "x"), "ENOENT");
        r.want("rename to itself", rename(e, "b", "b"), "OK");
        fs::create_dir_all(e.p("d1/sub")).unwrap();
        fs::create_dir(e.p("d2")).unwrap();
        fs::create_dir(e.p("d3")).unwrap();
        write_file(&e.p("d3/x"), b"x");
        r.want("file over dir", rename(e, "b", "d2"), "EISDIR");
        r.want("dir over file", rename(e, "d2", "b"), "ENOTDIR");
        r.want("dir over non-empty dir", rename(e, "d2", "d3"), "ENOTEMPTY");
        r.want(
            "dir into own subdir",
            rename(e, "d1", "d1/sub/in"),
            "EINVAL",
        );
        r.want("dir over empty dir", rename(e, "d1", "d2"), "OK");
        r.want(
            "moved subtree",
            kind_mode(&lstat(&e.p("d2/sub")).unwrap()),
            "dir 755",
        );
        r.want("d1 gone", lstat_desc(&e.p("d1")), "ENOENT");
        r.want("file into dir", rename(e, "b", "d2/sub/b"), "OK");
        r.want("content after move", content(&e.p("d2/sub/b")), "\"A\"");
        r.want(
            "missing target dir",
            rename(e, "d2/sub/b", "zz/b"),
            "ENOENT",
        );
        r.want("rename dir with files", rename(e, "d3", "d4"), "OK");
        r.want("file in renamed dir", content(&e.p("d4/x")), "\"x\"");
        // An open file keeps working across a rename of its name.
        let fd = open(&e.p("d4/x"), libc::O_RDWR, 0).unwrap();
        r.want("rename open file", rename(e, "d4/x", "x2"), "OK");
        r.want("write after rename", pwrite(&fd, b"y", 1), "1");
        drop(fd);
        r.want("content via new name", content(&e.p("x2")), "\"xy\"");
    }

    pub fn rename_across_tiers(e: &mut Env, r: &mut Rec) {
        r.want("t0 over t1", rename(e, "a", "b"), "OK");
        r.want("b holds a's data", content(&e.p("b")), "\"on tier zero\"");
        r.want("a gone", lstat_desc(&e.p("a")), "ENOENT");
        r.want("t2 into dir", rename(e, "c", "d/c"), "OK");
        r.want("d/c", content(&e.p("d/c")), "\"on tier two\"");
        r.want("rename dir spanning tiers", rename(e, "d", "renamed"), "OK");
        for f in ["renamed/x", "renamed/y", "renamed/c", "renamed/sub/z"] {
            r.want(
                &format!("{f} readable"),
                content(&e.p(f)).starts_with('"'),
                true,
            );
        }
        r.want("old dir gone", lstat_desc(&e.p("d")), "ENOENT");
        r.want(
            "dir over non-empty dir on another tier",
            rename(e, "renamed", "e"),
            "ENOTEMPTY",
        );
        fs::remove_file(e.p("e/keep")).unwrap();
        r.want("dir over emptied dir", rename(e, "renamed", "e"), "OK");
        r.want("e/sub/z", content(&e.p("e/sub/z")), "\"z on t2\"");
        let mut names: Vec<String> = fs::read_dir(e.p("e"))
            .unwrap()
            .map(|x| x.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        r.want(
            "listing",
            format!("{names:?}"),
            "[\"c\", \"sub\", \"x\", \"y\"]",
        );
        // Create a new file (fastest tier) and rename it over one on the slowest tier.
        write_file(&e.p("fresh"), b"fresh");
        r.want("new over t2", rename(e, "fresh", "e/sub/z"), "OK");
        r.want("replaced", content(&e.p("e/sub/z")), "\"fresh\"");
        r.want("never EXDEV: back to root", rename(e, "e/sub/z", "z"), "OK");
    }

    pub fn renameat2_noreplace(e: &mut Env, r: &mut Rec) {
        let f = libc::RENAME_NOREPLACE;
        r.want(
            "noreplace onto existing",
            renameat2(e, "a", "b", f),
            "EEXIST",
        );
        r.want("a intact", content(&e.p("a")), "\"alpha\"");
        r.want("b intact", content(&e.p("b")), "\"beta\"");
        r.want("noreplace onto free name", renameat2(e, "a", "c", f), "OK");
        r.want("c", content(&e.p("c")), "\"alpha\"");
        r.want("a gone", lstat_desc(&e.p("a")), "ENOENT");
        fs::create_dir(e.p("d")).unwrap();
        r.want(
            "noreplace dir onto file",
            renameat2(e, "d", "b", f),
            "EEXIST",
        );
        r.want(
            "noreplace flags invalid",
            renameat2(e, "b", "q", 0x80),
            "EINVAL",
        );
    }

    pub fn renameat2_exchange(e: &mut Env, r: &mut Rec) {
        let x = libc::RENAME_EXCHANGE;
        r.want(
            "exchange files on t0 and t2",
            renameat2(e, "a", "b", x),
            "OK",
        );
        r.want("a now beta", content(&e.p("a")), "\"beta on t2\"");
        r.want("b now alpha", content(&e.p("b")), "\"alpha on t0\"");
        r.want("exchange file and dir", renameat2(e, "a", "dir", x), "OK");
        r.want(
            "a is a dir",
            kind_mode(&lstat(&e.p("a")).unwrap()),
            "dir 755",
        );
        r.want("a/inside", content(&e.p("a/inside")), "\"in dir on t1\"");
        r.want("dir is the file", content(&e.p("dir")), "\"beta on t2\"");
        r.want(
            "exchange with missing",
            renameat2(e, "b", "missing", x),
            "ENOENT",
        );
        r.want(
            "exchange|noreplace",
            renameat2(e, "b", "dir", x | libc::RENAME_NOREPLACE),
            "EINVAL",
        );
        r.want(
            "exchange across dirs",
            renameat2(e, "b", "a/inside", x),
            "OK",
        );
        r.want("b", content(&e.p("b")), "\"in dir on t1\"");
        r.want("a/inside", content(&e.p("a/inside")), "\"alpha on t0\"");
        r.want(
            "exchange dir into own child",
            renameat2(e, "a", "a/inside", x),
            "EINVAL",
        );
    }

    pub fn hard_links(e: &mut Env, r: &mut Rec) {
        let link =
            |a: &Path, b: &Path| rc(unsafe { libc::link(cstr(a).as_ptr(), cstr(b).as_ptr()) });
        write_file(&e.p("f"), b"one");
        r.want("link", link(&e.p("f"), &e.p("g")), "OK");
        let (sf, sg) = (lstat(&e.p("f")).unwrap(), lstat(&e.p("g")).unwrap());
        r.want("nlink f", sf.st_nlink, 2);
        r.want("nlink g", sg.st_nlink, 2);
        r.want("same inode", sf.st_ino == sg.st_ino, true);
        write_file(&e.p("g"), b"two");
        r.want("write via g visible via f", content(&e.p("f")), "\"two\"");
        r.want("link onto existing", link(&e.p("f"), &e.p("g")), "EEXIST");
        fs::create_dir(e.p("d")).unwrap();
        r.want("link a dir", link(&e.p("d"), &e.p("d2")), "EPERM");
        r.want("link missing", link(&e.p("nope"), &e.p("x")), "ENOENT");
        r.want("link into subdir", link(&e.p("f"), &e.p("dir/h")), "OK");
        r.want("nlink 3", lstat(&e.p("f")).unwrap().st_nlink, 3);
        fs::remove_file(e.p("f")).unwrap();
        r.want("nlink after unlink", lstat(&e.p("g")).unwrap().st_nlink, 2);
        r.want("rename a link", rename(e, "g", "g2"), "OK");
        r.want("still linked", lstat(&e.p("dir/h")).unwrap().st_nlink, 2);
        // A seeded file on tier one linked into a directory created on tier zero.
        r.want(
            "link across tiers",
            link(&e.p("t1file"), &e.p("dir/t1link")),
            "OK",
        );
        write_file(&e.p("dir/t1link"), b"changed via the link");
        r.want(
            "shared data",
            content(&e.p("t1file")),
            "\"changed via the link\"",
        );
        r.want(
            "same inode across dirs",
            lstat(&e.p("t1file")).unwrap().st_ino == lstat(&e.p("dir/t1link")).unwrap().st_ino,
            true,
        );
        // Links survive a remount with their count.
        e.remount();
        r.want(
            "nlink after remount",
            lstat(&e.p("t1file")).unwrap().st_nlink,
            2,
        );
        r.want(
            "same inode after remount",
            lstat(&e.p("t1file")).unwrap().st_ino == lstat(&e.p("dir/t1link")).unwrap().st_ino,
            true,
        );
        r.want(
            "g2 nlink after remount",
            lstat(&e.p("g2")).unwrap().st_nlink,
            2,
        );
    }

    pub fn symlinks(e: &mut Env, r: &mut Rec) {
        let sl = |t: &str, p: &Path| {
            rc(unsafe { libc::symlink(CString::new(t).unwrap().as_ptr(), cstr(p).as_ptr()) })
        };
        write_file(&e.p("target"), b"target data");
        r.want("symlink", sl("target", &e.p("l")), "OK");
        r.want(
            "lstat",
            kind_mode(&lstat(&e.p("l")).unwrap()),
            "symlink 777",
        );
        r.want(
            "lstat size is target length",
            lstat(&e.p("l")).unwrap().st_size,
            6,
        );
        r.want(
            "readlink",
            fs::read_link(e.p("l")).unwrap().display(),
            "target",
        );
        r.want(
            "stat follows",
            stat(&e.p("l")).map(|s| s.st_size).unwrap_or(-1),
            11,
        );
        r.want("read through", content(&e.p("l")), "\"target data\"");
        r.want("symlink onto existing", sl("x", &e.p("l")), "EEXIST");
        r.want("dangling", sl("missing", &e.p("dl")), "OK");
        r.want(
            "open dangling",
            open_rc(&e.p("dl"), libc::O_RDONLY, 0),
            "ENOENT",
        );
        r.want(
            "O_NOFOLLOW",
            open_rc(&e.p("l"), libc::O_RDONLY | libc::O_NOFOLLOW, 0),
            "ELOOP",
        );
        let mut buf = [0u8; 64];
        let n = unsafe { libc::readlink(e.c("target").as_ptr(), buf.as_mut_ptr().cast(), 64) };
        r.want("readlink on a file", rc(n as i32), "EINVAL");
        fs::create_dir(e.p("d")).unwrap();
        write_file(&e.p("d/in"), b"in");
        r.want("dir symlink", sl("d", &e.p("dl2")), "OK");
        r.want("traverse", content(&e.p("dl2/in")), "\"in\"");
        r.want(
            "absolute-looking target kept verbatim",
            sl("/nonexistent/abs", &e.p("abs")),
            "OK",
        );
        r.want(
            "readlink abs",
            fs::read_link(e.p("abs")).unwrap().display(),
            "/nonexistent/abs",
        );
        r.want("loop", sl("loop2", &e.p("loop1")), "OK");
        r.want("loop 2", sl("loop1", &e.p("loop2")), "OK");
        r.want(
            "open loop",
            open_rc(&e.p("loop1"), libc::O_RDONLY, 0),
            "ELOOP",
        );
        let long = "t".repeat(1000);
        r.want("long target", sl(&long, &e.p("longl")), "OK");
        r.want(
            "long readlink",
            fs::read_link(e.p("longl")).unwrap().as_os_str().len(),
            1000,
        );
        r.want(
            "unlink symlink keeps target",
            {
                fs::remove_file(e.p("l")).unwrap();
                content(&e.p("target"))
            },
            "\"target data\"",
        );
        e.remount();
        r.want(
            "symlink after remount",
            fs::read_link(e.p("dl2")).unwrap().display(),
            "d",
        );
    }

    use std::ffi::CString;

    pub fn mknod_and_fifo(e: &mut Env, r: &mut Rec) {
        r.want(
            "mkfifo",
            rc(unsafe { libc::mkfifo(e.c("fifo").as_ptr(), 0o640) }),
            "OK",
        );
        r.want(
            "fifo type",
            kind_mode(&lstat(&e.p("fifo")).unwrap()),
            "fifo 640",
        );
        let dev = libc::makedev(1, 3);
        r.want(
            "mknod chardev",
            rc(unsafe { libc::mknod(e.c("null").as_ptr(), libc::S_IFCHR | 0o600, dev) }),
            "OK",
        );
        let st = lstat(&e.p("null")).unwrap();
        r.want("chardev type", kind_mode(&st), "chardev 600");
        r.want(
            "rdev",
            format!("{}:{}", libc::major(st.st_rdev), libc::minor(st.st_rdev)),
            "1:3",
        );
        r.want(
            "mknod regular",
            rc(unsafe { libc::mknod(e.c("reg").as_ptr(), libc::S_IFREG | 0o644, 0) }),
            "OK",
        );
        r.want(
            "regular",
            lstat_desc(&e.p("reg")),
            "file 644 size=0 nlink=1",
        );
        r.want(
            "mknod existing",
            rc(unsafe { libc::mknod(e.c("reg").as_ptr(), libc::S_IFREG | 0o644, 0) }),
            "EEXIST",
        );
        // Data through the fifo (kernel pipe semantics on both).
        let rd = open(&e.p("fifo"), libc::O_RDONLY | libc::O_NONBLOCK, 0).unwrap();
        let wr = open(&e.p("fifo"), libc::O_WRONLY | libc::O_NONBLOCK, 0).unwrap();
        r.want("fifo write", write(&wr, b"through the pipe"), "16");
        let mut buf = [0u8; 64];
        let n = unsafe { libc::read(rd.0, buf.as_mut_ptr().cast(), 64) };
        r.want(
            "fifo read",
            String::from_utf8_lossy(&buf[..n.max(0) as usize]),
            "through the pipe",
        );
        r.want("fifo size", lstat(&e.p("fifo")).unwrap().st_size, 0);
        drop((rd, wr));
        r.want(
            "write to /dev/null node",
            open(&e.p("null"), libc::O_WRONLY, 0)
                .map(|f| write(&f, b"gone"))
                .unwrap_or_else(|e| e),
            "4",
        );
        e.remount();
        r.want(
            "fifo after remount",
            kind_mode(&lstat(&e.p("fifo")).unwrap()),
            "fifo 640",
        );
        let st = lstat(&e.p("null")).unwrap();
        r.want(
            "rdev after remount",
            format!("{}:{}", libc::major(st.st_rdev), libc::minor(st.st_rdev)),
            "1:3",
        );
    }

    fn setx(p: &Path, name: &str, v: &[u8], flags: i32) -> String {
        let n = CString::new(name).unwrap();
        rc(unsafe {
            libc::setxattr(
                cstr(p).as_ptr(),
                n.as_ptr(),
                v.as_ptr().cast(),
                v.len(),
                flags,
            )
        })
    }

    fn getx(p: &Path, name: &str, size: usize) -> String {
        let n = CString::new(name).unwrap();
        let mut buf = vec![0u8; size];
        let got =
            unsafe { libc::getxattr(cstr(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), size) };
        if got < 0 {
            errno_name(common::errno())
        } else if size == 0 {
            format!("size {got}")
        } else {
            String::from_utf8_lossy(&buf[..got as usize]).into_owned()
        }
    }

    fn listx(p: &Path) -> String {
        let mut buf = vec![0u8; 4096];
        let n = unsafe { libc::listxattr(cstr(p).as_ptr(), buf.as_mut_ptr().cast(), 4096) };
        if n < 0 {
            return errno_name(common::errno());
        }
        let mut names: Vec<String> = buf[..n as usize]
            .split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .filter(|s| s.starts_with("user.")) // security.* labels depend on the host
            .collect();
        names.sort();
        names.join(",")
    }

    pub fn xattrs(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("f"), b"x");
        let f = e.p("f");
        r.want("set", setx(&f, "user.color", b"blue", 0), "OK");
        r.want("get", getx(&f, "user.color", 64), "blue");
        r.want("size query", getx(&f, "user.color", 0), "size 4");
        r.want("small buffer", getx(&f, "user.color", 2), "ERANGE");
        r.want(
            "create existing",
            setx(&f, "user.color", b"red", libc::XATTR_CREATE),
            "EEXIST",
        );
        r.want(
            "replace missing",
            setx(&f, "user.shape", b"round", libc::XATTR_REPLACE),
            "ENODATA",
        );
        r.want(
            "replace",
            setx(&f, "user.color", b"green", libc::XATTR_REPLACE),
            "OK",
        );
        r.want("get replaced", getx(&f, "user.color", 64), "green");
        r.want("empty value", setx(&f, "user.empty", b"", 0), "OK");
        r.want("get empty", getx(&f, "user.empty", 0), "size 0");
        r.want(
            "binary value",
            setx(&f, "user.bin", &[0, 1, 2, 255], 0),
            "OK",
        );
        r.want("list", listx(&f), "user.bin,user.color,user.empty");
        r.want("missing", getx(&f, "user.none", 64), "ENODATA");
        let n = CString::new("user.empty").unwrap();
        r.want(
            "remove",
            rc(unsafe { libc::removexattr(cstr(&f).as_ptr(), n.as_ptr()) }),
            "OK",
        );
        r.want(
            "remove again",
            rc(unsafe { libc::removexattr(cstr(&f).as_ptr(), n.as_ptr()) }),
            "ENODATA",
        );
        r.want("list after remove", listx(&f), "user.bin,user.color");
        r.want(
            "unknown namespace",
            setx(&f, "bogus.name", b"v", 0),
            "EOPNOTSUPP",
        );
        let big = vec![b'v'; 4000];
        r.want("4000-byte value", setx(&f, "user.big", &big, 0), "OK");
        r.want("big size", getx(&f, "user.big", 0), "size 4000");
        fs::create_dir(e.p("d")).unwrap();
        r.want("on a dir", setx(&e.p("d"), "user.d", b"dir", 0), "OK");
        r.want("get on dir", getx(&e.p("d"), "user.d", 64), "dir");
        std::os::unix::fs::symlink("f", e.p("l")).unwrap();
        let n = CString::new("user.l").unwrap();
        r.want(
            "user xattr on a symlink itself",
            rc(unsafe {
                libc::lsetxattr(e.c("l").as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0)
            }),
            "EPERM",
        );
        r.want(
            "set on the slow-tier file",
            setx(&e.p("slow"), "user.t", b"t2", 0),
            "OK",
        );
        r.want(
            "rename keeps xattrs",
            {
                fs::rename(e.p("slow"), e.p("slow2")).unwrap();
                getx(&e.p("slow2"), "user.t", 64)
            },
            "t2",
        );
        e.remount();
        r.want("after remount", getx(&f, "user.color", 64), "green");
        r.want(
            "list after remount",
            listx(&f),
            "user.big,user.bin,user.color",
        );
        r.want("dir after remount", getx(&e.p("d"), "user.d", 64), "dir");
    }

    fn cmd_out(cmd: &str, args: &[&str], cwd: &Path) -> String {
        match std::process::Command::new(cmd)
            .args(args)
            .current_dir(cwd)
            .output()
        {
            Ok(o) => format!(
                "exit {} {}{}",
                o.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&o.stdout).trim(),
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(e) => format!("cannot run {cmd}: {e}"),
        }
    }

    pub fn posix_acls(e: &mut Env, r: &mut Rec) {
        let root = e.p("");
        write_file(&e.p("secret"), b"acl-readable");
        fs::set_permissions(e.p("secret"), fs::Permissions::from_mode(0o600)).unwrap();
        let p = e.p("secret");
        r.want(
            "nobody denied before ACL",
            as_nobody(move || open_rc(&p, libc::O_RDONLY, 0)),
            "EACCES",
        );
        r.want(
            "setfacl",
            cmd_out("setfacl", &["-m", "u:nobody:r", "secret"], &root),
            "exit 0 ",
        );
        r.want(
            "getfacl",
            cmd_out("getfacl", &["--omit-header", "--numeric", "secret"], &root).replace('\n', "|"),
            "exit 0 user::rw-|user:65534:r--|group::---|mask::r--|other::---",
        );
        r.want(
            "mode shows mask",
            kind_mode(&lstat(&e.p("secret")).unwrap()),
            "file 640",
        );
        r.want(
            "xattr present",
            getx(&e.p("secret"), "system.posix_acl_access", 0),
            "size 44",
        );
        let p = e.p("secret");
        r.want(
            "nobody reads via ACL",
            as_nobody(move || content(&p)),
            "\"acl-readable\"",
        );
        let p = e.p("secret");
        r.want(
            "nobody still cannot write",
            as_nobody(move || open_rc(&p, libc::O_WRONLY, 0)),
            "EACCES",
        );
        write_file(&e.p("public"), b"p");
        r.want(
            "setfacl on a second file",
            cmd_out("setfacl", &["-m", "u:nobody:rw", "public"], &root),
            "exit 0 ",
        );
        r.want(
            "chmod updates mask",
            {
                fs::set_permissions(e.p("secret"), fs::Permissions::from_mode(0o600)).unwrap();
                cmd_out("getfacl", &["--omit-header", "--numeric", "secret"], &root)
                    .replace('\n', "|")
            },
            "exit 0 user::rw-|user:65534:r--\t#effective:---|group::---|mask::---|other::---",
        );
        let p = e.p("secret");
        r.want(
            "mask denies nobody",
            as_nobody(move || open_rc(&p, libc::O_RDONLY, 0)),
            "EACCES",
        );
        r.want(
            "remove ACL",
            cmd_out("setfacl", &["-b", "secret"], &root),
            "exit 0 ",
        );
        r.want(
            "xattr gone",
            getx(&e.p("secret"), "system.posix_acl_access", 0),
            "ENODATA",
        );
        e.remount();
        r.want(
            "ACL after remount",
            cmd_out(
                "getfacl",
                &["--omit-header", "--numeric", "public"],
                &e.p(""),
            )
            .replace('\n', "|"),
            "exit 0 user::rw-|user:65534:rw-|group::r--|mask::rw-|other::r--",
        );
    }

    /// Default ACLs are inherited by new entries (and the umask is then not applied).
    pub fn default_acl_inheritance(e: &mut Env, r: &mut Rec) {
        let root = e.p("");
        fs::create_dir(e.p("shared")).unwrap();
        r.want(
            "setfacl -d",
            cmd_out("setfacl", &["-d", "-m", "u:nobody:rw", "shared"], &root),
            "exit 0 ",
        );
        write_file(&e.p("shared/new"), b"inherited");
        r.want(
            "inherited ACL",
            cmd_out(
                "getfacl",
                &["--omit-header", "--numeric", "shared/new"],
                &root,
            )
            .replace('\n', "|"),
            "exit 0 user::rw-|user:65534:rw-|group::r-x\t#effective:r--|mask::rw-|other::r--",
        );
        e.remount();
        r.want(
            "inherited ACL after remount",
            cmd_out(
                "getfacl",
                &["--omit-header", "--numeric", "shared/new"],
                &e.p(""),
            )
            .replace('\n', "|"),
            "exit 0 user::rw-|user:65534:rw-|group::r-x\t#effective:r--|mask::rw-|other::r--",
        );
    }

    /// A writer opens a file that readers hold open (on a mount with kernel passthrough
    /// the readers are served by passthrough, and the kernel refuses any other kind of
    /// open of that inode): the open succeeds and every descriptor sees the writes.
    pub fn writer_joins_open_readers(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("f"), b"0123456789");
        for name in ["f", "seeded"] {
            let reader = open(&e.p(name), libc::O_RDONLY, 0).unwrap();
            let before = pread(&reader, 64, 0).unwrap();
            let writer = open(&e.p(name), libc::O_WRONLY, 0);
            r.want(
                &format!("{name}: open for writing"),
                writer
                    .as_ref()
                    .map(|_| "OK".to_string())
                    .unwrap_or_else(|e| e.clone()),
                "OK",
            );
            let Ok(writer) = writer else { continue };
            r.want(&format!("{name}: pwrite"), pwrite(&writer, b"XY", 2), "2");
            r.want(
                &format!("{name}: append"),
                pwrite(&writer, b"!", before.len() as i64),
                "1",
            );
            let rw = open(&e.p(name), libc::O_RDWR, 0).unwrap();
            let mut want = before.clone();
            want[2..4].copy_from_slice(b"XY");
            want.push(b'!');
            let show = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
            let want = show(want);
            r.want(
                &format!("{name}: reader sees it"),
                show(pread(&reader, 64, 0).unwrap()),
                &want,
            );
            r.want(
                &format!("{name}: new reader sees it"),
                show(read_all(&e.p(name)).unwrap()),
                &want,
            );
            r.want(&format!("{name}: size"), fstat(&rw).st_size, want.len());
            drop((reader, writer, rw));
            r.want(
                &format!("{name}: after close"),
                content(&e.p(name)),
                format!("{want:?}"),
            );
        }
    }

    fn times(p: &Path) -> String {
        let st = lstat(p).unwrap();
        format!(
            "atime={}.{:09} mtime={}.{:09}",
            st.st_atime, st.st_atime_nsec, st.st_mtime, st.st_mtime_nsec
        )
    }

    pub fn chmod_chown_utimens(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("f"), b"f");
        let chmod = |p: &Path, m: u32| rc(unsafe { libc::chmod(cstr(p).as_ptr(), m) });
        let chown = |p: &Path, u: u32, g: u32| rc(unsafe { libc::chown(cstr(p).as_ptr(), u, g) });
        r.want("chmod", chmod(&e.p("f"), 0o4751), "OK");
        r.want("mode", kind_mode(&lstat(&e.p("f")).unwrap()), "file 4751");
        r.want("chmod all bits", chmod(&e.p("f"), 0o7777), "OK");
        r.want(
            "mode 7777",
            kind_mode(&lstat(&e.p("f")).unwrap()),
            "file 7777",
        );
        r.want("chown", chown(&e.p("f"), 65534, 65534), "OK");
        let st = lstat(&e.p("f")).unwrap();
        r.want(
            "owner",
            format!("{}:{}", st.st_uid, st.st_gid),
            "65534:65534",
        );
        // chown by root clears setuid/setgid on a regular file.
        r.want("suid cleared by chown", kind_mode(&st), "file 1777");
        r.want("chown -1 -1", chown(&e.p("f"), u32::MAX, u32::MAX), "OK");
        let st = lstat(&e.p("f")).unwrap();
        r.want(
            "owner unchanged",
            format!("{}:{}", st.st_uid, st.st_gid),
            "65534:65534",
        );
        r.want("chown group only", chown(&e.p("f"), u32::MAX, 0), "OK");
        let st = lstat(&e.p("f")).unwrap();
        r.want(
            "group changed",
            format!("{}:{}", st.st_uid, st.st_gid),
            "65534:0",
        );
        std::os::unix::fs::symlink("f", e.p("l")).unwrap();
        r.want(
            "lchown symlink",
            rc(unsafe { libc::lchown(e.c("l").as_ptr(), 65534, 65534) }),
            "OK",
        );
        let st = lstat(&e.p("l")).unwrap();
        r.want(
            "symlink owner",
            format!("{}:{}", st.st_uid, st.st_gid),
            "65534:65534",
        );
        r.want("chmod missing", chmod(&e.p("zz"), 0o644), "ENOENT");
        // utimensat with nanoseconds, UTIME_OMIT and UTIME_NOW.
        let ts = [
            libc::timespec {
                tv_sec: 1_000_000_000,
                tv_nsec: 123_456_789,
            },
            libc::timespec {
                tv_sec: 1_200_000_000,
                tv_nsec: 987_654_321,
            },
        ];
        let ut = |p: &Path, t: &[libc::timespec; 2], fl: i32| {
            rc(unsafe { libc::utimensat(libc::AT_FDCWD, cstr(p).as_ptr(), t.as_ptr(), fl) })
        };
        r.want("utimensat", ut(&e.p("f"), &ts, 0), "OK");
        r.want(
            "times",
            times(&e.p("f")),
            "atime=1000000000.123456789 mtime=1200000000.987654321",
        );
        let omit = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: 1_300_000_000,
                tv_nsec: 5,
            },
        ];
        r.want("utime omit atime", ut(&e.p("f"), &omit, 0), "OK");
        r.want(
            "times 2",
            times(&e.p("f")),
            "atime=1000000000.123456789 mtime=1300000000.000000005",
        );
        let before = lstat(&e.p("f")).unwrap().st_ctime;
        let now = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_NOW,
            },
        ];
        r.want("utime now", ut(&e.p("f"), &now, 0), "OK");
        let st = lstat(&e.p("f")).unwrap();
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        r.want("mtime is now", (st.st_mtime - wall).abs() <= 5, true);
        r.want("ctime moved", st.st_ctime >= before, true);
        r.want(
            "lutimes on symlink",
            ut(&e.p("l"), &ts, libc::AT_SYMLINK_NOFOLLOW),
            "OK",
        );
        r.want(
            "symlink times",
            times(&e.p("l")),
            "atime=1000000000.123456789 mtime=1200000000.987654321",
        );
        // Writing updates mtime.
        r.want("utime old", ut(&e.p("f"), &ts, 0), "OK");
        let fd = open(&e.p("f"), libc::O_WRONLY, 0).unwrap();
        pwrite(&fd, b"new", 0);
        drop(fd);
        r.want(
            "write moves mtime",
            lstat(&e.p("f")).unwrap().st_mtime > 1_200_000_000,
            true,
        );
        // A non-owner may not chmod or chown.
        write_file(&e.p("rootfile"), b"r");
        let p = e.p("rootfile");
        r.want(
            "nobody chmod root's file",
            as_nobody(move || rc(unsafe { libc::chmod(cstr(&p).as_ptr(), 0o777) })),
            "EPERM",
        );
        let p = e.p("f");
        r.want(
            "nobody chown own file to root",
            as_nobody(move || rc(unsafe { libc::chown(cstr(&p).as_ptr(), 0, 0) })),
            "EPERM",
        );
        e.remount();
        r.want(
            "times after remount",
            times(&e.p("l")),
            "atime=1000000000.123456789 mtime=1200000000.987654321",
        );
        let st = lstat(&e.p("f")).unwrap();
        r.want(
            "owner after remount",
            format!("{}:{} {}", st.st_uid, st.st_gid, kind_mode(&st)),
            "65534:0 file 1777",
        );
    }

    pub fn truncate(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("f"), b"0123456789");
        let tr = |p: &Path, n: i64| rc(unsafe { libc::truncate(cstr(p).as_ptr(), n) });
        r.want("shrink", tr(&e.p("f"), 4), "OK");
        r.want("after shrink", content(&e.p("f")), "\"0123\"");
        r.want("extend", tr(&e.p("f"), 8), "OK");
        r.want(
            "zero filled",
            format!("{:?}", read_all(&e.p("f")).unwrap()),
            "[48, 49, 50, 51, 0, 0, 0, 0]",
        );
        r.want("negative", tr(&e.p("f"), -1), "EINVAL");
        fs::create_dir(e.p("d")).unwrap();
        r.want("truncate dir", tr(&e.p("d"), 0), "EISDIR");
        r.want("truncate missing", tr(&e.p("zz"), 0), "ENOENT");
        let fd = open(&e.p("f"), libc::O_RDWR, 0).unwrap();
        r.want("ftruncate 0", rc(unsafe { libc::ftruncate(fd.0, 0) }), "OK");
        r.want("size 0", fstat(&fd).st_size, 0);
        r.want(
            "write after truncate at old offset",
            pwrite(&fd, b"Z", 5),
            "1",
        );
        r.want(
            "hole before",
            format!("{:?}", pread(&fd, 16, 0).unwrap()),
            "[0, 0, 0, 0, 0, 90]",
        );
        let ro = open(&e.p("f"), libc::O_RDONLY, 0).unwrap();
        r.want(
            "ftruncate read-only fd",
            rc(unsafe { libc::ftruncate(ro.0, 0) }),
            "EINVAL",
        );
        drop((fd, ro));
        r.want("slow-tier file shrink", tr(&e.p("slow"), 3), "OK");
        r.want("slow content", content(&e.p("slow")), "\"012\"");
        r.want("big sparse extend", tr(&e.p("slow"), 3 << 30), "OK");
        r.want("size", lstat(&e.p("slow")).unwrap().st_size, 3i64 << 30);
        r.want(
            "few blocks",
            lstat(&e.p("slow")).unwrap().st_blocks < 64,
            true,
        );
        e.remount();
        r.want(
            "after remount",
            lstat(&e.p("slow")).unwrap().st_size,
            3i64 << 30,
        );
        r.want(
            "prefix after remount",
            {
                let fd = open(&e.p("slow"), libc::O_RDONLY, 0).unwrap();
                format!("{:?}", pread(&fd, 4, 0).unwrap())
            },
            "[48, 49, 50, 0]",
        );
    }

    pub fn fallocate_and_punch_hole(e: &mut Env, r: &mut Rec) {
        const MIB: i64 = 1 << 20;
        let fd = open(&e.p("f"), libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
        let fa =
            |mode: i32, off: i64, len: i64| rc(unsafe { libc::fallocate(fd.0, mode, off, len) });
        r.want("fallocate 4 MiB", fa(0, 0, 4 * MIB), "OK");
        r.want("size", fstat(&fd).st_size, 4 * MIB);
        r.want("allocated", fstat(&fd).st_blocks * 512 >= 4 * MIB, true);
        r.want(
            "zeros",
            pread(&fd, 8, MIB).unwrap().iter().all(|b| *b == 0),
            true,
        );
        r.want(
            "keep size beyond EOF",
            fa(libc::FALLOC_FL_KEEP_SIZE, 4 * MIB, 4 * MIB),
            "OK",
        );
        r.want("size kept", fstat(&fd).st_size, 4 * MIB);
        let data = vec![0xabu8; 4 * MIB as usize];
        r.want("fill", pwrite(&fd, &data, 0), format!("{}", 4 * MIB));
        r.want("fsync", rc(unsafe { libc::fsync(fd.0) }), "OK");
        let blocks_before = fstat(&fd).st_blocks;
        r.want(
            "punch hole",
            fa(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                MIB,
                MIB,
            ),
            "OK",
        );
        r.want("size after punch", fstat(&fd).st_size, 4 * MIB);
        r.want(
            "hole reads zero",
            pread(&fd, MIB as usize, MIB)
                .unwrap()
                .iter()
                .all(|b| *b == 0),
            true,
        );
        r.want(
            "data before hole",
            format!("{:?}", pread(&fd, 4, MIB - 4).unwrap()),
            "[171, 171, 171, 171]",
        );
        r.want(
            "data after hole",
            format!("{:?}", pread(&fd, 2, 2 * MIB).unwrap()),
            "[171, 171]",
        );
        r.want("blocks freed", fstat(&fd).st_blocks < blocks_before, true);
        let hole = unsafe { libc::lseek(fd.0, 0, libc::SEEK_HOLE) };
        r.want("SEEK_HOLE finds the hole", hole, MIB);
        let data_at = unsafe { libc::lseek(fd.0, MIB, libc::SEEK_DATA) };
        r.want("SEEK_DATA after the hole", data_at, 2 * MIB);
        r.want(
            "punch without keep size",
            fa(libc::FALLOC_FL_PUNCH_HOLE, 0, 4096),
            "EOPNOTSUPP",
        );
        r.want(
            "zero range",
            fa(libc::FALLOC_FL_ZERO_RANGE, 3 * MIB, 4096),
            "OK",
        );
        r.want(
            "zeroed",
            format!("{:?}", pread(&fd, 2, 3 * MIB).unwrap()),
            "[0, 0]",
        );
        r.want("invalid length", fa(0, 0, 0), "EINVAL");
        let ro = open(&e.p("f"), libc::O_RDONLY, 0).unwrap();
        r.want(
            "fallocate on read-only fd",
            rc(unsafe { libc::fallocate(ro.0, 0, 0, 4096) }),
            "EBADF",
        );
        let blocks_before_remount = fstat(&fd).st_blocks;
        drop((fd, ro));
        e.remount();
        let fd = open(&e.p("f"), libc::O_RDONLY, 0).unwrap();
        r.want(
            "hole survives remount",
            pread(&fd, 16, MIB + 100).unwrap().iter().all(|b| *b == 0),
            true,
        );
        r.want(
            "data survives remount",
            format!("{:?}", pread(&fd, 2, 2 * MIB).unwrap()),
            "[171, 171]",
        );
        r.want(
            "allocation kept across remount",
            fstat(&fd).st_blocks == blocks_before_remount,
            true,
        );
    }

    pub fn fsync_family(e: &mut Env, r: &mut Rec) {
        let fd = open(&e.p("f"), libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
        r.want("write", pwrite(&fd, b"durable", 0), "7");
        r.want("fsync", rc(unsafe { libc::fsync(fd.0) }), "OK");
        r.want("fdatasync", rc(unsafe { libc::fdatasync(fd.0) }), "OK");
        r.want("syncfs", rc(unsafe { libc::syncfs(fd.0) }), "OK");
        r.want(
            "sync_file_range",
            rc(unsafe { libc::sync_file_range(fd.0, 0, 7, libc::SYNC_FILE_RANGE_WRITE) }),
            "OK",
        );
        let dfd = open(&e.p(""), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        r.want("fsync dir", rc(unsafe { libc::fsync(dfd.0) }), "OK");
        let ro = open(&e.p("f"), libc::O_RDONLY, 0).unwrap();
        r.want("fsync read-only fd", rc(unsafe { libc::fsync(ro.0) }), "OK");
        let sync = open(
            &e.p("s"),
            libc::O_CREAT | libc::O_WRONLY | libc::O_SYNC,
            0o644,
        )
        .unwrap();
        r.want("O_SYNC write", write(&sync, b"sync"), "4");
        let dsync = open(
            &e.p("ds"),
            libc::O_CREAT | libc::O_WRONLY | libc::O_DSYNC,
            0o644,
        )
        .unwrap();
        r.want("O_DSYNC write", write(&dsync, b"dsync"), "5");
        drop((fd, dfd, ro, sync, dsync));
        r.want("content", content(&e.p("f")), "\"durable\"");
    }

    pub fn o_append_shared(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("log"), b"start;");
        let a = open(&e.p("log"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        let b = open(&e.p("log"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        let plain = open(&e.p("log"), libc::O_WRONLY, 0).unwrap();
        for i in 0..20 {
            let fd = if i % 2 == 0 { &a } else { &b };
            write(fd, format!("{i};").as_bytes());
        }
        r.want(
            "appends interleave",
            content(&e.p("log")),
            "\"start;0;1;2;3;4;5;6;7;8;9;10;11;12;13;14;15;16;17;18;19;\"",
        );
        // pwrite on an O_APPEND fd appends on Linux (offset ignored).
        r.want("pwrite on O_APPEND", pwrite(&a, b"P", 0), "1");
        r.want("appended", content(&e.p("log")).ends_with("19;P\""), true);
        r.want("plain fd overwrites at 0", pwrite(&plain, b"S", 0), "1");
        r.want("head", content(&e.p("log")).starts_with("\"Start;"), true);
        r.want(
            "lseek end",
            unsafe { libc::lseek(a.0, 0, libc::SEEK_END) },
            57,
        );
        // Concurrent appenders from threads: no lost or torn records.
        drop((a, b, plain));
        let p = e.p("log2");
        write_file(&p, b"");
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let fd = open(&p, libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
                    for i in 0..200 {
                        let rec = format!("<{t}:{i:03}>");
                        assert_eq!(write(&fd, rec.as_bytes()), "7");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let text = String::from_utf8(read_all(&p).unwrap()).unwrap();
        let recs: Vec<&str> = text.split_inclusive('>').collect();
        r.want("records", recs.len(), 800);
        r.want(
            "all well formed",
            recs.iter().all(|s| s.len() == 7 && s.starts_with('<')),
            true,
        );
    }

    /// readdir while the directory changes: names present throughout are seen exactly once;
    /// no name is seen twice; a rewind sees the new state.
    pub fn readdir_while_changing(e: &mut Env, r: &mut Rec) {
        fs::create_dir(e.p("d")).unwrap();
        for i in 0..300 {
            write_file(&e.p(&format!("d/f{i:03}")), b"");
        }
        let dir = unsafe { libc::opendir(e.c("d").as_ptr()) };
        assert!(!dir.is_null());
        let mut seen: Vec<String> = Vec::new();
        let next = |seen: &mut Vec<String>| -> bool {
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                return false;
            }
            let name = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
            seen.push(name.to_string_lossy().into_owned());
            true
        };
        for _ in 0..50 {
            next(&mut seen);
        }
        // Change the tree mid-listing: delete the odd names, add 100 new ones, rename a few.
        for i in (1..300).step_by(2) {
            fs::remove_file(e.p(&format!("d/f{i:03}"))).unwrap();
        }
        for i in 0..100 {
            write_file(&e.p(&format!("d/n{i:03}")), b"");
        }
        while next(&mut seen) {}
        let mut sorted = seen.clone();
        sorted.sort();
        let before = sorted.len();
        sorted.dedup();
        r.want("no duplicates", before == sorted.len(), true);
        let stable: Vec<String> = (0..300).step_by(2).map(|i| format!("f{i:03}")).collect();
        r.want(
            "stable names all seen",
            stable.iter().all(|n| sorted.contains(n)),
            true,
        );
        r.want(
            "only real names",
            sorted
                .iter()
                .all(|n| n == "." || n == ".." || n.starts_with('f') || n.starts_with('n')),
            true,
        );
        unsafe { libc::rewinddir(dir) };
        let mut after = Vec::new();
        while next(&mut after) {}
        after.sort();
        r.want("after rewind", after.len(), 252);
        unsafe { libc::closedir(dir) };
        // Deleting every entry while iterating (the `rm -rf` pattern).
        let mut removed = 0;
        for round in 0..10 {
            let names: Vec<_> = fs::read_dir(e.p("d"))
                .unwrap()
                .map(|x| x.unwrap().path())
                .collect();
            if names.is_empty() {
                r.want("rm -rf rounds", round, 1);
                break;
            }
            for n in names {
                fs::remove_file(n).unwrap();
                removed += 1;
            }
        }
        r.want("removed", removed, 250);
        r.want("rmdir", rc(unsafe { libc::rmdir(e.c("d").as_ptr()) }), "OK");
    }

    pub fn mmap_read_write(e: &mut Env, r: &mut Rec) {
        let fd = open(&e.p("m"), libc::O_RDWR, 0).unwrap();
        let len = 8192usize;
        r.want(
            "extend",
            rc(unsafe { libc::ftruncate(fd.0, len as i64) }),
            "OK",
        );
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.0,
                0,
            )
        };
        r.want("mmap shared", p != libc::MAP_FAILED, true);
        let s = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len) };
        r.want("mapped read", String::from_utf8_lossy(&s[..7]), "seeded ");
        s[0..6].copy_from_slice(b"MAPPED");
        s[5000..5005].copy_from_slice(b"tail!");
        r.want(
            "msync",
            rc(unsafe { libc::msync(p, len, libc::MS_SYNC) }),
            "OK",
        );
        r.want(
            "pread sees mapped write",
            String::from_utf8_lossy(&pread(&fd, 6, 0).unwrap()),
            "MAPPED",
        );
        r.want("pwrite", pwrite(&fd, b"PW", 100), "2");
        r.want(
            "map sees pwrite",
            String::from_utf8_lossy(&s[100..102]),
            "PW",
        );
        unsafe { libc::munmap(p, len) };
        // A private mapping's writes are not written back.
        let q = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE,
                fd.0,
                0,
            )
        };
        r.want("mmap private", q != libc::MAP_FAILED, true);
        unsafe { *(q as *mut u8) = b'X' };
        unsafe { libc::munmap(q, len) };
        r.want(
            "private write invisible",
            String::from_utf8_lossy(&pread(&fd, 1, 0).unwrap()),
            "M",
        );
        drop(fd);
        // Read-only fd cannot be mapped shared+writable.
        let ro = open(&e.p("m"), libc::O_RDONLY, 0).unwrap();
        let w = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                ro.0,
                0,
            )
        };
        r.want(
            "shared writable map of O_RDONLY",
            if w == libc::MAP_FAILED {
                errno_name(common::errno())
            } else {
                "OK".into()
            },
            "EACCES",
        );
        drop(ro);
        e.remount();
        let d = read_all(&e.p("m")).unwrap();
        r.want(
            "after remount head",
            String::from_utf8_lossy(&d[..6]),
            "MAPPED",
        );
        r.want(
            "after remount tail",
            String::from_utf8_lossy(&d[5000..5005]),
            "tail!",
        );
    }

    pub fn flock_and_fcntl_locks(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("lk"), b"lock me");
        let a = open(&e.p("lk"), libc::O_RDWR, 0).unwrap();
        let b = open(&e.p("lk"), libc::O_RDWR, 0).unwrap();
        let fl = |fd: &Fd, op: i32| rc(unsafe { libc::flock(fd.0, op) });
        r.want("flock ex", fl(&a, libc::LOCK_EX), "OK");
        r.want(
            "flock conflict",
            fl(&b, libc::LOCK_EX | libc::LOCK_NB),
            "EAGAIN",
        );
        r.want(
            "shared conflict",
            fl(&b, libc::LOCK_SH | libc::LOCK_NB),
            "EAGAIN",
        );
        r.want("unlock", fl(&a, libc::LOCK_UN), "OK");
        r.want("now free", fl(&b, libc::LOCK_SH | libc::LOCK_NB), "OK");
        r.want("shared twice", fl(&a, libc::LOCK_SH | libc::LOCK_NB), "OK");
        fl(&a, libc::LOCK_UN);
        fl(&b, libc::LOCK_UN);
        // Open-file-description locks (per fd, so they conflict inside one process).
        let ofd = |fd: &Fd, cmd: i32, ty: i32, start: i64, len: i64| {
            let mut l: libc::flock = unsafe { std::mem::zeroed() };
            l.l_type = ty as i16;
            l.l_whence = libc::SEEK_SET as i16;
            l.l_start = start;
            l.l_len = len;
            let ret = unsafe { libc::fcntl(fd.0, cmd, &mut l) };
            (rc(ret), l)
        };
        r.want(
            "ofd write lock 0..10",
            ofd(&a, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 10).0,
            "OK",
        );
        r.want(
            "ofd conflict",
            ofd(&b, libc::F_OFD_SETLK, libc::F_RDLCK, 5, 10).0,
            "EAGAIN",
        );
        r.want(
            "ofd disjoint",
            ofd(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 10, 10).0,
            "OK",
        );
        let (g, l) = ofd(&b, libc::F_OFD_GETLK, libc::F_WRLCK, 0, 5);
        r.want(
            "ofd getlk",
            format!("{g} type={} start={} len={}", l.l_type, l.l_start, l.l_len),
            format!("OK type={} start=0 len=10", libc::F_WRLCK),
        );
        r.want(
            "ofd unlock",
            ofd(&a, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 10).0,
            "OK",
        );
        r.want(
            "ofd after unlock",
            ofd(&b, libc::F_OFD_SETLK, libc::F_WRLCK, 0, 10).0,
            "OK",
        );
        ofd(&b, libc::F_OFD_SETLK, libc::F_UNLCK, 0, 0);
        // Classic POSIX record locks between two processes.
        let posix = |fd: i32, cmd: i32, ty: i32| {
            let mut l: libc::flock = unsafe { std::mem::zeroed() };
            l.l_type = ty as i16;
            l.l_whence = libc::SEEK_SET as i16;
            l.l_len = 0;
            unsafe { libc::fcntl(fd, cmd, &mut l) }
        };
        r.want(
            "posix write lock",
            rc(posix(a.0, libc::F_SETLK, libc::F_WRLCK)),
            "OK",
        );
        let path = e.c("lk");
        let child_errno = unsafe {
            let pid = libc::fork();
            if pid == 0 {
                // Only async-signal-safe calls in the child.
                let fd = libc::open(path.as_ptr(), libc::O_RDWR);
                let mut l: libc::flock = std::mem::zeroed();
                l.l_type = libc::F_RDLCK as i16;
                l.l_whence = libc::SEEK_SET as i16;
                let ret = libc::fcntl(fd, libc::F_SETLK, &mut l);
                let code = if ret < 0 {
                    *libc::__errno_location()
                } else {
                    0
                };
                libc::_exit(code);
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            libc::WEXITSTATUS(status)
        };
        r.want("other process conflicts", errno_name(child_errno), "EAGAIN");
        let mut l: libc::flock = unsafe { std::mem::zeroed() };
        l.l_type = libc::F_WRLCK as i16;
        l.l_whence = libc::SEEK_SET as i16;
        r.want(
            "own getlk sees no conflict",
            {
                unsafe { libc::fcntl(b.0, libc::F_GETLK, &mut l) };
                l.l_type
            },
            libc::F_UNLCK as i16,
        );
        r.want(
            "posix unlock",
            rc(posix(a.0, libc::F_SETLK, libc::F_UNLCK)),
            "OK",
        );
        let child_errno = unsafe {
            let pid = libc::fork();
            if pid == 0 {
                let fd = libc::open(path.as_ptr(), libc::O_RDWR);
                let mut l: libc::flock = std::mem::zeroed();
                l.l_type = libc::F_WRLCK as i16;
                l.l_whence = libc::SEEK_SET as i16;
                let ret = libc::fcntl(fd, libc::F_SETLK, &mut l);
                let code = if ret < 0 {
                    *libc::__errno_location()
                } else {
                    0
                };
                libc::_exit(code);
            }
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            libc::WEXITSTATUS(status)
        };
        r.want("free after unlock", errno_name(child_errno), "OK");
    }

    pub fn stable_inodes_across_remount(e: &mut Env, r: &mut Rec) {
        write_file(&e.p("new"), b"n");
        fs::create_dir(e.p("newdir")).unwrap();
        std::os::unix::fs::symlink("a", e.p("sym")).unwrap();
        fs::hard_link(e.p("a"), e.p("alink")).unwrap();
        let names = [
            "a", "d", "d/b", "d/e", "d/e/c", "new", "newdir", "sym", "alink",
        ];
        let before: Vec<u64> = names
            .iter()
            .map(|n| lstat(&e.p(n)).unwrap().st_ino)
            .collect();
        let mut uniq = before.clone();
        uniq.sort();
        uniq.dedup();
        r.want(
            "distinct inodes (a and alink share)",
            uniq.len(),
            names.len() - 1,
        );
        e.remount();
        let after: Vec<u64> = names
            .iter()
            .map(|n| lstat(&e.p(n)).unwrap().st_ino)
            .collect();
        for (i, n) in names.iter().enumerate() {
            r.want(&format!("ino of {n} stable"), before[i] == after[i], true);
        }
        // A rename keeps the inode number too, also across a remount.
        fs::rename(e.p("d/e/c"), e.p("moved")).unwrap();
        r.want(
            "rename keeps ino",
            lstat(&e.p("moved")).unwrap().st_ino == before[4],
            true,
        );
        e.remount();
        r.want(
            "rename keeps ino after remount",
            lstat(&e.p("moved")).unwrap().st_ino == before[4],
            true,
        );
        let fd = open(&e.p("moved"), libc::O_RDONLY, 0).unwrap();
        r.want(
            "fstat ino matches stat",
            fstat(&fd).st_ino == before[4],
            true,
        );
        let readdir_ino = fs::read_dir(e.p(""))
            .unwrap()
            .map(|x| x.unwrap())
            .find(|x| x.file_name() == "moved")
            .map(|x| std::os::unix::fs::DirEntryExt::ino(&x));
        r.want(
            "readdir d_ino matches",
            readdir_ino == Some(before[4]),
            true,
        );
    }

    pub fn permissions_as_nobody(e: &mut Env, r: &mut Rec) {
        let mode =
            |p: &Path, m: u32| fs::set_permissions(p, fs::Permissions::from_mode(m)).unwrap();
        write_file(&e.p("private"), b"secret");
        mode(&e.p("private"), 0o600);
        write_file(&e.p("public"), b"public");
        mode(&e.p("public"), 0o644);
        fs::create_dir(e.p("rootdir")).unwrap();
        fs::create_dir(e.p("sticky")).unwrap();
        mode(&e.p("sticky"), 0o1777);
        write_file(&e.p("sticky/rootowned"), b"r");
        mode(&e.p("sticky/rootowned"), 0o666);
        fs::create_dir(e.p("locked")).unwrap();
        write_file(&e.p("locked/inner"), b"i");
        mode(&e.p("locked"), 0o700);
        let root = e.p("");
        let got = as_nobody(move || {
            let p = |s: &str| root.join(s);
            let acc = |s: &str, m: i32| rc(unsafe { libc::access(cstr(&p(s)).as_ptr(), m) });
            vec![
                ("read private", open_rc(&p("private"), libc::O_RDONLY, 0)),
                ("read public", content(&p("public"))),
                ("write public", open_rc(&p("public"), libc::O_WRONLY, 0)),
                ("access W_OK public", acc("public", libc::W_OK)),
                ("access R_OK public", acc("public", libc::R_OK)),
                ("access X_OK public", acc("public", libc::X_OK)),
                (
                    "create in root-owned dir",
                    open_rc(&p("rootdir/x"), libc::O_CREAT | libc::O_WRONLY, 0o644),
                ),
                (
                    "mkdir in root-owned dir",
                    rc(unsafe { libc::mkdir(cstr(&p("rootdir/d")).as_ptr(), 0o755) }),
                ),
                (
                    "unlink in root-owned dir",
                    rc(unsafe { libc::unlink(cstr(&p("public")).as_ptr()) }),
                ),
                (
                    "rename in root-owned dir",
                    rc(unsafe {
                        libc::rename(cstr(&p("public")).as_ptr(), cstr(&p("p2")).as_ptr())
                    }),
                ),
                (
                    "traverse 0700 dir",
                    open_rc(&p("locked/inner"), libc::O_RDONLY, 0),
                ),
                (
                    "list 0700 dir",
                    fs::read_dir(p("locked"))
                        .map(|_| "OK".to_string())
                        .unwrap_or_else(|e| errno_name(e.raw_os_error().unwrap_or(0))),
                ),
                (
                    "create in sticky dir",
                    open_rc(&p("sticky/mine"), libc::O_CREAT | libc::O_WRONLY, 0o600),
                ),
                (
                    "own file owner",
                    common::lstat(&p("sticky/mine"))
                        .map(|s| format!("{}:{}", s.st_uid, s.st_gid))
                        .unwrap_or_else(|e| e),
                ),
                (
                    "unlink root's file in sticky dir",
                    rc(unsafe { libc::unlink(cstr(&p("sticky/rootowned")).as_ptr()) }),
                ),
                (
                    "write root's 0666 file",
                    open_rc(&p("sticky/rootowned"), libc::O_WRONLY, 0),
                ),
                (
                    "chmod own file",
                    rc(unsafe { libc::chmod(cstr(&p("sticky/mine")).as_ptr(), 0o640) }),
                ),
                (
                    "utimes on root's file",
                    rc(unsafe {
                        libc::utimensat(
                            libc::AT_FDCWD,
                            cstr(&p("public")).as_ptr(),
                            std::ptr::null(),
                            0,
                        )
                    }),
                ),
                (
                    "truncate root's file",
                    rc(unsafe { libc::truncate(cstr(&p("public")).as_ptr(), 0) }),
                ),
                ("setxattr on root's file", {
                    let n = CString::new("user.x").unwrap();
                    rc(unsafe {
                        libc::setxattr(
                            cstr(&p("public")).as_ptr(),
                            n.as_ptr(),
                            b"v".as_ptr().cast(),
                            1,
                            0,
                        )
                    })
                }),
                (
                    "unlink own file",
                    rc(unsafe { libc::unlink(cstr(&p("sticky/mine")).as_ptr()) }),
                ),
            ]
        });
        let expect = [
            "EACCES",
            "\"public\"",
            "EACCES",
            "EACCES",
            "OK",
            "EACCES",
            "EACCES",
            "EACCES",
            "EACCES",
            "EACCES",
            "EACCES",
            "EACCES",
            "OK",
            "65534:65534",
            "EPERM",
            "OK",
            "OK",
            "EACCES",
            "EACCES",
            "EACCES",
            "OK",
        ];
        for ((label, v), want) in got.into_iter().zip(expect) {
            r.want(label, v, want);
        }
        r.want(
            "root still reads private",
            content(&e.p("private")),
            "\"secret\"",
        );
        // setgid directory: new entries take the directory's group.
        fs::create_dir(e.p("sgid")).unwrap();
        unsafe { libc::chown(e.c("sgid").as_ptr(), 0, 65534) };
        mode(&e.p("sgid"), 0o2777);
        let p = e.p("sgid/file");
        let gid = as_nobody(move || {
            write_file(&p, b"g");
            common::lstat(&p).map(|s| s.st_gid).unwrap_or(0)
        });
        r.want("setgid dir group inheritance", gid, 65534);
    }

    /// copy_file_range(2) with explicit offsets; "n" or the errno name.
    fn cfr(fin: &Fd, off_in: i64, fout: &Fd, off_out: i64, len: usize) -> String {
        let (mut i, mut o) = (off_in, off_out);
        let n = unsafe { libc::copy_file_range(fin.0, &mut i, fout.0, &mut o, len, 0) };
        if n < 0 {
            errno_name(common::errno())
        } else {
            format!("{n}")
        }
    }

    /// copy_file_range(2) at the descriptors' file positions.
    fn cfr_pos(fin: &Fd, fout: &Fd, len: usize) -> String {
        let n = unsafe {
            libc::copy_file_range(
                fin.0,
                std::ptr::null_mut(),
                fout.0,
                std::ptr::null_mut(),
                len,
                0,
            )
        };
        if n < 0 {
            errno_name(common::errno())
        } else {
            format!("{n}")
        }
    }

    fn mtime(p: &Path) -> (i64, i64) {
        let st = stat(p).unwrap();
        (st.st_mtime, st.st_mtime_nsec)
    }

    /// Sets a file's atime and mtime to `secs` (seconds since the epoch).
    fn set_times(p: &Path, secs: i64) {
        let t = [libc::timespec {
            tv_sec: secs,
            tv_nsec: 0,
        }; 2];
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, cstr(p).as_ptr(), t.as_ptr(), 0) };
        assert_eq!(r, 0, "utimensat {}", p.display());
    }

    /// copy_file_range(2): between tiers, within one file, at and past the ends, at the
    /// file positions, the modes it refuses, a copy of several MiB, and the times it sets.
    pub fn copy_file_range(e: &mut Env, r: &mut Rec) {
        let src = open(&e.p("src"), libc::O_RDONLY, 0).unwrap();
        let far = open(&e.p("far"), libc::O_RDWR, 0).unwrap();
        // Into a file on another tier, inside its size.
        set_times(&e.p("far"), 1_000_000_000);
        let ctime0 = stat(&e.p("far")).unwrap().st_ctime;
        r.want("into another tier", cfr(&src, 4, &far, 2, 10), "10");
        r.want(
            "far content",
            content(&e.p("far")),
            "\"ZY456789abcdNMLKJIHGFEDCBA\"",
        );
        r.want("far size", fstat(&far).st_size, 26);
        r.want("mtime moved", mtime(&e.p("far")).0 > 1_000_000_000, true);
        r.want(
            "ctime not older",
            stat(&e.p("far")).unwrap().st_ctime >= ctime0,
            true,
        );
        r.want(
            "source unchanged",
            content(&e.p("src")),
            "\"0123456789abcdefghijklmnopqrstuvwxyz\"",
        );
        // Length past the source's end: cut there; at and past the end: nothing.
        r.want("cut at source end", cfr(&src, 30, &far, 0, 100), "6");
        r.want(
            "far after cut",
            content(&e.p("far")),
            "\"uvwxyz89abcdNMLKJIHGFEDCBA\"",
        );
        r.want("at source end", cfr(&src, 36, &far, 0, 10), "0");
        r.want("past source end", cfr(&src, 1000, &far, 0, 10), "0");
        r.want("length 0", cfr(&src, 0, &far, 0, 0), "0");
        r.want("far size unchanged", fstat(&far).st_size, 26);
        // Past the destination's end: extends it, with a hole between.
        r.want("past dest end", cfr(&src, 0, &far, 40, 4), "4");
        r.want("extended size", fstat(&far).st_size, 44);
        r.want(
            "hole then copy",
            format!("{:?}", pread(&far, 20, 24).unwrap()),
            "[66, 65, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 48, 49, 50, 51]",
        );
        // Within one file: overlapping ranges are refused, disjoint ones copy.
        let mid = open(&e.p("mid"), libc::O_RDWR, 0).unwrap();
        r.want("overlap forward", cfr(&mid, 0, &mid, 4, 8), "EINVAL");
        r.want("overlap backward", cfr(&mid, 4, &mid, 0, 8), "EINVAL");
        r.want("same range", cfr(&mid, 2, &mid, 2, 4), "EINVAL");
        r.want(
            "mid unchanged",
            content(&e.p("mid")),
            "\"on the middle tier\"",
        );
        r.want("disjoint in one file", cfr(&mid, 0, &mid, 7, 6), "6");
        r.want(
            "mid content",
            content(&e.p("mid")),
            "\"on the on the tier\"",
        );
        r.want("one file past its end", cfr(&mid, 0, &mid, 20, 6), "6");
        r.want("mid size", fstat(&mid).st_size, 26);
        r.want(
            "mid tail",
            format!("{:?}", pread(&mid, 8, 18).unwrap()),
            "[0, 0, 111, 110, 32, 116, 104, 101]",
        );
        // At the file positions, which move by the bytes copied.
        let out = open(&e.p("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).unwrap();
        r.want(
            "seek source",
            unsafe { libc::lseek(src.0, 10, libc::SEEK_SET) },
            10,
        );
        r.want("at positions", cfr_pos(&src, &out, 5), "5");
        r.want("again", cfr_pos(&src, &out, 3), "3");
        r.want(
            "source position",
            unsafe { libc::lseek(src.0, 0, libc::SEEK_CUR) },
            18,
        );
        r.want(
            "dest position",
            unsafe { libc::lseek(out.0, 0, libc::SEEK_CUR) },
            8,
        );
        r.want("new content", content(&e.p("new")), "\"abcdefgh\"");
        // Modes the call refuses.
        let app = open(&e.p("new"), libc::O_WRONLY | libc::O_APPEND, 0).unwrap();
        r.want("append dest", cfr(&src, 0, &app, 0, 4), "EBADF");
        let ro = open(&e.p("far"), libc::O_RDONLY, 0).unwrap();
        r.want("read-only dest", cfr(&src, 0, &ro, 0, 4), "EBADF");
        r.want("write-only source", cfr(&out, 0, &far, 0, 4), "EBADF");
        fs::create_dir(e.p("d")).unwrap();
        let dir = open(&e.p("d"), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        r.want("directory source", cfr(&dir, 0, &far, 0, 4), "EISDIR");
        drop((app, ro, dir, out, mid));
        // Several MiB at unaligned offsets, into a file of another tier.
        let data: Vec<u8> = (0..(5u32 << 20) + 333)
            .map(|i| (i * 13 % 251) as u8)
            .collect();
        write_file(&e.p("big"), &data);
        let big = open(&e.p("big"), libc::O_RDONLY, 0).unwrap();
        let mut copied = 0usize;
        let mut rounds = 0;
        while copied < data.len() - 777 && rounds < 100 {
            let n: i64 = cfr(
                &big,
                777 + copied as i64,
                &far,
                4099 + copied as i64,
                data.len(),
            )
            .parse()
            .unwrap_or(-1);
            if n <= 0 {
                break;
            }
            copied += n as usize;
            rounds += 1;
        }
        r.want("big copied", copied, data.len() - 777);
        r.want(
            "far big size",
            fstat(&far).st_size,
            (4099 + data.len() - 777) as i64,
        );
        r.want(
            "big bytes",
            pread(&far, data.len(), 4099).unwrap() == data[777..],
            true,
        );
        drop((big, far, src));
        e.remount();
        r.want(
            "after remount",
            {
                let fd = open(&e.p("far"), libc::O_RDONLY, 0).unwrap();
                pread(&fd, data.len(), 4099).unwrap() == data[777..]
            },
            true,
        );
        r.want(
            "mid after remount",
            read_all(&e.p("mid")).unwrap() == b"on the on the tier\0\0on the",
            true,
        );
    }

    pub fn large_offsets(e: &mut Env, r: &mut Rec) {
        let fd = open(&e.p("big"), libc::O_CREAT | libc::O_RDWR, 0o644).unwrap();
        let off = 5i64 << 30;
        r.want("pwrite at 5 GiB", pwrite(&fd, b"far away", off), "8");
        r.want("size", fstat(&fd).st_size, off + 8);
        r.want(
            "pread far",
            String::from_utf8_lossy(&pread(&fd, 8, off).unwrap()),
            "far away",
        );
        r.want(
            "hole zero",
            format!("{:?}", pread(&fd, 4, 1 << 32).unwrap()),
            "[0, 0, 0, 0]",
        );
        r.want("read past EOF", pread(&fd, 8, off + 100).unwrap().len(), 0);
        r.want(
            "lseek end",
            unsafe { libc::lseek(fd.0, 0, libc::SEEK_END) },
            off + 8,
        );
        // Writes spanning many pages at an unaligned offset.
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        r.want("unaligned big write", pwrite(&fd, &data, 4093), "300000");
        let back = pread(&fd, 300_000, 4093).unwrap();
        r.want("read back", back == data, true);
        drop(fd);
        e.remount();
        let fd = open(&e.p("big"), libc::O_RDONLY, 0).unwrap();
        r.want(
            "after remount",
            pread(&fd, 300_000, 4093).unwrap() == data,
            true,
        );
        r.want(
            "far after remount",
            String::from_utf8_lossy(&pread(&fd, 8, off).unwrap()),
            "far away",
        );
    }

    /// Directory descriptor `dir`'s entry `name` opened with `flags` (`*at` call).
    fn open_at(dir: &Fd, name: &str, flags: i32, mode: u32) -> Result<Fd, String> {
        let c = CString::new(name).unwrap();
        let fd = unsafe { libc::openat(dir.0, c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
        if fd < 0 {
            Err(errno_name(common::errno()))
        } else {
            Ok(Fd(fd))
        }
    }

    fn fstat_at(dir: &Fd, name: &str) -> Result<libc::stat, String> {
        let c = CString::new(name).unwrap();
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstatat(dir.0, c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } < 0 {
            Err(errno_name(common::errno()))
        } else {
            Ok(st)
        }
    }

    /// The contents of `dir`'s entry `name`, or the errno of the open.
    fn read_at(dir: &Fd, name: &str) -> String {
        match open_at(dir, name, libc::O_RDONLY, 0) {
            Ok(fd) => {
                let st = fstat(&fd);
                match pread(&fd, st.st_size as usize, 0) {
                    Ok(b) => format!("{:?}", String::from_utf8_lossy(&b)),
                    Err(e) => e,
                }
            }
            Err(e) => e,
        }
    }

    /// Names in directory `dir`, sorted, long ones shortened to "first letter x length".
    /// Read from a new open of the directory: what a stream opened before a change shows
    /// of it is unspecified (POSIX readdir).
    fn list_at(dir: &Fd) -> String {
        let fd = match open_at(dir, ".", libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(fd) => fd,
            Err(e) => return e,
        };
        let d = unsafe { libc::fdopendir(fd.0) };
        if d.is_null() {
            return errno_name(common::errno());
        }
        // The stream owns the descriptor now.
        std::mem::forget(fd);
        let mut names = Vec::new();
        loop {
            let ent = unsafe { libc::readdir(d) };
            if ent.is_null() {
                break;
            }
            let n = unsafe { std::ffi::CStr::from_ptr((*ent).d_name.as_ptr()) };
            let n = n.to_string_lossy().into_owned();
            if n == "." || n == ".." {
                continue;
            }
            names.push(if n.len() > 20 {
                format!("{}x{}", &n[..1], n.len())
            } else {
                n
            });
        }
        unsafe { libc::closedir(d) };
        names.sort();
        names.join(",")
    }

    /// Name of level `i` of the deep tree: 200 bytes of one letter.
    fn level_name(i: usize) -> String {
        std::iter::repeat_n((b'a' + (i % 26) as u8) as char, 200).collect()
    }

    /// A tree deeper than PATH_MAX (30 levels of 200-byte names, ~6 KB), built and used
    /// only through `*at` calls from directory descriptors: a file system accepts it,
    /// and so must the mount (its backing paths are longer than any path argument).
    pub fn deep_tree(e: &mut Env, r: &mut Rec) {
        const DEPTH: usize = 30;
        let at = |dir: &Fd, name: &str| CString::new(name).map(|c| (dir.0, c)).unwrap();
        let root = open(&e.p(""), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        let mut dirs = vec![root];
        let mut made = 0;
        for i in 0..DEPTH {
            let (fd, c) = at(&dirs[i], &level_name(i));
            if rc(unsafe { libc::mkdirat(fd, c.as_ptr(), 0o755) }) != "OK" {
                break;
            }
            match open_at(
                &dirs[i],
                &level_name(i),
                libc::O_RDONLY | libc::O_DIRECTORY,
                0,
            ) {
                Ok(d) => dirs.push(d),
                Err(_) => break,
            }
            made += 1;
        }
        r.want("levels made", made, DEPTH);
        if made < DEPTH {
            return;
        }
        let deep = &dirs[DEPTH];
        // A leaf written and read back.
        let leaf = open_at(
            deep,
            "leaf",
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            0o644,
        );
        r.want(
            "create leaf",
            leaf.as_ref()
                .map(|_| "OK".to_string())
                .unwrap_or_else(|e| e.clone()),
            "OK",
        );
        if let Ok(fd) = &leaf {
            r.want("write leaf", write(fd, b"deep data"), "9");
        }
        drop(leaf);
        r.want("read leaf", read_at(deep, "leaf"), "\"deep data\"");
        r.want(
            "leaf size",
            fstat_at(deep, "leaf").map(|s| s.st_size).unwrap_or(-1),
            9,
        );
        // Renamed across levels, both ends deep (levels 30 -> 15 -> 29).
        let ren = |a: &Fd, an: &str, b: &Fd, bn: &str| {
            let (ac, bc) = (CString::new(an).unwrap(), CString::new(bn).unwrap());
            rc(unsafe { libc::renameat(a.0, ac.as_ptr(), b.0, bc.as_ptr()) })
        };
        r.want("rename up", ren(deep, "leaf", &dirs[15], "moved"), "OK");
        r.want(
            "old name gone",
            fstat_at(deep, "leaf")
                .map(|_| "OK".to_string())
                .unwrap_or_else(|e| e),
            "ENOENT",
        );
        r.want("read moved", read_at(&dirs[15], "moved"), "\"deep data\"");
        r.want(
            "rename down",
            ren(&dirs[15], "moved", &dirs[29], "leaf2"),
            "OK",
        );
        r.want("read leaf2", read_at(&dirs[29], "leaf2"), "\"deep data\"");
        // A hard link at another level.
        let (c_from, c_to) = (
            CString::new("leaf2").unwrap(),
            CString::new("hard").unwrap(),
        );
        r.want(
            "linkat",
            rc(unsafe { libc::linkat(dirs[29].0, c_from.as_ptr(), dirs[10].0, c_to.as_ptr(), 0) }),
            "OK",
        );
        let (a, b) = (fstat_at(&dirs[29], "leaf2"), fstat_at(&dirs[10], "hard"));
        r.want("nlink", a.as_ref().map(|s| s.st_nlink).unwrap_or(0), 2);
        r.want(
            "same inode",
            matches!((&a, &b), (Ok(x), Ok(y)) if x.st_ino == y.st_ino),
            true,
        );
        // xattrs on the deep file and a deep directory.
        let name = CString::new("user.deep").unwrap();
        let fx = open_at(&dirs[29], "leaf2", libc::O_RDWR, 0).unwrap();
        r.want(
            "fsetxattr file",
            rc(unsafe { libc::fsetxattr(fx.0, name.as_ptr(), b"v1".as_ptr().cast(), 2, 0) }),
            "OK",
        );
        r.want(
            "fsetxattr dir",
            rc(unsafe { libc::fsetxattr(deep.0, name.as_ptr(), b"dv".as_ptr().cast(), 2, 0) }),
            "OK",
        );
        let getx = |fd: &Fd| {
            let mut buf = [0u8; 16];
            let n = unsafe { libc::fgetxattr(fd.0, name.as_ptr(), buf.as_mut_ptr().cast(), 16) };
            if n < 0 {
                errno_name(common::errno())
            } else {
                String::from_utf8_lossy(&buf[..n as usize]).into_owned()
            }
        };
        r.want("fgetxattr file", getx(&fx), "v1");
        r.want("fgetxattr dir", getx(deep), "dv");
        drop(fx);
        // A symlink at depth.
        let (target, sl) = (CString::new("../x").unwrap(), CString::new("sl").unwrap());
        r.want(
            "symlinkat",
            rc(unsafe { libc::symlinkat(target.as_ptr(), deep.0, sl.as_ptr()) }),
            "OK",
        );
        let mut buf = [0u8; 64];
        let n = unsafe { libc::readlinkat(deep.0, sl.as_ptr(), buf.as_mut_ptr().cast(), 64) };
        r.want(
            "readlinkat",
            String::from_utf8_lossy(&buf[..n.max(0) as usize]),
            "../x",
        );
        // Listings at depth.
        r.want("list deepest", list_at(deep), "sl");
        r.want("list level 29", list_at(&dirs[29]), "dx200,leaf2");
        r.want("list level 10", list_at(&dirs[10]), "hard,kx200");
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        r.want(
            "fstatfs deep",
            rc(unsafe { libc::fstatfs(deep.0, &mut sfs) }),
            "OK",
        );
        // A deep directory moved to a shallower level, with the tree under it; the open
        // descriptor of its deepest directory follows it.
        r.want(
            "rename dir",
            ren(&dirs[25], &level_name(25), &dirs[5], "moveddir"),
            "OK",
        );
        let after = open_at(deep, "after", libc::O_CREAT | libc::O_WRONLY, 0o644);
        r.want(
            "create after dir rename",
            after
                .as_ref()
                .map(|_| "OK".to_string())
                .unwrap_or_else(|e| e.clone()),
            "OK",
        );
        if let Ok(fd) = &after {
            r.want("write after", write(fd, b"after the move"), "14");
        }
        drop(after);
        let rel: Vec<String> = (26..DEPTH).map(level_name).collect();
        let moved = open_at(
            &dirs[5],
            &format!("moveddir/{}", rel.join("/")),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
        );
        r.want(
            "read via new path",
            moved
                .as_ref()
                .map(|d| read_at(d, "after"))
                .unwrap_or_else(|e| e.clone()),
            "\"after the move\"",
        );
        drop(moved);
        // After a remount (the daemon scans its tiers), walked again from the top.
        drop(dirs);
        e.remount();
        let mut cur = open(&e.p(""), libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
        let mut walked = 0;
        let path: Vec<String> = (0..5)
            .map(level_name)
            .chain(std::iter::once("moveddir".to_string()))
            .chain((26..DEPTH).map(level_name))
            .collect();
        for n in &path {
            match open_at(&cur, n, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
                Ok(d) => cur = d,
                Err(_) => break,
            }
            walked += 1;
        }
        r.want("walk after remount", walked, path.len());
        r.want(
            "read after remount",
            read_at(&cur, "after"),
            "\"after the move\"",
        );
        r.want(
            "xattr after remount",
            match open_at(&cur, ".", libc::O_RDONLY | libc::O_DIRECTORY, 0) {
                Ok(d) => getx(&d),
                Err(e) => e,
            },
            "dv",
        );
        // Unlinks at depth.
        let un = |d: &Fd, n: &str, flags: i32| {
            let c = CString::new(n).unwrap();
            rc(unsafe { libc::unlinkat(d.0, c.as_ptr(), flags) })
        };
        r.want("unlink after", un(&cur, "after", 0), "OK");
        r.want("unlink sl", un(&cur, "sl", 0), "OK");
        r.want("list emptied", list_at(&cur), "");
        r.want(
            "stat unlinked",
            fstat_at(&cur, "after")
                .map(|_| "OK".to_string())
                .unwrap_or_else(|e| e),
            "ENOENT",
        );
    }
}
