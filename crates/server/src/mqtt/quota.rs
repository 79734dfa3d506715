//! Our receive maximum as MQTT 5 counts it (§4.9): a QoS 1 publish from the client is
//! outstanding until its PUBACK, a QoS 2 one until its PUBCOMP — through PUBREC and PUBREL —
//! or until an acknowledgement that refuses it. A client with the receive maximum outstanding
//! that sends one more QoS 1 or 2 publish has broken the protocol.

use std::collections::HashMap;
use std::num::NonZeroU16;
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub(super) struct InboundQuota {
    /// One permit per outstanding publish. A semaphore, not a count: the tasks that wait for a
    /// publish's record to be durable hold its permit until its acknowledgement is handed over.
    permits: Arc<Semaphore>,
    /// The permits of QoS 2 publishes acknowledged with PUBREC, kept until their PUBREL: the
    /// client cannot send more of them unreleased than the receive maximum.
    releasing: HashMap<NonZeroU16, OwnedSemaphorePermit>,
}

impl InboundQuota {
    pub(super) fn new(receive_max: u16) -> InboundQuota {
        InboundQuota { permits: Arc::new(Semaphore::new(usize::from(receive_max))), releasing: HashMap::new() }
    }

    /// A permit for one more publish, or `None` when the receive maximum is outstanding.
    pub(super) fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// A permit once one is free: MQTT 3.1.1 has no receive maximum, and a client that outruns
    /// the disk waits here.
    pub(super) async fn take(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().acquire_owned().await.ok()
    }

    /// Keeps the permit of QoS 2 publish `packet_id` until its PUBREL (or its refusal).
    pub(super) fn hold_until_release(&mut self, packet_id: NonZeroU16, permit: OwnedSemaphorePermit) {
        self.releasing.insert(packet_id, permit);
    }

    /// QoS 2 publish `packet_id` is done with: released, or refused.
    pub(super) fn release(&mut self, packet_id: NonZeroU16) {
        self.releasing.remove(&packet_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_permit_returns_on_release_only() {
        let mut quota = InboundQuota::new(2);
        let (one, two) = (NonZeroU16::new(1).unwrap(), NonZeroU16::new(2).unwrap());
        quota.hold_until_release(one, quota.try_take().unwrap());
        quota.hold_until_release(two, quota.try_take().unwrap());
        assert!(quota.try_take().is_none(), "both held until released");
        quota.release(one);
        let third = quota.try_take();
        assert!(third.is_some());
        assert!(quota.try_take().is_none());
        drop(third);
        assert!(quota.try_take().is_some(), "a permit not held returns when dropped");
    }
}
