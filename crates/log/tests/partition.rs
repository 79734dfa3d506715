//! One partition through its public API: offsets under concurrency, exact round trips, limits,
//! reads and their errors, waiting for records, time lookups, segment rolling and indexes,
//! durability levels, close, retention, compaction, and the log directory with its lock.

mod common;

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
                ("content-type".into(), Bytes::from_static(b"application/json")),
                ("trace".into(), Bytes::new()),
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
            headers: vec![("dup".into(), Bytes::from_static(b"a")), ("dup".into(), Bytes::from_static(b"b"))],
            value: Some(Bytes::new()),
        },
        NewRecord {
            timestamp_ms: Some(i64::MAX),
            key: Some(Bytes::new()),
            subject: Some("é/ü/😀".into()),
            headers: vec![(Text::default(), filler(1, 300))],
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
    let many_headers = NewRecord { headers: vec![(Text::default(), Bytes::new()); 65_536], ..NewRecord::value("v") };
    assert_eq!(partition.append(&[many_headers]).await, Err(AppendError::TooManyHeaders));
    let long_name = NewRecord { headers: vec![("n".repeat(65_536).into(), Bytes::new())], ..NewRecord::value("v") };
    assert_eq!(partition.append(&[long_name]).await, Err(AppendError::TooManyHeaders));
    nothing_written(&partition);
}

#[tokio::test]
async fn reads_respect_record_and_byte_limits() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    // Ten records of 100-byte values in batches of 3, 4 and 3.
    let records: Vec<NewRecord> = (0..10).map(|i| numbered(i, 100)).collect();
    for chunk in [&records[0..3], &records[3..7], &records[7..10]] {
        partition.append(chunk).await.unwrap();
    }
    let offsets = |read: Vec<Record>| read.iter().map(|record| record.offset).collect::<Vec<_>>();
    assert_eq!(offsets(partition.read(0, 3, usize::MAX).unwrap()), vec![0, 1, 2]);
    assert_eq!(offsets(partition.read(0, 0, usize::MAX).unwrap()), Vec::<u64>::new());
    // Reading starts inside a batch and crosses into the next ones.
    assert_eq!(offsets(partition.read(5, 100, usize::MAX).unwrap()), vec![5, 6, 7, 8, 9]);
    assert_eq!(offsets(partition.read(2, 4, usize::MAX).unwrap()), vec![2, 3, 4, 5]);
    // Byte limits stop once the limit is reached, the record reaching it included.
    assert_eq!(offsets(partition.read(0, 100, 250).unwrap()), vec![0, 1, 2]);
    assert_eq!(offsets(partition.read(0, 100, 300).unwrap()), vec![0, 1, 2]);
    assert_eq!(offsets(partition.read(0, 100, 301).unwrap()), vec![0, 1, 2, 3]);
    // At least one record, however small the limit.
    assert_eq!(offsets(partition.read(4, 100, 0).unwrap()), vec![4]);
    assert_eq!(offsets(partition.read(9, 100, 1).unwrap()), vec![9]);
    // Keys count toward the byte limit too.
    partition.append(&vec![NewRecord::keyed(vec![b'k'; 50], vec![b'v'; 100]); 4]).await.unwrap();
    assert_eq!(offsets(partition.read(10, 100, 300).unwrap()), vec![10, 11]);
    // Whatever the limits, the records are the ones appended.
    for (i, record) in partition.read(0, 10, usize::MAX).unwrap().iter().enumerate() {
        assert_eq!(*record, stored(i as u64, &records[i]));
    }
}

/// Reads close behind the writer take the newest batches from memory, and get exactly what the
/// file gives: every read of a grid of starts and limits, and a tailer's read-on pattern, gives
/// the same records again once the partition is reopened (nothing in memory then). The data is
/// larger than the cache and spans segments, so the oldest reads miss it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_from_memory_are_what_the_file_holds() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let counter = |name: &str| -> u64 {
        let text = handle.render();
        text.lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
    };
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig { segment_bytes_max: 2 << 20, batch_bytes_max: 1 << 20, ..PartitionConfig::default() };
    let partition = Arc::new(metrics::with_local_recorder(&recorder, || open(dir.path(), config)));
    // ~3 MiB in batches of 1 to 40 records, one append at a time and, for some, many at once
    // (one batch of several appends); keys, subjects and headers on some records.
    let record = |i: u64| NewRecord {
        timestamp_ms: Some(1_000 + i as i64),
        key: i.is_multiple_of(3).then(|| Bytes::from(format!("key-{}", i % 17))),
        subject: i.is_multiple_of(5).then(|| format!("subjects/{}", i % 7).into()),
        headers: if i.is_multiple_of(4) {
            vec![(Text::from_static("h"), Bytes::from(i.to_string()))]
        } else {
            Vec::new()
        },
        value: Some(filler(i, 50 + (i as usize * 37) % 700)),
    };
    // What each offset holds, from the acknowledgements (appends made at once land in any order).
    let mut expected: Vec<Option<Record>> = Vec::new();
    let mut acknowledged = |ack: onehop_log::AppendAck, records: &[NewRecord]| {
        for (i, record) in records.iter().enumerate() {
            let offset = ack.base_offset + i as u64;
            if expected.len() <= offset as usize {
                expected.resize(offset as usize + 1, None);
            }
            expected[offset as usize] = Some(stored(offset, record));
        }
    };
    let mut appended = 0u64;
    let mut round = 0u64;
    while partition.size_bytes() < 3 << 20 {
        round += 1;
        if round.is_multiple_of(4) {
            let mut appends = Vec::new();
            for _ in 0..8 {
                let records: Vec<NewRecord> = (appended..appended + 3).map(record).collect();
                appended += 3;
                let partition = partition.clone();
                appends.push(tokio::spawn(async move { (partition.append(&records).await.unwrap(), records) }));
            }
            for append in appends {
                let (ack, records) = append.await.unwrap();
                acknowledged(ack, &records);
            }
        } else {
            let count = 1 + round % 40;
            let records: Vec<NewRecord> = (appended..appended + count).map(record).collect();
            acknowledged(partition.append(&records).await.unwrap(), &records);
            appended += count;
        }
    }
    let last_write = std::time::Instant::now();
    assert!(partition.segment_count() > 1, "the test wants reads across segments");
    let end = partition.end_offset();
    assert_eq!(end, appended);

    let read_everything = |partition: &Partition| {
        let mut reads = Vec::new();
        // Newest first: a partition drops its cached batches a quarter second after its last
        // write, and the newest are the ones cached.
        let mut starts: Vec<u64> = (0..end).step_by(97).chain([end - 1, end]).collect();
        starts.reverse();
        for from in starts {
            for max_records in [1, 3, 25, 1000] {
                for max_bytes in [0, 300, 1 << 20] {
                    reads.push(partition.read(from, max_records, max_bytes).unwrap());
                }
            }
        }
        // A tailer's pattern: on from where each read stopped, from a start near the end.
        let mut ahead = onehop_log::ReadAhead::default();
        let mut next = end - end / 3;
        while next < end {
            let read = partition.read_next(next, 7, usize::MAX, &mut ahead).unwrap();
            next = read.last().unwrap().offset + 1;
            reads.push(read);
        }
        reads
    };
    let (memory_before, file_before) = (counter("log_reads_from_memory_total"), counter("log_reads_from_file_total"));
    let cached = read_everything(&partition);
    let (memory_after, file_after) = (counter("log_reads_from_memory_total"), counter("log_reads_from_file_total"));
    assert!(file_after > file_before, "the oldest records are no longer in memory");
    // Which reads find the cache depends on time (a partition drops it a quarter second after
    // its last write), so this holds only when the machine did not stall the test that long;
    // what the reads return must match the file either way.
    if last_write.elapsed() < Duration::from_millis(250) {
        assert!(memory_after > memory_before, "the newest records come from memory");
    }

    let partition = Arc::try_unwrap(partition).ok().expect("the appends are done");
    let partition = metrics::with_local_recorder(&recorder, || reopen(partition));
    let from_file = read_everything(&partition);
    assert_eq!(counter("log_reads_from_memory_total"), memory_after, "a reopened partition has nothing in memory");
    assert_eq!(cached.len(), from_file.len());
    for (cached, from_file) in cached.iter().zip(&from_file) {
        assert!(
            cached == from_file,
            "a read from memory differs from the file from offset {:?}",
            cached.first().map(|record| record.offset)
        );
    }
    let expected: Vec<Record> = expected.into_iter().map(|record| record.expect("every offset acknowledged")).collect();
    assert!(read_all(&partition) == expected, "the partition does not hold what was acknowledged");
}

/// A partition that stops writing lets its cached batches go: the same read, repeated, comes
/// from memory right after the write and from the file once the partition has been idle for
/// the cache's age (a quarter second), with the same records.
#[tokio::test]
async fn an_idle_partition_lets_its_cached_batches_go() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let counter = |name: &str| -> u64 {
        handle.render().lines().find_map(|line| line.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
    };
    let dir = tempfile::tempdir().unwrap();
    let partition = metrics::with_local_recorder(&recorder, || open(dir.path(), PartitionConfig::default()));
    let records: Vec<NewRecord> = (0..10).map(|i| numbered(i, 100)).collect();
    partition.append(&records).await.unwrap();
    let written = std::time::Instant::now();
    let first = partition.read(0, 100, usize::MAX).unwrap();
    if written.elapsed() < Duration::from_millis(250) {
        assert_eq!(counter("log_reads_from_memory_total"), 1, "a read right after the write");
    }
    // Within 10 s (a loaded machine wakes the idle writer late), the read goes to the file.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let files_before = counter("log_reads_from_file_total");
        let again = partition.read(0, 100, usize::MAX).unwrap();
        assert_eq!(again, first);
        if counter("log_reads_from_file_total") > files_before {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the cache was never let go");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A new write is cached again.
    partition.append(&[numbered(10, 100)]).await.unwrap();
    let memory_before = counter("log_reads_from_memory_total");
    let written = std::time::Instant::now();
    assert_eq!(partition.read(10, 1, usize::MAX).unwrap(), vec![stored(10, &numbered(10, 100))]);
    if written.elapsed() < Duration::from_millis(250) {
        assert_eq!(counter("log_reads_from_memory_total"), memory_before + 1);
    }
}

#[tokio::test]
async fn read_next_goes_on_from_the_batch_the_last_read_stopped_in() {
    let dir = tempfile::tempdir().unwrap();
    let config = PartitionConfig {
        segment_bytes_max: 64 * 1024,
        record_bytes_max: 4096,
        batch_bytes_max: 64 * 1024,
        queue_bytes_max: 1 << 20,
        ..PartitionConfig::default()
    };
    let partition = open(dir.path(), config);
    // Batches of 100, 100 and 5 records, then enough to roll over into more segments.
    let mut records: Vec<NewRecord> = (0..205).map(|i| numbered(i, 50)).collect();
    for chunk in [&records[0..100], &records[100..200], &records[200..205]] {
        partition.append(chunk).await.unwrap();
    }
    let offsets = |read: Vec<Record>| read.iter().map(|record| record.offset).collect::<Vec<_>>();
    let range = |from: u64, to: u64| (from..to).collect::<Vec<_>>();
    let mut ahead = onehop_log::ReadAhead::default();
    // The same limits as `read`, whether the records come from the file or from the batch
    // the last read stopped in.
    assert_eq!(offsets(partition.read_next(5, 10, usize::MAX, &mut ahead).unwrap()), range(5, 15));
    assert_eq!(offsets(partition.read_next(15, 10, usize::MAX, &mut ahead).unwrap()), range(15, 25));
    assert_eq!(offsets(partition.read_next(25, 100, usize::MAX, &mut ahead).unwrap()), range(25, 125));
    // A byte limit: 50-byte values, reached at the third record.
    assert_eq!(offsets(partition.read_next(125, 1000, 150, &mut ahead).unwrap()), range(125, 128));
    // Anywhere else, the file again; then on from there.
    assert_eq!(offsets(partition.read_next(3, 2, usize::MAX, &mut ahead).unwrap()), range(3, 5));
    assert_eq!(offsets(partition.read_next(5, 2, usize::MAX, &mut ahead).unwrap()), range(5, 7));
    assert_eq!(offsets(partition.read_next(150, 1000, usize::MAX, &mut ahead).unwrap()), range(150, 205));
    assert_eq!(offsets(partition.read_next(205, 10, usize::MAX, &mut ahead).unwrap()), Vec::<u64>::new());
    // The last record of a batch: the next read goes on into the next batch.
    assert_eq!(offsets(partition.read_next(90, 10, usize::MAX, &mut ahead).unwrap()), range(90, 100));
    assert_eq!(offsets(partition.read_next(100, 3, usize::MAX, &mut ahead).unwrap()), range(100, 103));
    // Records appended after a read stopped at the end are read from the file.
    records.extend((205..1400).map(|i| numbered(i, 50)));
    for chunk in records[205..].chunks(300) {
        partition.append(chunk).await.unwrap();
    }
    assert!(partition.segment_count() > 1, "the test wants reads across segments");
    // A tailer's pattern, a few at a time from where it stopped, across batches and
    // segments: exactly the records appended.
    let mut ahead = onehop_log::ReadAhead::default();
    let mut next = 0;
    while next < 1400 {
        let read = partition.read_next(next, 7, usize::MAX, &mut ahead).unwrap();
        assert!(!read.is_empty() && read.len() <= 7);
        for record in read {
            assert_eq!(record, stored(next, &records[next as usize]));
            next += 1;
        }
    }
    // Retention past where a reader stopped is an error as for `read`, whatever it kept.
    let mut ahead = onehop_log::ReadAhead::default();
    partition.read_next(0, 10, usize::MAX, &mut ahead).unwrap();
    assert!(matches!(partition.read_next(2000, 10, usize::MAX, &mut ahead), Err(ReadError::PastEnd { .. })));
}

#[tokio::test]
async fn reads_of_records_larger_than_the_segment_average_are_whole() {
    // A read takes from the file what the segment's average record size says the records it
    // wants need, and reads on when they are larger: here a thousand tiny records, then large
    // ones in batches of 1, 7 and 30.
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    let mut records: Vec<NewRecord> = (0..1000).map(|i| numbered(i, 8)).collect();
    records.extend((1000..1038).map(|i| numbered(i, 20_000 + i as usize)));
    for chunk in [&records[0..1000], &records[1000..1001], &records[1001..1008], &records[1008..1038]] {
        partition.append(chunk).await.unwrap();
    }
    for (from, limit) in [(1000, 1), (1000, 38), (1001, 3), (995, 20), (1008, 30), (0, 2000)] {
        let read = partition.read(from, limit, usize::MAX).unwrap();
        assert_eq!(read.len(), limit.min(1038 - from as usize), "read({from}, {limit})");
        for record in read {
            assert_eq!(record, stored(record.offset, &records[record.offset as usize]));
        }
    }
}

#[tokio::test]
async fn reads_outside_the_log_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), PartitionConfig::default());
    assert_eq!(partition.read(0, 10, usize::MAX), Ok(vec![]));
    assert_eq!(partition.read(1, 10, usize::MAX), Err(ReadError::PastEnd { offset: 1, end: 0 }));
    partition.append(&[NewRecord::value("a"), NewRecord::value("b")]).await.unwrap();
    assert_eq!(partition.read(2, 10, usize::MAX), Ok(vec![]), "reading at the end offset is empty, not an error");
    assert_eq!(partition.read(3, 10, usize::MAX), Err(ReadError::PastEnd { offset: 3, end: 2 }));
    assert_eq!(partition.read(u64::MAX, 10, usize::MAX), Err(ReadError::PastEnd { offset: u64::MAX, end: 2 }));
    // BeforeStart needs retention to move the start: see the retention tests.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_wakes_on_append_and_reports_close() {
    let dir = tempfile::tempdir().unwrap();
    let partition = Arc::new(open(dir.path(), PartitionConfig::default()));
    let spawn_waiter = |offset: u64| {
        let partition = partition.clone();
        tokio::spawn(async move { partition.wait_for(offset).await })
    };
    let first = spawn_waiter(0);
    let third = spawn_waiter(2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!first.is_finished(), "wait_for(0) returned before anything was appended");

    partition.append(&[NewRecord::value("one")]).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), first).await.expect("the append wakes the waiter");
    assert_eq!(woken.unwrap(), Ok(1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!third.is_finished(), "wait_for(2) must not wake while the end is 1");
    partition.append(&[NewRecord::value("two"), NewRecord::value("three")]).await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(5), third).await.expect("the append wakes the waiter");
    assert_eq!(woken.unwrap(), Ok(3));

    // Records already readable answer at once.
    assert_eq!(tokio::time::timeout(Duration::from_secs(1), partition.wait_for(0)).await.unwrap(), Ok(3));

    // A waiter past the end is released by close with Closed.
    let beyond = spawn_waiter(3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!beyond.is_finished());
    partition.close();
    let woken = tokio::time::timeout(Duration::from_secs(5), beyond).await.expect("close wakes the waiter");
    assert_eq!(woken.unwrap(), Err(ReadError::Closed));
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(1), partition.wait_for(3)).await.unwrap(),
        Err(ReadError::Closed)
    );
    assert_eq!(partition.wait_for(2).await, Ok(3), "records written before close stay readable");
    assert!(partition.watch().borrow().closed);
}

#[tokio::test]
async fn offset_for_timestamp_finds_the_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let partition = open(dir.path(), small_config());
    // Timestamps jump back between runs of records and jitter within them, so neither the
    // segments nor the records are in time order.
    let mut expected = Vec::new();
    for run_base in [5_000i64, 1_000, 3_000, -2_000, 4_000] {
        for i in 0..60u64 {
            let jitter = ((i * 7_919) % 400) as i64;
            expected.push(NewRecord { timestamp_ms: Some(run_base + jitter), ..numbered(expected.len() as u64, 60) });
        }
    }
    let mut at = 0;
    while at < expected.len() {
        let count = 1 + at % 4;
        let end = (at + count).min(expected.len());
        partition.append(&expected[at..end]).await.unwrap();
        at = end;
    }
    assert!(partition.segment_count() > 5, "the test needs several segments, got {}", partition.segment_count());

    let mut targets: Vec<i64> = expected.iter().map(|record| record.timestamp_ms.unwrap()).collect();
    targets.extend((-3_000..6_000).step_by(37));
    targets.extend([i64::MIN, i64::MAX, 5_399, 5_400]);
    let check = |partition: &Partition| {
        for &target in &targets {
            let want = expected.iter().position(|record| record.timestamp_ms.unwrap() >= target).map(|i| i as u64);
            assert_eq!(partition.offset_for_timestamp(target).unwrap(), want, "timestamp {target}");
        }
    };
    check(&partition);
    let partition = reopen(partition);
    check(&partition);
    partition.close();
    drop(partition);
    remove_index_files(dir.path());
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!(report.indexes_rebuilt, report.segments);
    check(&partition);
}

#[tokio::test]
async fn segments_roll_and_reads_cross_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_config();
    let partition = open(dir.path(), config.clone());
    let mut expected = Vec::new();
    let mut appends = 0;
    while expected.len() < 300 {
        let count = 1 + appends % 4;
        let batch: Vec<NewRecord> =
            (0..count).map(|i| numbered(expected.len() as u64 + i as u64, 20 + (appends * 37) % 300)).collect();
        let ack = partition.append(&batch).await.unwrap();
        assert_eq!(ack.base_offset, expected.len() as u64);
        expected.extend(batch);
        appends += 1;
    }
    let bases = segment_bases(dir.path());
    assert!(bases.len() > 10, "expected many segments, got {bases:?}");
    assert_eq!(partition.segment_count(), bases.len());
    // Every segment starts with the record its name says, holds no more than the limit (a
    // batch never straddles segments), and the segments together hold every batch in order.
    // Closed segments are exactly their batches; the active one may have zeros after them.
    let mut next_offset = 0;
    for (i, &base) in bases.iter().enumerate() {
        let path = segment_path(dir.path(), base);
        let (batches, data_bytes) = batches_and_data_end(&path);
        assert_eq!(batches[0].1.base_offset, base);
        assert!(data_bytes <= config.segment_bytes_max);
        if i + 1 < bases.len() {
            assert_exact(&path);
        }
        for (_, header) in batches {
            assert_eq!(header.base_offset, next_offset);
            next_offset = header.next_offset();
        }
    }
    assert_eq!(next_offset, expected.len() as u64);

    let check = |partition: &Partition| {
        assert_eq!(partition.end_offset(), expected.len() as u64);
        for (from, new) in expected.iter().enumerate() {
            let one = partition.read(from as u64, 1, usize::MAX).unwrap();
            assert_eq!(one, vec![stored(from as u64, new)], "read at {from}");
        }
        // Long reads cross segment boundaries without gaps.
        for from in (0..expected.len()).step_by(23) {
            let many = partition.read(from as u64, 50, usize::MAX).unwrap();
            let want: Vec<Record> =
                expected.iter().enumerate().skip(from).take(50).map(|(i, new)| stored(i as u64, new)).collect();
            assert_eq!(many, want, "read of 50 at {from}");
        }
    };
    check(&partition);

    // A clean close leaves every index in place: nothing is rebuilt.
    partition.close();
    drop(partition);
    for &base in &bases {
        assert_exact(&segment_path(dir.path(), base));
    }
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!((report.segments, report.indexes_rebuilt, report.truncated_bytes), (bases.len(), 0, 0));
    check(&partition);

    // Without index files, open rebuilds them all and reads do not change.
    partition.close();
    drop(partition);
    assert_eq!(remove_index_files(dir.path()), 2 * bases.len());
    let (partition, report) = Partition::open_existing(dir.path()).unwrap();
    assert_eq!((report.segments, report.indexes_rebuilt, report.truncated_bytes), (bases.len(), bases.len(), 0));
    check(&partition);
    // Closed segments get their index files back at open, the active one at close.
    for &base in &bases[..bases.len() - 1] {
        assert!(dir.path().join(format!("{base:020}.index")).exists());
        assert!(dir.path().join(format!("{base:020}.timeindex")).exists());
    }
    let partition = reopen(partition);
    check(&partition);
    // Appends continue where the log ended, in the last segment.
    let ack = partition.append(&[numbered(1_000, 10)]).await.unwrap();
    assert_eq!(ack.base_offset, expected.len() as u64);
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
        headers: vec![("tag".into(), Bytes::from(tag.to_string()))],
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

#[tokio::test]
async fn log_open_recovers_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let options = LogOptions { maintenance_interval: Duration::from_secs(3600), ..LogOptions::default() };
    let (log, opened) = Log::open(dir.path(), options.clone()).unwrap();
    assert!(opened.is_empty());
    let table = PartitionConfig { compacted: true, ..PartitionConfig::default() };
    let mut expected = Vec::new();
    for (topic, index, config) in
        [("orders", 0, PartitionConfig::default()), ("orders", 1, PartitionConfig::default()), ("users.v2", 0, table)]
    {
        let partition = log.open_partition(topic, index, config.clone()).unwrap();
        assert!(Arc::ptr_eq(&partition, &log.open_partition(topic, index, config).unwrap()), "opened once");
        let records: Vec<NewRecord> =
            (0..3 + index as u64).map(|i| NewRecord { key: Some(Bytes::from(topic)), ..numbered(i, 10) }).collect();
        partition.append(&records).await.unwrap();
        expected.push((topic.to_string(), index, records));
    }
    match log.open_partition("../escape", 0, PartitionConfig::default()) {
        Err(OpenError::BadConfig { reason, .. }) => assert!(reason.contains("not allowed"), "{reason}"),
        other => panic!("a bad topic name must be refused, got {:?}", other.map(|_| ())),
    }
    // Things that are not partitions are ignored.
    fs::create_dir_all(dir.path().join("orders").join("not-a-number")).unwrap();
    fs::create_dir_all(dir.path().join("orders").join("7")).unwrap(); // no partition.conf
    fs::write(dir.path().join("stray-file"), b"x").unwrap();
    log.close();
    drop(log);

    let (log, opened) = Log::open(dir.path(), options).unwrap();
    let found: Vec<(String, u32)> = opened.iter().map(|o| (o.topic.clone(), o.partition)).collect();
    assert_eq!(found, vec![("orders".to_string(), 0), ("orders".to_string(), 1), ("users.v2".to_string(), 0)]);
    assert!(opened.iter().all(|o| o.recovery.truncated_bytes == 0));
    assert_eq!(log.partitions().len(), 3);
    for (topic, index, records) in &expected {
        let partition = log.partition(topic, *index).expect("recovered");
        let want: Vec<Record> = records.iter().enumerate().map(|(i, new)| stored(i as u64, new)).collect();
        assert_eq!(read_all(&partition), want);
    }
    assert!(log.partition("users.v2", 0).unwrap().config().compacted, "settings are restored with the partition");
    assert!(log.partition("orders", 7).is_none());
}

#[test]
fn dir_lock_refuses_a_second_holder_and_names_the_pid() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let lock = DirLock::acquire(&data).unwrap();
    assert_eq!(lock.path(), data.join("LOCK"));
    let pid = std::process::id();
    assert_eq!(fs::read_to_string(lock.path()).unwrap(), format!("{pid}\n"));
    // flock belongs to the open file description, so even this process cannot take it twice.
    match DirLock::acquire(&data) {
        Err(error @ LockError::Busy { .. }) => {
            let message = error.to_string();
            assert!(message.contains(&format!("pid {pid}")), "{message}");
            assert!(message.contains(&data.display().to_string()), "{message}");
        }
        Err(other) => panic!("expected Busy, got {other}"),
        Ok(_) => panic!("a second lock on the same directory was granted"),
    }
    drop(lock);
    let again = DirLock::acquire(&data).expect("the lock is free once dropped");
    assert_eq!(fs::read_to_string(again.path()).unwrap(), format!("{pid}\n"));
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
