//! The log on a file layer that fails: power cuts that keep a random part of what was not yet
//! synced, a disk that corrupts a write and says nothing, writes and syncs that fail.
//!
//! What must hold every time: every acknowledged append is read back at its offset, no offset
//! an acknowledged record had is given to another record, and nothing is cut that a valid batch
//! follows unless the operator said to set damage aside.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::disk::SimulatedDisk;
use common::{filler, read_all, remove_index_files, segment_bases, segment_path, small_config};
use onehop_log::{
    AppendError, NewRecord, OpenError, Partition, PartitionConfig, PartitionOptions, Record, RecoveryPolicy,
};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn record(tag: u64) -> NewRecord {
    NewRecord {
        timestamp_ms: Some(1_000 + tag as i64),
        key: Some(format!("key-{tag}").into()),
        subject: None,
        headers: Vec::new(),
        value: Some(filler(tag, 16 + (tag as usize * 7) % 120)),
    }
}

fn on(disk: &SimulatedDisk) -> PartitionOptions {
    PartitionOptions { storage: Arc::new(disk.clone()), recovery: RecoveryPolicy::default() }
}

fn discarding() -> PartitionOptions {
    PartitionOptions {
        recovery: RecoveryPolicy { discard_damaged: true, ..RecoveryPolicy::default() },
        ..PartitionOptions::default()
    }
}

/// Checks that every acknowledged record is in `partition` at its offset, and that the next
/// append gets an offset past all of them.
fn assert_acknowledged_kept(partition: &Partition, acknowledged: &BTreeMap<u64, NewRecord>, context: &str) {
    let stored: BTreeMap<u64, Record> = read_all(partition).into_iter().map(|record| (record.offset, record)).collect();
    for (offset, new) in acknowledged {
        let found = stored.get(offset).unwrap_or_else(|| panic!("{context}: acknowledged offset {offset} is gone"));
        assert_eq!(found, &common::stored(*offset, new), "{context}: offset {offset} holds another record");
    }
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let ack = runtime.block_on(partition.append(&[record(9_999_999)])).unwrap();
    if let Some((&last, _)) = acknowledged.last_key_value() {
        assert!(
            ack.base_offset > last,
            "{context}: offset {} given out again (acknowledged up to {last})",
            ack.base_offset
        );
    }
}

/// Appends from several tasks until the power is cut at a random moment; returns what was
/// acknowledged.
fn write_until_power_cut(
    dir: &Path,
    disk: &SimulatedDisk,
    rng: &mut StdRng,
    keep_probability: f64,
) -> BTreeMap<u64, NewRecord> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (partition, _) = Partition::open_with_options(dir, small_config(), &on(disk)).unwrap();
    let partition = Arc::new(partition);
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..8u64)
        .map(|writer| {
            let (partition, stop) = (partition.clone(), stop.clone());
            runtime.spawn(async move {
                let mut acknowledged = Vec::new();
                let mut tag = writer * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let count = 1 + (tag % 3) as usize;
                    let batch: Vec<NewRecord> = (0..count as u64).map(|i| record(tag + i)).collect();
                    tag += count as u64;
                    match partition.append(&batch).await {
                        Ok(ack) => {
                            for (i, new) in batch.into_iter().enumerate() {
                                acknowledged.push((ack.base_offset + i as u64, new));
                            }
                        }
                        Err(AppendError::Poisoned(_) | AppendError::Closed) => break,
                        Err(other) => panic!("unexpected append error: {other}"),
                    }
                }
                acknowledged
            })
        })
        .collect();
    disk.power_cut_soon(rng, 5..60, keep_probability);
    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = BTreeMap::new();
    for writer in writers {
        acknowledged.extend(runtime.block_on(writer).unwrap());
    }
    drop(partition);
    acknowledged
}

#[test]
fn a_power_cut_keeps_every_acknowledged_append_and_never_reuses_its_offset() {
    let cases: u64 = std::env::var("ONEHOP_POWER_CUT_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(24);
    let (mut opened, mut refused) = (0, 0);
    for seed in 0..cases {
        let mut rng = StdRng::seed_from_u64(seed);
        let dir = tempfile::tempdir().unwrap();
        // Syncs as slow as this machine's fdatasync at its p99, so writes pile up behind them.
        let disk = SimulatedDisk::with_sync_latency(Duration::from_micros(1_500));
        // Nothing of the unsynced writes, half their sectors, or all of them (a process crash).
        let keep_probability = [0.0, 0.5, 0.9, 1.0][seed as usize % 4];
        let acknowledged = write_until_power_cut(dir.path(), &disk, &mut rng, keep_probability);
        assert!(!acknowledged.is_empty(), "seed {seed}: nothing was acknowledged before the cut");
        let context = format!("seed {seed}, keep {keep_probability}");
        match Partition::open_existing(dir.path()) {
            Ok((partition, _)) => {
                opened += 1;
                assert_acknowledged_kept(&partition, &acknowledged, &context);
            }
            Err(OpenError::Damaged(damage)) => {
                let (first_offset, resume_offset) = (damage.first_offset, damage.resume_offset);
                // Sectors of unsynced writes reached the disk out of order: valid batches after
                // a torn one. Never acknowledged ones: every acknowledged batch was synced.
                refused += 1;
                let last = *acknowledged.last_key_value().unwrap().0;
                assert!(
                    first_offset > last,
                    "{context}: damage at {first_offset}..{resume_offset} over acknowledged {last}"
                );
                let (partition, report) = Partition::open_existing_with_options(dir.path(), &discarding()).unwrap();
                assert_eq!(report.discarded.len(), 1, "{context}: {report:?}");
                assert_acknowledged_kept(&partition, &acknowledged, &context);
            }
            Err(other) => panic!("{context}: {other}"),
        }
    }
    eprintln!("{cases} power cuts: {opened} recovered at once, {refused} refused until told to set damage aside");
    assert_eq!(opened + refused, cases);
}

/// Appends `count` single-record batches one after another; returns them by offset.
fn append_each(partition: &Partition, count: u64) -> BTreeMap<u64, NewRecord> {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut appended = BTreeMap::new();
    for tag in 0..count {
        let new = record(tag);
        let ack = runtime.block_on(partition.append(std::slice::from_ref(&new))).unwrap();
        appended.insert(ack.base_offset, new);
    }
    appended
}

#[test]
fn a_batch_the_disk_corrupted_is_refused_not_cut_and_set_aside_only_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new();
    // Large segments: everything stays in the last one, where a crash may tear a batch.
    let config = PartitionConfig::default();
    let (partition, _) = Partition::open_with_options(dir.path(), config, &on(&disk)).unwrap();
    disk.corrupt_batch_write_in(12);
    let acknowledged = append_each(&partition, 30);
    // The process dies: nothing is lost from the page cache, but no index is written.
    disk.power_cut(1.0, || 0.0);
    drop(partition);
    let corrupted = disk.corrupted();
    let [(segment, bad_at)] = &corrupted[..] else { panic!("one write was corrupted: {corrupted:?}") };
    let (segment, bad_at) = (segment.clone(), *bad_at);
    assert_eq!(segment, segment_path(dir.path(), 0));
    let before = fs::read(&segment).unwrap();

    let error = Partition::open_existing(dir.path()).err().expect("damage that valid batches follow is refused");
    match &error {
        OpenError::Damaged(damage) => {
            assert_eq!(damage.path, segment);
            assert_eq!(damage.position, bad_at);
            assert_eq!(
                (damage.first_offset, damage.resume_offset),
                (11, 12),
                "the twelfth append's offset, 11, is damaged"
            );
        }
        other => panic!("expected Damaged, got {other}"),
    }
    let message = error.to_string();
    for needed in
        [segment.display().to_string(), format!("byte {bad_at}"), "offset 12".into(), "discard_damaged".into()]
    {
        assert!(message.contains(&needed), "the refusal names {needed:?}: {message}");
    }
    assert_eq!(fs::read(&segment).unwrap(), before, "a refused open changes nothing");

    let (partition, report) = Partition::open_existing_with_options(dir.path(), &discarding()).unwrap();
    let [discarded] = &report.discarded[..] else { panic!("{report:?}") };
    assert_eq!(fs::read(&discarded.copy).unwrap(), before, "the damaged file is kept as it was");
    assert_eq!(discarded.offsets, vec![(11, Some(12))]);
    let mut kept = acknowledged.clone();
    kept.remove(&11);
    let stored: Vec<u64> = read_all(&partition).iter().map(|record| record.offset).collect();
    assert_eq!(stored, kept.keys().copied().collect::<Vec<_>>(), "every other record, at its own offset");
    assert_acknowledged_kept(&partition, &kept, "after setting the damage aside");
    drop(partition);
    // The repaired segment opens cleanly from now on, with no further discard.
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert!(report.discarded.is_empty() && report.truncated_bytes == 0, "{report:?}");
    assert_eq!(partition.end_offset(), 31);
}

#[test]
fn a_write_torn_by_a_failure_is_cut_and_its_offsets_given_out_again() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new();
    let (partition, _) = Partition::open_with_options(dir.path(), PartitionConfig::default(), &on(&disk)).unwrap();
    let acknowledged = append_each(&partition, 10);
    disk.fail_batch_write_in(1, 30);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let failed = runtime.block_on(partition.append(&[record(100)]));
    assert!(matches!(failed, Err(AppendError::Poisoned(_))), "{failed:?}");
    disk.power_cut(1.0, || 0.0);
    drop(partition);
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert!(report.truncated_bytes > 0, "the torn batch was cut: {report:?}");
    assert_eq!(read_all(&partition).len(), 10);
    // The torn batch was never acknowledged: its offset is free.
    let ack = runtime.block_on(partition.append(&[record(101)])).unwrap();
    assert_eq!(ack.base_offset, 10);
    assert_acknowledged_kept(&partition, &acknowledged, "after a torn write");
}

#[test]
fn a_failed_sync_poisons_the_partition_and_acknowledges_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SimulatedDisk::new();
    let (partition, _) = Partition::open_with_options(dir.path(), small_config(), &on(&disk)).unwrap();
    let acknowledged = append_each(&partition, 20);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    disk.fail_sync_in(1);
    let failed = runtime.block_on(partition.append(&[record(200)]));
    assert!(matches!(failed, Err(AppendError::Poisoned(_))), "the append whose sync failed: {failed:?}");
    let later = runtime.block_on(partition.append(&[record(201)]));
    match later {
        Err(error @ AppendError::Poisoned(_)) => assert!(error.to_string().contains("Restart"), "{error}"),
        other => panic!("a poisoned partition refuses later appends: {other:?}"),
    }
    assert_eq!(partition.end_offset(), 20, "nothing after the failed sync became readable");
    // Closing a poisoned partition touches nothing: no trim, no index that could be trusted.
    let bases_before = segment_bases(dir.path());
    drop(partition);
    assert_eq!(segment_bases(dir.path()), bases_before);
    let last = segment_path(dir.path(), *bases_before.last().unwrap());
    assert!(!last.with_extension("index").exists(), "no index written for the poisoned active segment");
    disk.power_cut(0.0, || 0.0);
    remove_index_files(dir.path());
    let (partition, _) = Partition::open_existing(dir.path()).unwrap();
    assert_acknowledged_kept(&partition, &acknowledged, "after a failed fsync");
}
