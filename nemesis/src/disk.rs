//! A failing disk through the database's [`FailingDisk`] ability. `disk-fault` puts one of three
//! faults in force in the target nodes' data directories: `fail-fsync`, every fsync failing with
//! EIO and dropping what it would have made durable while reads go on seeing it, as Linux's page
//! cache does after a failed write-back; `full`, every write that would grow a file failing
//! with ENOSPC; or `nearly-full`, a little room left, the write that fills it cut short and
//! growth past it refused. `disk-heal` makes the disk work again, and reboots a node whose
//! process stopped after its failed fsyncs dropped something (a broker that halts on a log
//! directory failure, as Kafka's does), as an operator restarts a machine whose disk failed: it
//! comes back on what its disk holds, without what only the cache held. A node stopped with
//! nothing dropped (a broker halted on a write its disk refused) is started as it is. One that kept running is left as it is: its disk just works again, and what a
//! failed fsync dropped stays a hole it does not know of, which a later power loss reveals.
//!
//! [`FailingDisk`]: tidemark_harness::db::FailingDisk

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_harness::db::DiskFault;

use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{NodeSpec, TargetFields, Targets};

/// The failing-disk fault.
pub struct Disk;

/// A `disk-fault` or `disk-heal` value: a schedule's spec or a recorded `info`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DiskValue {
    /// Explicit node names (win over `targets`).
    #[serde(default)]
    nodes: Option<Vec<String>>,
    /// A node spec (`one`, `all`, ...).
    #[serde(default)]
    targets: Option<NodeSpec>,
    /// How the disk fails (`disk-fault` only).
    #[serde(default)]
    mode: Option<DiskFault>,
    /// The cluster the op acts on (the engine reads it; the nodes are that cluster's).
    #[serde(default, rename = "cluster")]
    _cluster: Option<String>,
    /// The mirror role the op was aimed at, when it was (recorded only).
    #[serde(default, rename = "role")]
    _role: Option<String>,
    /// Written by `info`: the nodes leading some partition when a leader spec was resolved.
    #[serde(default, rename = "leaders")]
    _leaders: Option<Vec<String>>,
    /// Written by `info`: each node's filesystem report.
    #[serde(default, rename = "disk")]
    _disk: Option<BTreeMap<String, Value>>,
    /// Written by `disk-heal`'s `info`: the nodes rebooted; a replay reboots whichever stopped.
    #[serde(default, rename = "rebooted")]
    _rebooted: Option<Vec<String>>,
    /// Written by `disk-heal`'s `info`: the nodes started as they were.
    #[serde(default, rename = "started")]
    _started: Option<Vec<String>>,
    /// Written by `disk-heal`'s `info`: whether they were every node of a cluster.
    #[serde(default, rename = "cluster_wide")]
    _cluster_wide: Option<bool>,
}

/// A parsed op.
#[derive(Debug, PartialEq)]
enum DiskOp {
    Fail(Targets, DiskFault),
    Heal(Targets),
}

impl DiskOp {
    fn parse(f: &str, value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: DiskValue = parse(value)?;
        let fields = TargetFields {
            nodes: v.nodes,
            targets: v.targets,
        };
        Ok(match f {
            "disk-fault" => {
                let mode = v.mode.ok_or_else(|| {
                    format!(
                        "field `mode`: needed, one of {}",
                        DiskFault::ALL.map(DiskFault::name).join(", ")
                    )
                })?;
                DiskOp::Fail(fields.targets(nodes, None)?, mode)
            }
            _ if v.mode.is_some() => return Err("field `mode`: only for disk-fault".into()),
            // Healing defaults to every node, dedicated controllers included (the final
            // phase's heal: a spec's `all` is the brokers, and a controller's disk named in a
            // fault must work again too).
            _ if fields.nodes.is_none() && fields.targets.is_none() => {
                DiskOp::Heal(Targets::Nodes(nodes.to_vec()))
            }
            _ => DiskOp::Heal(fields.targets(nodes, None)?),
        })
    }
}

impl Fault for Disk {
    fn fs(&self) -> &'static [&'static str] {
        &["disk-fault", "disk-heal"]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(DiskOp::parse(f, value, nodes)?))
    }
}

impl FaultOp for DiskOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let db = env.cx.db;
        let Some(disk) = db.as_failing_disk() else {
            return Err(Failed::nothing(
                "the database's data is not on tidemark-powerfs, so its disk cannot fail",
            ));
        };
        let (targets, mode) = match *self {
            DiskOp::Fail(t, mode) => (t, Some(mode)),
            DiskOp::Heal(t) => (t, None),
        };
        let mut nodes = env.resolve(&targets)?;
        nodes.sort();
        let mut record = json!({ "nodes": nodes });
        if let Some(mode) = mode {
            record["mode"] = json!(mode);
        }
        if let Some(spec) = targets.spec_name() {
            record["targets"] = json!(spec);
        }
        if let Some(leaders) = &env.leaders {
            if targets.needs_leaders() {
                record["leaders"] = json!(leaders);
            }
        }
        let reports = Mutex::new(BTreeMap::new());
        let rebooted = Mutex::new(Vec::new());
        let started = Mutex::new(Vec::new());
        let push = |list: &Mutex<Vec<String>>, name: &str| {
            list.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(name.to_owned())
        };
        let (_, errors) = env.on_each(&nodes, |n| {
            let report = match mode {
                Some(mode) => disk.fail(n, mode)?,
                None => disk.heal(n)?,
            };
            // Only a node whose failed fsyncs dropped something has a cache to lose: it is
            // rebooted. One that stopped with nothing dropped (a broker that halted on a write
            // its full disk refused; at the final heal, one a kill left down) is started as it
            // is.
            let dropped = report["lost_bytes"].as_u64().is_some_and(|b| b > 0);
            reports
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(n.name.clone(), report);
            let kill = db.as_kill().filter(|_| mode.is_none());
            if let Some(kill) = kill.filter(|k| !k.is_running(n).unwrap_or(true)) {
                if dropped {
                    disk.reboot(n)?;
                    push(&rebooted, &n.name);
                } else {
                    kill.start(n)?;
                    push(&started, &n.name);
                }
            }
            Ok(())
        });
        record["disk"] = json!(reports.into_inner().unwrap_or_else(|p| p.into_inner()));
        if mode.is_none() {
            let mut rebooted = rebooted.into_inner().unwrap_or_else(|p| p.into_inner());
            rebooted.sort();
            let mut started = started.into_inner().unwrap_or_else(|p| p.into_inner());
            started.sort();
            // Every node of a cluster rebooted without what its failed fsyncs dropped is a
            // power loss of the whole cluster to the verdict policy.
            let cluster_wide = env.covers_a_cluster(&rebooted);
            record["rebooted"] = json!(rebooted);
            record["started"] = json!(started);
            record["cluster_wide"] = json!(cluster_wide);
        }
        Failed::partly(record, &errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_names_the_bad_field_and_accepts_recorded_infos() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |f: &str, v: Value| DiskOp::parse(f, &v, &nodes);
        assert_eq!(
            parse("disk-fault", json!({"targets": "leader", "mode": "full"})),
            Ok(DiskOp::Fail(
                Targets::Spec(NodeSpec::Leader),
                DiskFault::Full
            ))
        );
        let info = json!({"nodes": ["n2"], "mode": "fail-fsync", "targets": "leader",
                          "leaders": ["n2", "n3"],
                          "disk": {"n2": {"fault": "fail-fsync", "lost_bytes": 0, "refused": 0}}});
        assert_eq!(
            parse("disk-fault", info),
            Ok(DiskOp::Fail(
                Targets::Nodes(vec!["n2".into()]),
                DiskFault::FailFsync
            ))
        );
        assert_eq!(
            parse("disk-heal", json!({})),
            Ok(DiskOp::Heal(Targets::Nodes(nodes.clone())))
        );
        assert_eq!(
            parse("disk-heal", json!({"targets": "all"})),
            Ok(DiskOp::Heal(Targets::Spec(NodeSpec::All)))
        );
        let healed = json!({"nodes": ["n1"], "rebooted": ["n1"], "started": [], "cluster_wide": false,
                            "disk": {"n1": {"fault": null, "lost_bytes": 812, "refused": 0}}});
        assert_eq!(
            parse("disk-heal", healed),
            Ok(DiskOp::Heal(Targets::Nodes(vec!["n1".into()])))
        );
        let e = parse("disk-fault", json!({"mode": "full"})).unwrap_err();
        assert!(e.contains("targets"), "{e}");
        let e = parse("disk-fault", json!({"targets": "all"})).unwrap_err();
        assert!(e.contains("mode") && e.contains("fail-fsync, full"), "{e}");
        let e = parse("disk-fault", json!({"targets": "all", "mode": "slow"})).unwrap_err();
        assert!(e.contains("mode"), "{e}");
        let e = parse("disk-heal", json!({"mode": "full"})).unwrap_err();
        assert!(e.contains("mode"), "{e}");
        let e = parse("disk-heal", json!({"nodes": ["n9"]})).unwrap_err();
        assert!(e.contains("n9"), "{e}");
    }
}
