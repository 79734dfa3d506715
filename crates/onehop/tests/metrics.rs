//! Every metric the docs name is in `/metrics` from the start, at 0: a series that appears only
//! with its first event hides that event from `rate()` and `increase()`, and a dashboard cannot
//! tell "none yet" from "not exported".

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};

use common::{DataDir, get, sql};

/// Names in the docs that look like metrics and are not: settings, a fuzz target, a module, a
/// stream option and an error code.
const NOT_METRICS: [&str; 24] = [
    "log_journal",
    "kafka_request",
    "view_change",
    "kafka_idle_timeout_s",
    "kafka_authentication_timeout_s",
    "mqtt_subscriptions_max",
    "kafka_addr",
    "kafka_advertised_addr",
    "kafka_tls",
    "kafka_tls_addr",
    "kafka_tls_advertised_addr",
    "http_addr",
    "mqtt_addr",
    "mqtt_tls_addr",
    "mqtt_empty_first_level_stream",
    "http_header_read_timeout_s",
    "http_idle_timeout_s",
    "http_body_read_timeout_s",
    "http_body_bytes_in_flight_max",
    "mqtt_decode",
    "mqtt_ws",
    "mqtt_topic",
    "view_exists",
    "view_state_limit",
];

/// Metrics the start itself moves: the server's first writes to its system topics are synced,
/// and the scrape's own connection is an open one.
const MOVED_BY_START_UP: [&str; 2] = ["log_fsync_duration_seconds", "http_connections"];

/// Families with a label whose values come with use: a series per route, method and status
/// from a route's first request; per error code from its first refusal.
const LABELLED_BY_USE: [&str; 4] =
    ["http_requests_total", "http_request_duration_seconds", "http_errors_total", "kafka_requests_total"];

/// Families labelled per view or transform: each one's series are there, at 0, from its start.
const LABELLED_PER_VIEW: [&str; 5] = [
    "view_late_events_total",
    "view_checkpoints_total",
    "view_checkpoint_failures_total",
    "transform_invalid_subjects_total",
    "transform_rejected_records_total",
];

/// Gauges of a joined view, one series per view and input (checked after one is made).
const LABELLED_PER_JOIN_INPUT: [&str; 2] = ["view_state_rows", "view_state_bytes"];
/// Gauges of a joined view, one series per view.
const LABELLED_PER_JOIN: [&str; 1] = ["view_read_rows_bytes"];

/// The metric names written in backticks in docs/*.md.
fn documented() -> BTreeSet<String> {
    let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs");
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(docs).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|extension| extension != "md") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for quoted in text.split('`').skip(1).step_by(2) {
            let subsystem = quoted.split('_').next().unwrap_or_default();
            let shaped = quoted.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if shaped
                && quoted.contains('_')
                && ["log", "http", "hub", "mqtt", "kafka", "view", "transform", "engine"].contains(&subsystem)
            {
                names.insert(quoted.to_string());
            }
        }
    }
    names.retain(|name| !NOT_METRICS.contains(&name.as_str()));
    names
}

/// The value of series `series` (a name, or a name with labels) in a scrape, if present.
fn value(scrape: &str, series: &str) -> Option<f64> {
    scrape.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

#[test]
fn every_documented_metric_is_exported_at_zero_from_the_start() {
    let dir = DataDir::new();
    let server = dir.start(&[], &[]);
    let (status, scrape) = get(server.address, "/metrics");
    assert_eq!(status, 200);

    let names = documented();
    assert!(names.len() > 20, "the docs' metrics were found: {names:?}");
    let mut wrong = Vec::new();
    for name in &names {
        if LABELLED_BY_USE.contains(&name.as_str())
            || LABELLED_PER_VIEW.contains(&name.as_str())
            || LABELLED_PER_JOIN_INPUT.contains(&name.as_str())
            || LABELLED_PER_JOIN.contains(&name.as_str())
        {
            continue;
        }
        // A histogram shows as its count.
        let found = value(&scrape, name).or_else(|| value(&scrape, &format!("{name}_count")));
        let moved = MOVED_BY_START_UP.contains(&name.as_str());
        if found.is_none() || (!moved && found != Some(0.0)) {
            wrong.push((name, found));
        }
    }
    assert!(wrong.is_empty(), "missing, or not at 0: {wrong:?} in\n{scrape}");
    for name in
        LABELLED_BY_USE.iter().chain(&LABELLED_PER_VIEW).chain(&LABELLED_PER_JOIN_INPUT).chain(&LABELLED_PER_JOIN)
    {
        assert!(names.contains(*name), "{name} is no longer documented: update this test");
    }

    // A view's and a transform's counters are there from their start.
    let statements = "CREATE STREAM readings; \
               CREATE VIEW counts AS SELECT COUNT(*) AS n FROM readings GROUP BY sensor; \
               CREATE STREAM hot AS SELECT * FROM readings WHERE celsius >= 30";
    sql(server.address, statements);
    let (_, scrape) = get(server.address, "/metrics");
    for name in LABELLED_PER_VIEW {
        let series = match name.split('_').next() {
            Some("view") => format!("{name}{{view=\"counts\"}}"),
            _ => format!("{name}{{transform=\"hot\"}}"),
        };
        assert_eq!(value(&scrape, &series), Some(0.0), "{series} in\n{scrape}");
    }
    // A joined view's state, per input, once it has loaded its (empty) inputs.
    sql(
        server.address,
        "CREATE TABLE a (id TEXT PRIMARY KEY, b TEXT); CREATE TABLE b (id TEXT PRIMARY KEY); \
         CREATE VIEW pairs AS SELECT a.id, b.id AS b_id FROM a JOIN b ON b.id = a.b",
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let per_input = LABELLED_PER_JOIN_INPUT
        .iter()
        .flat_map(|name| ["a", "b"].map(|input| format!("{name}{{view=\"pairs\",input=\"{input}\"}}")));
    let per_view = LABELLED_PER_JOIN.iter().map(|name| format!("{name}{{view=\"pairs\"}}"));
    for series in per_input.chain(per_view) {
        loop {
            let (_, scrape) = get(server.address, "/metrics");
            if value(&scrape, &series) == Some(0.0) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{series} in\n{scrape}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    // The HTTP families have a series once a route was asked for (the first scrape, here).
    let (_, unknown) = get(server.address, "/streams/nothing-here");
    assert!(unknown.contains("error"), "{unknown}");
    // Kafka's, once an API was asked for: an ApiVersions request (v0, client id "t").
    let mut kafka = std::net::TcpStream::connect(server.kafka_address.unwrap()).unwrap();
    kafka.write_all(&[0, 0, 0, 11, 0, 18, 0, 0, 0, 0, 0, 1, 0, 1, b't']).unwrap();
    let mut size = [0u8; 4];
    kafka.read_exact(&mut size).unwrap();
    let (_, scrape) = get(server.address, "/metrics");
    for name in LABELLED_BY_USE {
        // A histogram's series are its buckets, sum and count.
        let labelled = |line: &str| {
            line.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with("_count{"))
        };
        assert!(scrape.lines().any(labelled), "{name} in\n{scrape}");
    }
}
