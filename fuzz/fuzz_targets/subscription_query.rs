//! Arbitrary text as a subscription URL and query, and as a JSON document: parsing answers a
//! target and a filter or an error, never a panic; and whenever a filter matches a document,
//! the hub's anchor for it (its first condition's typed keys) is among the keys the document
//! has at that field, so routing through the index finds every matching subscription.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_engine::filter::for_each_key;
use onehop_server::http::subscribe::{Params, Target};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (url, document) = text.split_once('\n').unwrap_or((text, "{}"));
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let target = Target::from_path(path).unwrap_or(Target::Stream("s".into()));
    let Ok(params) = Params::parse(query, &target) else { return };
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(document) else { return };
    let filter = &params.filter;
    if !filter.matches(filter.key.as_deref(), Some("a/b"), Some(&doc)) {
        return;
    }
    if let Some(condition) = filter.conditions.first() {
        let field = condition.field(&doc).expect("a matching condition's field exists");
        let mut anchored = false;
        for_each_key(field, |key| anchored |= condition.keys().iter().any(|wanted| wanted == key));
        assert!(anchored, "{condition:?} matches {doc} but its anchor keys are not the document's");
    }
});
