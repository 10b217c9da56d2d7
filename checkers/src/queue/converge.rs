//! `under-replicated`: once every fault was healed and the replicas had the convergence period to
//! agree, a replica that had caught up with its leader was still outside the partition's ISR.
//! A follower at its leader's log end is let back in on its next fetch (Kafka's
//! `maybeExpandIsr`), so one kept out for the whole period is a broker that lost track of it (a
//! fetcher that died, a broker the controller never unfenced): the partition runs with fewer
//! copies than its replication factor and one failure from unavailable, though nothing was lost.
//! `offline-partition`: a partition still without a leader then. With every node up and every
//! fault healed, a correct controller elects one: from the ISR, else the eligible replicas, else
//! the last leader once it is back (KIP-966); only a replica whose log directory was lost (a
//! `wipe`) may leave none to elect. `stuck-high-watermark`: a partition whose every replica was
//! in the ISR and held all its leader held, under a leader's high watermark still below that log
//! end. A leader moves its high watermark to the smallest log end of its ISR as their fetches
//! report them (Kafka's `maybeIncrementLeaderHW`), so the records above it were written
//! everywhere and never committed: no reader sees them and no acks=all send of them is answered.
//! Read from the runner's `converge` op, the last of each cluster.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::json;

use crate::policy::NodeLoss;
use crate::results::{Anomalies, AnomalyKind};

/// A `converge` op's completion value (`docs/history-format.md`).
#[derive(Debug, Deserialize)]
pub(crate) struct ConvergeBody {
    #[serde(default)]
    converged: Option<bool>,
    #[serde(default)]
    leaderless: Vec<PartitionRef>,
    #[serde(default)]
    out_of_isr: Vec<OutOfIsr>,
    #[serde(default)]
    stuck_high_watermarks: Vec<StuckHighWatermark>,
}

/// A leader's high watermark below the log end every replica of its partition, all in the ISR,
/// held, as the runner found it.
#[derive(Debug, Clone, Deserialize)]
struct StuckHighWatermark {
    topic: String,
    partition: i64,
    leader: String,
    high_watermark: i64,
    log_end_offset: i64,
}

/// A partition the runner found without a leader.
#[derive(Debug, Clone, Deserialize)]
struct PartitionRef {
    topic: String,
    partition: i64,
}

/// One replica caught up and left out of its partition's ISR, as the runner found it.
#[derive(Debug, Clone, Deserialize)]
struct OutOfIsr {
    topic: String,
    partition: i64,
    node: String,
    leader: String,
    isr: Vec<String>,
    log_end_offset: i64,
}

/// Each cluster's last `converge` completion: its op index and what it found.
#[derive(Debug, Default)]
pub(crate) struct Convergence {
    last: BTreeMap<String, (u64, ConvergeBody)>,
}

impl Convergence {
    /// Takes in a `converge` op's completion of `cluster`; a later one replaces it.
    pub fn observe(&mut self, index: u64, cluster: &str, body: ConvergeBody) {
        self.last.insert(cluster.to_owned(), (index, body));
    }

    /// One `under-replicated` entry per replica the last `converge` op of its cluster found
    /// caught up and outside the ISR, one `stuck-high-watermark` entry per partition whose
    /// leader's high watermark it found below the log end of a whole ISR, and one
    /// `offline-partition` entry per partition it found without a leader (allowed in a cluster
    /// where a wipe lost a log directory: `disk_losses`).
    pub fn check(&self, disk_losses: &[NodeLoss], anomalies: &mut Anomalies) {
        for (cluster, (index, body)) in &self.last {
            if body.converged == Some(true) {
                continue;
            }
            for r in &body.out_of_isr {
                anomalies.push(
                    AnomalyKind::UnderReplicated,
                    json!({
                        "cluster": cluster, "topic": r.topic, "partition": r.partition,
                        "node": r.node, "leader": r.leader, "isr": r.isr,
                        "log_end_offset": r.log_end_offset, "op_index": index,
                    }),
                );
            }
            for p in &body.stuck_high_watermarks {
                anomalies.push(
                    AnomalyKind::StuckHighWatermark,
                    json!({
                        "cluster": cluster, "topic": p.topic, "partition": p.partition,
                        "leader": p.leader, "high_watermark": p.high_watermark,
                        "log_end_offset": p.log_end_offset, "op_index": index,
                    }),
                );
            }
            let wiped = disk_losses.iter().find(|l| l.cluster == *cluster);
            for p in &body.leaderless {
                let excuse = wiped.map(|l| {
                    format!(
                        "a {} (op {}) lost the log directory of {}: nothing may be left to elect",
                        l.fault,
                        l.index,
                        l.nodes.iter().cloned().collect::<Vec<_>>().join(", ")
                    )
                });
                anomalies.push_judged(
                    AnomalyKind::OfflinePartition,
                    json!({
                        "cluster": cluster, "topic": p.topic, "partition": p.partition,
                        "op_index": index,
                    }),
                    excuse,
                );
            }
        }
    }
}
