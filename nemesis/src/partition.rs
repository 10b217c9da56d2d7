//! Network partitions: `start-partition` applies a grudge through the engine's [`Net`] (iptables
//! inside the nodes), either built from a kind (`{"kind": "majorities-ring"}`) or given outright
//! (`{"grudge": {"n1": ["n2"]}}`, which may be one-way); `stop-partition` heals the network.
//!
//! [`Net`]: tidemark_harness::net::Net

use serde_json::{json, Value};

use crate::cluster::ClusterView;
use crate::fault::{object, opt_str, Env, Failed, Fault};
use crate::grudge::{self, PartitionKind};

/// The partition fault.
pub struct Partition;

fn kind_of(value: &Value) -> Result<Option<PartitionKind>, String> {
    opt_str(value, "kind")?
        .map(|k| {
            PartitionKind::parse(k).ok_or_else(|| {
                format!(
                    "field `kind`: unknown partition kind {k:?}; known: {}",
                    PartitionKind::ALL.map(PartitionKind::name).join(", ")
                )
            })
        })
        .transpose()
}

impl Fault for Partition {
    fn fs(&self) -> &'static [&'static str] {
        &["start-partition", "stop-partition"]
    }

    fn check(&self, f: &str, value: &Value, nodes: &[String]) -> Result<(), String> {
        object(value)?;
        if f == "stop-partition" {
            return Ok(());
        }
        match value.get("grudge") {
            Some(g) => grudge::from_value(g, nodes, "grudge").map(drop),
            None => match kind_of(value)? {
                Some(_) => Ok(()),
                None => Err("needs `kind` (a partition kind) or `grudge`".into()),
            },
        }
    }

    fn invoke(&self, env: &mut Env<'_>, f: &str, value: &Value) -> Result<Value, Failed> {
        let names = env.names();
        if f == "stop-partition" {
            env.cx.net.heal(env.cx.nodes).map_err(Failed::from_error)?;
            return Ok(json!({}));
        }
        self.check(f, value, &names).map_err(Failed::nothing)?;
        let kind = kind_of(value).map_err(Failed::nothing)?;
        let mut record = json!({});
        let grudge = match value.get("grudge") {
            Some(g) => grudge::from_value(g, &names, "grudge").map_err(Failed::nothing)?,
            None => {
                let kind = kind.expect("checked: a kind or a grudge");
                let leaders = if kind.needs_leaders() {
                    let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
                    let leaders = view.leader_list();
                    record["leaders"] = json!(view.leaders());
                    leaders
                } else {
                    Vec::new()
                };
                kind.grudge(&names, &leaders, env.rng)
                    .map_err(Failed::nothing)?
            }
        };
        record["kind"] = json!(kind.map_or("grudge", PartitionKind::name));
        record["grudge"] = json!(grudge);
        match env.cx.net.drop_all(env.cx.nodes, &grudge) {
            Ok(()) => Ok(record),
            // Some nodes may already drop traffic: say which grudge was meant.
            Err(e) => Err(Failed {
                done: record,
                error: format!("{e:#}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_need_a_kind_or_a_known_grudge() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let p = Partition;
        assert!(p
            .check("start-partition", &json!({"kind": "bridge"}), &nodes)
            .is_ok());
        assert!(p
            .check(
                "start-partition",
                &json!({"kind": "one", "grudge": {"n1": ["n2"]}}),
                &nodes
            )
            .is_ok());
        assert!(p.check("stop-partition", &json!({}), &nodes).is_ok());
        let e = p.check("start-partition", &json!({}), &nodes).unwrap_err();
        assert!(e.contains("kind"), "{e}");
        let e = p
            .check("start-partition", &json!({"kind": "triangle"}), &nodes)
            .unwrap_err();
        assert!(e.contains("`kind`") && e.contains("majorities-ring"), "{e}");
        let e = p
            .check("start-partition", &json!({"grudge": {"n1": "n2"}}), &nodes)
            .unwrap_err();
        assert!(e.contains("`grudge.n1`"), "{e}");
    }
}
