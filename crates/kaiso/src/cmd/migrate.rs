//! `kaiso migrate …`: post-copy migration of a live file server.
//!
//! The migration engine lives in `kaiso_store::migrate` and the sources in `kaiso-source`;
//! this command is not wired to them yet (see docs/migration.md, "State").

#[derive(clap::Subcommand)]
pub enum MigrateCommand {
    /// Start migrating a source into a store.
    Start {},
}

pub fn run(_c: MigrateCommand) -> anyhow::Result<()> {
    anyhow::bail!("`kaiso migrate` is not wired to the migration engine yet: see docs/migration.md")
}
