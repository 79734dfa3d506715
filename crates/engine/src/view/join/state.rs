//! A joined view's state: each input's rows (the fields the view reads) and an index per join
//! key that is not the row's id, as of the changes applied so far. Pure: changes in, changes
//! out, so a test can hold it beside a from-scratch evaluation.
//!
//! The outputs of a driving row are found by probing: its row, then for each later input the
//! rows whose key equals its parent's key expression (through the id or an index), then the
//! WHERE and the SELECT list. A change of input `k`'s row is traced back to the driving rows
//! it can reach (its parent's rows whose key expression equals this row's key, their parents'
//! …), whose outputs are computed before and after the row changes: the difference is emitted.
//!
//! Reads compute a driving row's outputs the same way, and keep them (with each row's JSON)
//! until a change reaches that driving row: a listing of a large joined view read many times a
//! second between changes costs a copy of its rows, not their joins and serialization.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{JoinDef, JoinKind, driving_id, output_key};
use crate::view::expr::{Expr, Input, is_true};
use crate::view::state::Change;

/// A join key's value, equal where SQL's `=` is true: numbers by value (1 = 1.0), text to the
/// same text, booleans, and arrays or objects that are the same JSON. Null joins nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum JoinKey {
    Bool(bool),
    Int(i64),
    /// A number with a fraction (or beyond 64-bit integers), by its bits (`-0.0` as `0.0`).
    Float(u64),
    Text(String),
    Json(String),
}

impl JoinKey {
    fn of(value: &Value) -> Option<JoinKey> {
        Some(match value {
            Value::Null => return None,
            Value::Bool(truth) => JoinKey::Bool(*truth),
            Value::Number(number) => match number.as_i64() {
                Some(int) => JoinKey::Int(int),
                None => {
                    let float = number.as_f64()?;
                    if float.is_nan() {
                        return None;
                    }
                    if float.fract() == 0.0 && float >= i64::MIN as f64 && float < i64::MAX as f64 {
                        JoinKey::Int(float as i64)
                    } else {
                        JoinKey::Float(if float == 0.0 { 0.0f64 } else { float }.to_bits())
                    }
                }
            },
            Value::String(text) => JoinKey::Text(text.clone()),
            other => JoinKey::Json(other.to_string()),
        })
    }

    /// The row id a key can equal (ids are text; an integer key names the id of its digits).
    fn as_id(&self) -> Option<String> {
        match self {
            JoinKey::Text(text) => Some(text.clone()),
            JoinKey::Int(int) => Some(int.to_string()),
            _ => None,
        }
    }

    fn bytes(&self) -> usize {
        match self {
            JoinKey::Text(text) | JoinKey::Json(text) => 32 + text.len(),
            _ => 32,
        }
    }
}

/// An expression evaluated against one row alone.
fn eval_on(expr: &Expr, row: &Value) -> Value {
    expr.eval(&Input::row(row))
}

/// How rows of an input are found by a key: by id, or through one of its indexes.
#[derive(Clone, Copy, Debug)]
enum Lookup {
    Id,
    Index(usize),
}

/// Rows of one input by the value of one expression of them.
struct Index {
    expr: Expr,
    entries: HashMap<JoinKey, BTreeSet<String>>,
}

/// One input as the view keeps it.
struct Arrangement {
    alias: String,
    /// The fields kept of each row; `None`: the whole row.
    fields: Option<Vec<String>>,
    rows: BTreeMap<String, Arc<Value>>,
    indexes: Vec<Index>,
    /// An estimate of the memory the rows and their index entries take.
    bytes: usize,
}

impl Arrangement {
    /// `row` with only the fields the view reads.
    fn prune(&self, row: &Value) -> Value {
        match (&self.fields, row) {
            (Some(fields), Value::Object(all)) => {
                let kept: Map<String, Value> = fields
                    .iter()
                    .filter_map(|field| all.get(field).map(|value| (field.clone(), value.clone())))
                    .collect();
                Value::Object(kept)
            }
            _ => row.clone(),
        }
    }

    fn insert(&mut self, id: &str, row: Arc<Value>) {
        self.remove(id);
        self.bytes += row_bytes(id, &row);
        for index in &mut self.indexes {
            if let Some(key) = JoinKey::of(&eval_on(&index.expr, &row)) {
                self.bytes += key.bytes() + id.len() + 32;
                index.entries.entry(key).or_default().insert(id.to_string());
            }
        }
        self.rows.insert(id.to_string(), row);
    }

    fn remove(&mut self, id: &str) {
        let Some(row) = self.rows.remove(id) else { return };
        self.bytes = self.bytes.saturating_sub(row_bytes(id, &row));
        for index in &mut self.indexes {
            if let Some(key) = JoinKey::of(&eval_on(&index.expr, &row)) {
                self.bytes = self.bytes.saturating_sub(key.bytes() + id.len() + 32);
                if let Some(ids) = index.entries.get_mut(&key) {
                    ids.remove(id);
                    if ids.is_empty() {
                        index.entries.remove(&key);
                    }
                }
            }
        }
    }

    /// The index on `expr`, made if there is none yet.
    fn index_on(&mut self, expr: &Expr) -> usize {
        if let Some(at) = self.indexes.iter().position(|index| index.expr == *expr) {
            return at;
        }
        self.indexes.push(Index { expr: expr.clone(), entries: HashMap::new() });
        self.indexes.len() - 1
    }

    /// The rows whose `expr` (found through `lookup`) equals `key`.
    fn find<'s>(&'s self, lookup: Lookup, expr: &Expr, key: &JoinKey, found: &mut Vec<(&'s str, &'s Arc<Value>)>) {
        match lookup {
            Lookup::Id => {
                // The id is text: the row's own field says whether it equals the key as SQL
                // compares (an id "1" is not the number 1 when the field is text).
                if let Some(id) = key.as_id()
                    && let Some((id, row)) = self.rows.get_key_value(&id)
                    && JoinKey::of(&eval_on(expr, row)).as_ref() == Some(key)
                {
                    found.push((id, row));
                }
            }
            Lookup::Index(at) => {
                if let Some(ids) = self.indexes[at].entries.get(key) {
                    for id in ids {
                        if let Some((id, row)) = self.rows.get_key_value(id) {
                            found.push((id, row));
                        }
                    }
                }
            }
        }
    }
}

/// An estimate of what a row kept by id takes in memory.
fn row_bytes(id: &str, row: &Value) -> usize {
    64 + id.len() + value_bytes(row)
}

fn value_bytes(value: &Value) -> usize {
    match value {
        Value::String(text) => 24 + text.len(),
        Value::Array(items) => 24 + items.iter().map(value_bytes).sum::<usize>(),
        Value::Object(fields) => {
            48 + fields.iter().map(|(name, value)| 24 + name.len() + value_bytes(value)).sum::<usize>()
        }
        _ => 16,
    }
}

/// One input's share of a joined view's state, for its status and metrics.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct InputStatus {
    pub alias: String,
    pub source: String,
    pub rows: usize,
    pub bytes: usize,
}

/// A change of one input's row on its way through the driving rows it reaches.
pub struct Pending {
    at: usize,
    id: String,
    before: Option<Arc<Value>>,
    after: Option<Arc<Value>>,
    driving: Vec<String>,
    /// How many of `driving` are done.
    next: usize,
}

impl Pending {
    /// Driving rows the change reaches.
    pub fn reach(&self) -> usize {
        self.driving.len()
    }
}

/// A combination of input rows, one per input so far (`None` where a left join matched none).
type Combo<'s> = Vec<Option<(&'s str, &'s Arc<Value>)>>;

pub struct JoinState {
    def: JoinDef,
    inputs: Vec<Arrangement>,
    /// Per input after the first: how its rows are found by its own key expression.
    probes: Vec<Lookup>,
    /// Per input after the first: how its parent's rows are found by the parent's key
    /// expression, to trace a change back.
    ups: Vec<Lookup>,
    /// The inputs whose row ids make up an output key: the driving one and every input that
    /// can match several rows.
    key_parts: Vec<usize>,
    /// Output rows there are now.
    outputs: usize,
    /// The outputs of driving rows as reads computed them (see the module's doc).
    computed: Mutex<Computed>,
}

/// Bytes of output rows kept for reads at most, per view (as their JSON's length, times
/// [`COMPUTED_OVERHEAD`] for the parsed row beside it); past it a read computes what it reads.
const COMPUTED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// What a kept row costs per byte of its JSON, with its parsed value and its key.
const COMPUTED_OVERHEAD: usize = 3;

/// One output row as reads see it: its key, its row, and the row as JSON.
#[derive(Clone, Debug)]
pub struct OutputRow {
    pub key: String,
    pub row: Arc<Value>,
    pub json: Bytes,
}

#[derive(Default)]
struct Computed {
    by_driving: HashMap<String, Arc<[OutputRow]>>,
    bytes: usize,
}

impl Computed {
    fn forget(&mut self, driving_id: &str) {
        if let Some(rows) = self.by_driving.remove(driving_id) {
            self.bytes -= computed_bytes(&rows);
        }
    }

    fn clear(&mut self) {
        self.by_driving.clear();
        self.bytes = 0;
    }
}

fn computed_bytes(rows: &[OutputRow]) -> usize {
    rows.iter().map(|row| row.key.len() + row.json.len() * COMPUTED_OVERHEAD).sum()
}

impl JoinState {
    pub fn new(def: &JoinDef) -> JoinState {
        let mut inputs: Vec<Arrangement> = (0..def.inputs.len())
            .map(|at| Arrangement {
                alias: def.inputs[at].alias.clone(),
                fields: def.fields_read(at),
                rows: BTreeMap::new(),
                indexes: Vec::new(),
                bytes: 0,
            })
            .collect();
        let (mut probes, mut ups) = (vec![Lookup::Id], vec![Lookup::Id]);
        for (at, input) in def.inputs.iter().enumerate().skip(1) {
            let on = input.on.as_ref().expect("validated: every input after the first has ON");
            probes.push(if super::is_field(&on.key, &input.id_field) {
                Lookup::Id
            } else {
                Lookup::Index(inputs[at].index_on(&on.key))
            });
            let parent = &def.inputs[on.parent];
            ups.push(if super::is_field(&on.parent_key, &parent.id_field) {
                Lookup::Id
            } else {
                Lookup::Index(inputs[on.parent].index_on(&on.parent_key))
            });
        }
        let key_parts =
            std::iter::once(0).chain((1..def.inputs.len()).filter(|&at| !def.inputs[at].to_one())).collect();
        JoinState { def: def.clone(), inputs, probes, ups, key_parts, outputs: 0, computed: Mutex::default() }
    }

    /// Puts a row of input `at` in without computing what changes (loading the inputs before
    /// the view starts; [`JoinState::recount`] then counts the outputs).
    pub fn load(&mut self, at: usize, id: &str, row: &Value) {
        self.computed_mut().clear();
        let row = Arc::new(self.inputs[at].prune(row));
        self.inputs[at].insert(id, row);
    }

    /// Counts the output rows, after [`JoinState::load`].
    pub fn recount(&mut self) {
        let mut outputs = Vec::new();
        let mut count = 0;
        for id in self.inputs[0].rows.keys() {
            self.outputs_of(id, &mut outputs);
            count += outputs.len();
            outputs.clear();
        }
        self.outputs = count;
    }

    /// Input `at`'s row `id` is now `after` (`None`: deleted): the output rows that change, the
    /// old ones removed and the new ones as they are now, in key order per driving row. All at
    /// once: [`JoinState::begin`] and [`JoinState::step`] do it a batch at a time.
    pub fn apply(&mut self, at: usize, id: &str, after: Option<&Value>, changes: &mut Vec<Change>) {
        if let Some(mut pending) = self.begin(at, id, after) {
            self.step(&mut pending, usize::MAX, changes);
        }
    }

    /// Starts applying a change of input `at`'s row `id` (see [`JoinState::apply`]): finds the
    /// driving rows it reaches; `None` when nothing the view reads changed. The state is
    /// unchanged until the first [`JoinState::step`].
    pub fn begin(&mut self, at: usize, id: &str, after: Option<&Value>) -> Option<Pending> {
        let after = after.map(|row| Arc::new(self.inputs[at].prune(row)));
        let before = self.inputs[at].rows.get(id).cloned();
        if before.is_none() && after.is_none() {
            return None;
        }
        if let (Some(before), Some(after)) = (&before, &after)
            && before == after
        {
            // Nothing the view reads changed.
            return None;
        }
        let mut driving = BTreeSet::new();
        for row in before.iter().chain(after.iter()) {
            self.trace(at, id, row, &mut driving);
        }
        Some(Pending { at, id: id.to_string(), before, after, driving: driving.into_iter().collect(), next: 0 })
    }

    /// Applies `pending` to its next `batch` driving rows: their outputs with the input row as
    /// it was and as it is, the difference into `changes`. The row is left as it is now, so
    /// reads between steps see the change; `true` once every driving row is done. A change
    /// that reaches many rows (a category renamed under 100 000 products) so costs memory
    /// for one batch, and the task can write and yield between batches.
    pub fn step(&mut self, pending: &mut Pending, batch: usize, changes: &mut Vec<Change>) -> bool {
        let end = pending.driving.len().min(pending.next.saturating_add(batch));
        let driving = &pending.driving[pending.next..end];
        let (at, id) = (pending.at, pending.id.as_str());
        if pending.next == 0 {
            // The row changes now, for every driving row it reaches: what reads kept of
            // those, perhaps since `begin`, is out of date (between steps, reads see the row as
            // it is now, and keep that).
            let computed = self.computed_mut();
            for driving_id in &pending.driving {
                computed.forget(driving_id);
            }
        }
        let mut old = Vec::new();
        if !driving.is_empty() {
            match &pending.before {
                Some(before) => self.inputs[at].insert(id, before.clone()),
                None => self.inputs[at].remove(id),
            }
            for driving_id in driving {
                self.outputs_of(driving_id, &mut old);
            }
        }
        match &pending.after {
            Some(after) => self.inputs[at].insert(id, after.clone()),
            None => self.inputs[at].remove(id),
        }
        let mut new = Vec::new();
        for driving_id in driving {
            self.outputs_of(driving_id, &mut new);
        }
        let new_keys: BTreeMap<&str, &Arc<Value>> = new.iter().map(|(key, row)| (key.as_str(), row)).collect();
        let old_keys: BTreeMap<&str, &Arc<Value>> = old.iter().map(|(key, row)| (key.as_str(), row)).collect();
        for (key, row) in &old {
            if !new_keys.contains_key(key.as_str()) {
                changes.push(Change {
                    key: key.clone(),
                    row: row.clone(),
                    is_final: false,
                    removed: true,
                    before: None,
                });
            }
        }
        for (key, row) in &new {
            let was = old_keys.get(key.as_str());
            if was.is_none_or(|old| *old != row) {
                let before = was.map(|old| (*old).clone());
                changes.push(Change { key: key.clone(), row: row.clone(), is_final: false, removed: false, before });
            }
        }
        self.outputs = (self.outputs + new.len()).saturating_sub(old.len());
        pending.next = end;
        pending.next >= pending.driving.len()
    }

    /// Adds to `driving` the ids of the driving rows whose outputs row `id` of input `at`
    /// (as `row`) can be part of.
    fn trace(&self, at: usize, id: &str, row: &Value, driving: &mut BTreeSet<String>) {
        if at == 0 {
            driving.insert(id.to_string());
            return;
        }
        let on = self.def.inputs[at].on.as_ref().expect("validated: every input after the first has ON");
        let Some(key) = JoinKey::of(&eval_on(&on.key, row)) else { return };
        let mut parents = Vec::new();
        self.inputs[on.parent].find(self.ups[at], &on.parent_key, &key, &mut parents);
        for (parent_id, parent_row) in parents {
            self.trace(on.parent, parent_id, parent_row, driving);
        }
    }

    /// Appends the output rows of driving row `id` (none if it is not there), with their keys.
    fn outputs_of(&self, id: &str, out: &mut Vec<(String, Arc<Value>)>) {
        let Some((id, row)) = self.inputs[0].rows.get_key_value(id) else { return };
        let mut combos: Vec<Combo> = vec![vec![Some((id.as_str(), row))]];
        let mut found = Vec::new();
        for (at, input) in self.def.inputs.iter().enumerate().skip(1) {
            let on = input.on.as_ref().expect("validated: every input after the first has ON");
            let mut next = Vec::with_capacity(combos.len());
            for combo in combos {
                let mut matched = false;
                if let Some((_, parent)) = combo[on.parent]
                    && let Some(key) = JoinKey::of(&eval_on(&on.parent_key, parent))
                {
                    found.clear();
                    self.inputs[at].find(self.probes[at], &on.key, &key, &mut found);
                    for &(row_id, row) in &found {
                        let mut with = combo.clone();
                        with.push(Some((row_id, row)));
                        if let Some(residual) = &on.residual
                            && !is_true(&eval_on(residual, &self.joined(&with)))
                        {
                            continue;
                        }
                        next.push(with);
                        matched = true;
                    }
                }
                if !matched && on.kind == JoinKind::Left {
                    let mut with = combo;
                    with.push(None);
                    next.push(with);
                }
            }
            combos = next;
            if combos.is_empty() {
                return;
            }
        }
        for combo in combos {
            let joined = self.joined(&combo);
            if let Some(filter) = &self.def.filter
                && !is_true(&eval_on(filter, &joined))
            {
                continue;
            }
            let parts: Vec<&str> = self.key_parts.iter().map(|&at| combo[at].map_or("", |(id, _)| id)).collect();
            out.push((output_key(&parts), Arc::new(self.project(&joined))));
        }
    }

    /// The joined row expressions read: each input's row under its alias (null where it
    /// matched none).
    fn joined(&self, combo: &Combo) -> Value {
        let mut joined = Map::with_capacity(combo.len());
        for (input, row) in self.inputs.iter().zip(combo) {
            joined.insert(input.alias.clone(), row.map_or(Value::Null, |(_, row)| Value::clone(row)));
        }
        Value::Object(joined)
    }

    /// An output row: the SELECT list over the joined row.
    fn project(&self, joined: &Value) -> Value {
        let columns = self.def.columns.iter().map(|column| (column.name.clone(), eval_on(&column.expr, joined)));
        Value::Object(columns.collect())
    }

    /// The rows of output key `key` (one, or none).
    pub fn rows(&self, key: &str) -> Vec<Value> {
        let outputs = self.computed_of(&driving_id(key, self.key_parts.len()));
        outputs.iter().filter(|output| output.key == key).map(|output| Value::clone(&output.row)).collect()
    }

    /// Output rows in order after key `after`, at most `limit`: by driving row, then by key.
    pub fn page(&self, after: Option<&str>, limit: usize) -> Vec<(String, Vec<Value>)> {
        let mut page = Vec::new();
        self.each_output(after, limit, |output| page.push((output.key.clone(), vec![Value::clone(&output.row)])));
        page
    }

    /// [`JoinState::page`] with each row as it is kept for reads, its JSON beside it.
    pub fn page_rows(&self, after: Option<&str>, limit: usize) -> Vec<OutputRow> {
        let mut page = Vec::new();
        self.each_output(after, limit, |output| page.push(output.clone()));
        page
    }

    /// Calls `take` with each output row in order after key `after`, at most `limit`.
    fn each_output(&self, after: Option<&str>, limit: usize, mut take: impl FnMut(&OutputRow)) {
        if limit == 0 {
            return;
        }
        let start = after.map(|after| driving_id(after, self.key_parts.len()));
        let range = match &start {
            Some(start) => self.inputs[0].rows.range::<str, _>((Bound::Included(start.as_str()), Bound::Unbounded)),
            None => self.inputs[0].rows.range::<str, _>(..),
        };
        let mut taken = 0;
        for (id, _) in range {
            for output in self.computed_of(id).iter() {
                if let (Some(after), Some(start)) = (after, &start)
                    && id == start
                    && output.key.as_str() <= after
                {
                    continue;
                }
                take(output);
                taken += 1;
                if taken == limit {
                    return;
                }
            }
        }
    }

    /// The outputs of driving row `id` in key order, as kept since the last change that
    /// reached it, or computed now (and kept, while the view keeps less than
    /// [`COMPUTED_BYTES_MAX`]).
    fn computed_of(&self, id: &str) -> Arc<[OutputRow]> {
        if let Some(rows) = self.computed.lock().expect("computed rows lock").by_driving.get(id) {
            return rows.clone();
        }
        let mut outputs = Vec::new();
        self.outputs_of(id, &mut outputs);
        outputs.sort_by(|left, right| left.0.cmp(&right.0));
        let rows: Arc<[OutputRow]> = outputs
            .into_iter()
            .map(|(key, row)| {
                let json = Bytes::from(serde_json::to_vec(&*row).expect("a JSON value serializes"));
                OutputRow { key, row, json }
            })
            .collect();
        let bytes = computed_bytes(&rows);
        let mut computed = self.computed.lock().expect("computed rows lock");
        if computed.bytes + bytes <= COMPUTED_BYTES_MAX && !computed.by_driving.contains_key(id) {
            computed.bytes += bytes;
            computed.by_driving.insert(id.to_string(), rows.clone());
        }
        rows
    }

    fn computed_mut(&mut self) -> &mut Computed {
        self.computed.get_mut().expect("computed rows lock")
    }

    /// Bytes of output rows kept for reads (see [`COMPUTED_BYTES_MAX`]).
    pub fn computed_bytes(&self) -> usize {
        self.computed.lock().expect("computed rows lock").bytes
    }

    /// Output rows there are now.
    pub fn output_count(&self) -> usize {
        self.outputs
    }

    /// Rows and memory per input.
    pub fn inputs(&self) -> Vec<InputStatus> {
        self.inputs
            .iter()
            .zip(&self.def.inputs)
            .map(|(arrangement, input)| InputStatus {
                alias: arrangement.alias.clone(),
                source: input.source.clone(),
                rows: arrangement.rows.len(),
                bytes: arrangement.bytes,
            })
            .collect()
    }

    /// The view's cap on [`JoinState::bytes`], if it has one.
    pub fn state_bytes_max(&self) -> Option<u64> {
        self.def.state_bytes_max
    }

    /// The memory the state takes, estimated.
    pub fn bytes(&self) -> usize {
        self.inputs.iter().map(|input| input.bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{JoinColumn, JoinInput, JoinOn};
    use super::*;
    use crate::view::expr::{BinaryOp, Step};

    fn path(steps: &[&str]) -> Expr {
        Expr::Path { path: steps.iter().map(|step| Step::Field(step.to_string())).collect() }
    }

    fn input(alias: &str, on: Option<JoinOn>) -> JoinInput {
        JoinInput { alias: alias.into(), source: alias.into(), id_field: "id".into(), on }
    }

    fn on(kind: JoinKind, parent: usize, key: &str, parent_key: &str) -> Option<JoinOn> {
        Some(JoinOn { kind, parent, key: path(&[key]), parent_key: path(&[parent_key]), residual: None })
    }

    /// orders o JOIN customers c ON c.id = o.customer LEFT JOIN reviews r ON r.order = o.id
    fn orders_view() -> JoinDef {
        JoinDef {
            inputs: vec![
                input("o", None),
                input("c", on(JoinKind::Inner, 0, "id", "customer")),
                input("r", on(JoinKind::Left, 0, "order", "id")),
            ],
            filter: Some(Expr::Binary {
                operator: BinaryOp::NotEq,
                left: Box::new(path(&["o", "status"])),
                right: Box::new(Expr::Literal { value: json!("void") }),
            }),
            columns: vec![
                JoinColumn { name: "order".into(), expr: path(&["o", "id"]) },
                JoinColumn { name: "name".into(), expr: path(&["c", "name"]) },
                JoinColumn { name: "stars".into(), expr: path(&["r", "stars"]) },
            ],
            state_bytes_max: None,
        }
    }

    fn keys(changes: &[Change]) -> Vec<(String, bool)> {
        changes.iter().map(|change| (change.key.clone(), change.removed)).collect()
    }

    #[test]
    fn changes_of_any_input_change_exactly_the_joined_rows_they_reach() {
        let def = orders_view();
        def.validate().unwrap();
        let mut state = JoinState::new(&def);
        assert_eq!(state.key_parts, vec![0, 2], "reviews can match several rows: their id is in the key");
        let mut changes = Vec::new();
        state.apply(0, "o1", Some(&json!({"id": "o1", "customer": "c1", "status": "paid", "note": "x"})), &mut changes);
        assert!(changes.is_empty(), "no customer yet: the inner join matches nothing");
        state.apply(1, "c1", Some(&json!({"id": "c1", "name": "Ada"})), &mut changes);
        assert_eq!(keys(&changes), [("o1:".to_string(), false)]);
        assert_eq!(*changes[0].row, json!({"order": "o1", "name": "Ada", "stars": null}));
        changes.clear();
        // A review: the left join's null row goes, the matched one comes.
        state.apply(2, "r1", Some(&json!({"id": "r1", "order": "o1", "stars": 5})), &mut changes);
        assert_eq!(keys(&changes), [("o1:".to_string(), true), ("o1:r1".to_string(), false)]);
        changes.clear();
        state.apply(2, "r2", Some(&json!({"id": "r2", "order": "o1", "stars": 3})), &mut changes);
        assert_eq!(keys(&changes), [("o1:r2".to_string(), false)]);
        changes.clear();
        // The customer renamed: both joined rows change.
        state.apply(1, "c1", Some(&json!({"id": "c1", "name": "Ada L."})), &mut changes);
        assert_eq!(keys(&changes), [("o1:r1".to_string(), false), ("o1:r2".to_string(), false)]);
        assert_eq!(state.output_count(), 2);
        changes.clear();
        // A field the view does not read changes nothing.
        state.apply(0, "o1", Some(&json!({"id": "o1", "customer": "c1", "status": "paid", "note": "y"})), &mut changes);
        assert!(changes.is_empty());
        // The WHERE turns false: both rows go.
        state.apply(0, "o1", Some(&json!({"id": "o1", "customer": "c1", "status": "void"})), &mut changes);
        assert_eq!(keys(&changes), [("o1:r1".to_string(), true), ("o1:r2".to_string(), true)]);
        assert_eq!(state.output_count(), 0);
        changes.clear();
        state.apply(0, "o1", Some(&json!({"id": "o1", "customer": "c1", "status": "paid"})), &mut changes);
        assert_eq!(state.rows("o1:r2"), vec![json!({"order": "o1", "name": "Ada L.", "stars": 3})]);
        assert!(state.rows("o1:").is_empty());
        let page = state.page(None, 10);
        assert_eq!(page.iter().map(|(key, _)| key.as_str()).collect::<Vec<_>>(), ["o1:r1", "o1:r2"]);
        assert_eq!(state.page(Some("o1:r1"), 10).len(), 1);
        changes.clear();
        // Deleting the customer removes every row through it; a key of the wrong type joins nothing.
        state.apply(1, "c1", None, &mut changes);
        assert_eq!(keys(&changes), [("o1:r1".to_string(), true), ("o1:r2".to_string(), true)]);
        changes.clear();
        state.apply(1, "1", Some(&json!({"id": "1", "name": "text id"})), &mut changes);
        state.apply(0, "o2", Some(&json!({"id": "o2", "customer": 1, "status": "paid"})), &mut changes);
        assert!(changes.is_empty(), "{changes:?}");
        let status = state.inputs();
        assert_eq!(status.iter().map(|input| input.rows).collect::<Vec<_>>(), [2, 1, 2]);
        assert!(status.iter().all(|input| input.bytes > 0));
    }

    #[test]
    fn a_change_reaching_many_rows_is_applied_a_batch_at_a_time_with_the_same_result() {
        let def = orders_view();
        let (mut whole, mut batched) = (JoinState::new(&def), JoinState::new(&def));
        let mut ignored = Vec::new();
        for state in [&mut whole, &mut batched] {
            state.apply(1, "c1", Some(&json!({"id": "c1", "name": "Ada"})), &mut ignored);
            for i in 0..25 {
                let order = json!({"id": format!("o{i:02}"), "customer": "c1", "status": "paid"});
                state.apply(0, &format!("o{i:02}"), Some(&order), &mut ignored);
            }
        }
        let renamed = json!({"id": "c1", "name": "Ada L."});
        let mut all = Vec::new();
        // Read before: the batched state keeps what reads computed.
        assert_eq!(batched.page(None, 100).len(), 25);
        whole.apply(1, "c1", Some(&renamed), &mut all);
        assert_eq!(all.len(), 25);
        let mut pending = batched.begin(1, "c1", Some(&renamed)).unwrap();
        assert_eq!(pending.reach(), 25);
        // Until the first step the rows are as they were (and a read keeps them so).
        assert_eq!(batched.rows("o24:")[0]["name"], "Ada");
        let (mut steps, mut batches) = (0, Vec::new());
        loop {
            let mut changes = Vec::new();
            let done = batched.step(&mut pending, 10, &mut changes);
            steps += 1;
            assert!(changes.len() <= 10);
            // Between steps reads see the change, in the rows a step reached and the others.
            assert_eq!(batched.rows("o00:")[0]["name"], "Ada L.");
            assert_eq!(batched.rows("o24:")[0]["name"], "Ada L.");
            batches.extend(changes);
            if done {
                break;
            }
        }
        assert_eq!(steps, 3);
        assert_eq!(batches, all);
        assert_eq!(batched.page(None, 100), whole.page(None, 100));
        // The JSON kept beside each row is that row's.
        for row in batched.page_rows(None, 100) {
            assert_eq!(serde_json::from_slice::<Value>(&row.json).unwrap(), *row.row);
            assert_eq!(row.row["name"], "Ada L.");
        }
        assert_eq!(batched.output_count(), 25);
        // A change reaching no driving row still lands.
        let mut pending = batched.begin(1, "c2", Some(&json!({"id": "c2", "name": "Bo"}))).unwrap();
        assert_eq!(pending.reach(), 0);
        assert!(batched.step(&mut pending, 10, &mut ignored));
        assert_eq!(batched.inputs()[1].rows, 2);
    }

    #[test]
    fn numbers_join_by_value_and_null_joins_nothing() {
        assert_eq!(JoinKey::of(&json!(1)), JoinKey::of(&json!(1.0)));
        assert_ne!(JoinKey::of(&json!(1)), JoinKey::of(&json!("1")));
        assert_eq!(JoinKey::of(&json!(-0.0)), JoinKey::of(&json!(0)));
        assert_eq!(JoinKey::of(&json!(null)), None);
        assert_eq!(JoinKey::of(&json!([1, 2])), JoinKey::of(&json!([1, 2])));
    }
}
