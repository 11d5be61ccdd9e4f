//! The kaiso store: tiers, namespace, placement, crash-safe mover, journal, metadata database.
//!
//! An inode-based file-system library over N ordered tiers, fully usable and tested without
//! a mount; the FUSE and NFS faces are thin adapters over [`Store`]. See docs/dev/store-api.md.

pub mod config;
pub mod control;
mod copy_range;
mod dataops;
mod db;
pub mod emulate;
pub mod error;
mod fsops;
mod handles;
mod longpath;
pub mod metrics;
pub mod migrate;
mod mover;
mod namespace;
pub mod operator;
mod opsapi;
mod orphan;
mod owner_write;
mod placement;
mod scan;
mod store;
pub mod stub;
mod tier;
mod tierlock;
pub mod trace;
pub mod types;
mod util;

pub use config::{ConfigError, DeviceKind, MoverConfig, PlacementRule, StoreConfig, TierConfig};
pub use error::{FsError, FsResult};
pub use mover::{Background, MoveError};
pub use operator::{
    Direction, Explanation, FsckReport, JobProgress, MoverStatus, Placement, StoreStatus,
    TierStatus,
};
pub use store::{FailPoint, JobId, OpenError, ReattachReport, Store};
pub use stub::{StubEntry, StubFiller, StubState};
pub use types::{
    Caller, DirEntry, Fh, FileAttr, FileKind, Ino, Opened, ROOT_INO, SetAttr, StatFs, TimeSet,
    rename_flags,
};
