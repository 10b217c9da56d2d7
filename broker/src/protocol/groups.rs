//! The group coordinator's APIs on the wire: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups and DescribeGroups, translated to and from
//! [`crate::group`], each response shaped for the version asked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use tracing::info;

use crate::broker::Broker;
use crate::group::state::{CommittedOffset, Group, GroupState, JoinRequest, Reply};
use crate::group::{records, GroupCoordinator, Placement, OFFSETS_TOPIC};

fn s(v: impl Into<String>) -> StrBytes {
    StrBytes::from_string(v.into())
}

/// How long a JoinGroup or SyncGroup may wait past the group's own deadlines before the
/// coordinator answers REBALANCE_IN_PROGRESS itself.
const WAIT_MARGIN: Duration = Duration::from_secs(5);

/// Answers a group coordinator request; any other request comes back unanswered.
pub async fn handle(
    broker: &Arc<Broker>,
    header: &RequestHeader,
    request: RequestKind,
    version: i16,
) -> Result<ResponseKind, RequestKind> {
    let client_id = header
        .client_id
        .as_ref()
        .map(|c| c.to_string())
        .unwrap_or_default();
    Ok(match request {
        RequestKind::FindCoordinator(r) => {
            ResponseKind::FindCoordinator(find_coordinator(broker, r, version).await)
        }
        RequestKind::JoinGroup(r) => {
            ResponseKind::JoinGroup(join_group(broker, r, version, client_id).await)
        }
        RequestKind::SyncGroup(r) => ResponseKind::SyncGroup(sync_group(broker, r, version).await),
        RequestKind::Heartbeat(r) => ResponseKind::Heartbeat(heartbeat(broker, r)),
        RequestKind::LeaveGroup(r) => ResponseKind::LeaveGroup(leave_group(broker, r, version)),
        RequestKind::OffsetCommit(r) => ResponseKind::OffsetCommit(offset_commit(broker, r).await),
        RequestKind::OffsetFetch(r) => ResponseKind::OffsetFetch(offset_fetch(broker, r, version)),
        RequestKind::ListGroups(r) => ResponseKind::ListGroups(list_groups(broker, r, version)),
        RequestKind::DescribeGroups(r) => ResponseKind::DescribeGroups(describe_groups(broker, r)),
        other => return Err(other),
    })
}

/// Creates `__consumer_offsets` on first use, as Kafka does.
async fn ensure_offsets_topic(broker: &Broker) -> Result<(), (i16, String)> {
    if broker.metadata().topics.contains_key(OFFSETS_TOPIC) {
        return Ok(());
    }
    let cfg = &broker.config.groups;
    let registered = broker
        .metadata()
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .count();
    let rf = (cfg.offsets_topic_replication_factor as usize).clamp(1, registered.max(1)) as i16;
    match broker
        .create_topic(
            OFFSETS_TOPIC,
            cfg.offsets_topic_num_partitions,
            rf,
            &BTreeMap::new(),
            false,
            Vec::new(),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if e.code == ResponseError::TopicAlreadyExists.code() => Ok(()),
        Err(e) => Err((
            ResponseError::CoordinatorNotAvailable.code(),
            format!("cannot create {OFFSETS_TOPIC}: {}", e.message),
        )),
    }
}

/// The coordinator of one key: (error, message, node id, host, port).
async fn coordinator_of(
    broker: &Broker,
    key: &str,
    key_type: i8,
) -> (i16, Option<String>, i32, String, i32) {
    let fail = |code: i16, message: String| (code, Some(message), -1, String::new(), -1);
    if key_type != 0 {
        return fail(
            ResponseError::InvalidRequest.code(),
            format!("coordinator key type {key_type}: this broker has group coordinators only (no transactions)"),
        );
    }
    if let Err((code, message)) = ensure_offsets_topic(broker).await {
        return fail(code, message);
    }
    let image = broker.metadata();
    let Some(topic) = image.topics.get(OFFSETS_TOPIC) else {
        return fail(
            ResponseError::CoordinatorNotAvailable.code(),
            format!("{OFFSETS_TOPIC} is not in this broker's metadata yet"),
        );
    };
    let partition = crate::group::partition_for(key, topic.partitions.len());
    let leader = topic.partitions[partition as usize].leader;
    match image.brokers.get(&leader).filter(|_| broker.caught_up()) {
        Some(b) => (0, None, leader, b.host.clone(), b.port as i32),
        None => fail(
            ResponseError::CoordinatorNotAvailable.code(),
            format!("{OFFSETS_TOPIC}-{partition} has no leader"),
        ),
    }
}

async fn find_coordinator(
    broker: &Broker,
    req: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let mut resp = FindCoordinatorResponse::default();
    if version >= 4 {
        for key in &req.coordinator_keys {
            let (error, message, node, host, port) =
                coordinator_of(broker, key.as_str(), req.key_type).await;
            resp.coordinators.push(
                Coordinator::default()
                    .with_key(key.clone())
                    .with_node_id(BrokerId(node))
                    .with_host(s(host))
                    .with_port(port)
                    .with_error_code(error)
                    .with_error_message(message.map(s)),
            );
        }
        return resp;
    }
    let (error, message, node, host, port) =
        coordinator_of(broker, req.key.as_str(), req.key_type).await;
    resp.error_code = error;
    if version >= 1 {
        resp.error_message = message.map(s);
    }
    resp.node_id = BrokerId(node);
    resp.host = s(host);
    resp.port = port;
    resp
}

/// A JoinGroup answer for `version`: the protocol name is nullable from v7 only.
fn join_response(outcome: crate::group::state::JoinOutcome, version: i16) -> JoinGroupResponse {
    let mut resp = JoinGroupResponse::default()
        .with_error_code(outcome.error)
        .with_generation_id(outcome.generation)
        .with_leader(s(outcome.leader))
        .with_member_id(s(outcome.member_id))
        .with_members(
            outcome
                .members
                .into_iter()
                .map(|(id, metadata)| {
                    JoinGroupResponseMember::default()
                        .with_member_id(s(id))
                        .with_metadata(metadata)
                })
                .collect(),
        );
    resp.protocol_name = match outcome.protocol_name {
        Some(n) => Some(s(n)),
        None if version >= 7 => None,
        None => Some(s("")),
    };
    if version >= 7 {
        resp.protocol_type = outcome.protocol_type.map(s);
    }
    resp
}

fn join_error(code: i16, member_id: &str, version: i16) -> JoinGroupResponse {
    join_response(
        crate::group::state::JoinOutcome {
            error: code,
            generation: -1,
            member_id: member_id.to_string(),
            ..Default::default()
        },
        version,
    )
}

async fn join_group(
    broker: &Arc<Broker>,
    req: JoinGroupRequest,
    version: i16,
    client_id: String,
) -> JoinGroupResponse {
    let group_id = req.group_id.0.to_string();
    let member_id = req.member_id.to_string();
    let cfg = &broker.config.groups;
    if group_id.is_empty() {
        return join_error(ResponseError::InvalidGroupId.code(), &member_id, version);
    }
    if req.group_instance_id.is_some() {
        // Static membership (KIP-345) is not built: refuse it rather than half-honour it.
        return join_error(
            ResponseError::UnsupportedVersion.code(),
            &member_id,
            version,
        );
    }
    let session_timeout = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
    if session_timeout < cfg.min_session_timeout || session_timeout > cfg.max_session_timeout {
        return join_error(
            ResponseError::InvalidSessionTimeout.code(),
            &member_id,
            version,
        );
    }
    let rebalance_timeout = if version >= 1 {
        Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64)
    } else {
        session_timeout
    };
    let at = match broker.groups.place(&group_id) {
        Ok(at) => at,
        Err(code) => return join_error(code, &member_id, version),
    };
    let join = JoinRequest {
        member_id: member_id.clone(),
        client_id: client_id.clone(),
        client_host: String::new(),
        session_timeout,
        rebalance_timeout,
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        require_known_member_id: version >= 4,
    };
    let new_id = move || format!("{client_id}-{}", uuid::Uuid::new_v4());
    let initial_delay = cfg.initial_rebalance_delay;
    // A known member id for a group that does not exist is refused, not a new group.
    let create = member_id.is_empty();
    let reply = broker.groups.with_group(at, &group_id, create, |g| {
        g.join(join, new_id, initial_delay, Instant::now())
    });
    match reply {
        Err(code) => join_error(code, &member_id, version),
        Ok(None) => join_error(ResponseError::UnknownMemberId.code(), &member_id, version),
        Ok(Some(Reply::Now(outcome))) => join_response(outcome, version),
        Ok(Some(Reply::Later(rx))) => {
            let wait = rebalance_timeout.max(initial_delay) + WAIT_MARGIN;
            match tokio::time::timeout(wait, rx).await {
                Ok(Ok(outcome)) => join_response(outcome, version),
                // Replaced by a later JoinGroup of the same member, or no answer in time.
                _ => join_error(
                    ResponseError::RebalanceInProgress.code(),
                    &member_id,
                    version,
                ),
            }
        }
    }
}

async fn sync_group(
    broker: &Arc<Broker>,
    req: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let group_id = req.group_id.0.to_string();
    let member_id = req.member_id.to_string();
    let fail = |code: i16| SyncGroupResponse::default().with_error_code(code);
    let at = match broker.groups.place(&group_id) {
        Ok(at) => at,
        Err(code) => return fail(code),
    };
    let assignments: Vec<(String, Bytes)> = req
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let protocol_type = req.protocol_type.as_ref().map(|t| t.to_string());
    let protocol_name = req.protocol_name.as_ref().map(|t| t.to_string());
    // The leader's SyncGroup stores the group, appended under the coordinator's lock.
    let step = broker.groups.with_group(at, &group_id, false, |g| {
        let (reply, store) = g.sync(
            &member_id,
            req.generation_id,
            protocol_type.as_deref(),
            protocol_name.as_deref(),
            assignments,
            Instant::now(),
        );
        (
            reply,
            store.map(|generation| (generation, records::group_entry(g))),
        )
    });
    let (reply, store) = match step {
        Err(code) => return fail(code),
        Ok(None) => return fail(ResponseError::UnknownMemberId.code()),
        Ok(Some(step)) => step,
    };
    if let Some((generation, entry)) = store {
        let result = match broker.groups.append(at, &[entry]) {
            Ok(pending) => GroupCoordinator::acknowledged(pending).await.map(|_| ()),
            Err(code) => Err(code),
        };
        if let Err(code) = result {
            info!(group = ?group_id, generation, "storing the assignment failed with error {code}");
        }
        let _ = broker.groups.with_group(at, &group_id, false, |g| {
            g.stored(generation, result, Instant::now())
        });
    }
    let outcome = match reply {
        Reply::Now(o) => o,
        Reply::Later(rx) => {
            match tokio::time::timeout(crate::group::COMMIT_TIMEOUT * 2 + WAIT_MARGIN, rx).await {
                Ok(Ok(o)) => o,
                _ => return fail(ResponseError::RebalanceInProgress.code()),
            }
        }
    };
    let mut resp = SyncGroupResponse::default()
        .with_error_code(outcome.error)
        .with_assignment(outcome.assignment);
    if version >= 5 {
        resp.protocol_type = outcome.protocol_type.map(s);
        resp.protocol_name = outcome.protocol_name.map(s);
    }
    resp
}

fn heartbeat(broker: &Arc<Broker>, req: HeartbeatRequest) -> HeartbeatResponse {
    let group_id = req.group_id.0.to_string();
    let code = broker
        .groups
        .place(&group_id)
        .and_then(|at| {
            broker.groups.with_group(at, &group_id, false, |g| {
                g.heartbeat(req.member_id.as_str(), req.generation_id, Instant::now())
            })
        })
        .map(|c| c.unwrap_or(ResponseError::UnknownMemberId.code()))
        .unwrap_or_else(|code| code);
    HeartbeatResponse::default().with_error_code(code)
}

fn leave_group(broker: &Arc<Broker>, req: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let group_id = req.group_id.0.to_string();
    let ids: Vec<String> = if version >= 3 {
        req.members
            .iter()
            .map(|m| m.member_id.to_string())
            .collect()
    } else {
        vec![req.member_id.to_string()]
    };
    let placed = broker.groups.place(&group_id).and_then(|at| {
        broker.groups.with_group(at, &group_id, false, |g| {
            ids.iter()
                .map(|id| (id.clone(), g.leave(id, Instant::now())))
                .collect::<Vec<_>>()
        })
    });
    let results = match placed {
        Err(code) => return LeaveGroupResponse::default().with_error_code(code),
        Ok(None) => ids
            .iter()
            .map(|id| (id.clone(), ResponseError::UnknownMemberId.code()))
            .collect(),
        Ok(Some(r)) => r,
    };
    if version >= 3 {
        LeaveGroupResponse::default().with_members(
            results
                .into_iter()
                .map(|(id, code)| {
                    MemberResponse::default()
                        .with_member_id(s(id))
                        .with_error_code(code)
                })
                .collect(),
        )
    } else {
        LeaveGroupResponse::default().with_error_code(results[0].1)
    }
}

async fn offset_commit(broker: &Arc<Broker>, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group_id = req.group_id.0.to_string();
    let member_id = req.member_id.to_string();
    let max_metadata = broker.config.groups.offset_metadata_max_bytes;
    let answer = |codes: &dyn Fn(&str, i32) -> i16| {
        OffsetCommitResponse::default().with_topics(
            req.topics
                .iter()
                .map(|t| {
                    OffsetCommitResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    OffsetCommitResponsePartition::default()
                                        .with_partition_index(p.partition_index)
                                        .with_error_code(codes(t.name.as_str(), p.partition_index))
                                })
                                .collect(),
                        )
                })
                .collect(),
        )
    };
    if group_id.is_empty() {
        return answer(&|_, _| ResponseError::InvalidGroupId.code());
    }
    let at = match broker.groups.place(&group_id) {
        Ok(at) => at,
        Err(code) => return answer(&|_, _| code),
    };
    // Per-partition refusals, as Kafka checks them before appending anything.
    let image = broker.metadata();
    let mut refused: BTreeMap<(String, i32), i16> = BTreeMap::new();
    let mut commits: Vec<(String, i32, CommittedOffset)> = Vec::new();
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    for t in &req.topics {
        let topic = t.name.to_string();
        let known = image.topics.get(&topic);
        for p in &t.partitions {
            let metadata = p
                .committed_metadata
                .as_ref()
                .map(|m| m.to_string())
                .unwrap_or_default();
            let exists =
                known.is_some_and(|k| (0..k.partitions.len() as i32).contains(&p.partition_index));
            let code = if !exists {
                ResponseError::UnknownTopicOrPartition.code()
            } else if metadata.len() > max_metadata {
                ResponseError::OffsetMetadataTooLarge.code()
            } else {
                commits.push((
                    topic.clone(),
                    p.partition_index,
                    CommittedOffset {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata,
                        commit_timestamp: timestamp,
                        log_offset: -1,
                    },
                ));
                continue;
            };
            refused.insert((topic.clone(), p.partition_index), code);
        }
    }
    let generation = req.generation_id_or_member_epoch;
    let checked = broker
        .groups
        .with_group(at, &group_id, generation < 0, |g| {
            g.check_commit(&member_id, generation, Instant::now())
        });
    let group_code = match checked {
        Err(code) => code,
        Ok(None) => ResponseError::IllegalGeneration.code(),
        Ok(Some(code)) => code,
    };
    let result = if group_code != 0 {
        Err(group_code)
    } else if commits.is_empty() {
        Ok(-1)
    } else {
        let entries: Vec<records::Entry> = commits
            .iter()
            .map(|(t, p, o)| records::offset_entry(&group_id, t, *p, o))
            .collect();
        match broker.groups.append(at, &entries) {
            Ok(pending) => GroupCoordinator::acknowledged(pending).await,
            Err(code) => Err(code),
        }
    };
    if let Ok(base_offset) = result {
        // Only what the ISR has is visible to OffsetFetch.
        let _ = broker
            .groups
            .with_group(at, &group_id, true, |g: &mut Group| {
                for (i, (t, p, mut o)) in commits.into_iter().enumerate() {
                    o.log_offset = base_offset + i as i64;
                    g.apply_commit(t, p, o);
                }
            });
    }
    answer(&|t, p| {
        refused
            .get(&(t.to_string(), p))
            .copied()
            .unwrap_or_else(|| result.err().unwrap_or(0))
    })
}

/// Committed offsets by topic, in partition order; `None` where nothing is committed.
type TopicOffsets = Vec<(String, Vec<(i32, Option<CommittedOffset>)>)>;

/// One group's committed offsets for the asked partitions (all of them when `None`).
fn fetch_offsets(
    broker: &Arc<Broker>,
    group_id: &str,
    wanted: Option<Vec<(String, Vec<i32>)>>,
) -> Result<TopicOffsets, i16> {
    let at: Placement = broker.groups.place(group_id)?;
    let offsets = broker
        .groups
        .with_group(at, group_id, false, |g| g.offsets.clone())?
        .unwrap_or_default();
    Ok(match wanted {
        Some(list) => list
            .into_iter()
            .map(|(t, ps)| {
                let found = ps
                    .into_iter()
                    .map(|p| (p, offsets.get(&(t.clone(), p)).cloned()))
                    .collect();
                (t, found)
            })
            .collect(),
        None => {
            let mut by_topic: BTreeMap<String, Vec<(i32, Option<CommittedOffset>)>> =
                BTreeMap::new();
            for ((t, p), o) in offsets {
                by_topic.entry(t).or_default().push((p, Some(o)));
            }
            by_topic.into_iter().collect()
        }
    })
}

fn offset_fetch(
    broker: &Arc<Broker>,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut resp = OffsetFetchResponse::default();
    if version >= 8 {
        for g in &req.groups {
            let wanted = g.topics.as_ref().map(|ts| {
                ts.iter()
                    .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
                    .collect()
            });
            let mut out = OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone());
            match fetch_offsets(broker, g.group_id.as_str(), wanted) {
                Err(code) => out.error_code = code,
                Ok(topics) => {
                    out.topics = topics
                        .into_iter()
                        .map(|(t, ps)| {
                            OffsetFetchResponseTopics::default()
                                .with_name(TopicName(s(t)))
                                .with_partitions(
                                    ps.into_iter()
                                        .map(|(p, o)| {
                                            let o = o.unwrap_or(CommittedOffset {
                                                offset: -1,
                                                leader_epoch: -1,
                                                metadata: String::new(),
                                                commit_timestamp: -1,
                                                log_offset: -1,
                                            });
                                            OffsetFetchResponsePartitions::default()
                                                .with_partition_index(p)
                                                .with_committed_offset(o.offset)
                                                .with_committed_leader_epoch(o.leader_epoch)
                                                .with_metadata(Some(s(o.metadata)))
                                        })
                                        .collect(),
                                )
                        })
                        .collect()
                }
            }
            resp.groups.push(out);
        }
        return resp;
    }
    let wanted: Option<Vec<(String, Vec<i32>)>> = req.topics.as_ref().map(|ts| {
        ts.iter()
            .map(|t| (t.name.to_string(), t.partition_indexes.clone()))
            .collect()
    });
    let partition = |p: i32, o: Option<CommittedOffset>, error: i16| {
        let o = o.unwrap_or(CommittedOffset {
            offset: -1,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp: -1,
            log_offset: -1,
        });
        let mut out = OffsetFetchResponsePartition::default()
            .with_partition_index(p)
            .with_committed_offset(o.offset)
            .with_metadata(Some(s(o.metadata)))
            .with_error_code(error);
        if version >= 5 {
            out.committed_leader_epoch = o.leader_epoch;
        }
        out
    };
    match fetch_offsets(broker, req.group_id.as_str(), wanted.clone()) {
        Ok(topics) => {
            resp.topics = topics
                .into_iter()
                .map(|(t, ps)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(s(t)))
                        .with_partitions(ps.into_iter().map(|(p, o)| partition(p, o, 0)).collect())
                })
                .collect();
        }
        Err(code) => {
            if version >= 2 {
                resp.error_code = code;
            }
            // Before v2 the error can only travel on the partitions.
            resp.topics = wanted
                .unwrap_or_default()
                .into_iter()
                .map(|(t, ps)| {
                    OffsetFetchResponseTopic::default()
                        .with_name(TopicName(s(t)))
                        .with_partitions(ps.into_iter().map(|p| partition(p, None, code)).collect())
                })
                .collect();
        }
    }
    resp
}

fn list_groups(broker: &Arc<Broker>, req: ListGroupsRequest, version: i16) -> ListGroupsResponse {
    let filter: Vec<String> = req
        .states_filter
        .iter()
        .map(|f| f.to_string().to_ascii_lowercase())
        .collect();
    let mut groups = Vec::new();
    let listed = broker.groups.for_each_group(|g| {
        let state = g.state.name();
        if !filter.is_empty() && !filter.contains(&state.to_ascii_lowercase()) {
            return;
        }
        let mut lg = ListedGroup::default()
            .with_group_id(GroupId(s(g.id.clone())))
            .with_protocol_type(s(g.protocol_type.clone().unwrap_or_default()));
        if version >= 4 {
            lg.group_state = s(state);
        }
        groups.push(lg);
    });
    match listed {
        Ok(()) => ListGroupsResponse::default().with_groups(groups),
        Err(code) => ListGroupsResponse::default().with_error_code(code),
    }
}

fn describe_groups(broker: &Arc<Broker>, req: DescribeGroupsRequest) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .iter()
        .map(|id| {
            let group_id = id.0.to_string();
            let base = DescribedGroup::default().with_group_id(id.clone());
            let at = match broker.groups.place(&group_id) {
                Ok(at) => at,
                Err(code) => return base.with_error_code(code),
            };
            let described = broker.groups.with_group(at, &group_id, false, |g| {
                let protocol = g.protocol.clone().unwrap_or_default();
                // Kafka shows member metadata and assignments only once a protocol is chosen.
                let detailed = matches!(
                    g.state,
                    GroupState::Stable | GroupState::CompletingRebalance
                );
                base.clone()
                    .with_group_state(s(g.state.name()))
                    .with_protocol_type(s(g.protocol_type.clone().unwrap_or_default()))
                    .with_protocol_data(s(if detailed {
                        protocol.clone()
                    } else {
                        String::new()
                    }))
                    .with_members(
                        g.members
                            .values()
                            .map(|m| {
                                let mut dm = DescribedGroupMember::default()
                                    .with_member_id(s(m.id.clone()))
                                    .with_client_id(s(m.client_id.clone()))
                                    .with_client_host(s(m.client_host.clone()));
                                if detailed {
                                    dm.member_metadata = m.metadata_for(&protocol);
                                    dm.member_assignment = m.assignment.clone();
                                }
                                dm
                            })
                            .collect(),
                    )
            });
            match described {
                Err(code) => base.with_error_code(code),
                // An unknown group is described as Dead, without an error, as Kafka does.
                Ok(None) => base.with_group_state(s(GroupState::Dead.name())),
                Ok(Some(d)) => d,
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}
