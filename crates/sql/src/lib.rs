//! onehop's SQL front end: statements in, engine definitions and answers out.
//!
//! # Layout
//!
//! - `parse`: text to [`Statement`]s with sqlparser; `CREATE STREAM`, `DROP STREAM` and
//!   `SHOW TABLES`, which sqlparser does not know or parses otherwise, are parsed here from the
//!   same token stream. Anything unsupported is refused with the
//!   list of what is supported.
//! - `execute`: a [`Statement`] run on the engine, to an [`Output`].

mod execute;
mod parse;

pub use execute::{Output, execute};
pub use parse::{Statement, StreamOptions, parse};

/// Why a statement could not be parsed or run.
#[derive(Debug, thiserror::Error)]
pub enum SqlError {
    #[error("syntax error: {0}")]
    Syntax(String),
    #[error("{statement} is not supported; supported statements: {SUPPORTED}")]
    Unsupported { statement: String },
    #[error("{0}")]
    InvalidOption(String),
    #[error(transparent)]
    Engine(#[from] onehop_engine::EngineError),
}

/// What `SqlError::Unsupported` lists.
pub const SUPPORTED: &str = "CREATE STREAM [IF NOT EXISTS] name [WITH (partitions = N, retention = '7d', retention_bytes = '1GiB', \
     durability = 'fsync'|'async')]; CREATE TABLE [IF NOT EXISTS] name (id TEXT PRIMARY KEY, col TYPE [NOT NULL], …) \
     [WITH (durability = …)]; CREATE INDEX [name] ON table (field); DROP STREAM|TABLE|INDEX [IF EXISTS] name; \
     SHOW STREAMS; SHOW TABLES; DESCRIBE name";

impl SqlError {
    /// A stable code for clients.
    pub fn code(&self) -> &'static str {
        match self {
            SqlError::Syntax(_) => "sql_syntax",
            SqlError::Unsupported { .. } => "sql_unsupported",
            SqlError::InvalidOption(_) => "sql_invalid_option",
            SqlError::Engine(error) => error.code(),
        }
    }
}
