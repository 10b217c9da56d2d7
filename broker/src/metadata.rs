//! The cluster metadata this broker acts on: topics, their partitions' replicas, ISR, leader and
//! epochs, and the brokers' endpoints. It is plain data so that it can be persisted, compared and
//! later carried by the controller quorum unchanged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::mirror::group_filter::GroupFilter;
use crate::mirror::rules::MirrorState;

/// File holding the metadata image in the log directory.
pub const METADATA_FILE: &str = "cluster-metadata.json";

/// KIP-704: a leader chosen by unclean election is RECOVERING until it says it has recovered;
/// meanwhile its ISR cannot grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaderRecoveryState {
    #[default]
    Recovered,
    Recovering,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionRegistration {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// -1 when the partition has no leader.
    pub leader: i32,
    pub leader_epoch: i32,
    /// Bumped on every change of this registration (ISR, leader).
    pub partition_epoch: i32,
    #[serde(default)]
    pub leader_recovery_state: LeaderRecoveryState,
    /// KIP-966's eligible leader replicas: replicas that left the ISR while it was below
    /// `min.insync.replicas`, so the high watermark could not pass their log end; any of them
    /// may lead once the ISR is empty. Empty while the ISR is at least the minimum.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub elr: Vec<i32>,
    /// The leader when the partition last lost its leader with an empty ISR and ELR: elected
    /// again once it is back (KIP-966's last known leader), as nothing else is eligible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_known_leader: Option<i32>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRegistration {
    pub name: String,
    pub id: Uuid,
    pub partitions: Vec<PartitionRegistration>,
    /// Topic-level config overrides, by Kafka topic key.
    pub configs: BTreeMap<String, String>,
    /// Set while the topic is (or was) a mirror of another cluster's topic of the same id.
    #[serde(default)]
    pub mirror: Option<Box<TopicMirror>>,
}

/// A mirror of another cluster: where to reach it and which cluster it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorRegistration {
    pub name: String,
    pub source_bootstrap: String,
    pub source_cluster_id: String,
    /// Whose consumer group offsets are synced (`mirror.groups.include`/`exclude`).
    #[serde(default)]
    pub groups: GroupFilter,
}

/// A topic's mirror and the mirror state of each of its partitions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMirror {
    pub mirror: String,
    pub partitions: Vec<PartitionMirror>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMirror {
    pub state: MirrorState,
    /// Failed attempts since the partition last mirrored.
    pub retry_attempt: i32,
    pub last_error: Option<String>,
    /// The state a FAILED partition failed in; its retry resumes from there.
    #[serde(default)]
    pub failed_in: Option<MirrorState>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEndpoint {
    pub id: i32,
    pub host: String,
    pub port: u16,
    /// Random per broker process start, so a restarted broker is told apart from its old self.
    #[serde(default)]
    pub incarnation: u64,
    /// A fenced broker missed its heartbeats: it leads nothing and is in no ISR it can leave.
    #[serde(default)]
    pub fenced: bool,
    /// The broker asked to shut down (controlled shutdown): it leads nothing, is in no ISR it
    /// can leave, and is not elected or let back into an ISR until a new incarnation registers.
    #[serde(default)]
    pub shutting_down: bool,
    /// The id of the broker's log directory (KIP-858); absent from older registrations.
    #[serde(default)]
    pub directory_id: Option<Uuid>,
}

/// Cluster-wide defaults the controller needs for its own decisions.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterDefaults {
    pub unclean_leader_election_enable: bool,
    pub min_insync_replicas: i32,
    /// KIP-966's eligible leader replicas (`eligible.leader.replicas.version` 1).
    #[serde(default)]
    pub eligible_leader_replicas: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataImage {
    pub topics: BTreeMap<String, TopicRegistration>,
    pub brokers: BTreeMap<i32, BrokerEndpoint>,
    #[serde(default)]
    pub defaults: ClusterDefaults,
    /// Dynamic broker configs at the cluster-default scope (IncrementalAlterConfigs on the
    /// broker resource named ""), by key; they override every broker's static value.
    #[serde(default)]
    pub cluster_configs: BTreeMap<String, String>,
    #[serde(default)]
    pub mirrors: BTreeMap<String, MirrorRegistration>,
    /// The first producer id not yet handed to a broker.
    #[serde(default)]
    pub next_producer_id: i64,
}

impl MetadataImage {
    pub fn topic_by_id(&self, id: Uuid) -> Option<&TopicRegistration> {
        self.topics.values().find(|t| t.id == id)
    }

    /// The replicas of `p` on brokers that are fenced or not registered (Metadata's and
    /// DescribeTopicPartitions' offline replicas, as Kafka's metadata cache answers them).
    pub fn offline_replicas(&self, p: &PartitionRegistration) -> Vec<i32> {
        p.replicas
            .iter()
            .copied()
            .filter(|r| self.brokers.get(r).is_none_or(|b| b.fenced))
            .collect()
    }

    /// The mirror state of a partition, if its topic mirrors (or mirrored) another cluster.
    pub fn mirror_state(&self, topic: &str, partition: i32) -> Option<MirrorState> {
        let m = self.topics.get(topic)?.mirror.as_ref()?;
        m.partitions.get(partition as usize).map(|p| p.state)
    }
}

/// Kafka's legal topic names: 1–249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 249 {
        return Err(format!(
            "topic name length {} is not within 1..=249",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Err(format!("topic name `{name}` is not allowed"));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!("topic name contains illegal character {c:?}"));
    }
    Ok(())
}

/// Loads and atomically saves the metadata image of a single-node controller.
#[derive(Debug)]
pub struct MetadataFile {
    path: PathBuf,
}

impl MetadataFile {
    pub fn new(log_dir: &Path) -> Self {
        MetadataFile {
            path: log_dir.join(METADATA_FILE),
        }
    }

    pub fn load(&self) -> anyhow::Result<MetadataImage> {
        match std::fs::read(&self.path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(MetadataImage::default()),
            Err(e) => Err(anyhow::anyhow!("{}: {e}", self.path.display())),
        }
    }

    pub fn save(&self, image: &MetadataImage) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec_pretty(image)?;
        crate::durable::replace_file(&self.path, &bytes)
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert!(validate_topic_name("orders-1.v2_x").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
    }
}
