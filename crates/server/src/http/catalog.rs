//! `GET /streams`, `GET /tables` and `GET /views`: what `SHOW STREAMS`, `SHOW TABLES` and
//! `SHOW VIEWS` list, for scripts and consoles that would rather not speak SQL. The same
//! statement runs as the request's principal, so a user sees what its grants reach, and a
//! client without credentials where they are required is asked for them.

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::error::ApiError;
use super::sql::sql_error;

/// `GET /streams`: `{"streams": [{"name": …, …}, …]}`, a field per `SHOW STREAMS` column.
pub async fn streams(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
) -> Result<Response, ApiError> {
    listing(&state, &principal, "SHOW STREAMS", "streams").await
}

/// `GET /tables`: `{"tables": […]}` as `SHOW TABLES` lists them.
pub async fn tables(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
) -> Result<Response, ApiError> {
    listing(&state, &principal, "SHOW TABLES", "tables").await
}

/// `GET /views`: `{"views": […]}` as `SHOW VIEWS` lists them.
pub async fn views(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
) -> Result<Response, ApiError> {
    listing(&state, &principal, "SHOW VIEWS", "views").await
}

async fn listing(
    state: &AppState,
    principal: &onehop_engine::Principal,
    statement: &str,
    field: &str,
) -> Result<Response, ApiError> {
    let statements = onehop_sql::parse(statement).map_err(sql_error)?;
    let output = onehop_sql::execute_as(&state.engine, principal, &statements[0]).await.map_err(sql_error)?;
    // A listing answers rows; anything else lists nothing.
    let objects: Vec<Value> = match output {
        onehop_sql::Output::Rows { columns, rows, .. } => rows
            .into_iter()
            .map(|row| Value::Object(columns.iter().cloned().zip(row).collect::<Map<String, Value>>()))
            .collect(),
        _ => Vec::new(),
    };
    Ok(Json(json!({ field: objects })).into_response())
}
