//! Arbitrary text as a subject filter and a subject: parsing answers Ok or an error, never a
//! panic; and for a valid filter, the trie agrees with the filter's own definition of a match.
#![no_main]

use libfuzzer_sys::fuzz_target;
use onehop_engine::subject::{SubjectFilter, SubjectTrie, validate_subject};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let (filter_text, subject) = text.split_once('\n').unwrap_or((text, text));
    let _ = validate_subject(subject);
    let Ok(filter) = SubjectFilter::parse(filter_text) else { return };
    assert_eq!(filter.as_str(), filter_text);
    let mut trie = SubjectTrie::new();
    trie.insert(&filter, 7, ());
    let mut found = false;
    trie.for_each_match(subject, |id, _| found |= id == 7);
    assert_eq!(found, filter.matches(subject), "filter {filter_text:?} subject {subject:?}");
    assert_eq!(trie.remove(&filter, 7), Some(()));
    assert!(trie.is_empty());
});
