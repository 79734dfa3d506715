//! Retained messages: the last retained message of each topic, kept in the compacted system
//! topic `__mqtt_retained` (key = topic, value = payload, headers = QoS and the message's
//! properties, [`super::headers`]; a tombstone when an empty retained message clears the topic) and in memory,
//! replayed from that topic at start. So retained messages survive restarts.
//!
//! A retained PUBLISH is published through `RetainedStore::publish` alone: its record in its
//! stream, then the retained message, both durable before it is acknowledged.
//!
//! The memory map keeps, per topic, the log offset of the message it holds: a message replaces
//! another only if it is later in the log, so concurrent retained publishes to one topic end
//! as the log orders them, whatever order their acknowledgements arrive in.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use onehop_engine::route::Route;
use onehop_engine::subject::SubjectFilter;
use onehop_engine::system::{SystemTopic, SystemTopicConfig};
use onehop_engine::{Durability, Engine, EngineError, Headers, NewRecord, Text};

pub const RETAINED_TOPIC: &str = "__mqtt_retained";

/// A retained message.
#[derive(Clone, Debug)]
pub struct Retained {
    pub topic: String,
    pub payload: Bytes,
    /// The record headers it was published with (QoS and properties, [`super::headers`]).
    pub headers: Headers,
}

impl Retained {
    /// A message in buffers of its own. A payload fresh from a packet or a log read is a slice
    /// of the connection's read buffer or of a whole batch, and a retained message lives until
    /// its topic is cleared: shared, a small message could hold kilobytes (a replay, megabytes)
    /// for as long.
    fn owned(topic: String, payload: &[u8], headers: &[(Text, Bytes)]) -> Retained {
        Retained {
            topic,
            payload: Bytes::copy_from_slice(payload),
            // Encoded into a buffer of its own.
            headers: Headers::from(headers),
        }
    }
}

pub struct RetainedStore {
    log: Arc<SystemTopic>,
    /// Topic → (offset, message).
    messages: RwLock<BTreeMap<String, (u64, Retained)>>,
}

impl RetainedStore {
    /// Opens (creating it the first time) and replays the retained topic. A retained message
    /// is as large as a record of its stream may be.
    pub fn open(engine: &Engine) -> Result<RetainedStore, EngineError> {
        let config = SystemTopicConfig {
            record_bytes_max: engine.options().stream_defaults.record_bytes_max,
            ..SystemTopicConfig::default()
        };
        let store = RetainedStore { log: engine.system_topic(RETAINED_TOPIC, &config)?, messages: RwLock::default() };
        store.log.replay(|record| {
            if let Some(topic) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) {
                store.apply(record.offset, topic.to_string(), record.value, &record.headers.to_vec());
            }
            Ok::<(), EngineError>(())
        })?;
        tracing::info!(retained = store.len(), "retained MQTT messages replayed");
        Ok(store)
    }

    pub fn len(&self) -> usize {
        self.messages.read().expect("retained lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn apply(&self, offset: u64, topic: String, payload: Option<Bytes>, headers: &[(Text, Bytes)]) {
        let mut messages = self.messages.write().expect("retained lock");
        if messages.get(&topic).is_some_and(|(held, _)| *held > offset) {
            return;
        }
        match payload.filter(|payload| !payload.is_empty()) {
            Some(payload) => {
                let message = Retained::owned(topic.clone(), &payload, headers);
                messages.insert(topic, (offset, message));
            }
            None => {
                messages.remove(&topic);
            }
        }
        metrics::gauge!("mqtt_retained_messages").set(messages.len() as f64);
    }

    /// Publishes a retained message on `route`: `record` (the topic its subject, the payload
    /// its value) is queued to its stream at once, behind what was queued there before, and
    /// once it is durable, stored as its topic's retained message (an empty payload clears
    /// it). The future resolves once both are durable. The one way a retained message is
    /// published, so that the two writes can become one.
    pub(super) async fn publish(
        self: &Arc<Self>,
        route: &Route,
        record: NewRecord,
        durability: Option<Durability>,
    ) -> Result<impl Future<Output = Result<(), String>> + Send + 'static, EngineError> {
        let queued = route.enqueue(std::slice::from_ref(&record), durability).await?;
        let store = self.clone();
        Ok(async move {
            queued.await.map_err(|error| error.to_string())?;
            let topic = record.subject.as_deref().unwrap_or_default();
            store.set(topic, record.value.unwrap_or_default(), record.headers).await
        })
    }

    /// Stores `payload` as the retained message of `topic` (an empty payload clears it),
    /// durably; returns once it is.
    async fn set(&self, topic: &str, payload: Bytes, headers: Vec<(Text, Bytes)>) -> Result<(), String> {
        let record = NewRecord {
            timestamp_ms: None,
            key: Some(Bytes::from(topic.to_string())),
            subject: None,
            headers: if payload.is_empty() { Vec::new() } else { headers.clone() },
            value: (!payload.is_empty()).then(|| payload.clone()),
        };
        let offset = self.log.append(std::slice::from_ref(&record)).await.map_err(|error| error.to_string())?;
        self.apply(offset, topic.to_string(), Some(payload), &headers);
        Ok(())
    }

    /// The retained messages whose topic matches `filter`.
    pub fn matching(&self, filter: &SubjectFilter) -> Vec<Retained> {
        let messages = self.messages.read().expect("retained lock");
        let first = filter.as_str().split('/').next().unwrap_or_default();
        if first == "+" || first == "#" {
            return messages
                .values()
                .filter(|(_, message)| filter.matches(&message.topic))
                .map(|(_, message)| message.clone())
                .collect();
        }
        // Only topics under the filter's stream can match.
        messages
            .range(first.to_string()..)
            .take_while(|(topic, _)| topic.starts_with(first))
            .filter(|(topic, _)| topic.split('/').next() == Some(first) && filter.matches(topic))
            .map(|(_, (_, message))| message.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `part` lies inside `whole`'s memory.
    fn within(part: &[u8], whole: &[u8]) -> bool {
        let range = whole.as_ptr_range();
        range.contains(&part.as_ptr())
    }

    #[test]
    fn a_retained_message_holds_only_its_own_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_in(dir.path(), onehop_engine::EngineOptions::default()).unwrap();
        let store = RetainedStore::open(&engine).unwrap();
        // A packet as the codec leaves it: topic, header value and payload slices of one buffer.
        let buffer = Bytes::from(vec![b'x'; 64 * 1024]);
        let name = Text::from_utf8(buffer.slice(0..4)).unwrap();
        store.apply(7, "home/hall".into(), Some(buffer.slice(100..110)), &[(name, buffer.slice(4..5))]);
        let message = store.messages.read().unwrap().get("home/hall").unwrap().1.clone();
        assert_eq!(&message.payload[..], &[b'x'; 10]);
        let headers: Vec<(&str, &[u8])> = message.headers.iter().collect();
        assert_eq!(headers, [("xxxx", &b"x"[..])]);
        assert!(!within(&message.payload, &buffer), "the payload is a copy");
        assert!(!within(headers[0].0.as_bytes(), &buffer), "the header name is a copy");
        assert!(!within(headers[0].1, &buffer), "the header value is a copy");
    }
}
