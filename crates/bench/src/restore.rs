//! `onehop bench restore`: how fast a view rebuilds its state from the log — what a restart
//! after a crash (replay from the last checkpoint) and a backfill (`start = 'earliest'`) do.
//!
//! In one process, on a fresh data directory: N small JSON events over K keys are appended to
//! one stream (async durability, large batches); then each view below is created with `start =
//! 'earliest'`, so its task replays all N through the same path recovery takes (log read →
//! hub cursor → JSON parse → expression evaluation → state), and the time until it has folded
//! in all N and reports `restoring = false` is taken. Records per second is N over that time.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use onehop_engine::{Engine, EngineOptions};
use onehop_log::{Log, LogOptions, NewRecord};
use serde::Serialize;

/// Records appended per publish while the stream is filled.
const WRITE_BATCH: usize = 10_000;

/// The views replayed, by name: running totals, and the tumbling window of the view benchmark.
const VIEWS: [(&str, &str); 2] = [
    (
        "totals",
        "CREATE VIEW totals WITH (start = 'earliest') AS \
         SELECT k, COUNT(*) AS n, SUM(v) AS total FROM events GROUP BY k",
    ),
    (
        "tumbling_5s",
        "CREATE VIEW tumbling_5s WITH (start = 'earliest', grace = '1s') AS \
         SELECT k, COUNT(*) AS n, SUM(v) AS total FROM TUMBLE(events, INTERVAL '5' SECOND) GROUP BY k",
    ),
];

#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// The data directory is a fresh temporary one under this.
    pub dir: PathBuf,
    pub records: u64,
    pub keys: u64,
    pub progress: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct ViewRestore {
    pub view: String,
    pub seconds: f64,
    pub records_per_s: f64,
    pub keys: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct RestoreReport {
    pub bench: &'static str,
    pub records: u64,
    pub keys: u64,
    pub write_records_per_s: f64,
    pub views: Vec<ViewRestore>,
}

pub async fn run(options: &RestoreOptions) -> anyhow::Result<RestoreReport> {
    if options.records == 0 || options.keys == 0 {
        anyhow::bail!("--records and --keys must be positive");
    }
    std::fs::create_dir_all(&options.dir).with_context(|| format!("creating {}", options.dir.display()))?;
    let data = tempfile::Builder::new().prefix("onehop-bench-restore-").tempdir_in(&options.dir)?;
    let (log, _) = Log::open(data.path(), LogOptions::default()).context("opening the log")?;
    let engine = Arc::new(Engine::open(Arc::new(log), EngineOptions::default()).context("opening the engine")?);
    let result = measure(&engine, options).await;
    engine.stop_derived().await;
    engine.log().close();
    result
}

async fn measure(engine: &Arc<Engine>, options: &RestoreOptions) -> anyhow::Result<RestoreReport> {
    sql(engine, "CREATE STREAM events WITH (durability = 'async')").await?;
    let stream = engine.stream("events")?;
    let writing = bar(options.progress, options.records, "writing");
    let started = Instant::now();
    let mut written = 0u64;
    while written < options.records {
        let count = (options.records - written).min(WRITE_BATCH as u64);
        let records: Vec<NewRecord> = (written..written + count)
            .map(|i| {
                // Spread the keys, so consecutive records touch different ones.
                let key = i.wrapping_mul(2_654_435_761) % options.keys;
                NewRecord::value(format!(r#"{{"k":"key-{key}","v":{}}}"#, i % 100).into_bytes())
            })
            .collect();
        stream.publish(&records, None).await?;
        written += count;
        writing.set_position(written);
    }
    let write_rate = written as f64 / started.elapsed().as_secs_f64();
    writing.finish_and_clear();

    let mut views = Vec::new();
    for (name, definition) in VIEWS {
        let replaying = bar(options.progress, options.records, name);
        let started = Instant::now();
        sql(engine, definition).await?;
        let view = engine.view(name)?;
        loop {
            let status = view.status();
            replaying.set_position(status.events);
            if !status.restoring && status.events >= options.records {
                break;
            }
            if started.elapsed() > Duration::from_secs(600) {
                anyhow::bail!("view {name} did not restore within 10 minutes ({} events)", status.events);
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let seconds = started.elapsed().as_secs_f64();
        replaying.finish_and_clear();
        views.push(ViewRestore {
            view: name.to_string(),
            seconds,
            records_per_s: options.records as f64 / seconds,
            keys: view.status().keys,
        });
        sql(engine, &format!("DROP VIEW {name}")).await?;
    }
    Ok(RestoreReport {
        bench: "restore",
        records: options.records,
        keys: options.keys,
        write_records_per_s: write_rate,
        views,
    })
}

async fn sql(engine: &Engine, text: &str) -> anyhow::Result<()> {
    for statement in onehop_sql::parse(text)? {
        onehop_sql::execute(engine, &statement).await?;
    }
    Ok(())
}

fn bar(progress: bool, total: u64, phase: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} ({per_sec})")
            .expect("a valid template"),
    );
    bar.set_prefix(phase.to_string());
    bar
}

pub fn table(report: &RestoreReport) -> String {
    let mut text = format!(
        "view restoration — {} records over {} keys, replayed from the log\n\n\
         view          seconds   records/s   keys\n",
        report.records, report.keys
    );
    for view in &report.views {
        text += &format!("{:<12} {:>8.3} {:>11.0} {:>6}\n", view.view, view.seconds, view.records_per_s, view.keys);
    }
    text += &format!("\n(filling the stream: {:.0} records/s)", report.write_records_per_s);
    text
}

pub fn json_line(report: &RestoreReport) -> String {
    serde_json::to_string(report).expect("the report serializes")
}
