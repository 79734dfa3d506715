//! The commit pipeline of one partition: a write thread and a sync thread.
//!
//! The write thread takes every queued append, encodes them as one batch and writes it with one
//! `pwrite`, then hands the batch to the sync thread. The sync thread takes every batch written
//! so far, makes them durable with one `fdatasync` (if any of them asked for `fsync`), publishes
//! them to readers in offset order and acknowledges them. So while one fdatasync runs, the next
//! batches are already being written, and the next fdatasync starts the moment the previous one
//! ends, covering everything written meanwhile: the disk is never idle while work waits, and
//! concurrent writers share syncs.
//!
//! When a batch that needs an fsync finds nothing ahead of it and no append behind it (a
//! partition at low load), the write thread syncs, publishes and acknowledges it itself, one
//! thread hand-off fewer; the next batch then waits for that sync, which is what it would do
//! behind the sync thread too, less the time to write it.
//!
//! Both are OS threads, not tokio tasks: `fdatasync` blocks for a millisecond or more and must
//! never stall a runtime worker.
//!
//! Ordering: batches are published strictly in offset order. The write thread publishes an
//! `async` batch itself only when nothing is ahead of it in the pipeline; otherwise the sync
//! thread publishes it after the batches before it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

use crate::config::Durability;
use crate::error::AppendError;
use crate::format::{BATCH_HEADER_BYTES, BatchBuilder, BatchHeader};
use crate::metrics as m;
use crate::partition::{AppendAck, Pending, Shared};
use crate::segment::Segment;
use crate::tail::{CachedBatch, TAIL_CACHE_AGE, TAIL_CACHE_BYTES};

type Ack = (oneshot::Sender<Result<AppendAck, AppendError>>, AppendAck, OwnedSemaphorePermit);

/// A batch on disk (page cache), not yet visible to readers.
pub(crate) struct Written {
    segment: Arc<Segment>,
    position: u64,
    header: BatchHeader,
    needs_fsync: bool,
    /// Its record's ticket in the log's journal, when the partition journals its batches.
    ticket: Option<u64>,
    acks: Vec<Ack>,
}

/// What the write thread hands to the sync thread, in order.
pub(crate) enum Entry {
    Batch(Written),
    /// A roll closed `closed` and started `next`: once everything before is published, the
    /// closed segment's index describes all of it and is written, and only then does `next`
    /// join the partition's segments. Retention and compaction take every segment but the last
    /// one there as closed, so they must not see `closed` that way while batches of it are
    /// unpublished or its index is being written.
    Closed {
        closed: Arc<Segment>,
        next: Arc<Segment>,
    },
}

impl Entry {
    fn needs_fsync(&self) -> bool {
        matches!(self, Entry::Batch(batch) if batch.needs_fsync)
    }

    fn segment(&self) -> &Arc<Segment> {
        match self {
            Entry::Batch(batch) => &batch.segment,
            Entry::Closed { closed, .. } => closed,
        }
    }
}

/// Batches between the write thread and the sync thread.
#[derive(Default)]
pub(crate) struct CommitQueue {
    written: VecDeque<Entry>,
    /// The sync thread holds batches it took and has not published yet.
    syncing: bool,
    /// A segment with published `async` batches that no fsync has covered yet.
    unsynced: Option<Arc<Segment>>,
    /// The write thread has exited: drain, sync and stop.
    writer_done: bool,
    /// The segment being written, where the sync thread grows the zero runway when idle.
    active: Option<Arc<Segment>>,
}

/// The write thread's state.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    active: Arc<Segment>,
    /// The offset the next batch gets (assigned at write, published later).
    next_offset: u64,
    /// Reused for batches too large for the tail cache (the others become the cached bytes).
    buffer: Vec<u8>,
    /// An empty queue with capacity, swapped in when the writer takes the whole queue, so
    /// appenders do not regrow it (under the queue lock) after every batch.
    spare: Vec<Pending>,
    /// When everything in the tail cache is older than its age, if it holds anything: an idle
    /// partition lets its cache go then, instead of holding it until the next write.
    tail_stale_at: Option<Instant>,
}

impl Writer {
    pub(crate) fn new(shared: Arc<Shared>, active: Arc<Segment>, next_offset: u64) -> Self {
        Writer { shared, active, next_offset, buffer: Vec::new(), spare: Vec::new(), tail_stale_at: None }
    }

    pub(crate) fn run(mut self) {
        let syncer = {
            let shared = self.shared.clone();
            let name = format!("{}-sync", std::thread::current().name().unwrap_or("log-writer"));
            std::thread::Builder::new().name(name).spawn(move || Syncer { shared, last_sync: Instant::now() }.run())
        };
        self.shared.commit.lock().expect("commit lock").active = Some(self.active.clone());
        let syncer = match syncer {
            Ok(handle) => Some(handle),
            Err(error) => {
                self.poison(format!("cannot start the sync thread: {error}"), Vec::new());
                None
            }
        };
        loop {
            let (taken, closing) = self.take();
            if !taken.is_empty() {
                self.write(taken);
            }
            if closing {
                break;
            }
        }
        {
            let mut commit = self.shared.commit.lock().expect("commit lock");
            commit.writer_done = true;
            self.shared.commit_ready.notify_one();
        }
        if let Some(syncer) = syncer
            && syncer.join().is_err()
        {
            tracing::error!(partition = %self.shared.label, "the log sync thread panicked");
        }
        // A clean close leaves an exact file (no zero tail) and an index describing it, so the
        // next open needs no scan. After an I/O failure nothing is touched: what reached the
        // disk is unknown, and the next open must scan the segment rather than trust an index
        // written now.
        let poisoned = self.shared.queue.lock().expect("queue lock").poisoned.is_some();
        if poisoned {
            tracing::warn!(partition = %self.shared.label, "closing a poisoned partition as it is; the next open scans it");
        } else {
            self.close_active();
        }
        self.shared.watermark.send_modify(|watermark| watermark.closed = true);
        self.shared.queue_credit.close();
    }

    /// Trims the active segment to its data and writes its index, on a clean close.
    fn close_active(&self) {
        match self.active.trim() {
            Ok(()) => {
                if let Err(error) = self.active.persist_index(&self.shared.dir) {
                    tracing::warn!(partition = %self.shared.label, %error, "could not write the index on close; it will be rebuilt on open");
                }
            }
            Err(error) => {
                tracing::warn!(partition = %self.shared.label, %error, "could not trim the active segment on close; the next open scans it")
            }
        }
    }

    /// Waits for appends; returns those that fit one batch, and whether the partition is
    /// closing with nothing left to write.
    fn take(&mut self) -> (Vec<Pending>, bool) {
        let mut queue = self.shared.queue.lock().expect("queue lock");
        while queue.pending.is_empty() && !queue.closing {
            let Some(stale_at) = self.tail_stale_at else {
                queue = self.shared.queue_ready.wait(queue).expect("queue lock");
                continue;
            };
            let now = Instant::now();
            if now >= stale_at {
                // Idle for the cache's age: nobody close behind the writer needs it now.
                // Lock order: queue, then tail cache (readers take the tail cache alone).
                self.shared.tail.lock().expect("tail cache lock").clear();
                self.tail_stale_at = None;
                continue;
            }
            queue = self.shared.queue_ready.wait_timeout(queue, stale_at - now).expect("queue lock").0;
        }
        if let Some(reason) = queue.poisoned.clone() {
            let refused = std::mem::take(&mut queue.pending);
            let closing = queue.closing;
            drop(queue);
            for pending in refused {
                let _ = pending.ack.send(Err(AppendError::Poisoned(reason.clone())));
            }
            return (Vec::new(), closing);
        }
        let limit = self.shared.config.batch_bytes_max;
        let (mut bytes, mut count) = (0, 0);
        for pending in &queue.pending {
            if count > 0 && bytes + pending.encoded.len() > limit {
                break;
            }
            bytes += pending.encoded.len();
            count += 1;
        }
        let taken: Vec<Pending> = if count == queue.pending.len() {
            std::mem::replace(&mut queue.pending, std::mem::take(&mut self.spare))
        } else {
            queue.pending.drain(..count).collect()
        };
        let closing = queue.closing && queue.pending.is_empty();
        (taken, closing)
    }

    /// Encodes `taken` as one batch, writes it, and passes it on to be synced and published.
    fn write(&mut self, mut taken: Vec<Pending>) {
        let base_offset = self.next_offset;
        let batch_bytes = BATCH_HEADER_BYTES + taken.iter().map(|pending| pending.encoded.len()).sum::<usize>();
        // A batch the tail cache keeps is built in a buffer of its own, which becomes the cached
        // bytes as it is: no copy between the write and the acknowledgement. A larger one is
        // built in the reused buffer.
        let cached = batch_bytes <= TAIL_CACHE_BYTES;
        let mut buffer = if cached { Vec::with_capacity(batch_bytes) } else { std::mem::take(&mut self.buffer) };
        buffer.clear();
        let mut builder = BatchBuilder::new(&mut buffer, base_offset);
        let mut offset = base_offset;
        let mut needs_fsync = false;
        for pending in &taken {
            builder.push_encoded(
                &pending.encoded,
                offset,
                pending.count,
                pending.first_timestamp_ms,
                pending.max_timestamp_ms,
            );
            if pending.null_headers {
                builder.holds_null_header_values();
            }
            offset += pending.count as u64;
            needs_fsync |= pending.durability == Durability::Fsync;
        }
        let header = builder.finish();
        // Offsets are assigned here and nowhere else: dense, from where the last batch ended,
        // one per record of every append taken. (Paired with the checks where they are read
        // back: `publish` below, and every read in `partition.rs`.)
        assert_eq!(header.base_offset, base_offset, "a batch starts at the writer's next offset");
        assert_eq!(header.next_offset(), offset, "a batch's offsets are dense");
        assert_eq!(header.record_count as u64, offset - base_offset, "a batch holds every record of its appends");
        let written = self.active.written_bytes();
        if written > 0
            && written + header.batch_len as u64 > self.shared.config.segment_bytes_max
            && let Err(reason) = self.roll(base_offset)
        {
            self.poison(reason, taken);
            return;
        }
        let position = self.active.written_bytes();
        if let Err(error) = self.active.write(&buffer, self.shared.config.segment_bytes_max) {
            self.poison(format!("write failed: {error}"), taken);
            return;
        }
        let ticket = match self.shared.journal.get() {
            Some(handle) => {
                match handle.journal.submit(&handle.topic, handle.partition, &self.active, position, &buffer) {
                    Ok(ticket) => Some(ticket),
                    Err(reason) => {
                        // The batch is in the segment but cannot be made durable: as after a
                        // failed write, nothing more is taken.
                        self.poison(reason, taken);
                        return;
                    }
                }
            }
            None => None,
        };
        self.next_offset = header.next_offset();
        if cached {
            debug_assert_eq!(buffer.len(), batch_bytes, "a batch is its header and its appends' records");
            let written_at = Instant::now();
            let bytes = Bytes::from(buffer);
            let batch = CachedBatch { segment: self.active.clone(), position, header, bytes, written_at };
            self.shared.tail.lock().expect("tail cache lock").push(batch);
            self.tail_stale_at = Some(written_at + TAIL_CACHE_AGE);
        } else {
            self.shared.tail.lock().expect("tail cache lock").clear();
            self.buffer = buffer;
        }
        let mut acks = Vec::with_capacity(taken.len());
        let mut offset = base_offset;
        for pending in taken.drain(..) {
            acks.push((pending.ack, AppendAck { base_offset: offset, record_count: pending.count }, pending.credit));
            offset += pending.count as u64;
        }
        assert_eq!(offset, self.next_offset, "the acknowledgements cover the batch exactly");
        if taken.capacity() > self.spare.capacity() {
            self.spare = taken;
        }
        let batch = Written { segment: self.active.clone(), position, header, needs_fsync, ticket, acks };
        let mut commit = self.shared.commit.lock().expect("commit lock");
        if needs_fsync && commit.written.is_empty() && !commit.syncing && self.queue_is_empty() {
            // Nothing ahead of this batch and nothing behind it: make it durable here instead
            // of waking the sync thread, one thread hand-off fewer (30–80 µs on a VM whose
            // cores sleep between events). Under load appends queue behind the batch or a
            // sync is running, and the batch goes through the sync thread, so writing the next
            // batch overlaps this one's fdatasync. `syncing` keeps the sync thread from
            // publishing or starting a sync meanwhile; only this thread adds batches.
            commit.syncing = true;
            let unsynced = commit.unsynced.take();
            drop(commit);
            self.sync_inline(batch, unsynced);
            return;
        }
        if !needs_fsync && commit.written.is_empty() && !commit.syncing {
            // Nothing ahead of this `async` batch: publish it now, without a thread handoff.
            // Holding the commit lock keeps the sync thread from publishing meanwhile.
            let was_idle = commit.unsynced.is_none();
            commit.unsynced = Some(batch.segment.clone());
            publish(&self.shared, vec![Entry::Batch(batch)]);
            if was_idle {
                // Wake the sync thread so it arms the background fsync timer.
                self.shared.commit_ready.notify_one();
            }
        } else {
            commit.written.push_back(Entry::Batch(batch));
            self.shared.commit_ready.notify_one();
        }
    }

    fn queue_is_empty(&self) -> bool {
        self.shared.queue.lock().expect("queue lock").pending.is_empty()
    }

    /// Syncs `batch` (and a segment with earlier unsynced `async` batches), then publishes and
    /// acknowledges it, on the write thread. The caller has set `syncing`.
    fn sync_inline(&mut self, batch: Written, unsynced: Option<Arc<Segment>>) {
        let fsync_seconds = &self.shared.meters.fsync_seconds;
        let mut synced = match (self.shared.journal.get(), batch.ticket) {
            // The journal holds this batch and every earlier one of the partition, async
            // batches included: its sync covers them all.
            (Some(handle), Some(ticket)) => handle.journal.wait(ticket).map_err(std::io::Error::other),
            _ => sync_timed(&batch.segment, fsync_seconds),
        };
        if synced.is_ok()
            && batch.ticket.is_none()
            && let Some(segment) = unsynced.filter(|segment| !Arc::ptr_eq(segment, &batch.segment))
        {
            synced = sync_timed(&segment, fsync_seconds);
        }
        match synced {
            Ok(()) => {
                self.shared.meters.inline_syncs.increment(1);
                publish(&self.shared, vec![Entry::Batch(batch)]);
            }
            Err(error) => {
                let reason = format!("fsync failed: {error}");
                poison(&self.shared, &reason);
                refuse(batch.acks, &reason);
            }
        }
        let mut commit = self.shared.commit.lock().expect("commit lock");
        commit.syncing = false;
        // The sync thread may have skipped idle work (the runway) while this sync ran.
        self.shared.commit_ready.notify_one();
    }

    /// Closes the active segment (synced, index written) and starts a new one at `base_offset`.
    fn roll(&mut self, base_offset: u64) -> Result<(), String> {
        // The closed segment must be durable, and exact (no zero tail), before the next exists:
        // recovery trusts every segment but the last.
        self.active
            .trim()
            .map_err(|error| format!("trimming and syncing the segment before a roll failed: {error}"))?;
        let segment = Segment::create(
            &self.shared.dir,
            base_offset,
            self.shared.config.index_interval_bytes,
            &*self.shared.storage,
        )
        .map(Arc::new)
        .map_err(|error| format!("could not create a segment: {error}"))?;
        let closed = std::mem::replace(&mut self.active, segment.clone());
        metrics::counter!(m::SEGMENTS_ROLLED).increment(1);
        // Only the active segment is cached: retention and compaction never touch it, so a
        // cached batch is always what the file holds.
        self.shared.tail.lock().expect("tail cache lock").clear();
        self.tail_stale_at = None;
        // The closed segment's index describes its published bytes, so the sync thread writes
        // it after publishing the closed segment's last batch, then adds the new segment.
        let mut commit = self.shared.commit.lock().expect("commit lock");
        commit.written.push_back(Entry::Closed { closed, next: segment.clone() });
        // The runway now grows on the new segment (the closed one refuses it anyway).
        commit.active = Some(segment);
        Ok(())
    }

    fn poison(&mut self, reason: String, taken: Vec<Pending>) {
        poison(&self.shared, &reason);
        for pending in taken {
            let _ = pending.ack.send(Err(AppendError::Poisoned(reason.clone())));
        }
    }
}

/// After an I/O failure the partition refuses all writes: what reached the disk is unknown, and
/// guessing could acknowledge data that recovery will cut.
fn poison(shared: &Shared, reason: &str) {
    let mut queue = shared.queue.lock().expect("queue lock");
    if queue.poisoned.is_none() {
        tracing::error!(partition = %shared.label, %reason, "log partition poisoned; refusing writes");
        metrics::counter!(m::POISONED).increment(1);
        queue.poisoned = Some(reason.to_string());
    }
}

/// Publishes batches to readers in order and acknowledges them.
fn publish(shared: &Shared, entries: Vec<Entry>) {
    let mut next_offset = None;
    let (mut appends, mut records, mut bytes) = (0u64, 0u64, 0u64);
    let mut acks = Vec::new();
    for entry in entries {
        let batch = match entry {
            Entry::Batch(batch) => batch,
            Entry::Closed { closed, next } => {
                // Every batch of `closed` is published: make them visible before maintenance can
                // take `closed` as closed, since compaction reads only up to the end offset.
                if let Some(next_offset) = next_offset {
                    shared.next_offset.store(next_offset, Ordering::Release);
                    shared.watermark.send_modify(|watermark| watermark.next_offset = next_offset);
                }
                if let Err(error) = closed.persist_index(&shared.dir) {
                    tracing::warn!(partition = %shared.label, %error, "could not write a segment index; it will be rebuilt on open");
                }
                let _manifest = shared.manifest.lock().expect("manifest lock");
                shared.segments.write().expect("segments lock").insert(next.base_offset, next);
                // Not fatal: a manifest a roll behind still describes every segment it lists, and
                // opening takes the new file as that roll.
                if let Err(error) = shared.write_manifest(&[], None) {
                    tracing::warn!(partition = %shared.label, %error, "could not rewrite the segment manifest after a roll");
                }
                continue;
            }
        };
        // Batches become readable in offset order, each right after the one before: the end
        // readers see only grows, and never skips an offset a batch did not take.
        let published_end = next_offset.unwrap_or_else(|| shared.next_offset.load(Ordering::Acquire));
        assert_eq!(batch.header.base_offset, published_end, "batches are published in offset order, none skipped");
        batch.segment.publish(batch.position, &batch.header);
        next_offset = Some(batch.header.next_offset());
        appends += batch.acks.len() as u64;
        records += batch.header.record_count as u64;
        bytes += batch.header.batch_len as u64;
        shared.meters.batch_records.record(batch.header.record_count as f64);
        acks.extend(batch.acks);
    }
    if let Some(next_offset) = next_offset {
        shared.next_offset.store(next_offset, Ordering::Release);
        shared.watermark.send_modify(|watermark| watermark.next_offset = next_offset);
    }
    // Counted before the acknowledgements, so a client that reads the metrics after its
    // answer finds its write counted.
    shared.meters.appends.increment(appends);
    shared.meters.records.increment(records);
    shared.meters.bytes.increment(bytes);
    // Acknowledge only after readers can see the records, so a writer can read its own write.
    for (sender, ack, credit) in acks {
        let _ = sender.send(Ok(ack));
        drop(credit);
    }
}

/// The sync thread's state.
struct Syncer {
    shared: Arc<Shared>,
    last_sync: Instant,
}

impl Syncer {
    fn run(mut self) {
        let interval = Duration::from_millis(self.shared.config.async_fsync_interval_ms);
        loop {
            let mut commit = self.shared.commit.lock().expect("commit lock");
            loop {
                if !commit.written.is_empty() {
                    break;
                }
                if let Some(segment) = commit.unsynced.clone() {
                    let deadline = self.last_sync + interval;
                    let now = Instant::now();
                    if now >= deadline || commit.writer_done {
                        // The background fsync of published `async` batches (or the final one).
                        commit.unsynced = None;
                        commit.syncing = true;
                        drop(commit);
                        if let Err(error) = self.sync(&segment) {
                            poison(&self.shared, &format!("background fsync failed: {error}"));
                        }
                        commit = self.shared.commit.lock().expect("commit lock");
                        commit.syncing = false;
                        continue;
                    }
                    commit = self.shared.commit_ready.wait_timeout(commit, deadline - now).expect("commit lock").0;
                    continue;
                }
                if !commit.writer_done
                    && !commit.syncing
                    && let Some(active) = commit.active.clone()
                    && active.needs_runway(self.shared.config.segment_bytes_max)
                {
                    // Idle: no batch waits for a sync, so growing the runway (and syncing it)
                    // delays nobody now and makes the coming data syncs cheaper.
                    drop(commit);
                    let grown =
                        active.grow_runway(self.shared.config.segment_bytes_max).and_then(|()| self.sync(&active));
                    if let Err(error) = grown {
                        // Not fatal: data syncs still work, by appending. Stop trying.
                        tracing::warn!(partition = %self.shared.label, %error, "cannot grow the segment's zero runway; appending instead");
                        commit = self.shared.commit.lock().expect("commit lock");
                        commit.active = None;
                    } else {
                        commit = self.shared.commit.lock().expect("commit lock");
                    }
                    continue;
                }
                if commit.writer_done {
                    return;
                }
                commit = self.shared.commit_ready.wait(commit).expect("commit lock");
            }
            let entries: Vec<Entry> = commit.written.drain(..).collect();
            commit.syncing = true;
            let unsynced = commit.unsynced.take();
            drop(commit);
            let needs_fsync = entries.iter().any(Entry::needs_fsync);
            let mut failure = None;
            let ticket = entries
                .iter()
                .filter_map(|entry| match entry {
                    Entry::Batch(batch) => batch.ticket,
                    Entry::Closed { .. } => None,
                })
                .max();
            if needs_fsync && let (Some(handle), Some(ticket)) = (self.shared.journal.get(), ticket) {
                // One sync of the journal, shared with every other partition's batches.
                if let Err(reason) = handle.journal.wait(ticket) {
                    failure = Some(reason);
                }
            } else if needs_fsync {
                // Sync every segment the batches touch, plus one holding earlier unsynced async
                // batches; a segment closed by a roll was already synced by the write thread.
                let mut synced: Vec<*const Segment> = Vec::new();
                let segments = unsynced.iter().chain(entries.iter().map(Entry::segment));
                for segment in segments {
                    if synced.contains(&Arc::as_ptr(segment)) {
                        continue;
                    }
                    synced.push(Arc::as_ptr(segment));
                    if let Err(error) = self.sync(segment) {
                        failure = Some(format!("fsync failed: {error}"));
                        break;
                    }
                }
            }
            if let Some(reason) = failure {
                poison(&self.shared, &reason);
                // Nothing after a failed sync can be acknowledged: these and every batch queued
                // behind them are refused.
                let mut commit = self.shared.commit.lock().expect("commit lock");
                for entry in entries.into_iter().chain(commit.written.drain(..)) {
                    if let Entry::Batch(batch) = entry {
                        refuse(batch.acks, &reason);
                    }
                }
                commit.syncing = false;
                continue;
            }
            // Only `async` batches, unsynced: remember where the background fsync must go.
            let still_unsynced = if needs_fsync {
                None
            } else {
                entries
                    .iter()
                    .rev()
                    .find(|entry| matches!(entry, Entry::Batch(_)))
                    .map(|entry| entry.segment().clone())
                    .or(unsynced)
            };
            // Published without the commit lock: `syncing` keeps the write thread from
            // publishing anything meanwhile, so offsets stay in order.
            publish(&self.shared, entries);
            let mut commit = self.shared.commit.lock().expect("commit lock");
            commit.unsynced = still_unsynced;
            commit.syncing = false;
        }
    }

    fn sync(&mut self, segment: &Segment) -> std::io::Result<()> {
        sync_timed(segment, &self.shared.meters.fsync_seconds)?;
        self.last_sync = Instant::now();
        Ok(())
    }
}

/// One fdatasync of `segment`, timed into the fsync histogram when it succeeds.
fn sync_timed(segment: &Segment, fsync_seconds: &metrics::Histogram) -> std::io::Result<()> {
    let started = Instant::now();
    segment.sync()?;
    fsync_seconds.record(started.elapsed().as_secs_f64());
    Ok(())
}

/// Answers every append of a batch that cannot be made durable.
fn refuse(acks: Vec<Ack>, reason: &str) {
    for (sender, _, _) in acks {
        let _ = sender.send(Err(AppendError::Poisoned(reason.to_string())));
    }
}
