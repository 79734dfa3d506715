//! MQTT packets written and read byte by byte over a plain `TcpStream`, for what a client
//! library will not send: a topic alias of 0, an empty client id with a persistent session,
//! more unreleased QoS 2 publishes than the server's receive maximum.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One packet as read: its first byte (type and flags) and the bytes after its length.
#[derive(Debug)]
pub struct Packet {
    pub first: u8,
    pub body: Vec<u8>,
}

impl Packet {
    /// The packet type, the first byte's high nibble (2 CONNACK, 5 PUBREC, 7 PUBCOMP, 9 SUBACK,
    /// 14 DISCONNECT).
    pub fn kind(&self) -> u8 {
        self.first >> 4
    }
}

pub struct RawClient {
    stream: TcpStream,
}

impl RawClient {
    /// Connects and sends `connect`.
    pub fn connect(address: SocketAddr, connect: &[u8]) -> RawClient {
        let stream = TcpStream::connect(address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut client = RawClient { stream };
        client.send(connect);
        client
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).unwrap();
    }

    /// The next packet, or `None` once the server has closed the connection.
    pub fn packet(&mut self) -> Option<Packet> {
        let mut first = [0u8; 1];
        if self.stream.read_exact(&mut first).is_err() {
            return None;
        }
        let mut length = 0usize;
        for shift in (0..28).step_by(7) {
            let mut byte = [0u8; 1];
            self.stream.read_exact(&mut byte).ok()?;
            length |= usize::from(byte[0] & 0x7f) << shift;
            if byte[0] & 0x80 == 0 {
                break;
            }
        }
        let mut body = vec![0u8; length];
        self.stream.read_exact(&mut body).ok()?;
        Some(Packet { first: first[0], body })
    }

    /// The next packet, which must be of `kind`.
    pub fn expect(&mut self, kind: u8) -> Packet {
        let packet = self.packet().unwrap_or_else(|| panic!("closed while a packet of type {kind} was due"));
        assert_eq!(packet.kind(), kind, "{packet:02x?}");
        packet
    }

    /// The next packet must be a DISCONNECT with `reason`, and the connection must close after it.
    pub fn expect_disconnect(&mut self, reason: u8) {
        let disconnect = self.expect(14);
        assert_eq!(disconnect.body.first(), Some(&reason), "{disconnect:02x?}");
        assert!(self.packet().is_none(), "closed after the DISCONNECT");
    }
}

/// `first`, the remaining length as a variable byte integer, then `body`.
fn packet(first: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![first];
    let mut length = body.len();
    loop {
        let mut byte = (length % 128) as u8;
        length /= 128;
        if length > 0 {
            byte |= 0x80;
        }
        bytes.push(byte);
        if length == 0 {
            break;
        }
    }
    bytes.extend_from_slice(body);
    bytes
}

fn string(text: &[u8]) -> Vec<u8> {
    let mut bytes = (text.len() as u16).to_be_bytes().to_vec();
    bytes.extend_from_slice(text);
    bytes
}

/// CONNECT, MQTT 3.1.1 (`v5` false) or 5.0 with no properties, keep-alive 60 s.
pub fn connect(v5: bool, client_id: &str, clean_start: bool) -> Vec<u8> {
    let mut body = string(b"MQTT");
    body.push(if v5 { 5 } else { 4 });
    body.push(if clean_start { 0x02 } else { 0x00 });
    body.extend_from_slice(&60u16.to_be_bytes());
    if v5 {
        body.push(0);
    }
    body.extend_from_slice(&string(client_id.as_bytes()));
    packet(0x10, &body)
}

/// CONNECT, MQTT 5.0, keep-alive 60 s, with a session expiry interval of `expiry_secs`.
pub fn connect_v5_expiring(client_id: &str, clean_start: bool, expiry_secs: u32) -> Vec<u8> {
    let mut body = string(b"MQTT");
    body.push(5);
    body.push(if clean_start { 0x02 } else { 0x00 });
    body.extend_from_slice(&60u16.to_be_bytes());
    // Properties: 0x11, session expiry interval, four bytes.
    body.push(5);
    body.push(0x11);
    body.extend_from_slice(&expiry_secs.to_be_bytes());
    body.extend_from_slice(&string(client_id.as_bytes()));
    packet(0x10, &body)
}

/// A 5.0 PUBLISH with the properties given as encoded (without their length).
pub fn publish_v5(topic: &str, qos: u8, packet_id: u16, properties: &[u8], payload: &[u8]) -> Vec<u8> {
    let mut body = string(topic.as_bytes());
    if qos > 0 {
        body.extend_from_slice(&packet_id.to_be_bytes());
    }
    assert!(properties.len() < 128);
    body.push(properties.len() as u8);
    body.extend_from_slice(properties);
    body.extend_from_slice(payload);
    packet(0x30 | (qos << 1), &body)
}

/// A 5.0 PUBREL (success, no properties: the short form).
pub fn pubrel(packet_id: u16) -> Vec<u8> {
    packet(0x62, &packet_id.to_be_bytes())
}

/// A 5.0 SUBSCRIBE of one filter at `qos`.
pub fn subscribe_v5(packet_id: u16, filter: &str, qos: u8) -> Vec<u8> {
    let mut body = packet_id.to_be_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&string(filter.as_bytes()));
    body.push(qos);
    packet(0x82, &body)
}

/// The packet id at the start of an acknowledgement's body.
pub fn packet_id(packet: &Packet) -> u16 {
    u16::from_be_bytes([packet.body[0], packet.body[1]])
}

/// The reason code of a 5.0 PUBACK/PUBREC/PUBREL/PUBCOMP (absent means success).
pub fn ack_reason(packet: &Packet) -> u8 {
    packet.body.get(2).copied().unwrap_or(0)
}

/// The receive maximum a 5.0 CONNACK announces (65 535 when it says none).
pub fn receive_maximum(connack: &Packet) -> u16 {
    let body = &connack.body;
    // Acknowledge flags, reason code, then the properties' length (one byte here: they are few).
    assert!(body[2] < 0x80, "{body:02x?}");
    let end = 3 + usize::from(body[2]);
    let mut at = 3;
    while at < end {
        let id = body[at];
        at += 1;
        let two = |at: usize| usize::from(u16::from_be_bytes([body[at], body[at + 1]]));
        match id {
            0x21 => return u16::from_be_bytes([body[at], body[at + 1]]),
            // Byte properties.
            0x24 | 0x25 | 0x28 | 0x29 | 0x2a => at += 1,
            0x13 | 0x22 => at += 2,
            0x11 | 0x27 => at += 4,
            // Strings and binary data.
            0x12 | 0x15 | 0x16 | 0x1a | 0x1c | 0x1f => at += 2 + two(at),
            // A user property: two strings.
            0x26 => {
                at += 2 + two(at);
                at += 2 + two(at);
            }
            other => panic!("unknown CONNACK property {other:#x} in {body:02x?}"),
        }
    }
    u16::MAX
}
