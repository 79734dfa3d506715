//! The Kafka listener, tested with Kafka's own Java clients and tools (the `kafka-clients` and
//! `kafka-tools` jars of Kafka 4.1, which `scripts/peers install kafka` fetches from Maven
//! Central; scripts/test runs it), with librdkafka (kcat and confluent-kafka), kafkajs (npm) and
//! franz-go (the harness's glue); and with raw frames for what no client sends.
//!
//! - `clients`: producing with every compression (the Java producer is idempotent by default),
//!   consuming by partition, topics created and listed by the admin tool, records crossing from
//!   MQTT to Kafka and from Kafka to SSE.
//! - `franz_go`: franz-go (the harness's Go client) producing with every codec, a group
//!   reading every record back and committing; its group of three and idempotent producer.
//! - `durability`: kill -9 under an `acks=all` producer loses no acknowledged record.
//! - `group_of_three`: the test every client passes, written once: a group of three members
//!   across a leave and a kill -9, each record consumed exactly once; an idempotent producer
//!   across a kill -9, each acknowledged record where it was acknowledged and stored once.
//! - `headers`: repeated header names and null values, from confluent-kafka, an HTTP batch
//!   and MQTT 5 user properties, reach a Kafka consumer and an HTTP read as written.
//! - `groups`: a static member (confluent-kafka) back after a kill -9 without a rebalance;
//!   a consumer group of three console consumers rebalancing, and resuming from its
//!   committed offsets after a kill -9 of the server.
//! - `idempotence`: a proxy loses the answers to an idempotent producer's batches three times;
//!   each retried batch is recognised and stored once.
//! - `kafkajs`: Node.js's kafkajs (admin, idempotent producer, consumer group, commits); its
//!   group of three and idempotent producer.
//! - `librdkafka`: kcat (Debian's, librdkafka 2.0) producing with every compression and
//!   consuming whole and in a group; confluent-kafka for Python (PyPI, a current librdkafka)
//!   with every codec, a committed and an aborted transaction, and a read_committed group; its
//!   group of three and idempotent producer.
//! - `protocol`: malformed, oversized and unknown requests close only their own connection.
//! - `sasl`: once users exist, kcat (PLAIN, SCRAM-SHA-256/512) and the Java client (SCRAM-SHA-512)
//!   log in, and produce, fetch and list only what their grants allow.
//! - `streams`: a Kafka Streams app with exactly_once_v2 (a windowed count, compiled by the
//!   test) counts exactly once across a kill -9 of the app.
//! - `transactions`: Kafka's transactional copier (the Java client's transactions, aborting at
//!   random) copies exactly once across a kill -9 of the server; kafkajs's transactions are
//!   invisible over HTTP until they commit, and never seen once aborted.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod clients;
mod durability;
mod franz_go;
mod group_of_three;
mod groups;
mod headers;
mod idempotence;
mod kafkajs;
mod librdkafka;
mod protocol;
mod sasl;
mod streams;
mod transactions;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};

/// The directory of Kafka's jars, as `scripts/peers install kafka` leaves it.
fn kafka_jars() -> PathBuf {
    let peers = std::env::var_os("ONEHOP_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/onehop-peers"));
    let jars = peers.join("kafka/lib");
    assert!(
        jars.join("kafka-tools-4.1.2.jar").exists(),
        "Kafka's tools are not in {}: run `scripts/peers install kafka` (scripts/test does)",
        jars.display()
    );
    jars
}

/// A client process a test started: killed (SIGKILL, by its PID) and reaped when dropped, so a
/// test that fails midway leaves nothing running. Its own log (stderr) goes to a temporary
/// file, for a failing test to show ([`Spawned::log_tail`]).
struct Spawned(std::process::Child, Option<tempfile::NamedTempFile>);

/// A client's role (`consume`, `produce`, …) started as a process: its lines on stdout, its
/// own log kept aside.
fn spawn_role(command: &mut Command) -> Spawned {
    let log = tempfile::NamedTempFile::new().expect("a temporary file for the client's log");
    let stderr = log.reopen().expect("the client's log file");
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap_or_else(|error| panic!("{command:?} does not start: {error}"));
    Spawned(child, Some(log))
}

impl Spawned {
    /// The last `lines` lines the client logged.
    fn log_tail(&self, lines: usize) -> String {
        let Some(log) = &self.1 else { return String::new() };
        let text = std::fs::read_to_string(log.path()).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl std::ops::Deref for Spawned {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Every record of `stream`, read over HTTP from the earliest on, as the JSON HTTP gives.
fn records_over_http(address: SocketAddr, stream: &str) -> Vec<serde_json::Value> {
    let mut all = Vec::new();
    let mut from = "earliest".to_string();
    loop {
        let (status, body) = common::get(address, &format!("/streams/{stream}?from={from}&limit=5000"));
        assert_eq!(status, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let records = page["records"].as_array().unwrap();
        if records.is_empty() {
            return all;
        }
        all.extend(records.iter().cloned());
        from = page["next_from"].as_str().unwrap().to_string();
    }
}

/// A record's `(partition, offset)` and its value as text: a value that is not JSON reads back
/// as `value_text`, a JSON one as its JSON text.
fn placed_value(record: &serde_json::Value) -> ((u64, u64), String) {
    let at = (record["partition"].as_u64().unwrap(), record["offset"].as_u64().unwrap());
    let value = record["value_text"].as_str().map_or_else(|| record["value"].to_string(), str::to_string);
    (at, value)
}

/// A port free now, for a server whose Kafka listener must come back on the same one after a
/// kill -9 (its clients keep their bootstrap address across the restart).
fn free_port() -> u16 {
    common::free_port()
}

/// Starts the server with its Kafka listener on `address`, a port chosen before and kept across
/// restarts. Its other listeners take any free port, and the system may hand one of them the
/// very port `address` names while nothing holds it: that start fails with "Address already in
/// use" and is tried again (its other listeners then get other ports).
fn start_with_kafka_on(dir: &common::DataDir, address: &str) -> common::Server {
    for attempt in 1.. {
        let started =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dir.start(&["--kafka-addr", address], &[])));
        match started {
            Ok(server) => return server,
            Err(panic) => {
                let said = panic.downcast_ref::<String>().cloned().unwrap_or_default();
                if attempt >= 5 || !said.contains("Address already in use") {
                    std::panic::resume_unwind(panic);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
    unreachable!("the loop returns or panics")
}

/// A Kafka tool (a class of the Kafka jars) run by `java`, talking to `kafka`.
fn kafka_tool(class: &str, kafka: SocketAddr) -> Command {
    let mut command = Command::new("java");
    command
        .arg("-cp")
        .arg(format!("{}/*", kafka_jars().display()))
        .arg(class)
        .args(["--bootstrap-server", &kafka.to_string()]);
    command
}

/// Runs `command`, expecting it to succeed; returns its stdout.
fn succeed(command: &mut Command) -> String {
    let output: Output = command.output().expect("java runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{command:?} failed: {stdout}\n{stderr}");
    stdout
}

/// Creates `topic` with `partitions` through Kafka's admin tool.
fn create_topic(kafka: SocketAddr, topic: &str, partitions: u32) {
    let said = succeed(kafka_tool("org.apache.kafka.tools.TopicCommand", kafka).args([
        "--create",
        "--topic",
        topic,
        "--partitions",
        &partitions.to_string(),
    ]));
    assert!(said.contains(&format!("Created topic {topic}")), "{said}");
}

/// Produces `lines` (each `key<TAB>value`, or with `headers` first when `parse_headers`) with
/// the console producer and its defaults (idempotent, acks=all) plus `extra` settings.
fn console_produce(kafka: SocketAddr, topic: &str, lines: &[String], extra: &[&str]) {
    use std::io::Write;
    let mut child = kafka_tool("org.apache.kafka.tools.ConsoleProducer", kafka)
        .args(["--topic", topic, "--property", "parse.key=true"])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("java runs");
    let mut stdin = child.stdin.take().unwrap();
    for line in lines {
        writeln!(stdin, "{line}").unwrap();
    }
    drop(stdin);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "console producer: {stderr}");
    assert!(!stderr.contains("ERROR"), "console producer reported an error: {stderr}");
}

/// Reads `count` records of one partition from its start with the console consumer; each line
/// `Offset:N<TAB>headers<TAB>key<TAB>value`.
fn console_consume(kafka: SocketAddr, topic: &str, partition: u32, count: usize) -> Vec<String> {
    let said = succeed(kafka_tool("org.apache.kafka.tools.consumer.ConsoleConsumer", kafka).args([
        "--topic",
        topic,
        "--partition",
        &partition.to_string(),
        "--offset",
        "earliest",
        "--max-messages",
        &count.to_string(),
        "--timeout-ms",
        "20000",
        "--property",
        "print.key=true",
        "--property",
        "print.headers=true",
        "--property",
        "print.offset=true",
    ]));
    said.lines().filter(|line| line.starts_with("Offset:")).map(str::to_string).collect()
}
