//! Time of `Store::open` for a store whose tier already holds many files (issue 4: time
//! from `migrate start` to serving; `Store::open` walks every tier before anything is
//! served).
//!
//! Under `--dir DIR` (kept between runs; default a temporary directory) the tier `DIR/t0`
//! is filled once with `--dirs` directories `d0..` of `--files` empty files `f0..` each,
//! created directly in the tier directory; a second tier `DIR/t1` stays empty unless
//! `--slow-files N` puts N files in its `d0`. The first open adopts them (its time is
//! printed as `adopt`), then the store is opened `--runs` times more; each time is the
//! wall-clock time of `Store::open` (the store is dropped between opens, outside the
//! timing). With `--tree-only` the tree is made and nothing is opened.
//!
//! Run: `cargo run --release -p kaiso-store --example open_scan -- [--dir DIR]
//! [--dirs 200] [--files 1000] [--runs 5] [--slow-files 0] [--tree-only]`

use kaiso_store::{Store, StoreConfig};
use std::path::{Path, PathBuf};
use std::time::Instant;

struct Args {
    dir: Option<PathBuf>,
    dirs: usize,
    files: usize,
    runs: usize,
    slow_files: usize,
    tree_only: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        dir: None,
        dirs: 200,
        files: 1000,
        runs: 5,
        slow_files: 0,
        tree_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{k} needs a value"))
        };
        match k.as_str() {
            "--dir" => a.dir = Some(PathBuf::from(val()?)),
            "--dirs" => a.dirs = val()?.parse()?,
            "--files" => a.files = val()?.parse()?,
            "--runs" => a.runs = val()?.parse()?,
            "--slow-files" => a.slow_files = val()?.parse()?,
            "--tree-only" => a.tree_only = true,
            _ => anyhow::bail!("unknown argument {k}"),
        }
    }
    Ok(a)
}

/// `dirs` × `files` empty files under `root`, unless a marker says they are there.
fn make_tree(root: &Path, dirs: usize, files: usize) -> anyhow::Result<()> {
    let marker = root.with_extension(format!("made-{dirs}x{files}"));
    if marker.exists() {
        return Ok(());
    }
    let t = Instant::now();
    for d in 0..dirs {
        let dp = root.join(format!("d{d}"));
        std::fs::create_dir_all(&dp)?;
        for f in 0..files {
            std::fs::File::create(dp.join(format!("f{f}")))?;
        }
    }
    std::fs::write(&marker, b"")?;
    println!(
        "tree: {} files in {dirs} directories made in {:.1} s",
        dirs * files,
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// User + system CPU seconds of this process so far (all threads).
fn cpu_secs() -> f64 {
    // SAFETY: getrusage fills the struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() -> anyhow::Result<()> {
    let a = args()?;
    let tmp;
    let root = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(root.join("t0"))?;
    std::fs::create_dir_all(root.join("t1"))?;
    make_tree(&root.join("t0"), a.dirs, a.files)?;
    if a.slow_files > 0 {
        make_tree(&root.join("t1"), 1, a.slow_files)?;
    }
    if a.tree_only {
        return Ok(());
    }
    let text = format!(
        "[store]\nstate_dir = \"{}\"\n[store.mover]\nenabled = false\n\
         [[tier]]\nname = \"t0\"\npath = \"{}\"\ncapacity = \"8GiB\"\n\
         [[tier]]\nname = \"t1\"\npath = \"{}\"\ncapacity = \"8GiB\"\n",
        root.join("state").display(),
        root.join("t0").display(),
        root.join("t1").display()
    );
    let cfg = StoreConfig::from_toml_str(&text, "bench.toml")?;
    let mut times = Vec::new();
    for run in 0..=a.runs {
        let (t, cpu) = (Instant::now(), cpu_secs());
        let store = Store::open(cfg.clone())?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let cpu_ms = (cpu_secs() - cpu) * 1e3;
        let label = if run == 0 { "adopt" } else { "open" };
        println!("{label} {run}: {ms:.1} ms, CPU {cpu_ms:.1} ms");
        if run > 0 {
            times.push((ms, cpu_ms));
        }
        drop(store);
    }
    if !times.is_empty() {
        let n = times.len();
        let mut wall: Vec<f64> = times.iter().map(|t| t.0).collect();
        let mut cpu: Vec<f64> = times.iter().map(|t| t.1).collect();
        wall.sort_by(f64::total_cmp);
        cpu.sort_by(f64::total_cmp);
        println!(
            "open of {} files: wall min {:.1} / median {:.1} / max {:.1} ms, \
             CPU min {:.1} / median {:.1} ms ({n} runs)",
            a.dirs * a.files + a.slow_files,
            wall[0],
            wall[n / 2],
            wall[n - 1],
            cpu[0],
            cpu[n / 2],
        );
    }
    Ok(())
}
