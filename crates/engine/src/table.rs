//! Tables: rows (JSON objects) by primary key, stored as the changes of one compacted log
//! partition and served from memory.
//!
//! # Storage
//!
//! Every write appends one record: key = the row id, value = the whole row after the write
//! (no value for a delete), header `onehop-op` = `insert` | `update` | `delete`, and header
//! `onehop-prev` describing the row before: for an update the top-level fields that differed
//! (`{"set": {field: old}, "unset": [new fields]}`), for a delete the whole old row. So a record
//! alone tells a subscription whether a row entered, changed in or left its filter's set, also
//! when it is read back from the log to resume. Compaction keeps the newest record per row.
//!
//! # Memory state
//!
//! The rows, the secondary indexes and the offset up to which the log is applied are kept in
//! memory and rebuilt by replaying the partition at start. Only durable records are applied, in
//! offset order, so reads never see a write that could still be lost, and the indexes always
//! match the rows. A write returns after its record is applied: a read that follows it sees it.
//!
//! # Writes
//!
//! Writes to one table are computed one at a time (a patch or a conditional write reads the
//! newest row, including writes queued but not yet durable) and queued to the log in that
//! order; waiting for the disk happens outside that critical section, so concurrent writers
//! share fsyncs. Each write runs in its own task: a client that disconnects cannot leave a
//! write half-recorded in the in-memory state.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use bytes::Bytes;
use onehop_log::{Durability, NewRecord, Partition, Record, Text};
use serde_json::{Map, Value};

use crate::engine::replicated::{self, ReplicatorSlot};
use crate::error::EngineError;
use crate::filter::{self, Condition, Filter, for_each_key};
use crate::stream::Stream;
use crate::tabledef::{IndexDef, TableDef};

/// Bytes of rows one catch-up step reads at most, under the state's write lock: enough for
/// thousands of rows, short enough that readers of the table wait little.
const CATCH_UP_READ_BYTES_MAX: usize = 4 * 1024 * 1024;

pub const OP_HEADER: &str = "onehop-op";
pub const PREV_HEADER: &str = "onehop-prev";
/// Rows a query answers at most, whatever `limit` asks.
pub const QUERY_LIMIT_MAX: usize = 10_000;
/// Longest row id, in bytes.
pub const ROW_ID_BYTES_MAX: usize = 512;

/// What a table record did, from its headers.
pub enum TableOp {
    Insert,
    /// With the description of the fields that changed.
    Update(Value),
    /// With the row before the delete.
    Delete(Value),
}

/// The `onehop-op` header of a table record (`insert`, `update`, `delete`), without parsing
/// the rest.
pub fn op_name(record: &Record) -> Option<&[u8]> {
    record.headers.get(OP_HEADER)
}

/// The change a table record describes; `None` when it is not a table record.
pub fn table_op(record: &Record) -> Option<TableOp> {
    let header = |name: &str| record.headers.get(name);
    let prev = || header(PREV_HEADER).and_then(|value| serde_json::from_slice::<Value>(value).ok());
    match header(OP_HEADER)? {
        b"insert" => Some(TableOp::Insert),
        b"update" => Some(TableOp::Update(prev()?)),
        b"delete" => Some(TableOp::Delete(prev()?)),
        _ => None,
    }
}

/// A row as stored.
#[derive(Clone, Debug)]
pub struct Row {
    pub id: String,
    /// The offset of the record that wrote it: its version, sent as the ETag.
    pub offset: u64,
    pub timestamp_ms: i64,
    /// The row as JSON, shared with every reader.
    pub json: Bytes,
    doc: Arc<Map<String, Value>>,
}

impl Row {
    /// The row as a shared document.
    pub fn shared_doc(&self) -> Arc<Map<String, Value>> {
        self.doc.clone()
    }

    pub fn doc(&self) -> &Map<String, Value> {
        &self.doc
    }
}

/// A write to one row.
#[derive(Clone, Debug)]
pub enum Write {
    /// Replace the row (create it if missing).
    Put(Map<String, Value>),
    /// Apply a JSON merge patch (RFC 7386) to an existing row.
    Patch(Map<String, Value>),
    Delete,
}

/// A condition on the row's current version, checked atomically with the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Precondition {
    None,
    /// `If-Match: *`: the row exists.
    Exists,
    /// `If-None-Match: *`: the row does not exist.
    Missing,
    /// `If-Match: "N"`: the row's version is N.
    Version(u64),
}

/// What a write did.
#[derive(Clone, Debug)]
pub struct Written {
    pub offset: u64,
    /// Whether the row did not exist before.
    pub created: bool,
    /// The row after the write (`None` after a delete).
    pub row: Option<Row>,
}

/// A page of query results.
#[derive(Clone, Debug)]
pub struct Page {
    pub rows: Vec<Row>,
    /// The last id of the page when more rows match (pass it as `after`).
    pub next_after: Option<String>,
}

#[derive(Default)]
struct State {
    rows: BTreeMap<String, Row>,
    /// Per indexed field: typed key → ids.
    indexes: HashMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// The next offset to apply.
    next: u64,
}

impl State {
    fn index_row(&mut self, id: &str, doc: &Map<String, Value>, insert: bool) {
        for (field, index) in &mut self.indexes {
            let Some(value) = doc.get(field) else { continue };
            for_each_key(value, |key| {
                if insert {
                    index.entry(key.to_string()).or_default().insert(id.to_string());
                } else if let Some(ids) = index.get_mut(key) {
                    ids.remove(id);
                    if ids.is_empty() {
                        index.remove(key);
                    }
                }
            });
        }
    }

    fn apply(&mut self, record: Record) -> Result<(), String> {
        let offset = record.offset;
        self.next = offset + 1;
        let Some(id) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) else {
            return Err(format!("record {offset} has no row id"));
        };
        let id = id.to_string();
        if let Some(old) = self.rows.remove(&id) {
            let doc = old.doc.clone();
            self.index_row(&id, &doc, false);
        }
        let Some(json) = record.value else { return Ok(()) };
        let doc = match serde_json::from_slice::<Value>(&json) {
            Ok(Value::Object(doc)) => Arc::new(doc),
            _ => return Err(format!("record {offset} is not a JSON object")),
        };
        self.index_row(&id, &doc, true);
        self.rows.insert(id.clone(), Row { id, offset, timestamp_ms: record.timestamp_ms, json, doc });
        Ok(())
    }
}

/// Writes queued to the log but not yet applied, per row: their number and the newest row.
struct Pending {
    count: u32,
    doc: Option<Arc<Map<String, Value>>>,
}

pub struct Table {
    def: RwLock<Arc<TableDef>>,
    storage: Arc<Stream>,
    log: Arc<Partition>,
    state: RwLock<State>,
    /// Held while a write is computed and queued: fixes the order of writes.
    writer: tokio::sync::Mutex<()>,
    pending: Mutex<HashMap<String, Pending>>,
    /// The offset after the last applied change, for those who wait for one.
    applied: tokio::sync::watch::Sender<u64>,
    /// Where writes go on a cluster node: empty on a single node.
    replicator: ReplicatorSlot,
}

impl Table {
    /// Opens the table `def` stored in `storage` (one partition) and replays it.
    pub(crate) fn open(
        def: TableDef,
        storage: Arc<Stream>,
        replicator: ReplicatorSlot,
    ) -> Result<Arc<Table>, EngineError> {
        let log = storage.partition(0)?.clone();
        let mut state = State { next: log.start_offset(), ..State::default() };
        for index in &def.indexes {
            state.indexes.insert(index.field.clone(), BTreeMap::new());
        }
        let table = Arc::new(Table {
            def: RwLock::new(Arc::new(def)),
            storage,
            log,
            state: RwLock::new(state),
            writer: tokio::sync::Mutex::new(()),
            pending: Mutex::new(HashMap::new()),
            applied: tokio::sync::watch::Sender::new(0),
            replicator,
        });
        table.replay()?;
        Ok(table)
    }

    /// Applies the whole partition, saying how far it got every couple of seconds.
    fn replay(&self) -> Result<(), EngineError> {
        let started = Instant::now();
        let mut reported = started;
        let (first, end) = (self.log.start_offset(), self.log.end_offset());
        let name = self.name();
        loop {
            let done = self.catch_up(4096)?;
            let next = self.state.read().expect("table state lock").next;
            if done {
                let rows = self.row_count();
                let seconds = started.elapsed().as_secs_f64();
                tracing::info!(table = %name, rows, records = next - first, seconds, "table replayed");
                return Ok(());
            }
            if reported.elapsed().as_secs() >= 2 {
                reported = Instant::now();
                let rate = (next - first) as f64 / started.elapsed().as_secs_f64();
                tracing::info!(table = %name, progress = %format!("{}/{}", next - first, end - first),
                               records_per_second = rate as u64, "replaying table");
            }
        }
    }

    /// Applies up to `max_records` durable records not yet applied; true when none is left.
    fn catch_up(&self, max_records: usize) -> Result<bool, EngineError> {
        let mut state = self.state.write().expect("table state lock");
        let end = self.log.end_offset();
        if state.next >= end {
            return Ok(true);
        }
        let records = self.log.read(state.next, max_records, CATCH_UP_READ_BYTES_MAX)?;
        if records.is_empty() {
            // Compaction removed what was left below the end.
            state.next = end;
            return Ok(true);
        }
        for record in records {
            if let Err(reason) = state.apply(record) {
                tracing::error!(table = %self.name(), %reason, "skipping a table record that cannot be applied");
            }
        }
        self.applied.send_replace(state.next);
        Ok(state.next >= end)
    }

    /// The partition that stores this table's changes.
    pub(crate) fn partition(&self) -> &Arc<Partition> {
        &self.log
    }

    /// Applies every record up to `offset` (which the partition holds).
    pub(crate) fn apply_through(&self, offset: u64) -> Result<(), EngineError> {
        while self.applied_offset() <= offset {
            if self.catch_up(1024)? && self.applied_offset() <= offset {
                return Err(EngineError::Internal(format!(
                    "table {} ends before offset {offset}, which it was to apply",
                    self.name()
                )));
            }
        }
        Ok(())
    }

    /// Waits until this table applied the change at `offset`; false after `timeout`.
    pub(crate) async fn wait_applied(&self, offset: u64, timeout: std::time::Duration) -> bool {
        let mut applied = self.applied.subscribe();
        tokio::time::timeout(timeout, applied.wait_for(|next| *next > offset)).await.is_ok_and(|done| done.is_ok())
    }

    pub fn name(&self) -> String {
        self.def().name.clone()
    }

    pub fn def(&self) -> Arc<TableDef> {
        self.def.read().expect("table def lock").clone()
    }

    /// The log stream of this table's changes (one partition): what subscriptions follow.
    pub fn storage(&self) -> &Arc<Stream> {
        &self.storage
    }

    pub fn row_count(&self) -> usize {
        self.state.read().expect("table state lock").rows.len()
    }

    /// The offset after the last applied change.
    pub fn applied_offset(&self) -> u64 {
        self.state.read().expect("table state lock").next
    }

    pub fn get(&self, id: &str) -> Option<Row> {
        self.state.read().expect("table state lock").rows.get(id).cloned()
    }

    /// Up to `limit` rows' documents after row `after`, in id order, shared; and the id to
    /// read on from, when there may be more (a query's scan reads only these).
    pub fn docs_after(&self, after: Option<&str>, limit: usize) -> (Vec<Arc<Map<String, Value>>>, Option<String>) {
        let state = self.state.read().expect("table state lock");
        let start = match after {
            Some(after) => std::ops::Bound::Excluded(after),
            None => std::ops::Bound::Unbounded,
        };
        let mut docs = Vec::with_capacity(limit.min(state.rows.len()));
        let mut last = None;
        for (id, row) in state.rows.range::<str, _>((start, std::ops::Bound::Unbounded)).take(limit.max(1)) {
            docs.push(row.doc.clone());
            last = Some(id);
        }
        let next = if docs.len() == limit.max(1) { last.cloned() } else { None };
        (docs, next)
    }

    /// Row `id`'s document alone, shared (a query's join probes read only this).
    pub fn get_doc(&self, id: &str) -> Option<Arc<Map<String, Value>>> {
        self.state.read().expect("table state lock").rows.get(id).map(|row| row.doc.clone())
    }

    /// Rows matching every condition, in id order, after `after`, at most `limit`. One
    /// condition on an indexed field is looked up in its index; without one the query is
    /// refused unless `scan` allows reading every row.
    pub fn query(
        &self,
        conditions: &[Condition],
        after: Option<&str>,
        limit: usize,
        scan: bool,
    ) -> Result<Page, EngineError> {
        let limit = limit.clamp(1, QUERY_LIMIT_MAX);
        let state = self.state.read().expect("table state lock");
        let start = match after {
            Some(after) => std::ops::Bound::Excluded(after.to_string()),
            None => std::ops::Bound::Unbounded,
        };
        let indexed = conditions.iter().position(|condition| state.indexes.contains_key(&condition.path));
        let mut rows = Vec::new();
        let mut more = false;
        let mut take = |row: &Row| -> bool {
            if !conditions.iter().all(|condition| condition.matches_row(&row.doc)) {
                return true;
            }
            if rows.len() == limit {
                more = true;
                return false;
            }
            rows.push(row.clone());
            true
        };
        match indexed {
            Some(position) => {
                let condition = &conditions[position];
                let index = &state.indexes[&condition.path];
                let mut ids: Vec<std::iter::Peekable<std::collections::btree_set::Range<'_, String>>> = condition
                    .keys()
                    .iter()
                    .filter_map(|key| index.get(key))
                    .map(|ids| ids.range((start.clone(), std::ops::Bound::Unbounded)).peekable())
                    .collect();
                // Merge the sorted id sets of the condition's typed keys, each id once.
                while let Some(smallest) = ids.iter_mut().filter_map(|iter| iter.peek().copied()).min().cloned() {
                    for iter in &mut ids {
                        if iter.peek() == Some(&&smallest) {
                            iter.next();
                        }
                    }
                    if let Some(row) = state.rows.get(&smallest)
                        && !take(row)
                    {
                        break;
                    }
                }
            }
            None if conditions.is_empty() || scan => {
                for row in state.rows.range((start, std::ops::Bound::Unbounded)).map(|(_, row)| row) {
                    if !take(row) {
                        break;
                    }
                }
            }
            None => {
                return Err(EngineError::Unindexed {
                    table: self.name(),
                    fields: conditions.iter().map(|condition| condition.path.clone()).collect(),
                });
            }
        }
        let next_after = if more { rows.last().map(|row| row.id.clone()) } else { None };
        Ok(Page { rows, next_after })
    }

    /// The rows matching `filter` now, and the offset of the next change: a subscription that
    /// sends these rows and then the changes from that offset on misses nothing and repeats
    /// nothing.
    pub fn snapshot(&self, filter: &Filter) -> (Vec<Row>, u64) {
        let state = self.state.read().expect("table state lock");
        let matches = |row: &Row| filter.matches_row(Some(row.id.as_bytes()), None, Some(&row.doc));
        let rows = match &filter.key {
            Some(key) => std::str::from_utf8(key)
                .ok()
                .and_then(|id| state.rows.get(id))
                .filter(|row| matches(row))
                .cloned()
                .into_iter()
                .collect(),
            None => state.rows.values().filter(|row| matches(row)).cloned().collect(),
        };
        (rows, state.next)
    }

    /// Performs `write` on row `id` if `precondition` holds, durably at `durability` (the
    /// table's default when `None`), and returns once a read would see it.
    ///
    /// On a cluster node the write goes to the cluster's leader, which decides it against the
    /// newest row; it is committed on a majority of the nodes (whatever `durability` says), and
    /// this returns once this node applied it.
    pub async fn write(
        self: &Arc<Self>,
        id: &str,
        write: Write,
        precondition: Precondition,
        durability: Option<Durability>,
    ) -> Result<Written, EngineError> {
        check_row_id(id)?;
        if let Some(replicator) = self.replicator.get() {
            return replicated::write_row(self, replicator, id, write, precondition).await;
        }
        let table = self.clone();
        let id = id.to_string();
        // Its own task: a caller that goes away cannot cut a write in half.
        let written =
            tokio::spawn(async move { table.write_all_now(vec![(id, write, precondition)], durability).await })
                .await
                .map_err(|error| EngineError::Internal(format!("a table write failed: {error}")))??;
        Ok(written.into_iter().next().expect("one write, one outcome"))
    }

    /// Performs `writes` (row id, write, precondition) all or none: each is decided against
    /// the rows as the writes before it in the list leave them, and if every one holds they
    /// are appended as one batch, which the log stores whole or not at all (a crash keeps none
    /// of them or every one). Answers each write's outcome, in order.
    ///
    /// A cluster node takes one write here (it goes to the leader as [`Table::write`] sends
    /// it); several at once are refused until the cluster replicates a batch of row writes.
    pub async fn write_all(
        self: &Arc<Self>,
        writes: Vec<(String, Write, Precondition)>,
        durability: Option<Durability>,
    ) -> Result<Vec<Written>, EngineError> {
        for (id, _, _) in &writes {
            check_row_id(id)?;
        }
        if self.replicator.get().is_some() {
            let mut writes = writes;
            return match (writes.pop(), writes.is_empty()) {
                (None, _) => Ok(Vec::new()),
                (Some((id, write, precondition)), true) => {
                    Ok(vec![self.write(&id, write, precondition, durability).await?])
                }
                (Some(_), false) => Err(EngineError::InvalidDefinition(format!(
                    "a statement writing several rows of {} at once is not atomic on a cluster yet: write one row \
                     per statement",
                    self.name()
                ))),
            };
        }
        let table = self.clone();
        // Its own task: a caller that goes away cannot cut the batch in half.
        tokio::spawn(async move { table.write_all_now(writes, durability).await })
            .await
            .map_err(|error| EngineError::Internal(format!("a table write failed: {error}")))?
    }

    async fn write_all_now(
        &self,
        writes: Vec<(String, Write, Precondition)>,
        durability: Option<Durability>,
    ) -> Result<Vec<Written>, EngineError> {
        if writes.is_empty() {
            return Ok(Vec::new());
        }
        let def = self.def();
        let durability = durability.unwrap_or(def.durability);
        let ordering = self.writer.lock().await;
        // The rows the batch has written so far, by id: later writes in it see them.
        let mut written: HashMap<String, Option<Arc<Map<String, Value>>>> = HashMap::new();
        let mut records = Vec::with_capacity(writes.len());
        let mut outcomes = Vec::with_capacity(writes.len());
        for (id, write, precondition) in writes {
            let (current, version) = match written.get(&id) {
                Some(doc) => (doc.clone(), None),
                None => {
                    let pending = self.pending.lock().expect("pending writes lock");
                    match pending.get(&id) {
                        Some(pending) => (pending.doc.clone(), None),
                        None => match self.get(&id) {
                            Some(row) => (Some(row.doc.clone()), Some(row.offset)),
                            None => (None, None),
                        },
                    }
                }
            };
            let (record, after) = compute_write(&def, &id, write, precondition, current.as_ref(), version)?;
            records.push(record);
            outcomes.push((id.clone(), current.is_none()));
            written.insert(id, after.map(Arc::new));
        }
        let queued = self.log.enqueue_with(&records, durability).await?;
        {
            let mut pending = self.pending.lock().expect("pending writes lock");
            for (id, doc) in &written {
                let entry = pending.entry(id.clone()).or_insert(Pending { count: 0, doc: None });
                entry.count += 1;
                entry.doc = doc.clone();
            }
        }
        drop(ordering);
        let result = self.finish(queued, records.len()).await;
        {
            let mut pending = self.pending.lock().expect("pending writes lock");
            for id in written.keys() {
                if let Some(entry) = pending.get_mut(id) {
                    entry.count -= 1;
                    if entry.count == 0 {
                        pending.remove(id);
                    }
                }
            }
        }
        let base = result?;
        Ok(outcomes
            .into_iter()
            .enumerate()
            .map(|(index, (id, created))| {
                let offset = base + index as u64;
                Written { offset, created, row: self.get(&id).filter(|row| row.offset == offset) }
            })
            .collect())
    }

    /// Waits for a queued batch of `count` records to be durable and applied; its first offset.
    async fn finish(&self, queued: onehop_log::QueuedAppend, count: usize) -> Result<u64, EngineError> {
        let base = queued.await?.base_offset;
        let last = base + count.max(1) as u64 - 1;
        // Visible once every earlier record is durable too (an `async` write can be acknowledged
        // before an earlier `fsync` one).
        self.log.wait_for(last).await?;
        while self.applied_offset() <= last {
            self.catch_up(1024)?;
        }
        Ok(base)
    }

    /// Adds the index `index` (its definition is already durable) and fills it.
    pub(crate) fn add_index(&self, def: TableDef, index: &IndexDef) {
        let mut state = self.state.write().expect("table state lock");
        let mut entries: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (id, row) in &state.rows {
            if let Some(value) = row.doc.get(&index.field) {
                for_each_key(value, |key| {
                    entries.entry(key.to_string()).or_default().insert(id.clone());
                });
            }
        }
        state.indexes.insert(index.field.clone(), entries);
        *self.def.write().expect("table def lock") = Arc::new(def);
    }

    /// Removes the index on `field` (its removal is already durable).
    pub(crate) fn remove_index(&self, def: TableDef, field: &str) {
        self.state.write().expect("table state lock").indexes.remove(field);
        *self.def.write().expect("table def lock") = Arc::new(def);
    }
}

/// RFC 7386: objects merge field by field, `null` removes a field, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("made an object");
    for (field, value) in patch {
        if value.is_null() {
            target.remove(field);
        } else {
            merge_patch(target.entry(field.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Refuses a row id that is empty or too long.
pub(crate) fn check_row_id(id: &str) -> Result<(), EngineError> {
    if id.is_empty() || id.len() > ROW_ID_BYTES_MAX {
        return Err(EngineError::InvalidRow(format!("a row id is 1 to {ROW_ID_BYTES_MAX} bytes")));
    }
    Ok(())
}

/// What `write` on row `id` of a table defined by `def` records, given the row's newest
/// state (`current`, at `version` when that is known): the record (without a timestamp) and
/// the row after it. Refused when `precondition` does not hold or the row does not fit `def`.
pub(crate) fn compute_write(
    def: &TableDef,
    id: &str,
    write: Write,
    precondition: Precondition,
    current: Option<&Arc<Map<String, Value>>>,
    version: Option<u64>,
) -> Result<(NewRecord, Option<Map<String, Value>>), EngineError> {
    let failed = |reason: &str| EngineError::PreconditionFailed {
        table: def.name.clone(),
        id: id.to_string(),
        reason: reason.to_string(),
        current: version,
    };
    match precondition {
        Precondition::None => {}
        Precondition::Exists if current.is_none() => return Err(failed("the row does not exist")),
        Precondition::Missing if current.is_some() => return Err(failed("the row exists")),
        Precondition::Version(wanted) if version != Some(wanted) || current.is_none() => {
            let reason = match (&current, version) {
                (None, _) => "the row does not exist".to_string(),
                (Some(_), None) => "the row is being changed by another write".to_string(),
                (Some(_), Some(now)) => format!("the row's version is {now}, not {wanted}"),
            };
            return Err(failed(&reason));
        }
        _ => {}
    }
    let after: Option<Map<String, Value>> = match write {
        Write::Put(mut row) => {
            def.check_row(id, &mut row)?;
            Some(row)
        }
        Write::Patch(patch) => {
            let Some(current) = current else {
                return Err(EngineError::RowNotFound { table: def.name.clone(), id: id.to_string() });
            };
            let mut row = Value::Object((**current).clone());
            merge_patch(&mut row, &Value::Object(patch));
            let Value::Object(mut row) = row else { unreachable!("a patch object keeps an object") };
            def.check_row(id, &mut row)?;
            Some(row)
        }
        Write::Delete => {
            if current.is_none() {
                return Err(EngineError::RowNotFound { table: def.name.clone(), id: id.to_string() });
            }
            None
        }
    };
    let (op, prev) = match (current, &after) {
        (None, _) => ("insert", None),
        (Some(before), Some(after)) => ("update", Some(filter::describe_change(before, after))),
        (Some(before), None) => ("delete", Some(Value::Object((**before).clone()))),
    };
    let mut headers = vec![(Text::from_static(OP_HEADER), Some(Bytes::from_static(op.as_bytes())))];
    if let Some(prev) = prev {
        let prev = Bytes::from(serde_json::to_vec(&prev).expect("JSON serializes"));
        headers.push((Text::from_static(PREV_HEADER), Some(prev)));
    }
    let value = after.as_ref().map(|row| Bytes::from(serde_json::to_vec(row).expect("JSON serializes")));
    let record =
        NewRecord { timestamp_ms: None, key: Some(Bytes::from(id.to_string())), subject: None, headers, value };
    Ok((record, after))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut row = json!({"a": "b", "c": {"d": "e", "f": "g"}, "keep": 1});
        merge_patch(&mut row, &json!({"a": "z", "c": {"f": null, "h": [1]}, "new": true}));
        assert_eq!(row, json!({"a": "z", "c": {"d": "e", "h": [1]}, "keep": 1, "new": true}));
        let mut row = json!({"a": 1});
        merge_patch(&mut row, &json!({"a": {"b": 2}}));
        assert_eq!(row, json!({"a": {"b": 2}}));
    }
}
