//! Post-copy migration: the source trait, stub state, on-demand fetch, background crawl.
//!
//! - [`source`]: the read-only [`Source`] trait (implemented in `kaiso-source`).
//! - [`state`]: the per-share migration database (stub rows, counter, anchors, report).
//! - [`engine`]: [`Migration`] and [`Migrations`], the store's stub filler.
//! - [`crawler`]: the background crawl.
//! - [`finish`]: verification against the source and removal of all stub state.
//! - [`samba_meta`]: DOS attributes and NT ACLs of SMB sources in Samba's xattr forms.
//! - `readahead`: source listings of subdirectories fetched ahead of their expansion.

/// For test sources that hold plain files and directories only: the [`Source`] methods
/// of a source without symlinks, xattrs, ACLs or streams. Defined before the modules so
/// their tests can use it.
#[cfg(test)]
macro_rules! source_without_metadata {
    () => {
        fn read_link(&self, path: &SourcePath) -> SourceResult<Vec<u8>> {
            Err(SourceError::new(
                SourceErrorKind::WrongKind,
                path,
                "no links",
            ))
        }
        fn xattrs(&self, _path: &SourcePath) -> SourceResult<Vec<(Vec<u8>, Vec<u8>)>> {
            Ok(Vec::new())
        }
        fn acl(&self, _path: &SourcePath) -> SourceResult<SourceAcl> {
            Ok(SourceAcl::default())
        }
        fn streams(&self, _path: &SourcePath) -> SourceResult<Vec<SourceStream>> {
            Ok(Vec::new())
        }
        fn read_stream(
            &self,
            path: &SourcePath,
            _stream: &str,
            _offset: u64,
            _len: usize,
        ) -> SourceResult<Vec<u8>> {
            Err(SourceError::new(
                SourceErrorKind::Unsupported,
                path,
                "no streams",
            ))
        }
    };
}

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
