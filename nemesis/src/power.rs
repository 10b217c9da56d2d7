//! Power loss through the database's [`PowerLoss`] ability: `power-loss` kills the process on
//! every target (all first, so no target hears of writes the others took after their cut), drops
//! what each node's filesystem had not made durable, tearing last writes where a seed says, and
//! boots them again on what survived. One op is the whole cycle, since a node without power has
//! nothing left to undo. Its `info` records the nodes, the seed, whether a whole cluster went
//! down together (the verdict policy reads that) and each node's report of what was dropped.
//!
//! [`PowerLoss`]: tidemark_harness::db::PowerLoss

use std::collections::BTreeMap;
use std::sync::Mutex;

use rand::RngExt as _;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::fault::{Env, Failed, Fault};
use crate::targets::Targets;

/// The `power-loss` op.
pub struct Power;

/// A `power-loss` value: a schedule's spec or a recorded `info`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PowerValue {
    /// A node spec (`one`, `all`, ...), read by [`Targets`].
    #[serde(default)]
    targets: Option<String>,
    /// Explicit node names, read by [`Targets`].
    #[serde(default)]
    nodes: Option<Vec<String>>,
    /// Where last writes tear; drawn from the nemesis's RNG when absent.
    #[serde(default)]
    seed: Option<u64>,
    /// Written by `info`; recomputed when replayed.
    #[serde(default, rename = "cluster_wide")]
    _cluster_wide: Option<bool>,
    /// Written by `info`: each node's report; a replay drops what it drops.
    #[serde(default, rename = "dropped")]
    _dropped: Option<BTreeMap<String, Value>>,
}

fn parse(value: &Value, nodes: &[String]) -> Result<(PowerValue, Targets), String> {
    let v: PowerValue = match value {
        Value::Null => serde_json::from_value(json!({})),
        other => serde_json::from_value(other.clone()),
    }
    .map_err(|e| e.to_string())?;
    let targets = match (&v.nodes, &v.targets) {
        (Some(list), _) => Targets::from_value(&json!({ "nodes": list }), nodes, None)?,
        (None, Some(spec)) => Targets::from_value(&json!({ "targets": spec }), nodes, None)?,
        (None, None) => return Err("needs `nodes` (a list of node names) or `targets`".to_string()),
    };
    Ok((v, targets))
}

impl Fault for Power {
    fn fs(&self) -> &'static [&'static str] {
        &["power-loss"]
    }

    fn check(&self, _f: &str, value: &Value, nodes: &[String]) -> Result<(), String> {
        parse(value, nodes).map(drop)
    }

    fn invoke(&self, env: &mut Env<'_>, _f: &str, value: &Value) -> Result<Value, Failed> {
        let names = env.names();
        let (v, targets) = parse(value, &names).map_err(Failed::nothing)?;
        let db = env.cx.db;
        let (Some(kill), Some(power)) = (db.as_kill(), db.as_power_loss()) else {
            return Err(Failed::nothing(
                "the database's data is not on tidemark-powerfs, so it cannot lose power",
            ));
        };
        let nodes = env.resolve(&targets)?;
        let seed = v.seed.unwrap_or_else(|| env.rng.random());
        let mut sorted = nodes.clone();
        sorted.sort();
        let cluster_wide = env.cx.nodes.iter().map(|n| n.cluster.as_str()).any(|c| {
            env.cx
                .nodes
                .iter()
                .filter(|n| n.cluster == c)
                .all(|n| nodes.contains(&n.name))
        });
        let mut record = json!({"nodes": sorted, "seed": seed, "cluster_wide": cluster_wide});
        if let Some(spec) = targets.spec_name() {
            record["targets"] = json!(spec);
        }
        let (_, mut errors) = env.on_each(&nodes, |n| kill.kill(n));
        if !errors.is_empty() {
            return Err(Failed {
                done: json!({"nodes": sorted, "killed_only": true}),
                error: errors.join("; "),
            });
        }
        // Each node tears with its own seed, derived from the op's, so replaying the op tears
        // the same places whatever order the nodes are reached in.
        let reports = Mutex::new(BTreeMap::new());
        let index = |name: &str| names.iter().position(|n| n == name).unwrap_or(0) as u64;
        let (_, off_errors) = env.on_each(&nodes, |n| {
            let node_seed = seed ^ index(&n.name).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let report = power.power_off(n, node_seed)?;
            reports
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(n.name.clone(), report);
            Ok(())
        });
        errors.extend(off_errors);
        let (_, on_errors) = env.on_each(&nodes, |n| power.power_on(n));
        errors.extend(on_errors);
        record["dropped"] = json!(reports.into_inner().unwrap_or_else(|p| p.into_inner()));
        Failed::partly(record, &errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_name_the_bad_field_and_accept_recorded_infos() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let p = Power;
        assert!(p
            .check("power-loss", &json!({"targets": "all"}), &nodes)
            .is_ok());
        let info = json!({"nodes": ["n1", "n2"], "seed": 7, "cluster_wide": false,
                          "targets": "majority",
                          "dropped": {"n1": {"seed": 1, "bytes_dropped": 3}}});
        assert!(p.check("power-loss", &info, &nodes).is_ok());
        let e = p
            .check("power-loss", &json!({"targets": "all", "sed": 1}), &nodes)
            .unwrap_err();
        assert!(e.contains("sed"), "{e}");
        let e = p
            .check("power-loss", &json!({"targets": "all", "seed": -1}), &nodes)
            .unwrap_err();
        assert!(e.contains("-1"), "{e}");
        let e = p
            .check("power-loss", &json!({"nodes": ["n9"]}), &nodes)
            .unwrap_err();
        assert!(e.contains("n9"), "{e}");
        assert!(p.check("power-loss", &json!({}), &nodes).is_err());
    }
}
