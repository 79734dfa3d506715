//! The log as a directory: recovery of every partition, and the data-directory lock.

use super::*;

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
