//! What an invocation leaves behind: per run `raw.csv` and `meta.json`, per invocation a
//! `summary.md` and SVG plots, and the lines printed at the end.
//!
//! - `context`: what every report carries: the machine, the build, the command; times and run ids.
//! - `run`: what one run leaves: `raw.csv`, `meta.json`, and its line on stderr.
//! - `tables`: the side-by-side tables of an invocation, with what they show in words.
//! - `summary`: `summary.md` and its plots.
//! - `lines`: the lines printed at the end (`--json`, and `onehop bench view`'s table).

mod context;
mod lines;
mod run;
mod summary;
mod tables;

pub use context::{Context, rfc3339, run_id};
pub use lines::{JsonLine, ViewLine, json_line, view_line, view_table};
pub use run::{RawWriter, RunMeta, run_line, write_meta};
pub use summary::write_summary;
pub use tables::tables;
