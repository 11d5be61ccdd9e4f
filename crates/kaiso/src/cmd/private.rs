//! `kaiso run --private DIR -- PROGRAM` and `kaiso private …`.

#[derive(clap::Args)]
pub struct RunArgs {}

#[derive(clap::Subcommand)]
pub enum PrivateCommand {
    /// List a pool's tree.
    Ls {},
}

pub fn run_program(_a: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("run is not built yet")
}
pub fn run(_c: PrivateCommand) -> anyhow::Result<()> {
    anyhow::bail!("private is not built yet")
}
