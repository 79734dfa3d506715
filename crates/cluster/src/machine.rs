//! The state machine openraft applies committed entries to: the node's [`Applier`] (the engine,
//! in onehop), plus the record of how far it got.
//!
//! The applier keeps its own effects (onehop: the partitions, written without an fsync of their
//! own, since the Raft log already holds every entry durably on a majority). How far it got is
//! kept in `applied`, written only after [`Applier::sync`] made everything applied so far
//! durable: after a crash the node applies again from that point, so the `applied` file may lag
//! but never leads, and the applier must take an entry it already applied as a no-op.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};

use crate::snapshot::{self, Archive, Elections, Pending, Received, SnapshotData, SnapshotFile};
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
    /// before its first [`Applier::prepare`]: whatever `prepare` predicted before is void, and
    /// what it prepares from now on is prepared in `term`.
    fn begin_term(&self, term: u64);

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

    /// Hard-links the files that hold this node's state, as of every command applied so far,
    /// into the empty directory `into`, and lists them: each one's path under the state's
    /// root, the link to read it from, and how many of its bytes belong to the snapshot. Called
    /// while no command is being applied. Files the applier keeps for itself (not replicated)
    /// are left out; [`crate::install_pending`] is told to keep them.
    fn snapshot_files(&self, _into: &Path) -> Result<Vec<SnapshotFile>, String> {
        Err("this applier takes no snapshots".into())
    }

    /// Restarts the node so that it installs the snapshot now pending ([`crate::install_pending`]
    /// runs before the applier opens its state again). Returns only if it could not, with why.
    fn restart(&self) -> String {
        "this applier cannot restart to install a snapshot".into()
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
    /// Whether this node takes snapshots (and so may purge its Raft log).
    snapshots: bool,
    /// Set once a received snapshot is pending install: nothing more is applied here before
    /// the node restarts to install it.
    restarting: Arc<std::sync::atomic::AtomicBool>,
    /// Off while a snapshot is received.
    elections: Elections,
}

/// The last entry applied, and the membership then.
pub(crate) type AppliedState = (Option<LogId<u64>>, StoredMembership<u64, BasicNode>);

/// Reads the progress record in `dir` (see [`AppliedState`]).
pub(crate) fn read_applied(dir: &Path) -> io::Result<AppliedState> {
    let applied: Applied = match crate::sys::fs::read(dir.join("applied")) {
        Ok(bytes) => postcard::from_bytes(&bytes).map_err(|error| {
            io::Error::new(io::ErrorKind::InvalidData, format!("{}/applied: {error}", dir.display()))
        })?,
        Err(error) if error.kind() == io::ErrorKind::NotFound => Applied::default(),
        Err(error) => return Err(error),
    };
    Ok((applied.last, applied.membership))
}

/// Writes the progress record in `dir`, durably (a snapshot's install).
pub(crate) fn record_applied(
    dir: &Path,
    last: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
) -> io::Result<()> {
    let bytes = postcard::to_allocvec(&Applied { last, membership }).map_err(io::Error::other)?;
    crate::raftlog::write_atomically(dir, "applied", &bytes)
}

type Error = StorageError<u64>;

fn machine_error(error: impl std::fmt::Display) -> Error {
    StorageIOError::write_state_machine(AnyError::error(error.to_string())).into()
}

impl<A: Applier> Machine<A> {
    /// Opens the state machine whose progress is kept in `dir/applied`.
    /// With `snapshots`, the node takes snapshots and sends and installs them.
    pub fn open(dir: impl Into<PathBuf>, applier: Arc<A>, snapshots: bool) -> io::Result<Machine<A>> {
        let dir = dir.into();
        crate::sys::create_dir_durably(&dir)?;
        let (last, membership) = read_applied(&dir)?;
        let applied = Arc::new(Mutex::new(Applied { last, membership }));
        let progress = Progress {
            applier: applier.clone(),
            applied: applied.clone(),
            dir: dir.clone(),
            persisted: Arc::new(tokio::sync::Mutex::new(None)),
            taken: Default::default(),
        };
        Ok(Machine {
            applier,
            applied,
            dir,
            progress,
            snapshots,
            restarting: Default::default(),
            elections: Default::default(),
        })
    }

    /// What turns this node's elections off while it receives a snapshot: give it the node's
    /// Raft once made.
    pub(crate) fn elections(&self) -> Elections {
        self.elections.clone()
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
    /// Whether this process took a snapshot on the schedule yet: until then, the snapshot
    /// openraft knows of is the state this node restarted from.
    taken: Arc<std::sync::atomic::AtomicBool>,
}

impl<A> Clone for Progress<A> {
    fn clone(&self) -> Self {
        Progress {
            applier: self.applier.clone(),
            applied: self.applied.clone(),
            dir: self.dir.clone(),
            persisted: self.persisted.clone(),
            taken: self.taken.clone(),
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

    /// Whether this process took a snapshot yet (see the field).
    pub fn snapshot_taken(&self) -> bool {
        self.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The index of the last command applied on this node.
    pub fn last_applied(&self) -> Option<u64> {
        self.applied.lock().expect("applied lock").last.map(|id| id.index)
    }
}

const NO_SNAPSHOTS: &str = "this node takes no snapshots and keeps the whole Raft log";

fn snapshot_error(error: impl std::fmt::Display) -> Error {
    StorageIOError::write_snapshot(None, AnyError::error(error.to_string())).into()
}

/// Builds a snapshot of the progress as it was when the builder was made: it makes
/// everything applied durable, so the Raft log up to that point may be purged. Nothing is
/// copied: the node's own state is the snapshot, and what is sent to another node is linked
/// when it is sent ([`RaftStateMachine::get_current_snapshot`]).
pub struct Builder<A> {
    progress: Progress<A>,
    captured: Applied,
}

impl<A: Applier> RaftSnapshotBuilder<TypeConfig> for Builder<A> {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, Error> {
        self.progress.persist().await.map_err(snapshot_error)?;
        let last = self.captured.last.ok_or_else(|| snapshot_error("nothing was applied yet"))?;
        tracing::info!(index = last.index, "snapshot taken: the Raft log before it may be purged");
        self.progress.taken.store(true, std::sync::atomic::Ordering::Relaxed);
        let meta = SnapshotMeta {
            last_log_id: Some(last),
            last_membership: self.captured.membership.clone(),
            snapshot_id: format!("{}-{}-taken", last.leader_id.term, last.index),
        };
        // Only the metadata of a snapshot built is kept; what is sent is linked when sent.
        let data = Archive::new(Vec::new(), None).map_err(snapshot_error)?;
        Ok(Snapshot { meta, snapshot: Box::new(SnapshotData::Sending(data)) })
    }
}

impl<A> Machine<A> {
    /// Never returns once a snapshot's install is pending: the state here is about to be
    /// replaced, so nothing may be applied over it, nor another snapshot made pending in its
    /// place (its files and its index must stay one snapshot's), and the node restarts in a
    /// moment.
    async fn hold_while_restarting(&self) {
        if self.restarting.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

impl<A: Applier> RaftStateMachine<TypeConfig> for Machine<A> {
    type SnapshotBuilder = Builder<A>;

    async fn applied_state(&mut self) -> Result<AppliedState, Error> {
        let applied = self.applied.lock().expect("applied lock");
        Ok((applied.last, applied.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Answer>, Error>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        self.hold_while_restarting().await;
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
        Builder { progress: self.progress.clone(), captured: self.applied.lock().expect("applied lock").clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotData>, Error> {
        self.hold_while_restarting().await;
        if !self.snapshots {
            return Err(snapshot_error(NO_SNAPSHOTS));
        }
        let path = snapshot::receiving_file(&self.dir).map_err(snapshot_error)?;
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|error| snapshot_error(format!("{}: {error}", path.display())))?;
        tracing::info!(file = %path.display(), "receiving a snapshot from the leader");
        let paused = Some(self.elections.pause());
        Ok(Box::new(SnapshotData::Receiving(Received { file, path, paused })))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        data: Box<SnapshotData>,
    ) -> Result<(), Error> {
        use tokio::io::AsyncWriteExt;
        self.hold_while_restarting().await;
        let SnapshotData::Receiving(mut received) = *data else {
            return Err(snapshot_error("asked to install a snapshot that was not received"));
        };
        received.file.flush().await.map_err(snapshot_error)?;
        let bytes = received.file.metadata().await.map_err(snapshot_error)?.len();
        // Nor does it stand for election before its restart: its state is about to change.
        if let Some(paused) = received.paused.take() {
            paused.keep_off();
        }
        let pending = Pending { last: meta.last_log_id, membership: meta.last_membership.clone() };
        let dir = self.dir.clone();
        // `received` goes along: once renamed, its drop finds nothing to remove.
        tokio::task::spawn_blocking(move || snapshot::make_pending(&dir, &received.path, &pending))
            .await
            .map_err(snapshot_error)?
            .map_err(snapshot_error)?;
        tracing::warn!(
            index = meta.last_log_id.map_or(0, |last| last.index),
            bytes,
            "received a snapshot from the leader, since this node lacks entries its log no longer holds: \
             restarting to install it"
        );
        // openraft is told the install is done, so the leader hears it and goes on with the
        // entries after the snapshot (this node's Raft log takes them); nothing more is
        // applied here, and the node restarts once the answer is on its way.
        self.restarting.store(true, std::sync::atomic::Ordering::SeqCst);
        let applier = self.applier.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let reason = applier.restart();
            tracing::error!(%reason, "cannot restart to install the snapshot: stopping; the next start installs it");
            std::process::exit(1);
        });
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, Error> {
        if !self.snapshots {
            return Ok(None);
        }
        let applied = self.applied.lock().expect("applied lock").clone();
        let Some(last) = applied.last else { return Ok(None) };
        // What is sent must never be ahead of what this node would find after a crash.
        self.progress.persist().await.map_err(snapshot_error)?;
        let links = snapshot::links_dir(&self.dir).map_err(snapshot_error)?;
        let files = match self.applier.snapshot_files(&links) {
            Ok(files) => files,
            Err(error) => {
                let _ = std::fs::remove_dir_all(&links);
                return Err(snapshot_error(error));
            }
        };
        let count = files.len();
        let archive = Archive::new(files, Some(links)).map_err(snapshot_error)?;
        tracing::debug!(index = last.index, files = count, bytes = archive.len(), "snapshot ready to send");
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let meta = SnapshotMeta {
            last_log_id: Some(last),
            last_membership: applied.membership,
            snapshot_id: format!("{}-{}-{nanos}", last.leader_id.term, last.index),
        };
        Ok(Some(Snapshot { meta, snapshot: Box::new(SnapshotData::Sending(archive)) }))
    }
}
