//! Shared subscriptions (`$share/{group}/{filter}`): one follower per group hands each
//! message to one member, round robin, skipping members whose queue is full — a consumer
//! group over MQTT. The group lives while it has members; the last one out stops its
//! follower.
//!
//! Lock order: the registry's map, then a group's members, then its task.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rmqtt_codec::types::QoS;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::machine::Outbound;

/// A member of a shared subscription group.
pub(super) struct Member {
    pub(super) id: u64,
    pub(super) deliveries: mpsc::Sender<Outbound>,
    pub(super) qos: QoS,
    pub(super) subscription_id: Option<NonZeroU32>,
}

/// A shared subscription (`$share/{group}/{filter}`): one follower, many members.
pub(super) struct Group {
    members: Mutex<Vec<Member>>,
    /// Whose turn it is, counted up with every message: an atomic, so taking a turn needs no
    /// lock beyond the members'.
    next: AtomicUsize,
    /// The group's follower, stopped by the last member out.
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Group {
    /// Gives a message to one member, round robin, preferring one whose queue has room.
    pub(super) async fn dispatch(&self, outbound: Outbound) -> bool {
        let Outbound::Message { event, retain, retain_as_published, progress, dup, .. } = outbound else {
            // Cut off: every member is told.
            let members: Vec<mpsc::Sender<Outbound>> =
                self.members.lock().expect("members lock").iter().map(|member| member.deliveries.clone()).collect();
            for deliveries in members {
                let _ = deliveries.send(Outbound::CutOff).await;
            }
            return false;
        };
        let message = |qos: QoS, subscription_id: Option<NonZeroU32>| Outbound::Message {
            event: event.clone(),
            qos,
            subscription_id,
            retain,
            retain_as_published,
            progress: progress.clone(),
            dup,
        };
        loop {
            // try_send never waits, so the members are tried under the lock; only when every
            // queue is full is the turn's member taken out to wait on.
            let (deliveries, qos, subscription_id) = {
                let members = self.members.lock().expect("members lock");
                if members.is_empty() {
                    return false;
                }
                let start = self.next.fetch_add(1, Ordering::Relaxed) % members.len();
                for i in 0..members.len() {
                    let member = &members[(start + i) % members.len()];
                    if member.deliveries.try_send(message(member.qos, member.subscription_id)).is_ok() {
                        return true;
                    }
                }
                let member = &members[start];
                (member.deliveries.clone(), member.qos, member.subscription_id)
            };
            if deliveries.send(message(qos, subscription_id)).await.is_ok() {
                return true;
            }
        }
    }
}

/// Every shared group of the broker, by its full filter (`$share/{group}/{filter}`).
#[derive(Default)]
pub(super) struct Groups {
    groups: Mutex<HashMap<String, Arc<Group>>>,
}

impl Groups {
    /// Adds `member` to the group `key`. A new group's follower is what `follow` starts for
    /// it (under the registry's lock, so a member joining meanwhile finds it).
    pub(super) fn join(&self, key: &str, member: Member, follow: impl FnOnce(Arc<Group>) -> JoinHandle<()>) {
        let mut groups = self.groups.lock().expect("groups lock");
        if let Some(existing) = groups.get(key) {
            existing.members.lock().expect("members lock").push(member);
            return;
        }
        let group =
            Arc::new(Group { members: Mutex::new(vec![member]), next: AtomicUsize::new(0), task: Mutex::new(None) });
        *group.task.lock().expect("group task lock") = Some(follow(group.clone()));
        groups.insert(key.to_string(), group);
    }

    /// Removes member `member` from the group `key`; the last one out stops the group's
    /// follower.
    pub(super) fn leave(&self, key: &str, member: u64) {
        let mut groups = self.groups.lock().expect("groups lock");
        let Some(group) = groups.get(key) else { return };
        let empty = {
            let mut members = group.members.lock().expect("members lock");
            members.retain(|other| other.id != member);
            members.is_empty()
        };
        if empty {
            if let Some(task) = group.task.lock().expect("group task lock").take() {
                task.abort();
            }
            groups.remove(key);
        }
    }
}
