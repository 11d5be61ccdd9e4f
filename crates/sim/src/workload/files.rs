//! Zipf file workloads with scans: `files` files with log-uniform sizes, requests to files
//! drawn Zipf(`zipf`), each reading (or writing) a random `io_bytes` range; with
//! probability `scan_probability` a request instead starts a scan that reads `scan_files`
//! consecutive files from a cold range in full, the pattern that flushes LRU caches.

use crate::rng::{Rng, Zipf};
use crate::trace::IoRecord;
use kaiso_policy::Op;
use kaiso_policy::time::SECOND;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FileWorkloadSpec {
    pub files: u64,
    pub min_file_bytes: u64,
    pub max_file_bytes: u64,
    pub zipf: f64,
    pub requests: u64,
    pub io_bytes: u64,
    pub write_fraction: f64,
    pub scan_probability: f64,
    pub scan_files: u64,
    /// Requests per second (timestamps).
    pub rate: f64,
}

impl Default for FileWorkloadSpec {
    fn default() -> Self {
        FileWorkloadSpec {
            files: 100_000,
            min_file_bytes: 4096,
            max_file_bytes: 64 << 20,
            zipf: 0.9,
            requests: 1_000_000,
            io_bytes: 65536,
            write_fraction: 0.2,
            scan_probability: 0.0005,
            scan_files: 200,
            rate: 10_000.0,
        }
    }
}

impl FileWorkloadSpec {
    /// Size of file `id` (deterministic in the seed).
    fn sizes(&self, rng: &mut Rng) -> Vec<u64> {
        let lo = (self.min_file_bytes.max(1) as f64).ln();
        let hi = (self.max_file_bytes.max(self.min_file_bytes).max(1) as f64).ln();
        (0..self.files.max(1))
            .map(|_| (lo + rng.f64() * (hi - lo)).exp() as u64)
            .collect()
    }

    /// The size of every file of the workload generated with `seed` (index = file id).
    pub fn file_sizes(&self, seed: u64) -> Vec<u64> {
        self.sizes(&mut Rng::new(seed))
    }

    /// The requests, in time order; object = file id, offset/len inside the file.
    pub fn generate(&self, seed: u64) -> impl Iterator<Item = IoRecord> + Send + use<> {
        let mut rng = Rng::new(seed);
        let sizes = self.sizes(&mut rng);
        let zipf = Zipf::new(self.files.max(1), self.zipf);
        // Popularity rank → file id, scattered so that scans (consecutive ids) are cold.
        let nfiles = sizes.len() as u64;
        let mut mul = (0x9E37_79B9u64 % nfiles) | 1;
        while gcd(mul, nfiles) != 1 {
            mul += 2;
        }
        let spec = self.clone();
        let gap = (SECOND as f64 / spec.rate.max(1e-9)) as u64;
        let mut n = 0u64;
        let mut scan: Option<(u64, u64, u64)> = None; // (file, offset, files left)
        std::iter::from_fn(move || {
            if n >= spec.requests {
                return None;
            }
            let time = n * gap;
            n += 1;
            if let Some((file, off, left)) = scan {
                let size = sizes[file as usize];
                let len = spec.io_bytes.min(size - off).max(1);
                let next_off = off + len;
                scan = if next_off < size {
                    Some((file, next_off, left))
                } else if left > 1 {
                    Some(((file + 1) % nfiles, 0, left - 1))
                } else {
                    None
                };
                return Some(IoRecord::new(time, file, off, len, Op::Read));
            }
            if rng.chance(spec.scan_probability) {
                let file = rng.below(nfiles);
                scan = Some((file, 0, spec.scan_files.max(1)));
                let size = sizes[file as usize];
                let len = spec.io_bytes.min(size).max(1);
                scan = if len < size {
                    Some((file, len, spec.scan_files.max(1)))
                } else if spec.scan_files > 1 {
                    Some(((file + 1) % nfiles, 0, spec.scan_files - 1))
                } else {
                    None
                };
                return Some(IoRecord::new(time, file, 0, len, Op::Read));
            }
            let rank = zipf.sample(&mut rng);
            let file = (rank as u128 * mul as u128 % nfiles as u128) as u64;
            let size = sizes[file as usize];
            let len = spec.io_bytes.min(size).max(1);
            let off = rng.below((size - len) / 4096 + 1) * 4096;
            let op = if rng.chance(spec.write_fraction) {
                Op::Write
            } else {
                Op::Read
            };
            Some(IoRecord::new(time, file, off.min(size - len), len, op))
        })
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reproducible_skewed_with_scans() {
        let spec = FileWorkloadSpec {
            files: 1000,
            requests: 50_000,
            scan_probability: 0.001,
            ..Default::default()
        };
        let a: Vec<IoRecord> = spec.generate(5).collect();
        assert_eq!(a, spec.generate(5).collect::<Vec<_>>());
        assert_eq!(a.len(), 50_000);
        let mut counts = std::collections::HashMap::<u64, u64>::new();
        for r in &a {
            *counts.entry(r.object).or_default() += 1;
        }
        let mut c: Vec<u64> = counts.values().copied().collect();
        c.sort_unstable_by(|x, y| y.cmp(x));
        assert!(c[0] > 20 * c[c.len() / 2], "skewed");
        // Scans produce runs of offset-0 reads on consecutive file ids.
        let runs = a
            .windows(2)
            .filter(|w| w[1].object == w[0].object + 1 && w[1].offset == 0 && w[1].op == Op::Read)
            .count();
        assert!(runs > 100, "{runs}");
    }
}
