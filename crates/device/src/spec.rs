//! Naming a device model on a command line or in a configuration file.
//!
//! Short form: `KIND[:key=value,...]`, e.g. `hdd`, `hdd:rpm=5400,capacity_gb=600`,
//! `ssd:read_latency_us=80`, `nvm`, `link:rtt_ms=20,mb_per_sec=50`. Keys are the field
//! names of the parameter structs (plus `capacity_gb` for HDDs). In TOML the same thing is
//! a table with `kind = "hdd"` and the fields.

use crate::hdd::RotationModel;
use crate::{DeviceModel, HddModel, HddParams, LinkParams, ParallelModel, ParallelParams};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A device model and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DeviceSpec {
    Hdd(HddParams),
    Ssd(ParallelParams),
    Nvm(ParallelParams),
    Link(LinkParams),
}

/// Why a device description was rejected.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SpecError {
    #[error("unknown device kind {0:?} (expected hdd, ssd, nvm or link)")]
    UnknownKind(String),
    #[error("device {kind}: unknown parameter {key:?}")]
    UnknownKey { kind: String, key: String },
    #[error("device {kind}: parameter {key} needs a non-negative number, got {value:?}")]
    BadValue {
        kind: String,
        key: String,
        value: String,
    },
    #[error("device {kind}: expected key=value, got {0:?}", kind = .1)]
    Malformed(String, String),
}

impl DeviceSpec {
    /// A fresh model (empty queue, zero counters).
    pub fn build(&self) -> Box<dyn DeviceModel> {
        match self {
            DeviceSpec::Hdd(p) => Box::new(HddModel::new(p.clone())),
            DeviceSpec::Ssd(p) => Box::new(ParallelModel::ssd(p.clone())),
            DeviceSpec::Nvm(p) => Box::new(ParallelModel::nvm(p.clone())),
            DeviceSpec::Link(p) => Box::new(ParallelModel::link(p)),
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            DeviceSpec::Hdd(_) => "hdd",
            DeviceSpec::Ssd(_) => "ssd",
            DeviceSpec::Nvm(_) => "nvm",
            DeviceSpec::Link(_) => "link",
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Hdd(p) => write!(
                f,
                "hdd:capacity_bytes={},rpm={},track_to_track_ms={},full_stroke_ms={},outer_mb_per_sec={},inner_mb_per_sec={},overhead_us={},write_settle_us={},reorder_exponent={},rotation={}",
                p.capacity_bytes,
                p.rpm,
                p.track_to_track_ms,
                p.full_stroke_ms,
                p.outer_mb_per_sec,
                p.inner_mb_per_sec,
                p.overhead_us,
                p.write_settle_us,
                p.reorder_exponent,
                match p.rotation {
                    RotationModel::Positional => "positional",
                    RotationModel::HalfRevolution => "half_revolution",
                }
            ),
            DeviceSpec::Ssd(p) | DeviceSpec::Nvm(p) => write!(
                f,
                "{}:slots={},read_latency_us={},write_latency_us={},read_mb_per_sec={},write_mb_per_sec={}",
                self.kind(),
                p.slots,
                p.read_latency_us,
                p.write_latency_us,
                p.read_mb_per_sec,
                p.write_mb_per_sec
            ),
            DeviceSpec::Link(p) => write!(
                f,
                "link:rtt_ms={},mb_per_sec={},server_us={},window={}",
                p.rtt_ms, p.mb_per_sec, p.server_us, p.window
            ),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, SpecError> {
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        let kind = kind.trim().to_ascii_lowercase();
        let mut spec = match kind.as_str() {
            "hdd" => DeviceSpec::Hdd(HddParams::default()),
            "ssd" => DeviceSpec::Ssd(ParallelParams::ssd()),
            "nvm" => DeviceSpec::Nvm(ParallelParams::nvm()),
            "link" => DeviceSpec::Link(LinkParams::default()),
            _ => return Err(SpecError::UnknownKind(kind)),
        };
        for pair in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| SpecError::Malformed(pair.to_string(), kind.clone()))?;
            let (key, value) = (key.trim(), value.trim());
            if key == "rotation" {
                let DeviceSpec::Hdd(p) = &mut spec else {
                    return Err(unknown(&kind, key));
                };
                p.rotation = match value {
                    "positional" => RotationModel::Positional,
                    "half_revolution" => RotationModel::HalfRevolution,
                    _ => return Err(bad(&kind, key, value)),
                };
                continue;
            }
            let v: f64 = value
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| bad(&kind, key, value))?;
            set(&mut spec, &kind, key, v)?;
        }
        Ok(spec)
    }
}

fn unknown(kind: &str, key: &str) -> SpecError {
    SpecError::UnknownKey {
        kind: kind.to_string(),
        key: key.to_string(),
    }
}

fn bad(kind: &str, key: &str, value: &str) -> SpecError {
    SpecError::BadValue {
        kind: kind.to_string(),
        key: key.to_string(),
        value: value.to_string(),
    }
}

fn set(spec: &mut DeviceSpec, kind: &str, key: &str, v: f64) -> Result<(), SpecError> {
    match spec {
        DeviceSpec::Hdd(p) => match key {
            "capacity_bytes" => p.capacity_bytes = v as u64,
            "capacity_gb" => p.capacity_bytes = (v * 1e9) as u64,
            "rpm" => p.rpm = v.max(1.0),
            "track_to_track_ms" => p.track_to_track_ms = v,
            "full_stroke_ms" => p.full_stroke_ms = v,
            "outer_mb_per_sec" => p.outer_mb_per_sec = v,
            "inner_mb_per_sec" => p.inner_mb_per_sec = v,
            "overhead_us" => p.overhead_us = v,
            "write_settle_us" => p.write_settle_us = v,
            "reorder_exponent" => p.reorder_exponent = v,
            _ => return Err(unknown(kind, key)),
        },
        DeviceSpec::Ssd(p) | DeviceSpec::Nvm(p) => match key {
            "slots" => p.slots = v as u32,
            "read_latency_us" => p.read_latency_us = v,
            "write_latency_us" => p.write_latency_us = v,
            "read_mb_per_sec" => p.read_mb_per_sec = v,
            "write_mb_per_sec" => p.write_mb_per_sec = v,
            _ => return Err(unknown(kind, key)),
        },
        DeviceSpec::Link(p) => match key {
            "rtt_ms" => p.rtt_ms = v,
            "mb_per_sec" => p.mb_per_sec = v,
            "server_us" => p.server_us = v,
            "window" => p.window = v as u32,
            _ => return Err(unknown(kind, key)),
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::IoOp;

    #[test]
    fn parses_short_forms() {
        assert_eq!(
            "hdd".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Hdd(HddParams::default())
        );
        let DeviceSpec::Hdd(p) = "hdd:rpm=5400,capacity_gb=600".parse().unwrap() else {
            panic!()
        };
        assert_eq!(p.rpm, 5400.0);
        assert_eq!(p.capacity_bytes, 600_000_000_000);
        let DeviceSpec::Link(l) = "link:rtt_ms=20, mb_per_sec=50".parse().unwrap() else {
            panic!()
        };
        assert_eq!((l.rtt_ms, l.mb_per_sec), (20.0, 50.0));
        assert_eq!("NVM".parse::<DeviceSpec>().unwrap().kind(), "nvm");
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        assert!(matches!(
            "tape".parse::<DeviceSpec>(),
            Err(SpecError::UnknownKind(_))
        ));
        assert!(matches!(
            "ssd:rpm=1".parse::<DeviceSpec>(),
            Err(SpecError::UnknownKey { .. })
        ));
        assert!(matches!(
            "hdd:rpm=fast".parse::<DeviceSpec>(),
            Err(SpecError::BadValue { .. })
        ));
        assert!(matches!(
            "hdd:rpm=-5".parse::<DeviceSpec>(),
            Err(SpecError::BadValue { .. })
        ));
        assert!(matches!(
            "hdd:rpm".parse::<DeviceSpec>(),
            Err(SpecError::Malformed(..))
        ));
        let msg = "ssd:bogus=1".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(msg.contains("bogus"), "{msg}");
    }

    #[test]
    fn display_round_trips_and_toml_embeds() {
        for s in [
            "hdd:rpm=10000,rotation=half_revolution",
            "ssd:slots=4",
            "nvm",
            "link:rtt_ms=3",
        ] {
            let spec: DeviceSpec = s.parse().unwrap();
            let again: DeviceSpec = spec.to_string().parse().unwrap();
            assert_eq!(spec, again);
        }
        let t: DeviceSpec = toml::from_str("kind = \"hdd\"\nrpm = 5400.0\n").unwrap();
        let DeviceSpec::Hdd(p) = &t else { panic!() };
        assert_eq!(p.rpm, 5400.0);
        assert_eq!(p.full_stroke_ms, 15.0, "defaults fill the rest");
        let mut m = t.build();
        assert_eq!(m.kind(), "hdd");
        assert!(m.service(0, 0, 4096, IoOp::Read).finish > 0);
    }
}
