//! A running view: one task reads its source (history, then live) through the hub, folds each
//! record into the view's state and closes windows on time; a second task appends every change
//! to the view's change stream (what subscriptions follow); a third, now and then, checkpoints
//! the state and source positions (about once a second, less often for a large state). Point
//! reads take the state's read lock: memory only, no disk.
//!
//! Recovery: the task starts from the last checkpoint's positions and state and replays the
//! source from there. Windows close by the records' arrival times while replaying and by the
//! wall clock once caught up, so the replay decides every window as the live run did (see
//! `state`); a tumbling or hopping window refuses a record that arrived after its close time
//! either way. Changes the live run had not written when it died are written by the replay,
//! and those it had are not written again (`changes`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
// Not `timeout(ZERO, …)`: a zero timer still waits for the timer wheel's next tick (1 ms).
use futures_util::FutureExt;
use onehop_log::{Durability, NewRecord, PartitionConfig, Record};

use crate::system::SystemTopic;
use serde::Serialize;
use serde_json::Value;

use super::catchup::{Catchup, follow, restored};
use super::changes::{ChangeWriter, Written as ChangesWritten, reconcile};
use super::checkpoint::{self, Checkpointing, Restored};
use super::expr::{Input, parse_value};
use super::join::state::{InputStatus, OutputRow};
use super::join::{JoinSource, Joined};
use super::state::{Applied, Change, Delta, ViewState};
use super::{ViewDef, Window};
use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::{Cursor, Delivery, Hub};
use crate::stream::Stream;
use crate::table::Table;

/// The change stream of view `name` is the topic `__view.{name}`.
pub const OUTPUT_PREFIX: &str = "__view.";
/// A view's state is checkpointed at most every `checkpoint_interval` while it changes (see
/// [`Checkpointing`]), and at least this many times the last checkpoint's duration apart: a burst of changes (a
/// backfill, 10 000 keys each changing every second) must not make checkpoints a steady load.
const CHECKPOINT_COST_SHARE: u32 = 20;
/// Records folded before the task lets others run (a backfill reads without waiting).
const YIELD_EVERY: usize = 512;
/// Windows closed at a time when many are due at once (see `run`).
const CLOSE_CHUNK: usize = 512;

/// How long a view's change stream keeps its changes: subscribers resume within it.
const OUTPUT_RETENTION_MS: u64 = 3_600_000;
/// How much of its changes a view's change stream keeps at most.
const OUTPUT_RETENTION_BYTES: u64 = 256 * 1024 * 1024;
/// Segments of a view's change stream: small, so retention frees space in small steps.
const OUTPUT_SEGMENT_BYTES_MAX: u64 = 16 * 1024 * 1024;

/// A view's change stream: appended without fsync (it is derived, and rebuilt by replay),
/// kept an hour or 256 MiB.
pub(crate) fn output_config(defaults: &PartitionConfig) -> PartitionConfig {
    PartitionConfig {
        durability: Durability::Async,
        retention_ms: Some(OUTPUT_RETENTION_MS),
        retention_bytes: Some(OUTPUT_RETENTION_BYTES),
        segment_bytes_max: OUTPUT_SEGMENT_BYTES_MAX,
        ..defaults.clone()
    }
}

/// A checkpoint task's answer: how long it took, or why it failed and the changes it held.
type Written = Result<Duration, (EngineError, Delta)>;

/// What a view reports about itself.
#[derive(Clone, Debug, Serialize)]
pub struct ViewStatus {
    pub keys: usize,
    pub events: u64,
    pub late_events: u64,
    pub invalid_events: u64,
    /// Still replaying its source up to where it was when it started.
    pub restoring: bool,
    /// A joined view: each input's rows and memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inputs: Option<Vec<InputStatus>>,
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
    pub(in crate::view) state: RwLock<ViewState>,
    /// Tells this view's checkpoint records from those of an earlier view of the same name
    /// (or of this one before a checkpoint was lost, see `written`).
    incarnation: AtomicU64,
    pub(super) restoring: AtomicBool,
    pub(super) stop: crate::view::Stop,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// A joined view: its inputs and state (`state` above is then empty).
    pub(super) join: Option<Joined>,
    /// Where the change stream ended at the checkpoint the view started from (see
    /// `checkpoint::Header`): the replay writes the changes past it the stream lacks.
    change_end: Option<u64>,
}

impl View {
    pub(crate) fn new(
        def: ViewDef,
        source: Arc<Stream>,
        table: Option<Arc<Table>>,
        output: Arc<Stream>,
        late: Option<Arc<Stream>>,
        restored: Restored,
    ) -> View {
        let Restored { incarnation, mut state, write_everything, change_end, .. } = restored;
        // Only a view over a stream checkpoints what changed; one over a table or a join is
        // rebuilt from its inputs at start, and tracking its changes would only grow.
        if table.is_none() && def.join.is_none() {
            state.track_unsaved(write_everything);
        }
        let quiet = ViewDef { emit_changes: false, emit_final: false, ..def.clone() };
        View {
            quiet,
            def: Arc::new(def),
            source,
            table,
            output,
            late,
            state: RwLock::new(state),
            incarnation: AtomicU64::new(incarnation),
            restoring: AtomicBool::new(true),
            stop: crate::view::Stop::default(),
            task: std::sync::Mutex::new(None),
            join: None,
            change_end,
        }
    }

    /// A joined view over `sources` (its inputs, in order), writing its changes to `output`.
    pub(crate) fn joined(def: ViewDef, sources: Vec<JoinSource>, output: Arc<Stream>) -> View {
        let join = def.join.as_deref().expect("a joined view's definition has its join");
        let joined = Joined::new(join, sources);
        let mut view = View::new(def, joined.first_changes().clone(), None, output, None, Restored::empty(vec![0]));
        view.join = Some(joined);
        view
    }

    pub fn def(&self) -> &ViewDef {
        &self.def
    }

    /// Whether the view answers reads: a joined view that stopped at its `state_bytes_max`
    /// does not (`view_state_limit`, saying how to fix it).
    pub fn serving(&self) -> Result<(), EngineError> {
        match &self.join {
            Some(joined) => joined.serving(self.name()),
            None => Ok(()),
        }
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

    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Relaxed)
    }

    /// Tombstones for every checkpoint record of the view, as its state is now (a stopped
    /// view's last checkpoint wrote exactly that).
    pub(crate) fn checkpoint_tombstones(&self) -> Vec<NewRecord> {
        let whole = self.state.read().expect("view state lock").everything();
        checkpoint::tombstones(self.name(), self.incarnation(), &whole)
    }

    /// The rows of `key`: open windows newest first, then closed ones (flagged `final`).
    pub fn rows(&self, key: &str) -> Vec<Value> {
        if let Some(joined) = self.rows_joined() {
            return joined.state.read().expect("view state lock").rows(key);
        }
        self.state.read().expect("view state lock").rows(&self.def, key)
    }

    /// Keys in order after `after`, at most `limit`, with their rows.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Vec<(String, Vec<Value>)> {
        if let Some(joined) = self.rows_joined() {
            return joined.state.read().expect("view state lock").page(after, limit);
        }
        self.state.read().expect("view state lock").keys_page(&self.def, after, limit)
    }

    /// Every key's rows and the change stream's end: changes from there on come after them.
    pub fn snapshot(&self) -> (Vec<(String, Vec<Value>)>, u64) {
        if let Some(joined) = self.rows_joined() {
            let state = joined.state.read().expect("view state lock");
            let end = self.output.end_offset(0).unwrap_or(0);
            return (state.page(None, usize::MAX), end);
        }
        let state = self.state.read().expect("view state lock");
        let end = self.output.end_offset(0).unwrap_or(0);
        (state.keys_page(&self.def, None, usize::MAX), end)
    }

    /// [`View::page`] and [`View::status`] as of one moment: the status counts exactly the
    /// events the rows show.
    pub fn page_and_status(&self, after: Option<&str>, limit: usize) -> (Vec<(String, Vec<Value>)>, ViewStatus) {
        if let Some(joined) = self.rows_joined() {
            let state = joined.state.read().expect("view state lock");
            return (state.page(after, limit), joined.status(&state, self.restoring.load(Ordering::Relaxed)));
        }
        let state = self.state.read().expect("view state lock");
        (state.keys_page(&self.def, after, limit), self.status_of(&state))
    }

    /// For a joined view without GROUP BY: [`View::page_and_status`] with each row as the view
    /// keeps it for reads, its JSON beside it (an answer put together from those costs no
    /// serializing). `None` for other views.
    pub fn page_rows_and_status(&self, after: Option<&str>, limit: usize) -> Option<(Vec<OutputRow>, ViewStatus)> {
        let joined = self.rows_joined()?;
        let state = joined.state.read().expect("view state lock");
        Some((state.page_rows(after, limit), joined.status(&state, self.restoring.load(Ordering::Relaxed))))
    }

    pub fn status(&self) -> ViewStatus {
        if let Some(joined) = self.rows_joined() {
            let state = joined.state.read().expect("view state lock");
            return joined.status(&state, self.restoring.load(Ordering::Relaxed));
        }
        self.status_of(&self.state.read().expect("view state lock"))
    }

    /// The join a joined view without GROUP BY computes its rows from (a view aggregating a
    /// join keeps its rows in `state`, as other views do).
    fn rows_joined(&self) -> Option<&Joined> {
        self.join.as_ref().filter(|_| !self.def.aggregates_join())
    }

    fn status_of(&self, state: &ViewState) -> ViewStatus {
        let mut status = ViewStatus {
            keys: state.key_count(),
            events: state.events,
            late_events: state.late_events,
            invalid_events: state.invalid_events,
            restoring: self.restoring.load(Ordering::Relaxed),
            inputs: None,
        };
        // A view aggregating a join: its inputs' changes, and what keeping them costs.
        if let Some(joined) = &self.join {
            let inputs = joined.status(&joined.state.read().expect("view state lock"), status.restoring);
            status.events = inputs.events;
            status.inputs = inputs.inputs;
        }
        status
    }

    /// Starts the view's task from `positions` (inside the tokio runtime).
    ///
    /// What counts as history (replayed without its changes written again) is what the source
    /// holds now, as this is called: a record published after `CREATE VIEW` returns, or after a
    /// restart opened the view, is live however late the task gets to run, and its change is
    /// written.
    pub(crate) fn start(self: &Arc<Self>, hub: Arc<Hub>, checkpointing: Checkpointing, positions: Vec<u64>) {
        register_metrics(&self.def.name);
        // A view over a table folds in the table's rows instead (`run_over_table`), a joined
        // view its inputs' rows (`run_join`).
        let catchup = (self.table.is_none() && self.join.is_none())
            .then(|| Catchup::new("view", self.name(), &self.source, &positions));
        let view = self.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = view.run(hub, checkpointing, positions, catchup).await {
                tracing::error!(view = view.name(), %error, "the view stopped");
            }
        });
        *self.task.lock().expect("view task lock") = Some(task);
    }

    /// Stops the task (the view is dropped, or the engine closes).
    pub(crate) async fn stop(&self) {
        self.stop.raise();
        let task = self.task.lock().expect("view task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    async fn run(
        &self,
        hub: Arc<Hub>,
        checkpointing: Checkpointing,
        positions: Vec<u64>,
        catchup: Option<Catchup>,
    ) -> Result<(), EngineError> {
        if self.join.is_some() {
            return self.run_join(hub).await;
        }
        let (Some(mut catchup), None) = (catchup, &self.table) else {
            let table = self.table.as_ref().expect("a view without a catch-up is over a table");
            return self.run_over_table(hub, table).await;
        };
        let Checkpointing { topic: checkpoints, interval: checkpoint_every } = checkpointing;
        let mut stop = self.stop.receiver();
        if catchup.done() {
            self.restoring.store(false, Ordering::Relaxed);
        }
        let mut cursor = follow(&hub, &self.source, positions)?;
        // What the live run wrote past the checkpoint: the replay writes the rest. With no end
        // in the checkpoint (a view's first backfill) the replay is quiet, as that run was.
        // Past the replay, the finals the live run wrote for windows the wall clock closed after
        // the checkpoint are still left out when they close again.
        let mut replay = match self.change_end {
            Some(end) => Some(ChangesWritten::scan(self.name(), &self.output, end)?),
            None => None,
        };
        if catchup.done() {
            replay = replay.and_then(ChangesWritten::caught_up);
        }
        let writer = ChangeWriter::start(self.name(), &self.output);
        // One timer across turns: made anew each turn, it would fire only in a turn that
        // waits for the source, so a replay or a busy source would rarely checkpoint.
        let checkpoint_due = tokio::time::sleep(checkpoint_every);
        tokio::pin!(checkpoint_due);
        let mut checkpointed_positions: Vec<u64> = Vec::new();
        let mut changes: Vec<Change> = Vec::new();
        let mut late: Vec<NewRecord> = Vec::new();
        let mut since_yield = 0usize;
        // The checkpoint being written, if any: at most one at a time, so they land in order.
        let mut checkpointing: Option<tokio::task::JoinHandle<Written>> = None;
        let mut checkpoint_interval = checkpoint_every;
        // A deadline a full `advance` left where it was (never expected: everything due is then
        // done): left to the timer, so it cannot keep the loop from waiting. Only that one
        // value: a window opened later with the same close time still closes on the spot.
        let mut stuck: Option<i64> = None;
        loop {
            let deadline = if !catchup.done() {
                None
            } else {
                self.state.read().expect("view state lock").next_deadline(&self.def)
            };
            // Past due: close now, before reading on. Left to the timer below, a source that
            // always has a record ready would keep it from ever firing (a zero sleep waits for
            // the timer's next tick, and each turn makes a new one), and windows would close
            // only when a later record arrived. A few hundred windows at a time, with the
            // records that arrived meanwhile folded in between: when 10 000 keys' windows close
            // at once, neither their records nor point reads wait for all of them.
            let due = deadline.is_some_and(|at| at < now_ms() && stuck != Some(at));
            // Caught up with nothing due: a final the crashed run wrote that has not been
            // closed again by now never will be (what the wall clock had closed then is due
            // now), so the replay has nothing left to leave out, and checkpoints go on.
            if !due && catchup.done() && replay.take().is_some() {
                tracing::debug!(view = self.name(), "the replay after a crash is over");
            }
            if let Some(at) = deadline.filter(|_| due) {
                let more = {
                    let mut state = self.state.write().expect("view state lock");
                    let more = state.advance_some(&self.def, now_ms(), &mut changes, CLOSE_CHUNK);
                    stuck = (!more && state.next_deadline(&self.def) == Some(at)).then_some(at);
                    more
                };
                while changes.len() < 4096 {
                    match cursor.next().now_or_never() {
                        Some(delivery) => {
                            self.take(delivery?, &mut cursor, &hub, replay.is_none(), &mut changes, &mut late)?
                        }
                        None => break,
                    }
                }
                if let Some(written) = replay.as_mut() {
                    written.filter(&mut changes);
                }
                self.publish(&writer, &mut changes, &mut late).await;
                if more {
                    // Let the change writer, the hub and the subscribers move this chunk on.
                    tokio::task::yield_now().await;
                }
                continue;
            }
            let sleep = async {
                match deadline {
                    Some(at) => {
                        let wait = (at + 1 - now_ms()).max(0) as u64;
                        tokio::time::sleep(Duration::from_millis(wait)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                delivery = cursor.next() => {
                    let quiet = replay.is_none();
                    self.take(delivery?, &mut cursor, &hub, quiet, &mut changes, &mut late)?;
                    // Whatever else is ready now, before writing: one append for many changes.
                    while changes.len() < 4096 {
                        match cursor.next().now_or_never() {
                            Some(delivery) => self.take(delivery?, &mut cursor, &hub, quiet, &mut changes, &mut late)?,
                            None => break,
                        }
                    }
                    since_yield += 1;
                    if !catchup.done() && catchup.update(cursor.positions()) {
                        if quiet {
                            changes.clear();
                        }
                        self.state.write().expect("view state lock").advance(&self.def, now_ms(), &mut changes);
                        if let Some(written) = replay.as_mut() {
                            written.filter(&mut changes);
                        }
                        replay = replay.and_then(ChangesWritten::caught_up);
                        self.restoring.store(false, Ordering::Relaxed);
                    }
                }
                // The loop's top closes what is due, a chunk at a time.
                () = sleep => {}
                () = &mut checkpoint_due => {
                    let fired = tokio::time::Instant::now();
                    if let Some(task) = checkpointing.take_if(|task| task.is_finished())
                        && let Some(took) = self.written(task.await)
                    {
                        // Many changes cost a while to write: write them less often, so that
                        // checkpoints take at most a small share of the time.
                        checkpoint_interval = checkpoint_every.max(took * CHECKPOINT_COST_SHARE);
                    }
                    checkpoint_due.as_mut().reset(fired + checkpoint_interval);
                    let moved = checkpointed_positions != cursor.positions();
                    // Not while the replay after a crash still leaves out changes the crashed
                    // run wrote: a checkpoint here would say the stream's changes end at its
                    // end, and a crash after it would replay from here without knowing that
                    // the records ahead have their changes written already, before that end.
                    // The checkpoint the replay started from stays the one to restart from.
                    if checkpointing.is_none()
                        && replay.is_none()
                        && (moved || self.state.read().expect("view state lock").has_unsaved())
                    {
                        checkpointed_positions = cursor.positions().to_vec();
                        let quiet = !catchup.done();
                        let change_end = self.change_end(&writer, quiet, &mut changes).await;
                        checkpointing = Some(self.checkpoint(&checkpoints, cursor.positions().to_vec(), change_end));
                    }
                }
                _ = stop.changed() => {
                    if let Some(task) = checkpointing.take() {
                        self.written(task.await);
                    }
                    // Mid-replay the last checkpoint stays the one to start from (see above).
                    if replay.is_none() {
                        let quiet = !catchup.done();
                        let change_end = self.change_end(&writer, quiet, &mut changes).await;
                        self.written(self.checkpoint(&checkpoints, cursor.positions().to_vec(), change_end).await);
                    }
                    writer.close().await;
                    return Ok(());
                }
            }
            match replay.as_mut() {
                // Those the live run wrote before the crash are left out.
                Some(written) => written.filter(&mut changes),
                // A first backfill: its changes are history.
                None if !catchup.done() => changes.clear(),
                None => {}
            }
            self.publish(&writer, &mut changes, &mut late).await;
            if since_yield >= YIELD_EVERY {
                since_yield = 0;
                tokio::task::yield_now().await;
            }
        }
    }

    /// A view over a table: folds in every row the table has now, then each change from the
    /// offset after them (the old row out, the new one in).
    async fn run_over_table(&self, hub: Arc<Hub>, table: &Table) -> Result<(), EngineError> {
        let mut stop = self.stop.receiver();
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
                        timestamp_ms: row.timestamp_ms,
                        offset: row.offset,
                        ..Input::row(&value)
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
        let writer = ChangeWriter::start(self.name(), &self.output);
        // What a crash kept the change stream from writing, written now.
        let behind = reconcile(self.name(), &self.output, |after, limit| self.page(after, limit))?;
        if !behind.is_empty() {
            writer.send(behind).await;
        }
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
                _ = stop.changed() => {
                    writer.close().await;
                    return Ok(());
                }
            }
            self.publish(&writer, &mut changes, &mut late).await;
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
    /// Folds one delivery in; `quiet` while replaying what needs no changes (a first backfill).
    fn take(
        &self,
        delivery: Delivery,
        cursor: &mut Cursor,
        hub: &Arc<Hub>,
        quiet: bool,
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
                    // Windows whose close time passed before this record arrived close first,
                    // while restoring (no wall clock then) and for windows whose closing decides
                    // what the record joins (sessions, sliding windows). A tumbling or hopping
                    // window refuses a record that arrived after its close time whether it has
                    // closed yet or not, so live, the wall clock closes those (see `run`).
                    let restoring = self.restoring.load(Ordering::Relaxed);
                    let def = if restoring && quiet { &self.quiet } else { &*self.def };
                    if restoring || !matches!(def.window, Window::Tumble { .. } | Window::Hop { .. }) {
                        state.advance(def, record.timestamp_ms - 1, changes);
                    }
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

    /// Hands the changes to the change writer and appends late events to the late stream.
    pub(super) async fn publish(&self, writer: &ChangeWriter, changes: &mut Vec<Change>, late: &mut Vec<NewRecord>) {
        if !changes.is_empty() {
            writer.send(std::mem::take(changes)).await;
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

    /// Where the change stream will end once every change handed to `writer` so far is
    /// written (the barrier is answered later; `changes` is empty here, all handed over), or
    /// nothing to wait for when the run is `quiet` (a first backfill, whose changes are none).
    async fn change_end(
        &self,
        writer: &ChangeWriter,
        quiet: bool,
        changes: &mut Vec<Change>,
    ) -> Option<std::pin::Pin<Box<dyn Future<Output = Option<u64>> + Send>>> {
        if quiet {
            return None;
        }
        if !changes.is_empty() {
            writer.send(std::mem::take(changes)).await;
        }
        Some(Box::pin(writer.barrier().await))
    }

    /// Writes a checkpoint of what changed since the last one (see `checkpoint`), the source
    /// `positions` the state now stands for and where the change stream ends once their changes
    /// are written (`change_end`), in the background: the view reads on meanwhile. Taking the
    /// changes copies one pointer per changed key; serializing them runs off the runtime's
    /// threads.
    fn checkpoint(
        &self,
        checkpoints: &Arc<SystemTopic>,
        positions: Vec<u64>,
        change_end: Option<std::pin::Pin<Box<dyn Future<Output = Option<u64>> + Send>>>,
    ) -> tokio::task::JoinHandle<Written> {
        let delta = self.state.write().expect("view state lock").take_unsaved();
        let (name, incarnation) = (self.def.name.clone(), self.incarnation());
        let checkpoints = checkpoints.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            // The changes of everything before `positions` are written before the checkpoint
            // says so: a crash in between replays them, and finds them written.
            let change_end = match change_end {
                Some(end) => end.await,
                None => None,
            };
            let (records, delta, name) = tokio::task::spawn_blocking(move || {
                (checkpoint::records(&name, incarnation, positions, change_end, &delta), delta, name)
            })
            .await
            .expect("serializes");
            match checkpoints.append(&records).await {
                Ok(_) => {
                    metrics::counter!("view_checkpoints_total", "view" => name).increment(1);
                    Ok(started.elapsed())
                }
                Err(error) => Err((error, delta)),
            }
        })
    }

    /// What a checkpoint task answered: how long it took, or `None` when it failed, and then
    /// its changes are unsaved again, for the next checkpoint to write.
    fn written(&self, written: Result<Written, tokio::task::JoinError>) -> Option<Duration> {
        match written {
            Ok(Ok(took)) => Some(took),
            Ok(Err((error, delta))) => {
                tracing::warn!(view = self.name(), %error, "the view could not be checkpointed");
                metrics::counter!("view_checkpoint_failures_total", "view" => self.def.name.clone()).increment(1);
                self.state.write().expect("view state lock").put_back(delta);
                None
            }
            Err(error) => {
                // The task panicked: which keys and windows it held is lost. The next
                // checkpoint writes the whole state under a new incarnation, and its header
                // makes the records of the old one strays (deleted at the next start).
                tracing::error!(view = self.name(), %error, "a view checkpoint task failed");
                self.incarnation.store(checkpoint::new_incarnation(), Ordering::Relaxed);
                self.state.write().expect("view state lock").track_unsaved(true);
                None
            }
        }
    }
}

/// A change as a record of the change stream: key = the view key, subject `views/{v}/{key}`
/// (its MQTT topic), value = the row with `"final"` (and `"removed": true` for a row that is
/// gone), laid out by [`change_value`].
pub(super) fn change_record(view: &str, change: Change) -> NewRecord {
    let subject = format!("views/{view}/{}", change.key);
    let value = change_value(&change);
    let mut record = NewRecord::keyed(Bytes::from(change.key), value);
    // A key that cannot be a topic level (a `/`, a wildcard) leaves the subject out.
    if !change_key_unfit(&subject) {
        record.subject = Some(subject.into());
    }
    record
}

/// A change's value in the change stream:
/// `{"final":…[,"removed":true][,"before":{…}],<the row's fields>}`. The flags and the row as
/// it was come first, so a subscriber's encoder takes them and the row's fields apart without
/// parsing the row ([`change_parts`]); the value is still one JSON object, which is what MQTT
/// subscribers and `final=true` filters read (`before` is why no column may be named so).
pub fn change_value(change: &Change) -> Vec<u8> {
    let mut value = Vec::with_capacity(128);
    value.extend_from_slice(if change.is_final { b"{\"final\":true" } else { b"{\"final\":false" });
    if change.removed {
        value.extend_from_slice(b",\"removed\":true");
    }
    if let Some(before) = &change.before {
        value.extend_from_slice(b",\"before\":");
        serde_json::to_writer(&mut value, &**before).expect("a row serializes");
    }
    let row_at = value.len();
    if change.row.is_object() {
        // The row written in place, its opening brace then turned into the comma after the
        // flags (or, for a row with no fields, dropped): one buffer, no copy.
        serde_json::to_writer(&mut value, &change.row).expect("a row serializes");
        if value.len() == row_at + 2 {
            value.truncate(row_at);
            value.push(b'}');
        } else {
            value[row_at] = b',';
        }
    } else {
        // Not an object (never, but not worth a panic): the row under its own name.
        value.extend_from_slice(b",\"row\":");
        serde_json::to_writer(&mut value, &change.row).expect("a row serializes");
        value.push(b'}');
    }
    value
}

/// A change-stream value taken apart as [`change_value`] lays it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangeParts<'a> {
    pub is_final: bool,
    pub removed: bool,
    /// The row as it was, as JSON text, if the change says.
    pub before: Option<&'a [u8]>,
    /// The row's fields with the closing brace (`}` for none, or `"a":1,…}` — the row is `{`
    /// followed by them).
    pub fields: &'a [u8],
}

/// The parts of a change-stream value as [`change_value`] lays it out; `None` for any other
/// layout.
pub fn change_parts(value: &[u8]) -> Option<ChangeParts<'_>> {
    let (is_final, rest) = if let Some(rest) = value.strip_prefix(b"{\"final\":true") {
        (true, rest)
    } else {
        (false, value.strip_prefix(b"{\"final\":false")?)
    };
    let (removed, rest) = match rest.strip_prefix(b",\"removed\":true") {
        Some(rest) => (true, rest),
        None => (false, rest),
    };
    let (before, rest) = match rest.strip_prefix(b",\"before\":") {
        Some(rest) => {
            let length = object_length(rest)?;
            (Some(&rest[..length]), &rest[length..])
        }
        None => (None, rest),
    };
    if rest == b"}" {
        return Some(ChangeParts { is_final, removed, before, fields: rest });
    }
    let fields = rest.strip_prefix(b",")?;
    fields.ends_with(b"}").then_some(ChangeParts { is_final, removed, before, fields })
}

/// The length of the JSON object `text` starts with (as serde_json writes one: strings with
/// their escapes), or `None` if it does not start with a whole one.
fn object_length(text: &[u8]) -> Option<usize> {
    if text.first() != Some(&b'{') {
        return None;
    }
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for (at, byte) in text.iter().enumerate() {
        if in_string {
            match byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
    }
    None
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
        headers: record.headers.to_vec(),
        value: record.value.clone(),
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

/// Registers the view's counters, so each of its series is exported (at 0) from its start: one
/// that appears only with its first increment hides that increment from `rate()`.
pub(super) fn register_metrics(view: &str) {
    for name in [
        "view_late_events_total",
        "view_invalid_events_total",
        "view_changes_total",
        "view_checkpoints_total",
        "view_checkpoint_failures_total",
    ] {
        let _ = metrics::counter!(name, "view" => view.to_string());
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_change_value_is_one_object_whose_flags_and_row_come_apart_without_parsing() {
        let row = json!({"sku": "a\"b", "n": 3, "window_start": 0, "final_count": 1});
        let was = json!({"sku": "a\"b", "n": 2, "note": "}{\\\"", "list": [{"x": "]"}]});
        for (is_final, removed, before) in
            [(false, false, None), (true, false, None), (false, true, None), (false, false, Some(&was))]
        {
            let before = before.map(|was| Arc::new(was.clone()));
            let change =
                Change { key: "k".into(), row: Arc::new(row.clone()), is_final, removed, before: before.clone() };
            let value = change_value(&change);
            let mut expected = row.clone();
            expected["final"] = json!(is_final);
            if removed {
                expected["removed"] = json!(true);
            }
            if let Some(before) = &before {
                expected["before"] = (**before).clone();
            }
            assert_eq!(serde_json::from_slice::<Value>(&value).unwrap(), expected);
            let parts = change_parts(&value).unwrap();
            assert_eq!((parts.is_final, parts.removed), (is_final, removed));
            let parsed_before = parts.before.map(|text| serde_json::from_slice::<Value>(text).unwrap());
            assert_eq!(parsed_before.as_ref(), before.as_deref());
            let rebuilt = [b"{".as_slice(), parts.fields].concat();
            assert_eq!(serde_json::from_slice::<Value>(&rebuilt).unwrap(), row);
        }
        let empty = Change { key: "k".into(), row: Arc::new(json!({})), is_final: true, removed: false, before: None };
        let empty = change_value(&empty);
        assert_eq!(empty, b"{\"final\":true}");
        let parts = change_parts(&empty).unwrap();
        assert_eq!((parts.is_final, parts.removed, parts.before, parts.fields), (true, false, None, b"}".as_slice()));
        // Anything else is left to a parser.
        for other in [
            &b"{\"n\":1,\"final\":true}"[..],
            b"{\"final\":true",
            b"{\"final\":truex}",
            b"{\"final\":true,\"before\":{\"a\":\"}\"",
            b"{\"final\":true,\"before\":1}",
            b"{\"final\":true,\"before\":{]]}",
            b"",
            b"null",
        ] {
            assert_eq!(change_parts(other), None, "{}", String::from_utf8_lossy(other));
        }
    }
}
