//! Subscriptions over WebSocket (one subscription per socket, named in the URL).

use std::sync::Arc;

use anyhow::Context;
use futures_util::StreamExt;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_util::either::Either;

use super::{Endpoints, http1};
use crate::plan::Filter;
use crate::recorder::{Delivery, Receipts, Recorder};

/// A WebSocket over plain TCP or over TLS.
pub type Socket = tokio_tungstenite::WebSocketStream<Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>>;

/// Opens a WebSocket subscription to `path` on the server at `endpoints` with `filter`,
/// presenting the measured clients' credentials in the upgrade request.
pub async fn subscribe(endpoints: &Endpoints, path: &str, filter: &Filter) -> anyhow::Result<Socket> {
    let dial = endpoints.http_dial();
    let condition = match filter {
        Filter::Subject(subject) => format!("subject={}", http1::encode(subject)),
        Filter::Field { field, value } => format!("{field}={}", http1::encode(value)),
    };
    let scheme = if dial.tls.is_some() { "wss" } else { "ws" };
    let mut request = format!("{scheme}://{}{path}?{condition}&from=earliest", dial.address).into_client_request()?;
    if let Some(authorization) = endpoints.authorization() {
        request.headers_mut().insert("authorization", authorization.parse()?);
    }
    let socket = TcpStream::connect(&dial.address).await.with_context(|| format!("connecting to {}", dial.address))?;
    socket.set_nodelay(true)?;
    let stream = match &dial.tls {
        Some(client) => Either::Right(client.connect(socket).await.context("the TLS handshake")?),
        None => Either::Left(socket),
    };
    // Small buffers: the defaults (128 KiB each way) would cost the harness gigabytes at
    // 10 000 subscribers.
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let (socket, _) = tokio_tungstenite::client_async_with_config(request, stream, Some(config))
        .await
        .context("opening the WebSocket")?;
    Ok(socket)
}

/// Records every record a WebSocket subscription delivers to `observer`.
pub async fn fanout_observer(
    mut socket: Socket,
    observer: u32,
    recorder: Arc<Recorder>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut deliveries = Receipts::new();
    loop {
        let message = tokio::select! {
            message = socket.next() => match message {
                Some(Ok(message)) => message,
                _ => {
                    recorder.observer_failed(format!("subscriber {observer}: the server closed the socket"));
                    break;
                }
            },
            _ = stop.changed() => break,
        };
        let received_ns = recorder.clock.now_ns();
        let Message::Text(text) = message else { continue };
        let Ok(message) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        match message["type"].as_str() {
            Some("record") => {
                if let Some(seq) = message["record"]["value"]["seq"].as_u64() {
                    // No kernel stamp: the WebSocket library reads the socket.
                    deliveries.push(Delivery { seq, observer, received_ns, arrived_ns: 0 });
                    recorder.count_received(1);
                }
            }
            Some("overflow") => {
                recorder.observer_failed(format!("subscriber {observer} was cut off: {text}"));
                break;
            }
            _ => {}
        }
    }
    recorder.add_deliveries(deliveries);
}
