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
//!
//! A poll must never take CPU time that another runnable task wants. Two signs say so:
//! - the machine's runnable tasks ([`DemandRule`]): sampled from `/proc/loadavg` at most
//!   every [`DEMAND_SAMPLE_EVERY`] and smoothed over about [`DEMAND_TAU`], the tasks
//!   beyond one per CPU are tasks waiting for a CPU (the sample counts the poller and
//!   the caller it has just answered); while there are, nobody polls. A metadata
//!   burst's own tasks, the caller and the polling worker, fit on two CPUs, so they never
//!   stop it; unrelated CPU hogs stop it within a few ms;
//! - the poller's own evidence: a `sched_yield` that let another task run (the thread's
//!   involuntary context switches, `getrusage(RUSAGE_THREAD)`, grew) ends the poll, and
//!   the rule holds off for a while ([`Outcome::Contended`]).
//!
//! [`BusyPoll::under_load`] (default: the [`ANY_LOAD_ENV`] environment variable) skips
//! the first sign, for comparisons on a busy machine.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::Path;
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
    /// A yield let another task run on this CPU (after this long): stopped.
    GaveWay(Duration),
    /// The session ended (or polling failed): read at once.
    Closed,
}

/// This thread's involuntary context switches so far. A `sched_yield` that switched to
/// another task counts as one (the yielding thread stays runnable).
fn involuntary_switches() -> Option<i64> {
    // SAFETY: a zeroed rusage is a valid out-parameter.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a valid pointer.
    (unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } == 0).then_some(u.ru_nivcsw)
}

/// Polls `fd` (a `/dev/fuse` descriptor of the session) until a request is waiting or
/// `window` has passed, yielding the CPU between polls so a caller woken on this CPU runs;
/// stops when a yield let another task run (unless that task was the caller, whose
/// request the next poll then sees).
pub fn poll_for_request(fd: BorrowedFd<'_>, window: Duration) -> Polled {
    let start = Instant::now();
    let switches = involuntary_switches();
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
        let spent = start.elapsed();
        if switches.is_some() && involuntary_switches() != switches {
            return Polled::GaveWay(spent);
        }
        if spent >= window {
            return Polled::Nothing(spent);
        }
        // SAFETY: no arguments; lets another runnable task of this CPU go first.
        unsafe { libc::sched_yield() };
    }
}

/// Environment variable that, set to `1` in the mounting process, is the default of
/// [`BusyPoll::under_load`]: poll even while other tasks want the CPUs (for tests and
/// comparisons on a busy machine).
pub const ANY_LOAD_ENV: &str = "KAISO_FUSE_POLL_UNDER_LOAD";

/// A mount's busy-poll settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyPoll {
    /// Longest poll after a reply (zero: never poll).
    pub max: Duration,
    /// Poll even while tasks wait for a CPU (the poller's own evidence, a yield that let
    /// another task run, still stops a poll). Default: [`ANY_LOAD_ENV`] is `1`.
    pub under_load: bool,
}

impl Default for BusyPoll {
    fn default() -> Self {
        BusyPoll {
            max: DEFAULT_MAX,
            under_load: std::env::var(ANY_LOAD_ENV).is_ok_and(|v| v == "1"),
        }
    }
}

impl BusyPoll {
    /// Never poll.
    pub const OFF: BusyPoll = BusyPoll {
        max: Duration::ZERO,
        under_load: false,
    };
}

/// How often the machine's runnable tasks are sampled, at most.
pub const DEMAND_SAMPLE_EVERY: Duration = Duration::from_millis(2);
/// Time constant of their smoothing: a sample `dt` after the last one weighs
/// `dt / (dt + DEMAND_TAU)`, `dt` at most twice [`DEMAND_SAMPLE_EVERY`] (one sample after a
/// quiet spell, or the first, does not decide alone: a task that ran for a moment must not
/// stop a burst's polling).
pub const DEMAND_TAU: Duration = Duration::from_millis(10);
/// Smoothed waiting tasks (thousandths) from which polling stops.
const WAITING_LIMIT_MILLI: u64 = 500;

/// Whether other tasks want CPU time now (a pure rule: samples and their times, in ns
/// from any fixed origin, are passed in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DemandRule {
    /// CPUs of the machine.
    pub cpus: u32,
    pub sample_every_ns: u64,
    pub tau_ns: u64,
}

/// The smoothed demand.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DemandState {
    /// When the last sample was taken.
    last_ns: Option<u64>,
    /// Runnable tasks beyond one per CPU, smoothed, in thousandths.
    waiting_milli: u64,
}

impl DemandState {
    /// Smoothed runnable tasks beyond one per CPU, in thousandths.
    pub fn waiting_milli(&self) -> u64 {
        self.waiting_milli
    }
}

impl DemandRule {
    pub fn new(cpus: u32) -> DemandRule {
        DemandRule {
            cpus: cpus.max(1),
            sample_every_ns: DEMAND_SAMPLE_EVERY.as_nanos() as u64,
            tau_ns: DEMAND_TAU.as_nanos() as u64,
        }
    }

    /// Whether a new sample is due at `now_ns`.
    pub fn due(&self, s: &DemandState, now_ns: u64) -> bool {
        s.last_ns
            .is_none_or(|t| now_ns.saturating_sub(t) >= self.sample_every_ns)
    }

    /// The state after `runnable` tasks (the sampling thread included) were seen running
    /// or waiting to run at `now_ns`.
    pub fn sample(&self, s: DemandState, now_ns: u64, runnable: u32) -> DemandState {
        let waiting = u64::from(runnable.saturating_sub(self.cpus)) * 1000;
        let longest = self.sample_every_ns.saturating_mul(2);
        let dt = u128::from(
            s.last_ns
                .map_or(longest, |t| now_ns.saturating_sub(t).min(longest)),
        );
        let (old, new) = (u128::from(s.waiting_milli), u128::from(waiting));
        let w = |x: u128| x * dt / (dt + u128::from(self.tau_ns).max(1));
        let waiting_milli = if new >= old {
            (old + w(new - old)) as u64
        } else {
            (old - w(old - new)) as u64
        };
        DemandState {
            last_ns: Some(now_ns),
            waiting_milli,
        }
    }

    /// Whether tasks are waiting for a CPU: a poll would take time they want.
    pub fn others_wait(&self, s: &DemandState) -> bool {
        s.waiting_milli >= WAITING_LIMIT_MILLI
    }
}

/// The runnable tasks of the machine from the text of `/proc/loadavg`
/// (`0.52 0.58 0.59 3/467 12345`: the fourth field's numerator).
pub fn runnable_from_loadavg(text: &str) -> Option<u32> {
    text.split_whitespace()
        .nth(3)?
        .split('/')
        .next()?
        .parse()
        .ok()
}

/// The machine's demand for CPUs, sampled from `/proc/loadavg` (kept open and re-read at
/// offset 0, a few µs) as [`DemandRule`] asks.
#[derive(Debug)]
pub struct MachineDemand {
    rule: DemandRule,
    state: DemandState,
    origin: Instant,
    /// `None`: never report waiting tasks ([`BusyPoll::under_load`], or no file to read).
    loadavg: Option<std::fs::File>,
}

impl MachineDemand {
    pub fn new(under_load: bool) -> MachineDemand {
        let loadavg = (!under_load).then_some(Path::new("/proc/loadavg"));
        MachineDemand::sampling(loadavg)
    }

    /// The demand read from `loadavg` (a file in `/proc/loadavg`'s format; `None`: never
    /// report waiting tasks). Tests give it a file of their own.
    pub(crate) fn sampling(loadavg: Option<&Path>) -> MachineDemand {
        // SAFETY: sysconf has no preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let cpus = u32::try_from(online)
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
        MachineDemand {
            rule: DemandRule::new(cpus),
            state: DemandState::default(),
            origin: Instant::now(),
            loadavg: loadavg.and_then(|p| std::fs::File::open(p).ok()),
        }
    }

    /// Whether tasks are waiting for a CPU now. Without `/proc/loadavg` it says no (the
    /// poller's own evidence still stops a poll that takes another task's CPU).
    pub fn others_wait(&mut self, now: Instant) -> bool {
        let Some(f) = &self.loadavg else { return false };
        let now_ns = u64::try_from(now.saturating_duration_since(self.origin).as_nanos())
            .unwrap_or(u64::MAX);
        if self.rule.due(&self.state, now_ns) {
            use std::os::unix::fs::FileExt;
            let mut buf = [0u8; 128];
            let runnable = f
                .read_at(&mut buf, 0)
                .ok()
                .and_then(|n| runnable_from_loadavg(std::str::from_utf8(&buf[..n]).ok()?));
            if let Some(r) = runnable {
                self.state = self.rule.sample(self.state, now_ns, r);
            }
        }
        self.rule.others_wait(&self.state)
    }

    /// The smoothed demand (for logs and tests).
    pub fn state(&self) -> DemandState {
        self.state
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

    const MS: u64 = 1_000_000;

    /// Feeds `runnable` counts sampled every 2 ms from `t0_ms`; returns the state and the
    /// first sample time (ms) at which `others_wait` equalled `want`, if any.
    fn feed(
        r: DemandRule,
        mut s: DemandState,
        t0_ms: u64,
        runnable: &[u32],
        want: bool,
    ) -> (DemandState, Option<u64>) {
        let mut first = None;
        for (i, &n) in runnable.iter().enumerate() {
            let t = (t0_ms + 2 * i as u64) * MS;
            assert!(r.due(&s, t));
            s = r.sample(s, t, n);
            if first.is_none() && r.others_wait(&s) == want {
                first = Some(t / MS);
            }
        }
        (s, first)
    }

    #[test]
    fn a_burst_of_its_own_keeps_polling() {
        // Two CPUs: the poller and the caller it has just answered are both runnable, now
        // and then a third task (a kaiso background thread, a kernel worker) runs briefly.
        let r = DemandRule::new(2);
        let mut seen = vec![2u32; 200];
        for i in (0..200).step_by(7) {
            seen[i] = 3;
        }
        let (s, busy_at) = feed(r, DemandState::default(), 0, &seen, true);
        assert_eq!(busy_at, None, "stopped polling: {s:?}");
        // The caller blocked in its next request, only the poller running: as quiet.
        let (_, busy_at) = feed(r, s, 400, &[1; 50], true);
        assert_eq!(busy_at, None);
    }

    #[test]
    fn cpu_hogs_stop_polling_within_a_few_ms() {
        let r = DemandRule::new(2);
        let (s, _) = feed(r, DemandState::default(), 0, &[2; 50], true);
        assert!(!r.others_wait(&s));
        // Two busy loops start at 100 ms: runnable = 2 hogs + poller (+ caller).
        let (s, busy_at) = feed(r, s, 100, &[3, 4, 3, 4, 3, 4, 3, 4, 3, 4], true);
        let busy_at = busy_at.expect("never noticed the hogs");
        assert!(busy_at - 100 <= 4, "noticed after {} ms", busy_at - 100);
        assert!(r.others_wait(&s));
        // Hogs from the first sample on.
        let (_, busy_at) = feed(r, DemandState::default(), 0, &[4; 10], true);
        assert_eq!(busy_at, Some(0));
        // A single hog on two CPUs still takes a CPU the caller wants.
        let (_, busy_at) = feed(r, DemandState::default(), 0, &[3; 10], true);
        assert!(busy_at.is_some_and(|t| t <= 6), "{busy_at:?}");
        // The hogs end: polling comes back within some tens of ms.
        let (_, quiet_at) = feed(r, s, 120, &[2; 50], false);
        let quiet_at = quiet_at.expect("never polled again");
        assert!(
            quiet_at - 120 <= 40,
            "polled again after {} ms",
            quiet_at - 120
        );
    }

    #[test]
    fn samples_are_rate_limited_and_none_decides_alone() {
        let r = DemandRule::new(4);
        // The first sample weighs 4 / (4 + 10).
        let s = r.sample(DemandState::default(), 10 * MS, 9);
        assert_eq!(s.waiting_milli(), 5_000 * 4 / 14);
        assert!(!r.due(&s, 11 * MS));
        assert!(r.due(&s, 12 * MS));
        // One task too many for a moment, after a quiet second: polling goes on.
        let s = r.sample(DemandState::default(), 0, 4);
        let s = r.sample(s, 1_000 * MS, 5);
        assert!(!r.others_wait(&s), "{s:?}");
        // A clock that went backwards (or the same instant) changes nothing.
        let s2 = r.sample(s, 5 * MS, 40);
        assert_eq!(s2.waiting_milli(), s.waiting_milli());
    }

    #[test]
    fn one_cpu_never_polls_with_the_caller_runnable() {
        let r = DemandRule::new(1);
        let (_, busy_at) = feed(r, DemandState::default(), 0, &[2; 5], true);
        assert!(busy_at.is_some_and(|t| t <= 6), "{busy_at:?}");
        assert_eq!(DemandRule::new(0).cpus, 1);
    }

    #[test]
    fn loadavg_text_is_parsed() {
        assert_eq!(
            runnable_from_loadavg("0.52 0.58 0.59 3/467 12345\n"),
            Some(3)
        );
        assert_eq!(
            runnable_from_loadavg("8.92 4.10 2.63 12/189 11096"),
            Some(12)
        );
        assert_eq!(runnable_from_loadavg("0.5 0.5 0.5"), None);
        assert_eq!(runnable_from_loadavg("0.5 0.5 0.5 x/1 2"), None);
        assert_eq!(runnable_from_loadavg(""), None);
    }

    #[test]
    fn this_machine_has_a_readable_demand() {
        let mut m = MachineDemand::new(false);
        let t = Instant::now();
        m.others_wait(t);
        assert!(m.state().last_ns.is_some(), "/proc/loadavg was not sampled");
        // Within the sample interval it is not read again.
        let before = m.state();
        m.others_wait(t + Duration::from_micros(100));
        assert_eq!(m.state(), before);
        // Polling under load never reads it.
        let mut any = MachineDemand::new(true);
        assert!(!any.others_wait(t));
        assert_eq!(any.state(), DemandState::default());
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
            Polled::Nothing(d) => {
                assert!(d >= Duration::from_millis(2));
                assert!(t.elapsed() >= d);
            }
            // A loaded test machine may run another thread during a yield: the loop
            // gives way at once then, however little time has passed.
            Polled::GaveWay(_) => {}
            other => panic!("{other:?}"),
        }
        tx.write_all(b"x").unwrap();
        assert!(matches!(
            poll_for_request(rx.as_fd(), Duration::from_millis(2)),
            Polled::Ready(_)
        ));
        drop(tx);
        drop(rx);
    }

    /// The poller's own evidence: with a busy loop on its CPU, a yield lets the loop run
    /// and the poll gives way at once instead of polling out its window.
    #[test]
    fn a_yield_to_another_task_ends_the_poll() {
        use std::os::fd::AsFd;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        fn pin_to_cpu0() -> bool {
            // SAFETY: a zeroed cpu_set_t is valid; CPU_SET on index 0 is in range.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
            }
        }
        let (rx, _tx) = std::io::pipe().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let running = Arc::new(AtomicBool::new(false));
        let (stop2, running2) = (stop.clone(), running.clone());
        let hog = std::thread::spawn(move || {
            if !pin_to_cpu0() {
                return;
            }
            let end = Instant::now() + Duration::from_secs(10);
            running2.store(true, Ordering::SeqCst);
            while !stop2.load(Ordering::Relaxed) && Instant::now() < end {
                std::hint::spin_loop();
            }
        });
        let result = std::thread::spawn(move || {
            assert!(pin_to_cpu0());
            let end = Instant::now() + Duration::from_secs(5);
            while !running.load(Ordering::SeqCst) && Instant::now() < end {
                std::thread::yield_now();
            }
            poll_for_request(rx.as_fd(), Duration::from_secs(2))
        })
        .join()
        .unwrap();
        stop.store(true, Ordering::SeqCst);
        hog.join().unwrap();
        match result {
            Polled::GaveWay(after) => assert!(after < Duration::from_secs(1), "{after:?}"),
            other => panic!("polled on beside a busy loop: {other:?}"),
        }
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
