//! `kafka`: W4 as study 1 ran it on Kafka. Three KRaft brokers (each broker and controller),
//! a topic of 12 partitions per run, replication 3 with min ISR 2, and per run a glue process
//! (`bench/baselines/glue`, franz-go) whose producer sends with acks=all, lz4, 5 ms linger and
//! batches of at most 500 records, and whose consumer takes batches of up to 256 records or
//! 50 ms and commits each. Two figures: receipt (the consumer has the record) and commit (its
//! batch's offsets are committed).
//!
//! `--kafka-brokers 1` runs one broker (replication 1, min ISR 1): the CI smoke's cluster.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::glue::Glue;
use super::{PeerProcess, free_port, installed, log_dir, stop_all, system_program, wait_for_port};
use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::target::{Session, Target, TargetOptions};

/// Partitions of each run's topic, as in the study.
pub const PARTITIONS: u32 = 12;
/// The producer's linger, compression and batch cap, as in the study.
pub const LINGER_MS: f64 = 5.0;
pub const COMPRESSION: &str = "lz4";
pub const BATCH_RECORDS_MAX: u32 = 500;
/// The consumer's batch: this many records, or this long after its first record.
pub const CONSUME_RECORDS_MAX: u32 = 256;
pub const CONSUME_WAIT_MS: f64 = 50.0;
/// Heap of each broker: the default of Kafka's own start script (`kafka-server-start.sh`).
pub const HEAP: &str = "1g";
/// The JVM options Kafka's start scripts give a broker (`kafka-run-class.sh`), and the Kafka
/// Streams app too.
pub const JVM_OPTIONS: [&str; 7] = [
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
];
/// A 16-byte cluster id in Kafka's form (URL-safe base64, unpadded); every cluster here is new,
/// on fresh directories, so one fixed id serves: the bytes of "onehop-bench-kfk".
const CLUSTER_ID: &str = "b25laG9wLWJlbmNoLWtmaw";
/// How long the brokers may take to listen (3 JVMs on 2 cores take ~10 s).
const START_TIMEOUT: Duration = Duration::from_secs(120);

pub struct KafkaTarget {
    brokers: Vec<PeerProcess>,
    bootstrap: String,
    replication: u32,
    min_insync: u32,
    glue: PathBuf,
    logs: PathBuf,
    settings: serde_json::Value,
    _data: tempfile::TempDir,
}

/// The replication and min ISR of a cluster of `brokers`: the study's 3 and 2, or 1 and 1.
fn replication_of(brokers: u32) -> (u32, u32) {
    if brokers >= 3 { (3, 2) } else { (1, 1) }
}

/// The Kafka version, from the broker jar's name (`kafka_2.13-4.1.2.jar`).
fn kafka_version(lib: &Path) -> String {
    std::fs::read_dir(lib)
        .ok()
        .and_then(|entries| {
            entries.filter_map(Result::ok).find_map(|entry| {
                let name = entry.file_name().to_string_lossy().into_owned();
                name.strip_prefix("kafka_2.13-").and_then(|rest| rest.strip_suffix(".jar")).map(str::to_string)
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

fn server_properties(node: u32, brokers: u32, ports: &[(u16, u16)], log_dirs: &Path, fsync: bool) -> String {
    let (replication, min_insync) = replication_of(brokers);
    let voters: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(index, (_, controller))| format!("{}@127.0.0.1:{controller}", index + 1))
        .collect();
    let (port, controller) = ports[node as usize - 1];
    format!(
        "# Written by onehop bench: KRaft, each node broker and controller, loopback only.\n\
         process.roles=broker,controller\n\
         node.id={node}\n\
         controller.quorum.voters={}\n\
         listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}\n\
         advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
         controller.listener.names=CONTROLLER\n\
         inter.broker.listener.name=PLAINTEXT\n\
         listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n\
         log.dirs={}\n\
         num.partitions=1\n\
         default.replication.factor={replication}\n\
         min.insync.replicas={min_insync}\n\
         offsets.topic.replication.factor={replication}\n\
         transaction.state.log.replication.factor={replication}\n\
         transaction.state.log.min.isr={min_insync}\n\
         share.coordinator.state.topic.replication.factor={replication}\n\
         share.coordinator.state.topic.min.isr={min_insync}\n\
         # A new consumer group starts at once: each run has its own group and waits for it.\n\
         group.initial.rebalance.delay.ms=0\n{}",
        voters.join(","),
        log_dirs.display(),
        if fsync {
            "# Every write fsynced before it is acknowledged, as onehop does.\nlog.flush.interval.messages=1\n"
        } else {
            ""
        }
    )
}

/// A log4j2 configuration that sends a JVM's log (`what`: the broker's, the app's) to stdout,
/// which the harness keeps with the run, at INFO but for the loggers `quiet` names (at WARN).
pub fn log4j2_properties(what: &str, quiet: &[(&str, &str)]) -> String {
    let mut text = format!(
        "# Written by onehop bench: {what} log to stdout, kept with the run.\n\
         status = warn\n\
         appender.stdout.type = Console\n\
         appender.stdout.name = STDOUT\n\
         appender.stdout.layout.type = PatternLayout\n\
         appender.stdout.layout.pattern = [%d] %p %m (%c)%n\n\
         rootLogger.level = INFO\n\
         rootLogger.appenderRefs = stdout\n\
         rootLogger.appenderRef.stdout.ref = STDOUT\n"
    );
    for (id, logger) in quiet {
        text.push_str(&format!("logger.{id}.name = {logger}\nlogger.{id}.level = WARN\n"));
    }
    text
}

impl KafkaTarget {
    pub fn start(options: &TargetOptions) -> anyhow::Result<KafkaTarget> {
        let brokers = options.kafka_brokers;
        if brokers != 1 && brokers != 3 {
            bail!("--kafka-brokers must be 1 or 3, not {brokers}");
        }
        let lib = installed("kafka/lib", "kafka")?;
        let glue = installed("bin/onehop-peer-glue", "kafka")?;
        let java = system_program("java", "kafka")?;
        let data = tempfile::Builder::new().prefix("onehop-peer-kafka-").tempdir_in(&options.dir)?;
        let logs = log_dir(options.logs.as_deref(), data.path(), "kafka")?;
        let ports: Vec<(u16, u16)> =
            (0..brokers).map(|_| Ok((free_port()?, free_port()?))).collect::<anyhow::Result<_>>()?;
        let log4j = data.path().join("log4j2.properties");
        std::fs::write(&log4j, log4j2_properties("the broker's", &[("state", "state.change.logger")]))?;
        let classpath = format!("{}/*", lib.display());
        let java_command = |main: &str| {
            let mut command = Command::new(&java);
            command
                .arg(format!("-Xms{HEAP}"))
                .arg(format!("-Xmx{HEAP}"))
                .args(JVM_OPTIONS)
                .arg(format!("-Dlog4j2.configurationFile={}", log4j.display()))
                .arg("-cp")
                .arg(&classpath)
                .arg(main);
            command
        };
        // Format every node's storage (in parallel: each is a JVM), then start them all.
        let mut configs = Vec::new();
        let mut formats = Vec::new();
        for node in 1..=brokers {
            let node_dir = data.path().join(format!("node-{node}"));
            std::fs::create_dir_all(&node_dir)?;
            let config = node_dir.join("server.properties");
            let properties = server_properties(node, brokers, &ports, &node_dir.join("data"), options.kafka_fsync);
            std::fs::write(&config, properties)?;
            let mut command = java_command("kafka.tools.StorageTool");
            command.args(["format", "-t", CLUSTER_ID, "-c"]).arg(&config);
            formats.push(PeerProcess::start(
                &format!("kafka storage format {node}"),
                command,
                logs.join(format!("format-{node}.log")),
            )?);
            configs.push(config);
        }
        for format in &mut formats {
            format.wait_success(START_TIMEOUT)?;
        }
        let mut processes = Vec::new();
        for (index, config) in configs.iter().enumerate() {
            let mut command = java_command("kafka.Kafka");
            command.arg(config);
            processes.push(PeerProcess::start(
                &format!("kafka broker {}", index + 1),
                command,
                logs.join(format!("broker-{}.log", index + 1)),
            )?);
        }
        for (process, (port, _)) in processes.iter_mut().zip(&ports) {
            if let Err(error) = wait_for_port(&format!("127.0.0.1:{port}"), process, START_TIMEOUT) {
                stop_all(&mut processes);
                return Err(error);
            }
        }
        let (replication, min_insync) = replication_of(brokers);
        let bootstrap = ports.iter().map(|(port, _)| format!("127.0.0.1:{port}")).collect::<Vec<_>>().join(",");
        let settings = json!({
            "version": kafka_version(&lib),
            "source": "Maven Central org.apache.kafka:kafka_2.13 and kafka-tools (bench/baselines/kafka/pom.xml)",
            "brokers": brokers,
            "mode": "KRaft, every node broker and controller",
            "partitions": PARTITIONS,
            "replication_factor": replication,
            "min_insync_replicas": min_insync,
            "flush": if options.kafka_fsync {
                "every write fsynced (log.flush.interval.messages=1)"
            } else {
                "Kafka's defaults: no fsync per write (log.flush.interval.messages unset); a write is durable by replication to the in-sync replicas' page cache"
            },
            "heap": HEAP,
            "jvm_options": JVM_OPTIONS,
            "java": super::version_of(&java, &["-version"]),
            "server_properties_node_1": std::fs::read_to_string(&configs[0])?,
            "producer": producer_settings(&glue),
            "consumer": consumer_settings(),
            "glue": "bench/baselines/glue (Go): one process per run, reporting to the harness over loopback TCP",
        });
        Ok(KafkaTarget { brokers: processes, bootstrap, replication, min_insync, glue, logs, settings, _data: data })
    }
}

impl KafkaTarget {
    /// The brokers' process ids, to measure them apart from an application on them.
    pub fn pids(&self) -> Vec<u32> {
        self.brokers.iter().map(PeerProcess::pid).collect()
    }

    /// The brokers' addresses, comma-separated, as clients are given them.
    pub fn bootstrap(&self) -> &str {
        &self.bootstrap
    }

    /// The replication factor of this cluster's topics.
    pub fn replication(&self) -> u32 {
        self.replication
    }

    /// The min ISR of this cluster's topics.
    pub fn min_insync(&self) -> u32 {
        self.min_insync
    }
}

/// The glue's arguments for one W4 run against `bootstrap`: the study's producer and consumer
/// settings, a topic and a group named after `name`.
pub fn ingest_args(
    bootstrap: &str,
    name: &str,
    replication: u32,
    min_insync: u32,
    payload_bytes: usize,
) -> Vec<String> {
    vec![
        "kafka-ingest".into(),
        "--brokers".into(),
        bootstrap.to_string(),
        "--topic".into(),
        name.to_string(),
        "--group".into(),
        format!("{name}_consumer"),
        "--partitions".into(),
        PARTITIONS.to_string(),
        "--replication".into(),
        replication.to_string(),
        "--min-insync".into(),
        min_insync.to_string(),
        "--linger-ms".into(),
        LINGER_MS.to_string(),
        "--batch-records-max".into(),
        BATCH_RECORDS_MAX.to_string(),
        "--payload-bytes".into(),
        payload_bytes.to_string(),
        "--compression".into(),
        COMPRESSION.into(),
        "--consume-records-max".into(),
        CONSUME_RECORDS_MAX.to_string(),
        "--consume-wait-ms".into(),
        CONSUME_WAIT_MS.to_string(),
    ]
}

/// The glue's producer, as meta.json records it.
pub fn producer_settings(glue: &Path) -> serde_json::Value {
    json!({
        "client": super::version_of(glue, &["version"]),
        "acks": "all",
        "idempotent": true,
        "compression": COMPRESSION,
        "linger_ms": LINGER_MS,
        "batch_records_max": BATCH_RECORDS_MAX,
        "partitioner": "franz-go default (sticky for records without a key)",
    })
}

/// The glue's consumer, as meta.json records it.
pub fn consumer_settings() -> serde_json::Value {
    json!({
        "group": "one per run",
        "batch_records_max": CONSUME_RECORDS_MAX,
        "batch_wait_ms": CONSUME_WAIT_MS,
        "commit": "synchronous, once per batch (auto-commit off)",
        "receipt": "reported when a poll returns the record",
    })
}

impl Target for KafkaTarget {
    fn name(&self) -> &str {
        "kafka"
    }

    fn durability(&self, _plan: &Plan) -> String {
        format!(
            "acks=all: every in-sync replica of {} has it in memory, at least {} (min ISR); no fsync per write",
            self.replication, self.min_insync
        )
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, _runtime: &Handle) -> anyhow::Result<Session> {
        let Plan::Ingest(ingest) = plan else {
            bail!("kafka runs W4 only (kafka-stack and kafka-streams run W1–W3)")
        };
        let name = crate::client::unique_name("bench_ingest");
        let args = ingest_args(&self.bootstrap, &name, self.replication, self.min_insync, ingest.payload_bytes);
        let glue = Glue::start(&self.glue, &args, self.logs.join(format!("glue-{name}.log")))
            .context("starting the Kafka glue (producer and consumer)")?;
        glue.session(recorder)
    }

    fn process_ids(&self) -> Vec<u32> {
        self.brokers.iter().map(PeerProcess::pid).collect()
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }
}

impl Drop for KafkaTarget {
    fn drop(&mut self) {
        stop_all(&mut self.brokers);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_log4j2_configuration_has_one_setting_per_line_and_the_quiet_loggers_at_warn() {
        let text = super::log4j2_properties("the broker's", &[("state", "state.change.logger")]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "# Written by onehop bench: the broker's log to stdout, kept with the run.");
        assert!(lines.contains(&"appender.stdout.layout.pattern = [%d] %p %m (%c)%n"), "{text}");
        assert!(lines.contains(&"rootLogger.appenderRef.stdout.ref = STDOUT"), "{text}");
        assert_eq!(lines[lines.len() - 2..], ["logger.state.name = state.change.logger", "logger.state.level = WARN"]);
        assert!(lines.iter().all(|line| !line.starts_with(' ')), "{text}");
    }
}
