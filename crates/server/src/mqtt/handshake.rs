//! The handshake: the protocol version, the CONNECT, the client id (assigned when empty),
//! authentication, taking the client id over from an earlier connection, the session the
//! client finds again, and the CONNACK. A CONNECT that cannot be read, or a client that may not
//! connect, gets a CONNACK saying why (never a DISCONNECT first: MQTT 5, 3.14.0-1), or for an
//! unreadable 3.1.1 one a plain close.
//!
//! A client id is held by one connection at a time: a new connection with it takes it over,
//! and the earlier one ends ("session taken over"). The new one waits until the earlier one
//! has written its session down, so it finds the session as it was left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rmqtt_codec::error::DecodeError;
use rmqtt_codec::version::{ProtocolVersion, VersionCodec};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{OwnedMutexGuard, oneshot};
use tokio_util::codec::Decoder;

use onehop_engine::Principal;

use super::Broker;
use super::proto::{Codec, ConnackInfo, Connect, ConnectRefusal, Inbound, Version, connect_refusal_for};
use super::sessions::StoredSession;

/// How long a connection waits for the one it takes over to write its session down: long
/// enough for a session write under a slow disk, short enough that a stuck one is answered
/// (CONNACK "server unavailable") rather than held.
const SESSION_HANDOVER_TIMEOUT: Duration = Duration::from_secs(5);
/// A CONNACK "unacceptable protocol version" in the 3.1.1 form, which clients of every version
/// read.
const CONNACK_UNACCEPTABLE_VERSION: [u8; 4] = [0x20, 0x02, 0x00, 0x01];

/// Who a CONNECT's credentials stand for. A password that is a token (`oht_…`, from
/// `CREATE TOKEN`, or a JWT where JWT keys are configured) logs in as the token's user (the user name, which MQTT 3.1.1 requires
/// beside a password, must then be empty or that user); any other password is checked with
/// the user name. Without a password, a verified client certificate logs in as the user its
/// common name is (the user name, if given, must be that user). No credentials: anonymous,
/// let in only while access is off or `PUBLIC` is granted something.
async fn login(broker: &Broker, connect: &Connect, client: &Client<'_>) -> Result<Principal, ConnectRefusal> {
    let certificate_user = client.certificate_user;
    let access = broker.engine.access();
    let username = connect.username.as_deref();
    let refused = |error: onehop_engine::EngineError| {
        crate::access::login_failed("mqtt", username, &error.message());
        ConnectRefusal::BadCredentials
    };
    if connect.password.is_none()
        && let Some(certificate_user) = certificate_user
    {
        if username.is_some_and(|name| !name.is_empty() && name != certificate_user) {
            crate::access::login_failed("mqtt", username, "a user name other than the client certificate's");
            return Err(ConnectRefusal::BadCredentials);
        }
        return access.login_certificate(certificate_user).map_err(refused);
    }
    let Some(password) = connect.password.as_deref() else {
        if username.is_some() && access.enabled() {
            crate::access::login_failed("mqtt", username, "a user name without a password");
            return Err(ConnectRefusal::BadCredentials);
        }
        if !access.anonymous_welcome() {
            crate::access::login_failed("mqtt", None, "no credentials");
            return Err(ConnectRefusal::NotAuthorized);
        }
        return Ok(access.anonymous());
    };
    if let Ok(token) = std::str::from_utf8(password)
        && access.is_token(token)
    {
        let principal = access.login_token(token, super::now_ms() as u64).map_err(refused)?;
        if username.is_some_and(|name| !name.is_empty() && principal.user().is_some_and(|user| user != name)) {
            crate::access::login_failed("mqtt", username, "a token of another user");
            return Err(ConnectRefusal::BadCredentials);
        }
        return Ok(principal);
    }
    let source = client.peer.map(|peer| peer.ip());
    access.login_password(username.unwrap_or_default(), password, source).await.map_err(|error| match error {
        onehop_engine::EngineError::LoginThrottled { .. } => {
            crate::access::login_failed("mqtt", username, &error.message());
            ConnectRefusal::Throttled
        }
        error => refused(error),
    })
}

/// The connection a CONNECT came on.
pub(super) struct Client<'a> {
    /// The broker's number for it.
    pub(super) connection: u64,
    /// The user its verified client certificate names, if any.
    pub(super) certificate_user: Option<&'a str>,
    /// Its address, when it came over a socket of ours or an HTTP request that says so.
    pub(super) peer: Option<std::net::SocketAddr>,
}

/// The connected clients by id, each with the signal that takes its client id over.
#[derive(Default)]
pub(super) struct Clients {
    clients: Mutex<HashMap<String, (u64, oneshot::Sender<()>)>>,
}

impl Clients {
    /// Registers `client_id` for connection `connection`, taking over (disconnecting) an
    /// earlier connection with the same id. Returns the signal of this one's takeover.
    fn register(&self, client_id: &str, connection: u64) -> oneshot::Receiver<()> {
        let (kick, kicked) = oneshot::channel();
        let previous = self.clients.lock().expect("clients lock").insert(client_id.to_string(), (connection, kick));
        if let Some((_, kick)) = previous {
            let _ = kick.send(());
        }
        kicked
    }

    /// Whether a connection with `client_id` is open.
    pub(super) fn is_connected(&self, client_id: &str) -> bool {
        self.clients.lock().expect("clients lock").contains_key(client_id)
    }

    /// Forgets connection `connection` of `client_id`, unless another has taken it over since.
    pub(super) fn unregister(&self, client_id: &str, connection: u64) {
        let mut clients = self.clients.lock().expect("clients lock");
        if clients.get(client_id).is_some_and(|(id, _)| *id == connection) {
            clients.remove(client_id);
        }
    }
}

/// A connection's hold on its client id's session: a connection taking the client id over
/// waits until it is released.
pub(super) struct SessionOwner {
    guard: OwnedMutexGuard<()>,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl SessionOwner {
    /// Lets the session go (after its last write), to a connection waiting for it.
    pub(super) fn release(self, broker: &Broker, client_id: &str) {
        drop(self.guard);
        broker.sessions.release_owner(client_id, self.lock);
    }
}

/// A client let in, its CONNACK sent.
pub(super) struct Accepted {
    pub(super) codec: Codec,
    pub(super) connect: Connect,
    pub(super) client_id: String,
    /// Its session as its last connection left it: none for a clean start, a first visit or
    /// an expired session.
    pub(super) stored: Option<StoredSession>,
    /// Resolves when a later connection takes the client id over.
    pub(super) kicked: oneshot::Receiver<()>,
    pub(super) owner: SessionOwner,
    /// Who the client logged in as.
    pub(super) principal: Principal,
    /// The connection, counted against its user's limit while it lives.
    pub(super) held: Option<onehop_engine::Held>,
}

/// Reads the CONNECT (within the connect timeout) and answers it: the client accepted, or
/// refused with the CONNACK that says why. What arrived after the CONNECT stays in `buf`.
pub(super) async fn accept<S: AsyncRead + AsyncWrite>(
    broker: &Broker,
    reader: &mut ReadHalf<S>,
    writer: &mut WriteHalf<S>,
    buf: &mut BytesMut,
    client: Client<'_>,
) -> Option<Accepted> {
    let connection = client.connection;
    let read = tokio::time::timeout(broker.config.connect_timeout, read_connect(broker, reader, writer, buf)).await;
    let Ok(Some((mut codec, connect))) = read else { return None };
    let mut assigned = None;
    let client_id = if connect.client_id.is_empty() {
        if codec.version() == Version::V3 && !connect.clean_start {
            return refuse(&mut codec, ConnectRefusal::BadClientId, writer).await;
        }
        let id = generated_client_id(connection);
        assigned = Some(id.clone());
        id
    } else {
        connect.client_id.clone()
    };
    let principal = match login(broker, &connect, &client).await {
        Ok(principal) => principal,
        Err(refusal) => return refuse(&mut codec, refusal, writer).await,
    };
    let held = match principal.hold(onehop_engine::Resource::Connection) {
        Ok(held) => held,
        // A client taking its own id over (a reconnect after its network dropped) is let in:
        // the connection it replaces is about to close, and with it its place.
        Err(_) if broker.clients.is_connected(&client_id) => None,
        Err(error) => {
            tracing::info!(client_id, %error, "MQTT CONNECT refused: the user is at its connection limit");
            crate::access::limit_refused("mqtt");
            return refuse(&mut codec, ConnectRefusal::QuotaExceeded, writer).await;
        }
    };
    if let Some(max) = connect.max_packet_size {
        codec.set_max_outbound(max);
    }
    // Take the client id over (an earlier connection with it is closed), then wait until that
    // connection has written its session, so this one finds it as it was left.
    let kicked = broker.clients.register(&client_id, connection);
    let lock = broker.sessions.owner_lock(&client_id);
    let Ok(guard) = tokio::time::timeout(SESSION_HANDOVER_TIMEOUT, lock.clone().lock_owned()).await else {
        broker.clients.unregister(&client_id, connection);
        return refuse(&mut codec, ConnectRefusal::Unavailable, writer).await;
    };
    let owner = SessionOwner { guard, lock };
    let stored = session_found(broker, &client_id, connect.clean_start).await;
    let info = ConnackInfo {
        assigned_client_id: assigned,
        receive_max: broker.config.receive_max,
        max_packet_size: broker.config.max_packet_bytes,
        topic_alias_max: broker.config.topic_alias_max,
        session_present: stored.is_some(),
    };
    let mut out = BytesMut::new();
    if codec.connack(Ok(info), &mut out).is_err() || writer.write_all(&out).await.is_err() {
        broker.clients.unregister(&client_id, connection);
        owner.release(broker, &client_id);
        return None;
    }
    tracing::debug!(client_id, version = ?codec.version(), keep_alive = connect.keep_alive_secs, "MQTT client connected");
    Some(Accepted { codec, connect, client_id, stored, kicked, owner, principal, held })
}

/// The session `client_id` finds: none on a clean start (which ends a stored one), else the
/// stored one unless it expired.
async fn session_found(broker: &Broker, client_id: &str, clean_start: bool) -> Option<StoredSession> {
    if !clean_start {
        return broker.sessions.get(client_id).filter(|session| !session.expired(super::now_ms()));
    }
    if broker.sessions.get(client_id).is_some()
        && let Err(error) = broker.sessions.put(client_id, None).await
    {
        tracing::warn!(client_id, %error, "an MQTT session could not be ended");
    }
    None
}

/// Answers a CONNECT with a refusal; there is no connection to go on with.
async fn refuse<S: AsyncWrite, T>(codec: &mut Codec, refusal: ConnectRefusal, writer: &mut WriteHalf<S>) -> Option<T> {
    let mut out = BytesMut::new();
    let _ = codec.connack(Err(refusal), &mut out);
    let _ = writer.write_all(&out).await;
    None
}

/// Reads until `buf` holds a whole packet of the handshake, or the client goes away.
async fn read_more<S: AsyncRead>(reader: &mut ReadHalf<S>, buf: &mut BytesMut) -> Option<()> {
    match reader.read_buf(buf).await {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(()),
    }
}

/// Reads the protocol version and the CONNECT.
async fn read_connect<S: AsyncRead + AsyncWrite>(
    broker: &Broker,
    reader: &mut ReadHalf<S>,
    writer: &mut WriteHalf<S>,
    buf: &mut BytesMut,
) -> Option<(Codec, Connect)> {
    let version = loop {
        match VersionCodec.decode(buf) {
            Ok(Some(ProtocolVersion::MQTT3)) => break Version::V3,
            Ok(Some(ProtocolVersion::MQTT5)) => break Version::V5,
            Ok(None) => read_more(reader, buf).await?,
            Err(DecodeError::UnsupportedProtocolLevel) => {
                let _ = writer.write_all(&CONNACK_UNACCEPTABLE_VERSION).await;
                return None;
            }
            Err(DecodeError::InvalidProtocol) if names_mqtt(buf) => {
                // CONNACK "unacceptable protocol version", in the 3.1.1 form every client reads.
                let _ = writer.write_all(&CONNACK_UNACCEPTABLE_VERSION).await;
                return None;
            }
            Err(error) => {
                tracing::debug!(%error, "MQTT handshake refused");
                return None;
            }
        }
    };
    let mut codec = Codec::new(version, broker.config.max_packet_bytes);
    loop {
        if version == Version::V5 {
            clean_start_without_session(buf);
        }
        match codec.decode(buf) {
            Ok(Some(Inbound::Connect(connect))) => return Some((codec, *connect)),
            Ok(Some(other)) => {
                tracing::debug!(packet = ?other, "MQTT: the first packet must be CONNECT");
                return None;
            }
            Ok(None) => read_more(reader, buf).await?,
            Err(error) => {
                tracing::debug!(%error, "MQTT CONNECT refused");
                let mut out = BytesMut::new();
                if codec.connack(Err(connect_refusal_for(&error)), &mut out).is_ok() {
                    let _ = writer.write_all(&out).await;
                }
                return None;
            }
        }
    }
}

/// A 5.0 CONNECT with an empty client id and Clean Start 0 is refused by the codec; when its
/// session expiry interval is 0 it is taken as a clean start instead (the Clean Start bit is
/// set in `buf` before the codec reads it). The session then ends with the connection either
/// way, and a client id the server assigns has no session to resume, so Clean Start changes
/// nothing; paho's interoperability suite connects so. With a session that would outlive the
/// connection it stays refused (CONNACK 0x85): the client could not name it again. Anything
/// not read as such a CONNECT (a partial packet, another packet) is left as it is.
fn clean_start_without_session(buf: &mut BytesMut) {
    const CLEAN_START: u8 = 0x02;
    const SESSION_EXPIRY: u8 = 0x11;
    let bytes: &[u8] = buf;
    if bytes.first() != Some(&0x10) {
        return;
    }
    let mut at = 1;
    let (mut remaining, mut shift) = (0usize, 0);
    loop {
        let Some(&byte) = bytes.get(at) else { return };
        at += 1;
        remaining |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 21 {
            return;
        }
    }
    let Some(packet) = bytes.get(at..at + remaining) else { return };
    // Protocol name (6), level (1), flags (1), keep-alive (2), then the properties.
    if packet.len() < 11 || packet[6] != 5 || packet[7] & CLEAN_START != 0 {
        return;
    }
    let flags_at = at + 7;
    let mut cursor = 10;
    let (mut length, mut shift) = (0usize, 0);
    loop {
        let Some(&byte) = packet.get(cursor) else { return };
        cursor += 1;
        length |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 21 {
            return;
        }
    }
    let Some(properties) = packet.get(cursor..cursor + length) else { return };
    // A string or binary value's size: its two-byte length, and that many bytes.
    let prefixed = |at: usize| -> Option<usize> {
        let length = properties.get(at..at + 2)?;
        Some(2 + usize::from(u16::from_be_bytes([length[0], length[1]])))
    };
    let mut expiry = 0u32;
    let mut index = 0;
    while index < properties.len() {
        let id = properties[index];
        index += 1;
        let size = match id {
            SESSION_EXPIRY | 0x27 => Some(4),
            0x21 | 0x22 => Some(2),
            0x17 | 0x19 => Some(1),
            0x15 | 0x16 => prefixed(index),
            // A user property: a name and a value.
            0x26 => prefixed(index).and_then(|name| Some(name + prefixed(index + name)?)),
            _ => None,
        };
        let Some(size) = size else { return };
        if id == SESSION_EXPIRY {
            let Some(value) = properties.get(index..index + 4) else { return };
            expiry = u32::from_be_bytes([value[0], value[1], value[2], value[3]]);
        }
        index += size;
    }
    let client_id = cursor + length;
    if expiry == 0 && packet.get(client_id..client_id + 2) == Some(&[0, 0]) {
        buf[flags_at] |= CLEAN_START;
    }
}

/// Whether `buf` starts with a CONNECT naming the MQTT protocol (so a refusal is about its
/// level, which deserves a CONNACK saying so, not a silent close).
fn names_mqtt(buf: &[u8]) -> bool {
    if buf.first() != Some(&0x10) {
        return false;
    }
    // Skip the remaining length (1 to 4 bytes).
    let Some(length_bytes) = buf[1..].iter().take(4).position(|byte| byte & 0x80 == 0).map(|i| i + 1) else {
        return false;
    };
    let rest = &buf[1 + length_bytes..];
    rest.starts_with(&[0x00, 0x04, b'M', b'Q', b'T', b'T'])
        || rest.starts_with(&[0x00, 0x06, b'M', b'Q', b'I', b's', b'd', b'p'])
}

/// A client id for a client that sent none: unique per connection and start.
fn generated_client_id(connection: u64) -> String {
    format!("onehop-{connection:x}-{:x}", super::now_ms())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 5.0 CONNECT with flags `flags`, the properties given (encoded, without their length)
    /// and an empty client id.
    fn connect_v5(flags: u8, properties: &[u8]) -> Vec<u8> {
        let mut body = vec![0x00, 0x04, b'M', b'Q', b'T', b'T', 5, flags, 0, 60, properties.len() as u8];
        body.extend_from_slice(properties);
        body.extend_from_slice(&[0, 0]);
        let mut packet = vec![0x10, body.len() as u8];
        packet.extend_from_slice(&body);
        packet
    }

    #[test]
    fn an_empty_client_id_without_a_session_becomes_a_clean_start_and_nothing_else_changes() {
        let fixed = |mut packet: Vec<u8>| {
            let mut buf = BytesMut::from(&packet[..]);
            clean_start_without_session(&mut buf);
            let changed = buf.to_vec() != packet;
            packet[9] |= 0x02;
            (changed, buf.to_vec() == packet)
        };
        assert_eq!(fixed(connect_v5(0, &[])), (true, true), "no expiry: a clean start");
        let user = [0x26, 0, 1, b'k', 0, 1, b'v'];
        assert_eq!(fixed(connect_v5(0, &[&[0x11, 0, 0, 0, 0][..], &user].concat())), (true, true));
        assert!(!fixed(connect_v5(0, &[0x11, 0, 0, 0x0e, 0x10])).0, "an hour's session stays refused");
        assert!(!fixed(connect_v5(0x02, &[])).0, "a clean start already");
        // Whatever the bytes, nothing panics and only the flags byte may change.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut packet = connect_v5(0, &[]);
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let at = (state as usize) % packet.len();
                packet[at] = (state >> 32) as u8;
            }
            packet.truncate(1 + (state >> 40) as usize % packet.len());
            let mut buf = BytesMut::from(&packet[..]);
            clean_start_without_session(&mut buf);
            let differing: Vec<usize> = (0..packet.len()).filter(|at| buf[*at] != packet[*at]).collect();
            assert!(differing.is_empty() || differing == [9], "{packet:02x?}");
        }
    }

    #[test]
    fn a_refusal_of_the_protocol_level_is_for_connects_that_name_mqtt() {
        let connect = |name: &[u8]| {
            let mut packet = vec![0x10, 0x10, 0x00, name.len() as u8];
            packet.extend_from_slice(name);
            packet
        };
        assert!(names_mqtt(&connect(b"MQTT")));
        assert!(names_mqtt(&connect(b"MQIsdp")));
        assert!(!names_mqtt(&connect(b"HTTP")));
        assert!(!names_mqtt(b"GET / HTTP/1.1\r\n"));
        assert!(!names_mqtt(&[0x10, 0x80, 0x80, 0x80, 0x80]), "a length that never ends");
    }

    #[test]
    fn a_client_id_is_the_connection_s_until_another_takes_it_over() {
        let clients = Clients::default();
        let mut first = clients.register("c", 1);
        assert!(clients.is_connected("c"));
        let mut second = clients.register("c", 2);
        assert_eq!(first.try_recv(), Ok(()), "the first connection is told");
        clients.unregister("c", 1);
        assert!(clients.is_connected("c"), "the first one leaving does not unregister the second");
        assert!(second.try_recv().is_err(), "nobody took the second over");
        clients.unregister("c", 2);
        assert!(!clients.is_connected("c"));
    }
}
