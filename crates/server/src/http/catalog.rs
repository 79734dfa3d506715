//! `GET /streams`, `GET /tables` and `GET /views`: what `SHOW STREAMS`, `SHOW TABLES` and
//! `SHOW VIEWS` list, and `DELETE /streams/{s}`, `/tables/{t}`, `/views/{v}`: what `DROP`
//! does, for scripts and consoles that would rather not speak SQL. The same statement runs as
//! the request's principal, so a user sees what its grants reach, drops only what it has ADMIN
//! on, and a client without credentials where they are required is asked for them.

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use onehop_sql::Statement;
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

/// `DELETE /streams/{stream}`: `DROP STREAM`, its records deleted at once.
pub async fn drop_stream(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    dropping(&state, &principal, Statement::DropStream { name: name.clone(), if_exists: false }, "stream", name).await
}

/// `DELETE /tables/{table}`: `DROP TABLE`, refused while another table's foreign key names it.
pub async fn drop_table(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    dropping(&state, &principal, Statement::DropTable { name: name.clone(), if_exists: false }, "table", name).await
}

/// `DELETE /views/{view}`: `DROP VIEW`, its state and change stream deleted.
pub async fn drop_view(
    State(state): State<AppState>,
    axum::Extension(principal): axum::Extension<onehop_engine::Principal>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    dropping(&state, &principal, Statement::DropView { name: name.clone(), if_exists: false }, "view", name).await
}

/// Runs a `DROP` as the principal; answers `{"dropped": kind, "name": name}`.
async fn dropping(
    state: &AppState,
    principal: &onehop_engine::Principal,
    statement: Statement,
    kind: &str,
    name: String,
) -> Result<Response, ApiError> {
    onehop_sql::execute_as(&state.engine, principal, &statement).await.map_err(sql_error)?;
    Ok(Json(json!({ "dropped": kind, "name": name })).into_response())
}
