//! iostat-style accounting shared by every model: completed-IO counters, busy time as the
//! union of the intervals during which at least one request is outstanding, and a sampler
//! that turns two snapshots into `%util`, iops, `svctm` and `await`.

use crate::{Completion, IoOp, Nanos};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Cumulative counters, as in `/proc/diskstats`. Only completed requests are counted;
/// `busy_ns` includes the part of in-flight requests up to the snapshot time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCounters {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Time with at least one request outstanding (`io_ticks`).
    pub busy_ns: u64,
    /// Sum of (finish − arrival) over completed requests (`time_in_queue` per request).
    pub response_ns: u64,
    /// Sum of (finish − start) over completed requests.
    pub service_ns: u64,
}

impl IoCounters {
    pub fn ios(&self) -> u64 {
        self.reads + self.writes
    }
}

/// One iostat interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IostatSample {
    /// Interval length in seconds.
    pub seconds: f64,
    /// Completed requests per second.
    pub iops: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    /// Busy fraction, 0.0..=1.0 (`%util` / 100).
    pub util: f64,
    /// Busy time per completed request, milliseconds (iostat `svctm`); 0 when no IO.
    pub svctm_ms: f64,
    /// Mean response time of completed requests, milliseconds (iostat `await`).
    pub await_ms: f64,
    /// Mean number of requests in the system (iostat `aqu-sz`).
    pub queue: f64,
}

/// Turns cumulative counters into per-interval iostat figures.
#[derive(Clone, Debug, Default)]
pub struct Iostat {
    last_at: Nanos,
    last: IoCounters,
}

impl Iostat {
    /// Start sampling at `now` from the counters as they are then.
    pub fn new(now: Nanos, counters: IoCounters) -> Self {
        Iostat {
            last_at: now,
            last: counters,
        }
    }

    /// Close the interval ending at `now` and start the next one.
    pub fn sample(&mut self, now: Nanos, counters: IoCounters) -> IostatSample {
        let dt = now.saturating_sub(self.last_at);
        let d = |a: u64, b: u64| a.saturating_sub(b) as f64;
        let ios = d(counters.ios(), self.last.ios());
        let busy = d(counters.busy_ns, self.last.busy_ns);
        let secs = dt as f64 / 1e9;
        let per_sec = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
        let s = IostatSample {
            seconds: secs,
            iops: per_sec(ios),
            read_iops: per_sec(d(counters.reads, self.last.reads)),
            write_iops: per_sec(d(counters.writes, self.last.writes)),
            read_bytes_per_sec: per_sec(d(counters.read_bytes, self.last.read_bytes)),
            write_bytes_per_sec: per_sec(d(counters.write_bytes, self.last.write_bytes)),
            util: if dt > 0 {
                (busy / dt as f64).min(1.0)
            } else {
                0.0
            },
            svctm_ms: if ios > 0.0 { busy / ios / 1e6 } else { 0.0 },
            await_ms: if ios > 0.0 {
                d(counters.response_ns, self.last.response_ns) / ios / 1e6
            } else {
                0.0
            },
            queue: if dt > 0 {
                d(counters.response_ns, self.last.response_ns) / dt as f64
            } else {
                0.0
            },
        };
        self.last_at = now;
        self.last = counters;
        s
    }
}

/// Bookkeeping every model embeds: monotonic time, busy-period union, completions.
#[derive(Clone, Debug, Default)]
pub(crate) struct Accounting {
    /// Latest `now` seen; earlier arrivals are clamped to it.
    latest: Nanos,
    /// Busy time of busy periods that ended before `period_start`.
    closed_busy: Nanos,
    period_start: Nanos,
    /// End of the current busy period (the latest finish submitted).
    busy_until: Nanos,
    /// In-flight requests, earliest finish first.
    pending: BinaryHeap<Reverse<Pending>>,
    done: IoCounters,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    finish: Nanos,
    arrival: Nanos,
    start: Nanos,
    len: u64,
    write: bool,
}

impl Accounting {
    /// Clamp `now` to monotonic time and retire requests finished by then.
    pub(crate) fn arrive(&mut self, now: Nanos) -> Nanos {
        let now = now.max(self.latest);
        self.latest = now;
        self.retire(now);
        now
    }

    /// Record a request the model has scheduled.
    pub(crate) fn submit(&mut self, c: Completion, len: u64, op: IoOp) {
        if c.arrival >= self.busy_until {
            self.closed_busy += self.busy_until - self.period_start;
            self.period_start = c.arrival;
        }
        self.busy_until = self.busy_until.max(c.finish);
        self.pending.push(Reverse(Pending {
            finish: c.finish,
            arrival: c.arrival,
            start: c.start,
            len,
            write: op == IoOp::Write,
        }));
    }

    pub(crate) fn counters(&mut self, now: Nanos) -> IoCounters {
        let now = now.max(self.latest);
        self.retire(now);
        let mut c = self.done;
        let open = now.min(self.busy_until).saturating_sub(self.period_start);
        c.busy_ns = self.closed_busy + open;
        c
    }

    pub(crate) fn idle_at(&self) -> Nanos {
        self.busy_until.max(self.latest)
    }

    fn retire(&mut self, now: Nanos) {
        while let Some(Reverse(p)) = self.pending.peek().copied() {
            if p.finish > now {
                break;
            }
            self.pending.pop();
            if p.write {
                self.done.writes += 1;
                self.done.write_bytes += p.len;
            } else {
                self.done.reads += 1;
                self.done.read_bytes += p.len;
            }
            self.done.response_ns += p.finish - p.arrival;
            self.done.service_ns += p.finish - p.start;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(arrival: Nanos, start: Nanos, finish: Nanos) -> Completion {
        Completion {
            arrival,
            start,
            finish,
        }
    }

    #[test]
    fn busy_is_union_of_outstanding_intervals() {
        let mut a = Accounting::default();
        a.arrive(0);
        a.submit(c(0, 0, 10), 1, IoOp::Read);
        a.arrive(5);
        a.submit(c(5, 10, 20), 1, IoOp::Read);
        a.arrive(30);
        a.submit(c(30, 30, 35), 1, IoOp::Write);
        let k = a.counters(40);
        assert_eq!(k.busy_ns, 25);
        assert_eq!(k.reads, 2);
        assert_eq!(k.writes, 1);
        assert_eq!(k.response_ns, 10 + 15 + 5);
        assert_eq!(k.service_ns, 10 + 10 + 5);
    }

    #[test]
    fn in_flight_busy_counts_only_up_to_now() {
        let mut a = Accounting::default();
        a.arrive(100);
        a.submit(c(100, 100, 300), 4096, IoOp::Read);
        let k = a.counters(200);
        assert_eq!(k.busy_ns, 100);
        assert_eq!(k.ios(), 0, "not completed yet");
        assert_eq!(a.counters(300).ios(), 1);
    }

    #[test]
    fn iostat_matches_definitions() {
        let mut st = Iostat::new(0, IoCounters::default());
        let k = IoCounters {
            reads: 60,
            writes: 40,
            read_bytes: 60 * 4096,
            write_bytes: 40 * 4096,
            busy_ns: 500_000_000,
            response_ns: 2_000_000_000,
            service_ns: 500_000_000,
        };
        let s = st.sample(1_000_000_000, k);
        assert!((s.iops - 100.0).abs() < 1e-9);
        assert!((s.util - 0.5).abs() < 1e-9);
        assert!((s.svctm_ms - 5.0).abs() < 1e-9);
        assert!((s.await_ms - 20.0).abs() < 1e-9);
        assert!((s.queue - 2.0).abs() < 1e-9);
        // svctm = 10 × %util / iops, the identity the 002 notes rely on.
        assert!((s.svctm_ms - 10.0 * (s.util * 100.0) / s.iops).abs() < 1e-9);
        let idle = st.sample(2_000_000_000, k);
        assert_eq!(idle.iops, 0.0);
        assert_eq!(idle.svctm_ms, 0.0);
    }
}
