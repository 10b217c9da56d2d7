//! Faults. A [`Nemesis`] performs fault ops on the nodes through the [`Db`] and [`Net`]
//! abilities; fault kinds and their schedules live in the `tidemark-nemesis` crate. This module
//! also holds [`heal_everything`], the final phase's "undo every fault", which works whatever
//! faults ran because it only uses the abilities themselves.

use serde_json::json;

use crate::db::Db;
use crate::generator::Generator;
use crate::net::Net;
use crate::op::{Completion, Invocation, Outcome};
use crate::runtime::Node;

/// What a nemesis may act on.
pub struct NemesisContext<'a> {
    /// Every node.
    pub nodes: &'a [Node],
    /// The database, with its optional abilities.
    pub db: &'a dyn Db,
    /// The network.
    pub net: &'a dyn Net,
}

/// Performs fault ops.
///
/// Contract:
/// - [`invoke`](Nemesis::invoke) performs one op named by [`fs`](Nemesis::fs), blocking until it
///   is in force, and completes `info` with a value that records what was actually done
///   (resolved nodes, the grudge, leaders chosen), so a replay can do exactly the same.
/// - [`generator`](Nemesis::generator) is its schedule for the main phase; the runner restricts
///   it to the nemesis worker.
pub trait Nemesis: Send + Sync {
    /// The ops this nemesis understands.
    fn fs(&self) -> Vec<&'static str>;

    /// Performs `op`.
    fn invoke(&self, cx: &NemesisContext<'_>, op: &Invocation) -> Completion;

    /// The fault schedule.
    fn generator(&self) -> Box<dyn Generator>;
}

/// Heals the network, resumes paused nodes and starts stopped ones. Returns, for the history,
/// each step as a nemesis op and how it went.
pub fn heal_everything(cx: &NemesisContext<'_>) -> Vec<(Invocation, Completion)> {
    let mut steps = Vec::new();
    let partition = Invocation {
        f: "stop-partition".into(),
        value: json!({}),
    };
    let done = match cx.net.heal(cx.nodes) {
        Ok(()) => Completion::new(Outcome::Info, json!({})),
        Err(e) => Completion {
            error: Some(format!("{e:#}")),
            ..Completion::new(Outcome::Info, json!({}))
        },
    };
    steps.push((partition, done));
    let names: Vec<String> = cx.nodes.iter().map(|n| n.name.clone()).collect();
    if let Some(pause) = cx.db.as_pause() {
        let errors: Vec<String> = cx
            .nodes
            .iter()
            .filter_map(|n| pause.resume(n).err().map(|e| format!("{}: {e:#}", n.name)))
            .collect();
        steps.push(step("resume", &names, errors));
    }
    if let Some(kill) = cx.db.as_kill() {
        let errors: Vec<String> = cx
            .nodes
            .iter()
            .filter_map(|n| kill.start(n).err().map(|e| format!("{}: {e:#}", n.name)))
            .collect();
        steps.push(step("start", &names, errors));
    }
    steps
}

fn step(f: &str, nodes: &[String], errors: Vec<String>) -> (Invocation, Completion) {
    let value = json!({ "nodes": nodes });
    let mut done = Completion::new(Outcome::Info, value.clone());
    if !errors.is_empty() {
        done.error = Some(errors.join("; "));
    }
    (
        Invocation {
            f: f.to_string(),
            value,
        },
        done,
    )
}
