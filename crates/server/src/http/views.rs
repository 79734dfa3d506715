//! Views over REST: `GET /views/{v}/{key}` answers a key's rows (its open windows, newest
//! first, then the closed ones it still keeps, flagged `"final": true`) from memory;
//! `GET /views/{v}?after={key}&limit=N` lists keys in order with their rows and the view's
//! status. The same URLs with `Accept: text/event-stream` or a WebSocket upgrade subscribe to
//! the view's changes (`final=true`: only closed windows; `snapshot=true`: the current rows
//! first).

use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use super::subscribe::Target;
use super::tables::maybe_subscribe;

type Upgrade = Result<axum::extract::ws::WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

const LIST_LIMIT_DEFAULT: usize = 100;
const LIST_LIMIT_MAX: usize = 10_000;
/// Keys a filtered list read looks at per request at most: a filter few rows pass answers the
/// keys found so far and where to go on (`next_after`), never a scan of the whole view.
const FILTER_SCAN_KEYS_MAX: usize = 100_000;
/// Keys read from the view per step of a filtered list read.
const FILTER_STEP_KEYS: usize = 1_000;

fn json_response(body: serde_json::Value) -> Response {
    json_bytes_response(body.to_string().into_bytes())
}

fn json_bytes_response(body: Vec<u8>) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// A joined view's list page (`page` has one row more than `limit` when there is a next page),
/// put together from the JSON the view keeps of its rows: the same answer as the other
/// views', without serializing the rows again.
fn joined_page(
    view: &str,
    mut page: Vec<onehop_engine::view::OutputRow>,
    status: &onehop_engine::view::ViewStatus,
    limit: usize,
) -> Response {
    let next_after = (page.len() > limit)
        .then(|| {
            page.truncate(limit);
            page.last().map(|row| row.key.clone())
        })
        .flatten();
    let rows_bytes: usize = page.iter().map(|row| row.key.len() + row.json.len() + 24).sum();
    let mut body = Vec::with_capacity(rows_bytes + 512);
    body.extend_from_slice(b"{\"view\":");
    text(&mut body, &view);
    body.extend_from_slice(b",\"status\":");
    text(&mut body, status);
    body.extend_from_slice(b",\"keys\":[");
    for (at, row) in page.iter().enumerate() {
        if at > 0 {
            body.push(b',');
        }
        body.extend_from_slice(b"{\"key\":");
        text(&mut body, &row.key.as_str());
        body.extend_from_slice(b",\"rows\":[");
        body.extend_from_slice(&row.json);
        body.extend_from_slice(b"]}");
    }
    body.extend_from_slice(b"],\"next_after\":");
    text(&mut body, &next_after);
    body.push(b'}');
    json_bytes_response(body)
}

/// Appends `value` as JSON to `body`.
fn text(body: &mut Vec<u8>, value: &impl serde::Serialize) {
    serde_json::to_writer(body, value).expect("a view's answer serializes");
}

/// `GET /views/{v}/{key}`: the key's rows (or a subscription to them).
pub async fn get_key(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path((view, key)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let raw = raw.unwrap_or_default();
    let target = Target::View { view: view.clone(), key: Some(key.clone()) };
    if let Some(response) = maybe_subscribe(&state, &principal, target, &raw, &headers, upgrade).await? {
        return Ok(response);
    }
    if !super::query::pairs(&raw)?.is_empty() {
        return Err(ApiError::bad_request("bad_query", "reading one key takes no query parameters"));
    }
    let handle = state.engine.view(&view)?;
    handle.serving()?;
    let rows = handle.rows(&key);
    if rows.is_empty() {
        return Err(ApiError {
            retry_after_s: None,
            hint: None,
            status: StatusCode::NOT_FOUND,
            code: "not_found",
            message: format!("view {view:?} has no rows for key {key:?}"),
        });
    }
    Ok(json_response(json!({ "view": view, "key": key, "rows": rows })))
}

/// `GET /views/{v}`: keys in order with their rows, and the view's status (or a subscription
/// to every key).
pub async fn list_keys(
    State(state): State<AppState>,
    Extension(principal): Extension<onehop_engine::Principal>,
    Path(view): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let raw = raw.unwrap_or_default();
    let target = Target::View { view: view.clone(), key: None };
    if let Some(response) = maybe_subscribe(&state, &principal, target, &raw, &headers, upgrade).await? {
        return Ok(response);
    }
    let handle = state.engine.view(&view)?;
    handle.serving()?;
    let (mut after, mut limit, mut filters) = (None, LIST_LIMIT_DEFAULT, Vec::new());
    for pair in raw.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = super::subscribe::percent_decode(value)
            .ok_or_else(|| ApiError::bad_request("bad_query", format!("{name}: not valid UTF-8")))?;
        match name {
            "after" => after = Some(value),
            super::auth::ACCESS_TOKEN_PARAMETER => {}
            "limit" => {
                limit = value.parse().ok().filter(|limit| (1..=LIST_LIMIT_MAX).contains(limit)).ok_or_else(|| {
                    ApiError::bad_request("bad_query", format!("limit must be 1 to {LIST_LIMIT_MAX}, not {value:?}"))
                })?;
            }
            "" => {}
            column => {
                if filters.len() >= FILTERS_MAX {
                    return Err(ApiError::bad_request("bad_query", format!("at most {FILTERS_MAX} column filters")));
                }
                filters.push((column.to_string(), value));
            }
        }
    }
    if !filters.is_empty() {
        return Ok(json_response(filtered_page(&handle, &view, after, limit, &filters)));
    }
    // One more than asked says whether there is a next page.
    if let Some((page, status)) = handle.page_rows_and_status(after.as_deref(), limit + 1) {
        return Ok(joined_page(&view, page, &status, limit));
    }
    let (mut page, status) = handle.page_and_status(after.as_deref(), limit + 1);
    let next_after = (page.len() > limit).then(|| {
        page.truncate(limit);
        page.last().map(|(key, _)| key.clone())
    });
    let keys: Vec<serde_json::Value> =
        page.into_iter().map(|(key, rows)| json!({ "key": key, "rows": rows })).collect();
    Ok(json_response(json!({
        "view": view,
        "status": status,
        "keys": keys,
        "next_after": next_after.flatten(),
    })))
}

/// Column filters a list read takes at most.
const FILTERS_MAX: usize = 16;

/// `GET /views/{v}?column=value&…`: the keys after `after` with a row whose columns all equal
/// the values (as text: `?n=3` matches the number 3, `?name=Ada` the text), only those rows,
/// at most `limit` keys; looks at [`FILTER_SCAN_KEYS_MAX`] keys at most, and then says where to
/// go on.
fn filtered_page(
    handle: &onehop_engine::view::View,
    view: &str,
    mut after: Option<String>,
    limit: usize,
    filters: &[(String, String)],
) -> serde_json::Value {
    let matches = |row: &serde_json::Value| {
        filters.iter().all(|(column, wanted)| {
            row.get(column).is_some_and(|value| onehop_engine::view::expr::key_text(value) == *wanted)
        })
    };
    let (mut keys, mut scanned, mut next_after) = (Vec::new(), 0usize, None);
    'scan: loop {
        let page = handle.page(after.as_deref(), FILTER_STEP_KEYS);
        let Some((last, _)) = page.last() else { break };
        let last = last.clone();
        for (key, rows) in page {
            scanned += 1;
            let kept: Vec<serde_json::Value> = rows.into_iter().filter(|row| matches(row)).collect();
            if !kept.is_empty() {
                if keys.len() == limit {
                    next_after = after.clone();
                    break 'scan;
                }
                keys.push(json!({ "key": key, "rows": kept }));
            }
            after = Some(key);
            if scanned >= FILTER_SCAN_KEYS_MAX {
                next_after = after.clone();
                break 'scan;
            }
        }
        after = Some(last);
    }
    json!({ "view": view, "status": handle.status(), "keys": keys, "next_after": next_after })
}
