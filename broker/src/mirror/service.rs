//! The broker side of the mirror admin APIs, the client side used toward another cluster, and
//! the LMLE store: records in the internal topic `__mirror_state` of the cluster that owns them,
//! written with acks=all and replicated like any topic, read back whole when another cluster
//! looks its LMLE up.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, MetadataRequest, MetadataResponse, ProduceRequest, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tracing::{info, warn};

use super::context::MirrorContext;
use super::rules::{lookup_lmle, LmleRecord, MirrorState};
use super::wire::{
    decode_body, encode_body, MirrorApi, MirrorDescription, MirrorRequest, MirrorResponse,
    PartitionDescription, TopicDescription, TopicResult,
};
use crate::controller::ControllerCommand;
use crate::errors::{self, ApiError};
use crate::metadata::{MetadataImage, MirrorRegistration};
use crate::replica::client::KafkaConnection;

/// The internal topic holding LMLE records.
pub const LMLE_TOPIC: &str = "__mirror_state";

const RPC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping partition keeps trying to persist its LMLE before it counts as failed.
const LMLE_WRITE_WAIT: Duration = Duration::from_secs(30);
/// How long a stop waits for its partitions to become writable before answering.
const STOP_WAIT: Duration = Duration::from_secs(30);

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// Connects to the first reachable address of a comma-separated bootstrap list.
pub async fn connect_any(bootstrap: &str, client_id: &str) -> anyhow::Result<KafkaConnection> {
    let mut last = None;
    for addr in bootstrap
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        match KafkaConnection::connect(addr, RPC_TIMEOUT, client_id).await {
            Ok(c) => return Ok(c),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("empty bootstrap list `{bootstrap}`")))
}

/// Sends one mirror request over `conn` with the mirror APIs at `base`.
pub async fn call(
    conn: &mut KafkaConnection,
    base: i16,
    req: &MirrorRequest,
) -> anyhow::Result<MirrorResponse> {
    let mut body = BytesMut::new();
    encode_body(req, &mut body)?;
    let mut resp = conn.call_raw(req.api().key(base), 0, &body).await?;
    decode_body(&mut resp)
}

/// Metadata (v12) for one topic, or for none (brokers and cluster id only).
pub async fn metadata(
    conn: &mut KafkaConnection,
    topic: Option<&str>,
) -> anyhow::Result<MetadataResponse> {
    let topics =
        vec![topic.map(|t| MetadataRequestTopic::default().with_name(Some(TopicName(s(t)))))]
            .into_iter()
            .flatten()
            .collect();
    let req = MetadataRequest::default()
        .with_topics(Some(topics))
        .with_allow_auto_topic_creation(false);
    conn.call(12, &req).await
}

/// Answers one mirror request frame body (after its header).
pub async fn handle_frame(
    ctx: &Arc<MirrorContext>,
    api: MirrorApi,
    body: &mut Bytes,
) -> MirrorResponse {
    let req: MirrorRequest = match decode_body(body) {
        Ok(r) => r,
        Err(e) => return failure(ctx, errors::INVALID_REQUEST, format!("{api:?}: {e}")),
    };
    if req.api() != api {
        return failure(
            ctx,
            errors::INVALID_REQUEST,
            format!("{api:?} request carries a {:?} body", req.api()),
        );
    }
    match handle(ctx, req).await {
        Ok(r) => r,
        Err(e) => failure(ctx, e.code, e.message),
    }
}

fn failure(ctx: &MirrorContext, code: i16, message: String) -> MirrorResponse {
    MirrorResponse {
        error_code: code,
        error_message: Some(message),
        cluster_id: ctx.cluster_id.clone(),
        ..Default::default()
    }
}

fn api_err(code: i16) -> impl Fn(anyhow::Error) -> ApiError {
    move |e| ApiError::new(code, format!("{e:#}"))
}

async fn handle(ctx: &Arc<MirrorContext>, req: MirrorRequest) -> Result<MirrorResponse, ApiError> {
    let mut resp = MirrorResponse {
        cluster_id: ctx.cluster_id.clone(),
        ..Default::default()
    };
    match req {
        MirrorRequest::Create {
            mirror,
            source_bootstrap,
        } => {
            let mut conn = connect_any(&source_bootstrap, "tidemark-mirror")
                .await
                .map_err(api_err(errors::REQUEST_TIMED_OUT))?;
            let md = metadata(&mut conn, None)
                .await
                .map_err(api_err(errors::REQUEST_TIMED_OUT))?;
            let source_cluster_id = md.cluster_id.map(|c| c.to_string()).unwrap_or_default();
            if source_cluster_id.is_empty() || source_cluster_id == ctx.cluster_id {
                return Err(ApiError::new(
                    errors::INVALID_REQUEST,
                    format!(
                        "source {source_bootstrap} reports cluster id `{source_cluster_id}`; a mirror needs another cluster than `{}`",
                        ctx.cluster_id
                    ),
                ));
            }
            let name = mirror.clone();
            ctx.submit_and_wait(
                ControllerCommand::CreateMirror {
                    mirror: MirrorRegistration {
                        name: mirror,
                        source_bootstrap,
                        source_cluster_id,
                    },
                },
                |i| i.mirrors.contains_key(&name),
            )
            .await?;
        }
        MirrorRequest::Start { mirror, topics } => {
            let reg = mirror_of(ctx, &mirror)?;
            for topic in topics {
                let outcome = start_topic(ctx, &reg, &topic).await;
                resp.topics.push(topic_result(topic, outcome));
            }
        }
        MirrorRequest::Stop { mirror, topics } => {
            mirror_of(ctx, &mirror)?;
            for topic in topics {
                let outcome = stop_topic(ctx, &mirror, &topic).await;
                resp.topics.push(topic_result(topic, outcome));
            }
        }
        MirrorRequest::Pause { mirror, topics } => {
            mirror_of(ctx, &mirror)?;
            for topic in topics {
                let outcome = set_states(ctx, &mirror, &topic, MirrorState::Pausing).await;
                resp.topics.push(topic_result(topic, outcome));
            }
        }
        MirrorRequest::Resume { mirror, topics } => {
            mirror_of(ctx, &mirror)?;
            for topic in topics {
                let outcome = set_states(ctx, &mirror, &topic, MirrorState::Mirroring).await;
                resp.topics.push(topic_result(topic, outcome));
            }
        }
        MirrorRequest::Recover { mirror, topics } => {
            mirror_of(ctx, &mirror)?;
            for topic in topics {
                let outcome = recover_topic(ctx, &mirror, &topic).await;
                resp.topics.push(topic_result(topic, outcome));
            }
        }
        MirrorRequest::Delete { mirror } => {
            ctx.submit_and_wait(
                ControllerCommand::DeleteMirror {
                    name: mirror.clone(),
                },
                |i| !i.mirrors.contains_key(&mirror),
            )
            .await?;
        }
        MirrorRequest::List => {
            resp.mirrors = describe(ctx, None);
            for m in &mut resp.mirrors {
                for t in &mut m.topics {
                    t.partitions.clear();
                }
            }
        }
        MirrorRequest::Describe { mirror, lookup } => {
            if let Some(m) = &mirror {
                mirror_of(ctx, m)?;
            }
            resp.mirrors = describe(ctx, mirror.as_deref());
            if let Some(l) = lookup {
                let records = read_lmle(ctx)
                    .await
                    .map_err(api_err(errors::REQUEST_TIMED_OUT))?;
                resp.lmle = l
                    .partitions
                    .iter()
                    .map(|p| (*p, lookup_lmle(&records, &l.cluster_id, l.topic_id, *p)))
                    .collect();
            }
        }
    }
    Ok(resp)
}

fn mirror_of(ctx: &MirrorContext, name: &str) -> Result<MirrorRegistration, ApiError> {
    ctx.metadata()
        .mirrors
        .get(name)
        .cloned()
        .ok_or_else(|| ApiError::new(errors::UNKNOWN_CLUSTER_MIRROR, format!("no mirror {name}")))
}

fn topic_result(topic: String, outcome: Result<(), ApiError>) -> TopicResult {
    match outcome {
        Ok(()) => TopicResult {
            topic,
            error_code: errors::NONE,
            error_message: None,
        },
        Err(e) => TopicResult {
            topic,
            error_code: e.code,
            error_message: Some(e.message),
        },
    }
}

/// Starts mirroring one topic: creates it with the source's id, or (failback) turns the
/// existing topic of that id back into a mirror topic. Refuses a mirror loop: the source
/// mirroring the same topic from this cluster.
async fn start_topic(
    ctx: &MirrorContext,
    mirror: &MirrorRegistration,
    topic: &str,
) -> Result<(), ApiError> {
    let unreachable = api_err(errors::REQUEST_TIMED_OUT);
    let mut conn = connect_any(&mirror.source_bootstrap, "tidemark-mirror")
        .await
        .map_err(&unreachable)?;
    let md = metadata(&mut conn, Some(topic))
        .await
        .map_err(&unreachable)?;
    let Some(t) = md.topics.first().filter(|t| t.error_code == errors::NONE) else {
        return Err(ApiError::new(
            errors::UNKNOWN_TOPIC_OR_PARTITION,
            format!("source {} has no topic {topic}", mirror.source_cluster_id),
        ));
    };
    let (id, partitions) = (t.topic_id, t.partitions.len() as i32);
    let rf = t
        .partitions
        .first()
        .map_or(1, |p| p.replica_nodes.len() as i16);
    let source_view = call(
        &mut conn,
        ctx.api_key_base,
        &MirrorRequest::Describe {
            mirror: None,
            lookup: None,
        },
    )
    .await
    .map_err(&unreachable)?;
    let me = &ctx.cluster_id;
    let looping = source_view.mirrors.iter().find(|m| {
        &m.source_cluster_id == me
            && m.topics.iter().any(|st| {
                st.name == topic
                    && st
                        .partitions
                        .iter()
                        .any(|p| p.state != MirrorState::Stopped)
            })
    });
    if let Some(m) = looping {
        return Err(ApiError::new(
            errors::INVALID_REQUEST,
            format!(
                "Detected mirror loop for mirror:{}: cluster {} mirrors {topic} from this cluster ({me}) in its mirror {}",
                mirror.name, mirror.source_cluster_id, m.name
            ),
        ));
    }
    let image = ctx.metadata();
    let cmd = if image.topics.contains_key(topic) {
        ControllerCommand::StartMirrorTopic {
            mirror: mirror.name.clone(),
            topic: topic.to_string(),
            id,
            partitions,
        }
    } else {
        let live = image.brokers.values().filter(|b| !b.fenced).count().max(1);
        ControllerCommand::CreateTopic {
            name: topic.to_string(),
            id,
            partitions,
            replication_factor: rf.min(live as i16),
            configs: BTreeMap::new(),
            validate_only: false,
            assignments: Vec::new(),
            mirror: Some(mirror.name.clone()),
        }
    };
    ctx.submit_and_wait(cmd, |i| {
        i.topics
            .get(topic)
            .and_then(|t| t.mirror.as_ref())
            .is_some_and(|m| m.mirror == mirror.name)
    })
    .await?;
    info!(topic, mirror = %mirror.name, "mirror topic started");
    Ok(())
}

/// Refuses a topic that is not in `mirror`.
fn check_in_mirror(ctx: &MirrorContext, mirror: &str, topic: &str) -> Result<(), ApiError> {
    let image = ctx.metadata();
    let in_mirror = image
        .topics
        .get(topic)
        .and_then(|t| t.mirror.as_ref())
        .is_some_and(|m| m.mirror == mirror);
    if !in_mirror {
        return Err(ApiError::new(
            errors::TOPIC_NOT_IN_CLUSTER_MIRROR,
            format!("topic {topic} is not in mirror {mirror}"),
        ));
    }
    Ok(())
}

/// Moves every partition of a topic of `mirror` to `to`, as an operator asks.
async fn set_states(
    ctx: &MirrorContext,
    mirror: &str,
    topic: &str,
    to: MirrorState,
) -> Result<(), ApiError> {
    check_in_mirror(ctx, mirror, topic)?;
    let cmd = ControllerCommand::SetMirrorStates {
        topic: topic.to_string(),
        partitions: None,
        from: None,
        to,
        error: None,
        terminal: false,
    };
    ctx.submit_and_wait(cmd, |_| true).await.map(|_| ())
}

/// RecoverMirrorTopics: the topic's FAILED partitions that stopped retrying retry again.
async fn recover_topic(ctx: &MirrorContext, mirror: &str, topic: &str) -> Result<(), ApiError> {
    check_in_mirror(ctx, mirror, topic)?;
    let cmd = ControllerCommand::RecoverMirrorPartitions {
        topic: topic.to_string(),
    };
    ctx.submit_and_wait(cmd, |_| true).await.map(|_| ())
}

/// Failover of one topic: STOPPING now; answers once every partition is STOPPED (its leader
/// persisted the LMLE and bumped the epoch), so the topic is writable when this returns.
async fn stop_topic(ctx: &MirrorContext, mirror: &str, topic: &str) -> Result<(), ApiError> {
    let stopped = |i: &MetadataImage| {
        i.topics
            .get(topic)
            .and_then(|t| t.mirror.as_ref())
            .is_some_and(|m| m.partitions.iter().all(|p| p.state == MirrorState::Stopped))
    };
    if !stopped(&ctx.metadata()) {
        set_states(ctx, mirror, topic, MirrorState::Stopping).await?;
    }
    let mut rx = ctx.images();
    let waited = tokio::time::timeout(STOP_WAIT, rx.wait_for(|i| stopped(i)))
        .await
        .is_ok_and(|r| r.is_ok());
    if waited {
        Ok(())
    } else {
        Err(ApiError::new(
            errors::REQUEST_TIMED_OUT,
            format!("{topic} did not reach STOPPED within {STOP_WAIT:?}"),
        ))
    }
}

/// Mirrors, topics and partitions as this broker sees them; offsets only where it leads.
fn describe(ctx: &MirrorContext, only: Option<&str>) -> Vec<MirrorDescription> {
    let image = ctx.metadata();
    let me = ctx.node_id;
    image
        .mirrors
        .values()
        .filter(|m| only.is_none_or(|o| o == m.name))
        .map(|m| MirrorDescription {
            name: m.name.clone(),
            source_bootstrap: m.source_bootstrap.clone(),
            source_cluster_id: m.source_cluster_id.clone(),
            topics: image
                .topics
                .values()
                .filter_map(|t| Some((t, t.mirror.as_ref().filter(|tm| tm.mirror == m.name)?)))
                .map(|(t, tm)| TopicDescription {
                    name: t.name.clone(),
                    topic_id: t.id,
                    partitions: tm
                        .partitions
                        .iter()
                        .enumerate()
                        .map(|(i, pm)| {
                            let index = i as i32;
                            let leader = t.partitions[i].leader;
                            let local = (leader == me)
                                .then(|| ctx.partition(&t.name, index))
                                .flatten();
                            let status = ctx.tasks.status(&t.name, index);
                            let destination_offset = local.map_or(-1, |p| p.log_end_offset());
                            let source_offset =
                                status.as_ref().map_or(-1, |s| s.source_high_watermark);
                            PartitionDescription {
                                partition: index,
                                leader,
                                state: pm.state,
                                source_offset,
                                destination_offset,
                                lag: if source_offset >= 0 && destination_offset >= 0 {
                                    (source_offset - destination_offset).max(0)
                                } else {
                                    -1
                                },
                                lmle: status.as_ref().map_or(-1, |s| s.lmle),
                                waiting_for: status.and_then(|s| s.waiting_for),
                                retry_attempt: pm.retry_attempt,
                                last_error: pm.last_error.clone(),
                            }
                        })
                        .collect(),
                })
                .collect(),
        })
        .collect()
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
    let batch = encode_record(&key, &value)?;
    let deadline = tokio::time::Instant::now() + LMLE_WRITE_WAIT;
    loop {
        let attempt = async {
            if !ctx.metadata().topics.contains_key(LMLE_TOPIC) {
                let image = ctx.metadata();
                let live = image.brokers.values().filter(|b| !b.fenced).count();
                let rf = live.clamp(1, 3) as i16;
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

fn encode_record(key: &[u8], value: &[u8]) -> anyhow::Result<Bytes> {
    let record = Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: 0,
        sequence: -1,
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64),
        key: Some(Bytes::copy_from_slice(key)),
        value: Some(Bytes::copy_from_slice(value)),
        headers: IndexMap::new(),
    };
    let mut buf = BytesMut::new();
    let opts = RecordEncodeOptions {
        version: 2,
        compression: Compression::None,
    };
    RecordBatchEncoder::encode(&mut buf, [&record], &opts)?;
    Ok(buf.freeze())
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
