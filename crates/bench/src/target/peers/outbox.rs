//! `kafka-stack` on W1: study 1's conventional pipeline for "save an event durably, then notify
//! every subscriber whose lookup key it carries". The application (Node.js, `pg`) inserts each
//! event into an outbox table in Postgres and answers once the commit is fsynced; Debezium's
//! embedded engine reads the table's inserts from the write-ahead log (pgoutput) and a Kafka
//! producer relays them to the brokers (`bench/baselines/cdc`); the application's kafkajs
//! consumer looks up each of the event's 5 keys in Redis (`SMEMBERS`) and POSTs to the
//! harness's notify endpoint once per subscriber found (`bench/baselines/stack-node/outbox.js`).
//!
//! Debezium's `poll.interval.ms` decides most of the latency: `kafka-stack` runs it at its
//! default (500 ms), which is what teams run, and `kafka-stack-poll-5ms` at 5 ms, the tuned case.
//!
//! Postgres is started once per target, in its directory; per run the harness puts every key's
//! subscriber into Redis, starts a relay (its own replication slot, dropped when it stops) and a
//! glue, which starts the run only once a probe row has come through the whole pipeline.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::glue::Glue;
use super::kafka::{COMPRESSION, JVM_OPTIONS, KafkaTarget, LINGER_MS};
use super::postgres::{self, PostgresPeer};
use super::redis::RedisPeer;
use super::{PeerProcess, installed, system_program, version_of};
use crate::plan::Routing;
use crate::recorder::Recorder;
use crate::target::{Observers, Session};

/// Debezium's own default poll interval, and the tuned one.
pub const POLL_INTERVAL_MS_DEFAULT: u32 = 500;
pub const POLL_INTERVAL_MS_TUNED: u32 = 5;
/// The relay's heap: Kafka Connect's start scripts' (`connect-distributed.sh`), the JVM a team
/// would run Debezium in. It used 135–200 MB resident here.
const HEAP_MIN: &str = "256m";
const HEAP_MAX: &str = "2g";
const MAIN_CLASS: &str = "dev.onehop.bench.W1Relay";
/// Partitions of each run's topic: one, as a topic Debezium sends to comes to exist by default
/// (the broker's `num.partitions`, 1). With 12 (W2's) kafkajs 2.2.4 awaits an offset commit
/// after every partition's batch, and at a 5 ms poll each batch was one event: measured here,
/// one replicated commit per event left the consumer seconds behind at 50 events/s (p50 2.7 s).
const PARTITIONS: u32 = 1;
/// Connections the glue's pg Pool keeps at most (`POOL_CONNECTIONS_MAX` in `outbox.js`).
const POOL_CONNECTIONS_MAX: u32 = 10;

/// The W1 side of the stack: its Postgres, and what a run's relay is started from.
pub struct Outbox {
    postgres: PostgresPeer,
    java: PathBuf,
    lib: PathBuf,
    script: PathBuf,
    /// The target's directory: the relays' offsets, temporary files and log4j configuration.
    data: PathBuf,
    poll_interval_ms: u32,
    /// The current run's relay, so its CPU and memory count as the target's.
    relay_pid: Mutex<Option<u32>>,
}

impl Outbox {
    /// Starts Postgres in `data` (the target's own directory) and checks the relay is installed.
    pub fn start(data: &Path, logs: &Path, poll_interval_ms: u32) -> anyhow::Result<Outbox> {
        let lib = installed("cdc/lib", "kafka-stack")?;
        let script = installed("stack-node/outbox.js", "kafka-stack")?;
        let java = system_program("java", "kafka-stack")?;
        std::fs::create_dir_all(data.join("tmp"))?;
        // Every Kafka client prints its whole configuration at INFO when it starts.
        let log4j = super::kafka::log4j2_properties("the relay's", &[("clients", "org.apache.kafka.clients")]);
        std::fs::write(data.join("log4j2-relay.properties"), log4j)?;
        let postgres = PostgresPeer::start(data, logs).context("starting Postgres")?;
        Ok(Outbox {
            postgres,
            java,
            lib,
            script,
            data: data.to_path_buf(),
            poll_interval_ms,
            relay_pid: Mutex::new(None),
        })
    }

    pub fn process_ids(&self) -> Vec<u32> {
        let mut pids = vec![self.postgres.pid()];
        pids.extend(*self.relay_pid.lock().expect("relay pid"));
        pids
    }

    /// What an acknowledged write has waited for.
    pub fn durability(&self, kafka: &KafkaTarget) -> String {
        format!(
            "the INSERT's commit: Postgres fsynced its WAL (fsync=on, synchronous_commit=on); Debezium then relays it to Kafka with acks=all (replication {}, min ISR {}; no fsync per write there)",
            kafka.replication(),
            kafka.min_insync()
        )
    }

    /// meta.json's record of the W1 pipeline.
    pub fn settings(
        &self,
        kafka: &KafkaTarget,
        kafka_settings: serde_json::Value,
        redis: &RedisPeer,
    ) -> serde_json::Value {
        let glue = version_of(
            &system_program("node", "kafka-stack").unwrap_or_default(),
            &[self.script.to_str().unwrap_or_default(), "version"],
        );
        let relay = version_of(&self.java, &["-cp", &format!("{}/*", self.lib.display()), MAIN_CLASS, "version"]);
        let poll = if self.poll_interval_ms == POLL_INTERVAL_MS_DEFAULT {
            "Debezium's default: what teams run"
        } else {
            "tuned down from Debezium's default of 500 ms"
        };
        json!({
            "pipeline": format!(
                "pg INSERT into the outbox (its own transaction; Postgres fsyncs the commit) → Debezium embedded engine (pgoutput, outbox event router, poll.interval.ms {}) → Kafka producer (acks=all, lz4, linger 5 ms) → Kafka → kafkajs consumer → Redis SMEMBERS per key (5 per event) → HTTP POST per subscriber",
                self.poll_interval_ms
            ),
            "kafka": kafka_settings,
            "topic": {
                "partitions": PARTITIONS,
                "replication_factor": kafka.replication(),
                "min_insync_replicas": kafka.min_insync(),
                "key": "the outbox row's aggregateid (the event's seq)",
                "why_one_partition": "as a topic Debezium sends to is made by default (the broker's num.partitions); with 12, kafkajs's commit after every partition's batch was one commit per event at a 5 ms poll and its consumer fell seconds behind",
                "created_by": "the glue (kafkajs admin), before the relay sends to it",
            },
            "postgres": self.postgres.settings(),
            "writer": {
                "client": glue,
                "pool_connections_max": POOL_CONNECTIONS_MAX,
                "write": "INSERT INTO public.outbox (aggregatetype, aggregateid, type, payload) in autocommit: one transaction per event, answered to the harness when the commit returns",
            },
            "debezium": {
                "version": relay,
                "engine": "DebeziumEngine (embedded, Connect format), one per run, in its own JVM",
                "connector": "io.debezium.connector.postgresql.PostgresConnector",
                "plugin_name": "pgoutput",
                "poll_interval_ms": self.poll_interval_ms,
                "poll_interval": poll,
                "snapshot_mode": "no_data (streams from its slot's creation on)",
                "slot": "one per run, slot.drop.on.stop=true",
                "publication": format!("{} FOR TABLE {} (made by the harness; publication.autocreate.mode=disabled)", postgres::PUBLICATION, postgres::OUTBOX_TABLE),
                "transforms": "io.debezium.transforms.outbox.EventRouter (defaults; route.topic.replacement = the run's topic)",
                "offsets": "FileOffsetBackingStore in the target's directory, offset.flush.interval.ms at its default (60 000)",
                "batching": "Debezium's defaults (max.batch.size 2048, max.queue.size 8192)",
                "heap": format!("-Xms{HEAP_MIN} -Xmx{HEAP_MAX}"),
                "jvm_options": JVM_OPTIONS,
                "java": version_of(&self.java, &["-version"]),
            },
            "relay_producer": {
                "client": relay,
                "acks": "all",
                "idempotent": "Kafka's default (true with acks=all)",
                "compression": COMPRESSION,
                "linger_ms": LINGER_MS,
                "batch": "each batch Debezium hands over is sent whole; it is marked processed once Kafka acknowledged every record (as Kafka Connect's source task does)",
            },
            "consumer": {
                "client": glue,
                "group": "one per run, joined before the schedule starts",
                "processing": "kafkajs eachMessage: one event at a time per partition; SMEMBERS of its 5 keys side by side, then one POST per member side by side, all answered before the next event",
                "fetch": "kafkajs's defaults (minBytes 1, maxWaitTimeInMs 5000, auto-commit on)",
            },
            "redis": redis.settings(),
            "notify": {
                "request": "POST /subscribers/<n> with {seq, key, subscriber}, answered 204",
                "http_client": "Node's http, keep-alive Agent, at most 64 sockets",
                "receipt": "the harness's kernel stamp when the request's bytes reach its socket",
            },
            "start": "per run the glue inserts probe rows every 250 ms until one has come through Debezium and Kafka to its consumer; the schedule starts after",
            "glue": "bench/baselines/stack-node/outbox.js (Node.js) and bench/baselines/cdc (Java): one of each per run",
        })
    }

    /// The relay's command line for one run, sending to `topic`.
    fn relay_command(&self, kafka: &KafkaTarget, name: &str) -> Command {
        let mut command = Command::new(&self.java);
        command
            .arg(format!("-Xms{HEAP_MIN}"))
            .arg(format!("-Xmx{HEAP_MAX}"))
            .args(JVM_OPTIONS)
            .arg(format!("-Djava.io.tmpdir={}", self.data.join("tmp").display()))
            .arg(format!("-Dlog4j2.configurationFile={}", self.data.join("log4j2-relay.properties").display()))
            .arg("-cp")
            .arg(format!("{}/*", self.lib.display()))
            .arg(MAIN_CLASS);
        let flags = [
            ("--postgres", self.postgres.address()),
            ("--database", postgres::DATABASE.to_string()),
            ("--user", postgres::USER.to_string()),
            ("--table", postgres::OUTBOX_TABLE.to_string()),
            ("--publication", postgres::PUBLICATION.to_string()),
            // A slot's name: lower-case letters, digits and underscores (the run's name is).
            ("--slot", name.to_string()),
            ("--offsets", self.data.join(format!("offsets-{name}.dat")).display().to_string()),
            ("--brokers", kafka.bootstrap().to_string()),
            ("--topic", name.to_string()),
            ("--poll-interval-ms", self.poll_interval_ms.to_string()),
            // Whole milliseconds, as Java's client takes them (5, not 5.0).
            ("--linger-ms", (LINGER_MS as u64).to_string()),
            ("--compression", COMPRESSION.to_string()),
        ];
        for (flag, value) in flags {
            command.arg(flag).arg(value);
        }
        command
    }

    /// Prepares one W1 run: the keys' subscribers in Redis, the notify endpoint, a relay and a
    /// glue whose probe came through.
    pub fn open(
        &self,
        kafka: &KafkaTarget,
        redis: &RedisPeer,
        routing: &Routing,
        logs: &Path,
        recorder: &Arc<Recorder>,
        runtime: &Handle,
    ) -> anyhow::Result<Session> {
        let Routing::Lookup { keys, .. } = routing else { bail!("the outbox pipeline runs W1 only") };
        let name = crate::client::unique_name("bench_w1");
        let prefix = format!("{name}:");
        // W1's subscriber n follows key k<n>: each key's set holds that one subscriber.
        for key in 0..*keys {
            redis
                .add_to_set(&format!("{prefix}keys/k{key}"), &[key.to_string()])
                .with_context(|| format!("putting the subscriber of key {key} into Redis"))?;
        }
        let relay = PeerProcess::start(
            "debezium relay",
            self.relay_command(kafka, &name),
            logs.join(format!("relay-{name}.log")),
        )?;
        *self.relay_pid.lock().expect("relay pid") = Some(relay.pid());
        let mut observers = Observers::default();
        let notify = super::http_observer::start(recorder, &mut observers, *keys)?;
        let args: Vec<String> = [
            ("--brokers", kafka.bootstrap().to_string()),
            ("--topic", name.clone()),
            ("--group", format!("{name}_consumer")),
            ("--partitions", PARTITIONS.to_string()),
            ("--replication", kafka.replication().to_string()),
            ("--min-insync", kafka.min_insync().to_string()),
            ("--postgres", self.postgres.address()),
            ("--database", postgres::DATABASE.to_string()),
            ("--user", postgres::USER.to_string()),
            ("--table", postgres::OUTBOX_TABLE.to_string()),
            ("--redis", redis.address().to_string()),
            ("--key-prefix", prefix),
            ("--notify", format!("http://{notify}")),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
        let node = system_program("node", "kafka-stack")?;
        let mut command = Command::new(node);
        command.arg(&self.script).env("KAFKAJS_NO_PARTITIONER_WARNING", "1");
        let glue = match Glue::start_command(command, &args, logs.join(format!("glue-{name}.log")), false) {
            Ok(glue) => glue,
            Err(error) => {
                observers.stop(runtime)?;
                return Err(error).context(format!(
                    "starting the Node.js glue (pg, kafkajs, ioredis); the relay's log: {}",
                    relay.log.display()
                ));
            }
        };
        // The relay stops (by its PID) with the run's observers, once the run has drained.
        observers.keep(Box::new(relay));
        let routing = routing.clone();
        glue.with_subjects(Box::new(move |seq| routing.label_of(seq))).session_with(recorder, observers)
    }
}
