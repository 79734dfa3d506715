//! What one run leaves behind: `raw.csv` written as rows come, `meta.json` with its figures and
//! what each measures, and the line printed on stderr when it finishes.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::Context as _;
use serde_json::{Value, json};

use super::context::{Context, rfc3339};
use crate::analysis::{Figures, RAW_HEADER, RawRow};
use crate::histogram::{Percentiles, ms};
use crate::schedule::Schedule;
use crate::workload::Workload;

/// Writes raw.csv into a run's directory as rows come.
pub struct RawWriter {
    directory: PathBuf,
    writer: BufWriter<std::fs::File>,
    error: Option<std::io::Error>,
}

impl RawWriter {
    pub fn create(directory: &Path) -> anyhow::Result<RawWriter> {
        std::fs::create_dir_all(directory).with_context(|| format!("creating {}", directory.display()))?;
        let path = directory.join("raw.csv");
        let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        writeln!(writer, "{RAW_HEADER}")?;
        Ok(RawWriter { directory: directory.to_path_buf(), writer, error: None })
    }

    pub fn write(&mut self, row: &RawRow) {
        if self.error.is_none()
            && let Err(error) = writeln!(self.writer, "{}", row.to_csv())
        {
            self.error = Some(error);
        }
    }

    /// Flushes, and returns the run's directory.
    pub fn finish(mut self) -> anyhow::Result<PathBuf> {
        if let Some(error) = self.error.take() {
            return Err(error).context("writing raw.csv");
        }
        self.writer.flush().context("writing raw.csv")?;
        Ok(self.directory)
    }
}

/// What meta.json records of a run.
pub struct RunMeta<'a> {
    pub workload: Workload,
    pub run_id: &'a str,
    pub stack: &'a str,
    pub schedule: &'a Schedule,
    pub durability: &'a str,
    pub knobs: serde_json::Value,
    /// Everything the target reports of its own setup (versions, durability, batching…).
    pub target_settings: &'a serde_json::Value,
    pub figures: &'a Figures,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
}

/// What the latency column measures, per workload.
pub(super) fn latency_measures(workload: Workload) -> &'static str {
    match workload {
        Workload::W3 => {
            "freshness: intended send of an event → the observer receives a view row that includes it (onehop: over \
             SSE; kafka-streams: a changelog record, read by its consumer)"
        }
        _ => "intended send of an event → an observer receives it (one sample per delivery)",
    }
}

pub fn write_meta(directory: &Path, meta: &RunMeta, context: &Context) -> anyhow::Result<()> {
    let figures = meta.figures;
    let latency = Percentiles::of(&figures.latency);
    let ack = Percentiles::of(&figures.ack);
    let mut value = json!({
        "workload_id": meta.workload.id(),
        "run_id": meta.run_id,
        "stack": meta.stack,
        "target_rate_hz": meta.schedule.rate_hz,
        "duration_secs": meta.schedule.duration.as_secs_f64(),
        "warmup_secs": meta.schedule.warmup.as_secs_f64(),
        "latency_measures": latency_measures(meta.workload),
        "latency_p50_ns": latency.p50_ns,
        "latency_p90_ns": latency.p90_ns,
        "latency_p95_ns": latency.p95_ns,
        "latency_p99_ns": latency.p99_ns,
        "latency_p999_ns": latency.p999_ns,
        "max_ns": latency.max_ns,
        "producer_emitted": figures.producer_emitted,
        "producer_acked": figures.producer_acked,
        "observer_seen": figures.observer_seen,
        "joined_count": figures.joined_count,
        "delivered_pct": figures.delivered_pct(),
        "deliveries_expected": figures.deliveries_expected,
        "deliveries_seen": figures.deliveries_seen,
        "duplicates": figures.duplicates,
        "errors": figures.errors.total(),
        "error_detail": figures.errors,
        "problems": figures.problems,
        "ack_p50_ns": ack.p50_ns,
        "ack_p99_ns": ack.p99_ns,
        "ack_measures": "intended send → the target acknowledged the write (durable at `durability`)",
        "send_lag_p50_ns": Percentiles::of(&figures.send_lag).p50_ns,
        "send_lag_p99_ns": Percentiles::of(&figures.send_lag).p99_ns,
        "send_lag_max_ns": Percentiles::of(&figures.send_lag).max_ns,
        "send_lag_measures": "intended send → written to the socket: the harness's own lateness",
        "sent_rate_hz": figures.sent_rate_hz,
        "server_rss_mb": figures.server_rss_mb,
        "durability": meta.durability,
        "knobs": meta.knobs,
        "host_info": context.host_info,
        "git_sha": context.git_sha,
        "git_dirty": context.git_dirty,
        "command": context.command,
        "started_at": rfc3339(meta.started_at),
        "ended_at": rfc3339(meta.ended_at),
    });
    value["target_settings"] = meta.target_settings.clone();
    value["observer_resumes"] = figures.observer_resumes.into();
    value["saturation"] = json!(figures.saturation.first());
    value["saturation_measures"] = "whether the run kept up with its rate: saturated when the median latency of the \
        events due in the last quarter of the measured window is at least twice the first quarter's and 10 ms above \
        it, or when 1 % or more of the events were skipped at the in-flight cap; a saturated run's latencies are \
        queue depth, not service time"
        .into();
    value["target_fsyncs"] = json!(figures.target_fsyncs.as_ref().map(crate::fsyncs::Fsyncs::summary));
    value["host_usage"] = json!(figures.host.as_ref().map(crate::host::HostUsage::summary));
    value["pauses"] = json!(figures.pauses);
    value["pauses_measures"] = "stalls made on purpose (--pause-ms): the server the harness started stopped \
        (SIGSTOP) for length_ms every every_s seconds of the measured window, the first one interval after the \
        warm-up, then continued (SIGCONT); made, and the time it was stopped in all; null when none were asked for \
        or the target is not a started server"
        .into();
    value["host_usage_measures"] = "over the same span: CPU time of the harness process (the echo target included) \
        and of a server it started (null with --url) ÷ wall time, the share of that time some task waited for a \
        CPU or for I/O, or all did for I/O (Linux PSI; null where the kernel has none), and the CPU time the \
        hypervisor took from this machine's CPUs while they had work (steal, ms, summed over the CPUs)"
        .into();
    value["target_refusals"] = json!(figures.target_refusals);
    value["target_refusals_measures"] = "failed logins and failed TLS handshakes the target counted (its \
        auth_failures_total and tls_handshake_failures_total, every protocol) from just before the schedule to the \
        end of the drain: 0 when every client of the harness got in; null when the target counts none"
        .into();
    value["target_fsyncs_measures"] = "the target's own fdatasyncs (from its /metrics) from just before the \
        schedule to the end of the drain, warm-up included; null when the target exposes none"
        .into();
    let harness = Percentiles::of(&figures.harness);
    value["harness_p50_ns"] = harness.p50_ns.into();
    value["harness_p99_ns"] = harness.p99_ns.into();
    value["harness_samples"] = harness.count.into();
    value["harness_measures"] = "per latency sample: send lag + the receipt's bytes waiting in the observer's socket \
        (kernel arrival stamp) until the harness recorded them: the time the harness itself adds"
        .into();
    let (first, last) = (Percentiles::of(&figures.first_arrival), Percentiles::of(&figures.last_arrival));
    let stamped = |ns: u64| if first.count > 0 { json!(ns) } else { Value::Null };
    value["fanout_events"] = first.count.into();
    value["first_arrival_p50_ns"] = stamped(first.p50_ns);
    value["first_arrival_p99_ns"] = stamped(first.p99_ns);
    value["last_arrival_p50_ns"] = stamped(last.p50_ns);
    value["last_arrival_p99_ns"] = stamped(last.p99_ns);
    value["fanout_measures"] = "per event owed to several observers, all its deliveries stamped by the kernel: \
        intended send → the first of them reaching its observer's socket, and → the last; null when no event \
        had several observers"
        .into();
    if !figures.commit.is_empty() {
        let commit = Percentiles::of(&figures.commit);
        value["commit_p50_ns"] = commit.p50_ns.into();
        value["commit_p95_ns"] = commit.p95_ns.into();
        value["commit_p99_ns"] = commit.p99_ns.into();
        value["commit_max_ns"] = commit.max_ns.into();
        value["commit_count"] = commit.count.into();
        value["commit_measures"] = "intended send of an event → the harness learns that the consumer committed the \
            batch holding it (a peer's batching consumer)"
            .into();
    }
    if meta.workload == Workload::W3 {
        let close = Percentiles::of(&figures.close_lag);
        let query = Percentiles::of(&figures.query);
        value["windows_expected"] = figures.windows_expected.into();
        value["close_lag_p50_ns"] = close.p50_ns.into();
        value["close_lag_p99_ns"] = close.p99_ns.into();
        value["close_lag_max_ns"] = close.max_ns.into();
        let final_fresh = Percentiles::of(&figures.final_fresh);
        value["final_p50_ns"] = final_fresh.p50_ns.into();
        value["final_p95_ns"] = final_fresh.p95_ns.into();
        value["final_p99_ns"] = final_fresh.p99_ns.into();
        value["final_max_ns"] = final_fresh.max_ns.into();
        value["final_count"] = final_fresh.count.into();
        value["final_measures"] = "intended send of an event → its window's closing (final) row received (onehop: the \
            view's final row over SSE; kafka-streams: the suppress(untilWindowCloses) record, read by its consumer)"
            .into();
        value["queries_emitted"] = figures.queries_emitted.into();
        value["query_p50_ns"] = query.p50_ns.into();
        value["query_p95_ns"] = query.p95_ns.into();
        value["query_p99_ns"] = query.p99_ns.into();
        value["query_max_ns"] = query.max_ns.into();
    }
    let path = directory.join("meta.json");
    std::fs::write(&path, serde_json::to_string_pretty(&value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// One line per run on stderr, as runs finish.
pub fn run_line(workload: Workload, target: &str, rate_hz: f64, run: u32, figures: &Figures) -> String {
    let latency = Percentiles::of(&figures.latency);
    format!(
        "{} {target} {rate_hz:.0}/s run {run}: p50 {} ms, p99 {} ms, delivered {:.2} %, errors {}{}{}{}{}",
        workload.id(),
        ms(latency.p50_ns),
        ms(latency.p99_ns),
        figures.delivered_pct(),
        figures.errors.total(),
        figures
            .saturation
            .iter()
            .find(|run| run.saturated)
            .map_or_else(String::new, |saturation| format!("; saturated: {}", saturation.describe())),
        figures
            .target_fsyncs
            .as_ref()
            .map_or_else(String::new, |fsyncs| format!("; target fsyncs {}", fsyncs.summary().describe())),
        figures.host.as_ref().map_or_else(String::new, |host| format!("; {}", host.summary().describe())),
        figures.pauses.as_ref().map_or_else(String::new, |pauses| format!("; {}", describe_pauses(pauses)))
    )
}

/// The stalls made on purpose, in words.
pub(super) fn describe_pauses(pauses: &crate::pause::PauseFigures) -> String {
    format!(
        "stopped on purpose {} time(s) for {:.0} ms every {} s, {:.0} ms in all",
        pauses.made, pauses.length_ms, pauses.every_s, pauses.stopped_ms
    )
}
