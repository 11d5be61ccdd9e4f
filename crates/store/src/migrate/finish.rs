//! `finish`: verify the destination against the source, then remove every trace of the
//! migration so the tiers hold plain files and nothing of the migration stays in the path.
//!
//! Verification covers every file copied from the source whose size and mtime are still
//! the source's (before and after it is read back): its CRC32C must equal the source's,
//! read again from the source. Files clients modified or deleted are counted, not
//! compared (they are legitimately different), whatever their copy state was: a deletion
//! is counted in the migration database when the client's unlink (or rename over the
//! file) removes its last name, as its rows go (or here, when the number is found held
//! by another file: `Migration::row_outlived_its_file`); a modification is seen here, as
//! a size or mtime other than the source's.
//!
//! **A copy is fetched again only if nobody can have changed it.** A completed file with
//! the source's size and mtime whose bytes differ is either a damaged copy or a client's
//! rewrite that put the mtime back (`touch -r`, `cp -p`, rsync, tar). The tier file's
//! ctime, recorded right after the fetch that completed it (no client can set a ctime
//! back), tells them apart: unchanged, nobody touched the file and it is fetched again;
//! changed (a client, a tier move, a hard link made after completion) or not recorded
//! (completed otherwise, a client change while it was a stub, a crash mid-file, a
//! database from before), its bytes are never replaced: equal to the source's it is
//! verified, else counted as modified by clients. The same holds for a file whose source
//! changed after its copy completed: fetched again only if its ctime is unchanged. The
//! ctime compared is the backing file's own (`Store::getattr_backing`), which clients do
//! not see moved by the store's fetches.
//!
//! **A copy is never kept torn.** A file whose source changed while it was copied (the
//! crawl's completion check reports it `[Changed] source changed during migration …`)
//! may hold the listed size of the new contents, or old and new bytes mixed. Its
//! completion is recorded with the listing's size and mtime, so here the source differs
//! from it and it is fetched again whole, as a file changed after its copy. If it cannot
//! be (its ctime moved or is not known, so it may hold a client's bytes; or the source
//! no longer has it), or the source changed again while it was fetched again, `finish`
//! refuses, naming the file: the administrator copies it again or deletes it.
//!
//! A source file whose size or mtime differs from
//! what its completed copy recorded changed on the source (which should have been
//! read-only): it is fetched again, reported as changed with both values, and neither
//! verified nor a mismatch. Every source directory that was listed is listed
//! once more: names added or removed on the source since are reported (the source should
//! have been read-only), not treated as failures.
//!
//! Detaching is crash-safe: the share's state directory (its database and whatever the
//! caller keeps there, e.g. the CLI's `share.json`) leaves `<state_dir>/migrate/` in one
//! durable rename before anything is deleted, so an interrupted finish never leaves a
//! share that the next start would take for a fresh one over the finished tree. The
//! renamed remains are deleted then, or at the next [`super::Migration::open`].

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::engine::{ADDED_AFTER_LISTING, CHANGED_DURING_COPY, Migration, REMOVED_AFTER_LISTING};
use super::source::{SourceAttr, SourceErrorKind, SourcePath, Timestamp};
use super::state::{Skipped, StubKind, StubRow};
use crate::stub::StubState;
use crate::{Caller, SetAttr, Store};

/// What `finish` checked and found.
#[derive(Clone, Debug, Default)]
pub struct FinishReport {
    pub verified_files: u64,
    pub verified_bytes: u64,
    /// Files copied from the source (or being copied) whose size or mtime a client
    /// changed since: a write, a truncation or new times, before or after the copy
    /// completed (not compared with the source); and files with the source's size and
    /// mtime but other bytes that someone may have changed since their copy completed
    /// (their ctime is not the one recorded then): kept as they are.
    pub modified_by_clients: u64,
    /// Files copied from the source (or being copied) that clients deleted during the
    /// migration, whatever their copy state then: never read, partly or wholly copied.
    /// A file replaced by a client's rename over it counts; a file with several hard
    /// links counts once its last name is gone.
    pub deleted_by_clients: u64,
    /// Files whose size or checksum differs from the source (finish refuses then).
    pub mismatches: Vec<String>,
    /// Files nobody changed since their copy completed (ctime as recorded then) whose
    /// bytes differed from the source's (e.g. fetched bytes lost to a power loss after
    /// their completion was recorded): fetched again from the source and verified again,
    /// by source path.
    pub refetched: Vec<String>,
    /// Files that changed on the source while they were copied or after their copy
    /// completed (size or mtime no longer what the listing said): fetched again whole,
    /// not counted as verified. Each entry names the source path and both sizes and
    /// mtimes.
    pub changed_on_source: Vec<String>,
    /// Everything that was skipped during the migration, with the reason, including
    /// entries added to or removed from the source after their directory was listed.
    pub skipped: Vec<Skipped>,
    /// Notices: what was migrated differently from the source (e.g. owners a daemon that
    /// is not root could not give), not left out.
    pub notices: Vec<Skipped>,
}

/// How [`finish_with`] treats the skip report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FinishOptions {
    /// Finish although source entries were left out (skip report entries other than
    /// source changes and notices, see [`left_out`]). Without it, `finish_with` refuses
    /// then, after verifying, with the share's state left in place (finish again).
    pub accept_skipped: bool,
}

/// Whether skip-report entry `s` is a source entry left out of the migration (permission
/// denied, not creatable here, metadata that could not be copied…): not a change of the
/// source (kind `Changed`, which `finish` fetches again or refuses over) and not a notice.
pub fn left_out(s: &Skipped) -> bool {
    s.kind != format!("{:?}", SourceErrorKind::Changed) && s.kind != super::engine::NOTICE_KIND
}

/// Where `finish` leaves a share's report: `<state_dir>/migrate/<name>.finished.txt`, next
/// to the share's state directory `share_dir` (a name with a dot keeps all of it).
pub fn report_path(share_dir: &std::path::Path) -> std::path::PathBuf {
    let mut name = share_dir.file_name().unwrap_or_default().to_os_string();
    name.push(".finished.txt");
    share_dir.with_file_name(name)
}

/// Where [`finish_stopping_at`] stops, leaving the state as a crash there would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishStop {
    /// Verified, anchors dropped, report written; the share's state still in place.
    AfterReport,
    /// The share's state directory renamed out of `migrate/`, not yet deleted.
    AfterDetach,
}

const VERIFY_CHUNK: u64 = 4 << 20;

/// The directory, next to `<state_dir>/migrate`, that finished shares' state is moved
/// into before it is deleted.
const FINISHING_DIR: &str = "migrate.finishing";

/// Verifies and detaches migration `m`. Fails (changing nothing) if stubs remain or a
/// file does not match the source.
/// Entries left out (the skip report) do not stop it: see [`finish_with`].
pub fn finish(store: &Store, m: &Migration) -> Result<FinishReport, String> {
    finish_inner(
        store,
        m,
        None,
        FinishOptions {
            accept_skipped: true,
        },
    )
}

/// [`finish`] that, unless `opts.accept_skipped`, also refuses (the share stays) when
/// source entries were left out of the migration ([`left_out`]): what `kaiso migrate
/// finish` does without `--accept-skipped`.
pub fn finish_with(
    store: &Store,
    m: &Migration,
    opts: FinishOptions,
) -> Result<FinishReport, String> {
    finish_inner(store, m, None, opts)
}

/// [`finish`] that stops at `stop` as a crash (kill -9) there would, for crash tests:
/// returns an error and leaves the state directory as it is at that point.
pub fn finish_stopping_at(
    store: &Store,
    m: &Migration,
    stop: FinishStop,
) -> Result<FinishReport, String> {
    finish_inner(
        store,
        m,
        Some(stop),
        FinishOptions {
            accept_skipped: true,
        },
    )
}

fn finish_inner(
    store: &Store,
    m: &Migration,
    stop: Option<FinishStop>,
    opts: FinishOptions,
) -> Result<FinishReport, String> {
    // Stubs left only for metadata a source outage interrupted are copied now.
    m.retry_metadata_only_stubs(store)
        .map_err(|e| format!("metadata copy: errno {}", e.errno()))?;
    let remaining = m
        .reconcile(store)
        .map_err(|e| format!("reconcile: errno {}", e.errno()))?;
    if remaining > 0 {
        // Entries the source does not give metadata for keep stubs until their retry
        // bound (see `meta_retry`): named, so the administrator knows what is waited for.
        let retried = m.metadata_retries();
        let named = match retried.first() {
            None => String::new(),
            Some(r) => format!(
                "; {} entries wait for metadata the source does not give, e.g. {}",
                retried.len(),
                r.describe()
            ),
        };
        return Err(format!(
            "{remaining} stubs remain; let the crawl finish first (kaiso migrate status){named}"
        ));
    }
    // Files deleted while the hook told us (their rows are gone); those whose deletion
    // went unnoticed still have a completion record, and are counted below.
    let mut report = FinishReport {
        deleted_by_clients: m.db.deleted_by_clients().map_err(|e| e.to_string())?,
        ..FinishReport::default()
    };
    // Files whose source changed while they were copied: their copy may mix old and new
    // bytes, so it is fetched again whole or `finish` refuses (never kept as it is).
    let torn = changed_during_copy(m);
    for done in m.db.done().map_err(|e| e.to_string())? {
        let (ino, src, size, mtime_ns) =
            (done.ino, done.src_path.clone(), done.size, done.mtime_ns);
        let before = match store.getattr_backing(ino) {
            Err(_) => {
                report.deleted_by_clients += 1;
                continue;
            }
            Ok(a) => a,
        };
        if super::engine::replaced(store, ino, done.ident.as_deref()) {
            // The file of the record is gone; another file holds its number now.
            m.db.forget_object(ino, &src).map_err(|e| e.to_string())?;
            report.deleted_by_clients += 1;
            continue;
        }
        if before.size != size || ns_since_epoch(before.mtime) != mtime_ns {
            report.modified_by_clients += 1;
            continue;
        }
        // Nobody changed the file since its copy completed: only then may it be
        // fetched again over what it holds.
        let untouched = done.ctime_ns == Some(ns_since_epoch(before.ctime));
        // What it looked like when it was read back (a client may write meanwhile).
        let mut seen = before;
        let mut outcome = verify_file(store, m, ino, &src, size, mtime_ns);
        if let Verified::Unreachable(e) = outcome {
            // Nothing can be told about this file or the rest: finish again later.
            return Err(format!(
                "the source cannot be reached ({e}); finish again once it answers"
            ));
        }
        // A copy that may mix old and new bytes and cannot be fetched again: gone from
        // the source, or changed here since (or not known) so it may hold a client's
        // bytes. Never kept silently: the administrator decides.
        let may_be_torn = size > 0 && torn.contains(src.as_bytes());
        let torn_kept = match &outcome {
            Verified::GoneFromSource if may_be_torn => Some((
                "removed from the source since".to_string(),
                "the source has no version left to fetch: delete it or write it whole",
            )),
            Verified::SourceChanged(now) if may_be_torn && !untouched => Some((
                change_text((size, mtime_ns), now),
                "not fetched again, as it may hold a client's changes (it changed here \
                 since its copy completed, or that is not known): copy the file again \
                 through the mount or delete it",
            )),
            _ => None,
        };
        if let Some((why, what_now)) = torn_kept {
            report.mismatches.push(format!(
                "{src}: changed on the source while it was copied ({why}), so the copy may \
                 mix old and new contents; {what_now}, then finish again"
            ));
            continue;
        }
        if let Verified::SourceChanged(now) = &outcome
            && !untouched
        {
            // The copy may hold a client's bytes: kept, the change reported.
            let line = format!(
                "{src}: {}; not fetched again: the copy changed here after it completed",
                change_text((size, mtime_ns), now)
            );
            m.db.skip(
                &src,
                SourceErrorKind::Changed,
                &format!("changed on the source after its copy completed: {line}"),
            )
            .map_err(|e| e.to_string())?;
            report.changed_on_source.push(line);
            continue;
        }
        if let Verified::SourceChanged(now) = outcome {
            let expect = before.ctime;
            let when = if may_be_torn {
                Changed::DuringCopy
            } else {
                Changed::AfterCopy
            };
            match fetch_changed(store, m, ino, &src, (size, mtime_ns), &now, expect, when) {
                Ok(Some(line)) => report.changed_on_source.push(line),
                // A client wrote it meanwhile: legitimately different.
                Ok(None) => report.modified_by_clients += 1,
                Err(e) => report.mismatches.push(format!("{src}: {e}")),
            }
            continue;
        }
        if let Verified::DataDiffers(why) = &outcome
            && !untouched
        {
            // Someone may have written it since its copy completed (its ctime moved, or
            // was not recorded): its bytes are never replaced.
            tracing::info!(
                "{src}: {why}, with the source's size and mtime; changed since its copy completed, so kept as modified"
            );
            report.modified_by_clients += 1;
            continue;
        }
        if let Verified::DataDiffers(why) = &outcome {
            // Same size as the source, other bytes, and nobody changed it since its copy
            // completed (its ctime is the one recorded then): the copy is bad (not the
            // source changed: its size and mtime are checked again when the fetch
            // completes). Re-stubbed and fetched again.
            tracing::warn!("{src}: {why}; fetched again from the source");
            let refetched = refetch(
                store,
                m,
                ino,
                &src,
                (size, mtime_ns),
                None,
                (before.ctime, done.ident.clone()),
            );
            outcome = match refetched {
                Ok(()) => {
                    report.refetched.push(src.to_string());
                    match store.getattr_backing(ino) {
                        Ok(a) if a.size == size && ns_since_epoch(a.mtime) == mtime_ns => {
                            seen = a;
                            verify_file(store, m, ino, &src, size, mtime_ns)
                        }
                        // Written by a client while it was fetched again.
                        _ => {
                            report.modified_by_clients += 1;
                            continue;
                        }
                    }
                }
                Err(e) if e == CHANGED_MEANWHILE => {
                    report.modified_by_clients += 1;
                    continue;
                }
                Err(e) => Verified::Differs(format!("{why}; fetching again failed: {e}")),
            };
        }
        // A client may have written the file while it was read back: then it is
        // legitimately different, not a failed copy.
        let still = store
            .getattr_backing(ino)
            .is_ok_and(|a| (a.size, a.mtime, a.ctime) == (seen.size, seen.mtime, seen.ctime));
        if !still {
            report.modified_by_clients += 1;
            continue;
        }
        match outcome {
            Verified::Same => {
                report.verified_files += 1;
                report.verified_bytes += size;
            }
            // Reported by the listing comparison below (removed after listing).
            Verified::GoneFromSource => {}
            // Changed while its bad copy was fetched again: report it as changed.
            Verified::SourceChanged(now) => report
                .changed_on_source
                .push(format!("{src}: {}", change_text((size, mtime_ns), &now))),
            Verified::Differs(e) | Verified::DataDiffers(e) | Verified::Unreachable(e) => {
                report.mismatches.push(format!("{src}: {e}"))
            }
        }
    }
    record_source_changes(m)?;
    let (notices, skipped): (Vec<_>, Vec<_>) = m
        .skipped()
        .into_iter()
        .partition(|s| s.kind == super::engine::NOTICE_KIND);
    report.skipped = skipped;
    report.notices = notices;
    if !report.mismatches.is_empty() {
        return Err(format!(
            "{} files differ from the source, e.g. {}",
            report.mismatches.len(),
            report.mismatches[0]
        ));
    }
    let left: Vec<&Skipped> = report.skipped.iter().filter(|s| left_out(s)).collect();
    if !opts.accept_skipped && !left.is_empty() {
        return Err(format!(
            "{} source entries were not migrated (skip report), e.g. {} [{}] {}; see kaiso \
             migrate status, then finish with --accept-skipped to finish without them",
            left.len(),
            left[0].src_path,
            left[0].kind,
            left[0].reason
        ));
    }
    crash_point("verified");
    // Detach: every stub row is gone already; drop anchors, write the report, then move
    // the state directory out of `migrate/` in one durable step before deleting it.
    m.db.clear_anchors().map_err(|e| e.to_string())?;
    crash_point("anchors");
    let report_path = report_path(m.state_dir());
    write_durably(&report_path, summary(m, &report).as_bytes())
        .map_err(|e| format!("{}: {e}", report_path.display()))?;
    crash_point("report");
    if stop == Some(FinishStop::AfterReport) {
        return Err("stopped after the report (test)".into());
    }
    let trash = detach_state_dir(m.state_dir())?;
    crash_point("detached");
    if stop == Some(FinishStop::AfterDetach) {
        return Err("stopped after detaching the state directory (test)".into());
    }
    // Detached already: what cannot be deleted now is deleted at the next open (or by
    // the next `finish`, see [`clean_interrupted_finishes`]).
    if let Err(e) = remove_detached(&trash) {
        tracing::warn!(
            "remove {}: {e} (retried at the next start)",
            trash.display()
        );
    }
    if let Some(parent) = trash.parent() {
        let _ = fs::remove_dir(parent);
    }
    crash_point("removed");
    Ok(report)
}

/// Deletes a detached share state directory: the small files first, the database last
/// (a crash in between leaves only `migrate.finishing/`, which nothing reads as a share).
fn remove_detached(trash: &Path) -> std::io::Result<()> {
    let mut names: Vec<PathBuf> = fs::read_dir(trash)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort_by_key(|p| {
        p.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("migrate.db"))
    });
    for (i, p) in names.iter().enumerate() {
        if i == 1 {
            crash_point("removing");
        }
        let r = if p.is_dir() {
            fs::remove_dir_all(p)
        } else {
            fs::remove_file(p)
        };
        match r {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    fs::remove_dir(trash)
}

/// Test hook: `KAISO_FINISH_CRASH_AT=STEP` kills this process with SIGKILL at `STEP` of
/// a finish (`verified`, `anchors`, `report`, `detached`, `removing`, `removed`), as a
/// kill -9 there would (crash tests run the finish in a child process).
fn crash_point(step: &str) {
    if std::env::var_os("KAISO_FINISH_CRASH_AT").is_some_and(|v| v == step) {
        eprintln!("kaiso: KAISO_FINISH_CRASH_AT={step}: killed");
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

fn summary(m: &Migration, report: &FinishReport) -> String {
    format!(
        "source {}\nverified {} files ({} bytes)\nmodified by clients {}\ndeleted by clients {}\nchanged on the source {}\n{}skipped {}\n{}",
        m.source().describe(),
        report.verified_files,
        report.verified_bytes,
        report.modified_by_clients,
        report.deleted_by_clients,
        report.changed_on_source.len(),
        report
            .changed_on_source
            .iter()
            .map(|c| format!("  {c}\n"))
            .collect::<String>(),
        report.skipped.len(),
        report
            .skipped
            .iter()
            .chain(&report.notices)
            .map(|s| format!("  {} [{}] {}\n", s.src_path, s.kind, s.reason))
            .collect::<String>()
    )
}

fn ns_since_epoch(t: std::time::SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Lists every listed source directory again and records, in the skip report, what was
/// added or removed there since its listing (the source should have been read-only).
/// Fails only when the source cannot be reached (finish is retried then).
fn record_source_changes(m: &Migration) -> Result<(), String> {
    let already: HashSet<(Vec<u8>, String)> = m
        .skipped()
        .into_iter()
        .map(|s| (s.src_path.as_bytes().to_vec(), s.kind))
        .collect();
    let changed = format!("{:?}", SourceErrorKind::Changed);
    let known_change = |p: &SourcePath| already.contains(&(p.as_bytes().to_vec(), changed.clone()));
    let record = |p: &SourcePath, kind: SourceErrorKind, why: &str| {
        m.db.skip(p, kind, why).map_err(|e| e.to_string())
    };
    // Directories reported removed: their listed subdirectories are gone with them.
    let mut removed_dirs: Vec<SourcePath> = Vec::new();
    let under_removed = |p: &SourcePath, removed: &[SourcePath]| {
        removed.iter().any(|r| {
            let (r, p) = (r.as_bytes(), p.as_bytes());
            p.len() > r.len() && p.starts_with(r) && p[r.len()] == b'/'
        })
    };
    let removed_reason = format!("{REMOVED_AFTER_LISTING}; what was copied is kept here");
    // A page of directories at a time: the listings hold every name the share listed.
    let mut after: Option<SourcePath> = None;
    loop {
        let page =
            m.db.listings_after(after.as_ref(), LISTINGS_PAGE)
                .map_err(|e| e.to_string())?;
        let Some((last, _)) = page.last() else {
            return Ok(());
        };
        after = Some(last.clone());
        for (dir, then) in page {
            if under_removed(&dir, &removed_dirs) {
                continue;
            }
            let now = match m.source().read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if matches!(e.kind, SourceErrorKind::Unreachable | SourceErrorKind::Io) => {
                    return Err(format!("list {dir} on the source again: {e}"));
                }
                Err(e) if e.kind == SourceErrorKind::NotFound => {
                    if !known_change(&dir) {
                        record(&dir, SourceErrorKind::Changed, &removed_reason)?;
                    }
                    removed_dirs.push(dir);
                    continue;
                }
                Err(e) => {
                    record(
                        &dir,
                        e.kind,
                        &format!("listed again at finish: {}", e.message),
                    )?;
                    continue;
                }
            };
            let then: HashSet<&[u8]> = then.iter().map(Vec::as_slice).collect();
            let now_names: HashSet<&[u8]> = now.iter().map(|e| e.name.as_slice()).collect();
            for name in now_names.difference(&then) {
                match dir.join(name) {
                    Ok(p) => record(&p, SourceErrorKind::Changed, ADDED_AFTER_LISTING)?,
                    Err(e) => record(
                        &dir,
                        SourceErrorKind::Changed,
                        &format!("{ADDED_AFTER_LISTING}: {}", e.message),
                    )?,
                }
            }
            for name in then.difference(&now_names) {
                // Names that were invalid were reported when they were listed.
                if let Ok(p) = dir.join(name)
                    && !known_change(&p)
                {
                    record(&p, SourceErrorKind::Changed, &removed_reason)?;
                }
            }
        }
    }
}

/// Directories compared per page in [`record_source_changes`].
const LISTINGS_PAGE: u32 = 1024;

/// Moves a share's state directory `dir` (`<state_dir>/migrate/<name>`) to
/// `<state_dir>/migrate.finishing/<name>` and makes the move durable; returns the new
/// path. From then on nothing under `migrate/` names the share.
fn detach_state_dir(dir: &Path) -> Result<PathBuf, String> {
    let (Some(name), Some(migrate)) = (dir.file_name(), dir.parent()) else {
        return Err(format!("{}: not a share state directory", dir.display()));
    };
    let state_dir = migrate.parent().unwrap_or(Path::new("/"));
    let finishing = state_dir.join(FINISHING_DIR);
    let trash = finishing.join(name);
    let err = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    private_dir(&finishing).map_err(|e| err("create", &finishing, e))?;
    if trash.exists() {
        fs::remove_dir_all(&trash).map_err(|e| err("remove", &trash, e))?;
    }
    // A start of another share cleans `migrate.finishing/` up (see
    // `clean_interrupted_finishes`): made again once if it went in between.
    let moved = fs::rename(dir, &trash).or_else(|e| match e.kind() {
        std::io::ErrorKind::NotFound if dir.exists() => {
            private_dir(&finishing).and_then(|()| fs::rename(dir, &trash))
        }
        _ => Err(e),
    });
    moved.map_err(|e| err("move", dir, e))?;
    // Both directories: the entry must be gone from `migrate/` for good.
    sync_dir(migrate).map_err(|e| err("sync", migrate, e))?;
    sync_dir(&finishing).map_err(|e| err("sync", &finishing, e))?;
    Ok(trash)
}

/// Deletes what interrupted finishes of the store whose state directory is `state_dir`
/// left behind (detached already: nothing of it is a share any more).
pub fn clean_interrupted_finishes(state_dir: &Path) {
    let finishing = state_dir.join(FINISHING_DIR);
    match fs::remove_dir_all(&finishing) {
        Ok(()) => tracing::info!("removed the state of an interrupted finish"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!("remove {}: {e}", finishing.display()),
    }
}

/// Creates `dir` (and missing parents) 0700 whatever the process umask.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// Writes `path` through a temporary file, synced, renamed into place, directory synced.
fn write_durably(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    {
        // 0644 whatever the process umask (the daemons run with umask 0): readable, in
        // the 0700 `<state_dir>/migrate`, by whoever may read the state.
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.set_permissions(fs::Permissions::from_mode(0o644))?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))
}

/// Outcome of comparing one completed file with the source.
enum Verified {
    Same,
    /// The source no longer has the file (reported as removed after listing).
    GoneFromSource,
    Differs(String),
    /// Same size, other bytes.
    DataDiffers(String),
    /// The source's size or mtime is no longer what the completed copy recorded: its
    /// attributes now.
    SourceChanged(SourceAttr),
    /// The source did not answer (nothing is known about the file).
    Unreachable(String),
}

/// Source file `src` changed after the copy of `ino` completed (`was`: its size and
/// mtime then; `now`: its attributes now): records the change in the skip report, fetches
/// the file again at its new size with the source's new mtime, and checks the new copy.
/// `expect`: the copy's ctime, which nobody changed since it completed (else it is not
/// fetched again, see `refetch`).
/// `Some(line for the report)`; `None` when a client wrote the file meanwhile; an error
/// when the source kept still and the copy still differs (or fetching failed), or when
/// the source changed again while it was fetched again (the new copy may be torn).
#[allow(clippy::too_many_arguments)]
fn fetch_changed(
    store: &Store,
    m: &Migration,
    ino: u64,
    src: &SourcePath,
    was: (u64, i64),
    now: &SourceAttr,
    expect: std::time::SystemTime,
    when: Changed,
) -> Result<Option<String>, String> {
    let line = change_text(was, now);
    let when = match when {
        Changed::DuringCopy => "while it was copied",
        Changed::AfterCopy => "after its copy completed",
    };
    tracing::warn!("{src}: changed on the source {when} ({line}); fetched again");
    m.db.skip(
        src,
        SourceErrorKind::Changed,
        &format!("changed on the source {when}: {line}; fetched again whole"),
    )
    .map_err(|e| e.to_string())?;
    let new = (now.size, ts_ns(now.mtime));
    let ident =
        m.db.done_row(ino)
            .map_err(|e| e.to_string())?
            .and_then(|d| d.ident);
    if let Err(e) = refetch(store, m, ino, src, new, Some(now.mtime), (expect, ident)) {
        if e == CHANGED_MEANWHILE {
            return Ok(None);
        }
        return Err(format!(
            "changed on the source ({line}); fetching again failed: {e}"
        ));
    }
    let client_wrote = || {
        !store
            .getattr_backing(ino)
            .is_ok_and(|a| a.size == new.0 && ns_since_epoch(a.mtime) == new.1)
    };
    if client_wrote() {
        return Ok(None);
    }
    match verify_file(store, m, ino, src, new.0, new.1) {
        Verified::Same => Ok(Some(format!("{src}: {line}"))),
        // Changed again while it was fetched again: that copy may be torn as well (the
        // completion reported it); `finish` fetches it again when run again.
        Verified::SourceChanged(again) if changed_during_copy(m).contains(src.as_bytes()) => {
            Err(format!(
                "changed on the source ({line}), and again while it was fetched again ({}): \
                 the source is in use; finish again once it keeps still",
                change_text(new, &again)
            ))
        }
        // Changed again after it was fetched again: the copy is that whole version.
        Verified::SourceChanged(again) => Ok(Some(format!(
            "{src}: {line}; changed again since it was fetched again: {}",
            change_text(new, &again)
        ))),
        Verified::GoneFromSource => Ok(Some(format!("{src}: {line}; removed since"))),
        Verified::Unreachable(e) => Err(format!(
            "changed on the source ({line}) and fetched again, then not checked: {e}"
        )),
        Verified::Differs(e) | Verified::DataDiffers(e) if !client_wrote() => Err(format!(
            "changed on the source ({line}) and fetched again, but the copy differs: {e}"
        )),
        Verified::Differs(_) | Verified::DataDiffers(_) => Ok(None),
    }
}

/// When a source file changed, as `finish` tells it (see [`fetch_changed`]).
#[derive(Clone, Copy)]
enum Changed {
    /// While it was copied: the crawl's completion check reported it.
    DuringCopy,
    /// After its copy completed.
    AfterCopy,
}

/// The source paths (bytes) whose skip report says their source changed while they were
/// copied (`Migration::complete`): such a copy may mix old and new bytes.
fn changed_during_copy(m: &Migration) -> HashSet<Vec<u8>> {
    let changed = format!("{:?}", SourceErrorKind::Changed);
    m.skipped()
        .into_iter()
        .filter(|s| s.kind == changed && s.reason.starts_with(CHANGED_DURING_COPY))
        .map(|s| s.src_path.as_bytes().to_vec())
        .collect()
}

/// `size A → B, mtime X → Y` (only what differs) for a source file that changed.
fn change_text(was: (u64, i64), now: &SourceAttr) -> String {
    let mut parts = Vec::new();
    if was.0 != now.size {
        parts.push(format!("size {} → {}", was.0, now.size));
    }
    let now_ns = ts_ns(now.mtime);
    if was.1 != now_ns {
        parts.push(format!("mtime {} → {}", ns_text(was.1), ns_text(now_ns)));
    }
    if parts.is_empty() {
        parts.push("attributes changed".into());
    }
    parts.join(", ")
}

/// Nanoseconds since the epoch as `SECONDS.NANOSECONDS`.
fn ns_text(ns: i64) -> String {
    format!(
        "{}.{:09}",
        ns.div_euclid(1_000_000_000),
        ns.rem_euclid(1_000_000_000)
    )
}

fn ts_ns(t: Timestamp) -> i64 {
    t.secs.saturating_mul(1_000_000_000) + i64::from(t.nanos)
}

fn system_time(t: Timestamp) -> std::time::SystemTime {
    let ns = ts_ns(t);
    if ns >= 0 {
        UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - std::time::Duration::from_nanos(ns.unsigned_abs())
    }
}

/// What [`refetch`] fails with when the file changed since it was checked.
const CHANGED_MEANWHILE: &str = "changed by a client meanwhile; kept";

/// Makes completed file `ino` a stub again, wholly missing, with its row recorded as
/// the crawl would have it, and fetches it again (the fetch records its completion).
/// The copy takes the source's `size` first (a file whose source changed; else it has
/// it already) and keeps its mtime, or takes `new_mtime` (the changed source's).
/// Only while its ctime is still `expect` (nobody changed it since it was checked; else
/// it fails with [`CHANGED_MEANWHILE`], nothing done); `ident`: its backing identity.
fn refetch(
    store: &Store,
    m: &Migration,
    ino: u64,
    src: &SourcePath,
    (size, mtime_ns): (u64, i64),
    new_mtime: Option<Timestamp>,
    (expect, ident): (std::time::SystemTime, Option<Vec<u8>>),
) -> Result<(), String> {
    let a = store
        .getattr_backing(ino)
        .map_err(|e| format!("getattr: errno {}", e.errno()))?;
    if a.ctime != expect {
        return Err(CHANGED_MEANWHILE.into());
    }
    let row = StubRow {
        ino,
        kind: StubKind::PartialFile,
        src_path: src.clone(),
        src_ino: 0,
        minsize: size,
        listed_size: size,
        listed_mtime_ns: mtime_ns,
        ident,
    };
    // The row first: a crash in between leaves a stub the next start completes.
    m.db.insert(std::slice::from_ref(&row), &[])
        .map_err(|e| e.to_string())?;
    if a.size != size {
        let set = SetAttr {
            size: Some(size),
            ..SetAttr::default()
        };
        store
            .setattr(ino, &set, Caller::ROOT)
            .map_err(|e| format!("resize to {size}: errno {}", e.errno()))?;
    }
    store
        .stub_mark(
            ino,
            StubState {
                unlisted_dir: false,
                missing: vec![(0, size)],
                times: Some((a.atime, new_mtime.map_or(a.mtime, system_time))),
            },
        )
        .map_err(|e| format!("re-stub: errno {}", e.errno()))?;
    m.fetch_range(store, &row, 0, size)
        .map_err(|e| format!("fetch: errno {}", e.errno()))?;
    if !store.stub_state(ino).missing.is_empty() {
        return Err("still missing after the fetch".into());
    }
    Ok(())
}

/// Compares completed file `ino` with source file `src`, which had `size` bytes and
/// mtime `mtime_ns` when the copy completed.
fn verify_file(
    store: &Store,
    m: &Migration,
    ino: u64,
    src: &SourcePath,
    size: u64,
    mtime_ns: i64,
) -> Verified {
    let sattr = match m.source().stat(src) {
        Ok(a) => a,
        Err(e) if e.kind == SourceErrorKind::NotFound => return Verified::GoneFromSource,
        Err(e) if e.kind == SourceErrorKind::Unreachable => {
            return Verified::Unreachable(e.to_string());
        }
        Err(e) => return Verified::Differs(e.to_string()),
    };
    if sattr.size != size || ts_ns(sattr.mtime) != mtime_ns {
        return Verified::SourceChanged(sattr);
    }
    let opened = match store.open_file(ino, libc::O_RDONLY, false) {
        Ok(o) => o,
        Err(e) => return Verified::Differs(format!("open: errno {}", e.errno())),
    };
    let mut here = 0u32;
    let mut there = 0u32;
    let mut at = 0;
    let mut result = Ok(());
    while at < size {
        let n = VERIFY_CHUNK.min(size - at);
        let a = match store.read(opened.fh, at, n as u32) {
            Ok(d) => d,
            Err(e) => {
                result = Err(format!("read: errno {}", e.errno()));
                break;
            }
        };
        let b = match m.source().read(src, at, n as usize) {
            Ok(d) => d,
            Err(e) => {
                result = Err(e.to_string());
                break;
            }
        };
        here = crc32c::crc32c_append(here, &a);
        there = crc32c::crc32c_append(there, &b);
        at += n;
    }
    let _ = store.release(opened.fh);
    if let Err(e) = result {
        return Verified::Differs(e);
    }
    if here != there {
        return Verified::DataDiffers(format!("CRC32C {here:08x} here, {there:08x} on the source"));
    }
    Verified::Same
}

#[cfg(test)]
mod report_path_tests {
    use super::report_path;
    use std::path::Path;

    #[test]
    fn a_share_name_with_dots_keeps_all_of_it() {
        assert_eq!(
            report_path(Path::new("/s/migrate/x.1")),
            Path::new("/s/migrate/x.1.finished.txt")
        );
        assert_eq!(
            report_path(Path::new("/s/migrate/main")),
            Path::new("/s/migrate/main.finished.txt")
        );
    }
}

/// A source changed while (or after) its files were copied, and a tier too small for a
/// listing: `finish` never exits with a torn or truncated copy, nor without a file.
#[cfg(test)]
mod source_change_tests {
    use std::collections::HashMap;
    use std::ffi::OsStr;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::super::engine::mark_crawler_thread;
    use super::super::source::{
        FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
        SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
    };
    use super::super::{CrawlState, Crawler, Migration, MigrationConfig, Migrations};
    use crate::types::{Ino, ROOT_INO};
    use crate::{Store, StoreConfig};

    /// A file's mtime (seconds) and bytes.
    type Contents = (i64, Vec<u8>);

    /// Files in the root only, changeable by the test, by name.
    #[derive(Clone, Default)]
    struct Files(Arc<Mutex<HashMap<Vec<u8>, Contents>>>);

    impl Files {
        fn set(&self, name: &str, mtime: i64, data: Vec<u8>) {
            self.0
                .lock()
                .unwrap()
                .insert(name.as_bytes().to_vec(), (mtime, data));
        }
    }

    fn attr(kind: FileKind, ino: u64, size: u64, mtime: i64) -> SourceAttr {
        let t = Timestamp {
            secs: mtime,
            nanos: 0,
        };
        SourceAttr {
            perm: 0o644,
            ..SourceAttr::plain(kind, ino, size, t)
        }
    }

    struct ChangingSource(Files);

    impl ChangingSource {
        fn file(&self, path: &SourcePath) -> SourceResult<(SourceAttr, Vec<u8>)> {
            let files = self.0.0.lock().unwrap();
            let mut names: Vec<&Vec<u8>> = files.keys().collect();
            names.sort();
            let name = path.file_name().unwrap_or_default();
            let ino = 2 + names.iter().position(|n| n.as_slice() == name).unwrap_or(0) as u64;
            match files.get(name) {
                Some((mtime, data)) if !path.is_root() => Ok((
                    attr(FileKind::Regular, ino, data.len() as u64, *mtime),
                    data.clone(),
                )),
                _ => Err(SourceError::new(
                    SourceErrorKind::NotFound,
                    path,
                    "no such file",
                )),
            }
        }
    }

    impl Source for ChangingSource {
        fn describe(&self) -> String {
            "changing memory".into()
        }
        fn features(&self) -> SourceFeatures {
            SourceFeatures {
                unix_ids: true,
                ..SourceFeatures::default()
            }
        }
        fn stat(&self, path: &SourcePath) -> SourceResult<SourceAttr> {
            if path.is_root() {
                return Ok(attr(FileKind::Directory, 1, 0, 1_000_000_000));
            }
            self.file(path).map(|f| f.0)
        }
        fn read_dir(&self, path: &SourcePath) -> SourceResult<Vec<SourceEntry>> {
            if !path.is_root() {
                return Err(SourceError::new(SourceErrorKind::NotFound, path, "no dir"));
            }
            let names: Vec<Vec<u8>> = self.0.0.lock().unwrap().keys().cloned().collect();
            let mut out = Vec::new();
            for n in names {
                let p = path.join(&n)?;
                out.push(SourceEntry {
                    name: n,
                    attr: self.file(&p)?.0,
                });
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(out)
        }
        fn read(&self, path: &SourcePath, offset: u64, len: usize) -> SourceResult<Vec<u8>> {
            let (_, data) = self.file(path)?;
            let from = (offset as usize).min(data.len());
            Ok(data[from..(from + len).min(data.len())].to_vec())
        }
        source_without_metadata!();
    }

    fn bytes(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    struct Setup {
        dir: tempfile::TempDir,
        store: Arc<Store>,
        m: Arc<Migration>,
        files: Files,
    }

    /// A one-tier store (`capacity`) migrating a `ChangingSource` holding `files`.
    fn setup(capacity: &str, files: &[(&str, Vec<u8>)]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t0")).unwrap();
        let cfg = format!(
            "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n[[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"{capacity}\"\nhigh_watermark = 1.0\nlow_watermark = 0.5\n",
            dir.path().join("state").display(),
            dir.path().join("t0").display()
        );
        let store = Store::open(StoreConfig::from_toml_str(&cfg, "test.toml").unwrap()).unwrap();
        let shared = Files::default();
        for (n, d) in files {
            shared.set(n, 1_000_000_000, d.clone());
        }
        let mut mc = MigrationConfig::new("t");
        mc.crawl_workers = 1;
        mc.unit_size = 64 << 10;
        let m = Migration::open(&store, Box::new(ChangingSource(shared.clone())), mc).unwrap();
        let all = Migrations::new();
        all.add(m.clone());
        store.set_stub_filler(all);
        Setup {
            dir,
            store,
            m,
            files: shared,
        }
    }

    impl Setup {
        fn ino(&self, name: &str) -> Ino {
            let a = self.store.lookup(ROOT_INO, OsStr::new(name)).unwrap();
            self.store.forget(a.ino, 1);
            a.ino
        }
        fn read(&self, ino: Ino, offset: u64, len: u32) {
            let fh = self.store.open_file(ino, libc::O_RDONLY, false).unwrap().fh;
            self.store.read(fh, offset, len).unwrap();
            self.store.release(fh).unwrap();
        }
        fn crawl(&self) -> CrawlState {
            let c = Crawler::start(self.store.clone(), self.m.clone());
            let state = c.wait(Duration::from_secs(60));
            drop(c);
            state
        }
        fn tier_file(&self, name: &str) -> Vec<u8> {
            std::fs::read(self.dir.path().join("t0").join(name)).unwrap()
        }
    }

    #[test]
    fn a_file_grown_on_the_source_after_listing_is_fetched_again_whole_by_finish() {
        let s = setup("1GiB", &[("grow", b"version one\n".to_vec())]);
        let ino = s.ino("grow");
        s.files
            .set("grow", 1_000_000_100, b"version two, longer\n".to_vec());
        assert_eq!(s.crawl(), CrawlState::Done);
        assert_eq!(s.tier_file("grow"), b"version two,", "the listed 12 bytes");
        let changed = s.m.skipped();
        assert!(
            changed
                .iter()
                .any(|x| x.kind == "Changed" && x.reason.contains("12 -> 20")),
            "the crawl reports the change: {changed:?}"
        );
        let r = super::finish(&s.store, &s.m).expect("finish fetches the file again");
        assert_eq!(r.changed_on_source.len(), 1, "{r:?}");
        assert!(r.changed_on_source[0].contains("size 12 → 20"), "{r:?}");
        assert_eq!(s.tier_file("grow"), b"version two, longer\n");
        let a = s.store.getattr(ino, None).unwrap();
        assert_eq!(
            a.mtime,
            std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_100),
            "the new copy has the source's new mtime"
        );
        assert!(
            r.skipped
                .iter()
                .any(|x| x.kind == "Changed" && x.reason.contains("while it was copied")),
            "the skip report keeps a [Changed] line: {:?}",
            r.skipped
        );
    }

    #[test]
    fn a_file_rewritten_on_the_source_during_its_copy_is_fetched_again_whole_by_finish() {
        let (old, new) = (bytes(1, 200_000), bytes(2, 200_000));
        let s = setup("1GiB", &[("big", old.clone())]);
        let ino = s.ino("big");
        // The first unit of the old contents, then the source is rewritten in place.
        s.read(ino, 0, 1000);
        s.files.set("big", 1_000_000_100, new.clone());
        assert_eq!(s.crawl(), CrawlState::Done);
        let torn = s.tier_file("big");
        assert!(torn != old && torn != new, "the crawl's copy is torn");
        let r = super::finish(&s.store, &s.m).expect("finish fetches the file again");
        assert_eq!(r.changed_on_source.len(), 1, "{r:?}");
        assert!(r.mismatches.is_empty(), "{r:?}");
        assert!(
            s.tier_file("big") == new,
            "the copy is the source's new contents"
        );
    }

    #[test]
    fn a_torn_copy_that_may_hold_a_clients_bytes_makes_finish_refuse() {
        let (old, new) = (bytes(1, 200_000), bytes(2, 200_000));
        let s = setup("1GiB", &[("big", old.clone())]);
        let ino = s.ino("big");
        s.read(ino, 0, 1000);
        s.files.set("big", 1_000_000_100, new);
        assert_eq!(s.crawl(), CrawlState::Done);
        // A client changes the copy's mode: its ctime is no longer the recorded one, so
        // finish may not fetch it again over it; nor may it keep a torn copy.
        let set = crate::SetAttr {
            mode: Some(0o600),
            ..crate::SetAttr::default()
        };
        std::thread::sleep(Duration::from_millis(20));
        s.store.setattr(ino, &set, crate::Caller::ROOT).unwrap();
        let e = super::finish(&s.store, &s.m).expect_err("finish must refuse a torn copy");
        assert!(
            e.contains("changed on the source while it was copied") && e.contains("/big"),
            "the refusal names the file and why: {e}"
        );
        assert!(
            s.dir.path().join("state/migrate/t").exists(),
            "a refused finish keeps the share's state"
        );
    }

    #[test]
    fn a_full_tier_while_listing_leaves_the_directory_unlisted_and_skips_nothing() {
        // 1 MiB of room: `a` fits, `b` does not.
        let s = setup(
            "1MiB",
            &[("a", bytes(1, 600 << 10)), ("b", bytes(2, 600 << 10))],
        );
        for _ in 0..2 {
            let e = s.store.lookup(ROOT_INO, OsStr::new("b")).unwrap_err();
            assert_eq!(e.errno(), libc::ENOSPC, "the listing fails with ENOSPC");
            // As a crawler worker lists it too.
            let store = s.store.clone();
            let crawler_listing = std::thread::spawn(move || {
                mark_crawler_thread();
                store.opendir(ROOT_INO).map(|fh| store.releasedir(fh))
            })
            .join()
            .unwrap();
            assert!(crawler_listing.is_err(), "the crawler's listing fails too");
        }
        assert!(s.store.stub_state(ROOT_INO).unlisted_dir, "still unlisted");
        assert!(
            s.m.skipped().is_empty(),
            "nothing skipped for good: {:?}",
            s.m.skipped()
        );
        assert_eq!(s.crawl(), CrawlState::Stuck, "the crawl cannot complete");
        let e = super::finish(&s.store, &s.m).expect_err("finish refuses");
        assert!(e.contains("stubs remain"), "{e}");
    }
}
