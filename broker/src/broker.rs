//! The broker's core: the partitions this node hosts and the operations clients ask of them
//! (produce, fetch, offsets, topics, configs), independent of the wire encoding. The protocol
//! layer translates Kafka requests into these calls and their results back into responses.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::{BrokerConfig, LogConfig};
use crate::controller::{
    fencing, submit_and_wait, ControllerCommand, ControllerReply, Election, MetadataQuorum,
};
use crate::errors;
pub use crate::errors::ApiError;
use crate::faults::{Bug, Faults};
use crate::group::context::GroupContext;
use crate::group::GroupCoordinator;
use crate::metadata::{
    validate_topic_name, BrokerEndpoint, ClusterDefaults, LeaderRecoveryState, MetadataImage,
    TopicRegistration,
};
use crate::mirror::context::{HostedPartitions, MirrorContext};
use crate::mirror::runner;
use crate::partition::{Checkpointed, Deviations, Host, Partition, RoleChange};
pub use crate::partition::{FetchResult, FetchSpec};
use crate::pause::sleep_or_cancel;
use crate::produce;
pub use crate::produce::{PendingAck, ProduceResult};
use crate::producer_ids::ProducerIdAllocator;
use crate::replica::fetcher::{FetchTarget, FollowerContext, ReplicaFetchers};
use crate::tiered::follower::TieredFollower;
use crate::tiered::manager::{self, TieredStore};
use crate::tiered::storage::TopicIdPartition;

/// Name of the high-watermark checkpoint in the log dir, as Kafka names it.
pub const HW_CHECKPOINT_FILE: &str = "replication-offset-checkpoint";

/// Name of the log-start-offset checkpoint in the log dir, as Kafka names it; same format.
pub const LOG_START_CHECKPOINT_FILE: &str = "log-start-offset-checkpoint";

/// The broker of one node.
pub struct Broker {
    pub config: BrokerConfig,
    pub faults: Faults,
    /// Random per process start; tells a restarted broker apart from its previous run.
    pub incarnation: u64,
    /// Whether the previous process closed the log directory cleanly ([`CLEAN_SHUTDOWN_FILE`]):
    /// the controller takes a broker back from an unclean shutdown out of the eligible leader
    /// replicas (KIP-966), since its log may have lost what it had acknowledged.
    pub clean_start: bool,
    /// The log directory's id (`directory.id` in `meta.properties`, KIP-858): a directory that
    /// lost everything comes back with another, so the controller knows its replicas are empty.
    pub directory_id: uuid::Uuid,
    quorum: Arc<dyn MetadataQuorum>,
    partitions: Arc<HostedPartitions>,
    /// Bumped whenever any log end or high watermark moves; long-polling fetches wait on it.
    data_generation: Arc<watch::Sender<u64>>,
    /// High watermarks from the checkpoint at start, for partitions opened later.
    stored_hw: BTreeMap<(String, i32), i64>,
    /// Log start offsets from their checkpoint at start, for partitions opened later.
    stored_log_start: BTreeMap<(String, i32), i64>,
    /// Set once the image holds this process's registration; see [`Broker::caught_up`].
    caught_up: Arc<AtomicBool>,
    /// The last image this broker has acted on (its replicas opened, led, followed, deleted).
    applied: watch::Sender<Arc<MetadataImage>>,
    /// Mirroring as it sees this broker, with the mirror tasks of the partitions it leads.
    pub mirrors: Arc<MirrorContext>,
    /// Producer ids for InitProducerId, taken from the controller in blocks.
    pub producer_ids: ProducerIdAllocator,
    /// The consumer groups this broker coordinates.
    pub groups: Arc<GroupCoordinator>,
    /// The remote store of tiered topics, when one is configured (`remote.log.storage.*`).
    pub tiered: Option<TieredStore>,
    /// Incremental fetch sessions (KIP-227).
    pub fetch_sessions: std::sync::Mutex<crate::fetch_session::FetchSessions>,
    /// The follower fetchers, one per leader broker.
    fetchers: ReplicaFetchers,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("node_id", &self.config.node_id)
            .finish()
    }
}

impl Broker {
    /// Opens the log directory; partitions are opened as the metadata names them.
    pub fn open(
        config: BrokerConfig,
        faults: Faults,
        quorum: Arc<dyn MetadataQuorum>,
    ) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.log_dir).map_err(|e| {
            anyhow::anyhow!("cannot create log dir {}: {e}", config.log_dir.display())
        })?;
        config
            .advertised_client_listener()
            .ok_or_else(|| anyhow::anyhow!("no client listener in `listeners`"))?;
        let stored_hw = read_hw_checkpoint(&config.log_dir.join(HW_CHECKPOINT_FILE))?;
        let stored_log_start = read_hw_checkpoint(&config.log_dir.join(LOG_START_CHECKPOINT_FILE))?;
        let tiered = match &config.tiered.store {
            Some(store) => Some(TieredStore::open(store).map_err(|e| anyhow::anyhow!(e))?),
            None => None,
        };
        let directory_id = write_meta_properties(&config)?;
        let clean_start = take_clean_shutdown_marker(&config.log_dir)?;
        let data_generation = Arc::new(watch::channel(0).0);
        let incarnation = uuid::Uuid::new_v4().as_u64_pair().0;
        let partitions = Arc::new(HostedPartitions::default());
        let (applied, applied_rx) = watch::channel(Arc::default());
        let mirrors = Arc::new(MirrorContext::new(
            &config,
            &faults,
            quorum.clone(),
            applied_rx,
            data_generation.clone(),
            partitions.clone(),
        ));
        let caught_up = Arc::new(AtomicBool::new(false));
        let groups = Arc::new(GroupCoordinator::new(GroupContext::new(
            quorum.clone(),
            partitions.clone(),
            data_generation.clone(),
            caught_up.clone(),
        )));
        Ok(Arc::new(Broker {
            config,
            faults,
            incarnation,
            clean_start,
            directory_id,
            quorum,
            partitions,
            data_generation,
            stored_hw,
            stored_log_start,
            caught_up,
            applied,
            mirrors,
            producer_ids: ProducerIdAllocator::default(),
            groups,
            tiered,
            fetch_sessions: Default::default(),
            fetchers: ReplicaFetchers::default(),
        }))
    }

    pub fn quorum(&self) -> &Arc<dyn MetadataQuorum> {
        &self.quorum
    }

    /// The image this broker acts on.
    pub fn metadata(&self) -> Arc<MetadataImage> {
        self.quorum.image().borrow().clone()
    }

    fn log_config_for(&self, image: &MetadataImage, topic: &TopicRegistration) -> LogConfig {
        let mut lc = self.config.log.clone();
        lc.min_insync_replicas = if image.defaults.min_insync_replicas > 0 {
            image.defaults.min_insync_replicas
        } else {
            lc.min_insync_replicas
        };
        for (k, v) in &topic.configs {
            if let Err(e) = lc.set_topic_key(k, v) {
                warn!(topic = ?topic.name, "ignoring stored topic config: {e}");
            }
        }
        lc
    }

    fn partitions_write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<(String, i32), Arc<Partition>>> {
        self.partitions.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn partition(&self, topic: &str, index: i32) -> Option<Arc<Partition>> {
        let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        map.get(&(topic.to_string(), index)).cloned()
    }

    /// The error for a partition this broker does not host: as in Kafka, NOT_LEADER_OR_FOLLOWER
    /// when the partition exists (this broker is no replica, or is still catching up with the
    /// metadata), INVALID_TOPIC_EXCEPTION for a name Kafka does not allow, UNKNOWN_TOPIC_OR_PARTITION
    /// otherwise.
    pub(crate) fn not_hosted_error(&self, topic: &str, index: i32) -> i16 {
        let error = if validate_topic_name(topic).is_err() {
            ResponseError::InvalidTopicException
        } else if self
            .metadata()
            .topics
            .get(topic)
            .is_some_and(|t| usize::try_from(index).is_ok_and(|i| i < t.partitions.len()))
        {
            ResponseError::NotLeaderOrFollower
        } else {
            ResponseError::UnknownTopicOrPartition
        };
        error.code()
    }

    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }

    /// This broker as its replicas know it: its id and the replica rules it breaks on purpose.
    fn host(&self) -> Host {
        Host {
            node_id: self.config.node_id,
            deviations: Deviations {
                no_strict_min_isr: self.faults.has(Bug::NoStrictMinIsr),
                accept_stale_epoch: self.faults.has(Bug::AcceptStaleEpoch),
                local_epoch_in_mirror_cache: self.faults.has(Bug::LocalEpochInMirrorCache),
                read_past_high_watermark: self.faults.has(Bug::ReadPastHighWatermark),
                isr_join_before_caught_up: self.faults.has(Bug::IsrJoinBeforeCaughtUp),
                hw_from_sent_records: self.faults.has(Bug::HwFromSentRecords),
            },
        }
    }

    /// What this broker's follower fetchers need of it.
    fn follower_context(&self) -> FollowerContext {
        FollowerContext {
            node_id: self.config.node_id,
            hw_truncation: self.faults.has(Bug::HwTruncation),
            fetch_max_bytes: self.config.replica_fetch_max_bytes,
            data_changed: self.data_generation.clone(),
            tiered: self.tiered.clone().map(|store| TieredFollower {
                store,
                // The quorum's image, not the applied one: a fetcher started by a reconcile runs
                // before that reconcile's image is published as applied, and a broker's first
                // reconcile after a restart would read the flag from the image before it.
                image: self.quorum.image(),
                fetch_last_tiered_offset: self
                    .config
                    .tiered
                    .follower_fetch_last_tiered_offset_enable,
                bootstrap_off_by_one: self.faults.has(Bug::TieredBootstrapOffByOne),
                bootstrap_drops_producer_state: self
                    .faults
                    .has(Bug::TieredBootstrapDropsProducerState),
                flag_not_dynamic: self.faults.has(Bug::TieredFlagNotDynamic),
            }),
        }
    }

    /// Wakes long-polling fetches and acks=all waiters.
    pub fn notify_data(&self) {
        self.data_generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// Subscribes to "some log end or high watermark moved".
    pub fn watch_data(&self) -> watch::Receiver<u64> {
        self.data_generation.subscribe()
    }

    /// Starts the background duties: following metadata, registration and heartbeats, the
    /// active controller's broker fencing, and the leader's ISR maintenance.
    pub fn start(self: &Arc<Self>, shutdown: CancellationToken) -> Vec<JoinHandle<()>> {
        vec![
            tokio::spawn(self.clone().follow_metadata(shutdown.clone())),
            tokio::spawn(self.clone().register_and_heartbeat(shutdown.clone())),
            tokio::spawn(fencing::fence_silent_brokers(
                self.quorum.clone(),
                self.config.session_timeout,
                shutdown.clone(),
            )),
            tokio::spawn(self.clone().maintain_isr(shutdown.clone())),
            tokio::spawn(crate::group::run(self.groups.clone(), shutdown)),
        ]
    }

    /// Whether `image` holds this process's own registration. The image is applied in log order,
    /// so it then also holds every change committed before the registration, including the
    /// controller moving leadership away from this node's previous incarnation.
    fn registered_in(&self, image: &MetadataImage) -> bool {
        image
            .brokers
            .get(&self.config.node_id)
            .is_some_and(|b| b.incarnation == self.incarnation)
    }

    /// Subscribes to the image this broker has acted on.
    pub fn watch_applied(&self) -> watch::Receiver<Arc<MetadataImage>> {
        self.applied.subscribe()
    }

    /// Whether this process's registration has reached its image. Before that the image may be
    /// a stale local copy, so this broker neither acts on it nor tells clients who leads.
    pub fn caught_up(&self) -> bool {
        self.caught_up.load(Ordering::SeqCst)
    }

    /// Acts on the metadata as it arrives, but only once this process is registered: until then
    /// the image may be this node's stale local copy, naming it leader in an epoch the cluster
    /// has left, so no replica is opened, led or followed (Kafka's fenced, catching-up broker).
    async fn follow_metadata(self: Arc<Self>, shutdown: CancellationToken) {
        let mut rx = self.quorum.image();
        loop {
            let image = rx.borrow_and_update().clone();
            if !self.caught_up() && self.registered_in(&image) {
                info!(
                    incarnation = self.incarnation,
                    "caught up with the controller's metadata; acting on it"
                );
                self.caught_up.store(true, Ordering::SeqCst);
            }
            if self.caught_up() {
                self.reconcile(&image);
                self.applied.send_replace(image);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = rx.changed() => if r.is_err() { return },
            }
        }
    }

    /// Brings the local replicas in line with `image`: opens new ones, adopts registrations,
    /// starts or stops fetchers, and deletes replicas of deleted topics.
    fn reconcile(self: &Arc<Self>, image: &MetadataImage) {
        let me = self.config.node_id;
        let stale: Vec<(String, i32)> = {
            let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
            map.keys()
                .filter(|(t, _)| !image.topics.contains_key(t))
                .cloned()
                .collect()
        };
        for key in stale {
            if let Some(p) = self.partitions_write().remove(&key) {
                stop_fetcher(&p);
                let dir = p.dir().to_path_buf();
                drop(p);
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    warn!("cannot remove {}: {e}", dir.display());
                }
                info!(topic = ?key.0, partition = key.1, "deleted replica");
            }
        }
        for topic in image.topics.values() {
            let lc = self.log_config_for(image, topic);
            for (i, reg) in topic.partitions.iter().enumerate() {
                let index = i as i32;
                if !reg.replicas.contains(&me) {
                    continue;
                }
                let p = match self.partition(&topic.name, index) {
                    Some(p) => p,
                    None => match Partition::open(
                        &self.config.log_dir,
                        &topic.name,
                        index,
                        self.host(),
                        lc.clone(),
                        reg.clone(),
                        Checkpointed {
                            high_watermark: self
                                .stored_hw
                                .get(&(topic.name.clone(), index))
                                .copied(),
                            log_start_offset: self
                                .stored_log_start
                                .get(&(topic.name.clone(), index))
                                .copied(),
                        },
                    ) {
                        Ok((p, notes)) => {
                            for n in notes {
                                warn!(topic = ?topic.name, partition = index, "recovery: {n}");
                            }
                            let p = Arc::new(p);
                            self.partitions_write()
                                .insert((topic.name.clone(), index), p.clone());
                            p
                        }
                        Err(e) => {
                            error!(topic = ?topic.name, partition = index, "cannot open replica: {e}");
                            continue;
                        }
                    },
                };
                if !p.has_config(&lc) {
                    p.set_config(lc.clone());
                }
                let mirror_state = image.mirror_state(&topic.name, index);
                let was_leading = p.leading_epoch().is_some();
                let change = p.apply_registration_with_mirror_state(reg.clone(), mirror_state);
                let mirror_leader = reg.leader == me
                    && mirror_state
                        .is_some_and(|m| m != crate::mirror::rules::MirrorState::Stopped);
                // A new epoch restarts the mirror task, unless the task moved to it itself
                // while leading: it is in the middle of what it moved for (a truncation).
                let own_move = was_leading && self.mirrors.tasks.moved_itself(&p, reg.leader_epoch);
                if !mirror_leader || (matches!(change, Ok(RoleChange::BecameLeader)) && !own_move) {
                    self.mirrors.tasks.stop(&p);
                }
                if mirror_leader {
                    runner::ensure(&self.mirrors, &p);
                }
                // Any role change ends the replica's fetching as a follower, and answers the
                // fetches parked on it at once, as Kafka completes its delayed fetches on one.
                if !matches!(change, Ok(RoleChange::None) | Err(_)) {
                    stop_fetcher(&p);
                    self.notify_data();
                }
                match change {
                    Ok(RoleChange::None | RoleChange::Leaderless) => {}
                    Ok(RoleChange::BecameLeader) => {
                        info!(topic = ?topic.name, partition = index, epoch = reg.leader_epoch, "became leader");
                    }
                    Ok(RoleChange::Follow { leader, epoch }) => {
                        let Some(ep) = image.brokers.get(&leader) else {
                            continue;
                        };
                        let target = FetchTarget {
                            leader,
                            leader_epoch: epoch,
                            address: format!("{}:{}", ep.host, ep.port),
                        };
                        let cancel = CancellationToken::new();
                        *p.fetcher.lock().unwrap_or_else(|x| x.into_inner()) = Some(cancel.clone());
                        self.fetchers
                            .follow(self.follower_context(), p.clone(), target, cancel);
                    }
                    Err(e) => {
                        error!(topic = ?topic.name, partition = index, "cannot adopt registration: {e}")
                    }
                }
            }
        }
    }

    async fn register_and_heartbeat(self: Arc<Self>, shutdown: CancellationToken) {
        let listener = self
            .config
            .advertised_client_listener()
            .expect("checked at open")
            .clone();
        let endpoint = BrokerEndpoint {
            id: self.config.node_id,
            host: listener.host,
            port: listener.port,
            incarnation: self.incarnation,
            fenced: false,
            shutting_down: false,
            directory_id: Some(self.directory_id),
        };
        let defaults = ClusterDefaults {
            unclean_leader_election_enable: self.config.log.unclean_leader_election_enable,
            min_insync_replicas: self.config.log.min_insync_replicas,
            eligible_leader_replicas: self.config.eligible_leader_replicas,
        };
        let cmd = ControllerCommand::RegisterBroker {
            endpoint,
            defaults,
            unclean_shutdown: !self.clean_start,
        };
        loop {
            match self.quorum.submit(cmd.clone()).await {
                Ok(ControllerReply::Done) => break,
                Ok(other) => warn!("registration refused: {other:?}"),
                Err(e) => debug!("registration pending: {e}"),
            }
            if sleep_or_cancel(&shutdown, Duration::from_millis(200)).await {
                return;
            }
        }
        info!(
            incarnation = self.incarnation,
            "registered with the controller"
        );
        loop {
            if let Err(e) = self
                .quorum
                .heartbeat(self.config.node_id, self.incarnation)
                .await
            {
                debug!("heartbeat failed: {e}");
            }
            if sleep_or_cancel(&shutdown, self.config.heartbeat_interval).await {
                return;
            }
        }
    }

    /// On every partition this broker leads: shrink the ISR by followers that stopped catching
    /// up, and declare a RECOVERING leader recovered (its log is the truth once it leads).
    async fn maintain_isr(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if sleep_or_cancel(&shutdown, Duration::from_millis(250)).await {
                return;
            }
            let now = Instant::now();
            for p in self.all_partitions() {
                let change = p.isr_shrink(now, self.config.replica_lag_time_max);
                if let Some((isr, recovery)) = change {
                    self.alter_partition(&p, isr, recovery);
                }
            }
        }
    }

    /// Asks the controller for a new ISR, unless a request for this partition is in flight.
    fn alter_partition(
        self: &Arc<Self>,
        p: &Arc<Partition>,
        new_isr: Vec<i32>,
        recovery_state: LeaderRecoveryState,
    ) {
        if p.alter_in_flight.swap(true, Ordering::SeqCst) {
            return;
        }
        let (leader_epoch, partition_epoch) = p.alter_partition_epochs();
        let cmd = ControllerCommand::AlterPartition {
            broker_id: self.config.node_id,
            topic: p.topic.clone(),
            partition: p.index,
            leader_epoch,
            partition_epoch,
            new_isr,
            recovery_state,
        };
        let broker = self.clone();
        let p = p.clone();
        tokio::spawn(async move {
            match broker.quorum.submit(cmd).await {
                Ok(ControllerReply::Partition(reg)) => {
                    debug!(topic = ?p.topic, partition = p.index, isr = ?reg.isr, "ISR changed");
                    // Adopt at once so the high watermark can move before the image arrives.
                    if let Err(e) = p.apply_registration(reg) {
                        warn!("cannot adopt registration: {e}");
                    }
                    p.maybe_increment_high_watermark();
                    broker.notify_data();
                }
                Ok(other) => {
                    debug!(topic = ?p.topic, partition = p.index, "AlterPartition refused: {other:?}");
                    p.drop_proposed_isr();
                }
                Err(e) => {
                    debug!(topic = ?p.topic, partition = p.index, "AlterPartition failed: {e}");
                    p.drop_proposed_isr();
                }
            }
            p.alter_in_flight.store(false, Ordering::SeqCst);
        });
    }

    /// Submits a command and waits until this broker has acted on an image that satisfies
    /// `arrived`: a topic it created here is led here (when this broker leads it) by the time the
    /// client hears of it.
    pub async fn submit_and_wait(
        &self,
        cmd: ControllerCommand,
        arrived: impl Fn(&MetadataImage) -> bool,
    ) -> Result<ControllerReply, ApiError> {
        submit_and_wait(&*self.quorum, self.applied.subscribe(), cmd, arrived).await
    }

    /// Creates a topic through the controller, resolving defaults from this broker's config.
    pub async fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
        validate_only: bool,
        assignments: Vec<Vec<i32>>,
    ) -> Result<TopicRegistration, ApiError> {
        self.check_remote_store(configs.iter().map(|(k, v)| (k.as_str(), Some(v.as_str()))))?;
        let cmd = ControllerCommand::CreateTopic {
            assignments,
            name: name.to_string(),
            id: uuid::Uuid::new_v4(),
            partitions: if num_partitions == -1 {
                self.config.num_partitions
            } else {
                num_partitions
            },
            replication_factor: if replication_factor == -1 {
                self.config.default_replication_factor
            } else {
                replication_factor
            },
            configs: configs.clone(),
            validate_only,
            mirror: None,
        };
        let reply = self
            .submit_and_wait(cmd, |i| validate_only || i.topics.contains_key(name))
            .await?;
        match reply {
            ControllerReply::Topic(t) => {
                info!(
                    topic = ?name,
                    partitions = t.partitions.len(),
                    "created topic"
                );
                Ok(t)
            }
            other => Err(ApiError::new(
                errors::UNKNOWN_SERVER_ERROR,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// Refuses topic configs that turn `remote.storage.enable` on when this broker has no remote
    /// store, as Kafka refuses them while tiered storage is off on the broker: the topic would
    /// keep its whole log locally while saying it tiers.
    fn check_remote_store<'c>(
        &self,
        mut configs: impl Iterator<Item = (&'c str, Option<&'c str>)>,
    ) -> Result<(), ApiError> {
        let enables = configs.any(|(k, v)| {
            k == "remote.storage.enable" && v.is_some_and(|v| v.eq_ignore_ascii_case("true"))
        });
        if enables && self.tiered.is_none() {
            return Err(ApiError::new(
                errors::INVALID_CONFIG,
                "remote.storage.enable=true needs a remote store, and this broker has none \
                 (neither remote.log.storage.dir nor remote.log.storage.s3.bucket is set)",
            ));
        }
        Ok(())
    }

    pub async fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        self.submit_and_wait(
            ControllerCommand::DeleteTopic {
                name: name.to_string(),
            },
            |i| !i.topics.contains_key(name),
        )
        .await
        .map(|_| ())
    }

    /// Sets (`Some`) or deletes (`None`) topic-level configs through the controller.
    pub async fn alter_topic_configs(
        &self,
        name: &str,
        changes: &[(String, Option<String>)],
        validate_only: bool,
    ) -> Result<(), ApiError> {
        self.check_remote_store(changes.iter().map(|(k, v)| (k.as_str(), v.as_deref())))?;
        let cmd = ControllerCommand::AlterTopicConfigs {
            name: name.to_string(),
            changes: changes.to_vec(),
            validate_only,
        };
        let expect: BTreeMap<String, Option<String>> = changes.iter().cloned().collect();
        self.submit_and_wait(cmd, |i| {
            validate_only
                || i.topics
                    .get(name)
                    .is_some_and(|t| expect.iter().all(|(k, v)| t.configs.get(k) == v.as_ref()))
        })
        .await
        .map(|_| ())
    }

    /// IncrementalAlterConfigs of the cluster-default broker resource, through the controller.
    pub async fn alter_cluster_configs(
        &self,
        changes: &[(String, Option<String>)],
        validate_only: bool,
    ) -> Result<(), ApiError> {
        let cmd = ControllerCommand::AlterClusterConfigs {
            changes: changes.to_vec(),
            validate_only,
        };
        let expect: BTreeMap<String, Option<String>> = changes.iter().cloned().collect();
        self.submit_and_wait(cmd, |i| {
            validate_only
                || expect
                    .iter()
                    .all(|(k, v)| i.cluster_configs.get(k) == v.as_ref())
        })
        .await
        .map(|_| ())
    }

    /// ElectLeaders through the controller; one result per partition.
    pub async fn elect_leaders(
        &self,
        election: Election,
        partitions: Option<Vec<(String, i32)>>,
    ) -> Result<Vec<(String, i32, i16, Option<String>)>, ApiError> {
        match self
            .quorum
            .submit(ControllerCommand::ElectLeaders {
                election,
                partitions,
            })
            .await
        {
            Ok(ControllerReply::Elections(r)) => Ok(r),
            Ok(ControllerReply::Error { code, message }) => Err(ApiError::new(code, message)),
            Ok(other) => Err(ApiError::new(
                errors::UNKNOWN_SERVER_ERROR,
                format!("unexpected reply {other:?}"),
            )),
            Err(e) => Err(ApiError::new(errors::REQUEST_TIMED_OUT, e.to_string())),
        }
    }

    /// The effective log config of a topic.
    pub fn topic_log_config(&self, name: &str) -> Option<LogConfig> {
        let image = self.metadata();
        image
            .topics
            .get(name)
            .map(|t| self.log_config_for(&image, t))
    }

    /// The injected bugs of the acks=all path, for client produce.
    fn ack_bugs(&self) -> produce::AckBugs {
        produce::AckBugs {
            ack_before_replication: self.faults.has(Bug::AckBeforeReplication),
            ack_on_leadership_loss: self.faults.has(Bug::AckOnLeadershipLoss),
        }
    }

    /// Appends client records to a partition this broker leads (see [`produce::append`]).
    /// Appending is synchronous so that requests on one connection append in their order.
    pub fn append_produce(
        &self,
        topic: &str,
        index: i32,
        records: &[u8],
        acks: i16,
    ) -> Result<PendingAck, ProduceResult> {
        let Some(p) = self.partition(topic, index) else {
            return Err(ProduceResult::failed(
                self.not_hosted_error(topic, index),
                format!("{topic}-{index} is not hosted here"),
            ));
        };
        let appended = produce::append(p, records, acks, self.ack_bugs());
        // Only an append that happened moves the log end.
        if !matches!(&appended, Err(r) if r.error != errors::NONE) {
            self.notify_data();
        }
        appended
    }

    /// Reads from a partition this broker leads (see [`Partition::fetch`]), asking the
    /// controller to grow the ISR when the fetching follower may join it.
    pub fn fetch(self: &Arc<Self>, topic: &str, index: i32, spec: FetchSpec) -> FetchResult {
        let Some(p) = self.partition(topic, index) else {
            return FetchResult {
                error: self.not_hosted_error(topic, index),
                high_watermark: -1,
                log_start_offset: -1,
                ..Default::default()
            };
        };
        let (mut result, expand) = p.fetch(spec);
        if let Some(isr) = expand {
            info!(topic = ?topic, partition = index, ?isr, "expanding ISR");
            self.alter_partition(&p, isr, LeaderRecoveryState::Recovered);
        }
        if let Some(lineage) = result.read_remote.take() {
            let read = match (&self.tiered, self.topic_id_partition(topic, index)) {
                (Some(store), Some(tp)) => blocking(|| {
                    store.read(
                        &tp,
                        &lineage,
                        spec.fetch_offset,
                        result.high_watermark,
                        spec.max_bytes,
                    )
                }),
                _ => Err("no remote store is configured".into()),
            };
            match read {
                Ok(records) => result.records = records,
                Err(e) => {
                    warn!(topic = ?topic, partition = index, offset = spec.fetch_offset, "remote read failed: {e}");
                    result.error = errors::KAFKA_STORAGE_ERROR;
                }
            }
        }
        result
    }

    /// A partition as the remote store names it, by the topic's id in the metadata.
    pub fn topic_id_partition(&self, topic: &str, index: i32) -> Option<TopicIdPartition> {
        let image = self.metadata();
        let t = image.topics.get(topic)?;
        Some(TopicIdPartition {
            topic_id: t.id,
            topic: topic.to_string(),
            partition: index,
        })
    }

    /// One round of the remote log manager on every hosted replica
    /// (`remote.log.manager.task.interval.ms`): a leader of a tiered topic uploads its closed
    /// committed segments, then every replica learns the tiered offsets and deletes the uploaded
    /// segments local retention lets go.
    pub fn run_tiered_tasks(&self) {
        let Some(store) = &self.tiered else {
            return;
        };
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        for p in self.all_partitions() {
            let Some(tp) = self.topic_id_partition(&p.topic, p.index) else {
                continue;
            };
            if !p.with_tiered(|access| access.config.remote_storage_enable) {
                continue;
            }
            let Some(known) = store.list(&tp) else {
                continue;
            };
            let jobs = p.with_tiered(|access| manager::plan_uploads(access, &tp, &known));
            let uploaded = !jobs.is_empty();
            for job in jobs {
                match job.run(
                    self.config.node_id,
                    now_ms,
                    &*store.storage,
                    &*store.metadata,
                ) {
                    Ok(meta) => {
                        info!(partition = %tp, start = meta.start_offset, end = meta.end_offset, "uploaded segment")
                    }
                    Err(e) => {
                        warn!(partition = %tp, base = job.segment.base_offset, "upload failed: {e}");
                        break;
                    }
                }
            }
            let known = if uploaded {
                store.list(&tp)
            } else {
                Some(known)
            };
            let Some(known) = known else {
                continue;
            };
            if p.with_tiered(|access| manager::after_uploads(access, &tp, &known, now_ms))
                .is_some()
            {
                self.data_generation.send_modify(|g| *g = g.wrapping_add(1));
            }
            let expired =
                p.with_tiered(|access| manager::plan_remote_retention(access, &known, now_ms));
            if expired.is_empty() {
                continue;
            }
            match manager::delete_remote_segments(store, &expired, now_ms) {
                Ok(n) => {
                    info!(partition = %tp, segments = n, up_to = expired.last().map(|s| s.end_offset), "total retention deleted remote segments")
                }
                Err(e) => warn!(partition = %tp, "total retention of remote segments failed: {e}"),
            }
            // The log start moves past what was deleted.
            if let Some(known) = store.list(&tp) {
                p.with_tiered(|access| manager::after_uploads(access, &tp, &known, now_ms));
                self.data_generation.send_modify(|g| *g = g.wrapping_add(1));
            }
        }
    }

    /// ListOffsets for one partition this broker leads (see [`Partition::list_offset`]).
    pub fn list_offset(
        &self,
        topic: &str,
        index: i32,
        timestamp: i64,
        current_leader_epoch: i32,
        replica_id: i32,
    ) -> Result<(i64, i64, i32), i16> {
        self.partition(topic, index)
            .ok_or_else(|| self.not_hosted_error(topic, index))?
            .list_offset(timestamp, current_leader_epoch, replica_id)
    }

    /// OffsetForLeaderEpoch: the largest epoch ≤ `epoch` this leader knows and where it ended.
    pub fn offset_for_leader_epoch(
        &self,
        topic: &str,
        index: i32,
        current_leader_epoch: i32,
        epoch: i32,
    ) -> Result<(i32, i64), i16> {
        self.partition(topic, index)
            .ok_or_else(|| self.not_hosted_error(topic, index))?
            .offset_for_leader_epoch(current_leader_epoch, epoch)
    }

    /// Writes every hosted partition's high watermark and log start offset to their checkpoints,
    /// keeping what the checkpoints held at start for replicas on disk not opened yet. A
    /// checkpoint the log directory refuses halts the broker, as Kafka's does.
    pub fn checkpoint_high_watermarks(&self) {
        let parts = self.all_partitions();
        let dir = &self.config.log_dir;
        let on_disk = |(topic, index): &(String, i32)| {
            dir.join(crate::partition::dir_name(topic, *index)).is_dir()
        };
        let hws = parts
            .iter()
            .map(|p| ((p.topic.clone(), p.index), p.high_watermark()));
        let hws = checkpoint_entries(hws, &self.stored_hw, on_disk);
        write_offset_checkpoint(&dir.join(HW_CHECKPOINT_FILE), &hws);
        let starts = parts
            .iter()
            .map(|p| ((p.topic.clone(), p.index), p.log_start_offset()));
        let starts = checkpoint_entries(starts, &self.stored_log_start, on_disk);
        write_offset_checkpoint(&dir.join(LOG_START_CHECKPOINT_FILE), &starts)
    }

    /// Applies retention to every hosted replica once (`log.retention.check.interval.ms`).
    pub fn enforce_retention(&self) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        for p in self.all_partitions() {
            if let Err(e) = p.enforce_retention(now_ms) {
                warn!(topic = ?p.topic, partition = p.index, "retention failed: {e}");
            }
        }
    }

    /// Flushes and closes every log, leaving clean-shutdown markers: one per log, and once
    /// every log is closed, the broker's own.
    pub fn shutdown(&self) -> anyhow::Result<()> {
        self.checkpoint_high_watermarks();
        let parts = std::mem::take(&mut *self.partitions_write());
        for p in parts.values() {
            stop_fetcher(p);
        }
        for (_, p) in parts {
            match Arc::try_unwrap(p) {
                Ok(p) => p.close()?,
                Err(p) => p.flush(),
            }
        }
        let marker = self.config.log_dir.join(CLEAN_SHUTDOWN_FILE);
        std::fs::File::create(&marker)
            .map(|f| crate::durable::sync_or_halt(&f, &marker, false))
            .and_then(|()| crate::log::sync_dir(&self.config.log_dir))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", marker.display()))?;
        Ok(())
    }

    pub fn log_dir(&self) -> PathBuf {
        self.config.log_dir.clone()
    }
}

/// Writes Kafka's offset checkpoint format (version 0, count, `topic partition offset` lines)
/// through a synced temporary file and a rename.
/// A checkpoint's entries: the hosted replicas' `offsets`, and the `stored` entry (read at start)
/// of every replica still on disk (`on_disk`) that is not hosted yet. A broker opens its
/// replicas only once it has caught up with the metadata, and the first checkpoint is written at
/// start: written without them, then killed before the next, it lost a tiered partition's log
/// start below its local one (found in a tiered run of the correct broker), so on the next start
/// the leader took its local log start for the partition's and its followers cut their epoch
/// caches to it.
fn checkpoint_entries(
    offsets: impl Iterator<Item = ((String, i32), i64)>,
    stored: &BTreeMap<(String, i32), i64>,
    on_disk: impl Fn(&(String, i32)) -> bool,
) -> BTreeMap<(String, i32), i64> {
    let mut entries: BTreeMap<(String, i32), i64> = offsets.collect();
    for (key, offset) in stored {
        if !entries.contains_key(key) && on_disk(key) {
            entries.insert(key.clone(), *offset);
        }
    }
    entries
}

fn write_offset_checkpoint(path: &std::path::Path, offsets: &BTreeMap<(String, i32), i64>) {
    let lines: Vec<String> = offsets
        .iter()
        .map(|((topic, index), o)| format!("{topic} {index} {o}\n"))
        .collect();
    let text = format!("0\n{}\n{}", lines.len(), lines.concat());
    crate::durable::replace_or_halt(path, text.as_bytes())
}

/// Reads a Kafka offset checkpoint (`replication-offset-checkpoint`, `log-start-offset-checkpoint`):
/// version, count, then `topic partition offset`.
pub fn read_hw_checkpoint(path: &std::path::Path) -> anyhow::Result<BTreeMap<(String, i32), i64>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
    };
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate().skip(2) {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let parsed = match parts.as_slice() {
            [t, p, o] => p
                .parse()
                .ok()
                .zip(o.parse().ok())
                .map(|(p, o)| (t.to_string(), p, o)),
            _ => None,
        };
        let (t, p, o) = parsed.ok_or_else(|| {
            anyhow::anyhow!(
                "{}:{}: expected `topic partition offset`",
                path.display(),
                i + 1
            )
        })?;
        out.insert((t, p), o);
    }
    Ok(out)
}

/// The broker's clean-shutdown marker in its log directory (Kafka's `.kafka_cleanshutdown`),
/// written once every log is closed.
pub const CLEAN_SHUTDOWN_FILE: &str = ".clean-shutdown";

/// Whether the previous process left the marker; removes it (durably) so that a crash of this
/// process is not taken for a clean close.
fn take_clean_shutdown_marker(log_dir: &Path) -> anyhow::Result<bool> {
    let marker = log_dir.join(CLEAN_SHUTDOWN_FILE);
    match std::fs::remove_file(&marker) {
        Ok(()) => {
            crate::log::sync_dir(log_dir)
                .map_err(|e| anyhow::anyhow!("cannot sync {}: {e}", log_dir.display()))?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(anyhow::anyhow!("cannot remove {}: {e}", marker.display())),
    }
}

/// Kafka's `meta.properties`: which cluster and node a log dir belongs to, and the directory's
/// own id (KIP-858), made when the directory is new. A log dir of another cluster is refused
/// rather than silently mixed into this one. Returns the directory id.
fn write_meta_properties(config: &BrokerConfig) -> anyhow::Result<uuid::Uuid> {
    let path = config.log_dir.join(META_PROPERTIES_FILE);
    let found = read_meta_properties(&config.log_dir)?;
    if let Some(cluster_id) = found.get("cluster.id") {
        if *cluster_id != config.cluster_id {
            anyhow::bail!(
                "{}: cluster.id={cluster_id}, but this broker is configured with cluster.id={}",
                path.display(),
                config.cluster_id
            );
        }
        if let Some(id) = found.get("directory.id") {
            return uuid::Uuid::parse_str(id)
                .map_err(|e| anyhow::anyhow!("{}: directory.id={id}: {e}", path.display()));
        }
    }
    let id = uuid::Uuid::new_v4();
    let text = format!(
        "version=1\ncluster.id={}\nnode.id={}\ndirectory.id={id}\n",
        config.cluster_id, config.node_id
    );
    // Written whole or not at all, as Kafka does: a power loss must not leave a torn file that
    // names another cluster and keeps the broker from ever starting again.
    crate::durable::replace_file(&path, text.as_bytes())
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(id)
}

/// Name of the file naming the cluster a log dir belongs to.
pub const META_PROPERTIES_FILE: &str = "meta.properties";

/// The `cluster.id` in a log dir's `meta.properties`, if there is one.
pub fn read_cluster_id(log_dir: &std::path::Path) -> anyhow::Result<Option<String>> {
    Ok(read_meta_properties(log_dir)?.remove("cluster.id"))
}

/// The `key=value` lines of a log dir's `meta.properties` (none when there is no such file).
fn read_meta_properties(log_dir: &std::path::Path) -> anyhow::Result<BTreeMap<String, String>> {
    let path = log_dir.join(META_PROPERTIES_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(anyhow::anyhow!("{}: {e}", path.display())),
    };
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

fn stop_fetcher(p: &Partition) {
    if let Some(cancel) = p.fetcher.lock().unwrap_or_else(|x| x.into_inner()).take() {
        cancel.cancel();
    }
}

/// Runs `f`, which waits for the remote store, telling a multi-thread runtime this worker blocks
/// so that its other tasks (heartbeats among them) move on.
fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_keeps_the_replicas_on_disk_not_opened_yet() {
        let key = |t: &str, i: i32| (t.to_string(), i);
        let stored = BTreeMap::from([(key("t0", 0), 0), (key("t0", 1), 12), (key("gone", 0), 7)]);
        let hosted = [(key("t0", 1), 40), (key("t1", 0), 3)];
        let entries = checkpoint_entries(hosted.into_iter(), &stored, |k| k.0 != "gone");
        assert_eq!(
            entries,
            BTreeMap::from([(key("t0", 0), 0), (key("t0", 1), 40), (key("t1", 0), 3)])
        );
    }
}
