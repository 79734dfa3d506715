//! Arbitrary text as SQL, and as a JSON document: parsing answers statements or an error, never
//! a panic; every view and transform it defines evaluates against the document (and a few
//! nearby times) without panicking, and whatever a definition is, it survives the catalog's
//! JSON round trip unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_engine::view::state::ViewState;
use onehop_engine::view::{Input, TransformDef, ViewDef, Window};
use onehop_sql::{Statement, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (sql, document) = text.split_once('\n').unwrap_or((text, "{}"));
    let Ok(statements) = parse(sql) else { return };
    let value = serde_json::from_str::<serde_json::Value>(document).unwrap_or(serde_json::Value::Null);
    let record = onehop_log::Record {
        offset: 3,
        timestamp_ms: 1_700_000_000_000,
        key: Some(bytes::Bytes::from_static(b"k")),
        subject: Some("a/b".into()),
        headers: Default::default(),
        value: serde_json::to_vec(&value).ok().map(Into::into),
    };
    for statement in statements {
        match statement {
            Statement::CreateView { def, .. } => {
                let text = serde_json::to_string(&def).unwrap();
                assert_eq!(serde_json::from_str::<ViewDef>(&text).unwrap(), def);
                let mut state = ViewState::default();
                let mut rows = ViewState::default();
                let mut changes = Vec::new();
                for (i, arrival) in [0i64, 999, -5_000, 1_700_000_000_000, i64::MAX / 4].into_iter().enumerate() {
                    let input = Input { offset: i as u64, timestamp_ms: arrival, ..Input::of(&record, 0, &value) };
                    state.advance(&def, arrival.saturating_sub(1), &mut changes);
                    state.apply(&def, &input, arrival, &mut changes);
                    // As over a table (which only windowless views read): in, changed, out.
                    if def.window == Window::None {
                        rows.apply_row_change(&def, None, Some(&input), &mut changes);
                        rows.apply_row_change(&def, Some(&input), Some(&input), &mut changes);
                        if i % 2 == 0 {
                            rows.apply_row_change(&def, Some(&input), None, &mut changes);
                        }
                    }
                }
                state.advance(&def, i64::MAX / 2, &mut changes);
                let _ = state.rows(&def, "k");
                let _ = state.keys_page(&def, None, 10);
            }
            Statement::CreateTransform { def, .. } => {
                let text = serde_json::to_string(&def).unwrap();
                assert_eq!(serde_json::from_str::<TransformDef>(&text).unwrap(), def);
                let _ = def.apply(&Input::of(&record, 0, &value), &record);
            }
            _ => {}
        }
    }
});
