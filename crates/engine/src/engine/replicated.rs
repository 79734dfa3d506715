//! Replicated writes: the engine as the state machine of a cluster (docs/cluster.md).
//!
//! On a cluster node every stream write and stream creation is a request the cluster's leader
//! prepares ([`Engine::prepare_replicated`]) into a command, commits to a majority of the
//! nodes' Raft logs, and every node applies in log order ([`Engine::apply_replicated`]). The
//! leader decides what must come out the same everywhere: the partition of each record, its
//! timestamp, and the offsets it will take (predicted from its own applied state plus what it
//! prepared since, valid within one leader term). So every node's partitions hold the same
//! records at the same offsets, and a subscriber anywhere sees committed records only: a
//! record reaches a node's partitions when that node applies a committed command.
//!
//! Tables go the same way. The leader decides each row write against the newest row (as
//! applied, or as written earlier in its term), checks its condition (`If-Match`, …) once, and
//! commits the resulting change at the offset it predicted in the table's partition. Table,
//! index and drop definitions are commands too, applied by every node in log order.
//!
//! Applying is idempotent: an append whose offsets a partition already holds is skipped (after
//! a restart, commands after the last recorded progress are applied again), and one that
//! would leave a gap, or overlap what is there, stops the node rather than diverge.
//!
//! Access changes (users, roles, grants, tokens) are commands too: the node that was asked
//! draws what is random or timed (salts, token secrets), and every node makes the change
//! against the same definitions, in log order.
//!
//! A view's definition is a command; every node runs the view over its own copy of the
//! source, which is the same everywhere, so the views agree (docs/cluster.md).
//!
//! A stream's drop and the changes to its definition (retention, partitions) are commands too;
//! while a drop is in flight the leader prepares nothing for that name, since the offsets
//! start again from 0 after it.
//!
//! A transform's definition is a command too, and so is each batch of its output: the leader
//! runs the transform (once it applied every command of earlier terms) and submits each batch
//! with the source positions it covers, `from` and `to`. The leader prepares a batch only if
//! `from` is where the transform is (as applied, or as prepared in its term), so two runs of it
//! (an old leader's, a new one's) never both write a stretch of the source; every node appends
//! the batch and moves the transform's position to `to` in the same step.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use onehop_log::{AppendError, NewRecord, QueuedAppend, Text, check_records, now_ms};
use serde::{Deserialize, Serialize};

use serde_json::{Map, Value};

use super::*;
use crate::engine::access::{AccessAnswer, AccessChange};
use crate::idempotency::{Tag, WriteKey};
use crate::stream::Published;
use crate::table::{Precondition, Write, Written, check_row_id, compute_write};

/// The answer to a submitted request, once committed and applied on the leader: its encoded
/// outcome, or why the cluster could not confirm it.
pub type Submitted = Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send>>;

/// Where a cluster node's engine sends its writes: the cluster (onehop's binary wires its
/// Raft node here).
pub trait Replicator: Send + Sync + 'static {
    /// Submits `request`, returning once it is queued behind every request submitted before
    /// it; the returned future resolves with the leader's answer.
    fn submit(&self, request: Bytes) -> Pin<Box<dyn Future<Output = Result<Submitted, String>> + Send + '_>>;
}

/// The slot every stream shares with its engine: empty on a single node.
pub(crate) type ReplicatorSlot = Arc<std::sync::OnceLock<Arc<dyn Replicator>>>;

/// A record as it travels between nodes.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct WireRecord {
    timestamp_ms: Option<i64>,
    key: Option<Bytes>,
    subject: Option<String>,
    /// A value may be null from format 2 on; formats 0 and 1 carried values only.
    #[serde(deserialize_with = "headers_of_the_format")]
    headers: Vec<(String, Option<Bytes>)>,
    value: Option<Bytes>,
}

thread_local! {
    /// The format [`decode`] is decoding on this thread: what a record's headers look like.
    static DECODING_FORMAT: std::cell::Cell<u8> = const { std::cell::Cell::new(WIRE_FORMAT) };
}

fn headers_of_the_format<'de, D: serde::Deserializer<'de>>(
    decoder: D,
) -> Result<Vec<(String, Option<Bytes>)>, D::Error> {
    if DECODING_FORMAT.get() >= 2 {
        Vec::<(String, Option<Bytes>)>::deserialize(decoder)
    } else {
        let headers = Vec::<(String, Bytes)>::deserialize(decoder)?;
        Ok(headers.into_iter().map(|(name, value)| (name, Some(value))).collect())
    }
}

impl From<&NewRecord> for WireRecord {
    fn from(record: &NewRecord) -> Self {
        WireRecord {
            timestamp_ms: record.timestamp_ms,
            key: record.key.clone(),
            subject: record.subject.as_ref().map(|subject| subject.as_str().to_string()),
            headers: record.headers.iter().map(|(name, value)| (name.as_str().to_string(), value.clone())).collect(),
            value: record.value.clone(),
        }
    }
}

impl From<WireRecord> for NewRecord {
    fn from(record: WireRecord) -> Self {
        NewRecord {
            timestamp_ms: record.timestamp_ms,
            key: record.key,
            subject: record.subject.map(Text::from),
            headers: record.headers.into_iter().map(|(name, value)| (Text::from(name), value)).collect(),
            value: record.value,
        }
    }
}

/// A stream definition as it travels between nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct WireStreamDef {
    name: String,
    partitions: u32,
    retention_ms: Option<u64>,
    retention_bytes: Option<u64>,
    fsync: bool,
    mqtt_topic: Option<String>,
    compacted: bool,
}

impl From<&StreamDef> for WireStreamDef {
    fn from(def: &StreamDef) -> Self {
        WireStreamDef {
            name: def.name.clone(),
            partitions: def.partitions,
            retention_ms: def.retention_ms,
            retention_bytes: def.retention_bytes,
            fsync: def.durability == Durability::Fsync,
            mqtt_topic: def.mqtt_topic.clone(),
            compacted: def.compacted,
        }
    }
}

impl From<WireStreamDef> for StreamDef {
    fn from(def: WireStreamDef) -> Self {
        StreamDef {
            name: def.name,
            partitions: def.partitions,
            retention_ms: def.retention_ms,
            retention_bytes: def.retention_bytes,
            durability: if def.fsync { Durability::Fsync } else { Durability::Async },
            mqtt_topic: def.mqtt_topic,
            compacted: def.compacted,
        }
    }
}

/// What a node asks the leader for.
#[derive(Serialize, Deserialize)]
enum Request {
    /// Records for `stream`, to `partition` or by the partitioning rule; the stream is created
    /// with the default definition when missing and auto-create is on.
    Publish {
        stream: String,
        partition: Option<u32>,
        records: Vec<WireRecord>,
    },
    CreateStream(WireStreamDef),
    /// A write to one row, decided by the leader against the newest row.
    TableWrite {
        table: String,
        id: String,
        write: WireWrite,
        precondition: Precondition,
    },
    /// A table's definition, as the catalog stores it (JSON).
    CreateTable(Bytes),
    DropTable(String),
    CreateIndex {
        table: String,
        name: Option<String>,
        field: String,
    },
    DropIndex(String),
    /// A change to users, roles, grants or tokens (JSON of an [`AccessChange`]).
    Access(String),
    /// A view's definition, as the catalog stores it (JSON).
    CreateView(String),
    DropView(String),
    AlterStream {
        name: String,
        change: StreamChange,
    },
    DropStream(String),
    /// Records for one of a front end's system topics that every node keeps alike (Kafka's
    /// committed offsets): appended at its end on every node.
    SystemAppend {
        topic: String,
        records: Vec<WireRecord>,
    },
    /// A transform (its definition, as the catalog stores it, JSON) and the stream it writes.
    CreateTransform {
        def: String,
        output: WireStreamDef,
    },
    /// A batch of a transform's output, from the leader's run of it: the records for each
    /// output partition, made from the source records between positions `from` and `to`.
    TransformWrite {
        transform: String,
        from: Vec<u64>,
        to: Vec<u64>,
        groups: Vec<(u32, Vec<WireRecord>)>,
    },
    /// `request` (encoded, and not itself fenced), to be prepared only by the leader of
    /// `term`: what its requester decided in that term (from state it read back for it) is
    /// refused in any other, so a node that led before cannot act on what it knew then once
    /// another leader took over. Kept encoded so the type does not nest: a decoder that
    /// recursed through bytes from another node could be driven to overflow its stack.
    Fenced {
        term: u64,
        request: Bytes,
    },
}

/// A change to a stream's definition.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) enum StreamChange {
    Retention {
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    },
    /// Grow to this many partitions.
    Partitions(u32),
}

/// A row write as it travels: rows and patches as JSON text.
#[derive(Serialize, Deserialize)]
enum WireWrite {
    Put(String),
    Patch(String),
    Delete,
}

impl From<&Write> for WireWrite {
    fn from(write: &Write) -> Self {
        let json = |row: &Map<String, Value>| serde_json::to_string(row).expect("JSON serializes");
        match write {
            Write::Put(row) => WireWrite::Put(json(row)),
            Write::Patch(patch) => WireWrite::Patch(json(patch)),
            Write::Delete => WireWrite::Delete,
        }
    }
}

impl TryFrom<WireWrite> for Write {
    type Error = EngineError;
    fn try_from(write: WireWrite) -> Result<Self, Self::Error> {
        let object = |json: &str| {
            serde_json::from_str::<Map<String, Value>>(json)
                .map_err(|error| EngineError::InvalidRow(format!("a row that is not a JSON object: {error}")))
        };
        Ok(match write {
            WireWrite::Put(json) => Write::Put(object(&json)?),
            WireWrite::Patch(json) => Write::Patch(object(&json)?),
            WireWrite::Delete => Write::Delete,
        })
    }
}

/// Records for one partition, at the offsets the leader predicted.
#[derive(Serialize, Deserialize)]
struct Append {
    partition: u32,
    base_offset: u64,
    records: Vec<WireRecord>,
}

/// What the leader commits.
#[derive(Serialize, Deserialize)]
enum Command {
    Publish {
        stream: String,
        /// The stream did not exist when the leader prepared this: created first.
        create: Option<WireStreamDef>,
        appends: Vec<Append>,
        /// For each record of the request, in order: its append and its place in it.
        order: Vec<(u32, u32)>,
    },
    CreateStream(WireStreamDef),
    /// The change of one row, at the offset the leader predicted in the table's partition.
    TableWrite {
        table: String,
        offset: u64,
        record: WireRecord,
        /// Whether the row did not exist before.
        created: bool,
    },
    CreateTable(Bytes),
    DropTable(String),
    CreateIndex {
        table: String,
        name: Option<String>,
        field: String,
    },
    DropIndex(String),
    /// A change to users, roles, grants or tokens (JSON of an [`AccessChange`]), made against
    /// the definitions every node holds at this point of the log.
    Access(String),
    /// A view to run on every node, over that node's copy of its source.
    CreateView(String),
    DropView(String),
    AlterStream {
        name: String,
        change: StreamChange,
    },
    DropStream(String),
    /// Records appended to a system topic every node keeps alike (see [`Engine::append_system`]).
    /// Applied again after a restart, they are appended again: such a topic is read by key,
    /// the newest record winning, and a repeat in log order changes no key's newest record.
    SystemAppend {
        topic: String,
        records: Vec<WireRecord>,
    },
    /// A transform and its output stream, created together; where it starts in its source is
    /// taken where it applies (the same on every node).
    CreateTransform {
        def: String,
        output: WireStreamDef,
    },
    /// A transform's output batch at the offsets the leader predicted; the transform is at
    /// source positions `to` once it is appended.
    TransformWrite {
        transform: String,
        to: Vec<u64>,
        appends: Vec<Append>,
    },
}

/// A refusal as it travels back: the engine error the requester's node gives its client.
#[derive(Serialize, Deserialize)]
enum Refusal {
    InvalidName {
        name: String,
        reason: String,
    },
    UnknownStream {
        name: String,
        auto_create: bool,
    },
    StreamExists {
        name: String,
        existing: String,
    },
    UnknownPartition {
        stream: String,
        partition: u32,
        count: u32,
    },
    InvalidDefinition(String),
    NameTaken {
        name: String,
        kind: String,
    },
    RecordTooLarge {
        size: usize,
        max: usize,
    },
    BatchTooLarge {
        size: usize,
        max: usize,
    },
    SubjectTooLong(usize),
    TooManyHeaders,
    EmptyBatch,
    Other(String),
    UnknownTable(String),
    TableExists {
        name: String,
        existing: String,
    },
    UnknownIndex(String),
    InvalidRow(String),
    RowNotFound {
        table: String,
        id: String,
    },
    PreconditionFailed {
        table: String,
        id: String,
        reason: String,
        current: Option<u64>,
    },
    InUse {
        name: String,
        reader: String,
        drop: String,
    },
    /// Try again shortly: what the request needs is changing (a table's drop is in flight).
    Busy(String),
    UnknownView(String),
    ViewExists(String),
}

impl From<&EngineError> for Refusal {
    fn from(error: &EngineError) -> Self {
        match error {
            EngineError::InvalidName { name, reason } => {
                Refusal::InvalidName { name: name.clone(), reason: reason.clone() }
            }
            EngineError::UnknownStream { name, auto_create } => {
                Refusal::UnknownStream { name: name.clone(), auto_create: *auto_create }
            }
            EngineError::StreamExists { name, existing } => {
                Refusal::StreamExists { name: name.clone(), existing: existing.clone() }
            }
            EngineError::UnknownPartition { stream, partition, count } => {
                Refusal::UnknownPartition { stream: stream.clone(), partition: *partition, count: *count }
            }
            EngineError::InvalidDefinition(reason) => Refusal::InvalidDefinition(reason.clone()),
            EngineError::NameTaken { name, kind } => Refusal::NameTaken { name: name.clone(), kind: kind.to_string() },
            EngineError::Append(AppendError::RecordTooLarge { size, max }) => {
                Refusal::RecordTooLarge { size: *size, max: *max }
            }
            EngineError::Append(AppendError::BatchTooLarge { size, max }) => {
                Refusal::BatchTooLarge { size: *size, max: *max }
            }
            EngineError::Append(AppendError::SubjectTooLong(len)) => Refusal::SubjectTooLong(*len),
            EngineError::Append(AppendError::TooManyHeaders) => Refusal::TooManyHeaders,
            EngineError::Append(AppendError::EmptyBatch) => Refusal::EmptyBatch,
            EngineError::Append(AppendError::Unconfirmed(reason)) => Refusal::Busy(reason.clone()),
            EngineError::UnknownTable(name) => Refusal::UnknownTable(name.clone()),
            EngineError::TableExists { name, existing } => {
                Refusal::TableExists { name: name.clone(), existing: existing.clone() }
            }
            EngineError::UnknownIndex(name) => Refusal::UnknownIndex(name.clone()),
            EngineError::InvalidRow(reason) => Refusal::InvalidRow(reason.clone()),
            EngineError::RowNotFound { table, id } => Refusal::RowNotFound { table: table.clone(), id: id.clone() },
            EngineError::PreconditionFailed { table, id, reason, current } => Refusal::PreconditionFailed {
                table: table.clone(),
                id: id.clone(),
                reason: reason.clone(),
                current: *current,
            },
            EngineError::InUse { name, reader, drop } => {
                Refusal::InUse { name: name.clone(), reader: reader.clone(), drop: drop.clone() }
            }
            EngineError::UnknownView(name) => Refusal::UnknownView(name.clone()),
            EngineError::ViewExists { name } => Refusal::ViewExists(name.clone()),
            other => Refusal::Other(other.to_string()),
        }
    }
}

impl From<Refusal> for EngineError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::InvalidName { name, reason } => EngineError::InvalidName { name, reason },
            Refusal::UnknownStream { name, auto_create } => EngineError::UnknownStream { name, auto_create },
            Refusal::StreamExists { name, existing } => EngineError::StreamExists { name, existing },
            Refusal::UnknownPartition { stream, partition, count } => {
                EngineError::UnknownPartition { stream, partition, count }
            }
            Refusal::InvalidDefinition(reason) => EngineError::InvalidDefinition(reason),
            Refusal::NameTaken { name, kind } => EngineError::NameTaken {
                name,
                kind: match kind.as_str() {
                    "table" => "table",
                    "stream" => "stream",
                    _ => "view",
                },
            },
            Refusal::RecordTooLarge { size, max } => AppendError::RecordTooLarge { size, max }.into(),
            Refusal::BatchTooLarge { size, max } => AppendError::BatchTooLarge { size, max }.into(),
            Refusal::SubjectTooLong(len) => AppendError::SubjectTooLong(len).into(),
            Refusal::TooManyHeaders => AppendError::TooManyHeaders.into(),
            Refusal::EmptyBatch => AppendError::EmptyBatch.into(),
            Refusal::Other(reason) => EngineError::Internal(format!("the cluster's leader refused: {reason}")),
            Refusal::UnknownTable(name) => EngineError::UnknownTable(name),
            Refusal::TableExists { name, existing } => EngineError::TableExists { name, existing },
            Refusal::UnknownIndex(name) => EngineError::UnknownIndex(name),
            Refusal::InvalidRow(reason) => EngineError::InvalidRow(reason),
            Refusal::RowNotFound { table, id } => EngineError::RowNotFound { table, id },
            Refusal::PreconditionFailed { table, id, reason, current } => {
                EngineError::PreconditionFailed { table, id, reason, current }
            }
            Refusal::InUse { name, reader, drop } => EngineError::InUse { name, reader, drop },
            Refusal::Busy(reason) => AppendError::Unconfirmed(reason).into(),
            Refusal::UnknownView(name) => EngineError::UnknownView(name),
            Refusal::ViewExists(name) => EngineError::ViewExists { name },
        }
    }
}

/// What applying a command gave.
#[derive(Serialize, Deserialize)]
enum Outcome {
    Published(Vec<(u32, u64)>),
    Created,
    Refused(Refusal),
    Written {
        offset: u64,
        created: bool,
    },
    Dropped,
    Indexed {
        name: String,
        field: String,
        created: bool,
    },
    /// An index dropped from the named table.
    IndexDropped(String),
    /// An access change made, at log index `index`.
    Access {
        answer: AccessAnswer,
        index: u64,
    },
    /// Records appended to a system topic.
    Appended,
    /// Records appended to a system topic by the command at log index `index`.
    SystemAppended {
        index: u64,
    },
    /// A keyed write the leader found written before: its places, nothing written again.
    Replayed(Vec<(u32, u64)>),
}

/// The format of every request, command and answer replication encodes, its first byte
/// (docs/cluster.md, "Formats"): the rest is postcard. A release that changes an encoding
/// writes a new format and still reads the earlier ones, which the Raft log keeps. Format 2: a
/// record header's value may be null (format 1 carried values only).
const WIRE_FORMAT: u8 = 2;
/// The first byte of a command read from a Raft log segment written before commands carried a
/// format (the cluster's `UNNUMBERED_BODY`): encoded as format 1 is.
const UNNUMBERED_FORMAT: u8 = 0;

fn encode<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(postcard::to_extend(value, vec![WIRE_FORMAT]).expect("replicated messages always encode"))
}

/// Decodes what [`encode`] made (`what` names it in the error).
fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8], what: &str) -> Result<T, String> {
    match bytes.split_first() {
        Some((&format, rest)) if format <= WIRE_FORMAT => {
            // Format 0 is format 1 without its byte.
            let previous = DECODING_FORMAT.replace(if format == UNNUMBERED_FORMAT { 1 } else { format });
            let decoded = postcard::from_bytes(rest).map_err(|error| format!("{what} that does not decode: {error}"));
            DECODING_FORMAT.set(previous);
            decoded
        }
        Some((format, _)) => Err(format!(
            "{what} in format {format}, from a newer onehop (this one reads formats up to {WIRE_FORMAT}): every node of \
             a cluster runs one release"
        )),
        None => Err(format!("{what} with no bytes")),
    }
}

fn refused(error: &EngineError) -> Bytes {
    encode(&Outcome::Refused(Refusal::from(error)))
}

/// What the leader decided in this term beyond what it applied: the offsets it handed out per
/// stream partition, and the streams it prepared the creation of. A command it prepares must
/// apply on every node as prepared (a refusal at apply would leave later predictions void), so
/// it is checked against both.
#[derive(Default)]
pub(crate) struct Predictions {
    next: HashMap<(String, u32), u64>,
    creating: HashMap<String, StreamDef>,
    tables: HashMap<String, TablePrediction>,
    /// The views whose creation is prepared: their names are taken.
    views: std::collections::HashSet<String>,
    /// The streams whose drop is prepared: nothing is prepared for their names until that
    /// drop is applied here (offsets after it start again from 0).
    dropping: std::collections::HashSet<String>,
    /// Each transform's source positions after the last batch of it prepared in this term.
    transforms: HashMap<String, Vec<u64>>,
    /// The keyed (idempotent) writes prepared in this term and not applied here yet: a retry
    /// of one meanwhile is told it is on its way.
    idempotent: std::collections::HashSet<WriteKey>,
    /// The term this node leads and prepares in (see [`Request::Fenced`]).
    term: Option<u64>,
}

/// What the leader prepared for one table in this term beyond what it applied.
struct TablePrediction {
    /// The table as prepared; `None` once its drop is prepared.
    def: Option<Arc<TableDef>>,
    /// The offset its next change takes; `None`: the end of its partition here.
    next: Option<u64>,
    /// The rows written in this term: each one's newest document (`None`: deleted) and the
    /// offset of that change. A row whose change this node applied is pruned from time to
    /// time, the applied row being as new.
    rows: HashMap<String, PredictedRow>,
    /// `rows` is pruned when it grows past this.
    prune_at: usize,
}

/// A row as the leader predicts it: its newest document (`None`: deleted) and that change's
/// offset.
type PredictedRow = (Option<Arc<Map<String, Value>>>, u64);

/// Rows a table's prediction holds before it is first pruned.
const PREDICTED_ROWS_PRUNED_AT: usize = 4096;

impl TablePrediction {
    fn new(def: Option<Arc<TableDef>>) -> Self {
        TablePrediction { def, next: None, rows: HashMap::new(), prune_at: PREDICTED_ROWS_PRUNED_AT }
    }
}

impl Predictions {
    /// The appends of `groups` (records for each partition of the stream `name`) at the
    /// offsets predicted for them: after what was prepared for that partition in this term,
    /// else at its end here (`existing`). With each partition's place among the appends.
    fn appends(
        &mut self,
        name: &str,
        existing: Option<&Arc<Stream>>,
        groups: BTreeMap<u32, Vec<NewRecord>>,
    ) -> (Vec<Append>, BTreeMap<u32, u32>) {
        let mut appends = Vec::with_capacity(groups.len());
        let mut index_of = BTreeMap::new();
        for (partition, group) in groups {
            let next = self
                .next
                .entry((name.to_string(), partition))
                .or_insert_with(|| existing.and_then(|stream| stream.end_offset(partition).ok()).unwrap_or(0));
            let base_offset = *next;
            *next += group.len() as u64;
            index_of.insert(partition, appends.len() as u32);
            appends.push(Append { partition, base_offset, records: group.iter().map(WireRecord::from).collect() });
        }
        (appends, index_of)
    }

    /// Refuses, for now, anything for the stream `name` while its drop is prepared and not yet
    /// applied here (`exists`: this node still has it); forgets a drop that was applied.
    fn check_not_dropping(&mut self, name: &str, exists: bool) -> Result<(), EngineError> {
        if !self.dropping.contains(name) {
            return Ok(());
        }
        if exists {
            return Err(AppendError::Unconfirmed(format!(
                "stream {name:?} is being dropped: try again once that is done"
            ))
            .into());
        }
        self.dropping.remove(name);
        Ok(())
    }

    /// The table `name` as the leader predicts it: its definition, or why it has none.
    /// `applied` is this node's table of that name. A prepared drop that this node applied is
    /// forgotten here.
    fn table(&mut self, name: &str, applied: Option<&Arc<Table>>) -> Result<Arc<TableDef>, EngineError> {
        match (self.tables.get(name).map(|prediction| prediction.def.clone()), applied) {
            (Some(Some(def)), _) => Ok(def),
            (Some(None), Some(_)) => Err(EngineError::UnknownTable(name.to_string())),
            (Some(None), None) => {
                self.tables.remove(name);
                Err(EngineError::UnknownTable(name.to_string()))
            }
            (None, Some(table)) => Ok(table.def()),
            (None, None) => Err(EngineError::UnknownTable(name.to_string())),
        }
    }

    /// Refuses a new stream named as a table or view whose creation is prepared.
    fn check_stream_name(&self, name: &str) -> Result<(), EngineError> {
        if self.tables.get(name).is_some_and(|prediction| prediction.def.is_some()) {
            return Err(EngineError::NameTaken { name: name.to_string(), kind: "table" });
        }
        if self.views.contains(name) {
            return Err(EngineError::NameTaken { name: name.to_string(), kind: "view" });
        }
        Ok(())
    }
}

impl Engine {
    /// Makes this engine a cluster node's: from now on stream writes and creations go to
    /// `replicator`, and each transform runs wherever this node leads ([`Engine::set_leading`]).
    /// The engine must have been opened with [`EngineOptions::cluster_node`], so that no
    /// transform ran here on its own before.
    pub fn set_replicator(&self, replicator: Arc<dyn Replicator>) -> Result<(), EngineError> {
        if !self.options.cluster_node {
            return Err(EngineError::Internal("a cluster node's engine is opened with cluster_node set".into()));
        }
        self.replicator
            .set(replicator.clone())
            .map_err(|_| EngineError::Internal("the engine already has a replicator".into()))?;
        for transform in self.transforms() {
            transform.start_replicated(self.hub.clone(), self.checkpointing(), replicator.clone(), self.leading());
        }
        Ok(())
    }

    /// Tells the engine whether this node leads the cluster, in which term, once it applied
    /// every command of earlier terms: the leader runs the transforms.
    pub fn set_leading(&self, term: Option<u64>) {
        self.leading.send_if_modified(|leading| std::mem::replace(leading, term) != term);
    }

    /// Whether this node leads, as [`Engine::set_leading`] last said.
    pub(crate) fn leading(&self) -> tokio::sync::watch::Receiver<Option<u64>> {
        self.leading.subscribe()
    }

    /// Whether this engine is a cluster node's.
    pub fn is_replicated(&self) -> bool {
        self.replicator.get().is_some()
    }

    /// Creates the stream `def` through the cluster and waits until this node has it.
    pub(crate) async fn create_stream_replicated(&self, def: StreamDef) -> Result<Arc<Stream>, EngineError> {
        def.validate()?;
        let name = def.name.clone();
        let mut changed = self.watch_streams();
        let request = encode(&Request::CreateStream(WireStreamDef::from(&def)));
        if let Outcome::Refused(refusal) = submit(&self.replicator, request).await? {
            return Err(refusal.into());
        }
        // The leader applied it; this node applies it when the commit reaches it.
        self.await_stream(&name, &mut changed).await
    }

    /// Waits until this node has the stream `name`, which the cluster created (it applies the
    /// creation when the commit reaches it). `changed` is a [`Engine::watch_streams`] taken
    /// before the creation was asked for.
    pub(crate) async fn await_stream(
        &self,
        name: &str,
        changed: &mut tokio::sync::watch::Receiver<u64>,
    ) -> Result<Arc<Stream>, EngineError> {
        let deadline = tokio::time::Instant::now() + DDL_WAIT;
        loop {
            if let Ok(stream) = self.stream(name) {
                return Ok(stream);
            }
            if tokio::time::timeout_at(deadline, changed.changed()).await.is_err() {
                return Err(AppendError::Unconfirmed(format!(
                    "stream {name:?} was created by the cluster but has not reached this node in {} s",
                    DDL_WAIT.as_secs()
                ))
                .into());
            }
        }
    }

    /// On the cluster's leader, in submission order: turns a request into the command every
    /// node applies, or refuses it (`Err`: the encoded refusal; nothing is written).
    pub fn prepare_replicated(&self, request: &[u8]) -> Result<Bytes, Bytes> {
        let request: Request =
            decode(request, "a request").map_err(|reason| refused(&EngineError::Internal(reason)))?;
        let request = match request {
            Request::Fenced { term, request } => {
                let leading = self.predictions.lock().expect("predictions lock").term;
                if leading != Some(term) {
                    return Err(refused(&EngineError::from(AppendError::Unconfirmed(format!(
                        "decided by the leader of term {term}, which no longer leads; nothing was written"
                    )))));
                }
                decode(&request, "a fenced request").map_err(|reason| refused(&EngineError::Internal(reason)))?
            }
            request => request,
        };
        match request {
            Request::CreateStream(def) => {
                let stream_def = StreamDef::from(def.clone());
                stream_def.validate().map_err(|error| refused(&error))?;
                let mut predictions = self.predictions.lock().expect("predictions lock");
                let exists = self.stream(&stream_def.name).is_ok();
                predictions.check_not_dropping(&stream_def.name, exists).map_err(|error| refused(&error))?;
                match (self.stream(&stream_def.name), predictions.creating.get(&stream_def.name)) {
                    (Ok(existing), _) if existing.def() == &stream_def => {}
                    (Err(_), Some(pending)) if *pending == stream_def => {}
                    (Err(_), Some(pending)) => {
                        return Err(refused(&EngineError::StreamExists {
                            name: stream_def.name.clone(),
                            existing: pending.describe(),
                        }));
                    }
                    _ => {
                        self.check_new_stream(&stream_def).map_err(|error| refused(&error))?;
                        predictions.check_stream_name(&stream_def.name).map_err(|error| refused(&error))?;
                        check_pending_routes(&predictions, &stream_def).map_err(|error| refused(&error))?;
                        predictions.creating.insert(stream_def.name.clone(), stream_def);
                    }
                }
                Ok(encode(&Command::CreateStream(def)))
            }
            Request::Publish { stream, partition, records } => self.prepare_publish(stream, partition, records),
            Request::TableWrite { table, id, write, precondition } => {
                self.prepare_table_write(table, id, write, precondition).map_err(|error| refused(&error))
            }
            Request::CreateTable(json) => self.prepare_create_table(json).map_err(|error| refused(&error)),
            Request::DropTable(name) => {
                let mut predictions = self.predictions.lock().expect("predictions lock");
                predictions.table(&name, self.table(&name).ok().as_ref()).map_err(|error| refused(&error))?;
                self.check_unread(&name).map_err(|error| refused(&error))?;
                predictions.tables.insert(name.clone(), TablePrediction::new(None));
                Ok(encode(&Command::DropTable(name)))
            }
            Request::CreateIndex { table, name, field } => {
                validate_field_name(&field).map_err(|error| refused(&error))?;
                let mut predictions = self.predictions.lock().expect("predictions lock");
                predictions.table(&table, self.table(&table).ok().as_ref()).map_err(|error| refused(&error))?;
                Ok(encode(&Command::CreateIndex { table, name, field }))
            }
            // Whether it names an index is decided where it applies, alike on every node.
            Request::DropIndex(name) => Ok(encode(&Command::DropIndex(name))),
            // So is an access change: every node holds the same users, roles and grants there.
            Request::Access(change) => Ok(encode(&Command::Access(change))),
            Request::CreateView(json) => self.prepare_create_view(json).map_err(|error| refused(&error)),
            Request::AlterStream { name, change } => {
                let mut predictions = self.predictions.lock().expect("predictions lock");
                let exists = self.stream(&name).is_ok();
                predictions.check_not_dropping(&name, exists).map_err(|error| refused(&error))?;
                if !exists && !predictions.creating.contains_key(&name) {
                    return Err(refused(&EngineError::UnknownStream { name, auto_create: false }));
                }
                // Whether the change fits the stream is decided where it applies, alike on
                // every node; what the leader predicts does not depend on it.
                Ok(encode(&Command::AlterStream { name, change }))
            }
            Request::DropStream(name) => {
                let mut predictions = self.predictions.lock().expect("predictions lock");
                let exists = self.stream(&name).is_ok();
                predictions.check_not_dropping(&name, exists).map_err(|error| refused(&error))?;
                if !exists && !predictions.creating.contains_key(&name) {
                    return Err(refused(&EngineError::UnknownStream { name, auto_create: false }));
                }
                self.check_unread(&name).map_err(|error| refused(&error))?;
                predictions.next.retain(|(stream, _), _| *stream != name);
                predictions.creating.remove(&name);
                // A transform made again under this name starts where its creation says.
                predictions.transforms.remove(&name);
                predictions.dropping.insert(name.clone());
                Ok(encode(&Command::DropStream(name)))
            }
            Request::DropView(name) => {
                let predictions = self.predictions.lock().expect("predictions lock");
                if self.view(&name).is_err() && !predictions.views.contains(&name) {
                    return Err(refused(&EngineError::UnknownView(name)));
                }
                Ok(encode(&Command::DropView(name)))
            }
            Request::CreateTransform { def, output } => {
                self.prepare_create_transform(def, output).map_err(|error| refused(&error))
            }
            Request::TransformWrite { transform, from, to, groups } => {
                self.prepare_transform_write(transform, from, to, groups).map_err(|error| refused(&error))
            }
            Request::SystemAppend { topic, records } => {
                check_shared_system_topic(&topic).map_err(|error| refused(&error))?;
                if records.is_empty() {
                    return Err(refused(&AppendError::EmptyBatch.into()));
                }
                Ok(encode(&Command::SystemAppend { topic, records }))
            }
            Request::Fenced { .. } => Err(refused(&EngineError::Internal("a fenced request inside another".into()))),
        }
    }

    fn prepare_table_write(
        &self,
        name: String,
        id: String,
        write: WireWrite,
        precondition: Precondition,
    ) -> Result<Bytes, EngineError> {
        check_row_id(&id)?;
        let write = Write::try_from(write)?;
        let applied = self.table(&name).ok();
        let mut predictions = self.predictions.lock().expect("predictions lock");
        let def = predictions.table(&name, applied.as_ref())?;
        let prediction =
            predictions.tables.entry(name.clone()).or_insert_with(|| TablePrediction::new(Some(def.clone())));
        // The newest row: as written in this term, else as applied (every earlier term's
        // writes are applied here before this term's first prepare).
        let (current, version) = match prediction.rows.get(&id) {
            Some((Some(doc), offset)) => (Some(doc.clone()), Some(*offset)),
            Some((None, _)) => (None, None),
            None => match applied.as_ref().and_then(|table| table.get(&id)) {
                Some(row) => (Some(row.shared_doc()), Some(row.offset)),
                None => (None, None),
            },
        };
        let (mut record, after) = compute_write(&def, &id, write, precondition, current.as_ref(), version)?;
        record.timestamp_ms = Some(now_ms());
        check_records(&self.table_config(&def), std::slice::from_ref(&record))?;
        let offset = match prediction.next {
            Some(next) => next,
            None => applied.as_ref().map_or(0, |table| table.partition().end_offset()),
        };
        prediction.next = Some(offset + 1);
        prediction.rows.insert(id, (after.map(Arc::new), offset));
        if prediction.rows.len() > prediction.prune_at
            && let Some(table) = &applied
        {
            let done = table.applied_offset();
            prediction.rows.retain(|_, (_, offset)| *offset >= done);
            prediction.prune_at = (prediction.rows.len() * 2).max(PREDICTED_ROWS_PRUNED_AT);
        }
        Ok(encode(&Command::TableWrite {
            table: name,
            offset,
            record: WireRecord::from(&record),
            created: current.is_none(),
        }))
    }

    /// A view's creation. Its name is checked here against what is prepared too: a table or
    /// stream prepared under that name would otherwise be refused where it applies, voiding
    /// the offsets predicted after it. Whether its source exists is decided where it applies.
    fn prepare_create_view(&self, json: String) -> Result<Bytes, EngineError> {
        let def: ViewDef = serde_json::from_str(&json)
            .map_err(|error| EngineError::InvalidDefinition(format!("a view definition: {error}")))?;
        catalog::validate_name(&def.name)?;
        let mut predictions = self.predictions.lock().expect("predictions lock");
        let name = def.name.clone();
        if self.stream(&name).is_ok() || predictions.creating.contains_key(&name) {
            return Err(EngineError::NameTaken { name, kind: "stream" });
        }
        let applied_table = self.table(&name).ok();
        if applied_table.is_some() || predictions.table(&name, applied_table.as_ref()).is_ok() {
            return Err(EngineError::NameTaken { name, kind: "table" });
        }
        predictions.views.insert(name);
        Ok(encode(&Command::CreateView(json)))
    }

    fn prepare_create_table(&self, json: Bytes) -> Result<Bytes, EngineError> {
        let def = catalog::parse_table_json(&json).map_err(EngineError::InvalidDefinition)?;
        let applied = self.table(&def.name).ok();
        let mut predictions = self.predictions.lock().expect("predictions lock");
        match predictions.table(&def.name, applied.as_ref()) {
            Ok(existing) if existing.without_indexes() == def.without_indexes() => {}
            Ok(existing) => {
                return Err(EngineError::TableExists { name: def.name.clone(), existing: existing.describe() });
            }
            Err(_) if applied.is_some() => {
                return Err(EngineError::Append(AppendError::Unconfirmed(format!(
                    "table {:?} is being dropped: create it again once that is done",
                    def.name
                ))));
            }
            Err(_) => {
                self.check_new_table(&def)?;
                if predictions.creating.contains_key(&def.name) {
                    return Err(EngineError::NameTaken { name: def.name.clone(), kind: "stream" });
                }
                if predictions.views.contains(&def.name) {
                    return Err(EngineError::NameTaken { name: def.name.clone(), kind: "view" });
                }
                predictions.tables.insert(def.name.clone(), TablePrediction::new(Some(Arc::new(def))));
            }
        }
        Ok(encode(&Command::CreateTable(json)))
    }

    fn prepare_publish(&self, name: String, partition: Option<u32>, records: Vec<WireRecord>) -> Result<Bytes, Bytes> {
        let fail = |error: EngineError| refused(&error);
        let existing = self.stream(&name).ok();
        self.predictions
            .lock()
            .expect("predictions lock")
            .check_not_dropping(&name, existing.is_some())
            .map_err(fail)?;
        let pending = self.predictions.lock().expect("predictions lock").creating.get(&name).cloned();
        let (def, create) = match (&existing, pending) {
            (Some(stream), _) => (stream.def().clone(), None),
            // Its creation is prepared, not yet applied here: created as prepared (again, alike).
            (None, Some(def)) => {
                let wire = WireStreamDef::from(&def);
                (def, Some(wire))
            }
            (None, None) if self.options.auto_create => {
                catalog::validate_name(&name).map_err(fail)?;
                let def = self.default_stream_def(&name);
                self.check_new_stream(&def).map_err(fail)?;
                let wire = WireStreamDef::from(&def);
                let mut predictions = self.predictions.lock().expect("predictions lock");
                predictions.check_stream_name(&name).map_err(fail)?;
                predictions.creating.insert(name.clone(), def.clone());
                (def, Some(wire))
            }
            (None, None) => return Err(fail(EngineError::UnknownStream { name, auto_create: false })),
        };
        if records.is_empty() {
            return Err(fail(AppendError::EmptyBatch.into()));
        }
        let now = now_ms();
        let mut records: Vec<NewRecord> = records.into_iter().map(NewRecord::from).collect();
        for record in &mut records {
            record.timestamp_ms.get_or_insert(now);
        }
        // A keyed write: answered with the first one's places if it was written, refused if its
        // key named another write or its first write is on its way (see `crate::idempotency`).
        let keyed = records.first().and_then(Tag::of_new).map(|tag| {
            let key = WriteKey { stream: name.clone(), scope: tag.scope.clone(), key: tag.key.clone() };
            (tag, key)
        });
        if let Some((tag, key)) = &keyed {
            if let Some(places) = self.idempotency().check_prepared(&name, tag).map_err(fail)? {
                let places = places.into_iter().map(|place| (place.partition, place.offset)).collect();
                return Err(encode(&Outcome::Replayed(places)));
            }
            if self.predictions.lock().expect("predictions lock").idempotent.contains(key) {
                return Err(fail(EngineError::IdempotencyInProgress { key: key.key.clone() }));
            }
        }
        // The partitioning rule, as a single node applies it (`Stream::publish`).
        let targets: Vec<u32> = match partition {
            Some(index) if index >= def.partitions => {
                return Err(fail(EngineError::UnknownPartition {
                    stream: name,
                    partition: index,
                    count: def.partitions,
                }));
            }
            Some(index) => vec![index; records.len()],
            None => {
                let keyless = match (&existing, records.iter().any(|record| record.key.is_none())) {
                    (Some(stream), true) => stream.next_keyless_partition(),
                    _ => 0,
                };
                records
                    .iter()
                    .map(|record| match &record.key {
                        Some(key) => crc32c::crc32c(key) % def.partitions,
                        None => keyless,
                    })
                    .collect()
            }
        };
        let mut groups: BTreeMap<u32, Vec<NewRecord>> = BTreeMap::new();
        let mut order = Vec::with_capacity(records.len());
        for (record, partition) in records.into_iter().zip(&targets) {
            let group = groups.entry(*partition).or_default();
            order.push((*partition, group.len() as u32));
            group.push(record);
        }
        let config = self.partition_config(&def);
        for group in groups.values() {
            check_records(&config, group).map_err(|error| fail(error.into()))?;
        }
        let mut predictions = self.predictions.lock().expect("predictions lock");
        let (appends, index_of) = predictions.appends(&name, existing.as_ref(), groups);
        let order = order.into_iter().map(|(partition, place)| (index_of[&partition], place)).collect();
        if let Some((_, key)) = keyed {
            predictions.idempotent.insert(key);
        }
        Ok(encode(&Command::Publish { stream: name, create, appends, order }))
    }

    /// A transform's creation, with its output stream's. The names are checked here against
    /// what is prepared too, as a stream's creation is; the output's offsets are predicted
    /// from 0 from here on. Where the transform starts is decided where it applies.
    fn prepare_create_transform(&self, json: String, output: WireStreamDef) -> Result<Bytes, EngineError> {
        let def: TransformDef = serde_json::from_str(&json)
            .map_err(|error| EngineError::InvalidDefinition(format!("a transform definition: {error}")))?;
        let stream_def = StreamDef::from(output.clone());
        stream_def.validate()?;
        let name = def.name.clone();
        if stream_def.name != name {
            return Err(EngineError::InvalidDefinition(format!(
                "the transform {name:?} must write the stream of its name, not {:?}",
                stream_def.name
            )));
        }
        let mut predictions = self.predictions.lock().expect("predictions lock");
        if let Some(existing) = self.transform(&name) {
            // Applied as "already there" where it is the same; refused otherwise.
            if existing.def() == &def && existing.output().def() == &stream_def {
                return Ok(encode(&Command::CreateTransform { def: json, output }));
            }
            return Err(EngineError::StreamExists { name, existing: format!("computed by {}", existing.def().sql) });
        }
        let exists = self.stream(&name).is_ok();
        predictions.check_not_dropping(&name, exists)?;
        if let Some(pending) = predictions.creating.get(&name) {
            return Err(EngineError::StreamExists { name, existing: pending.describe() });
        }
        self.check_new_stream(&stream_def)?;
        predictions.check_stream_name(&name)?;
        check_pending_routes(&predictions, &stream_def)?;
        def.check().map_err(EngineError::InvalidDefinition)?;
        // Its sources: streams, applied or about to be (refused alike where it applies if not).
        for source in def.sources() {
            predictions.check_not_dropping(source, self.stream(source).is_ok())?;
            if self.table(source).is_ok() || predictions.tables.get(source).is_some_and(|t| t.def.is_some()) {
                return Err(EngineError::InvalidDefinition(format!(
                    "{source:?} is a table: a transform reads a stream (aggregate a table with CREATE VIEW)"
                )));
            }
            if self.stream(source).is_err() && !predictions.creating.contains_key(source) {
                return Err(EngineError::UnknownStream { name: source.to_string(), auto_create: false });
            }
        }
        // The tables it looks rows up in.
        for table in def.tables() {
            predictions.check_not_dropping(table, self.table(table).is_ok())?;
            let pending = predictions.tables.get(table).is_some_and(|pending| pending.def.is_some());
            if self.table(table).is_err() && !pending {
                return Err(EngineError::UnknownTable(table.to_string()));
            }
        }
        predictions.creating.insert(name, stream_def);
        Ok(encode(&Command::CreateTransform { def: json, output }))
    }

    /// A batch of a transform's output, from the run of it on this node (the leader): prepared
    /// only if `from` is where the transform is, as applied here or as prepared in this term,
    /// so that no stretch of the source is written twice (by a former leader's run, say).
    fn prepare_transform_write(
        &self,
        name: String,
        from: Vec<u64>,
        to: Vec<u64>,
        groups: Vec<(u32, Vec<WireRecord>)>,
    ) -> Result<Bytes, EngineError> {
        let Some(transform) = self.transform(&name) else {
            return Err(EngineError::UnknownStream { name, auto_create: false });
        };
        let output = transform.output().clone();
        let mut predictions = self.predictions.lock().expect("predictions lock");
        predictions.check_not_dropping(&name, true)?;
        let at = predictions.transforms.get(&name).cloned().unwrap_or_else(|| transform.applied().positions);
        if from != at {
            return Err(EngineError::Append(AppendError::Unconfirmed(format!(
                "transform {name:?} is at {at:?} in its source, not at {from:?}: another run of it wrote since"
            ))));
        }
        let config = self.partition_config(output.def());
        let mut batches: BTreeMap<u32, Vec<NewRecord>> = BTreeMap::new();
        for (partition, records) in groups {
            if partition >= output.partition_count() {
                return Err(EngineError::UnknownPartition { stream: name, partition, count: output.partition_count() });
            }
            let records: Vec<NewRecord> = records.into_iter().map(NewRecord::from).collect();
            if records.is_empty() {
                continue;
            }
            check_records(&config, &records)?;
            batches.entry(partition).or_default().extend(records);
        }
        let (appends, _) = predictions.appends(&name, Some(&output), batches);
        predictions.transforms.insert(name.clone(), to.clone());
        Ok(encode(&Command::TransformWrite { transform: name, to, appends }))
    }

    /// Whether a committed command changes definitions (everything but a stream publish and a
    /// row write): the cluster makes the progress before it durable first, so a restart never
    /// applies a write again over a state where a later drop removed what it wrote to. Only
    /// the command's variant is read.
    pub fn is_replicated_barrier(command: &[u8]) -> bool {
        // After the format byte, postcard writes an enum's variant index first, as a varint.
        !matches!(command.get(1..).map(postcard::take_from_bytes::<u32>), Some(Ok((0 | 2 | 12 | 14, _))))
    }

    /// On a node that became the cluster's leader, once it applied every earlier command: the
    /// offsets predicted in an earlier term are void.
    pub fn begin_replicated_term(&self, term: u64) {
        let mut predictions = self.predictions.lock().expect("predictions lock");
        predictions.term = Some(term);
        predictions.next.clear();
        predictions.creating.clear();
        predictions.tables.clear();
        predictions.views.clear();
        predictions.dropping.clear();
        predictions.transforms.clear();
        predictions.idempotent.clear();
    }

    /// Hard-links the files of every open topic that `shared` accepts into `into`, one
    /// directory per topic and partition as in the log's own directory, and returns each
    /// file's path under `into` (`topic/partition/file`) with the bytes of it that belong to
    /// the copy ([`Partition::link_files`]). The cluster's snapshot of this node's replicated
    /// state, as of every command applied so far: it is called while no command is being
    /// applied, so partitions, catalog and view checkpoints agree with one another.
    pub fn link_replicated_files(
        &self,
        into: &std::path::Path,
        shared: impl Fn(&str) -> bool,
    ) -> Result<Vec<(String, u64)>, EngineError> {
        let mut files = Vec::new();
        for (topic, index, partition) in self.log.partitions() {
            if !shared(&topic) {
                continue;
            }
            let relative = format!("{topic}/{index}");
            let linked = partition
                .link_files(&into.join(&relative))
                .map_err(|error| EngineError::Internal(format!("linking {topic}/{index} for a snapshot: {error}")))?;
            files.extend(linked.into_iter().map(|(name, bytes)| (format!("{relative}/{name}"), bytes)));
        }
        Ok(files)
    }

    /// Applies a committed command (every node, in log order). `Err` is this node's own failure
    /// (storage, or a command that does not fit what it holds): the node must stop.
    /// `index` is the command's place in the cluster's log.
    pub async fn apply_replicated(&self, index: u64, command: &[u8]) -> Result<Bytes, String> {
        let command: Command = decode(command, "a command")?;
        match command {
            Command::CreateStream(def) => Ok(match self.create_stream_here(def.into()).await {
                Ok(_) => encode(&Outcome::Created),
                Err(error) if error.is_client_error() => refused(&error),
                Err(error) => return Err(error.to_string()),
            }),
            Command::Publish { stream, create, appends, order } => {
                if let Some(def) = create {
                    match self.create_stream_here(def.into()).await {
                        Ok(_) => {}
                        // Every node refuses alike (it was created meanwhile with another
                        // definition): nothing is appended.
                        Err(error) if error.is_client_error() => return Ok(refused(&error)),
                        Err(error) => return Err(error.to_string()),
                    }
                }
                let target = self.stream(&stream).map_err(|error| format!("applying to stream {stream:?}: {error}"))?;
                let partitions: Vec<u32> = appends.iter().map(|append| append.partition).collect();
                // A keyed write's records, to take into the idempotency keys once appended.
                let keyed: Vec<(u32, u64, NewRecord)> = appends
                    .iter()
                    .flat_map(|append| {
                        append.records.iter().enumerate().filter_map(|(i, record)| {
                            let record = NewRecord::from(record.clone());
                            Tag::of_new(&record).map(|_| (append.partition, append.base_offset + i as u64, record))
                        })
                    })
                    .collect();
                if !keyed.is_empty() {
                    self.idempotency().ensure_started(self).await.map_err(|error| error.to_string())?;
                }
                let held = (!keyed.is_empty()).then(|| self.idempotency().applying(&stream, target.end_offsets()));
                let bases = self.apply_appends(&target, appends).await;
                if let Some(lows) = held {
                    if bases.is_ok() {
                        for (partition, offset, record) in &keyed {
                            let at_ms = record.timestamp_ms.unwrap_or_default();
                            self.idempotency().fold(&stream, *partition, *offset, record, at_ms);
                        }
                    }
                    self.idempotency().applied(&stream, &lows);
                    if let Some(tag) = keyed.first().and_then(|(_, _, record)| Tag::of_new(record)) {
                        let key = WriteKey { stream: stream.clone(), scope: tag.scope, key: tag.key };
                        self.predictions.lock().expect("predictions lock").idempotent.remove(&key);
                    }
                }
                let bases = bases?;
                let published = order
                    .into_iter()
                    .map(|(append, place)| (partitions[append as usize], bases[append as usize] + place as u64))
                    .collect();
                Ok(encode(&Outcome::Published(published)))
            }
            Command::TableWrite { table, offset, record, created } => {
                self.apply_table_write(&table, offset, record).await?;
                Ok(encode(&Outcome::Written { offset, created }))
            }
            Command::CreateTable(json) => {
                let def = catalog::parse_table_json(&json).map_err(|reason| format!("a committed table: {reason}"))?;
                let outcome = self.create_table_here(def).await.map(|_| Outcome::Created);
                self.applied_ddl(index, outcome)
            }
            Command::DropTable(name) => {
                let outcome = match self.table(&name) {
                    Ok(_) => self.drop_table_here(&name).await.map(|()| Outcome::Dropped),
                    // Dropped before a restart.
                    Err(_) => Ok(Outcome::Dropped),
                };
                if outcome.is_err() {
                    // Refused alike on every node (a view reads the table): it stays, and the
                    // leader forgets the drop it prepared. It predicted no write to it since.
                    let mut predictions = self.predictions.lock().expect("predictions lock");
                    if predictions.tables.get(&name).is_some_and(|prediction| prediction.def.is_none()) {
                        predictions.tables.remove(&name);
                    }
                }
                self.applied_ddl(index, outcome)
            }
            Command::CreateIndex { table, name, field } => {
                let outcome = self
                    .create_index_here(&table, name.as_deref(), &field)
                    .await
                    .map(|(def, created)| Outcome::Indexed { name: def.name, field: def.field, created });
                self.applied_ddl(index, outcome)
            }
            Command::DropIndex(name) => {
                let outcome = self.drop_index_here(&name).await.map(Outcome::IndexDropped);
                self.applied_ddl(index, outcome)
            }
            Command::CreateView(json) => {
                let def: ViewDef =
                    serde_json::from_str(&json).map_err(|error| format!("a committed view definition: {error}"))?;
                let name = def.name.clone();
                let outcome = self.create_view_here(def).await.map(|_| Outcome::Created);
                if outcome.is_err() {
                    // Refused alike on every node: its name is free again.
                    self.predictions.lock().expect("predictions lock").views.remove(&name);
                }
                self.applied_ddl(index, outcome)
            }
            Command::DropView(name) => {
                let outcome = match self.view(&name) {
                    Ok(_) => self.drop_view_here(&name).await.map(|()| Outcome::Dropped),
                    Err(_) => Ok(Outcome::Dropped),
                };
                if outcome.is_ok() {
                    self.predictions.lock().expect("predictions lock").views.remove(&name);
                }
                self.applied_ddl(index, outcome)
            }
            Command::AlterStream { name, change } => {
                let outcome = match change {
                    StreamChange::Retention { retention_ms, retention_bytes } => {
                        self.alter_stream_retention_here(&name, retention_ms, retention_bytes).await
                    }
                    StreamChange::Partitions(partitions) => self.add_stream_partitions_here(&name, partitions).await,
                };
                self.applied_ddl(index, outcome.map(|_| Outcome::Created))
            }
            Command::DropStream(name) => {
                let outcome = match self.stream(&name) {
                    Ok(_) => self.drop_stream_here(&name).await.map(|()| Outcome::Dropped),
                    Err(_) => Ok(Outcome::Dropped),
                };
                if outcome.is_err() {
                    // Refused alike on every node (a view reads it): it stays. The leader
                    // predicted nothing for it since it prepared the drop.
                    self.predictions.lock().expect("predictions lock").dropping.remove(&name);
                }
                self.applied_ddl(index, outcome)
            }
            Command::Access(change) => {
                let change: AccessChange =
                    serde_json::from_str(&change).map_err(|error| format!("a committed access change: {error}"))?;
                let outcome = self.change_access_here(change).await.map(|answer| Outcome::Access { answer, index });
                self.applied_ddl(index, outcome)
            }
            Command::SystemAppend { topic, records } => {
                let system = self
                    .system_topic(&topic, &SystemTopicConfig::shared())
                    .map_err(|error| format!("opening system topic {topic}: {error}"))?;
                let records: Vec<NewRecord> = records.into_iter().map(NewRecord::from).collect();
                system.append(&records).await.map_err(|error| format!("appending to system topic {topic}: {error}"))?;
                Ok(encode(&Outcome::SystemAppended { index }))
            }
            Command::CreateTransform { def, output } => {
                let def: TransformDef =
                    serde_json::from_str(&def).map_err(|error| format!("a committed transform definition: {error}"))?;
                let name = def.name.clone();
                let outcome = self.create_transform_here(def, output.into()).await.map(|_| Outcome::Created);
                if outcome.is_err() {
                    // Refused alike on every node: its name is free again.
                    self.predictions.lock().expect("predictions lock").creating.remove(&name);
                }
                self.applied_ddl(index, outcome)
            }
            Command::TransformWrite { transform, to, appends } => {
                let Some(running) = self.transform(&transform) else {
                    // Its drop is a barrier: nothing written before it is applied again after.
                    return Err(format!("a committed batch of transform {transform:?}, which this node does not have"));
                };
                self.apply_appends(running.output(), appends).await?;
                running.set_applied(to);
                Ok(encode(&Outcome::Appended))
            }
        }
    }

    /// Appends each of `appends` to its partition of `target` at the offset the leader
    /// predicted, skipping one the partition holds already (applied before a restart), and
    /// returns each one's base offset. `Err` when the partition does not end where the append
    /// starts: this node's log does not fit the cluster's.
    async fn apply_appends(&self, target: &Arc<Stream>, appends: Vec<Append>) -> Result<Vec<u64>, String> {
        let stream = target.name();
        let mut queued = Vec::with_capacity(appends.len());
        for append in appends {
            let partition = target.partition(append.partition).map_err(|error| error.to_string())?;
            let count = append.records.len() as u64;
            let end = partition.end_offset();
            if append.base_offset + count <= end {
                // Applied before a restart: the partition has these offsets already,
                // maybe not yet synced.
                self.unsynced(partition);
                queued.push((append.base_offset, None));
                continue;
            }
            if append.base_offset != end {
                return Err(format!(
                    "stream {stream:?} partition {} ends at offset {end}, and the committed command appends \
                     at {}: this node's log does not fit the cluster's; stopping rather than diverge",
                    append.partition, append.base_offset
                ));
            }
            let records: Vec<NewRecord> = append.records.into_iter().map(NewRecord::from).collect();
            // The Raft log holds the command durably on a majority; the partition is
            // synced with the state machine's progress (`sync_replicated`).
            let pending = partition.enqueue_with(&records, Durability::Async).await.map_err(|e| e.to_string())?;
            queued.push((append.base_offset, Some((partition.clone(), pending))));
        }
        let mut bases = Vec::with_capacity(queued.len());
        for (base_offset, pending) in queued {
            if let Some((partition, pending)) = pending {
                let ack = pending.await.map_err(|error| error.to_string())?;
                if ack.base_offset != base_offset {
                    return Err(format!("appended at offset {} instead of {base_offset}", ack.base_offset));
                }
                // Once written: a sync that takes the partition from here on covers it.
                self.unsynced(&partition);
            }
            bases.push(base_offset);
        }
        Ok(bases)
    }

    /// Appends `records` to `topic`, a system topic every cluster node keeps alike (a front
    /// end's, such as Kafka's committed offsets), and returns once they are durable: on a
    /// single node, appended here; on a cluster node, committed on a majority of the nodes and
    /// appended by each, this one included. A node that applies an append to a topic it has
    /// not opened opens it with [`SystemTopicConfig::shared`], so no record of such a topic may
    /// be larger than that allows.
    ///
    /// On a cluster node the answer is the index of the command in the cluster's log: no other
    /// append anywhere has it, and every node applied this one there. A single node answers
    /// `None`.
    pub async fn append_system(
        &self,
        topic: &SystemTopic,
        records: Vec<NewRecord>,
    ) -> Result<Option<u64>, EngineError> {
        self.append_system_in_term(topic, records, None).await
    }

    /// [`Engine::append_system`], on a cluster node with `term` only if the leader of that
    /// term prepares it: a node that decided the append from what it knew as that term's
    /// leader is refused once another leads (nothing is written then).
    pub async fn append_system_in_term(
        &self,
        topic: &SystemTopic,
        records: Vec<NewRecord>,
        term: Option<u64>,
    ) -> Result<Option<u64>, EngineError> {
        let Some(replicator) = self.replicator.get() else {
            return topic.append(&records).await.map(|_| None);
        };
        check_shared_system_topic(topic.name())?;
        let request = Request::SystemAppend {
            topic: topic.name().to_string(),
            records: records.iter().map(WireRecord::from).collect(),
        };
        let request = encode(&fenced(request, term));
        match outcome(submit_queued(replicator, request).await?.await)? {
            Outcome::SystemAppended { index } => Ok(Some(index)),
            Outcome::Refused(refusal) => Err(refusal.into()),
            _ => Err(EngineError::Internal("the cluster answered a system append with something else".into())),
        }
    }

    /// The answer to an applied definition change, told to whoever waits for it here. A
    /// refusal every node makes alike is the answer; another failure stops the node.
    fn applied_ddl(&self, index: u64, outcome: Result<Outcome, EngineError>) -> Result<Bytes, String> {
        let answer = match outcome {
            Ok(outcome) => encode(&outcome),
            Err(error) if error.is_client_error() => refused(&error),
            Err(error) => return Err(error.to_string()),
        };
        self.replicated_ddl.send_modify(|applied| *applied = (*applied).max(index));
        Ok(answer)
    }

    /// Makes an access change through the cluster and waits until this node made it too.
    pub(crate) async fn change_access_replicated(&self, change: AccessChange) -> Result<AccessAnswer, EngineError> {
        let change = serde_json::to_string(&change).expect("an access change serializes");
        let Outcome::Access { answer, index } = self.submit_ddl(encode(&Request::Access(change))).await? else {
            return Err(EngineError::Internal("the cluster answered an access change with something else".into()));
        };
        let mut applied = self.replicated_ddl.subscribe();
        self.await_ddl(&mut applied, "the access change", || (*self.replicated_ddl.borrow() >= index).then_some(()))
            .await?;
        Ok(answer)
    }

    /// Writes row `id` of table `name` through the cluster, when this node does not have that
    /// table (yet): the leader decides, so a table just created through another node takes
    /// the write, and one that exists nowhere is refused by the leader. Returns once this node
    /// has the table and applied the write.
    pub(crate) async fn write_row_unknown_here(
        &self,
        replicator: &Arc<dyn Replicator>,
        name: &str,
        id: &str,
        write: Write,
        precondition: Precondition,
    ) -> Result<Written, EngineError> {
        let mut applied = self.replicated_ddl.subscribe();
        let request = table_write_request(name, id, &write, precondition);
        match outcome(submit_queued(replicator, request).await?.await)? {
            Outcome::Written { offset, created } => {
                let table = self.await_ddl(&mut applied, &format!("table {name:?}"), || self.table(name).ok()).await?;
                written_here(&table, id, offset, created).await
            }
            Outcome::Refused(refusal) => Err(refusal.into()),
            _ => Err(EngineError::Internal("the cluster answered a row write with something else".into())),
        }
    }

    /// Appends a committed row change at `offset` of table `name`'s partition (unless it is
    /// there already, from before a restart) and applies it to the table's rows.
    async fn apply_table_write(&self, name: &str, offset: u64, record: WireRecord) -> Result<(), String> {
        let table = self.table(name).map_err(|error| format!("applying a write to table {name:?}: {error}"))?;
        let partition = table.partition();
        let end = partition.end_offset();
        if offset > end {
            return Err(format!(
                "table {name:?} ends at offset {end}, and the committed write is at {offset}: this node's log does \
                 not fit the cluster's; stopping rather than diverge"
            ));
        }
        if offset < end {
            // Applied before a restart, maybe not yet synced.
            self.unsynced(partition);
        } else {
            let record = NewRecord::from(record);
            let ack = partition
                .enqueue_with(std::slice::from_ref(&record), Durability::Async)
                .await
                .map_err(|error| error.to_string())?
                .await
                .map_err(|error| error.to_string())?;
            if ack.base_offset != offset {
                return Err(format!("table {name:?}: appended at offset {} instead of {offset}", ack.base_offset));
            }
            self.unsynced(partition);
        }
        table.apply_through(offset).map_err(|error| error.to_string())
    }

    /// Creates the table `def` through the cluster and waits until this node has it. A
    /// creation refused while a drop of its name is in flight is tried again for a while.
    pub(crate) async fn create_table_replicated(&self, def: TableDef) -> Result<Arc<Table>, EngineError> {
        def.validate()?;
        let request = encode(&Request::CreateTable(Bytes::from(catalog::table_json(&def))));
        let deadline = tokio::time::Instant::now() + DDL_WAIT;
        loop {
            let mut applied = self.replicated_ddl.subscribe();
            match self.submit_ddl(request.clone()).await {
                Ok(_) => {
                    let name = def.name.clone();
                    return self.await_ddl(&mut applied, &format!("table {name:?}"), || self.table(&name).ok()).await;
                }
                Err(EngineError::Append(AppendError::Unconfirmed(_))) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    pub(crate) async fn drop_table_replicated(&self, name: &str) -> Result<(), EngineError> {
        let mut applied = self.replicated_ddl.subscribe();
        self.submit_ddl(encode(&Request::DropTable(name.to_string()))).await?;
        self.await_ddl(&mut applied, &format!("the drop of table {name:?}"), || self.table(name).is_err().then_some(()))
            .await
    }

    pub(crate) async fn create_index_replicated(
        &self,
        table: &str,
        name: Option<&str>,
        field: &str,
    ) -> Result<(IndexDef, bool), EngineError> {
        validate_field_name(field)?;
        let mut applied = self.replicated_ddl.subscribe();
        let request =
            Request::CreateIndex { table: table.to_string(), name: name.map(str::to_string), field: field.to_string() };
        let Outcome::Indexed { name, field, created } = self.submit_ddl(encode(&request)).await? else {
            return Err(EngineError::Internal("the cluster answered an index creation with something else".into()));
        };
        let index = IndexDef { name, field };
        self.await_ddl(&mut applied, &format!("index {:?}", index.name), || {
            self.table(table).ok().filter(|table| table.def().indexes.contains(&index)).map(|_| ())
        })
        .await?;
        Ok((index, created))
    }

    pub(crate) async fn drop_index_replicated(&self, name: &str) -> Result<String, EngineError> {
        let mut applied = self.replicated_ddl.subscribe();
        let Outcome::IndexDropped(table) = self.submit_ddl(encode(&Request::DropIndex(name.to_string()))).await? else {
            return Err(EngineError::Internal("the cluster answered an index drop with something else".into()));
        };
        self.await_ddl(&mut applied, &format!("the drop of index {name:?}"), || {
            (!self.tables().iter().any(|table| table.def().indexes.iter().any(|index| index.name == name)))
                .then_some(())
        })
        .await?;
        Ok(table)
    }

    /// Changes a stream's definition through the cluster; returns it once this node has it.
    pub(crate) async fn alter_stream_replicated(
        &self,
        name: &str,
        change: StreamChange,
    ) -> Result<Arc<Stream>, EngineError> {
        let mut applied = self.replicated_ddl.subscribe();
        let request = Request::AlterStream { name: name.to_string(), change };
        self.submit_ddl(encode(&request)).await?;
        let done = |stream: &Stream| match change {
            StreamChange::Retention { retention_ms, retention_bytes } => {
                stream.def().retention_ms == retention_ms && stream.def().retention_bytes == retention_bytes
            }
            StreamChange::Partitions(partitions) => stream.partition_count() == partitions,
        };
        self.await_ddl(&mut applied, &format!("the change to stream {name:?}"), || {
            self.stream(name).ok().filter(|stream| done(stream))
        })
        .await
    }

    pub(crate) async fn drop_stream_replicated(&self, name: &str) -> Result<(), EngineError> {
        let mut applied = self.replicated_ddl.subscribe();
        self.submit_ddl(encode(&Request::DropStream(name.to_string()))).await?;
        self.await_ddl(&mut applied, &format!("the drop of stream {name:?}"), || {
            self.stream(name).is_err().then_some(())
        })
        .await
    }

    pub(crate) async fn create_view_replicated(&self, def: ViewDef) -> Result<Arc<View>, EngineError> {
        let json = serde_json::to_string(&def).expect("a view definition serializes");
        let mut applied = self.replicated_ddl.subscribe();
        self.submit_ddl(encode(&Request::CreateView(json))).await?;
        let name = def.name.clone();
        self.await_ddl(&mut applied, &format!("view {name:?}"), || self.view(&name).ok()).await
    }

    /// Creates the transform `def` and its output stream `output` through the cluster, and
    /// waits until this node has it.
    pub(crate) async fn create_transform_replicated(
        &self,
        def: TransformDef,
        output: StreamDef,
    ) -> Result<Arc<Transform>, EngineError> {
        let json = serde_json::to_string(&def).expect("a transform definition serializes");
        let mut applied = self.replicated_ddl.subscribe();
        self.submit_ddl(encode(&Request::CreateTransform { def: json, output: WireStreamDef::from(&output) })).await?;
        let name = def.name.clone();
        self.await_ddl(&mut applied, &format!("transform {name:?}"), || self.transform(&name)).await
    }

    pub(crate) async fn drop_view_replicated(&self, name: &str) -> Result<(), EngineError> {
        let mut applied = self.replicated_ddl.subscribe();
        self.submit_ddl(encode(&Request::DropView(name.to_string()))).await?;
        self.await_ddl(&mut applied, &format!("the drop of view {name:?}"), || self.view(name).is_err().then_some(()))
            .await
    }

    /// Submits a definition change; the leader's outcome, a refusal as its error.
    async fn submit_ddl(&self, request: Bytes) -> Result<Outcome, EngineError> {
        match submit(&self.replicator, request).await? {
            Outcome::Refused(refusal) => Err(refusal.into()),
            outcome => Ok(outcome),
        }
    }

    /// Waits until a change the cluster applied reached this node: until `done` gives a value.
    async fn await_ddl<T>(
        &self,
        applied: &mut tokio::sync::watch::Receiver<u64>,
        what: &str,
        done: impl Fn() -> Option<T>,
    ) -> Result<T, EngineError> {
        let deadline = tokio::time::Instant::now() + DDL_WAIT;
        loop {
            if let Some(value) = done() {
                return Ok(value);
            }
            if tokio::time::timeout_at(deadline, applied.changed()).await.is_err() {
                return Err(AppendError::Unconfirmed(format!(
                    "{what} was committed by the cluster but has not reached this node in {} s",
                    DDL_WAIT.as_secs()
                ))
                .into());
            }
        }
    }

    /// Notes that `partition` holds records applied since the last sync.
    fn unsynced(&self, partition: &Arc<onehop_log::Partition>) {
        let mut unsynced = self.unsynced.lock().expect("unsynced lock");
        unsynced.entry(Arc::as_ptr(partition) as usize).or_insert_with(|| partition.clone());
    }

    /// Makes every record applied so far durable: an fsync of each partition appended to since
    /// the last sync (a segment closed by a roll was synced then). A partition whose stream or
    /// table was dropped meanwhile is gone, and skipped. One that fails stays to be synced
    /// again, and the error stops the progress from being recorded.
    pub async fn sync_replicated(&self) -> Result<(), String> {
        let partitions: Vec<Arc<onehop_log::Partition>> =
            std::mem::take(&mut *self.unsynced.lock().expect("unsynced lock")).into_values().collect();
        let failed = tokio::task::spawn_blocking(move || {
            for (at, partition) in partitions.iter().enumerate() {
                if !partition.dir().exists() {
                    continue;
                }
                if let Err(error) = partition.sync() {
                    return Err((format!("{}: {error}", partition.dir().display()), partitions[at..].to_vec()));
                }
            }
            Ok(())
        })
        .await
        .map_err(|error| error.to_string())?;
        match failed {
            Ok(()) => Ok(()),
            Err((error, left)) => {
                for partition in &left {
                    self.unsynced(partition);
                }
                Err(error)
            }
        }
    }
}

/// Refuses `def` when its `mqtt_topic` overlaps that of a stream whose creation is prepared.
fn check_pending_routes(predictions: &Predictions, def: &StreamDef) -> Result<(), EngineError> {
    let Some(topic) = &def.mqtt_topic else { return Ok(()) };
    let route = catalog::mqtt_route(topic)?;
    for other in predictions.creating.values() {
        if let Some(theirs) = &other.mqtt_topic
            && catalog::mqtt_route(theirs)?.overlaps(&route)
        {
            return Err(EngineError::InvalidDefinition(format!(
                "mqtt_topic '{topic}' overlaps stream {}'s mqtt_topic '{theirs}': each MQTT topic must belong to one \
                 stream",
                other.name
            )));
        }
    }
    Ok(())
}

/// The request that publishes `records` to `stream`: to `partition`, or by the partitioning
/// rule (which the leader applies); with `term`, only if the leader of that term prepares it
/// ([`Request::Fenced`]).
pub(crate) fn publish_request(stream: &str, partition: Option<u32>, records: &[NewRecord], term: Option<u64>) -> Bytes {
    let request = Request::Publish {
        stream: stream.to_string(),
        partition,
        records: records.iter().map(WireRecord::from).collect(),
    };
    encode(&fenced(request, term))
}

/// `request`, fenced to `term` when there is one.
fn fenced(request: Request, term: Option<u64>) -> Request {
    match term {
        Some(term) => Request::Fenced { term, request: encode(&request) },
        None => request,
    }
}

/// Submits `request` through `replicator`; returns once it is queued.
pub(crate) async fn submit_queued(replicator: &Arc<dyn Replicator>, request: Bytes) -> Result<Submitted, EngineError> {
    replicator.submit(request).await.map_err(|reason| AppendError::Unconfirmed(reason).into())
}

/// Writes row `id` of `table` through the cluster ([`Table::write`] on a cluster node):
/// returns once the leader applied it and this node did too.
pub(crate) async fn write_row(
    table: &Arc<Table>,
    replicator: &Arc<dyn Replicator>,
    id: &str,
    write: Write,
    precondition: Precondition,
) -> Result<Written, EngineError> {
    let request = table_write_request(&table.name(), id, &write, precondition);
    match outcome(submit_queued(replicator, request).await?.await)? {
        Outcome::Written { offset, created } => written_here(table, id, offset, created).await,
        Outcome::Refused(refusal) => Err(refusal.into()),
        _ => Err(EngineError::Internal("the cluster answered a row write with something else".into())),
    }
}

/// The request for the leader to decide a write to row `id` of table `name`.
fn table_write_request(name: &str, id: &str, write: &Write, precondition: Precondition) -> Bytes {
    encode(&Request::TableWrite {
        table: name.to_string(),
        id: id.to_string(),
        write: WireWrite::from(write),
        precondition,
    })
}

/// A row write the cluster committed at `offset`, once this node applied it too.
async fn written_here(table: &Arc<Table>, id: &str, offset: u64, created: bool) -> Result<Written, EngineError> {
    if !table.wait_applied(offset, DDL_WAIT).await {
        return Err(AppendError::Unconfirmed(format!(
            "the write to row {id:?} of table {} was committed by the cluster but has not reached this node in {} s",
            table.name(),
            DDL_WAIT.as_secs()
        ))
        .into());
    }
    Ok(Written { offset, created, row: table.get(id).filter(|row| row.offset == offset) })
}

/// Refuses what is not a system topic a front end may have every node keep alike through
/// [`Engine::append_system`]: the engine's own (catalog, view checkpoints) are written by the
/// engine, and the idempotency keys' checkpoint is each node's own.
fn check_shared_system_topic(name: &str) -> Result<(), EngineError> {
    let own = [CATALOG_TOPIC, CHECKPOINT_TOPIC, crate::idempotency::IDEMPOTENCY_TOPIC];
    if !name.starts_with("__") || own.contains(&name) {
        return Err(EngineError::InvalidDefinition(format!("{name:?} is not a system topic the nodes share")));
    }
    onehop_log::validate_topic_name(name).map_err(|reason| EngineError::InvalidName { name: name.to_string(), reason })
}

/// How long a node waits for a change the cluster committed to reach it.
const DDL_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The outcome in a leader's answer.
fn outcome(answer: Result<Bytes, String>) -> Result<Outcome, EngineError> {
    let answer = answer.map_err(AppendError::Unconfirmed)?;
    decode(&answer, "an answer from the cluster").map_err(EngineError::Internal)
}

/// Submits `request` and waits for the leader's outcome.
async fn submit(slot: &ReplicatorSlot, request: Bytes) -> Result<Outcome, EngineError> {
    let replicator = slot.get().ok_or_else(|| EngineError::Internal("not a cluster node".into()))?;
    outcome(submit_queued(replicator, request).await?.await)
}

/// Writes a batch of transform `name`'s output through the cluster: `groups`, the records for
/// each output partition, made from its source's records between positions `from` and `to`.
/// Returns once the leader applied it; refused unless the transform is at `from`.
pub(crate) async fn transform_write(
    replicator: &Arc<dyn Replicator>,
    name: &str,
    from: Vec<u64>,
    to: Vec<u64>,
    groups: Vec<(u32, Vec<NewRecord>)>,
) -> Result<(), EngineError> {
    let groups = groups
        .into_iter()
        .map(|(partition, records)| (partition, records.iter().map(WireRecord::from).collect()))
        .collect();
    let request = encode(&Request::TransformWrite { transform: name.to_string(), from, to, groups });
    match outcome(submit_queued(replicator, request).await?.await)? {
        Outcome::Appended => Ok(()),
        Outcome::Refused(refusal) => Err(refusal.into()),
        _ => Err(EngineError::Internal("the cluster answered a transform's batch with something else".into())),
    }
}

/// Where each record of a replicated publish went, from the leader's answer.
pub(crate) fn published(answer: Result<Bytes, String>) -> Result<Vec<Published>, EngineError> {
    match outcome(answer)? {
        Outcome::Published(places) => {
            Ok(places.into_iter().map(|(partition, offset)| Published { partition, offset }).collect())
        }
        Outcome::Refused(refusal) => Err(refusal.into()),
        _ => Err(EngineError::Internal("the cluster answered a publish with something else".into())),
    }
}

/// The places of an idempotent publish through the cluster, and whether the leader answered it
/// with an earlier write's (a retry).
pub(crate) fn published_or_replayed(answer: Result<Bytes, String>) -> Result<(Vec<Published>, bool), EngineError> {
    let places =
        |places: Vec<(u32, u64)>| places.into_iter().map(|(partition, offset)| Published { partition, offset });
    match outcome(answer)? {
        Outcome::Published(found) => Ok((places(found).collect(), false)),
        Outcome::Replayed(found) => Ok((places(found).collect(), true)),
        Outcome::Refused(refusal) => Err(refusal.into()),
        _ => Err(EngineError::Internal("the cluster answered a publish with something else".into())),
    }
}

/// A replicated publish to one partition as a queued append: resolves with its acknowledgement
/// once the leader answers.
pub(crate) fn queued_append(answer: Submitted) -> QueuedAppend {
    let (sender, queued) = QueuedAppend::channel();
    tokio::spawn(async move {
        let acked = match published(answer.await) {
            Ok(places) => match places.first() {
                Some(first) => {
                    Ok(onehop_log::AppendAck { base_offset: first.offset, record_count: places.len() as u32 })
                }
                None => Err(AppendError::EmptyBatch),
            },
            Err(EngineError::Append(error)) => Err(error),
            Err(error) => Err(AppendError::Unconfirmed(error.to_string())),
        };
        let _ = sender.send(acked);
    });
    queued
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A command as format 1 wrote it (header values could not be null), read by this release
    /// from a Raft log an earlier one wrote; and a null value kept in this release's format.
    #[test]
    fn a_command_an_earlier_format_wrote_still_decodes_and_null_header_values_travel() {
        #[derive(Serialize)]
        struct FormatOneRecord {
            timestamp_ms: Option<i64>,
            key: Option<Bytes>,
            subject: Option<String>,
            headers: Vec<(String, Bytes)>,
            value: Option<Bytes>,
        }
        /// Postcard names a variant by its index: `TableWrite` is the third, as in [`Command`].
        #[derive(Serialize)]
        #[allow(dead_code)]
        enum FormatOneCommand {
            Publish,
            CreateStream,
            TableWrite { table: String, offset: u64, record: FormatOneRecord, created: bool },
        }
        let old = FormatOneCommand::TableWrite {
            table: "t".into(),
            offset: 7,
            record: FormatOneRecord {
                timestamp_ms: Some(1),
                key: Some(Bytes::from_static(b"k")),
                subject: None,
                headers: vec![("trace".into(), Bytes::from_static(b"a")), ("trace".into(), Bytes::from_static(b"b"))],
                value: Some(Bytes::from_static(b"v")),
            },
            created: true,
        };
        for format in [0u8, 1] {
            let bytes = postcard::to_extend(&old, vec![format]).unwrap();
            match decode::<Command>(&bytes, "a command").unwrap() {
                Command::TableWrite { table, offset, record, created } => {
                    assert_eq!((table.as_str(), offset, created), ("t", 7, true));
                    let headers = NewRecord::from(record).headers;
                    let expected: Vec<(Text, Option<Bytes>)> = vec![
                        ("trace".into(), Some(Bytes::from_static(b"a"))),
                        ("trace".into(), Some(Bytes::from_static(b"b"))),
                    ];
                    assert_eq!(headers, expected, "format {format}");
                }
                _ => panic!("format {format}: another command"),
            }
        }
        let new =
            NewRecord { headers: vec![("n".into(), None), ("n".into(), Some(Bytes::new()))], ..NewRecord::value("v") };
        let write =
            Command::TableWrite { table: "t".into(), offset: 0, record: WireRecord::from(&new), created: false };
        let encoded = encode(&write);
        assert_eq!(encoded[0], WIRE_FORMAT);
        match decode::<Command>(&encoded, "a command").unwrap() {
            Command::TableWrite { record, .. } => assert_eq!(NewRecord::from(record).headers, new.headers),
            _ => panic!("another command"),
        }
        let newer = [&[WIRE_FORMAT + 1][..], &encoded[1..]].concat();
        let Err(refused) = decode::<Command>(&newer, "a command") else { panic!("a newer format decoded") };
        assert!(refused.contains("newer onehop"), "{refused}");
    }

    #[test]
    fn only_definition_changes_are_barriers() {
        let record = WireRecord { timestamp_ms: Some(1), key: None, subject: None, headers: Vec::new(), value: None };
        let publish = Command::Publish {
            stream: "s".into(),
            create: None,
            appends: vec![Append { partition: 0, base_offset: 0, records: vec![record.clone()] }],
            order: vec![(0, 0)],
        };
        let write = Command::TableWrite { table: "t".into(), offset: 0, record, created: true };
        assert!(!Engine::is_replicated_barrier(&encode(&publish)));
        assert!(!Engine::is_replicated_barrier(&encode(&write)));
        for change in [
            Command::DropStream("s".into()),
            Command::DropTable("t".into()),
            Command::CreateTable(Bytes::from_static(b"{}")),
            Command::Access("{}".into()),
            Command::DropView("v".into()),
        ] {
            assert!(Engine::is_replicated_barrier(&encode(&change)));
        }
    }

    /// The fence between two runs of a transform (a deposed leader's and a new one's): a
    /// batch is prepared only from where the transform is, as applied or as prepared in this
    /// term, and its output takes the offsets after what was prepared before it.
    #[tokio::test]
    async fn a_transform_batch_is_prepared_only_from_where_the_transform_is() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
        engine.stream_or_create("in").await.unwrap();
        let def = TransformDef {
            name: "out".into(),
            first: crate::view::TransformBranch::all_of("in"),
            union: Vec::new(),
            start: Start::Latest,
            value_format: Default::default(),
            sql: String::new(),
        };
        let transform = engine.create_transform(def.clone(), engine.default_stream_def("out")).await.unwrap();
        let at = transform.applied().positions;
        assert_eq!(at, vec![0]);
        let record = WireRecord { timestamp_ms: Some(1), key: None, subject: None, headers: Vec::new(), value: None };
        let write = |from: Vec<u64>, to: Vec<u64>| {
            encode(&Request::TransformWrite {
                transform: "out".into(),
                from,
                to,
                groups: vec![(0, vec![record.clone(), record.clone()])],
            })
        };
        let base = |prepared: Result<Bytes, Bytes>| match decode(&prepared.expect("prepared"), "a command").unwrap() {
            Command::TransformWrite { to, appends, .. } => (to, appends[0].base_offset),
            _ => panic!("not a transform's batch"),
        };
        assert!(engine.prepare_replicated(&write(vec![5], vec![6])).is_err(), "not where the transform is");
        assert_eq!(base(engine.prepare_replicated(&write(at.clone(), vec![1]))), (vec![1], 0));
        assert!(engine.prepare_replicated(&write(at.clone(), vec![1])).is_err(), "a second run from the same place");
        assert_eq!(base(engine.prepare_replicated(&write(vec![1], vec![3]))), (vec![3], 2));
        // A new term: what was prepared in the last one is void; the transform is where it
        // was applied.
        engine.begin_replicated_term(2);
        assert!(engine.prepare_replicated(&write(vec![3], vec![4])).is_err());
        assert_eq!(base(engine.prepare_replicated(&write(at, vec![1]))).0, vec![1]);
        let unknown = encode(&Request::TransformWrite {
            transform: "nothing".into(),
            from: vec![0],
            to: vec![1],
            groups: Vec::new(),
        });
        assert!(engine.prepare_replicated(&unknown).is_err());

        // Dropped and made again in the same term (as the leader prepares and every node
        // applies it): the new transform starts where its creation put it, at offset 0.
        assert!(engine.prepare_replicated(&encode(&Request::DropStream("out".into()))).is_ok());
        engine.drop_stream("out").await.unwrap();
        let output = engine.default_stream_def("out");
        let create = Request::CreateTransform {
            def: serde_json::to_string(&def).unwrap(),
            output: WireStreamDef::from(&output),
        };
        assert!(engine.prepare_replicated(&encode(&create)).is_ok());
        let again = engine.create_transform(def, output).await.unwrap();
        assert_eq!(base(engine.prepare_replicated(&write(again.applied().positions, vec![1]))), (vec![1], 0));
    }

    #[tokio::test]
    async fn a_fenced_request_is_prepared_only_by_the_leader_of_its_term() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open_in(dir.path(), EngineOptions::default()).unwrap();
        engine.stream_or_create("orders").await.unwrap();
        let records = [NewRecord::value("a")];
        let publish = |term| publish_request("orders", Some(0), &records, term);
        let offset = |prepared: Result<Bytes, Bytes>| match decode(&prepared.expect("prepared"), "a command").unwrap() {
            Command::Publish { appends, .. } => appends[0].base_offset,
            _ => panic!("not a publish"),
        };
        let refusal =
            |prepared: Result<Bytes, Bytes>| match decode(&prepared.expect_err("refused"), "an answer").unwrap() {
                Outcome::Refused(refusal) => EngineError::from(refusal).kind(),
                _ => panic!("not a refusal"),
            };
        // Before this node leads any term, and in another term than the request's: refused.
        assert_eq!(refusal(engine.prepare_replicated(&publish(Some(3)))), crate::ErrorKind::Unavailable);
        engine.begin_replicated_term(2);
        assert_eq!(refusal(engine.prepare_replicated(&publish(Some(3)))), crate::ErrorKind::Unavailable);
        assert_eq!(offset(engine.prepare_replicated(&publish(None))), 0, "an unfenced request in any term");
        engine.begin_replicated_term(3);
        assert_eq!(offset(engine.prepare_replicated(&publish(Some(3)))), 0, "prepared in its term");
        assert_eq!(offset(engine.prepare_replicated(&publish(Some(3)))), 1);
        engine.begin_replicated_term(4);
        assert_eq!(refusal(engine.prepare_replicated(&publish(Some(3)))), crate::ErrorKind::Unavailable);
        let topic = engine.system_topic("__kafka_test", &SystemTopicConfig::default()).unwrap();
        let request = fenced(
            Request::SystemAppend { topic: topic.name().to_string(), records: vec![WireRecord::from(&records[0])] },
            Some(3),
        );
        assert_eq!(refusal(engine.prepare_replicated(&encode(&request))), crate::ErrorKind::Unavailable);
        let nested = fenced(fenced(Request::DropStream("orders".into()), Some(4)), Some(4));
        assert_eq!(refusal(engine.prepare_replicated(&encode(&nested))), crate::ErrorKind::Internal);
    }
}
