//! Placement, caching, spike, prefetch and replication policies: pure logic, no I/O.
//!
//! Nothing in this crate reads a clock, spawns a thread or touches a file: time is a
//! [`Nanos`] argument and every decision is a value returned to the caller. That is what
//! lets the store run a policy live and the simulator replay millions of requests a second
//! through the very same code.
//!
//! Two interfaces:
//! - [`engine::PlacementPolicy`]: tiering over N ordered tiers (access events in, placement
//!   and move decisions out). The store and the simulator both drive it.
//! - [`cache::CachePolicy`]: a single cache of fixed capacity (hit/miss, admission,
//!   eviction), for the classic baselines and for comparison with libCacheSim.

pub mod cache;
pub mod crawl;
pub mod default_policy;
pub mod engine;
pub mod heat;
pub mod prefetch;
pub mod spike;
pub mod time;

pub use engine::{Access, Move, MoveReason, ObjectId, Op, PlacementPolicy, TierId, TierState};
pub use time::Nanos;
