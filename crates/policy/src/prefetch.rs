//! The thesis ch.3 layout-aware prefetch (Matsuzawa & Shinagawa, CloudCom 2017) and the
//! variants it is compared with: LBA-contiguous ("simple") units and a fixed prefetch rate.
//!
//! - [`RegionLayout`]: the caller's chunk → (file, file offset) map (the guest's FIEMAP,
//!   inverted), from which layout-aware cache units `U(file, k)` are formed.
//! - [`RateController`]: r adapted by the easing function on throughput and cache hit ratio
//!   with the `2^-i` weighted history.
//! - [`PrefetchPolicy`]: the whole prefetching cache as a [`crate::PlacementPolicy`].

mod layout;
mod policy;
mod rate;
#[cfg(test)]
mod tests;

pub use layout::{FileChunk, LayoutError, RegionLayout};
pub use policy::{PrefetchConfig, PrefetchPolicy, RateMode, UnitMode, WindowReport};
pub use rate::{EasingConfig, EasingRule, RateController, WindowMeasure, weighted_history};
