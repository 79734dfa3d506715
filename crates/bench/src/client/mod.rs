//! The client side of onehop's protocols, as the workloads use them: writes over HTTP,
//! subscriptions over SSE or WebSocket, point queries over HTTP keep-alive, MQTT publishers and
//! subscribers. The onehop target and the echo target both run this code, so the echo
//! measures exactly what the harness adds.
//!
//! Against a server with access on, every measured client presents credentials on every
//! request and connection (a bearer token over HTTP, SSE and WebSocket; a user name and
//! password over MQTT), and against one with TLS, speaks TLS on keep-alive connections whose
//! handshakes are done before the schedule starts (`link`, `tls`). Definitions are made over
//! plain HTTP, as the administrator: they are not measured.

pub mod http;
pub mod http1;
pub mod link;
pub mod mqtt;
pub mod pg;
pub mod rxstamp;
pub mod sse;
pub mod tls;
pub mod ws;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::runtime::Handle;

use crate::plan::{Fanout, Ingest, Plan, Protocol, ViewPlan};
use crate::recorder::Recorder;
use crate::schedule::Producer;
use crate::target::{Observers, Session};

/// Where a server listens, and what its clients must present and speak.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// `http://host:port`: definitions and the target's `/metrics` (never measured), and the
    /// measured HTTP, SSE and WebSocket clients unless `security.tls` says otherwise.
    pub http: String,
    /// `host:port`
    pub mqtt: String,
    pub security: Security,
    /// Where the measured publishers go instead, in turn (a cluster's nodes, this one among
    /// them); empty: here. Subscribers and definitions stay here.
    pub publish_to: Vec<Endpoints>,
}

/// Credentials and TLS, for a server that asks for them; the default is neither.
#[derive(Clone, Debug, Default)]
pub struct Security {
    /// The `Authorization` header's value for definitions and `/metrics` (an administrator's).
    pub setup_authorization: Option<String>,
    /// What every measured client presents.
    pub login: Option<Login>,
    /// The TLS listeners the measured clients use instead of the plain ones.
    pub tls: Option<TlsListeners>,
}

/// A measured client's credentials.
#[derive(Clone, Debug)]
pub struct Login {
    /// A bearer token, sent as `Authorization: Bearer` by HTTP, SSE and WebSocket clients.
    pub token: String,
    /// The user name and password of MQTT's CONNECT.
    pub user: String,
    pub password: String,
}

#[derive(Clone, Debug)]
pub struct TlsListeners {
    /// `host:port` of HTTPS.
    pub https: String,
    /// `host:port` of MQTT over TLS.
    pub mqtts: String,
    pub client: tls::TlsClient,
}

impl Endpoints {
    /// A server with neither access nor TLS.
    pub fn plain(http: String, mqtt: String) -> Endpoints {
        Endpoints { http, mqtt, security: Security::default(), publish_to: Vec::new() }
    }

    /// Where publishers go: each of [`Endpoints::publish_to`] in turn, or here.
    fn publishers(&self) -> Vec<&Endpoints> {
        if self.publish_to.is_empty() { vec![self] } else { self.publish_to.iter().collect() }
    }

    /// How measured HTTP, SSE and WebSocket clients connect.
    pub fn http_dial(&self) -> link::Dial {
        match &self.security.tls {
            Some(tls) => link::Dial { address: tls.https.clone(), tls: Some(tls.client.clone()) },
            None => link::Dial::plain(&http::address_of(&self.http)),
        }
    }

    /// How measured MQTT clients connect.
    pub fn mqtt_dial(&self) -> link::Dial {
        match &self.security.tls {
            Some(tls) => link::Dial { address: tls.mqtts.clone(), tls: Some(tls.client.clone()) },
            None => link::Dial::plain(&self.mqtt),
        }
    }

    /// The `Authorization` header's value of measured HTTP, SSE and WebSocket requests.
    pub fn authorization(&self) -> Option<String> {
        self.security.login.as_ref().map(|login| format!("Bearer {}", login.token))
    }

    /// Runs SQL definitions on the server (not measured).
    pub async fn sql(&self, client: &reqwest::Client, statements: &str) -> anyhow::Result<serde_json::Value> {
        http::sql(client, &self.http, self.security.setup_authorization.as_deref(), statements).await
    }
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
    runtime.block_on(endpoints.sql(
        &producer_client,
        &format!("CREATE STREAM {stream} WITH (partitions = 1, durability = '{}')", fanout.durability),
    ))?;
    let mut observers = Observers::default();
    for (observer, filter) in fanout.routing.subscriptions() {
        let task = match fanout.protocol {
            Protocol::Sse => {
                let source = sse::Source::filtered(endpoints, &format!("/streams/{stream}"), &filter);
                let subscription = runtime.block_on(source.subscribe()).context("subscribing over SSE")?;
                let (recorder, stop) = (recorder.clone(), observers.stop_signal());
                runtime.spawn(sse::fanout_observer(source, subscription, observer, recorder, stop))
            }
            Protocol::Ws => {
                let socket = runtime
                    .block_on(ws::subscribe(endpoints, &format!("/streams/{stream}"), &filter))
                    .context("subscribing over WebSocket")?;
                runtime.spawn(ws::fanout_observer(socket, observer, recorder.clone(), observers.stop_signal()))
            }
        };
        observers.add_task(task);
    }
    let mut writers: Vec<Box<dyn Producer>> = Vec::new();
    for publishing in endpoints.publishers() {
        let path = format!("/streams/{stream}");
        writers.push(Box::new(http::HttpWriter::events(publishing, path, plan.clone(), recorder.clone())?));
    }
    Ok(Session { producer: Box::new(InTurn { producers: writers, next: 0 }), querier: None, observers })
}

/// Hands each send to the next of its producers in turn: publishers spread over a cluster's
/// nodes, one event (or batch of events due together) to each.
struct InTurn {
    producers: Vec<Box<dyn Producer>>,
    next: usize,
}

impl Producer for InTurn {
    fn send(&mut self, seqs: std::ops::Range<u64>) {
        self.producers[self.next].send(seqs);
        self.next = (self.next + 1) % self.producers.len();
    }

    fn prepare(&mut self, seq: u64) {
        // The producer whose turn it is sends it.
        self.producers[self.next].prepare(seq);
    }
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
    runtime.block_on(endpoints.sql(&producer_client, &definitions))?;
    let mut observers = Observers::default();
    // One subscription to the whole view: every key's changes and closing rows.
    let view_source = sse::Source::new(endpoints, format!("/views/{name}"));
    let subscription = runtime.block_on(view_source.subscribe()).context("subscribing to the view")?;
    let (view_recorder, stop) = (recorder.clone(), observers.stop_signal());
    observers.add_task(runtime.spawn(sse::view_observer(view_source, subscription, view_recorder, stop)));
    let producer = http::HttpWriter::events(endpoints, format!("/streams/{source}"), plan, recorder.clone())?;
    // Point queries on connections of their own, kept alive between queries.
    let querier = http::HttpWriter::queries(endpoints, format!("/views/{name}"), view.clone(), recorder.clone())?;
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
        runtime.block_on(endpoints.sql(
            &http::client()?,
            &format!("CREATE STREAM {stream} WITH (partitions = 1, durability = '{}')", ingest.durability),
        ))?;
    }
    let topic = format!("{stream}/events");
    let (dial, login) = (endpoints.mqtt_dial(), endpoints.security.login.as_ref());
    let mut observers = Observers::default();
    for index in 0..ingest.subscribers {
        let connection = mqtt::Connection::open_with(&dial, &format!("{stream}-sub-{index}"), login)?;
        let connection = connection.subscribe(&format!("{stream}/#"), ingest.qos)?;
        let (recorder, stop) = (recorder.clone(), observers.stop_flag());
        observers.add_thread(std::thread::Builder::new().name(format!("bench-sub-{index}")).spawn(move || {
            crate::priority::raise_this_thread();
            mqtt::subscriber(connection, index, recorder, stop)
        })?);
    }
    // Each publisher on every node publishers go to: events go to the connections in turn.
    let mut connections = Vec::new();
    for index in 0..ingest.publishers {
        for (node, publishing) in endpoints.publishers().into_iter().enumerate() {
            let (dial, login) = (publishing.mqtt_dial(), publishing.security.login.as_ref());
            connections.push(mqtt::Connection::open_with(&dial, &format!("{stream}-pub-{index}-{node}"), login)?);
        }
    }
    let producer = mqtt::MqttProducer::new(connections, topic, ingest.qos, ingest.payload_bytes, recorder.clone())?;
    Ok(Session { producer: Box::new(producer), querier: None, observers })
}

/// How long a drain waits for what is still in flight when the schedule ends.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
