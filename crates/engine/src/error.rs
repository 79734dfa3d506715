//! Engine errors. Each has a stable `code` (for HTTP/MQTT answers) and a message that says what
//! to do.

use onehop_log::{AppendError, OpenError, ReadError};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("invalid name {name:?}: {reason}")]
    InvalidName { name: String, reason: String },
    #[error("unknown stream {0:?}: create it first (CREATE STREAM {0}) or turn auto_create on")]
    UnknownStream(String),
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
}

impl EngineError {
    /// A stable, machine-readable code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::InvalidName { .. } => "invalid_name",
            EngineError::UnknownStream(_) => "unknown_stream",
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
        }
    }

    /// Whether the client asked for something wrong (as opposed to the server failing).
    pub fn is_client_error(&self) -> bool {
        !matches!(self.code(), "storage_failed" | "shutting_down")
    }
}
