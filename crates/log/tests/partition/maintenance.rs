//! Retention and compaction, alone and beside appends.

use super::*;

/// Appends records of `value_len` bytes until the partition has `segments` segments; returns
/// the records appended (offset = index).
async fn fill_segments(partition: &Partition, segments: usize, timestamp_ms: i64) -> Vec<NewRecord> {
    let mut appended = Vec::new();
    while partition.segment_count() < segments {
        let i = partition.end_offset();
        let record = NewRecord { timestamp_ms: Some(timestamp_ms), ..numbered(i, 300) };
        partition.append(std::slice::from_ref(&record)).await.unwrap();
        appended.push(record);
    }
    appended
}

#[tokio::test]
async fn retention_by_bytes_deletes_a_prefix_of_closed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { retention_bytes: Some(3 * 4096), ..small_config() };
    let partition = open(dir.path(), config);
    let expected = fill_segments(&partition, 10, 1_000).await;
    let before: Vec<(u64, u64)> = segment_bases(dir.path())
        .into_iter()
        .map(|base| (base, batches_and_data_end(&segment_path(dir.path(), base)).1))
        .collect();
    let total: u64 = before.iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(partition.size_bytes(), total);

    let report = partition.enforce_retention(now_ms()).unwrap();
    let after = segment_bases(dir.path());
    let deleted = report.segments_deleted;
    assert!(deleted > 0);
    // Exactly the oldest segments, exactly as many as needed to get under the cap.
    assert_eq!(after, before[deleted..].iter().map(|(base, _)| *base).collect::<Vec<_>>());
    let deleted_bytes: u64 = before[..deleted].iter().map(|(_, bytes)| bytes).sum();
    assert_eq!(report.bytes_deleted, deleted_bytes);
    assert_eq!(partition.size_bytes(), total - deleted_bytes);
    assert!(partition.size_bytes() <= 3 * 4096);
    assert!(partition.size_bytes() + before[deleted - 1].1 > 3 * 4096, "retention deleted more than needed");
    for suffix in ["index", "timeindex"] {
        assert!(!dir.path().join(format!("{:020}.{suffix}", before[0].0)).exists());
    }

    let start = after[0];
    assert_eq!(partition.start_offset(), start);
    assert_eq!(partition.end_offset(), expected.len() as u64, "retention never changes the end");
    assert_eq!(partition.read(start - 1, 1, usize::MAX), Err(ReadError::BeforeStart { offset: start - 1, start }));
    assert_eq!(partition.read(0, 1, usize::MAX), Err(ReadError::BeforeStart { offset: 0, start }));
    let remaining: Vec<Record> =
        expected.iter().enumerate().skip(start as usize).map(|(i, new)| stored(i as u64, new)).collect();
    assert_eq!(read_all(&partition), remaining);
    assert_eq!(partition.enforce_retention(now_ms()).unwrap().segments_deleted, 0, "retention is idempotent");

    // The start survives a reopen; a tiny cap deletes every closed segment but never the active one.
    let partition = reopen(partition);
    assert_eq!(partition.start_offset(), start);
    assert_eq!(read_all(&partition), remaining);
    partition.close();
    drop(partition);
    let config = PartitionConfig { retention_bytes: Some(1), ..small_config() };
    let partition = open(dir.path(), config);
    partition.enforce_retention(now_ms()).unwrap();
    assert_eq!(partition.segment_count(), 1);
    let last = *segment_bases(dir.path()).last().unwrap();
    assert_eq!(partition.start_offset(), last);
    assert_eq!(read_all(&partition).len() as u64, expected.len() as u64 - last);
    let ack = partition.append(&[NewRecord::value("after")]).await.unwrap();
    assert_eq!(ack.base_offset, expected.len() as u64);
}

#[tokio::test]
async fn retention_changed_while_open_applies_at_the_next_pass() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), small_config());
    fill_segments(&partition, 6, 1_000).await;
    assert_eq!(partition.enforce_retention(now_ms()).unwrap().segments_deleted, 0, "no limits yet");
    assert_eq!(partition.retention(), (None, None));
    partition.set_retention(None, Some(1));
    assert_eq!(partition.retention(), (None, Some(1)));
    assert_eq!(partition.enforce_retention(now_ms()).unwrap().segments_deleted, 5, "every closed segment");
    assert_eq!(partition.segment_count(), 1);
    partition.set_retention(None, None);
    fill_segments(&partition, 3, 1_000).await;
    assert_eq!(partition.enforce_retention(now_ms()).unwrap().segments_deleted, 0, "limits lifted");
    partition.close();
}

#[tokio::test]
async fn retention_by_age_stops_at_the_first_young_segment() {
    let dir = tempfile::tempdir().unwrap();
    let now = now_ms();
    let old = 1_000_000; // 1970
    let config = PartitionConfig { retention_ms: Some(3_600_000), ..small_config() };
    let partition = open(dir.path(), config);
    // Segments 1-3 hold only old records. Segment 4 is rolled into by an old record and then
    // holds young ones; segment 5 starts young and is otherwise old; segment 6 is old again.
    let mut expected = fill_segments(&partition, 4, old).await;
    expected.extend(fill_segments(&partition, 5, now).await);
    expected.extend(fill_segments(&partition, 7, old).await);
    let bases = segment_bases(dir.path());
    assert_eq!(bases.len(), 7);
    let stored_max =
        |from: u64, to: u64| expected[from as usize..to as usize].iter().map(|r| r.timestamp_ms.unwrap()).max();
    assert_eq!(stored_max(bases[5], bases[6]), Some(old), "segment 6 must be all old for this test");

    let report = partition.enforce_retention(now).unwrap();
    assert_eq!(report.segments_deleted, 3, "only the old prefix goes; old segment 6 waits behind young ones");
    assert_eq!(segment_bases(dir.path()), bases[3..].to_vec());
    assert_eq!(partition.start_offset(), bases[3]);
    let start = bases[3];
    assert_eq!(partition.read(start - 1, 1, usize::MAX), Err(ReadError::BeforeStart { offset: start - 1, start }));
    let remaining: Vec<Record> =
        expected.iter().enumerate().skip(start as usize).map(|(i, new)| stored(i as u64, new)).collect();
    assert_eq!(read_all(&partition), remaining);

    // Later, when the young records age out too, everything closed goes, never the active one.
    let report = partition.enforce_retention(now + 3_600_000 + 1).unwrap();
    assert_eq!(report.segments_deleted, 3);
    assert_eq!(partition.start_offset(), bases[6]);
    assert_eq!(partition.segment_count(), 1);

    // A partition without retention settings keeps everything.
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), small_config());
    fill_segments(&partition, 3, old).await;
    assert_eq!(partition.enforce_retention(now).unwrap().segments_deleted, 0);
    assert_eq!(partition.start_offset(), 0);
}

/// What compaction must leave: in closed segments (offsets below `active_base`), unkeyed
/// records and the newest record per key, minus tombstones older than `deadline_ms`; the active
/// segment untouched.
fn compacted_model(records: &[Record], active_base: u64, deadline_ms: i64) -> Vec<Record> {
    let mut newest = std::collections::HashMap::new();
    for record in records {
        if let Some(key) = &record.key {
            newest.insert(key.clone(), record.offset);
        }
    }
    records
        .iter()
        .filter(|record| {
            record.offset >= active_base
                || match &record.key {
                    None => true,
                    Some(key) => {
                        newest[key] == record.offset && !(record.value.is_none() && record.timestamp_ms < deadline_ms)
                    }
                }
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn compaction_keeps_the_newest_record_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let now = 10_000_000_000;
    let old = now - 3_600_000;
    let young = now - 1_000;
    let config = PartitionConfig { compacted: true, tombstone_retention_ms: 60_000, ..small_config() };
    let partition = open(dir.path(), config);
    let mut appended: Vec<NewRecord> = Vec::new();
    let keyed = |key: &str, tag: &str, timestamp_ms: i64| NewRecord {
        timestamp_ms: Some(timestamp_ms),
        key: Some(Bytes::from(key.to_string())),
        subject: Some(format!("table/{key}").into()),
        headers: vec![("tag".into(), Some(Bytes::from(tag.to_string())))],
        value: Some(Bytes::from(format!("{key}={tag};{}", "x".repeat(200)))),
    };
    let tombstone = |key: &str, timestamp_ms: i64| NewRecord {
        timestamp_ms: Some(timestamp_ms),
        ..NewRecord::tombstone(key.to_string())
    };
    for round in 0..3 {
        for key in 0..6 {
            appended.push(keyed(&format!("k{key}"), &format!("round-{round}"), old));
        }
        appended.push(NewRecord { timestamp_ms: Some(old), ..NewRecord::value(format!("unkeyed-{round}")) });
    }
    appended.push(tombstone("k1", old)); // old and newest: dropped with every k1 record
    appended.push(tombstone("k2", young)); // young and newest: kept (older k2 records go)
    appended.push(tombstone("k3", old)); // superseded by the next record: dropped
    appended.push(keyed("k3", "after-tombstone", old));
    for record in &appended {
        partition.append(std::slice::from_ref(record)).await.unwrap();
    }
    // Unkeyed padding until what came before sits in closed segments, then k4's newest value
    // in the active segment.
    let segments = partition.segment_count();
    appended.extend(fill_segments(&partition, segments + 1, old).await);
    let k4 = keyed("k4", "in-active-segment", young);
    let ack = partition.append(std::slice::from_ref(&k4)).await.unwrap();
    appended.push(k4);
    let active_base = *segment_bases(dir.path()).last().unwrap();
    assert!(ack.base_offset >= active_base && active_base > 0);

    let before: Vec<Record> = appended.iter().enumerate().map(|(i, new)| stored(i as u64, new)).collect();
    assert_eq!(read_all(&partition), before);
    let expected = compacted_model(&before, active_base, now - 60_000);
    let report = partition.compact(now).unwrap();
    assert_eq!(report.records_removed as usize, before.len() - expected.len());
    assert!(report.segments_rewritten > 0 && report.bytes_after < report.bytes_before);
    assert_eq!(read_all(&partition), expected);

    // The same thing, spelled out.
    let survivors = read_all(&partition);
    let values_of = |key: &str| -> Vec<Option<Bytes>> {
        survivors.iter().filter(|r| r.key.as_deref() == Some(key.as_bytes())).map(|r| r.value.clone()).collect()
    };
    assert!(values_of("k1").is_empty(), "an old tombstone goes with its key");
    assert_eq!(values_of("k2"), vec![None], "a young tombstone stays, alone");
    assert_eq!(values_of("k3").len(), 1);
    assert!(values_of("k3")[0].as_ref().unwrap().starts_with(b"k3=after-tombstone"));
    assert_eq!(values_of("k4").len(), 1, "a key whose newest record is in the active segment loses its old ones");
    assert!(values_of("k0")[0].as_ref().unwrap().starts_with(b"k0=round-2"));
    assert_eq!(
        survivors.iter().filter(|r| r.key.is_none()).count(),
        appended.iter().filter(|r| r.key.is_none()).count()
    );
    // Reading from a removed offset gives the next survivor.
    let removed = before.iter().find(|r| !expected.contains(r)).unwrap().offset;
    let next = expected.iter().find(|r| r.offset > removed).unwrap();
    assert_eq!(partition.read(removed, 1, usize::MAX).unwrap(), vec![next.clone()]);
    assert_eq!(partition.end_offset(), before.len() as u64, "compaction never changes the end");

    // Compaction is idempotent, survives a reopen with or without indexes, and appends go on.
    assert_eq!(partition.compact(now).unwrap().records_removed, 0);
    let partition = reopen(partition);
    assert_eq!(read_all(&partition), expected);
    partition.close();
    drop(partition);
    remove_index_files(dir.path());
    let (partition, _) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(read_all(&partition), expected);
    assert_eq!(partition.append(&[NewRecord::value("more")]).await.unwrap().base_offset, before.len() as u64);
}

#[tokio::test]
async fn compaction_removes_emptied_segments_and_moves_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { compacted: true, ..small_config() };
    let partition = open(dir.path(), config);
    // Every record has the same key: the closed segments hold nothing but superseded ones.
    let mut appended = Vec::new();
    while partition.segment_count() < 4 {
        let record =
            NewRecord { timestamp_ms: Some(5), ..NewRecord::keyed("only", filler(appended.len() as u64, 300)) };
        partition.append(std::slice::from_ref(&record)).await.unwrap();
        appended.push(record);
    }
    let bases = segment_bases(dir.path());
    let report = partition.compact(1_000).unwrap();
    assert_eq!(report.segments_rewritten, 3);
    assert_eq!(report.bytes_after, 0);
    assert_eq!(segment_bases(dir.path()), vec![bases[3]]);
    let start = bases[3];
    assert_eq!(partition.start_offset(), start);
    assert_eq!(partition.read(0, 1, usize::MAX), Err(ReadError::BeforeStart { offset: 0, start }));
    let want: Vec<Record> =
        appended.iter().enumerate().skip(start as usize).map(|(i, new)| stored(i as u64, new)).collect();
    assert_eq!(read_all(&partition), want);
    let partition = reopen(partition);
    assert_eq!(partition.start_offset(), start);
    assert_eq!(read_all(&partition), want);

    // A partition that is not compacted is never compacted.
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), small_config());
    while partition.segment_count() < 3 {
        partition.append(&[NewRecord::keyed("only", vec![0; 300])]).await.unwrap();
    }
    let end = partition.end_offset();
    assert_eq!(partition.compact(now_ms()).unwrap(), Default::default());
    assert_eq!(read_all(&partition).len() as u64, end);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn maintenance_beside_appends_loses_nothing() {
    // Compaction and retention run on "closed" segments while the writer keeps appending and
    // rolling. Whatever they do, an acknowledged record may only disappear if compaction was
    // allowed to remove it: a newer record with the same key exists.
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { compacted: true, retention_ms: Some(u64::MAX / 4), ..small_config() };
    let partition = Arc::new(open(dir.path(), config));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let maintenance = {
        let (partition, stop) = (partition.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut removed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                removed += partition.compact(now_ms()).expect("compaction").records_removed;
                partition.enforce_retention(now_ms()).expect("retention");
            }
            removed
        })
    };
    let tasks = spawn_tasks(&partition, 4, |task, partition| async move {
        let mut acked = Vec::new();
        for i in 0..400u64 {
            let mut record = numbered(task * 10_000 + i, 40 + (i as usize * 7) % 200);
            if !i.is_multiple_of(3) {
                record.key = Some(Bytes::from(format!("key-{}", i % 5)));
            }
            let durability = if i.is_multiple_of(2) { Durability::Fsync } else { Durability::Async };
            let ack = partition.append_with(std::slice::from_ref(&record), durability).await.unwrap();
            acked.push(stored(ack.base_offset, &record));
        }
        acked
    });
    let mut acked = joined(tasks).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let removed = maintenance.join().unwrap();
    assert!(removed > 0, "compaction never removed anything while the appends ran: the test tested nothing");
    acked.sort_by_key(|record| record.offset);

    let check = |partition: &Partition| {
        let stored = read_all(partition);
        assert_eq!(partition.start_offset(), 0, "the first record of the log is never removable here");
        assert!(stored.windows(2).all(|pair| pair[0].offset < pair[1].offset));
        let newest: std::collections::HashMap<Bytes, u64> =
            acked.iter().filter_map(|record| Some((record.key.clone()?, record.offset))).collect();
        let mut stored_at = stored.iter().peekable();
        for record in &acked {
            while stored_at.peek().is_some_and(|s| s.offset < record.offset) {
                stored_at.next();
            }
            let present = stored_at.peek().is_some_and(|s| s.offset == record.offset);
            if present {
                assert_eq!(stored_at.peek().unwrap(), &record, "record {} changed", record.offset);
                continue;
            }
            let superseded = record.key.as_ref().is_some_and(|key| newest[key] > record.offset);
            assert!(superseded, "acknowledged record {} was lost: {record:?}", record.offset);
        }
        assert_eq!(
            stored.len(),
            stored.iter().filter(|s| acked.binary_search_by_key(&s.offset, |r| r.offset).is_ok()).count()
        );
    };
    check(&partition);
    let partition = Arc::into_inner(partition).expect("every task is done");
    let partition = reopen(partition);
    check(&partition);
}

#[tokio::test]
async fn a_read_from_a_gap_left_by_compaction_returns_the_next_record() {
    // Segment 0 keeps only its first record after compaction, so offsets 1.. of it are a gap
    // and the next record is in segment 1. A read from the gap must find it whatever the byte
    // limit, 0 included: a read returns at least one record when one exists.
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig { compacted: true, ..small_config() });
    let append = |record: NewRecord| {
        let partition = &partition;
        async move { partition.append(&[NewRecord { timestamp_ms: Some(7), ..record }]).await.unwrap().base_offset }
    };
    append(NewRecord::value("first")).await;
    while partition.segment_count() < 2 {
        append(NewRecord::keyed("x", vec![b'x'; 300])).await;
    }
    let survivor = append(NewRecord::value("second")).await;
    while partition.segment_count() < 3 {
        append(NewRecord::keyed("x", vec![b'x'; 300])).await;
    }
    partition.compact(1_000).unwrap();
    let bases = segment_bases(dir.path());
    assert_eq!(bases.len(), 3);
    let kept = read_all(&partition);
    assert_eq!(kept[0].offset, 0);
    assert_eq!(kept[1].offset, survivor, "segment 0 keeps only its first record");
    assert!(survivor > bases[1]);
    for from in [1, bases[1] - 1, bases[1]] {
        for max_bytes in [0, 1, usize::MAX] {
            let read = partition.read(from, 1, max_bytes).unwrap();
            assert_eq!(read, vec![kept[1].clone()], "read({from}, 1, {max_bytes})");
        }
    }
}
