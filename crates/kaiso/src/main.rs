//! `kaiso`: the one binary. Each subcommand lives in its own module under `cmd/`,
//! owned by the capability it fronts; this file only parses and dispatches.

mod cmd;
mod log_filter;

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Parser)]
#[command(
    name = "kaiso",
    version,
    about = "Application-transparent hierarchical storage"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `kaiso_store=debug`.
    #[arg(long, global = true, env = "KAISO_LOG", default_value = "warn")]
    log: String,
    /// Emit logs as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount a store's union namespace through FUSE.
    Mount(cmd::mount::MountArgs),
    /// Take an existing directory tree in place as a tier, copying nothing.
    Adopt(cmd::mount::AdoptArgs),
    /// Reconcile the metadata database with the tiers' directories.
    Fsck(cmd::mount::FsckArgs),
    /// Per-tier usage, share of accesses, mover queue and rate.
    Status(cmd::ops::StatusArgs),
    /// Which tier holds PATH.
    Where(cmd::ops::PathArgs),
    /// Where PATH is and which rule put it there.
    Explain(cmd::ops::PathArgs),
    /// Keep PATH on its current (or a named) tier.
    Pin(cmd::ops::PinArgs),
    /// Release a pin.
    Unpin(cmd::ops::UnpinArgs),
    /// Move PATH to a faster tier now.
    Promote(cmd::ops::MoveArgs),
    /// Move PATH to a slower tier now.
    Demote(cmd::ops::MoveArgs),
    /// Record or inspect kaiso file-level access traces.
    #[command(subcommand)]
    Trace(cmd::trace::TraceCommand),
    /// Replay traces or generated workloads through the policy code.
    Sim(cmd::sim::SimArgs),
    /// Benchmarks that print ratios against a baseline measured in the same run.
    #[command(subcommand)]
    Bench(cmd::bench::BenchCommand),
    /// Post-copy migration of a live file server into a store.
    #[command(subcommand)]
    Migrate(cmd::migrate::MigrateCommand),
    /// Serve a store over network protocols (embedded NFSv3).
    Serve(cmd::serve::ServeArgs),
    /// Run an unmodified program with a process-private directory in a memory pool.
    Run(cmd::private::RunArgs),
    /// Inspect, export, import and repair private-directory pools.
    #[command(subcommand)]
    Private(cmd::private::PrivateCommand),
}

impl Command {
    /// Commands that ask, print and exit, holding nothing that needs cleaning up: when
    /// their reader goes away (`kaiso status | head`) they may simply die of SIGPIPE, as
    /// `ls` does. The others (mounts, servers, benchmarks, migrations) keep Rust's ignored
    /// SIGPIPE so a closed pipe never kills them with a mount or a copy half done.
    fn only_reports(&self) -> bool {
        matches!(
            self,
            Command::Status(_)
                | Command::Where(_)
                | Command::Explain(_)
                | Command::Pin(_)
                | Command::Unpin(_)
                | Command::Promote(_)
                | Command::Demote(_)
                | Command::Sim(_)
        )
    }
}

/// Restore SIGPIPE's default action (Rust starts programs with it ignored).
fn die_on_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_DFL installs no handler; called
    // before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A command that keeps SIGPIPE ignored and prints into a closed pipe panics in
/// `println!`; its unwinding still cleans up, but the panic message and backtrace would
/// say "kaiso crashed" where the reader merely stopped reading: leave that one out.
fn quiet_broken_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        let broken_stdout = msg.starts_with("failed printing to stdout")
            && msg.ends_with(&format!("(os error {})", libc::EPIPE));
        if !broken_stdout {
            default(info);
        }
    }));
}

/// glibc serves every allocation above its mmap threshold (128 KiB at start) with a fresh
/// mapping, so each 1 MiB network reply buffer of a migration source costs a page fault
/// per 4 KiB on first touch; and it returns freed heap memory above 128 KiB at once. With
/// larger thresholds such buffers are reused from the heap: the SMB source's client CPU
/// per GiB fell 30-50 % in benches/smb-probe, for 25-35 MiB more peak memory.
fn tune_malloc() {
    // SAFETY: mallopt only changes glibc's allocator parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

fn main() -> ExitCode {
    tune_malloc();
    quiet_broken_stdout();
    let cli = Cli::parse();
    if cli.command.only_reports() {
        die_on_sigpipe();
    }
    init_logging(&cli.log, cli.log_json);
    let result = match cli.command {
        Command::Mount(a) => cmd::mount::mount(a),
        Command::Adopt(a) => cmd::mount::adopt(a),
        Command::Fsck(a) => cmd::mount::fsck(a),
        Command::Status(a) => cmd::ops::status(a),
        Command::Where(a) => cmd::ops::where_is(a),
        Command::Explain(a) => cmd::ops::explain(a),
        Command::Pin(a) => cmd::ops::pin(a),
        Command::Unpin(a) => cmd::ops::unpin(a),
        Command::Promote(a) => cmd::ops::promote(a),
        Command::Demote(a) => cmd::ops::demote(a),
        Command::Trace(c) => cmd::trace::run(c),
        Command::Sim(a) => cmd::sim::run(a),
        Command::Bench(c) => cmd::bench::run(c),
        Command::Migrate(c) => cmd::migrate::run(c),
        Command::Serve(a) => cmd::serve::serve(a),
        Command::Run(a) => cmd::private::run_program(a),
        Command::Private(c) => cmd::private::run(c),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line a cause, outermost first: the operator sees what failed and why.
            eprintln!("kaiso: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::from(1)
        }
    }
}

/// Other crates' logs that are noise at their level, each kept unless the filter names
/// the crate (`--log fuser=trace` shows everything again):
/// - the `smb` crate's worker threads log the end of every connection at ERROR level, also
///   the ones kaiso closes on purpose; kaiso reports SMB failures itself (with the
///   server's address, from `kaiso_source::smb`);
/// - fuser warns "Unmount failed: Invalid argument" whenever the mount was unmounted from
///   outside (`fusermount3 -u`, the normal way to stop `kaiso mount`).
const QUIET_CRATES: [(&str, &str); 2] = [
    ("smb", "smb=off,smb_transport=off"),
    ("fuser", "fuser::mnt=error"),
];

fn init_logging(filter: &str, json: bool) {
    let quiet = |named: &str| -> String {
        QUIET_CRATES
            .iter()
            .filter(|(name, _)| !named.contains(name))
            .map(|(_, directive)| format!(",{directive}"))
            .collect()
    };
    let wanted = format!("{filter}{}", quiet(filter));
    let filter = tracing_subscriber::EnvFilter::try_new(&wanted)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("warn{}", quiet(""))));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .finish()
            .with(log_filter::DroppedReplies)
            .init();
    } else {
        builder.finish().with(log_filter::DroppedReplies).init();
    }
}
