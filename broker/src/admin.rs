//! `tidemark-broker admin`: the few admin operations tests and nemeses need, spoken over the
//! Kafka protocol to any broker (so the same commands work against any Kafka-protocol cluster).

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::describe_topic_partitions_request::{Cursor, TopicRequest};
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    describe_quorum_request, DescribeQuorumRequest, DescribeTopicPartitionsRequest,
    ElectLeadersRequest, MetadataRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use serde_json::json;

use crate::mirror::wire::MirrorRequest;
use crate::replica::client::KafkaConnection;

const TIMEOUT: Duration = Duration::from_secs(15);

/// ElectLeaders for one partition; returns the JSON result and whether it succeeded.
pub async fn elect_leaders(
    bootstrap: &str,
    topic: &str,
    partition: i32,
    unclean: bool,
) -> anyhow::Result<(serde_json::Value, bool)> {
    let mut conn = KafkaConnection::connect(bootstrap, TIMEOUT, "tidemark-admin").await?;
    let req = ElectLeadersRequest::default()
        .with_election_type(if unclean { 1 } else { 0 })
        .with_timeout_ms(TIMEOUT.as_millis() as i32)
        .with_topic_partitions(Some(vec![TopicPartitions::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![partition])]));
    let resp = conn.call(2, &req).await?;
    let mut ok = resp.error_code == 0;
    let mut results = Vec::new();
    for r in &resp.replica_election_results {
        for p in &r.partition_result {
            ok &= p.error_code == 0;
            results.push(json!({
                "topic": r.topic.0.as_str(),
                "partition": p.partition_id,
                "error_code": p.error_code,
                "error_message": p.error_message.as_ref().map(|m| m.as_str()),
            }));
        }
    }
    ok &= !results.is_empty();
    Ok((
        json!({"error_code": resp.error_code, "results": results}),
        ok,
    ))
}

/// Where the KRaft metadata quorum stands (DescribeQuorum, like `kafka-metadata-quorum.sh describe
/// --status`): the active controller, its epoch, the metadata high watermark, the voters with
/// the log ends it knows and the observers; succeeds when the quorum has a leader.
pub async fn describe_quorum(bootstrap: &str) -> anyhow::Result<(serde_json::Value, bool)> {
    let mut conn = KafkaConnection::connect(bootstrap, TIMEOUT, "tidemark-admin").await?;
    let req = DescribeQuorumRequest::default().with_topics(vec![
        describe_quorum_request::TopicData::default()
            .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
            .with_partitions(vec![describe_quorum_request::PartitionData::default()]),
    ]);
    let resp = conn.call(1, &req).await?;
    let p = resp
        .topics
        .first()
        .and_then(|t| t.partitions.first())
        .ok_or_else(|| anyhow::anyhow!("DescribeQuorum answered no partition"))?;
    let replicas = |r: &[kafka_protocol::messages::describe_quorum_response::ReplicaState]| {
        r.iter()
            .map(|v| json!({"id": v.replica_id.0, "log_end_offset": v.log_end_offset}))
            .collect::<Vec<_>>()
    };
    let ok = resp.error_code == 0 && p.error_code == 0 && p.leader_id.0 >= 0;
    Ok((
        json!({
            "error_code": if resp.error_code != 0 { resp.error_code } else { p.error_code },
            "leader": p.leader_id.0,
            "epoch": p.leader_epoch,
            "high_watermark": p.high_watermark,
            "voters": replicas(&p.current_voters),
            "observers": replicas(&p.observers),
        }),
        ok,
    ))
}

/// Leader, epoch, replicas and ISR of every partition (of `topic`, if given), from Metadata, with
/// KIP-966's eligible leader replicas (`elr`, `last_known_elr`) where the broker tells them.
pub async fn describe(bootstrap: &str, topic: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let mut conn = KafkaConnection::connect(bootstrap, TIMEOUT, "tidemark-admin").await?;
    let topics = topic.map(|t| {
        vec![MetadataRequestTopic::default()
            .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))]
    });
    let req = MetadataRequest::default()
        .with_topics(topics)
        .with_allow_auto_topic_creation(false);
    let resp = conn.call(12, &req).await?;
    let brokers: Vec<_> = resp
        .brokers
        .iter()
        .map(|b| json!({"id": b.node_id.0, "host": b.host.as_str(), "port": b.port}))
        .collect();
    let eligible = eligible_leader_replicas(&mut conn, topic).await;
    let mut partitions = Vec::new();
    for t in &resp.topics {
        let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
        for p in &t.partitions {
            let mut entry = json!({
                "topic": name,
                "partition": p.partition_index,
                "error_code": p.error_code,
                "leader": p.leader_id.0,
                "leader_epoch": p.leader_epoch,
                "replicas": p.replica_nodes.iter().map(|r| r.0).collect::<Vec<_>>(),
                "isr": p.isr_nodes.iter().map(|r| r.0).collect::<Vec<_>>(),
                "offline": p.offline_replicas.iter().map(|r| r.0).collect::<Vec<_>>(),
            });
            if let Some((elr, last_known)) = eligible.get(&(name.clone(), p.partition_index)) {
                entry["elr"] = json!(elr);
                entry["last_known_elr"] = json!(last_known);
            }
            partitions.push(entry);
        }
    }
    Ok(json!({"controller": resp.controller_id.0, "brokers": brokers, "partitions": partitions}))
}

/// Each partition's eligible leader replicas and last known ELR, by (topic, partition), from
/// DescribeTopicPartitions (KIP-966), page by page; empty when the broker does not speak it
/// (Kafka before 3.8), since Metadata carries neither.
async fn eligible_leader_replicas(
    conn: &mut KafkaConnection,
    topic: Option<&str>,
) -> BTreeMap<(String, i32), (Vec<i32>, Vec<i32>)> {
    let mut out = BTreeMap::new();
    let topics: Vec<TopicRequest> = topic
        .map(|t| TopicRequest::default().with_name(TopicName(StrBytes::from_string(t.into()))))
        .into_iter()
        .collect();
    let mut cursor = None;
    loop {
        let req = DescribeTopicPartitionsRequest::default()
            .with_topics(topics.clone())
            .with_cursor(cursor.take());
        let Ok(resp) = conn.call(0, &req).await else {
            return out;
        };
        for t in &resp.topics {
            let name = t.name.as_ref().map(|n| n.0.to_string()).unwrap_or_default();
            for p in &t.partitions {
                let ids = |v: &Option<Vec<kafka_protocol::messages::BrokerId>>| {
                    v.iter().flatten().map(|r| r.0).collect::<Vec<_>>()
                };
                out.insert(
                    (name.clone(), p.partition_index),
                    (ids(&p.eligible_leader_replicas), ids(&p.last_known_elr)),
                );
            }
        }
        match resp.next_cursor {
            Some(next) => {
                cursor = Some(
                    Cursor::default()
                        .with_topic_name(next.topic_name)
                        .with_partition_index(next.partition_index),
                )
            }
            None => return out,
        }
    }
}

/// A mirror admin request (`tidemark-broker admin mirror ...`, named after
/// `kafka-cluster-mirrors.sh`) sent to the destination cluster; prints its JSON answer. A
/// describe asks every broker and keeps each partition's entry from its leader, which alone
/// knows the offsets and lag.
pub async fn mirror(
    bootstrap: &str,
    api_key_base: i16,
    req: MirrorRequest,
) -> anyhow::Result<(serde_json::Value, bool)> {
    let mut conn = KafkaConnection::connect(bootstrap, TIMEOUT, "tidemark-admin").await?;
    let mut resp = crate::mirror::client::call(&mut conn, api_key_base, &req).await?;
    if matches!(req, MirrorRequest::Describe { .. }) && resp.error_code == 0 {
        let md = crate::mirror::client::metadata(&mut conn, None).await?;
        for b in &md.brokers {
            let addr = format!("{}:{}", b.host.as_str(), b.port);
            let Ok(mut c) = KafkaConnection::connect(&addr, TIMEOUT, "tidemark-admin").await else {
                continue;
            };
            let Ok(other) = crate::mirror::client::call(&mut c, api_key_base, &req).await else {
                continue;
            };
            resp.merge_describe(&other);
        }
    }
    let ok = resp.error_code == 0 && resp.topics.iter().all(|t| t.error_code == 0);
    Ok((serde_json::to_value(&resp)?, ok))
}
