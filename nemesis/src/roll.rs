//! A rolling restart, as operators upgrade a cluster: one node after another is stopped cleanly
//! (SIGTERM: a Kafka broker's controlled shutdown hands its leaderships over and leaves every
//! ISR), stays down a moment (an upgrade's swap of binaries, a JVM's start), and is started
//! again, and the next goes down only once the restarted one is back in the ISR of every
//! partition it replicates (no under-replicated partitions), or a deadline passed. While it
//! catches up, its replication traffic with the other nodes (to and from the brokers' client
//! listeners, where followers fetch) is capped at a low bandwidth, as on a degraded or throttled
//! link, so that catching up takes seconds instead of one fetch: a broker that lets a replica
//! into the ISR before it has caught up then tells the operator it is safe to take the next node
//! down, and a clean election may hand leadership to the replica that lacks acknowledged records.
//! Kafka's system tests roll brokers the same way (`rolling_bounce`).

use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use rand::RngExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::cluster::ClusterView;
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::loss;
use crate::targets::known_node;

/// The rolling restart fault.
pub struct Roll;

/// Bandwidths (kB/s each way) a restarted node's replication gets until the roll ends, when the
/// op names none: below the few kB/s the workloads write, so that a node restarted under load
/// takes seconds to catch up (at 16 kB/s it was back in sync within half a second).
const CAPS_KBYTES_PER_S: [u32; 3] = [1, 2, 4];

/// How long each node stays down, when the op names no time: long enough for the others to
/// take writes it will have to catch up on.
const DOWN_MS: std::ops::RangeInclusive<u64> = 500..=2000;

/// How long the operator waits for a restarted node to be in sync, when the op names no wait:
/// an uncapped node is back within a second, a capped one under load not before the roll ends
/// (a roll of three nodes then takes 11–15 s).
const DEFAULT_WAIT: Duration = Duration::from_secs(3);

/// How often the operator looks.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// The value of `roll`: the nodes in the order they go down (or how many, from a random one in
/// name order), the bandwidth each gets for replication until the roll ends (0: no cap), how
/// long each stays down, and the longest wait for it to be in sync. A recorded `info` also says how long each took (`in_sync_ms`).
#[derive(Debug, Default, Deserialize)]
struct RollValue {
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(default)]
    count: Option<usize>,
    #[serde(default)]
    kbytes_per_s: Option<u32>,
    #[serde(default)]
    down_ms: Option<u64>,
    #[serde(default)]
    wait_ms: Option<u64>,
}

#[derive(Debug, PartialEq)]
struct RollOp {
    order: Option<Vec<String>>,
    count: usize,
    kbytes_per_s: Option<u32>,
    down_ms: Option<u64>,
    wait: Duration,
}

impl RollOp {
    fn parse(value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: RollValue = parse(value)?;
        if let Some(order) = &v.nodes {
            for (i, n) in order.iter().enumerate() {
                known_node(n, nodes, &format!("nodes[{i}]"))?;
            }
        }
        if v.count == Some(0) {
            return Err("field `count`: must be at least 1".into());
        }
        Ok(RollOp {
            count: v
                .nodes
                .as_ref()
                .map_or(v.count.unwrap_or(nodes.len()), Vec::len),
            order: v.nodes,
            kbytes_per_s: v.kbytes_per_s,
            down_ms: v.down_ms,
            wait: v.wait_ms.map_or(DEFAULT_WAIT, Duration::from_millis),
        })
    }
}

/// `count` nodes of `names` in order, starting at `first` and wrapping around.
fn rotation(names: &[String], first: usize, count: usize) -> Vec<String> {
    names
        .iter()
        .cycle()
        .skip(first)
        .take(count.min(names.len()))
        .cloned()
        .collect()
}

/// Whether `node` answers and is in the ISR of every partition it replicates, in `view`.
fn in_sync(view: &ClusterView, node: &str) -> bool {
    view.answered.contains(node)
        && view
            .partitions
            .iter()
            .filter(|p| p.replicas.iter().any(|r| r == node))
            .all(|p| p.isr.iter().any(|r| r == node))
}

impl FaultOp for RollOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let kill = env.kill()?;
        let order = match self.order {
            Some(order) => order,
            None => {
                let names = env.names();
                let first = env.rng.random_range(0..names.len().max(1));
                rotation(&names, first, self.count)
            }
        };
        let cap = match self.kbytes_per_s {
            Some(c) => c,
            None => *CAPS_KBYTES_PER_S.choose(env.rng).expect("non-empty"),
        };
        // Only where followers fetch: a restarted node stays registered and unfenced.
        let ports = env.listener_ports();
        let mut errors = Vec::new();
        let mut restarted = Vec::new();
        let down = Duration::from_millis(match self.down_ms {
            Some(ms) => ms,
            None => env.rng.random_range(DOWN_MS),
        });
        let nodes = order
            .iter()
            .map(|name| env.node(name))
            .collect::<Result<Vec<_>, _>>()?;
        let mut capped = Vec::new();
        for node in nodes {
            let name = &node.name;
            // The leaderships the node hands over as it stops: a roll is a leader failover for
            // each of them.
            let led: Option<Vec<String>> = ClusterView::read(env.cx).ok().map(|v| {
                v.partitions
                    .iter()
                    .filter(|p| p.leader.as_deref() == Some(name.as_str()))
                    .map(|p| format!("{}/{}", p.topic, p.partition))
                    .collect()
            });
            if let Err(e) = env.cx.db.stop(node) {
                errors.push(format!("{name}: {e:#}"));
                break;
            }
            if cap > 0 {
                match loss::cap_on_ports(node, &env.peers_of(name), &ports, cap) {
                    Ok(()) => capped.push(node),
                    Err(e) => errors.push(format!("{name}: bandwidth cap: {e:#}")),
                }
            }
            std::thread::sleep(down);
            if let Err(e) = kill.start(node) {
                errors.push(format!("{name}: {e:#}"));
                break;
            }
            let started = Instant::now();
            let mut in_sync_after = None;
            while started.elapsed() < self.wait {
                if ClusterView::read(env.cx).is_ok_and(|v| in_sync(&v, name)) {
                    in_sync_after = Some(started.elapsed());
                    break;
                }
                std::thread::sleep(LOOK_EVERY);
            }
            restarted.push(json!({
                "node": name,
                "led": led,
                "in_sync_ms": in_sync_after.map(|d| d.as_millis() as u64),
            }));
        }
        for node in capped {
            if let Err(e) = loss::lift(node, &env.peers_of(&node.name)) {
                errors.push(format!("{}: lifting the bandwidth cap: {e:#}", node.name));
            }
        }
        let done: Vec<&Value> = restarted.iter().map(|r| &r["node"]).collect();
        let record = json!({
            "nodes": done,
            "kbytes_per_s": cap,
            "down_ms": down.as_millis() as u64,
            "wait_ms": self.wait.as_millis() as u64,
            "restarted": restarted,
        });
        Failed::partly(record, &errors)
    }
}

impl Fault for Roll {
    fn fs(&self) -> &'static [&'static str] {
        &["roll"]
    }

    fn parse<'a>(
        &'a self,
        _f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(RollOp::parse(value, nodes)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::PartitionView;

    fn names() -> Vec<String> {
        ["n1", "n2", "n3"].map(String::from).to_vec()
    }

    #[test]
    fn a_recorded_roll_restarts_the_same_nodes_in_the_same_order() {
        let recorded = json!({"nodes": ["n3", "n1"], "kbytes_per_s": 32, "down_ms": 1500,
                              "wait_ms": 4000,
                              "restarted": [{"node": "n3", "led": ["t0/1"], "in_sync_ms": 900},
                                            {"node": "n1", "led": null, "in_sync_ms": null}]});
        assert_eq!(
            RollOp::parse(&recorded, &names()),
            Ok(RollOp {
                order: Some(vec!["n3".into(), "n1".into()]),
                count: 2,
                kbytes_per_s: Some(32),
                down_ms: Some(1500),
                wait: Duration::from_millis(4000),
            })
        );
        assert_eq!(
            RollOp::parse(&json!({}), &names()).map(|r| (r.count, r.wait)),
            Ok((3, DEFAULT_WAIT))
        );
    }

    #[test]
    fn bad_values_name_their_field() {
        let e = RollOp::parse(&json!({"nodes": ["n1", "n9"]}), &names()).unwrap_err();
        assert!(e.contains("`nodes[1]`"), "{e}");
        let e = RollOp::parse(&json!({"count": 0}), &names()).unwrap_err();
        assert!(e.contains("`count`"), "{e}");
        let e = RollOp::parse(&json!({"kbytes_per_s": -1}), &names()).unwrap_err();
        assert!(e.contains("kbytes_per_s"), "{e}");
        let e = RollOp::parse(&json!({"wait_ms": "soon"}), &names()).unwrap_err();
        assert!(e.contains("wait_ms"), "{e}");
    }

    #[test]
    fn a_roll_goes_round_from_its_first_node() {
        assert_eq!(rotation(&names(), 2, 2), vec!["n3", "n1"]);
        assert_eq!(rotation(&names(), 1, 5), vec!["n2", "n3", "n1"]);
    }

    #[test]
    fn a_node_is_in_sync_when_it_answers_and_every_isr_it_belongs_in_holds_it() {
        let p = |index: i32, replicas: &[&str], isr: &[&str]| PartitionView {
            topic: "t".into(),
            partition: index,
            leader: Some("n1".into()),
            leader_epoch: 3,
            replicas: replicas.iter().map(|r| r.to_string()).collect(),
            isr: isr.iter().map(|r| r.to_string()).collect(),
        };
        let view = |answered: &[&str], parts: Vec<PartitionView>| ClusterView {
            partitions: parts,
            answered: answered.iter().map(|a| a.to_string()).collect(),
            controller: None,
        };
        let all = ["n1", "n2", "n3"];
        let caught_up = view(
            &all,
            vec![p(0, &all, &all), p(1, &["n1", "n3"], &["n1", "n3"])],
        );
        assert!(in_sync(&caught_up, "n2"));
        let lagging = view(
            &all,
            vec![
                p(0, &all, &["n1", "n3"]),
                p(1, &["n1", "n3"], &["n1", "n3"]),
            ],
        );
        assert!(!in_sync(&lagging, "n2"));
        assert!(in_sync(&lagging, "n3"));
        // A node that does not answer yet is not back, whatever the others' view says.
        let silent = view(&["n1", "n3"], vec![p(0, &all, &all)]);
        assert!(!in_sync(&silent, "n2"));
    }
}
