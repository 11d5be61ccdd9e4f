//! The mover: copy → fsync → verify (crc32c) → atomic switch in the journal → delete
//! source, for one file (its whole hard-link group) at a time; crash recovery of every
//! step; the paced background loop that carries out the policy's plans.
//!
//! Open files are moved too. Readers and writers keep going while the copy runs; the switch
//! happens at a quiescent point under the file's gate (a per-file lock every read/write
//! holds shared), so no request sees half of each copy. If any write landed during the copy
//! (the file's write generation moved), the copy is redone under the gate before switching.
//! After the switch every open handle is re-pointed at the new copy (writers are
//! redirected). Files handed to the kernel for passthrough move only once those handles
//! are closed, since the kernel then writes to the backing file directly.

// Nested `if let` reads more plainly here than let-chains.
#![allow(clippy::collapsible_if)]

use crate::db::JournalRow;
use crate::error::FsError;
use crate::operator::JobProgress;
use crate::store::{FailPoint, JobId, Store, TEMP_PREFIX};
use crate::types::{FileKind, Ino};
use crate::util;
use kaiso_policy::MoveReason;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Why a move did not happen.
#[derive(Debug)]
pub struct MoveError {
    pub errno: FsError,
    pub message: String,
}

impl MoveError {
    fn new(errno: FsError, message: impl Into<String>) -> MoveError {
        MoveError {
            errno,
            message: message.into(),
        }
    }
    pub fn errno(&self) -> FsError {
        self.errno
    }
}

impl fmt::Display for MoveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.errno)
    }
}

impl std::error::Error for MoveError {}

impl From<std::io::Error> for MoveError {
    fn from(e: std::io::Error) -> MoveError {
        MoveError::new(
            FsError::from(
                e.raw_os_error()
                    .map(std::io::Error::from_raw_os_error)
                    .unwrap_or(e),
            ),
            "I/O error",
        )
    }
}

impl From<rusqlite::Error> for MoveError {
    fn from(e: rusqlite::Error) -> MoveError {
        MoveError::new(FsError::IO, format!("database: {e}"))
    }
}

impl From<FsError> for MoveError {
    fn from(e: FsError) -> MoveError {
        MoveError::new(e, "namespace")
    }
}

#[derive(Default)]
pub(crate) struct MoverShared {
    pub dir_fill: Mutex<()>,
    moving: Mutex<HashSet<Ino>>,
    pub moved_files: AtomicU64,
    pub moved_bytes: AtomicU64,
    pub failed: AtomicU64,
    pub queued_files: AtomicU64,
    pub queued_bytes: AtomicU64,
    pub backing_off: AtomicBool,
    pub rate: Mutex<f64>,
    pub jobs: Mutex<HashMap<JobId, JobProgress>>,
    pub next_job: AtomicU64,
}

/// Releases the per-file move slot.
struct MoveSlot<'a>(&'a Mutex<HashSet<Ino>>, Ino);

impl Drop for MoveSlot<'_> {
    fn drop(&mut self) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.1);
    }
}

/// Copy pacing: at most `rate` bytes/s; background copies also pause while busy.
struct Pacer {
    start: Instant,
    bytes: u64,
    rate: u64,
}

impl Pacer {
    fn after(&mut self, n: u64) {
        self.bytes += n;
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate.max(1) as f64);
        let el = self.start.elapsed();
        if due > el {
            std::thread::sleep(due - el);
        }
    }
}

fn parent_of(p: &Path) -> PathBuf {
    p.parent().map(|p| p.to_path_buf()).unwrap_or_default()
}

pub(crate) fn reason_text(r: MoveReason) -> &'static str {
    match r {
        MoveReason::Promote => "promoted: hot enough for a faster tier",
        MoveReason::DemoteOverWatermark => {
            "demoted: cold while its tier was above the high watermark"
        }
        MoveReason::Spike => "promoted: load spike on a slow tier",
        MoveReason::SpikeOver => "demoted: spike over",
        MoveReason::Prefetch => "promoted: prefetched with a hot unit",
        MoveReason::Evict => "demoted: evicted for a hotter file",
        MoveReason::Manual => "moved by an operator",
    }
}

impl Store {
    fn fail_at(&self, fp: FailPoint) -> Result<(), MoveError> {
        if *self.fail.lock().unwrap_or_else(|e| e.into_inner()) == Some(fp) {
            return Err(MoveError::new(
                FsError::IO,
                format!("injected failure {fp:?}"),
            ));
        }
        Ok(())
    }

    /// Copy `src` into `dst` (same size, holes kept); returns the crc32c of the data.
    fn copy_data(
        &self,
        ino: Ino,
        from: u8,
        to: u8,
        src: &File,
        dst: &File,
        background: bool,
    ) -> Result<(u64, u32), MoveError> {
        let size = util::fstat(src)?.st_size as u64;
        dst.set_len(0)?;
        dst.set_len(size)?;
        let extents = util::data_extents(src, size)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut crc = 0u32;
        let mut pacer = Pacer {
            start: Instant::now(),
            bytes: 0,
            rate: self.cfg.mover.max_rate,
        };
        for &(s, e) in &extents {
            let mut pos = s;
            while pos < e {
                if background {
                    self.wait_not_busy(from, to);
                }
                let want = ((e - pos) as usize).min(buf.len());
                let n = util::pread_full(src, &mut buf[..want], pos)?;
                if n == 0 {
                    break;
                }
                self.tiers[from as usize].emulate(ino, pos, n as u64, false);
                std::os::unix::fs::FileExt::write_all_at(dst, &buf[..n], pos)?;
                self.tiers[to as usize].emulate(ino, pos, n as u64, true);
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                pos += n as u64;
                pacer.after(n as u64);
            }
        }
        Ok((size, crc))
    }

    /// Background moves pause while foreground I/O keeps either tier busy (bounded wait).
    fn wait_not_busy(&self, from: u8, to: u8) {
        let limit = self.cfg.mover.busy_backoff;
        for _ in 0..100 {
            let busy = self.tiers[from as usize]
                .busy()
                .max(self.tiers[to as usize].busy());
            if busy <= limit || self.stopping() {
                self.mover.backing_off.store(false, Ordering::Relaxed);
                return;
            }
            self.mover.backing_off.store(true, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
            self.tiers[from as usize].sample_busy();
            self.tiers[to as usize].sample_busy();
        }
    }

    /// Every name of a link group on `tier` (walks the tier when the index knows fewer
    /// names than the link count, e.g. links made directly in the tier directory).
    fn link_group(&self, tier: u8, bino: u64, known: Vec<PathBuf>) -> Vec<PathBuf> {
        let root = &self.tiers[tier as usize].root;
        let nlink = known
            .first()
            .and_then(|p| util::lstat(&root.join(p)).ok())
            .map(|s| s.st_nlink as usize)
            .unwrap_or(1);
        if nlink <= known.len() {
            return known;
        }
        let mut found = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(root.join(&rel)) else {
                continue;
            };
            for e in rd.flatten() {
                let child = rel.join(e.file_name());
                let Ok(ft) = e.file_type() else { continue };
                if ft.is_dir() {
                    stack.push(child);
                } else if std::os::unix::fs::DirEntryExt::ino(&e) == bino {
                    found.push(child);
                }
            }
            if found.len() >= nlink {
                break;
            }
        }
        if found.is_empty() { known } else { found }
    }

    /// Move file `ino` (with all its hard links) to tier `to`. Returns bytes moved.
    pub(crate) fn move_file(
        &self,
        ino: Ino,
        to: u8,
        reason: &str,
        _size_hint: u64,
    ) -> Result<u64, MoveError> {
        self.move_file_inner(ino, to, reason, false)
    }

    pub(crate) fn move_file_inner(
        &self,
        ino: Ino,
        to: u8,
        reason: &str,
        background: bool,
    ) -> Result<u64, MoveError> {
        if to as usize >= self.tiers.len() {
            return Err(MoveError::new(FsError::INVAL, "no such tier"));
        }
        if !self
            .mover
            .moving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ino)
        {
            return Err(MoveError::new(FsError::BUSY, "already being moved"));
        }
        let _slot = MoveSlot(&self.mover.moving, ino);
        // 1. What to move.
        let (from, bino, state, names, src) = {
            let ns = self.ns();
            let f = ns
                .files
                .get(&ino)
                .ok_or_else(|| MoveError::new(FsError::NOENT, "no such file"))?;
            if f.kind != FileKind::File {
                return Err(MoveError::new(FsError::INVAL, "only regular files move"));
            }
            if f.tier == to {
                return Ok(0);
            }
            let names = ns.file_paths(ino);
            let first = names
                .first()
                .ok_or_else(|| MoveError::new(FsError::NOENT, "file has no name"))?
                .clone();
            let src = File::open(self.tiers[f.tier as usize].path(&first))?;
            (f.tier, f.bino, f.state.clone(), names, src)
        };
        if state.passthrough_open.load(Ordering::SeqCst) > 0 {
            return Err(MoveError::new(
                FsError::BUSY,
                "open with kernel passthrough; moves when closed",
            ));
        }
        if state
            .stub
            .lock()
            .map(|s| s.as_ref().is_some_and(|s| !s.is_complete()))
            .unwrap_or(true)
        {
            return Err(MoveError::new(
                FsError::BUSY,
                "migration stub not fully fetched",
            ));
        }
        let names = self.link_group(from, bino, names);
        let size = state.size.load(Ordering::Acquire);
        let (ft, tt) = (&self.tiers[from as usize], &self.tiers[to as usize]);
        // Reserve room on the destination first: its hard capacity is never passed.
        if tt
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                if u + size <= tt.capacity() {
                    Some(u + size)
                } else {
                    None
                }
            })
            .is_err()
        {
            return Err(MoveError::new(
                FsError::NOSPC,
                format!("tier {} has no room", tt.cfg.name),
            ));
        }
        let unreserve = |n: u64| tt.add_used(-(n as i64));
        // 2. Journal.
        let tmp = PathBuf::from(format!("{TEMP_PREFIX}{ino}-{}", util::now_nanos()));
        let row = JournalRow {
            id: 0,
            kind: "move".into(),
            ino,
            from_tier: from,
            to_tier: to,
            src_bino: bino,
            dst_bino: 0,
            names: names.clone(),
            tmp: tmp.clone(),
            state: "copying".into(),
        };
        let id = match self.db().journal_add(&row) {
            Ok(id) => id,
            Err(e) => {
                unreserve(size);
                return Err(e.into());
            }
        };
        self.fail_at(FailPoint::AfterJournal)?;
        let tmp_path = tt.path(&tmp);
        let cleanup = |e: MoveError| {
            let _ = std::fs::remove_file(&tmp_path);
            let _ = self.db().journal_done(id);
            unreserve(size);
            e
        };
        // 3. Copy, sync, verify (without blocking the file's users).
        let dst = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp_path)
        {
            Ok(f) => f,
            Err(e) => return Err(cleanup(e.into())),
        };
        let gen0 = state.write_gen.load(Ordering::Acquire);
        let (_, crc) = match self.copy_data(ino, from, to, &src, &dst, background) {
            Ok(v) => v,
            Err(e) => return Err(cleanup(e)),
        };
        self.fail_at(FailPoint::AfterCopy)?;
        if let Err(e) = dst.sync_all() {
            return Err(cleanup(e.into()));
        }
        self.fail_at(FailPoint::AfterFsync)?;
        let verify = |dst: &File, crc: u32| -> Result<(), MoveError> {
            let sz = util::fstat(dst)?.st_size as u64;
            let ext = util::data_extents(&src, util::fstat(&src)?.st_size as u64)?;
            let got = util::crc_extents(dst, &ext)?;
            if got != crc || sz != util::fstat(&src)?.st_size as u64 {
                return Err(MoveError::new(FsError::IO, "checksum mismatch after copy"));
            }
            Ok(())
        };
        if let Err(e) = verify(&dst, crc) {
            return Err(cleanup(e));
        }
        self.fail_at(FailPoint::AfterVerify)?;
        let dst_bino = util::fstat(&dst).map(|s| s.st_ino).unwrap_or(0);
        // 4. Switch, at a quiescent point.
        let mut ns = self.ns();
        let _gate = state.gate.write().unwrap_or_else(|e| e.into_inner());
        let names = {
            let now_names = ns.file_paths(ino);
            if now_names.is_empty() {
                drop(_gate);
                drop(ns);
                return Err(cleanup(MoveError::new(
                    FsError::NOENT,
                    "file was removed during the move",
                )));
            }
            if now_names != names {
                self.link_group(from, bino, now_names)
            } else {
                names
            }
        };
        let size = if state.write_gen.load(Ordering::Acquire) != gen0 {
            // Written during the copy: copy again while the gate holds writers off.
            let r = self
                .copy_data(ino, from, to, &src, &dst, false)
                .and_then(|(sz, crc)| {
                    dst.sync_all()?;
                    verify(&dst, crc)?;
                    Ok(sz)
                });
            match r {
                Ok(sz) => {
                    if sz != size {
                        tt.add_used(sz as i64 - size as i64);
                    }
                    sz
                }
                Err(e) => {
                    drop(_gate);
                    drop(ns);
                    return Err(cleanup(e));
                }
            }
        } else {
            size
        };
        let src_first = ft.path(&names[0]);
        let st = match util::lstat(&src_first) {
            Ok(s) => s,
            Err(e) => {
                drop(_gate);
                drop(ns);
                return Err(cleanup(e.into()));
            }
        };
        let r = (|| -> Result<(), MoveError> {
            util::copy_xattrs(&src_first, &tmp_path)?;
            util::copy_meta(&st, &tmp_path)?;
            self.db().journal_set_names(id, &names, dst_bino)?;
            for (i, n) in names.iter().enumerate() {
                self.ensure_dir(to, &parent_of(n))?;
                if i == 0 {
                    std::fs::rename(&tmp_path, tt.path(n))?;
                } else {
                    std::fs::hard_link(tt.path(&names[0]), tt.path(n))?;
                }
            }
            let dirs: HashSet<PathBuf> = names.iter().map(|n| tt.path(&parent_of(n))).collect();
            for d in dirs {
                util::fsync_dir(&d)?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            // Roll back names created on the destination.
            for n in &names {
                let p = tt.path(n);
                if util::lstat(&p)
                    .map(|s| s.st_ino == dst_bino)
                    .unwrap_or(false)
                {
                    let _ = std::fs::remove_file(p);
                }
            }
            drop(_gate);
            drop(ns);
            return Err(cleanup(e));
        }
        self.fail_at(FailPoint::AfterRename)?;
        let slot = ns.set_file_location(ino, to, dst_bino);
        let natural = ((slot as u64) << crate::namespace::SLOT_SHIFT) | dst_bino;
        let remap = if natural != ino {
            Some((slot, dst_bino, ino))
        } else {
            None
        };
        self.db().journal_switch(id, &names, remap, ino)?;
        self.fail_at(FailPoint::AfterSwitch)?;
        // Redirect open handles to the new copy.
        for h in state.open_handles() {
            match crate::dataops::open_backing(&tt.path(&names[0]), h.flags) {
                Ok(f) => *h.file.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(f),
                Err(e) => {
                    tracing::error!(ino, error = %e, "cannot reopen a handle on the new copy; it keeps the old one")
                }
            }
        }
        if let Some(f) = ns.files.get_mut(&ino) {
            f.tier = to;
            f.bino = dst_bino;
        }
        state.tier.store(to, Ordering::Release);
        // 5. Delete the source.
        let mut src_dirs = HashSet::new();
        for n in &names {
            let p = ft.path(n);
            if util::lstat(&p).map(|s| s.st_ino == bino).unwrap_or(false) {
                if let Err(e) = std::fs::remove_file(&p) {
                    tracing::warn!(path = %p.display(), error = %e, "cannot remove the source copy");
                }
                src_dirs.insert(ft.path(&parent_of(n)));
            }
        }
        for d in src_dirs {
            let _ = util::fsync_dir(&d);
        }
        drop(_gate);
        drop(ns);
        ft.add_used(-(size as i64));
        self.fail_at(FailPoint::AfterDelete)?;
        self.db().journal_done(id)?;
        {
            let mut pl = self.placer();
            pl.placed(ino, size, to);
            pl.reasons.insert(
                ino,
                format!("{reason} (tier {} → {})", ft.cfg.name, tt.cfg.name),
            );
        }
        self.mover.moved_files.fetch_add(1, Ordering::Relaxed);
        self.mover.moved_bytes.fetch_add(size, Ordering::Relaxed);
        tracing::info!(ino, from = %ft.cfg.name, to = %tt.cfg.name, bytes = size, reason, "moved");
        Ok(size)
    }

    /// Start the background mover and checkpointer. They stop when the returned guard is
    /// dropped (or at `shutdown`).
    pub fn start_background(self: &Arc<Self>) -> Background {
        let store = self.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("kaiso-mover".into())
            .spawn(move || store.background_loop(&stop2))
            .ok();
        Background { stop, handle }
    }

    fn background_loop(&self, stop: &AtomicBool) {
        let interval = Duration::from_millis(self.cfg.mover.interval_ms);
        let mut last_ckpt = Instant::now();
        let mut last_rate = (
            Instant::now(),
            self.mover.moved_bytes.load(Ordering::Relaxed),
        );
        while !stop.load(Ordering::SeqCst) && !self.stopping() {
            let t0 = Instant::now();
            while t0.elapsed() < interval {
                if stop.load(Ordering::SeqCst) || self.stopping() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20).min(interval));
            }
            for t in &self.tiers {
                t.sample_busy();
            }
            if self.cfg.mover.enabled {
                self.plan_and_move(stop);
            }
            let moved = self.mover.moved_bytes.load(Ordering::Relaxed);
            let secs = last_rate.0.elapsed().as_secs_f64().max(1e-3);
            *self.mover.rate.lock().unwrap_or_else(|e| e.into_inner()) =
                (moved - last_rate.1) as f64 / secs;
            last_rate = (Instant::now(), moved);
            if last_ckpt.elapsed() >= Duration::from_millis(self.cfg.mover.checkpoint_ms) {
                if let Err(e) = self.checkpoint() {
                    tracing::warn!(error = %e, "checkpoint failed");
                }
                last_ckpt = Instant::now();
            }
        }
    }

    /// One planning round: ask the policy, carry the moves out.
    pub fn plan_and_move(&self, stop: &AtomicBool) -> u64 {
        let states = self.tier_states();
        let busiest = states.iter().map(|s| s.busy).fold(0.0, f64::max);
        if busiest > self.cfg.mover.busy_backoff {
            self.mover.backing_off.store(true, Ordering::Relaxed);
        } else {
            self.mover.backing_off.store(false, Ordering::Relaxed);
        }
        let now = self.now();
        let plan = self
            .placer()
            .plan(now, &states, self.cfg.mover.max_plan_bytes);
        self.mover
            .queued_files
            .store(plan.len() as u64, Ordering::Relaxed);
        self.mover
            .queued_bytes
            .store(plan.iter().map(|m| m.bytes).sum(), Ordering::Relaxed);
        let mut moved = 0;
        for m in plan {
            if stop.load(Ordering::SeqCst) || self.stopping() {
                break;
            }
            let r = self.move_file_inner(m.object, m.to, reason_text(m.reason), true);
            self.mover.queued_files.fetch_sub(1, Ordering::Relaxed);
            let _ =
                self.mover
                    .queued_bytes
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                        Some(b.saturating_sub(m.bytes))
                    });
            match r {
                Ok(n) => moved += n,
                Err(e) => {
                    self.mover.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(ino = m.object, error = %e, "planned move skipped");
                    // Tell the policy where the object really is, so it does not re-plan blindly.
                    let cur = self
                        .ns()
                        .files
                        .get(&m.object)
                        .map(|f| (f.tier, f.state.size.load(Ordering::Relaxed)));
                    match cur {
                        Some((t, s)) => self.placer().placed(m.object, s, t),
                        None => self.placer().forget(m.object),
                    }
                }
            }
        }
        moved
    }
}

/// Stops the background threads when dropped.
pub struct Background {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Finish or roll back one journal row left by a crash.
pub(crate) fn recover_row(store: &Store, row: &JournalRow) {
    let tiers = &store.tiers;
    let ino_at = |tier: u8, p: &Path| {
        tiers
            .get(tier as usize)
            .and_then(|t| util::lstat(&t.path(p)).ok())
            .map(|s| s.st_ino)
    };
    match row.kind.as_str() {
        "move" => {
            let (from, to) = (row.from_tier, row.to_tier);
            if let Some(t) = tiers.get(to as usize) {
                let _ = std::fs::remove_file(t.path(&row.tmp));
            }
            if row.state == "switched" {
                // The new copy is authoritative: finish deleting the source.
                for n in &row.names {
                    if ino_at(from, n) == Some(row.src_bino) && ino_at(to, n).is_some() {
                        let _ = std::fs::remove_file(tiers[from as usize].path(n));
                    }
                }
                tracing::warn!(ino = row.ino, "finished an interrupted move");
            } else {
                // Not switched: the source is authoritative; remove destination names.
                for n in &row.names {
                    if row.dst_bino != 0
                        && ino_at(to, n) == Some(row.dst_bino)
                        && ino_at(from, n) == Some(row.src_bino)
                    {
                        let _ = std::fs::remove_file(tiers[to as usize].path(n));
                    }
                }
                tracing::warn!(ino = row.ino, "rolled back an interrupted move");
            }
        }
        "replace" => {
            if let Some(n) = row.names.first() {
                if ino_at(row.to_tier, n) == Some(row.dst_bino)
                    && ino_at(row.from_tier, n) == Some(row.src_bino)
                {
                    let _ = std::fs::remove_file(tiers[row.from_tier as usize].path(n));
                }
            }
        }
        "dirrename" => {
            if let [sp, dp] = &row.names[..] {
                for t in tiers {
                    if util::lstat_opt(&t.path(sp)).ok().flatten().is_some() {
                        if let Some(parent) = dp.parent() {
                            let _ = std::fs::create_dir_all(t.path(parent));
                        }
                        let _ = std::fs::rename(t.path(sp), t.path(dp));
                    }
                }
                let _ = store.db().rename_dirs(sp, dp);
            }
        }
        other => tracing::warn!(kind = other, "unknown journal entry ignored"),
    }
}
