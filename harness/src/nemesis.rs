//! Faults. A [`Nemesis`] performs fault ops on the nodes through the [`Db`] and [`Net`]
//! abilities; fault kinds and their schedules live in the `tidemark-nemesis` crate. This module
//! also holds [`heal_ops`] and [`heal`], the final phase's "undo every fault", which work whatever
//! faults ran because they only use the abilities themselves.

use serde_json::{json, Value};

use crate::client::ClientContext;
use crate::db::Db;
use crate::generator::Generator;
use crate::net::Net;
use crate::op::{Completion, Invocation, Outcome};
use crate::runtime::Node;

/// What a nemesis may act on.
pub struct NemesisContext<'a> {
    /// The broker nodes of the cluster the fault acts on.
    pub nodes: &'a [Node],
    /// Its dedicated controllers (none in combined mode): the network and the healing reach
    /// them, and faults naming them, but no target spec draws them.
    pub controllers: &'a [Node],
    /// Every cluster's nodes, for faults between clusters (a failback's lagging replica).
    pub every_node: &'a [Node],
    /// The database, with its optional abilities.
    pub db: &'a dyn Db,
    /// The network.
    pub net: &'a dyn Net,
    /// How the harness reaches the nodes as a client (for metadata and admin requests).
    pub client: &'a ClientContext,
    /// Every cluster's client side, this one's included, for faults between clusters
    /// (failover, failback).
    pub clusters: &'a [ClientContext],
}

impl NemesisContext<'_> {
    /// Every node of the cluster: its brokers, then its dedicated controllers.
    pub fn cluster_nodes(&self) -> Vec<Node> {
        self.nodes.iter().chain(self.controllers).cloned().collect()
    }

    /// The client side of cluster `name`.
    pub fn cluster(&self, name: &str) -> Option<&ClientContext> {
        self.clusters.iter().find(|c| c.cluster == name)
    }
}

/// Performs fault ops.
///
/// Contract:
/// - [`invoke`](Nemesis::invoke) performs one op named by [`fs`](Nemesis::fs), blocking until it
///   is in force, and completes `info` with a value that records what was actually done
///   (resolved nodes, the grudge, leaders chosen), so a replay can do exactly the same.
/// - [`generator`](Nemesis::generator) is its schedule for the main phase; the runner restricts
///   it to the nemesis worker.
/// - [`heal_ops`](Nemesis::heal_ops) undo the faults of its own that the engine's [`heal_ops`]
///   cannot (clock skew, packet loss); the final phase performs them through `invoke`, before
///   the engine's, whatever happened in the main phase.
/// - [`settle_ops`](Nemesis::settle_ops) bring the system to the steady state the final reads
///   expect once everything is healed and serving (a mirror running in a steady direction,
///   caught up); the final phase performs them through `invoke` after healing.
/// - `invoke` runs on a blocking thread of the runner's tokio runtime, so it may block on async
///   work with [`tokio::runtime::Handle::current`].
pub trait Nemesis: Send + Sync {
    /// The ops this nemesis understands.
    fn fs(&self) -> Vec<&'static str>;

    /// Performs `op`.
    fn invoke(&self, cx: &NemesisContext<'_>, op: &Invocation) -> Completion;

    /// The fault schedule.
    fn generator(&self) -> Box<dyn Generator>;

    /// Ops that undo this nemesis's own faults in the final phase.
    fn heal_ops(&self) -> Vec<Invocation> {
        Vec::new()
    }

    /// Ops that settle the system after healing, before the final reads.
    fn settle_ops(&self) -> Vec<Invocation> {
        Vec::new()
    }

    /// What test.json records about the nemesis (fault kinds, interval, targets).
    fn describe(&self) -> Value {
        Value::Null
    }
}

/// The final phase's healing as nemesis ops: heal the network, resume paused nodes, start
/// stopped ones (the last two only when the database can pause and kill).
pub fn heal_ops(cx: &NemesisContext<'_>) -> Vec<Invocation> {
    let every = cx.cluster_nodes();
    let nodes = json!({ "nodes": every.iter().map(|n| n.name.clone()).collect::<Vec<_>>() });
    let mut ops = vec![Invocation {
        f: "stop-partition".into(),
        value: json!({}),
    }];
    if cx.db.as_pause().is_some() {
        ops.push(Invocation {
            f: "resume".into(),
            value: nodes.clone(),
        });
    }
    if cx.db.as_kill().is_some() {
        ops.push(Invocation {
            f: "start".into(),
            value: nodes,
        });
    }
    ops
}

/// Performs one op of [`heal_ops`] on every node; completes `info` with what was done and the
/// errors, if any.
pub fn heal(cx: &NemesisContext<'_>, op: &Invocation) -> Completion {
    let mut errors: Vec<String> = Vec::new();
    let every = cx.cluster_nodes();
    match op.f.as_str() {
        "stop-partition" => {
            if let Err(e) = cx.net.heal(&every) {
                errors.push(format!("{e:#}"));
            }
        }
        "resume" => {
            if let Some(pause) = cx.db.as_pause() {
                errors.extend(
                    every.iter().filter_map(|n| {
                        pause.resume(n).err().map(|e| format!("{}: {e:#}", n.name))
                    }),
                );
            }
        }
        "start" => {
            if let Some(kill) = cx.db.as_kill() {
                errors.extend(
                    every
                        .iter()
                        .filter_map(|n| kill.start(n).err().map(|e| format!("{}: {e:#}", n.name))),
                );
            }
        }
        other => errors.push(format!("{other} is not a healing op")),
    }
    let mut done = Completion::new(Outcome::Info, op.value.clone());
    if !errors.is_empty() {
        done.error = Some(errors.join("; "));
    }
    done
}
