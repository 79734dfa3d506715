//! onehop's protocol front ends. Protocol code never reaches into storage files; it talks to
//! the engine and the log through their public APIs.
//!
//! # Layout
//!
//! - `http`: the HTTP router (`app`) and its listener (`serve_http`, with the connection
//!   limit): health, metrics, SQL, streams and tables over REST, subscriptions over SSE and
//!   WebSocket, and MQTT over WebSocket on `/mqtt`.
//! - `mqtt`: the MQTT 3.1.1/5.0 broker (`serve_mqtt` over TCP, `Broker::serve_stream` for any
//!   byte stream), with retained messages and persistent sessions in system topics.
//! - `kafka`: the Kafka wire protocol, broker side (`serve_kafka`): topics are streams.
//! - `access`: what every listener does about logins (failures counted and logged at a bounded
//!   rate); the decisions are the engine's.
//! - `accept`: the accept loop of the TCP listeners, with the connection limit.
//! - `linger`: how both listeners close a TCP connection (write side first, then reading what
//!   the client still sends), so a refusal reaches a client that is still sending.
//! - `tls`: rustls for the listeners, the certificate read again on SIGHUP.
//! - `telemetry`: the Prometheus recorder behind `/metrics`.

mod accept;
pub mod access;
pub mod http;
pub mod kafka;
mod linger;
pub mod mqtt;
pub mod pg;
pub mod telemetry;
pub mod tls;

pub use http::{AppState, HttpConfig, app, serve_http};
pub use telemetry::install_metrics;
