//! `onehop bench kafka`: Kafka's own producer benchmark (`ProducerPerformance`, from the
//! `kafka-tools` jar) against onehop's Kafka listener and against a real Kafka, in one
//! invocation: the same tool, the same settings (acks=all, linger 5 ms, a topic of 12
//! partitions created for each run), records of each size, and the ratio. Kafka runs as the
//! harness's `kafka` target starts it (`--kafka-brokers 1|3`); it does not fsync per write,
//! onehop fdatasyncs every batch before answering it: both are said beside the figures.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use serde_json::json;

use crate::plot::{Chart, Series};
use crate::server::ServerProcess;
use crate::target::TargetOptions;
use crate::target::peers::kafka::{KafkaTarget, PARTITIONS};
use crate::target::peers::{installed, system_program};

pub struct KafkaPerfOptions {
    pub exe: PathBuf,
    pub dir: PathBuf,
    /// Brokers of the Kafka side: 1, or 3 (replication 3, min ISR 2).
    pub kafka_brokers: u32,
    /// Records per run.
    pub records: u64,
    /// Record sizes, in bytes.
    pub sizes: Vec<usize>,
    /// Records EndToEndLatency sends, one at a time (0: not run).
    pub latency_records: u64,
    /// Rounds of a consumer group's rebalance (a member joins, then leaves; 0: not run).
    pub rebalance_rounds: u32,
    /// Kafka as it runs by default (no fsync per write), with every write fsynced, or both.
    pub kafka_fsync: KafkaFsync,
    /// Where summary.md, the chart and results.json go.
    pub out: PathBuf,
    pub json: bool,
}

/// Which Kafka runs: as configured by default (the page cache holds an acknowledged write),
/// fsyncing every write (`log.flush.interval.messages=1`, onehop's durability), or both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KafkaFsync {
    Off,
    On,
    Both,
}

impl std::str::FromStr for KafkaFsync {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "off" => Ok(KafkaFsync::Off),
            "on" => Ok(KafkaFsync::On),
            "both" => Ok(KafkaFsync::Both),
            _ => Err(format!("--kafka-fsync is off, on or both, not {text:?}")),
        }
    }
}

/// One run's figures, as ProducerPerformance prints them in its last line.
#[derive(Clone, Debug, PartialEq)]
pub struct Throughput {
    pub records_per_s: f64,
    pub mb_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
}

/// Parses ProducerPerformance's summary line: `N records sent, R records/sec (M MB/sec), A ms
/// avg latency, X ms max latency, P ms 50th, Q ms 95th, S ms 99th, T ms 99.9th.`
pub fn parse_summary(line: &str) -> Option<Throughput> {
    let fields: Vec<&str> = line.trim().trim_end_matches('.').split(", ").collect();
    let number = |field: &str| field.split_whitespace().next()?.parse::<f64>().ok();
    let field = |suffix: &str| fields.iter().find(|field| field.ends_with(suffix)).copied();
    let rate = fields.get(1)?;
    let records_per_s = number(rate)?;
    let mb_per_s = rate.split('(').nth(1)?.split_whitespace().next()?.parse().ok()?;
    Some(Throughput { records_per_s, mb_per_s, p50_ms: number(field("50th")?)?, p99_ms: number(field(" 99th")?)? })
}

/// Creates a topic of a unique name starting with `prefix` with Kafka's TopicCommand; its name.
fn new_topic(
    java: &Path,
    classpath: &str,
    bootstrap: &str,
    prefix: &str,
    partitions: u32,
    replication: u32,
) -> anyhow::Result<String> {
    let topic = crate::client::unique_name(prefix);
    let created = Command::new(java)
        .args(["-cp", classpath, "org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap])
        .args(["--create", "--topic", &topic, "--partitions", &partitions.to_string()])
        .args(["--replication-factor", &replication.to_string()])
        .output()
        .context("running TopicCommand")?;
    if !created.status.success() {
        bail!("creating {topic}: {}", String::from_utf8_lossy(&created.stderr));
    }
    Ok(topic)
}

/// Runs the tool against `bootstrap` on a new topic; its summary.
fn producer_performance(
    java: &Path,
    classpath: &str,
    bootstrap: &str,
    replication: u32,
    size: usize,
    records: u64,
) -> anyhow::Result<Throughput> {
    let topic = new_topic(java, classpath, bootstrap, "perf", PARTITIONS, replication)?;
    let output = Command::new(java)
        .args(["-cp", classpath, "org.apache.kafka.tools.ProducerPerformance", "--topic", &topic])
        .args(["--num-records", &records.to_string(), "--record-size", &size.to_string(), "--throughput", "-1"])
        .args(["--producer-props", &format!("bootstrap.servers={bootstrap}"), "acks=all", "linger.ms=5"])
        .output()
        .context("running ProducerPerformance")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("ProducerPerformance failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    }
    stdout
        .lines()
        .rev()
        .find_map(parse_summary)
        .with_context(|| format!("no summary line in ProducerPerformance's output: {stdout}"))
}

/// EndToEndLatency's figures: its average, and its percentiles (whole milliseconds, as the
/// tool prints them).
#[derive(Clone, Debug, PartialEq)]
pub struct EndToEnd {
    pub avg_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

/// Parses EndToEndLatency's last lines: `Avg latency: 1.2300 ms` and `Percentiles: 50th = 0,
/// 99th = 5, 99.9th = 22`.
pub fn parse_end_to_end(output: &str) -> Option<EndToEnd> {
    let avg_ms = output.lines().find_map(|line| line.strip_prefix("Avg latency: "))?.split_whitespace().next()?;
    let percentiles = output.lines().find_map(|line| line.strip_prefix("Percentiles: "))?;
    let value = |name: &str| -> Option<f64> {
        percentiles.split(", ").find_map(|part| part.strip_prefix(name)?.strip_prefix(" = ")?.trim().parse().ok())
    };
    Some(EndToEnd {
        avg_ms: avg_ms.parse().ok()?,
        p50_ms: value("50th")?,
        p99_ms: value("99th")?,
        p999_ms: value("99.9th")?,
    })
}

/// Kafka's EndToEndLatency against `bootstrap`: one 100-byte record at a time, acks=all, each
/// consumed before the next is sent, on a new topic of one partition.
fn end_to_end(
    java: &Path,
    classpath: &str,
    bootstrap: &str,
    replication: u32,
    records: u64,
) -> anyhow::Result<EndToEnd> {
    let topic = new_topic(java, classpath, bootstrap, "e2e", 1, replication)?;
    let output = Command::new(java)
        .args(["-cp", classpath, "org.apache.kafka.tools.EndToEndLatency", bootstrap, &topic])
        .args([&records.to_string(), "all", "100"])
        .output()
        .context("running EndToEndLatency")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("EndToEndLatency failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    }
    parse_end_to_end(&stdout).with_context(|| format!("no figures in EndToEndLatency's output: {stdout}"))
}

/// The rebalance study's figures (the glue's `rebalance` command): each round's join and leave,
/// in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebalances {
    pub join_ms: Vec<f64>,
    pub leave_ms: Vec<f64>,
}

/// The median and the largest of `values`.
fn median_and_max(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    (median, sorted.last().copied().unwrap_or(0.0))
}

/// A consumer group's rebalances against `bootstrap`, with franz-go's defaults (cooperative-
/// sticky assignor, 3 s heartbeats): a second member joining a first one that holds 12
/// partitions, then leaving, `rounds` times.
fn rebalances(glue: &Path, bootstrap: &str, rounds: u32, log: &Path) -> anyhow::Result<Rebalances> {
    let name = crate::client::unique_name("rebalance");
    let output = Command::new(glue)
        .args(["rebalance", "--address", bootstrap, "--name", &name, "--rounds", &rounds.to_string()])
        .stderr(std::fs::File::create(log)?)
        .output()
        .context("running the glue")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let parsed: Option<serde_json::Value> =
        stdout.lines().rev().find(|line| line.starts_with('{')).and_then(|line| serde_json::from_str(line).ok());
    let Some(parsed) = parsed.filter(|_| output.status.success()) else {
        bail!("the rebalance run against {bootstrap} failed ({}); its log: {}", output.status, log.display());
    };
    let list = |field: &str| -> Vec<f64> {
        parsed[field]
            .as_array()
            .map(|values| values.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default()
    };
    Ok(Rebalances { join_ms: list("join_ms"), leave_ms: list("leave_ms") })
}

pub fn run(options: &KafkaPerfOptions) -> anyhow::Result<()> {
    let lib = installed("kafka/lib", "kafka")?;
    let java = system_program("java", "kafka")?;
    let classpath = format!("{}/*", lib.display());
    std::fs::create_dir_all(&options.out)?;
    eprintln!("bench kafka: starting onehop and Kafka ({} broker(s))", options.kafka_brokers);
    let server = ServerProcess::start(&options.exe, &options.dir, &[])?;
    let start_kafka = |fsync: bool| {
        KafkaTarget::start(&TargetOptions {
            url: None,
            mqtt_address: None,
            exe: options.exe.clone(),
            dir: options.dir.clone(),
            kafka_brokers: options.kafka_brokers,
            kafka_fsync: fsync,
            logs: Some(options.out.join("peer-logs").join(if fsync { "kafka-fsync" } else { "kafka-default" })),
        })
    };
    let plain =
        matches!(options.kafka_fsync, KafkaFsync::Off | KafkaFsync::Both).then(|| start_kafka(false)).transpose()?;
    let synced =
        matches!(options.kafka_fsync, KafkaFsync::On | KafkaFsync::Both).then(|| start_kafka(true)).transpose()?;
    let mut sides: Vec<(&str, String, u32)> = vec![("onehop", server.kafka.clone(), 1)];
    for (name, kafka) in [("kafka", &plain), ("kafka-fsync", &synced)] {
        if let Some(kafka) = kafka {
            sides.push((name, kafka.bootstrap().to_string(), kafka.replication()));
        }
    }
    let replication = sides.last().map_or(1, |side| side.2);
    let mut results = Vec::new();
    for &size in &options.sizes {
        for (name, bootstrap, replication) in &sides {
            eprintln!("bench kafka: ProducerPerformance, {} records of {size} B, against {name}", options.records);
            let figures = producer_performance(&java, &classpath, bootstrap, *replication, size, options.records)?;
            eprintln!(
                "bench kafka: {name} {size} B: {:.0} records/s ({:.1} MB/s), p50 {} ms, p99 {} ms",
                figures.records_per_s, figures.mb_per_s, figures.p50_ms, figures.p99_ms
            );
            results.push((size, *name, figures));
        }
    }
    let mut latencies = Vec::new();
    if options.latency_records > 0 {
        for (name, bootstrap, replication) in &sides {
            eprintln!("bench kafka: EndToEndLatency, {} records of 100 B, against {name}", options.latency_records);
            let figures = end_to_end(&java, &classpath, bootstrap, *replication, options.latency_records)?;
            eprintln!(
                "bench kafka: {name} end to end: avg {} ms, p50 {} ms, p99 {} ms, p99.9 {} ms",
                figures.avg_ms, figures.p50_ms, figures.p99_ms, figures.p999_ms
            );
            latencies.push((*name, figures));
        }
    }
    let mut rebalanced = Vec::new();
    if options.rebalance_rounds > 0 {
        let glue = installed("bin/onehop-peer-glue", "kafka")?;
        for (name, bootstrap, _) in &sides {
            eprintln!(
                "bench kafka: a consumer group's rebalances, {} rounds, against {name}",
                options.rebalance_rounds
            );
            let log = options.out.join("peer-logs").join(format!("glue-rebalance-{name}.log"));
            std::fs::create_dir_all(options.out.join("peer-logs"))?;
            let figures = rebalances(&glue, bootstrap, options.rebalance_rounds, &log)?;
            eprintln!("bench kafka: {name} rebalances: join {:?} ms, leave {:?} ms", figures.join_ms, figures.leave_ms);
            rebalanced.push((*name, figures));
        }
    }
    let mut summary = format!(
        "# bench kafka\n\nProducerPerformance (kafka-tools, acks=all, linger.ms=5, {PARTITIONS} partitions, {} records per run). \
         onehop: one node, every batch fdatasynced before its answer. Kafka: {} broker(s), replication {}; `kafka` as \
         configured by default (no fsync per write: an acknowledged write may be in the page cache only), `kafka-fsync` \
         with every write fsynced (log.flush.interval.messages=1).\n\n\
         | record size | target | records/s | MB/s | p50 ms | p99 ms | onehop ÷ target (records/s) |\n|---|---|---|---|---|---|---|\n",
        options.records, options.kafka_brokers, replication
    );
    let mut lines = Vec::new();
    for &size in &options.sizes {
        let of = |target: &str| results.iter().find(|(s, name, _)| *s == size && *name == target).map(|(_, _, f)| f);
        let Some(onehop) = of("onehop") else { continue };
        for (name, _, _) in &sides {
            let Some(figures) = of(name) else { continue };
            let ratio = if *name == "onehop" {
                "–".into()
            } else {
                format!("{:.2}×", onehop.records_per_s / figures.records_per_s)
            };
            summary.push_str(&format!(
                "| {size} B | {name} | {:.0} | {:.1} | {} | {} | {ratio} |\n",
                figures.records_per_s, figures.mb_per_s, figures.p50_ms, figures.p99_ms
            ));
            lines.push(json!({
                "bench": "kafka", "target": name, "record_bytes": size, "records": options.records,
                "records_per_s": figures.records_per_s, "mb_per_s": figures.mb_per_s,
                "p50_ms": figures.p50_ms, "p99_ms": figures.p99_ms,
                "kafka_brokers": options.kafka_brokers,
            }));
        }
    }
    if !latencies.is_empty() {
        summary.push_str(&format!(
            "\nEndToEndLatency (kafka-tools: one 100 B record at a time, acks=all, consumed before the next is sent, \
             {} records; its percentiles are whole milliseconds):\n\n\
             | target | avg ms | p50 ms | p99 ms | p99.9 ms | onehop ÷ target (avg) |\n|---|---|---|---|---|---|\n",
            options.latency_records
        ));
        let onehop_avg = latencies.iter().find(|(name, _)| *name == "onehop").map(|(_, figures)| figures.avg_ms);
        for (name, figures) in &latencies {
            let ratio = match onehop_avg {
                Some(onehop) if *name != "onehop" && figures.avg_ms > 0.0 => format!("{:.2}×", onehop / figures.avg_ms),
                _ => "–".into(),
            };
            summary.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {ratio} |\n",
                figures.avg_ms, figures.p50_ms, figures.p99_ms, figures.p999_ms
            ));
            lines.push(json!({
                "bench": "kafka-end-to-end", "target": name, "records": options.latency_records,
                "avg_ms": figures.avg_ms, "p50_ms": figures.p50_ms, "p99_ms": figures.p99_ms,
                "p999_ms": figures.p999_ms, "kafka_brokers": options.kafka_brokers,
            }));
        }
    }
    if !rebalanced.is_empty() {
        summary.push_str(&format!(
            "\nConsumer-group rebalance (franz-go defaults: cooperative-sticky assignor, 3 s heartbeats; a second member \
             joins a first holding {PARTITIONS} partitions, then leaves; {} rounds). A member learns of a rebalance at \
             its next heartbeat, so both sides are bounded by the heartbeat interval:\n\n\
             | target | join p50 / max ms | leave p50 / max ms |\n|---|---|---|\n",
            options.rebalance_rounds
        ));
        for (name, figures) in &rebalanced {
            let (join, join_max) = median_and_max(&figures.join_ms);
            let (leave, leave_max) = median_and_max(&figures.leave_ms);
            summary.push_str(&format!("| {name} | {join:.0} / {join_max:.0} | {leave:.0} / {leave_max:.0} |\n"));
            lines.push(json!({
                "bench": "kafka-rebalance", "target": name, "rounds": options.rebalance_rounds,
                "join_ms": figures.join_ms, "leave_ms": figures.leave_ms,
                "join_p50_ms": join, "leave_p50_ms": leave, "kafka_brokers": options.kafka_brokers,
            }));
        }
    }
    let chart = Chart {
        title: "ProducerPerformance, acks=all: records/s by record size".into(),
        x_label: "record size (bytes)".into(),
        y_label: "records/s".into(),
        x_log: true,
        x_range: None,
        y_log: false,
        series: sides
            .iter()
            .map(|(name, _, _)| name)
            .map(|target| Series {
                name: (*target).into(),
                points: results
                    .iter()
                    .filter(|(_, name, _)| name == target)
                    .map(|(size, _, figures)| (*size as f64, figures.records_per_s))
                    .collect(),
            })
            .collect(),
        x_tick_labels: Vec::new(),
    };
    std::fs::write(options.out.join("kafka-throughput.svg"), chart.to_svg())?;
    std::fs::write(options.out.join("summary.md"), &summary)?;
    print!("{summary}");
    println!("\nresults: {} (summary.md, kafka-throughput.svg, peer-logs/)", options.out.display());
    if options.json {
        for line in lines {
            println!("{line}");
        }
    }
    drop((plain, synced));
    drop(server);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_tools_summary_line() {
        let line = "500000 records sent, 325732.9 records/sec (31.06 MB/sec), 34.70 ms avg latency, 292.00 ms max \
                    latency, 33 ms 50th, 69 ms 95th, 78 ms 99th, 87 ms 99.9th.";
        let expected = Throughput { records_per_s: 325732.9, mb_per_s: 31.06, p50_ms: 33.0, p99_ms: 78.0 };
        assert_eq!(parse_summary(line), Some(expected));
        assert_eq!(parse_summary("12 records sent, 2.4 records/sec (0.00 MB/sec), 1.0 ms avg latency"), None);
    }

    #[test]
    fn reads_end_to_end_latencys_figures() {
        let output = "0\t31.2\n1000\t1.02298\nAvg latency: 1.2300 ms\nPercentiles: 50th = 0, 99th = 5, 99.9th = 22\n";
        let expected = EndToEnd { avg_ms: 1.23, p50_ms: 0.0, p99_ms: 5.0, p999_ms: 22.0 };
        assert_eq!(parse_end_to_end(output), Some(expected));
        assert_eq!(parse_end_to_end("Avg latency: 1.2 ms\n"), None);
    }
}
