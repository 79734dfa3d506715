//! The subscription hub: every committed record is read once per partition and routed to the
//! subscriptions that match it.
//!
//! One tailer task per partition of a subscribed stream waits on the partition's end offset
//! (woken by commits, never polling), reads the new records and routes each through the
//! stream's index: subscriptions with a subject filter live in a [`SubjectTrie`], so finding
//! them costs what the matches cost; only subscriptions with no filter are visited one by one.
//! A matching record is shared (`Arc<Event>`) by every subscriber, so each wire format encodes it
//! once ([`Event::encoded`]).
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
use onehop_log::Record;
use tokio::sync::mpsc;

use crate::error::EngineError;
use crate::stream::Stream;
use crate::subject::{SubjectFilter, SubjectTrie};

/// Records a tailer reads per wake-up, bounding its memory.
const TAIL_BATCH_RECORDS: usize = 1024;
const TAIL_BATCH_BYTES: usize = 4 * 1024 * 1024;
/// Records a cursor reads from the log per step while catching up.
const CATCH_UP_BATCH_RECORDS: usize = 256;

/// A committed record on its way to subscribers, shared by all of them.
pub struct Event {
    pub stream: Arc<str>,
    pub partition: u32,
    pub record: Record,
    /// The record encoded once (as JSON, by the front ends), shared by every subscriber and
    /// every wire format, which only add their own framing around it.
    encoded: OnceLock<Bytes>,
}

impl Event {
    pub fn new(stream: Arc<str>, partition: u32, record: Record) -> Self {
        Event { stream, partition, record, encoded: OnceLock::new() }
    }

    /// The event encoded by `encode`, computed once and shared. Every caller must pass the same
    /// encoding (the server's record JSON); framings differ, the record bytes do not.
    pub fn encoded(&self, encode: impl FnOnce(&Event) -> Bytes) -> Bytes {
        self.encoded.get_or_init(|| encode(self)).clone()
    }
}

struct Subscriber {
    sender: mpsc::Sender<Arc<Event>>,
    /// Set when the queue was full: nothing more is sent, the consumer is told after draining.
    overflowed: Arc<AtomicBool>,
}

impl Subscriber {
    fn deliver(&self, event: &Arc<Event>) {
        if self.overflowed.load(Ordering::Relaxed) {
            return;
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = self.sender.try_send(event.clone()) {
            self.overflowed.store(true, Ordering::Relaxed);
            metrics::counter!("hub_subscribers_overflowed_total").increment(1);
        }
    }
}

#[derive(Default)]
struct Index {
    by_subject: SubjectTrie<Subscriber>,
    /// Subscriptions without a filter: every record goes to each.
    unfiltered: HashMap<u64, Subscriber>,
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
        if let Some(subject) = &event.record.subject {
            index.by_subject.for_each_match(subject, |_, subscriber| subscriber.deliver(event));
        }
        for subscriber in index.unfiltered.values() {
            subscriber.deliver(event);
        }
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

    /// Registers a live subscription to `stream` (records matching `filter`, or all).
    fn subscribe(&self, stream: &Arc<Stream>, filter: Option<SubjectFilter>) -> Subscription {
        let routes = self.routes(stream);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = mpsc::channel(self.queue_capacity);
        let overflowed = Arc::new(AtomicBool::new(false));
        let subscriber = Subscriber { sender, overflowed: overflowed.clone() };
        let mut index = routes.index.write().expect("hub index lock");
        match &filter {
            Some(filter) => index.by_subject.insert(filter, id, subscriber),
            None => {
                index.unfiltered.insert(id, subscriber);
            }
        }
        drop(index);
        metrics::gauge!("hub_subscriptions").increment(1.0);
        Subscription { id, routes, filter, receiver, overflowed }
    }
}

/// Reads each committed record of one partition once and routes it. Ends when the partition
/// closes.
async fn tail(routes: Arc<Routes>, partition: u32, log: Arc<onehop_log::Partition>, start: u64) {
    let mut next = start;
    loop {
        if log.wait_for(next).await.is_err() {
            return;
        }
        let records = match log.read(next, TAIL_BATCH_RECORDS, TAIL_BATCH_BYTES) {
            Ok(records) => records,
            Err(error) => {
                tracing::error!(stream = %routes.name, partition, %error, "the hub cannot read the log; stopping this tailer");
                return;
            }
        };
        for record in records {
            next = record.offset + 1;
            let event = Arc::new(Event::new(routes.name.clone(), partition, record));
            routes.route(&event);
        }
    }
}

/// A live registration with the hub; unregisters when dropped.
struct Subscription {
    id: u64,
    routes: Arc<Routes>,
    filter: Option<SubjectFilter>,
    receiver: mpsc::Receiver<Arc<Event>>,
    overflowed: Arc<AtomicBool>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut index = self.routes.index.write().expect("hub index lock");
        match &self.filter {
            Some(filter) => {
                index.by_subject.remove(filter, self.id);
            }
            None => {
                index.unfiltered.remove(&self.id);
            }
        }
        metrics::gauge!("hub_subscriptions").decrement(1.0);
    }
}

/// What a cursor yields.
pub enum Delivery {
    Event(Arc<Event>),
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

/// A subscription to a stream from given positions on: history from the log, then live events
/// from the hub, with no gap and no duplicate between the two.
pub struct Cursor {
    hub: Arc<Hub>,
    stream: Arc<Stream>,
    name: Arc<str>,
    filter: Option<SubjectFilter>,
    /// Per partition, the offset after the last record delivered (or passed over by the filter
    /// once nothing before it is still buffered): where a resume starts.
    positions: Vec<u64>,
    /// Per partition, the offset after the last record read from the log or the hub, delivered
    /// or still buffered.
    covered: Vec<u64>,
    phase: Phase,
    live: Option<Subscription>,
    buffer: VecDeque<Arc<Event>>,
}

impl Cursor {
    /// A cursor over `stream` delivering records matching `filter` from `positions` (the next
    /// offset per partition) on.
    pub fn new(
        hub: Arc<Hub>,
        stream: Arc<Stream>,
        filter: Option<SubjectFilter>,
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
        let targets = end_offsets(&stream);
        Ok(Cursor {
            hub,
            name: Arc::from(stream.name()),
            stream,
            filter,
            covered: positions.clone(),
            positions,
            phase: Phase::CatchUp { targets },
            live: None,
            buffer: VecDeque::new(),
        })
    }

    /// The next offset to deliver, per partition: where to resume after the last delivery.
    pub fn positions(&self) -> &[u64] {
        &self.positions
    }

    fn matches(&self, record: &Record) -> bool {
        match &self.filter {
            None => true,
            Some(filter) => record.subject.as_deref().is_some_and(|subject| filter.matches(subject)),
        }
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
            let records = log.read(from, CATCH_UP_BATCH_RECORDS, TAIL_BATCH_BYTES)?;
            for record in records {
                if record.offset >= limit {
                    break;
                }
                self.covered[partition] = record.offset + 1;
                if self.matches(&record) {
                    self.buffer.push_back(Arc::new(Event::new(self.name.clone(), partition as u32, record)));
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

    /// The next matching record, waiting for one to be committed if need be.
    pub async fn next(&mut self) -> Result<Delivery, EngineError> {
        loop {
            if let Some(event) = self.buffer.pop_front() {
                self.positions[event.partition as usize] = event.record.offset + 1;
                if self.buffer.is_empty() {
                    self.positions.clone_from(&self.covered);
                }
                return Ok(Delivery::Event(event));
            }
            match &self.phase {
                Phase::CatchUp { targets } => {
                    let targets = targets.clone();
                    if self.read_log(&targets)? {
                        self.live = Some(self.hub.subscribe(&self.stream, self.filter.clone()));
                        self.phase = Phase::Gap { thresholds: end_offsets(&self.stream) };
                    }
                }
                Phase::Gap { thresholds } => {
                    let thresholds = thresholds.clone();
                    if self.read_log(&thresholds)? {
                        self.phase = Phase::Live { thresholds };
                    }
                }
                Phase::Live { thresholds } => {
                    let live = self.live.as_mut().expect("registered before going live");
                    // Cut off, and everything queued before that delivered: say where to resume.
                    if live.overflowed.load(Ordering::Relaxed) && live.receiver.is_empty() {
                        return Ok(Delivery::Overflow { positions: self.positions.clone() });
                    }
                    let Some(event) = live.receiver.recv().await else {
                        return Err(EngineError::Read(onehop_log::ReadError::Closed));
                    };
                    let partition = event.partition as usize;
                    let offset = event.record.offset;
                    if offset < thresholds[partition] || offset < self.covered[partition] {
                        continue;
                    }
                    self.covered[partition] = offset + 1;
                    self.positions[partition] = offset + 1;
                    return Ok(Delivery::Event(event));
                }
            }
        }
    }
}

fn end_offsets(stream: &Stream) -> Vec<u64> {
    (0..stream.partition_count())
        .map(|partition| stream.partition(partition).map_or(0, |log| log.end_offset()))
        .collect()
}
