//! One view of MQTT 3.1.1 and 5.0 packets for the broker, over the `rmqtt-codec` codecs: the
//! connection logic handles one set of inbound packets and asks for answers by meaning
//! (`puback(id, reason)`), and this module speaks the client's version.

use std::num::{NonZeroU16, NonZeroU32};

use bytes::{Buf, Bytes, BytesMut};
use bytestring::ByteString;
use rmqtt_codec::error::{DecodeError, EncodeError};
use rmqtt_codec::types::{Publish, QoS};
use rmqtt_codec::{v3, v5};
use tokio_util::codec::{Decoder, Encoder};

use super::frame;
use super::headers::MessageProperties;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V3,
    V5,
}

/// A will message, as CONNECT gives it.
#[derive(Clone, Debug)]
pub struct Will {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    pub properties: MessageProperties,
    /// v5: seconds to wait before sending the will (it is not sent if the client is back).
    pub delay_secs: u32,
}

#[derive(Clone, Debug)]
pub struct Connect {
    pub client_id: String,
    pub clean_start: bool,
    pub keep_alive_secs: u16,
    /// v5 session expiry; v3: 0 for a clean session, "never" otherwise.
    pub session_expiry_secs: u32,
    pub username: Option<String>,
    pub password: Option<Bytes>,
    pub will: Option<Will>,
    /// QoS 1/2 messages the client accepts unacknowledged at once.
    pub receive_max: u16,
    /// Largest packet the client accepts.
    pub max_packet_size: Option<u32>,
}

/// One filter of a SUBSCRIBE with its options (v3.1.1 has only the QoS).
#[derive(Debug, Clone)]
pub struct SubscribeFilter {
    pub filter: String,
    pub qos: QoS,
    /// v5: 0 send retained messages at subscribe, 1 only for a new subscription, 2 never.
    pub retain_handling: u8,
    /// v5: keep the retain flag of messages as published (else live messages have it clear).
    pub retain_as_published: bool,
    /// v5: do not send this client its own messages.
    pub no_local: bool,
}

/// What a client sends.
#[derive(Debug)]
pub enum Inbound {
    Connect(Box<Connect>),
    Publish(Box<Publish>),
    PubAck(NonZeroU16),
    PubRec(NonZeroU16),
    PubRel(NonZeroU16),
    PubComp(NonZeroU16),
    Subscribe {
        packet_id: NonZeroU16,
        id: Option<NonZeroU32>,
        filters: Vec<SubscribeFilter>,
    },
    Unsubscribe {
        packet_id: NonZeroU16,
        filters: Vec<String>,
    },
    PingReq,
    /// `with_will`: a v5 DISCONNECT with reason 0x04 asks for the will to be sent;
    /// `session_expiry_secs`: a v5 DISCONNECT may change the session's expiry.
    Disconnect {
        with_will: bool,
        session_expiry_secs: Option<u32>,
    },
    /// A packet only a server sends, or v5 AUTH (enhanced authentication is not offered).
    Unexpected(&'static str),
    /// A packet refused before decoding, for a fault the codec would not name (it has been
    /// taken out of the buffer).
    Invalid {
        goodbye: Goodbye,
        reason: &'static str,
    },
}

/// Why a publish or subscription was refused (v5 reason codes; v3 has no negative acks, so a
/// v3 client is disconnected instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    TopicInvalid,
    NotAuthorized,
    QuotaExceeded,
    PayloadInvalid,
    SharedNotSupported,
    Unavailable,
}

/// A QoS as a number (0, 1, 2), as sessions store it.
pub fn qos_rank(qos: QoS) -> u8 {
    match qos {
        QoS::AtMostOnce => 0,
        QoS::AtLeastOnce => 1,
        QoS::ExactlyOnce => 2,
    }
}

/// The QoS a stored number stands for (one that is none of them: 1).
pub fn qos_of_rank(rank: u8) -> QoS {
    match rank {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

/// The outcome of one topic filter of a SUBSCRIBE.
pub type Granted = Result<QoS, Refusal>;

/// How a connection ends, for the v5 DISCONNECT the server sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Goodbye {
    KeepAliveTimeout,
    SessionTakenOver,
    ShuttingDown,
    ProtocolError,
    MalformedPacket,
    PacketTooLarge,
    QuotaExceeded,
    ReceiveMaximumExceeded,
    TopicAliasInvalid,
    TopicNameInvalid,
    NotAuthorized,
    Unavailable,
}

pub enum Codec {
    V3(v3::Codec),
    V5(v5::Codec),
}

fn text(value: &ByteString) -> String {
    value.to_string()
}

impl Codec {
    pub fn new(version: Version, max_in: u32) -> Codec {
        match version {
            Version::V3 => Codec::V3(v3::Codec::new(max_in)),
            Version::V5 => Codec::V5(v5::Codec::new(max_in, 0)),
        }
    }

    pub fn version(&self) -> Version {
        match self {
            Codec::V3(_) => Version::V3,
            Codec::V5(_) => Version::V5,
        }
    }

    /// Limits what is sent to the client's maximum packet size (v5).
    pub fn set_max_outbound(&mut self, max: u32) {
        if let Codec::V5(codec) = self {
            codec.set_max_outbound_size(max);
        }
    }

    /// The next whole packet in `buf`, if one has arrived.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Inbound>, DecodeError> {
        Ok(Some(match self {
            Codec::V3(codec) => {
                let Some((packet, _)) = codec.decode(buf)? else { return Ok(None) };
                match packet {
                    v3::Packet::Connect(connect) => Inbound::Connect(Box::new(Connect {
                        client_id: text(&connect.client_id),
                        clean_start: connect.clean_session,
                        keep_alive_secs: connect.keep_alive,
                        session_expiry_secs: if connect.clean_session { 0 } else { u32::MAX },
                        username: connect.username.as_ref().map(text),
                        password: connect.password.clone(),
                        will: connect.last_will.as_ref().map(|will| Will {
                            topic: text(&will.topic),
                            payload: will.message.clone(),
                            qos: will.qos,
                            retain: will.retain,
                            properties: MessageProperties::default(),
                            delay_secs: 0,
                        }),
                        receive_max: u16::MAX,
                        max_packet_size: None,
                    })),
                    v3::Packet::Publish(publish) => Inbound::Publish(publish),
                    v3::Packet::PublishAck { packet_id } => Inbound::PubAck(packet_id),
                    v3::Packet::PublishReceived { packet_id } => Inbound::PubRec(packet_id),
                    v3::Packet::PublishRelease { packet_id } => Inbound::PubRel(packet_id),
                    v3::Packet::PublishComplete { packet_id } => Inbound::PubComp(packet_id),
                    v3::Packet::Subscribe { packet_id, topic_filters } => Inbound::Subscribe {
                        packet_id,
                        id: None,
                        filters: topic_filters
                            .iter()
                            .map(|(filter, qos)| SubscribeFilter {
                                filter: text(filter),
                                qos: *qos,
                                retain_handling: 0,
                                retain_as_published: false,
                                no_local: false,
                            })
                            .collect(),
                    },
                    v3::Packet::Unsubscribe { packet_id, topic_filters } => {
                        Inbound::Unsubscribe { packet_id, filters: topic_filters.iter().map(text).collect() }
                    }
                    v3::Packet::PingRequest => Inbound::PingReq,
                    v3::Packet::Disconnect => Inbound::Disconnect { with_will: false, session_expiry_secs: None },
                    v3::Packet::ConnectAck(_) => Inbound::Unexpected("CONNACK"),
                    v3::Packet::SubscribeAck { .. } => Inbound::Unexpected("SUBACK"),
                    v3::Packet::UnsubscribeAck { .. } => Inbound::Unexpected("UNSUBACK"),
                    v3::Packet::PingResponse => Inbound::Unexpected("PINGRESP"),
                }
            }
            Codec::V5(codec) => {
                if let Some(refused) = refuse_before_decoding(buf, codec.max_inbound_size()) {
                    return Ok(refused);
                }
                let Some((packet, _)) = codec.decode(buf)? else { return Ok(None) };
                match packet {
                    v5::Packet::Connect(connect) => Inbound::Connect(Box::new(Connect {
                        client_id: text(&connect.client_id),
                        clean_start: connect.clean_start,
                        keep_alive_secs: connect.keep_alive,
                        session_expiry_secs: connect.session_expiry_interval_secs,
                        username: connect.username.as_ref().map(text),
                        password: connect.password.clone(),
                        will: connect.last_will.as_ref().map(|will| Will {
                            topic: text(&will.topic),
                            payload: will.message.clone(),
                            qos: will.qos,
                            retain: will.retain,
                            properties: will_properties(will),
                            delay_secs: will.will_delay_interval_sec.unwrap_or(0),
                        }),
                        receive_max: connect.receive_max.map_or(u16::MAX, NonZeroU16::get),
                        max_packet_size: connect.max_packet_size.map(NonZeroU32::get),
                    })),
                    v5::Packet::Publish(publish) => Inbound::Publish(publish),
                    v5::Packet::PublishAck(ack) => Inbound::PubAck(ack.packet_id),
                    v5::Packet::PublishReceived(ack) => Inbound::PubRec(ack.packet_id),
                    v5::Packet::PublishRelease(ack) => Inbound::PubRel(ack.packet_id),
                    v5::Packet::PublishComplete(ack) => Inbound::PubComp(ack.packet_id),
                    v5::Packet::Subscribe(subscribe) => Inbound::Subscribe {
                        packet_id: subscribe.packet_id,
                        id: subscribe.id,
                        filters: subscribe
                            .topic_filters
                            .iter()
                            .map(|(filter, options)| SubscribeFilter {
                                filter: text(filter),
                                qos: options.qos,
                                retain_handling: u8::from(options.retain_handling),
                                retain_as_published: options.retain_as_published,
                                no_local: options.no_local,
                            })
                            .collect(),
                    },
                    v5::Packet::Unsubscribe(unsubscribe) => Inbound::Unsubscribe {
                        packet_id: unsubscribe.packet_id,
                        filters: unsubscribe.topic_filters.iter().map(text).collect(),
                    },
                    v5::Packet::PingRequest => Inbound::PingReq,
                    v5::Packet::Disconnect(disconnect) => Inbound::Disconnect {
                        with_will: disconnect.reason_code == v5::DisconnectReasonCode::DisconnectWithWillMessage,
                        session_expiry_secs: disconnect.session_expiry_interval_secs,
                    },
                    v5::Packet::Auth(_) => Inbound::Unexpected("AUTH"),
                    v5::Packet::ConnectAck(_) => Inbound::Unexpected("CONNACK"),
                    v5::Packet::SubscribeAck(_) => Inbound::Unexpected("SUBACK"),
                    v5::Packet::UnsubscribeAck(_) => Inbound::Unexpected("UNSUBACK"),
                    v5::Packet::PingResponse => Inbound::Unexpected("PINGRESP"),
                }
            }
        }))
    }

    fn put3(codec: &mut v3::Codec, packet: v3::Packet, out: &mut BytesMut) -> Result<(), EncodeError> {
        codec.encode(packet, out)
    }

    fn put5(codec: &mut v5::Codec, packet: v5::Packet, out: &mut BytesMut) -> Result<(), EncodeError> {
        codec.encode(packet, out)
    }

    /// CONNACK: accepted (with what the server grants), or refused.
    pub fn connack(
        &mut self,
        accepted: Result<ConnackInfo, ConnectRefusal>,
        out: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => {
                let session_present = accepted.as_ref().is_ok_and(|info| info.session_present);
                let return_code = match accepted {
                    Ok(_) => v3::ConnectAckReason::ConnectionAccepted,
                    Err(ConnectRefusal::BadClientId) => v3::ConnectAckReason::IdentifierRejected,
                    Err(ConnectRefusal::BadCredentials) => v3::ConnectAckReason::BadUserNameOrPassword,
                    Err(ConnectRefusal::NotAuthorized) => v3::ConnectAckReason::NotAuthorized,
                    Err(ConnectRefusal::Unavailable | ConnectRefusal::QuotaExceeded | ConnectRefusal::Throttled) => {
                        v3::ConnectAckReason::ServiceUnavailable
                    }
                    // 3.1.1 has no return code for a CONNECT it cannot read: it just closes.
                    Err(ConnectRefusal::Unreadable(_)) => return Ok(()),
                };
                let ack = v3::ConnectAck { return_code, session_present };
                Self::put3(codec, v3::Packet::ConnectAck(ack), out)
            }
            Codec::V5(codec) => {
                let mut ack = v5::ConnectAck::default();
                match accepted {
                    Ok(info) => {
                        ack.reason_code = v5::ConnectAckReason::Success;
                        ack.assigned_client_id = info.assigned_client_id.map(ByteString::from);
                        ack.receive_max = NonZeroU16::new(info.receive_max).unwrap_or(NonZeroU16::MAX);
                        ack.max_packet_size = Some(info.max_packet_size);
                        ack.topic_alias_max = info.topic_alias_max;
                        ack.session_present = info.session_present;
                        ack.retain_available = true;
                        ack.wildcard_subscription_available = true;
                        ack.subscription_identifiers_available = true;
                        ack.shared_subscription_available = true;
                        ack.max_qos = QoS::ExactlyOnce;
                    }
                    Err(refusal) => {
                        ack.reason_code = match refusal {
                            ConnectRefusal::BadClientId => v5::ConnectAckReason::ClientIdentifierNotValid,
                            ConnectRefusal::BadCredentials => v5::ConnectAckReason::BadUserNameOrPassword,
                            ConnectRefusal::NotAuthorized => v5::ConnectAckReason::NotAuthorized,
                            ConnectRefusal::Unavailable => v5::ConnectAckReason::ServerUnavailable,
                            ConnectRefusal::QuotaExceeded => v5::ConnectAckReason::QuotaExceeded,
                            ConnectRefusal::Throttled => v5::ConnectAckReason::ConnectionRateExceeded,
                            ConnectRefusal::Unreadable(Goodbye::PacketTooLarge) => v5::ConnectAckReason::PacketTooLarge,
                            ConnectRefusal::Unreadable(Goodbye::MalformedPacket) => {
                                v5::ConnectAckReason::MalformedPacket
                            }
                            ConnectRefusal::Unreadable(_) => v5::ConnectAckReason::ProtocolError,
                        };
                    }
                }
                Self::put5(codec, v5::Packet::ConnectAck(Box::new(ack)), out)
            }
        }
    }

    /// PUBACK (QoS 1) or PUBREC (QoS 2) for an inbound publish.
    pub fn publish_ack(
        &mut self,
        qos: QoS,
        packet_id: NonZeroU16,
        outcome: Result<(), (Refusal, String)>,
        out: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => {
                let packet = if qos == QoS::ExactlyOnce {
                    v3::Packet::PublishReceived { packet_id }
                } else {
                    v3::Packet::PublishAck { packet_id }
                };
                Self::put3(codec, packet, out)
            }
            Codec::V5(codec) => {
                let (reason_code, reason_string) = match outcome {
                    Ok(()) => (v5::PublishAckReason::Success, None),
                    Err((refusal, reason)) => (
                        match refusal {
                            Refusal::TopicInvalid => v5::PublishAckReason::TopicNameInvalid,
                            Refusal::NotAuthorized => v5::PublishAckReason::NotAuthorized,
                            Refusal::QuotaExceeded => v5::PublishAckReason::QuotaExceeded,
                            Refusal::PayloadInvalid => v5::PublishAckReason::PayloadFormatInvalid,
                            Refusal::SharedNotSupported | Refusal::Unavailable => {
                                v5::PublishAckReason::ImplementationSpecificError
                            }
                        },
                        Some(ByteString::from(reason)),
                    ),
                };
                let ack = v5::PublishAck { packet_id, reason_code, properties: Vec::new(), reason_string };
                let packet = if qos == QoS::ExactlyOnce {
                    v5::Packet::PublishReceived(ack)
                } else {
                    v5::Packet::PublishAck(ack)
                };
                Self::put5(codec, packet, out)
            }
        }
    }

    /// PUBREL (we sent a QoS 2 message and got PUBREC) or PUBCOMP (we got PUBREL).
    pub fn publish_ack2(
        &mut self,
        release: bool,
        packet_id: NonZeroU16,
        out: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => {
                let packet = if release {
                    v3::Packet::PublishRelease { packet_id }
                } else {
                    v3::Packet::PublishComplete { packet_id }
                };
                Self::put3(codec, packet, out)
            }
            Codec::V5(codec) => {
                let ack = v5::PublishAck2 {
                    packet_id,
                    reason_code: v5::PublishAck2Reason::Success,
                    properties: Vec::new(),
                    reason_string: None,
                };
                let packet = if release { v5::Packet::PublishRelease(ack) } else { v5::Packet::PublishComplete(ack) };
                Self::put5(codec, packet, out)
            }
        }
    }

    pub fn suback(
        &mut self,
        packet_id: NonZeroU16,
        granted: &[Granted],
        out: &mut BytesMut,
    ) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => {
                let status = granted
                    .iter()
                    .map(|granted| match granted {
                        Ok(qos) => v3::SubscribeReturnCode::Success(*qos),
                        Err(_) => v3::SubscribeReturnCode::Failure,
                    })
                    .collect();
                Self::put3(codec, v3::Packet::SubscribeAck { packet_id, status }, out)
            }
            Codec::V5(codec) => {
                let status = granted
                    .iter()
                    .map(|granted| match granted {
                        Ok(QoS::AtMostOnce) => v5::SubscribeAckReason::GrantedQos0,
                        Ok(QoS::AtLeastOnce) => v5::SubscribeAckReason::GrantedQos1,
                        Ok(QoS::ExactlyOnce) => v5::SubscribeAckReason::GrantedQos2,
                        Err(Refusal::TopicInvalid) => v5::SubscribeAckReason::TopicFilterInvalid,
                        Err(Refusal::NotAuthorized) => v5::SubscribeAckReason::NotAuthorized,
                        Err(Refusal::QuotaExceeded) => v5::SubscribeAckReason::QuotaExceeded,
                        Err(Refusal::SharedNotSupported) => v5::SubscribeAckReason::SharedSubscriptionNotSupported,
                        Err(Refusal::PayloadInvalid | Refusal::Unavailable) => {
                            v5::SubscribeAckReason::ImplementationSpecificError
                        }
                    })
                    .collect();
                let ack = v5::SubscribeAck { packet_id, properties: Vec::new(), reason_string: None, status };
                Self::put5(codec, v5::Packet::SubscribeAck(ack), out)
            }
        }
    }

    pub fn unsuback(&mut self, packet_id: NonZeroU16, existed: &[bool], out: &mut BytesMut) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => Self::put3(codec, v3::Packet::UnsubscribeAck { packet_id }, out),
            Codec::V5(codec) => {
                let status = existed
                    .iter()
                    .map(|&existed| {
                        if existed {
                            v5::UnsubscribeAckReason::Success
                        } else {
                            v5::UnsubscribeAckReason::NoSubscriptionExisted
                        }
                    })
                    .collect();
                let ack = v5::UnsubscribeAck { packet_id, properties: Vec::new(), reason_string: None, status };
                Self::put5(codec, v5::Packet::UnsubscribeAck(ack), out)
            }
        }
    }

    pub fn pingresp(&mut self, out: &mut BytesMut) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => Self::put3(codec, v3::Packet::PingResponse, out),
            Codec::V5(codec) => Self::put5(codec, v5::Packet::PingResponse, out),
        }
    }

    /// A message to the client. v3 drops the v5 properties.
    pub fn publish(&mut self, mut publish: Publish, out: &mut BytesMut) -> Result<(), EncodeError> {
        match self {
            Codec::V3(codec) => {
                publish.properties = None;
                Self::put3(codec, v3::Packet::Publish(Box::new(publish)), out)
            }
            Codec::V5(codec) => Self::put5(codec, v5::Packet::Publish(Box::new(publish)), out),
        }
    }

    /// A server DISCONNECT (v5 only: a v3 server just closes the connection).
    pub fn disconnect(&mut self, goodbye: Goodbye, reason: &str, out: &mut BytesMut) -> Result<(), EncodeError> {
        let Codec::V5(codec) = self else { return Ok(()) };
        let reason_code = match goodbye {
            Goodbye::KeepAliveTimeout => v5::DisconnectReasonCode::KeepAliveTimeout,
            Goodbye::SessionTakenOver => v5::DisconnectReasonCode::SessionTakenOver,
            Goodbye::ShuttingDown => v5::DisconnectReasonCode::ServerShuttingDown,
            Goodbye::ProtocolError => v5::DisconnectReasonCode::ProtocolError,
            Goodbye::MalformedPacket => v5::DisconnectReasonCode::MalformedPacket,
            Goodbye::PacketTooLarge => v5::DisconnectReasonCode::PacketTooLarge,
            Goodbye::QuotaExceeded => v5::DisconnectReasonCode::QuotaExceeded,
            Goodbye::ReceiveMaximumExceeded => v5::DisconnectReasonCode::ReceiveMaximumExceeded,
            Goodbye::TopicAliasInvalid => v5::DisconnectReasonCode::TopicAliasInvalid,
            Goodbye::TopicNameInvalid => v5::DisconnectReasonCode::TopicNameInvalid,
            Goodbye::NotAuthorized => v5::DisconnectReasonCode::NotAuthorized,
            Goodbye::Unavailable => v5::DisconnectReasonCode::ImplementationSpecificError,
        };
        let disconnect = v5::Disconnect {
            reason_code,
            session_expiry_interval_secs: None,
            server_reference: None,
            reason_string: Some(ByteString::from(reason.to_string())),
            user_properties: Vec::new(),
        };
        Self::put5(codec, v5::Packet::Disconnect(disconnect), out)
    }
}

/// The message properties of a v5 will, copied out of the CONNECT's read buffer.
fn will_properties(will: &v5::LastWill) -> MessageProperties {
    MessageProperties {
        user_properties: will.user_properties.iter().map(|(k, v)| (text(k), text(v))).collect(),
        expiry_secs: will.message_expiry_interval.map(NonZeroU32::get),
        payload_utf8: will.is_utf8_payload.unwrap_or(false),
        content_type: will.content_type.as_ref().map(text),
        response_topic: will.response_topic.as_ref().map(text),
        correlation_data: will.correlation_data.as_deref().map(Bytes::copy_from_slice),
    }
}

/// What a CONNACK grants.
pub struct ConnackInfo {
    pub assigned_client_id: Option<String>,
    pub receive_max: u16,
    pub max_packet_size: u32,
    pub topic_alias_max: u16,
    /// Whether the client's earlier session was found.
    pub session_present: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectRefusal {
    BadClientId,
    /// Credentials that do not check out (MQTT 5's 0x86, 3.1.1's return code 4).
    BadCredentials,
    /// No credentials where they are required (0x87, return code 5).
    NotAuthorized,
    /// The user is at its connection limit (0x97 quota exceeded; 3.1.1: return code 3,
    /// server unavailable).
    QuotaExceeded,
    /// Too many failed logins from the client's address (0x9F connection rate exceeded;
    /// 3.1.1: return code 3, server unavailable, which says to try later).
    Throttled,
    Unavailable,
    /// The CONNECT could not be decoded, for the reason a DISCONNECT would give later on.
    Unreadable(Goodbye),
}

/// The CONNACK refusal a CONNECT that did not decode deserves: the server may send no
/// DISCONNECT before it has accepted the connection (MQTT 5, 3.14.0-1). An empty client id
/// with a session that outlives the connection is one the codecs refuse to decode.
pub fn connect_refusal_for(error: &DecodeError) -> ConnectRefusal {
    match error {
        DecodeError::InvalidClientId => ConnectRefusal::BadClientId,
        other => ConnectRefusal::Unreadable(goodbye_for(other)),
    }
}

/// For a 5.0 connection, before the codec decodes what `buf` holds: `Some(None)` while the
/// packet at its start has not all arrived (the codec is given whole packets only, see
/// [`frame`]), `Some(Some(Invalid))` for a whole packet refused for what the codec would call
/// malformed, `None` to go on decoding.
fn refuse_before_decoding(buf: &mut BytesMut, remaining_max: u32) -> Option<Option<Inbound>> {
    match frame::arrived(buf, remaining_max) {
        frame::Arrived::Part(length) => {
            buf.reserve(length - buf.len());
            Some(None)
        }
        frame::Arrived::Whole(length) if frame::publish_topic_alias(&buf[..length]) == Some(0) => {
            buf.advance(length);
            let reason = "topic alias 0 is not a topic alias: they start at 1";
            Some(Some(Inbound::Invalid { goodbye: Goodbye::TopicAliasInvalid, reason }))
        }
        frame::Arrived::Whole(_) | frame::Arrived::Unknown => None,
    }
}

/// The goodbye a decode error deserves.
pub fn goodbye_for(error: &DecodeError) -> Goodbye {
    match error {
        DecodeError::MaxSizeExceeded { .. } => Goodbye::PacketTooLarge,
        DecodeError::MalformedPacket | DecodeError::InvalidLength | DecodeError::Utf8Error => Goodbye::MalformedPacket,
        _ => Goodbye::ProtocolError,
    }
}
