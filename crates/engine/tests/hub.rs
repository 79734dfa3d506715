//! The hub and cursors: filtering, history then live with no gap and no duplicate, resume,
//! cutting off a subscriber that falls behind, or carrying it on from the log.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::stream_def;
use onehop_engine::filter::Condition;
use onehop_engine::hub::{Cursor, Delivery, Event};
use onehop_engine::subject::SubjectFilter;
use onehop_engine::{Engine, EngineOptions, Filter, Stream, StreamDef};
use onehop_log::{Durability, NewRecord};

fn open(dir: &std::path::Path, queue: usize) -> Arc<Engine> {
    Arc::new(common::open(dir, EngineOptions { subscriber_queue_capacity: queue, ..EngineOptions::default() }))
}

async fn stream(engine: &Engine, name: &str, partitions: u32) -> Arc<Stream> {
    engine.create_stream(StreamDef { durability: Durability::Async, ..stream_def(name, partitions) }).await.unwrap()
}

fn subject_record(subject: &str, value: String) -> NewRecord {
    NewRecord { subject: Some(subject.into()), ..NewRecord::value(value) }
}

async fn next_event(cursor: &mut Cursor) -> (u32, u64, String) {
    match tokio::time::timeout(Duration::from_secs(10), cursor.next()).await.expect("an event within 10 s").unwrap() {
        Delivery::Event(event, _) => (
            event.partition,
            event.record.offset,
            String::from_utf8(event.record.value.clone().unwrap().to_vec()).unwrap(),
        ),
        Delivery::Overflow { positions } => panic!("unexpected overflow at {positions:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_subscribers_get_what_matches_their_filter() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 1024);
    let scores = stream(&engine, "scores", 1).await;
    let filter = |text| Filter::subject(SubjectFilter::parse(text).unwrap());
    let mut team_one = engine.subscribe(&scores, filter("scores/team-1"), vec![0]).unwrap();
    let mut every_team = engine.subscribe(&scores, filter("scores/+"), vec![0]).unwrap();
    let mut everything = engine.subscribe(&scores, Filter::default(), vec![0]).unwrap();
    let records = vec![
        subject_record("scores/team-1", "a".into()),
        subject_record("scores/team-2", "b".into()),
        subject_record("news/x", "c".into()),
        NewRecord::value("d"),
        subject_record("scores/team-1", "e".into()),
    ];
    scores.publish(&records, None).await.unwrap();
    assert_eq!(next_event(&mut team_one).await.2, "a");
    assert_eq!(next_event(&mut team_one).await.2, "e");
    for expected in ["a", "b", "e"] {
        assert_eq!(next_event(&mut every_team).await.2, expected);
    }
    for expected in ["a", "b", "c", "d", "e"] {
        assert_eq!(next_event(&mut everything).await.2, expected);
    }
    // Nothing more is pending for the filtered ones.
    assert!(tokio::time::timeout(Duration::from_millis(200), team_one.next()).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_then_live_has_no_gap_and_no_duplicate_while_writers_run() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 100_000);
    let events = stream(&engine, "events", 3).await;
    let keyed = |i: u32| NewRecord::keyed(format!("k{}", i % 17), format!("{i}"));
    for i in 0..300 {
        events.publish(&[keyed(i)], None).await.unwrap();
    }
    let writer = {
        let events = events.clone();
        tokio::spawn(async move {
            for i in 300..1300 {
                events.publish(&[keyed(i)], None).await.unwrap();
                if i % 50 == 0 {
                    tokio::task::yield_now().await;
                }
            }
        })
    };
    let mut cursor = engine.subscribe(&events, Filter::default(), vec![0, 0, 0]).unwrap();
    let mut seen: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    let mut values = Vec::new();
    for _ in 0..1300 {
        let (partition, offset, value) = next_event(&mut cursor).await;
        seen.entry(partition).or_default().push(offset);
        values.push(value.parse::<u32>().unwrap());
    }
    writer.await.unwrap();
    for (partition, offsets) in &seen {
        let expected: Vec<u64> = (0..offsets.len() as u64).collect();
        assert_eq!(offsets, &expected, "partition {partition}: every offset once, in order");
    }
    values.sort_unstable();
    assert_eq!(values, (0..1300).collect::<Vec<_>>(), "every record exactly once");
    assert!(tokio::time::timeout(Duration::from_millis(200), cursor.next()).await.is_err(), "and nothing more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_resumes_exactly_where_the_last_one_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 1024);
    let ticks = stream(&engine, "ticks", 2).await;
    let batch: Vec<NewRecord> = (0..40).map(|i| NewRecord::keyed(format!("k{i}"), format!("{i}"))).collect();
    ticks.publish(&batch, None).await.unwrap();
    let mut first = engine.subscribe(&ticks, Filter::default(), vec![0, 0]).unwrap();
    let mut delivered = Vec::new();
    for _ in 0..15 {
        delivered.push(next_event(&mut first).await.2);
    }
    let positions = first.positions().to_vec();
    drop(first);
    let more: Vec<NewRecord> = (40..60).map(|i| NewRecord::keyed(format!("k{i}"), format!("{i}"))).collect();
    ticks.publish(&more, None).await.unwrap();
    let mut second = engine.subscribe(&ticks, Filter::default(), positions).unwrap();
    for _ in 15..60 {
        delivered.push(next_event(&mut second).await.2);
    }
    let mut numbers: Vec<u32> = delivered.iter().map(|value| value.parse().unwrap()).collect();
    numbers.sort_unstable();
    assert_eq!(numbers, (0..60).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_behind_is_cut_off_and_can_resume() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 8);
    let fast = stream(&engine, "fast", 1).await;
    let mut slow = engine.subscribe(&fast, Filter::default(), vec![0]).unwrap();
    // Go live first (nothing to catch up), then let the queue overflow.
    fast.publish(&[NewRecord::value("0")], None).await.unwrap();
    assert_eq!(next_event(&mut slow).await.2, "0");
    for i in 1..200 {
        fast.publish(&[NewRecord::value(format!("{i}"))], None).await.unwrap();
    }
    let mut received = vec![0u32];
    let positions = loop {
        match tokio::time::timeout(Duration::from_secs(10), slow.next()).await.unwrap().unwrap() {
            Delivery::Event(event, _) => {
                received.push(String::from_utf8(event.record.value.clone().unwrap().to_vec()).unwrap().parse().unwrap())
            }
            Delivery::Overflow { positions } => break positions,
        }
    };
    assert!(received.len() < 200, "the queue of 8 cannot have held everything");
    assert_eq!(positions, vec![received.len() as u64], "the overflow says where delivery stopped");
    drop(slow);
    let mut resumed = engine.subscribe(&fast, Filter::default(), positions).unwrap();
    while received.len() < 200 {
        received.push(next_event(&mut resumed).await.2.parse().unwrap());
    }
    assert_eq!(received, (0..200).collect::<Vec<_>>(), "no gap, no duplicate across the cut");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carry_on_cursor_reads_on_from_the_log_when_it_falls_behind() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 8);
    let fast = stream(&engine, "fast", 2).await;
    // Only even numbers match, so positions must step over filtered records across the switch.
    let filter = Filter { conditions: vec![Condition::new("even", "true").unwrap()], ..Filter::default() };
    let mut slow = engine.subscribe(&fast, filter, vec![0, 0]).unwrap().carry_on();
    let record = |i: u32| NewRecord::keyed(format!("k{i}"), format!("{{\"n\":{i},\"even\":{}}}", i.is_multiple_of(2)));
    fast.publish(&[record(0)], None).await.unwrap();
    let number = |event: &Event| -> u32 {
        let value: serde_json::Value = serde_json::from_slice(event.record.value.as_ref().unwrap()).unwrap();
        value["n"].as_u64().unwrap() as u32
    };
    let mut received = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), slow.next()).await.unwrap().unwrap() {
        Delivery::Event(event, _) => received.push((event.partition, number(&event))),
        Delivery::Overflow { .. } => panic!("overflow"),
    }
    // Live now; 400 records while it does not read overflow its queue of 8 many times over.
    for i in 1..400 {
        fast.publish(&[record(i)], None).await.unwrap();
    }
    while received.len() < 200 {
        match tokio::time::timeout(Duration::from_secs(10), slow.next()).await.unwrap().unwrap() {
            Delivery::Event(event, _) => received.push((event.partition, number(&event))),
            Delivery::Overflow { positions } => panic!("a carry-on cursor yielded an overflow at {positions:?}"),
        }
    }
    assert!(slow.carried_on() >= 1, "the queue of 8 cannot have held 200 events");
    let mut numbers: Vec<u32> = received.iter().map(|&(_, n)| n).collect();
    for partition in 0..2 {
        let in_partition: Vec<u32> = received.iter().filter(|&&(p, _)| p == partition).map(|&(_, n)| n).collect();
        assert!(in_partition.windows(2).all(|pair| pair[0] < pair[1]), "partition {partition} in order");
    }
    numbers.sort_unstable();
    assert_eq!(numbers, (0..400).step_by(2).collect::<Vec<_>>(), "every match once");
    // Back on the live feed: a new match arrives.
    fast.publish(&[record(1000)], None).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(10), slow.next()).await.unwrap().unwrap() {
        Delivery::Event(event, _) => assert_eq!(number(&event), 1000),
        Delivery::Overflow { .. } => panic!("overflow"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 8);
    let two = stream(&engine, "two", 2).await;
    assert!(engine.subscribe(&two, Filter::default(), vec![0]).is_err(), "one position per partition");
    assert_eq!(engine.subscribe(&two, Filter::default(), vec![0, 5]).err().unwrap().code(), "offset_past_end");
}

/// A stream gains partitions (Kafka's CreatePartitions) while subscribers wait live and while
/// one is catching up: each moves on to the new partitions by itself, missing nothing and
/// repeating nothing; the count survives a restart; fewer partitions are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_follow_a_stream_that_gains_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path(), 1024);
    let orders = stream(&engine, "orders", 2).await;
    orders.enqueue_to(0, &[NewRecord::value("before")], None).await.unwrap().await.unwrap();
    let mut live = engine.subscribe(&orders, Filter::default(), orders.end_offsets()).unwrap();
    let mut catching_up = engine.subscribe(&orders, Filter::default(), vec![0, 0]).unwrap();
    // The live one waits in the hub before the stream grows.
    let waiting = tokio::spawn(async move {
        let event = next_event(&mut live).await;
        (event, live)
    });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let grown = engine.add_stream_partitions("orders", 4).await.unwrap();
    assert_eq!(grown.partition_count(), 4);
    grown.enqueue_to(3, &[NewRecord::value("in a new partition")], None).await.unwrap().await.unwrap();
    let (event, mut live) = waiting.await.unwrap();
    assert_eq!(event, (3, 0, "in a new partition".to_string()));
    assert_eq!(next_event(&mut catching_up).await, (0, 0, "before".to_string()));
    assert_eq!(next_event(&mut catching_up).await, (3, 0, "in a new partition".to_string()));
    grown.enqueue_to(1, &[NewRecord::value("old partition")], None).await.unwrap().await.unwrap();
    assert_eq!(next_event(&mut live).await, (1, 0, "old partition".to_string()));
    assert_eq!(next_event(&mut catching_up).await, (1, 0, "old partition".to_string()));
    assert_eq!(live.positions(), &[1, 1, 0, 1]);

    let fewer = engine.add_stream_partitions("orders", 3).await.err().unwrap();
    assert!(fewer.to_string().contains("not taken away"), "{fewer}");
    drop((live, catching_up, orders, grown));
    let log = engine.log().clone();
    drop(engine);
    log.close();
    let engine = open(dir.path(), 1024);
    let orders = engine.stream("orders").unwrap();
    assert_eq!(orders.partition_count(), 4, "the catalog keeps the new count");
    let records = orders.read(3, onehop_engine::Position::Earliest, 10, 1 << 20).unwrap();
    assert_eq!(records.len(), 1);
}
