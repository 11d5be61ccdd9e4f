//! Library file system pool: process-private directories in a memory-mapped pool.
