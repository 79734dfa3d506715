//! The process-wide metrics recorder, exported in Prometheus text format at `/metrics`.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Installs the Prometheus recorder with explicit histogram buckets (the exporter's default is
/// a summary, which cannot be aggregated across scrapes) and describes every metric.
pub fn install_metrics() -> Result<PrometheusHandle, String> {
    use onehop_engine::telemetry as log_metrics;
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(log_metrics::FSYNC_SECONDS.into()), log_metrics::FSYNC_SECONDS_BUCKETS)
        .and_then(|builder| {
            builder.set_buckets_for_metric(
                Matcher::Full(log_metrics::BATCH_RECORDS.into()),
                log_metrics::BATCH_RECORDS_BUCKETS,
            )
        })
        .and_then(|builder| {
            builder.set_buckets_for_metric(
                Matcher::Full("http_request_duration_seconds".into()),
                &[0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0],
            )
        })
        .map_err(|error| error.to_string())?
        .install_recorder()
        .map_err(|error| format!("cannot install the metrics recorder: {error}"))?;
    log_metrics::describe();
    describe();
    crate::mqtt::telemetry::describe();
    crate::kafka::describe_metrics();
    crate::access::describe_metrics();
    Ok(handle)
}

/// Describes counter `name` and registers it, so it is exported (at 0) before its first event:
/// a series that appears only with its first increment hides that increment from `rate()` and
/// `increase()`, and a dashboard cannot tell "none yet" from "not exported".
pub(crate) fn counter(name: &'static str, description: &'static str) {
    metrics::describe_counter!(name, description);
    let _ = metrics::counter!(name);
}

/// Describes gauge `name` and registers it at 0 (see [`counter`]).
pub(crate) fn gauge(name: &'static str, description: &'static str) {
    metrics::describe_gauge!(name, description);
    let _ = metrics::gauge!(name);
}

/// Describes the server's and the hub's metrics, registering those without labels. A labelled
/// family gets its series with its label values: a route's with its first request, an error
/// code's with its first refusal.
fn describe() {
    use metrics::{Unit, describe_counter, describe_histogram};
    describe_counter!("http_requests_total", "HTTP requests answered, by route template, method and status.");
    describe_histogram!(
        "http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer an HTTP request (to the start of the stream for subscriptions)."
    );
    describe_counter!("http_errors_total", "Refused or failed HTTP requests, by error code.");
    gauge("http_connections", "Open HTTP connections, subscriptions included.");
    counter("http_connections_refused_total", "HTTP connections refused (503) because connections_max were open.");
    describe_counter!(
        "http_connections_timed_out_total",
        "HTTP connections closed for waiting too long, by timeout: header, idle or body."
    );
    // The timeouts are a closed set: each series exists from the start.
    for timeout in ["header", "idle", "body"] {
        let _ = metrics::counter!("http_connections_timed_out_total", "timeout" => timeout);
    }
    gauge(
        "http_body_in_flight_bytes",
        "Bytes of HTTP request bodies held in memory now (http_body_bytes_in_flight_max).",
    );
    gauge(
        "engine_orphaned_topics",
        "Topics with data on disk that the catalog neither defines nor dropped (kept, not served).",
    );
    gauge("hub_subscriptions", "Live subscriptions registered with the hub (SSE, WebSocket and MQTT).");
    counter(
        "hub_subscribers_overflowed_total",
        "Subscribers whose queue was full; each reads on from the log (or resumes, if told to).",
    );
    counter(
        "hub_subscribers_carried_on_from_log_total",
        "Times a subscriber (SSE, WebSocket or MQTT) fell behind the live feed and read on from the log.",
    );
    gauge(crate::pg::CONNECTIONS, "Open Postgres wire protocol connections.");
    counter(crate::pg::CONNECTIONS_REFUSED, "Postgres connections refused because connections_max were open.");
    counter(onehop_sql::query::QUERIES, "Ad-hoc SQL queries (SELECT) run, answered or refused.");
    describe_counter!(
        onehop_sql::query::QUERIES_LIMITED,
        "SQL queries ended by a limit, by limit (memory, time, stream_records)."
    );
    for limit in ["memory", "time", "stream_records"] {
        let _ = metrics::counter!(onehop_sql::query::QUERIES_LIMITED, "limit" => limit);
    }
}
