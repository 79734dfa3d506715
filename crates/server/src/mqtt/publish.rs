//! Storing what a client publishes, for the connection's loop: messages routed (through the
//! connection's route cache) and gathered per partition, so the publishes of one read go to the
//! log as one append; a retained message through the retained store; one to a `{table}/{id}`
//! topic as a row; wills. Acknowledgements are handed back in the order of the PUBLISHes, each
//! group once its messages are durable and every earlier group's have been handed back.

use std::future::Future;
use std::num::NonZeroU16;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use onehop_engine::route::Route;
use onehop_engine::{
    Durability, Engine, EngineError, NewRecord, ObjectKind, Position, Precondition, Principal, Privilege, Table, Text,
    Write,
};
use rmqtt_codec::types::QoS;
use tokio::sync::{mpsc, oneshot};

use super::Broker;
use super::headers::{CLIENT_HEADER, PACKET_HEADER, message_headers};
use super::machine::{Ack, Incoming, Message, Receipt};
use super::proto::{Refusal, Will};
use super::routing::{self, RouteCache};
use super::sessions::StoredRelease;

/// A batch is queued once it holds this many records or bytes: large enough that one append
/// (and one fsync) carries a burst, small enough that the first acknowledgement is not held
/// back for long.
const BATCH_RECORDS_MAX: usize = 1024;
const BATCH_BYTES_MAX: usize = 1024 * 1024;
/// How much of the log one step of looking for a resent QoS 2 message reads: a bound on the
/// memory of a look that runs only after a reconnect.
const LOOKUP_RECORDS_PER_READ: usize = 1024;
const LOOKUP_BYTES_PER_READ: usize = 4 * 1024 * 1024;

/// Why a message was not stored, as MQTT says it.
type Refused = (Refusal, String);

/// Publishes gathered from one read, for one partition, queued to the log as one append.
struct Batch {
    route: Route,
    durability: Option<Durability>,
    records: Vec<NewRecord>,
    bytes: usize,
    acks: Vec<(QoS, NonZeroU16)>,
    slots: usize,
}

/// A connection's way to the log.
pub(super) struct Publisher {
    broker: Arc<Broker>,
    /// Who the connection logged in as: every publish is checked against what they may write.
    principal: Principal,
    /// Where the last publish went, for the next one to the same topic.
    routes: RouteCache,
    /// Publishes gathered from the current read, not yet queued.
    batch: Option<Batch>,
    /// Where acknowledgements are handed back to the connection.
    acks: mpsc::Sender<Ack>,
    /// Resolves when the acknowledgements of everything queued so far have been handed back:
    /// each group waits for the one before, so PUBACKs go out in the order of the PUBLISHes.
    acks_done: Option<oneshot::Receiver<()>>,
}

impl Publisher {
    /// Who publishes: its publish rates slow the connection down.
    pub(super) fn principal(&self) -> &Principal {
        &self.principal
    }

    pub(super) fn new(broker: Arc<Broker>, principal: Principal, acks: mpsc::Sender<Ack>) -> Publisher {
        Publisher { broker, principal, routes: RouteCache::default(), batch: None, acks, acks_done: None }
    }

    /// The table a `{table}/{id}` topic names, if its first level is a table.
    pub(super) fn table_of(&self, topic: &str) -> Option<Arc<Table>> {
        let (first, id) = topic.split_once('/')?;
        if id.is_empty() || id.contains('/') {
            return None;
        }
        self.broker.engine.table(first).ok()
    }

    /// The route of a message to `topic`, and its record, checked against the route's limits.
    pub(super) async fn route(
        &mut self,
        topic: &Text,
        payload: Bytes,
        headers: Vec<(Text, Option<Bytes>)>,
    ) -> Result<(Route, NewRecord), Refused> {
        let route = self.routes.route(&self.broker.engine, &self.principal, topic).await?;
        let record = routing::record(&route, topic, payload, headers)?;
        Ok((route, record))
    }

    /// Whether a record for `route` at `durability` joins the gathered batch.
    pub(super) fn fits(&self, route: &Route, durability: Option<Durability>) -> bool {
        self.batch.as_ref().is_some_and(|batch| {
            Arc::ptr_eq(&batch.route.stream, &route.stream)
                && batch.route.partition == route.partition
                && batch.durability == durability
                && batch.records.len() < BATCH_RECORDS_MAX
                && batch.bytes < BATCH_BYTES_MAX
        })
    }

    /// Gathers `record` (owed `receipt`) into the batch (see [`Self::fits`]).
    pub(super) fn gather(&mut self, route: Route, record: NewRecord, durability: Option<Durability>, receipt: Receipt) {
        let batch = self.batch.get_or_insert_with(|| Batch {
            route,
            durability,
            records: Vec::new(),
            bytes: 0,
            acks: Vec::new(),
            slots: 0,
        });
        batch.bytes += record.encoded_len();
        batch.records.push(record);
        batch.acks.extend(receipt.ack);
        batch.slots += usize::from(receipt.slot);
    }

    pub(super) fn has_batch(&self) -> bool {
        self.batch.is_some()
    }

    /// Queues the gathered publishes as one append.
    pub(super) async fn flush(&mut self) {
        let Some(batch) = self.batch.take() else { return };
        let queued = batch.route.enqueue(&batch.records, batch.durability).await;
        let stored = async move {
            match queued {
                Ok(queued) => queued.await.map(|_| ()).map_err(|error| (Refusal::Unavailable, error.to_string())),
                Err(error) => Err((Refusal::Unavailable, error.to_string())),
            }
        };
        self.chain(batch.acks, batch.slots, stored);
    }

    /// Publishes a retained message: one record on `route`, flagged retained, which is both
    /// the message and the topic's retained message; acknowledged in its turn once durable.
    pub(super) async fn publish_retained(
        &mut self,
        route: &Route,
        record: NewRecord,
        durability: Option<Durability>,
        receipt: Receipt,
    ) -> Result<(), Refused> {
        let stored = self
            .broker
            .retained
            .publish(route, record, durability)
            .await
            .map_err(|error| (Refusal::Unavailable, error.to_string()))?;
        let stored = async move { stored.await.map_err(|error| (Refusal::Unavailable, error.to_string())) };
        self.chain(receipt.ack.into_iter().collect(), usize::from(receipt.slot), stored);
        Ok(())
    }

    /// A retained message to `{table}/{id}` writes the row (an empty one deletes it), durably
    /// and in order, before it is acknowledged in its turn.
    pub(super) async fn write_row(&mut self, table: &Arc<Table>, message: Message) -> Result<(), Refused> {
        self.broker
            .engine
            .access()
            .authorize(&self.principal, Privilege::Write, ObjectKind::Table, &table.name())
            .map_err(|error| (routing::engine_refusal(&error), error.to_string()))?;
        let id = message.topic.split_once('/').map(|(_, id)| id.to_string()).unwrap_or_default();
        let write = if message.payload.is_empty() {
            Write::Delete
        } else {
            match serde_json::from_slice::<serde_json::Value>(&message.payload) {
                Ok(serde_json::Value::Object(row)) => Write::Put(row),
                _ => {
                    let reason = format!("a row of table {:?} is a JSON object", table.name());
                    return Err((Refusal::PayloadInvalid, reason));
                }
            }
        };
        match table.write(&id, write, Precondition::None, routing::durability(message.qos)).await {
            Ok(_) | Err(EngineError::RowNotFound { .. }) => {}
            Err(error @ EngineError::InvalidRow(_)) => return Err((Refusal::PayloadInvalid, error.to_string())),
            Err(error) => return Err((Refusal::Unavailable, error.to_string())),
        }
        let receipt = message.receipt;
        self.chain(receipt.ack.into_iter().collect(), usize::from(receipt.slot), async { Ok(()) });
        Ok(())
    }

    /// Hands `ack` back in its turn, storing nothing.
    pub(super) fn ack_in_turn(&mut self, ack: Ack) {
        let Ack { packets, outcome, slots } = ack;
        self.chain(packets, slots, async move { outcome });
    }

    /// Resolves once the acknowledgements of everything queued so far have been handed back.
    pub(super) async fn settled(&mut self) {
        if let Some(done) = self.acks_done.take() {
            let _ = done.await;
        }
    }

    /// Hands `packets`' acknowledgements (and their `slots`) back once `stored` is done and
    /// every earlier group's have been handed back.
    fn chain(
        &mut self,
        packets: Vec<(QoS, NonZeroU16)>,
        slots: usize,
        stored: impl Future<Output = Result<(), Refused>> + Send + 'static,
    ) {
        let previous = self.acks_done.take();
        let (done, done_receiver) = oneshot::channel();
        self.acks_done = Some(done_receiver);
        let acks = self.acks.clone();
        tokio::spawn(async move {
            let outcome = stored.await;
            if let Some(previous) = previous {
                let _ = previous.await;
            }
            if packets.is_empty() {
                if let Err((_, error)) = outcome {
                    tracing::warn!(%error, "QoS 0 messages could not be stored");
                }
            } else {
                let _ = acks.send(Ack { packets, outcome, slots }).await;
            }
            let _ = done.send(());
        });
    }
}

/// Where a QoS 2 message on `route` goes, as a persistent session notes it: its partition, at
/// or after the end it has now.
pub(super) fn stored_release(packet_id: NonZeroU16, route: &Route) -> StoredRelease {
    StoredRelease {
        packet_id: packet_id.get(),
        stream: route.stream.name().to_string(),
        partition: route.partition,
        from: route.stream.end_offset(route.partition).unwrap_or(0),
    }
}

/// Whether client `client_id`'s resent QoS 2 message `incoming` is in the log where `release`
/// says it would have gone (read in bounded chunks: this only runs for a resend after a
/// reconnect).
pub(super) fn found_in_log(engine: &Engine, client_id: &str, release: &StoredRelease, incoming: &Incoming) -> bool {
    let Ok(stream) = engine.stream(&release.stream) else { return false };
    let (Ok(start), Ok(end)) = (stream.start_offset(release.partition), stream.end_offset(release.partition)) else {
        return false;
    };
    let packet = release.packet_id.to_string();
    let mut next = release.from.max(start);
    while next < end {
        let read =
            stream.read(release.partition, Position::Offset(next), LOOKUP_RECORDS_PER_READ, LOOKUP_BYTES_PER_READ);
        let Ok(records) = read else { return false };
        let Some(last) = records.last() else { return false };
        next = last.offset + 1;
        let found = records.iter().any(|record| {
            let header = |name: &str| record.headers.get(name);
            header(CLIENT_HEADER).is_some_and(|client| client == client_id.as_bytes())
                && header(PACKET_HEADER).is_some_and(|id| id == packet.as_bytes())
                && record.subject.as_deref() == Some(incoming.topic.as_str())
                && record.value.as_deref() == Some(&incoming.payload[..])
        });
        if found {
            return true;
        }
    }
    false
}

/// Publishes a will message (after the connection ended abnormally), after `delay` unless the
/// client is back by then.
pub(super) fn publish_will(broker: Arc<Broker>, principal: Principal, will: Will, client_id: String, delay: Duration) {
    tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
            if broker.clients.is_connected(&client_id) {
                return;
            }
        }
        let topic = Text::from(will.topic.as_str());
        let headers = message_headers(will.qos, will.properties, will.retain, super::now_ms());
        let routed = match routing::route(&broker.engine, &principal, &topic).await {
            Ok(route) => routing::record(&route, &topic, will.payload, headers).map(|record| (route, record)),
            Err(refused) => Err(refused),
        };
        let (route, record) = match routed {
            Ok(routed) => routed,
            Err((_, reason)) => return tracing::debug!(%topic, reason, "will message dropped"),
        };
        let durability = routing::durability(will.qos);
        let stored = if will.retain {
            match broker.retained.publish(&route, record, durability).await {
                Ok(stored) => stored.await.map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            }
        } else {
            match route.enqueue(std::slice::from_ref(&record), durability).await {
                Ok(queued) => queued.await.map(|_| ()).map_err(|error| error.to_string()),
                Err(error) => Err(error.to_string()),
            }
        };
        if let Err(error) = stored {
            tracing::warn!(%topic, error, "the will message could not be stored");
        }
    });
}
