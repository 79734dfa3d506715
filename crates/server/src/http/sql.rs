//! `POST /sql`: one or more `;`-separated statements in the body, run in order.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::StringRejection;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use onehop_sql::query::stream::Streamed;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;

pub(super) fn sql_error(error: onehop_sql::SqlError) -> ApiError {
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
    headers: HeaderMap,
    body: Result<String, StringRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| ApiError {
        retry_after_s: None,
        hint: None,
        status: rejection.status(),
        code: "bad_body",
        message: format!("the body must be SQL text in UTF-8: {}", rejection.body_text()),
    })?;
    let statements = onehop_sql::parse(&body).map_err(sql_error)?;
    let ndjson = headers
        .get(header::ACCEPT)
        .and_then(|accept| accept.to_str().ok())
        .is_some_and(|accept| accept.contains("application/x-ndjson"));
    if ndjson {
        let [statement] = statements.as_slice() else {
            return Err(ApiError::bad_request(
                "sql_unsupported",
                format!("an NDJSON answer is of one query; this body has {} statements", statements.len()),
            ));
        };
        let mut answer = onehop_sql::stream_as(&state.engine, &principal, statement, None).map_err(sql_error)?;
        // A query that fails before its first row (a missing table, a refusal) answers with
        // its status, as any other request does.
        let first = match answer.recv().await {
            Some(Ok(first)) => first,
            Some(Err(error)) => return Err(sql_error(error)),
            None => {
                return Err(sql_error(onehop_sql::SqlError::InvalidQuery("the query ended without an answer".into())));
            }
        };
        return Ok(streamed(first, answer));
    }
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
    Ok(Json(json!({ "results": results })).into_response())
}

/// A query's answer as NDJSON, sent as it is made: `{"columns":[…]}`, then one array of
/// values per row, then `{"rows":n}`; or, when the query fails on the way (a limit, a
/// cancel), `{"error":{"code":…,"message":…}}` as the last line instead.
fn streamed(first: Streamed, answer: tokio::sync::mpsc::Receiver<Result<Streamed, onehop_sql::SqlError>>) -> Response {
    struct Feed {
        first: Option<Streamed>,
        answer: tokio::sync::mpsc::Receiver<Result<Streamed, onehop_sql::SqlError>>,
        /// The columns, until the first rows (whose types the header names) or the end.
        columns: Option<Vec<String>>,
        rows: u64,
    }
    /// The first line: the columns and the types of the first rows' values.
    fn header(columns: Vec<String>, rows: &[Vec<Value>]) -> Value {
        let types = type_names(columns.len(), rows);
        json!({ "columns": columns, "types": types })
    }
    let line = |value: &Value| {
        let mut bytes = serde_json::to_vec(value).expect("JSON serializes");
        bytes.push(b'\n');
        bytes
    };
    let lines = futures_util::stream::unfold(
        Some(Feed { first: Some(first), answer, columns: None, rows: 0 }),
        move |feed| async move {
            let mut feed = feed?;
            let next = match feed.first.take() {
                Some(first) => Some(Ok(first)),
                None => feed.answer.recv().await,
            };
            let mut chunk = Vec::new();
            match next {
                Some(Ok(Streamed::Columns(columns))) => feed.columns = Some(columns),
                Some(Ok(Streamed::Rows(rows))) => {
                    feed.rows += rows.len() as u64;
                    if let Some(columns) = feed.columns.take() {
                        chunk.extend(line(&header(columns, &rows)));
                    }
                    for row in rows {
                        chunk.extend(line(&Value::Array(row)));
                    }
                }
                Some(Err(error)) => {
                    if let Some(columns) = feed.columns.take() {
                        chunk.extend(line(&header(columns, &[])));
                    }
                    let error = sql_error(error);
                    let mut fields = json!({ "code": error.code, "message": error.message });
                    if let Some(hint) = error.hint {
                        fields["hint"] = json!(hint);
                    }
                    chunk.extend(line(&json!({ "error": fields })));
                    return Some((Ok::<_, std::convert::Infallible>(Bytes::from(chunk)), None));
                }
                None => {
                    if let Some(columns) = feed.columns.take() {
                        chunk.extend(line(&header(columns, &[])));
                    }
                    chunk.extend(line(&json!({ "rows": feed.rows })));
                    return Some((Ok(Bytes::from(chunk)), None));
                }
            }
            Some((Ok(Bytes::from(chunk)), Some(feed)))
        },
    );
    let mut response = Body::from_stream(lines).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    response
}

/// A result as JSON; rows get `types` beside `columns`: the Postgres name of the type each
/// column's values share (`bigint`, `double precision`, `boolean`, `text`, `json`), as the
/// Postgres protocol describes them.
fn with_types(output: onehop_sql::Output) -> Value {
    let types = match &output {
        onehop_sql::Output::Rows { columns, rows, .. } => Some(type_names(columns.len(), rows)),
        _ => None,
    };
    let mut value = serde_json::to_value(output).expect("a result serializes");
    if let (Some(types), Some(fields)) = (types, value.as_object_mut()) {
        fields.insert("types".into(), json!(types));
    }
    value
}

/// The Postgres name of the type each of `count` columns' values share in `rows`.
fn type_names(count: usize, rows: &[Vec<Value>]) -> Vec<&'static str> {
    (0..count)
        .map(|index| match crate::pg::types::column_type(rows.iter().filter_map(|row| row.get(index))) {
            crate::pg::types::INT8 => "bigint",
            crate::pg::types::FLOAT8 => "double precision",
            crate::pg::types::BOOL => "boolean",
            crate::pg::types::JSON => "json",
            _ => "text",
        })
        .collect()
}
