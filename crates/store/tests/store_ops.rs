//! Store behaviour without a mount: namespace, rename across tiers, links, spill, fsck.

mod common;
use common::*;
use kaiso_store::{Caller, FsError, ROOT_INO, SetAttr, StoreConfig, rename_flags};
use std::ffi::OsStr;

#[test]
fn create_write_read_unlink_and_stable_inodes() {
    let mut t = TestStore::new(&["1MiB", "10MiB"]);
    let ino = t.put("d/e/f.txt", b"hello world");
    assert_eq!(t.get("d/e/f.txt"), b"hello world");
    let d_ino = t.lookup_path("d").unwrap().ino;
    assert_eq!(t.holders("d/e/f.txt", 2), vec![0]);
    t.reopen();
    assert_eq!(t.lookup_path("d/e/f.txt").unwrap().ino, ino);
    assert_eq!(t.lookup_path("d").unwrap().ino, d_ino);
    let e = t.lookup_path("d/e").unwrap().ino;
    t.s().unlink(e, OsStr::new("f.txt")).unwrap();
    assert_eq!(t.lookup_path("d/e/f.txt").unwrap_err(), FsError::NOENT);
    assert!(t.holders("d/e/f.txt", 2).is_empty());
    assert_eq!(t.s().status().tiers[0].used, 0);
}

#[test]
fn create_excl_and_names() {
    let t = TestStore::new(&["1MiB"]);
    t.put("a", b"1");
    let e = t
        .s()
        .create(
            ROOT_INO,
            OsStr::new("a"),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            false,
        )
        .unwrap_err();
    assert_eq!(e, FsError::EXIST);
    assert_eq!(
        t.s()
            .mkdir(ROOT_INO, OsStr::new("a"), 0o755, 0, Caller::ROOT)
            .unwrap_err(),
        FsError::EXIST
    );
    let long = "x".repeat(256);
    assert_eq!(
        t.s().lookup(ROOT_INO, OsStr::new(&long)).unwrap_err(),
        FsError::NAMETOOLONG
    );
    assert_eq!(
        t.s()
            .mkdir(ROOT_INO, OsStr::new(".kaiso-tmp-x"), 0o755, 0, Caller::ROOT)
            .unwrap_err(),
        FsError::INVAL
    );
}

#[test]
fn spill_to_next_tier_instead_of_enospc() {
    let t = TestStore::new(&["64KiB", "1MiB"]);
    t.put("small", &pattern(10_000, 1));
    // Bigger than the whole first tier: the write moves the file down and succeeds.
    let data = pattern(200_000, 2);
    let ino = t.put("big", &data);
    assert_eq!(t.get("big"), data);
    assert_eq!(t.holders("big", 2), vec![1]);
    let st = t.s().status();
    assert!(st.tiers[0].used <= st.tiers[0].capacity);
    assert_eq!(st.tiers[1].used, 200_000);
    // Everything full: ENOSPC, and nothing past the hard limits.
    let (_, o) = t
        .s()
        .create(
            ROOT_INO,
            OsStr::new("huge"),
            0o644,
            0,
            libc::O_RDWR,
            Caller::ROOT,
            false,
        )
        .unwrap();
    let r = t.s().write(o.fh, 0, &pattern(2 << 20, 3));
    assert_eq!(r.unwrap_err(), FsError::NOSPC);
    t.s().release(o.fh).unwrap();
    let st = t.s().status();
    for tier in &st.tiers {
        assert!(tier.used <= tier.capacity, "{tier:?}");
    }
    let _ = ino;
}

#[test]
fn rename_across_tiers_replaces_atomically() {
    let t = TestStore::new(&["1MiB", "1MiB"]);
    t.put("dir/old", b"old target");
    t.put("src", b"new content");
    // Put the source on the slow tier, keep the target on the fast one.
    t.s().move_now("src".as_ref(), "t1").unwrap();
    assert_eq!(t.holders("src", 2), vec![1]);
    let dir = t.lookup_path("dir").unwrap().ino;
    let src_ino = t.lookup_path("src").unwrap().ino;
    t.s()
        .rename(ROOT_INO, OsStr::new("src"), dir, OsStr::new("old"), 0)
        .unwrap();
    assert_eq!(t.get("dir/old"), b"new content");
    assert_eq!(t.holders("dir/old", 2), vec![1]);
    assert_eq!(t.lookup_path("dir/old").unwrap().ino, src_ino);
    assert_eq!(t.lookup_path("src").unwrap_err(), FsError::NOENT);
    // NOREPLACE and EXCHANGE
    t.put("x", b"x");
    assert_eq!(
        t.s()
            .rename(
                ROOT_INO,
                OsStr::new("x"),
                dir,
                OsStr::new("old"),
                rename_flags::NOREPLACE
            )
            .unwrap_err(),
        FsError::EXIST
    );
    t.s()
        .rename(
            ROOT_INO,
            OsStr::new("x"),
            dir,
            OsStr::new("old"),
            rename_flags::EXCHANGE,
        )
        .unwrap();
    assert_eq!(t.get("x"), b"new content");
    assert_eq!(t.get("dir/old"), b"x");
    assert_eq!(
        t.s()
            .rename(ROOT_INO, OsStr::new("nope"), dir, OsStr::new("old"), 0)
            .unwrap_err(),
        FsError::NOENT
    );
}

#[test]
fn directory_rename_spanning_tiers() {
    let mut t = TestStore::new(&["1MiB", "1MiB"]);
    t.put("a/b/one", b"1");
    t.put("a/b/two", b"2");
    t.s().move_now("a/b/two".as_ref(), "t1").unwrap();
    let a = t.lookup_path("a").unwrap().ino;
    let b_ino = t.lookup_path("a/b").unwrap().ino;
    t.s()
        .mkdir(ROOT_INO, OsStr::new("z"), 0o755, 0, Caller::ROOT)
        .unwrap();
    let z = t.lookup_path("z").unwrap().ino;
    t.s()
        .rename(a, OsStr::new("b"), z, OsStr::new("c"), 0)
        .unwrap();
    assert_eq!(t.get("z/c/one"), b"1");
    assert_eq!(t.get("z/c/two"), b"2");
    assert_eq!(t.lookup_path("z/c").unwrap().ino, b_ino);
    assert!(t.tier(1).join("z/c/two").exists() && !t.tier(1).join("a/b").exists());
    // Into its own subtree: EINVAL. Over a non-empty dir: ENOTEMPTY.
    let c = t.lookup_path("z/c").unwrap().ino;
    assert_eq!(
        t.s()
            .rename(ROOT_INO, OsStr::new("z"), c, OsStr::new("zz"), 0)
            .unwrap_err(),
        FsError::INVAL
    );
    t.put("q/file", b"q");
    assert_eq!(
        t.s()
            .rename(ROOT_INO, OsStr::new("a"), ROOT_INO, OsStr::new("q"), 0)
            .unwrap_err(),
        FsError::NOTEMPTY
    );
    t.reopen();
    assert_eq!(t.lookup_path("z/c").unwrap().ino, b_ino);
    assert_eq!(t.get("z/c/two"), b"2");
}

#[test]
fn hard_links_move_as_a_group() {
    let mut t = TestStore::new(&["1MiB", "1MiB"]);
    let ino = t.put("l/a", b"linked");
    let l = t.lookup_path("l").unwrap().ino;
    t.s()
        .mkdir(ROOT_INO, OsStr::new("m"), 0o755, 0, Caller::ROOT)
        .unwrap();
    let m = t.lookup_path("m").unwrap().ino;
    let attr = t.s().link(ino, m, OsStr::new("b")).unwrap();
    assert_eq!(attr.nlink, 2);
    t.s().move_now("l/a".as_ref(), "t1").unwrap();
    assert_eq!(t.holders("l/a", 2), vec![1]);
    assert_eq!(t.holders("m/b", 2), vec![1]);
    let a = std::fs::metadata(t.tier(1).join("l/a")).unwrap();
    let b = std::fs::metadata(t.tier(1).join("m/b")).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&a),
        std::os::unix::fs::MetadataExt::ino(&b)
    );
    assert_eq!(t.lookup_path("m/b").unwrap().ino, ino);
    t.reopen();
    assert_eq!(t.lookup_path("l/a").unwrap().ino, ino);
    assert_eq!(t.lookup_path("m/b").unwrap().ino, ino);
    t.s().unlink(l, OsStr::new("a")).unwrap();
    assert_eq!(t.get("m/b"), b"linked");
}

#[test]
fn move_keeps_metadata_xattrs_and_holes() {
    let t = TestStore::new(&["64MiB", "64MiB"]);
    let ino = t.put("sparse", b"");
    let s = t.s();
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.write(o.fh, 0, b"head").unwrap();
    s.write(o.fh, 8 << 20, b"tail").unwrap();
    s.release(o.fh).unwrap();
    s.setxattr(ino, OsStr::new("user.k"), b"v", 0).unwrap();
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    s.setattr(
        ino,
        &SetAttr {
            mode: Some(0o640),
            uid: Some(1234),
            gid: Some(99),
            atime: Some(kaiso_store::TimeSet::At(when)),
            mtime: Some(kaiso_store::TimeSet::At(when)),
            ..Default::default()
        },
        Caller::ROOT,
    )
    .unwrap();
    let before = s.getattr(ino, None).unwrap();
    s.move_now("sparse".as_ref(), "t1").unwrap();
    let after = s.getattr(ino, None).unwrap();
    assert_eq!(
        (after.perm, after.uid, after.gid, after.mtime, after.size),
        (
            before.perm,
            before.uid,
            before.gid,
            before.mtime,
            before.size
        )
    );
    assert_eq!(s.getxattr(ino, OsStr::new("user.k")).unwrap(), b"v");
    assert!(
        after.blocks * 512 < 1 << 20,
        "holes kept: {} blocks",
        after.blocks
    );
    let data = t.get("sparse");
    assert_eq!(&data[..4], b"head");
    assert_eq!(&data[8 << 20..], b"tail");
    assert!(data[4..8 << 20].iter().all(|b| *b == 0));
}

#[test]
fn open_handles_follow_a_move() {
    let t = TestStore::new(&["1MiB", "1MiB"]);
    let ino = t.put("f", b"0123456789");
    let s = t.s();
    let o = s.open_file(ino, libc::O_RDWR, false).unwrap();
    s.move_now("f".as_ref(), "t1").unwrap();
    s.write(o.fh, 10, b"abc").unwrap();
    assert_eq!(s.read(o.fh, 0, 100).unwrap(), b"0123456789abc");
    s.release(o.fh).unwrap();
    assert_eq!(
        std::fs::read(t.tier(1).join("f")).unwrap(),
        b"0123456789abc"
    );
    assert!(!t.tier(0).join("f").exists());
}

#[test]
fn fsck_adopts_files_added_directly_to_a_tier() {
    let mut t = TestStore::new(&["1MiB", "1MiB"]);
    t.put("known", b"k");
    std::fs::create_dir_all(t.tier(1).join("new/dir")).unwrap();
    std::fs::write(t.tier(1).join("new/dir/file"), b"direct").unwrap();
    // Same path on both tiers: the faster one is shown; fsck keeps both reachable.
    std::fs::write(t.tier(1).join("known"), b"shadowed").unwrap();
    let r = t.s().fsck().unwrap();
    assert!(r.adopted >= 1, "{r:?}");
    assert_eq!(r.conflicts, 1, "{r:?}");
    assert_eq!(t.get("new/dir/file"), b"direct");
    assert_eq!(t.get("known"), b"k");
    assert_eq!(t.get("known.kaiso-conflict-t1"), b"shadowed");
    t.reopen();
    assert_eq!(t.get("new/dir/file"), b"direct");
    // Files appearing while open are found on lookup too.
    std::fs::write(t.tier(0).join("late"), b"late").unwrap();
    assert_eq!(t.get("late"), b"late");
}

#[test]
fn readdir_is_a_stable_snapshot() {
    let t = TestStore::new(&["1MiB"]);
    for i in 0..20 {
        t.put(&format!("d/f{i:02}"), b"x");
    }
    let s = t.s();
    let d = t.lookup_path("d").unwrap().ino;
    let fh = s.opendir(d).unwrap();
    let first = s.readdir(fh, 0).unwrap();
    let half = &first[..10];
    for i in 0..20 {
        s.unlink(d, OsStr::new(&format!("f{i:02}"))).unwrap();
    }
    let rest = s.readdir(fh, half.last().unwrap().offset).unwrap();
    assert_eq!(half.len() + rest.len(), 22);
    s.releasedir(fh).unwrap();
    assert_eq!(t.names(d), vec![".", ".."]);
}

#[test]
fn symlinks_fifos_xattrs_statfs() {
    let t = TestStore::new(&["1MiB", "3MiB"]);
    let s = t.s();
    let a = s
        .symlink(
            ROOT_INO,
            OsStr::new("ln"),
            "target/x".as_ref(),
            Caller::ROOT,
        )
        .unwrap();
    assert_eq!(s.readlink(a.ino).unwrap(), "target/x");
    let f = s
        .mknod(
            ROOT_INO,
            OsStr::new("fifo"),
            libc::S_IFIFO | 0o600,
            0,
            0,
            Caller::ROOT,
        )
        .unwrap();
    assert_eq!(f.kind, kaiso_store::FileKind::Fifo);
    let d = s
        .mkdir(ROOT_INO, OsStr::new("d"), 0o755, 0, Caller::ROOT)
        .unwrap();
    s.setxattr(d.ino, OsStr::new("user.a"), b"1", 0).unwrap();
    assert_eq!(s.getxattr(d.ino, OsStr::new("user.a")).unwrap(), b"1");
    assert!(String::from_utf8_lossy(&s.listxattr(d.ino).unwrap()).contains("user.a"));
    s.removexattr(d.ino, OsStr::new("user.a")).unwrap();
    assert_eq!(
        s.getxattr(d.ino, OsStr::new("user.a")).unwrap_err(),
        FsError::NODATA
    );
    let st = s.statfs().unwrap();
    assert_eq!(st.blocks * st.bsize as u64, 4 << 20);
}

#[test]
fn missing_tier_dir_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("t0")).unwrap();
    let text = config_text(dir.path(), &["1MiB", "1MiB"]);
    let e = kaiso_store::Store::open(StoreConfig::from_toml_str(&text, "x").unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tier t1") && e.contains("does not exist") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn second_open_of_the_same_store_is_refused() {
    let t = TestStore::new(&["1MiB"]);
    let e = kaiso_store::Store::open(StoreConfig::from_toml_str(&t.cfg_text, "x").unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("in use"), "{e}");
}

#[test]
fn pins_and_operator_queries() {
    let mut t = TestStore::new(&["1MiB", "1MiB"]);
    t.put("p/a", b"aaaa");
    t.put("p/b", b"bbbb");
    let s = t.s().clone();
    let (n, job) = s.pin("p".as_ref(), Some("t1"), true).unwrap();
    assert_eq!(n, 2);
    let job = job.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !s.job_progress(job).unwrap().finished {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let p = s.job_progress(job).unwrap();
    assert_eq!((p.files_done, p.failed), (2, 0), "{p:?}");
    let w = s.where_is("p/a".as_ref()).unwrap();
    assert_eq!(w.tiers, vec!["t1"]);
    assert_eq!(w.pinned.as_deref(), Some("t1"));
    let e = s.explain("p/a".as_ref()).unwrap();
    assert!(e.rule.contains("pinned"), "{e:?}");
    drop(s);
    let s = t.reopen();
    assert_eq!(
        s.where_is("p/b".as_ref()).unwrap().pinned.as_deref(),
        Some("t1")
    );
    assert_eq!(s.unpin("p".as_ref(), true).unwrap(), 2);
    let job = s
        .start_move("p".as_ref(), kaiso_store::Direction::Promote, None, true)
        .unwrap();
    while !s.job_progress(job).unwrap().finished {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(t.holders("p/a", 2), vec![0]);
    assert_eq!(s.status().tiers[0].used, 8);
}

/// Moves back and forth between two tiers while other threads write through held
/// handles, truncate by path, rename, link and unlink the same files, and check every
/// read against a model (issue 2, item 5: no torn reads, no lost writes, one copy).
#[test]
fn moves_race_with_writes_truncates_renames_and_links() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let t = TestStore::new(&["64MiB", "64MiB"]);
    const FILES: usize = 3;
    for i in 0..FILES {
        t.put(&format!("a{i}"), &pattern(64 * 1024, i as u8));
    }
    let stop = AtomicBool::new(false);
    let moves = AtomicU64::new(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    std::thread::scope(|sc| {
        let (t, stop, moves) = (&t, &stop, &moves);
        sc.spawn(move || {
            let mut k = 0usize;
            while !stop.load(Ordering::Relaxed) {
                k += 1;
                let name = format!(
                    "{}{}",
                    if k.is_multiple_of(3) { "b" } else { "a" },
                    k % FILES
                );
                if t.s()
                    .move_now(name.as_ref(), if k.is_multiple_of(2) { "t1" } else { "t0" })
                    .is_ok()
                {
                    moves.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let workers: Vec<_> = (0..FILES)
            .map(|i| {
                sc.spawn(move || {
                    let s = t.s();
                    let (a, b) = (format!("a{i}"), format!("b{i}"));
                    let mut model = pattern(64 * 1024, i as u8);
                    let mut seed = 0x9e37_79b9_u64.wrapping_mul(i as u64 + 1);
                    let mut rnd = move |n: u64| {
                        seed = seed
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        (seed >> 33) % n.max(1)
                    };
                    let ino = t.lookup_path(&a).unwrap().ino;
                    let h = s.open_file(ino, libc::O_RDWR, false).unwrap().fh;
                    let mut named_a = true;
                    let mut linked = false;
                    let mut ops = 0u64;
                    while std::time::Instant::now() < deadline {
                        ops += 1;
                        match rnd(6) {
                            0 | 1 => {
                                let off = rnd(model.len() as u64 + 100) as usize;
                                let data = pattern(1 + rnd(8192) as usize, ops as u8);
                                s.write(h, off as u64, &data).unwrap();
                                if model.len() < off + data.len() {
                                    model.resize(off + data.len(), 0);
                                }
                                model[off..off + data.len()].copy_from_slice(&data);
                            }
                            2 => {
                                let size = rnd(96 * 1024);
                                let set = SetAttr {
                                    size: Some(size),
                                    ..Default::default()
                                };
                                s.setattr(ino, &set, Caller::ROOT).unwrap();
                                model.resize(size as usize, 0);
                            }
                            3 => {
                                let (from, to) = if named_a { (&a, &b) } else { (&b, &a) };
                                s.rename(ROOT_INO, OsStr::new(from), ROOT_INO, OsStr::new(to), 0)
                                    .unwrap();
                                named_a = !named_a;
                            }
                            4 => {
                                let extra = format!("l{i}");
                                if linked {
                                    s.unlink(ROOT_INO, OsStr::new(&extra)).unwrap();
                                } else {
                                    s.link(ino, ROOT_INO, OsStr::new(&extra)).unwrap();
                                }
                                linked = !linked;
                            }
                            _ => {}
                        }
                        let got = s.read(h, 0, 200 * 1024).unwrap();
                        assert!(
                            got == model,
                            "file {i} op {ops}: read differs from the model"
                        );
                    }
                    s.release(h).unwrap();
                    let name = if named_a { a } else { b };
                    (name, linked, model)
                })
            })
            .collect();
        let results: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        for (i, (name, linked, model)) in results.into_iter().enumerate() {
            assert!(t.get(&name) == model, "file {i}: content after the run");
            let mut names = vec![name];
            if linked {
                names.push(format!("l{i}"));
            }
            let on: Vec<Vec<usize>> = names.iter().map(|n| t.holders(n, 2)).collect();
            assert!(
                on.iter().all(|h| h.len() == 1 && *h == on[0]),
                "file {i}: names on tiers {on:?}"
            );
        }
    });
    assert!(
        moves.load(Ordering::Relaxed) > 3,
        "only {} moves",
        moves.load(Ordering::Relaxed)
    );
}

/// Operator requests fail with the errno a face would use and a message that says what
/// is wrong (the caller names the path in front of it).
#[test]
fn operator_errors_carry_errno_and_words() {
    let t = TestStore::new(&["1MiB", "1MiB"]);
    t.put("d/f", b"x");
    let s = t.s().clone();
    let e = s.where_is("d/nope".as_ref()).unwrap_err();
    assert_eq!(
        (e.errno, e.message.as_str()),
        (FsError::NOENT, "no such file or directory in the store")
    );
    let e = s
        .start_move("d".as_ref(), kaiso_store::Direction::Demote, None, false)
        .unwrap_err();
    assert_eq!(e.errno, FsError::ISDIR);
    assert_eq!(
        e.to_string(),
        "is a directory: give -r to demote every file below it"
    );
    // A bad tier is reported even when the path is fine, and nothing is pinned.
    let e = s.pin("d/f".as_ref(), Some("ssd"), false).unwrap_err();
    assert_eq!(e.errno, FsError::INVAL);
    assert_eq!(e.message, "unknown tier \"ssd\" (tiers: t0, t1)");
    assert!(s.where_is("d/f".as_ref()).unwrap().pinned.is_none());
    assert_eq!(FsError::from(e), FsError::INVAL);
    let e = s.unpin("d".as_ref(), false).unwrap_err();
    assert!(e.message.contains("-r to unpin"), "{e}");
}

/// A store whose owner let go while one of its background threads still held it for a
/// moment (the tier-root check holds a reference while it runs): opening the same state
/// directory again in this process waits for that store to be released instead of
/// failing as busy (the rename_crash tests hit this once in a `make test`).
#[test]
fn a_reopen_waits_for_a_store_a_background_thread_still_holds() {
    let mut t = TestStore::new(&["1GiB"]);
    let held = t.store.take().unwrap();
    // Taken before the holder starts: its 300 ms run from a later moment, however long
    // a loaded machine keeps this thread from the next line.
    let t0 = std::time::Instant::now();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(held);
    });
    let cfg = kaiso_store::StoreConfig::from_toml_str(&t.cfg_text, "test.toml").unwrap();
    let s = kaiso_store::Store::open(cfg).expect("the old store of this process is released");
    assert!(
        t0.elapsed() >= std::time::Duration::from_millis(250),
        "opened while the old store still held the lock"
    );
    holder.join().unwrap();
    s.shutdown();
}
