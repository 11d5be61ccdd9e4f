//! Post-copy migration: the source trait, stub state, on-demand fetch, background crawl.

pub mod source;

pub use source::{
    FileKind, Source, SourceAcl, SourceAttr, SourceEntry, SourceError, SourceErrorKind,
    SourceFeatures, SourcePath, SourceResult, SourceStream, Timestamp,
};
