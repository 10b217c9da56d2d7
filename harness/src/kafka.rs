//! A thin Kafka client for histories: one request at a time per connection, an explicit timeout
//! on every request, no retries, and errors that say whether the request may have reached the
//! broker. Clients of workloads decide from that whether an op is `ok`, `fail` or `info`.
//!
//! It speaks only what the workloads and nemeses need: ApiVersions, Metadata, CreateTopics,
//! Produce (v2 record batches whose values are decimal integers, plain or idempotent),
//! InitProducerId, Fetch, ListOffsets (v11, with the tiered sentinels), the classic consumer-group APIs (FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, OffsetCommit, OffsetFetch), ElectLeaders, IncrementalAlterConfigs of a topic or
//! of the cluster-wide broker configs, DescribeConfigs of one broker, and raw frames for APIs kafka-protocol does not know (the cluster-mirroring admin APIs of
//! KIP-1279, see [`crate::mirror`]). Retrying, rejoining and choosing outcomes is the caller's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use kafka_protocol::compression::{Decompressor, Gzip, Lz4, Snappy, Zstd};
use kafka_protocol::messages::{
    api_versions_request::ApiVersionsRequest,
    consumer_protocol_assignment::{
        ConsumerProtocolAssignment, TopicPartition as AssignedPartition,
    },
    consumer_protocol_subscription::ConsumerProtocolSubscription,
    create_topics_request::{CreatableTopic, CreatableTopicConfig, CreateTopicsRequest},
    describe_configs_request::{DescribeConfigsRequest, DescribeConfigsResource},
    describe_quorum_request::{self, DescribeQuorumRequest},
    elect_leaders_request::{ElectLeadersRequest, TopicPartitions},
    fetch_request::{FetchPartition, FetchRequest, FetchTopic},
    find_coordinator_request::FindCoordinatorRequest,
    heartbeat_request::HeartbeatRequest,
    incremental_alter_configs_request::{
        AlterConfigsResource, AlterableConfig, IncrementalAlterConfigsRequest,
    },
    init_producer_id_request::InitProducerIdRequest,
    join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol},
    list_offsets_request::{ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic},
    list_offsets_response::ListOffsetsResponse,
    metadata_request::{MetadataRequest, MetadataRequestTopic},
    metadata_response::MetadataResponse,
    offset_commit_request::{
        OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    },
    offset_fetch_request::{OffsetFetchRequest, OffsetFetchRequestTopic},
    offset_for_leader_epoch_request::{
        OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic,
    },
    produce_request::{PartitionProduceData, ProduceRequest, TopicProduceData},
    sync_group_request::{SyncGroupRequest, SyncGroupRequestAssignment},
    ApiKey, BrokerId, GroupId, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, RecordSet,
    TimestampType, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID,
};
use thiserror::Error;
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use crate::dial::{connect_async, Dialer};

/// Kafka error codes by name: `code.err()` is `None` for no error, else the [`ResponseError`].
pub use kafka_protocol::error::{ParseResponseErrorCode, ResponseError};

/// READ_ONLY_TOPIC (KIP-1279): a produce to a mirror topic, refused before appending. Newer than
/// kafka-protocol's list of codes.
pub const READ_ONLY_TOPIC: i16 = 134;

/// The name of a Kafka error code, for histories.
pub fn error_name(code: i16) -> String {
    match code.err() {
        _ if code == READ_ONLY_TOPIC => "ReadOnlyTopic".to_string(),
        Some(e) => format!("{e:?}"),
        None => "NONE".to_string(),
    }
}

/// Why a request produced no response.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KafkaError {
    /// No connection could be made; nothing was sent.
    #[error("connect to {addr} failed: {reason}")]
    Connect {
        /// Where.
        addr: SocketAddr,
        /// Why.
        reason: String,
    },
    /// Nothing was sent: the connection was already unusable or the version is not supported.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The request was (or may have been) sent and no response came in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The connection broke after the request was (or may have been) sent.
    #[error("connection lost: {0}")]
    ConnectionLost(String),
    /// The response could not be decoded.
    #[error("bad response: {0}")]
    Protocol(String),
}

impl KafkaError {
    /// Whether the broker may have received the request (the outcome is then unknown).
    pub fn maybe_sent(&self) -> bool {
        matches!(
            self,
            KafkaError::Timeout(_) | KafkaError::ConnectionLost(_) | KafkaError::Protocol(_)
        )
    }
}

/// The config resource types of DescribeConfigs and IncrementalAlterConfigs.
const TOPIC_RESOURCE: i8 = 2;
const BROKER_RESOURCE: i8 = 4;

/// The newest version of each API this client knows how to fill in, and the oldest it accepts.
const VERSIONS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::Metadata, 1, 12),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::ElectLeaders, 1, 2),
    (ApiKey::DescribeQuorum, 0, 1),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::OffsetForLeaderEpoch, 2, 4),
    // The group APIs at one version each: the fields filled in below are those versions'.
    (ApiKey::FindCoordinator, 3, 3),
    (ApiKey::JoinGroup, 5, 5),
    (ApiKey::SyncGroup, 3, 3),
    (ApiKey::Heartbeat, 3, 3),
    (ApiKey::OffsetCommit, 7, 7),
    (ApiKey::OffsetFetch, 7, 7),
];

/// An idempotent producer's identity, from InitProducerId.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdentity {
    /// The producer id.
    pub id: i64,
    /// Its epoch.
    pub epoch: i16,
}

/// A JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinResult {
    /// The error code.
    pub error_code: i16,
    /// The generation joined.
    pub generation: i32,
    /// This member's id (also set with MEMBER_ID_REQUIRED).
    pub member_id: String,
    /// The leader's member id.
    pub leader: String,
    /// The protocol the group chose.
    pub protocol_name: Option<String>,
    /// Every member with its subscription metadata; only the leader gets them.
    pub members: Vec<(String, Bytes)>,
}

/// A committed offset as OffsetFetch returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: i32,
    /// The committed offset, -1 when none.
    pub offset: i64,
    /// The partition's error code.
    pub error_code: i16,
}

/// One connection to one broker.
pub struct Connection {
    framed: Framed<TcpStream, LengthDelimitedCodec>,
    timeout: Duration,
    next_correlation: i32,
    versions: BTreeMap<i16, i16>,
    broken: Option<String>,
}

/// One record read by a fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedRecord {
    /// Its offset.
    pub offset: i64,
    /// Its value, when there is one.
    pub value: Option<Bytes>,
    /// The leader epoch of its batch.
    pub leader_epoch: i32,
}

/// A fetch's answer for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResult {
    /// The partition's error code.
    pub error_code: i16,
    /// The high watermark the broker reported.
    pub high_watermark: i64,
    /// Data records at or after the requested offset (control records dropped).
    pub records: Vec<FetchedRecord>,
    /// The partition's log start offset as the broker reported it (-1 when it did not): a
    /// fetch below it fails with OFFSET_OUT_OF_RANGE, and a consumer moves there.
    pub log_start_offset: i64,
    /// The current leader epoch the fetch carried and the broker accepted: absent when none was
    /// sent (unknown, or a Fetch version before 9 has no field for it) or the fetch failed.
    pub leader_epoch: Option<i32>,
}

/// A produce's answer for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceResult {
    /// The partition's error code.
    pub error_code: i16,
    /// The offset of the first record, when the broker assigned one.
    pub base_offset: i64,
}

/// Where a partition lives, from Metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    /// The partition's error code in Metadata.
    pub error_code: i16,
    /// Leader broker id, or -1.
    pub leader: i32,
    /// Leader epoch.
    pub leader_epoch: i32,
    /// Replica broker ids.
    pub replicas: Vec<i32>,
    /// In-sync replica broker ids.
    pub isr: Vec<i32>,
}

/// Whether `topic` is one of a broker's internal topics (`__consumer_offsets`, `__mirror_state`),
/// which hold the broker's own records, not a workload's: by Kafka's naming convention.
pub fn is_internal_topic(topic: &str) -> bool {
    topic.starts_with("__")
}

/// Metadata as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterMetadata {
    /// Broker id to address.
    pub brokers: BTreeMap<i32, (String, u16)>,
    /// Topic to its error code and partitions.
    pub topics: BTreeMap<String, (i16, BTreeMap<i32, PartitionInfo>)>,
}

impl ClusterMetadata {
    fn from_response(r: MetadataResponse) -> Self {
        let mut m = ClusterMetadata::default();
        for b in r.brokers {
            m.brokers
                .insert(b.node_id.0, (b.host.to_string(), b.port as u16));
        }
        for t in r.topics {
            let Some(name) = t.name else { continue };
            let parts = t
                .partitions
                .into_iter()
                .map(|p| {
                    (
                        p.partition_index,
                        PartitionInfo {
                            error_code: p.error_code,
                            leader: p.leader_id.0,
                            leader_epoch: p.leader_epoch,
                            replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                            isr: p.isr_nodes.iter().map(|b| b.0).collect(),
                        },
                    )
                })
                .collect();
            m.topics.insert(name.0.to_string(), (t.error_code, parts));
        }
        m
    }

    /// The leader epoch of a partition, when its leader is known.
    pub fn leader_epoch(&self, topic: &str, partition: i32) -> Option<i32> {
        self.leader(topic, partition)?;
        let p = self.topics.get(topic)?.1.get(&partition)?;
        (p.leader_epoch >= 0).then_some(p.leader_epoch)
    }

    /// The leader of a partition, when known.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<i32> {
        let (_, parts) = self.topics.get(topic)?;
        let p = parts.get(&partition)?;
        (p.error_code.err().is_none() && p.leader >= 0).then_some(p.leader)
    }
}

impl Connection {
    /// Sends one request frame and reads one response frame within the timeout. On any failure
    /// the connection is marked broken: a late response would be read as the answer to the next
    /// request.
    async fn round_trip(&mut self, request: Bytes) -> Result<Bytes, KafkaError> {
        let result = tokio::time::timeout(self.timeout, async {
            self.framed
                .send(request)
                .await
                .map_err(|e| KafkaError::ConnectionLost(e.to_string()))?;
            match self.framed.next().await {
                Some(Ok(frame)) => Ok(frame.freeze()),
                Some(Err(e)) => Err(KafkaError::ConnectionLost(e.to_string())),
                None => Err(KafkaError::ConnectionLost("closed by broker".into())),
            }
        })
        .await
        .unwrap_or(Err(KafkaError::Timeout(self.timeout)));
        if let Err(e) = &result {
            self.broken = Some(e.to_string());
        }
        result
    }

    /// Connects to `addr` through `dialer` and negotiates API versions, all within `timeout`.
    pub async fn connect(
        dialer: Arc<dyn Dialer>,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Self, KafkaError> {
        let stream =
            connect_async(dialer, addr, timeout)
                .await
                .map_err(|e| KafkaError::Connect {
                    addr,
                    reason: e.to_string(),
                })?;
        let mut conn = Connection {
            framed: Framed::new(stream, LengthDelimitedCodec::new()),
            timeout,
            next_correlation: 0,
            versions: BTreeMap::new(),
            broken: None,
        };
        conn.negotiate().await?;
        Ok(conn)
    }

    /// How long a produce asks the leader to wait for its replicas: three quarters of the
    /// request's own timeout, so the leader's answer to a wait that ran out (REQUEST_TIMED_OUT, or
    /// whatever a faulty broker says instead) reaches the history rather than the client's
    /// timeout cutting it off. Kafka's clients send their request timeout as both.
    fn ack_timeout(&self) -> Duration {
        self.timeout * 3 / 4
    }

    /// Whether an earlier request left the connection unusable.
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    async fn negotiate(&mut self) -> Result<(), KafkaError> {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("tidemark"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        // v0 first: a broker that rejects a version answers in the v0 format anyway.
        let mut resp = self.send(ApiKey::ApiVersions, 0, &req).await?;
        if resp.error_code.err().is_some() {
            resp = self.send(ApiKey::ApiVersions, 3, &req).await?;
        }
        if resp.error_code.err().is_some() {
            return Err(KafkaError::Protocol(format!(
                "ApiVersions: {}",
                error_name(resp.error_code)
            )));
        }
        for (key, min, max) in VERSIONS {
            if let Some(v) = resp.api_keys.iter().find(|v| v.api_key == *key as i16) {
                let chosen = (*max).min(v.max_version);
                if chosen >= (*min).max(v.min_version) {
                    self.versions.insert(*key as i16, chosen);
                }
            }
        }
        Ok(())
    }

    fn version(&self, key: ApiKey) -> Result<i16, KafkaError> {
        self.versions
            .get(&(key as i16))
            .copied()
            .ok_or_else(|| KafkaError::NotSent(format!("broker offers no usable {key:?} version")))
    }

    /// Sends one request and waits for its response.
    async fn send<R: Request>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &R,
    ) -> Result<R::Response, KafkaError> {
        if let Some(why) = &self.broken {
            return Err(KafkaError::NotSent(format!("connection unusable: {why}")));
        }
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str("tidemark")));
        let mut buf = BytesMut::new();
        header
            .encode(&mut buf, R::header_version(version))
            .and_then(|_| req.encode(&mut buf, version))
            .map_err(|e| KafkaError::NotSent(format!("encoding {key:?} v{version}: {e}")))?;
        let mut frame = self.round_trip(buf.freeze()).await?;
        let decoded = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
            .and_then(|h| {
                if h.correlation_id != correlation {
                    anyhow::bail!(
                        "correlation id {} for request {correlation}",
                        h.correlation_id
                    );
                }
                // The decoder reserves room for every array from the count the broker claims.
                tidemark_wirebound::check_response(key as i16, version, &frame)?;
                R::Response::decode(&mut frame, version)
            });
        decoded.map_err(|e| {
            self.broken = Some(e.to_string());
            KafkaError::Protocol(format!("{key:?} v{version}: {e}"))
        })
    }

    /// Metadata for `topics`, or for every topic when `None`.
    pub async fn metadata(
        &mut self,
        topics: Option<&[String]>,
    ) -> Result<ClusterMetadata, KafkaError> {
        let version = self.version(ApiKey::Metadata)?;
        let req = MetadataRequest::default()
            .with_topics(topics.map(|ts| {
                ts.iter()
                    .map(|t| {
                        MetadataRequestTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_string(t.clone()))))
                    })
                    .collect()
            }))
            .with_allow_auto_topic_creation(false);
        let resp = self.send(ApiKey::Metadata, version, &req).await?;
        Ok(ClusterMetadata::from_response(resp))
    }

    /// Creates a topic; returns its error code (0, or e.g. TOPIC_ALREADY_EXISTS).
    pub async fn create_topic(
        &mut self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
    ) -> Result<i16, KafkaError> {
        self.create_topic_with(name, partitions, replication_factor, &BTreeMap::new())
            .await
    }

    /// Creates a topic with topic-level `configs`; returns its error code.
    pub async fn create_topic_with(
        &mut self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: &BTreeMap<String, String>,
    ) -> Result<i16, KafkaError> {
        let version = self.version(ApiKey::CreateTopics)?;
        let req = CreateTopicsRequest::default()
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(name.to_string())))
                .with_num_partitions(partitions)
                .with_replication_factor(replication_factor)
                .with_configs(
                    configs
                        .iter()
                        .map(|(k, v)| {
                            CreatableTopicConfig::default()
                                .with_name(StrBytes::from_string(k.clone()))
                                .with_value(Some(StrBytes::from_string(v.clone())))
                        })
                        .collect(),
                )])
            .with_timeout_ms(self.timeout.as_millis() as i32);
        let resp = self.send(ApiKey::CreateTopics, version, &req).await?;
        resp.topics
            .first()
            .map(|t| t.error_code)
            .ok_or_else(|| KafkaError::Protocol("CreateTopics: no topic in response".into()))
    }

    /// The KRaft metadata quorum's active controller and its epoch (DescribeQuorum, KIP-595), as
    /// whichever broker is asked finds out from the controllers.
    pub async fn active_controller(&mut self) -> Result<(i32, i32), KafkaError> {
        let version = self.version(ApiKey::DescribeQuorum)?;
        let req = DescribeQuorumRequest::default().with_topics(vec![
            describe_quorum_request::TopicData::default()
                .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                .with_partitions(vec![describe_quorum_request::PartitionData::default()]),
        ]);
        let resp = self.send(ApiKey::DescribeQuorum, version, &req).await?;
        let p = resp
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .ok_or_else(|| {
                KafkaError::Protocol("DescribeQuorum: no partition in response".into())
            })?;
        for code in [resp.error_code, p.error_code] {
            if code != 0 {
                return Err(KafkaError::Protocol(format!(
                    "DescribeQuorum: {}",
                    error_name(code)
                )));
            }
        }
        Ok((p.leader_id.0, p.leader_epoch))
    }

    /// Elects a leader for one partition (KIP-460): the preferred replica, or with `unclean` any
    /// live replica even outside the ISR. Returns the partition's error code and message.
    pub async fn elect_leader(
        &mut self,
        topic: &str,
        partition: i32,
        unclean: bool,
    ) -> Result<(i16, Option<String>), KafkaError> {
        let version = self.version(ApiKey::ElectLeaders)?;
        let req = ElectLeadersRequest::default()
            .with_election_type(i8::from(unclean))
            .with_timeout_ms(self.timeout.as_millis() as i32)
            .with_topic_partitions(Some(vec![TopicPartitions::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![partition])]));
        let resp = self.send(ApiKey::ElectLeaders, version, &req).await?;
        if resp.error_code.err().is_some() {
            return Ok((resp.error_code, None));
        }
        resp.replica_election_results
            .iter()
            .flat_map(|t| t.partition_result.iter())
            .find(|p| p.partition_id == partition)
            .map(|p| {
                (
                    p.error_code,
                    p.error_message.as_ref().map(|m| m.to_string()),
                )
            })
            .ok_or_else(|| KafkaError::Protocol("ElectLeaders: partition missing".into()))
    }

    /// Sets topic config `key` to `value` on `topic` (IncrementalAlterConfigs, operation SET).
    /// Returns the resource's error code and message.
    pub async fn set_topic_config(
        &mut self,
        topic: &str,
        key: &str,
        value: &str,
    ) -> Result<(i16, Option<String>), KafkaError> {
        self.set_config(TOPIC_RESOURCE, topic, key, value).await
    }

    /// Sets the cluster-wide dynamic broker config `key` to `value` (IncrementalAlterConfigs on
    /// the broker resource named "", operation SET). Returns the resource's error code and
    /// message.
    pub async fn set_cluster_config(
        &mut self,
        key: &str,
        value: &str,
    ) -> Result<(i16, Option<String>), KafkaError> {
        self.set_config(BROKER_RESOURCE, "", key, value).await
    }

    async fn set_config(
        &mut self,
        resource_type: i8,
        name: &str,
        key: &str,
        value: &str,
    ) -> Result<(i16, Option<String>), KafkaError> {
        let version = self.version(ApiKey::IncrementalAlterConfigs)?;
        const SET: i8 = 0;
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            AlterConfigsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(StrBytes::from_string(name.to_string()))
                .with_configs(vec![AlterableConfig::default()
                    .with_name(StrBytes::from_string(key.to_string()))
                    .with_config_operation(SET)
                    .with_value(Some(StrBytes::from_string(value.to_string())))]),
        ]);
        let resp = self
            .send(ApiKey::IncrementalAlterConfigs, version, &req)
            .await?;
        resp.responses
            .first()
            .map(|r| {
                (
                    r.error_code,
                    r.error_message.as_ref().map(|m| m.to_string()),
                )
            })
            .ok_or_else(|| KafkaError::Protocol("IncrementalAlterConfigs: no resource".into()))
    }

    /// The value broker `node_id` (the one this connection reaches) holds for its config `key`,
    /// static or cluster-wide dynamic (DescribeConfigs on its broker resource): `Ok(None)` when
    /// it has none, `Err((code, message))` when it refuses.
    pub async fn broker_config(
        &mut self,
        node_id: i32,
        key: &str,
    ) -> Result<Result<Option<String>, (i16, Option<String>)>, KafkaError> {
        let version = self.version(ApiKey::DescribeConfigs)?;
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(BROKER_RESOURCE)
                .with_resource_name(StrBytes::from_string(node_id.to_string()))
                .with_configuration_keys(Some(vec![StrBytes::from_string(key.to_string())])),
        ]);
        let resp = self.send(ApiKey::DescribeConfigs, version, &req).await?;
        let r = resp
            .results
            .first()
            .ok_or_else(|| KafkaError::Protocol("DescribeConfigs: no resource".into()))?;
        if r.error_code != 0 {
            return Ok(Err((
                r.error_code,
                r.error_message.as_ref().map(|m| m.to_string()),
            )));
        }
        Ok(Ok(r
            .configs
            .iter()
            .find(|c| c.name.as_str() == key)
            .and_then(|c| c.value.as_ref().map(|v| v.to_string()))))
    }

    /// Sends `body` as version `version` of API `key`, which this client cannot decode (request
    /// header v2, response header v1), and returns the response body after its header.
    pub async fn raw(&mut self, key: i16, version: i16, body: &[u8]) -> Result<Bytes, KafkaError> {
        if let Some(why) = &self.broken {
            return Err(KafkaError::NotSent(format!("connection unusable: {why}")));
        }
        let correlation = self.next_correlation;
        self.next_correlation = self.next_correlation.wrapping_add(1);
        let mut buf = BytesMut::new();
        RequestHeader::default()
            .with_request_api_key(key)
            .with_request_api_version(version)
            .with_correlation_id(correlation)
            .with_client_id(Some(StrBytes::from_static_str("tidemark")))
            .encode(&mut buf, 2)
            .map_err(|e| KafkaError::NotSent(format!("encoding API key {key}: {e}")))?;
        buf.extend_from_slice(body);
        let mut frame = self.round_trip(buf.freeze()).await?;
        match ResponseHeader::decode(&mut frame, 1) {
            Ok(h) if h.correlation_id == correlation => Ok(frame),
            Ok(h) => {
                let why = format!(
                    "correlation id {} for request {correlation}",
                    h.correlation_id
                );
                self.broken = Some(why.clone());
                Err(KafkaError::Protocol(why))
            }
            Err(e) => {
                self.broken = Some(e.to_string());
                Err(KafkaError::Protocol(format!("API key {key}: {e}")))
            }
        }
    }

    /// ListOffsets v11 for one partition at `timestamp` (a time, or a sentinel: -1 latest, -2
    /// earliest, -4 earliest local, -5 latest tiered, -6 earliest pending upload), as a consumer
    /// asks it: `(error code, offset, leader epoch)`. Sent as v11, the first version that takes
    /// -6 (KIP-1023); kafka-protocol stops at v10, and v11 added no field, so the body is coded
    /// as v10.
    pub async fn list_offsets(
        &mut self,
        topic: &str,
        partition: i32,
        timestamp: i64,
    ) -> Result<(i16, i64, i32), KafkaError> {
        const LIST_OFFSETS: i16 = 2;
        let req = ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_current_leader_epoch(-1)
                    .with_timestamp(timestamp)])]);
        let mut body = BytesMut::new();
        req.encode(&mut body, 10)
            .map_err(|e| KafkaError::NotSent(format!("encoding ListOffsets: {e}")))?;
        let mut frame = self.raw(LIST_OFFSETS, 11, &body).await?;
        let resp = tidemark_wirebound::check_response(LIST_OFFSETS, 10, &frame)
            .map_err(|e| e.to_string())
            .and_then(|_| ListOffsetsResponse::decode(&mut frame, 10).map_err(|e| e.to_string()))
            .map_err(|e| {
                self.broken = Some(e.to_string());
                KafkaError::Protocol(format!("ListOffsets v11: {e}"))
            })?;
        resp.topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .map(|p| (p.error_code, p.offset, p.leader_epoch))
            .ok_or_else(|| KafkaError::Protocol("ListOffsets: partition missing".into()))
    }

    /// Appends `values` (as decimal strings) in one v2 record batch to a partition.
    pub async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        values: &[i64],
        acks: i16,
    ) -> Result<ProduceResult, KafkaError> {
        let batch = encode_batch(values).map_err(KafkaError::NotSent)?;
        self.produce_batch(topic, partition, batch, acks).await
    }

    /// Appends one encoded record batch to a partition (an idempotent producer's batch is sent
    /// again unchanged when retried). The leader is asked to answer within
    /// [`Connection::ack_timeout`].
    pub async fn produce_batch(
        &mut self,
        topic: &str,
        partition: i32,
        batch: Bytes,
        acks: i16,
    ) -> Result<ProduceResult, KafkaError> {
        let version = self.version(ApiKey::Produce)?;
        let req = ProduceRequest::default()
            .with_acks(acks)
            .with_timeout_ms(self.ack_timeout().as_millis() as i32)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(partition)
                    .with_records(Some(batch))])]);
        let resp = self.send(ApiKey::Produce, version, &req).await?;
        resp.responses
            .iter()
            .flat_map(|t| t.partition_responses.iter())
            .find(|p| p.index == partition)
            .map(|p| ProduceResult {
                error_code: p.error_code,
                base_offset: p.base_offset,
            })
            .ok_or_else(|| KafkaError::Protocol("Produce: partition missing from response".into()))
    }

    /// A producer id for an idempotent (not transactional) producer. Returns the error code
    /// when the broker refused.
    pub async fn init_producer_id(&mut self) -> Result<Result<ProducerIdentity, i16>, KafkaError> {
        let version = self.version(ApiKey::InitProducerId)?;
        let req = InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(-1);
        let resp = self.send(ApiKey::InitProducerId, version, &req).await?;
        Ok(match resp.error_code.err() {
            Some(_) => Err(resp.error_code),
            None => Ok(ProducerIdentity {
                id: resp.producer_id.0,
                epoch: resp.producer_epoch,
            }),
        })
    }

    /// The group coordinator's broker id for `group`, or the error code.
    pub async fn find_coordinator(&mut self, group: &str) -> Result<Result<i32, i16>, KafkaError> {
        let version = self.version(ApiKey::FindCoordinator)?;
        let req = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(group.to_string()))
            .with_key_type(0);
        let resp = self.send(ApiKey::FindCoordinator, version, &req).await?;
        Ok(match resp.error_code.err() {
            Some(_) => Err(resp.error_code),
            None => Ok(resp.node_id.0),
        })
    }

    /// JoinGroup with one protocol of type `consumer`.
    #[allow(clippy::too_many_arguments)]
    pub async fn join_group(
        &mut self,
        group: &str,
        member_id: &str,
        session_timeout: Duration,
        rebalance_timeout: Duration,
        protocol: &str,
        metadata: Bytes,
    ) -> Result<JoinResult, KafkaError> {
        let version = self.version(ApiKey::JoinGroup)?;
        let req = JoinGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_session_timeout_ms(session_timeout.as_millis() as i32)
            .with_rebalance_timeout_ms(rebalance_timeout.as_millis() as i32)
            .with_member_id(StrBytes::from_string(member_id.to_string()))
            .with_protocol_type(StrBytes::from_static_str("consumer"))
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_string(protocol.to_string()))
                .with_metadata(metadata)]);
        let resp = self.send(ApiKey::JoinGroup, version, &req).await?;
        Ok(JoinResult {
            error_code: resp.error_code,
            generation: resp.generation_id,
            member_id: resp.member_id.to_string(),
            leader: resp.leader.to_string(),
            protocol_name: resp.protocol_name.map(|p| p.to_string()),
            members: resp
                .members
                .into_iter()
                .map(|m| (m.member_id.to_string(), m.metadata))
                .collect(),
        })
    }

    /// SyncGroup: the leader sends every member's assignment, the others none. Returns the
    /// error code and this member's assignment.
    pub async fn sync_group(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        assignments: Vec<(String, Bytes)>,
    ) -> Result<(i16, Bytes), KafkaError> {
        let version = self.version(ApiKey::SyncGroup)?;
        let req = SyncGroupRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member_id.to_string()))
            .with_assignments(
                assignments
                    .into_iter()
                    .map(|(m, a)| {
                        SyncGroupRequestAssignment::default()
                            .with_member_id(StrBytes::from_string(m))
                            .with_assignment(a)
                    })
                    .collect(),
            );
        let resp = self.send(ApiKey::SyncGroup, version, &req).await?;
        Ok((resp.error_code, resp.assignment))
    }

    /// Heartbeat; returns the error code (REBALANCE_IN_PROGRESS asks the member to rejoin).
    pub async fn heartbeat(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
    ) -> Result<i16, KafkaError> {
        let version = self.version(ApiKey::Heartbeat)?;
        let req = HeartbeatRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_generation_id(generation)
            .with_member_id(StrBytes::from_string(member_id.to_string()));
        Ok(self
            .send(ApiKey::Heartbeat, version, &req)
            .await?
            .error_code)
    }

    /// OffsetCommit of `(topic, partition, offset)`s in `generation`; returns each partition's
    /// error code.
    pub async fn commit_offsets(
        &mut self,
        group: &str,
        generation: i32,
        member_id: &str,
        offsets: &[(String, i32, i64)],
    ) -> Result<Vec<(String, i32, i16)>, KafkaError> {
        let version = self.version(ApiKey::OffsetCommit)?;
        let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
        for (t, p, o) in offsets {
            topics.entry(t).or_default().push(
                OffsetCommitRequestPartition::default()
                    .with_partition_index(*p)
                    .with_committed_offset(*o),
            );
        }
        let req = OffsetCommitRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_generation_id_or_member_epoch(generation)
            .with_member_id(StrBytes::from_string(member_id.to_string()))
            .with_topics(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetCommitRequestTopic::default()
                            .with_name(TopicName(StrBytes::from_string(t.to_string())))
                            .with_partitions(ps)
                    })
                    .collect(),
            );
        let resp = self.send(ApiKey::OffsetCommit, version, &req).await?;
        Ok(resp
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| (t.name.0.to_string(), p.partition_index, p.error_code))
            })
            .collect())
    }

    /// OffsetFetch of `partitions`; returns the group's error code and each partition's offset.
    pub async fn fetch_offsets(
        &mut self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<(i16, Vec<CommittedOffset>), KafkaError> {
        let version = self.version(ApiKey::OffsetFetch)?;
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            topics.entry(t).or_default().push(*p);
        }
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_string(group.to_string())))
            .with_topics(Some(
                topics
                    .into_iter()
                    .map(|(t, ps)| {
                        OffsetFetchRequestTopic::default()
                            .with_name(TopicName(StrBytes::from_string(t.to_string())))
                            .with_partition_indexes(ps)
                    })
                    .collect(),
            ));
        let resp = self.send(ApiKey::OffsetFetch, version, &req).await?;
        let offsets = resp
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(|p| CommittedOffset {
                    topic: t.name.0.to_string(),
                    partition: p.partition_index,
                    offset: p.committed_offset,
                    error_code: p.error_code,
                })
            })
            .collect();
        Ok((resp.error_code, offsets))
    }

    /// OffsetForLeaderEpoch for one partition, asked as a consumer (KIP-320): the largest epoch
    /// at or below `epoch` the leader knows, and the offset where it ends (the next epoch's
    /// start, or the log end for the latest): `(error code, epoch, end offset)`.
    pub async fn offset_for_leader_epoch(
        &mut self,
        topic: &str,
        partition: i32,
        epoch: i32,
    ) -> Result<(i16, i32, i64), KafkaError> {
        let version = self.version(ApiKey::OffsetForLeaderEpoch)?;
        let req = OffsetForLeaderEpochRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![OffsetForLeaderTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![OffsetForLeaderPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(-1)
                    .with_leader_epoch(epoch)])]);
        let resp = self
            .send(ApiKey::OffsetForLeaderEpoch, version, &req)
            .await?;
        resp.topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition == partition)
            .map(|p| (p.error_code, p.leader_epoch, p.end_offset))
            .ok_or_else(|| KafkaError::Protocol("OffsetForLeaderEpoch: partition missing".into()))
    }

    /// Reads a partition from `offset`, up to `max_bytes`, waiting at most `max_wait` for data.
    /// `current_leader_epoch` (-1 when unknown) lets the broker refuse a fetch meant for another
    /// leader (KIP-320), so what it returns was served under that epoch.
    pub async fn fetch(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
        current_leader_epoch: i32,
        max_bytes: i32,
        max_wait: Duration,
    ) -> Result<FetchResult, KafkaError> {
        let version = self.version(ApiKey::Fetch)?;
        // The field exists from Fetch v9; an older broker ignores the epoch.
        let sent_epoch =
            (version >= 9 && current_leader_epoch >= 0).then_some(current_leader_epoch);
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(max_wait.as_millis() as i32)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_isolation_level(0)
            .with_session_id(0)
            .with_session_epoch(-1)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_current_leader_epoch(sent_epoch.unwrap_or(-1))
                    .with_fetch_offset(offset)
                    .with_last_fetched_epoch(-1)
                    .with_log_start_offset(-1)
                    .with_partition_max_bytes(max_bytes)])]);
        let resp = self.send(ApiKey::Fetch, version, &req).await?;
        if resp.error_code.err().is_some() {
            return Ok(FetchResult {
                error_code: resp.error_code,
                high_watermark: -1,
                records: Vec::new(),
                log_start_offset: -1,
                leader_epoch: None,
            });
        }
        let p = resp
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| KafkaError::Protocol("Fetch: partition missing from response".into()))?;
        let records = match &p.records {
            Some(bytes) => decode_records(bytes.clone(), offset).map_err(KafkaError::Protocol)?,
            None => Vec::new(),
        };
        Ok(FetchResult {
            error_code: p.error_code,
            high_watermark: p.high_watermark,
            records,
            log_start_offset: p.log_start_offset,
            leader_epoch: sent_epoch.filter(|_| p.error_code.err().is_none()),
        })
    }
}

/// A consumer's subscription (`ConsumerProtocolSubscription` v0 behind its version), the
/// metadata of a `consumer` JoinGroup protocol.
pub fn encode_subscription(topics: &[String]) -> Result<Bytes, String> {
    let sub = ConsumerProtocolSubscription::default().with_topics(
        topics
            .iter()
            .map(|t| StrBytes::from_string(t.clone()))
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&0i16.to_be_bytes());
    sub.encode(&mut buf, 0)
        .map_err(|e| format!("encoding a subscription: {e}"))?;
    Ok(buf.freeze())
}

/// The topics of a member's subscription.
pub fn decode_subscription(mut bytes: Bytes) -> Result<Vec<String>, String> {
    let version = consumer_protocol_version(&mut bytes, "subscription")?;
    ConsumerProtocolSubscription::decode(&mut bytes, version)
        .map(|s| s.topics.iter().map(|t| t.to_string()).collect())
        .map_err(|e| format!("decoding a subscription: {e}"))
}

/// A member's assignment (`ConsumerProtocolAssignment` v0 behind its version).
pub fn encode_assignment(partitions: &[(String, i32)]) -> Result<Bytes, String> {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (t, p) in partitions {
        topics.entry(t).or_default().push(*p);
    }
    let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(
        topics
            .into_iter()
            .map(|(t, ps)| {
                AssignedPartition::default()
                    .with_topic(TopicName(StrBytes::from_string(t.to_string())))
                    .with_partitions(ps)
            })
            .collect(),
    );
    let mut buf = BytesMut::new();
    buf.extend_from_slice(&0i16.to_be_bytes());
    assignment
        .encode(&mut buf, 0)
        .map_err(|e| format!("encoding an assignment: {e}"))?;
    Ok(buf.freeze())
}

/// The partitions of an assignment; empty bytes are no partitions (a member the leader left
/// out).
pub fn decode_assignment(mut bytes: Bytes) -> Result<Vec<(String, i32)>, String> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let version = consumer_protocol_version(&mut bytes, "assignment")?;
    let assignment = ConsumerProtocolAssignment::decode(&mut bytes, version)
        .map_err(|e| format!("decoding an assignment: {e}"))?;
    Ok(assignment
        .assigned_partitions
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.topic.0.to_string(), *p)))
        .collect())
}

/// The version in front of consumer-protocol bytes, capped at what kafka-protocol decodes (a
/// newer version only appends fields).
fn consumer_protocol_version(bytes: &mut Bytes, what: &str) -> Result<i16, String> {
    if bytes.len() < 2 {
        return Err(format!("{what} shorter than its version"));
    }
    let v = i16::from_be_bytes([bytes[0], bytes[1]]);
    let _ = bytes.split_to(2);
    if v < 0 {
        return Err(format!("{what} version {v} is negative"));
    }
    Ok(v.min(3))
}

/// Encodes integers as one uncompressed v2 batch of a non-idempotent producer.
pub fn encode_batch(values: &[i64]) -> Result<Bytes, String> {
    encode_batch_of(values, None, 0)
}

/// Encodes integers as one uncompressed v2 batch of idempotent producer `producer`, its first
/// record at sequence `base_sequence`.
pub fn encode_idempotent_batch(
    values: &[i64],
    producer: ProducerIdentity,
    base_sequence: i32,
) -> Result<Bytes, String> {
    encode_batch_of(values, Some(producer), base_sequence)
}

fn encode_batch_of(
    values: &[i64],
    producer: Option<ProducerIdentity>,
    base_sequence: i32,
) -> Result<Bytes, String> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: producer.map_or(NO_PRODUCER_ID, |p| p.id),
            producer_epoch: producer.map_or(NO_PRODUCER_EPOCH, |p| p.epoch),
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch while offset - sequence is constant; without
            // a producer this makes the batch's base sequence -1, "no sequence".
            sequence: match producer {
                Some(_) => base_sequence.wrapping_add(i as i32),
                None => i as i32 - 1,
            },
            timestamp: now_ms,
            key: None,
            value: Some(Bytes::from(v.to_string())),
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .map_err(|e| format!("encoding record batch: {e}"))?;
    Ok(buf.freeze())
}

/// Decodes the batches of a fetch, keeping data records at or after `from`. A truncated batch at
/// the end (the broker cut the response at its byte limit) is dropped; a whole batch that does
/// not decode is an error.
pub fn decode_records(mut bytes: Bytes, from: i64) -> Result<Vec<FetchedRecord>, String> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        if !batch_is_whole(&bytes) {
            break;
        }
        let set = decode_batch(&mut bytes).map_err(|e| format!("decoding record batch: {e:#}"))?;
        out.extend(
            set.records
                .into_iter()
                .filter(|r| !r.control && r.offset >= from)
                .map(|r| FetchedRecord {
                    offset: r.offset,
                    value: r.value,
                    leader_epoch: r.partition_leader_epoch,
                }),
        );
    }
    Ok(out)
}

/// Where a v2 batch header keeps its length (after the base offset) and its record count.
const BATCH_LENGTH_AT: usize = 8;
const RECORD_COUNT_AT: usize = 57;

fn be_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let b = bytes.get(at..at + 4)?;
    Some(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

/// Whether `bytes` starts with a batch it holds all of.
fn batch_is_whole(bytes: &[u8]) -> bool {
    be_i32(bytes, BATCH_LENGTH_AT).is_some_and(|len| {
        usize::try_from(len).is_ok_and(|len| BATCH_LENGTH_AT + 4 + len <= bytes.len())
    })
}

/// Decodes one batch, first checking its record count (and each record's header count) against
/// its decompressed records: the decoder reserves room for that many records up front.
fn decode_batch(bytes: &mut Bytes) -> anyhow::Result<RecordSet> {
    let count = be_i32(bytes, RECORD_COUNT_AT);
    let checked = |records: &mut Bytes, compression: Compression| -> anyhow::Result<Bytes> {
        let take = |b: &mut Bytes| Ok(std::mem::take(b));
        let plain = match compression {
            Compression::None => std::mem::take(records),
            Compression::Gzip => Gzip::decompress(records, take)?,
            Compression::Snappy => Snappy::decompress(records, take)?,
            Compression::Lz4 => Lz4::decompress(records, take)?,
            Compression::Zstd => Zstd::decompress(records, take)?,
        };
        let count = count.ok_or_else(|| anyhow::anyhow!("batch header cut short"))?;
        tidemark_wirebound::check_records(count, &plain)?;
        Ok(plain)
    };
    RecordBatchDecoder::decode_with_custom_compression(bytes, Some(checked))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_with_decimal_values_in_one_batch() {
        let bytes = encode_batch(&[17, 18, 19]).unwrap();
        let mut info_buf = bytes.clone();
        let info = RecordBatchDecoder::decode_batch_info(&mut info_buf).unwrap();
        assert_eq!(info.len(), 1, "one batch");
        assert_eq!(info[0].record_count, 3);
        assert_eq!(info[0].base_sequence, -1);
        assert_eq!(info[0].producer_id, -1);
        let recs = decode_records(bytes, 1).unwrap();
        let got: Vec<(i64, &[u8])> = recs
            .iter()
            .map(|r| (r.offset, r.value.as_deref().unwrap()))
            .collect();
        assert_eq!(got, vec![(1, &b"18"[..]), (2, &b"19"[..])]);
    }

    #[test]
    fn an_idempotent_batch_carries_its_producer_and_sequence() {
        let producer = ProducerIdentity { id: 7, epoch: 2 };
        let bytes = encode_idempotent_batch(&[5, 6], producer, 40).unwrap();
        let info = RecordBatchDecoder::decode_batch_info(&mut bytes.clone()).unwrap();
        assert_eq!(info.len(), 1, "one batch");
        assert_eq!(
            (
                info[0].producer_id,
                info[0].producer_epoch,
                info[0].base_sequence
            ),
            (7, 2, 40)
        );
        assert_eq!(info[0].record_count, 2);
    }

    #[test]
    fn subscriptions_and_assignments_round_trip() {
        let topics = vec!["t0".to_string(), "t1".to_string()];
        assert_eq!(
            decode_subscription(encode_subscription(&topics).unwrap()).unwrap(),
            topics
        );
        let parts = vec![("t0".to_string(), 1), ("t1".to_string(), 0)];
        assert_eq!(
            decode_assignment(encode_assignment(&parts).unwrap()).unwrap(),
            parts
        );
        assert!(decode_assignment(Bytes::new()).unwrap().is_empty());
        assert!(decode_subscription(Bytes::from_static(&[0])).is_err());
    }

    #[test]
    fn a_truncated_trailing_batch_is_dropped() {
        let mut whole = BytesMut::new();
        whole.extend_from_slice(&encode_batch(&[1]).unwrap());
        let second = encode_batch(&[2]).unwrap();
        whole.extend_from_slice(&second[..second.len() - 5]);
        let recs = decode_records(whole.freeze(), 0).unwrap();
        assert_eq!(recs.len(), 1);
    }

    #[test]
    fn a_whole_batch_that_does_not_decode_is_an_error() {
        let mut batch = encode_batch(&[1, 2]).unwrap().to_vec();
        let last = batch.len() - 1;
        batch[last] ^= 0xff;
        let err = decode_records(Bytes::from(batch), 0).unwrap_err();
        assert!(err.contains("Cyclic redundancy check"), "{err}");
    }

    #[test]
    fn only_errors_after_sending_leave_the_outcome_unknown() {
        assert!(KafkaError::Timeout(Duration::from_secs(1)).maybe_sent());
        assert!(KafkaError::ConnectionLost("reset".into()).maybe_sent());
        assert!(!KafkaError::NotSent("x".into()).maybe_sent());
        assert!(!KafkaError::Connect {
            addr: "127.0.0.1:1".parse().unwrap(),
            reason: "refused".into()
        }
        .maybe_sent());
    }
}
