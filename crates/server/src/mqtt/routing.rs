//! Where a message published to a topic goes: the engine's route for it
//! ([`Engine::route`]: the stream, and the partition its topic hashes to, so one topic stays in
//! order), or the refusal that says, in MQTT's reason codes, why it takes no message; and each
//! connection's cache of its last route.

use bytes::Bytes;
use onehop_engine::route::{Route, RouteError};
use onehop_engine::{Durability, Engine, EngineError, ErrorKind, NewRecord, Principal, Privilege, Text};
use rmqtt_codec::types::QoS;

use super::proto::Refusal;

/// Where a connection's last publish went: its topic, its route, and the catalog generation
/// that held while it was resolved. A publisher mostly repeats one topic, and resolving it
/// (checking it, looking for a view, a table and a routed stream, hashing it) was ~3 % of the
/// server's CPU at 100 000 messages a second.
struct LastRoute {
    topic: Text,
    generation: u64,
    /// The access generation its write was allowed at.
    access_generation: u64,
    route: Route,
}

/// A connection's route cache: its last route, used again for the same topic as long as no
/// stream, table or view was created or dropped since.
#[derive(Default)]
pub(super) struct RouteCache {
    last: Option<LastRoute>,
}

impl RouteCache {
    /// The route of `topic` for `principal` (see [`route`]), from the cache when it holds it.
    pub(super) async fn route(
        &mut self,
        engine: &Engine,
        principal: &Principal,
        topic: &Text,
    ) -> Result<Route, (Refusal, String)> {
        // Read before resolving: a change during it makes the route stale at once.
        let generation = engine.catalog_generation();
        let access_generation = engine.access().generation();
        if let Some(last) = &self.last
            && last.generation == generation
            && last.access_generation == access_generation
            && last.topic == *topic
        {
            return Ok(last.route.clone());
        }
        let route = route(engine, principal, topic).await?;
        // A copy: the topic shares the packet's read buffer.
        let topic = Text::from(topic.as_str());
        self.last = Some(LastRoute { topic, generation, access_generation, route: route.clone() });
        Ok(route)
    }
}

/// The engine's route for `topic`, once `principal` may write its stream, or the refusal that
/// says why it takes no message, as MQTT says it.
pub(super) async fn route(engine: &Engine, principal: &Principal, topic: &str) -> Result<Route, (Refusal, String)> {
    // Checked before routing: a first publish that may not be made creates no stream. The
    // stream a topic lands in is the declared `mqtt_topic` one, else the one its first level
    // names.
    let stream = match engine.stream_for_mqtt_topic(topic) {
        Some(stream) => stream.name().to_string(),
        None => engine.stream_named_by(topic.split('/').next().unwrap_or_default()).to_string(),
    };
    engine
        .access()
        .authorize_subject(principal, Privilege::Write, &stream, topic)
        .map_err(|error| (engine_refusal(&error), error.to_string()))?;
    engine.route(topic).await.map_err(|error| (route_refusal(&error), error.to_string()))
}

/// Whether `principal` may read a retained message of `topic` that `stream` stored: READ on
/// that stream, or a topic grant. Not the stream the topic would go to now: a route declared
/// since must not open another stream's messages. A message checkpointed before sources were
/// kept (`stream` empty) is the stream's the topic goes to, found as [`route`] finds it.
pub(super) fn may_read_retained(engine: &Engine, principal: &Principal, stream: &str, topic: &str) -> bool {
    let stream = match stream {
        "" => match engine.stream_for_mqtt_topic(topic) {
            Some(stream) => stream.name().to_string(),
            None => engine.stream_named_by(topic.split('/').next().unwrap_or_default()).to_string(),
        },
        stream => stream.to_string(),
    };
    engine.access().authorize_subject(principal, Privilege::Read, &stream, topic).is_ok()
}

/// The record of a message to `topic` on `route`, checked against the limits of the route's
/// partition (what an append would refuse, refused now, as MQTT says it).
pub(super) fn record(
    route: &Route,
    topic: &Text,
    payload: Bytes,
    headers: Vec<(Text, Option<Bytes>)>,
) -> Result<NewRecord, (Refusal, String)> {
    let record =
        NewRecord { timestamp_ms: None, key: None, subject: Some(topic.clone()), headers, value: Some(payload) };
    match route.check(std::slice::from_ref(&record)) {
        Ok(()) => Ok(record),
        Err(error) => Err((Refusal::QuotaExceeded, error.to_string())),
    }
}

/// The durability a message of `qos` is stored with: QoS 0 is fire and forget, so `async`;
/// QoS 1 and 2 the stream's own.
pub(super) fn durability(qos: QoS) -> Option<Durability> {
    (qos == QoS::AtMostOnce).then_some(Durability::Async)
}

/// What a refused route is in MQTT's reason codes. Exhaustive: a new way to refuse a route does
/// not compile until it is given one.
fn route_refusal(error: &RouteError) -> Refusal {
    match error {
        RouteError::InvalidSubject { .. } | RouteError::Reserved(_) | RouteError::Table { .. } => Refusal::TopicInvalid,
        RouteError::ReadOnlyView(_) => Refusal::NotAuthorized,
        RouteError::Stream(error) => engine_refusal(error),
    }
}

/// What an engine error is in MQTT's reason codes, by its kind. Exhaustive: a new kind does not
/// compile until it is given one.
pub(super) fn engine_refusal(error: &EngineError) -> Refusal {
    match error.kind() {
        ErrorKind::Invalid => Refusal::TopicInvalid,
        // A stream that does not exist and may not be created: the client may not use it.
        ErrorKind::NotFound => Refusal::NotAuthorized,
        ErrorKind::TooLarge | ErrorKind::LimitExceeded => Refusal::QuotaExceeded,
        ErrorKind::Unauthenticated | ErrorKind::Forbidden => Refusal::NotAuthorized,
        ErrorKind::Conflict
        | ErrorKind::PreconditionFailed
        | ErrorKind::Unprocessable
        | ErrorKind::OutOfRange
        | ErrorKind::ShuttingDown
        | ErrorKind::Unavailable
        | ErrorKind::StorageFailed
        | ErrorKind::Internal => Refusal::Unavailable,
    }
}
