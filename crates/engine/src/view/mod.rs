//! Live views: windowed and running aggregates over a stream, kept in memory, served by key,
//! pushed to subscribers, and rebuilt after a crash from a checkpoint and the source log.
//!
//! - `expr`: the expression language of view and transform definitions (our own AST, stored
//!   in the catalog as JSON) and its evaluation against one record.
//! - `state`: a view's windows and aggregates, and how events and time change them (pure).
//! - `runtime`: a running view (its task, change stream, reads).
//! - `checkpoint`: a view's checkpoint records (incremental) and its restore.
//! - `transform`: stateless transforms (`CREATE STREAM … AS SELECT`) and their task.
//! - `catchup`: progress of a view or transform replaying its source.
//! - `join`: joined views (`… FROM a JOIN b ON …`), kept delta-style over tables and views.
//! - this module: what a view is (`ViewDef`), as the SQL front end produces it.

mod catchup;
mod changes;
pub mod checkpoint;
pub mod expr;
pub mod join;
pub mod runtime;
pub mod state;
pub mod transform;

use serde::{Deserialize, Serialize};

/// What stops a view's or a transform's task: raised once, and seen by the task however late
/// it first runs. (A watch receiver made after the send takes the raised value as already
/// seen: a view or transform dropped before its task first ran would wait for it forever.)
#[derive(Debug)]
pub(crate) struct Stop(tokio::sync::watch::Sender<bool>);

impl Default for Stop {
    fn default() -> Self {
        Stop(tokio::sync::watch::channel(false).0)
    }
}

impl Stop {
    pub(crate) fn raise(&self) {
        self.0.send_replace(true);
    }

    /// A receiver whose `changed()` is ready once the stop is raised, before or after this.
    pub(crate) fn receiver(&self) -> tokio::sync::watch::Receiver<bool> {
        let mut receiver = self.0.subscribe();
        if *receiver.borrow() {
            receiver.mark_changed();
        }
        receiver
    }
}

pub use expr::{Expr, Input};
pub use join::state::OutputRow;
pub use join::{JoinColumn, JoinDef, JoinInput, JoinKind, JoinOn};
pub use runtime::{View, ViewStatus};
pub use transform::{Transform, TransformBranch, TransformDef, TransformStatus};

/// How events are grouped in time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Window {
    /// No window: running totals since the view started.
    None,
    /// `TUMBLE(src, size)`: fixed, non-overlapping windows aligned to the epoch.
    Tumble { size_ms: u64 },
    /// `HOP(src, slide, size)`: windows of `size`, one starting every `slide` (an event is in
    /// `size / slide` of them).
    Hop { slide_ms: u64, size_ms: u64 },
    /// `SLIDING(src, size)`: per key, the `size` before its latest event (one window per key,
    /// moving with each event; events older than that fall out).
    Sliding { size_ms: u64 },
    /// `SESSION(src, gap)`: per key, events closer than `gap` together; merges sessions an
    /// event bridges.
    Session { gap_ms: u64 },
}

/// An aggregate function of a view column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AggregateKind {
    /// `COUNT(*)` (no argument) or `COUNT(x)` (non-null values of x).
    Count,
    /// `COUNT(DISTINCT x)`.
    CountDistinct,
    Sum,
    Avg,
    Min,
    Max,
    /// The value at the earliest event time (ties: earliest in the log).
    First,
    /// The value at the latest event time (ties: latest in the log).
    Last,
    /// `JSON_AGG(x [ORDER BY …])`: every value (nulls too) as a JSON array.
    JsonAgg,
    /// `ARRAY_AGG(x [ORDER BY …])`: the same, as SQL names it for arrays.
    ArrayAgg,
}

impl AggregateKind {
    /// Whether it keeps every value (JSON_AGG, ARRAY_AGG), and so takes an ORDER BY.
    pub fn collects(self) -> bool {
        matches!(self, AggregateKind::JsonAgg | AggregateKind::ArrayAgg)
    }
}

/// One key of an aggregate's own ORDER BY (`JSON_AGG(x ORDER BY at DESC)`). Nulls come last
/// ascending and first descending, as in Postgres.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OrderKey {
    pub expr: Expr,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub descending: bool,
}

/// One output column of a view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Column {
    /// The group key (the GROUP BY expression), under this name.
    Key { name: String },
    /// An aggregate; `arg` is `None` only for `COUNT(*)`. `order_by` orders what JSON_AGG and
    /// ARRAY_AGG collect (ties, and no ORDER BY: by the values' JSON text).
    Aggregate {
        name: String,
        function: AggregateKind,
        arg: Option<Expr>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        order_by: Vec<OrderKey>,
    },
}

impl Column {
    /// What an aggregate column folds from one input: its argument, and for one that collects
    /// (JSON_AGG, ARRAY_AGG) `[value, sort keys…]`. `None` for the key and `COUNT(*)`.
    pub fn argument(&self, input: &Input) -> Option<serde_json::Value> {
        match self {
            Column::Key { .. } => None,
            Column::Aggregate { function, arg, order_by, .. } if function.collects() => {
                let value = arg.as_ref().map_or(serde_json::Value::Null, |arg| arg.eval(input));
                let keys = order_by.iter().map(|key| key.expr.eval(input));
                Some(serde_json::Value::Array(std::iter::once(value).chain(keys).collect()))
            }
            Column::Aggregate { arg, .. } => arg.as_ref().map(|arg| arg.eval(input)),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Column::Key { name } | Column::Aggregate { name, .. } => name,
        }
    }
}

/// Where a new view starts reading its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// From the oldest record the source still has (backfill).
    Earliest,
    /// From what is published after the view is created.
    Latest,
}

/// A view, as `CREATE VIEW … AS SELECT …` defines it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ViewDef {
    pub name: String,
    /// The stream (or table) aggregated.
    pub source: String,
    pub window: Window,
    /// Event time in ms since the epoch; `None`: the record's timestamp. A value that is not a
    /// number (or an RFC 3339 text) makes the event count as late-and-invalid (dropped, counted).
    pub event_time: Option<Expr>,
    /// WHERE: events for which this is not `true` are skipped.
    pub filter: Option<Expr>,
    /// GROUP BY: the key of each event (its value as text; null groups under `null`).
    pub key: Expr,
    /// SELECT list, in order (a `Key` column at most once).
    pub columns: Vec<Column>,
    /// How long after a window's end late events are still counted (ms).
    pub grace_ms: u64,
    /// Push every change of a window's aggregate.
    pub emit_changes: bool,
    /// Push a window's aggregate once more, flagged final, when it closes.
    pub emit_final: bool,
    /// How long closed windows stay readable (ms).
    pub retention_ms: u64,
    pub start: Start,
    /// Late events go to this stream (as they were) instead of only being counted.
    pub late_stream: Option<String>,
    /// The statement as the user wrote it, for DESCRIBE.
    pub sql: String,
    /// A joined view: its inputs, WHERE and SELECT list. `source` is then its first input's.
    /// Without `columns` (no GROUP BY) the view's rows are the join's, and the aggregate fields
    /// above (window, key, columns, filter) are unused. With them the view aggregates the
    /// join's rows as a view over a table aggregates its rows: `key` and the columns read the
    /// join's columns (names the SQL front end gives them), and `filter` is unused (the join's
    /// WHERE is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<Box<JoinDef>>,
}

impl ViewDef {
    /// Every table and view the view reads (one, unless it joins).
    pub fn sources(&self) -> Vec<&str> {
        match &self.join {
            Some(join) => join.sources().collect(),
            None => vec![self.source.as_str()],
        }
    }

    /// The join whose rows are this view's rows: a joined view without GROUP BY.
    pub fn row_join(&self) -> Option<&JoinDef> {
        self.join.as_deref().filter(|_| self.columns.is_empty())
    }

    /// Whether the view aggregates joined inputs (`… FROM a JOIN b ON … GROUP BY …`).
    pub fn aggregates_join(&self) -> bool {
        self.join.is_some() && !self.columns.is_empty()
    }

    /// The column a row of the view is found by: the GROUP BY key's (`None` when it is not
    /// selected), or a joined view's driving input's id.
    pub fn key_column(&self) -> Option<&str> {
        if let Some(join) = self.row_join() {
            return join.inputs.first().map(|input| input.id_field.as_str());
        }
        self.columns.iter().find_map(|column| match column {
            Column::Key { name } => Some(name.as_str()),
            Column::Aggregate { .. } => None,
        })
    }

    /// The names of the columns of the view's rows, in order.
    pub fn column_names(&self) -> Vec<String> {
        match self.row_join() {
            Some(join) => join.column_names(),
            None => {
                let mut names: Vec<String> = self.columns.iter().map(|column| column.name().to_string()).collect();
                if self.window != Window::None {
                    names.extend(["window_start".to_string(), "window_end".to_string()]);
                }
                names
            }
        }
    }
}

/// Defaults of the options of `CREATE VIEW … WITH (…)`.
pub const DEFAULT_GRACE_MS: u64 = 0;
pub const DEFAULT_RETENTION_MS: u64 = 3_600_000;
