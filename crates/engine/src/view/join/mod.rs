//! Joined views: `CREATE VIEW v AS SELECT … FROM a JOIN b ON … LEFT JOIN c ON …`, kept live
//! over tables and other views, delta-style.
//!
//! Each input is kept as an *arrangement*: its rows by id (the fields the view reads of them)
//! and an index per join key that is not the id. An input after the first is joined to one
//! earlier input, its *parent*, by an equality of an expression of its own row and one of the
//! parent's row. A change of any input is traced back to the rows of the first input (the
//! *driving* rows) whose output it touches, through the parents' indexes; those driving rows'
//! outputs are computed before and after the change, by probing the other inputs, and the
//! difference is what the view emits. No joined row is stored: a read computes its row from
//! the arrangements, as a change does.
//!
//! - `state`: the arrangements, the outputs of a driving row, a change in and changes out.
//! - `run`: the view's task: every input's rows first, then their changes, as they come.
//! - this module: what a joined view is (`JoinDef`, in the catalog), and the keys of its rows.

mod run;
pub mod state;

pub(crate) use run::{JoinSource, Joined};

use serde::{Deserialize, Serialize};

use super::expr::{Expr, Step};

/// The column a stream input's rows have its records' keys in (beside their values' fields).
pub const STREAM_KEY_COLUMN: &str = "key";

/// What joins an input to an earlier one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JoinKind {
    /// `JOIN`: an earlier row with no match gives no output row.
    Inner,
    /// `LEFT JOIN`: an earlier row with no match is kept, this input's columns null.
    Left,
}

/// `ON key = parent_key [AND residual]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinOn {
    pub kind: JoinKind,
    /// The earlier input this one joins (its index in [`JoinDef::inputs`]).
    pub parent: usize,
    /// An expression of this input's row alone (its paths start at the row's fields).
    pub key: Expr,
    /// An expression of the parent's row alone.
    pub parent_key: Expr,
    /// The rest of the ON condition, over the joined row (paths start with an input's alias).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual: Option<Expr>,
}

/// One input of a joined view: a table, a view without windows, or a stream read as a table
/// (the newest record of each key, a tombstone deleting it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinInput {
    /// The name its columns are qualified with (`o` in `orders o`, else the source's name).
    pub alias: String,
    pub source: String,
    /// The field that is a row's id: a table's primary key, a view's key column.
    pub id_field: String,
    /// `None` for the first input, which drives the view: one output row per match of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<JoinOn>,
}

impl JoinInput {
    /// Whether this input matches at most one row per parent row: it is joined on its id.
    pub fn to_one(&self) -> bool {
        self.on.as_ref().is_some_and(|on| is_field(&on.key, &self.id_field))
    }
}

/// One column of a joined view's rows: `expr AS name`, over the joined row (`alias.*` is
/// expanded into the input's columns when the view is defined, as Postgres does).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinColumn {
    pub name: String,
    pub expr: Expr,
}

/// A joined view, as the SQL front end resolves it: every path of `filter`, of the columns
/// and of the residual conditions starts with an input's alias.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JoinDef {
    /// The driving input first; each later one joins an earlier one.
    pub inputs: Vec<JoinInput>,
    /// WHERE, over the joined row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Expr>,
    pub columns: Vec<JoinColumn>,
    /// `WITH (state_bytes_max = …)`: the view stops (reads answer `view_state_limit`) once
    /// its state's estimate passes this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_bytes_max: Option<u64>,
}

impl JoinDef {
    /// Every source the view reads, in input order (a source may appear twice).
    pub fn sources(&self) -> impl Iterator<Item = &str> {
        self.inputs.iter().map(|input| input.source.as_str())
    }

    /// The names of the output columns.
    pub fn column_names(&self) -> Vec<String> {
        self.columns.iter().map(|column| column.name.clone()).collect()
    }

    /// Whether an output row is keyed by the driving row's id alone: every join is to one row.
    pub fn keyed_by_driving_row(&self) -> bool {
        self.inputs.iter().skip(1).all(JoinInput::to_one)
    }

    /// Checks what the engine relies on: one driving input, parents before their children,
    /// distinct aliases and column names.
    pub fn validate(&self) -> Result<(), String> {
        let Some(first) = self.inputs.first() else { return Err("a joined view reads at least one input".into()) };
        if first.on.is_some() {
            return Err("the first input of a join has no ON condition".into());
        }
        for (at, input) in self.inputs.iter().enumerate() {
            if self.inputs[..at].iter().any(|earlier| earlier.alias == input.alias) {
                return Err(format!("two inputs are named {}; name one with AS", input.alias));
            }
            match &input.on {
                None if at > 0 => return Err(format!("{} is joined without an ON condition", input.alias)),
                Some(on) if on.parent >= at => {
                    return Err(format!("{} is joined to an input that comes after it", input.alias));
                }
                _ => {}
            }
        }
        for (at, column) in self.columns.iter().enumerate() {
            if self.columns[..at].iter().any(|earlier| earlier.name == column.name) {
                return Err(format!("two columns are named {}; name one with AS", column.name));
            }
        }
        if self.columns.is_empty() {
            return Err("a joined view selects at least one column".into());
        }
        Ok(())
    }

    /// The fields of input `at`'s rows the view reads: `None` when it reads the whole row (the
    /// row itself as a value).
    pub fn fields_read(&self, at: usize) -> Option<Vec<String>> {
        let input = &self.inputs[at];
        let mut fields = vec![input.id_field.clone()];
        let mut whole = false;
        let mut own = |path: &[Step]| match path.first() {
            Some(Step::Field(field)) => {
                if !fields.contains(field) {
                    fields.push(field.clone());
                }
            }
            _ => whole = true,
        };
        if let Some(on) = &input.on {
            on.key.visit_paths(&mut own);
        }
        for child in &self.inputs {
            if let Some(on) = &child.on
                && on.parent == at
            {
                on.parent_key.visit_paths(&mut own);
            }
        }
        let mut joined = |path: &[Step]| match path {
            [Step::Field(alias), rest @ ..] if *alias == input.alias => own(rest),
            _ => {}
        };
        for input in &self.inputs {
            if let Some(residual) = input.on.as_ref().and_then(|on| on.residual.as_ref()) {
                residual.visit_paths(&mut joined);
            }
        }
        if let Some(filter) = &self.filter {
            filter.visit_paths(&mut joined);
        }
        for column in &self.columns {
            column.expr.visit_paths(&mut joined);
        }
        (!whole).then_some(fields)
    }
}

/// Whether `expr` is the top-level field `field`.
fn is_field(expr: &Expr, field: &str) -> bool {
    matches!(expr, Expr::Path { path } if matches!(path.as_slice(), [Step::Field(name)] if name == field))
}

/// The key of an output row from its parts: the driving row's id, then the id of the row of
/// each input that can match several (empty where it matched none). One part is itself; more
/// are joined by `:`, with `%` and `:` inside a part written `%25` and `%3A`, so that a key
/// comes apart into its parts again.
pub fn output_key(parts: &[&str]) -> String {
    if let [only] = parts {
        return (*only).to_string();
    }
    let mut key = String::new();
    for (at, part) in parts.iter().enumerate() {
        if at > 0 {
            key.push(':');
        }
        for c in part.chars() {
            match c {
                '%' => key.push_str("%25"),
                ':' => key.push_str("%3A"),
                c => key.push(c),
            }
        }
    }
    key
}

/// The driving row's id in an output key of a view whose keys have `parts` parts.
pub fn driving_id(key: &str, parts: usize) -> String {
    if parts <= 1 {
        return key.to_string();
    }
    let first = key.split(':').next().unwrap_or("");
    let mut id = String::with_capacity(first.len());
    let mut rest = first;
    while let Some(at) = rest.find('%') {
        id.push_str(&rest[..at]);
        let escaped = &rest[at..];
        let (c, skip) = if escaped.starts_with("%3A") {
            (':', 3)
        } else if escaped.starts_with("%25") {
            ('%', 3)
        } else {
            ('%', 1)
        };
        id.push(c);
        rest = &escaped[skip..];
    }
    id.push_str(rest);
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_keys_come_apart_into_their_driving_id() {
        assert_eq!(output_key(&["a:b"]), "a:b");
        assert_eq!(driving_id("a:b", 1), "a:b");
        for parts in [["o1", "r1"], ["o:1", "r%2"], ["", "x"], ["%3A", ""], ["%25%3A:", "%"]] {
            let key = output_key(&parts);
            assert_eq!(key.split(':').count(), 2, "{key}");
            assert_eq!(driving_id(&key, 2), parts[0], "{key}");
        }
        assert_eq!(output_key(&["o:1", "r%2"]), "o%3A1:r%252");
    }
}
