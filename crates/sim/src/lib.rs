//! Trace readers, workload generators and discrete-event replay through the kaiso policy code.
//!
//! - [`trace`]: streaming readers for MSR Cambridge CSV, blkparse text, libCacheSim's
//!   vscsi and oracleGeneral binaries and kaiso's file-level trace; writers for
//!   oracleGeneral and MSR CSV.
//! - [`workload`]: seeded generators: MSR-like volumes with spikes (002), a TPCx-V-like
//!   multi-VM workload with a file layout map (ch.3), Zipf file workloads with scans.
//! - [`replay`]: cache mode (any `kaiso_policy::cache::CachePolicy`) and tiering mode
//!   (any `PlacementPolicy` over device-modelled tiers, open or closed loop).
//! - [`report`]: results as JSON/CSV and SVG plots.
//! - [`suite`]: the default policy against every baseline over the workloads.

pub mod experiments;
pub mod policies;
pub mod replay;
pub mod report;
pub mod rng;
pub mod source;
pub mod suite;
pub mod sweep;
pub mod trace;
pub mod validate;
pub mod workload;

pub use trace::{IoRecord, TraceError, TraceFormat};
