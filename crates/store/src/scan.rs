//! The tier walk of [`Store::scan`](crate::store::Store): lists tier directories on worker
//! threads, ahead of the thread that merges them into the namespace index.
//!
//! The merge stays serial and takes the listings in its own order (depth first, tier by
//! tier), so the index, the numbers handed out, conflicts, hard links and remaps come out
//! exactly as from a serial walk; only the system calls run in parallel. A worker lists
//! one directory at a time: `readdir`, then one `fstatat` relative to the open directory
//! per name that is not a directory (a directory's entry type is enough: the index needs
//! no size of it), and queues the subdirectories it found as new jobs, last found on top,
//! so the workers go the way the merge goes. The merge asks for the listing it needs next
//! ([`Walk::take`]): it waits if a worker is on it, and lists it itself if nobody started
//! it yet. Listings a merge will never need (a directory shadowed by a file of an earlier
//! tier) are dropped with [`Walk::skip`], and so is everything queued below them. Workers
//! stop taking jobs while [`BUFFERED_MAX`] names wait for the merge, which bounds the
//! memory a fast walk of a slow merge can use.

use crate::longpath::BackingPath;
use crate::orphan::ORPHAN_DIR;
use crate::store::TEMP_PREFIX;
use crate::util;
use std::collections::HashMap;
use std::ffi::{CStr, OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Names listed by the workers but not yet taken by the merge, past which workers wait.
const BUFFERED_MAX: usize = 1 << 18;

/// Identifies one directory listing of the walk.
pub(crate) type JobId = u64;

/// One name of a tier directory, with what the merge needs of it.
#[derive(Debug)]
pub(crate) struct Entry {
    pub name: OsString,
    pub kind: EntryKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EntryKind {
    /// A directory; its own listing is job `JobId`.
    Dir(JobId),
    /// Anything else, with the fields of its `lstat` the index uses.
    Other {
        mode: u32,
        ino: u64,
        size: u64,
        nlink: u64,
    },
    /// A kaiso temporary name (not looked at; the merge removes it).
    Temp,
}

enum Job {
    /// Not started: tier index and tier-relative path.
    Queued(usize, PathBuf),
    /// A worker (or the merge) is listing it.
    Running,
    /// Listed, waiting for the merge.
    Done(io::Result<Vec<Entry>>),
    /// Dropped while running: its result is thrown away.
    Skipped,
}

struct State {
    jobs: HashMap<JobId, Job>,
    /// Queued jobs, the next on top (entries whose job is gone are passed over).
    queue: Vec<JobId>,
    next_id: JobId,
    /// Names in `Done` listings.
    buffered: usize,
    /// The most `buffered` ever was.
    #[cfg(test)]
    peak: usize,
    stop: bool,
}

/// A walk of some tiers in progress; see the module comment.
pub(crate) struct Walk<'a> {
    roots: &'a [PathBuf],
    buffered_max: usize,
    state: Mutex<State>,
    /// Signalled on every change of `state`.
    changed: Condvar,
}

impl<'a> Walk<'a> {
    /// Walk the trees under `roots` (tier root directories) with `workers` threads (0:
    /// the merge lists every directory itself) while `merge` runs; the root listing of
    /// tier `i` is job `i`. The workers end when `merge` returns.
    pub(crate) fn run<R>(
        roots: &'a [PathBuf],
        workers: usize,
        merge: impl FnOnce(&Walk) -> R,
    ) -> R {
        Self::run_bounded(roots, workers, BUFFERED_MAX, merge)
    }

    /// [`Walk::run`] with workers waiting while `buffered_max` names wait for the merge.
    fn run_bounded<R>(
        roots: &'a [PathBuf],
        workers: usize,
        buffered_max: usize,
        merge: impl FnOnce(&Walk) -> R,
    ) -> R {
        let walk = Walk {
            roots,
            buffered_max,
            state: Mutex::new(State {
                jobs: (0..roots.len())
                    .map(|i| (i as JobId, Job::Queued(i, PathBuf::new())))
                    .collect(),
                // The first tier on top: the merge takes the tiers in order.
                queue: (0..roots.len() as JobId).rev().collect(),
                next_id: roots.len() as JobId,
                buffered: 0,
                #[cfg(test)]
                peak: 0,
                stop: false,
            }),
            changed: Condvar::new(),
        };
        std::thread::scope(|s| {
            for i in 0..workers {
                let w = &walk;
                let r = std::thread::Builder::new()
                    .name(format!("kaiso-scan-{i}"))
                    .spawn_scoped(s, move || w.work());
                if let Err(e) = r {
                    // The merge lists what no worker takes.
                    tracing::warn!(error = %e, "cannot start a tier scan thread");
                    break;
                }
            }
            // Stop the workers however the merge ends (a panic included).
            struct StopOnDrop<'w, 'a>(&'w Walk<'a>);
            impl Drop for StopOnDrop<'_, '_> {
                fn drop(&mut self) {
                    self.0.lock().stop = true;
                    self.0.changed.notify_all();
                }
            }
            let _stop = StopOnDrop(&walk);
            merge(&walk)
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The listing of job `id` (each job is taken or skipped once): waits while a worker
    /// lists it, lists it here if none has started.
    pub(crate) fn take(&self, id: JobId) -> io::Result<Vec<Entry>> {
        let mut st = self.lock();
        loop {
            match st.jobs.remove(&id) {
                Some(Job::Done(r)) => {
                    st.buffered -= r.as_ref().map_or(0, |e| e.len());
                    drop(st);
                    self.changed.notify_all();
                    return r;
                }
                Some(Job::Queued(tier, rel)) => {
                    st.jobs.insert(id, Job::Running);
                    drop(st);
                    let r = self.list_and_queue(tier, &rel);
                    self.lock().jobs.remove(&id);
                    return r;
                }
                Some(j @ (Job::Running | Job::Skipped)) => {
                    st.jobs.insert(id, j);
                    st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                None => {
                    debug_assert!(false, "scan job {id} taken twice");
                    return Ok(Vec::new());
                }
            }
        }
    }

    /// The merge will not take job `id`: drop it, and every job found below it.
    pub(crate) fn skip(&self, id: JobId) {
        let mut st = self.lock();
        let mut todo = vec![id];
        while let Some(id) = todo.pop() {
            match st.jobs.remove(&id) {
                Some(Job::Running) => {
                    st.jobs.insert(id, Job::Skipped);
                }
                Some(Job::Done(r)) => {
                    let entries = r.unwrap_or_default();
                    st.buffered -= entries.len();
                    todo.extend(entries.iter().filter_map(|e| match e.kind {
                        EntryKind::Dir(j) => Some(j),
                        _ => None,
                    }));
                }
                Some(Job::Queued(..) | Job::Skipped) | None => {}
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// A worker: takes the top queued job until the walk stops.
    fn work(&self) {
        let mut st = self.lock();
        loop {
            if st.stop {
                return;
            }
            let next = if st.buffered >= self.buffered_max {
                None
            } else {
                st.queue.pop()
            };
            let Some(id) = next else {
                st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            };
            let Some(Job::Queued(tier, rel)) = st.jobs.remove(&id) else {
                // Taken by the merge, or skipped.
                continue;
            };
            st.jobs.insert(id, Job::Running);
            drop(st);
            // Should listing panic, the merge must not wait for this job forever.
            struct FailOnUnwind<'w, 'a>(&'w Walk<'a>, JobId);
            impl Drop for FailOnUnwind<'_, '_> {
                fn drop(&mut self) {
                    if std::thread::panicking() {
                        let mut st = self.0.lock();
                        if let Some(j @ Job::Running) = st.jobs.get_mut(&self.1) {
                            *j = Job::Done(Err(io::Error::other("tier scan thread failed")));
                        }
                        drop(st);
                        self.0.changed.notify_all();
                    }
                }
            }
            let guard = FailOnUnwind(self, id);
            let r = self.list_and_queue(tier, &rel);
            std::mem::forget(guard);
            st = self.lock();
            let State { jobs, buffered, .. } = &mut *st;
            match jobs.get_mut(&id) {
                Some(j @ Job::Running) => {
                    *buffered += r.as_ref().map_or(0, |e| e.len());
                    *j = Job::Done(r);
                    #[cfg(test)]
                    {
                        st.peak = st.peak.max(st.buffered);
                    }
                }
                _ => {
                    // Skipped meanwhile: so is everything below it.
                    st.jobs.remove(&id);
                    let below: Vec<JobId> = r
                        .iter()
                        .flatten()
                        .filter_map(|e| match e.kind {
                            EntryKind::Dir(j) => Some(j),
                            _ => None,
                        })
                        .collect();
                    drop(st);
                    for j in below {
                        self.skip(j);
                    }
                    st = self.lock();
                }
            }
            self.changed.notify_all();
        }
    }

    /// List directory `rel` of tier `tier` and queue its subdirectories (their
    /// job numbers are in the entries).
    fn list_and_queue(&self, tier: usize, rel: &Path) -> io::Result<Vec<Entry>> {
        let mut entries = list_dir(&self.roots[tier], rel)?;
        let subdirs: Vec<(usize, PathBuf)> = entries
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.kind, EntryKind::Dir(_)))
            .map(|(i, e)| (i, rel.join(&e.name)))
            .collect();
        if subdirs.is_empty() {
            return Ok(entries);
        }
        let mut st = self.lock();
        for (i, child) in subdirs {
            let j = st.next_id;
            st.next_id += 1;
            st.jobs.insert(j, Job::Queued(tier, child));
            st.queue.push(j);
            entries[i].kind = EntryKind::Dir(j);
        }
        drop(st);
        self.changed.notify_all();
        Ok(entries)
    }
}

/// The names of directory `rel` under `root`, in `readdir` order, without `.` and `..`
/// (and without the orphan directory at the top). Subdirectories come as `Dir(0)`; a name
/// that is gone before its `fstatat` is left out. A `readdir` error ends the listing
/// (with a warning), as `std::fs::read_dir` does.
pub(crate) fn list_dir(root: &Path, rel: &Path) -> io::Result<Vec<Entry>> {
    let path = BackingPath::resolve(root, rel);
    let c = util::cpath(&path)?;
    let at_top = rel.as_os_str().is_empty();
    // Below the root, a directory replaced by a symlink since its parent was listed is not
    // followed out of the tier.
    let nofollow = if at_top { 0 } else { libc::O_NOFOLLOW };
    // SAFETY: a valid C string; the descriptor is owned by the stream below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is an open directory; on success the stream owns it.
    let dir = unsafe { libc::fdopendir(fd) };
    if dir.is_null() {
        let e = io::Error::last_os_error();
        // SAFETY: still ours.
        unsafe { libc::close(fd) };
        return Err(e);
    }
    struct Stream(*mut libc::DIR);
    impl Drop for Stream {
        fn drop(&mut self) {
            // SAFETY: opened above, closed once.
            unsafe { libc::closedir(self.0) };
        }
    }
    let dir = Stream(dir);
    // SAFETY: the stream is open.
    let dfd = unsafe { libc::dirfd(dir.0) };
    let mut out = Vec::new();
    loop {
        // SAFETY: errno is thread-local; readdir64 on an open stream; the entry stays
        // valid until the next readdir64 on this stream.
        let ent = unsafe {
            *libc::__errno_location() = 0;
            libc::readdir64(dir.0)
        };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(0) {
                tracing::warn!(path = %path.display(), error = %e, "directory listing ended early");
            }
            break;
        }
        // SAFETY: see above.
        let (cname, d_type) = unsafe { (CStr::from_ptr((*ent).d_name.as_ptr()), (*ent).d_type) };
        let bytes = cname.to_bytes();
        if bytes == b"." || bytes == b".." {
            continue;
        }
        if at_top && bytes == ORPHAN_DIR.as_bytes() {
            // Hidden copies of open files with no name (`clean_orphans`).
            continue;
        }
        let kind = if bytes.starts_with(TEMP_PREFIX.as_bytes()) {
            EntryKind::Temp
        } else if d_type == libc::DT_DIR {
            EntryKind::Dir(0)
        } else {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: valid descriptor, C string and out pointer.
            let r = unsafe {
                libc::fstatat(
                    dfd,
                    cname.as_ptr(),
                    st.as_mut_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if r != 0 {
                // Gone since the readdir.
                continue;
            }
            // SAFETY: fstatat filled it.
            let st = unsafe { st.assume_init() };
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                EntryKind::Dir(0)
            } else {
                EntryKind::Other {
                    mode: st.st_mode,
                    ino: st.st_ino,
                    size: st.st_size as u64,
                    // `nlink_t` is 32 bits on some targets.
                    #[allow(clippy::unnecessary_cast)]
                    nlink: st.st_nlink as u64,
                }
            }
        };
        out.push(Entry {
            name: OsStr::from_bytes(bytes).to_os_string(),
            kind,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::FsckReport;
    use crate::store::Store;
    use crate::types::ROOT_INO;
    use std::fs;
    use std::os::unix::fs::MetadataExt;

    /// What a consumer taking the listings depth first, as `Store::scan` does, sees: one
    /// line per name or failed listing, in order. Directories named `skipme` are skipped.
    fn consume(w: &Walk, tiers: usize) -> Vec<String> {
        let mut out = Vec::new();
        for t in 0..tiers {
            let mut stack = vec![(PathBuf::new(), t as JobId)];
            while let Some((rel, job)) = stack.pop() {
                let entries = match w.take(job) {
                    Ok(e) => e,
                    Err(e) => {
                        out.push(format!("{t} {} error {:?}", rel.display(), e.kind()));
                        continue;
                    }
                };
                for e in entries {
                    let p = rel.join(&e.name);
                    match e.kind {
                        EntryKind::Dir(j) => {
                            out.push(format!("{t} {} dir", p.display()));
                            if e.name == "skipme" {
                                w.skip(j);
                            } else {
                                stack.push((p, j));
                            }
                        }
                        EntryKind::Other {
                            mode,
                            ino,
                            size,
                            nlink,
                        } => out.push(format!(
                            "{t} {} mode {mode:o} ino {ino} size {size} nlink {nlink}",
                            p.display()
                        )),
                        EntryKind::Temp => out.push(format!("{t} {} temp", p.display())),
                    }
                }
            }
        }
        out
    }

    /// The same with `std::fs::read_dir` and `lstat` of full paths (the walk before
    /// `crate::scan`).
    fn reference(roots: &[PathBuf]) -> Vec<String> {
        let mut out = Vec::new();
        for (t, root) in roots.iter().enumerate() {
            let mut stack = vec![PathBuf::new()];
            while let Some(rel) = stack.pop() {
                let rd = match fs::read_dir(root.join(&rel)) {
                    Ok(r) => r,
                    Err(e) => {
                        out.push(format!("{t} {} error {:?}", rel.display(), e.kind()));
                        continue;
                    }
                };
                for ent in rd.flatten() {
                    let name = ent.file_name();
                    let p = rel.join(&name);
                    if rel.as_os_str().is_empty() && name == ORPHAN_DIR {
                        continue;
                    }
                    if util::name_bytes(&name).starts_with(TEMP_PREFIX.as_bytes()) {
                        out.push(format!("{t} {} temp", p.display()));
                        continue;
                    }
                    let Ok(md) = fs::symlink_metadata(root.join(&p)) else {
                        continue;
                    };
                    if md.is_dir() {
                        out.push(format!("{t} {} dir", p.display()));
                        if name != "skipme" {
                            stack.push(p);
                        }
                    } else {
                        out.push(format!(
                            "{t} {} mode {:o} ino {} size {} nlink {}",
                            p.display(),
                            md.mode(),
                            md.ino(),
                            md.size(),
                            md.nlink()
                        ));
                    }
                }
            }
        }
        out
    }

    /// Two tiers: nested directories of files of several sizes, hard links within and
    /// across directories, a symlink, a FIFO, temporary names, the orphan directory, and
    /// `skipme` subtrees deep enough for workers to be inside them when they are skipped.
    fn tree(top: &Path) -> Vec<PathBuf> {
        let roots = vec![top.join("t0"), top.join("t1")];
        for (t, root) in roots.iter().enumerate() {
            for a in 0..6 {
                for b in 0..4 {
                    let d = root.join(format!("a{a}/b{b}"));
                    fs::create_dir_all(&d).unwrap();
                    // Tier 1's names differ (`g`): the store test makes its conflicts.
                    let p = ["f", "g"][t];
                    for f in 0..5 {
                        fs::write(d.join(format!("{p}{f}")), vec![b'x'; a * 10 + f + t]).unwrap();
                    }
                }
                let skip = root.join(format!("a{a}/skipme"));
                for k in 0..5 {
                    let d = skip.join(format!("s{k}/deeper"));
                    fs::create_dir_all(&d).unwrap();
                    fs::write(d.join(format!("x{t}")), b"x").unwrap();
                }
            }
            let linked = root.join(format!("a0/b0/{}0", ["f", "g"][t]));
            fs::hard_link(&linked, root.join(format!("a0/b0/link{t}"))).unwrap();
            fs::hard_link(&linked, root.join(format!("a1/link{t}"))).unwrap();
            std::os::unix::fs::symlink("a0", root.join(format!("sym{t}"))).unwrap();
            let fifo = util::cpath(&root.join(format!("a2/fifo{t}"))).unwrap();
            // SAFETY: a valid C string.
            assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
            fs::write(root.join(format!("a3/{TEMP_PREFIX}left")), b"t").unwrap();
            fs::create_dir_all(root.join(ORPHAN_DIR).join("o")).unwrap();
        }
        roots
    }

    /// Every number of workers gives the listings a serial walk with `read_dir` and
    /// `lstat` of full paths gives, in the same order; skipped subtrees never hold the
    /// walk up.
    #[test]
    fn parallel_walk_lists_what_a_serial_walk_lists() {
        let tmp = tempfile::tempdir().unwrap();
        let roots = tree(tmp.path());
        let want = reference(&roots);
        assert!(want.len() > 300, "the tree is too small: {}", want.len());
        assert!(want.iter().any(|l| l.contains("nlink 3")), "{want:?}");
        assert!(want.iter().any(|l| l.ends_with(" temp")), "{want:?}");
        assert!(!want.iter().any(|l| l.contains(ORPHAN_DIR)), "{want:?}");
        for workers in [0, 1, 2, 5] {
            for round in 0..5 {
                let got = Walk::run(&roots, workers, |w| consume(w, roots.len()));
                assert_eq!(got, want, "{workers} workers, round {round}");
            }
        }
    }

    /// While the merge is slow, workers stop taking directories once the names waiting
    /// for it reach the bound (each may finish the listing it is on), and the walk still
    /// ends with everything listed.
    #[test]
    fn workers_wait_while_the_merge_is_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let roots = tree(tmp.path());
        let want = reference(&roots);
        let (got, peak) = Walk::run_bounded(&roots, 3, 20, |w| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while w.lock().buffered < 20 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "workers never reached the bound of 20 names"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            // Time to run past the bound, were they not held.
            std::thread::sleep(std::time::Duration::from_millis(100));
            let got = consume(w, roots.len());
            (got, w.lock().peak)
        });
        assert_eq!(got, want);
        // The largest listing has 7 names; three workers may each finish one past the
        // bound (the tree has over 300).
        assert!(peak < 20 + 3 * 7, "workers ran past the bound: peak {peak}");
    }

    /// A directory removed after its parent was listed: listing it fails with NotFound
    /// (the merge warns and goes on), or it was listed before it went; the walk ends
    /// either way.
    #[test]
    fn a_directory_that_vanishes_during_the_walk() {
        for workers in [0, 2] {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().join("t0");
            for d in ["keep", "gone"] {
                fs::create_dir_all(root.join(d).join("sub")).unwrap();
                fs::write(root.join(d).join("sub/f"), b"x").unwrap();
            }
            let roots = vec![root.clone()];
            let got = Walk::run(&roots, workers, |w| {
                let top = w.take(0).unwrap();
                fs::remove_dir_all(root.join("gone")).unwrap();
                let mut out = Vec::new();
                for e in top {
                    let EntryKind::Dir(j) = e.kind else {
                        panic!("{e:?} is not a directory")
                    };
                    match w.take(j) {
                        Ok(below) => {
                            for b in below {
                                if let EntryKind::Dir(k) = b.kind {
                                    // Listed before it went, or gone by now.
                                    let _ = w.take(k);
                                }
                            }
                            out.push((e.name, "listed".to_string()));
                        }
                        Err(err) => out.push((e.name, format!("{:?}", err.kind()))),
                    }
                }
                out.sort();
                out
            });
            assert_eq!(got.len(), 2, "{got:?}");
            assert_eq!(got[1], ("keep".into(), "listed".into()), "{got:?}");
            if workers == 0 {
                // Nobody listed it before it went.
                assert_eq!(got[0], ("gone".into(), "NotFound".into()), "{got:?}");
            } else {
                assert!(got[0].1 == "NotFound" || got[0].1 == "listed", "{got:?}");
            }
        }
    }

    /// The index state `Store::scan` leaves, as text (every map sorted).
    fn index_state(store: &Store) -> String {
        let ns = store.ns();
        let mut lines: Vec<String> = Vec::new();
        for (i, d) in &ns.dirs {
            lines.push(format!(
                "dir {i} {:?} parent {} children {:?} unlisted {} lookups {}",
                d.path, d.parent, d.children, d.unlisted, d.lookups
            ));
        }
        for (i, f) in &ns.files {
            lines.push(format!(
                "file {i} {:?} tier {} bino {} names {:?} size {} state tier {} lookups {}",
                f.kind,
                f.tier,
                f.bino,
                f.names,
                f.state.size.load(std::sync::atomic::Ordering::Relaxed),
                f.state.tier(),
                f.lookups
            ));
        }
        lines.extend(ns.remap.iter().map(|(k, v)| format!("remap {k:?} {v}")));
        lines.extend(ns.taken.iter().map(|i| format!("taken {i}")));
        lines.extend(ns.dir_ids.iter().map(|(p, i)| format!("dir_id {p:?} {i}")));
        lines.push(format!("next_ino {}", ns.next_ino));
        for t in &store.tiers {
            lines.push(format!(
                "used {} {}",
                t.cfg.name,
                t.used.load(std::sync::atomic::Ordering::Relaxed)
            ));
        }
        lines.sort();
        lines.join("\n")
    }

    /// `Store::scan` with listing threads builds the index a scan without them builds:
    /// hard links share one node counted once, the first tier wins conflicts (a file
    /// over a directory, a directory over a file, a file over a file) and a shadowed
    /// directory's tree is not read, a moved file keeps its number through its remap,
    /// temporary files are removed, the orphan directory is cleaned.
    #[test]
    fn store_scan_with_threads_builds_the_serial_index() {
        let tmp = tempfile::tempdir().unwrap();
        let roots = tree(tmp.path());
        let (t0, t1) = (&roots[0], &roots[1]);
        // Conflicts: file `a4/b0/f0` on both, t0 file `a5/b0/f1` over a t1 tree, t0 tree
        // `a5/b1` over a t1 file.
        fs::write(t1.join("a4/b0/f0"), b"shadowed").unwrap();
        fs::create_dir_all(t1.join("a5/b0/f1/under")).unwrap();
        fs::write(t1.join("a5/b0/f1/under/u"), b"u").unwrap();
        fs::remove_dir_all(t1.join("a5/b1")).unwrap();
        fs::write(t1.join("a5/b1"), b"file").unwrap();
        let text = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n\
             [[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"1GiB\"\n\
             [[tier]]\nname = \"t1\"\npath = \"{}\"\ncapacity = \"1GiB\"\n",
            tmp.path().join("state").display(),
            t0.display(),
            t1.display()
        );
        let store =
            Store::open(crate::StoreConfig::from_toml_str(&text, "t.toml").unwrap()).unwrap();
        assert!(!t0.join(ORPHAN_DIR).exists(), "orphan directory left");
        let moved = store.resolve(Path::new("a2/b2/f3")).unwrap();
        store.move_now(Path::new("a2/b2/f3"), "t1").unwrap();
        let temps = [t0.join("a1/b1"), t1.join("a4"), t1.join("a5/b0/f1/under")];
        let mut first: Option<(String, FsckReport)> = None;
        for threads in [0, 1, 2, 5, 0, 3] {
            for d in &temps {
                fs::write(d.join(format!("{TEMP_PREFIX}x")), b"t").unwrap();
            }
            let mut report = FsckReport::default();
            store.scan_with(false, &mut report, threads).unwrap();
            let state = index_state(&store);
            match &first {
                None => first = Some((state, report.clone())),
                Some((s, r)) => {
                    assert_eq!(&state, s, "index with {threads} threads");
                    assert_eq!(&report, r, "report with {threads} threads");
                }
            }
            // The shadowed tree's temporary file is not reached.
            assert_eq!(report.temp_removed, 2, "{report:?}");
            assert_eq!(report.conflicts, 3, "{report:?}");
            assert!(
                t1.join("a5/b0/f1/under")
                    .join(format!("{TEMP_PREFIX}x"))
                    .exists()
            );
            let ns = store.ns();
            let f0 = ns.resolve(Path::new("a0/b0/f0")).unwrap();
            assert_eq!(ns.resolve(Path::new("a0/b0/link0")), Some(f0));
            assert_eq!(ns.resolve(Path::new("a1/link0")), Some(f0));
            let g0 = ns.resolve(Path::new("a0/b0/g0")).unwrap();
            assert_eq!(ns.resolve(Path::new("a1/link1")), Some(g0));
            assert_eq!(ns.files[&g0].tier, 1);
            let f0b = ns.resolve(Path::new("a4/b0/f0")).unwrap();
            assert_eq!(ns.files[&f0b].tier, 0);
            assert_eq!(ns.files[&f0].names.len(), 3);
            assert_eq!(ns.files[&f0].tier, 0);
            assert_eq!(ns.resolve(Path::new("a2/b2/f3")), Some(moved));
            assert_eq!(ns.files[&moved].tier, 1);
            let a5b0 = ns.resolve(Path::new("a5/b0")).unwrap();
            let f1 = ns.child(a5b0, OsStr::new("f1")).unwrap();
            assert!(!ns.is_dir(f1) && ns.files[&f1].tier == 0);
            let a5b1 = ns.resolve(Path::new("a5/b1")).unwrap();
            assert!(ns.is_dir(a5b1));
            assert!(ns.dirs[&ROOT_INO].children.contains_key(OsStr::new("sym1")));
        }
        // Tier 0's bytes: every regular file once (the hard-linked one too).
        let mut want = 0;
        for a in 0..6u64 {
            want += 4 * (5 * a * 10 + 10) + 5;
        }
        // `a2/b2/f3` moved to t1.
        want -= 2 * 10 + 3;
        let used = store.tiers[0]
            .used
            .load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(used, want);
    }
}
