//! Which worker thread reads the next FUSE request.
//!
//! Every fuser worker blocks in `read(/dev/fuse)`, and the kernel hands a new request to
//! the thread that has waited longest (its wait queue is first in, first out). With
//! several idle workers each request therefore wakes a different, cold thread, usually
//! on the other CPU: on the project's 2-vCPU VM that made a create+close cost 3–4 times
//! the CPU of a single worker (`examples/fuse_floor.rs`, docs/tiering.md).
//!
//! The [`WorkerGate`] keeps one worker reading while the others stand by: a worker that
//! finishes a request while another worker is already reading does not go back to the
//! kernel but parks here. So the thread that just answered is the one that reads the
//! next request, and it stays hot. Parked workers are not lost: a watchdog hands one of
//! them back to the kernel whenever no worker is reading and a request has been running
//! for [`STALL`] (a slow tier, a migration fetch, a FIFO open waiting for its peer), so a
//! slow request never holds up the others for longer than that.
//!
//! Parked workers also return to the kernel after [`PARK_TIMEOUT`]: fuser gives no sign
//! when the session ends from outside (`fusermount3 -u`), and a worker must be reading to
//! see the end and let the session finish.
//!
//! The worker that goes back to reading may first busy-poll the device for a short,
//! adaptive window ([`crate::busy_poll`]), so the next request of a burst is read without
//! the thread going to sleep (and paying a wake-up), unless tasks are waiting for a CPU.
//!
//! The reading worker may also follow the caller's CPU ([`crate::follow`]): when one
//! caller dominates, the worker that goes back to reading as the only reader restricts
//! itself to the CPU a sampler thread last chose (an atomic it reads between requests:
//! workers never read another process's `/proc` nor wait for the sampler), and gives it
//! back when the rule says so.
//! Only a worker between requests changes its own CPUs; a worker that parks gives them
//! back first, and the watchdog gives them back to a worker whose request runs for
//! [`STALL`] and to the reader of a mount gone idle.
//!
//! Setting the environment variable [`ALL_READ_ENV`] to `1` turns the gate off (every
//! worker reads, as fuser does by itself, and none polls or follows), for comparisons.

use crate::busy_poll::{
    BusyPoll, MachineDemand, Outcome, PollRule, PollState, Polled, poll_for_request,
};
use crate::follow::{
    CallerProbe, CpuSet, Decision, FollowCaller, FollowRule, FollowState, FollowStats, QUIET_GAP,
    SAMPLE_EVERY, Sample, Why,
};
use std::cell::Cell;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// How long a request may run, with no other worker reading, before a parked worker is
/// handed back to the kernel.
pub const STALL: Duration = Duration::from_millis(2);
/// Longest time a worker stays parked before it reads again.
pub const PARK_TIMEOUT: Duration = Duration::from_secs(1);
/// Environment variable that turns the gate off when set to `1`.
pub const ALL_READ_ENV: &str = "KAISO_FUSE_ALL_READ";
/// The watchdog sleeps until the next request after this many idle checks.
const IDLE_CHECKS: u32 = 100;

#[derive(Default)]
struct State {
    /// Workers outside a request (reading from the kernel, or about to).
    readers: usize,
    /// Requests being served: (id, start, the serving worker's thread id).
    busy: Vec<(u64, Instant, i32)>,
    next_id: u64,
    parked: usize,
    /// Parked workers told to go back to reading, not yet gone.
    released: usize,
    closing: bool,
    watchdog_asleep: bool,
    /// Parked workers handed back by the watchdog (for tests and logs).
    stall_releases: u64,
    /// The busy-poll window's state.
    poll: PollState,
    /// When the last request in service ended with no other in service, if the worker
    /// then went to sleep in `read`, and how long it polled before (ns, 0: not at all).
    idle_since: Option<(Instant, u64)>,
    /// How busy polls ended, and how often one was not started because tasks were
    /// waiting for a CPU.
    polls: PollStats,
    /// The request id of the last forget served (the nodes of a batch share one).
    last_forget: Option<u64>,
    /// Pinned workers given all CPUs back by the watchdog (for [`FollowStats`]).
    unpinned_by_watchdog: u64,
    /// Workers restricted to one CPU: (thread id, CPU).
    pinned: Vec<(i32, u32)>,
}

impl State {
    /// The CPU thread `tid` is restricted to, if any.
    fn pinned_cpu(&self, tid: i32) -> Option<u32> {
        self.pinned.iter().find(|(t, _)| *t == tid).map(|&(_, c)| c)
    }
}

/// Following the caller's CPU (see [`crate::follow`]). The workers and the sampler
/// thread share atomics only: a worker publishes the caller of the request it starts and
/// counts requests, and reads the sampler's decision between requests; it never reads
/// another process's `/proc` (that read waits while the caller execs, and the exec may be
/// waiting for this worker's reply) and never waits for the sampler.
struct Follow {
    rule: FollowRule,
    /// The CPUs the workers may run on when not following (the process's at the mount).
    all: CpuSet,
    /// The caller (thread id) of the last request started (0: none yet).
    caller: AtomicU32,
    /// Requests started since the sampler last looked.
    requests: AtomicU32,
    /// The CPU the reading worker is to stay on (-1: none), set by the sampler.
    target: AtomicI64,
    /// The thread id of the worker restricted to `target` (0: none), for its run delay.
    reader: AtomicI32,
    /// The sampler sleeps until a request starts (the mount went idle).
    asleep: AtomicBool,
    /// The session ends: the sampler stops.
    closed: AtomicBool,
    sampler: OnceLock<std::thread::Thread>,
    /// The sampler's counters (only the sampler and `follow_stats` lock this).
    stats: Mutex<FollowStats>,
}

impl Follow {
    fn target(&self) -> Option<u32> {
        u32::try_from(self.target.load(Ordering::Relaxed)).ok()
    }
}

/// This thread's id, and its run delay at its last sample (ns, when).
fn tid() -> i32 {
    thread_local! {
        static TID: Cell<i32> = const { Cell::new(0) };
    }
    TID.with(|t| {
        if t.get() == 0 {
            t.set(crate::follow::gettid());
        }
        t.get()
    })
}

struct Inner {
    state: Mutex<State>,
    parked: Condvar,
    watchdog: Condvar,
    /// Whether workers stand by (more than one worker).
    stand_by: bool,
    rule: PollRule,
    /// A duplicate of the session's `/dev/fuse` descriptor to poll (set once mounted).
    device: OnceLock<OwnedFd>,
    /// Whether tasks wait for a CPU (read by the worker about to poll).
    demand: Mutex<MachineDemand>,
    /// Following the caller's CPU, if on.
    follow: Option<Follow>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How a gate's busy polls ended (counted since the mount).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PollStats {
    /// Polls that saw the next request.
    pub caught: u64,
    /// Polls whose window ended without one.
    pub missed: u64,
    /// Polls that stopped because a yield let another task run.
    pub gave_way: u64,
    /// Polls the rule wanted but did not start, because tasks were waiting for a CPU.
    pub held_for_others: u64,
}

impl PollStats {
    /// Polls started.
    pub fn started(&self) -> u64 {
        self.caught + self.missed + self.gave_way
    }
}

/// The stand-by rule for one session's workers (see the module documentation). Cloning
/// gives another handle to the same gate.
#[derive(Clone)]
pub struct WorkerGate {
    inner: Option<Arc<Inner>>,
}

/// One request being served; dropping it (after the reply) ends the request, and may
/// park the worker.
#[must_use = "the request ends when this is dropped"]
pub struct Serving<'a> {
    gate: Option<&'a Inner>,
    id: u64,
    /// Whether the worker may stand by when it ends (not in the middle of a batch).
    may_park: bool,
    /// Whether the worker may busy-poll when it ends.
    may_poll: bool,
}

impl WorkerGate {
    /// A gate for `threads` workers (all reading at first) that does not busy-poll.
    pub fn new(threads: usize) -> WorkerGate {
        WorkerGate::with_busy_poll(threads, BusyPoll::OFF)
    }

    /// A gate for `threads` workers whose reading worker busy-polls as `busy_poll` says
    /// after a reply (the device to poll is given by [`WorkerGate::attach_device`]). With
    /// one worker nobody stands by; with [`ALL_READ_ENV`] set the gate does nothing.
    pub fn with_busy_poll(threads: usize, busy_poll: BusyPoll) -> WorkerGate {
        WorkerGate::with_options(threads, busy_poll, FollowCaller::OFF)
    }

    /// [`WorkerGate::with_busy_poll`], whose reading worker also follows the caller's CPU
    /// as `follow` says (requests started with [`WorkerGate::serve_for`]).
    pub fn with_options(threads: usize, busy_poll: BusyPoll, follow: FollowCaller) -> WorkerGate {
        // (A gate that never polls never samples the machine: no file to keep open.)
        let sample = !busy_poll.under_load && !busy_poll.max.is_zero();
        let demand = MachineDemand::new(!sample);
        WorkerGate::with_demand(threads, busy_poll, follow, demand)
    }

    /// [`WorkerGate::with_busy_poll`] with the machine's demand for CPUs read from
    /// `demand` (tests give it samples of their own).
    pub(crate) fn with_demand(
        threads: usize,
        busy_poll: BusyPoll,
        follow: FollowCaller,
        demand: MachineDemand,
    ) -> WorkerGate {
        let rule = PollRule::new(busy_poll.max);
        let stand_by = threads > 1;
        let follow = follow
            .enabled
            .then(|| CpuSet::of(0))
            .flatten()
            .map(|all| Follow {
                rule: FollowRule {
                    under_load: follow.under_load,
                },
                all,
                caller: AtomicU32::new(0),
                requests: AtomicU32::new(0),
                target: AtomicI64::new(-1),
                reader: AtomicI32::new(0),
                asleep: AtomicBool::new(false),
                closed: AtomicBool::new(false),
                sampler: OnceLock::new(),
                stats: Mutex::new(FollowStats::default()),
            });
        if (!stand_by && !rule.enabled() && follow.is_none())
            || std::env::var(ALL_READ_ENV).is_ok_and(|v| v == "1")
        {
            return WorkerGate { inner: None };
        }
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                readers: threads.max(1),
                ..State::default()
            }),
            parked: Condvar::new(),
            watchdog: Condvar::new(),
            stand_by,
            rule,
            device: OnceLock::new(),
            demand: Mutex::new(demand),
            follow,
        });
        if inner.follow.is_some() {
            let w = inner.clone();
            let spawned = std::thread::Builder::new()
                .name("kaiso-fuse-follow".into())
                .spawn(move || sampler(&w));
            match spawned {
                Ok(t) => {
                    if let Some(f) = &inner.follow {
                        let _ = f.sampler.set(t.thread().clone());
                    }
                }
                Err(e) => {
                    // Without a sampler the target stays "none": nothing is followed.
                    tracing::warn!(error = %e, "cannot start the FUSE follow sampler");
                }
            }
        }
        if !stand_by {
            // Nobody parks, so nobody needs handing back.
            return WorkerGate { inner: Some(inner) };
        }
        let w = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("kaiso-fuse-gate".into())
            .spawn(move || watchdog(&w));
        if let Err(e) = spawned {
            // Without a watchdog a parked worker could wait behind a slow request.
            tracing::warn!(error = %e, "cannot start the FUSE worker watchdog; every worker reads");
            return WorkerGate { inner: None };
        }
        WorkerGate { inner: Some(inner) }
    }

    /// Gives the gate a descriptor of the session's `/dev/fuse` to busy-poll (a
    /// duplicate, kept until the gate is dropped). Without one the gate never polls.
    pub fn attach_device(&self, device: &impl AsFd) -> std::io::Result<()> {
        if let Some(g) = self.inner.as_deref() {
            if g.rule.enabled() {
                let fd = device.as_fd().try_clone_to_owned()?;
                let _ = g.device.set(fd);
            }
        }
        Ok(())
    }

    /// A request starts on this worker (its caller unknown: not sampled for following).
    pub fn serve(&self) -> Serving<'_> {
        self.start(None, 0)
    }

    /// A request of thread `pid` (the request header's pid: the caller's thread id, 0 if
    /// unknown) starts on this worker.
    pub fn serve_for(&self, pid: u32) -> Serving<'_> {
        self.start(None, pid)
    }

    /// One node of a FORGET or BATCH_FORGET request (`unique`: the request's id) starts.
    /// fuser hands a batch to `forget` node by node, and nothing tells which node is the
    /// last, so: a forget never stands by (a worker must not park with the rest of its
    /// batch unread), and a node that shares its request with the one before does not
    /// busy-poll (the rest of its batch, not a new request, comes next). The first node
    /// of a batch polls in vain: one window per batch.
    pub fn serve_forget(&self, unique: u64) -> Serving<'_> {
        self.start(Some(unique), 0)
    }

    fn start(&self, forget: Option<u64>, pid: u32) -> Serving<'_> {
        let Some(g) = self.inner.as_deref() else {
            return Serving {
                gate: None,
                id: 0,
                may_park: false,
                may_poll: false,
            };
        };
        let mut s = g.lock();
        let batch_goes_on = forget.is_some() && forget == s.last_forget;
        s.last_forget = forget;
        let idle = s.idle_since.take();
        if let (false, Some((since, polled_ns))) = (batch_goes_on, idle) {
            // The first request after an idle moment teaches the poll rule the gap (not
            // the next node of a batch: the previous one polled for nothing).
            let gap_ns = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
            s.poll = g.rule.update(s.poll, Outcome::Slept { polled_ns, gap_ns });
        }
        s.readers = s.readers.saturating_sub(1);
        let id = s.next_id;
        s.next_id += 1;
        s.busy.push((id, Instant::now(), tid()));
        if s.watchdog_asleep {
            s.watchdog_asleep = false;
            g.watchdog.notify_one();
        }
        drop(s);
        if let Some(f) = &g.follow {
            // Hand the caller to the sampler (atomics only: nothing here waits).
            if pid != 0 {
                f.caller.store(pid, Ordering::Relaxed);
            }
            f.requests.fetch_add(1, Ordering::Relaxed);
            if f.asleep.load(Ordering::Relaxed) && f.asleep.swap(false, Ordering::AcqRel) {
                if let Some(t) = f.sampler.get() {
                    t.unpark();
                }
            }
        }
        Serving {
            gate: Some(g),
            id,
            may_park: forget.is_none(),
            may_poll: !batch_goes_on,
        }
    }

    /// The session ends: no worker parks any more, parked ones go back to the kernel (to
    /// see the end), and the watchdog stops.
    pub fn close(&self) {
        if let Some(g) = self.inner.as_deref() {
            g.lock().closing = true;
            if let Some(f) = &g.follow {
                f.closed.store(true, Ordering::SeqCst);
                if let Some(t) = f.sampler.get() {
                    t.unpark();
                }
            }
            g.parked.notify_all();
            g.watchdog.notify_all();
        }
    }

    /// Workers parked right now, and how often the watchdog has handed one back.
    pub fn stats(&self) -> (usize, u64) {
        match self.inner.as_deref() {
            Some(g) => {
                let s = g.lock();
                (s.parked, s.stall_releases)
            }
            None => (0, 0),
        }
    }

    /// How following the caller's CPU went so far (see [`FollowStats`]).
    pub fn follow_stats(&self) -> FollowStats {
        let Some(g) = self.inner.as_deref() else {
            return FollowStats::default();
        };
        let Some(f) = &g.follow else {
            return FollowStats::default();
        };
        let unpinned_by_watchdog = g.lock().unpinned_by_watchdog;
        FollowStats {
            unpinned_by_watchdog,
            ..*f.stats.lock().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// How the busy polls so far ended (see [`PollStats`]).
    pub fn poll_stats(&self) -> PollStats {
        self.inner
            .as_deref()
            .map_or(PollStats::default(), |g| g.lock().polls)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        let Some(g) = self.gate else { return };
        let mut s = g.lock();
        if let Some(i) = s.busy.iter().position(|(id, _, _)| *id == self.id) {
            s.busy.swap_remove(i);
        }
        if self.may_park && g.stand_by && s.readers > 0 && !s.closing {
            // Another worker is reading: stand by instead of queueing behind it (on all
            // CPUs: it may come back to read when the reader is stuck, or alone).
            place(g, &mut s, None);
            s.parked += 1;
            let deadline = Instant::now() + PARK_TIMEOUT;
            loop {
                if s.released > 0 {
                    s.released -= 1;
                    break;
                }
                let now = Instant::now();
                if s.closing || now >= deadline {
                    break;
                }
                s = g
                    .parked
                    .wait_timeout(s, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            s.parked -= 1;
            s.readers += 1;
            return;
        }
        s.readers += 1;
        // The only reader goes where the caller is, if the rule says so; a worker that
        // reads beside others does not.
        let cpu = (s.readers == 1 && !s.closing)
            .then(|| g.follow.as_ref().and_then(Follow::target))
            .flatten();
        place(g, &mut s, cpu);
        if !self.may_poll || !s.busy.is_empty() || s.closing || s.readers > 1 {
            // Other requests are in service, or another worker reads too: no gap to
            // learn from, and nothing to gain from polling.
            return;
        }
        let window = g.rule.window(&s.poll);
        let device = g.device.get().filter(|_| !window.is_zero());
        let idle_at = Instant::now();
        let Some(device) = device else {
            s.idle_since = Some((idle_at, 0));
            return;
        };
        // Poll without the lock: the other workers are parked or serving.
        drop(s);
        let others_wait = g
            .demand
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .others_wait(idle_at);
        if others_wait {
            // Polling would take CPU time from tasks that want it (and on a busy machine
            // the vCPUs do not halt, so a wake-up is cheap there).
            let mut s = g.lock();
            s.polls.held_for_others += 1;
            s.idle_since = Some((idle_at, 0));
            return;
        }
        let polled = poll_for_request(device.as_fd(), window);
        let mut s = g.lock();
        match polled {
            Polled::Ready(after) => {
                s.polls.caught += 1;
                let after_ns = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
                s.poll = g.rule.update(s.poll, Outcome::Caught { after_ns });
                s.idle_since = None;
            }
            Polled::Nothing(spent) => {
                s.polls.missed += 1;
                let spent_ns = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
                s.idle_since = Some((idle_at, spent_ns.max(1)));
            }
            Polled::GaveWay(_) => {
                s.polls.gave_way += 1;
                s.poll = g.rule.update(s.poll, Outcome::Contended);
                // The hold is set; the gap that follows says nothing more.
                s.idle_since = None;
            }
            Polled::Closed => s.idle_since = None,
        }
    }
}

/// The sampler: every [`SAMPLE_EVERY`] while requests come, reads the CPU the last
/// caller ran on (`/proc/<tid>/stat`: may block while that caller execs, which nothing
/// waits for) and the restricted reader's run delay, feeds the rule and publishes its
/// decision; sleeps once the mount is quiet for [`QUIET_GAP`].
fn sampler(g: &Inner) {
    let Some(f) = &g.follow else { return };
    let mut probe = CallerProbe::default();
    let mut state = FollowState::default();
    let mut last = Instant::now();
    let mut quiet_since: Option<Instant> = None;
    // The restricted reader's run delay at the previous sample: (tid, ns, when).
    let mut delay_at: Option<(i32, u64, Instant)> = None;
    let publish = |state: &FollowState, decision: Option<Decision>, delay: Option<u64>| {
        f.target
            .store(state.pinned().map_or(-1, i64::from), Ordering::Relaxed);
        let mut st = f.stats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = decision {
            st.samples += 1;
            st.max_run_delay_milli = st.max_run_delay_milli.max(delay.unwrap_or(0));
            match d {
                Decision::Keep => {}
                Decision::Pin(_) if st.pinned_to.is_some() => st.moves += 1,
                Decision::Pin(_) => st.pins += 1,
                Decision::Release(Why::Spread) => st.released_spread += 1,
                Decision::Release(Why::Load) => st.released_load += 1,
                Decision::Release(Why::Sparse) => st.released_sparse += 1,
            }
        }
        st.pinned_to = state.pinned();
    };
    while !f.closed.load(Ordering::SeqCst) {
        std::thread::sleep(SAMPLE_EVERY);
        let now = Instant::now();
        let requests = f.requests.swap(0, Ordering::Relaxed);
        if requests == 0 {
            let since = *quiet_since.get_or_insert(now);
            if now.saturating_duration_since(since) < QUIET_GAP {
                continue;
            }
            // Idle: nothing followed; sleep until a request starts.
            if state.pinned().is_some() {
                f.stats
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .released_sparse += 1;
            }
            state = FollowRule::idle(state);
            publish(&state, None, None);
            delay_at = None;
            f.asleep.store(true, Ordering::SeqCst);
            while f.asleep.load(Ordering::SeqCst) && !f.closed.load(Ordering::SeqCst) {
                if f.requests.load(Ordering::SeqCst) > 0 {
                    f.asleep.store(false, Ordering::SeqCst);
                    break;
                }
                std::thread::park();
            }
            quiet_since = None;
            last = Instant::now();
            continue;
        }
        quiet_since = None;
        let caller = f.caller.load(Ordering::Relaxed);
        let cpu = probe.cpu_of(caller);
        // The run delay of the worker restricted to the followed CPU (this process's own
        // thread: its /proc never waits on a caller).
        let reader = f.reader.load(Ordering::Relaxed);
        let delay_ns = (reader != 0)
            .then(|| crate::follow::run_delay_ns_of(reader))
            .flatten();
        let run_delay_milli = match (delay_at, delay_ns) {
            (Some((t, d0, at)), Some(d1)) if t == reader => {
                let wall = u64::try_from(now.saturating_duration_since(at).as_nanos())
                    .unwrap_or(u64::MAX)
                    .max(1);
                Some(d1.saturating_sub(d0).saturating_mul(1000) / wall)
            }
            _ => None,
        };
        delay_at = delay_ns.map(|d| (reader, d, now));
        let elapsed_ns =
            u64::try_from(now.saturating_duration_since(last).as_nanos()).unwrap_or(u64::MAX);
        last = now;
        let x = Sample {
            cpu,
            requests,
            elapsed_ns,
            others_wait: false,
            run_delay_milli,
        };
        let (next, decision) = f.rule.update(state, x);
        state = next;
        publish(&state, Some(decision), run_delay_milli);
    }
}

/// Restricts this worker to `cpu` (`None`: the CPUs of the mount), unless it is already.
fn place(g: &Inner, s: &mut State, cpu: Option<u32>) {
    let Some(f) = &g.follow else { return };
    let me = tid();
    let cpu = cpu.filter(|&c| f.all.contains(c));
    let now = s.pinned_cpu(me);
    if now == cpu {
        return;
    }
    let set = match cpu {
        Some(c) => CpuSet::one(c),
        None => Some(f.all),
    };
    let Some(set) = set else { return };
    match set.apply(0) {
        Ok(()) => {
            s.pinned.retain(|&(t, _)| t != me);
            if let Some(c) = cpu {
                s.pinned.push((me, c));
                f.reader.store(me, Ordering::Relaxed);
            } else {
                let _ = f
                    .reader
                    .compare_exchange(me, 0, Ordering::Relaxed, Ordering::Relaxed);
            }
        }
        Err(e) => tracing::debug!(error = %e, ?cpu, "cannot move the reading FUSE worker"),
    }
}

/// Gives worker `t` the CPUs of the mount back, if it is restricted (by the watchdog).
fn unpin_other(g: &Inner, s: &mut State, t: i32) {
    let Some(f) = &g.follow else { return };
    if s.pinned_cpu(t).is_none() {
        return;
    }
    // Forgotten even if the call fails (the thread ended): it re-applies what it needs.
    s.pinned.retain(|&(x, _)| x != t);
    // Only a thread of this process (a worker that ended must not leave its id, maybe
    // reused, to be moved).
    let ours = std::path::Path::new(&format!("/proc/self/task/{t}")).exists();
    if ours && f.all.apply(t).is_ok() {
        s.unpinned_by_watchdog += 1;
    }
    let _ = f
        .reader
        .compare_exchange(t, 0, Ordering::Relaxed, Ordering::Relaxed);
}

/// Hands a parked worker back to the kernel when nobody reads and a request is stuck.
fn watchdog(g: &Inner) {
    let mut idle = 0u32;
    let mut s = g.lock();
    loop {
        if s.closing {
            return;
        }
        if idle >= IDLE_CHECKS {
            // Nothing served for a while: the reader gives its CPU back, and the watchdog
            // sleeps until the next request.
            let tids: Vec<i32> = s.pinned.iter().map(|&(t, _)| t).collect();
            for t in tids {
                unpin_other(g, &mut s, t);
            }
            s.watchdog_asleep = true;
            while s.watchdog_asleep && !s.closing {
                s = g.watchdog.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            idle = 0;
            continue;
        }
        s = g
            .watchdog
            .wait_timeout(s, STALL)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        if s.busy.is_empty() {
            idle += 1;
            continue;
        }
        idle = 0;
        let stuck = s.busy.iter().any(|(_, at, _)| at.elapsed() >= STALL);
        if stuck && !s.pinned.is_empty() {
            // A long request is not served on a CPU chosen for short ones.
            let long: Vec<i32> = s
                .busy
                .iter()
                .filter(|(_, at, _)| at.elapsed() >= STALL)
                .map(|&(_, _, t)| t)
                .collect();
            for t in long {
                unpin_other(g, &mut s, t);
            }
        }
        if stuck && s.readers + s.released == 0 && s.parked > s.released {
            s.released += 1;
            s.stall_releases += 1;
            g.parked.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Workers of a fake session: each loops "read a request (take one from the queue),
    /// serve it under the gate". Requests are closures.
    type Job = Box<dyn FnOnce() + Send>;

    struct Fake {
        gate: WorkerGate,
        queue: Arc<(Mutex<std::collections::VecDeque<Job>>, Condvar)>,
        workers: Vec<std::thread::JoinHandle<()>>,
        done: Arc<AtomicUsize>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Fake {
        fn new(threads: usize) -> Fake {
            Fake::with_gate(threads, WorkerGate::new(threads))
        }

        fn with_gate(threads: usize, gate: WorkerGate) -> Fake {
            let queue: Arc<(Mutex<std::collections::VecDeque<Job>>, Condvar)> =
                Arc::new((Mutex::new(Default::default()), Condvar::new()));
            let done = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let workers = (0..threads)
                .map(|_| {
                    let (gate, queue, done, stop) =
                        (gate.clone(), queue.clone(), done.clone(), stop.clone());
                    std::thread::spawn(move || {
                        loop {
                            let job = {
                                let mut q = queue.0.lock().unwrap();
                                loop {
                                    if let Some(j) = q.pop_front() {
                                        break j;
                                    }
                                    if stop.load(Ordering::SeqCst) {
                                        return;
                                    }
                                    q = queue.1.wait(q).unwrap();
                                }
                            };
                            let _serving = gate.serve();
                            job();
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            Fake {
                gate,
                queue,
                workers,
                done,
                stop,
            }
        }

        fn submit(&self, job: impl FnOnce() + Send + 'static) {
            self.queue.0.lock().unwrap().push_back(Box::new(job));
            self.queue.1.notify_one();
        }

        /// Serves `n` empty requests one after the other (the others' workers stand by).
        fn serial(&self, n: usize) {
            for _ in 0..n {
                let next = self.done.load(Ordering::SeqCst) + 1;
                self.submit(|| {});
                assert!(self.wait_done(next, Duration::from_secs(5)));
            }
        }

        fn wait_done(&self, n: usize, within: Duration) -> bool {
            let end = Instant::now() + within;
            let mut spins = 0u32;
            while self.done.load(Ordering::SeqCst) < n {
                if Instant::now() > end {
                    return false;
                }
                // Yield first, as a burst's caller comes back at once (a 1 ms sleep, longer
                // on a loaded machine, made the gaps exceed what the poll rule calls a
                // burst); sleep only if the request takes longer.
                if spins < 10_000 {
                    spins += 1;
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            true
        }

        fn finish(self) {
            self.gate.close();
            self.stop.store(true, Ordering::SeqCst);
            self.queue.1.notify_all();
            for w in self.workers {
                w.join().unwrap();
            }
        }
    }

    /// Serial requests leave all workers but one parked.
    #[test]
    fn idle_workers_stand_by() {
        let f = Fake::new(4);
        // Parked workers go back to reading after PARK_TIMEOUT: on a machine too loaded
        // to serve the requests within it, the count is checked after another round.
        for round in 0.. {
            let t = Instant::now();
            f.serial(50);
            // The last worker to finish went back to reading; the others wait here.
            let end = Instant::now() + Duration::from_secs(5);
            while f.gate.stats().0 != 3 && Instant::now() < end && t.elapsed() < PARK_TIMEOUT {
                std::thread::sleep(Duration::from_millis(1));
            }
            let parked = f.gate.stats().0;
            if parked == 3 {
                break;
            }
            assert!(
                t.elapsed() >= PARK_TIMEOUT && round < 5,
                "{parked} of 4 workers parked after serial requests (expected 3)"
            );
        }
        f.finish();
    }

    /// A request that blocks until a later one has run (a FIFO open waiting for its peer)
    /// completes: the watchdog hands a parked worker back to read the later request.
    #[test]
    fn a_stuck_request_does_not_hold_up_the_next() {
        let f = Fake::new(3);
        let t = Instant::now();
        f.serial(10);
        let peer = Arc::new((Mutex::new(false), Condvar::new()));
        let p = peer.clone();
        f.submit(move || {
            let mut opened = p.0.lock().unwrap();
            let end = Instant::now() + Duration::from_secs(10);
            while !*opened && Instant::now() < end {
                opened =
                    p.1.wait_timeout(opened, Duration::from_millis(10))
                        .unwrap()
                        .0;
            }
            assert!(*opened, "the peer request was never served");
        });
        let p = peer.clone();
        f.submit(move || {
            *p.0.lock().unwrap() = true;
            p.1.notify_all();
        });
        assert!(f.wait_done(12, Duration::from_secs(5)));
        // Parked workers also read again by themselves after PARK_TIMEOUT: only a
        // machine too loaded to get here within it may see no release by the watchdog.
        assert!(
            f.gate.stats().1 >= 1 || t.elapsed() >= PARK_TIMEOUT,
            "the watchdog released no worker"
        );
        f.finish();
    }

    /// Closing sends parked workers back at once.
    #[test]
    fn close_releases_parked_workers() {
        let f = Fake::new(4);
        f.serial(20);
        let t = Instant::now();
        f.finish();
        assert!(
            t.elapsed() < PARK_TIMEOUT,
            "parked workers waited for their timeout"
        );
    }

    /// A gate that polls a pipe holding a byte (every poll sees a request at once) and
    /// reads the machine's runnable tasks from `loadavg` text of the test's own.
    fn polling_fake(dir: &std::path::Path, loadavg: &str) -> (Fake, std::io::PipeWriter) {
        use std::io::Write;
        let file = dir.join("loadavg");
        std::fs::write(&file, loadavg).unwrap();
        let busy_poll = BusyPoll {
            max: Duration::from_millis(1),
            under_load: false,
        };
        let gate = WorkerGate::with_demand(
            4,
            busy_poll,
            FollowCaller::OFF,
            MachineDemand::sampling(Some(&file)),
        );
        let (rx, mut tx) = std::io::pipe().unwrap();
        tx.write_all(b"x").unwrap();
        gate.attach_device(&rx).unwrap();
        (Fake::with_gate(4, gate), tx)
    }

    /// Serial requests with no other task runnable (the sample shows one: the poller) are
    /// polled for; the same requests with tasks waiting for every CPU are not.
    #[test]
    fn polls_unless_tasks_wait_for_a_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let (f, _tx) = polling_fake(dir.path(), "0.10 0.20 0.30 1/100 4242\n");
        f.serial(200);
        let p = f.gate.poll_stats();
        assert!(
            p.caught > 0,
            "an idle machine's burst was not polled for: {p:?}"
        );
        assert_eq!(p.held_for_others, 0, "{p:?}");
        f.finish();

        let (f, _tx) = polling_fake(dir.path(), "9.00 9.00 9.00 1000/2000 4242\n");
        f.serial(200);
        let p = f.gate.poll_stats();
        assert_eq!(
            p.started(),
            0,
            "polled while tasks waited for every CPU: {p:?}"
        );
        assert!(
            p.held_for_others > 0,
            "the rule never wanted to poll: {p:?}"
        );
        f.finish();
    }

    #[test]
    fn one_worker_needs_no_gate() {
        let g = WorkerGate::new(1);
        let s = g.serve();
        drop(s);
        assert_eq!(g.stats(), (0, 0));
    }
}
