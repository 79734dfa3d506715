//! Outbound delivery: a message from a subscription until the client is done with it.
//!
//! - QoS 0: sent; done.
//! - QoS 1: sent with a packet id; done at its PUBACK.
//! - QoS 2: sent with a packet id; at its PUBREC the client has it (a redelivery would be a
//!   duplicate), and a PUBREL goes out once the read that brought the PUBREC is handled (a
//!   persistent session first writes down that the message is acknowledged, so it never comes
//!   again); done at its PUBCOMP.
//!
//! A message goes at the lower of its subscription's QoS and its publisher's, with DUP when a
//! previous connection of the session was sent it. The client's receive maximum bounds the
//! window of QoS 1/2 messages awaiting acknowledgement: while it is full, the connection takes
//! nothing more from its subscriptions' queue.

use std::collections::HashMap;
use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;

use bytestring::ByteString;
use onehop_engine::Text;
use onehop_engine::hub::Event;
use rmqtt_codec::error::EncodeError;
use rmqtt_codec::types::{Publish, QoS};

use super::{Action, Close, Machine};
use crate::mqtt::headers::{EXPIRES_HEADER, QOS_HEADER, RETAIN_HEADER, publish_properties};
use crate::mqtt::progress::{Acked, SharedProgress};
use crate::mqtt::proto::{Goodbye, Version, qos_rank};

/// What subscriptions hand the connection.
pub(in crate::mqtt) enum Outbound {
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
    /// A subscription could not carry on: it fell behind past the log.
    CutOff,
    /// A subscription may no longer read what it follows (a grant revoked, the user or the
    /// token this connection logged in with dropped or expired): the connection ends as not
    /// authorized, with the reason.
    Revoked(String),
}

/// What an outgoing QoS 1/2 message awaits from the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Awaiting {
    /// PUBACK (QoS 1).
    Acknowledgement,
    /// PUBREC (QoS 2).
    Receipt,
    /// PUBCOMP (QoS 2, PUBREL sent).
    Completion,
}

/// The outbound half of a connection's protocol state.
pub(super) struct InFlight {
    /// QoS 1/2 messages sent and not yet done with, each with its mark in its subscription's
    /// progress (until the client has it).
    window: HashMap<NonZeroU16, (Awaiting, Option<Acked>)>,
    next_packet_id: u16,
    /// The client's receive maximum: the most messages `window` holds.
    window_max: usize,
    /// PUBRECs received in this read: their PUBRELs go out once it is handled.
    pubrel_due: Vec<NonZeroU16>,
}

impl InFlight {
    pub(super) fn new(client_receive_max: u16) -> InFlight {
        InFlight {
            window: HashMap::new(),
            next_packet_id: 1,
            window_max: usize::from(client_receive_max.max(1)),
            pubrel_due: Vec::new(),
        }
    }

    /// What a session stores of the QoS 2 messages whose PUBREL went out: their packet ids.
    pub(super) fn releasing(&self) -> Vec<u16> {
        let mut releasing: Vec<u16> = self
            .window
            .iter()
            .filter(|(_, (stage, _))| *stage == Awaiting::Completion)
            .map(|(packet_id, _)| packet_id.get())
            .collect();
        releasing.sort_unstable();
        releasing
    }

    /// A packet id no message in the window holds.
    fn allocate_packet_id(&mut self) -> NonZeroU16 {
        loop {
            let id = NonZeroU16::new(self.next_packet_id).unwrap_or(NonZeroU16::MIN);
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            if !self.window.contains_key(&id) {
                return id;
            }
        }
    }
}

/// The text of a record's header `name`, if it has one in UTF-8.
fn header<'a>(event: &'a Event, name: &str) -> Option<&'a str> {
    event.record.headers.get(name).and_then(|value| std::str::from_utf8(value).ok())
}

/// A message's QoS as its publisher gave it (records published over HTTP count as QoS 1).
fn published_qos(event: &Event) -> QoS {
    match header(event, QOS_HEADER) {
        Some("0") => QoS::AtMostOnce,
        Some("2") => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

/// When a message with an expiry expires: `Err` once it has, else the seconds it has left
/// (rounded up), for its v5 message expiry.
fn expiry_left(event: &Event, now_ms: i64) -> Result<Option<NonZeroU32>, ()> {
    let Some(expires_ms) = header(event, EXPIRES_HEADER).and_then(|text| text.parse::<i64>().ok()) else {
        return Ok(None);
    };
    let left_ms = expires_ms - now_ms;
    if left_ms <= 0 {
        return Err(());
    }
    Ok(NonZeroU32::new(((left_ms + 999) / 1000).min(i64::from(u32::MAX)) as u32))
}

impl Machine {
    /// Whether the client's receive maximum leaves room for another message.
    pub(in crate::mqtt) fn window_open(&self) -> bool {
        self.outbound.window.len() < self.outbound.window_max
    }

    /// Sends a message from a subscription (or ends the connection for a subscription that
    /// could not carry on).
    pub(super) fn deliver(&mut self, outbound: Outbound) {
        let (event, qos, subscription_id, retain, retain_as_published, progress, dup) = match outbound {
            Outbound::Message { event, qos, subscription_id, retain, retain_as_published, progress, dup } => {
                (event, qos, subscription_id, retain, retain_as_published, progress, dup)
            }
            Outbound::CutOff => {
                let reason = "this client fell behind its subscriptions past what the log still holds";
                return self.close(Close::abnormal(Goodbye::QuotaExceeded, reason));
            }
            Outbound::Revoked(reason) => return self.close(Close::abnormal(Goodbye::NotAuthorized, reason)),
        };
        let acked = progress.map(|progress| Acked {
            progress,
            stream: event.stream.clone(),
            partition: event.partition,
            offset: event.record.offset,
        });
        let published = published_qos(&event);
        let qos = if qos_rank(published) < qos_rank(qos) { published } else { qos };
        let Ok(expiry) = expiry_left(&event, (self.clock)()) else {
            self.counts.messages_expired += 1;
            return mark(acked);
        };
        let record = &event.record;
        let packet_id = (qos != QoS::AtMostOnce).then(|| self.outbound.allocate_packet_id());
        let properties =
            (self.codec.version() == Version::V5).then(|| publish_properties(&record.headers, expiry, subscription_id));
        let publish = Publish {
            // DUP only means something for QoS 1 and 2 (and must be 0 at QoS 0).
            dup: dup && qos != QoS::AtMostOnce,
            retain: retain || (retain_as_published && header(&event, RETAIN_HEADER).is_some()),
            qos,
            topic: byte_string(&message_topic(&event)),
            packet_id,
            payload: record.value.clone().unwrap_or_default(),
            properties,
        };
        match self.codec.publish(publish, &mut self.out) {
            Ok(()) => {
                self.counts.messages_sent += 1;
                match packet_id {
                    Some(packet_id) => {
                        let stage = if qos == QoS::ExactlyOnce { Awaiting::Receipt } else { Awaiting::Acknowledgement };
                        self.outbound.window.insert(packet_id, (stage, acked));
                    }
                    // QoS 0: done once sent.
                    None => mark(acked),
                }
            }
            Err(EncodeError::OverMaxPacketSize { .. }) => {
                // MQTT 5: a message larger than the client accepts is discarded for that client.
                self.counts.messages_too_large += 1;
                mark(acked);
            }
            Err(error) => {
                self.close(Close::abnormal(Goodbye::Unavailable, format!("encoding a message failed: {error}")));
            }
        }
    }

    pub(super) fn puback(&mut self, packet_id: NonZeroU16) {
        if self.outbound.window.get(&packet_id).is_some_and(|(stage, _)| *stage == Awaiting::Acknowledgement)
            && let Some((_, acked)) = self.outbound.window.remove(&packet_id)
        {
            mark(acked);
        }
    }

    pub(super) fn pubrec(&mut self, packet_id: NonZeroU16) {
        if let Some((stage, acked)) = self.outbound.window.get_mut(&packet_id)
            && *stage == Awaiting::Receipt
        {
            // The client has it: a redelivery would be a duplicate.
            *stage = Awaiting::Completion;
            mark(acked.take());
        }
        self.outbound.pubrel_due.push(packet_id);
    }

    pub(super) fn pubcomp(&mut self, packet_id: NonZeroU16) {
        if self.outbound.window.get(&packet_id).is_some_and(|(stage, _)| *stage == Awaiting::Completion) {
            self.outbound.window.remove(&packet_id);
        }
    }

    /// Sends the PUBRELs of the PUBRECs just received — a persistent session first records
    /// that those messages are acknowledged, so none of them is ever sent again.
    pub(super) fn release_due(&mut self) {
        if self.outbound.pubrel_due.is_empty() {
            return;
        }
        if self.session.persistent {
            self.actions.push_back(Action::PersistSession);
        }
        for packet_id in std::mem::take(&mut self.outbound.pubrel_due) {
            if !self.encode(|codec, out| codec.publish_ack2(true, packet_id, out)) {
                return;
            }
        }
    }

    /// The PUBRELs of QoS 2 messages a previous connection of the session had PUBREC'd, sent
    /// again.
    pub(super) fn resend_releases(&mut self, releasing: &[u16]) {
        for packet_id in releasing.iter().filter_map(|&id| NonZeroU16::new(id)) {
            self.outbound.window.insert(packet_id, (Awaiting::Completion, None));
            if self.codec.publish_ack2(true, packet_id, &mut self.out).is_err() {
                break;
            }
        }
    }
}

/// Marks a delivery acknowledged in its subscription's progress, if it is tracked.
fn mark(acked: Option<Acked>) {
    if let Some(acked) = acked {
        acked.mark();
    }
}

/// The MQTT topic of a record: its subject, or for a table change `{table}/{id}`, or else the
/// stream's name.
pub(in crate::mqtt) fn message_topic(event: &Event) -> Text {
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
