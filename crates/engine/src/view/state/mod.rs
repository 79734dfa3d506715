//! A view's state: per key, its windows and their aggregates. Pure and deterministic — events
//! in, changes out — so the runtime can rebuild it by replaying the source from a checkpoint
//! and get exactly what it had.
//!
//! Time. Each event has an event time `t` (the record timestamp or the view's time column)
//! and an arrival time `r` (the record's log timestamp, stamped by the server when it took the
//! record). A window closes at `end + grace`: an event arriving after that (`r > end + grace`)
//! is late for it, and a window whose close time the clock has passed is closed even if its key
//! never sees another event. Because lateness depends on the data alone, a replay after a crash
//! decides exactly as the live run did.
//!
//! - `acc`: an aggregate's running value (COUNT, SUM, MIN, FIRST, …) and how events change it.
//! - `apply`: events in: one event (or one table row change) into its key's windows.
//! - `advance`: time passing: windows closing, sliding windows moving on, retention ending.
//! - `rows`: how a key's windows read as rows, for changes and for reads.
//! - `unsaved`: what changed since the last checkpoint, and a state restored from checkpoints.
//! - this module: the state itself (keys, windows, deadlines, counters) and a change.

mod acc;
mod advance;
mod apply;
mod rows;
mod unsaved;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use acc::Acc;
use unsaved::Unsaved;

pub use unsaved::{ClosedChange, Delta, SavedKey};

/// One change of a view row, as subscribers get it.
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub key: String,
    /// The row: key column, `window_start` / `window_end` (windowed views), the aggregates.
    /// A window's final shares it with the closed window kept for reads.
    pub row: Arc<Value>,
    /// The window closed: this is its last value.
    pub is_final: bool,
    /// The row is gone (a session merged into another, a sliding window emptied).
    pub removed: bool,
    /// The row as it was before this change; `None` for a row that is new, a removal (its
    /// `row` is what was there) and a window's final (its last change's row is its own).
    pub before: Option<Arc<Value>>,
}

/// One window of one key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct WindowState {
    start: i64,
    end: i64,
    accs: Vec<Acc>,
}

/// A closed window, kept readable for the view's retention. Never changes once closed: a
/// checkpoint writes it once (see [`Unsaved`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Closed {
    start: i64,
    end: i64,
    row: Arc<Value>,
}

/// An event kept by a sliding window: its time, log position and aggregate arguments.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Kept {
    at: (i64, u32, u64),
    args: Vec<Option<Value>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KeyState {
    /// The GROUP BY value as the first event of the key had it (the key column shows it).
    key_value: Value,
    /// Open windows by start (one for no window; sessions by their start).
    open: Vec<WindowState>,
    /// Closed windows, oldest first; shared with a checkpoint being written.
    #[serde(default)]
    closed: VecDeque<Arc<Closed>>,
    /// A sliding window's events, by time.
    kept: Vec<Kept>,
    /// A sliding window's current end (its latest event time, or when it was last evicted).
    sliding_end: i64,
    /// A view over a table: the rows in this group (the key goes when the last one leaves).
    #[serde(default)]
    rows: u64,
}

/// What a view holds: every key's windows, and the times at which windows close.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ViewState {
    /// Each key's state behind its own `Arc`: a clone of the whole state (a checkpoint) copies
    /// pointers, and a key changed while a checkpoint still holds it is copied then
    /// (`Arc::make_mut`), one key at a time.
    keys: HashMap<String, Arc<KeyState>>,
    /// (close time, key, window start) of every open window that closes.
    deadlines: BTreeSet<(i64, String, i64)>,
    /// Events dropped because every window they belong to had closed.
    pub late_events: u64,
    /// Events dropped because their event time was not a time.
    pub invalid_events: u64,
    /// Events that counted.
    pub events: u64,
    /// No closed window is due to be forgotten before this (a lower bound; unknown after a
    /// restore): spares `advance` a pass over every key for every event.
    #[serde(skip)]
    next_expiry: LowerBound,
    /// No sliding window holds an event older than this (a lower bound, likewise).
    #[serde(skip)]
    next_eviction: LowerBound,
    /// What changed since the last checkpoint, when the view checkpoints.
    #[serde(skip)]
    unsaved: Unsaved,
}

/// A time nothing is due before, when known: a cache, not part of the state (two states equal
/// whatever their caches say).
#[derive(Clone, Copy, Debug, Default)]
struct LowerBound(Option<i64>);

impl LowerBound {
    /// Whether something may be due at `now`: the bound is unknown or passed.
    fn due(self, now: i64) -> bool {
        self.0.is_none_or(|at| at <= now)
    }

    /// Something new is due at `at`.
    fn lower(&mut self, at: i64) {
        if let Some(bound) = &mut self.0 {
            *bound = (*bound).min(at);
        }
    }
}

impl PartialEq for LowerBound {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Whether an event is dropped as late, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Counted in at least one window.
    Counted,
    /// Skipped by the WHERE clause.
    Filtered,
    /// Too late for every window it belongs to.
    Late,
    /// Its event time is not a time.
    Invalid,
}
