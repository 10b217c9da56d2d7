//! Network partitions: `start-partition` applies a grudge through the engine's [`Net`] (iptables
//! inside the nodes), either built from a kind (`{"kind": "majorities-ring"}`) or given outright
//! (`{"grudge": {"n1": ["n2"]}}`, which may be one-way); `stop-partition` heals the network.
//! A grudge with `ports` cuts only traffic to or from those ports: `leader-replication` records
//! the brokers' listeners, so the controllers' quorum still talks across the cut, and
//! `leader-control` the controller listeners, so replication and clients still do.
//!
//! [`Net`]: tidemark_harness::net::Net

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_harness::net::Grudge;

use crate::cluster::{active_controller, ClusterView};
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::grudge::{self, PartitionKind, Traffic};

/// The partition fault.
pub struct Partition;

/// The value of `start-partition` as written: a kind, or a grudge (which wins; a recorded `info`
/// has both, its kind then being `"grudge"` or the kind that built it).
#[derive(Debug, Deserialize)]
struct StartValue {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    grudge: Option<BTreeMap<String, Vec<String>>>,
    /// With a grudge: only traffic to or from these ports is cut.
    #[serde(default)]
    ports: Vec<u16>,
}

/// The value of `stop-partition`: an object, whatever it holds.
#[derive(Debug, Deserialize)]
struct StopValue {}

/// A parsed partition op.
#[derive(Debug, PartialEq)]
enum PartitionOp {
    /// Cut links along a grudge built from a kind when performed.
    Kind(PartitionKind),
    /// Cut links along this grudge (built from `kind`, when the value says which), on `ports`
    /// only when there are any.
    Grudge(Grudge, Option<PartitionKind>, Vec<u16>),
    /// Heal the network.
    Stop,
}

impl PartitionOp {
    fn parse(f: &str, value: &Value, nodes: &[String]) -> Result<Self, String> {
        if f == "stop-partition" {
            return parse::<StopValue>(value).map(|_| PartitionOp::Stop);
        }
        let v: StartValue = parse(value)?;
        if let Some(g) = &v.grudge {
            let kind = v.kind.as_deref().and_then(PartitionKind::parse);
            return grudge::known(g, nodes, "grudge")
                .map(|g| PartitionOp::Grudge(g, kind, v.ports));
        }
        let Some(k) = v.kind else {
            return Err("needs `kind` (a partition kind) or `grudge`".into());
        };
        PartitionKind::parse(&k)
            .map(PartitionOp::Kind)
            .ok_or_else(|| {
                format!(
                    "field `kind`: unknown partition kind {k:?}; known: {}",
                    PartitionKind::ALL.map(PartitionKind::name).join(", ")
                )
            })
    }
}

impl FaultOp for PartitionOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let mut record = json!({});
        let (grudge, ports) = match *self {
            PartitionOp::Stop => {
                env.cx
                    .net
                    .heal(&env.cx.cluster_nodes())
                    .map_err(Failed::from_error)?;
                return Ok(json!({}));
            }
            PartitionOp::Grudge(g, kind, ports) => {
                record["kind"] = json!(kind.map_or("grudge", PartitionKind::name));
                (g, ports)
            }
            PartitionOp::Kind(kind) => {
                let leaders = if kind == PartitionKind::Controller {
                    let controller = active_controller(env.cx);
                    record["controller"] = json!(controller);
                    controller.into_iter().collect()
                } else if kind.needs_leaders() {
                    let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
                    record["leaders"] = json!(view.leaders());
                    view.leader_list()
                } else {
                    Vec::new()
                };
                record["kind"] = json!(kind.name());
                // Cuts of the control traffic and of the controller reach dedicated controllers;
                // every other kind cuts among the brokers.
                let names = if kind.reaches_controllers() {
                    env.every_name()
                } else {
                    env.names()
                };
                let grudge = kind
                    .grudge(&names, &leaders, env.rng)
                    .map_err(Failed::nothing)?;
                let ports = match kind.traffic() {
                    Traffic::All => Vec::new(),
                    Traffic::Listeners => env.listener_ports(),
                    Traffic::Control => env.control_ports()?,
                };
                (grudge, ports)
            }
        };
        record["grudge"] = json!(grudge);
        if !ports.is_empty() {
            record["ports"] = json!(ports);
        }
        match env
            .cx
            .net
            .drop_on_ports(&env.cx.cluster_nodes(), &grudge, &ports)
        {
            Ok(()) => Ok(record),
            // Some nodes may already drop traffic: say which grudge was meant.
            Err(e) => Err(Failed {
                done: record,
                error: format!("{e:#}"),
            }),
        }
    }
}

impl Fault for Partition {
    fn fs(&self) -> &'static [&'static str] {
        &["start-partition", "stop-partition"]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(PartitionOp::parse(f, value, nodes)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_need_a_kind_or_a_known_grudge() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |f: &str, v: Value| PartitionOp::parse(f, &v, &nodes);
        assert_eq!(
            parse("start-partition", json!({"kind": "bridge"})),
            Ok(PartitionOp::Kind(PartitionKind::Bridge))
        );
        let recorded = parse(
            "start-partition",
            json!({"kind": "one", "grudge": {"n1": ["n2"]}, "leaders": ["n1"]}),
        );
        assert!(
            matches!(recorded, Ok(PartitionOp::Grudge(g, Some(PartitionKind::One), p)) if g.len() == 1 && p.is_empty())
        );
        // A replication cut replays on the ports it recorded.
        let cut = parse(
            "start-partition",
            json!({"kind": "leader-replication", "grudge": {"n1": ["n2", "n3"]},
                   "ports": [9092]}),
        );
        assert!(
            matches!(cut, Ok(PartitionOp::Grudge(_, Some(PartitionKind::LeaderReplication), p)) if p == [9092])
        );
        let e = parse("start-partition", json!({"grudge": {}, "ports": [70000]})).unwrap_err();
        assert!(e.starts_with("field `ports[0]`"), "{e}");
        // The record of a given grudge says `"kind": "grudge"`, and replays.
        let given = parse(
            "start-partition",
            json!({"kind": "grudge", "grudge": {"n3": ["n1"]}}),
        );
        assert!(matches!(given, Ok(PartitionOp::Grudge(g, None, _)) if g.len() == 1));
        assert_eq!(parse("stop-partition", json!({})), Ok(PartitionOp::Stop));
        assert_eq!(parse("stop-partition", Value::Null), Ok(PartitionOp::Stop));
        assert!(parse("stop-partition", json!([1])).is_err());
        let e = parse("start-partition", json!({})).unwrap_err();
        assert!(e.contains("kind"), "{e}");
        let e = parse("start-partition", json!({"kind": "triangle"})).unwrap_err();
        assert!(e.contains("`kind`") && e.contains("majorities-ring"), "{e}");
        let e = parse("start-partition", json!({"kind": 3})).unwrap_err();
        assert!(e.starts_with("field `kind`: invalid type"), "{e}");
        let e = parse("start-partition", json!({"grudge": {"n1": "n2"}})).unwrap_err();
        assert!(e.starts_with("field `grudge.n1`"), "{e}");
        let e = parse("start-partition", json!({"grudge": {"n1": ["n7"]}})).unwrap_err();
        assert!(e.starts_with("field `grudge.n1[0]`: unknown node"), "{e}");
    }
}
