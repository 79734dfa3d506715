//! Retention (drop whole old segments) and compaction (keep the newest record per key).
//!
//! Both touch closed segments only, never the active one, so they run beside the writer
//! without stopping it. Readers that already hold a segment keep reading its open file even
//! after it is deleted or replaced.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;

use crate::error::MaintenanceError;
use crate::format::{BatchBuilder, Record, decode_records};
use crate::metrics as m;
use crate::partition::{Partition, now_ms};
use crate::segment::{LOG_SUFFIX, Segment, segment_file, sync_dir};

/// Compaction writes survivors in batches of about this many bytes.
const COMPACTED_BATCH_BYTES: usize = 256 * 1024;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub segments_deleted: usize,
    pub bytes_deleted: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CompactionReport {
    pub segments_rewritten: usize,
    pub records_removed: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

fn io_error(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> MaintenanceError + '_ {
    move |source| MaintenanceError::Io { path: path.to_path_buf(), source }
}

impl Partition {
    /// Deletes the oldest closed segments whose newest record is older than `retention_ms`,
    /// then the oldest ones while the partition is larger than `retention_bytes`. Only a prefix
    /// of the log is ever removed, so the remaining offsets stay contiguous.
    pub fn enforce_retention(&self, now_ms: i64) -> Result<RetentionReport, MaintenanceError> {
        let (retention_ms, retention_bytes) = self.retention();
        if retention_ms.is_none() && retention_bytes.is_none() {
            return Ok(RetentionReport::default());
        }
        let _guard = self.maintenance_lock();
        let segments = self.segment_snapshot();
        let closed = &segments[..segments.len() - 1];
        let mut total_bytes: u64 = segments.iter().map(|segment| segment.written_bytes()).sum();
        let mut doomed: Vec<Arc<Segment>> = Vec::new();
        for segment in closed {
            let too_old =
                retention_ms.is_some_and(|age| segment.max_timestamp_ms() < now_ms.saturating_sub(age as i64));
            let too_big = retention_bytes.is_some_and(|cap| total_bytes > cap);
            if !(too_old || too_big) {
                break;
            }
            total_bytes -= segment.written_bytes();
            doomed.push(segment.clone());
        }
        if doomed.is_empty() {
            return Ok(RetentionReport::default());
        }
        let bases: Vec<u64> = doomed.iter().map(|segment| segment.base_offset).collect();
        {
            // The manifest stops listing them before their files go, so a crash in between
            // leaves files the next open deletes as leftovers, never a listed segment missing.
            let _manifest = self.manifest_lock();
            self.write_manifest(&bases, None).map_err(io_error(self.dir()))?;
            self.remove_segments(&bases);
        }
        let mut report = RetentionReport::default();
        for segment in doomed {
            report.segments_deleted += 1;
            report.bytes_deleted += segment.written_bytes();
            segment.delete_files(self.dir()).map_err(io_error(&segment.path))?;
        }
        sync_dir(self.dir()).map_err(io_error(self.dir()))?;
        tracing::info!(
            partition = %self.label(), segments = report.segments_deleted, bytes = report.bytes_deleted,
            start_offset = self.start_offset(), "retention deleted segments"
        );
        metrics::counter!(m::RETENTION_SEGMENTS_DELETED).increment(report.segments_deleted as u64);
        Ok(report)
    }

    /// On a compacted partition, rewrites each closed segment keeping only records that are
    /// the newest for their key (records without a key are kept), and dropping tombstones older
    /// than `tombstone_retention_ms`. Offsets are kept, so offsets become sparse.
    ///
    /// Memory: one entry per distinct key in the partition (the key and its newest offset).
    pub fn compact(&self, now_ms: i64) -> Result<CompactionReport, MaintenanceError> {
        let mut report = CompactionReport::default();
        if !self.config().compacted {
            return Ok(report);
        }
        let _guard = self.maintenance_lock();
        let segments = self.segment_snapshot();
        if segments.len() < 2 {
            return Ok(report);
        }
        let end = self.end_offset();
        let mut newest: HashMap<Bytes, u64> = HashMap::new();
        for segment in &segments {
            for record in read_segment(self, segment, end)? {
                if let Some(key) = record.key {
                    newest.insert(key, record.offset);
                }
            }
        }
        let tombstone_deadline = now_ms.saturating_sub(self.config().tombstone_retention_ms as i64);
        let dir = self.dir().to_path_buf();
        for segment in &segments[..segments.len() - 1] {
            let records = read_segment(self, segment, end)?;
            let before = records.len();
            let survivors: Vec<Record> = records
                .into_iter()
                .filter(|record| match &record.key {
                    None => true,
                    Some(key) => {
                        newest.get(key) == Some(&record.offset)
                            && !(record.value.is_none() && record.timestamp_ms < tombstone_deadline)
                    }
                })
                .collect();
            if survivors.len() == before {
                continue;
            }
            report.segments_rewritten += 1;
            report.records_removed += (before - survivors.len()) as u64;
            report.bytes_before += segment.written_bytes();
            if survivors.is_empty() {
                {
                    let _manifest = self.manifest_lock();
                    self.write_manifest(&[segment.base_offset], None).map_err(io_error(&dir))?;
                    self.remove_segments(&[segment.base_offset]);
                }
                segment.delete_files(&dir).map_err(io_error(&segment.path))?;
                continue;
            }
            let temporary = write_compacted(&dir, segment.base_offset, &survivors)?;
            let records_end = survivors.last().map_or(segment.base_offset, |record| record.offset + 1);
            // The manifest takes the segment's new end before the file changes: a crash in
            // between leaves the old file, whose records end later, which opening accepts.
            let _manifest = self.manifest_lock();
            self.write_manifest(&[], Some((segment.base_offset, records_end))).map_err(io_error(&dir))?;
            let rewritten = install_compacted(
                &dir,
                segment.base_offset,
                &temporary,
                self.config().index_interval_bytes,
                self.storage(),
            )?;
            report.bytes_after += rewritten.written_bytes();
            self.replace_segment(Arc::new(rewritten));
        }
        sync_dir(&dir).map_err(io_error(&dir))?;
        if report.segments_rewritten > 0 {
            tracing::info!(
                partition = %self.label(), segments = report.segments_rewritten, records_removed = report.records_removed,
                bytes_before = report.bytes_before, bytes_after = report.bytes_after, "compaction rewrote segments"
            );
            metrics::counter!(m::COMPACTION_RECORDS_REMOVED).increment(report.records_removed);
        }
        Ok(report)
    }

    /// Runs retention and compaction with the current time.
    pub fn maintain(&self) -> Result<(RetentionReport, CompactionReport), MaintenanceError> {
        let now = now_ms();
        Ok((self.enforce_retention(now)?, self.compact(now)?))
    }
}

fn read_segment(partition: &Partition, segment: &Segment, end: u64) -> Result<Vec<Record>, MaintenanceError> {
    let mut records = Vec::new();
    segment
        .read_batches(0, usize::MAX, |_, header, batch| {
            if header.base_offset >= end {
                return Ok(false);
            }
            records.extend(decode_records(header, &batch)?.into_iter().filter(|record| record.offset < end));
            Ok(true)
        })
        .map_err(|(position, reason)| MaintenanceError::Read(partition.corrupt(segment, position, reason)))?;
    Ok(records)
}

/// Writes `records` as the new contents of the segment at `base_offset`, durably, to
/// `{base_offset:020}.compacting` (removed on open, should the rewrite stop there), and returns
/// its path.
fn write_compacted(
    dir: &std::path::Path,
    base_offset: u64,
    records: &[Record],
) -> Result<std::path::PathBuf, MaintenanceError> {
    let temporary = dir.join(format!("{base_offset:020}.compacting"));
    let mut bytes = Vec::new();
    let mut at = 0;
    while at < records.len() {
        let mut builder = BatchBuilder::new(&mut bytes, records[at].offset);
        while at < records.len() && (builder.is_empty() || builder.len() < COMPACTED_BATCH_BYTES) {
            builder.push_record(&records[at]);
            at += 1;
        }
        builder.finish();
    }
    let mut file =
        OpenOptions::new().write(true).create(true).truncate(true).open(&temporary).map_err(io_error(&temporary))?;
    file.write_all(&bytes).map_err(io_error(&temporary))?;
    file.sync_data().map_err(io_error(&temporary))?;
    Ok(temporary)
}

/// Swaps the file [`write_compacted`] wrote in for the segment at `base_offset` atomically: a
/// crash leaves either the old file or the new one.
fn install_compacted(
    dir: &std::path::Path,
    base_offset: u64,
    temporary: &std::path::Path,
    index_interval_bytes: u64,
    storage: &dyn crate::file::Storage,
) -> Result<Segment, MaintenanceError> {
    // The old index describes the old file; remove it first so a crash after the rename can
    // only leave a missing index (rebuilt on open), never a wrong one.
    Segment::invalidate_index(dir, base_offset).map_err(io_error(dir))?;
    let path = segment_file(dir, base_offset, LOG_SUFFIX);
    fs::rename(temporary, &path).map_err(io_error(&path))?;
    sync_dir(dir).map_err(io_error(dir))?;
    // Written from valid records just now: a bad batch here is refused, never set aside.
    let policy = crate::recovery::RecoveryPolicy::default();
    let (segment, _) = Segment::open(dir, base_offset, index_interval_bytes, false, storage, &policy)?;
    segment.persist_index(dir).map_err(io_error(dir))?;
    Ok(segment)
}
