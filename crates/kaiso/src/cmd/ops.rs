//! Operator commands against a store: status, where, explain, pin/unpin, promote/demote.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Store configuration (TOML).
    pub config: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct PathArgs {
    pub path: PathBuf,
}

#[derive(clap::Args)]
pub struct PinArgs {
    pub path: PathBuf,
    #[arg(short, long)]
    pub recursive: bool,
}

#[derive(clap::Args)]
pub struct MoveArgs {
    pub path: PathBuf,
    #[arg(short, long)]
    pub recursive: bool,
}

pub fn status(_a: StatusArgs) -> anyhow::Result<()> {
    anyhow::bail!("status is not built yet")
}
pub fn where_is(_a: PathArgs) -> anyhow::Result<()> {
    anyhow::bail!("where is not built yet")
}
pub fn explain(_a: PathArgs) -> anyhow::Result<()> {
    anyhow::bail!("explain is not built yet")
}
pub fn pin(_a: PinArgs) -> anyhow::Result<()> {
    anyhow::bail!("pin is not built yet")
}
pub fn unpin(_a: MoveArgs) -> anyhow::Result<()> {
    anyhow::bail!("unpin is not built yet")
}
pub fn promote(_a: MoveArgs) -> anyhow::Result<()> {
    anyhow::bail!("promote is not built yet")
}
pub fn demote(_a: MoveArgs) -> anyhow::Result<()> {
    anyhow::bail!("demote is not built yet")
}
