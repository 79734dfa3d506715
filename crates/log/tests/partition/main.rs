//! One partition through its public API: offsets under concurrency, exact round trips, limits,
//! reads and their errors, waiting for records, time lookups, segment rolling and indexes,
//! durability levels, close, retention, compaction, and the log directory with its lock.

#[path = "../common/mod.rs"]
mod common;

mod appends;
mod maintenance;
mod reads;
mod store;

use std::fs;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use common::{
    assert_exact, batches_and_data_end, batches_in, filler, joined, read_all, remove_index_files, segment_bases,
    segment_path, small_config, spawn_tasks, stored,
};
use onehop_log::{
    AppendError, DirLock, Durability, LockError, Log, LogOptions, NewRecord, OpenError, Partition, PartitionConfig,
    ReadError, Record, Text,
};

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as i64
}

fn open(dir: &std::path::Path, config: PartitionConfig) -> Partition {
    Partition::open(dir, config).expect("open the partition").0
}

fn reopen(partition: Partition) -> Partition {
    let dir = partition.dir().to_path_buf();
    partition.close();
    drop(partition);
    let (partition, report) = Partition::open_existing(&dir).expect("reopen the partition");
    assert_eq!(report.truncated_bytes, 0, "a cleanly closed partition has nothing to cut: {report:?}");
    partition
}

/// A record with an explicit timestamp and a value that names it.
fn numbered(i: u64, value_len: usize) -> NewRecord {
    NewRecord { timestamp_ms: Some(1_000 + i as i64), value: Some(filler(i, value_len)), ..Default::default() }
}
