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
        "segment {path} is corrupt at byte {position} ({reason}); it is not the last segment, so this is \
         not a torn write: restore the partition from a replica or backup, or move the file aside to \
         accept losing its records"
    )]
    Corrupt { path: PathBuf, position: u64, reason: String },
    #[error("invalid partition configuration in {path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
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
    #[error("corrupt batch in {segment} at byte {position}: {reason}")]
    Corrupt { segment: String, position: u64, reason: String },
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
