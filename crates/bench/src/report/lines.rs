//! The lines printed at the end: one JSON line per summary (`--json`), and the last line and
//! the table of `onehop bench view`.

use serde::Serialize;

use crate::histogram::Percentiles;
use crate::workload::{Summary, Workload};

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
    pub freshness_p95_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freshness_p99_ns: Option<u64>,
    /// W3: intended send of an event → its window's closing (final) row received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_p95_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub final_p99_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_p95_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub query_p99_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub close_lag_p99_ns: Option<u64>,
    /// A peer's batching consumer: intended send → the batch holding the event committed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_p50_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_p99_ns: Option<u64>,
    /// Failed logins and TLS handshakes the target counted during the runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_refusals: Option<u64>,
}

pub fn json_line(summary: &Summary) -> String {
    let figures = &summary.figures;
    let latency = Percentiles::of(&figures.latency);
    let ack = Percentiles::of(&figures.ack);
    let view = summary.workload == Workload::W3;
    let query = Percentiles::of(&figures.query);
    let final_fresh = Percentiles::of(&figures.final_fresh);
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
        freshness_p95_ns: view.then_some(latency.p95_ns),
        freshness_p99_ns: view.then_some(latency.p99_ns),
        final_p50_ns: view.then_some(final_fresh.p50_ns),
        final_p95_ns: view.then_some(final_fresh.p95_ns),
        final_p99_ns: view.then_some(final_fresh.p99_ns),
        query_p50_ns: view.then_some(query.p50_ns),
        query_p95_ns: view.then_some(query.p95_ns),
        query_p99_ns: view.then_some(query.p99_ns),
        close_lag_p99_ns: view.then(|| Percentiles::of(&figures.close_lag).p99_ns),
        commit_p50_ns: (!figures.commit.is_empty()).then(|| Percentiles::of(&figures.commit).p50_ns),
        commit_p99_ns: (!figures.commit.is_empty()).then(|| Percentiles::of(&figures.commit).p99_ns),
        target_refusals: figures.target_refusals,
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
