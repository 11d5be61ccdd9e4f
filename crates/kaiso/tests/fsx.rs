//! fsx-style randomized test (issue 2, item 10): several processes do writes, truncates,
//! renames, links, unlinks and reads on files through the mount, each checked against an
//! in-memory model, while the mover moves the same files (a tiny fast tier whose
//! watermarks keep the planner busy, plus explicit `kaiso promote/demote` requests).
//!
//! Each worker is a child process: this test binary run again with only
//! `fsx_worker_process` selected and `KAISO_FSX_WORKER` naming the worker, its seed, root
//! and deadline. It writes its final model to a file, which the parent compares with the
//! tree once every worker is done (and again after a remount).
//!
//! Seeded and reproducible per worker: `KAISO_TEST_SEED=<n>` replays the operation
//! sequences (process interleaving and mover timing still vary). Bounded by
//! `KAISO_FSX_SECS` (default 12; a longer soak, e.g. `KAISO_FSX_SECS=600`, is capped at
//! one hour).

mod common;

use common::rng::{Rng, test_seed};
use common::{Store, StoreSpec, TierSpec};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const WORKERS: u64 = 8;
const NAMES: u64 = 6; // names per worker: n0..n5
const MAX_FILE: u64 = 192 * 1024;
const MAX_WRITE: u64 = 48 * 1024;
const STRIPE: u64 = 64 * 1024; // each worker's region of the shared file

/// One worker's model: names → inode ids, inode ids → contents.
#[derive(Default)]
struct Model {
    names: BTreeMap<String, u64>,
    data: BTreeMap<u64, Vec<u8>>,
    next_ino: u64,
}

impl Model {
    fn new_inode(&mut self, content: Vec<u8>) -> u64 {
        self.next_ino += 1;
        self.data.insert(self.next_ino, content);
        self.next_ino
    }
    /// Drops inodes no name (and no held fd) refers to.
    fn gc(&mut self, held: Option<u64>) {
        let live: Vec<u64> = self.names.values().copied().chain(held).collect();
        self.data.retain(|k, _| live.contains(k));
    }
}

fn secs() -> u64 {
    std::env::var("KAISO_FSX_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
        .min(3600)
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn pwrite_all(fd: i32, data: &[u8], off: u64) -> std::io::Result<()> {
    let mut done = 0;
    while done < data.len() {
        let n = unsafe {
            libc::pwrite(
                fd,
                data[done..].as_ptr().cast(),
                data.len() - done,
                (off + done as u64) as i64,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        done += n as usize;
    }
    Ok(())
}

fn pread_all(fd: i32, len: usize, off: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let mut done = 0;
    while done < len {
        let n = unsafe {
            libc::pread(
                fd,
                buf[done..].as_mut_ptr().cast(),
                len - done,
                (off + done as u64) as i64,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if n == 0 {
            break;
        }
        done += n as usize;
    }
    buf.truncate(done);
    Ok(buf)
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    if a.len() != b.len() {
        return format!("length {} != model {}", a.len(), b.len());
    }
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(0);
    format!("byte {i}: {:#04x} != model {:#04x}", a[i], b[i])
}

struct Worker {
    id: u64,
    dir: PathBuf,
    rng: Rng,
    model: Model,
    /// A descriptor kept open across operations (the file may be renamed, unlinked or
    /// moved between tiers meanwhile) and the model inode it refers to.
    held: Option<(i32, u64)>,
    shared: PathBuf,
    stripe: Vec<u8>,
    ops: u64,
    log: Vec<String>,
}

impl Worker {
    fn p(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn fail(&self, what: String) -> ! {
        let tail: Vec<&String> = self.log.iter().rev().take(20).collect();
        panic!(
            "worker {} op {}: {what}\nlast operations (newest first):\n{tail:#?}",
            self.id, self.ops
        );
    }

    fn name(&mut self) -> String {
        format!("n{}", self.rng.below(NAMES))
    }

    fn existing(&mut self) -> Option<String> {
        let names: Vec<String> = self.model.names.keys().cloned().collect();
        if names.is_empty() {
            None
        } else {
            Some(names[self.rng.below(names.len() as u64) as usize].clone())
        }
    }

    fn step(&mut self) {
        self.ops += 1;
        match self.rng.below(100) {
            0..=19 => self.op_write(),
            20..=27 => self.op_truncate(),
            28..=47 => self.op_read(),
            48..=55 => self.op_rename(),
            56..=60 => self.op_link(),
            61..=65 => self.op_unlink(),
            66..=71 => self.op_create(),
            72..=79 => self.op_held(),
            80..=87 => self.op_stripe(),
            88..=92 => self.op_mmap_read(),
            _ => self.op_fsync(),
        }
    }

    fn op_create(&mut self) {
        let name = self.name();
        let len = self.rng.below(MAX_FILE) as usize;
        let data = self.rng.bytes(len);
        self.log.push(format!("create {name} len {len}"));
        if let Err(e) = fs::write(self.p(&name), &data) {
            self.fail(format!("create {name}: {e}"));
        }
        // Writing through an existing name keeps its inode (and hard links).
        match self.model.names.get(&name).copied() {
            Some(ino) => {
                self.model.data.insert(ino, data);
            }
            None => {
                let ino = self.model.new_inode(data);
                self.model.names.insert(name, ino);
            }
        }
    }

    fn op_write(&mut self) {
        let Some(name) = self.existing() else {
            return self.op_create();
        };
        let ino = self.model.names[&name];
        let cur = self.model.data[&ino].len() as u64;
        let off = self.rng.below(cur + 4096).min(MAX_FILE);
        let len = 1 + self.rng.below(MAX_WRITE) as usize;
        let data = self.rng.bytes(len);
        let append = self.rng.chance(20);
        self.log
            .push(format!("write {name} off {off} len {len} append {append}"));
        let flags = libc::O_WRONLY | if append { libc::O_APPEND } else { 0 };
        let fd = unsafe { libc::open(c(&self.p(&name)).as_ptr(), flags | libc::O_CLOEXEC) };
        if fd < 0 {
            self.fail(format!("open {name}: {}", std::io::Error::last_os_error()));
        }
        let at = if append { cur } else { off };
        let r = pwrite_all(fd, &data, at);
        unsafe { libc::close(fd) };
        if let Err(e) = r {
            self.fail(format!("write {name}: {e}"));
        }
        let m = self.model.data.get_mut(&ino).unwrap();
        let end = at as usize + len;
        if m.len() < end {
            m.resize(end, 0);
        }
        m[at as usize..end].copy_from_slice(&data);
    }

    fn op_truncate(&mut self) {
        let Some(name) = self.existing() else { return };
        let ino = self.model.names[&name];
        let size = self.rng.below(MAX_FILE);
        self.log.push(format!("truncate {name} {size}"));
        if unsafe { libc::truncate(c(&self.p(&name)).as_ptr(), size as i64) } < 0 {
            self.fail(format!(
                "truncate {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
        self.model
            .data
            .get_mut(&ino)
            .unwrap()
            .resize(size as usize, 0);
    }

    fn op_read(&mut self) {
        let Some(name) = self.existing() else { return };
        let ino = self.model.names[&name];
        self.log.push(format!("read {name}"));
        let got = match fs::read(self.p(&name)) {
            Ok(d) => d,
            Err(e) => self.fail(format!("read {name}: {e}")),
        };
        let want = &self.model.data[&ino];
        if &got != want {
            self.fail(format!("read {name}: {}", first_diff(&got, want)));
        }
    }

    fn op_rename(&mut self) {
        let Some(from) = self.existing() else { return };
        let to = self.name();
        self.log.push(format!("rename {from} -> {to}"));
        if let Err(e) = fs::rename(self.p(&from), self.p(&to)) {
            self.fail(format!("rename {from} -> {to}: {e}"));
        }
        if from != to {
            let ino = self.model.names.remove(&from).unwrap();
            // Renaming onto another name of the same inode is a no-op in POSIX.
            if self.model.names.get(&to) == Some(&ino) {
                self.model.names.insert(from, ino);
            } else {
                self.model.names.insert(to, ino);
            }
        }
        self.model.gc(self.held.map(|h| h.1));
    }

    fn op_link(&mut self) {
        let Some(from) = self.existing() else { return };
        let to = self.name();
        if self.model.names.contains_key(&to) {
            return;
        }
        self.log.push(format!("link {from} -> {to}"));
        if let Err(e) = fs::hard_link(self.p(&from), self.p(&to)) {
            self.fail(format!("link {from} -> {to}: {e}"));
        }
        let ino = self.model.names[&from];
        self.model.names.insert(to, ino);
    }

    fn op_unlink(&mut self) {
        let Some(name) = self.existing() else { return };
        self.log.push(format!("unlink {name}"));
        if let Err(e) = fs::remove_file(self.p(&name)) {
            self.fail(format!("unlink {name}: {e}"));
        }
        self.model.names.remove(&name);
        self.model.gc(self.held.map(|h| h.1));
    }

    /// Keep one descriptor open across operations; write and read through it.
    fn op_held(&mut self) {
        match self.held {
            None => {
                let Some(name) = self.existing() else { return };
                self.log.push(format!("hold {name}"));
                let fd = unsafe {
                    libc::open(c(&self.p(&name)).as_ptr(), libc::O_RDWR | libc::O_CLOEXEC)
                };
                if fd < 0 {
                    self.fail(format!("open {name}: {}", std::io::Error::last_os_error()));
                }
                self.held = Some((fd, self.model.names[&name]));
            }
            Some((fd, ino)) => {
                if self.rng.chance(25) {
                    self.log.push("close held".into());
                    unsafe { libc::close(fd) };
                    self.held = None;
                    self.model.gc(None);
                    return;
                }
                let cur = self.model.data[&ino].len() as u64;
                let off = self.rng.below(cur + 1).min(MAX_FILE);
                let len = 1 + self.rng.below(MAX_WRITE / 4) as usize;
                let data = self.rng.bytes(len);
                self.log.push(format!("held write off {off} len {len}"));
                if let Err(e) = pwrite_all(fd, &data, off) {
                    self.fail(format!("held write: {e}"));
                }
                let m = self.model.data.get_mut(&ino).unwrap();
                let end = off as usize + len;
                if m.len() < end {
                    m.resize(end, 0);
                }
                m[off as usize..end].copy_from_slice(&data);
                let want = self.model.data[&ino].clone();
                match pread_all(fd, want.len() + 10, 0) {
                    Ok(got) if got == want => {}
                    Ok(got) => self.fail(format!("held read: {}", first_diff(&got, &want))),
                    Err(e) => self.fail(format!("held read: {e}")),
                }
            }
        }
    }

    /// Write and verify this worker's stripe of the file all workers share.
    fn op_stripe(&mut self) {
        let off = self.rng.below(STRIPE);
        let len = (1 + self.rng.below(8192)).min(STRIPE - off) as usize;
        let data = self.rng.bytes(len);
        self.log.push(format!("stripe write off {off} len {len}"));
        let fd = unsafe { libc::open(c(&self.shared).as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            self.fail(format!("open shared: {}", std::io::Error::last_os_error()));
        }
        let base = self.id * STRIPE;
        let r = pwrite_all(fd, &data, base + off);
        self.stripe[off as usize..off as usize + len].copy_from_slice(&data);
        let got = pread_all(fd, STRIPE as usize, base);
        unsafe { libc::close(fd) };
        if let Err(e) = r {
            self.fail(format!("stripe write: {e}"));
        }
        match got {
            Ok(g) if g == self.stripe => {}
            Ok(g) => self.fail(format!("stripe read: {}", first_diff(&g, &self.stripe))),
            Err(e) => self.fail(format!("stripe read: {e}")),
        }
    }

    fn op_mmap_read(&mut self) {
        let Some(name) = self.existing() else { return };
        let ino = self.model.names[&name];
        let want = self.model.data[&ino].clone();
        if want.is_empty() {
            return;
        }
        self.log.push(format!("mmap read {name}"));
        let fd =
            unsafe { libc::open(c(&self.p(&name)).as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            self.fail(format!("open {name}: {}", std::io::Error::last_os_error()));
        }
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                want.len(),
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        unsafe { libc::close(fd) };
        if p == libc::MAP_FAILED {
            self.fail(format!("mmap {name}: {}", std::io::Error::last_os_error()));
        }
        let got = unsafe { std::slice::from_raw_parts(p as *const u8, want.len()) }.to_vec();
        unsafe { libc::munmap(p, want.len()) };
        if got != want {
            self.fail(format!("mmap read {name}: {}", first_diff(&got, &want)));
        }
    }

    fn op_fsync(&mut self) {
        let Some(name) = self.existing() else { return };
        self.log.push(format!("fsync {name}"));
        let f = match fs::OpenOptions::new().write(true).open(self.p(&name)) {
            Ok(f) => f,
            Err(e) => self.fail(format!("open {name}: {e}")),
        };
        if let Err(e) = f.sync_all() {
            self.fail(format!("fsync {name}: {e}"));
        }
    }

    /// Full comparison of the directory against the model.
    fn verify_all(&self, root: &Path) {
        let dir = root.join(format!("w{}", self.id));
        let mut on_disk: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        on_disk.sort();
        let names: Vec<String> = self.model.names.keys().cloned().collect();
        assert_eq!(
            on_disk, names,
            "worker {}: names differ from the model",
            self.id
        );
        let mut inos: BTreeMap<u64, u64> = BTreeMap::new();
        for (name, ino) in &self.model.names {
            let got = fs::read(dir.join(name)).unwrap();
            let want = &self.model.data[ino];
            assert!(
                &got == want,
                "worker {}: {name}: {} (seed replay: see the seed above)",
                self.id,
                first_diff(&got, want)
            );
            let real = std::os::unix::fs::MetadataExt::ino(&fs::metadata(dir.join(name)).unwrap());
            if let Some(prev) = inos.insert(*ino, real) {
                assert_eq!(
                    prev, real,
                    "worker {}: hard link {name} lost its inode",
                    self.id
                );
            }
        }
        let shared = fs::read(root.join("shared")).unwrap();
        let s = (self.id * STRIPE) as usize;
        assert!(
            shared[s..s + STRIPE as usize] == self.stripe[..],
            "worker {}: shared stripe differs",
            self.id
        );
    }
}

/// Asks the running store to move `rel` one tier up or down (the `kaiso promote/demote`
/// operator commands, with `--config` and a store-relative path; the form with a path
/// inside the mount is tested in faults.rs). Errors are returned, not fatal: the file may
/// just have been renamed.
fn request_move(config: &Path, rel: &str, up: bool) -> Result<(), String> {
    let out = common::run_kaiso(&[
        if up { "promote" } else { "demote" },
        "--config",
        &config.to_string_lossy(),
        rel,
    ]);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The environment variable that makes this binary a worker process (see
/// [`fsx_worker_process`]): "ID SEED DEADLINE_MS_FROM_NOW ROOT OUT".
const WORKER_ENV: &str = "KAISO_FSX_WORKER";

/// Runs `WORKERS` worker processes on `root` until `deadline`; the finished workers'
/// models and the first failure (a worker's exit status and output).
fn run_workers(root: &Path, seed: u64, deadline: Instant) -> (Vec<Worker>, Option<String>) {
    let out_dir = common::temp_dir("fsx-models");
    let _cleanup = RemoveOnDrop(out_dir.clone());
    let exe = std::env::current_exe().unwrap();
    let left_ms = deadline
        .saturating_duration_since(Instant::now())
        .as_millis();
    let children: Vec<_> = (0..WORKERS)
        .map(|id| {
            let out = out_dir.join(format!("w{id}.model"));
            let log = out_dir.join(format!("w{id}.log"));
            let logf = fs::File::create(&log).unwrap();
            let child = std::process::Command::new(&exe)
                .args(["fsx_worker_process", "--exact", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(
                    WORKER_ENV,
                    format!(
                        "{id} {} {left_ms} {} {}",
                        seed.wrapping_add(id),
                        root.display(),
                        out.display()
                    ),
                )
                .stdin(std::process::Stdio::null())
                .stdout(logf.try_clone().unwrap())
                .stderr(logf)
                .spawn()
                .expect("spawn worker process");
            (id, child, out, log)
        })
        .collect();
    let mut done = Vec::new();
    let mut failed = None;
    // Bounded wait: a worker stuck in a system call on the mount must not hang the test.
    let limit = deadline + Duration::from_secs(60);
    for (id, mut child, out, log) in children {
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let text = fs::read_to_string(&log).unwrap_or_default();
        match (status, Worker::load(&out)) {
            (Some(st), Some(w)) if st.success() => done.push(w),
            (st, _) => {
                let why = format!(
                    "worker process {id} (seed {}) ended with {st:?}:\n{text}",
                    seed.wrapping_add(id)
                );
                failed = failed.or(Some(why));
            }
        }
    }
    (done, failed)
}

/// One fsx worker, when this binary was started by [`run_workers`] (otherwise it returns
/// at once: the real tests below start it).
#[test]
fn fsx_worker_process() {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return;
    };
    let mut it = spec.splitn(5, ' ');
    let mut num = || -> u64 { it.next().unwrap().parse().unwrap() };
    let (id, seed, left_ms) = (num(), num(), num());
    let root = PathBuf::from(it.next().unwrap());
    let out = PathBuf::from(it.next().unwrap());
    let deadline = Instant::now() + Duration::from_millis(left_ms);
    let mut w = Worker {
        id,
        dir: root.join(format!("w{id}")),
        rng: Rng::new(seed),
        model: Model::default(),
        held: None,
        shared: root.join("shared"),
        stripe: vec![0u8; STRIPE as usize],
        ops: 0,
        log: Vec::new(),
    };
    while Instant::now() < deadline {
        w.step();
        if w.log.len() > 200 {
            w.log.drain(..100);
        }
    }
    if let Some((fd, _)) = w.held.take() {
        unsafe { libc::close(fd) };
    }
    w.model.gc(None);
    w.save(&out);
}

impl Worker {
    /// Writes the final model (id, operation count, names, contents, stripe).
    fn save(&self, path: &Path) {
        let mut b = Vec::new();
        let put = |b: &mut Vec<u8>, v: u64| b.extend_from_slice(&v.to_le_bytes());
        put(&mut b, self.id);
        put(&mut b, self.ops);
        put(&mut b, self.model.names.len() as u64);
        for (name, ino) in &self.model.names {
            put(&mut b, name.len() as u64);
            b.extend_from_slice(name.as_bytes());
            put(&mut b, *ino);
        }
        put(&mut b, self.model.data.len() as u64);
        for (ino, data) in &self.model.data {
            put(&mut b, *ino);
            put(&mut b, data.len() as u64);
            b.extend_from_slice(data);
        }
        put(&mut b, self.stripe.len() as u64);
        b.extend_from_slice(&self.stripe);
        let tmp = path.with_extension("tmp");
        fs::write(&tmp, &b).unwrap();
        fs::rename(&tmp, path).unwrap();
    }

    /// Reads a model written by [`Worker::save`] (None if missing or cut short).
    fn load(path: &Path) -> Option<Worker> {
        let b = fs::read(path).ok()?;
        let mut r = Reader { b: &b, pos: 0 };
        let id = r.u64()?;
        let ops = r.u64()?;
        let mut model = Model::default();
        for _ in 0..r.u64()? {
            let n = r.u64()? as usize;
            let name = String::from_utf8(r.bytes(n)?.to_vec()).ok()?;
            model.names.insert(name, r.u64()?);
        }
        for _ in 0..r.u64()? {
            let ino = r.u64()?;
            let n = r.u64()? as usize;
            model.data.insert(ino, r.bytes(n)?.to_vec());
        }
        let n = r.u64()? as usize;
        let stripe = r.bytes(n)?.to_vec();
        Some(Worker {
            id,
            dir: PathBuf::new(),
            rng: Rng::new(0),
            model,
            held: None,
            shared: PathBuf::new(),
            stripe,
            ops,
            log: Vec::new(),
        })
    }
}

/// Reads little-endian numbers and byte strings from a saved model.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(s)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

fn prepare(root: &Path) {
    fs::write(root.join("shared"), vec![0u8; (WORKERS * STRIPE) as usize]).unwrap();
    for w in 0..WORKERS {
        fs::create_dir(root.join(format!("w{w}"))).unwrap();
    }
}

/// The same workers on a plain directory for a few seconds: validates the model itself,
/// so a failure of the mount run is kaiso's.
#[test]
fn fsx_model_holds_on_plain_directory() {
    let seed = test_seed("fsx_model_holds_on_plain_directory");
    let root = common::temp_dir("fsx-plain");
    let _cleanup = RemoveOnDrop(root.clone());
    prepare(&root);
    let (done, failed) = run_workers(&root, seed, Instant::now() + Duration::from_secs(4));
    if let Some(why) = failed {
        panic!("{why}");
    }
    for w in &done {
        w.verify_all(&root);
    }
    let ops: u64 = done.iter().map(|w| w.ops).sum();
    assert!(ops > 1000, "only {ops} operations in 4 s");
}

#[test]
fn fsx_while_mover_moves() {
    fuse_or_skip!();
    let seed = test_seed("fsx_while_mover_moves");
    const MIB: u64 = 1 << 20;
    // A 2 MiB fast tier kept between 20% and 40%: the working set (about 4-5 MiB) never
    // fits, so the planner promotes and demotes all the time.
    let store = Store::new(
        "fsx",
        StoreSpec::with_tiers(vec![
            TierSpec::new("fast").capacity(2 * MIB).watermarks(0.2, 0.4),
            TierSpec::new("mid").capacity(64 * MIB),
            TierSpec::new("slow"),
        ])
        .mover_interval_ms(100),
    );
    let mount = store.mount();
    let root = mount.path.clone();
    prepare(&root);

    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(secs());

    // The mover driver: explicit promote/demote requests on random names.
    let moves_ok = Arc::new(AtomicU64::new(0));
    let move_errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let driver = {
        let (stop, root, ok, errs, config) = (
            stop.clone(),
            root.clone(),
            moves_ok.clone(),
            move_errors.clone(),
            store.config.clone(),
        );
        std::thread::spawn(move || {
            let mut rng = Rng::new(seed ^ 0xd15c);
            while !stop.load(Ordering::Relaxed) {
                let rel = if rng.chance(30) {
                    "shared".to_string()
                } else {
                    format!("w{}/n{}", rng.below(WORKERS), rng.below(NAMES))
                };
                if !root.join(&rel).exists() {
                    continue;
                }
                match request_move(&config, &rel, rng.chance(50)) {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        let mut v = errs.lock().unwrap();
                        if v.len() < 20 {
                            v.push(e)
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(30));
            }
        })
    };
    // Samples where the shared file lives, to prove moves happened under load.
    let shared_moves = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, tiers, moved) = (stop.clone(), store.tiers.clone(), shared_moves.clone());
        std::thread::spawn(move || {
            let mut last: Option<Vec<usize>> = None;
            while !stop.load(Ordering::Relaxed) {
                let now: Vec<usize> = (0..tiers.len())
                    .filter(|i| tiers[*i].join("shared").exists())
                    .collect();
                if now.len() == 1 && last.as_ref().is_some_and(|l| l.len() == 1 && *l != now) {
                    moved.fetch_add(1, Ordering::Relaxed);
                }
                if now.len() == 1 {
                    last = Some(now);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    let (done, failed) = run_workers(&root, seed, deadline);
    stop.store(true, Ordering::Relaxed);
    driver.join().unwrap();
    sampler.join().unwrap();
    if let Some(why) = failed {
        panic!("{why}\ndaemon log:\n{}", mount.log_text());
    }
    let ops: u64 = done.iter().map(|w| w.ops).sum();
    eprintln!(
        "fsx: {ops} operations, {} move requests accepted, shared file moved {} times",
        moves_ok.load(Ordering::Relaxed),
        shared_moves.load(Ordering::Relaxed)
    );
    for w in &done {
        w.verify_all(&root);
    }
    assert!(
        moves_ok.load(Ordering::Relaxed) > 0,
        "no promote/demote request succeeded: {:?}",
        move_errors.lock().unwrap()
    );
    assert!(
        shared_moves.load(Ordering::Relaxed) >= 1,
        "the shared file was never seen changing tier while in use"
    );

    // Everything again after a remount, then the tiers themselves.
    mount.unmount();
    let mount = store.mount();
    for w in &done {
        w.verify_all(&mount.path);
    }
    mount.unmount();
    let mut seen: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (t, files) in store.files_per_tier().into_iter().enumerate() {
        for f in files {
            seen.entry(f).or_default().push(t);
        }
    }
    let dup: Vec<_> = seen.iter().filter(|(_, t)| t.len() > 1).collect();
    assert!(
        dup.is_empty(),
        "names on more than one tier after unmount: {dup:?}"
    );
    // A hard-link group never spans tiers.
    for w in &done {
        let mut groups: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (name, ino) in &w.model.names {
            let rel = format!("w{}/{name}", w.id);
            for t in store.tiers_holding(&rel) {
                groups.entry(*ino).or_default().push(t);
            }
        }
        for (ino, tiers) in groups {
            let mut t = tiers.clone();
            t.dedup();
            assert!(
                t.len() == 1,
                "worker {}: link group {ino} spans tiers {tiers:?}",
                w.id
            );
        }
    }
}

/// Removes a directory when dropped, also while the test panics.
struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
