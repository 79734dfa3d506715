//! A view's rows: how a key's windows read as JSON rows (the key column, the window bounds, the
//! aggregates in SELECT order), for the changes subscribers get and for reads by key or by page.

use serde_json::{Map, Value};

use super::super::{Column, ViewDef, Window};
use super::acc::{Acc, aggregates};
use super::{KeyState, ViewState};

impl ViewState {
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
}

/// A row: the key column(s), the window bounds, the aggregates in SELECT order.
pub(super) fn row(def: &ViewDef, key_value: &Value, bounds: Option<(i64, i64)>, accs: &[Acc]) -> Value {
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
pub(super) fn sliding_row(def: &ViewDef, state: &KeyState, size: i64) -> Value {
    let mut accs: Vec<Acc> = aggregates(def).map(Acc::new).collect();
    for kept in &state.kept {
        for (acc, arg) in accs.iter_mut().zip(&kept.args) {
            acc.add(arg.as_ref(), kept.at);
        }
    }
    row(def, &state.key_value, Some((state.sliding_end - size, state.sliding_end)), &accs)
}
