//! What the group coordinator needs of its broker, and nothing more: the metadata image, the
//! replicas of `__consumer_offsets` it leads, an acks=all append to them, and whether the broker
//! has caught up with the controller. The coordinator sees this context, not the broker, so the
//! broker can own it without a cycle (as mirroring sees `MirrorContext` and the follower
//! fetchers `FollowerContext`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::controller::MetadataQuorum;
use crate::metadata::MetadataImage;
use crate::mirror::context::HostedPartitions;
use crate::partition::Partition;
use crate::produce::{self, PendingAck, ProduceResult};

/// The broker as the group coordinator sees it.
pub struct GroupContext {
    quorum: Arc<dyn MetadataQuorum>,
    partitions: Arc<HostedPartitions>,
    /// Bumped when a log end or high watermark moved, waking long-polling fetches and acks.
    data_changed: Arc<watch::Sender<u64>>,
    /// Set by the broker once its registration reached the image (`Broker::caught_up`).
    caught_up: Arc<AtomicBool>,
}

impl GroupContext {
    pub fn new(
        quorum: Arc<dyn MetadataQuorum>,
        partitions: Arc<HostedPartitions>,
        data_changed: Arc<watch::Sender<u64>>,
        caught_up: Arc<AtomicBool>,
    ) -> Self {
        GroupContext {
            quorum,
            partitions,
            data_changed,
            caught_up,
        }
    }

    /// The latest committed image.
    pub fn metadata(&self) -> Arc<MetadataImage> {
        self.quorum.image().borrow().clone()
    }

    /// The hosted replica of a partition, if any.
    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        map.get(&(topic.to_string(), index)).cloned()
    }

    /// The hosted replicas of `topic`.
    pub fn partitions_of(&self, topic: &str) -> Vec<Arc<Partition>> {
        let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        map.values().filter(|p| p.topic == topic).cloned().collect()
    }

    /// Whether the broker acts on the image yet; until then it leads nothing for certain.
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::SeqCst)
    }

    /// Appends a batch to `p` as its leader with acks=all, waking the data watchers. The
    /// coordinator always waits for the ISR: the injected `ack-before-replication` bug is about
    /// client produce, not the coordinator's own records.
    pub fn append_all(&self, p: Arc<Partition>, batch: &[u8]) -> Result<PendingAck, ProduceResult> {
        let appended = produce::append(p, batch, -1, produce::AckBugs::default());
        if appended.is_ok() {
            self.data_changed.send_modify(|g| *g = g.wrapping_add(1));
        }
        appended
    }
}
