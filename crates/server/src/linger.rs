//! Closing a TCP connection without losing the last answer: a lingering close.
//!
//! Closing a socket with unread input makes the kernel reset the connection, and a reset can
//! overtake what was written just before it: a client still sending (an HTTP body over the
//! limit, answered `413` before it was read; an MQTT packet over the maximum size, answered
//! with a DISCONNECT) then gets "broken pipe" or "connection reset" instead of the answer. So
//! a connection is shut down for writing first (everything written is sent, then end of
//! stream), and what the client still sends is read and dropped until it closes too, for at
//! most `LINGER_TIME` and `LINGER_BYTES`.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

/// How long a closed connection may keep reading what its client still sends.
pub(crate) const LINGER_TIME: Duration = Duration::from_secs(2);
/// How much of it a closed connection reads at most.
pub(crate) const LINGER_BYTES: usize = 64 << 20;

/// Shuts `stream` down for writing, then reads and drops what the client still sends until it
/// closes, within `LINGER_TIME` and `LINGER_BYTES`.
pub(crate) async fn linger(mut stream: TcpStream) {
    let drain = async {
        stream.shutdown().await?;
        // Most clients have closed already (or do on our end of stream): a small first read
        // sees that, so thousands of connections closing at once cost little memory. Only a
        // client still sending gets a larger buffer to drain into.
        let mut first = [0u8; 512];
        let mut read = match stream.read(&mut first).await? {
            0 => return Ok(()),
            n => n,
        };
        let mut sink = vec![0u8; 16 * 1024];
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

/// A TCP connection that lingers when dropped, keeping `hold` (its connection permit) until
/// it has: lingering connections still count against the connection limit.
pub(crate) struct Lingering<H: Send + Unpin + 'static> {
    /// `None` once dropped: the stream has moved to the task that lingers on it.
    stream: Option<TcpStream>,
    hold: Option<H>,
}

impl<H: Send + Unpin + 'static> Lingering<H> {
    pub(crate) fn new(stream: TcpStream, hold: H) -> Self {
        Lingering { stream: Some(stream), hold: Some(hold) }
    }

    /// Writes what the socket takes of `bytes` now, without waiting: last words before a close.
    pub(crate) fn try_write(&self, bytes: &[u8]) -> io::Result<usize> {
        match &self.stream {
            Some(stream) => stream.try_write(bytes),
            None => Ok(0),
        }
    }

    fn stream(&mut self) -> &mut TcpStream {
        self.stream.as_mut().expect("a connection has its stream until dropped")
    }
}

impl<H: Send + Unpin + 'static> Drop for Lingering<H> {
    fn drop(&mut self) {
        // Outside a runtime (a test's teardown) the socket is simply closed.
        if let (Some(stream), Ok(runtime)) = (self.stream.take(), tokio::runtime::Handle::try_current()) {
            let hold = self.hold.take();
            runtime.spawn(async move {
                linger(stream).await;
                drop(hold);
            });
        }
    }
}

impl<H: Send + Unpin + 'static> AsyncRead for Lingering<H> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_read(cx, buf)
    }
}

impl<H: Send + Unpin + 'static> AsyncWrite for Lingering<H> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().stream()).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(self.get_mut().stream()).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(self.get_mut().stream()).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.as_ref().is_some_and(TcpStream::is_write_vectored)
    }
}
