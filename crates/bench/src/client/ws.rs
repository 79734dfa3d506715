//! Subscriptions over WebSocket (one subscription per socket, named in the URL).

use std::sync::Arc;

use anyhow::Context;
use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use super::http1;
use crate::plan::Filter;
use crate::recorder::{Delivery, Receipts, Recorder};

pub type Socket = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens a WebSocket subscription to `path` on the server at `url` with `filter`.
pub async fn subscribe(url: &str, path: &str, filter: &Filter) -> anyhow::Result<Socket> {
    let address = url.trim_start_matches("http://");
    let condition = match filter {
        Filter::Subject(subject) => format!("subject={}", http1::encode(subject)),
        Filter::Field { field, value } => format!("{field}={}", http1::encode(value)),
    };
    let ws_url = format!("ws://{address}{path}?{condition}&from=earliest");
    // Small buffers: the defaults (128 KiB each way) would cost the harness gigabytes at
    // 10 000 subscribers.
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let (socket, _) = tokio_tungstenite::connect_async_with_config(ws_url, Some(config), false)
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
