//! Appends: dense offsets under concurrency, exact round trips, refusals that write nothing, durability levels, close.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appenders_get_dense_offsets() {
    const TASKS: u64 = 64;
    const APPENDS_PER_TASK: u64 = 12;
    let dir = tempfile::tempdir().unwrap();
    let partition = Arc::new(open(dir.path(), PartitionConfig::default()));
    let tasks = spawn_tasks(&partition, TASKS, |task, partition| async move {
        let mut acked = Vec::new();
        for append in 0..APPENDS_PER_TASK {
            let records: Vec<NewRecord> = (0..1 + (task + append) % 3)
                .map(|i| NewRecord::keyed(format!("task-{task}"), format!("t{task}-a{append}-r{i}")))
                .collect();
            let ack = partition.append(&records).await.expect("append");
            assert_eq!(ack.record_count as usize, records.len());
            acked.push((ack, records));
        }
        // One task's appends are sequential, so its offsets increase.
        assert!(acked.windows(2).all(|pair| pair[0].0.last_offset() < pair[1].0.base_offset));
        acked
    });
    let mut acked = joined(tasks).await;
    acked.sort_by_key(|(ack, _)| ack.base_offset);
    let mut next_offset = 0;
    for (ack, _) in &acked {
        assert_eq!(ack.base_offset, next_offset, "offsets must be dense and every append must get its own range");
        next_offset = ack.last_offset() + 1;
    }
    assert_eq!(partition.end_offset(), next_offset);
    let records = read_all(&partition);
    assert_eq!(records.len() as u64, next_offset);
    for (ack, expected) in &acked {
        for (i, new) in expected.iter().enumerate() {
            let record = &records[ack.base_offset as usize + i];
            assert_eq!(record.offset, ack.base_offset + i as u64);
            assert_eq!((&record.key, &record.value), (&new.key, &new.value));
        }
    }
    // Group commit: concurrent appends share batches (and their fsyncs).
    let batches: usize =
        segment_bases(dir.path()).iter().map(|&base| batches_in(&segment_path(dir.path(), base)).len()).sum();
    assert!(batches < acked.len(), "{batches} batches for {} appends: no group commit happened", acked.len());
}

#[tokio::test]
async fn records_are_identical_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    let expected = [
        NewRecord {
            timestamp_ms: Some(1_700_000_000_123),
            key: Some(Bytes::from_static(b"user-1")),
            subject: Some("scores/team-42".into()),
            headers: vec![
                ("content-type".into(), Some(Bytes::from_static(b"application/json"))),
                ("trace".into(), Some(Bytes::new())),
                ("trace".into(), None),
            ],
            value: Some(Bytes::from_static(br#"{"score":1}"#)),
        },
        // A tombstone: a key and no value.
        NewRecord { timestamp_ms: Some(-5), key: Some(Bytes::from_static(&[0, 255, 1])), ..Default::default() },
        // An empty value is a value, not a tombstone; repeated header names keep their order.
        NewRecord {
            timestamp_ms: Some(0),
            key: None,
            subject: Some(Text::default()),
            headers: vec![
                ("dup".into(), Some(Bytes::from_static(b"a"))),
                ("dup".into(), Some(Bytes::from_static(b"b"))),
            ],
            value: Some(Bytes::new()),
        },
        NewRecord {
            timestamp_ms: Some(i64::MAX),
            key: Some(Bytes::new()),
            subject: Some("é/ü/😀".into()),
            headers: vec![(Text::default(), Some(filler(1, 300)))],
            value: Some(filler(2, 100_000)),
        },
        NewRecord { timestamp_ms: Some(i64::MIN), value: Some(filler(3, 1)), ..Default::default() },
    ];
    let ack = partition.append(&expected[..2]).await.unwrap();
    assert_eq!((ack.base_offset, ack.record_count), (0, 2));
    for (i, record) in expected[2..].iter().enumerate() {
        let ack = partition.append(std::slice::from_ref(record)).await.unwrap();
        assert_eq!(ack.base_offset, 2 + i as u64);
    }
    // A record without a timestamp gets the server's time.
    let before = now_ms();
    partition.append(&[NewRecord::keyed("late", "no timestamp")]).await.unwrap();
    let after = now_ms();

    let check = |partition: &Partition| {
        let records = read_all(partition);
        assert_eq!(records.len(), expected.len() + 1);
        for (i, new) in expected.iter().enumerate() {
            assert_eq!(records[i], stored(i as u64, new));
        }
        let last = &records[expected.len()];
        assert!((before..=after).contains(&last.timestamp_ms), "assigned timestamp {} not now", last.timestamp_ms);
        assert_eq!(last.value.as_deref(), Some(&b"no timestamp"[..]));
        // Reading from the middle returns the same records.
        assert_eq!(partition.read(3, 1, usize::MAX).unwrap(), vec![records[3].clone()]);
    };
    check(&partition);
    let partition = reopen(partition);
    check(&partition);
    partition.close();
    drop(partition);
    assert!(remove_index_files(dir.path()) > 0);
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.indexes_rebuilt, 1);
    check(&partition);
}

#[tokio::test]
async fn refused_appends_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { record_bytes_max: 1000, batch_bytes_max: 4096, ..Default::default() };
    let partition = open(dir.path(), config);
    let overhead = NewRecord::value(Bytes::new()).encoded_len();
    let largest = NewRecord::value(vec![1; 1000 - overhead]);
    assert_eq!(largest.encoded_len(), 1000);
    let too_large = NewRecord::value(vec![2; 1001 - overhead]);

    let nothing_written = |partition: &Partition| {
        assert_eq!(partition.end_offset(), 0);
        assert_eq!(partition.size_bytes(), 0);
        assert_eq!(partition.read(0, 10, usize::MAX).unwrap(), vec![]);
    };
    assert_eq!(
        partition.append(std::slice::from_ref(&too_large)).await,
        Err(AppendError::RecordTooLarge { size: 1001, max: 1000 })
    );
    nothing_written(&partition);
    // One bad record refuses the whole append, the good ones included.
    assert_eq!(
        partition.append(&[NewRecord::value("fine"), too_large.clone()]).await,
        Err(AppendError::RecordTooLarge { size: 1001, max: 1000 })
    );
    nothing_written(&partition);
    let five = vec![largest.clone(); 5];
    assert_eq!(partition.append(&five).await, Err(AppendError::BatchTooLarge { size: 5000, max: 4096 }));
    nothing_written(&partition);
    assert_eq!(partition.append(&[]).await, Err(AppendError::EmptyBatch));
    nothing_written(&partition);

    // The limits are inclusive, and the partition still works after refusals.
    let four = vec![largest.clone(); 4];
    assert_eq!(partition.append(&four).await.unwrap().base_offset, 0);
    assert_eq!(partition.end_offset(), 4);
    let partition = reopen(partition);
    assert_eq!(partition.end_offset(), 4);
    assert_eq!(partition.size_bytes(), 48 + 4000, "only the accepted batch is on disk");

    // Limits of the format itself, with room in record_bytes_max to reach them.
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    let long_subject = NewRecord { subject: Some("s".repeat(70_000).into()), ..NewRecord::value("v") };
    assert_eq!(partition.append(&[long_subject]).await, Err(AppendError::SubjectTooLong(70_000)));
    let many_headers =
        NewRecord { headers: vec![(Text::default(), Some(Bytes::new())); 65_536], ..NewRecord::value("v") };
    assert_eq!(partition.append(&[many_headers]).await, Err(AppendError::TooManyHeaders));
    let long_name = NewRecord { headers: vec![("n".repeat(65_536).into(), None)], ..NewRecord::value("v") };
    assert_eq!(partition.append(&[long_name]).await, Err(AppendError::TooManyHeaders));
    nothing_written(&partition);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_appends_are_readable_at_once_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { durability: Durability::Async, async_fsync_interval_ms: 20, ..small_config() };
    let partition = Arc::new(open(dir.path(), config));
    let tasks = spawn_tasks(&partition, 4, |task, partition| async move {
        let mut acked = Vec::new();
        for i in 0..50u64 {
            let record = numbered(task * 1_000 + i, 40);
            // Mostly the partition's default (async), sometimes an explicit fsync.
            let ack = if i % 10 == 9 {
                partition.append_with(std::slice::from_ref(&record), Durability::Fsync).await
            } else {
                partition.append(std::slice::from_ref(&record)).await
            }
            .unwrap();
            // Acknowledged means readable.
            assert_eq!(partition.read(ack.base_offset, 1, usize::MAX).unwrap(), vec![stored(ack.base_offset, &record)]);
            acked.push((ack.base_offset, record));
        }
        acked
    });
    let mut acked = joined(tasks).await;
    acked.sort_by_key(|(offset, _)| *offset);
    let want: Vec<Record> = acked.iter().map(|(offset, record)| stored(*offset, record)).collect();
    assert_eq!(read_all(&partition), want);
    let partition = Arc::into_inner(partition).expect("every task is done");
    let partition = reopen(partition);
    assert_eq!(read_all(&partition), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_after_close_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Arc::new(open(dir.path(), PartitionConfig::default()));
    // Appenders racing with close: each append either lands (and stays) or is refused as Closed.
    let tasks = spawn_tasks(&partition, 8, |task, partition| async move {
        let mut results = Vec::new();
        for i in 0..200u64 {
            let record = numbered(task * 1_000 + i, 16);
            let result = partition.append(std::slice::from_ref(&record)).await;
            let refused = result.is_err();
            results.push((result, record));
            if refused {
                break;
            }
        }
        results
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    partition.close();
    let end = partition.end_offset();
    let mut landed = Vec::new();
    for (result, record) in joined(tasks).await {
        match result {
            Ok(ack) => landed.push(stored(ack.base_offset, &record)),
            Err(error) => assert_eq!(error, AppendError::Closed),
        }
    }
    landed.sort_by_key(|record| record.offset);
    assert_eq!(landed.len() as u64, end, "every acknowledged append and nothing else is in the log");
    assert_eq!(read_all(&partition), landed);

    assert_eq!(partition.append(&[NewRecord::value("late")]).await, Err(AppendError::Closed));
    assert_eq!(partition.append_with(&[NewRecord::value("late")], Durability::Async).await, Err(AppendError::Closed));
    partition.close(); // idempotent
    assert_eq!(partition.end_offset(), end);
    let partition = Arc::into_inner(partition).expect("every task is done");
    drop(partition);
    let (partition, _) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(read_all(&partition), landed);
}
