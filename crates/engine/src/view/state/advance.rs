//! Time passing: the windows whose close time the clock has passed close (their finals go out),
//! sliding windows let their old events fall out, and closed windows are forgotten when their
//! retention ends.

use std::sync::Arc;

use super::super::{ViewDef, Window};
use super::rows::{row, sliding_row};
use super::{Change, Closed, KeyState, LowerBound, ViewState};

impl ViewState {
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
                changes.push(Change {
                    key: key.clone(),
                    row: row.clone(),
                    is_final: true,
                    removed: false,
                    before: None,
                });
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
                let before = def.emit_changes.then(|| Arc::new(sliding_row(def, state, size)));
                state.kept.drain(..evicted);
                state.sliding_end = state.sliding_end.max(fell_out);
                if def.emit_changes {
                    changes.push(Change {
                        key: key.clone(),
                        row: Arc::new(sliding_row(def, state, size)),
                        is_final: false,
                        removed: state.kept.is_empty(),
                        before: before.filter(|_| !state.kept.is_empty()),
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
}
