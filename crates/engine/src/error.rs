//! Engine errors. Each has a stable `code` (for HTTP/MQTT answers) and a message that says what
//! to do.

use onehop_log::{AppendError, OpenError, ReadError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    /// No stream of that name. `auto_create` is whether this server creates streams on their
    /// first publish or subscription, so the message says what would create it here, and never
    /// suggests a setting already in force.
    #[error("unknown stream {name:?}: {}", unknown_stream_hint(name, *auto_create))]
    UnknownStream { name: String, auto_create: bool },
    #[error(
        "stream {name:?} already exists with a different definition ({existing}); drop it first or use \
         the existing definition"
    )]
    StreamExists { name: String, existing: String },
    #[error("stream {stream:?} has {count} partitions; partition {partition} does not exist")]
    UnknownPartition { stream: String, partition: u32, count: u32 },
    #[error("invalid definition: {0}")]
    InvalidDefinition(String),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("storage: {0}")]
    Open(#[from] OpenError),
    #[error("the catalog holds a record it cannot read at offset {offset}: {reason}")]
    Catalog { offset: u64, reason: String },
    #[error("unknown table {0:?}: create it first (CREATE TABLE {0} (id TEXT PRIMARY KEY, …))")]
    UnknownTable(String),
    #[error(
        "table {name:?} already exists with a different definition ({existing}); drop it first or use the existing definition"
    )]
    TableExists { name: String, existing: String },
    #[error("{name:?} is already the name of a {kind}; streams, tables and views share one namespace")]
    NameTaken { name: String, kind: &'static str },
    #[error("unknown index {0:?}")]
    UnknownIndex(String),
    #[error("unknown view {0:?}: create it first (CREATE VIEW {0} AS SELECT …)")]
    UnknownView(String),
    #[error("view {name:?} already exists with a different definition; drop it first (DROP VIEW {name})")]
    ViewExists { name: String },
    #[error("{name:?} is read by {reader}: drop that first ({drop})")]
    InUse { name: String, reader: String, drop: String },
    #[error("invalid row: {0}")]
    InvalidRow(String),
    #[error("table {table:?} has no row {id:?}")]
    RowNotFound { table: String, id: String },
    #[error("precondition failed for row {id:?} of table {table:?}: {reason}")]
    PreconditionFailed { table: String, id: String, reason: String, current: Option<u64> },
    #[error(
        "no index on {fields:?} in table {table:?}: create one (CREATE INDEX ON {table} ({first})), or add \
         scan=true to read every row", first = fields.first().map(String::as_str).unwrap_or("field")
    )]
    Unindexed { table: String, fields: Vec<String> },
    #[error("invalid filter: {0}")]
    InvalidFilter(String),
    #[error("internal error: {0}")]
    Internal(String),
}

/// What creates the stream `name` on this server.
fn unknown_stream_hint(name: &str, auto_create: bool) -> String {
    if auto_create {
        format!("nothing has created it yet; CREATE STREAM {name}, a first publish or a first subscription does")
    } else {
        format!(
            "create it first (CREATE STREAM {name}); this server has auto_create off, so a publish or a \
             subscription does not create it"
        )
    }
}

/// What kind of refusal or failure an error is, whatever protocol reports it. Each front end
/// maps every kind to its own answer (an HTTP status, an MQTT reason code, a Kafka error code)
/// with an exhaustive match, and [`EngineError::kind`] is exhaustive over the errors: a new
/// error does not compile until it has a kind, nor a new kind until every protocol answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed, or asks for something that cannot be.
    Invalid,
    /// What it names does not exist.
    NotFound,
    /// It clashes with what exists (a name taken, a source still read).
    Conflict,
    /// A condition the client set (a version) did not hold; nothing was written.
    PreconditionFailed,
    /// Over a size limit.
    TooLarge,
    /// A position outside what is stored.
    OutOfRange,
    /// The server is stopping.
    ShuttingDown,
    /// Storage failed; the server refuses writes until restarted.
    StorageFailed,
    /// A broken invariant: a bug.
    Internal,
}

impl EngineError {
    /// The kind of this error (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as Kind;
        match self {
            EngineError::InvalidName { .. }
            | EngineError::InvalidDefinition(_)
            | EngineError::InvalidRow(_)
            | EngineError::Unindexed { .. }
            | EngineError::InvalidFilter(_) => Kind::Invalid,
            EngineError::Append(append) => match append {
                AppendError::RecordTooLarge { .. } | AppendError::BatchTooLarge { .. } => Kind::TooLarge,
                AppendError::SubjectTooLong(_) | AppendError::TooManyHeaders | AppendError::EmptyBatch => Kind::Invalid,
                AppendError::Closed => Kind::ShuttingDown,
                AppendError::Poisoned(_) => Kind::StorageFailed,
            },
            EngineError::Read(read) => match read {
                ReadError::BeforeStart { .. } | ReadError::PastEnd { .. } => Kind::OutOfRange,
                ReadError::Closed => Kind::ShuttingDown,
                ReadError::Io(_) | ReadError::Corrupt { .. } => Kind::StorageFailed,
            },
            EngineError::Open(_) | EngineError::Catalog { .. } => Kind::StorageFailed,
            EngineError::UnknownStream { .. }
            | EngineError::UnknownPartition { .. }
            | EngineError::UnknownTable(_)
            | EngineError::UnknownIndex(_)
            | EngineError::UnknownView(_)
            | EngineError::RowNotFound { .. } => Kind::NotFound,
            EngineError::StreamExists { .. }
            | EngineError::TableExists { .. }
            | EngineError::NameTaken { .. }
            | EngineError::ViewExists { .. }
            | EngineError::InUse { .. } => Kind::Conflict,
            EngineError::PreconditionFailed { .. } => Kind::PreconditionFailed,
            EngineError::Internal(_) => Kind::Internal,
        }
    }

    /// A stable, machine-readable code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::InvalidName { .. } => "invalid_name",
            EngineError::UnknownStream { .. } => "unknown_stream",
            EngineError::StreamExists { .. } => "stream_exists",
            EngineError::UnknownPartition { .. } => "unknown_partition",
            EngineError::InvalidDefinition(_) => "invalid_definition",
            EngineError::Append(AppendError::RecordTooLarge { .. }) => "record_too_large",
            EngineError::Append(AppendError::BatchTooLarge { .. }) => "batch_too_large",
            EngineError::Append(AppendError::SubjectTooLong(_)) => "subject_too_long",
            EngineError::Append(AppendError::TooManyHeaders) => "too_many_headers",
            EngineError::Append(AppendError::EmptyBatch) => "empty_batch",
            EngineError::Append(AppendError::Closed) | EngineError::Read(ReadError::Closed) => "shutting_down",
            EngineError::Append(AppendError::Poisoned(_)) => "storage_failed",
            EngineError::Read(ReadError::BeforeStart { .. }) => "offset_before_start",
            EngineError::Read(ReadError::PastEnd { .. }) => "offset_past_end",
            EngineError::Read(ReadError::Io(_) | ReadError::Corrupt { .. }) => "storage_failed",
            EngineError::Open(_) | EngineError::Catalog { .. } => "storage_failed",
            EngineError::UnknownTable(_) => "unknown_table",
            EngineError::TableExists { .. } => "table_exists",
            EngineError::NameTaken { .. } => "name_taken",
            EngineError::UnknownIndex(_) => "unknown_index",
            EngineError::UnknownView(_) => "unknown_view",
            EngineError::ViewExists { .. } => "view_exists",
            EngineError::InUse { .. } => "in_use",
            EngineError::InvalidRow(_) => "invalid_row",
            EngineError::RowNotFound { .. } => "not_found",
            EngineError::PreconditionFailed { .. } => "precondition_failed",
            EngineError::Unindexed { .. } => "unindexed_field",
            EngineError::InvalidFilter(_) => "bad_filter",
            EngineError::Internal(_) => "internal",
        }
    }

    /// Whether the client asked for something wrong (as opposed to the server failing).
    pub fn is_client_error(&self) -> bool {
        !matches!(self.kind(), ErrorKind::ShuttingDown | ErrorKind::StorageFailed | ErrorKind::Internal)
    }
}
