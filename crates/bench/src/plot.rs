//! Minimal SVG line charts, written by hand so reports need no plotting dependency.

use std::fmt::Write;

/// One line on a chart.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// A line chart with a log₂ (writer counts, rates) or linear (time) x axis and a linear or
/// log₁₀ y axis.
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_log: bool,
    /// The x axis's span when given (charts stacked on one time axis), else the points'.
    pub x_range: Option<(f64, f64)>,
    pub y_log: bool,
    pub series: Vec<Series>,
    /// Labels for chosen x positions (e.g. `p99` at 100 on a percentile axis); empty: a tick
    /// at every x value, labelled with it.
    pub x_tick_labels: Vec<(f64, String)>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

pub(crate) fn format_value(value: f64) -> String {
    if value >= 1_000_000.0 {
        format!("{:.1}M", value / 1_000_000.0)
    } else if value >= 1_000.0 {
        format!("{:.0}k", value / 1_000.0)
    } else if value >= 10.0 || value.fract() == 0.0 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

impl Chart {
    /// Latency (ms, log scale) by percentile (p50 … p99.9), one line per histogram of ns.
    pub fn percentiles(title: String, y_label: &str, series: &[(&str, &hdrhistogram::Histogram<u64>)]) -> Chart {
        const QUANTILES: [(f64, &str); 5] =
            [(50.0, "p50"), (90.0, "p90"), (95.0, "p95"), (99.0, "p99"), (99.9, "p99.9")];
        Chart {
            title,
            x_label: "percentile".into(),
            y_label: y_label.into(),
            x_log: false,
            x_range: None,
            y_log: true,
            series: series
                .iter()
                .map(|(name, histogram)| Series {
                    name: name.to_string(),
                    points: QUANTILES
                        .iter()
                        .enumerate()
                        .map(|(index, (q, _))| (index as f64, histogram.value_at_quantile(q / 100.0) as f64 / 1e6))
                        .collect(),
                })
                .collect(),
            x_tick_labels: QUANTILES
                .iter()
                .enumerate()
                .map(|(index, (_, label))| (index as f64, label.to_string()))
                .collect(),
        }
    }

    pub fn to_svg(&self) -> String {
        let points = self.series.iter().flat_map(|series| series.points.iter());
        let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
        for &(x, y) in points {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
        if x_min > x_max {
            (x_min, x_max, y_min, y_max) = (1.0, 2.0, 0.0, 1.0);
        }
        if let Some((low, high)) = self.x_range {
            (x_min, x_max) = (low, high);
        }
        let x_of = |x: f64| if self.x_log { x.max(1e-9).log2() } else { x };
        let (x_lo, x_hi) = (x_of(x_min), x_of(x_max).max(x_of(x_min) + 1.0));
        let (y_lo, y_hi) = if self.y_log {
            let lo = y_min.max(1e-9).log10().floor();
            (lo, y_max.max(1e-9).log10().ceil().max(lo + 1.0))
        } else {
            (0.0, y_max.max(1e-9) * 1.1)
        };
        let y_of = |y: f64| if self.y_log { y.max(1e-9).log10() } else { y };
        let plot_width = WIDTH - LEFT - RIGHT;
        let plot_height = HEIGHT - TOP - BOTTOM;
        let sx = |x: f64| LEFT + (x_of(x) - x_lo) / (x_hi - x_lo) * plot_width;
        let sy = |y: f64| TOP + plot_height - (y_of(y) - y_lo) / (y_hi - y_lo) * plot_height;
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = write!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = write!(
            svg,
            r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        let _ = write!(
            svg,
            r##"<rect x="{LEFT}" y="{TOP}" width="{plot_width}" height="{plot_height}" fill="none" stroke="#888"/>"##
        );
        // Y ticks: five linear steps or one per decade.
        let y_ticks: Vec<f64> = if self.y_log {
            (y_lo as i32..=y_hi as i32).map(|power| 10f64.powi(power)).collect()
        } else {
            (0..=5).map(|step| y_hi * step as f64 / 5.0).collect()
        };
        for tick in y_ticks {
            let y = sy(tick);
            let _ = write!(svg, r##"<line x1="{LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="#eee"/>"##, LEFT + plot_width);
            let _ = write!(
                svg,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                y + 4.0,
                format_value(tick)
            );
        }
        let x_ticks: Vec<(f64, String)> = if self.x_tick_labels.is_empty() {
            let mut values: Vec<f64> =
                self.series.iter().flat_map(|series| series.points.iter().map(|p| p.0)).collect();
            values.sort_by(f64::total_cmp);
            values.dedup();
            values.into_iter().map(|value| (value, format_value(value))).collect()
        } else {
            self.x_tick_labels.clone()
        };
        for (tick, label) in x_ticks {
            let x = sx(tick);
            let _ = write!(svg, r##"<line x1="{x}" x2="{x}" y1="{TOP}" y2="{}" stroke="#eee"/>"##, TOP + plot_height);
            let _ = write!(
                svg,
                r#"<text x="{x}" y="{}" text-anchor="middle">{}</text>"#,
                TOP + plot_height + 16.0,
                escape(&label)
            );
        }
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + plot_width / 2.0,
            HEIGHT - 18.0,
            escape(&self.x_label)
        );
        let _ = write!(
            svg,
            r#"<text transform="translate(18,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            TOP + plot_height / 2.0,
            escape(&self.y_label)
        );
        for (i, series) in self.series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let path: Vec<String> = series.points.iter().map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y))).collect();
            let _ =
                write!(svg, r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#, path.join(" "));
            for &(x, y) in &series.points {
                let _ = write!(svg, r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#, sx(x), sy(y));
            }
            let legend_y = TOP + 10.0 + i as f64 * 18.0;
            let legend_x = LEFT + plot_width + 12.0;
            let _ =
                write!(svg, r#"<rect x="{legend_x}" y="{}" width="12" height="4" fill="{color}"/>"#, legend_y - 4.0);
            let _ = write!(svg, r#"<text x="{}" y="{legend_y}">{}</text>"#, legend_x + 18.0, escape(&series.name));
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// Charts one above the other in one SVG, sharing nothing but the page.
pub fn stack(charts: &[Chart]) -> String {
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{}">"#,
        HEIGHT * charts.len() as f64
    );
    for (index, chart) in charts.iter().enumerate() {
        let _ =
            write!(svg, r#"<g transform="translate(0,{})">{}</g>"#, HEIGHT * index as f64, chart.to_svg().trim_end());
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chart_is_well_formed_svg_with_every_point() {
        let chart = Chart {
            title: "a <b> & c".into(),
            x_label: "writers".into(),
            y_label: "records/s".into(),
            x_log: true,
            x_range: None,
            y_log: true,
            series: vec![
                Series { name: "fsync".into(), points: vec![(1.0, 5_000.0), (8.0, 40_000.0), (64.0, 250_000.0)] },
                Series { name: "async".into(), points: vec![(1.0, 90_000.0), (64.0, 1_500_000.0)] },
            ],
            x_tick_labels: Vec::new(),
        };
        let svg = chart.to_svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<circle").count(), 5);
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
