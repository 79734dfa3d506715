//! onehop's replication: a Raft log of commands shared by the nodes of a cluster.
//!
//! Consensus is openraft's (pinned; docs/cluster.md says why). This crate gives it what it
//! leaves to its user, and a small API over it:
//!
//! - `raftlog`: the Raft log on disk, fsynced before openraft hears an append is done.
//! - `machine`: the state machine, an [`Applier`] (in onehop, the engine) plus the durable
//!   record of how far it applied.
//! - `net`: the nodes' own TCP protocol for Raft's RPCs and forwarded proposals.
//!
//! A [`Node`] proposes commands (opaque bytes) and gets back its applier's answer once the
//! command is committed (on a majority of the nodes' disks) and applied here. A node that is
//! not the leader forwards the command to the leader.

mod machine;
pub mod net;
pub mod raftlog;
mod snapshot;
mod sys;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{ChangeMembers, Config, Raft, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::sys::TcpListener;

pub use machine::{Applier, Machine, Progress};
pub use net::{ClusterTls, FRAME_BYTES_MAX};
pub use openraft::{BasicNode, RaftMetrics, ServerState};
pub use raftlog::{LogStore, OpenLogError};
pub use snapshot::{SnapshotData, SnapshotFile, install_pending, unpack as unpack_snapshot};

openraft::declare_raft_types!(
    /// onehop's Raft types: commands and answers are bytes the applier understands.
    pub TypeConfig:
        D = Command,
        R = Answer,
        SnapshotData = SnapshotData,
);

/// A replicated command: what the applier prepared, and the term of the leader that prepared it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Command {
    pub term: u64,
    pub body: Bytes,
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "command of {} bytes prepared in term {}", self.body.len(), self.term)
    }
}

/// What applying an entry gave.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    /// The applier's answer.
    Applied(Bytes),
    /// The entry was prepared in another term than the one that committed it, and every node
    /// skipped it: nothing changed.
    Stale,
}

/// Why a proposal has no answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ProposeError {
    /// Asked of a node that is not the leader; nothing was written.
    #[error("not the leader (the leader is {leader:?})")]
    NotLeader { leader: Option<u64> },
    /// No leader was known within the proposal's deadline; nothing was written.
    #[error("no leader was elected in time: is a majority of the nodes running and reachable?")]
    NoLeader,
    /// The leader could not be reached; nothing was written.
    #[error("the leader is unreachable: {0}")]
    Unreachable(String),
    /// The leader that prepared it lost its term first; every node skipped it.
    #[error("the leader changed before the command was committed; nothing was applied")]
    Stale,
    /// The command may or may not have been committed: the answer was lost on the way.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// This node is stopping.
    #[error("the node is stopping")]
    Stopped,
    /// The leader refused a membership change (the reason says why); nothing changed.
    #[error("{0}")]
    Refused(String),
    /// This node leads but has not heard from a majority for `millis` ms (they are down or
    /// cut off): it writes nothing it could not commit; nothing was written.
    #[error("this node has not heard from a majority of the nodes for {millis} ms; nothing was written")]
    NoQuorum { millis: u64 },
}

/// A change of a cluster's voting members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MembershipChange {
    /// Add the node `id`, reached at `address`: it copies the log as a learner, then votes.
    Add { id: u64, address: String },
    /// Remove the node `id` from the voting members.
    Remove { id: u64 },
}

impl ProposeError {
    /// Whether nothing was applied, so submitting the request again is safe.
    pub fn nothing_applied(&self) -> bool {
        matches!(
            self,
            ProposeError::NotLeader { .. }
                | ProposeError::NoLeader
                | ProposeError::Unreachable(_)
                | ProposeError::Stale
                | ProposeError::NoQuorum { .. }
        )
    }
}

type Receiver = oneshot::Receiver<Result<Bytes, ProposeError>>;

/// The answer to a submitted request, on its way.
pub struct Pending {
    answer: Receiver,
}

impl Pending {
    fn answered(answer: Result<Bytes, ProposeError>) -> Pending {
        let (sender, receiver) = oneshot::channel();
        let _ = sender.send(answer);
        Pending { answer: receiver }
    }

    /// The answer.
    pub async fn answer(self) -> Result<Bytes, ProposeError> {
        self.answer.await.unwrap_or_else(|_| Err(ProposeError::Unknown("the node stopped before answering".into())))
    }
}

/// How a node runs.
#[derive(Clone)]
pub struct NodeOptions {
    /// This node's id: unique in the cluster, never reused for another node.
    pub id: u64,
    /// Where the Raft log (`raft/`) and the state machine's progress (`applied`) live.
    pub dir: PathBuf,
    /// The address other nodes reach this one at (it listens there).
    pub address: SocketAddr,
    /// A leader sends a heartbeat this often.
    pub heartbeat: Duration,
    /// A follower that hears no leader for a random time between these starts an election.
    pub election_timeout: (Duration, Duration),
    /// How long a proposal waits for a leader before [`ProposeError::NoLeader`].
    pub propose_timeout: Duration,
    /// TLS with certificates on both sides between the nodes; `None`: plain TCP.
    pub tls: Option<ClusterTls>,
    /// Take a snapshot every this many entries, and purge the Raft log before it (keeping
    /// `log_kept` entries, from which a node not far behind catches up without a snapshot).
    /// `None`: no snapshots, the whole log is kept.
    pub snapshot_every: Option<u64>,
    pub log_kept: u64,
}

impl NodeOptions {
    pub fn new(id: u64, dir: impl Into<PathBuf>, address: SocketAddr) -> NodeOptions {
        NodeOptions {
            id,
            dir: dir.into(),
            address,
            heartbeat: Duration::from_millis(100),
            election_timeout: (Duration::from_millis(500), Duration::from_millis(1000)),
            propose_timeout: Duration::from_secs(10),
            tls: None,
            snapshot_every: None,
            log_kept: 0,
        }
    }
}

/// Why a node did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the Raft log: {0}")]
    Log(#[from] OpenLogError),
    #[error("the state machine's progress: {0}")]
    Machine(std::io::Error),
    #[error("cannot listen on {address}: {source}")]
    Listen { address: SocketAddr, source: std::io::Error },
    #[error("openraft: {0}")]
    Raft(String),
    #[error("a snapshot's install is pending in {0}: install_pending must run before the applier opens")]
    InstallPending(PathBuf),
}

/// What a node's tasks share.
pub(crate) struct Inner<A: Applier> {
    id: u64,
    raft: Raft<TypeConfig>,
    applier: Arc<A>,
    forwarder: net::Forwarder,
    /// TLS for the connections this node accepts.
    tls: Option<ClusterTls>,
    /// Taken to prepare and queue a command, so commands enter the log in the order they were
    /// prepared. Holds the term this node last began as leader.
    sequencer: tokio::sync::Mutex<Option<u64>>,
    propose_timeout: Duration,
    /// What this node says of itself to the others ([`Node::set_info`]).
    pub(crate) info: std::sync::RwLock<Bytes>,
    /// What each member last said of itself, and when this node heard it.
    directory: std::sync::Mutex<BTreeMap<u64, (Bytes, Instant)>>,
    /// The term this node leads in, once it applied every entry before its own (see
    /// [`Node::settled`]); `None` while it does not lead.
    settled: watch::Sender<Option<u64>>,
    /// When a leader's AppendEntries last arrived: what this node answers another's pre-vote
    /// with ([`Inner::leader_recent`]).
    leader_contact: std::sync::Mutex<Option<Instant>>,
    /// The shortest and longest election timeouts.
    election_timeout: (Duration, Duration),
    /// Elections, switched off while this node could not win one (see `gate_elections`).
    elections: snapshot::Elections,
}

/// How long a leader may go without a majority's acknowledgement before it refuses writes.
/// What openraft measures is the send time of the newest request a majority acknowledged, so
/// followers that take long to make a backlog durable (a busy disk, a starved CPU) look as far
/// behind as their backlog: the limit is well past the longest election timeout, so that a slow
/// majority is not taken for a lost one. Writes a lost majority leaves queued meanwhile are
/// answered at their deadline.
fn quorum_lost_after(election_timeout: (Duration, Duration)) -> Duration {
    election_timeout.1 * 5
}

/// The least time a command queued on the leader has to be committed and answered, however
/// late in its proposal timeout it was queued (after an election, say).
const ANSWER_TIME_MIN: Duration = Duration::from_secs(2);

/// How often a member is asked again what it says of itself.
const INFO_REFRESH: Duration = Duration::from_secs(5);

impl<A: Applier> Inner<A> {
    /// Prepares `request` and queues its command, on this node as leader. Returns once it is
    /// queued (behind every command prepared before it); the answer comes through the result.
    pub(crate) async fn submit_here(&self, request: Bytes) -> Result<Receiver, ProposeError> {
        let mut began = self.sequencer.lock().await;
        let metrics = self.raft.metrics().borrow().clone();
        if metrics.state != ServerState::Leader {
            return Err(ProposeError::NotLeader { leader: metrics.current_leader });
        }
        // Check quorum: a leader cut off from the others answers at once, rather than queue a
        // write no majority can commit (and that might commit much later, once the client
        // gave up and retried).
        if metrics.membership_config.membership().voter_ids().count() > 1 {
            let limit = quorum_lost_after(self.election_timeout).as_millis() as u64;
            match metrics.millis_since_quorum_ack {
                Some(millis) if millis <= limit => {}
                Some(millis) => return Err(ProposeError::NoQuorum { millis }),
                // Not acknowledged by a majority yet in this term: its first heartbeats are out.
                None => return Err(ProposeError::NoQuorum { millis: 0 }),
            }
        }
        let term = metrics.current_term;
        if *began != Some(term) {
            // Predictions of an earlier term are void; this term's start from the state every
            // earlier entry left, so wait for this node to apply them all.
            self.wait_applied_to_end(term).await?;
            self.applier.begin_term(term);
            *began = Some(term);
        }
        let body = match self.applier.prepare(request) {
            Ok(body) => body,
            Err(refusal) => return Ok(Pending::answered(Ok(refusal)).answer),
        };
        let written = self.raft.client_write_ff(Command { term, body }).await.map_err(|_| ProposeError::Stopped)?;
        drop(began);
        let (sender, receiver) = oneshot::channel();
        tokio::spawn(async move {
            let answer = match written.await {
                Ok(Ok(response)) => match response.data {
                    Answer::Applied(answer) => Ok(answer),
                    Answer::Stale => Err(ProposeError::Stale),
                },
                // openraft answers so before appending, or once the entry was cut from the log
                // by a newer leader: either way it was never committed.
                Ok(Err(ClientWriteError::ForwardToLeader(forward))) => {
                    Err(ProposeError::NotLeader { leader: forward.leader_id })
                }
                Ok(Err(error)) => Err(ProposeError::Unknown(error.to_string())),
                Err(_) => Err(ProposeError::Unknown("the node stopped before the command was applied".into())),
            };
            let _ = sender.send(answer);
        });
        Ok(receiver)
    }

    /// Follows this node's state: as it becomes leader, begins its term (as the first submit
    /// in it would: once every entry in its log is applied, with no command prepared
    /// meanwhile) and says so in `settled`; as it stops leading, says that. A leader restarted
    /// by openraft in the term it led before a crash has its own entries of that term still
    /// to apply, so "its own entry is applied" alone would not do.
    #[cfg_attr(feature = "sim", allow(dead_code))]
    async fn settle(self: Arc<Self>) {
        let mut metrics = self.raft.metrics();
        loop {
            let (leading, term) = {
                let now = metrics.borrow_and_update();
                (now.state == ServerState::Leader, now.current_term)
            };
            if !leading {
                self.settled.send_if_modified(|settled| settled.take().is_some());
            } else if *self.settled.borrow() != Some(term) {
                let mut began = self.sequencer.lock().await;
                let ready = *began == Some(term) || self.wait_applied_to_end(term).await.is_ok();
                if ready {
                    if *began != Some(term) {
                        self.applier.begin_term(term);
                        *began = Some(term);
                    }
                    self.settled.send_replace(Some(term));
                } else {
                    drop(began);
                    // Deposed, or the log did not drain in time: look again shortly.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
            if metrics.changed().await.is_err() {
                self.settled.send_replace(None);
                return;
            }
        }
    }

    async fn wait_applied_to_end(&self, term: u64) -> Result<(), ProposeError> {
        let mut metrics = self.raft.metrics();
        let deadline = Instant::now() + self.propose_timeout;
        loop {
            {
                let now = metrics.borrow_and_update();
                if now.state != ServerState::Leader || now.current_term != term {
                    return Err(ProposeError::NotLeader { leader: now.current_leader });
                }
                let applied = now.last_applied.map(|id| id.index);
                if applied >= now.last_log_index {
                    return Ok(());
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, metrics.changed()).await.is_err() {
                return Err(ProposeError::NoLeader);
            }
        }
    }

    /// The answer `waiting` brings; or, should this node learn that another node than `leader`
    /// (the one it was submitted to) now leads, that the outcome is unknown: that leader may
    /// have appended it before it lost its term, or be paused with it, and the client need not
    /// wait for that to resolve.
    async fn answer_or_new_leader(&self, waiting: &mut Receiver, leader: u64) -> Result<Bytes, ProposeError> {
        let mut metrics = self.raft.metrics();
        loop {
            if metrics.borrow_and_update().current_leader.is_some_and(|now| now != leader) {
                // An answer that is already there still wins.
                if let Ok(answer) = waiting.try_recv() {
                    return answer;
                }
                return Err(ProposeError::Unknown(
                    "the cluster elected a new leader while the write was out; it may or may not have been committed"
                        .into(),
                ));
            }
            tokio::select! {
                answer = &mut *waiting => {
                    return answer.unwrap_or_else(|_| Err(ProposeError::Unknown("the node stopped before answering".into())));
                }
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return Err(ProposeError::Stopped);
                    }
                }
            }
        }
    }

    /// Makes `change`, on this node as leader.
    pub(crate) async fn change_membership_here(&self, change: MembershipChange) -> Result<(), ProposeError> {
        let metrics = self.raft.metrics().borrow().clone();
        if metrics.state != ServerState::Leader {
            return Err(ProposeError::NotLeader { leader: metrics.current_leader });
        }
        let refused = |error: String| ProposeError::Refused(error);
        match change {
            MembershipChange::Add { id, address } => {
                address
                    .parse::<SocketAddr>()
                    .map_err(|_| refused(format!("{address:?} is not an address (IP:PORT)")))?;
                if metrics.membership_config.membership().voter_ids().any(|voter| voter == id) {
                    return Err(refused(format!("node {id} is already a member")));
                }
                self.raft.add_learner(id, BasicNode::new(address), true).await.map_err(|e| refused(e.to_string()))?;
                self.raft
                    .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
            }
            MembershipChange::Remove { id } => {
                let voters: BTreeSet<u64> = metrics.membership_config.membership().voter_ids().collect();
                if !voters.contains(&id) {
                    return Err(refused(format!("node {id} is not a member")));
                }
                if voters.len() == 1 {
                    return Err(refused("the last member cannot be removed".into()));
                }
                self.raft
                    .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                    .await
                    .map_err(|e| refused(e.to_string()))?;
            }
        }
        Ok(())
    }

    /// Notes that a leader's AppendEntries arrived.
    pub(crate) fn heard_from_leader(&self) {
        *self.leader_contact.lock().expect("leader contact lock") = Some(Instant::now());
    }

    /// Whether this node knows a live leader: it leads with a majority's recent acknowledgement,
    /// or a leader's AppendEntries came within the shortest election timeout. A node that knows
    /// one would not vote for another, so it answers a pre-vote "no" (Raft's pre-vote, §9.6 of
    /// Ongaro's thesis).
    pub(crate) fn leader_recent(&self) -> bool {
        let metrics = self.raft.metrics().borrow().clone();
        let within = self.election_timeout.0;
        if metrics.state == ServerState::Leader {
            return metrics.millis_since_quorum_ack.is_some_and(|millis| millis < within.as_millis() as u64);
        }
        self.leader_contact.lock().expect("leader contact lock").is_some_and(|at| at.elapsed() < within)
    }

    /// Pre-vote, as a switch on openraft's elections (openraft 0.9 has no pre-vote): a node
    /// that has lost its leader asks the other voters whether they have too, and stands for
    /// election only while a majority, itself included, could elect it. A node cut off from
    /// the others (a partition, the others stopped) then keeps its term instead of raising it
    /// with every timeout, and does not depose a healthy leader when it comes back.
    #[cfg_attr(feature = "sim", allow(dead_code))]
    async fn gate_elections(self: Arc<Self>) {
        let period = self.election_timeout.0 / 2;
        loop {
            tokio::time::sleep(period).await;
            let (leading, voters) = {
                let metrics = self.raft.metrics();
                let now = metrics.borrow();
                let membership = now.membership_config.membership();
                let voters: Vec<(u64, Option<SocketAddr>)> = membership
                    .voter_ids()
                    .filter(|id| *id != self.id)
                    .map(|id| (id, membership.get_node(&id).and_then(|node| node.addr.parse().ok())))
                    .collect();
                (now.state == ServerState::Leader, voters)
            };
            if leading || voters.is_empty() || self.leader_recent() {
                self.elections.set_cut_off(false);
                continue;
            }
            let mut asking = tokio::task::JoinSet::new();
            for (_, address) in voters.iter().copied() {
                let Some(address) = address else { continue };
                let node = self.clone();
                asking.spawn(async move {
                    let asked =
                        async { node.forwarder.send(address, net::Request::PreVote).await.ok()?.await.ok()?.ok() };
                    // The answer is one byte: 1 when that node knows a live leader.
                    matches!(tokio::time::timeout(period, asked).await, Ok(Some(answer)) if answer.as_ref() == [0])
                });
            }
            let mut grants = 1;
            while let Some(granted) = asking.join_next().await {
                grants += usize::from(granted.unwrap_or(false));
            }
            let members = voters.len() + 1;
            let majority = members / 2 + 1;
            self.elections.set_cut_off(grants < majority);
        }
    }

    /// Keeps [`Inner::directory`] current: asks every member that said nothing yet, or
    /// nothing for a while, what it says of itself; forgets those no longer members.
    async fn gather_info(self: Arc<Self>) {
        let mut metrics = self.raft.metrics();
        loop {
            let members: Vec<(u64, String)> = {
                let now = metrics.borrow_and_update();
                let membership = now.membership_config.membership();
                membership.nodes().map(|(id, node)| (*id, node.addr.clone())).collect()
            };
            let own = self.info.read().expect("info lock").clone();
            let due: Vec<(u64, SocketAddr)> = {
                let mut directory = self.directory.lock().expect("directory lock");
                directory.retain(|id, _| members.iter().any(|(member, _)| member == id));
                directory.insert(self.id, (own, Instant::now()));
                members
                    .iter()
                    .filter(|(id, _)| directory.get(id).is_none_or(|(_, heard)| heard.elapsed() >= INFO_REFRESH))
                    .filter_map(|(id, address)| Some((*id, address.parse().ok()?)))
                    .collect()
            };
            for (id, address) in due {
                let asked = async {
                    let answer = self.forwarder.send(address, net::Request::Info).await.ok()?;
                    answer.await.ok()?.ok()
                };
                if let Ok(Some(info)) = tokio::time::timeout(Duration::from_secs(1), asked).await {
                    self.directory.lock().expect("directory lock").insert(id, (info, Instant::now()));
                }
            }
            // Again in a second, or at once when the members or the leader change.
            let _ = tokio::time::timeout(Duration::from_secs(1), metrics.changed()).await;
        }
    }

    /// Takes what `member` says of itself into the directory, if it is a member.
    pub(crate) fn heard(&self, member: u64, info: Bytes) {
        let known = self.raft.metrics().borrow().membership_config.membership().get_node(&member).is_some();
        if known && member != self.id {
            self.directory.lock().expect("directory lock").insert(member, (info, Instant::now()));
        }
    }

    /// The leader this node knows of, with its address.
    fn leader(&self) -> Option<(u64, SocketAddr)> {
        Self::leader_in(&self.raft.metrics().borrow())
    }

    fn leader_in(now: &RaftMetrics<u64, BasicNode>) -> Option<(u64, SocketAddr)> {
        let leader = now.current_leader?;
        let address = now.membership_config.membership().get_node(&leader)?.addr.parse().ok()?;
        Some((leader, address))
    }

    /// Submits `request` to the leader, wherever it is, retrying while nothing was written.
    /// Returns where its answer comes, and the leader it was submitted to.
    async fn submit(&self, request: Bytes, deadline: Instant) -> Result<(Receiver, u64), ProposeError> {
        let mut metrics = self.raft.metrics();
        loop {
            let leader = Self::leader_in(&metrics.borrow_and_update());
            let submitted_to = leader.map_or(0, |(id, _)| id);
            let outcome = match leader {
                Some((leader, _)) if leader == self.id => self.submit_here(request.clone()).await,
                Some((_, address)) => self.forwarder.send(address, net::Request::Propose(request.clone())).await,
                None => Err(ProposeError::NoLeader),
            };
            match outcome {
                Err(error) if error.nothing_applied() => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(error);
                    }
                    metrics.borrow_and_update();
                    let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), metrics.changed()).await;
                }
                outcome => return outcome.map(|receiver| (receiver, submitted_to)),
            }
        }
    }
}

/// One node of a cluster.
pub struct Node<A: Applier> {
    inner: Arc<Inner<A>>,
    progress: Progress<A>,
    tasks: Vec<JoinHandle<()>>,
}

impl<A: Applier> Node<A> {
    /// Opens this node's Raft log and state machine in `options.dir` and starts serving the
    /// other nodes on `options.address`. A new node waits for [`Node::bootstrap`] (the first
    /// start of a cluster) or to be added by a running cluster's leader.
    pub async fn start(options: NodeOptions, applier: Arc<A>) -> Result<Node<A>, StartError> {
        if snapshot::is_pending(&options.dir) {
            return Err(StartError::InstallPending(options.dir.clone()));
        }
        snapshot::remove_sending_leftovers(&options.dir).map_err(StartError::Machine)?;
        let log = LogStore::open(options.dir.join("raft"))?;
        let machine = Machine::open(&options.dir, applier.clone(), options.snapshot_every.is_some())
            .map_err(StartError::Machine)?;
        let elections = machine.elections();
        let progress = machine.progress();
        let config = Config {
            cluster_name: "onehop".into(),
            heartbeat_interval: options.heartbeat.as_millis() as u64,
            election_timeout_min: options.election_timeout.0.as_millis() as u64,
            election_timeout_max: options.election_timeout.1.as_millis() as u64,
            // A node that was away catches up from the log while the leader still holds what
            // it lacks, and from a snapshot after that (docs/cluster.md).
            snapshot_policy: options.snapshot_every.map_or(SnapshotPolicy::Never, SnapshotPolicy::LogsSinceLast),
            max_in_snapshot_log_to_keep: if options.snapshot_every.is_some() { options.log_kept } else { u64::MAX },
            // A chunk's answer waits for nothing but the write of the chunk; the last one's
            // never comes (the node restarts to install), and the leader then moves on.
            install_snapshot_timeout: 10_000,
            max_payload_entries: 4096,
            ..Config::default()
        };
        let config = Arc::new(config.validate().map_err(|error| StartError::Raft(error.to_string()))?);
        let listener = TcpListener::bind(options.address)
            .await
            .map_err(|source| StartError::Listen { address: options.address, source })?;
        let network = net::Network { tls: options.tls.clone() };
        let raft = Raft::new(options.id, config, network, log, machine)
            .await
            .map_err(|error| StartError::Raft(error.to_string()))?;
        elections.attach(raft.clone());
        let inner = Arc::new(Inner {
            id: options.id,
            raft,
            applier,
            forwarder: net::Forwarder::new(options.tls.clone()),
            tls: options.tls.clone(),
            sequencer: tokio::sync::Mutex::new(None),
            propose_timeout: options.propose_timeout,
            info: std::sync::RwLock::new(Bytes::new()),
            directory: Default::default(),
            settled: watch::channel(None).0,
            leader_contact: std::sync::Mutex::new(None),
            election_timeout: options.election_timeout,
            elections: elections.clone(),
        });
        let serving = tokio::spawn(net::serve(listener, inner.clone()));
        let persisting = progress.spawn(Duration::from_millis(500));
        let gathering = tokio::spawn(inner.clone().gather_info());
        // The simulation (feature `sim`) runs without `settle`: with it, a seed no longer
        // replays exactly when another simulation runs at the same time in the same process
        // (it does one after the other, and alone beside other processes' load), so something
        // shared within the process, not time; not found yet. There a leader begins its term
        // at its first submit, as it would without it.
        #[cfg(not(feature = "sim"))]
        let tasks = vec![
            serving,
            persisting,
            gathering,
            tokio::spawn(inner.clone().settle()),
            tokio::spawn(inner.clone().gate_elections()),
        ];
        #[cfg(feature = "sim")]
        let tasks = vec![serving, persisting, gathering];
        Ok(Node { inner, progress, tasks })
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Whether the snapshot openraft reports (its metrics' `snapshot`) is one this process took
    /// on the schedule; until it takes one, it is the state the node restarted from.
    pub fn snapshot_taken(&self) -> bool {
        self.progress.snapshot_taken()
    }

    /// Makes `members` (this node among them) a new cluster. Once any node of a cluster has
    /// been bootstrapped, bootstrapping again (on it or another member) changes nothing.
    ///
    /// A node with no log yet first waits, up to the longest election timeout, to hear from a
    /// leader: a member that starts after the others formed the cluster would otherwise stand
    /// for election in the term they formed it in, and openraft (without `single-term-leader`)
    /// lets that depose their leader. Measured: a second election about 1.5 s after every
    /// three-node start, and stalled writes meanwhile.
    pub async fn bootstrap(&self, members: &BTreeMap<u64, SocketAddr>) -> Result<(), String> {
        let nodes: BTreeMap<u64, BasicNode> =
            members.iter().map(|(id, address)| (*id, BasicNode::new(address.to_string()))).collect();
        let mut metrics = self.inner.raft.metrics();
        let formed = |now: &RaftMetrics<u64, BasicNode>| {
            now.current_leader.is_some() || now.membership_config.membership().voter_ids().next().is_some()
        };
        if !formed(&metrics.borrow()) {
            let wait = Duration::from_millis(self.inner.raft.config().election_timeout_max);
            let heard = tokio::time::timeout(wait, async {
                while !formed(&metrics.borrow_and_update()) {
                    if metrics.changed().await.is_err() {
                        return;
                    }
                }
            })
            .await;
            if heard.is_ok() && formed(&metrics.borrow()) {
                return Ok(());
            }
        }
        match self.inner.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Submits `request`: the leader (this node, or the one it is forwarded to) prepares it and
    /// queues its command. Returns once it is queued, so requests one caller submits one after
    /// another are committed in that order; the [`Pending`] resolves with the applier's answer
    /// from the leader once the command is committed and applied there. While nothing was
    /// written (no leader yet, a leader change) it is submitted again, up to the proposal
    /// timeout.
    pub async fn submit(&self, request: Bytes) -> Result<Pending, ProposeError> {
        let deadline = Instant::now() + self.inner.propose_timeout;
        let first = self.inner.submit(request.clone(), deadline).await?;
        let (sender, answer) = oneshot::channel();
        let inner = self.inner.clone();
        tokio::spawn(async move {
            let mut waiting = first;
            let answer = loop {
                // Answered within the proposal timeout, whatever happens: a leader that lost its
                // majority after queueing it never commits it (or only once the others are back,
                // long after the client gave up: hence "may have been committed").
                let answer_by = deadline.max(Instant::now() + ANSWER_TIME_MIN);
                let answer =
                    match tokio::time::timeout_at(answer_by, inner.answer_or_new_leader(&mut waiting.0, waiting.1))
                        .await
                    {
                        Ok(answer) => answer,
                        Err(_) => Err(ProposeError::Unknown(format!(
                            "not confirmed by a majority within {} s; it may still be committed if they come back",
                            inner.propose_timeout.as_secs()
                        ))),
                    };
                match answer {
                    // Skipped by every node, or never written: submitting again is safe.
                    Err(error) if error.nothing_applied() && Instant::now() < deadline => {
                        match inner.submit(request.clone(), deadline).await {
                            Ok(next) => waiting = next,
                            Err(error) => break Err(error),
                        }
                    }
                    answer => break answer,
                }
            };
            let _ = sender.send(answer);
        });
        Ok(Pending { answer })
    }

    /// Submits `request` and waits for its answer (see [`Node::submit`]).
    pub async fn propose(&self, request: Bytes) -> Result<Bytes, ProposeError> {
        self.submit(request).await?.answer().await
    }

    /// Sets what this node says of itself to the others (opaque to the cluster; onehop: its
    /// Kafka listeners' addresses), which their [`Node::directory`] shows.
    pub fn set_info(&self, info: Bytes) {
        *self.inner.info.write().expect("info lock") = info.clone();
        self.inner.directory.lock().expect("directory lock").insert(self.inner.id, (info, Instant::now()));
    }

    /// Tells every other member what this node says of itself ([`Node::set_info`]) and returns
    /// once each has it, or after a second for those that do not answer: call it before
    /// clients can learn of this node from the others, so none hears of an address it had
    /// before a restart (the others otherwise ask every few seconds).
    pub async fn announce(&self) {
        let info = self.inner.info.read().expect("info lock").clone();
        let members: Vec<SocketAddr> = {
            let metrics = self.inner.raft.metrics();
            let metrics = metrics.borrow();
            let membership = metrics.membership_config.membership();
            membership
                .nodes()
                .filter(|(id, _)| **id != self.inner.id)
                .filter_map(|(_, node)| node.addr.parse().ok())
                .collect()
        };
        let mut telling = tokio::task::JoinSet::new();
        for address in members {
            let request = net::Request::Announce { id: self.inner.id, info: info.clone() };
            let inner = self.inner.clone();
            telling.spawn(async move {
                let told = async { inner.forwarder.send(address, request).await.ok()?.await.ok() };
                let _ = tokio::time::timeout(Duration::from_secs(1), told).await;
            });
        }
        while telling.join_next().await.is_some() {}
    }

    /// What each member (this node among them) last said of itself, as far as this node has
    /// heard: a member that has not answered yet is missing.
    pub fn directory(&self) -> BTreeMap<u64, Bytes> {
        self.inner.directory.lock().expect("directory lock").iter().map(|(id, (info, _))| (*id, info.clone())).collect()
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        self.inner.raft.metrics().borrow().current_leader
    }

    /// The term this node leads in, once it has applied every entry of its log from before
    /// it began leading (so all that earlier leaders committed): what a leader's own work
    /// (onehop's transforms, Kafka's group coordinator) waits for. `None` while it does not
    /// lead.
    pub fn settled(&self) -> watch::Receiver<Option<u64>> {
        self.inner.settled.subscribe()
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        self.inner.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Raft's view of this node: state, term, leader, log and applied indexes, membership.
    pub fn metrics(&self) -> watch::Receiver<RaftMetrics<u64, BasicNode>> {
        self.inner.raft.metrics()
    }

    /// The voting members and their addresses.
    pub fn members(&self) -> BTreeMap<u64, String> {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.voter_ids().filter_map(|id| Some((id, membership.get_node(&id)?.addr.clone()))).collect()
    }

    /// Makes `change` through the leader, wherever it is; returns once the new membership is
    /// committed. Adding a node waits until it has copied the log.
    pub async fn change_membership(&self, change: MembershipChange) -> Result<(), ProposeError> {
        let deadline = Instant::now() + self.inner.propose_timeout;
        let mut metrics = self.inner.raft.metrics();
        loop {
            metrics.borrow_and_update();
            let outcome = match self.inner.leader() {
                Some((leader, _)) if leader == self.inner.id => self.inner.change_membership_here(change.clone()).await,
                Some((_, address)) => {
                    match self.inner.forwarder.send(address, net::Request::Membership(change.clone())).await {
                        Ok(answer) => answer
                            .await
                            .unwrap_or_else(|_| Err(ProposeError::Unknown("the leader did not answer".into())))
                            .map(|_| ()),
                        Err(error) => Err(error),
                    }
                }
                None => Err(ProposeError::NoLeader),
            };
            match outcome {
                Err(error) if error.nothing_applied() && Instant::now() < deadline => {
                    let _ = tokio::time::timeout(Duration::from_millis(100), metrics.changed()).await;
                }
                outcome => return outcome,
            }
        }
    }

    /// Adds the node `id` at `address` (see [`Node::change_membership`]).
    pub async fn add_node(&self, id: u64, address: SocketAddr) -> Result<(), ProposeError> {
        self.change_membership(MembershipChange::Add { id, address: address.to_string() }).await
    }

    /// Removes the node `id` from the voting members (see [`Node::change_membership`]).
    pub async fn remove_node(&self, id: u64) -> Result<(), ProposeError> {
        self.change_membership(MembershipChange::Remove { id }).await
    }

    /// The index of the last command this node applied.
    pub fn last_applied(&self) -> Option<u64> {
        self.progress.last_applied()
    }

    /// Stops Raft, the listener and the progress task, and records how far this node applied.
    pub async fn shutdown(&self) -> Result<(), String> {
        let stopped = self.inner.raft.shutdown().await.map_err(|error| error.to_string());
        for task in &self.tasks {
            task.abort();
        }
        self.progress.persist().await?;
        stopped
    }
}
