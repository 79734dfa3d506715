//! The connection limit: a listener that holds one permit per open connection. A connection
//! over the limit is answered `503` with a JSON error naming the setting and closed, as Redis
//! answers "max number of clients reached": the client learns why instead of hanging in the
//! accept queue.
//!
//! Every connection is closed the same careful way (a lingering close): the server's side is
//! shut down for writing after its last answer, then what the client is still sending is read
//! and dropped until it closes too, for at most `LINGER_TIME` and `LINGER_BYTES`. Closing a
//! socket with unread input makes the kernel reset the connection, and a client still sending
//! (a body over the limit, answered `413` before it was read) then gets "broken pipe" or
//! "connection reset" instead of the answer. The connection keeps its permit while it lingers.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

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
}

/// How long a closed connection may keep reading what its client still sends.
const LINGER_TIME: Duration = Duration::from_secs(2);
/// How much of it a closed connection reads at most.
const LINGER_BYTES: usize = 64 << 20;

/// An admitted connection; its permit returns when it has closed and lingered.
pub struct Admitted {
    /// `None` once dropped: the stream has moved to the task that lingers on it.
    stream: Option<TcpStream>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Admitted {
    fn stream(&mut self) -> &mut TcpStream {
        self.stream.as_mut().expect("an admitted connection has its stream until dropped")
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        metrics::gauge!("http_connections").decrement(1.0);
        if let (Some(stream), Ok(runtime)) = (self.stream.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(linger(stream, self.permit.take()));
        }
    }
}

/// Shuts the connection down for writing (everything written is sent first), then reads what
/// the client still sends until it closes, within `LINGER_TIME` and `LINGER_BYTES`.
async fn linger(mut stream: TcpStream, _permit: Option<OwnedSemaphorePermit>) {
    let drain = async {
        stream.shutdown().await?;
        let mut sink = [0u8; 16 * 1024];
        let mut read = 0;
        while read < LINGER_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => read += n,
            }
        }
        Ok::<(), io::Error>(())
    };
    let _ = tokio::time::timeout(LINGER_TIME, drain).await;
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
                    return (Admitted { stream: Some(stream), permit: Some(permit) }, address);
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
                            linger(stream, None).await;
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
        Pin::new(self.stream()).poll_read(cx, buf)
    }
}

impl AsyncWrite for Admitted {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.stream()).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.stream()).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.stream()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(TcpStream::is_write_vectored)
    }
}
