//! Process faults through the database's [`Kill`] and [`Pause`] abilities: `kill` (SIGKILL) and
//! `start`, `pause` (SIGSTOP) and `resume` (SIGCONT) on resolved targets, and `bounce`, which
//! chases one partition's leadership like Kafka's `hard_bounce`: kill whoever leads, restart it
//! at once, wait for another leader, and again.
//!
//! [`Kill`]: tidemark_harness::db::Kill
//! [`Pause`]: tidemark_harness::db::Pause

use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use serde_json::{json, Value};

use crate::cluster::ClusterView;
use crate::fault::{object, opt_str, opt_u64, Env, Failed, Fault};
use crate::targets::{node_list, NodeSpec, Targets};

/// How long a bounce waits for the partition to get another leader.
const NEW_LEADER_TIMEOUT: Duration = Duration::from_secs(15);

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

    fn bounce(&self, env: &mut Env<'_>, value: &Value) -> Result<Value, Failed> {
        let names = env.names();
        self.check("bounce", value, &names)
            .map_err(Failed::nothing)?;
        let kill = env
            .cx
            .db
            .as_kill()
            .ok_or_else(|| Failed::nothing("the database cannot be killed"))?;
        let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
        let (topic, partition) = match (opt_str(value, "topic"), value.get("partition")) {
            (Ok(Some(t)), Some(p)) => (t.to_string(), p.as_i64().unwrap_or(0) as i32),
            _ => {
                let led: Vec<_> = view
                    .partitions
                    .iter()
                    .filter(|p| p.leader.is_some())
                    .collect();
                let p = led
                    .choose(env.rng)
                    .ok_or_else(|| Failed::nothing("no partition has a leader"))?;
                (p.topic.clone(), p.partition)
            }
        };
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
        for i in 0..times {
            let victim = match &replay {
                Some(list) => Some(list[i].clone()),
                None => wait_for_leader(env, &topic, partition, None),
            };
            let Some(victim) = victim else {
                errors.push(format!("{topic}/{partition} has no leader to bounce"));
                break;
            };
            let node = env.node(&victim)?;
            if let Err(e) = kill.kill(node).and_then(|()| kill.start(node)) {
                errors.push(format!("{victim}: {e:#}"));
                break;
            }
            killed.push(victim.clone());
            if i + 1 < times && wait_for_leader(env, &topic, partition, Some(&victim)).is_none() {
                errors.push(format!(
                    "{topic}/{partition} got no leader other than {victim} within \
                     {NEW_LEADER_TIMEOUT:?}"
                ));
                break;
            }
        }
        Failed::partly(record(&killed), &errors)
    }
}

/// Waits until the partition has a leader other than `not`; returns it.
fn wait_for_leader(
    env: &Env<'_>,
    topic: &str,
    partition: i32,
    not: Option<&str>,
) -> Option<String> {
    let deadline = Instant::now() + NEW_LEADER_TIMEOUT;
    loop {
        if let Ok(view) = ClusterView::read(env.cx) {
            let leader = view
                .partition(topic, partition)
                .and_then(|p| p.leader.clone());
            if let Some(l) = leader.filter(|l| Some(l.as_str()) != not) {
                return Some(l);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
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
        &["kill", "start", "pause", "resume", "bounce"]
    }

    fn check(&self, f: &str, value: &Value, nodes: &[String]) -> Result<(), String> {
        object(value)?;
        if f != "bounce" {
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
        if let Some(k) = value.get("killed") {
            node_list_in_order(k, nodes)?;
        }
        Ok(())
    }

    fn invoke(&self, env: &mut Env<'_>, f: &str, value: &Value) -> Result<Value, Failed> {
        match f {
            "bounce" => self.bounce(env, value),
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
        let e = p.check("bounce", &json!({"times": 0}), &nodes).unwrap_err();
        assert!(e.contains("`times`"), "{e}");
    }
}
