//! `kaiso trace …`: kaiso's own file-level access trace.

#[derive(clap::Subcommand)]
pub enum TraceCommand {
    /// Record the access stream of a mounted store to a trace file.
    Record {},
}

pub fn run(_c: TraceCommand) -> anyhow::Result<()> {
    anyhow::bail!("trace is not built yet")
}
