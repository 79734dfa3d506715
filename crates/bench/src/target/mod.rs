//! Targets: the systems a workload drives, behind one small interface.
//!
//! A target turns a [`Plan`] into a [`Session`] for one run: it defines what the workload
//! needs (streams, views), opens the observers (subscribers) that record what they receive,
//! and hands back a producer the scheduler calls with the events due. How it does that is its
//! own business — onehop over HTTP, SSE and MQTT today; Kafka, Postgres + Debezium, Redis or
//! NATS clients later — as long as it records honestly: when each event went out, when the
//! target acknowledged it, and when each observer received it, all on the run's clock.
//!
//! - `onehop`: a `onehop serve` started for the invocation (release build, temporary data
//!   directory, separate process), or a running one (`--url`). `onehop-auth`, `onehop-tls` and
//!   `onehop-secure` start it with access on (every client logged in as a user that is not a
//!   superuser), TLS on (every client over TLS, handshakes before the schedule), or both.
//! - `echo`: a loopback server inside the harness that speaks the same protocols and answers and
//!   delivers at once, with no disk and no real routing: driven by the same client code, it
//!   measures the harness's own latency floor.
//! - `peers`: the conventional stacks the studies measured (`kafka`, `kafka-stack`,
//!   `kafka-stack-poll-5ms`, `kafka-streams`, `mosquitto`, `nats`, `nats-sync`), installed by
//!   `scripts/peers install` and started as processes of their own.

pub mod cluster;
pub mod echo;
pub mod onehop;
pub mod peers;

use std::any::Any;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::bail;
use tokio::runtime::Handle;

use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::schedule::Producer;

/// A system under test, ready for runs. Dropping it stops whatever it started.
pub trait Target {
    fn name(&self) -> &str;

    /// What an acknowledged write has waited for on this target (recorded in meta.json).
    fn durability(&self, plan: &Plan) -> String;

    /// Prepares one run of `plan`: definitions made, observers subscribed and recording into
    /// `recorder`. The schedule starts once this returns.
    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session>;

    /// The server process this target started, if any (its memory is reported, and
    /// `--pause-ms` stops it).
    fn server_pid(&self) -> Option<u32> {
        None
    }

    /// Every process this target started and runs on (a peer's brokers): their CPU and memory
    /// are reported as the target's.
    fn process_ids(&self) -> Vec<u32> {
        self.server_pid().into_iter().collect()
    }

    /// Every setting of the target that a reader needs to judge its figures (versions,
    /// durability, batching, heap…), recorded in meta.json as `target_settings`.
    fn settings(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// The target's fdatasync histogram so far, if it exposes one: read before and after each
    /// run, so a run's tail can be checked against the disk.
    fn fsyncs(&self, _runtime: &Handle) -> Option<crate::fsyncs::Fsyncs> {
        None
    }

    /// Failed logins and TLS handshakes the target has counted so far, if it counts them: read
    /// before and after each run, so a run whose clients were refused says so.
    fn refusals(&self, _runtime: &Handle) -> Option<u64> {
        None
    }
}

/// One run's handles.
pub struct Session {
    pub producer: Box<dyn Producer>,
    /// Point queries on their own schedule (views).
    pub querier: Option<Box<dyn Producer>>,
    pub observers: Observers,
}

/// The observers of a run: async tasks and threads, stopped together once the run has drained.
pub struct Observers {
    stop_flag: Arc<AtomicBool>,
    stop_signal: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Anything that must live as long as the observers (connections held open).
    keep: Vec<Box<dyn Any + Send>>,
}

impl Default for Observers {
    fn default() -> Self {
        Observers {
            stop_flag: Arc::new(AtomicBool::new(false)),
            stop_signal: tokio::sync::watch::channel(false).0,
            tasks: Vec::new(),
            threads: Vec::new(),
            keep: Vec::new(),
        }
    }
}

impl Observers {
    /// Set when observer threads should stop.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        self.stop_flag.clone()
    }

    /// Changes when observer tasks should stop.
    pub fn stop_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.stop_signal.subscribe()
    }

    pub fn add_task(&mut self, task: tokio::task::JoinHandle<()>) {
        self.tasks.push(task);
    }

    pub fn add_thread(&mut self, thread: std::thread::JoinHandle<()>) {
        self.threads.push(thread);
    }

    pub fn keep(&mut self, value: Box<dyn Any + Send>) {
        self.keep.push(value);
    }

    /// Stops every observer and waits until each has handed over what it recorded.
    pub fn stop(self, runtime: &Handle) -> anyhow::Result<()> {
        self.stop_flag.store(true, Ordering::Relaxed);
        let _ = self.stop_signal.send(true);
        let mut panicked = false;
        runtime.block_on(async {
            for task in self.tasks {
                panicked |= task.await.is_err();
            }
        });
        for thread in self.threads {
            panicked |= thread.join().is_err();
        }
        drop(self.keep);
        if panicked {
            bail!("an observer panicked");
        }
        Ok(())
    }
}

/// Where targets start their servers and which running ones to use.
#[derive(Clone, Debug)]
pub struct TargetOptions {
    /// A running onehop's HTTP URL; `None` starts one.
    pub url: Option<String>,
    /// A running onehop's MQTT listener (`host:port`); with `url` and no address, the URL's
    /// host on port 1883.
    pub mqtt_address: Option<String>,
    /// The onehop executable to start (`onehop serve`).
    pub exe: PathBuf,
    /// Where a started server keeps its data: the disk being measured.
    pub dir: PathBuf,
    /// Brokers of the `kafka` target's cluster: 3 (replication 3, min ISR 2, as the study) or
    /// 1 (replication 1: the CI smoke).
    pub kafka_brokers: u32,
    /// Kafka fsyncs every write (`log.flush.interval.messages=1`) instead of leaving it to the
    /// page cache, its default: the same durability as onehop's acknowledgement.
    pub kafka_fsync: bool,
    /// Where peers' processes write their logs, kept with the run; `None`: in their temporary
    /// data directory.
    pub logs: Option<PathBuf>,
}

/// The targets this harness knows, by name.
pub const TARGET_NAMES: [&str; 14] = [
    "onehop",
    "onehop-cluster",
    "onehop-auth",
    "onehop-tls",
    "onehop-secure",
    "echo",
    "kafka",
    "kafka-stack",
    "kafka-stack-poll-5ms",
    "kafka-streams",
    "onehop-kafka",
    "mosquitto",
    "nats",
    "nats-sync",
];

/// Whether target `name` runs the workload of `plan`: onehop (plain, with access, TLS or both)
/// and the echo run every workload; `kafka-stack` runs W1 (lookup keys, through Postgres and
/// Debezium at its default poll interval) and W2 (tags); `kafka-stack-poll-5ms` runs W1 with
/// Debezium polling every 5 ms; `kafka-streams` runs W3 (a view); the brokers run W4
/// (ingestion) only.
pub fn serves(name: &str, plan: &Plan) -> bool {
    match name {
        "onehop" | "onehop-auth" | "onehop-tls" | "onehop-secure" | "echo" => true,
        // Views and tables are not replicated yet (docs/cluster.md): streams only.
        "onehop-cluster" => matches!(plan, Plan::Fanout(_) | Plan::Ingest(_)),
        "kafka-stack" => matches!(
            plan,
            Plan::Fanout(fanout) if matches!(fanout.routing, crate::plan::Routing::Tags { .. } | crate::plan::Routing::Lookup { .. })
        ),
        "kafka-stack-poll-5ms" => {
            matches!(plan, Plan::Fanout(fanout) if matches!(fanout.routing, crate::plan::Routing::Lookup { .. }))
        }
        "kafka-streams" => matches!(plan, Plan::View(_)),
        _ => matches!(plan, Plan::Ingest(_)),
    }
}

/// Starts (or connects to) the target called `name`, for runs of `plan`.
pub fn start(name: &str, options: &TargetOptions, plan: &Plan) -> anyhow::Result<Box<dyn Target>> {
    use peers::mqtt_broker::{Broker, BrokerTarget};
    match name {
        "onehop" | "onehop-auth" | "onehop-tls" | "onehop-secure" => {
            let protection = onehop::Protection::of_target(name).expect("a onehop target");
            Ok(Box::new(onehop::OnehopTarget::start_protected(options, protection)?))
        }
        "onehop-cluster" => Ok(Box::new(cluster::ClusterTarget::start(options)?)),
        "echo" => Ok(Box::new(echo::EchoTarget::start(plan)?)),
        "kafka" => Ok(Box::new(peers::kafka::KafkaTarget::start(options)?)),
        "kafka-stack" => Ok(Box::new(peers::kafka_stack::KafkaStackTarget::start(
            "kafka-stack",
            options,
            plan,
            peers::outbox::POLL_INTERVAL_MS_DEFAULT,
        )?)),
        "kafka-stack-poll-5ms" => Ok(Box::new(peers::kafka_stack::KafkaStackTarget::start(
            "kafka-stack-poll-5ms",
            options,
            plan,
            peers::outbox::POLL_INTERVAL_MS_TUNED,
        )?)),
        "kafka-streams" => Ok(Box::new(peers::kafka_streams::KafkaStreamsTarget::start(options)?)),
        "onehop-kafka" => Ok(Box::new(peers::onehop_kafka::OnehopKafkaTarget::start(options)?)),
        "mosquitto" => Ok(Box::new(BrokerTarget::start(Broker::Mosquitto, options)?)),
        "nats" => Ok(Box::new(BrokerTarget::start(Broker::Nats { sync_always: false }, options)?)),
        "nats-sync" => Ok(Box::new(BrokerTarget::start(Broker::Nats { sync_always: true }, options)?)),
        other => bail!("unknown target {other:?}: the targets are {}", TARGET_NAMES.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;

    #[test]
    fn the_kafka_stack_runs_w1_and_w2_and_its_tuned_debezium_w1_only() {
        let runs = |name: &str| -> Vec<&str> {
            Workload::ALL.iter().filter(|workload| serves(name, &workload.plan(1, None))).map(|w| w.id()).collect()
        };
        assert_eq!(runs("kafka-stack"), ["W1", "W2"]);
        assert_eq!(runs("kafka-stack-poll-5ms"), ["W1"]);
        assert_eq!(runs("kafka-streams"), ["W3"]);
        assert_eq!(runs("kafka"), ["W4"]);
        assert!(TARGET_NAMES.contains(&"kafka-stack-poll-5ms"));
    }
}
