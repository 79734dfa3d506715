//! The accept loop the TCP listeners share (MQTT, Kafka): at most `connections_max` open at
//! once, one more closed at once and counted, accept errors (out of file descriptors, say)
//! waited out instead of spinning.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a failed accept waits before the next.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// Accepts connections on `listener` until `shutdown` resolves, handing each (with no-delay
/// set) to `serve` with its permit, which it holds until the connection is gone. Returns the
/// permits, so the caller can wait for connections to end.
pub(crate) async fn accept_connections(
    listener: TcpListener,
    connections_max: usize,
    protocol: &'static str,
    refused_metric: &'static str,
    shutdown: impl Future<Output = ()>,
    mut serve: impl FnMut(TcpStream, SocketAddr, OwnedSemaphorePermit),
) -> Arc<Semaphore> {
    let permits = Arc::new(Semaphore::new(connections_max));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::warn!(%error, protocol, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!(refused_metric).increment(1);
            tracing::warn!(%peer, protocol, "connection refused: connections_max reached");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        serve(stream, peer, permit);
    }
    permits
}
