//! A joined view's task: every input's rows first (a table's as they are now, a view's once it
//! has restored), then every input's changes as they come, one at a time, each turned into the
//! output rows it changes. The state is rebuilt like this at every start: the inputs are in
//! memory, so a joined view has no checkpoint.

use std::sync::Arc;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use serde_json::Value;

use super::state::JoinState;
use super::{JoinDef, STREAM_KEY_COLUMN};
use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::{Cursor, Delivery, Hub};
use crate::stream::Stream;
use crate::table::Table;
use crate::view::View;
use crate::view::catchup::{follow, restored};
use crate::view::changes::{ChangeWriter, reconcile};
use crate::view::expr::Input;
use crate::view::runtime::{ViewStatus, change_parts, register_metrics};
use crate::view::state::Change;

/// Rows loaded into the state before the task lets others run.
const LOAD_CHUNK: usize = 4096;
/// Records one step of reading a stream input at start reads at most.
const LOAD_READ_RECORDS_MAX: usize = 4096;
/// Bytes of keys and values that step reads at most.
const LOAD_READ_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Output changes gathered from the inputs' ready changes before they are written.
const CHANGES_PER_BATCH: usize = 4096;
/// Driving rows one input change is applied to at a time (see `take_joined`).
const FANOUT_BATCH: usize = 1024;
/// How often a joined view looks whether a view it reads has restored, before loading it.
const RESTORE_POLL: Duration = Duration::from_millis(20);

/// Where a joined view's changes go: the change writer, and what is gathered for it.
struct Out<'a> {
    writer: &'a ChangeWriter,
    changes: &'a mut Vec<Change>,
    late: &'a mut Vec<onehop_log::NewRecord>,
}

/// One input of a joined view.
pub(crate) enum JoinSource {
    Table(Arc<Table>),
    /// A view without windows: one row per key.
    View(Arc<View>),
    /// A stream as a table (Kafka Streams' KTable): each key's newest record is its row, the
    /// value's fields with the key as [`STREAM_KEY_COLUMN`]; a record without a value (a
    /// tombstone) deletes it, and one whose value is not a JSON object is left out.
    Stream(Arc<Stream>),
}

impl JoinSource {
    /// Where this input's changes are: a table's storage, a view's change stream, the stream.
    fn changes(&self) -> &Arc<Stream> {
        match self {
            JoinSource::Table(table) => table.storage(),
            JoinSource::View(view) => view.output(),
            JoinSource::Stream(stream) => stream,
        }
    }
}

/// What a stream input's record does to its key's row: `Some(None)` deletes it, `None` leaves
/// it be (a value that is not a JSON object).
fn stream_row(key: &str, value: Option<&[u8]>) -> Option<Option<Value>> {
    let Some(value) = value else { return Some(None) };
    let Ok(Value::Object(mut fields)) = serde_json::from_slice::<Value>(value) else { return None };
    fields.insert(STREAM_KEY_COLUMN.to_string(), Value::String(key.to_string()));
    Some(Some(Value::Object(fields)))
}

/// What a joined view keeps beside the view itself.
pub(crate) struct Joined {
    sources: Vec<JoinSource>,
    pub(crate) state: RwLock<JoinState>,
    /// Input changes applied since the start.
    applied: AtomicU64,
    /// Set when the state passed its cap: (bytes, cap). The view then stops.
    over: std::sync::Mutex<Option<(u64, u64)>>,
}

impl Joined {
    pub(crate) fn new(def: &JoinDef, sources: Vec<JoinSource>) -> Joined {
        Joined {
            sources,
            state: RwLock::new(JoinState::new(def)),
            applied: AtomicU64::new(0),
            over: std::sync::Mutex::new(None),
        }
    }

    /// Refuses reads of a view that stopped at its state cap.
    pub(crate) fn serving(&self, view: &str) -> Result<(), EngineError> {
        match *self.over.lock().expect("view cap lock") {
            Some((bytes, max)) => Err(EngineError::ViewStateLimit { view: view.to_string(), bytes, max }),
            None => Ok(()),
        }
    }

    /// Whether the state is past its cap; if so the view is marked stopped and the log says so.
    fn over_cap(&self, view: &str) -> bool {
        let state = self.state.read().expect("view state lock");
        let (bytes, Some(max)) = (state.bytes() as u64, state.state_bytes_max()) else { return false };
        if bytes <= max {
            return false;
        }
        *self.over.lock().expect("view cap lock") = Some((bytes, max));
        tracing::error!(
            view,
            bytes,
            state_bytes_max = max,
            "the view stopped: its state is over its state_bytes_max (reads answer view_state_limit)"
        );
        true
    }

    /// The change stream of the driving input.
    pub(crate) fn first_changes(&self) -> &Arc<Stream> {
        self.sources[0].changes()
    }

    pub(crate) fn status(&self, state: &JoinState, restoring: bool) -> ViewStatus {
        ViewStatus {
            keys: state.output_count(),
            events: self.applied.load(Ordering::Relaxed),
            late_events: 0,
            invalid_events: 0,
            restoring,
            inputs: Some(state.inputs()),
        }
    }

    /// Publishes the state's size per input.
    fn export_metrics(&self, view: &str) {
        let state = self.state.read().expect("view state lock");
        for input in state.inputs() {
            let labels = [("view", view.to_string()), ("input", input.alias)];
            metrics::gauge!("view_state_rows", &labels).set(input.rows as f64);
            metrics::gauge!("view_state_bytes", &labels).set(input.bytes as f64);
        }
        metrics::gauge!("view_read_rows_bytes", "view" => view.to_string()).set(state.computed_bytes() as f64);
    }
}

impl View {
    /// Loads every input, then follows their changes until the view stops.
    pub(in crate::view) async fn run_join(&self, hub: Arc<Hub>) -> Result<(), EngineError> {
        let joined = self.join.as_ref().expect("run_join runs joined views");
        register_metrics(self.name());
        let mut stop = self.stop.receiver();
        let started = Instant::now();
        let mut positions: Vec<Vec<u64>> = Vec::with_capacity(joined.sources.len());
        let mut loaded = 0u64;
        tracing::info!(view = self.name(), inputs = joined.sources.len(), "view restoring: loading its inputs");
        for (at, source) in joined.sources.iter().enumerate() {
            match source {
                JoinSource::Table(table) => {
                    let (rows, next) = table.snapshot(&Filter::default());
                    loaded += rows.len() as u64;
                    for chunk in rows.chunks(LOAD_CHUNK) {
                        {
                            let mut state = joined.state.write().expect("view state lock");
                            for row in chunk {
                                state.load(at, &row.id, &Value::Object(row.doc().clone()));
                            }
                        }
                        if joined.over_cap(self.name()) {
                            self.restoring.store(false, Ordering::Relaxed);
                            return Ok(());
                        }
                        tokio::task::yield_now().await;
                    }
                    positions.push(vec![next]);
                }
                JoinSource::Stream(stream) => {
                    let (rows, ends) = newest_per_key(stream)?;
                    loaded += rows.len() as u64;
                    for chunk in rows.chunks(LOAD_CHUNK) {
                        {
                            let mut state = joined.state.write().expect("view state lock");
                            for (key, row) in chunk {
                                state.load(at, key, row);
                            }
                        }
                        if joined.over_cap(self.name()) {
                            self.restoring.store(false, Ordering::Relaxed);
                            return Ok(());
                        }
                        tokio::task::yield_now().await;
                    }
                    positions.push(ends);
                }
                JoinSource::View(view) => {
                    // Its rows are whole once it has restored; its changes are written from then on.
                    while view.status().restoring {
                        tokio::select! {
                            () = tokio::time::sleep(RESTORE_POLL) => {}
                            _ = stop.changed() => return Ok(()),
                        }
                    }
                    let (rows, end) = view.snapshot();
                    loaded += rows.len() as u64;
                    {
                        let mut state = joined.state.write().expect("view state lock");
                        for (key, rows) in &rows {
                            if let Some(row) = rows.first() {
                                state.load(at, key, row);
                            }
                        }
                    }
                    if joined.over_cap(self.name()) {
                        self.restoring.store(false, Ordering::Relaxed);
                        return Ok(());
                    }
                    positions.push(vec![end]);
                }
            }
        }
        joined.state.write().expect("view state lock").recount();
        if self.def().aggregates_join() {
            self.aggregate_joined_rows(joined).await;
        }
        restored("view", self.name(), loaded, started);
        self.restoring.store(false, Ordering::Relaxed);
        joined.export_metrics(self.name());
        let mut cursors = Vec::with_capacity(positions.len());
        for (source, position) in joined.sources.iter().zip(positions) {
            cursors.push(follow(&hub, source.changes(), position)?);
        }
        let writer = ChangeWriter::start(self.name(), self.output());
        // What a crash kept the change stream from writing, written now.
        let behind = reconcile(self.name(), self.output(), |after, limit| self.page(after, limit))?;
        if !behind.is_empty() {
            writer.send(behind).await;
        }
        let (mut changes, mut late) = (Vec::new(), Vec::new());
        loop {
            let next = {
                let waiting = cursors
                    .iter_mut()
                    .enumerate()
                    .map(|(at, cursor)| Box::pin(async move { (at, cursor.next().await) }));
                tokio::select! {
                    ((at, delivery), _, _) = futures_util::future::select_all(waiting) => Some((at, delivery)),
                    _ = stop.changed() => None,
                }
            };
            let Some((at, delivery)) = next else {
                writer.close().await;
                return Ok(());
            };
            let mut out = Out { writer: &writer, changes: &mut changes, late: &mut late };
            self.take_joined(joined, at, delivery?, &mut cursors, &hub, &mut out).await?;
            // Whatever else is ready now, before writing: one append for many changes.
            while out.changes.len() < CHANGES_PER_BATCH {
                let mut more = false;
                for at in 0..cursors.len() {
                    if let Some(delivery) = cursors[at].next().now_or_never() {
                        self.take_joined(joined, at, delivery?, &mut cursors, &hub, &mut out).await?;
                        more = true;
                    }
                }
                if !more {
                    break;
                }
            }
            joined.export_metrics(self.name());
            self.publish(&writer, &mut changes, &mut late).await;
            if joined.over_cap(self.name()) {
                writer.close().await;
                return Ok(());
            }
        }
    }

    /// Applies one delivery of input `at`. A change that reaches more than [`FANOUT_BATCH`]
    /// driving rows is applied a batch at a time, each batch's changes written before the next
    /// is computed and the task yielding between them: its memory is one batch's, and other
    /// views, subscribers and reads go on meanwhile.
    async fn take_joined(
        &self,
        joined: &Joined,
        at: usize,
        delivery: Delivery,
        cursors: &mut [Cursor],
        hub: &Arc<Hub>,
        out: &mut Out<'_>,
    ) -> Result<(), EngineError> {
        match delivery {
            Delivery::Event(event, _) => {
                let Some(key) = event.record.key.as_deref() else { return Ok(()) };
                let id = String::from_utf8_lossy(key);
                let after = match &joined.sources[at] {
                    JoinSource::Table(_) => event.doc().cloned(),
                    JoinSource::View(_) => view_row(event.record.value.as_deref()),
                    JoinSource::Stream(_) => match stream_row(&id, event.record.value.as_deref()) {
                        Some(row) => row,
                        None => return Ok(()),
                    },
                };
                joined.applied.fetch_add(1, Ordering::Relaxed);
                let pending = joined.state.write().expect("view state lock").begin(at, &id, after.as_ref());
                let Some(mut pending) = pending else { return Ok(()) };
                let aggregates = self.def().aggregates_join();
                loop {
                    let done = if aggregates {
                        let mut rows = Vec::new();
                        let done =
                            joined.state.write().expect("view state lock").step(&mut pending, FANOUT_BATCH, &mut rows);
                        self.aggregate(rows, out.changes);
                        done
                    } else {
                        joined.state.write().expect("view state lock").step(&mut pending, FANOUT_BATCH, out.changes)
                    };
                    if done {
                        break;
                    }
                    self.publish(out.writer, out.changes, out.late).await;
                    tokio::task::yield_now().await;
                }
            }
            Delivery::Overflow { positions } => {
                // Fell behind the live feed: read on from the log.
                cursors[at] = follow(hub, joined.sources[at].changes(), positions)?;
            }
        }
        Ok(())
    }
}

impl View {
    /// A view aggregating a join, at start: every joined row folded in, a page at a time, the
    /// task yielding between pages. Its changes are not written: the change stream is then
    /// reconciled with the rows, as a view over a table's is.
    async fn aggregate_joined_rows(&self, joined: &Joined) {
        let mut after: Option<String> = None;
        loop {
            let page = joined.state.read().expect("view state lock").page(after.as_deref(), LOAD_CHUNK);
            let Some((last, _)) = page.last() else { return };
            after = Some(last.clone());
            let mut changes = Vec::new();
            {
                let mut state = self.state.write().expect("view state lock");
                for row in page.iter().flat_map(|(_, rows)| rows) {
                    state.apply_row_change(self.def(), None, Some(&Input::row(row)), &mut changes);
                    changes.clear();
                }
            }
            tokio::task::yield_now().await;
        }
    }

    /// Folds the join's row changes into a view aggregating them: a row removed leaves its
    /// group, a changed one leaves with its old values and joins with its new. Each group they
    /// touch changes once (its row before them, and after), in `changes`.
    fn aggregate(&self, rows: Vec<Change>, changes: &mut Vec<Change>) {
        if rows.is_empty() {
            return;
        }
        let mut steps = Vec::new();
        {
            let mut state = self.state.write().expect("view state lock");
            for change in rows {
                let (before, after) =
                    if change.removed { (Some(change.row), None) } else { (change.before, Some(change.row)) };
                let before = before.as_deref().map(Input::row);
                let after = after.as_deref().map(Input::row);
                state.apply_row_change(self.def(), before.as_ref(), after.as_ref(), &mut steps);
            }
        }
        changes.extend(coalesce(steps));
    }
}

/// One change per key from several in order: the row the first replaced, and the last row
/// (none when the last removed it); a key back as it was has none.
fn coalesce(steps: Vec<Change>) -> Vec<Change> {
    /// A key's changes: where it first changed, its row before, its row after.
    struct Span {
        first: usize,
        was: Option<Arc<Value>>,
        now: Option<Arc<Value>>,
    }
    if steps.len() < 2 {
        return steps;
    }
    let mut keys: std::collections::HashMap<String, Span> = std::collections::HashMap::new();
    for step in steps {
        let now = (!step.removed).then(|| step.row.clone());
        let first = keys.len();
        keys.entry(step.key).and_modify(|span| span.now.clone_from(&now)).or_insert_with(|| Span {
            first,
            was: if step.removed { Some(step.row) } else { step.before },
            now,
        });
    }
    let mut ordered: Vec<(String, Span)> = keys.into_iter().collect();
    ordered.sort_by_key(|(_, span)| span.first);
    ordered
        .into_iter()
        .filter_map(|(key, Span { was, now, .. })| match (was, now) {
            (was, Some(row)) if was.as_ref() != Some(&row) => {
                Some(Change { key, row, is_final: false, removed: false, before: was })
            }
            (Some(was), None) => Some(Change { key, row: was, is_final: false, removed: true, before: None }),
            _ => None,
        })
        .collect()
}

/// Rows by id, in id order.
type Rows = Vec<(String, Value)>;

/// A stream's rows as a table: the newest record of each key that has a row (in key order),
/// read a bounded step at a time, and where the stream ended then.
fn newest_per_key(stream: &Stream) -> Result<(Rows, Vec<u64>), EngineError> {
    let mut rows: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
    let mut ends = Vec::with_capacity(stream.partition_count() as usize);
    for partition in 0..stream.partition_count() {
        let log = stream.partition(partition)?;
        let end = log.end_offset();
        let mut next = log.start_offset();
        while next < end {
            let records = log.read(next, LOAD_READ_RECORDS_MAX, LOAD_READ_BYTES_MAX)?;
            let Some(last) = records.last() else { break };
            next = last.offset + 1;
            for record in records.iter().filter(|record| record.offset < end) {
                let Some(key) = record.key.as_deref() else { continue };
                let key = String::from_utf8_lossy(key).into_owned();
                match stream_row(&key, record.value.as_deref()) {
                    Some(Some(row)) => {
                        rows.insert(key, row);
                    }
                    Some(None) => {
                        rows.remove(&key);
                    }
                    None => {}
                }
            }
        }
        ends.push(end);
    }
    Ok((rows.into_iter().collect(), ends))
}

/// A view's row as its change record has it: `None` when the row was removed.
fn view_row(value: Option<&[u8]>) -> Option<Value> {
    let value = value?;
    let parts = change_parts(value)?;
    if parts.removed {
        return None;
    }
    let row = [b"{".as_slice(), parts.fields].concat();
    serde_json::from_slice(&row).ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::view::runtime::change_value;

    #[test]
    fn a_key_changed_several_times_changes_once() {
        let row = |n: i64| Arc::new(json!({ "n": n }));
        let change = |key: &str, row: Arc<Value>, removed, before: Option<Arc<Value>>| Change {
            key: key.into(),
            row,
            is_final: false,
            removed,
            before,
        };
        let steps = vec![
            change("a", row(2), false, Some(row(1))),
            change("b", row(1), false, None),
            change("a", row(3), false, Some(row(2))),
            change("b", row(1), true, None),
            change("c", row(5), true, None),
            change("c", row(6), false, None),
            change("d", row(1), false, Some(row(0))),
            change("d", row(0), false, Some(row(1))),
        ];
        let out = coalesce(steps);
        assert_eq!(
            out,
            vec![change("a", row(3), false, Some(row(1))), change("c", row(6), false, Some(row(5)))],
            "b came and went, d is back as it was"
        );
        let one = vec![change("a", row(2), false, Some(row(1)))];
        assert_eq!(coalesce(one.clone()), one);
    }

    #[test]
    fn a_view_input_reads_rows_from_change_records() {
        let row = json!({"product": "p1", "n": 2});
        let change =
            |removed| Change { key: "p1".into(), row: Arc::new(row.clone()), is_final: false, removed, before: None };
        assert_eq!(view_row(Some(&change_value(&change(false)))), Some(row.clone()));
        assert_eq!(view_row(Some(&change_value(&change(true)))), None);
        assert_eq!(view_row(None), None);
    }
}
