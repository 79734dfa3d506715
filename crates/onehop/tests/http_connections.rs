//! HTTP connections that hold the server's resources without using them, against the real
//! binary over loopback: sockets that send nothing, dribble a head, sit idle between requests
//! or stall mid-body are closed (and counted), so they cannot lock other clients out; and
//! request bodies, however many arrive at once, stay within a memory bound.
//!
//! Settings are given as environment variables: a server without them would start all the
//! same, and fail these tests on what it does, not on a flag it does not know.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{RawSse, get, onehop, post, start};

/// Reads what the server sends on `socket` until it closes the connection, for at most
/// `within`. `None` if it was still open then.
fn read_until_closed(mut socket: TcpStream, within: Duration) -> Option<String> {
    let deadline = Instant::now() + within;
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        socket.set_read_timeout(Some(left.min(Duration::from_millis(200)))).unwrap();
        match socket.read(&mut buffer) {
            Ok(0) => return Some(String::from_utf8_lossy(&received).to_string()),
            Ok(read) => received.extend_from_slice(&buffer[..read]),
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            // A reset after the answer is a close too.
            Err(_) => return Some(String::from_utf8_lossy(&received).to_string()),
        }
    }
}

/// The value of the metric line that starts with `series`, 0 when absent.
fn metric(address: SocketAddr, series: &str) -> f64 {
    let (status, body) = get(address, "/metrics");
    assert_eq!(status, 200);
    body.lines().find_map(|line| line.strip_prefix(series).and_then(|rest| rest.trim().parse().ok())).unwrap_or(0.0)
}

#[test]
fn idle_and_stalled_sockets_are_closed_counted_and_free_their_slots() {
    let dir = tempfile::tempdir().unwrap();
    let timeouts = [
        ("ONEHOP_HTTP_HEADER_READ_TIMEOUT_S", "1"),
        ("ONEHOP_HTTP_IDLE_TIMEOUT_S", "2"),
        ("ONEHOP_HTTP_BODY_READ_TIMEOUT_S", "1"),
    ];
    // Nine slots: two live subscriptions and seven sockets that hold a slot for nothing. The
    // stream comes from a schema, not from a first POST: that request's socket could still be
    // lingering in its slot when the seven arrive, on a loaded machine.
    let schema = dir.path().join("schema.sql");
    std::fs::write(&schema, "CREATE STREAM s").unwrap();
    let schema = schema.to_str().unwrap();
    let args = ["--http-addr", "127.0.0.1:0", "--connections-max", "9", "--schema", schema];
    let server = start(dir.path(), &args, &timeouts);
    let address = server.address;

    // Subscriptions are not idle: they outlive every timeout while the server has nothing to
    // send them, and still deliver afterwards.
    let mut sse = RawSse::open(address, "/streams/s", None);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (mut socket, _) =
        runtime.block_on(tokio_tungstenite::connect_async(format!("ws://{address}/streams/s"))).unwrap();

    let connect = || TcpStream::connect(address).unwrap();
    // Three sockets that never send a byte.
    let silent: Vec<TcpStream> = (0..3).map(|_| connect()).collect();
    // Two that send a head a byte at a time, each byte well within the timeout.
    let dribbling: Vec<TcpStream> = (0..2).map(|_| connect()).collect();
    let dribblers: Vec<JoinHandle<()>> = dribbling
        .iter()
        .map(|socket| {
            let mut socket = socket.try_clone().unwrap();
            std::thread::spawn(move || {
                let head = b"GET /healthz HTTP/1.1\r\nHost: test\r\nX-Slow: ";
                if socket.write_all(head).is_err() {
                    return;
                }
                for _ in 0..100 {
                    std::thread::sleep(Duration::from_millis(200));
                    if socket.write_all(b"z").is_err() {
                        return;
                    }
                }
            })
        })
        .collect();
    // One that makes a keep-alive request, reads the answer, and then sends nothing.
    let mut idle = connect();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut answer = [0u8; 4096];
    idle.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let read = idle.read(&mut answer).unwrap();
    assert!(answer[..read].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..read]));
    // One that announces a body and stops sending it.
    let mut stalled = connect();
    stalled.write_all(b"POST /streams/s HTTP/1.1\r\nHost: test\r\nContent-Length: 1000\r\n\r\n0123456789").unwrap();

    // Each is closed; a slow head and a stalled body are told why first.
    let within = Duration::from_secs(10);
    for socket in silent {
        assert_eq!(read_until_closed(socket, within).as_deref(), Some(""), "a silent socket is closed, unanswered");
    }
    for socket in dribbling {
        let said = read_until_closed(socket, within).expect("a dribbled head is closed");
        assert!(said.starts_with("HTTP/1.1 408"), "{said}");
        assert!(said.contains(r#""code":"header_timeout""#), "{said}");
    }
    for dribbler in dribblers {
        dribbler.join().unwrap();
    }
    assert_eq!(read_until_closed(idle, within).as_deref(), Some(""), "an idle keep-alive socket is closed");
    let said = read_until_closed(stalled, within).expect("a stalled body is closed");
    assert!(said.starts_with("HTTP/1.1 408"), "{said}");
    assert!(said.contains(r#""code":"body_timeout""#), "{said}");

    // Their slots are free again: a new client is served.
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(address, "/healthz").0 != 200 {
        assert!(Instant::now() < deadline, "the timed-out sockets' slots never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The subscriptions are still there, past every timeout.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(post(address, "/streams/s", "1").map(|(status, _)| status), Some(200));
    let (_, record) = sse.next();
    assert_eq!(record["value"], 1);
    runtime.block_on(async {
        use futures_util::StreamExt;
        loop {
            let message = tokio::time::timeout(Duration::from_secs(10), socket.next()).await.unwrap().unwrap().unwrap();
            let message: serde_json::Value = serde_json::from_str(message.to_text().unwrap()).unwrap();
            if message["type"] == "record" {
                assert_eq!(message["record"]["value"], 1);
                break;
            }
        }
    });

    assert_eq!(metric(address, r#"http_connections_timed_out_total{timeout="header"}"#), 5.0);
    assert_eq!(metric(address, r#"http_connections_timed_out_total{timeout="idle"}"#), 1.0);
    assert_eq!(metric(address, r#"http_connections_timed_out_total{timeout="body"}"#), 1.0);
}

/// The server's resident memory, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// Samples the server's resident memory every 20 ms until dropped; keeps the highest.
struct PeakRss {
    peak: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
    sampler: Option<JoinHandle<()>>,
}

impl PeakRss {
    fn watch(pid: u32) -> PeakRss {
        let peak = Arc::new(AtomicU64::new(rss_bytes(pid)));
        let running = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (peak, running) = (peak.clone(), running.clone());
            std::thread::spawn(move || {
                while running.load(Ordering::Relaxed) {
                    peak.fetch_max(rss_bytes(pid), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        PeakRss { peak, running, sampler: Some(sampler) }
    }

    fn stop(mut self) -> u64 {
        self.running.store(false, Ordering::Relaxed);
        self.sampler.take().unwrap().join().unwrap();
        self.peak.load(Ordering::Relaxed)
    }
}

/// `clients` uploads at once of `announced` bytes each, of which they send `sent` (then
/// stall, while waiting for the answer); returns each one's answer.
fn uploads(address: SocketAddr, clients: usize, announced: usize, sent: usize) -> Vec<String> {
    let threads: Vec<JoinHandle<String>> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let mut socket = TcpStream::connect(address).unwrap();
                let head = format!(
                    "POST /streams/uploads HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {announced}\r\n\r\n"
                );
                socket.write_all(head.as_bytes()).unwrap();
                // Sent from its own thread: the server may answer before it has read it all.
                let mut writer = socket.try_clone().unwrap();
                let sender = std::thread::spawn(move || {
                    let chunk = vec![b'x'; 1 << 20];
                    let mut left = sent;
                    while left > 0 {
                        let size = left.min(chunk.len());
                        if writer.write_all(&chunk[..size]).is_err() {
                            return;
                        }
                        left -= size;
                    }
                });
                let answer = read_until_closed(socket, Duration::from_secs(60)).unwrap_or_default();
                let _ = sender.join();
                answer
            })
        })
        .collect();
    threads.into_iter().map(|thread| thread.join().unwrap()).collect()
}

fn error_code(answer: &str) -> String {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let body: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|_| panic!("not a JSON answer: {answer:?}"));
    body["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[test]
fn thirty_concurrent_uploads_stay_within_the_body_memory_bound() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let settings = [("ONEHOP_HTTP_BODY_BYTES_IN_FLIGHT_MAX", "64MiB"), ("ONEHOP_HTTP_BODY_READ_TIMEOUT_S", "5")];
    // The defaults otherwise: bodies up to 32 MiB (twice batch_bytes_max), records up to 1 MiB.
    let server = start(dir.path(), &["--http-addr", "127.0.0.1:0"], &settings);
    let (address, pid) = (server.address, server.child.id());
    assert_eq!(post(address, "/streams/uploads", "0").map(|(status, _)| status), Some(200));
    let baseline = rss_bytes(pid);
    // The bound this test holds the server to while 30 clients upload: four times the bodies
    // allowed in flight, above what it used before. Without a bound, 30 bodies of 20 MiB are
    // 600 MiB.
    let bound = baseline + 4 * 64 * MIB;

    // Bodies over the limit are refused from their Content-Length, before they are read.
    let watch = PeakRss::watch(pid);
    for answer in uploads(address, 30, 40 << 20, 40 << 20) {
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer:?}");
        assert_eq!(error_code(&answer), "body_too_large");
    }
    let peak = watch.stop();
    assert!(peak < bound, "peak RSS {} MiB over the bound of {} MiB", peak / MIB, bound / MIB);

    // Bodies under the limit are read, as many at a time as fit in 64 MiB; each then proves
    // too large for a record.
    let watch = PeakRss::watch(pid);
    let answers = uploads(address, 30, 20 << 20, 20 << 20);
    let peak = watch.stop();
    let read_whole = answers.iter().filter(|answer| error_code(answer) == "record_too_large").count();
    for answer in &answers {
        // A body that waited longer than the read timeout for room was refused unread.
        assert!(["record_too_large", "server_busy"].contains(&error_code(answer).as_str()), "{answer:?}");
    }
    assert!(read_whole >= 3, "only {read_whole} bodies were read: {answers:?}");
    assert!(peak < bound, "peak RSS {} MiB over the bound of {} MiB", peak / MIB, bound / MIB);

    // Uploads that stall halfway are cut off, and hold no more meanwhile.
    let watch = PeakRss::watch(pid);
    for answer in uploads(address, 30, 20 << 20, 10 << 20) {
        assert!(["body_timeout", "server_busy"].contains(&error_code(&answer).as_str()), "{answer:?}");
    }
    let peak = watch.stop();
    assert!(peak < bound, "peak RSS {} MiB over the bound of {} MiB", peak / MIB, bound / MIB);

    // After the burst the memory goes back: the server returns to near where it started.
    let settled = baseline + 64 * MIB;
    let deadline = Instant::now() + Duration::from_secs(20);
    while rss_bytes(pid) > settled {
        assert!(
            Instant::now() < deadline,
            "RSS {} MiB 20 s after the uploads, started at {} MiB",
            rss_bytes(pid) / MIB,
            baseline / MIB
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(address, "/healthz").0, 200);
}

#[test]
fn the_settings_are_flags_with_help_and_impossible_values_stop_the_start() {
    let output = onehop().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for (flag, variable) in [
        ("--http-header-read-timeout-s", "ONEHOP_HTTP_HEADER_READ_TIMEOUT_S"),
        ("--http-idle-timeout-s", "ONEHOP_HTTP_IDLE_TIMEOUT_S"),
        ("--http-body-read-timeout-s", "ONEHOP_HTTP_BODY_READ_TIMEOUT_S"),
        ("--http-body-bytes-in-flight-max", "ONEHOP_HTTP_BODY_BYTES_IN_FLIGHT_MAX"),
        ("--shutdown-timeout-s", "ONEHOP_SHUTDOWN_TIMEOUT_S"),
    ] {
        assert!(help.contains(flag) && help.contains(variable), "{flag} or {variable} missing from serve --help");
    }
    let dir = tempfile::tempdir().unwrap();
    for (args, named) in [
        (["--http-idle-timeout-s", "0"], "http_idle_timeout_s"),
        (["--http-body-bytes-in-flight-max", "1MiB"], "http_body_bytes_in_flight_max"),
    ] {
        let output = onehop()
            .args(["serve", "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0"])
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!output.status.success());
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(said.contains(named), "{said}");
    }
}
