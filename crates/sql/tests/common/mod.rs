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

/// The `sql` blocks of the section `heading` (`## Joined views`, `### Transforms`) of the page
/// `page` of docs/, in order: up to the next heading of its level or above.
pub fn sql_blocks(page: &str, heading: &str) -> Vec<String> {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs").join(page)).unwrap();
    let start = text.find(heading).unwrap_or_else(|| panic!("{page} has {heading}"));
    let level = heading.chars().take_while(|c| *c == '#').count();
    let section = &text[start + heading.len()..];
    let end = section
        .match_indices("\n#")
        .find(|(at, _)| section[at + 1..].chars().take_while(|c| *c == '#').count() <= level)
        .map_or(section.len(), |(at, _)| at);
    let mut blocks = Vec::new();
    let mut rest = &section[..end];
    while let Some(at) = rest.find("```sql\n") {
        let body = &rest[at + 7..];
        let close = body.find("```").unwrap();
        blocks.push(body[..close].to_string());
        rest = &body[close + 3..];
    }
    blocks
}
