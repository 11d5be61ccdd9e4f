//! `kaiso bench sim`: our cache policies vs libCacheSim (PyPI `libcachesim`) on the same
//! oracleGeneral traces (generated ones, plus any real trace given with `--trace`) at several
//! cache sizes in bytes: miss ratios side by side (must agree within 0.5 percentage points)
//! and replay speed of both, measured in this run (how: `kaiso_sim::validate::compare`).

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kaiso_sim::validate::{self, Comparison, SHARED_POLICIES};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Requests per generated trace.
    #[arg(long, default_value_t = 2_000_000)]
    pub requests: u64,
    /// Cache sizes as fractions of each trace's footprint (bytes of its distinct objects).
    #[arg(long, default_value = "0.001,0.01,0.1")]
    pub sizes: String,
    /// Policies (those libCacheSim also has).
    #[arg(
        long,
        default_value = "fifo,lru,clock,arc,twoq,lirs,s3fifo,sieve,belady"
    )]
    pub policies: String,
    /// Runs per point; the fastest (by thread CPU time) is reported for both simulators.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// A real trace to compare on too (uncompressed oracleGeneral; repeat the flag for more).
    #[arg(long = "trace")]
    pub traces: Vec<PathBuf>,
    /// Skip the generated traces (compare on the --trace files only).
    #[arg(long)]
    pub no_generated: bool,
    /// Python interpreter that has (or can pip-install) libcachesim.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// Keep the traces and write comparison.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

pub fn run(a: Args) -> Result<()> {
    let policies: Vec<&str> = a
        .policies
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    for p in &policies {
        if !SHARED_POLICIES.contains(p) {
            bail!(
                "{p} is not a policy both simulators have; choose from {}",
                SHARED_POLICIES.join(",")
            );
        }
    }
    let fractions: Vec<f64> = a
        .sizes
        .split(',')
        .map(|s| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|f| *f > 0.0 && *f <= 1.0)
                .with_context(|| format!("bad size {s:?}: a fraction in (0, 1]"))
        })
        .collect::<Result<_>>()?;
    validate::ensure_peer(&a.python)?;
    let dir = a.out.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kaiso-bench-sim-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "generating traces ({} requests each) in {} …",
        a.requests,
        dir.display()
    );
    let mut traces = if a.no_generated {
        Vec::new()
    } else {
        validate::write_traces(&dir, a.requests, a.seed)?
    };
    for path in &a.traces {
        traces.push(
            validate::ValidationTrace::from_file(path)
                .with_context(|| format!("reading {}", path.display()))?,
        );
    }
    if traces.is_empty() {
        bail!("no traces: give --trace FILE or drop --no-generated");
    }
    let pb = ProgressBar::new((traces.len() * policies.len() * fractions.len()) as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut all: Vec<Comparison> = Vec::new();
    for t in &traces {
        let sizes: Vec<u64> = fractions.iter().map(|f| t.cache_bytes(*f)).collect();
        let res = validate::compare(&a.python, t, &policies, &sizes, a.repeat, |m| {
            pb.set_message(m.to_string());
            if m.contains(" @ ") {
                pb.inc(1);
            }
        })?;
        all.extend(res);
    }
    pb.finish_and_clear();
    print!("{}", validate::report(&traces, &policies, &all));
    if a.out.is_some() {
        kaiso_sim::report::write_json(&dir.join("comparison.json"), &all)?;
    } else {
        // A temporary directory holding the generated traces only.
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
