//! What a table is: its primary key, declared columns (checked on every write), secondary
//! indexes and durability. Rows are JSON objects; fields that are not declared are allowed and
//! unchecked, as in a document store.

use std::fmt;

use onehop_log::Durability;
use serde_json::{Map, Value};

use crate::catalog::validate_name;
use crate::error::EngineError;

/// A table declares at most this many columns and indexes.
pub const TABLE_COLUMNS_MAX: usize = 1024;
pub const TABLE_INDEXES_MAX: usize = 64;

/// The type of a declared column. Every type also admits JSON `null` unless the column is
/// `NOT NULL` (the primary key always is).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColumnType {
    /// A JSON string.
    Text,
    /// A JSON number without a fraction, within 64-bit signed range.
    Integer,
    /// Any JSON number.
    Float,
    Boolean,
    /// An RFC 3339 time as a JSON string (`2026-11-21T09:30:00Z`).
    Timestamp,
    /// Any JSON value.
    Json,
    /// A JSON array whose elements all have the inner type (never an array of arrays).
    Array(Box<ColumnType>),
}

impl ColumnType {
    /// The type named by `name` as SQL spells it (`TEXT`, `BIGINT`, `TEXT[]`, …), any case.
    pub fn parse(name: &str) -> Result<ColumnType, String> {
        let name = name.trim().to_ascii_lowercase();
        if let Some(inner) = name.strip_suffix("[]") {
            let inner = ColumnType::parse(inner)?;
            if matches!(inner, ColumnType::Array(_) | ColumnType::Json) {
                return Err(format!("{name}: arrays hold scalar types only"));
            }
            return Ok(ColumnType::Array(Box::new(inner)));
        }
        Ok(match name.as_str() {
            "text" | "varchar" | "string" | "character varying" | "char" | "uuid" => ColumnType::Text,
            "integer" | "int" | "int4" | "int8" | "bigint" | "smallint" | "int2" => ColumnType::Integer,
            "float" | "float4" | "float8" | "double" | "double precision" | "real" | "numeric" | "decimal" => {
                ColumnType::Float
            }
            "boolean" | "bool" => ColumnType::Boolean,
            "timestamp" | "timestamptz" | "timestamp with time zone" => ColumnType::Timestamp,
            "json" | "jsonb" => ColumnType::Json,
            other => {
                return Err(format!(
                    "unknown column type {other:?}; onehop knows TEXT, INTEGER/BIGINT, FLOAT/DOUBLE, BOOLEAN, \
                     TIMESTAMP, JSON and arrays of the scalar ones (TEXT[])"
                ));
            }
        })
    }

    /// Whether `value` (not null) has this type.
    fn admits(&self, value: &Value) -> bool {
        match (self, value) {
            (ColumnType::Text, Value::String(_)) => true,
            (ColumnType::Integer, Value::Number(number)) => {
                number.is_i64() || number.is_u64() && number.as_i64().is_some()
            }
            (ColumnType::Float, Value::Number(_)) => true,
            (ColumnType::Boolean, Value::Bool(_)) => true,
            (ColumnType::Timestamp, Value::String(text)) => crate::units::parse_rfc3339_ms(text).is_ok(),
            (ColumnType::Json, _) => true,
            (ColumnType::Array(inner), Value::Array(items)) => {
                items.iter().all(|item| !item.is_null() && inner.admits(item))
            }
            _ => false,
        }
    }
}

impl fmt::Display for ColumnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ColumnType::Text => f.write_str("TEXT"),
            ColumnType::Integer => f.write_str("BIGINT"),
            ColumnType::Float => f.write_str("DOUBLE"),
            ColumnType::Boolean => f.write_str("BOOLEAN"),
            ColumnType::Timestamp => f.write_str("TIMESTAMP"),
            ColumnType::Json => f.write_str("JSON"),
            ColumnType::Array(inner) => write!(f, "{inner}[]"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub ty: ColumnType,
    pub not_null: bool,
}

/// A secondary index on one top-level field. Rows whose field is an array are indexed under
/// each element, so `?tags=sports` finds rows whose `tags` contains `"sports"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexDef {
    pub name: String,
    pub field: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableDef {
    pub name: String,
    /// The primary key column; it is also in `columns`. Its value is the row's id in URLs.
    pub primary_key: String,
    /// Declared columns in declaration order.
    pub columns: Vec<Column>,
    pub indexes: Vec<IndexDef>,
    /// Durability of writes that do not ask for one.
    pub durability: Durability,
    /// Declared relationships: a column holding another table's primary key. They are for
    /// reads (`?include=` on REST, the catalog Postgres clients read); a write is not refused
    /// for a key no row has, as Harper's relationships are not.
    pub foreign_keys: Vec<ForeignKey>,
}

/// `FOREIGN KEY (column) REFERENCES table (its primary key)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignKey {
    pub column: String,
    pub table: String,
}

impl TableDef {
    /// The relationship declared on `column`, if any.
    pub fn foreign_key(&self, column: &str) -> Option<&ForeignKey> {
        self.foreign_keys.iter().find(|key| key.column == column)
    }

    pub fn validate(&self) -> Result<(), EngineError> {
        let invalid = |reason: String| Err(EngineError::InvalidDefinition(format!("table {}: {reason}", self.name)));
        validate_name(&self.name)?;
        if self.columns.len() > TABLE_COLUMNS_MAX {
            return invalid(format!("at most {TABLE_COLUMNS_MAX} columns"));
        }
        if self.indexes.len() > TABLE_INDEXES_MAX {
            return invalid(format!("at most {TABLE_INDEXES_MAX} indexes"));
        }
        for (i, column) in self.columns.iter().enumerate() {
            validate_field_name(&column.name)?;
            if self.columns[..i].iter().any(|other| other.name == column.name) {
                return invalid(format!("column {:?} is declared twice", column.name));
            }
        }
        for (i, key) in self.foreign_keys.iter().enumerate() {
            if self.column(&key.column).is_none() {
                return invalid(format!("the foreign key column {:?} is not a declared column", key.column));
            }
            if self.foreign_keys[..i].iter().any(|other| other.column == key.column) {
                return invalid(format!("column {:?} has two foreign keys", key.column));
            }
            validate_name(&key.table)?;
        }
        let Some(key) = self.column(&self.primary_key) else {
            return invalid(format!("the primary key {:?} is not a declared column", self.primary_key));
        };
        if !matches!(key.ty, ColumnType::Text | ColumnType::Integer) {
            return invalid(format!("the primary key must be TEXT or an integer, not {}", key.ty));
        }
        if !key.not_null {
            return invalid("the primary key is NOT NULL".into());
        }
        for (i, index) in self.indexes.iter().enumerate() {
            validate_field_name(&index.field)?;
            validate_name(&index.name)?;
            if index.field == self.primary_key {
                return invalid(format!("{:?} is the primary key; rows are found by it without an index", index.field));
            }
            if self.indexes[..i].iter().any(|other| other.field == index.field || other.name == index.name) {
                return invalid(format!("index {:?} on {:?} duplicates another index", index.name, index.field));
            }
        }
        Ok(())
    }

    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|column| column.name == name)
    }

    pub fn index_on(&self, field: &str) -> Option<&IndexDef> {
        self.indexes.iter().find(|index| index.field == field)
    }

    /// The id a row with primary key value `value` has in URLs and in the log's record key.
    pub fn id_of(&self, value: &Value) -> Option<String> {
        TableDef::id_text(value).map(std::borrow::Cow::into_owned)
    }

    /// [`TableDef::id_of`], borrowed where the value is text already (the same for every
    /// table: a key is text or an integer).
    pub fn id_text<'v>(value: &'v Value) -> Option<std::borrow::Cow<'v, str>> {
        match value {
            Value::String(text) => Some(std::borrow::Cow::Borrowed(text)),
            Value::Number(number) if number.is_i64() || number.is_u64() => {
                Some(std::borrow::Cow::Owned(number.to_string()))
            }
            _ => None,
        }
    }

    /// The primary key value for the id `id` (from a URL), as stored in the row.
    pub fn key_value(&self, id: &str) -> Result<Value, EngineError> {
        let key = self.column(&self.primary_key).expect("validated: the key is a column");
        match key.ty {
            ColumnType::Integer => match id.parse::<i64>() {
                // One spelling per key: "007" and "7" must not be two rows.
                Ok(key) if key.to_string() == id => Ok(Value::from(key)),
                Ok(key) => Err(EngineError::InvalidRow(format!(
                    "{} is an integer key: write {id:?} as \"{key}\"",
                    self.primary_key
                ))),
                Err(_) => Err(EngineError::InvalidRow(format!(
                    "{} is an integer key; {id:?} is not an integer",
                    self.primary_key
                ))),
            },
            _ => Ok(Value::String(id.to_string())),
        }
    }

    /// Checks `row` (the whole row after the write) for row `id`: a JSON object whose primary
    /// key field, when present, equals the id, and whose declared columns have their types.
    /// Sets the primary key field when it is missing.
    pub fn check_row(&self, id: &str, row: &mut Map<String, Value>) -> Result<(), EngineError> {
        if id.is_empty() {
            return Err(EngineError::InvalidRow("the row id is empty".into()));
        }
        let key = self.key_value(id)?;
        match row.get(&self.primary_key) {
            None => {
                row.insert(self.primary_key.clone(), key);
            }
            Some(value) if *value == key => {}
            Some(value) => {
                return Err(EngineError::InvalidRow(format!(
                    "the primary key {} is {value} in the body but {id:?} in the URL; a row's key cannot change",
                    self.primary_key
                )));
            }
        }
        for column in &self.columns {
            match row.get(&column.name) {
                None | Some(Value::Null) if column.not_null => {
                    return Err(EngineError::InvalidRow(format!("column {} is NOT NULL", column.name)));
                }
                None | Some(Value::Null) => {}
                Some(value) if column.ty.admits(value) => {}
                Some(value) => {
                    let mut shown = value.to_string();
                    if shown.len() > 64 {
                        shown.truncate(shown.floor_char_boundary(61));
                        shown.push_str("...");
                    }
                    return Err(EngineError::InvalidRow(format!(
                        "column {} is {}; {shown} is not",
                        column.name, column.ty
                    )));
                }
            }
        }
        Ok(())
    }

    /// A short description for messages and `SHOW TABLES`.
    pub fn describe(&self) -> String {
        let columns: Vec<String> = self
            .columns
            .iter()
            .map(|column| {
                let mut text = format!("{} {}", column.name, column.ty);
                if column.name == self.primary_key {
                    text.push_str(" PRIMARY KEY");
                } else if column.not_null {
                    text.push_str(" NOT NULL");
                }
                text
            })
            .collect();
        let mut text = format!("({}), durability = {}", columns.join(", "), self.durability);
        for key in &self.foreign_keys {
            text.push_str(&format!(", foreign key {} references {}", key.column, key.table));
        }
        for index in &self.indexes {
            text.push_str(&format!(", index {} on {}", index.name, index.field));
        }
        text
    }

    /// The definition without its indexes: what `CREATE TABLE` says (indexes come and go with
    /// `CREATE INDEX` / `DROP INDEX`).
    pub fn without_indexes(&self) -> TableDef {
        TableDef { indexes: Vec::new(), ..self.clone() }
    }
}

/// Field names are top-level JSON keys used in URLs and SQL: 1–128 bytes of letters, digits
/// and `_`, `-`, not starting with a digit.
pub fn validate_field_name(name: &str) -> Result<(), EngineError> {
    let bad = |reason: &str| Err(EngineError::InvalidDefinition(format!("invalid field name {name:?}: {reason}")));
    if name.is_empty() || name.len() > 128 {
        return bad("1 to 128 bytes");
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return bad("must not start with a digit");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return bad("letters, digits, _ and - only");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn orders() -> TableDef {
        TableDef {
            name: "orders".into(),
            primary_key: "id".into(),
            columns: vec![
                Column { name: "id".into(), ty: ColumnType::Text, not_null: true },
                Column { name: "customer".into(), ty: ColumnType::Integer, not_null: false },
                Column { name: "tags".into(), ty: ColumnType::parse("text[]").unwrap(), not_null: false },
                Column { name: "at".into(), ty: ColumnType::Timestamp, not_null: false },
                Column { name: "total".into(), ty: ColumnType::Float, not_null: true },
            ],
            indexes: vec![IndexDef { name: "orders_customer_idx".into(), field: "customer".into() }],
            durability: Durability::Fsync,
            foreign_keys: Vec::new(),
        }
    }

    fn check(value: Value) -> Result<Map<String, Value>, String> {
        let Value::Object(mut row) = value else { panic!() };
        orders().check_row("o1", &mut row).map(|()| row).map_err(|error| error.to_string())
    }

    #[test]
    fn rows_are_checked_against_declared_columns() {
        orders().validate().unwrap();
        let row = check(json!({"customer": 42, "tags": ["a", "b"], "total": 9.5, "extra": {"x": 1}})).unwrap();
        assert_eq!(row["id"], "o1", "the key is filled in from the URL");
        check(json!({"id": "o1", "total": 1, "customer": null, "at": "2026-11-21T09:30:00Z"})).unwrap();
        assert!(check(json!({"id": "o2", "total": 1})).unwrap_err().contains("cannot change"));
        assert!(check(json!({"total": 1, "customer": "42"})).unwrap_err().contains("customer is BIGINT"));
        assert!(check(json!({"total": 1, "customer": 4.5})).unwrap_err().contains("BIGINT"));
        assert!(check(json!({"total": 1, "tags": ["a", 1]})).unwrap_err().contains("TEXT[]"));
        assert!(check(json!({"total": 1, "at": "yesterday"})).unwrap_err().contains("TIMESTAMP"));
        assert!(check(json!({"customer": 1})).unwrap_err().contains("total is NOT NULL"));
    }

    #[test]
    fn definitions_are_validated() {
        let mut def = orders();
        def.primary_key = "nothing".into();
        assert!(def.validate().unwrap_err().to_string().contains("not a declared column"));
        let mut def = orders();
        def.indexes.push(IndexDef { name: "again".into(), field: "customer".into() });
        assert!(def.validate().unwrap_err().to_string().contains("duplicates"));
        assert!(ColumnType::parse("money").unwrap_err().contains("TEXT, INTEGER"));
        assert!(ColumnType::parse("text[][]").is_err());
        assert_eq!(ColumnType::parse("BIGINT[]").unwrap().to_string(), "BIGINT[]");
        let integer_key = TableDef {
            columns: vec![Column { name: "id".into(), ty: ColumnType::Integer, not_null: true }],
            indexes: vec![],
            ..orders()
        };
        assert_eq!(integer_key.key_value("17").unwrap(), json!(17));
        assert!(integer_key.key_value("x").is_err());
        assert!(integer_key.key_value("007").unwrap_err().to_string().contains("\"7\""), "one spelling per key");
    }
}
