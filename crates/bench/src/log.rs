//! `onehop bench log`: how close log appends come to the disk's own fdatasync floor.
//!
//! Three kinds of figures from one run, all on the same disk (`--dir`):
//! - the floor: a single thread appending one record-sized write and calling fdatasync, in a
//!   loop — what one durable write costs with nothing else in the way;
//! - `fsync` appends: N concurrent writers, each awaiting its own durable acknowledgement before
//!   sending the next record (closed loop), so throughput shows how well group commit shares
//!   one fdatasync among writers;
//! - `async` appends: the same, acknowledged after write(2), fsynced in the background;
//! - reads: the CPU a record costs to read back (page cache warm), in the steps consumers take,
//!   from batches as written at a low rate and after a stall.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use onehop_log::{Durability, NewRecord, Partition, PartitionConfig, ReadAhead};
use serde::Serialize;

use crate::histogram::{latency_histogram, quantile_us, record};
use crate::plot::{Chart, Series};

/// Appends a writer counts before adding them to the shared progress counter.
const PROGRESS_BATCH: u64 = 256;

#[derive(Clone, Debug)]
pub struct LogBenchOptions {
    /// Temporary files go in a fresh directory under this one (must be on the disk to measure).
    pub dir: PathBuf,
    pub record_bytes: usize,
    pub writers: Vec<usize>,
    pub modes: Vec<Durability>,
    pub duration: Duration,
    pub warmup: Duration,
    /// Where to write `log.json` and `log-throughput.svg` / `log-latency.svg`, if anywhere.
    pub out: Option<PathBuf>,
    /// Show progress bars on stderr.
    pub progress: bool,
    /// Also measure the floor with this long idle before each write + fdatasync: what a write
    /// at a low rate (W1, W2) finds the disk doing.
    pub floor_idle: Option<Duration>,
    /// Records written for the read measurements (0: none): reading them back in steps as
    /// consumers do, from batches as a quiet and a busy partition writes them.
    pub read_records: usize,
}

impl Default for LogBenchOptions {
    fn default() -> Self {
        LogBenchOptions {
            dir: PathBuf::from("."),
            record_bytes: 256,
            writers: vec![1, 8, 64, 512],
            modes: vec![Durability::Fsync, Durability::Async],
            duration: Duration::from_secs(3),
            warmup: Duration::from_millis(500),
            out: None,
            progress: true,
            floor_idle: None,
            read_records: 200_000,
        }
    }
}

/// Records per batch of the read measurements: as a partition writes them at a low rate
/// (a few records per fdatasync) and after a stall (a whole burst in one batch).
const READ_BATCH_RECORDS: [usize; 2] = [25, 2_000];
/// Records a read asks for: a live subscriber's step, a subscription catching up, a tailer.
const READ_STEP_RECORDS: [usize; 3] = [25, 256, 1024];
/// Passes over the records per measurement; the fastest is reported (the least disturbed).
const READ_PASSES: usize = 3;
/// Records a read right behind the writer asks for: the hub tailer's step.
const TAIL_STEP_RECORDS: usize = 1024;

/// Reading records back from the log: each `read` on its own, or `read_next` going on from
/// where the last stopped, keeping the rest of the batch it stopped in (what tailers and
/// catching-up subscriptions use).
#[derive(Clone, Debug, Serialize)]
pub struct LogReadResult {
    pub batch_records: usize,
    pub read_records: usize,
    pub read_ns_per_record: f64,
    pub read_next_ns_per_record: f64,
    /// Each batch read as soon as it is written, [`TAIL_STEP_RECORDS`] at a time with
    /// `read_next`, as the hub's tailer reads: from the newest batches the log keeps in
    /// memory. The same for every read step of a batch size.
    pub behind_writer_ns_per_record: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LogBenchResult {
    pub mode: String,
    pub writers: usize,
    pub records_per_s: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub records: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LogBenchReport {
    pub bench: &'static str,
    pub record_bytes: usize,
    pub duration_s: f64,
    pub floor_p50_us: f64,
    pub floor_p99_us: f64,
    pub floor_syncs_per_s: f64,
    /// The same loop overwriting a pre-zeroed, synced file: what a sync costs when the file's
    /// size does not change (the log's runway aims for this).
    pub floor_overwrite_p50_us: f64,
    pub floor_overwrite_p99_us: f64,
    /// The append loop with `floor_idle_ms` of idle before each write, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor_idle_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor_idle_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor_idle_p99_us: Option<f64>,
    pub results: Vec<LogBenchResult>,
    /// Records in each read measurement (0 when not measured).
    pub read_records: usize,
    pub reads: Vec<LogReadResult>,
}

fn progress_bar(enabled: bool, label: &str) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("{prefix:>22} [{elapsed_precise}] {wide_msg}").expect("valid template"));
    bar.set_prefix(label.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Runs every configuration and returns the figures.
pub async fn run(options: &LogBenchOptions) -> anyhow::Result<LogBenchReport> {
    std::fs::create_dir_all(&options.dir).with_context(|| format!("creating {}", options.dir.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix("onehop-bench-log-")
        .tempdir_in(&options.dir)
        .with_context(|| format!("creating a scratch directory in {}", options.dir.display()))?;
    let (floor, overwrite, idle) = {
        let path = scratch.path().join("floor");
        let (record_bytes, duration, warmup) = (options.record_bytes, options.duration, options.warmup);
        let bar = progress_bar(options.progress, "floor write+fdatasync");
        let overwrite_bar = progress_bar(options.progress, "floor overwrite+fdatasync");
        let idle_bar = options.floor_idle.map(|_| progress_bar(options.progress, "floor after idle"));
        let floor_idle = options.floor_idle;
        tokio::task::spawn_blocking(move || {
            let floor = measure_floor(&path, record_bytes, warmup, duration, false, Duration::ZERO, &bar)?;
            let zeroed = path.with_extension("zeroed");
            let overwrite =
                measure_floor(&zeroed, record_bytes, warmup, duration, true, Duration::ZERO, &overwrite_bar)?;
            let idle = match (floor_idle, idle_bar) {
                (Some(idle), Some(bar)) => Some(measure_floor(
                    &path.with_extension("idle"),
                    record_bytes,
                    warmup,
                    duration,
                    false,
                    idle,
                    &bar,
                )?),
                _ => None,
            };
            anyhow::Ok((floor, overwrite, idle))
        })
        .await
        .context("floor thread")??
    };
    let mut results = Vec::new();
    for &mode in &options.modes {
        for &writers in &options.writers {
            let dir = scratch.path().join(format!("{mode}-{writers}"));
            results.push(measure_appends(&dir, mode, writers, options).await?);
        }
    }
    let mut reads = Vec::new();
    if options.read_records > 0 {
        for batch_records in READ_BATCH_RECORDS {
            let dir = scratch.path().join(format!("reads-{batch_records}"));
            reads.extend(measure_reads(&dir, batch_records, options).await?);
        }
    }
    let report = LogBenchReport {
        bench: "log",
        record_bytes: options.record_bytes,
        duration_s: options.duration.as_secs_f64(),
        floor_p50_us: quantile_us(&floor.0, 0.5),
        floor_p99_us: quantile_us(&floor.0, 0.99),
        floor_syncs_per_s: floor.1,
        floor_overwrite_p50_us: quantile_us(&overwrite.0, 0.5),
        floor_overwrite_p99_us: quantile_us(&overwrite.0, 0.99),
        floor_idle_ms: options.floor_idle.map(|idle| idle.as_secs_f64() * 1e3),
        floor_idle_p50_us: idle.as_ref().map(|idle| quantile_us(&idle.0, 0.5)),
        floor_idle_p99_us: idle.as_ref().map(|idle| quantile_us(&idle.0, 0.99)),
        results,
        read_records: if reads.is_empty() { 0 } else { options.read_records },
        reads,
    };
    if let Some(out) = &options.out {
        write_outputs(out, &report)?;
    }
    Ok(report)
}

/// Bytes zeroed ahead for the overwrite floor; the loop wraps around inside them.
const OVERWRITE_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// The floor: write `record_bytes` and fdatasync, one at a time, on one thread. Appending grows
/// the file with every write; `overwrite` writes into a file zeroed and synced beforehand, so
/// the size never changes. `idle` is slept (untimed) before each write.
fn measure_floor(
    path: &Path,
    record_bytes: usize,
    warmup: Duration,
    duration: Duration,
    overwrite: bool,
    idle: Duration,
    bar: &ProgressBar,
) -> anyhow::Result<(Histogram<u64>, f64)> {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new().create(true).read(true).write(true).truncate(true).open(path)?;
    if overwrite {
        let zeros = vec![0u8; 1024 * 1024];
        for chunk in 0..OVERWRITE_FILE_BYTES / zeros.len() as u64 {
            file.write_all_at(&zeros, chunk * zeros.len() as u64)?;
        }
        file.sync_all()?;
    }
    let payload = vec![0x5a_u8; record_bytes];
    let mut position = 0u64;
    let mut histogram = latency_histogram();
    let started = Instant::now();
    let mut measured = 0u64;
    let mut measuring_since = None;
    while started.elapsed() < warmup + duration {
        if !idle.is_zero() {
            std::thread::sleep(idle);
        }
        let before = Instant::now();
        if overwrite && position + record_bytes as u64 > OVERWRITE_FILE_BYTES {
            position = 0;
        }
        file.write_all_at(&payload, position)?;
        position += record_bytes as u64;
        file.sync_data()?;
        let elapsed = before.elapsed();
        if started.elapsed() >= warmup {
            measuring_since.get_or_insert(before);
            record(&mut histogram, elapsed.as_nanos() as u64);
            measured += 1;
            if measured.is_multiple_of(256) || !idle.is_zero() {
                bar.set_message(format!("{measured} syncs, p50 {:.0} µs", quantile_us(&histogram, 0.5)));
            }
        }
    }
    let rate = measured as f64 / measuring_since.map_or(1.0, |since| since.elapsed().as_secs_f64());
    bar.finish_with_message(format!(
        "p50 {:.0} µs, p99 {:.0} µs",
        quantile_us(&histogram, 0.5),
        quantile_us(&histogram, 0.99)
    ));
    Ok((histogram, rate))
}

/// `writers` closed-loop appenders against a fresh partition for warmup + duration.
async fn measure_appends(
    dir: &Path,
    mode: Durability,
    writers: usize,
    options: &LogBenchOptions,
) -> anyhow::Result<LogBenchResult> {
    let config = PartitionConfig { durability: mode, ..PartitionConfig::default() };
    let (partition, _) = Partition::open(dir, config).with_context(|| format!("opening {}", dir.display()))?;
    let partition = Arc::new(partition);
    let value =
        Bytes::from(vec![0x5a_u8; options.record_bytes.saturating_sub(onehop_log::NewRecord::default().encoded_len())]);
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let counted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(writers);
    for _ in 0..writers {
        let (partition, value, measuring, stop, counted) =
            (partition.clone(), value.clone(), measuring.clone(), stop.clone(), counted.clone());
        tasks.push(tokio::spawn(async move {
            let mut histogram = latency_histogram();
            let records = [NewRecord { value: Some(value), ..Default::default() }];
            // Counted locally and published to the shared progress counter now and then: a
            // shared atomic per record would bounce one cache line between the cores on every
            // append and charge the harness's cost to the log.
            let mut unpublished = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let before = Instant::now();
                partition.append(&records).await?;
                if measuring.load(Ordering::Relaxed) {
                    record(&mut histogram, before.elapsed().as_nanos() as u64);
                    unpublished += 1;
                    if unpublished == PROGRESS_BATCH {
                        counted.fetch_add(unpublished, Ordering::Relaxed);
                        unpublished = 0;
                    }
                }
            }
            anyhow::Ok(histogram)
        }));
    }
    let bar = progress_bar(options.progress, &format!("{mode} × {writers} writers"));
    bar.set_message("warming up");
    tokio::time::sleep(options.warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let started = Instant::now();
    while started.elapsed() < options.duration {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let rate = counted.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
        bar.set_message(format!("{rate:.0} records/s"));
    }
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let mut histogram = latency_histogram();
    for task in tasks {
        histogram.add(task.await.context("writer task")??).context("merging histograms")?;
    }
    // Every measured append is one histogram sample.
    let records = histogram.len();
    partition.close();
    drop(partition);
    // Each configuration starts from an empty disk: this one's files go before the next runs.
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    let result = LogBenchResult {
        mode: mode.to_string(),
        writers,
        records_per_s: records as f64 / elapsed,
        p50_us: quantile_us(&histogram, 0.5),
        p99_us: quantile_us(&histogram, 0.99),
        p999_us: quantile_us(&histogram, 0.999),
        max_us: histogram.max() as f64 / 1000.0,
        records,
    };
    bar.finish_with_message(format!(
        "{:.0} records/s, p50 {:.0} µs, p99 {:.0} µs",
        result.records_per_s, result.p50_us, result.p99_us
    ));
    Ok(result)
}

/// Writes `options.read_records` records (`record_bytes` encoded, with a subject and a
/// header, as an MQTT message is stored) in batches of `batch_records`, reading each batch as
/// soon as it is written (a tailer close behind the writer), then reads them all back from the
/// start in steps of each of [`READ_STEP_RECORDS`], with both kinds of read (a consumer
/// catching up: all but the newest of them from the file): CPU per record, the page cache
/// warm.
async fn measure_reads(
    dir: &Path,
    batch_records: usize,
    options: &LogBenchOptions,
) -> anyhow::Result<Vec<LogReadResult>> {
    let config = PartitionConfig { durability: Durability::Async, ..PartitionConfig::default() };
    let (partition, _) = Partition::open(dir, config).with_context(|| format!("opening {}", dir.display()))?;
    let bar = progress_bar(options.progress, &format!("reads, batches of {batch_records}"));
    bar.set_message("writing");
    let mut record = NewRecord {
        subject: Some("bench/reads".into()),
        headers: vec![("onehop-qos".into(), Some(Bytes::from_static(b"1")))],
        ..Default::default()
    };
    // `record_bytes` is the encoded size, as for the appends.
    record.value = Some(Bytes::from(vec![0x5a_u8; options.record_bytes.saturating_sub(record.encoded_len())]));
    let batch = vec![record; batch_records];
    let mut written = 0;
    let (mut behind, mut behind_next, mut behind_read, mut behind_records) =
        (ReadAhead::default(), 0, Duration::ZERO, 0);
    while written < options.read_records {
        let take = batch_records.min(options.read_records - written);
        partition.append(&batch[..take]).await?;
        written += take;
        let started = Instant::now();
        while behind_next < partition.end_offset() {
            let records = partition.read_next(behind_next, TAIL_STEP_RECORDS, usize::MAX, &mut behind)?;
            behind_next = records.last().context("a read before the end returned nothing")?.offset + 1;
            behind_records += records.len();
        }
        behind_read += started.elapsed();
    }
    let end = partition.end_offset();
    anyhow::ensure!(behind_records as u64 == end, "read {behind_records} of {end} records behind the writer");
    let behind_writer_ns_per_record = behind_read.as_nanos() as f64 / behind_records.max(1) as f64;
    let partition = Arc::new(partition);
    let mut results = Vec::new();
    for read_records in READ_STEP_RECORDS {
        let mut best = [f64::MAX; 2];
        for (kind, keep_ahead) in [false, true].into_iter().enumerate() {
            bar.set_message(format!(
                "reading {read_records} at a time, {}",
                if keep_ahead { "read_next" } else { "read" }
            ));
            let partition = partition.clone();
            best[kind] = tokio::task::spawn_blocking(move || {
                let mut best = f64::MAX;
                for _ in 0..READ_PASSES {
                    let started = Instant::now();
                    let (mut next, mut count) = (0, 0);
                    let mut ahead = ReadAhead::default();
                    while next < end {
                        let records = if keep_ahead {
                            partition.read_next(next, read_records, usize::MAX, &mut ahead)?
                        } else {
                            partition.read(next, read_records, usize::MAX)?
                        };
                        let last = records.last().context("a read before the end returned nothing")?;
                        next = last.offset + 1;
                        count += records.len();
                    }
                    anyhow::ensure!(count as u64 == end, "read {count} of {end} records");
                    best = best.min(started.elapsed().as_nanos() as f64 / count as f64);
                }
                anyhow::Ok(best)
            })
            .await
            .context("read thread")??;
        }
        results.push(LogReadResult {
            batch_records,
            read_records,
            read_ns_per_record: best[0],
            read_next_ns_per_record: best[1],
            behind_writer_ns_per_record,
        });
    }
    let steps: Vec<String> = results
        .iter()
        .map(|result| {
            format!(
                "{}: {:.0}/{:.0} ns",
                result.read_records, result.read_ns_per_record, result.read_next_ns_per_record
            )
        })
        .collect();
    bar.finish_with_message(format!("behind the writer {behind_writer_ns_per_record:.0} ns; {}", steps.join(", ")));
    partition.close();
    drop(partition);
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    Ok(results)
}

/// A readable table of the report.
pub fn table(report: &LogBenchReport) -> String {
    let mut text = format!(
        "log append benchmark — {} B records, {:.1} s per configuration\n\n\
         floor (one write + fdatasync at a time): p50 {:.0} µs, p99 {:.0} µs, {:.0} syncs/s\n\
         floor overwriting pre-zeroed blocks:      p50 {:.0} µs, p99 {:.0} µs\n",
        report.record_bytes,
        report.duration_s,
        report.floor_p50_us,
        report.floor_p99_us,
        report.floor_syncs_per_s,
        report.floor_overwrite_p50_us,
        report.floor_overwrite_p99_us
    );
    if let (Some(idle), Some(p50), Some(p99)) =
        (report.floor_idle_ms, report.floor_idle_p50_us, report.floor_idle_p99_us)
    {
        text.push_str(&format!("floor after {idle:.0} ms idle each time:  p50 {p50:.0} µs, p99 {p99:.0} µs\n"));
    }
    text.push('\n');
    text.push_str(&format!(
        "{:<6} {:>7} {:>14} {:>10} {:>10} {:>10} {:>10} {:>12}\n",
        "mode", "writers", "records/s", "p50 µs", "p99 µs", "p99.9 µs", "max µs", "p50/floor"
    ));
    for result in &report.results {
        text.push_str(&format!(
            "{:<6} {:>7} {:>14.0} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>12.2}\n",
            result.mode,
            result.writers,
            result.records_per_s,
            result.p50_us,
            result.p99_us,
            result.p999_us,
            result.max_us,
            result.p50_us / report.floor_p50_us.max(f64::MIN_POSITIVE),
        ));
    }
    if !report.reads.is_empty() {
        text.push_str(&format!(
            "\nreads of {} records ({} B, with a subject and a header), CPU per record, fastest of {READ_PASSES}\n\
             (from the start: a consumer catching up; behind the writer: each batch read as it is written,\n\
             {TAIL_STEP_RECORDS} at a time, as a tailer reads, from the newest batches kept in memory):\n\
             {:>14} {:>12} {:>10} {:>14} {:>20}\n",
            report.read_records,
            report.record_bytes,
            "batch records",
            "read step",
            "read ns",
            "read_next ns",
            "behind writer ns"
        ));
        for read in &report.reads {
            text.push_str(&format!(
                "{:>14} {:>12} {:>10.0} {:>14.0} {:>20.0}\n",
                read.batch_records,
                read.read_records,
                read.read_ns_per_record,
                read.read_next_ns_per_record,
                read.behind_writer_ns_per_record
            ));
        }
    }
    text
}

/// The `--json` line: `{"bench":"log","floor_p50_us":…,"results":[…]}`.
pub fn json_line(report: &LogBenchReport) -> String {
    serde_json::to_string(report).expect("the report serializes")
}

fn write_outputs(out: &Path, report: &LogBenchReport) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("log.json"), json_line(report) + "\n")?;
    std::fs::write(out.join("log.txt"), table(report))?;
    let series = |metric: fn(&LogBenchResult) -> f64| -> Vec<Series> {
        let mut modes: Vec<&str> = report.results.iter().map(|result| result.mode.as_str()).collect();
        modes.dedup();
        modes
            .into_iter()
            .map(|mode| Series {
                name: mode.to_string(),
                points: report
                    .results
                    .iter()
                    .filter(|result| result.mode == mode)
                    .map(|result| (result.writers as f64, metric(result)))
                    .collect(),
            })
            .collect()
    };
    let throughput = Chart {
        title: format!("log appends: records/s ({} B records)", report.record_bytes),
        x_label: "concurrent writers".into(),
        y_label: "records/s".into(),
        x_log: true,
        x_range: None,
        y_log: true,
        series: series(|result| result.records_per_s),
        x_tick_labels: Vec::new(),
    };
    std::fs::write(out.join("log-throughput.svg"), throughput.to_svg())?;
    let mut latency_series = series(|result| result.p99_us);
    for series in &mut latency_series {
        series.name = format!("{} p99", series.name);
    }
    let mut p50 = series(|result| result.p50_us);
    for series in &mut p50 {
        series.name = format!("{} p50", series.name);
    }
    latency_series.extend(p50);
    latency_series.push(Series {
        name: "fdatasync floor p50".into(),
        points: report.results.iter().map(|result| (result.writers as f64, report.floor_p50_us)).collect(),
    });
    let latency = Chart {
        title: "log append latency (µs)".into(),
        x_label: "concurrent writers".into(),
        y_label: "µs".into(),
        x_log: true,
        x_range: None,
        y_log: true,
        series: latency_series,
        x_tick_labels: Vec::new(),
    };
    std::fs::write(out.join("log-latency.svg"), latency.to_svg())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_run_reports_every_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let options = LogBenchOptions {
            dir: dir.path().to_path_buf(),
            writers: vec![1, 4],
            duration: Duration::from_millis(300),
            warmup: Duration::from_millis(50),
            out: Some(out.clone()),
            progress: false,
            floor_idle: Some(Duration::from_millis(20)),
            read_records: 5_000,
            ..LogBenchOptions::default()
        };
        let report = run(&options).await.unwrap();
        assert_eq!(report.results.len(), 4);
        assert!(report.floor_p50_us > 0.0 && report.floor_overwrite_p50_us > 0.0);
        assert_eq!(report.floor_idle_ms, Some(20.0));
        assert!(report.floor_idle_p50_us.is_some_and(|p50| p50 > 0.0), "{report:?}");
        assert!(table(&report).contains("after 20 ms idle"), "{}", table(&report));
        for result in &report.results {
            assert!(result.records > 0, "{result:?}");
            assert!(result.p50_us > 0.0 && result.p99_us >= result.p50_us, "{result:?}");
        }
        let line: serde_json::Value = serde_json::from_str(&json_line(&report)).unwrap();
        assert_eq!(line["bench"], "log");
        assert_eq!(line["results"][2]["mode"], "async");
        assert_eq!(line["results"][1]["writers"], 4);
        // Every batch size read in every step, both ways.
        let reads: Vec<(usize, usize)> =
            report.reads.iter().map(|read| (read.batch_records, read.read_records)).collect();
        assert_eq!(reads, vec![(25, 25), (25, 256), (25, 1024), (2000, 25), (2000, 256), (2000, 1024)]);
        for read in &report.reads {
            assert!(
                read.read_ns_per_record > 0.0
                    && read.read_next_ns_per_record > 0.0
                    && read.behind_writer_ns_per_record > 0.0,
                "{read:?}"
            );
        }
        assert_eq!(line["read_records"], 5_000);
        assert_eq!(line["reads"][5]["batch_records"], 2000);
        assert!(table(&report).contains("read_next ns"), "{}", table(&report));
        for file in ["log.json", "log.txt", "log-throughput.svg", "log-latency.svg"] {
            assert!(out.join(file).exists(), "{file} missing");
        }
        // The scratch directory is removed afterwards.
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("out")]);
    }
}
