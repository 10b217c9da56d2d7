//! What mirroring needs of its broker, and nothing more: the mirror tasks and the mirror admin
//! APIs see this context, not the broker, so the broker can own them without a cycle (as the
//! follower fetchers see `FollowerContext`). It imports only `tasks.rs` of `mirror/`.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;

use super::tasks::MirrorTasks;
use crate::config::BrokerConfig;
use crate::controller::{self, ControllerCommand, ControllerReply, MetadataQuorum};
use crate::errors::ApiError;
use crate::faults::{Bug, Faults};
use crate::metadata::MetadataImage;
use crate::partition::Partition;

/// The partitions a broker hosts, by topic and index.
pub type HostedPartitions = RwLock<BTreeMap<(String, i32), Arc<Partition>>>;

/// The injected mirroring bugs this broker runs with (see `faults::Bug`).
#[derive(Clone, Copy, Debug, Default)]
pub struct MirrorDeviations {
    /// `skip-lmle-truncation`: mirror without the LMLE truncation.
    pub skip_lmle_truncation: bool,
    /// `no-epoch-bump-on-failover`: turn writable without bumping the epoch above the LMLE.
    pub no_epoch_bump_on_failover: bool,
    /// `isr-only-lmle-truncation`: wait for the ISR only, whatever the topic's flag says.
    pub isr_only_lmle_truncation: bool,
}

/// The broker as mirroring sees it.
pub struct MirrorContext {
    /// This broker's id: it runs the mirror tasks of the partitions it leads.
    pub node_id: i32,
    /// This cluster's id, sent in LMLE lookups and compared in mirror-loop checks.
    pub cluster_id: String,
    /// Where the mirror APIs sit in the key space (`mirror.api.key.base`).
    pub api_key_base: i16,
    /// `mirror.epoch.bump.threshold` and `mirror.epoch.bump.increment` (proactive bumps).
    pub epoch_bump_threshold: i32,
    pub epoch_bump_increment: i32,
    /// FAILED retries: `mirror.failed.retry.initial.backoff.ms`, `.max.backoff.ms`,
    /// `.max.attempts`.
    pub retry_initial_backoff: Duration,
    pub retry_max_backoff: Duration,
    pub retry_max_attempts: i32,
    pub deviations: MirrorDeviations,
    quorum: Arc<dyn MetadataQuorum>,
    /// The image the broker has acted on (replicas opened, led, followed).
    applied: watch::Receiver<Arc<MetadataImage>>,
    /// Bumped when a log end or high watermark moved, waking long-polling fetches and acks.
    data_changed: Arc<watch::Sender<u64>>,
    partitions: Arc<HostedPartitions>,
    /// The running mirror tasks and what describe reports of them.
    pub tasks: MirrorTasks,
}

impl MirrorContext {
    pub fn new(
        config: &BrokerConfig,
        faults: &Faults,
        quorum: Arc<dyn MetadataQuorum>,
        applied: watch::Receiver<Arc<MetadataImage>>,
        data_changed: Arc<watch::Sender<u64>>,
        partitions: Arc<HostedPartitions>,
    ) -> Self {
        MirrorContext {
            node_id: config.node_id,
            cluster_id: config.cluster_id.clone(),
            api_key_base: config.mirror_api_key_base,
            epoch_bump_threshold: config.mirror_epoch_bump_threshold,
            epoch_bump_increment: config.mirror_epoch_bump_increment,
            retry_initial_backoff: config.mirror_failed_retry_initial_backoff,
            retry_max_backoff: config.mirror_failed_retry_max_backoff,
            retry_max_attempts: config.mirror_failed_retry_max_attempts,
            deviations: MirrorDeviations {
                skip_lmle_truncation: faults.has(Bug::SkipLmleTruncation),
                no_epoch_bump_on_failover: faults.has(Bug::NoEpochBumpOnFailover),
                isr_only_lmle_truncation: faults.has(Bug::IsrOnlyLmleTruncation),
            },
            quorum,
            applied,
            data_changed,
            partitions,
            tasks: MirrorTasks::default(),
        }
    }

    /// The latest committed image.
    pub fn metadata(&self) -> Arc<MetadataImage> {
        self.quorum.image().borrow().clone()
    }

    /// Follows the committed images.
    pub fn images(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.quorum.image()
    }

    /// The hosted replica of a partition, if any.
    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        map.get(&(topic.to_string(), index)).cloned()
    }

    /// Wakes long-polling fetches and acks=all waiters after a log change.
    pub fn notify_data(&self) {
        self.data_changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Submits a controller command; returns once the broker has acted on an image satisfying
    /// `arrived`.
    pub async fn submit_and_wait(
        &self,
        cmd: ControllerCommand,
        arrived: impl Fn(&MetadataImage) -> bool,
    ) -> Result<ControllerReply, ApiError> {
        controller::submit_and_wait(&*self.quorum, self.applied.clone(), cmd, arrived).await
    }
}
