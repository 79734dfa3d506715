//! Committed offsets: per group, topic and partition, in memory and in the compacted system
//! topic `__consumer_offsets` (one record per partition committed, the newest wins; a deleted
//! group's are tombstones). A commit is answered once its records are durable, so a committed
//! offset survives kill -9.
//!
//! The same topic keeps each group's membership as of its last completed rebalance
//! ([`StoredGroup`], key `[group]`), as Kafka does: after a restart the members are still
//! known, so they go on heartbeating and committing instead of all rejoining at once (which
//! would hand partitions over before the old owners could commit).
//!
//! On a cluster node every write to the topic goes through the cluster
//! ([`Engine::append_system`]), so every node holds what the leader, which coordinates the
//! groups, committed; a node that becomes leader reads it back ([`CommittedOffsets::reload`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use onehop_engine::system::{SystemTopic, SystemTopicConfig};
use onehop_engine::{Engine, EngineError, NewRecord};
use serde::{Deserialize, Serialize};

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// A group's committed position in one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Committed {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

/// `(group, topic, partition)`.
pub type Key = (String, String, i32);

/// A member of a stored group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredMember {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub host: String,
    pub session_timeout_ms: u64,
    pub rebalance_timeout_ms: u64,
    pub protocol_type: String,
    /// Its protocols' names and metadata (base64).
    pub protocols: Vec<(String, String)>,
    /// Its assignment (base64).
    pub assignment: String,
}

/// A group as its last rebalance left it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredGroup {
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: Option<String>,
    pub members: Vec<StoredMember>,
}

pub struct CommittedOffsets {
    engine: Arc<Engine>,
    topic: Arc<SystemTopic>,
    offsets: RwLock<BTreeMap<Key, Committed>>,
    /// The groups' stored memberships, as read at start (the coordinator takes them).
    restored: std::sync::Mutex<BTreeMap<String, StoredGroup>>,
    /// On a cluster node: the leader term the offsets were last read back for (see
    /// [`CommittedOffsets::reload`]); `u64::MAX`: none.
    loaded_term: std::sync::atomic::AtomicU64,
}

/// Committed offsets and stored groups, as a replay of the topic gives them.
type Replayed = (BTreeMap<Key, Committed>, BTreeMap<String, StoredGroup>);

impl CommittedOffsets {
    /// Opens the store and reads every committed offset back.
    pub fn open(engine: &Arc<Engine>) -> Result<CommittedOffsets, EngineError> {
        // Every cluster node opens it alike: it applies what the leader commits to it.
        let topic = engine.system_topic(OFFSETS_TOPIC, &SystemTopicConfig::default())?;
        let (offsets, groups) = Self::replay(&topic)?;
        tracing::info!(offsets = offsets.len(), groups = groups.len(), "Kafka committed offsets and groups restored");
        Ok(CommittedOffsets {
            engine: engine.clone(),
            topic,
            offsets: RwLock::new(offsets),
            restored: std::sync::Mutex::new(groups),
            loaded_term: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// Reads the offsets back again, for the leader term `term`: a cluster node that became
    /// the leader coordinates the groups from the offsets every node applied, which the
    /// leaders before it committed.
    pub fn reload(&self, term: u64) -> Result<(), EngineError> {
        let (offsets, _) = Self::replay(&self.topic)?;
        tracing::info!(
            offsets = offsets.len(),
            term,
            "Kafka committed offsets read back: this node coordinates the groups"
        );
        *self.offsets.write().expect("offsets lock") = offsets;
        self.loaded_term.store(term, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    /// The leader term the offsets were last read back for ([`CommittedOffsets::reload`]).
    pub fn loaded_term(&self) -> Option<u64> {
        Some(self.loaded_term.load(std::sync::atomic::Ordering::SeqCst)).filter(|term| *term != u64::MAX)
    }

    fn replay(topic: &SystemTopic) -> Result<Replayed, EngineError> {
        let mut offsets = BTreeMap::new();
        let mut groups = BTreeMap::new();
        topic.replay(|record| {
            if let Some((group,)) = record.key.as_deref().and_then(|key| serde_json::from_slice::<(String,)>(key).ok())
            {
                match record.value.as_deref().map(serde_json::from_slice::<StoredGroup>) {
                    Some(Ok(stored)) => {
                        groups.insert(group, stored);
                    }
                    Some(Err(error)) => tracing::warn!(%error, "skipping an unreadable stored group"),
                    None => {
                        groups.remove(&group);
                    }
                }
                return Ok::<(), EngineError>(());
            }
            let key = record.key.as_deref().and_then(|key| serde_json::from_slice::<Key>(key).ok());
            let Some(key) = key else {
                tracing::warn!(offset = record.offset, "skipping a committed offset with an unreadable key");
                return Ok::<(), EngineError>(());
            };
            match record.value.as_deref().map(serde_json::from_slice::<Committed>) {
                Some(Ok(committed)) => {
                    offsets.insert(key, committed);
                }
                Some(Err(error)) => tracing::warn!(%error, "skipping an unreadable committed offset"),
                None => {
                    offsets.remove(&key);
                }
            }
            Ok(())
        })?;
        Ok((offsets, groups))
    }

    /// The groups' memberships read at start (once; the coordinator keeps them from then on).
    pub fn take_restored(&self) -> BTreeMap<String, StoredGroup> {
        std::mem::take(&mut self.restored.lock().expect("restored lock"))
    }

    /// Stores `group`'s membership (`None`: it has no members), durably.
    pub async fn store_group(&self, group: &str, stored: Option<&StoredGroup>) -> Result<(), EngineError> {
        let key = Bytes::from(serde_json::to_vec(&(group,)).expect("a key serializes"));
        let record = match stored {
            Some(stored) => NewRecord::keyed(key, serde_json::to_vec(stored).expect("a group serializes")),
            None => NewRecord::tombstone(key),
        };
        let term = self.coordinating()?;
        self.engine.append_system_in_term(&self.topic, vec![record], term).await.map(drop)
    }

    fn encode_key(key: &Key) -> Bytes {
        Bytes::from(serde_json::to_vec(key).expect("a key serializes"))
    }

    /// Commits `offsets` durably, as one write; then they are what reads see.
    pub async fn commit(&self, offsets: Vec<(Key, Committed)>) -> Result<(), EngineError> {
        let term = self.coordinating()?;
        self.commit_in_term(offsets, term).await
    }

    /// The term this node's writes of groups and offsets are fenced to: on a cluster node, the
    /// one it read the offsets back for as the leader, so a node that coordinated before
    /// cannot overwrite what the next coordinator wrote; `None` on a single node.
    fn coordinating(&self) -> Result<Option<u64>, EngineError> {
        if !self.engine.is_replicated() {
            return Ok(None);
        }
        // The requests that write are answered NOT_COORDINATOR before they get here on a node
        // that has not read the offsets back as the leader.
        self.loaded_term().map(Some).ok_or_else(|| {
            EngineError::Internal("a write of the Kafka groups on a node that never coordinated them".into())
        })
    }

    /// [`CommittedOffsets::commit`], on a cluster node with `term` only if the leader of that
    /// term prepares the write (a transaction's offsets, committed by the node that
    /// coordinated it in that term).
    pub async fn commit_in_term(&self, offsets: Vec<(Key, Committed)>, term: Option<u64>) -> Result<(), EngineError> {
        if offsets.is_empty() {
            return Ok(());
        }
        let records: Vec<NewRecord> = offsets
            .iter()
            .map(|(key, committed)| {
                NewRecord::keyed(Self::encode_key(key), serde_json::to_vec(committed).expect("an offset serializes"))
            })
            .collect();
        self.engine.append_system_in_term(&self.topic, records, term).await?;
        let mut stored = self.offsets.write().expect("offsets lock");
        stored.extend(offsets);
        Ok(())
    }

    /// The offset `group` committed in `topic`'s `partition`.
    pub fn get(&self, group: &str, topic: &str, partition: i32) -> Option<Committed> {
        self.offsets.read().expect("offsets lock").get(&(group.to_string(), topic.to_string(), partition)).cloned()
    }

    /// Every offset `group` committed, by topic and partition.
    pub fn of_group(&self, group: &str) -> Vec<(String, i32, Committed)> {
        let offsets = self.offsets.read().expect("offsets lock");
        offsets
            .range((group.to_string(), String::new(), i32::MIN)..)
            .take_while(|((name, ..), _)| name == group)
            .map(|((_, topic, partition), committed)| (topic.clone(), *partition, committed.clone()))
            .collect()
    }

    /// The groups with committed offsets.
    pub fn groups(&self) -> Vec<String> {
        let offsets = self.offsets.read().expect("offsets lock");
        let mut groups: Vec<String> = offsets.keys().map(|(group, ..)| group.clone()).collect();
        groups.dedup();
        groups
    }

    /// Deletes the offsets every group committed in topics that were dropped since this node
    /// last looked (`seen`: the stream each topic was then), as Kafka deletes a topic's offsets
    /// with it: a topic made again under the same name starts with none, rather than at the
    /// old offsets, which would skip that many of its new records. A topic whose stream gained
    /// partitions since (its successor) keeps them. Only the node that coordinates the groups
    /// writes; the others look again once they do.
    pub async fn forget_dropped_topics(
        &self,
        seen: &mut std::collections::HashMap<String, Arc<onehop_engine::Stream>>,
    ) -> Result<(), EngineError> {
        if self.engine.is_replicated() && self.loaded_term().is_none() {
            return Ok(());
        }
        let topics: std::collections::BTreeSet<String> =
            self.offsets.read().expect("offsets lock").keys().map(|(_, topic, _)| topic.clone()).collect();
        let continues = |from: &Arc<onehop_engine::Stream>, to: &Arc<onehop_engine::Stream>| {
            let mut at = from.clone();
            loop {
                if Arc::ptr_eq(&at, to) {
                    return true;
                }
                match at.successor() {
                    Some(next) => at = next.clone(),
                    None => return false,
                }
            }
        };
        let mut dropped = Vec::new();
        for topic in topics {
            let now = self.engine.stream(&topic).ok();
            let gone = match (seen.get(&topic), &now) {
                (_, None) => true,
                (Some(before), Some(now)) => !continues(before, now),
                (None, Some(_)) => false,
            };
            match now {
                Some(now) if !gone => {
                    seen.insert(topic, now);
                }
                now => {
                    seen.remove(&topic);
                    if let Some(now) = now {
                        seen.insert(topic.clone(), now);
                    }
                    dropped.push(topic);
                }
            }
        }
        for topic in dropped {
            let keys: Vec<Key> = self
                .offsets
                .read()
                .expect("offsets lock")
                .keys()
                .filter(|(_, name, _)| *name == topic)
                .cloned()
                .collect();
            if keys.is_empty() {
                continue;
            }
            let count = keys.len();
            self.delete(keys).await?;
            tracing::info!(topic, offsets = count, "deleted the committed offsets of a dropped topic");
        }
        Ok(())
    }

    /// Deletes the offsets at `keys` that are committed, durably.
    pub async fn delete(&self, keys: Vec<Key>) -> Result<(), EngineError> {
        let keys: Vec<Key> = {
            let stored = self.offsets.read().expect("offsets lock");
            keys.into_iter().filter(|key| stored.contains_key(key)).collect()
        };
        if keys.is_empty() {
            return Ok(());
        }
        let records: Vec<NewRecord> = keys.iter().map(|key| NewRecord::tombstone(Self::encode_key(key))).collect();
        let term = self.coordinating()?;
        self.engine.append_system_in_term(&self.topic, records, term).await?;
        let mut stored = self.offsets.write().expect("offsets lock");
        for key in &keys {
            stored.remove(key);
        }
        Ok(())
    }

    /// Deletes every offset of `group`, durably; false when it had none.
    pub async fn delete_group(&self, group: &str) -> Result<bool, EngineError> {
        let keys: Vec<Key> = self
            .of_group(group)
            .into_iter()
            .map(|(topic, partition, _)| (group.to_string(), topic, partition))
            .collect();
        if keys.is_empty() {
            return Ok(false);
        }
        let mut records: Vec<NewRecord> = keys.iter().map(|key| NewRecord::tombstone(Self::encode_key(key))).collect();
        records.push(NewRecord::tombstone(Bytes::from(serde_json::to_vec(&(group,)).expect("a key serializes"))));
        let term = self.coordinating()?;
        self.engine.append_system_in_term(&self.topic, records, term).await?;
        let mut stored = self.offsets.write().expect("offsets lock");
        for key in &keys {
            stored.remove(key);
        }
        Ok(true)
    }
}
