//! A cluster node: the engine as the Raft state machine, and the Raft node as the engine's
//! replicator (docs/cluster.md).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use anyhow::Context;
use bytes::Bytes;
use std::path::Path;

use onehop_cluster::{Applier, ClusterTls, MembershipChange, Node, NodeOptions, ProposeError, SnapshotFile};
use onehop_engine::{Engine, Replicator, Submitted};
use onehop_server::http::{ChangeRefused, MemberChange};
use onehop_server::mqtt::sessions::SESSIONS_TOPIC;

use crate::settings::{ClusterSettings, ClusterTlsFiles};

/// The engine, applying what the cluster commits.
pub struct EngineApplier(Arc<Engine>);

impl Applier for EngineApplier {
    fn prepare(&self, request: Bytes) -> Result<Bytes, Bytes> {
        self.0.prepare_replicated(&request)
    }

    fn begin_term(&self, term: u64) {
        self.0.begin_replicated_term(term);
    }

    async fn apply(&self, index: u64, command: Bytes) -> Result<Bytes, String> {
        let applied = self.0.apply_replicated(index, &command).await;
        if let Err(error) = &applied {
            tracing::error!(%error, "this node cannot apply a committed command and stops taking part");
        }
        applied
    }

    async fn sync(&self) -> Result<(), String> {
        self.0.sync_replicated().await
    }

    fn is_barrier(&self, command: &Bytes) -> bool {
        onehop_engine::Engine::is_replicated_barrier(command)
    }

    fn snapshot_files(&self, into: &Path) -> Result<Vec<SnapshotFile>, String> {
        let files = self.0.link_replicated_files(into, replicated_topic).map_err(|error| error.to_string())?;
        Ok(files.into_iter().map(|(path, bytes)| SnapshotFile { source: into.join(&path), path, bytes }).collect())
    }

    fn restart(&self) -> String {
        restart_in_place()
    }
}

/// The topics a node keeps for itself, which a snapshot neither sends nor replaces: its MQTT
/// sessions (docs/cluster.md). Kafka's committed offsets, idempotent producers' states and
/// transactions are replicated, as the streams are.
const NODE_TOPICS: [&str; 1] = [SESSIONS_TOPIC];

/// Whether the topic `name` is part of the replicated state: every stream, table, view output,
/// the catalog, view checkpoints, retained MQTT messages, Kafka's committed offsets, producers'
/// states and transactions; not [`NODE_TOPICS`].
fn replicated_topic(name: &str) -> bool {
    !NODE_TOPICS.contains(&name)
}

/// Finishes the install of a snapshot this node received before it restarted (see
/// [`onehop_cluster::install_pending`]): before the log and the engine open.
pub fn install_pending_snapshot(data_dir: &Path) -> anyhow::Result<()> {
    let installed = onehop_cluster::install_pending(&data_dir.join("cluster"), &data_dir.join("log"), |name| {
        !replicated_topic(name)
    })
    .context("installing the snapshot received from the cluster's leader")?;
    if let Some(index) = installed {
        tracing::info!(index, "the snapshot is installed: this node goes on from there");
    }
    Ok(())
}

/// Replaces this process with a new run of the same program, arguments and environment, so
/// that it installs a pending snapshot as it starts. Returns only if that failed, with why.
/// The process keeps its id; open files and sockets close (Rust opens them close-on-exec).
fn restart_in_place() -> String {
    use std::os::unix::process::CommandExt;
    let program = match std::env::current_exe() {
        Ok(program) => program,
        Err(error) => return format!("cannot find this program: {error}"),
    };
    let error = std::process::Command::new(&program).args(std::env::args_os().skip(1)).exec();
    format!("cannot run {} again: {error}", program.display())
}

/// What a node tells the others of itself: where its Kafka listeners are advertised.
#[derive(serde::Serialize, serde::Deserialize, Default)]
pub struct NodeInfo {
    /// The plain listener's host and port, as Kafka clients are told.
    pub kafka: Option<(String, u16)>,
    /// The TLS listener's.
    pub kafka_tls: Option<(String, u16)>,
}

/// The cluster as this node's Kafka clients see it: the leader leads every partition and
/// coordinates every group, at the address it advertises.
pub struct KafkaView(pub Arc<Node<EngineApplier>>);

impl onehop_server::kafka::KafkaCluster for KafkaView {
    fn leader(&self) -> Option<i32> {
        self.0.leader().and_then(|leader| i32::try_from(leader).ok())
    }

    fn settled_term(&self) -> Option<u64> {
        *self.0.settled().borrow()
    }

    fn brokers(&self, tls: bool) -> Vec<(i32, String, u16)> {
        self.0
            .directory()
            .into_iter()
            .filter_map(|(id, info)| {
                let info: NodeInfo = serde_json::from_slice(&info).ok()?;
                let (host, port) = if tls { info.kafka_tls? } else { info.kafka? };
                Some((i32::try_from(id).ok()?, host, port))
            })
            .collect()
    }
}

/// Tells the engine, as it changes, in which term this node leads once it has applied all
/// that earlier leaders committed: the leader runs the transforms.
async fn lead_transforms(engine: Arc<Engine>, mut settled: tokio::sync::watch::Receiver<Option<u64>>) {
    loop {
        engine.set_leading(*settled.borrow_and_update());
        if settled.changed().await.is_err() {
            engine.set_leading(None);
            return;
        }
    }
}

/// The Raft node, taking the engine's writes.
struct NodeReplicator(Arc<Node<EngineApplier>>);

impl Replicator for NodeReplicator {
    fn submit(&self, request: Bytes) -> Pin<Box<dyn Future<Output = Result<Submitted, String>> + Send + '_>> {
        Box::pin(async move {
            let pending = self.0.submit(request).await.map_err(|error| error.to_string())?;
            let answer: Submitted = Box::pin(async move { pending.answer().await.map_err(|error| error.to_string()) });
            Ok(answer)
        })
    }
}

/// The node's view of the cluster, for `GET /cluster`.
pub struct Status(pub Arc<Node<EngineApplier>>);

impl onehop_server::http::ClusterStatus for Status {
    fn status(&self) -> serde_json::Value {
        // A copy: holding the watch's read guard while `members` takes it again would wait
        // behind Raft's next metrics update, which waits behind the first guard.
        let metrics = self.0.metrics().borrow().clone();
        serde_json::json!({
            "node": metrics.id,
            "state": format!("{:?}", metrics.state).to_lowercase(),
            "term": metrics.current_term,
            "leader": metrics.current_leader,
            "members": self.0.members(),
            "last_log_index": metrics.last_log_index,
            "last_applied": metrics.last_applied.map(|id| id.index),
            "snapshot_index": metrics.snapshot.map(|id| id.index),
            // After a restart and before the first scheduled snapshot, openraft's snapshot is the
            // state this node restarted from (docs/cluster.md).
            "snapshot_is": metrics.snapshot.map(|_| if self.0.snapshot_taken() { "taken" } else { "restarted_from" }),
            "purged_index": metrics.purged.map(|id| id.index),
        })
    }

    fn change(&self, change: MemberChange) -> Pin<Box<dyn Future<Output = Result<(), ChangeRefused>> + Send + '_>> {
        Box::pin(async move {
            let change = match change {
                MemberChange::Add(member) => MembershipChange::Add { id: member.id, address: member.address },
                MemberChange::Remove(id) => MembershipChange::Remove { id },
            };
            tracing::info!(?change, "changing the cluster's members");
            self.0.change_membership(change).await.map_err(|error| match error {
                ProposeError::Refused(reason) => ChangeRefused::Invalid(reason),
                other => ChangeRefused::Unavailable(other.to_string()),
            })
        })
    }
}

/// Logs the cluster's events as this node sees them: a new leader, no leader, Raft stopping.
async fn watch(mut metrics: tokio::sync::watch::Receiver<onehop_cluster::RaftMetrics<u64, onehop_cluster::BasicNode>>) {
    let mut seen = (None, 0);
    loop {
        let (leader, term, stopped) = {
            let now = metrics.borrow_and_update();
            (now.current_leader, now.current_term, now.running_state.clone().err())
        };
        if let Some(fatal) = stopped {
            tracing::error!(%fatal, "this node's Raft stopped: it takes no writes and applies nothing until restarted");
            return;
        }
        if (leader, term) != seen && (leader.is_some() || seen.0.is_some()) {
            match leader {
                Some(leader) => tracing::info!(leader, term, "the cluster's leader"),
                None => tracing::warn!(term, "no leader: an election is under way"),
            }
            seen = (leader, term);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Starts this node of the cluster on `engine`, forms the cluster on the first start of its
/// members, and sends the engine's writes to it from now on.
pub async fn start(
    settings: &ClusterSettings,
    data_dir: &std::path::Path,
    engine: &Arc<Engine>,
) -> anyhow::Result<Arc<Node<EngineApplier>>> {
    let mut options = NodeOptions::new(settings.node_id, data_dir.join("cluster"), settings.address);
    if let Some(files) = &settings.tls {
        options.tls = Some(tls(files).context("TLS between the nodes")?);
    }
    options.snapshot_every = settings.snapshot_every;
    options.log_kept = settings.log_kept;
    let node = Node::start(options, Arc::new(EngineApplier(engine.clone())))
        .await
        .with_context(|| format!("starting cluster node {}", settings.node_id))?;
    let node = Arc::new(node);
    if !settings.peers.is_empty() {
        node.bootstrap(&settings.peers).await.map_err(anyhow::Error::msg).context("forming the cluster")?;
    }
    engine.set_replicator(Arc::new(NodeReplicator(node.clone()))).context("this node's data directory")?;
    tokio::spawn(watch(node.metrics()));
    tokio::spawn(lead_transforms(engine.clone(), node.settled()));
    tracing::info!(
        node = settings.node_id,
        address = %settings.address,
        advertised = %settings.advertised,
        peers = ?settings.peers,
        tls = settings.tls.is_some(),
        "cluster node started: stream writes are committed on a majority of the nodes"
    );
    Ok(node)
}

/// TLS between the nodes from the operator's files: the same certificate presented as server
/// and as client, and the peer's required and checked against the cluster's CA both ways.
fn tls(files: &ClusterTlsFiles) -> anyhow::Result<ClusterTls> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let server = onehop_server::tls::Tls::open(onehop_server::tls::TlsFiles {
        cert: files.cert.clone(),
        key: files.key.clone(),
        client_ca: Some(files.ca.clone()),
        client_cert_required: true,
    })?;
    let read_chain = |path: &std::path::Path| -> anyhow::Result<Vec<CertificateDer<'static>>> {
        let chain = CertificateDer::pem_file_iter(path)
            .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
            .with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(!chain.is_empty(), "{}: no CERTIFICATE in it", path.display());
        Ok(chain)
    };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in read_chain(&files.ca)? {
        roots.add(certificate).with_context(|| format!("{}: a CA certificate", files.ca.display()))?;
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).with_context(|| format!("reading {}", files.key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(read_chain(&files.cert)?, key)
        .with_context(|| format!("{} and {}", files.cert.display(), files.key.display()))?;
    Ok(ClusterTls { acceptor: server.acceptor(), connector: tokio_rustls::TlsConnector::from(Arc::new(client)) })
}
