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
        "spike-persistent" => Box::new(SpikePolicy::new(SpikeConfig { persistent_io: true, ..SpikeConfig::default() })?),
        "kaiso" | "default" => Box::new(KaisoPolicy::new(KaisoConfig::default()).map_err(|e| e.0)?),
        _ => {
            return Err(format!(
                "unknown tiering policy {name:?}; known: none, writeback:<cache policy>, {}",
                PLACEMENT_NAMES.join(", ")
            ));
        }
    })
}
