//! Streams in SQL: ALTER STREAM changes a stream's retention and grows its partitions,
//! durably, and nothing else.

mod common;

use common::{close, fresh, open, run};
use onehop_sql::{Output, SqlError};

#[tokio::test]
async fn alter_stream_changes_only_the_retention_it_names_and_it_survives_a_restart() {
    let (dir, engine) = fresh();
    run(&engine, "CREATE STREAM orders WITH (partitions = 2, retention = '7d', retention_bytes = '1GiB')")
        .await
        .unwrap();
    let outputs = run(&engine, "ALTER STREAM orders SET (retention = '30d')").await.unwrap();
    assert!(
        matches!(&outputs[0], Output::Altered { statement, .. } if statement == "ALTER STREAM orders"),
        "{outputs:?}"
    );
    let def = engine.stream("orders").unwrap().def().clone();
    assert_eq!((def.retention_ms, def.retention_bytes), (Some(30 * 86_400_000), Some(1 << 30)), "bytes kept");
    run(&engine, "ALTER STREAM orders SET (retention_bytes = 'none')").await.unwrap();
    close(engine).await;

    let engine = open(dir.path());
    let def = engine.stream("orders").unwrap().def().clone();
    assert_eq!((def.retention_ms, def.retention_bytes, def.partitions), (Some(30 * 86_400_000), None, 2));

    // What ALTER cannot change, fewer partitions, an unknown stream, and an empty SET are
    // refused, changing nothing.
    let refused = run(&engine, "ALTER STREAM orders SET (durability = 'async')").await.unwrap_err();
    assert!(matches!(&refused, SqlError::InvalidOption(why) if why.contains("fixed at CREATE")), "{refused:?}");
    assert!(run(&engine, "ALTER STREAM orders SET (partitions = 1)").await.is_err());
    assert!(run(&engine, "ALTER STREAM nothing SET (retention = '1d')").await.is_err());
    assert!(run(&engine, "ALTER STREAM orders SET ()").await.is_err());
    assert_eq!(engine.stream("orders").unwrap().def(), &def);

    // Partitions grow, durably.
    run(&engine, "ALTER STREAM orders SET (partitions = 6)").await.unwrap();
    assert_eq!(engine.stream("orders").unwrap().partition_count(), 6);
    close(engine).await;
    let engine = open(dir.path());
    assert_eq!(engine.stream("orders").unwrap().def().partitions, 6);
    close(engine).await;
}
