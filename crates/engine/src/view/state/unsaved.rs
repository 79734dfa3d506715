//! What a checkpoint writes and reads back: the keys and closed windows changed since the last
//! checkpoint (a [`Delta`]), a key's state as stored ([`SavedKey`]), and a state restored from
//! what checkpoints stored.

use std::collections::HashSet;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::super::{ViewDef, Window};
use super::{Closed, Kept, KeyState, ViewState, WindowState};

/// What changed since the last checkpoint: the keys whose state changed (or went), and the
/// closed windows written or forgotten, in order. A checkpoint writes only these: a key's open
/// windows when they change, a closed window once when it closes and a tombstone when its
/// retention ends, so its cost follows the changes, not the size of the state.
#[derive(Clone, Debug, Default)]
pub(super) struct Unsaved {
    /// Off for a view that never checkpoints (a view over a table): nothing is kept.
    on: bool,
    keys: HashSet<String>,
    closed: Vec<ClosedChange>,
}

/// A closed window of `key` starting at `start` that closed (`Some`) or was forgotten (`None`).
pub type ClosedChange = (String, i64, Option<Arc<Closed>>);

impl Unsaved {
    pub(super) fn key(&mut self, key: &str) {
        if self.on && !self.keys.contains(key) {
            self.keys.insert(key.to_string());
        }
    }

    pub(super) fn closed(&mut self, key: &str, start: i64, closed: Option<Arc<Closed>>) {
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

impl ViewState {
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
