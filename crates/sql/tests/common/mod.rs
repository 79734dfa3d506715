//! Helpers shared by the SQL tests: a real engine on a directory of its own, and statements
//! run on it as `POST /sql` runs them.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use onehop_engine::{Engine, EngineOptions};
use onehop_log::{Log, LogOptions};
use onehop_sql::{Output, SqlError, execute, parse};

/// An engine on a fresh temporary directory, and the directory: `open` after `close` finds
/// the same data again.
pub fn fresh() -> (tempfile::TempDir, Arc<Engine>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = open(dir.path());
    (dir, engine)
}

pub fn open(dir: &Path) -> Arc<Engine> {
    let (log, _) = Log::open(dir, LogOptions::default()).unwrap();
    Arc::new(Engine::open(Arc::new(log), EngineOptions::default()).unwrap())
}

/// Stops the views and transforms, then closes the log, as a clean shutdown does.
pub async fn close(engine: Arc<Engine>) {
    engine.stop_derived().await;
    let log = engine.log().clone();
    drop(engine);
    log.close();
}

/// Parses `sql` and runs its statements in order, stopping at the first error.
pub async fn run(engine: &Engine, sql: &str) -> Result<Vec<Output>, SqlError> {
    let mut outputs = Vec::new();
    for statement in parse(sql)? {
        outputs.push(execute(engine, &statement).await?);
    }
    Ok(outputs)
}
