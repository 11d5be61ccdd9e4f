//! Busy-polling `/dev/fuse` between the requests of a burst.
//!
//! A FUSE request whose daemon thread sleeps in `read(/dev/fuse)` costs a wake-up of that
//! thread, and on a VM whose idle vCPUs halt at once (guest halt polling off) that wake-up
//! is an exit to the host, tens of µs: more than kaiso's own work for a create. So the
//! worker that has just replied, when it is the one that reads next, first polls the
//! device (a non-blocking `poll`, yielding the CPU between polls) for up to a window of
//! µs: while requests come in bursts (a metadata loop's GETATTR, LOOKUP, CREATE, …) the
//! next one is then read without the thread ever sleeping.
//!
//! The window adapts ([`PollRule`]): it opens when the gaps between requests are short,
//! narrows to about twice the gaps seen, closes at once after a gap longer than a burst's
//! (so a mount with sparse requests never polls, and an idle mount costs no CPU), and
//! backs off exponentially when polls keep ending just before the next request arrives.
//! A poll also stops, and the rule holds off, as soon as another thread wants its CPU
//! (a yield that took long); and nobody polls while the machine's 1-minute load average
//! is at or above its CPU count ([`MachineLoad`]): on a busy machine the vCPUs do not
//! halt, so a wake-up is cheap there, and polling would only take CPU time from others
//! (and keep the scheduler from moving waiting threads onto the polling CPU).

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// Default longest poll after a reply (`kaiso mount --busy-poll-us`).
pub const DEFAULT_MAX: Duration = Duration::from_micros(50);
/// Shortest window worth opening (a poll costs about a µs).
const MIN_WINDOW_NS: u64 = 5_000;
/// Polls in a row that end just before the next request arrives before the rule holds
/// off polling for a while.
const MISS_LIMIT: u32 = 4;
/// First and longest hold after a run of misses, in requests.
const FIRST_HOLD: u32 = 16;
const MAX_HOLD: u32 = 4096;
/// One poll and yield taking longer than this means another thread ran on this CPU.
const CONTENDED: Duration = Duration::from_micros(30);

/// The adaptive window (a pure rule: time is passed in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PollRule {
    /// Longest window, ns; 0 turns polling off.
    pub max_ns: u64,
}

/// What the rule remembers between requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollState {
    /// Window of the next poll, ns (0: read, and sleep, at once).
    window_ns: u64,
    /// Polls in a row that ended shortly before the next request.
    misses: u32,
    /// Requests still to read without polling (after a run of misses).
    hold: u32,
    /// Length of the next hold (doubles after each run of misses; a catch resets it).
    next_hold: u32,
}

/// How the wait for one request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A poll saw the request `after_ns` after the reply.
    Caught { after_ns: u64 },
    /// The worker went to sleep in `read` after polling for `polled_ns` (0: it did not
    /// poll); the next request was served `gap_ns` after the reply (this includes the
    /// thread's wake-up).
    Slept { polled_ns: u64, gap_ns: u64 },
    /// A poll gave way to another thread that wanted the CPU.
    Contended,
}

impl PollRule {
    pub fn new(max: Duration) -> PollRule {
        PollRule {
            max_ns: u64::try_from(max.as_nanos()).unwrap_or(u64::MAX),
        }
    }

    pub fn enabled(&self) -> bool {
        self.max_ns > 0
    }

    /// How long to poll after the next reply.
    pub fn window(&self, s: &PollState) -> Duration {
        if s.hold > 0 || !self.enabled() {
            return Duration::ZERO;
        }
        Duration::from_nanos(s.window_ns.min(self.max_ns))
    }

    /// Gaps up to this long (reply to next request served, wake-up included) count as
    /// the same burst: a longer window could have caught the request.
    fn near_ns(&self) -> u64 {
        self.max_ns.saturating_mul(2)
    }

    fn floor_ns(&self) -> u64 {
        MIN_WINDOW_NS.min(self.max_ns)
    }

    /// The state after one more request arrived.
    pub fn update(&self, s: PollState, o: Outcome) -> PollState {
        if !self.enabled() {
            return PollState::default();
        }
        let mut s = s;
        match o {
            Outcome::Caught { after_ns } => {
                // Keep about twice the gaps seen, shrinking slowly and growing at once.
                let decayed = s.window_ns - s.window_ns / 8;
                s.window_ns = decayed
                    .max(after_ns.saturating_mul(2))
                    .clamp(self.floor_ns(), self.max_ns);
                s.misses = 0;
                s.next_hold = 0;
            }
            Outcome::Contended => {
                // Others want the CPU: stop polling for a while, longer each time.
                s.misses = 0;
                s.hold_off();
            }
            Outcome::Slept { gap_ns, .. } if gap_ns > self.near_ns() => {
                // The burst ended (or requests are sparse): no polling until gaps are
                // short again.
                s.window_ns = 0;
                s.misses = 0;
            }
            Outcome::Slept { polled_ns: 0, .. } if s.hold > 0 => s.hold -= 1,
            Outcome::Slept { polled_ns: 0, .. } => {
                // Short gap and no poll: open the window.
                s.window_ns = self.max_ns;
            }
            Outcome::Slept { .. } => {
                // Polled and missed a request that came soon after.
                s.window_ns = s
                    .window_ns
                    .saturating_mul(2)
                    .clamp(self.floor_ns(), self.max_ns);
                s.misses += 1;
                if s.misses >= MISS_LIMIT {
                    s.misses = 0;
                    s.hold_off();
                }
            }
        }
        s
    }
}

impl PollState {
    /// No polling for the next hold, twice as long as the last one.
    fn hold_off(&mut self) {
        self.next_hold = if self.next_hold == 0 {
            FIRST_HOLD
        } else {
            self.next_hold.saturating_mul(2).min(MAX_HOLD)
        };
        self.hold = self.next_hold;
    }
}

/// How a poll ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Polled {
    /// A request is waiting, seen after this long.
    Ready(Duration),
    /// Nothing came within the window.
    Nothing(Duration),
    /// Another thread ran on this CPU during a yield (after this long): stopped.
    GaveWay(Duration),
    /// The session ended (or polling failed): read at once.
    Closed,
}

/// Polls `fd` (a `/dev/fuse` descriptor of the session) until a request is waiting or
/// `window` has passed, yielding the CPU between polls so a caller woken on this CPU runs;
/// stops when a yield let another thread run.
pub fn poll_for_request(fd: BorrowedFd<'_>, window: Duration) -> Polled {
    let start = Instant::now();
    let mut last = start;
    loop {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd, timeout 0 (never sleeps).
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r > 0 {
            return if p.revents & libc::POLLIN != 0 && p.revents & libc::POLLERR == 0 {
                Polled::Ready(start.elapsed())
            } else {
                Polled::Closed
            };
        }
        if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return Polled::Closed;
        }
        let now = Instant::now();
        let spent = now - start;
        if now - last > CONTENDED {
            return Polled::GaveWay(spent);
        }
        last = now;
        if spent >= window {
            return Polled::Nothing(spent);
        }
        // SAFETY: no arguments; lets another runnable thread of this CPU go first.
        unsafe { libc::sched_yield() };
    }
}

/// Environment variable that, set to `1` when a mount starts, lets its workers poll
/// whatever the machine's load (for tests and comparisons on a busy machine).
pub const ANY_LOAD_ENV: &str = "KAISO_FUSE_POLL_UNDER_LOAD";

/// How often the load average is read again.
const LOAD_RECHECK: Duration = Duration::from_millis(500);

/// Whether polling may pay off on this machine: some CPU is idle much of the time (the
/// 1-minute load average is below the number of CPUs), so wake-ups may land on a halted
/// vCPU.
pub fn worth_polling(load1: f64, cpus: usize) -> bool {
    load1.is_finite() && load1 < cpus as f64
}

/// The machine's load, read from `/proc/loadavg` at most every [`LOAD_RECHECK`].
#[derive(Debug)]
pub struct MachineLoad {
    cpus: usize,
    checked: Option<Instant>,
    idle_cpus: bool,
    /// Poll whatever the load ([`ANY_LOAD_ENV`]).
    any_load: bool,
}

impl Default for MachineLoad {
    fn default() -> Self {
        MachineLoad {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            checked: None,
            idle_cpus: false,
            any_load: std::env::var(ANY_LOAD_ENV).is_ok_and(|v| v == "1"),
        }
    }
}

impl MachineLoad {
    /// Whether the machine has idle CPUs now (see [`worth_polling`]); without a load
    /// average to read, it assumes so.
    pub fn idle_cpus(&mut self, now: Instant) -> bool {
        if self.any_load {
            return true;
        }
        if self
            .checked
            .is_none_or(|t| now.duration_since(t) >= LOAD_RECHECK)
        {
            self.checked = Some(now);
            self.idle_cpus = std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
                .is_none_or(|l| worth_polling(l, self.cpus));
        }
        self.idle_cpus
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    fn rule() -> PollRule {
        PollRule::new(Duration::from_micros(50))
    }

    fn slept(polled_us: u64, gap_us: u64) -> Outcome {
        Outcome::Slept {
            polled_ns: polled_us * US,
            gap_ns: gap_us * US,
        }
    }

    fn caught(after_us: u64) -> Outcome {
        Outcome::Caught {
            after_ns: after_us * US,
        }
    }

    /// Runs a sequence of requests through the rule, polling as it says; `gaps_us` are
    /// the times from a reply to the next request (the wake-up adds `wake_us` when the
    /// worker slept). Returns the final state and the total µs spent polling.
    fn simulate(r: PollRule, gaps_us: &[u64], wake_us: u64) -> (PollState, u64) {
        let mut s = PollState::default();
        let mut polled = 0;
        for &g in gaps_us {
            let w = r.window(&s).as_nanos() as u64 / US;
            let o = if w > 0 && g <= w {
                polled += g;
                caught(g)
            } else {
                polled += w;
                slept(w, g + wake_us)
            };
            s = r.update(s, o);
        }
        (s, polled)
    }

    #[test]
    fn polls_only_below_one_runnable_thread_per_cpu() {
        assert!(worth_polling(0.3, 2));
        assert!(worth_polling(1.9, 2));
        assert!(!worth_polling(2.0, 2));
        assert!(!worth_polling(11.0, 2));
        assert!(worth_polling(11.0, 16));
        assert!(!worth_polling(f64::NAN, 2));
    }

    #[test]
    fn the_load_is_read_at_most_twice_a_second() {
        let mut m = MachineLoad {
            any_load: false,
            ..MachineLoad::default()
        };
        let t = Instant::now();
        let first = m.idle_cpus(t);
        let checked = m.checked;
        assert_eq!(m.idle_cpus(t + Duration::from_millis(100)), first);
        assert_eq!(m.checked, checked);
        m.idle_cpus(t + LOAD_RECHECK);
        assert_eq!(m.checked, Some(t + LOAD_RECHECK));
    }

    #[test]
    fn starts_closed_and_never_polls_when_off() {
        let s = PollState::default();
        assert_eq!(rule().window(&s), Duration::ZERO);
        let off = PollRule::new(Duration::ZERO);
        assert!(!off.enabled());
        let s = off.update(s, slept(0, 10));
        assert_eq!(off.window(&s), Duration::ZERO);
    }

    #[test]
    fn a_short_gap_opens_the_window() {
        let r = rule();
        let s = r.update(PollState::default(), slept(0, 40));
        assert_eq!(r.window(&s), Duration::from_micros(50));
    }

    #[test]
    fn a_long_gap_closes_it_at_once() {
        let r = rule();
        let s = r.update(PollState::default(), slept(0, 40));
        let s = r.update(s, caught(20));
        assert!(r.window(&s) > Duration::ZERO);
        let s = r.update(s, slept(40, 5_000));
        assert_eq!(r.window(&s), Duration::ZERO);
    }

    /// The state once the window opened and 100 requests were caught `after_us` each.
    fn settled(r: PollRule, after_us: u64) -> PollState {
        let mut s = r.update(PollState::default(), slept(0, 30));
        for _ in 0..100 {
            s = r.update(s, caught(after_us));
        }
        s
    }

    #[test]
    fn the_window_follows_the_gaps_seen() {
        let r = rule();
        let mut s = settled(r, 8);
        // About twice the gap, never below the floor.
        assert_eq!(r.window(&s), Duration::from_micros(16));
        // A longer gap widens it at once, up to the limit.
        s = r.update(s, caught(15));
        assert_eq!(r.window(&s), Duration::from_micros(30));
        s = r.update(s, caught(40));
        assert_eq!(r.window(&s), Duration::from_micros(50));
        for _ in 0..100 {
            s = r.update(s, caught(1));
        }
        assert_eq!(r.window(&s), Duration::from_micros(5));
    }

    #[test]
    fn a_near_miss_widens_the_window() {
        let r = rule();
        let mut s = settled(r, 5);
        assert_eq!(r.window(&s), Duration::from_micros(10));
        s = r.update(s, slept(10, 40));
        assert_eq!(r.window(&s), Duration::from_micros(20));
    }

    /// A burst: after the first two requests every one is caught, and polling ends with
    /// the burst.
    #[test]
    fn a_burst_is_polled_and_sparse_requests_are_not() {
        let r = rule();
        let mut gaps = vec![1_000_000];
        gaps.extend(std::iter::repeat_n(20, 1000));
        let (s, polled) = simulate(r, &gaps, 40);
        assert_eq!(polled, 20 * 999, "every request after the second caught");
        assert!(r.window(&s) >= Duration::from_micros(40));
        // Then sparse requests: one poll at most, then none.
        let mut s2 = s;
        let mut polled_sparse = 0;
        for _ in 0..100 {
            let w = r.window(&s2).as_micros() as u64;
            polled_sparse += w;
            s2 = r.update(s2, slept(w, 10_000));
        }
        assert!(
            polled_sparse <= 50,
            "polled {polled_sparse} µs over sparse requests"
        );
        assert_eq!(r.window(&s2), Duration::ZERO);
    }

    /// Requests that always come just after the longest window: polling backs off and
    /// wastes a shrinking share of the time.
    #[test]
    fn repeated_near_misses_back_off() {
        let r = rule();
        let gaps = vec![60; 10_000];
        let (_, polled) = simulate(r, &gaps, 20);
        // Without back-off every request would poll 50 µs in vain: 500,000 µs.
        assert!(polled < 10_000 * 50 / 20, "polled {polled} µs");
        // And after a catch the back-off starts over.
        let mut s = PollState::default();
        for _ in 0..40 {
            let w = r.window(&s).as_micros() as u64;
            s = r.update(s, slept(w, 70));
        }
        s = r.update(s, caught(10));
        assert_eq!(s.next_hold, 0);
    }

    #[test]
    fn contention_holds_polling_off_longer_each_time() {
        let r = rule();
        let mut s = r.update(PollState::default(), slept(0, 30));
        s = r.update(s, Outcome::Contended);
        assert_eq!(r.window(&s), Duration::ZERO);
        let mut held = 0;
        while r.window(&s).is_zero() && held < 1000 {
            s = r.update(s, slept(0, 30));
            held += 1;
        }
        assert_eq!(held, FIRST_HOLD);
        s = r.update(s, Outcome::Contended);
        let mut held = 0;
        while r.window(&s).is_zero() && held < 1000 {
            s = r.update(s, slept(0, 30));
            held += 1;
        }
        assert_eq!(held, 2 * FIRST_HOLD);
    }

    /// The poll loop itself: nothing pending on a pipe for the window, then a byte.
    #[test]
    fn polls_until_ready_or_window() {
        use std::io::Write;
        use std::os::fd::AsFd;
        let (rx, mut tx) = std::io::pipe().unwrap();
        let t = Instant::now();
        match poll_for_request(rx.as_fd(), Duration::from_millis(2)) {
            Polled::Nothing(d) => assert!(d >= Duration::from_millis(2)),
            // A loaded test machine may run another thread during a yield.
            Polled::GaveWay(_) => {}
            other => panic!("{other:?}"),
        }
        assert!(t.elapsed() >= Duration::from_micros(30));
        tx.write_all(b"x").unwrap();
        assert!(matches!(
            poll_for_request(rx.as_fd(), Duration::from_millis(2)),
            Polled::Ready(_)
        ));
        drop(tx);
        drop(rx);
    }

    #[test]
    fn hold_counts_down_then_polls_again() {
        let r = rule();
        let mut s = r.update(PollState::default(), slept(0, 30));
        for _ in 0..MISS_LIMIT {
            s = r.update(s, slept(50, 70));
        }
        assert_eq!(r.window(&s), Duration::ZERO);
        for _ in 0..FIRST_HOLD {
            assert_eq!(r.window(&s), Duration::ZERO);
            s = r.update(s, slept(0, 70));
        }
        assert_eq!(r.window(&s), Duration::from_micros(50));
    }
}
