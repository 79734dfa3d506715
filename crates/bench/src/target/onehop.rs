//! The onehop target: a `onehop serve` this harness starts, or a running one.

use std::sync::Arc;

use anyhow::Context;
use tokio::runtime::Handle;

use super::{Session, Target, TargetOptions};
use crate::client::{self, Endpoints};
use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::server::ServerProcess;

pub struct OnehopTarget {
    endpoints: Endpoints,
    /// The server this target started (stopped on drop), or `None` for `--url`.
    process: Option<ServerProcess>,
}

impl OnehopTarget {
    pub fn start(options: &TargetOptions) -> anyhow::Result<OnehopTarget> {
        if let Some(url) = &options.url {
            let url = url.trim_end_matches('/').to_string();
            let mqtt = match &options.mqtt_address {
                Some(address) => address.clone(),
                None => {
                    let host = url.split("://").nth(1).unwrap_or(&url).split([':', '/']).next().unwrap_or_default();
                    format!("{host}:1883")
                }
            };
            return Ok(OnehopTarget { endpoints: Endpoints { http: url, mqtt }, process: None });
        }
        if let Some(address) = &options.mqtt_address {
            // A broker's address alone: MQTT workloads only, with the server's default durability.
            return Ok(OnehopTarget {
                endpoints: Endpoints { http: String::new(), mqtt: address.clone() },
                process: None,
            });
        }
        let process = ServerProcess::start(&options.exe, &options.dir, &[])
            .with_context(|| format!("starting {} serve", options.exe.display()))?;
        let endpoints = Endpoints { http: process.url.clone(), mqtt: process.mqtt.clone() };
        Ok(OnehopTarget { endpoints, process: Some(process) })
    }
}

impl OnehopTarget {
    pub fn mqtt_address(&self) -> &str {
        &self.endpoints.mqtt
    }
}

impl Target for OnehopTarget {
    fn name(&self) -> &str {
        "onehop"
    }

    fn durability(&self, plan: &Plan) -> String {
        // The stream is created with this durability; a write is answered once it holds.
        plan.durability().to_string()
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
        client::open(&self.endpoints, plan, recorder, runtime)
    }

    fn server_pid(&self) -> Option<u32> {
        self.process.as_ref().map(ServerProcess::pid)
    }

    fn fsyncs(&self, runtime: &Handle) -> Option<crate::fsyncs::Fsyncs> {
        // The whole server's: with --url, other clients' writes count too. A server that does
        // not answer in time leaves the run without the figure, not the harness waiting.
        let url = format!("{}/metrics", self.endpoints.http);
        let text = runtime.block_on(async {
            let request = client::http::client().ok()?.get(&url).timeout(std::time::Duration::from_secs(5));
            let response = request.send().await.ok()?;
            response.error_for_status().ok()?.text().await.ok()
        })?;
        crate::fsyncs::Fsyncs::parse(&text)
    }
}
