//! Inbound QoS flows: a PUBLISH from the client until it is done with.
//!
//! - QoS 0: stored, never acknowledged.
//! - QoS 1: stored, then PUBACK (in the order of the PUBLISHes).
//! - QoS 2: stored once, then PUBREC; it awaits its PUBREL, and a resend meanwhile is
//!   acknowledged again without being stored again; PUBREL is answered with PUBCOMP. A
//!   persistent session notes where each such message goes, and writes that down before the
//!   message is queued, so that a resend after a crash can look for it there.
//!
//! Our receive maximum as MQTT 5 counts it (§4.9): a QoS 1 publish is outstanding until its
//! PUBACK, a QoS 2 one until its PUBCOMP (through PUBREC and PUBREL) or until a refusal. A 5.0
//! client with the receive maximum outstanding that sends one more has broken the protocol
//! (DISCONNECT 0x93). 3.1.1 has no receive maximum: a client that outruns the disk waits, its
//! publish held and nothing more read from it until a slot frees; its QoS 2 publishes give
//! their slot back with their PUBREC, since a PUBREL queued behind a waiting publish would
//! never come.

use std::collections::{HashMap, HashSet};
use std::num::NonZeroU16;

use bytes::Bytes;
use onehop_engine::Text;
use rmqtt_codec::types::{Publish, QoS};

use super::{Ack, Action, Close, Machine};
use crate::mqtt::MqttConfig;
use crate::mqtt::headers::{CLIENT_HEADER, MessageProperties, PACKET_HEADER, message_headers};
use crate::mqtt::proto::{Goodbye, Refusal, Version};
use crate::mqtt::sessions::{StoredRelease, StoredSession};

/// The inbound half of a connection's protocol state.
pub(super) struct Received {
    /// Our receive maximum.
    receive_max: usize,
    /// QoS 1/2 publishes taken and not yet done with: at most `receive_max`.
    outstanding: usize,
    /// 5.0 QoS 2 publishes whose slot is held until their PUBREL (or their refusal).
    held: HashSet<NonZeroU16>,
    /// QoS 2 publishes stored (or being stored), awaiting PUBREL: a resend is not stored
    /// again. A persistent session keeps where each went.
    awaiting_release: HashMap<NonZeroU16, Option<StoredRelease>>,
    /// From the session a reconnect found: QoS 2 publishes that were awaiting PUBREL, which
    /// may or may not have been stored before a crash. A resend is looked for in the log.
    in_doubt: HashMap<NonZeroU16, StoredRelease>,
    /// A QoS 2 publish was noted that the stored session does not list yet: the session is
    /// written before the message is queued.
    persist_due: bool,
    /// A 3.1.1 publish taken with the receive maximum outstanding, waiting for a slot.
    waiting: Option<Incoming>,
    /// v5 topic aliases the client defined.
    aliases: HashMap<u16, Text>,
    topic_alias_max: u16,
    /// The client id as shared bytes, for the header of every 5.0 publish.
    client_id: Bytes,
}

/// A PUBLISH from the client, its topic alias resolved and its properties read.
#[derive(Debug)]
pub(in crate::mqtt) struct Incoming {
    pub(in crate::mqtt) topic: Text,
    pub(in crate::mqtt) payload: Bytes,
    qos: QoS,
    packet_id: Option<NonZeroU16>,
    retain: bool,
    properties: MessageProperties,
}

impl Incoming {
    /// The acknowledgement it is owed: none at QoS 0.
    fn ack(&self) -> Option<(QoS, NonZeroU16)> {
        self.packet_id.filter(|_| self.qos != QoS::AtMostOnce).map(|packet_id| (self.qos, packet_id))
    }

    /// Its packet id, if it is a QoS 2 publish.
    fn exactly_once(&self) -> Option<NonZeroU16> {
        self.packet_id.filter(|_| self.qos == QoS::ExactlyOnce)
    }
}

/// What a message to store is owed once stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::mqtt) struct Receipt {
    /// Its acknowledgement (PUBACK at QoS 1, PUBREC at QoS 2), if any.
    pub(in crate::mqtt) ack: Option<(QoS, NonZeroU16)>,
    /// Whether its acknowledgement gives back a receive-maximum slot (a 5.0 QoS 2 publish's
    /// slot comes back with its PUBREL instead).
    pub(in crate::mqtt) slot: bool,
}

/// A message from the client to store.
#[derive(Debug)]
pub(in crate::mqtt) struct Message {
    /// As the packet holds it (sharing its read buffer).
    pub(in crate::mqtt) topic: Text,
    pub(in crate::mqtt) payload: Bytes,
    pub(in crate::mqtt) qos: QoS,
    pub(in crate::mqtt) retain: bool,
    /// Its QoS, properties and retain flag as record headers, and who published it.
    pub(in crate::mqtt) headers: Vec<(Text, Option<Bytes>)>,
    pub(in crate::mqtt) receipt: Receipt,
}

/// Whether a publish may be taken now.
enum Admission {
    /// Taken; whether its acknowledgement gives its slot back.
    Taken { slot: bool },
    /// 3.1.1, the receive maximum outstanding: it waits.
    Wait,
    /// 5.0, the receive maximum outstanding: a protocol error.
    Exceeded,
}

impl Received {
    pub(super) fn new(config: &MqttConfig, client_id: &str) -> Received {
        Received {
            receive_max: usize::from(config.receive_max),
            outstanding: 0,
            held: HashSet::new(),
            awaiting_release: HashMap::new(),
            in_doubt: HashMap::new(),
            persist_due: false,
            waiting: None,
            aliases: HashMap::new(),
            topic_alias_max: config.topic_alias_max,
            client_id: Bytes::from(client_id.to_string()),
        }
    }

    /// Takes up what a stored session awaited the PUBREL of: in doubt until resent.
    pub(super) fn restore(&mut self, stored: &StoredSession) {
        self.in_doubt = stored
            .awaiting_release
            .iter()
            .filter_map(|release| Some((NonZeroU16::new(release.packet_id)?, release.clone())))
            .collect();
    }

    /// What a session stores of the QoS 2 messages awaiting PUBREL, by packet id.
    pub(super) fn stored_releases(&self) -> Vec<StoredRelease> {
        let mut releases: Vec<StoredRelease> =
            self.awaiting_release.values().flatten().cloned().chain(self.in_doubt.values().cloned()).collect();
        releases.sort_by_key(|release| release.packet_id);
        releases
    }

    /// Whether a publish owed `ack` may be taken now (and counts it if so): one owed none
    /// (QoS 0) always may.
    fn admit(&mut self, ack: Option<(QoS, NonZeroU16)>, version: Version) -> Admission {
        let Some((qos, packet_id)) = ack else { return Admission::Taken { slot: false } };
        if self.outstanding >= self.receive_max {
            return if version == Version::V5 { Admission::Exceeded } else { Admission::Wait };
        }
        self.outstanding += 1;
        if qos == QoS::ExactlyOnce && version == Version::V5 {
            self.held.insert(packet_id);
            return Admission::Taken { slot: false };
        }
        Admission::Taken { slot: true }
    }

    /// Gives back the slot QoS 2 publish `packet_id` held, if it held one; whether it did.
    fn release_held(&mut self, packet_id: NonZeroU16) -> bool {
        let held = self.held.remove(&packet_id);
        self.outstanding -= usize::from(held);
        held
    }
}

impl Machine {
    /// Whether a publish waits for a receive-maximum slot (3.1.1): the connection reads and
    /// decodes nothing more meanwhile, and queues what it has gathered, whose
    /// acknowledgements free slots.
    pub(in crate::mqtt) fn is_waiting(&self) -> bool {
        self.inbound.waiting.is_some()
    }

    /// Notes QoS 2 message `packet_id` as stored (or being stored) until its PUBREL; a
    /// persistent session notes `location` (where it goes, read just before it is queued) and
    /// is written down before the message is queued ([`Self::take_persist_due`]).
    pub(in crate::mqtt) fn note_stored(&mut self, packet_id: NonZeroU16, location: impl FnOnce() -> StoredRelease) {
        let release = self.session.persistent.then(location);
        self.inbound.persist_due |= release.is_some();
        self.inbound.awaiting_release.insert(packet_id, release);
    }

    /// Whether the session must be written before what is gathered is queued; the answer is
    /// given once.
    pub(in crate::mqtt) fn take_persist_due(&mut self) -> bool {
        std::mem::take(&mut self.inbound.persist_due)
    }

    pub(super) fn publish(&mut self, publish: Publish) {
        self.counts.publishes_received += 1;
        let incoming = match self.incoming(publish) {
            Ok(incoming) => incoming,
            Err(close) => return self.close(close),
        };
        if let Some(packet_id) = incoming.exactly_once() {
            // A message already stored (or, after a crash, found in the log where the session
            // said it would go) is acknowledged again, in its turn, and not stored again.
            // Clients do not all set DUP on a resend, so the log decides: the same packet id,
            // topic and payload from this client where the session said it would go.
            if let Some(release) = self.inbound.in_doubt.remove(&packet_id) {
                return self.actions.push_back(Action::LookUp { incoming, release });
            }
            if self.inbound.awaiting_release.contains_key(&packet_id) {
                return self.acknowledge_again(packet_id);
            }
        }
        self.admit(incoming);
    }

    /// `publish` with its topic alias resolved and its properties read, or why the connection
    /// ends for it.
    fn incoming(&mut self, publish: Publish) -> Result<Incoming, Close> {
        let Publish { qos, topic, packet_id, payload, properties, retain, .. } = publish;
        // The topic as the packet holds it, shared rather than copied (the codec checked its
        // UTF-8; this check cannot fail, but costs little next to a copy).
        let Ok(mut topic) = Text::from_utf8(topic.into_bytes()) else {
            return Err(Close::abnormal(Goodbye::ProtocolError, "the topic is not valid UTF-8"));
        };
        let Some(properties) = properties else {
            let properties = MessageProperties::default();
            return Ok(Incoming { topic, payload, qos, packet_id, retain, properties });
        };
        if let Some(alias) = properties.topic_alias {
            if alias.get() > self.inbound.topic_alias_max {
                return Err(Close::abnormal(
                    Goodbye::TopicAliasInvalid,
                    format!("topic alias {alias} is above the maximum"),
                ));
            }
            if topic.is_empty() {
                let Some(known) = self.inbound.aliases.get(&alias.get()) else {
                    return Err(Close::abnormal(
                        Goodbye::TopicAliasInvalid,
                        format!("topic alias {alias} was never set"),
                    ));
                };
                topic = known.clone();
            } else {
                // A copy: the topic shares the packet's read buffer, which an alias kept for
                // the connection's life would otherwise hold on to.
                self.inbound.aliases.insert(alias.get(), Text::from(topic.as_str()));
            }
        }
        let properties = MessageProperties::of_publish(&properties);
        if let Some(fault) = properties.fault() {
            return Err(Close::abnormal(Goodbye::ProtocolError, fault));
        }
        Ok(Incoming { topic, payload, qos, packet_id, retain, properties })
    }

    /// Takes `incoming` if the receive maximum allows: it is to be stored.
    fn admit(&mut self, incoming: Incoming) {
        match self.inbound.admit(incoming.ack(), self.codec.version()) {
            Admission::Taken { slot } => {
                let message = self.message(incoming, slot);
                self.actions.push_back(Action::Store(message));
            }
            Admission::Wait => self.inbound.waiting = Some(incoming),
            Admission::Exceeded => self.close(Close::abnormal(
                Goodbye::ReceiveMaximumExceeded,
                "more QoS 1/2 publishes outstanding than the receive maximum (QoS 2 until PUBCOMP)",
            )),
        }
    }

    /// The message to store for `incoming`, with its record headers.
    fn message(&self, incoming: Incoming, slot: bool) -> Message {
        let receipt = Receipt { ack: incoming.ack(), slot };
        let Incoming { topic, payload, qos, packet_id, retain, properties } = incoming;
        let mut headers = message_headers(qos, properties, retain, (self.clock)());
        let exactly_once = qos == QoS::ExactlyOnce && self.session.persistent;
        if self.codec.version() == Version::V5 || exactly_once {
            // A 5.0 subscription can ask not to get its own client's messages back.
            headers.push((Text::from_static(CLIENT_HEADER), Some(self.inbound.client_id.clone())));
        }
        if exactly_once && let Some(packet_id) = packet_id {
            headers.push((Text::from_static(PACKET_HEADER), Some(Bytes::from(packet_id.get().to_string()))));
        }
        Message { topic, payload, qos, retain, headers, receipt }
    }

    /// What the log said of a resent QoS 2 message a restored session was in doubt about.
    pub(super) fn looked_up(&mut self, incoming: Incoming, release: StoredRelease, found: bool) {
        let Some(packet_id) = incoming.exactly_once() else { return self.admit(incoming) };
        if found {
            self.inbound.awaiting_release.insert(packet_id, Some(release));
        }
        if found || self.inbound.awaiting_release.contains_key(&packet_id) {
            return self.acknowledge_again(packet_id);
        }
        self.admit(incoming);
    }

    /// PUBREC again for a QoS 2 message already stored, in its turn.
    fn acknowledge_again(&mut self, packet_id: NonZeroU16) {
        let ack = Ack { packets: vec![(QoS::ExactlyOnce, packet_id)], outcome: Ok(()), slots: 0 };
        self.actions.push_back(Action::AckInTurn(ack));
    }

    /// A message that could not be stored, refused as the client's version says: a QoS 0 one
    /// dropped, a 3.1.1 client's disconnected, a 5.0 client's acknowledged with the reason, in
    /// its turn.
    pub(super) fn refuse(&mut self, receipt: Receipt, refusal: Refusal, reason: String) {
        let Some((qos, packet_id)) = receipt.ack else {
            tracing::debug!(reason, "QoS 0 message dropped");
            return;
        };
        self.inbound.awaiting_release.remove(&packet_id);
        if self.codec.version() == Version::V3 {
            return self.close(Close::abnormal(Goodbye::TopicNameInvalid, reason));
        }
        let slots = usize::from(receipt.slot);
        let ack = Ack { packets: vec![(qos, packet_id)], outcome: Err((refusal, reason)), slots };
        self.actions.push_back(Action::AckInTurn(ack));
    }

    /// Acknowledgements whose messages are stored, or refused: PUBACK or PUBREC, with the
    /// reason for a refusal (a 3.1.1 client has no negative acknowledgement: it is
    /// disconnected).
    pub(super) fn acknowledge(&mut self, ack: Ack) {
        self.inbound.outstanding -= ack.slots;
        if let Err((_, reason)) = &ack.outcome {
            for &(qos, packet_id) in &ack.packets {
                self.inbound.awaiting_release.remove(&packet_id);
                if qos == QoS::ExactlyOnce {
                    // A refused QoS 2 publish is done with at its PUBREC.
                    self.inbound.release_held(packet_id);
                }
            }
            if self.codec.version() == Version::V3 {
                return self.close(Close::abnormal(Goodbye::Unavailable, reason.clone()));
            }
        }
        for (qos, packet_id) in ack.packets {
            let outcome = ack.outcome.clone();
            if !self.encode(|codec, out| codec.publish_ack(qos, packet_id, outcome, out)) {
                return;
            }
        }
        self.admit_waiting();
    }

    /// What the session awaited the PUBREL of is done with: PUBCOMP.
    pub(super) fn pubrel(&mut self, packet_id: NonZeroU16) {
        self.inbound.awaiting_release.remove(&packet_id);
        self.inbound.in_doubt.remove(&packet_id);
        self.inbound.release_held(packet_id);
        self.encode(|codec, out| codec.publish_ack2(false, packet_id, out));
        self.admit_waiting();
    }

    /// Takes the waiting publish if a slot is free now.
    fn admit_waiting(&mut self) {
        if let Some(incoming) = self.inbound.waiting.take() {
            self.admit(incoming);
        }
    }

    /// What a persistent session settles after its connection ended: a message whose storing
    /// failed awaits no PUBREL.
    pub(in crate::mqtt) fn settle(&mut self, ack: &Ack) {
        if ack.outcome.is_err() {
            for (_, packet_id) in &ack.packets {
                self.inbound.awaiting_release.remove(packet_id);
            }
        }
    }
}
