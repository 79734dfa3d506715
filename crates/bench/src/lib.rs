//! onehop's benchmark harness.
//!
//! # Layout
//!
//! - `log`: `onehop bench log` — the fdatasync floor against log appends at several writer
//!   counts in `fsync` and `async` mode.
//! - `notify`: `onehop bench notify` — a durable write over HTTP reaching SSE subscribers.
//! - `mqtt`: `onehop bench mqtt` — MQTT publish → subscribe through the broker, open loop, with
//!   a rate sweep.
//! - `restore`: `onehop bench restore` — views rebuilding their state from the log.
//! - `server`: starting and stopping a `onehop serve` process for a run.
//! - `histogram`: latency histograms (HdrHistogram, nanoseconds) and their percentiles.
//! - `plot`: small self-contained SVG charts for reports.
//!
//! Every benchmark prints a readable table, shows progress on stderr while it runs, and can end
//! with one JSON line for machines (`--json`).

pub mod histogram;
pub mod log;
pub mod mqtt;
pub mod notify;
pub mod plot;
pub mod restore;
pub mod server;
