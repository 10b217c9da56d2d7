//! Waiting for a database: until every node serves, and until its replicas agree. The waiting
//! (deadlines, cancellation, giving up early on a node whose process died) is here and the same
//! for every database; the questions themselves are the database's [`Probe`] ability. The
//! Kafka-wire answers ([`kafka_serves`], [`kafka_converged`]) are here too, for databases that
//! speak Kafka.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::client::{ClientContext, NodeAddr};
use crate::collect::log_tail;
use crate::db::{
    Db, DumpedReplica, OutOfIsr, PartitionRef, Probe, ReplicaDump, StuckHighWatermark, Unconverged,
};
use crate::kafka::{is_internal_topic, ClusterMetadata, Connection};
use crate::runtime::Node;

/// The longest one readiness question may take.
const ASK_AT_MOST: Duration = Duration::from_secs(2);

/// The pause between two readiness questions to a node.
const READY_EVERY: Duration = Duration::from_millis(100);

/// The pause between two convergence questions.
const CONVERGED_EVERY: Duration = Duration::from_millis(500);

/// How long after the convergence wait gives up it asks once more, before reporting a partition
/// without a leader or a replica left out of the ISR.
const CONFIRM_AFTER: Duration = Duration::from_secs(2);

/// Waits until every node answers a Kafka ApiVersions request.
pub async fn await_ready(
    cx: &ClientContext,
    timeout: Duration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    struct Kafka;
    impl Probe for Kafka {
        fn serves<'a>(
            &'a self,
            cx: &'a ClientContext,
            node: &'a NodeAddr,
        ) -> BoxFuture<'a, anyhow::Result<()>> {
            Box::pin(kafka_serves(cx, node))
        }

        fn converged<'a>(
            &'a self,
            _: &'a ClientContext,
            _: &'a [Node],
        ) -> BoxFuture<'a, Result<(), Unconverged>> {
            Box::pin(async { Ok(()) })
        }
    }
    await_nodes(cx, &Kafka, None, timeout, cancel).await
}

/// Waits until every node serves, by the database's [`Probe`] (at once when it has none); gives
/// up early on a node whose process died, and says why with the end of its log.
pub async fn await_serving(
    cx: &ClientContext,
    nodes: &[Node],
    db: &dyn Db,
    timeout: Duration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    match db.as_probe() {
        Some(probe) => await_nodes(cx, probe, Some((nodes, db)), timeout, cancel).await,
        None => Ok(()),
    }
}

async fn await_nodes(
    cx: &ClientContext,
    probe: &dyn Probe,
    watch: Option<(&[Node], &dyn Db)>,
    timeout: Duration,
    cancel: &CancellationToken,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    for (i, node) in cx.nodes.iter().enumerate() {
        for attempt in 0u32.. {
            if attempt % 10 == 9 {
                if let Some((nodes, db)) = watch {
                    let n = &nodes[i];
                    let dead = db
                        .as_kill()
                        .map(|k| tokio::task::block_in_place(|| k.is_running(n)))
                        .is_some_and(|r| matches!(r, Ok(false)));
                    if dead {
                        let tail = tokio::task::block_in_place(|| log_tail(n, db));
                        bail!("the broker on {} exited instead of serving{tail}", n.name);
                    }
                }
            }
            let answer = tokio::time::timeout(ASK_AT_MOST.min(timeout), probe.serves(cx, node))
                .await
                .unwrap_or_else(|_| Err(anyhow::anyhow!("no answer within {ASK_AT_MOST:?}")));
            match answer {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    let tail = watch
                        .map(|(nodes, db)| tokio::task::block_in_place(|| log_tail(&nodes[i], db)))
                        .unwrap_or_default();
                    bail!(
                        "{} ({}) did not serve within {timeout:?}: {e:#}{tail}",
                        node.name,
                        node.addr
                    )
                }
                Err(_) => {}
            }
            if cancel.is_cancelled() {
                bail!("cancelled while waiting for {}", node.name);
            }
            tokio::time::sleep(READY_EVERY).await;
        }
    }
    Ok(())
}

/// Waits until the database's [`Probe`] says its replicas agree, or `timeout` passes. Returns
/// what the last question found unconverged, if anything (Ok at once when the database has no
/// probe). A partition without a leader, a caught-up replica outside the ISR, or a high
/// watermark below the log end every replica holds, is reported only when a second question
/// [`CONFIRM_AFTER`] later finds it so again: the answering broker's metadata may trail an
/// election or an ISR change that had just happened, and a leader moves its high watermark on its
/// followers' next fetches (and checkpoints it, where the dumps read it, twice a second).
pub async fn await_convergence(
    cx: &ClientContext,
    nodes: &[Node],
    db: &dyn Db,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Result<(), Unconverged> {
    let Some(probe) = db.as_probe() else {
        return Ok(());
    };
    let deadline = Instant::now() + timeout;
    let first = loop {
        let answer = probe.converged(cx, nodes).await;
        if answer.is_ok() || Instant::now() >= deadline || cancel.is_cancelled() {
            break answer;
        }
        tokio::time::sleep(CONVERGED_EVERY).await;
    };
    let Err(first) = first else { return Ok(()) };
    let judged = |u: &Unconverged| {
        !(u.leaderless.is_empty() && u.out_of_isr.is_empty() && u.stuck_high_watermarks.is_empty())
    };
    if !judged(&first) || cancel.is_cancelled() {
        return Err(first);
    }
    tokio::time::sleep(CONFIRM_AFTER).await;
    let Err(mut again) = probe.converged(cx, nodes).await else {
        return Ok(());
    };
    again.leaderless.retain(|p| first.leaderless.contains(p));
    again.out_of_isr.retain(|r| {
        first
            .out_of_isr
            .iter()
            .any(|f| (&f.topic, f.partition, &f.node) == (&r.topic, r.partition, &r.node))
    });
    again.stuck_high_watermarks.retain(|s| {
        first
            .stuck_high_watermarks
            .iter()
            .any(|f| (&f.topic, f.partition) == (&s.topic, s.partition))
    });
    Err(again)
}

/// Whether `node` answers ApiVersions (a connection negotiates versions first).
pub async fn kafka_serves(cx: &ClientContext, node: &NodeAddr) -> anyhow::Result<()> {
    Connection::connect(cx.dialer.clone(), node.addr, cx.timeout).await?;
    Ok(())
}

/// Whether, for every partition of the workload's topics Metadata (from the first node that
/// answers) lists, every replica in `dumper`'s dumps of `nodes` has the same log end offset and a
/// high watermark equal to it, and is in the ISR; see [`converged`].
pub async fn kafka_converged(
    cx: &ClientContext,
    nodes: &[Node],
    dumper: &dyn ReplicaDump,
) -> Result<(), Unconverged> {
    let Some(meta) = any_metadata(cx).await else {
        return Err(Unconverged {
            reasons: vec!["no node answered Metadata".into()],
            ..Unconverged::default()
        });
    };
    let dumps: Vec<DumpedReplica> = tokio::task::block_in_place(|| {
        nodes
            .iter()
            .flat_map(|n| dumper.dump_replicas(n).unwrap_or_default())
            .collect()
    });
    converged(&meta, cx, &dumps)
}

/// Metadata from the first node that answers.
async fn any_metadata(cx: &ClientContext) -> Option<ClusterMetadata> {
    for node in &cx.nodes {
        if let Ok(mut c) = Connection::connect(cx.dialer.clone(), node.addr, cx.timeout).await {
            if let Ok(m) = c.metadata(None).await {
                return Some(m);
            }
        }
    }
    None
}

/// Whether the replicas in `dumps` agree for every partition in `meta`: a leader, every replica
/// ending at its high watermark at the same offset, and every replica in the ISR. Else what did
/// not, with the replicas that held all their leader held and were still left out of the ISR,
/// and the high watermarks below the log end every replica in the ISR held, apart.
pub fn converged(
    meta: &ClusterMetadata,
    cx: &ClientContext,
    dumps: &[DumpedReplica],
) -> Result<(), Unconverged> {
    let mut out = Unconverged::default();
    let name = |id: i32| {
        cx.node_by_id(id)
            .map_or(format!("broker {id}"), |n| n.name.clone())
    };
    // Replica dumps leave internal topics out: only the workload's are judged.
    let topics = meta.topics.iter().filter(|(t, _)| !is_internal_topic(t));
    for (topic, (_, parts)) in topics {
        for (partition, info) in parts {
            let place = format!("{topic}/{partition}");
            if info.leader < 0 {
                out.leaderless.push(PartitionRef {
                    topic: topic.clone(),
                    partition: *partition,
                });
                continue;
            }
            // Each replica's (high watermark, log end), when its dump has both.
            let mut ends = BTreeMap::new();
            for id in &info.replicas {
                let row = cx.node_by_id(*id).and_then(|node| {
                    dumps.iter().map(|r| &r.state).find(|r| {
                        r.node == node.name
                            && r.topic == *topic
                            && r.partition == i64::from(*partition)
                    })
                });
                match row.and_then(|r| r.high_watermark.zip(r.log_end_offset)) {
                    Some(hw_leo) => {
                        ends.insert(*id, hw_leo);
                    }
                    None => out.reasons.push(format!(
                        "{place} on {}: no dump with both offsets",
                        name(*id)
                    )),
                }
            }
            let Some(&(leader_hw, leader_end)) = ends.get(&info.leader) else {
                continue;
            };
            // Every replica in the ISR at the leader's log end: Kafka's leader moves its high
            // watermark to the smallest log end of the ISR on their next fetches.
            let whole = ends.len() == info.replicas.len()
                && ends
                    .iter()
                    .all(|(id, &(_, leo))| leo == leader_end && info.isr.contains(id));
            if whole && leader_hw < leader_end {
                out.stuck_high_watermarks.push(StuckHighWatermark {
                    topic: topic.clone(),
                    partition: *partition,
                    leader: name(info.leader),
                    high_watermark: leader_hw,
                    log_end_offset: leader_end,
                });
            }
            for (&id, &(hw, leo)) in &ends {
                if (hw, leo) != (leader_end, leader_end) {
                    out.reasons.push(format!(
                        "{place} on {}: high watermark {hw}, log end {leo}; leader {} at {leader_hw}, {leader_end}",
                        name(id),
                        name(info.leader)
                    ));
                }
                // Holding all its leader holds, it reached the high watermark: Kafka lets such a
                // follower into the ISR on its next fetch.
                if leo == leader_end && !info.isr.contains(&id) {
                    out.out_of_isr.push(OutOfIsr {
                        topic: topic.clone(),
                        partition: *partition,
                        node: name(id),
                        leader: name(info.leader),
                        isr: info.isr.iter().map(|&i| name(i)).collect(),
                        log_end_offset: leo,
                    });
                }
            }
        }
    }
    if out.reasons.is_empty()
        && out.leaderless.is_empty()
        && out.out_of_isr.is_empty()
        && out.stuck_high_watermarks.is_empty()
    {
        Ok(())
    } else {
        Err(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::dial::Direct;
    use crate::kafka::PartitionInfo;

    fn cx() -> ClientContext {
        ClientContext {
            cluster: "a".into(),
            nodes: (1..=2)
                .map(|i| NodeAddr {
                    name: format!("n{i}"),
                    cluster: "a".into(),
                    id: i,
                    addr: ([127, 0, 0, 1], 9000 + i as u16).into(),
                })
                .collect(),
            dialer: Arc::new(Direct),
            timeout: Duration::from_secs(1),
        }
    }

    fn meta(leader: i32) -> ClusterMetadata {
        let p = PartitionInfo {
            error_code: 0,
            leader,
            leader_epoch: 1,
            replicas: vec![1, 2],
            isr: vec![1, 2],
        };
        let mut m = ClusterMetadata::default();
        m.topics.insert("t".into(), (0, BTreeMap::from([(0, p)])));
        m
    }

    fn replica(node: &str, hw: i64, leo: i64) -> DumpedReplica {
        let mut r = DumpedReplica::unreadable("a", node, "t", 0, String::new());
        r.state.error = None;
        r.state.high_watermark = Some(hw);
        r.state.log_end_offset = Some(leo);
        r
    }

    #[test]
    fn replicas_converge_when_every_listed_replica_ends_at_its_high_watermark_alike_in_the_isr() {
        let cx = cx();
        let ok = |m: &ClusterMetadata, d: &[DumpedReplica]| converged(m, &cx, d).is_ok();
        assert!(ok(&meta(1), &[replica("n1", 5, 5), replica("n2", 5, 5)]));
        // A follower behind, a high watermark short of the log end, a missing replica, no
        // leader: not yet, and not for want of the ISR.
        for (m, d) in [
            (meta(1), vec![replica("n1", 5, 5), replica("n2", 4, 4)]),
            (meta(1), vec![replica("n1", 4, 5), replica("n2", 4, 5)]),
            (meta(1), vec![replica("n1", 5, 5)]),
            (meta(-1), vec![replica("n1", 5, 5), replica("n2", 5, 5)]),
        ] {
            let not = converged(&m, &cx, &d).unwrap_err();
            let said = not.reasons.len() + not.leaderless.len();
            assert!(said > 0 && not.out_of_isr.is_empty(), "{not:?}");
        }
        let not = converged(&meta(-1), &cx, &[]).unwrap_err();
        assert_eq!(
            not.leaderless,
            vec![PartitionRef {
                topic: "t".into(),
                partition: 0
            }]
        );
        // An internal topic, which replica dumps leave out, is not waited for.
        let mut m = meta(1);
        let internal = m.topics["t"].clone();
        m.topics.insert("__consumer_offsets".into(), internal);
        assert!(ok(&m, &[replica("n1", 5, 5), replica("n2", 5, 5)]));
        // Caught up, and left out of the ISR.
        let mut m = meta(1);
        m.topics.get_mut("t").unwrap().1.get_mut(&0).unwrap().isr = vec![1];
        let not = converged(&m, &cx, &[replica("n1", 5, 5), replica("n2", 5, 5)]).unwrap_err();
        assert!(not.reasons.is_empty(), "{not:?}");
        assert_eq!(
            not.out_of_isr,
            vec![OutOfIsr {
                topic: "t".into(),
                partition: 0,
                node: "n2".into(),
                leader: "n1".into(),
                isr: vec!["n1".into()],
                log_end_offset: 5,
            }]
        );
        // A leader whose high watermark is stuck below the log end every replica holds: the
        // replica out of the ISR holds all the leader does, and is held out; with it out, the
        // ISR is not the whole partition, so the high watermark is not judged.
        let not = converged(&m, &cx, &[replica("n1", 3, 5), replica("n2", 3, 5)]).unwrap_err();
        assert_eq!(not.out_of_isr.len(), 1, "{not:?}");
        assert_eq!(not.out_of_isr[0].node, "n2");
        assert!(not.stuck_high_watermarks.is_empty(), "{not:?}");
        // The same with both in the ISR: the leader's high watermark is stuck.
        let not =
            converged(&meta(1), &cx, &[replica("n1", 3, 5), replica("n2", 3, 5)]).unwrap_err();
        assert!(not.out_of_isr.is_empty(), "{not:?}");
        assert_eq!(
            not.stuck_high_watermarks,
            vec![StuckHighWatermark {
                topic: "t".into(),
                partition: 0,
                leader: "n1".into(),
                high_watermark: 3,
                log_end_offset: 5,
            }]
        );
        // Only the leader's counts: a follower's trails it by a fetch.
        assert!(
            converged(&meta(1), &cx, &[replica("n1", 5, 5), replica("n2", 3, 5)])
                .unwrap_err()
                .stuck_high_watermarks
                .is_empty()
        );
        // Behind and out of the ISR: still catching up, not held out.
        let not = converged(&m, &cx, &[replica("n1", 5, 5), replica("n2", 3, 3)]).unwrap_err();
        assert!(
            not.out_of_isr.is_empty() && not.reasons.len() == 1,
            "{not:?}"
        );
    }
}
