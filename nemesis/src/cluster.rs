//! What the nemeses need to know about the cluster and ask of it: which node leads each
//! partition and which replicas are in sync (from Metadata), and an unclean ElectLeaders. Requests
//! go from the harness's client side, which no grudge cuts, to every node at once; views can be
//! stale on a node that is cut off, so the newest leader epoch of each partition wins.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use anyhow::{bail, Context as _};
use tidemark_harness::kafka::{error_name, ClusterMetadata, Connection, ParseResponseErrorCode};
use tidemark_harness::nemesis::NemesisContext;
use tidemark_harness::runtime::Node;

/// How long one node gets to answer a metadata request; a paused node never does.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// One partition as the freshest view has it, with node names instead of broker ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    /// Topic.
    pub topic: String,
    /// Partition index.
    pub partition: i32,
    /// The leader, if it has one.
    pub leader: Option<String>,
    /// The leader epoch.
    pub leader_epoch: i32,
    /// Replica nodes, in assignment order.
    pub replicas: Vec<String>,
    /// In-sync replica nodes.
    pub isr: Vec<String>,
}

/// Every partition of every topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Sorted by topic, then partition.
    pub partitions: Vec<PartitionView>,
    /// The nodes whose answers the view merges.
    pub answered: BTreeSet<String>,
    /// The active controller (DescribeQuorum, asked of one broker) when it was asked for: a
    /// broker in combined mode, a dedicated controller otherwise; `None` when not asked or no
    /// broker could tell.
    pub controller: Option<String>,
}

impl ClusterView {
    /// Asks every node for metadata at once and merges the answers. Fails when no node answers.
    pub fn read(cx: &NemesisContext<'_>) -> anyhow::Result<Self> {
        let answers = block_on(async {
            let asks = cx.nodes.iter().map(|n| async move {
                let addr = cx.db.endpoint(n);
                let ask = async {
                    let mut c = Connection::connect(cx.client.dialer.clone(), addr, ASK_TIMEOUT)
                        .await
                        .ok()?;
                    c.metadata(None).await.ok()
                };
                (
                    n.id,
                    tokio::time::timeout(ASK_TIMEOUT, ask).await.ok().flatten(),
                )
            });
            futures::future::join_all(asks).await
        });
        let answers: Vec<(u32, ClusterMetadata)> = answers
            .into_iter()
            .filter_map(|(id, m)| m.map(|m| (id, m)))
            .collect();
        if answers.is_empty() {
            bail!("no node answered a metadata request");
        }
        Ok(Self::merge(cx.nodes, &answers))
    }

    /// The freshest view of each partition among `answers` (node id, its metadata): the highest
    /// leader epoch, and at equal epochs the leader's own answer (it knows its ISR best).
    pub fn merge(nodes: &[Node], answers: &[(u32, ClusterMetadata)]) -> Self {
        let name = |id: i32| {
            nodes
                .iter()
                .find(|n| n.id as i32 == id)
                .map(|n| n.name.clone())
        };
        let mut best: BTreeMap<(String, i32), ((i32, bool), PartitionView)> = BTreeMap::new();
        for (from, meta) in answers {
            for (topic, (_, parts)) in &meta.topics {
                for (index, p) in parts {
                    let rank = (p.leader_epoch, p.leader == *from as i32);
                    let view = PartitionView {
                        topic: topic.clone(),
                        partition: *index,
                        leader: (p.leader >= 0).then(|| name(p.leader)).flatten(),
                        leader_epoch: p.leader_epoch,
                        replicas: p.replicas.iter().filter_map(|r| name(*r)).collect(),
                        isr: p.isr.iter().filter_map(|r| name(*r)).collect(),
                    };
                    let key = (topic.clone(), *index);
                    if best.get(&key).is_none_or(|(r, _)| rank > *r) {
                        best.insert(key, (rank, view));
                    }
                }
            }
        }
        ClusterView {
            controller: None,
            partitions: best.into_values().map(|(_, v)| v).collect(),
            answered: answers
                .iter()
                .filter_map(|(id, _)| name(*id as i32))
                .collect(),
        }
    }

    /// Nodes that lead at least one partition.
    pub fn leaders(&self) -> BTreeSet<String> {
        self.partitions
            .iter()
            .filter_map(|p| p.leader.clone())
            .collect()
    }

    /// The leader of every partition that has one, one entry per partition.
    pub fn leader_list(&self) -> Vec<String> {
        self.partitions
            .iter()
            .filter_map(|p| p.leader.clone())
            .collect()
    }

    /// One partition.
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionView> {
        self.partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
    }
}

/// The active controller's node, as the first broker that answers DescribeQuorum names it. Asked
/// only when a fault aims at it: views are read often while faults wait, and a paused broker
/// holds each ask for its whole timeout.
pub fn active_controller(cx: &NemesisContext<'_>) -> Option<String> {
    let leader = block_on(async {
        for n in cx.nodes {
            let ask = async {
                let mut c =
                    Connection::connect(cx.client.dialer.clone(), cx.db.endpoint(n), ASK_TIMEOUT)
                        .await
                        .ok()?;
                c.active_controller().await.ok()
            };
            if let Ok(Some((leader, _))) = tokio::time::timeout(ASK_TIMEOUT, ask).await {
                return Some(leader);
            }
        }
        None
    })?;
    cx.nodes
        .iter()
        .chain(cx.controllers)
        .find(|n| i64::from(n.id) == i64::from(leader))
        .map(|n| n.name.clone())
}

/// Asks `via` for an unclean election of one partition (ElectLeaders, KIP-460).
pub fn elect_unclean(
    cx: &NemesisContext<'_>,
    via: &Node,
    topic: &str,
    partition: i32,
) -> anyhow::Result<()> {
    let addr = cx.db.endpoint(via);
    let (code, message) = block_on(async {
        let mut c = Connection::connect(cx.client.dialer.clone(), addr, cx.client.timeout).await?;
        c.elect_leader(topic, partition, true).await
    })
    .with_context(|| format!("ElectLeaders through {}", via.name))?;
    if code.err().is_some() {
        bail!(
            "ElectLeaders UNCLEAN for {topic}/{partition} through {}: {}{}",
            via.name,
            error_name(code),
            message.map(|m| format!(" ({m})")).unwrap_or_default()
        );
    }
    Ok(())
}

/// Runs async work to completion from a nemesis's blocking thread: on the runner's runtime when
/// there is one, else on a runtime of its own.
pub fn block_on<F: Future>(f: F) -> F::Output {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.block_on(f),
        Err(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime for a nemesis op")
            .block_on(f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;
    use tidemark_harness::kafka::PartitionInfo;
    use tidemark_harness::remote::Local;

    fn node(i: u32) -> Node {
        Node {
            role: tidemark_harness::runtime::NodeRole::Combined,
            name: format!("n{i}"),
            cluster: "a".into(),
            id: i,
            ip: IpAddr::V4(Ipv4Addr::new(10, 211, 0, 10 + i as u8)),
            dir: "/tmp".into(),
            remote: Arc::new(Local::host()),
        }
    }

    fn meta(leader: i32, epoch: i32, isr: &[i32]) -> ClusterMetadata {
        let mut m = ClusterMetadata::default();
        let p = PartitionInfo {
            error_code: 0,
            leader,
            leader_epoch: epoch,
            replicas: vec![1, 2, 3],
            isr: isr.to_vec(),
        };
        m.topics.insert("t".into(), (0, BTreeMap::from([(0, p)])));
        m
    }

    #[test]
    fn the_newest_epoch_wins_and_the_leader_knows_its_isr_best() {
        let nodes = [node(1), node(2), node(3)];
        // n3 is cut off and still believes n1 leads epoch 4; n1 has not heard of the shrink.
        let answers = vec![
            (3, meta(1, 4, &[1, 2, 3])),
            (1, meta(2, 5, &[1, 2, 3])),
            (2, meta(2, 5, &[2, 3])),
        ];
        let v = ClusterView::merge(&nodes, &answers);
        let p = v.partition("t", 0).unwrap();
        assert_eq!(p.leader.as_deref(), Some("n2"));
        assert_eq!(p.leader_epoch, 5);
        assert_eq!(p.isr, vec!["n2".to_string(), "n3".to_string()]);
        assert_eq!(p.replicas.len(), 3);
        assert_eq!(v.leaders(), BTreeSet::from(["n2".to_string()]));
        let none = ClusterView::merge(&nodes, &[(1, meta(-1, 6, &[1]))]);
        assert_eq!(none.partitions[0].leader, None);
        assert!(none.leaders().is_empty());
    }
}
