//! Errors, one enum per operation, each naming what went wrong and what to do about it.

use std::io;
use std::path::PathBuf;

/// Why bytes on disk are not a valid batch.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    #[error("batch ends before its declared length")]
    Truncated,
    #[error("bad batch magic {0:#010x}")]
    BadMagic(u32),
    #[error("unknown batch version {0}")]
    BadVersion(u16),
    #[error("unknown batch attributes {0:#06x}")]
    BadAttributes(u16),
    #[error("impossible batch length {0}")]
    BadLength(u32),
    #[error("record count does not match the batch's offsets")]
    BadCount,
    #[error("CRC mismatch: header says {expected:#010x}, bytes give {actual:#010x}")]
    BadCrc { expected: u32, actual: u32 },
    #[error("unknown record flags {0:#04x}")]
    BadFlags(u8),
    #[error("record offset delta {0} out of order")]
    BadOffsetDelta(u32),
    #[error("{0} unexpected bytes after the last field")]
    TrailingBytes(usize),
    #[error("subject or header name is not UTF-8")]
    BadUtf8,
}

/// Why a partition could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "segment {path} is damaged at byte {position} ({reason}); it is not the last segment, so this is not \
         a torn write from a crash. Nothing was changed. What to do: {remedy}"
    )]
    Corrupt { path: PathBuf, position: u64, reason: String, remedy: String },
    #[error(transparent)]
    Damaged(Box<Damaged>),
    #[error(transparent)]
    DamagedTail(Box<DamagedTail>),
    #[error("invalid partition configuration in {path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error(transparent)]
    Missing(Box<Missing>),
    #[error(
        "segment {path} holds, at byte {position}, a batch a newer onehop wrote ({reason}). It is not damage, and \
         nothing was changed. What to do: run the onehop release that wrote it, or a later one"
    )]
    NewerFormat { path: PathBuf, position: u64, reason: String },
}

/// Records the partition held that its segment files no longer do: a segment deleted, or cut
/// short where a batch ends (see `manifest.rs`). Opening refuses.
#[derive(Debug, thiserror::Error)]
#[error(
    "partition {path} is missing records: {}. No crash does this: segment files were deleted or cut short \
     outside onehop. Reads would skip these offsets without a word. Nothing was changed. What to do: {remedy}",
    describe_missing(.missing)
)]
pub struct Missing {
    pub path: PathBuf,
    pub missing: Vec<crate::manifest::MissingRecords>,
    pub remedy: String,
}

fn describe_missing(missing: &[crate::manifest::MissingRecords]) -> String {
    let ranges: Vec<String> = missing
        .iter()
        .map(|gap| match gap.to {
            Some(to) => format!("offsets {} up to but not including {to} ({})", gap.from, gap.cause),
            None => format!("offsets from {} on ({})", gap.from, gap.cause),
        })
        .collect();
    ranges.join("; ")
}

/// Bad bytes in a segment that valid batches follow: damage, not a torn write. Opening refuses
/// (see `recovery.rs`).
#[derive(Debug, thiserror::Error)]
#[error(
    "segment {path} is damaged from byte {position} to byte {resume_at} ({reason}), and valid batches follow \
     from byte {resume_at} (offset {resume_offset} on). A crash tears only the last write, so this is damage: \
     cutting the segment there would lose records that may have been acknowledged and give their offsets out \
     again. Nothing was changed. The damaged bytes held the records at offsets {first_offset} up to but not \
     including {resume_offset}.{power_cut_note} What to do: {remedy}"
)]
pub struct Damaged {
    pub path: PathBuf,
    /// Where the first bad batch starts, and where the next valid one does.
    pub position: u64,
    pub resume_at: u64,
    /// The offsets the bad bytes could have held: `[first_offset, resume_offset)`.
    pub first_offset: u64,
    pub resume_offset: u64,
    pub reason: String,
    /// Empty, or a sentence on what the damaged bytes look like when they look like the writes
    /// a power cut lost.
    pub power_cut_note: String,
    pub remedy: String,
}

/// A last segment ending in bytes that are not a valid batch, in a partition that never cuts
/// its tail on the guess that it is torn (the catalog).
#[derive(Debug, thiserror::Error)]
#[error(
    "segment {path} ends in {bytes} bytes that are not a valid batch, from byte {position} ({reason}; the records \
     from offset {first_offset} on). After a crash that is the last write, torn, but this partition is never cut \
     on that guess. Nothing was changed. What to do: {remedy}"
)]
pub struct DamagedTail {
    pub path: PathBuf,
    pub position: u64,
    /// From `position` to the last non-zero byte.
    pub bytes: u64,
    pub first_offset: u64,
    pub reason: String,
    pub remedy: String,
}

/// Why an append was refused or not acknowledged.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum AppendError {
    #[error("record of {size} bytes exceeds the maximum record size of {max} bytes (record_bytes_max)")]
    RecordTooLarge { size: usize, max: usize },
    #[error("batch of {size} bytes exceeds the maximum batch size of {max} bytes (batch_bytes_max)")]
    BatchTooLarge { size: usize, max: usize },
    #[error("subject of {0} bytes exceeds the 65535-byte limit")]
    SubjectTooLong(usize),
    #[error("a record header name or count exceeds the 65535 limit")]
    TooManyHeaders,
    #[error("an empty batch cannot be appended")]
    EmptyBatch,
    #[error("the partition is closed")]
    Closed,
    #[error(
        "the partition stopped accepting writes after an I/O failure ({0}); nothing after the last \
         acknowledged record is guaranteed durable. Restart the server to recover from the log."
    )]
    Poisoned(String),
    /// A replicated write the cluster did not confirm (no majority reachable, or its answer lost
    /// on the way: then it may still have been committed).
    #[error("the write was not confirmed by the cluster: {0}")]
    Unconfirmed(String),
}

/// Why a read could not be served.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ReadError {
    #[error("offset {offset} is before the partition's first offset {start} (removed by retention or compaction)")]
    BeforeStart { offset: u64, start: u64 },
    #[error("offset {offset} is past the partition's end offset {end}")]
    PastEnd { offset: u64, end: u64 },
    #[error("I/O error reading the log: {0}")]
    Io(String),
    #[error(
        "corrupt batch in {segment} at byte {position}: {reason}. Opening checks the batches of a segment only \
         when its index is missing or stale, so damage under an intact index is found when it is read. What to \
         do: {remedy}"
    )]
    Corrupt { segment: String, position: u64, reason: String, remedy: String },
    #[error("the partition is closed")]
    Closed,
}

/// Why background maintenance (retention, compaction) failed.
#[derive(Debug, thiserror::Error)]
pub enum MaintenanceError {
    #[error("I/O error on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Open(#[from] OpenError),
}

pub(crate) fn io_at(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> OpenError {
    let path = path.into();
    move |source| OpenError::Io { path, source }
}
