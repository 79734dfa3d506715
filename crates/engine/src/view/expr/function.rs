//! The scalar functions of the expression language: their SQL names, their arity, and their
//! evaluation (a wrong argument is null, like any other value that does not fit).

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::value::{NULL, Num, compare, equals, float_value, integer, number, owned, text_of};
use super::{Expr, Input};

/// A scalar function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Function {
    Upper,
    Lower,
    Length,
    Trim,
    Ltrim,
    Rtrim,
    Substring,
    Replace,
    Concat,
    Coalesce,
    Nullif,
    Abs,
    Round,
    Floor,
    Ceil,
    Greatest,
    Least,
    /// `REGEXP_LIKE(text, pattern [, flags])`, and the operators `~`, `~*`, `!~`, `!~*`: whether
    /// the pattern matches anywhere in the text (`i` among the flags: ignoring case).
    RegexpLike,
    /// `JSON_BUILD_OBJECT(name, value, …)`: an object of the pairs (a name that is not text is
    /// written as text; a later pair replaces an earlier one of the same name).
    JsonBuildObject,
    /// `ARRAY_POSITION(array, value)`: the 1-based position of the first element equal to the
    /// value, or null (also what `value = ANY (array)` reads).
    ArrayPosition,
    /// `ARRAY_TO_STRING(array, separator [, null_text])`: the elements as text, joined (null
    /// elements left out, or written as `null_text`).
    ArrayToString,
    /// `JSON_BUILD_ARRAY(value, …)`, also `ARRAY[value, …]`: an array of the values.
    JsonBuildArray,
    /// `STRING_TO_ARRAY(text, separator [, null_text])`, also `SPLIT`: the text's pieces
    /// between separators (its characters for an empty separator; a piece equal to
    /// `null_text` is null).
    StringToArray,
    /// `REGEXP_SPLIT_TO_ARRAY(text, pattern [, flags])`, also `REGEXP_SPLIT`: the pieces
    /// between the pattern's matches.
    RegexpSplitToArray,
}

/// Names of the scalar functions, as [`Function::from_name`] accepts them (for error messages).
pub const FUNCTION_NAMES: &str = "UPPER, LOWER, LENGTH (CHAR_LENGTH), TRIM, LTRIM, RTRIM, SUBSTRING (SUBSTR), REPLACE, \
     CONCAT, COALESCE, NULLIF, ABS, ROUND, FLOOR, CEIL (CEILING), GREATEST, LEAST, REGEXP_LIKE, JSON_BUILD_OBJECT, ARRAY_POSITION, ARRAY_TO_STRING, JSON_BUILD_ARRAY, \
     STRING_TO_ARRAY (SPLIT), REGEXP_SPLIT_TO_ARRAY (REGEXP_SPLIT)";

impl Function {
    /// The function a SQL name means, in any case.
    pub fn from_name(name: &str) -> Option<Function> {
        const FUNCTIONS: [(&str, Function); 33] = [
            ("upper", Function::Upper),
            ("lower", Function::Lower),
            ("length", Function::Length),
            ("char_length", Function::Length),
            ("character_length", Function::Length),
            ("trim", Function::Trim),
            ("btrim", Function::Trim),
            ("ltrim", Function::Ltrim),
            ("rtrim", Function::Rtrim),
            ("substring", Function::Substring),
            ("substr", Function::Substring),
            ("replace", Function::Replace),
            ("concat", Function::Concat),
            ("coalesce", Function::Coalesce),
            ("nullif", Function::Nullif),
            ("abs", Function::Abs),
            ("round", Function::Round),
            ("floor", Function::Floor),
            ("ceil", Function::Ceil),
            ("ceiling", Function::Ceil),
            ("greatest", Function::Greatest),
            ("least", Function::Least),
            ("regexp_like", Function::RegexpLike),
            ("json_build_object", Function::JsonBuildObject),
            ("jsonb_build_object", Function::JsonBuildObject),
            ("array_position", Function::ArrayPosition),
            ("array_to_string", Function::ArrayToString),
            ("json_build_array", Function::JsonBuildArray),
            ("jsonb_build_array", Function::JsonBuildArray),
            ("string_to_array", Function::StringToArray),
            ("split", Function::StringToArray),
            ("regexp_split_to_array", Function::RegexpSplitToArray),
            ("regexp_split", Function::RegexpSplitToArray),
        ];
        FUNCTIONS.iter().find(|(function_name, _)| function_name.eq_ignore_ascii_case(name)).map(|(_, f)| *f)
    }

    /// The SQL name, upper case.
    pub fn name(self) -> &'static str {
        match self {
            Function::Upper => "UPPER",
            Function::Lower => "LOWER",
            Function::Length => "LENGTH",
            Function::Trim => "TRIM",
            Function::Ltrim => "LTRIM",
            Function::Rtrim => "RTRIM",
            Function::Substring => "SUBSTRING",
            Function::Replace => "REPLACE",
            Function::Concat => "CONCAT",
            Function::Coalesce => "COALESCE",
            Function::Nullif => "NULLIF",
            Function::Abs => "ABS",
            Function::Round => "ROUND",
            Function::Floor => "FLOOR",
            Function::Ceil => "CEIL",
            Function::Greatest => "GREATEST",
            Function::Least => "LEAST",
            Function::RegexpLike => "REGEXP_LIKE",
            Function::JsonBuildObject => "JSON_BUILD_OBJECT",
            Function::ArrayPosition => "ARRAY_POSITION",
            Function::ArrayToString => "ARRAY_TO_STRING",
            Function::JsonBuildArray => "JSON_BUILD_ARRAY",
            Function::StringToArray => "STRING_TO_ARRAY",
            Function::RegexpSplitToArray => "REGEXP_SPLIT_TO_ARRAY",
        }
    }

    /// How many arguments it takes: at least the first, at most the second (`None`: any number).
    pub fn arity(self) -> (usize, Option<usize>) {
        match self {
            Function::Upper | Function::Lower | Function::Length | Function::Abs | Function::Floor | Function::Ceil => {
                (1, Some(1))
            }
            Function::Trim | Function::Ltrim | Function::Rtrim | Function::Round => (1, Some(2)),
            Function::Substring
            | Function::RegexpLike
            | Function::ArrayToString
            | Function::StringToArray
            | Function::RegexpSplitToArray => (2, Some(3)),
            Function::Replace => (3, Some(3)),
            Function::Nullif | Function::ArrayPosition => (2, Some(2)),
            Function::JsonBuildObject | Function::JsonBuildArray => (0, None),
            Function::Concat | Function::Coalesce | Function::Greatest | Function::Least => (1, None),
        }
    }
}

pub(super) fn call<'v>(function: Function, args: &'v [Expr], input: &Input<'v>) -> Cow<'v, Value> {
    // Arity is checked when a definition is parsed; a missing argument here (a hand-written
    // catalog entry) is null like any other missing value.
    let arg = |index: usize| args.get(index).map_or(Cow::Borrowed(&NULL), |arg| arg.value(input));
    let string = |value: String| Cow::Owned(Value::String(value));
    match function {
        Function::Coalesce => {
            for arg in args {
                let value = arg.value(input);
                if !value.is_null() {
                    return value;
                }
            }
            Cow::Borrowed(&NULL)
        }
        Function::Nullif => {
            let (first, second) = (arg(0), arg(1));
            if equals(&first, &second) == Some(true) { Cow::Borrowed(&NULL) } else { first }
        }
        Function::Greatest | Function::Least => {
            let wanted = if function == Function::Greatest { Ordering::Greater } else { Ordering::Less };
            let mut best: Option<Cow<'v, Value>> = None;
            for arg in args {
                let value = arg.value(input);
                if value.is_null() {
                    continue;
                }
                best = match best {
                    None => Some(value),
                    Some(current) => match compare(&value, &current) {
                        Some(order) if order == wanted => Some(value),
                        Some(_) => Some(current),
                        None => return Cow::Borrowed(&NULL),
                    },
                };
            }
            best.unwrap_or(Cow::Borrowed(&NULL))
        }
        Function::Concat => {
            let mut joined = String::new();
            for arg in args {
                if let Some(text) = text_of(&arg.value(input)) {
                    joined.push_str(&text);
                }
            }
            string(joined)
        }
        Function::Upper | Function::Lower | Function::Length => {
            let value = arg(0);
            let Value::String(text) = &*value else { return Cow::Borrowed(&NULL) };
            match function {
                Function::Upper => string(text.to_uppercase()),
                Function::Lower => string(text.to_lowercase()),
                _ => Cow::Owned(Value::from(text.chars().count())),
            }
        }
        Function::Trim | Function::Ltrim | Function::Rtrim => {
            let value = arg(0);
            let Value::String(text) = &*value else { return Cow::Borrowed(&NULL) };
            let characters_value = (args.len() > 1).then(|| arg(1));
            let characters = match characters_value.as_deref() {
                None => None,
                Some(Value::String(characters)) => Some(characters.as_str()),
                Some(_) => return Cow::Borrowed(&NULL),
            };
            let trimmed = match (characters, function) {
                (None, Function::Trim) => text.trim(),
                (None, Function::Ltrim) => text.trim_start(),
                (None, _) => text.trim_end(),
                (Some(characters), Function::Trim) => text.trim_matches(|c| characters.contains(c)),
                (Some(characters), Function::Ltrim) => text.trim_start_matches(|c| characters.contains(c)),
                (Some(characters), _) => text.trim_end_matches(|c| characters.contains(c)),
            };
            string(trimmed.to_string())
        }
        Function::Substring => {
            let value = arg(0);
            let Value::String(text) = &*value else { return Cow::Borrowed(&NULL) };
            let Some(start) = integer(&arg(1)) else { return Cow::Borrowed(&NULL) };
            // SQL positions are 1-based and may start before the text: SUBSTRING('abc', 0, 2)
            // is 'a'. The end is exclusive.
            let end = if args.len() > 2 {
                match integer(&arg(2)) {
                    Some(length) if length >= 0 => Some(start.saturating_add(length)),
                    _ => return Cow::Borrowed(&NULL),
                }
            } else {
                None
            };
            let first = start.max(1);
            let taken: String = text
                .chars()
                .zip(1i64..)
                .skip_while(|(_, position)| *position < first)
                .take_while(|(_, position)| end.is_none_or(|end| *position < end))
                .map(|(c, _)| c)
                .collect();
            string(taken)
        }
        Function::Replace => {
            let (value, from, to) = (arg(0), arg(1), arg(2));
            let (Value::String(text), Value::String(from), Value::String(to)) = (&*value, &*from, &*to) else {
                return Cow::Borrowed(&NULL);
            };
            if from.is_empty() { string(text.clone()) } else { string(text.replace(from.as_str(), to)) }
        }
        Function::Abs | Function::Floor | Function::Ceil => {
            let Some(value) = number(&arg(0)) else { return Cow::Borrowed(&NULL) };
            Cow::Owned(match (value, function) {
                (Num::Int(int), Function::Abs) => int.checked_abs().map_or(Value::Null, Value::from),
                (Num::Int(int), _) => Value::from(int),
                (Num::Float(float), Function::Abs) => float_value(float.abs()),
                (Num::Float(float), Function::Floor) => float_value(float.floor()),
                (Num::Float(float), _) => float_value(float.ceil()),
            })
        }
        Function::Round => {
            let Some(value) = number(&arg(0)) else { return Cow::Borrowed(&NULL) };
            let digits = if args.len() > 1 {
                match integer(&arg(1)) {
                    Some(digits) => digits,
                    None => return Cow::Borrowed(&NULL),
                }
            } else {
                0
            };
            owned(round(value, digits))
        }
        Function::JsonBuildObject => {
            let mut object = serde_json::Map::new();
            for pair in args.chunks(2) {
                let name = pair[0].value(input);
                let Some(name) = text_of(&name) else { return Cow::Borrowed(&NULL) };
                let value = pair.get(1).map_or(Value::Null, |value| value.value(input).into_owned());
                object.insert(name.into_owned(), value);
            }
            Cow::Owned(Value::Object(object))
        }
        Function::JsonBuildArray => {
            Cow::Owned(Value::Array(args.iter().map(|arg| arg.value(input).into_owned()).collect()))
        }
        Function::ArrayPosition => {
            let (array, wanted) = (arg(0), arg(1));
            let Value::Array(items) = &*array else { return Cow::Borrowed(&NULL) };
            match items.iter().position(|item| equals(item, &wanted) == Some(true)) {
                Some(index) => Cow::Owned(Value::from(index + 1)),
                None => Cow::Borrowed(&NULL),
            }
        }
        Function::ArrayToString => {
            let (array, separator) = (arg(0), arg(1));
            let (Value::Array(items), Some(separator)) = (&*array, text_of(&separator)) else {
                return Cow::Borrowed(&NULL);
            };
            let null_text = if args.len() > 2 { text_of(&arg(2)).map(|text| text.into_owned()) } else { None };
            let parts: Vec<String> = items
                .iter()
                .filter_map(|item| match text_of(item) {
                    Some(text) => Some(text.into_owned()),
                    None => null_text.clone(),
                })
                .collect();
            string(parts.join(&separator))
        }
        Function::RegexpLike => {
            let (value, pattern) = (arg(0), arg(1));
            let (Value::String(text), Value::String(pattern)) = (&*value, &*pattern) else {
                return Cow::Borrowed(&NULL);
            };
            let flags = if args.len() > 2 { arg(2).into_owned() } else { Value::String(String::new()) };
            let Value::String(flags) = flags else { return Cow::Borrowed(&NULL) };
            match with_regex(pattern, &flags, |regex| regex.is_match(text)) {
                Some(found) => Cow::Owned(Value::Bool(found)),
                None => Cow::Borrowed(&NULL),
            }
        }
        Function::StringToArray => {
            let (value, separator) = (arg(0), arg(1));
            let (Value::String(text), Value::String(separator)) = (&*value, &*separator) else {
                return Cow::Borrowed(&NULL);
            };
            let null_text = if args.len() > 2 { arg(2).into_owned() } else { Value::Null };
            let piece = |piece: &str| match &null_text {
                Value::String(null_text) if null_text == piece => Value::Null,
                _ => Value::String(piece.to_string()),
            };
            // As Postgres: an empty text has no pieces; an empty separator splits characters.
            let pieces: Vec<Value> = if text.is_empty() {
                Vec::new()
            } else if separator.is_empty() {
                text.chars().map(|c| piece(c.encode_utf8(&mut [0; 4]))).collect()
            } else {
                text.split(separator.as_str()).map(piece).collect()
            };
            Cow::Owned(Value::Array(pieces))
        }
        Function::RegexpSplitToArray => {
            let (value, pattern) = (arg(0), arg(1));
            let (Value::String(text), Value::String(pattern)) = (&*value, &*pattern) else {
                return Cow::Borrowed(&NULL);
            };
            let flags = if args.len() > 2 { arg(2).into_owned() } else { Value::String(String::new()) };
            let Value::String(flags) = flags else { return Cow::Borrowed(&NULL) };
            let pieces = with_regex(pattern, &flags, |regex| {
                regex.split(text).map(|piece| Value::String(piece.to_string())).collect::<Vec<_>>()
            });
            pieces.map_or(Cow::Borrowed(&NULL), |pieces| Cow::Owned(Value::Array(pieces)))
        }
    }
}

/// Compiled patterns by (pattern, ignoring case), per thread: a view evaluates one pattern per
/// record, and compiling it each time would cost more than matching.
const REGEX_CACHE: usize = 64;

thread_local! {
    static REGEXES: std::cell::RefCell<HashMap<(String, bool), regex::Regex>> =
        std::cell::RefCell::new(HashMap::new());
}

/// A pattern as a regular expression, or why it is not one onehop runs.
pub fn compile_regex(pattern: &str, case_insensitive: bool) -> Result<regex::Regex, String> {
    regex::RegexBuilder::new(pattern)
        .case_insensitive(case_insensitive)
        .size_limit(1 << 20)
        .build()
        .map_err(|error| format!("the pattern {pattern:?} is not a regular expression onehop runs: {error}"))
}

/// `use_it` with `pattern` compiled (`flags` as Postgres's: `i` ignores case, `c` does not);
/// `None` for a pattern that does not compile or unknown flags.
fn with_regex<T>(pattern: &str, flags: &str, use_it: impl FnOnce(&regex::Regex) -> T) -> Option<T> {
    let mut case_insensitive = false;
    for flag in flags.chars() {
        match flag {
            'i' => case_insensitive = true,
            'c' => case_insensitive = false,
            _ => return None,
        }
    }
    REGEXES.with(|cache| {
        let mut cache = cache.borrow_mut();
        let key = (pattern.to_string(), case_insensitive);
        if !cache.contains_key(&key) {
            let compiled = compile_regex(pattern, case_insensitive).ok()?;
            if cache.len() >= REGEX_CACHE {
                cache.clear();
            }
            cache.insert(key.clone(), compiled);
        }
        Some(use_it(&cache[&key]))
    })
}

/// ROUND: half away from zero, to `digits` after the point (before it when negative). An
/// integer stays an integer.
fn round(value: Num, digits: i64) -> Option<Value> {
    match value {
        Num::Int(int) if digits >= 0 => Some(Value::from(int)),
        Num::Int(int) => {
            // 10^19 overflows i64: every i64 rounds to 0 at that scale (and so at -i64::MIN
            // digits, which has no negation).
            let exponent = digits.checked_neg().and_then(|exponent| u32::try_from(exponent).ok());
            let Some(scale) = exponent.and_then(|exponent| 10i64.checked_pow(exponent)) else {
                return Some(Value::from(0));
            };
            let half = scale / 2;
            let remainder = int % scale;
            let down = int - remainder;
            let rounded = if remainder.abs() >= half {
                if int >= 0 { down.checked_add(scale) } else { down.checked_sub(scale) }
            } else {
                Some(down)
            };
            rounded.map(Value::from)
        }
        Num::Float(float) => {
            let digits = digits.clamp(-400, 400) as i32;
            if digits == 0 {
                return Some(float_value(float.round()));
            }
            let scale = 10f64.powi(digits);
            let scaled = float * scale;
            // Past the precision of a double, the value is already as rounded as it gets.
            if !scaled.is_finite() || scale == 0.0 {
                return Some(float_value(if scale == 0.0 { 0.0 } else { float }));
            }
            Some(float_value(scaled.round() / scale))
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testing::{call, eval, function};
    use super::*;

    #[test]
    fn string_functions() {
        use Function::*;
        assert_eq!(function(Upper, vec![json!("straße")]), json!("STRASSE"));
        assert_eq!(function(Lower, vec![json!("ÀB")]), json!("àb"));
        assert_eq!(function(Length, vec![json!("héllo")]), json!(5));
        assert_eq!(function(Length, vec![json!([1, 2])]), Value::Null);
        assert_eq!(function(Upper, vec![json!(1)]), Value::Null);
        assert_eq!(function(Trim, vec![json!("  a b \n")]), json!("a b"));
        assert_eq!(function(Ltrim, vec![json!("  a ")]), json!("a "));
        assert_eq!(function(Rtrim, vec![json!("  a ")]), json!("  a"));
        assert_eq!(function(Trim, vec![json!("xxaxyx"), json!("xy")]), json!("a"));
        assert_eq!(function(Ltrim, vec![json!("xxax"), json!("x")]), json!("ax"));
        assert_eq!(function(Rtrim, vec![json!("xxax"), json!("x")]), json!("xxa"));
        assert_eq!(function(Trim, vec![json!("xa"), json!(null)]), Value::Null);
        assert_eq!(function(Substring, vec![json!("hello"), json!(2), json!(3)]), json!("ell"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(2)]), json!("ello"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(0), json!(3)]), json!("he"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(-5), json!(3)]), json!(""));
        assert_eq!(function(Substring, vec![json!("hello"), json!(9)]), json!(""));
        assert_eq!(function(Substring, vec![json!("héllo"), json!(2), json!(1)]), json!("é"));
        assert_eq!(function(Substring, vec![json!("hello"), json!(2), json!(-1)]), Value::Null);
        assert_eq!(function(Substring, vec![json!("hello"), json!(1.5)]), Value::Null);
        assert_eq!(function(Substring, vec![json!("hello"), json!(2.0), json!(i64::MAX)]), json!("ello"));
        assert_eq!(function(Replace, vec![json!("a-b-c"), json!("-"), json!("+")]), json!("a+b+c"));
        assert_eq!(function(Replace, vec![json!("abc"), json!(""), json!("+")]), json!("abc"));
        assert_eq!(function(Replace, vec![json!("abc"), json!("b"), json!(null)]), Value::Null);
    }

    #[test]
    fn numeric_functions() {
        use Function::*;
        assert_eq!(function(Abs, vec![json!(-3)]), json!(3));
        assert_eq!(function(Abs, vec![json!(-2.5)]), json!(2.5));
        assert_eq!(function(Abs, vec![json!(i64::MIN)]), Value::Null);
        assert_eq!(function(Abs, vec![json!("-3")]), Value::Null);
        assert_eq!(function(Floor, vec![json!(2.7)]), json!(2.0));
        assert_eq!(function(Floor, vec![json!(-2.2)]), json!(-3.0));
        assert_eq!(function(Floor, vec![json!(5)]), json!(5));
        assert_eq!(function(Ceil, vec![json!(2.2)]), json!(3.0));
        assert_eq!(function(Ceil, vec![json!(-2.7)]), json!(-2.0));
        assert_eq!(function(Round, vec![json!(2.5)]), json!(3.0));
        assert_eq!(function(Round, vec![json!(-2.5)]), json!(-3.0));
        assert_eq!(function(Round, vec![json!(2.345), json!(2)]), json!(2.35));
        assert_eq!(function(Round, vec![json!(1234.5), json!(-2)]), json!(1200.0));
        assert_eq!(function(Round, vec![json!(1.5), json!(1000)]), json!(1.5));
        assert_eq!(function(Round, vec![json!(1.5), json!(-1000)]), json!(0.0));
        assert_eq!(function(Round, vec![json!(7)]), json!(7));
        assert_eq!(function(Round, vec![json!(1250), json!(-2)]), json!(1300));
        assert_eq!(function(Round, vec![json!(-1250), json!(-2)]), json!(-1300));
        assert_eq!(function(Round, vec![json!(1249), json!(-2)]), json!(1200));
        assert_eq!(function(Round, vec![json!(i64::MAX), json!(-1)]), Value::Null, "overflow");
        assert_eq!(function(Round, vec![json!(i64::MAX), json!(-30)]), json!(0));
        // The digits' negation overflows: as far left as can be, every integer rounds to 0.
        assert_eq!(function(Round, vec![json!(1_700_000_000_000i64), json!(i64::MIN)]), json!(0));
        assert_eq!(function(Round, vec![json!(1.5), json!("x")]), Value::Null);
        assert_eq!(function(Greatest, vec![json!(1), json!(null), json!(3.5), json!(2)]), json!(3.5));
        assert_eq!(function(Least, vec![json!("b"), json!("a"), json!(null)]), json!("a"));
        assert_eq!(function(Greatest, vec![json!(null), json!(null)]), Value::Null);
        assert_eq!(function(Greatest, vec![json!(1), json!("a")]), Value::Null, "mixed kinds");
        assert_eq!(function(Coalesce, vec![json!(null), json!(0), json!(1)]), json!(0));
        assert_eq!(function(Coalesce, vec![json!(null)]), Value::Null);
        assert_eq!(function(Nullif, vec![json!(1), json!(1.0)]), Value::Null);
        assert_eq!(function(Nullif, vec![json!(1), json!(2)]), json!(1));
        assert_eq!(function(Nullif, vec![json!(1), json!(null)]), json!(1));
        assert_eq!(
            function(JsonBuildObject, vec![json!("a"), json!(1), json!("b"), json!(null), json!(2), json!([1])]),
            json!({"a": 1, "b": null, "2": [1]})
        );
        assert_eq!(function(JsonBuildObject, vec![]), json!({}));
        assert_eq!(function(JsonBuildArray, vec![json!(1), json!(null), json!("a")]), json!([1, null, "a"]));
        assert_eq!(function(JsonBuildObject, vec![json!("odd")]), json!({"odd": null}));
        assert_eq!(function(ArrayToString, vec![json!(["a", 1, null, true]), json!(", ")]), json!("a, 1, true"));
        assert_eq!(function(ArrayToString, vec![json!(["a", null]), json!("/"), json!("*")]), json!("a/*"));
        assert_eq!(function(ArrayToString, vec![json!("a"), json!(",")]), Value::Null, "not an array");
        assert_eq!(function(ArrayPosition, vec![json!(["d", "f", "m"]), json!("f")]), json!(2));
        assert_eq!(function(ArrayPosition, vec![json!([1, 2.0]), json!(2)]), json!(2));
        assert_eq!(function(ArrayPosition, vec![json!(["d"]), json!("x")]), Value::Null);
        assert_eq!(function(ArrayPosition, vec![json!("d"), json!("d")]), Value::Null, "not an array");
        assert_eq!(function(RegexpLike, vec![json!("pg_toast_1"), json!("^pg_toast")]), json!(true));
        assert_eq!(function(RegexpLike, vec![json!("orders"), json!("^(orders)$")]), json!(true));
        assert_eq!(function(RegexpLike, vec![json!("Orders"), json!("^orders$")]), json!(false));
        assert_eq!(function(RegexpLike, vec![json!("Orders"), json!("^orders$"), json!("i")]), json!(true));
        assert_eq!(function(RegexpLike, vec![json!("x"), json!("(")]), Value::Null, "not a pattern");
        assert_eq!(function(RegexpLike, vec![json!("x"), json!("x"), json!("q")]), Value::Null, "unknown flag");
        assert_eq!(function(RegexpLike, vec![json!(1), json!("1")]), Value::Null, "not text");
    }

    #[test]
    fn texts_split_into_arrays_as_postgres_splits_them() {
        use Function::*;
        assert_eq!(function(StringToArray, vec![json!("a b  c"), json!(" ")]), json!(["a", "b", "", "c"]));
        assert_eq!(function(StringToArray, vec![json!("héllo"), json!("")]), json!(["h", "é", "l", "l", "o"]));
        assert_eq!(function(StringToArray, vec![json!(""), json!(",")]), json!([]));
        assert_eq!(function(StringToArray, vec![json!("a,x,b"), json!(","), json!("x")]), json!(["a", null, "b"]));
        assert_eq!(function(StringToArray, vec![json!(1), json!(",")]), Value::Null);
        assert_eq!(
            function(RegexpSplitToArray, vec![json!("the  quick\tfox"), json!("\\s+")]),
            json!(["the", "quick", "fox"])
        );
        assert_eq!(function(RegexpSplitToArray, vec![json!("aXbxc"), json!("x"), json!("i")]), json!(["a", "b", "c"]));
        assert_eq!(function(RegexpSplitToArray, vec![json!("abc"), json!("(")]), Value::Null, "not a pattern");
        assert_eq!(
            function(RegexpSplitToArray, vec![json!("abc"), json!("b"), json!("z")]),
            Value::Null,
            "unknown flag"
        );
        assert_eq!(Function::from_name("SPLIT"), Some(StringToArray));
        assert_eq!(Function::from_name("regexp_split"), Some(RegexpSplitToArray));
    }

    #[test]
    fn missing_arguments_are_null() {
        for function in [
            Function::Upper,
            Function::Trim,
            Function::Substring,
            Function::Replace,
            Function::Nullif,
            Function::Round,
            Function::Greatest,
            Function::Concat,
            Function::Coalesce,
        ] {
            let result = call(function, vec![]);
            assert!(matches!(eval(&result), Value::Null | Value::String(_)), "{function:?}");
        }
        assert_eq!(function(Function::Substring, vec![json!("abc")]), Value::Null);
    }

    #[test]
    fn function_names_and_arity() {
        assert_eq!(Function::from_name("char_length"), Some(Function::Length));
        assert_eq!(Function::from_name("CEILING"), Some(Function::Ceil));
        assert_eq!(Function::from_name("Substr"), Some(Function::Substring));
        assert_eq!(Function::from_name("sum"), None);
        assert_eq!(Function::Substring.arity(), (2, Some(3)));
        assert_eq!(Function::Coalesce.arity(), (1, None));
        for name in FUNCTION_NAMES.split([',', '(', ')', ' ']).filter(|name| !name.is_empty()) {
            let function = Function::from_name(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(Function::from_name(function.name()), Some(function));
        }
    }
}
