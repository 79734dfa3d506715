//! Persistent sessions: what a client with `clean_session = 0` (3.1.1) or a session expiry
//! (5.0) finds again when it reconnects — its subscriptions, and for each the log positions up
//! to which it has acknowledged everything. The log itself is the queue of messages published
//! while the client was away: on reconnect its subscriptions resume from those positions.
//!
//! Sessions are kept in the compacted system topic `__mqtt_sessions` (key = client id, value =
//! JSON, a tombstone when the session ends) and in memory, replayed at start, so they survive
//! restarts and `kill -9`. A session is written when its subscriptions change, about once a
//! second while acknowledgements move its positions, and when its connection ends — and, for
//! exactly-once QoS 2, before an incoming QoS 2 message is stored (so a resend after a crash
//! knows where to look for it) and before a PUBREL goes out (so the message it releases is never
//! sent again).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use onehop_engine::system::{SystemTopic, SystemTopicConfig};
use onehop_engine::{Engine, EngineError, NewRecord};
use serde::{Deserialize, Serialize};

pub const SESSIONS_TOPIC: &str = "__mqtt_sessions";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredSubscription {
    pub filter: String,
    pub qos: u8,
    pub subscription_id: Option<u32>,
    pub retain_as_published: bool,
    #[serde(default)]
    pub no_local: bool,
    /// Per stream, the next offset of each partition not yet acknowledged.
    pub positions: BTreeMap<String, Vec<u64>>,
    /// Per stream, how far each partition had been handed to the client: a message below it is
    /// sent again with DUP set.
    #[serde(default)]
    pub sent: BTreeMap<String, Vec<u64>>,
    /// Per stream and partition, the messages below `sent` handed over but not acknowledged:
    /// on resume only these come again, so one the client acknowledged (a QoS 2 message whose
    /// PUBREC came) is never sent twice. Absent in sessions written before it existed: then
    /// everything from `positions` comes again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unacked: Option<BTreeMap<String, Vec<Vec<u64>>>>,
}

/// An incoming QoS 2 message whose PUBREL has not come yet, and where it was (or is being)
/// stored: its stream partition, at or after offset `from`, with the client's id and the packet
/// id in its headers. A resend after a crash looks there before storing it again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredRelease {
    pub packet_id: u16,
    pub stream: String,
    pub partition: u32,
    pub from: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StoredSession {
    /// Seconds the session outlives its connection (`u32::MAX`: forever).
    pub expiry_secs: u32,
    /// When its last connection ended (ms since the epoch); `None` while connected.
    pub disconnected_ms: Option<i64>,
    pub subscriptions: Vec<StoredSubscription>,
    /// Incoming QoS 2 messages awaiting their PUBREL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub awaiting_release: Vec<StoredRelease>,
    /// Outgoing QoS 2 messages the client has PUBREC'd, whose PUBCOMP has not come: their
    /// PUBREL is sent again on reconnect.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub releasing: Vec<u16>,
}

impl StoredSession {
    /// Whether the session has outlived its expiry at `now_ms`.
    pub fn expired(&self, now_ms: i64) -> bool {
        match self.disconnected_ms {
            None => false,
            Some(_) if self.expiry_secs == u32::MAX => false,
            Some(since) => now_ms - since > i64::from(self.expiry_secs) * 1000,
        }
    }
}

pub struct SessionStore {
    log: Arc<SystemTopic>,
    sessions: Mutex<HashMap<String, StoredSession>>,
    /// Held by the connection that owns a client id's session, so a reconnecting client finds
    /// the session its previous connection wrote last.
    owners: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl SessionStore {
    pub fn open(engine: &Engine) -> Result<SessionStore, EngineError> {
        let partition = engine.system_topic(SESSIONS_TOPIC, &SystemTopicConfig::default())?;
        let mut sessions = HashMap::new();
        partition.replay(|record| {
            let Some(client) = record.key.as_deref().and_then(|key| std::str::from_utf8(key).ok()) else {
                return Ok::<(), EngineError>(());
            };
            match record.value.as_deref().map(serde_json::from_slice::<StoredSession>) {
                Some(Ok(session)) => {
                    sessions.insert(client.to_string(), session);
                }
                // A record this version cannot read (a newer one's) leaves the session it had.
                Some(Err(error)) => tracing::warn!(client, %error, "skipping an unreadable MQTT session"),
                None => {
                    sessions.remove(client);
                }
            }
            Ok(())
        })?;
        tracing::info!(sessions = sessions.len(), "MQTT sessions replayed");
        metrics::gauge!("mqtt_sessions_stored").set(sessions.len() as f64);
        Ok(SessionStore { log: partition, sessions: Mutex::new(sessions), owners: Mutex::new(HashMap::new()) })
    }

    /// The lock a connection holds while it owns `client`'s session.
    pub fn owner_lock(&self, client: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.owners.lock().expect("owners lock").entry(client.to_string()).or_default().clone()
    }

    /// Forgets `client`'s owner lock once no connection holds or awaits it, so client ids seen
    /// once (generated ones, say) do not accumulate.
    pub fn release_owner(&self, client: &str, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut owners = self.owners.lock().expect("owners lock");
        // The map's reference and `lock`: nobody else.
        if Arc::strong_count(&lock) <= 2 {
            owners.remove(client);
        }
    }

    pub fn get(&self, client: &str) -> Option<StoredSession> {
        self.sessions.lock().expect("sessions lock").get(client).cloned()
    }

    /// Stores `session` for `client` durably (`None` ends it).
    pub async fn put(&self, client: &str, session: Option<StoredSession>) -> Result<(), EngineError> {
        {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            if sessions.get(client) == session.as_ref() {
                return Ok(());
            }
            match &session {
                Some(session) => sessions.insert(client.to_string(), session.clone()),
                None => sessions.remove(client),
            };
        }
        let value = session.map(|session| Bytes::from(serde_json::to_vec(&session).expect("a session serializes")));
        let record = NewRecord { key: Some(Bytes::from(client.to_string())), value, ..NewRecord::default() };
        self.log.append(std::slice::from_ref(&record)).await?;
        metrics::gauge!("mqtt_sessions_stored").set(self.sessions.lock().expect("sessions lock").len() as f64);
        Ok(())
    }
}
