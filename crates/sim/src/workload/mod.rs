//! Seeded, reproducible workload generators. Each yields [`IoRecord`]s in time order as an
//! iterator, so a week-long trace costs no more memory than a minute of it.
//!
//! - [`volume`]: MSR-like block volumes with spikes and short spikes (002 notes §4.2/§6.3).
//! - [`tpcxv`]: a TPCx-V-like multi-VM workload with a guest-file layout map (ch.3).
//! - [`files`]: Zipf file workloads with scans.

pub mod files;
pub mod tpcxv;
pub mod volume;

use crate::trace::IoRecord;
use std::iter::Peekable;

/// Merge time-ordered streams into one time-ordered stream (ties: earlier stream first).
pub struct Merge<I: Iterator<Item = IoRecord>> {
    streams: Vec<Peekable<I>>,
}

impl<I: Iterator<Item = IoRecord>> Merge<I> {
    pub fn new(streams: impl IntoIterator<Item = I>) -> Self {
        Merge {
            streams: streams.into_iter().map(Iterator::peekable).collect(),
        }
    }
}

impl<I: Iterator<Item = IoRecord>> Iterator for Merge<I> {
    type Item = IoRecord;

    fn next(&mut self) -> Option<IoRecord> {
        let mut best: Option<(usize, u64)> = None;
        for (i, s) in self.streams.iter_mut().enumerate() {
            if let Some(r) = s.peek()
                && best.is_none_or(|(_, t)| r.time < t)
            {
                best = Some((i, r.time));
            }
        }
        best.and_then(|(i, _)| self.streams[i].next())
    }
}

/// Divide every timestamp by `factor` (a replay speed-up, as `btreplay -x`).
pub fn speed_up(
    records: impl Iterator<Item = IoRecord>,
    factor: f64,
) -> impl Iterator<Item = IoRecord> {
    let f = if factor > 0.0 { factor } else { 1.0 };
    records.map(move |mut r| {
        r.time = (r.time as f64 / f) as u64;
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kaiso_policy::Op;

    #[test]
    fn merge_keeps_time_order() {
        let a = vec![1u64, 5, 9]
            .into_iter()
            .map(|t| IoRecord::new(t, 0, 0, 1, Op::Read));
        let b = vec![2u64, 3, 10]
            .into_iter()
            .map(|t| IoRecord::new(t, 1, 0, 1, Op::Read));
        let a: Vec<_> = a.collect();
        let b: Vec<_> = b.collect();
        let m: Vec<u64> = Merge::new([a.into_iter(), b.into_iter()])
            .map(|r| r.time)
            .collect();
        assert_eq!(m, vec![1, 2, 3, 5, 9, 10]);
    }
}
