//! Constant-memory statistics: a log-bucketed latency histogram (≈1.5% resolution) good
//! for mean and percentiles over billions of samples.

use serde::Serialize;

/// Sub-buckets per power of two: relative error about 1/SUB.
const SUB: u64 = 64;
const BUCKETS: usize = 64 * SUB as usize;

#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    max: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            counts: vec![0; BUCKETS],
            n: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn bucket(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros() as u64; // ≥ 6
    let shift = exp - 6;
    let mant = (v >> shift) - SUB; // 0..SUB
    ((shift + 1) * SUB + mant) as usize
}

fn bucket_low(b: usize) -> u64 {
    let b = b as u64;
    if b < SUB {
        return b;
    }
    let shift = b / SUB - 1;
    let mant = b % SUB;
    (SUB + mant) << shift
}

/// Summary figures in milliseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl LatencyHistogram {
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.counts[bucket(ns).min(BUCKETS - 1)] += 1;
        self.n += 1;
        self.sum += ns as u128;
        self.max = self.max.max(ns);
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    pub fn mean_ns(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// The `q`-quantile (0..=1), as the lower edge of its bucket.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let target = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut acc = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            acc += c;
            if acc >= target {
                return bucket_low(b).min(self.max);
            }
        }
        self.max
    }

    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }

    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.n,
            mean_ms: self.mean_ns() / 1e6,
            p50_ms: self.quantile_ns(0.5) as f64 / 1e6,
            p99_ms: self.quantile_ns(0.99) as f64 / 1e6,
            max_ms: self.max as f64 / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_within_resolution() {
        let mut h = LatencyHistogram::default();
        for v in 1..=100_000u64 {
            h.record(v * 1000);
        }
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p99 / 99_000_000.0 - 1.0).abs() < 0.02, "{p99}");
        let p50 = h.quantile_ns(0.5) as f64;
        assert!((p50 / 50_000_000.0 - 1.0).abs() < 0.02, "{p50}");
        assert!((h.mean_ns() - 50_000_500.0).abs() < 1.0);
        for v in [0u64, 1, 63, 64, 65, 1000, u64::MAX / 2] {
            assert!(bucket_low(bucket(v)) <= v);
        }
    }
}
