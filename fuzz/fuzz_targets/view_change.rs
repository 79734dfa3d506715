//! A view's change-stream value as read back from disk: taking it apart answers its parts or
//! `None`, never a panic; what it answers lies inside the value; and every change written by
//! `change_value` (its row and `before` built from the input) comes apart into what was written.
#![no_main]

use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use onehop_engine::view::runtime::{change_parts, change_value};
use onehop_engine::view::state::Change;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if let Some(parts) = change_parts(data) {
        assert!(parts.fields.len() <= data.len());
        assert!(parts.before.is_none_or(|before| before.len() < data.len()));
    }
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (row, before) = text.split_once('\n').unwrap_or((text, ""));
    let (Ok(Value::Object(row)), before) = (serde_json::from_str::<Value>(row), serde_json::from_str::<Value>(before))
    else {
        return;
    };
    let before = before.ok().filter(Value::is_object).map(Arc::new);
    let row = Value::Object(row);
    let change = Change { key: "k".into(), row: Arc::new(row.clone()), is_final: false, removed: false, before };
    let value = change_value(&change);
    let parts = change_parts(&value).expect("a written change comes apart");
    let rebuilt: Value = serde_json::from_slice(&[b"{".as_slice(), parts.fields].concat()).unwrap();
    assert_eq!(rebuilt, row);
    let before: Option<Value> = parts.before.map(|before| serde_json::from_slice(before).unwrap());
    assert_eq!(before.as_ref(), change.before.as_deref());
});
