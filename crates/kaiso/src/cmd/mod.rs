//! One module per group of subcommands. Each owns its clap argument types.

pub mod bench;
pub mod bench_fs;
pub mod bench_libfs;
pub mod bench_migrate;
pub mod bench_sim;
pub mod migrate;
pub mod mount;
pub mod ops;
pub mod private;
pub mod scratch_fs;
pub mod serve;
pub mod sim;
pub mod trace;
