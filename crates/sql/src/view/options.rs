//! A view's `WITH (…)` options: grace, emit, retention, start, late_stream and event_time, and
//! what a view without a window refuses of them.

use onehop_engine::units::parse_duration;
use onehop_engine::view::{Start, ViewDef, Window};
use sqlparser::ast::SqlOption;

use super::expr::parse_expression;
use crate::SqlError;
use crate::parse::literal;

pub(super) fn apply_view_options(def: &mut ViewDef, options: &[SqlOption]) -> Result<(), SqlError> {
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(SqlError::InvalidOption(format!("{option}: expected key = value")));
        };
        let key = key.value.to_ascii_lowercase();
        let text = literal(value)
            .ok_or_else(|| SqlError::InvalidOption(format!("{key} = {value}: expected a number or a string")))?;
        let invalid_option = |reason: String| SqlError::InvalidOption(format!("{key} = {text:?}: {reason}"));
        let duration_ms =
            || parse_duration(&text).map(|duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
        match key.as_str() {
            "grace" => def.grace_ms = duration_ms().map_err(invalid_option)?,
            "retention" => def.retention_ms = duration_ms().map_err(invalid_option)?,
            "emit" => {
                let (mut changes, mut final_) = (false, false);
                for part in text.split(',') {
                    match part.trim().to_ascii_lowercase().as_str() {
                        "changes" => changes = true,
                        "final" => final_ = true,
                        _ => return Err(invalid_option("expected 'changes', 'final' or 'changes,final'".into())),
                    }
                }
                (def.emit_changes, def.emit_final) = (changes, final_);
            }
            "start" => {
                def.start = match text.to_ascii_lowercase().as_str() {
                    "earliest" => Start::Earliest,
                    "latest" => Start::Latest,
                    _ => return Err(invalid_option("expected 'earliest' or 'latest'".into())),
                };
            }
            "late_stream" => {
                onehop_engine::validate_name(&text).map_err(|error| invalid_option(error.to_string()))?;
                if text == def.source || text == def.name {
                    return Err(invalid_option(
                        "late events go to another stream than the view's source or the view itself".into(),
                    ));
                }
                def.late_stream = Some(text.clone());
            }
            "event_time" => {
                if def.event_time.is_some() {
                    return Err(invalid_option(
                        "the window function names the time column already; give it once".into(),
                    ));
                }
                def.event_time = Some(parse_expression(&text).map_err(|error| invalid_option(error.to_string()))?);
            }
            other => {
                return Err(SqlError::InvalidOption(format!(
                    "unknown option {other:?}; a view takes grace, emit, retention, start, late_stream and event_time"
                )));
            }
        }
    }
    if def.window == Window::None {
        let refuse = |what: &str| {
            Err(SqlError::InvalidOption(format!(
                "{what} needs a window (FROM TUMBLE|HOP|SLIDING|SESSION(…)): running totals never close"
            )))
        };
        if def.emit_final {
            return refuse("emit = 'final'");
        }
        if def.grace_ms > 0 {
            return refuse("grace");
        }
        if def.late_stream.is_some() {
            return refuse("late_stream");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use onehop_engine::view::Expr;
    use onehop_engine::view::expr::BinaryOp;

    use super::super::testing::{error, path, view};
    use super::*;

    #[test]
    fn options_and_their_defaults() {
        let def = view(
            "CREATE VIEW v WITH (grace = '2s', emit = 'changes, final', retention = '1d', start = 'earliest', \
             late_stream = 'late_orders', event_time = 'payload.placed_at') \
             AS SELECT COUNT(*) FROM TUMBLE(orders, '1m') GROUP BY key",
        );
        assert_eq!(def.grace_ms, 2_000);
        assert!(def.emit_changes && def.emit_final);
        assert_eq!(def.retention_ms, 86_400_000);
        assert_eq!(def.start, Start::Earliest);
        assert_eq!(def.late_stream.as_deref(), Some("late_orders"));
        assert_eq!(def.event_time, Some(path(&["payload", "placed_at"])));
        let emit = |emit: &str| {
            let def = view(&format!(
                "CREATE VIEW v WITH (emit = '{emit}') AS SELECT COUNT(*) FROM TUMBLE(s, '1s') GROUP BY key"
            ));
            (def.emit_changes, def.emit_final)
        };
        assert_eq!(emit("changes"), (true, false));
        assert_eq!(emit("FINAL"), (false, true));
        assert_eq!(emit("final,changes"), (true, true));
        let def = view(
            "CREATE VIEW v WITH (event_time = 'CAST(ms AS BIGINT) * 1000', start = latest) AS SELECT COUNT(*) FROM s GROUP BY key",
        );
        assert!(matches!(def.event_time, Some(Expr::Binary { operator: BinaryOp::Multiply, .. })));
        assert_eq!(def.start, Start::Latest);
        let message = |options: &str| {
            error(&format!("CREATE VIEW v WITH ({options}) AS SELECT COUNT(*) FROM TUMBLE(s, '1s') GROUP BY key"))
        };
        assert!(
            message("colour = 'red'")
                .contains("a view takes grace, emit, retention, start, late_stream and event_time")
        );
        assert!(message("emit = 'sometimes'").contains("'changes', 'final' or 'changes,final'"));
        assert!(message("emit = ''").contains("'changes', 'final'"));
        assert!(message("start = 'now'").contains("'earliest' or 'latest'"));
        assert!(message("grace = 'a bit'").contains("grace = \"a bit\""));
        assert!(message("retention = 'forever'").contains("retention"));
        assert!(message("late_stream = 's'").contains("another stream than the view's source"));
        assert!(message("late_stream = '__late'").contains("reserved"));
        assert!(message("event_time = 'a +'").contains("syntax error"), "{}", message("event_time = 'a +'"));
        assert!(message("event_time = 'a b'").contains("one expression"));
        assert!(message("grace = ARRAY[1]").contains("expected a number or a string"));
        let both =
            error("CREATE VIEW v WITH (event_time = 'at') AS SELECT COUNT(*) FROM TUMBLE(s, at, '1s') GROUP BY key");
        assert!(both.contains("names the time column already"), "{both}");
        let running =
            |options: &str| error(&format!("CREATE VIEW v WITH ({options}) AS SELECT COUNT(*) FROM s GROUP BY key"));
        assert!(running("emit = 'final'").contains("needs a window"));
        assert!(running("grace = '1s'").contains("running totals never close"));
        assert!(running("late_stream = 'late'").contains("needs a window"));
        // A zero grace on running totals is no contradiction.
        assert_eq!(view("CREATE VIEW v WITH (grace = '0s') AS SELECT COUNT(*) FROM s GROUP BY key").grace_ms, 0);
    }
}
