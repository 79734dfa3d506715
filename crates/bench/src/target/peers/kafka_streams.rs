//! `kafka-streams` (W3): study 1's conventional pipeline for a windowed count per key. Kafka
//! (the `kafka` target's KRaft brokers) → a Kafka Streams 4.1 application
//! (`bench/baselines/streams`): tumbling 5 s windows with 1 s grace, the windowed KTable's plain
//! changelog to one output topic and its `suppress(untilWindowCloses)` to another, and
//! Interactive Queries over HTTP for point queries. One application per run, on a topic of its
//! own; its producer sends the harness's events with acks=1, lz4 and a 5 ms linger.
//!
//! The harness measures it as it measures onehop's W3, from the same schedule, keys and event
//! times: freshness is the first changelog row that includes an event (onehop: the first view
//! row over SSE), the final freshness and close lag come from the suppressed rows (onehop: the
//! view's closing rows), and point queries go through the same HTTP client to the app's
//! Interactive Queries server as to onehop's `GET /views/{v}/{key}`.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::glue::{Glue, read_reports};
use super::kafka::{COMPRESSION, JVM_OPTIONS, KafkaTarget, LINGER_MS};
use super::{free_port, installed, log_dir, system_program};
use crate::client::{Endpoints, http::HttpWriter};
use crate::plan::Plan;
use crate::recorder::{Observation, Receipts, Recorder};
use crate::target::{Observers, Session, Target, TargetOptions};

/// The producers' acknowledgement (the input's and the application's own), as the issue asks.
const ACKS: &str = "1";
/// Offsets committed (and the producer flushed) this often: Kafka Streams' docs lower it from
/// the at-least-once default of 30 s when latency matters.
const COMMIT_INTERVAL_MS: u32 = 100;
/// The record cache in front of the window store, off: every update of a count goes downstream
/// at once. With the default (10 MiB) updates wait for a commit or an eviction.
const CACHE_BYTES: u64 = 0;
/// Heap of the application's JVM: Kafka Streams used 145–220 MB resident here.
const HEAP: &str = "512m";
/// Partitions of the input and output topics: one, as onehop's W3 stream, so one task and one
/// stream time.
const PARTITIONS: u32 = 1;
/// The path point queries ask under (`/views/<v>/<key>`, as onehop's); the app reads the key.
const QUERY_PATH: &str = "/views/w3";
const MAIN_CLASS: &str = "dev.onehop.bench.W3Streams";

pub struct KafkaStreamsTarget {
    kafka: KafkaTarget,
    java: PathBuf,
    lib: PathBuf,
    logs: PathBuf,
    /// The current run's application, so its CPU and memory count as the target's.
    app_pid: Mutex<Option<u32>>,
    settings: serde_json::Value,
    data: tempfile::TempDir,
}

impl KafkaStreamsTarget {
    pub fn start(options: &TargetOptions) -> anyhow::Result<KafkaStreamsTarget> {
        let lib = installed("kafka-streams/lib", "kafka-streams")?;
        let java = system_program("java", "kafka-streams")?;
        let data = tempfile::Builder::new().prefix("onehop-peer-streams-").tempdir_in(&options.dir)?;
        let logs = log_dir(options.logs.as_deref(), data.path(), "kafka-streams")?;
        // RocksDB unpacks its native library (14 MB) into java.io.tmpdir and removes it only on
        // a clean exit: here, inside the target's own directory, removed with it.
        std::fs::create_dir_all(data.path().join("tmp"))?;
        // Every client prints its whole configuration at INFO when it starts.
        let log4j = super::kafka::log4j2_properties("the app's", &[("clients", "org.apache.kafka.clients")]);
        std::fs::write(data.path().join("log4j2.properties"), log4j)?;
        let kafka_options = TargetOptions { logs: Some(logs.clone()), ..options.clone() };
        let kafka = KafkaTarget::start(&kafka_options).context("starting Kafka")?;
        let mut kafka_settings = kafka.settings();
        if let Some(fields) = kafka_settings.as_object_mut() {
            // The W4 target's franz-go producer and consumer are not this pipeline's.
            for field in ["producer", "consumer", "glue", "partitions"] {
                fields.remove(field);
            }
        }
        let version = super::version_of(&java, &["-cp", &format!("{}/*", lib.display()), MAIN_CLASS, "version"]);
        let settings = json!({
            "pipeline": "Java producer → Kafka → Kafka Streams windowed count → changelog topic and suppressed topic → a consumer reporting to the harness; Interactive Queries over HTTP",
            "kafka": kafka_settings,
            "topics": {
                "partitions": PARTITIONS,
                "replication_factor": kafka.replication(),
                "min_insync_replicas": kafka.min_insync(),
                "input": "one per run; key k<n>, record timestamp the event time (the event's intended send, epoch ms, as onehop's event_ms)",
                "output": "<input>-changes (every update of a window's count) and <input>-finals (suppressed: one per window)",
            },
            "producer": {
                "client": version,
                "acks": ACKS,
                "idempotent": false,
                "compression": COMPRESSION,
                "linger_ms": LINGER_MS,
            },
            "streams": {
                "version": version,
                "topology": "stream(input).groupByKey().windowedBy(TimeWindows.ofSizeAndGrace(5 s, 1 s)).count(window store) → toStream() to <input>-changes; suppress(untilWindowCloses(BufferConfig.unbounded())) → toStream() to <input>-finals",
                "window_ms": 5_000,
                "grace_ms": 1_000,
                "processing_guarantee": "at_least_once",
                "num_stream_threads": 1,
                "commit_interval_ms": COMMIT_INTERVAL_MS,
                "statestore_cache_max_bytes": CACHE_BYTES,
                "store": "RocksDB window store (the default), retention window + grace",
                "producer": { "acks": ACKS, "compression": COMPRESSION, "linger_ms": LINGER_MS },
                "stream_time": "moves with records only; once the input has been idle 100 ms (after the schedule's last event, at 100 events/s) the app sends a record of key __tick with the wall clock's time, so the last windows close as they would on a live topic; ticks are counted under their own key and never reported",
            },
            "output_consumer": {
                "assignment": "both output topics' partition, from the beginning, no group",
                "fetch": "the consumer's defaults (fetch.min.bytes 1, fetch.max.wait.ms 500), read_uncommitted",
                "receipt": "the harness's kernel stamp when the consumer's report line reaches its socket (one loopback hop after the consumer's poll)",
            },
            "interactive_queries": {
                "server": "the JDK's com.sun.net.httpserver, HTTP/1.1 keep-alive, 4 threads, on 127.0.0.1, TCP_NODELAY on (sun.net.httpserver.nodelay=true)",
                "query": "GET /views/w3/<key> → ReadOnlyWindowStore.fetch(key, now − 2 × (window + grace), now + window), every window the store holds for the key; 404 when none",
                "client": "the harness's own HTTP client, as for onehop's point queries",
            },
            "heap": HEAP,
            "jvm_options": JVM_OPTIONS,
            "java": super::version_of(&java, &["-version"]),
            "app": "bench/baselines/streams (Java): one process per run, reporting to the harness over loopback TCP",
        });
        Ok(KafkaStreamsTarget { kafka, java, lib, logs, app_pid: Mutex::new(None), settings, data })
    }

    /// The application's command line for one run on topic `name`.
    fn command(&self, name: &str, query_port: u16, window_ms: i64, grace_ms: i64) -> anyhow::Result<Command> {
        let state = self.data.path().join(format!("state-{name}"));
        std::fs::create_dir_all(&state)?;
        let mut command = Command::new(&self.java);
        command
            .arg(format!("-Xms{HEAP}"))
            .arg(format!("-Xmx{HEAP}"))
            .args(JVM_OPTIONS)
            .arg(format!("-Djava.io.tmpdir={}", self.data.path().join("tmp").display()))
            // The JDK's HTTP server leaves Nagle's algorithm on by default: a response written
            // in two parts would wait for the client's delayed ACK (~40 ms). Off, as the
            // harness's client and onehop's server have it.
            .arg("-Dsun.net.httpserver.nodelay=true")
            .arg(format!("-Dlog4j2.configurationFile={}", self.data.path().join("log4j2.properties").display()))
            .arg("-cp")
            .arg(format!("{}/*", self.lib.display()))
            .arg(MAIN_CLASS);
        let flags = [
            ("--brokers", self.kafka.bootstrap().to_string()),
            ("--topic", name.to_string()),
            ("--state-dir", state.display().to_string()),
            ("--window-ms", window_ms.to_string()),
            ("--grace-ms", grace_ms.to_string()),
            ("--replication", self.kafka.replication().to_string()),
            // Whole milliseconds, as Java's client takes them (5, not 5.0).
            ("--linger-ms", (LINGER_MS as u64).to_string()),
            ("--commit-interval-ms", COMMIT_INTERVAL_MS.to_string()),
            ("--cache-bytes", CACHE_BYTES.to_string()),
            ("--query-port", query_port.to_string()),
        ];
        for (flag, value) in flags {
            command.arg(flag).arg(value);
        }
        Ok(command)
    }
}

impl Target for KafkaStreamsTarget {
    fn name(&self) -> &str {
        "kafka-streams"
    }

    fn durability(&self, _plan: &Plan) -> String {
        format!(
            "acks=1: the partition's leader has it in memory (replication {}); no fsync per write",
            self.kafka.replication()
        )
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, _runtime: &Handle) -> anyhow::Result<Session> {
        let Plan::View(view) = plan else { bail!("kafka-streams runs W3 only") };
        let name = crate::client::unique_name("bench_w3");
        let query_port = free_port()?;
        let command = self.command(&name, query_port, view.window_ms, view.grace_ms)?;
        let glue = Glue::start_command(command, &[], self.logs.join(format!("app-{name}.log")), true)
            .context("starting the Kafka Streams app")?;
        *self.app_pid.lock().expect("app pid") = Some(glue.pid());
        // Each event's line carries its key and its event time, as onehop's write carries them.
        let subjects = {
            let (recorder, view) = (recorder.clone(), view.clone());
            Box::new(move |seq: u64| {
                let events = &recorder.events;
                format!("k{} {}", view.key_of(seq), events.clock.epoch_ms_at(events.intended_ns(seq)))
            })
        };
        let endpoints = Endpoints::plain(format!("http://127.0.0.1:{query_port}"), String::new());
        let querier = HttpWriter::queries(&endpoints, QUERY_PATH.into(), view.clone(), recorder.clone())
            .context("connecting to the app's Interactive Queries server")?;
        let mut session =
            glue.with_subjects(subjects).session_reporting(recorder, Observers::default(), observe_rows)?;
        session.querier = Some(Box::new(querier));
        Ok(session)
    }

    fn process_ids(&self) -> Vec<u32> {
        let mut pids = self.kafka.process_ids();
        pids.extend(*self.app_pid.lock().expect("app pid"));
        pids
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }
}

/// One report of the app: a changelog row (`W c <key> <window_start_ms> <count>`) or a
/// suppressed, final one (`W f …`), for a key `k<n>`.
fn parse_row(line: &str) -> Option<(bool, u32, i64, u64)> {
    let mut words = line.split(' ');
    if words.next()? != "W" {
        return None;
    }
    let is_final = match words.next()? {
        "c" => false,
        "f" => true,
        _ => return None,
    };
    let key = words.next()?.strip_prefix('k')?.parse().ok()?;
    let window_start_ms = words.next()?.parse().ok()?;
    let count = words.next()?.parse().ok()?;
    words.next().is_none().then_some((is_final, key, window_start_ms, count))
}

/// Records the app's rows as the view's observations until `stop`.
fn observe_rows(stream: TcpStream, recorder: Arc<Recorder>, stop: Arc<AtomicBool>) {
    let mut observations = Receipts::new();
    let ended = read_reports(stream, &recorder, &stop, &mut |line, received_ns, arrived_ns| match parse_row(line) {
        Some((is_final, key, window_start_ms, count)) => {
            observations.push(Observation { key, window_start_ms, count, is_final, received_ns, arrived_ns });
            if is_final {
                recorder.count_finals(1);
            }
            1
        }
        None => {
            recorder.problem(format!("the Kafka Streams app reported {line:?}"));
            0
        }
    });
    if let Some(why) = ended {
        recorder.observer_failed(why);
    }
    recorder.add_observations(observations);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_parsed_and_anything_else_refused() {
        assert_eq!(parse_row("W c k17 1795000005000 3"), Some((false, 17, 1_795_000_005_000, 3)));
        assert_eq!(parse_row("W f k0 1795000000000 12"), Some((true, 0, 1_795_000_000_000, 12)));
        for bad in [
            "",
            "W",
            "W x k1 0 1",
            "W c 1 0 1",
            "W c k1 0",
            "W c k1 0 1 extra",
            "W c __tick 0 1",
            "R 5",
            "W c k1 zero 1",
        ] {
            assert_eq!(parse_row(bad), None, "{bad:?}");
        }
    }
}
