//! The subscription hub: every committed record is read once per partition and routed to the
//! subscriptions that match it.
//!
//! One tailer task per partition of a subscribed stream waits on the partition's end offset
//! (woken by commits, never polling), reads the new records and routes each through the
//! stream's index. Each subscription is filed under one anchor of its [`Filter`]: its record key
//! (a table row), else the typed keys of one `field=value` condition, else its subject pattern
//! (in a [`SubjectTrie`]); a record looks up only the anchors it has, so routing costs what the
//! matches cost. Only subscriptions with no anchor at all are visited one by one. A matching
//! record is shared (`Arc<Event>`) by every subscriber, so each wire format encodes it once per
//! kind of change ([`Event::encoded`]).
//!
//! Table changes carry the row before the change (see [`crate::table`]), so a subscription to
//! `customer=42` learns when a row enters the set (`Insert`), changes in it (`Update`) or leaves
//! it (`Delete`), whether the row was deleted or its customer changed.
//!
//! Every subscriber has a bounded queue. When it is full the subscriber is cut off (the tailer
//! never waits for anyone): its consumer drains what was queued and then learns, with
//! [`Delivery::Overflow`], that it must resume from its last position. Server memory does not
//! grow with slow readers.
//!
//! A [`Cursor`] turns this into a gap-free, duplicate-free sequence from any start position:
//! it reads the log up to the end, registers with the hub, reads the gap up to the end offset
//! seen *after* registering, then takes live events from at or after that offset. Any record at
//! or past it was committed after the registration, so the tailer routes it to the queue.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use bytes::Bytes;
use onehop_log::{ReadAhead, Record};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::EngineError;
use crate::filter::{self, Filter, for_each_key};
use crate::stream::Stream;
use crate::subject::{SubjectFilter, SubjectTrie};
use crate::table::{TableOp, op_name, table_op};

/// Records a tailer reads per wake-up, bounding its memory.
const TAIL_BATCH_RECORDS: usize = 1024;
const TAIL_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Records a cursor reads from the log per step while catching up.
const CATCH_UP_BATCH_RECORDS: usize = 256;

/// What a delivered record means to the subscription that receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A stream record.
    Record,
    /// A table row entered the subscription's set (created, or changed to match).
    Insert,
    /// A row in the set changed and still matches.
    Update,
    /// A row left the set (deleted, or changed to no longer match).
    Delete,
}

impl Change {
    pub fn as_str(self) -> &'static str {
        match self {
            Change::Record => "record",
            Change::Insert => "insert",
            Change::Update => "update",
            Change::Delete => "delete",
        }
    }
}

/// A committed record on its way to subscribers, shared by all of them.
pub struct Event {
    pub stream: Arc<str>,
    pub partition: u32,
    pub record: Record,
    /// Whether the record is a table change (a row, with the row before it in a header).
    pub table: bool,
    /// The value as a JSON object, parsed on first use.
    doc: OnceLock<Option<Value>>,
    /// For a table change, the row before it, rebuilt on first use.
    before: OnceLock<Option<Value>>,
    /// The record encoded once per kind of change (as JSON, by the front ends), shared by every
    /// subscriber and every wire format, which only add their own framing around it.
    encoded: [OnceLock<Bytes>; 4],
}

impl Event {
    pub fn new(stream: Arc<str>, partition: u32, record: Record, table: bool) -> Self {
        Event {
            stream,
            partition,
            record,
            table,
            doc: OnceLock::new(),
            before: OnceLock::new(),
            encoded: Default::default(),
        }
    }

    /// The event encoded by `encode` for `change`, computed once and shared. Every caller must
    /// pass the same encoding (the server's record JSON); framings differ, the bytes do not.
    pub fn encoded(&self, change: Change, encode: impl FnOnce(&Event, Change) -> Bytes) -> Bytes {
        self.encoded[change as usize].get_or_init(|| encode(self, change)).clone()
    }

    /// The value as a JSON object, if it is one.
    pub fn doc(&self) -> Option<&Value> {
        self.doc.get_or_init(|| self.record.value.as_deref().and_then(filter::parse_object)).as_ref()
    }

    /// For a table change, the row before it (`None` for a new row).
    pub fn before(&self) -> Option<&Value> {
        self.before
            .get_or_init(|| {
                if !self.table {
                    return None;
                }
                match table_op(&self.record)? {
                    TableOp::Insert => None,
                    TableOp::Update(prev) => {
                        let after = self.doc()?.as_object()?;
                        filter::previous_row(after, &prev).map(Value::Object)
                    }
                    TableOp::Delete(before) => Some(before),
                }
            })
            .as_ref()
    }

    /// The subject filters see this record under: its own, or, for a stream's record without
    /// one (a Kafka record without `onehop-subject`, an HTTP publish without `?subject=`), the
    /// stream's name, the topic MQTT delivers it on ([`record_subject`]). A table's row has
    /// only its own.
    pub fn subject(&self) -> Option<&str> {
        record_subject(&self.stream, &self.record, self.table)
    }

    /// What this record is to a subscription with `filter`, or `None` if it does not concern it.
    /// The value is parsed (and a table row's previous state rebuilt) only for filters with
    /// field conditions.
    pub fn classify(&self, filter: &Filter) -> Option<Change> {
        let key = self.record.key.as_deref();
        let subject = self.subject();
        let fields = !filter.conditions.is_empty();
        let doc = || if fields { self.doc() } else { None };
        if !self.table {
            return filter.matches(key, subject, doc()).then_some(Change::Record);
        }
        let now = self.record.value.is_some() && filter.matches(key, subject, doc());
        let was = if fields {
            self.before().is_some_and(|before| filter.matches(key, subject, Some(before)))
        } else {
            matches!(op_name(&self.record), Some(b"update" | b"delete")) && filter.matches(key, subject, None)
        };
        match (was, now) {
            (false, true) => Some(Change::Insert),
            (true, true) => Some(Change::Update),
            (true, false) => Some(Change::Delete),
            (false, false) => None,
        }
    }
}

struct Subscriber {
    filter: Arc<Filter>,
    sender: mpsc::Sender<(Arc<Event>, Change)>,
    /// Set when the queue was full: nothing more is sent, the consumer is told after draining.
    overflowed: Arc<AtomicBool>,
}

impl Subscriber {
    /// Queues `event` if it concerns this subscription.
    fn offer(&self, event: &Arc<Event>) {
        if self.overflowed.load(Ordering::Relaxed) {
            return;
        }
        let Some(change) = event.classify(&self.filter) else { return };
        if let Err(mpsc::error::TrySendError::Full(_)) = self.sender.try_send((event.clone(), change)) {
            self.overflowed.store(true, Ordering::Relaxed);
            metrics::counter!("hub_subscribers_overflowed_total").increment(1);
        }
    }
}

/// Where a subscription is filed in the index.
#[derive(Clone)]
enum Anchor {
    Key(Bytes),
    /// A `field=value` condition: the field's path and the typed keys it may have.
    Field {
        path: String,
        keys: Vec<String>,
    },
    Subject(SubjectFilter),
    None,
}

impl Anchor {
    fn of(filter: &Filter) -> Anchor {
        if let Some(key) = &filter.key {
            Anchor::Key(key.clone())
        } else if let Some(condition) = filter.conditions.first() {
            Anchor::Field { path: condition.path.clone(), keys: condition.keys().to_vec() }
        } else if let Some(subject) = &filter.subject {
            Anchor::Subject(subject.clone())
        } else {
            Anchor::None
        }
    }
}

/// The subscriptions anchored on one field, by typed key.
#[derive(Default)]
struct FieldAnchors {
    condition: Option<filter::Condition>,
    by_key: HashMap<String, HashMap<u64, Subscriber>>,
}

#[derive(Default)]
struct Index {
    by_key: HashMap<Bytes, HashMap<u64, Subscriber>>,
    by_field: HashMap<String, FieldAnchors>,
    by_subject: SubjectTrie<Subscriber>,
    /// Subscriptions with no anchor: every record is offered to each.
    unanchored: HashMap<u64, Subscriber>,
}

impl Index {
    fn insert(&mut self, anchor: &Anchor, id: u64, subscriber: Subscriber) {
        match anchor {
            Anchor::Key(key) => {
                self.by_key.entry(key.clone()).or_default().insert(id, subscriber);
            }
            Anchor::Field { path, keys } => {
                let anchors = self.by_field.entry(path.clone()).or_default();
                if anchors.condition.is_none() {
                    anchors.condition = Some(filter::Condition::new(path, "").expect("validated when parsed"));
                }
                // One subscriber per typed key; they share the filter and the queue.
                for key in keys {
                    let copy = Subscriber {
                        filter: subscriber.filter.clone(),
                        sender: subscriber.sender.clone(),
                        overflowed: subscriber.overflowed.clone(),
                    };
                    anchors.by_key.entry(key.clone()).or_default().insert(id, copy);
                }
            }
            Anchor::Subject(filter) => self.by_subject.insert(filter, id, subscriber),
            Anchor::None => {
                self.unanchored.insert(id, subscriber);
            }
        }
    }

    fn remove(&mut self, anchor: &Anchor, id: u64) {
        match anchor {
            Anchor::Key(key) => {
                if let Some(subscribers) = self.by_key.get_mut(key) {
                    subscribers.remove(&id);
                    if subscribers.is_empty() {
                        self.by_key.remove(key);
                    }
                }
            }
            Anchor::Field { path, keys } => {
                if let Some(anchors) = self.by_field.get_mut(path) {
                    for key in keys {
                        if let Some(subscribers) = anchors.by_key.get_mut(key) {
                            subscribers.remove(&id);
                            if subscribers.is_empty() {
                                anchors.by_key.remove(key);
                            }
                        }
                    }
                    if anchors.by_key.is_empty() {
                        self.by_field.remove(path);
                    }
                }
            }
            Anchor::Subject(filter) => {
                self.by_subject.remove(filter, id);
            }
            Anchor::None => {
                self.unanchored.remove(&id);
            }
        }
    }
}

/// Routing state of one stream.
struct Routes {
    stream: Arc<Stream>,
    name: Arc<str>,
    /// Read by the tailers on every record, written when subscriptions come and go.
    index: RwLock<Index>,
}

impl Routes {
    fn route(&self, event: &Arc<Event>) {
        let index = self.index.read().expect("hub index lock");
        if let Some(key) = &event.record.key
            && let Some(subscribers) = index.by_key.get(key)
        {
            subscribers.values().for_each(|subscriber| subscriber.offer(event));
        }
        for anchors in index.by_field.values() {
            let condition = anchors.condition.as_ref().expect("set on insert");
            // The field's typed keys now and, for a table change, before: a subscription whose
            // row left its set must hear of it.
            let mut keys: Vec<String> = Vec::new();
            for doc in [event.doc(), event.before()].into_iter().flatten() {
                if let Some(value) = condition.field(doc) {
                    for_each_key(value, |key| keys.push(key.to_string()));
                }
            }
            if keys.len() > 1 {
                keys.sort_unstable();
                keys.dedup();
            }
            // A subscriber filed under several typed keys (`s:42` and `n:42`) is offered the
            // event once.
            let mut offered: Vec<u64> = Vec::new();
            for key in &keys {
                let Some(subscribers) = anchors.by_key.get(key) else { continue };
                for (id, subscriber) in subscribers {
                    if keys.len() > 1 {
                        if offered.contains(id) {
                            continue;
                        }
                        offered.push(*id);
                    }
                    subscriber.offer(event);
                }
            }
        }
        if let Some(subject) = event.subject() {
            index.by_subject.for_each_match(subject, |_, subscriber| subscriber.offer(event));
        }
        for subscriber in index.unanchored.values() {
            subscriber.offer(event);
        }
    }
}

/// The subject a record of `stream` is filtered under (see [`Event::subject`]): reads that
/// filter by subject and subscriptions agree on it.
pub fn record_subject<'a>(stream: &'a str, record: &'a Record, table: bool) -> Option<&'a str> {
    match (&record.subject, table) {
        (Some(subject), _) => Some(subject.as_str()),
        (None, false) => Some(stream),
        (None, true) => None,
    }
}

/// The hub of all streams' subscriptions.
pub struct Hub {
    routes: Mutex<HashMap<String, Arc<Routes>>>,
    next_id: AtomicU64,
    /// Events a subscriber may have queued before it is cut off.
    queue_capacity: usize,
}

impl Hub {
    pub fn new(queue_capacity: usize) -> Self {
        assert!(queue_capacity > 0, "a subscriber queue holds at least one event");
        Hub { routes: Mutex::new(HashMap::new()), next_id: AtomicU64::new(1), queue_capacity }
    }

    /// The routes of `stream`, starting its tailers the first time.
    fn routes(&self, stream: &Arc<Stream>) -> Arc<Routes> {
        let mut all = self.routes.lock().expect("hub routes lock");
        if let Some(routes) = all.get(stream.name())
            && Arc::ptr_eq(&routes.stream, stream)
        {
            return routes.clone();
        }
        let routes = Arc::new(Routes {
            stream: stream.clone(),
            name: Arc::from(stream.name()),
            index: RwLock::new(Index::default()),
        });
        for partition in 0..stream.partition_count() {
            // The start is fixed here, before any subscription registers: a tailer that read it
            // when it first ran could skip records committed in between.
            let Ok(log) = stream.partition(partition).cloned() else { continue };
            let start = log.end_offset();
            tokio::spawn(tail(routes.clone(), partition, log, start));
        }
        all.insert(stream.name().to_string(), routes.clone());
        routes
    }

    /// Registers a live subscription to `stream` (records matching `filter`).
    fn subscribe(&self, stream: &Arc<Stream>, filter: Arc<Filter>) -> Subscription {
        let routes = self.routes(stream);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel(self.queue_capacity);
        let overflowed = Arc::new(AtomicBool::new(false));
        let anchor = Anchor::of(&filter);
        let subscriber = Subscriber { filter, sender, overflowed: overflowed.clone() };
        routes.index.write().expect("hub index lock").insert(&anchor, id, subscriber);
        metrics::gauge!("hub_subscriptions").increment(1.0);
        Subscription { id, routes, anchor, receiver, overflowed }
    }
}

/// Reads each committed record of one partition once and routes it. Ends when the partition
/// closes.
async fn tail(routes: Arc<Routes>, partition: u32, log: Arc<onehop_log::Partition>, start: u64) {
    let mut next = start;
    // A burst committed as one large batch is read from the file once, not once per pass.
    let mut ahead = ReadAhead::default();
    loop {
        if log.wait_for(next).await.is_err() {
            return;
        }
        let records = match log.read_next(next, TAIL_BATCH_RECORDS, TAIL_BATCH_BYTES, &mut ahead) {
            Ok(records) => records,
            Err(error) => {
                tracing::error!(stream = %routes.name, partition, %error, "the hub cannot read the log; stopping this tailer");
                return;
            }
        };
        let table = routes.stream.is_table();
        for record in records {
            // A burst is read without waiting: counted like a channel receive, so the tailer
            // lets the tasks queued behind it run every so often.
            tokio::task::consume_budget().await;
            next = record.offset + 1;
            let event = Arc::new(Event::new(routes.name.clone(), partition, record, table));
            routes.route(&event);
        }
    }
}

/// A live registration with the hub; unregisters when dropped.
struct Subscription {
    id: u64,
    routes: Arc<Routes>,
    anchor: Anchor,
    receiver: mpsc::Receiver<(Arc<Event>, Change)>,
    overflowed: Arc<AtomicBool>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.routes.index.write().expect("hub index lock").remove(&self.anchor, self.id);
        metrics::gauge!("hub_subscriptions").decrement(1.0);
    }
}

/// What a cursor yields.
pub enum Delivery {
    Event(Arc<Event>, Change),
    /// The subscriber fell too far behind and was cut off; `positions` is where it was
    /// (the next offset per partition), to resume from.
    Overflow {
        positions: Vec<u64>,
    },
}

enum Phase {
    /// Reading the log up to the end offsets seen when catching up began.
    CatchUp { targets: Vec<u64> },
    /// Registered; reading the log up to the end offsets seen after registering.
    Gap { thresholds: Vec<u64> },
    /// Taking events from the hub, skipping those below the thresholds.
    Live { thresholds: Vec<u64> },
}

/// What a subscription's principal was allowed to read when it opened, checked again whenever
/// access changes (a grant revoked, a user or token dropped) and when the principal's token
/// expires: a cursor no longer allowed ends with the refusal instead of its next record.
pub struct Authorization {
    access: Arc<crate::Access>,
    principal: crate::Principal,
    kind: crate::ObjectKind,
    name: String,
    subject: Option<String>,
    /// The access generation the last check read.
    generation: u64,
    changes: tokio::sync::watch::Receiver<u64>,
}

impl Authorization {
    pub(crate) fn new(
        access: Arc<crate::Access>,
        principal: crate::Principal,
        kind: crate::ObjectKind,
        name: &str,
        subject: Option<&str>,
    ) -> Authorization {
        let mut changes = access.changes();
        let generation = *changes.borrow_and_update();
        Authorization {
            access,
            principal,
            kind,
            name: name.to_string(),
            subject: subject.map(str::to_string),
            generation,
            changes,
        }
    }

    /// Checks again, when access changed since the last check or the token expired.
    fn check(&mut self) -> Result<(), EngineError> {
        let generation = self.access.generation();
        let expired = self.principal.expires_ms().is_some_and(|expires| crate::access::now_ms() >= expires);
        if generation == self.generation && !expired {
            return Ok(());
        }
        self.access.refresh(&mut self.principal)?;
        self.access.authorize_subscription(&self.principal, self.kind, &self.name, self.subject.as_deref())?;
        self.generation = generation;
        Ok(())
    }

    /// Resolves at the next change to access, or when the principal's token expires.
    async fn changed(&mut self) {
        let expiry = self.principal.expires_ms().map(|expires| {
            let left = expires.saturating_sub(crate::access::now_ms());
            tokio::time::Instant::now() + std::time::Duration::from_millis(left)
        });
        let expired = async {
            match expiry {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = self.changes.changed() => if changed.is_err() {
                // The engine is closing: no more changes.
                std::future::pending::<()>().await;
            },
            () = expired => {}
        }
    }
}

/// A subscription to a stream from given positions on: history from the log, then live events
/// from the hub, with no gap and no duplicate between the two.
pub struct Cursor {
    hub: Arc<Hub>,
    stream: Arc<Stream>,
    name: Arc<str>,
    table: bool,
    filter: Arc<Filter>,
    /// Per partition, the offset after the last record delivered (or passed over by the filter
    /// once nothing before it is still buffered): where a resume starts.
    positions: Vec<u64>,
    /// Per partition, the offset after the last record read from the log or the hub, delivered
    /// or still buffered.
    covered: Vec<u64>,
    phase: Phase,
    live: Option<Subscription>,
    buffer: VecDeque<(Arc<Event>, Change)>,
    /// Records read from the log per step while catching up.
    read_ahead: usize,
    /// Per partition, the rest of the batch the last step stopped in.
    ahead: Vec<ReadAhead>,
    /// When cut off by the hub: read on from the log (true) or yield [`Delivery::Overflow`].
    carry_on: bool,
    /// How many times this cursor fell behind the live feed and read on from the log.
    carried_on: u64,
    /// Checked before each delivery and on every change to access, when set.
    authorization: Option<Authorization>,
}

impl Cursor {
    /// A cursor over `stream` delivering records matching `filter` from `positions` (the next
    /// offset per partition) on.
    pub fn new(
        hub: Arc<Hub>,
        stream: Arc<Stream>,
        filter: Arc<Filter>,
        positions: Vec<u64>,
    ) -> Result<Cursor, EngineError> {
        if positions.len() != stream.partition_count() as usize {
            return Err(EngineError::InvalidDefinition(format!(
                "a position is needed for each of the {} partitions",
                stream.partition_count()
            )));
        }
        for (partition, &position) in positions.iter().enumerate() {
            let log = stream.partition(partition as u32)?;
            if position > log.end_offset() {
                return Err(onehop_log::ReadError::PastEnd { offset: position, end: log.end_offset() }.into());
            }
        }
        let targets = stream.end_offsets();
        let ahead = positions.iter().map(|_| ReadAhead::default()).collect();
        Ok(Cursor {
            hub,
            name: Arc::from(stream.name()),
            table: stream.is_table(),
            stream,
            filter,
            covered: positions.clone(),
            positions,
            phase: Phase::CatchUp { targets },
            live: None,
            buffer: VecDeque::new(),
            read_ahead: CATCH_UP_BATCH_RECORDS,
            ahead,
            carry_on: false,
            carried_on: 0,
            authorization: None,
        })
    }

    /// Reads `records` per step while catching up instead of the default few hundred: for one
    /// reader replaying much (a view, a transform), fewer passes over large batches. Memory is
    /// still bounded by the bytes read per step.
    pub fn read_ahead(mut self, records: usize) -> Cursor {
        self.read_ahead = records.max(1);
        self
    }

    /// Never yields [`Delivery::Overflow`]: when the hub cuts this cursor off, it reads on from
    /// the log where it left off and registers again once it has caught up. A burst then costs
    /// a slow reader time, not a reconnection, and the server still holds no more than the
    /// bounded queue plus one read step for it.
    pub fn carry_on(mut self) -> Cursor {
        self.carry_on = true;
        self
    }

    /// Delivers only while `authorization` holds: once it no longer does, [`Cursor::next`]
    /// answers the refusal.
    pub(crate) fn authorized(mut self, authorization: Authorization) -> Cursor {
        self.authorization = Some(authorization);
        self
    }

    /// How many times this cursor fell behind the live feed and read on from the log.
    pub fn carried_on(&self) -> u64 {
        self.carried_on
    }

    /// The next offset to deliver, per partition: where to resume after the last delivery.
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    /// Reads up to `limits` from the log into the buffer; true when every partition reached
    /// its limit.
    fn read_log(&mut self, limits: &[u64]) -> Result<bool, EngineError> {
        let mut done = true;
        for (partition, &limit) in limits.iter().enumerate() {
            let from = self.covered[partition];
            if from >= limit {
                continue;
            }
            let log = self.stream.partition(partition as u32)?;
            let records = log.read_next(from, self.read_ahead, TAIL_BATCH_BYTES, &mut self.ahead[partition])?;
            for record in records {
                if record.offset >= limit {
                    break;
                }
                self.covered[partition] = record.offset + 1;
                let event = Event::new(self.name.clone(), partition as u32, record, self.table);
                if let Some(change) = event.classify(&self.filter) {
                    self.buffer.push_back((Arc::new(event), change));
                }
            }
            // A compacted partition may have no record left below the limit.
            if self.covered[partition] == from {
                self.covered[partition] = limit;
            }
            done &= self.covered[partition] >= limit;
        }
        if self.buffer.is_empty() {
            // Everything read was passed over by the filter: a resume need not read it again.
            self.positions.clone_from(&self.covered);
        }
        Ok(done)
    }

    /// Moves on to the stream's successor (it gained partitions): the new partitions are read
    /// from their start, the others from what was delivered, as after falling behind.
    fn follow_successor(&mut self) {
        while let Some(next) = self.stream.successor().cloned() {
            let count = next.partition_count() as usize;
            self.positions.resize(count, 0);
            self.covered.clone_from(&self.positions);
            self.ahead.resize_with(count, ReadAhead::default);
            self.buffer.clear();
            self.live = None;
            self.phase = Phase::CatchUp { targets: next.end_offsets() };
            self.stream = next;
        }
    }

    /// The next matching record, waiting for one to be committed if need be.
    pub async fn next(&mut self) -> Result<Delivery, EngineError> {
        loop {
            if let Some(authorization) = &mut self.authorization {
                authorization.check()?;
            }
            if self.stream.successor().is_some() {
                self.follow_successor();
            }
            if !self.buffer.is_empty() {
                // Records read from the log are ready at once and cost the scheduler nothing:
                // without this, a reader working through a backlog (a burst of window finals,
                // a replay) would keep its worker thread for as long as the backlog lasts and
                // hold up every task queued behind it. Taking from the hub's channel counts the
                // same way.
                tokio::task::consume_budget().await;
            }
            if let Some((event, change)) = self.buffer.pop_front() {
                self.positions[event.partition as usize] = event.record.offset + 1;
                if self.buffer.is_empty() {
                    self.positions.clone_from(&self.covered);
                }
                return Ok(Delivery::Event(event, change));
            }
            match &self.phase {
                Phase::CatchUp { targets } => {
                    let targets = targets.clone();
                    if self.read_log(&targets)? {
                        self.live = Some(self.hub.subscribe(&self.stream, self.filter.clone()));
                        self.phase = Phase::Gap { thresholds: self.stream.end_offsets() };
                    }
                }
                Phase::Gap { thresholds } => {
                    let thresholds = thresholds.clone();
                    if self.read_log(&thresholds)? {
                        self.phase = Phase::Live { thresholds };
                        // Live events come from the hub: a batch kept for reading on is not
                        // needed, and would stay in memory for as long as the subscription.
                        self.ahead.iter_mut().for_each(|ahead| *ahead = ReadAhead::default());
                    }
                }
                Phase::Live { thresholds } => {
                    let live = self.live.as_mut().expect("registered before going live");
                    // Cut off, and everything queued before that delivered: say where to resume.
                    if live.overflowed.load(Ordering::Relaxed) && live.receiver.is_empty() {
                        if !self.carry_on {
                            return Ok(Delivery::Overflow { positions: self.positions.clone() });
                        }
                        // Live, everything delivered is everything covered: read on from there.
                        metrics::counter!("hub_subscribers_carried_on_from_log_total").increment(1);
                        self.carried_on += 1;
                        self.live = None;
                        self.covered.clone_from(&self.positions);
                        self.phase = Phase::CatchUp { targets: self.stream.end_offsets() };
                        continue;
                    }
                    // An event queued already is taken at once; only a wait also watches for
                    // the stream gaining partitions (its handover wakes the wait). The budget
                    // is taken before the event, never between taking it and returning it: a
                    // caller that drops this future (a `select!`) must not lose one.
                    tokio::task::consume_budget().await;
                    let received = match live.receiver.try_recv() {
                        Ok(received) => Some(received),
                        Err(mpsc::error::TryRecvError::Disconnected) => None,
                        Err(mpsc::error::TryRecvError::Empty) => {
                            let stream = self.stream.clone();
                            let superseded = stream.superseded();
                            if stream.successor().is_some() {
                                continue;
                            }
                            let access_changed = async {
                                match &mut self.authorization {
                                    Some(authorization) => authorization.changed().await,
                                    None => std::future::pending().await,
                                }
                            };
                            tokio::select! {
                                received = live.receiver.recv() => received,
                                () = superseded => continue,
                                // Checked again at the top of the loop.
                                () = access_changed => continue,
                            }
                        }
                    };
                    let Some((event, change)) = received else {
                        return Err(EngineError::Read(onehop_log::ReadError::Closed));
                    };
                    let partition = event.partition as usize;
                    let offset = event.record.offset;
                    if offset < thresholds[partition] || offset < self.covered[partition] {
                        continue;
                    }
                    self.covered[partition] = offset + 1;
                    self.positions[partition] = offset + 1;
                    return Ok(Delivery::Event(event, change));
                }
            }
        }
    }
}
