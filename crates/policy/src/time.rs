//! Time as a plain number: nanoseconds since an arbitrary epoch chosen by the caller.

/// Nanoseconds since the caller's epoch (trace start, store start, …).
pub type Nanos = u64;

pub const MICROSECOND: Nanos = 1_000;
pub const MILLISECOND: Nanos = 1_000_000;
pub const SECOND: Nanos = 1_000_000_000;
pub const MINUTE: Nanos = 60 * SECOND;
