//! Migration sources: POSIX path, NFSv3 and SMB2/3 clients, read-only.
