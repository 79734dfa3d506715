//! Where a message published to a subject goes: one rule for every protocol that publishes by
//! subject (MQTT topics today; others as they come), kept here rather than in each front end.
//!
//! A subject goes to the stream whose declared `mqtt_topic` filter matches it, else to the
//! stream its first level names (created on first use when `auto_create` is on; an empty first
//! level, `/devices/1`, names `EngineOptions::empty_first_level_stream`). Within the stream it
//! goes to the partition its subject hashes to ([`Stream::partition_for_subject`]), so one
//! subject's messages stay in order. Refused: a subject that is not one (wildcards, empty
//! levels where they cannot be, over the length limit), the `$` subjects (the server's), a
//! view's (`views/{v}/…`: views are written by the engine only), and a table's first level
//! (a table is written row by row, as `{table}/{id}`).

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::stream::Stream;
use crate::subject::validate_subject;
use crate::{NewRecord, QueuedAppend};

/// Where a subject's messages go.
#[derive(Clone)]
pub struct Route {
    pub stream: Arc<Stream>,
    pub partition: u32,
}

impl Route {
    /// Checks `records` against the limits of the route's partition, writing nothing: what an
    /// append there would refuse, this refuses with the same error.
    pub fn check(&self, records: &[NewRecord]) -> Result<(), EngineError> {
        self.stream.check(self.partition, records)
    }

    /// Queues `records` on the route's partition, behind every append queued before (so one
    /// connection's messages keep their order); the future resolves once they are durable at
    /// `durability` (the stream's default when `None`).
    pub async fn enqueue(
        &self,
        records: &[NewRecord],
        durability: Option<crate::Durability>,
    ) -> Result<QueuedAppend, EngineError> {
        self.stream.enqueue_to(self.partition, records, durability).await
    }
}

/// Why a subject takes no message.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// Not a subject one can publish to.
    #[error("topic {subject:?}: {reason}")]
    InvalidSubject { subject: String, reason: String },
    /// A `$` subject: the server's own.
    #[error("topic {0:?}: topics starting with $ are reserved")]
    Reserved(String),
    /// A view's subject: views are written by the engine only.
    #[error("{0:?} is a view's topic: views are read-only")]
    ReadOnlyView(String),
    /// A table's first level: a table is written a row at a time.
    #[error("{table:?} is a table: write a row with a retained message to {table}/{{id}}")]
    Table { table: String },
    /// The stream the subject names does not exist and may not be created, or cannot be.
    #[error(transparent)]
    Stream(EngineError),
}

impl Engine {
    /// The stream and partition a message published to `subject` goes to (see the module's
    /// documentation), creating the stream when allowed.
    pub async fn route(&self, subject: &str) -> Result<Route, RouteError> {
        if let Err(error) = validate_subject(subject) {
            return Err(RouteError::InvalidSubject { subject: subject.to_string(), reason: error.to_string() });
        }
        if subject.starts_with('$') {
            return Err(RouteError::Reserved(subject.to_string()));
        }
        if let Some(view) = subject.strip_prefix("views/").and_then(|rest| rest.split('/').next())
            && self.view(view).is_ok()
        {
            return Err(RouteError::ReadOnlyView(subject.to_string()));
        }
        let first = subject.split('/').next().unwrap_or_default();
        if self.has_table(first) {
            return Err(RouteError::Table { table: first.to_string() });
        }
        let stream = match self.stream_for_mqtt_topic(subject) {
            Some(stream) => stream,
            // A subject has no wildcard (checked above), so its first level is a name or empty.
            None => self.stream_or_create(self.stream_named_by(first)).await.map_err(RouteError::Stream)?,
        };
        let partition = stream.partition_for_subject(subject);
        Ok(Route { stream, partition })
    }

    /// The name of the stream a subject's first level names: the level itself, or for an
    /// empty one (`/devices/1`, common on devices) `EngineOptions::empty_first_level_stream`.
    pub fn stream_named_by<'a>(&'a self, first: &'a str) -> &'a str {
        if first.is_empty() { &self.options().empty_first_level_stream } else { first }
    }
}
