//! MSR-like block volumes with spikes, after the 002 notes (Tables 2, 3 and 6).
//!
//! A volume is a sum of load components, each a Poisson stream of requests over a region:
//! - background: the whole volume, Zipf-skewed over 1 MiB extents placed at random;
//! - spike: one region (0.1–34 GB in the paper) whose rate ramps up, holds, and ramps
//!   down (duration 10–200 min);
//! - short spikes: small regions inside a zone that light up for less than ~3 minutes
//!   each and then move elsewhere, `concurrent` at a time.
//!
//! Rates are in requests/s of the original trace; `kaiso sim` applies a speed-up as the
//! paper's `btreplay -x` did. Request sizes follow an MSR-like mix (4–64 KiB, 4 KiB aligned).

use crate::rng::{Rng, Zipf};
use crate::trace::IoRecord;
use crate::workload::Merge;
use kaiso_policy::Op;
use kaiso_policy::time::SECOND;
use serde::{Deserialize, Serialize};

const GB: u64 = 1_000_000_000;
const EXTENT: u64 = 1 << 20;
const ALIGN: u64 = 4096;
/// Generation step: arrivals of one step are drawn together and sorted.
const STEP: u64 = SECOND / 10;

/// One load component.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Component {
    Background {
        iops: f64,
        /// Zipf exponent over the volume's extents (0 = uniform).
        zipf: f64,
    },
    Spike {
        offset: u64,
        len: u64,
        /// Seconds from the trace start.
        start_s: f64,
        ramp_s: f64,
        hold_s: f64,
        peak_iops: f64,
    },
    ShortSpikes {
        zone_offset: u64,
        zone_len: u64,
        iops: f64,
        /// Simultaneously active short spikes.
        concurrent: u32,
        min_len: u64,
        max_len: u64,
        min_s: f64,
        max_s: f64,
    },
}

/// A generated volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeSpec {
    pub name: String,
    pub capacity: u64,
    pub duration_s: f64,
    /// Fraction of requests that are reads.
    pub read_fraction: f64,
    pub components: Vec<Component>,
    /// Disk number written into each record.
    pub disk: u64,
}

impl VolumeSpec {
    /// The four volumes of the 002 evaluation, shaped after Tables 2, 3 and 6 (capacity,
    /// peak rate, share of IO on the hottest 1%/10%, spike-area sizes, short-spike load),
    /// one hour long. Spikes ramp up over 1–2 minutes and then last as long as the trace
    /// (the paper replayed windows of concentrated load lasting hours). `None` for an unknown name. See docs/reproduction/002-spike.md.
    pub fn preset(name: &str) -> Option<VolumeSpec> {
        let spike = |off_gb: f64, len_gb: f64, iops: f64| Component::Spike {
            offset: (off_gb * GB as f64) as u64,
            len: (len_gb * GB as f64) as u64,
            start_s: 0.0,
            ramp_s: 120.0,
            hold_s: 1e7,
            peak_iops: iops,
        };
        let short = |zone_off_gb: f64, zone_gb: f64, iops: f64| Component::ShortSpikes {
            zone_offset: (zone_off_gb * GB as f64) as u64,
            zone_len: (zone_gb * GB as f64) as u64,
            iops,
            concurrent: 4,
            min_len: GB / 10,
            max_len: GB,
            min_s: 30.0,
            max_s: 180.0,
        };
        let v = |name: &str, cap_gb: u64, read: f64, components: Vec<Component>| VolumeSpec {
            name: name.to_string(),
            capacity: cap_gb * GB,
            duration_s: 3600.0,
            read_fraction: read,
            components,
            disk: 0,
        };
        Some(match name {
            // usr_1: narrow spikes (mean 0.4 GB, max 1.0), 95% of IO on the hottest 1%.
            "usr1" => v(
                "usr1",
                600,
                0.91,
                vec![
                    Component::Background {
                        iops: 12.0,
                        zipf: 0.6,
                    },
                    spike(41.0, 1.0, 80.0),
                    spike(130.0, 0.6, 50.0),
                    spike(207.0, 0.4, 40.0),
                    spike(355.0, 0.3, 25.0),
                    spike(480.0, 0.2, 15.0),
                    spike(533.0, 0.1, 15.0),
                ],
            ),
            // web_2: wide spikes (mean 11.9 GB, max 34.3), only 8% on the hottest 1%.
            "web2" => v(
                "web2",
                170,
                0.85,
                vec![
                    Component::Background {
                        iops: 60.0,
                        zipf: 0.3,
                    },
                    spike(20.0, 34.3, 70.0),
                    spike(80.0, 12.0, 80.0),
                    spike(120.0, 1.0, 8.0),
                    spike(150.0, 0.3, 8.0),
                ],
            ),
            // proj_2: short-spike heavy; a few small spikes; 17% / 75% on hottest 1% / 10%.
            "proj2" => v(
                "proj2",
                600,
                0.88,
                vec![
                    Component::Background {
                        iops: 450.0,
                        zipf: 0.6,
                    },
                    short(100.0, 100.0, 450.0),
                    spike(300.0, 1.0, 40.0),
                    spike(420.0, 0.3, 30.0),
                    spike(520.0, 0.2, 20.0),
                ],
            ),
            // proj_4: one 4 GB spike region plus a 187 GB short-spike region.
            "proj4" => v("proj4", 236, 0.90, proj4_parts(true, true)),
            "proj4-spike" => v("proj4-spike", 236, 0.90, proj4_parts(true, false)),
            "proj4-short" => v("proj4-short", 236, 0.90, proj4_parts(false, true)),
            _ => return None,
        })
    }

    /// The records, in time order.
    pub fn generate(&self, seed: u64) -> impl Iterator<Item = IoRecord> + Send + use<> {
        let mut root = Rng::new(seed);
        let end = (self.duration_s * SECOND as f64) as u64;
        let streams: Vec<ComponentStream> = self
            .components
            .iter()
            .enumerate()
            .map(|(i, c)| ComponentStream::new(self, c.clone(), root.fork(i as u64), end))
            .collect();
        Merge::new(streams)
    }
}

fn proj4_parts(spike: bool, short: bool) -> Vec<Component> {
    let mut v = Vec::new();
    if spike {
        v.push(Component::Spike {
            offset: 12 * GB,
            len: 4 * GB,
            start_s: 0.0,
            ramp_s: 60.0,
            hold_s: 1e7,
            peak_iops: 330.0,
        });
    }
    if short {
        v.push(Component::ShortSpikes {
            zone_offset: 40 * GB,
            zone_len: 187 * GB,
            iops: 260.0,
            concurrent: 6,
            min_len: GB / 10,
            max_len: GB,
            min_s: 20.0,
            max_s: 180.0,
        });
    }
    v
}

/// An MSR-like request size: 4–64 KiB.
fn request_size(rng: &mut Rng) -> u64 {
    match rng.below(100) {
        0..=39 => 4096,
        40..=59 => 8192,
        60..=69 => 16384,
        70..=79 => 32768,
        _ => 65536,
    }
}

struct ActiveShort {
    offset: u64,
    len: u64,
    until: u64,
}

/// One component's requests, generated step by step.
struct ComponentStream {
    comp: Component,
    capacity: u64,
    read_fraction: f64,
    disk: u64,
    rng: Rng,
    end: u64,
    step_start: u64,
    pending: std::vec::IntoIter<IoRecord>,
    /// Background: Zipf over extents, and a random placement of extent ranks.
    zipf: Option<Zipf>,
    extent_perm_mul: u64,
    extents: u64,
    shorts: Vec<ActiveShort>,
}

impl ComponentStream {
    fn new(v: &VolumeSpec, comp: Component, rng: Rng, end: u64) -> Self {
        let extents = (v.capacity / EXTENT).max(1);
        let zipf = match &comp {
            Component::Background { zipf, .. } => Some(Zipf::new(extents.min(1 << 20), *zipf)),
            _ => None,
        };
        // An odd multiplier coprime with the extent count scatters ranks over the disk.
        let mut mul = (0x9E37_79B9_7F4A_7C15u64 % extents) | 1;
        while gcd(mul, extents) != 1 {
            mul += 2;
        }
        ComponentStream {
            comp,
            capacity: v.capacity,
            read_fraction: v.read_fraction,
            disk: v.disk,
            rng,
            end,
            step_start: 0,
            pending: Vec::new().into_iter(),
            zipf,
            extent_perm_mul: mul,
            extents,
            shorts: Vec::new(),
        }
    }

    fn rate(&self, t: u64) -> f64 {
        let s = t as f64 / SECOND as f64;
        match &self.comp {
            Component::Background { iops, .. } => *iops,
            Component::Spike {
                start_s,
                ramp_s,
                hold_s,
                peak_iops,
                ..
            } => {
                let x = s - start_s;
                if x < 0.0 || x > ramp_s * 2.0 + hold_s {
                    0.0
                } else if x < *ramp_s {
                    peak_iops * x / ramp_s
                } else if x < ramp_s + hold_s {
                    *peak_iops
                } else {
                    peak_iops * (ramp_s * 2.0 + hold_s - x) / ramp_s
                }
            }
            Component::ShortSpikes { iops, .. } => *iops,
        }
    }

    fn offset(&mut self, t: u64) -> u64 {
        let (lo, len) = match &self.comp {
            Component::Background { .. } => {
                let z = self
                    .zipf
                    .as_ref()
                    .map(|z| z.sample(&mut self.rng))
                    .unwrap_or(0);
                // Spread the (possibly truncated) Zipf ranks across every extent.
                let rank =
                    z * (self.extents / self.zipf.as_ref().map_or(1, |z| z.len()).max(1)).max(1);
                let ext =
                    (rank as u128 * self.extent_perm_mul as u128 % self.extents as u128) as u64;
                (ext * EXTENT, EXTENT)
            }
            Component::Spike { offset, len, .. } => (*offset, *len),
            Component::ShortSpikes {
                zone_offset,
                zone_len,
                concurrent,
                min_len,
                max_len,
                min_s,
                max_s,
                ..
            } => {
                let (zo, zl, c, mnl, mxl, mns, mxs) = (
                    *zone_offset,
                    *zone_len,
                    *concurrent,
                    *min_len,
                    *max_len,
                    *min_s,
                    *max_s,
                );
                self.shorts.retain(|a| a.until > t);
                while self.shorts.len() < c.max(1) as usize {
                    let len = self.rng.range(mnl, mxl.max(mnl)).min(zl.max(ALIGN));
                    let offset = zo + self.rng.below(zl.saturating_sub(len).max(1)) / ALIGN * ALIGN;
                    let dur = mns + self.rng.f64() * (mxs - mns).max(0.0);
                    self.shorts.push(ActiveShort {
                        offset,
                        len,
                        until: t + (dur * SECOND as f64) as u64,
                    });
                }
                let a = &self.shorts[self.rng.below(self.shorts.len() as u64) as usize];
                (a.offset, a.len)
            }
        };
        let off = lo + self.rng.below(len.max(ALIGN)) / ALIGN * ALIGN;
        off.min(self.capacity.saturating_sub(65536)) / ALIGN * ALIGN
    }

    fn fill_step(&mut self) {
        let t0 = self.step_start;
        let t1 = (t0 + STEP).min(self.end);
        self.step_start = t1;
        let mean = self.rate(t0) * (t1 - t0) as f64 / SECOND as f64;
        let n = poisson(&mut self.rng, mean);
        let mut recs = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let t = t0 + self.rng.below(t1 - t0);
            let offset = self.offset(t);
            let len = request_size(&mut self.rng);
            let op = if self.rng.chance(self.read_fraction) {
                Op::Read
            } else {
                Op::Write
            };
            recs.push(IoRecord::new(t, self.disk, offset, len, op));
        }
        recs.sort_by_key(|r| r.time);
        self.pending = recs.into_iter();
    }
}

impl Iterator for ComponentStream {
    type Item = IoRecord;
    fn next(&mut self) -> Option<IoRecord> {
        loop {
            if let Some(r) = self.pending.next() {
                return Some(r);
            }
            if self.step_start >= self.end {
                return None;
            }
            self.fill_step();
        }
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Poisson-distributed count with the given mean (Knuth for small means, normal
/// approximation above 50).
pub(crate) fn poisson(rng: &mut Rng, mean: f64) -> u64 {
    if mean <= 0.0 {
        return 0;
    }
    if mean > 50.0 {
        let u1 = rng.f64().max(1e-12);
        let u2 = rng.f64();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        return (mean + z * mean.sqrt()).round().max(0.0) as u64;
    }
    let l = (-mean).exp();
    let mut k = 0;
    let mut p = 1.0;
    loop {
        p *= rng.f64();
        if p <= l {
            return k;
        }
        k += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top_share(recs: &[IoRecord], capacity: u64, fraction: f64) -> f64 {
        let mut per_gb = std::collections::HashMap::<u64, u64>::new();
        let unit = (capacity / 1000).max(1); // 0.1% of the volume
        for r in recs {
            *per_gb.entry(r.offset / unit).or_default() += 1;
        }
        let mut counts: Vec<u64> = per_gb.into_values().collect();
        counts.sort_unstable_by(|a, b| b.cmp(a));
        let k = (1000.0 * fraction) as usize;
        counts.iter().take(k).sum::<u64>() as f64 / recs.len() as f64
    }

    #[test]
    fn presets_are_reproducible_and_shaped_like_the_paper() {
        for name in ["usr1", "web2", "proj2", "proj4"] {
            let mut spec = VolumeSpec::preset(name).unwrap();
            spec.duration_s = 600.0;
            let a: Vec<IoRecord> = spec.generate(7).collect();
            let b: Vec<IoRecord> = spec.generate(7).collect();
            assert_eq!(a, b, "{name}: same seed, same trace");
            assert!(
                a.windows(2).all(|w| w[0].time <= w[1].time),
                "{name}: time order"
            );
            assert!(
                a.iter()
                    .all(|r| r.offset + r.len <= spec.capacity && r.offset % 4096 == 0)
            );
            let top1 = top_share(&a, spec.capacity, 0.01);
            let top10 = top_share(&a, spec.capacity, 0.10);
            eprintln!(
                "{name}: {} requests in 600 s, top1% {top1:.2}, top10% {top10:.2}",
                a.len()
            );
            match name {
                "usr1" => assert!(top1 > 0.85, "usr1 top1 {top1}"),
                "web2" => assert!(top1 < 0.25 && top10 > 0.40, "web2 {top1} {top10}"),
                _ => assert!(top10 > 0.4, "{name} top10 {top10}"),
            }
        }
        assert!(VolumeSpec::preset("nope").is_none());
    }

    #[test]
    fn spike_rate_ramps_and_ends() {
        let spec = VolumeSpec {
            name: "t".into(),
            capacity: 10 * GB,
            duration_s: 100.0,
            read_fraction: 1.0,
            disk: 3,
            components: vec![Component::Spike {
                offset: GB,
                len: GB,
                start_s: 20.0,
                ramp_s: 10.0,
                hold_s: 20.0,
                peak_iops: 1000.0,
            }],
        };
        let recs: Vec<IoRecord> = spec.generate(1).collect();
        let secs = |r: &IoRecord| r.time / SECOND;
        assert!(
            recs.iter()
                .all(|r| (20..=60).contains(&secs(r)) && r.disk_in(GB, 2 * GB) && r.object == 3)
        );
        // ~ 1000 × (20 + 10) requests
        assert!(
            (recs.len() as f64 - 30_000.0).abs() < 1500.0,
            "{}",
            recs.len()
        );
    }

    impl IoRecord {
        fn disk_in(&self, lo: u64, hi: u64) -> bool {
            self.offset >= lo && self.offset < hi
        }
    }
}
