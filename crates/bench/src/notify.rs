//! `onehop bench notify`: a durable write reaching its subscribers, measured end to end.
//!
//! N subscribers hold SSE (or WebSocket) subscriptions, each to one of K subjects; writes go
//! over HTTP on the open-loop schedule, each to one subject, so it matches N/K subscribers.
//! Latency is from the intended send to a subscriber receiving the record. The same pieces as
//! the workloads (W1/W2 are this with other routing): the scheduler, the HTTP producer, the
//! SSE/WebSocket observers, the analysis.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use serde::Serialize;

use crate::analysis::analyze;
use crate::histogram::quantile_us;
pub use crate::plan::Protocol;
use crate::plan::{Fanout, Plan, Routing};
use crate::run::{RunSpec, run_once};
use crate::schedule::{DriveLimits, Schedule};
use crate::target::TargetOptions;
use crate::target::onehop::OnehopTarget;

#[derive(Clone, Debug)]
pub struct NotifyOptions {
    /// A running server; `None` starts one (`exe serve`) on a temporary data directory.
    pub url: Option<String>,
    pub exe: PathBuf,
    /// Where a started server keeps its data.
    pub dir: PathBuf,
    pub subscribers: usize,
    pub subjects: usize,
    pub rate: f64,
    pub duration: Duration,
    pub warmup: Duration,
    /// `fsync` or `async` for the writes.
    pub durability: String,
    /// Writes that may be awaiting their answer at once; past it a write counts as an error.
    pub in_flight_max: u64,
    /// How subscribers connect: `sse` or `ws`.
    pub protocol: Protocol,
    pub progress: bool,
}

impl Default for NotifyOptions {
    fn default() -> Self {
        NotifyOptions {
            url: None,
            exe: PathBuf::from("onehop"),
            dir: PathBuf::from("."),
            subscribers: 100,
            subjects: 20,
            rate: 1000.0,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            durability: "fsync".into(),
            in_flight_max: 10_000,
            protocol: Protocol::Sse,
            progress: true,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NotifyReport {
    pub bench: &'static str,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub delivered_pct: f64,
    pub subscribers: usize,
    pub subjects: usize,
    pub rate: f64,
    pub protocol: Protocol,
    pub durability: String,
    /// Writes in the measured window, and how many were acknowledged.
    pub writes: u64,
    pub writes_acked: u64,
    pub write_errors: u64,
    pub deliveries_expected: u64,
    pub deliveries: u64,
    /// Intended send to the write's HTTP answer (durable), for comparison.
    pub ack_p50_us: f64,
    pub ack_p99_us: f64,
    /// Resident memory of the server at the end of the measured window, when this run started
    /// the server (its process is known); `None` with `--url`.
    pub server_rss_mb: Option<f64>,
}

/// Runs the benchmark and returns its figures.
pub fn run(options: &NotifyOptions, runtime: &tokio::runtime::Handle) -> anyhow::Result<NotifyReport> {
    if options.subjects == 0 || options.subscribers == 0 || !(options.rate.is_finite() && options.rate > 0.0) {
        bail!("subscribers, subjects and rate must be positive");
    }
    if options.in_flight_max == 0 {
        bail!("the in-flight cap must be positive");
    }
    let target = OnehopTarget::start(&TargetOptions {
        url: options.url.clone(),
        mqtt_address: None,
        exe: options.exe.clone(),
        dir: options.dir.clone(),
        kafka_brokers: 3,
        kafka_fsync: false,
        logs: None,
    })?;
    let plan = Plan::Fanout(Fanout {
        routing: Routing::Subjects { subscribers: options.subscribers as u32, subjects: options.subjects as u32 },
        protocol: options.protocol,
        durability: options.durability.clone(),
    });
    let spec = RunSpec {
        schedule: Schedule { rate_hz: options.rate, warmup: options.warmup, duration: options.duration },
        query_rate_hz: None,
        limits: DriveLimits { in_flight_max: options.in_flight_max, ..DriveLimits::default() },
        label: "notify".into(),
        progress: options.progress,
        pauses: None,
    };
    let data = run_once(&target, &plan, &spec, runtime)?;
    drop(target);
    let figures = analyze(&plan, &data.recorder, &mut |_| {});
    let errors = &figures.errors;
    Ok(NotifyReport {
        bench: "notify",
        p50_us: quantile_us(&figures.latency, 0.5),
        p90_us: quantile_us(&figures.latency, 0.9),
        p99_us: quantile_us(&figures.latency, 0.99),
        p999_us: quantile_us(&figures.latency, 0.999),
        max_us: figures.latency.max() as f64 / 1000.0,
        delivered_pct: if figures.deliveries_expected == 0 {
            0.0
        } else {
            figures.deliveries_seen as f64 * 100.0 / figures.deliveries_expected as f64
        },
        subscribers: options.subscribers,
        subjects: options.subjects,
        rate: options.rate,
        protocol: options.protocol,
        durability: options.durability.clone(),
        writes: figures.producer_emitted,
        writes_acked: figures.producer_acked,
        write_errors: errors.write_failed + errors.write_unanswered + errors.in_flight_cap,
        deliveries_expected: figures.deliveries_expected,
        deliveries: figures.deliveries_seen,
        ack_p50_us: quantile_us(&figures.ack, 0.5),
        ack_p99_us: quantile_us(&figures.ack, 0.99),
        server_rss_mb: data.server_rss_mb,
    })
}

pub fn table(report: &NotifyReport) -> String {
    format!(
        "notify benchmark — write over HTTP ({}) → subscribers over {}, separate processes\n\
         {} subscribers over {} subjects (each write matches {:.0}), {:.0} writes/s, {} writes measured\n\n\
         write → subscriber   p50 {:>8.0} µs   p90 {:>8.0} µs   p99 {:>8.0} µs   p99.9 {:>8.0} µs   max {:>8.0} µs\n\
         write → durable ack  p50 {:>8.0} µs   p99 {:>8.0} µs\n\
         delivered {:.2} % ({} of {}), write errors {}{}\n",
        report.durability,
        if report.protocol == Protocol::Ws { "WebSocket" } else { "SSE" },
        report.subscribers,
        report.subjects,
        report.subscribers as f64 / report.subjects as f64,
        report.rate,
        report.writes,
        report.p50_us,
        report.p90_us,
        report.p99_us,
        report.p999_us,
        report.max_us,
        report.ack_p50_us,
        report.ack_p99_us,
        report.delivered_pct,
        report.deliveries,
        report.deliveries_expected,
        report.write_errors,
        report.server_rss_mb.map_or_else(String::new, |mb| format!(", server RSS {mb:.0} MiB")),
    )
}

pub fn json_line(report: &NotifyReport) -> String {
    serde_json::to_string(report).expect("the report serializes")
}
