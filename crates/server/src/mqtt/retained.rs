//! Retained messages: the last retained message of each topic.
//!
//! **The stream record is the only write.** A retained PUBLISH is one record in its stream,
//! flagged with the `onehop-mqtt-retain` header ([`super::headers`]), appended once: it is
//! retained exactly when it is stored, with no second write to get out of step after a crash.
//! The store in memory (topic → message, and the stream position it came from) is derived from
//! those records, as the engine derives table state and view state from the log.
//!
//! **The checkpoint.** About once a second, when messages changed or the streams grew, they are
//! written to the
//! compacted system topic `__mqtt_retained` (key = topic, value = payload, headers = the
//! message's, plus where it came from; a tombstone once a topic is cleared), in one batch with
//! the positions they cover: per stream partition, the offset below which every retained record
//! is in the checkpoint. A position never passes a retained publish still on its way to the
//! log. At start the checkpoint is read back, then each stream is read on from its positions
//! (a stream the positions do not know, from its start), folding in what the last second before
//! a stop or crash retained; then a new checkpoint is written if the read found the log had
//! grown (an idle server writes nothing).
//!
//! A message replaces another only if it is later in the log (for one topic, in one stream
//! partition: one topic's messages keep one partition), so concurrent retained publishes to one
//! topic end as the log orders them, whatever order their acknowledgements arrive in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use onehop_engine::route::Route;
use onehop_engine::subject::SubjectFilter;
use onehop_engine::system::{SystemTopic, SystemTopicConfig};
use onehop_engine::{Durability, Engine, EngineError, Headers, NewRecord, Positions, Record, Text};
use serde::{Deserialize, Serialize};

use super::headers::RETAIN_HEADER;

pub const RETAINED_TOPIC: &str = "__mqtt_retained";

/// How often the messages that changed are checkpointed: what a start reads of the streams
/// beyond the checkpoint, at most, is what was published in about this long.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// How soon a cluster node takes in a retained message another node published, at most.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(100);
/// The checkpoint's record of the positions it covers; no topic starts with a NUL.
const POSITIONS_KEY: &str = "\u{0}positions";
/// The header of a checkpointed message naming where it came from: `{stream}:{partition}:{offset}`.
const SOURCE_HEADER: &str = "onehop-retained-from";

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
    fn owned(topic: String, payload: &[u8], headers: &[(Text, Option<Bytes>)]) -> Retained {
        Retained {
            topic,
            payload: Bytes::copy_from_slice(payload),
            // Encoded into a buffer of its own.
            headers: Headers::from(headers),
        }
    }
}

/// Where a retained message came from: its record's stream, partition and offset.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Source {
    stream: String,
    partition: u32,
    offset: u64,
}

impl Source {
    /// Whether a message from `self` replaces one from `held`: later in the same partition,
    /// or from another partition (the topic's stream changed, so the newer route wins).
    fn replaces(&self, held: &Source) -> bool {
        self.stream != held.stream || self.partition != held.partition || self.offset > held.offset
    }

    fn header(&self) -> Bytes {
        Bytes::from(format!("{}:{}:{}", self.stream, self.partition, self.offset))
    }

    fn parse(text: &[u8]) -> Option<Source> {
        let text = std::str::from_utf8(text).ok()?;
        let mut parts = text.rsplitn(3, ':');
        let offset = parts.next()?.parse().ok()?;
        let partition = parts.next()?.parse().ok()?;
        let stream = parts.next()?.to_string();
        Some(Source { stream, partition, offset })
    }
}

/// What the memory holds of a topic: its message (`None` once cleared, until the clearing is
/// checkpointed) and where it came from.
struct Held {
    source: Source,
    message: Option<Retained>,
    /// Changed since the last checkpoint.
    dirty: bool,
}

#[derive(Serialize, Deserialize)]
struct StoredPositions {
    positions: Positions,
}

pub struct RetainedStore {
    log: Arc<SystemTopic>,
    engine: Arc<Engine>,
    /// Topic → what is held of it. Published messages are applied once durable.
    messages: RwLock<BTreeMap<String, Held>>,
    /// Retained publishes on their way to the log, per stream partition: the lowest offset each
    /// could get (the partition's end when it was queued). A checkpoint's position never
    /// passes one of them.
    in_flight: Mutex<HashMap<(String, u32), Vec<u64>>>,
    /// The positions the last checkpoint wrote (at start, those read back): one is written
    /// when the log's ends have moved past them, so that a start reads on little.
    checkpointed: Mutex<Positions>,
    /// On a cluster node: how far the streams were read for retained records that came from
    /// other nodes (see [`RetainedStore::keep_checkpointed`]).
    followed: Mutex<Positions>,
}

impl RetainedStore {
    /// Opens (creating it the first time) the retained checkpoint, reads it back and reads on
    /// the streams from where it ends. A retained message is as large as a record of its stream
    /// may be.
    pub fn open(engine: &Arc<Engine>) -> Result<RetainedStore, EngineError> {
        let config = SystemTopicConfig {
            record_bytes_max: engine.options().stream_defaults.record_bytes_max,
            ..SystemTopicConfig::default()
        };
        let store = RetainedStore {
            log: engine.system_topic(RETAINED_TOPIC, &config)?,
            engine: engine.clone(),
            messages: RwLock::default(),
            in_flight: Mutex::default(),
            checkpointed: Mutex::default(),
            followed: Mutex::default(),
        };
        let mut positions: Option<Positions> = None;
        store.log.replay(|record| {
            store.restore(record, &mut positions);
            Ok::<(), EngineError>(())
        })?;
        // A checkpoint without positions was written by a version that stored each retained
        // message itself after its stream record: it holds everything, so nothing is read on.
        *store.followed.lock().expect("followed lock") = store.end_positions();
        let caught_up = store.catch_up(positions.as_ref().unwrap_or(&store.end_positions()))?;
        *store.checkpointed.lock().expect("checkpointed lock") = positions.unwrap_or_default();
        tracing::info!(retained = store.len(), read_on = caught_up, "retained MQTT messages restored");
        store.gauge();
        Ok(store)
    }

    /// Folds one record of the checkpoint topic in.
    fn restore(&self, record: Record, positions: &mut Option<Positions>) {
        let Some(topic) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) else { return };
        if topic == POSITIONS_KEY {
            match record.value.as_deref().map(serde_json::from_slice::<StoredPositions>) {
                Some(Ok(stored)) => *positions = Some(stored.positions),
                Some(Err(error)) => tracing::warn!(%error, "skipping unreadable retained positions"),
                None => {}
            }
            return;
        }
        let mut messages = self.messages.write().expect("retained lock");
        let Some(value) = record.value.filter(|value| !value.is_empty()) else {
            messages.remove(topic);
            return;
        };
        let mut headers = record.headers.to_vec();
        let source = headers
            .iter()
            .position(|(name, _)| name.as_str() == SOURCE_HEADER)
            .and_then(|at| Source::parse(&headers.remove(at).1.unwrap_or_default()));
        // A message of the earlier layout names no source: it stands until a newer one comes.
        let source = source.unwrap_or(Source { stream: String::new(), partition: 0, offset: 0 });
        let message = Retained::owned(topic.to_string(), &value, &headers);
        messages.insert(topic.to_string(), Held { source, message: Some(message), dirty: false });
    }

    /// Reads every stream on from `positions`, folding in the retained records; returns how
    /// many there were.
    fn catch_up(&self, positions: &Positions) -> Result<u64, EngineError> {
        let mut found = 0;
        self.engine.read_on(positions, |stream, partition, record| {
            if retained_record(record) {
                found += 1;
                self.apply(Source { stream: stream.name().to_string(), partition, offset: record.offset }, record);
            }
        })?;
        Ok(found)
    }

    /// Every stream's end offsets: positions that cover everything in the log now.
    fn end_positions(&self) -> Positions {
        self.engine.end_positions()
    }

    pub fn len(&self) -> usize {
        self.messages.read().expect("retained lock").values().filter(|held| held.message.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn gauge(&self) {
        metrics::gauge!("mqtt_retained_messages").set(self.len() as f64);
    }

    /// Takes the retained record `record` (from `source`) into memory, unless a later one of
    /// its topic is held; an empty payload clears the topic.
    fn apply(&self, source: Source, record: &Record) {
        let Some(topic) = record.subject.as_deref() else { return };
        let mut messages = self.messages.write().expect("retained lock");
        if messages.get(topic).is_some_and(|held| !source.replaces(&held.source)) {
            return;
        }
        let message = record.value.as_deref().filter(|payload| !payload.is_empty()).map(|payload| {
            let headers = record.headers.to_vec();
            Retained::owned(topic.to_string(), payload, &headers)
        });
        messages.insert(topic.to_string(), Held { source, message, dirty: true });
    }

    /// Publishes a retained message on `route`: `record` (the topic its subject, the payload
    /// its value, flagged retained by its headers) is queued to its stream at once, behind what
    /// was queued there before; that one append is the message, stored and retained at once.
    /// The future resolves once it is durable, with the message then held in memory. The one
    /// way a retained message is published.
    pub(super) async fn publish(
        self: &Arc<Self>,
        route: &Route,
        record: NewRecord,
        durability: Option<Durability>,
    ) -> Result<impl Future<Output = Result<(), EngineError>> + Send + 'static, EngineError> {
        debug_assert!(
            record.headers.iter().any(|(name, _)| name.as_str() == RETAIN_HEADER),
            "a retained message carries the retain flag"
        );
        let key = (route.stream.name().to_string(), route.partition);
        let lowest = route.stream.end_offset(route.partition)?;
        self.in_flight.lock().expect("in-flight lock").entry(key.clone()).or_default().push(lowest);
        let queued = route.enqueue(std::slice::from_ref(&record), durability).await;
        let store = self.clone();
        let done = move |store: &RetainedStore| {
            let mut in_flight = store.in_flight.lock().expect("in-flight lock");
            if let Some(lows) = in_flight.get_mut(&key) {
                if let Some(at) = lows.iter().position(|low| *low == lowest) {
                    lows.swap_remove(at);
                }
                if lows.is_empty() {
                    in_flight.remove(&key);
                }
            }
        };
        let queued = match queued {
            Ok(queued) => queued,
            Err(error) => {
                done(&store);
                return Err(error);
            }
        };
        let (stream, partition) = (route.stream.name().to_string(), route.partition);
        Ok(async move {
            let acked = queued.await;
            if let Ok(ack) = &acked {
                let stored = Record {
                    offset: ack.base_offset,
                    timestamp_ms: record.timestamp_ms.unwrap_or_default(),
                    key: record.key.clone(),
                    subject: record.subject.clone(),
                    headers: Headers::from(&record.headers[..]),
                    value: record.value.clone(),
                };
                store.apply(Source { stream, partition, offset: ack.base_offset }, &stored);
                store.gauge();
            }
            done(&store);
            acked.map(drop).map_err(EngineError::from)
        })
    }

    /// Writes the messages that changed since the last checkpoint, with the positions they
    /// cover, as one batch; returns how many messages it wrote.
    pub async fn checkpoint(&self) -> Result<usize, EngineError> {
        // Positions first: a retained publish queued after this reads an end at or past them,
        // and one queued before and still on its way holds them back.
        let mut positions = self.end_positions();
        {
            let in_flight = self.in_flight.lock().expect("in-flight lock");
            for ((stream, partition), lows) in in_flight.iter() {
                if let (Some(ends), Some(low)) = (positions.get_mut(stream), lows.iter().min())
                    && let Some(end) = ends.get_mut(*partition as usize)
                {
                    *end = (*end).min(*low);
                }
            }
        }
        if self.engine.is_replicated() {
            // Nor past what was read for other nodes' retained messages: a stream not read yet
            // is left out, so that a start reads it from its beginning.
            let followed = self.followed.lock().expect("followed lock");
            positions.retain(|stream, ends| match followed.get(stream) {
                Some(read) => {
                    for (end, read) in ends.iter_mut().zip(read) {
                        *end = (*end).min(*read);
                    }
                    ends.truncate(read.len());
                    true
                }
                None => false,
            });
        }
        let mut records = Vec::new();
        let mut written = Vec::new();
        {
            let messages = self.messages.read().expect("retained lock");
            for (topic, held) in messages.iter().filter(|(_, held)| held.dirty) {
                let key = Some(Bytes::from(topic.clone()));
                let record = match &held.message {
                    Some(message) => {
                        let mut headers: Vec<(Text, Option<Bytes>)> = message
                            .headers
                            .iter()
                            .map(|(name, value)| (Text::from(name), value.map(Bytes::copy_from_slice)))
                            .collect();
                        headers.push((Text::from_static(SOURCE_HEADER), Some(held.source.header())));
                        NewRecord { key, headers, value: Some(message.payload.clone()), ..NewRecord::default() }
                    }
                    None => NewRecord { key, ..NewRecord::default() },
                };
                records.push(record);
                written.push((topic.clone(), held.source.clone()));
            }
        }
        let stored =
            serde_json::to_vec(&StoredPositions { positions: positions.clone() }).expect("positions serialize");
        records.push(NewRecord::keyed(Bytes::from_static(POSITIONS_KEY.as_bytes()), stored));
        self.log.append(&records).await?;
        *self.checkpointed.lock().expect("checkpointed lock") = positions;
        // What is checkpointed is clean, unless it changed meanwhile; a cleared topic is gone.
        let mut messages = self.messages.write().expect("retained lock");
        for (topic, source) in &written {
            if let Some(held) = messages.get_mut(topic)
                && held.source == *source
            {
                held.dirty = false;
                if held.message.is_none() {
                    messages.remove(topic);
                }
            }
        }
        Ok(written.len())
    }

    /// Checkpoints every [`CHECKPOINT_INTERVAL`] while something changed, until `stop`
    /// turns true; then once more.
    ///
    /// On a cluster node, retained messages published on other nodes reach this one as stream
    /// records only: every [`FOLLOW_INTERVAL`] the streams are read on from where the last
    /// reading stopped, and the retained records found are taken in (each replaces what it is
    /// later than, in log order, as on every node).
    pub async fn keep_checkpointed(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let following = self.engine.is_replicated();
        let mut last_checkpoint = tokio::time::Instant::now();
        // What the start read on goes down at once; an idle server writes nothing.
        let mut first = true;
        loop {
            if following {
                // Reading the streams blocks on the disk (the page cache, mostly).
                let store = self.clone();
                match tokio::task::spawn_blocking(move || store.follow()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::warn!(%error, "reading retained messages from the streams failed; trying again");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "reading retained messages from the streams stopped; trying again")
                    }
                }
            }
            if (first || last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL) && self.changed() {
                if let Err(error) = self.checkpoint().await {
                    tracing::warn!(%error, "the retained messages could not be checkpointed; the next start reads on further");
                }
                last_checkpoint = tokio::time::Instant::now();
            }
            first = false;
            let pause = if following { FOLLOW_INTERVAL } else { CHECKPOINT_INTERVAL };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = async { drop(stop.wait_for(|stop| *stop).await) } => {
                    let _ = self.checkpoint().await;
                    return;
                }
            }
        }
    }

    /// Takes in the retained records the streams gained since the last reading (on a cluster
    /// node, those other nodes published).
    fn follow(&self) -> Result<(), EngineError> {
        let ends = self.end_positions();
        let followed = self.followed.lock().expect("followed lock").clone();
        if ends == followed {
            return Ok(());
        }
        if self.catch_up(&followed)? > 0 {
            self.gauge();
        }
        *self.followed.lock().expect("followed lock") = ends;
        Ok(())
    }

    /// Whether a message changed or a stream grew past the last checkpoint's positions.
    fn changed(&self) -> bool {
        self.messages.read().expect("retained lock").values().any(|held| held.dirty)
            || self.engine.grown_past(&self.checkpointed.lock().expect("checkpointed lock"))
    }

    /// The retained messages whose topic matches `filter`, each with the stream that stored it
    /// (empty for a message checkpointed before sources were kept): what a subscriber must be
    /// allowed to read, whichever stream the topic would go to now.
    pub fn matching(&self, filter: &SubjectFilter) -> Vec<(String, Retained)> {
        let messages = self.messages.read().expect("retained lock");
        let held = |(_, held): (&String, &Held)| Some((held.source.stream.clone(), held.message.clone()?));
        let first = filter.as_str().split('/').next().unwrap_or_default();
        if first == "+" || first == "#" {
            return messages.iter().filter(|(topic, _)| filter.matches(topic)).filter_map(held).collect();
        }
        // Only topics under the filter's stream can match.
        messages
            .range(first.to_string()..)
            .take_while(|(topic, _)| topic.starts_with(first))
            .filter(|(topic, _)| topic.split('/').next() == Some(first) && filter.matches(topic))
            .filter_map(held)
            .collect()
    }
}

/// Whether a stream record is a retained message (its PUBLISH had the retain flag).
fn retained_record(record: &Record) -> bool {
    record.subject.is_some() && record.headers.get(RETAIN_HEADER).is_some()
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
        let engine = Arc::new(Engine::open_in(dir.path(), onehop_engine::EngineOptions::default()).unwrap());
        let store = RetainedStore::open(&engine).unwrap();
        // A record as a read leaves it: subject, header and payload slices of one batch buffer.
        let buffer = Bytes::from(vec![b'x'; 64 * 1024]);
        let name = Text::from_utf8(buffer.slice(0..4)).unwrap();
        let record = Record {
            offset: 7,
            timestamp_ms: 0,
            key: None,
            subject: Some(Text::from_utf8(buffer.slice(200..209)).unwrap()),
            headers: Headers::from(&[(name, Some(buffer.slice(4..5)))][..]),
            value: Some(buffer.slice(100..110)),
        };
        store.apply(Source { stream: "home".into(), partition: 0, offset: 7 }, &record);
        let topic = "x".repeat(9);
        let message = store.messages.read().unwrap().get(&topic).unwrap().message.clone().unwrap();
        assert_eq!(&message.payload[..], &[b'x'; 10]);
        let headers: Vec<(&str, &[u8])> =
            message.headers.iter().map(|(name, value)| (name, value.unwrap_or_default())).collect();
        assert_eq!(headers, [("xxxx", &b"x"[..])]);
        assert!(!within(&message.payload, &buffer), "the payload is a copy");
        assert!(!within(headers[0].0.as_bytes(), &buffer), "the header name is a copy");
        assert!(!within(headers[0].1, &buffer), "the header value is a copy");
    }

    #[tokio::test]
    async fn an_idle_server_writes_nothing_and_the_positions_follow_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let open = || Arc::new(Engine::open_in(dir.path(), onehop_engine::EngineOptions::default()).unwrap());
        let engine = open();
        let store = RetainedStore::open(&engine).unwrap();
        assert!(!store.changed(), "a fresh start has nothing to checkpoint");
        let def = onehop_engine::StreamDef {
            name: "home".into(),
            partitions: 2,
            retention_ms: None,
            retention_bytes: None,
            durability: Durability::Fsync,
            mqtt_topic: None,
            compacted: false,
        };
        let stream = engine.create_stream(def).await.unwrap();
        assert!(!store.changed(), "an empty stream moves no position");
        // Plain records, none retained: the positions still move, so a start reads on little.
        let plain =
            NewRecord { subject: Some(Text::from("home/a")), value: Some(Bytes::from("1")), ..NewRecord::default() };
        stream.publish(&[plain.clone(), plain.clone(), plain], None).await.unwrap();
        assert!(store.changed(), "the log grew past the checkpoint's positions");
        assert_eq!(store.checkpoint().await.unwrap(), 0, "no message changed");
        assert!(!store.changed());
        // A retained record appended behind the store's back (as a crash before the checkpoint
        // leaves it) is read on at the next start, and only it.
        let retained = NewRecord {
            subject: Some(Text::from("home/b")),
            headers: vec![(Text::from_static(RETAIN_HEADER), Some(Bytes::from_static(b"1")))],
            value: Some(Bytes::from("on")),
            ..NewRecord::default()
        };
        stream.publish(&[retained], None).await.unwrap();
        drop((store, stream));
        drop(engine);
        let engine = open();
        let store = RetainedStore::open(&engine).unwrap();
        let found = store.matching(&SubjectFilter::parse("home/#").unwrap());
        assert_eq!(found.len(), 1);
        assert_eq!(&found[0].1.payload[..], b"on");
        assert_eq!(found[0].0, "home", "it names the stream that stored it");
        assert!(store.changed(), "the start read on, so its positions go down");
        store.checkpoint().await.unwrap();
        assert_eq!(*store.checkpointed.lock().unwrap(), store.end_positions());
    }

    #[test]
    fn a_source_names_its_stream_partition_and_offset_and_only_a_later_one_replaces_it() {
        let held = Source { stream: "a.b-c".into(), partition: 3, offset: 41 };
        assert_eq!(Source::parse(&held.header()), Some(held.clone()));
        assert!(Source { offset: 42, ..held.clone() }.replaces(&held));
        assert!(!Source { offset: 40, ..held.clone() }.replaces(&held));
        assert!(Source { partition: 1, offset: 0, ..held.clone() }.replaces(&held), "the topic moved");
        assert_eq!(Source::parse(b"no-colons"), None);
    }
}
