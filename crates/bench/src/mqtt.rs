//! `onehop bench mqtt`: MQTT publish → subscribe through the broker, open loop.
//!
//! Publishers and subscribers each have their own connection (MQTT 3.1.1, QoS 1 by default).
//! Messages go out on the open-loop schedule: message `seq` is due at `seq / rate` seconds,
//! its 256-byte payload carries that intended time, and latency counts from it to a
//! subscriber's receipt, so a stalled broker cannot hide queueing behind a slow sender. The
//! scheduler thread writes whatever is due to the publishers' blocking sockets itself;
//! subscribers are OS threads; one process, one monotonic clock; the broker is another
//! process. W4 is this benchmark with the study's parameters. `--sweep` doubles the rate from `--rate` until p99 exceeds 10 ms or a
//! message goes missing, and reports the highest rate that held.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Serialize;

use crate::analysis::analyze;
use crate::client::mqtt::{Connection, PAYLOAD_BYTES_MIN};
use crate::histogram::quantile_us;
use crate::plan::{Ingest, Plan};
use crate::run::{RunSpec, run_once};
use crate::schedule::{DriveLimits, Schedule};
use crate::target::TargetOptions;
use crate::target::onehop::OnehopTarget;

/// A rate held when p99 stays at or under this and every message arrives.
const SWEEP_P99_LIMIT_US: f64 = 10_000.0;
/// A sweep stops here even if everything held.
const SWEEP_RATE_MAX: f64 = 2_000_000.0;

#[derive(Clone, Debug)]
pub struct MqttBenchOptions {
    /// A running broker (`host:port`); `None` starts `exe serve` on a temporary data directory.
    pub address: Option<String>,
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub publishers: usize,
    pub subscribers: usize,
    /// Messages per second, all publishers together.
    pub rate: f64,
    pub duration: Duration,
    pub warmup: Duration,
    pub payload_bytes: usize,
    pub qos: u8,
    /// Double the rate from `rate` until it no longer holds.
    pub sweep: bool,
    /// Extra connections that connect and stay idle (to measure what idle clients cost).
    pub idle_clients: usize,
    pub progress: bool,
}

impl Default for MqttBenchOptions {
    fn default() -> Self {
        MqttBenchOptions {
            address: None,
            exe: PathBuf::from("onehop"),
            dir: PathBuf::from("."),
            publishers: 1,
            subscribers: 1,
            rate: 1000.0,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            payload_bytes: 256,
            qos: 1,
            sweep: false,
            idle_clients: 0,
            progress: true,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MqttReport {
    pub bench: &'static str,
    pub rate: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub delivered_pct: f64,
    pub publishers: usize,
    pub subscribers: usize,
    pub qos: u8,
    pub payload_bytes: usize,
    /// Messages due in the measured window, those the broker acknowledged, and refusals.
    pub published: u64,
    pub acked: u64,
    pub errors: u64,
    pub deliveries_expected: u64,
    pub deliveries: u64,
    /// Intended send → PUBACK (durable), for comparison.
    pub ack_p50_us: f64,
    pub ack_p99_us: f64,
    pub idle_clients: usize,
    pub server_rss_mb: Option<f64>,
    /// With `--sweep`: the highest rate that held, and every rate tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rate_held: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sweep: Vec<SweepPoint>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub delivered_pct: f64,
    pub held: bool,
}

/// One run at `rate`.
fn run_once_at(
    options: &MqttBenchOptions,
    target: &OnehopTarget,
    rate: f64,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<MqttReport> {
    let plan = Plan::Ingest(Ingest {
        publishers: options.publishers as u32,
        subscribers: options.subscribers as u32,
        qos: options.qos,
        payload_bytes: options.payload_bytes,
        durability: "fsync".into(),
    });
    let spec = RunSpec {
        schedule: Schedule { rate_hz: rate, warmup: options.warmup, duration: options.duration },
        query_rate_hz: None,
        limits: DriveLimits::default(),
        label: format!("mqtt {rate:.0}/s"),
        progress: options.progress,
        pauses: None,
    };
    let data = run_once(target, &plan, &spec, runtime)?;
    let figures = analyze(&plan, &data.recorder, &mut |_| {});
    let errors = &figures.errors;
    Ok(MqttReport {
        bench: "mqtt",
        rate,
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
        publishers: options.publishers,
        subscribers: options.subscribers,
        qos: options.qos,
        payload_bytes: options.payload_bytes,
        published: figures.producer_emitted,
        acked: figures.producer_acked,
        errors: errors.total(),
        deliveries_expected: figures.deliveries_expected,
        deliveries: figures.deliveries_seen,
        ack_p50_us: quantile_us(&figures.ack, 0.5),
        ack_p99_us: quantile_us(&figures.ack, 0.99),
        idle_clients: options.idle_clients,
        server_rss_mb: data.server_rss_mb,
        max_rate_held: None,
        sweep: Vec::new(),
    })
}

/// Runs the benchmark (one rate, or a sweep) and returns its figures.
pub fn run(options: &MqttBenchOptions, runtime: &tokio::runtime::Handle) -> anyhow::Result<MqttReport> {
    if options.publishers == 0
        || options.subscribers == 0
        || !(options.rate.is_finite() && options.rate > 0.0)
        || options.qos > 2
    {
        bail!("publishers, subscribers and rate must be positive, and qos 0, 1 or 2");
    }
    if options.payload_bytes < PAYLOAD_BYTES_MIN {
        bail!("--payload-bytes must be at least {PAYLOAD_BYTES_MIN}: the intended send time and a sequence number");
    }
    let target = OnehopTarget::start(&TargetOptions {
        url: None,
        mqtt_address: options.address.clone(),
        exe: options.exe.clone(),
        dir: options.dir.clone(),
        kafka_brokers: 3,
        kafka_fsync: false,
        logs: None,
    })?;
    // Idle clients: connected, then silent for the whole run.
    let mut idle = Vec::with_capacity(options.idle_clients);
    for index in 0..options.idle_clients {
        idle.push(
            Connection::open(target.mqtt_address(), &format!("bench-idle-{index}")).context("opening idle clients")?,
        );
    }
    if !options.sweep {
        let report = run_once_at(options, &target, options.rate, runtime)?;
        drop(idle);
        return Ok(report);
    }
    let mut points = Vec::new();
    let mut best: Option<MqttReport> = None;
    let mut first: Option<MqttReport> = None;
    let mut rate = options.rate;
    loop {
        let report = run_once_at(options, &target, rate, runtime)?;
        let held = report.p99_us <= SWEEP_P99_LIMIT_US && report.delivered_pct >= 100.0 && report.errors == 0;
        eprintln!(
            "rate {rate:>9.0}/s  p50 {:>8.0} µs  p99 {:>8.0} µs  delivered {:.2} %  {}",
            report.p50_us,
            report.p99_us,
            report.delivered_pct,
            if held { "held" } else { "did not hold" }
        );
        points.push(SweepPoint {
            rate,
            p50_us: report.p50_us,
            p99_us: report.p99_us,
            delivered_pct: report.delivered_pct,
            held,
        });
        if first.is_none() {
            first = Some(report.clone());
        }
        if !held {
            break;
        }
        best = Some(report);
        rate *= 2.0;
        if rate > SWEEP_RATE_MAX {
            break;
        }
    }
    drop(idle);
    // The figures of the highest rate that held, or of the first rate when none did.
    let mut report = best.or(first).expect("the sweep ran at least once");
    report.max_rate_held = points.iter().filter(|point| point.held).map(|point| point.rate).reduce(f64::max);
    report.sweep = points;
    Ok(report)
}

pub fn table(report: &MqttReport) -> String {
    let mut text = format!(
        "mqtt benchmark — {} publisher(s) → broker → {} subscriber(s), MQTT 3.1.1 QoS {}, {}-byte payloads\n\
         {:.0} messages/s, {} due in the measured window\n\n\
         publish → subscriber  p50 {:>8.0} µs   p90 {:>8.0} µs   p99 {:>8.0} µs   p99.9 {:>8.0} µs   max {:>8.0} µs\n\
         publish → PUBACK      p50 {:>8.0} µs   p99 {:>8.0} µs\n\
         delivered {:.2} % ({} of {}), acknowledged {}, errors {}{}{}\n",
        report.publishers,
        report.subscribers,
        report.qos,
        report.payload_bytes,
        report.rate,
        report.published,
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
        report.acked,
        report.errors,
        if report.idle_clients > 0 { format!(", {} idle clients", report.idle_clients) } else { String::new() },
        report.server_rss_mb.map_or_else(String::new, |mb| format!(", server RSS {mb:.0} MiB")),
    );
    if let Some(rate) = report.max_rate_held {
        text.push_str(&format!("sweep: highest rate that held (p99 ≤ 10 ms, 100 % delivered): {rate:.0} messages/s\n"));
    } else if !report.sweep.is_empty() {
        text.push_str("sweep: no rate held\n");
    }
    text
}

pub fn json_line(report: &MqttReport) -> String {
    serde_json::to_string(report).expect("the report serializes")
}
