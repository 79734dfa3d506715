//! `onehop-kafka`: W4 through onehop's Kafka listener with the very client the `kafka` target
//! uses — the same glue process (franz-go: an idempotent producer with acks=all, lz4, 5 ms
//! linger, batches of at most 500 records; a consumer group taking up to 256 records or 50 ms
//! and committing each batch), the same topic of 12 partitions — so the two differ only in
//! the server. A topic here has one replica (one node), and acks=all means the fdatasync of
//! the group commit holding the write.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::glue::Glue;
use super::kafka::{consumer_settings, ingest_args, producer_settings};
use super::{installed, log_dir};
use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::server::ServerProcess;
use crate::target::{Session, Target, TargetOptions};

pub struct OnehopKafkaTarget {
    server: ServerProcess,
    glue: PathBuf,
    logs: PathBuf,
    settings: serde_json::Value,
    _logs_dir: Option<tempfile::TempDir>,
}

impl OnehopKafkaTarget {
    pub fn start(options: &TargetOptions) -> anyhow::Result<OnehopKafkaTarget> {
        let glue = installed("bin/onehop-peer-glue", "kafka")?;
        let server = ServerProcess::start(&options.exe, &options.dir, &[])
            .with_context(|| format!("starting {} serve", options.exe.display()))?;
        if server.kafka.is_empty() {
            bail!("the server did not say where its Kafka listener is");
        }
        let scratch = tempfile::Builder::new().prefix("onehop-kafka-glue-").tempdir_in(&options.dir)?;
        let logs = log_dir(options.logs.as_deref(), scratch.path(), "onehop-kafka")?;
        let settings = json!({
            "server": "onehop serve, its Kafka listener",
            "partitions": super::kafka::PARTITIONS,
            "replication_factor": 1,
            "min_insync_replicas": 1,
            "flush": "acks=all is answered after the fdatasync of the group-commit batch holding the write",
            "producer": producer_settings(&glue),
            "consumer": consumer_settings(),
            "glue": "bench/baselines/glue (Go), the kafka target's: one process per run, reporting to the harness over loopback TCP",
        });
        Ok(OnehopKafkaTarget { server, glue, logs, settings, _logs_dir: Some(scratch) })
    }
}

impl Target for OnehopKafkaTarget {
    fn name(&self) -> &str {
        "onehop-kafka"
    }

    fn durability(&self, _plan: &Plan) -> String {
        "acks=all: fdatasync of the group-commit batch holding the write (one node)".into()
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, _runtime: &Handle) -> anyhow::Result<Session> {
        let Plan::Ingest(ingest) = plan else { bail!("onehop-kafka runs W4 only") };
        let name = crate::client::unique_name("bench_ingest");
        let args = ingest_args(&self.server.kafka, &name, 1, 1, ingest.payload_bytes);
        let glue = Glue::start(&self.glue, &args, self.logs.join(format!("glue-{name}.log")))
            .context("starting the Kafka glue (producer and consumer) against onehop")?;
        glue.session(recorder)
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.server.pid())
    }

    fn settings(&self) -> serde_json::Value {
        self.settings.clone()
    }

    fn fsyncs(&self, runtime: &Handle) -> Option<crate::fsyncs::Fsyncs> {
        let url = format!("{}/metrics", self.server.url);
        let text = runtime.block_on(async {
            let request = crate::client::http::client().ok()?.get(&url).timeout(std::time::Duration::from_secs(5));
            let response = request.send().await.ok()?;
            response.error_for_status().ok()?.text().await.ok()
        })?;
        crate::fsyncs::Fsyncs::parse(&text)
    }
}
