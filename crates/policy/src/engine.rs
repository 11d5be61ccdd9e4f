//! The placement interface that the store (live) and the simulator (replay) both drive.
//!
//! An *object* is whatever the caller places as a unit: a whole file, or a fixed-size
//! region (chunk/segment) of a big file or block volume. Tiers are ordered, 0 fastest.
//! The caller tells the policy where objects are ([`PlacementPolicy::placed`]) and what
//! happens to them ([`PlacementPolicy::record`]); the policy answers with tiers for new
//! objects and with a plan of moves. The caller carries moves out (or not) and reports
//! each completed move back through `placed`.

use crate::time::Nanos;

/// Caller-chosen identity of a placed object (file id, or volume/region packed).
pub type ObjectId = u64;

/// Index into the ordered tier list; 0 is the fastest tier.
pub type TierId = u8;

/// What an access did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Open,
    Read,
    Write,
    Create,
    Truncate,
    Delete,
}

/// One access as seen by a face (FUSE, NFS) or read from a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub at: Nanos,
    pub object: ObjectId,
    pub op: Op,
    /// Byte offset inside the object (0 for open/create/delete).
    pub offset: u64,
    /// Bytes read or written (0 for open/create/delete).
    pub len: u64,
}

/// A tier as the policy sees it when planning.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TierState {
    /// Hard limit in bytes: never planned past.
    pub capacity: u64,
    /// Bytes in use now.
    pub used: u64,
    /// Above this fraction of capacity the tier must be drained (demotions). kaiso's
    /// default policy fills the tier by heat up to it (`promote_to_high_watermark`).
    pub high_watermark: f64,
    /// Draining stops at this fraction (and, in kaiso's default policy, promotions stop
    /// here for a while after a drain, or while their source device is busy).
    pub low_watermark: f64,
    /// Foreground utilisation of the tier's device over the last interval, 0.0..=1.0
    /// (iostat %util). Moves back off as it rises.
    pub busy: f64,
}

/// Why a move was planned; shown by `kaiso explain` and counted in metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoveReason {
    /// Hot enough to earn a faster tier.
    Promote,
    /// Cold, and its tier is above its high watermark.
    DemoteOverWatermark,
    /// A sudden load spike on a slow tier (the 002 rule).
    Spike,
    /// The spike is over: utilisation fell below the demote threshold.
    SpikeOver,
    /// Prefetched as part of a hot cache unit (the ch.3 rule).
    Prefetch,
    /// Evicted to make room for a hotter object.
    Evict,
    /// An operator asked (`kaiso promote|demote|pin`).
    Manual,
}

/// One planned move of an object between tiers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Move {
    pub object: ObjectId,
    pub from: TierId,
    pub to: TierId,
    pub bytes: u64,
    pub reason: MoveReason,
}

/// A tiering policy over N ordered tiers. Implementations must be deterministic (given the
/// same calls in the same order, the same answers) and cheap: `record` is on the I/O path.
pub trait PlacementPolicy: Send {
    /// Short stable name, used in reports and configuration.
    fn name(&self) -> &str;
    /// An access happened. O(1) amortised.
    fn record(&mut self, access: &Access);
    /// The object now lives on `tier` with `size` bytes (after create, adopt, restart,
    /// a completed move, or a size change).
    fn placed(&mut self, object: ObjectId, size: u64, tier: TierId);
    /// The object's size changed where it is (it grew or shrank through writes or
    /// truncation since it was placed). Unlike [`Self::placed`] this says nothing about a
    /// move, so a move planned for the object stays in flight. Objects never placed are
    /// ignored. The default suits policies that plan without sizes; size-aware policies
    /// must override it, or they plan with the size of the last `placed` call.
    fn resized(&mut self, object: ObjectId, size: u64) {
        let _ = (object, size);
    }
    /// The object is gone (deleted).
    fn forget(&mut self, object: ObjectId);
    /// Keep the object on `tier` (Some) or release it (None). Plans never move a pinned object.
    fn pin(&mut self, object: ObjectId, tier: Option<TierId>);
    /// Which tier a new object of about `size_hint` bytes should be created on.
    fn place_new(&mut self, now: Nanos, size_hint: u64, tiers: &[TierState]) -> TierId;
    /// Plan moves at `now`, moving at most `max_bytes` in total, keeping every tier at or
    /// under its hard capacity and between its watermarks where possible.
    fn plan(&mut self, now: Nanos, tiers: &[TierState], max_bytes: u64) -> Vec<Move>;
    /// A one-line, human-readable account of the policy's view of the object
    /// (heat, rank, pin, last decision), for `kaiso explain`.
    fn explain(&self, object: ObjectId, now: Nanos) -> String;
}
