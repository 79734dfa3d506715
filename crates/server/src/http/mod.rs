//! The HTTP front end. `app` builds the router apart from the listener so tests can drive it.
//!
//! - `streams`: `POST /streams/{s}` publishes, `GET /streams/{s}` reads.
//! - `sse`: subscriptions over Server-Sent Events on the same URLs as reads.
//! - `ws`: subscriptions over WebSocket, several per socket, on the same URLs.
//! - `views`: `GET /views/{v}/{key}` point reads and `GET /views/{v}` listings of views.
//! - `sql`: `POST /sql` runs definitions (`CREATE STREAM`, `SHOW STREAMS`, `DESCRIBE`).
//! - `auth`: who a request is (Basic, Bearer, `access_token`) and whether its route is theirs.
//! - `cors`, `origin`: which other origins' pages may use the server (CORS, WebSocket `Origin`).
//! - `error`: every refusal as `{"error":{"code":…,"message":…}}` with a fitting status.
//! - `query`: query strings decoded strictly (whole escapes, UTF-8; `+` literal in `subject`).
//! - `body`: request bodies read whole, within a size, a memory budget and a read timeout.
//! - `connection`: the listener's connections: timeouts, hyper's own refusals, shutdown.
//! - `limit`: the connection limit.
//! - `files`: static files (`--static-dir`) for the paths no other route takes.

pub mod auth;
pub mod body;
pub mod catalog;
pub mod connection;
pub mod cors;
pub mod error;
pub mod files;
pub mod limit;
pub mod mqtt_ws;
pub mod origin;
pub mod query;
pub mod sql;
pub mod sse;
pub mod streams;
pub mod subscribe;
pub mod tables;
pub mod views;
pub mod ws;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use onehop_engine::Engine;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use connection::HttpConfig;

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
    /// Every request's count and time, by route template, method and status.
    pub request_metrics: Arc<RequestMetrics>,
    /// Origins whose pages may use the server besides its own (CORS and WebSocket `Origin`).
    pub allowed_origins: Arc<origin::AllowedOrigins>,
    /// The bytes of request bodies in memory at once (`body`).
    pub bodies: Arc<body::BodyBudget>,
    /// Longest wait for the next piece of a request body, or for room to read it.
    pub body_read_timeout: Duration,
    /// Tells subscriptions the server is stopping.
    pub shutdown: Shutdown,
    /// On a cluster node: its view of the cluster, served at `/cluster`.
    pub cluster: Option<Arc<dyn ClusterStatus>>,
    /// `--static-dir`: files served for GET and HEAD of the paths no route takes.
    pub files: Option<Arc<files::StaticFiles>>,
}

/// A cluster node's view of its cluster (`GET /cluster`) and its membership changes
/// (`POST /cluster/nodes`, `DELETE /cluster/nodes/{id}`).
pub trait ClusterStatus: Send + Sync {
    /// This node's id, role, term, leader, members and log positions, as JSON.
    fn status(&self) -> serde_json::Value;

    /// Adds or removes a member through the cluster's leader; resolves once it is committed.
    fn change(&self, change: MemberChange) -> Pin<Box<dyn Future<Output = Result<(), ChangeRefused>> + Send + '_>>;
}

/// A change of a cluster's members, as `/cluster/nodes` takes it.
#[derive(Clone, Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewMember {
    pub id: u64,
    pub address: String,
}

/// A membership change asked over HTTP.
#[derive(Clone, Debug)]
pub enum MemberChange {
    Add(NewMember),
    Remove(u64),
}

/// Why a membership change was not made.
#[derive(Clone, Debug)]
pub enum ChangeRefused {
    /// It cannot be made (a member already, not a member, a bad address).
    Invalid(String),
    /// The cluster could not make it now (no leader, the leader unreachable, or its outcome
    /// lost on the way).
    Unavailable(String),
}

/// Request bodies in memory at once unless configured otherwise: four of the largest a default
/// server takes (twice a 16 MiB batch), or thousands of ordinary ones.
pub const BODY_BYTES_IN_FLIGHT_DEFAULT: u64 = 128 << 20;
/// How long a request body may send nothing unless configured otherwise: a pause that long is
/// a client gone, not a slow network.
pub const BODY_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// The server's stop, as long-lived responses see it: once begun, each subscription sends its
/// last event (with the id to resume from) and ends.
#[derive(Clone)]
pub struct Shutdown {
    stopping: Arc<watch::Sender<bool>>,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown { stopping: Arc::new(watch::Sender::new(false)) }
    }
}

impl Shutdown {
    /// Tells every subscription to finish.
    pub fn begin(&self) {
        self.stopping.send_replace(true);
    }

    /// A receiver that turns `true` when the stop begins.
    pub fn receiver(&self) -> watch::Receiver<bool> {
        self.stopping.subscribe()
    }
}

/// Resolves once `shutdown` (a [`Shutdown::receiver`]) has turned true. Cancel-safe.
pub async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // Err only once the sender is gone, which `AppState` holds: then nothing will stop.
    if shutdown.wait_for(|stopping| *stopping).await.is_err() {
        std::future::pending::<()>().await;
    }
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
            request_metrics: Arc::default(),
            allowed_origins: Arc::default(),
            bodies: Arc::new(body::BodyBudget::new(BODY_BYTES_IN_FLIGHT_DEFAULT)),
            body_read_timeout: BODY_READ_TIMEOUT_DEFAULT,
            shutdown: Shutdown::default(),
            cluster: None,
            files: None,
        }
    }
}

/// Counts every request and times it, labelled by the route's template (`/streams/{stream}`,
/// never the concrete path), method and status. For a subscription the time is until the
/// response starts streaming.
async fn record_request(
    State(metrics): State<Arc<RequestMetrics>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let route = request.extensions().get::<axum::extract::MatchedPath>().cloned();
    let method = request.method().clone();
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let route = route.as_ref().map_or("unmatched", |path| path.as_str());
    metrics.record(route, &method, response.status().as_u16(), started.elapsed().as_secs_f64());
    response
}

/// The request metrics' handles, registered once per route template, method and status.
///
/// `counter!` and `histogram!` with labels build the label set, hash it and look it up in the
/// recorder's registry on every call. Kept here, a request costs one map lookup and two atomic
/// updates. A point query on an idle server (`GET /views/{v}/{key}` every 20 ms) spent ~12 µs
/// in the old per-request registration.
///
/// Labels stay bounded: route templates are the router's, statuses three digits, and a method
/// outside the standard nine is labelled `OTHER`.
#[derive(Default)]
pub struct RequestMetrics {
    routes: RwLock<HashMap<String, Vec<RequestHandles>>>,
}

struct RequestHandles {
    method: &'static str,
    status: u16,
    requests: metrics::Counter,
    duration: metrics::Histogram,
}

impl RequestHandles {
    fn record(&self, seconds: f64) {
        self.requests.increment(1);
        self.duration.record(seconds);
    }
}

impl RequestMetrics {
    fn record(&self, route: &str, method: &Method, status: u16, seconds: f64) {
        let method = method_label(method);
        let find = |handles: &[RequestHandles]| {
            handles.iter().position(|handles| handles.method == method && handles.status == status)
        };
        {
            let routes = self.routes.read().expect("request metrics lock");
            if let Some(handles) = routes.get(route)
                && let Some(index) = find(handles)
            {
                handles[index].record(seconds);
                return;
            }
        }
        let mut routes = self.routes.write().expect("request metrics lock");
        let handles = routes.entry(route.to_string()).or_default();
        let index = find(handles).unwrap_or_else(|| {
            let (route, status_label) = (route.to_string(), status.to_string());
            handles.push(RequestHandles {
                requests: metrics::counter!(
                    "http_requests_total", "route" => route.clone(), "method" => method, "status" => status_label
                ),
                duration: metrics::histogram!("http_request_duration_seconds", "route" => route, "method" => method),
                method,
                status,
            });
            handles.len() - 1
        });
        handles[index].record(seconds);
    }
}

/// The method as a label: one of the standard nine, else `OTHER`.
fn method_label(method: &Method) -> &'static str {
    const STANDARD: [&str; 9] = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "CONNECT", "PATCH", "TRACE"];
    STANDARD.into_iter().find(|standard| *standard == method.as_str()).unwrap_or("OTHER")
}

pub fn app(state: AppState) -> Router {
    let body_limit = DefaultBodyLimit::max(state.body_bytes_max);
    let allowed_origins = state.allowed_origins.clone();
    let body_limits = Arc::new(body::Limits {
        bytes_max: state.body_bytes_max,
        budget: state.bodies.clone(),
        read_timeout: state.body_read_timeout,
    });
    let routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/cluster", get(cluster))
        .route("/cluster/nodes", axum::routing::post(add_member))
        .route("/cluster/nodes/{id}", axum::routing::delete(remove_member))
        .route("/streams", get(catalog::streams))
        .route("/streams/{stream}", get(streams::read_or_subscribe).post(streams::publish).delete(catalog::drop_stream))
        .route("/tables", get(catalog::tables))
        .route("/tables/{table}", get(tables::query_rows).delete(catalog::drop_table))
        .route(
            "/tables/{table}/{id}",
            get(tables::get_row).put(tables::put_row).patch(tables::patch_row).delete(tables::delete_row),
        )
        .route("/views", get(catalog::views))
        .route("/views/{view}", get(views::list_keys).delete(catalog::drop_view))
        .route("/views/{view}/{key}", get(views::get_key))
        .route("/sql", axum::routing::post(sql::run))
        .route("/mqtt", get(mqtt_ws::upgrade))
        .route_layer(axum::middleware::from_fn_with_state(body_limits, body::read_body))
        // Before the body is read: a request that may not be made is refused unread.
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), auth::authorize))
        .route_layer(axum::middleware::from_fn_with_state(state.request_metrics.clone(), record_request))
        .fallback(static_file_or_unknown)
        .layer(body_limit)
        .with_state(state);
    // Refusals get their JSON form around the routes, not among them: axum adds a 405's
    // `Allow` header as a request leaves the routes, and the message names those methods.
    // Outermost, CORS: a preflight or another origin's request is answered before any route,
    // and every answer to an allowed origin, refusals in their JSON form included, carries its
    // CORS headers.
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn(error::json_refusals))
        .layer(axum::middleware::from_fn_with_state(allowed_origins, cors::enforce))
}

/// A path no route takes: a static file when `--static-dir` has one there, else
/// `unknown_route`.
async fn static_file_or_unknown(
    State(state): State<AppState>,
    method: Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Some(files) = &state.files
        && let Some(response) = files.serve(&method, &uri, &headers).await
    {
        return response;
    }
    let files = if state.files.is_some() { ", and the files of its --static-dir" } else { "" };
    error::ApiError {
        retry_after_s: None,
        hint: None,
        status: StatusCode::NOT_FOUND,
        code: "unknown_route",
        message: format!(
            "no route for {method} {}: the server serves /streams/{{s}}, /tables/{{t}}, /views/{{v}}, /sql, /mqtt, \
             /healthz, /metrics and /cluster{files}",
            uri.path()
        ),
    }
    .into_response()
}

async fn healthz(State(state): State<AppState>) -> impl IntoResponse {
    let streams = state.engine.streams().len();
    let tables = state.engine.tables().len();
    let partitions = state.engine.partitions_open();
    // Data the catalog lost track of is kept, not served: the operator must see it.
    let orphaned = state.engine.orphans();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::json!({
            "status": "ok", "streams": streams, "tables": tables, "partitions": partitions, "orphaned": orphaned
        })
        .to_string(),
    )
}

async fn cluster(State(state): State<AppState>) -> impl IntoResponse {
    match &state.cluster {
        Some(cluster) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], cluster.status().to_string()).into_response()
        }
        None => not_a_cluster_node().into_response(),
    }
}

fn not_a_cluster_node() -> error::ApiError {
    error::ApiError {
        retry_after_s: None,
        hint: Some("start it with --node-id, --cluster-addr and --peers (docs/cluster.md)".into()),
        status: StatusCode::NOT_FOUND,
        code: "not_a_cluster_node",
        message: "this server runs as a single node".into(),
    }
}

async fn change_members(state: &AppState, change: MemberChange) -> Response {
    let Some(cluster) = &state.cluster else { return not_a_cluster_node().into_response() };
    match cluster.change(change).await {
        Ok(()) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], cluster.status().to_string()).into_response()
        }
        Err(ChangeRefused::Invalid(message)) => error::ApiError {
            retry_after_s: None,
            hint: None,
            status: StatusCode::CONFLICT,
            code: "membership_refused",
            message,
        }
        .into_response(),
        Err(ChangeRefused::Unavailable(message)) => error::ApiError {
            retry_after_s: None,
            hint: Some("retry once the cluster has a leader; GET /cluster shows the members".into()),
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "unconfirmed",
            message,
        }
        .into_response(),
    }
}

async fn add_member(State(state): State<AppState>, body: axum::body::Bytes) -> Response {
    match serde_json::from_slice::<NewMember>(&body) {
        Ok(member) => change_members(&state, MemberChange::Add(member)).await,
        Err(error) => error::ApiError::bad_request(
            "bad_member",
            format!("expected {{\"id\": 4, \"address\": \"10.0.0.4:7004\"}}: {error}"),
        )
        .into_response(),
    }
}

async fn remove_member(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match id.parse::<u64>() {
        Ok(id) => change_members(&state, MemberChange::Remove(id)).await,
        Err(_) => error::ApiError::bad_request("bad_member", format!("{id:?} is not a node id")).into_response(),
    }
}

async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    match &state.metrics {
        Some(handle) => {
            (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], handle.render()).into_response()
        }
        None => error::ApiError {
            retry_after_s: None,
            hint: None,
            status: StatusCode::NOT_FOUND,
            code: "metrics_disabled",
            message: "metrics are not enabled in this process".into(),
        }
        .into_response(),
    }
}

/// Serves `app` on `listener` within `config`'s limits until `shutdown` resolves; then ends
/// subscriptions, lets requests in progress finish, and closes what is left after
/// `config.shutdown_timeout` (see `connection::serve`).
pub async fn serve_http(
    listener: TcpListener,
    state: AppState,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    connection::serve(listener, state, config, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_metrics_count_every_request_under_bounded_labels() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let requests = RequestMetrics::default();
        metrics::with_local_recorder(&recorder, || {
            for _ in 0..3 {
                requests.record("/views/{view}/{key}", &Method::GET, 200, 0.000_3);
            }
            requests.record("/views/{view}/{key}", &Method::GET, 404, 0.000_2);
            requests.record("/streams/{stream}", &Method::POST, 200, 0.001);
            for method in ["FOO", "BAR"] {
                requests.record("/streams/{stream}", &Method::from_bytes(method.as_bytes()).unwrap(), 405, 0.0);
            }
        });
        let text = handle.render();
        for line in [
            r#"http_requests_total{route="/views/{view}/{key}",method="GET",status="200"} 3"#,
            r#"http_requests_total{route="/views/{view}/{key}",method="GET",status="404"} 1"#,
            r#"http_requests_total{route="/streams/{stream}",method="POST",status="200"} 1"#,
            r#"http_requests_total{route="/streams/{stream}",method="OTHER",status="405"} 2"#,
            r#"http_request_duration_seconds_count{route="/views/{view}/{key}",method="GET"} 4"#,
        ] {
            assert!(text.lines().any(|got| got == line), "no {line:?} in\n{text}");
        }
        assert!(!text.contains("FOO") && !text.contains("BAR"), "{text}");
        // One set of handles per route, method and status, however many requests.
        let routes = requests.routes.read().unwrap();
        assert_eq!(routes["/views/{view}/{key}"].len(), 2);
        assert_eq!(routes["/streams/{stream}"].len(), 2);
    }
}
