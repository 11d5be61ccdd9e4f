//! Store configuration: a TOML file with one `[store]` table and an ordered `[[tier]]` list.
//!
//! ```toml
//! [store]
//! state_dir = "/var/lib/kaiso/main"   # SQLite DB, control socket
//! placement = "fastest-with-room"     # or "tier:<name>"
//! passthrough = true                  # kernel FUSE passthrough for resident files
//! passthrough_writes = true           # writers too, while their tier has the reserve below
//! passthrough_write_reserve = "1GiB"  # room a passthrough writer needs (and holds) on its tier
//! allow_other = false
//! metrics = "127.0.0.1:9477"          # optional Prometheus text endpoint
//!
//! [store.mover]
//! interval_ms = 2000       # how often the policy plans
//! max_rate = "256MiB"      # bytes per second, at most
//! max_plan_bytes = "4GiB"  # bytes per planning round
//! busy_backoff = 0.5       # pause moves when foreground utilisation is above this
//!
//! [policy]               # optional: kaiso-policy's KaisoConfig (docs/tiering.md)
//! heat_half_life_secs = 3600
//! promote_burst_fraction = 1.0
//!
//! [[tier]]
//! name = "ssd"
//! path = "/srv/ssd/kaiso"
//! capacity = "100GiB"
//! high_watermark = 0.9
//! low_watermark = 0.7
//! [tier.device]            # optional device emulation
//! kind = "hdd"             # hdd | ssd | nvm
//! ```
//!
//! Errors name the key and the line: `config.toml line 7, key tier[1].capacity: …`.

use std::fmt;
use std::path::{Path, PathBuf};

use std::collections::BTreeMap;

use kaiso_policy::default_policy::KaisoConfig;
use serde::Deserialize;
use toml::Spanned;

/// Default `passthrough_write_reserve`: a passthrough writer may add this much to its file
/// before its tier's hard capacity is at risk.
pub const DEFAULT_PASSTHROUGH_WRITE_RESERVE: u64 = 1 << 30;

/// A whole store configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// The file it came from (for messages), if any.
    pub source: Option<PathBuf>,
    pub state_dir: PathBuf,
    pub placement: PlacementRule,
    pub passthrough: bool,
    /// Serve writable opens by kernel passthrough too (only with `passthrough`).
    pub passthrough_writes: bool,
    /// Room a writable open needs on its tier (above usage and other writers' reserves) to
    /// be served by passthrough; it holds that room while open (docs/tiering.md).
    pub passthrough_write_reserve: u64,
    pub allow_other: bool,
    /// Address for the Prometheus text endpoint (`host:port`), if enabled.
    pub metrics: Option<String>,
    pub mover: MoverConfig,
    /// Tunables of the default placement policy (`[policy]`), validated.
    pub policy: KaisoConfig,
    /// The `[policy]` keys as written (so `to_toml` keeps exactly what the user set).
    pub policy_table: toml::Table,
    /// Tiers in order, fastest first.
    pub tiers: Vec<TierConfig>,
}

/// Where new files go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementRule {
    /// The fastest tier that has room below its high watermark (spilling down when full).
    FastestWithRoom,
    /// The named tier while it has room, then the next slower ones.
    Tier(String),
    /// Ask the placement policy (`PlacementPolicy::place_new`).
    Policy,
}

impl fmt::Display for PlacementRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlacementRule::FastestWithRoom => write!(f, "fastest-with-room"),
            PlacementRule::Tier(t) => write!(f, "tier:{t}"),
            PlacementRule::Policy => write!(f, "policy"),
        }
    }
}

/// Pacing of the background mover.
#[derive(Clone, Debug, PartialEq)]
pub struct MoverConfig {
    /// Run the background mover at all (manual moves work either way).
    pub enabled: bool,
    /// Planning interval.
    pub interval_ms: u64,
    /// Upper bound on copy throughput, bytes/s.
    pub max_rate: u64,
    /// Bytes planned per round.
    pub max_plan_bytes: u64,
    /// Foreground utilisation (0..1) above which background moves pause.
    pub busy_backoff: f64,
    /// Heat checkpoint interval.
    pub checkpoint_ms: u64,
}

impl Default for MoverConfig {
    fn default() -> Self {
        MoverConfig {
            enabled: true,
            interval_ms: 2000,
            max_rate: 256 << 20,
            max_plan_bytes: 4 << 30,
            busy_backoff: 0.5,
            checkpoint_ms: 30_000,
        }
    }
}

/// One tier.
#[derive(Clone, Debug, PartialEq)]
pub struct TierConfig {
    pub name: String,
    pub path: PathBuf,
    /// Hard limit in bytes (never exceeded by kaiso).
    pub capacity: u64,
    pub high_watermark: f64,
    pub low_watermark: f64,
    pub device: Option<DeviceConfig>,
}

/// An emulated device in front of a tier's data path.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceConfig {
    pub kind: DeviceKind,
    /// Model parameters as given (names depend on the model; unknown names are errors).
    pub params: toml::Table,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Hdd,
    Ssd,
    Nvm,
}

/// A configuration problem, naming the file, line and key.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.message)]
pub struct ConfigError {
    pub message: String,
}

impl ConfigError {
    fn at(
        file: &str,
        text: &str,
        span: Option<std::ops::Range<usize>>,
        key: &str,
        msg: impl fmt::Display,
    ) -> Self {
        let line = span.map(|s| line_of(text, s.start));
        let message = match line {
            Some(l) => format!("{file} line {l}, key {key}: {msg}"),
            None => format!("{file}, key {key}: {msg}"),
        };
        ConfigError { message }
    }
}

/// A TCP address to listen on, as `TcpListener::bind` takes it: `IP:PORT`, `[IPv6]:PORT`
/// or `HOST:PORT` (a host name is resolved when the address is bound). Checked when the
/// configuration is loaded, so a bad one is reported with its line and key.
fn check_listen_address(s: &str) -> Result<&str, String> {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(s);
    }
    let expected = "expected HOST:PORT, e.g. \"127.0.0.1:9477\" or \"[::1]:9477\"";
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(format!("{s:?} is no address: no port ({expected})"));
    };
    if port.parse::<u16>().is_err() {
        return Err(format!("{s:?}: bad port {port:?} ({expected})"));
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !name_ok {
        return Err(format!("{s:?}: bad host {host:?} ({expected})"));
    }
    Ok(s)
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())]
        .bytes()
        .filter(|b| *b == b'\n')
        .count()
        + 1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    store: Spanned<RawStore>,
    #[serde(default)]
    policy: Option<Spanned<BTreeMap<String, Spanned<toml::Value>>>>,
    #[serde(default)]
    tier: Vec<Spanned<RawTier>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    state_dir: Spanned<PathBuf>,
    #[serde(default)]
    placement: Option<Spanned<String>>,
    #[serde(default)]
    passthrough: Option<bool>,
    #[serde(default)]
    passthrough_writes: Option<bool>,
    #[serde(default)]
    passthrough_write_reserve: Option<Spanned<toml::Value>>,
    #[serde(default)]
    allow_other: Option<bool>,
    #[serde(default)]
    metrics: Option<Spanned<String>>,
    #[serde(default)]
    mover: Option<RawMover>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMover {
    enabled: Option<bool>,
    interval_ms: Option<u64>,
    max_rate: Option<Spanned<toml::Value>>,
    max_plan_bytes: Option<Spanned<toml::Value>>,
    busy_backoff: Option<Spanned<f64>>,
    checkpoint_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    name: Spanned<String>,
    path: Spanned<PathBuf>,
    capacity: Spanned<toml::Value>,
    #[serde(default)]
    high_watermark: Option<Spanned<f64>>,
    #[serde(default)]
    low_watermark: Option<Spanned<f64>>,
    #[serde(default)]
    device: Option<Spanned<toml::Table>>,
}

/// Parse "10GiB", "512M", "1.5T", or a plain integer, as bytes.
pub fn parse_size(v: &toml::Value) -> Result<u64, String> {
    match v {
        toml::Value::Integer(i) if *i >= 0 => Ok(*i as u64),
        toml::Value::String(s) => parse_size_str(s),
        other => Err(format!(
            "expected a size like \"10GiB\" or a byte count, found {other}"
        )),
    }
}

/// Parse a size string such as "10GiB" or "512M" (binary multiples either way).
pub fn parse_size_str(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        "p" | "pb" | "pib" => 1 << 50,
        u => return Err(format!("unknown size unit {u:?} in {s:?}")),
    };
    Ok((n * mult as f64) as u64)
}

impl StoreConfig {
    /// Read and validate a configuration file. Errors name the key and the line.
    pub fn from_toml_file(path: &Path) -> Result<StoreConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            message: format!("cannot read config {}: {e}", path.display()),
        })?;
        Self::from_toml_text(&text, path)
    }

    /// Validate `text` as if it were the configuration file at `path` (its relative paths
    /// are relative to that file's directory): what `kaiso adopt` checks before writing.
    pub fn from_toml_text(text: &str, path: &Path) -> Result<StoreConfig, ConfigError> {
        let base = path.parent().unwrap_or(Path::new("."));
        let mut cfg = Self::parse(text, &path.display().to_string(), Some(base))?;
        cfg.source = Some(path.to_path_buf());
        Ok(cfg)
    }

    /// Parse and validate configuration text; `file` names it in messages. Relative paths
    /// stay as written (relative to the working directory).
    pub fn from_toml_str(text: &str, file: &str) -> Result<StoreConfig, ConfigError> {
        Self::parse(text, file, None)
    }

    /// Parse and validate; relative paths are joined to `base` when given.
    fn parse(text: &str, file: &str, base: Option<&Path>) -> Result<StoreConfig, ConfigError> {
        let resolve = |p: PathBuf| match base {
            Some(b) if p.is_relative() => b.join(p),
            _ => p,
        };
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let span = e.span();
            let msg = e.message().to_string();
            match span {
                Some(s) => ConfigError {
                    message: format!("{file} line {}: {msg}", line_of(text, s.start)),
                },
                None => ConfigError {
                    message: format!("{file}: {msg}"),
                },
            }
        })?;
        let err = |span: std::ops::Range<usize>, key: &str, msg: &dyn fmt::Display| {
            ConfigError::at(file, text, Some(span), key, msg)
        };
        let store_span = raw.store.span();
        let store = raw.store.into_inner();
        if raw.tier.is_empty() {
            return Err(ConfigError::at(
                file,
                text,
                Some(store_span),
                "tier",
                "at least one [[tier]] is required",
            ));
        }
        let mut tiers: Vec<TierConfig> = Vec::new();
        let mut tier_path_spans = Vec::new();
        for (i, t) in raw.tier.into_iter().enumerate() {
            let t = t.into_inner();
            let name = t.name.get_ref().clone();
            if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == '/') {
                return Err(err(
                    t.name.span(),
                    &format!("tier[{i}].name"),
                    &"must be non-empty, without spaces or '/'",
                ));
            }
            if tiers.iter().any(|x| x.name == name) {
                return Err(err(
                    t.name.span(),
                    &format!("tier[{i}].name"),
                    &format!("duplicate tier name {name:?}"),
                ));
            }
            let capacity = parse_size(t.capacity.get_ref())
                .map_err(|m| err(t.capacity.span(), &format!("tier[{i}].capacity"), &m))?;
            if capacity == 0 {
                return Err(err(
                    t.capacity.span(),
                    &format!("tier[{i}].capacity"),
                    &"must be greater than 0",
                ));
            }
            let high = t
                .high_watermark
                .as_ref()
                .map(|s| *s.get_ref())
                .unwrap_or(0.9);
            let low = t
                .low_watermark
                .as_ref()
                .map(|s| *s.get_ref())
                .unwrap_or(0.7);
            if !(0.0..=1.0).contains(&high) || high == 0.0 {
                let sp = t
                    .high_watermark
                    .as_ref()
                    .map(|s| s.span())
                    .unwrap_or(t.name.span());
                return Err(err(
                    sp,
                    &format!("tier[{i}].high_watermark"),
                    &"must be in (0, 1]",
                ));
            }
            if !(0.0..=1.0).contains(&low) || low > high {
                let sp = t
                    .low_watermark
                    .as_ref()
                    .map(|s| s.span())
                    .unwrap_or(t.name.span());
                return Err(err(
                    sp,
                    &format!("tier[{i}].low_watermark"),
                    &format!("must be in [0, high_watermark={high}]"),
                ));
            }
            let device = match t.device {
                None => None,
                Some(d) => {
                    let span = d.span();
                    let mut table = d.into_inner();
                    let kind = match table.remove("kind") {
                        Some(toml::Value::String(k)) => match k.as_str() {
                            "hdd" => DeviceKind::Hdd,
                            "ssd" => DeviceKind::Ssd,
                            "nvm" => DeviceKind::Nvm,
                            other => {
                                return Err(err(
                                    span,
                                    &format!("tier[{i}].device.kind"),
                                    &format!("unknown device {other:?} (expected hdd, ssd or nvm)"),
                                ));
                            }
                        },
                        _ => {
                            return Err(err(
                                span,
                                &format!("tier[{i}].device.kind"),
                                &"missing: expected \"hdd\", \"ssd\" or \"nvm\"",
                            ));
                        }
                    };
                    let params = match table.remove("params") {
                        Some(toml::Value::Table(p)) => {
                            if let Some((k, _)) = table.iter().next() {
                                return Err(err(
                                    span,
                                    &format!("tier[{i}].device.{k}"),
                                    &"unknown key",
                                ));
                            }
                            p
                        }
                        Some(_) => {
                            return Err(err(
                                span,
                                &format!("tier[{i}].device.params"),
                                &"must be a table",
                            ));
                        }
                        None => table,
                    };
                    let dev = DeviceConfig { kind, params };
                    crate::emulate::validate(&dev)
                        .map_err(|m| err(span.clone(), &format!("tier[{i}].device"), &m))?;
                    Some(dev)
                }
            };
            tier_path_spans.push(t.path.span());
            tiers.push(TierConfig {
                name,
                path: resolve(t.path.into_inner()),
                capacity,
                high_watermark: high,
                low_watermark: low,
                device,
            });
        }
        let placement = match &store.placement {
            None => PlacementRule::FastestWithRoom,
            Some(p) => match p.get_ref().as_str() {
                "fastest-with-room" => PlacementRule::FastestWithRoom,
                "policy" => PlacementRule::Policy,
                s if s.starts_with("tier:") => {
                    let name = &s[5..];
                    if !tiers.iter().any(|t| t.name == name) {
                        return Err(err(
                            p.span(),
                            "store.placement",
                            &format!("no tier named {name:?}"),
                        ));
                    }
                    PlacementRule::Tier(name.to_string())
                }
                s => {
                    return Err(err(
                        p.span(),
                        "store.placement",
                        &format!(
                            "unknown rule {s:?} (expected fastest-with-room, policy or tier:<name>)"
                        ),
                    ));
                }
            },
        };
        let metrics = match &store.metrics {
            None => None,
            Some(m) => Some(
                check_listen_address(m.get_ref())
                    .map_err(|e| err(m.span(), "store.metrics", &e))?
                    .to_string(),
            ),
        };
        let mut mover = MoverConfig::default();
        if let Some(m) = store.mover {
            if let Some(v) = m.enabled {
                mover.enabled = v;
            }
            if let Some(v) = m.interval_ms {
                mover.interval_ms = v.max(10);
            }
            if let Some(v) = m.checkpoint_ms {
                mover.checkpoint_ms = v.max(100);
            }
            if let Some(v) = &m.max_rate {
                mover.max_rate = parse_size(v.get_ref())
                    .map_err(|e| err(v.span(), "store.mover.max_rate", &e))?
                    .max(1);
            }
            if let Some(v) = &m.max_plan_bytes {
                mover.max_plan_bytes = parse_size(v.get_ref())
                    .map_err(|e| err(v.span(), "store.mover.max_plan_bytes", &e))?
                    .max(1);
            }
            if let Some(v) = &m.busy_backoff {
                if !(0.0..=1.0).contains(v.get_ref()) {
                    return Err(err(
                        v.span(),
                        "store.mover.busy_backoff",
                        &"must be in [0, 1]",
                    ));
                }
                mover.busy_backoff = *v.get_ref();
            }
        }
        let passthrough_write_reserve = match &store.passthrough_write_reserve {
            None => DEFAULT_PASSTHROUGH_WRITE_RESERVE,
            Some(v) => parse_size(v.get_ref())
                .map_err(|e| err(v.span(), "store.passthrough_write_reserve", &e))?,
        };
        let (policy, policy_table) = match raw.policy {
            None => (KaisoConfig::default(), toml::Table::new()),
            Some(p) => parse_policy(file, text, p)?,
        };
        let state_span = store.state_dir.span();
        let state_dir = resolve(store.state_dir.into_inner());
        check_overlaps(
            file,
            text,
            (&state_dir, state_span),
            &tiers,
            &tier_path_spans,
        )?;
        Ok(StoreConfig {
            source: None,
            state_dir,
            placement,
            passthrough: store.passthrough.unwrap_or(true),
            passthrough_writes: store.passthrough_writes.unwrap_or(true),
            passthrough_write_reserve,
            allow_other: store.allow_other.unwrap_or(false),
            metrics,
            mover,
            policy,
            policy_table,
            tiers,
        })
    }

    /// Render as TOML (used by `kaiso adopt` to write a configuration).
    pub fn to_toml(&self) -> String {
        let mut s = String::new();
        s.push_str("[store]\n");
        s.push_str(&format!(
            "state_dir = {}\n",
            toml_str(&self.state_dir.display().to_string())
        ));
        s.push_str(&format!(
            "placement = {}\n",
            toml_str(&self.placement.to_string())
        ));
        s.push_str(&format!(
            "passthrough = {}\npassthrough_writes = {}\npassthrough_write_reserve = {}\nallow_other = {}\n",
            self.passthrough, self.passthrough_writes, self.passthrough_write_reserve, self.allow_other
        ));
        if let Some(m) = &self.metrics {
            s.push_str(&format!("metrics = {}\n", toml_str(m)));
        }
        s.push_str(&format!(
            "\n[store.mover]\nenabled = {}\ninterval_ms = {}\nmax_rate = {}\nmax_plan_bytes = {}\nbusy_backoff = {}\ncheckpoint_ms = {}\n",
            self.mover.enabled, self.mover.interval_ms, self.mover.max_rate, self.mover.max_plan_bytes, self.mover.busy_backoff, self.mover.checkpoint_ms
        ));
        if !self.policy_table.is_empty() {
            s.push_str(&format!(
                "\n[policy]\n{}",
                toml::to_string(&self.policy_table).unwrap_or_default()
            ));
        }
        for t in &self.tiers {
            s.push('\n');
            s.push_str(&t.to_toml());
        }
        s
    }
}

impl TierConfig {
    /// This tier as a `[[tier]]` table (with its `[tier.device]`), ending in a newline.
    pub fn to_toml(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "[[tier]]\nname = {}\npath = {}\ncapacity = {}\nhigh_watermark = {}\nlow_watermark = {}\n",
            toml_str(&self.name),
            toml_str(&self.path.display().to_string()),
            self.capacity,
            self.high_watermark,
            self.low_watermark
        ));
        if let Some(d) = &self.device {
            let kind = match d.kind {
                DeviceKind::Hdd => "hdd",
                DeviceKind::Ssd => "ssd",
                DeviceKind::Nvm => "nvm",
            };
            s.push_str(&format!("[tier.device]\nkind = \"{kind}\"\n"));
            if !d.params.is_empty() {
                s.push_str(&format!(
                    "[tier.device.params]\n{}",
                    toml::to_string(&d.params).unwrap_or_default()
                ));
            }
        }
        s
    }
}

/// The directory a configured path names, for comparing paths: absolute, symlinks of its
/// existing part resolved, `.` and `..` of the rest applied by name.
fn comparable_path(p: &Path) -> PathBuf {
    use std::path::Component;
    let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    // The longest prefix that exists is canonicalized; the rest is appended by name.
    let mut existing = abs.clone();
    let mut rest = Vec::new();
    let resolved = loop {
        if let Ok(c) = std::fs::canonicalize(&existing) {
            break c;
        }
        match (
            existing.file_name().map(|n| n.to_os_string()),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                existing = parent.to_path_buf();
            }
            // Nothing of it exists (or it ends in `..`): compare it by name alone.
            _ => {
                rest.clear();
                break abs.clone();
            }
        }
    };
    let mut out = PathBuf::new();
    let tail: PathBuf = rest.iter().rev().collect();
    for c in resolved.components().chain(tail.components()) {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Tiers must be distinct directories, none inside another, and the state directory must
/// not be inside a tier (it would show through the mount and be moved by the mover).
fn check_overlaps(
    file: &str,
    text: &str,
    (state_dir, state_span): (&Path, std::ops::Range<usize>),
    tiers: &[TierConfig],
    spans: &[std::ops::Range<usize>],
) -> Result<(), ConfigError> {
    let paths: Vec<PathBuf> = tiers.iter().map(|t| comparable_path(&t.path)).collect();
    let line = |span: &std::ops::Range<usize>| line_of(text, span.start);
    for j in 0..paths.len() {
        for i in 0..j {
            let (a, b) = (&paths[i], &paths[j]);
            let relation = if a == b {
                "is the same directory as"
            } else if b.starts_with(a) {
                "is inside"
            } else if a.starts_with(b) {
                "contains"
            } else {
                continue;
            };
            return Err(ConfigError::at(
                file,
                text,
                Some(spans[j].clone()),
                &format!("tier[{j}].path"),
                format!(
                    "{} {relation} tier[{i}].path {} (line {}): every tier needs its own directory, none inside another",
                    b.display(),
                    a.display(),
                    line(&spans[i])
                ),
            ));
        }
    }
    let state = comparable_path(state_dir);
    for (i, p) in paths.iter().enumerate() {
        if state.starts_with(p) {
            let relation = if state == *p {
                "is the same directory as"
            } else {
                "is inside"
            };
            return Err(ConfigError::at(
                file,
                text,
                Some(state_span),
                "store.state_dir",
                format!(
                    "{} {relation} tier[{i}].path {} (line {}): the database would show through the mount and be moved like a file",
                    state.display(),
                    p.display(),
                    line(&spans[i])
                ),
            ));
        }
    }
    Ok(())
}

/// `s` as a TOML string literal (quoted and escaped).
pub fn toml_quote(s: &str) -> String {
    toml_str(s)
}

fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The `[policy]` table: every key is a field of kaiso-policy's `KaisoConfig`. Each key is
/// checked on its own first (unknown name, wrong type), so the error points at its line;
/// then the whole configuration's ranges are validated and an error is pinned to the key
/// it names.
fn parse_policy(
    file: &str,
    text: &str,
    raw: Spanned<BTreeMap<String, Spanned<toml::Value>>>,
) -> Result<(KaisoConfig, toml::Table), ConfigError> {
    let table_span = raw.span();
    let raw = raw.into_inner();
    let mut table = toml::Table::new();
    for (k, v) in &raw {
        let mut one = toml::Table::new();
        one.insert(k.clone(), v.get_ref().clone());
        if let Err(e) = toml::Value::Table(one).try_into::<KaisoConfig>() {
            let msg = e.message().trim().to_string();
            return Err(ConfigError::at(
                file,
                text,
                Some(v.span()),
                &format!("policy.{k}"),
                msg,
            ));
        }
        table.insert(k.clone(), v.get_ref().clone());
    }
    let cfg: KaisoConfig = toml::Value::Table(table.clone())
        .try_into()
        .map_err(|e| ConfigError::at(file, text, Some(table_span.clone()), "policy", e))?;
    if let Err(e) = cfg.validate() {
        // The message starts with (or mentions) the offending field's name.
        let named = raw
            .iter()
            .filter(|(k, _)| e.0.contains(k.as_str()))
            .min_by_key(|(k, _)| e.0.find(k.as_str()).unwrap_or(usize::MAX));
        let (key, span) = match named {
            Some((k, v)) => (format!("policy.{k}"), v.span()),
            None => ("policy".to_string(), table_span),
        };
        return Err(ConfigError::at(file, text, Some(span), &key, &e.0));
    }
    Ok((cfg, table))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[store]
state_dir = "/tmp/state"
[[tier]]
name = "fast"
path = "/tmp/a"
capacity = "1GiB"
[[tier]]
name = "slow"
path = "/tmp/b"
capacity = 1000000
high_watermark = 0.95
low_watermark = 0.8
[tier.device]
kind = "hdd"
"#;

    #[test]
    fn parses_good_config() {
        let c = StoreConfig::from_toml_str(GOOD, "t.toml").unwrap();
        assert_eq!(c.tiers.len(), 2);
        assert_eq!(c.tiers[0].capacity, 1 << 30);
        assert_eq!(c.tiers[1].device.as_ref().unwrap().kind, DeviceKind::Hdd);
        assert_eq!(c.placement, PlacementRule::FastestWithRoom);
        let again = StoreConfig::from_toml_str(&c.to_toml(), "x").unwrap();
        assert_eq!(again.tiers, c.tiers);
    }

    #[test]
    fn bad_capacity_names_key_and_line() {
        let bad = GOOD.replace("capacity = 1000000", "capacity = \"lots\"");
        let e = StoreConfig::from_toml_str(&bad, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 11"), "{e}");
        assert!(e.contains("tier[1].capacity"), "{e}");
    }

    #[test]
    fn passthrough_write_reserve_parses_defaults_and_names_its_key() {
        let c = StoreConfig::from_toml_str(GOOD, "t.toml").unwrap();
        assert!(c.passthrough_writes);
        assert_eq!(
            c.passthrough_write_reserve,
            DEFAULT_PASSTHROUGH_WRITE_RESERVE
        );
        let text = GOOD.replacen(
            "[store]\n",
            "[store]\npassthrough_writes = false\npassthrough_write_reserve = \"256MiB\"\n",
            1,
        );
        let c = StoreConfig::from_toml_str(&text, "t.toml").unwrap();
        assert!(!c.passthrough_writes);
        assert_eq!(c.passthrough_write_reserve, 256 << 20);
        let again = StoreConfig::from_toml_str(&c.to_toml(), "x").unwrap();
        assert_eq!(again.passthrough_write_reserve, 256 << 20);
        assert!(!again.passthrough_writes);
        let bad = GOOD.replacen(
            "[store]\n",
            "[store]\npassthrough_write_reserve = \"big\"\n",
            1,
        );
        let e = StoreConfig::from_toml_str(&bad, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("store.passthrough_write_reserve") && e.contains("line 3"),
            "{e}"
        );
    }

    #[test]
    fn unknown_key_names_line() {
        let bad = GOOD.replace("high_watermark = 0.95", "high_watermrk = 0.95");
        let e = StoreConfig::from_toml_str(&bad, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 12"), "{e}");
        assert!(e.contains("high_watermrk"), "{e}");
    }

    #[test]
    fn bad_metrics_address_names_key_and_line() {
        for bad in [
            "notanaddr",
            "127.0.0.1",
            "127.0.0.1:port",
            ":9477",
            "a b:80",
            "1.2.3.4:70000",
        ] {
            let cfg = GOOD.replace(
                "state_dir = \"/tmp/state\"",
                &format!("state_dir = \"/tmp/state\"\nmetrics = {bad:?}"),
            );
            let e = StoreConfig::from_toml_str(&cfg, "t.toml")
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("t.toml line 4, key store.metrics") && e.contains("HOST:PORT"),
                "metrics = {bad:?} should be refused naming line 4 and store.metrics: {e}"
            );
        }
        for good in ["127.0.0.1:9477", "[::1]:0", "localhost:9477", "0.0.0.0:80"] {
            let cfg = GOOD.replace(
                "state_dir = \"/tmp/state\"",
                &format!("state_dir = \"/tmp/state\"\nmetrics = {good:?}"),
            );
            let c = StoreConfig::from_toml_str(&cfg, "t.toml")
                .unwrap_or_else(|e| panic!("metrics = {good:?} refused: {e}"));
            assert_eq!(c.metrics.as_deref(), Some(good));
        }
    }

    #[test]
    fn watermarks_checked() {
        let bad = GOOD.replace("low_watermark = 0.8", "low_watermark = 0.99");
        let e = StoreConfig::from_toml_str(&bad, "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("tier[1].low_watermark") && e.contains("line 13"),
            "{e}"
        );
    }

    #[test]
    fn policy_table_sets_tunables() {
        let text = GOOD.replace(
            "[[tier]]\nname = \"fast\"",
            "[policy]\nheat_half_life_secs = 600\npromote_burst_fraction = 0.25\n\n[[tier]]\nname = \"fast\"",
        );
        let c = StoreConfig::from_toml_str(&text, "t.toml").unwrap();
        assert_eq!(c.policy.heat_half_life_secs, 600.0);
        assert_eq!(c.policy.promote_burst_fraction, 0.25);
        assert_eq!(c.policy.swap_ratio, KaisoConfig::default().swap_ratio);
        let again = StoreConfig::from_toml_str(&c.to_toml(), "x").unwrap();
        assert_eq!(again.policy, c.policy);
        let plain = StoreConfig::from_toml_str(GOOD, "t.toml").unwrap();
        assert_eq!(plain.policy, KaisoConfig::default());
    }

    #[test]
    fn bad_policy_values_name_key_and_line() {
        let with = |body: &str| {
            let text = GOOD.replace(
                "[[tier]]\nname = \"fast\"",
                &format!("[policy]\n{body}\n\n[[tier]]\nname = \"fast\""),
            );
            StoreConfig::from_toml_str(&text, "t.toml")
                .unwrap_err()
                .to_string()
        };
        // [policy] starts at line 4 of GOOD with the table inserted.
        let e = with("swap_ratio = 2.0\nheat_half_life_secs = -1");
        assert!(
            e.contains("line 6") && e.contains("policy.heat_half_life_secs"),
            "{e}"
        );
        let e = with("promote_burst_fraction = 1.5");
        assert!(
            e.contains("line 5") && e.contains("policy.promote_burst_fraction"),
            "{e}"
        );
        let e = with("heat_half_life = 60");
        assert!(
            e.contains("line 5") && e.contains("policy.heat_half_life"),
            "{e}"
        );
        let e = with("pace_floor = \"lots\"");
        assert!(
            e.contains("line 5") && e.contains("policy.pace_floor"),
            "{e}"
        );
        let e = with("pace_busy_start = 0.99");
        assert!(e.contains("line 5") && e.contains("pace_busy_stop"), "{e}");
    }

    /// Two tiers over `a` and `b`, state directory `state` (all as written).
    fn paths_config(state: &str, a: &str, b: &str) -> String {
        format!(
            "[store]\nstate_dir = {state:?}\n\n[[tier]]\nname = \"fast\"\npath = {a:?}\ncapacity = 1000\n\n[[tier]]\nname = \"slow\"\npath = {b:?}\ncapacity = 1000\n"
        )
    }

    #[test]
    fn overlapping_tier_paths_name_both_keys_and_lines() {
        let dir = tempfile::tempdir().unwrap();
        let d = |p: &str| dir.path().join(p).display().to_string();
        std::fs::create_dir(dir.path().join("t0")).unwrap();
        let e = StoreConfig::from_toml_str(&paths_config(&d("st"), &d("t0"), &d("t0/")), "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("line 11, key tier[1].path")
                && e.contains("same directory as tier[0].path")
                && e.contains("(line 6)")
                && !e.contains('\n'),
            "{e}"
        );
        // One inside the other, either way round, also through `..` and missing parts.
        let e = StoreConfig::from_toml_str(
            &paths_config(&d("st"), &d("t0"), &d("x/../t0/fast")),
            "t.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("tier[1].path") && e.contains("is inside tier[0].path"),
            "{e}"
        );
        let e =
            StoreConfig::from_toml_str(&paths_config(&d("st"), &d("t0/a/b"), &d("t0")), "t.toml")
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("tier[1].path") && e.contains("contains tier[0].path"),
            "{e}"
        );
        // A symlink to a tier is the same directory.
        std::os::unix::fs::symlink(dir.path().join("t0"), dir.path().join("alias")).unwrap();
        let e =
            StoreConfig::from_toml_str(&paths_config(&d("st"), &d("t0"), &d("alias")), "t.toml")
                .unwrap_err()
                .to_string();
        assert!(e.contains("same directory"), "{e}");
        // Siblings sharing a name prefix are fine.
        StoreConfig::from_toml_str(&paths_config(&d("st"), &d("t0"), &d("t01")), "t.toml").unwrap();
    }

    #[test]
    fn state_dir_inside_a_tier_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let d = |p: &str| dir.path().join(p).display().to_string();
        let e =
            StoreConfig::from_toml_str(&paths_config(&d("t1/st"), &d("t0"), &d("t1")), "t.toml")
                .unwrap_err()
                .to_string();
        assert!(
            e.contains("line 2, key store.state_dir")
                && e.contains("inside tier[1].path")
                && e.contains("(line 11)"),
            "{e}"
        );
        // Relative paths count from the configuration's directory.
        let cfg = dir.path().join("k.toml");
        let e = StoreConfig::from_toml_text(&paths_config("t0", "t0", "t1"), &cfg)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("store.state_dir") && e.contains("same directory"),
            "{e}"
        );
        let c = StoreConfig::from_toml_text(&paths_config("st", "t0", "t1"), &cfg).unwrap();
        assert_eq!(c.state_dir, dir.path().join("st"));
        assert_eq!(c.tiers[1].path, dir.path().join("t1"));
    }

    #[test]
    fn a_tier_renders_as_a_table_that_parses_back() {
        let c = StoreConfig::from_toml_str(GOOD, "t.toml").unwrap();
        let text = format!("[store]\nstate_dir = \"/tmp/s\"\n{}", c.tiers[1].to_toml());
        let again = StoreConfig::from_toml_str(&text, "x").unwrap();
        assert_eq!(again.tiers[0], c.tiers[1]);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size_str("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size_str("1.5KiB").unwrap(), 1536);
        assert!(parse_size_str("1X").is_err());
    }
}
