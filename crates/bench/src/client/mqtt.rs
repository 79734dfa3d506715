//! MQTT 3.1.1 publishers and subscribers on blocking sockets.
//!
//! The scheduler thread writes publishes itself (everything due in one write), so no hand-off
//! sits between the intended time and the socket; a reader thread per publisher takes the
//! PUBACKs. A subscriber is a thread reading its socket and acknowledging QoS 1 messages in
//! batches. Each payload starts with its intended send time and sequence number.

use std::collections::HashMap;
use std::num::NonZeroU16;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;
use rmqtt_codec::types::{Publish, QoS};
use rmqtt_codec::v3;
use tokio_util::codec::{Decoder, Encoder};

use super::link::{Dial, LinkReader, LinkWriter};
use super::{Login, rxstamp};
use crate::recorder::{Delivery, Receipts, Recorder};
use crate::schedule::Producer;

/// Packet ids a publisher may have awaiting PUBACK; MQTT has 65 535.
const PACKET_IDS_IN_FLIGHT_MAX: usize = 60_000;
/// The smallest payload: the intended send time and the sequence number.
pub const PAYLOAD_BYTES_MIN: usize = 16;

pub fn qos_of(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

/// A blocking MQTT 3.1.1 connection: CONNECT sent and CONNACK read.
pub struct Connection {
    writer: LinkWriter,
    reader: LinkReader,
    codec: v3::Codec,
    buf: BytesMut,
}

impl Connection {
    /// Connects over plain TCP, anonymously.
    pub fn open(address: &str, client_id: &str) -> anyhow::Result<Connection> {
        Connection::open_with(&Dial::plain(address), client_id, None)
    }

    /// Connects as `dial` says (TLS included), logging in as `login` when given.
    pub fn open_with(dial: &Dial, client_id: &str, login: Option<&Login>) -> anyhow::Result<Connection> {
        let (writer, reader) = dial.connect().with_context(|| format!("connecting to MQTT at {}", dial.address))?;
        let mut connection =
            Connection { writer, reader, codec: v3::Codec::new(16 * 1024 * 1024), buf: BytesMut::new() };
        let connect = v3::Connect {
            clean_session: true,
            keep_alive: 300,
            client_id: ByteString::from(client_id.to_string()),
            username: login.map(|login| ByteString::from(login.user.clone())),
            password: login.map(|login| Bytes::from(login.password.clone())),
            ..v3::Connect::default()
        };
        connection.send(v3::Packet::Connect(Box::new(connect)))?;
        match connection.next()? {
            v3::Packet::ConnectAck(ack) if ack.return_code == v3::ConnectAckReason::ConnectionAccepted => {
                Ok(connection)
            }
            other => bail!("the broker refused CONNECT: {other:?}"),
        }
    }

    /// Subscribes to `filter` and waits for the SUBACK.
    pub fn subscribe(mut self, filter: &str, qos: u8) -> anyhow::Result<Connection> {
        let packet_id = NonZeroU16::new(1).expect("1 is not 0");
        self.send(v3::Packet::Subscribe {
            packet_id,
            topic_filters: vec![(ByteString::from(filter.to_string()), qos_of(qos))],
        })?;
        match self.next()? {
            v3::Packet::SubscribeAck { status, .. }
                if matches!(status.first(), Some(v3::SubscribeReturnCode::Success(_))) =>
            {
                Ok(self)
            }
            other => bail!("the broker refused the subscription: {other:?}"),
        }
    }

    fn send(&mut self, packet: v3::Packet) -> anyhow::Result<()> {
        let mut out = BytesMut::new();
        self.codec.encode(packet, &mut out)?;
        self.writer.write_all(&out)?;
        Ok(())
    }

    /// The next packet from the broker.
    fn next(&mut self) -> anyhow::Result<v3::Packet> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if let Some((packet, _)) = self.codec.decode(&mut self.buf)? {
                return Ok(packet);
            }
            let (read, _) = self.reader.read(&mut chunk)?;
            if read == 0 {
                bail!("the broker closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..read]);
        }
    }
}

fn is_timeout(error: &std::io::Error) -> bool {
    matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
}

/// Reads messages until `stop`, acknowledging QoS 1 ones in batches and recording each as
/// delivered to `observer`.
pub fn subscriber(mut connection: Connection, observer: u32, recorder: Arc<Recorder>, stop: Arc<AtomicBool>) {
    let mut deliveries = Receipts::new();
    let mut chunk = vec![0u8; 256 * 1024];
    let _ = connection.reader.set_read_timeout(Some(Duration::from_millis(100)));
    connection.reader.stamp_arrivals();
    let mut acks = BytesMut::new();
    while !stop.load(Ordering::Relaxed) {
        let (read, arrived) = match connection.reader.read(&mut chunk) {
            Ok((0, _)) => {
                recorder.observer_failed(format!("MQTT subscriber {observer}: the broker closed the connection"));
                break;
            }
            Ok(read) => read,
            Err(error) if is_timeout(&error) => continue,
            Err(error) => {
                recorder.observer_failed(format!("MQTT subscriber {observer}: {error}"));
                break;
            }
        };
        let received_ns = recorder.clock.now_ns();
        let arrived_ns = rxstamp::arrival_on_clock(received_ns, arrived);
        connection.buf.extend_from_slice(&chunk[..read]);
        let before = deliveries.len();
        while let Ok(Some((packet, _))) = connection.codec.decode(&mut connection.buf) {
            let v3::Packet::Publish(publish) = packet else { continue };
            if let Some(packet_id) = publish.packet_id {
                let _ = connection.codec.encode(v3::Packet::PublishAck { packet_id }, &mut acks);
            }
            if publish.payload.len() >= PAYLOAD_BYTES_MIN {
                let seq = u64::from_le_bytes(publish.payload[8..16].try_into().expect("8 bytes"));
                deliveries.push(Delivery { seq, observer, received_ns, arrived_ns });
            }
        }
        recorder.count_received((deliveries.len() - before) as u64);
        if !acks.is_empty() {
            if connection.writer.write_all(&acks).is_err() {
                break;
            }
            acks.clear();
        }
    }
    recorder.add_deliveries(deliveries);
}

/// One publishing connection: its socket for writing, and the packet ids awaiting PUBACK.
struct Publisher {
    writer: LinkWriter,
    codec: v3::Codec,
    /// Packet id → sequence number, shared with the PUBACK reader.
    in_flight: Arc<Mutex<HashMap<u16, u64>>>,
    next_id: u16,
    reader: Option<std::thread::JoinHandle<()>>,
    out: BytesMut,
    pending: Vec<u64>,
}

/// Publishes each event to `topic`, round-robin over the connections.
pub struct MqttProducer {
    publishers: Vec<Publisher>,
    topic: ByteString,
    qos: QoS,
    payload_bytes: usize,
    recorder: Arc<Recorder>,
}

impl MqttProducer {
    pub fn new(
        connections: Vec<Connection>,
        topic: String,
        qos: u8,
        payload_bytes: usize,
        recorder: Arc<Recorder>,
    ) -> anyhow::Result<MqttProducer> {
        let mut publishers = Vec::new();
        for (index, connection) in connections.into_iter().enumerate() {
            let writer = connection.writer;
            let in_flight: Arc<Mutex<HashMap<u16, u64>>> = Arc::new(Mutex::new(HashMap::new()));
            let reader = {
                let (in_flight, recorder, stream) = (in_flight.clone(), recorder.clone(), connection.reader);
                std::thread::Builder::new().name(format!("bench-puback-{index}")).spawn(move || {
                    crate::priority::raise_this_thread();
                    read_acks(stream, in_flight, recorder)
                })?
            };
            publishers.push(Publisher {
                writer,
                codec: v3::Codec::new(1024 * 1024),
                in_flight,
                next_id: 1,
                reader: Some(reader),
                out: BytesMut::with_capacity(64 * 1024),
                pending: Vec::new(),
            });
        }
        Ok(MqttProducer {
            publishers,
            topic: ByteString::from(topic),
            qos: qos_of(qos),
            payload_bytes: payload_bytes.max(PAYLOAD_BYTES_MIN),
            recorder,
        })
    }
}

/// Takes PUBACKs (PUBRECs for QoS 2) until the socket closes, answering their events.
fn read_acks(mut stream: LinkReader, in_flight: Arc<Mutex<HashMap<u16, u64>>>, recorder: Arc<Recorder>) {
    let mut codec = v3::Codec::new(1024 * 1024);
    let mut buf = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let read = match stream.read(&mut chunk) {
            Ok((0, _)) | Err(_) => break,
            Ok((read, _)) => read,
        };
        let now_ns = recorder.clock.now_ns();
        buf.extend_from_slice(&chunk[..read]);
        while let Ok(Some((packet, _))) = codec.decode(&mut buf) {
            let (v3::Packet::PublishAck { packet_id } | v3::Packet::PublishReceived { packet_id }) = packet else {
                continue;
            };
            if let Some(seq) = in_flight.lock().expect("in flight").remove(&packet_id.get()) {
                recorder.events.answered(seq, now_ns, true);
            }
        }
    }
}

impl Producer for MqttProducer {
    fn send(&mut self, seqs: Range<u64>) {
        let events = &self.recorder.events;
        let count = self.publishers.len() as u64;
        for seq in seqs {
            let publisher = &mut self.publishers[(seq % count) as usize];
            let intended_ns = events.intended_ns(seq);
            let mut payload = BytesMut::with_capacity(self.payload_bytes);
            payload.put_u64_le(intended_ns);
            payload.put_u64_le(seq);
            payload.resize(self.payload_bytes, b'x');
            let packet_id = if self.qos == QoS::AtMostOnce {
                None
            } else {
                let mut in_flight = publisher.in_flight.lock().expect("in flight");
                if in_flight.len() >= PACKET_IDS_IN_FLIGHT_MAX {
                    // Out of packet ids: the broker is far behind. The event fails, visibly.
                    drop(in_flight);
                    events.sent(seq, events.clock.now_ns());
                    events.answered(seq, events.clock.now_ns(), false);
                    continue;
                }
                while publisher.next_id == 0 || in_flight.contains_key(&publisher.next_id) {
                    publisher.next_id = publisher.next_id.wrapping_add(1);
                }
                in_flight.insert(publisher.next_id, seq);
                let id = NonZeroU16::new(publisher.next_id);
                publisher.next_id = publisher.next_id.wrapping_add(1);
                id
            };
            let publish = Publish {
                dup: false,
                retain: false,
                qos: self.qos,
                topic: self.topic.clone(),
                packet_id,
                payload: Bytes::from(payload),
                properties: None,
            };
            if publisher.codec.encode(v3::Packet::Publish(Box::new(publish)), &mut publisher.out).is_err() {
                events.sent(seq, events.clock.now_ns());
                events.answered(seq, events.clock.now_ns(), false);
                continue;
            }
            publisher.pending.push(seq);
        }
        for publisher in &mut self.publishers {
            if publisher.pending.is_empty() {
                continue;
            }
            let sent_ns = events.clock.now_ns();
            for seq in &publisher.pending {
                events.sent(*seq, sent_ns);
            }
            let written = publisher.writer.write_all(&publisher.out);
            publisher.out.clear();
            let failed_ns = events.clock.now_ns();
            for seq in publisher.pending.drain(..) {
                if written.is_err() {
                    publisher.in_flight.lock().expect("in flight").retain(|_, waiting| *waiting != seq);
                    events.answered(seq, failed_ns, false);
                } else if self.qos == QoS::AtMostOnce {
                    // Nothing comes back for QoS 0: written is all it gets.
                    events.answered(seq, failed_ns, true);
                }
            }
            if let Err(error) = written {
                self.recorder.problem(format!("publishing: {error}"));
            }
        }
    }
}

impl Drop for MqttProducer {
    fn drop(&mut self) {
        for publisher in &mut self.publishers {
            // Closing the socket ends the PUBACK reader's read.
            publisher.writer.shutdown();
            if let Some(reader) = publisher.reader.take() {
                let _ = reader.join();
            }
        }
    }
}
