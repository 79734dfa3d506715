//! The HTTP listener's connections: each served by hyper (HTTP/1.1, or HTTP/2 with prior
//! knowledge), watched for a client that holds it without using it, and ended at shutdown.
//!
//! A connection with no request in progress waits for the next one, within a timeout:
//!
//! | waiting for | closed |
//! |---|---|
//! | the first request | `header_read_timeout` after the connection opened, or after the head's first byte if one came |
//! | the next request (keep-alive) | `idle_timeout` after the last response ended, or `header_read_timeout` after the head's first byte if one came, whichever is later |
//!
//! A client that had begun a head is answered `408 header_timeout` first; one that had sent
//! nothing is not (browsers open spare connections they may never use).
//!
//! While a request is in progress, the connection is not idle: its body has its own timeout
//! (`super::body`), and a response still streaming (an SSE subscription sending keep-alives) is
//! the connection at work. An upgraded connection (WebSocket) leaves hyper and this watch.
//!
//! hyper answers a head it cannot parse itself, with an empty body (`400`, `414` URI too long,
//! `431` head too large). Every refusal of ours has a JSON body, so an empty-bodied answer of
//! those statuses written between requests can only be hyper's: the socket swaps it for the
//! same status with `{"error":{"code","message"}}` as it is written.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tower_service::Service;

use super::AppState;
use super::limit::{Admitted, LimitedListener};

/// The HTTP listener's limits on connections.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Most connections open at once; one more is answered `503` and closed.
    pub connections_max: usize,
    /// Time a request head may take to arrive: from the connection's opening, or from the
    /// head's first byte.
    pub header_read_timeout: Duration,
    /// Time a connection may wait for its next request after a response.
    pub idle_timeout: Duration,
    /// Time connections have to finish once shutdown begins; then they are closed.
    pub shutdown_timeout: Duration,
    /// Serve HTTPS: each connection's TLS handshake first, within `header_read_timeout`.
    pub tls: Option<crate::tls::Tls>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            connections_max: 20_000,
            // A client that means to send a request sends its head in one go; ten seconds
            // allows for a slow network, and frees a slot held for nothing soon enough.
            header_read_timeout: Duration::from_secs(10),
            // Long enough that a client polling every half minute keeps its connection.
            idle_timeout: Duration::from_secs(60),
            // Below what process managers wait before SIGKILL (Kubernetes 30 s, systemd 90 s).
            shutdown_timeout: Duration::from_secs(5),
            tls: None,
        }
    }
}

/// Serves `state`'s router on `listener` until `shutdown` resolves. Then it stops accepting,
/// tells every subscription to finish (`AppState::shutdown`), lets requests in progress end,
/// and waits up to `shutdown_timeout` for every connection to close before closing the rest.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let mut listener = LimitedListener::new(listener, config.connections_max);
    let router = super::app(state.clone());
    // Tells each connection to finish its requests and close.
    let (close, closing) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = pin!(shutdown);
    loop {
        tokio::select! {
            (io, peer) = listener.accept() => {
                let (router, config, closing) = (router.clone(), config.clone(), closing.clone());
                match config.tls.clone() {
                    None => connections.spawn(serve_connection(io, router, config, closing, None, peer)),
                    Some(tls) => connections.spawn(async move {
                        let accepted = crate::tls::accept(tls.http_acceptor(), io, config.header_read_timeout, "http", peer);
                        if let Some((io, certificate_user)) = accepted.await {
                            serve_connection(io, router, config, closing, certificate_user, peer).await;
                        }
                    }),
                };
            }
            // Reaps finished connections, so the set holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    state.shutdown.begin();
    if let Some(broker) = &state.mqtt {
        // MQTT over WebSocket connections are the broker's to end.
        broker.shut_down();
    }
    let _ = close.send(true);
    // No new connections from here: the listening socket closes.
    let all_closed = listener.all_closed();
    drop(listener);
    if tokio::time::timeout(config.shutdown_timeout, all_closed).await.is_err() {
        tracing::warn!(
            timeout_s = config.shutdown_timeout.as_secs(),
            "HTTP connections still open at the end of the shutdown timeout; closing them"
        );
        connections.abort_all();
    }
    Ok(())
}

/// Why a connection was closed for waiting too long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timeout {
    /// No head, or not all of one, within `header_read_timeout`.
    Header,
    /// No next request within `idle_timeout`.
    Idle,
}

impl Timeout {
    fn label(self) -> &'static str {
        match self {
            Timeout::Header => "header",
            Timeout::Idle => "idle",
        }
    }
}

/// The address of the client a request came from, in its extensions: failed logins are
/// counted against it.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddress(pub std::net::SocketAddr);

/// Serves one connection until it ends, times out, or is closed at shutdown.
/// `certificate_user`: the user the connection's verified client certificate names, left in
/// each request's extensions for the access check, with the client's address.
async fn serve_connection<S: Socket>(
    io: S,
    router: Router,
    config: HttpConfig,
    mut closing: watch::Receiver<bool>,
    certificate_user: crate::tls::CertificateUser,
    peer: std::net::SocketAddr,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched { io, activity: activity.clone(), replacement: None });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: Request<Incoming>| {
            let request_open = RequestOpen::start(activity.clone());
            let mut router = router.clone();
            if let Some(user) = &certificate_user {
                request.extensions_mut().insert(crate::tls::VerifiedClient(user.clone()));
            }
            request.extensions_mut().insert(ClientAddress(peer));
            async move {
                let response = router.call(request.map(Body::new)).await?;
                Ok::<_, Infallible>(response.map(|body| Body::new(Tracked { body, _request_open: request_open })))
            }
        })
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // WebSocket over HTTP/2 (RFC 8441), as axum::serve allows it.
    builder.http2().enable_connect_protocol();
    let mut connection = pin!(builder.serve_connection_with_upgrades(io, service));
    let mut expired = pin!(activity.expired(&config));
    let mut closing_started = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "HTTP connection ended");
                }
                break;
            }
            _ = closing.changed(), if !closing_started => {
                closing_started = true;
                connection.as_mut().graceful_shutdown();
            }
            timeout = &mut expired => {
                metrics::counter!("http_connections_timed_out_total", "timeout" => timeout.label()).increment(1);
                tracing::debug!(timeout = timeout.label(), "HTTP connection timed out");
                let partial_head = timeout == Timeout::Header && activity.head_started_ms.load(Ordering::Acquire) != 0;
                activity.farewell.store(partial_head && !activity.http2.load(Ordering::Acquire), Ordering::Release);
                // Dropping the connection closes the socket (lingering: `crate::linger`).
                break;
            }
        }
    }
    // An upgraded socket lives on in its WebSocket task: nothing there is hyper's any more.
    activity.handed_over.store(true, Ordering::Release);
}

/// What a connection is doing, as its watch sees it. The socket writes when a head's first
/// byte comes, the service when a request starts, the response body when it ends.
struct Activity {
    opened: Instant,
    /// Requests whose response has not ended.
    requests_open: AtomicU32,
    /// Requests started so far: before the first, the connection waits for its first head.
    requests_started: AtomicU64,
    /// When the last response ended, in ms since `opened`.
    idle_since_ms: AtomicU64,
    /// When the first byte came after the last response ended, in ms since `opened` plus one;
    /// 0 while none has.
    head_started_ms: AtomicU64,
    /// The client spoke HTTP/2: its frames (pings, settings) come between requests, so only
    /// the idle timeout applies.
    http2: AtomicBool,
    /// hyper no longer serves the socket (upgraded, or ended).
    handed_over: AtomicBool,
    /// The socket answers `408 header_timeout` as it closes.
    farewell: AtomicBool,
    /// A response ended: the watch, if it waits for that, has a deadline again.
    response_ended: Notify,
}

impl Activity {
    fn new() -> Self {
        Activity {
            opened: Instant::now(),
            requests_open: AtomicU32::new(0),
            requests_started: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
            head_started_ms: AtomicU64::new(0),
            http2: AtomicBool::new(false),
            handed_over: AtomicBool::new(false),
            farewell: AtomicBool::new(false),
            response_ended: Notify::new(),
        }
    }

    fn since_opened_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, ms: u64) -> Instant {
        self.opened + Duration::from_millis(ms)
    }

    /// Bytes came from the client: between requests, the first of them starts a head.
    fn received(&self, bytes: &[u8]) {
        if self.requests_open.load(Ordering::Acquire) == 0 && self.head_started_ms.load(Ordering::Acquire) == 0 {
            if self.requests_started.load(Ordering::Acquire) == 0 && bytes.starts_with(b"PRI ") {
                self.http2.store(true, Ordering::Release);
            }
            self.head_started_ms.store(self.since_opened_ms() + 1, Ordering::Release);
        }
    }

    /// When the connection times out if nothing changes, and how; `None` while a request is in
    /// progress.
    fn deadline(&self, config: &HttpConfig) -> Option<(Instant, Timeout)> {
        if self.requests_open.load(Ordering::Acquire) > 0 {
            return None;
        }
        let idle_since = self.at(self.idle_since_ms.load(Ordering::Acquire));
        if self.http2.load(Ordering::Acquire) {
            return Some((idle_since + config.idle_timeout, Timeout::Idle));
        }
        match self.head_started_ms.load(Ordering::Acquire) {
            0 if self.requests_started.load(Ordering::Acquire) > 0 => {
                Some((idle_since + config.idle_timeout, Timeout::Idle))
            }
            0 => Some((self.opened + config.header_read_timeout, Timeout::Header)),
            started => Some((self.at(started - 1) + config.header_read_timeout, Timeout::Header)),
        }
    }

    /// Resolves when the connection has waited too long for a request.
    ///
    /// It sleeps until the deadline it last saw and looks again then: nothing wakes it on the
    /// way, so a request costs the connection's task no extra wake-up. While it sleeps, a
    /// deadline can only move later (a request came, or one ended and the idle time starts
    /// over); a head begun after a response gets its header time from its first byte, but no
    /// sooner than the idle time is up (see the module's table). Only a watch waiting out a
    /// request in progress is woken, when its response ends.
    async fn expired(&self, config: &HttpConfig) -> Timeout {
        loop {
            // Registered before the deadline is read, so an end in between is not missed.
            let response_ended = self.response_ended.notified();
            match self.deadline(config) {
                None => response_ended.await,
                Some((deadline, timeout)) => {
                    tokio::time::sleep_until(deadline).await;
                    if self.deadline(config).is_some_and(|(now_due, _)| now_due <= Instant::now()) {
                        return timeout;
                    }
                }
            }
        }
    }
}

/// A request in progress, from the service's call to the end of its response's body.
struct RequestOpen {
    activity: Arc<Activity>,
}

impl RequestOpen {
    fn start(activity: Arc<Activity>) -> Self {
        activity.requests_started.fetch_add(1, Ordering::AcqRel);
        activity.requests_open.fetch_add(1, Ordering::AcqRel);
        RequestOpen { activity }
    }
}

impl Drop for RequestOpen {
    fn drop(&mut self) {
        let activity = &self.activity;
        activity.idle_since_ms.store(activity.since_opened_ms(), Ordering::Release);
        activity.head_started_ms.store(0, Ordering::Release);
        activity.requests_open.fetch_sub(1, Ordering::AcqRel);
        activity.response_ended.notify_one();
    }
}

/// A response body that ends its request when hyper is done with it (sent, or dropped).
struct Tracked {
    body: Body,
    _request_open: RequestOpen,
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's byte stream as the HTTP server serves it: the socket, or TLS over it.
trait Socket: AsyncRead + AsyncWrite + Send + Unpin + 'static {
    /// Writes what the stream takes of `bytes` now, without waiting (the 408 farewell).
    fn write_now(&self, bytes: &[u8]) -> io::Result<usize>;
}

impl Socket for Admitted {
    fn write_now(&self, bytes: &[u8]) -> io::Result<usize> {
        self.try_write(bytes)
    }
}

impl Socket for tokio_rustls::server::TlsStream<Admitted> {
    /// Under TLS the farewell would have to be encrypted and could not go out without waiting;
    /// the connection just closes.
    fn write_now(&self, _bytes: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

/// The socket as hyper sees it: reads are noted in the connection's activity, and hyper's own
/// empty-bodied refusals are rewritten with a JSON body.
struct Watched<S: Socket> {
    io: S,
    activity: Arc<Activity>,
    /// An answer written in place of hyper's, and how much of it is out.
    replacement: Option<(Vec<u8>, usize)>,
}

impl<S: Socket> Watched<S> {
    /// Writes out what is left of a replacement answer.
    fn poll_replacement(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((answer, written)) = &mut self.replacement {
            if *written == answer.len() {
                self.replacement = None;
                break;
            }
            let wrote = ready!(Pin::new(&mut self.io).poll_write(cx, &answer[*written..]))?;
            if wrote == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += wrote;
        }
        Poll::Ready(Ok(()))
    }

    /// Whether `bytes`, about to be written, is hyper's answer to a head it refused; if so, the
    /// JSON answer goes out instead.
    fn replaced(&mut self, bytes: &[u8]) -> bool {
        let between_requests = self.activity.requests_open.load(Ordering::Acquire) == 0;
        if !between_requests
            || self.activity.http2.load(Ordering::Acquire)
            || self.activity.handed_over.load(Ordering::Acquire)
        {
            return false;
        }
        match parser_refusal(bytes) {
            Some(answer) => {
                self.replacement = Some((answer, 0));
                true
            }
            None => false,
        }
    }
}

impl<S: Socket> Drop for Watched<S> {
    fn drop(&mut self) {
        if self.activity.farewell.load(Ordering::Acquire) {
            // Best effort, without waiting: the socket's send buffer is empty at this point,
            // since the client never finished a request.
            let _ = self.io.write_now(&json_answer(
                "408 Request Timeout",
                "header_timeout",
                "the request's head did not arrive in time (setting http_header_read_timeout_s)",
            ));
        }
    }
}

impl<S: Socket> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        let received = &buf.filled()[before..];
        if !received.is_empty() {
            self.activity.received(received);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: Socket> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(self.poll_replacement(cx))?;
        if self.replaced(buf) {
            // hyper's bytes count as written; what goes out is the replacement.
            let _ = self.poll_replacement(cx)?;
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.poll_replacement(cx))?;
        if let Some(first) = bufs.iter().find(|buf| !buf.is_empty())
            && self.replaced(first)
        {
            let _ = self.poll_replacement(cx)?;
            return Poll::Ready(Ok(first.len()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_replacement(cx))?;
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Most header fields hyper parses in a head (its default: setting it moves the parse from
/// the stack to the heap).
const HEADER_FIELDS_MAX: usize = 100;
/// Longest request target hyper takes.
const TARGET_BYTES_MAX: usize = 65_534;
/// Largest head hyper buffers (its default read buffer limit).
const HEAD_BYTES_MAX: usize = 8192 + 4096 * 100;

/// The JSON answer for hyper's own refusal in `bytes`, if that is what they are: a head of
/// status 400, 414 or 431 with an empty body.
fn parser_refusal(bytes: &[u8]) -> Option<Vec<u8>> {
    let status = bytes.strip_prefix(b"HTTP/1.1 ")?.get(..4)?;
    let (status_line, code, message) = match status {
        b"400 " => ("400 Bad Request", "bad_request", "the request's head is not valid HTTP/1.1".to_string()),
        b"414 " => {
            ("414 URI Too Long", "uri_too_long", format!("the request target is longer than {TARGET_BYTES_MAX} bytes"))
        }
        b"431 " => (
            "431 Request Header Fields Too Large",
            "headers_too_large",
            format!("the request's head has more than {HEADER_FIELDS_MAX} header fields or {HEAD_BYTES_MAX} bytes"),
        ),
        _ => return None,
    };
    let head_end = bytes.windows(4).position(|window| window == b"\r\n\r\n")?;
    let head = &bytes[..head_end + 2];
    let empty = head.windows(19).any(|line| line.eq_ignore_ascii_case(b"\r\ncontent-length: 0"));
    if !empty {
        return None;
    }
    tracing::debug!(code, message, "request refused by the HTTP parser");
    metrics::counter!("http_errors_total", "code" => code).increment(1);
    Some(json_answer(status_line, code, &message))
}

/// A whole HTTP/1.1 answer with a JSON error body, closing the connection.
fn json_answer(status_line: &str, code: &str, message: &str) -> Vec<u8> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
    format!(
        "HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hyper_s_empty_refusals_are_replaced() {
        let answer =
            parser_refusal(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: x\r\n\r\n")
                .expect("replaced");
        let answer = String::from_utf8(answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        let body: serde_json::Value = serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap();
        assert_eq!(body["error"]["code"], "headers_too_large");
        // Our own refusals have bodies; other statuses and body bytes are left alone.
        assert!(parser_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 52\r\n\r\n{}").is_none());
        assert!(parser_refusal(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").is_none());
        assert!(parser_refusal(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0").is_none());
        assert!(parser_refusal(b"{\"HTTP/1.1 400 \r\ncontent-length: 0\r\n\r\n\"}").is_none());
    }

    /// The deadline follows the connection: header time for a first or unfinished head, idle
    /// time between requests, none while a request is in progress.
    #[tokio::test(start_paused = true)]
    async fn a_connection_s_deadline_follows_what_it_waits_for() {
        let config = HttpConfig {
            header_read_timeout: Duration::from_secs(2),
            idle_timeout: Duration::from_secs(30),
            ..HttpConfig::default()
        };
        let activity = Arc::new(Activity::new());
        let opened = activity.opened;
        assert_eq!(activity.deadline(&config), Some((opened + Duration::from_secs(2), Timeout::Header)));
        tokio::time::advance(Duration::from_secs(1)).await;
        activity.received(b"GET / HTTP/1.1\r\n");
        assert_eq!(activity.deadline(&config), Some((opened + Duration::from_secs(3), Timeout::Header)));
        let request = RequestOpen::start(activity.clone());
        activity.received(b"body bytes");
        assert_eq!(activity.deadline(&config), None);
        tokio::time::advance(Duration::from_secs(100)).await;
        drop(request);
        let idle_since = opened + Duration::from_secs(101);
        assert_eq!(activity.deadline(&config), Some((idle_since + Duration::from_secs(30), Timeout::Idle)));
        assert_eq!(activity.expired(&config).await, Timeout::Idle);
        assert_eq!(Instant::now(), idle_since + Duration::from_secs(30));
    }
}
