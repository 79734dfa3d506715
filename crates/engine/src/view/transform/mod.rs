//! Stateless transforms: `CREATE STREAM out AS SELECT … FROM src [CROSS JOIN UNNEST(…)]
//! [WHERE …] [UNION ALL SELECT … FROM src2 …]` maps every record of each branch's source that
//! passes the filter to one record of `out` (one per element with an `UNNEST`), which is an
//! ordinary stream (read, subscribed to and aggregated like any other). A branch may join
//! tables to its records (`JOIN customers c ON c.id = o.customer_id`): each record is enriched
//! with the row of each table its key finds, as the table holds it when the record is read.
//!
//! One task per transform reads its sources through the hub (history, then live), evaluates
//! each record, and appends the results to `out`, a batch at a time: a batch is durable (at
//! `out`'s durability) before the next is read. Every output record carries the header
//! `onehop-source` naming the branch, partition, offset and element it came from.
//!
//! Exactly once: the task checkpoints every `checkpoint_interval` (and when it stops) where it
//! is in its sources and where `out` ends, in the compacted checkpoint topic views use. After a
//! crash it reads what `out` received after the checkpoint, collects the source positions
//! named there, and replays the sources from the checkpoint without writing a record again for
//! a position it finds; until it has passed every one of them it writes no checkpoint
//! ([`replay_over`]). Evaluation is deterministic, so a record it did not write before is
//! written as it would have been (with the tables' rows as they are when it is read again: a
//! record's output, once written, is never written again with other rows).
//!
//! On a cluster node the task runs only while the node leads (once it applied every command of
//! earlier terms). It submits each batch through the cluster with the source positions it
//! covers; every node appends the batch and takes those positions as the transform's
//! ([`Transform::set_applied`]) in the same step, and checkpoints them about once a second. A
//! new leader's run starts from there (scanning output written after its checkpoint, as after
//! a crash), and the leader refuses a batch that does not start where the transform is, so a
//! stretch of the source is written once however leadership moves.
//!
//! - `def`: what a transform is, and what it makes of one record.
//! - `reader`: its sources' cursors as one feed, and their positions as one list.
//! - this module: the task, its checkpoints, and the scan for what it wrote before a crash.

mod def;
mod reader;

pub use def::{Lookup, Output, SOURCE_HEADER, SourcePosition, TransformBranch, TransformDef, ValueFormat};
pub(crate) use reader::{join_positions, split_positions};

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use onehop_log::NewRecord;
use serde::{Deserialize, Serialize};

use self::reader::Reader;
use super::checkpoint::Checkpointing;
use super::expr::{Input, parse_value};
use crate::engine::replicated::{self, Replicator};
use crate::error::EngineError;
use crate::hub::{Delivery, Hub};
use crate::stream::Stream;
use crate::system::SystemTopic;
use crate::table::Table;

/// Records one step of the scan for output written after the last checkpoint reads at most.
const WRITTEN_SCAN_READ_RECORDS_MAX: usize = 1024;
/// Bytes of keys and values that step reads at most: the scan's memory, whatever the backlog.
const WRITTEN_SCAN_READ_BYTES_MAX: usize = 16 * 1024 * 1024;

/// A transform's checkpoint key in the checkpoint topic.
pub(crate) const CHECKPOINT_PREFIX: &str = "transform/";
const CHECKPOINT_VERSION: u32 = 1;
/// Records read into one batch at most.
const BATCH_MAX: usize = 4096;
/// How long a failed write waits before it is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// Where a transform is: the next source offset per partition (of each branch's source, as one
/// list: [`join_positions`]), and the output's end offsets at that moment (output records after
/// those may come from source records after the positions).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TransformCheckpoint {
    version: u32,
    pub positions: Vec<u64>,
    pub output_ends: Vec<u64>,
}

impl TransformCheckpoint {
    pub fn new(positions: Vec<u64>, output_ends: Vec<u64>) -> TransformCheckpoint {
        TransformCheckpoint { version: CHECKPOINT_VERSION, positions, output_ends }
    }

    pub fn parse(name: &str, value: &[u8]) -> Option<TransformCheckpoint> {
        match serde_json::from_slice::<TransformCheckpoint>(value) {
            Ok(checkpoint) if checkpoint.version == CHECKPOINT_VERSION => Some(checkpoint),
            _ => {
                tracing::warn!(transform = name, "skipping an unreadable transform checkpoint");
                None
            }
        }
    }

    pub fn record(&self, name: &str) -> NewRecord {
        let value = serde_json::to_vec(self).expect("a checkpoint serializes");
        NewRecord::keyed(Bytes::from(checkpoint_key(name)), value)
    }
}

pub(crate) fn checkpoint_key(name: &str) -> String {
    format!("{CHECKPOINT_PREFIX}{name}")
}

/// What a transform reports about itself (counts since the process started).
#[derive(Clone, Debug, Serialize)]
pub struct TransformStatus {
    /// Source records read.
    pub records_in: u64,
    /// Records written to the output.
    pub records_out: u64,
    /// Records the filter skipped.
    pub filtered: u64,
    /// Records not written because they broke the output's limits (too large).
    pub rejected: u64,
    /// Still replaying what its sources held when it started.
    pub restoring: bool,
}

#[derive(Default)]
struct Counters {
    records_in: AtomicU64,
    records_out: AtomicU64,
    filtered: AtomicU64,
    rejected: AtomicU64,
}

pub struct Transform {
    def: Arc<TransformDef>,
    /// Each branch's source (a stream read by two branches is here twice).
    sources: Vec<Arc<Stream>>,
    /// Each branch's lookups' tables, in order.
    tables: Vec<Vec<Arc<Table>>>,
    output: Arc<Stream>,
    counters: Counters,
    restoring: std::sync::atomic::AtomicBool,
    stop: crate::view::Stop,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// On a cluster node: where the transform is, as this node applied its batches (its
    /// source positions, and its output's ends then).
    applied: std::sync::Mutex<TransformCheckpoint>,
}

/// How a cluster node's run of a transform, as the leader, ended.
enum Led {
    /// The transform is stopping.
    Stopped,
    /// This node no longer leads in the term it ran in.
    Deposed,
    /// A batch was not written (refused, or its outcome unknown), or the source or output
    /// could not be read: the run starts again from where the transform is.
    Failed(EngineError),
}

impl Transform {
    /// A transform over `sources` (its branches', in order) enriched from `tables` (each
    /// branch's lookups', in order) writing `output`, at `checkpoint` (where a cluster node's
    /// run of it starts; a single node's task is given its own start).
    pub(crate) fn new(
        def: TransformDef,
        sources: Vec<Arc<Stream>>,
        tables: Vec<Vec<Arc<Table>>>,
        output: Arc<Stream>,
        checkpoint: TransformCheckpoint,
    ) -> Transform {
        Transform {
            def: Arc::new(def),
            sources,
            tables,
            output,
            counters: Counters::default(),
            restoring: std::sync::atomic::AtomicBool::new(true),
            stop: crate::view::Stop::default(),
            task: std::sync::Mutex::new(None),
            applied: std::sync::Mutex::new(checkpoint),
        }
    }

    /// On a cluster node: where the transform is, as applied here.
    pub(crate) fn applied(&self) -> TransformCheckpoint {
        self.applied.lock().expect("applied lock").clone()
    }

    /// On a cluster node, as a batch of the transform is applied (appended to its output):
    /// the transform is at `positions` in its sources.
    pub(crate) fn set_applied(&self, positions: Vec<u64>) {
        let ends = self.output.end_offsets();
        *self.applied.lock().expect("applied lock") = TransformCheckpoint::new(positions, ends);
    }

    pub fn def(&self) -> &TransformDef {
        &self.def
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    /// Each branch's source, in order.
    pub fn sources(&self) -> &[Arc<Stream>] {
        &self.sources
    }

    /// Each branch's positions in its source, from one list of them.
    pub(crate) fn branch_positions(&self, positions: &[u64]) -> Vec<Vec<u64>> {
        split_positions(positions, self.sources.len())
    }

    pub fn output(&self) -> &Arc<Stream> {
        &self.output
    }

    pub fn status(&self) -> TransformStatus {
        let counters = &self.counters;
        TransformStatus {
            records_in: counters.records_in.load(Ordering::Relaxed),
            records_out: counters.records_out.load(Ordering::Relaxed),
            filtered: counters.filtered.load(Ordering::Relaxed),
            rejected: counters.rejected.load(Ordering::Relaxed),
            restoring: self.restoring.load(Ordering::Relaxed),
        }
    }

    /// Starts the task from `checkpoint` (inside the tokio runtime).
    pub(crate) fn start(
        self: &Arc<Self>,
        hub: Arc<Hub>,
        checkpointing: Checkpointing,
        checkpoint: TransformCheckpoint,
    ) {
        self.register_metrics();
        let transform = self.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = transform.run(hub, checkpointing, checkpoint).await {
                tracing::error!(transform = transform.name(), %error, "the transform stopped");
            }
        });
        *self.task.lock().expect("transform task lock") = Some(task);
    }

    /// Registered, so each of the transform's series is exported (at 0) from its start.
    fn register_metrics(&self) {
        for name in ["transform_invalid_subjects_total", "transform_rejected_records_total"] {
            let _ = metrics::counter!(name, "transform" => self.def.name.clone());
        }
    }

    /// On a cluster node: starts the task that runs the transform while `leading` says this
    /// node leads, and checkpoints where it is as applied here meanwhile.
    pub(crate) fn start_replicated(
        self: &Arc<Self>,
        hub: Arc<Hub>,
        checkpointing: Checkpointing,
        replicator: Arc<dyn Replicator>,
        leading: tokio::sync::watch::Receiver<Option<u64>>,
    ) {
        self.register_metrics();
        self.restoring.store(false, Ordering::Relaxed);
        let transform = self.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = transform.run_replicated(hub, checkpointing, replicator, leading).await {
                tracing::error!(transform = transform.name(), %error, "the transform stopped");
            }
        });
        *self.task.lock().expect("transform task lock") = Some(task);
    }

    /// Stops the task, which checkpoints first.
    pub(crate) async fn stop(&self) {
        self.stop.raise();
        let task = self.task.lock().expect("transform task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    async fn run(
        &self,
        hub: Arc<Hub>,
        checkpointing: Checkpointing,
        checkpoint: TransformCheckpoint,
    ) -> Result<(), EngineError> {
        let Checkpointing { topic: checkpoints, interval } = checkpointing;
        let mut stop = self.stop.receiver();
        let mut written = self.written_since(&checkpoint.output_ends)?;
        let mut reader = Reader::new(self.name(), &hub, &self.sources, self.branch_positions(&checkpoint.positions))?;
        self.restoring.store(reader.restoring(), Ordering::Relaxed);
        // One timer across turns: made anew each turn, it would never fire while the sources
        // always have a record ready (a replay, a busy source), and nothing would checkpoint.
        let checkpoint_due = tokio::time::sleep(interval);
        tokio::pin!(checkpoint_due);
        let mut checkpointed = Vec::new();
        let mut batch: Vec<NewRecord> = Vec::new();
        loop {
            tokio::select! {
                delivery = reader.next() => {
                    self.take_ready(delivery?, &mut reader, &mut written, &mut batch)?;
                    if !self.write(&mut batch, &mut stop).await {
                        // Stopped while the output could not be written: the batch is not
                        // done, so the checkpoint stays where it was.
                        return Ok(());
                    }
                    if reader.caught_up() {
                        self.restoring.store(false, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
                () = &mut checkpoint_due => {
                    checkpoint_due.as_mut().reset(tokio::time::Instant::now() + interval);
                    let positions = reader.positions();
                    if positions != checkpointed && replay_over(&mut written, &reader) {
                        checkpointed = positions;
                        self.checkpoint(&checkpoints, checkpointed.clone()).await;
                    }
                }
                _ = stop.changed() => {
                    if replay_over(&mut written, &reader) {
                        self.checkpoint(&checkpoints, reader.positions()).await;
                    }
                    return Ok(());
                }
            }
        }
    }

    async fn run_replicated(
        &self,
        hub: Arc<Hub>,
        checkpointing: Checkpointing,
        replicator: Arc<dyn Replicator>,
        mut leading: tokio::sync::watch::Receiver<Option<u64>>,
    ) -> Result<(), EngineError> {
        let checkpoints = &checkpointing.topic;
        let mut stop = self.stop.receiver();
        let mut saved = None;
        loop {
            let term = *leading.borrow_and_update();
            if let Some(term) = term {
                tracing::info!(transform = self.name(), term, "this node leads: it runs the transform");
                // A read that failed ends this run, not the transform: it starts again.
                let led = self
                    .lead(term, &hub, &checkpointing, &replicator, &mut leading, &mut stop, &mut saved)
                    .await
                    .unwrap_or_else(Led::Failed);
                match led {
                    Led::Stopped => break,
                    Led::Deposed => {
                        tracing::info!(
                            transform = self.name(),
                            term,
                            "this node no longer leads: the transform runs elsewhere"
                        );
                        self.restoring.store(false, Ordering::Relaxed);
                        continue;
                    }
                    Led::Failed(error) => {
                        tracing::warn!(
                            transform = self.name(),
                            %error,
                            "the transform's run on the leader stopped: it starts again from where the cluster has it"
                        );
                        tokio::select! {
                            () = tokio::time::sleep(RETRY_AFTER) => continue,
                            _ = stop.changed() => break,
                        }
                    }
                }
            }
            tokio::select! {
                changed = leading.changed() => if changed.is_err() { break },
                _ = stop.changed() => break,
                () = tokio::time::sleep(checkpointing.interval) => self.save_applied(checkpoints, &mut saved).await,
            }
        }
        self.save_applied(checkpoints, &mut saved).await;
        Ok(())
    }

    /// Runs the transform on the leader in `term`, from where it is as applied here, until
    /// this node no longer leads in that term, the transform stops, or a batch is not written.
    #[allow(clippy::too_many_arguments)]
    async fn lead(
        &self,
        term: u64,
        hub: &Arc<Hub>,
        checkpointing: &Checkpointing,
        replicator: &Arc<dyn Replicator>,
        leading: &mut tokio::sync::watch::Receiver<Option<u64>>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
        saved: &mut Option<TransformCheckpoint>,
    ) -> Result<Led, EngineError> {
        let at = self.applied();
        let mut written = self.written_since(&at.output_ends)?;
        // Where the cluster has it (each batch must start there), and where reading starts:
        // past what retention removed, and at the start of partitions added since.
        let mut from = at.positions;
        let positions: Vec<Vec<u64>> = self
            .sources
            .iter()
            .zip(self.branch_positions(&from))
            .map(|(source, at)| {
                let starts = source.start_offsets();
                starts
                    .iter()
                    .enumerate()
                    .map(|(partition, start)| at.get(partition).copied().unwrap_or(0).max(*start))
                    .collect()
            })
            .collect();
        let mut reader = Reader::new(self.name(), hub, &self.sources, positions)?;
        self.restoring.store(reader.restoring(), Ordering::Relaxed);
        // One timer across turns, as in `run`.
        let tick_due = tokio::time::sleep(checkpointing.interval);
        tokio::pin!(tick_due);
        let mut batch: Vec<NewRecord> = Vec::new();
        loop {
            tokio::select! {
                delivery = reader.next() => {
                    self.take_ready(delivery?, &mut reader, &mut written, &mut batch)?;
                    // Records the filter skipped only: the position moves on with the next
                    // batch, or at the next tick.
                    if batch.is_empty() {
                        continue;
                    }
                    let to = reader.positions();
                    match self.write_replicated(replicator, &from, &to, &mut batch, stop).await {
                        Some(Ok(())) => from = to,
                        Some(Err(error)) => return Ok(Led::Failed(error)),
                        None => return Ok(Led::Stopped),
                    }
                    if reader.caught_up() {
                        self.restoring.store(false, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
                () = &mut tick_due => {
                    tick_due.as_mut().reset(tokio::time::Instant::now() + checkpointing.interval);
                    self.save_applied(&checkpointing.topic, saved).await;
                    let to = reader.positions();
                    if to != from {
                        // Skipped records only since the last batch: the position alone.
                        match self.write_replicated(replicator, &from, &to, &mut batch, stop).await {
                            Some(Ok(())) => from = to,
                            Some(Err(error)) => return Ok(Led::Failed(error)),
                            None => return Ok(Led::Stopped),
                        }
                    }
                }
                changed = leading.changed() => {
                    if changed.is_err() || *leading.borrow_and_update() != Some(term) {
                        return Ok(Led::Deposed);
                    }
                }
                _ = stop.changed() => return Ok(Led::Stopped),
            }
        }
    }

    /// Writes `batch` (made from the source between `from` and `to`) through the cluster:
    /// `None` if the transform stopped first (the batch may be written or not).
    async fn write_replicated(
        &self,
        replicator: &Arc<dyn Replicator>,
        from: &[u64],
        to: &[u64],
        batch: &mut Vec<NewRecord>,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<Result<(), EngineError>> {
        let groups: Vec<(u32, Vec<NewRecord>)> = self
            .partition_batch(batch)
            .into_iter()
            .enumerate()
            .filter(|(_, group)| !group.is_empty())
            .map(|(partition, group)| (partition as u32, group))
            .collect();
        let count: usize = groups.iter().map(|(_, group)| group.len()).sum();
        let written = replicated::transform_write(replicator, self.name(), from.to_vec(), to.to_vec(), groups);
        tokio::select! {
            written = written => {
                if written.is_ok() {
                    self.counters.records_out.fetch_add(count as u64, Ordering::Relaxed);
                }
                Some(written)
            }
            _ = stop.changed() => None,
        }
    }

    /// Checkpoints where the transform is as applied here, if that moved since `saved`.
    async fn save_applied(&self, checkpoints: &SystemTopic, saved: &mut Option<TransformCheckpoint>) {
        let applied = self.applied();
        if saved.as_ref().is_some_and(|saved| saved.positions == applied.positions) {
            return;
        }
        let record = applied.record(self.name());
        match checkpoints.append(std::slice::from_ref(&record)).await {
            Ok(_) => *saved = Some(applied),
            Err(error) => tracing::warn!(transform = self.name(), %error, "the transform could not be checkpointed"),
        }
    }

    /// The source positions named by output records written after `ends` (by a run that
    /// crashed before its next checkpoint), read a step of at most `WRITTEN_SCAN_READ_*` at a
    /// time.
    fn written_since(&self, ends: &[u64]) -> Result<HashSet<SourcePosition>, EngineError> {
        let mut written = HashSet::new();
        for partition in 0..self.output.partition_count() {
            let log = self.output.partition(partition)?;
            let end = log.end_offset();
            let mut next = ends.get(partition as usize).copied().unwrap_or(0).max(log.start_offset());
            while next < end {
                let records = log.read(next, WRITTEN_SCAN_READ_RECORDS_MAX, WRITTEN_SCAN_READ_BYTES_MAX)?;
                let Some(last) = records.last() else { break };
                next = last.offset + 1;
                written.extend(records.iter().filter_map(SourcePosition::of));
            }
        }
        if !written.is_empty() {
            tracing::info!(
                transform = self.name(),
                records = written.len(),
                "found output written after the last checkpoint: those source records are not written again"
            );
        }
        Ok(written)
    }

    /// Evaluates `first`, and whatever else is ready now (up to a batch), into `batch`: one
    /// write for many records.
    fn take_ready(
        &self,
        first: (usize, Delivery),
        reader: &mut Reader,
        written: &mut HashSet<SourcePosition>,
        batch: &mut Vec<NewRecord>,
    ) -> Result<(), EngineError> {
        let mut outputs = Vec::new();
        self.take(first, reader, written, batch, &mut outputs)?;
        while batch.len() < BATCH_MAX {
            match reader.ready() {
                Some(delivery) => self.take(delivery?, reader, written, batch, &mut outputs)?,
                None => break,
            }
        }
        Ok(())
    }

    /// Evaluates one delivery of branch `branch` into `batch` (`outputs` is scratch space).
    fn take(
        &self,
        (branch, delivery): (usize, Delivery),
        reader: &mut Reader,
        written: &mut HashSet<SourcePosition>,
        batch: &mut Vec<NewRecord>,
        outputs: &mut Vec<Output>,
    ) -> Result<(), EngineError> {
        match delivery {
            Delivery::Event(event, _) => {
                let record = &event.record;
                self.counters.records_in.fetch_add(1, Ordering::Relaxed);
                let value = parse_value(record);
                let tables = &self.tables[branch];
                let find = |at: usize, id: &str| tables[at].get_doc(id);
                outputs.clear();
                // A JOIN that matched no row: nothing (counted as filtered).
                if let Some(value) = self.def.joined(branch, record, event.partition, value, &find) {
                    self.def.apply(branch, &Input::of(record, event.partition, &value), record, outputs);
                }
                if outputs.is_empty() {
                    self.counters.filtered.fetch_add(1, Ordering::Relaxed);
                }
                for Output { record: output, source, subject_valid } in outputs.drain(..) {
                    if !written.is_empty() && written.remove(&source) {
                        // Written before a crash, after the checkpoint.
                        self.counters.records_out.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    if !subject_valid {
                        metrics::counter!("transform_invalid_subjects_total", "transform" => self.def.name.clone())
                            .increment(1);
                    }
                    batch.push(output);
                }
            }
            Delivery::Overflow { positions } => {
                // Fell behind the live feed: read on from the log.
                reader.refollow(branch, positions)?;
            }
        }
        Ok(())
    }

    /// Appends `batch` to the output, each record to its key's partition, all partitions at
    /// once, and returns once every record is durable. A record the output's limits refuse is
    /// dropped (counted, logged); a storage failure is retried until it succeeds or the
    /// transform stops (false).
    async fn write(&self, batch: &mut Vec<NewRecord>, stop: &mut tokio::sync::watch::Receiver<bool>) -> bool {
        if batch.is_empty() {
            return true;
        }
        let mut groups = self.partition_batch(batch);
        loop {
            let mut pending = Vec::new();
            let mut failed = false;
            for (partition, group) in groups.iter().enumerate() {
                if group.is_empty() {
                    continue;
                }
                match self.output.enqueue_to(partition as u32, group, None).await {
                    Ok(ack) => pending.push((partition, ack)),
                    Err(error) => {
                        tracing::warn!(transform = self.name(), %error, "the transform's output could not be written");
                        failed = true;
                    }
                }
            }
            for (partition, ack) in pending {
                match ack.await {
                    Ok(_) => {
                        let written = groups[partition].len() as u64;
                        self.counters.records_out.fetch_add(written, Ordering::Relaxed);
                        groups[partition].clear();
                    }
                    Err(error) => {
                        tracing::warn!(transform = self.name(), %error, "the transform's output could not be written");
                        failed = true;
                    }
                }
            }
            if !failed {
                return true;
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY_AFTER) => {}
                _ = stop.changed() => return false,
            }
        }
    }

    /// Takes `batch` apart into the records for each output partition (its key's, or round
    /// robin for records with none), leaving out a record the output's limits refuse (counted,
    /// logged).
    fn partition_batch(&self, batch: &mut Vec<NewRecord>) -> Vec<Vec<NewRecord>> {
        let count = self.output.partition_count() as usize;
        let mut groups: Vec<Vec<NewRecord>> = vec![Vec::new(); count];
        let mut keyless = 0usize;
        for record in batch.drain(..) {
            let partition = match &record.key {
                Some(key) => self.output.partition_for_key(key) as usize,
                None => {
                    keyless = (keyless + 1) % count;
                    keyless
                }
            };
            let log = self.output.partition(partition as u32).expect("a partition of the output");
            if let Err(error) = log.check(std::slice::from_ref(&record)) {
                self.counters.rejected.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("transform_rejected_records_total", "transform" => self.def.name.clone())
                    .increment(1);
                tracing::warn!(transform = self.name(), %error, "a transformed record was not written");
                continue;
            }
            groups[partition].push(record);
        }
        groups
    }

    /// Writes where the transform is: `positions` in its sources, and its output's ends now
    /// (every batch before is durable).
    async fn checkpoint(&self, checkpoints: &SystemTopic, positions: Vec<u64>) {
        let ends = self.output.end_offsets();
        let record = TransformCheckpoint::new(positions, ends).record(self.name());
        if let Err(error) = checkpoints.append(std::slice::from_ref(&record)).await {
            tracing::warn!(transform = self.name(), %error, "the transform could not be checkpointed");
        }
    }
}

/// Whether the replay after a crash is over, so that a checkpoint may be written where the
/// reader is: no output the crashed run wrote is left for records still ahead (`written`, less
/// what the reader has passed without writing it again, which can no longer come). A
/// checkpoint before that would say the output ends at its end, and a crash after it would
/// replay from here without knowing that the records ahead were written, before that end: they
/// would be written twice. The checkpoint the replay started from stays the one to restart
/// from.
fn replay_over(written: &mut HashSet<SourcePosition>, reader: &Reader) -> bool {
    if !written.is_empty() {
        written.retain(|position| !reader.passed(position));
    }
    written.is_empty()
}
