//! Where records come from: a trace file or a named generator with parameters.
//!
//! Generator specs: `NAME[:key=value,...]`
//! - `usr1`, `web2`, `proj2`, `proj4`, `proj4-spike`, `proj4-short`: MSR-like volumes
//!   (keys: `duration` seconds, default 3600);
//! - `tpcxv`: TPCx-V-like open-loop stream (keys: `tps` transactions/s, default 200;
//!   `phase` seconds, default 60; `phases`, default 20);
//! - `files`: Zipf file workload with scans (keys: `files`, `zipf`, `requests`, `scan`
//!   probability, `scan_files`, `io` bytes, `writes` fraction);
//! - `zipf`: fixed-size objects drawn Zipf (keys: `objects`, `alpha`, `requests`, `size`
//!   bytes), the synthetic trace libCacheSim comparisons use.

use crate::replay::cache::{Granularity, parse_size};
use crate::trace::{self, IoRecord, RecordStream, TraceError, TraceFormat};
use crate::workload::files::FileWorkloadSpec;
use crate::workload::tpcxv::{Tpcxv, TpcxvSpec};
use crate::workload::volume::VolumeSpec;
use std::path::PathBuf;

#[derive(Clone, Debug)]
pub enum Generator {
    Volume(VolumeSpec),
    Tpcxv { spec: TpcxvSpec, tps: f64 },
    Files(FileWorkloadSpec),
}

#[derive(Clone, Debug)]
pub enum Source {
    File { path: PathBuf, format: TraceFormat },
    Generated { generator: Generator, seed: u64 },
}

fn kv(params: &str) -> Result<Vec<(String, f64)>, String> {
    params
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("expected key=value, got {p:?}"))?;
            // A plain number keeps its fraction (alpha=0.8); a size may carry a unit (io=64k).
            let v = v
                .trim()
                .parse::<f64>()
                .ok()
                .or_else(|| parse_size(v).map(|x| x as f64));
            match v {
                Some(v) if v.is_finite() && v >= 0.0 => Ok((k.trim().to_string(), v)),
                _ => Err(format!("{k}: expected a non-negative number")),
            }
        })
        .collect()
}

impl Generator {
    pub const NAMES: &'static [&'static str] = &[
        "usr1",
        "web2",
        "proj2",
        "proj4",
        "proj4-spike",
        "proj4-short",
        "tpcxv",
        "files",
        "zipf",
    ];

    pub fn parse(spec: &str) -> Result<Generator, String> {
        let (name, params) = spec.split_once(':').unwrap_or((spec, ""));
        let params = kv(params)?;
        let unknown = |k: &str| Err(format!("generator {name} has no parameter {k:?}"));
        if let Some(mut v) = VolumeSpec::preset(name) {
            for (k, x) in params {
                match k.as_str() {
                    "duration" => v.duration_s = x,
                    _ => return unknown(&k),
                }
            }
            return Ok(Generator::Volume(v));
        }
        match name {
            "tpcxv" => {
                let (mut spec, mut tps) = (TpcxvSpec::default(), 200.0);
                for (k, x) in params {
                    match k.as_str() {
                        "tps" => tps = x.max(0.001),
                        "phase" => spec.phase_s = x.max(1.0),
                        "phases" => spec.phases = (x as u32).max(1),
                        _ => return unknown(&k),
                    }
                }
                Ok(Generator::Tpcxv { spec, tps })
            }
            "files" | "zipf" => {
                let mut s = FileWorkloadSpec::default();
                if name == "zipf" {
                    s.min_file_bytes = 4096;
                    s.max_file_bytes = 4096;
                    s.io_bytes = 4096;
                    s.scan_probability = 0.0;
                    s.write_fraction = 0.0;
                    s.zipf = 0.8;
                }
                for (k, x) in params {
                    match k.as_str() {
                        "files" | "objects" => s.files = (x as u64).max(1),
                        "zipf" | "alpha" => s.zipf = x,
                        "requests" => s.requests = x as u64,
                        "scan" => s.scan_probability = x.min(1.0),
                        "scan_files" => s.scan_files = (x as u64).max(1),
                        "io" => s.io_bytes = (x as u64).max(1),
                        "size" => {
                            s.min_file_bytes = (x as u64).max(1);
                            s.max_file_bytes = (x as u64).max(1);
                            s.io_bytes = (x as u64).max(1);
                        }
                        "writes" => s.write_fraction = x.min(1.0),
                        _ => return unknown(&k),
                    }
                }
                Ok(Generator::Files(s))
            }
            _ => Err(format!(
                "unknown generator {name:?}; known: {}",
                Generator::NAMES.join(", ")
            )),
        }
    }

    /// The generated records.
    pub fn records(&self, seed: u64) -> Box<dyn Iterator<Item = IoRecord> + Send> {
        match self {
            Generator::Volume(v) => Box::new(v.generate(seed)),
            Generator::Files(f) => Box::new(f.generate(seed)),
            Generator::Tpcxv { spec, tps } => {
                let w = Tpcxv::new(spec.clone(), seed);
                let recs: Vec<IoRecord> = w.records(seed, *tps).collect();
                Box::new(recs.into_iter())
            }
        }
    }

    /// Block traces default to 4 KiB blocks; file and object workloads to whole objects.
    pub fn default_granularity(&self) -> Granularity {
        match self {
            Generator::Volume(_) | Generator::Tpcxv { .. } => Granularity::Block(4096),
            Generator::Files(_) => Granularity::Object,
        }
    }
}

impl Source {
    pub fn records(&self) -> Result<RecordStream, TraceError> {
        match self {
            Source::File { path, format } => {
                trace::open(path, *format).map_err(|source| TraceError::Io {
                    format: "trace",
                    source,
                })
            }
            Source::Generated { generator, seed } => Ok(Box::new(generator.records(*seed).map(Ok))),
        }
    }

    pub fn default_granularity(&self) -> Granularity {
        match self {
            Source::File {
                format: TraceFormat::OracleGeneral | TraceFormat::Kaiso,
                ..
            } => Granularity::Object,
            Source::File { .. } => Granularity::Block(4096),
            Source::Generated { generator, .. } => generator.default_granularity(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Source::File { path, format } => format!("{} ({format:?})", path.display()),
            Source::Generated { generator, seed } => {
                let name = match generator {
                    Generator::Volume(v) => v.name.clone(),
                    Generator::Tpcxv { .. } => "tpcxv".into(),
                    Generator::Files(_) => "files".into(),
                };
                format!("generated {name} (seed {seed})")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generator_specs_parse_and_reject_bad_input() {
        assert!(
            matches!(Generator::parse("usr1:duration=60"), Ok(Generator::Volume(v)) if v.duration_s == 60.0)
        );
        assert!(
            matches!(Generator::parse("zipf:objects=10,alpha=1.0,requests=100"), Ok(Generator::Files(f)) if f.files == 10 && f.requests == 100)
        );
        assert!(
            Generator::parse("usr1:bogus=1")
                .unwrap_err()
                .contains("bogus")
        );
        assert!(
            Generator::parse("tape")
                .unwrap_err()
                .contains("unknown generator")
        );
        assert!(Generator::parse("zipf:alpha=x").is_err());
        // Fractions stay fractions; sizes may have units.
        assert!(
            matches!(Generator::parse("files:zipf=0.8,scan=0.002,io=64k"), Ok(Generator::Files(f)) if f.zipf == 0.8 && f.scan_probability == 0.002 && f.io_bytes == 65536)
        );
        let g = Generator::parse("zipf:objects=50,requests=1000").unwrap();
        assert_eq!(g.records(1).count(), 1000);
    }
}
