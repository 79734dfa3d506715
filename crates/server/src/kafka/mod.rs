//! The Kafka wire protocol (the broker side), on the same engine as HTTP and MQTT.
//!
//! # Mapping
//!
//! A Kafka topic is a onehop stream of the same name with the same partitions; a topic a
//! Kafka client creates (CreateTopics, or a Metadata request that may create) is a stream. A
//! record keeps its key, value, headers and timestamp, and its offset is the stream's offset:
//! what Kafka clients produce, HTTP, SSE, WebSocket and MQTT read, and the other way round.
//! A record's subject (an MQTT topic, an HTTP subject) travels as the header
//! [`SUBJECT_HEADER`]; a produced record carrying that header gets it as its subject, so SSE
//! and MQTT subscribers filter it like any other. The partition is the one the client chose
//! (Kafka's clients hash keys with murmur2; onehop's HTTP publishes with crc32c).
//!
//! `acks` maps to durability: `all` (-1) waits for the fdatasync of the batch holding the
//! write, `1` for the stream's own durability (fsync unless it was declared `async`), and `0`
//! is written `async` and answered with nothing, as Kafka does.
//!
//! Every request is answered in order; a connection handles one request at a time, as a Kafka
//! broker does. A frame larger than [`KafkaConfig::request_bytes_max`], an unknown API, an
//! unsupported version of anything but ApiVersions, or a body that does not decode closes that
//! connection and nothing else.
//!
//! # Layout
//!
//! - `connection`: one connection's loop: frames, request headers, answers in order.
//! - `versions`: the APIs and versions served, and ApiVersions.
//! - `topics`: Metadata, CreateTopics, DeleteTopics; `configs`: DescribeConfigs; `admin`:
//!   DeleteRecords, DescribeLogDirs.
//! - `produce`, `fetch`, `offsets` (ListOffsets): the data path; `producers`: idempotent
//!   producers' ids and sequences.
//! - `groups`: consumer groups (the classic protocol) and their committed offsets.
//! - `transactions`: transactional producers: a transaction's batches wait in a journal and
//!   reach their streams when it commits.
//! - `records`: Kafka record batches to and from the engine's records.
//! - `errors`: engine errors as Kafka's error codes.

mod admin;
pub mod batch;
mod configs;
mod connection;
mod errors;
mod fetch;
pub mod groups;
mod offsets;
mod produce;
pub mod producers;
pub mod records;
mod sasl;
mod topics;
pub mod transactions;
mod versions;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onehop_engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

pub use connection::{Decoded, decode_request};

/// The stream topic `name` is, once `who` may `privilege` it. A refusal is
/// TOPIC_AUTHORIZATION_FAILED whether the topic exists or not, so a client learns nothing of
/// topics it may not use.
pub(super) fn stream_for(
    shared: &Shared,
    who: &onehop_engine::Principal,
    privilege: onehop_engine::Privilege,
    name: &str,
) -> Result<Arc<onehop_engine::Stream>, onehop_engine::EngineError> {
    if let Some(view) = name.strip_prefix(onehop_engine::view::runtime::OUTPUT_PREFIX) {
        return view_changes_for(shared, who, privilege, name, view);
    }
    shared.engine.access().authorize(who, privilege, onehop_engine::ObjectKind::Stream, name)?;
    shared.engine.stream(name)
}

/// The change stream of view `view` (the topic `name`, `__view.{view}`): read by whoever may
/// READ the view, as its SSE and MQTT subscribers do; written only by the view
/// (INVALID_TOPIC_EXCEPTION, as Kafka answers a produce to its internal topics).
fn view_changes_for(
    shared: &Shared,
    who: &onehop_engine::Principal,
    privilege: onehop_engine::Privilege,
    name: &str,
    view: &str,
) -> Result<Arc<onehop_engine::Stream>, onehop_engine::EngineError> {
    shared.engine.access().authorize(who, onehop_engine::Privilege::Read, onehop_engine::ObjectKind::View, view)?;
    if privilege != onehop_engine::Privilege::Read {
        return Err(onehop_engine::EngineError::InvalidName {
            name: name.to_string(),
            reason: format!("the changes of view {view:?}, which only the view writes"),
        });
    }
    let view = shared
        .engine
        .view(view)
        .map_err(|_| onehop_engine::EngineError::UnknownStream { name: name.to_string(), auto_create: false })?;
    Ok(view.output().clone())
}

/// Whether `who` has any grant on topic `name`: what Metadata lists and DescribeConfigs
/// describes (Kafka's DESCRIBE).
pub(super) fn may_describe(shared: &Shared, who: &onehop_engine::Principal, name: &str) -> bool {
    match shared.engine.access().permissions(who) {
        Ok(None) => true,
        Ok(Some(permissions)) => permissions.sees(onehop_engine::ObjectKind::Stream, name),
        Err(_) => false,
    }
}
/// NOT_COORDINATOR on a cluster node that is not the cluster's leader: the leader coordinates
/// every group and transaction (FindCoordinator names it), so that the members of a group meet
/// on one node wherever they connected first.
///
/// On the leader: COORDINATOR_LOAD_IN_PROGRESS until it has read back the committed offsets
/// that every node applied, once it applied everything earlier leaders committed.
pub(super) fn not_coordinator(shared: &Shared) -> Option<i16> {
    let cluster = shared.cluster.get()?;
    if cluster.leader() != Some(shared.config.node_id) {
        return Some(kafka_protocol::ResponseError::NotCoordinator.code());
    }
    let loaded = cluster.settled_in(shared.groups.offsets.loaded_term());
    (!loaded).then(|| kafka_protocol::ResponseError::CoordinatorLoadInProgress.code())
}

/// NOT_COORDINATOR on a cluster node that is not the cluster's leader, which coordinates every
/// transaction; on the leader, COORDINATOR_LOAD_IN_PROGRESS until it has read the transactions
/// back for its term and taken them up ([`transactions::Transactions::reload`]).
pub(super) fn not_transaction_coordinator(shared: &Shared) -> Option<i16> {
    let cluster = shared.cluster.get()?;
    if cluster.leader() != Some(shared.config.node_id) {
        return Some(kafka_protocol::ResponseError::NotCoordinator.code());
    }
    let loaded = cluster.settled_in(shared.transactions.loaded_term());
    (!loaded).then(|| kafka_protocol::ResponseError::CoordinatorLoadInProgress.code())
}

/// Whether this node takes an idempotent producer's batch now: on a single node, yes
/// (`Ok(None)`); on a cluster node, as the leader of the term it read the producers' states
/// back for (`Ok(Some(term))`: the batch is written only if that term's leader prepares it).
/// Otherwise the refusal: it does not lead (NOT_LEADER_OR_FOLLOWER: the producer asks for
/// metadata again, which names the leader), or it leads but has not read the states back for
/// its term yet (NOT_LEADER_OR_FOLLOWER too: the producer retries after its backoff).
pub(super) fn producers_term(shared: &Shared) -> Result<Option<u64>, (i16, String)> {
    let Some(cluster) = shared.cluster.get() else { return Ok(None) };
    let code = kafka_protocol::ResponseError::NotLeaderOrFollower.code();
    let Some(term) = cluster.settled_term() else {
        return Err((code, "this node does not lead the cluster: idempotent batches go to the leader".into()));
    };
    if shared.producers.loaded_term() != Some(term) {
        return Err((code, "this node has just become the leader and is reading the producers' states back".into()));
    }
    Ok(Some(term))
}

/// A cluster node's view for its Kafka clients (docs/cluster.md): which node leads the cluster
/// (every partition's leader, and the coordinator of every group and transaction), and where
/// each node's Kafka listeners are.
pub trait KafkaCluster: Send + Sync + 'static {
    /// The node that leads, when one is known.
    fn leader(&self) -> Option<i32>;
    /// On the leader, its term once it has applied every command of earlier terms (so it
    /// holds all that earlier leaders committed); `None` before, and on other nodes.
    fn settled_term(&self) -> Option<u64>;
    /// Whether this node leads, settled, in the term `loaded` names: the term a store of its
    /// (offsets, producer states, transactions) was last read back for.
    fn settled_in(&self, loaded: Option<u64>) -> bool {
        self.settled_term().is_some_and(|term| loaded == Some(term))
    }
    /// Each node known to serve Kafka, with the host and port it tells clients of its listener
    /// over TLS (`tls`) or plain TCP.
    fn brokers(&self, tls: bool) -> Vec<(i32, String, u16)>;
}

/// The brokers a client of `endpoint` is told of, this one among them, and the one that leads
/// every partition (this one on a single node, or while a cluster knows no leader it can name).
pub(super) fn brokers(shared: &Shared, endpoint: &KafkaListener) -> (Vec<(i32, String, u16)>, i32) {
    let this = (shared.config.node_id, endpoint.advertised_host.clone(), endpoint.advertised_port);
    let Some(cluster) = shared.cluster.get() else { return (vec![this], shared.config.node_id) };
    let mut brokers: Vec<(i32, String, u16)> =
        cluster.brokers(endpoint.tls.is_some()).into_iter().filter(|(id, _, _)| *id != this.0).collect();
    brokers.push(this);
    brokers.sort();
    let leader = cluster
        .leader()
        .filter(|leader| brokers.iter().any(|(id, _, _)| id == leader))
        .unwrap_or(shared.config.node_id);
    (brokers, leader)
}

/// The error refusing `who` `privilege` on the consumer group `group`, if it is refused
/// (GROUP_AUTHORIZATION_FAILED, as Kafka's authorizer answers), or NOT_COORDINATOR (see
/// [`not_coordinator`]).
pub(super) fn group_refused(
    shared: &Shared,
    who: &onehop_engine::Principal,
    privilege: onehop_engine::Privilege,
    group: &str,
) -> Option<i16> {
    if let Some(code) = not_coordinator(shared) {
        return Some(code);
    }
    let refused = shared.engine.access().authorize(who, privilege, onehop_engine::ObjectKind::Group, group).is_err();
    refused.then(|| kafka_protocol::ResponseError::GroupAuthorizationFailed.code())
}

/// The error refusing `who` transactions as the transactional id `id`, if it is refused
/// (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): they take `WRITE` on it.
pub(super) fn transactional_id_refused(shared: &Shared, who: &onehop_engine::Principal, id: &str) -> Option<i16> {
    if let Some(code) = not_transaction_coordinator(shared) {
        return Some(code);
    }
    let access = shared.engine.access();
    let kind = onehop_engine::ObjectKind::TransactionalId;
    let refused = access.authorize(who, onehop_engine::Privilege::Write, kind, id).is_err();
    refused.then(|| kafka_protocol::ResponseError::TransactionalIdAuthorizationFailed.code())
}

pub use records::SUBJECT_HEADER;

/// The Kafka listener's settings.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// The node id this server answers as (in Metadata, as every partition's leader).
    pub node_id: i32,
    /// Most open Kafka connections per listener; more are closed at once.
    pub connections_max: usize,
    /// Largest request frame accepted; a larger one closes its connection.
    pub request_bytes_max: usize,
    /// Bytes of request frames all connections may hold at once (read and not yet answered);
    /// a frame waits for room, so many large or slow requests cannot exhaust memory.
    pub request_bytes_in_flight_max: usize,
    /// A request frame that has begun must keep arriving: a read that brings nothing for this
    /// long closes the connection.
    pub frame_read_timeout: Duration,
    /// A connection with no request for this long is closed (Kafka's
    /// `connections.max.idle.ms`, 10 minutes there).
    pub idle_timeout: Duration,
    /// Once users exist, a connection that has not logged in this long after it opened is
    /// closed: sockets that never authenticate cannot hold every connection slot.
    pub authentication_timeout: Duration,
    /// Longest a Fetch waits for data, whatever `max_wait_ms` it asks.
    pub fetch_wait_max: Duration,
}

/// One address the Kafka protocol is served on, as an entry of Kafka's `listeners` with its
/// `advertised.listeners` one: plain TCP or TLS, and where clients that reach it are told the
/// broker is. Every listener serves the same server.
#[derive(Clone, Debug)]
pub struct KafkaListener {
    /// The host (a name or an address) and port clients of this listener are told to connect
    /// to (Metadata's broker list, FindCoordinator's answer): its own address unless they reach
    /// it another way (a proxy, a container's published port, a DNS name).
    pub advertised_host: String,
    pub advertised_port: u16,
    /// Speak TLS (Kafka's `SSL`, and `SASL_SSL` with SASL): each connection's handshake first.
    pub tls: Option<crate::tls::Tls>,
}

impl KafkaListener {
    /// A plain listener, advertised at its own address.
    pub fn at(address: SocketAddr) -> KafkaListener {
        KafkaListener { advertised_host: address.ip().to_string(), advertised_port: address.port(), tls: None }
    }

    /// The protocol name clients set for it without SASL (`PLAINTEXT` or `SSL`).
    pub fn security_protocol(&self) -> &'static str {
        if self.tls.is_some() { "SSL" } else { "PLAINTEXT" }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig::new()
    }
}

impl KafkaConfig {
    /// The defaults, answering as node 0.
    pub fn new() -> KafkaConfig {
        KafkaConfig {
            node_id: 0,
            connections_max: 1024,
            request_bytes_max: 100 << 20,
            request_bytes_in_flight_max: 256 << 20,
            frame_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            authentication_timeout: Duration::from_secs(10),
            fetch_wait_max: Duration::from_secs(30),
        }
    }
}

/// Room in a request frame around its record batches: request and topic headers, names.
pub const KAFKA_REQUEST_ENVELOPE_BYTES: usize = 1 << 20;

/// What every connection shares.
pub(super) struct Shared {
    pub engine: Arc<Engine>,
    pub config: KafkaConfig,
    pub producers: Arc<producers::Producers>,
    pub groups: Arc<groups::Coordinator>,
    pub transactions: Arc<transactions::Transactions>,
    /// The request bytes in flight, as permits of `request_bytes_in_flight_max`.
    pub request_bytes: Arc<Semaphore>,
    pub stop: watch::Receiver<bool>,
    /// Set on a cluster node.
    pub cluster: std::sync::OnceLock<Arc<dyn KafkaCluster>>,
}

/// The Kafka front end, opened (its producer states restored) and ready to serve.
pub struct KafkaServer {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
}

impl KafkaServer {
    /// Restores the idempotent producers' states and the transactions, finishing the commits
    /// a stop interrupted; a failure stops the start.
    pub async fn open(engine: Arc<Engine>, config: KafkaConfig) -> Result<KafkaServer, onehop_engine::EngineError> {
        let producers = Arc::new(producers::Producers::open(&engine)?);
        let groups = Arc::new(groups::Coordinator::new(groups::committed::CommittedOffsets::open(&engine)?));
        let transactions = Arc::new(transactions::Transactions::open(&engine, producers.clone(), groups.clone())?);
        if !engine.is_replicated() {
            // A cluster node takes the transactions up when it leads (Transactions::reload).
            transactions.recover().await?;
        }
        let (stop, stopped) = watch::channel(false);
        let request_bytes = Arc::new(Semaphore::new(config.request_bytes_in_flight_max));
        let shared = Shared {
            engine,
            config,
            producers,
            groups,
            transactions,
            request_bytes,
            stop: stopped,
            cluster: Default::default(),
        };
        Ok(KafkaServer { shared: Arc::new(shared), stop })
    }

    /// Makes this the Kafka front end of a cluster node: clients are told of every node, and
    /// of the leader as every partition's leader and every group's coordinator.
    pub fn set_cluster(&self, cluster: Arc<dyn KafkaCluster>) {
        let _ = self.shared.cluster.set(cluster);
    }

    /// Serves the Kafka protocol on each of `listeners` until `shutdown` resolves; then open
    /// connections are told to finish (a Fetch waiting for data answers at once) and closed,
    /// and the producer states are checkpointed once more.
    pub async fn serve(
        self,
        listeners: Vec<(TcpListener, KafkaListener)>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let shared = self.shared;
        let keeper = shared.clone();
        // A dropped topic's committed offsets go with it, whichever way it was dropped (SQL,
        // DeleteTopics, another node of the cluster).
        let forgetting = {
            let (groups, engine) = (shared.groups.clone(), shared.engine.clone());
            let mut stop = shared.stop.clone();
            tokio::spawn(async move {
                let mut changes = engine.watch_streams();
                let mut seen = std::collections::HashMap::new();
                loop {
                    if let Err(error) = groups.offsets.forget_dropped_topics(&mut seen).await {
                        tracing::warn!(%error, "could not delete the committed offsets of a dropped topic; trying again");
                    }
                    tokio::select! {
                        changed = changes.changed() => if changed.is_err() { return },
                        // A node that starts to coordinate looks again within a second.
                        () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = stop.wait_for(|stop| *stop) => return,
                    }
                }
            })
        };
        let ours = move || match keeper.cluster.get() {
            None => true,
            Some(cluster) => cluster.settled_in(keeper.producers.loaded_term()),
        };
        let checkpoints = tokio::spawn(shared.producers.clone().keep_checkpointed(shared.stop.clone(), ours));
        let groups = shared.groups.clone();
        let producers = shared.producers.clone();
        let transactions = shared.transactions.clone();
        let mut stopped = shared.stop.clone();
        let cluster = shared.clone();
        let cluster = move || cluster.cluster.get().cloned();
        let timeouts = tokio::spawn(async move {
            let mut tick = tokio::time::interval(groups::TICK);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        if let Some(term) = cluster().and_then(|cluster| cluster.settled_term())
                            && groups.offsets.loaded_term() != Some(term)
                        {
                            let reloading = groups.clone();
                            match tokio::task::spawn_blocking(move || reloading.offsets.reload(term)).await {
                                Ok(Ok(())) => {}
                                Ok(Err(error)) => tracing::error!(%error, "cannot read the committed Kafka offsets back"),
                                Err(error) => tracing::error!(%error, "reading the committed Kafka offsets back failed"),
                            }
                        }
                        if let Some(term) = cluster().and_then(|cluster| cluster.settled_term())
                            && producers.loaded_term() != Some(term)
                        {
                            let reloading = producers.clone();
                            match tokio::task::spawn_blocking(move || reloading.reload(term)).await {
                                Ok(Ok(())) => {}
                                Ok(Err(error)) => tracing::error!(%error, "cannot read the Kafka producer states back"),
                                Err(error) => tracing::error!(%error, "reading the Kafka producer states back failed"),
                            }
                        }
                        // The transactions after the producers: a commit taken up skips the
                        // batches a stream holds, which the producers' states tell.
                        if let Some(term) = cluster().and_then(|cluster| cluster.settled_term())
                            && producers.loaded_term() == Some(term)
                            && transactions.loaded_term() != Some(term)
                            && let Err(error) = transactions.reload(term).await
                        {
                            tracing::warn!(%error, term, "the Kafka transactions could not be taken up yet; trying again");
                        }
                        // A node that coordinated the groups before keeps their members until
                        // they time out, and stores nothing of them: the leader coordinates.
                        let storing = cluster().is_none_or(|cluster| cluster.settled_in(groups.offsets.loaded_term()));
                        for (group, stored) in groups.tick() {
                            if storing && let Err(error) = groups.offsets.store_group(&group, stored.as_ref()).await {
                                tracing::warn!(%group, %error, "a Kafka group's membership could not be stored");
                            }
                        }
                        let coordinating = cluster().is_none_or(|cluster| cluster.settled_in(transactions.loaded_term()));
                        if coordinating {
                            transactions.expire().await;
                        }
                    }
                    _ = stopped.changed() => return,
                }
            }
        });
        // One signal ends every listener's accept loop.
        let (ending, ended) = watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = ending.send(true);
        });
        let mut accepting = Vec::with_capacity(listeners.len());
        for (listener, endpoint) in listeners {
            let serving = shared.clone();
            let endpoint = Arc::new(endpoint);
            let mut ended = ended.clone();
            let until_ended = async move {
                let _ = ended.wait_for(|ended| *ended).await;
            };
            let label = if endpoint.tls.is_some() { "Kafka over TLS" } else { "Kafka" };
            let connections_max = shared.config.connections_max;
            accepting.push(tokio::spawn(crate::accept::accept_connections(
                listener,
                connections_max,
                label,
                CONNECTIONS_REFUSED,
                until_ended,
                move |stream, peer, permit| {
                    let (shared, endpoint) = (serving.clone(), endpoint.clone());
                    tokio::spawn(async move {
                        metrics::gauge!(CONNECTIONS).increment(1.0);
                        match endpoint.tls.clone() {
                            None => connection::serve(stream, peer, &shared, endpoint, None).await,
                            Some(tls) => {
                                let accepted = crate::tls::accept(
                                    tls.acceptor(),
                                    stream,
                                    crate::tls::HANDSHAKE_TIMEOUT,
                                    "kafka",
                                    peer,
                                );
                                if let Some((stream, certificate_user)) = accepted.await {
                                    connection::serve(stream, peer, &shared, endpoint, certificate_user).await;
                                }
                            }
                        }
                        metrics::gauge!(CONNECTIONS).decrement(1.0);
                        drop(permit);
                    });
                },
            )));
        }
        for accept in accepting {
            let _ = accept.await;
        }
        let _ = self.stop.send(true);
        let _ = checkpoints.await;
        let _ = timeouts.await;
        let _ = forgetting.await;
        Ok(())
    }
}

/// Open Kafka connections.
pub const CONNECTIONS: &str = "kafka_connections";
/// Connections closed at once because `connections_max` were open.
pub const CONNECTIONS_REFUSED: &str = "kafka_connections_refused_total";
/// Connections closed for a frame over the limit, an unknown API or version, or a body that
/// does not decode.
pub const PROTOCOL_ERRORS: &str = "kafka_protocol_errors_total";
/// Connections closed because they did not log in within `authentication_timeout`.
pub const AUTHENTICATION_TIMEOUTS: &str = "kafka_authentication_timeouts_total";
/// Requests answered, labelled by API name.
pub const REQUESTS: &str = "kafka_requests_total";
/// Records appended by Produce requests.
pub const RECORDS_PRODUCED: &str = "kafka_records_produced_total";
/// Records sent in Fetch responses.
pub const RECORDS_FETCHED: &str = "kafka_records_fetched_total";
/// Connections that logged in again before their token expired (KIP-368).
pub const REAUTHENTICATIONS: &str = "kafka_reauthentications_total";

/// Describes the Kafka listener's metrics and exports the unlabelled ones at 0.
pub fn describe_metrics() {
    metrics::describe_gauge!(CONNECTIONS, "Open Kafka connections.");
    metrics::describe_counter!(
        CONNECTIONS_REFUSED,
        "Kafka connections closed at once because kafka connections_max were open."
    );
    metrics::describe_counter!(
        PROTOCOL_ERRORS,
        "Kafka connections closed for an oversized frame, an unknown API or version, or a body that does not decode."
    );
    metrics::describe_counter!(
        AUTHENTICATION_TIMEOUTS,
        "Kafka connections closed because they did not log in with SASL within kafka_authentication_timeout_s."
    );
    metrics::describe_counter!(REQUESTS, "Kafka requests answered, by API.");
    metrics::describe_counter!(RECORDS_PRODUCED, "Records appended by Kafka Produce requests.");
    metrics::describe_counter!(RECORDS_FETCHED, "Records sent in Kafka Fetch responses.");
    metrics::describe_counter!(
        REAUTHENTICATIONS,
        "Kafka connections that logged in again with SASL before their token expired (KIP-368)."
    );
    metrics::describe_counter!(
        producers::DUPLICATES,
        "Batches an idempotent Kafka producer sent again, answered with their first offsets and not stored twice."
    );
    metrics::describe_counter!(transactions::COMMITTED, "Kafka transactions committed.");
    metrics::describe_counter!(
        transactions::ABORTED,
        "Kafka transactions aborted, by their producer, by a new producer with the same transactional id, or by their timeout."
    );
    metrics::describe_gauge!(
        transactions::WAITING,
        "Batches of open Kafka transactions, waiting in the journal for their transaction to end."
    );
    metrics::gauge!(CONNECTIONS).set(0.0);
    metrics::gauge!(transactions::WAITING).set(0.0);
    for counter in [
        CONNECTIONS_REFUSED,
        PROTOCOL_ERRORS,
        AUTHENTICATION_TIMEOUTS,
        RECORDS_PRODUCED,
        RECORDS_FETCHED,
        REAUTHENTICATIONS,
        producers::DUPLICATES,
        transactions::COMMITTED,
        transactions::ABORTED,
    ] {
        metrics::counter!(counter).absolute(0);
    }
}
