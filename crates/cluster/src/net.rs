//! The nodes' own protocol: Raft's RPCs and forwarded proposals over TCP.
//!
//! A frame is `[length u32 LE][request id u64 LE][format u8][postcard message]`; a reply carries its
//! request's id, so one connection carries many forwarded proposals at once. Raft's RPCs to one
//! peer go one at a time (openraft sends them so) on a connection of their own. A frame longer
//! than [`FRAME_BYTES_MAX`] or a message that does not decode closes the connection.
//!
//! With [`ClusterTls`], every connection is TLS, and each side proves itself with a certificate
//! the cluster's CA signed: a peer without one is refused in the handshake, before any frame.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sys::{TcpListener, TcpStream};
use bytes::Bytes;
use openraft::BasicNode;
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::{Applier, Inner, ProposeError, Receiver, TypeConfig};

/// The longest frame either side accepts.
pub const FRAME_BYTES_MAX: usize = 256 * 1024 * 1024;
/// Requests one connection may have in progress at once; more wait to be read.
const IN_FLIGHT_PER_CONNECTION: usize = 4096;

/// How long a TLS handshake between nodes may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// TLS between the nodes: the acceptor presents this node's certificate and requires the
/// peer's, the connector presents it and checks the peer's; both check against the cluster's
/// CA, and the connector checks the address it dials against the peer's certificate (an IP
/// address in its subject alternative names). The binary builds both from the operator's
/// files.
#[derive(Clone)]
pub struct ClusterTls {
    pub acceptor: tokio_rustls::TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
}

/// A connection between nodes: TCP, or TLS over it.
trait Connection: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> Connection for T {}

/// Connects to the node at `address`, over TLS when `tls` is set.
async fn connect(address: SocketAddr, tls: Option<&ClusterTls>) -> io::Result<Box<dyn Connection>> {
    let stream = TcpStream::connect(address).await?;
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else { return Ok(Box::new(stream)) };
    let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
    let secured = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.connector.connect(name, stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake took too long"))??;
    Ok(Box::new(secured))
}

/// What one node asks another.
#[derive(Serialize, Deserialize)]
pub enum Request {
    Raft(RaftRequest),
    /// A request for the leader to prepare and commit (sent by a node that is not the leader).
    Propose(Bytes),
    /// A change of the members, for the leader to make.
    Membership(crate::MembershipChange),
    /// What the node says of itself to the others ([`crate::Node::set_info`]).
    Info,
    /// What member `id` says of itself, told as it starts ([`crate::Node::announce`]), so that
    /// the others do not tell clients an address it had before a restart.
    Announce {
        id: u64,
        info: Bytes,
    },
    /// Whether the node knows a live leader (`Inner::leader_recent`): the pre-vote of a node
    /// that lost its own, answered with one byte, 1 for yes.
    PreVote,
}

/// Raft's own RPCs.
#[derive(Serialize, Deserialize)]
pub enum RaftRequest {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
}

/// The answer to a [`Request`].
#[derive(Serialize, Deserialize)]
pub enum Reply {
    Append(Result<AppendEntriesResponse<u64>, RaftError<u64>>),
    Vote(Result<VoteResponse<u64>, RaftError<u64>>),
    Snapshot(Result<InstallSnapshotResponse<u64>, RaftError<u64, InstallSnapshotError>>),
    Propose(Result<Bytes, ProposeError>),
}

async fn write_frame(writer: &mut (impl AsyncWriteExt + Unpin), id: u64, payload: &[u8]) -> io::Result<()> {
    writer.write_all(&(payload.len() as u32).to_le_bytes()).await?;
    writer.write_all(&id.to_le_bytes()).await?;
    writer.write_all(payload).await
}

async fn read_frame(reader: &mut (impl AsyncReadExt + Unpin)) -> io::Result<(u64, Vec<u8>)> {
    let len = reader.read_u32_le().await? as usize;
    if len > FRAME_BYTES_MAX {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a frame of {len} bytes")));
    }
    let id = reader.read_u64_le().await?;
    // Grown as the bytes arrive, not allocated up front from a length a peer claims.
    let mut payload = Vec::with_capacity(len.min(64 * 1024));
    (&mut *reader).take(len as u64).read_to_end(&mut payload).await?;
    if payload.len() != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a frame cut short"));
    }
    Ok((id, payload))
}

/// Writes the frames `outgoing` brings to `writer`: those waiting together, then one flush.
fn spawn_writer(
    writer: impl AsyncWrite + Unpin + Send + 'static,
    mut outgoing: mpsc::Receiver<(u64, Vec<u8>)>,
) -> tokio::task::JoinHandle<io::Result<()>> {
    tokio::spawn(async move {
        let mut writer = BufWriter::new(writer);
        while let Some((id, payload)) = outgoing.recv().await {
            write_frame(&mut writer, id, &payload).await?;
            while let Ok((id, payload)) = outgoing.try_recv() {
                write_frame(&mut writer, id, &payload).await?;
            }
            writer.flush().await?;
        }
        Ok(())
    })
}

/// The format of every message between nodes, its first byte (docs/cluster.md, "Formats"):
/// the rest is postcard. A node refuses a message of another format, naming it, so nodes of
/// two releases that changed it never misread each other.
const MESSAGE_FORMAT: u8 = 1;

fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    postcard::to_extend(message, vec![MESSAGE_FORMAT]).expect("cluster messages always encode")
}

fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> io::Result<T> {
    match bytes.split_first() {
        Some((&MESSAGE_FORMAT, rest)) => {
            postcard::from_bytes(rest).map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))
        }
        Some((format, _)) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "a message in format {format} from another node (this one speaks {MESSAGE_FORMAT}): every node of a \
                 cluster runs one release"
            ),
        )),
        None => Err(io::Error::new(io::ErrorKind::InvalidData, "an empty message")),
    }
}

/// Serves other nodes' requests on `listener` until the task is aborted; aborting it closes
/// every connection it accepted too.
pub(crate) async fn serve<A: Applier>(listener: TcpListener, node: Arc<Inner<A>>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        // Forget the connections that ended.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "cluster listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let node = node.clone();
        connections.spawn(async move {
            let stream: Box<dyn Connection> = match &node.tls {
                None => Box::new(stream),
                Some(tls) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream)).await {
                    Ok(Ok(secured)) => Box::new(secured),
                    Ok(Err(error)) => {
                        tracing::warn!(%peer, %error, "cluster connection refused: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%peer, "cluster connection refused: no TLS handshake in time");
                        return;
                    }
                },
            };
            if let Err(error) = serve_connection(stream, node).await
                && error.kind() != io::ErrorKind::UnexpectedEof
            {
                tracing::debug!(%peer, %error, "cluster connection closed");
            }
        });
    }
}

async fn serve_connection<A: Applier>(stream: Box<dyn Connection>, node: Arc<Inner<A>>) -> io::Result<()> {
    let (reader, writer) = tokio::io::split(stream);
    let mut reader = BufReader::new(reader);
    let (replies, outgoing) = mpsc::channel::<(u64, Vec<u8>)>(1024);
    let writing = spawn_writer(writer, outgoing);
    let permits = Arc::new(Semaphore::new(IN_FLIGHT_PER_CONNECTION));
    // Requests in progress end with their connection.
    let mut requests = tokio::task::JoinSet::new();
    let result = loop {
        while requests.try_join_next().is_some() {}
        let (id, payload) = match read_frame(&mut reader).await {
            Ok(frame) => frame,
            Err(error) => break Err(error),
        };
        let request: Request = match decode(&payload) {
            Ok(request) => request,
            Err(error) => break Err(error),
        };
        let permit = permits.clone().acquire_owned().await.expect("never closed");
        let replies = replies.clone();
        match request {
            Request::Propose(request) => {
                // Queued here, before the next request is read: what one node forwards is
                // committed in the order it sent it.
                let queued = node.submit_here(request).await;
                requests.spawn(async move {
                    let answer = match queued {
                        Ok(receiver) => {
                            receiver.await.unwrap_or_else(|_| Err(ProposeError::Unknown("the leader stopped".into())))
                        }
                        Err(error) => Err(error),
                    };
                    let _ = replies.send((id, encode(&Reply::Propose(answer)))).await;
                    drop(permit);
                });
            }
            Request::Info => {
                let info = node.info.read().expect("info lock").clone();
                let _ = replies.send((id, encode(&Reply::Propose(Ok(info))))).await;
                drop(permit);
            }
            Request::PreVote => {
                let answer = Bytes::from(vec![u8::from(node.leader_recent())]);
                let _ = replies.send((id, encode(&Reply::Propose(Ok(answer))))).await;
                drop(permit);
            }
            Request::Announce { id: member, info } => {
                node.heard(member, info);
                let _ = replies.send((id, encode(&Reply::Propose(Ok(Bytes::new()))))).await;
                drop(permit);
            }
            Request::Membership(change) => {
                let node = node.clone();
                requests.spawn(async move {
                    let answer = node.change_membership_here(change).await.map(|()| Bytes::new());
                    let _ = replies.send((id, encode(&Reply::Propose(answer)))).await;
                    drop(permit);
                });
            }
            Request::Raft(rpc) => {
                let raft = node.raft.clone();
                let node = node.clone();
                requests.spawn(async move {
                    let reply = match rpc {
                        RaftRequest::Append(rpc) => {
                            node.heard_from_leader();
                            Reply::Append(raft.append_entries(rpc).await)
                        }
                        RaftRequest::Vote(rpc) => Reply::Vote(raft.vote(rpc).await),
                        RaftRequest::Snapshot(rpc) => Reply::Snapshot(raft.install_snapshot(rpc).await),
                    };
                    let _ = replies.send((id, encode(&reply))).await;
                    drop(permit);
                });
            }
        }
    };
    // Answers still being worked out are written before the connection closes.
    while requests.join_next().await.is_some() {}
    drop(replies);
    let _ = writing.await;
    result
}

/// Makes a [`Peer`] per node openraft talks to.
#[derive(Clone, Default)]
pub struct Network {
    pub(crate) tls: Option<ClusterTls>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Peer {
        Peer { target, address: node.addr.clone(), tls: self.tls.clone(), stream: None }
    }
}

/// One node's connection to another, for Raft's RPCs.
pub struct Peer {
    target: u64,
    address: String,
    tls: Option<ClusterTls>,
    stream: Option<BufReader<Box<dyn Connection>>>,
}

type RpcError<E = openraft::error::Infallible> = RPCError<u64, BasicNode, RaftError<u64, E>>;

enum CallError {
    Connect(io::Error),
    Io(io::Error),
}

impl Peer {
    async fn call(&mut self, request: &Request, ttl: Duration) -> Result<Reply, CallError> {
        let result = tokio::time::timeout(ttl, async {
            if self.stream.is_none() {
                let address: SocketAddr = self.address.parse().map_err(|error| {
                    CallError::Connect(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: {error}", self.address),
                    ))
                })?;
                let stream = connect(address, self.tls.as_ref()).await.map_err(CallError::Connect)?;
                self.stream = Some(BufReader::new(stream));
            }
            let stream = self.stream.as_mut().expect("connected above");
            write_frame(stream.get_mut(), 0, &encode(request)).await.map_err(CallError::Io)?;
            let (_, payload) = read_frame(stream).await.map_err(CallError::Io)?;
            decode::<Reply>(&payload).map_err(CallError::Io)
        })
        .await
        .unwrap_or_else(|_| Err(CallError::Io(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"))));
        if result.is_err() {
            self.stream = None;
        }
        result
    }

    fn failed<E: std::error::Error>(&self, error: CallError) -> RPCError<u64, BasicNode, E> {
        match error {
            CallError::Connect(error) => RPCError::Unreachable(Unreachable::new(&error)),
            CallError::Io(error) => RPCError::Network(NetworkError::new(&error)),
        }
    }

    fn unexpected<E: std::error::Error>(&self) -> RPCError<u64, BasicNode, E> {
        let error = io::Error::new(io::ErrorKind::InvalidData, "an answer to another request");
        RPCError::Network(NetworkError::new(&error))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcError> {
        match self.call(&Request::Raft(RaftRequest::Append(rpc)), option.hard_ttl()).await {
            Ok(Reply::Append(Ok(response))) => Ok(response),
            Ok(Reply::Append(Err(error))) => Err(RPCError::RemoteError(RemoteError::new(self.target, error))),
            Ok(_) => Err(self.unexpected()),
            Err(error) => Err(self.failed(error)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcError<InstallSnapshotError>> {
        match self.call(&Request::Raft(RaftRequest::Snapshot(rpc)), option.hard_ttl()).await {
            Ok(Reply::Snapshot(Ok(response))) => Ok(response),
            Ok(Reply::Snapshot(Err(error))) => Err(RPCError::RemoteError(RemoteError::new(self.target, error))),
            Ok(_) => Err(self.unexpected()),
            Err(error) => Err(self.failed(error)),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<u64>, option: RPCOption) -> Result<VoteResponse<u64>, RpcError> {
        match self.call(&Request::Raft(RaftRequest::Vote(rpc)), option.hard_ttl()).await {
            Ok(Reply::Vote(Ok(response))) => Ok(response),
            Ok(Reply::Vote(Err(error))) => Err(RPCError::RemoteError(RemoteError::new(self.target, error))),
            Ok(_) => Err(self.unexpected()),
            Err(error) => Err(self.failed(error)),
        }
    }
}

type Waiting = Arc<Mutex<Option<HashMap<u64, oneshot::Sender<Result<Bytes, ProposeError>>>>>>;

/// One multiplexed connection to a leader, for forwarded proposals.
struct Forward {
    requests: mpsc::Sender<(u64, Vec<u8>)>,
    waiting: Waiting,
}

/// Sends proposals to the leader, many at once over one connection per leader.
#[derive(Default)]
pub struct Forwarder {
    connections: tokio::sync::Mutex<HashMap<SocketAddr, Arc<Forward>>>,
    next_id: AtomicU64,
    tls: Option<ClusterTls>,
}

impl Forwarder {
    pub(crate) fn new(tls: Option<ClusterTls>) -> Forwarder {
        Forwarder { tls, ..Forwarder::default() }
    }

    /// Forwards `request` to the leader at `address`; returns once it is on its way (behind
    /// every request forwarded there before). A connection that breaks while the request is out
    /// drops the answer's sender: the outcome is unknown, the leader may have committed it.
    pub(crate) async fn send(&self, address: SocketAddr, request: Request) -> Result<Receiver, ProposeError> {
        let forward = self.connection(address).await?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        {
            let mut waiting = forward.waiting.lock().expect("waiting lock");
            let Some(waiting) = waiting.as_mut() else {
                return Err(ProposeError::Unreachable(format!("{address}: connection closed")));
            };
            waiting.insert(id, answer);
        }
        if forward.requests.send((id, encode(&request))).await.is_err() {
            forward.waiting.lock().expect("waiting lock").as_mut().map(|waiting| waiting.remove(&id));
            return Err(ProposeError::Unreachable(format!("{address}: connection closed")));
        }
        Ok(answered)
    }

    async fn connection(&self, address: SocketAddr) -> Result<Arc<Forward>, ProposeError> {
        let mut connections = self.connections.lock().await;
        if let Some(forward) = connections.get(&address)
            && forward.waiting.lock().expect("waiting lock").is_some()
        {
            return Ok(forward.clone());
        }
        let stream = tokio::time::timeout(Duration::from_secs(2), connect(address, self.tls.as_ref()))
            .await
            .map_err(|_| ProposeError::Unreachable(format!("{address}: connect timed out")))?
            .map_err(|error| ProposeError::Unreachable(format!("{address}: {error}")))?;
        let (reader, writer) = tokio::io::split(stream);
        let (requests, outgoing) = mpsc::channel::<(u64, Vec<u8>)>(1024);
        let waiting: Waiting = Arc::new(Mutex::new(Some(HashMap::new())));
        let forward = Arc::new(Forward { requests, waiting: waiting.clone() });
        let closing = waiting.clone();
        let writing = spawn_writer(writer, outgoing);
        tokio::spawn(async move {
            let mut reader = BufReader::new(reader);
            loop {
                let Ok((id, payload)) = read_frame(&mut reader).await else { break };
                let Ok(Reply::Propose(answer)) = decode::<Reply>(&payload) else { break };
                let sender = waiting.lock().expect("waiting lock").as_mut().and_then(|waiting| waiting.remove(&id));
                if let Some(sender) = sender {
                    let _ = sender.send(answer);
                }
            }
            writing.abort();
            // Every proposal still out learns that its outcome is unknown (its sender drops).
            closing.lock().expect("waiting lock").take();
        });
        connections.insert(address, forward.clone());
        Ok(forward)
    }
}
