//! Three `onehop serve` processes as a cluster on 127.0.0.1: writers over HTTP to every node,
//! an SSE subscriber moving from node to node, and the leader killed with kill -9 at random
//! instants (or paused with SIGSTOP). After it all, every node holds the same records at the
//! same offsets, every acknowledged write is there at its acknowledged offset, nothing was
//! written twice, and the subscriber saw only records that stayed.
//!
//! `ONEHOP_CLUSTER_KILLS` sets the number of kill cycles (default 50); the issue's longer run
//! is `ONEHOP_CLUSTER_KILLS=1000 cargo test -p onehop --test cluster acknowledged -- --nocapture`.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Server, Spawned, free_port, get, start};

/// A small xorshift generator: the test prints its seed, and `ONEHOP_CLUSTER_SEED` replays it.
struct Random(u64);

impl Random {
    fn new() -> Random {
        let seed = std::env::var("ONEHOP_CLUSTER_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1);
        println!("seed {seed} (ONEHOP_CLUSTER_SEED={seed} repeats the instants)");
        Random(seed)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

/// One node: its fixed ports (so clients and peers find it again after a restart) and its
/// running process, if any.
struct Member {
    id: u64,
    http: SocketAddr,
    cluster: SocketAddr,
    server: Option<Server>,
    /// The link the other nodes reach this one through, when the test puts faults there.
    link: Option<Link>,
    /// Its Kafka listener's address, the same at every start ([`Kafka::FixedPorts`]).
    kafka: Option<SocketAddr>,
}

/// Whether the nodes serve Kafka, and where.
#[derive(Clone, Copy, PartialEq)]
enum Kafka {
    Off,
    /// On a free port each, another at each start: the other nodes must tell clients the new
    /// one.
    AnyPort,
    /// On a port each that a restart keeps, as a deployment's are. librdkafka keeps talking to
    /// a transaction coordinator at the address it first had, though FindCoordinator names
    /// another port for the same node id.
    FixedPorts,
}

struct Cluster {
    dir: tempfile::TempDir,
    peers: String,
    members: Vec<Member>,
    /// Whether the nodes serve Kafka too (on a free port each).
    kafka: bool,
    /// Each node starts with `--admin-user` as this superuser (name, password), and the test
    /// reads `/cluster` as it.
    admin: Option<(&'static str, &'static str)>,
    /// More arguments for every node.
    extra: Vec<String>,
}

/// What a [`Link`] does to the traffic it carries.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// New connections are refused and open ones closed: the node cannot be reached.
    Cut,
    /// Every chunk waits this long before it is passed on.
    Delay(Duration),
}

/// The test's own TCP proxy in front of a node's cluster port: the address the other nodes
/// know it by (`--cluster-advertised-addr`). Traffic *to* the node goes through it, so a cut
/// makes the node unreachable while it can still reach the others: a one-way partition.
struct Link {
    address: SocketAddr,
    fault: Arc<Mutex<Fault>>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Link {
    fn start(target: SocketAddr) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        let fault = Arc::new(Mutex::new(Fault::None));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (faults, opened) = (fault.clone(), open.clone());
        std::thread::spawn(move || {
            for incoming in listener.incoming() {
                let Ok(incoming) = incoming else { return };
                if *faults.lock().unwrap() == Fault::Cut {
                    continue;
                }
                let Ok(outgoing) = TcpStream::connect(target) else { continue };
                let _ = incoming.set_nodelay(true);
                let _ = outgoing.set_nodelay(true);
                {
                    let mut open = opened.lock().unwrap();
                    open.push(incoming.try_clone().unwrap());
                    open.push(outgoing.try_clone().unwrap());
                }
                for (from, to) in [(incoming.try_clone().unwrap(), outgoing.try_clone().unwrap()), (outgoing, incoming)]
                {
                    let faults = faults.clone();
                    std::thread::spawn(move || pump(from, to, faults));
                }
            }
        });
        Link { address, fault, open }
    }

    fn set(&self, fault: Fault) {
        *self.fault.lock().unwrap() = fault;
        if fault == Fault::Cut {
            for stream in self.open.lock().unwrap().drain(..) {
                let _ = stream.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream, fault: Arc<Mutex<Fault>>) {
    let mut buffer = [0u8; 64 * 1024];
    while let Ok(read) = from.read(&mut buffer) {
        if read == 0 {
            break;
        }
        match *fault.lock().unwrap() {
            Fault::Cut => break,
            Fault::Delay(delay) => std::thread::sleep(delay),
            Fault::None => {}
        }
        if to.write_all(&buffer[..read]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
    let _ = from.shutdown(std::net::Shutdown::Both);
}

impl Cluster {
    fn start(size: u64) -> Cluster {
        Cluster::start_with(size, Kafka::Off, false, None, Vec::new())
    }

    /// With `links`, each node is reached through a [`Link`] the test can put faults on.
    fn start_with(
        size: u64,
        kafka: Kafka,
        links: bool,
        admin: Option<(&'static str, &'static str)>,
        extra: Vec<String>,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (1..=size)
            .map(|id| {
                let cluster: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
                Member {
                    id,
                    http: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
                    cluster,
                    server: None,
                    link: links.then(|| Link::start(cluster)),
                    kafka: (kafka == Kafka::FixedPorts).then(|| format!("127.0.0.1:{}", free_port()).parse().unwrap()),
                }
            })
            .collect();
        let peers = members
            .iter()
            .map(|m| format!("{}={}", m.id, m.link.as_ref().map_or(m.cluster, |link| link.address)))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Cluster { dir, peers, members, kafka: kafka != Kafka::Off, admin, extra };
        if admin.is_some() {
            // A node with --admin-user opens its listeners once the cluster made that user,
            // which takes a majority: the members start side by side.
            let servers: Vec<Server> = std::thread::scope(|scope| {
                let starting: Vec<_> = (0..cluster.members.len())
                    .map(|index| {
                        let (args, envs) = cluster.arguments(index, true);
                        let cwd = cluster.dir.path();
                        scope.spawn(move || {
                            let args: Vec<&str> = args.iter().map(String::as_str).collect();
                            start(cwd, &args, &envs)
                        })
                    })
                    .collect();
                starting.into_iter().map(|thread| thread.join().unwrap()).collect()
            });
            for (member, server) in cluster.members.iter_mut().zip(servers) {
                member.server = Some(server);
            }
        } else {
            for index in 0..cluster.members.len() {
                cluster.launch(index);
            }
        }
        cluster
    }

    fn launch(&mut self, index: usize) {
        self.launch_with(index, true);
    }

    /// Starts the member at `index`; with `form`, as one of the members that form the cluster
    /// (`--peers`), else as a node that waits to be added.
    fn launch_with(&mut self, index: usize, form: bool) {
        let (args, envs) = self.arguments(index, form);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.members[index].server = Some(start(self.dir.path(), &args, &envs));
    }

    /// The arguments and environment of the member at `index` (see [`Cluster::launch_with`]).
    fn arguments(&self, index: usize, form: bool) -> (Vec<String>, Vec<(&'static str, &'static str)>) {
        let member = &self.members[index];
        let data = self.dir.path().join(format!("node-{}", member.id));
        let advertised = member.link.as_ref().map_or(member.cluster, |link| link.address).to_string();
        let kafka = match member.kafka {
            Some(address) => address.to_string(),
            None if self.kafka => "127.0.0.1:0".to_string(),
            None => "off".to_string(),
        };
        let mut args: Vec<String> = [
            "--cluster-advertised-addr",
            &advertised,
            "--data-dir",
            data.to_str().unwrap(),
            "--http-addr",
            &member.http.to_string(),
            "--kafka-addr",
            &kafka,
            "--node-id",
            &member.id.to_string(),
            "--cluster-addr",
            &member.cluster.to_string(),
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        if form {
            args.extend(["--peers".to_string(), self.peers.clone()]);
        }
        args.extend(self.extra.iter().cloned());
        let mut envs = vec![("ONEHOP_LOG", "warn,onehop=info")];
        if let Some((name, password)) = self.admin {
            args.extend(["--admin-user".to_string(), name.to_string()]);
            envs.push(("ONEHOP_ADMIN_PASSWORD", password));
        }
        (args, envs)
    }

    /// Kills the leader with kill -9 `kills` times, `base` to `base + spread` ms apart (drawn
    /// from `random`), restarting it each time after up to 400 ms.
    fn kill_leaders(&mut self, kills: usize, random: &mut Random, base: u64, spread: u64) {
        for kill in 0..kills {
            std::thread::sleep(Duration::from_millis(base + random.below(spread)));
            let leader = self.leader();
            self.members[leader].server.as_mut().unwrap().kill_9();
            self.members[leader].server = None;
            std::thread::sleep(Duration::from_millis(random.below(400)));
            self.launch(leader);
            if (kill + 1) % 5 == 0 {
                println!("{} of {kills} leaders killed", kill + 1);
            }
        }
    }

    /// What each running node said (only its warnings and errors with `warnings_only`), for a
    /// failure's message.
    fn said(&mut self, warnings_only: bool) -> String {
        let said: Vec<String> = self
            .members
            .iter_mut()
            .filter_map(|member| Some((member.id, member.server.as_mut()?)))
            .map(|(id, server)| {
                let lines: Vec<&str> = server
                    .said()
                    .iter()
                    .map(String::as_str)
                    .filter(|line| !warnings_only || !line.contains(" INFO "))
                    .collect();
                format!("node {id} said:\n{}", lines.join("\n"))
            })
            .collect();
        said.join("\n")
    }

    fn link(&self, index: usize) -> &Link {
        self.members[index].link.as_ref().expect("a cluster started with links")
    }

    fn http_addresses(&self) -> Vec<SocketAddr> {
        self.members.iter().map(|m| m.http).collect()
    }

    /// The index of the member the running nodes agree leads, once one does.
    fn leader(&mut self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for (index, member) in self.members.iter().enumerate() {
                if member.server.is_none() {
                    continue;
                }
                if let Some(status) = status_as(member.http, self.admin)
                    && status["state"] == "leader"
                {
                    return index;
                }
            }
            if Instant::now() >= deadline {
                panic!("no leader in 30 s\n{}", self.said(false));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The node's `/cluster` answer, or `None` when it does not answer within 2 s (it is down, or
/// paused).
fn status(address: SocketAddr) -> Option<serde_json::Value> {
    status_as(address, None)
}

/// [`status`], as `user` (name, password) when given.
fn status_as(address: SocketAddr, user: Option<(&str, &str)>) -> Option<serde_json::Value> {
    use base64::Engine as _;
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let authorization = user.map_or(String::new(), |(name, password)| {
        let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{name}:{password}"));
        format!("Authorization: Basic {credentials}\r\n")
    });
    write!(stream, "GET /cluster HTTP/1.1\r\nHost: {address}\r\n{authorization}Connection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    let started = Instant::now();
    if let Err(error) = stream.read_to_string(&mut response) {
        println!("{address}: /cluster unanswered after {:?}: {error}", started.elapsed());
        return None;
    }
    let body = response.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}

/// One POST over a fresh connection: the offset the write was acknowledged at, or `None`.
fn publish(address: SocketAddr, key: &str, value: &str) -> Option<u64> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    let request = format!(
        "POST /streams/events?key={key} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{value}",
        value.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status: u16 = response.split_whitespace().nth(1)?.parse().ok()?;
    if status != 200 {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(response.split_once("\r\n\r\n")?.1).ok()?;
    body["offset"].as_u64()
}

/// Every record of `events` on the node at `address`: offset → (key, value, timestamp).
fn stored(address: SocketAddr) -> BTreeMap<u64, (String, String, u64)> {
    let mut records = BTreeMap::new();
    let mut from = 0;
    loop {
        let (code, body) = get(address, &format!("/streams/events?from={from}&limit=10000"));
        if code == 404 && from == 0 {
            // The stream's creation has not reached this node yet.
            return records;
        }
        assert_eq!(code, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let list = page["records"].as_array().unwrap();
        if list.is_empty() {
            return records;
        }
        for record in list {
            let offset = record["offset"].as_u64().unwrap();
            let entry = (
                record["key"].as_str().unwrap_or_default().to_string(),
                record["value"].to_string(),
                record["timestamp"].as_u64().unwrap(),
            );
            records.insert(offset, entry);
            from = offset + 1;
        }
    }
}

/// Writers: each posts unique values round-robin over the nodes, keeping the acknowledged ones.
fn writers(
    addresses: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    count: usize,
) -> Vec<std::thread::JoinHandle<Vec<(u64, String)>>> {
    (0..count)
        .map(|writer| {
            let (addresses, stop) = (addresses.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let address = addresses[(n as usize + writer) % addresses.len()];
                    let value = format!("{{\"writer\":{writer},\"n\":{n}}}");
                    if let Some(offset) = publish(address, &format!("w{writer}-{n}"), &value) {
                        acked.push((offset, value));
                    } else {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    n += 1;
                }
                acked
            })
        })
        .collect()
}

/// A subscriber over SSE that moves to the next node whenever its node goes away, resuming
/// after the last record it saw. Returns every record it saw, in order.
fn subscriber(addresses: Vec<SocketAddr>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<(u64, String)>> {
    std::thread::spawn(move || {
        let seen: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
        let mut node = 0;
        while !stop.load(Ordering::Relaxed) {
            let next = seen.lock().unwrap().last().map_or(0, |(offset, _)| offset + 1);
            let address = addresses[node % addresses.len()];
            node += 1;
            let child = Command::new("curl")
                .args(["-s", "-N", "--max-time", "5", "-H", "accept: text/event-stream"])
                .arg(format!("http://{address}/streams/events?from={next}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let mut child = Spawned(child);
            let stdout = child.0.stdout.take().unwrap();
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let Some(data) = line.strip_prefix("data: ") else { continue };
                let event: serde_json::Value = serde_json::from_str(data).unwrap();
                let Some(offset) = event["offset"].as_u64() else { continue };
                let mut seen = seen.lock().unwrap();
                let expected = seen.last().map_or(0, |(last, _)| last + 1);
                assert_eq!(offset, expected, "the subscription skipped or repeated an offset");
                seen.push((offset, event["value"].to_string()));
            }
            drop(child);
        }
        Arc::try_unwrap(seen).unwrap().into_inner().unwrap()
    })
}

/// Waits until every running node holds the same records, then checks the acknowledged and
/// seen ones against them.
fn check(cluster: &mut Cluster, acked: &[(u64, String)], seen: &[(u64, String)]) {
    let running: Vec<SocketAddr> = cluster.members.iter().filter(|m| m.server.is_some()).map(|m| m.http).collect();
    for member in &mut cluster.members {
        if let Some(server) = member.server.as_mut()
            && status(member.http).is_none()
        {
            // With ONEHOP_CLUSTER_GDB set, the hung node's threads are shown too (gdb, from
            // Debian's packages): how a deadlock in the status handler was found.
            let threads = match std::env::var_os("ONEHOP_CLUSTER_GDB") {
                Some(_) => {
                    let pid = server.child.id().to_string();
                    let trace = Command::new("gdb").args(["-p", &pid, "-batch", "-ex", "thread apply all bt"]).output();
                    trace.map(|trace| String::from_utf8_lossy(&trace.stdout).into_owned()).unwrap_or_default()
                }
                None => String::new(),
            };
            panic!("node {} does not answer; it said:\n{}\n{threads}", member.id, server.said().join("\n"));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let logs = loop {
        let logs: Vec<_> = running.iter().map(|address| stored(*address)).collect();
        if logs.iter().all(|log| *log == logs[0]) {
            break logs;
        }
        assert!(Instant::now() < deadline, "the nodes' logs still differ after 30 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = &logs[0];
    assert_eq!(log.keys().copied().collect::<Vec<_>>(), (0..log.len() as u64).collect::<Vec<_>>(), "a gap in the log");
    for (offset, value) in acked {
        let stored = log.get(offset).map(|(_, stored, _)| stored);
        assert_eq!(stored, Some(&normalized(value)), "acknowledged write at offset {offset} lost or changed");
    }
    for (offset, value) in seen {
        let stored = log.get(offset).map(|(_, stored, _)| stored);
        assert_eq!(stored, Some(value), "a subscriber saw offset {offset}, which did not stay");
    }
    let mut keys = HashSet::new();
    for (key, _, _) in log.values().filter(|(key, _, _)| !key.is_empty()) {
        assert!(keys.insert(key), "{key} was written twice");
    }
    println!(
        "{} records on each of {} nodes; {} acknowledged, {} seen by the subscriber",
        log.len(),
        running.len(),
        acked.len(),
        seen.len()
    );
}

/// `value` as the server gives it back (serde_json's rendering).
fn normalized(value: &str) -> String {
    serde_json::from_str::<serde_json::Value>(value).unwrap().to_string()
}

#[test]
fn acknowledged_writes_survive_kill_9_of_the_leader_on_every_node_at_their_offsets() {
    let kills: usize = std::env::var("ONEHOP_CLUSTER_KILLS").ok().and_then(|n| n.parse().ok()).unwrap_or(50);
    let mut random = Random::new();
    let mut cluster = Cluster::start(3);
    cluster.leader();
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writers(cluster.http_addresses(), stop.clone(), 3);
    let watching = subscriber(cluster.http_addresses(), stop.clone());
    cluster.kill_leaders(kills, &mut random, 100, 500);
    cluster.leader();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let acked: Vec<(u64, String)> = writing.into_iter().flat_map(|writer| writer.join().unwrap()).collect();
    let seen = watching.join().unwrap();
    assert!(acked.len() > kills, "too few writes were acknowledged ({}) to tell anything", acked.len());
    check(&mut cluster, &acked, &seen);
}

#[test]
fn a_paused_leader_steps_down_and_rejoins_without_divergence() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writers(cluster.http_addresses(), stop.clone(), 2);
    std::thread::sleep(Duration::from_millis(500));
    let term = status(cluster.members[leader].http).unwrap()["term"].as_u64().unwrap();
    let paused = cluster.members[leader].server.as_ref().unwrap();
    paused.signal("STOP");
    // A long pause, like a GC stop or a stalled disk: the others elect a leader and go on.
    std::thread::sleep(Duration::from_secs(3));
    let during = cluster.leader();
    assert_ne!(during, leader, "the paused node is still reported as leader");
    let mut direct = Vec::new();
    for (n, member) in cluster.members.iter().enumerate().filter(|(index, _)| *index != leader) {
        let value = format!("{{\"during_pause\":{n}}}");
        let offset = publish(member.http, &format!("pause-{n}"), &value);
        let offset =
            offset.unwrap_or_else(|| panic!("node {} refused a write while the old leader was paused", member.id));
        direct.push((offset, value));
    }
    cluster.members[leader].server.as_ref().unwrap().signal("CONT");
    // Back, it learns of the newer term from the others and follows whoever leads it.
    on_every_node(&[cluster.members[leader].http], "the resumed node's newer term", |node| {
        status(node).and_then(|status| status["term"].as_u64()).is_some_and(|now| now > term)
    });
    stop.store(true, Ordering::Relaxed);
    let mut acked: Vec<(u64, String)> = writing.into_iter().flat_map(|writer| writer.join().unwrap()).collect();
    acked.extend(direct);
    check(&mut cluster, &acked, &[]);
}

#[test]
fn mqtt_and_kafka_writes_on_followers_reach_every_node() {
    let mut cluster = Cluster::start_with(3, Kafka::AnyPort, false, None, Vec::new());
    let leader = cluster.leader();
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let mqtt = cluster.members[followers[0]].server.as_ref().unwrap().mqtt_address;
    let kafka = cluster.members[followers[1]].server.as_ref().unwrap().kafka_address.unwrap();
    // mosquitto_pub exits 0 only once its QoS 1 message is acknowledged.
    let published = Command::new("mosquitto_pub")
        .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-q", "1", "-i", "cluster-test"])
        .args(["-t", "events/mqtt", "-m", r#"{"via":"mqtt"}"#])
        .output()
        .unwrap();
    assert!(published.status.success(), "{}", String::from_utf8_lossy(&published.stderr));
    let mut kcat = Command::new("kcat")
        .args(["-P", "-b", &kafka.to_string(), "-t", "events", "-k", "via-kafka", "-X", "acks=all"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kcat.stdin.take().unwrap().write_all(br#"{"via":"kafka"}"#).unwrap();
    let produced = kcat.wait_with_output().unwrap();
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
    assert!(
        !String::from_utf8_lossy(&produced.stderr).contains("ERROR"),
        "{}",
        String::from_utf8_lossy(&produced.stderr)
    );
    // Both reach the leader and the other follower, at the same offsets as everywhere.
    check(&mut cluster, &[], &[]);
    let log = stored(cluster.members[leader].http);
    let values: Vec<&String> = log.values().map(|(_, value, _)| value).collect();
    assert!(values.contains(&&normalized(r#"{"via":"mqtt"}"#)), "{values:?}");
    assert!(values.contains(&&normalized(r#"{"via":"kafka"}"#)), "{values:?}");
}

#[test]
fn a_node_is_added_catches_up_and_another_is_removed_over_http_and_the_cli() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let mut acked = Vec::new();
    for n in 0..20 {
        let value = format!("{{\"n\":{n}}}");
        acked.push((publish(cluster.members[n % 3].http, &format!("before-{n}"), &value).unwrap(), value));
    }
    // A fourth node, started without --peers, waits to be added; a follower is asked to add it.
    cluster.members.push(Member {
        id: 4,
        http: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        cluster: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        server: None,
        link: None,
        kafka: None,
    });
    cluster.launch_with(3, false);
    let follower = (0..3).find(|index| *index != leader).unwrap();
    let body = format!(r#"{{"id":4,"address":"{}"}}"#, cluster.members[3].cluster);
    let (code, answer) = common::curl(cluster.members[follower].http, "/cluster/nodes", &["-X", "POST", "-d", &body]);
    assert_eq!(code, 200, "{answer}");
    let members: serde_json::Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(members["members"].as_object().unwrap().len(), 4, "{answer}");
    // Adding it again is refused (here with `onehop cluster add`), and so is a body that is no
    // member.
    let url = format!("http://{}", cluster.members[follower].http);
    let again = common::onehop()
        .args(["cluster", "add", "4", &cluster.members[3].cluster.to_string(), "--url", &url])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success() && said.contains("membership_refused"), "{said}");
    let (code, answer) = common::curl(cluster.members[follower].http, "/cluster/nodes", &["-X", "POST", "-d", "{}"]);
    assert_eq!(code, 400, "{answer}");
    for n in 0..20 {
        let value = format!("{{\"m\":{n}}}");
        acked.push((publish(cluster.members[n % 4].http, &format!("after-{n}"), &value).unwrap(), value));
    }
    check(&mut cluster, &acked, &[]);

    // Remove one of the first three (not the leader); the other three go on.
    let removed = (0..3).find(|index| *index != cluster.leader()).unwrap();
    let id = cluster.members[removed].id;
    let url = format!("http://{}", cluster.members[3].http);
    let (said, _) =
        common::run_expecting_success(common::onehop().args(["cluster", "remove", &id.to_string(), "--url", &url]));
    assert!(said.contains(&format!("node {id} removed")), "{said}");
    cluster.members[removed].server.as_mut().unwrap().kill_9();
    cluster.members[removed].server = None;
    for n in 0..10 {
        let value = format!("{{\"k\":{n}}}");
        let node = cluster.members.iter().filter(|m| m.server.is_some()).nth(n % 3).unwrap().http;
        acked.push((publish(node, &format!("removed-{n}"), &value).unwrap(), value));
    }
    check(&mut cluster, &acked, &[]);
    let status = status(cluster.members[3].http).unwrap();
    assert!(status["members"].get(id.to_string()).is_none(), "{status}");
    let (said, _) = common::run_expecting_success(common::onehop().args(["cluster", "status", "--url", &url]));
    let leader = cluster.leader();
    let leader_id = cluster.members[leader].id;
    assert!(said.starts_with("node 4: ") && said.contains(&format!("leader {leader_id}")), "{said}");
    assert!(!said.contains(&format!("{id}=127.0.0.1")), "{said}");
}

#[test]
fn network_faults_between_nodes_lose_no_acknowledged_write() {
    let mut cluster = Cluster::start_with(3, Kafka::Off, true, None, Vec::new());
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writers(cluster.http_addresses(), stop.clone(), 3);
    let watching = subscriber(cluster.http_addresses(), stop.clone());
    let faults: [(&str, Vec<(bool, Fault)>); 4] = [
        // (the leader's link or the first follower's, and what is done to it)
        ("the leader slow to reach (200 ms a chunk)", vec![(true, Fault::Delay(Duration::from_millis(200)))]),
        ("the leader unreachable, while it still reaches the others", vec![(true, Fault::Cut)]),
        ("a follower unreachable", vec![(false, Fault::Cut)]),
        ("the leader and a follower unreachable", vec![(true, Fault::Cut), (false, Fault::Cut)]),
    ];
    for (what, applied) in faults {
        let leader = cluster.leader();
        let follower = (0..3).find(|index| *index != leader).unwrap();
        println!("{what}: leader {}, follower {}", cluster.members[leader].id, cluster.members[follower].id);
        for (on_leader, fault) in &applied {
            cluster.link(if *on_leader { leader } else { follower }).set(*fault);
        }
        std::thread::sleep(Duration::from_secs(3));
        for index in 0..3 {
            cluster.link(index).set(Fault::None);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    // Healed: every node takes writes again.
    cluster.leader();
    let mut acked = Vec::new();
    for index in 0..3 {
        let value = format!("{{\"healed\":{index}}}");
        let offset = publish(cluster.members[index].http, &format!("healed-{index}"), &value);
        acked.push((offset.unwrap_or_else(|| panic!("node {} refused a write after healing", index + 1)), value));
    }
    stop.store(true, Ordering::Relaxed);
    acked.extend(writing.into_iter().flat_map(|writer| writer.join().unwrap()));
    let seen = watching.join().unwrap();
    check(&mut cluster, &acked, &seen);
}

/// A row's document and version (its `ETag`) on the node at `address`: `None` when the node
/// does not answer (it is down, or does not have the table yet after a restart), `Some(None)`
/// when it has no such row.
fn try_row(address: SocketAddr, table: &str, id: &str) -> Option<Option<(serde_json::Value, u64)>> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET /tables/{table}/{id} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    match head.split_whitespace().nth(1)? {
        "404" if body.contains("not_found") => Some(None),
        "200" => {
            let etag = head.lines().find_map(|line| line.strip_prefix("etag: "))?;
            let version = etag.trim_matches('"').parse().ok()?;
            Some(Some((serde_json::from_str(body).ok()?, version)))
        }
        _ => None,
    }
}

/// A row's document and version on the node at `address`, or `None` when it has none.
fn row(address: SocketAddr, table: &str, id: &str) -> Option<(serde_json::Value, u64)> {
    try_row(address, table, id).unwrap_or_else(|| panic!("{address} did not answer for row {id} of {table}"))
}

/// Waits until `done` holds on every node listed, for up to 10 s (a follower applies a commit
/// a moment after the leader).
fn on_every_node(addresses: &[SocketAddr], what: &str, done: impl Fn(SocketAddr) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for address in addresses {
        while !done(*address) {
            assert!(Instant::now() < deadline, "{address}: {what} not there after 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A write to a row with curl: the status and the answer.
fn write_row(address: SocketAddr, method: &str, path: &str, headers: &[&str], body: &str) -> (u16, serde_json::Value) {
    let mut args = vec!["-X", method, "-d", body];
    for header in headers {
        args.extend(["-H", header]);
    }
    let (code, body) = common::curl(address, path, &args);
    (code, serde_json::from_str(&body).unwrap_or(serde_json::Value::Null))
}

#[test]
fn tables_and_indexes_are_replicated_and_conditional_writes_are_decided_once() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let followers: Vec<SocketAddr> =
        (0..3).filter(|index| *index != leader).map(|index| cluster.members[index].http).collect();
    let (a, b, on_leader) = (followers[0], followers[1], cluster.members[leader].http);
    let everywhere = cluster.http_addresses();

    common::sql(a, "CREATE TABLE orders (id TEXT PRIMARY KEY, customer BIGINT, tags TEXT[])");
    on_every_node(&everywhere, "table orders", |node| try_row(node, "orders", "none") == Some(None));
    // A stream cannot take the table's name, on any node.
    let (code, body) = common::post(b, "/streams/orders", "{}").unwrap();
    assert_eq!(code, 409, "{body}");

    // Written on a follower, read back there at once, and on every node soon after.
    let (code, written) =
        write_row(a, "PUT", "/tables/orders/o1", &["if-none-match: *"], r#"{"customer":42,"tags":["gift"]}"#);
    assert_eq!(code, 201, "{written}");
    let first = written["offset"].as_u64().unwrap();
    assert_eq!(row(a, "orders", "o1").unwrap().1, first);
    on_every_node(&everywhere, "row o1", |node| row(node, "orders", "o1").is_some_and(|(_, v)| v == first));

    // The leader decides conditions against the newest row, whichever node asks.
    let (code, refused) = write_row(b, "PUT", "/tables/orders/o1", &["if-none-match: *"], r#"{"customer":7}"#);
    assert_eq!(code, 412, "{refused}");
    let (code, refused) = write_row(b, "PUT", "/tables/orders/o2", &[], r#"{"customer":"not a number"}"#);
    assert_eq!(code, 400, "{refused}");
    let if_first = format!("if-match: \"{first}\"");
    let (code, patched) = write_row(b, "PATCH", "/tables/orders/o1", &[&if_first], r#"{"note":"rush"}"#);
    assert_eq!(code, 200, "{patched}");
    let second = patched["offset"].as_u64().unwrap();
    assert_eq!(patched["row"]["note"], "rush", "{patched}");
    // The same version again, from the leader this time: already changed.
    let (code, refused) = write_row(on_leader, "PATCH", "/tables/orders/o1", &[&if_first], r#"{"note":"late"}"#);
    assert_eq!(code, 412, "{refused}");

    // An index made through one follower answers queries on the other.
    common::sql(b, "CREATE INDEX ON orders (customer)");
    write_row(on_leader, "PUT", "/tables/orders/o3", &[], r#"{"customer":42}"#);
    on_every_node(&everywhere, "the index on customer", |node| {
        let (code, body) = get(node, "/tables/orders?customer=42");
        code == 200 && serde_json::from_str::<serde_json::Value>(&body).unwrap()["rows"].as_array().unwrap().len() == 2
    });

    // Every node holds the same rows at the same versions; so after a restart of every node.
    let delete = write_row(a, "DELETE", "/tables/orders/o3", &[], "").0;
    assert_eq!(delete, 200);
    let expected = |node: SocketAddr| {
        row(node, "orders", "o3").is_none() && row(node, "orders", "o1").is_some_and(|(_, v)| v == second)
    };
    on_every_node(&everywhere, "the rows after the delete", expected);
    for index in 0..3 {
        cluster.members[index].server = None;
    }
    for index in 0..3 {
        cluster.launch(index);
    }
    cluster.leader();
    on_every_node(&everywhere, "the rows after a restart", expected);

    // Dropped through one node, gone from all; made again with other columns, it starts empty.
    common::sql(a, "DROP INDEX orders_customer_idx");
    common::sql(b, "DROP TABLE orders");
    on_every_node(&everywhere, "the drop", |node| get(node, "/tables/orders/o1").0 == 404);
    let (code, body) = get(a, "/tables/orders/o1");
    assert!(body.contains("unknown_table"), "{code} {body}");
    common::sql(on_leader, "CREATE TABLE orders (id TEXT PRIMARY KEY, total DOUBLE PRECISION)");
    let (code, written) = write_row(b, "PUT", "/tables/orders/o9", &[], r#"{"total":9.5}"#);
    assert_eq!(code, 201, "{written}");
    assert_eq!(written["offset"], 0, "{written}");
    on_every_node(&everywhere, "the new table's row", |node| row(node, "orders", "o9").is_some());
}

#[test]
fn compare_and_set_on_a_table_stays_exact_through_kill_9_of_the_leader() {
    let kills: usize = std::env::var("ONEHOP_CLUSTER_KILLS").ok().and_then(|n| n.parse().ok()).unwrap_or(20);
    let mut random = Random::new();
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let addresses = cluster.http_addresses();
    common::sql(addresses[leader], "CREATE TABLE counters (id TEXT PRIMARY KEY, n BIGINT)");
    let (code, body) = write_row(addresses[leader], "PUT", "/tables/counters/c", &[], r#"{"n":0}"#);
    assert_eq!(code, 201, "{body}");
    let stop = Arc::new(AtomicBool::new(false));
    // Each writer reads the counter on some node and writes n + 1 if its version is unchanged:
    // of two writers that read one version, at most one may succeed.
    let writing: Vec<_> = (0..3)
        .map(|writer| {
            let (addresses, stop) = (addresses.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut acked: Vec<(u64, u64)> = Vec::new();
                // Writes whose outcome is unknown (no answer, or `unconfirmed`): each may or
                // may not have taken effect.
                let mut unknown = 0;
                let mut turn = writer;
                while !stop.load(Ordering::Relaxed) {
                    turn += 1;
                    let node = addresses[turn % addresses.len()];
                    let Some(Some((doc, version))) = try_row(node, "counters", "c") else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let next = doc["n"].as_u64().unwrap() + 1;
                    let if_match = format!("if-match: \"{version}\"");
                    let body = format!("{{\"n\":{next}}}");
                    let (code, answer) = write_row(node, "PATCH", "/tables/counters/c", &[&if_match], &body);
                    match code {
                        200 => acked.push((answer["offset"].as_u64().unwrap(), next)),
                        412 => {}
                        _ => unknown += 1,
                    }
                }
                (acked, unknown)
            })
        })
        .collect();
    cluster.kill_leaders(kills, &mut random, 200, 600);
    cluster.leader();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (mut acked, mut unknown) = (Vec::new(), 0);
    for writer in writing {
        let (theirs, their_unknown) = writer.join().unwrap();
        acked.extend(theirs);
        unknown += their_unknown;
    }
    acked.sort();
    assert!(acked.len() > kills, "too few writes were acknowledged ({}) to tell anything", acked.len());
    // No two acknowledged increments from one version, and each one's value follows the
    // version order: the leader decided every condition once, against the newest row.
    for pair in acked.windows(2) {
        assert!(pair[0].0 < pair[1].0 && pair[0].1 < pair[1].1, "increments out of order or repeated: {pair:?}");
    }
    let (last_version, last_n) = *acked.last().unwrap();
    let mut final_rows = Vec::new();
    on_every_node(&addresses, "the same counter", |node| {
        let Some((doc, version)) = row(node, "counters", "c") else { return false };
        version >= last_version && doc["n"].as_u64().unwrap() >= last_n
    });
    for node in &addresses {
        final_rows.push(row(*node, "counters", "c").unwrap());
    }
    assert!(final_rows.iter().all(|found| *found == final_rows[0]), "the nodes differ: {final_rows:?}");
    // Every increment that took effect was acknowledged or had an unknown outcome.
    let counter = final_rows[0].0["n"].as_u64().unwrap();
    assert!(
        counter <= (acked.len() + unknown) as u64,
        "the counter is {counter}, more than the {} acknowledged and {unknown} unknown increments",
        acked.len()
    );
    println!(
        "{} increments acknowledged and {unknown} unknown through {kills} kills; the counter is {counter} at version \
         {} on every node",
        acked.len(),
        final_rows[0].1
    );
}

#[test]
fn users_grants_and_tokens_are_replicated_and_the_first_superuser_is_made_once() {
    let root = ("root", "first-secret");
    let mut cluster = Cluster::start_with(3, Kafka::Off, false, Some(root), Vec::new());
    let leader = cluster.leader();
    let followers: Vec<SocketAddr> =
        (0..3).filter(|index| *index != leader).map(|index| cluster.members[index].http).collect();
    let (a, b, on_leader) = (followers[0], followers[1], cluster.members[leader].http);
    let everywhere = cluster.http_addresses();

    // Every node started with the same --admin-user: one superuser for the whole cluster, with
    // one password and one creation time everywhere.
    let users = |node: SocketAddr| common::sql_as(node, root, "SHOW USERS");
    let shown = users(a);
    assert!(shown.contains("root"), "{shown}");
    on_every_node(&everywhere, "the same users", |node| users(node) == shown);
    let (code, body) = common::post(b, "/streams/events", "{}").unwrap();
    assert_eq!(code, 401, "access is on everywhere: {body}");

    // A user and a grant made through one follower hold on the other and on the leader.
    common::sql_as(a, root, "CREATE USER alice PASSWORD 'alice-pass'; GRANT WRITE ON STREAM events TO alice");
    common::sql_as(on_leader, root, "CREATE STREAM events");
    let alice = ("alice", "alice-pass");
    on_every_node(&everywhere, "alice's grant", |node| common::post_as(node, "/streams/events", "{}", alice).0 == 200);
    assert_eq!(common::post_as(b, "/streams/other", "{}", alice).0, 403);

    // A token made on the leader logs in on a follower; its secret is shown once, and each
    // node checks it against the same digest.
    let answer: serde_json::Value =
        serde_json::from_str(&common::sql_as(on_leader, root, "CREATE TOKEN FOR alice")).unwrap();
    let token = answer["results"][0]["rows"][0][2].as_str().unwrap().to_string();
    let bearer = format!("Authorization: Bearer {token}");
    on_every_node(&everywhere, "alice's token", |node| {
        common::curl(node, "/streams/events", &["-X", "POST", "-d", "{}", "-H", &bearer]).0 == 200
    });

    // A password changed and a grant revoked through a follower, then a restart of every node:
    // the same definitions come back everywhere.
    common::sql_as(b, root, "ALTER USER alice PASSWORD 'new-pass'; REVOKE WRITE ON STREAM events FROM alice");
    let alice = ("alice", "new-pass");
    on_every_node(&everywhere, "the revoke", |node| common::post_as(node, "/streams/events", "{}", alice).0 == 403);
    for index in 0..3 {
        cluster.members[index].server = None;
    }
    for index in 0..3 {
        cluster.launch(index);
    }
    cluster.leader();
    on_every_node(&everywhere, "the users after a restart", |node| users(node) == users(a));
    assert_eq!(common::post_as(a, "/streams/events", "{}", ("alice", "alice-pass")).0, 401, "the old password");
    assert_eq!(common::post_as(b, "/streams/events", "{}", alice).0, 403);

    // Dropped on one node, the user and its token are refused on all.
    common::sql_as(a, root, "DROP USER alice");
    on_every_node(&everywhere, "the drop", |node| {
        common::curl(node, "/streams/events", &["-X", "POST", "-d", "{}", "-H", &bearer]).0 == 401
    });
}

/// The body of `GET /views/{view}/{key}` on the node at `address`, when it answers 200.
fn view_rows(address: SocketAddr, view: &str, key: &str) -> Option<serde_json::Value> {
    let (code, body) = common::request(address, "GET", &format!("/views/{view}/{key}"), "")?;
    (code == 200).then(|| serde_json::from_str(&body).unwrap())
}

#[test]
fn views_run_on_every_node_and_agree_on_every_value() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let (a, b, on_leader) =
        (cluster.members[followers[0]].http, cluster.members[followers[1]].http, cluster.members[leader].http);
    let everywhere = cluster.http_addresses();

    common::sql(
        a,
        "CREATE STREAM clicks WITH (partitions = 3); \
         CREATE VIEW clicks_total AS SELECT page, COUNT(*) AS n, SUM(ms) AS ms FROM clicks GROUP BY page; \
         CREATE VIEW clicks_hourly AS SELECT page, COUNT(*) AS n, MAX(ms) AS slowest \
           FROM TUMBLE(clicks, INTERVAL '1' HOUR) GROUP BY page",
    );
    let click = |node: SocketAddr, n: usize| {
        let body = format!("{{\"page\":\"p{}\",\"ms\":{n}}}", n % 3);
        let (code, answer) = common::post(node, &format!("/streams/clicks?key=c{n}"), &body).unwrap();
        assert_eq!(code, 200, "{answer}");
    };
    for n in 0..30 {
        click(everywhere[n % 3], n);
    }
    // The same values on every node, window bounds included: the leader stamped each record's
    // time, and each node's view folds the same records in the same order.
    let agreed = |view: &str, key: &str, count: u64| {
        let expected = view_rows(a, view, key);
        on_every_node(&everywhere, &format!("{view}/{key} at {count}"), |node| {
            let rows = view_rows(node, view, key);
            rows.as_ref().is_some_and(|rows| rows["rows"][0]["n"] == count) && rows == view_rows(a, view, key)
        });
        expected
    };
    agreed("clicks_total", "p0", 10);
    agreed("clicks_hourly", "p2", 10);

    // A follower killed and started again restores its views and agrees once more.
    cluster.members[followers[1]].server.as_mut().unwrap().kill_9();
    cluster.members[followers[1]].server = None;
    for n in 30..60 {
        click(if n % 2 == 0 { a } else { on_leader }, n);
    }
    cluster.launch(followers[1]);
    agreed("clicks_total", "p1", 20);
    agreed("clicks_hourly", "p0", 20);

    // A view over a table, made through the other follower.
    common::sql(
        b,
        "CREATE TABLE orders (id TEXT PRIMARY KEY, status TEXT, total FLOAT); \
         CREATE VIEW by_status AS SELECT status, COUNT(*) AS n, SUM(total) AS total FROM orders GROUP BY status",
    );
    for n in 0..9 {
        let status = if n < 6 { "open" } else { "paid" };
        let body = format!("{{\"status\":\"{status}\",\"total\":{n}.5}}");
        let (code, written) = write_row(everywhere[n % 3], "PUT", &format!("/tables/orders/o{n}"), &[], &body);
        assert_eq!(code, 201, "{written}");
    }
    write_row(a, "PATCH", "/tables/orders/o0", &[], r#"{"status":"paid"}"#);
    agreed("by_status", "open", 5);
    agreed("by_status", "paid", 4);

    // The table cannot go while the view reads it, whichever node is asked; once the view is
    // dropped (on the leader) it can. A late_stream, which every node would publish to, is
    // refused.
    let (code, body) = common::post(a, "/sql", "DROP TABLE orders").unwrap();
    assert_eq!(code, 409, "{body}");
    common::sql(on_leader, "DROP VIEW by_status");
    on_every_node(&everywhere, "the view's drop", |node| get(node, "/views/by_status/open").0 == 404);
    common::sql(b, "DROP TABLE orders");
    let (code, body) = common::post(
        a,
        "/sql",
        "CREATE VIEW late WITH (late_stream = 'late_clicks') AS SELECT page, COUNT(*) AS n \
         FROM TUMBLE(clicks, INTERVAL '1' SECOND) GROUP BY page",
    )
    .unwrap();
    assert!(code >= 400 && body.contains("not_replicated"), "{code} {body}");
    // Writes go on, and the views left keep agreeing.
    for n in 60..63 {
        click(everywhere[n % 3], n);
    }
    agreed("clicks_total", "p2", 21);
}

/// Rows as JSON texts, sorted, from an answer of `/sql` (its last result) or of a view's list
/// read (its keys' rows, without their `final` flag); `None` while the node does not answer.
fn sorted_rows(address: SocketAddr, view: Option<&str>, query: &str) -> Option<Vec<String>> {
    let (code, body) = match view {
        Some(view) => common::request_with(address, None, "GET", &format!("/views/{view}?limit=10000"), "")?,
        None => common::post(address, "/sql", query)?,
    };
    if code != 200 {
        return None;
    }
    let body: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut rows: Vec<String> = match view {
        Some(_) if body["status"]["restoring"] != false => return None,
        Some(_) => body["keys"]
            .as_array()?
            .iter()
            .flat_map(|entry| entry["rows"].as_array().cloned().unwrap_or_default())
            .map(|mut row| {
                row.as_object_mut().map(|fields| fields.remove("final"));
                row.to_string()
            })
            .collect(),
        None => {
            let result = body["results"].as_array()?.last()?.clone();
            let columns: Vec<String> =
                result["columns"].as_array()?.iter().filter_map(|column| column.as_str().map(str::to_string)).collect();
            result["rows"]
                .as_array()?
                .iter()
                .map(|row| {
                    let values = row.as_array().cloned().unwrap_or_default();
                    serde_json::Value::Object(columns.iter().cloned().zip(values).collect()).to_string()
                })
                .collect()
        }
    };
    rows.sort();
    Some(rows)
}

/// A joined view and a view aggregating a join, through kill -9 of the leader (three times, at
/// random instants) while a writer changes their inputs through every node: in the end each
/// view on every node is its own SELECT evaluated on that node, row for row, and every node
/// holds the same rows.
#[test]
fn joined_views_equal_their_query_on_every_node_through_kill_9_of_the_leader() {
    const JOINED: &str = "SELECT o.id, o.qty, c.tier FROM orders o LEFT JOIN customers c ON c.id = o.customer";
    const GROUPED: &str = "SELECT c.tier, COUNT(*) AS n, SUM(o.qty) AS qty \
         FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.tier";
    let mut cluster = Cluster::start(3);
    let everywhere = cluster.http_addresses();
    common::sql(
        everywhere[0],
        &format!(
            "CREATE TABLE customers (id TEXT PRIMARY KEY, tier BIGINT); \
             CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT, qty BIGINT); \
             CREATE VIEW order_tiers AS {JOINED}; CREATE VIEW tier_totals AS {GROUPED}"
        ),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, everywhere) = (stop.clone(), everywhere.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let (method, path, body) = match n % 7 {
                    0 | 1 => ("PUT", format!("/tables/customers/c{}", n % 5), format!("{{\"tier\":{}}}", n % 3)),
                    2 => ("DELETE", format!("/tables/orders/o{}", n % 20), String::new()),
                    _ => (
                        "PUT",
                        format!("/tables/orders/o{}", n % 20),
                        format!("{{\"customer\":\"c{}\",\"qty\":{n}}}", n % 6),
                    ),
                };
                let _ = common::request_with(everywhere[n % 3], None, method, &path, &body);
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        })
    };
    let mut random = Random::new();
    cluster.kill_leaders(3, &mut random, 800, 700);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let attempted = writer.join().unwrap();
    assert!(attempted > 100, "the writer wrote: {attempted}");

    let leader = cluster.http_addresses()[cluster.leader()];
    for (view, query) in [("order_tiers", JOINED), ("tier_totals", GROUPED)] {
        let expected = sorted_rows(leader, None, query).expect("the leader answers the query");
        assert!(expected.len() > 1, "{view} has rows to compare: {expected:?}");
        on_every_node(&everywhere, &format!("{view} equal to its query"), |node| {
            sorted_rows(node, Some(view), "").is_some_and(|rows| rows == expected)
                && sorted_rows(node, None, query).is_some_and(|rows| rows == expected)
        });
    }
}

/// Every record of `stream` on the node at `address` (it holds fewer than 10 000), as HTTP
/// gives them; `None` while the node does not answer or lacks the stream.
fn records_of(address: SocketAddr, stream: &str) -> Option<Vec<serde_json::Value>> {
    let path = format!("/streams/{stream}?from=earliest&limit=10000");
    let (code, body) = common::request_with(address, None, "GET", &path, "")?;
    if code != 200 {
        return None;
    }
    serde_json::from_str::<serde_json::Value>(&body).ok()?["records"].as_array().cloned()
}

/// A transform made through a follower runs on the leader, through kill -9 of the leader
/// (three times, at random instants) while writers publish its source on every node: in the
/// end every node holds the same output, with exactly one record for each source record that
/// passes the filter (named by its `onehop-source` header) and none for the others. Its second
/// SELECT (a `UNION ALL` of the same source, split by `UNNEST`) writes two records for each hot
/// reading, each once. The first SELECT enriches each reading with its device's row of a table.
#[test]
fn a_transform_runs_on_the_leader_and_writes_each_source_record_once_through_kill_9_of_the_leader() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let follower = (0..3).find(|index| *index != leader).unwrap();
    let everywhere = cluster.http_addresses();
    common::sql(
        everywhere[follower],
        &format!(
            "CREATE STREAM readings WITH (partitions = 2); \
             CREATE TABLE devices (id TEXT PRIMARY KEY, site TEXT); {} \
             CREATE STREAM hot WITH (partitions = 3) AS \
             SELECT r.device, r.temp * 10 AS deci, s.site FROM readings r LEFT JOIN devices s ON s.id = r.device \
             WHERE r.temp > 20 \
             UNION ALL SELECT device, d, NULL FROM readings CROSS JOIN UNNEST(ARRAY[temp, temp + 1]) AS d \
             WHERE temp > 35",
            (0..6)
                .map(|n| format!("INSERT INTO devices (id, site) VALUES ('d{n}', 'site{}');", n % 3))
                .collect::<String>()
        ),
    );
    on_every_node(&everywhere, "the transform's output stream", |node| records_of(node, "hot").is_some());

    // Writers on every node; a write whose answer is lost may be stored or not: what counts
    // is what the source holds in the end.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, everywhere) = (stop.clone(), everywhere.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let body = format!("{{\"device\":\"d{}\",\"temp\":{},\"n\":{n}}}", n % 7, n % 40);
                let _ = common::request_with(
                    everywhere[n % 3],
                    None,
                    "POST",
                    &format!("/streams/readings?key=d{}", n % 7),
                    &body,
                );
                n += 1;
                std::thread::sleep(Duration::from_millis(4));
            }
            n
        })
    };
    let mut random = Random::new();
    cluster.kill_leaders(3, &mut random, 800, 700);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let attempted = writer.join().unwrap();

    // Three times: a burst, then every node killed with kill -9 once it applied the burst's
    // output and recorded that progress (as every node does before it applies a definition,
    // here a stream's creation), mostly before its transform checkpoint was due: each node
    // restarts from an older checkpoint, and the new leader's run must not write the burst
    // again.
    for round in 0..3 {
        let leader = cluster.leader();
        let device = format!("burst{round}");
        let burst: Vec<serde_json::Value> =
            (0..100).map(|n| serde_json::json!({"device": device, "temp": 30, "n": n})).collect();
        assert!(common::publish_batch(everywhere[leader], "readings", &burst), "the burst was not published");
        on_every_node(&everywhere, "the burst's output", |node| {
            records_of(node, "hot").is_some_and(|output| {
                output.iter().filter(|record| record["value"]["device"] == device.as_str()).count() >= burst.len()
            })
        });
        common::sql(everywhere[leader], &format!("CREATE STREAM marker{round}"));
        on_every_node(&everywhere, "the marker stream", |node| get(node, &format!("/streams/marker{round}")).0 == 200);
        for member in &mut cluster.members {
            member.server.as_mut().unwrap().kill_9();
            member.server = None;
        }
        for index in 0..3 {
            cluster.launch(index);
        }
    }

    // The output, as the source on one node says it must be, on every node.
    let expected_at = |node: SocketAddr| -> Option<BTreeMap<String, serde_json::Value>> {
        let source = records_of(node, "readings")?;
        let mut expected = BTreeMap::new();
        for record in source {
            let value = &record["value"];
            let (partition, offset, temp) = (&record["partition"], &record["offset"], value["temp"].as_u64()?);
            if temp > 20 {
                let deci = temp * 10;
                // Devices d0..d5 have a site; d6 and the bursts' none.
                let site = value["device"]
                    .as_str()
                    .and_then(|device| device.strip_prefix('d'))
                    .and_then(|n| n.parse::<u64>().ok())
                    .filter(|n| *n < 6)
                    .map(|n| format!("site{}", n % 3));
                expected.insert(
                    format!("{partition}:{offset}"),
                    serde_json::json!({"device": value["device"], "deci": deci, "site": site}),
                );
            }
            if temp > 35 {
                for (element, deci) in [temp, temp + 1].into_iter().enumerate() {
                    let position = format!("1/{partition}:{offset}#{element}");
                    expected
                        .insert(position, serde_json::json!({"device": value["device"], "deci": deci, "site": null}));
                }
            }
        }
        Some(expected)
    };
    let written_at = |node: SocketAddr| -> Option<Vec<(String, serde_json::Value)>> {
        let output = records_of(node, "hot")?;
        output
            .iter()
            .map(|record| {
                let position = record["headers"]["onehop-source"].as_str()?.to_string();
                Some((position, record["value"].clone()))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (expected, output) = loop {
        let expected = expected_at(everywhere[0]);
        let outputs: Vec<_> = everywhere.iter().map(|node| written_at(*node)).collect();
        if let Some(expected) = expected
            && outputs.iter().all(|output| output.as_ref().is_some_and(|output| output.len() >= expected.len()))
            && outputs.iter().all(|output| *output == outputs[0])
            && Some(&expected) == expected_at(everywhere[1]).as_ref()
        {
            break (expected, outputs[0].clone().unwrap());
        }
        if Instant::now() >= deadline {
            let counts: Vec<Option<usize>> = outputs.iter().map(|output| output.as_ref().map(Vec::len)).collect();
            let expected = expected_at(everywhere[0]).map(|expected| expected.len());
            let said = cluster.said(false);
            let said: Vec<&str> =
                said.lines().filter(|line| line.contains("transform") || line.contains("node ")).collect();
            panic!(
                "the nodes' outputs did not settle in 30 s: {counts:?} records on the nodes, {expected:?} expected\n{}",
                said.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for (position, value) in &output {
        *seen.entry(position.clone()).or_default() += 1;
        assert_eq!(Some(value), expected.get(position), "the output record for {position}");
    }
    let twice: Vec<&String> = seen.iter().filter(|(_, count)| **count > 1).map(|(position, _)| position).collect();
    assert!(twice.is_empty(), "source records written twice: {twice:?}");
    assert_eq!(seen.len(), expected.len(), "every source record that passes is written");
    println!("{attempted} writes tried; {} passed the filter, each written once on every node", expected.len());
    assert!(expected.len() > 100, "too few records to tell: {}", expected.len());
    agreed_state(&mut cluster, &everywhere, "after the kills");

    // The source cannot go while the transform reads it; the output can, and the transform
    // with it, on every node.
    let (code, body) = common::post(everywhere[follower], "/sql", "DROP STREAM readings").unwrap();
    assert_eq!(code, 409, "{body}");
    common::sql(everywhere[follower], "DROP STREAM hot");
    on_every_node(&everywhere, "the transform's drop", |node| get(node, "/streams/hot").0 == 404);
    common::sql(everywhere[leader], "DROP STREAM readings");
}

/// `DESCRIBE name` of a stream on the node at `address`: its partitions and `retention_ms`,
/// or `None` when the stream is unknown there.
fn describe(address: SocketAddr, name: &str) -> Option<(u64, Option<u64>)> {
    let (code, body) = common::post(address, "/sql", &format!("DESCRIBE {name}")).unwrap();
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = &answer["results"][0]["rows"][0];
    (code == 200).then(|| (row[1].as_u64().unwrap(), row[3].as_u64()))
}

#[test]
fn streams_are_altered_grown_and_dropped_through_the_cluster() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let (a, b, on_leader) =
        (cluster.members[followers[0]].http, cluster.members[followers[1]].http, cluster.members[leader].http);
    let everywhere = cluster.http_addresses();
    common::sql(a, "CREATE STREAM events WITH (partitions = 2)");
    let mut acked = Vec::new();
    for n in 0..6 {
        let value = format!("{{\"before\":{n}}}");
        acked.push((publish(everywhere[n % 3], &format!("k{n}"), &value).unwrap(), value));
    }

    // Retention and partitions changed through a follower reach every node.
    common::sql(b, "ALTER STREAM events SET (retention = '2d', partitions = 4)");
    on_every_node(&everywhere, "the new definition", |node| describe(node, "events") == Some((4, Some(172_800_000))));
    // Keys hash over four partitions now, alike on every node.
    for n in 6..12 {
        let value = format!("{{\"after\":{n}}}");
        assert!(publish(everywhere[n % 3], &format!("k{n}"), &value).is_some());
    }
    let partitions_used = |node: SocketAddr| {
        let (code, body) = get(node, "/streams/events?from=earliest&limit=100");
        assert_eq!(code, 200, "{body}");
        let page: serde_json::Value = serde_json::from_str(&body).unwrap();
        let mut seen: Vec<(u64, u64, String)> = page["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|record| {
                (record["partition"].as_u64().unwrap(), record["offset"].as_u64().unwrap(), record["value"].to_string())
            })
            .collect();
        seen.sort();
        seen
    };
    on_every_node(&everywhere, "all twelve records", |node| partitions_used(node).len() == 12);
    let first = partitions_used(a);
    assert!(first.iter().any(|(partition, _, _)| *partition >= 2), "no record in the added partitions: {first:?}");
    for node in &everywhere {
        assert_eq!(partitions_used(*node), first, "{node} holds other records");
    }

    // Dropped through the leader: gone everywhere. Written again, it starts over at offset 0.
    common::sql(on_leader, "DROP STREAM events");
    on_every_node(&everywhere, "the drop", |node| describe(node, "events").is_none());
    let offset = publish(b, "again", "{\"again\":true}").expect("a write after the drop");
    assert_eq!(offset, 0);
    on_every_node(&everywhere, "the stream made again", |node| stored(node).len() == 1);
    check(&mut cluster, &[(0, "{\"again\":true}".to_string())], &[]);
}

#[test]
fn tls_between_nodes_admits_only_certificates_the_cluster_ca_signed() {
    let certificates_dir = tempfile::tempdir().unwrap();
    let path = certificates_dir.path();
    // CA "A" signs the nodes' certificate (for 127.0.0.1); CA "B" a stranger's.
    common::certificates(path, "A");
    common::certificates(path, "B");
    let file = |name: &str| path.join(name).to_str().unwrap().to_string();
    let tls_args = |set: &str| {
        vec![
            "--cluster-tls-cert".to_string(),
            file(&format!("server{set}.pem")),
            "--cluster-tls-key".to_string(),
            file(&format!("server{set}.key")),
            "--cluster-tls-ca".to_string(),
            file(&format!("ca{set}.pem")),
        ]
    };
    let mut cluster = Cluster::start_with(3, Kafka::Off, false, None, tls_args("A"));
    let leader = cluster.leader();
    let follower = (0..3).find(|index| *index != leader).unwrap();
    let value = r#"{"over":"tls"}"#;
    let offset = publish(cluster.members[follower].http, "tls", value).expect("a write through a follower");
    check(&mut cluster, &[(offset, value.to_string())], &[]);

    // Plain TCP with a well-formed frame gets nothing back: the port speaks TLS only.
    let mut plain = TcpStream::connect(cluster.members[leader].cluster).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let frame = [&4u32.to_le_bytes()[..], &7u64.to_le_bytes(), &[1, 0, 0, 0]].concat();
    plain.write_all(&frame).unwrap();
    let mut answer = Vec::new();
    let _ = plain.read_to_end(&mut answer);
    // Nothing, or a TLS alert record (content type 21), then the connection closes.
    assert!(answer.is_empty() || answer[0] == 21, "a plain frame was answered: {answer:?}");

    // A stranger whose certificate CA "B" signed names the members as its peers and asks for
    // votes: every handshake is refused, and the cluster keeps its leader and term.
    let term = status(cluster.members[leader].http).unwrap()["term"].as_u64().unwrap();
    let stranger_cluster: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let stranger_http: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let peers = format!("{},4={stranger_cluster}", cluster.peers);
    let data = cluster.dir.path().join("stranger");
    let mut args: Vec<String> = [
        "--data-dir",
        data.to_str().unwrap(),
        "--http-addr",
        &stranger_http.to_string(),
        "--kafka-addr",
        "off",
        "--node-id",
        "4",
        "--cluster-addr",
        &stranger_cluster.to_string(),
        "--peers",
        &peers,
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    args.extend(tls_args("B"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut stranger = start(cluster.dir.path(), &args, &[("ONEHOP_LOG", "warn,onehop=info")]);
    std::thread::sleep(Duration::from_secs(4));
    let after = status(cluster.members[leader].http).unwrap();
    // The same term, led by a member. (openraft may let a second member lead in the term the
    // cluster formed in, when two stood at once: so not necessarily the node seen leading.)
    assert_eq!(after["term"].as_u64().unwrap(), term, "the stranger disturbed the cluster: {after}");
    assert!(
        after["leader"].as_u64().is_some_and(|id| (1..=3).contains(&id)),
        "the stranger disturbed the cluster: {after}"
    );
    let seen = status(stranger_http).unwrap();
    assert!(seen["leader"].is_null(), "the stranger found a leader: {seen}");
    // Logged as the stranger's handshakes fail: looked for in what was said, then waited for.
    let leader_server = cluster.members[leader].server.as_mut().unwrap();
    if !leader_server.said().iter().any(|line| line.contains("TLS handshake failed")) {
        leader_server.wait_for_line("TLS handshake failed");
    }
    let stranger_said = stranger.said().join("\n");
    assert!(!stranger_said.contains("panicked"), "{stranger_said}");
    // The cluster still takes writes.
    let value = r#"{"after":"stranger"}"#;
    let second = publish(cluster.members[follower].http, "after", value).expect("a write after the stranger");
    check(&mut cluster, &[(offset, r#"{"over":"tls"}"#.to_string()), (second, value.to_string())], &[]);
}

/// The retained messages under `filter` that mosquitto_sub receives from the node's MQTT
/// listener at `mqtt` within 2 s: `topic payload` lines.
fn retained_on(mqtt: SocketAddr, filter: &str) -> Vec<String> {
    let output = Command::new("mosquitto_sub")
        .args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-q", "1", "-t", filter, "-v", "-W", "2"])
        .args(["--retained-only"])
        .output()
        .unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_string).collect();
    lines.sort();
    lines
}

/// mosquitto_pub of a retained message (`None`: clearing the topic) through the node at `mqtt`.
fn publish_retained(mqtt: SocketAddr, topic: &str, payload: Option<&str>) {
    let mut command = Command::new("mosquitto_pub");
    command.args(["-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-q", "1", "-r", "-t", topic]);
    match payload {
        Some(payload) => command.args(["-m", payload]),
        None => command.arg("-n"),
    };
    let output = command.output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn a_retained_message_published_on_one_node_is_delivered_by_every_node() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let mqtt = |cluster: &Cluster, index: usize| cluster.members[index].server.as_ref().unwrap().mqtt_address;
    let on_every_mqtt = |cluster: &Cluster, filter: &str, expected: &[&str]| {
        let deadline = Instant::now() + Duration::from_secs(20);
        for index in 0..3 {
            loop {
                let got = retained_on(mqtt(cluster, index), filter);
                if got == expected {
                    break;
                }
                assert!(Instant::now() < deadline, "node {} gives {got:?} for {filter}, not {expected:?}", index + 1);
            }
        }
    };

    publish_retained(mqtt(&cluster, followers[0]), "events/status/d1", Some("online"));
    publish_retained(mqtt(&cluster, leader), "events/status/d2", Some("online"));
    on_every_mqtt(&cluster, "events/status/#", &["events/status/d1 online", "events/status/d2 online"]);

    // Replaced through the other follower, cleared through the first: alike everywhere.
    publish_retained(mqtt(&cluster, followers[1]), "events/status/d1", Some("offline"));
    publish_retained(mqtt(&cluster, followers[0]), "events/status/d2", None);
    on_every_mqtt(&cluster, "events/status/#", &["events/status/d1 offline"]);

    // A node killed with kill -9 gets back the message published while it was down, and the
    // one it had.
    let down = followers[1];
    cluster.members[down].server.as_mut().unwrap().kill_9();
    cluster.members[down].server = None;
    publish_retained(mqtt(&cluster, leader), "events/status/d3", Some("online"));
    cluster.launch(down);
    cluster.leader();
    on_every_mqtt(&cluster, "events/status/#", &["events/status/d1 offline", "events/status/d3 online"]);
}

/// The superuser of the test below.
const ROOT: (&str, &str) = ("root", "root-secret");

/// Everything a node defines and holds that the test below compares: its streams, tables and
/// users (as `SHOW` lists them, without the changing end offsets), every table's rows with
/// their versions, and every stream's records. `None` while the node does not answer.
fn everything(address: SocketAddr) -> Option<serde_json::Value> {
    let (code, body) =
        common::request_with(address, Some(ROOT), "POST", "/sql", "SHOW STREAMS; SHOW TABLES; SHOW USERS")?;
    if code != 200 {
        return None;
    }
    let shown: serde_json::Value = serde_json::from_str(&body).ok()?;
    let mut state = serde_json::Map::new();
    let mut streams = Vec::new();
    let columns = shown["results"][0]["columns"].as_array()?.clone();
    let offsets_at = columns.iter().position(|column| column == "end_offsets");
    for row in shown["results"][0]["rows"].as_array()? {
        let mut row = row.as_array()?.clone();
        let name = row[0].as_str()?.to_string();
        if name.starts_with("__") {
            continue;
        }
        if let Some(at) = offsets_at {
            row.remove(at);
        }
        let (code, body) = common::request_with(
            address,
            Some(ROOT),
            "GET",
            &format!("/streams/{name}?from=earliest&limit=10000"),
            "",
        )?;
        let records: serde_json::Value = if code == 200 { serde_json::from_str(&body).ok()? } else { return None };
        streams.push(serde_json::json!([row, records["records"]]));
    }
    state.insert("streams".into(), streams.into());
    let mut tables = Vec::new();
    for row in shown["results"][1]["rows"].as_array()? {
        let name = row[0].as_str()?;
        let (code, body) =
            common::request_with(address, Some(ROOT), "GET", &format!("/tables/{name}?scan=true&limit=10000"), "")?;
        if code != 200 {
            return None;
        }
        let rows: serde_json::Value = serde_json::from_str(&body).ok()?;
        tables.push(serde_json::json!([row, rows["rows"]]));
    }
    state.insert("tables".into(), tables.into());
    state.insert("users".into(), shown["results"][2]["rows"].clone());
    Some(state.into())
}

#[test]
fn definitions_rows_and_users_stay_identical_through_kill_9_of_the_leader() {
    let kills: usize = std::env::var("ONEHOP_CLUSTER_KILLS").ok().and_then(|n| n.parse().ok()).unwrap_or(15);
    let mut random = Random::new();
    // Users turn access on: the test works as the superuser every node starts with.
    let mut cluster = Cluster::start_with(3, Kafka::Off, false, Some(ROOT), Vec::new());
    cluster.leader();
    let addresses = cluster.http_addresses();
    let stop = Arc::new(AtomicBool::new(false));
    // One client making and dropping tables, streams and users and writing to them through
    // every node in turn; what fails (a node down, an unknown outcome, a name in use) is left.
    let churn = {
        let (addresses, stop) = (addresses.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut done = 0;
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let node = addresses[i % addresses.len()];
                let as_root =
                    |method: &str, path: &str, body: &str| common::request_with(node, Some(ROOT), method, path, body);
                let sql = |statement: String| as_root("POST", "/sql", &statement);
                let step = match i % 10 {
                    0 => sql(format!("CREATE TABLE t{} (id TEXT PRIMARY KEY, n BIGINT)", (i / 10) % 4)),
                    1 => sql(format!("CREATE STREAM s{} WITH (partitions = 2)", (i / 10) % 3)),
                    2 => sql(format!("CREATE USER u{i} PASSWORD 'p{i}'")),
                    7 => sql(format!("DROP TABLE t{}", (i / 10 + 2) % 4)),
                    8 => sql(format!("DROP STREAM s{}", (i / 10 + 1) % 3)),
                    9 => sql(format!("DROP USER u{}", i - 7)),
                    step => {
                        let body = format!("{{\"n\":{i}}}");
                        if step % 2 == 0 {
                            as_root("PUT", &format!("/tables/t{}/r{}", (i / 10 + i) % 4, i % 13), &body)
                        } else {
                            as_root("POST", &format!("/streams/s{}?key=k{i}", i % 3), &body)
                        }
                    }
                };
                if step.as_ref().is_some_and(|(code, _)| *code < 300) {
                    done += 1;
                } else {
                    std::thread::sleep(Duration::from_millis(10));
                }
                i += 1;
            }
            (i, done)
        })
    };
    cluster.kill_leaders(kills, &mut random, 300, 700);
    cluster.leader();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (tried, done) = churn.join().unwrap();
    assert!(done > kills, "too little got done ({done} of {tried}) to tell anything");
    let state = &agreed_state(&mut cluster, &addresses, "after the kills");
    println!(
        "{done} of {tried} changes and writes done through {kills} kills; every node holds {} streams, {} tables, {} \
         users alike",
        state["streams"].as_array().unwrap().len(),
        state["tables"].as_array().unwrap().len(),
        state["users"].as_array().unwrap().len()
    );
}

/// Waits until every node in `addresses` answers [`everything`] alike, and returns it.
fn agreed_state(cluster: &mut Cluster, addresses: &[SocketAddr], what: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let states: Vec<Option<serde_json::Value>> = addresses.iter().map(|node| everything(*node)).collect();
        if states.iter().all(|state| state.is_some() && *state == states[0]) {
            return states[0].clone().unwrap();
        }
        if Instant::now() >= deadline {
            panic!(
                "{what}: the nodes still differ after 30 s:\n{}\n{}",
                states.iter().map(|state| format!("{state:?}")).collect::<Vec<_>>().join("\n"),
                cluster.said(true)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[test]
fn a_node_that_missed_purged_entries_installs_a_snapshot_and_agrees_also_killed_while_installing() {
    // A snapshot every 30 entries and 5 kept before it: a node away for more than a few writes
    // lacks entries no other node holds any more.
    let extra = ["--cluster-snapshot-entries", "30", "--cluster-log-kept", "5"].map(String::from).to_vec();
    let mut cluster = Cluster::start_with(3, Kafka::Off, false, Some(ROOT), extra);
    let leader = cluster.leader();
    let away = (0..3).find(|index| *index != leader).unwrap();
    let everywhere = cluster.http_addresses();
    let here: Vec<SocketAddr> =
        (0..3).filter(|index| *index != away).map(|index| cluster.members[index].http).collect();
    let as_root = |node: SocketAddr, method: &str, path: &str, body: &str| {
        let (code, answer) = common::request_with(node, Some(ROOT), method, path, body).unwrap();
        assert!(code < 300, "{method} {path}: {code} {answer}");
    };
    let sql = |node: SocketAddr, statements: &str| as_root(node, "POST", "/sql", statements);
    let writes = |nodes: &[SocketAddr], stream: &str, from: usize, count: usize| {
        for n in from..from + count {
            as_root(
                nodes[n % nodes.len()],
                "POST",
                &format!("/streams/{stream}?key=k{}", n % 7),
                &format!("{{\"n\":{n}}}"),
            );
        }
    };
    sql(
        everywhere[0],
        "CREATE STREAM kept WITH (partitions = 2); CREATE STREAM again; \
         CREATE TABLE accounts (id TEXT PRIMARY KEY, balance BIGINT)",
    );
    writes(&everywhere, "kept", 0, 20);
    writes(&everywhere, "again", 0, 5);
    agreed_state(&mut cluster, &everywhere, "before the node goes away");
    let stopped_at = status_as(cluster.members[away].http, Some(ROOT)).unwrap()["last_applied"].as_u64().unwrap();
    cluster.members[away].server.as_mut().unwrap().kill_9();
    cluster.members[away].server = None;

    // While it is away: more records, a stream dropped and made again (its offsets start
    // again), rows, a view, a user; enough that the others purge what it lacks.
    writes(&here, "kept", 20, 60);
    sql(here[1], "DROP STREAM again");
    sql(here[0], "CREATE STREAM again WITH (partitions = 3)");
    writes(&here, "again", 100, 9);
    for n in 0..20 {
        as_root(here[n % 2], "PUT", &format!("/tables/accounts/a{}", n % 6), &format!("{{\"balance\":{n}}}"));
    }
    sql(here[1], "CREATE VIEW per_key AS SELECT key, COUNT(*) AS n FROM kept GROUP BY key");
    sql(here[0], "CREATE USER reader PASSWORD 'secret-1'");
    writes(&here, "kept", 80, 40);
    // A node purges its Raft log a moment after the snapshot that allows it, not with the write
    // that triggers the snapshot: wait for it.
    let purged_past = |node: SocketAddr, entry: u64| {
        status_as(node, Some(ROOT))
            .and_then(|status| status["purged_index"].as_u64())
            .is_some_and(|purged| purged > entry)
    };
    on_every_node(&here, &format!("a purge past entry {stopped_at}"), |node| purged_past(node, stopped_at));

    cluster.launch(away);
    cluster.members[away].server.as_mut().unwrap().wait_for_line("the snapshot is installed");
    let state = agreed_state(&mut cluster, &everywhere, "after the snapshot's install");
    let per_key = |node: SocketAddr| {
        let (code, body) = common::request_with(node, Some(ROOT), "GET", "/views/per_key/k3", "").unwrap();
        (code == 200).then_some(body)
    };
    on_every_node(&everywhere, "the view agreeing", |node| {
        per_key(node).is_some() && per_key(node) == per_key(here[0])
    });
    let status = status_as(cluster.members[away].http, Some(ROOT)).unwrap();
    assert!(status["snapshot_index"].as_u64().is_some_and(|index| index > stopped_at), "{status}");
    // The node goes on from the snapshot: it takes writes and applies what follows.
    writes(&everywhere, "kept", 120, 12);
    agreed_state(&mut cluster, &everywhere, "after writes that follow the snapshot");

    // Again, and this time killed with kill -9 as it restarts to install: the next start
    // finishes the install wherever the kill left it.
    let stopped_at = status["last_applied"].as_u64().unwrap();
    cluster.members[away].server.as_mut().unwrap().kill_9();
    cluster.members[away].server = None;
    writes(&here, "again", 109, 60);
    sql(here[1], "DROP VIEW per_key; DROP TABLE accounts");
    writes(&here, "kept", 132, 20);
    on_every_node(&here, &format!("a purge past entry {stopped_at}"), |node| purged_past(node, stopped_at));
    cluster.launch(away);
    cluster.members[away].server.as_mut().unwrap().wait_for_line("restarting to install it");
    cluster.members[away].server.as_mut().unwrap().kill_9();
    cluster.members[away].server = None;
    cluster.launch(away);
    let state_after = agreed_state(&mut cluster, &everywhere, "after a kill during the install");
    println!(
        "a node away for {} entries installed a snapshot twice, once killed while installing; every node holds {} \
         streams, {} tables, {} users alike (before the second absence: {} streams, {} tables)",
        status_as(here[0], Some(ROOT)).unwrap()["last_applied"].as_u64().unwrap() - stopped_at,
        state_after["streams"].as_array().unwrap().len(),
        state_after["tables"].as_array().unwrap().len(),
        state_after["users"].as_array().unwrap().len(),
        state["streams"].as_array().unwrap().len(),
        state["tables"].as_array().unwrap().len(),
    );
}

/// A `kcat -G` consumer of `topic` in `group`, bootstrapped at `bootstrap`: the keys it
/// received, and what it said of its assignments, gathered by threads.
struct GroupMember {
    /// Stopped when dropped.
    _child: Spawned,
    keys: Arc<Mutex<Vec<String>>>,
    said: Arc<Mutex<Vec<String>>>,
}

impl GroupMember {
    fn start(bootstrap: &str, group: &str, topic: &str) -> GroupMember {
        let mut child = Command::new("kcat")
            .args(["-b", bootstrap, "-G", group, topic, "-u", "-f", "%k\n"])
            .args(["-X", "auto.offset.reset=earliest", "-X", "session.timeout.ms=6000"])
            // librdkafka's own account of finding the coordinator and joining, for a failure.
            .args(["-X", "debug=cgrp"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let keys = Arc::new(Mutex::new(Vec::new()));
        let said = Arc::new(Mutex::new(Vec::new()));
        for (source, into) in [
            (Box::new(child.stdout.take().unwrap()) as Box<dyn Read + Send>, keys.clone()),
            (Box::new(child.stderr.take().unwrap()), said.clone()),
        ] {
            std::thread::spawn(move || {
                for line in BufReader::new(source).lines().map_while(Result::ok) {
                    into.lock().unwrap().push(line);
                }
            });
        }
        GroupMember { _child: Spawned(child), keys, said }
    }

    /// Stops it as an operator would (SIGTERM): it commits what it consumed, leaves the group
    /// and exits.
    fn stop(mut self) {
        let pid = self._child.0.id().to_string();
        let sent = Command::new("kill").args(["-s", "TERM", &pid]).status().unwrap();
        assert!(sent.success());
        let exited = self._child.0.wait().unwrap();
        assert!(exited.success() || exited.code().is_some(), "kcat ended with {exited:?}");
    }

    /// The partitions its newest assignment gave it (kcat: `… assigned: jobs [0], jobs [1]`).
    fn assigned(&self) -> Option<Vec<String>> {
        let said = self.said.lock().unwrap();
        let line = said
            .iter()
            .rev()
            .filter(|line| line.starts_with("% Group"))
            .find(|line| line.contains("assigned:") || line.contains("revoked:"))?;
        let (_, partitions) = line.split_once("assigned:")?;
        Some(partitions.split(',').map(|part| part.trim().to_string()).filter(|part| !part.is_empty()).collect())
    }
}

/// Produces one record per key to `topic` with kcat (`acks=all`), through `bootstrap`.
fn kcat_produce(bootstrap: &str, topic: &str, keys: &[String]) {
    let input: String = keys.iter().map(|key| format!("{key}:{{\"n\":1}}\n")).collect();
    let mut producer = Command::new("kcat")
        .args(["-P", "-b", bootstrap, "-t", topic, "-K", ":", "-X", "acks=all"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    producer.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let produced = producer.wait_with_output().unwrap();
    assert!(produced.status.success(), "{}", String::from_utf8_lossy(&produced.stderr));
}

#[test]
fn a_kafka_consumer_group_spans_nodes_because_every_client_is_sent_to_the_leader() {
    let mut cluster = Cluster::start_with(3, Kafka::AnyPort, false, None, Vec::new());
    let leader = cluster.leader();
    let leader_id = cluster.members[leader].id;
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();
    let kafka = |cluster: &Cluster, index: usize| {
        cluster.members[index].server.as_ref().unwrap().kafka_address.unwrap().to_string()
    };
    common::sql(cluster.members[followers[0]].http, "CREATE STREAM jobs WITH (partitions = 2)");

    // Asked through a follower, the metadata names every node as a broker, at its own Kafka
    // address, and the leader as every partition's leader.
    let deadline = Instant::now() + Duration::from_secs(20);
    let metadata = loop {
        let listed = Command::new("kcat")
            .args(["-L", "-J", "-b", &kafka(&cluster, followers[0]), "-t", "jobs"])
            .output()
            .unwrap();
        let metadata: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
        if metadata["brokers"].as_array().is_some_and(|brokers| brokers.len() == 3) {
            break metadata;
        }
        assert!(Instant::now() < deadline, "not every node is a broker after 20 s: {metadata}");
        std::thread::sleep(Duration::from_millis(200));
    };
    for member in &cluster.members {
        let address = member.server.as_ref().unwrap().kafka_address.unwrap().to_string();
        let listed = metadata["brokers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|broker| broker["id"] == member.id && broker["name"].as_str().is_some_and(|name| name == address));
        assert!(listed, "node {} at {address} is not listed: {metadata}", member.id);
    }
    let partitions = metadata["topics"][0]["partitions"].as_array().unwrap();
    assert_eq!(partitions.len(), 2, "{metadata}");
    assert!(partitions.iter().all(|partition| partition["leader"] == leader_id), "{metadata}");

    // Two members of one group, each bootstrapped at another follower: one group, which
    // shares the partitions out, not a group per node. Each follower must know the stream
    // first: a member told the topic is unknown waits for its next metadata refresh (librdkafka:
    // 5 minutes), as it would with a Kafka broker that had not heard of the topic yet.
    for follower in &followers {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let listed = Command::new("kcat")
                .args(["-L", "-J", "-b", &kafka(&cluster, *follower), "-t", "jobs"])
                .output()
                .unwrap();
            let metadata: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap_or_default();
            let partitions = metadata["topics"][0]["partitions"].as_array().map_or(0, Vec::len);
            if partitions == 2 && metadata["topics"][0]["err"].is_null() {
                break;
            }
            assert!(Instant::now() < deadline, "follower {follower} does not list jobs after 20 s: {metadata}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let members = [
        GroupMember::start(&kafka(&cluster, followers[0]), "workers", "jobs"),
        GroupMember::start(&kafka(&cluster, followers[1]), "workers", "jobs"),
    ];
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let assigned: Vec<Option<Vec<String>>> = members.iter().map(GroupMember::assigned).collect();
        if assigned.iter().all(|partitions| partitions.as_ref().is_some_and(|partitions| partitions.len() == 1)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the members did not each get one partition in 40 s: {assigned:?}\n{:?}\n{:?}",
            members[0].said.lock().unwrap(),
            members[1].said.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let keys: Vec<String> = (0..40).map(|n| format!("job-{n}")).collect();
    kcat_produce(&kafka(&cluster, followers[1]), "jobs", &keys);
    let received = || members.iter().map(|member| member.keys.lock().unwrap().len()).sum::<usize>();
    let deadline = Instant::now() + Duration::from_secs(20);
    while received() < keys.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // A moment more: a second copy of any record would arrive now.
    std::thread::sleep(Duration::from_millis(1500));
    let mut all: Vec<String> = members.iter().flat_map(|member| member.keys.lock().unwrap().clone()).collect();
    all.sort();
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(all, expected, "every record once, across the group's two members");
    let each: Vec<usize> = members.iter().map(|member| member.keys.lock().unwrap().len()).collect();
    assert!(each.iter().all(|count| *count > 0), "both members consumed: {each:?}");
    println!("one group across two nodes: its members consumed {each:?} of {} records", keys.len());
    // Both members are stopped, committing what they consumed; then the leader, which
    // coordinated the group, is killed with kill -9. The new leader coordinates it from the
    // offsets every node applied: a new member reads on from them, not from the start.
    for member in members {
        member.stop();
    }
    cluster.members[leader].server.as_mut().unwrap().kill_9();
    cluster.members[leader].server = None;
    let old = leader;
    let leader = cluster.leader();
    cluster.launch(old);
    let member = GroupMember::start(&kafka(&cluster, old), "workers", "jobs");
    let deadline = Instant::now() + Duration::from_secs(40);
    while member.assigned().is_none_or(|partitions| partitions.len() != 2) {
        if Instant::now() >= deadline {
            let said = member.said.lock().unwrap().join("\n");
            panic!("no assignment in 40 s; kcat said:\n{said}\n{}", cluster.said(false));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let more: Vec<String> = (0..10).map(|n| format!("more-{n}")).collect();
    kcat_produce(&kafka(&cluster, leader), "jobs", &more);
    let deadline = Instant::now() + Duration::from_secs(20);
    while member.keys.lock().unwrap().len() < more.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    let mut got = member.keys.lock().unwrap().clone();
    got.sort();
    let mut expected = more.clone();
    expected.sort();
    assert_eq!(got, expected, "after the failover the group reads on from its committed offsets");
}

#[test]
fn a_long_snapshot_transfer_deposes_no_leader() {
    // 40 MB behind: the transfer takes seconds, longer than the election timeout (0.5 to 1 s),
    // and the leader's chunks do not reset the receiver's election timer. Were the receiver to
    // stand for election, it would pass the leader's term and the transfer would start over.
    let extra = ["--cluster-snapshot-entries", "50", "--cluster-log-kept", "5"].map(String::from).to_vec();
    let mut cluster = Cluster::start_with(3, Kafka::Off, false, None, extra);
    let leader = cluster.leader();
    let away = (0..3).find(|index| *index != leader).unwrap();
    let on_leader = cluster.members[leader].http;
    cluster.members[away].server.as_mut().unwrap().kill_9();
    cluster.members[away].server = None;
    let filler = "x".repeat(1000);
    let values: Vec<serde_json::Value> = (0..100).map(|n| serde_json::json!({"n": n, "filler": filler})).collect();
    for batch in 0..400 {
        assert!(common::publish_batch(on_leader, "bulk", &values), "batch {batch} refused");
    }
    let before = status(on_leader).unwrap();
    let target = before["last_applied"].as_u64().unwrap();
    let started = Instant::now();
    cluster.launch(away);
    // Caught up: it says it applied as far, and it restarted after each install it began (in
    // the moment between the two, it says so with the state it had before).
    let deadline = Instant::now() + Duration::from_secs(120);
    let said = loop {
        let applied = status(cluster.members[away].http).and_then(|status| status["last_applied"].as_u64());
        let said = cluster.members[away].server.as_mut().unwrap().said().join("\n");
        if applied >= Some(target)
            && said.matches("restarting to install it").count() == said.matches("snapshot is installed").count()
        {
            break said;
        }
        assert!(Instant::now() < deadline, "not caught up in 120 s\n{}", cluster.said(true));
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("a follower 40 MB behind caught up from a snapshot in {:.1} s", started.elapsed().as_secs_f64());
    let after = status(on_leader).unwrap();
    assert_eq!(after["term"], before["term"], "an election during the transfer\n{}", cluster.said(true));
    assert_eq!(after["state"], "leader");
    // Every transfer begun was finished: none was cut short by an election. (The leader may
    // send a second, newer one: it prepared the first while the node was down, and purged past
    // it since.)
    let (begun, finished) = (
        said.matches("receiving a snapshot from the leader").count(),
        said.matches("restarting to install it").count(),
    );
    assert!(begun >= 1 && begun == finished, "{begun} transfers begun, {finished} finished:\n{said}");
    // The same records at both ends of the stream on every node.
    for from in ["earliest", "39000"] {
        let path = format!("/streams/bulk?from={from}&limit=1000");
        let answers: Vec<(u16, String)> = cluster.http_addresses().iter().map(|node| get(*node, &path)).collect();
        assert_eq!(answers[0].0, 200, "{}", answers[0].1);
        assert!(answers.iter().all(|answer| *answer == answers[0]), "the nodes differ from {from}");
    }
}

/// Every record of `stream` on the node at `address`, as `(partition, offset) → value`, read
/// page by page; `None` while the node does not answer.
fn placed_values(address: SocketAddr, stream: &str) -> Option<BTreeMap<(u64, u64), String>> {
    let mut all = BTreeMap::new();
    let mut from = "earliest".to_string();
    loop {
        let path = format!("/streams/{stream}?from={from}&limit=5000");
        let (code, body) = common::request_with(address, None, "GET", &path, "")?;
        if code != 200 {
            return None;
        }
        let page: serde_json::Value = serde_json::from_str(&body).ok()?;
        let records = page["records"].as_array()?;
        if records.is_empty() {
            return Some(all);
        }
        for record in records {
            let at = (record["partition"].as_u64()?, record["offset"].as_u64()?);
            let value = record["value_text"].as_str().map_or_else(|| record["value"].to_string(), str::to_string);
            all.insert(at, value);
        }
        from = page["next_from"].as_str()?.to_string();
    }
}

/// Producer ids from InitProducerId v0 (no transactional id), `count` of them over one
/// connection to the Kafka listener at `kafka`: `(error code, producer id)` each.
fn init_producer_ids(kafka: SocketAddr, count: i32) -> Vec<(i16, i64)> {
    let mut stream = TcpStream::connect(kafka).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (0..count)
        .map(|correlation| {
            // Header v1 (api key 22, version 0, correlation id, client id), then a null
            // transactional id and a transaction timeout.
            let mut request = Vec::new();
            request.extend_from_slice(&22i16.to_be_bytes());
            request.extend_from_slice(&0i16.to_be_bytes());
            request.extend_from_slice(&correlation.to_be_bytes());
            request.extend_from_slice(&4i16.to_be_bytes());
            request.extend_from_slice(b"test");
            request.extend_from_slice(&(-1i16).to_be_bytes());
            request.extend_from_slice(&60_000i32.to_be_bytes());
            let mut framed = (request.len() as i32).to_be_bytes().to_vec();
            framed.extend_from_slice(&request);
            stream.write_all(&framed).unwrap();
            let mut size = [0u8; 4];
            stream.read_exact(&mut size).unwrap();
            let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
            stream.read_exact(&mut body).unwrap();
            assert_eq!(i32::from_be_bytes(body[..4].try_into().unwrap()), correlation);
            // Correlation id, throttle time, error code, producer id, epoch.
            let error = i16::from_be_bytes(body[8..10].try_into().unwrap());
            let id = i64::from_be_bytes(body[10..18].try_into().unwrap());
            (error, id)
        })
        .collect()
}

/// A confluent-kafka (librdkafka) role of `tests/kafka/confluent/group.py`, bootstrapped at
/// every node of the cluster: its output lines, and its log for a failure's message.
struct ConfluentRole {
    process: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    log: tempfile::NamedTempFile,
}

impl ConfluentRole {
    fn start(cluster: &Cluster, role: &str, args: &[&str]) -> ConfluentRole {
        let bootstrap: Vec<String> = cluster
            .members
            .iter()
            .map(|member| member.server.as_ref().unwrap().kafka_address.unwrap().to_string())
            .collect();
        let script = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kafka/confluent/group.py");
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut process = Command::new("python3")
            .arg(script)
            .args([role, &bootstrap.join(",")])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("python3 runs");
        let lines = common::line_channel(process.stdout.take().unwrap());
        ConfluentRole { process, lines, log }
    }

    /// The last lines librdkafka and the script wrote to stderr.
    fn said(&self) -> String {
        let text = std::fs::read_to_string(self.log.path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

impl Drop for ConfluentRole {
    /// A test that fails leaves no client running.
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

impl Cluster {
    /// Kills the member at `index` with kill -9 and starts it again 200 ms later.
    fn restart(&mut self, index: usize) {
        self.members[index].server.as_mut().unwrap().kill_9();
        self.members[index].server = None;
        std::thread::sleep(Duration::from_millis(200));
        self.launch(index);
    }
}

/// Every node hands out producer ids, from blocks it reserves through the cluster: no id
/// twice, across nodes and across a node's restart.
///
/// Then an idempotent Kafka producer (librdkafka through confluent-kafka: acks=all, lz4, up to
/// five batches in flight), bootstrapped at all three nodes, writes 3 000 records while the
/// leader is killed with kill -9 five times. A batch the cluster committed just before a kill has no
/// answer, and the producer sends it again to the next leader, which read the producers'
/// states back for its term: it answers with the offsets the batch got, and stores nothing. On
/// every node, in the end: every record at the partition and offset it was acknowledged at,
/// and none stored twice.
#[test]
fn an_idempotent_kafka_producer_stores_each_record_once_through_kill_9_of_the_leader() {
    const TOTAL: usize = 3000;
    let mut cluster = Cluster::start_with(3, Kafka::AnyPort, false, None, Vec::new());
    let mut ids: Vec<(i16, i64)> = Vec::new();
    for index in [0, 1, 2, 0] {
        let kafka = cluster.members[index].server.as_ref().unwrap().kafka_address.unwrap();
        ids.extend(init_producer_ids(kafka, 2));
        if ids.len() == 6 {
            // A restarted node reserves a new block.
            cluster.restart(0);
        }
    }
    assert!(ids.iter().all(|(error, _)| *error == 0), "{ids:?}");
    let distinct: HashSet<i64> = ids.iter().map(|(_, id)| *id).collect();
    assert_eq!(distinct.len(), ids.len(), "a producer id handed out twice: {ids:?}");
    println!("producer ids from nodes 1, 2, 3 and 1 restarted: {:?}", ids.iter().map(|(_, id)| id).collect::<Vec<_>>());
    let leader = cluster.leader();
    common::sql(cluster.members[leader].http, "CREATE STREAM ledger WITH (partitions = 2)");
    let mut producer = ConfluentRole::start(&cluster, "produce", &["ledger", "0", &TOTAL.to_string()]);
    let mut kills_at = vec![2500, 2000, 1500, 1000, 500];
    let mut duplicates = 0.0;
    let mut acked: Vec<(u64, u64, String)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert!(
            Instant::now() < deadline,
            "the producer did not finish: {} acknowledged\n{}",
            acked.len(),
            producer.said()
        );
        match producer.lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => {
                let fields: Vec<&str> = line.split(' ').collect();
                assert_eq!(fields[0], "A", "a failed delivery: {line}\n{}", producer.said());
                acked.push((fields[1].parse().unwrap(), fields[2].parse().unwrap(), fields[3].to_string()));
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if kills_at.last().is_some_and(|at| acked.len() >= *at) {
            kills_at.pop();
            let leader = cluster.leader();
            duplicates += duplicates_recognised(cluster.members[leader].http);
            cluster.restart(leader);
        }
    }
    let exited = producer.process.wait().unwrap();
    assert!(exited.success(), "the producer ended with {exited:?}\n{}", producer.said());
    assert!(kills_at.is_empty(), "the producer finished before the kills");
    assert_eq!(acked.len(), TOTAL, "every record acknowledged");

    let addresses = cluster.http_addresses();
    for address in &addresses {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stored = loop {
            match placed_values(*address, "ledger") {
                Some(stored) if stored.len() >= TOTAL => break stored,
                _ => {
                    assert!(Instant::now() < deadline, "{address}: not every record there after 20 s");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        for (partition, offset, value) in &acked {
            assert_eq!(
                stored.get(&(*partition, *offset)),
                Some(value),
                "{address}: acknowledged {value} at {partition}:{offset}"
            );
        }
        let distinct: HashSet<&String> = stored.values().collect();
        assert_eq!(distinct.len(), stored.len(), "{address}: a record stored twice");
        assert_eq!(stored.len(), TOTAL, "{address}");
        duplicates += duplicates_recognised(*address);
    }
    println!("{TOTAL} records, each once on every node; batches sent again and recognised: {duplicates}");
}

/// The batches the node at `address` recognised as sent again since it started
/// (`kafka_duplicate_batches_total`).
fn duplicates_recognised(address: SocketAddr) -> f64 {
    let (_, metrics) = get(address, "/metrics");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("kafka_duplicate_batches_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// A transactional Kafka producer (librdkafka through confluent-kafka), bootstrapped at all
/// three nodes, runs 32 transactions of 40 records while the leader, which coordinates them,
/// is killed with kill -9 three times. The next leader takes the transactions up from the
/// journal every node holds: an open one stays open, a decided commit is finished. The
/// producer commits every transaction, none is aborted; on every node each is there whole,
/// and no record is there twice.
#[test]
fn kafka_transactions_stay_whole_and_once_through_kill_9_of_the_leader() {
    const TRANSACTIONS: usize = 32;
    const SIZE: usize = 40;
    let mut cluster = Cluster::start_with(3, Kafka::FixedPorts, false, None, Vec::new());
    let leader = cluster.leader();
    common::sql(cluster.members[leader].http, "CREATE STREAM payments WITH (partitions = 2)");
    let args = ["payments", &TRANSACTIONS.to_string(), &SIZE.to_string()];
    let mut producer = ConfluentRole::start(&cluster, "transactions", &args);
    let mut kills_at = vec![24, 16, 8];
    let (mut committed, mut aborted) = (Vec::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        assert!(
            Instant::now() < deadline,
            "the producer did not finish: {} committed, {} aborted\n{}\n{}",
            committed.len(),
            aborted.len(),
            producer.said(),
            cluster.said(true)
        );
        match producer.lines.recv_timeout(Duration::from_secs(1)) {
            Ok(line) => match line.split_once(' ') {
                Some(("C", n)) => committed.push(n.parse::<usize>().unwrap()),
                Some(("X", n)) => aborted.push(n.parse::<usize>().unwrap()),
                _ => panic!("the producer said {line:?}\n{}", producer.said()),
            },
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if kills_at.last().is_some_and(|at| committed.len() + aborted.len() >= *at) {
            kills_at.pop();
            let leader = cluster.leader();
            cluster.restart(leader);
        }
    }
    let exited = producer.process.wait().unwrap();
    assert!(exited.success(), "the producer ended with {exited:?}\n{}\n{}", producer.said(), cluster.said(true));
    assert!(kills_at.is_empty(), "the producer finished before the kills");
    assert_eq!(committed.len() + aborted.len(), TRANSACTIONS, "every transaction ended");
    // A leader change loses no transaction: the next leader takes each open one up, and its
    // producer commits it. (With the journal kept by one node, each kill cost one.)
    assert!(aborted.is_empty(), "transactions aborted across a change of leader: {aborted:?}\n{}", producer.said());

    let expected: BTreeMap<String, usize> =
        committed.iter().flat_map(|n| (0..SIZE).map(move |k| (format!("t{n}-{k}"), *n))).collect();
    for address in cluster.http_addresses() {
        let deadline = Instant::now() + Duration::from_secs(20);
        let stored = loop {
            match placed_values(address, "payments") {
                Some(stored) if stored.len() >= expected.len() => break stored,
                _ => {
                    assert!(Instant::now() < deadline, "{address}: not every committed record there after 20 s");
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        let mut counted: BTreeMap<&String, usize> = BTreeMap::new();
        for value in stored.values() {
            *counted.entry(value).or_default() += 1;
        }
        let twice: Vec<&&String> = counted.iter().filter(|(_, count)| **count > 1).map(|(value, _)| value).collect();
        assert!(twice.is_empty(), "{address}: stored twice: {twice:?}");
        let stray: Vec<&&String> = counted.keys().filter(|value| !expected.contains_key(**value)).collect();
        assert!(stray.is_empty(), "{address}: records of transactions not committed: {stray:?}");
        let missing = expected.keys().filter(|value| !counted.contains_key(value)).count();
        assert_eq!(missing, 0, "{address}: records of committed transactions missing");
    }
    println!(
        "{TRANSACTIONS} transactions through three kills of the leader: {} committed, whole on every node",
        committed.len()
    );
}

/// A write to a node that cannot reach a majority is answered (503 `unconfirmed`, MQTT's
/// PUBACK refusal), never left waiting: a leader with both followers down refuses at once
/// (check quorum), a follower left alone finds no leader within the proposal timeout. The lone
/// follower stands for no election it could not win (pre-vote), so its term stays where it
/// was, and once the others are back the cluster commits again without being disturbed by it.
#[test]
fn a_node_without_a_majority_answers_its_writes_and_its_term_stays() {
    let mut cluster = Cluster::start(3);
    let leader = cluster.leader();
    let http = cluster.http_addresses();
    let (code, body) = common::request_with(http[leader], None, "POST", "/streams/events", "{\"n\":0}").unwrap();
    assert_eq!(code, 200, "{body}");
    let followers: Vec<usize> = (0..3).filter(|index| *index != leader).collect();

    // The leader alone.
    for &follower in &followers {
        cluster.members[follower].server.as_mut().unwrap().kill_9();
        cluster.members[follower].server = None;
    }
    // The lone leader's write carries an idempotency key, so that its retry, once the cluster
    // is back, cannot store it twice whether or not it was committed.
    let key = "Idempotency-Key: lone-leader-1";
    let curl_post = |address: SocketAddr, headers: &[&str]| {
        let headers: Vec<&str> = headers.iter().flat_map(|header| ["-H", *header]).collect();
        let output = Command::new("curl")
            .args([
                "-s",
                "-o",
                "/dev/stderr",
                "-w",
                "%{http_code}",
                "--max-time",
                "120",
                "-X",
                "POST",
                "-d",
                "{\"n\":1}",
            ])
            .args(headers)
            .arg(format!("http://{address}/streams/events"))
            .output()
            .unwrap();
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let (code, body) = curl_post(http[leader], &[key]);
    assert_eq!(code, "503", "the write is answered, not left waiting: {body}");
    assert!(body.contains("unconfirmed"), "{body}");
    let mqtt = cluster.members[leader].server.as_ref().unwrap().mqtt_address;
    let published = Command::new("timeout")
        .args(["120", "mosquitto_pub", "-h", "127.0.0.1", "-p", &mqtt.port().to_string(), "-V", "mqttv5", "-q", "1"])
        .args(["-t", "events/mqtt", "-m", "{\"n\":2}"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&published.stderr);
    assert_ne!(published.status.code(), Some(124), "the QoS 1 publish was answered: {said}");
    // mosquitto_pub exits 0 and warns of a PUBACK that refuses.
    assert!(said.contains("Publish 1 failed") && said.contains("not confirmed"), "refused in its PUBACK: {said}");

    // A follower alone: the leader and the other follower down.
    cluster.members[leader].server.as_mut().unwrap().kill_9();
    cluster.members[leader].server = None;
    let alone = followers[0];
    cluster.launch(alone);
    let (code, body) = curl_post(http[alone], &[]);
    assert_eq!(code, "503", "{body}");
    let term = |cluster: &Cluster| status(cluster.members[alone].http).and_then(|status| status["term"].as_u64());
    let before = term(&cluster).expect("the node answers its status");
    // Without pre-vote its term would rise with each election timeout (0.5 to 1 s).
    std::thread::sleep(Duration::from_secs(4));
    let after = term(&cluster).expect("the node answers its status");
    assert!(after <= before + 1, "the lone node's term went from {before} to {after}\n{}", cluster.said(false));

    // The others come back: a leader is elected and writes commit on every node.
    cluster.launch(leader);
    cluster.launch(followers[1]);
    let leader = cluster.leader();
    let (code, body) = common::request_with(http[leader], None, "POST", "/streams/events", "{\"n\":3}").unwrap();
    assert_eq!(code, 200, "{body}");
    // The lone leader's write, retried with its key on another node: answered with its place if
    // the cluster committed it, written now if not; stored once either way. The follower
    // alone wrote nothing (it never had a leader to take its write).
    let other = (leader + 1) % 3;
    let (code, body) = curl_post(http[other], &[key]);
    assert_eq!(code, "200", "{body}");
    let (code, body) = curl_post(http[other], &[key]);
    assert_eq!(code, "200", "a second retry is answered alike: {body}");
    let (status, page) = common::get(http[leader], "/streams/events?from=earliest&limit=100");
    assert_eq!(status, 200, "{page}");
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    let ones =
        page["records"].as_array().unwrap().iter().filter(|record| record["value"] == serde_json::json!({"n": 1}));
    assert_eq!(ones.count(), 1, "the keyed write is stored once: {page}");
}
