//! The conventional stack in the harness, kept honest: a short W4 against one Kafka broker
//! (replication 1) and against mosquitto, beside onehop and beside onehop's own Kafka listener
//! driven by the same franz-go glue as Kafka (so franz-go's idempotent producer, consumer group
//! and commits run against onehop in every CI run), in one invocation. Every event must
//! reach the consumer, the output must be well formed (raw.csv, meta.json with every peer
//! setting, summary.md with the ratio to onehop, JSON lines naming their target), the peers'
//! logs must be kept with the run, and no process the harness started may outlive it.
//!
//! W2 runs against the kafka-stack (one broker, Redis and the study's Node.js glue) beside
//! onehop, checked the same way; W1 against the kafka-stack too (a Postgres of its own with the
//! outbox, Debezium's relay at its default poll interval, one broker, Redis and the glue); and
//! W3 against Kafka Streams (one broker and the W3 app); study 5's first two scenarios against
//! Kafka Streams (`bench streams`, one broker and its apps).
//!
//! The peers come from `scripts/peers install kafka mosquitto redis kafka-stack kafka-streams` (scripts/test
//! runs it); without them this test fails and says so. No figure is checked against a
//! threshold.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Where `scripts/peers` installed the peers (the harness looks in the same place).
fn peers_dir() -> Option<std::ffi::OsString> {
    std::env::var_os("ONEHOP_PEERS_DIR")
}

/// Processes whose command line mentions `needle` (a run's data directory): what the harness
/// started there and failed to stop.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

fn runs(results: &Path) -> Vec<PathBuf> {
    let mut runs: Vec<PathBuf> = std::fs::read_dir(results.join("W4"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.join("meta.json").exists())
        .collect();
    runs.sort();
    runs
}

/// Checks one run's meta.json and raw.csv; returns the meta.
fn check_run(run: &Path) -> Value {
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(run.join("meta.json")).unwrap()).unwrap();
    let stack = meta["stack"].as_str().unwrap().to_string();
    assert_eq!(meta["workload_id"], "W4");
    assert_eq!(meta["errors"], 0, "{meta}");
    assert!(meta["producer_emitted"].as_u64().unwrap() > 0, "{meta}");
    assert_eq!(meta["observer_seen"], meta["producer_emitted"], "{meta}");
    assert_eq!(meta["delivered_pct"], 100.0, "{meta}");
    assert!(meta["durability"].as_str().is_some_and(|text| !text.is_empty()), "{meta}");
    let raw = std::fs::read_to_string(run.join("raw.csv")).unwrap();
    let mut lines = raw.lines();
    assert_eq!(lines.next(), Some("kind,event_id,observer_id,key,intended_ns,sent_ns,ack_ns,received_ns,arrived_ns"));
    let rows: Vec<Vec<&str>> = lines.map(|line| line.split(',').collect()).collect();
    let count = |kind: &str| rows.iter().filter(|row| row[0] == kind).count() as u64;
    assert_eq!(count("delivery"), meta["producer_emitted"].as_u64().unwrap(), "{stack}");
    for row in &rows {
        assert_eq!(row.len(), 9, "{row:?}");
        let (intended, sent, ack, received): (u64, u64, u64, u64) =
            (row[4].parse().unwrap(), row[5].parse().unwrap(), row[6].parse().unwrap(), row[7].parse().unwrap());
        assert!(intended <= sent && sent <= ack && intended <= received, "{stack}: {row:?}");
        // Every receipt, the glue's reports included, carries the kernel's arrival stamp.
        let arrived: u64 = row[8].parse().unwrap_or_else(|_| panic!("{stack}: no arrival stamp in {row:?}"));
        assert!(0 < arrived && arrived <= received, "{stack}: {row:?}");
    }
    let settings = &meta["target_settings"];
    match stack.as_str() {
        "kafka" => {
            // Receipt and commit, both: every event's batch was committed after it was received.
            assert_eq!(count("commit"), count("delivery"), "{meta}");
            assert!(meta["commit_p50_ns"].as_u64().unwrap() >= meta["latency_p50_ns"].as_u64().unwrap(), "{meta}");
            assert_eq!(settings["brokers"], 1, "{settings}");
            assert_eq!(settings["replication_factor"], 1, "{settings}");
            assert_eq!(settings["partitions"], 12, "{settings}");
            assert_eq!(settings["producer"]["acks"], "all", "{settings}");
            assert_eq!(settings["producer"]["compression"], "lz4", "{settings}");
            assert_eq!(settings["producer"]["linger_ms"], 5.0, "{settings}");
            assert_eq!(settings["consumer"]["batch_records_max"], 256, "{settings}");
            assert!(settings["version"].as_str().unwrap().starts_with("4."), "{settings}");
            assert!(settings["producer"]["client"].as_str().unwrap().contains("franz-go"), "{settings}");
            assert!(settings["server_properties_node_1"].as_str().unwrap().contains("process.roles=broker,controller"));
            assert_eq!(meta["target_fsyncs"], Value::Null, "{meta}");
            assert!(meta["host_usage"]["target_cores"].as_f64().unwrap() > 0.0, "{meta}");
        }
        "mosquitto" => {
            assert_eq!(count("commit"), 0, "{meta}");
            assert_eq!(settings["persistence"], false, "{settings}");
            assert!(settings["version"].as_str().unwrap().contains("mosquitto"), "{settings}");
            assert!(settings["config"].as_str().unwrap().contains("127.0.0.1"), "{settings}");
        }
        "onehop-kafka" => {
            // The same client as the kafka target's, against onehop: receipt and commit.
            assert_eq!(count("commit"), count("delivery"), "{meta}");
            assert_eq!(settings["replication_factor"], 1, "{settings}");
            assert_eq!(settings["partitions"], 12, "{settings}");
            assert_eq!(settings["producer"]["acks"], "all", "{settings}");
            assert!(settings["producer"]["client"].as_str().unwrap().contains("franz-go"), "{settings}");
            assert!(meta["target_fsyncs"].is_object(), "onehop's fsyncs are read from its metrics: {meta}");
        }
        "onehop" => {
            let plain = serde_json::json!({"access": "off", "credentials": "none", "tls": "off"});
            assert_eq!(settings, &plain, "plain onehop, as the protected targets are measured against: {meta}");
        }
        other => panic!("unexpected target {other}"),
    }
    meta
}

/// Runs `onehop bench {workload}` against `targets` with one Kafka broker, 3 s measured after 1 s
/// of warm-up, failing the test unless it succeeds (naming `peers`, what `scripts/peers
/// install` needs); returns its directory (results in `results/`) and its JSON lines, one per
/// target in order, each naming it: a script computes ratios from these.
fn smoke(workload: &str, targets: &[&str], peers: &str) -> (tempfile::TempDir, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    // W1's Postgres runs as the `postgres` user when the test is root: it must be able to pass
    // through this directory (not list it) to reach its own.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let mut command = common::onehop();
    command
        .args(["bench", workload, "--target", &targets.join(","), "--kafka-brokers", "1"])
        .args(["--duration", "3", "--warmup", "1", "--json", "--no-progress", "--out"])
        .arg(dir.path().join("results"))
        .arg("--dir")
        .arg(dir.path());
    if let Some(peers_dir) = peers_dir() {
        command.env("ONEHOP_PEERS_DIR", peers_dir);
    }
    let output = command.output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    assert!(output.status.success(), "the smoke failed (`scripts/peers install {peers}`?)\n{stdout}\n{stderr}");
    let lines: Vec<Value> =
        stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap()).collect();
    let named: Vec<&str> = lines.iter().map(|line| line["target"].as_str().unwrap()).collect();
    assert_eq!(named, targets, "{stdout}");
    (dir, lines)
}

#[test]
fn w4_smoke_against_one_kafka_broker_and_mosquitto_beside_onehop_and_its_kafka_listener() {
    let (dir, lines) = smoke("w4", &["onehop", "onehop-kafka", "kafka", "mosquitto"], "kafka mosquitto");
    let results = dir.path().join("results");
    for line in &lines {
        assert_complete(line, "W4");
        assert!(line["p50_ns"].as_u64().unwrap() > 0 && line["p99_ns"].as_u64() >= line["p50_ns"].as_u64(), "{line}");
    }
    assert!(lines[1]["commit_p50_ns"].as_u64().is_some(), "{}", lines[1]);
    assert!(lines[2]["commit_p50_ns"].as_u64().is_some(), "{}", lines[2]);

    let runs = runs(&results);
    let stacks: Vec<String> = runs.iter().map(|run| check_run(run)["stack"].as_str().unwrap().to_string()).collect();
    let mut sorted = stacks.clone();
    sorted.sort();
    assert_eq!(sorted, ["kafka", "mosquitto", "onehop", "onehop-kafka"], "{runs:?}");

    // summary.md: the targets side by side with the ratio to onehop's p50 / p99.
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    assert!(summary.contains("p50 / p99 ÷ onehop's"), "{summary}");
    for target in ["onehop-kafka", "kafka", "mosquitto"] {
        let row = summary.lines().find(|line| line.starts_with(&format!("| {target} |"))).unwrap();
        let ratio = row.split('|').nth(8).unwrap().trim();
        assert!(ratio.contains('×') && ratio.contains(" / "), "{row}");
    }
    assert!(summary.contains("after its consumer committed the batch"), "{summary}");
    assert!(std::fs::read_to_string(results.join("W4-cdf.svg")).unwrap().contains("mosquitto"));

    // The peers' logs are kept with the workload's runs.
    let logs = results.join("W4").join("peer-logs");
    let broker_log = std::fs::read_to_string(logs.join("kafka").join("broker-1.log")).unwrap();
    assert!(broker_log.contains("Kafka Server started"), "{broker_log}");
    assert!(
        std::fs::read_dir(logs.join("kafka"))
            .unwrap()
            .flatten()
            .any(|entry| { entry.file_name().to_string_lossy().starts_with("glue-") })
    );
    assert!(logs.join("mosquitto").join("mosquitto.log").exists());
    assert!(
        std::fs::read_dir(logs.join("onehop-kafka"))
            .unwrap()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with("glue-"))
    );

    // Nothing the harness started is still running, and its data directories are gone.
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
    let data_left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| {
            ["onehop-peer-", "onehop-kafka-glue-", "onehop-bench-data-"].iter().any(|prefix| name.starts_with(prefix))
        })
        .collect();
    assert!(data_left.is_empty(), "{data_left:?}");
}

/// A smoke's JSON line for `workload`: every event delivered, no error.
fn assert_complete(line: &Value, workload: &str) {
    assert_eq!(line["workload"], workload, "{line}");
    assert_eq!(line["delivered_pct"], 100.0, "{line}");
    assert_eq!(line["errors"], 0, "{line}");
}

/// The run of `target` under `results/{workload}`: its meta.json and raw.csv.
fn peer_run(results: &std::path::Path, workload: &str, target: &str) -> (Value, String) {
    let run = std::fs::read_dir(results.join(workload))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .find(|path| path.join("meta.json").exists() && path.to_string_lossy().contains(target))
        .unwrap_or_else(|| panic!("a {target} run"));
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(run.join("meta.json")).unwrap()).unwrap();
    let raw = std::fs::read_to_string(run.join("raw.csv")).unwrap();
    (meta, raw)
}

/// A kafka-stack run's meta.json: no error, every event seen, every subscriber owed one
/// notified, none twice.
fn assert_every_delivery_once(meta: &serde_json::Value) {
    assert_eq!(meta["stack"], "kafka-stack");
    assert_eq!(meta["errors"], 0, "{meta}");
    assert_eq!(meta["observer_seen"], meta["producer_emitted"], "{meta}");
    assert_eq!(meta["deliveries_seen"], meta["deliveries_expected"], "{meta}");
    assert_eq!(meta["duplicates"], 0, "{meta}");
}

/// W2 on study 1's conventional stack, kept honest: one Kafka broker, Redis and the Node.js
/// glue (kafkajs, ioredis) beside onehop, in one invocation. Every subscriber owed an event
/// must be notified over HTTP exactly once, every receipt stamped by the kernel, and meta.json
/// must record every peer setting.
#[test]
fn w2_smoke_against_the_kafka_stack_beside_onehop() {
    let (dir, lines) = smoke("w2", &["onehop", "kafka-stack"], "kafka-stack");
    let results = dir.path().join("results");
    for line in &lines {
        assert_complete(line, "W2");
        assert!(line["p50_ns"].as_u64().unwrap() > 0 && line["p99_ns"].as_u64() >= line["p50_ns"].as_u64(), "{line}");
    }

    let (meta, raw) = peer_run(&results, "W2", "kafka-stack");
    assert_every_delivery_once(&meta);
    // Each event goes to the ~30 subscribers of its tag (100 × 3 of 10 tags).
    let expected = meta["deliveries_expected"].as_u64().unwrap();
    let emitted = meta["producer_emitted"].as_u64().unwrap();
    assert!(emitted > 0 && expected > 10 * emitted, "{meta}");
    let rows: Vec<Vec<&str>> = raw.lines().skip(1).map(|line| line.split(',').collect()).collect();
    assert_eq!(rows.len() as u64, expected, "one row per (event, subscriber owed it)");
    for row in &rows {
        assert_eq!((row.len(), row[0]), (9, "delivery"), "{row:?}");
        assert!(row[3].starts_with("tags/t"), "{row:?}");
        let number = |index: usize| row[index].parse::<u64>().unwrap_or_else(|_| panic!("column {index}: {row:?}"));
        let (intended, sent, ack, received, arrived) = (number(4), number(5), number(6), number(7), number(8));
        // Received after Kafka acknowledged? Not necessarily (the consumer may see it first),
        // but never before it was sent, and always stamped by the kernel first.
        assert!(intended <= sent && sent <= ack && sent <= arrived && arrived <= received, "{row:?}");
    }
    let settings = &meta["target_settings"];
    assert_eq!(settings["kafka"]["brokers"], 1, "{settings}");
    assert!(settings["kafka"]["version"].as_str().unwrap().starts_with("4."), "{settings}");
    assert_eq!(settings["topic"]["replication_factor"], 1, "{settings}");
    assert_eq!(settings["producer"]["acks"], "all", "{settings}");
    assert_eq!(settings["producer"]["compression"], "lz4", "{settings}");
    assert_eq!(settings["producer"]["linger_ms"], 5.0, "{settings}");
    let client = settings["producer"]["client"].as_str().unwrap();
    assert!(client.starts_with("node v") && client.contains("kafkajs 2.") && client.contains("ioredis"), "{client}");
    assert_eq!(settings["redis"]["persistence"]["appendonly"], "no", "{settings}");
    assert!(settings["redis"]["version"].as_str().unwrap().contains("Redis server"), "{settings}");

    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    let row = summary.lines().find(|line| line.starts_with("| kafka-stack |")).unwrap();
    assert!(row.split('|').nth(8).unwrap().contains('×'), "{row}");
    let logs = results.join("W2").join("peer-logs").join("kafka-stack");
    assert!(std::fs::read_to_string(logs.join("kafka").join("broker-1.log")).unwrap().contains("Kafka Server started"));
    assert!(std::fs::read_to_string(logs.join("redis.log")).unwrap().contains("Ready to accept connections"));
    assert!(
        std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .any(|entry| entry.file_name().to_string_lossy().starts_with("glue-"))
    );
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
}

/// W1 on study 1's conventional stack, kept honest: a Postgres of the target's own (outbox
/// table, fsync on), Debezium's embedded engine at its default poll interval, one Kafka broker,
/// Redis and the Node.js glue (pg, kafkajs, ioredis) beside onehop, in one invocation. Every
/// subscriber whose key an event carries must be notified over HTTP exactly once, and meta.json
/// must record every setting, Debezium's poll interval and Postgres's fsync among them.
#[test]
fn w1_smoke_against_the_kafka_stack_through_postgres_and_debezium_beside_onehop() {
    let (dir, lines) = smoke("w1", &["onehop", "kafka-stack"], "kafka-stack");
    let results = dir.path().join("results");
    for line in &lines {
        assert_complete(line, "W1");
        assert!(line["p50_ns"].as_u64().unwrap() > 0 && line["p99_ns"].as_u64() >= line["p50_ns"].as_u64(), "{line}");
    }

    let (meta, raw) = peer_run(&results, "W1", "kafka-stack");
    assert_every_delivery_once(&meta);
    // Each event carries 5 distinct keys of 1 000, each followed by one subscriber.
    let emitted = meta["producer_emitted"].as_u64().unwrap();
    assert!(emitted > 0 && meta["deliveries_expected"].as_u64() == Some(5 * emitted), "{meta}");
    let rows: Vec<Vec<&str>> = raw.lines().skip(1).map(|line| line.split(',').collect()).collect();
    assert_eq!(rows.len() as u64, 5 * emitted, "one row per (event, subscriber owed it)");
    for row in &rows {
        assert_eq!((row.len(), row[0]), (9, "delivery"), "{row:?}");
        assert!(row[3].split(' ').count() == 5 && row[3].starts_with('k'), "{row:?}");
        let number = |index: usize| row[index].parse::<u64>().unwrap_or_else(|_| panic!("column {index}: {row:?}"));
        let (intended, sent, ack, received, arrived) = (number(4), number(5), number(6), number(7), number(8));
        assert!(intended <= sent && sent <= ack && sent <= arrived && arrived <= received, "{row:?}");
    }
    let settings = &meta["target_settings"];
    assert_eq!(settings["kafka"]["brokers"], 1, "{settings}");
    assert_eq!(settings["topic"]["replication_factor"], 1, "{settings}");
    assert_eq!(settings["debezium"]["poll_interval_ms"], 500, "Debezium's default: {settings}");
    assert_eq!(settings["debezium"]["plugin_name"], "pgoutput", "{settings}");
    assert!(settings["debezium"]["version"].as_str().unwrap().starts_with("debezium 3.4"), "{settings}");
    assert!(settings["debezium"]["version"].as_str().unwrap().contains("kafka-clients 4.1"), "{settings}");
    assert_eq!(settings["relay_producer"]["acks"], "all", "{settings}");
    assert_eq!(settings["relay_producer"]["linger_ms"], 5.0, "{settings}");
    let server = &settings["postgres"]["server"];
    assert_eq!(
        (server["fsync"].as_str(), server["synchronous_commit"].as_str()),
        (Some("on"), Some("on")),
        "{settings}"
    );
    assert_eq!(server["wal_level"], "logical", "{settings}");
    assert!(settings["postgres"]["version"].as_str().unwrap().contains("PostgreSQL) 15"), "{settings}");
    let client = settings["writer"]["client"].as_str().unwrap();
    assert!(client.contains("pg 8") && client.contains("kafkajs 2.") && client.contains("ioredis"), "{client}");
    assert!(meta["durability"].as_str().unwrap().contains("fsync=on"), "{meta}");

    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    let row = summary.lines().find(|line| line.starts_with("| kafka-stack |")).unwrap();
    assert!(row.split('|').nth(8).unwrap().contains('×'), "{row}");
    let logs = results.join("W1").join("peer-logs").join("kafka-stack");
    assert!(std::fs::read_to_string(logs.join("postgres.log")).unwrap().contains("database system is ready"));
    let log_of = |prefix: &str| {
        std::fs::read_dir(&logs)
            .unwrap()
            .flatten()
            .find(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
            .map(|entry| std::fs::read_to_string(entry.path()).unwrap())
            .unwrap_or_else(|| panic!("no {prefix}… log"))
    };
    // The run started only once a probe row came through; the relay was stopped by its PID
    // and closed its engine (which drops its replication slot).
    assert!(log_of("glue-").contains("came through after"));
    assert!(log_of("relay-").contains("Engine is stopped"));
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
    let data_left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("onehop-peer-"))
        .collect();
    assert!(data_left.is_empty(), "{data_left:?}");
}

/// W3 on study 1's conventional stack, kept honest: one Kafka broker and the Kafka Streams app
/// beside onehop, in one invocation. Every event must show in a changelog row and in its
/// window's suppressed (final) row with the right count, every window must close, every point
/// query must be answered by Interactive Queries, and meta.json must record every peer setting.
#[test]
fn w3_smoke_against_kafka_streams_beside_onehop() {
    let (dir, lines) = smoke("w3", &["onehop", "kafka-streams"], "kafka-streams");
    let results = dir.path().join("results");
    for line in &lines {
        assert_complete(line, "W3");
        let ns = |field: &str| line[field].as_u64().unwrap_or_else(|| panic!("{field}: {line}"));
        assert!(ns("freshness_p50_ns") > 0 && ns("freshness_p99_ns") >= ns("freshness_p50_ns"), "{line}");
        // The first row that includes an event comes no later than its window's final row.
        assert!(ns("final_p50_ns") >= ns("freshness_p50_ns"), "{line}");
        assert!(ns("query_p50_ns") > 0 && ns("query_p99_ns") >= ns("query_p50_ns"), "{line}");
    }

    let (meta, raw) = peer_run(&results, "W3", "kafka-streams");
    assert_eq!(meta["stack"], "kafka-streams");
    assert_eq!(meta["errors"], 0, "{meta}");
    let emitted = meta["producer_emitted"].as_u64().unwrap();
    assert!(emitted > 0, "{meta}");
    assert_eq!(meta["observer_seen"], emitted, "{meta}");
    assert_eq!(meta["final_count"], emitted, "every event is in its window's suppressed row: {meta}");
    let windows = meta["windows_expected"].as_u64().unwrap();
    assert!(windows > 0, "{meta}");
    assert!(meta["queries_emitted"].as_u64().unwrap() > 0, "{meta}");
    let rows: Vec<Vec<&str>> = raw.lines().skip(1).map(|line| line.split(',').collect()).collect();
    let count = |kind: &str| rows.iter().filter(|row| row[0] == kind).count() as u64;
    assert_eq!(count("fresh"), emitted);
    assert_eq!(count("close"), windows);
    assert_eq!(count("query"), meta["queries_emitted"].as_u64().unwrap());
    for row in &rows {
        assert_eq!(row.len(), 9, "{row:?}");
        assert!(row[3].starts_with('k'), "{row:?}");
        let number = |index: usize| row[index].parse::<u64>().unwrap_or_else(|_| panic!("column {index}: {row:?}"));
        match row[0] {
            "fresh" => {
                let (intended, sent, ack, received, arrived) = (number(4), number(5), number(6), number(7), number(8));
                assert!(intended <= sent && sent <= ack && sent <= arrived && arrived <= received, "{row:?}");
            }
            // A window's suppressed row comes after the window's end plus grace: stream time
            // passes it only with a record stamped later. The app's ticks read the wall clock
            // in another process than the harness's, hence the 50 ms of slack.
            "close" => assert!(number(7) + 50_000_000 >= number(4), "{row:?}"),
            "query" => assert!(number(4) <= number(5) && number(5) <= number(6), "{row:?}"),
            other => panic!("unexpected row kind {other}: {row:?}"),
        }
    }
    let settings = &meta["target_settings"];
    assert_eq!(settings["kafka"]["brokers"], 1, "{settings}");
    assert!(settings["kafka"]["version"].as_str().unwrap().starts_with("4."), "{settings}");
    assert_eq!(settings["topics"]["replication_factor"], 1, "{settings}");
    assert_eq!(settings["producer"]["acks"], "1", "{settings}");
    assert_eq!(settings["producer"]["compression"], "lz4", "{settings}");
    assert_eq!(settings["producer"]["linger_ms"], 5.0, "{settings}");
    let streams = &settings["streams"];
    assert!(streams["version"].as_str().unwrap().starts_with("kafka-streams 4.1"), "{settings}");
    assert_eq!((streams["window_ms"].as_u64(), streams["grace_ms"].as_u64()), (Some(5000), Some(1000)), "{settings}");
    assert!(streams["commit_interval_ms"].as_u64().is_some(), "{settings}");
    assert!(streams["statestore_cache_max_bytes"].as_u64().is_some(), "{settings}");
    assert!(streams["topology"].as_str().unwrap().contains("suppress(untilWindowCloses"), "{settings}");
    assert!(settings["heap"].as_str().is_some(), "{settings}");
    // The app's JVM counts as the target's: more than the one broker's memory.
    assert!(meta["host_usage"]["target_cores"].as_f64().unwrap() > 0.0, "{meta}");

    // summary.md: the view table with the ratios to onehop's freshness, final and queries.
    let summary = std::fs::read_to_string(results.join("summary.md")).unwrap();
    assert!(summary.contains("final ÷ onehop's freshness p50"), "{summary}");
    let row = summary
        .lines()
        .find(|line| line.starts_with("| kafka-streams |") && line.split('|').count() == 13)
        .unwrap_or_else(|| panic!("no view row for kafka-streams: {summary}"));
    for column in [4, 6, 10] {
        assert!(row.split('|').nth(column).unwrap().contains('×'), "column {column}: {row}");
    }
    let logs = results.join("W3").join("peer-logs").join("kafka-streams");
    assert!(std::fs::read_to_string(logs.join("kafka").join("broker-1.log")).unwrap().contains("Kafka Server started"));
    let app_log = std::fs::read_dir(&logs)
        .unwrap()
        .flatten()
        .find(|entry| entry.file_name().to_string_lossy().starts_with("app-"))
        .map(|entry| std::fs::read_to_string(entry.path()).unwrap())
        .expect("the app's log");
    // Ready only once a first record came through the whole pipeline; stopped by its PID with
    // SIGTERM, which the app takes as the signal to close Kafka Streams (it may take seconds:
    // whether it finished is said in the log, not checked here).
    assert!(app_log.contains("-> RUNNING") && app_log.contains("a first record came through"), "{app_log}");
    assert!(app_log.contains("RUNNING -> PENDING_SHUTDOWN"), "{app_log}");
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
    let data_left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("onehop-peer-"))
        .collect();
    assert!(data_left.is_empty(), "{data_left:?}");
}

/// `onehop bench kafka`: Kafka's ProducerPerformance against onehop and against one Kafka
/// broker in one invocation: a figure per side, the table with the ratio, the chart, the
/// peers' logs, and nothing left running.
#[test]
fn bench_kafka_runs_producer_performance_against_onehop_and_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut command = common::onehop();
    command
        .args(["bench", "kafka", "--records", "20000", "--sizes", "100", "--latency-records", "300"])
        .args(["--rebalance-rounds", "1", "--json", "--dir"])
        .arg(dir.path());
    command.arg("--out").arg(&out);
    if let Some(peers) = peers_dir() {
        command.env("ONEHOP_PEERS_DIR", peers);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> =
        stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap()).collect();
    let of = |bench: &str| -> Vec<&Value> { lines.iter().filter(|line| line["bench"] == bench).collect() };
    let (throughput, end_to_end, rebalance) = (of("kafka"), of("kafka-end-to-end"), of("kafka-rebalance"));
    let targets = |lines: &[&Value]| -> Vec<String> {
        lines.iter().map(|line| line["target"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(targets(&throughput), ["onehop", "kafka"], "{stdout}");
    assert_eq!(targets(&end_to_end), ["onehop", "kafka"], "{stdout}");
    assert_eq!(targets(&rebalance), ["onehop", "kafka"], "{stdout}");
    for line in &rebalance {
        assert_eq!(line["join_ms"].as_array().unwrap().len(), 1, "{line}");
        assert!(line["leave_p50_ms"].as_f64().unwrap() > 0.0, "{line}");
    }
    for line in &end_to_end {
        assert_eq!(line["bench"], "kafka-end-to-end", "{line}");
        assert!(line["avg_ms"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["p99_ms"].as_f64() >= line["p50_ms"].as_f64(), "{line}");
    }
    for line in &throughput {
        assert_eq!(line["record_bytes"], 100, "{line}");
        assert!(line["records_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["p99_ms"].as_f64() >= line["p50_ms"].as_f64(), "{line}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| 100 B | onehop |") && summary.contains("×"), "{summary}");
    assert!(std::fs::read_to_string(out.join("kafka-throughput.svg")).unwrap().contains("onehop"));
    assert!(out.join("peer-logs").join("kafka-default").join("kafka").join("broker-1.log").exists());
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
}

/// `onehop bench queue`, small: the queue study's closed-loop producers and acknowledging
/// consumer group through Kafka's protocol against onehop (with and without its shared journal)
/// and one Kafka broker, and through Redis Streams against redis-server (AOF fsynced per
/// write); every message received once.
#[test]
fn bench_queue_runs_kafka_clients_and_redis_streams_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut command = common::onehop();
    command
        .args(["bench", "queue", "--messages", "600", "--producers", "3", "--consumers", "2"])
        .args(["--target", "onehop,onehop-journal,kafka,redis-always", "--json", "--dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out);
    if let Some(peers) = peers_dir() {
        command.env("ONEHOP_PEERS_DIR", peers);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> =
        stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap()).collect();
    let targets: Vec<&str> = lines.iter().map(|line| line["target"].as_str().unwrap()).collect();
    assert_eq!(targets, ["onehop", "onehop-journal", "kafka", "redis-always"], "{stdout}");
    for line in &lines {
        assert_eq!(line["received"], 600, "{line}");
        assert_eq!(line["duplicates"], 0, "{line}");
        assert!(line["msg_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["p99_ms"].as_f64() >= line["p50_ms"].as_f64(), "{line}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| redis-always |") && summary.contains("×"), "{summary}");
    assert!(std::fs::read_to_string(out.join("queue-latency.svg")).unwrap().contains("redis-always"));
    assert!(out.join("peer-logs").join("redis-always.log").exists());
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
}

/// `onehop bench streams --kill`, small: study 5's stateless scenario, word count, routing and
/// joins, each as onehop SQL and as a Kafka Streams app on one broker, exactly once and at least
/// once, fed and read by the same franz-go generator and consumer, the processing side killed
/// with SIGKILL mid-run and started again: every output once and each explained by the input,
/// every order's last enriched record its final join, except what at least once allows Kafka
/// Streams (an output twice, a count counting replayed input).
#[test]
fn bench_streams_runs_each_scenario_on_onehop_and_kafka_streams_through_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut command = common::onehop();
    command
        .args(["bench", "streams", "--scales", "0.02", "--warmup", "1", "--duration", "3", "--kafka-brokers", "1"])
        .args(["--kill", "--json", "--dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out);
    if let Some(peers) = peers_dir() {
        command.env("ONEHOP_PEERS_DIR", peers);
    }
    let output = command.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<Value> =
        stdout.lines().filter(|line| line.starts_with('{')).map(|line| serde_json::from_str(line).unwrap()).collect();
    let runs: Vec<(&str, &str, &str)> = lines
        .iter()
        .map(|line| {
            (line["scenario"].as_str().unwrap(), line["mode"].as_str().unwrap(), line["target"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        runs,
        [
            ("a", "eos", "onehop"),
            ("a", "eos", "kafka-streams"),
            ("a", "alo", "onehop"),
            ("a", "alo", "kafka-streams"),
            ("b", "eos", "onehop"),
            ("b", "eos", "kafka-streams"),
            ("b", "alo", "onehop"),
            ("b", "alo", "kafka-streams"),
            ("c", "eos", "onehop"),
            ("c", "eos", "kafka-streams"),
            ("c", "alo", "onehop"),
            ("c", "alo", "kafka-streams"),
            ("d", "eos", "onehop"),
            ("d", "eos", "kafka-streams"),
            ("d", "alo", "onehop"),
            ("d", "alo", "kafka-streams"),
        ],
        "{stdout}"
    );
    for line in &lines {
        let glue = &line["glue"];
        assert!(glue["expected"].as_u64().unwrap() > 0, "{line}");
        assert_eq!(line["killed"], true, "{line}");
        assert_eq!(glue["unexplained"], 0, "{line}");
        if line["target"] == "kafka-streams" && line["mode"] == "alo" {
            // At least once through a crash: outputs may come twice, counts count again.
            if line["scenario"] != "b" {
                assert_eq!(glue["missing"], 0, "{line}");
            }
        } else {
            assert_eq!(glue["received"], glue["expected"], "{line}");
            // Scenario d: also every order's last output is its final join.
            assert_eq!(glue["missing"], 0, "{line}");
            assert_eq!(glue["duplicates"], 0, "{line}");
            assert_eq!(glue["overcounts"], 0, "{line}");
        }
        assert!(glue["measured_outputs"].as_u64().unwrap() > 0, "{line}");
        assert!(glue["p99_ms"].as_f64() >= glue["p50_ms"].as_f64(), "{line}");
        assert!(line["host"]["target_cores"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["rss_mb"].as_f64().unwrap() > 0.0, "{line}");
    }
    // The same input gives both sides the same outputs to make: counts, tags and records.
    for scenario in ["b", "c", "d"] {
        let expected: Vec<&Value> =
            lines.iter().filter(|line| line["scenario"] == scenario).map(|line| &line["glue"]["expected"]).collect();
        assert!(expected.windows(2).all(|pair| pair[0] == pair[1]), "{scenario}: {expected:?}");
    }
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| kafka-streams |") && summary.contains("×"), "{summary}");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["runs"].as_array().unwrap().len(), 16, "{meta}");
    assert!(meta["kafka"]["version"].is_string(), "{meta}");
    assert!(std::fs::read_to_string(out.join("streams-b-eos-x0.02.svg")).unwrap().contains("kafka-streams"));
    assert!(out.join("peer-logs").join("kafka-streams-a-eos-x0.02-kill.log").exists());
    assert!(summary.contains("**Kill runs:**"), "{summary}");
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
}

/// `onehop bench query`, small: point selects over onehop's Postgres listener, over its REST
/// GET and over a Postgres 15 of the run's own, and the three-table join on both, whose
/// answers the benchmark compares (it fails when they differ).
#[test]
fn bench_query_runs_point_selects_and_a_join_against_postgres() {
    let dir = tempfile::tempdir().unwrap();
    // Postgres runs as the `postgres` user when the test is root: it must pass through here.
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
    let out = dir.path().join("out");
    let output = common::onehop()
        .args(["bench", "query", "--rate", "100", "--duration", "1", "--warmup", "0", "--orders", "3000"])
        .args(["--join-runs", "2", "--json", "--dir"])
        .arg(dir.path())
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let line: Value = stdout
        .lines()
        .find(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap())
        .unwrap_or_else(|| panic!("no JSON line in {stdout}"));
    for side in ["onehop-pg", "onehop-rest", "postgres"] {
        let point = &line["point"][side];
        assert!(point["count"].as_u64().unwrap() >= 50, "{line}");
        assert!(point["p99_ns"].as_u64() >= point["p50_ns"].as_u64(), "{line}");
    }
    assert!(line["join_ms"]["onehop"].as_f64().unwrap() > 0.0, "{line}");
    assert!(line["ratios"]["join_vs_postgres"].as_f64().unwrap() > 0.0, "{line}");
    let summary = std::fs::read_to_string(out.join("summary.md")).unwrap();
    assert!(summary.contains("| onehop-rest |") && summary.contains("Goals:"), "{summary}");
    assert!(std::fs::read_to_string(out.join("query-latency.svg")).unwrap().contains("postgres"));
    let leftovers = processes_mentioning(&dir.path().to_string_lossy());
    assert!(leftovers.is_empty(), "still running: {leftovers:?}");
}

#[test]
fn a_target_that_does_not_run_the_workload_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::onehop()
        .args(["bench", "w1", "--target", "mosquitto", "--no-progress", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("mosquitto runs none of W1"), "{stderr}");
    let output = common::onehop()
        .args(["bench", "w4", "--target", "kafka", "--kafka-brokers", "2", "--no-progress", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--kafka-brokers must be 1 or 3"));
}
