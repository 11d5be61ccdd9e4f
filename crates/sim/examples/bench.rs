//! The libCacheSim comparison of `kaiso bench sim` without the full `kaiso` binary (same
//! library code, same output):
//! `cargo run --release -p kaiso-sim --example bench -- [--requests N] [--sizes 0.001,0.01,0.1]
//!  [--repeat N] [--trace FILE.oracleGeneral]... [--no-generated] [--seed N] [--keep DIR]`

use kaiso_sim::validate::{self, SHARED_POLICIES, ValidationTrace};
use std::path::PathBuf;

fn main() {
    if let Err(e) = run() {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let mut requests = 1_000_000u64;
    let mut sizes = vec![0.001, 0.01, 0.1];
    let mut repeat = 3u32;
    let mut seed = 1u64;
    let mut files: Vec<PathBuf> = Vec::new();
    let mut generated = true;
    let mut keep: Option<PathBuf> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--requests" => requests = value()?.parse().map_err(|e| format!("{a}: {e}"))?,
            "--repeat" => repeat = value()?.parse().map_err(|e| format!("{a}: {e}"))?,
            "--seed" => seed = value()?.parse().map_err(|e| format!("{a}: {e}"))?,
            "--sizes" => {
                sizes = value()?
                    .split(',')
                    .map(|s| match s.trim().parse::<f64>() {
                        Ok(f) if f > 0.0 && f <= 1.0 => Ok(f),
                        _ => Err(format!("bad size {s:?}: a fraction in (0, 1]")),
                    })
                    .collect::<Result<_, _>>()?
            }
            "--trace" => files.push(PathBuf::from(value()?)),
            "--no-generated" => generated = false,
            "--keep" => keep = Some(PathBuf::from(value()?)),
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    validate::ensure_peer("python3").map_err(|e| e.to_string())?;
    let dir = keep.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("kaiso-sim-bench-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut traces = if generated {
        validate::write_traces(&dir, requests, seed).map_err(|e| e.to_string())?
    } else {
        Vec::new()
    };
    for f in &files {
        traces.push(ValidationTrace::from_file(f).map_err(|e| e.to_string())?);
    }
    let mut all = Vec::new();
    for t in &traces {
        let bytes: Vec<u64> = sizes.iter().map(|f| t.cache_bytes(*f)).collect();
        eprintln!("{} …", t.name);
        all.extend(
            validate::compare("python3", t, SHARED_POLICIES, &bytes, repeat, |_| {})
                .map_err(|e| e.to_string())?,
        );
    }
    print!("{}", validate::report(&traces, SHARED_POLICIES, &all));
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
