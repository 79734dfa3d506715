//! The limits a query runs under: the memory it may hold (rows kept for a join, a group, a sort
//! or the answer), the time it may take, and the stream records it may read. Each is a setting
//! (docs/configuration.md); exceeding one ends the query with an error naming it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use onehop_engine::EngineOptions;
use serde_json::Value;

use crate::SqlError;

/// The limits of one query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueryLimits {
    /// Bytes of rows a query may hold at once (estimated as JSON).
    pub memory_bytes_max: u64,
    pub time_max: Duration,
    /// Records a query may read from the streams it selects from, in all.
    pub stream_records_max: u64,
}

impl Default for QueryLimits {
    fn default() -> QueryLimits {
        QueryLimits::of(&EngineOptions::default())
    }
}

impl QueryLimits {
    pub fn of(options: &EngineOptions) -> QueryLimits {
        QueryLimits {
            memory_bytes_max: options.query_memory_bytes_max,
            time_max: options.query_time_max,
            stream_records_max: options.query_stream_records_max,
        }
    }
}

/// A way to end a running query from elsewhere (a Postgres cancel request): the query stops
/// at its next look at the clock with [`SqlError::Canceled`].
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Clears a cancel that came after its query had ended.
    pub fn reset(&self) {
        self.0.store(false, Ordering::Relaxed);
    }

    pub fn is_canceled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What one query has used of its limits.
pub(super) struct Budget {
    limits: QueryLimits,
    pub(super) cancel: Option<Cancel>,
    deadline: Instant,
    held_bytes: u64,
    stream_records: u64,
    ticks: u32,
}

/// How many rows pass between two looks at the clock.
const TICKS_PER_CLOCK: u32 = 256;

impl Budget {
    pub(super) fn new(limits: &QueryLimits) -> Budget {
        Budget {
            limits: limits.clone(),
            cancel: None,
            deadline: Instant::now() + limits.time_max,
            held_bytes: 0,
            stream_records: 0,
            ticks: 0,
        }
    }

    /// One more row worked on: ends the query when its time is up.
    pub(super) fn tick(&mut self) -> Result<(), SqlError> {
        self.ticks += 1;
        if !self.ticks.is_multiple_of(TICKS_PER_CLOCK) {
            return Ok(());
        }
        if self.cancel.as_ref().is_some_and(Cancel::is_canceled) {
            return Err(SqlError::Canceled);
        }
        if Instant::now() >= self.deadline {
            return Err(SqlError::QueryLimit {
                limit: "time",
                message: format!(
                    "the query ran longer than {:?} (query_time_max): narrow it with WHERE or LIMIT, or raise \
                     the setting",
                    self.limits.time_max
                ),
            });
        }
        Ok(())
    }

    /// `value` is kept until the query ends: ends the query when that passes its memory.
    pub(super) fn hold(&mut self, value: &Value) -> Result<(), SqlError> {
        self.hold_bytes(estimate(value))
    }

    pub(super) fn hold_bytes(&mut self, bytes: u64) -> Result<(), SqlError> {
        self.held_bytes += bytes;
        if self.held_bytes > self.limits.memory_bytes_max {
            return Err(SqlError::QueryLimit {
                limit: "memory",
                message: format!(
                    "the query holds more than {} bytes of rows (query_memory_max): select fewer rows or \
                     columns, add LIMIT, or raise the setting",
                    self.limits.memory_bytes_max
                ),
            });
        }
        Ok(())
    }

    /// `count` more records read from `stream`.
    pub(super) fn read_records(&mut self, stream: &str, count: u64) -> Result<(), SqlError> {
        self.stream_records += count;
        if self.stream_records > self.limits.stream_records_max {
            return Err(SqlError::QueryLimit {
                limit: "stream_records",
                message: format!(
                    "the query reads more than {} stream records (query_stream_records_max) from {stream}: \
                     start it later with WHERE _offset >= N or _time >= '…', pick a _partition, or raise the \
                     setting",
                    self.limits.stream_records_max
                ),
            });
        }
        Ok(())
    }
}

/// About how many bytes `value` takes in memory.
pub(super) fn estimate(value: &Value) -> u64 {
    const NODE: u64 = 32;
    match value {
        Value::String(text) => NODE + text.len() as u64,
        Value::Array(items) => NODE + items.iter().map(estimate).sum::<u64>(),
        Value::Object(fields) => {
            NODE + fields.iter().map(|(name, value)| name.len() as u64 + estimate(value)).sum::<u64>()
        }
        _ => NODE,
    }
}
