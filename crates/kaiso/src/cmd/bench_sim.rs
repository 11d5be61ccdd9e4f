//! `kaiso bench sim`: our cache policies vs libCacheSim (PyPI `libcachesim`) on the same
//! generated traces (oracleGeneral files) at several cache sizes: miss ratios side by side
//! (must agree within 0.5 percentage points) and replay speed of both, measured in this run.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use kaiso_sim::validate::{self, Comparison, SHARED_POLICIES, TOLERANCE};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Requests per generated trace.
    #[arg(long, default_value_t = 2_000_000)]
    pub requests: u64,
    /// Cache sizes as fractions of each trace's footprint (objects).
    #[arg(long, default_value = "0.001,0.01,0.1")]
    pub sizes: String,
    /// Policies (those libCacheSim also has).
    #[arg(
        long,
        default_value = "fifo,lru,clock,arc,twoq,lirs,s3fifo,sieve,belady"
    )]
    pub policies: String,
    /// Runs per point; the fastest is reported for both simulators.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
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
    let tmp = tempfile_dir()?;
    let dir = a.out.clone().unwrap_or_else(|| tmp.clone());
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "generating traces ({} requests each) in {} …",
        a.requests,
        dir.display()
    );
    let traces = validate::write_traces(&dir, a.requests, a.seed)?;
    let pb = ProgressBar::new((traces.len() * policies.len() * fractions.len()) as u64);
    pb.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut all: Vec<Comparison> = Vec::new();
    for t in &traces {
        let objects: Vec<u64> = fractions
            .iter()
            .map(|f| ((t.footprint as f64 * f) as u64).max(1))
            .collect();
        let res = validate::compare(&a.python, t, &policies, &objects, a.repeat, |m| {
            pb.set_message(m.to_string());
            if m.contains(" @ ") {
                pb.inc(1);
            }
        })?;
        all.extend(res);
    }
    pb.finish_and_clear();
    println!(
        "{:<10} {:<7} {:>9} {:>9} {:>9} {:>7} {:>10} {:>10} {:>6}",
        "trace", "policy", "objects", "ours", "libCS", "Δ pp", "ours Mr/s", "libCS Mr/s", "speed"
    );
    for c in &all {
        println!(
            "{:<10} {:<7} {:>9} {:>9.4} {:>9.4} {:>7.3} {:>10.2} {:>10.2} {:>5.2}×{}",
            c.trace,
            c.policy,
            c.objects,
            c.ours,
            c.peer,
            c.diff() * 100.0,
            c.ours_mreq_s,
            c.peer_mreq_s,
            c.ours_mreq_s / c.peer_mreq_s.max(1e-9),
            match (c.excluded, c.diff() <= TOLERANCE) {
                (Some(_), _) => "  (excluded: libCacheSim limitation, see below)",
                (None, true) => "",
                (None, false) => "  DISAGREES",
            }
        );
    }
    println!("\nreplay speed by policy (geometric mean over traces and sizes, Mreq/s):");
    for p in &policies {
        let rows: Vec<&Comparison> = all.iter().filter(|c| c.policy == *p).collect();
        if rows.is_empty() {
            continue;
        }
        let g = |f: &dyn Fn(&Comparison) -> f64| {
            (rows.iter().map(|c| f(c).max(1e-9).ln()).sum::<f64>() / rows.len() as f64).exp()
        };
        let (o, l) = (g(&|c| c.ours_mreq_s), g(&|c| c.peer_mreq_s));
        println!(
            "  {p:<7} ours {o:6.2}  libCacheSim {l:6.2}  ratio {:.2}×",
            o / l
        );
    }
    let bad = all.iter().filter(|c| !c.agrees()).count();
    let excluded = all.iter().filter(|c| c.excluded.is_some()).count();
    println!(
        "\n{} of {} points agree within {:.1} pp; {excluded} excluded",
        all.len() - bad - excluded,
        all.len() - excluded,
        TOLERANCE * 100.0
    );
    if excluded > 0 {
        println!("excluded: {}", validate::LIRS_SMALL_CACHE);
    }
    if a.out.is_some() {
        kaiso_sim::report::write_json(&dir.join("comparison.json"), &all)?;
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(())
}

fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("kaiso-bench-sim-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
