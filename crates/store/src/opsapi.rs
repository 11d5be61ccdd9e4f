//! The operator API: status, where, explain, pins, manual promote/demote jobs, fsck.

use crate::error::FsError;
use crate::mover::MoveError;
use crate::operator::{
    Direction, Explanation, FsckReport, JobProgress, MoverStatus, OpError, Placement, StoreStatus,
    TierStatus,
};
use crate::store::{JobId, Store};
use crate::types::{FileKind, Ino};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Moves in flight an operator job's move of one file waits for before it gives up.
const JOB_MOVE_WAITS: u32 = 8;

/// A failed move as an operator job reports it: the reason and the errno's text,
/// without Rust's "(os error N)" suffix.
fn job_error(e: &MoveError) -> String {
    let errno = std::io::Error::from_raw_os_error(e.errno().errno()).to_string();
    let errno = match errno.find(" (os error ") {
        Some(i) => &errno[..i],
        None => &errno,
    };
    format!("{} ({errno})", e.message)
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "symlink",
        FileKind::Fifo => "fifo",
        FileKind::Socket => "socket",
        FileKind::CharDevice => "char device",
        FileKind::BlockDevice => "block device",
    }
}

/// A database failure while recording an operator's change to `path`.
fn db_error(what: &str, path: &Path, e: rusqlite::Error) -> OpError {
    tracing::error!(error = %e, path = %path.display(), "metadata database error");
    OpError::new(
        FsError::IO,
        format!(
            "cannot record the {what} of {} in the metadata database: {e}",
            path.display()
        ),
    )
}

impl Store {
    /// Per-tier usage and accesses, mover state.
    pub fn status(&self) -> StoreStatus {
        let total: u64 = self
            .tiers
            .iter()
            .map(|t| t.accesses.load(Ordering::Relaxed))
            .sum();
        let tiers = self
            .tiers
            .iter()
            .map(|t| {
                let a = t.accesses.load(Ordering::Relaxed);
                TierStatus {
                    name: t.cfg.name.clone(),
                    path: t.root.display().to_string(),
                    used: t.used(),
                    capacity: t.capacity(),
                    high_watermark: t.cfg.high_watermark,
                    low_watermark: t.cfg.low_watermark,
                    accesses: a,
                    access_share: if total == 0 {
                        0.0
                    } else {
                        a as f64 / total as f64
                    },
                    busy: t.busy(),
                    device: t.emu.as_ref().map(|e| e.kind().to_string()),
                }
            })
            .collect();
        let m = &self.mover;
        let planner = self.planner_status();
        // One store lock at a time: create/unlink take the namespace lock, then the placer.
        let policy = self.placer().policy.name().to_string();
        let files = self.ns().files.len() as u64;
        StoreStatus {
            tiers,
            mover: MoverStatus {
                queued_files: m.queued_files.load(Ordering::Relaxed),
                queued_bytes: m.queued_bytes.load(Ordering::Relaxed),
                moved_files: m.moved_files.load(Ordering::Relaxed),
                moved_bytes: m.moved_bytes.load(Ordering::Relaxed),
                failed_moves: m.failed.load(Ordering::Relaxed),
                rate: *m.rate.lock().unwrap_or_else(|e| e.into_inner()),
                backing_off: m.backing_off.load(Ordering::Relaxed),
                plans: planner.plans,
                empty_plans_in_a_row: planner.empty_plans_in_a_row,
                moving_files: planner.moving_files,
                waiting_files: planner.waiting_files,
                backed_off_ms: planner.backed_off_ms,
            },
            policy,
            files,
        }
    }

    /// Resolve a store-relative path (e.g. `a/b.txt`; absolute paths are taken from the root).
    pub fn resolve(&self, rel: &Path) -> Result<Ino, FsError> {
        let rel = rel.strip_prefix("/").unwrap_or(rel);
        let ns = self.ns();
        ns.resolve(rel).ok_or(FsError::NOENT)
    }

    /// `resolve` for operator requests: a missing path says so in words.
    fn find(&self, rel: &Path) -> Result<Ino, OpError> {
        self.resolve(rel)
            .map_err(|e| OpError::new(e, "no such file or directory in the store"))
    }

    /// Which tier(s) hold `rel`.
    pub fn where_is(&self, rel: &Path) -> Result<Placement, OpError> {
        let ino = self.find(rel)?;
        let pin = self
            .placer()
            .pins
            .get(&ino)
            .map(|t| self.tiers[*t as usize].cfg.name.clone());
        let ns = self.ns();
        if let Some(d) = ns.dirs.get(&ino) {
            let path = d.path.clone();
            drop(ns);
            let tiers = self.dir_tiers(&path);
            let mut p = Placement {
                ino,
                kind: "directory".into(),
                tiers: tiers
                    .iter()
                    .map(|t| self.tiers[*t as usize].cfg.name.clone())
                    .collect(),
                backing_path: String::new(),
                backing_path_bytes: None,
                size: 0,
                pinned: pin,
            };
            if let Some(t) = tiers.first() {
                p.set_backing_path(&self.tiers[*t as usize].display_path(&path));
            }
            return Ok(p);
        }
        let f = ns
            .files
            .get(&ino)
            .ok_or_else(|| OpError::new(FsError::NOENT, "removed while being looked up"))?;
        // The name asked for: a hard link's names all live on the file's tier.
        let path = rel.strip_prefix("/").unwrap_or(rel).to_path_buf();
        let t = &self.tiers[f.tier as usize];
        let mut p = Placement {
            ino,
            kind: kind_name(f.kind).into(),
            tiers: vec![t.cfg.name.clone()],
            backing_path: String::new(),
            backing_path_bytes: None,
            size: f.state.size.load(Ordering::Relaxed),
            pinned: pin,
        };
        p.set_backing_path(&t.display_path(&path));
        Ok(p)
    }

    /// Where `rel` is and which rule put it there.
    pub fn explain(&self, rel: &Path) -> Result<Explanation, OpError> {
        let placement = self.where_is(rel)?;
        let ino = placement.ino;
        let now = self.now();
        let (rule, policy) = {
            let mut pl = self.placer();
            // A passthrough writer's growth reaches the policy once a second; show it now.
            if placement.kind == "file" {
                pl.note_size(ino, placement.size);
            }
            (pl.reasons.get(&ino).cloned(), pl.explain(ino, now))
        };
        let rule = match rule {
            Some(r) => r,
            None => match self.db().reason(ino).ok().flatten() {
                Some(r) => r,
                None if placement.kind == "directory" => {
                    "directories exist on every tier that holds something below them".into()
                }
                None => format!(
                    "found on tier {} (created before this mount, or adopted)",
                    placement.tiers.join(",")
                ),
            },
        };
        let rule = match &placement.pinned {
            Some(t) => format!("{rule}; pinned to tier {t}"),
            None => rule,
        };
        Ok(Explanation {
            placement,
            rule,
            policy,
        })
    }

    /// Files a path names: the file itself, or (recursive) every file below a directory.
    /// `verb` names the operation in the error for a directory without `recursive`.
    fn targets(&self, rel: &Path, recursive: bool, verb: &str) -> Result<Vec<Ino>, OpError> {
        let ino = self.find(rel)?;
        let ns = self.ns();
        if ns.is_dir(ino) {
            if !recursive {
                return Err(OpError::new(
                    FsError::ISDIR,
                    format!("is a directory: give -r to {verb} every file below it"),
                ));
            }
            Ok(ns
                .files_under(ino)
                .into_iter()
                .filter(|i| ns.files.get(i).is_some_and(|f| f.kind == FileKind::File))
                .collect())
        } else {
            Ok(vec![ino])
        }
    }

    /// The index of the tier named `name`; an unknown name lists the tiers there are.
    fn tier_index(&self, name: &str) -> Result<u8, OpError> {
        self.tiers
            .iter()
            .position(|t| t.cfg.name == name)
            .map(|i| i as u8)
            .ok_or_else(|| {
                let names: Vec<&str> = self.tiers.iter().map(|t| t.cfg.name.as_str()).collect();
                OpError::new(
                    FsError::INVAL,
                    format!("unknown tier {name:?} (tiers: {})", names.join(", ")),
                )
            })
    }

    /// Pin files to `tier` (None: the tier each is on now). Returns how many were pinned.
    /// A pinned file on another tier is moved there by a job (see `job_progress`).
    pub fn pin(
        self: &Arc<Self>,
        rel: &Path,
        tier: Option<&str>,
        recursive: bool,
    ) -> Result<(u64, Option<JobId>), OpError> {
        let want = match tier {
            Some(n) => Some(self.tier_index(n)?),
            None => None,
        };
        let files = self.targets(rel, recursive, "pin")?;
        let mut to_move = Vec::new();
        for ino in &files {
            let (cur, path) = {
                let ns = self.ns();
                (
                    ns.files.get(ino).map(|f| f.tier).unwrap_or(0),
                    ns.file_path(*ino).unwrap_or_default(),
                )
            };
            let t = want.unwrap_or(cur);
            self.placer().pin(*ino, Some(t));
            self.db()
                .set_pin(*ino, Some(t), &path)
                .map_err(|e| db_error("pin", &path, e))?;
            if t != cur {
                to_move.push((*ino, t));
            }
        }
        let job = if to_move.is_empty() {
            None
        } else {
            Some(self.spawn_job(to_move, "pinned by an operator"))
        };
        Ok((files.len() as u64, job))
    }

    /// Release pins. Returns how many files were unpinned.
    pub fn unpin(&self, rel: &Path, recursive: bool) -> Result<u64, OpError> {
        let files = self.targets(rel, recursive, "unpin")?;
        let mut n = 0;
        for ino in files {
            if self.placer().pins.contains_key(&ino) {
                n += 1;
            }
            self.placer().pin(ino, None);
            self.db()
                .set_pin(ino, None, Path::new(""))
                .map_err(|e| db_error("unpin", rel, e))?;
        }
        Ok(n)
    }

    /// Start moving files one tier faster/slower (or to `tier`). Poll `job_progress`.
    pub fn start_move(
        self: &Arc<Self>,
        rel: &Path,
        dir: Direction,
        tier: Option<&str>,
        recursive: bool,
    ) -> Result<JobId, OpError> {
        let target = match tier {
            Some(n) => Some(self.tier_index(n)?),
            None => None,
        };
        let verb = match dir {
            Direction::Promote => "promote",
            Direction::Demote => "demote",
        };
        let files = self.targets(rel, recursive, verb)?;
        let last = self.tiers.len() as u8 - 1;
        // A pin holds: a move off the pinned tier would leave the file "pinned to T" on
        // another tier for good (nothing brings it back). One file is refused naming the
        // pin; under `-r` pinned files stay where they are pinned.
        let pins = self.placer().pins.clone();
        let mut moves = Vec::new();
        {
            let ns = self.ns();
            for ino in files {
                let Some(f) = ns.files.get(&ino) else {
                    continue;
                };
                let to = match (target, dir) {
                    (Some(t), _) => t,
                    (None, Direction::Promote) => f.tier.saturating_sub(1),
                    (None, Direction::Demote) => (f.tier + 1).min(last),
                };
                if let Some(&pinned) = pins.get(&ino)
                    && pinned != to
                {
                    if recursive {
                        continue;
                    }
                    return Err(OpError::new(
                        FsError::PERM,
                        format!(
                            "{} is pinned to tier {}: unpin it first (kaiso unpin PATH), or pin it to another tier",
                            rel.display(),
                            self.tiers[pinned as usize].cfg.name
                        ),
                    ));
                }
                if to != f.tier {
                    moves.push((ino, to));
                }
            }
        }
        let what = match dir {
            Direction::Promote => "promoted by an operator",
            Direction::Demote => "demoted by an operator",
        };
        Ok(self.spawn_job(moves, what))
    }

    fn spawn_job(self: &Arc<Self>, moves: Vec<(Ino, u8)>, reason: &'static str) -> JobId {
        let id = self.mover.next_job.fetch_add(1, Ordering::Relaxed) + 1;
        let bytes_total = {
            let ns = self.ns();
            moves
                .iter()
                .map(|(i, _)| {
                    ns.files
                        .get(i)
                        .map(|f| f.state.size.load(Ordering::Relaxed))
                        .unwrap_or(0)
                })
                .sum()
        };
        self.mover
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                id,
                JobProgress {
                    files_total: moves.len() as u64,
                    bytes_total,
                    finished: moves.is_empty(),
                    ..Default::default()
                },
            );
        if moves.is_empty() {
            return id;
        }
        let store = self.clone();
        std::thread::spawn(move || {
            for (ino, to) in moves {
                if store.stopping() {
                    break;
                }
                let r = store.job_move(id, ino, to, reason);
                let mut jobs = store.mover.jobs.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(p) = jobs.get_mut(&id) {
                    p.files_done += 1;
                    match r {
                        // Its bytes were counted by the move as it copied them.
                        Ok(_) => {}
                        Err(e) => {
                            p.failed += 1;
                            p.error = Some(job_error(&e));
                        }
                    }
                }
            }
            if let Some(p) = store
                .mover
                .jobs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(&id)
            {
                p.finished = true;
            }
        });
        id
    }

    /// One file of an operator job: moves file `ino` to tier `to`. A file another move
    /// has in flight (the planner's, a spill, another job's) is not refused: the job
    /// waits for that move ([`Store::wait_for_move`], which has it finish unpaced) and
    /// moves the file on from where it landed, or counts it done when that is `to`.
    fn job_move(&self, job: JobId, ino: Ino, to: u8, reason: &str) -> Result<u64, MoveError> {
        let mut waits = 0;
        loop {
            match self.move_file_for_job(job, ino, to, reason) {
                // Bounded: a file the planner keeps picking up again is reported busy.
                Err(e) if e.in_flight() && waits < JOB_MOVE_WAITS && !self.stopping() => {
                    waits += 1;
                    self.wait_for_move(ino);
                }
                r => return r,
            }
        }
    }

    /// Progress of a job (None if unknown).
    pub fn job_progress(&self, id: JobId) -> Option<JobProgress> {
        self.mover
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Move one file now, synchronously (tests, tools). Returns bytes moved.
    pub fn move_now(&self, rel: &Path, tier: &str) -> Result<u64, crate::mover::MoveError> {
        let ino = self.resolve(rel)?;
        let to = self.tier_index(tier).map_err(FsError::from)?;
        self.move_file(ino, to, "moved by an operator", 0)
    }

    /// Reconcile the index and database with the tiers: adopt files added directly to a
    /// tier, drop records of vanished ones, rename shadowed duplicates, remove leftovers.
    pub fn fsck(&self) -> Result<FsckReport, crate::store::OpenError> {
        let mut report = FsckReport::default();
        self.scan(true, &mut report)?;
        Ok(report)
    }
}
