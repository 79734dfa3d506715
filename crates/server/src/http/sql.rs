//! `POST /sql`: one or more `;`-separated statements in the body, run in order.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::StringRejection;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;

fn sql_error(error: onehop_sql::SqlError) -> ApiError {
    match error {
        onehop_sql::SqlError::Engine(error) => error.into(),
        // A key taken, or a row changed by another writer first: the request was fine.
        other @ (onehop_sql::SqlError::UniqueViolation(_) | onehop_sql::SqlError::SerializationFailure(_)) => {
            ApiError {
                hint: other.hint(),
                status: axum::http::StatusCode::CONFLICT,
                ..ApiError::bad_request(other.code(), other.to_string())
            }
        }
        other => ApiError { hint: other.hint(), ..ApiError::bad_request(other.code(), other.to_string()) },
    }
}

/// Parses every statement first (a syntax error anywhere runs nothing), then runs them in
/// order; each definition is durable when its statement's result is reported. If one fails,
/// the ones before it have taken effect, and the error says so.
pub async fn run(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
    body: Result<String, StringRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body.map_err(|rejection| ApiError {
        retry_after_s: None,
        hint: None,
        status: rejection.status(),
        code: "bad_body",
        message: format!("the body must be SQL text in UTF-8: {}", rejection.body_text()),
    })?;
    let statements = onehop_sql::parse(&body).map_err(sql_error)?;
    let mut results = Vec::with_capacity(statements.len());
    for (index, statement) in statements.iter().enumerate() {
        match onehop_sql::execute_as(&state.engine, &principal, statement).await {
            Ok(output) => results.push(with_types(output)),
            Err(error) => {
                let mut refusal = sql_error(error);
                let done = if index == 0 {
                    String::new()
                } else {
                    format!(" (the {index} statement(s) before it took effect)")
                };
                refusal.message = format!(
                    "statement {} of {}, {}{done}: {}",
                    index + 1,
                    statements.len(),
                    statement.label(),
                    refusal.message
                );
                return Err(refusal);
            }
        }
    }
    Ok(Json(json!({ "results": results })))
}

/// A result as JSON; rows get `types` beside `columns`: the Postgres name of the type each
/// column's values share (`bigint`, `double precision`, `boolean`, `text`, `json`), as the
/// Postgres protocol describes them.
fn with_types(output: onehop_sql::Output) -> Value {
    let types = match &output {
        onehop_sql::Output::Rows { columns, rows, .. } => Some(
            (0..columns.len())
                .map(|index| match crate::pg::types::column_type(rows.iter().filter_map(|row| row.get(index))) {
                    crate::pg::types::INT8 => "bigint",
                    crate::pg::types::FLOAT8 => "double precision",
                    crate::pg::types::BOOL => "boolean",
                    crate::pg::types::JSON => "json",
                    _ => "text",
                })
                .collect::<Vec<_>>(),
        ),
        _ => None,
    };
    let mut value = serde_json::to_value(output).expect("a result serializes");
    if let (Some(types), Some(fields)) = (types, value.as_object_mut()) {
        fields.insert("types".into(), json!(types));
    }
    value
}
