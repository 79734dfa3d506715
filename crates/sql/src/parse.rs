//! SQL text to statements.

use onehop_engine::units::{parse_bytes, parse_duration};
use onehop_log::Durability;
use sqlparser::ast::{self, Expr, ObjectName, SqlOption, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;

use crate::SqlError;

/// Options of `CREATE STREAM … WITH (…)`; what is left out takes the server's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub partitions: Option<u32>,
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    pub durability: Option<Durability>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Statement {
    CreateStream { name: String, if_not_exists: bool, options: StreamOptions },
    ShowStreams,
    Describe { name: String },
}

impl Statement {
    /// A short label for answers: `CREATE STREAM orders`.
    pub fn label(&self) -> String {
        match self {
            Statement::CreateStream { name, .. } => format!("CREATE STREAM {name}"),
            Statement::ShowStreams => "SHOW STREAMS".into(),
            Statement::Describe { name } => format!("DESCRIBE {name}"),
        }
    }
}

/// Parses one or more `;`-separated statements. Nothing runs unless everything parses.
pub fn parse(sql: &str) -> Result<Vec<Statement>, SqlError> {
    let dialect = GenericDialect {};
    let mut parser = Parser::new(&dialect).try_with_sql(sql).map_err(|error| SqlError::Syntax(error.to_string()))?;
    let mut statements = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        if parser.peek_token().token == Token::EOF {
            break;
        }
        let statement = if parser.parse_keywords(&[Keyword::CREATE, Keyword::STREAM]) {
            parse_create_stream(&mut parser)?
        } else {
            let statement = parser.parse_statement().map_err(|error| SqlError::Syntax(error.to_string()))?;
            convert(statement)?
        };
        statements.push(statement);
        if !parser.consume_token(&Token::SemiColon) && parser.peek_token().token != Token::EOF {
            let found = parser.peek_token();
            return Err(SqlError::Syntax(format!("expected ; or the end, found {found}")));
        }
    }
    if statements.is_empty() {
        return Err(SqlError::Syntax("no statement".into()));
    }
    Ok(statements)
}

fn syntax(error: sqlparser::parser::ParserError) -> SqlError {
    SqlError::Syntax(error.to_string())
}

/// A plain name: one identifier, not `schema.name`.
fn simple_name(name: &ObjectName) -> Result<String, SqlError> {
    match name.0.as_slice() {
        [part] => Ok(part.as_ident().map(|ident| ident.value.clone()).unwrap_or_else(|| part.to_string())),
        _ => Err(SqlError::Syntax(format!("{name} is not a plain name: onehop has no schemas"))),
    }
}

fn parse_create_stream(parser: &mut Parser) -> Result<Statement, SqlError> {
    let if_not_exists = parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = simple_name(&parser.parse_object_name(false).map_err(syntax)?)?;
    let mut options = StreamOptions::default();
    if parser.peek_keyword(Keyword::WITH) {
        for option in parser.parse_options(Keyword::WITH).map_err(syntax)? {
            let SqlOption::KeyValue { key, value } = option else {
                return Err(SqlError::InvalidOption(format!("{option}: expected key = value")));
            };
            apply_option(&mut options, &key.value.to_ascii_lowercase(), &value)?;
        }
    }
    Ok(Statement::CreateStream { name, if_not_exists, options })
}

/// The text of a literal option value: a number or a quoted string.
fn literal(value: &Expr) -> Option<String> {
    match value {
        Expr::Value(value) => match &value.value {
            Value::Number(number, _) => Some(number.clone()),
            Value::SingleQuotedString(text) | Value::DoubleQuotedString(text) => Some(text.clone()),
            _ => None,
        },
        Expr::Identifier(ident) => Some(ident.value.clone()),
        _ => None,
    }
}

fn apply_option(options: &mut StreamOptions, key: &str, value: &Expr) -> Result<(), SqlError> {
    let text = literal(value)
        .ok_or_else(|| SqlError::InvalidOption(format!("{key} = {value}: expected a number or a string")))?;
    let invalid = |reason: String| SqlError::InvalidOption(format!("{key} = {text:?}: {reason}"));
    match key {
        "partitions" => {
            options.partitions = Some(text.parse().map_err(|_| invalid("expected a whole number".into()))?);
        }
        "retention" => {
            options.retention_ms = match text.as_str() {
                "forever" | "none" => None,
                _ => Some(parse_duration(&text).map_err(invalid)?.as_millis() as u64),
            };
        }
        "retention_bytes" => {
            options.retention_bytes = match text.as_str() {
                "none" => None,
                _ => Some(parse_bytes(&text).map_err(invalid)?),
            };
        }
        "durability" => {
            options.durability = Some(text.parse().map_err(invalid)?);
        }
        other => {
            return Err(SqlError::InvalidOption(format!(
                "unknown option {other:?}; a stream takes partitions, retention, retention_bytes and durability"
            )));
        }
    }
    Ok(())
}

fn convert(statement: ast::Statement) -> Result<Statement, SqlError> {
    match statement {
        ast::Statement::ShowVariable { variable }
            if variable.len() == 1 && variable[0].value.eq_ignore_ascii_case("streams") =>
        {
            Ok(Statement::ShowStreams)
        }
        ast::Statement::ExplainTable { table_name, .. } => Ok(Statement::Describe { name: simple_name(&table_name)? }),
        other => {
            let text = other.to_string();
            let statement = text.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
            Err(SqlError::Unsupported { statement })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_stream_with_every_option() {
        let statements = parse(
            "CREATE STREAM orders WITH (partitions = 4, retention = '7d', retention_bytes = '1GiB', durability = 'async');\n\
             create stream if not exists clicks; SHOW STREAMS; DESCRIBE orders",
        )
        .unwrap();
        assert_eq!(
            statements,
            [
                Statement::CreateStream {
                    name: "orders".into(),
                    if_not_exists: false,
                    options: StreamOptions {
                        partitions: Some(4),
                        retention_ms: Some(7 * 86_400_000),
                        retention_bytes: Some(1 << 30),
                        durability: Some(Durability::Async),
                    },
                },
                Statement::CreateStream {
                    name: "clicks".into(),
                    if_not_exists: true,
                    options: StreamOptions::default()
                },
                Statement::ShowStreams,
                Statement::Describe { name: "orders".into() },
            ]
        );
    }

    #[test]
    fn errors_say_what_is_wrong_and_what_works() {
        let message = |sql: &str| parse(sql).unwrap_err().to_string();
        assert!(message("CREATE STREAM s WITH (colour = 'red')").contains("unknown option \"colour\""));
        assert!(message("CREATE STREAM s WITH (partitions = 'many')").contains("whole number"));
        assert!(message("CREATE STREAM s WITH (retention = 'a while')").contains("7d"));
        assert!(message("CREATE STREAM s WITH (durability = 'eventually')").contains("\"fsync\" or \"async\""));
        assert!(message("CREATE STREAM a.b").contains("no schemas"));
        let unsupported = message("SELECT * FROM orders");
        assert!(unsupported.contains("SELECT") && unsupported.contains("CREATE STREAM name"), "{unsupported}");
        assert!(message("CREATE STREAM").starts_with("syntax error"));
        assert!(message("CREATE STREAM s s2").contains("expected ;"));
        assert!(message("  ;; ").contains("no statement"));
        assert_eq!(parse("show streams;").unwrap(), [Statement::ShowStreams]);
    }
}
