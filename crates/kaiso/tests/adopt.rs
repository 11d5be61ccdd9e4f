//! `kaiso adopt DIR` through the real binary (issue 2, item 2): an existing tree becomes a
//! tier in place — nothing copied, the same inodes before, during and after a mount —
//! and a refused adopt (store mounted, overlapping directory) leaves the configuration
//! byte for byte as it was.

mod common;

use common::{Store, StoreSpec, kaiso_bin, temp_dir};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// What a tree looks like on disk, per relative path: inode, links, size, mode, mtime,
/// content (or link target) and user xattrs.
type Snapshot = BTreeMap<PathBuf, (u64, u64, u64, u32, i64, Vec<u8>, Vec<(String, Vec<u8>)>)>;

fn xattrs(p: &Path) -> Vec<(String, Vec<u8>)> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 4096];
    let n = unsafe { libc::llistxattr(c.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    for name in names[..n as usize]
        .split(|b| *b == 0)
        .filter(|n| !n.is_empty())
    {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 4096];
        let len =
            unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        if len >= 0 {
            v.truncate(len as usize);
            out.push((String::from_utf8_lossy(name).into_owned(), v));
        }
    }
    out.sort();
    out
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let n = CString::new(name).unwrap();
    let r = unsafe {
        libc::setxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(
        r,
        0,
        "setxattr {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let md = fs::symlink_metadata(&p).unwrap();
            let content = if md.file_type().is_symlink() {
                fs::read_link(&p).unwrap().as_os_str().as_bytes().to_vec()
            } else if md.is_file() {
                fs::read(&p).unwrap()
            } else {
                Vec::new()
            };
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            out.insert(
                rel,
                (
                    md.ino(),
                    md.nlink(),
                    md.size(),
                    md.mode(),
                    md.mtime(),
                    content,
                    xattrs(&p),
                ),
            );
            if md.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, root, &mut out);
    out
}

/// A tree with a hard link, a symlink, a user xattr and a sparse file.
fn seed_tree(dir: &Path) {
    fs::create_dir_all(dir.join("sub/deep")).unwrap();
    fs::write(dir.join("a.txt"), b"adopted in place\n").unwrap();
    fs::write(dir.join("sub/b.bin"), vec![0x5au8; 200_000]).unwrap();
    fs::hard_link(dir.join("sub/b.bin"), dir.join("sub/deep/b.link")).unwrap();
    symlink("../a.txt", dir.join("sub/to-a")).unwrap();
    set_xattr(&dir.join("a.txt"), "user.origin", b"media");
    let sparse = fs::File::create(dir.join("sparse")).unwrap();
    sparse.set_len(8 << 20).unwrap();
    std::os::unix::fs::FileExt::write_at(&sparse, b"end", (8 << 20) - 3).unwrap();
}

fn kaiso(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(kaiso_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run kaiso")
}

fn adopt(dir: &Path, config: &Path, extra: &[&str]) -> Output {
    let mut args: Vec<&std::ffi::OsStr> = vec!["adopt".as_ref(), dir.as_os_str()];
    args.push("--config".as_ref());
    args.push(config.as_os_str());
    args.extend(extra.iter().map(|s| std::ffi::OsStr::new(*s)));
    kaiso(&args)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A harness store over a configuration `kaiso adopt` wrote (mounted by `common`).
fn store_for(root: &Path, config: &Path) -> Store {
    let mountpoint = root.join("mnt");
    fs::create_dir_all(&mountpoint).unwrap();
    Store {
        root: root.to_path_buf(),
        tiers: Vec::new(),
        state: root.join("media.state"),
        config: config.to_path_buf(),
        mountpoint,
        spec: StoreSpec::tiers(0),
    }
}

#[test]
fn adopt_takes_a_tree_in_place_and_a_refused_adopt_changes_nothing() {
    fuse_or_skip!();
    let root = temp_dir("adopt");
    let store = store_for(&root, &root.join("media.toml"));
    let media = root.join("media");
    seed_tree(&media);
    let before = snapshot(&media);
    let config = store.config.clone();

    let out = adopt(&media, &config, &["--capacity", "1GiB"]);
    assert!(out.status.success(), "adopt: {}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("nothing copied") && said.contains("tier media"),
        "{said}"
    );
    assert_eq!(snapshot(&media), before, "adopt changed the tree");
    let cfg_text = fs::read(&config).unwrap();

    let m = store.mount();
    // Every file reads back through the mount; the hard link is one inode there too.
    for (rel, (_, nlink, size, _, _, content, _)) in &before {
        let p = m.path.join(rel);
        let md = fs::symlink_metadata(&p).unwrap();
        assert_eq!(md.size(), *size, "{}", rel.display());
        if md.is_file() {
            assert_eq!(&fs::read(&p).unwrap(), content, "{}", rel.display());
            assert_eq!(md.nlink(), *nlink, "{}", rel.display());
        }
    }
    assert_eq!(
        fs::metadata(m.path.join("sub/b.bin")).unwrap().ino(),
        fs::metadata(m.path.join("sub/deep/b.link")).unwrap().ino()
    );
    assert_eq!(
        xattrs(&m.path.join("a.txt")),
        vec![("user.origin".to_string(), b"media".to_vec())]
    );
    let out = kaiso(&[
        "where".as_ref(),
        "--json".as_ref(),
        m.path.join("sub/deep/b.link").as_os_str(),
    ]);
    assert!(out.status.success(), "where: {}", text(&out.stderr));
    let w: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(w["tiers"][0], "media", "{w}");
    assert_eq!(
        Path::new(w["backing_path"].as_str().unwrap()),
        fs::canonicalize(&media).unwrap().join("sub/deep/b.link"),
        "{w}"
    );

    // Adopting into the configuration of the mounted store: one line, nothing changed.
    let more = root.join("more");
    fs::create_dir_all(&more).unwrap();
    fs::write(more.join("x"), b"x").unwrap();
    let out = adopt(&more, &config, &["--capacity", "1GiB"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("in use") && err.contains("unchanged") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    assert_eq!(fs::read(&config).unwrap(), cfg_text, "config changed");
    let leftovers: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.as_bytes().ends_with(b"adopt-tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    assert!(m.unmount().success());
    assert_eq!(
        snapshot(&media),
        before,
        "a mount and unmount changed the tree"
    );

    // A directory inside a tier is refused naming both keys; nothing changed.
    let out = adopt(&media.join("sub"), &config, &["--name", "inner"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tier[1].path") && err.contains("inside tier[0].path"),
        "{err}"
    );
    assert_eq!(fs::read(&config).unwrap(), cfg_text, "config changed");

    // Unmounted, the same adopt extends the configuration as it was written.
    let out = adopt(&more, &config, &["--capacity", "1GiB"]);
    assert!(out.status.success(), "adopt more: {}", text(&out.stderr));
    let new_text = fs::read(&config).unwrap();
    assert!(new_text.starts_with(&cfg_text), "{}", text(&new_text));
    let m = store.mount();
    assert_eq!(fs::read(m.path.join("x")).unwrap(), b"x");
    assert_eq!(
        fs::read(m.path.join("a.txt")).unwrap(),
        b"adopted in place\n"
    );
    assert!(m.unmount().success());
    assert_eq!(snapshot(&media), before);
}

#[test]
fn a_failed_new_adopt_leaves_no_config_and_no_directories() {
    let root = temp_dir("adopt-fail");
    let _cleanup = store_for(&root, &root.join("new.toml"));
    let media = root.join("media");
    seed_tree(&media);
    let config = root.join("new.toml");
    // The faster tier would be inside the adopted tree: refused before anything stays.
    let faster = format!("ssd={}:64MiB", media.join("cache/ssd").display());
    let out = adopt(&media, &config, &["--faster", &faster]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("tier[1].path") && err.contains("contains tier[0].path"),
        "{err}"
    );
    assert!(err.contains("was not created"), "{err}");
    assert!(!config.exists());
    assert!(
        !media.join("cache").exists(),
        "the faster tier's directory was left behind"
    );
    assert!(!root.join("new.state").exists());

    // The same with a faster tier beside it works and lists it first.
    let faster = format!("ssd={}:64MiB", root.join("ssd").display());
    let out = adopt(&media, &config, &["--faster", &faster]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cfg = fs::read_to_string(&config).unwrap();
    let ssd = cfg.find("name = \"ssd\"").expect("ssd tier");
    let tree = cfg.find("name = \"media\"").expect("media tier");
    assert!(ssd < tree, "{cfg}");
    assert!(root.join("ssd").is_dir() && root.join("new.state").is_dir());
}

/// A path that a faster tier already has would make the store rename the adopted copy:
/// refused unless asked for, and then done as the scan does it.
#[test]
fn adopting_over_paths_a_faster_tier_has_needs_rename_conflicts() {
    let root = temp_dir("adopt-conflict");
    let _cleanup = store_for(&root, &root.join("c.toml"));
    let media = root.join("media");
    seed_tree(&media);
    let ssd = root.join("ssd");
    fs::create_dir_all(ssd.join("sub")).unwrap();
    fs::write(ssd.join("a.txt"), b"the faster copy").unwrap();
    let config = root.join("c.toml");
    let faster = format!("ssd={}:64MiB", ssd.display());
    let before = snapshot(&media);
    let out = adopt(&media, &config, &["--faster", &faster]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("1 paths")
            && err.contains("first: a.txt")
            && err.contains("--rename-conflicts"),
        "{err}"
    );
    assert!(!config.exists() && !root.join("c.state").exists());
    assert_eq!(snapshot(&media), before);

    let out = adopt(
        &media,
        &config,
        &["--faster", &faster, "--rename-conflicts"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("renamed"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        fs::read(media.join("a.txt.kaiso-conflict-media")).unwrap(),
        b"adopted in place\n"
    );
    assert_eq!(fs::read(ssd.join("a.txt")).unwrap(), b"the faster copy");
}
