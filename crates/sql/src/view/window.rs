//! A view's FROM: the source and, for `TUMBLE|HOP|SLIDING|SESSION(source, …)`, the window and the
//! event time the call names; window lengths as INTERVALs or duration text.

use onehop_engine::units::parse_duration;
use onehop_engine::view::{Expr, Window};
use sqlparser::ast;

use super::expr::{convert_expr, string_value};
use super::query::source_relation;
use super::{SOURCE_SHAPE, invalid, unsupported};
use crate::SqlError;
use crate::parse::simple_name;

/// FROM of a view: the source, the window, and the event time a window function names.
pub(super) fn view_source(from: &[ast::TableWithJoins]) -> Result<(String, Window, Option<Expr>), SqlError> {
    let (name, args) = source_relation(from, SOURCE_SHAPE)?;
    let Some(args) = args else {
        return Ok((simple_name(name)?, Window::None, None));
    };
    let function = simple_name(name)?.to_ascii_uppercase();
    let (durations_wanted, form) = match function.as_str() {
        "TUMBLE" => (1, "TUMBLE(source, [time_column,] size)"),
        "HOP" => (2, "HOP(source, [time_column,] slide, size)"),
        "SLIDING" => (1, "SLIDING(source, [time_column,] size)"),
        "SESSION" => (1, "SESSION(source, [time_column,] gap)"),
        _ => return Err(unsupported(format!("FROM {name}(…)"), SOURCE_SHAPE)),
    };
    if args.settings.is_some() {
        return Err(unsupported(format!("SETTINGS in {function}"), form));
    }
    let args = args
        .args
        .iter()
        .map(|arg| match arg {
            ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(expr)) => Ok(expr),
            other => Err(invalid(format!("{function} takes plain arguments, {form}; found {other}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let Some((source, rest)) = args.split_first() else {
        return Err(invalid(format!("{function} needs its arguments: {form}")));
    };
    let source = match source {
        ast::Expr::Identifier(ident) => ident.value.clone(),
        other => {
            return Err(invalid(format!(
                "the first argument of {function} names the source stream, found {other}: {form}"
            )));
        }
    };
    if rest.len() != durations_wanted && rest.len() != durations_wanted + 1 {
        return Err(invalid(format!("{function} takes {form}; {} arguments were given", args.len())));
    }
    let (time_column, durations) = match rest.split_first() {
        Some((time_column, durations)) if rest.len() > durations_wanted => {
            (Some(convert_expr(time_column)?), durations)
        }
        _ => (None, rest),
    };
    let durations = durations.iter().map(|duration| duration_ms(duration)).collect::<Result<Vec<_>, _>>()?;
    let window = match (function.as_str(), durations.as_slice()) {
        ("TUMBLE", [size_ms]) => Window::Tumble { size_ms: *size_ms },
        ("HOP", [slide_ms, size_ms]) => {
            if slide_ms > size_ms {
                return Err(invalid(format!(
                    "HOP slide ({slide_ms} ms) is longer than its size ({size_ms} ms): events between windows \
                     would count nowhere; the slide must be at most the size (for gaps, filter with WHERE)"
                )));
            }
            if size_ms % slide_ms != 0 {
                return Err(invalid(format!(
                    "HOP size ({size_ms} ms) must be a whole multiple of its slide ({slide_ms} ms), so that \
                     every event is in the same number of windows (size / slide)"
                )));
            }
            Window::Hop { slide_ms: *slide_ms, size_ms: *size_ms }
        }
        ("SLIDING", [size_ms]) => Window::Sliding { size_ms: *size_ms },
        ("SESSION", [gap_ms]) => Window::Session { gap_ms: *gap_ms },
        _ => unreachable!("the argument count was checked against the window function"),
    };
    Ok((source, window, time_column))
}

/// A window length: `INTERVAL '5' SECOND`, `INTERVAL '5 seconds'` or `'5s'`, in ms.
fn duration_ms(expr: &ast::Expr) -> Result<u64, SqlError> {
    let text = match expr {
        ast::Expr::Interval(interval) => interval_text(interval)?,
        ast::Expr::Value(value) => match string_value(&value.value) {
            Some(text) => text.to_string(),
            None => return Err(not_a_duration(expr)),
        },
        _ => return Err(not_a_duration(expr)),
    };
    let duration = parse_duration(&text).map_err(|reason| invalid(format!("{expr}: {reason}")))?;
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return Err(invalid(format!("{expr} is shorter than a millisecond: windows are at least 1 ms")));
    }
    Ok(ms)
}

fn not_a_duration(expr: &ast::Expr) -> SqlError {
    invalid(format!("{expr} is not a duration: write INTERVAL '5' SECOND, INTERVAL '5 seconds' or '5s'"))
}

/// An INTERVAL as text `parse_duration` reads.
fn interval_text(interval: &ast::Interval) -> Result<String, SqlError> {
    const UNITS: &str = "one unit of MILLISECOND, SECOND, MINUTE, HOUR, DAY or WEEK (INTERVAL '90' SECOND), \
         or units in the text (INTERVAL '1 minute 30 seconds')";
    if interval.last_field.is_some() || interval.fractional_seconds_precision.is_some() {
        return Err(unsupported(format!("INTERVAL {interval}"), UNITS));
    }
    let value = match interval.value.as_ref() {
        ast::Expr::Value(value) => match &value.value {
            ast::Value::Number(number, _) => number.clone(),
            other => string_value(other).ok_or_else(|| not_a_duration(&interval.value))?.to_string(),
        },
        other => return Err(not_a_duration(other)),
    };
    let Some(field) = &interval.leading_field else {
        // SQL reads units in any case; parse_duration wants them in lower case.
        return Ok(value.to_lowercase());
    };
    use ast::DateTimeField as Field;
    let unit = match field {
        Field::Millisecond | Field::Milliseconds => "ms",
        Field::Second | Field::Seconds => "s",
        Field::Minute | Field::Minutes => "m",
        Field::Hour | Field::Hours => "h",
        Field::Day | Field::Days => "d",
        Field::Week(_) | Field::Weeks => "w",
        other => return Err(unsupported(format!("INTERVAL in {other}"), UNITS)),
    };
    Ok(format!("{value} {unit}"))
}

#[cfg(test)]
mod tests {
    use onehop_engine::view::expr::{RecordField, Step};

    use super::super::testing::{error, path, view};
    use super::*;

    #[test]
    fn every_window_form() {
        let window = |from: &str| {
            let def = view(&format!("CREATE VIEW v AS SELECT key, COUNT(*) FROM {from} GROUP BY key"));
            (def.source, def.window, def.event_time)
        };
        assert_eq!(window("orders"), ("orders".into(), Window::None, None));
        assert_eq!(window("TUMBLE(orders, '1m')"), ("orders".into(), Window::Tumble { size_ms: 60_000 }, None));
        assert_eq!(
            window("tumble(orders, placed_at, '1m')"),
            ("orders".into(), Window::Tumble { size_ms: 60_000 }, Some(path(&["placed_at"])))
        );
        assert_eq!(
            window("HOP(orders, INTERVAL '10' SECOND, INTERVAL '1' MINUTE)"),
            ("orders".into(), Window::Hop { slide_ms: 10_000, size_ms: 60_000 }, None)
        );
        assert_eq!(
            window("Hop(orders, ts, '30s', '30s')"),
            (
                "orders".into(),
                Window::Hop { slide_ms: 30_000, size_ms: 30_000 },
                Some(Expr::Record { field: RecordField::Ts })
            )
        );
        assert_eq!(window("SLIDING(orders, '5m')"), ("orders".into(), Window::Sliding { size_ms: 300_000 }, None));
        assert_eq!(
            window("SLIDING(orders, payload.at, '5m')"),
            ("orders".into(), Window::Sliding { size_ms: 300_000 }, Some(path(&["payload", "at"])))
        );
        assert_eq!(window("SESSION(clicks, '30m')"), ("clicks".into(), Window::Session { gap_ms: 1_800_000 }, None));
        assert_eq!(
            window("SESSION(clicks, value->>'at', '30m')").2,
            Some(Expr::Get { base: Box::new(path(&[])), path: vec![Step::Field("at".into())], text: true })
        );
    }

    #[test]
    fn intervals() {
        let size = |duration: &str| {
            let def = view(&format!("CREATE VIEW v AS SELECT COUNT(*) FROM TUMBLE(s, {duration}) GROUP BY key"));
            let Window::Tumble { size_ms } = def.window else { panic!("{:?}", def.window) };
            size_ms
        };
        assert_eq!(size("INTERVAL '5' SECOND"), 5_000);
        assert_eq!(size("INTERVAL '5' SECONDS"), 5_000);
        assert_eq!(size("INTERVAL 5 SECOND"), 5_000);
        assert_eq!(size("INTERVAL '5 seconds'"), 5_000);
        assert_eq!(size("INTERVAL '5 SECONDS'"), 5_000);
        assert_eq!(size("INTERVAL '1' MINUTE"), 60_000);
        assert_eq!(size("INTERVAL '1 minute 30 seconds'"), 90_000);
        assert_eq!(size("INTERVAL '250' MILLISECOND"), 250);
        assert_eq!(size("INTERVAL '2' HOUR"), 7_200_000);
        assert_eq!(size("INTERVAL '1' DAY"), 86_400_000);
        assert_eq!(size("INTERVAL '1' WEEK"), 604_800_000);
        assert_eq!(size("'5s'"), 5_000);
        assert_eq!(size("'1h 30m'"), 5_400_000);
        assert_eq!(size("'1.5s'"), 1_500);
        let message = |duration: &str| {
            error(&format!("CREATE VIEW v AS SELECT COUNT(*) FROM TUMBLE(s, {duration}) GROUP BY key"))
        };
        assert!(message("5").contains("not a duration: write INTERVAL '5' SECOND"), "{}", message("5"));
        assert!(message("'soon'").contains("not a duration"), "{}", message("'soon'"));
        assert!(message("'0s'").contains("at least 1 ms"));
        assert!(message("'500us'").contains("shorter than a millisecond"));
        assert!(message("INTERVAL '1' MONTH").contains("MILLISECOND, SECOND, MINUTE"));
        assert!(message("INTERVAL '1:30' MINUTE TO SECOND").contains("one unit"));
        assert!(message("INTERVAL '5' SECOND + INTERVAL '1' SECOND").contains("not a duration"));
    }
}
