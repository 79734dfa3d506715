//! The engine: opens the catalog, replays it, opens every defined stream and table, and serves
//! definitions and data to the front ends. Streams and tables share one namespace (a name is
//! one log topic).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use onehop_log::{Durability, Log, LogOptions, Partition, PartitionConfig, RecoveryPolicy};

use crate::catalog::{self, CATALOG_TOPIC, StreamDef};
use crate::error::EngineError;
use crate::filter::Filter;
use crate::hub::{Cursor, Hub};
use crate::stream::Stream;
use crate::system::{SystemTopic, SystemTopicConfig};
use crate::table::Table;
use crate::tabledef::{IndexDef, TableDef, validate_field_name};
use crate::view::checkpoint::{self, CHECKPOINT_TOPIC, Restored};
use crate::view::runtime::{self, OUTPUT_PREFIX};
use crate::view::transform::{self, TransformCheckpoint};
use crate::view::{Start, Transform, TransformDef, View, ViewDef};

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
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            stream_defaults: PartitionConfig::default(),
            default_partitions: 1,
            auto_create: true,
            subscriber_queue_capacity: 1024,
            empty_first_level_stream: "root".to_string(),
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
                 of the file is kept beside it) and keep the definitions before them; each stream or table they \
                 no longer define stays on disk, listed as orphaned, until it is defined again (CREATE STREAM, \
                 CREATE TABLE or your schema file), which takes its data back"
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

/// Tombstones appended at once when a view's checkpoint records are deleted.
const TOMBSTONES_PER_APPEND: usize = 65_536;

impl Engine {
    /// Opens the catalog in `log` (creating it the first time), replays it and opens every
    /// stream it defines.
    pub fn open(log: Arc<Log>, options: EngineOptions) -> Result<Engine, EngineError> {
        options.stream_defaults.validate().map_err(EngineError::InvalidDefinition)?;
        if options.subscriber_queue_capacity == 0 {
            return Err(EngineError::InvalidDefinition("subscriber_queue_capacity must be at least 1".into()));
        }
        catalog::validate_name(&options.empty_first_level_stream)?;
        let catalog = SystemTopic::open(&log, CATALOG_TOPIC, &catalog_config())?;
        let defs = catalog::replay(&catalog)?;
        let checkpoints = SystemTopic::open(&log, CHECKPOINT_TOPIC, &checkpoint::checkpoint_config())?;
        let hub = Arc::new(Hub::new(options.subscriber_queue_capacity));
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
        for def in defs.views.into_values() {
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
        tracing::info!(
            streams = engine.streams.read().expect("streams lock").len(),
            tables = engine.tables.read().expect("tables lock").len(),
            views = engine.views.read().expect("views lock").len(),
            transforms = engine.transforms.read().expect("transforms lock").len(),
            "catalog replayed"
        );
        Ok(engine)
    }

    /// Deletes the data of what the catalog says was dropped (a drop is acknowledged once its
    /// catalog record is durable, so one cut short by a crash is finished here), and keeps
    /// every other topic the catalog does not define as an orphan. Data is deleted only on
    /// the strength of a drop record, never because a definition is missing: a catalog that
    /// lost records (damage set aside with `--recover-catalog`, a deleted catalog directory)
    /// must not cost the data of the streams it forgot.
    fn finish_drops_and_keep_orphans(&self, defs: &catalog::Definitions) -> Result<(), EngineError> {
        let mut orphans = BTreeSet::new();
        for topic in self.log.topics() {
            let (name, dropped, defined) = match topic.strip_prefix(OUTPUT_PREFIX) {
                Some(view) => (view, defs.dropped_views.contains(view), defs.views.contains_key(view)),
                None if topic.starts_with("__") => continue,
                None => (
                    topic.as_str(),
                    defs.dropped.contains(&topic),
                    defs.streams.contains_key(&topic) || defs.tables.contains_key(&topic),
                ),
            };
            if defined {
                continue;
            }
            if dropped {
                tracing::warn!(topic, name, "removing the data of a dropped stream, table or view");
                self.log.remove_topic(&topic)?;
            } else {
                tracing::error!(
                    topic,
                    "the catalog neither defines nor dropped this topic: its data is kept as an orphan; define \
                     it again to take it back"
                );
                orphans.insert(topic);
            }
        }
        metrics::gauge!("engine_orphaned_topics").set(orphans.len() as f64);
        *self.orphans.write().expect("orphans lock") = orphans;
        Ok(())
    }

    /// Topics whose data is on disk but that the catalog neither defines nor dropped (see
    /// [`Engine::open`]). Defining one again takes its data back.
    pub fn orphans(&self) -> Vec<String> {
        self.orphans.read().expect("orphans lock").iter().cloned().collect()
    }

    /// Checks that `topic`, if it is an orphan, can be taken back by a definition with
    /// `partitions` partitions (`compacted` for a table): its data on disk must fit.
    fn check_adoption(&self, topic: &str, partitions: u32, compacted: bool, kind: &str) -> Result<(), EngineError> {
        if !self.orphans.read().expect("orphans lock").contains(topic) {
            return Ok(());
        }
        let found: Vec<Arc<Partition>> = self
            .log
            .partitions()
            .into_iter()
            .filter(|(name, _, _)| name == topic)
            .map(|(_, _, partition)| partition)
            .collect();
        let on_disk_compacted = found.first().is_some_and(|partition| partition.config().compacted);
        if found.len() as u32 != partitions || on_disk_compacted != compacted {
            let shape = if on_disk_compacted { "a table's (compacted) data" } else { "a stream's data" };
            return Err(EngineError::InvalidDefinition(format!(
                "{topic:?} has data on disk that the catalog lost (an orphan): {shape} in {} partition(s), which \
                 a {kind} with {partitions} partition(s) cannot take back. Define it to fit that data, or move \
                 {} aside to start it empty",
                found.len(),
                self.log.dir().join(topic).display()
            )));
        }
        Ok(())
    }

    /// Notes that the orphan `topic` (if it is one) has been defined again.
    fn adopted(&self, topic: &str) {
        let mut orphans = self.orphans.write().expect("orphans lock");
        if orphans.remove(topic) {
            metrics::gauge!("engine_orphaned_topics").set(orphans.len() as f64);
            tracing::warn!(topic, "an orphaned topic was defined again: its data is taken back");
        }
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

    /// Opens a defined view and starts it from its checkpoint (or, with none, from where its
    /// definition says).
    fn open_view(&self, def: ViewDef, checkpoint: Option<Restored>) -> Result<Arc<View>, EngineError> {
        let table = self.table(&def.source).ok();
        let source = match &table {
            Some(table) => table.storage().clone(),
            None => self.stream(&def.source)?,
        };
        let output_def = StreamDef {
            name: format!("{OUTPUT_PREFIX}{}", def.name),
            partitions: 1,
            retention_ms: None,
            retention_bytes: None,
            durability: Durability::Async,
            mqtt_topic: None,
        };
        let output_partition =
            self.log.open_partition(&output_def.name, 0, runtime::output_config(&self.options.stream_defaults))?;
        let output = Arc::new(Stream::new(output_def, vec![output_partition]));
        let late = def.late_stream.as_deref().and_then(|name| self.stream(name).ok());
        let restored = match checkpoint {
            // A view over a table starts from the table's rows.
            _ if table.is_some() => Restored::empty(vec![0]),
            Some(checkpoint) if checkpoint.positions.len() == source.partition_count() as usize => checkpoint,
            _ => {
                tracing::warn!(view = def.name, "no checkpoint: the view starts over from its source");
                Restored::empty(start_positions(&source, def.start))
            }
        };
        let positions = still_stored(&source, restored.positions.clone());
        let view = Arc::new(View::new(def, source, table, output, late, restored));
        if tokio::runtime::Handle::try_current().is_ok() {
            view.start(self.hub.clone(), self.checkpoints.clone(), positions);
        } else {
            tracing::error!(view = view.name(), "views run inside the tokio runtime: this one is not started");
        }
        Ok(view)
    }

    pub fn view(&self, name: &str) -> Result<Arc<View>, EngineError> {
        self.views.read().expect("views lock").get(name).cloned().ok_or_else(|| EngineError::UnknownView(name.into()))
    }

    /// Every view, by name.
    pub fn views(&self) -> Vec<Arc<View>> {
        self.views.read().expect("views lock").values().cloned().collect()
    }

    /// Creates the view `def` describes and starts it: its definition and a first checkpoint
    /// (where it starts in its source) are durable before this returns. Creating a view that
    /// exists with the same definition returns it.
    pub async fn create_view(&self, def: ViewDef) -> Result<Arc<View>, EngineError> {
        catalog::validate_name(&def.name)?;
        if self.table(&def.source).is_ok() {
            check_over_table(&def)?;
        }
        if let Some(late) = &def.late_stream {
            if late == &def.source {
                return Err(EngineError::InvalidDefinition("late_stream cannot be the view's own source".into()));
            }
            // Created first (it takes the definition lock itself); harmless if the view is not.
            self.stream_or_create(late).await?;
        }
        let _ddl = self.ddl.lock().await;
        if let Ok(existing) = self.view(&def.name) {
            if existing.def() == &def {
                return Ok(existing);
            }
            return Err(EngineError::ViewExists { name: def.name.clone() });
        }
        if self.stream(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "stream" });
        }
        if self.table(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "table" });
        }
        let checkpoint = if self.table(&def.source).is_ok() {
            None
        } else {
            let source = self.stream(&def.source)?;
            let checkpoint = Restored::empty(start_positions(&source, def.start));
            self.checkpoints.append(&[checkpoint.header(&def.name)]).await?;
            Some(checkpoint)
        };
        self.catalog.append(&[catalog::view_record(&def)]).await?;
        let name = def.name.clone();
        let view = self.open_view(def, checkpoint)?;
        self.adopted(&format!("{OUTPUT_PREFIX}{name}"));
        self.views.write().expect("views lock").insert(name.clone(), view.clone());
        self.catalog_changed();
        tracing::info!(view = name, source = view.def().source, "view created");
        Ok(view)
    }

    /// Drops the view `name`: stops it and deletes its changes and checkpoint.
    pub async fn drop_view(&self, name: &str) -> Result<(), EngineError> {
        let _ddl = self.ddl.lock().await;
        let view = self.view(name)?;
        self.catalog.append(&[catalog::drop_view_record(name)]).await?;
        self.views.write().expect("views lock").remove(name);
        self.catalog_changed();
        view.stop().await;
        // The header first: a drop cut short leaves strays, deleted at the next start.
        for tombstones in view.checkpoint_tombstones().chunks(TOMBSTONES_PER_APPEND) {
            self.checkpoints.append(tombstones).await?;
        }
        self.log.remove_topic(&format!("{OUTPUT_PREFIX}{name}"))?;
        tracing::info!(view = name, "view dropped");
        Ok(())
    }

    /// Deletes checkpoint records no view owns (see `checkpoint::strays`), in the background.
    fn delete_stray_checkpoints(&self, strays: Vec<String>) {
        if strays.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        tracing::info!(records = strays.len(), "deleting view checkpoint records no view owns");
        let checkpoints = self.checkpoints.clone();
        runtime.spawn(async move {
            for chunk in strays.chunks(TOMBSTONES_PER_APPEND) {
                let tombstones: Vec<onehop_log::NewRecord> =
                    chunk.iter().map(|key| onehop_log::NewRecord::tombstone(key.clone())).collect();
                if let Err(error) = checkpoints.append(&tombstones).await {
                    tracing::warn!(%error, "stray view checkpoint records could not be deleted");
                    return;
                }
            }
        });
    }

    /// Stops every view and transform, each writing a last checkpoint (before the log closes).
    pub async fn stop_derived(&self) {
        for view in self.views() {
            view.stop().await;
        }
        for transform in self.transforms() {
            transform.stop().await;
        }
    }

    /// Refuses to drop `name` while a view or transform reads it.
    fn check_unread(&self, name: &str) -> Result<(), EngineError> {
        let views = self.views.read().expect("views lock");
        if let Some(view) = views.values().find(|view| view.def().source == name) {
            return Err(EngineError::InUse {
                name: name.to_string(),
                reader: format!("view {:?}", view.name()),
                drop: format!("DROP VIEW {}", view.name()),
            });
        }
        drop(views);
        let transforms = self.transforms.read().expect("transforms lock");
        if let Some(transform) = transforms.values().find(|transform| transform.def().source == name) {
            return Err(EngineError::InUse {
                name: name.to_string(),
                reader: format!("transform {:?}", transform.name()),
                drop: format!("DROP STREAM {}", transform.name()),
            });
        }
        Ok(())
    }

    pub fn transform(&self, name: &str) -> Option<Arc<Transform>> {
        self.transforms.read().expect("transforms lock").get(name).cloned()
    }

    /// Every transform, by name.
    pub fn transforms(&self) -> Vec<Arc<Transform>> {
        self.transforms.read().expect("transforms lock").values().cloned().collect()
    }

    /// Opens a defined transform and starts it from its checkpoint (or, with none, from where
    /// its definition says, not writing again what its output already has from there).
    fn open_transform(
        &self,
        def: TransformDef,
        checkpoint: Option<TransformCheckpoint>,
    ) -> Result<Arc<Transform>, EngineError> {
        let source = self.stream(&def.source)?;
        let output = self.stream(&def.name)?;
        let checkpoint = match checkpoint {
            Some(checkpoint)
                if checkpoint.positions.len() == source.partition_count() as usize
                    && checkpoint.output_ends.len() == output.partition_count() as usize =>
            {
                checkpoint
            }
            _ => {
                tracing::warn!(
                    transform = def.name,
                    "no checkpoint: the transform starts over, skipping what it wrote"
                );
                TransformCheckpoint::new(start_positions(&source, def.start), output.start_offsets())
            }
        };
        let checkpoint = TransformCheckpoint::new(still_stored(&source, checkpoint.positions), checkpoint.output_ends);
        let transform = Arc::new(Transform::new(def, source, output));
        if tokio::runtime::Handle::try_current().is_ok() {
            transform.start(self.hub.clone(), self.checkpoints.clone(), checkpoint);
        } else {
            tracing::error!(
                transform = transform.name(),
                "transforms run inside the tokio runtime: this one is not started"
            );
        }
        Ok(transform)
    }

    /// Creates the stream `output` and the transform `def` that feeds it from its source, and
    /// starts it. Both definitions and the transform's starting point are durable before this
    /// returns. Creating one that exists with the same definitions returns it.
    pub async fn create_transform(&self, def: TransformDef, output: StreamDef) -> Result<Arc<Transform>, EngineError> {
        output.validate()?;
        if output.name != def.name {
            return Err(EngineError::InvalidDefinition(format!(
                "the transform {:?} must write the stream of its name, not {:?}",
                def.name, output.name
            )));
        }
        let _ddl = self.ddl.lock().await;
        if let Some(existing) = self.transform(&def.name) {
            if existing.def() == &def && existing.output().def() == &output {
                return Ok(existing);
            }
            return Err(EngineError::StreamExists {
                name: def.name.clone(),
                existing: format!("computed by {}", existing.def().sql),
            });
        }
        self.check_new_stream(&output)?;
        if self.table(&def.source).is_ok() {
            return Err(EngineError::InvalidDefinition(format!(
                "{:?} is a table: a transform reads a stream (aggregate a table with CREATE VIEW)",
                def.source
            )));
        }
        let source = self.stream(&def.source)?;
        let positions = start_positions(&source, def.start);
        let checkpoint = TransformCheckpoint::new(positions, vec![0; output.partitions as usize]);
        self.checkpoints.append(&[checkpoint.record(&def.name)]).await?;
        // One batch: the stream and the transform that writes it are defined together or not at all.
        self.catalog.append(&[catalog::stream_record(&output), catalog::transform_record(&def)]).await?;
        let stream = self.open_stream(output)?;
        self.adopted(stream.name());
        self.streams.write().expect("streams lock").insert(stream.name().to_string(), stream);
        self.streams_changed();
        let name = def.name.clone();
        let transform = self.open_transform(def, Some(checkpoint))?;
        self.transforms.write().expect("transforms lock").insert(name.clone(), transform.clone());
        tracing::info!(transform = name, source = transform.def().source, "transform created");
        Ok(transform)
    }

    pub fn log(&self) -> &Arc<Log> {
        &self.log
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The log settings of `def`'s partitions.
    fn partition_config(&self, def: &StreamDef) -> PartitionConfig {
        PartitionConfig {
            durability: def.durability,
            retention_ms: def.retention_ms,
            retention_bytes: def.retention_bytes,
            ..self.options.stream_defaults.clone()
        }
    }

    fn open_stream(&self, def: StreamDef) -> Result<Arc<Stream>, EngineError> {
        let config = self.partition_config(&def);
        let partitions = (0..def.partitions)
            .map(|index| self.log.open_partition(&def.name, index, config.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Stream::new(def, partitions)))
    }

    /// The log settings of a table's partition: compacted, newest row per id.
    fn table_config(&self, def: &TableDef) -> PartitionConfig {
        PartitionConfig { durability: def.durability, compacted: true, ..self.options.stream_defaults.clone() }
    }

    fn open_table(&self, def: TableDef) -> Result<Arc<Table>, EngineError> {
        let partition = self.log.open_partition(&def.name, 0, self.table_config(&def))?;
        let storage_def = StreamDef {
            name: def.name.clone(),
            partitions: 1,
            retention_ms: None,
            retention_bytes: None,
            durability: def.durability,
            mqtt_topic: None,
        };
        Table::open(def, Arc::new(Stream::table_storage(storage_def, partition)))
    }

    /// Subscribes to `stream` (or a table's storage) from `positions` (the next offset per
    /// partition), delivering the records `filter` matches. Must be called inside the tokio
    /// runtime: the hub's tailers are tasks.
    pub fn subscribe(&self, stream: &Arc<Stream>, filter: Filter, positions: Vec<u64>) -> Result<Cursor, EngineError> {
        Cursor::new(self.hub.clone(), stream.clone(), Arc::new(filter), positions)
    }

    /// A definition of `name` with every setting at its default.
    pub fn default_stream_def(&self, name: &str) -> StreamDef {
        StreamDef {
            name: name.to_string(),
            partitions: self.options.default_partitions,
            retention_ms: None,
            retention_bytes: None,
            durability: self.options.stream_defaults.durability,
            mqtt_topic: None,
        }
    }

    pub fn stream(&self, name: &str) -> Result<Arc<Stream>, EngineError> {
        self.streams
            .read()
            .expect("streams lock")
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownStream { name: name.into(), auto_create: self.options.auto_create })
    }

    /// Every stream, by name.
    pub fn streams(&self) -> Vec<Arc<Stream>> {
        self.streams.read().expect("streams lock").values().cloned().collect()
    }

    /// Changes whenever a stream is created or dropped: what a subscription to every stream
    /// (an MQTT `#`) watches to follow new ones.
    pub fn watch_streams(&self) -> tokio::sync::watch::Receiver<u64> {
        self.streams_changed.subscribe()
    }

    fn streams_changed(&self) {
        self.update_routes();
        self.streams_changed.send_modify(|generation| *generation += 1);
        self.catalog_changed();
    }

    /// A number that changes after every stream, table or view is created or dropped. What
    /// was decided from the catalog while it read `g` (an MQTT topic's stream, say) still
    /// holds while it reads `g`: a change makes its maps visible first, then bumps it.
    pub fn catalog_generation(&self) -> u64 {
        self.catalog_generation.load(Ordering::Acquire)
    }

    fn catalog_changed(&self) {
        self.catalog_generation.fetch_add(1, Ordering::AcqRel);
    }

    fn update_routes(&self) {
        let routed = self.streams().into_iter().filter(|stream| stream.mqtt_route().is_some()).collect();
        *self.routed.write().expect("routes lock") = routed;
    }

    /// The stream whose declared `mqtt_topic` matches `topic` (declared filters never overlap,
    /// so there is at most one).
    pub fn stream_for_mqtt_topic(&self, topic: &str) -> Option<Arc<Stream>> {
        let routed = self.routed.read().expect("routes lock");
        routed.iter().find(|stream| stream.mqtt_route().is_some_and(|route| route.matches(topic))).cloned()
    }

    /// Creates the stream `def` describes, durably (the definition is in the catalog before
    /// this returns). Creating a stream that exists with the same definition returns it; with a
    /// different definition is an error.
    pub async fn create_stream(&self, def: StreamDef) -> Result<Arc<Stream>, EngineError> {
        def.validate()?;
        let _ddl = self.ddl.lock().await;
        if let Ok(existing) = self.stream(&def.name) {
            if existing.def() == &def {
                return Ok(existing);
            }
            return Err(EngineError::StreamExists { name: def.name.clone(), existing: existing.def().describe() });
        }
        self.check_new_stream(&def)?;
        self.catalog.append(&[catalog::stream_record(&def)]).await?;
        let stream = self.open_stream(def)?;
        self.adopted(stream.name());
        self.streams.write().expect("streams lock").insert(stream.name().to_string(), stream.clone());
        self.streams_changed();
        tracing::info!(stream = stream.name(), definition = %stream.def().describe(), "stream created");
        Ok(stream)
    }

    /// Refuses a new stream whose name is taken, whose `mqtt_topic` overlaps another's, or that
    /// does not fit the orphaned data of its name.
    fn check_new_stream(&self, def: &StreamDef) -> Result<(), EngineError> {
        self.check_adoption(&def.name, def.partitions, false, "stream")?;
        if let Ok(existing) = self.stream(&def.name) {
            return Err(EngineError::StreamExists { name: def.name.clone(), existing: existing.def().describe() });
        }
        if self.table(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "table" });
        }
        if self.view(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "view" });
        }
        if let Some(topic) = &def.mqtt_topic {
            let route = catalog::mqtt_route(topic)?;
            for other in self.routed.read().expect("routes lock").iter() {
                if other.mqtt_route().is_some_and(|theirs| theirs.overlaps(&route)) {
                    return Err(EngineError::InvalidDefinition(format!(
                        "mqtt_topic '{topic}' overlaps stream {}'s mqtt_topic '{}': each MQTT topic must belong to one stream",
                        other.name(),
                        other.def().mqtt_topic.as_deref().unwrap_or_default()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The stream `name`, created with the default definition when it does not exist and
    /// `auto_create` is on.
    pub async fn stream_or_create(&self, name: &str) -> Result<Arc<Stream>, EngineError> {
        match self.stream(name) {
            Ok(stream) => Ok(stream),
            Err(EngineError::UnknownStream { .. }) if self.options.auto_create => {
                catalog::validate_name(name)?;
                let def = self.default_stream_def(name);
                match self.create_stream(def).await {
                    // Someone created it meanwhile with another definition: theirs stands.
                    Err(EngineError::StreamExists { .. }) => self.stream(name),
                    other => other,
                }
            }
            Err(error) => Err(error),
        }
    }

    pub fn table(&self, name: &str) -> Result<Arc<Table>, EngineError> {
        self.tables
            .read()
            .expect("tables lock")
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownTable(name.into()))
    }

    /// Whether a table named `name` exists (a lookup that builds no error when it does not).
    pub fn has_table(&self, name: &str) -> bool {
        self.tables.read().expect("tables lock").contains_key(name)
    }

    /// Every table, by name.
    pub fn tables(&self) -> Vec<Arc<Table>> {
        self.tables.read().expect("tables lock").values().cloned().collect()
    }

    /// Durability of tables created without saying: the server's default, as for streams.
    pub fn default_table_durability(&self) -> Durability {
        self.options.stream_defaults.durability
    }

    /// Creates the table `def` describes, durably. A table that exists with the same columns
    /// is returned as it is (its indexes are managed by `create_index`); with other columns it
    /// is an error.
    pub async fn create_table(&self, def: TableDef) -> Result<Arc<Table>, EngineError> {
        def.validate()?;
        let _ddl = self.ddl.lock().await;
        if let Ok(existing) = self.table(&def.name) {
            let existing_def = existing.def();
            if existing_def.without_indexes() == def.without_indexes() {
                return Ok(existing);
            }
            return Err(EngineError::TableExists { name: def.name.clone(), existing: existing_def.describe() });
        }
        if self.stream(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "stream" });
        }
        if self.view(&def.name).is_ok() {
            return Err(EngineError::NameTaken { name: def.name.clone(), kind: "view" });
        }
        self.check_adoption(&def.name, 1, true, "table")?;
        self.catalog.append(&[catalog::table_record(&def)]).await?;
        let table = self.open_table(def)?;
        self.adopted(&table.name());
        self.tables.write().expect("tables lock").insert(table.name(), table.clone());
        self.catalog_changed();
        tracing::info!(table = %table.name(), definition = %table.def().describe(), "table created");
        Ok(table)
    }

    /// Creates an index on `field` of `table` (named `name`, or `{table}_{field}_idx`) and
    /// fills it. Returns the index and whether it was created (false: an index on that field
    /// exists already).
    pub async fn create_index(
        &self,
        table: &str,
        name: Option<&str>,
        field: &str,
    ) -> Result<(IndexDef, bool), EngineError> {
        validate_field_name(field)?;
        let _ddl = self.ddl.lock().await;
        let table = self.table(table)?;
        let def = table.def();
        if let Some(existing) = def.index_on(field) {
            return Ok((existing.clone(), false));
        }
        let name = name.map_or_else(|| format!("{}_{field}_idx", def.name), str::to_string);
        if let Some(owner) =
            self.tables().iter().find(|table| table.def().indexes.iter().any(|index| index.name == name))
        {
            return Err(EngineError::InvalidDefinition(format!(
                "an index named {name:?} exists already (on table {})",
                owner.name()
            )));
        }
        let index = IndexDef { name, field: field.to_string() };
        let mut new_def = (*def).clone();
        new_def.indexes.push(index.clone());
        new_def.validate()?;
        self.catalog.append(&[catalog::table_record(&new_def)]).await?;
        table.add_index(new_def, &index);
        tracing::info!(table = %table.name(), index = %index.name, field, "index created");
        Ok((index, true))
    }

    /// Drops the index named `name`; returns the table it was on.
    pub async fn drop_index(&self, name: &str) -> Result<String, EngineError> {
        let _ddl = self.ddl.lock().await;
        for table in self.tables() {
            let def = table.def();
            let Some(index) = def.indexes.iter().find(|index| index.name == name) else { continue };
            let mut new_def = (*def).clone();
            new_def.indexes.retain(|other| other.name != name);
            self.catalog.append(&[catalog::table_record(&new_def)]).await?;
            table.remove_index(new_def, &index.field);
            return Ok(table.name());
        }
        Err(EngineError::UnknownIndex(name.to_string()))
    }

    /// Drops the stream `name` and deletes its records. Its subscriptions end.
    pub async fn drop_stream(&self, name: &str) -> Result<(), EngineError> {
        let _ddl = self.ddl.lock().await;
        self.stream(name)?;
        self.check_unread(name)?;
        let transform = self.transform(name);
        let mut records = vec![catalog::drop_record(name, false)];
        if transform.is_some() {
            records.push(catalog::drop_transform_record(name));
        }
        self.catalog.append(&records).await?;
        if let Some(transform) = transform {
            self.transforms.write().expect("transforms lock").remove(name);
            transform.stop().await;
            let tombstone = onehop_log::NewRecord {
                key: Some(bytes::Bytes::from(transform::checkpoint_key(name))),
                ..Default::default()
            };
            self.checkpoints.append(&[tombstone]).await?;
        }
        self.streams.write().expect("streams lock").remove(name);
        self.streams_changed();
        self.log.remove_topic(name)?;
        tracing::info!(stream = name, "stream dropped");
        Ok(())
    }

    /// Drops the table `name` and deletes its rows. Its subscriptions end.
    pub async fn drop_table(&self, name: &str) -> Result<(), EngineError> {
        let _ddl = self.ddl.lock().await;
        self.table(name)?;
        self.check_unread(name)?;
        self.catalog.append(&[catalog::drop_record(name, true)]).await?;
        self.tables.write().expect("tables lock").remove(name);
        self.catalog_changed();
        self.log.remove_topic(name)?;
        tracing::info!(table = name, "table dropped");
        Ok(())
    }
}

/// Refuses what a view over a table cannot do: it aggregates the rows there are now, so time
/// (windows, event times, lateness, finals) and order (FIRST, LAST) do not apply.
fn check_over_table(def: &ViewDef) -> Result<(), EngineError> {
    let refuse = |what: &str| {
        Err(EngineError::InvalidDefinition(format!(
            "{:?} is a table: a view over a table aggregates its current rows, so it takes no {what} \
             (views over streams do)",
            def.source
        )))
    };
    if def.window != crate::view::Window::None {
        return refuse("window");
    }
    if def.event_time.is_some() {
        return refuse("event_time");
    }
    if def.late_stream.is_some() {
        return refuse("late_stream");
    }
    if def.emit_final || !def.emit_changes {
        return refuse("emit = 'final' (its rows change with every row change)");
    }
    let ordered = def.columns.iter().any(|column| {
        matches!(
            column,
            crate::view::Column::Aggregate {
                function: crate::view::AggregateKind::First | crate::view::AggregateKind::Last,
                ..
            }
        )
    });
    if ordered {
        return refuse("FIRST or LAST (rows have no order in time)");
    }
    Ok(())
}

/// `positions` in `source`, past what retention removed since they were taken (a view or
/// transform carries on from what is left).
fn still_stored(source: &Stream, positions: Vec<u64>) -> Vec<u64> {
    positions.iter().zip(source.start_offsets()).map(|(&at, start)| at.max(start)).collect()
}

/// Where a view or transform with no checkpoint starts in `source`.
fn start_positions(source: &Stream, start: Start) -> Vec<u64> {
    match start {
        Start::Earliest => source.start_offsets(),
        Start::Latest => source.end_offsets(),
    }
}
