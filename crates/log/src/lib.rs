//! onehop's durable log: the only source of truth and the only fsync in the system.
//!
//! # Layout
//!
//! - `format`: the batch and record encoding on disk (docs/log-format.md is its description).
//! - `segment`: one segment file with its sparse offset and time indexes; tail recovery.
//! - `partition`: a directory of segments; appends, reads and waiting for new records.
//! - `writer`: the commit pipeline of a partition — a write thread and a sync thread doing
//!   group commit.
//! - `tail`: the newest batches of a partition in memory, for readers close behind the writer.
//! - `text`, `headers`: [`Text`], the shared UTF-8 strings of records (subjects, header names),
//!   and [`Headers`], a read record's headers left in its batch's bytes.
//! - `maintenance`: retention (whole segments by age or size) and compaction (newest per key).
//! - `store`: the log as a directory of topics and partitions, its maintenance thread, and the
//!   data-directory lock.
//! - `config`, `error`, `metrics`: settings, error enums, metric names.
//!
//! Durability contract: an append resolves only when its [`Durability`] holds, and readers only
//! ever see records whose append condition held. After a crash, recovery keeps every batch up to
//! the first torn or corrupt one in the last segment and cuts the rest.

mod config;
mod error;
mod format;
mod headers;
mod maintenance;
pub mod metrics;
mod partition;
mod segment;
mod store;
mod tail;
mod text;
mod writer;

pub use config::{Durability, PartitionConfig};
pub use error::{AppendError, DecodeError, MaintenanceError, OpenError, ReadError};
pub use format::{BATCH_HEADER_BYTES, BATCH_MAGIC, BATCH_VERSION, BatchHeader, NewRecord, Record, decode_records};
pub use headers::Headers;
pub use maintenance::{CompactionReport, RetentionReport};
pub use partition::{AppendAck, Partition, QueuedAppend, ReadAhead, RecoveryReport, Watermark};
pub use store::{DirLock, LockError, Log, LogOptions, OpenedPartition, TOPIC_NAME_BYTES_MAX, validate_topic_name};
pub use text::Text;
