//! Helpers shared by the integration tests: small configurations, expected records, and a look
//! at the files on disk (segment names, batch positions, index files).

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

pub mod disk;

use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use onehop_log::{BATCH_HEADER_BYTES, BatchHeader, Headers, NewRecord, Partition, PartitionConfig, Record};

/// Settings that roll a segment every few kilobytes, so a test with a few hundred records crosses
/// many segment boundaries and index entries.
pub fn small_config() -> PartitionConfig {
    PartitionConfig {
        segment_bytes_max: 4096,
        index_interval_bytes: 256,
        record_bytes_max: 4096,
        batch_bytes_max: 4096,
        queue_bytes_max: 1 << 20,
        ..Default::default()
    }
}

/// The record `new` becomes at `offset`; `new` must carry an explicit timestamp.
pub fn stored(offset: u64, new: &NewRecord) -> Record {
    Record {
        offset,
        timestamp_ms: new.timestamp_ms.expect("expected records carry explicit timestamps"),
        key: new.key.clone(),
        subject: new.subject.clone(),
        headers: Headers::from(&new.headers[..]),
        value: new.value.clone(),
    }
}

/// Starts `tasks` tokio tasks at once, task `n` running `task(n, partition)` with its own
/// handle on `partition`; returns them in task order, to be awaited when the test chooses.
pub fn spawn_tasks<T, Run>(
    partition: &Arc<Partition>,
    tasks: u64,
    task: impl Fn(u64, Arc<Partition>) -> Run,
) -> Vec<tokio::task::JoinHandle<T>>
where
    Run: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    (0..tasks).map(|n| tokio::spawn(task(n, partition.clone()))).collect()
}

/// What every task returned, task after task.
pub async fn joined<T>(tasks: Vec<tokio::task::JoinHandle<Vec<T>>>) -> Vec<T> {
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.unwrap());
    }
    all
}

/// Every record from the partition's start to its end, in one read.
pub fn read_all(partition: &Partition) -> Vec<Record> {
    partition.read(partition.start_offset(), usize::MAX, usize::MAX).expect("read the whole partition")
}

/// A value of `len` bytes that differs per `seed`, so a record read from the wrong place shows.
pub fn filler(seed: u64, len: usize) -> Bytes {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Base offsets of the segment files in `dir`, in order.
pub fn segment_bases(dir: &Path) -> Vec<u64> {
    let mut bases: Vec<u64> = fs::read_dir(dir)
        .expect("list the partition directory")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

pub fn segment_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

/// Removes every `.index` and `.timeindex` file, as a crash before they were written would.
pub fn remove_index_files(dir: &Path) -> usize {
    let mut removed = 0;
    for entry in fs::read_dir(dir).expect("list the partition directory") {
        let path = entry.expect("directory entry").path();
        if matches!(path.extension().and_then(|e| e.to_str()), Some("index" | "timeindex")) {
            fs::remove_file(&path).expect("remove an index file");
            removed += 1;
        }
    }
    removed
}

/// Removes the index files of one segment.
pub fn remove_segment_index(dir: &Path, base_offset: u64) {
    for suffix in ["index", "timeindex"] {
        let path = dir.join(format!("{base_offset:020}.{suffix}"));
        if path.exists() {
            fs::remove_file(path).expect("remove an index file");
        }
    }
}

/// The position and header of every batch in a segment file, parsed independently of the log.
/// The active segment may end in zeros (space kept ahead of the data); nothing else may follow
/// the last batch.
pub fn batches_in(path: &Path) -> Vec<(u64, BatchHeader)> {
    batches_and_data_end(path).0
}

/// The batches of a segment file and where they end; the rest of the file is zeros.
pub fn batches_and_data_end(path: &Path) -> (Vec<(u64, BatchHeader)>, u64) {
    let bytes = fs::read(path).expect("read a segment file");
    let mut batches = Vec::new();
    let mut position = 0;
    while position < bytes.len() && bytes[position..].iter().any(|&byte| byte != 0) {
        let header = BatchHeader::parse(&bytes[position..]).expect("a well-formed batch header");
        assert!(header.batch_len as usize >= BATCH_HEADER_BYTES);
        batches.push((position as u64, header));
        position += header.batch_len as usize;
    }
    assert!(position <= bytes.len(), "{} ends inside a batch", path.display());
    (batches, position as u64)
}

/// Checks that a closed segment (or any segment after a clean close) is exactly its batches.
pub fn assert_exact(path: &Path) {
    let (_, data_end) = batches_and_data_end(path);
    let file_bytes = fs::metadata(path).expect("segment metadata").len();
    assert_eq!(file_bytes, data_end, "{} is not exactly its batches", path.display());
}

/// Where the non-zero bytes of `bytes` end, from `from` on (`from` when they are all zero).
pub fn nonzero_end(bytes: &[u8], from: usize) -> usize {
    bytes[from..].iter().rposition(|&byte| byte != 0).map_or(from, |at| from + at + 1)
}

/// Copies the regular files of `from` into `to` (a partition directory is flat).
pub fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create the copy");
    for entry in fs::read_dir(from).expect("list the partition directory") {
        let entry = entry.expect("directory entry");
        fs::copy(entry.path(), to.join(entry.file_name())).expect("copy a partition file");
    }
}
