//! What a transform is (`TransformDef`, as the catalog stores it): its branches (one per
//! `SELECT` of a `UNION ALL`), what each makes of one source record (none, one, or one per
//! element of an `UNNEST`; with the table rows it joins, looked up by primary key), and the
//! header that names the source record of every output.

use std::sync::Arc;

use bytes::Bytes;
use onehop_log::{NewRecord, Record, Text};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::super::JoinKind;
use super::super::Start;
use super::super::expr::{Expr, Input, is_true, key_text};

/// The header naming the source record of a transform's output record:
/// `[{branch}/]{partition}:{offset}[#{element}]` (the branch of a `UNION ALL` from 0, left out
/// for the first; the element of an `UNNEST` from 0, left out without one).
pub const SOURCE_HEADER: &str = "onehop-source";

/// A transform, as `CREATE STREAM name AS SELECT … FROM source [CROSS JOIN UNNEST(…)] [WHERE …]
/// [UNION ALL SELECT …]` defines it: every record of a branch's source that passes its filter
/// becomes one record of the stream `name` (one per element with an `UNNEST`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformDef {
    pub name: String,
    /// The first `SELECT` (stored flat, as transforms were before `UNION ALL`).
    #[serde(flatten)]
    pub first: TransformBranch,
    /// The `SELECT`s after `UNION ALL`, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub union: Vec<TransformBranch>,
    /// Where the transform starts in its sources when it is created.
    #[serde(default = "latest")]
    pub start: Start,
    /// How an output record's value is written.
    #[serde(default, skip_serializing_if = "ValueFormat::is_json")]
    pub value_format: ValueFormat,
    /// The statement as the user wrote it, for DESCRIBE.
    pub sql: String,
}

/// One `SELECT` of a transform.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TransformBranch {
    pub source: String,
    /// WHERE: records (or elements) for which this is not `true` are skipped.
    pub filter: Option<Expr>,
    /// The computed columns of the output value (a JSON object), in order. With `all_fields`
    /// they are set over the source value's fields (a column replaces a field of its name).
    pub columns: Vec<(String, Expr)>,
    /// `SELECT *`: the output starts from the source value's fields (a value that is not an
    /// object contributes none).
    pub all_fields: bool,
    /// A column `_key`: the output record's key ([`key_text`] of it; null: no key); `None`
    /// keeps the source key.
    pub key: Option<Expr>,
    /// A column `_subject`: the output record's subject (as text; null or a text that is not a
    /// valid subject: none); `None` keeps the source subject.
    pub subject: Option<Expr>,
    /// `CROSS JOIN UNNEST(expr)`: one output per element of the array `expr` gives (none for
    /// null, an empty array or a value that is not an array), each evaluated with that element
    /// ([`crate::view::expr::RecordField::Element`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unnest: Option<Expr>,
    /// With `lookups`: the name the source record's value has in the joined row (`o` in `FROM
    /// orders o`), whose paths (in every expression of the branch) start with an alias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// `JOIN table t ON t.id = …`, in order: the table rows each record is enriched with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lookups: Vec<Lookup>,
}

impl TransformBranch {
    /// `SELECT * FROM source`: every record as it is, its key and subject kept.
    pub fn all_of(source: &str) -> TransformBranch {
        TransformBranch {
            source: source.to_string(),
            filter: None,
            columns: Vec::new(),
            all_fields: true,
            key: None,
            subject: None,
            unnest: None,
            alias: None,
            lookups: Vec::new(),
        }
    }
}

/// One table a transform's records are enriched with: for each record, the row whose primary
/// key `key` gives, as the table holds it when the record is read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lookup {
    /// The name its row has in the joined row (`c` in `JOIN customers c`).
    pub alias: String,
    pub table: String,
    /// `JOIN` drops a record no row matches; `LEFT JOIN` keeps it, the row null.
    pub kind: JoinKind,
    /// Over the joined row so far (the record's value and the rows of earlier lookups): the
    /// primary key of the row to take, as text ([`key_text`]); null matches none.
    pub key: Expr,
    /// The rest of the ON condition, over the joined row with this row in: a row for which it
    /// is not true is no match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual: Option<Expr>,
}

/// How a transform finds a lookup's row: `(lookup index in its branch, primary key)` to the
/// row's document, if the table has one.
pub type FindRow<'a> = &'a dyn Fn(usize, &str) -> Option<Arc<Map<String, Value>>>;

/// How a transform writes its output values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueFormat {
    /// A JSON object of the columns.
    #[default]
    Json,
    /// The one column's value as text: a string as its UTF-8 bytes, null as no value, anything
    /// else as its JSON text.
    Text,
}

impl ValueFormat {
    fn is_json(&self) -> bool {
        *self == ValueFormat::Json
    }
}

fn latest() -> Start {
    Start::Latest
}

/// One output of a transform: the record, where it came from (as its header names), and
/// whether its computed subject (if any) was valid.
pub struct Output {
    pub record: NewRecord,
    pub source: SourcePosition,
    pub subject_valid: bool,
}

impl TransformDef {
    /// Its branches, the first first.
    pub fn branches(&self) -> impl Iterator<Item = &TransformBranch> {
        std::iter::once(&self.first).chain(&self.union)
    }

    /// The branch `index` (from 0).
    pub fn branch(&self, index: usize) -> &TransformBranch {
        if index == 0 { &self.first } else { &self.union[index - 1] }
    }

    /// The streams it reads, once each, in the order of its branches.
    pub fn sources(&self) -> Vec<&str> {
        let mut sources: Vec<&str> = Vec::new();
        for branch in self.branches() {
            if !sources.contains(&branch.source.as_str()) {
                sources.push(&branch.source);
            }
        }
        sources
    }

    /// The tables its branches look rows up in, once each.
    pub fn tables(&self) -> Vec<&str> {
        let mut tables: Vec<&str> = Vec::new();
        for lookup in self.branches().flat_map(|branch| &branch.lookups) {
            if !tables.contains(&lookup.table.as_str()) {
                tables.push(&lookup.table);
            }
        }
        tables
    }

    /// Whether it reads `name`, as a source or as a table it looks rows up in.
    pub fn reads(&self, name: &str) -> bool {
        self.sources().contains(&name) || self.tables().contains(&name)
    }

    /// What makes a definition one the engine cannot run, said as the SQL front end would.
    pub fn check(&self) -> Result<(), String> {
        for branch in self.branches() {
            if branch.lookups.is_empty() {
                continue;
            }
            let Some(alias) = &branch.alias else {
                return Err(format!("the records of {} are joined to tables without an alias", branch.source));
            };
            if branch.unnest.is_some() {
                return Err("UNNEST and JOIN in one SELECT: split the records in one transform and enrich its \
                            stream in another"
                    .into());
            }
            for (at, lookup) in branch.lookups.iter().enumerate() {
                if lookup.alias == *alias || branch.lookups[..at].iter().any(|earlier| earlier.alias == lookup.alias) {
                    return Err(format!("two inputs are named {}; name one with AS", lookup.alias));
                }
            }
        }
        if self.value_format == ValueFormat::Text {
            for branch in self.branches() {
                if branch.all_fields || branch.columns.len() != 1 {
                    return Err("value_format = 'text' writes one column: select exactly one (besides _key and \
                                _subject), without *"
                        .into());
                }
            }
        }
        Ok(())
    }

    /// The row branch `branch` evaluates its expressions over for `record` (whose value parsed
    /// is `value`): the value itself without lookups; else an object of the value under the
    /// branch's alias and each lookup's row (`find` gives them; null for a `LEFT JOIN` that
    /// matched none) under its alias. `None` when a `JOIN` matched no row: the record gives
    /// nothing.
    pub fn joined(
        &self,
        branch: usize,
        record: &Record,
        partition: u32,
        value: Value,
        find: FindRow<'_>,
    ) -> Option<Value> {
        let def = self.branch(branch);
        let Some(alias) = def.alias.as_ref().filter(|_| !def.lookups.is_empty()) else { return Some(value) };
        let mut joined = Map::with_capacity(def.lookups.len() + 1);
        joined.insert(alias.clone(), value);
        let mut joined = Value::Object(joined);
        for (at, lookup) in def.lookups.iter().enumerate() {
            let key = lookup.key.eval(&Input::of(record, partition, &joined));
            let row = match key {
                Value::Null => None,
                key => find(at, &key_text(&key)),
            };
            let mut matched = row.is_some();
            let Value::Object(fields) = &mut joined else { unreachable!("the joined row is an object") };
            fields.insert(lookup.alias.clone(), row.map_or(Value::Null, |row| Value::Object((*row).clone())));
            if matched && let Some(residual) = &lookup.residual {
                matched = is_true(&residual.eval(&Input::of(record, partition, &joined)));
                if !matched {
                    let Value::Object(fields) = &mut joined else { unreachable!("the joined row is an object") };
                    fields.insert(lookup.alias.clone(), Value::Null);
                }
            }
            if !matched && lookup.kind == JoinKind::Inner {
                return None;
            }
        }
        Some(joined)
    }

    /// Appends to `out` what branch `branch` makes of `record` (whose value parsed, or joined
    /// by [`TransformDef::joined`], is in `input`): nothing when the filter skips it, one
    /// output, or one per element of the branch's `UNNEST`. Deterministic: the same record
    /// (and rows) give the same outputs every time.
    pub fn apply(&self, branch: usize, input: &Input, record: &Record, out: &mut Vec<Output>) {
        let def = self.branch(branch);
        let Some(unnest) = &def.unnest else {
            out.extend(self.output(branch, input, record, None));
            return;
        };
        let Value::Array(elements) = unnest.eval(input) else { return };
        for (index, element) in elements.iter().enumerate() {
            let input = Input { element: Some((element, index as u64 + 1)), ..*input };
            out.extend(self.output(branch, &input, record, Some(index as u32)));
        }
    }

    fn output(&self, branch: usize, input: &Input, record: &Record, element: Option<u32>) -> Option<Output> {
        let def = self.branch(branch);
        if let Some(filter) = &def.filter
            && !is_true(&filter.eval(input))
        {
            return None;
        }
        let key = match &def.key {
            None => record.key.clone(),
            Some(expr) => match expr.eval(input) {
                Value::Null => None,
                value => Some(Bytes::from(key_text(&value))),
            },
        };
        let mut subject_valid = true;
        let subject = match &def.subject {
            None => record.subject.clone(),
            Some(expr) => match expr.eval(input) {
                Value::Null => None,
                value => {
                    let text = key_text(&value);
                    subject_valid = crate::subject::validate_subject(&text).is_ok();
                    subject_valid.then(|| text.into())
                }
            },
        };
        let mut headers = record.headers.to_vec();
        // Its source position is this record's own; a keyed write's tag names the source's write.
        headers.retain(|(name, _)| name != SOURCE_HEADER && name != crate::idempotency::IDEMPOTENCY_HEADER);
        let source =
            SourcePosition { branch: branch as u32, partition: input.partition, offset: record.offset, element };
        headers.push((Text::from_static(SOURCE_HEADER), Some(Bytes::from(source.to_string()))));
        let value = match self.value_format {
            ValueFormat::Json => {
                // `*` (or `alias.*`): the source value's fields.
                let source = match &def.alias {
                    Some(alias) if !def.lookups.is_empty() => input.value.get(alias).unwrap_or(&Value::Null),
                    _ => input.value,
                };
                let mut fields = match (def.all_fields, source) {
                    (true, Value::Object(fields)) => fields.clone(),
                    _ => Map::with_capacity(def.columns.len()),
                };
                for (name, expr) in &def.columns {
                    fields.insert(name.clone(), expr.eval(input));
                }
                Some(serde_json::to_vec(&Value::Object(fields)).expect("a JSON object serializes"))
            }
            ValueFormat::Text => match def.columns.first().map(|(_, expr)| expr.eval(input)) {
                None | Some(Value::Null) => None,
                Some(Value::String(text)) => Some(text.into_bytes()),
                Some(other) => Some(serde_json::to_vec(&other).expect("a JSON value serializes")),
            },
        };
        let record =
            NewRecord { timestamp_ms: Some(record.timestamp_ms), key, subject, headers, value: value.map(Bytes::from) };
        Some(Output { record, source, subject_valid })
    }
}

/// Where an output record came from: a record of a branch's source, and the element of the
/// branch's `UNNEST` if it has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SourcePosition {
    pub branch: u32,
    pub partition: u32,
    pub offset: u64,
    pub element: Option<u32>,
}

impl std::fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.branch > 0 {
            write!(f, "{}/", self.branch)?;
        }
        write!(f, "{}:{}", self.partition, self.offset)?;
        if let Some(element) = self.element {
            write!(f, "#{element}")?;
        }
        Ok(())
    }
}

impl SourcePosition {
    /// The position an output record names in its `onehop-source` header.
    pub fn of(record: &Record) -> Option<SourcePosition> {
        let value = record.headers.get_last(SOURCE_HEADER)?;
        SourcePosition::parse(std::str::from_utf8(value).ok()?)
    }

    fn parse(text: &str) -> Option<SourcePosition> {
        let (branch, rest) = match text.split_once('/') {
            Some((branch, rest)) => (branch.parse().ok()?, rest),
            None => (0, text),
        };
        let (rest, element) = match rest.split_once('#') {
            Some((rest, element)) => (rest, Some(element.parse().ok()?)),
            None => (rest, None),
        };
        let (partition, offset) = rest.split_once(':')?;
        Some(SourcePosition { branch, partition: partition.parse().ok()?, offset: offset.parse().ok()?, element })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::expr::{RecordField, Step};
    use onehop_log::Headers;
    use serde_json::json;

    fn branch(key: Option<Expr>, subject: Option<Expr>) -> TransformBranch {
        TransformBranch {
            source: "in".into(),
            filter: None,
            columns: vec![("n".into(), Expr::Path { path: vec![Step::Field("n".into())] })],
            all_fields: false,
            key,
            subject,
            unnest: None,
            alias: None,
            lookups: Vec::new(),
        }
    }

    fn def(first: TransformBranch) -> TransformDef {
        TransformDef {
            name: "out".into(),
            first,
            union: Vec::new(),
            start: Start::Latest,
            value_format: ValueFormat::Json,
            sql: String::new(),
        }
    }

    fn record() -> Record {
        Record {
            offset: 7,
            timestamp_ms: 1_000,
            key: Some(Bytes::from_static(b"source-key")),
            subject: Some("in/a".into()),
            headers: Headers::from(
                &[
                    (Text::from_static("trace"), Bytes::from_static(b"t1")),
                    (Text::from_static(SOURCE_HEADER), Bytes::from_static(b"0:1")),
                ][..],
            ),
            value: Some(Bytes::from_static(br#"{"n": 5, "topic": "a/+/b", "tags": ["x", "y", null]}"#)),
        }
    }

    fn literal(value: Value) -> Expr {
        Expr::Literal { value }
    }

    fn apply(def: &TransformDef, branch: usize, record: &Record) -> Vec<Output> {
        let value = super::super::super::expr::parse_value(record);
        let input = Input::of(record, 1, &value);
        let mut out = Vec::new();
        def.apply(branch, &input, record, &mut out);
        out
    }

    #[test]
    fn keys_subjects_and_headers_of_an_output_record() {
        let record = record();
        // Kept from the source, with the source header replaced by this record's position.
        let [Output { record: output, subject_valid, .. }] = &apply(&def(branch(None, None)), 0, &record)[..] else {
            panic!("one output")
        };
        assert!(subject_valid);
        assert_eq!(output.key.as_deref(), Some(&b"source-key"[..]));
        assert_eq!(output.subject.as_deref(), Some("in/a"));
        assert_eq!(output.timestamp_ms, Some(1_000));
        assert_eq!(
            output.headers,
            [
                (Text::from_static("trace"), Some(Bytes::from_static(b"t1"))),
                (Text::from_static(SOURCE_HEADER), Some(Bytes::from_static(b"1:7")))
            ]
        );
        assert_eq!(output.value.as_deref(), Some(&br#"{"n":5}"#[..]));
        // A null key: none. A number: its text. A subject that is not one: left out, and said.
        let def_null = def(branch(Some(literal(Value::Null)), Some(literal(json!("a/+/b")))));
        let [Output { record: output, subject_valid, .. }] = &apply(&def_null, 0, &record)[..] else { panic!() };
        assert_eq!((&output.key, &output.subject, subject_valid), (&None, &None, &false));
        let key = Expr::Record { field: RecordField::Offset };
        let def_offset = def(branch(Some(key), Some(literal(json!("out/x")))));
        let [Output { record: output, subject_valid, .. }] = &apply(&def_offset, 0, &record)[..] else { panic!() };
        assert_eq!(
            (output.key.as_deref(), output.subject.as_deref(), *subject_valid),
            (Some(&b"7"[..]), Some("out/x"), true)
        );
    }

    #[test]
    fn unnest_makes_one_output_per_element_each_named_by_its_position() {
        let record = record();
        let mut first = branch(None, None);
        first.unnest = Some(Expr::Path { path: vec![Step::Field("tags".into())] });
        first.columns = vec![
            ("tag".into(), Expr::Record { field: RecordField::Element }),
            ("at".into(), Expr::Record { field: RecordField::Ordinality }),
        ];
        // The null element is kept (as Postgres's unnest keeps it); a filter sees the element.
        let mut def = def(branch(None, None));
        def.union.push(first.clone());
        let outputs = apply(&def, 1, &record);
        let values: Vec<_> = outputs.iter().map(|o| o.record.value.clone().unwrap()).collect();
        assert_eq!(values, [&br#"{"at":1,"tag":"x"}"#[..], br#"{"at":2,"tag":"y"}"#, br#"{"at":3,"tag":null}"#]);
        let sources: Vec<_> = outputs.iter().map(|o| o.record.headers.last().unwrap().1.clone().unwrap()).collect();
        assert_eq!(sources, [&b"1/1:7#0"[..], b"1/1:7#1", b"1/1:7#2"]);
        for output in &outputs {
            let stored = Record { headers: Headers::from(&output.record.headers[..]), ..record.clone() };
            let position = SourcePosition::of(&stored).unwrap();
            assert_eq!((position.branch, position.partition, position.offset), (1, 1, 7));
        }
        def.union[0].filter = Some(Expr::Is {
            expr: Box::new(Expr::Record { field: RecordField::Element }),
            test: crate::view::expr::IsTest::Null,
            negated: true,
        });
        assert_eq!(apply(&def, 1, &record).len(), 2);
        // Not an array: nothing.
        def.union[0].unnest = Some(Expr::Path { path: vec![Step::Field("n".into())] });
        assert!(apply(&def, 1, &record).is_empty());
    }

    #[test]
    fn text_values_in_and_out() {
        let mut record = record();
        record.value = Some(Bytes::from_static(b"hello there"));
        let mut first = branch(None, None);
        first.columns = vec![(
            "value".into(),
            Expr::Call { function: crate::view::expr::Function::Upper, args: vec![Expr::Path { path: Vec::new() }] },
        )];
        let mut def = def(first);
        def.value_format = ValueFormat::Text;
        assert_eq!(def.check(), Ok(()));
        let [Output { record: output, .. }] = &apply(&def, 0, &record)[..] else { panic!() };
        assert_eq!(output.value.as_deref(), Some(&b"HELLO THERE"[..]));
        def.first.columns[0].1 = literal(json!({"a": 1}));
        let [Output { record: output, .. }] = &apply(&def, 0, &record)[..] else { panic!() };
        assert_eq!(output.value.as_deref(), Some(&br#"{"a":1}"#[..]));
        def.first.columns[0].1 = literal(Value::Null);
        let [Output { record: output, .. }] = &apply(&def, 0, &record)[..] else { panic!() };
        assert_eq!(output.value, None);
        def.first.all_fields = true;
        assert!(def.check().unwrap_err().contains("exactly one"));
    }

    #[test]
    fn lookups_join_rows_by_key_and_drop_or_pad_a_miss() {
        let path =
            |steps: &[&str]| Expr::Path { path: steps.iter().map(|step| Step::Field(step.to_string())).collect() };
        let mut record = record();
        record.value = Some(Bytes::from_static(br#"{"id": "o1", "customer": "c1", "qty": 2}"#));
        let customers: Map<String, Value> =
            [("id".to_string(), json!("c1")), ("tier".into(), json!(2))].into_iter().collect();
        let customers = Arc::new(customers);
        let find = |at: usize, id: &str| (at == 0 && id == "c1").then(|| customers.clone());
        let mut first = branch(None, None);
        first.alias = Some("o".into());
        first.all_fields = true;
        first.columns = vec![("tier".into(), path(&["c", "tier"]))];
        first.lookups = vec![Lookup {
            alias: "c".into(),
            table: "customers".into(),
            kind: JoinKind::Inner,
            key: path(&["o", "customer"]),
            residual: None,
        }];
        let mut def = def(first);
        assert_eq!(def.check(), Ok(()));
        assert_eq!(def.tables(), ["customers"]);
        assert!(def.reads("customers") && def.reads("in") && !def.reads("out"));
        let enrich = |def: &TransformDef, record: &Record| {
            let joined = def.joined(0, record, 1, super::super::super::expr::parse_value(record), &find)?;
            let mut out = Vec::new();
            def.apply(0, &Input::of(record, 1, &joined), record, &mut out);
            let [output] = &out[..] else { panic!("one output") };
            Some(String::from_utf8(output.record.value.clone().unwrap().to_vec()).unwrap())
        };
        // `o.*` is the record's own fields, the lookup's columns beside them.
        assert_eq!(enrich(&def, &record).as_deref(), Some(r#"{"customer":"c1","id":"o1","qty":2,"tier":2}"#));
        // A key no row has: an inner join gives nothing, a left join a null row.
        let mut missing = record.clone();
        missing.value = Some(Bytes::from_static(br#"{"id": "o2", "customer": "c9"}"#));
        assert_eq!(enrich(&def, &missing), None);
        def.first.lookups[0].kind = JoinKind::Left;
        assert_eq!(enrich(&def, &missing).as_deref(), Some(r#"{"customer":"c9","id":"o2","tier":null}"#));
        // A residual that does not hold is no match either.
        def.first.lookups[0].residual = Some(Expr::Binary {
            operator: crate::view::expr::BinaryOp::Gt,
            left: Box::new(path(&["c", "tier"])),
            right: Box::new(literal(json!(5))),
        });
        assert_eq!(enrich(&def, &record).as_deref(), Some(r#"{"customer":"c1","id":"o1","qty":2,"tier":null}"#));
        def.first.unnest = Some(path(&["o", "tags"]));
        assert!(def.check().unwrap_err().contains("UNNEST and JOIN"));
    }

    #[test]
    fn positions_read_back_and_old_headers_still_parse() {
        for text in ["0:5", "3:18446744073709551615", "2/0:5", "1/4:9#12", "0:1#0"] {
            assert_eq!(SourcePosition::parse(text).unwrap().to_string(), text);
        }
        for text in ["", "5", "a:1", "1/2", "1:2#", "x/1:2", "1:2#-1"] {
            assert_eq!(SourcePosition::parse(text), None, "{text}");
        }
    }

    #[test]
    fn a_definition_stored_before_union_and_unnest_reads_the_same() {
        let stored = json!({
            "name": "big", "source": "orders", "filter": null, "columns": [], "all_fields": true,
            "key": null, "subject": null, "start": "earliest", "sql": "CREATE STREAM big AS SELECT * FROM orders"
        });
        let def: TransformDef = serde_json::from_value(stored.clone()).unwrap();
        assert_eq!(def.first.source, "orders");
        assert!(def.union.is_empty() && def.first.unnest.is_none() && def.value_format == ValueFormat::Json);
        assert_eq!(serde_json::to_value(&def).unwrap(), stored);
    }
}
