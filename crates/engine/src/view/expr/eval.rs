//! Evaluating an [`Expr`] against one record: the tree walk, value paths, and the operators
//! (arithmetic, comparison, three-valued AND/OR, IS, IN, BETWEEN, CASE). LIKE (`like`), CAST
//! (`value`) and the scalar functions (`function`) live beside it; this one calls them.

use std::borrow::Cow;
use std::cmp::Ordering;

use serde_json::Value;

use super::function::call;
use super::like::like;
use super::value::{NULL, Num, and, cast, compare, equals, float_value, is_true, number, or, owned, text_of, truth};
use super::{BinaryOp, Expr, Input, IsTest, Step, UnaryOp};

impl Expr {
    /// The value of this expression for one record.
    pub fn eval(&self, input: &Input) -> Value {
        self.value(input).into_owned()
    }

    /// Evaluation, borrowing from the record or the expression where the result is part of them.
    pub fn value<'v>(&'v self, input: &Input<'v>) -> Cow<'v, Value> {
        match self {
            Expr::Literal { value } => Cow::Borrowed(value),
            Expr::Record { field } => Cow::Owned(field.get(input)),
            Expr::Path { path } => scoped(input, path),
            Expr::Get { base, path, text } => {
                let found = match base.value(input) {
                    Cow::Borrowed(base) => walk(base, path).map(Cow::Borrowed),
                    Cow::Owned(base) => walk(&base, path).cloned().map(Cow::Owned),
                };
                match (found, *text) {
                    (None, _) => Cow::Borrowed(&NULL),
                    (Some(found), false) => found,
                    (Some(found), true) => owned(text_of(&found).map(|text| Value::String(text.into_owned()))),
                }
            }
            Expr::Unary { operator, expr } => {
                let value = expr.value(input);
                Cow::Owned(match operator {
                    UnaryOp::Negate => match number(&value) {
                        Some(Num::Int(int)) => int.checked_neg().map_or(Value::Null, Value::from),
                        Some(Num::Float(float)) => float_value(-float),
                        None => Value::Null,
                    },
                    UnaryOp::Not => truth(&value).map_or(Value::Null, |truth| Value::Bool(!truth)),
                })
            }
            Expr::Binary { operator, left, right } => Cow::Owned(binary(*operator, left, right, input)),
            Expr::Is { expr, test, negated } => {
                let value = expr.value(input);
                let holds = match test {
                    IsTest::Null => value.is_null(),
                    IsTest::True => *value == Value::Bool(true),
                    IsTest::False => *value == Value::Bool(false),
                };
                Cow::Owned(Value::Bool(holds != *negated))
            }
            Expr::In { expr, list, negated } => {
                let value = expr.value(input);
                if value.is_null() {
                    return Cow::Borrowed(&NULL);
                }
                let mut unknown = false;
                for item in list {
                    match equals(&value, &item.value(input)) {
                        Some(true) => return Cow::Owned(Value::Bool(!negated)),
                        Some(false) => {}
                        None => unknown = true,
                    }
                }
                owned((!unknown).then_some(Value::Bool(*negated)))
            }
            Expr::Like { expr, pattern, negated, case_insensitive, escape } => {
                let (value, pattern) = (expr.value(input), pattern.value(input));
                let (Value::String(text), Value::String(pattern)) = (&*value, &*pattern) else {
                    return Cow::Borrowed(&NULL);
                };
                Cow::Owned(Value::Bool(like(text, pattern, *escape, *case_insensitive) != *negated))
            }
            Expr::Between { expr, low, high, negated } => {
                let value = expr.value(input);
                let above_low = compare(&value, &low.value(input)).map(|order| order != Ordering::Less);
                let below_high = compare(&value, &high.value(input)).map(|order| order != Ordering::Greater);
                owned(and(above_low, below_high).map(|within| Value::Bool(within != *negated)))
            }
            Expr::Case { operand, branches, otherwise } => {
                let operand = operand.as_ref().map(|operand| operand.value(input));
                for branch in branches {
                    let when = branch.when.value(input);
                    let taken = match &operand {
                        Some(operand) => equals(operand, &when) == Some(true),
                        None => is_true(&when),
                    };
                    if taken {
                        return branch.then.value(input);
                    }
                }
                match otherwise {
                    Some(otherwise) => otherwise.value(input),
                    None => Cow::Borrowed(&NULL),
                }
            }
            Expr::Cast { expr, to } => owned(cast(&expr.value(input), *to)),
            Expr::Call { function, args } => call(*function, args, input),
        }
    }
}

/// A path's value: in one of the scope's rows when its first step names one, else in the
/// input's value.
fn scoped<'v>(input: &Input<'v>, path: &[Step]) -> Cow<'v, Value> {
    if let Some((Step::Field(first), rest)) = path.split_first()
        && let Some(part) = input.scope.iter().find(|part| &*part.alias == first.as_str())
    {
        let Some(row) = &part.row else { return Cow::Borrowed(&NULL) };
        return match rest.split_first() {
            None => Cow::Owned(Value::Object((**row).clone())),
            Some((Step::Field(name), more)) => {
                Cow::Borrowed(row.get(name).and_then(|at| walk(at, more)).unwrap_or(&NULL))
            }
            Some(_) => Cow::Borrowed(&NULL),
        };
    }
    Cow::Borrowed(walk(input.value, path).unwrap_or(&NULL))
}

fn walk<'v>(mut at: &'v Value, path: &[Step]) -> Option<&'v Value> {
    for step in path {
        at = match (step, at) {
            (Step::Field(name), Value::Object(fields)) => fields.get(name)?,
            (Step::Index(index), Value::Array(items)) => {
                let index = if *index < 0 {
                    items.len().checked_sub(usize::try_from(index.unsigned_abs()).ok()?)?
                } else {
                    usize::try_from(*index).ok()?
                };
                items.get(index)?
            }
            _ => return None,
        };
    }
    Some(at)
}

fn binary<'v>(operator: BinaryOp, left: &'v Expr, right: &'v Expr, input: &Input<'v>) -> Value {
    match operator {
        BinaryOp::And => {
            let left = truth(&left.value(input));
            if left == Some(false) {
                return Value::Bool(false);
            }
            and(left, truth(&right.value(input))).map_or(Value::Null, Value::Bool)
        }
        BinaryOp::Or => {
            let left = truth(&left.value(input));
            if left == Some(true) {
                return Value::Bool(true);
            }
            or(left, truth(&right.value(input))).map_or(Value::Null, Value::Bool)
        }
        _ => {
            let (left, right) = (left.value(input), right.value(input));
            let result = match operator {
                BinaryOp::Add | BinaryOp::Subtract | BinaryOp::Multiply | BinaryOp::Divide | BinaryOp::Modulo => {
                    arithmetic(operator, &left, &right)
                }
                BinaryOp::Eq => equals(&left, &right).map(Value::Bool),
                BinaryOp::NotEq => equals(&left, &right).map(|equal| Value::Bool(!equal)),
                BinaryOp::Lt => compare(&left, &right).map(|order| Value::Bool(order.is_lt())),
                BinaryOp::LtEq => compare(&left, &right).map(|order| Value::Bool(order.is_le())),
                BinaryOp::Gt => compare(&left, &right).map(|order| Value::Bool(order.is_gt())),
                BinaryOp::GtEq => compare(&left, &right).map(|order| Value::Bool(order.is_ge())),
                BinaryOp::Concat => match (text_of(&left), text_of(&right)) {
                    (Some(left), Some(right)) => Some(Value::String(left.into_owned() + &right)),
                    _ => None,
                },
                BinaryOp::And | BinaryOp::Or => unreachable!("handled above"),
            };
            result.unwrap_or(Value::Null)
        }
    }
}

/// `+ - * / %`: integers stay integers (overflow and division by zero are null; `/` truncates
/// like SQL's integer division); anything with a float is a float.
fn arithmetic(operator: BinaryOp, left: &Value, right: &Value) -> Option<Value> {
    match (number(left)?, number(right)?) {
        (Num::Int(left), Num::Int(right)) => {
            let result = match operator {
                BinaryOp::Add => left.checked_add(right),
                BinaryOp::Subtract => left.checked_sub(right),
                BinaryOp::Multiply => left.checked_mul(right),
                BinaryOp::Divide => left.checked_div(right),
                BinaryOp::Modulo => left.checked_rem(right),
                _ => None,
            };
            result.map(Value::from)
        }
        (left, right) => {
            let (left, right) = (left.float(), right.float());
            let result = match operator {
                BinaryOp::Add => left + right,
                BinaryOp::Subtract => left - right,
                BinaryOp::Multiply => left * right,
                BinaryOp::Divide | BinaryOp::Modulo if right == 0.0 => return None,
                BinaryOp::Divide => left / right,
                BinaryOp::Modulo => left % right,
                _ => return None,
            };
            Some(float_value(result))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::testing::{binary, eval, eval_on, expr, function, json_value, literal, op, path, record};
    use super::super::{Function, RecordField, When, as_time_ms, key_text};
    use super::*;

    #[test]
    fn record_fields_are_read_from_the_record() {
        let value = json!({"key": "in the value"});
        let field = |field| eval_on(&Expr::Record { field }, &value);
        assert_eq!(field(RecordField::Key), json!("k1"));
        assert_eq!(field(RecordField::Subject), json!("shop/orders"));
        assert_eq!(field(RecordField::Ts), json!(1_700_000_000_000i64));
        assert_eq!(field(RecordField::Partition), json!(2));
        assert_eq!(field(RecordField::Offset), json!(7));
        let bare = Input { key: None, subject: None, ..record(&value) };
        assert_eq!(Expr::Record { field: RecordField::Key }.eval(&bare), Value::Null);
        assert_eq!(Expr::Record { field: RecordField::Subject }.eval(&bare), Value::Null);
        let binary_key = Input { key: Some(&[b'a', 0xff]), ..bare };
        assert_eq!(Expr::Record { field: RecordField::Key }.eval(&binary_key), json!("a\u{fffd}"));
        assert_eq!(RecordField::from_name("OFFSET"), Some(RecordField::Offset));
        assert_eq!(RecordField::from_name("Ts"), Some(RecordField::Ts));
        assert_eq!(RecordField::from_name("value"), None);
    }

    /// A query's joined row: a path reads the scope's row its first step names, a missing
    /// row (a LEFT JOIN's miss) is null, and any other path reads the value.
    #[test]
    fn paths_read_the_scope_row_they_name_and_the_value_otherwise() {
        let row = |value: Value| match value {
            Value::Object(fields) => Some(std::sync::Arc::new(fields)),
            _ => None,
        };
        let scope = [
            super::super::Scoped { alias: "o".into(), row: row(json!({"qty": 2, "at": {"city": "Rome"}})) },
            super::super::Scoped { alias: "c".into(), row: None },
        ];
        let value = json!({"o": {"qty": 99}, "hidden": 7});
        let input = Input { scope: &scope, ..Input::row(&value) };
        assert_eq!(path("o.qty").eval(&input), json!(2));
        assert_eq!(path("o.at.city").eval(&input), json!("Rome"));
        assert_eq!(path("o").eval(&input), json!({"qty": 2, "at": {"city": "Rome"}}));
        assert_eq!(path("o.nothing").eval(&input), Value::Null);
        assert_eq!(path("c.name").eval(&input), Value::Null);
        assert_eq!(path("c").eval(&input), Value::Null);
        assert_eq!(path("hidden").eval(&input), json!(7));
    }

    #[test]
    fn paths_walk_objects_and_arrays() {
        let value = json!({"a": {"b": {"c": 3}}, "items": [10, 20, 30], "s": "text", "n": null});
        assert_eq!(eval_on(&path(""), &value), value);
        assert_eq!(eval_on(&path("a.b.c"), &value), json!(3));
        assert_eq!(eval_on(&path("a.b"), &value), json!({"c": 3}));
        assert_eq!(eval_on(&path("items.0"), &value), json!(10));
        assert_eq!(eval_on(&path("items.-1"), &value), json!(30));
        assert_eq!(eval_on(&path("items.-3"), &value), json!(10));
        for missing in ["items.3", "items.-4", "a.x", "a.b.c.d", "s.x", "n.x", "missing", "a.0"] {
            assert_eq!(eval_on(&path(missing), &value), Value::Null, "{missing}");
        }
        assert_eq!(eval_on(&path("a"), &json!("not an object")), Value::Null);
        assert_eq!(eval_on(&path("items.9223372036854775807"), &value), Value::Null);
        assert_eq!(eval_on(&path("items.-9223372036854775808"), &value), Value::Null);
    }

    #[test]
    fn get_walks_computed_values_and_gives_text_with_arrow_arrow() {
        let value = json!({"doc": {"n": 42, "f": 1.5, "s": "x", "o": {"k": [1, 2]}, "t": true, "z": null}});
        let get = |base: Expr, path: Vec<Step>, text| Expr::Get { base: Box::new(base), path, text };
        let field = |name: &str| vec![Step::Field(name.to_string())];
        assert_eq!(eval_on(&get(path("doc"), field("n"), false), &value), json!(42));
        let text = |name: &str| eval_on(&get(path("doc"), field(name), true), &value);
        assert_eq!(text("n"), json!("42"));
        assert_eq!(text("f"), json!("1.5"));
        assert_eq!(text("s"), json!("x"));
        assert_eq!(text("o"), json!("{\"k\":[1,2]}"));
        assert_eq!(text("t"), json!("true"));
        assert_eq!(text("z"), Value::Null);
        assert_eq!(text("missing"), Value::Null);
        // On an owned base (a CASE result): the same walk.
        let computed = Expr::Case {
            operand: None,
            branches: vec![When { when: literal(json!(true)), then: literal(json!({"a": [5, 6]})) }],
            otherwise: None,
        };
        let steps = vec![Step::Field("a".into()), Step::Index(1)];
        assert_eq!(eval(&get(computed.clone(), steps.clone(), false)), json!(6));
        assert_eq!(eval(&get(computed, steps, true)), json!("6"));
        assert_eq!(eval(&get(literal(json!("str")), field("a"), false)), Value::Null);
    }

    #[test]
    fn arithmetic_keeps_integers_and_turns_failures_into_null() {
        use BinaryOp::*;
        assert_eq!(op(Add, json!(2), json!(3)), json!(5));
        assert!(op(Add, json!(2), json!(3)).is_i64());
        assert_eq!(op(Add, json!(2), json!(0.5)), json!(2.5));
        assert_eq!(op(Subtract, json!(2), json!(5)), json!(-3));
        assert_eq!(op(Multiply, json!(4), json!(2.5)), json!(10.0));
        assert_eq!(op(Divide, json!(7), json!(2)), json!(3));
        assert_eq!(op(Divide, json!(-7), json!(2)), json!(-3));
        assert_eq!(op(Divide, json!(7.0), json!(2)), json!(3.5));
        assert_eq!(op(Modulo, json!(7), json!(3)), json!(1));
        assert_eq!(op(Modulo, json!(-7), json!(3)), json!(-1));
        assert_eq!(op(Modulo, json!(7.5), json!(2)), json!(1.5));
        for zero in [json!(0), json!(0.0)] {
            assert_eq!(op(Divide, json!(1), zero.clone()), Value::Null);
            assert_eq!(op(Modulo, json!(1), zero.clone()), Value::Null);
            assert_eq!(op(Divide, json!(1.5), zero), Value::Null);
        }
        assert_eq!(op(Add, json!(i64::MAX), json!(1)), Value::Null);
        assert_eq!(op(Subtract, json!(i64::MIN), json!(1)), Value::Null);
        assert_eq!(op(Multiply, json!(i64::MAX), json!(2)), Value::Null);
        assert_eq!(op(Divide, json!(i64::MIN), json!(-1)), Value::Null);
        assert_eq!(op(Modulo, json!(i64::MIN), json!(-1)), Value::Null);
        assert_eq!(op(Multiply, json!(1e308), json!(10)), Value::Null, "infinity is not JSON");
        // u64 beyond i64 is computed as a float.
        assert_eq!(op(Add, json!(u64::MAX), json!(0)), json!(u64::MAX as f64));
        for other in [json!("1"), json!(null), json!(true), json!([1]), json!({})] {
            assert_eq!(op(Add, json!(1), other.clone()), Value::Null, "{other}");
            assert_eq!(op(Add, other.clone(), json!(1)), Value::Null, "{other}");
        }
        let negate = |value| eval(&Expr::Unary { operator: UnaryOp::Negate, expr: Box::new(literal(value)) });
        assert_eq!(negate(json!(5)), json!(-5));
        assert_eq!(negate(json!(-1.5)), json!(1.5));
        assert_eq!(negate(json!(i64::MIN)), Value::Null);
        assert_eq!(negate(json!("5")), Value::Null);
        assert_eq!(negate(json!(null)), Value::Null);
    }

    #[test]
    fn comparisons_need_two_values_of_one_kind() {
        use BinaryOp::*;
        assert_eq!(op(Eq, json!(1), json!(1.0)), json!(true));
        assert_eq!(op(NotEq, json!(1), json!(1.0)), json!(false));
        assert_eq!(op(Lt, json!(1), json!(1.5)), json!(true));
        assert_eq!(op(Gt, json!(-1), json!(-1.5)), json!(true));
        assert_eq!(op(LtEq, json!(2), json!(2)), json!(true));
        assert_eq!(op(GtEq, json!(1.5), json!(2)), json!(false));
        // Exact even where a double cannot hold the integer.
        assert_eq!(op(Gt, json!(9_007_199_254_740_993i64), json!(9_007_199_254_740_992.0)), json!(true));
        assert_eq!(op(Lt, json!(i64::MAX), json!(1e19)), json!(true));
        assert_eq!(op(Gt, json!(i64::MIN), json!(-1e19)), json!(true));
        assert_eq!(op(Lt, json!(u64::MAX), json!(1e30)), json!(true));
        assert_eq!(op(Lt, json!("apple"), json!("banana")), json!(true));
        assert_eq!(op(Lt, json!("Z"), json!("a")), json!(true), "by code point");
        assert_eq!(op(Eq, json!("a"), json!("a")), json!(true));
        assert_eq!(op(Lt, json!(false), json!(true)), json!(true));
        assert_eq!(op(Eq, json!([1, {"a": 2}]), json!([1, {"a": 2}])), json!(true));
        assert_eq!(op(NotEq, json!({"a": 1}), json!({"a": 2})), json!(true));
        assert_eq!(op(Lt, json!([1]), json!([2])), Value::Null, "arrays have no order");
        for (left, right) in [
            (json!(1), json!("1")),
            (json!(null), json!(null)),
            (json!(1), json!(null)),
            (json!(true), json!(1)),
            (json!([1]), json!({})),
        ] {
            for operator in [Eq, NotEq, Lt, LtEq, Gt, GtEq] {
                assert_eq!(op(operator, left.clone(), right.clone()), Value::Null, "{left} {operator:?} {right}");
            }
        }
    }

    #[test]
    fn logic_is_three_valued() {
        use BinaryOp::{And, Or};
        let (t, f, n) = (json!(true), json!(false), json!(null));
        let cases = [
            (t.clone(), t.clone(), t.clone(), t.clone()),
            (t.clone(), f.clone(), f.clone(), t.clone()),
            (t.clone(), n.clone(), n.clone(), t.clone()),
            (f.clone(), f.clone(), f.clone(), f.clone()),
            (f.clone(), n.clone(), f.clone(), n.clone()),
            (n.clone(), n.clone(), n.clone(), n.clone()),
        ];
        for (left, right, and, or) in cases {
            assert_eq!(op(And, left.clone(), right.clone()), and, "{left} AND {right}");
            assert_eq!(op(And, right.clone(), left.clone()), and, "{right} AND {left}");
            assert_eq!(op(Or, left.clone(), right.clone()), or, "{left} OR {right}");
            assert_eq!(op(Or, right.clone(), left.clone()), or, "{right} OR {left}");
        }
        // Anything but a boolean is unknown.
        assert_eq!(op(And, json!(1), t.clone()), n);
        assert_eq!(op(Or, json!("true"), f.clone()), n);
        let not = |value| eval(&Expr::Unary { operator: UnaryOp::Not, expr: Box::new(literal(value)) });
        assert_eq!(not(t.clone()), f);
        assert_eq!(not(f.clone()), t);
        assert_eq!(not(n.clone()), n);
        assert_eq!(not(json!(0)), n);
    }

    #[test]
    fn is_tests_are_never_null() {
        let is = |value: Value, test, negated| eval(&Expr::Is { expr: Box::new(literal(value)), test, negated });
        assert_eq!(is(json!(null), IsTest::Null, false), json!(true));
        assert_eq!(is(json!(0), IsTest::Null, false), json!(false));
        assert_eq!(is(json!(0), IsTest::Null, true), json!(true));
        assert_eq!(
            eval_on(&Expr::Is { expr: Box::new(path("missing")), test: IsTest::Null, negated: false }, &json!({})),
            json!(true)
        );
        assert_eq!(is(json!(true), IsTest::True, false), json!(true));
        assert_eq!(is(json!(null), IsTest::True, true), json!(true));
        assert_eq!(is(json!(1), IsTest::True, false), json!(false));
        assert_eq!(is(json!(false), IsTest::False, false), json!(true));
        assert_eq!(is(json!(null), IsTest::False, false), json!(false));
    }

    #[test]
    fn in_lists_follow_sql() {
        let in_list = |value: Value, list: Vec<Value>, negated| {
            eval(&Expr::In { expr: Box::new(literal(value)), list: list.into_iter().map(literal).collect(), negated })
        };
        assert_eq!(in_list(json!(2), vec![json!(1), json!(2.0)], false), json!(true));
        assert_eq!(in_list(json!(3), vec![json!(1), json!(2)], false), json!(false));
        assert_eq!(in_list(json!(3), vec![json!(1), json!(2)], true), json!(true));
        assert_eq!(in_list(json!("a"), vec![json!("a"), json!(1)], false), json!(true));
        // No match, but one comparison unknown: unknown.
        assert_eq!(in_list(json!("c"), vec![json!("a"), json!(null)], false), Value::Null);
        assert_eq!(in_list(json!("c"), vec![json!("a"), json!(null)], true), Value::Null);
        assert_eq!(in_list(json!("c"), vec![json!("a"), json!(1)], true), Value::Null);
        assert_eq!(in_list(json!(null), vec![json!(1)], false), Value::Null);
        assert_eq!(in_list(json!(1), vec![], false), json!(false));
    }

    #[test]
    fn between_includes_both_ends() {
        let between = |value: Value, low: Value, high: Value, negated| {
            eval(&Expr::Between {
                expr: Box::new(literal(value)),
                low: Box::new(literal(low)),
                high: Box::new(literal(high)),
                negated,
            })
        };
        assert_eq!(between(json!(1), json!(1), json!(3), false), json!(true));
        assert_eq!(between(json!(3.0), json!(1), json!(3), false), json!(true));
        assert_eq!(between(json!(4), json!(1), json!(3), false), json!(false));
        assert_eq!(between(json!(4), json!(1), json!(3), true), json!(true));
        assert_eq!(between(json!("b"), json!("a"), json!("c"), false), json!(true));
        assert_eq!(between(json!(2), json!(1), json!(null), false), Value::Null);
        assert_eq!(between(json!(0), json!(1), json!(null), false), json!(false), "false beats unknown");
        assert_eq!(between(json!(null), json!(1), json!(3), true), Value::Null);
    }

    #[test]
    fn case_takes_the_first_matching_branch() {
        let branches = vec![
            When { when: binary(BinaryOp::Gt, path("n"), literal(json!(10))), then: literal(json!("big")) },
            When { when: binary(BinaryOp::Gt, path("n"), literal(json!(0))), then: literal(json!("small")) },
        ];
        let searched =
            Expr::Case { operand: None, branches: branches.clone(), otherwise: Some(Box::new(literal(json!("none")))) };
        assert_eq!(eval_on(&searched, &json!({"n": 11})), json!("big"));
        assert_eq!(eval_on(&searched, &json!({"n": 5})), json!("small"));
        assert_eq!(eval_on(&searched, &json!({"n": -5})), json!("none"));
        assert_eq!(eval_on(&searched, &json!({})), json!("none"), "an unknown WHEN is not taken");
        let no_else = Expr::Case { operand: None, branches, otherwise: None };
        assert_eq!(eval_on(&no_else, &json!({"n": -5})), Value::Null);
        let simple = Expr::Case {
            operand: Some(Box::new(path("status"))),
            branches: vec![
                When { when: literal(json!("paid")), then: literal(json!(1)) },
                When { when: literal(json!(null)), then: literal(json!(2)) },
            ],
            otherwise: Some(Box::new(literal(json!(0)))),
        };
        assert_eq!(eval_on(&simple, &json!({"status": "paid"})), json!(1));
        assert_eq!(eval_on(&simple, &json!({"status": "open"})), json!(0));
        assert_eq!(eval_on(&simple, &json!({})), json!(0), "null equals nothing, not even null");
    }

    #[test]
    fn concatenation() {
        assert_eq!(op(BinaryOp::Concat, json!("a"), json!("b")), json!("ab"));
        assert_eq!(op(BinaryOp::Concat, json!("n="), json!(5)), json!("n=5"));
        assert_eq!(op(BinaryOp::Concat, json!("a"), json!(null)), Value::Null);
        assert_eq!(function(Function::Concat, vec![json!("a"), json!(null), json!(1), json!(true)]), json!("a1true"));
        assert_eq!(function(Function::Concat, vec![json!(null)]), json!(""));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any expression over any value evaluates without panicking, to something JSON can
        /// hold, and survives the catalog's serde form.
        #[test]
        fn eval_never_panics(expr in expr(), value in json_value(), key in prop::option::of("[a-c]{0,3}")) {
            let input = Input { key: key.as_deref().map(str::as_bytes), ..record(&value) };
            let result = expr.eval(&input);
            let text = serde_json::to_string(&result).unwrap();
            prop_assert!(serde_json::from_str::<Value>(&text).is_ok());
            let _ = key_text(&result);
            let _ = as_time_ms(&result);
            let stored = serde_json::to_value(&expr).unwrap();
            prop_assert_eq!(serde_json::from_value::<Expr>(stored).unwrap(), expr);
        }

    }
}
