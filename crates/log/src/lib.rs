//! onehop's durable log: the only source of truth and the only fsync in the system.
//!
//! # Layout
//!
//! - `format`: the batch and record encoding on disk (docs/log-format.md is its description).
//! - `file`: [`SegmentFile`] and [`Storage`], the file layer under segments ([`FileStorage`] is
//!   the real one; tests put faults there).
//! - `segment`: one segment file with its sparse offset and time indexes.
//! - `recovery`: what opening a segment does with bytes that are not valid batches: the runway
//!   and a torn tail are cut, damage is refused or set aside ([`RecoveryPolicy`]).
//! - `partition`: a directory of segments; appends, reads and waiting for new records.
//! - `writer`: the commit pipeline of a partition — a write thread and a sync thread doing
//!   group commit.
//! - `journal`: the optional shared journal, one file and one sync for the batches of every
//!   partition of a log in a group-commit window, replayed into the segments on open.
//! - `tail`: the newest batches of a partition in memory, for readers close behind the writer.
//! - `text`, `headers`: [`Text`], the shared UTF-8 strings of records (subjects, header names),
//!   and [`Headers`], a read record's headers left in its batch's bytes.
//! - `manifest`: the partition's list of its segments, which opening checks the files against
//!   (a segment deleted or cut short at a batch boundary is found, not read around).
//! - `maintenance`: retention (whole segments by age or size) and compaction (newest per key).
//! - `store`: the log as a directory of topics and partitions, its maintenance thread, and the
//!   data-directory lock.
//! - `check`: a full, read-only check of a log directory (`onehop check`).
//! - `config`, `error`, `metrics`: settings, error enums, metric names.
//!
//! Durability contract: an append resolves only when its [`Durability`] holds, and readers only
//! ever see records whose append condition held. After a crash, recovery keeps every valid
//! batch, cuts a torn tail (the write in progress), and refuses damage that valid batches
//! follow rather than cut acknowledged records.

mod check;
mod config;
mod error;
mod file;
mod format;
mod headers;
mod journal;
mod maintenance;
mod manifest;
pub mod metrics;
mod partition;
mod recovery;
mod segment;
mod store;
mod tail;
mod text;
mod writer;

pub use check::{LogCheck, PartitionCheck, check_log, check_partition};
pub use config::{Durability, PartitionConfig};
pub use error::{AppendError, DecodeError, MaintenanceError, Missing, OpenError, ReadError};
pub use file::{FileStorage, SegmentFile, Storage};
pub use format::{BATCH_HEADER_BYTES, BATCH_MAGIC, BATCH_VERSION, BatchHeader, NewRecord, Record, decode_records};
pub use headers::Headers;
pub use journal::{JournalOptions, JournalReplay};
pub use maintenance::{CompactionReport, RetentionReport};
pub use manifest::MissingRecords;
pub use partition::{
    AppendAck, Partition, PartitionOptions, QueuedAppend, ReadAhead, RecoveryReport, Watermark, check_records, now_ms,
};
pub use recovery::{Discarded, RecoveryPolicy};
pub use store::{
    DirLock, LockError, Log, LogOptions, OpenedPartition, TOPIC_NAME_BYTES_MAX, partition_dirs, validate_topic_name,
};
pub use text::Text;
