//! What an invocation leaves behind: per run `raw.csv` and `meta.json`, per invocation a
//! `summary.md` and SVG plots, and the lines printed at the end.

use std::fmt::Write as _;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use serde::Serialize;
use serde_json::{Value, json};

use crate::analysis::{Figures, RAW_HEADER, RawRow};
use crate::histogram::{Percentiles, ms};
use crate::plot::{Chart, Series};
use crate::schedule::Schedule;
use crate::workload::{Summary, Workload};

/// Facts about the machine and the build, gathered once per invocation.
pub struct Context {
    pub host_info: serde_json::Value,
    pub git_sha: String,
    pub git_dirty: Option<bool>,
    pub command: String,
}

fn first_line(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|text| text.trim().to_string())
}

impl Context {
    /// `exe` locates the source tree for the git revision (the binary is built inside it).
    pub fn gather(exe: &Path, command: &str) -> Context {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split(':').nth(1))
                .map(|model| model.trim().to_string())
        });
        let memory_bytes = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
            let line = text.lines().find(|line| line.starts_with("MemTotal:"))?;
            line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib * 1024)
        });
        let host_info = json!({
            "hostname": first_line("/proc/sys/kernel/hostname"),
            "os": std::env::consts::OS,
            "kernel": first_line("/proc/sys/kernel/osrelease"),
            "cpu_model": cpu_model,
            "cpus": std::thread::available_parallelism().map_or(0, |count| count.get()),
            "memory_bytes": memory_bytes,
            "harness_build": if cfg!(debug_assertions) { "debug" } else { "release" },
            "harness_version": env!("CARGO_PKG_VERSION"),
        });
        let directory = exe.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .arg("-C")
                .arg(&directory)
                .args(args)
                .output()
                .ok()
                .filter(|output| output.status.success())
                .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
        };
        let git_sha = git(&["rev-parse", "HEAD"]).filter(|sha| !sha.is_empty()).unwrap_or_else(|| "unknown".into());
        let git_dirty = git(&["status", "--porcelain", "--untracked-files=no"]).map(|status| !status.is_empty());
        Context { host_info, git_sha, git_dirty, command: command.to_string() }
    }
}

/// RFC 3339 in UTC, to the millisecond.
pub fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let seconds = since.as_secs() as i64;
    let (days, rest) = (seconds.div_euclid(86_400), seconds.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// `20261121T101500Z-onehop-50hz-r1`: sortable, unique per run of an invocation.
pub fn run_id(started_at: SystemTime, target: &str, rate_hz: f64, run: u32) -> String {
    let stamp: String = rfc3339(started_at)[..19].chars().filter(|c| c.is_ascii_digit() || *c == 'T').collect();
    format!("{stamp}Z-{target}-{rate_hz:.0}hz-r{run}")
}

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
    pub figures: &'a Figures,
    pub started_at: SystemTime,
    pub ended_at: SystemTime,
}

/// What the latency column measures, per workload.
fn latency_measures(workload: Workload) -> &'static str {
    match workload {
        Workload::W3 => "freshness: intended send of an event → the subscriber receives a view row that includes it",
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
    if meta.workload == Workload::W3 {
        let close = Percentiles::of(&figures.close_lag);
        let query = Percentiles::of(&figures.query);
        value["windows_expected"] = figures.windows_expected.into();
        value["close_lag_p50_ns"] = close.p50_ns.into();
        value["close_lag_p99_ns"] = close.p99_ns.into();
        value["close_lag_max_ns"] = close.max_ns.into();
        value["queries_emitted"] = figures.queries_emitted.into();
        value["query_p50_ns"] = query.p50_ns.into();
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
fn describe_pauses(pauses: &crate::pause::PauseFigures) -> String {
    format!(
        "stopped on purpose {} time(s) for {:.0} ms every {} s, {:.0} ms in all",
        pauses.made, pauses.length_ms, pauses.every_s, pauses.stopped_ms
    )
}

/// The JSON line of one summary (`--json`).
#[derive(Serialize)]
pub struct JsonLine<'a> {
    pub workload: &'static str,
    pub target: &'a str,
    pub rate_hz: f64,
    pub runs: u32,
    pub p50_ns: u64,
    pub p95_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    pub producer_emitted: u64,
    pub observer_seen: u64,
    pub delivered_pct: f64,
    pub errors: u64,
    pub ack_p50_ns: u64,
    pub ack_p99_ns: u64,
    pub send_lag_p50_ns: u64,
    pub send_lag_p99_ns: u64,
    /// Whether any of the runs was saturated (see `saturation.rs`).
    pub saturated: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness_p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub harness_p99_ns: Option<u64>,
    pub durability: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freshness_p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freshness_p99_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_p99_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close_lag_p99_ns: Option<u64>,
}

pub fn json_line(summary: &Summary) -> String {
    let figures = &summary.figures;
    let latency = Percentiles::of(&figures.latency);
    let ack = Percentiles::of(&figures.ack);
    let view = summary.workload == Workload::W3;
    let query = Percentiles::of(&figures.query);
    let harness = Percentiles::of(&figures.harness);
    let line = JsonLine {
        workload: summary.workload.id(),
        target: &summary.target,
        rate_hz: summary.rate_hz,
        runs: summary.runs,
        p50_ns: latency.p50_ns,
        p95_ns: latency.p95_ns,
        p99_ns: latency.p99_ns,
        p999_ns: latency.p999_ns,
        max_ns: latency.max_ns,
        producer_emitted: figures.producer_emitted,
        observer_seen: figures.observer_seen,
        delivered_pct: figures.delivered_pct(),
        errors: figures.errors.total(),
        ack_p50_ns: ack.p50_ns,
        ack_p99_ns: ack.p99_ns,
        send_lag_p50_ns: Percentiles::of(&figures.send_lag).p50_ns,
        send_lag_p99_ns: Percentiles::of(&figures.send_lag).p99_ns,
        saturated: figures.saturated_runs() > 0,
        harness_p50_ns: (harness.count > 0).then_some(harness.p50_ns),
        harness_p99_ns: (harness.count > 0).then_some(harness.p99_ns),
        durability: &summary.durability,
        freshness_p50_ns: view.then_some(latency.p50_ns),
        freshness_p99_ns: view.then_some(latency.p99_ns),
        query_p50_ns: view.then_some(query.p50_ns),
        query_p99_ns: view.then_some(query.p99_ns),
        close_lag_p99_ns: view.then(|| Percentiles::of(&figures.close_lag).p99_ns),
    };
    serde_json::to_string(&line).expect("the line serializes")
}

/// The last line of `onehop bench view --json`.
#[derive(Serialize)]
pub struct ViewLine {
    pub bench: &'static str,
    pub freshness_p50_us: f64,
    pub freshness_p99_us: f64,
    pub close_lag_p99_ms: f64,
    pub query_p50_us: f64,
    pub query_p99_us: f64,
    pub freshness_p999_us: f64,
    pub close_lag_p50_ms: f64,
    pub rate: f64,
    pub keys: u32,
    pub events: u64,
    pub delivered_pct: f64,
    pub windows: u64,
    pub queries: u64,
    pub errors: u64,
    /// Times the subscriber was cut off for falling behind and resumed without a gap.
    pub resumes: u64,
    /// Whether the run could not keep up with its rate (see `saturation.rs`).
    pub saturated: bool,
    pub write_ack_p50_us: f64,
    pub server_rss_mb: Option<f64>,
}

pub fn view_line(summary: &Summary, keys: u32) -> ViewLine {
    let figures = &summary.figures;
    let us = |ns: u64| ns as f64 / 1e3;
    let (fresh, close, query, ack) = (
        Percentiles::of(&figures.latency),
        Percentiles::of(&figures.close_lag),
        Percentiles::of(&figures.query),
        Percentiles::of(&figures.ack),
    );
    ViewLine {
        bench: "view",
        freshness_p50_us: us(fresh.p50_ns),
        freshness_p99_us: us(fresh.p99_ns),
        close_lag_p99_ms: close.p99_ns as f64 / 1e6,
        query_p50_us: us(query.p50_ns),
        query_p99_us: us(query.p99_ns),
        freshness_p999_us: us(fresh.p999_ns),
        close_lag_p50_ms: close.p50_ns as f64 / 1e6,
        rate: summary.rate_hz,
        keys,
        events: figures.producer_emitted,
        delivered_pct: figures.delivered_pct(),
        windows: close.count,
        queries: query.count,
        errors: figures.errors.total(),
        resumes: figures.observer_resumes,
        saturated: figures.saturated_runs() > 0,
        write_ack_p50_us: us(ack.p50_ns),
        server_rss_mb: figures.server_rss_mb,
    }
}

pub fn view_table(line: &ViewLine) -> String {
    format!(
        "view benchmark — {:.0} events/s over {} keys into a 5 s tumbling count (grace 1 s), \
         a subscriber on the whole view, point queries at 20/s over HTTP keep-alive\n\n\
         freshness (intended send → a row that includes it)  p50 {:>8.0} µs   p99 {:>8.0} µs   p99.9 {:>8.0} µs\n\
         window close lag (end + grace → final row)          p50 {:>8.1} ms   p99 {:>8.1} ms   ({} windows)\n\
         point query (GET /views/{{v}}/{{key}})                  p50 {:>8.0} µs   p99 {:>8.0} µs   ({} queries)\n\
         write → durable ack p50 {:.0} µs; delivered {:.2} % of {} events, errors {}, subscriber resumes {}{}\n",
        line.rate,
        line.keys,
        line.freshness_p50_us,
        line.freshness_p99_us,
        line.freshness_p999_us,
        line.close_lag_p50_ms,
        line.close_lag_p99_ms,
        line.windows,
        line.query_p50_us,
        line.query_p99_us,
        line.queries,
        line.write_ack_p50_us,
        line.delivered_pct,
        line.events,
        line.errors,
        line.resumes,
        line.server_rss_mb.map_or_else(String::new, |mb| format!(", server RSS {mb:.0} MiB")),
    )
}

/// The side-by-side tables, as Markdown (printed too: it reads as plain text).
pub fn tables(summaries: &[Summary]) -> String {
    let mut text = String::new();
    let mut workloads: Vec<Workload> = summaries.iter().map(|summary| summary.workload).collect();
    workloads.dedup();
    for workload in workloads {
        let rows: Vec<&Summary> = summaries.iter().filter(|summary| summary.workload == workload).collect();
        let first = rows[0];
        let _ = writeln!(text, "### {} — {}\n", workload.id(), workload.describe());
        let _ = writeln!(
            text,
            "{} s measured after {} s warm-up, {} run(s) per rate, histograms merged across runs. \
             Latency: {}.\n",
            first.duration.as_secs_f64(),
            first.warmup.as_secs_f64(),
            first.runs,
            latency_measures(workload)
        );
        let _ = writeln!(
            text,
            "| target | rate /s | p50 ms | p95 ms | p99 ms | p99.9 ms | max ms | write ack p50 ms | send lag p50 / p99 ms | delivered | errors | durability |"
        );
        let _ = writeln!(text, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for summary in &rows {
            let latency = Percentiles::of(&summary.figures.latency);
            let ack = Percentiles::of(&summary.figures.ack);
            let lag = Percentiles::of(&summary.figures.send_lag);
            let _ = writeln!(
                text,
                "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} / {} | {:.2} % ({} of {}) | {} | {} |",
                summary.target,
                summary.rate_hz,
                ms(latency.p50_ns),
                ms(latency.p95_ns),
                ms(latency.p99_ns),
                ms(latency.p999_ns),
                ms(latency.max_ns),
                ms(ack.p50_ns),
                ms(lag.p50_ns),
                ms(lag.p99_ns),
                summary.figures.delivered_pct(),
                summary.figures.observer_seen,
                summary.figures.producer_emitted,
                summary.figures.errors.total(),
                summary.durability
            );
        }
        for summary in &rows {
            if let Some(pauses) = &summary.figures.pauses {
                let _ = writeln!(
                    text,
                    "\n{} at {:.0}/s was {} (SIGSTOP, then SIGCONT), from one interval after the warm-up; the latencies include catching up.",
                    summary.target,
                    summary.rate_hz,
                    describe_pauses(pauses)
                );
            }
        }
        // Run by run, where there were several: the merged figures above hide the spread.
        for summary in rows.iter().filter(|summary| summary.per_run.len() > 1) {
            let runs: Vec<String> =
                summary.per_run.iter().map(|&(p50, p99)| format!("{} / {}", ms(p50), ms(p99))).collect();
            let _ = writeln!(
                text,
                "\n{} at {:.0}/s, run by run (p50 / p99 ms): {}.",
                summary.target,
                summary.rate_hz,
                runs.join(", ")
            );
        }
        if workload == Workload::W3 {
            let _ = writeln!(
                text,
                "\n| target | rate /s | freshness p50 ms | freshness p99 ms | close lag p50 ms | close lag p99 ms | windows | query p50 ms | query p99 ms | queries |"
            );
            let _ = writeln!(text, "|---|---|---|---|---|---|---|---|---|---|");
            for summary in &rows {
                let figures = &summary.figures;
                let (fresh, close, query) = (
                    Percentiles::of(&figures.latency),
                    Percentiles::of(&figures.close_lag),
                    Percentiles::of(&figures.query),
                );
                let _ = writeln!(
                    text,
                    "| {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    summary.target,
                    summary.rate_hz,
                    ms(fresh.p50_ns),
                    ms(fresh.p99_ns),
                    ms(close.p50_ns),
                    ms(close.p99_ns),
                    close.count,
                    ms(query.p50_ns),
                    ms(query.p99_ns),
                    query.count
                );
            }
        }
        // The harness's own time, measured per sample from the kernel's arrival stamps.
        for summary in rows.iter().filter(|summary| !summary.figures.harness.is_empty()) {
            let (own, latency) = (Percentiles::of(&summary.figures.harness), Percentiles::of(&summary.figures.latency));
            let _ = writeln!(
                text,
                "\nHarness's own time at {:.0}/s against {} (send lag + socket → recorded, per sample): p50 {:.0} µs, \
                 p99 {:.0} µs; {:.1} % of the p50 latency.",
                summary.rate_hz,
                summary.target,
                own.p50_ns as f64 / 1e3,
                own.p99_ns as f64 / 1e3,
                own.p50_ns as f64 * 100.0 / latency.p50_ns.max(1) as f64
            );
        }
        // The fan-out: when an event's first and last deliveries reached their sockets.
        for summary in rows.iter().filter(|summary| !summary.figures.first_arrival.is_empty()) {
            let (first, last) =
                (Percentiles::of(&summary.figures.first_arrival), Percentiles::of(&summary.figures.last_arrival));
            let _ = writeln!(
                text,
                "\nFan-out at {:.0}/s against {}, per event ({} events): its first delivery reached a subscriber's \
                 socket at p50 {} ms (p99 {} ms), its last at p50 {} ms (p99 {} ms).",
                summary.rate_hz,
                summary.target,
                first.count,
                ms(first.p50_ns),
                ms(first.p99_ns),
                ms(last.p50_ns),
                ms(last.p99_ns)
            );
        }
        // The target's own fdatasyncs, to read a long tail against the disk, and what else the
        // machine did meanwhile.
        for summary in rows.iter() {
            if let Some(fsyncs) = &summary.figures.target_fsyncs {
                let _ = writeln!(
                    text,
                    "\n{}'s own fdatasyncs at {:.0}/s over {} run(s), warm-up included: {}.",
                    summary.target,
                    summary.rate_hz,
                    summary.runs,
                    fsyncs.summary().describe()
                );
            }
            if let Some(host) = &summary.figures.host {
                let _ = writeln!(
                    text,
                    "\nThe machine at {:.0}/s against {} over {} run(s): {}.",
                    summary.rate_hz,
                    summary.target,
                    summary.runs,
                    host.summary().describe()
                );
            }
        }
        // The harness's floor beside what it measured, at each rate both ran.
        for echo in rows.iter().filter(|summary| summary.target == "echo") {
            for measured in rows.iter().filter(|summary| summary.target != "echo" && summary.rate_hz == echo.rate_hz) {
                let (floor, figure) =
                    (Percentiles::of(&echo.figures.latency), Percentiles::of(&measured.figures.latency));
                if figure.p50_ns > 0 {
                    let _ = writeln!(
                        text,
                        "\nEcho floor at {:.0}/s (echo ÷ {}): p50 {:.1} %, p99 {:.1} %. The echo is the harness \
                         against a server that only answers and forwards: the floor of any client and server \
                         pair on this machine, wake-ups included, not the harness's own time (above).",
                        echo.rate_hz,
                        measured.target,
                        floor.p50_ns as f64 * 100.0 / figure.p50_ns as f64,
                        floor.p99_ns as f64 * 100.0 / figure.p99_ns.max(1) as f64
                    );
                }
            }
        }
        // A sweep's answer to "how far does it go": per target, the highest rate every run of
        // which kept up and delivered everything without an error.
        let several_rates = rows.iter().any(|summary| summary.rate_hz != rows[0].rate_hz);
        let mut targets: Vec<&str> = rows.iter().map(|summary| summary.target.as_str()).collect();
        targets.dedup();
        for target in targets.into_iter().filter(|_| several_rates) {
            let highest = rows
                .iter()
                .filter(|summary| summary.target == target && kept_up(summary))
                .max_by(|a, b| a.rate_hz.total_cmp(&b.rate_hz));
            let _ = match highest {
                Some(summary) => writeln!(
                    text,
                    "\n{target} kept up with rates up to {:.0}/s in this sweep (p99 {} ms there, 100 % delivered, \
                     no errors, no run saturated).",
                    summary.rate_hz,
                    ms(Percentiles::of(&summary.figures.latency).p99_ns)
                ),
                None => writeln!(text, "\n{target} kept up with none of the rates in this sweep."),
            };
        }
        // Runs that could not keep up: their latency is the backlog's.
        for summary in rows.iter().filter(|summary| summary.figures.saturated_runs() > 0) {
            let figures = &summary.figures;
            let worst = figures
                .saturation
                .iter()
                .filter(|run| run.saturated)
                .max_by_key(|run| run.last_quarter_p50_ns)
                .expect("at least one saturated run");
            let _ = writeln!(
                text,
                "\n**{} at {:.0}/s did not keep up** in {} of {} run(s); the worst: {}.",
                summary.target,
                summary.rate_hz,
                figures.saturated_runs(),
                figures.saturation.len(),
                worst.describe()
            );
        }
        for summary in rows.iter().filter(|summary| summary.figures.observer_resumes > 0) {
            let _ = writeln!(
                text,
                "\n{} at {:.0}/s: subscribers were cut off for falling behind {} time(s) and resumed from \
                 the id the server gave (nothing missed; the time it took is in the latency).",
                summary.target, summary.rate_hz, summary.figures.observer_resumes
            );
        }
        let problems: Vec<&String> = rows.iter().flat_map(|summary| summary.figures.problems.iter()).take(5).collect();
        if !problems.is_empty() {
            let _ = writeln!(text, "\nFirst problems seen:");
            for problem in problems {
                let _ = writeln!(text, "- {problem}");
            }
        }
        text.push('\n');
    }
    text
}

/// Whether every run at this target and rate kept up: nothing saturated, lost or failed.
fn kept_up(summary: &Summary) -> bool {
    let figures = &summary.figures;
    figures.saturated_runs() == 0
        && figures.errors.total() == 0
        && figures.producer_emitted > 0
        && figures.observer_seen == figures.producer_emitted
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let time = UNIX_EPOCH + std::time::Duration::from_millis(1_795_255_200_250);
        assert_eq!(rfc3339(time), "2026-11-21T10:00:00.250Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(run_id(time, "onehop", 50.0, 2), "20261121T100000Z-onehop-50hz-r2");
    }
}
