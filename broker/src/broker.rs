//! The broker's core: the partitions this node hosts and the operations clients ask of them
//! (produce, fetch, offsets, topics, configs), independent of the wire encoding. The protocol
//! layer translates Kafka requests into these calls and their results back into responses.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::{BrokerConfig, LogConfig};
use crate::errors;
use crate::faults::{Bug, Faults};
use crate::log::LogError;
use crate::metadata::{
    validate_topic_name, BrokerEndpoint, MetadataFile, MetadataImage, PartitionRegistration,
    TopicRegistration,
};
use crate::partition::Partition;

/// Name of the high-watermark checkpoint in the log dir, as Kafka names it.
pub const HW_CHECKPOINT_FILE: &str = "replication-offset-checkpoint";

/// A Kafka error code with a message for the log and, where the API has one, the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub code: i16,
    pub message: String,
}

impl ApiError {
    pub fn new(code: i16, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }
}

/// One partition's answer to a produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceResult {
    pub error: i16,
    pub base_offset: i64,
    pub log_start_offset: i64,
    pub message: Option<String>,
}

/// One partition's answer to a fetch.
#[derive(Clone, Debug, Default)]
pub struct FetchResult {
    pub error: i16,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub records: Vec<u8>,
    /// KIP-595: set when the follower's log diverged from ours.
    pub diverging_epoch: Option<(i32, i64)>,
}

/// A fetch of one partition as the request states it.
#[derive(Clone, Copy, Debug)]
pub struct FetchSpec {
    pub fetch_offset: i64,
    pub current_leader_epoch: i32,
    pub last_fetched_epoch: i32,
    pub max_bytes: usize,
    /// The fetching broker's id, or -1 for a consumer.
    pub replica_id: i32,
}

/// The broker of one node.
#[derive(Debug)]
pub struct Broker {
    pub config: BrokerConfig,
    pub faults: Faults,
    metadata: Mutex<MetadataImage>,
    metadata_file: MetadataFile,
    partitions: RwLock<BTreeMap<(String, i32), Arc<Partition>>>,
    /// Bumped whenever any high watermark moves; long-polling fetches wait on it.
    data_generation: watch::Sender<u64>,
}

impl Broker {
    /// Opens the log directory, recovers every hosted partition and loads the metadata.
    pub fn open(config: BrokerConfig, faults: Faults) -> anyhow::Result<Arc<Self>> {
        std::fs::create_dir_all(&config.log_dir).map_err(|e| {
            anyhow::anyhow!("cannot create log dir {}: {e}", config.log_dir.display())
        })?;
        let metadata_file = MetadataFile::new(&config.log_dir);
        let mut image = metadata_file.load()?;
        let endpoint = config
            .advertised_client_listener()
            .ok_or_else(|| anyhow::anyhow!("no client listener in `listeners`"))?;
        image.brokers.insert(
            config.node_id,
            BrokerEndpoint {
                incarnation: 0,
                fenced: false,
                id: config.node_id,
                host: endpoint.host.clone(),
                port: endpoint.port,
            },
        );
        let stored_hw = read_hw_checkpoint(&config.log_dir.join(HW_CHECKPOINT_FILE))?;
        let (tx, _) = watch::channel(0);
        let broker = Arc::new(Broker {
            config,
            faults,
            metadata: Mutex::new(image.clone()),
            metadata_file,
            partitions: RwLock::new(BTreeMap::new()),
            data_generation: tx,
        });
        for topic in image.topics.values() {
            for (i, reg) in topic.partitions.iter().enumerate() {
                if reg.replicas.contains(&broker.config.node_id) {
                    let hw = stored_hw.get(&(topic.name.clone(), i as i32)).copied();
                    broker.open_partition(topic, i as i32, reg.clone(), hw)?;
                }
            }
        }
        broker.metadata_file.save(&image)?;
        Ok(broker)
    }

    fn log_config_for(&self, topic: &TopicRegistration) -> LogConfig {
        let mut lc = self.config.log.clone();
        for (k, v) in &topic.configs {
            if let Err(e) = lc.set_topic_key(k, v) {
                warn!(topic = %topic.name, "ignoring stored topic config: {e}");
            }
        }
        lc
    }

    fn open_partition(
        &self,
        topic: &TopicRegistration,
        index: i32,
        reg: PartitionRegistration,
        hw: Option<i64>,
    ) -> anyhow::Result<Arc<Partition>> {
        let (p, notes) = Partition::open(
            &self.config.log_dir,
            &topic.name,
            index,
            self.config.node_id,
            self.log_config_for(topic),
            reg,
            hw,
        )?;
        for n in notes {
            warn!(topic = %topic.name, partition = index, "recovery: {n}");
        }
        let p = Arc::new(p);
        self.partitions_write()
            .insert((topic.name.clone(), index), p.clone());
        Ok(p)
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

    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        let map = self.partitions.read().unwrap_or_else(|p| p.into_inner());
        map.values().cloned().collect()
    }

    /// A copy of the current metadata image.
    pub fn metadata(&self) -> MetadataImage {
        self.metadata
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn strict_min_isr(&self) -> bool {
        !self.faults.has(Bug::NoStrictMinIsr)
    }

    fn check_epoch(
        &self,
        state: &crate::partition::PartitionState,
        current: i32,
    ) -> Result<(), i16> {
        if self.faults.has(Bug::AcceptStaleEpoch) {
            return Ok(());
        }
        state.check_leader_epoch(current)
    }

    fn notify_data(&self) {
        self.data_generation.send_modify(|g| *g += 1);
    }

    /// Subscribes to "some high watermark moved".
    pub fn watch_data(&self) -> watch::Receiver<u64> {
        self.data_generation.subscribe()
    }

    /// Creates a topic, assigning replicas round-robin over the known brokers.
    pub fn create_topic(
        &self,
        name: &str,
        num_partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<TopicRegistration, ApiError> {
        validate_topic_name(name).map_err(|m| ApiError::new(errors::INVALID_TOPIC_EXCEPTION, m))?;
        let num_partitions = if num_partitions == -1 {
            self.config.num_partitions
        } else {
            num_partitions
        };
        if !(1..=100_000).contains(&num_partitions) {
            return Err(ApiError::new(
                errors::INVALID_PARTITIONS,
                format!("{num_partitions} partitions"),
            ));
        }
        let rf = if replication_factor == -1 {
            self.config.default_replication_factor
        } else {
            replication_factor
        };
        let mut lc = self.config.log.clone();
        for (k, v) in configs {
            lc.set_topic_key(k, v)
                .map_err(|e| ApiError::new(errors::INVALID_CONFIG, e.to_string()))?;
        }
        let mut image = self.metadata.lock().unwrap_or_else(|p| p.into_inner());
        if image.topics.contains_key(name) {
            return Err(ApiError::new(
                errors::TOPIC_ALREADY_EXISTS,
                format!("topic {name} already exists"),
            ));
        }
        let brokers: Vec<i32> = image.brokers.keys().copied().collect();
        if rf < 1 || rf as usize > brokers.len() {
            return Err(ApiError::new(
                errors::INVALID_REPLICATION_FACTOR,
                format!(
                    "replication factor {rf} with {} broker(s) available",
                    brokers.len()
                ),
            ));
        }
        let partitions = (0..num_partitions)
            .map(|p| {
                let replicas: Vec<i32> = (0..rf as usize)
                    .map(|r| brokers[(p as usize + r) % brokers.len()])
                    .collect();
                PartitionRegistration {
                    leader: replicas[0],
                    isr: replicas.clone(),
                    replicas,
                    leader_epoch: 0,
                    partition_epoch: 0,
                    leader_recovery_state: Default::default(),
                }
            })
            .collect();
        let topic = TopicRegistration {
            name: name.to_string(),
            id: uuid::Uuid::new_v4(),
            partitions,
            configs: configs.clone(),
        };
        if validate_only {
            return Ok(topic);
        }
        let mut next = image.clone();
        next.topics.insert(name.to_string(), topic.clone());
        self.metadata_file
            .save(&next)
            .map_err(|e| ApiError::new(errors::KAFKA_STORAGE_ERROR, e.to_string()))?;
        *image = next;
        drop(image);
        for (i, reg) in topic.partitions.iter().enumerate() {
            if reg.replicas.contains(&self.config.node_id) {
                self.open_partition(&topic, i as i32, reg.clone(), None)
                    .map_err(|e| ApiError::new(errors::KAFKA_STORAGE_ERROR, e.to_string()))?;
            }
        }
        info!(
            topic = name,
            partitions = num_partitions,
            replication_factor = rf,
            "created topic"
        );
        Ok(topic)
    }

    /// Deletes a topic and its local replicas.
    pub fn delete_topic(&self, name: &str) -> Result<(), ApiError> {
        let mut image = self.metadata.lock().unwrap_or_else(|p| p.into_inner());
        let Some(topic) = image.topics.get(name).cloned() else {
            return Err(ApiError::new(
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("no topic {name}"),
            ));
        };
        let mut next = image.clone();
        next.topics.remove(name);
        self.metadata_file
            .save(&next)
            .map_err(|e| ApiError::new(errors::KAFKA_STORAGE_ERROR, e.to_string()))?;
        *image = next;
        drop(image);
        for i in 0..topic.partitions.len() as i32 {
            if let Some(p) = self.partitions_write().remove(&(name.to_string(), i)) {
                let dir = p.dir().to_path_buf();
                drop(p);
                if let Err(e) = std::fs::remove_dir_all(&dir) {
                    warn!("cannot remove {}: {e}", dir.display());
                }
            }
        }
        info!(topic = name, "deleted topic");
        Ok(())
    }

    /// Sets (`Some`) or deletes (`None`) topic-level configs, validating every key first.
    pub fn alter_topic_configs(
        &self,
        name: &str,
        changes: &[(String, Option<String>)],
        validate_only: bool,
    ) -> Result<(), ApiError> {
        let mut image = self.metadata.lock().unwrap_or_else(|p| p.into_inner());
        let Some(topic) = image.topics.get(name) else {
            return Err(ApiError::new(
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("no topic {name}"),
            ));
        };
        let mut configs = topic.configs.clone();
        for (k, v) in changes {
            match v {
                Some(v) => {
                    configs.insert(k.clone(), v.clone());
                }
                None => {
                    configs.remove(k);
                }
            }
        }
        let mut lc = self.config.log.clone();
        for (k, v) in &configs {
            lc.set_topic_key(k, v)
                .map_err(|e| ApiError::new(errors::INVALID_CONFIG, e.to_string()))?;
        }
        if validate_only {
            return Ok(());
        }
        let mut next = image.clone();
        next.topics.get_mut(name).expect("checked above").configs = configs;
        self.metadata_file
            .save(&next)
            .map_err(|e| ApiError::new(errors::KAFKA_STORAGE_ERROR, e.to_string()))?;
        *image = next;
        drop(image);
        for p in self
            .all_partitions()
            .into_iter()
            .filter(|p| p.topic == name)
        {
            p.set_config(lc.clone());
        }
        Ok(())
    }

    /// The effective log config of a topic.
    pub fn topic_log_config(&self, name: &str) -> Option<LogConfig> {
        let image = self.metadata.lock().unwrap_or_else(|p| p.into_inner());
        image.topics.get(name).map(|t| self.log_config_for(t))
    }

    /// Appends client records to a partition this broker leads and, for acks=all, waits until the
    /// ISR has them (the high watermark passes them) or `timeout` runs out.
    pub async fn produce(
        &self,
        topic: &str,
        index: i32,
        records: &[u8],
        acks: i16,
        timeout: Duration,
    ) -> ProduceResult {
        let fail = |error: i16, message: String| ProduceResult {
            error,
            base_offset: -1,
            log_start_offset: -1,
            message: Some(message),
        };
        let Some(p) = self.partition(topic, index) else {
            return fail(
                errors::UNKNOWN_TOPIC_OR_PARTITION,
                format!("{topic}-{index} is not hosted here"),
            );
        };
        let strict = self.strict_min_isr();
        let appended = p.with_state(|s| {
            if !s.is_leader() {
                return Err((
                    errors::NOT_LEADER_OR_FOLLOWER,
                    format!("{topic}-{index}: not the leader"),
                ));
            }
            if acks == -1 && s.registration.isr.len() < s.config.min_insync_replicas as usize {
                return Err((
                    errors::NOT_ENOUGH_REPLICAS,
                    format!(
                        "ISR {:?} is smaller than min.insync.replicas {}",
                        s.registration.isr, s.config.min_insync_replicas
                    ),
                ));
            }
            let epoch = s.leader_epoch();
            let info = s
                .log
                .append_as_leader(records, epoch)
                .map_err(|e| match e {
                    LogError::InvalidRecords(e) => (errors::CORRUPT_MESSAGE, e.to_string()),
                    LogError::Invalid(m) => (errors::INVALID_RECORD, m),
                    other => (errors::KAFKA_STORAGE_ERROR, other.to_string()),
                })?;
            s.maybe_increment_high_watermark(strict);
            Ok((info, s.high_watermark, s.log.log_start_offset()))
        });
        let (info, hw, log_start) = match appended {
            Ok(v) => v,
            Err((code, msg)) => return fail(code, msg),
        };
        p.publish_high_watermark(hw);
        self.notify_data();
        let ok = ProduceResult {
            error: errors::NONE,
            base_offset: info.first_offset,
            log_start_offset: log_start,
            message: None,
        };
        if acks != -1 || self.faults.has(Bug::AckBeforeReplication) {
            return ok;
        }
        let required = info.last_offset + 1;
        let mut rx = p.watch_high_watermark();
        let waited = tokio::time::timeout(timeout, rx.wait_for(|hw| *hw >= required)).await;
        match waited {
            Ok(Ok(_)) => ok,
            Ok(Err(_)) => fail(
                errors::NOT_LEADER_OR_FOLLOWER,
                "partition closed while waiting".into(),
            ),
            Err(_) => {
                let (under_min, leader) = p.with_state(|s| {
                    (
                        s.registration.isr.len() < s.config.min_insync_replicas as usize,
                        s.is_leader(),
                    )
                });
                if !leader {
                    fail(
                        errors::NOT_LEADER_OR_FOLLOWER,
                        "leadership lost while waiting for the ISR".into(),
                    )
                } else if under_min {
                    fail(
                        errors::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                        "ISR shrank below min.insync.replicas".into(),
                    )
                } else {
                    fail(
                        errors::REQUEST_TIMED_OUT,
                        format!("ISR did not reach offset {required} in time"),
                    )
                }
            }
        }
    }

    /// Reads from a partition: consumers read below the high watermark from the leader only.
    pub fn fetch(&self, topic: &str, index: i32, spec: FetchSpec) -> FetchResult {
        let fail = |error| FetchResult {
            error,
            high_watermark: -1,
            log_start_offset: -1,
            ..Default::default()
        };
        let Some(p) = self.partition(topic, index) else {
            return fail(errors::UNKNOWN_TOPIC_OR_PARTITION);
        };
        p.with_state(|s| {
            if let Err(code) = self.check_epoch(s, spec.current_leader_epoch) {
                return fail(code);
            }
            if !s.is_leader() {
                return fail(errors::NOT_LEADER_OR_FOLLOWER);
            }
            let (start, leo) = (s.log.log_start_offset(), s.log.log_end_offset());
            let mut result = FetchResult {
                error: errors::NONE,
                high_watermark: s.high_watermark,
                log_start_offset: start,
                ..Default::default()
            };
            if spec.fetch_offset < start || spec.fetch_offset > leo {
                result.error = errors::OFFSET_OUT_OF_RANGE;
                return result;
            }
            match s
                .log
                .read(spec.fetch_offset, s.high_watermark, spec.max_bytes)
            {
                Ok(r) => result.records = r.records,
                Err(LogError::OutOfRange { .. }) => result.error = errors::OFFSET_OUT_OF_RANGE,
                Err(e) => {
                    warn!(topic, partition = index, "read failed: {e}");
                    result.error = errors::KAFKA_STORAGE_ERROR;
                }
            }
            result
        })
    }

    /// ListOffsets for one partition: earliest (-2), latest (-1), max timestamp (-3) or the
    /// first offset whose batch has a timestamp at or after `timestamp`.
    pub fn list_offset(
        &self,
        topic: &str,
        index: i32,
        timestamp: i64,
        current_leader_epoch: i32,
    ) -> Result<(i64, i64, i32), i16> {
        let p = self
            .partition(topic, index)
            .ok_or(errors::UNKNOWN_TOPIC_OR_PARTITION)?;
        p.with_state(|s| {
            self.check_epoch(s, current_leader_epoch)?;
            if !s.is_leader() {
                return Err(errors::NOT_LEADER_OR_FOLLOWER);
            }
            let epoch = s.leader_epoch();
            match timestamp {
                -2 => Ok((-1, s.log.log_start_offset(), epoch)),
                -1 => Ok((-1, s.high_watermark, epoch)),
                ts => {
                    let headers = s
                        .log
                        .batch_headers()
                        .map_err(|_| errors::KAFKA_STORAGE_ERROR)?;
                    let committed = headers
                        .iter()
                        .filter(|(_, _, h)| h.last_offset() < s.high_watermark);
                    let found = if ts == -3 {
                        committed.max_by_key(|(_, _, h)| h.max_timestamp).copied()
                    } else {
                        committed
                            .clone()
                            .find(|(_, _, h)| h.max_timestamp >= ts)
                            .copied()
                    };
                    Ok(found.map_or((-1, -1, -1), |(_, _, h)| {
                        (h.max_timestamp, h.base_offset, h.leader_epoch)
                    }))
                }
            }
        })
    }

    /// OffsetForLeaderEpoch: the largest epoch ≤ `epoch` this leader knows and where it ended.
    pub fn offset_for_leader_epoch(
        &self,
        topic: &str,
        index: i32,
        current_leader_epoch: i32,
        epoch: i32,
    ) -> Result<(i32, i64), i16> {
        let p = self
            .partition(topic, index)
            .ok_or(errors::UNKNOWN_TOPIC_OR_PARTITION)?;
        p.with_state(|s| {
            self.check_epoch(s, current_leader_epoch)?;
            if !s.is_leader() {
                return Err(errors::NOT_LEADER_OR_FOLLOWER);
            }
            Ok(s.log.end_offset_for_epoch(epoch))
        })
    }

    /// Writes every hosted partition's high watermark to the checkpoint file.
    pub fn checkpoint_high_watermarks(&self) -> anyhow::Result<()> {
        let mut lines = Vec::new();
        for p in self.all_partitions() {
            lines.push(format!("{} {} {}", p.topic, p.index, p.high_watermark()));
        }
        let path = self.config.log_dir.join(HW_CHECKPOINT_FILE);
        let tmp = path.with_extension("tmp");
        std::fs::write(
            &tmp,
            format!(
                "0\n{}\n{}",
                lines.len(),
                lines.iter().map(|l| format!("{l}\n")).collect::<String>()
            ),
        )?;
        std::fs::rename(&tmp, &path)?;
        Ok(())
    }

    /// Flushes and closes every log, leaving clean-shutdown markers.
    pub fn shutdown(&self) -> anyhow::Result<()> {
        self.checkpoint_high_watermarks()?;
        let parts = std::mem::take(&mut *self.partitions_write());
        for (_, p) in parts {
            match Arc::try_unwrap(p) {
                Ok(p) => p.close()?,
                Err(p) => p.with_state(|s| s.log.flush())?,
            }
        }
        Ok(())
    }

    pub fn log_dir(&self) -> PathBuf {
        self.config.log_dir.clone()
    }
}

/// Reads Kafka's `replication-offset-checkpoint`: version, count, then `topic partition offset`.
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
