//! Opening a subscription, once for every protocol: what it follows (a stream, a table, one
//! row, a view or one view key), its filter and where it starts, answered with the rows a
//! snapshot asks for and a cursor that follows from exactly there.
//!
//! The cursor carries on from the log when its subscriber falls behind the live feed
//! ([`Cursor::carry_on`]): a burst costs a slow subscriber time, not messages, and the server
//! holds no more for it than its bounded queue; every protocol's subscriber behaves so, counted
//! under one name (`hub_subscribers_carried_on_from_log_total`).
//!
//! A subscription opens once its principal may read what it follows: a grant on the object,
//! or, for a stream, a topic grant covering the subscription's subject filter
//! ([`crate::Access::authorize_subscription`]). It is checked again at every change to access
//! and when the principal's token expires, and ends with the refusal once it no longer holds
//! ([`crate::hub::Authorization`]): every protocol's subscriber ends so, in its own words.

use std::sync::Arc;

use serde_json::Value;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::Cursor;
use crate::stream::{Position, Stream};
use crate::table::Row;

/// What a subscription follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A stream's records (created on first use when `auto_create` is on: subscribers may
    /// come before publishers).
    Stream(String),
    /// A table's rows entering, changing in and leaving what the filter selects.
    Table(String),
    /// One row of a table.
    Row { table: String, id: String },
    /// A view's changes, of every key or of one.
    View { view: String, key: Option<String> },
}

impl Target {
    /// The object a subscription to this reads, as access names it.
    pub fn object(&self) -> (crate::ObjectKind, &str) {
        match self {
            Target::Stream(name) => (crate::ObjectKind::Stream, name),
            Target::Table(name) | Target::Row { table: name, .. } => (crate::ObjectKind::Table, name),
            Target::View { view, .. } => (crate::ObjectKind::View, view),
        }
    }
}

/// Where a subscription starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    /// The next offset to deliver, per partition (a resume id, a stored session's positions).
    Positions(Vec<u64>),
    /// The same position in every partition.
    At(Position),
    /// A table's or view's rows as they are now, then every change after them, with nothing
    /// missed or repeated between the two.
    Snapshot,
}

/// The rows a [`Start::Snapshot`] subscription begins with.
#[derive(Debug)]
pub enum Snapshot {
    /// A table's rows that the filter selects.
    Rows(Vec<Row>),
    /// A view's rows that the filter selects, per key (its open windows newest first, then
    /// its closed ones, flagged `final`).
    ViewRows(Vec<(String, Vec<Value>)>),
}

/// An open subscription.
pub struct Opened {
    /// The stream the cursor follows: the target stream, a table's storage or a view's
    /// change stream.
    pub stream: Arc<Stream>,
    pub snapshot: Option<Snapshot>,
    pub cursor: Cursor,
}

impl Engine {
    /// The stream a subscription to `target` follows: the stream itself (created on first use
    /// when `auto_create` is on), a table's storage, or a view's change stream. What a front
    /// end reads positions against before it opens the subscription.
    pub async fn followed_stream(&self, target: &Target) -> Result<Arc<Stream>, EngineError> {
        Ok(match target {
            Target::Stream(name) => self.stream_or_create(name).await?,
            Target::Table(name) | Target::Row { table: name, .. } => self.table(name)?.storage().clone(),
            Target::View { view, .. } => {
                let view = self.view(view)?;
                view.serving()?;
                view.output().clone()
            }
        })
    }

    /// Opens a subscription to `target` for `principal`, once it may read it (see the module's
    /// documentation). The filter's key is set from a row or view key target.
    pub async fn open_subscription(
        &self,
        principal: &crate::Principal,
        target: &Target,
        mut filter: Filter,
        start: Start,
    ) -> Result<Opened, EngineError> {
        let (kind, name) = target.object();
        let subject = filter.subject.as_ref().map(|subject| subject.as_str().to_string());
        self.access().authorize_subscription(principal, kind, name, subject.as_deref())?;
        if let Target::Row { id: key, .. } | Target::View { key: Some(key), .. } = target {
            filter.key = Some(bytes::Bytes::from(key.clone()));
        }
        let (stream, snapshot, positions) = match target {
            Target::Stream(name) => {
                let stream = self.stream_or_create(name).await?;
                let positions = positions(&stream, start, "a stream has no snapshot: replay it from earliest")?;
                (stream, None, positions)
            }
            Target::Table(name) | Target::Row { table: name, .. } => {
                let table = self.table(name)?;
                let storage = table.storage().clone();
                match start {
                    Start::Snapshot => {
                        let (rows, next) = table.snapshot(&filter);
                        (storage, Some(Snapshot::Rows(rows)), vec![next])
                    }
                    start => {
                        let positions = positions(&storage, start, "")?;
                        (storage, None, positions)
                    }
                }
            }
            Target::View { view, key } => {
                let handle = self.view(view)?;
                // A joined view stopped at its state cap follows nothing: said now, not never.
                handle.serving()?;
                let output = handle.output().clone();
                match start {
                    Start::Snapshot => {
                        // Rows first, then the end: a change written in between comes twice,
                        // never not at all.
                        let (keys, next) = match key {
                            Some(key) => {
                                let rows = handle.rows(key);
                                (vec![(key.clone(), rows)], output.end_offset(0)?)
                            }
                            None => handle.snapshot(),
                        };
                        let selected = select_view_rows(view, keys, &filter);
                        (output, Some(Snapshot::ViewRows(selected)), vec![next])
                    }
                    start => {
                        let positions = positions(&output, start, "")?;
                        (output, None, positions)
                    }
                }
            }
        };
        let authorization =
            crate::hub::Authorization::new(self.shared_access(), principal.clone(), kind, name, subject.as_deref());
        let cursor = Cursor::new(self.hub().clone(), stream.clone(), Arc::new(filter), positions)?
            .carry_on()
            .authorized(authorization);
        Ok(Opened { stream, snapshot, cursor })
    }
}

/// Where `start` begins in each partition of `stream`.
fn positions(stream: &Stream, start: Start, no_snapshot: &str) -> Result<Vec<u64>, EngineError> {
    match start {
        Start::Positions(positions) => Ok(positions),
        Start::At(position) => {
            (0..stream.partition_count()).map(|partition| stream.resolve(partition, position)).collect()
        }
        Start::Snapshot => Err(EngineError::InvalidFilter(no_snapshot.to_string())),
    }
}

/// The view rows `filter` selects: a row counts as the change record it would come as, its key
/// the view key and its subject `views/{view}/{key}`.
fn select_view_rows(view: &str, keys: Vec<(String, Vec<Value>)>, filter: &Filter) -> Vec<(String, Vec<Value>)> {
    keys.into_iter()
        .filter_map(|(key, rows)| {
            let subject = format!("views/{view}/{key}");
            let rows: Vec<Value> = rows
                .into_iter()
                .filter(|row| filter.matches(Some(key.as_bytes()), Some(&subject), Some(row)))
                .collect();
            (!rows.is_empty()).then_some((key, rows))
        })
        .collect()
}
