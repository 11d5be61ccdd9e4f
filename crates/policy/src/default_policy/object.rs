//! Per-object state: 40 bytes, decayed lazily (no per-tick scans).

use crate::time::{Nanos, SECOND};

/// Tier value meaning "recorded but never placed".
pub(crate) const UNPLACED: u8 = u8::MAX;
/// Pin value meaning "not pinned".
pub(crate) const NO_PIN: u8 = u8::MAX;
/// `seq_next` after an open: the next read or write continues the open's touch.
pub(crate) const JUST_OPENED: u64 = u64::MAX - 1;

/// What the planner last decided about an object, for `explain`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Decision {
    None,
    Promoted,
    Demoted,
    Evicted,
    EvictedYoung,
    SpikePromoted,
    Prefetched,
    HeldBudget,
    HeldResidency,
    HeldNoRoom,
}

impl Decision {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Decision::None => "none yet",
            Decision::Promoted => "promoted: score above promote_min_heat",
            Decision::Demoted => "demoted: coldest on a tier over its high watermark",
            Decision::Evicted => {
                "evicted: a candidate at least swap_ratio times hotter needed room"
            }
            Decision::EvictedYoung => {
                "evicted inside min_residency: a candidate young_swap_ratio times hotter, \
                 clear of counting noise, needed room"
            }
            Decision::SpikePromoted => "promoted for a load spike on its tier",
            Decision::Prefetched => "prefetched with a hot neighbour of its cache unit",
            Decision::HeldBudget => "promotion held: flash write budget exhausted",
            Decision::HeldResidency => "move held: moved less than min_residency ago",
            Decision::HeldNoRoom => "promotion held: no room and no colder object to exchange",
        }
    }
}

/// Heat and placement of one object.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ObjectState {
    pub size: u64,
    /// Time of the last access (the reference time of both decayed counters).
    pub last_access: Nanos,
    /// Where the last read or write ended: the next access continues a run if it starts here
    /// ([`JUST_OPENED`] after an open).
    pub seq_next: u64,
    /// Decayed touch count (long half-life) at `last_access`.
    pub heat: f32,
    /// Decayed touch count (short half-life) at `last_access`: the spike rate.
    pub rate: f32,
    /// Seconds since the caller's epoch of the last completed or planned move (0 = never).
    pub last_move_secs: u32,
    pub tier: u8,
    pub pin: u8,
    pub decision: Decision,
    /// Set when the object has ever been accessed (objects only placed have no heat yet).
    pub touched: bool,
}

impl ObjectState {
    pub(crate) fn new() -> Self {
        Self {
            size: 0,
            last_access: 0,
            seq_next: u64::MAX,
            heat: 0.0,
            rate: 0.0,
            last_move_secs: 0,
            tier: UNPLACED,
            pin: NO_PIN,
            decision: Decision::None,
            touched: false,
        }
    }

    pub(crate) fn pinned(&self) -> bool {
        self.pin != NO_PIN
    }
}

/// `2^(-elapsed / half_life)`, with elapsed in nanoseconds and half-life in seconds.
pub(crate) fn decay(elapsed: Nanos, half_life_secs: f64) -> f64 {
    if elapsed == 0 {
        return 1.0;
    }
    (-(elapsed as f64 / SECOND as f64) / half_life_secs).exp2()
}

pub(crate) fn secs(at: Nanos) -> u32 {
    (at / SECOND).min(u32::MAX as u64) as u32
}
