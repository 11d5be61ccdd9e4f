//! Cache-size × policy sweeps over one materialised request sequence.

use crate::replay::cache::{CacheResult, parse_size, replay_cache};
use kaiso_policy::cache::{Capacity, Request, Unit, by_name};
use std::collections::HashSet;

/// A cache size: a fraction of the footprint (`0.01`), or an absolute amount in the
/// capacity unit (`1000` objects, `64m` bytes).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CacheSize {
    Fraction(f64),
    Absolute(u64),
}

impl CacheSize {
    /// `0.1` (a number below 1 with a point is a fraction), `2000`, `64m`, `1g`.
    pub fn parse(s: &str) -> Option<CacheSize> {
        let s = s.trim();
        if s.contains('.') && !s.ends_with(|c: char| c.is_ascii_alphabetic()) {
            let f: f64 = s.parse().ok()?;
            return (f > 0.0 && f <= 1.0).then_some(CacheSize::Fraction(f));
        }
        parse_size(s).filter(|&v| v > 0).map(CacheSize::Absolute)
    }

    pub fn parse_list(s: &str) -> Result<Vec<CacheSize>, String> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| CacheSize::parse(p).ok_or_else(|| format!("bad cache size {p:?}: use a fraction in (0, 1] such as 0.01, or an amount such as 1000 or 64m")))
            .collect()
    }

    pub fn resolve(&self, footprint: u64) -> u64 {
        match *self {
            CacheSize::Fraction(f) => ((footprint as f64 * f) as u64).max(1),
            CacheSize::Absolute(v) => v,
        }
    }

    pub fn label(&self) -> String {
        match self {
            CacheSize::Fraction(f) => format!("{f}"),
            CacheSize::Absolute(v) => v.to_string(),
        }
    }
}

/// Distinct objects (unit Objects) or the sum of their sizes (unit Bytes); an object's
/// size is the size of its first request.
pub fn footprint(reqs: &[Request], unit: Unit) -> u64 {
    let mut seen = HashSet::with_capacity(reqs.len() / 4);
    let mut total = 0;
    for r in reqs {
        if seen.insert(r.id) {
            total += match unit {
                Unit::Bytes => r.size,
                Unit::Objects => 1,
            };
        }
    }
    total
}

/// Split `name[:k=v,k=v]` into name and libCacheSim-style parameters.
pub fn split_policy(spec: &str) -> (&str, &str) {
    spec.split_once(':').unwrap_or((spec, ""))
}

/// One sweep point.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SweepPoint {
    pub size: String,
    pub result: CacheResult,
}

/// Run every policy at every size over `reqs`. `progress(done, total, label)` is called
/// before each run.
pub fn sweep(
    reqs: &[Request],
    policies: &[String],
    sizes: &[CacheSize],
    unit: Unit,
    warmup: u64,
    window: u64,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<Vec<SweepPoint>, String> {
    let fp = footprint(reqs, unit);
    let total = policies.len() * sizes.len();
    let mut out = Vec::with_capacity(total);
    for size in sizes {
        let limit = size.resolve(fp);
        for spec in policies {
            let (name, params) = split_policy(spec);
            progress(out.len(), total, &format!("{spec} @ {}", size.label()));
            let cap = Capacity { limit, unit };
            let mut p = by_name(name, cap, params).map_err(|e| e.to_string())?;
            let result = replay_cache(p.as_mut(), reqs.iter().copied(), warmup, window);
            out.push(SweepPoint {
                size: size.label(),
                result,
            });
        }
    }
    progress(total, total, "done");
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(CacheSize::parse("0.1"), Some(CacheSize::Fraction(0.1)));
        assert_eq!(CacheSize::parse("1000"), Some(CacheSize::Absolute(1000)));
        assert_eq!(CacheSize::parse("64m"), Some(CacheSize::Absolute(64 << 20)));
        assert_eq!(
            CacheSize::parse("1.5g"),
            Some(CacheSize::Absolute(1_610_612_736))
        );
        assert_eq!(CacheSize::parse("2.0"), None);
        assert!(CacheSize::parse_list("0.1,x").is_err());
        assert_eq!(CacheSize::Fraction(0.5).resolve(10), 5);
    }

    #[test]
    fn sweep_runs_every_point_and_larger_caches_miss_less_for_lru() {
        let reqs: Vec<Request> = (0..20_000u64)
            .map(|i| Request::new(i, (i * 2654435761) % 1000 % (1 + i % 300), 1))
            .collect();
        let pts = sweep(
            &reqs,
            &["lru".into(), "fifo".into()],
            &[CacheSize::Fraction(0.05), CacheSize::Fraction(0.5)],
            Unit::Objects,
            0,
            0,
            |_, _, _| {},
        )
        .unwrap();
        assert_eq!(pts.len(), 4);
        assert!(pts[2].result.miss_ratio <= pts[0].result.miss_ratio);
        assert!(
            sweep(
                &reqs,
                &["nope".into()],
                &[CacheSize::Fraction(0.1)],
                Unit::Objects,
                0,
                0,
                |_, _, _| {}
            )
            .is_err()
        );
    }
}
