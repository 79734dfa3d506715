//! `kafka-stack` (W1 and W2) and `kafka-stack-poll-5ms` (W1): study 1's conventional stack.
//! W1, the outbox through Debezium, is in `outbox`; here is the target, and W2's pipeline for
//! "deliver each message to every subscriber of its tag". Kafka (the `kafka` target's KRaft brokers: 3, replication 3, min ISR
//! 2) → a consumer that looks up the event's tag in Redis (`SMEMBERS`) → one HTTP POST per
//! subscriber to the harness's notify endpoint (`http_observer`). The application is Node.js
//! with kafkajs and ioredis, as the study wrote it (`bench/baselines/stack-node`); one glue
//! process per run, its producer answering the harness when Kafka acknowledged (acks=all).
//!
//! Before each run the harness itself puts every subscriber into its tags' Redis sets (SADD),
//! from the same plan onehop's subscribers follow, under a key prefix of the run's own.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::glue::Glue;
use super::kafka::{COMPRESSION, KafkaTarget, LINGER_MS, PARTITIONS};
use super::outbox::Outbox;
use super::redis::RedisPeer;
use super::{installed, log_dir, system_program, version_of};
use crate::plan::{Plan, Routing};
use crate::recorder::Recorder;
use crate::target::{Observers, Session, Target, TargetOptions};

/// The subscribers' sockets the glue keeps to the notify endpoint (`NOTIFY_SOCKETS_MAX` in
/// `stack.js`), recorded with the settings.
const NOTIFY_SOCKETS_MAX: u32 = 64;

pub struct KafkaStackTarget {
    name: &'static str,
    kafka: KafkaTarget,
    /// W1's Postgres and Debezium, started only for W1.
    outbox: Option<Outbox>,
    redis: RedisPeer,
    node: PathBuf,
    script: PathBuf,
    logs: PathBuf,
    settings: serde_json::Value,
    _data: tempfile::TempDir,
}

impl KafkaStackTarget {
    /// Starts the stack for `plan`: with Postgres and Debezium (polling every
    /// `poll_interval_ms`) for W1, without for W2.
    pub fn start(
        name: &'static str,
        options: &TargetOptions,
        plan: &Plan,
        poll_interval_ms: u32,
    ) -> anyhow::Result<KafkaStackTarget> {
        let script = installed("stack-node/stack.js", "kafka-stack")?;
        installed("stack-node/node_modules", "kafka-stack")?;
        let node = system_program("node", "kafka-stack")?;
        let data = tempfile::Builder::new().prefix("onehop-peer-stack-").tempdir_in(&options.dir)?;
        let logs = log_dir(options.logs.as_deref(), data.path(), name)?;
        // The brokers' logs go beside the stack's own (peer-logs/kafka-stack/kafka/).
        let kafka_options = TargetOptions { logs: Some(logs.clone()), ..options.clone() };
        let kafka = KafkaTarget::start(&kafka_options).context("starting Kafka")?;
        let redis = RedisPeer::start(&data.path().join("redis"), &logs).context("starting Redis")?;
        let outbox = match plan {
            Plan::Fanout(fanout) if matches!(fanout.routing, Routing::Lookup { .. }) => {
                Some(Outbox::start(data.path(), &logs, poll_interval_ms)?)
            }
            _ => None,
        };
        let mut kafka_settings = kafka.settings();
        if let Some(fields) = kafka_settings.as_object_mut() {
            // The W4 target's franz-go producer and consumer are not this stack's.
            for field in ["producer", "consumer", "glue"] {
                fields.remove(field);
            }
        }
        if let Some(w1) = &outbox {
            let settings = w1.settings(&kafka, kafka_settings, &redis);
            return Ok(KafkaStackTarget { name, kafka, outbox, redis, node, script, logs, settings, _data: data });
        }
        let client = version_of(&node, &[script.to_str().unwrap_or_default(), "version"]);
        let settings = json!({
            "pipeline": "kafkajs producer → Kafka → kafkajs consumer → Redis SMEMBERS <tag> → HTTP POST per subscriber",
            "kafka": kafka_settings,
            "topic": {
                "partitions": PARTITIONS,
                "replication_factor": kafka.replication(),
                "min_insync_replicas": kafka.min_insync(),
                "key": "the event's tag (kafkajs 2's default partitioner: murmur2 of the key, as the Java client's)",
            },
            "producer": {
                "client": client,
                "acks": "all",
                "idempotent": false,
                "compression": COMPRESSION,
                "compression_codec": "lz4js, registered with kafkajs (which ships no lz4 codec)",
                "linger_ms": LINGER_MS,
                "linger": "kafkajs has no linger setting; the glue gathers the events that arrive within 5 ms of the first waiting one into one send(), as the Java client's linger.ms does",
            },
            "consumer": {
                "client": client,
                "group": "one per run, joined before the schedule starts",
                "processing": "kafkajs eachMessage: one event at a time per partition; SMEMBERS of its tag, then one POST per member side by side, all answered before the next event",
                "fetch": "kafkajs's defaults (minBytes 1, maxWaitTimeInMs 5000, auto-commit on)",
            },
            "redis": redis.settings(),
            "notify": {
                "request": "POST /subscribers/<n> with {seq, tag, subscriber}, answered 204",
                "http_client": format!("Node's http, keep-alive Agent, at most {NOTIFY_SOCKETS_MAX} sockets"),
                "receipt": "the harness's kernel stamp when the request's bytes reach its socket",
            },
            "glue": "bench/baselines/stack-node (Node.js): one process per run, its producer answering the harness over loopback TCP",
        });
        Ok(KafkaStackTarget { name, kafka, outbox, redis, node, script, logs, settings, _data: data })
    }
}

impl Target for KafkaStackTarget {
    fn name(&self) -> &str {
        self.name
    }

    fn durability(&self, plan: &Plan) -> String {
        match &self.outbox {
            Some(outbox) => outbox.durability(&self.kafka),
            None => self.kafka.durability(plan),
        }
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
        let Plan::Fanout(fanout) = plan else { bail!("kafka-stack runs W1 and W2 only") };
        if let Some(outbox) = &self.outbox {
            return outbox.open(&self.kafka, &self.redis, &fanout.routing, &self.logs, recorder, runtime);
        }
        let Routing::Tags { by_tag, of_subscriber, .. } = &fanout.routing else {
            bail!("kafka-stack was started for W2 and runs W2 only")
        };
        let name = crate::client::unique_name("bench_w2");
        let prefix = format!("{name}:");
        for (tag, subscribers) in by_tag.iter().enumerate() {
            let members: Vec<String> = subscribers.iter().map(u32::to_string).collect();
            self.redis
                .add_to_set(&format!("{prefix}tags/t{tag}"), &members)
                .with_context(|| format!("putting the subscribers of tag {tag} into Redis"))?;
        }
        let mut observers = Observers::default();
        let notify = super::http_observer::start(recorder, &mut observers, of_subscriber.len() as u32)?;
        let args: Vec<String> = [
            ("--brokers", self.kafka.bootstrap().to_string()),
            ("--topic", name.clone()),
            ("--group", format!("{name}_consumer")),
            ("--partitions", PARTITIONS.to_string()),
            ("--replication", self.kafka.replication().to_string()),
            ("--min-insync", self.kafka.min_insync().to_string()),
            ("--linger-ms", LINGER_MS.to_string()),
            ("--redis", self.redis.address().to_string()),
            ("--key-prefix", prefix),
            ("--notify", format!("http://{notify}")),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect();
        let mut command = Command::new(&self.node);
        // kafkajs warns at every start that its default partitioner changed in 2.0; the one it
        // uses (murmur2 of the key, as the Java client's) is recorded with the settings.
        command.arg(&self.script).env("KAFKAJS_NO_PARTITIONER_WARNING", "1");
        let glue = match Glue::start_command(command, &args, self.logs.join(format!("glue-{name}.log")), false) {
            Ok(glue) => glue,
            Err(error) => {
                observers.stop(runtime)?;
                return Err(error).context("starting the Node.js glue (kafkajs, ioredis)");
            }
        };
        let routing = fanout.routing.clone();
        glue.with_subjects(Box::new(move |seq| routing.subject_of(seq).unwrap_or_default()))
            .session_with(recorder, observers)
    }

    fn process_ids(&self) -> Vec<u32> {
        let mut pids = self.kafka.process_ids();
        pids.push(self.redis.pid());
        pids.extend(self.outbox.iter().flat_map(Outbox::process_ids));
        pids
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }
}
