//! Idempotent writes on a single node: a retry within the window is answered with the first
//! write's places and writes nothing; a key named for other records is refused; keys are per
//! user; they survive a restart with and without a checkpoint; the window and the key limit
//! end them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{close, fresh, open, stream_def};
use onehop_engine::{Engine, EngineError, EngineOptions, NewRecord, Published, Stream};

fn records(values: &[&str]) -> Vec<NewRecord> {
    values
        .iter()
        .map(|value| NewRecord { key: Some(Bytes::from(format!("k-{value}"))), ..NewRecord::value(value.to_string()) })
        .collect()
}

async fn stream(engine: &Engine) -> Arc<Stream> {
    match engine.stream("orders") {
        Ok(stream) => stream,
        Err(_) => engine.create_stream(stream_def("orders", 3)).await.unwrap(),
    }
}

fn stored(stream: &Stream) -> usize {
    (0..stream.partition_count()).map(|partition| stream.end_offset(partition).unwrap() as usize).sum()
}

async fn write(
    engine: &Engine,
    scope: &str,
    key: &str,
    values: &[&str],
) -> Result<(Vec<Published>, bool), EngineError> {
    let stream = stream(engine).await;
    engine.publish_idempotent(&stream, records(values), None, scope, key).await
}

#[tokio::test]
async fn a_retry_is_answered_with_the_first_write_and_writes_nothing() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let (first, replayed) = write(&engine, "alice", "order-1", &["a", "b", "c", "d"]).await.unwrap();
    assert!(!replayed);
    let partitions: std::collections::BTreeSet<u32> = first.iter().map(|place| place.partition).collect();
    assert!(partitions.len() > 1, "the write spans partitions: {first:?}");
    let orders = stream(&engine).await;
    assert_eq!(stored(&orders), 4);
    for _ in 0..3 {
        let (again, replayed) = write(&engine, "alice", "order-1", &["a", "b", "c", "d"]).await.unwrap();
        assert!(replayed);
        assert_eq!(again, first, "the first write's places, record by record");
    }
    assert_eq!(stored(&orders), 4, "nothing written again");

    // The key named these records: other records under it are refused, and not written.
    let refused = write(&engine, "alice", "order-1", &["a", "b", "c", "x"]).await.unwrap_err();
    assert!(matches!(refused, EngineError::IdempotencyKeyReused { .. }), "{refused}");
    assert_eq!(refused.code(), "idempotency_key_reused");
    // Another user's key of the same name is another write.
    let (bob, replayed) = write(&engine, "bob", "order-1", &["a", "b", "c", "d"]).await.unwrap();
    assert!(!replayed && bob != first);
    assert_eq!(stored(&orders), 8);
    // Keys are checked.
    for bad in ["", "with space", &"k".repeat(256)] {
        let error = write(&engine, "alice", bad, &["a"]).await.unwrap_err();
        assert_eq!(error.code(), "bad_idempotency_key", "{bad:?}");
    }
}

#[tokio::test]
async fn concurrent_retries_write_once() {
    let (_dir, engine) = fresh(EngineOptions::default());
    let engine = Arc::new(engine);
    stream(&engine).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move { write(&engine, "", "same", &["v1", "v2"]).await }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            Ok((places, _)) => answers.push(places),
            Err(EngineError::IdempotencyInProgress { .. }) => {}
            Err(error) => panic!("{error}"),
        }
    }
    assert!(!answers.is_empty());
    assert!(answers.windows(2).all(|pair| pair[0] == pair[1]), "one answer: {answers:?}");
    assert_eq!(stored(&*stream(&engine).await), 2, "written once");
    // Once the write is done, a retry gets its answer.
    let (places, replayed) = write(&engine, "", "same", &["v1", "v2"]).await.unwrap();
    assert!(replayed);
    assert_eq!(places, answers[0]);
}

#[tokio::test]
async fn keys_survive_a_restart_with_and_without_a_checkpoint() {
    let (dir, engine) = fresh(EngineOptions::default());
    let (before_checkpoint, _) = write(&engine, "alice", "one", &["1"]).await.unwrap();
    engine.idempotency().checkpoint(&engine).await.unwrap();
    let (after_checkpoint, _) = write(&engine, "alice", "two", &["2", "3"]).await.unwrap();
    // No clean close and no checkpoint after the second write: a start reads the streams on
    // from the checkpoint's positions and finds it.
    drop(engine);
    let engine = open(dir.path(), EngineOptions::default());
    assert_eq!(engine.idempotency().len(), 2);
    assert_eq!(write(&engine, "alice", "one", &["1"]).await.unwrap(), (before_checkpoint, true));
    assert_eq!(write(&engine, "alice", "two", &["2", "3"]).await.unwrap(), (after_checkpoint, true));
    assert_eq!(stored(&*stream(&engine).await), 3);
    close(engine);

    // A key's first write ever, and no checkpoint at all before the stop.
    let (dir, engine) = fresh(EngineOptions::default());
    let (first, _) = write(&engine, "", "only", &["x"]).await.unwrap();
    drop(engine);
    let engine = open(dir.path(), EngineOptions::default());
    assert_eq!(write(&engine, "", "only", &["x"]).await.unwrap(), (first, true));
}

#[tokio::test]
async fn the_window_and_the_key_limit_end_keys() {
    let options = EngineOptions { idempotency_window: Duration::from_millis(1), ..EngineOptions::default() };
    let (_dir, engine) = fresh(options);
    write(&engine, "", "brief", &["1"]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let (_, replayed) = write(&engine, "", "brief", &["1"]).await.unwrap();
    assert!(!replayed, "past its window a key names a new write");
    // Past the window a key may name other records.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!write(&engine, "", "brief", &["other"]).await.unwrap().1);

    let options = EngineOptions { idempotency_keys_max: 2, ..EngineOptions::default() };
    let (_dir, engine) = fresh(options);
    for key in ["k1", "k2", "k3"] {
        write(&engine, "", key, &[key]).await.unwrap();
    }
    assert_eq!(engine.idempotency().len(), 2);
    assert!(write(&engine, "", "k3", &["k3"]).await.unwrap().1, "the newest kept");
    assert!(!write(&engine, "", "k1", &["k1"]).await.unwrap().1, "the oldest dropped");
}
