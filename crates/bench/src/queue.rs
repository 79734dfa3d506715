//! `onehop bench queue`: study 4 (../shared/BENCHMARKS.md), the queue. N messages of S bytes,
//! P producers in a closed loop (each sends its next message once the last is acknowledged), C
//! consumers in one group acknowledging what they took before taking more; through Kafka's
//! protocol against onehop and against a real Kafka (franz-go), and through Redis Streams
//! consumer groups (go-redis: XADD, XREADGROUP, XACK) against redis-server with its AOF
//! fsynced on every write and once a second. The same program (the peers' glue,
//! `onehop-peer-glue queue`) drives every side and keeps the clock; one invocation runs them
//! all, one after another, and writes summary.md, queue-latency.svg and the peers' logs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::plot::{Chart, Series};
use crate::server::ServerProcess;
use crate::target::TargetOptions;
use crate::target::peers::kafka::KafkaTarget;
use crate::target::peers::{installed, system_program, version_of};

pub struct QueueOptions {
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub kafka_brokers: u32,
    pub messages: u64,
    pub bytes: usize,
    pub producers: u32,
    pub consumers: u32,
    /// Which sides run: onehop, onehop-journal, kafka, redis-always, redis-everysec.
    pub targets: Vec<String>,
    pub out: PathBuf,
    pub json: bool,
}

pub const TARGETS: [&str; 5] = ["onehop", "onehop-journal", "kafka", "redis-always", "redis-everysec"];

/// What each side waits for before it acknowledges, for the report.
fn durability(target: &str, kafka_brokers: u32) -> String {
    match target {
        "onehop" => "produce: fdatasync before the ack (acks=all); commits fdatasynced".into(),
        "onehop-journal" => {
            "produce and commits: fdatasync of the shared journal before the ack (--log-journal true)".into()
        }
        "kafka" => format!("produce: acks=all, {kafka_brokers} broker(s), no fsync per write (Kafka's default)"),
        "redis-always" => "XADD: AOF appendfsync always (fsync before the reply)".into(),
        "redis-everysec" => "XADD: AOF appendfsync everysec (Redis's default; a crash may lose 1 s)".into(),
        _ => String::new(),
    }
}

/// A redis-server of our own on a loopback port, stopped (by its PID) when dropped.
struct RedisServer {
    child: Child,
    address: SocketAddr,
    _data: tempfile::TempDir,
}

impl RedisServer {
    fn start(dir: &Path, fsync: &str, logs: &Path) -> anyhow::Result<RedisServer> {
        let program = system_program("redis-server", "redis")?;
        let data = tempfile::Builder::new().prefix("onehop-bench-redis-").tempdir_in(dir)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        std::fs::create_dir_all(logs)?;
        let log = std::fs::File::create(logs.join(format!("redis-{fsync}.log")))?;
        let child = Command::new(program)
            .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", ""])
            .args(["--appendonly", "yes", "--appendfsync", fsync, "--dir"])
            .arg(data.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting redis-server")?;
        let address: SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let server = RedisServer { child, address, _data: data };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !pong(address) {
            if Instant::now() > deadline {
                bail!("redis-server did not answer PING on {address} within 20 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pong(address: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(200)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let mut answer = [0u8; 7];
    stream.write_all(b"PING\r\n").is_ok() && stream.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
}

/// One side's run: the glue's JSON line.
fn run_glue(glue: &Path, system: &str, address: &str, options: &QueueOptions, log: &Path) -> anyhow::Result<Value> {
    let name = crate::client::unique_name("queue");
    let stderr = std::fs::File::create(log)?;
    let output = Command::new(glue)
        .args(["queue", "--system", system, "--address", address, "--name", &name])
        .args(["--messages", &options.messages.to_string(), "--bytes", &options.bytes.to_string()])
        .args(["--producers", &options.producers.to_string(), "--consumers", &options.consumers.to_string()])
        .args(["--partitions", &options.consumers.to_string()])
        .stdin(Stdio::null())
        .stderr(stderr)
        .output()
        .context("running the glue")?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().rev().find(|line| line.starts_with('{'));
    let parsed = line.and_then(|line| serde_json::from_str::<Value>(line).ok());
    match parsed {
        Some(value) if output.status.success() => Ok(value),
        _ => bail!("the queue run against {address} failed ({}); its log: {}", output.status, log.display()),
    }
}

pub fn run(options: &QueueOptions) -> anyhow::Result<()> {
    let glue = installed("bin/onehop-peer-glue", "kafka")?;
    for target in &options.targets {
        if !TARGETS.contains(&target.as_str()) {
            bail!("unknown queue target {target:?}; the targets: {}", TARGETS.join(", "));
        }
    }
    std::fs::create_dir_all(&options.out)?;
    let logs = options.out.join("peer-logs");
    std::fs::create_dir_all(&logs)?;
    let mut results: Vec<(String, Value)> = Vec::new();
    for target in &options.targets {
        eprintln!(
            "bench queue: {target}: {} messages of {} B, {} producers, {} consumers",
            options.messages, options.bytes, options.producers, options.consumers
        );
        let log = logs.join(format!("glue-{target}.log"));
        let result = match target.as_str() {
            "onehop" | "onehop-journal" => {
                let journal = if target == "onehop-journal" { "true" } else { "false" };
                let server = ServerProcess::start(&options.exe, &options.dir, &["--log-journal", journal])?;
                run_glue(&glue, "kafka", &server.kafka, options, &log)?
            }
            "kafka" => {
                let target_options = TargetOptions {
                    url: None,
                    mqtt_address: None,
                    exe: options.exe.clone(),
                    dir: options.dir.clone(),
                    kafka_brokers: options.kafka_brokers,
                    kafka_fsync: false,
                    logs: Some(logs.clone()),
                };
                let kafka = KafkaTarget::start(&target_options)?;
                run_glue(&glue, "kafka", kafka.bootstrap(), options, &log)?
            }
            redis => {
                let fsync = redis.trim_start_matches("redis-");
                let server = RedisServer::start(&options.dir, fsync, &logs)?;
                run_glue(&glue, "redis", &server.address.to_string(), options, &log)?
            }
        };
        eprintln!(
            "bench queue: {target}: {:.0} msg/s, p50 {} ms, p99 {} ms, {} of {} received, {} duplicates",
            result["msg_per_s"].as_f64().unwrap_or(0.0),
            result["p50_ms"],
            result["p99_ms"],
            result["received"],
            options.messages,
            result["duplicates"]
        );
        results.push((target.clone(), result));
    }
    write_report(options, &results)?;
    Ok(())
}

fn write_report(options: &QueueOptions, results: &[(String, Value)]) -> anyhow::Result<()> {
    let glue_version = installed("bin/onehop-peer-glue", "kafka")
        .map(|glue| version_of(&glue, &["version"]))
        .unwrap_or_else(|_| "unknown".into());
    let onehop_rate = results.iter().find(|(target, _)| target == "onehop").and_then(|(_, r)| r["msg_per_s"].as_f64());
    let mut summary = format!(
        "# bench queue\n\nStudy 4: {} messages of {} B, {} producers in a closed loop (each sends once its last message \
         is acknowledged), {} consumers in one group acknowledging each batch before taking more (Kafka: a synchronous \
         offset commit; Redis: XACK). Latency: send to first receipt, on the driving program's clock; the send ack: a \
         producer's wait for its acknowledgement. Client: {glue_version}.\n\n\
         | target | msg/s | p50 ms | p99 ms | max ms | send ack p50 / p99 ms | received | duplicates | onehop ÷ target (msg/s) | the ack waits for |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        options.messages, options.bytes, options.producers, options.consumers
    );
    let mut lines = Vec::new();
    for (target, result) in results {
        let rate = result["msg_per_s"].as_f64().unwrap_or(0.0);
        let ratio = match onehop_rate {
            Some(onehop) if target != "onehop" && rate > 0.0 => format!("{:.2}×", onehop / rate),
            _ => "–".into(),
        };
        summary.push_str(&format!(
            "| {target} | {rate:.0} | {} | {} | {} | {} / {} | {} | {} | {ratio} | {} |\n",
            result["p50_ms"],
            result["p99_ms"],
            result["max_ms"],
            result["ack_p50_ms"],
            result["ack_p99_ms"],
            result["received"],
            result["duplicates"],
            durability(target, options.kafka_brokers)
        ));
        lines.push(json!({
            "bench": "queue", "target": target, "messages": options.messages, "bytes": options.bytes,
            "producers": options.producers, "consumers": options.consumers,
            "msg_per_s": rate, "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"], "max_ms": result["max_ms"],
            "ack_p50_ms": result["ack_p50_ms"], "ack_p99_ms": result["ack_p99_ms"],
            "received": result["received"], "duplicates": result["duplicates"],
            "kafka_brokers": options.kafka_brokers, "durability": durability(target, options.kafka_brokers),
        }));
    }
    summary.push_str(
        "\nPublished (study 4, other hardware): Redis Streams 9 339 msg/s, p50 450 ms, p99 801 ms; Kafka 3 115 msg/s, \
         p50 193 ms, p99 260 ms.\n",
    );
    let chart = Chart {
        title: "Queue study: latency from send to receipt".into(),
        x_label: "percentile".into(),
        y_label: "milliseconds".into(),
        x_log: false,
        x_range: Some((45.0, 105.0)),
        y_log: true,
        series: results
            .iter()
            .map(|(target, result)| Series {
                name: format!("{target} ({:.0} msg/s)", result["msg_per_s"].as_f64().unwrap_or(0.0)),
                points: [(50.0, "p50_ms"), (99.0, "p99_ms"), (100.0, "max_ms")]
                    .iter()
                    .map(|(x, field)| (*x, result[*field].as_f64().unwrap_or(0.0).max(0.001)))
                    .collect(),
            })
            .collect(),
        x_tick_labels: vec![(50.0, "p50".into()), (99.0, "p99".into()), (100.0, "max".into())],
    };
    std::fs::write(options.out.join("queue-latency.svg"), chart.to_svg())?;
    std::fs::write(options.out.join("summary.md"), &summary)?;
    print!("{summary}");
    println!("\nresults: {} (summary.md, queue-latency.svg, peer-logs/)", options.out.display());
    if options.json {
        for line in lines {
            println!("{line}");
        }
    }
    Ok(())
}
