//! Process faults through the database's [`Kill`] and [`Pause`] abilities: `kill` (SIGKILL) and
//! `start`, `pause` (SIGSTOP) and `resume` (SIGCONT) on resolved targets, and `bounce`, which
//! chases one partition's leadership like Kafka's `hard_bounce`: kill whoever leads, restart it
//! at once, wait for the next election, and again, fast enough that a follower which has just
//! truncated may lead before it catches up; and `handoff`, which kills a leader while freezing
//! its successor, so the last replica takes over without having caught up.
//!
//! [`Kill`]: tidemark_harness::db::Kill
//! [`Pause`]: tidemark_harness::db::Pause

use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use serde_json::{json, Value};

use crate::cluster::ClusterView;
use crate::fault::{object, opt_str, opt_u64, Env, Failed, Fault};
use crate::targets::{node_list, NodeSpec, Targets};

/// How long a bounce waits for the partition's next election.
const NEW_LEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Kill, start, pause, resume and bounce.
pub struct Process;

/// The targets an op defaults to: restarting and thawing default to every node.
fn default_targets(f: &str) -> Option<NodeSpec> {
    matches!(f, "start" | "resume").then_some(NodeSpec::All)
}

impl Process {
    fn signal(&self, env: &mut Env<'_>, f: &str, value: &Value) -> Result<Value, Failed> {
        let names = env.names();
        let targets =
            Targets::from_value(value, &names, default_targets(f)).map_err(Failed::nothing)?;
        let nodes = env.resolve(&targets)?;
        let db = env.cx.db;
        let (done, errors) = match f {
            "kill" | "start" => {
                let kill = db
                    .as_kill()
                    .ok_or_else(|| Failed::nothing("the database cannot be killed"))?;
                if f == "kill" {
                    env.on_each(&nodes, |n| kill.kill(n))
                } else {
                    env.on_each(&nodes, |n| kill.start(n))
                }
            }
            _ => {
                let pause = db
                    .as_pause()
                    .ok_or_else(|| Failed::nothing("the database cannot be paused"))?;
                if f == "pause" {
                    env.on_each(&nodes, |n| pause.pause(n))
                } else {
                    env.on_each(&nodes, |n| pause.resume(n))
                }
            }
        };
        let mut record = json!({ "nodes": sorted(done) });
        if let Some(spec) = targets.spec_name() {
            record["targets"] = json!(spec);
        }
        Failed::partly(record, &errors)
    }

    /// Kills a partition's leader (restarting it at once) and, before it is back, freezes the
    /// in-sync replica next in line to succeed it. The frozen successor is elected, the last
    /// replica follows it without being able to fetch, and once the controller fences the
    /// successor that replica leads; then the successor thaws. (KIP-101's scenario, with the
    /// restart keeping a three-node quorum alive.)
    fn handoff(&self, env: &mut Env<'_>, value: &Value) -> Result<Value, Failed> {
        let names = env.names();
        self.check("handoff", value, &names)
            .map_err(Failed::nothing)?;
        let db = env.cx.db;
        let (Some(kill), Some(pause)) = (db.as_kill(), db.as_pause()) else {
            return Err(Failed::nothing("the database cannot be killed and paused"));
        };
        // A successor and one more in-sync replica to take over from it are needed.
        let (topic, partition) = match value.get("topic") {
            Some(_) => choose_partition(env, value)?,
            None => partition_with_isr(env, 3)?,
        };
        let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
        let p = view
            .partition(&topic, partition)
            .ok_or_else(|| Failed::nothing(format!("no partition {topic}/{partition}")))?;
        let given = |k: &str| opt_str(value, k).ok().flatten().map(str::to_string);
        let leader = given("killed")
            .or(p.leader.clone())
            .ok_or_else(|| Failed::nothing(format!("{topic}/{partition} has no leader")))?;
        let heir = given("paused").or_else(|| {
            p.replicas
                .iter()
                .find(|r| **r != leader && p.isr.contains(r))
                .cloned()
        });
        let Some(heir) = heir else {
            return Err(Failed::nothing(format!(
                "{topic}/{partition} has no in-sync replica to succeed {leader}"
            )));
        };
        let mut record = json!({"topic": topic, "partition": partition, "killed": leader,
                                "paused": heir});
        // Kill first, so the last replica hears of no more commits; freeze the successor before
        // the restarted leader re-registers and the successor is elected.
        let mut errors = Vec::new();
        let (leader_node, heir_node) = (env.node(&leader)?, env.node(&heir)?);
        if let Err(e) = kill.kill(leader_node) {
            return Err(Failed::nothing(format!("{leader}: {e:#}")));
        }
        if let Err(e) = pause.pause(heir_node) {
            errors.push(format!("{heir}: {e:#}"));
        }
        if let Err(e) = kill.start(leader_node) {
            errors.push(format!("{leader}: {e:#}"));
        }
        let elected = wait_for_election(env, &topic, partition, p.leader_epoch);
        // The successor leads first; wait for the election after it is fenced.
        let next = match elected {
            Some((l, e)) if l == heir => wait_for_election(env, &topic, partition, e),
            other => other,
        };
        match next {
            Some((l, _)) => record["elected"] = json!(l),
            None => errors.push(format!(
                "{topic}/{partition} elected no leader besides {heir} within {NEW_LEADER_TIMEOUT:?}"
            )),
        }
        if let Err(e) = pause.resume(env.node(&heir)?) {
            errors.push(format!("{heir}: {e:#}"));
        }
        Failed::partly(record, &errors)
    }

    fn bounce(&self, env: &mut Env<'_>, value: &Value) -> Result<Value, Failed> {
        let names = env.names();
        self.check("bounce", value, &names)
            .map_err(Failed::nothing)?;
        let kill = env
            .cx
            .db
            .as_kill()
            .ok_or_else(|| Failed::nothing("the database cannot be killed"))?;
        let (topic, partition) = choose_partition(env, value)?;
        let replay = value
            .get("killed")
            .map(|k| node_list_in_order(k, &names))
            .transpose()
            .map_err(Failed::nothing)?;
        let times = replay
            .as_ref()
            .map(Vec::len)
            .or(opt_u64(value, "times").ok().flatten().map(|t| t as usize))
            .unwrap_or(3);
        let mut killed: Vec<String> = Vec::new();
        let mut errors = Vec::new();
        let record = |killed: &[String]| json!({"topic": topic, "partition": partition, "times": times, "killed": killed});
        // Each bounce waits for an election newer than the last one (the same node may win it).
        let mut after = -1;
        for i in 0..times {
            let Some((leader, epoch)) = wait_for_election(env, &topic, partition, after) else {
                errors.push(format!(
                    "{topic}/{partition} elected no leader after epoch {after} within \
                     {NEW_LEADER_TIMEOUT:?}"
                ));
                break;
            };
            after = epoch;
            let victim = replay.as_ref().map_or(leader, |list| list[i].clone());
            let node = env.node(&victim)?;
            if let Err(e) = kill.kill(node).and_then(|()| kill.start(node)) {
                errors.push(format!("{victim}: {e:#}"));
                break;
            }
            killed.push(victim);
        }
        Failed::partly(record(&killed), &errors)
    }
}

/// The partition `value` names, or a random one that has a leader.
fn choose_partition(env: &mut Env<'_>, value: &Value) -> Result<(String, i32), Failed> {
    if let (Ok(Some(t)), Some(p)) = (opt_str(value, "topic"), value.get("partition")) {
        return Ok((t.to_string(), p.as_i64().unwrap_or(0) as i32));
    }
    let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
    let led: Vec<_> = view
        .partitions
        .iter()
        .filter(|p| p.leader.is_some())
        .collect();
    let p = led
        .choose(env.rng)
        .ok_or_else(|| Failed::nothing("no partition has a leader"))?;
    Ok((p.topic.clone(), p.partition))
}

/// A random partition with a leader and at least `isr` in-sync replicas, waiting for one while
/// the cluster recovers from other faults.
fn partition_with_isr(env: &mut Env<'_>, isr: usize) -> Result<(String, i32), Failed> {
    let deadline = Instant::now() + NEW_LEADER_TIMEOUT;
    loop {
        if let Ok(view) = ClusterView::read(env.cx) {
            let ready: Vec<_> = view
                .partitions
                .iter()
                .filter(|p| p.leader.is_some() && p.isr.len() >= isr)
                .collect();
            if let Some(p) = ready.choose(env.rng) {
                return Ok((p.topic.clone(), p.partition));
            }
        }
        if Instant::now() >= deadline {
            return Err(Failed::nothing(format!(
                "no partition had {isr} in-sync replicas within {NEW_LEADER_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until the partition has a leader elected after `epoch`; returns it and its epoch.
fn wait_for_election(
    env: &Env<'_>,
    topic: &str,
    partition: i32,
    epoch: i32,
) -> Option<(String, i32)> {
    let deadline = Instant::now() + NEW_LEADER_TIMEOUT;
    loop {
        if let Ok(view) = ClusterView::read(env.cx) {
            let elected = view
                .partition(topic, partition)
                .filter(|p| p.leader_epoch > epoch)
                .and_then(|p| Some((p.leader.clone()?, p.leader_epoch)));
            if elected.is_some() {
                return elected;
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        // Chase fast: a follower that just truncated should not have time to catch up.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A list of known node names, repeats allowed, order kept.
fn node_list_in_order(list: &Value, nodes: &[String]) -> Result<Vec<String>, String> {
    let items = list
        .as_array()
        .ok_or_else(|| format!("field `killed`: expected a list of node names, got {list}"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            node_list(&json!([v]), nodes, "killed")
                .map_err(|e| e.replace("`killed[0]`", &format!("`killed[{i}]`")))
                .map(|mut one| one.remove(0))
        })
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

impl crate::fault::Fault for Process {
    fn fs(&self) -> &'static [&'static str] {
        &["kill", "start", "pause", "resume", "bounce", "handoff"]
    }

    fn check(&self, f: &str, value: &Value, nodes: &[String]) -> Result<(), String> {
        object(value)?;
        if f != "bounce" && f != "handoff" {
            return Targets::from_value(value, nodes, default_targets(f)).map(drop);
        }
        let topic = opt_str(value, "topic")?;
        match (topic, value.get("partition")) {
            (None, None) => {}
            (Some(_), Some(p)) if p.as_i64().is_some_and(|p| p >= 0) => {}
            (Some(_), Some(p)) => {
                return Err(format!(
                    "field `partition`: expected a partition index, got {p}"
                ))
            }
            _ => return Err("`topic` and `partition` go together".into()),
        }
        let times = opt_u64(value, "times")?;
        if times == Some(0) {
            return Err("field `times`: must be at least 1".into());
        }
        match (f, value.get("killed")) {
            ("bounce", Some(k)) => {
                node_list_in_order(k, nodes)?;
            }
            (_, Some(k)) => {
                node_list(&json!([k]), nodes, "killed")
                    .map_err(|_| format!("field `killed`: expected a node name, got {k}"))?;
            }
            _ => {}
        }
        if let Some(p) = value.get("paused") {
            node_list(&json!([p]), nodes, "paused")
                .map_err(|_| format!("field `paused`: expected a node name, got {p}"))?;
        }
        Ok(())
    }

    fn invoke(&self, env: &mut Env<'_>, f: &str, value: &Value) -> Result<Value, Failed> {
        match f {
            "bounce" => self.bounce(env, value),
            "handoff" => self.handoff(env, value),
            _ => self.signal(env, f, value),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_the_bad_field() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let p = Process;
        assert!(p
            .check("kill", &json!({"targets": "leaders"}), &nodes)
            .is_ok());
        assert!(p.check("start", &json!({}), &nodes).is_ok());
        assert!(p.check("kill", &json!({}), &nodes).is_err());
        assert!(p.check("pause", &json!([1]), &nodes).is_err());
        assert!(p.check("bounce", &json!({"times": 2}), &nodes).is_ok());
        let replay = json!({"topic": "t", "partition": 1, "killed": ["n1", "n2", "n1"]});
        assert!(p.check("bounce", &replay, &nodes).is_ok());
        let e = p
            .check("bounce", &json!({"killed": ["n1", "n4"]}), &nodes)
            .unwrap_err();
        assert!(e.contains("`killed[1]`"), "{e}");
        let e = p
            .check("bounce", &json!({"topic": "t"}), &nodes)
            .unwrap_err();
        assert!(e.contains("together"), "{e}");
        let recorded = json!({"topic": "t", "partition": 0, "killed": "n1", "paused": "n2"});
        assert!(p.check("handoff", &recorded, &nodes).is_ok());
        let e = p
            .check("handoff", &json!({"killed": "n1", "paused": "n9"}), &nodes)
            .unwrap_err();
        assert!(e.contains("`paused`"), "{e}");
        let e = p.check("bounce", &json!({"times": 0}), &nodes).unwrap_err();
        assert!(e.contains("`times`"), "{e}");
    }
}
