//! `BEGIN … COMMIT`: several writes applied all or none.
//!
//! A transaction writes one table, or one stream. Each of its statements is decided when it
//! runs, against the table as the transaction's own earlier writes leave it, and kept here;
//! nothing is written before COMMIT. COMMIT writes every row the transaction changed as one
//! batch, which the log keeps whole or not at all, each on condition that the row is still the
//! version the transaction first read (or still missing, for a row it inserted). If another
//! writer changed one of them meanwhile, COMMIT writes nothing and fails with a serialization
//! failure, as Postgres's REPEATABLE READ does for a concurrent update: run it again.
//!
//! Queries in a transaction read the table it writes through its uncommitted writes, and
//! everything else as committed when each query runs. ROLLBACK, or an error, drops the kept
//! writes; nothing was written.

use std::collections::HashMap;
use std::sync::Arc;

use onehop_engine::{EngineError, NewRecord, Precondition, Stream, Table, Write};

use super::source::Overlay;
use super::write::{Changed, Plan, check_one_partition};
use crate::SqlError;

/// The writes of one open transaction, not yet committed. A clone is a savepoint: the
/// transaction as it is now, to go back to.
#[derive(Clone, Default)]
pub struct Transaction {
    target: Option<Target>,
    /// Bytes of rows and records held (estimated as JSON): within the query memory cap.
    bytes: u64,
}

#[derive(Clone)]
enum Target {
    Table {
        table: Arc<Table>,
        /// Per row written: the precondition of its first read (the version, or missing).
        base: HashMap<String, Precondition>,
        overlay: Arc<Overlay>,
    },
    Stream {
        stream: Arc<Stream>,
        records: Vec<NewRecord>,
    },
}

impl Target {
    fn name(&self) -> String {
        match self {
            Target::Table { table, .. } => table.name(),
            Target::Stream { stream, .. } => stream.def().name.clone(),
        }
    }
}

impl Transaction {
    pub fn new() -> Transaction {
        Transaction::default()
    }

    /// Whether the transaction has written nothing yet.
    pub fn is_empty(&self) -> bool {
        self.target.is_none()
    }

    /// The table writes its queries read through.
    pub(crate) fn overlay(&self) -> Option<Arc<Overlay>> {
        match &self.target {
            Some(Target::Table { overlay, .. }) => Some(overlay.clone()),
            _ => None,
        }
    }

    /// Keeps a decided write until COMMIT, and answers what it did. Refused, with nothing
    /// kept, when it writes a second table or stream or the transaction would hold more than
    /// `memory_bytes_max`.
    pub(crate) fn stage(&mut self, plan: Plan, memory_bytes_max: u64) -> Result<Changed, SqlError> {
        let count = plan.count();
        let (name, bytes) = match &plan {
            Plan::Table { table, writes, .. } => {
                (table.name(), writes.iter().map(|(id, write, _)| id.len() as u64 + write_bytes(write)).sum::<u64>())
            }
            Plan::Stream { stream, records, .. } => (
                stream.def().name.clone(),
                records
                    .iter()
                    .map(|record| {
                        (record.key.as_ref().map_or(0, |key| key.len()) + record.value.as_ref().map_or(0, |v| v.len()))
                            as u64
                    })
                    .sum(),
            ),
        };
        if count > 0
            && let Some(target) = &self.target
            && target.name() != name
        {
            return Err(SqlError::Transaction(format!(
                "a transaction writes one table or stream: this one has written {}, and {name} is another. COMMIT \
                 (or ROLLBACK) it, then write {name} in a transaction of its own",
                target.name()
            )));
        }
        if self.bytes + bytes > memory_bytes_max {
            return Err(SqlError::QueryLimit {
                limit: "memory",
                message: format!(
                    "the transaction would hold more than {memory_bytes_max} bytes of uncommitted writes \
                     (query_memory_max): COMMIT in smaller transactions"
                ),
            });
        }
        self.bytes += bytes;
        match plan {
            // Nothing written: the transaction is still free to write any table.
            Plan::Table { writes, verb, returning, .. } if writes.is_empty() => {
                Ok(Changed { verb, rows: 0, returning })
            }
            Plan::Stream { records, returning, .. } if records.is_empty() => {
                Ok(Changed { verb: "INSERT", rows: 0, returning })
            }
            Plan::Table { table, writes, verb, returning } => {
                let target = self.target.get_or_insert_with(|| Target::Table {
                    overlay: Arc::new(Overlay { table: table.name(), rows: Default::default() }),
                    table,
                    base: HashMap::new(),
                });
                let Target::Table { base, overlay, .. } = target else { unreachable!("one name, one kind") };
                let overlay = Arc::make_mut(overlay);
                for (id, write, precondition) in writes {
                    base.entry(id.clone()).or_insert(precondition);
                    let after = match write {
                        Write::Put(doc) => Some(doc),
                        Write::Delete => None,
                        Write::Patch(_) => unreachable!("SQL writes whole rows"),
                    };
                    overlay.rows.insert(id, after);
                }
                Ok(Changed { verb, rows: count, returning })
            }
            Plan::Stream { stream, records: new, returning } => {
                let target =
                    self.target.get_or_insert_with(|| Target::Stream { stream: stream.clone(), records: Vec::new() });
                let Target::Stream { records, .. } = target else { unreachable!("one name, one kind") };
                let mut all = records.clone();
                all.extend(new);
                check_one_partition(&stream, &all)?;
                *records = all;
                Ok(Changed { verb: "INSERT", rows: count, returning })
            }
        }
    }

    /// Writes everything the transaction kept, all or none; the rows and records written.
    pub async fn commit(self) -> Result<u64, SqlError> {
        match self.target {
            None => Ok(0),
            Some(Target::Table { table, base, overlay }) => {
                let overlay = Arc::unwrap_or_clone(overlay);
                let mut writes = Vec::with_capacity(overlay.rows.len());
                for (id, after) in overlay.rows {
                    let precondition = base.get(&id).copied().unwrap_or(Precondition::None);
                    match (after, precondition) {
                        // Inserted and deleted again: nothing to write.
                        (None, Precondition::Missing) => {}
                        (None, precondition) => writes.push((id, Write::Delete, precondition)),
                        (Some(doc), precondition) => writes.push((id, Write::Put(doc), precondition)),
                    }
                }
                let count = writes.len() as u64;
                if writes.is_empty() {
                    return Ok(0);
                }
                match table.write_all(writes, None).await {
                    Ok(_) => Ok(count),
                    Err(EngineError::PreconditionFailed { id, .. }) => Err(SqlError::SerializationFailure(format!(
                        "could not serialize the transaction: row {id} of {} changed since the transaction read it; \
                         nothing of the transaction was written",
                        table.name()
                    ))),
                    Err(error) => Err(error.into()),
                }
            }
            Some(Target::Stream { stream, records }) => {
                let count = records.len() as u64;
                if !records.is_empty() {
                    stream.publish(&records, None).await?;
                }
                Ok(count)
            }
        }
    }
}

fn write_bytes(write: &Write) -> u64 {
    match write {
        Write::Put(doc) | Write::Patch(doc) => serde_json::to_vec(doc).map_or(0, |bytes| bytes.len() as u64),
        Write::Delete => 0,
    }
}
