//! summary.md of an invocation: its command, build and host, the tables, and the plots (latency
//! by percentile per workload, and by rate in a sweep) as SVG beside it.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

use super::context::Context;
use super::tables::tables;
use crate::plot::{Chart, Series};
use crate::workload::{Summary, Workload};

/// The percentiles a CDF plot shows, as 1/(1 − q) on its log axis.
const CDF_QUANTILES: [(f64, &str); 8] = [
    (0.5, "p50"),
    (0.75, "p75"),
    (0.9, "p90"),
    (0.95, "p95"),
    (0.99, "p99"),
    (0.995, "p99.5"),
    (0.999, "p99.9"),
    (0.9999, "p99.99"),
];

/// summary.md and the plots of an invocation.
pub fn write_summary(out: &Path, summaries: &[Summary], context: &Context) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut text = String::from("# onehop benchmark summary\n\n");
    let _ = writeln!(text, "Command: `{}`\n", context.command);
    let _ = writeln!(
        text,
        "git {}{}; host: {}\n",
        context.git_sha,
        if context.git_dirty == Some(true) { " (uncommitted changes)" } else { "" },
        context.host_info
    );
    text.push_str(&tables(summaries));
    let mut workloads: Vec<Workload> = summaries.iter().map(|summary| summary.workload).collect();
    workloads.dedup();
    for workload in workloads {
        let rows: Vec<&Summary> = summaries.iter().filter(|summary| summary.workload == workload).collect();
        let several_rates = rows.iter().any(|summary| summary.rate_hz != rows[0].rate_hz);
        let series = rows
            .iter()
            .map(|summary| Series {
                name: format!(
                    "{}{}{}",
                    summary.target,
                    if several_rates { format!(" {:.0}/s", summary.rate_hz) } else { String::new() },
                    if summary.figures.saturated_runs() > 0 { " (saturated)" } else { "" }
                ),
                points: if summary.figures.latency.is_empty() {
                    Vec::new()
                } else {
                    CDF_QUANTILES
                        .iter()
                        .map(|(quantile, _)| {
                            (1.0 / (1.0 - quantile), summary.figures.latency.value_at_quantile(*quantile) as f64 / 1e6)
                        })
                        .collect()
                },
            })
            .collect();
        let cdf = Chart {
            title: format!("{}: latency by percentile", workload.id()),
            x_label: "percentile".into(),
            y_label: "ms".into(),
            x_log: true,
            x_range: None,
            y_log: true,
            series,
            x_tick_labels: CDF_QUANTILES
                .iter()
                .map(|(quantile, label)| (1.0 / (1.0 - quantile), label.to_string()))
                .collect(),
        };
        let name = format!("{}-cdf.svg", workload.id());
        std::fs::write(out.join(&name), cdf.to_svg())?;
        let _ = writeln!(text, "![{} latency CDF]({name})\n", workload.id());
        if several_rates {
            let mut series = Vec::new();
            let mut targets: Vec<&str> = rows.iter().map(|summary| summary.target.as_str()).collect();
            targets.dedup();
            for target in targets {
                for (quantile, label) in [(0.5, "p50"), (0.99, "p99")] {
                    series.push(Series {
                        name: format!("{target} {label}"),
                        points: rows
                            .iter()
                            .filter(|summary| summary.target == target && !summary.figures.latency.is_empty())
                            .map(|summary| {
                                (summary.rate_hz, summary.figures.latency.value_at_quantile(quantile) as f64 / 1e6)
                            })
                            .collect(),
                    });
                }
            }
            // A rate where a target did not keep up says so under its tick.
            let mut rates: Vec<f64> = rows.iter().map(|summary| summary.rate_hz).collect();
            rates.sort_by(f64::total_cmp);
            rates.dedup();
            let x_tick_labels = rates
                .into_iter()
                .map(|rate| {
                    let saturated =
                        rows.iter().any(|summary| summary.rate_hz == rate && summary.figures.saturated_runs() > 0);
                    (rate, format!("{}{}", crate::plot::format_value(rate), if saturated { " saturated" } else { "" }))
                })
                .collect();
            let chart = Chart {
                title: format!("{}: latency by rate", workload.id()),
                x_label: "events/s".into(),
                y_label: "ms".into(),
                x_log: true,
                x_range: None,
                y_log: true,
                series,
                x_tick_labels,
            };
            let name = format!("{}-rate.svg", workload.id());
            std::fs::write(out.join(&name), chart.to_svg())?;
            let _ = writeln!(text, "![{} latency by rate]({name})\n", workload.id());
        }
    }
    let _ = writeln!(
        text,
        "Runs (each in `<workload>/<run_id>/` with raw.csv, meta.json, and the run by 100 ms in timeline.csv and \
         timeline.svg):\n"
    );
    for summary in summaries {
        let _ = writeln!(text, "- {}: {}", summary.workload.id(), summary.run_ids.join(", "));
    }
    let path = out.join("summary.md");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}
