//! Issue 4 §7, the client side: real NFS and SMB clients change the tree through kaiso's
//! own faces while `kaiso migrate start` still crawls a real old server, then `finish`
//! and the tree must be the source with exactly the clients' changes applied.
//!
//! - NFS: nfs-ganesha is the old server; the daemon serves the store over its embedded
//!   NFSv3 server (`--nfs`) and a FUSE mount (for the final comparison). The client is
//!   libnfs: `nfs-cp` (libnfs-utils) creates and overwrites files, `nfs-cat` reads them
//!   back; libnfs-utils has no tool that renames, deletes, truncates or makes a
//!   directory, so those go through the same library (`libnfs.so`, loaded with
//!   `dlopen`): `nfs_rename`, `nfs_unlink`, `nfs_truncate`, `nfs_mkdir`.
//! - SMB: Samba is the old server; a second smbd exports the daemon's FUSE mount and
//!   `smbclient` is the client: `put` (create, overwrite: shorter, longer, and with an
//!   empty file, which is smbclient's only way to truncate), `rename`, `del`, `mkdir`,
//!   `get`.
//!
//! The crawl is throttled, so it is still running (stubs remain) when the client is done:
//! the test checks that. Every wait is bounded; servers, daemons and mounts are stopped
//! on drop.

mod common;
#[path = "../../source/tests/common/mod.rs"]
mod source_servers;

use common::migrate_daemon::{
    Daemon, migrate_cmd, migrate_status_json, output_text, wait_share_status,
};
use common::{Store, StoreSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    source_servers::content(seed, len)
}

fn set_mtime(p: &Path, secs: i64, nsec: i64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = [libc::timespec {
        tv_sec: secs,
        tv_nsec: nsec,
    }; 2];
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            ts.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", p.display());
}

// ---- the source and the model ---------------------------------------------------------

/// The files the clients change, with their sizes (they are stubs while the crawl runs
/// unless it happened to reach them first).
const CHANGED: [(&str, usize); 7] = [
    ("w/over_short", 2 << 20),
    ("w/over_long", 100 << 10),
    ("w/ren", (3 << 19) + 11),
    ("w/ren_into_dir", 500 << 10),
    ("w/del", 1 << 20),
    ("w/trunc_down", 2 << 20),
    ("w/trunc_up", 300 << 10),
];

/// The old server's tree: directories, files the clients leave alone (0 B to 1 MiB), the
/// files they change, and with `unix`: a hard link pair, symlinks, an odd owner and mode,
/// fixed mtimes and a name that is not UTF-8 (an SMB source carries none of these).
fn make_source(root: &Path, unix: bool) {
    for d in ["keep/deep/er", "w", "empty_dir"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    for i in 0..6u64 {
        fs::write(
            root.join(format!("keep/k{i}")),
            bytes(10 + i, (1 << 20) + i as usize * 1000),
        )
        .unwrap();
    }
    for i in 0..10u64 {
        fs::write(
            root.join(format!("keep/deep/er/s{i}")),
            bytes(30 + i, i as usize * 333),
        )
        .unwrap();
    }
    for (i, (p, len)) in CHANGED.iter().enumerate() {
        fs::write(root.join(p), bytes(50 + i as u64, *len)).unwrap();
    }
    if unix {
        fs::write(root.join("keep/link_a"), bytes(70, 200_000)).unwrap();
        fs::hard_link(root.join("keep/link_a"), root.join("link_b")).unwrap();
        symlink("keep/k0", root.join("sym")).unwrap();
        symlink("no/such/target", root.join("keep/dangling")).unwrap();
        let owned = root.join("keep/owned");
        fs::write(&owned, b"owned by someone else").unwrap();
        fs::set_permissions(&owned, fs::Permissions::from_mode(0o640)).unwrap();
        std::os::unix::fs::lchown(&owned, Some(1234), Some(5678)).unwrap();
        fs::write(root.join(OsStr::from_bytes(b"keep/caf\xe9")), b"latin-1").unwrap();
        set_mtime(&root.join("keep/k1"), 1_000_000_000, 123_456_789);
        set_mtime(&root.join("w/ren"), 1_200_000_000, 7);
        set_mtime(&root.join("sym"), 1_100_000_000, 0);
    }
}

/// What an object must be: its kind with content (file bytes, link target), and for
/// objects no client changed, its mode, owner and mtime (`None`: not compared).
#[derive(Clone, Debug, PartialEq)]
struct Obj {
    kind: Kind,
    meta: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Dir,
    File { data: Vec<u8>, nlink: u64 },
    Symlink(OsString),
    Special(u32),
}

type Tree = BTreeMap<Vec<u8>, Obj>;

/// Every object under `root` (not following symlinks); `meta` adds mode, owner and (for
/// non-directories) mtime. Also the hard-link groups (relative paths sharing an inode).
fn describe(root: &Path, meta: bool) -> (Tree, BTreeSet<Vec<Vec<u8>>>) {
    let mut out = Tree::new();
    let mut by_ino: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = root.join(&rel);
        let names = fs::read_dir(&dir).unwrap_or_else(|e| panic!("readdir {}: {e}", dir.display()));
        for name in names {
            let r = rel.join(name.unwrap().file_name());
            let p = root.join(&r);
            let md =
                fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()));
            let ft = md.file_type();
            let kind = if ft.is_dir() {
                stack.push(r.clone());
                Kind::Dir
            } else if ft.is_symlink() {
                Kind::Symlink(fs::read_link(&p).unwrap().into_os_string())
            } else if ft.is_file() {
                if md.nlink() > 1 {
                    by_ino
                        .entry(md.ino())
                        .or_default()
                        .push(r.as_os_str().as_bytes().to_vec());
                }
                Kind::File {
                    data: fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())),
                    nlink: md.nlink(),
                }
            } else {
                Kind::Special(md.mode() & libc::S_IFMT)
            };
            // Directory mtimes change with their entries (the clients' and the engine's).
            let mtime = if ft.is_dir() {
                String::new()
            } else {
                format!(" mtime {}.{:09}", md.mtime(), md.mtime_nsec())
            };
            let meta = meta.then(|| {
                format!(
                    "mode {:o} owner {}:{}{mtime}",
                    md.mode() & 0o7777,
                    md.uid(),
                    md.gid()
                )
            });
            out.insert(r.as_os_str().as_bytes().to_vec(), Obj { kind, meta });
        }
    }
    let groups = by_ino
        .into_values()
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    (out, groups)
}

fn show(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

/// A short description of an object for messages (sizes and a fingerprint, not bytes).
fn brief(o: &Obj) -> String {
    let k = match &o.kind {
        Kind::File { data, nlink } => format!(
            "file {} bytes {:?} nlink {nlink}",
            data.len(),
            common::fingerprint(data)
        ),
        k => format!("{k:?}"),
    };
    format!("{k} {:?}", o.meta)
}

/// The tree at `got` must be `model`: the same names, kinds, bytes and link targets, the
/// same mode/owner/mtime where the model has them, and the same hard-link groups.
fn assert_tree(model: &Tree, links: &BTreeSet<Vec<Vec<u8>>>, got: &Path, meta: bool, what: &str) {
    let (have, have_links) = describe(got, meta);
    let want_names: BTreeSet<&Vec<u8>> = model.keys().collect();
    let have_names: BTreeSet<&Vec<u8>> = have.keys().collect();
    let missing: Vec<String> = want_names
        .difference(&have_names)
        .map(|p| show(p))
        .collect();
    let extra: Vec<String> = have_names
        .difference(&want_names)
        .map(|p| show(p))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: missing {missing:?}, extra {extra:?}"
    );
    let mut wrong = Vec::new();
    for (p, want) in model {
        let h = &have[p];
        let same_meta = want.meta.is_none() || want.meta == h.meta;
        if want.kind != h.kind || !same_meta {
            wrong.push(format!(
                "{}: want {}, have {}",
                show(p),
                brief(want),
                brief(h)
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{what}: {} differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(&have_links, links, "{what}: hard-link groups");
}

/// A change a client made, applied to the model.
enum Change<'a> {
    /// Created or overwritten with these bytes (mode, owner, mtime are the client's).
    Write(&'a str, Vec<u8>),
    Truncate(&'a str, usize),
    /// Renamed: content and attributes go with it.
    Rename(&'a str, &'a str),
    Delete(&'a str),
    Mkdir(&'a str),
}

fn apply(model: &mut Tree, links: &mut BTreeSet<Vec<Vec<u8>>>, c: &Change) {
    let k = |p: &str| p.as_bytes().to_vec();
    match c {
        Change::Write(p, data) => {
            let old = model.get(&k(p)).map(|o| o.kind.clone());
            assert!(
                !matches!(old, Some(Kind::File { nlink: 2.., .. })),
                "the test does not write hard-linked files"
            );
            model.insert(
                k(p),
                Obj {
                    kind: Kind::File {
                        data: data.clone(),
                        nlink: 1,
                    },
                    meta: None,
                },
            );
        }
        Change::Truncate(p, size) => {
            let o = model.get_mut(&k(p)).expect("truncated file in the model");
            let Kind::File { data, .. } = &mut o.kind else {
                panic!("{p} is no file")
            };
            data.resize(*size, 0);
            o.meta = None;
        }
        Change::Rename(from, to) => {
            let o = model.remove(&k(from)).expect("renamed object in the model");
            model.insert(k(to), o);
            *links = std::mem::take(links)
                .into_iter()
                .map(|g| {
                    let mut g: Vec<Vec<u8>> = g
                        .into_iter()
                        .map(|p| if p == k(from) { k(to) } else { p })
                        .collect();
                    g.sort();
                    g
                })
                .collect();
        }
        Change::Delete(p) => {
            model.remove(&k(p)).expect("deleted file in the model");
        }
        Change::Mkdir(p) => {
            model.insert(
                k(p),
                Obj {
                    kind: Kind::Dir,
                    meta: None,
                },
            );
        }
    }
}

// ---- commands -----------------------------------------------------------------------------

/// Runs a client program, killed after `limit` (`timeout -s KILL`).
fn run_bounded(program: &str, args: &[&OsStr], limit: Duration) -> Output {
    Command::new("timeout")
        .args(["-s", "KILL"])
        .arg(limit.as_secs().to_string())
        .arg(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// Where a share is in its crawl, for messages.
fn crawl_position(config: &Path) -> String {
    let v = migrate_status_json(config);
    let s = &v["shares"][0];
    format!(
        "state {}, pass {}, {} stubs left, {} of {} bytes done",
        s["state"], s["pass"], s["remaining_stubs"], s["bytes_done"], s["bytes_known"]
    )
}

/// Waits (bounded) until the crawl copies data, i.e. it runs and has listed the tree.
fn wait_crawl_copying(config: &Path) {
    wait_share_status(
        config,
        Duration::from_secs(60),
        "the throttled crawl copies data",
        |s| s["bytes_done"].as_u64().unwrap_or(0) > 0 && s["remaining_stubs"].as_u64() > Some(0),
    );
}

/// After the clients' changes: the crawl must still be running with stubs left, or the
/// test did not test changes during the migration.
fn assert_still_crawling(config: &Path, took: Duration) {
    let v = migrate_status_json(config);
    let s = &v["shares"][0];
    assert!(
        s["remaining_stubs"].as_u64().unwrap_or(0) > 0 && s["state"] == "running",
        "the crawl ended before the client was done ({took:?} of changes): make the source \
         bigger or the throttle lower; status {v:#}"
    );
}

/// Lifts the throttle and runs `finish --wait 300s`; returns its standard output.
fn finish(config: &Path, d: &Daemon) -> String {
    let o = migrate_cmd("throttle", config, &["off"], Duration::from_secs(30));
    assert!(o.status.success(), "{}", output_text(&o));
    let o = migrate_cmd(
        "finish",
        config,
        &["--wait", "300s"],
        Duration::from_secs(360),
    );
    assert!(
        o.status.success(),
        "{}\ndaemon log:\n{}",
        output_text(&o),
        d.log_text()
    );
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("share main finished") && out.contains("; 0 skipped"),
        "finish must report every file copied, none skipped: {}",
        output_text(&o)
    );
    out
}

/// The client counts `finish` printed ("N modified and M deleted by clients") must be
/// the files of the source the client changed and deleted, whatever their copy state
/// when it did (a stub or a copied file counts the same).
fn assert_client_counts(out: &str, modified: u64, deleted: u64) {
    let counts = out.split_once(" deleted by clients").and_then(|(head, _)| {
        let mut words = head.rsplit(' ');
        let deleted = words.next()?.parse::<u64>().ok()?;
        (words.next()? == "and").then_some(())?;
        (words.next()? == "modified").then_some(())?;
        let modified = words.next()?.parse::<u64>().ok()?;
        Some((modified, deleted))
    });
    assert_eq!(
        counts,
        Some((modified, deleted)),
        "finish must say {modified} modified and {deleted} deleted by clients: {out}"
    );
}

// ---- libnfs -------------------------------------------------------------------------------

/// `struct nfs_url` of libnfs (server, path, file).
#[repr(C)]
struct NfsUrl {
    server: *mut libc::c_char,
    path: *mut libc::c_char,
    file: *mut libc::c_char,
}

/// A mounted libnfs context (the synchronous API of libnfs.so, loaded at run time: the
/// Debian package libnfs-utils brings the library, not its headers).
struct LibNfs {
    lib: *mut libc::c_void,
    ctx: *mut libc::c_void,
    /// libnfs 6 (soname 16) swapped `nfs_write`'s count and buffer arguments.
    v6: bool,
}

impl LibNfs {
    fn sym<T: Copy>(&self, name: &str) -> T {
        let n = CString::new(name).unwrap();
        let p = unsafe { libc::dlsym(self.lib, n.as_ptr()) };
        assert!(!p.is_null(), "libnfs has no {name}");
        assert_eq!(
            std::mem::size_of::<T>(),
            std::mem::size_of::<*mut libc::c_void>()
        );
        unsafe { std::mem::transmute_copy(&p) }
    }

    /// Loads libnfs and mounts `url` (nfs://HOST/EXPORT?nfsport=…&mountport=…).
    fn mount(url: &str) -> Result<LibNfs, String> {
        let (lib, soname) = ["libnfs.so.13", "libnfs.so.14", "libnfs.so.16"]
            .iter()
            .map(|n| {
                let c = CString::new(*n).unwrap();
                let l = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
                (l, *n)
            })
            .find(|(l, _)| !l.is_null())
            .ok_or("libnfs.so.13/14/16 is not installed (Debian: libnfs-utils depends on it)")?;
        let mut me = LibNfs {
            lib,
            ctx: std::ptr::null_mut(),
            v6: soname == "libnfs.so.16",
        };
        let init: unsafe extern "C" fn() -> *mut libc::c_void = me.sym("nfs_init_context");
        me.ctx = unsafe { init() };
        assert!(!me.ctx.is_null(), "nfs_init_context");
        let timeout: unsafe extern "C" fn(*mut libc::c_void, libc::c_int) =
            me.sym("nfs_set_timeout");
        unsafe { timeout(me.ctx, 60_000) };
        let parse: unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char) -> *mut NfsUrl =
            me.sym("nfs_parse_url_dir");
        let free_url: unsafe extern "C" fn(*mut NfsUrl) = me.sym("nfs_destroy_url");
        let mount: unsafe extern "C" fn(
            *mut libc::c_void,
            *const libc::c_char,
            *const libc::c_char,
        ) -> libc::c_int = me.sym("nfs_mount");
        let c = CString::new(url).unwrap();
        let u = unsafe { parse(me.ctx, c.as_ptr()) };
        if u.is_null() {
            return Err(format!("nfs_parse_url_dir {url}: {}", me.error()));
        }
        let r = unsafe { mount(me.ctx, (*u).server, (*u).path) };
        unsafe { free_url(u) };
        if r != 0 {
            return Err(format!("nfs_mount {url}: {r} {}", me.error()));
        }
        Ok(me)
    }

    fn error(&self) -> String {
        let f: unsafe extern "C" fn(*mut libc::c_void) -> *const libc::c_char =
            self.sym("nfs_get_error");
        let p = unsafe { f(self.ctx) };
        if p.is_null() {
            return String::new();
        }
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, what: String, r: libc::c_int) {
        assert_eq!(r, 0, "libnfs {what}: {}", self.error());
    }

    fn rename(&self, from: &str, to: &str) {
        let f: unsafe extern "C" fn(
            *mut libc::c_void,
            *const libc::c_char,
            *const libc::c_char,
        ) -> libc::c_int = self.sym("nfs_rename");
        let (a, b) = (abs(from), abs(to));
        self.check(format!("rename {from} {to}"), unsafe {
            f(self.ctx, a.as_ptr(), b.as_ptr())
        });
    }

    fn unlink(&self, p: &str) {
        let f: unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char) -> libc::c_int =
            self.sym("nfs_unlink");
        let a = abs(p);
        self.check(format!("unlink {p}"), unsafe { f(self.ctx, a.as_ptr()) });
    }

    fn mkdir(&self, p: &str) {
        let f: unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char) -> libc::c_int =
            self.sym("nfs_mkdir");
        let a = abs(p);
        self.check(format!("mkdir {p}"), unsafe { f(self.ctx, a.as_ptr()) });
    }

    /// Opens `p` with `O_WRONLY | O_TRUNC` and writes `data` (an overwrite in place).
    fn overwrite(&self, p: &str, data: &[u8]) {
        type Fh = *mut libc::c_void;
        let open: unsafe extern "C" fn(
            *mut libc::c_void,
            *const libc::c_char,
            libc::c_int,
            *mut Fh,
        ) -> libc::c_int = self.sym("nfs_open");
        let close: unsafe extern "C" fn(*mut libc::c_void, Fh) -> libc::c_int =
            self.sym("nfs_close");
        let a = abs(p);
        let mut fh: Fh = std::ptr::null_mut();
        self.check(format!("open {p} O_WRONLY|O_TRUNC"), unsafe {
            open(
                self.ctx,
                a.as_ptr(),
                libc::O_WRONLY | libc::O_TRUNC,
                &mut fh,
            )
        });
        let mut done = 0;
        while done < data.len() {
            let piece = &data[done..(done + (64 << 10)).min(data.len())];
            let n = unsafe {
                if self.v6 {
                    let w: unsafe extern "C" fn(Fh, Fh, *const libc::c_void, usize) -> libc::c_int =
                        self.sym("nfs_write");
                    w(self.ctx, fh, piece.as_ptr().cast(), piece.len())
                } else {
                    let w: unsafe extern "C" fn(Fh, Fh, u64, *const libc::c_void) -> libc::c_int =
                        self.sym("nfs_write");
                    w(self.ctx, fh, piece.len() as u64, piece.as_ptr().cast())
                }
            };
            assert!(n > 0, "libnfs write {p} at {done}: {n} {}", self.error());
            done += n as usize;
        }
        self.check(format!("close {p}"), unsafe { close(self.ctx, fh) });
    }

    fn truncate(&self, p: &str, size: u64) {
        let f: unsafe extern "C" fn(*mut libc::c_void, *const libc::c_char, u64) -> libc::c_int =
            self.sym("nfs_truncate");
        let a = abs(p);
        self.check(format!("truncate {p} {size}"), unsafe {
            f(self.ctx, a.as_ptr(), size)
        });
    }
}

impl Drop for LibNfs {
    fn drop(&mut self) {
        if !self.ctx.is_null() {
            let f: unsafe extern "C" fn(*mut libc::c_void) = self.sym("nfs_destroy_context");
            unsafe { f(self.ctx) };
        }
        // The library stays loaded: unloading a library with threads of its own is unsafe.
    }
}

/// A path below the export as libnfs wants it (absolute).
fn abs(p: &str) -> CString {
    CString::new(format!("/{p}")).unwrap()
}

/// The face's URL of `rel` for the libnfs-utils tools.
fn face_url(port: u16, rel: &str) -> String {
    format!("nfs://127.0.0.1/export/{rel}?nfsport={port}&mountport={port}&version=3")
}

/// `nfs-cp LOCAL nfs://…/REL` (create or overwrite), checked; a failure carries the
/// serving daemon's log.
fn nfs_put(d: &Daemon, port: u16, local: &Path, rel: &str) {
    let url = face_url(port, rel);
    let o = run_bounded(
        "nfs-cp",
        &[local.as_os_str(), os(&url)],
        Duration::from_secs(120),
    );
    assert!(
        o.status.success(),
        "nfs-cp {} {url}: {}\ndaemon log:\n{}",
        local.display(),
        output_text(&o),
        d.log_text()
    );
}

/// `nfs-cat nfs://…/REL`, checked; a failure carries the serving daemon's log (one
/// "Failed to read from file" in a `make test` run of session 15, 0 in 85 looped runs,
/// came without it).
fn nfs_get(d: &Daemon, port: u16, rel: &str) -> Vec<u8> {
    let url = face_url(port, rel);
    let o = run_bounded("nfs-cat", &[os(&url)], Duration::from_secs(120));
    assert!(
        o.status.success(),
        "nfs-cat {url}: {}\ndaemon log:\n{}",
        output_text(&o),
        d.log_text()
    );
    o.stdout
}

#[test]
fn libnfs_client_changes_the_tree_through_the_nfs_face_while_the_crawl_runs() {
    fuse_or_skip!();
    if !source_servers::have(&["ganesha.nfsd", "rpcbind", "nfs-ls", "nfs-cp", "nfs-cat"]) {
        return;
    }
    let store = Store::new("migclients-nfs", StoreSpec::tiers(1));
    let src = store.root.join("old");
    make_source(&src, true);
    let (mut model, mut links) = describe(&src, true);
    assert_eq!(links.len(), 1, "the source has one hard-link pair");
    let ganesha = source_servers::Ganesha::start(&src);
    let source_url = format!(
        "nfs://127.0.0.1:{}{}?mountport={}",
        ganesha.nfs_port, ganesha.pseudo, ganesha.mount_port
    );
    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    // About 14 MiB at 256 KiB/s (one 256 KiB unit a second): the crawl outlasts the
    // client's changes. The client's own fetches and writes leave about 7 MiB to the
    // crawl, i.e. about 28 s of crawling, against 0.25-10 s of changes measured on a
    // loaded 2-core machine (at 1 MiB/s the crawl could end first). `finish` lifts the
    // throttle, so the low rate costs no time. The face waits for fetches (libnfs does
    // not retry JUKEBOX).
    let d = Daemon::start(
        &[
            os(&source_url),
            cfg.as_os_str(),
            os("--nfs"),
            os("127.0.0.1:0"),
            os("--jukebox-after"),
            os("0"),
            os("--mount"),
            mnt.as_os_str(),
            os("--chunk"),
            os("256KiB"),
            os("--rate"),
            os("256KiB"),
        ],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let port = d.nfs_port();
    wait_crawl_copying(&cfg);
    let before = crawl_position(&cfg);
    let started = Instant::now();
    let nfs = LibNfs::mount(&format!(
        "nfs://127.0.0.1/export?nfsport={port}&mountport={port}&version=3"
    ))
    .unwrap_or_else(|e| {
        panic!("{e}");
    });
    let local = store.root.join("client");
    fs::create_dir_all(&local).unwrap();
    let mut changes: Vec<Change> = Vec::new();
    let put = |rel: &'static str, data: Vec<u8>, changes: &mut Vec<Change>| {
        let f = local.join(rel.replace('/', "_"));
        fs::write(&f, &data).unwrap();
        nfs_put(&d, port, &f, rel);
        changes.push(Change::Write(rel, data));
    };
    // nfs-cp: a new file (it only creates: its CREATE of an existing name is refused
    // with NFS3ERR_EXIST). libnfs: stubs overwritten (O_TRUNC) with fewer and with more
    // bytes.
    put("w/new_file", bytes(900, 700 << 10), &mut changes);
    for (rel, data) in [
        ("w/over_short", bytes(901, 300 << 10)),
        ("w/over_long", bytes(902, 3 << 20)),
    ] {
        nfs.overwrite(rel, &data);
        changes.push(Change::Write(rel, data));
    }
    // libnfs: rename in place, into a new directory and a hard link; delete; truncate
    // down and up; rename a file the client made itself.
    nfs.rename("w/ren", "w/ren.moved");
    changes.push(Change::Rename("w/ren", "w/ren.moved"));
    nfs.mkdir("newdir");
    changes.push(Change::Mkdir("newdir"));
    nfs.rename("w/ren_into_dir", "newdir/moved");
    changes.push(Change::Rename("w/ren_into_dir", "newdir/moved"));
    nfs.rename("link_b", "keep/link_b");
    changes.push(Change::Rename("link_b", "keep/link_b"));
    nfs.unlink("w/del");
    changes.push(Change::Delete("w/del"));
    nfs.truncate("w/trunc_down", 4097);
    changes.push(Change::Truncate("w/trunc_down", 4097));
    nfs.truncate("w/trunc_up", (1 << 20) + 5);
    changes.push(Change::Truncate("w/trunc_up", (1 << 20) + 5));
    put("newdir/fresh", bytes(903, 12345), &mut changes);
    nfs.rename("w/new_file", "new_top");
    changes.push(Change::Rename("w/new_file", "new_top"));
    for c in &changes {
        apply(&mut model, &mut links, c);
    }
    // What the client reads back through the face is the model (stubs fetched on demand).
    for rel in [
        "w/over_short",
        "w/trunc_down",
        "w/trunc_up",
        "keep/k5",
        "w/ren.moved",
    ] {
        let Kind::File { data, .. } = &model[rel.as_bytes()].kind else {
            unreachable!()
        };
        let got = nfs_get(&d, port, rel);
        assert!(
            got == *data,
            "nfs-cat {rel}: {} bytes, the model has {}",
            got.len(),
            data.len()
        );
    }
    let took = started.elapsed();
    assert_still_crawling(&cfg, took);
    let during = crawl_position(&cfg);
    drop(nfs);
    let out = finish(&cfg, &d);
    // Modified: w/over_short, w/over_long, w/trunc_down, w/trunc_up; deleted: w/del.
    assert_client_counts(&out, 4, 1);
    assert_tree(
        &model,
        &links,
        &mnt,
        true,
        "the tree after finish (NFS face, libnfs)",
    );
    // And through the face, the same bytes.
    assert!(nfs_get(&d, port, "newdir/moved") == bytes(53, 500 << 10));
    eprintln!(
        "libnfs: {} changes in {took:?}; crawl before: {before}; after the changes: {during}\n{out}",
        changes.len()
    );
}

// ---- smbclient ----------------------------------------------------------------------------

/// `smbclient -c COMMANDS` against `server`'s share; fails on any NT_STATUS error.
fn smbclient(server: &source_servers::Samba, commands: &str) -> String {
    let out = server.smbclient(commands);
    assert!(!out.contains("NT_STATUS_"), "smbclient {commands:?}: {out}");
    out
}

#[test]
fn smbclient_changes_the_tree_through_samba_on_the_mount_while_the_crawl_runs() {
    fuse_or_skip!();
    if !source_servers::have(&["smbd", "smbpasswd", "smbclient"]) {
        return;
    }
    let store = Store::new("migclients-smb", StoreSpec::tiers(1));
    let src = store.root.join("old");
    make_source(&src, false);
    let (mut model, mut links) = describe(&src, false);
    let old = source_servers::Samba::start_read_only(&src);
    let source_url = format!(
        "smb://{}@127.0.0.1:{}/{}",
        source_servers::SMB_USER,
        old.port,
        source_servers::SMB_SHARE
    );
    let (cfg, mnt) = (store.config.clone(), store.mountpoint.clone());
    // 256 KiB/s as in the NFS test: the crawl outlasts the client's changes.
    let d = Daemon::start_env(
        &[
            os(&source_url),
            cfg.as_os_str(),
            os("--mount"),
            mnt.as_os_str(),
            os("--chunk"),
            os("256KiB"),
            os("--rate"),
            os("256KiB"),
        ],
        &[("KAISO_SMB_PASSWORD", old.password.as_str())],
        store.root.join("d.log"),
        Some(&mnt),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    // The new server: smbd exporting the daemon's mount, writable.
    let new = source_servers::Samba::start(&mnt);
    wait_crawl_copying(&cfg);
    let before = crawl_position(&cfg);
    let started = Instant::now();
    let local = store.root.join("client");
    fs::create_dir_all(&local).unwrap();
    let mut changes: Vec<Change> = Vec::new();
    let mut puts = Vec::new();
    for (i, (rel, len)) in [
        ("w/new_file", 700usize << 10),
        ("w/over_short", 300 << 10),
        ("w/over_long", 3 << 20),
        // An empty file put over a stub: smbclient's truncate (it has no other).
        ("w/trunc_down", 0),
    ]
    .into_iter()
    .enumerate()
    {
        let data = bytes(900 + i as u64, len);
        let f = local.join(rel.replace('/', "_"));
        fs::write(&f, &data).unwrap();
        puts.push(format!("put {} {}", f.display(), rel.replace('/', "\\")));
        changes.push(Change::Write(rel, data));
    }
    smbclient(&new, &puts.join("; "));
    smbclient(
        &new,
        "rename w\\ren w\\ren.moved; mkdir newdir; rename w\\ren_into_dir newdir\\moved; \
         del w\\del; rename w\\new_file new_top",
    );
    changes.extend([
        Change::Rename("w/ren", "w/ren.moved"),
        Change::Mkdir("newdir"),
        Change::Rename("w/ren_into_dir", "newdir/moved"),
        Change::Delete("w/del"),
        Change::Rename("w/new_file", "new_top"),
    ]);
    for c in &changes {
        apply(&mut model, &mut links, c);
    }
    // Reads back through Samba: stubs fetched on demand, the client's bytes.
    for rel in ["keep/k5", "w/over_short", "w/ren.moved", "w/trunc_up"] {
        let Kind::File { data, .. } = &model[rel.as_bytes()].kind else {
            unreachable!()
        };
        let f = local.join("got");
        smbclient(
            &new,
            &format!("get {} {}", rel.replace('/', "\\"), f.display()),
        );
        let got = fs::read(&f).unwrap();
        assert!(
            got == *data,
            "smbclient get {rel}: {} bytes, the model has {}",
            got.len(),
            data.len()
        );
    }
    let took = started.elapsed();
    assert_still_crawling(&cfg, took);
    let during = crawl_position(&cfg);
    drop(new);
    let out = finish(&cfg, &d);
    // Modified: w/over_short, w/over_long, w/trunc_down (put over them); deleted: w/del.
    assert_client_counts(&out, 3, 1);
    // An SMB source maps owners and modes: content, kinds and names are compared.
    assert_tree(
        &model,
        &links,
        &mnt,
        false,
        "the tree after finish (Samba on the mount, smbclient)",
    );
    eprintln!(
        "smbclient: {} changes in {took:?}; crawl before: {before}; after the changes: {during}\n{out}",
        changes.len()
    );
}
