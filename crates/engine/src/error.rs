//! Engine errors. Each has a stable `code` (for HTTP/MQTT answers) and a message that says what
//! to do.

use onehop_log::{AppendError, OpenError, ReadError};

/// An engine error. `Display` writes its message and, after it, its hint (what to do about
/// it); a front end that has a place for each (HTTP's `message` and `hint`) takes them apart
/// with [`EngineError::message`] and [`EngineError::hint`].
#[derive(Debug)]
pub enum EngineError {
    InvalidName {
        name: String,
        reason: String,
    },
    /// No stream of that name. `auto_create` is whether this server creates streams on their
    /// first publish or subscription, so the message says what would create it here, and never
    /// suggests a setting already in force.
    UnknownStream {
        name: String,
        auto_create: bool,
    },
    StreamExists {
        name: String,
        existing: String,
    },
    UnknownPartition {
        stream: String,
        partition: u32,
        count: u32,
    },
    InvalidDefinition(String),
    Append(AppendError),
    Read(ReadError),
    Open(OpenError),
    Catalog {
        offset: u64,
        reason: String,
    },
    UnknownTable(String),
    TableExists {
        name: String,
        existing: String,
    },
    NameTaken {
        name: String,
        kind: &'static str,
    },
    UnknownIndex(String),
    UnknownView(String),
    ViewExists {
        name: String,
    },
    InUse {
        name: String,
        reader: String,
        drop: String,
    },
    InvalidRow(String),
    RowNotFound {
        table: String,
        id: String,
    },
    PreconditionFailed {
        table: String,
        id: String,
        reason: String,
        current: Option<u64>,
    },
    Unindexed {
        table: String,
        fields: Vec<String>,
    },
    InvalidFilter(String),
    /// The client is not identified (no credentials where they are required, or wrong ones).
    Unauthenticated(crate::access::LoginFailure),
    /// The identified user may not do this: `object` is `stream orders`, `table carts`, or
    /// `ALL (to …)` for what only a superuser does.
    Forbidden {
        user: Option<String>,
        privilege: crate::access::model::Privilege,
        object: String,
    },
    /// What only a superuser (`ADMIN ON ALL`) may do: `action` is `create users`, ….
    NotSuperuser {
        user: Option<String>,
        action: String,
    },
    /// The user is at one of its limits (`ALTER USER … SET LIMITS`): `limit` names it
    /// (`connections`, `subscriptions`, `publishes_per_second`, `publish_bytes_per_second`).
    LimitExceeded {
        user: String,
        limit: &'static str,
        value: u64,
    },
    /// Too many failed logins from this address (or for this user from it): refused without a
    /// check for `retry_after_ms` ([`crate::access::failed_logins`]).
    LoginThrottled {
        retry_after_ms: u64,
    },
    /// A change a cluster does not replicate yet (`what` names it): it would exist on one node
    /// only.
    NotReplicated(&'static str),
    /// A joined view stopped: its state passed its `state_bytes_max`.
    ViewStateLimit {
        view: String,
        bytes: u64,
        max: u64,
    },
    /// An idempotency key that is not one (empty, too long, not visible ASCII).
    InvalidIdempotencyKey(String),
    /// The idempotency key named another write within its window (another stream, other
    /// records): nothing was written.
    IdempotencyKeyReused {
        key: String,
    },
    /// A write with this idempotency key is on its way: try again shortly for its answer.
    IdempotencyInProgress {
        key: String,
    },
    Internal(String),
}

impl From<AppendError> for EngineError {
    fn from(error: AppendError) -> Self {
        EngineError::Append(error)
    }
}

impl From<ReadError> for EngineError {
    fn from(error: ReadError) -> Self {
        EngineError::Read(error)
    }
}

impl From<OpenError> for EngineError {
    fn from(error: OpenError) -> Self {
        EngineError::Open(error)
    }
}

impl std::error::Error for EngineError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EngineError::Append(error) => Some(error),
            EngineError::Read(error) => Some(error),
            EngineError::Open(error) => Some(error),
            _ => None,
        }
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.hint() {
            Some(hint) => write!(f, "{}: {hint}", self.message()),
            None => f.write_str(&self.message()),
        }
    }
}

impl EngineError {
    /// What went wrong, in one sentence, without what to do about it.
    pub fn message(&self) -> String {
        match self {
            EngineError::InvalidName { name, reason } => format!("invalid name {name:?}: {reason}"),
            EngineError::UnknownStream { name, .. } => format!("unknown stream {name:?}"),
            EngineError::StreamExists { name, existing } => {
                format!("stream {name:?} already exists with a different definition ({existing})")
            }
            EngineError::UnknownPartition { stream, partition, count } => {
                format!("stream {stream:?} has {count} partitions; partition {partition} does not exist")
            }
            EngineError::InvalidDefinition(reason) => format!("invalid definition: {reason}"),
            EngineError::Append(error) => error.to_string(),
            EngineError::Read(error) => error.to_string(),
            EngineError::Open(error) => format!("storage: {error}"),
            EngineError::Catalog { offset, reason } => {
                format!("the catalog holds a record it cannot read at offset {offset}: {reason}")
            }
            EngineError::UnknownTable(name) => format!("unknown table {name:?}"),
            EngineError::TableExists { name, existing } => {
                format!("table {name:?} already exists with a different definition ({existing})")
            }
            EngineError::NameTaken { name, kind } => format!("{name:?} is already the name of a {kind}"),
            EngineError::UnknownIndex(name) => format!("unknown index {name:?}"),
            EngineError::UnknownView(name) => format!("unknown view {name:?}"),
            EngineError::ViewExists { name } => format!("view {name:?} already exists with a different definition"),
            EngineError::InUse { name, reader, .. } => format!("{name:?} is read by {reader}"),
            EngineError::InvalidRow(reason) => format!("invalid row: {reason}"),
            EngineError::RowNotFound { table, id } => format!("table {table:?} has no row {id:?}"),
            EngineError::PreconditionFailed { table, id, reason, .. } => {
                format!("precondition failed for row {id:?} of table {table:?}: {reason}")
            }
            EngineError::Unindexed { table, fields } => format!("no index on {fields:?} in table {table:?}"),
            EngineError::InvalidFilter(reason) => format!("invalid filter: {reason}"),
            EngineError::Unauthenticated(failure) => failure.message().to_string(),
            EngineError::Forbidden { user, privilege, object } => {
                format!("user {:?} may not {privilege} {object}", user.as_deref().unwrap_or("(anonymous)"))
            }
            EngineError::NotSuperuser { user, action } => {
                format!("user {:?} may not {action}", user.as_deref().unwrap_or("(anonymous)"))
            }
            EngineError::LimitExceeded { user, limit, value } => {
                let rate = if limit.ends_with("per_second") { " (a second's worth at once)" } else { "" };
                format!("user {user:?} is at its limit {limit} = {value}{rate}")
            }
            EngineError::LoginThrottled { retry_after_ms } => {
                format!("too many failed logins from this address: try again in {} s", retry_after_ms.div_ceil(1000))
            }
            EngineError::NotReplicated(what) => format!("{what} is not replicated in a cluster yet"),
            EngineError::ViewStateLimit { view, bytes, max } => {
                format!("view {view:?} stopped: its state reached {bytes} bytes, over its state_bytes_max of {max}")
            }
            EngineError::InvalidIdempotencyKey(reason) => reason.clone(),
            EngineError::IdempotencyKeyReused { key } => {
                format!("the idempotency key {key:?} named another write; nothing was written")
            }
            EngineError::IdempotencyInProgress { key } => {
                format!("a write with the idempotency key {key:?} is on its way")
            }
            EngineError::Internal(reason) => format!("internal error: {reason}"),
        }
    }

    /// When the client may try again, for a refusal that says so.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match self {
            EngineError::LoginThrottled { retry_after_ms } => Some(*retry_after_ms),
            EngineError::IdempotencyInProgress { .. } => Some(1000),
            _ => None,
        }
    }

    /// What to do about it, when something can be done: the statement that creates what is
    /// missing, the way around a clash.
    pub fn hint(&self) -> Option<String> {
        Some(match self {
            EngineError::UnknownStream { name, auto_create } => unknown_stream_hint(name, *auto_create),
            EngineError::StreamExists { name, .. } => format!(
                "to change its retention or partitions use ALTER STREAM {name} SET (partitions = …, retention = …); to \
                 replace it, DROP STREAM {name} first"
            ),
            EngineError::TableExists { .. } => "drop it first or use the existing definition".to_string(),
            EngineError::UnknownTable(name) => {
                format!("create it first (CREATE TABLE {name} (id TEXT PRIMARY KEY, …))")
            }
            EngineError::NameTaken { .. } => "streams, tables and views share one namespace".to_string(),
            EngineError::UnknownView(name) => format!("create it first (CREATE VIEW {name} AS SELECT …)"),
            EngineError::ViewExists { name } => format!("drop it first (DROP VIEW {name})"),
            EngineError::InUse { drop, .. } => format!("drop that first ({drop})"),
            EngineError::Forbidden { user: Some(user), privilege, object } => {
                let object = object
                    .split_once(' ')
                    .map_or(object.clone(), |(kind, name)| format!("{} {name}", kind.to_ascii_uppercase()));
                format!(
                    "a superuser can grant it: GRANT {} ON {object} TO {user}",
                    privilege.as_str().to_ascii_uppercase()
                )
            }
            EngineError::NotSuperuser { .. } => "that takes a superuser (a user with ADMIN ON ALL)".to_string(),
            EngineError::ViewStateLimit { view, .. } => format!(
                "recreate it with a larger cap (DROP VIEW {view}; CREATE VIEW {view} WITH (state_bytes_max = '…') AS …), \
                 or make it read fewer rows or fields"
            ),
            EngineError::NotReplicated(_) => {
                "a cluster serves streams; tables, views, transforms and users need a single node for now \
                 (docs/cluster.md)"
                    .to_string()
            }
            EngineError::Append(AppendError::Unconfirmed(_)) => {
                "retry; with a key or an idempotent producer a retry cannot duplicate (docs/cluster.md)".to_string()
            }
            EngineError::LimitExceeded { limit, .. } if limit.ends_with("per_second") => {
                "try again in a second; a superuser can raise it (ALTER USER … SET LIMITS (…))".to_string()
            }
            EngineError::LimitExceeded { .. } => {
                "close one first; a superuser can raise it (ALTER USER … SET LIMITS (…))".to_string()
            }
            EngineError::LoginThrottled { .. } => {
                "each further failure from this address doubles the wait, up to a minute; the right password from \
                 another address is not held up (docs/security.md)"
                    .to_string()
            }
            EngineError::IdempotencyKeyReused { .. } => {
                "a key names one write (the same stream, the same records) for its window: use a new key for a new \
                 write"
                    .to_string()
            }
            EngineError::IdempotencyInProgress { .. } => {
                "retry shortly: once it is written, the retry is answered with its answer".to_string()
            }
            EngineError::Unindexed { table, fields } => {
                let first = fields.first().map(String::as_str).unwrap_or("field");
                format!("create one (CREATE INDEX ON {table} ({first})), or add scan=true to read every row")
            }
            _ => return None,
        })
    }
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
    /// Well formed, and refused for what it means (an idempotency key reused for another write).
    Unprocessable,
    /// Over a size limit.
    TooLarge,
    /// A position outside what is stored.
    OutOfRange,
    /// The server is stopping.
    ShuttingDown,
    /// Storage failed; the server refuses writes until restarted.
    StorageFailed,
    /// The client is not identified: it must present (other) credentials.
    Unauthenticated,
    /// The client is identified and may not do this.
    Forbidden,
    /// The client's user is at one of its limits: it may try again later.
    LimitExceeded,
    /// The cluster could not confirm a write (no majority reachable, or its answer lost): the
    /// client may retry.
    Unavailable,
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
            | EngineError::InvalidFilter(_)
            | EngineError::NotReplicated(_)
            | EngineError::InvalidIdempotencyKey(_) => Kind::Invalid,
            EngineError::IdempotencyKeyReused { .. } => Kind::Unprocessable,
            EngineError::IdempotencyInProgress { .. } => Kind::Conflict,
            EngineError::ViewStateLimit { .. } => Kind::Unavailable,
            EngineError::Append(append) => match append {
                AppendError::RecordTooLarge { .. } | AppendError::BatchTooLarge { .. } => Kind::TooLarge,
                AppendError::SubjectTooLong(_) | AppendError::TooManyHeaders | AppendError::EmptyBatch => Kind::Invalid,
                AppendError::Closed => Kind::ShuttingDown,
                AppendError::Poisoned(_) => Kind::StorageFailed,
                AppendError::Unconfirmed(_) => Kind::Unavailable,
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
            EngineError::Unauthenticated(_) => Kind::Unauthenticated,
            EngineError::Forbidden { .. } | EngineError::NotSuperuser { .. } => Kind::Forbidden,
            EngineError::LimitExceeded { .. } | EngineError::LoginThrottled { .. } => Kind::LimitExceeded,
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
            EngineError::Append(AppendError::Unconfirmed(_)) => "unconfirmed",
            EngineError::NotReplicated(_) => "not_replicated",
            EngineError::ViewStateLimit { .. } => "view_state_limit",
            EngineError::InvalidIdempotencyKey(_) => "bad_idempotency_key",
            EngineError::IdempotencyKeyReused { .. } => "idempotency_key_reused",
            EngineError::IdempotencyInProgress { .. } => "idempotency_key_in_progress",
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
            EngineError::Unauthenticated(_) => "unauthenticated",
            EngineError::Forbidden { .. } | EngineError::NotSuperuser { .. } => "forbidden",
            EngineError::LimitExceeded { .. } => "limit_exceeded",
            EngineError::LoginThrottled { .. } => "login_throttled",
            EngineError::Internal(_) => "internal",
        }
    }

    /// Whether the client asked for something wrong (as opposed to the server failing).
    pub fn is_client_error(&self) -> bool {
        !matches!(
            self.kind(),
            ErrorKind::ShuttingDown | ErrorKind::StorageFailed | ErrorKind::Internal | ErrorKind::Unavailable
        )
    }
}
