//! onehop's protocol front ends. Protocol code never reaches into storage files; it talks to
//! the log (and, as they land, the engine) through their public APIs.
//!
//! # Layout
//!
//! - `http`: the HTTP router (`app`) and its listener (`serve_http`): health and metrics now;
//!   REST, SSE and WebSocket as they land.
//! - `telemetry`: the Prometheus recorder behind `/metrics`.

pub mod http;
pub mod mqtt;
pub mod telemetry;

pub use http::{AppState, app, serve_http};
pub use telemetry::install_metrics;
