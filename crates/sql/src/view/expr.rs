//! SQL expressions to the engine's [`Expr`]: names to record fields and value paths, `->`/`->>`
//! to walks of the value, literals, operators, LIKE, CASE, CAST and the scalar functions; anything
//! else is refused with what expressions may contain.

use onehop_engine::view::Expr;
use onehop_engine::view::expr::{
    BinaryOp, CastType, FUNCTION_NAMES, Function, IsTest, RecordField, Step, UnaryOp, When,
};
use serde_json::{Number, Value};
use sqlparser::ast;
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

use super::columns::aggregate_kind;
use super::{expressions, invalid, unsupported};
use crate::SqlError;
use crate::parse::syntax;

/// One expression from text (the `event_time` option).
pub(super) fn parse_expression(text: &str) -> Result<Expr, SqlError> {
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(text).map_err(syntax)?;
    let expr = parser.parse_expr().map_err(syntax)?;
    if parser.peek_token().token != Token::EOF {
        return Err(SqlError::Syntax(format!("one expression expected, found more: {}", parser.peek_token())));
    }
    convert_expr(&expr)
}

/// A SQL expression as the engine's. Aggregates are not expressions: a view's SELECT list takes
/// them whole, and anywhere else they are refused.
pub(crate) fn convert_expr(expr: &ast::Expr) -> Result<Expr, SqlError> {
    use ast::Expr as Sql;
    let boxed = |expr: &ast::Expr| convert_expr(expr).map(Box::new);
    Ok(match expr {
        Sql::Identifier(ident) => identifier(ident),
        Sql::CompoundIdentifier(parts) => {
            // A dotted name is a path into the value; a leading `value.` may be written.
            let parts = match parts.split_first() {
                Some((first, rest)) if is_value(first) => rest,
                _ => parts.as_slice(),
            };
            Expr::Path { path: parts.iter().map(|part| Step::Field(part.value.clone())).collect() }
        }
        Sql::CompoundFieldAccess { root, access_chain } => {
            let mut steps = Vec::with_capacity(access_chain.len());
            for access in access_chain {
                steps.push(match access {
                    ast::AccessExpr::Dot(Sql::Identifier(ident)) => Step::Field(ident.value.clone()),
                    ast::AccessExpr::Subscript(ast::Subscript::Index { index }) => step(index)?,
                    other => return Err(unsupported(other, expressions())),
                });
            }
            get(convert_expr(root)?, steps, false)
        }
        Sql::Nested(inner) => convert_expr(inner)?,
        Sql::Value(value) => Expr::Literal { value: literal_value(&value.value)? },
        Sql::UnaryOp { op, expr } => match op {
            ast::UnaryOperator::Minus => negate(convert_expr(expr)?),
            ast::UnaryOperator::Plus => convert_expr(expr)?,
            ast::UnaryOperator::Not => Expr::Unary { operator: UnaryOp::Not, expr: boxed(expr)? },
            other => return Err(unsupported(format!("the operator {other}"), expressions())),
        },
        Sql::BinaryOp { left, op, right } => match op {
            ast::BinaryOperator::Arrow => get(convert_expr(left)?, vec![step(right)?], false),
            ast::BinaryOperator::LongArrow => get(convert_expr(left)?, vec![step(right)?], true),
            op => match regex_operator(op) {
                Some((negated, case_insensitive)) => regex(left, right, negated, case_insensitive)?,
                None => Expr::Binary { operator: binary_operator(op)?, left: boxed(left)?, right: boxed(right)? },
            },
        },
        Sql::IsNull(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: false },
        Sql::IsNotNull(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: true },
        Sql::IsUnknown(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: false },
        Sql::IsNotUnknown(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::Null, negated: true },
        Sql::IsTrue(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::True, negated: false },
        Sql::IsNotTrue(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::True, negated: true },
        Sql::IsFalse(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::False, negated: false },
        Sql::IsNotFalse(expr) => Expr::Is { expr: boxed(expr)?, test: IsTest::False, negated: true },
        Sql::InList { expr, list, negated } => Expr::In {
            expr: boxed(expr)?,
            list: list.iter().map(convert_expr).collect::<Result<_, _>>()?,
            negated: *negated,
        },
        Sql::Between { expr, negated, low, high } => {
            Expr::Between { expr: boxed(expr)?, low: boxed(low)?, high: boxed(high)?, negated: *negated }
        }
        Sql::Like { negated, any, expr, pattern, escape_char } => {
            like(expr, pattern, *negated, *any, escape_char, false)?
        }
        Sql::ILike { negated, any, expr, pattern, escape_char } => {
            like(expr, pattern, *negated, *any, escape_char, true)?
        }
        Sql::Case { operand, conditions, else_result, .. } => Expr::Case {
            operand: operand.as_deref().map(boxed).transpose()?,
            branches: conditions
                .iter()
                .map(|branch| Ok(When { when: convert_expr(&branch.condition)?, then: convert_expr(&branch.result)? }))
                .collect::<Result<_, SqlError>>()?,
            otherwise: else_result.as_deref().map(boxed).transpose()?,
        },
        Sql::Cast { expr, data_type, format: None, .. } => Expr::Cast { expr: boxed(expr)?, to: cast_type(data_type)? },
        Sql::Function(function) => call(expr, function)?,
        // `ARRAY[a, b]`: a JSON array.
        Sql::Array(array) => Expr::Call {
            function: Function::JsonBuildArray,
            args: array.elem.iter().map(convert_expr).collect::<Result<_, _>>()?,
        },
        Sql::Substring { expr: text, substring_from, substring_for, .. } => {
            let start = match (substring_from, substring_for) {
                (Some(start), _) => convert_expr(start)?,
                (None, Some(_)) => Expr::Literal { value: Value::from(1) },
                (None, None) => {
                    return Err(invalid(format!(
                        "SUBSTRING takes (text, start [, length]) or (text FROM start [FOR length]): {expr}"
                    )));
                }
            };
            let mut args = vec![convert_expr(text)?, start];
            if let Some(length) = substring_for {
                args.push(convert_expr(length)?);
            }
            Expr::Call { function: Function::Substring, args }
        }
        Sql::Trim { trim_where, trim_what, expr, trim_characters } => {
            let function = match trim_where {
                None | Some(ast::TrimWhereField::Both) => Function::Trim,
                Some(ast::TrimWhereField::Leading) => Function::Ltrim,
                Some(ast::TrimWhereField::Trailing) => Function::Rtrim,
            };
            let characters = match (trim_what, trim_characters.as_deref()) {
                (Some(characters), None) => Some(characters.as_ref()),
                (None, Some([characters])) => Some(characters),
                (None, None) => None,
                _ => return Err(unsupported(expr, format!("{} takes (text [, characters])", function.name()))),
            };
            let mut args = vec![convert_expr(expr)?];
            if let Some(characters) = characters {
                args.push(convert_expr(characters)?);
            }
            Expr::Call { function, args }
        }
        Sql::Ceil { expr: inner, field } | Sql::Floor { expr: inner, field } => {
            let function = if matches!(expr, Sql::Ceil { .. }) { Function::Ceil } else { Function::Floor };
            match field {
                ast::CeilFloorKind::DateTimeField(ast::DateTimeField::NoDateTime) => {
                    Expr::Call { function, args: vec![convert_expr(inner)?] }
                }
                _ => return Err(unsupported(expr, format!("{} takes one number", function.name()))),
            }
        }
        Sql::Subquery(_) | Sql::Exists { .. } | Sql::InSubquery { .. } => {
            return Err(unsupported("a subquery", expressions()));
        }
        Sql::Interval(_) => {
            return Err(unsupported("INTERVAL outside a window function", expressions()));
        }
        other => return Err(unsupported(format!("the expression {other}"), expressions())),
    })
}

/// `value` written plainly (not quoted): the whole value.
fn is_value(ident: &ast::Ident) -> bool {
    ident.quote_style.is_none() && ident.value.eq_ignore_ascii_case("value")
}

/// A bare name: `value`, a record field, or a field of the value. A quoted name is always a
/// field of the value (`"key"` is the value's field `key`, not the record's key).
fn identifier(ident: &ast::Ident) -> Expr {
    if is_value(ident) {
        return Expr::Path { path: Vec::new() };
    }
    if ident.quote_style.is_none()
        && let Some(field) = RecordField::from_name(&ident.value)
    {
        return Expr::Record { field };
    }
    Expr::Path { path: vec![Step::Field(ident.value.clone())] }
}

/// `base->steps` (or `->>` with `text`), folding chains into one walk: `value->'a'->'b'` is the
/// path `a.b`, and `x->'a'->>'b'` walks `x` once.
fn get(base: Expr, mut steps: Vec<Step>, text: bool) -> Expr {
    match base {
        Expr::Path { mut path } if !text => {
            path.append(&mut steps);
            Expr::Path { path }
        }
        Expr::Get { base, mut path, text: false } => {
            path.append(&mut steps);
            Expr::Get { base, path, text }
        }
        base => Expr::Get { base: Box::new(base), path: steps, text },
    }
}

/// The right side of `->`/`->>` or a subscript: a field name or an array index, as a literal.
fn step(expr: &ast::Expr) -> Result<Step, SqlError> {
    match convert_expr(expr)? {
        Expr::Literal { value: Value::String(name) } => Ok(Step::Field(name)),
        Expr::Literal { value: Value::Number(number) } if number.as_i64().is_some() => {
            Ok(Step::Index(number.as_i64().unwrap_or_default()))
        }
        _ => Err(unsupported(
            format!("{expr} after -> or ->>"),
            "they take a literal field name or array index: value->'items'->0->>'sku'",
        )),
    }
}

pub(super) fn string_value(value: &ast::Value) -> Option<&str> {
    match value {
        ast::Value::SingleQuotedString(text)
        | ast::Value::DoubleQuotedString(text)
        | ast::Value::EscapedStringLiteral(text)
        | ast::Value::UnicodeStringLiteral(text)
        | ast::Value::NationalStringLiteral(text) => Some(text),
        ast::Value::DollarQuotedString(quoted) => Some(&quoted.value),
        _ => None,
    }
}

fn literal_value(value: &ast::Value) -> Result<Value, SqlError> {
    match value {
        ast::Value::Number(text, _) => number_value(text).ok_or_else(|| invalid(format!("{text} is not a number"))),
        ast::Value::Boolean(truth) => Ok(Value::Bool(*truth)),
        ast::Value::Null => Ok(Value::Null),
        other => match string_value(other) {
            Some(text) => Ok(Value::String(text.to_string())),
            None => {
                Err(unsupported(format!("the literal {other}"), "literals are numbers, 'text', TRUE, FALSE and NULL"))
            }
        },
    }
}

/// A numeric literal: an integer when it is one (i64, or u64 above that), else a finite float.
fn number_value(text: &str) -> Option<Value> {
    if let Ok(int) = text.parse::<i64>() {
        return Some(Value::from(int));
    }
    if let Ok(int) = text.parse::<u64>() {
        return Some(Value::from(int));
    }
    let float = text.parse::<f64>().ok().filter(|float| float.is_finite())?;
    Number::from_f64(float).map(Value::Number)
}

/// `-x`, folded into a numeric literal (so `-9223372036854775808` is i64::MIN).
fn negate(expr: Expr) -> Expr {
    if let Expr::Literal { value: Value::Number(number) } = &expr {
        if let Some(negated) = number.as_i64().and_then(i64::checked_neg) {
            return Expr::Literal { value: Value::from(negated) };
        }
        if number.as_u64() == Some(1 << 63) {
            return Expr::Literal { value: Value::from(i64::MIN) };
        }
        if number.is_f64()
            && let Some(negated) = number.as_f64().and_then(|float| Number::from_f64(-float))
        {
            return Expr::Literal { value: Value::Number(negated) };
        }
    }
    Expr::Unary { operator: UnaryOp::Negate, expr: Box::new(expr) }
}

fn binary_operator(op: &ast::BinaryOperator) -> Result<BinaryOp, SqlError> {
    use ast::BinaryOperator as Sql;
    Ok(match op {
        Sql::Plus => BinaryOp::Add,
        Sql::Minus => BinaryOp::Subtract,
        Sql::Multiply => BinaryOp::Multiply,
        Sql::Divide => BinaryOp::Divide,
        Sql::Modulo => BinaryOp::Modulo,
        Sql::Eq => BinaryOp::Eq,
        Sql::NotEq => BinaryOp::NotEq,
        Sql::Lt => BinaryOp::Lt,
        Sql::LtEq => BinaryOp::LtEq,
        Sql::Gt => BinaryOp::Gt,
        Sql::GtEq => BinaryOp::GtEq,
        Sql::And => BinaryOp::And,
        Sql::Or => BinaryOp::Or,
        Sql::StringConcat => BinaryOp::Concat,
        other => return Err(unsupported(format!("the operator {other}"), expressions())),
    })
}

fn like(
    expr: &ast::Expr,
    pattern: &ast::Expr,
    negated: bool,
    any: bool,
    escape: &Option<Box<ast::Expr>>,
    case_insensitive: bool,
) -> Result<Expr, SqlError> {
    if any {
        return Err(unsupported("LIKE ANY", "LIKE takes one pattern; combine several with OR"));
    }
    // SQL's default escape character is a backslash; ESCAPE '' turns escaping off.
    let escape = match escape.as_deref() {
        None => Some('\\'),
        Some(ast::Expr::Value(value)) => {
            let text = string_value(&value.value).unwrap_or_default();
            let mut chars = text.chars();
            match (chars.next(), chars.next()) {
                (None, _) if string_value(&value.value).is_some() => None,
                (Some(c), None) => Some(c),
                _ => return Err(invalid(format!("ESCAPE {value}: the escape is one character in quotes"))),
            }
        }
        Some(other) => return Err(invalid(format!("ESCAPE {other}: the escape is one character in quotes"))),
    };
    Ok(Expr::Like {
        expr: Box::new(convert_expr(expr)?),
        pattern: Box::new(convert_expr(pattern)?),
        negated,
        case_insensitive,
        escape,
    })
}

/// Postgres's regular-expression operators (`~`, `~*`, `!~`, `!~*`, also spelled
/// `OPERATOR(pg_catalog.~)`): (negated, ignoring case).
fn regex_operator(op: &ast::BinaryOperator) -> Option<(bool, bool)> {
    match op {
        ast::BinaryOperator::PGRegexMatch => Some((false, false)),
        ast::BinaryOperator::PGRegexIMatch => Some((false, true)),
        ast::BinaryOperator::PGRegexNotMatch => Some((true, false)),
        ast::BinaryOperator::PGRegexNotIMatch => Some((true, true)),
        ast::BinaryOperator::PGCustomBinaryOperator(parts) => match parts.as_slice() {
            [operator] | [_, operator] => match operator.as_str() {
                "~" => Some((false, false)),
                "~*" => Some((false, true)),
                "!~" => Some((true, false)),
                "!~*" => Some((true, true)),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// `text ~ pattern` as `REGEXP_LIKE(text, pattern[, 'i'])`, negated for `!~`; a pattern given
/// as a literal is checked here, so a bad one is refused rather than matching nothing.
fn regex(text: &ast::Expr, pattern: &ast::Expr, negated: bool, case_insensitive: bool) -> Result<Expr, SqlError> {
    let pattern = convert_expr(pattern)?;
    if let Expr::Literal { value: Value::String(literal) } = &pattern {
        onehop_engine::view::expr::compile_regex(literal, case_insensitive).map_err(invalid)?;
    }
    let mut args = vec![convert_expr(text)?, pattern];
    if case_insensitive {
        args.push(Expr::Literal { value: Value::from("i") });
    }
    let matched = Expr::Call { function: Function::RegexpLike, args };
    Ok(if negated { Expr::Unary { operator: UnaryOp::Not, expr: Box::new(matched) } } else { matched })
}

fn cast_type(data_type: &ast::DataType) -> Result<CastType, SqlError> {
    let text = data_type.to_string().to_ascii_uppercase();
    // Lengths and precisions do not matter: VARCHAR(20) is TEXT.
    let plain = text.split('(').next().unwrap_or_default().trim();
    Ok(match plain {
        "TEXT" | "VARCHAR" | "CHARACTER VARYING" | "STRING" => CastType::Text,
        "BIGINT" | "INTEGER" | "INT" | "INT8" | "INT64" => CastType::Bigint,
        "DOUBLE" | "DOUBLE PRECISION" | "FLOAT" | "FLOAT8" | "FLOAT64" | "REAL" => CastType::Double,
        "BOOLEAN" | "BOOL" => CastType::Boolean,
        _ => {
            return Err(unsupported(
                format!("CAST to {data_type}"),
                "CAST takes TEXT (VARCHAR), BIGINT (INTEGER, INT), DOUBLE (FLOAT, REAL) and BOOLEAN",
            ));
        }
    })
}

/// A function's name, when it is a plain one.
pub(crate) fn function_name(function: &ast::Function) -> Option<String> {
    match function.name.0.as_slice() {
        [part] => part.as_ident().map(|ident| ident.value.clone()),
        // Postgres's built-in functions are in pg_catalog, and clients often say so.
        [schema, part] if schema.as_ident().is_some_and(|schema| schema.value.eq_ignore_ascii_case("pg_catalog")) => {
            part.as_ident().map(|ident| ident.value.clone())
        }
        _ => None,
    }
}

/// A scalar function call.
fn call(expr: &ast::Expr, function: &ast::Function) -> Result<Expr, SqlError> {
    let name =
        function_name(function).ok_or_else(|| unsupported(format!("the function {}", function.name), expressions()))?;
    let upper = name.to_ascii_uppercase();
    if aggregate_kind(&name).is_some() {
        return Err(unsupported(
            format!("{upper}() inside an expression or WHERE"),
            "an aggregate is a whole column of a view's SELECT list (SUM(amount) AS total); a stream transform has none",
        ));
    }
    let Some(scalar) = Function::from_name(&name) else {
        return Err(unsupported(format!("the function {upper}()"), format!("the functions are {FUNCTION_NAMES}")));
    };
    if function.over.is_some() {
        return Err(unsupported("window functions (OVER)", "views window their source in FROM"));
    }
    let args = match &function.args {
        ast::FunctionArguments::List(list)
            if list.duplicate_treatment.is_none()
                && list.clauses.is_empty()
                && function.filter.is_none()
                && function.within_group.is_empty()
                && function.null_treatment.is_none()
                && matches!(function.parameters, ast::FunctionArguments::None) =>
        {
            &list.args
        }
        ast::FunctionArguments::None => &Vec::new(),
        _ => return Err(unsupported(expr, format!("{upper} takes plain arguments: {upper}(x, …)"))),
    };
    let args = args
        .iter()
        .map(|arg| match arg {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(arg)) => convert_expr(arg),
            other => Err(unsupported(format!("the argument {other} of {upper}"), "arguments are expressions")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (min, max) = scalar.arity();
    if args.len() < min || max.is_some_and(|max| args.len() > max) {
        let wanted = match max {
            Some(max) if max == min => format!("{min}"),
            Some(max) => format!("{min} to {max}"),
            None => format!("at least {min}"),
        };
        return Err(invalid(format!("{upper} takes {wanted} argument(s), {} given: {expr}", args.len())));
    }
    Ok(Expr::Call { function: scalar, args })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testing::{eval, path};
    use super::*;

    #[test]
    fn record_fields_paths_and_json_operators() {
        let value =
            json!({"region": "eu", "key": "value key", "customer": {"city": "Oslo", "tags": ["a", "b"]}, "n": 5});
        assert_eq!(eval("key", &value), json!("k1"));
        assert_eq!(eval("KEY", &value), json!("k1"));
        assert_eq!(eval("\"key\"", &value), json!("value key"));
        assert_eq!(eval("value.key", &value), json!("value key"));
        assert_eq!(eval("value->>'key'", &value), json!("value key"));
        assert_eq!(eval("subject", &value), json!("shop/eu"));
        assert_eq!(eval("ts", &value), json!(1000));
        assert_eq!(eval("partition", &value), json!(3));
        assert_eq!(eval("offset", &value), json!(42));
        assert_eq!(eval("value", &value), value);
        assert_eq!(eval("region", &value), json!("eu"));
        assert_eq!(eval("missing", &value), Value::Null);
        assert_eq!(eval("customer.city", &value), json!("Oslo"));
        assert_eq!(eval("value.customer.city", &value), json!("Oslo"));
        assert_eq!(eval("value->'customer'->'tags'->1", &value), json!("b"));
        assert_eq!(eval("value->'customer'->'tags'->-1", &value), json!("b"));
        assert_eq!(eval("customer->'tags'", &value), json!(["a", "b"]));
        assert_eq!(eval("customer->>'tags'", &value), json!("[\"a\",\"b\"]"));
        assert_eq!(eval("value->>'n'", &value), json!("5"));
        assert_eq!(eval("customer['city']", &value), json!("Oslo"));
        assert_eq!(eval("customer['tags'][0]", &value), json!("a"));
        // Folded into one walk of the value.
        assert_eq!(
            parse_expression("value->'customer'->'tags'->0").unwrap(),
            Expr::Path { path: vec![Step::Field("customer".into()), Step::Field("tags".into()), Step::Index(0)] }
        );
        assert_eq!(
            parse_expression("customer->'tags'->>0").unwrap(),
            Expr::Get { base: Box::new(path(&["customer", "tags"])), path: vec![Step::Index(0)], text: true }
        );
        assert!(error_of("customer->name").contains("literal field name or array index"));
    }

    fn error_of(text: &str) -> String {
        parse_expression(text).unwrap_err().to_string()
    }

    #[test]
    fn operators_and_null_semantics() {
        let value = json!({"a": 7, "b": 2, "f": 1.5, "s": "Hello", "t": true, "n": null});
        let cases = [
            ("a + b", json!(9)),
            ("a - b * 2", json!(3)),
            ("a / b", json!(3)),
            ("a % b", json!(1)),
            ("a / 0", Value::Null),
            ("a + f", json!(8.5)),
            ("-a", json!(-7)),
            ("- f", json!(-1.5)),
            ("-9223372036854775808", json!(i64::MIN)),
            ("9223372036854775807 + 1", Value::Null),
            ("a + s", Value::Null),
            ("a + missing", Value::Null),
            ("a = 7", json!(true)),
            ("a <> 7.0", json!(false)),
            ("a != 8", json!(true)),
            ("a < f", json!(false)),
            ("a >= 7 AND b <= 2", json!(true)),
            ("s > 'Apple'", json!(true)),
            ("a = '7'", Value::Null),
            ("n = n", Value::Null),
            ("t AND n", Value::Null),
            ("NOT t OR n", Value::Null),
            ("(a = 1) AND n", json!(false)),
            ("t OR n", json!(true)),
            ("NOT n", Value::Null),
            ("n IS NULL", json!(true)),
            ("missing IS NULL", json!(true)),
            ("a IS NOT NULL", json!(true)),
            ("t IS TRUE", json!(true)),
            ("n IS NOT TRUE", json!(true)),
            ("t IS FALSE", json!(false)),
            ("t IS NOT FALSE", json!(true)),
            ("n IS UNKNOWN", json!(true)),
            ("a IN (1, 7)", json!(true)),
            ("a NOT IN (1, 2)", json!(true)),
            ("a IN (1, NULL)", Value::Null),
            ("s LIKE 'He%'", json!(true)),
            ("s LIKE 'h%'", json!(false)),
            ("s ILIKE 'h%'", json!(true)),
            ("s NOT LIKE '_ello'", json!(false)),
            ("'100%' LIKE '100\\%'", json!(true)),
            ("'100!' LIKE '100!%' ESCAPE '!'", json!(false)),
            ("'a\\b' LIKE 'a\\b' ESCAPE ''", json!(true)),
            ("a BETWEEN 1 AND 7", json!(true)),
            ("a NOT BETWEEN 1 AND 7", json!(false)),
            ("CASE WHEN a > 5 THEN 'big' ELSE 'small' END", json!("big")),
            ("CASE WHEN n THEN 1 END", Value::Null),
            ("CASE s WHEN 'Hello' THEN 1 WHEN 'x' THEN 2 END", json!(1)),
            ("CAST(a AS TEXT)", json!("7")),
            ("CAST(a AS VARCHAR(3))", json!("7")),
            ("CAST('42' AS BIGINT)", json!(42)),
            ("CAST('x' AS INTEGER)", Value::Null),
            ("CAST(f AS INT)", json!(2)),
            ("CAST(a AS DOUBLE)", json!(7.0)),
            ("CAST('2.5' AS FLOAT)", json!(2.5)),
            ("CAST(a AS REAL)", json!(7.0)),
            ("CAST('yes' AS BOOLEAN)", json!(true)),
            ("a::text", json!("7")),
            ("s || '!'", json!("Hello!")),
            ("s || n", Value::Null),
            ("TRUE", json!(true)),
            ("NULL", Value::Null),
            ("1e3", json!(1000.0)),
            ("18446744073709551615", json!(u64::MAX)),
            ("'it''s'", json!("it's")),
            ("+a", json!(7)),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &value), expected, "{text}");
        }
    }

    #[test]
    fn functions() {
        let value = json!({"s": "  Hello  ", "w": "héllo", "x": -2.5, "i": -3, "n": null});
        let cases = [
            ("UPPER(w)", json!("HÉLLO")),
            ("lower('ABC')", json!("abc")),
            ("LENGTH(w)", json!(5)),
            ("CHAR_LENGTH(w)", json!(5)),
            ("TRIM(s)", json!("Hello")),
            ("LTRIM(s)", json!("Hello  ")),
            ("RTRIM(s)", json!("  Hello")),
            ("TRIM(BOTH 'x' FROM 'xxaxx')", json!("a")),
            ("TRIM(LEADING 'x' FROM 'xxaxx')", json!("axx")),
            ("TRIM(TRAILING 'x' FROM 'xxaxx')", json!("xxa")),
            ("TRIM('xxaxx', 'x')", json!("a")),
            ("LTRIM('xxa', 'x')", json!("a")),
            ("SUBSTRING(w, 2, 3)", json!("éll")),
            ("SUBSTRING(w, 2)", json!("éllo")),
            ("SUBSTRING(w FROM 2 FOR 3)", json!("éll")),
            ("SUBSTRING(w FROM 4)", json!("lo")),
            ("SUBSTR(w, 1, 1)", json!("h")),
            ("REPLACE(w, 'l', 'L')", json!("héLLo")),
            ("CONCAT(w, n, 1)", json!("héllo1")),
            ("COALESCE(n, missing, 'x')", json!("x")),
            ("NULLIF(i, -3)", Value::Null),
            ("ABS(i)", json!(3)),
            ("ABS(x)", json!(2.5)),
            ("ROUND(x)", json!(-3.0)),
            ("ROUND(1.23456, 3)", json!(1.235)),
            ("FLOOR(x)", json!(-3.0)),
            ("CEIL(x)", json!(-2.0)),
            ("CEILING(x)", json!(-2.0)),
            ("GREATEST(1, i, 4.5)", json!(4.5)),
            ("LEAST(1, i, n)", json!(-3)),
            ("UPPER(i)", Value::Null),
        ];
        for (text, expected) in cases {
            assert_eq!(eval(text, &value), expected, "{text}");
        }
        assert!(error_of("CAST(a AS DATE)").contains("CAST takes TEXT"));
        assert!(error_of("FLOOR(a TO DAY)").contains("FLOOR takes one number"));
        assert!(error_of("INTERVAL '1' SECOND").contains("INTERVAL outside a window function"));
        assert!(error_of("a IS DISTINCT FROM b").contains("is not supported here; expressions are"));
        assert!(error_of("a LIKE ANY ('x', 'y')").contains("LIKE ANY"));
        assert!(error_of("a LIKE 'x' ESCAPE 'ab'").contains("one character"));
        assert!(error_of("UPPER(DISTINCT a)").contains("plain arguments"));
        assert!(error_of("x'ff'").contains("the literal"));
    }
}
