//! Post-copy migration: the source trait, stub state, on-demand fetch, background crawl.
//!
//! - [`source`]: the read-only [`Source`] trait (implemented in `kaiso-source`).
//! - [`state`]: the per-share migration database (stub rows, counter, anchors, report).
//! - [`engine`]: [`Migration`] and [`Migrations`], the store's stub filler.
//! - [`crawler`]: the background crawl.
//! - [`finish`]: verification against the source and removal of all stub state.
//! - [`samba_meta`]: DOS attributes and NT ACLs of SMB sources in Samba's xattr forms.
//! - `readahead`: source listings of subdirectories fetched ahead of their expansion.

pub mod crawler;
pub mod engine;
pub mod finish;
pub mod meta_retry;
mod readahead;
pub mod samba_meta;
pub mod source;
pub mod state;
#[cfg(test)]
mod tests;

pub use crawler::{CrawlFailure, CrawlState, Crawler};
pub use engine::{Migration, MigrationConfig, Migrations, NOTICE_KIND, StoreHandle, hold_recount};
pub use finish::{
    FinishOptions, FinishReport, FinishStop, clean_interrupted_finishes, finish,
    finish_stopping_at, finish_with, left_out, report_path,
};
pub use source::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
pub use state::{Progress, Skipped};
