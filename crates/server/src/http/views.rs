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

fn json_response(body: serde_json::Value) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.to_string())
        .into_response()
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
    let (mut after, mut limit) = (None, LIST_LIMIT_DEFAULT);
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
            other => {
                return Err(ApiError::bad_request(
                    "bad_query",
                    format!("{other:?}: listing a view takes after and limit (read one key at /views/{view}/{{key}})"),
                ));
            }
        }
    }
    // One more than asked says whether there is a next page.
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
