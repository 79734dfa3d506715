//! The idempotent producer: producer ids, and the sequence numbers that let a retried batch
//! be recognised and answered with its first offsets instead of being stored twice.
//!
//! **Ids.** InitProducerId hands out ids from blocks reserved durably in the compacted system
//! topic `__kafka_producers` (one write per [`ID_BLOCK`] ids); a start resumes after the last
//! block reserved, so no id is handed out twice, across a kill -9 too. On a cluster node every
//! node hands out ids, each from blocks it reserves through the cluster: a block is numbered
//! by the index of its reservation in the cluster's log, which no other reservation has.
//!
//! **Sequences.** For each producer and partition the server keeps the epoch and the last
//! [`BATCHES_KEPT`] batches it stored (first and last sequence, first offset), as a Kafka broker
//! does: a batch equal to one of them is a retry and is answered with that batch's offset; the
//! next batch must follow the last one's sequence; an older epoch is fenced.
//!
//! **Durability.** The stream record is the truth: the last record of every idempotent batch
//! carries the header [`PRODUCER_HEADER`]. About once a second the states that changed are
//! checkpointed to `__kafka_producers` with the stream positions they cover (never past a batch
//! still on its way to the log); a start reads them back and reads the streams on from those
//! positions, so a batch acknowledged just before a crash is recognised when its producer
//! retries it after the restart. States idle for [`EXPIRY`] are dropped, as Kafka's
//! `producer.id.expiration.ms` does.
//!
//! **In a cluster** only the leader takes idempotent batches (the others answer
//! NOT_LEADER_OR_FOLLOWER, and the producer asks for metadata again), and only once it has
//! read the states back for its term ([`Producers::reload`]): the last leader's checkpoint,
//! which every node applied, and the streams read on from it, which hold every batch the
//! leaders before it committed, answered or not. So a batch whose answer a leader change lost
//! is recognised when the producer sends it again to the next leader. The leader alone
//! checkpoints, through the cluster.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use onehop_engine::system::{SystemTopic, SystemTopicConfig};
use onehop_engine::{Engine, EngineError, NewRecord, Positions, Record, Stream, Text};
use serde::{Deserialize, Serialize};

use super::records::{PRODUCER_HEADER, Sequenced, add_sequence};

pub const PRODUCERS_TOPIC: &str = "__kafka_producers";

/// Producer ids reserved by one durable write.
const ID_BLOCK: i64 = 1000;
/// Batches remembered per producer and partition (Kafka's clients keep at most five in flight).
const BATCHES_KEPT: usize = 5;
/// How often the states that changed are checkpointed.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// A producer state not written to for this long is dropped (Kafka's default: one day).
const EXPIRY: Duration = Duration::from_secs(24 * 3600);
/// Keys in the checkpoint topic.
const IDS_KEY: &str = "ids";
/// The value of a cluster node's id reservation: the block is numbered by the reservation's
/// index in the cluster's log, which the record cannot hold.
const IDS_BY_INDEX: &str = "by-log-index";
const POSITIONS_KEY: &str = "positions";
const STATE_PREFIX: &str = "p:";

/// Batches of duplicates answered without storing them again.
pub const DUPLICATES: &str = "kafka_duplicate_batches_total";

/// A producer's partition: `(producer id, stream, partition)`.
type Key = (i64, String, u32);

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Batch {
    first: i32,
    last: i32,
    base_offset: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct PartitionState {
    epoch: i16,
    batches: VecDeque<Batch>,
    /// When it was last written to, in milliseconds since the epoch.
    last_ms: i64,
    /// A batch on its way to the log (not serialized).
    #[serde(skip)]
    pending: Option<(i32, i32)>,
}

#[derive(Default)]
struct State {
    next_id: i64,
    reserved_to: i64,
    entries: HashMap<Key, PartitionState>,
    dirty: HashSet<Key>,
    /// The positions the last checkpoint wrote.
    checkpointed: Positions,
    /// Per stream partition, the lowest offset each batch on its way could get.
    in_flight: HashMap<(String, u32), Vec<u64>>,
    /// Counts the reloads: a batch checked before the last one has no say in the states after
    /// it.
    generation: u64,
}

/// The states as a read of the checkpoint topic and the streams gives them.
struct Loaded {
    reserved_to: i64,
    entries: HashMap<Key, PartitionState>,
    /// The states the streams changed since the checkpoint.
    dirty: HashSet<Key>,
    /// The positions the checkpoint covers.
    from: Positions,
    /// Idempotent batches found in the streams.
    found: u64,
}

/// What a produce of an idempotent batch should do.
pub(super) enum Verdict {
    /// Store it; then [`Producers::stored`] with the ticket.
    Fresh(Ticket),
    /// A retry of a batch stored at this offset: answer with it, store nothing.
    Duplicate { base_offset: u64 },
    /// Refuse it with this Kafka error and message.
    Refused(i16, String),
}

/// A batch checked and on its way to the log.
pub(super) struct Ticket {
    key: Key,
    sequenced: Sequenced,
    low: u64,
    generation: u64,
}

pub(crate) struct Producers {
    topic: Arc<SystemTopic>,
    engine: Arc<Engine>,
    state: Mutex<State>,
    /// One id block reservation at a time.
    reserving: tokio::sync::Mutex<()>,
    /// On a cluster node: the leader term the states were last read back for
    /// ([`Producers::reload`]); `u64::MAX`: none.
    loaded_term: std::sync::atomic::AtomicU64,
}

impl Producers {
    /// Opens the producer states: the checkpoint, then the streams read on from it.
    pub(super) fn open(engine: &Arc<Engine>) -> Result<Producers, EngineError> {
        let topic = engine.system_topic(PRODUCERS_TOPIC, &SystemTopicConfig::default())?;
        let loaded = load(engine, &topic)?;
        tracing::info!(states = loaded.entries.len(), read_on = loaded.found, "Kafka producer states restored");
        let state = State {
            next_id: loaded.reserved_to,
            reserved_to: loaded.reserved_to,
            entries: loaded.entries,
            dirty: loaded.dirty,
            checkpointed: loaded.from,
            ..State::default()
        };
        Ok(Producers {
            topic,
            engine: engine.clone(),
            state: Mutex::new(state),
            reserving: tokio::sync::Mutex::new(()),
            loaded_term: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// Reads the states back again, for the leader term `term`: a cluster node that became the
    /// leader takes idempotent batches against what every leader before it committed (the
    /// last checkpoint, and the streams read on from it). This node's own id block stays its.
    pub(super) fn reload(&self, term: u64) -> Result<(), EngineError> {
        let loaded = load(&self.engine, &self.topic)?;
        tracing::info!(
            states = loaded.entries.len(),
            read_on = loaded.found,
            term,
            "Kafka producer states read back: this node takes the idempotent producers' batches"
        );
        {
            let mut state = self.state.lock().expect("producers lock");
            state.entries = loaded.entries;
            // The states the streams changed since the checkpoint: this leader's first
            // checkpoint writes them.
            state.dirty = loaded.dirty;
            state.in_flight.clear();
            state.checkpointed = loaded.from;
            state.generation += 1;
        }
        self.loaded_term.store(term, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The leader term the states were last read back for ([`Producers::reload`]).
    pub(super) fn loaded_term(&self) -> Option<u64> {
        Some(self.loaded_term.load(std::sync::atomic::Ordering::SeqCst)).filter(|term| *term != u64::MAX)
    }

    /// InitProducerId: a new id at epoch 0, or (given an id and epoch, as a producer recovering
    /// from an error asks) the same id at the next epoch.
    pub(super) async fn init(&self, producer_id: i64, epoch: i16) -> Result<(i64, i16), EngineError> {
        if producer_id >= 0 && (0..i16::MAX - 1).contains(&epoch) {
            return Ok((producer_id, epoch + 1));
        }
        let _one = self.reserving.lock().await;
        let reserve = {
            let state = self.state.lock().expect("producers lock");
            (state.next_id >= state.reserved_to).then_some(state.reserved_to + ID_BLOCK)
        };
        if let Some(reserved_to) = reserve {
            let value = if self.engine.is_replicated() { IDS_BY_INDEX.to_string() } else { reserved_to.to_string() };
            let mut records = vec![NewRecord::keyed(Bytes::from_static(IDS_KEY.as_bytes()), value)];
            if self.topic.end_offset() == 0 {
                // The first id ever (on a cluster, as far as this node has applied): no
                // idempotent batch is in the streams yet, so a start reads on from here, not
                // from the streams' beginnings. A batch of an id another node reserved first is
                // applied after that reservation, so these positions are not past it.
                let positions = serde_json::to_vec(&self.engine.end_positions()).expect("positions serialize");
                records.push(NewRecord::keyed(Bytes::from_static(POSITIONS_KEY.as_bytes()), positions));
            }
            let index = self.engine.append_system(&self.topic, records).await?;
            let mut state = self.state.lock().expect("producers lock");
            match index {
                None => state.reserved_to = reserved_to,
                Some(index) => {
                    let first =
                        i64::try_from(index).ok().and_then(|index| index.checked_mul(ID_BLOCK)).ok_or_else(|| {
                            EngineError::Internal(format!("no producer ids are left past log index {index}"))
                        })?;
                    state.next_id = first;
                    state.reserved_to = first + ID_BLOCK;
                }
            }
        }
        let mut state = self.state.lock().expect("producers lock");
        let id = state.next_id;
        state.next_id += 1;
        Ok((id, 0))
    }

    /// Checks an idempotent batch for `partition` of `stream`: a retry, the next batch, or a
    /// refusal (a fenced epoch, a gap in the sequence). A producer this server has no state of
    /// (new, or expired) starts anywhere.
    pub(super) fn check(&self, stream: &Stream, partition: u32, sequenced: Sequenced) -> Verdict {
        let key = (sequenced.producer_id, stream.name().to_string(), partition);
        let mut state = self.state.lock().expect("producers lock");
        let low = stream.end_offset(partition).unwrap_or(0);
        let entry = state.entries.entry(key.clone()).or_default();
        let (first, last) = (sequenced.first_sequence, sequenced.last_sequence);
        if let Some(found) = entry.batches.iter().find(|batch| batch.first == first && batch.last == last)
            && sequenced.epoch == entry.epoch
        {
            metrics::counter!(DUPLICATES).increment(1);
            return Verdict::Duplicate { base_offset: found.base_offset };
        }
        if entry.pending == Some((first, last)) {
            return Verdict::Refused(
                ResponseError::DuplicateSequenceNumber.code(),
                "the same batch is being stored by another request".into(),
            );
        }
        if entry.pending.is_some() {
            return Verdict::Refused(
                ResponseError::ConcurrentTransactions.code(),
                "another batch of this producer to this partition is on its way".into(),
            );
        }
        if let Some(newest) = entry.batches.back() {
            let refused = if sequenced.epoch < entry.epoch {
                Some((
                    ResponseError::InvalidProducerEpoch,
                    format!("epoch {} is older than {}", sequenced.epoch, entry.epoch),
                ))
            } else if sequenced.epoch > entry.epoch && first != 0 {
                Some((
                    ResponseError::OutOfOrderSequenceNumber,
                    format!("a new epoch begins at sequence 0, not {first}"),
                ))
            } else if sequenced.epoch == entry.epoch && first != add_sequence(newest.last, 1) {
                let expected = add_sequence(newest.last, 1);
                Some((
                    ResponseError::OutOfOrderSequenceNumber,
                    format!("sequence {first} where {expected} was expected"),
                ))
            } else {
                None
            };
            if let Some((error, message)) = refused {
                return Verdict::Refused(error.code(), message);
            }
        }
        entry.pending = Some((first, last));
        state.in_flight.entry((key.1.clone(), partition)).or_default().push(low);
        let generation = state.generation;
        Verdict::Fresh(Ticket { key, sequenced, low, generation })
    }

    /// Takes a batch of a committed transaction on its way to the log, unchecked: its
    /// sequence was checked when the transaction took it. Then [`Producers::stored`].
    pub(super) fn admit(&self, stream: &Stream, partition: u32, sequenced: Sequenced) -> Ticket {
        let key = (sequenced.producer_id, stream.name().to_string(), partition);
        let mut state = self.state.lock().expect("producers lock");
        let low = stream.end_offset(partition).unwrap_or(0);
        state.entries.entry(key.clone()).or_default();
        state.in_flight.entry((key.1.clone(), partition)).or_default().push(low);
        let generation = state.generation;
        Ticket { key, sequenced, low, generation }
    }

    /// Whether `stream`'s `partition` holds the batch `sequenced` already: its producer's newest
    /// batch there, in the same epoch, ends at or past the batch's last sequence.
    pub(super) fn covers(&self, stream: &str, partition: u32, sequenced: &Sequenced) -> bool {
        let state = self.state.lock().expect("producers lock");
        let key = (sequenced.producer_id, stream.to_string(), partition);
        state.entries.get(&key).is_some_and(|entry| {
            entry.epoch == sequenced.epoch
                && entry.batches.back().is_some_and(|newest| at_or_after(newest.last, sequenced.last_sequence))
        })
    }

    /// The header a checked batch's last record carries.
    pub(super) fn header(sequenced: &Sequenced) -> (Text, Option<Bytes>) {
        let value = format!(
            "{}:{}:{}:{}",
            sequenced.producer_id, sequenced.epoch, sequenced.first_sequence, sequenced.last_sequence
        );
        (Text::from_static(PRODUCER_HEADER), Some(Bytes::from(value)))
    }

    /// Records a checked batch as stored at `base_offset`, or (`None`) as not stored.
    pub(super) fn stored(&self, ticket: Ticket, base_offset: Option<u64>) {
        let mut state = self.state.lock().expect("producers lock");
        if ticket.generation != state.generation {
            // Checked in an earlier leader term: the states read back since hold the batch
            // if the cluster committed it.
            return;
        }
        let partition = (ticket.key.1.clone(), ticket.key.2);
        if let Some(lows) = state.in_flight.get_mut(&partition) {
            if let Some(at) = lows.iter().position(|low| *low == ticket.low) {
                lows.swap_remove(at);
            }
            if lows.is_empty() {
                state.in_flight.remove(&partition);
            }
        }
        if let Some(entry) = state.entries.get_mut(&ticket.key) {
            entry.pending = None;
        }
        match base_offset {
            Some(base_offset) => apply(&mut state, ticket.key, &ticket.sequenced, base_offset, now_ms()),
            None => {
                if state.entries.get(&ticket.key).is_some_and(|entry| entry.batches.is_empty()) {
                    state.entries.remove(&ticket.key);
                }
            }
        }
    }

    /// Writes the states that changed (and drops the expired), with the positions they
    /// cover, as one batch.
    pub(super) async fn checkpoint(&self) -> Result<(), EngineError> {
        let mut positions = self.engine.end_positions();
        let (records, written) = {
            let mut state = self.state.lock().expect("producers lock");
            for ((stream, partition), lows) in &state.in_flight {
                if let (Some(ends), Some(low)) = (positions.get_mut(stream), lows.iter().min())
                    && let Some(end) = ends.get_mut(*partition as usize)
                {
                    *end = (*end).min(*low);
                }
            }
            let horizon = now_ms() - EXPIRY.as_millis() as i64;
            let expired: Vec<Key> = state
                .entries
                .iter()
                .filter(|(_, entry)| entry.pending.is_none() && entry.last_ms < horizon)
                .map(|(key, _)| key.clone())
                .collect();
            for key in &expired {
                state.entries.remove(key);
                state.dirty.insert(key.clone());
            }
            let written: Vec<Key> = state.dirty.drain().collect();
            let mut records: Vec<NewRecord> = written
                .iter()
                .map(|key| {
                    let name = Bytes::from(format!("{STATE_PREFIX}{}:{}:{}", key.0, key.2, key.1));
                    match state.entries.get(key) {
                        Some(entry) => NewRecord::keyed(name, serde_json::to_vec(entry).expect("state serializes")),
                        None => NewRecord::tombstone(name),
                    }
                })
                .collect();
            let stored = serde_json::to_vec(&positions).expect("positions serialize");
            records.push(NewRecord::keyed(Bytes::from_static(POSITIONS_KEY.as_bytes()), stored));
            (records, written)
        };
        // On a cluster, fenced to the term the states were read back for: a leader that lost
        // its term meanwhile writes nothing over what the next one reads back.
        if let Err(error) = self.engine.append_system_in_term(&self.topic, records, self.loaded_term()).await {
            self.state.lock().expect("producers lock").dirty.extend(written);
            return Err(error);
        }
        self.state.lock().expect("producers lock").checkpointed = positions;
        Ok(())
    }

    /// Whether there is something to checkpoint: states changed, or the streams grew past
    /// the last checkpoint's positions once an id was handed out.
    fn changed(&self) -> bool {
        let ever = self.topic.end_offset() > 0;
        let state = self.state.lock().expect("producers lock");
        !state.dirty.is_empty() || (ever && self.engine.grown_past(&state.checkpointed))
    }

    /// Checkpoints every [`CHECKPOINT_INTERVAL`] while something changed and `ours` says this
    /// node keeps the states (on a cluster, the leader that read them back for its term), until
    /// `stop` turns true; then once more.
    pub(super) async fn keep_checkpointed(
        self: Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
        ours: impl Fn() -> bool + Send + 'static,
    ) {
        loop {
            if ours()
                && self.changed()
                && let Err(error) = self.checkpoint().await
            {
                tracing::warn!(%error, "the Kafka producer states could not be checkpointed; the next start reads on further");
            }
            tokio::select! {
                () = tokio::time::sleep(CHECKPOINT_INTERVAL) => {}
                () = async { drop(stop.wait_for(|stop| *stop).await) } => {
                    if ours() && self.changed() {
                        let _ = self.checkpoint().await;
                    }
                    return;
                }
            }
        }
    }
}

/// Reads the states back: the checkpoint topic, then the streams from the positions it covers
/// (from their ends if no id was ever handed out: no stream holds an idempotent batch then).
fn load(engine: &Engine, topic: &SystemTopic) -> Result<Loaded, EngineError> {
    let never = topic.end_offset() == 0;
    let mut state = State::default();
    let mut positions = None;
    topic.replay(|record| {
        restore(&mut state, &record, &mut positions);
        Ok::<(), EngineError>(())
    })?;
    let from = if never { engine.end_positions() } else { positions.unwrap_or_default() };
    let mut found = 0u64;
    engine.read_on(&from, |stream, partition, record| {
        if let Some((sequenced, base_offset)) = sequenced_record(record) {
            found += 1;
            let key = (sequenced.producer_id, stream.name().to_string(), partition);
            apply(&mut state, key, &sequenced, base_offset, record.timestamp_ms);
        }
    })?;
    Ok(Loaded { reserved_to: state.reserved_to, entries: state.entries, dirty: state.dirty, from, found })
}

/// Folds one checkpoint record in.
fn restore(state: &mut State, record: &Record, positions: &mut Option<Positions>) {
    let Some(key) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) else { return };
    let value = record.value.as_deref();
    if key == IDS_KEY {
        if let Some(reserved) = value.and_then(|value| std::str::from_utf8(value).ok()?.parse::<i64>().ok()) {
            state.reserved_to = state.reserved_to.max(reserved);
        }
    } else if key == POSITIONS_KEY {
        match value.map(serde_json::from_slice::<Positions>) {
            Some(Ok(stored)) => *positions = Some(stored),
            Some(Err(error)) => tracing::warn!(%error, "skipping unreadable Kafka producer positions"),
            None => {}
        }
    } else if let Some(rest) = key.strip_prefix(STATE_PREFIX) {
        let mut parts = rest.splitn(3, ':');
        let (Some(Ok(id)), Some(Ok(partition)), Some(stream)) =
            (parts.next().map(str::parse::<i64>), parts.next().map(str::parse::<u32>), parts.next())
        else {
            return;
        };
        let key = (id, stream.to_string(), partition);
        match value.map(serde_json::from_slice::<PartitionState>) {
            Some(Ok(entry)) => {
                state.entries.insert(key, entry);
            }
            Some(Err(error)) => tracing::warn!(%error, "skipping an unreadable Kafka producer state"),
            None => {
                state.entries.remove(&key);
            }
        }
    }
}

/// The producer batch whose last record `record` is, with the batch's first offset.
fn sequenced_record(record: &Record) -> Option<(Sequenced, u64)> {
    let value = std::str::from_utf8(record.headers.get(PRODUCER_HEADER)?).ok()?;
    let mut parts = value.split(':');
    let sequenced = Sequenced {
        producer_id: parts.next()?.parse().ok()?,
        epoch: parts.next()?.parse().ok()?,
        first_sequence: parts.next()?.parse().ok()?,
        last_sequence: parts.next()?.parse().ok()?,
    };
    // Records in the batch less one, across a wrap of the sequence past i32::MAX to 0.
    let (first, last) = (i64::from(sequenced.first_sequence), i64::from(sequenced.last_sequence));
    let count = if last >= first { last - first } else { last + i64::from(i32::MAX) + 1 - first } as u64;
    Some((sequenced, record.offset.checked_sub(count)?))
}

/// Takes a stored batch into the state of its producer and partition.
fn apply(state: &mut State, key: Key, sequenced: &Sequenced, base_offset: u64, at_ms: i64) {
    let entry = state.entries.entry(key.clone()).or_default();
    if sequenced.epoch != entry.epoch {
        entry.batches.clear();
        entry.epoch = sequenced.epoch;
    }
    let batch = Batch { first: sequenced.first_sequence, last: sequenced.last_sequence, base_offset };
    if !entry.batches.contains(&batch) {
        entry.batches.push_back(batch);
        while entry.batches.len() > BATCHES_KEPT {
            entry.batches.pop_front();
        }
    }
    entry.last_ms = entry.last_ms.max(at_ms);
    state.dirty.insert(key);
}

/// Whether sequence `a` is `b` or comes after it, across the wrap past `i32::MAX` to 0 (a
/// producer has far fewer than 2^30 records in flight).
fn at_or_after(a: i32, b: i32) -> bool {
    (i64::from(a) - i64::from(b)).rem_euclid(1 << 31) < 1 << 30
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onehop_engine::{Durability, EngineOptions, StreamDef};

    fn batch(producer_id: i64, epoch: i16, first: i32, count: i32) -> Sequenced {
        Sequenced { producer_id, epoch, first_sequence: first, last_sequence: first + count - 1 }
    }

    /// Stores `sequenced` (as `count` records) the way a produce does; returns its first offset.
    async fn store(producers: &Producers, stream: &Stream, sequenced: Sequenced) -> u64 {
        let Verdict::Fresh(ticket) = producers.check(stream, 0, sequenced) else { panic!("not fresh: {sequenced:?}") };
        let count = sequenced.last_sequence - sequenced.first_sequence + 1;
        let mut records: Vec<NewRecord> = (0..count).map(|i| NewRecord::value(format!("r{i}"))).collect();
        records.last_mut().unwrap().headers.push(Producers::header(&sequenced));
        let ack = stream.enqueue_to(0, &records, None).await.unwrap().await.unwrap();
        producers.stored(ticket, Some(ack.base_offset));
        ack.base_offset
    }

    fn duplicate_of(producers: &Producers, stream: &Stream, sequenced: Sequenced) -> Option<u64> {
        match producers.check(stream, 0, sequenced) {
            Verdict::Duplicate { base_offset } => Some(base_offset),
            Verdict::Fresh(ticket) => {
                producers.stored(ticket, None);
                None
            }
            Verdict::Refused(..) => None,
        }
    }

    fn refused(producers: &Producers, stream: &Stream, sequenced: Sequenced) -> i16 {
        match producers.check(stream, 0, sequenced) {
            Verdict::Refused(code, _) => code,
            Verdict::Fresh(ticket) => {
                producers.stored(ticket, None);
                0
            }
            Verdict::Duplicate { .. } => 0,
        }
    }

    #[tokio::test]
    async fn retries_are_recognised_gaps_and_old_epochs_refused_and_it_all_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let open = || Arc::new(Engine::open_in(dir.path(), EngineOptions::default()).unwrap());
        let engine = open();
        let def = StreamDef {
            name: "orders".into(),
            partitions: 1,
            retention_ms: None,
            retention_bytes: None,
            durability: Durability::Fsync,
            mqtt_topic: None,
            compacted: false,
        };
        let stream = engine.create_stream(def).await.unwrap();
        let producers = Producers::open(&engine).unwrap();
        let (id, epoch) = producers.init(-1, -1).await.unwrap();
        assert_eq!((id, epoch), (0, 0));
        assert_eq!(producers.init(-1, -1).await.unwrap(), (1, 0), "ids are not handed out twice");
        assert_eq!(producers.init(id, 0).await.unwrap(), (id, 1), "a recovering producer gets the next epoch");

        let first = store(&producers, &stream, batch(id, 0, 0, 3)).await;
        let second = store(&producers, &stream, batch(id, 0, 3, 2)).await;
        assert_eq!((first, second), (0, 3));
        assert_eq!(duplicate_of(&producers, &stream, batch(id, 0, 0, 3)), Some(0), "a retry of the first batch");
        assert_eq!(duplicate_of(&producers, &stream, batch(id, 0, 3, 2)), Some(3));
        assert_eq!(refused(&producers, &stream, batch(id, 0, 9, 1)), ResponseError::OutOfOrderSequenceNumber.code());
        assert_eq!(stream.end_offset(0).unwrap(), 5, "nothing stored twice");

        // A kill -9 before any checkpoint: the next start reads the batches back from the stream.
        drop((producers, stream));
        drop(engine);
        let engine = open();
        let stream = engine.stream("orders").unwrap();
        let producers = Producers::open(&engine).unwrap();
        assert_eq!(duplicate_of(&producers, &stream, batch(id, 0, 3, 2)), Some(3), "recognised after a restart");
        let (next, _) = producers.init(-1, -1).await.unwrap();
        assert!(next > 1, "ids go on after the reserved block, not from 0: {next}");
        let third = store(&producers, &stream, batch(id, 0, 5, 1)).await;
        assert_eq!(third, 5);
        // A new epoch starts at 0; the old one is fenced from then on.
        assert_eq!(refused(&producers, &stream, batch(id, 1, 4, 1)), ResponseError::OutOfOrderSequenceNumber.code());
        store(&producers, &stream, batch(id, 1, 0, 1)).await;
        assert_eq!(refused(&producers, &stream, batch(id, 0, 6, 1)), ResponseError::InvalidProducerEpoch.code());

        // Checkpointed, then restarted: the state comes from the checkpoint, the read on is empty.
        producers.checkpoint().await.unwrap();
        assert!(!producers.changed());
        drop((producers, stream));
        drop(engine);
        let engine = open();
        let stream = engine.stream("orders").unwrap();
        let producers = Producers::open(&engine).unwrap();
        assert_eq!(duplicate_of(&producers, &stream, batch(id, 1, 0, 1)), Some(6));
        assert_eq!(refused(&producers, &stream, batch(id, 0, 6, 1)), ResponseError::InvalidProducerEpoch.code());
    }
}
