//! How a POSIX case runs: once on a plain directory, then on a kaiso mount with kernel
//! passthrough and on one without, and every set of observations must be identical.
//!
//! A case is a function `fn(&mut Env, &mut Rec)`. It records observations with
//! `rec.want(label, value, expected)`: the value must equal the expectation.
//! On the plain directory every expectation must hold (this validates the case itself);
//! on the mount every observation must equal the plain one. Observations hold only
//! relative names, errno names, contents and attributes, never absolute paths or inode
//! numbers, so they compare across the two runs.

use crate::common::{self, Mount, Store, StoreSpec, cstr, errno_name};
use std::ffi::CString;
use std::fmt::Display;
use std::fs;
use std::path::{Path, PathBuf};

/// Files written before the case runs: (tier index, relative path, contents). On the
/// mount they are written straight into that tier's directory before mounting, so cases
/// can arrange files on different tiers; on the plain directory they are written in place.
pub type Seeds<'a> = &'a [(usize, &'a str, &'a [u8])];

/// Number of tiers of the test store.
pub const TIERS: usize = 3;

pub enum Backend<'s> {
    Plain,
    Kaiso {
        store: &'s Store,
        mount: Option<Mount>,
    },
}

pub struct Env<'s> {
    pub root: PathBuf,
    pub backend: Backend<'s>,
    /// Unclean daemon exits seen on remounts (asserted after the observations).
    pub exit_failures: Vec<String>,
}

impl Env<'_> {
    /// Absolute path of a name inside the tree under test.
    pub fn p(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    pub fn c(&self, rel: &str) -> CString {
        cstr(&self.p(rel))
    }

    /// Unmount and mount again (a no-op on the plain directory).
    pub fn remount(&mut self) {
        if let Backend::Kaiso { store, mount } = &mut self.backend {
            let m = mount.take().expect("mounted");
            let status = m.unmount();
            if !status.success() {
                self.exit_failures.push(format!(
                    "daemon exited with {status} on a remount's unmount"
                ));
            }
            *mount = Some(store.mount());
        }
    }
}

#[derive(Default)]
pub struct Rec {
    pub obs: Vec<(String, String)>,
    pub failures: Vec<String>,
}

impl Rec {
    /// Records an observation that must also equal `expected`.
    pub fn want(&mut self, label: &str, value: impl Display, expected: impl Display) {
        let (v, e) = (value.to_string(), expected.to_string());
        if v != e {
            self.failures
                .push(format!("{label}: got {v:?}, expected {e:?}"));
        }
        self.obs.push((label.to_string(), v));
    }
}

/// Runs `case` on a plain directory and on two kaiso mounts, one with kernel passthrough
/// (the default: the kernel serves reads, writes and mmap of resident files from the
/// backing file) and one without (every READ/WRITE goes through kaiso's own data path, as
/// on emulated tiers, for migration stubs, writers without room for a reserve and kernels
/// before 6.9), and compares each with the plain directory.
pub fn run_case(name: &str, seeds: Seeds, case: fn(&mut Env, &mut Rec)) {
    unsafe { libc::umask(0o022) };

    // The plain half: also checks the case's own expectations.
    let plain = common::temp_dir(&format!("{name}-plain"));
    let plain_guard = RemoveOnDrop(plain.clone());
    for (_, rel, data) in seeds {
        write_seed(&plain.join(rel), data);
    }
    let mut env = Env {
        root: plain.clone(),
        backend: Backend::Plain,
        exit_failures: Vec::new(),
    };
    let mut want = Rec::default();
    case(&mut env, &mut want);
    assert!(
        want.failures.is_empty(),
        "case {name} does not hold on a plain directory (the test is wrong):\n{}",
        want.failures.join("\n")
    );
    drop(plain_guard);

    if let Some(reason) = common::fuse_unavailable() {
        eprintln!("{name}: kaiso half skipped: {reason}");
        return;
    }
    // The two mounts side by side: most of a pass is waiting (mount, unmount, the
    // daemon's replies), so this keeps the suite's added time small.
    std::thread::scope(|s| {
        let without = s.spawn(|| run_kaiso(name, seeds, case, &want, false));
        let with = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_kaiso(name, seeds, case, &want, true)
        }));
        for r in [with, without.join()] {
            if let Err(panic) = r {
                std::panic::resume_unwind(panic);
            }
        }
    });
}

/// The kaiso half of [`run_case`]: the case on a fresh mount (with or without kernel
/// passthrough), its observations compared with the plain directory's (`want`).
fn run_kaiso(
    name: &str,
    seeds: Seeds,
    case: fn(&mut Env, &mut Rec),
    want: &Rec,
    passthrough: bool,
) {
    let mut spec = StoreSpec::tiers(TIERS).allow_other();
    let tag = if passthrough {
        name.to_string()
    } else {
        spec = spec.extra("passthrough = false");
        format!("{name}-nopt")
    };
    let how = if passthrough {
        "with passthrough"
    } else {
        "without passthrough"
    };
    let store = Store::new(&tag, spec);
    for (tier, rel, data) in seeds {
        store.seed(*tier, rel, data);
    }
    let mount = store.mount();
    let mut env = Env {
        root: store.mountpoint.clone(),
        backend: Backend::Kaiso {
            store: &store,
            mount: Some(mount),
        },
        exit_failures: Vec::new(),
    };
    let mut got = Rec::default();
    case(&mut env, &mut got);
    let mut exit_failures = std::mem::take(&mut env.exit_failures);
    let log;
    if let Backend::Kaiso { mount, .. } = &mut env.backend {
        let m = mount.take().expect("mounted");
        let status = m.unmount();
        log = m_log(&store);
        if !status.success() {
            exit_failures.push(format!("daemon exited with {status} after the case"));
        }
    } else {
        unreachable!()
    }

    let diff = compare(&want.obs, &got.obs);
    assert!(
        diff.is_empty(),
        "case {name}: kaiso {how} differs from a plain directory:\n{}\n(daemon log:\n{log})",
        diff.join("\n")
    );
    // After unmount, every name lives on exactly one tier.
    let mut seen = std::collections::BTreeMap::<String, Vec<usize>>::new();
    for (tier, files) in store.files_per_tier().into_iter().enumerate() {
        for f in files {
            seen.entry(f).or_default().push(tier);
        }
    }
    let dup: Vec<String> = seen
        .iter()
        .filter(|(_, t)| t.len() > 1)
        .map(|(f, t)| format!("{f} on tiers {t:?}"))
        .collect();
    assert!(
        dup.is_empty(),
        "case {name} ({how}): names on more than one tier: {dup:?}"
    );
    // The daemon's exit status on unmount is asserted by faults.rs
    // (`unmount_exits_cleanly`); here it is only reported.
    if !exit_failures.is_empty() {
        eprintln!(
            "case {name} ({how}): unclean daemon exit: {exit_failures:?}\n(daemon logs:\n{log})"
        );
    }
}

/// Every daemon log of the store (one per mount).
fn m_log(store: &Store) -> String {
    let mut logs: Vec<PathBuf> = fs::read_dir(&store.root)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    logs.retain(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("mount-"))
    });
    logs.sort();
    logs.iter()
        .map(|p| fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("---\n")
}

fn compare(want: &[(String, String)], got: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..want.len().max(got.len()) {
        match (want.get(i), got.get(i)) {
            (Some(w), Some(g)) if w == g => {}
            (Some(w), Some(g)) => out.push(format!(
                "  {}: plain {:?}, kaiso {:?}{}",
                w.0,
                w.1,
                g.1,
                if w.0 != g.0 {
                    format!(" (kaiso label {})", g.0)
                } else {
                    String::new()
                }
            )),
            (Some(w), None) => out.push(format!("  {}: plain {:?}, kaiso: missing", w.0, w.1)),
            (None, Some(g)) => out.push(format!("  {}: plain: missing, kaiso {:?}", g.0, g.1)),
            (None, None) => {}
        }
    }
    out
}

fn write_seed(p: &Path, data: &[u8]) {
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).expect("seed dir");
    }
    fs::write(p, data).expect("seed");
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

// ---------------------------------------------------------------------------------------
// libc wrappers that report errno names.

/// An owned file descriptor.
pub struct Fd(pub i32);
impl Drop for Fd {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

pub fn open(p: &Path, flags: i32, mode: u32) -> Result<Fd, String> {
    let c = cstr(p);
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, mode) };
    if fd < 0 {
        Err(errno_name(common::errno()))
    } else {
        Ok(Fd(fd))
    }
}

/// "OK" or the errno of an open.
pub fn open_rc(p: &Path, flags: i32, mode: u32) -> String {
    match open(p, flags, mode) {
        Ok(_) => "OK".into(),
        Err(e) => e,
    }
}

pub fn pwrite(fd: &Fd, data: &[u8], off: i64) -> String {
    let n = unsafe { libc::pwrite(fd.0, data.as_ptr().cast(), data.len(), off) };
    if n < 0 {
        errno_name(common::errno())
    } else {
        format!("{n}")
    }
}

pub fn write(fd: &Fd, data: &[u8]) -> String {
    let n = unsafe { libc::write(fd.0, data.as_ptr().cast(), data.len()) };
    if n < 0 {
        errno_name(common::errno())
    } else {
        format!("{n}")
    }
}

pub fn pread(fd: &Fd, len: usize, off: i64) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; len];
    let n = unsafe { libc::pread(fd.0, buf.as_mut_ptr().cast(), len, off) };
    if n < 0 {
        Err(errno_name(common::errno()))
    } else {
        buf.truncate(n as usize);
        Ok(buf)
    }
}

pub fn fstat(fd: &Fd) -> libc::stat {
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::fstat(fd.0, &mut st) };
    assert_eq!(r, 0, "fstat");
    st
}

/// Whole contents of a file, or the errno of the failing step.
pub fn read_all(p: &Path) -> Result<Vec<u8>, String> {
    fs::read(p).map_err(|e| errno_name(e.raw_os_error().unwrap_or(0)))
}

/// Contents as a short printable observation ("ENOENT" or "len:digest").
pub fn content(p: &Path) -> String {
    match read_all(p) {
        Ok(d) if d.len() <= 64 && d.iter().all(|b| b.is_ascii_graphic() || *b == b' ') => {
            format!("{:?}", String::from_utf8_lossy(&d))
        }
        Ok(d) => format!("{:?}", common::fingerprint(&d)),
        Err(e) => e,
    }
}

pub fn write_file(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

/// File type and permission bits, e.g. "file 644".
pub fn kind_mode(st: &libc::stat) -> String {
    let kind = match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => "file",
        libc::S_IFDIR => "dir",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFCHR => "chardev",
        libc::S_IFBLK => "blockdev",
        libc::S_IFSOCK => "socket",
        _ => "unknown",
    };
    format!("{kind} {:o}", st.st_mode & 0o7777)
}

pub fn lstat_desc(p: &Path) -> String {
    match common::lstat(p) {
        Ok(st) => format!(
            "{} size={} nlink={}",
            kind_mode(&st),
            st.st_size,
            st.st_nlink
        ),
        Err(e) => e,
    }
}
