//! `CREATE VIEW … AS SELECT … FROM a [JOIN b ON …] [LEFT JOIN c ON …] … [WHERE …]` with no
//! GROUP BY: a joined view (with one input, a filtered projection of a table or view).
//!
//! It is read in two steps. Parsing (`join_view_def`) keeps the statement as written: inputs
//! with their aliases, each ON condition whole, names as the user spelled them. Running it
//! (`resolve`) needs the inputs' columns: every name is qualified with its input's alias, an
//! unqualified one taken from the one input that has that column; `alias.*` becomes that
//! input's columns; each ON condition is split into the equality that joins the input to an
//! earlier one (its parent) and the rest. What the engine stores is only ever resolved.

use onehop_engine::ColumnType;
use onehop_engine::Engine;
use onehop_engine::view::expr::{BinaryOp, RecordField, Step};
use onehop_engine::view::join::STREAM_KEY_COLUMN;
use onehop_engine::view::{Column, Expr, JoinColumn, JoinDef, JoinInput, JoinKind, JoinOn, ViewDef};
use sqlparser::ast::{self, SqlOption};

use super::columns::{group_by, view_columns};
use super::expr::convert_expr;
use super::query::plain_wildcard;
use super::transform::output_name;
use super::{FLAG_COLUMNS, invalid, unsupported};
use crate::SqlError;
use crate::parse::simple_name;

/// What a joined view looks like, for errors.
const JOIN_SHAPE: &str = "a joined view is CREATE VIEW name AS SELECT expression [AS name], … | alias.* \
     FROM source [alias] [[LEFT] JOIN source [alias] ON alias.column = earlier.column [AND …]] … [WHERE condition] \
     [GROUP BY key, with the key and aggregates as the SELECT list]";

/// The column a parsed `alias.*` (or `*`, alias empty) stands for until it is resolved.
const ALL_COLUMNS: &str = "*";

/// A joined view as written; [`resolve`] makes it what the engine runs.
pub(super) fn join_view_def(
    name: String,
    options: &[SqlOption],
    select: &ast::Select,
    sql: String,
) -> Result<ViewDef, SqlError> {
    let mut state_bytes_max = None;
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(unsupported(option, "a joined view takes WITH (state_bytes_max = '64MiB')"));
        };
        if !key.to_string().eq_ignore_ascii_case("state_bytes_max") || state_bytes_max.is_some() {
            return Err(unsupported(
                format!("the option {option} on a view without GROUP BY"),
                "a joined view takes one option, state_bytes_max (it follows its inputs' current rows: no \
                 windows, grace or start)",
            ));
        }
        let text = match value {
            ast::Expr::Value(value) => {
                super::expr::string_value(&value.value).map(str::to_string).unwrap_or_else(|| value.value.to_string())
            }
            other => other.to_string(),
        };
        let bytes = onehop_engine::units::parse_bytes(&text)
            .map_err(|error| SqlError::InvalidOption(format!("state_bytes_max: {error}")))?;
        if bytes == 0 {
            return Err(SqlError::InvalidOption(
                "state_bytes_max: a cap of 0 bytes would stop the view at once".into(),
            ));
        }
        state_bytes_max = Some(bytes);
    }
    let from = match select.from.as_slice() {
        [from] => from,
        [] => return Err(unsupported("a SELECT without FROM", JOIN_SHAPE)),
        _ => {
            return Err(unsupported(
                "several sources in FROM separated by commas",
                "join them with ON: FROM a JOIN b ON b.id = a.b_id",
            ));
        }
    };
    let mut inputs = vec![input(&from.relation, None)?];
    for join in &from.joins {
        let (kind, constraint) = match &join.join_operator {
            ast::JoinOperator::Join(constraint) | ast::JoinOperator::Inner(constraint) => (JoinKind::Inner, constraint),
            ast::JoinOperator::Left(constraint) | ast::JoinOperator::LeftOuter(constraint) => {
                (JoinKind::Left, constraint)
            }
            other => {
                let written = other_join(other);
                return Err(unsupported(written, "a joined view takes JOIN and LEFT JOIN, each with ON"));
            }
        };
        let ast::JoinConstraint::On(condition) = constraint else {
            return Err(unsupported(
                "a join without ON (USING, NATURAL)",
                "join ON a condition: JOIN b ON b.id = a.b_id",
            ));
        };
        let on = JoinOn {
            kind,
            parent: 0,
            key: Expr::Literal { value: serde_json::Value::Null },
            parent_key: Expr::Literal { value: serde_json::Value::Null },
            residual: Some(convert(condition)?),
        };
        inputs.push(input(&join.relation, Some(on))?);
    }
    let filter = select.selection.as_ref().map(convert).transpose()?;
    let source = inputs[0].source.clone();
    if !super::is_join_view(select) {
        // GROUP BY over the joined rows: the key and aggregates as a view over a table has them.
        let (mut key, mut columns) = view_columns(&select.projection, group_by(select)?)?;
        as_columns(&mut key)?;
        for column in &mut columns {
            if let Column::Aggregate { arg, order_by, .. } = column {
                for expr in arg.iter_mut().chain(order_by.iter_mut().map(|order| &mut order.expr)) {
                    as_columns(expr)?;
                }
            }
        }
        let join = JoinDef { inputs, filter, columns: Vec::new(), state_bytes_max };
        return Ok(ViewDef { key, columns, join: Some(Box::new(join)), ..super::with_defaults(name, source, sql) });
    }
    let mut columns = Vec::with_capacity(select.projection.len());
    for item in &select.projection {
        let column = match item {
            ast::SelectItem::Wildcard(options) => {
                plain_wildcard(item, options, "a joined view takes a plain * or alias.*")?;
                JoinColumn { name: ALL_COLUMNS.into(), expr: Expr::Path { path: Vec::new() } }
            }
            ast::SelectItem::QualifiedWildcard(kind, options) => {
                plain_wildcard(item, options, "a joined view takes a plain * or alias.*")?;
                let ast::SelectItemQualifiedWildcardKind::ObjectName(alias) = kind else {
                    return Err(unsupported(item, JOIN_SHAPE));
                };
                let alias = simple_name(alias)?;
                JoinColumn { name: ALL_COLUMNS.into(), expr: Expr::Path { path: vec![Step::Field(alias)] } }
            }
            ast::SelectItem::UnnamedExpr(expr) => {
                let name =
                    output_name(expr).ok_or_else(|| invalid(format!("name the column {expr}: {expr} AS name")))?;
                JoinColumn { name, expr: convert(expr)? }
            }
            ast::SelectItem::ExprWithAlias { expr, alias } => {
                if alias.value.contains('*') {
                    return Err(invalid(format!("a column cannot be named {}", alias.value)));
                }
                JoinColumn { name: alias.value.clone(), expr: convert(expr)? }
            }
            other => return Err(unsupported(other, JOIN_SHAPE)),
        };
        columns.push(column);
    }
    let join = JoinDef { inputs, filter, columns, state_bytes_max };
    Ok(ViewDef { join: Some(Box::new(join)), ..super::with_defaults(name, source, sql) })
}

pub(super) fn other_join(operator: &ast::JoinOperator) -> &'static str {
    match operator {
        ast::JoinOperator::Right(_) | ast::JoinOperator::RightOuter(_) => "RIGHT JOIN (put that input first)",
        ast::JoinOperator::FullOuter(_) => "FULL JOIN",
        ast::JoinOperator::CrossJoin(_) => "CROSS JOIN",
        _ => "this kind of join",
    }
}

/// One input of FROM: a table or view, with its alias.
pub(super) fn input(relation: &ast::TableFactor, on: Option<JoinOn>) -> Result<JoinInput, SqlError> {
    let ast::TableFactor::Table { name, alias, args, with_hints, version, with_ordinality, partitions, .. } = relation
    else {
        return Err(match relation {
            ast::TableFactor::Derived { .. } => {
                unsupported("a subquery in FROM", "define it as a view of its own and join that view")
            }
            other => unsupported(other, JOIN_SHAPE),
        });
    };
    if args.is_some() || !with_hints.is_empty() || version.is_some() || *with_ordinality || !partitions.is_empty() {
        return Err(unsupported(relation, JOIN_SHAPE));
    }
    let source = simple_name(name)?;
    let alias = match alias {
        Some(alias) if !alias.columns.is_empty() => {
            return Err(unsupported(format!("the column aliases of {alias}"), "name columns in the SELECT list"));
        }
        Some(alias) => alias.name.value.clone(),
        None => source.clone(),
    };
    Ok(JoinInput { alias, source, id_field: String::new(), on })
}

/// A SQL expression of a joined view: names are columns (a joined row has no record key,
/// subject or offset), so `key` is a column named key.
fn convert(expr: &ast::Expr) -> Result<Expr, SqlError> {
    let mut expr = convert_expr(expr)?;
    as_columns(&mut expr)?;
    Ok(expr)
}

/// `expr` with the record's fields (`key`, `subject`, …) read as columns of those names.
fn as_columns(expr: &mut Expr) -> Result<(), SqlError> {
    expr.try_rewrite(&mut |node: &mut Expr| {
        if let Expr::Record { field } = node {
            let name = match field {
                RecordField::Key => "key",
                RecordField::Subject => "subject",
                RecordField::Ts => "ts",
                RecordField::Partition => "partition",
                RecordField::Offset => "offset",
                // Only a transform's UNNEST names these.
                RecordField::Element | RecordField::Ordinality => return Ok(()),
            };
            *node = Expr::Path { path: vec![Step::Field(name.into())] };
        }
        Ok::<(), SqlError>(())
    })
}

/// What a joined view knows of one input.
pub(super) struct Known {
    pub alias: String,
    /// `table orders`, `view by_product`, for errors.
    pub label: String,
    pub id_field: String,
    /// Its columns, with their declared types where it has them.
    pub columns: Vec<(String, Option<ColumnType>)>,
    /// A stream: its rows are its records' values, whose fields are not declared, so any name
    /// may be one (besides `key`, the record key).
    pub open: bool,
}

impl Known {
    /// Whether it declares `column`.
    fn has(&self, column: &str) -> bool {
        self.columns.iter().any(|(name, _)| name == column)
    }

    /// Whether `column` may be one of its columns.
    fn may_have(&self, column: &str) -> bool {
        self.open || self.has(column)
    }

    pub fn column_list(&self) -> String {
        self.columns.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

fn known(engine: &Engine, input: &JoinInput) -> Result<Known, SqlError> {
    let alias = input.alias.clone();
    if let Ok(table) = engine.table(&input.source) {
        let def = table.def();
        return Ok(Known {
            alias,
            label: format!("table {}", input.source),
            id_field: def.primary_key.clone(),
            columns: def.columns.iter().map(|column| (column.name.clone(), Some(column.ty.clone()))).collect(),
            open: false,
        });
    }
    if let Ok(view) = engine.view(&input.source) {
        let def = view.def();
        let id_field = def.key_column().map(str::to_string).ok_or_else(|| {
            invalid(format!(
                "view {} does not select its GROUP BY key: a join finds its rows by it (add it to its SELECT list)",
                input.source
            ))
        })?;
        let columns = def.column_names().into_iter().map(|name| (name, None)).collect();
        return Ok(Known { alias, label: format!("view {}", input.source), id_field, columns, open: false });
    }
    if let Ok(stream) = engine.stream(&input.source) {
        if !stream.def().compacted {
            return Err(invalid(format!(
                "{} is a stream of events (not compacted): a joined view reads compacted streams (cleanup = \
                 'compact') as tables of their newest record per key; aggregate an event stream with a GROUP BY \
                 view first, or enrich it with a transform",
                input.source
            )));
        }
        // A compacted stream as a table (Kafka Streams' KTable): the newest record of each key.
        let columns = vec![(STREAM_KEY_COLUMN.to_string(), Some(ColumnType::Text))];
        let label = format!("stream {}", input.source);
        return Ok(Known { alias, label, id_field: STREAM_KEY_COLUMN.into(), columns, open: true });
    }
    Err(invalid(format!(
        "{} is not a table, view or compacted stream (SHOW TABLES, SHOW VIEWS and SHOW STREAMS list them)",
        input.source
    )))
}

/// The joined view `def` (as [`join_view_def`] parsed it) resolved against the inputs' columns.
pub(crate) fn resolve(engine: &Engine, def: &ViewDef) -> Result<ViewDef, SqlError> {
    let join = def.join.as_deref().expect("resolve takes a joined view");
    if join.sources().any(|source| source == def.name) {
        return Err(invalid(format!("view {} cannot read itself", def.name)));
    }
    let known: Vec<Known> = join.inputs.iter().map(|input| known(engine, input)).collect::<Result<_, _>>()?;
    for (at, input) in known.iter().enumerate() {
        if known[..at].iter().any(|earlier| earlier.alias == input.alias) {
            return Err(invalid(format!(
                "two inputs are named {}; give one another name: FROM {} AS other",
                input.alias, join.inputs[at].source
            )));
        }
    }
    let mut inputs = Vec::with_capacity(join.inputs.len());
    for (at, input) in join.inputs.iter().enumerate() {
        let on = match &input.on {
            None => None,
            Some(on) => {
                let mut condition = on.residual.clone().expect("a parsed join keeps its ON condition");
                qualify(&mut condition, &known, at + 1, "an ON condition")?;
                Some(split_on(condition, &known, at, on.kind)?)
            }
        };
        inputs.push(JoinInput {
            alias: input.alias.clone(),
            source: input.source.clone(),
            id_field: known[at].id_field.clone(),
            on,
        });
    }
    let filter = match &join.filter {
        Some(filter) => {
            let mut filter = filter.clone();
            qualify(&mut filter, &known, known.len(), "WHERE")?;
            Some(filter)
        }
        None => None,
    };
    if def.aggregates_join() {
        return aggregated(
            def,
            JoinDef { inputs, filter, columns: Vec::new(), state_bytes_max: join.state_bytes_max },
            &known,
        );
    }
    let mut columns: Vec<JoinColumn> = Vec::new();
    let mut add = |column: JoinColumn| {
        if FLAG_COLUMNS.contains(&column.name.as_str()) {
            return Err(invalid(format!(
                "every change of a view carries \"{}\" beside its row: name the column otherwise",
                column.name
            )));
        }
        if columns.iter().any(|existing| existing.name == column.name) {
            return Err(invalid(format!("two columns are named {}; name one with AS", column.name)));
        }
        columns.push(column);
        Ok(())
    };
    for column in &join.columns {
        if column.name == ALL_COLUMNS {
            let expanded: Vec<&Known> = match &column.expr {
                Expr::Path { path } if path.is_empty() => {
                    if known.len() > 1 {
                        return Err(unsupported(
                            "SELECT * in a view of several inputs",
                            "their columns may share names: take alias.* or name the columns",
                        ));
                    }
                    known.iter().collect()
                }
                Expr::Path { path } => {
                    let [Step::Field(alias)] = path.as_slice() else { unreachable!("parsed as one alias") };
                    let input = known.iter().find(|input| input.alias == *alias).ok_or_else(|| {
                        invalid(format!("{alias}.*: {alias} is not an input of the view ({})", aliases(&known)))
                    })?;
                    vec![input]
                }
                _ => unreachable!("alias.* is parsed as a path"),
            };
            for input in expanded {
                if input.open {
                    return Err(invalid(format!(
                        "{}.*: {} is a {}, whose fields are not declared: name the ones the view takes ({}.key, {}.field, …)",
                        input.alias, input.alias, input.label, input.alias, input.alias
                    )));
                }
                for (name, _) in &input.columns {
                    let path = vec![Step::Field(input.alias.clone()), Step::Field(name.clone())];
                    add(JoinColumn { name: name.clone(), expr: Expr::Path { path } })?;
                }
            }
            continue;
        }
        let mut expr = column.expr.clone();
        qualify(&mut expr, &known, known.len(), "the SELECT list")?;
        add(JoinColumn { name: column.name.clone(), expr })?;
    }
    let resolved = JoinDef { inputs, filter, columns, state_bytes_max: join.state_bytes_max };
    resolved.validate().map_err(invalid)?;
    Ok(ViewDef { source: resolved.inputs[0].source.clone(), join: Some(Box::new(resolved)), ..def.clone() })
}

/// A view aggregating a join, resolved: its key and aggregates qualified, the join's columns
/// the input columns they read (named by position: no one reads them but the view), and the
/// key and aggregates reading those columns instead.
fn aggregated(def: &ViewDef, mut join: JoinDef, known: &[Known]) -> Result<ViewDef, SqlError> {
    let mut read: Vec<Vec<Step>> = Vec::new();
    let mut resolved = def.clone();
    let mut to_columns = |expr: &mut Expr, place: &str| {
        qualify(expr, known, known.len(), place)?;
        expr.try_rewrite(&mut |node: &mut Expr| {
            let Expr::Path { path } = node else { return Ok(()) };
            // `alias.column`, or the input's whole row (`alias`, `alias[0]`).
            let head = if matches!(path.get(1), Some(Step::Field(_))) { 2 } else { 1 };
            let at = match read.iter().position(|columns| *columns == path[..head]) {
                Some(at) => at,
                None => {
                    read.push(path[..head].to_vec());
                    read.len() - 1
                }
            };
            path.splice(..head, [Step::Field(at.to_string())]);
            Ok::<(), SqlError>(())
        })
    };
    to_columns(&mut resolved.key, "GROUP BY")?;
    for column in &mut resolved.columns {
        if let Column::Aggregate { arg, order_by, .. } = column {
            for expr in arg.iter_mut().chain(order_by.iter_mut().map(|order| &mut order.expr)) {
                to_columns(expr, "the SELECT list")?;
            }
        }
    }
    join.columns = read
        .into_iter()
        .enumerate()
        .map(|(at, path)| JoinColumn { name: at.to_string(), expr: Expr::Path { path } })
        .collect();
    if join.columns.is_empty() {
        // COUNT(*) GROUP BY a constant reads no column; a joined row is still a row.
        join.columns.push(JoinColumn { name: "0".into(), expr: Expr::Literal { value: serde_json::Value::Null } });
    }
    join.validate().map_err(invalid)?;
    resolved.source = join.inputs[0].source.clone();
    resolved.join = Some(Box::new(join));
    Ok(resolved)
}

pub(super) fn aliases(known: &[Known]) -> String {
    known.iter().map(|input| input.alias.as_str()).collect::<Vec<_>>().join(", ")
}

/// Qualifies every name of `expr` with its input's alias; `visible` inputs (the first ones) may
/// be named (`place` says where, for errors).
pub(super) fn qualify(expr: &mut Expr, known: &[Known], visible: usize, place: &str) -> Result<(), SqlError> {
    expr.try_rewrite(&mut |node: &mut Expr| {
        let Expr::Path { path } = node else { return Ok(()) };
        let Some(Step::Field(first)) = path.first().cloned() else {
            return Err(invalid(format!(
                "{place} reads the whole record (value): a joined view's rows are columns; name one"
            )));
        };
        if let Some(at) = known.iter().position(|input| input.alias == first) {
            if at >= visible {
                return Err(invalid(format!(
                    "{place} names {first}, which is joined after it: move the condition to a later ON or to WHERE"
                )));
            }
            if let Some(Step::Field(column)) = path.get(1)
                && !known[at].may_have(column)
            {
                return Err(invalid(format!(
                    "column {first}.{column} does not exist: {first} is {} (its columns: {})",
                    known[at].label,
                    known[at].column_list()
                )));
            }
            return Ok(());
        }
        let mut having: Vec<&Known> = known[..visible].iter().filter(|input| input.has(&first)).collect();
        let undeclared = having.is_empty();
        if undeclared {
            // No input declares it: a stream's field, if there is one stream to have it.
            having = known[..visible].iter().filter(|input| input.open).collect();
        }
        match having.as_slice() {
            [input] => {
                path.insert(0, Step::Field(input.alias.clone()));
                Ok(())
            }
            [] => Err(invalid(format!(
                "column {first} in {place} is not a column of {}",
                known[..visible].iter().map(|input| input.label.as_str()).collect::<Vec<_>>().join(" or ")
            ))),
            several => Err(invalid(format!(
                "column {first} in {place} is ambiguous: {} all {} it; qualify it ({}.{first})",
                several.iter().map(|input| input.alias.as_str()).collect::<Vec<_>>().join(", "),
                if undeclared { "are streams that may have" } else { "have" },
                several[0].alias
            ))),
        }
    })
}

/// The inputs an expression reads (its paths' first steps), by position.
pub(super) fn inputs_read(expr: &Expr, known: &[Known]) -> Vec<usize> {
    let mut read = Vec::new();
    expr.visit_paths(&mut |path: &[Step]| {
        if let Some(Step::Field(first)) = path.first()
            && let Some(at) = known.iter().position(|input| input.alias == *first)
            && !read.contains(&at)
        {
            read.push(at);
        }
    });
    read
}

/// `expr` with `alias.` taken off its paths: an expression of that input's row alone.
fn own_row(mut expr: Expr, alias: &str) -> Expr {
    let _ = expr.try_rewrite(&mut |node: &mut Expr| {
        if let Expr::Path { path } = node
            && matches!(path.first(), Some(Step::Field(first)) if first == alias)
        {
            path.remove(0);
        }
        Ok::<(), ()>(())
    });
    expr
}

/// Splits input `at`'s (qualified) ON condition into its equality with one earlier input and
/// the rest; an equality on `at`'s id is preferred (one row per parent row).
fn split_on(condition: Expr, known: &[Known], at: usize, kind: JoinKind) -> Result<JoinOn, SqlError> {
    let mut conjuncts = Vec::new();
    flatten_and(condition, &mut conjuncts);
    // (conjunct, this input's side, the parent's side, parent)
    let mut candidates: Vec<(usize, Expr, Expr, usize)> = Vec::new();
    for (position, conjunct) in conjuncts.iter().enumerate() {
        let Expr::Binary { operator: BinaryOp::Eq, left, right } = conjunct else { continue };
        let (left_reads, right_reads) = (inputs_read(left, known), inputs_read(right, known));
        match (left_reads.as_slice(), right_reads.as_slice()) {
            ([own], [parent]) if *own == at && *parent < at => {
                candidates.push((position, (**left).clone(), (**right).clone(), *parent));
            }
            ([parent], [own]) if *own == at && *parent < at => {
                candidates.push((position, (**right).clone(), (**left).clone(), *parent));
            }
            _ => {}
        }
    }
    let is_id = |expr: &Expr| {
        matches!(expr, Expr::Path { path } if matches!(path.as_slice(),
            [Step::Field(_), Step::Field(column)] if *column == known[at].id_field))
    };
    let chosen = candidates.iter().position(|(_, own, _, _)| is_id(own)).unwrap_or(0);
    if candidates.is_empty() {
        return Err(invalid(format!(
            "the join of {} needs an equality between its columns and one earlier input's: ON {}.column = \
             earlier.column (an ON condition may add more with AND)",
            known[at].alias, known[at].alias
        )));
    }
    let (position, own, parent_side, parent) = candidates.swap_remove(chosen);
    check_types(&own, &parent_side, known)?;
    conjuncts.remove(position);
    let residual = and_all(conjuncts);
    Ok(JoinOn {
        kind,
        parent,
        key: own_row(own, &known[at].alias),
        parent_key: own_row(parent_side, &known[parent].alias),
        residual,
    })
}

/// The conjunction of `conjuncts` (`None` for none): the inverse of `flatten_and`.
pub(super) fn and_all(conjuncts: Vec<Expr>) -> Option<Expr> {
    conjuncts.into_iter().reduce(|left, right| Expr::Binary {
        operator: BinaryOp::And,
        left: Box::new(left),
        right: Box::new(right),
    })
}

pub(super) fn flatten_and(expr: Expr, into: &mut Vec<Expr>) {
    match expr {
        Expr::Binary { operator: BinaryOp::And, left, right } => {
            flatten_and(*left, into);
            flatten_and(*right, into);
        }
        other => into.push(other),
    }
}

/// Refuses an equality of two declared columns whose types never compare equal.
pub(super) fn check_types(left: &Expr, right: &Expr, known: &[Known]) -> Result<(), SqlError> {
    let declared = |expr: &Expr| -> Option<(String, ColumnType)> {
        let Expr::Path { path } = expr else { return None };
        let [Step::Field(alias), Step::Field(column)] = path.as_slice() else { return None };
        let input = known.iter().find(|input| input.alias == *alias)?;
        let ty = input.columns.iter().find(|(name, _)| name == column)?.1.clone()?;
        Some((format!("{alias}.{column}"), ty))
    };
    let family = |ty: &ColumnType| match ty {
        ColumnType::Text | ColumnType::Timestamp => Some("text"),
        ColumnType::Integer | ColumnType::Float => Some("number"),
        ColumnType::Boolean => Some("boolean"),
        ColumnType::Array(_) => Some("array"),
        ColumnType::Json => None,
    };
    if let (Some((left_name, left_type)), Some((right_name, right_type))) = (declared(left), declared(right))
        && let (Some(left_family), Some(right_family)) = (family(&left_type), family(&right_type))
        && left_family != right_family
    {
        return Err(invalid(format!(
            "{left_name} is {left_type} and {right_name} is {right_type}: they never compare equal; \
             CAST one to the other's type"
        )));
    }
    Ok(())
}
