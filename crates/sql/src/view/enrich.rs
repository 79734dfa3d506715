//! A transform that joins tables: `CREATE STREAM enriched AS SELECT o.*, c.name FROM orders o
//! JOIN customers c ON c.id = o.customer_id [LEFT JOIN regions r ON r.id = c.region] …`.
//! Each record of the stream is enriched with the row of each table that the ON condition's
//! equality on the table's primary key finds.
//!
//! As for joined views, it is read in two steps: parsing (`parse_joins`) keeps FROM as written,
//! each ON condition whole; running it (`resolve`) needs the tables' columns to qualify every
//! name with its input's alias, find each table's key expression, and expand `alias.*`.

use onehop_engine::Engine;
use onehop_engine::view::expr::{BinaryOp, Step};
use onehop_engine::view::transform::{Lookup, TransformBranch};
use onehop_engine::view::{Expr, JoinKind, TransformDef};
use sqlparser::ast;

use super::expr::convert_expr;
use super::join::{Known, aliases, and_all, check_types, flatten_and, input, inputs_read, other_join, qualify};
use super::transform::same_columns;
use super::{invalid, unsupported};
use crate::SqlError;

/// The name a parsed `alias.*` has among a branch's columns until it is resolved.
pub(super) const ALL_COLUMNS: &str = "*";

/// What an enriching join looks like, for errors.
const LOOKUP_SHAPE: &str = "a transform joins tables by their primary key: FROM stream s [LEFT] JOIN table t ON \
     t.primary_key = expression of s (or of a table joined before) [AND condition] …";

/// FROM `stream alias JOIN table alias ON … …` as written: the stream, its alias (its name
/// without one), and one lookup per join, its whole ON condition kept as `residual` until
/// [`resolve`] takes it apart.
pub(super) fn parse_joins(from: &ast::TableWithJoins) -> Result<(String, Option<String>, Vec<Lookup>), SqlError> {
    if let ast::TableFactor::Table { name, args: Some(_), .. } = &from.relation {
        return Err(unsupported(
            format!("FROM {name}(…) in a stream transform"),
            "a transform reads streams: FROM source (windows belong to CREATE VIEW)",
        ));
    }
    let unnest = |join: &ast::Join| matches!(join.relation, ast::TableFactor::UNNEST { .. });
    if from.joins.iter().all(unnest) {
        return Err(unsupported(
            "several UNNESTs in one SELECT",
            "a transform splits on one array per record: split again in a transform of its output",
        ));
    }
    let source = input(&from.relation, None)?;
    let mut lookups = Vec::with_capacity(from.joins.len());
    for join in &from.joins {
        if unnest(join) {
            return Err(unsupported(
                "UNNEST and JOIN in one SELECT",
                "split the records in one transform (CROSS JOIN UNNEST) and enrich its stream in another",
            ));
        }
        let (kind, constraint) = match &join.join_operator {
            ast::JoinOperator::Join(constraint) | ast::JoinOperator::Inner(constraint) => (JoinKind::Inner, constraint),
            ast::JoinOperator::Left(constraint) | ast::JoinOperator::LeftOuter(constraint) => {
                (JoinKind::Left, constraint)
            }
            other => return Err(unsupported(other_join(other), LOOKUP_SHAPE)),
        };
        let ast::JoinConstraint::On(condition) = constraint else {
            return Err(unsupported(
                "a join without ON (USING, NATURAL)",
                "join ON a condition: JOIN t ON t.id = s.t_id",
            ));
        };
        let table = input(&join.relation, None)?;
        lookups.push(Lookup {
            alias: table.alias,
            table: table.source,
            kind,
            key: Expr::Literal { value: serde_json::Value::Null },
            residual: Some(convert_expr(condition)?),
        });
    }
    Ok((source.source, Some(source.alias), lookups))
}

/// The transform `def` (as parsed) with each joining branch resolved against its tables.
pub(crate) fn resolve(engine: &Engine, def: &TransformDef) -> Result<TransformDef, SqlError> {
    let mut resolved = def.clone();
    resolved.first = resolve_branch(engine, &def.first)?;
    for (index, branch) in def.union.iter().enumerate() {
        resolved.union[index] = resolve_branch(engine, branch)?;
    }
    let first = resolved.first.clone();
    for (index, branch) in resolved.union.iter_mut().enumerate() {
        same_columns(&first, branch, index + 2)?;
    }
    resolved.check().map_err(invalid)?;
    Ok(resolved)
}

fn resolve_branch(engine: &Engine, branch: &TransformBranch) -> Result<TransformBranch, SqlError> {
    if branch.lookups.is_empty() {
        return Ok(branch.clone());
    }
    let alias = branch.alias.clone().expect("a parsed join names its source");
    let mut known = vec![Known {
        alias: alias.clone(),
        label: format!("stream {}", branch.source),
        id_field: String::new(),
        columns: Vec::new(),
        open: true,
    }];
    for lookup in &branch.lookups {
        let next = table(engine, lookup)?;
        if known.iter().any(|earlier| earlier.alias == next.alias) {
            return Err(invalid(format!(
                "two inputs are named {}; give one another name: JOIN {} AS other",
                next.alias, lookup.table
            )));
        }
        known.push(next);
    }
    let mut resolved = branch.clone();
    for (at, lookup) in resolved.lookups.iter_mut().enumerate() {
        let mut condition = lookup.residual.take().expect("a parsed join keeps its ON condition");
        whole_value(&mut condition, &alias);
        qualify(&mut condition, &known, at + 2, "an ON condition")?;
        let (key, residual) = split_key(condition, &known, at + 1)?;
        lookup.key = key;
        lookup.residual = residual;
    }
    let everything = known.len();
    let resolve = |expr: &mut Expr, place: &str| {
        whole_value(expr, &alias);
        qualify(expr, &known, everything, place)
    };
    if let Some(filter) = &mut resolved.filter {
        resolve(filter, "WHERE")?;
    }
    for expr in [&mut resolved.key, &mut resolved.subject].into_iter().flatten() {
        resolve(expr, "the SELECT list")?;
    }
    let mut columns: Vec<(String, Expr)> = Vec::with_capacity(branch.columns.len());
    let mut add = |name: String, expr: Expr| {
        if columns.iter().any(|(existing, _)| *existing == name) {
            return Err(invalid(format!("two columns are named {name}; name one with AS")));
        }
        columns.push((name, expr));
        Ok(())
    };
    for (name, expr) in &branch.columns {
        if name != ALL_COLUMNS {
            let mut expr = expr.clone();
            resolve(&mut expr, "the SELECT list")?;
            add(name.clone(), expr)?;
            continue;
        }
        let Expr::Path { path } = expr else { unreachable!("alias.* is parsed as a path") };
        let [Step::Field(of)] = path.as_slice() else { unreachable!("parsed as one alias") };
        let Some(input) = known.iter().find(|input| input.alias == *of) else {
            return Err(invalid(format!("{of}.*: {of} is not an input of the transform ({})", aliases(&known))));
        };
        if input.open {
            if resolved.all_fields {
                return Err(invalid(format!("{of}.* is selected twice")));
            }
            resolved.all_fields = true;
            continue;
        }
        for (column, _) in &input.columns {
            add(column.clone(), Expr::Path { path: vec![Step::Field(of.clone()), Step::Field(column.clone())] })?;
        }
    }
    resolved.columns = columns;
    Ok(resolved)
}

/// What the transform knows of a table it joins; anything else is refused, saying what to do.
fn table(engine: &Engine, lookup: &Lookup) -> Result<Known, SqlError> {
    let name = &lookup.table;
    if let Ok(table) = engine.table(name) {
        let def = table.def();
        return Ok(Known {
            alias: lookup.alias.clone(),
            label: format!("table {name}"),
            id_field: def.primary_key.clone(),
            columns: def.columns.iter().map(|column| (column.name.clone(), Some(column.ty.clone()))).collect(),
            open: false,
        });
    }
    Err(invalid(if engine.view(name).is_ok() {
        format!(
            "{name} is a view: a transform looks rows up in tables, by primary key (join a view's rows in a \
             joined view: CREATE VIEW … JOIN {name} …)"
        )
    } else if engine.stream(name).is_ok() {
        format!(
            "{name} is a stream: a transform enriches its records with tables' rows (keep a stream's newest \
             record per key with cleanup = 'compact' and join it in a joined view)"
        )
    } else {
        format!("{name} is not a table (SHOW TABLES lists them)")
    }))
}

/// `value` (the whole record value) as the record's alias in a joined row.
fn whole_value(expr: &mut Expr, alias: &str) {
    let _ = expr.try_rewrite(&mut |node: &mut Expr| {
        if let Expr::Path { path } = node
            && path.is_empty()
        {
            path.push(Step::Field(alias.to_string()));
        }
        Ok::<(), ()>(())
    });
}

/// Splits the (qualified) ON condition of the table `known[at]` into the expression that gives
/// the primary key of its row (the other side of an equality with `alias.primary_key`, reading
/// only earlier inputs and the record) and the rest.
fn split_key(condition: Expr, known: &[Known], at: usize) -> Result<(Expr, Option<Expr>), SqlError> {
    let (alias, id) = (&known[at].alias, &known[at].id_field);
    let is_id = |expr: &Expr| {
        matches!(expr, Expr::Path { path } if matches!(path.as_slice(),
            [Step::Field(first), Step::Field(column)] if first == alias && column == id))
    };
    let earlier = |expr: &Expr| inputs_read(expr, known).iter().all(|read| *read < at);
    let mut conjuncts = Vec::new();
    flatten_and(condition, &mut conjuncts);
    let found = conjuncts.iter().enumerate().find_map(|(position, conjunct)| match conjunct {
        Expr::Binary { operator: BinaryOp::Eq, left, right } if is_id(left) && earlier(right) => {
            Some((position, (**right).clone(), (**left).clone()))
        }
        Expr::Binary { operator: BinaryOp::Eq, left, right } if is_id(right) && earlier(left) => {
            Some((position, (**left).clone(), (**right).clone()))
        }
        _ => None,
    });
    let Some((position, key, id_path)) = found else {
        return Err(invalid(format!(
            "the join of {} finds its row by the table's primary key: ON {alias}.{id} = an expression of {} \
             (more conditions may follow with AND); to join on another column, define a joined view",
            known[at].label,
            known[..at].iter().map(|input| input.alias.as_str()).collect::<Vec<_>>().join(" or ")
        )));
    };
    check_types(&id_path, &key, known)?;
    conjuncts.remove(position);
    let residual = and_all(conjuncts);
    Ok((key, residual))
}
