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

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::expr::{Input, as_time_ms, is_true, key_text};
use super::{AggregateKind, Column, ViewDef, Window};

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
}

/// An aggregate's running value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "acc", rename_all = "snake_case")]
enum Acc {
    Count {
        n: u64,
    },
    Distinct {
        values: HashMap<String, u64>,
    },
    /// Integers add exactly; a float, or an integer sum leaving i64, makes the sum a float.
    Sum {
        int: i64,
        float: f64,
        floats: u64,
        n: u64,
    },
    Avg {
        sum: f64,
        n: u64,
    },
    Min {
        best: Option<Value>,
    },
    Max {
        best: Option<Value>,
    },
    /// The value at the earliest (First) or latest (Last) event time; ties by log position.
    First {
        at: Option<(i64, u32, u64)>,
        value: Value,
    },
    Last {
        at: Option<(i64, u32, u64)>,
        value: Value,
    },
    /// MIN or MAX of values that can also leave (a view over a table): every value with its
    /// count, by [`rank`]: numbers before texts, each in their order.
    Ranked {
        values: BTreeMap<String, (Value, u64)>,
        max: bool,
    },
}

/// A key that sorts numbers (by value) before texts (by text); `None` for other values.
fn rank(value: &Value) -> Option<String> {
    match value {
        Value::Number(number) => {
            let bits = number.as_f64()?.to_bits();
            // Flip so that the unsigned order of the bits is the order of the numbers.
            let sortable = if bits >> 63 == 1 { !bits } else { bits | (1 << 63) };
            Some(format!("n{sortable:016x}"))
        }
        Value::String(text) => Some(format!("t{text}")),
        _ => None,
    }
}

/// Numbers compare as numbers, text as text; anything else has no order.
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (Value::String(x), Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

/// Replaces `best` with `arg` when it orders `want` against it (or there is none yet).
fn keep_if(best: &mut Option<Value>, arg: Option<&Value>, want: std::cmp::Ordering) {
    let Some(value) = arg.filter(|value| value.is_number() || value.is_string()) else { return };
    if best.as_ref().is_none_or(|current| compare(value, current) == Some(want)) {
        *best = Some(value.clone());
    }
}

impl Acc {
    fn new(function: AggregateKind) -> Acc {
        match function {
            AggregateKind::Count => Acc::Count { n: 0 },
            AggregateKind::CountDistinct => Acc::Distinct { values: HashMap::new() },
            AggregateKind::Sum => Acc::Sum { int: 0, float: 0.0, floats: 0, n: 0 },
            AggregateKind::Avg => Acc::Avg { sum: 0.0, n: 0 },
            AggregateKind::Min => Acc::Min { best: None },
            AggregateKind::Max => Acc::Max { best: None },
            AggregateKind::First => Acc::First { at: None, value: Value::Null },
            AggregateKind::Last => Acc::Last { at: None, value: Value::Null },
        }
    }

    /// An accumulator rows can leave as well as join (views over tables).
    fn retractable(function: AggregateKind) -> Acc {
        match function {
            AggregateKind::Min => Acc::Ranked { values: BTreeMap::new(), max: false },
            AggregateKind::Max => Acc::Ranked { values: BTreeMap::new(), max: true },
            other => Acc::new(other),
        }
    }

    /// Takes back what `add(arg)` added (a row left or changed). FIRST and LAST cannot be taken
    /// back (views over tables refuse them).
    fn remove(&mut self, arg: Option<&Value>) {
        match self {
            Acc::Count { n } => {
                if arg.is_none_or(|value| !value.is_null()) {
                    *n = n.saturating_sub(1);
                }
            }
            Acc::Distinct { values } => {
                if let Some(value) = arg.filter(|value| !value.is_null()) {
                    let text = key_text(value);
                    if let Some(count) = values.get_mut(&text) {
                        *count -= 1;
                        if *count == 0 {
                            values.remove(&text);
                        }
                    }
                }
            }
            Acc::Sum { int, float, floats, n } => match arg.and_then(Value::as_number) {
                Some(number) if let Some(difference) = number.as_i64().and_then(|value| int.checked_sub(value)) => {
                    *int = difference;
                    *n = n.saturating_sub(1);
                }
                Some(number) => {
                    *float -= number.as_f64().unwrap_or(0.0);
                    *floats = floats.saturating_sub(1);
                    *n = n.saturating_sub(1);
                    if *floats == 0 {
                        // No float left in the sum: drop the rounding error with it.
                        *float = 0.0;
                    }
                }
                None => {}
            },
            Acc::Avg { sum, n } => {
                if let Some(value) = arg.and_then(Value::as_f64) {
                    *n = n.saturating_sub(1);
                    *sum = if *n == 0 { 0.0 } else { *sum - value };
                }
            }
            Acc::Ranked { values, .. } => {
                if let Some(rank) = arg.and_then(rank)
                    && let Some((_, count)) = values.get_mut(&rank)
                {
                    *count -= 1;
                    if *count == 0 {
                        values.remove(&rank);
                    }
                }
            }
            Acc::Min { .. } | Acc::Max { .. } | Acc::First { .. } | Acc::Last { .. } => {}
        }
    }

    /// Adds one event's argument (`None` for `COUNT(*)`), at `at` = (event time, partition,
    /// offset).
    fn add(&mut self, arg: Option<&Value>, at: (i64, u32, u64)) {
        match self {
            Acc::Count { n } => {
                if arg.is_none_or(|value| !value.is_null()) {
                    *n += 1;
                }
            }
            Acc::Distinct { values } => {
                if let Some(value) = arg.filter(|value| !value.is_null()) {
                    *values.entry(key_text(value)).or_default() += 1;
                }
            }
            Acc::Sum { int, float, floats, n } => match arg.and_then(Value::as_number) {
                Some(number) if let Some(sum) = number.as_i64().and_then(|value| int.checked_add(value)) => {
                    *int = sum;
                    *n += 1;
                }
                Some(number) => {
                    *float += number.as_f64().unwrap_or(0.0);
                    *floats += 1;
                    *n += 1;
                }
                None => {}
            },
            Acc::Avg { sum, n } => {
                if let Some(value) = arg.and_then(Value::as_f64) {
                    *sum += value;
                    *n += 1;
                }
            }
            // A value of another kind than the best so far (text among numbers) is ignored: it
            // cannot be ordered against it.
            Acc::Min { best } => keep_if(best, arg, std::cmp::Ordering::Less),
            Acc::Max { best } => keep_if(best, arg, std::cmp::Ordering::Greater),
            Acc::First { at: best_at, value } => {
                if best_at.is_none_or(|best| at < best) {
                    *best_at = Some(at);
                    *value = arg.cloned().unwrap_or(Value::Null);
                }
            }
            Acc::Last { at: best_at, value } => {
                if best_at.is_none_or(|best| at > best) {
                    *best_at = Some(at);
                    *value = arg.cloned().unwrap_or(Value::Null);
                }
            }
            Acc::Ranked { values, .. } => {
                if let Some(value) = arg
                    && let Some(rank) = rank(value)
                {
                    values.entry(rank).or_insert_with(|| (value.clone(), 0)).1 += 1;
                }
            }
        }
    }

    /// Folds `other` (of the same function) in: two sessions become one.
    fn merge(&mut self, other: Acc) {
        match (self, other) {
            (Acc::Count { n }, Acc::Count { n: more }) => *n += more,
            (Acc::Distinct { values }, Acc::Distinct { values: more }) => {
                for (value, count) in more {
                    *values.entry(value).or_default() += count;
                }
            }
            (Acc::Sum { int, float, floats, n }, Acc::Sum { int: i, float: f, floats: fs, n: more }) => {
                match int.checked_add(i) {
                    Some(sum) => *int = sum,
                    None => {
                        *float += i as f64;
                        *floats += 1;
                    }
                }
                *float += f;
                *floats += fs;
                *n += more;
            }
            (Acc::Avg { sum, n }, Acc::Avg { sum: s, n: more }) => {
                *sum += s;
                *n += more;
            }
            (
                this @ (Acc::Min { .. } | Acc::Max { .. }),
                Acc::Min { best: Some(value) } | Acc::Max { best: Some(value) },
            ) => {
                this.add(Some(&value), (0, 0, 0));
            }
            (this @ Acc::First { .. }, Acc::First { at: Some(at), value }) => this.add(Some(&value), at),
            (this @ Acc::Last { .. }, Acc::Last { at: Some(at), value }) => this.add(Some(&value), at),
            _ => {}
        }
    }

    fn value(&self) -> Value {
        match self {
            Acc::Count { n } => Value::from(*n),
            Acc::Distinct { values } => Value::from(values.len()),
            Acc::Sum { n: 0, .. } => Value::Null,
            Acc::Sum { int, floats: 0, .. } => Value::from(*int),
            Acc::Sum { int, float, .. } => Value::from(*int as f64 + float),
            Acc::Avg { n: 0, .. } => Value::Null,
            Acc::Avg { sum, n } => Value::from(sum / *n as f64),
            Acc::Min { best } | Acc::Max { best } => best.clone().unwrap_or(Value::Null),
            Acc::First { value, .. } | Acc::Last { value, .. } => value.clone(),
            // The least number (or, with none, the least text); the greatest likewise.
            Acc::Ranked { values, max: false } => {
                values.values().next().map_or(Value::Null, |(value, _)| value.clone())
            }
            Acc::Ranked { values, max: true } => values
                .range(..="o".to_string())
                .next_back()
                .or_else(|| values.iter().next_back())
                .map_or(Value::Null, |(_, (value, _))| value.clone()),
        }
    }
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

/// What changed since the last checkpoint: the keys whose state changed (or went), and the
/// closed windows written or forgotten, in order. A checkpoint writes only these: a key's open
/// windows when they change, a closed window once when it closes and a tombstone when its
/// retention ends, so its cost follows the changes, not the size of the state.
#[derive(Clone, Debug, Default)]
struct Unsaved {
    /// Off for a view that never checkpoints (a view over a table): nothing is kept.
    on: bool,
    keys: HashSet<String>,
    closed: Vec<ClosedChange>,
}

/// A closed window of `key` starting at `start` that closed (`Some`) or was forgotten (`None`).
pub type ClosedChange = (String, i64, Option<Arc<Closed>>);

impl Unsaved {
    fn key(&mut self, key: &str) {
        if self.on && !self.keys.contains(key) {
            self.keys.insert(key.to_string());
        }
    }

    fn closed(&mut self, key: &str, start: i64, closed: Option<Arc<Closed>>) {
        if self.on {
            self.closed.push((key.to_string(), start, closed));
        }
    }
}

impl PartialEq for Unsaved {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// The changes one checkpoint writes ([`ViewState::take_unsaved`]), with the counters as of
/// then. The key states are shared with the view, so taking them copies pointers.
#[derive(Debug, Default)]
pub struct Delta {
    /// Each changed key and its state now, or `None` when it is gone.
    pub keys: Vec<(String, Option<Arc<KeyState>>)>,
    pub closed: Vec<ClosedChange>,
    pub events: u64,
    pub late_events: u64,
    pub invalid_events: u64,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.closed.is_empty()
    }
}

/// A key's state as a checkpoint stores it: everything but its closed windows, which are
/// stored one by one.
#[derive(Serialize)]
pub struct SavedKey<'a> {
    key_value: &'a Value,
    open: &'a [WindowState],
    kept: &'a [Kept],
    sliding_end: i64,
    rows: u64,
}

impl KeyState {
    pub fn saved(&self) -> SavedKey<'_> {
        SavedKey {
            key_value: &self.key_value,
            open: &self.open,
            kept: &self.kept,
            sliding_end: self.sliding_end,
            rows: self.rows,
        }
    }
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

impl ViewState {
    /// Applies one event arriving at `arrival_ms`, pushing the changes it makes to `changes`.
    pub fn apply(&mut self, def: &ViewDef, input: &Input, arrival_ms: i64, changes: &mut Vec<Change>) -> Applied {
        if let Some(filter) = &def.filter
            && !is_true(&filter.eval(input))
        {
            return Applied::Filtered;
        }
        let time = match &def.event_time {
            None => Some(input.timestamp_ms),
            Some(expr) => as_time_ms(&expr.eval(input)),
        };
        let Some(time) = time else {
            self.invalid_events += 1;
            return Applied::Invalid;
        };
        let key_value = def.key.eval(input);
        let key = key_text(&key_value);
        let args: Vec<Option<Value>> = def
            .columns
            .iter()
            .filter_map(|column| match column {
                Column::Key { .. } => None,
                Column::Aggregate { arg, .. } => Some(arg.as_ref().map(|arg| arg.eval(input))),
            })
            .collect();
        let at = (time, input.partition, input.offset);
        let applied = match def.window {
            Window::None => {
                self.apply_fixed(def, &key, key_value, &[(i64::MIN, i64::MAX)], &args, at, arrival_ms, changes)
            }
            Window::Tumble { size_ms } => {
                let size = size_ms as i64;
                let start = time.div_euclid(size) * size;
                self.apply_fixed(def, &key, key_value, &[(start, start + size)], &args, at, arrival_ms, changes)
            }
            Window::Hop { slide_ms, size_ms } => {
                let (slide, size) = (slide_ms as i64, size_ms as i64);
                let mut windows = Vec::new();
                let mut start = time.div_euclid(slide) * slide;
                while start > time - size {
                    windows.push((start, start + size));
                    start -= slide;
                }
                windows.reverse();
                self.apply_fixed(def, &key, key_value, &windows, &args, at, arrival_ms, changes)
            }
            Window::Session { gap_ms } => {
                self.apply_session(def, &key, key_value, gap_ms as i64, &args, at, arrival_ms, changes)
            }
            Window::Sliding { size_ms } => {
                self.apply_sliding(def, &key, key_value, size_ms as i64, args, at, arrival_ms, changes)
            }
        };
        match applied {
            Applied::Counted => self.events += 1,
            Applied::Late => self.late_events += 1,
            _ => {}
        }
        applied
    }

    /// A view over a table: a row changed from `before` to `after` (each absent for an insert,
    /// a delete). Takes back what the old row gave its group, adds the new row to its group,
    /// and pushes the new row of each group it touched (`removed` when its last row left).
    pub fn apply_row_change(
        &mut self,
        def: &ViewDef,
        before: Option<&Input>,
        after: Option<&Input>,
        changes: &mut Vec<Change>,
    ) -> Applied {
        let left = before.and_then(|input| self.fold_row(def, input, false));
        let joined = after.and_then(|input| self.fold_row(def, input, true));
        if left.is_none() && joined.is_none() {
            return Applied::Filtered;
        }
        self.events += 1;
        for key in left.iter().chain(joined.iter().filter(|key| Some(*key) != left.as_ref())) {
            let Some(state) = self.keys.get(key) else { continue };
            let Some(window) = state.open.first() else { continue };
            let row = Arc::new(row(def, &state.key_value, None, &window.accs));
            let removed = state.rows == 0;
            if removed {
                self.keys.remove(key);
                self.unsaved.key(key);
            }
            if def.emit_changes {
                changes.push(Change { key: key.clone(), row, is_final: false, removed });
            }
        }
        Applied::Counted
    }

    /// Adds (or takes back) one row in its group; the group's key, or `None` when the WHERE
    /// clause skips the row.
    fn fold_row(&mut self, def: &ViewDef, input: &Input, add: bool) -> Option<String> {
        if let Some(filter) = &def.filter
            && !is_true(&filter.eval(input))
        {
            return None;
        }
        let key_value = def.key.eval(input);
        let key = key_text(&key_value);
        self.unsaved.key(&key);
        let state = if add {
            self.keys.entry(key.clone()).or_insert_with(|| {
                Arc::new(KeyState {
                    key_value,
                    open: vec![WindowState {
                        start: i64::MIN,
                        end: i64::MAX,
                        accs: aggregates(def).map(Acc::retractable).collect(),
                    }],
                    ..KeyState::default()
                })
            })
        } else {
            self.keys.get_mut(&key)?
        };
        let state = Arc::make_mut(state);
        // A table view's group has its one window from its first row (`?`: never otherwise).
        let window = state.open.first_mut()?;
        let mut args = def.columns.iter().filter_map(|column| match column {
            Column::Key { .. } => None,
            Column::Aggregate { arg, .. } => Some(arg.as_ref().map(|arg| arg.eval(input))),
        });
        for acc in window.accs.iter_mut() {
            let arg = args.next().flatten();
            if add {
                acc.add(arg.as_ref(), (input.timestamp_ms, input.partition, input.offset));
            } else {
                acc.remove(arg.as_ref());
            }
        }
        if add {
            state.rows += 1;
        } else {
            state.rows = state.rows.saturating_sub(1);
        }
        Some(key)
    }

    /// Tumbling and hopping windows (and no window: one window forever).
    #[allow(clippy::too_many_arguments)]
    fn apply_fixed(
        &mut self,
        def: &ViewDef,
        key: &str,
        key_value: Value,
        windows: &[(i64, i64)],
        args: &[Option<Value>],
        at: (i64, u32, u64),
        arrival_ms: i64,
        changes: &mut Vec<Change>,
    ) -> Applied {
        let grace = def.grace_ms as i64;
        let closes = !matches!(def.window, Window::None);
        let state = key_state(&mut self.keys, &mut self.unsaved, key, key_value);
        let mut counted = false;
        for &(start, end) in windows {
            let close_at = end.saturating_add(grace);
            if closes && (arrival_ms > close_at || state.closed.iter().any(|closed| closed.start == start)) {
                continue;
            }
            let index = match state.open.binary_search_by_key(&start, |window| window.start) {
                Ok(index) => index,
                Err(index) => {
                    let accs = aggregates(def).map(Acc::new).collect();
                    state.open.insert(index, WindowState { start, end, accs });
                    if closes {
                        self.deadlines.insert((close_at, key.to_string(), start));
                    }
                    index
                }
            };
            let window = &mut state.open[index];
            for (acc, arg) in window.accs.iter_mut().zip(args) {
                acc.add(arg.as_ref(), at);
            }
            counted = true;
            if def.emit_changes {
                changes.push(Change {
                    key: key.to_string(),
                    row: Arc::new(row(def, &state.key_value, closes.then_some((start, end)), &window.accs)),
                    is_final: false,
                    removed: false,
                });
            }
        }
        if counted { Applied::Counted } else { Applied::Late }
    }

    /// Session windows: an event joins (and bridges) the sessions within `gap` of it.
    #[allow(clippy::too_many_arguments)]
    fn apply_session(
        &mut self,
        def: &ViewDef,
        key: &str,
        key_value: Value,
        gap: i64,
        args: &[Option<Value>],
        at: (i64, u32, u64),
        arrival_ms: i64,
        changes: &mut Vec<Change>,
    ) -> Applied {
        let grace = def.grace_ms as i64;
        let time = at.0;
        let state = key_state(&mut self.keys, &mut self.unsaved, key, key_value);
        // A session is [first event, last event + gap): events less than `gap` apart are in one.
        // The event joins every session it falls in or is less than `gap` before.
        let touches = |start: i64, end: i64| time > start - gap && time < end;
        if state.closed.iter().any(|closed| touches(closed.start, closed.end)) {
            return Applied::Late;
        }
        let mut start = time;
        let mut end = time + gap;
        let mut joined: Vec<WindowState> = Vec::new();
        let mut index = 0;
        while index < state.open.len() {
            let window = &state.open[index];
            if touches(window.start, window.end) {
                let window = state.open.remove(index);
                start = start.min(window.start);
                end = end.max(window.end);
                joined.push(window);
            } else {
                index += 1;
            }
        }
        if arrival_ms > end.saturating_add(grace) {
            // Too late to open or extend anything: put back what it would have joined.
            for window in joined {
                let at = state.open.partition_point(|other| other.start < window.start);
                state.open.insert(at, window);
            }
            return Applied::Late;
        }
        let mut accs: Vec<Acc> = aggregates(def).map(Acc::new).collect();
        for window in joined {
            self.deadlines.remove(&(window.end.saturating_add(grace), key.to_string(), window.start));
            if window.start != start && def.emit_changes {
                // Merged into the new session: its row is gone.
                changes.push(Change {
                    key: key.to_string(),
                    row: Arc::new(row(def, &state.key_value, Some((window.start, window.end)), &window.accs)),
                    is_final: false,
                    removed: true,
                });
            }
            for (acc, other) in accs.iter_mut().zip(window.accs) {
                acc.merge(other);
            }
        }
        for (acc, arg) in accs.iter_mut().zip(args) {
            acc.add(arg.as_ref(), at);
        }
        if def.emit_changes {
            changes.push(Change {
                key: key.to_string(),
                row: Arc::new(row(def, &state.key_value, Some((start, end)), &accs)),
                is_final: false,
                removed: false,
            });
        }
        let at_index = state.open.partition_point(|other| other.start < start);
        state.open.insert(at_index, WindowState { start, end, accs });
        self.deadlines.insert((end.saturating_add(grace), key.to_string(), start));
        Applied::Counted
    }

    /// A sliding window: per key, the events of the last `size` before its latest event.
    #[allow(clippy::too_many_arguments)]
    fn apply_sliding(
        &mut self,
        def: &ViewDef,
        key: &str,
        key_value: Value,
        size: i64,
        args: Vec<Option<Value>>,
        at: (i64, u32, u64),
        arrival_ms: i64,
        changes: &mut Vec<Change>,
    ) -> Applied {
        let grace = def.grace_ms as i64;
        let time = at.0;
        // Already outside the window when it arrived.
        if time <= arrival_ms - size - grace {
            return Applied::Late;
        }
        let state = key_state(&mut self.keys, &mut self.unsaved, key, key_value);
        let index = state.kept.partition_point(|kept| kept.at < at);
        state.kept.insert(index, Kept { at, args });
        self.next_eviction.lower(at.0);
        state.sliding_end = state.sliding_end.max(time);
        let end = state.sliding_end;
        let evicted = state.kept.partition_point(|kept| kept.at.0 <= end - size);
        state.kept.drain(..evicted);
        if state.kept.is_empty() {
            // It fell out at once (older than the window the key's latest event set).
            return Applied::Late;
        }
        if def.emit_changes {
            changes.push(Change {
                key: key.to_string(),
                row: Arc::new(sliding_row(def, state, size)),
                is_final: false,
                removed: false,
            });
        }
        Applied::Counted
    }

    /// The earliest time at which something closes or falls out, if anything will.
    pub fn next_deadline(&self, def: &ViewDef) -> Option<i64> {
        let closing = self.deadlines.first().map(|(at, _, _)| *at);
        // From the bounds when known (waking early only costs a pass that finds nothing due).
        let sliding = match def.window {
            Window::Sliding { size_ms } => {
                let oldest = match self.next_eviction.0 {
                    Some(bound) => (bound < i64::MAX).then_some(bound),
                    None => self.keys.values().filter_map(|state| state.kept.first()).map(|kept| kept.at.0).min(),
                };
                oldest.map(|at| at + size_ms as i64 + def.grace_ms as i64)
            }
            _ => None,
        };
        let retention = match self.next_expiry.0 {
            Some(bound) => (bound < i64::MAX).then_some(bound),
            None => self
                .keys
                .values()
                .filter_map(|state| state.closed.front())
                .map(|closed| closed.end.saturating_add(def.grace_ms as i64).saturating_add(def.retention_ms as i64))
                .min(),
        };
        [closing, sliding, retention].into_iter().flatten().min()
    }

    /// Closes the windows due at `now_ms` (finals to `changes`), lets sliding windows move on,
    /// and forgets closed windows past their retention.
    pub fn advance(&mut self, def: &ViewDef, now_ms: i64, changes: &mut Vec<Change>) {
        self.advance_some(def, now_ms, changes, usize::MAX);
    }

    /// [`ViewState::advance`], closing at most `limit` windows: true when windows due were
    /// left for the next call. The rest (sliding windows, retention) runs once closing is done.
    pub fn advance_some(&mut self, def: &ViewDef, now_ms: i64, changes: &mut Vec<Change>, limit: usize) -> bool {
        let mut closed = 0;
        while self.deadlines.first().is_some_and(|(close_at, _, _)| *close_at <= now_ms) {
            if closed == limit {
                return true;
            }
            closed += 1;
            let Some((_, key, start)) = self.deadlines.pop_first() else { break };
            let Some(state) = self.keys.get_mut(&key) else { continue };
            let state = Arc::make_mut(state);
            let Ok(index) = state.open.binary_search_by_key(&start, |window| window.start) else { continue };
            let window = state.open.remove(index);
            let row = Arc::new(row(def, &state.key_value, Some((window.start, window.end)), &window.accs));
            if def.emit_final {
                changes.push(Change { key: key.clone(), row: row.clone(), is_final: true, removed: false });
            }
            let at = state.closed.partition_point(|closed| closed.start < window.start);
            let closed = Arc::new(Closed { start: window.start, end: window.end, row });
            self.unsaved.key(&key);
            self.unsaved.closed(&key, window.start, Some(closed.clone()));
            state.closed.insert(at, closed);
            self.next_expiry
                .lower(window.end.saturating_add(def.grace_ms as i64).saturating_add(def.retention_ms as i64));
        }
        if let Window::Sliding { size_ms } = def.window {
            let size = size_ms as i64;
            let horizon = now_ms - size - def.grace_ms as i64;
            let mut earliest = i64::MAX;
            let mut emptied = Vec::new();
            let scan = self.next_eviction.due(horizon);
            for (key, state) in self.keys.iter_mut().filter(|_| scan) {
                let evicted = state.kept.partition_point(|kept| kept.at.0 <= horizon);
                if let Some(kept) = state.kept.get(evicted) {
                    earliest = earliest.min(kept.at.0);
                }
                if evicted == 0 {
                    continue;
                }
                self.unsaved.key(key);
                let state = Arc::make_mut(state);
                // The window moved to when the last of them fell out (not to now: a replay
                // that sees it later must show the same row).
                let fell_out = state.kept[evicted - 1].at.0 + size;
                state.kept.drain(..evicted);
                state.sliding_end = state.sliding_end.max(fell_out);
                if def.emit_changes {
                    changes.push(Change {
                        key: key.clone(),
                        row: Arc::new(sliding_row(def, state, size)),
                        is_final: false,
                        removed: state.kept.is_empty(),
                    });
                }
                if state.kept.is_empty() && state.open.is_empty() && state.closed.is_empty() {
                    emptied.push(key.clone());
                }
            }
            if scan {
                for key in emptied {
                    self.keys.remove(&key);
                }
                self.next_eviction = LowerBound(Some(earliest));
            }
        }
        // Kept for the retention after they close (measured on the same clock as closing).
        let retention = (def.retention_ms as i64).saturating_add(def.grace_ms as i64);
        if self.next_expiry.due(now_ms) {
            let mut earliest = i64::MAX;
            let unsaved = &mut self.unsaved;
            self.keys.retain(|key, state| {
                let expired = |state: &KeyState| {
                    state.closed.front().is_some_and(|closed| closed.end.saturating_add(retention) <= now_ms)
                };
                if expired(state) {
                    unsaved.key(key);
                    let state = Arc::make_mut(state);
                    while expired(state) {
                        if let Some(closed) = state.closed.pop_front() {
                            unsaved.closed(key, closed.start, None);
                        }
                    }
                }
                if let Some(closed) = state.closed.front() {
                    earliest = earliest.min(closed.end.saturating_add(retention));
                }
                !(state.open.is_empty() && state.closed.is_empty() && state.kept.is_empty())
            });
            self.next_expiry = LowerBound(Some(earliest));
        }
        false
    }

    /// The rows of `key`, newest window first: open windows, then closed ones.
    pub fn rows(&self, def: &ViewDef, key: &str) -> Vec<Value> {
        let Some(state) = self.keys.get(key) else { return Vec::new() };
        self.key_rows(def, state)
    }

    fn key_rows(&self, def: &ViewDef, state: &KeyState) -> Vec<Value> {
        if let Window::Sliding { size_ms } = def.window {
            return if state.kept.is_empty() { Vec::new() } else { vec![sliding_row(def, state, size_ms as i64)] };
        }
        let windowed = !matches!(def.window, Window::None);
        let mut rows: Vec<Value> = state
            .open
            .iter()
            .rev()
            .map(|window| {
                let bounds = windowed.then_some((window.start, window.end));
                row(def, &state.key_value, bounds, &window.accs)
            })
            .collect();
        rows.extend(state.closed.iter().rev().map(|closed| {
            let mut row = (*closed.row).clone();
            if let Value::Object(fields) = &mut row {
                fields.insert("final".into(), Value::Bool(true));
            }
            row
        }));
        rows
    }

    /// Every key, in key order, with its rows; `after` pages on.
    pub fn keys_page(&self, def: &ViewDef, after: Option<&str>, limit: usize) -> Vec<(String, Vec<Value>)> {
        let mut keys: Vec<&String> =
            self.keys.keys().filter(|key| after.is_none_or(|after| key.as_str() > after)).collect();
        keys.sort();
        keys.into_iter().take(limit).map(|key| (key.clone(), self.key_rows(def, &self.keys[key]))).collect()
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// Keeps what changes from now on for [`ViewState::take_unsaved`]; with `everything`, the
    /// whole state counts as changed (a state no checkpoint holds in this form yet).
    pub fn track_unsaved(&mut self, everything: bool) {
        self.unsaved.on = true;
        if everything {
            let whole = self.everything();
            self.unsaved.keys.extend(whole.keys.into_iter().map(|(key, _)| key));
            self.unsaved.closed.extend(whole.closed);
        }
    }

    /// Whether anything changed since the last [`ViewState::take_unsaved`].
    pub fn has_unsaved(&self) -> bool {
        !self.unsaved.keys.is_empty() || !self.unsaved.closed.is_empty()
    }

    /// What changed since the last call: each changed key's state now (pointers, not copies),
    /// and the closed windows written and forgotten, in order.
    pub fn take_unsaved(&mut self) -> Delta {
        let keys = std::mem::take(&mut self.unsaved.keys);
        Delta {
            keys: keys
                .into_iter()
                .map(|key| {
                    let state = self.keys.get(&key).cloned();
                    (key, state)
                })
                .collect(),
            closed: std::mem::take(&mut self.unsaved.closed),
            events: self.events,
            late_events: self.late_events,
            invalid_events: self.invalid_events,
        }
    }

    /// A delta that was not written (its checkpoint failed): its changes are unsaved again,
    /// ahead of those made since.
    pub fn put_back(&mut self, delta: Delta) {
        self.unsaved.keys.extend(delta.keys.into_iter().map(|(key, _)| key));
        let since = std::mem::replace(&mut self.unsaved.closed, delta.closed);
        self.unsaved.closed.extend(since);
    }

    /// The whole state as one delta: every key and every closed window.
    pub fn everything(&self) -> Delta {
        let mut closed = Vec::new();
        for (key, state) in &self.keys {
            closed.extend(state.closed.iter().map(|window| (key.clone(), window.start, Some(window.clone()))));
        }
        Delta {
            keys: self.keys.iter().map(|(key, state)| (key.clone(), Some(state.clone()))).collect(),
            closed,
            events: self.events,
            late_events: self.late_events,
            invalid_events: self.invalid_events,
        }
    }

    /// A state put back together from what checkpoints stored: each key's state, each closed
    /// window, and the counters. The close times of open windows follow from the windows.
    pub fn restore(
        def: &ViewDef,
        counters: (u64, u64, u64),
        keys: impl IntoIterator<Item = (String, KeyState)>,
        closed: impl IntoIterator<Item = (String, Closed)>,
    ) -> ViewState {
        let mut state = ViewState {
            events: counters.0,
            late_events: counters.1,
            invalid_events: counters.2,
            ..ViewState::default()
        };
        let closes = !matches!(def.window, Window::None | Window::Sliding { .. });
        for (key, mut key_state) in keys {
            key_state.closed.clear();
            if closes {
                for window in &key_state.open {
                    state.deadlines.insert((window.end.saturating_add(def.grace_ms as i64), key.clone(), window.start));
                }
            }
            state.keys.insert(key, Arc::new(key_state));
        }
        for (key, window) in closed {
            // A key's closed windows come with its state (a key is stored whenever it changes).
            let Some(key_state) = state.keys.get_mut(&key) else { continue };
            let key_state = Arc::make_mut(key_state);
            let at = key_state.closed.partition_point(|other| other.start < window.start);
            if key_state.closed.get(at).is_some_and(|other| other.start == window.start) {
                key_state.closed[at] = Arc::new(window);
            } else {
                key_state.closed.insert(at, Arc::new(window));
            }
        }
        state
    }
}

/// The state of `key`, created (showing `key_value`) by its first event. Looked up before it is
/// inserted: the key is copied once per key, not once per event.
fn key_state<'a>(
    keys: &'a mut HashMap<String, Arc<KeyState>>,
    unsaved: &mut Unsaved,
    key: &str,
    key_value: Value,
) -> &'a mut KeyState {
    unsaved.key(key);
    if !keys.contains_key(key) {
        keys.insert(key.to_string(), Arc::new(KeyState { key_value, ..KeyState::default() }));
    }
    Arc::make_mut(keys.get_mut(key).expect("inserted"))
}

fn aggregates(def: &ViewDef) -> impl Iterator<Item = AggregateKind> + '_ {
    def.columns.iter().filter_map(|column| match column {
        Column::Aggregate { function, .. } => Some(*function),
        Column::Key { .. } => None,
    })
}

/// A row: the key column(s), the window bounds, the aggregates in SELECT order.
fn row(def: &ViewDef, key_value: &Value, bounds: Option<(i64, i64)>, accs: &[Acc]) -> Value {
    let mut fields = Map::with_capacity(def.columns.len() + 2);
    let mut accs = accs.iter();
    for column in &def.columns {
        match column {
            Column::Key { name } => {
                fields.insert(name.clone(), key_value.clone());
            }
            Column::Aggregate { name, .. } => {
                fields.insert(name.clone(), accs.next().map_or(Value::Null, Acc::value));
            }
        }
    }
    if let Some((start, end)) = bounds {
        fields.insert("window_start".into(), Value::from(start));
        fields.insert("window_end".into(), Value::from(end));
    }
    Value::Object(fields)
}

/// A sliding window's row, computed from the events it holds.
fn sliding_row(def: &ViewDef, state: &KeyState, size: i64) -> Value {
    let mut accs: Vec<Acc> = aggregates(def).map(Acc::new).collect();
    for kept in &state.kept {
        for (acc, arg) in accs.iter_mut().zip(&kept.args) {
            acc.add(arg.as_ref(), kept.at);
        }
    }
    row(def, &state.key_value, Some((state.sliding_end - size, state.sliding_end)), &accs)
}
