//! Device emulation: an emulated tier adds the device model's service time (from
//! `kaiso-device`, the same models the simulator uses) on its data path by sleeping until
//! the modelled completion time. One model instance per tier, so requests queue.
//!
//! Foreground requests (the file system's users) and background requests (the mover's
//! copies) share that one queue, as they would on a real disk, but the mover's requests
//! are served at idle priority: a background request waits until the device has no
//! foreground request queued and none completed within the last [`FOREGROUND_GRACE`] (an
//! anticipatory window, so a user issuing request after request is not interleaved with
//! copies), for at most a bounded time, so moves still trickle on under full load. The
//! utilisation the store reports to the policy ([`Emulator::busy_fraction`]) counts only
//! foreground service time: the mover's own copies must not look like user load (they
//! would make it back off from itself, or trigger spike relief).

use crate::config::{DeviceConfig, DeviceKind};
use kaiso_device::{DeviceModel, DeviceSpec, IoOp, Nanos};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A background request is not issued until this long after the last foreground request
/// completed.
pub const FOREGROUND_GRACE: Duration = Duration::from_millis(5);

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

/// The model and what the emulator tracks beside it.
struct Device {
    model: Box<dyn DeviceModel>,
    /// When the last foreground request (or any queued before it) completes; None before
    /// the first.
    fg_until: Option<Nanos>,
    /// Service time of background requests issued so far (excluded from utilisation).
    bg_busy_ns: u64,
}

/// What one background request waited for and cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackgroundIo {
    /// Time spent yielding to foreground requests before it was issued.
    pub yielded: Duration,
    /// Whether it gave up yielding (the bound expired) and went ahead of a busy
    /// foreground.
    pub forced: bool,
}

/// A tier's emulated device.
pub struct Emulator {
    kind: &'static str,
    dev: Mutex<Device>,
    epoch: Instant,
    /// Size of the emulated address space; file offsets are folded into it.
    span: u64,
}

impl Emulator {
    pub fn new(cfg: &DeviceConfig) -> Result<Emulator, String> {
        let spec: DeviceSpec = spec_string(cfg)
            .parse()
            .map_err(|e: kaiso_device::SpecError| e.to_string())?;
        Ok(Emulator::from_spec(&spec))
    }

    fn from_spec(spec: &DeviceSpec) -> Emulator {
        let span = match spec {
            DeviceSpec::Hdd(p) => p.capacity_bytes.max(1),
            _ => u64::MAX,
        };
        Emulator {
            kind: spec.kind(),
            dev: Mutex::new(Device {
                model: spec.build(),
                fg_until: None,
                bg_busy_ns: 0,
            }),
            epoch: Instant::now(),
            span,
        }
    }

    pub fn kind(&self) -> &'static str {
        self.kind
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Device> {
        self.dev.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> Nanos {
        self.epoch.elapsed().as_nanos() as Nanos
    }

    /// Files are laid out at pseudo-random places: a hash of the object picks the start.
    fn address(&self, object: u64, offset: u64) -> u64 {
        let base = object.wrapping_mul(0x9E37_79B9_7F4A_7C15) % self.span;
        (base + offset % self.span) % self.span
    }

    fn sleep_until(&self, finish: Nanos) {
        let target = self.epoch + Duration::from_nanos(finish);
        let now = Instant::now();
        if target > now {
            std::thread::sleep(target - now);
        }
    }

    /// Serve one foreground request: sleeps for the modelled queueing + service time.
    /// `object` spreads different files over the device (their "location").
    pub fn io(&self, object: u64, offset: u64, len: u64, write: bool) {
        let op = if write { IoOp::Write } else { IoOp::Read };
        let addr = self.address(object, offset);
        let finish = {
            let mut d = self.lock();
            let now = self.now();
            let c = d.model.service(now, addr, len.max(1), op);
            d.fg_until = Some(d.fg_until.unwrap_or(0).max(c.finish));
            c.finish
        };
        self.sleep_until(finish);
    }

    /// Serve one background (mover) request at idle priority: first wait, at most
    /// `max_yield`, until no foreground request is queued or arrived within
    /// [`FOREGROUND_GRACE`], and the device has drained; then queue it and sleep until it
    /// completes. `stop` ends the wait early (shutdown).
    pub fn io_background(
        &self,
        object: u64,
        offset: u64,
        len: u64,
        write: bool,
        max_yield: Duration,
        stop: &dyn Fn() -> bool,
    ) -> BackgroundIo {
        let op = if write { IoOp::Write } else { IoOp::Read };
        let addr = self.address(object, offset);
        let grace = FOREGROUND_GRACE.as_nanos() as Nanos;
        let started = Instant::now();
        let mut out = BackgroundIo::default();
        let finish = loop {
            let mut d = self.lock();
            let now = self.now();
            // A user's next request usually follows its last one's completion closely.
            let fg_quiet_at = d.fg_until.map_or(0, |f| f.saturating_add(grace));
            let free_at = fg_quiet_at.max(d.model.idle_at());
            let waited = started.elapsed();
            if free_at <= now || waited >= max_yield || stop() {
                out.forced = free_at > now && !stop();
                let c = d.model.service(now, addr, len.max(1), op);
                d.bg_busy_ns += c.finish.saturating_sub(c.start);
                break c.finish;
            }
            drop(d);
            // Sleep until the device may be free, in short steps (a foreground request
            // arriving meanwhile moves that time on).
            let step = Duration::from_nanos(free_at - now)
                .min(Duration::from_millis(2))
                .min(max_yield - waited)
                .max(Duration::from_micros(100));
            std::thread::sleep(step);
        };
        out.yielded = started.elapsed();
        self.sleep_until(finish);
        out
    }

    /// The model's cumulative iostat counters (foreground and background requests).
    pub fn counters(&self) -> kaiso_device::IoCounters {
        let mut d = self.lock();
        let now = self.now();
        d.model.counters(now)
    }

    /// Foreground utilisation since the last call, 0..1 (iostat %util less the time the
    /// device spent on background requests). `since` holds (time, foreground busy ns).
    pub fn busy_fraction(&self, since: &mut (u64, u64)) -> f64 {
        let mut d = self.lock();
        let now = self.now();
        let bg = d.bg_busy_ns;
        let busy = d.model.counters(now).busy_ns.saturating_sub(bg);
        let (t0, b0) = *since;
        *since = (now, busy.max(b0));
        if now <= t0 {
            0.0
        } else {
            ((busy.saturating_sub(b0)) as f64 / (now - t0) as f64).clamp(0.0, 1.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn hdd() -> Emulator {
        Emulator::from_spec(&"hdd".parse::<DeviceSpec>().expect("hdd spec"))
    }

    const MIB: u64 = 1 << 20;

    /// Waits (at most 10 s) until a foreground request is in service on `e`: the users a
    /// test started are at work (not a guessed sleep: a loaded machine starts threads late).
    fn wait_foreground_in_service(e: &Emulator) {
        let t = Instant::now();
        while e.lock().fg_until.is_none_or(|f| f <= e.now()) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "no foreground request in service within 10 s"
            );
            std::thread::yield_now();
        }
    }

    #[test]
    fn background_io_waits_for_a_busy_foreground_and_is_bounded() {
        let e = Arc::new(hdd());
        let stop = Arc::new(AtomicBool::new(false));
        // Foreground users issuing request after request until the background request is
        // done (10 s at most); eight of them, so the queue stays full while a loaded
        // machine keeps most waiting for a CPU.
        let fg: Vec<_> = (0..8u64)
            .map(|u| {
                let (e, stop) = (e.clone(), stop.clone());
                std::thread::spawn(move || {
                    let t = Instant::now();
                    let mut i = u * 125;
                    while t.elapsed() < Duration::from_secs(10) && !stop.load(Ordering::SeqCst) {
                        e.io(1, (i * 7919 % 1000) * MIB, 64 << 10, false);
                        i += 1;
                    }
                })
            })
            .collect();
        wait_foreground_in_service(&e);
        let t = Instant::now();
        let r = e.io_background(2, 0, 256 << 10, false, Duration::from_millis(100), &|| {
            false
        });
        let took = t.elapsed();
        stop.store(true, Ordering::SeqCst);
        for user in fg {
            user.join().expect("foreground thread");
        }
        // It yielded for its whole bound, then went ahead anyway (a trickle, not a stall).
        assert!(r.forced, "{r:?}");
        assert!(r.yielded >= Duration::from_millis(100), "{r:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn background_io_on_an_idle_device_goes_at_once() {
        let e = hdd();
        let r = e.io_background(2, 0, 256 << 10, false, Duration::from_secs(5), &|| false);
        assert!(!r.forced);
        // At once, not after its 5 s bound (1 s: room for a loaded machine).
        assert!(r.yielded < Duration::from_secs(1), "{r:?}");
        // After a foreground request it waits for the request and the grace window only.
        let tries: Vec<BackgroundIo> = (0..5)
            .map(|_| {
                e.io(1, 0, 64 << 10, false);
                e.io_background(2, MIB, 256 << 10, false, Duration::from_secs(5), &|| false)
            })
            .collect();
        assert!(tries.iter().all(|r| !r.forced), "{tries:?}");
        assert!(
            tries.iter().all(|r| r.yielded < Duration::from_secs(1)),
            "{tries:?}"
        );
        // A foreground request still in service when the background one comes (seen in
        // service first, so no CPU delay can let it end before): the background request
        // waits at least the grace window after it, and goes unforced.
        std::thread::scope(|scope| {
            let fg = scope.spawn(|| e.io(1, 0, 8 * MIB, false));
            wait_foreground_in_service(&e);
            let r = e.io_background(2, MIB, 256 << 10, false, Duration::from_secs(5), &|| false);
            fg.join().unwrap();
            assert!(!r.forced, "{r:?}");
            assert!(
                r.yielded >= FOREGROUND_GRACE && r.yielded < Duration::from_secs(4),
                "expected a wait for the request in service and the grace window: {r:?}"
            );
        });
    }

    #[test]
    fn stop_ends_the_yield() {
        let e = hdd();
        e.io(1, 0, 64 << 10, false);
        let t = Instant::now();
        e.io_background(2, MIB, 4096, false, Duration::from_secs(30), &|| true);
        // At once, not after the 30 s bound (10 s: room for any loaded machine).
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    }

    #[test]
    fn utilisation_counts_foreground_only() {
        let e = hdd();
        let mut since = (0, 0);
        e.busy_fraction(&mut since);
        // Background copies only: the device works, the foreground utilisation stays 0.
        for i in 0..4 {
            e.io_background(2, i * MIB, MIB, false, Duration::from_millis(10), &|| false);
        }
        let bg_only = e.busy_fraction(&mut since);
        assert!(
            bg_only < 0.05,
            "background counted as foreground: {bg_only}"
        );
        // Foreground requests back to back (eight users, so the queue stays full while a
        // loaded machine keeps most waiting for a CPU): utilisation near 1. The window
        // opens once a request is in service (threads a loaded machine starts late do not
        // count as idle time) and closes when the last user is done.
        std::thread::scope(|scope| {
            for u in 0..8u64 {
                let e = &e;
                scope.spawn(move || {
                    let t = Instant::now();
                    let mut i = u * 125;
                    while t.elapsed() < Duration::from_millis(300) {
                        e.io(1, (i * 7919 % 1000) * MIB, 64 << 10, false);
                        i += 1;
                    }
                });
            }
            wait_foreground_in_service(&e);
            e.busy_fraction(&mut since);
        });
        let fg = e.busy_fraction(&mut since);
        assert!(fg > 0.7, "foreground utilisation {fg}");
    }
}
