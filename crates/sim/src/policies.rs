//! Tiering policies by name, for `kaiso sim tier` and the reproduction experiments.

use kaiso_policy::PlacementPolicy;
use kaiso_policy::default_policy::{KaisoConfig, KaisoPolicy};
use kaiso_policy::spike::{SpikeConfig, SpikePolicy};

/// Names accepted by [`placement`], besides `none` and `writeback:<cache policy>` which
/// `kaiso sim tier` handles itself.
pub const PLACEMENT_NAMES: &[&str] = &["spike", "spike-persistent", "kaiso"];

/// Build a tiering policy: `spike` (the 002 rule, paper defaults), `spike-persistent`
/// (with the §5.4 persistent-IO rule), `kaiso` (the default policy).
pub fn placement(name: &str) -> Result<Box<dyn PlacementPolicy>, String> {
    Ok(match name {
        "spike" => Box::new(SpikePolicy::new(SpikeConfig::default())?),
        "spike-persistent" => Box::new(SpikePolicy::new(SpikeConfig {
            persistent_io: true,
            ..SpikeConfig::default()
        })?),
        "kaiso" | "default" => Box::new(KaisoPolicy::new(KaisoConfig::default()).map_err(|e| e.0)?),
        _ => {
            return Err(format!(
                "unknown tiering policy {name:?}; known: none, writeback:<cache policy>, {}",
                PLACEMENT_NAMES.join(", ")
            ));
        }
    })
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
