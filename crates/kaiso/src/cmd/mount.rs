//! `kaiso mount`, `kaiso adopt`, `kaiso fsck`.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct MountArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
    /// Where to present the union namespace.
    pub mountpoint: PathBuf,
}

#[derive(clap::Args)]
pub struct AdoptArgs {
    /// Existing directory to take in place as a tier.
    pub dir: PathBuf,
}

#[derive(clap::Args)]
pub struct FsckArgs {
    /// Store configuration (TOML).
    pub config: PathBuf,
}

pub fn mount(_a: MountArgs) -> anyhow::Result<()> {
    anyhow::bail!("mount is not built yet")
}
pub fn adopt(_a: AdoptArgs) -> anyhow::Result<()> {
    anyhow::bail!("adopt is not built yet")
}
pub fn fsck(_a: FsckArgs) -> anyhow::Result<()> {
    anyhow::bail!("fsck is not built yet")
}
