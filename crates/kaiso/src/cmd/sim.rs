//! `kaiso sim`: replay traces or generated workloads through the policy code.

#[derive(clap::Args)]
pub struct SimArgs {}

pub fn run(_a: SimArgs) -> anyhow::Result<()> {
    anyhow::bail!("sim is not built yet")
}
