//! `kaiso migrate …` and `kaiso serve`.

#[derive(clap::Subcommand)]
pub enum MigrateCommand {
    /// Start migrating a source into a store.
    Start {},
}

#[derive(clap::Args)]
pub struct ServeArgs {}

pub fn run(_c: MigrateCommand) -> anyhow::Result<()> {
    anyhow::bail!("migrate is not built yet")
}
pub fn serve(_a: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve is not built yet")
}
