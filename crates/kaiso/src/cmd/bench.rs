//! `kaiso bench …`: each benchmark prints ratios against a baseline measured in the same run.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Data and metadata path of the mount vs the backing directory and mergerfs; tiering benefit.
    Fs(super::bench_fs::Args),
    /// Policy replay speed and miss ratios vs libCacheSim.
    Sim(super::bench_sim::Args),
    /// Migration: time to serve, first access latency, total time vs rsync.
    Migrate(super::bench_migrate::Args),
    /// Library file system vs tmpfs, ext4 and the FUSE mount.
    Libfs(super::bench_libfs::Args),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Fs(a) => super::bench_fs::run(a),
        BenchCommand::Sim(a) => super::bench_sim::run(a),
        BenchCommand::Migrate(a) => super::bench_migrate::run(a),
        BenchCommand::Libfs(a) => super::bench_libfs::run(a),
    }
}
