//! onehop's benchmark harness.
//!
//! # Layout
//!
//! The pieces every end-to-end benchmark shares:
//!
//! - `schedule`: the run's one monotonic clock, the open-loop schedule (intended send times)
//!   and the scheduler thread with its in-flight cap.
//! - `recorder`: per-event send/answer times and observer receipts, recorded without locks.
//! - `plan`: what a workload asks of a target (events, subscriptions, who is owed what),
//!   seeded.
//! - `target`: the `Target` trait and its implementations — `onehop` (a server started as a
//!   separate process, or a running one) and `echo` (the harness's own latency floor).
//! - `client`: onehop's protocols as the workloads use them (HTTP writes and queries, SSE and
//!   WebSocket subscriptions, MQTT), shared by both targets.
//! - `run`: one run — open, drive, drain, stop; `analysis`: its figures and raw rows;
//!   `progress`: the bar per run; `report`: raw.csv, meta.json, summary.md, plots, JSON lines.
//! - `histogram`: latency histograms (HdrHistogram, nanoseconds), merged across runs;
//!   `plot`: small self-contained SVG charts; `server`: starting and stopping `onehop serve`;
//!   `priority`: the harness's threads ask to run ahead of the target's; `fsyncs`: the
//!   target's own fdatasync times over a run, from its `/metrics`; `host`: the CPU the harness
//!   and a started server used during a run, and the machine's CPU and I/O pressure;
//!   `timeline`: a run by 100 ms slice, latency beside what the machine did; `pause`: stalls
//!   made on purpose, a started server stopped and continued at set times.
//!
//! The benchmarks built from them:
//!
//! - `workload`: `onehop bench w1|w2|w3|w4|all` (study 1 of ../shared/BENCHMARKS.md), and
//!   `onehop bench view` (W3 with its own flags).
//! - `notify`: `onehop bench notify` — a durable write over HTTP reaching SSE subscribers.
//! - `mqtt`: `onehop bench mqtt` — MQTT publish → subscribe through the broker, with a sweep.
//! - `log`: `onehop bench log` — the fdatasync floor against log appends.
//! - `restore`: `onehop bench restore` — views rebuilding their state from the log.
//! - `view_join`: `onehop bench view-join` — a five-input joined view's freshness beside a
//!   single-source view's.
//! - `bank`: `onehop bench bank` — study 3, a leader/standby ledger on the replicated log.
//! - `shop`: study 2's shop on onehop — its data, definitions and pages; `onehop bench shop
//!   --load` writes it into a running server. `shop_run`: `onehop bench shop --target …`, its
//!   pages under virtual users against onehop and the microservices stack.
//! - `streams`: `onehop bench streams` — study 5, stream processing against Kafka Streams,
//!   exactly once and at least once.
//!
//! Every benchmark prints a readable table, shows progress on stderr while it runs, and can end
//! with JSON lines for machines (`--json`).

pub mod analysis;
pub mod bank;
pub mod client;
pub mod fsyncs;
pub mod histogram;
pub mod host;
pub mod kafka_perf;
pub mod log;
pub mod mqtt;
pub mod notify;
pub mod pause;
pub mod plan;
pub mod plot;
pub mod priority;
pub mod progress;
pub mod query;
pub mod queue;
pub mod recorder;
pub mod report;
pub mod restore;
pub mod run;
pub mod saturation;
pub mod schedule;
pub mod server;
pub mod shop;
pub mod shop_run;
pub mod shop_writes;
pub mod streams;
pub mod target;
pub mod timeline;
pub mod view_join;
pub mod workload;
