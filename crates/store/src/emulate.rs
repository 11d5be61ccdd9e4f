//! Device emulation: an emulated tier adds the device model's service time (from
//! `kaiso-device`, the same models the simulator uses) on its data path by sleeping until
//! the modelled completion time. One model instance per tier, so requests queue.

use crate::config::{DeviceConfig, DeviceKind};
use kaiso_device::{DeviceModel, DeviceSpec, IoOp};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The spec string kaiso-device parses (`hdd:rpm=5400,...`).
fn spec_string(cfg: &DeviceConfig) -> String {
    let kind = match cfg.kind {
        DeviceKind::Hdd => "hdd",
        DeviceKind::Ssd => "ssd",
        DeviceKind::Nvm => "nvm",
    };
    let params: Vec<String> = cfg
        .params
        .iter()
        .map(|(k, v)| match v {
            toml::Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect();
    if params.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}:{}", params.join(","))
    }
}

/// Check a device table (used by config validation).
pub fn validate(cfg: &DeviceConfig) -> Result<(), String> {
    spec_string(cfg)
        .parse::<DeviceSpec>()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A tier's emulated device.
pub struct Emulator {
    kind: &'static str,
    model: Mutex<Box<dyn DeviceModel>>,
    epoch: Instant,
    /// Size of the emulated address space; file offsets are folded into it.
    span: u64,
}

impl Emulator {
    pub fn new(cfg: &DeviceConfig) -> Result<Emulator, String> {
        let spec: DeviceSpec = spec_string(cfg)
            .parse()
            .map_err(|e: kaiso_device::SpecError| e.to_string())?;
        let span = match &spec {
            DeviceSpec::Hdd(p) => p.capacity_bytes.max(1),
            _ => u64::MAX,
        };
        Ok(Emulator {
            kind: spec.kind(),
            model: Mutex::new(spec.build()),
            epoch: Instant::now(),
            span,
        })
    }

    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// Serve one request: sleeps for the modelled queueing + service time.
    /// `object` spreads different files over the device (their "location").
    pub fn io(&self, object: u64, offset: u64, len: u64, write: bool) {
        let op = if write { IoOp::Write } else { IoOp::Read };
        // Files are laid out at pseudo-random places: a hash of the object picks the start.
        let base = object.wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.span;
        let addr = (base + offset) % self.span;
        let finish = {
            let mut m = self.model.lock().unwrap_or_else(|e| e.into_inner());
            let now = self.epoch.elapsed().as_nanos() as u64;
            m.service(now, addr, len.max(1), op).finish
        };
        let target = self.epoch + Duration::from_nanos(finish);
        let now = Instant::now();
        if target > now {
            std::thread::sleep(target - now);
        }
    }

    /// Device utilisation since the last call, 0..1 (iostat %util).
    pub fn busy_fraction(&self, since: &mut (u64, u64)) -> f64 {
        let mut m = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let now = self.epoch.elapsed().as_nanos() as u64;
        let c = m.counters(now);
        let (t0, b0) = *since;
        let busy = c.busy_ns;
        *since = (now, busy);
        if now <= t0 {
            0.0
        } else {
            ((busy.saturating_sub(b0)) as f64 / (now - t0) as f64).clamp(0.0, 1.0)
        }
    }
}
