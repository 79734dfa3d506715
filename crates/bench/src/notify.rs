//! `onehop bench notify`: a durable write reaching its subscribers, measured end to end.
//!
//! N subscribers hold SSE subscriptions, each to one of K subjects; a publisher writes over
//! HTTP at a fixed rate (open loop: every write has an intended send time on a schedule, and
//! latency counts from that time, so a stalled server cannot hide queueing), each write to one
//! subject, so it matches N/K subscribers. Latency is from the intended send to a subscriber
//! receiving the record. The publisher, the subscribers and their clock share one process; the
//! server is another process.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use tokio::sync::mpsc;

use crate::histogram::{latency_histogram, quantile_us, record};
use crate::server::ServerProcess;

/// How subscribers connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Sse,
    Ws,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "sse" => Ok(Protocol::Sse),
            "ws" | "websocket" => Ok(Protocol::Ws),
            other => Err(format!("unknown protocol {other:?}: expected sse or ws")),
        }
    }
}

#[derive(Clone, Debug)]
pub struct NotifyOptions {
    /// A running server; `None` starts one (`exe serve`) on a temporary data directory.
    pub url: Option<String>,
    pub exe: PathBuf,
    /// Where a started server keeps its data.
    pub dir: PathBuf,
    pub subscribers: usize,
    pub subjects: usize,
    pub rate: f64,
    pub duration: Duration,
    pub warmup: Duration,
    /// `fsync` or `async` for the writes.
    pub durability: String,
    /// Writes that may be awaiting their answer at once; past it a write counts as an error.
    pub in_flight_max: u64,
    /// How subscribers connect: `sse` or `ws`.
    pub protocol: Protocol,
    pub progress: bool,
}

impl Default for NotifyOptions {
    fn default() -> Self {
        NotifyOptions {
            url: None,
            exe: PathBuf::from("onehop"),
            dir: PathBuf::from("."),
            subscribers: 100,
            subjects: 20,
            rate: 1000.0,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            durability: "fsync".into(),
            in_flight_max: 10_000,
            protocol: Protocol::Sse,
            progress: true,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct NotifyReport {
    pub bench: &'static str,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub delivered_pct: f64,
    pub subscribers: usize,
    pub subjects: usize,
    pub rate: f64,
    pub protocol: Protocol,
    pub durability: String,
    /// Writes in the measured window, and how many were acknowledged.
    pub writes: u64,
    pub writes_acked: u64,
    pub write_errors: u64,
    pub deliveries_expected: u64,
    pub deliveries: u64,
    /// Intended send to the write's HTTP answer (durable), for comparison.
    pub ack_p50_us: f64,
    pub ack_p99_us: f64,
    /// Resident memory of the server at the end of the measured window, when this run started
    /// the server (its process is known); `None` with `--url`.
    pub server_rss_mb: Option<f64>,
}

/// Resident set size of process `pid`, in MiB, from /proc.
pub(crate) fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Lets the publisher thread's sleeps end within microseconds of the intended time instead of
/// the default 50 µs timer slack.
pub(crate) fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}

struct Shared {
    base: Instant,
    warmup_ns: u64,
    end_ns: u64,
    acked: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicU64,
    delivered: AtomicU64,
}

impl Shared {
    fn measured(&self, intended_ns: u64) -> bool {
        intended_ns >= self.warmup_ns && intended_ns < self.end_ns
    }

    /// A subscriber received the record meant to be sent at `intended_ns`.
    fn note_receipt(&self, latency: &std::sync::Mutex<Histogram<u64>>, intended_ns: u64, received_ns: u64) {
        if self.measured(intended_ns) {
            record(&mut latency.lock().expect("latency histogram"), received_ns.saturating_sub(intended_ns));
            self.delivered.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Runs the benchmark and returns its figures.
pub async fn run(options: &NotifyOptions) -> anyhow::Result<NotifyReport> {
    if options.subjects == 0 || options.subscribers == 0 || options.rate.is_nan() || options.rate <= 0.0 {
        bail!("subscribers, subjects and rate must be positive");
    }
    let server = match &options.url {
        Some(_) => None,
        None => Some(ServerProcess::start(&options.exe, &options.dir, &[])?),
    };
    let url = options.url.clone().or_else(|| server.as_ref().map(|server| server.url.clone())).expect("a url");
    // The publisher has its own client (connection pool); thousands of streaming subscriber
    // connections in the same pool would sit in the way of its requests.
    let client = reqwest::Client::builder().pool_max_idle_per_host(64).build()?;
    let subscriber_client = reqwest::Client::new();
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_millis());
    let stream = format!("bench_notify_{}_{nonce}", std::process::id());
    let create = format!("CREATE STREAM {stream} WITH (partitions = 1, durability = '{}')", options.durability);
    let response = client.post(format!("{url}/sql")).body(create).send().await.context("reaching the server")?;
    if !response.status().is_success() {
        bail!("creating the stream failed: {}", response.text().await.unwrap_or_default());
    }
    let shared = Arc::new(Shared {
        base: Instant::now(),
        warmup_ns: options.warmup.as_nanos() as u64,
        end_ns: (options.warmup + options.duration).as_nanos() as u64,
        acked: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        in_flight: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
    });

    let (stop_sender, stop_receiver) = tokio::sync::watch::channel(false);
    // One histogram for all subscribers: one each (~400 KB) would make thousands of
    // subscribers cost gigabytes of page faults in the harness, not the server.
    let latency = Arc::new(std::sync::Mutex::new(latency_histogram()));
    // Subscribers, each on its own connection.
    let mut subscribers = Vec::with_capacity(options.subscribers);
    for index in 0..options.subscribers {
        let subject = format!("bench/{}", index % options.subjects);
        let task = match options.protocol {
            Protocol::Sse => {
                let request = subscriber_client
                    .get(format!("{url}/streams/{stream}"))
                    .query(&[("subject", subject.as_str()), ("from", "earliest")])
                    .header("accept", "text/event-stream");
                let response = request.send().await.context("subscribing")?;
                if !response.status().is_success() {
                    bail!("subscribing failed: {}", response.text().await.unwrap_or_default());
                }
                tokio::spawn(sse_subscriber(response, shared.clone(), latency.clone(), stop_receiver.clone()))
            }
            Protocol::Ws => {
                let address = url.trim_start_matches("http://");
                let subject = subject.replace('/', "%2F");
                let ws_url = format!("ws://{address}/streams/{stream}?subject={subject}&from=earliest");
                // Small buffers: the defaults (128 KiB each way) would cost the harness gigabytes
                // at 10 000 subscribers.
                let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
                    .read_buffer_size(4096)
                    .write_buffer_size(0);
                let (socket, _) = tokio_tungstenite::connect_async_with_config(ws_url, Some(config), false)
                    .await
                    .context("subscribing over WebSocket")?;
                tokio::spawn(ws_subscriber(socket, shared.clone(), latency.clone(), stop_receiver.clone()))
            }
        };
        subscribers.push(task);
    }

    // The publisher: a thread that sleeps precisely to each intended time and hands the write
    // to the runtime.
    let total = ((options.warmup + options.duration).as_secs_f64() * options.rate) as u64;
    let interval_ns = 1e9 / options.rate;
    let (sender, mut schedule) = mpsc::unbounded_channel::<(u64, u64)>();
    let publisher = {
        let shared = shared.clone();
        std::thread::Builder::new().name("bench-publisher".into()).spawn(move || {
            tighten_timer_slack();
            for seq in 0..total {
                let intended_ns = (seq as f64 * interval_ns) as u64;
                let now_ns = shared.base.elapsed().as_nanos() as u64;
                if intended_ns > now_ns {
                    std::thread::sleep(Duration::from_nanos(intended_ns - now_ns));
                }
                if sender.send((seq, intended_ns)).is_err() {
                    break;
                }
            }
        })?
    };
    let ack_histogram = Arc::new(std::sync::Mutex::new(latency_histogram()));
    let bar = if options.progress { ProgressBar::new(total) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template(
        "{prefix:>10} [{elapsed_precise}] {bar:30} {pos}/{len} writes {wide_msg}",
    )?);
    bar.set_prefix("notify");
    let subjects = options.subjects as u64;
    let in_flight_max = options.in_flight_max;
    while let Some((seq, intended_ns)) = schedule.recv().await {
        bar.set_position(seq + 1);
        if seq % 500 == 0 {
            let phase = if intended_ns < shared.warmup_ns { "warm-up" } else { "measuring" };
            bar.set_message(format!(
                "{phase}, in flight {}, delivered {}",
                shared.in_flight.load(Ordering::Relaxed),
                shared.delivered.load(Ordering::Relaxed)
            ));
        }
        if shared.in_flight.load(Ordering::Relaxed) >= in_flight_max {
            if shared.measured(intended_ns) {
                shared.errors.fetch_add(1, Ordering::Relaxed);
            }
            continue;
        }
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let (client, shared, ack_histogram) = (client.clone(), shared.clone(), ack_histogram.clone());
        let url = format!("{url}/streams/{stream}?subject=bench/{}", seq % subjects);
        tokio::spawn(async move {
            let body = format!("{{\"seq\":{seq},\"intended_ns\":{intended_ns}}}");
            let ok = matches!(client.post(url).body(body).send().await, Ok(response) if response.status().is_success());
            let done_ns = shared.base.elapsed().as_nanos() as u64;
            shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            if shared.measured(intended_ns) {
                if ok {
                    shared.acked.fetch_add(1, Ordering::Relaxed);
                    record(&mut ack_histogram.lock().expect("ack histogram"), done_ns.saturating_sub(intended_ns));
                } else {
                    shared.errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    publisher.join().map_err(|_| anyhow::anyhow!("the publisher thread panicked"))?;
    // Let the last writes be answered and delivered.
    let grace = Instant::now();
    while shared.in_flight.load(Ordering::Relaxed) > 0 && grace.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let server_rss_mb = server.as_ref().and_then(|server| rss_mb(server.pid()));
    let _ = stop_sender.send(true);
    bar.finish_and_clear();
    for subscriber in subscribers {
        subscriber.await.context("a subscriber task")?;
    }
    let latency = latency.lock().expect("latency histogram").clone();
    drop(server);
    let writes = ((options.duration.as_secs_f64()) * options.rate) as u64;
    let acked = shared.acked.load(Ordering::Relaxed);
    let per_subject: Vec<u64> = (0..subjects)
        .map(|subject| (0..options.subscribers as u64).filter(|index| index % subjects == subject).count() as u64)
        .collect();
    let expected: u64 = (0..total)
        .filter(|seq| shared.measured((*seq as f64 * interval_ns) as u64))
        .map(|seq| per_subject[(seq % subjects) as usize])
        .sum();
    let deliveries = latency.len();
    let ack = ack_histogram.lock().expect("ack histogram");
    Ok(NotifyReport {
        bench: "notify",
        p50_us: quantile_us(&latency, 0.5),
        p90_us: quantile_us(&latency, 0.9),
        p99_us: quantile_us(&latency, 0.99),
        p999_us: quantile_us(&latency, 0.999),
        max_us: latency.max() as f64 / 1000.0,
        delivered_pct: if expected == 0 { 0.0 } else { deliveries as f64 * 100.0 / expected as f64 },
        subscribers: options.subscribers,
        subjects: options.subjects,
        rate: options.rate,
        protocol: options.protocol,
        durability: options.durability.clone(),
        writes,
        writes_acked: acked,
        write_errors: shared.errors.load(Ordering::Relaxed),
        deliveries_expected: expected,
        deliveries,
        ack_p50_us: quantile_us(&ack, 0.5),
        ack_p99_us: quantile_us(&ack, 0.99),
        server_rss_mb,
    })
}

/// Reads one SSE subscription until told to stop; returns the latencies of measured records.
async fn sse_subscriber(
    mut response: reqwest::Response,
    shared: Arc<Shared>,
    latency: Arc<std::sync::Mutex<Histogram<u64>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        // Asleep until data or the stop signal: thousands of subscribers must not poll, or the
        // harness would spend the CPU it is measuring.
        let chunk = tokio::select! {
            chunk = response.chunk() => match chunk {
                Ok(Some(chunk)) => chunk,
                _ => break,
            },
            _ = stop.changed() => break,
        };
        let received_ns = shared.base.elapsed().as_nanos() as u64;
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|pair| pair == b"\n\n") {
            let block: Vec<u8> = buffer.drain(..end + 2).collect();
            let Some(intended_ns) = intended_of(&block) else { continue };
            shared.note_receipt(&latency, intended_ns, received_ns);
        }
    }
}

/// Reads one WebSocket subscription until told to stop, recording measured records.
async fn ws_subscriber(
    mut socket: tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    shared: Arc<Shared>,
    latency: Arc<std::sync::Mutex<Histogram<u64>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use futures_util::StreamExt;
    loop {
        let message = tokio::select! {
            message = socket.next() => match message {
                Some(Ok(message)) => message,
                _ => break,
            },
            _ = stop.changed() => break,
        };
        let received_ns = shared.base.elapsed().as_nanos() as u64;
        let tokio_tungstenite::tungstenite::Message::Text(text) = message else { continue };
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        let Some(intended_ns) = message["record"]["value"]["intended_ns"].as_u64() else { continue };
        shared.note_receipt(&latency, intended_ns, received_ns);
    }
}

/// The `intended_ns` a record event carries in its value.
fn intended_of(block: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(block).ok()?;
    let data = text.lines().find_map(|line| line.strip_prefix("data: "))?;
    let event: serde_json::Value = serde_json::from_str(data).ok()?;
    event["value"]["intended_ns"].as_u64()
}

pub fn table(report: &NotifyReport) -> String {
    format!(
        "notify benchmark — write over HTTP ({}) → subscribers over {}, separate processes\n\
         {} subscribers over {} subjects (each write matches {:.0}), {:.0} writes/s, {} writes measured\n\n\
         write → subscriber   p50 {:>8.0} µs   p90 {:>8.0} µs   p99 {:>8.0} µs   p99.9 {:>8.0} µs   max {:>8.0} µs\n\
         write → durable ack  p50 {:>8.0} µs   p99 {:>8.0} µs\n\
         delivered {:.2} % ({} of {}), write errors {}{}\n",
        report.durability,
        if report.protocol == Protocol::Ws { "WebSocket" } else { "SSE" },
        report.subscribers,
        report.subjects,
        report.subscribers as f64 / report.subjects as f64,
        report.rate,
        report.writes,
        report.p50_us,
        report.p90_us,
        report.p99_us,
        report.p999_us,
        report.max_us,
        report.ack_p50_us,
        report.ack_p99_us,
        report.delivered_pct,
        report.deliveries,
        report.deliveries_expected,
        report.write_errors,
        report.server_rss_mb.map_or_else(String::new, |mb| format!(", server RSS {mb:.0} MiB")),
    )
}

pub fn json_line(report: &NotifyReport) -> String {
    serde_json::to_string(report).expect("the report serializes")
}
