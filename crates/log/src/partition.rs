//! A partition: a directory of segments, written by one commit pipeline (`writer.rs`).
//!
//! Appenders encode their records in their own task, take queue credit (bounded bytes), push
//! onto the queue and await a oneshot. The pipeline writes every pending append as one batch,
//! makes it durable with one `fdatasync` shared by all of them (group commit), publishes the new
//! end offset to readers and only then acknowledges.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};

use crate::config::{Durability, PartitionConfig};
use crate::error::Missing;
use crate::error::{AppendError, OpenError, ReadError, io_at};
use crate::file::{FileStorage, Storage};
use crate::format::{
    HEADERS_MAX, NewRecord, Record, RecordsFrom, SUBJECT_BYTES_MAX, decode_records, encode_record, records_from,
};
use crate::manifest::{Found, Manifest, MissingRecords, Unusable};
use crate::metrics as m;
use crate::recovery::{Discarded, RecoveryPolicy};
use crate::segment::{LOG_SUFFIX, Segment, sync_dir};

pub(crate) const CONFIG_FILE: &str = "partition.conf";

/// What an acknowledged append was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppendAck {
    /// Offset of the first record of the append; the others follow densely.
    pub base_offset: u64,
    pub record_count: u32,
}

impl AppendAck {
    pub fn last_offset(&self) -> u64 {
        self.base_offset + self.record_count as u64 - 1
    }
}

/// The end of the readable log, as readers are told about it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Watermark {
    /// Offset the next record will get; every record before it is durable and readable.
    pub next_offset: u64,
    pub closed: bool,
}

/// What recovery found when the partition opened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segments: usize,
    pub truncated_bytes: u64,
    /// Where the tail was cut and why, when it was.
    pub truncated_at: Option<(u64, String)>,
    pub indexes_rebuilt: usize,
    /// Damage set aside because the policy said to ([`RecoveryPolicy::discard_damaged`]).
    pub discarded: Vec<Discarded>,
    /// Records the segment files no longer held, accepted because the policy said to.
    pub missing: Vec<MissingRecords>,
}

/// How a partition is opened: the file layer under it and what recovery may do.
#[derive(Clone, Debug)]
pub struct PartitionOptions {
    pub storage: Arc<dyn Storage>,
    pub recovery: RecoveryPolicy,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions { storage: Arc::new(FileStorage), recovery: RecoveryPolicy::default() }
    }
}

/// One append waiting for the writer.
pub(crate) struct Pending {
    /// Records encoded back to back, offset deltas still zero.
    pub(crate) encoded: Vec<u8>,
    pub(crate) count: u32,
    /// A header value of these records is null: their batch must say so.
    pub(crate) null_headers: bool,
    pub(crate) first_timestamp_ms: i64,
    pub(crate) max_timestamp_ms: i64,
    pub(crate) durability: Durability,
    pub(crate) ack: oneshot::Sender<Result<AppendAck, AppendError>>,
    /// Queue credit, released when the append is acknowledged.
    pub(crate) credit: OwnedSemaphorePermit,
}

pub(crate) struct Queue {
    pub(crate) pending: Vec<Pending>,
    pub(crate) closing: bool,
    /// Set after an I/O failure: every later append is refused with this reason.
    pub(crate) poisoned: Option<String>,
}

/// What a partition's handle, its write thread and its sync thread share.
///
/// Lock order: `commit` → `queue` → `tail`, `commit` → `manifest` → `segments`, and
/// `maintenance` → `manifest` → `segments`. The write thread looks at the queue while holding `commit` (is anything behind
/// the batch it may sync inline?) and publishes under `commit` (adding a rolled segment to
/// `segments`); it clears the tail cache under `queue` when it idles; readers take `tail` or
/// `segments` alone, and `segments` is a leaf held only to clone or swap `Arc`s. Nothing takes
/// `commit` while holding `queue` or `tail`. No lock is held across an fdatasync but
/// `maintenance` (retention and compaction, which sync what they rewrite).
pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    /// Opens the segment files the writer creates on a roll and compaction rewrites.
    pub(crate) storage: Arc<dyn Storage>,
    /// Names the partition in logs (its directory).
    pub(crate) label: String,
    pub(crate) config: PartitionConfig,
    /// What a read that meets damage tells the operator to do (the recovery policy's).
    pub(crate) remedy: String,
    /// The retention limits in force, `(retention_ms, retention_bytes)`: the config's at open,
    /// changed by [`Partition::set_retention`] while the partition is open.
    pub(crate) retention: RwLock<(Option<u64>, Option<u64>)>,
    /// Segments by base offset. The writer inserts on roll; retention and compaction remove or
    /// replace closed segments; readers clone `Arc`s out and read without the lock.
    pub(crate) segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
    /// The committed end, for lock-free reads; `watermark` carries the same value to waiters.
    pub(crate) next_offset: AtomicU64,
    /// Records before this were deleted ([`Partition::delete_before`]); 0 when none were.
    /// The partition starts at the larger of this and its first segment's base offset.
    pub(crate) start: AtomicU64,
    pub(crate) watermark: watch::Sender<Watermark>,
    /// A mutex and condvar rather than a channel: the writer swaps out the whole queue in one
    /// lock, however many appenders are waiting.
    pub(crate) queue: Mutex<Queue>,
    pub(crate) queue_ready: Condvar,
    /// Bytes of appends queued but not yet acknowledged, capped at `queue_bytes_max`.
    pub(crate) queue_credit: Arc<Semaphore>,
    /// Batches written but not yet published, between the write thread and the sync thread.
    pub(crate) commit: Mutex<crate::writer::CommitQueue>,
    pub(crate) commit_ready: Condvar,
    /// The newest batches as written, for readers close behind the writer. A mutex: the write
    /// thread takes it once per batch and a reader once per read, each only to clone handles.
    pub(crate) tail: Mutex<crate::tail::TailCache>,
    /// Retention and compaction replace segments; one at a time.
    pub(crate) maintenance: Mutex<()>,
    /// Held from a change of `segments` to the manifest's rewrite that records it (a roll on
    /// the sync thread, maintenance), so the manifest is always written from the segments as
    /// they are and never lists a file that was deleted after it was written.
    pub(crate) manifest: Mutex<()>,
    pub(crate) meters: crate::metrics::Meters,
    /// The log's shared journal, when it has one: the write thread hands it every batch and an
    /// `fsync` append waits for the journal's sync instead of the segment's. Set once, by the
    /// log, before the first append.
    pub(crate) journal: std::sync::OnceLock<JournalHandle>,
}

/// A partition's way into its log's journal: the journal and the names its records carry.
pub(crate) struct JournalHandle {
    pub(crate) journal: crate::journal::Journal,
    pub(crate) topic: String,
    pub(crate) partition: u32,
}

impl Shared {
    /// Rewrites the manifest from the segments as they are, leaving out `removed`, and with the
    /// records of the segment compaction is rewriting (`rewritten`: its base offset and where
    /// its new records end) ending there. Called with `manifest` held, up to the change of
    /// `segments` it records.
    pub(crate) fn write_manifest(&self, removed: &[u64], rewritten: Option<(u64, u64)>) -> std::io::Result<()> {
        let manifest = {
            let segments = self.segments.read().expect("segments lock");
            let start = Some(self.start.load(Ordering::Acquire)).filter(|start| *start > 0);
            Manifest::of(
                start,
                segments.values().filter(|segment| !removed.contains(&segment.base_offset)).map(|segment| {
                    let end = match rewritten {
                        Some((base, end)) if base == segment.base_offset => end,
                        _ => segment.next_offset(),
                    };
                    (segment.base_offset, end)
                }),
            )
        };
        manifest.write(&self.dir)
    }
}

/// What a reader that goes on from where it stopped keeps between reads
/// ([`Partition::read_next`]): the rest of the batch its last read stopped in. It holds that
/// batch's bytes, which the records read from it share anyway.
#[derive(Default)]
pub struct ReadAhead {
    rest: Option<Rest>,
}

struct Rest {
    /// The offset a read must start from to go on with these records.
    next: u64,
    /// Where the batch ends, for a read that takes all that is left of it.
    batch_next_offset: u64,
    records: RecordsFrom,
    /// For reporting a record that does not decode: the segment and the batch's position.
    segment: Arc<Segment>,
    position: u64,
}

/// What taking a batch's records into a read left.
enum Taken {
    /// Every record of the batch is in, and the read wants more.
    Batch,
    /// The read is complete (the end, or its limits). When its limits stopped it inside the
    /// batch, the records left and the offset they start from.
    Read(Option<(u64, RecordsFrom)>),
}

/// Takes the records of one batch (from where `batch_records` starts) into a read's result,
/// up to the published `end` and the read's limits.
fn take_batch(
    mut batch_records: RecordsFrom,
    end: u64,
    records: &mut Vec<Record>,
    bytes: &mut usize,
    max_records: usize,
    max_bytes: usize,
) -> Result<Taken, crate::error::DecodeError> {
    while let Some(record) = batch_records.next() {
        let record = record?;
        if record.offset >= end {
            return Ok(Taken::Read(None));
        }
        let next = record.offset + 1;
        if take(records, bytes, record, max_records, max_bytes) {
            // Kept only with records left: an idle reader holds no batch.
            let left = !batch_records.is_done();
            return Ok(Taken::Read(left.then_some((next, batch_records))));
        }
    }
    Ok(Taken::Batch)
}

/// Adds `record` to a read's result; true when the read's limits are reached.
fn take(records: &mut Vec<Record>, bytes: &mut usize, record: Record, max_records: usize, max_bytes: usize) -> bool {
    *bytes += record.value.as_ref().map_or(0, Bytes::len) + record.key.as_ref().map_or(0, Bytes::len);
    records.push(record);
    records.len() >= max_records || *bytes >= max_bytes
}

/// A partition of the log. Cheap to share behind an `Arc`; `close` (or drop) stops its writer.
pub struct Partition {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

/// Checks `records` against the limits of a partition with `config`, as an append there would:
/// what it refuses, an append refuses with the same error. Returns their encoded size.
pub fn check_records(config: &PartitionConfig, records: &[NewRecord]) -> Result<usize, AppendError> {
    if records.is_empty() {
        return Err(AppendError::EmptyBatch);
    }
    let mut encoded_len = 0;
    for record in records {
        let len = record.encoded_len();
        if len > config.record_bytes_max {
            return Err(AppendError::RecordTooLarge { size: len, max: config.record_bytes_max });
        }
        if let Some(subject) = &record.subject
            && subject.len() > SUBJECT_BYTES_MAX
        {
            return Err(AppendError::SubjectTooLong(subject.len()));
        }
        if record.headers.len() > HEADERS_MAX || record.headers.iter().any(|(name, _)| name.len() > u16::MAX as usize) {
            return Err(AppendError::TooManyHeaders);
        }
        encoded_len += len;
    }
    if encoded_len > config.batch_bytes_max {
        return Err(AppendError::BatchTooLarge { size: encoded_len, max: config.batch_bytes_max });
    }
    Ok(encoded_len)
}

/// Milliseconds since the Unix epoch by this machine's clock: the timestamp an append gives a
/// record that has none.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_millis() as i64)
}

impl Partition {
    /// Opens the partition in `dir`, creating it when it does not exist, and stores `config`
    /// as its settings.
    pub fn open(dir: impl AsRef<Path>, config: PartitionConfig) -> Result<(Partition, RecoveryReport), OpenError> {
        Self::open_with_options(dir, config, &PartitionOptions::default())
    }

    /// [`open`](Self::open) on the given file layer and recovery policy.
    pub fn open_with_options(
        dir: impl AsRef<Path>,
        config: PartitionConfig,
        options: &PartitionOptions,
    ) -> Result<(Partition, RecoveryReport), OpenError> {
        let dir = dir.as_ref();
        config.validate().map_err(|reason| OpenError::BadConfig { path: dir.join(CONFIG_FILE), reason })?;
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let config_path = dir.join(CONFIG_FILE);
        let stored = fs::read_to_string(&config_path).ok();
        let text = config.to_text();
        if stored.as_deref() != Some(text.as_str()) {
            crate::segment::write_atomically(&config_path, text.as_bytes()).map_err(io_at(&config_path))?;
            sync_dir(dir).map_err(io_at(dir))?;
        }
        Self::open_with(dir, config, options)
    }

    /// Opens an existing partition with the settings stored in it.
    pub fn open_existing(dir: impl AsRef<Path>) -> Result<(Partition, RecoveryReport), OpenError> {
        Self::open_existing_with_options(dir, &PartitionOptions::default())
    }

    /// [`open_existing`](Self::open_existing) on the given file layer and recovery policy.
    pub fn open_existing_with_options(
        dir: impl AsRef<Path>,
        options: &PartitionOptions,
    ) -> Result<(Partition, RecoveryReport), OpenError> {
        let dir = dir.as_ref();
        let config_path = dir.join(CONFIG_FILE);
        let text = fs::read_to_string(&config_path).map_err(io_at(&config_path))?;
        let config = PartitionConfig::from_text(&text, &config_path)?;
        Self::open_with(dir, config, options)
    }

    fn open_with(
        dir: &Path,
        config: PartitionConfig,
        options: &PartitionOptions,
    ) -> Result<(Partition, RecoveryReport), OpenError> {
        let storage = &*options.storage;
        let label = dir.display().to_string();
        let mut bases = Vec::new();
        for entry in fs::read_dir(dir).map_err(io_at(dir))? {
            let entry = entry.map_err(io_at(dir))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            // Leftovers of an interrupted index write or compaction: the originals are intact.
            if name.ends_with(".tmp") || name.ends_with(".compacting") {
                fs::remove_file(entry.path()).map_err(io_at(entry.path()))?;
                continue;
            }
            if let Some(stem) = name.strip_suffix(&format!(".{LOG_SUFFIX}"))
                && stem.len() == 20
                && stem.bytes().all(|byte| byte.is_ascii_digit())
                && let Ok(base) = stem.parse::<u64>()
            {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        let compacted = config.compacted;
        let manifest = match Manifest::read(dir) {
            Ok(manifest) => Some(manifest),
            Err(Unusable::Missing) => None,
            Err(Unusable::Damaged(reason)) => {
                tracing::warn!(
                    partition = %label, %reason,
                    "the segment manifest is unusable; it is rebuilt from the segment files, checked on their own this once"
                );
                None
            }
        };
        let mut listed_closed = Vec::new();
        if let Some(manifest) = &manifest {
            let plan = crate::manifest::plan(manifest, &bases, compacted);
            for &base in &plan.leftovers {
                // Maintenance took these out of the partition, wrote the manifest, and stopped
                // before it deleted them.
                tracing::info!(partition = %label, base, "deleting a segment retention or compaction had already removed");
                Segment::delete_leftover(dir, base).map_err(io_at(dir))?;
            }
            bases.retain(|base| !plan.leftovers.contains(base));
            listed_closed = plan.closed;
        }
        let mut report = RecoveryReport::default();
        let mut segments = BTreeMap::new();
        let mut found = Vec::with_capacity(bases.len());
        // Closed segments whose index was rebuilt by a scan: written once the open is sure to
        // go ahead, so that a refused open changes no file.
        let mut rebuilt = Vec::new();
        let mut previous_next: Option<u64> = None;
        for (i, &base) in bases.iter().enumerate() {
            // A segment the manifest lists as closed is never the tail, even when the files
            // after it are gone: its end was synced, so nothing there is a torn write to cut.
            let is_tail = i + 1 == bases.len() && !listed_closed.contains(&base);
            let (segment, recovery) =
                Segment::open(dir, base, config.index_interval_bytes, is_tail, storage, &options.recovery)?;
            if let Some(previous) = previous_next
                && base < previous
            {
                return Err(OpenError::Corrupt {
                    path: segment.path.clone(),
                    position: 0,
                    reason: format!("segment starts at offset {base}, before the previous segment ends ({previous})"),
                    remedy: "restore the partition from a replica or backup, or move the segments that overlap aside"
                        .into(),
                });
            }
            previous_next = Some(segment.next_offset());
            found.push(Found { base_offset: base, records_end: segment.next_offset() });
            report.truncated_bytes += recovery.truncated_bytes;
            if recovery.truncated_at.is_some() {
                report.truncated_at = recovery.truncated_at;
            }
            report.indexes_rebuilt += recovery.index_rebuilt as usize;
            if recovery.index_rebuilt && !is_tail {
                rebuilt.push(base);
            }
            report.discarded.extend(recovery.discarded);
            segments.insert(base, Arc::new(segment));
        }
        let missing = crate::manifest::check(manifest.as_ref(), &found, compacted);
        if !missing.is_empty() {
            if !options.recovery.discard_damaged {
                return Err(OpenError::Missing(Box::new(Missing {
                    path: dir.to_path_buf(),
                    missing,
                    remedy: options.recovery.remedy.to_string(),
                })));
            }
            tracing::warn!(
                partition = %label, missing = ?missing,
                "accepted missing records (discard_damaged): reads skip their offsets, which are never given out again"
            );
            metrics::counter!(m::RECOVERY_MISSING_RANGES).increment(missing.len() as u64);
            report.missing = missing;
        }
        // The active segment: the last file, unless the manifest lists it as closed (the newest
        // segment is gone and the loss was accepted). Then a new one starts where the newest
        // listed segment started, at least, so that its offsets are never given out again.
        let newest_listed = manifest.as_ref().and_then(|manifest| manifest.segments.last()).map(|l| l.base_offset);
        let tail_closed = bases.last().is_some_and(|base| listed_closed.contains(base));
        if segments.is_empty() || tail_closed {
            let base = previous_next.unwrap_or(0).max(newest_listed.unwrap_or(0));
            segments.insert(base, Arc::new(Segment::create(dir, base, config.index_interval_bytes, storage)?));
        }
        for base in rebuilt {
            segments[&base].persist_index(dir).map_err(io_at(dir))?;
        }
        let start = manifest.as_ref().and_then(|manifest| manifest.start);
        let now = Manifest::of(start, segments.values().map(|segment| (segment.base_offset, segment.next_offset())));
        if manifest.as_ref() != Some(&now) {
            now.write(dir).map_err(io_at(dir.join(crate::manifest::MANIFEST_FILE)))?;
        }
        report.segments = segments.len();
        if let Some((position, reason)) = &report.truncated_at {
            tracing::warn!(
                partition = %label, position, bytes = report.truncated_bytes, %reason,
                "recovery cut a torn or corrupt tail"
            );
            metrics::counter!(m::RECOVERY_TRUNCATIONS).increment(1);
            metrics::counter!(m::RECOVERY_TRUNCATED_BYTES).increment(report.truncated_bytes);
        }
        let tail = segments.values().next_back().expect("at least one segment").clone();
        let next_offset = tail.next_offset();
        let (watermark, _) = watch::channel(Watermark { next_offset, closed: false });
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            storage: options.storage.clone(),
            label,
            queue_credit: Arc::new(Semaphore::new(config.queue_bytes_max)),
            retention: RwLock::new((config.retention_ms, config.retention_bytes)),
            remedy: options.recovery.remedy.to_string(),
            config,
            segments: RwLock::new(segments),
            next_offset: AtomicU64::new(next_offset),
            start: AtomicU64::new(start.unwrap_or(0)),
            watermark,
            queue: Mutex::new(Queue { pending: Vec::new(), closing: false, poisoned: None }),
            commit: Mutex::new(crate::writer::CommitQueue::default()),
            commit_ready: Condvar::new(),
            queue_ready: Condvar::new(),
            tail: Mutex::new(crate::tail::TailCache::default()),
            maintenance: Mutex::new(()),
            manifest: Mutex::new(()),
            meters: crate::metrics::Meters::register(),
            journal: std::sync::OnceLock::new(),
        });
        let writer_shared = shared.clone();
        let thread_name = format!("log-writer-{}", dir.file_name().unwrap_or_default().to_string_lossy());
        let writer = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || crate::writer::Writer::new(writer_shared, tail, next_offset).run())
            .map_err(io_at(dir))?;
        Ok((Partition { shared, writer: Mutex::new(Some(writer)) }, report))
    }

    /// The settings the partition was opened with; the retention limits in force are
    /// [`retention`](Self::retention)'s.
    pub fn config(&self) -> &PartitionConfig {
        &self.shared.config
    }

    /// The retention limits in force: `(retention_ms, retention_bytes)`.
    pub fn retention(&self) -> (Option<u64>, Option<u64>) {
        *self.shared.retention.read().expect("retention lock")
    }

    /// Changes the retention limits while the partition is open; the next maintenance pass
    /// applies them. The caller stores the change (the next open is given the new settings,
    /// and stores them in `partition.conf`).
    pub fn set_retention(&self, retention_ms: Option<u64>, retention_bytes: Option<u64>) {
        *self.shared.retention.write().expect("retention lock") = (retention_ms, retention_bytes);
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Hard-links this partition's files into the new directory `into`: a copy of the
    /// partition as it is now, which later appends, retention and compaction leave alone (they
    /// append past it, or unlink and rename, never rewrite a file in place). Returns each
    /// file's name and how many of its bytes belong to the copy: all of `partition.conf`, and
    /// of a segment the batches complete now (past them are batches still being written, and
    /// the runway of zeros).
    pub fn link_files(&self, into: &Path) -> std::io::Result<Vec<(String, u64)>> {
        let _maintenance = self.maintenance_lock();
        fs::create_dir_all(into)?;
        let mut files = Vec::new();
        let config = self.shared.dir.join(CONFIG_FILE);
        if let Ok(metadata) = fs::metadata(&config) {
            fs::hard_link(&config, into.join(CONFIG_FILE))?;
            files.push((CONFIG_FILE.to_string(), metadata.len()));
        }
        for segment in self.segment_snapshot() {
            let bytes = segment.committed_bytes();
            let name = segment.path.file_name().and_then(|name| name.to_str()).ok_or_else(|| {
                std::io::Error::other(format!("{}: a segment name that is not UTF-8", segment.path.display()))
            })?;
            fs::hard_link(&segment.path, into.join(name))?;
            files.push((name.to_string(), bytes));
        }
        Ok(files)
    }

    /// Appends `records` and returns once they are durable at the partition's default level.
    pub async fn append(&self, records: &[NewRecord]) -> Result<AppendAck, AppendError> {
        self.append_with(records, self.shared.config.durability).await
    }

    /// Checks `records` against this partition's limits without appending anything: what
    /// `append` would refuse, this refuses with the same error. Returns their encoded size.
    pub fn check(&self, records: &[NewRecord]) -> Result<usize, AppendError> {
        check_records(&self.shared.config, records)
    }

    /// Appends `records` and returns once `durability` holds for all of them. The records get
    /// dense offsets; a timestamp is assigned (server time) to records without one.
    pub async fn append_with(&self, records: &[NewRecord], durability: Durability) -> Result<AppendAck, AppendError> {
        self.enqueue_with(records, durability).await?.await
    }

    /// Queues `records` for appending and returns once they are queued, behind every append
    /// queued before and ahead of every append queued after; the returned future resolves when
    /// `durability` holds for them. A caller that queues under its own lock thus fixes the
    /// order of its appends in the log without waiting for the disk under that lock. The
    /// append happens whether or not the future is awaited.
    pub async fn enqueue_with(
        &self,
        records: &[NewRecord],
        durability: Durability,
    ) -> Result<QueuedAppend, AppendError> {
        let encoded_len = self.check(records)?;
        let now = now_ms();
        let mut encoded = Vec::with_capacity(encoded_len);
        let (mut first_timestamp_ms, mut max_timestamp_ms) = (0, i64::MIN);
        for (i, record) in records.iter().enumerate() {
            let timestamp_ms = record.timestamp_ms.unwrap_or(now);
            if i == 0 {
                first_timestamp_ms = timestamp_ms;
            }
            max_timestamp_ms = max_timestamp_ms.max(timestamp_ms);
            encode_record(&mut encoded, record, timestamp_ms);
        }
        let credit = self
            .shared
            .queue_credit
            .clone()
            .acquire_many_owned(encoded_len as u32)
            .await
            .map_err(|_| AppendError::Closed)?;
        let (ack, acked) = oneshot::channel();
        {
            let mut queue = self.shared.queue.lock().expect("queue lock");
            if let Some(reason) = &queue.poisoned {
                return Err(AppendError::Poisoned(reason.clone()));
            }
            if queue.closing {
                return Err(AppendError::Closed);
            }
            queue.pending.push(Pending {
                encoded,
                count: records.len() as u32,
                null_headers: records.iter().any(NewRecord::has_null_header),
                first_timestamp_ms,
                max_timestamp_ms,
                durability,
                ack,
                credit,
            });
            if queue.pending.len() == 1 {
                self.shared.queue_ready.notify_one();
            }
        }
        Ok(QueuedAppend { acked })
    }

    /// Makes every append acknowledged so far durable, whatever durability it asked for: an
    /// fdatasync of the segment being written (a segment was synced when it was closed).
    /// Blocks on the disk: call it off the async workers.
    pub fn sync(&self) -> std::io::Result<()> {
        let active = self.shared.segments.read().expect("segments lock").values().next_back().cloned();
        match active {
            Some(segment) => segment.sync(),
            None => Ok(()),
        }
    }

    /// The first offset still stored (earlier ones were removed by retention or compaction, or
    /// deleted: [`Partition::delete_before`]).
    pub fn start_offset(&self) -> u64 {
        let segments = self.shared.segments.read().expect("segments lock");
        let first = *segments.keys().next().expect("a partition always has a segment");
        first.max(self.shared.start.load(Ordering::Acquire))
    }

    /// Deletes every record before `offset` (at most the end offset), as Kafka's
    /// DeleteRecords: the partition's start moves there, durably (the manifest records it)
    /// before this returns, reads before it are refused from then on, and the segments wholly
    /// before it are deleted. Returns the new start.
    pub fn delete_before(&self, offset: u64) -> Result<u64, crate::MaintenanceError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| crate::MaintenanceError::Io { path, source }
        };
        let _maintenance = self.maintenance_lock();
        let offset = offset.min(self.end_offset());
        if offset <= self.start_offset() {
            return Ok(self.start_offset());
        }
        let segments = self.segment_snapshot();
        let doomed: Vec<Arc<Segment>> = segments[..segments.len() - 1]
            .iter()
            .take_while(|segment| segment.next_offset() <= offset)
            .cloned()
            .collect();
        let bases: Vec<u64> = doomed.iter().map(|segment| segment.base_offset).collect();
        {
            let _manifest = self.manifest_lock();
            let before = self.shared.start.swap(offset, Ordering::AcqRel);
            if let Err(error) = self.write_manifest(&bases, None) {
                self.shared.start.store(before, Ordering::Release);
                return Err(io(&self.shared.dir)(error));
            }
            self.remove_segments(&bases);
        }
        for segment in doomed {
            segment.delete_files(self.dir()).map_err(io(&segment.path))?;
        }
        sync_dir(self.dir()).map_err(io(self.dir()))?;
        tracing::info!(partition = %self.label(), start_offset = offset, "records deleted before the new start");
        Ok(offset)
    }

    /// The first record with the largest timestamp in the partition, as `(offset,
    /// timestamp_ms)`: Kafka's ListOffsets for `-3` (max timestamp). `None` when it is empty.
    pub fn max_timestamp(&self) -> Result<Option<(u64, i64)>, ReadError> {
        let (start, end) = (self.start_offset(), self.end_offset());
        let segments = self.segments_from(start);
        let Some(max) = segments.iter().map(|segment| segment.max_timestamp_ms()).max().filter(|max| *max != i64::MIN)
        else {
            return Ok(None);
        };
        for segment in segments.iter().filter(|segment| segment.max_timestamp_ms() == max) {
            let mut found = None;
            let read = segment.read_batches(0, 0, |_, header, batch| {
                if header.base_offset >= end {
                    return Ok(false);
                }
                if header.max_timestamp_ms != max || header.next_offset() <= start {
                    return Ok(true);
                }
                found = decode_records(header, &batch)?
                    .iter()
                    .find(|record| record.timestamp_ms == max && record.offset >= start && record.offset < end)
                    .map(|record| (record.offset, record.timestamp_ms));
                Ok(found.is_none())
            });
            if let Err((position, reason)) = read {
                return Err(self.corrupt(segment, position, reason));
            }
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// The offset the next record will get: every offset before it is durable and readable.
    pub fn end_offset(&self) -> u64 {
        self.shared.next_offset.load(Ordering::Acquire)
    }

    /// A receiver of the end offset, to await new records without polling.
    pub fn watch(&self) -> watch::Receiver<Watermark> {
        self.shared.watermark.subscribe()
    }

    /// Waits until a record at or after `offset` is readable; returns the new end offset.
    pub async fn wait_for(&self, offset: u64) -> Result<u64, ReadError> {
        let mut receiver = self.shared.watermark.subscribe();
        let watermark = receiver
            .wait_for(|watermark| watermark.next_offset > offset || watermark.closed)
            .await
            .map_err(|_| ReadError::Closed)?;
        if watermark.next_offset > offset { Ok(watermark.next_offset) } else { Err(ReadError::Closed) }
    }

    fn segments_from(&self, offset: u64) -> Vec<Arc<Segment>> {
        let segments = self.shared.segments.read().expect("segments lock");
        let first = segments.range(..=offset).next_back().map_or(0, |(&base, _)| base);
        segments.range(first..).map(|(_, segment)| segment.clone()).collect()
    }

    /// Reads records from `from` on: at most `max_records`, and stopping once `max_bytes` of
    /// values and keys are collected (at least one record is returned when one exists).
    /// Reading at the end offset returns nothing; `wait_for` tells when more arrives.
    pub fn read(&self, from: u64, max_records: usize, max_bytes: usize) -> Result<Vec<Record>, ReadError> {
        self.read_records(from, max_records, max_bytes, None)
    }

    /// Reads like [`read`](Self::read), for a reader that goes on from where its last read
    /// stopped (a tailer, a subscription catching up, a replay): `ahead` keeps the rest of the
    /// batch that read stopped in, already read from the file and checked, and a read from
    /// where it stopped takes its records from there. A burst is written as one batch of
    /// thousands of records; read a few hundred at a time, each step would otherwise read,
    /// check and copy the whole batch again. A read from anywhere else reads the file.
    pub fn read_next(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        ahead: &mut ReadAhead,
    ) -> Result<Vec<Record>, ReadError> {
        self.read_records(from, max_records, max_bytes, Some(ahead))
    }

    fn read_records(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        ahead: Option<&mut ReadAhead>,
    ) -> Result<Vec<Record>, ReadError> {
        let records = self.read_records_unchecked(from, max_records, max_bytes, ahead)?;
        // Paired with the writer's checks where offsets are assigned: a read answers records
        // from where it was asked, below the published end, in strictly increasing offsets.
        if let (Some(first), Some(last)) = (records.first(), records.last()) {
            assert!(first.offset >= from, "a read from {from} answered offset {}", first.offset);
            assert!(last.offset < self.end_offset(), "a read answered offset {} past the end", last.offset);
            assert!(records.len() <= max_records, "a read answered more records than asked for");
            debug_assert!(records.windows(2).all(|pair| pair[0].offset < pair[1].offset), "offsets increase");
        }
        Ok(records)
    }

    fn read_records_unchecked(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        mut ahead: Option<&mut ReadAhead>,
    ) -> Result<Vec<Record>, ReadError> {
        let end = self.end_offset();
        let start = self.start_offset();
        if from < start {
            return Err(ReadError::BeforeStart { offset: from, start });
        }
        if from > end {
            return Err(ReadError::PastEnd { offset: from, end });
        }
        let mut records = Vec::new();
        if from == end || max_records == 0 {
            return Ok(records);
        }
        let mut bytes = 0;
        let mut from = from;
        let kept = ahead.as_deref_mut().and_then(|ahead| ahead.rest.take());
        if let Some(mut rest) = kept.filter(|rest| rest.next == from) {
            // Committed records are below the end for good, so the rest of a batch read
            // before needs no check against it.
            loop {
                match rest.records.next() {
                    None => {
                        from = rest.batch_next_offset;
                        break;
                    }
                    Some(Err(reason)) => {
                        let segment = rest.segment.path.display().to_string();
                        return Err(ReadError::Corrupt {
                            segment,
                            position: rest.position,
                            reason: reason.to_string(),
                            remedy: self.shared.remedy.clone(),
                        });
                    }
                    Some(Ok(record)) => {
                        rest.next = record.offset + 1;
                        if take(&mut records, &mut bytes, record, max_records, max_bytes) {
                            if let Some(ahead) = ahead
                                && !rest.records.is_done()
                            {
                                ahead.rest = Some(rest);
                            }
                            return Ok(records);
                        }
                    }
                }
            }
            if from >= end {
                return Ok(records);
            }
        }
        let wanted = max_records - records.len();
        let cached = self.shared.tail.lock().expect("tail cache lock").batches_from(from, end, wanted);
        if let Some(batches) = cached {
            self.shared.meters.reads_from_memory.increment(1);
            for batch in batches {
                let batch_records = records_from(&batch.header, &batch.bytes, from);
                let taken = take_batch(batch_records, end, &mut records, &mut bytes, max_records, max_bytes).map_err(
                    |reason| ReadError::Corrupt {
                        segment: batch.segment.path.display().to_string(),
                        position: batch.position,
                        reason: reason.to_string(),
                        remedy: self.shared.remedy.clone(),
                    },
                )?;
                if let Taken::Read(left) = taken {
                    if let (Some(ahead), Some((next, left))) = (ahead, left) {
                        ahead.rest = Some(Rest {
                            next,
                            batch_next_offset: batch.header.next_offset(),
                            records: left,
                            segment: batch.segment,
                            position: batch.position,
                        });
                    }
                    return Ok(records);
                }
                from = batch.header.next_offset();
            }
            // The cache holds every written batch after the first one it has, and the read
            // took all of those below the end: nothing more is readable now.
            return Ok(records);
        }
        self.shared.meters.reads_from_file.increment(1);
        for segment in self.segments_from(from) {
            let position = segment.position_for_offset(from);
            let first_chunk = segment.bytes_for_records(position, max_records - records.len());
            let mut stopped_in: Option<Rest> = None;
            let keep = ahead.is_some();
            let read = segment.read_batches(position, first_chunk, |batch_position, header, batch| {
                if header.next_offset() <= from {
                    return Ok(true);
                }
                if header.base_offset >= end {
                    return Ok(false);
                }
                let batch_records = records_from(header, &batch, from);
                match take_batch(batch_records, end, &mut records, &mut bytes, max_records, max_bytes)? {
                    Taken::Batch => Ok(true),
                    Taken::Read(left) => {
                        if keep && let Some((next, left)) = left {
                            stopped_in = Some(Rest {
                                next,
                                batch_next_offset: header.next_offset(),
                                records: left,
                                segment: segment.clone(),
                                position: batch_position,
                            });
                        }
                        Ok(false)
                    }
                }
            });
            if let Err((position, reason)) = read {
                // What was read before the damage is answered; the next read, from the damaged
                // batch, fails.
                if !records.is_empty() {
                    return Ok(records);
                }
                return Err(self.corrupt(&segment, position, reason));
            }
            if let (Some(ahead), Some(rest)) = (ahead.as_deref_mut(), stopped_in) {
                ahead.rest = Some(rest);
            }
            // `bytes >= max_bytes` holds from the start when `max_bytes` is 0: it only counts once
            // a record is in, or a read from a gap compaction left at a segment's end finds nothing.
            if records.len() >= max_records
                || (bytes >= max_bytes && !records.is_empty())
                || segment.next_offset() >= end
            {
                break;
            }
        }
        Ok(records)
    }

    /// The offset of the first record with a timestamp at or after `timestamp_ms`, or `None`
    /// when every stored record is older (read from the end offset then).
    pub fn offset_for_timestamp(&self, timestamp_ms: i64) -> Result<Option<u64>, ReadError> {
        let end = self.end_offset();
        let segments = self.segments_from(0);
        for segment in segments {
            if segment.max_timestamp_ms() < timestamp_ms {
                continue;
            }
            let mut found = None;
            let position = segment.position_for_timestamp(timestamp_ms);
            // The record sought is in the first batches from the index entry.
            let read = segment.read_batches(position, 0, |_, header, batch| {
                if header.base_offset >= end {
                    return Ok(false);
                }
                if header.max_timestamp_ms < timestamp_ms {
                    return Ok(true);
                }
                found = decode_records(header, &batch)?
                    .iter()
                    .find(|record| record.timestamp_ms >= timestamp_ms && record.offset < end)
                    .map(|record| record.offset);
                Ok(found.is_none())
            });
            if let Err((position, reason)) = read {
                return Err(self.corrupt(&segment, position, reason));
            }
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// Bytes stored across all segments.
    pub fn size_bytes(&self) -> u64 {
        let segments = self.shared.segments.read().expect("segments lock");
        segments.values().map(|segment| segment.written_bytes()).sum()
    }

    pub fn segment_count(&self) -> usize {
        self.shared.segments.read().expect("segments lock").len()
    }

    /// Stops accepting appends, lets the writer finish every queued append, syncs, writes the
    /// active segment's index and waits for the writer to exit. Idempotent.
    pub fn close(&self) {
        {
            let mut queue = self.shared.queue.lock().expect("queue lock");
            queue.closing = true;
            self.shared.queue_ready.notify_one();
        }
        if let Some(writer) = self.writer.lock().expect("writer handle lock").take()
            && writer.join().is_err()
        {
            tracing::error!(partition = %self.shared.label, "the log writer thread panicked");
        }
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.close();
    }
}

// Retention and compaction live in `maintenance.rs`; they need these internals.
impl Partition {
    /// Journals this partition's batches in `journal` from now on (see `journal.rs`). The log
    /// calls it once, right after opening the partition and before anything is appended.
    pub(crate) fn use_journal(&self, journal: crate::journal::Journal, topic: &str, partition: u32) {
        let handle = JournalHandle { journal, topic: topic.to_string(), partition };
        if self.shared.journal.set(handle).is_err() {
            tracing::warn!(partition = %self.shared.label, "a partition was given a journal twice; the first is kept");
        }
    }

    pub(crate) fn label(&self) -> &str {
        &self.shared.label
    }

    pub(crate) fn storage(&self) -> &dyn Storage {
        &*self.shared.storage
    }

    pub(crate) fn maintenance_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared.maintenance.lock().expect("maintenance lock")
    }

    /// The error of a read that met a corrupt batch of `segment` at `position`.
    pub(crate) fn corrupt(&self, segment: &Segment, position: u64, reason: String) -> ReadError {
        ReadError::Corrupt {
            segment: segment.path.display().to_string(),
            position,
            reason,
            remedy: self.shared.remedy.clone(),
        }
    }

    pub(crate) fn manifest_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.shared.manifest.lock().expect("manifest lock")
    }

    pub(crate) fn write_manifest(&self, removed: &[u64], rewritten: Option<(u64, u64)>) -> std::io::Result<()> {
        self.shared.write_manifest(removed, rewritten)
    }

    /// All segments in offset order; the last one is the active segment.
    pub(crate) fn segment_snapshot(&self) -> Vec<Arc<Segment>> {
        self.shared.segments.read().expect("segments lock").values().cloned().collect()
    }

    /// Removes closed segments from the map (never the active one).
    pub(crate) fn remove_segments(&self, bases: &[u64]) {
        let mut segments = self.shared.segments.write().expect("segments lock");
        let active = *segments.keys().next_back().expect("a partition always has a segment");
        for base in bases {
            assert_ne!(*base, active, "maintenance must never remove the active segment");
            segments.remove(base);
        }
    }

    pub(crate) fn replace_segment(&self, segment: Arc<Segment>) {
        let mut segments = self.shared.segments.write().expect("segments lock");
        let active = *segments.keys().next_back().expect("a partition always has a segment");
        assert_ne!(segment.base_offset, active, "maintenance must never replace the active segment");
        segments.insert(segment.base_offset, segment);
    }
}

/// An append in the queue; resolves to its acknowledgement once its durability holds.
pub struct QueuedAppend {
    acked: oneshot::Receiver<Result<AppendAck, AppendError>>,
}

impl QueuedAppend {
    /// An append whose acknowledgement comes from elsewhere (a replicated write's answer),
    /// for callers that wait on appends alike: what is sent resolves it.
    pub fn channel() -> (oneshot::Sender<Result<AppendAck, AppendError>>, QueuedAppend) {
        let (ack, acked) = oneshot::channel();
        (ack, QueuedAppend { acked })
    }
}

impl std::future::Future for QueuedAppend {
    type Output = Result<AppendAck, AppendError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.acked).poll(cx).map(|result| result.unwrap_or(Err(AppendError::Closed)))
    }
}
