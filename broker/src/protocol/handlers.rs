//! One function per Kafka API: translate the decoded request into broker calls and the results
//! into the response of the same version.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::fetch_response::{
    EpochEndOffset as DivergingEpoch, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;

use super::listed_apis;
use crate::broker::{Broker, FetchSpec};
use crate::config::TOPIC_KEYS;
use crate::errors;
use crate::metadata::validate_topic_name;

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// Dispatches one request; `None` means no response is sent (acks=0 produce).
pub async fn handle(
    broker: &Arc<Broker>,
    request: RequestKind,
    version: i16,
) -> Option<ResponseKind> {
    Some(match request {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(api_versions(errors::NONE)),
        RequestKind::Metadata(r) => ResponseKind::Metadata(metadata(broker, r, version).await),
        RequestKind::CreateTopics(r) => {
            ResponseKind::CreateTopics(create_topics(broker, r, version).await)
        }
        RequestKind::DeleteTopics(r) => {
            ResponseKind::DeleteTopics(delete_topics(broker, r, version).await)
        }
        RequestKind::Produce(r) => {
            let acks = r.acks;
            let resp = produce(broker, r, version).await;
            if acks == 0 {
                return None;
            }
            ResponseKind::Produce(resp)
        }
        RequestKind::Fetch(r) => ResponseKind::Fetch(fetch(broker, r, version).await),
        RequestKind::ListOffsets(r) => ResponseKind::ListOffsets(list_offsets(broker, r, version)),
        RequestKind::OffsetForLeaderEpoch(r) => {
            ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch(broker, r))
        }
        RequestKind::DeleteRecords(r) => {
            ResponseKind::DeleteRecords(super::delete_records::delete_records(broker, r).await)
        }
        RequestKind::ElectLeaders(r) => {
            ResponseKind::ElectLeaders(elect_leaders(broker, r, version).await)
        }
        RequestKind::DescribeConfigs(r) => {
            ResponseKind::DescribeConfigs(describe_configs(broker, r))
        }
        RequestKind::IncrementalAlterConfigs(r) => {
            ResponseKind::IncrementalAlterConfigs(incremental_alter_configs(broker, r).await)
        }
        RequestKind::DescribeTopicPartitions(r) => ResponseKind::DescribeTopicPartitions(
            super::describe_topic_partitions::describe_topic_partitions(
                &broker.metadata(),
                broker.caught_up(),
                &r,
            ),
        ),
        RequestKind::DescribeQuorum(r) => {
            ResponseKind::DescribeQuorum(super::describe_quorum::describe_quorum(broker, r).await)
        }
        RequestKind::InitProducerId(r) => {
            ResponseKind::InitProducerId(super::init_producer_id::init_producer_id(broker, r).await)
        }
        other => {
            tracing::warn!("unexpected request {other:?} passed version checks");
            return None;
        }
    })
}

pub fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let mut r = ApiVersionsResponse::default();
    r.error_code = error_code;
    r.api_keys = listed_apis()
        .into_iter()
        .map(|(k, lo, hi)| {
            let mut v = ApiVersion::default();
            v.api_key = k as i16;
            v.min_version = lo;
            v.max_version = hi;
            v
        })
        .collect();
    r
}

async fn metadata(broker: &Broker, req: MetadataRequest, version: i16) -> MetadataResponse {
    let cfg = &broker.config;
    // Auto-create requested topics that do not exist, if both sides allow it.
    if let Some(topics) = &req.topics {
        let auto = cfg.auto_create_topics_enable && (version < 4 || req.allow_auto_topic_creation);
        if auto {
            let image = broker.metadata();
            for t in topics {
                if let Some(name) = &t.name {
                    let legal = validate_topic_name(name.0.as_str()).is_ok();
                    if legal && !image.topics.contains_key(name.0.as_str()) {
                        if let Err(e) = broker
                            .create_topic(
                                name.0.as_str(),
                                -1,
                                -1,
                                &BTreeMap::new(),
                                false,
                                Vec::new(),
                            )
                            .await
                        {
                            tracing::info!(
                                topic = ?name.0.as_str(),
                                "auto-create failed: {}",
                                e.message.escape_debug()
                            );
                        }
                    }
                }
            }
        }
    }
    let image = broker.metadata();
    // A broker still catching up may hold a stale image: it names no leaders rather than old ones.
    let leaders_known = broker.caught_up();
    let mut resp = MetadataResponse::default();
    if version >= 2 {
        resp.cluster_id = Some(s(broker.config.cluster_id.clone()));
    }
    // The active controller as the quorum knows it (-1 while unknown); without voters this
    // broker is its own controller. A dedicated controller serves no clients, so, as in Kafka,
    // clients are sent to a broker (this one), which forwards what needs the controller.
    resp.controller_id = BrokerId(if cfg.controller_quorum_voters.is_empty() {
        cfg.node_id
    } else {
        match broker.quorum().active_controller() {
            Some(c) if image.brokers.get(&c).is_some_and(|b| !b.fenced) => c,
            Some(_) => cfg.node_id,
            None => -1,
        }
    });
    // Live brokers only, as Kafka's: a fenced one missed its session and leads nothing, and a
    // client that dials it (to list groups, say) waits on a dead address.
    resp.brokers = image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .map(|b| {
            let mut mb = MetadataResponseBroker::default();
            mb.node_id = BrokerId(b.id);
            mb.host = s(b.host.clone());
            mb.port = b.port as i32;
            mb
        })
        .collect();
    let wanted: Option<Vec<(Option<String>, uuid::Uuid)>> = req.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id))
            .collect()
    });
    let describe = |t: &crate::metadata::TopicRegistration| {
        let mut mt = MetadataResponseTopic::default();
        mt.name = Some(TopicName(s(t.name.clone())));
        // Clients leave internal topics out of pattern subscriptions (Kafka's `is_internal`).
        mt.is_internal = version >= 1 && t.name == crate::group::OFFSETS_TOPIC;
        if version >= 10 {
            mt.topic_id = t.id;
        }
        mt.partitions = t
            .partitions
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut mp = MetadataResponsePartition::default();
                mp.partition_index = i as i32;
                let (leader, epoch) = if leaders_known {
                    (p.leader, p.leader_epoch)
                } else {
                    (-1, -1)
                };
                mp.error_code = if leader < 0 {
                    ResponseError::LeaderNotAvailable.code()
                } else {
                    errors::NONE
                };
                mp.leader_id = BrokerId(leader);
                if version >= 7 {
                    mp.leader_epoch = epoch;
                }
                mp.replica_nodes = p.replicas.iter().map(|r| BrokerId(*r)).collect();
                mp.isr_nodes = p.isr.iter().map(|r| BrokerId(*r)).collect();
                mp.offline_replicas = image
                    .offline_replicas(p)
                    .into_iter()
                    .map(BrokerId)
                    .collect();
                mp
            })
            .collect();
        mt
    };
    resp.topics = match wanted {
        None => image.topics.values().map(describe).collect(),
        Some(list) => list
            .into_iter()
            .map(|(name, id)| {
                let found = match &name {
                    Some(n) => image.topics.get(n),
                    None => image.topic_by_id(id),
                };
                match found {
                    Some(t) => describe(t),
                    None => {
                        let mut mt = MetadataResponseTopic::default();
                        mt.name = name.map(|n| TopicName(s(n)));
                        if version >= 10 {
                            mt.topic_id = id;
                        }
                        mt.error_code = match &mt.name {
                            Some(n) if validate_topic_name(n.0.as_str()).is_err() => {
                                ResponseError::InvalidTopicException.code()
                            }
                            Some(_) => errors::UNKNOWN_TOPIC_OR_PARTITION,
                            None => errors::UNKNOWN_TOPIC_ID,
                        };
                        mt
                    }
                }
            })
            .collect(),
    };
    resp
}

async fn create_topics(
    broker: &Broker,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut resp = CreateTopicsResponse::default();
    for t in req.topics {
        let name = t.name.0.to_string();
        let mut result = CreatableTopicResult::default();
        result.name = t.name.clone();
        let mut configs = BTreeMap::new();
        for c in &t.configs {
            if let Some(v) = &c.value {
                configs.insert(c.name.to_string(), v.to_string());
            }
        }
        let mut assignments: Vec<(i32, Vec<i32>)> = t
            .assignments
            .iter()
            .map(|a| {
                (
                    a.partition_index,
                    a.broker_ids.iter().map(|b| b.0).collect(),
                )
            })
            .collect();
        assignments.sort_by_key(|(p, _)| *p);
        let in_order = assignments
            .iter()
            .enumerate()
            .all(|(i, (p, _))| *p == i as i32);
        let outcome = if !in_order {
            Err(crate::broker::ApiError::new(
                errors::INVALID_REQUEST,
                "assignments must cover partitions 0..n",
            ))
        } else {
            let partitions = if assignments.is_empty() {
                t.num_partitions
            } else {
                assignments.len() as i32
            };
            let sets = assignments.into_iter().map(|(_, b)| b).collect();
            broker
                .create_topic(
                    &name,
                    partitions,
                    t.replication_factor,
                    &configs,
                    req.validate_only,
                    sets,
                )
                .await
        };
        match outcome {
            Ok(topic) if version >= 5 => {
                if version >= 7 {
                    result.topic_id = topic.id;
                }
                result.num_partitions = topic.partitions.len() as i32;
                result.replication_factor = topic
                    .partitions
                    .first()
                    .map_or(0, |p| p.replicas.len() as i16);
                let lc = broker
                    .topic_log_config(&name)
                    .unwrap_or_else(|| broker.config.log.clone());
                result.configs = Some(
                    TOPIC_KEYS
                        .iter()
                        .filter_map(|(k, _)| {
                            let mut c = CreatableTopicConfigs::default();
                            c.name = s(*k);
                            c.value = Some(s(lc.topic_value(k)?));
                            c.config_source = if configs.contains_key(*k) { 1 } else { 5 };
                            Some(c)
                        })
                        .collect(),
                );
            }
            Ok(_) => {}
            Err(e) => {
                result.error_code = e.code;
                result.error_message = Some(s(e.message));
            }
        }
        resp.topics.push(result);
    }
    resp
}

async fn delete_topics(
    broker: &Broker,
    req: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    let image = broker.metadata();
    let mut targets: Vec<(Option<String>, uuid::Uuid)> = req
        .topic_names
        .iter()
        .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
        .collect();
    targets.extend(
        req.topics
            .iter()
            .map(|t| (t.name.as_ref().map(|n| n.0.to_string()), t.topic_id)),
    );
    let mut resp = DeleteTopicsResponse::default();
    for (name, id) in targets {
        let mut r = DeletableTopicResult::default();
        let resolved = name
            .clone()
            .or_else(|| image.topic_by_id(id).map(|t| t.name.clone()));
        r.name = resolved.clone().map(|n| TopicName(s(n)));
        if version >= 6 {
            r.topic_id = image
                .topics
                .get(resolved.as_deref().unwrap_or_default())
                .map_or(id, |t| t.id);
        }
        match resolved {
            Some(n) => {
                if let Err(e) = broker.delete_topic(&n).await {
                    r.error_code = e.code;
                    if version >= 5 {
                        r.error_message = Some(s(e.message));
                    }
                }
            }
            None => r.error_code = errors::UNKNOWN_TOPIC_ID,
        }
        resp.responses.push(r);
    }
    resp
}

/// Appends every partition of the request first (in request order, before any wait), then
/// waits for the acks=all acknowledgements together.
async fn produce(broker: &Broker, req: ProduceRequest, version: i16) -> ProduceResponse {
    let timeout = Duration::from_millis(req.timeout_ms.max(0) as u64);
    let mut staged = Vec::new();
    for topic in &req.topic_data {
        for pd in &topic.partition_data {
            let outcome = if !(-1..=1).contains(&req.acks) {
                Err(crate::broker::ProduceResult {
                    error: errors::INVALID_REQUIRED_ACKS,
                    base_offset: -1,
                    log_start_offset: -1,
                    message: Some(format!("acks={} is not -1, 0 or 1", req.acks)),
                })
            } else {
                let records = pd.records.clone().unwrap_or_default();
                broker.append_produce(topic.name.0.as_str(), pd.index, &records, req.acks)
            };
            staged.push((topic.name.clone(), pd.index, outcome));
        }
    }
    let results =
        futures::future::join_all(staged.into_iter().map(|(name, index, outcome)| async move {
            let result = match outcome {
                Ok(pending) => crate::produce::await_ack(pending, timeout).await,
                Err(done) => done,
            };
            (name, index, result)
        }))
        .await;
    let mut resp = ProduceResponse::default();
    for (name, index, result) in results {
        let mut pr = PartitionProduceResponse::default();
        pr.index = index;
        pr.log_append_time_ms = -1;
        pr.error_code = result.error;
        pr.base_offset = result.base_offset;
        if version >= 5 {
            pr.log_start_offset = result.log_start_offset;
        }
        if version >= 8 {
            pr.error_message = result.message.map(s);
        }
        match resp.responses.last_mut() {
            Some(tr) if tr.name == name => tr.partition_responses.push(pr),
            _ => {
                let mut tr = TopicProduceResponse::default();
                tr.name = name;
                tr.partition_responses.push(pr);
                resp.responses.push(tr);
            }
        }
    }
    resp
}

async fn fetch(broker: &Arc<Broker>, req: FetchRequest, version: i16) -> FetchResponse {
    use crate::fetch_session::{Answer, PartitionKey, SessionRequest, Told, Wanted};
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.clamp(0, 30_000) as u64);
    let max_bytes = if req.max_bytes > 0 {
        req.max_bytes as usize
    } else {
        usize::MAX
    };
    let replica_id = if req.replica_id.0 >= 0 {
        req.replica_id.0
    } else {
        req.replica_state.replica_id.0
    };
    let requested: Vec<(PartitionKey, Wanted)> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|fp| {
                let key = PartitionKey {
                    topic: t.topic.0.clone(),
                    topic_id: t.topic_id,
                    partition: fp.partition,
                };
                let wanted = Wanted {
                    fetch_offset: fp.fetch_offset,
                    current_leader_epoch: fp.current_leader_epoch,
                    last_fetched_epoch: fp.last_fetched_epoch,
                    log_start_offset: if version >= 5 {
                        fp.log_start_offset
                    } else {
                        -1
                    },
                    partition_max_bytes: fp.partition_max_bytes,
                };
                (key, wanted)
            })
        })
        .collect();
    let session = if version >= 7 {
        SessionRequest::of(req.session_id, req.session_epoch)
    } else {
        Ok(SessionRequest::Sessionless { close: None })
    };
    let refused = |code: i16| {
        let mut resp = FetchResponse::default();
        resp.error_code = code;
        resp
    };
    let session = match session {
        Ok(s) => s,
        Err(code) => return refused(code),
    };
    // Sessionless fetches (librdkafka's, our clients') never take the sessions' lock.
    let sessions = || {
        broker
            .fetch_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    };
    let want = match session {
        SessionRequest::Sessionless { close } | SessionRequest::Open { close } => {
            if let Some(id) = close {
                sessions().close(id);
            }
            requested
        }
        SessionRequest::Incremental { id, epoch } => {
            let forgotten: Vec<PartitionKey> = req
                .forgotten_topics_data
                .iter()
                .flat_map(|t| {
                    t.partitions.iter().map(|p| PartitionKey {
                        topic: t.topic.0.clone(),
                        topic_id: t.topic_id,
                        partition: *p,
                    })
                })
                .collect();
            match sessions().begin(id, epoch, requested, &forgotten) {
                Ok(want) => want,
                Err(code) => return refused(code),
            }
        }
    };
    let mut data = broker.watch_data();
    let mut first_reading = true;
    let answered = loop {
        data.borrow_and_update();
        let mut answered: Vec<(PartitionKey, Wanted, PartitionData)> = Vec::new();
        let mut total = 0usize;
        let mut any_error = false;
        for (key, wanted) in &want {
            let mut pd = PartitionData::default();
            pd.partition_index = key.partition;
            let name = if key.topic.is_empty() {
                broker
                    .metadata()
                    .topic_by_id(key.topic_id)
                    .map(|t| t.name.clone())
            } else {
                Some(key.topic.to_string())
            };
            let Some(name) = name else {
                pd.error_code = errors::UNKNOWN_TOPIC_ID;
                any_error = true;
                answered.push((key.clone(), *wanted, pd));
                continue;
            };
            let budget = (wanted.partition_max_bytes.max(0) as usize)
                .min(max_bytes.saturating_sub(total))
                .max(1);
            let spec = FetchSpec {
                fetch_offset: wanted.fetch_offset,
                current_leader_epoch: wanted.current_leader_epoch,
                last_fetched_epoch: wanted.last_fetched_epoch,
                max_bytes: budget,
                replica_id,
                log_start_offset: wanted.log_start_offset,
                first_reading,
            };
            let r = broker.fetch(&name, key.partition, spec);
            any_error |= r.error != errors::NONE;
            total += r.records.len();
            pd.error_code = r.error;
            pd.high_watermark = r.high_watermark;
            pd.last_stable_offset = r.high_watermark;
            if version >= 5 {
                pd.log_start_offset = r.log_start_offset;
            }
            if let Some((epoch, end_offset)) = r.diverging_epoch {
                let mut d = DivergingEpoch::default();
                d.epoch = epoch;
                d.end_offset = end_offset;
                pd.diverging_epoch = d;
            }
            pd.records = Some(r.records.into());
            answered.push((key.clone(), *wanted, pd));
        }
        let now = Instant::now();
        if any_error || total >= req.min_bytes.max(1) as usize || now >= deadline {
            break answered;
        }
        first_reading = false;
        let _ = tokio::time::timeout(deadline - now, data.changed()).await;
    };
    let told = |pd: &PartitionData| Told {
        high_watermark: pd.high_watermark,
        log_start_offset: pd.log_start_offset,
    };
    let mut resp = FetchResponse::default();
    let included: Vec<bool> = match session {
        SessionRequest::Open { .. } => {
            resp.session_id = sessions().open(
                answered
                    .iter()
                    .map(|(k, w, pd)| (k.clone(), *w, told(pd)))
                    .collect(),
            );
            vec![true; answered.len()]
        }
        SessionRequest::Incremental { id, .. } => {
            resp.session_id = id;
            let answers: Vec<(PartitionKey, Answer)> = answered
                .iter()
                .map(|(k, _, pd)| {
                    let answer = Answer {
                        told: told(pd),
                        has_records: pd.records.as_ref().is_some_and(|r| !r.is_empty()),
                        error_code: pd.error_code,
                        diverging: pd.diverging_epoch.epoch >= 0,
                    };
                    (k.clone(), answer)
                })
                .collect();
            sessions().finish(id, &answers)
        }
        SessionRequest::Sessionless { .. } => vec![true; answered.len()],
    };
    for ((key, _, pd), include) in answered.into_iter().zip(included) {
        if !include {
            continue;
        }
        let same_topic = resp
            .responses
            .last()
            .is_some_and(|t| t.topic.0 == key.topic && t.topic_id == key.topic_id);
        if !same_topic {
            let mut tr = FetchableTopicResponse::default();
            tr.topic = kafka_protocol::messages::TopicName(key.topic.clone());
            tr.topic_id = key.topic_id;
            resp.responses.push(tr);
        }
        if let Some(tr) = resp.responses.last_mut() {
            tr.partitions.push(pd);
        }
    }
    resp
}

fn list_offsets(broker: &Broker, req: ListOffsetsRequest, version: i16) -> ListOffsetsResponse {
    let mut resp = ListOffsetsResponse::default();
    for topic in req.topics {
        let mut tr = ListOffsetsTopicResponse::default();
        tr.name = topic.name.clone();
        for p in topic.partitions {
            let mut pr = ListOffsetsPartitionResponse::default();
            pr.partition_index = p.partition_index;
            // Each sentinel from the version that introduced it (KIP-405, KIP-1005, KIP-1023).
            let min_version = match p.timestamp {
                -3 => 7,
                -4 => 8,
                -5 => 9,
                -6 => 11,
                _ => 0,
            };
            if version < min_version {
                pr.error_code = errors::UNSUPPORTED_VERSION;
                pr.timestamp = -1;
                pr.offset = -1;
                tr.partitions.push(pr);
                continue;
            }
            match broker.list_offset(
                topic.name.0.as_str(),
                p.partition_index,
                p.timestamp,
                p.current_leader_epoch,
                req.replica_id.0,
            ) {
                Ok((ts, offset, epoch)) => {
                    pr.timestamp = ts;
                    pr.offset = offset;
                    if version >= 4 {
                        pr.leader_epoch = epoch;
                    }
                }
                Err(code) => {
                    pr.error_code = code;
                    pr.timestamp = -1;
                    pr.offset = -1;
                }
            }
            tr.partitions.push(pr);
        }
        resp.topics.push(tr);
    }
    resp
}

fn offset_for_leader_epoch(
    broker: &Broker,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut resp = OffsetForLeaderEpochResponse::default();
    for topic in req.topics {
        let mut tr = OffsetForLeaderTopicResult::default();
        tr.topic = topic.topic.clone();
        for p in topic.partitions {
            let mut e = EpochEndOffset::default();
            e.partition = p.partition;
            match broker.offset_for_leader_epoch(
                topic.topic.0.as_str(),
                p.partition,
                p.current_leader_epoch,
                p.leader_epoch,
            ) {
                Ok((epoch, offset)) => {
                    e.leader_epoch = epoch;
                    e.end_offset = offset;
                }
                Err(code) => {
                    e.error_code = code;
                    e.leader_epoch = -1;
                    e.end_offset = -1;
                }
            }
            tr.partitions.push(e);
        }
        resp.topics.push(tr);
    }
    resp
}

const RESOURCE_TOPIC: i8 = 2;

/// A described config: name, value, and Kafka's config source.
type ConfigEntry = (String, String, i8);
const RESOURCE_BROKER: i8 = 4;

fn describe_configs(broker: &Broker, req: DescribeConfigsRequest) -> DescribeConfigsResponse {
    let mut resp = DescribeConfigsResponse::default();
    for res in req.resources {
        let mut r = DescribeConfigsResult::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name.clone();
        let entries: Result<Vec<ConfigEntry>, (i16, String)> = match res.resource_type {
            RESOURCE_TOPIC => {
                let name = res.resource_name.to_string();
                let image = broker.metadata();
                match (image.topics.get(&name), broker.topic_log_config(&name)) {
                    (Some(t), Some(lc)) => Ok(TOPIC_KEYS
                        .iter()
                        .filter_map(|(k, _)| {
                            let source = if t.configs.contains_key(*k) { 1 } else { 5 };
                            Some((k.to_string(), lc.topic_value(k)?, source))
                        })
                        .collect()),
                    _ => Err((
                        errors::UNKNOWN_TOPIC_OR_PARTITION,
                        format!("no topic {name}"),
                    )),
                }
            }
            RESOURCE_BROKER => {
                let id = res.resource_name.to_string();
                if id.is_empty() || id == broker.config.node_id.to_string() {
                    // Static values (source 4), overridden by cluster-wide dynamic ones (3).
                    let mut entries: BTreeMap<String, (String, i8)> = broker
                        .config
                        .raw
                        .iter()
                        .map(|(k, v)| (k.clone(), (v.clone(), 4)))
                        .collect();
                    for (k, v) in &broker.metadata().cluster_configs {
                        entries.insert(k.clone(), (v.clone(), 3));
                    }
                    Ok(entries
                        .into_iter()
                        .map(|(k, (v, src))| (k, v, src))
                        .collect())
                } else {
                    Err((
                        errors::INVALID_REQUEST,
                        format!("this is broker {}, not {id}", broker.config.node_id),
                    ))
                }
            }
            other => Err((
                errors::INVALID_REQUEST,
                format!("resource type {other} is not supported"),
            )),
        };
        match entries {
            Ok(list) => {
                let wanted = res
                    .configuration_keys
                    .as_ref()
                    .map(|ks| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>());
                r.configs = list
                    .into_iter()
                    .filter(|(k, _, _)| wanted.as_ref().is_none_or(|w| w.contains(k)))
                    .map(|(k, v, source)| {
                        let mut c = DescribeConfigsResourceResult::default();
                        c.name = s(k);
                        c.value = Some(s(v));
                        c.config_source = source;
                        c.read_only = res.resource_type == RESOURCE_BROKER;
                        c
                    })
                    .collect();
            }
            Err((code, msg)) => {
                r.error_code = code;
                r.error_message = Some(s(msg));
            }
        }
        resp.results.push(r);
    }
    resp
}

async fn incremental_alter_configs(
    broker: &Broker,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut resp = IncrementalAlterConfigsResponse::default();
    for res in req.resources {
        let mut r = AlterConfigsResourceResponse::default();
        r.resource_type = res.resource_type;
        r.resource_name = res.resource_name.clone();
        let outcome = if res.resource_type == RESOURCE_BROKER && !res.resource_name.is_empty() {
            Err((
                errors::INVALID_REQUEST,
                format!(
                    "broker {}: only cluster-wide dynamic configs (resource name \"\") can be altered",
                    res.resource_name.as_str()
                ),
            ))
        } else if res.resource_type != RESOURCE_TOPIC && res.resource_type != RESOURCE_BROKER {
            Err((
                errors::INVALID_REQUEST,
                "only topic and cluster-wide broker configs can be altered".to_string(),
            ))
        } else {
            let mut changes = Vec::new();
            let mut bad = None;
            for c in &res.configs {
                match c.config_operation {
                    0 => changes.push((
                        c.name.to_string(),
                        Some(c.value.as_ref().map(|v| v.to_string()).unwrap_or_default()),
                    )),
                    1 => changes.push((c.name.to_string(), None)),
                    op => {
                        bad = Some((
                            errors::INVALID_REQUEST,
                            format!("operation {op} on {} is not supported", c.name.as_str()),
                        ))
                    }
                }
            }
            match bad {
                Some(b) => Err(b),
                None if res.resource_type == RESOURCE_BROKER => broker
                    .alter_cluster_configs(&changes, req.validate_only)
                    .await
                    .map_err(|e| (e.code, e.message)),
                None => broker
                    .alter_topic_configs(res.resource_name.as_str(), &changes, req.validate_only)
                    .await
                    .map_err(|e| (e.code, e.message)),
            }
        };
        if let Err((code, msg)) = outcome {
            r.error_code = code;
            r.error_message = Some(s(msg));
        }
        resp.responses.push(r);
    }
    resp
}

async fn elect_leaders(
    broker: &Broker,
    req: ElectLeadersRequest,
    version: i16,
) -> ElectLeadersResponse {
    use kafka_protocol::messages::elect_leaders_response::{
        PartitionResult, ReplicaElectionResult,
    };
    let election = match (version, req.election_type) {
        (0, _) | (_, 0) => crate::controller::Election::Preferred,
        (_, 1) => crate::controller::Election::Unclean,
        (_, other) => {
            let mut r = ElectLeadersResponse::default();
            r.error_code = errors::INVALID_REQUEST;
            tracing::warn!("ElectLeaders with unknown election type {other}");
            return r;
        }
    };
    let partitions = req.topic_partitions.as_ref().map(|tps| {
        tps.iter()
            .flat_map(|tp| {
                tp.partitions
                    .iter()
                    .map(move |p| (tp.topic.0.to_string(), *p))
            })
            .collect::<Vec<_>>()
    });
    let mut resp = ElectLeadersResponse::default();
    match broker.elect_leaders(election, partitions).await {
        Ok(results) => {
            let mut by_topic: BTreeMap<String, Vec<PartitionResult>> = BTreeMap::new();
            for (topic, partition, code, message) in results {
                let mut pr = PartitionResult::default();
                pr.partition_id = partition;
                pr.error_code = code;
                pr.error_message = message.map(s);
                by_topic.entry(topic).or_default().push(pr);
            }
            resp.replica_election_results = by_topic
                .into_iter()
                .map(|(t, prs)| {
                    let mut r = ReplicaElectionResult::default();
                    r.topic = TopicName(s(t));
                    r.partition_result = prs;
                    r
                })
                .collect();
        }
        Err(e) => {
            if version >= 1 {
                resp.error_code = e.code;
            }
            tracing::warn!("ElectLeaders failed: {}", e.message.escape_debug());
        }
    }
    resp
}
