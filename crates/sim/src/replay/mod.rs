//! Replay: cache mode ([`cache`]) and tiering mode over device models ([`tier`]), with
//! shared statistics ([`stats`]).

pub mod cache;
pub mod stats;
pub mod tier;

pub use cache::{CacheResult, Granularity, replay_cache, to_requests};
pub use stats::LatencyHistogram;
