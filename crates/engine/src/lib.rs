//! onehop's engine: what the data means, above the log and below the protocols. It knows no
//! sockets and no SQL syntax; front ends call it, and it calls the log.
//!
//! # Layout
//!
//! - `access`: users, roles, grants and tokens; logging in and the checks every protocol asks.
//! - `catalog`: definitions (streams and tables; views and users as they land), kept as records
//!   of the compacted `__catalog` topic, so they are durable and replayed at start.
//! - `tabledef` / `table`: what a table is (columns, key, indexes) and the table itself: rows
//!   in memory, rebuilt from its compacted partition of row changes.
//! - `filter`: subscription filters (subject pattern, row key, `field=value`) and the typed keys
//!   that filters and table indexes compare values by.
//! - `stream`: a named stream of N partitions, key-hash partitioning, publish and read.
//! - `engine`: the entry point that owns the catalog and the open streams.
//! - `hub`: the subscription hub (one tailer per partition, routing through a subject trie into
//!   bounded subscriber queues) and `Cursor`, a gap-free history-then-live subscription.
//! - `subject`: subjects, MQTT-style subject filters (`+`, `#`) and the trie that matches a
//!   subject against many filters at once (the hub's and the MQTT broker's index).
//! - `view`: live views — the expression language, windowed and running aggregates, and the
//!   task that keeps each view, serves its reads and checkpoints it.
//! - `idempotency`: writes named by a client's key, answered once and replayed on retry.
//! - `error`: `EngineError`, each variant with a stable code for clients.
//! - `units`: byte sizes and durations as people write them (`64MiB`, `7d`).

pub mod access;
mod catalog;
mod engine;
mod error;
pub mod filter;
pub mod hub;
pub mod idempotency;
pub mod route;
mod stream;
pub mod subject;
pub mod subscription;
pub mod system;
pub mod table;
mod tabledef;
pub mod units;
pub mod view;

pub use access::limits::{Held, Resource};
pub use access::model::{ObjectKind, Privilege};
pub use access::{Access, Principal};
pub use catalog::{CATALOG_TOPIC, StreamDef, validate_name};
pub use engine::{Engine, EngineOptions, Positions, Replicator, Submitted, catalog_recovery, set_system_recovery};
pub use error::{EngineError, ErrorKind};
pub use filter::Filter;
pub use stream::{Position, Published, Stream};
pub use subject::SubjectFilter;
pub use table::{Page, Precondition, Row, Table, Write, Written};
pub use tabledef::{Column, ColumnType, ForeignKey, IndexDef, TableDef};

// The log's record vocabulary, as the engine's API speaks it: protocol front ends build and read
// records through the engine and never depend on the log crate itself.
pub use onehop_log::{Durability, Headers, NewRecord, PartitionConfig, QueuedAppend, Record, Text};

/// Metrics of the layers below the protocols (the log's), for a recorder to describe and
/// export; see [`onehop_log::metrics`].
pub mod telemetry {
    pub use onehop_log::metrics::{
        BATCH_RECORDS, BATCH_RECORDS_BUCKETS, FSYNC_SECONDS, FSYNC_SECONDS_BUCKETS, describe,
    };
}
