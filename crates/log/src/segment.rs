//! One segment: a file of batches named by its base offset, plus its sparse offset index and
//! time index (kept in memory, persisted when the segment closes, rebuilt when stale).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use bytes::Bytes;

use crate::error::{DecodeError, OpenError, io_at};
use crate::file::{SegmentFile, Storage};
use crate::format::{BATCH_HEADER_BYTES, BatchHeader, decode_records};
use crate::recovery::{self, BadBytes, Decision, Discarded, RecoveryPolicy};

pub(crate) const LOG_SUFFIX: &str = "log";
pub(crate) const INDEX_SUFFIX: &str = "index";
pub(crate) const TIME_INDEX_SUFFIX: &str = "timeindex";

const OFFSET_INDEX_MAGIC: u32 = u32::from_le_bytes(*b"OHIX");
const TIME_INDEX_MAGIC: u32 = u32::from_le_bytes(*b"OHTX");
const INDEX_VERSION: u16 = 1;
const INDEX_HEADER_BYTES: usize = 48;
/// Scans read this much at a time so recovery is not one syscall per batch.
pub(crate) const SCAN_CHUNK_BYTES: usize = 1024 * 1024;
/// The least a read for consumers starts with.
const READ_CHUNK_MIN_BYTES: usize = 16 * 1024;
/// While its partition is idle, the active segment is given a zero-filled runway ahead of its
/// data. A batch written inside the runway overwrites blocks that already exist, so its
/// fdatasync flushes just the data, with no file-size change to make durable (a journal
/// commit, or on ext4 without a journal, as here, a write of the inode): measured here
/// (`onehop bench log` prints both floors), a small write's fdatasync falls from ~127 µs to
/// ~91 µs at p50. The runway is only grown while no data sync waits (fdatasync would also
/// wait for the zeros), so under saturation writes simply append.
pub(crate) const RUNWAY_BYTES: u64 = 256 * 1024;
/// When a busy partition's batches outrun the runway, the write thread adds this much.
pub(crate) const BUSY_RUNWAY_BYTES: u64 = 64 * 1024;
/// The runway is grown when less than this is left.
pub(crate) const RUNWAY_LOW_BYTES: u64 = 64 * 1024;
static ZEROS: [u8; RUNWAY_BYTES as usize] = [0; RUNWAY_BYTES as usize];

/// The file name of a segment's data, index or time index: the base offset in 20 digits, so
/// names sort in offset order.
pub(crate) fn segment_file(dir: &Path, base_offset: u64, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

/// One sparse index entry: the batch starting at `relative_offset` begins at byte `position`,
/// and every record of this segment before it has a timestamp of at most `max_timestamp_before_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub relative_offset: u32,
    pub position: u32,
    pub max_timestamp_before_ms: i64,
}

/// What a segment knows about its contents; updated by the writer as batches become durable.
#[derive(Clone, Debug)]
pub(crate) struct SegmentMeta {
    pub entries: Vec<IndexEntry>,
    /// The offset after the last record (`base_offset` when empty).
    pub next_offset: u64,
    /// Largest record timestamp (`i64::MIN` when empty).
    pub max_timestamp_ms: i64,
    /// Byte position at which the last index entry was added.
    last_entry_position: u64,
}

impl SegmentMeta {
    pub(crate) fn empty(base_offset: u64) -> Self {
        SegmentMeta {
            entries: Vec::new(),
            next_offset: base_offset,
            max_timestamp_ms: i64::MIN,
            last_entry_position: 0,
        }
    }

    /// Notes a batch that starts at `position`, adding an index entry every `interval` bytes.
    pub(crate) fn note_batch(&mut self, base_offset: u64, position: u64, header: &BatchHeader, interval: u64) {
        if self.entries.is_empty() || position - self.last_entry_position >= interval {
            self.entries.push(IndexEntry {
                relative_offset: (header.base_offset - base_offset) as u32,
                position: position as u32,
                max_timestamp_before_ms: self.max_timestamp_ms,
            });
            self.last_entry_position = position;
        }
        self.next_offset = header.next_offset();
        self.max_timestamp_ms = self.max_timestamp_ms.max(header.max_timestamp_ms);
    }
}

struct Allocation {
    /// Length of the file: the batches plus the zero-filled runway.
    bytes: u64,
    /// Trimmed for good (closed by a roll or on shutdown): no more runway.
    closed: bool,
}

/// What opening a segment found.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// Bytes cut from the tail because they were torn or corrupt.
    pub truncated_bytes: u64,
    pub truncated_at: Option<(u64, String)>,
    pub index_rebuilt: bool,
    /// Damage set aside under [`RecoveryPolicy::discard_damaged`].
    pub discarded: Option<Discarded>,
}

pub(crate) struct Segment {
    pub base_offset: u64,
    pub path: PathBuf,
    file: Box<dyn SegmentFile>,
    /// Bytes of batches written to the file. Only the partition writer changes it.
    written_bytes: AtomicU64,
    /// Length of the file and whether it may still grow. A mutex, not an atomic, because
    /// growing the runway (sync thread) must not interleave with appending past it or trimming
    /// it (write thread): zeros written over a fresh batch, or after the trim of a closed
    /// segment, would damage the segment.
    allocation: Mutex<Allocation>,
    /// Bytes readers may read: every batch before it is complete and durable.
    committed_bytes: AtomicU64,
    /// Readers take it shared to find a position; the writer takes it exclusively once per
    /// group commit to add entries, so contention is one short lock per batch.
    meta: RwLock<SegmentMeta>,
    index_interval_bytes: u64,
}

impl Segment {
    /// Creates a new empty segment and makes its directory entry durable.
    pub fn create(
        dir: &Path,
        base_offset: u64,
        index_interval_bytes: u64,
        storage: &dyn Storage,
    ) -> Result<Segment, OpenError> {
        let path = segment_file(dir, base_offset, LOG_SUFFIX);
        let file = storage.open(&path, true).map_err(io_at(&path))?;
        sync_dir(dir).map_err(io_at(dir))?;
        Ok(Segment {
            base_offset,
            path,
            file,
            written_bytes: AtomicU64::new(0),
            allocation: Mutex::new(Allocation { bytes: 0, closed: false }),
            committed_bytes: AtomicU64::new(0),
            meta: RwLock::new(SegmentMeta::empty(base_offset)),
            index_interval_bytes,
        })
    }

    /// Opens an existing segment. When its index files are intact and describe exactly the
    /// file's length (a clean close, or a segment closed by a roll), they are trusted and the
    /// data is not read, unless `policy.discard_damaged` asks for every batch to be checked. Otherwise every batch is validated (header, CRC, records), and bytes
    /// that are not valid batches are dealt with as `recovery.rs` describes: the zero runway and
    /// a torn tail of the last segment (`is_tail`) are cut; damage is refused, or set aside
    /// under `policy.discard_damaged`. A segment other than the last was synced before the next
    /// was created, so nothing in it is ever a torn write.
    pub fn open(
        dir: &Path,
        base_offset: u64,
        index_interval_bytes: u64,
        is_tail: bool,
        storage: &dyn Storage,
        policy: &RecoveryPolicy,
    ) -> Result<(Segment, Recovery), OpenError> {
        let path = segment_file(dir, base_offset, LOG_SUFFIX);
        let mut recovery = Recovery::default();
        let mut file = storage.open(&path, false).map_err(io_at(&path))?;
        let mut file_bytes = file.size().map_err(io_at(&path))?;
        // Told to set damage aside, recovery reads every batch: damage under an intact index
        // (bit rot after a clean close) is found only by reading, and is set aside now rather
        // than met by a reader later.
        let index = if policy.discard_damaged { None } else { load_index(dir, base_offset, file_bytes) };
        let meta = match index {
            Some(meta) => meta,
            None => {
                recovery.index_rebuilt = true;
                let mut meta = SegmentMeta::empty(base_offset);
                let mut scanned = scan(&*file, 0, file_bytes, base_offset, |position, header, _| {
                    meta.note_batch(base_offset, position, header, index_interval_bytes);
                });
                if let Err(ScanStop::Bad { position, reason }) = &scanned {
                    let (position, first_offset) = (*position, meta.next_offset);
                    let damage = recovery::assess(&*file, position, file_bytes, first_offset).map_err(io_at(&path))?;
                    let bad = BadBytes { path: &path, position, first_offset, reason, damage: &damage };
                    match bad.decide(is_tail, policy)? {
                        Decision::Cut { damaged_end } => {
                            if damaged_end > position {
                                recovery.truncated_bytes = damaged_end - position;
                                recovery.truncated_at = Some((position, reason.clone()));
                            }
                            file.set_len(position).map_err(io_at(&path))?;
                            scanned = Ok(());
                        }
                        Decision::Discard => {
                            let discarded =
                                recovery::discard_damage(dir, &path, &*file, base_offset).map_err(io_at(&path))?;
                            tracing::warn!(
                                segment = %path.display(), copy = %discarded.copy.display(),
                                ranges = ?discarded.ranges, offsets = ?discarded.offsets,
                                "set damaged bytes aside (discard_damaged); every valid batch is kept"
                            );
                            recovery.truncated_bytes = discarded.ranges.iter().map(|(start, end)| end - start).sum();
                            recovery.truncated_at = Some((position, reason.clone()));
                            recovery.discarded = Some(discarded);
                            // The repaired file holds only valid batches: scan it afresh.
                            file = storage.open(&path, false).map_err(io_at(&path))?;
                            file_bytes = file.size().map_err(io_at(&path))?;
                            meta = SegmentMeta::empty(base_offset);
                            scanned = scan(&*file, 0, file_bytes, base_offset, |position, header, _| {
                                meta.note_batch(base_offset, position, header, index_interval_bytes);
                            });
                        }
                    }
                }
                match scanned {
                    Ok(()) => {}
                    Err(ScanStop::Io(error)) => return Err(OpenError::Io { path, source: error }),
                    Err(ScanStop::Newer { position, reason }) => {
                        return Err(OpenError::NewerFormat { path, position, reason });
                    }
                    Err(ScanStop::Bad { position, reason }) => {
                        // Only a repaired file can get here, and it was written from valid batches.
                        return Err(OpenError::Corrupt {
                            path,
                            position,
                            reason: format!("still not valid after setting damage aside: {reason}"),
                            remedy: policy.remedy.to_string(),
                        });
                    }
                }
                // What recovery accepted is what readers will see: make it durable before
                // anything is served from it (it may have been in the page cache only).
                file.sync_data().map_err(io_at(&path))?;
                meta
            }
        };
        let bytes = file.size().map_err(io_at(&path))?;
        let segment = Segment {
            base_offset,
            path,
            file,
            written_bytes: AtomicU64::new(bytes),
            allocation: Mutex::new(Allocation { bytes, closed: !is_tail }),
            committed_bytes: AtomicU64::new(bytes),
            meta: RwLock::new(meta),
            index_interval_bytes,
        };
        Ok((segment, recovery))
    }

    pub fn written_bytes(&self) -> u64 {
        self.written_bytes.load(Ordering::Acquire)
    }

    pub fn committed_bytes(&self) -> u64 {
        self.committed_bytes.load(Ordering::Acquire)
    }

    pub fn meta(&self) -> SegmentMeta {
        self.meta.read().expect("segment meta lock").clone()
    }

    pub fn next_offset(&self) -> u64 {
        self.meta.read().expect("segment meta lock").next_offset
    }

    pub fn max_timestamp_ms(&self) -> i64 {
        self.meta.read().expect("segment meta lock").max_timestamp_ms
    }

    /// Writes one encoded batch after the last one. Not yet visible to readers. Zeros added
    /// after it stay below `runway_limit` (the segment size).
    pub fn write(&self, batch: &[u8], runway_limit: u64) -> io::Result<()> {
        let position = self.written_bytes.load(Ordering::Acquire);
        let end = position + batch.len() as u64;
        let mut allocation = self.allocation.lock().expect("allocation lock");
        if end > allocation.bytes {
            // Past the runway (the partition has been too busy to grow it): the batch grows the
            // file, and a short stretch of zeros after it spares the next few syncs a size
            // change. Short, because the sync that covers it must write the zeros too.
            self.file.write_all_at(batch, position)?;
            let extended = (end + BUSY_RUNWAY_BYTES).next_multiple_of(BUSY_RUNWAY_BYTES).min(runway_limit).max(end);
            self.file.write_all_at(&ZEROS[..(extended - end) as usize], end)?;
            allocation.bytes = extended;
        } else {
            drop(allocation);
            self.file.write_all_at(batch, position)?;
        }
        self.written_bytes.store(end, Ordering::Release);
        Ok(())
    }

    /// Whether the zero-filled runway ahead of the data is short (and may grow below `limit`).
    pub fn needs_runway(&self, limit: u64) -> bool {
        let allocation = self.allocation.lock().expect("allocation lock");
        !allocation.closed
            && allocation.bytes < limit
            && allocation.bytes - self.written_bytes.load(Ordering::Acquire) < RUNWAY_LOW_BYTES
    }

    /// Writes up to `RUNWAY_BYTES` of zeros past the end of the file (not past `limit`, and not
    /// once the segment is closed). The caller syncs afterwards, so the zeros and the new length
    /// are durable before data uses them.
    pub fn grow_runway(&self, limit: u64) -> io::Result<()> {
        let mut allocation = self.allocation.lock().expect("allocation lock");
        let to = (allocation.bytes + RUNWAY_BYTES).min(limit);
        if !allocation.closed && to > allocation.bytes {
            self.file.write_all_at(&ZEROS[..(to - allocation.bytes) as usize], allocation.bytes)?;
            allocation.bytes = to;
        }
        Ok(())
    }

    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Cuts the zero-filled runway so the file ends at its last batch, makes that durable, and
    /// stops the runway from growing again. Called when the segment is closed (roll or
    /// shutdown): closed segments are exact.
    pub fn trim(&self) -> io::Result<()> {
        let written = self.written_bytes.load(Ordering::Acquire);
        let mut allocation = self.allocation.lock().expect("allocation lock");
        allocation.closed = true;
        if allocation.bytes > written {
            self.file.set_len(written)?;
            allocation.bytes = written;
        }
        drop(allocation);
        self.file.sync_all()
    }

    /// Makes batches written at `position` visible to readers, after their durability holds.
    pub fn publish(&self, position: u64, header: &BatchHeader) {
        let mut meta = self.meta.write().expect("segment meta lock");
        meta.note_batch(self.base_offset, position, header, self.index_interval_bytes);
        drop(meta);
        self.committed_bytes.store(position + header.batch_len as u64, Ordering::Release);
    }

    /// The byte position of the batch holding `offset`, or of an earlier batch.
    pub fn position_for_offset(&self, offset: u64) -> u64 {
        let relative = offset.saturating_sub(self.base_offset).min(u32::MAX as u64) as u32;
        let meta = self.meta.read().expect("segment meta lock");
        let at = meta.entries.partition_point(|entry| entry.relative_offset <= relative);
        if at == 0 { 0 } else { meta.entries[at - 1].position as u64 }
    }

    /// A byte position from which the first record with timestamp ≥ `timestamp_ms` is reached.
    pub fn position_for_timestamp(&self, timestamp_ms: i64) -> u64 {
        let meta = self.meta.read().expect("segment meta lock");
        let at = meta.entries.partition_point(|entry| entry.max_timestamp_before_ms < timestamp_ms);
        if at == 0 { 0 } else { meta.entries[at - 1].position as u64 }
    }

    /// How many bytes from `position` hold about `records` records, by this segment's average
    /// record size: what a read wanting that many first takes from the file.
    pub fn bytes_for_records(&self, position: u64, records: usize) -> usize {
        let committed = self.committed_bytes();
        let count = self.next_offset().saturating_sub(self.base_offset).max(1);
        let average = committed.div_ceil(count);
        // The read starts at an index entry up to an interval before the first record wanted,
        // and its last batch may run past the records wanted: a quarter more, and an interval.
        let wanted = (records as u64).saturating_mul(average);
        let estimate = wanted.saturating_add(wanted / 4).saturating_add(2 * self.index_interval_bytes);
        estimate.min(committed.saturating_sub(position)) as usize
    }

    /// Reads batches from `position` up to the committed end, calling `visit` with each one's
    /// position until it returns false. The file is read in chunks, the first of `first_chunk`
    /// bytes (at least 16 KiB), each next twice as large up to a scan's 1 MiB: a reader taking
    /// a few records reads a few records' worth, not a megabyte. A batch `visit` cannot decode
    /// is reported with its byte position.
    pub fn read_batches(
        &self,
        position: u64,
        first_chunk: usize,
        mut visit: impl FnMut(u64, &BatchHeader, Bytes) -> Result<bool, DecodeError>,
    ) -> Result<(), (u64, String)> {
        let end = self.committed_bytes();
        let first_chunk = first_chunk.clamp(READ_CHUNK_MIN_BYTES, SCAN_CHUNK_BYTES);
        let mut reader = BatchReader::new(&*self.file, position, end, first_chunk);
        loop {
            match reader.next_batch() {
                Ok(None) => return Ok(()),
                Ok(Some((batch_position, header, batch))) => match visit(batch_position, &header, batch) {
                    Ok(true) => {}
                    Ok(false) => return Ok(()),
                    Err(reason) => return Err((batch_position, reason.to_string())),
                },
                Err(ScanStop::Io(error)) => return Err((reader.position, error.to_string())),
                Err(ScanStop::Bad { position, reason } | ScanStop::Newer { position, reason }) => {
                    return Err((position, reason));
                }
            }
        }
    }

    /// Writes the offset index and time index files describing the committed bytes.
    pub fn persist_index(&self, dir: &Path) -> io::Result<()> {
        let meta = self.meta();
        let covered = self.committed_bytes();
        let header = |magic: u32, count: usize| {
            let mut bytes = Vec::with_capacity(INDEX_HEADER_BYTES);
            bytes.extend_from_slice(&magic.to_le_bytes());
            bytes.extend_from_slice(&INDEX_VERSION.to_le_bytes());
            bytes.extend_from_slice(&0u16.to_le_bytes());
            bytes.extend_from_slice(&self.base_offset.to_le_bytes());
            bytes.extend_from_slice(&covered.to_le_bytes());
            bytes.extend_from_slice(&meta.next_offset.to_le_bytes());
            bytes.extend_from_slice(&meta.max_timestamp_ms.to_le_bytes());
            bytes.extend_from_slice(&(count as u32).to_le_bytes());
            bytes
        };
        let mut offsets = header(OFFSET_INDEX_MAGIC, meta.entries.len());
        let mut times = header(TIME_INDEX_MAGIC, meta.entries.len());
        let mut offset_entries = Vec::with_capacity(meta.entries.len() * 8);
        let mut time_entries = Vec::with_capacity(meta.entries.len() * 12);
        for entry in &meta.entries {
            offset_entries.extend_from_slice(&entry.relative_offset.to_le_bytes());
            offset_entries.extend_from_slice(&entry.position.to_le_bytes());
            time_entries.extend_from_slice(&entry.max_timestamp_before_ms.to_le_bytes());
            time_entries.extend_from_slice(&entry.relative_offset.to_le_bytes());
        }
        for (file_bytes, entries, suffix) in
            [(&mut offsets, offset_entries, INDEX_SUFFIX), (&mut times, time_entries, TIME_INDEX_SUFFIX)]
        {
            let crc = crc32c::crc32c_append(crc32c::crc32c(file_bytes), &entries);
            file_bytes.extend_from_slice(&crc.to_le_bytes());
            file_bytes.extend_from_slice(&entries);
            write_atomically(&segment_file(dir, self.base_offset, suffix), file_bytes)?;
        }
        Ok(())
    }

    /// Removes the segment's files. Readers holding this segment keep reading the open file.
    pub fn delete_files(&self, dir: &Path) -> io::Result<()> {
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            match fs::remove_file(segment_file(dir, self.base_offset, suffix)) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        fs::remove_file(&self.path)
    }

    /// Removes the files of a segment maintenance had already taken out of the partition (the
    /// manifest no longer lists it) when it stopped before deleting them.
    pub fn delete_leftover(dir: &Path, base_offset: u64) -> io::Result<()> {
        Self::invalidate_index(dir, base_offset)?;
        fs::remove_file(segment_file(dir, base_offset, LOG_SUFFIX))?;
        sync_dir(dir)
    }

    /// Removes the index files so a later open rebuilds them (called before the data changes).
    pub fn invalidate_index(dir: &Path, base_offset: u64) -> io::Result<()> {
        for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
            match fs::remove_file(segment_file(dir, base_offset, suffix)) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Writes a file through a temporary name and a rename, so a crash leaves the old or the new
/// file, never half of one.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut file = File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_data()?;
    fs::rename(&temporary, path)
}

pub(crate) fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Loads both index files if they are intact and describe exactly `file_bytes` bytes.
pub(crate) fn load_index(dir: &Path, base_offset: u64, file_bytes: u64) -> Option<SegmentMeta> {
    let offsets = fs::read(segment_file(dir, base_offset, INDEX_SUFFIX)).ok()?;
    let times = fs::read(segment_file(dir, base_offset, TIME_INDEX_SUFFIX)).ok()?;
    let parse = |bytes: &[u8], magic: u32, entry_bytes: usize| -> Option<(u64, i64, usize)> {
        if bytes.len() < INDEX_HEADER_BYTES {
            return None;
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
        let count = u32_at(40) as usize;
        let ok = u32_at(0) == magic
            && u16::from_le_bytes([bytes[4], bytes[5]]) == INDEX_VERSION
            && u16::from_le_bytes([bytes[6], bytes[7]]) == 0
            && u64_at(8) == base_offset
            && u64_at(16) == file_bytes
            && bytes.len() == INDEX_HEADER_BYTES + count * entry_bytes
            && crc32c::crc32c_append(crc32c::crc32c(&bytes[..44]), &bytes[INDEX_HEADER_BYTES..]) == u32_at(44);
        ok.then(|| (u64_at(24), u64_at(32) as i64, count))
    };
    let (next_offset, max_timestamp_ms, count) = parse(&offsets, OFFSET_INDEX_MAGIC, 8)?;
    if parse(&times, TIME_INDEX_MAGIC, 12)? != (next_offset, max_timestamp_ms, count) {
        return None;
    }
    let mut entries = Vec::with_capacity(count);
    for i in 0..count {
        let at = INDEX_HEADER_BYTES + i * 8;
        let relative_offset = u32::from_le_bytes(offsets[at..at + 4].try_into().unwrap());
        let position = u32::from_le_bytes(offsets[at + 4..at + 8].try_into().unwrap());
        let at = INDEX_HEADER_BYTES + i * 12;
        let max_timestamp_before_ms = i64::from_le_bytes(times[at..at + 8].try_into().unwrap());
        let time_relative = u32::from_le_bytes(times[at + 8..at + 12].try_into().unwrap());
        if time_relative != relative_offset || (position as u64) >= file_bytes.max(1) {
            return None;
        }
        entries.push(IndexEntry { relative_offset, position, max_timestamp_before_ms });
    }
    let last_entry_position = entries.last().map_or(0, |entry| entry.position as u64);
    Some(SegmentMeta { entries, next_offset, max_timestamp_ms, last_entry_position })
}

pub(crate) enum ScanStop {
    Io(io::Error),
    /// The batch at `position` is torn ("torn") or corrupt (the decode error).
    Bad {
        position: u64,
        reason: String,
    },
    /// The batch at `position` is whole (its checksum holds) but of a version or with
    /// attributes a newer onehop writes: not damage, never cut or set aside.
    Newer {
        position: u64,
        reason: String,
    },
}

/// Validates every batch in `[from, end)` (header, length, CRC, offsets increasing from
/// `base_offset`), calling `visit` for each good one.
pub(crate) fn scan(
    file: &dyn SegmentFile,
    from: u64,
    end: u64,
    base_offset: u64,
    mut visit: impl FnMut(u64, &BatchHeader, Bytes),
) -> Result<(), ScanStop> {
    let mut reader = BatchReader::new(file, from, end, SCAN_CHUNK_BYTES);
    let mut next_offset = base_offset;
    loop {
        let position = reader.position;
        match reader.next_batch()? {
            None => return Ok(()),
            Some((position_read, header, batch)) => {
                debug_assert_eq!(position, position_read);
                if header.base_offset < next_offset {
                    return Err(ScanStop::Bad {
                        position,
                        reason: format!(
                            "batch base offset {} is below the expected {}",
                            header.base_offset, next_offset
                        ),
                    });
                }
                // The CRC says the bytes are as written; decoding says they were written right.
                // Checked here so a bad batch is cut at recovery instead of failing every read.
                if let Err(reason) = decode_records(&header, &batch) {
                    return Err(ScanStop::Bad { position, reason: reason.to_string() });
                }
                next_offset = header.next_offset();
                visit(position, &header, batch);
            }
        }
    }
}

/// The batch at `position`, whole and checked (header, length within `end`, CRC; its records
/// are not decoded). `None` at `end`.
pub(crate) fn read_batch_at(
    file: &dyn SegmentFile,
    position: u64,
    end: u64,
) -> Result<Option<(BatchHeader, Bytes)>, ScanStop> {
    let mut reader = BatchReader::new(file, position, end, READ_CHUNK_MIN_BYTES);
    Ok(reader.next_batch()?.map(|(_, header, batch)| (header, batch)))
}

/// Reads consecutive batches with positioned reads through a chunk buffer.
struct BatchReader<'a> {
    file: &'a dyn SegmentFile,
    position: u64,
    end: u64,
    buffer: Vec<u8>,
    /// File position of `buffer[0]`.
    buffer_start: u64,
    /// Bytes the next refill reads (more when a batch needs it); doubles up to
    /// [`SCAN_CHUNK_BYTES`].
    chunk: usize,
}

impl<'a> BatchReader<'a> {
    fn new(file: &'a dyn SegmentFile, position: u64, end: u64, first_chunk: usize) -> Self {
        BatchReader { file, position, end, buffer: Vec::new(), buffer_start: position, chunk: first_chunk }
    }

    /// Makes `[from, from + len)` available in the buffer; returns its start index.
    fn fill(&mut self, from: u64, len: usize) -> io::Result<usize> {
        let buffered_end = self.buffer_start + self.buffer.len() as u64;
        if from >= self.buffer_start && from + len as u64 <= buffered_end {
            return Ok((from - self.buffer_start) as usize);
        }
        let want = len.max(self.chunk).min((self.end - from) as usize).max(len);
        self.chunk = (self.chunk * 2).min(SCAN_CHUNK_BYTES);
        if self.buffer.len() < want {
            // A fresh zeroed allocation, not a resize: nothing of the old chunk is kept, so
            // nothing is copied, and memory fresh from the system needs no zeroing.
            self.buffer = vec![0; want];
        } else {
            self.buffer.truncate(want);
        }
        self.file.read_exact_at(&mut self.buffer, from)?;
        self.buffer_start = from;
        Ok(0)
    }

    /// A batch at `position` whose version or attributes this reader does not know: written by
    /// a newer onehop when its CRC holds (never damage to cut), damage otherwise.
    fn newer_or_bad(&mut self, position: u64, reason: DecodeError) -> ScanStop {
        let bad = ScanStop::Bad { position, reason: reason.to_string() };
        let at = (position - self.buffer_start) as usize;
        let len = u32::from_le_bytes(self.buffer[at + 8..at + 12].try_into().expect("4 bytes")) as usize;
        if len < BATCH_HEADER_BYTES || position + len as u64 > self.end {
            return bad;
        }
        match self.fill(position, len) {
            Ok(at) if BatchHeader::any_version_intact(&self.buffer[at..at + len]) => {
                ScanStop::Newer { position, reason: format!("{reason}, and its checksum holds") }
            }
            Ok(_) => bad,
            Err(error) => ScanStop::Io(error),
        }
    }

    fn next_batch(&mut self) -> Result<Option<(u64, BatchHeader, Bytes)>, ScanStop> {
        let position = self.position;
        if position >= self.end {
            return Ok(None);
        }
        let torn = || ScanStop::Bad { position, reason: "torn".into() };
        if self.end - position < BATCH_HEADER_BYTES as u64 {
            return Err(torn());
        }
        let at = self.fill(position, BATCH_HEADER_BYTES).map_err(ScanStop::Io)?;
        let header = match BatchHeader::parse(&self.buffer[at..at + BATCH_HEADER_BYTES]) {
            Ok(header) => header,
            Err(reason @ (DecodeError::BadVersion(_) | DecodeError::BadAttributes(_))) => {
                return Err(self.newer_or_bad(position, reason));
            }
            Err(reason) => return Err(ScanStop::Bad { position, reason: reason.to_string() }),
        };
        let len = header.batch_len as usize;
        if position + len as u64 > self.end {
            return Err(torn());
        }
        let at = self.fill(position, len).map_err(ScanStop::Io)?;
        let batch = Bytes::copy_from_slice(&self.buffer[at..at + len]);
        header.verify(&batch).map_err(|reason| ScanStop::Bad { position, reason: reason.to_string() })?;
        self.position = position + len as u64;
        Ok(Some((position, header, batch)))
    }
}
