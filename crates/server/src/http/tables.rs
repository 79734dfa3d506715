//! Tables over REST: `PUT|PATCH|GET|DELETE /tables/{t}/{id}` and `GET /tables/{t}?field=value`.
//!
//! A row is a JSON object. `PUT` replaces it (creating it if need be), `PATCH` applies a JSON
//! merge patch (RFC 7386) to an existing row, `DELETE` removes it. Every answer about one row
//! carries its version (the offset of the change that wrote it) as `ETag`; `If-Match: "N"`
//! makes a write conditional on that version, `If-Match: *` on the row existing and
//! `If-None-Match: *` on it not existing (412 otherwise, and nothing is written). A write is
//! answered once it is durable (`Onehop-Durability` as for streams) and visible to reads.
//!
//! `GET /tables/{t}?customer=42&limit=N&after={id}` lists matching rows in id order from an
//! index; a condition on a field without one is refused with the `CREATE INDEX` that would
//! serve it, unless `scan=true`. `select=a,b` answers those fields of each row, `sort=-price,name`
//! orders the matches by fields (`-` descending; the id breaks ties) and `offset=N` skips the
//! first N, as Harper's REST reads do. The same URLs with `Accept: text/event-stream` or a WebSocket
//! upgrade subscribe (see [`super::subscribe`]).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use onehop_engine::filter::Condition;
use onehop_engine::{Precondition, Row, Write, Written};
use serde_json::{Map, Value, json};

use super::AppState;
use super::error::ApiError;
use super::streams::durability;
use super::subscribe::{Params, Target};

type Upgrade = Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

/// Rows a query returns when it does not say.
const QUERY_LIMIT_DEFAULT: usize = 100;
/// Matching rows a sorted (or offset) list reads at most before it answers.
const SORTED_ROWS_MAX: usize = 100_000;

fn etag(offset: u64) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{offset}\"")).expect("digits are a valid header")
}

/// The version an `If-Match` / `If-None-Match` names: `"17"`, `W/"17"` or `17`.
fn parse_version(text: &str) -> Option<u64> {
    let text = text.trim().trim_start_matches("W/");
    text.trim_matches('"').parse().ok()
}

fn precondition(headers: &HeaderMap) -> Result<Precondition, ApiError> {
    let header_text = |name: header::HeaderName| -> Result<Option<String>, ApiError> {
        headers
            .get(&name)
            .map(|value| {
                value
                    .to_str()
                    .map(str::to_string)
                    .map_err(|_| ApiError::bad_request("bad_precondition", format!("{name} is not text")))
            })
            .transpose()
    };
    match (header_text(header::IF_MATCH)?, header_text(header::IF_NONE_MATCH)?) {
        (None, None) => Ok(Precondition::None),
        (Some(_), Some(_)) => {
            Err(ApiError::bad_request("bad_precondition", "send If-Match or If-None-Match, not both"))
        }
        (Some(value), None) if value.trim() == "*" => Ok(Precondition::Exists),
        (Some(value), None) => parse_version(&value).map(Precondition::Version).ok_or_else(|| {
            ApiError::bad_request(
                "bad_precondition",
                format!("If-Match {value:?}: expected one ETag such as \"17\" (a row's version), or *"),
            )
        }),
        (None, Some(value)) if value.trim() == "*" => Ok(Precondition::Missing),
        (None, Some(value)) => Err(ApiError::bad_request(
            "bad_precondition",
            format!("If-None-Match {value:?}: on a write, only * (create only) is supported"),
        )),
    }
}

fn body_bytes(state: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| ApiError {
        retry_after_s: None,
        hint: None,
        status: rejection.status(),
        code: if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE { "body_too_large" } else { "bad_body" },
        message: format!("{} (the limit is {} bytes)", rejection.body_text(), state.body_bytes_max),
    })
}

fn json_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(ApiError::bad_request("bad_json", format!("a row is a JSON object, not {}", kind_of(&other)))),
        Err(error) => Err(ApiError::bad_request("bad_json", format!("the body is not JSON: {error}"))),
    }
}

fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The answer to a write: status, ETag and `{"table","id","offset","row"}`.
fn written(table: &str, id: &str, written: Written) -> Response {
    let status = if written.created { StatusCode::CREATED } else { StatusCode::OK };
    let row = written.row.as_ref().map_or("null".to_string(), |row| String::from_utf8_lossy(&row.json).into_owned());
    let body =
        format!("{{\"table\":{},\"id\":{},\"offset\":{},\"row\":{row}}}", json!(table), json!(id), written.offset);
    let mut response = (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
    if written.row.is_some() {
        response.headers_mut().insert(header::ETAG, etag(written.offset));
    }
    response
}

/// A row write of `bytes` (the body), within its user's publish rates.
async fn write(
    state: AppState,
    principal: onehop_engine::Principal,
    table: String,
    id: String,
    headers: HeaderMap,
    write: Write,
    bytes: u64,
) -> Result<Response, ApiError> {
    let precondition = precondition(&headers)?;
    let durability = durability(&headers)?;
    principal.admit_publish(1, bytes)?;
    let done = state.engine.write_row(&table, &id, write, precondition, durability).await?;
    Ok(written(&table, &id, done))
}

pub async fn put_row(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path((table, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let row = json_object(&body)?;
    write(state, principal, table, id, headers, Write::Put(row), body.len() as u64).await
}

pub async fn patch_row(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path((table, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body_bytes(&state, body)?;
    let patch = json_object(&body)?;
    write(state, principal, table, id, headers, Write::Patch(patch), body.len() as u64).await
}

pub async fn delete_row(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path((table, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    write(state, principal, table, id, headers, Write::Delete, 0).await
}

/// A WebSocket or SSE subscription to `target` when the request asks for one.
pub(super) async fn maybe_subscribe(
    state: &AppState,
    principal: &onehop_engine::Principal,
    target: Target,
    raw: &str,
    headers: &HeaderMap,
    upgrade: Upgrade,
) -> Result<Option<Response>, ApiError> {
    if let Ok(upgrade) = upgrade {
        // Refuse a bad first subscription before upgrading, in HTTP.
        let params = Params::parse(raw, &target)?;
        super::subscribe::ensure_exists(state, &target).await?;
        let request = super::ws::Request { subscription: "url".into(), target, params };
        let (state, principal) = (state.clone(), principal.clone());
        let max = state.subscriptions_per_socket_max;
        let held = principal.hold(onehop_engine::Resource::Connection)?;
        return Ok(Some(
            super::ws::configure(upgrade)
                .on_upgrade(move |socket| super::ws::serve(state, principal, socket, Some(request), max, held))
                .into_response(),
        ));
    }
    if super::sse::wants_events(headers) {
        return Ok(Some(super::sse::subscribe(state.clone(), principal.clone(), target, raw, headers).await?));
    }
    Ok(None)
}

/// `GET /tables/{t}/{id}`: the row (or a subscription to it).
pub async fn get_row(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path((table, id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let raw = raw.unwrap_or_default();
    let target = Target::Row { table: table.clone(), id: id.clone() };
    if let Some(response) = maybe_subscribe(&state, &principal, target, &raw, &headers, upgrade).await? {
        return Ok(response);
    }
    let mut includes = Vec::new();
    for (name, value) in super::query::pairs(&raw)? {
        match name.as_str() {
            "include" => includes.extend(names_of(&value)),
            _ => {
                return Err(ApiError::bad_request(
                    "bad_query",
                    "reading one row takes include=relationship,… and no other query parameter",
                ));
            }
        }
    }
    let handle = state.engine.table(&table)?;
    let Some(row) = handle.get(&id) else {
        return Err(onehop_engine::EngineError::RowNotFound { table, id }.into());
    };
    if !includes.is_empty() {
        let plan = relationships(&state.engine, &principal, &handle.def(), &includes)?;
        let mut doc = row.doc().clone();
        include(&state.engine, &handle.def(), &plan, &mut doc)?;
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, HeaderValue::from_static("application/json")), (header::ETAG, etag(row.offset))],
            Value::Object(doc).to_string(),
        )
            .into_response());
    }
    let unchanged = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .and_then(parse_version)
        .is_some_and(|version| version == row.offset);
    if unchanged {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag(row.offset))]).into_response());
    }
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json")), (header::ETAG, etag(row.offset))],
        row.json.clone(),
    )
        .into_response())
}

/// `GET /tables/{t}?…`: matching rows (or a subscription to them).
pub async fn query_rows(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path(table): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let raw = raw.unwrap_or_default();
    if let Some(response) =
        maybe_subscribe(&state, &principal, Target::Table(table.clone()), &raw, &headers, upgrade).await?
    {
        return Ok(response);
    }
    let pairs = super::query::pairs(&raw)?;
    let (mut limit, mut after, mut scan, mut conditions) = (QUERY_LIMIT_DEFAULT, None, false, Vec::new());
    let (mut select, mut sort, mut offset): (Option<Vec<String>>, Vec<(String, bool)>, usize) = (None, Vec::new(), 0);
    let mut includes: Vec<String> = Vec::new();
    for (name, value) in pairs {
        match name.as_str() {
            "include" => includes.extend(names_of(&value)),
            "select" => {
                let fields: Vec<String> =
                    value.split(',').map(|field| field.trim().to_string()).filter(|field| !field.is_empty()).collect();
                if fields.is_empty() {
                    return Err(ApiError::bad_request("bad_query", "select names fields: select=title,price"));
                }
                select = Some(fields);
            }
            "sort" => {
                for term in value.split(',').map(str::trim).filter(|term| !term.is_empty()) {
                    let (field, descending) = match term.strip_prefix('-') {
                        Some(field) => (field, true),
                        None => (term.strip_prefix('+').unwrap_or(term), false),
                    };
                    if field.is_empty() {
                        return Err(ApiError::bad_request("bad_query", format!("sort term {term:?} names no field")));
                    }
                    sort.push((field.to_string(), descending));
                }
            }
            "offset" => {
                offset = value.parse().ok().filter(|&n| n <= SORTED_ROWS_MAX).ok_or_else(|| {
                    ApiError::bad_request("bad_query", format!("offset must be between 0 and {SORTED_ROWS_MAX}"))
                })?;
            }
            "limit" => {
                limit = value
                    .parse()
                    .ok()
                    .filter(|&n| (1..=onehop_engine::table::QUERY_LIMIT_MAX).contains(&n))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "bad_limit",
                            format!("limit must be between 1 and {}", onehop_engine::table::QUERY_LIMIT_MAX),
                        )
                    })?;
            }
            "after" => after = Some(value),
            "scan" => {
                scan = match value.as_str() {
                    "true" | "1" => true,
                    "false" | "0" => false,
                    other => {
                        return Err(ApiError::bad_request(
                            "bad_query",
                            format!("scan must be true or false, not {other:?}"),
                        ));
                    }
                }
            }
            "from" | "snapshot" | "subject" => {
                return Err(ApiError::bad_request(
                    "bad_query",
                    format!("{name} is for subscriptions (Accept: text/event-stream or a WebSocket upgrade)"),
                ));
            }
            field => conditions.push(Condition::new(field, &value)?),
        }
    }
    let handle = state.engine.table(&table)?;
    let plan = relationships(&state.engine, &principal, &handle.def(), &includes)?;
    if select.is_none() && sort.is_empty() && offset == 0 && includes.is_empty() {
        let page = handle.query(&conditions, after.as_deref(), limit, scan)?;
        return Ok((
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            page_json(&table, &page.rows, page.next_after),
        )
            .into_response());
    }
    // Sorted or offset: every match (after `after`), then ordered, skipped and cut.
    let mut matches: Vec<Row> = Vec::new();
    let mut from = after.clone();
    loop {
        let page = handle.query(&conditions, from.as_deref(), onehop_engine::table::QUERY_LIMIT_MAX, scan)?;
        matches.extend(page.rows);
        if matches.len() > SORTED_ROWS_MAX {
            return Err(ApiError::bad_request(
                "too_many_rows",
                format!(
                    "sort and offset read at most {SORTED_ROWS_MAX} matching rows, and more match: narrow the \
                     conditions, or page in id order with after="
                ),
            ));
        }
        match page.next_after {
            Some(next) => from = Some(next),
            None => break,
        }
    }
    if !sort.is_empty() {
        matches.sort_by(|left, right| {
            for (field, descending) in &sort {
                let (a, b) = (left.doc().get(field), right.doc().get(field));
                let present = |value: Option<&Value>| value.is_some_and(|value| !value.is_null());
                let order = sort_order(a, b);
                // Missing values stay last, whichever the direction.
                let order = if *descending && present(a) && present(b) { order.reverse() } else { order };
                if order != std::cmp::Ordering::Equal {
                    return order;
                }
            }
            left.id.cmp(&right.id)
        });
    }
    let more = matches.len() > offset + limit;
    let page: Vec<&Row> = matches.iter().skip(offset).take(limit).collect();
    // The next page of an id-ordered list starts after its last row; a sorted one by offset.
    let next_after = (more && sort.is_empty()).then(|| page.last().map(|row| row.id.clone())).flatten();
    let next_offset = (more && !sort.is_empty()).then_some(offset + limit);
    let mut rows: Vec<Value> = Vec::with_capacity(page.len());
    for row in &page {
        let mut doc = row.doc().clone();
        include(&state.engine, &handle.def(), &plan, &mut doc)?;
        rows.push(match &select {
            None => Value::Object(doc),
            // An included relationship is kept whether or not `select` names it.
            Some(fields) => Value::Object(
                doc.into_iter().filter(|(field, _)| fields.contains(field) || includes.contains(field)).collect(),
            ),
        });
    }
    let mut body = json!({ "table": table, "rows": rows, "next_after": next_after });
    if !sort.is_empty() {
        body["next_offset"] = json!(next_offset);
    }
    Ok((StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response())
}

fn names_of(value: &str) -> Vec<String> {
    value.split(',').map(|name| name.trim().to_string()).filter(|name| !name.is_empty()).collect()
}

/// One `include=` relationship of a table's rows.
enum Relationship {
    /// `name` is this table's foreign key column: the row of `table` it holds the key of.
    Forward { name: String, table: String },
    /// `name` is a table with a foreign key `column` to this one: its rows that reference the row.
    Reverse { name: String, column: String },
}

/// What each `include` name is, checked against what `principal` may read.
fn relationships(
    engine: &onehop_engine::Engine,
    principal: &onehop_engine::Principal,
    def: &onehop_engine::TableDef,
    names: &[String],
) -> Result<Vec<Relationship>, ApiError> {
    let mut plan = Vec::with_capacity(names.len());
    for name in names {
        let relationship = if let Some(key) = def.foreign_key(name) {
            Relationship::Forward { name: name.clone(), table: key.table.clone() }
        } else {
            let referencing: Vec<String> = match engine.table(name) {
                Ok(other) => other
                    .def()
                    .foreign_keys
                    .iter()
                    .filter(|key| key.table == def.name)
                    .map(|key| key.column.clone())
                    .collect(),
                Err(_) => Vec::new(),
            };
            match referencing.as_slice() {
                [column] => Relationship::Reverse { name: name.clone(), column: column.clone() },
                [] => {
                    let forward: Vec<&str> = def.foreign_keys.iter().map(|key| key.column.as_str()).collect();
                    let reverse: Vec<String> = engine
                        .tables()
                        .iter()
                        .filter(|table| table.def().foreign_keys.iter().any(|key| key.table == def.name))
                        .map(|table| table.name())
                        .collect();
                    return Err(ApiError::bad_request(
                        "unknown_relationship",
                        format!(
                            "{} has no relationship {name}: its foreign keys are [{}], and the tables referencing it \
                             [{}] (declare one with FOREIGN KEY (column) REFERENCES table)",
                            def.name,
                            forward.join(", "),
                            reverse.join(", ")
                        ),
                    ));
                }
                several => {
                    return Err(ApiError::bad_request(
                        "unknown_relationship",
                        format!(
                            "{name} references {} through several columns ({}): include cannot tell which",
                            def.name,
                            several.join(", ")
                        ),
                    ));
                }
            }
        };
        let table = match &relationship {
            Relationship::Forward { table, .. } => table,
            Relationship::Reverse { name, .. } => name,
        };
        engine.access().authorize(
            principal,
            onehop_engine::Privilege::Read,
            onehop_engine::ObjectKind::Table,
            table,
        )?;
        plan.push(relationship);
    }
    Ok(plan)
}

/// Puts into `doc` (a row of `def`) the rows its relationships name.
fn include(
    engine: &onehop_engine::Engine,
    def: &onehop_engine::TableDef,
    plan: &[Relationship],
    doc: &mut Map<String, Value>,
) -> Result<(), ApiError> {
    for relationship in plan {
        match relationship {
            Relationship::Forward { name, table } => {
                let other = engine.table(table)?;
                let found = doc
                    .get(name)
                    .and_then(|key| other.def().id_of(key))
                    .and_then(|id| other.get(&id))
                    .map_or(Value::Null, |row| Value::Object(row.doc().clone()));
                doc.insert(name.clone(), found);
            }
            Relationship::Reverse { name, column } => {
                let other = engine.table(name)?;
                let Some(id) = doc.get(&def.primary_key).and_then(|key| def.id_of(key)) else { continue };
                let condition = Condition::new(column, &id)?;
                let mut children = Vec::new();
                let mut after: Option<String> = None;
                loop {
                    let page = other.query(
                        std::slice::from_ref(&condition),
                        after.as_deref(),
                        onehop_engine::table::QUERY_LIMIT_MAX,
                        false,
                    )?;
                    children.extend(page.rows.iter().map(|row| Value::Object(row.doc().clone())));
                    if children.len() > SORTED_ROWS_MAX {
                        return Err(ApiError::bad_request(
                            "too_many_rows",
                            format!("include={name}: more than {SORTED_ROWS_MAX} rows reference one row"),
                        ));
                    }
                    match page.next_after {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                doc.insert(name.clone(), Value::Array(children));
            }
        }
    }
    Ok(())
}

/// How `sort` orders two rows' values of a field: missing and null last, then numbers, text
/// and booleans each among themselves (by value, by code point, false before true), kinds in
/// that order.
fn sort_order(left: Option<&Value>, right: Option<&Value>) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let rank = |value: Option<&Value>| match value {
        None | Some(Value::Null) => 4,
        Some(Value::Number(_)) => 0,
        Some(Value::String(_)) => 1,
        Some(Value::Bool(_)) => 2,
        Some(_) => 3,
    };
    match (left, right) {
        (Some(a @ Value::Number(_)), Some(b @ Value::Number(_))) => {
            onehop_engine::view::expr::compare(a, b).unwrap_or(Ordering::Equal)
        }
        (Some(Value::String(a)), Some(Value::String(b))) => a.cmp(b),
        (Some(Value::Bool(a)), Some(Value::Bool(b))) => a.cmp(b),
        (a, b) if rank(a) != rank(b) => rank(a).cmp(&rank(b)),
        (a, b) => a.map(|a| a.to_string()).cmp(&b.map(|b| b.to_string())),
    }
}

/// `{"table","rows":[…],"next_after"}` with each row's stored JSON as it is.
fn page_json(table: &str, rows: &[Row], next_after: Option<String>) -> Vec<u8> {
    let mut body = Vec::with_capacity(64 + rows.iter().map(|row| row.json.len() + 1).sum::<usize>());
    body.extend_from_slice(format!("{{\"table\":{},\"rows\":[", json!(table)).as_bytes());
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&row.json);
    }
    body.extend_from_slice(format!("],\"next_after\":{}}}", json!(next_after)).as_bytes());
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preconditions_parse() {
        let headers = |name: &'static str, value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert(name, HeaderValue::from_static(value));
            headers
        };
        assert_eq!(precondition(&HeaderMap::new()).unwrap(), Precondition::None);
        assert_eq!(precondition(&headers("if-match", "\"17\"")).unwrap(), Precondition::Version(17));
        assert_eq!(precondition(&headers("if-match", "W/\"17\"")).unwrap(), Precondition::Version(17));
        assert_eq!(precondition(&headers("if-match", "*")).unwrap(), Precondition::Exists);
        assert_eq!(precondition(&headers("if-none-match", "*")).unwrap(), Precondition::Missing);
        assert_eq!(precondition(&headers("if-match", "\"abc\"")).unwrap_err().code, "bad_precondition");
        assert_eq!(precondition(&headers("if-none-match", "\"1\"")).unwrap_err().code, "bad_precondition");
    }
}
