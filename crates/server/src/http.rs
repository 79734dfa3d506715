//! The HTTP front end. `app` builds the router apart from the listener so tests can drive it.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use onehop_engine::Engine;
use tokio::net::TcpListener;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    /// `None` when no recorder is installed (tests that build several apps in one process).
    pub metrics: Option<PrometheusHandle>,
}

pub fn app(state: AppState) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/metrics", get(metrics)).with_state(state)
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let streams = state.engine.streams().len();
    let partitions = state.engine.log().partitions().len();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "status": "ok", "streams": streams, "partitions": partitions }).to_string(),
    )
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match &state.metrics {
        Some(handle) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics are not enabled in this process\n").into_response(),
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and lets
/// in-flight requests finish.
pub async fn serve_http(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown).await
}
