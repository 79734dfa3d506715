//! Subjects and subject filters, with MQTT's rules, and a trie that finds every filter matching
//! a subject in time that grows with the matches, not with the number of filters.
//!
//! A subject is a `/`-separated topic such as `scores/team-42` (levels may be empty: `a//b`).
//! A filter is a subject pattern where a level may be `+` (exactly one level) or, as the last
//! level, `#` (any number of levels, zero included: `scores/#` matches `scores`). As in MQTT,
//! a filter starting with a wildcard does not match subjects starting with `$` (those are for
//! the system), so `#` does not see `$SYS/...`.

use std::collections::HashMap;
use std::fmt;

/// Longest subject or filter, in bytes (MQTT's limit, and the log's subject limit).
pub const SUBJECT_BYTES_MAX: usize = 65_535;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    #[error("a subject or filter cannot be empty")]
    Empty,
    #[error("{0} bytes is longer than the {SUBJECT_BYTES_MAX}-byte limit")]
    TooLong(usize),
    #[error("a subject or filter cannot contain the NUL character")]
    Nul,
    #[error("a subject cannot contain the wildcards '+' or '#' (they belong in filters)")]
    WildcardInSubject,
    #[error("'+' must be a whole level, as in \"a/+/c\", not part of one as in {0:?}")]
    PlusInsideLevel(String),
    #[error("'#' must be the whole last level, as in \"a/#\"; {0:?} is not")]
    HashNotLast(String),
}

fn check_common(text: &str) -> Result<(), SubjectError> {
    if text.is_empty() {
        return Err(SubjectError::Empty);
    }
    if text.len() > SUBJECT_BYTES_MAX {
        return Err(SubjectError::TooLong(text.len()));
    }
    if text.contains('\0') {
        return Err(SubjectError::Nul);
    }
    Ok(())
}

/// Checks that `subject` can be published to.
pub fn validate_subject(subject: &str) -> Result<(), SubjectError> {
    check_common(subject)?;
    if subject.contains(['+', '#']) {
        return Err(SubjectError::WildcardInSubject);
    }
    Ok(())
}

/// One level of a filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Level {
    Exact(Box<str>),
    /// `+`: exactly one level, whatever it is.
    One,
    /// `#`: any number of levels (only last).
    Rest,
}

/// A parsed, valid subject filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SubjectFilter {
    text: Box<str>,
    levels: Vec<Level>,
}

impl SubjectFilter {
    pub fn parse(text: &str) -> Result<SubjectFilter, SubjectError> {
        check_common(text)?;
        let parts: Vec<&str> = text.split('/').collect();
        let mut levels = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            let level = match *part {
                "+" => Level::One,
                "#" if i + 1 == parts.len() => Level::Rest,
                "#" => return Err(SubjectError::HashNotLast(text.to_string())),
                _ if part.contains('#') => return Err(SubjectError::HashNotLast(text.to_string())),
                _ if part.contains('+') => return Err(SubjectError::PlusInsideLevel(text.to_string())),
                exact => Level::Exact(exact.into()),
            };
            levels.push(level);
        }
        Ok(SubjectFilter { text: text.into(), levels })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the filter has no wildcard (it matches exactly one subject).
    pub fn is_exact(&self) -> bool {
        self.levels.iter().all(|level| matches!(level, Level::Exact(_)))
    }

    /// Whether `subject` matches, level by level. The trie gives the same answers for many
    /// filters at once; this is the definition it is tested against.
    pub fn matches(&self, subject: &str) -> bool {
        if subject.starts_with('$') && !matches!(self.levels.first(), Some(Level::Exact(_))) {
            return false;
        }
        let mut parts = subject.split('/');
        for level in &self.levels {
            match level {
                Level::Rest => return true,
                Level::One => {
                    if parts.next().is_none() {
                        return false;
                    }
                }
                Level::Exact(exact) => {
                    if parts.next() != Some(exact) {
                        return false;
                    }
                }
            }
        }
        parts.next().is_none()
    }

    /// Whether some subject matches both filters.
    pub fn overlaps(&self, other: &SubjectFilter) -> bool {
        let (mut mine, mut theirs) = (self.levels.iter(), other.levels.iter());
        loop {
            match (mine.next(), theirs.next()) {
                (Some(Level::Rest), _) | (_, Some(Level::Rest)) => return true,
                (None, None) => return true,
                (None, Some(_)) | (Some(_), None) => return false,
                (Some(Level::Exact(a)), Some(Level::Exact(b))) if a != b => return false,
                _ => {}
            }
        }
    }

    /// The first level when it is a name, not a wildcard.
    pub fn first_level(&self) -> Option<&str> {
        match self.levels.first() {
            Some(Level::Exact(first)) => Some(first),
            _ => None,
        }
    }
}

impl fmt::Display for SubjectFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Filters indexed by their levels, each with a value (a subscription, say) under an id.
pub struct SubjectTrie<T> {
    root: Node<T>,
    len: usize,
}

struct Node<T> {
    exact: HashMap<Box<str>, Node<T>>,
    one: Option<Box<Node<T>>>,
    /// Values of filters ending in `#` at this node.
    rest: Vec<(u64, T)>,
    /// Values of filters ending exactly at this node.
    here: Vec<(u64, T)>,
}

impl<T> Default for Node<T> {
    fn default() -> Self {
        Node { exact: HashMap::new(), one: None, rest: Vec::new(), here: Vec::new() }
    }
}

impl<T> Node<T> {
    fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.one.is_none() && self.rest.is_empty() && self.here.is_empty()
    }
}

impl<T> Default for SubjectTrie<T> {
    fn default() -> Self {
        SubjectTrie { root: Node::default(), len: 0 }
    }
}

impl<T> SubjectTrie<T> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Values stored.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Adds `value` under `filter` with `id` (ids tell values of one filter apart on removal).
    pub fn insert(&mut self, filter: &SubjectFilter, id: u64, value: T) {
        let mut node = &mut self.root;
        for level in &filter.levels {
            node = match level {
                Level::Exact(exact) => node.exact.entry(exact.clone()).or_default(),
                Level::One => node.one.get_or_insert_with(Default::default),
                Level::Rest => {
                    node.rest.push((id, value));
                    self.len += 1;
                    return;
                }
            };
        }
        node.here.push((id, value));
        self.len += 1;
    }

    /// Removes the value with `id` under `filter`, returning it; empty branches are pruned.
    pub fn remove(&mut self, filter: &SubjectFilter, id: u64) -> Option<T> {
        let removed = remove_at(&mut self.root, &filter.levels, id);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    /// Calls `visit` with every value whose filter matches `subject`.
    pub fn for_each_match(&self, subject: &str, mut visit: impl FnMut(u64, &T)) {
        // A subject starting with `$` is matched only by filters starting with its exact level.
        let system = subject.starts_with('$');
        visit_matches(&self.root, Some(subject), 0, system, &mut visit);
    }
}

fn remove_at<T>(node: &mut Node<T>, levels: &[Level], id: u64) -> Option<T> {
    let take = |values: &mut Vec<(u64, T)>| {
        values.iter().position(|(value_id, _)| *value_id == id).map(|at| values.swap_remove(at).1)
    };
    let Some((level, rest)) = levels.split_first() else { return take(&mut node.here) };
    match level {
        Level::Rest => take(&mut node.rest),
        Level::One => {
            let child = node.one.as_mut()?;
            let removed = remove_at(child, rest, id);
            if child.is_empty() {
                node.one = None;
            }
            removed
        }
        Level::Exact(exact) => {
            let child = node.exact.get_mut(exact)?;
            let removed = remove_at(child, rest, id);
            if child.is_empty() {
                node.exact.remove(exact);
            }
            removed
        }
    }
}

/// Visits the values of `node` matching `left`: the subject's levels from `depth` on, `None`
/// when none are left (so `a/` is `a` then an empty level, as `split('/')` has it). Walking
/// the subject in place, rather than splitting it into a list first, keeps routing a record
/// free of allocation.
fn visit_matches<T>(node: &Node<T>, left: Option<&str>, depth: usize, system: bool, visit: &mut impl FnMut(u64, &T)) {
    let wildcards_allowed = !(system && depth == 0);
    if wildcards_allowed {
        // `#` here matches whatever is left, nothing included.
        for (id, value) in &node.rest {
            visit(*id, value);
        }
    }
    let Some(left) = left else {
        for (id, value) in &node.here {
            visit(*id, value);
        }
        return;
    };
    let (level, rest) = match left.split_once('/') {
        Some((level, rest)) => (level, Some(rest)),
        None => (left, None),
    };
    if let Some(child) = node.exact.get(level) {
        visit_matches(child, rest, depth + 1, system, visit);
    }
    if wildcards_allowed && let Some(child) = &node.one {
        visit_matches(child, rest, depth + 1, system, visit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn filter(text: &str) -> SubjectFilter {
        SubjectFilter::parse(text).unwrap()
    }

    #[test]
    fn mqtt_matching_rules() {
        let cases = [
            ("sport/tennis/player1/#", "sport/tennis/player1", true),
            ("sport/tennis/player1/#", "sport/tennis/player1/ranking", true),
            ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", true),
            ("sport/#", "sport", true),
            ("#", "anything/at/all", true),
            ("sport/tennis/+", "sport/tennis/player1", true),
            ("sport/tennis/+", "sport/tennis/player1/ranking", false),
            ("sport/+", "sport", false),
            ("sport/+", "sport/", true),
            ("+/+", "/finance", true),
            ("/+", "/finance", true),
            ("+", "/finance", false),
            ("a//b", "a//b", true),
            ("#", "$SYS/uptime", false),
            ("+/uptime", "$SYS/uptime", false),
            ("$SYS/#", "$SYS/uptime", true),
            ("$SYS/+", "$SYS/uptime", true),
            ("scores/team-42", "scores/team-42", true),
            ("scores/team-42", "scores/team-4", false),
        ];
        let mut trie = SubjectTrie::new();
        for (i, (text, _, _)) in cases.iter().enumerate() {
            trie.insert(&filter(text), i as u64, *text);
        }
        for (i, (text, subject, expected)) in cases.iter().enumerate() {
            assert_eq!(filter(text).matches(subject), *expected, "{text} vs {subject}");
            let mut found = false;
            trie.for_each_match(subject, |id, _| found |= id == i as u64);
            assert_eq!(found, *expected, "trie: {text} vs {subject}");
        }
    }

    #[test]
    fn bad_filters_and_subjects_say_why() {
        assert_eq!(SubjectFilter::parse(""), Err(SubjectError::Empty));
        assert!(matches!(SubjectFilter::parse("a/#/b"), Err(SubjectError::HashNotLast(_))));
        assert!(matches!(SubjectFilter::parse("a/b#"), Err(SubjectError::HashNotLast(_))));
        assert!(matches!(SubjectFilter::parse("a/b+/c"), Err(SubjectError::PlusInsideLevel(_))));
        assert!(matches!(SubjectFilter::parse("a\0b"), Err(SubjectError::Nul)));
        assert!(matches!(SubjectFilter::parse(&"a".repeat(70_000)), Err(SubjectError::TooLong(70_000))));
        assert_eq!(validate_subject("scores/+"), Err(SubjectError::WildcardInSubject));
        assert_eq!(validate_subject("scores/team-42"), Ok(()));
        let message = SubjectFilter::parse("a/b+/c").unwrap_err().to_string();
        assert!(message.contains("whole level"), "{message}");
    }

    #[test]
    fn removal_prunes_and_keeps_the_rest() {
        let mut trie = SubjectTrie::new();
        let (a, b) = (filter("x/+/z"), filter("x/#"));
        trie.insert(&a, 1, "one");
        trie.insert(&a, 2, "two");
        trie.insert(&b, 3, "three");
        assert_eq!(trie.len(), 3);
        assert_eq!(trie.remove(&a, 1), Some("one"));
        assert_eq!(trie.remove(&a, 1), None);
        let mut seen = Vec::new();
        trie.for_each_match("x/y/z", |id, _| seen.push(id));
        seen.sort();
        assert_eq!(seen, [2, 3]);
        trie.remove(&a, 2);
        trie.remove(&b, 3);
        assert!(trie.is_empty());
        assert!(trie.root.is_empty(), "every branch was pruned");
    }

    fn level() -> impl Strategy<Value = String> {
        prop_oneof![Just("a".to_string()), Just("b".to_string()), Just(String::new()), Just("$s".to_string())]
    }

    fn subject() -> impl Strategy<Value = String> {
        proptest::collection::vec(level(), 1..5)
            .prop_map(|levels| levels.join("/"))
            .prop_filter("a subject is never empty", |subject| !subject.is_empty())
    }

    fn filter_text() -> impl Strategy<Value = String> {
        let filter_level = prop_oneof![3 => level(), 1 => Just("+".to_string())];
        (proptest::collection::vec(filter_level, 1..5), any::<bool>())
            .prop_map(|(mut levels, rest)| {
                if rest {
                    levels.push("#".to_string());
                }
                levels.join("/")
            })
            .prop_filter("a filter is never empty", |filter| !filter.is_empty())
    }

    proptest! {
        /// The trie finds exactly the filters the level-by-level definition matches.
        #[test]
        fn trie_agrees_with_the_definition(
            filters in proptest::collection::vec(filter_text(), 1..30),
            subjects in proptest::collection::vec(subject(), 1..20),
            removals in proptest::collection::vec(any::<bool>(), 30),
        ) {
            let parsed: Vec<SubjectFilter> = filters.iter().map(|text| filter(text)).collect();
            let mut trie = SubjectTrie::new();
            for (id, filter) in parsed.iter().enumerate() {
                trie.insert(filter, id as u64, ());
            }
            let mut live: Vec<bool> = vec![true; parsed.len()];
            for (id, filter) in parsed.iter().enumerate() {
                if removals[id] {
                    prop_assert!(trie.remove(filter, id as u64).is_some());
                    live[id] = false;
                }
            }
            prop_assert_eq!(trie.len(), live.iter().filter(|live| **live).count());
            for subject in &subjects {
                let mut found: Vec<u64> = Vec::new();
                trie.for_each_match(subject, |id, _| found.push(id));
                found.sort();
                let expected: Vec<u64> = parsed
                    .iter()
                    .enumerate()
                    .filter(|(id, filter)| live[*id] && filter.matches(subject))
                    .map(|(id, _)| id as u64)
                    .collect();
                prop_assert_eq!(found, expected, "subject {:?}", subject);
            }
        }

        /// Two filters overlap exactly when some subject matches both (searched among every
        /// subject of up to five levels over the filters' names plus one name neither uses).
        #[test]
        fn overlap_agrees_with_the_definition(a in filter_text(), b in filter_text()) {
            prop_assume!(!a.starts_with('$') && !b.starts_with('$'));
            let (a, b) = (filter(&a), filter(&b));
            let names = ["a", "b", "", "$s", "x"];
            let mut witness = false;
            let mut subjects: Vec<String> = names.iter().map(|name| name.to_string()).collect();
            for _ in 0..5 {
                witness |= subjects.iter().any(|subject| a.matches(subject) && b.matches(subject));
                subjects = subjects
                    .iter()
                    .flat_map(|subject| names.iter().map(move |name| format!("{subject}/{name}")))
                    .collect();
            }
            prop_assert_eq!(a.overlaps(&b), witness, "{} and {}", a, b);
            prop_assert_eq!(b.overlaps(&a), witness);
        }

        /// Parsing never panics, and what it accepts prints back as given.
        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,40}") {
            if let Ok(filter) = SubjectFilter::parse(&text) {
                prop_assert_eq!(filter.as_str(), text.as_str());
                let _ = filter.matches(&text);
            }
            let _ = validate_subject(&text);
        }
    }
}
