//! Progress figures of a share (the engine's `Migration::progress`, or its saved state
//! without a daemon), their text rendering and the `--watch` progress bars.

use super::protocol::{
    CrawlFailureEntry, MetadataRetryEntry, ShareSpec, ShareStatus, SkippedEntry, StatusReply,
};
use indicatif::{HumanBytes, HumanDuration, MultiProgress, ProgressBar, ProgressStyle};
use kaiso_store::migrate::{CrawlFailure, Migration, Progress, Skipped};
use std::path::Path;
use std::time::Duration;

/// The skip report as the protocol carries it (source paths as lossy UTF-8).
pub fn skipped_entries(skipped: Vec<Skipped>) -> Vec<SkippedEntry> {
    skipped
        .into_iter()
        .map(|k| SkippedEntry {
            path: format!("/{}", String::from_utf8_lossy(k.src_path.as_bytes())),
            kind: k.kind,
            reason: k.reason,
        })
        .collect()
}

/// The crawl's failures as the protocol carries them (errno as its message).
pub fn crawl_failure_entries(failures: Vec<CrawlFailure>) -> Vec<CrawlFailureEntry> {
    failures
        .into_iter()
        .map(|f| CrawlFailureEntry {
            ino: f.ino,
            step: f.what.to_string(),
            error: std::io::Error::from_raw_os_error(f.errno).to_string(),
        })
        .collect()
}

/// Entries whose metadata is retried as the protocol carries them.
pub fn metadata_retry_entries(
    retries: Vec<kaiso_store::migrate::meta_retry::MetadataRetry>,
) -> Vec<MetadataRetryEntry> {
    retries
        .into_iter()
        .map(|r| MetadataRetryEntry {
            path: r.src_path.to_string(),
            attempts: r.attempts,
            give_up_attempts: r.give_up_attempts,
            give_up_after_secs: r.give_up_after.as_secs(),
            first_failed_unix: r.first_failed_unix,
            last_error: r.last_error.clone(),
            text: r.describe(),
        })
        .collect()
}

/// Fills the progress fields of a status.
pub fn apply_progress(s: &mut ShareStatus, p: Progress) {
    s.remaining_stubs = p.remaining;
    s.dirs_pending = p.dirs_pending;
    s.files_done = p.files_done;
    s.files_known = p.files_done + p.file_stubs;
    s.bytes_done = p.bytes_done;
    s.bytes_known = p.bytes_known;
    s.skipped = skipped_entries(p.skipped);
}

/// Status without a daemon: the state databases of `<state_dir>/migrate/*`.
pub fn offline_status(state_dir: &Path, only: Option<&str>) -> anyhow::Result<StatusReply> {
    let mut reply = StatusReply::default();
    for spec in super::daemon::saved_specs(state_dir)? {
        if only.is_some_and(|n| n != spec.name) {
            continue;
        }
        let mut s = status_skeleton(&spec);
        s.state = "not running".into();
        let db = state_dir
            .join("migrate")
            .join(&spec.name)
            .join("migrate.db");
        if !db.exists() {
            // Its start was cut off before its database was made: `start` again.
            s.state = "not started (no state database yet: run kaiso migrate start again)".into();
            reply.shares.push(s);
            continue;
        }
        let p = Migration::saved_progress(state_dir, &spec.name).map_err(anyhow::Error::msg)?;
        apply_progress(&mut s, p);
        s.metadata_retries = metadata_retry_entries(
            Migration::saved_metadata_retries(state_dir, &spec.name).unwrap_or_default(),
        );
        reply.shares.push(s);
    }
    // Finished shares (their report is left where their state was), also one whose
    // finish was cut off after it detached the state.
    for (name, report) in super::daemon::finished_reports(state_dir, only) {
        reply.shares.push(ShareStatus {
            name,
            state: "finished".into(),
            skipped: vec![SkippedEntry {
                path: String::new(),
                kind: kaiso_store::migrate::NOTICE_KIND.into(),
                reason: format!("finished; report: {}", report.display()),
            }],
            ..ShareStatus::default()
        });
    }
    if let Some(n) = only
        && reply.shares.is_empty()
    {
        anyhow::bail!("no share {n:?} is being migrated into this store");
    }
    Ok(reply)
}

pub fn status_skeleton(spec: &ShareSpec) -> ShareStatus {
    ShareStatus {
        name: spec.name.clone(),
        source: spec.url.clone(),
        into: format!("/{}", spec.into),
        throttle_bytes_per_sec: spec.rate,
        ..ShareStatus::default()
    }
}

/// Percent of `total` done; with nothing known yet, 100 % only once nothing remains
/// (before the first listing, `0 of 0 known done` is 0 %, not 100 %: audit s11).
fn pct(done: u64, total: u64, remaining_stubs: u64) -> f64 {
    if total == 0 {
        if remaining_stubs == 0 { 100.0 } else { 0.0 }
    } else {
        done as f64 * 100.0 / total as f64
    }
}

fn eta_text(s: &ShareStatus) -> String {
    match s.eta_secs {
        _ if s.state == "recounting" => "unknown (recounting)".into(),
        _ if s.remaining_stubs == 0 => "done".into(),
        _ if s.paused => "none (paused)".into(),
        Some(e) => HumanDuration(Duration::from_secs_f64(e.max(0.0))).to_string(),
        None => "unknown".into(),
    }
}

/// The rate figures: bytes and files per second, or `paused` (a paused share has none).
fn rate_text(s: &ShareStatus) -> String {
    if s.paused {
        "paused".into()
    } else {
        format!(
            "{}/s, {:.1} files/s",
            HumanBytes(s.bytes_per_sec as u64),
            s.files_per_sec
        )
    }
}

/// One-line summary used by the progress bar.
fn bar_message(s: &ShareStatus) -> String {
    format!(
        "{} | files {}/{} | stubs {} | {} | ETA {}",
        s.state,
        s.files_done,
        s.files_known,
        s.remaining_stubs,
        rate_text(s),
        eta_text(s)
    )
}

/// The text form of `kaiso migrate status`.
pub fn render(r: &StatusReply) -> String {
    let mut out = String::new();
    if !r.daemon {
        out.push_str("no migration daemon is running for this store (figures from its state)\n");
    }
    if r.shares.is_empty() {
        out.push_str("no share is being migrated into this store\n");
    }
    for s in &r.shares {
        let pass = s
            .pass
            .as_deref()
            .map(|p| format!(", pass {p}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "share {}: {} -> {}  [{}{pass}, round {}]\n",
            s.name, s.source, s.into, s.state, s.rounds
        ));
        out.push_str(&format!(
            "  files      {} of {} known done ({:.1}%)\n",
            s.files_done,
            s.files_known,
            pct(s.files_done, s.files_known, s.remaining_stubs)
        ));
        out.push_str(&format!(
            "  bytes      {} of {} known done ({:.1}%)\n",
            HumanBytes(s.bytes_done),
            HumanBytes(s.bytes_known),
            pct(s.bytes_done, s.bytes_known, s.remaining_stubs)
        ));
        out.push_str(&format!(
            "  stubs      {} remaining ({} directories not listed yet)\n",
            s.remaining_stubs, s.dirs_pending
        ));
        if r.daemon {
            out.push_str(&format!(
                "  rate       {}   ETA {}\n",
                rate_text(s),
                eta_text(s)
            ));
            out.push_str(&format!(
                "  fetched    {} this run ({} on-demand and {} crawl units, {} directories listed)\n",
                HumanBytes(s.bytes_fetched),
                s.demand_fetches,
                s.crawl_fetches,
                s.dirs_listed
            ));
            out.push_str(&format!(
                "  throttle   {}\n",
                s.throttle_bytes_per_sec
                    .map(|b| format!("{}/s", HumanBytes(b)))
                    .unwrap_or_else(|| "off".into())
            ));
        }
        if let Some(why) = &s.source_problem {
            out.push_str(&format!("  source     {why}\n"));
        }
        if !s.crawl_failures.is_empty() {
            out.push_str(&format!(
                "  failing    {} in the {} round:\n",
                s.crawl_failures.len(),
                if s.state == "stuck" {
                    "last"
                } else {
                    "current"
                }
            ));
            for f in &s.crawl_failures {
                out.push_str(&format!("    inode {} ({}): {}\n", f.ino, f.step, f.error));
            }
        }
        if !s.metadata_retries.is_empty() {
            out.push_str(&format!(
                "  retried    {} entries whose metadata the source does not give (skipped at the bound):\n",
                s.metadata_retries.len()
            ));
            for r in &s.metadata_retries {
                out.push_str(&format!("    {}\n", r.text));
            }
        }
        // Notices (something migrated differently, e.g. owners not kept) are in the
        // same report but are not entries left out.
        let (notices, skipped): (Vec<&SkippedEntry>, Vec<&SkippedEntry>) = s
            .skipped
            .iter()
            .partition(|k| k.kind == kaiso_store::migrate::NOTICE_KIND);
        if skipped.is_empty() {
            out.push_str("  skipped    none\n");
        } else {
            out.push_str(&format!("  skipped    {}:\n", skipped.len()));
            for k in skipped {
                out.push_str(&format!("    {} [{}] {}\n", k.path, k.kind, k.reason));
            }
        }
        for k in notices {
            out.push_str(&format!("  notice     {} {}\n", k.path, k.reason));
        }
    }
    out
}

fn settled(r: &StatusReply) -> bool {
    r.shares.iter().all(|s| {
        (s.remaining_stubs == 0 && s.state != "recounting")
            || matches!(s.state.as_str(), "stuck" | "finished" | "not running")
    })
}

/// `--watch`: one progress bar per share until every crawl ends (or JSON lines).
pub fn watch(
    mut fetch: impl FnMut() -> anyhow::Result<StatusReply>,
    interval: Duration,
    json: bool,
) -> anyhow::Result<()> {
    let multi = MultiProgress::new();
    let style = ProgressStyle::with_template(
        "{prefix:>10} [{bar:30.cyan/blue}] {bytes}/{total_bytes} {msg}",
    )
    .map_err(|e| anyhow::anyhow!("progress style: {e}"))?
    .progress_chars("=> ");
    let mut bars: Vec<(String, ProgressBar)> = Vec::new();
    loop {
        let r = fetch()?;
        if json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            for s in &r.shares {
                let bar = match bars.iter().find(|(n, _)| *n == s.name) {
                    Some((_, b)) => b.clone(),
                    None => {
                        let b = multi.add(ProgressBar::new(s.bytes_known));
                        b.set_style(style.clone());
                        b.set_prefix(s.name.clone());
                        bars.push((s.name.clone(), b.clone()));
                        b
                    }
                };
                bar.set_length(s.bytes_known.max(1));
                bar.set_position(s.bytes_done);
                bar.set_message(bar_message(s));
            }
        }
        if settled(&r) {
            for (_, b) in &bars {
                b.finish();
            }
            if !json {
                print!("{}", render(&r));
            }
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_names_every_figure_and_skip() {
        let r = StatusReply {
            daemon: true,
            shares: vec![ShareStatus {
                name: "docs".into(),
                source: "/srv/old".into(),
                into: "/docs".into(),
                state: "running".into(),
                pass: Some("data".into()),
                rounds: 1,
                remaining_stubs: 7,
                dirs_pending: 2,
                files_done: 3,
                files_known: 8,
                bytes_done: 1 << 20,
                bytes_known: 4 << 20,
                bytes_per_sec: (1 << 20) as f64,
                eta_secs: Some(3.0),
                skipped: vec![SkippedEntry {
                    path: "/a/secret".into(),
                    kind: "permission-denied".into(),
                    reason: "EACCES".into(),
                }],
                ..ShareStatus::default()
            }],
        };
        let t = render(&r);
        for want in [
            "share docs: /srv/old -> /docs",
            "3 of 8 known",
            "25.0%",
            "7 remaining (2 directories",
            "ETA 3 seconds",
            "/a/secret [permission-denied] EACCES",
        ] {
            assert!(t.contains(want), "{want:?} missing in\n{t}");
        }
        assert!(!settled(&r));
    }

    #[test]
    fn a_paused_share_shows_paused_instead_of_a_rate_and_an_eta() {
        let r = StatusReply {
            daemon: true,
            shares: vec![ShareStatus {
                name: "docs".into(),
                state: "paused".into(),
                paused: true,
                remaining_stubs: 4,
                files_known: 4,
                ..ShareStatus::default()
            }],
        };
        let t = render(&r);
        assert!(
            t.contains("  rate       paused   ETA none (paused)\n"),
            "{t}"
        );
        assert!(!t.contains("B/s"), "{t}");
        assert!(bar_message(&r.shares[0]).contains("| paused | ETA none (paused)"));
    }

    #[test]
    fn nothing_known_yet_is_not_complete() {
        let share = |remaining_stubs| StatusReply {
            daemon: true,
            shares: vec![ShareStatus {
                name: "main".into(),
                state: "paused".into(),
                remaining_stubs,
                dirs_pending: remaining_stubs,
                ..ShareStatus::default()
            }],
        };
        let t = render(&share(1));
        assert!(t.contains("0 of 0 known done (0.0%)"), "{t}");
        assert!(!t.contains("100.0%"), "{t}");
        let t = render(&share(0));
        assert!(t.contains("0 of 0 known done (100.0%)"), "{t}");
    }

    #[test]
    fn render_lists_the_failures_of_a_stuck_crawl() {
        let entries = crawl_failure_entries(vec![CrawlFailure {
            ino: 42,
            errno: libc::EIO,
            what: "fetch",
        }]);
        let r = StatusReply {
            daemon: true,
            shares: vec![ShareStatus {
                name: "docs".into(),
                state: "stuck".into(),
                remaining_stubs: 1,
                crawl_failures: entries,
                ..ShareStatus::default()
            }],
        };
        let mut r = r;
        r.shares[0].source_problem = Some("unreachable since 2026-01-01 00:00:00 UTC: x".into());
        let t = render(&r);
        for want in [
            "failing    1 in the last round",
            "inode 42 (fetch): Input/output error",
            "source     unreachable since 2026-01-01 00:00:00 UTC: x",
        ] {
            assert!(t.contains(want), "{want:?} missing in\n{t}");
        }
        assert!(settled(&r));
    }
}
