//! Issue 4 (session 15), with the real `kaiso` binary and its FUSE mount: the xattrs and
//! POSIX ACL of a directory not listed yet are the source's. A POSIX source directory
//! `d` carries a user xattr and an access ACL denying user `nobody` (65534) everything
//! while its mode (0755) lets every user in. Through the mount of a share started
//! `--paused` (no crawl lists `d`): `nobody` cannot open `d` (the kernel's check under
//! `default_permissions` reads `system.posix_acl_access` through the mount), `getxattr`
//! shows the xattr and the ACL, and `d` is still unlisted; after the crawl and `finish`
//! (no `--accept-skipped`) all of it is unchanged. (Before: no xattr and no ACL until
//! `d` was listed, so `nobody` could list it.)
//!
//! Every wait is bounded; the daemon and its mount are stopped on drop.

mod common;

use common::migrate_daemon::{Daemon, migrate_cmd, migrate_status_json, output_text};
use common::{Scratch, Store, StoreSpec, cstr, getxattr};
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const XATTR: &str = "user.s15_dir_tag";
const VALUE: &[u8] = b"the directory's own";

/// The Linux `system.posix_acl_access` value: owner rwx, user 65534 none, group r-x,
/// mask r-x, other r-x.
fn denying_acl() -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (0x01u16, 7u16, u32::MAX),
        (0x02, 0, 65534),
        (0x04, 5, u32::MAX),
        (0x10, 5, u32::MAX),
        (0x20, 5, u32::MAX),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn setxattr(p: &Path, name: &str, value: &[u8]) -> Result<(), std::io::Error> {
    let c = cstr(p);
    let n = std::ffi::CString::new(name).unwrap();
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether user `nobody` can list directory `p`: Ok, or the errno.
fn nobody_lists(p: &Path) -> Result<(), i32> {
    let p = p.to_path_buf();
    common::as_nobody(move || {
        fs::read_dir(&p)
            .map(|_| ())
            .map_err(|e| e.raw_os_error().unwrap_or(0))
    })
}

fn start(src: &Path, store: &Store) -> Daemon {
    let args: Vec<&OsStr> = vec![
        src.as_os_str(),
        store.config.as_os_str(),
        OsStr::new("--mount"),
        store.mountpoint.as_os_str(),
        OsStr::new("--paused"),
    ];
    Daemon::start(
        &args,
        store.root.join("daemon.log"),
        Some(&store.mountpoint),
    )
    .unwrap_or_else(|e| panic!("kaiso migrate start: {e}"))
}

#[test]
fn an_unlisted_directorys_xattrs_and_acl_are_the_sources_through_the_mount() {
    fuse_or_skip!();
    let src = Scratch::new("s15-meta-src");
    for dir in ["d", "e"] {
        let p = src.0.join(dir);
        fs::create_dir(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(p.join("f"), b"inside").unwrap();
    }
    let d_src = src.0.join("d");
    setxattr(&d_src, XATTR, VALUE).expect("a user xattr on the source directory");
    if let Err(e) = setxattr(&d_src, "system.posix_acl_access", &denying_acl()) {
        eprintln!("skipping: the source's file system takes no POSIX ACLs ({e})");
        return;
    }
    assert_eq!(
        nobody_lists(&d_src),
        Err(libc::EACCES),
        "the source's ACL denies nobody"
    );
    let store = Store::new("s15-meta-dst", StoreSpec::tiers(1).allow_other());
    let mut daemon = start(&src.0, &store);
    let mnt = |rel: &str| -> PathBuf { store.mountpoint.join(rel) };
    // `e` (no ACL) shows that nobody can use the mount at all.
    assert_eq!(
        nobody_lists(&mnt("e")),
        Ok(()),
        "nobody lists e through the mount; daemon log:\n{}",
        daemon.log_text()
    );
    assert_eq!(
        nobody_lists(&mnt("d")),
        Err(libc::EACCES),
        "expected d's ACL (user 65534: none) to deny nobody through the mount before d \
         is listed, as on the source; daemon log:\n{}",
        daemon.log_text()
    );
    assert_eq!(
        getxattr(&mnt("d"), XATTR).as_deref(),
        Ok(VALUE),
        "d's own xattr before d is listed"
    );
    assert_eq!(
        getxattr(&mnt("d"), "system.posix_acl_access"),
        Ok(denying_acl()),
        "d's ACL (getfacl) before d is listed"
    );
    let v = migrate_status_json(&store.config);
    let s = &v["shares"][0];
    assert!(
        s["dirs_pending"].as_u64() == Some(1) && s["skipped"].as_array().is_some_and(Vec::is_empty),
        "expected d still unlisted (e was listed by nobody) and nothing skipped: {s:#}"
    );
    let o = migrate_cmd("resume", &store.config, &[], Duration::from_secs(30));
    assert!(o.status.success(), "resume: {}", output_text(&o));
    let o = migrate_cmd(
        "finish",
        &store.config,
        &["--wait", "120s"],
        Duration::from_secs(180),
    );
    assert!(
        o.status.success(),
        "finish without --accept-skipped: {}\ndaemon log:\n{}",
        output_text(&o),
        daemon.log_text()
    );
    assert_eq!(
        getxattr(&mnt("d"), XATTR).as_deref(),
        Ok(VALUE),
        "after finish"
    );
    assert_eq!(
        getxattr(&mnt("d"), "system.posix_acl_access"),
        Ok(denying_acl()),
        "d's ACL after finish"
    );
    assert_eq!(nobody_lists(&mnt("d")), Err(libc::EACCES), "after finish");
    assert_eq!(fs::read(mnt("d/f")).unwrap(), b"inside");
    daemon.stop();
}
