//! Migration sources: POSIX path, NFSv3 and SMB2/3 clients, read-only.
//!
//! Each implements [`kaiso_store::migrate::Source`], the trait the store's migration
//! engine pulls from; the store never depends on this crate.

pub mod deadline;
pub mod nfs;
pub mod posix;
pub mod reconnect;
pub mod smb;
pub mod url;

pub use kaiso_store::migrate::{Source, SourcePath};
pub use nfs::{NfsConfig, NfsSource};
pub use posix::PosixSource;
pub use smb::{SmbConfig, SmbSource};
pub use url::{SourceUrl, open_source};

/// Runs a future to completion from synchronous code (the engine's threads call the
/// sources), also when the caller itself runs inside a tokio runtime: then on a helper
/// thread, since nesting `block_on` panics. `rt` is a multi-thread runtime's handle.
pub(crate) fn block_on<F>(rt: &tokio::runtime::Handle, f: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    if tokio::runtime::Handle::try_current().is_ok() {
        std::thread::scope(|s| {
            s.spawn(|| rt.block_on(f))
                .join()
                .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    } else {
        rt.block_on(f)
    }
}
