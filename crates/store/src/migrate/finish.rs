//! `finish`: verify the destination against the source, then remove every trace of the
//! migration so the tiers hold plain files and nothing of the migration stays in the path.
//!
//! Verification covers every file copied from the source that clients have not changed
//! since (same size and mtime as when its copy completed): its size must equal the
//! source's and its CRC32C must equal the source's, read again from the source. Files
//! clients modified or deleted are counted, not compared (they are legitimately different).

use std::time::UNIX_EPOCH;

use super::engine::Migration;
use super::source::SourcePath;
use super::state::Skipped;
use crate::Store;

/// What `finish` checked and found.
#[derive(Clone, Debug, Default)]
pub struct FinishReport {
    pub verified_files: u64,
    pub verified_bytes: u64,
    pub modified_by_clients: u64,
    pub deleted_by_clients: u64,
    /// Files whose size or checksum differs from the source (finish refuses then).
    pub mismatches: Vec<String>,
    /// Everything that was skipped during the migration, with the reason.
    pub skipped: Vec<Skipped>,
}

const VERIFY_CHUNK: u64 = 4 << 20;

/// Verifies and detaches migration `m`. Fails (changing nothing) if stubs remain or a
/// file does not match the source.
pub fn finish(store: &Store, m: &Migration) -> Result<FinishReport, String> {
    let remaining = m
        .reconcile(store)
        .map_err(|e| format!("reconcile: errno {}", e.errno()))?;
    if remaining > 0 {
        return Err(format!(
            "{remaining} stubs remain; let the crawl finish first (kaiso migrate status)"
        ));
    }
    let mut report = FinishReport {
        skipped: m.skipped(),
        ..FinishReport::default()
    };
    for (ino, src, size, mtime_ns) in m.db.done().map_err(|e| e.to_string())? {
        let Ok(attr) = store.getattr(ino, None) else {
            report.deleted_by_clients += 1;
            continue;
        };
        let now_ns = attr
            .mtime
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        if attr.size != size || now_ns != mtime_ns {
            report.modified_by_clients += 1;
            continue;
        }
        match verify_file(store, m, ino, &src, size) {
            Ok(()) => {
                report.verified_files += 1;
                report.verified_bytes += size;
            }
            Err(e) => report.mismatches.push(format!("{src}: {e}")),
        }
    }
    if !report.mismatches.is_empty() {
        return Err(format!(
            "{} files differ from the source, e.g. {}",
            report.mismatches.len(),
            report.mismatches[0]
        ));
    }
    // Detach: every stub row is gone already; drop anchors, the database and the state dir.
    m.db.clear_anchors().map_err(|e| e.to_string())?;
    let summary = format!(
        "source {}\nverified {} files ({} bytes)\nmodified by clients {}\ndeleted by clients {}\nskipped {}\n{}",
        m.source().describe(),
        report.verified_files,
        report.verified_bytes,
        report.modified_by_clients,
        report.deleted_by_clients,
        report.skipped.len(),
        report
            .skipped
            .iter()
            .map(|s| format!("  {} [{}] {}\n", s.src_path, s.kind, s.reason))
            .collect::<String>()
    );
    let report_path = m.state_dir().with_extension("finished.txt");
    std::fs::write(&report_path, summary).map_err(|e| format!("{}: {e}", report_path.display()))?;
    std::fs::remove_dir_all(m.state_dir())
        .map_err(|e| format!("remove {}: {e}", m.state_dir().display()))?;
    Ok(report)
}

fn verify_file(
    store: &Store,
    m: &Migration,
    ino: u64,
    src: &SourcePath,
    size: u64,
) -> Result<(), String> {
    let sattr = m.source().stat(src).map_err(|e| e.to_string())?;
    if sattr.size != size {
        return Err(format!("size {size} here, {} on the source", sattr.size));
    }
    let opened = store
        .open_file(ino, libc::O_RDONLY, false)
        .map_err(|e| format!("open: errno {}", e.errno()))?;
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
    result?;
    if here != there {
        return Err(format!("CRC32C {here:08x} here, {there:08x} on the source"));
    }
    Ok(())
}
