//! HTTP connections that hold the server's resources without using them, against the real
//! binary over loopback: sockets that send nothing, dribble a head or sit idle between requests
//! are closed (and counted), so they cannot lock other clients out.
//!
//! Settings are given as environment variables: a server without them would start all the
//! same, and fail these tests on what it does, not on a flag it does not know.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
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
    let timeouts = [("ONEHOP_HTTP_HEADER_READ_TIMEOUT_S", "1"), ("ONEHOP_HTTP_IDLE_TIMEOUT_S", "2")];
    // Eight slots: two live subscriptions and six sockets that hold a slot for nothing.
    let server = start(dir.path(), &["--http-addr", "127.0.0.1:0", "--connections-max", "8"], &timeouts);
    let address = server.address;
    assert_eq!(post(address, "/streams/s", "0").map(|(status, _)| status), Some(200));

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

    // Each is closed; a slow head is told why first.
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
}

#[test]
fn the_settings_are_flags_with_help_and_impossible_values_stop_the_start() {
    let output = onehop().args(["serve", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    for (flag, variable) in [
        ("--http-header-read-timeout-s", "ONEHOP_HTTP_HEADER_READ_TIMEOUT_S"),
        ("--http-idle-timeout-s", "ONEHOP_HTTP_IDLE_TIMEOUT_S"),
    ] {
        assert!(help.contains(flag) && help.contains(variable), "{flag} or {variable} missing from serve --help");
    }
    let dir = tempfile::tempdir().unwrap();
    for (args, named) in [
        (["--http-idle-timeout-s", "0"], "http_idle_timeout_s"),
        (["--http-header-read-timeout-s", "0"], "http_header_read_timeout_s"),
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
