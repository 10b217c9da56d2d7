//! DescribeQuorum (KIP-595's API 55, versions 0-1): where the KRaft metadata quorum stands,
//! asked of any broker, which gets the answer from the active controller (as Kafka's brokers
//! forward it). Tools find the active controller with it (`kafka-metadata-quorum.sh describe
//! --status`), and so does the harness when a fault is aimed at it. A standalone node, without
//! voters, is its own quorum of one.

use kafka_protocol::messages::describe_quorum_response::{PartitionData, ReplicaState, TopicData};
use kafka_protocol::messages::{
    BrokerId, DescribeQuorumRequest, DescribeQuorumResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use crate::broker::Broker;
use crate::controller::QuorumStatus;
use kafka_protocol::ResponseError;

/// The metadata log's topic, the only one DescribeQuorum describes.
pub const METADATA_TOPIC: &str = "__cluster_metadata";

pub async fn describe_quorum(
    broker: &Broker,
    req: DescribeQuorumRequest,
) -> DescribeQuorumResponse {
    let cfg = &broker.config;
    let status = if cfg.controller_quorum_voters.is_empty() {
        Ok(QuorumStatus {
            leader: cfg.node_id,
            epoch: 0,
            high_watermark: 0,
            voters: vec![(cfg.node_id, 0)],
            observers: Vec::new(),
        })
    } else {
        broker.quorum().status().await
    };
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let mut out = PartitionData::default().with_partition_index(p.partition_index);
                    if t.topic_name.0.as_str() != METADATA_TOPIC || p.partition_index != 0 {
                        return out.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    }
                    match &status {
                        Ok(s) => {
                            out.leader_id = BrokerId(s.leader);
                            out.leader_epoch = s.epoch;
                            out.high_watermark = s.high_watermark;
                            out.current_voters = s
                                .voters
                                .iter()
                                .map(|(id, end)| replica(*id, *end))
                                .collect();
                            out.observers = s.observers.iter().map(|id| replica(*id, -1)).collect();
                            out
                        }
                        Err(e) => {
                            tracing::debug!("DescribeQuorum: {e}");
                            out.with_error_code(ResponseError::NotLeaderOrFollower.code())
                                .with_leader_id(BrokerId(-1))
                                .with_leader_epoch(-1)
                        }
                    }
                })
                .collect();
            TopicData::default()
                .with_topic_name(TopicName(StrBytes::from_string(t.topic_name.0.to_string())))
                .with_partitions(partitions)
        })
        .collect();
    DescribeQuorumResponse::default().with_topics(topics)
}

fn replica(id: i32, log_end_offset: i64) -> ReplicaState {
    ReplicaState::default()
        .with_replica_id(BrokerId(id))
        .with_log_end_offset(log_end_offset)
        .with_last_fetch_timestamp(-1)
        .with_last_caught_up_timestamp(-1)
}
