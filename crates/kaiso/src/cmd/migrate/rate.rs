//! The rates `kaiso migrate status` shows for a share (bytes and files per second), and
//! what they mean.
//!
//! A rate is the bytes (files) the share's counters gained between two readings, divided
//! by the time between those two readings, both taken from the same clock:
//!
//! - the newer reading is taken when `status` asks (not the last once-a-second sample),
//!   so bytes fetched since that sample are counted and the time they took with them;
//! - the older reading is the newest sample taken at least [`WINDOW`] (10 s) before, so
//!   the window spans 10 to 11 s once the share has been crawling that long;
//! - before that, the older reading is the one taken when the share's crawl started or
//!   resumed: a burst right after a start or `resume` is divided by the time since then,
//!   never by a shorter sample span (too high) nor by a 10 s window the share was not
//!   active for (too low), and bytes fetched before a `pause` never count after `resume`;
//! - a window shorter than [`MIN_SPAN`] (1 s) gives no rate yet;
//! - a paused share has no rate at all (its readings are dropped at `pause`).
//!
//! The counters move when a unit is written (a 10 MiB unit at once), so over a window
//! holding few units the rate moves in steps of a unit per window.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Rates are measured over at least this window (once the share has been active so long).
pub const WINDOW: Duration = Duration::from_secs(10);
/// No rate from a window shorter than this (right after a start or `resume`).
pub const MIN_SPAN: Duration = Duration::from_secs(1);

/// One reading of a share's counters: when, bytes fetched, files completed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    pub at: Instant,
    pub bytes: u64,
    pub files: u64,
}

/// The readings of one share since its crawl last started or resumed (see the module).
#[derive(Debug, Default)]
pub struct RateWindow {
    /// Oldest first; the first is the start (or the newest reading at least
    /// [`WINDOW`] old). Empty while paused.
    readings: VecDeque<Reading>,
}

impl RateWindow {
    /// The crawl starts or resumes: earlier readings no longer count.
    pub fn restart(&mut self, now: Reading) {
        self.readings.clear();
        self.readings.push_back(now);
    }

    /// The share is paused: no rate until [`RateWindow::restart`].
    pub fn stop(&mut self) {
        self.readings.clear();
    }

    /// Whether the window runs (started and not stopped since).
    pub fn running(&self) -> bool {
        !self.readings.is_empty()
    }

    /// The once-a-second sample (ignored while stopped). Keeps the newest reading at
    /// least [`WINDOW`] old and every newer one.
    pub fn sample(&mut self, now: Reading) {
        if self.readings.is_empty() {
            return;
        }
        self.readings.push_back(now);
        while self.readings.len() > 1
            && self
                .readings
                .get(1)
                .is_some_and(|r| now.at.saturating_duration_since(r.at) >= WINDOW)
        {
            self.readings.pop_front();
        }
    }

    /// (bytes per second, files per second) from the reading `now` (None: stopped, or
    /// active for less than [`MIN_SPAN`]).
    pub fn rate(&self, now: Reading) -> Option<(f64, f64)> {
        // The newest reading at least WINDOW old, else the oldest (the start).
        let base = self
            .readings
            .iter()
            .rev()
            .find(|r| now.at.saturating_duration_since(r.at) >= WINDOW)
            .or_else(|| self.readings.front())?;
        let span = now.at.saturating_duration_since(base.at);
        if span < MIN_SPAN {
            return None;
        }
        let secs = span.as_secs_f64();
        Some((
            now.bytes.saturating_sub(base.bytes) as f64 / secs,
            now.files.saturating_sub(base.files) as f64 / secs,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn at(t0: Instant, ms: u64, bytes: u64, files: u64) -> Reading {
        Reading {
            at: t0 + Duration::from_millis(ms),
            bytes,
            files,
        }
    }

    fn close(got: Option<(f64, f64)>, want: (f64, f64)) -> bool {
        got.is_some_and(|(b, f)| (b - want.0).abs() < 1e-6 && (f - want.1).abs() < 1e-9)
    }

    #[test]
    fn a_burst_right_after_the_start_is_divided_by_the_time_since_the_start() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        w.restart(at(t0, 0, 0, 0));
        // Sampled once a second; 5 MiB arrive at 1.5 s (one unit, a client's read).
        w.sample(at(t0, 1000, 0, 0));
        // Asked at 1.8 s: the 5 MiB took the 1.8 s since the start, not the 0.8 s since
        // the last sample, and not a 10 s window the share was not running for.
        let r = w.rate(at(t0, 1800, 5 * MIB, 1));
        assert!(close(r, (5.0 * MIB as f64 / 1.8, 1.0 / 1.8)), "{r:?}");
        // Bytes counted after the last sample count (the last sample said 0).
        w.sample(at(t0, 2000, 5 * MIB, 1));
        let r = w.rate(at(t0, 2500, 6 * MIB, 1));
        assert!(close(r, (6.0 * MIB as f64 / 2.5, 1.0 / 2.5)), "{r:?}");
    }

    #[test]
    fn no_rate_before_one_second_nor_while_stopped() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        assert_eq!(w.rate(at(t0, 5000, 1, 1)), None, "never started");
        w.restart(at(t0, 0, 0, 0));
        assert_eq!(w.rate(at(t0, 999, 4 * MIB, 0)), None, "under 1 s");
        assert!(w.rate(at(t0, 1000, 4 * MIB, 0)).is_some());
        w.stop();
        assert!(!w.running());
        w.sample(at(t0, 2000, 4 * MIB, 0));
        assert_eq!(w.rate(at(t0, 3000, 4 * MIB, 0)), None, "stopped (paused)");
    }

    #[test]
    fn bytes_from_before_a_pause_do_not_count_after_the_resume() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        w.restart(at(t0, 0, 0, 0));
        for s in 1..=5 {
            w.sample(at(t0, s * 1000, s * MIB, s));
        }
        // 1 MiB/s for 5 s, then paused for 3 s, then resumed.
        let r = w.rate(at(t0, 5000, 5 * MIB, 5));
        assert!(close(r, (MIB as f64, 1.0)), "{r:?}");
        w.stop();
        w.restart(at(t0, 8000, 5 * MIB, 5));
        w.sample(at(t0, 9000, 5 * MIB + MIB / 2, 5));
        // 2 MiB in the 2 s since the resume: 1 MiB/s, not (7 MiB)/(10 s).
        let r = w.rate(at(t0, 10_000, 7 * MIB, 7));
        assert!(close(r, (MIB as f64, 1.0)), "{r:?}");
    }

    #[test]
    fn a_long_run_is_measured_over_ten_to_eleven_seconds() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        w.restart(at(t0, 0, 0, 0));
        // 2 MiB/s for 20 s, then a burst of 30 MiB at 20.5 s.
        for s in 1..=20 {
            w.sample(at(t0, s * 1000, 2 * s * MIB, s));
        }
        // Kept: the newest reading at least 10 s old (10 s) and the newer ones.
        assert_eq!(w.readings.len(), 11);
        assert_eq!(w.readings[0].at, t0 + Duration::from_secs(10));
        // Asked at 20.6 s: base is the 10 s reading, 10.6 s ago.
        let r = w.rate(at(t0, 20_600, 40 * MIB + 30 * MIB, 21));
        assert!(
            close(r, (50.0 * MIB as f64 / 10.6, 11.0 / 10.6)),
            "the burst over the 10.6 s window: {r:?}"
        );
        // A steady 2 MiB/s reads 2 MiB/s whenever asked.
        let r = w.rate(at(t0, 20_000, 40 * MIB, 20));
        assert!(close(r, (2.0 * MIB as f64, 1.0)), "{r:?}");
    }
}
