//! The broker side of the mirror admin APIs: create, start, stop, pause, resume, describe (with
//! the LMLE lookups of another cluster), delete and recover, each a change through the
//! controller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tracing::info;

use super::client::{call, connect_any, metadata};
use super::context::MirrorContext;
use super::group_filter::GroupFilter;
use super::rules::{lookup_lmle, MirrorState};
use super::store::read_lmle;
use super::wire::{
    decode_body, MirrorApi, MirrorDescription, MirrorRequest, MirrorResponse, PartitionDescription,
    TopicDescription, TopicResult,
};
use crate::controller::ControllerCommand;
use crate::errors::{self, ApiError};
use crate::metadata::{MetadataImage, MirrorRegistration};

/// How long a stop waits for its partitions to become writable before answering.
const STOP_WAIT: Duration = Duration::from_secs(30);

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
            configs,
        } => {
            let groups = GroupFilter::from_configs(&configs)
                .map_err(|m| ApiError::new(errors::INVALID_CONFIG, m))?;
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
                        groups,
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
            // Every topic starts stopping before any is waited for, and all wait until one
            // deadline: a topic whose leader is down must not hold the others' failover back.
            let mut begun = Vec::with_capacity(topics.len());
            for topic in topics {
                let outcome = begin_stop(ctx, &mirror, &topic).await;
                begun.push((topic, outcome));
            }
            let deadline = tokio::time::Instant::now() + STOP_WAIT;
            for (topic, outcome) in begun {
                let outcome = match outcome {
                    Ok(()) => wait_stopped(ctx, &topic, deadline).await,
                    Err(e) => Err(e),
                };
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
        // The source's replication factor, or every broker of a smaller cluster; counted among
        // those registered, as for the LMLE topic, so brokers down now do not shrink the topic
        // for good.
        let registered = image.brokers.len().max(1);
        ControllerCommand::CreateTopic {
            name: topic.to_string(),
            id,
            partitions,
            replication_factor: rf.min(registered as i16),
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

/// Whether every partition of `topic` is STOPPED in `image`.
fn all_stopped(image: &MetadataImage, topic: &str) -> bool {
    image
        .topics
        .get(topic)
        .and_then(|t| t.mirror.as_ref())
        .is_some_and(|m| m.partitions.iter().all(|p| p.state == MirrorState::Stopped))
}

/// Failover of one topic begins: every partition not yet STOPPED moves to STOPPING, where its
/// leader persists the LMLE, bumps the epoch and writes the barrier.
async fn begin_stop(ctx: &MirrorContext, mirror: &str, topic: &str) -> Result<(), ApiError> {
    if all_stopped(&ctx.metadata(), topic) {
        return Ok(());
    }
    set_states(ctx, mirror, topic, MirrorState::Stopping).await
}

/// Waits until every partition of `topic` is STOPPED, so the topic is writable, or `deadline`.
async fn wait_stopped(
    ctx: &MirrorContext,
    topic: &str,
    deadline: tokio::time::Instant,
) -> Result<(), ApiError> {
    let mut rx = ctx.images();
    let waited = tokio::time::timeout_at(deadline, rx.wait_for(|i| all_stopped(i, topic)))
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
                            let destination_offset =
                                local.as_ref().map_or(-1, |p| p.log_end_offset());
                            let barrier_offset = local
                                .as_ref()
                                .filter(|_| pm.state == MirrorState::Stopped)
                                .and_then(|p| {
                                    p.failover_barrier(&m.source_cluster_id).ok().flatten()
                                })
                                .map(|(offset, _)| offset);
                            let source_offset =
                                status.as_ref().map_or(-1, |s| s.source_high_watermark);
                            PartitionDescription {
                                partition: index,
                                leader,
                                leader_epoch: t.partitions[i].leader_epoch,
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
                                barrier_offset,
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
