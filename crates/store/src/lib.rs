//! The kaiso store: tiers, namespace, placement, crash-safe mover, journal, metadata database.

pub mod migrate;
