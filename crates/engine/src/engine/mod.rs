//! The engine: opens the catalog, replays it, opens every defined stream and table, and serves
//! definitions and data to the front ends. Streams and tables share one namespace (a name is
//! one log topic).
//!
//! - `mod.rs`: the options, the engine itself and its lock order, opening it.
//! - `access`: users, roles, grants and tokens, defined through the catalog.
//! - `orphans`: topics the catalog does not define: drops finished, orphans kept and adopted.
//! - `streams`: stream definitions, their partitions, subscribing to them.
//! - `tables`: table definitions and indexes.
//! - `views`: views and transforms, their checkpoints and sources.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use onehop_log::{Durability, Log, LogOptions, Partition, PartitionConfig, Record, RecoveryPolicy};

use crate::catalog::{self, CATALOG_TOPIC, StreamDef};
use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::{Cursor, Hub};
use crate::idempotency::Idempotency;
use crate::stream::{Position, Stream};
use crate::system::{SystemTopic, SystemTopicConfig};
use crate::table::Table;
use crate::tabledef::{IndexDef, TableDef, validate_field_name};
use crate::view::checkpoint::{self, CHECKPOINT_TOPIC, Restored};
use crate::view::join::JoinSource;
use crate::view::runtime::{self, OUTPUT_PREFIX};
use crate::view::transform::{self, TransformCheckpoint};
use crate::view::{JoinDef, Start, Transform, TransformDef, View, ViewDef};

mod access;
pub use access::{PASSWORD_BYTES_MAX, validate_grantee_name};
mod orphans;
pub(crate) mod replicated;
pub use replicated::{Replicator, Submitted};
mod streams;
pub use streams::Positions;
mod tables;
mod views;

/// How the engine creates what it creates.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Log settings of new streams (durability, sizes); a definition's own settings win.
    pub stream_defaults: PartitionConfig,
    /// Partitions of a stream created without saying how many.
    pub default_partitions: u32,
    /// Create a stream on its first publish instead of refusing the publish.
    pub auto_create: bool,
    /// Events a subscriber may have waiting before it is cut off (it can resume).
    pub subscriber_queue_capacity: usize,
    /// The stream of subjects whose first level is empty (`/devices/1`, common on devices):
    /// a subject's first level names its stream, and an empty name cannot ([`crate::route`]).
    pub empty_first_level_stream: String,
    /// A cluster node's engine ([`Engine::set_replicator`] follows the open): transforms do
    /// not run on their own here, only where the node leads.
    pub cluster_node: bool,
    /// How long a write's idempotency key answers its retries ([`crate::idempotency`]).
    pub idempotency_window: std::time::Duration,
    /// The most idempotency keys held: past it, the oldest are dropped before their window
    /// ends (each takes some 200 bytes of memory).
    pub idempotency_keys_max: usize,
    /// Bytes of rows one ad-hoc query may hold (for joins, groups, sorts and its answer).
    pub query_memory_bytes_max: u64,
    /// How long one ad-hoc query may run.
    pub query_time_max: std::time::Duration,
    /// Stream records one ad-hoc query may read.
    pub query_stream_records_max: u64,
    /// How often a view or transform checkpoints where it is while it runs, at most (Kafka
    /// Streams' `commit.interval.ms`): what a restart replays is about this long.
    pub checkpoint_interval: std::time::Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            stream_defaults: PartitionConfig::default(),
            default_partitions: 1,
            auto_create: true,
            subscriber_queue_capacity: 1024,
            empty_first_level_stream: "root".to_string(),
            cluster_node: false,
            idempotency_window: std::time::Duration::from_secs(24 * 3600),
            idempotency_keys_max: 1_000_000,
            query_memory_bytes_max: 256 * 1024 * 1024,
            query_time_max: std::time::Duration::from_secs(30),
            query_stream_records_max: 1_000_000,
            checkpoint_interval: std::time::Duration::from_secs(1),
        }
    }
}

/// The engine: the catalog, every open stream, table, view and transform, and the hub.
///
/// Lock order: `ddl` first. It is a tokio mutex held across the awaits of one definition
/// change (append to the catalog, open partitions, update the maps), so two changes never
/// interleave. The `RwLock`s (`streams`, `tables`, `routed`, `views`, `transforms`,
/// `orphans`) are leaves: each is held only for a lookup or an update of its own map, never
/// across an await and never while another of them is taken, so they cannot deadlock with
/// each other or with `ddl`. Publishing and subscribing take only read locks, one at a time.
pub struct Engine {
    log: Arc<Log>,
    options: EngineOptions,
    catalog: Arc<SystemTopic>,
    /// Read on every publish, written on every definition change.
    streams: RwLock<BTreeMap<String, Arc<Stream>>>,
    tables: RwLock<BTreeMap<String, Arc<Table>>>,
    /// Definition changes one at a time, so two creates of one name cannot both append.
    ddl: tokio::sync::Mutex<()>,
    hub: Arc<Hub>,
    /// Bumped whenever a stream is created or dropped, for followers of every stream.
    streams_changed: tokio::sync::watch::Sender<u64>,
    /// Bumped after every change to which streams, tables and views exist (see
    /// [`Engine::catalog_generation`]).
    catalog_generation: AtomicU64,
    /// The streams that declare an `mqtt_topic`, looked through on every MQTT publish.
    routed: RwLock<Vec<Arc<Stream>>>,
    views: RwLock<BTreeMap<String, Arc<View>>>,
    /// Transforms by name (the name of the stream each writes).
    transforms: RwLock<BTreeMap<String, Arc<Transform>>>,
    /// Where views and transforms checkpoint.
    checkpoints: Arc<SystemTopic>,
    /// Topics with data on disk that the catalog neither defines nor says were dropped (a
    /// catalog recovered by cutting, or one lost): kept, never deleted, and taken back by
    /// defining them again. A name leaves the set when it is defined.
    orphans: RwLock<BTreeSet<String>>,
    /// Users, roles, grants and tokens in force; changed under `ddl` like every definition.
    /// Shared with open subscriptions, which check again on every change whether they may
    /// still read what they follow.
    access: Arc<crate::access::Access>,
    /// Set on a cluster node (see [`replicated`]); shared with every stream.
    replicator: replicated::ReplicatorSlot,
    /// Offsets the cluster's leader has handed out beyond what it applied.
    predictions: std::sync::Mutex<replicated::Predictions>,
    /// The log index of the last definition change a cluster node applied, for the node's
    /// client who asked for one and waits to see it here.
    replicated_ddl: tokio::sync::watch::Sender<u64>,
    /// On a cluster node: the partitions appended to since the last sync, by address.
    unsynced: std::sync::Mutex<std::collections::HashMap<usize, Arc<Partition>>>,
    /// On a cluster node: the term in which it leads, once it applied every earlier command
    /// ([`Engine::set_leading`]); `None` while it does not.
    leading: tokio::sync::watch::Sender<Option<u64>>,
    /// The keys of idempotent writes, read back once every stream is open.
    idempotency: Arc<Idempotency>,
}

/// The recovery policy of the catalog, for [`LogOptions::topic_recovery`]: its tail is never
/// cut on the guess that it is a torn write, since a definition cut away would make its stream
/// look dropped. With `recover` (the operator's `--recover-catalog`), damaged catalog bytes are
/// set aside (a copy of the file is kept), the definitions before them stand, and every topic
/// they no longer define is kept as an orphan.
pub fn catalog_recovery(recover: bool) -> RecoveryPolicy {
    RecoveryPolicy {
        cut_torn_tail: false,
        discard_damaged: recover,
        remedy: "this is onehop's catalog, the definitions of every stream, table and view; onehop does not \
                 start on a catalog it cannot read whole, since it could not tell which streams exist. The data of \
                 the streams is untouched. Start once with --recover-catalog to set the damaged bytes aside (a copy \
                 of the file is kept beside it; every batch of the catalog is read, also under an intact index) and \
                 keep the definitions before them; each stream or table they no longer define stays on disk, \
                 listed as orphaned, until it is defined again (CREATE STREAM, CREATE TABLE or your schema file), \
                 which takes its data back"
            .into(),
    }
}

/// Puts the policies of onehop's own topics into `options` (see [`catalog_recovery`]).
pub fn set_system_recovery(options: &mut LogOptions, recover_catalog: bool) {
    options.topic_recovery.insert(CATALOG_TOPIC.to_string(), catalog_recovery(recover_catalog));
}

/// The catalog's own log settings: a system topic (compacted, always fsync) of small records.
fn catalog_config() -> SystemTopicConfig {
    SystemTopicConfig { segment_bytes_max: 8 * 1024 * 1024, record_bytes_max: 1024 * 1024 }
}

impl Engine {
    /// Opens the catalog in `log` (creating it the first time), replays it and opens every
    /// stream it defines.
    pub fn open(log: Arc<Log>, options: EngineOptions) -> Result<Engine, EngineError> {
        options.stream_defaults.validate().map_err(EngineError::InvalidDefinition)?;
        if options.subscriber_queue_capacity == 0 {
            return Err(EngineError::InvalidDefinition("subscriber_queue_capacity must be at least 1".into()));
        }
        if options.checkpoint_interval.is_zero() {
            return Err(EngineError::InvalidDefinition("checkpoint_interval must be at least 1 ms".into()));
        }
        catalog::validate_name(&options.empty_first_level_stream)?;
        let catalog = SystemTopic::open(&log, CATALOG_TOPIC, &catalog_config())?;
        let mut defs = catalog::replay(&catalog)?;
        let checkpoints = SystemTopic::open(&log, CHECKPOINT_TOPIC, &checkpoint::checkpoint_config())?;
        let hub = Arc::new(Hub::new(options.subscriber_queue_capacity));
        let idempotency = Arc::new(Idempotency::open(&log, options.idempotency_window, options.idempotency_keys_max)?);
        let engine = Engine {
            log,
            options,
            catalog,
            streams: RwLock::new(BTreeMap::new()),
            tables: RwLock::new(BTreeMap::new()),
            ddl: tokio::sync::Mutex::new(()),
            hub,
            streams_changed: tokio::sync::watch::channel(0).0,
            catalog_generation: AtomicU64::new(0),
            routed: RwLock::new(Vec::new()),
            views: RwLock::new(BTreeMap::new()),
            transforms: RwLock::new(BTreeMap::new()),
            checkpoints,
            orphans: RwLock::new(BTreeSet::new()),
            access: Arc::new(crate::access::Access::new(std::mem::take(&mut defs.access))),
            replicator: Default::default(),
            predictions: Default::default(),
            replicated_ddl: tokio::sync::watch::channel(0).0,
            unsynced: Default::default(),
            leading: tokio::sync::watch::channel(None).0,
            idempotency,
        };
        engine.finish_drops_and_keep_orphans(&defs)?;
        let defined_views: BTreeSet<String> = defs.views.keys().cloned().collect();
        for def in defs.streams.into_values() {
            let stream = engine.open_stream(def)?;
            engine.streams.write().expect("streams lock").insert(stream.name().to_string(), stream);
        }
        engine.update_routes();
        for def in defs.tables.into_values() {
            let table = engine.open_table(def)?;
            engine.tables.write().expect("tables lock").insert(table.name(), table);
        }
        let mut checkpoints = checkpoint::read_all(&engine.checkpoints)?;
        let mut live = Vec::new();
        for def in in_dependency_order(defs.views.into_values().collect()) {
            let name = def.name.clone();
            let checkpoint = checkpoint::restore(&def, &mut checkpoints);
            if let Some(checkpoint) = &checkpoint {
                live.push((name.clone(), checkpoint.incarnation));
            }
            match engine.open_view(def, checkpoint) {
                Ok(view) => {
                    engine.views.write().expect("views lock").insert(name, view);
                }
                Err(error) => tracing::error!(view = name, %error, "a view could not be opened"),
            }
        }
        for def in defs.transforms.into_values() {
            let name = def.name.clone();
            let checkpoint = checkpoints
                .remove(&transform::checkpoint_key(&name))
                .and_then(|value| TransformCheckpoint::parse(&name, &value));
            match engine.open_transform(def, checkpoint) {
                Ok(transform) => {
                    engine.transforms.write().expect("transforms lock").insert(name, transform);
                }
                Err(error) => tracing::error!(transform = name, %error, "a transform could not be opened"),
            }
        }
        live.extend(engine.views().iter().map(|view| (view.name().to_string(), view.incarnation())));
        // Only the records of views that are defined (an older incarnation) or were dropped:
        // a view the catalog does not mention may be one a damaged catalog lost, and its state
        // is kept for when it is defined again.
        let strays = checkpoint::strays(&checkpoints, &live)
            .into_iter()
            .filter(|key| {
                let view = checkpoint::view_of_key(key);
                defined_views.contains(view) || defs.dropped_views.contains(view)
            })
            .collect();
        engine.delete_stray_checkpoints(strays);
        engine.idempotency.load(&engine)?;
        tracing::info!(
            streams = engine.streams.read().expect("streams lock").len(),
            tables = engine.tables.read().expect("tables lock").len(),
            views = engine.views.read().expect("views lock").len(),
            transforms = engine.transforms.read().expect("transforms lock").len(),
            users = engine.access.defs().users.len(),
            "catalog replayed"
        );
        Ok(engine)
    }

    /// Opens the log in `dir` (created when missing; onehop's own topics recovering by their
    /// own policies, [`set_system_recovery`]) and the engine on it: what a program or a test
    /// that has no log of its own calls.
    pub fn open_in(dir: impl AsRef<std::path::Path>, options: EngineOptions) -> Result<Engine, EngineError> {
        let mut log_options = LogOptions::default();
        set_system_recovery(&mut log_options, false);
        let (log, _) = Log::open(dir.as_ref(), log_options)?;
        Engine::open(Arc::new(log), options)
    }

    /// The system topic `name` (see [`SystemTopic`]), opened (and created the first time) with
    /// `config`; a name opened before is returned as it is. For state a front end keeps in the
    /// log (MQTT retained messages and sessions); its name starts with `__`.
    /// The keys of idempotent writes.
    pub fn idempotency(&self) -> &Arc<Idempotency> {
        &self.idempotency
    }

    pub fn system_topic(&self, name: &str, config: &SystemTopicConfig) -> Result<Arc<SystemTopic>, EngineError> {
        SystemTopic::open(&self.log, name, config)
    }

    pub(crate) fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Partitions open in the log, every stream's, table's and system topic's.
    pub fn partitions_open(&self) -> usize {
        self.log.partitions().len()
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    /// The directory the log keeps its topics in (what Kafka's DescribeLogDirs names).
    pub fn log_dir(&self) -> &std::path::Path {
        self.log.dir()
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// Where views and transforms checkpoint, and how often.
    pub(crate) fn checkpointing(&self) -> crate::view::checkpoint::Checkpointing {
        crate::view::checkpoint::Checkpointing {
            topic: self.checkpoints.clone(),
            interval: self.options.checkpoint_interval,
        }
    }
}

/// Views in an order that opens each after the views it reads (a joined view reads views; the
/// catalog lists them by name). A view reads only views that existed when it was created, so
/// there is no cycle; one whose source is missing is left for its open to report.
fn in_dependency_order(mut pending: Vec<ViewDef>) -> Vec<ViewDef> {
    let mut ordered: Vec<ViewDef> = Vec::with_capacity(pending.len());
    while !pending.is_empty() {
        let waiting: BTreeSet<String> = pending.iter().map(|def| def.name.clone()).collect();
        let (ready, rest): (Vec<ViewDef>, Vec<ViewDef>) = pending
            .into_iter()
            .partition(|def| def.sources().iter().all(|source| *source == def.name || !waiting.contains(*source)));
        if ready.is_empty() {
            ordered.extend(rest);
            break;
        }
        ordered.extend(ready);
        pending = rest;
    }
    ordered
}
