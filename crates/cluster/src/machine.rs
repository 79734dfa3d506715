//! The state machine openraft applies committed entries to: the node's [`Applier`] (the engine,
//! in onehop), plus the record of how far it got.
//!
//! The applier keeps its own effects (onehop: the partitions, written without an fsync of their
//! own, since the Raft log already holds every entry durably on a majority). How far it got is
//! kept in `applied`, written only after [`Applier::sync`] made everything applied so far
//! durable: after a crash the node applies again from that point, so the `applied` file may lag
//! but never leads, and the applier must take an entry it already applied as a no-op.

use std::future::Future;
use std::io::{self, Cursor};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use crate::{Answer, TypeConfig};

/// What a node's replicated state is. Commands come out of the Raft log in log order, on every
/// node the same; an applier that is deterministic (the same answer and effects for the same
/// commands in the same order) keeps every node identical.
pub trait Applier: Send + Sync + 'static {
    /// On the leader, in the order requests are submitted: turns a request into the command to
    /// commit, or refuses it with an answer (nothing is written then). What the leader decides
    /// here (offsets, timestamps) travels in the command, so every node applies the same.
    fn prepare(&self, request: Bytes) -> Result<Bytes, Bytes>;

    /// On a node that became leader, once every entry of earlier terms is applied here and
    /// before its first [`Applier::prepare`]: whatever `prepare` predicted before is void.
    fn begin_term(&self);

    /// Applies the committed command at log index `index`, returning the answer for whoever
    /// proposed it. A refusal that every node makes alike (bad input) belongs in the answer;
    /// `Err` is for this node's own failure (its disk), and stops the node.
    ///
    /// After a restart, commands after the last [`Applier::sync`] are applied again: their
    /// effects may already be there, and applying must then change nothing.
    fn apply(&self, index: u64, command: Bytes) -> impl Future<Output = Result<Bytes, String>> + Send;

    /// Makes the effects of every command applied so far durable.
    fn sync(&self) -> impl Future<Output = Result<(), String>> + Send;

    /// Whether applying `command` again over a later state could go wrong (a definition
    /// change: a write applied again after a drop that came later would find nothing to write
    /// to). Before such a command is applied, the progress up to it is made durable, so a
    /// restart never applies anything before it again.
    fn is_barrier(&self, _command: &Bytes) -> bool {
        false
    }
}

#[derive(Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct Applied {
    last: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
}

/// The state machine of one node.
pub struct Machine<A> {
    applier: Arc<A>,
    applied: Arc<Mutex<Applied>>,
    dir: PathBuf,
    /// Records the progress, shared with the task that does so now and then.
    progress: Progress<A>,
}

type Error = StorageError<u64>;

fn machine_error(error: impl std::fmt::Display) -> Error {
    StorageIOError::write_state_machine(AnyError::error(error.to_string())).into()
}

impl<A: Applier> Machine<A> {
    /// Opens the state machine whose progress is kept in `dir/applied`.
    pub fn open(dir: impl Into<PathBuf>, applier: Arc<A>) -> io::Result<Machine<A>> {
        let dir = dir.into();
        crate::sys::create_dir_durably(&dir)?;
        let applied = match crate::sys::fs::read(dir.join("applied")) {
            Ok(bytes) => postcard::from_bytes(&bytes).map_err(|error| {
                io::Error::new(io::ErrorKind::InvalidData, format!("{}/applied: {error}", dir.display()))
            })?,
            Err(error) if error.kind() == io::ErrorKind::NotFound => Applied::default(),
            Err(error) => return Err(error),
        };
        let applied = Arc::new(Mutex::new(applied));
        let progress = Progress {
            applier: applier.clone(),
            applied: applied.clone(),
            dir: dir.clone(),
            persisted: Arc::new(tokio::sync::Mutex::new(None)),
        };
        Ok(Machine { applier, applied, dir, progress })
    }

    /// A handle that records progress durably, see [`Progress::persist`].
    pub fn progress(&self) -> Progress<A> {
        self.progress.clone()
    }
}

/// Records how far the state machine got, durably.
pub struct Progress<A> {
    applier: Arc<A>,
    applied: Arc<Mutex<Applied>>,
    dir: PathBuf,
    persisted: Arc<tokio::sync::Mutex<Option<LogId<u64>>>>,
}

impl<A> Clone for Progress<A> {
    fn clone(&self) -> Self {
        Progress {
            applier: self.applier.clone(),
            applied: self.applied.clone(),
            dir: self.dir.clone(),
            persisted: self.persisted.clone(),
        }
    }
}

impl<A: Applier> Progress<A> {
    /// Makes what was applied durable ([`Applier::sync`]), then records how far that was.
    pub async fn persist(&self) -> Result<(), String> {
        let mut persisted = self.persisted.lock().await;
        let applied = self.applied.lock().expect("applied lock").clone();
        if applied.last == *persisted {
            return Ok(());
        }
        self.applier.sync().await?;
        let bytes = postcard::to_allocvec(&applied).map_err(|error| error.to_string())?;
        let dir = self.dir.clone();
        crate::sys::blocking(move || crate::raftlog::write_atomically(&dir, "applied", &bytes))
            .await
            .map_err(|error| format!("{}/applied: {error}", self.dir.display()))?;
        *persisted = applied.last;
        Ok(())
    }

    /// Persists every `every` until the returned task is aborted.
    pub fn spawn(&self, every: Duration) -> tokio::task::JoinHandle<()> {
        let progress = self.clone();
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                if let Err(error) = progress.persist().await {
                    tracing::error!(%error, "cannot record the state machine's progress");
                }
            }
        })
    }

    /// The index of the last command applied on this node.
    pub fn last_applied(&self) -> Option<u64> {
        self.applied.lock().expect("applied lock").last.map(|id| id.index)
    }
}

const NO_SNAPSHOTS: &str = "this version keeps the whole Raft log and takes no snapshots (docs/cluster.md)";

impl<A: Applier> RaftSnapshotBuilder<TypeConfig> for Machine<A> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, Error> {
        Err(StorageIOError::write_snapshot(None, AnyError::error(NO_SNAPSHOTS)).into())
    }
}

impl<A: Applier> RaftStateMachine<TypeConfig> for Machine<A> {
    type SnapshotBuilder = Machine<A>;

    async fn applied_state(&mut self) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), Error> {
        let applied = self.applied.lock().expect("applied lock");
        Ok((applied.last, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Answer>, Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut answers = Vec::new();
        for entry in entries {
            let answer = match entry.payload {
                EntryPayload::Blank => Answer::Applied(Bytes::new()),
                // Prepared by the leader of another term than the one that appended it: what
                // `prepare` predicted may be void (see `Node::submit`). Every node skips it alike.
                EntryPayload::Normal(command) if command.term != entry.log_id.leader_id.term => Answer::Stale,
                EntryPayload::Normal(command) => {
                    if self.applier.is_barrier(&command.body) {
                        self.progress.persist().await.map_err(machine_error)?;
                    }
                    Answer::Applied(self.applier.apply(entry.log_id.index, command.body).await.map_err(machine_error)?)
                }
                EntryPayload::Membership(membership) => {
                    self.applied.lock().expect("applied lock").membership =
                        StoredMembership::new(Some(entry.log_id), membership);
                    Answer::Applied(Bytes::new())
                }
            };
            self.applied.lock().expect("applied lock").last = Some(entry.log_id);
            answers.push(answer);
        }
        Ok(answers)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Machine {
            applier: self.applier.clone(),
            applied: self.applied.clone(),
            dir: self.dir.clone(),
            progress: self.progress.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, Error> {
        Err(StorageIOError::write_snapshot(None, AnyError::error(NO_SNAPSHOTS)).into())
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<u64, BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), Error> {
        Err(StorageIOError::write_snapshot(None, AnyError::error(NO_SNAPSHOTS)).into())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, Error> {
        Ok(None)
    }
}
