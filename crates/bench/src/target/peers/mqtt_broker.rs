//! MQTT brokers as W4 targets: `mosquitto` (the reference broker, QoS 1, no persistence) and
//! NATS with JetStream (`nats` at its default fsync interval, `nats-sync` with
//! `sync_interval: always`), through its MQTT listener, which keeps QoS 1 messages in
//! JetStream file storage.
//!
//! W4 against onehop is MQTT 3.1.1 QoS 1 from the harness's own publisher to its own
//! subscriber. Both brokers speak it, so the very same client code drives them, on the same
//! clock, with no glue between the harness and the broker: the comparison is broker against
//! broker.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::{PeerProcess, free_port, log_dir, system_program, version_of, wait_for_port};
use crate::client::{self, Endpoints};
use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::target::{Session, Target, TargetOptions};

/// How long a broker may take to listen.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Which broker, and how it keeps messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    Mosquitto,
    /// NATS JetStream; `sync_always`: fsync every write instead of every 2 minutes.
    Nats {
        sync_always: bool,
    },
}

impl Broker {
    pub fn name(self) -> &'static str {
        match self {
            Broker::Mosquitto => "mosquitto",
            Broker::Nats { sync_always: false } => "nats",
            Broker::Nats { sync_always: true } => "nats-sync",
        }
    }
}

/// QoS 1 messages a subscriber may have unacknowledged in mosquitto; its default (20) is kept.
const MOSQUITTO_INFLIGHT_MAX: u32 = 20;
/// Messages mosquitto queues for a subscriber beyond those in flight before it drops them
/// (its default is 1 000): high enough that a sweep's bursts are queued, not lost.
const MOSQUITTO_QUEUED_MAX: u32 = 100_000;

pub struct BrokerTarget {
    broker: Broker,
    endpoints: Endpoints,
    process: PeerProcess,
    settings: serde_json::Value,
    _data: tempfile::TempDir,
}

impl BrokerTarget {
    pub fn start(broker: Broker, options: &TargetOptions) -> anyhow::Result<BrokerTarget> {
        let data =
            tempfile::Builder::new().prefix(&format!("onehop-peer-{}-", broker.name())).tempdir_in(&options.dir)?;
        let logs = log_dir(options.logs.as_deref(), data.path(), broker.name())?;
        let mqtt_port = free_port()?;
        let mqtt = format!("127.0.0.1:{mqtt_port}");
        let (mut process, settings) = match broker {
            Broker::Mosquitto => start_mosquitto(data.path(), &logs, mqtt_port)?,
            Broker::Nats { sync_always } => start_nats(data.path(), &logs, mqtt_port, sync_always)?,
        };
        wait_for_port(&mqtt, &mut process, START_TIMEOUT)?;
        // Listening is not serving: NATS takes its MQTT streams a moment after it binds.
        wait_for_mqtt(&mqtt, &mut process)?;
        let endpoints = Endpoints::plain(String::new(), mqtt);
        Ok(BrokerTarget { broker, endpoints, process, settings, _data: data })
    }
}

/// Waits until a CONNECT is accepted.
fn wait_for_mqtt(address: &str, process: &mut PeerProcess) -> anyhow::Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        match client::mqtt::Connection::open(address, "onehop-bench-ready") {
            Ok(_) => return Ok(()),
            Err(error) if Instant::now() > deadline => {
                bail!("{} never accepted an MQTT CONNECT: {error:#}; its log: {}", process.name, process.log.display())
            }
            Err(_) => {
                process.check_running()?;
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn start_mosquitto(data: &Path, logs: &Path, port: u16) -> anyhow::Result<(PeerProcess, serde_json::Value)> {
    let program = system_program("mosquitto", "mosquitto")?;
    let config = data.join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "# Written by onehop bench: one listener on loopback, anonymous clients, nothing on disk.\n\
             listener {port} 127.0.0.1\n\
             allow_anonymous true\n\
             persistence false\n\
             max_inflight_messages {MOSQUITTO_INFLIGHT_MAX}\n\
             max_queued_messages {MOSQUITTO_QUEUED_MAX}\n\
             log_dest stderr\n\
             log_type error\n\
             log_type warning\n\
             log_type notice\n\
             log_type information\n"
        ),
    )?;
    let mut command = Command::new(&program);
    command.arg("-c").arg(&config);
    let process = PeerProcess::start("mosquitto", command, logs.join("mosquitto.log"))?;
    let settings = json!({
        "version": version_of(&program, &["-h"]),
        "config": std::fs::read_to_string(&config)?,
        "persistence": false,
        "qos": 1,
        "max_inflight_messages": MOSQUITTO_INFLIGHT_MAX,
        "max_queued_messages": MOSQUITTO_QUEUED_MAX,
        "durability": "none: a QoS 1 PUBACK means the broker has the message in memory",
    });
    Ok((process, settings))
}

fn start_nats(
    data: &Path,
    logs: &Path,
    mqtt_port: u16,
    sync_always: bool,
) -> anyhow::Result<(PeerProcess, serde_json::Value)> {
    let program = super::installed("bin/nats-server", "nats")?;
    let (client_port, monitor_port) = (free_port()?, free_port()?);
    let store = data.join("jetstream");
    let sync = if sync_always { "\n    sync_interval: always" } else { "" };
    let config = data.join("nats.conf");
    std::fs::write(
        &config,
        format!(
            "# Written by onehop bench: loopback only; JetStream on file storage; MQTT on its own port.\n\
             listen: 127.0.0.1:{client_port}\n\
             http: 127.0.0.1:{monitor_port}\n\
             server_name: onehop_bench\n\
             jetstream {{\n    store_dir: \"{}\"{sync}\n}}\n\
             mqtt {{\n    listen: 127.0.0.1:{mqtt_port}\n}}\n",
            store.display()
        ),
    )?;
    let mut command = Command::new(&program);
    command.arg("-c").arg(&config);
    let name = Broker::Nats { sync_always }.name();
    let process = PeerProcess::start(name, command, logs.join("nats-server.log"))?;
    let settings = json!({
        "version": version_of(&program, &["--version"]),
        "config": std::fs::read_to_string(&config)?,
        "storage": "file (JetStream; MQTT QoS 1 messages and sessions are kept in JetStream streams)",
        "sync_interval": if sync_always { "always (fsync every write)" } else { "default: 2 minutes" },
        "qos": 1,
        "durability": if sync_always {
            "JetStream file storage, fsync of every write before the PUBACK"
        } else {
            "JetStream file storage, written to the page cache; fsync every 2 minutes (NATS's default)"
        },
    });
    Ok((process, settings))
}

impl Target for BrokerTarget {
    fn name(&self) -> &str {
        self.broker.name()
    }

    fn durability(&self, _plan: &Plan) -> String {
        match self.broker {
            Broker::Mosquitto => "none (QoS 1 PUBACK from memory, persistence false)".into(),
            Broker::Nats { sync_always: false } => "JetStream file, fsync every 2 min (default)".into(),
            Broker::Nats { sync_always: true } => "JetStream file, fsync every write (sync_interval: always)".into(),
        }
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
        if !matches!(plan, Plan::Ingest(_)) {
            bail!("{} runs W4 only", self.broker.name());
        }
        client::open(&self.endpoints, plan, recorder, runtime)
            .with_context(|| format!("opening a run on {}", self.broker.name()))
    }

    fn process_ids(&self) -> Vec<u32> {
        vec![self.process.pid()]
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }
}
