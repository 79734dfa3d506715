//! Followers: the tasks that feed a subscription's messages into its connection's outbound
//! queue (or to a shared group's members). A follower reads one cursor opened by
//! [`onehop_engine::Engine::open_subscription`], which carries on from the log when its
//! follower falls behind the live feed; a subscription to several streams (a wildcard first
//! level, declared `mqtt_topic` streams) has one follower per stream, and starts one for each
//! such stream created later.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;

use onehop_engine::hub::{Cursor, Delivery, Event};
use onehop_engine::subject::SubjectFilter;
use onehop_engine::subscription::{Start, Target};
use onehop_engine::{ErrorKind, Filter, Principal, Record, Stream};
use rmqtt_codec::types::QoS;
use tokio::sync::{mpsc, watch};
use tokio::task::{AbortHandle, JoinSet};

use super::Broker;
use super::headers::CLIENT_HEADER;
use super::machine::{Outbound, message_topic};
use super::progress::{Resumed, SharedProgress};
use super::proto::Refusal;
use super::retained::Retained;
use super::shared::Group;

/// The streams a subscription follows from the start, each with its start positions.
pub(super) type Starts = Vec<(Arc<Stream>, Vec<u64>)>;

/// The streams a subscription's topic filter can find messages in: every stream for a
/// wildcard first level; none for a `$` topic (those are the server's, and no stream holds
/// them); else the stream the first level names and each stream whose declared `mqtt_topic`
/// overlaps the filter — now or when such a stream is created later.
#[derive(Clone)]
pub(super) enum Streams {
    Every,
    Reserved,
    Some { named: String, filter: SubjectFilter },
}

impl Streams {
    /// The streams of `filter`, or why a subscription to it can never get a message.
    pub(super) fn of(broker: &Broker, filter: &SubjectFilter) -> Result<Streams, (Refusal, String)> {
        let Some(first) = filter.first_level() else { return Ok(Streams::Every) };
        if first.starts_with('$') {
            // Granted, as other brokers do, so a client that watches `$SYS/#` works; nothing
            // is published there yet.
            return Ok(Streams::Reserved);
        }
        let first = broker.engine.stream_named_by(first);
        let streams = Streams::Some { named: first.to_string(), filter: filter.clone() };
        let routed =
            broker.engine.streams().iter().any(|stream| stream.mqtt_route().is_some() && streams.wants(stream));
        if routed || broker.engine.stream(first).is_ok() {
            return Ok(streams);
        }
        onehop_engine::validate_name(first).map_err(|error| (Refusal::TopicInvalid, error.to_string()))?;
        if !broker.engine.options().auto_create {
            return Err((
                Refusal::NotAuthorized,
                format!("{filter}: no stream {first:?}, and streams are not created on use"),
            ));
        }
        Ok(streams)
    }

    pub(super) fn wants(&self, stream: &Stream) -> bool {
        match self {
            Streams::Every => true,
            Streams::Reserved => false,
            Streams::Some { named, filter } => {
                stream.name() == named || stream.mqtt_route().is_some_and(|route| route.overlaps(filter))
            }
        }
    }

    /// The streams followed now, each from `start_of` it, and the watch that tells of streams
    /// created later (taken before listing, so none is missed in between).
    pub(super) fn starts(
        &self,
        broker: &Broker,
        start_of: impl Fn(&Stream) -> Vec<u64>,
    ) -> (watch::Receiver<u64>, Starts) {
        let changes = broker.engine.watch_streams();
        let starts = broker
            .engine
            .streams()
            .into_iter()
            .filter(|stream| self.wants(stream))
            .map(|stream| {
                let positions = start_of(&stream);
                (stream, positions)
            })
            .collect();
        (changes, starts)
    }
}

/// Where a follower's messages go: one connection, or one member of a shared group.
#[derive(Clone)]
pub(super) enum Sink {
    Connection(mpsc::Sender<Outbound>),
    Group(Arc<Group>),
}

impl Sink {
    /// Hands `outbound` over; false when nobody is there any more.
    async fn send(&self, outbound: Outbound) -> bool {
        match self {
            Sink::Connection(deliveries) => deliveries.send(outbound).await.is_ok(),
            Sink::Group(group) => group.dispatch(outbound).await,
        }
    }
}

/// One subscription's feed into its connection's outbound queue.
#[derive(Clone)]
pub(super) struct Follower {
    pub(super) broker: Arc<Broker>,
    /// Who subscribed: a stream they may not read is not followed (a wildcard subscription
    /// reaches only what they may read).
    pub(super) principal: Principal,
    pub(super) filter: Filter,
    pub(super) sink: Sink,
    pub(super) qos: QoS,
    pub(super) subscription_id: Option<NonZeroU32>,
    pub(super) retain_as_published: bool,
    /// Where a persistent session's positions come from.
    pub(super) progress: Option<SharedProgress>,
    /// What a resumed session had sent and had acknowledged.
    pub(super) resumed: Option<Arc<Resumed>>,
    /// For a table: which `{table}/{id}` topics the subscription wants (table changes carry
    /// no subject, so the stream filter cannot say).
    pub(super) topic_filter: Option<SubjectFilter>,
    /// v5 no local: the client id whose own messages are not sent back to it.
    pub(super) no_local_client: Option<Arc<str>>,
}

impl Follower {
    /// Sends the retained messages, flagged as such; false when the connection is gone.
    pub(super) async fn send_retained(&self, retained: Vec<Retained>) -> bool {
        for message in retained {
            let stream: Arc<str> = Arc::from(message.topic.split('/').next().unwrap_or_default());
            let record = Record {
                offset: 0,
                timestamp_ms: 0,
                key: None,
                subject: Some(message.topic.into()),
                headers: message.headers,
                value: Some(message.payload),
            };
            let event = Arc::new(Event::new(stream, 0, record, false));
            let outbound = Outbound::Message {
                event,
                qos: self.qos,
                subscription_id: self.subscription_id,
                retain: true,
                retain_as_published: true,
                progress: None,
                dup: false,
            };
            if !self.sink.send(outbound).await {
                return false;
            }
        }
        true
    }

    /// Whether the subscription wants `event`: a table's topic filter, and v5 no local.
    fn wants(&self, event: &Event) -> bool {
        if let Some(topic_filter) = &self.topic_filter
            && !topic_filter.matches(&message_topic(event))
        {
            return false;
        }
        let own = |own: &Arc<str>| {
            event.record.headers.iter().any(|(name, value)| name == CLIENT_HEADER && value == Some(own.as_bytes()))
        };
        !self.no_local_client.as_ref().is_some_and(own)
    }

    /// Feeds the records of `stream` that match until the connection or the stream goes away.
    pub(super) async fn follow(&self, stream: Arc<Stream>, mut cursor: Cursor) {
        loop {
            let event = match cursor.next().await {
                Ok(Delivery::Event(event, _)) => event,
                // The cursor carries on from the log instead (`Engine::open_subscription`);
                // should that ever change, the client is told rather than left missing messages.
                Ok(Delivery::Overflow { .. }) => {
                    self.sink.send(Outbound::CutOff).await;
                    return;
                }
                // What it follows may no longer be read by this connection: it ends, saying why.
                Err(error) if matches!(error.kind(), ErrorKind::Forbidden | ErrorKind::Unauthenticated) => {
                    self.sink.send(Outbound::Revoked(error.to_string())).await;
                    return;
                }
                // The stream was dropped, or the server is stopping.
                Err(_) => return,
            };
            if !self.wants(&event) {
                continue;
            }
            let (partition, offset) = (event.partition, event.record.offset);
            if let Some(progress) = &self.progress {
                progress.lock().expect("progress lock").delivered(stream.name(), partition, offset, cursor.positions());
            }
            let (dup, acknowledged) = self
                .resumed
                .as_ref()
                .map_or((false, false), |resumed| resumed.sent_before(stream.name(), partition, offset));
            if acknowledged {
                // Sent and acknowledged before the session's last connection ended.
                if let Some(progress) = &self.progress {
                    progress.lock().expect("progress lock").acked(stream.name(), partition, offset);
                }
                continue;
            }
            let outbound = Outbound::Message {
                event,
                qos: self.qos,
                subscription_id: self.subscription_id,
                retain: false,
                retain_as_published: self.retain_as_published,
                progress: self.progress.clone(),
                dup,
            };
            if !self.sink.send(outbound).await {
                return;
            }
        }
    }

    /// Opens `stream` from `positions` and follows it in a task of `tasks`.
    async fn start(&self, stream: &Stream, positions: Vec<u64>, tasks: &mut JoinSet<()>) -> Option<AbortHandle> {
        if let Some(progress) = &self.progress {
            progress.lock().expect("progress lock").start(stream.name(), &positions);
        }
        let target = Target::Stream(stream.name().to_string());
        let start = Start::Positions(positions);
        let opened =
            self.broker.engine.open_subscription(&self.principal, &target, self.filter.clone(), start).await.ok()?;
        let follower = self.clone();
        Some(tasks.spawn(async move { follower.follow(opened.stream, opened.cursor).await }))
    }

    /// Follows the streams of a subscription: from `starts` for those that exist now and from
    /// the beginning for each one created later that `streams` wants.
    pub(super) async fn follow_streams(self, streams: Streams, starts: Starts, mut changes: watch::Receiver<u64>) {
        let mut followed: HashMap<String, (Arc<Stream>, AbortHandle)> = HashMap::new();
        let mut tasks = JoinSet::new();
        for (stream, positions) in starts {
            if let Some(handle) = self.start(&stream, positions, &mut tasks).await {
                followed.insert(stream.name().to_string(), (stream, handle));
            }
        }
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                // Reap finished followers (a dropped stream) so the set stays small.
                Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            }
            let now = self.broker.engine.streams();
            followed.retain(|name, (stream, handle)| {
                let current = now.iter().any(|other| other.name() == name && Arc::ptr_eq(other, stream));
                if !current {
                    handle.abort();
                }
                current
            });
            for stream in now {
                if followed.contains_key(stream.name()) || !streams.wants(&stream) {
                    continue;
                }
                // Created after the subscription: everything in it is new.
                let positions = stream.start_offsets();
                if let Some(handle) = self.start(&stream, positions, &mut tasks).await {
                    followed.insert(stream.name().to_string(), (stream, handle));
                }
            }
        }
    }
}
