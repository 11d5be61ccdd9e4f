//! Devices without a moving arm: SSD, NVM and network links. A request waits for one of
//! `slots` internal units (flash channels, outstanding-request window), pays a fixed
//! latency there, then moves its bytes through one shared bandwidth pipe. So small
//! requests overlap up to `slots` deep, and large ones are limited by aggregate bandwidth.
//! Service time does not depend on the offset.

use crate::counters::Accounting;
use crate::{
    Completion, DeviceModel, IoCounters, IoOp, MICROSECOND, MILLISECOND, Nanos, transfer_ns,
};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Parameters of a parallel device. [`Default`] is a SATA-class SSD.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ParallelParams {
    /// Requests served concurrently; 0 means unlimited. SSD default 8.
    pub slots: u32,
    /// Fixed latency of a read before data moves, µs. SSD default 90.
    pub read_latency_us: f64,
    /// Fixed latency of a write (into the device's buffer), µs. SSD default 40.
    pub write_latency_us: f64,
    /// Aggregate read bandwidth, MB/s (10^6 B/s). SSD default 520.
    pub read_mb_per_sec: f64,
    /// Aggregate write bandwidth, MB/s. SSD default 480.
    pub write_mb_per_sec: f64,
}

impl Default for ParallelParams {
    fn default() -> Self {
        Self::ssd()
    }
}

impl ParallelParams {
    /// A SATA-class flash SSD (Intel X25-E era and later: ~90 µs reads, ~500 MB/s).
    pub fn ssd() -> Self {
        ParallelParams {
            slots: 8,
            read_latency_us: 90.0,
            write_latency_us: 40.0,
            read_mb_per_sec: 520.0,
            write_mb_per_sec: 480.0,
        }
    }

    /// Byte-addressable persistent memory / DRAM-backed tier (Optane-DC-like figures).
    pub fn nvm() -> Self {
        ParallelParams {
            slots: 16,
            read_latency_us: 0.3,
            write_latency_us: 0.1,
            read_mb_per_sec: 6000.0,
            write_mb_per_sec: 2000.0,
        }
    }
}

/// A network link to a remote tier: round trip plus server time, then bytes at the
/// link's bandwidth. Defaults: 1 ms RTT, 1 GbE (117 MB/s of payload), no server time,
/// unlimited outstanding requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinkParams {
    pub rtt_ms: f64,
    pub mb_per_sec: f64,
    /// Server-side time per request, µs.
    pub server_us: f64,
    /// Outstanding requests allowed; 0 = unlimited.
    pub window: u32,
}

impl Default for LinkParams {
    fn default() -> Self {
        LinkParams {
            rtt_ms: 1.0,
            mb_per_sec: 117.0,
            server_us: 0.0,
            window: 0,
        }
    }
}

impl LinkParams {
    pub fn to_parallel(&self) -> ParallelParams {
        let latency = self.rtt_ms * 1000.0 + self.server_us;
        ParallelParams {
            slots: self.window,
            read_latency_us: latency,
            write_latency_us: latency,
            read_mb_per_sec: self.mb_per_sec,
            write_mb_per_sec: self.mb_per_sec,
        }
    }
}

/// The model for SSD, NVM and links.
#[derive(Clone, Debug)]
pub struct ParallelModel {
    kind: &'static str,
    params: ParallelParams,
    /// Finish times of busy slots (at most `slots` entries).
    slots: BinaryHeap<Reverse<Nanos>>,
    /// When the shared bandwidth pipe is next free.
    pipe_free: Nanos,
    acct: Accounting,
}

impl ParallelModel {
    pub fn new(kind: &'static str, params: ParallelParams) -> Self {
        ParallelModel {
            kind,
            params,
            slots: BinaryHeap::new(),
            pipe_free: 0,
            acct: Accounting::default(),
        }
    }
    pub fn ssd(params: ParallelParams) -> Self {
        Self::new("ssd", params)
    }
    pub fn nvm(params: ParallelParams) -> Self {
        Self::new("nvm", params)
    }
    pub fn link(params: &LinkParams) -> Self {
        Self::new("link", params.to_parallel())
    }
    pub fn params(&self) -> &ParallelParams {
        &self.params
    }
}

impl DeviceModel for ParallelModel {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn service(&mut self, now: Nanos, _offset: u64, len: u64, op: IoOp) -> Completion {
        let arrival = self.acct.arrive(now);
        let limit = self.params.slots as usize;
        // Free every slot done by the time this request arrives; wait for one if all busy.
        while let Some(&Reverse(f)) = self.slots.peek() {
            if f > arrival {
                break;
            }
            self.slots.pop();
        }
        let start = if limit > 0 && self.slots.len() >= limit {
            let Reverse(f) = self.slots.pop().unwrap_or(Reverse(arrival));
            f.max(arrival)
        } else {
            arrival
        };
        let (lat_us, mbps) = match op {
            IoOp::Read => (self.params.read_latency_us, self.params.read_mb_per_sec),
            IoOp::Write => (self.params.write_latency_us, self.params.write_mb_per_sec),
        };
        let ready = start + (lat_us * MICROSECOND as f64) as Nanos;
        let xfer = transfer_ns(len, mbps * 1e6);
        let finish = if xfer == 0 {
            ready
        } else {
            let begin = ready.max(self.pipe_free);
            self.pipe_free = begin + xfer;
            begin + xfer
        };
        if limit > 0 {
            self.slots.push(Reverse(finish));
        }
        let c = Completion {
            arrival,
            start,
            finish,
        };
        self.acct.submit(c, len, op);
        c
    }

    fn counters(&mut self, now: Nanos) -> IoCounters {
        self.acct.counters(now)
    }

    fn idle_at(&self) -> Nanos {
        self.acct.idle_at()
    }
}

/// One isolated request's latency in ms (after the device has drained): for calibration.
pub fn isolated_latency_ms(model: &mut dyn DeviceModel, len: u64, op: IoOp) -> f64 {
    let t = model.idle_at() + MILLISECOND;
    model.service(t, 0, len, op).response() as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SECOND;

    #[test]
    fn small_reads_overlap_up_to_slots() {
        let mut d = ParallelModel::ssd(ParallelParams::ssd());
        let cs: Vec<_> = (0..16)
            .map(|i| d.service(0, i * 4096, 4096, IoOp::Read))
            .collect();
        // The first 8 start at once; the 9th waits for a slot.
        assert!(cs[..8].iter().all(|c| c.start == 0));
        assert!(cs[8].start > 0);
        let lat = cs[0].response() as f64 / 1e3;
        assert!(lat > 90.0 && lat < 110.0, "{lat} µs");
    }

    #[test]
    fn large_transfers_are_bandwidth_bound() {
        let mut d = ParallelModel::ssd(ParallelParams::ssd());
        let mut last = 0;
        for i in 0..100 {
            last = d.service(0, i << 20, 1 << 20, IoOp::Read).finish;
        }
        // 100 MiB at 520 MB/s ≈ 0.2 s regardless of the 8 slots.
        let secs = last as f64 / SECOND as f64;
        assert!(secs > 0.19 && secs < 0.215, "{secs}");
    }

    #[test]
    fn link_pays_rtt_and_bandwidth() {
        let mut l = ParallelModel::link(&LinkParams {
            rtt_ms: 20.0,
            mb_per_sec: 10.0,
            ..LinkParams::default()
        });
        let small = isolated_latency_ms(&mut l, 100, IoOp::Read);
        assert!((small - 20.0).abs() < 0.1, "{small}");
        let big = isolated_latency_ms(&mut l, 1_000_000, IoOp::Read);
        assert!((big - 120.0).abs() < 0.1, "{big}");
        assert_eq!(l.kind(), "link");
    }

    #[test]
    fn nvm_is_orders_faster_than_ssd() {
        let mut n = ParallelModel::nvm(ParallelParams::nvm());
        let mut s = ParallelModel::ssd(ParallelParams::ssd());
        let a = isolated_latency_ms(&mut n, 4096, IoOp::Read);
        let b = isolated_latency_ms(&mut s, 4096, IoOp::Read);
        assert!(a * 20.0 < b, "nvm {a} ssd {b}");
    }
}
