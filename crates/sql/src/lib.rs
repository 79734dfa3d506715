//! onehop's SQL front end: statements in, engine definitions and answers out.
//!
//! # Layout
//!
//! - `parse`: text to [`Statement`]s with sqlparser; `CREATE STREAM`, `CREATE VIEW`, `DROP STREAM`
//!   and `SHOW TABLES`, which sqlparser does not know or parses otherwise, are parsed here from the
//!   same token stream. Anything unsupported is refused with the
//!   list of what is supported.
//! - `view`: `CREATE VIEW … AS SELECT` and `CREATE STREAM … AS SELECT` (transforms), and SQL
//!   expressions to the engine's expression language; refuses what views cannot run.
//! - `access`: users, roles, grants and tokens (`CREATE USER`, `GRANT`, `CREATE TOKEN`, …).
//! - `query`: ad-hoc `SELECT` and `EXPLAIN`, planned and run over tables, views and streams.
//! - `execute`: a [`Statement`] run on the engine, to an [`Output`], checked against what the
//!   user running it may do.

mod access;
mod execute;
mod parse;
pub mod query;
mod view;

pub use access::AccessStatement;
pub use execute::{Output, execute, execute_as, execute_cancellable, execute_in, stream_as};
pub use parse::{Statement, StreamOptions, parse};
pub use query::Transaction;

/// Why a statement could not be parsed or run.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("syntax error: {0}")]
    Syntax(String),
    #[error("{statement} is not supported")]
    Unsupported { statement: String },
    #[error("{0}")]
    InvalidOption(String),
    /// A view or transform uses SQL they do not support.
    #[error("{what} is not supported here; {supported}")]
    UnsupportedQuery { what: String, supported: String },
    /// A view or transform is valid SQL but not a definition onehop can run (and says why).
    #[error("{0}")]
    InvalidQuery(String),
    /// A query was canceled by its client (a Postgres cancel request).
    #[error("canceling statement due to user request")]
    Canceled,
    /// A query passed one of its limits (`memory`, `time`, `stream_records`).
    #[error("{message}")]
    QueryLimit { limit: &'static str, message: String },
    /// A write would give a second row the primary key of one that exists.
    #[error("{0}")]
    UniqueViolation(String),
    /// A transaction's COMMIT found a row it wrote changed by another writer since the
    /// transaction read it: nothing of the transaction was written.
    #[error("{0}")]
    SerializationFailure(String),
    /// A statement that cannot run inside a transaction (a definition takes effect at once).
    #[error("{0}")]
    ActiveTransaction(String),
    /// What a transaction cannot hold (writes to a second table or stream).
    #[error("{0}")]
    Transaction(String),
    #[error(transparent)]
    Engine(#[from] onehop_engine::EngineError),
}

/// What `SqlError::Unsupported` lists.
pub const SUPPORTED: &str = "CREATE STREAM [IF NOT EXISTS] name [WITH (partitions = N, retention = '7d', retention_bytes = '1GiB', \
     durability = 'fsync'|'async', cleanup = 'delete'|'compact')]; ALTER STREAM name SET (retention = '30d', retention_bytes = 'none', partitions = 8); CREATE TABLE [IF NOT EXISTS] name (id TEXT PRIMARY KEY, col TYPE [NOT NULL], …) \
     [WITH (durability = …)]; CREATE INDEX [name] ON table (field); DROP STREAM|TABLE|INDEX|VIEW [IF EXISTS] name; \
     SHOW STREAMS; SHOW TABLES; SHOW VIEWS; DESCRIBE name; \
     CREATE USER name PASSWORD '…'; ALTER USER name PASSWORD '…'; DROP USER name; CREATE ROLE name; DROP ROLE name; \
     GRANT READ|WRITE|ADMIN ON ALL | STREAM|TABLE|VIEW name_or_prefix* TO user|role|PUBLIC; GRANT role TO user; REVOKE …; \
     CREATE TOKEN [FOR user] [VALID FOR '30d']; DROP TOKEN id; SHOW USERS|ROLES|GRANTS|TOKENS; \
     CREATE VIEW [IF NOT EXISTS] name [WITH (grace = '1s', emit = 'changes', …)] AS SELECT key, COUNT(*), SUM(x), … \
     FROM source | TUMBLE|HOP|SLIDING|SESSION(source, …) [WHERE condition] GROUP BY key";

impl SqlError {
    /// What the client can do about it, when there is something to say.
    pub fn hint(&self) -> Option<String> {
        match self {
            SqlError::Unsupported { .. } => Some(format!("supported statements: {SUPPORTED}")),
            SqlError::Engine(error) => error.hint(),
            SqlError::SerializationFailure(_) => Some("run the transaction again".into()),
            SqlError::ActiveTransaction(_) => Some("run it outside BEGIN … COMMIT".into()),
            _ => None,
        }
    }

    /// A stable code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            SqlError::Syntax(_) => "sql_syntax",
            SqlError::Unsupported { .. } | SqlError::UnsupportedQuery { .. } => "sql_unsupported",
            SqlError::InvalidQuery(_) => "sql_invalid_query",
            SqlError::InvalidOption(_) => "sql_invalid_option",
            SqlError::QueryLimit { .. } => "query_limit",
            SqlError::Canceled => "query_canceled",
            SqlError::UniqueViolation(_) => "sql_unique_violation",
            SqlError::SerializationFailure(_) => "sql_serialization_failure",
            SqlError::ActiveTransaction(_) => "sql_active_transaction",
            SqlError::Transaction(_) => "sql_transaction",
            SqlError::Engine(error) => error.code(),
        }
    }
}
