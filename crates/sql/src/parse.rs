//! SQL text to statements.

use onehop_engine::units::{parse_bytes, parse_duration};
use onehop_engine::view::ViewDef;
use onehop_engine::view::transform::ValueFormat;
use onehop_engine::view::{Start, TransformDef};
use onehop_engine::{Column, ColumnType};
use onehop_log::Durability;
use sqlparser::ast::{self, Expr, ObjectName, SqlOption, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::keywords::Keyword;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Location, Token};

use crate::SqlError;
use crate::access::{self, AccessStatement};
use crate::view;

/// Options of `CREATE STREAM … WITH (…)`; what is left out takes the server's default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub partitions: Option<u32>,
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    pub durability: Option<Durability>,
    pub mqtt_topic: Option<String>,
    /// `cleanup = 'compact'`: closed segments keep the newest record per key.
    pub compacted: bool,
    /// `start`: where a transform starts in its source (only with `AS SELECT`).
    pub start: Option<Start>,
    /// `value_format`: how a transform writes its values, `'json'` or `'text'` (only with `AS
    /// SELECT`).
    pub value_format: Option<ValueFormat>,
}

// Not `Eq`: view and transform definitions hold JSON literals (floats).
#[derive(Clone, Debug, PartialEq)]
pub enum Statement {
    CreateStream {
        name: String,
        if_not_exists: bool,
        options: StreamOptions,
    },
    /// `CREATE VIEW … AS SELECT …`.
    CreateView {
        def: ViewDef,
        if_not_exists: bool,
    },
    /// `CREATE STREAM name [WITH (…)] AS SELECT … FROM source`: a stream fed by a transform;
    /// `stream_options` are those of the output stream.
    CreateTransform {
        def: TransformDef,
        if_not_exists: bool,
        stream_options: StreamOptions,
    },
    CreateTable {
        name: String,
        if_not_exists: bool,
        primary_key: String,
        columns: Vec<Column>,
        durability: Option<Durability>,
        /// `column REFERENCES table [(column)]`: the relationships, each with the column it
        /// names in the other table, if it names one (it must be that table's primary key).
        foreign_keys: Vec<(onehop_engine::ForeignKey, Option<String>)>,
    },
    CreateIndex {
        name: Option<String>,
        table: String,
        field: String,
    },
    /// `ALTER STREAM name SET (retention = …, retention_bytes = …, partitions = N)`: each named
    /// limit changes (`Some(None)`: none), the others stay; `partitions` grows the stream.
    AlterStream {
        name: String,
        retention_ms: Option<Option<u64>>,
        retention_bytes: Option<Option<u64>>,
        partitions: Option<u32>,
    },
    DropStream {
        name: String,
        if_exists: bool,
    },
    DropTable {
        name: String,
        if_exists: bool,
    },
    DropIndex {
        name: String,
        if_exists: bool,
    },
    ShowStreams,
    ShowTables,
    ShowViews,
    ShowTransforms,
    DropView {
        name: String,
        if_exists: bool,
    },
    Describe {
        name: String,
    },
    /// Users, roles, grants and tokens.
    Access(AccessStatement),
    /// An ad-hoc `SELECT` (or `WITH …`, `VALUES …`), answered now ([`crate::query`]).
    Query {
        query: Box<ast::Query>,
        text: String,
    },
    /// `EXPLAIN SELECT …`: the query's plan, not its answer.
    Explain {
        query: Box<ast::Query>,
        text: String,
    },
    /// `INSERT`, `UPDATE` or `DELETE` ([`crate::query::write`]).
    Write {
        statement: Box<ast::Statement>,
        text: String,
    },
}

impl Statement {
    /// A short label for answers: `CREATE STREAM orders`.
    pub fn label(&self) -> String {
        match self {
            Statement::CreateStream { name, .. } => format!("CREATE STREAM {name}"),
            Statement::CreateView { def, .. } => format!("CREATE VIEW {}", def.name),
            Statement::CreateTransform { def, .. } => format!("CREATE STREAM {} AS SELECT", def.name),
            Statement::CreateTable { name, .. } => format!("CREATE TABLE {name}"),
            Statement::CreateIndex { table, field, .. } => format!("CREATE INDEX ON {table} ({field})"),
            Statement::AlterStream { name, .. } => format!("ALTER STREAM {name}"),
            Statement::DropStream { name, .. } => format!("DROP STREAM {name}"),
            Statement::DropTable { name, .. } => format!("DROP TABLE {name}"),
            Statement::DropIndex { name, .. } => format!("DROP INDEX {name}"),
            Statement::ShowStreams => "SHOW STREAMS".into(),
            Statement::ShowTables => "SHOW TABLES".into(),
            Statement::ShowViews => "SHOW VIEWS".into(),
            Statement::ShowTransforms => "SHOW TRANSFORMS".into(),
            Statement::DropView { name, .. } => format!("DROP VIEW {name}"),
            Statement::Describe { name } => format!("DESCRIBE {name}"),
            Statement::Access(statement) => statement.label(),
            Statement::Query { text, .. } => text.clone(),
            Statement::Explain { text, .. } => format!("EXPLAIN {text}"),
            Statement::Write { text, .. } => text.clone(),
        }
    }
}

impl Statement {
    /// Whether it defines or changes what exists (streams, tables, views, users, grants):
    /// not a query, a write, EXPLAIN, DESCRIBE or a SHOW.
    pub fn is_definition(&self) -> bool {
        match self {
            Statement::Query { .. }
            | Statement::Explain { .. }
            | Statement::Write { .. }
            | Statement::Describe { .. }
            | Statement::ShowStreams
            | Statement::ShowTables
            | Statement::ShowViews
            | Statement::ShowTransforms => false,
            Statement::Access(access) => !access.is_show(),
            _ => true,
        }
    }

    /// The highest `$n` placeholder of a query or write (0: none).
    pub fn parameter_count(&self) -> usize {
        let mut count = 0;
        let _ = self.visit_expressions(&mut |expr| {
            if let Some(n) = placeholder(expr) {
                count = count.max(n);
            }
        });
        count
    }

    fn visit_expressions(&self, visit: &mut dyn FnMut(&Expr)) -> std::ops::ControlFlow<()> {
        let mut each = |expr: &Expr| {
            visit(expr);
            std::ops::ControlFlow::<()>::Continue(())
        };
        match self {
            Statement::Query { query, .. } | Statement::Explain { query, .. } => {
                ast::visit_expressions(&**query, &mut each)
            }
            Statement::Write { statement, .. } => ast::visit_expressions(&**statement, &mut each),
            _ => std::ops::ControlFlow::Continue(()),
        }
    }

    /// The declared type of the column each `$n` is compared with, set to or inserted into,
    /// when a table the statement names declares it: what a client's untyped parameter is
    /// read as (Postgres infers it the same way).
    pub fn parameter_types(&self, engine: &onehop_engine::Engine) -> Vec<Option<ColumnType>> {
        let mut types = vec![None; self.parameter_count()];
        let mut tables = Vec::new();
        let mut relation = |name: &ObjectName| {
            if let Ok(name) = simple_name(name)
                && let Ok(table) = engine.table(&name)
            {
                tables.push(table.def());
            }
            std::ops::ControlFlow::<()>::Continue(())
        };
        let _ = match self {
            Statement::Query { query, .. } | Statement::Explain { query, .. } => {
                ast::visit_relations(&**query, &mut relation)
            }
            Statement::Write { statement, .. } => ast::visit_relations(&**statement, &mut relation),
            _ => std::ops::ControlFlow::Continue(()),
        };
        let declared = |column: &Expr| -> Option<ColumnType> {
            let name = match column {
                Expr::Identifier(ident) => &ident.value,
                Expr::CompoundIdentifier(parts) => &parts.last()?.value,
                _ => return None,
            };
            tables.iter().find_map(|def| def.column(name).map(|column| column.ty.clone()))
        };
        let mut set = |n: usize, ty: Option<ColumnType>| {
            if let (Some(slot), Some(ty)) = (n.checked_sub(1).and_then(|index| types.get_mut(index)), ty)
                && slot.is_none()
            {
                *slot = Some(ty);
            }
        };
        let _ = self.visit_expressions(&mut |expr| match expr {
            Expr::BinaryOp { left, right, .. } => {
                if let Some(n) = placeholder(right) {
                    set(n, declared(left));
                }
                if let Some(n) = placeholder(left) {
                    set(n, declared(right));
                }
            }
            Expr::InList { expr, list, .. } => {
                for item in list {
                    if let Some(n) = placeholder(item) {
                        set(n, declared(expr));
                    }
                }
            }
            Expr::Between { expr, low, high, .. } => {
                for bound in [low, high] {
                    if let Some(n) = placeholder(bound) {
                        set(n, declared(expr));
                    }
                }
            }
            _ => {}
        });
        // INSERT's values by position, UPDATE's assignments by column.
        if let Statement::Write { statement, .. } = self {
            let column_type =
                |name: &str| tables.iter().find_map(|def| def.column(name).map(|column| column.ty.clone()));
            match &**statement {
                ast::Statement::Insert(insert) => {
                    if let Some(ast::SetExpr::Values(values)) = insert.source.as_ref().map(|query| &*query.body) {
                        for row in &values.rows {
                            for (column, value) in insert.columns.iter().zip(&row.content) {
                                if let (Some(n), Ok(column)) = (placeholder(value), simple_name(column)) {
                                    set(n, column_type(&column));
                                }
                            }
                        }
                    }
                }
                ast::Statement::Update(update) => {
                    for assignment in &update.assignments {
                        if let (Some(n), ast::AssignmentTarget::ColumnName(column)) =
                            (placeholder(&assignment.value), &assignment.target)
                            && let Ok(column) = simple_name(column)
                        {
                            set(n, column_type(&column));
                        }
                    }
                }
                _ => {}
            }
        }
        types
    }

    /// Puts `parameters` in place of a query's `$1`, `$2`, …: a statement with placeholders
    /// runs only once each has its value.
    pub fn bind(&mut self, parameters: &[serde_json::Value]) -> Result<(), SqlError> {
        let wanted = self.parameter_count();
        if parameters.len() < wanted {
            return Err(SqlError::InvalidQuery(format!(
                "the statement has {wanted} parameter(s) ($1 … ${wanted}), {} given",
                parameters.len()
            )));
        }
        let substitute = |expr: &mut Expr| {
            if let Expr::Value(value) = expr
                && let Value::Placeholder(name) = &value.value
                && let Some(n) = name.strip_prefix('$').and_then(|n| n.parse::<usize>().ok())
                && let Some(parameter) = n.checked_sub(1).and_then(|index| parameters.get(index))
            {
                value.value = match parameter {
                    serde_json::Value::Null => Value::Null,
                    serde_json::Value::Bool(truth) => Value::Boolean(*truth),
                    serde_json::Value::Number(number) => Value::Number(number.to_string(), false),
                    serde_json::Value::String(text) => Value::SingleQuotedString(text.clone()),
                    other => Value::SingleQuotedString(other.to_string()),
                };
            }
            std::ops::ControlFlow::<()>::Continue(())
        };
        match self {
            Statement::Query { query, .. } | Statement::Explain { query, .. } => {
                let _ = ast::visit_expressions_mut(&mut **query, substitute);
            }
            Statement::Write { statement, .. } => {
                let _ = ast::visit_expressions_mut(&mut **statement, substitute);
            }
            _ if parameters.is_empty() => {}
            _ => return Err(SqlError::InvalidQuery(format!("{} takes no parameters", self.label()))),
        }
        Ok(())
    }
}

/// The `n` of a `$n` placeholder.
fn placeholder(expr: &Expr) -> Option<usize> {
    match expr {
        Expr::Value(value) => match &value.value {
            Value::Placeholder(name) => name.strip_prefix('$')?.parse().ok(),
            _ => None,
        },
        _ => None,
    }
}

/// A query's label in answers: its text, cut at 80 characters.
fn query_label(query: &ast::Query) -> String {
    let mut text = query.to_string();
    if text.len() > 80 {
        text.truncate(text.floor_char_boundary(77));
        text.push_str("...");
    }
    text
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
        // Where the statement starts, for definitions that keep their text.
        let start = parser.peek_token().span.start;
        let statement = if parser.parse_keywords(&[Keyword::CREATE, Keyword::STREAM]) {
            parse_create_stream(&mut parser, sql, start)?
        } else if parser.parse_keywords(&[Keyword::CREATE, Keyword::VIEW]) {
            view::parse_create_view(&mut parser, sql, start)?
        } else if parser.parse_keywords(&[Keyword::ALTER, Keyword::STREAM]) {
            parse_alter_stream(&mut parser)?
        } else if parser.parse_keywords(&[Keyword::DROP, Keyword::STREAM]) {
            let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = simple_name(&parser.parse_object_name(false).map_err(syntax)?)?;
            Statement::DropStream { name, if_exists }
        } else if parser.parse_keywords(&[Keyword::SHOW, Keyword::TABLES]) {
            Statement::ShowTables
        } else if parser.parse_keywords(&[Keyword::SHOW, Keyword::VIEWS]) {
            Statement::ShowViews
        } else if parser.parse_keywords(&[Keyword::ALTER, Keyword::USER]) {
            Statement::Access(access::parse_alter_user(&mut parser)?)
        } else if parser.parse_keyword(Keyword::GRANT) {
            Statement::Access(access::parse_grant(&mut parser, true)?)
        } else if parser.parse_keyword(Keyword::REVOKE) {
            Statement::Access(access::parse_grant(&mut parser, false)?)
        } else if let Some(statement) = parse_access_after(&mut parser, Keyword::CREATE, access::parse_create)? {
            Statement::Access(statement)
        } else if let Some(statement) = parse_access_after(&mut parser, Keyword::DROP, access::parse_drop)? {
            Statement::Access(statement)
        } else if let Some(statement) = parse_access_after(&mut parser, Keyword::SHOW, access::parse_show)? {
            Statement::Access(statement)
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

/// An access statement that starts with `keyword` (`CREATE USER`, `DROP TOKEN`, `SHOW GRANTS`):
/// `None`, with nothing taken, when what follows `keyword` is not one `rest` parses.
fn parse_access_after(
    parser: &mut Parser,
    keyword: Keyword,
    rest: fn(&mut Parser) -> Result<Option<AccessStatement>, SqlError>,
) -> Result<Option<AccessStatement>, SqlError> {
    if !parser.parse_keyword(keyword) {
        return Ok(None);
    }
    let statement = rest(parser)?;
    if statement.is_none() {
        parser.prev_token();
    }
    Ok(statement)
}

pub(crate) fn syntax(error: sqlparser::parser::ParserError) -> SqlError {
    SqlError::Syntax(error.to_string())
}

/// A plain name: one identifier, not `schema.name`.
pub(crate) fn simple_name(name: &ObjectName) -> Result<String, SqlError> {
    match name.0.as_slice() {
        [part] => Ok(part.as_ident().map(|ident| ident.value.clone()).unwrap_or_else(|| part.to_string())),
        _ => Err(SqlError::Syntax(format!("{name} is not a plain name: onehop has no schemas"))),
    }
}

/// `CREATE STREAM` (already read) `[IF NOT EXISTS] name [WITH (…)] [AS SELECT …]`.
fn parse_create_stream(parser: &mut Parser, sql: &str, start: Location) -> Result<Statement, SqlError> {
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
    if parser.parse_keyword(Keyword::AS) {
        let mut def = view::parse_transform(parser, name, sql, start)?;
        def.start = options.start.take().unwrap_or(Start::Latest);
        def.value_format = options.value_format.take().unwrap_or_default();
        def.check().map_err(SqlError::InvalidQuery)?;
        return Ok(Statement::CreateTransform { def, if_not_exists, stream_options: options });
    }
    for (set, option) in [(options.start.is_some(), "start"), (options.value_format.is_some(), "value_format")] {
        if set {
            return Err(SqlError::InvalidOption(format!(
                "{option} applies to a stream computed by a transform (CREATE STREAM … WITH ({option} = …) AS SELECT …)"
            )));
        }
    }
    Ok(Statement::CreateStream { name, if_not_exists, options })
}

/// `ALTER STREAM` (already read) `name SET (retention = …, retention_bytes = …)`.
fn parse_alter_stream(parser: &mut Parser) -> Result<Statement, SqlError> {
    let name = simple_name(&parser.parse_object_name(false).map_err(syntax)?)?;
    let (mut retention_ms, mut retention_bytes, mut partitions) = (None, None, None);
    let settings = parser.parse_options(Keyword::SET).map_err(syntax)?;
    if settings.is_empty() {
        return Err(SqlError::InvalidOption("ALTER STREAM … SET (…) names at least one setting".into()));
    }
    for option in settings {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(SqlError::InvalidOption(format!("{option}: expected key = value")));
        };
        let key = key.value.to_ascii_lowercase();
        let mut options = StreamOptions::default();
        apply_option(&mut options, &key, &value)?;
        match key.as_str() {
            "retention" => retention_ms = Some(options.retention_ms),
            "retention_bytes" => retention_bytes = Some(options.retention_bytes),
            "partitions" => partitions = options.partitions,
            other => {
                return Err(SqlError::InvalidOption(format!(
                    "{other}: ALTER STREAM changes retention, retention_bytes and partitions (to more); the rest of a stream is fixed at CREATE"
                )));
            }
        }
    }
    Ok(Statement::AlterStream { name, retention_ms, retention_bytes, partitions })
}

/// The text of a literal option value: a number or a quoted string.
pub(crate) fn literal(value: &Expr) -> Option<String> {
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
        "mqtt_topic" => {
            onehop_engine::SubjectFilter::parse(&text).map_err(|error| invalid(error.to_string()))?;
            options.mqtt_topic = Some(text);
        }
        "cleanup" => {
            options.compacted = match text.as_str() {
                "delete" => false,
                "compact" => true,
                _ => {
                    return Err(invalid(
                        "expected 'delete' (retention only) or 'compact' (the newest record per key)".into(),
                    ));
                }
            };
        }
        "start" => {
            options.start = Some(match text.as_str() {
                "earliest" => Start::Earliest,
                "latest" => Start::Latest,
                _ => return Err(invalid("expected 'earliest' or 'latest'".into())),
            });
        }
        "value_format" => {
            options.value_format = Some(match text.as_str() {
                "json" => ValueFormat::Json,
                "text" => ValueFormat::Text,
                _ => {
                    return Err(invalid(
                        "expected 'json' (an object of the columns) or 'text' (one column's text)".into(),
                    ));
                }
            });
        }
        other => {
            return Err(SqlError::InvalidOption(format!(
                "unknown option {other:?}; a stream takes partitions, retention, retention_bytes, durability, mqtt_topic and cleanup (and start and value_format, with AS SELECT)"
            )));
        }
    }
    Ok(())
}

fn unsupported(what: impl std::fmt::Display) -> SqlError {
    SqlError::Unsupported { statement: what.to_string() }
}

/// A column's type from sqlparser's, ignoring lengths and precisions (`VARCHAR(20)` is TEXT).
fn column_type(data_type: &ast::DataType) -> Result<ColumnType, SqlError> {
    let text = data_type.to_string();
    let mut plain = String::with_capacity(text.len());
    let mut depth = 0;
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    ColumnType::parse(&plain).map_err(SqlError::InvalidOption)
}

fn index_column_name(column: &ast::IndexColumn) -> Result<String, SqlError> {
    match &column.column.expr {
        Expr::Identifier(ident) => Ok(ident.value.clone()),
        other => Err(SqlError::Syntax(format!("{other}: an index or key names one column"))),
    }
}

fn convert_create_table(create: ast::CreateTable) -> Result<Statement, SqlError> {
    let name = simple_name(&create.name)?;
    if create.query.is_some() || create.like.is_some() {
        return Err(unsupported("CREATE TABLE … AS / LIKE"));
    }
    let mut primary_key: Option<String> = None;
    let mut set_key = |column: String| -> Result<(), SqlError> {
        if let Some(existing) = &primary_key {
            return Err(SqlError::Syntax(format!(
                "a table has one PRIMARY KEY column; {existing} and {column} were given"
            )));
        }
        primary_key = Some(column);
        Ok(())
    };
    let mut columns = Vec::new();
    let mut foreign_keys = Vec::new();
    let mut reference = |columns: &[ast::Ident], key: &ast::ForeignKeyConstraint| -> Result<(), SqlError> {
        let [column] = columns else {
            return Err(SqlError::Syntax(format!("{key}: a foreign key is one column")));
        };
        let referred = match key.referred_columns.as_slice() {
            [] => None,
            [referred] => Some(referred.value.clone()),
            _ => return Err(SqlError::Syntax(format!("{key}: a foreign key references one column"))),
        };
        let table = simple_name(&key.foreign_table)?;
        foreign_keys.push((onehop_engine::ForeignKey { column: column.value.clone(), table }, referred));
        Ok(())
    };
    for column in &create.columns {
        let mut not_null = false;
        for option in &column.options {
            match &option.option {
                ast::ColumnOption::ForeignKey(key) => reference(std::slice::from_ref(&column.name), key)?,
                ast::ColumnOption::NotNull => not_null = true,
                ast::ColumnOption::Null => not_null = false,
                ast::ColumnOption::PrimaryKey(_) => {
                    set_key(column.name.value.clone())?;
                    not_null = true;
                }
                other => {
                    return Err(SqlError::Syntax(format!(
                        "column {}: {other} is not supported; a column takes NOT NULL, NULL, PRIMARY KEY or \
                         REFERENCES table",
                        column.name
                    )));
                }
            }
        }
        columns.push(Column { name: column.name.value.clone(), ty: column_type(&column.data_type)?, not_null });
    }
    for constraint in &create.constraints {
        match constraint {
            ast::TableConstraint::PrimaryKey(key) if key.columns.len() == 1 => {
                set_key(index_column_name(&key.columns[0])?)?
            }
            ast::TableConstraint::ForeignKey(key) => reference(&key.columns, key)?,
            other => {
                return Err(SqlError::Syntax(format!(
                    "{other} is not supported; a table takes one PRIMARY KEY column and FOREIGN KEY (column) \
                     REFERENCES table"
                )));
            }
        }
    }
    let primary_key = primary_key
        .ok_or_else(|| SqlError::Syntax(format!("table {name} needs a PRIMARY KEY column (id TEXT PRIMARY KEY)")))?;
    if let Some(column) = columns.iter_mut().find(|column| column.name == primary_key) {
        column.not_null = true;
    }
    let mut durability = None;
    let options = match create.table_options {
        ast::CreateTableOptions::None => Vec::new(),
        ast::CreateTableOptions::With(options) => options,
        other => return Err(SqlError::InvalidOption(format!("{other}: table options go in WITH (durability = …)"))),
    };
    for option in options {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(SqlError::InvalidOption(format!("{option}: expected key = value")));
        };
        let key = key.value.to_ascii_lowercase();
        let text = literal(&value)
            .ok_or_else(|| SqlError::InvalidOption(format!("{key} = {value}: expected a number or a string")))?;
        match key.as_str() {
            "durability" => {
                durability = Some(
                    text.parse()
                        .map_err(|reason: String| SqlError::InvalidOption(format!("{key} = {text:?}: {reason}")))?,
                )
            }
            other => {
                return Err(SqlError::InvalidOption(format!(
                    "unknown option {other:?}; a table takes durability (it is stored in one compacted partition)"
                )));
            }
        }
    }
    Ok(Statement::CreateTable {
        name,
        if_not_exists: create.if_not_exists,
        primary_key,
        columns,
        durability,
        foreign_keys,
    })
}

fn convert(statement: ast::Statement) -> Result<Statement, SqlError> {
    match statement {
        ast::Statement::ShowVariable { variable }
            if variable.len() == 1 && variable[0].value.eq_ignore_ascii_case("streams") =>
        {
            Ok(Statement::ShowStreams)
        }
        ast::Statement::ShowVariable { variable }
            if variable.len() == 1 && variable[0].value.eq_ignore_ascii_case("transforms") =>
        {
            Ok(Statement::ShowTransforms)
        }
        ast::Statement::ExplainTable { table_name, .. } => Ok(Statement::Describe { name: simple_name(&table_name)? }),
        ast::Statement::Query(query) => {
            let text = query_label(&query);
            Ok(Statement::Query { query, text })
        }
        statement @ (ast::Statement::Insert(_) | ast::Statement::Update(_) | ast::Statement::Delete(_)) => {
            let mut text = statement.to_string();
            if text.len() > 80 {
                text.truncate(text.floor_char_boundary(77));
                text.push_str("...");
            }
            Ok(Statement::Write { statement: Box::new(statement), text })
        }
        ast::Statement::Explain { statement, analyze: false, estimate: false, .. } => match *statement {
            ast::Statement::Query(query) => {
                let text = query_label(&query);
                Ok(Statement::Explain { query, text })
            }
            other => {
                Err(unsupported(format!("EXPLAIN of {}", other.to_string().split_whitespace().next().unwrap_or(""))))
            }
        },
        ast::Statement::CreateTable(create) => convert_create_table(create),
        ast::Statement::CreateIndex(create) => {
            let table = simple_name(&create.table_name)?;
            let [column] = create.columns.as_slice() else {
                return Err(SqlError::Syntax("an index covers one column: CREATE INDEX ON t (field)".into()));
            };
            if create.unique {
                return Err(unsupported("CREATE UNIQUE INDEX (the primary key is the unique one)"));
            }
            let name = create.name.as_ref().map(simple_name).transpose()?;
            Ok(Statement::CreateIndex { name, table, field: index_column_name(column)? })
        }
        ast::Statement::Drop { object_type, if_exists, names, .. } => {
            let [name] = names.as_slice() else {
                return Err(SqlError::Syntax("DROP takes one name".into()));
            };
            let name = simple_name(name)?;
            match object_type {
                ast::ObjectType::Table => Ok(Statement::DropTable { name, if_exists }),
                ast::ObjectType::Index => Ok(Statement::DropIndex { name, if_exists }),
                ast::ObjectType::View => Ok(Statement::DropView { name, if_exists }),
                other => Err(unsupported(format!("DROP {other}"))),
            }
        }
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
            "CREATE STREAM orders WITH (partitions = 4, retention = '7d', retention_bytes = '1GiB', durability = 'async', mqtt_topic = 'shop/+/orders', cleanup = 'compact');\n\
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
                        mqtt_topic: Some("shop/+/orders".into()),
                        compacted: true,
                        start: None,
                        value_format: None,
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
    fn tables_indexes_and_drops() {
        let statements = parse(
            "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer BIGINT NOT NULL, tags TEXT[], \
               note VARCHAR(20), total DOUBLE PRECISION) WITH (durability = 'async');\n\
             CREATE TABLE users (email text, PRIMARY KEY (email));\n\
             CREATE INDEX ON orders (customer); CREATE INDEX by_tag ON orders (tags);\n\
             DROP INDEX IF EXISTS by_tag; DROP TABLE orders; DROP STREAM IF EXISTS clicks; SHOW TABLES",
        )
        .unwrap();
        let Statement::CreateTable { name, if_not_exists, primary_key, columns, durability, .. } = &statements[0]
        else {
            panic!("{statements:?}")
        };
        assert_eq!((name.as_str(), *if_not_exists, primary_key.as_str()), ("orders", true, "id"));
        let types: Vec<String> = columns.iter().map(|column| format!("{} {}", column.name, column.ty)).collect();
        assert_eq!(types, ["id TEXT", "customer BIGINT", "tags TEXT[]", "note TEXT", "total DOUBLE"]);
        assert!(columns[0].not_null && columns[1].not_null && !columns[2].not_null);
        assert_eq!(*durability, Some(Durability::Async));
        assert!(matches!(&statements[1], Statement::CreateTable { primary_key, columns, .. }
            if primary_key == "email" && columns[0].not_null));
        assert_eq!(
            statements[2..],
            [
                Statement::CreateIndex { name: None, table: "orders".into(), field: "customer".into() },
                Statement::CreateIndex { name: Some("by_tag".into()), table: "orders".into(), field: "tags".into() },
                Statement::DropIndex { name: "by_tag".into(), if_exists: true },
                Statement::DropTable { name: "orders".into(), if_exists: false },
                Statement::DropStream { name: "clicks".into(), if_exists: true },
                Statement::ShowTables,
            ]
        );
        let message = |sql: &str| parse(sql).unwrap_err().to_string();
        assert!(message("CREATE TABLE t (a TEXT)").contains("needs a PRIMARY KEY"));
        assert!(message("CREATE TABLE t (a TEXT PRIMARY KEY, b MONEY)").contains("unknown column type"));
        assert!(message("CREATE TABLE t (a TEXT PRIMARY KEY, b TEXT UNIQUE)").contains("not supported"));
        assert!(message("CREATE TABLE t (a TEXT PRIMARY KEY) WITH (partitions = 2)").contains("takes durability"));
        assert!(message("CREATE INDEX ON t (a, b)").contains("one column"));
        assert!(message("DROP SCHEMA v").contains("not supported"));
        assert_eq!(
            parse("DROP VIEW IF EXISTS v; SHOW VIEWS").unwrap(),
            [Statement::DropView { name: "v".into(), if_exists: true }, Statement::ShowViews,]
        );
    }

    #[test]
    fn errors_say_what_is_wrong_and_what_works() {
        let message = |sql: &str| parse(sql).unwrap_err().to_string();
        assert!(message("CREATE STREAM s WITH (colour = 'red')").contains("unknown option \"colour\""));
        assert!(message("CREATE STREAM s WITH (partitions = 'many')").contains("whole number"));
        assert!(message("CREATE STREAM s WITH (retention = 'a while')").contains("7d"));
        assert!(message("CREATE STREAM s WITH (durability = 'eventually')").contains("\"fsync\" or \"async\""));
        assert!(message("CREATE STREAM s WITH (mqtt_topic = 'a/#/b')").contains("mqtt_topic"));
        assert!(message("CREATE STREAM a.b").contains("no schemas"));
        assert!(matches!(parse("SELECT * FROM orders").unwrap().as_slice(), [Statement::Query { .. }]));
        assert!(matches!(parse("INSERT INTO orders VALUES (1)").unwrap().as_slice(), [Statement::Write { .. }]));
        let unsupported = parse("TRUNCATE orders").unwrap_err();
        assert!(unsupported.hint().unwrap().contains("CREATE TABLE"), "{unsupported:?}");
        assert!(message("CREATE STREAM").starts_with("syntax error"));
        assert!(message("CREATE STREAM s s2").contains("expected ;"));
        assert!(message("  ;; ").contains("no statement"));
        assert_eq!(parse("show streams;").unwrap(), [Statement::ShowStreams]);
    }
}
