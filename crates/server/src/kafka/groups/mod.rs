//! Consumer groups, with the classic rebalance protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup), as Kafka's group coordinator runs it; this server coordinates every group.
//!
//! A group is `Empty`, `PreparingRebalance` (members rejoin: each JoinGroup waits until every
//! known member has rejoined, or the rebalance timeout drops those that did not),
//! `CompletingRebalance` (the new generation is set; the leader, who got every member's
//! metadata, sends the assignment in its SyncGroup, which the others wait for) or `Stable`.
//! A member that sends nothing for its session timeout is removed, and the group rebalances;
//! so does a member that leaves. Heartbeats during a rebalance answer `REBALANCE_IN_PROGRESS`,
//! which tells a member to rejoin.
//!
//! Committed offsets are durable ([`committed`]), and so is each group's membership as of its
//! last completed rebalance (stored within a tick of it): after a restart the members are
//! still known and carry on, as with Kafka's coordinator failover.
//!
//! Static membership (KIP-345, `group.instance.id`): an instance id names a member across its
//! restarts. A member that comes back under its instance id (with no member id) takes the
//! place of its earlier self, which is fenced (`FENCED_INSTANCE_ID`): in a stable group whose
//! member asks for what it asked for before, with no rebalance at all, its assignment handed
//! back at once (a leader is told to skip the assignment, JoinGroup v9); otherwise the group
//! rebalances as for any rejoin. Like any member, a static one is removed once its session
//! timeout passes without a word, and a LeaveGroup may name it by its instance id alone.
//! KIP-848's consumer protocol is not served.

pub mod api;
pub mod committed;

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use tokio::sync::oneshot;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use committed::{CommittedOffsets, StoredGroup, StoredMember};

/// The session timeouts a member may ask for (Kafka's group.min/max.session.timeout.ms).
const SESSION_TIMEOUT_MIN: Duration = Duration::from_secs(6);
const SESSION_TIMEOUT_MAX: Duration = Duration::from_secs(30 * 60);
/// How often timeouts are looked at.
pub(super) const TICK: Duration = Duration::from_millis(100);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// What a JoinGroup is answered with once the rebalance it joined completes.
#[derive(Clone, Debug, Default)]
pub struct Joined {
    pub error: i16,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub member_id: String,
    /// For the leader: every member's id, instance id and metadata for the chosen protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
    /// A static leader back in a stable group: the assignment stands, it need not send one.
    pub skip_assignment: bool,
}

/// What a SyncGroup is answered with.
#[derive(Clone, Debug, Default)]
pub struct Synced {
    pub error: i16,
    pub protocol_type: String,
    pub protocol: String,
    pub assignment: Bytes,
}

/// A member as described to DescribeGroups.
pub struct DescribedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as described to DescribeGroups and ListGroups.
pub struct Described {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<DescribedMember>,
}

struct Member {
    instance_id: Option<String>,
    client_id: String,
    host: String,
    session_timeout: Duration,
    rebalance_timeout: Duration,
    protocol_type: String,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    /// Its JoinGroup, waiting for the rebalance to complete.
    joining: Option<oneshot::Sender<Joined>>,
    last_seen: Instant,
}

struct Group {
    state: GroupState,
    generation: i32,
    protocol_type: String,
    protocol: String,
    leader: Option<String>,
    /// In join order: the first is the leader when a new one is chosen.
    members: BTreeMap<u64, String>,
    by_id: HashMap<String, (u64, Member)>,
    /// When the rebalance under way gives up on members that did not rejoin, or (completing)
    /// on the leader's assignment.
    deadline: Option<Instant>,
    syncing: Vec<(String, oneshot::Sender<Synced>)>,
    /// Its membership changed in a way worth storing (a rebalance completed, or it emptied).
    unsaved: bool,
}

impl Group {
    fn new() -> Group {
        Group {
            state: GroupState::Empty,
            generation: 0,
            protocol_type: String::new(),
            protocol: String::new(),
            leader: None,
            members: BTreeMap::new(),
            by_id: HashMap::new(),
            deadline: None,
            syncing: Vec::new(),
            unsaved: false,
        }
    }

    /// A group stored at its last rebalance, as it was: stable, its members given a session
    /// timeout from now to show up.
    fn restored(stored: StoredGroup, now: Instant) -> Group {
        let mut group = Group::new();
        group.generation = stored.generation;
        group.protocol_type = stored.protocol_type;
        group.protocol = stored.protocol;
        group.leader = stored.leader;
        for (order, member) in stored.members.into_iter().enumerate() {
            let decode = |text: &str| Bytes::from(BASE64.decode(text).unwrap_or_default());
            group.members.insert(order as u64, member.id.clone());
            let restored = Member {
                instance_id: member.instance_id,
                client_id: member.client_id,
                host: member.host,
                session_timeout: Duration::from_millis(member.session_timeout_ms),
                rebalance_timeout: Duration::from_millis(member.rebalance_timeout_ms),
                protocol_type: member.protocol_type,
                protocols: member.protocols.iter().map(|(name, metadata)| (name.clone(), decode(metadata))).collect(),
                assignment: decode(&member.assignment),
                joining: None,
                last_seen: now,
            };
            group.by_id.insert(member.id, (order as u64, restored));
        }
        group.state = if group.by_id.is_empty() { GroupState::Empty } else { GroupState::Stable };
        group
    }

    /// What is stored of it: its members as the last rebalance left them; `None` when empty.
    fn stored(&self) -> Option<StoredGroup> {
        if self.by_id.is_empty() {
            return None;
        }
        let members = self
            .members
            .values()
            .map(|id| {
                let member = &self.by_id[id].1;
                StoredMember {
                    id: id.clone(),
                    instance_id: member.instance_id.clone(),
                    client_id: member.client_id.clone(),
                    host: member.host.clone(),
                    session_timeout_ms: member.session_timeout.as_millis() as u64,
                    rebalance_timeout_ms: member.rebalance_timeout.as_millis() as u64,
                    protocol_type: member.protocol_type.clone(),
                    protocols: member
                        .protocols
                        .iter()
                        .map(|(name, metadata)| (name.clone(), BASE64.encode(metadata)))
                        .collect(),
                    assignment: BASE64.encode(&member.assignment),
                }
            })
            .collect();
        Some(StoredGroup {
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            members,
        })
    }

    fn member(&mut self, id: &str) -> Option<&mut Member> {
        self.by_id.get_mut(id).map(|(_, member)| member)
    }

    /// The member id the static member `instance` has now.
    fn member_of_instance(&self, instance: &str) -> Option<String> {
        self.by_id
            .iter()
            .find(|(_, (_, member))| member.instance_id.as_deref() == Some(instance))
            .map(|(id, _)| id.clone())
    }

    /// Whether `member_id`, naming itself the static member `instance`, is fenced: that
    /// instance is a member under another id now (a later start of the same instance).
    fn fenced(&self, member_id: &str, instance: Option<&str>) -> bool {
        instance.and_then(|instance| self.member_of_instance(instance)).is_some_and(|current| current != member_id)
    }

    /// Every member's id, instance id and metadata for `protocol`, in join order.
    fn everyone(&self, protocol: &str) -> Vec<(String, Option<String>, Bytes)> {
        self.members
            .values()
            .map(|id| {
                let member = &self.by_id[id].1;
                let metadata = member
                    .protocols
                    .iter()
                    .find(|(name, _)| *name == protocol)
                    .map(|(_, metadata)| metadata.clone())
                    .unwrap_or_default();
                (id.clone(), member.instance_id.clone(), metadata)
            })
            .collect()
    }

    /// The static member `old` back as `new` (its instance started again): it takes `old`'s
    /// place, assignment and leadership, and `old` is fenced. In a stable group asked for the
    /// same protocol metadata, it is answered at once with the generation as it is; otherwise
    /// it rejoins as any member does.
    fn rejoin_static(
        &mut self,
        old: &str,
        new: String,
        request: JoinRequest,
        now: Instant,
    ) -> oneshot::Receiver<Joined> {
        let (order, mut member) = self.by_id.remove(old).expect("the static member is in the group");
        let fenced = ResponseError::FencedInstanceId.code();
        if let Some(joining) = member.joining.take() {
            let _ = joining.send(Joined { error: fenced, ..Joined::default() });
        }
        for (_, waiting) in self.syncing.extract_if(.., |(id, _)| id == old) {
            let _ = waiting.send(Synced { error: fenced, ..Synced::default() });
        }
        let asked = |protocols: &[(String, Bytes)]| {
            protocols.iter().find(|(name, _)| *name == self.protocol).map(|(_, metadata)| metadata.clone())
        };
        let unchanged = self.state == GroupState::Stable
            && member.protocol_type == request.protocol_type
            && asked(&member.protocols).is_some()
            && asked(&member.protocols) == asked(&request.protocols);
        member.protocols = request.protocols;
        member.session_timeout = request.session_timeout;
        member.rebalance_timeout = request.rebalance_timeout;
        member.client_id = request.client_id;
        member.host = request.host;
        member.last_seen = now;
        self.members.insert(order, new.clone());
        self.by_id.insert(new.clone(), (order, member));
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(new.clone());
        }
        self.unsaved = true;
        tracing::info!(old = %old, new = %new, "Kafka static group member back under its instance id");
        let (sender, receiver) = oneshot::channel();
        if unchanged {
            let leader = self.leader.clone().unwrap_or_default();
            let is_leader = leader == new;
            let _ = sender.send(Joined {
                error: 0,
                generation: self.generation,
                protocol_type: self.protocol_type.clone(),
                protocol: self.protocol.clone(),
                leader,
                members: if is_leader { self.everyone(&self.protocol) } else { Vec::new() },
                member_id: new,
                skip_assignment: is_leader,
            });
        } else {
            self.by_id.get_mut(&new).expect("just inserted").1.joining = Some(sender);
            if self.state != GroupState::PreparingRebalance {
                self.prepare_rebalance(now);
            }
            self.complete_join_if_ready(false, now);
        }
        receiver
    }

    fn remove(&mut self, id: &str) {
        if let Some((order, member)) = self.by_id.remove(id) {
            self.members.remove(&order);
            if let Some(joining) = member.joining {
                let _ = joining.send(Joined { error: ResponseError::UnknownMemberId.code(), ..Joined::default() });
            }
        }
        if self.leader.as_deref() == Some(id) {
            self.leader = None;
        }
    }

    /// Starts a rebalance: members must rejoin; syncs waiting are told so.
    fn prepare_rebalance(&mut self, now: Instant) {
        if self.by_id.is_empty() {
            self.state = GroupState::Empty;
            self.deadline = None;
            self.unsaved = true;
            return;
        }
        let timeout = self.by_id.values().map(|(_, member)| member.rebalance_timeout).max().unwrap_or_default();
        self.state = GroupState::PreparingRebalance;
        self.deadline = Some(now + timeout);
        for (_, waiting) in self.syncing.drain(..) {
            let _ = waiting.send(Synced { error: ResponseError::RebalanceInProgress.code(), ..Synced::default() });
        }
    }

    /// Completes the join once every member has rejoined (or, `forced`, at the deadline,
    /// dropping those that did not).
    fn complete_join_if_ready(&mut self, forced: bool, now: Instant) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let missing: Vec<String> =
            self.by_id.iter().filter(|(_, (_, member))| member.joining.is_none()).map(|(id, _)| id.clone()).collect();
        if !missing.is_empty() && !forced {
            return;
        }
        for id in &missing {
            self.remove(id);
        }
        self.generation += 1;
        if self.by_id.is_empty() {
            self.state = GroupState::Empty;
            self.deadline = None;
            self.unsaved = true;
            return;
        }
        let leader = match self.leader.clone().filter(|leader| self.by_id.contains_key(leader)) {
            Some(leader) => leader,
            None => self.members.values().next().cloned().expect("a member"),
        };
        // The protocol: the leader's first choice every member supports.
        let supported_by_all = |name: &str| {
            self.by_id.values().all(|(_, member)| member.protocols.iter().any(|(theirs, _)| theirs == name))
        };
        let protocol = self.by_id[&leader]
            .1
            .protocols
            .iter()
            .map(|(name, _)| name.clone())
            .find(|name| supported_by_all(name))
            .unwrap_or_default();
        self.protocol_type = self.by_id[&leader].1.protocol_type.clone();
        self.protocol = protocol.clone();
        self.leader = Some(leader.clone());
        self.state = GroupState::CompletingRebalance;
        // The leader has the rebalance timeout to send the assignment.
        let timeout = self.by_id.values().map(|(_, member)| member.rebalance_timeout).max().unwrap_or_default();
        self.deadline = Some(now + timeout);
        let everyone = self.everyone(&protocol);
        for (id, (_, member)) in self.by_id.iter_mut() {
            member.last_seen = now;
            if let Some(joining) = member.joining.take() {
                let _ = joining.send(Joined {
                    error: 0,
                    generation: self.generation,
                    protocol_type: self.protocol_type.clone(),
                    protocol: protocol.clone(),
                    leader: leader.clone(),
                    member_id: id.clone(),
                    members: if *id == leader { everyone.clone() } else { Vec::new() },
                    skip_assignment: false,
                });
            }
        }
    }
}

/// A JoinGroup, as the coordinator needs it.
pub struct JoinRequest {
    pub group: String,
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
}

pub struct Coordinator {
    groups: Mutex<HashMap<String, Group>>,
    pub offsets: CommittedOffsets,
    next_member: AtomicU64,
}

impl Coordinator {
    /// The coordinator, with the groups stored at their last rebalance.
    pub fn new(offsets: CommittedOffsets) -> Coordinator {
        let now = Instant::now();
        let groups =
            offsets.take_restored().into_iter().map(|(id, stored)| (id, Group::restored(stored, now))).collect();
        Coordinator { groups: Mutex::new(groups), offsets, next_member: AtomicU64::new(0) }
    }

    /// Joins (or rejoins) a group; the receiver resolves when the rebalance completes.
    pub fn join(&self, request: JoinRequest) -> Result<oneshot::Receiver<Joined>, i16> {
        if request.session_timeout < SESSION_TIMEOUT_MIN || request.session_timeout > SESSION_TIMEOUT_MAX {
            return Err(ResponseError::InvalidSessionTimeout.code());
        }
        if request.protocols.is_empty() || request.protocol_type.is_empty() {
            return Err(ResponseError::InconsistentGroupProtocol.code());
        }
        if request.group.is_empty() {
            return Err(ResponseError::InvalidGroupId.code());
        }
        let now = Instant::now();
        let mut groups = self.groups.lock().expect("groups lock");
        let group = groups.entry(request.group.clone()).or_insert_with(Group::new);
        let known = !request.member_id.is_empty();
        if known && group.fenced(&request.member_id, request.instance_id.as_deref()) {
            return Err(ResponseError::FencedInstanceId.code());
        }
        if known && !group.by_id.contains_key(&request.member_id) {
            return Err(ResponseError::UnknownMemberId.code());
        }
        let returning = request.instance_id.as_deref().and_then(|instance| group.member_of_instance(instance));
        let others_share_a_protocol =
            group.by_id.iter().filter(|(id, _)| **id != request.member_id).all(|(_, (_, member))| {
                member.protocol_type == request.protocol_type
                    && request
                        .protocols
                        .iter()
                        .any(|(name, _)| member.protocols.iter().any(|(theirs, _)| theirs == name))
            });
        if !others_share_a_protocol {
            return Err(ResponseError::InconsistentGroupProtocol.code());
        }
        let id = if known {
            request.member_id.clone()
        } else {
            let number = self.next_member.fetch_add(1, Ordering::Relaxed);
            let prefix = request.instance_id.as_deref().unwrap_or(&request.client_id);
            format!("{}-{number:016x}", if prefix.is_empty() { "member" } else { prefix })
        };
        if !known && let Some(old) = returning {
            return Ok(group.rejoin_static(&old, id, request, now));
        }
        let (sender, receiver) = oneshot::channel();
        match group.member(&id) {
            Some(member) => {
                // A second JoinGroup of the same member replaces the first (answered as fenced).
                if let Some(old) = member.joining.replace(sender) {
                    let _ = old.send(Joined { error: ResponseError::UnknownMemberId.code(), ..Joined::default() });
                }
                member.protocols = request.protocols;
                member.session_timeout = request.session_timeout;
                member.rebalance_timeout = request.rebalance_timeout;
                member.last_seen = now;
            }
            None => {
                let order = group.members.keys().next_back().map_or(0, |last| last + 1);
                group.members.insert(order, id.clone());
                let member = Member {
                    instance_id: request.instance_id,
                    client_id: request.client_id,
                    host: request.host,
                    session_timeout: request.session_timeout,
                    rebalance_timeout: request.rebalance_timeout,
                    protocol_type: request.protocol_type,
                    protocols: request.protocols,
                    assignment: Bytes::new(),
                    joining: Some(sender),
                    last_seen: now,
                };
                group.by_id.insert(id.clone(), (order, member));
            }
        }
        if group.state != GroupState::PreparingRebalance {
            group.prepare_rebalance(now);
        }
        group.complete_join_if_ready(false, now);
        Ok(receiver)
    }

    /// SyncGroup: the leader's assignment, or (for the others) waiting for it.
    pub fn sync(
        &self,
        group_id: &str,
        member: (&str, Option<&str>),
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<oneshot::Receiver<Synced>, i16> {
        let (member_id, instance) = member;
        let now = Instant::now();
        let mut groups = self.groups.lock().expect("groups lock");
        let Some(group) = groups.get_mut(group_id) else { return Err(ResponseError::UnknownMemberId.code()) };
        if group.fenced(member_id, instance) {
            return Err(ResponseError::FencedInstanceId.code());
        }
        let Some(member) = group.member(member_id) else { return Err(ResponseError::UnknownMemberId.code()) };
        member.last_seen = now;
        if generation != group.generation {
            return Err(ResponseError::IllegalGeneration.code());
        }
        let (sender, receiver) = oneshot::channel();
        match group.state {
            GroupState::Empty => return Err(ResponseError::UnknownMemberId.code()),
            GroupState::PreparingRebalance => return Err(ResponseError::RebalanceInProgress.code()),
            GroupState::Stable => {
                let assignment = group.member(member_id).map(|member| member.assignment.clone()).unwrap_or_default();
                let _ = sender.send(Synced {
                    error: 0,
                    protocol_type: group.protocol_type.clone(),
                    protocol: group.protocol.clone(),
                    assignment,
                });
            }
            GroupState::CompletingRebalance => {
                group.syncing.push((member_id.to_string(), sender));
                if group.leader.as_deref() == Some(member_id) {
                    let mut assigned: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for (id, (_, member)) in group.by_id.iter_mut() {
                        member.assignment = assigned.remove(id).unwrap_or_default();
                    }
                    group.state = GroupState::Stable;
                    group.deadline = None;
                    group.unsaved = true;
                    for (id, waiting) in std::mem::take(&mut group.syncing) {
                        let assignment = group.member(&id).map(|member| member.assignment.clone()).unwrap_or_default();
                        let _ = waiting.send(Synced {
                            error: 0,
                            protocol_type: group.protocol_type.clone(),
                            protocol: group.protocol.clone(),
                            assignment,
                        });
                    }
                }
            }
        }
        Ok(receiver)
    }

    /// Heartbeat: 0, or the error telling the member what to do.
    pub fn heartbeat(&self, group_id: &str, member: (&str, Option<&str>), generation: i32) -> i16 {
        let (member_id, instance) = member;
        let mut groups = self.groups.lock().expect("groups lock");
        let Some(group) = groups.get_mut(group_id) else { return ResponseError::UnknownMemberId.code() };
        if group.fenced(member_id, instance) {
            return ResponseError::FencedInstanceId.code();
        }
        let state = group.state;
        let current = group.generation;
        let Some(member) = group.member(member_id) else { return ResponseError::UnknownMemberId.code() };
        member.last_seen = Instant::now();
        match state {
            GroupState::Empty => ResponseError::UnknownMemberId.code(),
            GroupState::PreparingRebalance => ResponseError::RebalanceInProgress.code(),
            _ if generation != current => ResponseError::IllegalGeneration.code(),
            _ => 0,
        }
    }

    /// LeaveGroup of one member, named by its member id, or (a static member) by its instance
    /// id, or both: 0, or why not.
    pub fn leave(&self, group_id: &str, member: (&str, Option<&str>)) -> i16 {
        let (member_id, instance) = member;
        let mut groups = self.groups.lock().expect("groups lock");
        let Some(group) = groups.get_mut(group_id) else { return ResponseError::UnknownMemberId.code() };
        let member_id = match (member_id, instance) {
            ("", Some(instance)) => match group.member_of_instance(instance) {
                Some(id) => id,
                None => return ResponseError::UnknownMemberId.code(),
            },
            (id, instance) if group.fenced(id, instance) => return ResponseError::FencedInstanceId.code(),
            (id, _) => id.to_string(),
        };
        let member_id = member_id.as_str();
        if !group.by_id.contains_key(member_id) {
            return ResponseError::UnknownMemberId.code();
        }
        group.remove(member_id);
        let now = Instant::now();
        if group.state == GroupState::PreparingRebalance {
            group.complete_join_if_ready(false, now);
        } else {
            group.prepare_rebalance(now);
        }
        0
    }

    /// Whether `member_id` at `generation` may commit offsets for `group_id`: 0, or why not.
    /// A commit with no generation (-1) is a standalone consumer's, allowed while the group
    /// has no members.
    pub fn may_commit(&self, group_id: &str, member: (&str, Option<&str>), generation: i32) -> i16 {
        let (member_id, instance) = member;
        if group_id.is_empty() {
            return ResponseError::InvalidGroupId.code();
        }
        let mut groups = self.groups.lock().expect("groups lock");
        let Some(group) = groups.get_mut(group_id) else {
            return if generation < 0 { 0 } else { ResponseError::IllegalGeneration.code() };
        };
        if generation >= 0 && group.fenced(member_id, instance) {
            return ResponseError::FencedInstanceId.code();
        }
        if generation < 0 {
            return if group.by_id.is_empty() { 0 } else { ResponseError::UnknownMemberId.code() };
        }
        let state = group.state;
        let current = group.generation;
        let Some(member) = group.member(member_id) else { return ResponseError::UnknownMemberId.code() };
        member.last_seen = Instant::now();
        if generation != current {
            return ResponseError::IllegalGeneration.code();
        }
        // As Kafka: a member of the current generation commits while a rebalance is being
        // prepared (its last commit before it rejoins), not between the join and the sync.
        match state {
            GroupState::Stable | GroupState::PreparingRebalance => 0,
            _ => ResponseError::RebalanceInProgress.code(),
        }
    }

    /// Expires members past their session timeout and rebalances that ran out of time; returns
    /// the memberships to store (a rebalance completed, or a group emptied) since the last tick.
    pub fn tick(&self) -> Vec<(String, Option<StoredGroup>)> {
        let now = Instant::now();
        let mut groups = self.groups.lock().expect("groups lock");
        for group in groups.values_mut() {
            let expired: Vec<String> = group
                .by_id
                .iter()
                .filter(|(_, (_, member))| member.joining.is_none() && now > member.last_seen + member.session_timeout)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &expired {
                tracing::info!(member = %id, "Kafka group member removed: no heartbeat within its session timeout");
                group.remove(id);
            }
            let overdue = group.deadline.is_some_and(|deadline| now >= deadline);
            match group.state {
                GroupState::PreparingRebalance if overdue => group.complete_join_if_ready(true, now),
                GroupState::PreparingRebalance => group.complete_join_if_ready(false, now),
                GroupState::CompletingRebalance if overdue || !expired.is_empty() => group.prepare_rebalance(now),
                GroupState::Stable if !expired.is_empty() => group.prepare_rebalance(now),
                _ => {}
            }
        }
        let mut unsaved = Vec::new();
        for (id, group) in groups.iter_mut().filter(|(_, group)| group.unsaved) {
            group.unsaved = false;
            unsaved.push((id.clone(), group.stored()));
        }
        // An empty group's offsets are the store's; its membership record goes.
        groups.retain(|_, group| group.state != GroupState::Empty || !group.by_id.is_empty());
        unsaved
    }

    /// Every group with members or committed offsets, with its state and protocol type.
    pub fn list(&self) -> Vec<(String, GroupState, String)> {
        let groups = self.groups.lock().expect("groups lock");
        let mut listed: BTreeMap<String, (GroupState, String)> =
            groups.iter().map(|(id, group)| (id.clone(), (group.state, group.protocol_type.clone()))).collect();
        for id in self.offsets.groups() {
            listed.entry(id).or_insert((GroupState::Empty, "consumer".into()));
        }
        listed.into_iter().map(|(id, (state, kind))| (id, state, kind)).collect()
    }

    /// A group's state and members; `None` when nothing is known of it.
    pub fn describe(&self, group_id: &str) -> Option<Described> {
        let groups = self.groups.lock().expect("groups lock");
        match groups.get(group_id) {
            Some(group) => Some(Described {
                state: group.state,
                protocol_type: group.protocol_type.clone(),
                protocol: group.protocol.clone(),
                members: group
                    .members
                    .values()
                    .map(|id| {
                        let member = &group.by_id[id].1;
                        DescribedMember {
                            member_id: id.clone(),
                            instance_id: member.instance_id.clone(),
                            client_id: member.client_id.clone(),
                            host: member.host.clone(),
                            metadata: member
                                .protocols
                                .iter()
                                .find(|(name, _)| *name == group.protocol)
                                .map(|(_, metadata)| metadata.clone())
                                .unwrap_or_default(),
                            assignment: member.assignment.clone(),
                        }
                    })
                    .collect(),
            }),
            None if !self.offsets.of_group(group_id).is_empty() => Some(Described {
                state: GroupState::Empty,
                protocol_type: "consumer".into(),
                protocol: String::new(),
                members: Vec::new(),
            }),
            None => None,
        }
    }

    /// Whether `group_id` has members now (a group with members cannot be deleted).
    pub fn has_members(&self, group_id: &str) -> bool {
        self.groups.lock().expect("groups lock").get(group_id).is_some_and(|group| !group.by_id.is_empty())
    }

    /// Forgets an empty group's membership record (its offsets are the store's).
    pub fn forget(&self, group_id: &str) {
        let mut groups = self.groups.lock().expect("groups lock");
        if groups.get(group_id).is_some_and(|group| group.by_id.is_empty()) {
            groups.remove(group_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(coordinator: &Coordinator, member_id: &str, client: &str) -> oneshot::Receiver<Joined> {
        coordinator
            .join(JoinRequest {
                group: "g".into(),
                member_id: member_id.into(),
                instance_id: None,
                client_id: client.into(),
                host: "/127.0.0.1".into(),
                session_timeout: Duration::from_secs(10),
                rebalance_timeout: Duration::from_secs(30),
                protocol_type: "consumer".into(),
                protocols: vec![("range".into(), Bytes::from(client.to_string()))],
            })
            .unwrap()
    }

    /// A static member's JoinGroup: `member_id` empty when it (re)starts.
    fn join_as(
        coordinator: &Coordinator,
        member_id: &str,
        instance: &str,
        metadata: &str,
    ) -> oneshot::Receiver<Joined> {
        coordinator
            .join(JoinRequest {
                group: "g".into(),
                member_id: member_id.into(),
                instance_id: Some(instance.into()),
                client_id: "c".into(),
                host: "/127.0.0.1".into(),
                session_timeout: Duration::from_secs(10),
                rebalance_timeout: Duration::from_secs(30),
                protocol_type: "consumer".into(),
                protocols: vec![("range".into(), Bytes::from(metadata.to_string()))],
            })
            .unwrap()
    }

    fn join_static(coordinator: &Coordinator, instance: &str, metadata: &str) -> oneshot::Receiver<Joined> {
        join_as(coordinator, "", instance, metadata)
    }

    #[tokio::test]
    async fn a_static_member_back_under_its_instance_id_gets_its_assignment_with_no_rebalance() {
        let dir = tempfile::tempdir().unwrap();
        let engine = std::sync::Arc::new(
            onehop_engine::Engine::open_in(dir.path(), onehop_engine::EngineOptions::default()).unwrap(),
        );
        let coordinator = Coordinator::new(CommittedOffsets::open(&engine).unwrap());
        let fenced = ResponseError::FencedInstanceId.code();
        let first = join_static(&coordinator, "i-a", "topics").await.unwrap();
        let a = first.member_id.clone();
        assert!(a.starts_with("i-a-"), "{a}");
        let mut b = join_static(&coordinator, "i-b", "topics");
        let rejoined = join_as(&coordinator, &a, "i-a", "topics").await.unwrap();
        let b = b.try_recv().unwrap().member_id;
        assert_eq!(rejoined.generation, 2);
        let assignments = vec![(a.clone(), Bytes::from("p0")), (b.clone(), Bytes::from("p1"))];
        let mut waiting = coordinator.sync("g", (&b, Some("i-b")), 2, Vec::new()).unwrap();
        coordinator.sync("g", (&a, Some("i-a")), 2, assignments).unwrap().await.unwrap();
        assert_eq!(&waiting.try_recv().unwrap().assignment[..], b"p1");

        // b restarts (its process was killed: no LeaveGroup) and comes back as itself: answered
        // at once, in the same generation, and a is not asked to rejoin.
        let back = join_static(&coordinator, "i-b", "topics").await.unwrap();
        assert_eq!((back.error, back.generation, back.leader.as_str()), (0, 2, a.as_str()));
        assert!(!back.skip_assignment && back.members.is_empty(), "not the leader");
        let new_b = back.member_id.clone();
        assert_ne!(new_b, b);
        assert_eq!(coordinator.heartbeat("g", (&a, Some("i-a")), 2), 0, "no rebalance");
        let synced = coordinator.sync("g", (&new_b, Some("i-b")), 2, Vec::new()).unwrap().await.unwrap();
        assert_eq!(&synced.assignment[..], b"p1", "its partitions handed back");
        // Its earlier self is fenced, by instance id or not at all a member any more.
        assert_eq!(coordinator.heartbeat("g", (&b, Some("i-b")), 2), fenced);
        assert_eq!(coordinator.heartbeat("g", (&b, None), 2), ResponseError::UnknownMemberId.code());
        assert_eq!(coordinator.may_commit("g", (&b, Some("i-b")), 2), fenced);
        assert_eq!(coordinator.may_commit("g", (&new_b, Some("i-b")), 2), 0);

        // The leader comes back: it learns the members but keeps the assignment.
        let leader = join_static(&coordinator, "i-a", "topics").await.unwrap();
        assert_eq!((leader.generation, leader.leader.clone()), (2, leader.member_id.clone()));
        assert!(leader.skip_assignment);
        assert_eq!(leader.members.len(), 2);
        let new_a = leader.member_id.clone();
        assert_eq!(coordinator.heartbeat("g", (&new_b, Some("i-b")), 2), 0);

        // Back asking for something else (a new subscription): the group rebalances.
        let mut changed = join_static(&coordinator, "i-b", "other topics");
        assert!(changed.try_recv().is_err(), "it waits for the rebalance");
        assert_eq!(coordinator.heartbeat("g", (&new_a, Some("i-a")), 2), ResponseError::RebalanceInProgress.code());
        let rejoined = join_as(&coordinator, &new_a, "i-a", "topics").await.unwrap();
        assert_eq!(rejoined.generation, 3);
        let changed = changed.await.unwrap();
        assert_eq!(changed.generation, 3);

        // A LeaveGroup naming only the instance removes it (the admin's removeMembers).
        assert_eq!(coordinator.leave("g", ("", Some("i-b"))), 0);
        assert_eq!(coordinator.leave("g", ("", Some("i-b"))), ResponseError::UnknownMemberId.code());
        assert_eq!(coordinator.leave("g", ("not-a", Some("i-a"))), fenced);
    }

    #[tokio::test]
    async fn members_join_sync_rebalance_and_are_restored_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let engine = std::sync::Arc::new(
            onehop_engine::Engine::open_in(dir.path(), onehop_engine::EngineOptions::default()).unwrap(),
        );
        let coordinator = Coordinator::new(CommittedOffsets::open(&engine).unwrap());

        // One member: the join completes at once, and it leads.
        let first = join(&coordinator, "", "a").await.unwrap();
        assert_eq!((first.error, first.generation, first.members.len()), (0, 1, 1));
        assert_eq!(first.leader, first.member_id);
        let a = first.member_id.clone();
        let synced =
            coordinator.sync("g", (&a, None), 1, vec![(a.clone(), Bytes::from("all"))]).unwrap().await.unwrap();
        assert_eq!(&synced.assignment[..], b"all");
        assert_eq!(coordinator.heartbeat("g", (&a, None), 1), 0);

        // A second member: a rebalance, which waits for the first to rejoin.
        let mut second = join(&coordinator, "", "b");
        assert!(second.try_recv().is_err(), "the join waits for every member");
        assert_eq!(coordinator.heartbeat("g", (&a, None), 1), ResponseError::RebalanceInProgress.code());
        assert_eq!(coordinator.may_commit("g", (&a, None), 1), 0, "a last commit before rejoining is allowed");
        let rejoined = join(&coordinator, &a, "a").await.unwrap();
        let second = second.await.unwrap();
        assert_eq!((rejoined.generation, second.generation), (2, 2));
        assert_eq!(rejoined.leader, a, "the leader stays");
        assert_eq!(rejoined.members.len(), 2, "the leader gets every member's metadata");
        assert!(second.members.is_empty());
        let b = second.member_id.clone();
        assert_eq!(
            coordinator.may_commit("g", (&b, None), 2),
            ResponseError::RebalanceInProgress.code(),
            "not before the sync"
        );

        // The follower waits for the leader's assignment.
        let mut waiting = coordinator.sync("g", (&b, None), 2, Vec::new()).unwrap();
        assert!(waiting.try_recv().is_err());
        let assignments = vec![(a.clone(), Bytes::from("p0")), (b.clone(), Bytes::from("p1"))];
        let leader = coordinator.sync("g", (&a, None), 2, assignments).unwrap().await.unwrap();
        assert_eq!(&leader.assignment[..], b"p0");
        assert_eq!(&waiting.await.unwrap().assignment[..], b"p1");
        assert_eq!(coordinator.may_commit("g", (&b, None), 2), 0);
        assert_eq!(coordinator.may_commit("g", (&b, None), 1), ResponseError::IllegalGeneration.code());
        assert_eq!(
            coordinator.may_commit("g", ("", None), -1),
            ResponseError::UnknownMemberId.code(),
            "the group has members"
        );
        assert_eq!(
            coordinator.sync("g", ("nobody", None), 2, Vec::new()).unwrap_err(),
            ResponseError::UnknownMemberId.code()
        );

        // The completed rebalance is stored; a restart finds both members, stable.
        let unsaved = coordinator.tick();
        assert_eq!(unsaved.len(), 1);
        coordinator.offsets.store_group("g", unsaved[0].1.as_ref()).await.unwrap();
        drop(coordinator);
        let coordinator = Coordinator::new(CommittedOffsets::open(&engine).unwrap());
        assert_eq!(coordinator.heartbeat("g", (&b, None), 2), 0, "still a member after the restart");
        let described = coordinator.describe("g").unwrap();
        assert_eq!(described.state, GroupState::Stable);
        let assigned: Vec<&[u8]> = described.members.iter().map(|member| &member.assignment[..]).collect();
        assert_eq!(assigned, [&b"p0"[..], &b"p1"[..]]);

        // Both leave: the group is empty, and that is stored too.
        assert_eq!(coordinator.leave("g", (&a, None)), 0);
        assert_eq!(coordinator.leave("g", (&b, None)), 0);
        assert_eq!(coordinator.leave("g", (&b, None)), ResponseError::UnknownMemberId.code());
        let unsaved = coordinator.tick();
        assert_eq!(unsaved, vec![("g".to_string(), None)]);
        assert_eq!(coordinator.may_commit("g", ("", None), -1), 0, "a standalone commit once it is empty");
        assert_eq!(
            coordinator.may_commit("", ("", None), -1),
            ResponseError::InvalidGroupId.code(),
            "a group has a name"
        );
    }
}
