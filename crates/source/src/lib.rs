//! Migration sources: POSIX path, NFSv3 and SMB2/3 clients, read-only.
//!
//! Each implements [`kaiso_store::migrate::Source`], the trait the store's migration
//! engine pulls from; the store never depends on this crate.

pub mod nfs;
pub mod posix;
pub mod smb;
pub mod url;

pub use kaiso_store::migrate::{Source, SourcePath};
pub use nfs::{NfsConfig, NfsSource};
pub use posix::PosixSource;
pub use smb::{SmbConfig, SmbSource};
pub use url::{SourceUrl, open_source};
