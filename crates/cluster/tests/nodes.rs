//! Nodes of a cluster in one process, talking over 127.0.0.1: elections, proposals from every
//! node, a leader that stops, a node that returns, membership changes.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use onehop_cluster::{Applier, Node, NodeOptions, ProposeError};

/// A state machine that records every command in order, in a file, applying each log index
/// once even when asked again after a restart. Its answer is the command's position.
struct Recorder {
    inner: Mutex<(File, Vec<(u64, String)>)>,
}

impl Recorder {
    fn open(path: &Path) -> Arc<Recorder> {
        let mut applied = Vec::new();
        if let Ok(file) = File::open(path) {
            for line in BufReader::new(file).lines() {
                let line = line.unwrap();
                let (index, text) = line.split_once(' ').unwrap();
                applied.push((index.parse().unwrap(), text.to_string()));
            }
        }
        let file = OpenOptions::new().create(true).append(true).open(path).unwrap();
        Arc::new(Recorder { inner: Mutex::new((file, applied)) })
    }

    fn commands(&self) -> Vec<String> {
        self.inner.lock().unwrap().1.iter().map(|(_, text)| text.clone()).collect()
    }
}

impl Applier for Recorder {
    fn prepare(&self, request: Bytes) -> Result<Bytes, Bytes> {
        if request.as_ref() == b"refuse" { Err(Bytes::from_static(b"refused")) } else { Ok(request) }
    }

    fn begin_term(&self, _term: u64) {}

    async fn apply(&self, index: u64, command: Bytes) -> Result<Bytes, String> {
        let mut inner = self.inner.lock().unwrap();
        if let Some(position) = inner.1.iter().position(|(applied, _)| *applied == index) {
            return Ok(Bytes::from((position as u64).to_le_bytes().to_vec()));
        }
        let text = String::from_utf8(command.to_vec()).map_err(|error| error.to_string())?;
        writeln!(inner.0, "{index} {text}").map_err(|error| error.to_string())?;
        inner.1.push((index, text));
        Ok(Bytes::from(((inner.1.len() - 1) as u64).to_le_bytes().to_vec()))
    }

    async fn sync(&self) -> Result<(), String> {
        self.inner.lock().unwrap().0.sync_data().map_err(|error| error.to_string())
    }
}

fn free_address() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

struct Member {
    id: u64,
    dir: PathBuf,
    address: SocketAddr,
    recorder: Arc<Recorder>,
    node: Option<Node<Recorder>>,
}

impl Member {
    async fn start(id: u64, dir: &Path, address: SocketAddr) -> Member {
        let dir = dir.join(format!("node-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        let recorder = Recorder::open(&dir.join("commands"));
        let mut options = NodeOptions::new(id, &dir, address);
        options.propose_timeout = Duration::from_secs(5);
        let node = Node::start(options, recorder.clone()).await.unwrap();
        Member { id, dir, address, recorder, node: Some(node) }
    }

    fn node(&self) -> &Node<Recorder> {
        self.node.as_ref().unwrap()
    }

    async fn stop(&mut self) {
        self.node.take().unwrap().shutdown().await.unwrap();
    }

    async fn restart(&mut self) {
        let parent = self.dir.parent().unwrap().to_owned();
        *self = Member::start(self.id, &parent, self.address).await;
    }
}

async fn cluster(dir: &Path, size: u64) -> Vec<Member> {
    // Raft's own account of what went wrong, when a test fails (`RUST_LOG=warn`).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let mut members = Vec::new();
    for id in 1..=size {
        members.push(Member::start(id, dir, free_address()).await);
    }
    let addresses: BTreeMap<u64, SocketAddr> = members.iter().map(|m| (m.id, m.address)).collect();
    for member in &members {
        member.node().bootstrap(&addresses).await.unwrap();
    }
    members
}

/// Waits until every running member has applied `count` commands, then returns them per member.
async fn settled(members: &[Member], count: usize) -> Vec<Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all: Vec<Vec<String>> =
            members.iter().filter(|m| m.node.is_some()).map(|m| m.recorder.commands()).collect();
        if all.iter().all(|commands| commands.len() >= count) || Instant::now() > deadline {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Proposes `count` commands spread over the running members; returns the positions of those
/// answered. Every proposal must be answered, or (across a leader change) have an unknown
/// outcome: `unknown` says how many may.
async fn propose_some(members: &[Member], prefix: &str, count: usize, unknown: usize) -> Vec<u64> {
    let mut proposals = Vec::new();
    for i in 0..count {
        let running: Vec<&Member> = members.iter().filter(|m| m.node.is_some()).collect();
        let member = running[i % running.len()];
        proposals.push(member.node().propose(Bytes::from(format!("{prefix}-{i}"))));
    }
    let answers = futures_join_all(proposals).await;
    let unknowns = answers.iter().filter(|answer| matches!(answer, Err(ProposeError::Unknown(_)))).count();
    assert!(unknowns <= unknown, "{unknowns} outcomes unknown: {answers:?}");
    answers
        .into_iter()
        .filter(|answer| !matches!(answer, Err(ProposeError::Unknown(_))))
        .map(|answer| u64::from_le_bytes(answer.unwrap().as_ref().try_into().unwrap()))
        .collect()
}

async fn propose_many(members: &[Member], prefix: &str, count: usize) -> Vec<u64> {
    propose_some(members, prefix, count, 0).await
}

/// Polls every future to completion concurrently (a tiny join_all, to keep dependencies out).
async fn futures_join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|context| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(context) {
                    std::task::Poll::Ready(value) => *output = Some(value),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending { std::task::Poll::Pending } else { std::task::Poll::Ready(()) }
    })
    .await;
    outputs.into_iter().map(Option::unwrap).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_commit_the_same_commands_in_the_same_order_from_every_node() {
    let dir = tempfile::tempdir().unwrap();
    let members = cluster(dir.path(), 3).await;
    let mut positions = propose_many(&members, "a", 300).await;
    positions.sort_unstable();
    assert_eq!(positions, (0..300).collect::<Vec<u64>>(), "each command has its own place in the log");

    let all = settled(&members, 300).await;
    assert_eq!(all[0].len(), 300);
    assert!(all.iter().all(|commands| *commands == all[0]), "the nodes applied different sequences");
    let leaders: Vec<Option<u64>> = members.iter().map(|m| m.node().leader()).collect();
    assert!(leaders.iter().all(|leader| leader.is_some() && *leader == leaders[0]), "{leaders:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_is_replaced_and_catches_up_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = cluster(dir.path(), 3).await;
    propose_many(&members, "before", 50).await;
    let leader = members[0].node().leader().unwrap();
    let stopped = members.iter().position(|m| m.id == leader).unwrap();
    members[stopped].stop().await;

    // The two left elect one of themselves.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let views: Vec<Option<u64>> = members.iter().filter(|m| m.node.is_some()).map(|m| m.node().leader()).collect();
        if views.iter().all(|view| view.is_some_and(|new| new != leader) && *view == views[0]) {
            break;
        }
        assert!(Instant::now() < deadline, "no new leader in 10 s: {views:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And go on committing. Should they need a second election, a proposal out during it has
    // an unknown outcome.
    let during = propose_some(&members, "during", 100, 100).await.len();
    assert!(during > 0, "nothing committed after the leader stopped");

    // The old leader returns from its directory, applies what it missed, and nothing twice.
    // A returning node may start an election before it hears from the leader: a proposal out
    // during it may have an unknown outcome too.
    members[stopped].restart().await;
    let after = propose_some(&members, "after", 50, 50).await.len();
    let all = settled(&members, 50 + during + after).await;
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|commands| *commands == all[0]), "the nodes diverged");
    let unique: std::collections::BTreeSet<&String> = all[0].iter().collect();
    assert_eq!(unique.len(), all[0].len(), "a command was applied twice");
    assert_eq!(all[0].iter().filter(|c| c.starts_with("before")).count(), 50, "an answered command lost");
    assert!(all[0].iter().filter(|c| c.starts_with("during")).count() >= during, "an answered command lost");
    assert!(all[0].iter().filter(|c| c.starts_with("after")).count() >= after, "an answered command lost");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_nothing_commits_and_proposals_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = cluster(dir.path(), 3).await;
    propose_many(&members, "a", 10).await;
    members[0].stop().await;
    members[1].stop().await;
    let started = Instant::now();
    let outcome = members[2].node().propose(Bytes::from_static(b"alone")).await;
    assert!(
        matches!(outcome, Err(ProposeError::NoLeader | ProposeError::Unreachable(_) | ProposeError::Unknown(_))),
        "{outcome:?}"
    );
    assert!(started.elapsed() >= Duration::from_secs(4), "gave up before its deadline");
    assert!(!members[2].recorder.commands().contains(&"alone".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_leader_refuses_is_answered_and_never_committed() {
    let dir = tempfile::tempdir().unwrap();
    let members = cluster(dir.path(), 3).await;
    propose_many(&members, "a", 5).await;
    for member in &members {
        let answer = member.node().propose(Bytes::from_static(b"refuse")).await.unwrap();
        assert_eq!(answer.as_ref(), b"refused");
    }
    propose_many(&members, "b", 5).await;
    let all = settled(&members, 10).await;
    assert!(all.iter().all(|commands| commands.len() == 10 && !commands.contains(&"refuse".to_string())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_is_added_while_the_cluster_runs_and_another_removed() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = cluster(dir.path(), 3).await;
    propose_many(&members, "a", 40).await;
    let fourth = Member::start(4, dir.path(), free_address()).await;
    let leader = members[0].node().leader().unwrap();
    // Asked of a follower, which forwards it to the leader.
    let following = members.iter().find(|m| m.id != leader).unwrap();
    following.node().add_node(4, fourth.address).await.unwrap();
    let again = following.node().add_node(4, fourth.address).await;
    assert!(matches!(again, Err(ProposeError::Refused(_))), "{again:?}");
    members.push(fourth);
    propose_many(&members, "b", 40).await;
    let all = settled(&members, 80).await;
    assert!(all.iter().all(|commands| commands.len() == 80 && *commands == all[0]));
    assert_eq!(members[3].node().members().len(), 4);

    // Remove a follower; the three left keep committing.
    let follower = members.iter().find(|m| m.id != leader && m.id != 4).unwrap().id;
    let leading = members.iter().find(|m| m.id == leader).unwrap();
    leading.node().remove_node(follower).await.unwrap();
    let removed = members.iter().position(|m| m.id == follower).unwrap();
    members[removed].stop().await;
    members.remove(removed);
    propose_many(&members, "c", 40).await;
    let all = settled(&members, 120).await;
    assert!(all.iter().all(|commands| commands.len() == 120 && *commands == all[0]));
    assert!(!members[0].node().members().contains_key(&follower));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_that_are_no_message_close_only_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let members = cluster(dir.path(), 3).await;
    propose_many(&members, "a", 5).await;
    let cases: [&[u8]; 3] = [
        // A frame longer than any message: refused before its bytes are read.
        &[0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0],
        // A frame whose payload is no message.
        &[4, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef],
        // A frame cut short by the peer going away.
        &[200, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3],
    ];
    for case in cases {
        let mut stream = tokio::net::TcpStream::connect(members[0].address).await.unwrap();
        stream.write_all(case).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the connection was not closed: {read:?} {rest:?}");
    }
    // The nodes go on.
    propose_many(&members, "b", 5).await;
    let all = settled(&members, 10).await;
    assert!(all.iter().all(|commands| commands.len() == 10 && *commands == all[0]));
}
