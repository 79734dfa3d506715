//! The HTTP front end. `app` builds the router apart from the listener so tests can drive it.
//!
//! - `streams`: `POST /streams/{s}` publishes, `GET /streams/{s}` reads.
//! - `sse`: subscriptions over Server-Sent Events on the same URLs as reads.
//! - `ws`: subscriptions over WebSocket, several per socket, on the same URLs.
//! - `views`: `GET /views/{v}/{key}` point reads and `GET /views/{v}` listings of views.
//! - `sql`: `POST /sql` runs definitions (`CREATE STREAM`, `SHOW STREAMS`, `DESCRIBE`).
//! - `error`: every refusal as `{"error":{"code":…,"message":…}}` with a fitting status.
//! - `time`: RFC 3339 times in query strings.

pub mod error;
pub mod limit;
pub mod mqtt_ws;
pub mod sql;
pub mod sse;
pub mod streams;
pub mod subscribe;
pub mod tables;
pub mod views;
pub mod ws;

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
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
    /// Largest request body accepted; larger ones get 413 before they are read whole.
    pub body_bytes_max: usize,
    /// `None` when no recorder is installed (tests that build several apps in one process).
    pub metrics: Option<PrometheusHandle>,
    /// Subscriptions one WebSocket may hold.
    pub subscriptions_per_socket_max: usize,
    /// The MQTT broker, for MQTT over WebSocket on `/mqtt`; `None` answers 404 there.
    pub mqtt: Option<Arc<crate::mqtt::Broker>>,
}

impl AppState {
    /// The state for `engine`, with a body limit that fits its largest batch: twice
    /// `batch_bytes_max`, since an NDJSON envelope escapes its value as JSON.
    pub fn new(engine: Arc<Engine>, metrics: Option<PrometheusHandle>) -> Self {
        let body_bytes_max = engine.options().stream_defaults.batch_bytes_max.saturating_mul(2);
        AppState {
            engine,
            body_bytes_max,
            metrics,
            subscriptions_per_socket_max: ws::SUBSCRIPTIONS_PER_SOCKET_DEFAULT,
            mqtt: None,
        }
    }
}

/// Counts every request and times it, labelled by the route's template (`/streams/{stream}`,
/// never the concrete path, so labels stay bounded), method and status. For a subscription
/// the time is until the response starts streaming.
async fn record_request(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |path| path.as_str().to_string());
    let method = request.method().as_str().to_string();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    metrics::counter!("http_requests_total", "route" => route.clone(), "method" => method.clone(), "status" => status)
        .increment(1);
    metrics::histogram!("http_request_duration_seconds", "route" => route, "method" => method)
        .record(started.elapsed().as_secs_f64());
    response
}

pub fn app(state: AppState) -> Router {
    let body_limit = DefaultBodyLimit::max(state.body_bytes_max);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/streams/{stream}", get(streams::read_or_subscribe).post(streams::publish))
        .route("/tables/{table}", get(tables::query_rows))
        .route(
            "/tables/{table}/{id}",
            get(tables::get_row).put(tables::put_row).patch(tables::patch_row).delete(tables::delete_row),
        )
        .route("/views/{view}", get(views::list_keys))
        .route("/views/{view}/{key}", get(views::get_key))
        .route("/sql", axum::routing::post(sql::run))
        .route("/mqtt", get(mqtt_ws::upgrade))
        .route_layer(axum::middleware::from_fn(record_request))
        .layer(body_limit)
        .with_state(state)
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let streams = state.engine.streams().len();
    let tables = state.engine.tables().len();
    let partitions = state.engine.log().partitions().len();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({ "status": "ok", "streams": streams, "tables": tables, "partitions": partitions })
            .to_string(),
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

/// Serves `app` on `listener`, at most `connections_max` connections at a time, until
/// `shutdown` resolves, then stops accepting and lets in-flight requests finish.
pub async fn serve_http(
    listener: TcpListener,
    state: AppState,
    connections_max: usize,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = limit::LimitedListener::new(listener, connections_max);
    axum::serve(listener, app(state)).with_graceful_shutdown(shutdown).await
}
