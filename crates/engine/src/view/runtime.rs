//! A running view: one task reads its source (history, then live) through the hub, folds each
//! record into the view's state, closes windows on time, appends every change to the view's
//! change stream (what subscriptions follow), and checkpoints state and source positions about
//! once a second. Point reads take the state's read lock: memory only, no disk.
//!
//! Recovery: the task starts from the last checkpoint's positions and state and replays the
//! source from there. Windows close by the records' arrival times while replaying and by the
//! wall clock once caught up, so the replay decides every window as the live run did (see
//! `state`). Changes are pushed once the view has caught up.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
// Not `timeout(ZERO, …)`: a zero timer still waits for the timer wheel's next tick (1 ms).
use futures_util::FutureExt;
use onehop_log::{Durability, NewRecord, Partition, PartitionConfig, Record};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ViewDef;
use super::catchup::{Catchup, follow, restored};
use super::expr::{Input, parse_value};
use super::state::{Applied, Change, ViewState};
use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::{Cursor, Delivery, Hub};
use crate::stream::Stream;
use crate::table::Table;

/// The compacted topic of view and transform checkpoints: key = view name (a transform's is
/// `transform/{name}`), newest per key wins.
pub const CHECKPOINT_TOPIC: &str = "__view_checkpoints";
/// The change stream of view `name` is the topic `__view.{name}`.
pub const OUTPUT_PREFIX: &str = "__view.";
/// How often a view's state is checkpointed while it changes.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Records folded before the task lets others run (a backfill reads without waiting).
const YIELD_EVERY: usize = 512;
const CHECKPOINT_VERSION: u32 = 1;

pub(crate) fn checkpoint_config() -> PartitionConfig {
    PartitionConfig {
        compacted: true,
        durability: Durability::Fsync,
        segment_bytes_max: 256 * 1024 * 1024,
        record_bytes_max: 128 * 1024 * 1024,
        batch_bytes_max: 128 * 1024 * 1024,
        queue_bytes_max: 256 * 1024 * 1024,
        ..PartitionConfig::default()
    }
}

/// A view's change stream: appended without fsync (it is derived, and rebuilt by replay),
/// kept an hour or 256 MiB.
pub(crate) fn output_config(defaults: &PartitionConfig) -> PartitionConfig {
    PartitionConfig {
        durability: Durability::Async,
        retention_ms: Some(3_600_000),
        retention_bytes: Some(256 * 1024 * 1024),
        segment_bytes_max: 16 * 1024 * 1024,
        ..defaults.clone()
    }
}

/// What a checkpoint holds: the source positions (next offset per partition) and the state
/// after everything before them.
#[derive(Serialize, Deserialize)]
pub(crate) struct Checkpoint {
    version: u32,
    pub positions: Vec<u64>,
    pub state: ViewState,
}

impl Checkpoint {
    pub fn new(positions: Vec<u64>, state: ViewState) -> Checkpoint {
        Checkpoint { version: CHECKPOINT_VERSION, positions, state }
    }

    pub fn record(&self, view: &str) -> NewRecord {
        let value = serde_json::to_vec(self).expect("a checkpoint serializes");
        NewRecord::keyed(Bytes::from(view.to_string()), value)
    }
}

impl Checkpoint {
    /// A view's checkpoint as stored; `None` (and a warning) when it cannot be read, and the
    /// view replays from its start instead.
    pub fn parse(view: &str, value: &[u8]) -> Option<Checkpoint> {
        match serde_json::from_slice::<Checkpoint>(value) {
            Ok(checkpoint) if checkpoint.version == CHECKPOINT_VERSION => Some(checkpoint),
            _ => {
                tracing::warn!(view, "skipping an unreadable view checkpoint");
                None
            }
        }
    }
}

/// The newest checkpoint of every view and transform, as stored (key → value; a deleted one is
/// absent).
pub(crate) fn read_checkpoints(partition: &Partition) -> Result<HashMap<String, Bytes>, EngineError> {
    let mut checkpoints = HashMap::new();
    let end = partition.end_offset();
    let mut next = partition.start_offset();
    while next < end {
        let records = partition.read(next, 64, 256 * 1024 * 1024)?;
        let Some(last) = records.last() else { break };
        next = last.offset + 1;
        for record in records {
            let Some(key) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) else { continue };
            match record.value {
                None => checkpoints.remove(key),
                Some(value) => checkpoints.insert(key.to_string(), value),
            };
        }
    }
    Ok(checkpoints)
}

/// What a view reports about itself.
#[derive(Clone, Debug, Serialize)]
pub struct ViewStatus {
    pub keys: usize,
    pub events: u64,
    pub late_events: u64,
    pub invalid_events: u64,
    /// Still replaying its source up to where it was when it started.
    pub restoring: bool,
}

pub struct View {
    def: Arc<ViewDef>,
    /// The definition emitting nothing: what a replay folds records with (its changes were
    /// pushed before the restart, so building them would be wasted).
    quiet: ViewDef,
    /// The stream read, or the storage of the table aggregated.
    source: Arc<Stream>,
    /// A view over a table: the table (its state is rebuilt from the rows at every start, so
    /// it has no checkpoint).
    table: Option<Arc<Table>>,
    output: Arc<Stream>,
    late: Option<Arc<Stream>>,
    state: RwLock<ViewState>,
    restoring: AtomicBool,
    stop: tokio::sync::watch::Sender<bool>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl View {
    pub(crate) fn new(
        def: ViewDef,
        source: Arc<Stream>,
        table: Option<Arc<Table>>,
        output: Arc<Stream>,
        late: Option<Arc<Stream>>,
        state: ViewState,
    ) -> View {
        let quiet = ViewDef { emit_changes: false, emit_final: false, ..def.clone() };
        View {
            quiet,
            def: Arc::new(def),
            source,
            table,
            output,
            late,
            state: RwLock::new(state),
            restoring: AtomicBool::new(true),
            stop: tokio::sync::watch::channel(false).0,
            task: std::sync::Mutex::new(None),
        }
    }

    pub fn def(&self) -> &ViewDef {
        &self.def
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// The stream of the view's changes (one record per change, key = the view key).
    pub fn output(&self) -> &Arc<Stream> {
        &self.output
    }

    pub fn source(&self) -> &Arc<Stream> {
        &self.source
    }

    /// The rows of `key`: open windows newest first, then closed ones (flagged `final`).
    pub fn rows(&self, key: &str) -> Vec<Value> {
        self.state.read().expect("view state lock").rows(&self.def, key)
    }

    /// Keys in order after `after`, at most `limit`, with their rows.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Vec<(String, Vec<Value>)> {
        self.state.read().expect("view state lock").keys_page(&self.def, after, limit)
    }

    /// Every key's rows and the change stream's end: changes from there on come after them.
    pub fn snapshot(&self) -> (Vec<(String, Vec<Value>)>, u64) {
        let state = self.state.read().expect("view state lock");
        let end = self.output.partition(0).map_or(0, |log| log.end_offset());
        (state.keys_page(&self.def, None, usize::MAX), end)
    }

    pub fn status(&self) -> ViewStatus {
        let state = self.state.read().expect("view state lock");
        ViewStatus {
            keys: state.key_count(),
            events: state.events,
            late_events: state.late_events,
            invalid_events: state.invalid_events,
            restoring: self.restoring.load(Ordering::Relaxed),
        }
    }

    /// Starts the view's task from `positions` (inside the tokio runtime).
    pub(crate) fn start(self: &Arc<Self>, hub: Arc<Hub>, checkpoints: Arc<Partition>, positions: Vec<u64>) {
        let view = self.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = view.run(hub, checkpoints, positions).await {
                tracing::error!(view = view.name(), %error, "the view stopped");
            }
        });
        *self.task.lock().expect("view task lock") = Some(task);
    }

    /// Stops the task (the view is dropped, or the engine closes).
    pub(crate) async fn stop(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().expect("view task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    async fn run(&self, hub: Arc<Hub>, checkpoints: Arc<Partition>, positions: Vec<u64>) -> Result<(), EngineError> {
        if let Some(table) = &self.table {
            return self.run_over_table(hub, table).await;
        }
        let mut stop = self.stop.subscribe();
        let mut catchup = Catchup::new("view", self.name(), &self.source, &positions);
        if catchup.done() {
            self.restoring.store(false, Ordering::Relaxed);
        }
        let mut cursor = follow(&hub, &self.source, positions)?;
        let mut last_checkpoint = Instant::now();
        let mut checkpointed_events = u64::MAX;
        let mut changes: Vec<Change> = Vec::new();
        let mut late: Vec<NewRecord> = Vec::new();
        let mut since_yield = 0usize;
        loop {
            let deadline = if !catchup.done() {
                None
            } else {
                self.state.read().expect("view state lock").next_deadline(&self.def)
            };
            let sleep = async {
                match deadline {
                    Some(at) => {
                        let wait = (at + 1 - now_ms()).max(0) as u64;
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            let checkpoint_due = tokio::time::sleep(CHECKPOINT_INTERVAL.saturating_sub(last_checkpoint.elapsed()));
            tokio::select! {
                delivery = cursor.next() => {
                    self.take(delivery?, &mut cursor, &hub, &mut changes, &mut late)?;
                    // Whatever else is ready now, before writing: one append for many changes.
                    while changes.len() < 4096 {
                        match cursor.next().now_or_never() {
                            Some(delivery) => self.take(delivery?, &mut cursor, &hub, &mut changes, &mut late)?,
                            None => break,
                        }
                    }
                    since_yield += 1;
                    if !catchup.done() && catchup.update(cursor.positions()) {
                        changes.clear();
                        self.state.write().expect("view state lock").advance(&self.def, now_ms(), &mut changes);
                        self.restoring.store(false, Ordering::Relaxed);
                    }
                }
                () = sleep => {
                    self.state.write().expect("view state lock").advance(&self.def, now_ms(), &mut changes);
                }
                () = checkpoint_due => {
                    last_checkpoint = Instant::now();
                    let events = self.state.read().expect("view state lock").events;
                    if events != checkpointed_events {
                        checkpointed_events = events;
                        self.checkpoint(&checkpoints, cursor.positions().to_vec()).await;
                    }
                }
                _ = stop.changed() => {
                    self.checkpoint(&checkpoints, cursor.positions().to_vec()).await;
                    return Ok(());
                }
            }
            if !catchup.done() {
                // Changes of the replay were pushed before the restart (or are history).
                changes.clear();
            }
            self.publish(&mut changes, &mut late).await;
            if since_yield >= YIELD_EVERY {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
    }

    /// A view over a table: folds in every row the table has now, then each change from the
    /// offset after them (the old row out, the new one in).
    async fn run_over_table(&self, hub: Arc<Hub>, table: &Table) -> Result<(), EngineError> {
        let mut stop = self.stop.subscribe();
        let (rows, next) = table.snapshot(&Filter::default());
        let started = Instant::now();
        tracing::info!(view = self.name(), rows = rows.len(), "view restoring: folding in the table's rows");
        let mut changes = Vec::new();
        for chunk in rows.chunks(YIELD_EVERY * 8) {
            {
                let mut state = self.state.write().expect("view state lock");
                for row in chunk {
                    let value = Value::Object(row.doc().clone());
                    let input = Input {
                        key: Some(row.id.as_bytes()),
                        subject: None,
                        timestamp_ms: row.timestamp_ms,
                        partition: 0,
                        offset: row.offset,
                        value: &value,
                    };
                    state.apply_row_change(&self.def, None, Some(&input), &mut changes);
                    changes.clear();
                }
            }
            tokio::task::yield_now().await;
        }
        restored("view", self.name(), rows.len() as u64, started);
        drop(rows);
        self.restoring.store(false, Ordering::Relaxed);
        let mut cursor = follow(&hub, &self.source, vec![next])?;
        let mut late = Vec::new();
        loop {
            tokio::select! {
                delivery = cursor.next() => {
                    self.take_row_change(delivery?, &mut cursor, &hub, &mut changes)?;
                    while changes.len() < 4096 {
                        match cursor.next().now_or_never() {
                            Some(delivery) => self.take_row_change(delivery?, &mut cursor, &hub, &mut changes)?,
                            None => break,
                        }
                    }
                }
                _ = stop.changed() => return Ok(()),
            }
            self.publish(&mut changes, &mut late).await;
        }
    }

    /// Folds one table change in.
    fn take_row_change(
        &self,
        delivery: Delivery,
        cursor: &mut Cursor,
        hub: &Arc<Hub>,
        changes: &mut Vec<Change>,
    ) -> Result<(), EngineError> {
        match delivery {
            Delivery::Event(event, _) => {
                let record = &event.record;
                let input = |value| Input::of(record, event.partition, value);
                let after = event.doc().map(input);
                let before = event.before().map(input);
                self.state.write().expect("view state lock").apply_row_change(
                    &self.def,
                    before.as_ref(),
                    after.as_ref(),
                    changes,
                );
            }
            Delivery::Overflow { positions } => {
                *cursor = follow(hub, &self.source, positions)?;
            }
        }
        Ok(())
    }

    /// Folds one delivery in.
    fn take(
        &self,
        delivery: Delivery,
        cursor: &mut Cursor,
        hub: &Arc<Hub>,
        changes: &mut Vec<Change>,
        late: &mut Vec<NewRecord>,
    ) -> Result<(), EngineError> {
        match delivery {
            Delivery::Event(event, _) => {
                let record = &event.record;
                let value = parse_value(record);
                let input = Input::of(record, event.partition, &value);
                let applied = {
                    let mut state = self.state.write().expect("view state lock");
                    // Windows whose close time passed before this record arrived close first.
                    let def = if self.restoring.load(Ordering::Relaxed) { &self.quiet } else { &*self.def };
                    state.advance(def, record.timestamp_ms - 1, changes);
                    state.apply(def, &input, record.timestamp_ms, changes)
                };
                match applied {
                    Applied::Late => {
                        metrics::counter!("view_late_events_total", "view" => self.def.name.clone()).increment(1);
                        if self.late.is_some() {
                            late.push(as_new(record));
                        }
                    }
                    Applied::Invalid => {
                        metrics::counter!("view_invalid_events_total", "view" => self.def.name.clone()).increment(1);
                    }
                    Applied::Counted | Applied::Filtered => {}
                }
            }
            Delivery::Overflow { positions } => {
                // The view fell behind the live feed: read on from the log.
                *cursor = follow(hub, &self.source, positions)?;
            }
        }
        Ok(())
    }

    /// Appends the changes to the view's change stream and late events to the late stream.
    async fn publish(&self, changes: &mut Vec<Change>, late: &mut Vec<NewRecord>) {
        if !changes.is_empty() {
            let records: Vec<NewRecord> =
                changes.drain(..).map(|change| change_record(&self.def.name, change)).collect();
            metrics::counter!("view_changes_total", "view" => self.def.name.clone()).increment(records.len() as u64);
            // Not awaited: the change stream is derived, so it is written without waiting.
            if let Err(error) = self.output.enqueue_to(0, &records, Some(Durability::Async)).await {
                tracing::warn!(view = self.name(), %error, "view changes could not be written");
            }
        }
        if let Some(stream) = &self.late
            && !late.is_empty()
        {
            let records: Vec<NewRecord> = std::mem::take(late);
            if let Err(error) = stream.publish(&records, None).await {
                tracing::warn!(view = self.name(), %error, "late events could not be written");
            }
        }
        late.clear();
    }

    async fn checkpoint(&self, checkpoints: &Partition, positions: Vec<u64>) {
        let state = self.state.read().expect("view state lock").clone();
        let name = self.def.name.clone();
        // Serializing a large state takes a while: not on the runtime's threads.
        let record = tokio::task::spawn_blocking(move || Checkpoint::new(positions, state).record(&name))
            .await
            .expect("serializes");
        if let Err(error) = checkpoints.append(std::slice::from_ref(&record)).await {
            tracing::warn!(view = self.name(), %error, "the view could not be checkpointed");
        }
    }
}

/// A change as a record of the change stream: key = the view key, subject `views/{v}/{key}`
/// (its MQTT topic), value = the row plus `"final"` (and `"removed": true` for a row that is
/// gone).
fn change_record(view: &str, change: Change) -> NewRecord {
    let mut row = change.row;
    if let Value::Object(fields) = &mut row {
        fields.insert("final".into(), Value::Bool(change.is_final));
        if change.removed {
            fields.insert("removed".into(), Value::Bool(true));
        }
    }
    let subject = format!("views/{view}/{}", change.key);
    let mut record = NewRecord::keyed(Bytes::from(change.key), serde_json::to_vec(&row).expect("a row serializes"));
    // A key that cannot be a topic level (a `/`, a wildcard) leaves the subject out.
    if !change_key_unfit(&subject) {
        record.subject = Some(subject);
    }
    record
}

fn change_key_unfit(subject: &str) -> bool {
    crate::subject::validate_subject(subject).is_err() || subject.split('/').count() != 3
}

/// A source record as it is republished (to the late stream).
fn as_new(record: &Record) -> NewRecord {
    NewRecord {
        timestamp_ms: Some(record.timestamp_ms),
        key: record.key.clone(),
        subject: record.subject.clone(),
        headers: record.headers.clone(),
        value: record.value.clone(),
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}
