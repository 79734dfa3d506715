//! What access is made of: users, roles, grants and tokens, as definitions.
//!
//! - A **user** logs in with a password (kept as SCRAM credentials, never in clear) or a token.
//! - A **role** is a name grants are given to; a user who is a member has its grants. Roles do
//!   not contain roles: one level keeps "who may do this" answerable at a glance.
//! - A **grant** gives a privilege on the objects a pattern names to a user, a role or
//!   `PUBLIC` (everyone, clients without credentials included). A grant on a **topic** filter
//!   (`sensors/+/temp`, MQTT's syntax; `%u` stands for the user's name) reaches the records of
//!   those subjects (MQTT topics) in whatever stream holds them: finer than a stream.
//! - A **token** is a random secret standing for a user, for clients that cannot keep a
//!   password (a browser's `EventSource`) or should not hold one; it may expire.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::credential::ScramCredential;

/// The grantee that stands for everyone, clients without credentials included.
pub const PUBLIC: &str = "public";

/// What a grant allows. `Admin` includes `Read` and `Write`; `Write` does not include `Read`
/// (a device may publish telemetry it may not read back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Privilege {
    /// Read and subscribe.
    Read,
    /// Publish, put, patch, delete rows; a first publish creates a stream where that is on.
    Write,
    /// Create, alter and drop the objects named. `ADMIN ON ALL` also manages users, roles,
    /// grants and tokens: a superuser.
    Admin,
}

impl Privilege {
    pub fn as_str(self) -> &'static str {
        match self {
            Privilege::Read => "read",
            Privilege::Write => "write",
            Privilege::Admin => "admin",
        }
    }

    /// Whether holding `self` allows `wanted`.
    pub fn covers(self, wanted: Privilege) -> bool {
        self == wanted || self == Privilege::Admin
    }
}

impl std::fmt::Display for Privilege {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kind of object a grant names. Streams, tables and views share one namespace, so a
/// grant may also name any kind (`ON ALL`, or a pattern with no kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectKind {
    Stream,
    Table,
    View,
    /// Subjects (MQTT topics) matching a topic filter, in any stream.
    Topic,
    /// Kafka consumer groups (READ: be a member, commit and fetch offsets; ADMIN: delete).
    Group,
    /// Kafka transactional ids (WRITE: run transactions as that id).
    TransactionalId,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Stream => "stream",
            ObjectKind::Table => "table",
            ObjectKind::View => "view",
            ObjectKind::Topic => "topic",
            ObjectKind::Group => "group",
            ObjectKind::TransactionalId => "transactional_id",
        }
    }

    /// Whether objects of this kind are Kafka's own, named apart from streams, tables and
    /// views: a grant naming no kind reaches them only if it is `ON ALL`.
    pub fn is_kafka_only(self) -> bool {
        matches!(self, ObjectKind::Group | ObjectKind::TransactionalId)
    }
}

/// What `%u` in a topic grant stands for: the user's name.
pub const TOPIC_USER: &str = "%u";

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The objects a grant is on: a kind (or every kind) and a name, or a prefix ending in `*`
/// (`sensor_*`; `*` alone is every name).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectPattern {
    pub kind: Option<ObjectKind>,
    pub name: String,
}

impl ObjectPattern {
    /// Every object of every kind: `ON ALL`.
    pub fn everything() -> ObjectPattern {
        ObjectPattern { kind: None, name: "*".into() }
    }

    pub fn is_everything(&self) -> bool {
        self.kind.is_none() && self.name == "*"
    }

    pub fn matches(&self, kind: ObjectKind, name: &str) -> bool {
        if self.kind.is_some_and(|own| own != kind) {
            return false;
        }
        // Topics are only ever reached by topic grants, matched as filters (`Permissions`).
        if kind == ObjectKind::Topic || self.kind == Some(ObjectKind::Topic) {
            return false;
        }
        // Groups and transactional ids have names of their own: `ON orders` is not a group.
        if kind.is_kafka_only() && self.kind.is_none() && !self.is_everything() {
            return false;
        }
        match self.name.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => self.name == name,
        }
    }

    /// Whether every object `other` names is one this pattern names too.
    pub fn contains(&self, other: &ObjectPattern) -> bool {
        if self.kind.is_some() && self.kind != other.kind {
            return false;
        }
        if self.kind == Some(ObjectKind::Topic) {
            return topic_filter_covers(&self.name, &other.name);
        }
        if other.kind == Some(ObjectKind::Topic)
            || (self.kind.is_none() && other.kind.is_some_and(ObjectKind::is_kafka_only))
        {
            // A grant on every object of any kind covers topics, groups and ids too.
            return self.is_everything();
        }
        match (self.name.strip_suffix('*'), other.name.strip_suffix('*')) {
            (Some(prefix), _) => other.name.starts_with(prefix),
            (None, Some(_)) => false,
            (None, None) => self.name == other.name,
        }
    }

    /// Checks a pattern given in a statement: a valid name, or a valid name's start and `*`;
    /// for a topic, a valid MQTT topic filter (`%u` allowed as a whole level).
    pub fn validate(&self) -> Result<(), String> {
        if self.kind == Some(ObjectKind::Topic) {
            if self.name.split('/').any(|level| level.contains(TOPIC_USER) && level != TOPIC_USER) {
                return Err(format!("{:?}: %u may only stand for a whole level", self.name));
            }
            let sample = self.name.replace(TOPIC_USER, "user");
            return crate::subject::SubjectFilter::parse(&sample)
                .map(|_| ())
                .map_err(|error| format!("{:?}: not a topic filter: {error}", self.name));
        }
        let name = self.name.strip_suffix('*').unwrap_or(&self.name);
        if name.is_empty() {
            return Ok(());
        }
        if self.kind.is_some_and(ObjectKind::is_kafka_only) {
            // Kafka's own rule for group and transactional ids: any characters, at most 249.
            if name.contains('*') || name.len() > 249 || name.chars().any(char::is_control) {
                return Err(format!(
                    "{:?}: at most 249 characters, no control characters, '*' only at the end",
                    self.name
                ));
            }
            return Ok(());
        }
        if name.contains('*') {
            return Err(format!("{:?}: '*' may only end a pattern", self.name));
        }
        onehop_log::validate_topic_name(name).map_err(|reason| format!("{:?}: {reason}", self.name))
    }
}

impl std::fmt::Display for ObjectPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.kind, self.is_everything()) {
            (None, true) => f.write_str("ALL"),
            (Some(ObjectKind::Topic), _) => write!(f, "TOPIC '{}'", self.name),
            (Some(ObjectKind::Group), _) => write!(f, "GROUP '{}'", self.name),
            (Some(ObjectKind::TransactionalId), _) => write!(f, "TRANSACTIONAL ID '{}'", self.name),
            (None, false) => write!(f, "{}", self.name),
            (Some(kind), _) => write!(f, "{} {}", kind.as_str().to_ascii_uppercase(), self.name),
        }
    }
}

/// A privilege on some objects, given to a user, a role or `PUBLIC`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Grant {
    pub grantee: String,
    pub privilege: Privilege,
    pub object: ObjectPattern,
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let grantee = if self.grantee == PUBLIC { "PUBLIC" } else { &self.grantee };
        write!(f, "{} ON {} TO {grantee}", self.privilege.as_str().to_ascii_uppercase(), self.object)
    }
}

/// A user: a name and what its password is checked against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UserDef {
    pub name: String,
    /// One per hash (SCRAM-SHA-256 first, SCRAM-SHA-512), all from the same password; none
    /// for a user that logs in only by token or client certificate.
    pub credentials: Vec<ScramCredential>,
    pub created_ms: u64,
    pub limits: UserLimits,
}

/// The most one user may hold and send, over every protocol and connection together; `None`:
/// no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserLimits {
    /// Connections open at once: MQTT and Kafka connections, SSE streams and WebSockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u32>,
    /// Subscriptions open at once: MQTT filters, SSE streams, WebSocket subscriptions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriptions: Option<u32>,
    /// Records published per second (HTTP, MQTT, Kafka), with one second's worth as a burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publishes_per_second: Option<u32>,
    /// Bytes of record values published per second, with one second's worth as a burst.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_bytes_per_second: Option<u64>,
}

impl UserLimits {
    pub fn is_none(&self) -> bool {
        *self == UserLimits::default()
    }
}

impl std::fmt::Display for UserLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = [
            self.connections.map(|n| format!("connections = {n}")),
            self.subscriptions.map(|n| format!("subscriptions = {n}")),
            self.publishes_per_second.map(|n| format!("publishes_per_second = {n}")),
            self.publish_bytes_per_second.map(|n| format!("publish_bytes_per_second = {n}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        if parts.is_empty() { f.write_str("none") } else { f.write_str(&parts.join(", ")) }
    }
}

/// A token: a secret standing for a user. Only the secret's SHA-256 is kept; the secret is
/// shown once, when the token is created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenDef {
    /// The public part of the token, shown in `SHOW TOKENS` and named by `DROP TOKEN`.
    pub id: String,
    pub user: String,
    pub secret_sha256: Vec<u8>,
    pub created_ms: u64,
    /// After this instant (ms since the Unix epoch) the token is refused; `None`: never.
    pub expires_ms: Option<u64>,
}

/// Every access definition: what the catalog says, newest record per key winning.
#[derive(Clone, Debug, Default)]
pub struct AccessDefs {
    pub users: BTreeMap<String, UserDef>,
    pub roles: BTreeSet<String>,
    /// Role → its members (users).
    pub members: BTreeMap<String, BTreeSet<String>>,
    pub grants: BTreeSet<Grant>,
    pub tokens: BTreeMap<String, TokenDef>,
}

impl AccessDefs {
    /// What `user` (or a client without credentials, `None`) may do: its own grants, its
    /// roles' and `PUBLIC`'s, and those of `extra_roles` (a JWT's) that are roles here.
    pub fn permissions(&self, user: Option<&str>, extra_roles: &[String]) -> Permissions {
        let mut grantees: BTreeSet<&str> = BTreeSet::from([PUBLIC]);
        for role in extra_roles {
            if self.roles.contains(role) {
                grantees.insert(role);
            }
        }
        if let Some(user) = user {
            grantees.insert(user);
            for (role, members) in &self.members {
                if members.contains(user) {
                    grantees.insert(role);
                }
            }
        }
        let grants: Vec<(Privilege, ObjectPattern)> = self
            .grants
            .iter()
            .filter(|grant| grantees.contains(grant.grantee.as_str()))
            .map(|grant| (grant.privilege, grant.object.clone()))
            .collect();
        // Topic grants as filters, `%u` made the user's name (a grant naming `%u` reaches no
        // client without credentials).
        let topics = grants
            .iter()
            .filter(|(_, object)| object.kind == Some(ObjectKind::Topic))
            .filter_map(|(privilege, object)| {
                let text = match user {
                    Some(user) => object.name.replace(TOPIC_USER, user),
                    None if object.name.contains(TOPIC_USER) => return None,
                    None => object.name.clone(),
                };
                crate::subject::SubjectFilter::parse(&text).ok().map(|filter| (*privilege, filter))
            })
            .collect();
        Permissions { grants, topics }
    }

    /// Whether `name` is a user or a role (one namespace, as in Postgres).
    pub fn is_grantee(&self, name: &str) -> bool {
        name == PUBLIC || self.users.contains_key(name) || self.roles.contains(name)
    }

    /// The users with `ADMIN ON ALL`, directly or through a role.
    pub fn superusers(&self) -> BTreeSet<String> {
        self.users.keys().filter(|user| self.permissions(Some(user), &[]).is_superuser()).cloned().collect()
    }
}

/// What one identity may do: the privileges of its grants, its roles' and `PUBLIC`'s.
#[derive(Clone, Debug, Default)]
pub struct Permissions {
    grants: Vec<(Privilege, ObjectPattern)>,
    /// The topic grants among them, as filters for this identity.
    topics: Vec<(Privilege, crate::subject::SubjectFilter)>,
}

/// Whether every topic `inner` matches is one `outer` matches (both MQTT topic filters).
pub fn topic_filter_covers(outer: &str, inner: &str) -> bool {
    let (mut outer_levels, mut inner_levels) = (outer.split('/'), inner.split('/'));
    loop {
        match (outer_levels.next(), inner_levels.next()) {
            (Some("#"), _) => return true,
            (None, None) => return true,
            (Some(_), Some("#")) | (None, Some(_)) | (Some(_), None) => return false,
            (Some("+"), Some(_)) => {}
            (Some(_), Some("+")) => return false,
            (Some(outer), Some(inner)) if outer == inner => {}
            _ => return false,
        }
    }
}

impl Permissions {
    pub fn allows(&self, wanted: Privilege, kind: ObjectKind, name: &str) -> bool {
        self.grants.iter().any(|(privilege, object)| privilege.covers(wanted) && object.matches(kind, name))
    }

    /// Whether these permissions allow `wanted` on every object `pattern` names (what granting
    /// it on to someone else would need).
    pub fn allows_all(&self, wanted: Privilege, pattern: &ObjectPattern) -> bool {
        self.grants.iter().any(|(privilege, object)| privilege.covers(wanted) && object.contains(pattern))
    }

    /// `ADMIN ON ALL`: may manage users, roles, grants and tokens, and every object.
    pub fn is_superuser(&self) -> bool {
        self.allows_all(Privilege::Admin, &ObjectPattern::everything())
    }

    /// Whether any grant reaches `name` at all (what `SHOW STREAMS` lists).
    pub fn sees(&self, kind: ObjectKind, name: &str) -> bool {
        self.grants.iter().any(|(_, object)| object.matches(kind, name))
    }

    /// Whether a topic grant allows `wanted` on the subject `topic`.
    pub fn allows_topic(&self, wanted: Privilege, topic: &str) -> bool {
        self.topics.iter().any(|(privilege, filter)| privilege.covers(wanted) && filter.matches(topic))
    }

    /// Whether a topic grant allows `wanted` on every subject the filter `filter` matches.
    pub fn allows_topic_filter(&self, wanted: Privilege, filter: &str) -> bool {
        self.topics
            .iter()
            .any(|(privilege, grant)| privilege.covers(wanted) && topic_filter_covers(grant.as_str(), filter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(kind: Option<ObjectKind>, name: &str) -> ObjectPattern {
        ObjectPattern { kind, name: name.into() }
    }

    #[test]
    fn patterns_match_by_kind_and_by_name_or_prefix() {
        let orders = pattern(Some(ObjectKind::Stream), "orders");
        assert!(orders.matches(ObjectKind::Stream, "orders"));
        assert!(!orders.matches(ObjectKind::Table, "orders"));
        assert!(!orders.matches(ObjectKind::Stream, "orders2"));
        let sensors = pattern(None, "sensor_*");
        assert!(sensors.matches(ObjectKind::View, "sensor_avg"));
        assert!(!sensors.matches(ObjectKind::View, "sensor"));
        assert!(ObjectPattern::everything().matches(ObjectKind::Table, "x"));
        assert!(sensors.contains(&pattern(Some(ObjectKind::Stream), "sensor_a*")));
        assert!(!sensors.contains(&pattern(None, "sens*")));
        assert!(!orders.contains(&pattern(None, "orders")), "a stream grant does not cover a table of that name");
        assert!(pattern(None, "a*").validate().is_ok());
        assert!(pattern(None, "a*b").validate().is_err());
        assert!(pattern(None, "a/b").validate().is_err());
    }

    #[test]
    fn permissions_join_own_role_and_public_grants() {
        let mut defs = AccessDefs::default();
        for user in ["alice", "bob"] {
            defs.users.insert(
                user.into(),
                UserDef { name: user.into(), credentials: Vec::new(), created_ms: 0, limits: UserLimits::default() },
            );
        }
        defs.roles.insert("readers".into());
        defs.members.entry("readers".into()).or_default().insert("alice".into());
        let grant = |grantee: &str, privilege, object| Grant { grantee: grantee.into(), privilege, object };
        defs.grants.insert(grant("readers", Privilege::Read, pattern(Some(ObjectKind::Stream), "orders")));
        defs.grants.insert(grant("bob", Privilege::Admin, ObjectPattern::everything()));
        defs.grants.insert(grant(PUBLIC, Privilege::Read, pattern(Some(ObjectKind::View), "scores")));
        let alice = defs.permissions(Some("alice"), &[]);
        assert!(alice.allows(Privilege::Read, ObjectKind::Stream, "orders"));
        assert!(!alice.allows(Privilege::Write, ObjectKind::Stream, "orders"));
        assert!(alice.allows(Privilege::Read, ObjectKind::View, "scores"));
        assert!(!alice.is_superuser());
        let anonymous = defs.permissions(None, &[]);
        assert!(anonymous.allows(Privilege::Read, ObjectKind::View, "scores"));
        assert!(!anonymous.allows(Privilege::Read, ObjectKind::Stream, "orders"));
        let bob = defs.permissions(Some("bob"), &[]);
        assert!(bob.is_superuser() && bob.allows(Privilege::Write, ObjectKind::Table, "anything"));
        assert_eq!(defs.superusers(), BTreeSet::from(["bob".to_string()]));
        assert!(!Privilege::Write.covers(Privilege::Read));
        // Topic grants: `%u` is the user; a filter covers the filters inside it.
        let topic = |name: &str| pattern(Some(ObjectKind::Topic), name);
        defs.grants.insert(grant(PUBLIC, Privilege::Write, topic("devices/%u/#")));
        defs.grants.insert(grant("readers", Privilege::Read, topic("devices/+/status")));
        let alice = defs.permissions(Some("alice"), &[]);
        assert!(alice.allows_topic(Privilege::Write, "devices/alice/temp"));
        assert!(!alice.allows_topic(Privilege::Write, "devices/bob/temp"));
        assert!(!alice.allows_topic(Privilege::Read, "devices/alice/temp"), "WRITE does not read");
        assert!(alice.allows_topic_filter(Privilege::Read, "devices/bob/status"));
        assert!(alice.allows_topic_filter(Privilege::Read, "devices/+/status"));
        assert!(!alice.allows_topic_filter(Privilege::Read, "devices/#"));
        assert!(!defs.permissions(None, &[]).allows_topic(Privilege::Write, "devices/%u/x"), "no user, no %u");
        assert!(!alice.allows(Privilege::Read, ObjectKind::Stream, "devices"), "a topic grant is not a stream grant");
        for (outer, inner, covers) in [
            ("a/#", "a", true),
            ("a/#", "a/b/c", true),
            ("a/+", "a/b", true),
            ("a/+", "a/+", true),
            ("a/+", "a/#", false),
            ("a/b", "a/+", false),
            ("a/+/c", "a/b/c/d", false),
            ("#", "#", true),
            ("a", "a/b", false),
        ] {
            assert_eq!(topic_filter_covers(outer, inner), covers, "{outer} covers {inner}");
        }
        // Groups and transactional ids are reached by grants that name their kind, or ON ALL.
        let orders_any = pattern(None, "orders");
        assert!(!orders_any.matches(ObjectKind::Group, "orders"));
        assert!(pattern(Some(ObjectKind::Group), "bill*").matches(ObjectKind::Group, "billing"));
        assert!(ObjectPattern::everything().matches(ObjectKind::TransactionalId, "etl"));
        assert!(ObjectPattern::everything().contains(&pattern(Some(ObjectKind::Group), "x")));
        assert!(!orders_any.contains(&pattern(Some(ObjectKind::Group), "orders")), "granting on: not a group");
        assert!(topic("devices/%u/#").validate().is_ok());
        assert!(topic("devices/x%u/#").validate().is_err());
        assert!(topic("devices/#/x").validate().is_err());
        // A JWT's roles count where they are roles here; others are ignored.
        let token = defs.permissions(Some("carol"), &["readers".into(), "nonexistent".into()]);
        assert!(token.allows(Privilege::Read, ObjectKind::Stream, "orders"));
        assert!(!defs.permissions(Some("carol"), &[]).allows(Privilege::Read, ObjectKind::Stream, "orders"));
    }
}
