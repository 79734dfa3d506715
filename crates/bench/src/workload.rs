//! The study-1 workloads (W1–W4), their published parameters, and an invocation: each
//! workload against each target, at each rate, `runs` times, histograms merged per rate.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::runtime::Handle;

use crate::analysis::{Figures, analyze};
use crate::plan::{Fanout, Ingest, Plan, Protocol, Routing, ViewPlan};
use crate::report::{self, RunMeta};
use crate::run::{RunSpec, run_once};
use crate::schedule::{DriveLimits, Schedule};
use crate::target::{self, TargetOptions};
use crate::timeline::Timeline;

/// The seed of every random choice (W1's keys per event, W2's tags per subscriber and per
/// event, W3's keys), unless `--seed` says otherwise.
pub const SEED_DEFAULT: u64 = 20_261_121;
/// HTTP producers let due events gather for this long into one NDJSON batch above
/// [`LINGER_ABOVE_HZ`]; below it every event is its own request at its own time.
pub const LINGER: Duration = Duration::from_millis(1);
pub const LINGER_ABOVE_HZ: f64 = 2_000.0;
/// MQTT publishers let due events gather for this long above [`MQTT_LINGER_ABOVE_HZ`], so one
/// write carries 5 or more PUBLISH packets instead of the scheduler waking ~14 000 times a
/// second to write a few. Measured at 100 000/s (W4): p50 0.95–1.27 → 0.50–0.60 ms, because the
/// harness's sleeps and writes no longer take the CPU the broker needs. A Kafka producer in the
/// published W4 lingers 5 ms; latency still counts from each event's intended time.
pub const MQTT_LINGER: Duration = Duration::from_micros(250);
pub const MQTT_LINGER_ABOVE_HZ: f64 = 20_000.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    W1,
    W2,
    W3,
    W4,
}

impl Workload {
    pub const ALL: [Workload; 4] = [Workload::W1, Workload::W2, Workload::W3, Workload::W4];

    pub fn id(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
        }
    }

    /// One line on what the workload does.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::W1 => {
                "save an event durably (HTTP, fsync), notify every subscriber whose lookup key it carries: \
                 1 000 keys, one SSE subscriber per key, 5 keys per event"
            }
            Workload::W2 => {
                "deliver each message to every subscriber of its tag: 100 SSE subscribers × 3 of 10 tags, \
                 1 tag per event, confirmed writes (fsync)"
            }
            Workload::W3 => {
                "windowed count per key (tumbling 5 s, grace 1 s) over 100 uniform keys; freshness, \
                 window-close lag, point queries at 20/s over HTTP keep-alive"
            }
            Workload::W4 => {
                "sustained ingestion, 256-byte payloads, publisher and consumer on separate connections: \
                 MQTT QoS 1 against onehop (fsync), mosquitto and NATS; a producer and a batching \
                 consumer against Kafka (each target's durability in its row)"
            }
        }
    }

    /// The published load: events per second, measured seconds, warm-up seconds.
    pub fn defaults(self) -> (f64, f64, f64) {
        match self {
            Workload::W1 => (50.0, 15.0, 3.0),
            Workload::W2 => (10.0, 15.0, 3.0),
            Workload::W3 => (100.0, 30.0, 5.0),
            Workload::W4 => (1_000.0, 30.0, 5.0),
        }
    }

    /// What the workload asks of a target.
    pub fn plan(self, seed: u64, view_keys: Option<u32>) -> Plan {
        match self {
            Workload::W1 => Plan::Fanout(Fanout {
                routing: Routing::Lookup { keys: 1_000, keys_per_event: 5, seed },
                protocol: Protocol::Sse,
                durability: "fsync".into(),
            }),
            Workload::W2 => Plan::Fanout(Fanout {
                routing: Routing::tags(100, 10, 3, seed),
                protocol: Protocol::Sse,
                durability: "fsync".into(),
            }),
            Workload::W3 => Plan::View(ViewPlan {
                keys: view_keys.unwrap_or(100),
                window_ms: 5_000,
                grace_ms: 1_000,
                query_rate_hz: 20.0,
                durability: "fsync".into(),
                seed,
            }),
            Workload::W4 => Plan::Ingest(Ingest {
                publishers: 1,
                subscribers: 1,
                qos: 1,
                payload_bytes: 256,
                durability: "fsync".into(),
            }),
        }
    }
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "w1" => Ok(Workload::W1),
            "w2" => Ok(Workload::W2),
            "w3" => Ok(Workload::W3),
            "w4" => Ok(Workload::W4),
            other => Err(format!("unknown workload {other:?}: expected w1, w2, w3 or w4")),
        }
    }
}

/// The knobs of a plan, as recorded in meta.json.
pub fn knobs(plan: &Plan, limits: &DriveLimits) -> serde_json::Value {
    let mut knobs = match plan {
        Plan::Fanout(fanout) => {
            let mut knobs = match &fanout.routing {
                Routing::Lookup { keys, keys_per_event, seed } => serde_json::json!({
                    "lookup_keys": keys, "keys_per_event": keys_per_event, "subscribers": keys,
                    "subscription": "one per key: field filter keys=k{n}", "seed": seed,
                }),
                Routing::Tags { tags, of_subscriber, seed, .. } => serde_json::json!({
                    "tags": tags, "subscribers": of_subscriber.len(),
                    "tags_per_subscriber": of_subscriber.first().map_or(0, Vec::len),
                    "tags_per_event": 1, "subscription": "one per (subscriber, tag): subject tags/t{n}",
                    "seed": seed,
                }),
                Routing::Subjects { subscribers, subjects } => {
                    serde_json::json!({ "subscribers": subscribers, "subjects": subjects })
                }
            };
            knobs["protocol"] = serde_json::json!(fanout.protocol);
            knobs["write"] = "HTTP POST /streams/{s} (NDJSON when several are due together)".into();
            knobs
        }
        Plan::View(view) => serde_json::json!({
            "keys": view.keys, "key_distribution": "uniform", "window": "tumbling", "window_ms": view.window_ms,
            "grace_ms": view.grace_ms, "emit": "changes,final", "event_time": "the event's intended send time",
            "query_rate_hz": view.query_rate_hz, "query": "GET /views/{v}/{key}, uniform keys, HTTP keep-alive",
            "subscription": "SSE on /views/{v} (every key)", "seed": view.seed,
        }),
        Plan::Ingest(ingest) => serde_json::json!({
            "protocol": "MQTT 3.1.1", "qos": ingest.qos, "payload_bytes": ingest.payload_bytes,
            "publishers": ingest.publishers, "subscribers": ingest.subscribers,
        }),
    };
    knobs["partitions"] = 1.into();
    knobs["in_flight_max"] = limits.in_flight_max.into();
    knobs["batch_max"] = limits.batch_max.into();
    knobs["linger_us"] = (limits.linger.as_micros() as u64).into();
    knobs
}

/// The knobs of a run at `rate_hz`: the plan's, and how the scheduler sent.
pub fn run_knobs(plan: &Plan, limits: &DriveLimits, rate_hz: f64) -> serde_json::Value {
    let mut knobs = knobs(plan, limits);
    knobs["scheduler_spin_us"] = (crate::schedule::spin_for(rate_hz).as_micros() as u64).into();
    knobs["harness_nice"] = crate::priority::nice_for(rate_hz).into();
    knobs
}

/// How the scheduler may batch for `plan` at `rate_hz`.
pub fn limits_for(plan: &Plan, rate_hz: f64) -> DriveLimits {
    let linger = match plan {
        Plan::Fanout(_) | Plan::View(_) if rate_hz > LINGER_ABOVE_HZ => LINGER,
        Plan::Ingest(_) if rate_hz > MQTT_LINGER_ABOVE_HZ => MQTT_LINGER,
        _ => Duration::ZERO,
    };
    DriveLimits { linger, ..DriveLimits::default() }
}

/// One invocation of `onehop bench w1|w2|w3|w4|all`.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    pub workloads: Vec<Workload>,
    pub targets: Vec<String>,
    pub target_options: TargetOptions,
    /// Overrides the workload's rate.
    pub rate_hz: Option<f64>,
    /// Several rates, ascending (replaces `rate_hz`).
    pub sweep: Vec<f64>,
    pub duration: Option<Duration>,
    pub warmup: Option<Duration>,
    pub runs: u32,
    /// Where raw.csv, meta.json, summary.md and the plots go; nothing is written without it.
    pub out: Option<PathBuf>,
    pub progress: bool,
    /// W3's key count.
    pub view_keys: Option<u32>,
    pub seed: u64,
    /// Stop the started onehop server now and then, to see it recover (`--pause-ms`).
    pub pauses: Option<crate::pause::Pauses>,
    /// The command line, for the reports.
    pub command: String,
}

/// One workload on one target at one rate, all its runs merged.
pub struct Summary {
    pub workload: Workload,
    pub target: String,
    pub rate_hz: f64,
    pub runs: u32,
    pub duration: Duration,
    pub warmup: Duration,
    pub durability: String,
    pub figures: Figures,
    pub run_ids: Vec<String>,
    /// Each run's own p50 and p99 latency (ns), in order: the merged histogram hides how much
    /// runs differ.
    pub per_run: Vec<(u64, u64)>,
}

impl BenchOptions {
    /// Refuses what cannot run, with the reason.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.workloads.is_empty() {
            bail!("no workload given");
        }
        if self.targets.is_empty() {
            bail!("--target needs at least one target ({})", target::TARGET_NAMES.join(", "));
        }
        for name in &self.targets {
            if !target::TARGET_NAMES.contains(&name.as_str()) {
                bail!("unknown target {name:?}: the targets are {}", target::TARGET_NAMES.join(", "));
            }
            if self.targets.iter().filter(|other| *other == name).count() > 1 {
                bail!("--target names {name} twice");
            }
        }
        let positive = |rate: f64| rate.is_finite() && rate > 0.0;
        if self.rate_hz.is_some_and(|rate| !positive(rate)) || self.sweep.iter().any(|rate| !positive(*rate)) {
            bail!("rates must be positive numbers of events per second");
        }
        if self.rate_hz.is_some() && !self.sweep.is_empty() {
            bail!("give --rate or --sweep, not both");
        }
        if self.runs == 0 {
            bail!("--runs must be at least 1");
        }
        if self.duration.is_some_and(|duration| duration.is_zero()) {
            bail!("--duration must be positive");
        }
        if self.view_keys == Some(0) {
            bail!("--keys must be positive");
        }
        if let Some(pauses) = self.pauses {
            if pauses.length.is_zero() || pauses.length > Duration::from_secs(10) {
                bail!("--pause-ms must be above 0 and at most 10000");
            }
            if pauses.every <= pauses.length {
                bail!("--pause-every must be longer than --pause-ms: a pause must end before the next begins");
            }
            if self.target_options.url.is_some() && self.targets.iter().any(|name| name == "onehop") {
                bail!("--pause-ms stops the onehop server the harness starts: it cannot be used with --url");
            }
            let stoppable = |name: &str| name == "echo" || target::onehop::Protection::of_target(name).is_some();
            if let Some(peer) = self.targets.iter().find(|name| !stoppable(name)) {
                bail!("--pause-ms stops a onehop server; it does not apply to the peer {peer}");
            }
        }
        let guarded = |name: &&String| target::onehop::Protection::of_target(name).is_some_and(|p| p.access || p.tls);
        if let Some(name) = self.targets.iter().find(guarded)
            && (self.target_options.url.is_some() || self.target_options.mqtt_address.is_some())
        {
            bail!(
                "{name} starts a server of its own, with its own users and certificate: it cannot be used with --url"
            );
        }
        if self.target_options.kafka_brokers != 1 && self.target_options.kafka_brokers != 3 {
            bail!("--kafka-brokers must be 1 or 3 (replication 1, or the study's 3 with min ISR 2)");
        }
        let plans: Vec<Plan> = self.workloads.iter().map(|workload| workload.plan(self.seed, self.view_keys)).collect();
        for name in &self.targets {
            if !plans.iter().any(|plan| target::serves(name, plan)) {
                let ids: Vec<&str> = self.workloads.iter().map(|workload| workload.id()).collect();
                bail!(
                    "target {name} runs none of {}: kafka-stack runs W1 and W2; kafka-stack-poll-5ms runs W1; kafka-streams runs W3; the brokers (kafka, mosquitto, nats, nats-sync) run W4",
                    ids.join(", ")
                );
            }
        }
        Ok(())
    }

    fn rates(&self, workload: Workload) -> Vec<f64> {
        if !self.sweep.is_empty() {
            return self.sweep.clone();
        }
        vec![self.rate_hz.unwrap_or(workload.defaults().0)]
    }
}

/// Runs every workload of `options` against every target and returns the summaries, in order.
pub fn run(options: &BenchOptions, runtime: &Handle) -> anyhow::Result<Vec<Summary>> {
    options.validate()?;
    let context = report::Context::gather(&options.target_options.exe, &options.command);
    let mut summaries = Vec::new();
    for &workload in &options.workloads {
        let (_, duration_s, warmup_s) = workload.defaults();
        let duration = options.duration.unwrap_or(Duration::from_secs_f64(duration_s));
        let warmup = options.warmup.unwrap_or(Duration::from_secs_f64(warmup_s));
        let plan = workload.plan(options.seed, options.view_keys);
        for name in &options.targets {
            if !target::serves(name, &plan) {
                eprintln!("{}: {name} does not run this workload; skipped", workload.id());
                continue;
            }
            // A peer's logs stay with the workload's runs.
            let target_options = TargetOptions {
                logs: options.out.as_ref().map(|out| out.join(workload.id()).join("peer-logs")),
                ..options.target_options.clone()
            };
            let target = target::start(name, &target_options, &plan)
                .with_context(|| format!("{}: starting target {name}", workload.id()))?;
            let target_settings = target.settings();
            for rate_hz in options.rates(workload) {
                let limits = limits_for(&plan, rate_hz);
                let spec = RunSpec {
                    schedule: Schedule { rate_hz, warmup, duration },
                    query_rate_hz: match &plan {
                        Plan::View(view) => Some(view.query_rate_hz),
                        _ => None,
                    },
                    limits,
                    label: String::new(),
                    progress: options.progress,
                    pauses: options.pauses,
                };
                let mut summary = Summary {
                    workload,
                    target: name.clone(),
                    rate_hz,
                    runs: options.runs,
                    duration,
                    warmup,
                    durability: target.durability(&plan),
                    figures: Figures::default(),
                    run_ids: Vec::new(),
                    per_run: Vec::new(),
                };
                for run in 1..=options.runs {
                    let spec =
                        RunSpec { label: format!("{} {name} {rate_hz:.0}/s #{run}", workload.id()), ..spec.clone() };
                    let data = run_once(target.as_ref(), &plan, &spec, runtime)
                        .with_context(|| format!("{} against {name} at {rate_hz}/s", workload.id()))?;
                    let run_id = report::run_id(data.started_at, name, rate_hz, run);
                    let mut raw = match &options.out {
                        Some(out) => Some(report::RawWriter::create(&out.join(workload.id()).join(&run_id))?),
                        None => None,
                    };
                    let mut timeline = raw.as_ref().map(|_| Timeline::new(data.recorder.events.start_ns()));
                    let mut figures = analyze(&plan, &data.recorder, &mut |row| {
                        if let Some(raw) = raw.as_mut() {
                            raw.write(&row);
                        }
                        if let Some(timeline) = timeline.as_mut() {
                            timeline.record(&row);
                        }
                    });
                    figures.server_rss_mb = data.server_rss_mb;
                    figures.target_fsyncs = data.target_fsyncs;
                    figures.target_refusals = data.target_refusals;
                    figures.host = Some(data.host);
                    figures.pauses = data.pauses;
                    if let Some(raw) = raw {
                        let directory = raw.finish()?;
                        let meta = RunMeta {
                            workload,
                            run_id: &run_id,
                            stack: name,
                            schedule: &spec.schedule,
                            durability: &summary.durability,
                            knobs: run_knobs(&plan, &limits, rate_hz),
                            target_settings: &target_settings,
                            figures: &figures,
                            started_at: data.started_at,
                            ended_at: data.ended_at,
                        };
                        report::write_meta(&directory, &meta, &context)?;
                        if let Some(timeline) = timeline {
                            let title = format!("{} {name} {rate_hz:.0}/s #{run}", workload.id());
                            crate::timeline::write(
                                &directory,
                                &title,
                                &timeline.slices(&data.host_samples, &data.stopped_ns),
                            )?;
                        }
                    }
                    eprintln!("{}", report::run_line(workload, name, rate_hz, run, &figures));
                    let latency = crate::histogram::Percentiles::of(&figures.latency);
                    summary.per_run.push((latency.p50_ns, latency.p99_ns));
                    summary.figures.merge(&figures);
                    summary.run_ids.push(run_id);
                }
                summaries.push(summary);
            }
        }
    }
    if let Some(out) = &options.out {
        report::write_summary(out, &summaries, &context)?;
    }
    Ok(summaries)
}
