//! The LMLE store: records in the internal topic `__mirror_state` of the cluster that owns them,
//! written with acks=all and replicated like any topic, read back whole when another cluster
//! looks its LMLE up.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{BrokerId, FetchRequest, ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use tracing::warn;

use super::client::RPC_TIMEOUT;
use super::context::MirrorContext;
use super::rules::LmleRecord;
use crate::controller::ControllerCommand;
use crate::errors;
use crate::replica::client::KafkaConnection;

/// The internal topic holding LMLE records.
pub const LMLE_TOPIC: &str = "__mirror_state";

/// How long a stopping partition keeps trying to persist its LMLE before it counts as failed.
const LMLE_WRITE_WAIT: Duration = Duration::from_secs(30);

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// The leader of `__mirror_state-0` in this cluster, connected.
async fn lmle_leader(ctx: &MirrorContext) -> anyhow::Result<Option<KafkaConnection>> {
    let image = ctx.metadata();
    let Some(t) = image.topics.get(LMLE_TOPIC) else {
        return Ok(None);
    };
    let leader = t.partitions[0].leader;
    let ep = image
        .brokers
        .get(&leader)
        .ok_or_else(|| anyhow::anyhow!("{LMLE_TOPIC}-0 has no leader"))?;
    let addr = format!("{}:{}", ep.host, ep.port);
    Ok(Some(
        KafkaConnection::connect(&addr, RPC_TIMEOUT, "tidemark-lmle").await?,
    ))
}

/// Persists one LMLE record (acks=all), creating the internal topic on first use. Partitions
/// stopping together race to create the topic and to reach its leader; each retries until the
/// write lands or `LMLE_WRITE_WAIT` passes.
pub async fn write_lmle(ctx: &MirrorContext, record: &LmleRecord) -> anyhow::Result<()> {
    let value = serde_json::to_vec(record)?;
    let key = serde_json::to_vec(&record.key)?;
    let batch = encode_record(&key, &value);
    let deadline = tokio::time::Instant::now() + LMLE_WRITE_WAIT;
    loop {
        let attempt = async {
            if !ctx.metadata().topics.contains_key(LMLE_TOPIC) {
                // Three replicas, or every broker of a smaller cluster: counted among those
                // registered, not those alive now, so a failover while brokers are down waits
                // for them (the controller refuses too few) instead of creating a topic too
                // small for min.insync.replicas to ever take its acks=all writes.
                let rf = ctx.metadata().brokers.len().clamp(1, 3) as i16;
                let create = ControllerCommand::CreateTopic {
                    name: LMLE_TOPIC.to_string(),
                    id: uuid::Uuid::new_v4(),
                    partitions: 1,
                    replication_factor: rf,
                    configs: BTreeMap::new(),
                    validate_only: false,
                    assignments: Vec::new(),
                    mirror: None,
                };
                match ctx
                    .submit_and_wait(create, |i| i.topics.contains_key(LMLE_TOPIC))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if e.code == errors::TOPIC_ALREADY_EXISTS => {}
                    Err(e) => anyhow::bail!("cannot create {LMLE_TOPIC}: {}", e.message),
                }
            }
            let mut conn = lmle_leader(ctx)
                .await?
                .ok_or_else(|| anyhow::anyhow!("{LMLE_TOPIC} is not in this broker's image yet"))?;
            let req = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(RPC_TIMEOUT.as_millis() as i32)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(s(LMLE_TOPIC)))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(batch.clone()))])]);
            let resp = conn.call(9, &req).await?;
            let code = resp.responses[0].partition_responses[0].error_code;
            if code != errors::NONE {
                anyhow::bail!("produce to {LMLE_TOPIC}-0 failed with error {code}");
            }
            Ok(())
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() < deadline => {
                warn!("LMLE write pending: {e:#}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn encode_record(key: &[u8], value: &[u8]) -> Bytes {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Bytes::from(crate::log::batch::single_record_batch(
        Bytes::copy_from_slice(key),
        Bytes::copy_from_slice(value),
        false,
        now_ms,
    ))
}

/// Every committed LMLE record of this cluster, in log order.
pub async fn read_lmle(ctx: &MirrorContext) -> anyhow::Result<Vec<LmleRecord>> {
    let Some(mut conn) = lmle_leader(ctx).await? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let mut offset = 0i64;
    loop {
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(0)
            .with_max_bytes(1 << 24)
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(s(LMLE_TOPIC)))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(0)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(1 << 24)])]);
        let resp = conn.call(11, &req).await?;
        let pd = &resp.responses[0].partitions[0];
        if pd.error_code != errors::NONE {
            anyhow::bail!(
                "fetch from {LMLE_TOPIC}-0 failed with error {}",
                pd.error_code
            );
        }
        let bytes = pd.records.clone().unwrap_or_default();
        if bytes.is_empty() {
            return Ok(out);
        }
        for (at, h) in crate::log::batch::split_batches(&bytes)? {
            let mut one = bytes.slice(at..at + h.size);
            let set = RecordBatchDecoder::decode(&mut one)
                .map_err(|e| anyhow::anyhow!("{LMLE_TOPIC}-0 at offset {offset}: {e}"))?;
            for r in set.records {
                if r.offset < offset {
                    continue;
                }
                offset = r.offset + 1;
                let Some(v) = r.value else { continue };
                let rec: LmleRecord = serde_json::from_slice(&v).map_err(|e| {
                    anyhow::anyhow!("{LMLE_TOPIC}-0 offset {}: bad LMLE record: {e}", r.offset)
                })?;
                out.push(rec);
            }
        }
    }
}
