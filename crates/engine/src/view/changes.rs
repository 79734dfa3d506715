//! A view's change stream, written once per change across crashes.
//!
//! The change writer (a task of its own) appends the changes the view hands it, in order. A
//! checkpoint asks it for a *barrier*: the end of the change stream once every change handed
//! over before is written (to the OS: a crash of the process keeps it). That end goes into the
//! checkpoint beside the source positions, so a checkpoint says "the state after these source
//! records, whose changes end here".
//!
//! After a crash the view replays its source from the checkpoint, and the live run may have
//! written some of the replayed records' changes already. [`Written`] reads what the stream
//! holds past the checkpoint's end and counts it per row (key and window); the replay then
//! leaves out, per row, as many changes as were written, and each window's final once. The
//! n-th change of a row after a checkpoint is the n-th record of that row the view folded
//! after it, in whatever order the partitions were interleaved, so the changes written twice
//! are the first ones of each row and the row's last change is its value once every record is
//! in; no change is taken back, and none is lost. Until the replay has left out all it found,
//! the view writes no checkpoint: the one it started from stays the one a second crash
//! restarts from, and past that one's end the stream then holds, per row, the first changes of
//! the replay from it, whichever run wrote them.
//!
//! A view that loads its inputs again at every start instead (a joined view, a view over
//! tables) has no replay to compare: [`reconcile`] compares its rows once loaded with the
//! newest change of each key the stream holds, and writes what differs, so that the stream
//! ends where the view is whatever the crash cut short.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use onehop_log::{Durability, NewRecord};
use serde_json::Value;

use super::runtime::{change_parts, change_record};
use super::state::Change;
use crate::error::EngineError;
use crate::stream::Stream;

/// Batches of changes waiting for the change writer before the view waits for it.
const CHANGE_BATCHES_QUEUED: usize = 64;
/// Records one step of the scan for changes written after a checkpoint reads at most.
const SCAN_READ_RECORDS_MAX: usize = 1024;
/// Bytes that step reads at most: the scan's memory, whatever the backlog.
const SCAN_READ_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Rows of the view compared at a time by [`reconcile`].
const RECONCILE_PAGE: usize = 1024;

enum ToWriter {
    Changes(Vec<Change>),
    Barrier(tokio::sync::oneshot::Sender<u64>),
}

/// The task that appends a view's changes to its change stream, in the order sent. Writing
/// them out (a JSON value each, then a log batch) overlaps with the view folding the next
/// events: when 10 000 windows close at once, their finals are encoded on the other core. The
/// channel is bounded, so a writer that falls behind holds the view back.
pub(super) struct ChangeWriter {
    sender: tokio::sync::mpsc::Sender<ToWriter>,
    task: tokio::task::JoinHandle<()>,
}

impl ChangeWriter {
    pub fn start(view: &str, output: &Arc<Stream>) -> ChangeWriter {
        let (sender, mut receiver) = tokio::sync::mpsc::channel::<ToWriter>(CHANGE_BATCHES_QUEUED);
        let output = output.clone();
        let name = view.to_string();
        let task = tokio::spawn(async move {
            // Registered once: a labelled `counter!` builds and looks up its key on every call.
            let changes_total = metrics::counter!("view_changes_total", "view" => name.clone());
            // The newest append: appends to one partition are written in order, so once it is,
            // every earlier one is too.
            let mut newest = None;
            while let Some(message) = receiver.recv().await {
                match message {
                    ToWriter::Changes(changes) => {
                        let records: Vec<NewRecord> =
                            changes.into_iter().map(|change| change_record(&name, change)).collect();
                        changes_total.increment(records.len() as u64);
                        // The change stream is derived: written without fsync, and not awaited
                        // here, so the next batch is encoded meanwhile.
                        match output.enqueue_to(0, &records, Some(Durability::Async)).await {
                            Ok(ack) => newest = Some(ack),
                            Err(error) => tracing::warn!(view = name, %error, "view changes could not be written"),
                        }
                    }
                    ToWriter::Barrier(reply) => {
                        if let Some(ack) = newest.take()
                            && let Err(error) = ack.await
                        {
                            tracing::warn!(view = name, %error, "view changes could not be written");
                        }
                        let _ = reply.send(output.end_offsets().first().copied().unwrap_or(0));
                    }
                }
                if !receiver.is_empty() {
                    // A backlog (a burst of window finals): one batch per turn, so writing it
                    // out does not keep the worker thread from the hub and the subscribers.
                    tokio::task::yield_now().await;
                }
            }
        });
        ChangeWriter { sender, task }
    }

    /// Hands `changes` over (waiting while the writer is behind).
    pub async fn send(&self, changes: Vec<Change>) {
        // Fails only once the writer is gone, which is when the view stops.
        let _ = self.sender.send(ToWriter::Changes(changes)).await;
    }

    /// Asks for the change stream's end once everything sent so far is written; the answer
    /// comes later (`None` if the writer stopped first).
    pub async fn barrier(&self) -> impl Future<Output = Option<u64>> + Send + 'static {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let _ = self.sender.send(ToWriter::Barrier(reply)).await;
        async move { answer.await.ok() }
    }

    /// Writes what was sent, then stops.
    pub async fn close(self) {
        drop(self.sender);
        let _ = self.task.await;
    }
}

/// What a view's change stream holds past a checkpoint: per row (key, window start), the
/// changes written, and the finals.
#[derive(Debug, Default)]
pub(super) struct Written {
    counts: HashMap<(String, Option<i64>), u64>,
    finals: HashSet<(String, Option<i64>)>,
}

impl Written {
    /// Reads `output` from offset `from` to its end, a bounded step at a time.
    pub fn scan(view: &str, output: &Stream, from: u64) -> Result<Written, EngineError> {
        let mut written = Written::default();
        let mut changes = 0u64;
        each_change(output, from, |key, is_final, _, fields| {
            written.add(key, is_final, window_start(fields));
            changes += 1;
        })?;
        if changes > 0 {
            tracing::info!(
                view,
                changes,
                "found changes written after the last checkpoint: the replay does not write them again"
            );
        }
        Ok(written)
    }

    fn add(&mut self, key: String, is_final: bool, window_start: Option<i64>) {
        if is_final {
            self.finals.insert((key, window_start));
        } else {
            *self.counts.entry((key, window_start)).or_default() += 1;
        }
    }

    /// What is still to be left out once the replay has caught up: only finals (a window the
    /// live run closed by the wall clock closes again later); `None` when nothing is.
    pub fn caught_up(mut self) -> Option<Written> {
        self.counts.clear();
        (!self.finals.is_empty()).then_some(self)
    }

    /// Leaves out of `changes` (the replay's, in order) those the stream has already.
    pub fn filter(&mut self, changes: &mut Vec<Change>) {
        if self.counts.is_empty() && self.finals.is_empty() {
            return;
        }
        changes.retain(|change| {
            let row = (change.key.clone(), change.row.get("window_start").and_then(Value::as_i64));
            if change.is_final {
                return !self.finals.remove(&row);
            }
            match self.counts.get_mut(&row) {
                Some(count) => {
                    *count -= 1;
                    if *count == 0 {
                        self.counts.remove(&row);
                    }
                    false
                }
                None => true,
            }
        });
    }
}

/// The changes that take a view's change stream from where it ends to the view's rows: each row
/// (from `page`, the view's pages in key order) that is not the newest change of its key in
/// `output`, and a removal of each key whose newest change is a row the view no longer has. A
/// change stream that holds nothing (a view just created) is left so: a view's first rows are
/// history, as a first backfill's are. A key unchanged for longer than the stream keeps its
/// changes is written again.
pub(super) fn reconcile(
    view: &str,
    output: &Stream,
    page: impl Fn(Option<&str>, usize) -> Vec<(String, Vec<Value>)>,
) -> Result<Vec<Change>, EngineError> {
    let log = output.partition(0)?;
    if log.end_offset() == log.start_offset() {
        return Ok(Vec::new());
    }
    let mut last: HashMap<String, Value> = HashMap::new();
    each_change(output, 0, |key, _, removed, fields| match (removed, row_of(fields)) {
        (false, Some(row)) => {
            last.insert(key, row);
        }
        _ => {
            last.remove(&key);
        }
    })?;
    let mut changes = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let rows = page(after.as_deref(), RECONCILE_PAGE);
        let Some((newest, _)) = rows.last() else { break };
        after = Some(newest.clone());
        for (key, rows) in rows {
            let Some(mut row) = rows.into_iter().next() else { continue };
            if let Value::Object(fields) = &mut row {
                fields.remove("final");
            }
            let was = last.remove(&key);
            if was.as_ref() != Some(&row) {
                let before = was.map(Arc::new);
                changes.push(Change { key, row: Arc::new(row), is_final: false, removed: false, before });
            }
        }
    }
    let mut gone: Vec<(String, Value)> = last.into_iter().collect();
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    changes.extend(gone.into_iter().map(|(key, row)| Change {
        key,
        row: Arc::new(row),
        is_final: false,
        removed: true,
        before: None,
    }));
    if !changes.is_empty() {
        tracing::info!(
            view,
            changes = changes.len(),
            "the change stream was behind the view's rows: writing what differs"
        );
    }
    Ok(changes)
}

/// Calls `change` with each change `output` holds from offset `from` (or its start) to its
/// end: its key, whether it is final, whether it removed its row, and its fields as
/// [`change_parts`] gives them. Read a bounded step at a time.
fn each_change(
    output: &Stream,
    from: u64,
    mut change: impl FnMut(String, bool, bool, &[u8]),
) -> Result<(), EngineError> {
    let log = output.partition(0)?;
    let end = log.end_offset();
    let mut next = from.max(log.start_offset());
    while next < end {
        let records = log.read(next, SCAN_READ_RECORDS_MAX, SCAN_READ_BYTES_MAX)?;
        let Some(last) = records.last() else { break };
        next = last.offset + 1;
        for record in &records {
            let (Some(key), Some(value)) = (&record.key, &record.value) else { continue };
            let Some(parts) = change_parts(value) else { continue };
            change(String::from_utf8_lossy(key).into_owned(), parts.is_final, parts.removed, parts.fields);
        }
    }
    Ok(())
}

/// A change's row, from its fields as [`change_parts`] gives them.
fn row_of(fields: &[u8]) -> Option<Value> {
    let mut object = Vec::with_capacity(fields.len() + 1);
    object.push(b'{');
    object.extend_from_slice(fields);
    serde_json::from_slice(&object).ok()
}

/// `window_start` of a change's row, from its fields as [`change_parts`] gives them.
fn window_start(fields: &[u8]) -> Option<i64> {
    if fields == b"}" {
        return None;
    }
    row_of(fields)?.get("window_start").and_then(Value::as_i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn change(key: &str, row: Value, is_final: bool) -> Change {
        Change { key: key.into(), row: Arc::new(row), is_final, removed: false, before: None }
    }

    #[test]
    fn the_replay_leaves_out_as_many_changes_per_row_as_were_written_and_each_final_once() {
        let mut written = Written::default();
        for (key, is_final, start) in
            [("a", false, None), ("a", false, None), ("b", false, Some(10)), ("b", true, Some(10))]
        {
            written.add(key.into(), is_final, start);
        }
        let mut changes = vec![
            change("a", json!({"n": 5}), false),
            change("b", json!({"n": 1, "window_start": 10}), false),
            change("a", json!({"n": 6}), false),
            change("b", json!({"n": 1, "window_start": 20}), false),
            change("a", json!({"n": 7}), false),
            change("b", json!({"n": 2, "window_start": 10}), true),
            change("b", json!({"n": 2, "window_start": 10}), true),
        ];
        written.filter(&mut changes);
        let kept: Vec<String> = changes.iter().map(|change| format!("{} {}", change.key, change.row)).collect();
        // a: two written, the third is new; b@10: one change and its final written; b@20 new.
        assert_eq!(kept, [r#"b {"n":1,"window_start":20}"#, r#"a {"n":7}"#, r#"b {"n":2,"window_start":10}"#]);
        assert!(written.counts.is_empty() && written.finals.is_empty());
        assert!(written.caught_up().is_none(), "nothing left to leave out");
        // Caught up: the counts of replayed records are done with; a final still closes later.
        let mut written = Written::default();
        written.add("a".into(), false, None);
        written.add("b".into(), true, Some(10));
        let mut written = written.caught_up().expect("a final is left");
        let mut changes =
            vec![change("a", json!({"n": 9}), false), change("b", json!({"n": 2, "window_start": 10}), true)];
        written.filter(&mut changes);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].key, "a");
    }

    #[test]
    fn window_starts_read_from_a_change_value() {
        let value = super::super::runtime::change_value(&change("k", json!({"n": 1, "window_start": 42}), false));
        let fields = change_parts(&value).unwrap().fields;
        assert_eq!(window_start(fields), Some(42));
        let value = super::super::runtime::change_value(&change("k", json!({}), false));
        assert_eq!(window_start(change_parts(&value).unwrap().fields), None);
    }
}
