//! A message's MQTT metadata as record headers, and back. What a publisher set travels with its
//! record, so a subscriber gets it unaltered whether the message comes live, replayed to a
//! persistent session or as a retained message; HTTP readers see it as headers, and an HTTP
//! publisher that sets these headers sets the properties MQTT 5 subscribers get.
//!
//! User properties are headers of their own name; the rest are `onehop-mqtt-*` headers.
//! Request/response over MQTT 5 rests on four of them: the payload format, the content type,
//! the response topic and the correlation data (binary, so HTTP shows it in base64 when it is
//! not UTF-8).

use std::num::NonZeroU32;

use bytes::Bytes;
use bytestring::ByteString;
use onehop_engine::subject::validate_subject;
use onehop_engine::{Headers, Text};
use rmqtt_codec::types::QoS;
use rmqtt_codec::v5::PublishProperties;

/// The QoS a message was published with.
pub(super) const QOS_HEADER: &str = "onehop-mqtt-qos";
/// When a message expires (ms since the epoch), from v5 message expiry.
pub(super) const EXPIRES_HEADER: &str = "onehop-mqtt-expires";
/// Marks a message published with the retain flag.
pub(super) const RETAIN_HEADER: &str = "onehop-mqtt-retain";
/// `1` when the publisher said the payload is UTF-8 text (v5 payload format indicator).
pub(super) const PAYLOAD_FORMAT_HEADER: &str = "onehop-mqtt-payload-format";
pub(super) const CONTENT_TYPE_HEADER: &str = "onehop-mqtt-content-type";
pub(super) const RESPONSE_TOPIC_HEADER: &str = "onehop-mqtt-response-topic";
pub(super) const CORRELATION_DATA_HEADER: &str = "onehop-mqtt-correlation-data";
/// The record header naming the client that published a message: for v5 no local, and for a
/// persistent session's QoS 2 message, to recognise a resend after a crash.
pub(super) const CLIENT_HEADER: &str = "onehop-mqtt-client";
/// On a QoS 2 message of a persistent session: its packet id, to recognise a resend after a
/// crash (with the client header).
pub(super) const PACKET_HEADER: &str = "onehop-mqtt-packet";

/// What a message carries besides its topic, payload, QoS and retain flag (MQTT 5; a 3.1.1
/// message has none of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageProperties {
    pub user_properties: Vec<(String, String)>,
    pub expiry_secs: Option<u32>,
    /// Payload format indicator 1: the payload is UTF-8 text.
    pub payload_utf8: bool,
    pub content_type: Option<String>,
    pub response_topic: Option<String>,
    pub correlation_data: Option<Bytes>,
}

impl MessageProperties {
    /// The properties of an inbound PUBLISH, copied out of the packet's read buffer: a
    /// retained message or a will keeps them long after the packet.
    pub fn of_publish(properties: &PublishProperties) -> MessageProperties {
        MessageProperties {
            user_properties: properties.user_properties.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            expiry_secs: properties.message_expiry_interval.map(NonZeroU32::get),
            payload_utf8: properties.is_utf8_payload,
            content_type: properties.content_type.as_ref().map(ByteString::to_string),
            response_topic: properties.response_topic.as_ref().map(ByteString::to_string),
            correlation_data: properties.correlation_data.as_deref().map(Bytes::copy_from_slice),
        }
    }

    /// Why a client's message cannot carry these properties, if it cannot: MQTT 5 says a
    /// response topic is a topic name, so without wildcards (3.3.2-14).
    pub fn fault(&self) -> Option<String> {
        let topic = self.response_topic.as_deref()?;
        let error = validate_subject(topic).err()?;
        Some(format!("response topic {topic:?}: {error}"))
    }
}

/// The value of a message's QoS header.
fn qos_header_value(qos: QoS) -> Bytes {
    Bytes::from_static(match qos {
        QoS::AtMostOnce => b"0",
        QoS::AtLeastOnce => b"1",
        QoS::ExactlyOnce => b"2",
    })
}

/// The record headers of a message published at `qos` with `properties` (and the retain
/// flag), expiry turned into the time it expires at, from `now_ms`.
pub(super) fn message_headers(
    qos: QoS,
    properties: MessageProperties,
    retain: bool,
    now_ms: i64,
) -> Vec<(Text, Option<Bytes>)> {
    let MessageProperties {
        user_properties,
        expiry_secs,
        payload_utf8,
        content_type,
        response_topic,
        correlation_data,
    } = properties;
    let mut headers: Vec<(Text, Option<Bytes>)> = Vec::with_capacity(user_properties.len() + 4);
    // A keyed write's tag is the server's own: a client's user property of its name is dropped.
    let own = |name: &str| name == onehop_engine::idempotency::IDEMPOTENCY_HEADER;
    headers.extend(
        user_properties
            .into_iter()
            .filter(|(name, _)| !own(name))
            .map(|(name, value)| (Text::from(name), Some(Bytes::from(value)))),
    );
    headers.push((Text::from_static(QOS_HEADER), Some(qos_header_value(qos))));
    if let Some(secs) = expiry_secs {
        let expires = (now_ms + i64::from(secs) * 1000).to_string();
        headers.push((Text::from_static(EXPIRES_HEADER), Some(Bytes::from(expires))));
    }
    if retain {
        headers.push((Text::from_static(RETAIN_HEADER), Some(Bytes::from_static(b"1"))));
    }
    if payload_utf8 {
        headers.push((Text::from_static(PAYLOAD_FORMAT_HEADER), Some(Bytes::from_static(b"1"))));
    }
    let texts = [(CONTENT_TYPE_HEADER, content_type), (RESPONSE_TOPIC_HEADER, response_topic)];
    for (name, value) in texts {
        if let Some(value) = value {
            headers.push((Text::from_static(name), Some(Bytes::from(value))));
        }
    }
    if let Some(data) = correlation_data {
        headers.push((Text::from_static(CORRELATION_DATA_HEADER), Some(data)));
    }
    headers
}

/// The v5 properties of an outgoing message from its record's headers: user properties from
/// every header not named `onehop-*`, and the request/response properties. A response topic
/// that is not a topic name (set over HTTP) is left out rather than sent to a client that
/// would refuse the whole message for it.
pub(super) fn publish_properties(
    headers: &Headers,
    expiry: Option<NonZeroU32>,
    subscription_id: Option<NonZeroU32>,
) -> PublishProperties {
    let text = |name: &str| headers.get(name).and_then(|value| std::str::from_utf8(value).ok());
    PublishProperties {
        topic_alias: None,
        correlation_data: headers.get(CORRELATION_DATA_HEADER).map(Bytes::copy_from_slice),
        message_expiry_interval: expiry,
        content_type: text(CONTENT_TYPE_HEADER).map(ByteString::from),
        user_properties: headers
            .iter()
            .filter(|(name, _)| !name.starts_with("onehop-"))
            // MQTT has no null user property: a null header value reaches it as empty text.
            .map(|(name, value)| {
                let value = String::from_utf8_lossy(value.unwrap_or_default()).into_owned();
                (ByteString::from(name), ByteString::from(value))
            })
            .collect(),
        is_utf8_payload: text(PAYLOAD_FORMAT_HEADER) == Some("1"),
        response_topic: text(RESPONSE_TOPIC_HEADER)
            .filter(|topic| validate_subject(topic).is_ok())
            .map(ByteString::from),
        subscription_ids: subscription_id.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_come_back_from_the_headers_they_are_stored_as() {
        let properties = MessageProperties {
            user_properties: vec![("site".into(), "oslo".into())],
            expiry_secs: None,
            payload_utf8: true,
            content_type: Some("application/json".into()),
            response_topic: Some("replies/7".into()),
            correlation_data: Some(Bytes::from_static(&[0, 0xff, 7])),
        };
        let headers = Headers::from(&message_headers(QoS::AtLeastOnce, properties, false, 0)[..]);
        let id = NonZeroU32::new(3);
        let back = publish_properties(&headers, None, id);
        assert!(back.is_utf8_payload);
        assert_eq!(back.content_type.as_deref(), Some("application/json"));
        assert_eq!(back.response_topic.as_deref(), Some("replies/7"));
        assert_eq!(back.correlation_data.as_deref(), Some(&[0, 0xff, 7][..]));
        assert_eq!(back.user_properties.len(), 1, "only the user's: {:?}", back.user_properties);
        assert_eq!(back.subscription_ids, [NonZeroU32::new(3).unwrap()]);
        // None set: none sent.
        let plain = Headers::from(&message_headers(QoS::AtMostOnce, MessageProperties::default(), true, 0)[..]);
        assert_eq!(publish_properties(&plain, None, None), PublishProperties::default());
    }

    #[test]
    fn a_response_topic_must_be_a_topic_name() {
        let wild = MessageProperties { response_topic: Some("replies/+".into()), ..Default::default() };
        assert!(wild.fault().is_some_and(|fault| fault.contains("wildcards")), "{:?}", wild.fault());
        let plain = MessageProperties { response_topic: Some("replies/1".into()), ..Default::default() };
        assert_eq!(plain.fault(), None);
        // Set over HTTP, a bad one is left out.
        let headers = Headers::from(&[(Text::from(RESPONSE_TOPIC_HEADER), Bytes::from_static(b"a/#"))][..]);
        assert_eq!(publish_properties(&headers, None, None).response_topic, None);
    }
}
