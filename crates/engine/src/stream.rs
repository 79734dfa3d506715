//! A stream: N partitions of the log under one name.
//!
//! The partitioning rule, one for every protocol ([`Stream::partition_of`]): a record with a
//! key goes to the partition its key hashes to (CRC32C of the key, modulo the partition
//! count), so one key's records stay in order. A record without a key goes, when its writer
//! keeps its subjects in order (an MQTT topic's messages), to the partition its subject hashes
//! to the same way; otherwise records without a key are spread round-robin, one partition per
//! publish call.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use onehop_log::{Durability, NewRecord, Partition, Record};

use crate::catalog::StreamDef;
use crate::engine::replicated::{self, ReplicatorSlot};
use crate::error::EngineError;
use crate::subject::SubjectFilter;

/// Where a read starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    /// The oldest record still stored.
    Earliest,
    /// The end: only what is published from now on.
    Latest,
    /// A given offset.
    Offset(u64),
    /// The first record with a timestamp at or after this (ms since the Unix epoch).
    Time(i64),
}

/// Where a published record went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Published {
    pub partition: u32,
    pub offset: u64,
}

pub struct Stream {
    def: StreamDef,
    partitions: Vec<Arc<Partition>>,
    /// The partition the next keyless publish goes to.
    next_keyless: AtomicU32,
    /// Whether this is a table's storage (row changes, not published records).
    table: bool,
    /// The MQTT topics routed here (`mqtt_topic`), parsed.
    mqtt_route: Option<SubjectFilter>,
    /// Set once this stream gains partitions: the stream as now defined. Subscriptions
    /// ([`crate::Cursor`]) move on to it and read the new partitions too.
    successor: std::sync::OnceLock<Arc<Stream>>,
    /// Woken when `successor` is set.
    superseded: tokio::sync::Notify,
    /// Set on a cluster node: writes go to the cluster, which appends them here once committed.
    replicator: ReplicatorSlot,
}

impl Stream {
    pub(crate) fn new(def: StreamDef, partitions: Vec<Arc<Partition>>, replicator: ReplicatorSlot) -> Self {
        assert_eq!(partitions.len(), def.partitions as usize, "one log partition per stream partition");
        let mqtt_route = def.mqtt_topic.as_deref().and_then(|topic| crate::catalog::mqtt_route(topic).ok());
        Stream {
            def,
            partitions,
            next_keyless: AtomicU32::new(0),
            table: false,
            mqtt_route,
            successor: std::sync::OnceLock::new(),
            superseded: tokio::sync::Notify::new(),
            replicator,
        }
    }

    /// The storage of a table: one compacted partition of row changes.
    pub(crate) fn table_storage(def: StreamDef, partition: Arc<Partition>) -> Self {
        assert_eq!(def.partitions, 1, "a table is stored in one partition");
        let mut stream = Stream::new(def, vec![partition], ReplicatorSlot::default());
        stream.table = true;
        stream
    }

    /// Whether this stream is a table's storage: its records are row changes.
    pub fn is_table(&self) -> bool {
        self.table
    }

    /// The MQTT topic filter whose topics this stream takes, when it declares one.
    pub fn mqtt_route(&self) -> Option<&SubjectFilter> {
        self.mqtt_route.as_ref()
    }

    pub fn def(&self) -> &StreamDef {
        &self.def
    }

    pub fn name(&self) -> &str {
        &self.def.name
    }

    pub fn partition_count(&self) -> u32 {
        self.def.partitions
    }

    /// The log partition `index`. Inside the engine only: front ends go through the stream's
    /// own calls (offsets, reads, publishes), so every protocol meets the same rules.
    pub(crate) fn partition(&self, index: u32) -> Result<&Arc<Partition>, EngineError> {
        self.partitions.get(index as usize).ok_or_else(|| EngineError::UnknownPartition {
            stream: self.def.name.clone(),
            partition: index,
            count: self.def.partitions,
        })
    }

    /// Refuses a partition the stream does not have.
    pub fn check_partition(&self, index: u32) -> Result<(), EngineError> {
        self.partition(index).map(drop)
    }

    /// The offset the next record of `partition` gets: every offset before it is readable.
    pub fn end_offset(&self, partition: u32) -> Result<u64, EngineError> {
        Ok(self.partition(partition)?.end_offset())
    }

    /// Waits until `partition` holds a record at or after `offset` (its end offset passes
    /// it), without polling: the log wakes the waiter when a batch becomes readable. Returns
    /// the new end offset. A long-poll read (Kafka's Fetch) waits here, under a timeout.
    pub async fn wait_for(&self, partition: u32, offset: u64) -> Result<u64, EngineError> {
        Ok(self.partition(partition)?.wait_for(offset).await?)
    }

    /// The first offset of `partition` still stored (earlier ones went to retention).
    pub fn start_offset(&self, partition: u32) -> Result<u64, EngineError> {
        Ok(self.partition(partition)?.start_offset())
    }

    /// Deletes the records of `partition` before `offset` (Kafka's DeleteRecords; at most its
    /// end): its start moves there, durably. Returns the new start. Not on a cluster node yet:
    /// every node would have to delete alike, in log order.
    pub fn delete_before(&self, partition: u32, offset: u64) -> Result<u64, EngineError> {
        if self.replicator.get().is_some() {
            return Err(EngineError::NotReplicated("deleting records (DeleteRecords)"));
        }
        let log = self.partition(partition)?;
        log.delete_before(offset).map_err(|error| EngineError::Internal(format!("deleting records: {error}")))
    }

    /// The first record of `partition` with the largest timestamp, as `(offset, timestamp)`:
    /// `None` when it holds none.
    pub fn max_timestamp(&self, partition: u32) -> Result<Option<(u64, i64)>, EngineError> {
        Ok(self.partition(partition)?.max_timestamp()?)
    }

    /// Bytes `partition` holds on disk.
    pub fn size_bytes(&self, partition: u32) -> Result<u64, EngineError> {
        Ok(self.partition(partition)?.size_bytes())
    }

    /// Every partition's end offset, in partition order.
    pub fn end_offsets(&self) -> Vec<u64> {
        self.partitions.iter().map(|partition| partition.end_offset()).collect()
    }

    /// Every partition's start offset, in partition order.
    pub fn start_offsets(&self) -> Vec<u64> {
        self.partitions.iter().map(|partition| partition.start_offset()).collect()
    }

    /// The log settings `partition` was opened with.
    pub fn partition_config(&self, partition: u32) -> Result<onehop_log::PartitionConfig, EngineError> {
        let log = self.partition(partition)?;
        let mut config = log.config().clone();
        (config.retention_ms, config.retention_bytes) = log.retention();
        Ok(config)
    }

    /// This stream with `def` (its retention changed): the same partitions, their retention
    /// set to the new limits.
    pub(crate) fn redefined(&self, def: StreamDef) -> Stream {
        for partition in &self.partitions {
            partition.set_retention(def.retention_ms, def.retention_bytes);
        }
        let mut stream = Stream::new(def, self.partitions.clone(), self.replicator.clone());
        stream.table = self.table;
        stream
    }

    /// This stream with `def` (more partitions): its partitions, then `added`.
    pub(crate) fn grown(&self, def: StreamDef, added: Vec<Arc<Partition>>) -> Stream {
        let partitions = self.partitions.iter().cloned().chain(added).collect();
        Stream::new(def, partitions, self.replicator.clone())
    }

    /// Hands this stream's subscriptions over to `next`, which has more partitions.
    pub(crate) fn supersede(&self, next: Arc<Stream>) {
        if self.successor.set(next).is_ok() {
            self.superseded.notify_waiters();
        }
    }

    /// The stream as redefined with more partitions, once it has been.
    pub fn successor(&self) -> Option<&Arc<Stream>> {
        self.successor.get()
    }

    /// Resolves once this stream has a successor (create it, then check
    /// [`Stream::successor`], so a handover in between is not missed).
    pub(crate) fn superseded(&self) -> tokio::sync::futures::Notified<'_> {
        self.superseded.notified()
    }

    /// Checks `records` against the limits of `partition` without writing anything: what a
    /// publish there would refuse, this refuses with the same error.
    pub fn check(&self, partition: u32, records: &[NewRecord]) -> Result<(), EngineError> {
        self.partition(partition)?.check(records)?;
        Ok(())
    }

    /// The partition of the next publish's keyless records (round-robin over the partitions).
    pub(crate) fn next_keyless_partition(&self) -> u32 {
        self.next_keyless.fetch_add(1, Ordering::Relaxed) % self.def.partitions
    }

    /// The partition every record with `key` goes to.
    pub fn partition_for_key(&self, key: &[u8]) -> u32 {
        crc32c::crc32c(key) % self.def.partitions
    }

    /// The partition every keyless record of `subject` goes to, when its writer keeps one
    /// subject's records in order.
    pub fn partition_for_subject(&self, subject: &str) -> u32 {
        crc32c::crc32c(subject.as_bytes()) % self.def.partitions
    }

    /// The partitioning rule (see the module's documentation): `key`'s partition; else, with
    /// `ordered_subject`, that subject's; else `round_robin`, the partition of this publish's
    /// keyless records.
    pub fn partition_of(&self, key: Option<&[u8]>, ordered_subject: Option<&str>, round_robin: u32) -> u32 {
        match (key, ordered_subject) {
            (Some(key), _) => self.partition_for_key(key),
            (None, Some(subject)) => self.partition_for_subject(subject),
            (None, None) => round_robin,
        }
    }

    /// Publishes `records` and returns where each went, in order, once all are durable at
    /// `durability` (the stream's default when `None`). Every record is checked against the
    /// limits before anything is written, so a refused publish writes nothing. Records for
    /// different partitions are appended per partition; should storage fail midway, the
    /// partitions already appended keep their records (the error says storage failed).
    pub async fn publish(
        &self,
        records: &[NewRecord],
        durability: Option<Durability>,
    ) -> Result<Vec<Published>, EngineError> {
        let durability = durability.unwrap_or(self.def.durability);
        if records.is_empty() {
            return Err(onehop_log::AppendError::EmptyBatch.into());
        }
        if let Some(replicator) = self.replicator.get() {
            // The leader partitions and places them; every durability is the cluster's.
            let request = replicated::publish_request(self.name(), None, records, None);
            return replicated::published(replicated::submit_queued(replicator, request).await?.await);
        }
        let keyless = if records.iter().any(|record| record.key.is_none()) { self.next_keyless_partition() } else { 0 };
        let targets: Vec<u32> =
            records.iter().map(|record| self.partition_of(record.key.as_deref(), None, keyless)).collect();
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (index, &partition) in targets.iter().enumerate() {
            groups.entry(partition).or_default().push(index);
        }
        if groups.len() == 1 {
            let partition = targets[0];
            let ack = self.partitions[partition as usize].append_with(records, durability).await?;
            return Ok((0..records.len() as u64)
                .map(|i| Published { partition, offset: ack.base_offset + i })
                .collect());
        }
        let grouped: Vec<(u32, Vec<usize>, Vec<NewRecord>)> = groups
            .into_iter()
            .map(|(partition, indexes)| {
                let group = indexes.iter().map(|&index| records[index].clone()).collect();
                (partition, indexes, group)
            })
            .collect();
        for (partition, _, group) in &grouped {
            self.partitions[*partition as usize].check(group)?;
        }
        let mut published = vec![Published { partition: 0, offset: 0 }; records.len()];
        for (partition, indexes, group) in grouped {
            let ack = self.partitions[partition as usize].append_with(&group, durability).await?;
            for (i, index) in indexes.into_iter().enumerate() {
                published[index] = Published { partition, offset: ack.base_offset + i as u64 };
            }
        }
        Ok(published)
    }

    /// On a cluster node, publishes `records` (an idempotent write, tagged) through the
    /// cluster: the places, and whether the leader answered with an earlier write's (a
    /// replay). `None` on a single node.
    pub(crate) async fn publish_replicated(
        &self,
        records: &[NewRecord],
    ) -> Option<Result<(Vec<Published>, bool), EngineError>> {
        let replicator = self.replicator.get()?;
        let request = replicated::publish_request(self.name(), None, records, None);
        Some(match replicated::submit_queued(replicator, request).await {
            Ok(submitted) => replicated::published_or_replayed(submitted.await),
            Err(error) => Err(error),
        })
    }

    /// Queues `records` to `partition` and returns once they are queued, in order behind
    /// earlier queued appends; the returned future resolves when they are durable at
    /// `durability` (the stream's default when `None`). A caller that queues from one task keeps
    /// its records in the order it queued them (MQTT's ordered delivery per topic).
    pub async fn enqueue_to(
        &self,
        partition: u32,
        records: &[NewRecord],
        durability: Option<Durability>,
    ) -> Result<onehop_log::QueuedAppend, EngineError> {
        self.enqueue_to_in_term(partition, records, durability, None).await
    }

    /// [`Stream::enqueue_to`], on a cluster node with `term` only if the leader of that term
    /// prepares it: records a node decided to write from what it knew as that term's leader
    /// (an idempotent producer's sequence, a transaction's commit) are refused once another
    /// node leads, and nothing is written.
    pub async fn enqueue_to_in_term(
        &self,
        partition: u32,
        records: &[NewRecord],
        durability: Option<Durability>,
        term: Option<u64>,
    ) -> Result<onehop_log::QueuedAppend, EngineError> {
        let durability = durability.unwrap_or(self.def.durability);
        if let Some(replicator) = self.replicator.get() {
            self.partition(partition)?.check(records)?;
            let request = replicated::publish_request(self.name(), Some(partition), records, term);
            return Ok(replicated::queued_append(replicated::submit_queued(replicator, request).await?));
        }
        Ok(self.partition(partition)?.enqueue_with(records, durability).await?)
    }

    /// The offset `position` names in `partition`.
    pub fn resolve(&self, partition: u32, position: Position) -> Result<u64, EngineError> {
        let log = self.partition(partition)?;
        Ok(match position {
            Position::Earliest => log.start_offset(),
            Position::Latest => log.end_offset(),
            Position::Offset(offset) => offset,
            Position::Time(timestamp_ms) => log.offset_for_timestamp(timestamp_ms)?.unwrap_or_else(|| log.end_offset()),
        })
    }

    /// Reads up to `max_records` records (and about `max_bytes` of keys and values) of
    /// `partition` from `position`.
    pub fn read(
        &self,
        partition: u32,
        position: Position,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>, EngineError> {
        let from = self.resolve(partition, position)?;
        Ok(self.partition(partition)?.read(from, max_records, max_bytes)?)
    }
}
