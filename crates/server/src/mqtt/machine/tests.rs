//! The protocol state machine driven by packets and events, with no socket, no engine and no
//! runtime: what it answers is read back from its output with a client's codec.

use std::num::{NonZeroU16, NonZeroU32};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use bytestring::ByteString;
use onehop_engine::hub::Event as HubEvent;
use onehop_engine::{Headers, Record, Text};
use rmqtt_codec::types::{Publish, QoS};
use rmqtt_codec::{v3, v5};
use tokio_util::codec::Decoder;

use super::*;
use crate::mqtt::headers::{CLIENT_HEADER, EXPIRES_HEADER, QOS_HEADER};
use crate::mqtt::progress::{Resumed, SharedProgress};
use crate::mqtt::proto::{Refusal, Version};
use crate::mqtt::sessions::{StoredRelease, StoredSubscription};

/// The machine's clock in these tests, in ms since the Unix epoch.
const NOW_MS: i64 = 1_000_000;

/// What the machine sent, as a client reads it.
#[derive(Debug, PartialEq, Eq)]
enum Sent {
    Publish { packet_id: Option<u16>, qos: u8, dup: bool, topic: String },
    PubAck(u16, u8),
    PubRec(u16, u8),
    PubRel(u16),
    PubComp(u16),
    SubAck(u16),
    PingResp,
    Disconnect(u8),
}

fn id(packet_id: u16) -> NonZeroU16 {
    NonZeroU16::new(packet_id).unwrap()
}

/// How a client connects in a test.
struct Client {
    version: Version,
    session_expiry_secs: u32,
    /// The client's receive maximum.
    receive_max: u16,
    will: Option<Will>,
}

impl Client {
    fn v5() -> Client {
        Client { version: Version::V5, session_expiry_secs: 0, receive_max: u16::MAX, will: None }
    }

    fn v3() -> Client {
        Client { version: Version::V3, ..Client::v5() }
    }

    fn persistent(self) -> Client {
        Client { session_expiry_secs: 3600, ..self }
    }

    fn receive_max(self, receive_max: u16) -> Client {
        Client { receive_max, ..self }
    }

    /// The machine of this client's connection, our receive maximum `receive_max`.
    fn connect(&self, receive_max: u16) -> Machine {
        let connect = Connect {
            client_id: "c1".into(),
            clean_start: self.session_expiry_secs == 0,
            keep_alive_secs: 0,
            session_expiry_secs: self.session_expiry_secs,
            username: None,
            password: None,
            will: self.will.clone(),
            receive_max: self.receive_max,
            max_packet_size: None,
        };
        let config = MqttConfig { receive_max, topic_alias_max: 4, ..MqttConfig::default() };
        let mut machine = Machine::new(Codec::new(self.version, 1 << 20), &connect, "c1", &config);
        machine.clock = || NOW_MS;
        machine
    }
}

fn publish_with(qos: QoS, packet_id: u16, topic: &str, properties: Option<v5::PublishProperties>) -> Event {
    Event::Packet(Inbound::Publish(Box::new(Publish {
        dup: false,
        retain: false,
        qos,
        topic: ByteString::from(topic),
        packet_id: NonZeroU16::new(packet_id),
        payload: Bytes::from_static(b"m"),
        properties,
    })))
}

fn publish(qos: QoS, packet_id: u16) -> Event {
    publish_with(qos, packet_id, "sensors/1", Some(v5::PublishProperties::default()))
}

fn packet(packet: Inbound) -> Event {
    Event::Packet(packet)
}

/// The actions the machine asks for, in order.
fn actions(machine: &mut Machine) -> Vec<Action> {
    std::iter::from_fn(|| machine.next_action()).collect()
}

/// The message of the only action, which must be a Store.
fn the_store(machine: &mut Machine) -> Message {
    let mut actions = actions(machine);
    assert_eq!(actions.len(), 1, "{actions:?}");
    match actions.remove(0) {
        Action::Store(message) => message,
        other => panic!("a message to store, not {other:?}"),
    }
}

/// The acknowledgement to hand back in turn, of the only action.
fn the_ack_in_turn(machine: &mut Machine) -> Ack {
    let mut actions = actions(machine);
    assert_eq!(actions.len(), 1, "{actions:?}");
    match actions.remove(0) {
        Action::AckInTurn(ack) => ack,
        other => panic!("an acknowledgement in turn, not {other:?}"),
    }
}

/// The close of the only action.
fn the_close(machine: &mut Machine) -> Close {
    let mut actions = actions(machine);
    assert_eq!(actions.len(), 1, "{actions:?}");
    match actions.remove(0) {
        Action::Close(close) => close,
        other => panic!("the end of the connection, not {other:?}"),
    }
}

/// The acknowledgements of `receipts`, their messages stored, as the connection hands them back.
fn stored(receipts: &[Receipt]) -> Event {
    let packets = receipts.iter().filter_map(|receipt| receipt.ack).collect();
    let slots = receipts.iter().filter(|receipt| receipt.slot).count();
    Event::Stored(Ack { packets, outcome: Ok(()), slots })
}

/// What the machine has sent since last asked, read with a client's codec of its version.
fn sent(machine: &mut Machine) -> Vec<Sent> {
    let mut bytes = std::mem::take(machine.output());
    let mut packets = Vec::new();
    match machine.codec.version() {
        Version::V5 => {
            let mut codec = v5::Codec::new(0, 0);
            while let Some((packet, _)) = codec.decode(&mut bytes).unwrap() {
                packets.push(from_v5(packet));
            }
        }
        Version::V3 => {
            let mut codec = v3::Codec::new(0);
            while let Some((packet, _)) = codec.decode(&mut bytes).unwrap() {
                packets.push(from_v3(packet));
            }
        }
    }
    assert!(bytes.is_empty(), "whole packets only");
    packets
}

fn from_v5(packet: v5::Packet) -> Sent {
    match packet {
        v5::Packet::Publish(publish) => Sent::Publish {
            packet_id: publish.packet_id.map(NonZeroU16::get),
            qos: publish.qos as u8,
            dup: publish.dup,
            topic: publish.topic.to_string(),
        },
        v5::Packet::PublishAck(ack) => Sent::PubAck(ack.packet_id.get(), ack.reason_code as u8),
        v5::Packet::PublishReceived(ack) => Sent::PubRec(ack.packet_id.get(), ack.reason_code as u8),
        v5::Packet::PublishRelease(ack) => Sent::PubRel(ack.packet_id.get()),
        v5::Packet::PublishComplete(ack) => Sent::PubComp(ack.packet_id.get()),
        v5::Packet::SubscribeAck(ack) => Sent::SubAck(ack.packet_id.get()),
        v5::Packet::PingResponse => Sent::PingResp,
        v5::Packet::Disconnect(disconnect) => Sent::Disconnect(disconnect.reason_code as u8),
        other => panic!("a server does not send {other:?}"),
    }
}

fn from_v3(packet: v3::Packet) -> Sent {
    match packet {
        v3::Packet::Publish(publish) => Sent::Publish {
            packet_id: publish.packet_id.map(NonZeroU16::get),
            qos: publish.qos as u8,
            dup: publish.dup,
            topic: publish.topic.to_string(),
        },
        v3::Packet::PublishAck { packet_id } => Sent::PubAck(packet_id.get(), 0),
        v3::Packet::PublishReceived { packet_id } => Sent::PubRec(packet_id.get(), 0),
        v3::Packet::PublishRelease { packet_id } => Sent::PubRel(packet_id.get()),
        v3::Packet::PublishComplete { packet_id } => Sent::PubComp(packet_id.get()),
        other => panic!("not expected here: {other:?}"),
    }
}

/// A message of stream `s` at `offset`, published at `published` QoS, for a subscription of
/// `qos`, noted in `progress` when given.
fn delivery(offset: u64, published: &'static [u8], qos: QoS, progress: Option<&SharedProgress>) -> Outbound {
    delivery_with(offset, &[(QOS_HEADER, published)], qos, progress)
}

fn delivery_with(
    offset: u64,
    headers: &[(&'static str, &'static [u8])],
    qos: QoS,
    progress: Option<&SharedProgress>,
) -> Outbound {
    let headers: Vec<(Text, Bytes)> =
        headers.iter().map(|(name, value)| (Text::from_static(name), Bytes::from_static(value))).collect();
    let record = Record {
        offset,
        timestamp_ms: 0,
        key: None,
        subject: Some(Text::from("s/1")),
        headers: Headers::from(&headers[..]),
        value: Some(Bytes::from_static(b"m")),
    };
    Outbound::Message {
        event: Arc::new(HubEvent::new(Arc::from("s"), 0, record, false)),
        qos,
        subscription_id: None,
        retain: false,
        retain_as_published: false,
        progress: progress.cloned(),
        dup: false,
    }
}

/// A subscription's progress on stream `s` (one partition), with offsets `delivered` handed
/// over for delivery.
fn progress(delivered: std::ops::Range<u64>) -> SharedProgress {
    let progress = SharedProgress::default();
    progress.lock().unwrap().start("s", &[delivered.start]);
    for offset in delivered {
        progress.lock().unwrap().delivered("s", 0, offset, &[offset + 1]);
    }
    progress
}

fn committed(progress: &SharedProgress) -> u64 {
    progress.lock().unwrap().committed()["s"][0]
}

#[test]
fn a_qos1_publish_is_stored_then_acknowledged() {
    let mut machine = Client::v5().connect(8);
    machine.handle(publish(QoS::AtLeastOnce, 7));
    let message = the_store(&mut machine);
    assert_eq!(message.receipt, Receipt { ack: Some((QoS::AtLeastOnce, id(7))), slot: true });
    assert_eq!(message.topic.as_str(), "sensors/1");
    let header =
        |name: &str| message.headers.iter().find(|(header, _)| header.as_str() == name).and_then(|(_, v)| v.as_ref());
    assert_eq!(header(QOS_HEADER).map(|value| &value[..]), Some(&b"1"[..]));
    assert_eq!(header(CLIENT_HEADER).map(|value| &value[..]), Some(&b"c1"[..]), "for no local");
    assert_eq!(sent(&mut machine), [], "no PUBACK before the message is stored");
    machine.handle(stored(&[message.receipt]));
    assert_eq!(sent(&mut machine), [Sent::PubAck(7, 0)]);
}

#[test]
fn a_qos0_publish_is_stored_and_never_acknowledged() {
    let mut machine = Client::v5().connect(1);
    for _ in 0..3 {
        machine.handle(publish(QoS::AtMostOnce, 0));
        assert_eq!(the_store(&mut machine).receipt, Receipt { ack: None, slot: false }, "no receive-maximum slot");
    }
    assert_eq!(sent(&mut machine), []);
}

#[test]
fn a_refused_publish_is_acknowledged_with_its_reason_in_5_0_and_disconnected_in_3_1_1() {
    let mut machine = Client::v5().connect(8);
    machine.handle(publish(QoS::AtLeastOnce, 1));
    let receipt = the_store(&mut machine).receipt;
    machine.handle(Event::Refused { receipt, refusal: Refusal::NotAuthorized, reason: "no".into() });
    let ack = the_ack_in_turn(&mut machine);
    assert_eq!(ack.slots, 1);
    machine.handle(Event::Stored(ack));
    assert_eq!(sent(&mut machine), [Sent::PubAck(1, v5::PublishAckReason::NotAuthorized as u8)]);

    let mut machine = Client::v3().connect(8);
    machine.handle(publish_with(QoS::AtLeastOnce, 1, "$SYS/x", None));
    let receipt = the_store(&mut machine).receipt;
    machine.handle(Event::Refused { receipt, refusal: Refusal::TopicInvalid, reason: "reserved".into() });
    let close = the_close(&mut machine);
    assert_eq!(close, Close { will: true, goodbye: Some((Goodbye::TopicNameInvalid, "reserved".into())) });
}

#[test]
fn a_qos2_publish_is_stored_once_and_released_with_pubcomp() {
    let mut machine = Client::v5().connect(8);
    machine.handle(publish(QoS::ExactlyOnce, 3));
    let receipt = the_store(&mut machine).receipt;
    assert_eq!(receipt, Receipt { ack: Some((QoS::ExactlyOnce, id(3))), slot: false }, "held until PUBREL");
    machine.note_stored(id(3), || unreachable!("a session that ends with its connection notes no location"));
    assert!(!machine.take_persist_due());
    machine.handle(stored(&[receipt]));
    assert_eq!(sent(&mut machine), [Sent::PubRec(3, 0)]);
    // Resent before its PUBREL (with DUP or not): acknowledged again, in its turn, not stored.
    machine.handle(publish(QoS::ExactlyOnce, 3));
    let again = the_ack_in_turn(&mut machine);
    assert_eq!((again.packets.clone(), again.slots), (vec![(QoS::ExactlyOnce, id(3))], 0));
    machine.handle(Event::Stored(again));
    assert_eq!(sent(&mut machine), [Sent::PubRec(3, 0)]);
    machine.handle(packet(Inbound::PubRel(id(3))));
    assert_eq!(sent(&mut machine), [Sent::PubComp(3)]);
    // Released: the packet id is free for a new message.
    machine.handle(publish(QoS::ExactlyOnce, 3));
    assert!(matches!(&actions(&mut machine)[..], [Action::Store(_)]));
}

#[test]
fn a_persistent_session_notes_where_a_qos2_message_goes_before_it_is_queued() {
    let mut machine = Client::v5().persistent().connect(8);
    machine.handle(publish(QoS::ExactlyOnce, 4));
    let message = the_store(&mut machine);
    let header = |name: &str| message.headers.iter().any(|(header, _)| header.as_str() == name);
    assert!(header(crate::mqtt::headers::PACKET_HEADER), "its packet id travels with it, to be found again");
    let release = StoredRelease { packet_id: 4, stream: "sensors".into(), partition: 2, from: 40 };
    machine.note_stored(id(4), || release.clone());
    assert!(machine.take_persist_due(), "written down before it is queued");
    assert!(!machine.take_persist_due(), "once");
    assert_eq!(machine.stored_session(None).awaiting_release, [release]);
    machine.handle(stored(&[message.receipt]));
    machine.handle(packet(Inbound::PubRel(id(4))));
    assert_eq!(machine.stored_session(None).awaiting_release, []);
}

#[test]
fn the_receive_maximum_counts_qos1_until_puback_and_qos2_until_pubcomp() {
    let mut machine = Client::v5().connect(2);
    machine.handle(publish(QoS::ExactlyOnce, 1));
    let first = the_store(&mut machine).receipt;
    machine.handle(publish(QoS::AtLeastOnce, 2));
    let second = the_store(&mut machine).receipt;
    machine.handle(stored(&[first, second]));
    assert_eq!(sent(&mut machine), [Sent::PubRec(1, 0), Sent::PubAck(2, 0)]);
    // The QoS 1 one is done with at its PUBACK; the QoS 2 one holds its slot until PUBREL.
    machine.handle(publish(QoS::ExactlyOnce, 3));
    let third = the_store(&mut machine).receipt;
    machine.handle(stored(&[third]));
    assert_eq!(sent(&mut machine), [Sent::PubRec(3, 0)]);
    machine.handle(publish(QoS::AtLeastOnce, 4));
    let close = the_close(&mut machine);
    assert_eq!(close.goodbye.as_ref().map(|(goodbye, _)| *goodbye), Some(Goodbye::ReceiveMaximumExceeded));
    assert!(close.will);
    machine.end(&close);
    assert_eq!(sent(&mut machine), [Sent::Disconnect(0x93)]);

    // Released, a slot is free again.
    let mut machine = Client::v5().connect(1);
    machine.handle(publish(QoS::ExactlyOnce, 1));
    let receipt = the_store(&mut machine).receipt;
    machine.handle(stored(&[receipt]));
    machine.handle(packet(Inbound::PubRel(id(1))));
    machine.handle(publish(QoS::AtLeastOnce, 2));
    assert!(matches!(&actions(&mut machine)[..], [Action::Store(_)]));
}

#[test]
fn a_refused_qos2_publish_gives_its_slot_back_at_its_pubrec() {
    let mut machine = Client::v5().connect(1);
    machine.handle(publish(QoS::ExactlyOnce, 1));
    let receipt = the_store(&mut machine).receipt;
    machine.handle(Event::Refused { receipt, refusal: Refusal::QuotaExceeded, reason: "too large".into() });
    let ack = the_ack_in_turn(&mut machine);
    machine.handle(Event::Stored(ack));
    assert_eq!(sent(&mut machine), [Sent::PubRec(1, v5::PublishAckReason::QuotaExceeded as u8)]);
    machine.handle(publish(QoS::AtLeastOnce, 2));
    assert!(matches!(&actions(&mut machine)[..], [Action::Store(_)]), "the slot came back without a PUBREL");
}

#[test]
fn a_3_1_1_publish_beyond_the_receive_maximum_waits_for_a_slot() {
    let mut machine = Client::v3().connect(1);
    machine.handle(publish_with(QoS::AtLeastOnce, 1, "a/b", None));
    let first = the_store(&mut machine).receipt;
    machine.handle(publish_with(QoS::AtLeastOnce, 2, "a/b", None));
    assert!(actions(&mut machine).is_empty(), "not taken yet");
    assert!(machine.is_waiting(), "the connection reads nothing more meanwhile");
    machine.handle(stored(&[first]));
    assert_eq!(sent(&mut machine), [Sent::PubAck(1, 0)]);
    assert!(!machine.is_waiting());
    assert_eq!(the_store(&mut machine).receipt.ack, Some((QoS::AtLeastOnce, id(2))), "taken once a slot freed");

    // A 3.1.1 QoS 2 publish gives its slot back with its PUBREC: its PUBREL may be queued
    // behind a waiting publish.
    let mut machine = Client::v3().connect(1);
    machine.handle(publish_with(QoS::ExactlyOnce, 1, "a/b", None));
    let receipt = the_store(&mut machine).receipt;
    assert!(receipt.slot);
    machine.handle(stored(&[receipt]));
    machine.handle(publish_with(QoS::AtLeastOnce, 2, "a/b", None));
    assert!(!machine.is_waiting());
}

#[test]
fn qos1_deliveries_fill_the_window_the_client_allows_until_acknowledged() {
    let mut machine = Client::v5().receive_max(2).connect(8);
    let progress = progress(0..3);
    for offset in 0..2 {
        assert!(machine.window_open());
        machine.handle(Event::Deliver(delivery(offset, b"1", QoS::AtLeastOnce, Some(&progress))));
    }
    assert!(!machine.window_open(), "two unacknowledged: the client's receive maximum");
    let topic = "s/1".to_string();
    assert_eq!(
        sent(&mut machine),
        [
            Sent::Publish { packet_id: Some(1), qos: 1, dup: false, topic: topic.clone() },
            Sent::Publish { packet_id: Some(2), qos: 1, dup: false, topic },
        ]
    );
    assert_eq!(committed(&progress), 0);
    machine.handle(packet(Inbound::PubAck(id(1))));
    assert!(machine.window_open());
    assert_eq!(committed(&progress), 1, "acknowledged in the subscription's progress");
    machine.handle(packet(Inbound::PubAck(id(1))));
    machine.handle(packet(Inbound::PubRec(id(2))));
    machine.handle(Event::Deliver(delivery(2, b"1", QoS::AtLeastOnce, Some(&progress))));
    assert_eq!(sent(&mut machine), [Sent::Publish { packet_id: Some(3), qos: 1, dup: false, topic: "s/1".into() }]);
    assert!(!machine.window_open(), "a stray PUBACK or a PUBREC does not end a QoS 1 delivery");
    machine.handle(packet(Inbound::PubAck(id(2))));
    assert!(machine.window_open());
    assert_eq!(committed(&progress), 2);
    assert_eq!(machine.take_counts().messages_sent, 3);
}

#[test]
fn a_qos2_delivery_is_released_after_the_read_that_brought_its_pubrec() {
    let mut machine = Client::v5().persistent().connect(8);
    let progress = progress(5..6);
    machine.handle(Event::Deliver(delivery(5, b"2", QoS::ExactlyOnce, Some(&progress))));
    assert_eq!(sent(&mut machine), [Sent::Publish { packet_id: Some(1), qos: 2, dup: false, topic: "s/1".into() }]);
    machine.handle(packet(Inbound::PubRec(id(1))));
    assert_eq!(committed(&progress), 6, "the client has it: it never comes again");
    assert_eq!(sent(&mut machine), [], "PUBREL once the read is handled");
    machine.handle(Event::ReadDone);
    assert!(matches!(&actions(&mut machine)[..], [Action::PersistSession]), "written down before the PUBREL");
    assert_eq!(sent(&mut machine), [Sent::PubRel(1)]);
    assert_eq!(machine.stored_session(None).releasing, [1]);
    machine.handle(packet(Inbound::PubComp(id(1))));
    assert_eq!(machine.stored_session(None).releasing, Vec::<u16>::new());
}

#[test]
fn a_message_goes_at_the_lower_qos_with_dup_only_above_qos0() {
    let mut machine = Client::v5().connect(8);
    let redelivered = |published: &'static [u8], qos: QoS| {
        let Outbound::Message { event, qos, subscription_id, retain, retain_as_published, progress, .. } =
            delivery(0, published, qos, None)
        else {
            unreachable!()
        };
        Outbound::Message { event, qos, subscription_id, retain, retain_as_published, progress, dup: true }
    };
    machine.handle(Event::Deliver(redelivered(b"0", QoS::ExactlyOnce)));
    machine.handle(Event::Deliver(redelivered(b"2", QoS::AtLeastOnce)));
    assert_eq!(
        sent(&mut machine),
        [
            Sent::Publish { packet_id: None, qos: 0, dup: false, topic: "s/1".into() },
            Sent::Publish { packet_id: Some(1), qos: 1, dup: true, topic: "s/1".into() },
        ]
    );
}

#[test]
fn an_expired_message_is_not_sent_and_counts_as_done() {
    let mut machine = Client::v5().connect(8);
    let progress = progress(0..1);
    let expired = (NOW_MS - 1).to_string().leak().as_bytes();
    machine.handle(Event::Deliver(delivery_with(0, &[(EXPIRES_HEADER, expired)], QoS::AtLeastOnce, Some(&progress))));
    assert_eq!(sent(&mut machine), []);
    assert_eq!(committed(&progress), 1);
    assert_eq!(machine.take_counts().messages_expired, 1);
}

#[test]
fn topic_aliases_are_set_used_and_bounded() {
    let mut machine = Client::v5().connect(8);
    let alias = |alias: u16| v5::PublishProperties { topic_alias: NonZeroU16::new(alias), ..Default::default() };
    machine.handle(publish_with(QoS::AtMostOnce, 0, "rooms/7", Some(alias(2))));
    assert_eq!(the_store(&mut machine).topic.as_str(), "rooms/7");
    machine.handle(publish_with(QoS::AtMostOnce, 0, "", Some(alias(2))));
    assert_eq!(the_store(&mut machine).topic.as_str(), "rooms/7", "the alias stands for its topic");
    machine.handle(publish_with(QoS::AtMostOnce, 0, "", Some(alias(3))));
    assert_eq!(the_close(&mut machine).goodbye.unwrap().0, Goodbye::TopicAliasInvalid, "never set");
    machine.handle(publish_with(QoS::AtMostOnce, 0, "a", Some(alias(5))));
    assert_eq!(the_close(&mut machine).goodbye.unwrap().0, Goodbye::TopicAliasInvalid, "above the maximum");
}

#[test]
fn a_taken_over_session_resumes_on_the_next_connection() {
    // The first connection: a QoS 2 message stored awaiting its PUBREL; a QoS 2 delivery
    // PUBREC'd and released, awaiting PUBCOMP; a QoS 1 delivery unacknowledged.
    let will = Will {
        topic: "wills/c1".into(),
        payload: Bytes::from_static(b"gone"),
        qos: QoS::AtLeastOnce,
        retain: false,
        properties: Default::default(),
        delay_secs: 30,
    };
    let mut first = Client { will: Some(will), ..Client::v5().persistent() }.connect(8);
    first.handle(publish(QoS::ExactlyOnce, 9));
    let receipt = the_store(&mut first).receipt;
    let release = StoredRelease { packet_id: 9, stream: "sensors".into(), partition: 0, from: 12 };
    first.note_stored(id(9), || release.clone());
    first.handle(stored(&[receipt]));
    let progress = progress(0..2);
    first.handle(Event::Deliver(delivery(0, b"2", QoS::ExactlyOnce, Some(&progress))));
    first.handle(Event::Deliver(delivery(1, b"1", QoS::AtLeastOnce, Some(&progress))));
    first.handle(packet(Inbound::PubRec(id(1))));
    first.handle(Event::ReadDone);
    actions(&mut first);
    sent(&mut first);

    let close = interrupted(Interruption::TakenOver);
    assert_eq!(close.goodbye.as_ref().map(|(goodbye, _)| *goodbye), Some(Goodbye::SessionTakenOver));
    let ending = first.end(&close);
    assert_eq!(ending.session, SessionEnd::Keep);
    let (will, delay) = ending.will.expect("taken over: the will goes");
    assert_eq!((will.topic.as_str(), delay.as_secs()), ("wills/c1", 30), "after its delay, unless the client is back");
    assert_eq!(sent(&mut first), [Sent::Disconnect(0x8e)]);
    let mut session = first.stored_session(Some(NOW_MS));
    assert_eq!(session.awaiting_release, std::slice::from_ref(&release));
    assert_eq!(session.releasing, [1]);
    let subscription = {
        let progress = progress.lock().unwrap();
        StoredSubscription {
            positions: progress.committed(),
            sent: progress.sent(),
            unacked: Some(progress.unacked()),
            ..StoredSubscription::default()
        }
    };
    session.subscriptions.push(subscription.clone());

    // The next connection: the PUBREL again; the unacknowledged QoS 1 message again, DUP; the
    // QoS 2 one it PUBREC'd not at all.
    let mut next = Client::v5().persistent().connect(8);
    next.restore(&session);
    assert_eq!(sent(&mut next), [Sent::PubRel(1)]);
    assert_eq!(next.stored_session(None).releasing, [1]);
    let resumed = Resumed::of(&session.subscriptions[0]);
    assert_eq!(committed(&progress), 1, "resumes from offset 1, the first unacknowledged");
    assert_eq!(resumed.sent_before("s", 0, 0), (true, true), "PUBREC'd: not again");
    let (dup, acknowledged) = resumed.sent_before("s", 0, 1);
    assert_eq!((dup, acknowledged), (true, false));
    let Outbound::Message { event, qos, subscription_id, retain, retain_as_published, progress, .. } =
        delivery(1, b"1", QoS::AtLeastOnce, None)
    else {
        unreachable!()
    };
    next.handle(Event::Deliver(Outbound::Message {
        event,
        qos,
        subscription_id,
        retain,
        retain_as_published,
        progress,
        dup,
    }));
    assert_eq!(
        sent(&mut next),
        [Sent::Publish { packet_id: Some(2), qos: 1, dup: true, topic: "s/1".into() }],
        "packet id 1 is still the released message's"
    );
    next.handle(packet(Inbound::PubComp(id(1))));
    assert_eq!(next.stored_session(None).releasing, Vec::<u16>::new());

    // The QoS 2 message it was in doubt about, resent: looked for in the log first.
    next.handle(publish(QoS::ExactlyOnce, 9));
    let (incoming, looked) = match actions(&mut next).remove(0) {
        Action::LookUp { incoming, release } => (incoming, release),
        other => panic!("a look in the log, not {other:?}"),
    };
    assert_eq!(looked, release);
    next.handle(Event::LookedUp { incoming, release: looked, found: true });
    let ack = the_ack_in_turn(&mut next);
    assert_eq!(ack.packets, [(QoS::ExactlyOnce, id(9))], "found: acknowledged again, not stored again");
    assert_eq!(next.stored_session(None).awaiting_release, [release], "still awaiting its PUBREL");
}

#[test]
fn an_in_doubt_message_not_found_in_the_log_is_stored() {
    let release = StoredRelease { packet_id: 9, stream: "sensors".into(), partition: 0, from: 12 };
    let session = StoredSession { expiry_secs: 60, awaiting_release: vec![release.clone()], ..Default::default() };
    let mut machine = Client::v5().persistent().connect(8);
    machine.restore(&session);
    machine.handle(publish(QoS::ExactlyOnce, 9));
    let Action::LookUp { incoming, release } = actions(&mut machine).remove(0) else { panic!("a look in the log") };
    machine.handle(Event::LookedUp { incoming, release, found: false });
    assert_eq!(the_store(&mut machine).receipt.ack, Some((QoS::ExactlyOnce, id(9))));
}

#[test]
fn a_disconnect_can_end_a_persistent_session_and_send_the_will() {
    let will = Will {
        topic: "wills/c1".into(),
        payload: Bytes::new(),
        qos: QoS::AtMostOnce,
        retain: false,
        properties: Default::default(),
        delay_secs: 30,
    };
    let mut machine = Client { will: Some(will), ..Client::v5().persistent() }.connect(8);
    machine.handle(packet(Inbound::Disconnect { with_will: true, session_expiry_secs: Some(0) }));
    let close = the_close(&mut machine);
    assert_eq!(close, Close { will: true, goodbye: None });
    let ending = machine.end(&close);
    assert_eq!(ending.session, SessionEnd::Delete);
    assert_eq!(ending.will.map(|(_, delay)| delay.as_secs()), Some(0), "the session ends now, and the will with it");
    assert_eq!(sent(&mut machine), [], "a client that said goodbye is not told one");

    let mut machine = Client::v5().persistent().connect(8);
    machine.handle(packet(Inbound::Disconnect { with_will: false, session_expiry_secs: None }));
    let close = the_close(&mut machine);
    let ending = machine.end(&close);
    assert_eq!(ending.session, SessionEnd::Keep);
}

#[test]
fn subscriptions_are_answered_once_opened_and_a_persistent_session_writes_them_first() {
    let mut machine = Client::v5().persistent().connect(8);
    let filter = SubscribeFilter {
        filter: "a/#".into(),
        qos: QoS::AtLeastOnce,
        retain_handling: 0,
        retain_as_published: false,
        no_local: false,
    };
    let subscription_id = NonZeroU32::new(5);
    machine.handle(packet(Inbound::Subscribe { packet_id: id(2), id: subscription_id, filters: vec![filter] }));
    assert!(matches!(&actions(&mut machine)[..], [Action::Subscribe { packet_id, .. }] if *packet_id == id(2)));
    assert_eq!(sent(&mut machine), [], "answered once opened");
    machine.handle(Event::Subscribed { packet_id: id(2), granted: vec![Ok(QoS::AtLeastOnce)] });
    assert!(matches!(&actions(&mut machine)[..], [Action::PersistSession]));
    assert_eq!(sent(&mut machine), [Sent::SubAck(2)]);
    machine.handle(packet(Inbound::PingReq));
    assert_eq!(sent(&mut machine), [Sent::PingResp]);
    machine.handle(packet(Inbound::Connect(Box::new(Connect {
        client_id: "c1".into(),
        clean_start: true,
        keep_alive_secs: 0,
        session_expiry_secs: 0,
        username: None,
        password: None,
        will: None,
        receive_max: 1,
        max_packet_size: None,
    }))));
    assert_eq!(the_close(&mut machine).goodbye.unwrap().0, Goodbye::ProtocolError, "a second CONNECT");
}

#[test]
fn a_packet_the_codec_refuses_ends_the_connection_and_counts() {
    let mut machine = Client::v5().connect(8);
    // A PUBLISH whose remaining length says more than the limit allows.
    let mut buf = BytesMut::from(&[0x30, 0xff, 0xff, 0xff, 0x7f][..]);
    let close = machine.decode(&mut buf).unwrap_err();
    assert_eq!(close.goodbye.unwrap().0, Goodbye::PacketTooLarge);
    assert_eq!(machine.take_counts().protocol_errors, 1);
}
