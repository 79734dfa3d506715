//! The engine: opens the catalog, replays it, opens every defined stream, and serves
//! definitions and data to the front ends.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use onehop_log::{Durability, Log, Partition, PartitionConfig};

use crate::catalog::{self, CATALOG_TOPIC, StreamDef};
use crate::error::EngineError;
use crate::hub::{Cursor, Hub};
use crate::stream::Stream;
use crate::subject::SubjectFilter;

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
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            stream_defaults: PartitionConfig::default(),
            default_partitions: 1,
            auto_create: true,
            subscriber_queue_capacity: 1024,
        }
    }
}

pub struct Engine {
    log: Arc<Log>,
    options: EngineOptions,
    catalog: Arc<Partition>,
    /// Read on every publish, written on every definition change.
    streams: RwLock<BTreeMap<String, Arc<Stream>>>,
    /// Definition changes one at a time, so two creates of one name cannot both append.
    ddl: tokio::sync::Mutex<()>,
    hub: Arc<Hub>,
}

/// The catalog's own log settings: compacted (newest definition per name), always fsync.
fn catalog_config() -> PartitionConfig {
    PartitionConfig {
        compacted: true,
        durability: Durability::Fsync,
        segment_bytes_max: 8 * 1024 * 1024,
        batch_bytes_max: 1024 * 1024,
        record_bytes_max: 1024 * 1024,
        ..PartitionConfig::default()
    }
}

impl Engine {
    /// Opens the catalog in `log` (creating it the first time), replays it and opens every
    /// stream it defines.
    pub fn open(log: Arc<Log>, options: EngineOptions) -> Result<Engine, EngineError> {
        options.stream_defaults.validate().map_err(EngineError::InvalidDefinition)?;
        if options.subscriber_queue_capacity == 0 {
            return Err(EngineError::InvalidDefinition("subscriber_queue_capacity must be at least 1".into()));
        }
        let catalog = log.open_partition(CATALOG_TOPIC, 0, catalog_config())?;
        let defs = catalog::replay(&catalog)?;
        let hub = Arc::new(Hub::new(options.subscriber_queue_capacity));
        let engine = Engine {
            log,
            options,
            catalog,
            streams: RwLock::new(BTreeMap::new()),
            ddl: tokio::sync::Mutex::new(()),
            hub,
        };
        for def in defs.into_values() {
            let stream = engine.open_stream(def)?;
            engine.streams.write().expect("streams lock").insert(stream.name().to_string(), stream);
        }
        tracing::info!(streams = engine.streams.read().expect("streams lock").len(), "catalog replayed");
        Ok(engine)
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

    /// Subscribes to `stream` from `positions` (the next offset per partition), delivering
    /// records whose subject matches `filter` (all records when `None`). Must be called inside
    /// the tokio runtime: the hub's tailers are tasks.
    pub fn subscribe(
        &self,
        stream: &Arc<Stream>,
        filter: Option<SubjectFilter>,
        positions: Vec<u64>,
    ) -> Result<Cursor, EngineError> {
        Cursor::new(self.hub.clone(), stream.clone(), filter, positions)
    }

    /// A definition of `name` with every setting at its default.
    pub fn default_stream_def(&self, name: &str) -> StreamDef {
        StreamDef {
            name: name.to_string(),
            partitions: self.options.default_partitions,
            retention_ms: None,
            retention_bytes: None,
            durability: self.options.stream_defaults.durability,
        }
    }

    pub fn stream(&self, name: &str) -> Result<Arc<Stream>, EngineError> {
        self.streams
            .read()
            .expect("streams lock")
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::UnknownStream(name.into()))
    }

    /// Every stream, by name.
    pub fn streams(&self) -> Vec<Arc<Stream>> {
        self.streams.read().expect("streams lock").values().cloned().collect()
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
        self.catalog.append(&[catalog::stream_record(&def)]).await?;
        let stream = self.open_stream(def)?;
        self.streams.write().expect("streams lock").insert(stream.name().to_string(), stream.clone());
        tracing::info!(stream = stream.name(), definition = %stream.def().describe(), "stream created");
        Ok(stream)
    }

    /// The stream `name`, created with the default definition when it does not exist and
    /// `auto_create` is on.
    pub async fn stream_or_create(&self, name: &str) -> Result<Arc<Stream>, EngineError> {
        match self.stream(name) {
            Ok(stream) => Ok(stream),
            Err(EngineError::UnknownStream(_)) if self.options.auto_create => {
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
}
