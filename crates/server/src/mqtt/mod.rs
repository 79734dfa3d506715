//! The MQTT broker (3.1.1 and 5.0 over TCP), on the same log and hub as HTTP.
//!
//! # Mapping
//!
//! A PUBLISH to `sensors/room-1/temp` appends a record to the stream named by the topic's first
//! level (`sensors`, created on first use when `auto_create` is on) with the topic as its
//! subject, the payload as its value and v5 properties as headers ([`headers`]). Records of one topic
//! stay in one partition (chosen by the topic's hash), so they keep their order. A QoS 1 or 2
//! publish is acknowledged only once its record is durable at the stream's durability; QoS 0
//! is written `async`.
//!
//! A SUBSCRIBE to `sensors/+/temp` follows the stream `sensors` through the hub, like an SSE
//! or WebSocket subscription to `/streams/sensors?subject=sensors/+/temp`: HTTP and MQTT
//! publishers and subscribers of one subject see the same records. A message is delivered at
//! the lower of the subscription's QoS and its publisher's (records published over HTTP count
//! as QoS 1). A filter whose first level is a wildcard (`#`, `+/temp`) follows every stream,
//! including those created after it subscribed.
//!
//! A retained PUBLISH is one record in its stream, flagged retained; the retained messages are
//! derived from those records and checkpointed ([`retained`]). A new subscription first gets
//! the retained messages its filter matches.
//!
//! Shared subscriptions (`$share/{group}/{filter}`) are one follower per group handing each
//! message to one member, round robin (a consumer group).
//!
//! Clients connect over TCP ([`serve_mqtt`]) or over WebSocket (`/mqtt` on the HTTP port,
//! subprotocol `mqtt`; [`Broker::serve_stream`]).
//!
//! A persistent session ([`sessions`]) keeps its subscriptions and, for each, the log positions
//! up to which the client acknowledged everything; on reconnect the subscriptions resume from
//! there, so the log is the queue of what came while the client was away.
//!
//! # Layout
//!
//! - `handshake`: CONNECT to CONNACK: the client id, the login (a password or a token,
//!   checked by the engine's access), taking a client id over, the session found.
//! - `connection`: one connection's loop, the I/O around `machine`: reads and decodes, carries
//!   out the machine's actions, writes its answers, keep-alive, the end of a connection.
//! - `machine`: the protocol state machine, with no I/O: inbound QoS flows and the receive
//!   maximum (`machine/inbound.rs`), outbound delivery and the in-flight window
//!   (`machine/outbound.rs`), its unit tests (`machine/tests.rs`).
//! - `publish`: storing what clients publish: batches per partition, acknowledgements in
//!   order once durable, table rows, the in-doubt lookup of a resent QoS 2 message, wills.
//! - `routing`: a topic's route in the engine, as MQTT's reason codes when refused, and the
//!   per-connection route cache.
//! - `subscriptions`: SUBSCRIBE and UNSUBSCRIBE, each opened through
//!   `Engine::open_subscription`; `followers`: the tasks that feed a subscription's messages
//!   to its connection; `shared`: shared groups.
//! - `sessions`: the persistent session store; `progress`: what a session's subscriptions
//!   delivered and had acknowledged (resume positions, DUP).
//! - `retained`: the retained-message store, and the one way a retained message is published.
//! - `proto`: the packets, over rmqtt-codec's 3.1.1 and 5.0 codecs; `frame`: what the codec is
//!   given; `headers`: a message's MQTT metadata as record headers.
//! - `telemetry`: the broker's metrics.

mod connection;
mod followers;
mod frame;
mod handshake;
pub mod headers;
mod machine;
mod progress;
pub mod proto;
mod publish;
pub mod retained;
mod routing;
pub mod sessions;
mod shared;
mod subscriptions;
pub mod telemetry;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use onehop_engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::linger::Lingering;

/// The time now, in ms since the Unix epoch: what message expiry and session expiry count in.
fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as i64)
}

/// Largest packet a client may send by default: a record of the default size and its topic.
pub const MAX_PACKET_BYTES_DEFAULT: u32 = 1024 * 1024;
/// Room a PUBLISH packet is given beyond its payload: fixed header, topic name (at most
/// 65 535 bytes by the protocol) and properties.
pub const PACKET_ENVELOPE_BYTES: usize = 64 * 1024;

/// The largest packet to accept when records may be `record_bytes_max` long: one record's
/// payload and the envelope around it, capped at what MQTT can advertise.
pub fn max_packet_bytes_for(record_bytes_max: usize) -> u32 {
    u32::try_from(record_bytes_max.saturating_add(PACKET_ENVELOPE_BYTES)).unwrap_or(u32::MAX)
}
/// QoS 1/2 publishes a client may have unacknowledged by default: enough to keep a fast
/// publisher's pipeline full across an fsync, few enough to bound what one connection queues.
pub const RECEIVE_MAX_DEFAULT: u16 = 1024;
/// Topic aliases a v5 client may define by default: each holds a topic for the connection's life.
pub const TOPIC_ALIAS_MAX_DEFAULT: u16 = 64;
/// Messages queued for one client by default before its subscriptions wait on it.
pub const OUTBOUND_QUEUE_DEFAULT: usize = 1024;
/// Time a new connection has by default to send CONNECT: a socket that says nothing is let go.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// MQTT connections open at once by default.
pub const CONNECTIONS_MAX_DEFAULT: usize = 20_000;
/// Most topic filters one connection may be subscribed to: each one follows its streams with
/// tasks and queues of its own, so one client must not hold thousands.
pub const SUBSCRIPTIONS_MAX_DEFAULT: usize = 1_000;
/// How long the listener waits after a failed accept (out of file descriptors, say) before it
/// tries again, rather than spinning on the error.
/// How long connections have to say goodbye when the server stops.
const SHUTDOWN_GOODBYE_TIME: Duration = Duration::from_secs(2);
/// How often the listener looks whether every connection has closed while the server stops.
const SHUTDOWN_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The broker's limits.
#[derive(Clone)]
pub struct MqttConfig {
    /// Largest packet accepted from a client (also advertised to v5 clients).
    pub max_packet_bytes: u32,
    /// QoS 1/2 publishes a client may have unacknowledged at once (v5 receive maximum).
    pub receive_max: u16,
    /// Topic aliases a v5 client may define.
    pub topic_alias_max: u16,
    /// Messages waiting to be written to one client; when it is full, the client's
    /// subscriptions wait, and those that fall behind the live feed read on from the log.
    pub outbound_queue: usize,
    /// Time a new connection has to send CONNECT.
    pub connect_timeout: Duration,
    /// Most MQTT connections at once.
    pub connections_max: usize,
    /// Most topic filters one connection may be subscribed to; one more is refused in its
    /// SUBACK (0x97 quota exceeded; 3.1.1: 0x80).
    pub subscriptions_max: usize,
}

impl Default for MqttConfig {
    fn default() -> Self {
        MqttConfig {
            max_packet_bytes: MAX_PACKET_BYTES_DEFAULT,
            receive_max: RECEIVE_MAX_DEFAULT,
            topic_alias_max: TOPIC_ALIAS_MAX_DEFAULT,
            outbound_queue: OUTBOUND_QUEUE_DEFAULT,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            subscriptions_max: SUBSCRIPTIONS_MAX_DEFAULT,
        }
    }
}

/// What every connection shares.
pub struct Broker {
    engine: Arc<Engine>,
    config: MqttConfig,
    /// Connected clients by id, with the signal that takes their session over.
    clients: handshake::Clients,
    next_connection: AtomicU64,
    shutdown: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    retained: Arc<retained::RetainedStore>,
    sessions: sessions::SessionStore,
    /// Shared subscription groups.
    groups: shared::Groups,
}

impl Broker {
    /// The broker for `engine`: opens (and replays) the retained messages.
    pub async fn open(engine: Arc<Engine>, config: MqttConfig) -> std::io::Result<Arc<Broker>> {
        let retained = {
            let engine = engine.clone();
            tokio::task::spawn_blocking(move || retained::RetainedStore::open(&engine))
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?
        };
        let sessions = {
            let engine = engine.clone();
            tokio::task::spawn_blocking(move || sessions::SessionStore::open(&engine))
                .await
                .map_err(std::io::Error::other)?
                .map_err(std::io::Error::other)?
        };
        let (stop, shutdown) = watch::channel(false);
        let retained = Arc::new(retained);
        tokio::spawn(retained.clone().keep_checkpointed(shutdown.clone()));
        Ok(Arc::new(Broker {
            sessions,
            engine,
            config,
            clients: handshake::Clients::default(),
            next_connection: AtomicU64::new(1),
            shutdown,
            stop,
            retained,
            groups: shared::Groups::default(),
        }))
    }

    /// Serves one client over a byte stream that is not a TCP connection of ours (MQTT over
    /// WebSocket).
    /// `certificate_user` is the user a verified client certificate names (TLS with client
    /// CAs), taken for a CONNECT without a password; `peer` is the client's address, which
    /// failed logins are counted against.
    pub async fn serve_stream<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static>(
        self: Arc<Self>,
        stream: S,
        certificate_user: crate::tls::CertificateUser,
        peer: Option<std::net::SocketAddr>,
    ) {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!("mqtt_connections").increment(1.0);
        connection::run(self, stream, id, certificate_user, peer).await;
        metrics::gauge!("mqtt_connections").decrement(1.0);
    }

    /// The largest packet a client may send.
    pub fn max_packet_bytes(&self) -> u32 {
        self.config.max_packet_bytes
    }

    /// Tells every connection the server is shutting down.
    pub fn shut_down(&self) {
        let _ = self.stop.send(true);
    }

    /// Whether the server is shutting down (`shut_down` was called).
    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }
}

/// Serves MQTT on `listener` until `shutdown` resolves; then every connection is told the
/// server is shutting down (v5) and closed.
pub async fn serve_mqtt(
    listener: TcpListener,
    broker: Arc<Broker>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_listener(listener, broker, None, shutdown).await
}

/// Serves MQTT over TLS (port 8883 by convention) on `listener`, as [`serve_mqtt`] does: each
/// connection's handshake first ([`crate::tls::accept`]), then the same broker.
pub async fn serve_mqtt_tls(
    listener: TcpListener,
    broker: Arc<Broker>,
    tls: crate::tls::Tls,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_listener(listener, broker, Some(tls), shutdown).await
}

async fn serve_listener(
    listener: TcpListener,
    broker: Arc<Broker>,
    tls: Option<crate::tls::Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let serving = broker.clone();
    let permits = crate::accept::accept_connections(
        listener,
        broker.config.connections_max,
        if tls.is_some() { "MQTT over TLS" } else { "MQTT" },
        "mqtt_connections_refused_total",
        shutdown,
        // The permit returns once the connection has closed and lingered (`crate::linger`).
        |stream, peer, permit| {
            let (broker, tls) = (serving.clone(), tls.clone());
            let stream = Lingering::new(stream, permit);
            drop(tokio::spawn(async move {
                match tls {
                    None => broker.serve_stream(stream, None, Some(peer)).await,
                    Some(tls) => {
                        let accepted =
                            crate::tls::accept(tls.acceptor(), stream, crate::tls::HANDSHAKE_TIMEOUT, "mqtt", peer);
                        if let Some((stream, certificate_user)) = accepted.await {
                            broker.serve_stream(stream, certificate_user, Some(peer)).await;
                        }
                    }
                }
            }));
        },
    )
    .await;
    broker.shut_down();
    // Give connections a moment to say goodbye.
    let deadline = tokio::time::Instant::now() + SHUTDOWN_GOODBYE_TIME;
    while permits.available_permits() < broker.config.connections_max && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(SHUTDOWN_POLL_INTERVAL).await;
    }
    Ok(())
}
