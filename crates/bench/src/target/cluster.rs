//! The `onehop-cluster` target: three `onehop serve` nodes as a cluster (docs/cluster.md), as
//! study 1 runs one: publishers in turn on every node, subscribers on a follower. A write is
//! answered once a majority of the nodes' Raft logs hold it fdatasynced; a follower forwards
//! it to the leader (two of three writes), and every node applies it when the commit reaches
//! it, so the subscriber is served from the follower's copy of the log.

use std::net::TcpListener;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;
use tokio::runtime::Handle;

use super::{Session, Target, TargetOptions};
use crate::client::{self, Endpoints};
use crate::plan::Plan;
use crate::recorder::Recorder;
use crate::server::ServerProcess;

/// Nodes of the cluster this target starts.
pub const NODES: usize = 3;

pub struct ClusterTarget {
    /// The nodes, stopped on drop; `follower` indexes the one the clients use.
    nodes: Vec<ServerProcess>,
    follower: usize,
    leader: u64,
}

/// `count` distinct free ports: every listener is held until all are chosen, so the system
/// cannot give one port twice.
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let listeners: Vec<TcpListener> =
        (0..count).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    Ok(listeners
        .iter()
        .map(|listener| listener.local_addr().map(|address| address.port()))
        .collect::<std::io::Result<_>>()?)
}

impl ClusterTarget {
    pub fn start(options: &TargetOptions) -> anyhow::Result<ClusterTarget> {
        if options.url.is_some() || options.mqtt_address.is_some() {
            bail!("onehop-cluster starts a cluster of its own: it cannot be used with --url");
        }
        let (nodes, leader) = start_nodes(&options.exe, &options.dir, NODES)?;
        // The clients go to a follower: its writes are forwarded, as most writes in a cluster are.
        let follower = (0..NODES).find(|index| *index as u64 + 1 != leader).expect("three nodes have a follower");
        Ok(ClusterTarget { nodes, follower, leader })
    }
}

/// Starts `count` `onehop serve` nodes of `exe` as one new cluster, each on its own data
/// directory under `dir` and free loopback ports, and waits until they agree on a leader:
/// the nodes (stopped on drop) and the leader's node id (node `i` of the vector has id
/// `i + 1`).
pub fn start_nodes(exe: &Path, dir: &Path, count: usize) -> anyhow::Result<(Vec<ServerProcess>, u64)> {
    let ports = free_ports(count)?;
    let peers: Vec<String> = ports.iter().enumerate().map(|(i, port)| format!("{}=127.0.0.1:{port}", i + 1)).collect();
    let peers = peers.join(",");
    let mut nodes = Vec::with_capacity(count);
    for (index, port) in ports.iter().enumerate() {
        let (id, address) = ((index + 1).to_string(), format!("127.0.0.1:{port}"));
        let args = ["--node-id", &id, "--cluster-addr", &address, "--peers", &peers];
        nodes
            .push(ServerProcess::start(exe, dir, &args).with_context(|| format!("starting node {id} of the cluster"))?);
    }
    let leader = wait_for_leader(&nodes)?;
    Ok((nodes, leader))
}

/// The leader the nodes agree on, once one is elected (each node's `GET /cluster`).
pub fn wait_for_leader(nodes: &[ServerProcess]) -> anyhow::Result<u64> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let deadline = Instant::now() + Duration::from_secs(30);
    runtime.block_on(async {
        let http = client::http::client()?;
        loop {
            let mut leaders = Vec::new();
            for node in nodes {
                let status: Option<serde_json::Value> = async {
                    let response = http.get(format!("{}/cluster", node.url)).send().await.ok()?;
                    response.json().await.ok()
                }
                .await;
                leaders.push(status.and_then(|status| status["leader"].as_u64()));
            }
            if let Some(Some(leader)) = leaders.first()
                && leaders.iter().all(|each| *each == Some(*leader))
            {
                return Ok(*leader);
            }
            if Instant::now() > deadline {
                bail!("the cluster elected no leader in 30 s (each node's view: {leaders:?})");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
}

impl Target for ClusterTarget {
    fn name(&self) -> &str {
        "onehop-cluster"
    }

    fn durability(&self, _plan: &Plan) -> String {
        format!("replicated: fsynced in the Raft logs of a majority of {NODES} nodes")
    }

    fn open(&self, plan: &Plan, recorder: &Arc<Recorder>, runtime: &Handle) -> anyhow::Result<Session> {
        let node = &self.nodes[self.follower];
        let mut endpoints = Endpoints::plain(node.url.clone(), node.mqtt.clone());
        endpoints.publish_to =
            self.nodes.iter().map(|node| Endpoints::plain(node.url.clone(), node.mqtt.clone())).collect();
        client::open(&endpoints, plan, recorder, runtime)
    }

    fn server_pid(&self) -> Option<u32> {
        Some(self.nodes[self.follower].pid())
    }

    fn process_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(ServerProcess::pid).collect()
    }

    fn settings(&self) -> serde_json::Value {
        json!({
            "nodes": NODES,
            "replication": "Raft (openraft 0.9.25): one group, every stream write committed on a majority",
            "acknowledged": "once a majority's Raft logs hold the write fdatasynced and the node answering applied it",
            "clients": format!(
                "publishers on every node in turn (HTTP: one writer per node, each event or batch to the next; \
                 MQTT: each publisher connected to every node, each message to the next connection), subscribers \
                 on node {} (a follower; node {} leads): writes on a follower forwarded to the leader",
                self.follower + 1,
                self.leader
            ),
            "machine": "every node on this machine and its one disk",
        })
    }
}
