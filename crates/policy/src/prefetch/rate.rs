//! The ch.3 prefetch-rate controller: `r ← clamp(r + E(C(t), C'(t)))`.
//!
//! `C(t)` is the last window's throughput (TPS) and read cache hit ratio (CHR); `C'(t)` is
//! their history weighted `w_i = 2^-i` over past windows (i ≥ 1, the current window is what
//! is compared against it). The easing function E follows the thesis's four rules; the
//! thesis gives no step sizes or thresholds, so they are configuration (defaults ours).

use std::collections::VecDeque;

use serde::Deserialize;

/// Constants of the easing function E.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EasingConfig {
    /// r at start. Not given by the thesis (which observes r ≈ 1 during warm-up, raised by
    /// the rules). 0.3: in our TPCx-V-like simulation starting at 1 prefetched badly ranked
    /// units before statistics existed and cost throughput; the rules still raise r while
    /// the hit ratio climbs.
    pub initial_r: f64,
    /// Lower clamp of r. Not zero, so the controller keeps observing prefetch effects.
    pub min_r: f64,
    /// Upper clamp of r.
    pub max_r: f64,
    /// Past windows in the weighted history (2^-i weights make older ones negligible).
    pub history_windows: usize,
    /// A CHR change larger than this (absolute) is "abrupt": a workload change (rule 4).
    /// The thresholds sit above the window-to-window noise of CHR (a few hundred reads per
    /// window give ±0.03–0.05); with lower ones r never settles (measured).
    pub abrupt_chr_change: f64,
    /// Step of rule 4 (large, temporary acceleration).
    pub abrupt_step: f64,
    /// CHR above its history by more than this is "rising" (rule 1).
    pub chr_rise: f64,
    /// M = TPS × (1 − CHR) above its history by more than this fraction is "rising" (rule 2).
    pub m_rise: f64,
    /// Step of rules 1 and 2.
    pub rise_step: f64,
    /// Step down of rule 3 (both flat) and for falling metrics (not covered by the thesis;
    /// treated like rule 3: prefetch is not paying, so back off gradually).
    pub fall_step: f64,
}

impl Default for EasingConfig {
    fn default() -> Self {
        Self {
            initial_r: 0.3,
            min_r: 0.05,
            max_r: 1.0,
            history_windows: 8,
            abrupt_chr_change: 0.2,
            abrupt_step: 0.3,
            chr_rise: 0.03,
            m_rise: 0.1,
            rise_step: 0.05,
            fall_step: 0.05,
        }
    }
}

impl EasingConfig {
    pub fn validate(&self) -> Result<(), String> {
        let f = [
            ("initial_r", self.initial_r),
            ("min_r", self.min_r),
            ("max_r", self.max_r),
            ("abrupt_chr_change", self.abrupt_chr_change),
            ("abrupt_step", self.abrupt_step),
            ("chr_rise", self.chr_rise),
            ("m_rise", self.m_rise),
            ("rise_step", self.rise_step),
            ("fall_step", self.fall_step),
        ];
        for (name, v) in f {
            if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
                return Err(format!("{name} must be within 0..=1, got {v}"));
            }
        }
        if self.min_r > self.max_r {
            return Err(format!("min_r {} above max_r {}", self.min_r, self.max_r));
        }
        if self.history_windows == 0 || self.history_windows > 64 {
            return Err(format!(
                "history_windows must be within 1..=64, got {}",
                self.history_windows
            ));
        }
        Ok(())
    }
}

/// Which rule fired at a window boundary (for reports and `explain`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EasingRule {
    /// Not enough history yet: r unchanged.
    Warmup,
    /// Rule 4: CHR changed abruptly.
    AbruptChange,
    /// Rule 1: CHR rising.
    ChrRising,
    /// Rule 2: TPS × (1 − CHR) rising.
    MRising,
    /// Rule 3: both flat (or falling): ease off.
    Flat,
}

/// One window's measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowMeasure {
    /// Throughput: transactions (or requests) per second.
    pub tps: f64,
    /// Read cache hit ratio over read I/O counts, 0..=1.
    pub chr: f64,
}

impl WindowMeasure {
    /// The thesis's metric M = TPS × (1 − CHR) ≈ IOPS_HDD × (1 − r).
    pub fn m(&self) -> f64 {
        self.tps * (1.0 - self.chr)
    }
}

/// The adaptive r.
#[derive(Clone, Debug)]
pub struct RateController {
    cfg: EasingConfig,
    r: f64,
    /// Past windows, newest first.
    history: VecDeque<WindowMeasure>,
    last_rule: EasingRule,
}

/// `s' = Σ w_i s(t−i) / Σ w_i` with `w_i = 2^-i`, i = 1 for the newest entry of `past`.
pub fn weighted_history(past: impl IntoIterator<Item = f64>) -> Option<f64> {
    let (mut num, mut den, mut w) = (0.0, 0.0, 0.5);
    for v in past {
        num += w * v;
        den += w;
        w *= 0.5;
    }
    (den > 0.0).then(|| num / den)
}

impl RateController {
    pub fn new(cfg: EasingConfig) -> Result<Self, String> {
        cfg.validate()?;
        Ok(Self {
            r: cfg.initial_r.clamp(cfg.min_r, cfg.max_r),
            cfg,
            history: VecDeque::new(),
            last_rule: EasingRule::Warmup,
        })
    }

    pub fn r(&self) -> f64 {
        self.r
    }

    pub fn last_rule(&self) -> EasingRule {
        self.last_rule
    }

    /// Feeds the window that just ended; returns the new r.
    pub fn end_window(&mut self, now: WindowMeasure) -> f64 {
        let (delta, rule) = self.easing(now);
        self.last_rule = rule;
        self.r = (self.r + delta).clamp(self.cfg.min_r, self.cfg.max_r);
        self.history.push_front(now);
        self.history.truncate(self.cfg.history_windows);
        self.r
    }

    /// E(C(t), C'(t)): the change of r and the rule that decided it. Precedence: an abrupt
    /// CHR change first (it means the workload moved), then rising CHR, then rising M, else
    /// ease off.
    pub fn easing(&self, now: WindowMeasure) -> (f64, EasingRule) {
        let c = &self.cfg;
        let Some(chr_avg) = weighted_history(self.history.iter().map(|w| w.chr)) else {
            return (0.0, EasingRule::Warmup);
        };
        let m_avg = weighted_history(self.history.iter().map(|w| w.m())).unwrap_or(0.0);
        let chr_change = now.chr - chr_avg;
        if chr_change.abs() > c.abrupt_chr_change {
            (c.abrupt_step, EasingRule::AbruptChange)
        } else if chr_change > c.chr_rise {
            (c.rise_step, EasingRule::ChrRising)
        } else if now.m() > m_avg * (1.0 + c.m_rise) && now.m() > 0.0 {
            (c.rise_step, EasingRule::MRising)
        } else {
            (-c.fall_step, EasingRule::Flat)
        }
    }
}
