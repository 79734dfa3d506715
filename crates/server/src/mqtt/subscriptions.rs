//! A connection's subscriptions: SUBSCRIBE and UNSUBSCRIBE as the engine sees them. Every
//! subscription is opened through [`Engine::open_subscription`](onehop_engine::Engine):
//!
//! - a filter under a table (`orders/#`, `orders/o1`) follows the table; its rows come first,
//!   as retained messages, then every change to a matching row (a deleted row as an empty
//!   message);
//! - `views/{v}/…` follows the view: its current rows first, as retained messages, then each
//!   change;
//! - `$share/{group}/{filter}` joins a shared group ([`super::shared`]);
//! - any other filter follows the streams it can find messages in ([`Streams`]), after the
//!   retained messages it matches.
//!
//! A persistent session's subscription resumes from the positions its session stored, and
//! notes its progress ([`super::progress`]) for the next time.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use onehop_engine::access::model::ObjectPattern;
use onehop_engine::subject::SubjectFilter;
use onehop_engine::subscription::{Opened, Snapshot, Start, Target};
use onehop_engine::{Filter, Headers, ObjectKind, Position, Principal, Privilege, Stream};
use rmqtt_codec::types::QoS;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::Broker;
use super::followers::{Follower, Sink, Streams};
use super::machine::Outbound;
use super::progress::{Resumed, SharedProgress};
use super::proto::{Granted, Refusal, SubscribeFilter, qos_rank};
use super::retained::Retained;
use super::sessions::StoredSubscription;
use super::shared::Member;

/// The subscriptions of one connection, by filter.
pub(super) struct Subscriptions {
    broker: Arc<Broker>,
    client_id: Arc<str>,
    /// Who the connection logged in as: each subscription reads only what they may.
    principal: Principal,
    /// The connection's outbound queue, which every follower of its own feeds.
    deliveries: mpsc::Sender<Outbound>,
    handles: HashMap<String, SubscriptionHandle>,
    /// Each filter's place in its user's subscription limit, while subscribed.
    held: HashMap<String, onehop_engine::Held>,
}

/// One filter being subscribed: what the client asked, and where a persistent session
/// resumes it from.
struct Opening<'a> {
    filter: String,
    parsed: SubjectFilter,
    request: SubscribeFilter,
    subscription_id: Option<NonZeroU32>,
    /// Whether retained messages (a table's or view's rows) come first: retain handling 0, or
    /// 1 for a filter not subscribed yet.
    send_retained: bool,
    /// A persistent session's progress for it.
    progress: Option<SharedProgress>,
    resume: Option<&'a StoredSubscription>,
}

impl Opening<'_> {
    /// A follower of this subscription feeding `sink`, with `filter` on the stream.
    fn follower(&self, broker: &Arc<Broker>, principal: &Principal, sink: Sink, filter: Filter) -> Follower {
        Follower {
            broker: broker.clone(),
            principal: principal.clone(),
            filter,
            sink,
            qos: self.request.qos,
            subscription_id: self.subscription_id,
            retain_as_published: false,
            progress: self.progress.clone(),
            resumed: self.resume.map(Resumed::of),
            topic_filter: None,
            no_local_client: None,
        }
    }

    /// Where it starts in `stream`: where a persistent session left off, else `fresh`.
    fn start(&self, stream: &Stream, fresh: Start) -> Start {
        match self.resume {
            Some(resume) => Start::Positions(resume_positions(stream, resume.positions.get(stream.name()))),
            None => fresh,
        }
    }

    /// What a persistent session stores of it (positions come with its progress).
    fn stored(&self, retain_as_published: bool, no_local: bool) -> StoredSubscription {
        StoredSubscription {
            filter: self.filter.clone(),
            qos: qos_rank(self.request.qos),
            subscription_id: self.subscription_id.map(NonZeroU32::get),
            retain_as_published,
            no_local,
            positions: Default::default(),
            sent: Default::default(),
            unacked: None,
        }
    }
}

impl Subscriptions {
    pub(super) fn new(
        broker: Arc<Broker>,
        client_id: &str,
        principal: Principal,
        deliveries: mpsc::Sender<Outbound>,
    ) -> Subscriptions {
        Subscriptions {
            broker,
            client_id: Arc::from(client_id),
            principal,
            deliveries,
            handles: HashMap::new(),
            held: HashMap::new(),
        }
    }

    /// Subscribes from now, or, restoring a persistent session, from `resume` (per stream, the
    /// positions its previous connection had acknowledged up to). A persistent session's
    /// subscription notes its progress.
    pub(super) async fn subscribe(
        &mut self,
        request: SubscribeFilter,
        subscription_id: Option<NonZeroU32>,
        persistent: bool,
        resume: Option<&StoredSubscription>,
    ) -> Granted {
        let filter = request.filter.clone();
        if !self.handles.contains_key(&filter) && self.handles.len() >= self.broker.config.subscriptions_max {
            tracing::debug!(
                client_id = %self.client_id, max = self.broker.config.subscriptions_max,
                "subscription refused: the connection holds mqtt_subscriptions_max filters"
            );
            return Err(Refusal::QuotaExceeded);
        }
        // A new filter takes a place in the user's subscription limit (SUBACK 0x97 at it); one
        // subscribed again keeps its own.
        let held = match self.handles.contains_key(&filter) {
            true => None,
            false => self.principal.hold(onehop_engine::Resource::Subscription).map_err(|error| {
                tracing::debug!(client_id = %self.client_id, %error, "subscription refused");
                crate::access::limit_refused("mqtt");
                Refusal::QuotaExceeded
            })?,
        };
        let granted = self.subscribe_filter(request, subscription_id, persistent, resume).await;
        if granted.is_ok()
            && let Some(held) = held
        {
            self.held.insert(filter, held);
        }
        granted
    }

    async fn subscribe_filter(
        &mut self,
        request: SubscribeFilter,
        subscription_id: Option<NonZeroU32>,
        persistent: bool,
        resume: Option<&StoredSubscription>,
    ) -> Granted {
        let filter = request.filter.clone();
        if let Some(shared) = filter.strip_prefix("$share/") {
            return self.subscribe_shared(&filter, shared, request.qos, subscription_id);
        }
        let parsed = SubjectFilter::parse(&filter).map_err(|_| Refusal::TopicInvalid)?;
        let is_new = !self.handles.contains_key(&filter);
        let opening = Opening {
            send_retained: request.retain_handling == 0 || (request.retain_handling == 1 && is_new),
            progress: persistent.then(SharedProgress::default),
            filter,
            parsed,
            request,
            subscription_id,
            resume,
        };
        let first = opening.parsed.first_level().map(str::to_string);
        let handle = if let Some(table) = first.filter(|first| self.broker.engine.has_table(first)) {
            self.subscribe_table(&opening, table).await?
        } else if let Some(view) = self.view_of(&opening.filter) {
            self.subscribe_view(&opening, view).await?
        } else {
            self.subscribe_streams(&opening)?
        };
        self.handles.insert(opening.filter, handle);
        Ok(opening.request.qos)
    }

    /// Ends the subscription to `filter`; whether there was one.
    pub(super) fn unsubscribe(&mut self, filter: &str) -> bool {
        self.held.remove(filter);
        self.handles.remove(filter).is_some()
    }

    /// Ends every subscription: their followers stop, and shared groups are left.
    pub(super) fn clear(&mut self) {
        self.handles.clear();
        self.held.clear();
    }

    /// What a persistent session stores of its subscriptions: each with the positions it was
    /// acknowledged up to.
    pub(super) fn stored(&self) -> Vec<StoredSubscription> {
        self.handles.values().map(SubscriptionHandle::stored).collect()
    }

    /// Whether the connection may read `target` (a table or view a filter names).
    fn may_read(&self, target: &Target) -> Result<(), Refusal> {
        let (kind, name) = target.object();
        self.broker.engine.access().authorize(&self.principal, Privilege::Read, kind, name).map_err(|error| {
            tracing::debug!(client_id = %self.client_id, %error, "subscription refused");
            super::routing::engine_refusal(&error)
        })
    }

    /// Whether a subscription to `streams` could deliver anything the connection may read: a
    /// filter under one stream needs that stream (or a declared `mqtt_topic` stream it
    /// overlaps); a wildcard first level is granted, and follows only the streams it may read.
    fn may_follow(&self, streams: &Streams, filter: &str) -> Result<(), Refusal> {
        let Streams::Some { named, .. } = streams else { return Ok(()) };
        let access = self.broker.engine.access();
        // A stream grant, or a topic grant covering the filter.
        let readable =
            |name: &str| access.authorize_subscription(&self.principal, ObjectKind::Stream, name, Some(filter));
        let Err(error) = readable(named) else { return Ok(()) };
        let routed = self
            .broker
            .engine
            .streams()
            .into_iter()
            .any(|stream| streams.wants(&stream) && readable(stream.name()).is_ok());
        if routed {
            return Ok(());
        }
        tracing::debug!(client_id = %self.client_id, filter, %error, "subscription refused");
        Err(super::routing::engine_refusal(&error))
    }

    /// For a shared subscription: whether the connection may read every stream `streams`
    /// reaches now (all streams, for a wildcard first level).
    fn may_follow_all(&self, streams: &Streams, filter: &str) -> Result<(), Refusal> {
        let access = self.broker.engine.access();
        let refused = |error: onehop_engine::EngineError| {
            tracing::debug!(client_id = %self.client_id, filter, %error, "shared subscription refused");
            super::routing::engine_refusal(&error)
        };
        if let Streams::Every = streams {
            let all = ObjectPattern { kind: Some(ObjectKind::Stream), name: "*".into() };
            let allowed = access
                .permissions(&self.principal)
                .map_err(refused)?
                .is_none_or(|permissions| permissions.allows_all(Privilege::Read, &all));
            if !allowed {
                return Err(Refusal::NotAuthorized);
            }
            return Ok(());
        }
        // Each stream by a stream grant, or a topic grant covering the group's filter.
        // `filter` is `$share/{group}/{topic filter}`.
        let topic_filter = filter.splitn(3, '/').nth(2).unwrap_or_default();
        let readable = |name: &str| {
            access
                .authorize_subscription(&self.principal, ObjectKind::Stream, name, Some(topic_filter))
                .map_err(refused)
        };
        if let Streams::Some { named, .. } = streams {
            readable(named)?;
        }
        for stream in self.broker.engine.streams().into_iter().filter(|stream| streams.wants(stream)) {
            readable(stream.name())?;
        }
        Ok(())
    }

    /// The view a `views/{v}/…` filter names, if `v` is a view.
    fn view_of(&self, filter: &str) -> Option<String> {
        let name = filter.strip_prefix("views/")?.split('/').next()?;
        self.broker.engine.view(name).ok().map(|_| name.to_string())
    }

    /// Opens `target` from `start`, and notes where the subscription's progress starts.
    async fn open(
        &self,
        opening: &Opening<'_>,
        target: &Target,
        filter: Filter,
        start: Start,
    ) -> Result<Opened, Refusal> {
        let opened = self
            .broker
            .engine
            .open_subscription(&self.principal, target, filter, start)
            .await
            .map_err(|error| super::routing::engine_refusal(&error))?;
        if let Some(progress) = &opening.progress {
            progress.lock().expect("progress lock").start(opened.stream.name(), opened.cursor.positions());
        }
        Ok(opened)
    }

    /// A filter under a table (`orders/#`, `orders/o1`): its rows first, as retained messages,
    /// then every change to a matching row (a deleted row comes as an empty message).
    async fn subscribe_table(&self, opening: &Opening<'_>, table: String) -> Result<SubscriptionHandle, Refusal> {
        let target = Target::Table(table);
        self.may_read(&target)?;
        let storage = self.broker.engine.followed_stream(&target).await.map_err(|_| Refusal::Unavailable)?;
        // Rows as they are now even when none are sent: the changes follow from exactly there.
        let start = opening.start(&storage, Start::Snapshot);
        let Opened { stream, snapshot, cursor } = self.open(opening, &target, Filter::default(), start).await?;
        let rows = match snapshot {
            Some(Snapshot::Rows(rows)) if opening.send_retained => rows,
            _ => Vec::new(),
        };
        let name = stream.name();
        let retained = rows
            .into_iter()
            .map(|row| (format!("{name}/{}", row.id), row.json))
            .filter(|(topic, _)| opening.parsed.matches(topic))
            .map(|(topic, payload)| Retained { topic, payload, headers: Headers::default() })
            .collect();
        let mut follower = opening.follower(
            &self.broker,
            &self.principal,
            Sink::Connection(self.deliveries.clone()),
            Filter::default(),
        );
        follower.topic_filter = Some(opening.parsed.clone());
        let task = tokio::spawn(async move {
            if follower.send_retained(retained).await {
                follower.follow(stream, cursor).await;
            }
        });
        Ok(SubscriptionHandle::new(Some(task), None, opening.stored(false, false), opening.progress.clone()))
    }

    /// `views/{v}/{key}` (or `views/{v}/+`, `views/{v}/#`): the view's current rows first, as
    /// retained messages, then each change (the row with `"final"`), topic `views/{v}/{key}`.
    async fn subscribe_view(&self, opening: &Opening<'_>, view: String) -> Result<SubscriptionHandle, Refusal> {
        let target = Target::View { view: view.clone(), key: None };
        self.may_read(&target)?;
        let output = self.broker.engine.followed_stream(&target).await.map_err(|_| Refusal::Unavailable)?;
        let fresh = if opening.send_retained { Start::Snapshot } else { Start::At(Position::Latest) };
        let start = opening.start(&output, fresh);
        let filter = Filter::subject(opening.parsed.clone());
        let Opened { stream, snapshot, cursor } = self.open(opening, &target, filter.clone(), start).await?;
        let retained = match snapshot {
            Some(Snapshot::ViewRows(keys)) => keys
                .into_iter()
                .flat_map(|(key, rows)| {
                    let topic = format!("views/{view}/{key}");
                    rows.into_iter().map(move |row| Retained {
                        topic: topic.clone(),
                        payload: Bytes::from(row.to_string()),
                        headers: Headers::default(),
                    })
                })
                .collect(),
            _ => Vec::new(),
        };
        let follower =
            opening.follower(&self.broker, &self.principal, Sink::Connection(self.deliveries.clone()), filter);
        let task = tokio::spawn(async move {
            if follower.send_retained(retained).await {
                follower.follow(stream, cursor).await;
            }
        });
        Ok(SubscriptionHandle::new(Some(task), None, opening.stored(false, false), opening.progress.clone()))
    }

    /// Any other filter: the retained messages it matches, then every stream it can find
    /// messages in, from now or from where a persistent session left off (a stream it did not
    /// know yet was created since: everything in it is new).
    fn subscribe_streams(&self, opening: &Opening<'_>) -> Result<SubscriptionHandle, Refusal> {
        let streams = match Streams::of(&self.broker, &opening.parsed) {
            Ok(streams) => streams,
            Err((refusal, reason)) => {
                let filter = &opening.filter;
                tracing::debug!(client_id = %self.client_id, filter, reason, "subscription refused");
                return Err(refusal);
            }
        };
        self.may_follow(&streams, &opening.filter)?;
        let request = &opening.request;
        let mut retained =
            if opening.send_retained { self.broker.retained.matching(&opening.parsed) } else { Vec::new() };
        retained.retain(|(stream, message)| {
            super::routing::may_read_retained(&self.broker.engine, &self.principal, stream, &message.topic)
        });
        let retained: Vec<Retained> = retained.into_iter().map(|(_, message)| message).collect();
        let sink = Sink::Connection(self.deliveries.clone());
        let mut follower =
            opening.follower(&self.broker, &self.principal, sink, Filter::subject(opening.parsed.clone()));
        follower.retain_as_published = request.retain_as_published;
        follower.no_local_client = request.no_local.then(|| self.client_id.clone());
        let start_of = |stream: &Stream| match opening.resume {
            None => stream.end_offsets(),
            Some(resume) => resume_positions(stream, resume.positions.get(stream.name())),
        };
        let (changes, starts) = streams.starts(&self.broker, start_of);
        let task = tokio::spawn(async move {
            if follower.send_retained(retained).await {
                follower.follow_streams(streams, starts, changes).await;
            }
        });
        let stored = opening.stored(request.retain_as_published, request.no_local);
        Ok(SubscriptionHandle::new(Some(task), None, stored, opening.progress.clone()))
    }

    /// `$share/{group}/{filter}`: joins the group; each message matching the filter goes to
    /// one member (round robin, skipping members whose queue is full).
    fn subscribe_shared(&mut self, full: &str, shared: &str, qos: QoS, subscription_id: Option<NonZeroU32>) -> Granted {
        let Some((group, filter)) = shared.split_once('/') else { return Err(Refusal::TopicInvalid) };
        if group.is_empty() || group.contains(['+', '#']) {
            return Err(Refusal::TopicInvalid);
        }
        let parsed = SubjectFilter::parse(filter).map_err(|_| Refusal::TopicInvalid)?;
        let streams = Streams::of(&self.broker, &parsed).map_err(|(refusal, _)| refusal)?;
        // A group's follower reads as the member that started it, for every member: each must
        // be able to read everything the filter reaches.
        self.may_follow_all(&streams, full)?;
        let member_id = self.broker.next_connection.fetch_add(1, Ordering::Relaxed);
        let member = Member { id: member_id, deliveries: self.deliveries.clone(), qos, subscription_id };
        let broker = self.broker.clone();
        let principal = self.principal.clone();
        self.broker.groups.join(full, member, |group| {
            let follower = Follower {
                broker: broker.clone(),
                principal,
                filter: Filter::subject(parsed),
                sink: Sink::Group(group),
                qos: QoS::ExactlyOnce,
                subscription_id: None,
                retain_as_published: false,
                progress: None,
                resumed: None,
                topic_filter: None,
                no_local_client: None,
            };
            let (changes, starts) = streams.starts(&broker, Stream::end_offsets);
            tokio::spawn(async move { follower.follow_streams(streams, starts, changes).await })
        });
        let stored = StoredSubscription {
            filter: full.to_string(),
            qos: qos_rank(qos),
            subscription_id: subscription_id.map(NonZeroU32::get),
            ..StoredSubscription::default()
        };
        let membership = Some((self.broker.clone(), full.to_string(), member_id));
        self.handles.insert(full.to_string(), SubscriptionHandle::new(None, membership, stored, None));
        Ok(qos)
    }
}

/// Where a resumed subscription starts in `stream`: the stored positions (kept within what the
/// stream still holds), or its beginning when the session never saw it.
fn resume_positions(stream: &Stream, stored: Option<&Vec<u64>>) -> Vec<u64> {
    (0..stream.partition_count())
        .map(|partition| {
            let (Ok(start), Ok(end)) = (stream.start_offset(partition), stream.end_offset(partition)) else { return 0 };
            let stored = stored.and_then(|positions| positions.get(partition as usize)).copied();
            stored.unwrap_or(0).clamp(start, end)
        })
        .collect()
}

/// A subscription of a connection: its follower task, or its place in a shared group. Dropping
/// it (unsubscribe, resubscribe, disconnect) stops the one and leaves the other. The
/// `mqtt_subscriptions` gauge counts the handles alive, so it follows every way one ends.
struct SubscriptionHandle {
    task: Option<JoinHandle<()>>,
    membership: Option<(Arc<Broker>, String, u64)>,
    /// What a persistent session stores of it.
    spec: StoredSubscription,
    progress: Option<SharedProgress>,
}

impl SubscriptionHandle {
    fn new(
        task: Option<JoinHandle<()>>,
        membership: Option<(Arc<Broker>, String, u64)>,
        spec: StoredSubscription,
        progress: Option<SharedProgress>,
    ) -> SubscriptionHandle {
        metrics::gauge!("mqtt_subscriptions").increment(1.0);
        SubscriptionHandle { task, membership, spec, progress }
    }

    /// What a persistent session stores of it now.
    fn stored(&self) -> StoredSubscription {
        let mut spec = self.spec.clone();
        if let Some(progress) = &self.progress {
            let progress = progress.lock().expect("progress lock");
            spec.positions = progress.committed();
            spec.sent = progress.sent();
            spec.unacked = Some(progress.unacked());
        }
        spec
    }
}

impl Drop for SubscriptionHandle {
    fn drop(&mut self) {
        metrics::gauge!("mqtt_subscriptions").decrement(1.0);
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some((broker, key, member)) = self.membership.take() {
            broker.groups.leave(&key, member);
        }
    }
}
