//! Errors as HTTP answers: a status and `{"error":{"code":…,"message":…}}`. Client mistakes
//! are 4xx and logged at debug level; server failures are 5xx and logged as errors.
//!
//! Refusals axum makes itself (a method a route does not take, a path segment that does not
//! decode) come as plain text or empty; `json_refusals` gives them the same form. hyper's own
//! (a head it cannot parse) are rewritten on the socket (`super::connection`).

use axum::Json;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use onehop_engine::{EngineError, ErrorKind};

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// What the client can do about it, when there is something: sent as `hint`.
    pub hint: Option<String>,
    /// When the client may try again, sent as `Retry-After` (seconds).
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError { retry_after_s: None, hint: None, status: StatusCode::BAD_REQUEST, code, message: message.into() }
    }
}

/// The HTTP status of each kind of engine error. Exhaustive: a new kind does not compile until
/// it has a status.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::PreconditionFailed => StatusCode::PRECONDITION_FAILED,
        ErrorKind::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::OutOfRange => StatusCode::RANGE_NOT_SATISFIABLE,
        ErrorKind::ShuttingDown | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::LimitExceeded => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::StorageFailed | ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        ApiError {
            retry_after_s: error.retry_after_ms().map(|ms| ms.div_ceil(1000)),
            hint: error.hint(),
            status: status_of(error.kind()),
            code: error.code(),
            message: error.message(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        } else {
            tracing::debug!(code = self.code, message = %self.message, "request refused");
        }
        metrics::counter!("http_errors_total", "code" => self.code).increment(1);
        let body = match &self.hint {
            Some(hint) => serde_json::json!({ "error": { "code": self.code, "message": self.message, "hint": hint } }),
            None => serde_json::json!({ "error": { "code": self.code, "message": self.message } }),
        };
        let mut response = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            // A 401 says how to authenticate (RFC 9110, 11.6.1).
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static(super::auth::CHALLENGE));
        }
        if self.code == "limit_exceeded" {
            crate::access::limit_refused("http");
            // A user's rates hold a second's worth: a second later a request that fits is let in.
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        if let Some(seconds) = self.retry_after_s {
            response.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        response
    }
}

/// The most of a plain-text refusal kept as its message.
const REFUSAL_TEXT_BYTES_MAX: usize = 4096;

/// Gives a refusal that is not JSON the JSON form, keeping its status and headers (`Allow`,
/// `Retry-After`) and its text as the message.
pub async fn json_refusals(request: Request, next: Next) -> Response {
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, REFUSAL_TEXT_BYTES_MAX)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    let error = if status == StatusCode::METHOD_NOT_ALLOWED {
        let allowed = parts.headers.get(header::ALLOW).and_then(|value| value.to_str().ok()).unwrap_or("nothing");
        ApiError {
            retry_after_s: None,
            hint: None,
            status,
            code: "method_not_allowed",
            message: format!("{} does not take {method}; it takes {allowed}", uri.path()),
        }
    } else {
        let message = if text.is_empty() { status.canonical_reason().unwrap_or("refused").to_string() } else { text };
        ApiError { retry_after_s: None, hint: None, status, code: code_of(status), message }
    };
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut answer = error.into_response();
    answer.headers_mut().extend(parts.headers);
    answer
}

/// The code of a refusal known only by its status.
fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::REQUEST_TIMEOUT => "request_timeout",
        StatusCode::LENGTH_REQUIRED => "length_required",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UPGRADE_REQUIRED => "upgrade_required",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        status if status.is_server_error() => "internal",
        _ => "bad_request",
    }
}
