//! The harness's notify endpoint: the HTTP server a conventional stack's consumer POSTs to, once
//! per subscriber an event is owed to, as the study's application notified its subscribers.
//!
//! `POST /subscribers/<n>` with a JSON body holding the event's `seq` is subscriber `n`'s
//! receipt of that event. Each connection has a thread of its own that reads with the kernel's
//! arrival stamp, like every other observer of the harness, and answers `204 No Content` on
//! the same keep-alive connection. Only the harness's clock is read.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use crate::client::rxstamp;
use crate::recorder::{Delivery, Receipts, Recorder};
use crate::target::Observers;

/// Connections at once at most: the glue keeps up to 64 sockets; more is a leak, refused.
const CONNECTIONS_MAX: usize = 256;
/// A request's head and body at most: a notification is a line of JSON.
const REQUEST_BYTES_MAX: usize = 16 * 1024;
/// How often idle threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

/// Starts the endpoint on a loopback port, its threads among `observers`; returns its address.
/// Receipts for subscribers at or above `subscribers` are refused and recorded as problems.
pub fn start(recorder: &Arc<Recorder>, observers: &mut Observers, subscribers: u32) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding the notify endpoint")?;
    listener.set_nonblocking(true)?;
    let address = listener.local_addr()?;
    let (recorder, stop) = (recorder.clone(), observers.stop_flag());
    observers.add_thread(
        std::thread::Builder::new()
            .name("bench-notify-accept".into())
            .spawn(move || accept(listener, recorder, stop, subscribers))?,
    );
    Ok(address)
}

/// Accepts connections until `stop`, then waits for every connection's thread.
fn accept(listener: TcpListener, recorder: Arc<Recorder>, stop: Arc<AtomicBool>, subscribers: u32) {
    let mut connections = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) if connections.len() >= CONNECTIONS_MAX => {
                drop(stream);
                recorder.problem(format!("the notify endpoint refused a connection beyond {CONNECTIONS_MAX}"));
            }
            Ok((stream, _)) => {
                let (connection_recorder, stop) = (recorder.clone(), stop.clone());
                let spawned = std::thread::Builder::new().name("bench-notify".into()).spawn(move || {
                    crate::priority::raise_this_thread();
                    serve(stream, connection_recorder, stop, subscribers)
                });
                match spawned {
                    Ok(thread) => connections.push(thread),
                    Err(error) => recorder.observer_failed(format!("starting a notify connection's thread: {error}")),
                }
            }
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(error) => {
                recorder.observer_failed(format!("the notify endpoint: {error}"));
                break;
            }
        }
    }
    for connection in connections {
        if connection.join().is_err() {
            recorder.problem("a notify connection's thread panicked".into());
        }
    }
}

/// One request parsed from the front of a buffer.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    /// More bytes are needed.
    Partial,
    /// Subscriber `subscriber` was notified of event `seq`; the request took `length` bytes.
    Notify {
        subscriber: u32,
        seq: u64,
        length: usize,
    },
    Bad(String),
}

/// Parses one `POST /subscribers/<n>` request with a `Content-Length` body.
fn parse(buffer: &[u8]) -> Request {
    let Some(head_end) = buffer.windows(4).position(|window| window == b"\r\n\r\n") else {
        return if buffer.len() > REQUEST_BYTES_MAX {
            Request::Bad("request head too long".into())
        } else {
            Request::Partial
        };
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]);
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default();
    let mut words = request_line.split(' ');
    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    let subscriber = match (method, path.strip_prefix("/subscribers/").map(str::parse::<u32>)) {
        ("POST", Some(Ok(subscriber))) => subscriber,
        _ => return Request::Bad(format!("unexpected request {request_line:?}")),
    };
    let content_length = lines.find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
    });
    let Some(content_length) = content_length.filter(|length| *length <= REQUEST_BYTES_MAX) else {
        return Request::Bad("no Content-Length, or too long".into());
    };
    let length = head_end + 4 + content_length;
    if buffer.len() < length {
        return Request::Partial;
    }
    let body: serde_json::Value = match serde_json::from_slice(&buffer[head_end + 4..length]) {
        Ok(body) => body,
        Err(error) => return Request::Bad(format!("body is not JSON: {error}")),
    };
    match body["seq"].as_u64() {
        Some(seq) => Request::Notify { subscriber, seq, length },
        None => Request::Bad(format!("body has no seq: {body}")),
    }
}

/// Serves one keep-alive connection until it closes or `stop`; hands its receipts over then.
fn serve(mut stream: TcpStream, recorder: Arc<Recorder>, stop: Arc<AtomicBool>, subscribers: u32) {
    let mut deliveries = Receipts::new();
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(POLL));
    let stamped = rxstamp::enable(stream.as_raw_fd()).is_ok();
    let total = recorder.events.schedule.total();
    let mut buffer = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 64 * 1024];
    'connection: while !stop.load(Ordering::Relaxed) {
        let read = if stamped {
            rxstamp::recv(stream.as_raw_fd(), &mut chunk, false)
        } else {
            stream.read(&mut chunk).map(|read| (read, None))
        };
        let (read, arrived) = match read {
            Ok((0, _)) => break,
            Ok(read) => read,
            Err(error) if matches!(error.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                continue;
            }
            Err(_) => break,
        };
        let received_ns = recorder.clock.now_ns();
        let arrived_ns = rxstamp::arrival_on_clock(received_ns, arrived);
        buffer.extend_from_slice(&chunk[..read]);
        let mut answers = Vec::new();
        let before = deliveries.len();
        loop {
            match parse(&buffer) {
                Request::Partial => break,
                Request::Notify { subscriber, seq, length } => {
                    buffer.drain(..length);
                    if seq < total && subscriber < subscribers {
                        deliveries.push(Delivery { seq, observer: subscriber, received_ns, arrived_ns });
                        answers.extend_from_slice(b"HTTP/1.1 204 No Content\r\n\r\n");
                    } else {
                        recorder.problem(format!("a notification for subscriber {subscriber}, event {seq}"));
                        answers.extend_from_slice(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
                    }
                }
                Request::Bad(why) => {
                    recorder.problem(format!("the notify endpoint refused a request: {why}"));
                    let _ =
                        stream.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                    break 'connection;
                }
            }
        }
        recorder.count_received((deliveries.len() - before) as u64);
        if !answers.is_empty() && stream.write_all(&answers).is_err() {
            break;
        }
    }
    recorder.add_deliveries(deliveries);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_is_parsed_once_its_body_is_complete() {
        let request = b"POST /subscribers/17 HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 22\r\n\r\n{\"seq\":42,\"tag\":\"t3\"}\n";
        for cut in 0..request.len() {
            assert_eq!(parse(&request[..cut]), Request::Partial, "cut at {cut}");
        }
        assert_eq!(parse(request), Request::Notify { subscriber: 17, seq: 42, length: request.len() });
        let mut two = request.to_vec();
        two.extend_from_slice(request);
        assert_eq!(parse(&two), Request::Notify { subscriber: 17, seq: 42, length: request.len() });
    }

    #[test]
    fn other_requests_are_refused() {
        assert!(matches!(parse(b"GET /subscribers/1 HTTP/1.1\r\n\r\n"), Request::Bad(_)));
        assert!(matches!(parse(b"POST /subscribers/x HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"), Request::Bad(_)));
        assert!(matches!(parse(b"POST /subscribers/1 HTTP/1.1\r\n\r\n"), Request::Bad(_)));
        assert!(matches!(parse(b"POST /subscribers/1 HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}"), Request::Bad(_)));
        assert!(matches!(parse(&[b'a'; REQUEST_BYTES_MAX + 1]), Request::Bad(_)));
    }
}
