//! `kaiso trace …`: kaiso's own file-level access trace (docs/dev/trace-format.md).

use kaiso_store::control::Request;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(clap::Subcommand)]
pub enum TraceCommand {
    /// Record the access stream of a mounted store to a trace file.
    Record {
        /// The mountpoint (or any path inside the mount).
        mount: PathBuf,
        /// Trace file to write (written by the daemon, so give a path it can write).
        #[arg(short, long)]
        out: PathBuf,
        /// Stop after this many seconds (default: at Ctrl-C).
        #[arg(long)]
        seconds: Option<f64>,
        /// Use this configuration's store instead of finding it from the mount.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

pub fn run(c: TraceCommand) -> anyhow::Result<()> {
    match c {
        TraceCommand::Record {
            mount,
            out,
            seconds,
            config,
        } => {
            let (mut t, _) = crate::cmd::ops::resolve(&mount, config.as_deref())?;
            let out = std::path::absolute(&out)?;
            let stop = crate::cmd::mount::catch_signals();
            t.call(Request::TraceStart { out: out.clone() })?;
            eprintln!(
                "kaiso: recording to {} ({})",
                out.display(),
                seconds
                    .map(|s| format!("{s} s"))
                    .unwrap_or_else(|| "Ctrl-C stops".into())
            );
            let start = Instant::now();
            while !stop.load(Ordering::SeqCst)
                && seconds.is_none_or(|s| start.elapsed() < Duration::from_secs_f64(s))
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            let v = t.call(Request::TraceStop)?;
            println!(
                "kaiso: {} records written to {}",
                v["records"],
                out.display()
            );
            Ok(())
        }
    }
}
