//! Reports: JSON and CSV files, and hand-written SVG line charts (no plotting dependency).

use serde::Serialize;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

/// Write any serialisable value as pretty JSON.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// Write rows as CSV; fields containing a comma or quote are quoted.
pub fn write_csv(path: &Path, header: &[&str], rows: &[Vec<String>]) -> io::Result<()> {
    let mut s = String::new();
    let quote = |f: &str| {
        if f.contains([',', '"', '\n']) {
            format!("\"{}\"", f.replace('"', "\"\""))
        } else {
            f.to_string()
        }
    };
    s.push_str(
        &header
            .iter()
            .map(|h| quote(h))
            .collect::<Vec<_>>()
            .join(","),
    );
    s.push('\n');
    for r in rows {
        s.push_str(&r.iter().map(|f| quote(f)).collect::<Vec<_>>().join(","));
        s.push('\n');
    }
    std::fs::write(path, s)
}

/// One named line of points.
#[derive(Clone, Debug)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart rendered to SVG.
#[derive(Clone, Debug, Default)]
pub struct LineChart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub log_x: bool,
    pub series: Vec<Series>,
}

const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn nice(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

impl LineChart {
    pub fn new(title: &str, x_label: &str, y_label: &str) -> Self {
        LineChart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            ..Default::default()
        }
    }

    pub fn add(&mut self, name: &str, points: Vec<(f64, f64)>) {
        self.series.push(Series {
            name: name.into(),
            points,
        });
    }

    pub fn to_svg(&self) -> String {
        let (w, h) = (760.0, 440.0);
        let (l, r, t, b) = (70.0, 170.0, 40.0, 50.0);
        let pw = w - l - r;
        let ph = h - t - b;
        let fx = |x: f64| if self.log_x { x.max(1e-12).log10() } else { x };
        let pts = self
            .series
            .iter()
            .flat_map(|s| s.points.iter())
            .filter(|p| p.0.is_finite() && p.1.is_finite());
        let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 0.0f64, f64::MIN);
        for &(x, y) in pts {
            x0 = x0.min(fx(x));
            x1 = x1.max(fx(x));
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
        if x0 > x1 {
            (x0, x1, y1) = (0.0, 1.0, 1.0);
        }
        if x1 - x0 < 1e-12 {
            x1 = x0 + 1.0;
        }
        if y1 - y0 < 1e-12 {
            y1 = y0 + 1.0;
        }
        y1 *= 1.05;
        let sx = |x: f64| l + (fx(x) - x0) / (x1 - x0) * pw;
        let sy = |y: f64| t + ph - (y - y0) / (y1 - y0) * ph;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = write!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            l + pw / 2.0,
            esc(&self.title)
        );
        // Axes, grid and ticks.
        for i in 0..=5 {
            let fy = y0 + (y1 - y0) * i as f64 / 5.0;
            let y = sy(fy);
            let _ = write!(
                s,
                r##"<line x1="{l}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
                l + pw
            );
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                l - 6.0,
                y + 4.0,
                nice(fy)
            );
            let fxv = x0 + (x1 - x0) * i as f64 / 5.0;
            let xv = if self.log_x { 10f64.powf(fxv) } else { fxv };
            let x = l + pw * i as f64 / 5.0;
            let _ = write!(
                s,
                r##"<line x1="{x:.1}" y1="{t}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/>"##,
                t + ph
            );
            let _ = write!(
                s,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                t + ph + 16.0,
                nice(xv)
            );
        }
        let _ = write!(
            s,
            r##"<rect x="{l}" y="{t}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##
        );
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}{}</text>"#,
            l + pw / 2.0,
            h - 12.0,
            esc(&self.x_label),
            if self.log_x { " (log scale)" } else { "" }
        );
        let _ = write!(
            s,
            r#"<text x="16" y="{:.1}" text-anchor="middle" transform="rotate(-90 16 {:.1})">{}</text>"#,
            t + ph / 2.0,
            t + ph / 2.0,
            esc(&self.y_label)
        );
        for (i, ser) in self.series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let path: Vec<String> = ser
                .points
                .iter()
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
                .collect();
            if path.len() == 1 {
                let _ = write!(
                    s,
                    r#"<circle cx="{}" r="3" fill="{color}"/>"#,
                    path[0].replace(',', "\" cy=\"")
                );
            }
            let _ = write!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{}"/>"#,
                path.join(" ")
            );
            let ly = t + 14.0 + 18.0 * i as f64;
            let _ = write!(
                s,
                r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="3"/>"#,
                l + pw + 10.0,
                l + pw + 30.0
            );
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                l + pw + 36.0,
                ly + 4.0,
                esc(&ser.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }

    pub fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_svg())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_is_well_formed_and_names_series() {
        let mut c = LineChart::new("Miss ratio <x>", "cache size", "miss ratio");
        c.log_x = true;
        c.add("LRU", vec![(10.0, 0.5), (100.0, 0.3), (1000.0, 0.1)]);
        c.add("one", vec![(50.0, 0.2)]);
        let s = c.to_svg();
        assert!(s.starts_with("<svg") && s.ends_with("</svg>\n"));
        assert!(s.contains("LRU") && s.contains("&lt;x&gt;"));
        assert_eq!(s.matches("<polyline").count(), 2);
        let empty = LineChart::new("e", "x", "y").to_svg();
        assert!(empty.contains("</svg>"));
    }
}

/// A horizontal bar chart (one bar per named value) rendered to SVG.
#[derive(Clone, Debug, Default)]
pub struct BarChart {
    pub title: String,
    pub value_label: String,
    /// (name, value, highlighted)
    pub bars: Vec<(String, f64, bool)>,
}

impl BarChart {
    pub fn new(title: &str, value_label: &str) -> Self {
        BarChart {
            title: title.into(),
            value_label: value_label.into(),
            bars: Vec::new(),
        }
    }

    pub fn add(&mut self, name: &str, value: f64, highlight: bool) {
        self.bars.push((name.into(), value, highlight));
    }

    pub fn to_svg(&self) -> String {
        let row = 22.0;
        let (l, r, t, b) = (170.0, 90.0, 40.0, 30.0);
        let w = 760.0;
        let h = t + b + row * self.bars.len().max(1) as f64;
        let pw = w - l - r;
        let max = self
            .bars
            .iter()
            .map(|b| b.1)
            .filter(|v| v.is_finite())
            .fold(0.0f64, f64::max)
            .max(1e-12);
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{}</text>\n",
            w / 2.0,
            esc(&self.title)
        );
        for (i, (name, v, hi)) in self.bars.iter().enumerate() {
            let y = t + row * i as f64;
            let v = if v.is_finite() { v.max(0.0) } else { 0.0 };
            let bw = pw * v / max;
            let color = if *hi { PALETTE[1] } else { PALETTE[0] };
            let _ = writeln!(
                s,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n<rect x=\"{l}\" y=\"{}\" width=\"{bw:.1}\" height=\"{}\" fill=\"{color}\"/>\n<text x=\"{}\" y=\"{}\">{}</text>",
                l - 6.0,
                y + row * 0.7,
                esc(name),
                y + 3.0,
                row - 6.0,
                l + bw + 4.0,
                y + row * 0.7,
                nice(v)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n</svg>",
            l + pw / 2.0,
            h - 8.0,
            esc(&self.value_label)
        );
        s
    }

    pub fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_svg())
    }
}
