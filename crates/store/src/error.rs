//! Errors: file-system operations fail with an errno; store-level operations with a message.

use std::fmt;
use std::io;

/// A failed file-system operation, as the errno a face returns to its client.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct FsError(pub i32);

/// Result of a file-system operation.
pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    pub const NOENT: FsError = FsError(libc::ENOENT);
    pub const EXIST: FsError = FsError(libc::EEXIST);
    pub const NOTDIR: FsError = FsError(libc::ENOTDIR);
    pub const ISDIR: FsError = FsError(libc::EISDIR);
    pub const NOTEMPTY: FsError = FsError(libc::ENOTEMPTY);
    pub const INVAL: FsError = FsError(libc::EINVAL);
    pub const BADF: FsError = FsError(libc::EBADF);
    pub const NOSPC: FsError = FsError(libc::ENOSPC);
    pub const IO: FsError = FsError(libc::EIO);
    pub const PERM: FsError = FsError(libc::EPERM);
    pub const ACCES: FsError = FsError(libc::EACCES);
    pub const NODATA: FsError = FsError(libc::ENODATA);
    pub const NAMETOOLONG: FsError = FsError(libc::ENAMETOOLONG);
    pub const XDEV: FsError = FsError(libc::EXDEV);
    pub const NOSYS: FsError = FsError(libc::ENOSYS);
    pub const BUSY: FsError = FsError(libc::EBUSY);
    pub const RANGE: FsError = FsError(libc::ERANGE);

    /// The errno value.
    pub fn errno(self) -> i32 {
        self.0
    }

    /// The last OS error (after a failed libc call).
    pub fn last() -> FsError {
        FsError::from(io::Error::last_os_error())
    }
}

impl From<io::Error> for FsError {
    fn from(e: io::Error) -> FsError {
        FsError(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl From<rusqlite::Error> for FsError {
    fn from(e: rusqlite::Error) -> FsError {
        // A full state directory is ENOSPC, which the crawl's failures and clients can
        // tell apart from a broken database (EIO); the log names the cause.
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) {
            tracing::error!(error = %e, "store database: state directory full");
            return FsError::NOSPC;
        }
        tracing::error!(error = %e, "metadata database error");
        FsError::IO
    }
}

impl fmt::Debug for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.0))
    }
}

impl fmt::Display for FsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for FsError {}

impl From<FsError> for io::Error {
    fn from(e: FsError) -> io::Error {
        io::Error::from_raw_os_error(e.0)
    }
}
