//! `last-stand`: Kafka's eligible leader replicas system test (KIP-966) as a move. A partition's
//! in-sync followers leave one after another, each by a clean stop, a crash or a cut from the
//! other brokers' listeners (a follower that fetches nothing drops out of the ISR while its
//! process runs), with clients writing between, until the leader stands alone in its ISR; then
//! the leader is killed and the followers come back. Each departure changes what the controller
//! may do next: a follower dropped while the ISR still met `min.insync.replicas` lacks what was
//! acknowledged after it and must never lead; the one whose leaving took the ISR below the
//! minimum is an eligible leader replica (unless it crashed: a replica back from an unclean
//! shutdown is not), and the leader alone may acknowledge nothing (the strict min ISR rule). So
//! when the leader dies, an election that takes the wrong replica, or a leader that took writes
//! alone, loses acknowledged records.
//!
//! A follower leaves by a process stop only while the controller quorum keeps a majority
//! running without it (always, with dedicated controllers; on three combined nodes, one of the
//! two followers), since the ISR can shrink only through the controller. Where the data sits on
//! tidemark-powerfs a crash may be a power loss: the follower comes back without what it had
//! not fsynced, and an unclean shutdown must take it out of the eligible replicas, or it leads
//! without records it was counted for. The leader stays down until the package's `start`, as
//! after a kill.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use rand::seq::{IndexedRandom, SliceRandom};
use rand::RngExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::cluster::ClusterView;
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::process::{
    hold_until_out_of_isr, lift_caps, partition_and_leader, partition_of, wait_for_election_within,
};
use crate::targets::known_node;

/// The `last-stand` fault.
pub struct LastStand;

/// How long a last stand waits for the next leader once its leader is dead and its followers are
/// back: an eligible replica cut off is elected once the controller fences the leader (3 s
/// here), one stopped once it has restarted too; the verdict reads a replica not elected within
/// it as passed over, so it leaves room for a loaded machine.
const ELECTION_WAIT: Duration = Duration::from_secs(20);

/// How a follower leaves its leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Leaving {
    /// A clean stop (SIGTERM and the broker's controlled shutdown).
    Stop,
    /// SIGKILL: the broker comes back from an unclean shutdown.
    Crash,
    /// A power loss of its node (the database's `PowerLoss`: what was not fsynced is dropped):
    /// back from an unclean shutdown with less than it acknowledged to its leader.
    PowerLoss,
    /// Cut from every other broker on the brokers' listeners, where followers fetch; it keeps
    /// heartbeating to the controllers.
    Cut,
}

impl Leaving {
    fn stops_the_process(self) -> bool {
        self != Leaving::Cut
    }

    /// Back from this, a replica is no eligible leader replica (KIP-966).
    fn is_unclean(self) -> bool {
        matches!(self, Leaving::Crash | Leaving::PowerLoss)
    }
}

/// One follower's departure, as the `info` records it; a recorded one holds as long again on
/// replay.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
struct Departure {
    node: String,
    how: Leaving,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    held_ms: Option<u64>,
    /// A power loss's tearing seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    /// A power loss's report of what its node dropped (recorded only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dropped: Option<Value>,
    /// The partition's ISR as read once it had gone (recorded only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    isr: Option<Vec<String>>,
}

/// The value of `last-stand`: a partition (or one chosen when performed), optionally how its
/// followers leave, in order (the rest drawn), and in a recorded `info` the leader it killed
/// and the followers' departures, in order.
#[derive(Debug, Default, Deserialize)]
struct LastStandValue {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    how: Option<Vec<Leaving>>,
    #[serde(default)]
    killed: Option<String>,
    #[serde(default)]
    left: Option<Vec<Departure>>,
}

/// A parsed `last-stand`.
#[derive(Debug, Default, PartialEq)]
struct LastStandOp {
    at: Option<(String, i32)>,
    how: Vec<Leaving>,
    killed: Option<String>,
    left: Option<Vec<Departure>>,
}

impl LastStandOp {
    fn parse(value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: LastStandValue = parse(value)?;
        if let Some(killed) = &v.killed {
            known_node(killed, nodes, "killed")?;
        }
        if let Some(left) = &v.left {
            if v.killed.is_none() {
                return Err("field `left`: needs `killed`, the leader they leave".into());
            }
            for (i, d) in left.iter().enumerate() {
                known_node(&d.node, nodes, &format!("left[{i}].node"))?;
                if Some(&d.node) == v.killed.as_ref() {
                    return Err(format!(
                        "field `left[{i}].node`: {:?} is the leader they leave",
                        d.node
                    ));
                }
                if left[..i].iter().any(|e| e.node == d.node) {
                    return Err(format!("field `left[{i}].node`: {:?} leaves twice", d.node));
                }
            }
        }
        Ok(LastStandOp {
            at: partition_of(v.topic, v.partition)?,
            how: v.how.unwrap_or_default(),
            killed: v.killed,
            left: v.left,
        })
    }
}

impl FaultOp for LastStandOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        last_stand(env, *self)
    }
}

impl Fault for LastStand {
    fn fs(&self) -> &'static [&'static str] {
        &["last-stand"]
    }

    fn parse<'a>(
        &'a self,
        _f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(LastStandOp::parse(value, nodes)?))
    }
}

/// A follower's turn to leave: as recorded on replay, else drawn when it comes.
struct Turn {
    node: String,
    how: Option<Leaving>,
    held_ms: Option<u64>,
    seed: Option<u64>,
}

impl Turn {
    fn drawn(node: String) -> Self {
        Turn {
            node,
            how: None,
            held_ms: None,
            seed: None,
        }
    }

    fn replay(d: Departure) -> Self {
        Turn {
            node: d.node,
            how: Some(d.how),
            held_ms: d.held_ms,
            seed: d.seed,
        }
    }
}

/// Whether a `last-stand` value asks for a power loss (in `how`, or a recorded departure).
pub fn loses_power(value: &Value) -> bool {
    parse::<LastStandValue>(value).is_ok_and(|v| {
        let asked = v.how.iter().flatten().any(|h| *h == Leaving::PowerLoss);
        asked || v.left.iter().flatten().any(|d| d.how == Leaving::PowerLoss)
    })
}

/// Whether `node` may stop, with the processes of the followers that `left` before it stopped,
/// and the controller quorum still have a majority of its voters running: a node that is no
/// voter always may.
fn may_stop(env: &Env<'_>, node: &str, left: &[Departure]) -> bool {
    let Ok(n) = env.node(node) else {
        return false;
    };
    if !n.role.is_voter() {
        return true;
    }
    let voters: Vec<&str> = env
        .cx
        .nodes
        .iter()
        .chain(env.cx.controllers)
        .filter(|v| v.cluster == n.cluster && v.role.is_voter())
        .map(|v| v.name.as_str())
        .collect();
    let stopped = |v: &str| {
        left.iter()
            .any(|d| d.node == v && d.how.stops_the_process())
    };
    let running = voters.iter().filter(|v| **v != node && !stopped(v)).count();
    running * 2 > voters.len()
}

fn last_stand(env: &mut Env<'_>, op: LastStandOp) -> Result<Value, Failed> {
    let started = Instant::now();
    let kill = env.kill()?;
    let mut errors = Vec::new();
    // What is left of an earlier turn's catch-up cap would keep a replica out of the ISR, or
    // drop a follower before its turn.
    lift_caps(env, &env.names(), &mut errors);
    // A partition whose replicas are all in sync, waited for a while: every one of them leaves.
    let replicas = ClusterView::read(env.cx)
        .ok()
        .and_then(|v| v.partitions.iter().map(|p| p.replicas.len()).max())
        .unwrap_or(2)
        .max(2);
    let (p, leader) = partition_and_leader(env, op.at, replicas, op.killed)?;
    let (topic, partition) = (p.topic.clone(), p.partition);
    env.node(&leader)?;
    let replay = op.left.is_some();
    let mut queue: VecDeque<Turn> = match op.left {
        Some(left) => left.into_iter().map(Turn::replay).collect(),
        None => {
            let mut followers: Vec<String> =
                p.isr.iter().filter(|r| **r != leader).cloned().collect();
            followers.shuffle(env.rng);
            followers.into_iter().map(Turn::drawn).collect()
        }
    };
    let power = env.cx.db.as_power_loss();
    if queue.is_empty() {
        return Err(Failed::nothing(format!(
            "{topic}/{partition} has no in-sync follower to leave {leader}"
        )));
    }
    let ports = env.listener_ports();
    let mut epoch = p.leader_epoch;
    let mut left: Vec<Departure> = Vec::new();
    let (mut all_left, mut last_gone) = (true, Duration::ZERO);
    loop {
        let Some(Turn {
            node,
            how,
            held_ms,
            seed,
        }) = queue.pop_front()
        else {
            // A replica that came back into the ISR meanwhile leaves too: the leader must end
            // alone in it.
            let isr_now = left
                .iter()
                .rev()
                .find_map(|d| d.isr.as_ref())
                .unwrap_or(&p.isr);
            let back: Vec<String> = isr_now
                .iter()
                .filter(|r| **r != leader && !left.iter().any(|d| d.node == **r))
                .cloned()
                .collect();
            if replay || back.is_empty() || left.len() >= p.replicas.len() {
                break;
            }
            queue.extend(back.into_iter().map(Turn::drawn));
            continue;
        };
        // Asked for, else drawn: a stop only where the quorum allows it, a power loss only
        // where the data sits on a filesystem that can lose it.
        let how = how
            .or_else(|| op.how.get(left.len()).copied())
            .unwrap_or_else(|| {
                let mut ways = vec![Leaving::Cut];
                if may_stop(env, &node, &left) {
                    ways.extend([Leaving::Stop, Leaving::Crash]);
                    if power.is_some() {
                        ways.push(Leaving::PowerLoss);
                    }
                }
                *ways.choose(env.rng).unwrap_or(&Leaving::Cut)
            });
        let mut departure = Departure {
            node: node.clone(),
            how,
            held_ms: None,
            seed: None,
            dropped: None,
            isr: None,
        };
        let gone = Instant::now();
        let result = match how {
            Leaving::Stop => env
                .node(&node)
                .and_then(|n| env.cx.db.stop(n).map_err(Failed::from_error)),
            Leaving::Crash => env
                .node(&node)
                .and_then(|n| kill.kill(n).map_err(Failed::from_error)),
            Leaving::PowerLoss => {
                let seed = seed.unwrap_or_else(|| env.rng.random());
                departure.seed = Some(seed);
                match power {
                    Some(power) => env.node(&node).and_then(|n| {
                        let report = power.power_off(n, seed).map_err(Failed::from_error)?;
                        departure.dropped = Some(report);
                        Ok(())
                    }),
                    None => Err(Failed::nothing(
                        "the database's data is not on tidemark-powerfs, so it cannot lose power",
                    )),
                }
            }
            Leaving::Cut => {
                let grudge = crate::grudge::isolate(&env.names(), std::slice::from_ref(&node));
                env.cx
                    .net
                    .drop_on_ports(env.cx.nodes, &grudge, &ports)
                    .map_err(Failed::from_error)
            }
        };
        if let Err(e) = result {
            errors.push(format!("{node} leaving: {}", e.error));
            all_left = false;
            break;
        }
        last_gone = started.elapsed();
        // Clients write on while the ISR drops it, and a moment after.
        let held_ms =
            held_ms.unwrap_or_else(|| hold_until_out_of_isr(env, (&topic, partition), &node, gone));
        std::thread::sleep(Duration::from_millis(held_ms).saturating_sub(gone.elapsed()));
        departure.held_ms = Some(held_ms);
        if let Ok(v) = ClusterView::read(env.cx) {
            if let Some(p) = v.partition(&topic, partition) {
                departure.isr = Some(p.isr.clone());
                epoch = epoch.max(p.leader_epoch);
            }
        }
        left.push(departure);
    }
    let mut record = json!({"topic": topic, "partition": partition, "killed": leader,
                            "isr_at_start": p.isr, "left": left, "nodes": [], "ports": ports});
    if let Ok(v) = ClusterView::read(env.cx) {
        if let Some(p) = v.partition(&topic, partition) {
            record["isr_at_kill"] = json!(p.isr);
            record["leader_at_kill"] = json!(p.leader);
            epoch = epoch.max(p.leader_epoch);
        }
    }
    // With the op's own times, these tell when the leader surely stood alone.
    if all_left {
        record["alone_from_ms"] = json!(last_gone.as_millis() as u64);
        record["alone_ms"] = json!((started.elapsed() - last_gone).as_millis() as u64);
    }
    let leader_killed = env
        .node(&leader)
        .and_then(|n| kill.kill(n).map_err(Failed::from_error));
    let leader_down = match leader_killed {
        Ok(()) => {
            record["nodes"] = json!([leader]);
            true
        }
        Err(e) => {
            errors.push(format!("{leader}: {}", e.error));
            false
        }
    };
    if left.iter().any(|d| d.how == Leaving::Cut) {
        if let Err(e) = env.cx.net.heal(env.cx.nodes) {
            errors.push(format!("healing the cuts: {e:#}"));
        }
    }
    for Departure { node, how, .. } in left.iter().filter(|d| d.how.stops_the_process()) {
        let back = env.node(node).and_then(|n| {
            match (how, power) {
                (Leaving::PowerLoss, Some(power)) => power.power_on(n),
                _ => kill.start(n),
            }
            .map_err(Failed::from_error)
        });
        if let Err(e) = back {
            errors.push(format!("{node} coming back: {}", e.error));
        }
    }
    // The follower whose leaving took the ISR below the minimum is eligible, unless it crashed;
    // which one that was depends on `min.insync.replicas`, so the election is recorded here and
    // judged by the checkers (`null`: none within the wait). Back from a crash, only the last
    // leader may lead, once it is back.
    let last_crashed = left.last().is_some_and(|d| d.how.is_unclean());
    if leader_down && !last_crashed {
        let next = wait_for_election_within(env, (&topic, partition), epoch, ELECTION_WAIT);
        record["elected"] = json!(next.map(|(l, _)| l));
    }
    record["elapsed_ms"] = json!(started.elapsed().as_millis() as u64);
    Failed::partly(record, &errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_names_the_bad_field() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |v: Value| LastStandOp::parse(&v, &nodes);
        assert_eq!(parse(json!({})), Ok(LastStandOp::default()));
        let recorded = json!({"topic": "t", "partition": 1, "killed": "n1", "nodes": ["n1"],
                              "left": [{"node": "n3", "how": "power-loss", "held_ms": 2100,
                                        "seed": 77, "dropped": {"files": 1},
                                        "isr": ["n1", "n2"]},
                                       {"node": "n2", "how": "cut", "held_ms": 900}],
                              "elected": "n2", "elapsed_ms": 5200});
        assert_eq!(
            parse(recorded),
            Ok(LastStandOp {
                at: Some(("t".into(), 1)),
                how: Vec::new(),
                killed: Some("n1".into()),
                left: Some(vec![
                    Departure {
                        node: "n3".into(),
                        how: Leaving::PowerLoss,
                        held_ms: Some(2100),
                        seed: Some(77),
                        dropped: Some(json!({"files": 1})),
                        isr: Some(vec!["n1".into(), "n2".into()])
                    },
                    Departure {
                        node: "n2".into(),
                        how: Leaving::Cut,
                        held_ms: Some(900),
                        seed: None,
                        dropped: None,
                        isr: None
                    },
                ])
            })
        );
        // A spec may say how the followers leave, in order; the rest are drawn.
        assert_eq!(
            parse(json!({"how": ["cut", "power-loss"]})),
            Ok(LastStandOp {
                how: vec![Leaving::Cut, Leaving::PowerLoss],
                ..LastStandOp::default()
            })
        );
        assert!(loses_power(&json!({"how": ["cut", "power-loss"]})));
        assert!(loses_power(
            &json!({"left": [{"node": "n2", "how": "power-loss"}]})
        ));
        assert!(!loses_power(&json!({"how": ["cut", "crash"]})));
        let e = parse(json!({"how": ["unplug"]})).unwrap_err();
        assert!(
            e.starts_with("field `how[0]`: unknown variant `unplug`"),
            "{e}"
        );
        let e = parse(json!({"left": [{"node": "n2", "how": "stop"}]})).unwrap_err();
        assert!(e.starts_with("field `left`: needs `killed`"), "{e}");
        let e = parse(json!({"killed": "n1", "left": [{"node": "n2", "how": "nap"}]})).unwrap_err();
        assert!(e.contains("unknown variant `nap`"), "{e}");
        let e =
            parse(json!({"killed": "n1", "left": [{"node": "n9", "how": "stop"}]})).unwrap_err();
        assert!(e.starts_with("field `left[0].node`: unknown node"), "{e}");
        let twice = json!({"killed": "n1", "left": [{"node": "n2", "how": "stop"},
                                                    {"node": "n2", "how": "cut"}]});
        let e = parse(twice).unwrap_err();
        assert!(
            e.starts_with("field `left[1].node`: \"n2\" leaves twice"),
            "{e}"
        );
        let e = parse(json!({"killed": "n1", "left": [{"node": "n1", "how": "cut"}]})).unwrap_err();
        assert!(e.contains("is the leader they leave"), "{e}");
        let e = parse(json!({"killed": "n7"})).unwrap_err();
        assert!(e.starts_with("field `killed`"), "{e}");
    }
}
