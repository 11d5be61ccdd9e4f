//! Device service-time models (HDD, SSD, NVM, network link) shared by the simulator and the
//! store's tier emulation.
//!
//! Every model is pure: no I/O, no clock, no threads. The caller passes the time a request
//! arrives ([`Nanos`], any epoch, non-decreasing) and gets back when the device starts and
//! finishes it. Queue state lives inside the model, so the simulator advances its virtual
//! clock to [`Completion::finish`] and the store sleeps until it.
//!
//! Each model keeps iostat-style counters ([`IoCounters`]); an [`Iostat`] sampler turns two
//! snapshots into `%util`, iops, `svctm` and `await` exactly as `iostat -x` computes them
//! (busy time / interval, busy time / completed IOs).
//!
//! Defaults are documented on each parameter struct; [`DeviceSpec`] parses the short forms
//! used on command lines and in configuration (`hdd`, `ssd:read_us=90`, `link:rtt_ms=20`).

mod counters;
mod hdd;
mod parallel;
mod spec;

pub use counters::{IoCounters, Iostat, IostatSample};
pub use hdd::{HddModel, HddParams, RotationModel};
pub use parallel::{LinkParams, ParallelModel, ParallelParams, isolated_latency_ms};
pub use spec::{DeviceSpec, SpecError};

/// Nanoseconds since the caller's epoch (the same unit as `kaiso_policy::Nanos`).
pub type Nanos = u64;

pub const MICROSECOND: Nanos = 1_000;
pub const MILLISECOND: Nanos = 1_000_000;
pub const SECOND: Nanos = 1_000_000_000;

/// Direction of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IoOp {
    Read,
    Write,
}

/// When a request was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// When the request arrived (the `now` passed in, after clamping to monotonic time).
    pub arrival: Nanos,
    /// When the device began serving it (after any queueing).
    pub start: Nanos,
    /// When it completed.
    pub finish: Nanos,
}

impl Completion {
    /// Time the device spent on this request alone (`svctm` contribution).
    pub fn service(&self) -> Nanos {
        self.finish - self.start
    }
    /// Queueing plus service: what the caller waits (`await` contribution).
    pub fn response(&self) -> Nanos {
        self.finish - self.arrival
    }
}

/// A device's service-time model. `now` must not go backwards between calls; a model
/// treats an earlier `now` as equal to the latest one it has seen.
pub trait DeviceModel: Send {
    /// Short name for reports ("hdd", "ssd", "nvm", "link").
    fn kind(&self) -> &'static str;
    /// Submit one request of `len` bytes at byte `offset`; returns when it is served.
    fn service(&mut self, now: Nanos, offset: u64, len: u64, op: IoOp) -> Completion;
    /// Cumulative iostat counters as of `now` (only requests completed by `now` count).
    fn counters(&mut self, now: Nanos) -> IoCounters;
    /// When every request submitted so far will have completed.
    fn idle_at(&self) -> Nanos;
}

/// Length in nanoseconds of moving `bytes` at `bytes_per_sec`, rounded up.
pub(crate) fn transfer_ns(bytes: u64, bytes_per_sec: f64) -> Nanos {
    if bytes == 0 || bytes_per_sec <= 0.0 {
        return 0;
    }
    ((bytes as f64) * 1e9 / bytes_per_sec).ceil() as Nanos
}
