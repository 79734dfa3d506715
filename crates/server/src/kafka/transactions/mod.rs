//! Transactions: a transactional producer's batches and offset commits become visible all at
//! once when it commits, and never when it aborts.
//!
//! # How
//!
//! A Kafka broker writes a transaction's batches into their partitions at once and hides them
//! from `read_committed` readers behind the last stable offset and the aborted-transaction
//! index. onehop serves the same records over HTTP, SSE, WebSocket, MQTT and views, which know
//! nothing of Kafka's transactions; so a transaction's batches stay out of the streams until
//! it commits. Until then they live in the compacted system topic `__kafka_transactions`
//! (the *journal*), where a produce writes them (fsynced, so an acknowledged batch of an open
//! transaction survives kill -9). Nothing a stream holds was ever aborted or is still open:
//! every reader, `read_uncommitted` ones included, sees committed records only, and the last
//! stable offset is the end of the log.
//!
//! The journal holds, per transactional id:
//! - `t/{id}`: its state ([`Stored`]): producer id and epoch, timeout, phase, the partitions
//!   and groups added, the offsets the transaction commits, and the next sequence number per
//!   partition (the batches of an aborted transaction use up their sequence numbers, as they
//!   do in Kafka's log);
//! - `c/{number}/{k}/{id}`: the `k`th batch of its transaction number `number`, as the client
//!   sent it, with its stream, partition and sequence numbers in headers.
//!
//! EndTxn with `commit` first writes the phase `PrepareCommit` (the decision, durable), then
//! appends each batch to its stream (fsync) and the offsets to `__consumer_offsets`, then writes
//! `CompleteCommit` and deletes the batches from the journal. A start that finds a
//! `PrepareCommit` finishes it: a batch already in its stream is recognised by its producer's
//! sequence numbers ([`Producers::covers`]) and is not appended twice. An abort writes
//! `CompleteAbort` and deletes the batches. A transaction left open by a restart stays open
//! (its batches are in the journal) until its producer ends it or its timeout aborts it.
//!
//! The cost of keeping other protocols' readers clean is one more write of each transactional
//! batch (journal, then stream); Kafka's markers and index are not needed.
//!
//! # In a cluster
//!
//! The leader coordinates every transaction (the other nodes answer NOT_COORDINATOR, and
//! NOT_LEADER_OR_FOLLOWER to a transactional batch). The journal is written through the
//! cluster, so every node holds it. A node that becomes the leader reads it back for its term
//! ([`Transactions::reload`]), once it has read the idempotent producers' states back, and
//! takes up what the last leader left as a start takes up what a stop left: decided commits
//! are finished, aborts completed, open transactions stay open. Until then it answers
//! COORDINATOR_LOAD_IN_PROGRESS. Every write it makes for a transaction (journal, streams,
//! committed offsets) is fenced to the term its state was read for: a node that coordinated
//! before cannot finish a commit the next leader took up, and nothing is written twice.

pub mod api;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use onehop_engine::system::{SystemTopic, SystemTopicConfig};
use onehop_engine::{Durability, Engine, EngineError, NewRecord, Record, Stream, Text};
use serde::{Deserialize, Serialize};

use super::groups;
use super::groups::committed::{Committed, Key as OffsetKey};
use super::producers::Producers;
use super::records::{self, Produced, Sequenced, add_sequence};

pub const TRANSACTIONS_TOPIC: &str = "__kafka_transactions";

/// A transactional id with no open transaction and no request for this long is forgotten
/// (Kafka's `transactional.id.expiration.ms`, 7 days): its producer starts afresh with a new
/// producer id.
pub const ID_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest transaction timeout a producer may ask for (Kafka's `transaction.max.timeout.ms`).
pub const TIMEOUT_MAX: Duration = Duration::from_secs(15 * 60);
/// Largest batch a transaction takes (as sent, compressed); the streams' batches are bounded
/// the same.
pub const BATCH_BYTES_MAX: usize = 16 << 20;
/// Room in a journal record around its batch: key and headers.
const CHUNK_ENVELOPE_BYTES: usize = 64 << 10;
// A cluster node that applies a journal record before it opened the journal takes it too.
const _: () = assert!(BATCH_BYTES_MAX + CHUNK_ENVELOPE_BYTES <= onehop_engine::system::SHARED_RECORD_BYTES_MAX);

/// Transactions committed, and aborted (by their producer or by their timeout).
pub const COMMITTED: &str = "kafka_transactions_committed_total";
pub const ABORTED: &str = "kafka_transactions_aborted_total";
/// Batches of open transactions, waiting in the journal for their transaction to end.
pub const WAITING: &str = "kafka_transaction_batches_waiting";

const STREAM_HEADER: &str = "stream";
const PARTITION_HEADER: &str = "partition";
const SEQUENCE_HEADER: &str = "sequence";

/// Where a transactional id's transaction stands (Kafka's names, in DescribeTransactions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Empty => "Empty",
            Phase::Ongoing => "Ongoing",
            Phase::PrepareCommit => "PrepareCommit",
            Phase::PrepareAbort => "PrepareAbort",
            Phase::CompleteCommit => "CompleteCommit",
            Phase::CompleteAbort => "CompleteAbort",
        }
    }
}

/// A stream partition: `(stream, partition)`.
pub type Partition = (String, u32);

/// A transactional id's state, as the journal keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stored {
    pub producer_id: i64,
    pub epoch: i16,
    pub timeout_ms: u64,
    /// Its transactions are numbered; a journal batch's key names the number of its own.
    pub number: u64,
    pub phase: Phase,
    /// When the current (or last) transaction began, in milliseconds since the epoch.
    pub started_ms: i64,
    pub partitions: Vec<Partition>,
    pub groups: Vec<String>,
    /// The offsets the transaction commits (TxnOffsetCommit), applied when it commits.
    pub offsets: Vec<(OffsetKey, Committed)>,
    /// The sequence number the next batch to each partition must begin with, in this epoch.
    pub sequences: Vec<(Partition, i32)>,
    /// When this state was last written, in milliseconds since the epoch: an idle id expires
    /// [`ID_EXPIRY`] after it.
    #[serde(default)]
    pub touched_ms: i64,
}

/// A batch of the open transaction, in the journal.
#[derive(Clone, Debug)]
struct Chunk {
    offset: u64,
    key: Bytes,
    partition: Partition,
    sequenced: Sequenced,
}

struct Txn {
    stored: Stored,
    chunks: Vec<Chunk>,
    /// Expired and forgotten: a request that found it just before waits for a new one.
    gone: bool,
}

impl Txn {
    fn next_sequence(&self, partition: &Partition) -> Option<i32> {
        self.stored.sequences.iter().find(|(at, _)| at == partition).map(|(_, next)| *next)
    }

    fn set_next_sequence(stored: &mut Stored, partition: &Partition, next: i32) {
        match stored.sequences.iter_mut().find(|(at, _)| at == partition) {
            Some((_, at)) => *at = next,
            None => stored.sequences.push((partition.clone(), next)),
        }
    }
}

/// One transactional id: its state, and a lock that lets one request at a time act on it.
struct Entry {
    acting: tokio::sync::Mutex<()>,
    txn: Mutex<Txn>,
    /// On a cluster node, the leader term its state was read (or made) in: every write for
    /// it is fenced to that term.
    term: Option<u64>,
}

/// The transactional ids as a read of the journal gives them.
struct Read {
    entries: HashMap<String, Arc<Entry>>,
    by_producer: HashMap<i64, String>,
    /// Batches of transactions that ended, to delete.
    stale: Vec<Bytes>,
    /// Batches of open and decided transactions.
    waiting: usize,
}

/// A refusal: a Kafka error code and why.
pub type Refusal = (i16, String);

fn refusal(error: ResponseError, why: impl Into<String>) -> Refusal {
    (error.code(), why.into())
}

/// The transaction coordinator (one per server: every transactional id is coordinated here).
pub(crate) struct Transactions {
    journal: Arc<SystemTopic>,
    engine: Arc<Engine>,
    producers: Arc<Producers>,
    groups: Arc<groups::Coordinator>,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    by_producer: Mutex<HashMap<i64, String>>,
    /// Journal keys to delete at [`Transactions::recover`]: batches of transactions that ended.
    stale: Mutex<Vec<Bytes>>,
    /// One new transactional id at a time.
    creating: tokio::sync::Mutex<()>,
    /// How long an idle transactional id is kept ([`ID_EXPIRY`]).
    id_expiry: Duration,
    /// On a cluster node, the leader term the journal was last read back for
    /// ([`Transactions::reload`]), and taken up in.
    term: Mutex<Option<u64>>,
    loaded_term: std::sync::atomic::AtomicU64,
}

/// A snapshot of one transactional id, for DescribeTransactions and ListTransactions.
pub struct Described {
    pub id: String,
    pub stored: Stored,
}

impl Transactions {
    /// Reads the journal back. Call [`Transactions::recover`] before serving.
    pub fn open(
        engine: &Arc<Engine>,
        producers: Arc<Producers>,
        groups: Arc<groups::Coordinator>,
    ) -> Result<Transactions, EngineError> {
        let config = SystemTopicConfig {
            record_bytes_max: BATCH_BYTES_MAX + CHUNK_ENVELOPE_BYTES,
            ..SystemTopicConfig::default()
        };
        let journal = engine.system_topic(TRANSACTIONS_TOPIC, &config)?;
        let read = read_journal(&journal, None)?;
        metrics::gauge!(WAITING).increment(read.waiting as f64);
        tracing::info!(transactional_ids = read.entries.len(), "Kafka transactions restored");
        Ok(Transactions {
            journal,
            engine: engine.clone(),
            producers,
            groups,
            entries: Mutex::new(read.entries),
            by_producer: Mutex::new(read.by_producer),
            stale: Mutex::new(read.stale),
            creating: tokio::sync::Mutex::new(()),
            id_expiry: ID_EXPIRY,
            term: Mutex::new(None),
            loaded_term: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// Reads the journal back for the leader term `term` and takes up what the leaders before
    /// left, as [`Transactions::recover`] does after a stop: a cluster node that became the
    /// leader coordinates the transactions from the journal every node applied. The
    /// idempotent producers' states must have been read back for `term` first.
    pub async fn reload(&self, term: u64) -> Result<(), EngineError> {
        let journal = self.journal.clone();
        let read = tokio::task::spawn_blocking(move || read_journal(&journal, Some(term)))
            .await
            .map_err(|error| EngineError::Internal(format!("reading the transactions' journal: {error}")))??;
        let before: usize = {
            let entries = self.entries.lock().expect("entries lock");
            entries.values().map(|entry| entry.txn.lock().expect("txn lock").chunks.len()).sum()
        };
        metrics::gauge!(WAITING).decrement(before as f64);
        metrics::gauge!(WAITING).increment(read.waiting as f64);
        let ids = read.entries.len();
        *self.entries.lock().expect("entries lock") = read.entries;
        *self.by_producer.lock().expect("by_producer lock") = read.by_producer;
        *self.stale.lock().expect("stale lock") = read.stale;
        *self.term.lock().expect("term lock") = Some(term);
        self.recover().await?;
        self.loaded_term.store(term, std::sync::atomic::Ordering::SeqCst);
        tracing::info!(transactional_ids = ids, term, "Kafka transactions read back: this node coordinates them");
        Ok(())
    }

    /// The leader term the journal was last read back for and taken up in
    /// ([`Transactions::reload`]).
    pub fn loaded_term(&self) -> Option<u64> {
        Some(self.loaded_term.load(std::sync::atomic::Ordering::SeqCst)).filter(|term| *term != u64::MAX)
    }

    /// The term new transactional ids' writes are fenced to (`None` on a single node).
    fn term(&self) -> Option<u64> {
        *self.term.lock().expect("term lock")
    }

    /// Appends `records` to the journal (on a cluster node through the cluster, fenced to
    /// `term`) and returns the offset of the first here.
    async fn append_journal(&self, records: Vec<NewRecord>, term: Option<u64>) -> Result<u64, EngineError> {
        if !self.engine.is_replicated() {
            return self.journal.append(&records).await;
        }
        let first = records.first().and_then(|record| record.key.clone());
        let from = self.journal.end_offset();
        self.engine.append_system_in_term(&self.journal, records, term).await?;
        // Answered once the leader, which this node is (the append is fenced to its term),
        // applied it: it is here, after `from`.
        let Some(first) = first else { return Ok(from) };
        self.journal.find_key(from, &first)?.ok_or_else(|| {
            EngineError::Internal(format!(
                "a record appended to {TRANSACTIONS_TOPIC} is not where this node applied it"
            ))
        })
    }

    /// Finishes what a stop interrupted: commits decided and not yet applied are applied,
    /// aborts decided are completed, and batches of ended transactions leave the journal.
    /// Transactions still open stay open, their timeouts counted from now.
    pub async fn recover(&self) -> Result<(), EngineError> {
        let stale = std::mem::take(&mut *self.stale.lock().expect("stale lock"));
        if !stale.is_empty() {
            let records: Vec<NewRecord> = stale.iter().cloned().map(NewRecord::tombstone).collect();
            self.append_journal(records, self.term()).await?;
        }
        let entries: Vec<(String, Arc<Entry>)> =
            self.entries.lock().expect("entries lock").iter().map(|(id, entry)| (id.clone(), entry.clone())).collect();
        let (mut committed, mut aborted, mut open) = (0, 0, 0);
        for (id, entry) in entries {
            let _acting = entry.acting.lock().await;
            let phase = entry.txn.lock().expect("txn lock").stored.phase;
            match phase {
                Phase::PrepareCommit => {
                    self.finish_commit(&id, &entry).await?;
                    committed += 1;
                }
                Phase::PrepareAbort => {
                    self.finish_abort(&id, &entry, false).await?;
                    aborted += 1;
                }
                Phase::Ongoing => {
                    entry.txn.lock().expect("txn lock").stored.started_ms = now_ms();
                    open += 1;
                }
                _ => {}
            }
        }
        if committed + aborted + open > 0 {
            tracing::info!(committed, aborted, open, "Kafka transactions interrupted by the last stop taken up");
        }
        Ok(())
    }

    fn entry(&self, id: &str) -> Option<Arc<Entry>> {
        self.entries.lock().expect("entries lock").get(id).cloned()
    }

    /// The journal record of `id`'s state.
    fn state_record(id: &str, stored: &Stored) -> NewRecord {
        NewRecord::keyed(Bytes::from(format!("t/{id}")), serde_json::to_vec(stored).expect("a state serializes"))
    }

    /// Writes `stored` (with `more`, first) durably, then makes it the state.
    async fn write(
        &self,
        id: &str,
        entry: &Entry,
        mut stored: Stored,
        more: Vec<NewRecord>,
    ) -> Result<(), EngineError> {
        if entry.txn.lock().expect("txn lock").gone {
            return Err(EngineError::InvalidDefinition(format!(
                "transactional id {id:?} expired: initialise its producer again"
            )));
        }
        stored.touched_ms = now_ms();
        let mut records = more;
        records.push(Self::state_record(id, &stored));
        self.append_journal(records, entry.term).await?;
        let old = {
            let mut txn = entry.txn.lock().expect("txn lock");
            std::mem::replace(&mut txn.stored, stored)
        };
        let new = entry.txn.lock().expect("txn lock").stored.producer_id;
        if old.producer_id != new {
            let mut by_producer = self.by_producer.lock().expect("by_producer lock");
            by_producer.remove(&old.producer_id);
            by_producer.insert(new, id.to_string());
        }
        Ok(())
    }

    /// InitProducerId for a transactional id: its producer id at the next epoch (a new id
    /// the first time, or when the epoch runs out), after ending what the previous producer
    /// left: an open transaction is aborted, a decided commit finished. `current` is the id and
    /// epoch the producer had (KIP-360), or `(-1, -1)`.
    pub async fn init_producer(&self, id: &str, timeout_ms: i32, current: (i64, i16)) -> Result<(i64, i16), Refusal> {
        if timeout_ms <= 0 || timeout_ms as u128 > TIMEOUT_MAX.as_millis() {
            return Err(refusal(
                ResponseError::InvalidTransactionTimeout,
                format!("transaction.timeout.ms {timeout_ms} is not in 1..={}", TIMEOUT_MAX.as_millis()),
            ));
        }
        let entry = match self.entry(id) {
            Some(entry) => entry,
            None => {
                // A new transactional id: one creation at a time, so two producers starting
                // with the same id at once get one producer id between them.
                let _creating = self.creating.lock().await;
                match self.entry(id) {
                    Some(entry) => entry,
                    None => {
                        let (producer_id, epoch) = self.producers.init(-1, -1).await.map_err(engine_refusal)?;
                        let stored = Stored {
                            producer_id,
                            epoch,
                            timeout_ms: timeout_ms as u64,
                            number: 0,
                            phase: Phase::Empty,
                            started_ms: now_ms(),
                            partitions: Vec::new(),
                            groups: Vec::new(),
                            offsets: Vec::new(),
                            sequences: Vec::new(),
                            touched_ms: now_ms(),
                        };
                        let term = self.term();
                        self.append_journal(vec![Self::state_record(id, &stored)], term)
                            .await
                            .map_err(engine_refusal)?;
                        let entry = Arc::new(Entry {
                            acting: tokio::sync::Mutex::new(()),
                            txn: Mutex::new(Txn { stored, chunks: Vec::new(), gone: false }),
                            term,
                        });
                        self.entries.lock().expect("entries lock").insert(id.to_string(), entry);
                        self.by_producer.lock().expect("by_producer lock").insert(producer_id, id.to_string());
                        return Ok((producer_id, epoch));
                    }
                }
            }
        };
        let _acting = entry.acting.lock().await;
        if entry.txn.lock().expect("txn lock").gone {
            // Expired while this request waited: the id starts afresh.
            drop(_acting);
            return Box::pin(self.init_producer(id, timeout_ms, current)).await;
        }
        let stored = entry.txn.lock().expect("txn lock").stored.clone();
        if current.0 >= 0 && (current.0 != stored.producer_id || current.1 != stored.epoch) {
            return Err(refusal(
                ResponseError::ProducerFenced,
                format!(
                    "producer {}:{} is not the current one of {id:?} ({}:{})",
                    current.0, current.1, stored.producer_id, stored.epoch
                ),
            ));
        }
        match stored.phase {
            Phase::Ongoing | Phase::PrepareAbort => {
                self.finish_abort(id, &entry, true).await.map_err(engine_refusal)?
            }
            Phase::PrepareCommit => self.finish_commit(id, &entry).await.map_err(engine_refusal)?,
            _ => {}
        }
        let mut next = entry.txn.lock().expect("txn lock").stored.clone();
        if next.epoch >= i16::MAX - 1 {
            let (producer_id, epoch) = self.producers.init(-1, -1).await.map_err(engine_refusal)?;
            next.producer_id = producer_id;
            next.epoch = epoch;
        } else {
            next.epoch += 1;
        }
        next.timeout_ms = timeout_ms as u64;
        next.sequences.clear();
        let answer = (next.producer_id, next.epoch);
        self.write(id, &entry, next, Vec::new()).await.map_err(engine_refusal)?;
        Ok(answer)
    }

    /// The entry of `id` for a request by `producer`, checked: the producer id is the id's,
    /// and the epoch its current one.
    fn checked(&self, id: &str, producer: (i64, i16), fenced: ResponseError) -> Result<Arc<Entry>, Refusal> {
        let Some(entry) = self.entry(id) else {
            return Err(refusal(
                ResponseError::InvalidProducerIdMapping,
                format!("no producer was initialised for transactional id {id:?}"),
            ));
        };
        check_producer(&entry.txn.lock().expect("txn lock").stored, id, producer, fenced)?;
        Ok(entry)
    }

    /// Begins a transaction on `stored` when none is open: a new number, nothing added yet.
    fn begin(stored: &mut Stored) -> Result<(), Refusal> {
        match stored.phase {
            Phase::Ongoing => Ok(()),
            Phase::PrepareCommit | Phase::PrepareAbort => {
                Err(refusal(ResponseError::ConcurrentTransactions, "the previous transaction is still being completed"))
            }
            Phase::Empty | Phase::CompleteCommit | Phase::CompleteAbort => {
                stored.number += 1;
                stored.phase = Phase::Ongoing;
                stored.started_ms = now_ms();
                stored.partitions.clear();
                stored.groups.clear();
                stored.offsets.clear();
                Ok(())
            }
        }
    }

    /// Changes `id`'s state for a request of `producer`, once that request is the only one
    /// acting on it and its producer is checked: `change` edits a copy and says whether there
    /// is anything to write; the copy is written durably, then becomes the state.
    async fn change(
        &self,
        id: &str,
        producer: (i64, i16),
        fenced: ResponseError,
        change: impl FnOnce(&mut Stored) -> Result<bool, Refusal>,
    ) -> Result<(), Refusal> {
        let entry = self.checked(id, producer, fenced)?;
        let _acting = entry.acting.lock().await;
        let mut next = entry.txn.lock().expect("txn lock").stored.clone();
        check_producer(&next, id, producer, fenced)?;
        if !change(&mut next)? {
            return Ok(());
        }
        self.write(id, &entry, next, Vec::new()).await.map_err(engine_refusal)
    }

    /// AddPartitionsToTxn: `partitions` join the transaction (beginning it). Every partition
    /// must exist; otherwise none is added.
    pub async fn add_partitions(
        &self,
        id: &str,
        producer: (i64, i16),
        partitions: &[Partition],
        fenced: ResponseError,
    ) -> Result<(), Refusal> {
        self.change(id, producer, fenced, |next| {
            let fresh = partitions.iter().any(|partition| !next.partitions.contains(partition));
            if !fresh && next.phase == Phase::Ongoing {
                return Ok(false);
            }
            Self::begin(next)?;
            for partition in partitions {
                if !next.partitions.contains(partition) {
                    next.partitions.push(partition.clone());
                }
            }
            Ok(true)
        })
        .await
    }

    /// AddOffsetsToTxn: the transaction will commit offsets of `group`.
    pub async fn add_group(
        &self,
        id: &str,
        producer: (i64, i16),
        group: &str,
        fenced: ResponseError,
    ) -> Result<(), Refusal> {
        self.change(id, producer, fenced, |next| {
            let known = next.groups.iter().any(|known| known == group);
            if known && next.phase == Phase::Ongoing {
                return Ok(false);
            }
            Self::begin(next)?;
            if !next.groups.iter().any(|known| known == group) {
                next.groups.push(group.to_string());
            }
            Ok(true)
        })
        .await
    }

    /// TxnOffsetCommit: `offsets` of `group` are committed with the transaction.
    pub async fn commit_offsets(
        &self,
        id: &str,
        producer: (i64, i16),
        group: &str,
        offsets: Vec<(OffsetKey, Committed)>,
        fenced: ResponseError,
    ) -> Result<(), Refusal> {
        self.change(id, producer, fenced, |next| {
            if next.phase != Phase::Ongoing || !next.groups.iter().any(|known| known == group) {
                return Err(refusal(
                    ResponseError::InvalidTxnState,
                    format!("group {group:?} was not added to the transaction (AddOffsetsToTxn)"),
                ));
            }
            for (key, committed) in offsets {
                match next.offsets.iter_mut().find(|(known, _)| *known == key) {
                    Some((_, at)) => *at = committed,
                    None => next.offsets.push((key, committed)),
                }
            }
            Ok(true)
        })
        .await
    }

    /// A transactional batch for `partition` of `stream`, as sent (`raw`) and decoded: checked
    /// (its producer's transaction is open and holds the partition, its sequence follows) and
    /// written to the journal. `Ok(false)` when it is a retry of a batch already taken.
    pub async fn produce(
        &self,
        stream: &Stream,
        partition: u32,
        raw: &Bytes,
        produced: &Produced,
    ) -> Result<bool, Refusal> {
        let Some(sequenced) = produced.sequenced else {
            return Err(refusal(ResponseError::InvalidRecord, "a transactional batch without a producer id"));
        };
        let id = self.by_producer.lock().expect("by_producer lock").get(&sequenced.producer_id).cloned();
        let Some(id) = id else {
            return Err(refusal(
                ResponseError::InvalidProducerIdMapping,
                format!("producer id {} belongs to no transactional id", sequenced.producer_id),
            ));
        };
        let producer = (sequenced.producer_id, sequenced.epoch);
        let entry = self.checked(&id, producer, ResponseError::InvalidProducerEpoch)?;
        let _acting = entry.acting.lock().await;
        let target: Partition = (stream.name().to_string(), partition);
        let (number, k) = {
            let txn = entry.txn.lock().expect("txn lock");
            check_producer(&txn.stored, &id, producer, ResponseError::InvalidProducerEpoch)?;
            if txn.stored.phase != Phase::Ongoing || !txn.stored.partitions.contains(&target) {
                return Err(refusal(
                    ResponseError::InvalidTxnState,
                    format!("partition {partition} of {:?} was not added to the transaction", stream.name()),
                ));
            }
            let (first, last) = (sequenced.first_sequence, sequenced.last_sequence);
            if txn.chunks.iter().any(|chunk| {
                chunk.partition == target
                    && chunk.sequenced.first_sequence == first
                    && chunk.sequenced.last_sequence == last
            }) {
                return Ok(false);
            }
            if let Some(expected) = txn.next_sequence(&target)
                && expected != first
            {
                return Err(refusal(
                    ResponseError::OutOfOrderSequenceNumber,
                    format!("sequence {first} where {expected} was expected"),
                ));
            }
            (txn.stored.number, txn.chunks.len())
        };
        if raw.len() > BATCH_BYTES_MAX {
            return Err(refusal(
                ResponseError::MessageTooLarge,
                format!("a transactional batch of {} bytes, over {BATCH_BYTES_MAX}", raw.len()),
            ));
        }
        stream.check(partition, &produced.records).map_err(engine_refusal)?;
        let key = Bytes::from(format!("c/{number}/{k}/{id}"));
        let mut record = NewRecord::keyed(key.clone(), raw.clone());
        record.headers = vec![
            (Text::from_static(STREAM_HEADER), Some(Bytes::from(stream.name().to_string()))),
            (Text::from_static(PARTITION_HEADER), Some(Bytes::from(partition.to_string()))),
            (Text::from_static(SEQUENCE_HEADER), Some(Bytes::from(sequence_text(&sequenced)))),
        ];
        let offset = self.append_journal(vec![record], entry.term).await.map_err(engine_refusal)?;
        let mut txn = entry.txn.lock().expect("txn lock");
        Txn::set_next_sequence(&mut txn.stored, &target, add_sequence(sequenced.last_sequence, 1));
        txn.chunks.push(Chunk { offset, key, partition: target, sequenced });
        metrics::gauge!(WAITING).increment(1.0);
        Ok(true)
    }

    /// EndTxn: commits or aborts the open transaction. Once it is answered without an error,
    /// a commit's batches are in their streams (fsynced) and its offsets committed. A retry
    /// of the same decision is answered as the first was.
    pub async fn end(
        &self,
        id: &str,
        producer: (i64, i16),
        commit: bool,
        fenced: ResponseError,
    ) -> Result<(), Refusal> {
        let entry = self.checked(id, producer, fenced)?;
        let _acting = entry.acting.lock().await;
        let stored = entry.txn.lock().expect("txn lock").stored.clone();
        check_producer(&stored, id, producer, fenced)?;
        match (stored.phase, commit) {
            (Phase::Ongoing, true) => {
                let mut decided = stored;
                decided.phase = Phase::PrepareCommit;
                self.write(id, &entry, decided, Vec::new()).await.map_err(engine_refusal)?;
                self.finish_commit(id, &entry).await.map_err(engine_refusal)
            }
            (Phase::PrepareCommit, true) => self.finish_commit(id, &entry).await.map_err(engine_refusal),
            (Phase::Ongoing | Phase::PrepareAbort, false) => {
                self.finish_abort(id, &entry, false).await.map_err(engine_refusal)
            }
            (Phase::CompleteCommit, true) | (Phase::CompleteAbort, false) => Ok(()),
            (phase, _) => Err(refusal(
                ResponseError::InvalidTxnState,
                format!(
                    "{} a transaction in state {}",
                    if commit { "cannot commit" } else { "cannot abort" },
                    phase.name()
                ),
            )),
        }
    }

    /// Applies a decided commit: the batches not yet in their streams are appended (fsync),
    /// the offsets committed; then `CompleteCommit`, and the batches leave the journal.
    async fn finish_commit(&self, id: &str, entry: &Entry) -> Result<(), EngineError> {
        let (chunks, offsets, mut done) = {
            let txn = entry.txn.lock().expect("txn lock");
            (txn.chunks.clone(), txn.stored.offsets.clone(), txn.stored.clone())
        };
        self.apply(&chunks, entry.term).await?;
        self.groups.offsets.commit_in_term(offsets, entry.term).await?;
        done.phase = Phase::CompleteCommit;
        done.offsets.clear();
        let tombstones = chunks.iter().map(|chunk| NewRecord::tombstone(chunk.key.clone())).collect();
        self.write(id, entry, done, tombstones).await?;
        Self::clear_chunks(entry);
        metrics::counter!(COMMITTED).increment(1);
        Ok(())
    }

    /// Aborts the open transaction: `CompleteAbort`, and its batches leave the journal; with
    /// `fence`, the epoch moves on too, so the producer that left it can do nothing more.
    async fn finish_abort(&self, id: &str, entry: &Entry, fence: bool) -> Result<(), EngineError> {
        let (chunks, mut done) = {
            let txn = entry.txn.lock().expect("txn lock");
            (txn.chunks.clone(), txn.stored.clone())
        };
        done.phase = Phase::CompleteAbort;
        done.offsets.clear();
        if fence {
            done.epoch = done.epoch.saturating_add(1);
            done.sequences.clear();
        }
        let tombstones = chunks.iter().map(|chunk| NewRecord::tombstone(chunk.key.clone())).collect();
        self.write(id, entry, done, tombstones).await?;
        Self::clear_chunks(entry);
        metrics::counter!(ABORTED).increment(1);
        Ok(())
    }

    /// The transaction's batches have left the journal.
    fn clear_chunks(entry: &Entry) {
        let mut txn = entry.txn.lock().expect("txn lock");
        metrics::gauge!(WAITING).decrement(txn.chunks.len() as f64);
        txn.chunks.clear();
    }

    /// Appends the batches of a committed transaction to their streams, each as its producer
    /// sent it, skipping those a stream already holds (a commit finished after a restart) and
    /// those of streams deleted since.
    async fn apply(&self, chunks: &[Chunk], term: Option<u64>) -> Result<(), EngineError> {
        let mut queued = Vec::with_capacity(chunks.len());
        let mut failed = None;
        for chunk in chunks {
            let (name, partition) = &chunk.partition;
            let stream = match self.engine.stream(name) {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::warn!(stream = %name, %error, "a committed transaction's batch for a stream that is gone is dropped");
                    continue;
                }
            };
            if self.producers.covers(name, *partition, &chunk.sequenced) {
                continue;
            }
            let Some(record) = self.journal.read_at(chunk.offset)? else {
                failed = Some(EngineError::Internal(format!(
                    "a committed transaction's batch is missing from {TRANSACTIONS_TOPIC} at offset {}",
                    chunk.offset
                )));
                break;
            };
            let raw = record.value.unwrap_or_default();
            let mut produced = match records::decode(raw, BATCH_BYTES_MAX * 8) {
                Ok(produced) => produced,
                Err(refused) => {
                    failed = Some(EngineError::Internal(format!("a journal batch no longer decodes: {refused:?}")));
                    break;
                }
            };
            if let Some(last) = produced.records.last_mut() {
                last.headers.push(Producers::header(&chunk.sequenced));
            }
            let ticket = self.producers.admit(&stream, *partition, chunk.sequenced);
            match stream.enqueue_to_in_term(*partition, &produced.records, Some(Durability::Fsync), term).await {
                Ok(append) => queued.push((ticket, append, produced.records.len())),
                Err(error) => {
                    self.producers.stored(ticket, None);
                    failed = Some(error);
                    break;
                }
            }
        }
        for (ticket, append, count) in queued {
            let acked = append.await;
            self.producers.stored(ticket, acked.as_ref().ok().map(|ack| ack.base_offset));
            match acked {
                Ok(_) => metrics::counter!(super::RECORDS_PRODUCED).increment(count as u64),
                Err(error) => {
                    failed.get_or_insert(EngineError::from(error));
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Aborts the transactions open longer than their timeout, fencing their producers (as
    /// Kafka's coordinator does). A transaction some request is acting on is left for the next
    /// tick.
    pub async fn expire(&self) {
        let now = now_ms();
        let entries: Vec<(String, Arc<Entry>)> =
            self.entries.lock().expect("entries lock").iter().map(|(id, entry)| (id.clone(), entry.clone())).collect();
        for (id, entry) in entries {
            let expired = {
                let txn = entry.txn.lock().expect("txn lock");
                txn.stored.phase == Phase::Ongoing && now - txn.stored.started_ms > txn.stored.timeout_ms as i64
            };
            if !expired {
                continue;
            }
            let Ok(_acting) = entry.acting.try_lock() else { continue };
            tracing::info!(transactional_id = %id, "a Kafka transaction ran past its timeout and is aborted");
            if let Err(error) = self.finish_abort(&id, &entry, true).await {
                tracing::warn!(transactional_id = %id, %error, "an expired Kafka transaction could not be aborted");
            }
        }
        self.forget_idle(now, self.id_expiry).await;
    }

    /// Forgets the transactional ids with no open transaction that were not written to for
    /// `expiry` (a tombstone in the journal, then out of memory).
    async fn forget_idle(&self, now: i64, expiry: Duration) {
        let entries: Vec<(String, Arc<Entry>)> =
            self.entries.lock().expect("entries lock").iter().map(|(id, entry)| (id.clone(), entry.clone())).collect();
        for (id, entry) in entries {
            let idle = {
                let txn = entry.txn.lock().expect("txn lock");
                matches!(txn.stored.phase, Phase::Empty | Phase::CompleteCommit | Phase::CompleteAbort)
                    && now - txn.stored.touched_ms > expiry.as_millis() as i64
            };
            if !idle {
                continue;
            }
            let Ok(_acting) = entry.acting.try_lock() else { continue };
            let tombstone = NewRecord::tombstone(Bytes::from(format!("t/{id}")));
            if let Err(error) = self.append_journal(vec![tombstone], entry.term).await {
                tracing::warn!(transactional_id = %id, %error, "an idle transactional id could not be forgotten");
                continue;
            }
            let producer_id = {
                let mut txn = entry.txn.lock().expect("txn lock");
                txn.gone = true;
                txn.stored.producer_id
            };
            self.entries.lock().expect("entries lock").remove(&id);
            let mut by_producer = self.by_producer.lock().expect("by_producer lock");
            if by_producer.get(&producer_id) == Some(&id) {
                by_producer.remove(&producer_id);
            }
            tracing::info!(transactional_id = %id, "an idle transactional id expired");
        }
    }

    /// Whether an open transaction will commit an offset of `group` in `topic`'s `partition`
    /// (OffsetFetch with `require_stable` then answers UNSTABLE_OFFSET_COMMIT).
    pub fn unstable(&self, group: &str, topic: &str, partition: i32) -> bool {
        let entries: Vec<Arc<Entry>> = self.entries.lock().expect("entries lock").values().cloned().collect();
        entries.iter().any(|entry| {
            let txn = entry.txn.lock().expect("txn lock");
            matches!(txn.stored.phase, Phase::Ongoing | Phase::PrepareCommit)
                && txn.stored.offsets.iter().any(|((g, t, p), _)| g == group && t == topic && *p == partition)
        })
    }

    /// Every transactional id's state, by id.
    pub fn describe_all(&self) -> Vec<Described> {
        let entries: Vec<(String, Arc<Entry>)> =
            self.entries.lock().expect("entries lock").iter().map(|(id, entry)| (id.clone(), entry.clone())).collect();
        let mut described: Vec<Described> = entries
            .into_iter()
            .map(|(id, entry)| Described { id, stored: entry.txn.lock().expect("txn lock").stored.clone() })
            .collect();
        described.sort_by(|a, b| a.id.cmp(&b.id));
        described
    }

    /// One transactional id's state.
    pub fn describe(&self, id: &str) -> Option<Stored> {
        self.entry(id).map(|entry| entry.txn.lock().expect("txn lock").stored.clone())
    }
}

/// Checks that `producer` is `id`'s current producer id and epoch.
fn check_producer(stored: &Stored, id: &str, producer: (i64, i16), fenced: ResponseError) -> Result<(), Refusal> {
    if producer.0 != stored.producer_id {
        return Err(refusal(
            ResponseError::InvalidProducerIdMapping,
            format!("producer id {} is not the one of transactional id {id:?}", producer.0),
        ));
    }
    if producer.1 != stored.epoch {
        return Err(refusal(
            fenced,
            format!("epoch {} of producer {} is not its current one, {}", producer.1, producer.0, stored.epoch),
        ));
    }
    Ok(())
}

fn engine_refusal(error: EngineError) -> Refusal {
    (super::errors::code(&error), error.to_string())
}

fn sequence_text(sequenced: &Sequenced) -> String {
    format!("{}:{}:{}:{}", sequenced.producer_id, sequenced.epoch, sequenced.first_sequence, sequenced.last_sequence)
}

fn parse_sequence(text: &[u8]) -> Option<Sequenced> {
    let text = std::str::from_utf8(text).ok()?;
    let mut parts = text.split(':');
    Some(Sequenced {
        producer_id: parts.next()?.parse().ok()?,
        epoch: parts.next()?.parse().ok()?,
        first_sequence: parts.next()?.parse().ok()?,
        last_sequence: parts.next()?.parse().ok()?,
    })
}

/// Reads the journal: every transactional id's state and the batches of its open or decided
/// transaction; entries made for the leader term `term`, on a cluster node.
fn read_journal(journal: &SystemTopic, term: Option<u64>) -> Result<Read, EngineError> {
    let mut stored: HashMap<String, Stored> = HashMap::new();
    let mut chunks: BTreeMap<Bytes, (String, u64, Chunk)> = BTreeMap::new();
    journal.replay(|record| {
        read_journal_record(&record, &mut stored, &mut chunks);
        Ok::<(), EngineError>(())
    })?;
    let mut entries = HashMap::new();
    let mut by_producer = HashMap::new();
    let mut stale = Vec::new();
    let mut open: HashMap<String, Vec<Chunk>> = HashMap::new();
    for (key, (id, number, chunk)) in chunks {
        let live = stored.get(&id).is_some_and(|stored| {
            stored.number == number && matches!(stored.phase, Phase::Ongoing | Phase::PrepareCommit)
        });
        if live {
            open.entry(id).or_default().push(chunk);
        } else {
            stale.push(key);
        }
    }
    let mut waiting = 0;
    for (id, mut stored) in stored {
        let mut chunks = open.remove(&id).unwrap_or_default();
        chunks.sort_by_key(|chunk| chunk.offset);
        // The state was written before its transaction's batches: each partition's next
        // sequence follows the last batch taken, as it did before the stop.
        for chunk in &chunks {
            Txn::set_next_sequence(&mut stored, &chunk.partition, add_sequence(chunk.sequenced.last_sequence, 1));
        }
        by_producer.insert(stored.producer_id, id.clone());
        waiting += chunks.len();
        if stored.touched_ms == 0 {
            stored.touched_ms = now_ms();
        }
        let txn = Txn { stored, chunks, gone: false };
        let entry = Entry { acting: tokio::sync::Mutex::new(()), txn: Mutex::new(txn), term };
        entries.insert(id, Arc::new(entry));
    }
    Ok(Read { entries, by_producer, stale, waiting })
}

/// Folds one journal record into the states and batches read so far.
fn read_journal_record(
    record: &Record,
    stored: &mut HashMap<String, Stored>,
    chunks: &mut BTreeMap<Bytes, (String, u64, Chunk)>,
) {
    let Some(key) = record.key.clone() else { return };
    let Ok(text) = std::str::from_utf8(&key) else { return };
    if let Some(id) = text.strip_prefix("t/") {
        match record.value.as_deref().map(serde_json::from_slice::<Stored>) {
            Some(Ok(state)) => {
                stored.insert(id.to_string(), state);
            }
            Some(Err(error)) => {
                tracing::warn!(%error, transactional_id = id, "skipping an unreadable transaction state")
            }
            None => {
                stored.remove(id);
            }
        }
    } else if let Some(rest) = text.strip_prefix("c/") {
        if record.value.is_none() {
            chunks.remove(&key);
            return;
        }
        let mut parts = rest.splitn(3, '/');
        let (Some(Ok(number)), Some(Ok(_)), Some(id)) =
            (parts.next().map(str::parse::<u64>), parts.next().map(str::parse::<u64>), parts.next())
        else {
            return;
        };
        let stream = record.headers.get(STREAM_HEADER).and_then(|name| std::str::from_utf8(name).ok());
        let partition =
            record.headers.get(PARTITION_HEADER).and_then(|text| std::str::from_utf8(text).ok()?.parse::<u32>().ok());
        let sequenced = record.headers.get(SEQUENCE_HEADER).and_then(parse_sequence);
        let (Some(stream), Some(partition), Some(sequenced)) = (stream, partition, sequenced) else {
            tracing::warn!(offset = record.offset, "skipping an unreadable transaction batch");
            return;
        };
        let chunk =
            Chunk { offset: record.offset, key: key.clone(), partition: (stream.to_string(), partition), sequenced };
        chunks.insert(key.clone(), (id.to_string(), number, chunk));
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::records::{
        Compression, Record as KafkaRecord, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use onehop_engine::{EngineOptions, Position, StreamDef};

    const STREAM: &str = "out";

    struct Opened {
        engine: Arc<Engine>,
        transactions: Transactions,
    }

    async fn open(dir: &std::path::Path) -> Opened {
        let engine = Arc::new(Engine::open_in(dir, EngineOptions::default()).unwrap());
        if engine.stream(STREAM).is_err() {
            let def = StreamDef {
                name: STREAM.into(),
                partitions: 2,
                retention_ms: None,
                retention_bytes: None,
                durability: Durability::Fsync,
                mqtt_topic: None,
                compacted: false,
            };
            engine.create_stream(def).await.unwrap();
        }
        let producers = Arc::new(Producers::open(&engine).unwrap());
        let offsets = groups::committed::CommittedOffsets::open(&engine).unwrap();
        let groups = Arc::new(groups::Coordinator::new(offsets));
        let transactions = Transactions::open(&engine, producers, groups).unwrap();
        transactions.recover().await.unwrap();
        Opened { engine, transactions }
    }

    /// A transactional batch of `values`, as a producer sends it.
    fn batch(producer: (i64, i16), first_sequence: i32, values: &[&str]) -> (Bytes, Produced) {
        let records: Vec<KafkaRecord> = values
            .iter()
            .enumerate()
            .map(|(i, value)| KafkaRecord {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id: producer.0,
                producer_epoch: producer.1,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: first_sequence + i as i32,
                timestamp: 1,
                key: None,
                value: Some(Bytes::from(value.to_string())),
                headers: IndexMap::new(),
            })
            .collect();
        let mut buffer = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::Lz4 };
        RecordBatchEncoder::encode(&mut buffer, &records, &options).unwrap();
        let raw = buffer.freeze();
        let produced = records::decode(raw.clone(), 1 << 20).unwrap();
        assert!(produced.transactional);
        (raw, produced)
    }

    async fn produce(
        opened: &Opened,
        producer: (i64, i16),
        partition: u32,
        first: i32,
        values: &[&str],
    ) -> Result<bool, Refusal> {
        let stream = opened.engine.stream(STREAM).unwrap();
        let (raw, produced) = batch(producer, first, values);
        opened.transactions.produce(&stream, partition, &raw, &produced).await
    }

    /// Every value in `partition`, in offset order.
    fn values(opened: &Opened, partition: u32) -> Vec<String> {
        let stream = opened.engine.stream(STREAM).unwrap();
        stream
            .read(partition, Position::Earliest, 1000, 1 << 20)
            .unwrap()
            .into_iter()
            .map(|record| String::from_utf8(record.value.unwrap().to_vec()).unwrap())
            .collect()
    }

    fn both() -> Vec<Partition> {
        vec![(STREAM.to_string(), 0), (STREAM.to_string(), 1)]
    }

    const FENCED: ResponseError = ResponseError::ProducerFenced;

    #[tokio::test]
    async fn commits_show_aborts_never_and_a_commit_cut_short_finishes_exactly_once_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open(dir.path()).await;
        let txns = &opened.transactions;
        let producer = txns.init_producer("t", 60_000, (-1, -1)).await.unwrap();

        // A committed transaction: nothing shows until the commit, then everything.
        txns.add_partitions("t", producer, &both(), FENCED).await.unwrap();
        assert!(produce(&opened, producer, 0, 0, &["a1", "a2"]).await.unwrap());
        assert!(!produce(&opened, producer, 0, 0, &["a1", "a2"]).await.unwrap(), "a retry is taken once");
        assert!(produce(&opened, producer, 1, 0, &["b1"]).await.unwrap());
        let gap = produce(&opened, producer, 1, 5, &["b9"]).await.unwrap_err();
        assert_eq!(gap.0, ResponseError::OutOfOrderSequenceNumber.code());
        assert!(values(&opened, 0).is_empty() && values(&opened, 1).is_empty(), "an open transaction is invisible");
        txns.end("t", producer, true, FENCED).await.unwrap();
        txns.end("t", producer, true, FENCED).await.unwrap();
        assert_eq!(values(&opened, 0), ["a1", "a2"]);
        assert_eq!(values(&opened, 1), ["b1"]);

        // An aborted one never shows; its sequence numbers are used up, as in Kafka's log.
        txns.add_partitions("t", producer, &both(), FENCED).await.unwrap();
        produce(&opened, producer, 0, 2, &["x1"]).await.unwrap();
        txns.end("t", producer, false, FENCED).await.unwrap();
        let refused = txns.end("t", producer, true, FENCED).await.unwrap_err();
        assert_eq!(refused.0, ResponseError::InvalidTxnState.code(), "a commit after the abort");
        // A partition not added is refused.
        let unadded = produce(&opened, producer, 0, 3, &["y"]).await.unwrap_err();
        assert_eq!(unadded.0, ResponseError::InvalidTxnState.code());

        // A commit cut short: decided, one partition's batch appended, then the process dies.
        txns.add_partitions("t", producer, &both(), FENCED).await.unwrap();
        produce(&opened, producer, 0, 3, &["c1", "c2"]).await.unwrap();
        produce(&opened, producer, 1, 1, &["d1"]).await.unwrap();
        let entry = txns.entry("t").unwrap();
        let mut decided = entry.txn.lock().unwrap().stored.clone();
        decided.phase = Phase::PrepareCommit;
        txns.write("t", &entry, decided, Vec::new()).await.unwrap();
        let chunks = entry.txn.lock().unwrap().chunks.clone();
        txns.apply(&chunks[..1], None).await.unwrap();
        assert_eq!(values(&opened, 0), ["a1", "a2", "c1", "c2"]);
        drop((entry, opened));

        // The start finishes it: partition 1 gets its batch, partition 0 not a second time.
        let opened = open(dir.path()).await;
        assert_eq!(values(&opened, 0), ["a1", "a2", "c1", "c2"]);
        assert_eq!(values(&opened, 1), ["b1", "d1"]);
        let txns = &opened.transactions;
        assert_eq!(txns.describe("t").unwrap().phase, Phase::CompleteCommit);

        // An open transaction survives a restart and commits after it.
        txns.add_partitions("t", producer, &both()[..1], FENCED).await.unwrap();
        produce(&opened, producer, 0, 5, &["e1"]).await.unwrap();
        drop(opened);
        let opened = open(dir.path()).await;
        let txns = &opened.transactions;
        assert_eq!(txns.describe("t").unwrap().phase, Phase::Ongoing);
        assert!(!produce(&opened, producer, 0, 5, &["e1"]).await.unwrap(), "its batch is known after the restart");
        assert!(produce(&opened, producer, 0, 6, &["e2"]).await.unwrap(), "the next batch follows it");
        txns.end("t", producer, true, FENCED).await.unwrap();
        assert_eq!(values(&opened, 0), ["a1", "a2", "c1", "c2", "e1", "e2"]);

        // A new producer with the same id aborts what the old one left open and fences it.
        txns.add_partitions("t", producer, &both(), FENCED).await.unwrap();
        produce(&opened, producer, 1, 2, &["zombie"]).await.unwrap();
        let next = txns.init_producer("t", 60_000, (-1, -1)).await.unwrap();
        // As Kafka's coordinator: one epoch for the abort that fences, one for the new producer.
        assert_eq!(next, (producer.0, producer.1 + 2));
        let fenced = txns.end("t", producer, true, FENCED).await.unwrap_err();
        assert_eq!(fenced.0, FENCED.code());
        let late = produce(&opened, producer, 1, 3, &["late"]).await.unwrap_err();
        assert_eq!(late.0, ResponseError::InvalidProducerEpoch.code());
        assert_eq!(values(&opened, 1), ["b1", "d1"], "the zombie's records never show");
        // Its journal batches are gone once every transaction ended.
        drop(opened);
        let opened = open(dir.path()).await;
        let entry = opened.transactions.entry("t").unwrap();
        assert!(entry.txn.lock().unwrap().chunks.is_empty());
    }

    #[tokio::test]
    async fn an_idle_transactional_id_is_forgotten_and_starts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open(dir.path()).await;
        let txns = &opened.transactions;
        let producer = txns.init_producer("idle", 60_000, (-1, -1)).await.unwrap();
        let busy = txns.init_producer("busy", 60_000, (-1, -1)).await.unwrap();
        txns.add_partitions("busy", busy, &both(), FENCED).await.unwrap();
        // Much later: the idle id goes, the one with an open transaction stays.
        txns.forget_idle(now_ms() + 10_000, Duration::from_secs(1)).await;
        assert!(txns.describe("idle").is_none());
        assert_eq!(txns.describe("busy").unwrap().phase, Phase::Ongoing);
        let refused = txns.add_partitions("idle", producer, &both(), FENCED).await.unwrap_err();
        assert_eq!(refused.0, ResponseError::InvalidProducerIdMapping.code());
        drop(opened);
        let opened = open(dir.path()).await;
        assert!(opened.transactions.describe("idle").is_none(), "forgotten across a restart too");
        let fresh = opened.transactions.init_producer("idle", 60_000, (-1, -1)).await.unwrap();
        assert_ne!(fresh.0, producer.0, "a new producer id");
    }

    #[tokio::test]
    async fn a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() {
        let dir = tempfile::tempdir().unwrap();
        let opened = open(dir.path()).await;
        let txns = &opened.transactions;
        let producer = txns.init_producer("slow", 1, (-1, -1)).await.unwrap();
        txns.add_partitions("slow", producer, &both(), FENCED).await.unwrap();
        produce(&opened, producer, 0, 0, &["late"]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        txns.expire().await;
        let stored = txns.describe("slow").unwrap();
        assert_eq!((stored.phase, stored.epoch), (Phase::CompleteAbort, producer.1 + 1));
        let fenced = txns.end("slow", producer, true, FENCED).await.unwrap_err();
        assert_eq!(fenced.0, FENCED.code());
        assert!(values(&opened, 0).is_empty());
        let timeout = txns.init_producer("slow", 0, (-1, -1)).await.unwrap_err();
        assert_eq!(timeout.0, ResponseError::InvalidTransactionTimeout.code());
    }
}
