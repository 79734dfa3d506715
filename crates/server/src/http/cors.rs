//! CORS and the `Origin` check: one middleware in front of every route, following
//! [`AllowedOrigins`].
//!
//! A browser names the page's origin in `Origin` on every cross-origin request and on every
//! WebSocket handshake; other clients (curl, native MQTT and HTTP libraries) send none, or
//! the server's own, and are let through. For a request with an `Origin`:
//!
//! - an allowed origin gets `Access-Control-Allow-Origin` (its own origin, echoed) and the
//!   response headers a client reads (`ETag`) exposed; its preflights (`OPTIONS` with
//!   `Access-Control-Request-Method`) are answered 204 with the methods and headers the API
//!   uses, cached by the browser for [`PREFLIGHT_MAX_AGE_S`];
//! - the server's own origin (the request's `Host`) is served as is;
//! - any other origin is refused with 403 `origin_not_allowed` before any handler runs: no
//!   WebSocket is opened for it, and a simple request the browser sends without asking (a
//!   text/plain `POST`) writes nothing.
//!
//! No credentials: onehop sets no cookies, so `Access-Control-Allow-Credentials` is never sent.
//! While other origins are allowed, every response says `Vary: Origin`, so a shared cache never
//! gives one origin's answer to another.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::origin::AllowedOrigins;

/// The methods of the API, all of which an allowed origin may use.
const ALLOWED_METHODS: [Method; 6] =
    [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];
/// The request headers the API reads, lower case: the body's type, conditional writes, an SSE
/// resume, the per-write durability, a write's idempotency key. (`Accept` is listed for values
/// a browser would otherwise ask about.)
const ALLOWED_HEADERS: [&str; 8] = [
    "accept",
    // A page sends its user's token as a Bearer header.
    "authorization",
    "content-type",
    "if-match",
    "if-none-match",
    "last-event-id",
    super::streams::DURABILITY_HEADER,
    super::streams::IDEMPOTENCY_KEY_HEADER,
];
/// The response headers a page may read beyond the ones always readable: a row's version, and
/// whether a keyed write's answer is a replay.
const EXPOSED_HEADERS: &str = "etag, idempotent-replayed";
/// How long a browser may reuse a preflight's answer for one URL and method: an hour saves a
/// round trip on each write after the first (Chromium caps it at two hours, Firefox at a day).
pub const PREFLIGHT_MAX_AGE_S: u32 = 3600;

/// Private Network Access: a page on a public address asks before calling a private one.
const REQUEST_PRIVATE_NETWORK: &str = "access-control-request-private-network";
const ALLOW_PRIVATE_NETWORK: &str = "access-control-allow-private-network";

/// The middleware: answers preflights, refuses other origins, and marks allowed ones' answers.
pub async fn enforce(State(allowed): State<Arc<AllowedOrigins>>, request: Request, next: Next) -> Response {
    let Some(origin) = request.headers().get(header::ORIGIN).cloned() else {
        let mut response = next.run(request).await;
        vary(&allowed, response.headers_mut());
        return response;
    };
    // An `Origin` that is not text is no origin a browser sends.
    let origin_text = origin.to_str().unwrap_or("");
    if is_preflight(&request) {
        let mut response = preflight(&allowed, &origin, request.headers());
        vary(&allowed, response.headers_mut());
        return response;
    }
    if !allowed.admits(origin_text, request_host(&request)) {
        let mut response = refuse_origin(origin_text);
        vary(&allowed, response.headers_mut());
        return response;
    }
    let cross_origin = allowed.allows(origin_text);
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if cross_origin {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        headers.insert(header::ACCESS_CONTROL_EXPOSE_HEADERS, HeaderValue::from_static(EXPOSED_HEADERS));
    }
    vary(&allowed, headers);
    response
}

/// The host the request was sent to: `Host` in HTTP/1.1, the URI's authority in HTTP/2.
fn request_host(request: &Request) -> Option<&str> {
    match request.headers().get(header::HOST) {
        Some(host) => host.to_str().ok(),
        None => request.uri().authority().map(|authority| authority.as_str()),
    }
}

fn is_preflight(request: &Request) -> bool {
    request.method() == Method::OPTIONS && request.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
}

/// The answer to a preflight: 204 with what may be sent, or 403 naming what may not.
fn preflight(allowed: &AllowedOrigins, origin: &HeaderValue, headers: &HeaderMap) -> Response {
    let origin_text = origin.to_str().unwrap_or("");
    if !allowed.allows(origin_text) {
        return refuse_origin(origin_text);
    }
    let method = headers.get(header::ACCESS_CONTROL_REQUEST_METHOD).and_then(|value| value.to_str().ok());
    if !method.is_some_and(|method| ALLOWED_METHODS.iter().any(|allowed| allowed.as_str() == method)) {
        let method = method.unwrap_or("(not text)");
        return refuse_preflight(format!(
            "method {method} is not allowed from another origin; allowed: {}",
            method_list()
        ));
    }
    for requested in requested_headers(headers) {
        if !ALLOWED_HEADERS.iter().any(|allowed| allowed.eq_ignore_ascii_case(&requested)) {
            return refuse_preflight(format!(
                "request header {requested} is not allowed from another origin; allowed: {}",
                ALLOWED_HEADERS.join(", ")
            ));
        }
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    let answer = response.headers_mut();
    answer.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
    answer.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_str(&method_list()).expect("method names"));
    answer.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_str(&ALLOWED_HEADERS.join(", ")).expect("header names"),
    );
    answer.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(PREFLIGHT_MAX_AGE_S));
    // A page on a public address may reach this server on a private one only when it says so.
    if headers.get(REQUEST_PRIVATE_NETWORK).is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"true")) {
        answer.insert(HeaderName::from_static(ALLOW_PRIVATE_NETWORK), HeaderValue::from_static("true"));
    }
    // The answer depends on what was asked, not only on the origin.
    answer.append(header::VARY, HeaderValue::from_static("access-control-request-method"));
    answer.append(header::VARY, HeaderValue::from_static("access-control-request-headers"));
    response
}

/// The names in `Access-Control-Request-Headers` (comma-separated, on one line or several), as
/// the browser wrote them, so that a refusal names the header as the page asked for it.
fn requested_headers(headers: &HeaderMap) -> Vec<String> {
    headers
        .get_all(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .iter()
        .flat_map(|value| {
            String::from_utf8_lossy(value.as_bytes()).split(',').map(str::trim).map(String::from).collect::<Vec<_>>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

fn method_list() -> String {
    ALLOWED_METHODS.iter().map(Method::as_str).collect::<Vec<_>>().join(", ")
}

fn refuse_origin(origin: &str) -> Response {
    ApiError {
        retry_after_s: None,
        hint: None,
        status: StatusCode::FORBIDDEN,
        code: "origin_not_allowed",
        message: format!(
            "pages from origin {origin:?} may not use this server: add the origin to allowed_origins \
             (--allowed-origins) to allow it"
        ),
    }
    .into_response()
}

fn refuse_preflight(message: String) -> Response {
    ApiError { retry_after_s: None, hint: None, status: StatusCode::FORBIDDEN, code: "preflight_refused", message }
        .into_response()
}

/// `Vary: Origin` on every answer while other origins are allowed: the same URL is answered
/// differently (or refused) by origin.
fn vary(allowed: &AllowedOrigins, headers: &mut HeaderMap) {
    if !allowed.is_none() {
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowed_lists_are_valid_header_values() {
        assert_eq!(method_list(), "GET, HEAD, POST, PUT, PATCH, DELETE");
        assert!(HeaderValue::from_str(&ALLOWED_HEADERS.join(", ")).is_ok());
        assert!(ALLOWED_HEADERS.iter().all(|name| HeaderName::from_static(name).as_str() == *name));
    }

    #[test]
    fn requested_headers_are_split_on_commas_across_lines() {
        let mut headers = HeaderMap::new();
        headers.append(header::ACCESS_CONTROL_REQUEST_HEADERS, HeaderValue::from_static("content-type, If-Match"));
        headers.append(header::ACCESS_CONTROL_REQUEST_HEADERS, HeaderValue::from_static(" ,last-event-id"));
        assert_eq!(requested_headers(&headers), ["content-type", "If-Match", "last-event-id"]);
    }
}
