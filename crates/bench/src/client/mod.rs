//! The client side of onehop's protocols, as the workloads use them: writes over HTTP,
//! subscriptions over SSE or WebSocket, point queries over HTTP keep-alive, MQTT publishers and
//! subscribers. The onehop target and the echo target both run this code, so the echo
//! measures exactly what the harness adds.

pub mod http;
pub mod http1;
pub mod mqtt;
pub mod rxstamp;
pub mod sse;
pub mod ws;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::runtime::Handle;

use crate::plan::{Fanout, Ingest, Plan, Protocol, ViewPlan};
use crate::recorder::Recorder;
use crate::target::{Observers, Session};

/// Where a server listens.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// `http://host:port`
    pub http: String,
    /// `host:port`
    pub mqtt: String,
}

/// A name no earlier run used, so runs against one server never see each other's data.
pub fn unique_name(prefix: &str) -> String {
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    format!("{prefix}_{}_{nonce}", std::process::id())
}

/// Prepares one run of `plan` against the server at `endpoints`.
pub fn open(endpoints: &Endpoints, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
    let plan_shared = Arc::new(plan.clone());
    match plan {
        Plan::Fanout(fanout) => open_fanout(endpoints, fanout, plan_shared, recorder, runtime),
        Plan::View(view) => open_view(endpoints, view, plan_shared, recorder, runtime),
        Plan::Ingest(ingest) => open_ingest(endpoints, ingest, recorder, runtime),
    }
}

fn open_fanout(
    endpoints: &Endpoints,
    fanout: &Fanout,
    plan: Arc<Plan>,
    recorder: &Arc<Recorder>,
    runtime: &Handle,
) -> anyhow::Result<Session> {
    let stream = unique_name("bench_fanout");
    let producer_client = http::client()?;
    runtime.block_on(http::sql(
        &producer_client,
        &endpoints.http,
        &format!("CREATE STREAM {stream} WITH (partitions = 1, durability = '{}')", fanout.durability),
    ))?;
    let mut observers = Observers::default();
    let address = http::address_of(&endpoints.http);
    for (observer, filter) in fanout.routing.subscriptions() {
        let task = match fanout.protocol {
            Protocol::Sse => {
                let source = sse::Source::filtered(&address, &format!("/streams/{stream}"), &filter);
                let subscription = runtime.block_on(source.subscribe()).context("subscribing over SSE")?;
                let (recorder, stop) = (recorder.clone(), observers.stop_signal());
                runtime.spawn(sse::fanout_observer(source, subscription, observer, recorder, stop))
            }
            Protocol::Ws => {
                let socket = runtime
                    .block_on(ws::subscribe(&endpoints.http, &format!("/streams/{stream}"), &filter))
                    .context("subscribing over WebSocket")?;
                runtime.spawn(ws::fanout_observer(socket, observer, recorder.clone(), observers.stop_signal()))
            }
        };
        observers.add_task(task);
    }
    let producer = http::HttpWriter::events(&endpoints.http, format!("/streams/{stream}"), plan, recorder.clone())?;
    Ok(Session { producer: Box::new(producer), querier: None, observers })
}

fn open_view(
    endpoints: &Endpoints,
    view: &ViewPlan,
    plan: Arc<Plan>,
    recorder: &Arc<Recorder>,
    runtime: &Handle,
) -> anyhow::Result<Session> {
    let source = unique_name("bench_view_src");
    let name = unique_name("bench_view");
    let producer_client = http::client()?;
    let definitions = format!(
        "CREATE STREAM {source} WITH (partitions = 1, durability = '{}'); {}",
        view.durability,
        view.view_sql(&name, &source)
    );
    runtime.block_on(http::sql(&producer_client, &endpoints.http, &definitions))?;
    let mut observers = Observers::default();
    // One subscription to the whole view: every key's changes and closing rows.
    let address = http::address_of(&endpoints.http);
    let view_source = sse::Source { address, target: format!("/views/{name}") };
    let subscription = runtime.block_on(view_source.subscribe()).context("subscribing to the view")?;
    let (view_recorder, stop) = (recorder.clone(), observers.stop_signal());
    observers.add_task(runtime.spawn(sse::view_observer(view_source, subscription, view_recorder, stop)));
    let producer = http::HttpWriter::events(&endpoints.http, format!("/streams/{source}"), plan, recorder.clone())?;
    // Point queries on connections of their own, kept alive between queries.
    let querier = http::HttpWriter::queries(&endpoints.http, format!("/views/{name}"), view.clone(), recorder.clone())?;
    Ok(Session { producer: Box::new(producer), querier: Some(Box::new(querier)), observers })
}

fn open_ingest(
    endpoints: &Endpoints,
    ingest: &Ingest,
    recorder: &Arc<Recorder>,
    runtime: &Handle,
) -> anyhow::Result<Session> {
    let stream = unique_name("bench_ingest");
    // Created first, so its durability is the one asked for, not the server default. (Given
    // only a broker's address, the first publish creates it with the server's default.)
    if !endpoints.http.is_empty() {
        runtime.block_on(http::sql(
            &http::client()?,
            &endpoints.http,
            &format!("CREATE STREAM {stream} WITH (partitions = 1, durability = '{}')", ingest.durability),
        ))?;
    }
    let topic = format!("{stream}/events");
    let mut observers = Observers::default();
    for index in 0..ingest.subscribers {
        let connection = mqtt::Connection::open(&endpoints.mqtt, &format!("{stream}-sub-{index}"))?;
        let connection = connection.subscribe(&format!("{stream}/#"), ingest.qos)?;
        let (recorder, stop) = (recorder.clone(), observers.stop_flag());
        observers.add_thread(std::thread::Builder::new().name(format!("bench-sub-{index}")).spawn(move || {
            crate::priority::raise_this_thread();
            mqtt::subscriber(connection, index, recorder, stop)
        })?);
    }
    let mut connections = Vec::new();
    for index in 0..ingest.publishers {
        connections.push(mqtt::Connection::open(&endpoints.mqtt, &format!("{stream}-pub-{index}"))?);
    }
    let producer = mqtt::MqttProducer::new(connections, topic, ingest.qos, ingest.payload_bytes, recorder.clone())?;
    Ok(Session { producer: Box::new(producer), querier: None, observers })
}

/// How long a drain waits for what is still in flight when the schedule ends.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
