//! Events in: one event of the source into its key's windows (tumbling, hopping, session,
//! sliding, or none), or one row change of a source table into its group, with the changes each
//! makes to the view's rows.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::super::expr::{Input, as_time_ms, is_true, key_text};
use super::super::{Column, ViewDef, Window};
use super::acc::{Acc, aggregates};
use super::rows::{row, sliding_row};
use super::{Applied, Change, Kept, KeyState, Unsaved, ViewState, WindowState};

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
                column @ Column::Aggregate { .. } => Some(column.argument(input)),
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
        // The rows of the groups it touches as they are, for each change's `before`.
        let mut was: Vec<(String, Arc<Value>)> = Vec::new();
        if def.emit_changes {
            for input in before.iter().chain(after.iter()) {
                if let Some(key) = group_of(def, input)
                    && !was.iter().any(|(seen, _)| *seen == key)
                    && let Some(state) = self.keys.get(&key)
                    && let Some(window) = state.open.first()
                {
                    let row = Arc::new(row(def, &state.key_value, None, &window.accs));
                    was.push((key, row));
                }
            }
        }
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
                let before =
                    if removed { None } else { was.iter().find(|(seen, _)| seen == key).map(|(_, row)| row.clone()) };
                changes.push(Change { key: key.clone(), row, is_final: false, removed, before });
            }
        }
        Applied::Counted
    }

    /// Adds (or takes back) one row in its group; the group's key, or `None` when the WHERE
    /// clause skips the row ([`group_of`]).
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
            column @ Column::Aggregate { .. } => Some(column.argument(input)),
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
            let bounds = closes.then_some((start, end));
            let (index, before) = match state.open.binary_search_by_key(&start, |window| window.start) {
                Ok(index) => {
                    let before =
                        def.emit_changes.then(|| Arc::new(row(def, &state.key_value, bounds, &state.open[index].accs)));
                    (index, before)
                }
                Err(index) => {
                    let accs = aggregates(def).map(Acc::new).collect();
                    state.open.insert(index, WindowState { start, end, accs });
                    if closes {
                        self.deadlines.insert((close_at, key.to_string(), start));
                    }
                    (index, None)
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
                    row: Arc::new(row(def, &state.key_value, bounds, &window.accs)),
                    is_final: false,
                    removed: false,
                    before,
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
        // The session that keeps its start (extended, or joined by later ones) was this row.
        let mut before = None;
        for window in joined {
            if window.start == start && def.emit_changes {
                before = Some(Arc::new(row(def, &state.key_value, Some((window.start, window.end)), &window.accs)));
            }
            self.deadlines.remove(&(window.end.saturating_add(grace), key.to_string(), window.start));
            if window.start != start && def.emit_changes {
                // Merged into the new session: its row is gone.
                changes.push(Change {
                    key: key.to_string(),
                    row: Arc::new(row(def, &state.key_value, Some((window.start, window.end)), &window.accs)),
                    is_final: false,
                    removed: true,
                    before: None,
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
                before,
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
        let before = (def.emit_changes && !state.kept.is_empty()).then(|| Arc::new(sliding_row(def, state, size)));
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
                before,
            });
        }
        Applied::Counted
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

/// The group a table row belongs to (its key's text), or `None` when the WHERE clause skips it.
fn group_of(def: &ViewDef, input: &Input) -> Option<String> {
    if let Some(filter) = &def.filter
        && !is_true(&filter.eval(input))
    {
        return None;
    }
    Some(key_text(&def.key.eval(input)))
}
