//! Streams: their definitions (create, drop, the MQTT topics they declare), opening their
//! partitions, and subscribing to them.

use super::*;
use crate::engine::replicated::StreamChange;
use crate::idempotency::{self, Begun, WriteKey};
use crate::stream::Published;
use onehop_log::NewRecord;

impl Engine {
    /// The log settings of `def`'s partitions.
    pub(super) fn partition_config(&self, def: &StreamDef) -> PartitionConfig {
        PartitionConfig {
            durability: def.durability,
            retention_ms: def.retention_ms,
            retention_bytes: def.retention_bytes,
            compacted: def.compacted,
            ..self.options.stream_defaults.clone()
        }
    }

    pub(super) fn open_stream(&self, def: StreamDef) -> Result<Arc<Stream>, EngineError> {
        let config = self.partition_config(&def);
        let partitions = (0..def.partitions)
            .map(|index| self.log.open_partition(&def.name, index, config.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Arc::new(Stream::new(def, partitions, self.replicator.clone())))
    }

    /// Publishes `records` to `stream` as one write named by the client's idempotency `key`,
    /// in the scope of the user `scope` (`""`: anonymous): the first time it is written as
    /// [`Stream::publish`] writes; a retry within the window is answered with the places the
    /// first write went to (`true`: replayed), and nothing is written again. See
    /// [`crate::idempotency`].
    pub async fn publish_idempotent(
        &self,
        stream: &Stream,
        mut records: Vec<NewRecord>,
        durability: Option<Durability>,
        scope: &str,
        key: &str,
    ) -> Result<(Vec<Published>, bool), EngineError> {
        idempotency::check_key(key).map_err(EngineError::InvalidIdempotencyKey)?;
        if records.is_empty() {
            return Err(onehop_log::AppendError::EmptyBatch.into());
        }
        let write = WriteKey { stream: stream.name().to_string(), scope: scope.to_string(), key: key.to_string() };
        let fingerprint = idempotency::fingerprint(stream.name(), &records);
        idempotency::tag(&mut records, &write, &fingerprint);
        if let Some(answer) = stream.publish_replicated(&records).await {
            // The cluster's leader decides, as it prepares the write.
            return answer;
        }
        self.idempotency.ensure_started(self).await?;
        let ends = stream.end_offsets();
        match self.idempotency.begin(&write, &fingerprint, records.len(), ends)? {
            Begun::Done(places) => Ok((places, true)),
            Begun::Write { missing, mut known, ticket } => {
                let subset: Vec<NewRecord> = missing.iter().map(|&index| records[index].clone()).collect();
                let published = stream.publish(&subset, durability).await;
                if let Ok(published) = &published {
                    let now = onehop_log::now_ms();
                    for (&index, place) in missing.iter().zip(published) {
                        known[index] = Some(*place);
                        self.idempotency.fold(stream.name(), place.partition, place.offset, &records[index], now);
                    }
                }
                self.idempotency.finish(ticket);
                published?;
                Ok((known.into_iter().map(|place| place.expect("every record is written")).collect(), false))
            }
        }
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
            compacted: false,
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

    pub(super) fn streams_changed(&self) {
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

    pub(super) fn catalog_changed(&self) {
        self.catalog_generation.fetch_add(1, Ordering::AcqRel);
    }

    pub(super) fn update_routes(&self) {
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
        if self.is_replicated() {
            return self.create_stream_replicated(def).await;
        }
        self.create_stream_here(def).await
    }

    /// Creates the stream `def` on this node (what [`Engine::create_stream`] does on a single
    /// node, and what every cluster node does when it applies a committed creation).
    pub(super) async fn create_stream_here(&self, def: StreamDef) -> Result<Arc<Stream>, EngineError> {
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
    pub(super) fn check_new_stream(&self, def: &StreamDef) -> Result<(), EngineError> {
        self.check_adoption(&def.name, def.partitions, def.compacted, "stream")?;
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
                let mut changed = self.watch_streams();
                match self.create_stream(def).await {
                    // Someone created it meanwhile with another definition: theirs stands. On a
                    // cluster node it may not have reached this node yet.
                    Err(EngineError::StreamExists { .. }) if self.is_replicated() => {
                        self.await_stream(name, &mut changed).await
                    }
                    Err(EngineError::StreamExists { .. }) => self.stream(name),
                    other => other,
                }
            }
            Err(error) => Err(error),
        }
    }

    /// Changes the retention limits of the stream `name`, durably (the definition is in the
    /// catalog before this returns); the next maintenance pass applies them. Returns the stream
    /// as now defined.
    pub async fn alter_stream_retention(
        &self,
        name: &str,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> Result<Arc<Stream>, EngineError> {
        if self.is_replicated() {
            return self.alter_stream_replicated(name, StreamChange::Retention { retention_ms, retention_bytes }).await;
        }
        self.alter_stream_retention_here(name, retention_ms, retention_bytes).await
    }

    /// Changes a stream's retention on this node.
    pub(super) async fn alter_stream_retention_here(
        &self,
        name: &str,
        retention_ms: Option<u64>,
        retention_bytes: Option<u64>,
    ) -> Result<Arc<Stream>, EngineError> {
        let _ddl = self.ddl.lock().await;
        let existing = self.stream(name)?;
        let def = StreamDef { retention_ms, retention_bytes, ..existing.def().clone() };
        def.validate()?;
        if &def == existing.def() {
            return Ok(existing);
        }
        self.catalog.append(&[catalog::stream_record(&def)]).await?;
        let stream = Arc::new(existing.redefined(def));
        self.streams.write().expect("streams lock").insert(name.to_string(), stream.clone());
        self.streams_changed();
        tracing::info!(stream = name, definition = %stream.def().describe(), "stream retention changed");
        Ok(stream)
    }

    /// Grows the stream `name` to `partitions` partitions, durably (the definition is in the
    /// catalog before this returns), as Kafka's CreatePartitions does: records already stored
    /// stay where they are, and keys hash over the new count from now on. Subscriptions move on
    /// to the new partitions by themselves. A stream a view or transform reads keeps its
    /// partitions (they read a fixed set), and partitions are never taken away.
    pub async fn add_stream_partitions(&self, name: &str, partitions: u32) -> Result<Arc<Stream>, EngineError> {
        if self.is_replicated() {
            return self.alter_stream_replicated(name, StreamChange::Partitions(partitions)).await;
        }
        self.add_stream_partitions_here(name, partitions).await
    }

    /// Adds partitions to a stream on this node.
    pub(super) async fn add_stream_partitions_here(
        &self,
        name: &str,
        partitions: u32,
    ) -> Result<Arc<Stream>, EngineError> {
        let _ddl = self.ddl.lock().await;
        let existing = self.stream(name)?;
        let current = existing.partition_count();
        if partitions <= current {
            return Err(EngineError::InvalidDefinition(format!(
                "{name:?} has {current} partition(s): partitions can be added, not taken away, so ask for more than {current}"
            )));
        }
        if existing.is_table() || self.transform(name).is_some() {
            return Err(EngineError::InvalidDefinition(format!(
                "{name:?} is a table's storage or a transform's output: its partitions are set by its definition"
            )));
        }
        self.check_unread(name)?;
        let def = StreamDef { partitions, ..existing.def().clone() };
        def.validate()?;
        self.catalog.append(&[catalog::stream_record(&def)]).await?;
        let config = self.partition_config(&def);
        let added = (current..partitions)
            .map(|index| self.log.open_partition(name, index, config.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let stream = Arc::new(existing.grown(def, added));
        self.streams.write().expect("streams lock").insert(name.to_string(), stream.clone());
        existing.supersede(stream.clone());
        self.streams_changed();
        tracing::info!(stream = name, from = current, to = partitions, "stream partitions added");
        Ok(stream)
    }

    /// Drops the stream `name` and deletes its records. Its subscriptions end. On a cluster
    /// node the cluster drops it, on every node.
    pub async fn drop_stream(&self, name: &str) -> Result<(), EngineError> {
        if self.is_replicated() {
            return self.drop_stream_replicated(name).await;
        }
        self.drop_stream_here(name).await
    }

    /// Drops a stream on this node.
    pub(super) async fn drop_stream_here(&self, name: &str) -> Result<(), EngineError> {
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
}

/// Per stream, the next offset of each of its partitions: where a reader of every stream
/// stands (a state derived from the streams, checkpointed with the positions it covers).
pub type Positions = std::collections::BTreeMap<String, Vec<u64>>;

/// Records one step of [`Engine::read_on`] reads at most.
const READ_ON_RECORDS_MAX: usize = 4096;
/// Bytes that step reads at most: the memory a start holds for it, whatever the backlog.
const READ_ON_BYTES_MAX: usize = 8 * 1024 * 1024;

impl Engine {
    /// Every stream's end offsets: positions that cover everything in the log now.
    pub fn end_positions(&self) -> Positions {
        self.streams().iter().map(|stream| (stream.name().to_string(), stream.end_offsets())).collect()
    }

    /// Whether some stream has records past `positions` (a stream they do not name, past its
    /// start): what a state checkpointed at `positions` has not seen.
    pub fn grown_past(&self, positions: &Positions) -> bool {
        self.streams().iter().any(|stream| {
            let ends = stream.end_offsets();
            match positions.get(stream.name()) {
                Some(positions) => *positions != ends,
                None => stream.start_offsets() != ends,
            }
        })
    }

    /// Reads every stream on from `positions` (a stream they do not name, from its start) to
    /// its end now, handing each record to `visit` with its stream and partition, a bounded
    /// step at a time; returns how many records were read. How a state derived from the
    /// streams (retained MQTT messages, Kafka producer sequences) catches up at start from its
    /// last checkpoint.
    pub fn read_on(
        &self,
        positions: &Positions,
        mut visit: impl FnMut(&Stream, u32, &Record),
    ) -> Result<u64, EngineError> {
        let mut read = 0;
        for stream in self.streams() {
            let starts = positions.get(stream.name()).cloned().unwrap_or_else(|| stream.start_offsets());
            for partition in 0..stream.partition_count() {
                let end = stream.end_offset(partition)?;
                let mut next =
                    starts.get(partition as usize).copied().unwrap_or(0).max(stream.start_offset(partition)?);
                while next < end {
                    let records =
                        stream.read(partition, Position::Offset(next), READ_ON_RECORDS_MAX, READ_ON_BYTES_MAX)?;
                    let Some(last) = records.last() else { break };
                    next = last.offset + 1;
                    read += records.len() as u64;
                    for record in &records {
                        visit(&stream, partition, record);
                    }
                }
            }
        }
        Ok(read)
    }
}
