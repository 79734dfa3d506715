//! `onehop bench mqtt`: MQTT publish → subscribe through the broker, open loop.
//!
//! Publishers and subscribers each have their own connection (MQTT 3.1.1, QoS 1 by default).
//! A publisher sends on a fixed schedule: message `seq` is due at `seq / rate` seconds, its
//! 256-byte payload carries that intended time, and latency counts from it to a subscriber's
//! receipt, so a stalled broker cannot hide queueing behind a slow sender. Publishers and
//! subscribers are OS threads with blocking sockets (a publisher sleeps to each due time with
//! a 1 ns timer slack and sends whatever is due); one process, one monotonic clock; the broker
//! is another process. `--sweep` doubles the rate from `--rate` until p99 exceeds 10 ms or a
//! message goes missing, and reports the highest rate that held.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::num::NonZeroU16;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rmqtt_codec::types::{Publish, QoS};
use rmqtt_codec::v3;
use serde::Serialize;
use tokio_util::codec::{Decoder, Encoder};

use crate::histogram::{latency_histogram, quantile_us, record};
use crate::notify::{rss_mb, tighten_timer_slack};
use crate::server::ServerProcess;

/// A rate held when p99 stays at or under this and every message arrives.
const SWEEP_P99_LIMIT_US: f64 = 10_000.0;
/// A sweep stops here even if everything held.
const SWEEP_RATE_MAX: f64 = 2_000_000.0;

#[derive(Clone, Debug)]
pub struct MqttBenchOptions {
    /// A running broker (`host:port`); `None` starts `exe serve` on a temporary data directory.
    pub address: Option<String>,
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub publishers: usize,
    pub subscribers: usize,
    /// Messages per second, all publishers together.
    pub rate: f64,
    pub duration: Duration,
    pub warmup: Duration,
    pub payload_bytes: usize,
    pub qos: u8,
    /// Double the rate from `rate` until it no longer holds.
    pub sweep: bool,
    /// Extra connections that connect and stay idle (to measure what idle clients cost).
    pub idle_clients: usize,
    pub progress: bool,
}

impl Default for MqttBenchOptions {
    fn default() -> Self {
        MqttBenchOptions {
            address: None,
            exe: PathBuf::from("onehop"),
            dir: PathBuf::from("."),
            publishers: 1,
            subscribers: 1,
            rate: 1000.0,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(2),
            payload_bytes: 256,
            qos: 1,
            sweep: false,
            idle_clients: 0,
            progress: true,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MqttReport {
    pub bench: &'static str,
    pub rate: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub delivered_pct: f64,
    pub publishers: usize,
    pub subscribers: usize,
    pub qos: u8,
    pub payload_bytes: usize,
    /// Messages due in the measured window, those the broker acknowledged, and refusals.
    pub published: u64,
    pub acked: u64,
    pub errors: u64,
    pub deliveries_expected: u64,
    pub deliveries: u64,
    /// Intended send → PUBACK (durable), for comparison.
    pub ack_p50_us: f64,
    pub ack_p99_us: f64,
    pub idle_clients: usize,
    pub server_rss_mb: Option<f64>,
    /// With `--sweep`: the highest rate that held, and every rate tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rate_held: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sweep: Vec<SweepPoint>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    pub rate: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub delivered_pct: f64,
    pub held: bool,
}

fn qos_of(level: u8) -> QoS {
    match level {
        0 => QoS::AtMostOnce,
        2 => QoS::ExactlyOnce,
        _ => QoS::AtLeastOnce,
    }
}

/// A blocking MQTT 3.1.1 connection: CONNECT sent and CONNACK read.
struct Connection {
    stream: TcpStream,
    codec: v3::Codec,
    buf: BytesMut,
}

impl Connection {
    fn open(address: &str, client_id: &str) -> anyhow::Result<Connection> {
        let stream = TcpStream::connect(address).with_context(|| format!("connecting to MQTT at {address}"))?;
        stream.set_nodelay(true)?;
        let mut connection = Connection { stream, codec: v3::Codec::new(16 * 1024 * 1024), buf: BytesMut::new() };
        let connect = v3::Connect {
            clean_session: true,
            keep_alive: 300,
            client_id: ByteString::from(client_id.to_string()),
            ..v3::Connect::default()
        };
        connection.send(v3::Packet::Connect(Box::new(connect)))?;
        match connection.next()? {
            v3::Packet::ConnectAck(ack) if ack.return_code == v3::ConnectAckReason::ConnectionAccepted => {
                Ok(connection)
            }
            other => bail!("the broker refused CONNECT: {other:?}"),
        }
    }

    fn send(&mut self, packet: v3::Packet) -> anyhow::Result<()> {
        let mut out = BytesMut::new();
        self.codec.encode(packet, &mut out)?;
        self.stream.write_all(&out)?;
        Ok(())
    }

    /// The next packet from the broker.
    fn next(&mut self) -> anyhow::Result<v3::Packet> {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            if let Some((packet, _)) = self.codec.decode(&mut self.buf)? {
                return Ok(packet);
            }
            let read = self.stream.read(&mut chunk)?;
            if read == 0 {
                bail!("the broker closed the connection");
            }
            self.buf.extend_from_slice(&chunk[..read]);
        }
    }
}

struct Shared {
    base: Instant,
    warmup_ns: u64,
    end_ns: u64,
    stop: AtomicBool,
    acked: AtomicU64,
    errors: AtomicU64,
    delivered: AtomicU64,
    sent: AtomicU64,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }

    fn measured(&self, intended_ns: u64) -> bool {
        intended_ns >= self.warmup_ns && intended_ns < self.end_ns
    }
}

/// Reads messages until told to stop, acknowledging QoS 1 ones in batches.
fn subscriber(mut connection: Connection, shared: Arc<Shared>, latency: Arc<Mutex<Histogram<u64>>>) {
    let mut local = latency_histogram();
    let mut chunk = vec![0u8; 256 * 1024];
    let _ = connection.stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut acks = BytesMut::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let read = match connection.stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                continue;
            }
            Err(_) => break,
        };
        let received_ns = shared.now_ns();
        connection.buf.extend_from_slice(&chunk[..read]);
        while let Ok(Some((packet, _))) = connection.codec.decode(&mut connection.buf) {
            let v3::Packet::Publish(publish) = packet else { continue };
            if let Some(packet_id) = publish.packet_id {
                let _ = connection.codec.encode(v3::Packet::PublishAck { packet_id }, &mut acks);
            }
            if publish.payload.len() >= 8 {
                let intended_ns = u64::from_le_bytes(publish.payload[..8].try_into().expect("8 bytes"));
                if shared.measured(intended_ns) {
                    record(&mut local, received_ns.saturating_sub(intended_ns));
                    shared.delivered.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if !acks.is_empty() {
            if connection.stream.write_all(&acks).is_err() {
                break;
            }
            acks.clear();
        }
    }
    latency.lock().expect("latency histogram").add(&local).expect("same bounds");
}

/// Sends publisher `index`'s share of the schedule; another thread reads the PUBACKs.
fn publisher(
    connection: Connection,
    index: usize,
    options: MqttBenchOptions,
    rate: f64,
    topic: String,
    shared: Arc<Shared>,
    ack_latency: Arc<Mutex<Histogram<u64>>>,
) -> anyhow::Result<()> {
    tighten_timer_slack();
    let Connection { stream, mut codec, .. } = connection;
    let mut writer = stream.try_clone()?;
    // Packet id → intended time, for the ack latency and to keep ids unique in flight.
    let in_flight: Arc<Mutex<HashMap<u16, u64>>> = Arc::new(Mutex::new(HashMap::new()));
    let reader = {
        let (in_flight, shared, ack_latency) = (in_flight.clone(), shared.clone(), ack_latency.clone());
        let mut stream = stream;
        std::thread::Builder::new().name(format!("bench-puback-{index}")).spawn(move || {
            let mut codec = v3::Codec::new(1024 * 1024);
            let mut buf = BytesMut::new();
            let mut chunk = vec![0u8; 64 * 1024];
            let mut local = latency_histogram();
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            loop {
                let read = match stream.read(&mut chunk) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(error)
                        if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) =>
                    {
                        continue;
                    }
                    Err(_) => break,
                };
                let now_ns = shared.now_ns();
                buf.extend_from_slice(&chunk[..read]);
                while let Ok(Some((packet, _))) = codec.decode(&mut buf) {
                    let (v3::Packet::PublishAck { packet_id } | v3::Packet::PublishReceived { packet_id }) = packet
                    else {
                        continue;
                    };
                    if let Some(intended_ns) = in_flight.lock().expect("in flight").remove(&packet_id.get())
                        && shared.measured(intended_ns)
                    {
                        shared.acked.fetch_add(1, Ordering::Relaxed);
                        record(&mut local, now_ns.saturating_sub(intended_ns));
                    }
                }
            }
            ack_latency.lock().expect("ack histogram").add(&local).expect("same bounds");
        })?
    };
    let qos = qos_of(options.qos);
    let publishers = options.publishers as u64;
    let total = ((options.warmup + options.duration).as_secs_f64() * rate) as u64;
    let interval_ns = 1e9 / rate;
    let mut next_id: u16 = 1;
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut seq = index as u64;
    while seq < total {
        let now_ns = shared.now_ns();
        let due_ns = (seq as f64 * interval_ns) as u64;
        if due_ns > now_ns {
            std::thread::sleep(Duration::from_nanos(due_ns - now_ns));
            continue;
        }
        // Everything due by now goes out in one write.
        while seq < total && ((seq as f64 * interval_ns) as u64) <= now_ns && out.len() < 60 * 1024 {
            let intended_ns = (seq as f64 * interval_ns) as u64;
            let mut payload = BytesMut::with_capacity(options.payload_bytes.max(16));
            payload.put_u64_le(intended_ns);
            payload.put_u64_le(seq);
            payload.resize(options.payload_bytes.max(16), b'x');
            let packet_id = if qos == QoS::AtMostOnce {
                None
            } else {
                let mut in_flight = in_flight.lock().expect("in flight");
                if in_flight.len() >= 60_000 {
                    // Out of packet ids: the broker is far behind; count it and move on.
                    if shared.measured(intended_ns) {
                        shared.errors.fetch_add(1, Ordering::Relaxed);
                    }
                    seq += publishers;
                    continue;
                }
                while in_flight.contains_key(&next_id) || next_id == 0 {
                    next_id = next_id.wrapping_add(1);
                }
                in_flight.insert(next_id, intended_ns);
                let id = NonZeroU16::new(next_id);
                next_id = next_id.wrapping_add(1);
                id
            };
            let publish = Publish {
                dup: false,
                retain: false,
                qos,
                topic: ByteString::from(topic.clone()),
                packet_id,
                payload: Bytes::from(payload),
                properties: None,
            };
            codec.encode(v3::Packet::Publish(Box::new(publish)), &mut out)?;
            if shared.measured(intended_ns) {
                shared.sent.fetch_add(1, Ordering::Relaxed);
                if qos == QoS::AtMostOnce {
                    shared.acked.fetch_add(1, Ordering::Relaxed);
                }
            }
            seq += publishers;
        }
        writer.write_all(&out).context("publishing")?;
        out.clear();
    }
    // Wait (a while) for the last acknowledgements.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !in_flight.lock().expect("in flight").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Closing the socket ends the PUBACK reader's read.
    let _ = writer.shutdown(std::net::Shutdown::Both);
    let _ = reader.join();
    Ok(())
}

/// One run at `rate`.
fn run_once(
    options: &MqttBenchOptions,
    address: &str,
    rate: f64,
    server_pid: Option<u32>,
) -> anyhow::Result<MqttReport> {
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |since| since.as_nanos());
    let topic = format!("benchmqtt/{}-{nonce}/t", std::process::id());
    let filter = format!("benchmqtt/{}-{nonce}/#", std::process::id());
    let latency = Arc::new(Mutex::new(latency_histogram()));
    let ack_latency = Arc::new(Mutex::new(latency_histogram()));
    let mut subscribers = Vec::new();
    let mut subscriber_connections = Vec::new();
    for index in 0..options.subscribers {
        let mut connection = Connection::open(address, &format!("bench-sub-{index}-{nonce}"))?;
        let packet_id = NonZeroU16::new(1).expect("1 is not 0");
        connection.send(v3::Packet::Subscribe {
            packet_id,
            topic_filters: vec![(ByteString::from(filter.clone()), qos_of(options.qos))],
        })?;
        match connection.next()? {
            v3::Packet::SubscribeAck { status, .. }
                if matches!(status.first(), Some(v3::SubscribeReturnCode::Success(_))) => {}
            other => bail!("the broker refused the subscription: {other:?}"),
        }
        subscriber_connections.push(connection);
    }
    let mut publisher_connections = Vec::new();
    for index in 0..options.publishers {
        publisher_connections.push(Connection::open(address, &format!("bench-pub-{index}-{nonce}"))?);
    }
    // Everyone is connected and subscribed: the schedule starts now.
    let shared = Arc::new(Shared {
        base: Instant::now(),
        warmup_ns: options.warmup.as_nanos() as u64,
        end_ns: (options.warmup + options.duration).as_nanos() as u64,
        stop: AtomicBool::new(false),
        acked: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        delivered: AtomicU64::new(0),
        sent: AtomicU64::new(0),
    });
    for (index, connection) in subscriber_connections.into_iter().enumerate() {
        let (shared, latency) = (shared.clone(), latency.clone());
        subscribers.push(
            std::thread::Builder::new()
                .name(format!("bench-sub-{index}"))
                .spawn(move || subscriber(connection, shared, latency))?,
        );
    }
    let mut publishers = Vec::new();
    for (index, connection) in publisher_connections.into_iter().enumerate() {
        let (options, topic, shared, ack_latency) =
            (options.clone(), topic.clone(), shared.clone(), ack_latency.clone());
        publishers.push(
            std::thread::Builder::new()
                .name(format!("bench-pub-{index}"))
                .spawn(move || publisher(connection, index, options, rate, topic, shared, ack_latency))?,
        );
    }
    let total = ((options.warmup + options.duration).as_secs_f64() * rate) as u64;
    let bar = if options.progress { ProgressBar::new(total) } else { ProgressBar::hidden() };
    bar.set_style(ProgressStyle::with_template("{prefix:>10} [{elapsed_precise}] {bar:30} {pos}/{len} {wide_msg}")?);
    bar.set_prefix(format!("mqtt {rate:.0}/s"));
    while publishers.iter().any(|publisher| !publisher.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        let now_ns = shared.now_ns();
        bar.set_position(((now_ns as f64 / 1e9) * rate).min(total as f64) as u64);
        let phase = if now_ns < shared.warmup_ns { "warm-up" } else { "measuring" };
        bar.set_message(format!(
            "{phase}, acked {}, delivered {}",
            shared.acked.load(Ordering::Relaxed),
            shared.delivered.load(Ordering::Relaxed)
        ));
    }
    for publisher in publishers {
        publisher.join().map_err(|_| anyhow::anyhow!("a publisher thread panicked"))??;
    }
    // Let the last messages arrive.
    let expected = shared.sent.load(Ordering::Relaxed) * options.subscribers as u64;
    let deadline = Instant::now() + Duration::from_secs(5);
    while shared.delivered.load(Ordering::Relaxed) < expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let server_rss_mb = server_pid.and_then(rss_mb);
    shared.stop.store(true, Ordering::Relaxed);
    for subscriber in subscribers {
        subscriber.join().map_err(|_| anyhow::anyhow!("a subscriber thread panicked"))?;
    }
    bar.finish_and_clear();
    let latency = latency.lock().expect("latency histogram").clone();
    let ack = ack_latency.lock().expect("ack histogram").clone();
    let published = shared.sent.load(Ordering::Relaxed) + shared.errors.load(Ordering::Relaxed);
    let expected_all = published * options.subscribers as u64;
    Ok(MqttReport {
        bench: "mqtt",
        rate,
        p50_us: quantile_us(&latency, 0.5),
        p90_us: quantile_us(&latency, 0.9),
        p99_us: quantile_us(&latency, 0.99),
        p999_us: quantile_us(&latency, 0.999),
        max_us: latency.max() as f64 / 1000.0,
        delivered_pct: if expected_all == 0 { 0.0 } else { latency.len() as f64 * 100.0 / expected_all as f64 },
        publishers: options.publishers,
        subscribers: options.subscribers,
        qos: options.qos,
        payload_bytes: options.payload_bytes,
        published,
        acked: shared.acked.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed),
        deliveries_expected: expected_all,
        deliveries: latency.len(),
        ack_p50_us: quantile_us(&ack, 0.5),
        ack_p99_us: quantile_us(&ack, 0.99),
        idle_clients: options.idle_clients,
        server_rss_mb,
        max_rate_held: None,
        sweep: Vec::new(),
    })
}

/// Runs the benchmark (one rate, or a sweep) and returns its figures.
pub fn run(options: &MqttBenchOptions) -> anyhow::Result<MqttReport> {
    if options.publishers == 0
        || options.subscribers == 0
        || options.rate.is_nan()
        || options.rate <= 0.0
        || options.qos > 2
    {
        bail!("publishers, subscribers and rate must be positive, and qos 0, 1 or 2");
    }
    let server = match &options.address {
        Some(_) => None,
        None => Some(ServerProcess::start(&options.exe, &options.dir, &[])?),
    };
    let address =
        options.address.clone().or_else(|| server.as_ref().map(|server| server.mqtt.clone())).expect("an address");
    let server_pid = server.as_ref().map(ServerProcess::pid);
    // Idle clients: connected, then silent for the whole run.
    let mut idle = Vec::with_capacity(options.idle_clients);
    for index in 0..options.idle_clients {
        idle.push(Connection::open(&address, &format!("bench-idle-{index}")).context("opening idle clients")?);
    }
    if !options.sweep {
        let report = run_once(options, &address, options.rate, server_pid)?;
        drop(idle);
        return Ok(report);
    }
    let mut points = Vec::new();
    let mut best: Option<MqttReport> = None;
    let mut first: Option<MqttReport> = None;
    let mut rate = options.rate;
    loop {
        let report = run_once(options, &address, rate, server_pid)?;
        let held = report.p99_us <= SWEEP_P99_LIMIT_US && report.delivered_pct >= 100.0 && report.errors == 0;
        eprintln!(
            "rate {rate:>9.0}/s  p50 {:>8.0} µs  p99 {:>8.0} µs  delivered {:.2} %  {}",
            report.p50_us,
            report.p99_us,
            report.delivered_pct,
            if held { "held" } else { "did not hold" }
        );
        points.push(SweepPoint {
            rate,
            p50_us: report.p50_us,
            p99_us: report.p99_us,
            delivered_pct: report.delivered_pct,
            held,
        });
        if first.is_none() {
            first = Some(report.clone());
        }
        if !held {
            break;
        }
        best = Some(report);
        rate *= 2.0;
        if rate > SWEEP_RATE_MAX {
            break;
        }
    }
    drop(idle);
    // The figures of the highest rate that held, or of the first rate when none did.
    let mut report = best.or(first).expect("the sweep ran at least once");
    report.max_rate_held = points.iter().filter(|point| point.held).map(|point| point.rate).reduce(f64::max);
    report.sweep = points;
    Ok(report)
}

pub fn table(report: &MqttReport) -> String {
    let mut text = format!(
        "mqtt benchmark — {} publisher(s) → broker → {} subscriber(s), MQTT 3.1.1 QoS {}, {}-byte payloads\n\
         {:.0} messages/s, {} due in the measured window\n\n\
         publish → subscriber  p50 {:>8.0} µs   p90 {:>8.0} µs   p99 {:>8.0} µs   p99.9 {:>8.0} µs   max {:>8.0} µs\n\
         publish → PUBACK      p50 {:>8.0} µs   p99 {:>8.0} µs\n\
         delivered {:.2} % ({} of {}), acknowledged {}, errors {}{}{}\n",
        report.publishers,
        report.subscribers,
        report.qos,
        report.payload_bytes,
        report.rate,
        report.published,
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
        report.acked,
        report.errors,
        if report.idle_clients > 0 { format!(", {} idle clients", report.idle_clients) } else { String::new() },
        report.server_rss_mb.map_or_else(String::new, |mb| format!(", server RSS {mb:.0} MiB")),
    );
    if let Some(rate) = report.max_rate_held {
        text.push_str(&format!("sweep: highest rate that held (p99 ≤ 10 ms, 100 % delivered): {rate:.0} messages/s\n"));
    } else if !report.sweep.is_empty() {
        text.push_str("sweep: no rate held\n");
    }
    text
}

pub fn json_line(report: &MqttReport) -> String {
    serde_json::to_string(report).expect("the report serializes")
}
