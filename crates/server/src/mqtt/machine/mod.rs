//! The MQTT protocol of one connection as a state machine with no I/O: what the connection
//! decides, apart from how it reads, writes and stores.
//!
//! The connection ([`super::connection`]) hands it [`Event`]s: packets decoded from the
//! client, acknowledgements whose messages are stored, messages its subscriptions deliver, what
//! the engine answered to an [`Action`]. The machine answers with bytes for the client (in its
//! output buffer, encoded by the client's codec) and with actions for the connection to carry
//! out in order: messages to store, acknowledgements to hand back in their turn, session
//! writes, subscriptions to open, the end of the connection. It owns everything MQTT counts:
//!
//! - inbound ([`inbound`]): topic aliases, the receive maximum (a QoS 1 publish counted until
//!   its PUBACK, a v5 QoS 2 one until its PUBCOMP), exactly-once state (QoS 2 messages stored
//!   and awaiting PUBREL, and those a restored session is in doubt about);
//! - outbound ([`outbound`]): packet ids, the in-flight window the client's receive maximum
//!   allows, QoS 1/2 deliveries awaiting PUBACK, PUBREC or PUBCOMP, DUP, message expiry;
//! - the session: whether it outlives the connection, its expiry, its will.
//!
//! Its tests (`tests.rs`) drive it with packets and read the bytes it answers, with no socket.

mod inbound;
mod outbound;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::num::{NonZeroU16, NonZeroU32};
use std::time::Duration;

use bytes::BytesMut;
use rmqtt_codec::error::EncodeError;
use rmqtt_codec::types::QoS;

use super::MqttConfig;
use super::proto::{Codec, Connect, Goodbye, Granted, Inbound, Refusal, SubscribeFilter, Will, goodbye_for};
use super::sessions::{StoredRelease, StoredSession};

pub(super) use inbound::{Incoming, Message, Receipt};
pub(super) use outbound::{Outbound, message_topic};

/// What happens to a connection, as the machine is told it.
pub(super) enum Event {
    /// A packet from the client.
    Packet(Inbound),
    /// Every whole packet of one read has been handled: the PUBRELs due go out.
    ReadDone,
    /// Messages stored (or refused): their acknowledgements, in the order of their publishes.
    Stored(Ack),
    /// A message of [`Action::Store`] that could not be stored (its route refused it, or its
    /// append failed): it is refused as the client's version says.
    Refused { receipt: Receipt, refusal: Refusal, reason: String },
    /// Whether the log holds a resent QoS 2 message ([`Action::LookUp`]).
    LookedUp { incoming: Incoming, release: StoredRelease, found: bool },
    /// A message for the client from one of its subscriptions.
    Deliver(Outbound),
    /// The subscriptions of a SUBSCRIBE were opened (or refused).
    Subscribed { packet_id: NonZeroU16, granted: Vec<Granted> },
    /// The subscriptions of an UNSUBSCRIBE were ended; whether each existed.
    Unsubscribed { packet_id: NonZeroU16, existed: Vec<bool> },
}

/// Why a connection ends other than by a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Interruption {
    /// Another connection took the client id over.
    TakenOver,
    /// The server is stopping.
    ShuttingDown,
    /// Nothing came for one and a half keep-alives.
    KeepAliveExpired,
    /// The socket closed or failed, reading or writing.
    ConnectionLost,
}

/// What the connection does for the machine, in order.
#[derive(Debug)]
pub(super) enum Action {
    /// Store a message from the client: route it and append it (a retained one also as its
    /// topic's retained message, one to a `{table}/{id}` topic as a row), then hand its
    /// acknowledgement back as [`Event::Stored`] after those of every message before it; or,
    /// when it cannot be stored, report [`Event::Refused`].
    Store(Message),
    /// Hand `ack` back as [`Event::Stored`] after those of every message before it, storing
    /// nothing: a resend of a QoS 2 message already stored, or a refusal.
    AckInTurn(Ack),
    /// Look in the log for a resent QoS 2 message a restored session was in doubt about;
    /// answer with [`Event::LookedUp`].
    LookUp { incoming: Incoming, release: StoredRelease },
    /// Write the session down before anything after this is stored or written to the client.
    PersistSession,
    /// Open these subscriptions; answer with [`Event::Subscribed`].
    Subscribe { packet_id: NonZeroU16, subscription_id: Option<NonZeroU32>, filters: Vec<SubscribeFilter> },
    /// End these subscriptions; answer with [`Event::Unsubscribed`].
    Unsubscribe { packet_id: NonZeroU16, filters: Vec<String> },
    /// End the connection.
    Close(Close),
}

/// Acknowledgements due in the order of their publishes, once their messages are stored.
#[derive(Debug)]
pub(super) struct Ack {
    pub(super) packets: Vec<(QoS, NonZeroU16)>,
    pub(super) outcome: Result<(), (Refusal, String)>,
    /// Receive-maximum slots the acknowledgements give back (see [`Receipt::slot`]).
    pub(super) slots: usize,
}

/// Why the connection ends.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Close {
    /// Publish the will (the connection ended other than by a normal DISCONNECT).
    pub(super) will: bool,
    /// What a v5 client is told, if anything.
    pub(super) goodbye: Option<(Goodbye, String)>,
}

impl Close {
    fn abnormal(goodbye: Goodbye, reason: impl Into<String>) -> Close {
        Close { will: true, goodbye: Some((goodbye, reason.into())) }
    }
}

/// What becomes of the connection's session and will once it has ended.
#[derive(Debug)]
pub(super) struct Ending {
    pub(super) session: SessionEnd,
    /// The will to publish, and after how long (unless the client is back by then).
    pub(super) will: Option<(Will, Duration)>,
}

/// What becomes of the stored session when its connection ends.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SessionEnd {
    /// Stored, for the client's next connection.
    Keep,
    /// The client asked for its stored session to end with this connection.
    Delete,
    /// Nothing stored to keep or end.
    Forget,
}

/// Counts of events not yet added to the broker's metrics (see [`super::telemetry::Counters`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) packets_received: u64,
    pub(super) publishes_received: u64,
    pub(super) messages_sent: u64,
    pub(super) messages_expired: u64,
    pub(super) messages_too_large: u64,
    pub(super) protocol_errors: u64,
}

/// The session as the connection holds it.
struct Session {
    /// Whether it outlives the connection (clean_session = 0, or a v5 expiry).
    persistent: bool,
    expiry_secs: u32,
    /// The client asked (v5 DISCONNECT) for its stored session to end.
    end: bool,
    will: Option<Will>,
}

/// One connection's protocol state (see the module's documentation).
pub(super) struct Machine {
    codec: Codec,
    /// Bytes for the client, written by the connection when it writes.
    out: BytesMut,
    inbound: inbound::Received,
    outbound: outbound::InFlight,
    session: Session,
    /// What the connection is to do next. Bounded by what one event asks (a few actions at
    /// most): the connection carries them all out after every event it hands over.
    actions: VecDeque<Action>,
    counts: Counts,
    /// The time now, in ms since the Unix epoch (a fixed clock in tests).
    clock: fn() -> i64,
}

impl Machine {
    /// The machine of a connection accepted with `connect`, speaking `codec`'s version.
    pub(super) fn new(codec: Codec, connect: &Connect, client_id: &str, config: &MqttConfig) -> Machine {
        Machine {
            inbound: inbound::Received::new(config, client_id),
            outbound: outbound::InFlight::new(connect.receive_max),
            session: Session {
                persistent: connect.session_expiry_secs > 0,
                expiry_secs: connect.session_expiry_secs,
                end: false,
                will: connect.will.clone(),
            },
            codec,
            out: BytesMut::with_capacity(super::connection::BUFFER_BYTES_INITIAL),
            actions: VecDeque::new(),
            counts: Counts::default(),
            clock: super::now_ms,
        }
    }

    /// Takes up the session a previous connection stored: the QoS 2 messages it was in doubt
    /// about, and the PUBRELs of those the client had PUBREC'd, sent again.
    pub(super) fn restore(&mut self, stored: &StoredSession) {
        self.inbound.restore(stored);
        self.resend_releases(&stored.releasing);
    }

    /// Whether the session outlives the connection.
    pub(super) fn persistent(&self) -> bool {
        self.session.persistent
    }

    /// The bytes for the client so far; the connection clears them once written.
    pub(super) fn output(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// The next thing the connection is to do.
    pub(super) fn next_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The counts gathered since the last call.
    pub(super) fn take_counts(&mut self) -> Counts {
        std::mem::take(&mut self.counts)
    }

    /// The next whole packet in `buf`, if one has arrived; a packet that cannot be decoded
    /// ends the connection.
    pub(super) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Inbound>, Close> {
        match self.codec.decode(buf) {
            Ok(Some(packet)) => {
                self.counts.packets_received += 1;
                Ok(Some(packet))
            }
            Ok(None) => Ok(None),
            Err(error) => {
                self.counts.protocol_errors += 1;
                Err(Close::abnormal(goodbye_for(&error), error.to_string()))
            }
        }
    }

    /// Takes in `event`; what follows from it is in the output and the actions.
    pub(super) fn handle(&mut self, event: Event) {
        match event {
            Event::Packet(packet) => self.packet(packet),
            Event::ReadDone => self.release_due(),
            Event::Stored(ack) => self.acknowledge(ack),
            Event::Refused { receipt, refusal, reason } => self.refuse(receipt, refusal, reason),
            Event::LookedUp { incoming, release, found } => self.looked_up(incoming, release, found),
            Event::Deliver(outbound) => self.deliver(outbound),
            Event::Subscribed { packet_id, granted } => {
                self.persist_if_persistent();
                self.encode(|codec, out| codec.suback(packet_id, &granted, out));
            }
            Event::Unsubscribed { packet_id, existed } => {
                self.persist_if_persistent();
                self.encode(|codec, out| codec.unsuback(packet_id, &existed, out));
            }
        }
    }

    fn packet(&mut self, packet: Inbound) {
        match packet {
            Inbound::Connect(_) => self.close(Close::abnormal(Goodbye::ProtocolError, "a second CONNECT")),
            Inbound::Publish(publish) => self.publish(*publish),
            Inbound::PubAck(packet_id) => self.puback(packet_id),
            Inbound::PubRec(packet_id) => self.pubrec(packet_id),
            Inbound::PubRel(packet_id) => self.pubrel(packet_id),
            Inbound::PubComp(packet_id) => self.pubcomp(packet_id),
            Inbound::Subscribe { packet_id, id, filters } => {
                self.actions.push_back(Action::Subscribe { packet_id, subscription_id: id, filters });
            }
            Inbound::Unsubscribe { packet_id, filters } => {
                self.actions.push_back(Action::Unsubscribe { packet_id, filters });
            }
            Inbound::PingReq => {
                self.encode(|codec, out| codec.pingresp(out));
            }
            Inbound::Disconnect { with_will, session_expiry_secs } => {
                if let Some(expiry) = session_expiry_secs {
                    self.session.expiry_secs = expiry;
                    if expiry == 0 && self.session.persistent {
                        // The session ends with this connection after all.
                        self.session.persistent = false;
                        self.session.end = true;
                    }
                }
                self.close(Close { will: with_will, goodbye: None });
            }
            Inbound::Unexpected(name) => {
                self.close(Close::abnormal(Goodbye::ProtocolError, format!("{name} is not a packet a client sends")));
            }
            Inbound::Invalid { goodbye, reason } => {
                self.counts.protocol_errors += 1;
                self.close(Close::abnormal(goodbye, reason));
            }
        }
    }

    /// The session as it is to be stored now (its subscriptions are the connection's to add);
    /// `disconnected_ms` once the connection has ended.
    pub(super) fn stored_session(&self, disconnected_ms: Option<i64>) -> StoredSession {
        StoredSession {
            expiry_secs: self.session.expiry_secs,
            disconnected_ms,
            subscriptions: Vec::new(),
            awaiting_release: self.inbound.stored_releases(),
            releasing: self.outbound.releasing(),
        }
    }

    /// Ends the connection for `close`: the goodbye a v5 client is told (in the output, which
    /// holds nothing else now), what becomes of the session, and the will to publish.
    pub(super) fn end(&mut self, close: &Close) -> Ending {
        self.out.clear();
        if let Some((goodbye, reason)) = &close.goodbye
            && self.codec.disconnect(*goodbye, reason, &mut self.out).is_err()
        {
            self.out.clear();
        }
        // Sent when the will delay is over or the session ends, whichever comes first.
        let session_left_secs = if self.session.persistent { self.session.expiry_secs } else { 0 };
        let will = self.session.will.take().filter(|_| close.will).map(|will| {
            let delay = Duration::from_secs(u64::from(will.delay_secs.min(session_left_secs)));
            (will, delay)
        });
        let session = match (self.session.persistent, self.session.end) {
            (true, _) => SessionEnd::Keep,
            (false, true) => SessionEnd::Delete,
            (false, false) => SessionEnd::Forget,
        };
        Ending { session, will }
    }

    fn persist_if_persistent(&mut self) {
        if self.session.persistent {
            self.actions.push_back(Action::PersistSession);
        }
    }

    fn close(&mut self, close: Close) {
        self.actions.push_back(Action::Close(close));
    }

    /// Encodes an answer into the output; an encoding failure ends the connection (false).
    fn encode(&mut self, encode: impl FnOnce(&mut Codec, &mut BytesMut) -> Result<(), EncodeError>) -> bool {
        match encode(&mut self.codec, &mut self.out) {
            Ok(()) => true,
            Err(error) => {
                self.close(Close::abnormal(Goodbye::Unavailable, format!("encoding an answer failed: {error}")));
                false
            }
        }
    }
}

/// How a connection ends for `interruption`.
pub(super) fn interrupted(interruption: Interruption) -> Close {
    match interruption {
        Interruption::TakenOver => {
            Close::abnormal(Goodbye::SessionTakenOver, "another connection took this client id over")
        }
        Interruption::ShuttingDown => {
            Close { will: false, goodbye: Some((Goodbye::ShuttingDown, "the server is shutting down".into())) }
        }
        Interruption::KeepAliveExpired => {
            Close::abnormal(Goodbye::KeepAliveTimeout, "no packet within 1.5 times the keep-alive")
        }
        Interruption::ConnectionLost => Close { will: true, goodbye: None },
    }
}
