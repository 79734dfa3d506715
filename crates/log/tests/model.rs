//! A partition against an in-memory model, driven by random sequences of appends, reads, time
//! lookups, reopens, retention and compaction.
//!
//! Appends are awaited one at a time, so each append is exactly one batch and the model can
//! follow the segment layout byte for byte: a batch is 48 header bytes plus its records, and it
//! starts a new segment when the active one is not empty and the batch would take it past
//! `segment_bytes_max`. That lets the model predict retention and compaction exactly (which
//! segments go, how many bytes they held, what the rewritten segments weigh), and after every
//! step the files on disk, the partition's counters and a full read must agree with it.
//!
//! `ONEHOP_MODEL_CASES` sets the number of cases (default 48).

mod common;

use std::collections::HashMap;

use bytes::Bytes;
use common::{assert_exact, batches_and_data_end, filler, read_all, remove_index_files, segment_bases, segment_path};
use onehop_log::{
    AppendAck, AppendError, CompactionReport, Durability, NewRecord, Partition, PartitionConfig, ReadError, Record,
    RetentionReport, Text,
};
use proptest::collection::vec;
use proptest::prelude::*;

/// Record timestamps are `TIME_ORIGIN_MS` plus up to 10 s, so retention and tombstone deadlines
/// chosen in the same range cut through the data.
const TIME_ORIGIN_MS: i64 = 1_000_000;
const BATCH_HEADER_BYTES: u64 = onehop_log::BATCH_HEADER_BYTES as u64;
/// Compaction writes survivors in batches of about this many bytes (maintenance.rs).
const COMPACTED_BATCH_BYTES: u64 = 256 * 1024;

#[derive(Clone, Debug)]
struct Settings {
    compacted: bool,
    index_interval_bytes: u64,
    retention_bytes: Option<u64>,
    retention_ms: Option<u64>,
    tombstone_retention_ms: u64,
}

impl Settings {
    fn config(&self) -> PartitionConfig {
        PartitionConfig {
            segment_bytes_max: 4096,
            index_interval_bytes: self.index_interval_bytes,
            durability: Durability::Async,
            async_fsync_interval_ms: 10,
            record_bytes_max: 2048,
            batch_bytes_max: 4096,
            queue_bytes_max: 1 << 20,
            retention_ms: self.retention_ms,
            retention_bytes: self.retention_bytes,
            compacted: self.compacted,
            tombstone_retention_ms: self.tombstone_retention_ms,
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append {
        records: Vec<NewRecord>,
        fsync: bool,
    },
    /// `from` is reduced into a range around the stored offsets when the step runs.
    Read {
        from: u64,
        max_records: usize,
        max_bytes: ByteLimit,
    },
    TimeLookup {
        timestamp_ms: i64,
    },
    Reopen {
        drop_indexes: bool,
    },
    Retention {
        now_ms: i64,
    },
    Compact {
        now_ms: i64,
    },
}

/// The byte limit of a read.
#[derive(Clone, Debug)]
enum ByteLimit {
    Unlimited,
    Bytes(usize),
    /// Exactly the key and value bytes of the first `records` records read, plus `delta`: the
    /// edge where one more or one fewer record comes back.
    Edge {
        records: usize,
        delta: i64,
    },
}

fn settings() -> impl Strategy<Value = Settings> {
    (
        proptest::bool::weighted(0.7),
        prop_oneof![Just(64u64), Just(256), Just(1024), Just(4096)],
        proptest::option::weighted(0.5, 5_000u64..20_000),
        proptest::option::weighted(0.4, 2_000u64..15_000),
        0u64..6_000,
    )
        .prop_map(|(compacted, index_interval_bytes, retention_bytes, retention_ms, tombstone_retention_ms)| {
            Settings { compacted, index_interval_bytes, retention_bytes, retention_ms, tombstone_retention_ms }
        })
}

fn record() -> impl Strategy<Value = NewRecord> {
    let key = prop_oneof![
        2 => Just(None),
        // A handful of keys, so compaction has versions to remove.
        4 => (0u8..6).prop_map(|key| Some(Bytes::from(format!("key-{key}")))),
        1 => vec(any::<u8>(), 0..12).prop_map(|key| Some(Bytes::from(key))),
    ];
    let subject = proptest::option::of("[a-z]{1,6}(/[a-z0-9]{1,6}){0,2}");
    // Names repeat (from a small set), and a value may be null, as Kafka's headers allow.
    let header_value =
        prop_oneof![5 => vec(any::<u8>(), 0..16).prop_map(|value| Some(Bytes::from(value))), 1 => Just(None)];
    let headers = vec(("[a-c-]{0,2}", header_value), 0..4);
    // Mostly small values, some up to ~2 KB (beyond record_bytes_max with the other fields).
    let value_len = prop_oneof![4 => 0usize..64, 2 => 64usize..400, 1 => 400usize..2_100];
    let value =
        prop_oneof![1 => Just(None), 6 => (value_len, any::<u64>()).prop_map(|(len, seed)| Some(filler(seed, len)))];
    (key, subject, headers, value, 0i64..10_000).prop_map(|(key, subject, headers, value, age)| NewRecord {
        timestamp_ms: Some(TIME_ORIGIN_MS + age),
        key,
        subject: subject.map(Text::from),
        headers: headers.into_iter().map(|(name, value)| (Text::from(name), value)).collect(),
        value,
    })
}

fn op() -> impl Strategy<Value = Op> {
    let instant = TIME_ORIGIN_MS..TIME_ORIGIN_MS + 25_000;
    prop_oneof![
        10 => (vec(record(), 1..=5), proptest::bool::weighted(0.2)).prop_map(|(records, fsync)| Op::Append { records, fsync }),
        4 => (any::<u64>(), 0usize..8, byte_limit())
            .prop_map(|(from, max_records, max_bytes)| Op::Read { from, max_records, max_bytes }),
        2 => (TIME_ORIGIN_MS - 100..TIME_ORIGIN_MS + 10_100).prop_map(|timestamp_ms| Op::TimeLookup { timestamp_ms }),
        1 => any::<bool>().prop_map(|drop_indexes| Op::Reopen { drop_indexes }),
        2 => instant.clone().prop_map(|now_ms| Op::Retention { now_ms }),
        2 => instant.prop_map(|now_ms| Op::Compact { now_ms }),
    ]
}

fn byte_limit() -> impl Strategy<Value = ByteLimit> {
    prop_oneof![
        Just(ByteLimit::Unlimited),
        (0usize..3_000).prop_map(ByteLimit::Bytes),
        (1usize..6, -1i64..=1).prop_map(|(records, delta)| ByteLimit::Edge { records, delta }),
    ]
}

fn encoded_len(record: &Record) -> u64 {
    let new = NewRecord {
        timestamp_ms: Some(record.timestamp_ms),
        key: record.key.clone(),
        subject: record.subject.clone(),
        headers: record.headers.to_vec(),
        value: record.value.clone(),
    };
    new.encoded_len() as u64
}

struct ModelSegment {
    base_offset: u64,
    bytes: u64,
    records: Vec<Record>,
}

/// What the partition should hold: its segments and their records.
struct Model {
    config: PartitionConfig,
    segments: Vec<ModelSegment>,
    next_offset: u64,
}

impl Model {
    fn new(config: PartitionConfig) -> Self {
        Model { config, segments: vec![ModelSegment { base_offset: 0, bytes: 0, records: Vec::new() }], next_offset: 0 }
    }

    fn start_offset(&self) -> u64 {
        self.segments[0].base_offset
    }

    fn records(&self) -> impl Iterator<Item = &Record> {
        self.segments.iter().flat_map(|segment| segment.records.iter())
    }

    fn append(&mut self, records: &[NewRecord]) -> Result<AppendAck, AppendError> {
        if records.is_empty() {
            return Err(AppendError::EmptyBatch);
        }
        let mut total = 0;
        for record in records {
            let len = record.encoded_len();
            if len > self.config.record_bytes_max {
                return Err(AppendError::RecordTooLarge { size: len, max: self.config.record_bytes_max });
            }
            total += len;
        }
        if total > self.config.batch_bytes_max {
            return Err(AppendError::BatchTooLarge { size: total, max: self.config.batch_bytes_max });
        }
        let batch_bytes = BATCH_HEADER_BYTES + total as u64;
        let active = self.segments.last().unwrap();
        if active.bytes > 0 && active.bytes + batch_bytes > self.config.segment_bytes_max {
            self.segments.push(ModelSegment { base_offset: self.next_offset, bytes: 0, records: Vec::new() });
        }
        let base_offset = self.next_offset;
        let active = self.segments.last_mut().unwrap();
        active.bytes += batch_bytes;
        for (i, new) in records.iter().enumerate() {
            active.records.push(common::stored(base_offset + i as u64, new));
        }
        self.next_offset += records.len() as u64;
        Ok(AppendAck { base_offset, record_count: records.len() as u32 })
    }

    fn read(&self, from: u64, max_records: usize, max_bytes: usize) -> Result<Vec<Record>, ReadError> {
        let (start, end) = (self.start_offset(), self.next_offset);
        if from < start {
            return Err(ReadError::BeforeStart { offset: from, start });
        }
        if from > end {
            return Err(ReadError::PastEnd { offset: from, end });
        }
        let mut records = Vec::new();
        if max_records == 0 {
            return Ok(records);
        }
        let mut bytes = 0;
        for record in self.records().filter(|record| record.offset >= from) {
            bytes += record.key.as_ref().map_or(0, Bytes::len) + record.value.as_ref().map_or(0, Bytes::len);
            records.push(record.clone());
            if records.len() >= max_records || bytes >= max_bytes {
                break;
            }
        }
        Ok(records)
    }

    fn offset_for_timestamp(&self, timestamp_ms: i64) -> Option<u64> {
        self.records().find(|record| record.timestamp_ms >= timestamp_ms).map(|record| record.offset)
    }

    /// Oldest closed segments go while too old or while the partition is too big; a prefix only.
    fn enforce_retention(&mut self, now_ms: i64) -> RetentionReport {
        let mut report = RetentionReport::default();
        if self.config.retention_ms.is_none() && self.config.retention_bytes.is_none() {
            return report;
        }
        let mut total: u64 = self.segments.iter().map(|segment| segment.bytes).sum();
        while self.segments.len() > 1 {
            let oldest = &self.segments[0];
            let newest_ms = oldest.records.iter().map(|record| record.timestamp_ms).max().unwrap_or(i64::MIN);
            let too_old = self.config.retention_ms.is_some_and(|age| newest_ms < now_ms.saturating_sub(age as i64));
            let too_big = self.config.retention_bytes.is_some_and(|cap| total > cap);
            if !(too_old || too_big) {
                break;
            }
            total -= oldest.bytes;
            report.segments_deleted += 1;
            report.bytes_deleted += oldest.bytes;
            self.segments.remove(0);
        }
        report
    }

    /// Closed segments keep unkeyed records and the newest record per key (tombstones only while
    /// young); emptied segments disappear; rewritten ones are repacked into big batches.
    fn compact(&mut self, now_ms: i64) -> CompactionReport {
        let mut report = CompactionReport::default();
        if !self.config.compacted || self.segments.len() < 2 {
            return report;
        }
        let mut newest = HashMap::new();
        for record in self.records() {
            if let Some(key) = &record.key {
                newest.insert(key.clone(), record.offset);
            }
        }
        let deadline_ms = now_ms.saturating_sub(self.config.tombstone_retention_ms as i64);
        let active = self.segments.pop().unwrap();
        let mut kept = Vec::new();
        for mut segment in self.segments.drain(..) {
            let before = segment.records.len();
            segment.records.retain(|record| match &record.key {
                None => true,
                Some(key) => {
                    newest[key] == record.offset && !(record.value.is_none() && record.timestamp_ms < deadline_ms)
                }
            });
            if segment.records.len() == before {
                kept.push(segment);
                continue;
            }
            report.segments_rewritten += 1;
            report.records_removed += (before - segment.records.len()) as u64;
            report.bytes_before += segment.bytes;
            if segment.records.is_empty() {
                continue;
            }
            segment.bytes = repacked_bytes(&segment.records);
            report.bytes_after += segment.bytes;
            kept.push(segment);
        }
        kept.push(active);
        self.segments = kept;
        report
    }
}

/// The size of `records` written as compaction writes them.
fn repacked_bytes(records: &[Record]) -> u64 {
    let mut bytes = 0;
    let mut at = 0;
    while at < records.len() {
        let mut batch = BATCH_HEADER_BYTES;
        let first = at;
        while at < records.len() && (at == first || batch < COMPACTED_BATCH_BYTES) {
            batch += encoded_len(&records[at]);
            at += 1;
        }
        bytes += batch;
    }
    bytes
}

/// The partition, its files and a full read agree with the model.
fn check(partition: &Partition, model: &Model, step: &str) {
    let dir = partition.dir();
    assert_eq!(partition.start_offset(), model.start_offset(), "{step}: start offset");
    assert_eq!(partition.end_offset(), model.next_offset, "{step}: end offset");
    assert_eq!(partition.segment_count(), model.segments.len(), "{step}: segment count");
    let bases: Vec<u64> = model.segments.iter().map(|segment| segment.base_offset).collect();
    assert_eq!(segment_bases(dir), bases, "{step}: segment files");
    // Closed segments are exactly their batches; the active one may have zeros after them.
    for (i, segment) in model.segments.iter().enumerate() {
        let path = segment_path(dir, segment.base_offset);
        let (_, data_bytes) = batches_and_data_end(&path);
        assert_eq!(data_bytes, segment.bytes, "{step}: size of segment {}", segment.base_offset);
        if i + 1 < model.segments.len() {
            assert_exact(&path);
        }
    }
    assert_eq!(partition.size_bytes(), model.segments.iter().map(|segment| segment.bytes).sum::<u64>(), "{step}");
    let stored = read_all(partition);
    let expected: Vec<Record> = model.records().cloned().collect();
    if stored != expected {
        let first_difference = stored.iter().zip(&expected).position(|(a, b)| a != b);
        panic!(
            "{step}: the partition holds {} records, the model {}; first difference at index {first_difference:?}",
            stored.len(),
            expected.len()
        );
    }
    assert!(stored.windows(2).all(|pair| pair[0].offset < pair[1].offset), "{step}: offsets must increase");
}

fn run(settings: Settings, ops: Vec<Op>) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = settings.config();
    let (mut partition, _) = Partition::open(dir.path(), config.clone()).unwrap();
    let mut model = Model::new(config);
    check(&partition, &model, "open");
    for (i, op) in ops.into_iter().enumerate() {
        let step = format!(
            "step {i} ({})",
            match &op {
                Op::Append { records, .. } => format!("append {}", records.len()),
                other => format!("{other:?}"),
            }
        );
        match op {
            Op::Append { records, fsync } => {
                let durability = if fsync { Durability::Fsync } else { Durability::Async };
                let actual = runtime.block_on(partition.append_with(&records, durability));
                assert_eq!(actual, model.append(&records), "{step}");
            }
            Op::Read { from, max_records, max_bytes } => {
                // From a little before the start to a little past the end.
                let low = model.start_offset().saturating_sub(2);
                let from = low + from % (model.next_offset - low + 3);
                let max_bytes = match max_bytes {
                    ByteLimit::Unlimited => usize::MAX,
                    ByteLimit::Bytes(bytes) => bytes,
                    ByteLimit::Edge { records, delta } => {
                        let bytes: usize = model
                            .records()
                            .filter(|record| record.offset >= from)
                            .take(records)
                            .map(|record| {
                                record.key.as_ref().map_or(0, Bytes::len) + record.value.as_ref().map_or(0, Bytes::len)
                            })
                            .sum();
                        (bytes as i64 + delta).max(0) as usize
                    }
                };
                let actual = partition.read(from, max_records, max_bytes);
                assert_eq!(
                    actual,
                    model.read(from, max_records, max_bytes),
                    "{step}: read({from}, {max_records}, {max_bytes})"
                );
            }
            Op::TimeLookup { timestamp_ms } => {
                let actual = partition.offset_for_timestamp(timestamp_ms).unwrap();
                assert_eq!(actual, model.offset_for_timestamp(timestamp_ms), "{step}");
            }
            Op::Reopen { drop_indexes } => {
                partition.close();
                drop(partition);
                // A clean close leaves every segment exactly its batches, the active one too.
                for segment in &model.segments {
                    assert_exact(&segment_path(dir.path(), segment.base_offset));
                }
                if drop_indexes {
                    remove_index_files(dir.path());
                }
                let report;
                (partition, report) = Partition::open_existing(dir.path()).unwrap();
                assert_eq!(report.truncated_bytes, 0, "{step}: {report:?}");
                assert_eq!(report.segments, model.segments.len(), "{step}");
                if drop_indexes {
                    assert_eq!(report.indexes_rebuilt, model.segments.len(), "{step}");
                } else {
                    assert_eq!(report.indexes_rebuilt, 0, "{step}: a clean close leaves every index current");
                }
            }
            Op::Retention { now_ms } => {
                let actual = partition.enforce_retention(now_ms).unwrap();
                assert_eq!(actual, model.enforce_retention(now_ms), "{step}");
            }
            Op::Compact { now_ms } => {
                let actual = partition.compact(now_ms).unwrap();
                assert_eq!(actual, model.compact(now_ms), "{step}");
            }
        }
        check(&partition, &model, &step);
    }
    // Whatever happened, a reopen changes nothing.
    partition.close();
    drop(partition);
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.truncated_bytes, 0);
    check(&partition, &model, "final reopen");
}

fn cases() -> u32 {
    std::env::var("ONEHOP_MODEL_CASES").ok().and_then(|cases| cases.parse().ok()).unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 512, ..ProptestConfig::default() })]

    #[test]
    fn partition_matches_model(settings in settings(), ops in vec(op(), 1..100)) {
        run(settings, ops);
    }
}
