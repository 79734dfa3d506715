//! One MQTT connection's loop: the I/O around the protocol state machine ([`super::machine`]).
//! After the handshake ([`super::handshake`]), one task reads packets, hands them to the
//! machine, carries out what it asks (storing messages through [`Publisher`], opening
//! subscriptions, writing the session down), hands it the acknowledgements and the messages
//! its subscriptions deliver, writes what it answers, and enforces keep-alive. When the
//! connection ends, the session is written, the goodbye said, and the will published.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use rmqtt_codec::types::QoS;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::handshake::{self, Accepted};
use super::machine::{self, Ack, Action, Close, Event, Interruption, Machine, Message, Outbound, SessionEnd};
use super::proto::{Inbound, Refusal, SubscribeFilter, qos_of_rank};
use super::publish::{self, Publisher};
use super::routing;
use super::sessions::StoredSession;
use super::subscriptions::Subscriptions;
use super::telemetry::Counters;
use super::{Broker, now_ms};

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
pub(super) const BUFFER_BYTES_INITIAL: usize = 4096;
/// Answers and messages gathered before they are written: one write for many small packets,
/// and a bound on what one turn of the loop holds.
const WRITE_BATCH_BYTES: usize = 64 * 1024;
/// Acknowledgement groups that may wait to be handed back beyond the receive maximum: refusals
/// and resent QoS 2 publishes take no receive-maximum slot, and their tasks should not wait.
const ACK_GROUPS_SPARE: usize = 16;

/// Serves one client over `stream` (a TCP connection, or a WebSocket's byte stream) until it
/// goes away.
pub(super) async fn run<S: AsyncRead + AsyncWrite + Send + 'static>(
    broker: Arc<Broker>,
    stream: S,
    connection_id: u64,
    certificate_user: crate::tls::CertificateUser,
    peer: Option<std::net::SocketAddr>,
) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let mut buf = BytesMut::with_capacity(BUFFER_BYTES_INITIAL);
    let client = handshake::Client { connection: connection_id, certificate_user: certificate_user.as_deref(), peer };
    let accepted = handshake::accept(&broker, &mut reader, &mut writer, &mut buf, client);
    let Some(accepted) = accepted.await else {
        return;
    };
    // `_held` counts the connection against its user's limit until it ends.
    let Accepted { codec, connect, client_id, stored, kicked, owner, principal, held: _held } = accepted;
    let (acks_sender, acks) = mpsc::channel(usize::from(broker.config.receive_max) + ACK_GROUPS_SPARE);
    let (deliveries_sender, deliveries) = mpsc::channel(broker.config.outbound_queue);
    let mut connection = Connection {
        machine: Machine::new(codec, &connect, &client_id, &broker.config),
        publisher: Publisher::new(broker.clone(), principal.clone(), acks_sender),
        subscriptions: Subscriptions::new(broker.clone(), &client_id, principal.clone(), deliveries_sender),
        counters: Counters::new(),
        session_written: Instant::now(),
        broker: broker.clone(),
        client_id,
    };
    connection.restore(stored.as_ref(), &mut writer).await;
    let keep_alive = (connect.keep_alive_secs > 0)
        .then(|| Duration::from_millis(u64::from(connect.keep_alive_secs) * KEEP_ALIVE_GRACE_PERMILLE));
    let mut inputs = Inputs { buf, kicked, acks, deliveries, keep_alive };
    let close = connection.serve(&mut reader, &mut writer, &mut inputs).await;
    let ending = connection.machine.end(&close);
    connection.leave_session(ending.session, &mut inputs.acks).await;
    owner.release(&broker, &connection.client_id);
    // Dropping the handles stops the followers and leaves shared groups.
    connection.subscriptions.clear();
    connection.counters.add(connection.machine.take_counts());
    connection.say_goodbye(&close, &mut writer).await;
    broker.clients.unregister(&connection.client_id, connection_id);
    if let Some((will, delay)) = ending.will {
        publish::publish_will(broker, principal, will, connection.client_id, delay);
    }
}

/// What the loop waits on besides its own socket.
struct Inputs {
    /// Bytes read and not yet decoded (after CONNECT, what came with it).
    buf: BytesMut,
    /// Resolves when another connection takes the client id over.
    kicked: oneshot::Receiver<()>,
    /// Acknowledgements whose messages are stored, in the order of their publishes.
    acks: mpsc::Receiver<Ack>,
    /// Messages from the connection's subscriptions (bounded: `outbound_queue`).
    deliveries: mpsc::Receiver<Outbound>,
    /// How long the client may send nothing (1.5 times its keep-alive), if it has one.
    keep_alive: Option<Duration>,
}

/// One connection, accepted.
struct Connection {
    broker: Arc<Broker>,
    client_id: String,
    machine: Machine,
    publisher: Publisher,
    subscriptions: Subscriptions,
    counters: Counters,
    /// When the session was last written, to write it again about once a second.
    session_written: Instant,
}

impl Connection {
    /// How the connection ends when another takes its client id over. What the client sent
    /// before it connected again is handled first: a DISCONNECT already in the socket (with
    /// a session expiry of 0, say) is the client's last word, not the takeover.
    async fn taken_over<R: AsyncRead + Unpin>(&mut self, reader: &mut R, inputs: &mut Inputs) -> Close {
        let mut pending = !inputs.buf.is_empty();
        loop {
            if !pending {
                let read = tokio::select! {
                    biased;
                    read = reader.read_buf(&mut inputs.buf) => read,
                    () = std::future::ready(()) => break,
                };
                if !matches!(read, Ok(read) if read > 0) {
                    break;
                }
            }
            if let Some(close) = self.handle_input(&mut inputs.buf, &mut pending).await {
                return close;
            }
            if pending && self.machine.is_waiting() {
                break;
            }
        }
        machine::interrupted(Interruption::TakenOver)
    }
    /// Takes up the session a previous connection left: its subscriptions, each from where it
    /// was acknowledged up to (the messages published meanwhile are in the log and come now),
    /// and its QoS 2 state. Then the session is written as this connection holds it (or, for a
    /// connection whose session ends with it, ended).
    async fn restore<S: AsyncWrite>(&mut self, stored: Option<&StoredSession>, writer: &mut WriteHalf<S>) {
        if let Some(stored) = stored {
            for subscription in &stored.subscriptions {
                let request = SubscribeFilter {
                    filter: subscription.filter.clone(),
                    qos: qos_of_rank(subscription.qos),
                    retain_handling: 2,
                    retain_as_published: subscription.retain_as_published,
                    no_local: subscription.no_local,
                };
                let id = subscription.subscription_id.and_then(NonZeroU32::new);
                let persistent = self.machine.persistent();
                if let Err(refusal) = self.subscriptions.subscribe(request, id, persistent, Some(subscription)).await {
                    let (client_id, filter) = (&self.client_id, &subscription.filter);
                    tracing::warn!(client_id, filter, ?refusal, "a stored subscription could not resume");
                }
            }
            // QoS 2 messages the client had PUBREC'd: their PUBRELs come again.
            self.machine.restore(stored);
            let out = self.machine.output();
            if !out.is_empty() {
                if writer.write_all(out).await.is_err() {
                    tracing::debug!(client_id = self.client_id, "the connection ended while its session was restored");
                }
                out.clear();
            }
        }
        if self.machine.persistent() {
            self.persist(false).await;
        } else if stored.is_some() {
            let _ = self.broker.sessions.put(&self.client_id, None).await;
        }
    }

    /// Leaves the session as the connection's end says: stored for the client's next
    /// connection (once what is being stored has settled), ended, or neither.
    async fn leave_session(&mut self, end: SessionEnd, acks: &mut mpsc::Receiver<Ack>) {
        match end {
            SessionEnd::Keep => {
                // What the session keeps of incoming QoS 2 messages must be what was stored:
                // wait for the writes still under way, and forget the ones that failed.
                self.publisher.settled().await;
                while let Ok(ack) = acks.try_recv() {
                    self.machine.settle(&ack);
                }
                self.persist(true).await;
            }
            SessionEnd::Delete => {
                let _ = self.broker.sessions.put(&self.client_id, None).await;
            }
            SessionEnd::Forget => {}
        }
    }

    /// Writes the goodbye the machine has for the client (a v5 DISCONNECT), if any, within its
    /// time, and closes the write side.
    async fn say_goodbye<S: AsyncWrite>(&mut self, close: &Close, writer: &mut WriteHalf<S>) {
        let goodbye = self.machine.output();
        if !goodbye.is_empty() {
            let _ = tokio::time::timeout(GOODBYE_WRITE_TIMEOUT, writer.write_all(goodbye)).await;
        }
        if let Some((goodbye, reason)) = &close.goodbye {
            tracing::debug!(client_id = self.client_id, ?goodbye, reason, "MQTT connection closed by the server");
        }
        let _ = writer.shutdown().await;
    }

    /// The loop: until the connection ends, and why.
    async fn serve<S: AsyncRead + AsyncWrite>(
        &mut self,
        reader: &mut ReadHalf<S>,
        writer: &mut WriteHalf<S>,
        inputs: &mut Inputs,
    ) -> Close {
        let mut shutdown = self.broker.shutdown.clone();
        let mut last_seen = Instant::now();
        // Packets already buffered after CONNECT are handled first.
        let mut input_pending = !inputs.buf.is_empty();
        loop {
            let turn = if input_pending && !self.machine.is_waiting() {
                // Bytes read before a 3.1.1 publish waited for a slot (or after CONNECT): the
                // client sent them, so it was seen.
                last_seen = Instant::now();
                self.handle_input(&mut inputs.buf, &mut input_pending).await
            } else {
                // A publish waiting for a slot waits on the disk, not on the client.
                let deadline = inputs.keep_alive.filter(|_| !self.machine.is_waiting()).map(|limit| last_seen + limit);
                tokio::select! {
                    _ = &mut inputs.kicked => Some(self.taken_over(reader, inputs).await),
                    _ = shutdown.changed() => Some(machine::interrupted(Interruption::ShuttingDown)),
                    read = reader.read_buf(&mut inputs.buf), if !input_pending => match read {
                        Ok(0) | Err(_) => Some(machine::interrupted(Interruption::ConnectionLost)),
                        Ok(_) => {
                            last_seen = Instant::now();
                            self.handle_input(&mut inputs.buf, &mut input_pending).await
                        }
                    },
                    Some(ack) = inputs.acks.recv() => self.take(Event::Stored(ack)).await,
                    Some(outbound) = inputs.deliveries.recv(), if self.machine.window_open() => {
                        self.take(Event::Deliver(outbound)).await
                    }
                    () = async { tokio::time::sleep_until(deadline.expect("guarded")).await }, if deadline.is_some() => {
                        Some(machine::interrupted(Interruption::KeepAliveExpired))
                    }
                }
            };
            if let Some(close) = turn {
                return close;
            }
            if let Some(close) = self.take_ready(inputs).await {
                return close;
            }
            self.counters.add(self.machine.take_counts());
            let out = self.machine.output();
            if !out.is_empty() {
                match tokio::time::timeout(WRITE_TIMEOUT, writer.write_all(out)).await {
                    Ok(Ok(())) => out.clear(),
                    _ => return machine::interrupted(Interruption::ConnectionLost),
                }
            }
            // A persistent session's positions follow the acknowledgements, written about once
            // a second: after a crash, at most that much is delivered again.
            if self.machine.persistent() && self.session_written.elapsed() >= SESSION_WRITE_INTERVAL {
                self.persist(false).await;
            }
        }
    }

    /// Takes the acknowledgements and messages that queued up meanwhile, up to a write's worth,
    /// so they go out with this turn's write.
    async fn take_ready(&mut self, inputs: &mut Inputs) -> Option<Close> {
        while self.machine.output().len() < WRITE_BATCH_BYTES {
            let event = if let Ok(ack) = inputs.acks.try_recv() {
                Event::Stored(ack)
            } else if self.machine.window_open()
                && let Ok(outbound) = inputs.deliveries.try_recv()
            {
                Event::Deliver(outbound)
            } else {
                break;
            };
            if let Some(close) = self.take(event).await {
                return Some(close);
            }
        }
        None
    }

    /// Hands `event` to the machine and carries out what follows.
    async fn take(&mut self, event: Event) -> Option<Close> {
        self.machine.handle(event);
        self.execute().await
    }

    /// Hands every whole packet in `buf` to the machine, until the buffer holds no more (then
    /// `input_pending` is false) or a publish waits for a receive-maximum slot.
    async fn handle_input(&mut self, buf: &mut BytesMut, input_pending: &mut bool) -> Option<Close> {
        loop {
            if self.machine.is_waiting() {
                // What is gathered goes now: its acknowledgements free the slot it waits for.
                *input_pending = true;
                self.flush().await;
                return None;
            }
            match self.machine.decode(buf) {
                Ok(Some(packet)) => {
                    if !matches!(packet, Inbound::Publish(_)) {
                        // Publishes gathered before it are queued first, in order.
                        self.flush().await;
                    }
                    if let Some(close) = self.take(Event::Packet(packet)).await {
                        self.flush().await;
                        return Some(close);
                    }
                }
                Ok(None) => {
                    *input_pending = false;
                    self.flush().await;
                    return self.take(Event::ReadDone).await;
                }
                Err(close) => {
                    self.flush().await;
                    return Some(close);
                }
            }
        }
    }

    /// Carries out what the machine asks, in order; the close it asks for, if it does.
    async fn execute(&mut self) -> Option<Close> {
        while let Some(action) = self.machine.next_action() {
            match action {
                Action::Store(message) => self.store(message).await,
                Action::AckInTurn(ack) => {
                    // In its turn: after the acknowledgements of what is gathered so far.
                    self.flush().await;
                    self.publisher.ack_in_turn(ack);
                }
                Action::LookUp { incoming, release } => {
                    let found = publish::found_in_log(&self.broker.engine, &self.client_id, &release, &incoming);
                    self.machine.handle(Event::LookedUp { incoming, release, found });
                }
                Action::PersistSession => self.persist(false).await,
                Action::Subscribe { packet_id, subscription_id, filters } => {
                    let mut granted = Vec::with_capacity(filters.len());
                    for filter in filters {
                        let persistent = self.machine.persistent();
                        granted.push(self.subscriptions.subscribe(filter, subscription_id, persistent, None).await);
                    }
                    self.machine.handle(Event::Subscribed { packet_id, granted });
                }
                Action::Unsubscribe { packet_id, filters } => {
                    let existed = filters.iter().map(|filter| self.subscriptions.unsubscribe(filter)).collect();
                    self.machine.handle(Event::Unsubscribed { packet_id, existed });
                }
                Action::Close(close) => return Some(close),
            }
        }
        None
    }

    /// Stores a message from the client: gathered for the next append; a retained one on its
    /// own, after what is gathered so far (as its topic's retained message too, or as a row of
    /// the table its topic names). One that cannot be stored is refused.
    async fn store(&mut self, message: Message) {
        let receipt = message.receipt;
        // Over its user's publish rates, the connection waits (reading nothing more) until the
        // user is back within them: the client is slowed down, nothing it sent is dropped.
        let wait = self.publisher.principal().throttle_publish(1, message.payload.len() as u64);
        if !wait.is_zero() {
            self.flush().await;
            crate::access::publish_throttled("mqtt");
            // A shutdown does not wait for the throttle.
            let mut stopping = self.broker.stop.subscribe();
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stopping.wait_for(|stopping| *stopping) => {}
            }
        }
        let stored = if !message.retain {
            self.gather(message).await
        } else if let Some(table) = self.publisher.table_of(&message.topic) {
            self.flush().await;
            self.publisher.write_row(&table, message).await
        } else {
            self.flush().await;
            self.store_retained(message).await
        };
        if let Err((refusal, reason)) = stored {
            self.flush().await;
            self.machine.handle(Event::Refused { receipt, refusal, reason });
        }
    }

    /// Routes a message and gathers it into the batch for its partition (queuing the batch
    /// gathered so far first if it is for another).
    async fn gather(&mut self, message: Message) -> Result<(), (Refusal, String)> {
        let Message { topic, payload, qos, headers, receipt, .. } = message;
        let (route, record) = self.publisher.route(&topic, payload, headers).await?;
        if let Some((QoS::ExactlyOnce, packet_id)) = receipt.ack {
            self.machine.note_stored(packet_id, || publish::stored_release(packet_id, &route));
        }
        let durability = routing::durability(qos);
        if !self.publisher.fits(&route, durability) {
            self.flush().await;
        }
        self.publisher.gather(route, record, durability, receipt);
        Ok(())
    }

    /// Routes a retained message and publishes it, both durable before its acknowledgement (a
    /// persistent session first notes where a QoS 2 one goes).
    async fn store_retained(&mut self, message: Message) -> Result<(), (Refusal, String)> {
        let Message { topic, payload, qos, headers, receipt, .. } = message;
        let (route, record) = self.publisher.route(&topic, payload, headers).await?;
        if let Some((QoS::ExactlyOnce, packet_id)) = receipt.ack {
            self.machine.note_stored(packet_id, || publish::stored_release(packet_id, &route));
        }
        if self.machine.take_persist_due() {
            self.persist(false).await;
        }
        self.publisher.publish_retained(&route, record, routing::durability(qos), receipt).await
    }

    /// Queues the gathered publishes as one append (a persistent session first writes down
    /// where its QoS 2 messages go).
    async fn flush(&mut self) {
        if !self.publisher.has_batch() {
            return;
        }
        if self.machine.take_persist_due() {
            self.persist(false).await;
        }
        self.publisher.flush().await;
    }

    /// Writes the session: its subscriptions and, for each, the positions acknowledged up to,
    /// and its QoS 2 state.
    async fn persist(&mut self, disconnected: bool) {
        // Whatever was due is in this write.
        self.machine.take_persist_due();
        let mut session = self.machine.stored_session(disconnected.then(now_ms));
        session.subscriptions = self.subscriptions.stored();
        if let Err(error) = self.broker.sessions.put(&self.client_id, Some(session)).await {
            tracing::warn!(client_id = %self.client_id, %error, "the MQTT session could not be stored");
        }
        self.session_written = Instant::now();
    }
}
