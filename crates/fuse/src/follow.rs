//! Serving a request on the CPU of the process that sent it.
//!
//! A FUSE round trip wakes the daemon's reading worker and then the caller. When the two
//! run on different CPUs each wake-up crosses CPUs, and on a VM whose idle vCPUs halt at
//! once (guest halt polling off) a wake-up on another vCPU is an exit to the host, tens of
//! µs: on the project's 2-vCPU VM a kaiso mount did 2,860–4,915 creates/s unpinned and
//! 18,762–18,862/s with daemon and caller on one vCPU (docs/tiering.md). FUSE over
//! io_uring gets that locality by design (a queue per CPU); fuser 0.18 has none.
//!
//! So the gate's single reading worker may follow the caller when one caller dominates.
//! The FUSE workers never look at the caller themselves: a worker that starts a request
//! stores the caller's thread id (the request header's pid) in an atomic and counts the
//! request; a sampler thread of the gate, every [`SAMPLE_EVERY`] while requests come,
//! reads the CPU that caller last ran on (`/proc/<tid>/stat` field 39) and the run delay
//! of the restricted reader (`/proc/self/task/<tid>/schedstat`), feeds a pure rule
//! ([`FollowRule`]) and publishes the CPU to follow in an atomic; the worker that goes
//! back to reading as the only reader restricts itself to that CPU (`sched_setaffinity`
//! of that thread only, between requests) or gives the CPU back. Reading another
//! process's `/proc/<pid>/stat` waits while that process execs (its `exec_update_lock`),
//! and an exec that closes a close-on-exec descriptor on the mount waits for the FLUSH
//! reply: a worker that read the caller's `/proc` could deadlock with it (session 15).
//! The sampler may wait there as long as it likes: nothing waits for it.
//!
//! The rule follows a CPU when most recent samples show the caller on it, and gives it
//! back when the samples spread over CPUs (two callers, or a caller that moved away),
//! when requests are sparse, when the restricted reader itself waited to run for a large
//! share of the time ([`RUN_DELAY_LIMIT_MILLI`]: its CPU is wanted by others), when a
//! request runs long (the gate's watchdog) and when the mount goes idle. The machine's
//! load average is not a reason to give the CPU back (session 15's rule did so and never
//! followed while other engineers compiled, the very load under which following doubled
//! creates/s). After a release for spread samples or load the rule waits before following
//! again, longer each time.
//!
//! Off by default; `KAISO_FUSE_FOLLOW=1` in the mounting process (or `kaiso mount
//! --follow-caller-cpu`) turns it on, `KAISO_FUSE_FOLLOW=0` (or `--no-follow-caller-cpu`)
//! off.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// Environment variable that, set to `1` in the mounting process, is the default of
/// [`FollowCaller::under_load`]: follow even while tasks wait for a CPU (comparisons on a
/// busy machine).
pub const UNDER_LOAD_ENV: &str = "KAISO_FUSE_FOLLOW_UNDER_LOAD";
/// Shortest time between two samples of the caller's CPU.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(1);
/// Requests further apart than this on average (between two samples) are sparse:
/// nothing to gain from following, and the worker gives its CPU back.
pub const SPARSE_GAP: Duration = Duration::from_millis(5);
/// A request that comes this long after the one before is sampled at once (and finds
/// requests sparse): a worker must not serve the first requests after a quiet spell on a
/// CPU chosen before it.
pub const QUIET_GAP: Duration = Duration::from_millis(50);
/// Samples remembered.
pub const HISTORY: usize = 8;
/// Samples of the last [`HISTORY`] on one CPU from which the worker follows it.
pub const PIN_AT: usize = 6;
/// A following worker gives its CPU back when fewer of the last [`HISTORY`] samples than
/// this show the caller on it (and no other CPU has [`PIN_AT`]).
pub const KEEP_AT: usize = 5;
/// Share of the time (thousandths) the restricted reader waited for its CPU from which it
/// stops following: the CPU it follows on is wanted by others.
pub const RUN_DELAY_LIMIT_MILLI: u64 = 250;
/// First and longest wait, in samples, before following again after a release for
/// spread samples or load.
const FIRST_HOLD: u32 = 16;
const MAX_HOLD: u32 = 1024;
/// Samples in a row on the followed CPU after which the next hold starts over short.
const STABLE_RESET: u32 = 256;

/// A mount's settings for following the caller's CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowCaller {
    /// Follow at all. Default: [`FOLLOW_ENV`] is `1` (else [`DEFAULT_ENABLED`]).
    pub enabled: bool,
    /// Follow even while the restricted reader waits to run (tests, comparisons). Default: [`UNDER_LOAD_ENV`] is `1`.
    pub under_load: bool,
}

/// Environment variable that, set to `1` (`0`) in the mounting process, turns following
/// on (off); unset or other values leave [`DEFAULT_ENABLED`].
pub const FOLLOW_ENV: &str = "KAISO_FUSE_FOLLOW";
/// Whether a mount follows the caller's CPU when nothing says otherwise (off: not shown
/// to win on a quiet machine yet, see docs/tiering.md).
pub const DEFAULT_ENABLED: bool = false;

impl Default for FollowCaller {
    fn default() -> Self {
        FollowCaller {
            enabled: match std::env::var(FOLLOW_ENV).as_deref() {
                Ok("1") => true,
                Ok("0") => false,
                _ => DEFAULT_ENABLED,
            },
            under_load: std::env::var(UNDER_LOAD_ENV).is_ok_and(|v| v == "1"),
        }
    }
}

impl FollowCaller {
    /// Never follow.
    pub const OFF: FollowCaller = FollowCaller {
        enabled: false,
        under_load: false,
    };
}

/// What one sample saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// The CPU the caller of the sampled request last ran on (`None`: unknown).
    pub cpu: Option<u32>,
    /// Requests since the previous sample, the sampled one included.
    pub requests: u32,
    /// Time since the previous sample, ns.
    pub elapsed_ns: u64,
    /// Tasks wait for a CPU (the machine's runnable tasks, smoothed).
    pub others_wait: bool,
    /// Share of the time (thousandths) the sampling worker waited to run since its last
    /// sample (`None`: unknown).
    pub run_delay_milli: Option<u64>,
}

/// What to do with the reading worker's CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Keep,
    /// Read (and serve) on this CPU only.
    Pin(u32),
    /// Give the CPU back, for this reason (after spread samples or load the rule also
    /// waits before following again).
    Release(Why),
}

/// Why the worker gave its CPU back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// The caller's CPU samples spread over CPUs.
    Spread,
    /// Tasks wait for a CPU, or the worker waited to run.
    Load,
    /// Requests came sparsely.
    Sparse,
}

/// The rule (pure: samples in, decisions out).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowRule {
    /// Ignore the machine's load and the worker's run delay.
    pub under_load: bool,
}

/// What the rule remembers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowState {
    history: [Option<u32>; HISTORY],
    /// Samples in `history` (up to [`HISTORY`]) and the next slot.
    len: usize,
    next: usize,
    /// The CPU the reading worker is told to stay on.
    pinned: Option<u32>,
    /// Samples still to take before following again, and the next hold's length.
    hold: u32,
    next_hold: u32,
    /// Samples in a row on the followed CPU.
    stable: u32,
}

impl FollowState {
    /// The CPU the reading worker is told to stay on.
    pub fn pinned(&self) -> Option<u32> {
        self.pinned
    }

    fn forget(&mut self) {
        self.len = 0;
        self.next = 0;
        self.stable = 0;
    }

    fn push(&mut self, cpu: Option<u32>) {
        self.history[self.next] = cpu;
        self.next = (self.next + 1) % HISTORY;
        self.len = (self.len + 1).min(HISTORY);
    }

    fn count(&self, cpu: u32) -> usize {
        self.history[..self.len]
            .iter()
            .filter(|c| **c == Some(cpu))
            .count()
    }

    /// The CPU seen most often in the history, and how often.
    fn majority(&self) -> Option<(u32, usize)> {
        self.history[..self.len]
            .iter()
            .flatten()
            .map(|&c| (c, self.count(c)))
            .max_by_key(|&(_, n)| n)
    }

    fn hold_off(&mut self) {
        self.next_hold = if self.next_hold == 0 {
            FIRST_HOLD
        } else {
            self.next_hold.saturating_mul(2).min(MAX_HOLD)
        };
        self.hold = self.next_hold;
    }

    fn release(&mut self, why: Why) -> Decision {
        self.forget();
        if why != Why::Sparse {
            self.hold_off();
        }
        match self.pinned.take() {
            Some(_) => Decision::Release(why),
            None => Decision::Keep,
        }
    }
}

impl FollowRule {
    /// Whether `requests` requests in `elapsed_ns` are sparse.
    pub fn sparse(requests: u32, elapsed_ns: u64) -> bool {
        elapsed_ns > u64::from(requests.max(1)).saturating_mul(SPARSE_GAP.as_nanos() as u64)
    }

    /// The state after the mount went idle: nothing followed, no hold.
    pub fn idle(s: FollowState) -> FollowState {
        let mut s = s;
        s.release(Why::Sparse);
        s
    }

    /// The state after one more sample, and what to do.
    pub fn update(&self, s: FollowState, x: Sample) -> (FollowState, Decision) {
        let mut s = s;
        if FollowRule::sparse(x.requests, x.elapsed_ns) {
            let d = s.release(Why::Sparse);
            return (s, d);
        }
        let contended = x
            .run_delay_milli
            .is_some_and(|m| m >= RUN_DELAY_LIMIT_MILLI);
        if !self.under_load && (x.others_wait || contended) {
            let d = s.release(Why::Load);
            return (s, d);
        }
        s.push(x.cpu);
        if s.hold > 0 {
            s.hold -= 1;
            return (s, Decision::Keep);
        }
        let majority = s.majority().filter(|&(_, n)| n >= PIN_AT);
        match (s.pinned, majority) {
            (Some(p), Some((m, _))) if m != p => {
                // The caller moved, and stayed.
                s.pinned = Some(m);
                s.stable = 0;
                (s, Decision::Pin(m))
            }
            (Some(p), _) if s.count(p) < KEEP_AT => {
                let d = s.release(Why::Spread);
                (s, d)
            }
            (Some(p), _) => {
                if x.cpu == Some(p) {
                    s.stable += 1;
                    if s.stable >= STABLE_RESET {
                        s.next_hold = 0;
                    }
                }
                (s, Decision::Keep)
            }
            (None, Some((m, _))) if s.len == HISTORY => {
                s.pinned = Some(m);
                s.stable = 0;
                (s, Decision::Pin(m))
            }
            (None, _) => (s, Decision::Keep),
        }
    }
}

/// How following went since the mount (for logs and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FollowStats {
    /// Samples of the caller's CPU taken.
    pub samples: u64,
    /// Times the rule started following a CPU, and moved to another one.
    pub pins: u64,
    pub moves: u64,
    /// Releases for spread samples, for load, for sparse requests.
    pub released_spread: u64,
    pub released_load: u64,
    pub released_sparse: u64,
    /// Pinned workers given all CPUs back by the watchdog (a long request, an idle mount).
    pub unpinned_by_watchdog: u64,
    /// The CPU the reading worker is told to stay on now.
    pub pinned_to: Option<u32>,
    /// The largest run-delay share (thousandths) a sample saw.
    pub max_run_delay_milli: u64,
}

/// The CPU a `/proc/<pid>/stat` text says the task last ran on (field 39).
pub fn cpu_from_stat(text: &str) -> Option<u32> {
    // The command name (field 2) may hold spaces and parentheses: fields after it start
    // after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_ascii_whitespace().nth(39 - 3)?.parse().ok()
}

/// Reads callers' CPUs, keeping the last caller's stat file open (re-read at offset 0).
#[derive(Debug, Default)]
pub struct CallerProbe {
    open: Option<(u32, std::fs::File)>,
}

impl CallerProbe {
    /// The CPU task `tid` last ran on, if readable.
    pub fn cpu_of(&mut self, tid: u32) -> Option<u32> {
        if tid == 0 {
            return None;
        }
        if self.open.as_ref().is_none_or(|(t, _)| *t != tid) {
            self.open = None;
            let f = std::fs::File::open(format!("/proc/{tid}/stat")).ok()?;
            self.open = Some((tid, f));
        }
        let (_, f) = self.open.as_ref()?;
        let mut buf = [0u8; 1024];
        let n = match f.read_at(&mut buf, 0) {
            Ok(n) if n > 0 => n,
            _ => {
                // The task ended.
                self.open = None;
                return None;
            }
        };
        cpu_from_stat(std::str::from_utf8(&buf[..n]).ok()?)
    }
}

/// Thread `tid` of this process's time spent waiting on a run queue so far, ns
/// (`/proc/self/task/<tid>/schedstat`, second field).
pub fn run_delay_ns_of(tid: i32) -> Option<u64> {
    let mut buf = [0u8; 96];
    let f = std::fs::File::open(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n])
        .ok()?
        .split_ascii_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// This thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// A set of CPUs for `sched_setaffinity`.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.cpus()).finish()
    }
}

impl CpuSet {
    /// The CPUs thread `tid` (0: this one) may run on.
    pub fn of(tid: i32) -> Option<CpuSet> {
        // SAFETY: a zeroed cpu_set_t is valid; the size matches the pointer.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            (libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0)
                .then_some(CpuSet(set))
        }
    }

    /// The set holding `cpu` only.
    pub fn one(cpu: u32) -> Option<CpuSet> {
        let cpu = usize::try_from(cpu).ok()?;
        if cpu >= libc::CPU_SETSIZE as usize {
            return None;
        }
        // SAFETY: a zeroed cpu_set_t is valid; `cpu` is in range.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            Some(CpuSet(set))
        }
    }

    pub fn contains(&self, cpu: u32) -> bool {
        usize::try_from(cpu).is_ok_and(|c| {
            // SAFETY: CPU_ISSET checks the index against the set's size.
            c < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(c, &self.0) }
        })
    }

    pub fn cpus(&self) -> Vec<u32> {
        (0..libc::CPU_SETSIZE as u32)
            .filter(|&c| self.contains(c))
            .collect()
    }

    /// Restricts thread `tid` (0: this one) to this set.
    pub fn apply(&self, tid: i32) -> std::io::Result<()> {
        // SAFETY: a valid set of the size given.
        let r = unsafe {
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &self.0)
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &Self) -> bool {
        self.cpus() == other.cpus()
    }
}

/// The command name of thread `tid` of this process (tests look for `fuser-N`).
pub fn thread_name(tid: i32) -> Option<String> {
    let mut s = String::new();
    std::fs::File::open(format!("/proc/self/task/{tid}/comm"))
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    Some(s.trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn rule() -> FollowRule {
        FollowRule::default()
    }

    /// A dense sample (8 requests in 1 ms) from a caller on `cpu`.
    fn on(cpu: u32) -> Sample {
        Sample {
            cpu: Some(cpu),
            requests: 8,
            elapsed_ns: MS,
            others_wait: false,
            run_delay_milli: Some(10),
        }
    }

    /// Feeds samples; returns the state and the decisions that were not `Keep`, with the
    /// index of their sample.
    fn feed(
        r: FollowRule,
        mut s: FollowState,
        samples: impl IntoIterator<Item = Sample>,
    ) -> (FollowState, Vec<(usize, Decision)>) {
        let mut out = Vec::new();
        for (i, x) in samples.into_iter().enumerate() {
            let (next, d) = r.update(s, x);
            s = next;
            if d != Decision::Keep {
                out.push((i, d));
            }
        }
        (s, out)
    }

    #[test]
    fn a_single_caller_is_followed_after_a_full_history() {
        let (s, d) = feed(rule(), FollowState::default(), (0..20).map(|_| on(1)));
        assert_eq!(d, vec![(HISTORY - 1, Decision::Pin(1))]);
        assert_eq!(s.pinned(), Some(1));
    }

    #[test]
    fn two_callers_on_two_cpus_are_never_followed() {
        let (s, d) = feed(rule(), FollowState::default(), (0..1000).map(|i| on(i % 2)));
        assert!(d.is_empty(), "{d:?}");
        assert_eq!(s.pinned(), None);
    }

    #[test]
    fn a_second_caller_on_another_cpu_releases_and_holds_off() {
        let (s, _) = feed(rule(), FollowState::default(), (0..20).map(|_| on(0)));
        assert_eq!(s.pinned(), Some(0));
        // Released when the pinned CPU no longer has KEEP_AT of the last samples.
        let (s, d) = feed(rule(), s, (0..HISTORY as u32).map(|i| on(i % 2)));
        assert_eq!(d, vec![(HISTORY - 1, Decision::Release(Why::Spread))]);
        // The single caller again: followed once the hold has passed, not before.
        let (s, d) = feed(rule(), s, (0..200).map(|_| on(0)));
        assert_eq!(d, vec![(FIRST_HOLD as usize, Decision::Pin(0))]);
        assert_eq!(s.pinned(), Some(0));
    }

    #[test]
    fn a_caller_that_moves_is_followed_to_its_new_cpu() {
        let (s, _) = feed(rule(), FollowState::default(), (0..20).map(|_| on(0)));
        // A release when the old CPU loses its majority, then (after the hold) a pin on
        // the new one.
        let (s, d) = feed(rule(), s, (0..100).map(|_| on(1)));
        assert_eq!(s.pinned(), Some(1), "{d:?}");
        assert_eq!(d.len(), 2, "{d:?}");
        assert_eq!(d[0], (HISTORY - KEEP_AT, Decision::Release(Why::Spread)));
        assert_eq!(d[1].1, Decision::Pin(1));
        assert!(d[1].0 <= HISTORY + FIRST_HOLD as usize, "{d:?}");
    }

    /// A caller the scheduler moves to the other CPU as soon as the worker follows it
    /// (its wake-ups find the followed CPU busy): the releases come further and further
    /// apart.
    #[test]
    fn a_caller_that_keeps_leaving_is_followed_less_and_less() {
        let r = rule();
        let mut s = FollowState::default();
        let mut caller = 0u32;
        let mut pins = Vec::new();
        for i in 0..20_000 {
            let (next, d) = r.update(s, on(caller));
            s = next;
            if let Decision::Pin(c) = d {
                pins.push(i);
                // The caller runs elsewhere from now on.
                caller = 1 - c;
            }
        }
        assert!(pins.len() < 30, "{} pins in 20,000 samples", pins.len());
        let gaps: Vec<_> = pins.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.windows(2).take(5).all(|w| w[1] > w[0]),
            "the holds do not grow: {gaps:?}"
        );
    }

    #[test]
    fn load_releases_and_under_load_ignores_it() {
        let (s, _) = feed(rule(), FollowState::default(), (0..20).map(|_| on(1)));
        let busy = Sample {
            others_wait: true,
            ..on(1)
        };
        let (s2, d) = rule().update(s, busy);
        assert_eq!(d, Decision::Release(Why::Load));
        assert_eq!(s2.pinned(), None);
        let waited = Sample {
            run_delay_milli: Some(RUN_DELAY_LIMIT_MILLI),
            ..on(1)
        };
        assert_eq!(rule().update(s, waited).1, Decision::Release(Why::Load));
        // Tasks waiting all the time: never followed.
        let (_, d) = feed(rule(), FollowState::default(), (0..1000).map(|_| busy));
        assert!(d.is_empty(), "{d:?}");
        let r = FollowRule { under_load: true };
        let (s, _) = feed(r, FollowState::default(), (0..20).map(|_| busy));
        assert_eq!(s.pinned(), Some(1));
        assert_eq!(r.update(s, waited).1, Decision::Keep);
    }

    #[test]
    fn sparse_requests_release_without_holding_off() {
        let (s, _) = feed(rule(), FollowState::default(), (0..20).map(|_| on(1)));
        let sparse = Sample {
            requests: 1,
            elapsed_ns: 6 * MS,
            ..on(1)
        };
        let (s, d) = rule().update(s, sparse);
        assert_eq!(d, Decision::Release(Why::Sparse));
        // Dense again: followed after a full history, no hold.
        let (s, d) = feed(rule(), s, (0..HISTORY).map(|_| on(1)));
        assert_eq!(d, vec![(HISTORY - 1, Decision::Pin(1))]);
        assert_eq!(s.pinned(), Some(1));
        assert!(FollowRule::sparse(8, 41 * MS));
        assert!(!FollowRule::sparse(8, 40 * MS));
        assert!(FollowRule::sparse(1, QUIET_GAP.as_nanos() as u64));
    }

    #[test]
    fn unknown_callers_do_not_vote() {
        let unknown = Sample { cpu: None, ..on(0) };
        let (s, d) = feed(rule(), FollowState::default(), (0..100).map(|_| unknown));
        assert!(d.is_empty());
        assert_eq!(s.pinned(), None);
    }

    #[test]
    fn stat_field_39_is_the_cpu() {
        // A command name with spaces and a parenthesis.
        let mut text = String::from("4242 (a (b) c) S");
        for f in 4..=38 {
            text.push_str(&format!(" {f}"));
        }
        text.push_str(" 7 0 0 0\n");
        assert_eq!(cpu_from_stat(&text), Some(7));
        assert_eq!(cpu_from_stat("1 (x) S 1 2"), None);
        // This thread's own stat names a CPU it may run on.
        let tid = gettid() as u32;
        let cpu = CallerProbe::default().cpu_of(tid).expect("own stat");
        assert!(CpuSet::of(0).unwrap().contains(cpu));
    }
}
