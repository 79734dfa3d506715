//! Compacted system topics: the one home of onehop's own state kept in the log — the catalog,
//! view and transform checkpoints, MQTT retained messages and MQTT sessions.
//!
//! Each is one compacted partition, written with `fsync`, whose newest record per key is the
//! state of that key (a tombstone deletes it). At start its owner replays it from the first
//! record to the last, in offset order, through [`SystemTopic::replay`]: one read loop, one
//! byte bound per read, progress in the log for a long replay.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use onehop_log::{Durability, Log, NewRecord, Partition, PartitionConfig, Record};

use crate::error::EngineError;

/// Bytes of keys and values one step of a replay reads at most: the memory a replay holds at
/// once, whatever the topic's size.
const REPLAY_READ_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Records one step of a replay reads at most.
const REPLAY_READ_RECORDS_MAX: usize = 4096;
/// A replay running longer than this says how far it is, then again every as long.
const REPLAY_PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

/// The settings of a system topic's partition.
#[derive(Clone, Debug)]
pub struct SystemTopicConfig {
    /// Largest record the topic takes (a retained message is as large as the records of its
    /// stream may be).
    pub record_bytes_max: usize,
    /// Segment size: small topics roll small segments, so compaction has closed ones to work on.
    pub segment_bytes_max: u64,
}

impl Default for SystemTopicConfig {
    fn default() -> Self {
        let defaults = PartitionConfig::default();
        SystemTopicConfig { record_bytes_max: defaults.record_bytes_max, segment_bytes_max: defaults.segment_bytes_max }
    }
}

/// Largest record of a system topic every cluster node keeps alike ([`SystemTopicConfig::shared`]).
pub const SHARED_RECORD_BYTES_MAX: usize = 32 * 1024 * 1024;

impl SystemTopicConfig {
    /// The settings a cluster node opens a shared system topic with when it applies an append
    /// to one it has not opened yet (see `Engine::append_system`): records up to
    /// [`SHARED_RECORD_BYTES_MAX`], whatever its owner's own limit.
    pub fn shared() -> SystemTopicConfig {
        SystemTopicConfig { record_bytes_max: SHARED_RECORD_BYTES_MAX, ..SystemTopicConfig::default() }
    }

    fn partition_config(&self) -> PartitionConfig {
        let batch_bytes_max = self.record_bytes_max.max(1024 * 1024).min(self.segment_bytes_max as usize);
        PartitionConfig {
            compacted: true,
            durability: Durability::Fsync,
            segment_bytes_max: self.segment_bytes_max,
            record_bytes_max: self.record_bytes_max.min(batch_bytes_max),
            batch_bytes_max,
            queue_bytes_max: PartitionConfig::default().queue_bytes_max.max(batch_bytes_max),
            ..PartitionConfig::default()
        }
    }
}

/// A compacted system topic (see the module's documentation).
pub struct SystemTopic {
    name: String,
    partition: Arc<Partition>,
}

impl SystemTopic {
    /// Opens (creating it the first time) the system topic `name` in `log`.
    pub(crate) fn open(log: &Log, name: &str, config: &SystemTopicConfig) -> Result<Arc<SystemTopic>, EngineError> {
        if !name.starts_with("__") {
            return Err(EngineError::Internal(format!("system topic names start with \"__\", not {name:?}")));
        }
        let partition = log.open_partition(name, 0, config.partition_config())?;
        Ok(Arc::new(SystemTopic { name: name.to_string(), partition }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Hands every record, from the first to the last, in offset order, to `visit`; returns how
    /// many there were. A replay that takes long logs its progress.
    pub fn replay<E: From<EngineError>>(&self, mut visit: impl FnMut(Record) -> Result<(), E>) -> Result<u64, E> {
        let end = self.partition.end_offset();
        let start = self.partition.start_offset();
        let mut next = start;
        let mut records_seen = 0u64;
        let started = Instant::now();
        let mut report_at = started + REPLAY_PROGRESS_INTERVAL;
        while next < end {
            let records = self
                .partition
                .read(next, REPLAY_READ_RECORDS_MAX, REPLAY_READ_BYTES_MAX)
                .map_err(|error| E::from(error.into()))?;
            let Some(last) = records.last() else { break };
            let last_offset = last.offset;
            // Offsets only grow: a read that gave nothing new would loop forever.
            assert!(last_offset >= next, "a replay read went backwards: {last_offset} < {next}");
            next = last_offset + 1;
            for record in records {
                records_seen += 1;
                visit(record)?;
            }
            if Instant::now() >= report_at {
                report_at += REPLAY_PROGRESS_INTERVAL;
                let done = (next - start) as f64 / (end - start).max(1) as f64;
                tracing::info!(
                    topic = self.name, records = records_seen, progress = %format!("{:.0} %", done * 100.0),
                    "replaying a system topic"
                );
            }
        }
        Ok(records_seen)
    }

    /// The newest value of every key whose key is UTF-8 (a key whose newest record is a
    /// tombstone is absent).
    pub fn newest(&self) -> Result<HashMap<String, Bytes>, EngineError> {
        let mut newest = HashMap::new();
        self.replay(|record| {
            let Some(key) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) else {
                return Ok::<(), EngineError>(());
            };
            match record.value {
                None => newest.remove(key),
                Some(value) => newest.insert(key.to_string(), value),
            };
            Ok(())
        })?;
        Ok(newest)
    }

    /// The record at `offset`, if it is still there (compaction removes records whose key was
    /// written again or deleted).
    pub fn read_at(&self, offset: u64) -> Result<Option<Record>, EngineError> {
        if offset < self.partition.start_offset() || offset >= self.partition.end_offset() {
            return Ok(None);
        }
        let records = self.partition.read(offset, 1, 1).map_err(EngineError::from)?;
        Ok(records.into_iter().find(|record| record.offset == offset))
    }

    /// The offset of the first record at or after `from` whose key is `key`, if there is one
    /// (a record a caller appended through the cluster, found where this node applied it).
    pub fn find_key(&self, from: u64, key: &[u8]) -> Result<Option<u64>, EngineError> {
        let end = self.partition.end_offset();
        let mut next = from.max(self.partition.start_offset());
        while next < end {
            let records = self.partition.read(next, REPLAY_READ_RECORDS_MAX, REPLAY_READ_BYTES_MAX)?;
            let Some(last) = records.last() else { break };
            next = last.offset + 1;
            if let Some(found) = records.iter().find(|record| record.key.as_deref() == Some(key)) {
                return Ok(Some(found.offset));
            }
        }
        Ok(None)
    }

    /// Appends `records` (all at once: one batch) and returns once they are durable; the
    /// answer is the offset of the first.
    pub async fn append(&self, records: &[NewRecord]) -> Result<u64, EngineError> {
        Ok(self.partition.append(records).await?.base_offset)
    }

    /// The offset the next record gets.
    pub fn end_offset(&self) -> u64 {
        self.partition.end_offset()
    }
}
