//! Errors as HTTP answers: a status and `{"error":{"code":…,"message":…}}`. Client mistakes
//! are 4xx and logged at debug level; server failures are 5xx and logged as errors.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use onehop_engine::EngineError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, code, message: message.into() }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        let status = match error.code() {
            "unknown_stream" | "unknown_partition" | "unknown_table" | "unknown_index" | "unknown_view"
            | "not_found" => StatusCode::NOT_FOUND,
            "stream_exists" | "table_exists" | "view_exists" | "name_taken" | "in_use" => StatusCode::CONFLICT,
            "precondition_failed" => StatusCode::PRECONDITION_FAILED,
            "record_too_large" | "batch_too_large" => StatusCode::PAYLOAD_TOO_LARGE,
            "offset_before_start" | "offset_past_end" => StatusCode::RANGE_NOT_SATISFIABLE,
            "shutting_down" => StatusCode::SERVICE_UNAVAILABLE,
            "storage_failed" | "internal" => StatusCode::INTERNAL_SERVER_ERROR,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError { status, code: error.code(), message: error.to_string() }
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
        let body = serde_json::json!({ "error": { "code": self.code, "message": self.message } });
        (self.status, Json(body)).into_response()
    }
}
