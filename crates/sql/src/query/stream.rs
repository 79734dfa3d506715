//! A query's answer handed on as it is made: its columns, then its rows a batch at a time,
//! through a bounded channel, so a client reading slowly holds the query back rather than
//! the server holding the answer. A SELECT without GROUP BY, DISTINCT, ORDER BY or a `*`
//! over undeclared fields streams its rows as it finds them and holds none; any other query
//! is answered whole (under `query_memory_max`) and then sent the same way.

use std::sync::Arc;

use onehop_engine::{Engine, Principal};
use serde_json::Value;
use sqlparser::ast;
use tokio::sync::mpsc;

use super::budget::{Cancel, QueryLimits};
use super::select::Context;
use crate::SqlError;

/// Rows per message: large enough that the hand-off is a small part of a row's cost, small
/// enough that what is in flight stays a few megabytes.
const BATCH_ROWS: usize = 1000;
/// Batches in flight between the query and its reader.
const BATCHES_IN_FLIGHT: usize = 4;

/// What a streamed query sends, in this order: its columns once, its rows in batches; an
/// error ends it wherever it comes.
#[derive(Debug)]
pub enum Streamed {
    Columns(Vec<String>),
    Rows(Vec<Vec<Value>>),
}

/// The sending end, which the outermost SELECT takes when it can hand rows on.
pub(crate) struct Streamer {
    sender: mpsc::Sender<Result<Streamed, SqlError>>,
    batch: Vec<Vec<Value>>,
    started: bool,
}

impl Streamer {
    fn send(&self, message: Streamed) -> Result<(), SqlError> {
        // The reader went away (the client disconnected): the query stops.
        self.sender.blocking_send(Ok(message)).map_err(|_| SqlError::Canceled)
    }

    pub(crate) fn columns(&mut self, columns: Vec<String>) -> Result<(), SqlError> {
        self.started = true;
        self.send(Streamed::Columns(columns))
    }

    pub(crate) fn row(&mut self, row: Vec<Value>) -> Result<(), SqlError> {
        self.batch.push(row);
        if self.batch.len() >= BATCH_ROWS {
            self.flush()?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> Result<(), SqlError> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_ROWS));
        self.send(Streamed::Rows(batch))
    }
}

/// Runs `query` for `principal` on a blocking thread under the engine's query limits,
/// handing its answer on as [`Streamed`] messages; the receiver ends after the last.
pub(crate) fn stream(
    engine: &Arc<Engine>,
    principal: &Principal,
    query: &ast::Query,
    cancel: Option<&Cancel>,
) -> mpsc::Receiver<Result<Streamed, SqlError>> {
    let (sender, receiver) = mpsc::channel(BATCHES_IN_FLIGHT);
    // A lookup by primary key reads a few rows: answered where it is, as `run_shared` does.
    if super::is_key_lookup(engine, query) {
        let limits = QueryLimits::of(engine.options());
        let sent = match super::run_through(engine, Some(principal), query, &limits, cancel, None) {
            Ok(answer) => sender
                .try_send(Ok(Streamed::Columns(answer.columns)))
                .and_then(|()| sender.try_send(Ok(Streamed::Rows(answer.rows)))),
            Err(error) => sender.try_send(Err(error)),
        };
        debug_assert!(sent.is_ok(), "the channel holds the two messages");
        return receiver;
    }
    let (engine, principal, query, cancel) = (engine.clone(), principal.clone(), query.clone(), cancel.cloned());
    tokio::task::spawn_blocking(move || {
        let limits = QueryLimits::of(engine.options());
        let mut context = Context::new(&engine, Some(&principal), &limits);
        context.cancel_with(cancel);
        context.stream =
            Some(Streamer { sender: sender.clone(), batch: Vec::with_capacity(BATCH_ROWS), started: false });
        // Only the outermost SELECT hands its rows on, and only when no ORDER BY follows it.
        if let (ast::SetExpr::Select(select), None) = (&*query.body, &query.order_by) {
            context.streamed_select = Some(std::ptr::from_ref(&**select) as usize);
        }
        let answer = context.query(&query);
        let streamer = context.stream.take();
        let sent = match (answer, streamer) {
            (Err(error), _) => Err(error),
            (Ok(_), Some(streamer)) if streamer.started => Ok(()),
            (Ok(answer), Some(mut streamer)) => streamer.columns(answer.columns).and_then(|()| {
                for row in answer.rows {
                    streamer.row(row)?;
                }
                streamer.flush()
            }),
            (Ok(_), None) => Err(SqlError::InvalidQuery("the query lost its stream".into())),
        };
        if let Err(error) = sent {
            let _ = sender.blocking_send(Err(error));
        }
    });
    receiver
}
