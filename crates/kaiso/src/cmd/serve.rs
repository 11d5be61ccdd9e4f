//! `kaiso serve`: serve a store over network protocols (embedded NFSv3).

#[derive(clap::Args)]
pub struct ServeArgs {}

pub fn serve(_a: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve is not built yet")
}
