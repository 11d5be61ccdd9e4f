//! Single-cache policies: one cache of fixed capacity in front of a backing store.
//!
//! [`CachePolicy`] is the object-level interface the simulator replays traces through and
//! that libCacheSim's miss ratios are checked against. A request names an object (`u64` id)
//! and its size; the cache answers hit or miss and, on a miss, admits the object and evicts
//! what its policy chooses (the semantics of libCacheSim's `cache_get_base`, see
//! docs/policies.md). [`by_name`] builds any policy from its name and a libCacheSim-style
//! parameter string; [`as_placement`] runs any of them as a two-tier
//! [`PlacementPolicy`](crate::engine::PlacementPolicy).
//!
//! Policies, one module each: [`fifo`], [`lru`], [`clock`], [`arc`], [`twoq`], [`lirs`],
//! [`s3fifo`], [`sieve`], [`smq`], [`belady`].

pub mod arc;
pub mod belady;
pub mod clock;
pub mod fifo;
pub mod hash;
pub mod id_map;
pub mod lirs;
pub mod list;
pub mod lru;
pub mod placement_adapter;
mod queue_set;
pub mod rng;
pub mod s3fifo;
pub mod sieve;
pub mod smq;
pub mod twoq;

#[cfg(test)]
mod testkit;

use std::fmt;

pub use crate::engine::Op;
pub use placement_adapter::{CachePlacement, as_placement, placement_by_name};

use crate::time::Nanos;

/// `next_access` of a request whose object is never requested again.
pub const NEVER: u64 = u64::MAX;

/// One request to the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// When the request was issued (only used by time-aware policies; may be 0).
    pub time: Nanos,
    /// The object requested.
    pub id: u64,
    /// The object's size in bytes. A hit does not change the cached size (as libCacheSim).
    pub size: u64,
    /// Read/Write/Open/Create/Truncate are all cache lookups; Delete removes the object.
    pub op: Op,
    /// Index (in the request sequence) of this object's next request, [`NEVER`] if none.
    /// Only Belady reads it; fill it with [`annotate_next_access`].
    pub next_access: u64,
}

impl Request {
    /// A read of `size` bytes of object `id` at `time`, with unknown next access.
    pub fn new(time: Nanos, id: u64, size: u64) -> Self {
        Request {
            time,
            id,
            size,
            op: Op::Read,
            next_access: NEVER,
        }
    }
}

/// Fills `next_access` of every request with the index of the next request for the same
/// object ([`NEVER`] if none), in O(n) with one hash map (scanning from the end).
pub fn annotate_next_access(requests: &mut [Request]) {
    let mut next: hash::FxHashMap<u64, u64> = hash::FxHashMap::default();
    for (i, req) in requests.iter_mut().enumerate().rev() {
        req.next_access = next.insert(req.id, i as u64).unwrap_or(NEVER);
    }
}

/// What a cache's capacity counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Sum of object sizes in bytes.
    Bytes,
    /// Number of objects; every object weighs 1 (libCacheSim's `ignore_obj_size`).
    Objects,
}

/// A cache's capacity: a limit and what it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Capacity {
    pub limit: u64,
    pub unit: Unit,
}

impl Capacity {
    pub const fn bytes(limit: u64) -> Self {
        Capacity {
            limit,
            unit: Unit::Bytes,
        }
    }

    pub const fn objects(limit: u64) -> Self {
        Capacity {
            limit,
            unit: Unit::Objects,
        }
    }

    /// How much an object of `size` bytes takes of this capacity.
    #[inline]
    pub fn charge(&self, size: u64) -> u64 {
        match self.unit {
            Unit::Bytes => size,
            Unit::Objects => 1,
        }
    }
}

impl Capacity {
    /// How many objects to reserve room for up front: the limit when counting objects
    /// (capped at 2^22 so a huge limit does not allocate eagerly), else none.
    pub fn reserve_hint(&self) -> usize {
        match self.unit {
            Unit::Objects => self.limit.min(1 << 22) as usize,
            Unit::Bytes => 0,
        }
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unit {
            Unit::Bytes => write!(f, "{} bytes", self.limit),
            Unit::Objects => write!(f, "{} objects", self.limit),
        }
    }
}

/// An object that left the cache to make room (not by [`CachePolicy::remove`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub id: u64,
    /// The object's charge (bytes, or 1 when counting objects).
    pub size: u64,
}

/// Occupancy bookkeeping shared by every policy: capacity, units in use, eviction log.
#[derive(Clone, Debug)]
pub struct Meter {
    capacity: Capacity,
    used: u64,
    log: Option<Vec<Eviction>>,
}

impl Meter {
    pub fn new(capacity: Capacity) -> Self {
        Meter {
            capacity,
            used: 0,
            log: None,
        }
    }

    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// The charge of a request's object.
    #[inline]
    pub fn charge(&self, req: &Request) -> u64 {
        self.capacity.charge(req.size)
    }

    /// Whether an object of this charge can be cached at all (libCacheSim's `can_insert`:
    /// objects larger than the whole cache are never admitted).
    #[inline]
    pub fn fits(&self, charge: u64) -> bool {
        charge <= self.capacity.limit
    }

    /// Whether admitting `charge` more units needs an eviction first.
    #[inline]
    pub fn needs_room(&self, charge: u64) -> bool {
        self.used + charge > self.capacity.limit
    }

    #[inline]
    pub fn add(&mut self, charge: u64) {
        self.used += charge;
    }

    /// An object left without an eviction (explicit remove, or an internal move).
    #[inline]
    pub fn sub(&mut self, charge: u64) {
        self.used -= charge;
    }

    /// An object was evicted: release its charge and log it if logging is on.
    #[inline]
    pub fn evicted(&mut self, id: u64, charge: u64) {
        self.used -= charge;
        if let Some(log) = &mut self.log {
            log.push(Eviction { id, size: charge });
        }
    }

    pub fn set_log(&mut self, on: bool) {
        match (on, self.log.is_some()) {
            (true, false) => self.log = Some(Vec::new()),
            (false, true) => self.log = None,
            _ => {}
        }
    }

    pub fn drain_log(&mut self, out: &mut Vec<Eviction>) {
        if let Some(log) = &mut self.log {
            out.append(log);
        }
    }
}

/// A single cache of fixed capacity.
///
/// Contract (checked by the tests of every policy):
/// - `access` returns `true` iff the object was cached just before the request;
/// - after any call, `used() <= capacity().limit`;
/// - a miss admits the object (except where a policy documents otherwise, e.g. smq's
///   promotion threshold) unless its charge exceeds the whole capacity;
/// - given the same calls in the same order, the same answers (policies with randomness
///   take a seed parameter).
pub trait CachePolicy: Send {
    /// Short name, with non-default parameters (e.g. `Clock-2`), for reports.
    fn name(&self) -> &str;
    /// Serve one request: `true` on a hit. O(1) amortised for the queue-based policies.
    fn access(&mut self, req: &Request) -> bool;
    /// Whether the object is cached now (no side effects).
    fn contains(&self, id: u64) -> bool;
    /// Number of cached objects (not counting ghost/history entries).
    fn len(&self) -> usize;
    /// Drop the object if cached, without logging an eviction; `true` if it was cached.
    fn remove(&mut self, id: u64) -> bool;
    /// The occupancy bookkeeping.
    fn meter(&self) -> &Meter;
    fn meter_mut(&mut self) -> &mut Meter;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn capacity(&self) -> Capacity {
        self.meter().capacity()
    }

    /// Units in use (bytes, or objects when the capacity counts objects).
    fn used(&self) -> u64 {
        self.meter().used()
    }

    /// Start or stop recording evictions (off by default; costs one push per eviction).
    fn set_eviction_log(&mut self, on: bool) {
        self.meter_mut().set_log(on);
    }

    /// Move the evictions recorded since the last drain into `out` (oldest first).
    fn drain_evictions(&mut self, out: &mut Vec<Eviction>) {
        self.meter_mut().drain_log(out);
    }
}

/// Why [`by_name`] refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    UnknownPolicy(String),
    UnknownParam {
        policy: &'static str,
        key: String,
        known: &'static [&'static str],
    },
    BadValue {
        policy: &'static str,
        key: String,
        value: String,
        expected: &'static str,
    },
    MalformedParams(String),
    ZeroCapacity,
    /// An offline policy (Belady) was asked to run without the future it needs.
    NeedsFuture(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::UnknownPolicy(name) => {
                write!(
                    f,
                    "unknown cache policy {name:?}; known: {}",
                    POLICY_NAMES.join(", ")
                )
            }
            Error::UnknownParam { policy, key, known } => {
                if known.is_empty() {
                    write!(f, "{policy} takes no parameters (got {key:?})")
                } else {
                    write!(
                        f,
                        "{policy} has no parameter {key:?}; known: {}",
                        known.join(", ")
                    )
                }
            }
            Error::BadValue {
                policy,
                key,
                value,
                expected,
            } => {
                write!(
                    f,
                    "{policy}: bad value {value:?} for {key}: expected {expected}"
                )
            }
            Error::MalformedParams(s) => {
                write!(
                    f,
                    "malformed parameters {s:?}: expected key=value[,key=value…]"
                )
            }
            Error::ZeroCapacity => write!(f, "cache capacity must be at least 1"),
            Error::NeedsFuture(p) => write!(
                f,
                "{p} is an offline policy: it needs each access's next-access index, which \
                 this caller does not provide"
            ),
        }
    }
}

impl std::error::Error for Error {}

/// Canonical policy names accepted by [`by_name`] (case-insensitive; `-`/`_` ignored).
pub const POLICY_NAMES: &[&str] = &[
    "fifo", "lru", "clock", "arc", "twoq", "lirs", "s3fifo", "sieve", "smq", "belady",
];

/// Builds a policy by name with a libCacheSim-style parameter string
/// (`"key=value,key=value"`, empty for defaults). See docs/policies.md for each
/// policy's parameters.
pub fn by_name(
    name: &str,
    capacity: Capacity,
    params: &str,
) -> Result<Box<dyn CachePolicy>, Error> {
    if capacity.limit == 0 {
        return Err(Error::ZeroCapacity);
    }
    let key: String = name
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .flat_map(char::to_lowercase)
        .collect();
    let params = Params::parse(params)?;
    Ok(match key.as_str() {
        "fifo" => Box::new(fifo::Fifo::with_params(capacity, &params)?),
        "lru" => Box::new(lru::Lru::with_params(capacity, &params)?),
        "clock" => Box::new(clock::Clock::with_params(capacity, &params)?),
        "arc" => Box::new(arc::Arc::with_params(capacity, &params)?),
        "twoq" | "2q" => Box::new(twoq::TwoQ::with_params(capacity, &params)?),
        "lirs" => Box::new(lirs::Lirs::with_params(capacity, &params)?),
        "s3fifo" => Box::new(s3fifo::S3Fifo::with_params(capacity, &params)?),
        "sieve" => Box::new(sieve::Sieve::with_params(capacity, &params)?),
        "smq" => Box::new(smq::Smq::with_params(capacity, &params)?),
        "belady" | "opt" => Box::new(belady::Belady::with_params(capacity, &params)?),
        _ => return Err(Error::UnknownPolicy(name.to_string())),
    })
}

/// Parsed `key=value` parameters. Keys compare case-insensitively with `_` read as `-`.
#[derive(Clone, Debug, Default)]
pub struct Params {
    pairs: Vec<(String, String)>,
}

impl Params {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let mut pairs = Vec::new();
        for item in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| Error::MalformedParams(s.to_string()))?;
            let k = k.trim().to_ascii_lowercase().replace('_', "-");
            if k.is_empty() {
                return Err(Error::MalformedParams(s.to_string()));
            }
            pairs.push((k, v.trim().to_string()));
        }
        Ok(Params { pairs })
    }

    /// Fails on any key not in `known`.
    pub fn check(&self, policy: &'static str, known: &'static [&'static str]) -> Result<(), Error> {
        match self
            .pairs
            .iter()
            .find(|(k, _)| !known.contains(&k.as_str()))
        {
            Some((k, _)) => Err(Error::UnknownParam {
                policy,
                key: k.clone(),
                known,
            }),
            None => Ok(()),
        }
    }

    fn raw(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// A fraction in (0, 1) (exclusive bounds unless `inclusive`).
    pub fn ratio(
        &self,
        policy: &'static str,
        key: &'static str,
        default: f64,
        inclusive: bool,
    ) -> Result<f64, Error> {
        let Some(v) = self.raw(key) else {
            return Ok(default);
        };
        let bad = || Error::BadValue {
            policy,
            key: key.to_string(),
            value: v.to_string(),
            expected: if inclusive {
                "a number in [0, 1]"
            } else {
                "a number in (0, 1)"
            },
        };
        let x: f64 = v.parse().map_err(|_| bad())?;
        let ok = if inclusive {
            (0.0..=1.0).contains(&x)
        } else {
            x > 0.0 && x < 1.0
        };
        if ok { Ok(x) } else { Err(bad()) }
    }

    /// An unsigned integer in `range`.
    pub fn int(
        &self,
        policy: &'static str,
        key: &'static str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
        expected: &'static str,
    ) -> Result<u64, Error> {
        let Some(v) = self.raw(key) else {
            return Ok(default);
        };
        match v.parse::<u64>() {
            Ok(x) if range.contains(&x) => Ok(x),
            _ => Err(Error::BadValue {
                policy,
                key: key.to_string(),
                value: v.to_string(),
                expected,
            }),
        }
    }

    pub fn flag(
        &self,
        policy: &'static str,
        key: &'static str,
        default: bool,
    ) -> Result<bool, Error> {
        match self.raw(key) {
            None => Ok(default),
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(Error::BadValue {
                    policy,
                    key: key.to_string(),
                    value: v.to_string(),
                    expected: "true or false",
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_name_builds_every_listed_policy() {
        for name in POLICY_NAMES {
            let c = by_name(name, Capacity::objects(10), "").unwrap();
            assert_eq!(c.capacity(), Capacity::objects(10));
            assert!(c.is_empty());
        }
        assert!(by_name("S3-FIFO", Capacity::bytes(100), "").is_ok());
        assert!(by_name("2Q", Capacity::bytes(100), "").is_ok());
    }

    #[test]
    fn by_name_reports_bad_input() {
        let err = |r: Result<Box<dyn CachePolicy>, Error>| r.err().unwrap();
        assert!(matches!(
            err(by_name("lfu9", Capacity::bytes(9), "")),
            Error::UnknownPolicy(_)
        ));
        assert!(matches!(
            err(by_name("lru", Capacity::bytes(9), "foo=1")),
            Error::UnknownParam { .. }
        ));
        assert!(matches!(
            err(by_name("clock", Capacity::bytes(9), "n-bit-counter=x")),
            Error::BadValue { .. }
        ));
        assert!(matches!(
            err(by_name("s3fifo", Capacity::bytes(9), "small-size-ratio")),
            Error::MalformedParams(_)
        ));
        assert!(matches!(
            err(by_name("lru", Capacity::bytes(0), "")),
            Error::ZeroCapacity
        ));
        let msg = err(by_name("nope", Capacity::bytes(9), "")).to_string();
        assert!(msg.contains("sieve"), "{msg}");
    }

    #[test]
    fn every_policy_checks_its_parameter_ranges() {
        let bad = [
            ("clock", "n-bit-counter=0"),
            ("clock", "n-bit-counter=17"),
            ("clock", "n-bit-counter=1,init-freq=2"),
            ("s3fifo", "small-size-ratio=1.5"),
            ("s3fifo", "ghost-size-ratio=-0.1"),
            ("s3fifo", "move-to-main-threshold=0"),
            ("twoq", "Ain-size-ratio=0"),
            ("lirs", "hir-ratio=1"),
            ("smq", "levels=0"),
            ("smq", "promote-threshold=16"),
            ("belady", "bypass=maybe"),
            ("arc", "p=3"),
        ];
        for (name, params) in bad {
            let r = by_name(name, Capacity::objects(100), params);
            assert!(r.is_err(), "{name} accepted {params:?}");
            assert!(!r.err().unwrap().to_string().is_empty());
        }
        let good = [
            ("clock", "n-bit-counter=3, init-freq=7"),
            (
                "s3fifo",
                "fifo-size-ratio=0.2,ghost-size-ratio=0,move-to-main-threshold=1",
            ),
            ("twoq", "Ain-size-ratio=0.3,Aout-size-ratio=0.6"),
            ("smq", "levels=4,hotspot-shift=0,promote-threshold=3,seed=9"),
            ("belady", "bypass=true"),
        ];
        for (name, params) in good {
            assert!(
                by_name(name, Capacity::objects(100), params).is_ok(),
                "{name} {params}"
            );
        }
        assert_eq!(
            by_name("clock", Capacity::objects(9), "n-bit-counter=2")
                .unwrap()
                .name(),
            "Clock-2-0"
        );
        assert_eq!(
            by_name("belady", Capacity::objects(9), "bypass=1")
                .unwrap()
                .name(),
            "Belady-bypass"
        );
    }

    #[test]
    fn annotate_next_access_links_each_request_to_the_next_of_its_object() {
        let mut reqs: Vec<Request> = [1u64, 2, 1, 3, 2, 1]
            .iter()
            .map(|&id| Request::new(0, id, 1))
            .collect();
        annotate_next_access(&mut reqs);
        let next: Vec<u64> = reqs.iter().map(|r| r.next_access).collect();
        assert_eq!(next, vec![2, 4, 5, NEVER, NEVER, NEVER]);
    }

    #[test]
    fn params_parse_like_libcachesim() {
        let p = Params::parse("small-size-ratio=0.2, move_to_main_threshold=2").unwrap();
        assert_eq!(p.ratio("x", "small-size-ratio", 0.1, false).unwrap(), 0.2);
        assert_eq!(
            p.int("x", "move-to-main-threshold", 1, 1..=9, "1..9")
                .unwrap(),
            2
        );
        assert!(p.check("x", &["small-size-ratio"]).is_err());
        assert!(Params::parse("").unwrap().pairs.is_empty());
        assert!(Params::parse("=3").is_err());
    }
}
