//! `COPY … TO STDOUT` and `COPY … FROM STDIN`, as psql's `\copy`, scripts and drivers' bulk
//! loads use them: a table's rows or a query's answer sent in Postgres's text or CSV format,
//! and rows received in either, written in one transaction (all or none).
//!
//! Files and programs on the server are refused: the server's disk is not the client's, and
//! psql's `\copy` reads and writes the client's files through STDIN and STDOUT.

use onehop_engine::ColumnType;
use serde_json::Value;
use sqlparser::ast::{self, CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget};

use super::PgError;
use super::types;

/// How rows are spelled: Postgres's text format (tab-separated, `\N` for null, backslash
/// escapes) or CSV (comma-separated, nothing for null, quotes around what needs them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Format {
    pub csv: bool,
    pub delimiter: char,
    pub null: String,
    pub quote: char,
    pub escape: char,
    /// A first line of column names: written out, skipped in.
    pub header: bool,
}

/// A COPY statement, planned.
#[derive(Clone)]
pub enum Copy {
    /// The query whose answer is sent (`COPY t TO STDOUT` is `SELECT * FROM t`).
    Out { query: Box<onehop_sql::Statement>, format: Format },
    /// Rows for `target`, of `columns` (none named: the table's declared columns).
    In { target: String, columns: Vec<String>, format: Format },
}

fn unsupported(what: impl std::fmt::Display) -> PgError {
    PgError::new("0A000", format!("{what} is not supported by COPY here"))
}

/// Plans a parsed `COPY` statement.
pub fn plan(statement: &ast::Statement) -> Result<Copy, PgError> {
    let ast::Statement::Copy { source, to, target, options, legacy_options, .. } = statement else {
        return Err(PgError::new("42601", "not a COPY statement"));
    };
    let format = format_of(options, legacy_options)?;
    match (to, target) {
        (_, CopyTarget::File { .. } | CopyTarget::Program { .. }) => Err(PgError::new(
            "42501",
            "COPY to or from a file or a program on the server is not allowed: use COPY … TO STDOUT or FROM STDIN \
             (psql's \\copy reads and writes files on the client that way)",
        )),
        (true, CopyTarget::Stdout) => {
            let select = match source {
                CopySource::Table { table_name, columns } if columns.is_empty() => {
                    format!("SELECT * FROM {table_name}")
                }
                CopySource::Table { table_name, columns } => {
                    let columns = columns.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                    format!("SELECT {columns} FROM {table_name}")
                }
                CopySource::Query(query) => query.to_string(),
            };
            let mut parsed = onehop_sql::parse(&select)?;
            match parsed.pop() {
                Some(query @ onehop_sql::Statement::Query { .. }) if parsed.is_empty() => {
                    Ok(Copy::Out { query: Box::new(query), format })
                }
                _ => Err(PgError::new("42601", "COPY ( … ) TO STDOUT copies the answer of one SELECT")),
            }
        }
        (false, CopyTarget::Stdin) => {
            let CopySource::Table { table_name, columns } = source else {
                return Err(PgError::new("42601", "COPY FROM STDIN writes into a table or stream, not a query"));
            };
            let target = super::local_name(table_name)?;
            let columns = columns.iter().map(|column| column.value.clone()).collect();
            Ok(Copy::In { target, columns, format })
        }
        (true, CopyTarget::Stdin) | (false, CopyTarget::Stdout) => {
            Err(PgError::new("42601", "COPY … TO writes to STDOUT, and COPY … FROM reads from STDIN"))
        }
    }
}

fn format_of(options: &[CopyOption], legacy: &[CopyLegacyOption]) -> Result<Format, PgError> {
    let binary = || unsupported("the binary format (use FORMAT text or FORMAT csv)");
    let mut csv = false;
    let (mut delimiter, mut null, mut quote, mut escape, mut header) = (None, None, None, None, false);
    for option in options {
        match option {
            CopyOption::Format(name) => match name.value.to_ascii_lowercase().as_str() {
                "text" => csv = false,
                "csv" => csv = true,
                "binary" => return Err(binary()),
                other => return Err(PgError::new("22023", format!("COPY format \"{other}\" not recognized"))),
            },
            CopyOption::Delimiter(char) => delimiter = Some(*char),
            CopyOption::Null(text) => null = Some(text.clone()),
            CopyOption::Header(on) => header = *on,
            CopyOption::Quote(char) => quote = Some(*char),
            CopyOption::Escape(char) => escape = Some(*char),
            CopyOption::Encoding(name) if name.eq_ignore_ascii_case("utf8") || name.eq_ignore_ascii_case("utf-8") => {}
            other => return Err(unsupported(format!("the option {other}"))),
        }
    }
    for option in legacy {
        match option {
            CopyLegacyOption::Binary => return Err(binary()),
            CopyLegacyOption::Delimiter(char) => delimiter = Some(*char),
            CopyLegacyOption::Null(text) => null = Some(text.clone()),
            CopyLegacyOption::Header => header = true,
            CopyLegacyOption::Csv(csv_options) => {
                csv = true;
                for option in csv_options {
                    match option {
                        CopyLegacyCsvOption::Header => header = true,
                        CopyLegacyCsvOption::Quote(char) => quote = Some(*char),
                        CopyLegacyCsvOption::Escape(char) => escape = Some(*char),
                        other => return Err(unsupported(format!("the option {other}"))),
                    }
                }
            }
            other => return Err(unsupported(format!("the option {other}"))),
        }
    }
    if !csv && (quote.is_some() || escape.is_some()) {
        return Err(PgError::new("0A000", "COPY QUOTE and ESCAPE are available only in CSV mode"));
    }
    let quote = quote.unwrap_or('"');
    let format = Format {
        csv,
        delimiter: delimiter.unwrap_or(if csv { ',' } else { '\t' }),
        null: null.unwrap_or_else(|| if csv { String::new() } else { "\\N".into() }),
        quote,
        escape: escape.unwrap_or(quote),
        header,
    };
    let special = |char: char| matches!(char, '\r' | '\n') || (!csv && char == '\\');
    if special(format.delimiter) || (csv && format.delimiter == format.quote) {
        return Err(PgError::new("22023", format!("COPY delimiter {:?} cannot be used", format.delimiter)));
    }
    if format.null.contains(['\r', '\n']) || format.null.contains(format.delimiter) {
        return Err(PgError::new("22023", "COPY null representation cannot hold a newline or the delimiter"));
    }
    Ok(format)
}

/// One line of `fields` (none: null) in `format`, ending in a newline.
pub fn encode_line(fields: &[Option<&str>], format: &Format) -> Vec<u8> {
    let mut line = String::new();
    for (index, field) in fields.iter().enumerate() {
        if index > 0 {
            line.push(format.delimiter);
        }
        match field {
            None => line.push_str(&format.null),
            Some(text) if format.csv => {
                let needs_quotes = text.is_empty() && format.null.is_empty()
                    || *text == format.null
                    || text.starts_with("\\.")
                    || text.contains([format.delimiter, format.quote, '\r', '\n']);
                if needs_quotes {
                    line.push(format.quote);
                    for char in text.chars() {
                        if char == format.quote || char == format.escape {
                            line.push(format.escape);
                        }
                        line.push(char);
                    }
                    line.push(format.quote);
                } else {
                    line.push_str(text);
                }
            }
            Some(text) => {
                for char in text.chars() {
                    match char {
                        '\\' => line.push_str("\\\\"),
                        '\n' => line.push_str("\\n"),
                        '\r' => line.push_str("\\r"),
                        '\t' => line.push_str("\\t"),
                        '\u{8}' => line.push_str("\\b"),
                        '\u{c}' => line.push_str("\\f"),
                        '\u{b}' => line.push_str("\\v"),
                        char if char == format.delimiter => {
                            line.push('\\');
                            line.push(char);
                        }
                        char => line.push(char),
                    }
                }
            }
        }
    }
    line.push('\n');
    line.into_bytes()
}

/// The lines of COPY data, each as its fields (none: null), without the header line and up
/// to an end-of-data line (`\.`). An error names its line, counted from 1.
pub fn decode(data: &[u8], format: &Format) -> Result<Vec<Vec<Option<String>>>, PgError> {
    let text = std::str::from_utf8(data)
        .map_err(|error| PgError::new("22021", format!("COPY data is not UTF-8 (at byte {})", error.valid_up_to())))?;
    let mut lines = Vec::new();
    let mut rest = text;
    let mut number = 0;
    while !rest.is_empty() {
        number += 1;
        let (fields, after) =
            if format.csv { csv_line(rest, format, number)? } else { text_line(rest, format, number)? };
        rest = after;
        match fields {
            None => break,
            Some(_) if number == 1 && format.header => {}
            Some(fields) => lines.push(fields),
        }
    }
    Ok(lines)
}

/// The line's raw text and what follows it (a `\r\n` or `\n` ending is left out of both).
fn split_line(text: &str) -> (&str, &str) {
    match text.find('\n') {
        Some(end) => (text[..end].strip_suffix('\r').unwrap_or(&text[..end]), &text[end + 1..]),
        None => (text.strip_suffix('\r').unwrap_or(text), ""),
    }
}

type Line<'a> = (Option<Vec<Option<String>>>, &'a str);

fn text_line<'a>(text: &'a str, format: &Format, number: usize) -> Result<Line<'a>, PgError> {
    let (line, rest) = split_line(text);
    if line == "\\." {
        return Ok((None, rest));
    }
    let mut fields = Vec::new();
    let mut raw = String::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut finish = |raw: &mut String, field: &mut String| {
        fields.push((*raw != format.null).then(|| std::mem::take(field)));
        raw.clear();
        field.clear();
    };
    while let Some(char) = chars.next() {
        if char == format.delimiter {
            finish(&mut raw, &mut field);
            continue;
        }
        raw.push(char);
        if char != '\\' {
            field.push(char);
            continue;
        }
        let Some(next) = chars.next() else {
            return Err(line_error(number, "a backslash ends the line"));
        };
        raw.push(next);
        match next {
            'n' => field.push('\n'),
            'r' => field.push('\r'),
            't' => field.push('\t'),
            'b' => field.push('\u{8}'),
            'f' => field.push('\u{c}'),
            'v' => field.push('\u{b}'),
            '0'..='7' => {
                let first = next.to_digit(8).expect("an octal digit");
                field.push(escaped_byte(&mut chars, &mut raw, first, 8, number)?);
            }
            'x' if chars.peek().is_some_and(char::is_ascii_hexdigit) => {
                field.push(escaped_byte(&mut chars, &mut raw, 0, 16, number)?);
            }
            other => field.push(other),
        }
    }
    finish(&mut raw, &mut field);
    Ok((Some(fields), rest))
}

/// The byte an octal (`\101`: up to three digits, the first given) or hex (`\x41`: up to
/// two) escape spells, as the character it is alone: ASCII, not a zero.
fn escaped_byte(
    chars: &mut std::iter::Peekable<std::str::Chars>,
    raw: &mut String,
    first: u32,
    radix: u32,
    number: usize,
) -> Result<char, PgError> {
    let mut value = first;
    for _ in 0..2 {
        match chars.peek().and_then(|digit| digit.to_digit(radix)) {
            Some(digit) => {
                value = value * radix + digit;
                raw.push(chars.next().expect("peeked"));
            }
            None => break,
        }
    }
    match value {
        0 => Err(line_error(number, "an escaped zero byte is not allowed in text (Postgres refuses it too)")),
        1..=0x7f => Ok(char::from(value as u8)),
        _ => Err(line_error(number, "an escaped byte above 127 is not UTF-8 alone: send the character itself")),
    }
}

fn csv_line<'a>(text: &'a str, format: &Format, number: usize) -> Result<Line<'a>, PgError> {
    if split_line(text).0 == "\\." {
        return Ok((None, split_line(text).1));
    }
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = text.char_indices().peekable();
    loop {
        let Some((_, char)) = chars.next() else {
            fields.push((quoted || field != format.null).then_some(field));
            return Ok((Some(fields), ""));
        };
        if char == format.quote {
            quoted = true;
            // A quoted part: up to the next quote not escaped; newlines are data in it.
            loop {
                match chars.next() {
                    None => return Err(line_error(number, "unterminated CSV quoted field")),
                    Some((_, char))
                        if char == format.escape
                            && chars.peek().is_some_and(|(_, next)| {
                                *next == format.quote || (*next == format.escape && format.escape != format.quote)
                            }) =>
                    {
                        field.push(chars.next().expect("peeked").1);
                    }
                    Some((_, char)) if char == format.quote => break,
                    Some((_, char)) => field.push(char),
                }
            }
        } else if char == format.delimiter {
            fields.push((quoted || field != format.null).then(|| std::mem::take(&mut field)));
            field.clear();
            quoted = false;
        } else if char == '\n' || char == '\r' {
            if char == '\r' && chars.peek().is_some_and(|(_, next)| *next == '\n') {
                chars.next();
            }
            fields.push((quoted || field != format.null).then_some(field));
            let rest = chars.peek().map_or("", |(next, _)| &text[*next..]);
            return Ok((Some(fields), rest));
        } else {
            field.push(char);
        }
    }
}

fn line_error(number: usize, reason: &str) -> PgError {
    PgError::new("22P04", format!("COPY data, line {number}: {reason}"))
}

/// A field's text as the value its column holds: numbers and booleans for such declared
/// columns, text otherwise (a JSON column gets the text, as an INSERT of a quoted literal
/// gives it).
pub fn field_value(text: &str, ty: Option<&ColumnType>) -> Result<Value, String> {
    match ty {
        Some(ty @ (ColumnType::Integer | ColumnType::Float | ColumnType::Boolean)) => {
            types::decode_parameter(text.as_bytes(), types::oid_of(ty), false)
        }
        _ => Ok(Value::String(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format(sql: &str) -> Format {
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        let statement = sqlparser::parser::Parser::parse_sql(&dialect, sql).unwrap().remove(0);
        match plan(&statement) {
            Ok(Copy::In { format, .. } | Copy::Out { format, .. }) => format,
            Err(error) => panic!("{sql}: {}", error.message),
        }
    }

    #[test]
    fn text_lines_escape_and_come_back() {
        let text = format("COPY t FROM STDIN");
        let fields = [Some("a\tb\\c\nd"), None, Some(""), Some("é")];
        let line = encode_line(&fields, &text);
        assert_eq!(line, b"a\\tb\\\\c\\nd\t\\N\t\t\xc3\xa9\n");
        let back = decode(&line, &text).unwrap();
        assert_eq!(back, vec![fields.iter().map(|field| field.map(str::to_string)).collect::<Vec<_>>()]);
        // Octal and hex escapes, a CRLF ending, the end-of-data line and what follows it.
        let lines = decode(b"\\101\\x42\r\nx\n\\.\nignored\n", &text).unwrap();
        assert_eq!(lines, vec![vec![Some("AB".to_string())], vec![Some("x".to_string())]]);
        assert_eq!(decode(b"a\\", &text).unwrap_err().code, "22P04");
        assert_eq!(decode(b"\\000", &text).unwrap_err().code, "22P04");
        assert_eq!(decode(b"\\351", &text).unwrap_err().code, "22P04");
        assert_eq!(decode(b"\xff", &text).unwrap_err().code, "22021");
    }

    #[test]
    fn csv_lines_quote_what_needs_it_and_come_back() {
        let csv = format("COPY t FROM STDIN WITH (FORMAT csv, HEADER)");
        assert!(csv.header);
        let fields = [Some("plain"), Some("a,b"), Some("say \"hi\""), Some("two\nlines"), Some(""), None];
        let line = encode_line(&fields, &csv);
        assert_eq!(line, b"plain,\"a,b\",\"say \"\"hi\"\"\",\"two\nlines\",\"\",\n");
        let mut data = b"name,b,c,d,e,f\n".to_vec();
        data.extend_from_slice(&line);
        let back = decode(&data, &csv).unwrap();
        assert_eq!(back, vec![fields.iter().map(|field| field.map(str::to_string)).collect::<Vec<_>>()]);
        assert_eq!(decode(b"\"open", &csv).unwrap_err().code, "22P04");
        let legacy = format("COPY t FROM STDIN WITH CSV DELIMITER ';' NULL 'NA'");
        assert_eq!((legacy.delimiter, legacy.null.as_str()), (';', "NA"));
        assert_eq!(decode(b"NA;\"NA\"\r\n", &legacy).unwrap(), vec![vec![None, Some("NA".to_string())]]);
    }

    #[test]
    fn files_binary_and_bad_options_are_refused() {
        let dialect = sqlparser::dialect::PostgreSqlDialect {};
        for (sql, code) in [
            ("COPY t TO '/etc/passwd'", "42501"),
            ("COPY t FROM '/tmp/x'", "42501"),
            ("COPY t TO STDOUT WITH (FORMAT binary)", "0A000"),
            ("COPY t TO STDOUT WITH (FORMAT xml)", "22023"),
            ("COPY t FROM STDIN WITH (QUOTE '''')", "0A000"),
            ("COPY t FROM STDIN WITH (DELIMITER '\\')", "22023"),
            ("COPY other.t FROM STDIN", "3F000"),
        ] {
            let statement = sqlparser::parser::Parser::parse_sql(&dialect, sql).unwrap().remove(0);
            assert_eq!(plan(&statement).err().map(|error| error.code), Some(code), "{sql}");
        }
    }

    /// Random bytes as COPY data, as the fuzz target feeds them: rows or an error, and rows go
    /// out and come back the same.
    #[test]
    fn random_data_decodes_or_is_refused_and_comes_back() {
        let formats = [
            format("COPY t FROM STDIN"),
            format("COPY t FROM STDIN WITH (FORMAT csv)"),
            format("COPY t FROM STDIN WITH (FORMAT csv, QUOTE '|', ESCAPE '!', DELIMITER ';')"),
        ];
        let alphabet = b"ab\\\t\n\r,;|!\"N.x07";
        for _ in 0..20_000 {
            let length = rand::random::<u8>() % 24;
            let data: Vec<u8> = (0..length).map(|_| alphabet[rand::random::<u8>() as usize % alphabet.len()]).collect();
            for format in &formats {
                let Ok(lines) = decode(&data, format) else { continue };
                for line in &lines {
                    let fields: Vec<Option<&str>> = line.iter().map(Option::as_deref).collect();
                    let again = decode(&encode_line(&fields, format), format).map_err(|error| error.message);
                    assert_eq!(again, Ok(vec![line.clone()]), "{:?} in {format:?}", String::from_utf8_lossy(&data));
                }
            }
        }
    }

    #[test]
    fn fields_take_their_columns_types() {
        assert_eq!(field_value("42", Some(&ColumnType::Integer)).unwrap(), serde_json::json!(42));
        assert_eq!(field_value("t", Some(&ColumnType::Boolean)).unwrap(), serde_json::json!(true));
        assert_eq!(field_value("2.5", Some(&ColumnType::Float)).unwrap(), serde_json::json!(2.5));
        assert_eq!(field_value("42", None).unwrap(), serde_json::json!("42"));
        assert!(field_value("x", Some(&ColumnType::Integer)).is_err());
    }
}
