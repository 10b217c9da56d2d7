//! The shape of a fault kind: the ops it performs, how it parses an op (checking a schedule file's
//! op is parsing it), and how a parsed op is performed. Every op's value may be a spec still to
//! resolve (`"targets": "minority"`) or the resolved record an earlier `info` wrote, so a recorded
//! history replays.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tidemark_harness::db::Kill;
use tidemark_harness::generator::Rng;
use tidemark_harness::nemesis::NemesisContext;
use tidemark_harness::runtime::Node;

use crate::cluster::ClusterView;
use crate::targets::Targets;

/// What a fault op may act on: the engine's context and the nemesis's seeded RNG.
pub struct Env<'a> {
    /// Nodes, database, network and client side.
    pub cx: &'a NemesisContext<'a>,
    /// Draws for resolving specs (seeded from the test's seed).
    pub rng: &'a mut Rng,
    /// The nodes leading some partition when a leader spec was last resolved, for the record.
    pub leaders: Option<BTreeSet<String>>,
}

impl<'a> Env<'a> {
    /// The database's kill ability, or the error saying it has none.
    pub fn kill(&self) -> Result<&'a dyn Kill, Failed> {
        self.cx
            .db
            .as_kill()
            .ok_or_else(|| Failed::nothing("the database cannot be killed"))
    }

    /// Whether `names` hold every node of some cluster: a power loss of them all is a whole
    /// cluster's, which only per-message flush survives.
    pub fn covers_a_cluster(&self, names: &[String]) -> bool {
        self.cx.nodes.iter().any(|c| {
            self.cx
                .nodes
                .iter()
                .filter(|n| n.cluster == c.cluster)
                .all(|n| names.contains(&n.name))
        })
    }

    /// Every node's name, in order.
    pub fn names(&self) -> Vec<String> {
        self.cx.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The addresses of every node but `name`: whom a fault on `name`'s traffic is about.
    pub fn peers_of(&self, name: &str) -> Vec<std::net::IpAddr> {
        self.cx
            .nodes
            .iter()
            .filter(|p| p.name != name)
            .map(|p| p.ip)
            .collect()
    }

    /// The ports of the nodes' client listeners, where brokers also fetch from each other: the
    /// controllers' quorum and heartbeats keep ports of their own.
    pub fn listener_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .cx
            .nodes
            .iter()
            .map(|n| self.cx.db.endpoint(n).port())
            .collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// The ports of the nodes' controller listeners (the metadata quorum and the brokers'
    /// heartbeats), or the error saying the database has none apart from its clients'.
    pub fn control_ports(&self) -> Result<Vec<u16>, Failed> {
        let mut ports = Vec::new();
        for n in self.cx.nodes.iter().chain(self.cx.controllers) {
            let Some(at) = self.cx.db.control_endpoint(n) else {
                return Err(Failed::nothing(
                    "the database has no controller listener apart from its clients' to cut",
                ));
            };
            ports.push(at.port());
        }
        ports.sort_unstable();
        ports.dedup();
        Ok(ports)
    }

    /// Every node's name, dedicated controllers included: what a fault may name.
    pub fn every_name(&self) -> Vec<String> {
        self.cx
            .nodes
            .iter()
            .chain(self.cx.controllers)
            .map(|n| n.name.clone())
            .collect()
    }

    /// The node called `name`, a broker or a dedicated controller.
    pub fn node(&self, name: &str) -> Result<&Node, Failed> {
        self.cx
            .nodes
            .iter()
            .chain(self.cx.controllers)
            .find(|n| n.name == name)
            .ok_or_else(|| Failed::nothing(format!("no node {name}")))
    }

    /// Resolves `targets`, reading the cluster only when the spec needs leaders.
    pub fn resolve(&mut self, targets: &Targets) -> Result<Vec<String>, Failed> {
        let view = if targets.needs_leaders() {
            let mut view = ClusterView::read(self.cx).map_err(Failed::from_error)?;
            if targets.needs_controller() {
                view.controller = crate::cluster::active_controller(self.cx);
            }
            self.leaders = Some(view.leaders());
            Some(view)
        } else {
            None
        };
        let names = self.names();
        targets
            .resolve(&names, view.as_ref(), self.rng)
            .map_err(Failed::nothing)
    }

    /// Runs `f` on each named node at once (faults on several nodes start together) and returns
    /// the names it succeeded on and the errors of the others.
    pub fn on_each<F>(&self, names: &[String], f: F) -> (Vec<String>, Vec<String>)
    where
        F: Fn(&Node) -> anyhow::Result<()> + Sync,
    {
        let results: Vec<(String, anyhow::Result<()>)> = std::thread::scope(|s| {
            let handles: Vec<_> = names
                .iter()
                .map(|name| {
                    let f = &f;
                    s.spawn(move || {
                        let r = self
                            .node(name)
                            .map_err(|e| anyhow::anyhow!(e.error))
                            .and_then(f);
                        (name.clone(), r)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| (String::new(), Err(anyhow::anyhow!("panicked"))))
                })
                .collect()
        });
        let mut done = Vec::new();
        let mut errors = Vec::new();
        for (name, r) in results {
            match r {
                Ok(()) => done.push(name),
                Err(e) => errors.push(format!("{name}: {e:#}")),
            }
        }
        (done, errors)
    }
}

/// A fault op that did not (fully) happen: the record of what was done, and why not the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct Failed {
    /// The `info` value: what was actually done.
    pub done: Value,
    /// Why the op fell short.
    pub error: String,
}

impl Failed {
    /// Nothing was done.
    pub fn nothing(error: impl Into<String>) -> Self {
        Failed {
            done: json!({}),
            error: error.into(),
        }
    }

    /// Nothing was done, because of `e`.
    pub fn from_error(e: anyhow::Error) -> Self {
        Self::nothing(format!("{e:#}"))
    }

    /// Part was done (`done`); `errors` say what was not.
    pub fn partly(done: Value, errors: &[String]) -> Result<Value, Self> {
        if errors.is_empty() {
            Ok(done)
        } else {
            Err(Failed {
                done,
                error: errors.join("; "),
            })
        }
    }
}

/// One kind of fault: the ops it performs.
///
/// Contract:
/// - [`fs`](Fault::fs) lists its ops; no two fault kinds share one.
/// - [`parse`](Fault::parse) accepts every value its ops accept and the value of every `info`
///   they write, given the test's node names; errors name the offending field.
/// - A parsed op's [`invoke`](FaultOp::invoke) performs it, blocking until it is in force, and
///   returns the `info` value that records what was actually done (resolved nodes, grudge,
///   offsets, files, elected replica) such that parsing and invoking that value again does the
///   same thing. When it falls short it says what it did do.
pub trait Fault: Send + Sync {
    /// Its ops.
    fn fs(&self) -> &'static [&'static str];

    /// Parses op `f`'s value for a test of `nodes`.
    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String>;
}

/// A parsed fault op, ready to perform.
pub trait FaultOp: Send {
    /// Performs the op.
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed>;
}

/// Parses an op's value (absent reads as `{}`) as `T`; errors name the field.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, String> {
    let empty = Value::Object(Default::default());
    let value = if value.is_null() { &empty } else { value };
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        if path == "." {
            e.inner().to_string()
        } else {
            format!("field `{path}`: {}", e.inner())
        }
    })
}

/// The fault kinds, shared so a nemesis and its schedules route ops the same way.
pub type Faults = Vec<Arc<dyn Fault>>;
