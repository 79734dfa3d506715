//! One MQTT connection: the handshake, then one task that reads packets, writes answers and
//! messages, and enforces keep-alive. Publishes are queued to the log in the order they arrive
//! (so one topic's messages keep their order) and acknowledged from small tasks once durable;
//! each subscription is a task that follows the hub and feeds the connection's outbound queue.

use std::collections::HashMap;
use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use onehop_engine::hub::Event;
use onehop_engine::{Durability, NewRecord, Text};
use onehop_engine::{EngineError, Position, Precondition, Table, Write};
use rmqtt_codec::types::{Publish, QoS};
use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio::time::Instant;

use super::Broker;
use super::handshake::{self, Accepted};
use super::headers::{
    CLIENT_HEADER, EXPIRES_HEADER, MessageProperties, PACKET_HEADER, QOS_HEADER, RETAIN_HEADER, message_headers,
};
use super::progress::{Acked, SharedProgress};
use super::proto::{
    Codec, Goodbye, Inbound, Refusal, SubscribeFilter, Version, Will, goodbye_for, qos_of_rank, qos_rank,
};
use super::quota::InboundQuota;
use super::routing::{self, RouteCache};
use super::sessions::{StoredRelease, StoredSession};
use super::subscriptions::Subscriptions;
use onehop_engine::route::Route;

/// How long writing to a client may take before it is given up on: a client that reads
/// nothing for this long holds a connection and its queues for nothing.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a goodbye (a v5 DISCONNECT) may take to write: it is a courtesy, and the
/// connection's end (its will, its session's release) waits for it.
const GOODBYE_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often a persistent session's positions are written while acknowledgements move them:
/// after a crash, at most this much is delivered again, for one small write a second.
const SESSION_WRITE_INTERVAL: Duration = Duration::from_secs(1);
/// The keep-alive a client is held to, in thousandths of what it announced: MQTT gives it one
/// and a half (3.1.2.10, 5.0 3.1.2.10).
const KEEP_ALIVE_GRACE_PERMILLE: u64 = 1500;
/// A read buffer's and the answer buffer's first size: a few small packets; each grows to
/// what the connection sends.
const BUFFER_BYTES_INITIAL: usize = 4096;
/// Answers and messages gathered before they are written: one write for many small packets,
/// and a bound on what one turn of the loop holds.
const WRITE_BATCH_BYTES: usize = 64 * 1024;
/// Acknowledgement groups that may wait to be handed over beyond the receive maximum: refusals
/// and resent QoS 2 publishes take no receive-maximum slot, and their tasks should not wait.
const ACK_GROUPS_SPARE: usize = 16;
/// How much of the log one step of looking for a resent QoS 2 message reads: a bound on the
/// memory of a look that runs only after a reconnect.
const LOOKUP_RECORDS_PER_READ: usize = 1024;
const LOOKUP_BYTES_PER_READ: usize = 4 * 1024 * 1024;

use super::now_ms;

/// Acknowledgements ready to send (in order), from the task that waited for their records.
struct Ack {
    packets: Vec<(QoS, NonZeroU16)>,
    outcome: Result<(), (Refusal, String)>,
}

/// Publishes decoded from one read, for one partition, queued to the log as one append.
struct Batch {
    route: Route,
    durability: Option<Durability>,
    records: Vec<NewRecord>,
    bytes: usize,
    acks: Vec<(QoS, NonZeroU16)>,
    permits: Vec<OwnedSemaphorePermit>,
}

/// A batch is queued once it holds this many records or bytes: large enough that one append
/// (and one fsync) carries a burst, small enough that the first acknowledgement is not held
/// back for long.
const BATCH_RECORDS_MAX: usize = 1024;
const BATCH_BYTES_MAX: usize = 1024 * 1024;

/// What subscription tasks hand the connection.
pub(super) enum Outbound {
    Message {
        event: Arc<Event>,
        qos: QoS,
        subscription_id: Option<NonZeroU32>,
        /// Sent with the retain flag: a retained message at subscribe time.
        retain: bool,
        /// v5: a live message keeps the retain flag it was published with.
        retain_as_published: bool,
        /// The subscription's progress, to mark this message acknowledged (live messages of a
        /// connection's own subscriptions; not retained ones, not shared groups').
        progress: Option<SharedProgress>,
        /// Sent before, to a previous connection of this session.
        dup: bool,
    },
    /// A subscription could not carry on (its stream's history is gone past where it was).
    CutOff,
}

/// Where an outgoing QoS 1/2 message stands.
#[derive(Clone, Copy, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
enum Inflight {
    AwaitingAck,
    AwaitingRec,
    AwaitingComp,
}

/// Why the connection ends.
struct Close {
    /// Publish the will (the connection ended other than by a normal DISCONNECT).
    will: bool,
    /// What a v5 client is told, if anything.
    goodbye: Option<(Goodbye, String)>,
}

impl Close {
    fn abnormal(goodbye: Goodbye, reason: impl Into<String>) -> Close {
        Close { will: true, goodbye: Some((goodbye, reason.into())) }
    }
}

/// Publishes a will message (after the connection ended abnormally), after `delay` unless the
/// client is back by then.
fn publish_will(broker: Arc<Broker>, will: Will, client_id: String, delay: Duration) {
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
            if broker.clients.is_connected(&client_id) {
                return;
            }
        }
        let topic = Text::from(will.topic.as_str());
        let headers = message_headers(will.qos, will.properties, will.retain, now_ms());
        let record = match routing::route(&broker.engine, &topic).await {
            Ok(route) => routing::record(&route, &topic, will.payload, headers).map(|record| (route, record)),
            Err(refused) => Err(refused),
        };
        let (route, record) = match record {
            Ok(routed) => routed,
            Err((_, reason)) => {
                tracing::debug!(%topic, reason, "will message dropped");
                return;
            }
        };
        let durability = routing::durability(will.qos);
        let stored = if will.retain {
            match broker.retained.publish(&route, record, durability).await {
                Ok(stored) => stored.await,
                Err(error) => Err(error.to_string()),
            }
        } else {
            match route.enqueue(std::slice::from_ref(&record), durability).await {
                Ok(queued) => queued.await.map(|_| ()).map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            }
        };
        if let Err(error) = stored {
            tracing::warn!(%topic, error, "the will message could not be stored");
        }
    });
}

/// Serves one client over `stream` (a TCP connection, or a WebSocket's byte stream) until it
/// goes away.
pub(super) async fn run<S: AsyncRead + AsyncWrite + Send + 'static>(broker: Arc<Broker>, stream: S, connection: u64) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(BUFFER_BYTES_INITIAL);
    let Some(accepted) = handshake::accept(&broker, &mut reader, &mut writer, &mut buf, connection).await else {
        return;
    };
    let Accepted { codec, connect, client_id, stored, kicked, owner } = accepted;
    let out = BytesMut::with_capacity(BUFFER_BYTES_INITIAL);
    let (acks_tx, acks_rx) = mpsc::channel(usize::from(broker.config.receive_max) + ACK_GROUPS_SPARE);
    let (deliveries_tx, deliveries_rx) = mpsc::channel(broker.config.outbound_queue);
    let mut session = Session {
        broker: broker.clone(),
        codec,
        out,
        client_id: client_id.clone(),
        client_id_bytes: Bytes::from(client_id.clone()),
        will: connect.will.clone(),
        aliases: HashMap::new(),
        routes: RouteCache::default(),
        awaiting_release: HashMap::new(),
        in_doubt: stored
            .iter()
            .flat_map(|stored| &stored.awaiting_release)
            .filter_map(|release| Some((NonZeroU16::new(release.packet_id)?, release.clone())))
            .collect(),
        awaiting_persist: false,
        pubrel_due: Vec::new(),
        inflight: HashMap::new(),
        next_packet_id: 1,
        client_receive_max: usize::from(connect.receive_max.max(1)),
        subscriptions: Subscriptions::new(broker.clone(), &client_id, deliveries_tx),
        acks_tx,
        quota: InboundQuota::new(broker.config.receive_max),
        persistent: connect.session_expiry_secs > 0,
        session_expiry_secs: connect.session_expiry_secs,
        session_written: Instant::now(),
        end_session: false,
        batch: None,
        acks_done: None,
        counters: Counters::new(),
    };
    if let Some(stored) = &stored {
        // The subscriptions of the session, each from where it was acknowledged up to; the
        // messages published meanwhile are in the log and come now.
        for subscription in &stored.subscriptions {
            let request = SubscribeFilter {
                filter: subscription.filter.clone(),
                qos: qos_of_rank(subscription.qos),
                retain_handling: 2,
                retain_as_published: subscription.retain_as_published,
                no_local: subscription.no_local,
            };
            let id = subscription.subscription_id.and_then(NonZeroU32::new);
            let persistent = session.persistent;
            if let Err(refusal) = session.subscriptions.subscribe(request, id, persistent, Some(subscription)).await {
                tracing::warn!(
                    client_id,
                    filter = subscription.filter,
                    ?refusal,
                    "a stored subscription could not resume"
                );
            }
        }
    }
    if let Some(stored) = &stored {
        // QoS 2 messages the client had PUBREC'd: their PUBRELs come again.
        for packet_id in stored.releasing.iter().filter_map(|&id| NonZeroU16::new(id)) {
            session.inflight.insert(packet_id, (Inflight::AwaitingComp, None));
            if session.encoded(|codec, out| codec.publish_ack2(true, packet_id, out)).is_some() {
                break;
            }
        }
        if !session.out.is_empty() {
            if writer.write_all(&session.out).await.is_err() {
                tracing::debug!(client_id, "the connection ended while its session was restored");
            }
            session.out.clear();
        }
    }
    if session.persistent {
        session.persist(false).await;
    } else if stored.is_some() {
        let _ = broker.sessions.put(&client_id, None).await;
    }
    let keep_alive = (connect.keep_alive_secs > 0)
        .then(|| Duration::from_millis(u64::from(connect.keep_alive_secs) * KEEP_ALIVE_GRACE_PERMILLE));
    let mut acks_rx = acks_rx;
    let close = session.serve(&mut reader, &mut writer, buf, keep_alive, kicked, &mut acks_rx, deliveries_rx).await;
    if session.persistent {
        // What the session keeps of incoming QoS 2 messages must be what was stored: wait for
        // the writes still under way, and forget the ones that failed.
        if let Some(done) = session.acks_done.take() {
            let _ = done.await;
        }
        while let Ok(ack) = acks_rx.try_recv() {
            if ack.outcome.is_err() {
                for (_, packet_id) in &ack.packets {
                    session.awaiting_release.remove(packet_id);
                }
            }
        }
        session.persist(true).await;
    } else if session.end_session {
        let _ = broker.sessions.put(&client_id, None).await;
    }
    owner.release(&broker, &client_id);

    // Dropping the handles stops the followers and leaves shared groups.
    session.subscriptions.clear();
    if let Some((goodbye, reason)) = &close.goodbye {
        session.out.clear();
        if session.codec.disconnect(*goodbye, reason, &mut session.out).is_ok() && !session.out.is_empty() {
            let _ = tokio::time::timeout(GOODBYE_WRITE_TIMEOUT, writer.write_all(&session.out)).await;
        }
        tracing::debug!(client_id, ?goodbye, reason, "MQTT connection closed by the server");
    }
    let _ = writer.shutdown().await;
    broker.clients.unregister(&client_id, connection);
    if close.will
        && let Some(will) = session.will.take()
    {
        // Sent when the will delay is over or the session ends, whichever comes first.
        let session_left = if session.persistent { session.session_expiry_secs } else { 0 };
        let delay = Duration::from_secs(u64::from(will.delay_secs.min(session_left)));
        publish_will(broker, will, client_id, delay);
    }
}

struct Session {
    broker: Arc<Broker>,
    codec: Codec,
    out: BytesMut,
    client_id: String,
    /// The client id as shared bytes, for the header of every 5.0 publish.
    client_id_bytes: Bytes,
    will: Option<Will>,
    /// v5 topic aliases the client defined.
    aliases: HashMap<u16, Text>,
    /// Where the last publish went, for the next one to the same topic.
    routes: RouteCache,
    /// QoS 2 publishes stored (or being stored), waiting for PUBREL: a resend is not stored
    /// again. A persistent session keeps where each went.
    awaiting_release: HashMap<NonZeroU16, Option<StoredRelease>>,
    /// From the session a reconnect found: QoS 2 publishes that were awaiting PUBREL, which
    /// may or may not have been stored before a crash. A resend looks for them in the log.
    in_doubt: HashMap<NonZeroU16, StoredRelease>,
    /// A QoS 2 publish was taken that the stored session does not list yet: the session is
    /// written before the message is queued.
    awaiting_persist: bool,
    /// PUBRECs received in this read: their PUBRELs go out once the session says so.
    pubrel_due: Vec<NonZeroU16>,
    /// Outgoing QoS 1/2 messages not yet acknowledged.
    inflight: HashMap<NonZeroU16, (Inflight, Option<Acked>)>,
    next_packet_id: u16,
    client_receive_max: usize,
    subscriptions: Subscriptions,
    acks_tx: mpsc::Sender<Ack>,
    /// Inbound QoS 1/2 publishes not yet done with, at most our receive maximum.
    quota: InboundQuota,
    /// Whether this connection's session outlives it (clean_session = 0, or a v5 expiry).
    persistent: bool,
    /// The session's expiry, stored with it.
    session_expiry_secs: u32,
    /// When the session was last written, to write it again about once a second.
    session_written: Instant,
    /// The client asked (v5 DISCONNECT) for its stored session to end.
    end_session: bool,
    /// Publishes gathered from the current read, not yet queued.
    batch: Option<Batch>,
    /// Resolves when the acknowledgements of everything queued so far have been handed over:
    /// each group waits for the one before, so PUBACKs go out in the order of the PUBLISHes.
    acks_done: Option<oneshot::Receiver<()>>,
    counters: Counters,
}

/// The per-packet counters, looked up in the metrics registry once per connection instead of
/// on every packet (a lookup hashes the name and takes a lock: at 100 000 messages a second,
/// three per message showed in profiles). Counts gather here and reach the shared counters
/// once per turn of the connection's loop, before its socket write, and when it ends: a
/// shared counter's add is atomic, and several a message, from every connection at once,
/// showed too.
struct Counters {
    packets_received: metrics::Counter,
    publishes_received: metrics::Counter,
    messages_sent: metrics::Counter,
    /// Not yet added: packets received, publishes received, messages sent.
    pending: [u64; 3],
}

impl Counters {
    fn new() -> Self {
        Counters {
            packets_received: metrics::counter!("mqtt_packets_received_total"),
            publishes_received: metrics::counter!("mqtt_publishes_received_total"),
            messages_sent: metrics::counter!("mqtt_messages_sent_total"),
            pending: [0; 3],
        }
    }

    fn packet_received(&mut self) {
        self.pending[0] += 1;
    }

    fn publish_received(&mut self) {
        self.pending[1] += 1;
    }

    fn message_sent(&mut self) {
        self.pending[2] += 1;
    }

    /// Adds what gathered to the shared counters.
    fn add(&mut self) {
        let [packets, publishes, sent] = std::mem::take(&mut self.pending);
        for (counter, count) in
            [(&self.packets_received, packets), (&self.publishes_received, publishes), (&self.messages_sent, sent)]
        {
            if count > 0 {
                counter.increment(count);
            }
        }
    }
}

impl Drop for Counters {
    fn drop(&mut self) {
        self.add();
    }
}

impl Session {
    /// The table a `{table}/{id}` topic names, if its first level is a table.
    fn table_of(&self, topic: &str) -> Option<Arc<Table>> {
        let (first, id) = topic.split_once('/')?;
        if id.is_empty() || id.contains('/') {
            return None;
        }
        self.broker.engine.table(first).ok()
    }

    /// Writes the session: its subscriptions and, for each, the positions acknowledged up to.
    async fn persist(&mut self, disconnected: bool) {
        let subscriptions = self.subscriptions.stored();
        let mut awaiting_release: Vec<StoredRelease> =
            self.awaiting_release.values().flatten().cloned().chain(self.in_doubt.values().cloned()).collect();
        awaiting_release.sort_by_key(|release| release.packet_id);
        let mut releasing: Vec<u16> = self
            .inflight
            .iter()
            .filter(|(_, (state, _))| *state == Inflight::AwaitingComp)
            .map(|(packet_id, _)| packet_id.get())
            .collect();
        releasing.sort_unstable();
        let session = StoredSession {
            expiry_secs: self.session_expiry_secs,
            disconnected_ms: disconnected.then(now_ms),
            subscriptions,
            awaiting_release,
            releasing,
        };
        self.awaiting_persist = false;
        if let Err(error) = self.broker.sessions.put(&self.client_id, Some(session)).await {
            tracing::warn!(client_id = %self.client_id, %error, "the MQTT session could not be stored");
        }
        self.session_written = Instant::now();
    }

    #[allow(clippy::too_many_arguments)]
    async fn serve<S: AsyncRead + AsyncWrite>(
        &mut self,
        reader: &mut ReadHalf<S>,
        writer: &mut WriteHalf<S>,
        mut buf: BytesMut,
        keep_alive: Option<Duration>,
        mut kicked: tokio::sync::oneshot::Receiver<()>,
        acks: &mut mpsc::Receiver<Ack>,
        mut deliveries: mpsc::Receiver<Outbound>,
    ) -> Close {
        let mut shutdown = self.broker.shutdown.clone();
        let mut last_seen = Instant::now();
        // Packets already buffered after CONNECT are handled first.
        let mut pending_input = !buf.is_empty();
        loop {
            if pending_input {
                pending_input = false;
                if let Some(close) = self.handle_input(&mut buf).await {
                    return close;
                }
            } else {
                let deadline = keep_alive.map(|keep_alive| last_seen + keep_alive);
                tokio::select! {
                    _ = &mut kicked => {
                        return Close::abnormal(Goodbye::SessionTakenOver, "another connection took this client id over");
                    }
                    _ = shutdown.changed() => {
                        return Close { will: false, goodbye: Some((Goodbye::ShuttingDown, "the server is shutting down".into())) };
                    }
                    read = reader.read_buf(&mut buf) => match read {
                        Ok(0) | Err(_) => return Close { will: true, goodbye: None },
                        Ok(_) => {
                            last_seen = Instant::now();
                            if let Some(close) = self.handle_input(&mut buf).await {
                                return close;
                            }
                        }
                    },
                    Some(ack) = acks.recv() => {
                        if let Some(close) = self.send_ack(ack) {
                            return close;
                        }
                    }
                    Some(outbound) = deliveries.recv(), if self.inflight.len() < self.client_receive_max => {
                        if let Some(close) = self.deliver(outbound) {
                            return close;
                        }
                    }
                    () = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {
                        return Close::abnormal(Goodbye::KeepAliveTimeout, "no packet within 1.5 times the keep-alive");
                    }
                }
            }
            // Send what is ready at once: acks and messages that queued up meanwhile too.
            while self.out.len() < WRITE_BATCH_BYTES {
                if let Ok(ack) = acks.try_recv() {
                    if let Some(close) = self.send_ack(ack) {
                        return close;
                    }
                } else if self.inflight.len() < self.client_receive_max
                    && let Ok(outbound) = deliveries.try_recv()
                {
                    if let Some(close) = self.deliver(outbound) {
                        return close;
                    }
                } else {
                    break;
                }
            }
            self.counters.add();
            if !self.out.is_empty() {
                match tokio::time::timeout(WRITE_TIMEOUT, writer.write_all(&self.out)).await {
                    Ok(Ok(())) => self.out.clear(),
                    _ => return Close { will: true, goodbye: None },
                }
            }
            // A persistent session's positions follow the acknowledgements, written about once
            // a second: after a crash, at most that much is delivered again.
            if self.persistent && self.session_written.elapsed() >= SESSION_WRITE_INTERVAL {
                self.persist(false).await;
            }
        }
    }

    /// Handles every whole packet in `buf`.
    async fn handle_input(&mut self, buf: &mut BytesMut) -> Option<Close> {
        loop {
            match self.codec.decode(buf) {
                Ok(Some(packet)) => {
                    self.counters.packet_received();
                    if !matches!(packet, Inbound::Publish(_)) {
                        self.flush().await;
                    }
                    if let Some(close) = self.handle(packet).await {
                        self.flush().await;
                        return Some(close);
                    }
                }
                Ok(None) => {
                    self.flush().await;
                    return self.release_due().await;
                }
                Err(error) => {
                    self.flush().await;
                    metrics::counter!("mqtt_protocol_errors_total").increment(1);
                    return Some(Close::abnormal(goodbye_for(&error), error.to_string()));
                }
            }
        }
    }

    async fn handle(&mut self, packet: Inbound) -> Option<Close> {
        match packet {
            Inbound::Connect(_) => Some(Close::abnormal(Goodbye::ProtocolError, "a second CONNECT")),
            Inbound::Publish(publish) => self.publish(*publish).await,
            Inbound::PubAck(packet_id) => {
                if self.inflight.get(&packet_id).is_some_and(|(state, _)| *state == Inflight::AwaitingAck)
                    && let Some((_, Some(acked))) = self.inflight.remove(&packet_id)
                {
                    acked.mark();
                }
                None
            }
            Inbound::PubRec(packet_id) => {
                if let Some((state, acked)) = self.inflight.get_mut(&packet_id)
                    && *state == Inflight::AwaitingRec
                {
                    // The client has it: a redelivery would be a duplicate.
                    *state = Inflight::AwaitingComp;
                    if let Some(acked) = acked.take() {
                        acked.mark();
                    }
                }
                self.pubrel_due.push(packet_id);
                None
            }
            Inbound::PubComp(packet_id) => {
                if self.inflight.get(&packet_id).is_some_and(|(state, _)| *state == Inflight::AwaitingComp) {
                    self.inflight.remove(&packet_id);
                }
                None
            }
            Inbound::PubRel(packet_id) => {
                self.awaiting_release.remove(&packet_id);
                self.quota.release(packet_id);
                self.in_doubt.remove(&packet_id);
                self.encoded(|codec, out| codec.publish_ack2(false, packet_id, out))
            }
            Inbound::Subscribe { packet_id, id, filters } => {
                let mut granted = Vec::with_capacity(filters.len());
                for filter in filters {
                    granted.push(self.subscriptions.subscribe(filter, id, self.persistent, None).await);
                }
                if self.persistent {
                    self.persist(false).await;
                }
                self.encoded(|codec, out| codec.suback(packet_id, &granted, out))
            }
            Inbound::Unsubscribe { packet_id, filters } => {
                let existed: Vec<bool> = filters.iter().map(|filter| self.subscriptions.unsubscribe(filter)).collect();
                if self.persistent {
                    self.persist(false).await;
                }
                self.encoded(|codec, out| codec.unsuback(packet_id, &existed, out))
            }
            Inbound::PingReq => self.encoded(|codec, out| codec.pingresp(out)),
            Inbound::Disconnect { with_will, session_expiry_secs } => {
                if let Some(expiry) = session_expiry_secs {
                    self.session_expiry_secs = expiry;
                    if expiry == 0 && self.persistent {
                        // The session ends with this connection after all.
                        self.persistent = false;
                        self.end_session = true;
                    }
                }
                Some(Close { will: with_will, goodbye: None })
            }
            Inbound::Unexpected(name) => {
                Some(Close::abnormal(Goodbye::ProtocolError, format!("{name} is not a packet a client sends")))
            }
            Inbound::Invalid { goodbye, reason } => {
                metrics::counter!("mqtt_protocol_errors_total").increment(1);
                Some(Close::abnormal(goodbye, reason))
            }
        }
    }

    /// Encodes an answer; an encoding failure ends the connection.
    fn encoded(
        &mut self,
        encode: impl FnOnce(&mut Codec, &mut BytesMut) -> Result<(), rmqtt_codec::error::EncodeError>,
    ) -> Option<Close> {
        match encode(&mut self.codec, &mut self.out) {
            Ok(()) => None,
            Err(error) => Some(Close::abnormal(Goodbye::Unavailable, format!("encoding an answer failed: {error}"))),
        }
    }

    async fn publish(&mut self, publish: Publish) -> Option<Close> {
        self.counters.publish_received();
        let Publish { qos, topic, packet_id, payload, properties, retain, .. } = publish;
        // The topic as the packet holds it, shared rather than copied (the codec checked its
        // UTF-8; this check cannot fail, but costs little next to a copy).
        let Ok(mut topic) = Text::from_utf8(topic.into_bytes()) else {
            return Some(Close::abnormal(Goodbye::ProtocolError, "the topic is not valid UTF-8"));
        };
        let mut message_properties = MessageProperties::default();
        if let Some(properties) = properties {
            if let Some(alias) = properties.topic_alias {
                if alias.get() > self.broker.config.topic_alias_max {
                    return Some(Close::abnormal(
                        Goodbye::TopicAliasInvalid,
                        format!("topic alias {alias} is above the maximum"),
                    ));
                }
                if topic.is_empty() {
                    match self.aliases.get(&alias.get()) {
                        Some(known) => topic = known.clone(),
                        None => {
                            return Some(Close::abnormal(
                                Goodbye::TopicAliasInvalid,
                                format!("topic alias {alias} was never set"),
                            ));
                        }
                    }
                } else {
                    // A copy: the topic shares the packet's read buffer, which an alias kept
                    // for the connection's life would otherwise hold on to.
                    self.aliases.insert(alias.get(), Text::from(topic.as_str()));
                }
            }
            message_properties = MessageProperties::of_publish(&properties);
            if let Some(fault) = message_properties.fault() {
                return Some(Close::abnormal(Goodbye::ProtocolError, fault));
            }
        }
        let refuse = |this: &mut Self, refusal: Refusal, reason: String| -> Option<Close> {
            match (qos, packet_id, this.codec.version()) {
                (QoS::AtMostOnce, _, _) | (_, None, _) => {
                    tracing::debug!(reason, "QoS 0 message dropped");
                    None
                }
                (_, Some(_), Version::V3) => Some(Close::abnormal(Goodbye::TopicNameInvalid, reason)),
                (_, Some(packet_id), Version::V5) => {
                    // In its turn, after the acknowledgements of earlier publishes.
                    this.chain(vec![(qos, packet_id)], Vec::new(), async move { Err((refusal, reason)) });
                    None
                }
            }
        };
        if qos == QoS::ExactlyOnce
            && let Some(packet_id) = packet_id
        {
            // A message already stored (or, after a crash, found in the log where the session
            // said it would go) is acknowledged again, in its turn, and not stored again.
            // Clients do not all set DUP on a resend, so the log decides: the same packet id,
            // topic and payload from this client where the session said it would go.
            let stored = match self.in_doubt.remove(&packet_id) {
                Some(release) if self.stored_before(&release, packet_id, &topic, &payload) => {
                    self.awaiting_release.insert(packet_id, Some(release));
                    true
                }
                _ => self.awaiting_release.contains_key(&packet_id),
            };
            if stored {
                self.flush().await;
                self.chain(vec![(qos, packet_id)], Vec::new(), async { Ok(()) });
                return None;
            }
        }
        let permit: Option<OwnedSemaphorePermit> = match (qos, self.codec.version()) {
            (QoS::AtMostOnce, _) => None,
            (_, Version::V5) => match self.quota.try_take() {
                Some(permit) => Some(permit),
                None => {
                    return Some(Close::abnormal(
                        Goodbye::ReceiveMaximumExceeded,
                        "more QoS 1/2 publishes outstanding than the receive maximum (QoS 2 until PUBCOMP)",
                    ));
                }
            },
            (_, Version::V3) => self.quota.take().await,
        };
        let permit = self.hold_until_release(qos, packet_id, permit);
        let mut headers = message_headers(qos, message_properties, retain, now_ms());
        let exactly_once = qos == QoS::ExactlyOnce && self.persistent;
        if self.codec.version() == Version::V5 || exactly_once {
            // A 5.0 subscription can ask not to get its own client's messages back.
            headers.push((Text::from_static(CLIENT_HEADER), self.client_id_bytes.clone()));
        }
        if exactly_once && let Some(packet_id) = packet_id {
            headers.push((Text::from_static(PACKET_HEADER), Bytes::from(packet_id.get().to_string())));
        }
        let packet = packet_id.filter(|_| qos != QoS::AtMostOnce).map(|packet_id| (qos, packet_id));
        if retain && let Some(table) = self.table_of(&topic) {
            // A retained message to {table}/{id} writes the row (an empty one deletes it),
            // durably and in order, before the acknowledgement.
            self.flush().await;
            let id = topic.split_once('/').map(|(_, id)| id.to_string()).unwrap_or_default();
            let write = if payload.is_empty() {
                Ok(Write::Delete)
            } else {
                match serde_json::from_slice::<serde_json::Value>(&payload) {
                    Ok(serde_json::Value::Object(row)) => Ok(Write::Put(row)),
                    _ => Err((Refusal::PayloadInvalid, format!("a row of table {:?} is a JSON object", table.name()))),
                }
            };
            let durability = routing::durability(qos);
            let outcome = match write {
                Ok(write) => match table.write(&id, write, Precondition::None, durability).await {
                    Ok(_) | Err(EngineError::RowNotFound { .. }) => Ok(()),
                    Err(error @ EngineError::InvalidRow(_)) => Err((Refusal::PayloadInvalid, error.to_string())),
                    Err(error) => Err((Refusal::Unavailable, error.to_string())),
                },
                Err(refusal) => Err(refusal),
            };
            if let Err((refusal, reason)) = outcome {
                return refuse(self, refusal, reason);
            }
            self.chain(packet.into_iter().collect(), permit.into_iter().collect(), async { Ok(()) });
            return None;
        }
        if retain {
            // Stored in its stream and as its topic's retained message, both durable before
            // the acknowledgement: on its own, after what is gathered so far.
            self.flush().await;
            let routed = match self.routes.route(&self.broker.engine, &topic).await {
                Ok(route) => routing::record(&route, &topic, payload, headers).map(|record| (route, record)),
                Err(refused) => Err(refused),
            };
            let (route, record) = match routed {
                Ok(routed) => routed,
                Err((refusal, reason)) => return refuse(self, refusal, reason),
            };
            if let Some((_, packet_id)) = packet
                && qos == QoS::ExactlyOnce
            {
                self.await_release(packet_id, &route);
                if self.awaiting_persist {
                    self.persist(false).await;
                }
            }
            let stored = match self.broker.retained.publish(&route, record, routing::durability(qos)).await {
                Ok(stored) => stored,
                Err(error) => {
                    if let Some((_, packet_id)) = packet {
                        self.awaiting_release.remove(&packet_id);
                    }
                    return refuse(self, Refusal::Unavailable, error.to_string());
                }
            };
            let stored = async move { stored.await.map_err(|error| (Refusal::Unavailable, error)) };
            self.chain(packet.into_iter().collect(), permit.into_iter().collect(), stored);
            return None;
        }
        let routed = match self.routes.route(&self.broker.engine, &topic).await {
            Ok(route) => routing::record(&route, &topic, payload, headers).map(|record| (route, record)),
            Err(refused) => Err(refused),
        };
        let (route, record) = match routed {
            Ok(routed) => routed,
            Err((refusal, reason)) => {
                self.flush().await;
                return refuse(self, refusal, reason);
            }
        };
        if let Some((QoS::ExactlyOnce, packet_id)) = packet {
            self.await_release(packet_id, &route);
        }
        let durability = routing::durability(qos);
        let fits = self.batch.as_ref().is_some_and(|batch| {
            Arc::ptr_eq(&batch.route.stream, &route.stream)
                && batch.route.partition == route.partition
                && batch.durability == durability
                && batch.records.len() < BATCH_RECORDS_MAX
                && batch.bytes < BATCH_BYTES_MAX
        });
        if !fits {
            self.flush().await;
        }
        let batch = self.batch.get_or_insert_with(|| Batch {
            route,
            durability,
            records: Vec::new(),
            bytes: 0,
            acks: Vec::new(),
            permits: Vec::new(),
        });
        batch.bytes += record.encoded_len();
        batch.records.push(record);
        batch.permits.extend(permit);
        batch.acks.extend(packet);
        None
    }

    /// A v5 QoS 2 publish counts against the receive maximum until its PUBCOMP: its permit is
    /// kept until the PUBREL (or its refusal, in [`Self::send_ack`]) instead of going with
    /// its PUBREC. Other permits are returned as they are. Not in 3.1.1, which has no receive
    /// maximum: a publish waits for a permit there, and one held for a PUBREL that is queued
    /// behind it would never come.
    fn hold_until_release(
        &mut self,
        qos: QoS,
        packet_id: Option<NonZeroU16>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Option<OwnedSemaphorePermit> {
        match (qos, packet_id, permit, self.codec.version()) {
            (QoS::ExactlyOnce, Some(packet_id), Some(permit), Version::V5) => {
                self.quota.hold_until_release(packet_id, permit);
                None
            }
            (_, _, permit, _) => permit,
        }
    }

    /// Notes an incoming QoS 2 message as stored until its PUBREL; a persistent session notes
    /// where, and writes it down before the message is queued.
    fn await_release(&mut self, packet_id: NonZeroU16, route: &Route) {
        let release = self.persistent.then(|| StoredRelease {
            packet_id: packet_id.get(),
            stream: route.stream.name().to_string(),
            partition: route.partition,
            from: route.stream.end_offset(route.partition).unwrap_or(0),
        });
        self.awaiting_persist |= release.is_some();
        self.awaiting_release.insert(packet_id, release);
    }

    /// Whether this client's QoS 2 message `packet_id` (with this topic and payload) is in the
    /// log where `release` says it would have gone (read in bounded chunks: this only runs for
    /// a resend after a reconnect).
    fn stored_before(&self, release: &StoredRelease, packet_id: NonZeroU16, topic: &str, payload: &[u8]) -> bool {
        let Ok(stream) = self.broker.engine.stream(&release.stream) else { return false };
        let (Ok(start), Ok(end)) = (stream.start_offset(release.partition), stream.end_offset(release.partition))
        else {
            return false;
        };
        let packet = packet_id.get().to_string();
        let mut next = release.from.max(start);
        while next < end {
            let Ok(records) =
                stream.read(release.partition, Position::Offset(next), LOOKUP_RECORDS_PER_READ, LOOKUP_BYTES_PER_READ)
            else {
                return false;
            };
            let Some(last) = records.last() else { return false };
            next = last.offset + 1;
            let found = records.iter().any(|record| {
                let header = |name: &str| record.headers.get(name);
                header(CLIENT_HEADER).is_some_and(|client| client == self.client_id.as_bytes())
                    && header(PACKET_HEADER).is_some_and(|id| id == packet.as_bytes())
                    && record.subject.as_deref() == Some(topic)
                    && record.value.as_deref() == Some(payload)
            });
            if found {
                return true;
            }
        }
        false
    }

    /// Sends the PUBRELs of the PUBRECs just received — a persistent session first records
    /// that those messages are acknowledged, so none of them is ever sent again.
    async fn release_due(&mut self) -> Option<Close> {
        if self.pubrel_due.is_empty() {
            return None;
        }
        if self.persistent {
            self.persist(false).await;
        }
        for packet_id in std::mem::take(&mut self.pubrel_due) {
            if let Some(close) = self.encoded(|codec, out| codec.publish_ack2(true, packet_id, out)) {
                return Some(close);
            }
        }
        None
    }

    /// Queues the gathered publishes as one append (a persistent session first writes down
    /// where its QoS 2 messages go).
    async fn flush(&mut self) {
        let Some(batch) = self.batch.take() else { return };
        if self.awaiting_persist {
            self.persist(false).await;
        }
        let queued = batch.route.enqueue(&batch.records, batch.durability).await;
        let stored = async move {
            match queued {
                Ok(queued) => queued.await.map(|_| ()).map_err(|error| (Refusal::Unavailable, error.to_string())),
                Err(error) => Err((Refusal::Unavailable, error.to_string())),
            }
        };
        self.chain(batch.acks, batch.permits, stored);
    }

    /// Hands `packets`' acknowledgements over once `stored` is done and every earlier group's
    /// have been; the receive-maximum permits are released with them.
    fn chain(
        &mut self,
        packets: Vec<(QoS, NonZeroU16)>,
        permits: Vec<OwnedSemaphorePermit>,
        stored: impl std::future::Future<Output = Result<(), (Refusal, String)>> + Send + 'static,
    ) {
        let previous = self.acks_done.take();
        let (done, done_receiver) = oneshot::channel();
        self.acks_done = Some(done_receiver);
        let acks = self.acks_tx.clone();
        tokio::spawn(async move {
            let outcome = stored.await;
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            if packets.is_empty() {
                if let Err((_, error)) = outcome {
                    tracing::warn!(%error, "QoS 0 messages could not be stored");
                }
            } else {
                let _ = acks.send(Ack { packets, outcome }).await;
            }
            drop(permits);
            let _ = done.send(());
        });
    }

    fn send_ack(&mut self, ack: Ack) -> Option<Close> {
        if let Err((_, reason)) = &ack.outcome {
            for (qos, packet_id) in &ack.packets {
                self.awaiting_release.remove(packet_id);
                if *qos == QoS::ExactlyOnce {
                    // A refused QoS 2 publish is done with at its PUBREC.
                    self.quota.release(*packet_id);
                }
            }
            if self.codec.version() == Version::V3 {
                return Some(Close::abnormal(Goodbye::Unavailable, reason.clone()));
            }
        }
        for (qos, packet_id) in ack.packets {
            let outcome = ack.outcome.clone();
            if let Some(close) = self.encoded(|codec, out| codec.publish_ack(qos, packet_id, outcome, out)) {
                return Some(close);
            }
        }
        None
    }

    fn allocate_packet_id(&mut self) -> NonZeroU16 {
        loop {
            let id = NonZeroU16::new(self.next_packet_id).unwrap_or(NonZeroU16::MIN);
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            if !self.inflight.contains_key(&id) {
                return id;
            }
        }
    }

    fn deliver(&mut self, outbound: Outbound) -> Option<Close> {
        let (event, granted, subscription_id, retain, retain_as_published, acked, dup) = match outbound {
            Outbound::Message { event, qos, subscription_id, retain, retain_as_published, progress, dup } => {
                let acked = progress.map(|progress| Acked {
                    progress,
                    stream: event.stream.clone(),
                    partition: event.partition,
                    offset: event.record.offset,
                });
                (event, qos, subscription_id, retain, retain_as_published, acked, dup)
            }
            Outbound::CutOff => {
                return Some(Close::abnormal(
                    Goodbye::QuotaExceeded,
                    "this client fell behind its subscriptions past what the log still holds",
                ));
            }
        };
        let record = &event.record;
        let header = |name: &str| record.headers.get(name).and_then(|value| std::str::from_utf8(value).ok());
        let published_qos = match header(QOS_HEADER) {
            Some("0") => QoS::AtMostOnce,
            Some("2") => QoS::ExactlyOnce,
            _ => QoS::AtLeastOnce,
        };
        let qos = if qos_rank(published_qos) < qos_rank(granted) { published_qos } else { granted };
        let mut expiry = None;
        if let Some(expires) = header(EXPIRES_HEADER).and_then(|text| text.parse::<i64>().ok()) {
            let left_ms = expires - now_ms();
            if left_ms <= 0 {
                metrics::counter!("mqtt_messages_expired_total").increment(1);
                if let Some(acked) = acked {
                    acked.mark();
                }
                return None;
            }
            expiry = NonZeroU32::new(((left_ms + 999) / 1000).min(i64::from(u32::MAX)) as u32);
        }
        let topic = message_topic(&event);
        let packet_id = (qos != QoS::AtMostOnce).then(|| self.allocate_packet_id());
        let properties = (self.codec.version() == Version::V5)
            .then(|| super::headers::publish_properties(&record.headers, expiry, subscription_id));
        let retain = retain || (retain_as_published && header(RETAIN_HEADER).is_some());
        let publish = Publish {
            // DUP only means something for QoS 1 and 2 (and must be 0 at QoS 0).
            dup: dup && qos != QoS::AtMostOnce,
            retain,
            qos,
            topic: byte_string(&topic),
            packet_id,
            payload: record.value.clone().unwrap_or_default(),
            properties,
        };
        match self.codec.publish(publish, &mut self.out) {
            Ok(()) => {
                self.counters.message_sent();
                match packet_id {
                    Some(packet_id) => {
                        let state = if qos == QoS::ExactlyOnce { Inflight::AwaitingRec } else { Inflight::AwaitingAck };
                        self.inflight.insert(packet_id, (state, acked));
                    }
                    // QoS 0: done once sent.
                    None => {
                        if let Some(acked) = acked {
                            acked.mark();
                        }
                    }
                }
                None
            }
            Err(rmqtt_codec::error::EncodeError::OverMaxPacketSize { .. }) => {
                // MQTT 5: a message larger than the client accepts is discarded for that client.
                metrics::counter!("mqtt_messages_too_large_total").increment(1);
                if let Some(acked) = acked {
                    acked.mark();
                }
                None
            }
            Err(error) => Some(Close::abnormal(Goodbye::Unavailable, format!("encoding a message failed: {error}"))),
        }
    }
}

/// The MQTT topic of a record: its subject, or for a table change `{table}/{id}`, or else the
/// stream's name.
pub(super) fn message_topic(event: &Event) -> Text {
    if event.table {
        let id = event.record.key.as_deref().map(String::from_utf8_lossy).unwrap_or_default();
        return Text::from(format!("{}/{id}", event.stream));
    }
    match &event.record.subject {
        Some(subject) => subject.clone(),
        None => Text::from(&*event.stream),
    }
}

/// `text` for the codec, sharing its bytes.
fn byte_string(text: &Text) -> ByteString {
    ByteString::try_from(text.clone().into_bytes()).expect("a Text holds UTF-8")
}
