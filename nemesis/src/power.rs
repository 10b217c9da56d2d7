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

use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{NodeSpec, TargetFields, Targets};

/// The `power-loss` fault.
pub struct Power;

/// A `power-loss` value: a schedule's spec or a recorded `info`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PowerValue {
    /// Explicit node names (win over `targets`).
    #[serde(default)]
    nodes: Option<Vec<String>>,
    /// A node spec (`one`, `all`, ...).
    #[serde(default)]
    targets: Option<NodeSpec>,
    /// The cluster the op acts on (the engine reads it; the nodes are that cluster's).
    #[serde(default, rename = "cluster")]
    _cluster: Option<String>,
    /// The mirror role the op was aimed at, when it was (recorded only).
    #[serde(default, rename = "role")]
    _role: Option<String>,
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

/// A parsed `power-loss` op.
#[derive(Debug, PartialEq)]
struct PowerOp {
    targets: Targets,
    seed: Option<u64>,
}

impl PowerOp {
    fn parse(value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: PowerValue = parse(value)?;
        let targets = TargetFields {
            nodes: v.nodes,
            targets: v.targets,
        }
        .targets(nodes, None)?;
        Ok(PowerOp {
            targets,
            seed: v.seed,
        })
    }
}

impl Fault for Power {
    fn fs(&self) -> &'static [&'static str] {
        &["power-loss"]
    }

    fn parse<'a>(
        &'a self,
        _f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(PowerOp::parse(value, nodes)?))
    }
}

impl FaultOp for PowerOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let names = env.names();
        let db = env.cx.db;
        let (Some(kill), Some(power)) = (db.as_kill(), db.as_power_loss()) else {
            return Err(Failed::nothing(
                "the database's data is not on tidemark-powerfs, so it cannot lose power",
            ));
        };
        let nodes = env.resolve(&self.targets)?;
        let seed = self.seed.unwrap_or_else(|| env.rng.random());
        let mut sorted = nodes.clone();
        sorted.sort();
        let cluster_wide = env.covers_a_cluster(&nodes);
        let mut record = json!({"nodes": sorted, "seed": seed, "cluster_wide": cluster_wide});
        if let Some(spec) = self.targets.spec_name() {
            record["targets"] = json!(spec);
        }
        // Every target is killed before any loses power, so none takes writes the others lost.
        let (_, mut errors) = env.on_each(&nodes, |n| kill.kill(n));
        if !errors.is_empty() {
            return Err(Failed {
                done: json!({"killed": sorted}),
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
    fn parsing_names_the_bad_field_and_accepts_recorded_infos() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |v: Value| PowerOp::parse(&v, &nodes);
        assert_eq!(
            parse(json!({"targets": "all"})),
            Ok(PowerOp {
                targets: Targets::Spec(NodeSpec::All),
                seed: None
            })
        );
        let info = json!({"nodes": ["n2", "n1"], "seed": 7, "cluster_wide": false,
                          "targets": "majority",
                          "dropped": {"n1": {"seed": 1, "bytes_dropped": 3}}});
        assert_eq!(
            parse(info),
            Ok(PowerOp {
                targets: Targets::Nodes(vec!["n1".into(), "n2".into()]),
                seed: Some(7)
            })
        );
        assert!(parse(json!({"targets": "all", "cluster": "b"})).is_ok());
        let e = parse(json!({"targets": "all", "sed": 1})).unwrap_err();
        assert!(e.contains("sed"), "{e}");
        let e = parse(json!({"targets": "all", "seed": -1})).unwrap_err();
        assert!(e.contains("seed"), "{e}");
        let e = parse(json!({"nodes": ["n9"]})).unwrap_err();
        assert!(e.contains("n9"), "{e}");
        assert!(parse(json!({})).is_err());
    }
}
