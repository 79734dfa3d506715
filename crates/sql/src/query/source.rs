//! A query's inputs and how each is read.
//!
//! A row of an input is a JSON object: a table's row as stored; a view's row (its key column,
//! window bounds and aggregates); a stream record's value fields beside `_key`, `_partition`,
//! `_offset`, `_time` (ms since the epoch) and `_subject` (a value that is not a JSON object is
//! `_value`); a subquery's or CTE's row of its output columns.
//!
//! Reads take the input's lock for one chunk at a time, so a query never holds up a writer for
//! longer than a chunk takes to copy.

use std::collections::BTreeMap;
use std::sync::Arc;

use onehop_engine::filter::{Condition, for_each_key, value_key};
use onehop_engine::view::View;
use onehop_engine::view::expr::key_text;
use onehop_engine::{Position, Stream, Table};
use serde_json::{Map, Value};

use super::Answer;
use super::budget::Budget;
use crate::SqlError;

/// Rows read under one lock.
const CHUNK_ROWS: usize = 1000;
/// Bytes of stream records read at once.
const CHUNK_BYTES: usize = 4 * 1024 * 1024;
/// The fields every stream row has.
pub(super) const STREAM_FIELDS: [&str; 5] = ["_key", "_partition", "_offset", "_time", "_subject"];

pub(super) enum Kind {
    /// A table, read through a transaction's uncommitted writes to it when there are any.
    Table(Arc<Table>, Option<Arc<Overlay>>),
    View(Arc<View>),
    Stream(Arc<Stream>),
    /// A subquery's or CTE's answer.
    Rows(Arc<Answer>),
}

/// A transaction's writes to one table, not yet committed: each row it wrote as it left it
/// (`None`: deleted). The transaction's own statements read the table through them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Overlay {
    pub table: String,
    pub rows: BTreeMap<String, Option<Map<String, Value>>>,
}

impl Overlay {
    /// The overlay for `table`, when it is the one written.
    pub(crate) fn of<'o>(overlay: Option<&'o Arc<Overlay>>, table: &str) -> Option<&'o Arc<Overlay>> {
        overlay.filter(|overlay| overlay.table == table)
    }
}

/// One input of a SELECT.
pub(super) struct Source {
    /// What the query calls it (its alias, or its name).
    pub alias: String,
    /// What it is: `table orders`, `view totals`, `subquery`.
    pub label: String,
    pub kind: Kind,
    /// The columns it is known to have, in order.
    pub known: Vec<String>,
    /// Whether its rows may have fields beyond `known` (JSON documents may).
    pub open: bool,
    /// Columns joined by USING to an input before it: unqualified, they name that input's.
    pub merged: Vec<String>,
}

/// How the rows of an input are found.
#[derive(Clone, Debug)]
pub(super) enum Access {
    /// Every row.
    Scan,
    /// The rows of these primary keys (a table) or keys (a view).
    Keys(Vec<Value>),
    /// A table's rows whose indexed `field` holds one of these values.
    Index { field: String, values: Vec<Value> },
    /// A stream's records from where a range starts to where it ends.
    Range(Range),
}

/// Where a stream's records are read, from the WHERE clause's bounds on its fields.
#[derive(Clone, Debug, Default)]
pub(super) struct Range {
    pub partition: Option<u32>,
    pub from_offset: Option<u64>,
    /// Exclusive.
    pub until_offset: Option<u64>,
    pub from_time: Option<i64>,
}

impl Range {
    pub(super) fn is_whole(&self) -> bool {
        self.partition.is_none()
            && self.from_offset.is_none()
            && self.until_offset.is_none()
            && self.from_time.is_none()
    }
}

/// How an input joined to the rows before it is probed, per row before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// By a table's primary key or a view's key.
    Key,
    /// By a table's index on the field.
    Index,
}

impl Source {
    /// A table's primary key, a view's key column: the field [`Access::Keys`] finds rows by.
    pub(super) fn key_field(&self) -> Option<String> {
        match &self.kind {
            Kind::Table(table, _) => Some(table.def().primary_key.clone()),
            Kind::View(view) => view.def().columns.iter().find_map(|column| match column {
                onehop_engine::view::Column::Key { name } => Some(name.clone()),
                _ => None,
            }),
            _ => None,
        }
    }

    /// Whether a table input has an index on `field`.
    pub(super) fn indexed(&self, field: &str) -> bool {
        matches!(&self.kind, Kind::Table(table, _) if table.def().index_on(field).is_some())
    }

    /// Whether it is a table whose primary key is text: a row found by a text key holds that
    /// very text as its key.
    pub(super) fn text_key(&self) -> bool {
        matches!(&self.kind, Kind::Table(table, _) if {
            let def = table.def();
            def.column(&def.primary_key).is_some_and(|column| column.ty == onehop_engine::ColumnType::Text)
        })
    }

    /// Whether it is a table (whose rows have one key each).
    pub(super) fn is_table(&self) -> bool {
        matches!(self.kind, Kind::Table(..))
    }

    pub(super) fn is_stream(&self) -> bool {
        matches!(self.kind, Kind::Stream(_))
    }

    /// Calls `each` with every row `access` finds until it answers false.
    pub(super) fn read(
        &self,
        access: &Access,
        budget: &mut Budget,
        each: &mut dyn FnMut(Doc, &mut Budget) -> Result<bool, SqlError>,
    ) -> Result<(), SqlError> {
        match (&self.kind, access) {
            (Kind::Table(table, overlay), Access::Keys(keys)) => {
                let def = table.def();
                for key in keys {
                    let Some(id) = def.id_of(key) else { continue };
                    let row = match overlay.as_ref().and_then(|overlay| overlay.rows.get(&id)) {
                        Some(pending) => pending.clone().map(Arc::new),
                        None => table.get_doc(&id),
                    };
                    if let Some(row) = row
                        && !each(row, budget)?
                    {
                        return Ok(());
                    }
                }
                Ok(())
            }
            (Kind::Table(table, overlay), Access::Index { field, values }) => {
                let overlay = overlay.as_deref();
                for value in values {
                    if !index_rows(table, overlay, field, value, budget, each)? {
                        return Ok(());
                    }
                }
                if let Some(overlay) = overlay {
                    for row in overlay.rows.values().flatten() {
                        let holds =
                            row.get(field).is_some_and(|held| values.iter().any(|value| index_holds(held, value)));
                        if holds && !each(Arc::new(row.clone()), budget)? {
                            return Ok(());
                        }
                    }
                }
                Ok(())
            }
            (Kind::Table(table, None), _) => {
                let mut after: Option<String> = None;
                loop {
                    let (docs, next) = table.docs_after(after.as_deref(), CHUNK_ROWS);
                    for doc in docs {
                        if !each(doc, budget)? {
                            return Ok(());
                        }
                    }
                    match next {
                        Some(next) => after = Some(next),
                        None => return Ok(()),
                    }
                }
            }
            (Kind::Table(table, overlay), _) => {
                let mut after: Option<String> = None;
                loop {
                    let page = table.query(&[], after.as_deref(), CHUNK_ROWS, true)?;
                    for row in &page.rows {
                        if overlay.as_ref().is_some_and(|overlay| overlay.rows.contains_key(&row.id)) {
                            continue;
                        }
                        if !each(row.shared_doc(), budget)? {
                            return Ok(());
                        }
                    }
                    match page.next_after {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                for row in overlay.iter().flat_map(|overlay| overlay.rows.values().flatten()) {
                    if !each(Arc::new(row.clone()), budget)? {
                        return Ok(());
                    }
                }
                Ok(())
            }
            (Kind::View(view), Access::Keys(keys)) => {
                view.serving()?;
                for key in keys {
                    for row in view.rows(&key_text(key)) {
                        if !each(doc(row), budget)? {
                            return Ok(());
                        }
                    }
                }
                Ok(())
            }
            (Kind::View(view), _) => {
                view.serving()?;
                let mut after: Option<String> = None;
                loop {
                    let page = view.page(after.as_deref(), CHUNK_ROWS);
                    let Some((last, _)) = page.last() else { return Ok(()) };
                    after = Some(last.clone());
                    for (_, rows) in page {
                        for row in rows {
                            if !each(doc(row), budget)? {
                                return Ok(());
                            }
                        }
                    }
                }
            }
            (Kind::Stream(stream), access) => {
                let range = match access {
                    Access::Range(range) => range.clone(),
                    _ => Range::default(),
                };
                read_stream(stream, &range, budget, each)
            }
            (Kind::Rows(answer), _) => {
                for row in &answer.rows {
                    if !each(doc(row_object(&answer.columns, row)), budget)? {
                        return Ok(());
                    }
                }
                Ok(())
            }
        }
    }

    /// Calls `each` with the rows whose key (`Probe::Key`) or indexed `field` holds `value`.
    pub(super) fn probe(
        &self,
        probe: Probe,
        field: &str,
        value: &Value,
        budget: &mut Budget,
        each: &mut dyn FnMut(Doc, &mut Budget) -> Result<bool, SqlError>,
    ) -> Result<(), SqlError> {
        if value.is_null() {
            return Ok(());
        }
        // A table's row by its key, as a join probes it once per row of the inputs before.
        if let (Probe::Key, Kind::Table(table, overlay)) = (probe, &self.kind) {
            let Some(id) = onehop_engine::TableDef::id_text(value) else { return Ok(()) };
            let row = match overlay.as_ref().and_then(|overlay| overlay.rows.get(&*id)) {
                Some(pending) => pending.clone().map(Arc::new),
                None => table.get_doc(&id),
            };
            if let Some(row) = row {
                each(row, budget)?;
            }
            return Ok(());
        }
        let access = match probe {
            Probe::Key => Access::Keys(vec![value.clone()]),
            Probe::Index => Access::Index { field: field.to_string(), values: vec![value.clone()] },
        };
        self.read(&access, budget, each)
    }
}

/// A row as a query reads it: an object, shared with where it was read (a table's rows are
/// its documents, not copies).
pub(super) type Doc = Arc<Map<String, Value>>;

/// A row made by the query (a view's, a record's, a subquery's) as a [`Doc`].
pub(super) fn doc(row: Value) -> Doc {
    match row {
        Value::Object(fields) => Arc::new(fields),
        _ => Arc::new(Map::new()),
    }
}

/// A row of output `columns` as the object later steps read it by name.
pub(super) fn row_object(columns: &[String], row: &[Value]) -> Value {
    let mut fields = Map::with_capacity(columns.len());
    for (column, value) in columns.iter().zip(row) {
        // A repeated name (two `id`s of a join) reads as the first.
        fields.entry(column.clone()).or_insert_with(|| value.clone());
    }
    Value::Object(fields)
}

/// The text an index is searched by for `value`; `None` when no row can hold it indexed.
fn index_text(value: &Value) -> Option<String> {
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(truth) => Some(truth.to_string()),
        _ => None,
    }
}

/// Whether a row whose indexed field holds `held` is found by the index under `value`: the
/// value itself, or one of the elements of an array.
fn index_holds(held: &Value, value: &Value) -> bool {
    let Some(wanted) = value_key(value) else { return false };
    let mut found = false;
    for_each_key(held, |key| found |= key == wanted);
    found
}

/// The rows of `table` whose indexed `field` may hold `value` (the condition is checked again
/// by the query), but for those `overlay` holds; false when `each` asked to stop.
fn index_rows(
    table: &Table,
    overlay: Option<&Overlay>,
    field: &str,
    value: &Value,
    budget: &mut Budget,
    each: &mut dyn FnMut(Doc, &mut Budget) -> Result<bool, SqlError>,
) -> Result<bool, SqlError> {
    let Some(text) = index_text(value) else { return Ok(true) };
    let Ok(condition) = Condition::new(field, &text) else { return Ok(true) };
    let conditions = [condition];
    let mut after: Option<String> = None;
    loop {
        let page = table.query(&conditions, after.as_deref(), CHUNK_ROWS, false)?;
        for row in &page.rows {
            if overlay.is_some_and(|overlay| overlay.rows.contains_key(&row.id)) {
                continue;
            }
            if !each(row.shared_doc(), budget)? {
                return Ok(false);
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => return Ok(true),
        }
    }
}

fn read_stream(
    stream: &Stream,
    range: &Range,
    budget: &mut Budget,
    each: &mut dyn FnMut(Doc, &mut Budget) -> Result<bool, SqlError>,
) -> Result<(), SqlError> {
    let name = stream.def().name.clone();
    let partitions: Vec<u32> = match range.partition {
        Some(partition) if partition < stream.def().partitions => vec![partition],
        Some(_) => Vec::new(),
        None => (0..stream.def().partitions).collect(),
    };
    for partition in partitions {
        // Records appended while the query runs are not read: the answer is of one moment.
        let mut end = stream.end_offset(partition)?;
        if let Some(until) = range.until_offset {
            end = end.min(until);
        }
        let mut next = stream.start_offset(partition)?;
        if let Some(from) = range.from_offset {
            next = next.max(from);
        }
        if let Some(time) = range.from_time {
            next = next.max(stream.resolve(partition, Position::Time(time))?);
        }
        while next < end {
            let records = stream.read(partition, Position::Offset(next), CHUNK_ROWS, CHUNK_BYTES)?;
            let Some(last) = records.last() else { break };
            next = last.offset + 1;
            budget.read_records(&name, records.len() as u64)?;
            for record in records.iter().take_while(|record| record.offset < end) {
                if !each(doc(stream_row(record, partition)), budget)? {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// A stream record as a row.
fn stream_row(record: &onehop_engine::Record, partition: u32) -> Value {
    let mut fields = match record.value.as_deref().map(serde_json::from_slice::<Value>) {
        Some(Ok(Value::Object(fields))) => fields,
        Some(Ok(other)) => Map::from_iter([("_value".to_string(), other)]),
        Some(Err(_)) => {
            let text = String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned();
            Map::from_iter([("_value".to_string(), Value::String(text))])
        }
        None => Map::new(),
    };
    let key = record.key.as_deref().map(|key| Value::String(String::from_utf8_lossy(key).into_owned()));
    fields.insert("_key".into(), key.unwrap_or(Value::Null));
    fields.insert("_partition".into(), Value::from(partition));
    fields.insert("_offset".into(), Value::from(record.offset));
    fields.insert("_time".into(), Value::from(record.timestamp_ms));
    fields.insert("_subject".into(), record.subject.as_deref().map_or(Value::Null, Value::from));
    Value::Object(fields)
}
