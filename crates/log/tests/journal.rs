//! The log's shared journal on a file layer that loses power: appends to many partitions are
//! acknowledged on one sync of the journal, and the segment files are not synced for them. A
//! power cut that keeps none, part or all of the unsynced writes, segments and journal alike,
//! must leave every acknowledged append at its offset in its partition after the journal is
//! replayed, give no acknowledged offset out again, and never bring back the batches of a
//! topic that was dropped and made again.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::disk::SimulatedDisk;
use common::{filler, read_all, small_config};
use onehop_log::{
    AppendError, Durability, JournalOptions, Log, LogOptions, NewRecord, OpenError, Record, RecoveryPolicy,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

type Key = (String, u32);

const PARTITIONS: [(&str, u32); 5] = [("orders", 0), ("orders", 1), ("orders", 2), ("events", 0), ("__offsets", 0)];

fn record(tag: u64) -> NewRecord {
    NewRecord {
        timestamp_ms: Some(1_000 + tag as i64),
        key: Some(format!("key-{tag}").into()),
        subject: None,
        headers: Vec::new(),
        value: Some(filler(tag, 16 + (tag as usize * 7) % 300)),
    }
}

fn options(storage: Option<&SimulatedDisk>, file_bytes_max: u64, recovery: RecoveryPolicy) -> LogOptions {
    let mut options = LogOptions {
        maintenance_interval: Duration::from_secs(3600),
        journal: Some(JournalOptions { file_bytes_max, ..JournalOptions::default() }),
        recovery,
        ..LogOptions::default()
    };
    if let Some(disk) = storage {
        options.storage = Arc::new(disk.clone());
    }
    options
}

/// Appends from several tasks to every partition until the power is cut at a random moment;
/// returns what each partition acknowledged.
fn write_until_power_cut(
    dir: &Path,
    disk: &SimulatedDisk,
    rng: &mut StdRng,
    keep_probability: f64,
    file_bytes_max: u64,
) -> BTreeMap<Key, BTreeMap<u64, NewRecord>> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (log, _) = Log::open(dir, options(Some(disk), file_bytes_max, RecoveryPolicy::default())).unwrap();
    let partitions: Vec<_> = PARTITIONS
        .iter()
        .map(|(topic, index)| ((topic.to_string(), *index), log.open_partition(topic, *index, small_config()).unwrap()))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8u64)
        .map(|writer| {
            let (partitions, stop) = (partitions.clone(), stop.clone());
            let mut writer_rng = StdRng::seed_from_u64(rng.random());
            runtime.spawn(async move {
                let mut acknowledged = Vec::new();
                let mut tag = writer * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let (key, partition) = &partitions[writer_rng.random_range(0..partitions.len())];
                    let count = 1 + (tag % 3) as usize;
                    let batch: Vec<NewRecord> = (0..count as u64).map(|i| record(tag + i)).collect();
                    tag += count as u64;
                    // Now and then an `async` append, which the next `fsync` one must cover.
                    let durability = if tag % 7 == 0 { Durability::Async } else { Durability::Fsync };
                    match partition.append_with(&batch, durability).await {
                        Ok(ack) if durability == Durability::Fsync => {
                            for (i, new) in batch.into_iter().enumerate() {
                                acknowledged.push((key.clone(), ack.base_offset + i as u64, new));
                            }
                        }
                        Ok(_) => {}
                        Err(AppendError::Poisoned(_) | AppendError::Closed) => break,
                        Err(other) => panic!("unexpected append error: {other}"),
                    }
                }
                acknowledged
            })
        })
        .collect();
    disk.power_cut_soon(rng, 20..120, keep_probability);
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged: BTreeMap<Key, BTreeMap<u64, NewRecord>> = BTreeMap::new();
    for writer in writers {
        for (key, offset, new) in runtime.block_on(writer).unwrap() {
            acknowledged.entry(key).or_default().insert(offset, new);
        }
    }
    drop(partitions);
    drop(log);
    acknowledged
}

/// Every acknowledged record is at its offset, and the next append gets a later one.
fn assert_kept(log: &Log, acknowledged: &BTreeMap<Key, BTreeMap<u64, NewRecord>>, context: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for (topic, index) in PARTITIONS {
        let partition = log.open_partition(topic, index, small_config()).unwrap();
        let stored: BTreeMap<u64, Record> =
            read_all(&partition).into_iter().map(|record| (record.offset, record)).collect();
        let Some(acknowledged) = acknowledged.get(&(topic.to_string(), index)) else { continue };
        for (offset, new) in acknowledged {
            let found = stored
                .get(offset)
                .unwrap_or_else(|| panic!("{context}: {topic}/{index}: acknowledged offset {offset} is gone"));
            assert_eq!(
                found,
                &common::stored(*offset, new),
                "{context}: {topic}/{index}: offset {offset} holds another record"
            );
        }
        let ack = runtime.block_on(partition.append(&[record(9_999_999)])).unwrap();
        let last = *acknowledged.last_key_value().unwrap().0;
        assert!(
            ack.base_offset > last,
            "{context}: {topic}/{index}: offset {} given out again (acknowledged up to {last})",
            ack.base_offset
        );
    }
}

#[test]
fn a_power_cut_keeps_every_append_the_journal_acknowledged_in_every_partition() {
    let cases: u64 = std::env::var("ONEHOP_POWER_CUT_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(16);
    let (mut restored, mut refused) = (0, 0);
    for seed in 0..cases {
        let mut rng = StdRng::seed_from_u64(0x5eed_0000 + seed);
        let dir = tempfile::tempdir().unwrap();
        let disk = SimulatedDisk::with_sync_latency(Duration::from_micros(1_500));
        // Nothing of the unsynced writes, half their sectors, most, or all (a process crash).
        let keep_probability = [0.0, 0.5, 0.9, 1.0][seed as usize % 4];
        // Small journal files are checkpointed and replaced many times before the cut.
        let file_bytes_max = [8 << 10, 256 << 20][(seed as usize / 4) % 2];
        let acknowledged = write_until_power_cut(dir.path(), &disk, &mut rng, keep_probability, file_bytes_max);
        let total: usize = acknowledged.values().map(BTreeMap::len).sum();
        assert!(acknowledged.len() >= 3 && total > 20, "seed {seed}: too little was acknowledged before the cut");
        let context = format!("seed {seed}, keep {keep_probability}, journal files of {file_bytes_max} bytes");
        let log = match Log::open(dir.path(), options(None, file_bytes_max, RecoveryPolicy::default())) {
            Ok((log, _)) => log,
            Err(OpenError::Damaged(damage)) => {
                // Sectors of a write that was never acknowledged reached the disk out of order:
                // valid batches after a torn one. Set aside, every acknowledged batch stays.
                refused += 1;
                eprintln!("{context}: refused until told to set damage aside: {damage}");
                let discard = RecoveryPolicy { discard_damaged: true, ..RecoveryPolicy::default() };
                Log::open(dir.path(), options(None, file_bytes_max, discard)).unwrap().0
            }
            Err(other) => panic!("{context}: {other}"),
        };
        restored += log.journal_replay().unwrap().restored;
        assert_kept(&log, &acknowledged, &context);
    }
    eprintln!("{cases} power cuts: {restored} batches restored from the journal, {refused} logs refused until told");
    // The segments were never synced for these appends: a cut that keeps nothing unsynced loses
    // them from the segment files, and only the journal brings them back.
    assert!(restored > 0, "no power cut needed the journal: the test does not test it");
}

/// A topic dropped and made again under its name, then a crash: the journal still holds the
/// first topic's batches for the same segment and positions, and must not put them back.
#[test]
fn a_topic_made_again_after_a_drop_never_gets_the_dropped_ones_batches() {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new();
    let (log, _) = Log::open(dir.path(), options(Some(&disk), 256 << 20, RecoveryPolicy::default())).unwrap();
    let first = log.open_partition("orders", 0, small_config()).unwrap();
    for tag in 0..20 {
        runtime.block_on(first.append(&[record(tag)])).unwrap();
    }
    drop(first);
    log.remove_topic("orders").unwrap();
    let again = log.open_partition("orders", 0, small_config()).unwrap();
    let fresh: Vec<NewRecord> = (100..103).map(record).collect();
    for new in &fresh {
        runtime.block_on(again.append(std::slice::from_ref(new))).unwrap();
    }
    // A crash that loses nothing the process wrote: the journal is replayed as it stands.
    disk.power_cut(1.0, || 0.0);
    drop(again);
    drop(log);
    let (log, _) = Log::open(dir.path(), options(None, 256 << 20, RecoveryPolicy::default())).unwrap();
    let replay = log.journal_replay().unwrap().clone();
    assert!(replay.records >= 23 && replay.skipped >= 20, "{replay:?}");
    let stored = read_all(&log.open_partition("orders", 0, small_config()).unwrap());
    let expected: Vec<Record> =
        fresh.iter().enumerate().map(|(offset, new)| common::stored(offset as u64, new)).collect();
    assert_eq!(stored, expected, "only the topic made again, as it was written");
}

/// A clean close leaves segments that hold every batch, and the next open finds nothing to
/// restore; the journal does not grow past its bound while the log runs.
#[test]
fn journal_files_are_replaced_as_they_fill_and_a_clean_close_needs_no_restoring() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (log, _) = Log::open(dir.path(), options(None, 16 << 10, RecoveryPolicy::default())).unwrap();
    let partitions: Vec<_> =
        PARTITIONS.iter().map(|(topic, index)| log.open_partition(topic, *index, small_config()).unwrap()).collect();
    let mut written = 0u64;
    for round in 0..200u64 {
        let appends: Vec<_> = partitions
            .iter()
            .map(|partition| {
                let partition = partition.clone();
                runtime.spawn(async move { partition.append(&[record(round)]).await.unwrap() })
            })
            .collect();
        for append in appends {
            runtime.block_on(append).unwrap();
            written += 1;
        }
    }
    let journal_dir = dir.path().join("+journal");
    let files = std::fs::read_dir(&journal_dir).unwrap().count();
    assert!(files <= 2, "{files} journal files: full ones are not deleted");
    drop(partitions);
    drop(log);
    let (log, _) = Log::open(dir.path(), options(None, 16 << 10, RecoveryPolicy::default())).unwrap();
    let replay = log.journal_replay().unwrap().clone();
    assert_eq!(replay.restored, 0, "{replay:?}");
    let stored: usize = PARTITIONS
        .iter()
        .map(|(topic, index)| read_all(&log.open_partition(topic, *index, small_config()).unwrap()).len())
        .sum();
    assert_eq!(stored as u64, written);
}

/// Writers that never let the journal idle write past its zero runway: each commit past it
/// adds zeros of its own, and everything written is read back after a crash.
#[test]
fn a_journal_busier_than_its_runway_keeps_every_append() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new();
    let mut busy = options(Some(&disk), 256 << 20, RecoveryPolicy::default());
    // The smallest runway: the writers below outrun it many times over.
    busy.journal = Some(JournalOptions { runway_bytes: 64 << 10, ..JournalOptions::default() });
    let (log, _) = Log::open(dir.path(), busy).unwrap();
    let partitions: Vec<_> = PARTITIONS
        .iter()
        .map(|(topic, index)| ((topic.to_string(), *index), log.open_partition(topic, *index, small_config()).unwrap()))
        .collect();
    // About 3 MiB, 48 times the runway a journal file starts with.
    let writers: Vec<_> = (0..8u64)
        .map(|writer| {
            let partitions = partitions.clone();
            runtime.spawn(async move {
                let mut acknowledged = Vec::new();
                for i in 0..200u64 {
                    let (key, partition) = &partitions[((writer + i) % partitions.len() as u64) as usize];
                    let new = NewRecord { value: Some(filler(writer * 1000 + i, 2000)), ..record(writer * 1000 + i) };
                    let ack = partition.append(std::slice::from_ref(&new)).await.unwrap();
                    acknowledged.push((key.clone(), ack.base_offset, new));
                }
                acknowledged
            })
        })
        .collect();
    let mut acknowledged: BTreeMap<Key, BTreeMap<u64, NewRecord>> = BTreeMap::new();
    for writer in writers {
        for (key, offset, new) in runtime.block_on(writer).unwrap() {
            acknowledged.entry(key).or_default().insert(offset, new);
        }
    }
    // A power cut that keeps none of the segments' unsynced writes: the journal has them all.
    disk.power_cut(0.0, || 0.5);
    drop(partitions);
    drop(log);
    let (log, _) = Log::open(dir.path(), options(None, 256 << 20, RecoveryPolicy::default())).unwrap();
    assert!(log.journal_replay().unwrap().restored > 0);
    assert_kept(&log, &acknowledged, "busy journal");
}

/// A log that ran with the journal and opens without it still replays the journal it left:
/// after a power cut those records are the only copy of what was acknowledged.
#[test]
fn a_log_opened_without_the_journal_replays_the_one_it_left() {
    let mut rng = StdRng::seed_from_u64(41);
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::with_sync_latency(Duration::from_micros(500));
    let acknowledged = write_until_power_cut(dir.path(), &disk, &mut rng, 0.0, 256 << 20);
    let without = LogOptions { maintenance_interval: Duration::from_secs(3600), ..LogOptions::default() };
    let (log, _) = Log::open(dir.path(), without.clone()).unwrap();
    assert!(log.journal_replay().unwrap().restored > 0);
    assert_kept(&log, &acknowledged, "opened without the journal");
    drop(log);
    assert!(!dir.path().join("+journal").exists(), "the replayed journal is deleted");
    let (log, _) = Log::open(dir.path(), without).unwrap();
    assert!(log.journal_replay().is_none());
}
