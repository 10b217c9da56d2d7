//! `tidemark-broker admin`: the few admin operations tests and nemeses need, spoken over the
//! Kafka protocol to any broker (so the same commands work against any Kafka-protocol cluster).

use std::time::Duration;

use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ElectLeadersRequest, MetadataRequest, TopicName};
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

/// Leader, epoch, replicas and ISR of every partition (of `topic`, if given), from Metadata.
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
    let mut partitions = Vec::new();
    for t in &resp.topics {
        for p in &t.partitions {
            partitions.push(json!({
                "topic": t.name.as_ref().map(|n| n.0.as_str()),
                "partition": p.partition_index,
                "error_code": p.error_code,
                "leader": p.leader_id.0,
                "leader_epoch": p.leader_epoch,
                "replicas": p.replica_nodes.iter().map(|r| r.0).collect::<Vec<_>>(),
                "isr": p.isr_nodes.iter().map(|r| r.0).collect::<Vec<_>>(),
            }));
        }
    }
    Ok(json!({"controller": resp.controller_id.0, "brokers": brokers, "partitions": partitions}))
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
