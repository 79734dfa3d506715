//! What a persistent session's subscriptions delivered, and what the client acknowledged of
//! it: the positions a session resumes from, and on resume which messages come again flagged
//! DUP (handed over, never acknowledged) and which do not come again at all (acknowledged,
//! above an earlier unacknowledged one). Plain state, no I/O: followers note deliveries, the
//! connection notes acknowledgements, the session store writes it down.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use super::sessions::StoredSubscription;

/// What one subscription has delivered and which deliveries are still unacknowledged, per
/// stream partition: a persistent session resumes from the first unacknowledged message, or
/// past everything delivered when all is acknowledged.
#[derive(Default)]
pub(super) struct Progress {
    streams: HashMap<String, StreamProgress>,
}

struct StreamProgress {
    /// The cursor's position after the last record it handed over.
    next: Vec<u64>,
    unacked: Vec<BTreeSet<u64>>,
}

pub(super) type SharedProgress = Arc<Mutex<Progress>>;

impl Progress {
    /// A stream followed from `positions`.
    pub(super) fn start(&mut self, stream: &str, positions: &[u64]) {
        self.streams.insert(
            stream.to_string(),
            StreamProgress { next: positions.to_vec(), unacked: vec![Default::default(); positions.len()] },
        );
    }

    /// A record handed over for delivery; `next` is the cursor's position after it.
    pub(super) fn delivered(&mut self, stream: &str, partition: u32, offset: u64, next: &[u64]) {
        let Some(progress) = self.streams.get_mut(stream) else { return };
        progress.next = next.to_vec();
        if let Some(unacked) = progress.unacked.get_mut(partition as usize) {
            unacked.insert(offset);
        }
    }

    pub(super) fn acked(&mut self, stream: &str, partition: u32, offset: u64) {
        if let Some(unacked) =
            self.streams.get_mut(stream).and_then(|progress| progress.unacked.get_mut(partition as usize))
        {
            unacked.remove(&offset);
        }
    }

    /// Per stream and partition, the records handed over and not acknowledged, in order.
    pub(super) fn unacked(&self) -> BTreeMap<String, Vec<Vec<u64>>> {
        self.streams
            .iter()
            .map(|(stream, progress)| {
                (stream.clone(), progress.unacked.iter().map(|offsets| offsets.iter().copied().collect()).collect())
            })
            .collect()
    }

    /// Per stream, how far records were handed over for delivery.
    pub(super) fn sent(&self) -> BTreeMap<String, Vec<u64>> {
        self.streams.iter().map(|(stream, progress)| (stream.clone(), progress.next.clone())).collect()
    }

    /// Per stream, where a resumed subscription starts.
    pub(super) fn committed(&self) -> BTreeMap<String, Vec<u64>> {
        self.streams
            .iter()
            .map(|(stream, progress)| {
                let positions = progress
                    .next
                    .iter()
                    .zip(&progress.unacked)
                    .map(|(&next, unacked)| unacked.first().map_or(next, |&first| first.min(next)))
                    .collect();
                (stream.clone(), positions)
            })
            .collect()
    }
}

/// A delivered message to mark acknowledged in its subscription's progress.
pub(super) struct Acked {
    pub(super) progress: SharedProgress,
    pub(super) stream: Arc<str>,
    pub(super) partition: u32,
    pub(super) offset: u64,
}

impl Acked {
    pub(super) fn mark(self) {
        self.progress.lock().expect("progress lock").acked(&self.stream, self.partition, self.offset);
    }
}

/// What a resumed subscription had sent before, from its stored session.
pub(super) struct Resumed {
    /// Per stream partition, how far records had been handed over.
    sent: BTreeMap<String, Vec<u64>>,
    /// Per stream partition, which of those had not been acknowledged (sorted); `None` for a
    /// session stored before this was kept: then all of them count as unacknowledged.
    unacked: Option<BTreeMap<String, Vec<Vec<u64>>>>,
}

impl Resumed {
    pub(super) fn of(stored: &StoredSubscription) -> Arc<Resumed> {
        Arc::new(Resumed { sent: stored.sent.clone(), unacked: stored.unacked.clone() })
    }

    /// Whether the record at `offset` was sent before (so it goes again flagged DUP), and
    /// whether it was also acknowledged (so it does not go again at all).
    pub(super) fn sent_before(&self, stream: &str, partition: u32, offset: u64) -> (bool, bool) {
        let sent = self
            .sent
            .get(stream)
            .and_then(|positions| positions.get(partition as usize))
            .is_some_and(|&sent| offset < sent);
        let acknowledged = sent
            && self.unacked.as_ref().is_some_and(|unacked| {
                unacked
                    .get(stream)
                    .and_then(|partitions| partitions.get(partition as usize))
                    .is_none_or(|offsets| offsets.binary_search(&offset).is_err())
            });
        (sent, acknowledged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a session stores of a subscription with this progress.
    fn stored(progress: &Progress) -> StoredSubscription {
        StoredSubscription {
            positions: progress.committed(),
            sent: progress.sent(),
            unacked: Some(progress.unacked()),
            ..StoredSubscription::default()
        }
    }

    #[test]
    fn a_session_resumes_from_its_first_unacknowledged_message() {
        let mut progress = Progress::default();
        progress.start("s", &[10, 0]);
        for offset in 10..13 {
            progress.delivered("s", 0, offset, &[offset + 1, 0]);
        }
        progress.acked("s", 0, 10);
        progress.acked("s", 0, 12);
        let stored = stored(&progress);
        assert_eq!(stored.positions["s"], [11, 0], "11 was never acknowledged");
        assert_eq!(stored.sent["s"], [13, 0]);
        assert_eq!(stored.unacked.as_ref().unwrap()["s"], [vec![11], vec![]]);
        progress.acked("s", 0, 11);
        assert_eq!(progress.committed()["s"], [13, 0], "all acknowledged: past everything delivered");
    }

    #[test]
    fn on_resume_unacknowledged_messages_come_again_as_dup_and_acknowledged_ones_do_not() {
        let mut progress = Progress::default();
        progress.start("s", &[0]);
        for offset in 0..3 {
            progress.delivered("s", 0, offset, &[offset + 1]);
        }
        // The client acknowledged 0 and 2 (2 a QoS 2 message whose PUBREC came), not 1.
        progress.acked("s", 0, 0);
        progress.acked("s", 0, 2);
        let resumed = Resumed::of(&stored(&progress));
        assert_eq!(resumed.sent_before("s", 0, 1), (true, false), "sent, unacknowledged: again, DUP");
        assert_eq!(resumed.sent_before("s", 0, 2), (true, true), "acknowledged: never again");
        assert_eq!(resumed.sent_before("s", 0, 3), (false, false), "never sent: new");
        assert_eq!(resumed.sent_before("other", 0, 1), (false, false), "a stream the session never followed");
    }

    #[test]
    fn a_session_stored_before_unacked_was_kept_sends_everything_again_as_dup() {
        let mut stored = StoredSubscription::default();
        stored.sent.insert("s".into(), vec![5]);
        let resumed = Resumed::of(&stored);
        assert_eq!(resumed.sent_before("s", 0, 4), (true, false));
        assert_eq!(resumed.sent_before("s", 0, 5), (false, false));
    }

    #[test]
    fn marking_an_acknowledgement_reaches_the_shared_progress() {
        let progress: SharedProgress = SharedProgress::default();
        progress.lock().unwrap().start("s", &[0]);
        progress.lock().unwrap().delivered("s", 0, 0, &[1]);
        Acked { progress: progress.clone(), stream: Arc::from("s"), partition: 0, offset: 0 }.mark();
        assert_eq!(progress.lock().unwrap().committed()["s"], [1]);
    }
}
