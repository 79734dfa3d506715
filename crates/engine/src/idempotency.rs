//! Idempotent writes: a client names a write with a key (HTTP's `Idempotency-Key`), and a
//! retry of it, within the window, is answered with the first write's answer instead of
//! writing it again.
//!
//! **The stream records are the truth.** Every record of a keyed write carries the header
//! [`IDEMPOTENCY_HEADER`]: who wrote it (the scope: the user, or none), the key, a fingerprint
//! of what was written, and the record's place in the write (`i` of `n`). What the memory holds
//! (scope and key → fingerprint and where each record went) is derived from those records, as
//! the Kafka producer states are from theirs: folded in as the records are appended (on a
//! cluster node, as it applies them), and at start read back from a checkpoint and the streams
//! read on from it.
//!
//! **A retry** of a key written whole is answered with the places it was written to; of a key
//! that named another write (another fingerprint), refused (`idempotency_key_reused`); of a key
//! whose write is on its way, refused for now (`idempotency_key_in_progress`: try again). A
//! write across partitions that a crash cut short (some partitions appended, not all) is
//! finished by its retry: only its missing records are written.
//!
//! **On a cluster** the leader decides, as it prepares the write (one at a time, against what
//! every node applied and what it prepared in its term), and a command holds the whole write:
//! it is applied whole on every node or not at all.
//!
//! **The checkpoint**: about once a second, when keys changed or (once a key was ever written)
//! the streams grew, the keys are written to the compacted system topic `__idempotency` with the
//! stream positions they cover, never past a keyed write still on its way. Keys older than the
//! window are dropped then; past [`EngineOptions::idempotency_keys_max`], the oldest go first.
//!
//! [`EngineOptions::idempotency_keys_max`]: crate::EngineOptions::idempotency_keys_max

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use onehop_log::{Log, NewRecord, Record, Text, now_ms};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::engine::Positions;
use crate::error::EngineError;
use crate::stream::Published;
use crate::system::{SystemTopic, SystemTopicConfig};

/// The header on every record of a keyed write: a JSON array `[scope, key, fingerprint, i, n]`.
pub const IDEMPOTENCY_HEADER: &str = "onehop-idempotency";
/// The checkpoint's compacted system topic.
pub const IDEMPOTENCY_TOPIC: &str = "__idempotency";
/// The longest key a client may give.
pub const KEY_BYTES_MAX: usize = 255;
/// Retries answered from memory with the first write's answer.
pub const REPLAYS: &str = "idempotent_replays_total";
/// Keys dropped before their window ended, to stay within the key limit.
pub const EVICTED: &str = "idempotency_keys_evicted_total";

/// How often the keys that changed are checkpointed.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// The checkpoint's record of the positions it covers; no key record starts with a NUL.
const POSITIONS_KEY: &str = "\u{0}positions";

/// A keyed write: the stream it writes to, who writes it, and the key they named it with.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteKey {
    pub stream: String,
    /// The user that wrote it (`""`: anonymous): one user's keys are not another's.
    pub scope: String,
    pub key: String,
}

/// Whether `key` may name a write: 1 to [`KEY_BYTES_MAX`] visible ASCII characters.
pub fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > KEY_BYTES_MAX {
        return Err(format!("an idempotency key is 1 to {KEY_BYTES_MAX} characters, not {}", key.len()));
    }
    if let Some(bad) = key.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("{bad:?} is not allowed in an idempotency key: use visible ASCII characters"));
    }
    Ok(())
}

/// A fingerprint of what `records` write to `stream`: their keys, subjects, headers and
/// values (not timestamps, which the server may give). A retry writes the same fingerprint.
pub fn fingerprint(stream: &str, records: &[NewRecord]) -> String {
    let mut hash = Sha256::new();
    let mut field = |bytes: Option<&[u8]>| match bytes {
        Some(bytes) => {
            hash.update([1]);
            hash.update((bytes.len() as u64).to_le_bytes());
            hash.update(bytes);
        }
        None => hash.update([0]),
    };
    field(Some(stream.as_bytes()));
    for record in records {
        field(record.key.as_deref());
        field(record.subject.as_ref().map(|subject| subject.as_bytes()));
        let own = record.headers.iter().filter(|(name, _)| name.as_str() != IDEMPOTENCY_HEADER);
        field(Some(&(own.clone().count() as u64).to_le_bytes()));
        for (name, value) in own {
            field(Some(name.as_bytes()));
            field(value.as_deref());
        }
        field(record.value.as_deref());
    }
    let digest = hash.finalize();
    digest[..16].iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What a record's [`IDEMPOTENCY_HEADER`] says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Tag {
    pub scope: String,
    pub key: String,
    pub fingerprint: String,
    pub index: usize,
    pub count: usize,
}

impl Tag {
    fn value(&self) -> Bytes {
        let array = (&self.scope, &self.key, &self.fingerprint, self.index, self.count);
        Bytes::from(serde_json::to_vec(&array).expect("a tag serializes"))
    }

    fn parse(value: &[u8]) -> Option<Tag> {
        let (scope, key, fingerprint, index, count): (String, String, String, usize, usize) =
            serde_json::from_slice(value).ok()?;
        (index < count).then_some(Tag { scope, key, fingerprint, index, count })
    }

    /// The tag of a record read or about to be written, if it has one.
    pub(crate) fn of_headers<'a>(mut headers: impl Iterator<Item = (&'a str, Option<&'a [u8]>)>) -> Option<Tag> {
        headers.find(|(name, _)| *name == IDEMPOTENCY_HEADER).and_then(|(_, value)| Tag::parse(value?))
    }

    pub(crate) fn of_new(record: &NewRecord) -> Option<Tag> {
        Tag::of_headers(record.headers.iter().map(|(name, value)| (name.as_str(), value.as_deref())))
    }
}

/// Tags each of `records` as record `i` of the keyed write `key`, with `fingerprint`.
pub(crate) fn tag(records: &mut [NewRecord], key: &WriteKey, fingerprint: &str) {
    let count = records.len();
    for (index, record) in records.iter_mut().enumerate() {
        record.headers.retain(|(name, _)| name.as_str() != IDEMPOTENCY_HEADER);
        let tag =
            Tag { scope: key.scope.clone(), key: key.key.clone(), fingerprint: fingerprint.to_string(), index, count };
        record.headers.push((Text::from_static(IDEMPOTENCY_HEADER), Some(tag.value())));
    }
}

/// What memory holds of a key.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    fingerprint: String,
    /// Where each record of the write went; `None` for one not written yet (a crash cut the
    /// write short between partitions).
    places: Vec<Option<(u32, u64)>>,
    /// When its first record was written (ms since the epoch): the window runs from here.
    at_ms: i64,
}

impl Entry {
    fn whole(&self) -> Option<Vec<Published>> {
        self.places.iter().map(|place| place.map(|(partition, offset)| Published { partition, offset })).collect()
    }
}

/// What a keyed write should do, as [`Idempotency::begin`] finds it.
pub(crate) enum Begun {
    /// Written whole before: its answer.
    Done(Vec<Published>),
    /// Write these records of it (by index: every one the first time, the missing ones of a
    /// write a crash cut short); the places of the others. [`Idempotency::finish`] after.
    Write { missing: Vec<usize>, known: Vec<Option<Published>>, ticket: Ticket },
}

/// A keyed write on its way to the log: its key, and the lowest offsets its records could get.
pub(crate) struct Ticket {
    key: WriteKey,
    lows: Vec<u64>,
}

#[derive(Default)]
struct State {
    entries: HashMap<WriteKey, Entry>,
    /// Keys by when they were written, oldest first (with repeats when a key is folded in
    /// again; an entry is dropped only when its own time comes up).
    order: VecDeque<(i64, WriteKey)>,
    dirty: HashSet<WriteKey>,
    /// Keys a write is on its way for, on this node.
    writing: HashSet<WriteKey>,
    /// Per stream, the lowest offsets of each partition a keyed write on its way could get.
    in_flight: HashMap<String, Vec<Vec<u64>>>,
    /// The positions the last checkpoint wrote (at start, those read back).
    checkpointed: Positions,
}

/// The keys of idempotent writes (see the module's documentation).
pub struct Idempotency {
    topic: Arc<SystemTopic>,
    window_ms: i64,
    keys_max: usize,
    state: Mutex<State>,
    /// The checkpoint topic holds a record: a start reads the streams on from its positions.
    started: std::sync::atomic::AtomicBool,
}

impl Idempotency {
    pub(crate) fn open(log: &Log, window: Duration, keys_max: usize) -> Result<Idempotency, EngineError> {
        let topic = SystemTopic::open(log, IDEMPOTENCY_TOPIC, &SystemTopicConfig::default())?;
        let started = std::sync::atomic::AtomicBool::new(topic.end_offset() > 0);
        Ok(Idempotency {
            topic,
            window_ms: window.as_millis().min(i64::MAX as u128) as i64,
            keys_max: keys_max.max(1),
            state: Mutex::default(),
            started,
        })
    }

    /// Before the first keyed write this node ever writes or applies: the positions it comes
    /// after, durably, so that a start reads the streams on from them (a checkpoint topic with
    /// nothing in it says no stream holds a keyed write, and nothing is read).
    pub(crate) async fn ensure_started(&self, engine: &crate::Engine) -> Result<(), EngineError> {
        use std::sync::atomic::Ordering;
        if self.started.load(Ordering::Acquire) {
            return Ok(());
        }
        let positions = serde_json::to_vec(&engine.end_positions()).expect("positions serialize");
        self.topic.append(&[NewRecord::keyed(Bytes::from_static(POSITIONS_KEY.as_bytes()), positions)]).await?;
        self.started.store(true, Ordering::Release);
        Ok(())
    }

    /// Reads the keys back: the checkpoint, then the streams read on from the positions it
    /// covers (from their ends when no key was ever written: no stream holds a keyed write).
    pub(crate) fn load(&self, engine: &crate::Engine) -> Result<(), EngineError> {
        let never = self.topic.end_offset() == 0;
        let mut positions = None;
        let mut restored = Vec::new();
        self.topic.replay(|record| {
            let Some(name) = record.key.as_deref() else { return Ok::<(), EngineError>(()) };
            if name == POSITIONS_KEY.as_bytes() {
                match record.value.as_deref().map(serde_json::from_slice::<Positions>) {
                    Some(Ok(stored)) => positions = Some(stored),
                    Some(Err(error)) => tracing::warn!(%error, "skipping unreadable idempotency positions"),
                    None => {}
                }
                return Ok(());
            }
            let Ok(key) = serde_json::from_slice::<WriteKey>(name) else {
                tracing::warn!("skipping an unreadable idempotency key");
                return Ok(());
            };
            let entry = record.value.as_deref().map(serde_json::from_slice::<Entry>);
            match entry {
                Some(Ok(entry)) => restored.push((key, Some(entry))),
                Some(Err(error)) => tracing::warn!(%error, "skipping an unreadable idempotency entry"),
                None => restored.push((key, None)),
            }
            Ok(())
        })?;
        let from = if never { engine.end_positions() } else { positions.unwrap_or_default() };
        let mut state = self.state.lock().expect("idempotency lock");
        for (key, entry) in restored {
            match entry {
                Some(entry) => {
                    state.order.push_back((entry.at_ms, key.clone()));
                    state.entries.insert(key, entry);
                }
                None => {
                    state.entries.remove(&key);
                }
            }
        }
        state.order.make_contiguous().sort_by_key(|(at, _)| *at);
        let mut found = 0u64;
        engine.read_on(&from, |stream, partition, record| {
            if fold_record(&mut state, stream.name(), partition, record) {
                found += 1;
            }
        })?;
        state.checkpointed = from;
        let kept = state.entries.len();
        drop(state);
        self.trim();
        tracing::info!(keys = kept, read_on = found, "idempotency keys restored");
        Ok(())
    }

    /// Starts the keyed write `key` of `count` records with `fingerprint` to a stream whose
    /// partitions end at `ends`, on a single node: what to do, or why not.
    pub(crate) fn begin(
        &self,
        key: &WriteKey,
        fingerprint: &str,
        count: usize,
        ends: Vec<u64>,
    ) -> Result<Begun, EngineError> {
        let mut state = self.state.lock().expect("idempotency lock");
        if state.writing.contains(key) {
            return Err(EngineError::IdempotencyInProgress { key: key.key.clone() });
        }
        let known = match self.live(&mut state, key) {
            Some(entry) if entry.fingerprint != fingerprint || entry.places.len() != count => {
                return Err(EngineError::IdempotencyKeyReused { key: key.key.clone() });
            }
            Some(entry) => {
                if let Some(places) = entry.whole() {
                    metrics::counter!(REPLAYS).increment(1);
                    return Ok(Begun::Done(places));
                }
                entry
                    .places
                    .iter()
                    .map(|place| place.map(|(partition, offset)| Published { partition, offset }))
                    .collect()
            }
            None => vec![None; count],
        };
        let missing = known.iter().enumerate().filter(|(_, place)| place.is_none()).map(|(i, _)| i).collect();
        state.writing.insert(key.clone());
        state.in_flight.entry(key.stream.clone()).or_default().push(ends.clone());
        Ok(Begun::Write { missing, known, ticket: Ticket { key: key.clone(), lows: ends } })
    }

    /// Ends a keyed write [`Self::begin`] started, its records folded in (or not written).
    pub(crate) fn finish(&self, ticket: Ticket) {
        let mut state = self.state.lock().expect("idempotency lock");
        state.writing.remove(&ticket.key);
        release(&mut state, &ticket.key.stream, &ticket.lows);
    }

    /// A keyed write's entry, unless its window is over.
    fn live<'a>(&self, state: &'a mut State, key: &WriteKey) -> Option<&'a Entry> {
        let horizon = now_ms().saturating_sub(self.window_ms);
        if state.entries.get(key).is_some_and(|entry| entry.at_ms < horizon) {
            state.entries.remove(key);
            state.dirty.insert(key.clone());
        }
        state.entries.get(key)
    }

    /// What the leader of a cluster finds of the keyed write `tag` to `stream` as it prepares
    /// it: `Ok(None)` to write it, `Ok(Some(places))` to answer it with the first write's
    /// places, or why not.
    pub(crate) fn check_prepared(&self, stream: &str, tag: &Tag) -> Result<Option<Vec<Published>>, EngineError> {
        let key = WriteKey { stream: stream.to_string(), scope: tag.scope.clone(), key: tag.key.clone() };
        let mut state = self.state.lock().expect("idempotency lock");
        match self.live(&mut state, &key) {
            None => Ok(None),
            Some(entry) if entry.fingerprint != tag.fingerprint || entry.places.len() != tag.count => {
                Err(EngineError::IdempotencyKeyReused { key: key.key })
            }
            Some(entry) => match entry.whole() {
                Some(places) => {
                    metrics::counter!(REPLAYS).increment(1);
                    Ok(Some(places))
                }
                // A command holds the whole write: applied in part means on its way.
                None => Err(EngineError::IdempotencyInProgress { key: key.key }),
            },
        }
    }

    /// Holds the checkpoint's positions of `stream` at `ends` while a cluster node applies a
    /// keyed write to it; [`Self::applied`] after.
    pub(crate) fn applying(&self, stream: &str, ends: Vec<u64>) -> Vec<u64> {
        let mut state = self.state.lock().expect("idempotency lock");
        state.in_flight.entry(stream.to_string()).or_default().push(ends.clone());
        ends
    }

    pub(crate) fn applied(&self, stream: &str, lows: &[u64]) {
        let mut state = self.state.lock().expect("idempotency lock");
        release(&mut state, stream, lows);
    }

    /// Takes in one written record of `stream` (those without the header are ignored).
    pub(crate) fn fold(&self, stream: &str, partition: u32, offset: u64, record: &NewRecord, at_ms: i64) {
        let Some(tag) = Tag::of_new(record) else { return };
        let mut state = self.state.lock().expect("idempotency lock");
        fold(&mut state, stream, tag, partition, offset, at_ms);
        drop(state);
        self.trim();
    }

    /// Drops the oldest keys past the limit.
    fn trim(&self) {
        let mut state = self.state.lock().expect("idempotency lock");
        while state.entries.len() > self.keys_max {
            let Some((at, key)) = state.order.pop_front() else { break };
            if state.entries.get(&key).is_some_and(|entry| entry.at_ms == at) && !state.writing.contains(&key) {
                state.entries.remove(&key);
                state.dirty.insert(key);
                metrics::counter!(EVICTED).increment(1);
            }
        }
    }

    /// Writes the keys that changed (and drops those past their window), with the positions
    /// they cover, as one batch.
    pub async fn checkpoint(&self, engine: &crate::Engine) -> Result<(), EngineError> {
        let mut positions = engine.end_positions();
        let (records, written) = {
            let mut state = self.state.lock().expect("idempotency lock");
            for (stream, lows) in &state.in_flight {
                if let Some(ends) = positions.get_mut(stream) {
                    for low in lows {
                        for (end, low) in ends.iter_mut().zip(low) {
                            *end = (*end).min(*low);
                        }
                    }
                }
            }
            let horizon = now_ms().saturating_sub(self.window_ms);
            while state.order.front().is_some_and(|(at, _)| *at < horizon) {
                let (at, key) = state.order.pop_front().expect("a front");
                if state.entries.get(&key).is_some_and(|entry| entry.at_ms == at) && !state.writing.contains(&key) {
                    state.entries.remove(&key);
                    state.dirty.insert(key);
                }
            }
            let written: Vec<WriteKey> = state.dirty.drain().collect();
            let mut records: Vec<NewRecord> = written
                .iter()
                .map(|key| {
                    let name = Bytes::from(serde_json::to_vec(key).expect("a key serializes"));
                    match state.entries.get(key) {
                        Some(entry) => NewRecord::keyed(name, serde_json::to_vec(entry).expect("an entry serializes")),
                        None => NewRecord::tombstone(name),
                    }
                })
                .collect();
            let stored = serde_json::to_vec(&positions).expect("positions serialize");
            records.push(NewRecord::keyed(Bytes::from_static(POSITIONS_KEY.as_bytes()), stored));
            (records, written)
        };
        if let Err(error) = self.topic.append(&records).await {
            self.state.lock().expect("idempotency lock").dirty.extend(written);
            return Err(error);
        }
        self.state.lock().expect("idempotency lock").checkpointed = positions;
        Ok(())
    }

    /// Whether there is something to checkpoint: keys changed, or the streams grew past the
    /// last checkpoint's positions once a key was ever written.
    fn changed(&self, engine: &crate::Engine) -> bool {
        let state = self.state.lock().expect("idempotency lock");
        let ever = !state.entries.is_empty() || self.topic.end_offset() > 0;
        !state.dirty.is_empty() || (ever && engine.grown_past(&state.checkpointed))
    }

    /// Keys held now.
    pub fn len(&self) -> usize {
        self.state.lock().expect("idempotency lock").entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checkpoints every [`CHECKPOINT_INTERVAL`] while something changed, until `stop` turns
    /// true; then once more.
    pub async fn keep_checkpointed(engine: Arc<crate::Engine>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let keys = engine.idempotency();
        loop {
            if keys.changed(&engine)
                && let Err(error) = keys.checkpoint(&engine).await
            {
                tracing::warn!(%error, "the idempotency keys could not be checkpointed; the next start reads on further");
            }
            tokio::select! {
                () = tokio::time::sleep(CHECKPOINT_INTERVAL) => {}
                () = async { drop(stop.wait_for(|stop| *stop).await) } => {
                    if keys.changed(&engine) {
                        let _ = keys.checkpoint(&engine).await;
                    }
                    return;
                }
            }
        }
    }
}

/// Lets the checkpoint's positions of `stream` pass a keyed write's `lows` again.
fn release(state: &mut State, stream: &str, lows: &[u64]) {
    if let Some(all) = state.in_flight.get_mut(stream) {
        if let Some(at) = all.iter().position(|held| held == lows) {
            all.swap_remove(at);
        }
        if all.is_empty() {
            state.in_flight.remove(stream);
        }
    }
}

fn fold_record(state: &mut State, stream: &str, partition: u32, record: &Record) -> bool {
    let Some(tag) = Tag::of_headers(record.headers.iter()) else { return false };
    fold(state, stream, tag, partition, record.offset, record.timestamp_ms);
    true
}

fn fold(state: &mut State, stream: &str, tag: Tag, partition: u32, offset: u64, at_ms: i64) {
    let key = WriteKey { stream: stream.to_string(), scope: tag.scope, key: tag.key };
    let fresh = || Entry { fingerprint: tag.fingerprint.clone(), places: vec![None; tag.count], at_ms };
    let entry = state.entries.entry(key.clone()).or_insert_with(fresh);
    if entry.fingerprint != tag.fingerprint || entry.places.len() != tag.count {
        // The key named another write once its window ended: this one replaces it.
        *entry = fresh();
    }
    let new = entry.places.iter().all(Option::is_none);
    entry.places[tag.index] = Some((partition, offset));
    if new {
        entry.at_ms = at_ms;
        state.order.push_back((at_ms, key.clone()));
    }
    state.dirty.insert(key);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_visible_ascii_and_bounded() {
        assert!(check_key("order-42/retry_1").is_ok());
        assert!(check_key("").is_err());
        assert!(check_key(&"k".repeat(KEY_BYTES_MAX)).is_ok());
        assert!(check_key(&"k".repeat(KEY_BYTES_MAX + 1)).is_err());
        assert!(check_key("with space").is_err());
        assert!(check_key("é").is_err());
    }

    #[test]
    fn a_fingerprint_is_of_what_is_written_not_of_the_tag_or_the_time() {
        let record = |value: &str| NewRecord { key: Some(Bytes::from("k")), ..NewRecord::value(value.to_string()) };
        let base = fingerprint("s", &[record("1"), record("2")]);
        assert_eq!(base, fingerprint("s", &[record("1"), record("2")]));
        assert_ne!(base, fingerprint("t", &[record("1"), record("2")]), "another stream");
        assert_ne!(base, fingerprint("s", &[record("2"), record("1")]), "another order");
        assert_ne!(base, fingerprint("s", &[record("12")]), "fields are delimited");
        let mut tagged = vec![record("1"), record("2")];
        let key = WriteKey { stream: "s".into(), scope: "alice".into(), key: "k1".into() };
        tag(&mut tagged, &key, &base);
        tagged[0].timestamp_ms = Some(5);
        assert_eq!(fingerprint("s", &tagged), base, "the tag and the timestamp are not part of it");
        let tag = Tag::of_new(&tagged[1]).unwrap();
        assert_eq!((tag.scope.as_str(), tag.key.as_str(), tag.index, tag.count), ("alice", "k1", 1, 2));
        let mut null = record("1");
        null.headers.push(("h".into(), None));
        let mut empty = record("1");
        empty.headers.push(("h".into(), Some(Bytes::new())));
        assert_ne!(fingerprint("s", &[null]), fingerprint("s", &[empty]), "a null header is not an empty one");
    }

    /// A write across partitions that a crash cut short (its first records appended, tagged,
    /// the others not): after the restart its retry writes only what is missing.
    #[tokio::test]
    async fn a_retry_finishes_a_write_a_crash_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let open = || crate::Engine::open_in(dir.path(), crate::EngineOptions::default()).unwrap();
        let engine = open();
        let def = crate::StreamDef { partitions: 4, ..engine.default_stream_def("orders") };
        let stream = engine.create_stream(def).await.unwrap();
        let records: Vec<NewRecord> = (0..6)
            .map(|i| NewRecord { key: Some(Bytes::from(format!("key-{i}"))), ..NewRecord::value(format!("v{i}")) })
            .collect();
        let key = WriteKey { stream: "orders".into(), scope: "alice".into(), key: "cut".into() };
        let print = fingerprint("orders", &records);
        let mut tagged = records.clone();
        tag(&mut tagged, &key, &print);
        engine.idempotency().ensure_started(&engine).await.unwrap();
        let first = stream.publish(&tagged[..2], None).await.unwrap();
        drop((stream, engine));

        let engine = open();
        let stream = engine.stream("orders").unwrap();
        let (places, replayed) =
            engine.publish_idempotent(&stream, records.clone(), None, "alice", "cut").await.unwrap();
        assert!(!replayed, "the first write was never answered: this one finishes it");
        assert_eq!(&places[..2], &first[..], "the records written before keep their places");
        let stored: u64 = (0..4).map(|partition| stream.end_offset(partition).unwrap()).sum();
        assert_eq!(stored, 6, "only the missing records were written");
        let (again, replayed) = engine.publish_idempotent(&stream, records, None, "alice", "cut").await.unwrap();
        assert!(replayed);
        assert_eq!(again, places);
    }

    #[test]
    fn a_tag_that_does_not_parse_is_none() {
        assert_eq!(Tag::parse(b"[\"a\",\"k\",\"f\",2,2]"), None, "index past count");
        assert_eq!(Tag::parse(b"not json"), None);
        assert!(Tag::parse(b"[\"a\",\"k\",\"f\",0,1]").is_some());
    }
}
