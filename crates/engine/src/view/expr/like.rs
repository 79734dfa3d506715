//! SQL LIKE: `%` any run of characters, `_` one character, an optional escape character, and
//! ILIKE's case-insensitive form.

/// SQL LIKE: greedy matching that backtracks to the last `%`, so at worst
/// O(text × pattern) and without allocating.
pub(super) fn like(text: &str, pattern: &str, escape: Option<char>, case_insensitive: bool) -> bool {
    let same = |a: char, b: char| a == b || (case_insensitive && a.to_lowercase().eq(b.to_lowercase()));
    let char_at = |text: &str, at: usize| text[at..].chars().next();
    let (mut text_at, mut pattern_at) = (0, 0);
    // Where to resume after a mismatch: the pattern just after the last `%`, and how much of the
    // text that `%` has swallowed so far.
    let mut resume: Option<(usize, usize)> = None;
    loop {
        if let Some(wanted) = char_at(pattern, pattern_at) {
            if wanted == '%' && Some(wanted) != escape {
                pattern_at += 1;
                resume = Some((pattern_at, text_at));
                continue;
            }
            if let Some(got) = char_at(text, text_at) {
                let (literal, width) = match (Some(wanted) == escape, char_at(pattern, pattern_at + wanted.len_utf8()))
                {
                    (true, Some(escaped)) => (Some(escaped), wanted.len_utf8() + escaped.len_utf8()),
                    _ if wanted == '_' => (None, 1),
                    _ => (Some(wanted), wanted.len_utf8()),
                };
                if literal.is_none_or(|literal| same(literal, got)) {
                    pattern_at += width;
                    text_at += got.len_utf8();
                    continue;
                }
            }
        } else if text_at == text.len() {
            return true;
        }
        match resume {
            Some((resume_pattern_at, swallowed_to)) if swallowed_to < text.len() => {
                let swallowed = char_at(text, swallowed_to).map_or(1, char::len_utf8);
                resume = Some((resume_pattern_at, swallowed_to + swallowed));
                pattern_at = resume_pattern_at;
                text_at = swallowed_to + swallowed;
            }
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::super::Expr;
    use super::super::testing::{eval, literal};
    use super::*;

    fn like_with(text: &str, pattern: &str, escape: Option<char>, case_insensitive: bool) -> Value {
        eval(&Expr::Like {
            expr: Box::new(literal(json!(text))),
            pattern: Box::new(literal(json!(pattern))),
            negated: false,
            case_insensitive,
            escape,
        })
    }

    #[test]
    fn like_matches_percent_and_underscore() {
        let like = |text: &str, pattern: &str| like_with(text, pattern, Some('\\'), false) == json!(true);
        assert!(like("hello", "hello"));
        assert!(!like("hello", "Hello"));
        assert!(like("hello", "h%"));
        assert!(like("hello", "%o"));
        assert!(like("hello", "%ll%"));
        assert!(like("hello", "h_llo"));
        assert!(!like("hello", "h_lo"));
        assert!(like("hello", "%"));
        assert!(like("", "%"));
        assert!(like("", "%%"));
        assert!(!like("", "_"));
        assert!(like("", ""));
        assert!(!like("a", ""));
        assert!(like("abcbc", "a%bc"));
        assert!(like("aXbXc", "a%b%c"));
        assert!(!like("aXbXd", "a%b%c"));
        assert!(like("mississippi", "%iss%ppi"));
        assert!(like("héllo wörld", "h_llo w%d"));
        assert!(like("100%", "100\\%"));
        assert!(!like("1000", "100\\%"));
        assert!(like("a_b", "a\\_b"));
        assert!(!like("axb", "a\\_b"));
        assert!(like("a\\", "a\\"), "a trailing escape is literal");
        assert_eq!(like_with("100%", "100!%", Some('!'), false), json!(true));
        assert_eq!(like_with("a\\b", "a\\b", None, false), json!(true), "no escape character");
        assert_eq!(like_with("HeLLo", "hel%", Some('\\'), true), json!(true));
        assert_eq!(like_with("ÉCOLE", "éc%", Some('\\'), true), json!(true));
        let negated = Expr::Like {
            expr: Box::new(literal(json!("abc"))),
            pattern: Box::new(literal(json!("a%"))),
            negated: true,
            case_insensitive: false,
            escape: None,
        };
        assert_eq!(eval(&negated), json!(false));
        let on_number = Expr::Like {
            expr: Box::new(literal(json!(12))),
            pattern: Box::new(literal(json!("1%"))),
            negated: false,
            case_insensitive: false,
            escape: None,
        };
        assert_eq!(eval(&on_number), Value::Null);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// LIKE agrees with a naive recursive matcher.
        #[test]
        fn like_agrees_with_a_naive_matcher(text in "[ab%_\\\\]{0,8}", pattern in "[ab%_\\\\]{0,6}") {
            fn naive(text: &[char], pattern: &[char]) -> bool {
                match pattern.split_first() {
                    None => text.is_empty(),
                    Some(('%', rest)) => (0..=text.len()).any(|skip| naive(&text[skip..], rest)),
                    Some(('\\', [escaped, rest @ ..])) => text.first() == Some(escaped) && naive(&text[1..], rest),
                    Some(('_', rest)) => !text.is_empty() && naive(&text[1..], rest),
                    Some((c, rest)) => text.first() == Some(c) && naive(&text[1..], rest),
                }
            }
            let expected = naive(&text.chars().collect::<Vec<_>>(), &pattern.chars().collect::<Vec<_>>());
            prop_assert_eq!(like(&text, &pattern, Some('\\'), false), expected);
        }
    }
}
