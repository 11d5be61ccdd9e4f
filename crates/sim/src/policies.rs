//! Tiering policies by name, for `kaiso sim tier` and the reproduction experiments.

use kaiso_policy::PlacementPolicy;
use kaiso_policy::default_policy::{KaisoConfig, KaisoPolicy};
use kaiso_policy::prefetch::{PrefetchConfig, PrefetchPolicy, RateMode, RegionLayout, UnitMode};
use kaiso_policy::spike::{SpikeConfig, SpikePolicy};

/// Names accepted by [`placement`], besides `none` and `writeback:<cache policy>` which
/// `kaiso sim tier` handles itself.
pub const PLACEMENT_NAMES: &[&str] = &[
    "spike",
    "spike-persistent",
    "kaiso",
    "prefetch-la-adaptive",
    "prefetch-la-fixed",
    "prefetch-lba-adaptive",
    "prefetch-lba-fixed",
];

/// What a policy may know about the workload besides its accesses.
#[derive(Clone, Debug, Default)]
pub struct PolicyContext {
    /// Regions are chunks of files laid out as this says (layout-aware prefetch, and the
    /// default policy's cache units).
    pub layout: Option<RegionLayout>,
    /// Workload time compression for the default policy (`time_scale`); None keeps 1.0.
    pub time_scale: Option<f64>,
}

/// Build a tiering policy: `spike` (the 002 rule, paper defaults), `spike-persistent`
/// (with the §5.4 persistent-IO rule), `kaiso` (the default policy), the ch.3 prefetchers
/// `prefetch-{la,lba}-{adaptive,fixed}` (fixed r = 0.4 as in the thesis's Fig. 3.7;
/// layout-aware ones need a layout).
pub fn placement(name: &str) -> Result<Box<dyn PlacementPolicy>, String> {
    placement_with(name, &PolicyContext::default())
}

/// [`placement`] with what the caller knows about the workload.
pub fn placement_with(name: &str, ctx: &PolicyContext) -> Result<Box<dyn PlacementPolicy>, String> {
    Ok(match name {
        "spike" | "spike-002" => Box::new(SpikePolicy::new(SpikeConfig::default())?),
        "spike-persistent" | "spike-002-persistent" => Box::new(SpikePolicy::new(SpikeConfig {
            persistent_io: true,
            ..SpikeConfig::default()
        })?),
        "kaiso" | "default" => {
            let cfg = KaisoConfig {
                time_scale: ctx.time_scale.unwrap_or(1.0),
                ..KaisoConfig::default()
            };
            let mut p = KaisoPolicy::new(cfg).map_err(|e| e.0)?;
            if let Some(l) = &ctx.layout {
                p.set_layout(l.clone());
            }
            Box::new(p)
        }
        n if n.starts_with("prefetch-") => {
            let (mode, rate) = match n {
                "prefetch-la-adaptive" => (UnitMode::LayoutAware, RateMode::Adaptive),
                "prefetch-la-fixed" => (UnitMode::LayoutAware, RateMode::Fixed(0.4)),
                "prefetch-lba-adaptive" => (UnitMode::Lba, RateMode::Adaptive),
                "prefetch-lba-fixed" => (UnitMode::Lba, RateMode::Fixed(0.4)),
                _ => return Err(unknown(name)),
            };
            let layout = match mode {
                UnitMode::LayoutAware => Some(ctx.layout.clone().ok_or_else(|| {
                    format!(
                        "{name} needs a file layout (only generated tpcxv/files workloads have one)"
                    )
                })?),
                UnitMode::Lba => None,
            };
            let cfg = PrefetchConfig {
                unit_mode: mode,
                rate_mode: rate,
                ..PrefetchConfig::default()
            };
            Box::new(PrefetchPolicy::new(cfg, layout)?)
        }
        _ => return Err(unknown(name)),
    })
}

fn unknown(name: &str) -> String {
    format!(
        "unknown tiering policy {name:?}; known: none, writeback:<cache policy>, cache:<cache policy>, {}",
        PLACEMENT_NAMES.join(", ")
    )
}

/// A policy shared between the replay engine and a feedback closure (e.g. the ch.3
/// prefetcher's `observe_transactions`, fed from the time series while the engine runs).
pub struct Shared<P> {
    name: String,
    inner: std::sync::Arc<std::sync::Mutex<P>>,
}

impl<P: PlacementPolicy> Shared<P> {
    pub fn new(policy: P) -> Self {
        Shared {
            name: policy.name().to_string(),
            inner: std::sync::Arc::new(std::sync::Mutex::new(policy)),
        }
    }
    /// Another handle to the same policy.
    pub fn handle(&self) -> std::sync::Arc<std::sync::Mutex<P>> {
        self.inner.clone()
    }
    fn lock(&self) -> std::sync::MutexGuard<'_, P> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<P: PlacementPolicy> PlacementPolicy for Shared<P> {
    fn name(&self) -> &str {
        &self.name
    }
    fn record(&mut self, access: &kaiso_policy::Access) {
        self.lock().record(access)
    }
    fn placed(&mut self, object: kaiso_policy::ObjectId, size: u64, tier: kaiso_policy::TierId) {
        self.lock().placed(object, size, tier)
    }
    fn forget(&mut self, object: kaiso_policy::ObjectId) {
        self.lock().forget(object)
    }
    fn pin(&mut self, object: kaiso_policy::ObjectId, tier: Option<kaiso_policy::TierId>) {
        self.lock().pin(object, tier)
    }
    fn place_new(
        &mut self,
        now: kaiso_policy::Nanos,
        size_hint: u64,
        tiers: &[kaiso_policy::TierState],
    ) -> kaiso_policy::TierId {
        self.lock().place_new(now, size_hint, tiers)
    }
    fn plan(
        &mut self,
        now: kaiso_policy::Nanos,
        tiers: &[kaiso_policy::TierState],
        max_bytes: u64,
    ) -> Vec<kaiso_policy::Move> {
        self.lock().plan(now, tiers, max_bytes)
    }
    fn explain(&self, object: kaiso_policy::ObjectId, now: kaiso_policy::Nanos) -> String {
        self.lock().explain(object, now)
    }
}
