//! The connection limit: a listener that holds one permit per open connection. A connection
//! over the limit is answered `503` with a JSON error naming the setting and closed, as Redis
//! answers "max number of clients reached": the client learns why instead of hanging in the
//! accept queue.
//!
//! Every connection, admitted or refused, closes with a lingering close (`crate::linger`), so
//! a client still sending gets the last answer, not a reset. A connection keeps its permit
//! while it lingers.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::linger::{LINGER_TIME, Lingering, linger};

/// A TCP listener that admits at most `max` connections at a time.
pub struct LimitedListener {
    inner: TcpListener,
    permits: Arc<Semaphore>,
    max: usize,
}

impl LimitedListener {
    pub fn new(inner: TcpListener, max: usize) -> Self {
        LimitedListener { inner, permits: Arc::new(Semaphore::new(max)), max }
    }

    /// Resolves once every admitted connection has closed and lingered. Taking every permit
    /// also admits no one meanwhile.
    pub fn all_closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let (permits, max) = (self.permits.clone(), u32::try_from(self.max).unwrap_or(u32::MAX));
        async move {
            let _ = permits.acquire_many_owned(max).await;
        }
    }
}

/// An admitted connection; its permit returns when it has closed and lingered.
pub struct Admitted {
    connection: Lingering<OwnedSemaphorePermit>,
}

impl Admitted {
    /// Writes what the socket takes of `bytes` now, without waiting.
    pub(crate) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        self.connection.try_write(bytes)
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        metrics::gauge!("http_connections").decrement(1.0);
    }
}

impl Listener for LimitedListener {
    type Io = Admitted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Admitted, SocketAddr) {
        loop {
            let (mut stream, address) = Listener::accept(&mut self.inner).await;
            match self.permits.clone().try_acquire_owned() {
                Ok(permit) => {
                    let _ = stream.set_nodelay(true);
                    metrics::gauge!("http_connections").increment(1.0);
                    return (Admitted { connection: Lingering::new(stream, permit) }, address);
                }
                Err(_) => {
                    metrics::counter!("http_connections_refused_total").increment(1);
                    let max = self.max;
                    // Answer off the accept loop: a slow client cannot stall it.
                    tokio::spawn(async move {
                        let body = format!(
                            "{{\"error\":{{\"code\":\"too_many_connections\",\"message\":\"the server holds at most {max} \
                             connections (setting connections_max); retry later\"}}}}"
                        );
                        let response = format!(
                            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                             connection: close\r\nretry-after: 1\r\n\r\n{body}",
                            body.len()
                        );
                        if tokio::time::timeout(LINGER_TIME, stream.write_all(response.as_bytes())).await.is_ok() {
                            linger(stream).await;
                        }
                    });
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for Admitted {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.connection).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.connection).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.connection).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.connection.is_write_vectored()
    }
}
