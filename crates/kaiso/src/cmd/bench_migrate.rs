//! Placeholder until the owning capability lands its benchmark.

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("this benchmark is not built yet")
}
