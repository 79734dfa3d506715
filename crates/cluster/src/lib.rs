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
mod net;
pub mod raftlog;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, Config, Raft, RaftMetrics, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use machine::{Applier, Machine, Progress};
pub use net::FRAME_BYTES_MAX;
pub use raftlog::{LogStore, OpenLogError};

openraft::declare_raft_types!(
    /// onehop's Raft types: commands and answers are bytes the applier understands.
    pub TypeConfig:
        D = Bytes,
        R = Bytes,
);

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
    /// The command may or may not have been committed: the answer was lost on the way.
    #[error("outcome unknown: {0}")]
    Unknown(String),
    /// This node is stopping.
    #[error("the node is stopping")]
    Stopped,
}

/// Proposes `command` on this node, which must be the leader.
pub(crate) async fn propose_here(raft: &Raft<TypeConfig>, command: Bytes) -> Result<Bytes, ProposeError> {
    match raft.client_write(command).await {
        Ok(response) => Ok(response.data),
        // openraft answers so before appending, or once the entry was cut from the log by a
        // newer leader: either way it was never committed.
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
            Err(ProposeError::NotLeader { leader: forward.leader_id })
        }
        Err(RaftError::APIError(error)) => Err(ProposeError::Unknown(error.to_string())),
        Err(RaftError::Fatal(_)) => Err(ProposeError::Stopped),
    }
}

/// How a node runs.
#[derive(Clone, Debug)]
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
}

/// One node of a cluster.
pub struct Node<A: Applier> {
    id: u64,
    raft: Raft<TypeConfig>,
    forwarder: net::Forwarder,
    progress: Progress<A>,
    propose_timeout: Duration,
    tasks: Vec<JoinHandle<()>>,
}

impl<A: Applier> Node<A> {
    /// Opens this node's Raft log and state machine in `options.dir` and starts serving the
    /// other nodes on `options.address`. A new node waits for [`Node::bootstrap`] (the first
    /// start of a cluster) or to be added by a running cluster's leader.
    pub async fn start(options: NodeOptions, applier: Arc<A>) -> Result<Node<A>, StartError> {
        let log = LogStore::open(options.dir.join("raft"))?;
        let machine = Machine::open(&options.dir, applier).map_err(StartError::Machine)?;
        let progress = machine.progress();
        let config = Config {
            cluster_name: "onehop".into(),
            heartbeat_interval: options.heartbeat.as_millis() as u64,
            election_timeout_min: options.election_timeout.0.as_millis() as u64,
            election_timeout_max: options.election_timeout.1.as_millis() as u64,
            // The whole log is kept: a node that was away catches up from it (docs/cluster.md).
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: u64::MAX,
            max_payload_entries: 4096,
            ..Config::default()
        };
        let config = Arc::new(config.validate().map_err(|error| StartError::Raft(error.to_string()))?);
        let listener = TcpListener::bind(options.address)
            .await
            .map_err(|source| StartError::Listen { address: options.address, source })?;
        let raft = Raft::new(options.id, config, net::Network, log, machine)
            .await
            .map_err(|error| StartError::Raft(error.to_string()))?;
        let serving = tokio::spawn(net::serve(listener, raft.clone()));
        let persisting = progress.spawn(Duration::from_millis(500));
        Ok(Node {
            id: options.id,
            raft,
            forwarder: net::Forwarder::default(),
            progress,
            propose_timeout: options.propose_timeout,
            tasks: vec![serving, persisting],
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Makes `members` (this node among them) a new cluster. Once any node of a cluster has
    /// been bootstrapped, bootstrapping again (on it or another member) changes nothing.
    pub async fn bootstrap(&self, members: &BTreeMap<u64, SocketAddr>) -> Result<(), String> {
        let nodes: BTreeMap<u64, BasicNode> =
            members.iter().map(|(id, address)| (*id, BasicNode::new(address.to_string()))).collect();
        match self.raft.initialize(nodes).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(error) => Err(error.to_string()),
        }
    }

    /// Commits `command` and returns the applier's answer from this node, once this node has
    /// applied it. Forwarded to the leader when this node is not the leader; waits for an
    /// election when there is no leader, up to the proposal timeout.
    pub async fn propose(&self, command: Bytes) -> Result<Bytes, ProposeError> {
        let deadline = Instant::now() + self.propose_timeout;
        let mut metrics = self.raft.metrics();
        loop {
            let leader = {
                let now = metrics.borrow_and_update();
                now.current_leader.and_then(|leader| {
                    let address = now.membership_config.membership().get_node(&leader)?.addr.parse().ok()?;
                    Some((leader, address))
                })
            };
            let outcome = match leader {
                Some((leader, _)) if leader == self.id => propose_here(&self.raft, command.clone()).await,
                Some((_, address)) => self.forwarded(address, command.clone()).await,
                None => Err(ProposeError::NoLeader),
            };
            match outcome {
                Err(ProposeError::NotLeader { .. } | ProposeError::NoLeader | ProposeError::Unreachable(_)) => {
                    // Nothing was written: wait for news of a leader and try again.
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(outcome.unwrap_err());
                    }
                    let _ = tokio::time::timeout(left.min(Duration::from_millis(100)), metrics.changed()).await;
                }
                outcome => return outcome,
            }
        }
    }

    async fn forwarded(&self, leader: SocketAddr, command: Bytes) -> Result<Bytes, ProposeError> {
        let answer = self.forwarder.propose(leader, command).await?;
        Ok(answer)
    }

    /// The leader this node knows of.
    pub fn leader(&self) -> Option<u64> {
        self.raft.metrics().borrow().current_leader
    }

    /// Whether this node is the leader.
    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().state == ServerState::Leader
    }

    /// Raft's view of this node: state, term, leader, log and applied indexes, membership.
    pub fn metrics(&self) -> watch::Receiver<RaftMetrics<u64, BasicNode>> {
        self.raft.metrics()
    }

    /// The voting members and their addresses.
    pub fn members(&self) -> BTreeMap<u64, String> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.nodes().map(|(id, node)| (*id, node.addr.clone())).collect()
    }

    /// Adds the node `id` at `address`: it first copies the log as a learner, then becomes a
    /// voting member. Asked of the leader.
    pub async fn add_node(&self, id: u64, address: SocketAddr) -> Result<(), String> {
        self.raft
            .add_learner(id, BasicNode::new(address.to_string()), true)
            .await
            .map_err(|error| error.to_string())?;
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|error| error.to_string())?;
        Ok(())
    }

    /// Removes the node `id` from the voting members and from the cluster. Asked of the leader.
    pub async fn remove_node(&self, id: u64) -> Result<(), String> {
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
            .await
            .map_err(|error| error.to_string())?;
        Ok(())
    }

    /// The index of the last command this node applied.
    pub fn last_applied(&self) -> Option<u64> {
        self.progress.last_applied()
    }

    /// Stops Raft, the listener and the progress task, and records how far this node applied.
    pub async fn shutdown(self) -> Result<(), String> {
        let stopped = self.raft.shutdown().await.map_err(|error| error.to_string());
        for task in &self.tasks {
            task.abort();
        }
        self.progress.persist().await?;
        stopped
    }
}
