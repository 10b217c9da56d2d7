//! A test: the options a person chose (plain, serializable data that goes to `test.json` and the
//! history header) and the parts that carry it out (runtime, database, network, workload,
//! nemesis).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::db::Db;
use crate::nemesis::Nemesis;
use crate::net::Net;
use crate::runtime::{Node, NodeRecord, Runtime};
use crate::workload::Workload;

/// Everything about a test that is chosen rather than built.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestOptions {
    /// The test's name: the store directory under `store/`.
    pub name: String,
    /// Seeds every random choice of the schedule.
    pub seed: u64,
    /// Number of broker nodes of each cluster.
    pub nodes: usize,
    /// Dedicated controller nodes of each cluster; 0: every node is both broker and controller
    /// (KRaft's combined mode).
    #[serde(default)]
    pub controllers: usize,
    /// The clusters' names, each an independent cluster with its own controller quorum; the
    /// workload and, by default, the faults act on the first.
    #[serde(default = "one_cluster")]
    pub clusters: Vec<String>,
    /// Number of client workers.
    pub concurrency: usize,
    /// Length of the main phase.
    pub time_limit: Duration,
    /// Client ops per second over all workers (0 = as fast as the workers go).
    pub rate: f64,
    /// Fault kinds, empty for none.
    pub nemesis: Vec<String>,
    /// The runtime's name.
    pub runtime: String,
    /// The store directory.
    pub store: PathBuf,
    /// The longest one client op may take before it ends `info`.
    pub op_timeout: Duration,
    /// How long nodes get to start serving.
    pub ready_timeout: Duration,
    /// How long replicas get to converge after healing.
    pub converge_timeout: Duration,
    /// How long the final reads may take.
    pub final_timeout: Duration,
    /// The command line, for the record.
    pub argv: Vec<String>,
    /// The run directory this run was shrunk from (`tidemark shrink`), for the record and for
    /// the results browser, which lists a shrunk run under its original.
    pub shrunk_from: Option<PathBuf>,
    /// The anomaly type the shrink kept (with `shrunk_from`): what a replay of it asks about.
    pub shrunk_keeping: Option<String>,
}

impl TestOptions {
    /// Names of the nodes of `cluster`, by [`node_names`].
    pub fn node_names(&self, cluster: &str) -> Vec<String> {
        node_names(&self.clusters, cluster, self.nodes)
    }

    /// Names of the dedicated controllers of `cluster`, by [`controller_names`].
    pub fn controller_names(&self, cluster: &str) -> Vec<String> {
        controller_names(&self.clusters, cluster, self.controllers)
    }

    /// The cluster the workload runs against: the first.
    pub fn workload_cluster(&self) -> &str {
        self.clusters.first().map_or("a", String::as_str)
    }
}

fn one_cluster() -> Vec<String> {
    cluster_names(1)
}

/// The names of `n` clusters: `a`, `b`, ... (at most 26).
pub fn cluster_names(n: usize) -> Vec<String> {
    (b'a'..=b'z')
        .take(n)
        .map(|c| char::from(c).to_string())
        .collect()
}

/// Checks a cluster name: lowercase ASCII letters only, so that a node name (the cluster's name
/// and a number) tells its cluster without doubt.
pub fn check_cluster_name(name: &str) -> Result<(), String> {
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(format!(
            "cluster name {name:?} must be lowercase letters a-z only"
        ));
    }
    Ok(())
}

/// Names of the `nodes` nodes of `cluster` among `clusters`: `n1`, `n2`, ... when there is one
/// cluster (as every single-cluster run and recorded schedule names them), else the cluster's
/// name and the node's number, `a1`, `a2`, ..., `b1`, ...
pub fn node_names(clusters: &[String], cluster: &str, nodes: usize) -> Vec<String> {
    let prefix = if clusters.len() > 1 { cluster } else { "n" };
    (1..=nodes).map(|i| format!("{prefix}{i}")).collect()
}

/// Names of the `controllers` dedicated controllers of `cluster` among `clusters`: `c1`, `c2`,
/// ... when there is one cluster, else the cluster's name, a dash and those, `a-c1`, ... (a dash,
/// since cluster names are letters and `ac1` could be a broker of cluster `ac`).
pub fn controller_names(clusters: &[String], cluster: &str, controllers: usize) -> Vec<String> {
    let prefix = if clusters.len() > 1 {
        format!("{cluster}-c")
    } else {
        "c".to_string()
    };
    (1..=controllers).map(|i| format!("{prefix}{i}")).collect()
}

/// The parts that carry a test out.
pub struct Test {
    /// The chosen options.
    pub options: TestOptions,
    /// Makes the nodes.
    pub runtime: Box<dyn Runtime>,
    /// The database.
    pub db: Arc<dyn Db>,
    /// The network.
    pub net: Arc<dyn Net>,
    /// The workload.
    pub workload: Arc<dyn Workload>,
    /// The nemesis, when faults are wanted.
    pub nemesis: Option<Arc<dyn Nemesis>>,
}

impl Test {
    /// A node as `test.json` lists it, with its client listener's port (where followers fetch
    /// too: what tells a cut on ports that stops replication from one that does not).
    fn node_record(&self, node: &Node) -> Value {
        let mut record = json!(NodeRecord::from(node));
        record["port"] = json!(self.db.endpoint(node).port());
        record
    }

    /// The resolved test as `test.json` and the history header record it.
    pub fn describe(&self, nodes: &[Node]) -> Value {
        let o = &self.options;
        let mut clusters: Vec<&str> = nodes.iter().map(|n| n.cluster.as_str()).collect();
        clusters.dedup();
        let broker = self.db.describe();
        json!({
            "name": o.name,
            "seed": o.seed,
            "rng": "rand 0.10 ChaCha8Rng",
            "tidemark_version": env!("CARGO_PKG_VERSION"),
            "workload": self.workload.name(),
            "workload_options": self.workload.options(),
            "nemesis": o.nemesis,
            "controllers": o.controllers,
            "nemesis_options": self.nemesis.as_ref().map(|n| n.describe()),
            "nodes": nodes.iter().map(|n| self.node_record(n)).collect::<Vec<_>>(),
            "clusters": clusters,
            "workload_cluster": o.workload_cluster(),
            "broker": broker,
            "broker_config": broker.get("properties").cloned().unwrap_or(Value::Null),
            "runtime": self.runtime.describe(),
            "concurrency": o.concurrency,
            "time_limit_s": o.time_limit.as_secs_f64(),
            "rate": o.rate,
            "op_timeout_ms": o.op_timeout.as_millis() as u64,
            "converge_timeout_s": o.converge_timeout.as_secs_f64(),
            "final_timeout_s": o.final_timeout.as_secs_f64(),
            "argv": o.argv,
            "shrunk_from": o.shrunk_from,
            "shrunk_keeping": o.shrunk_keeping,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cluster_keeps_n_names_and_several_are_told_apart_by_name() {
        let one = cluster_names(1);
        assert_eq!(one, ["a"]);
        assert_eq!(node_names(&one, "a", 3), ["n1", "n2", "n3"]);
        let two = cluster_names(2);
        assert_eq!(two, ["a", "b"]);
        assert_eq!(node_names(&two, "a", 3), ["a1", "a2", "a3"]);
        assert_eq!(node_names(&two, "b", 2), ["b1", "b2"]);
        assert_eq!(controller_names(&one, "a", 3), ["c1", "c2", "c3"]);
        assert_eq!(controller_names(&two, "b", 1), ["b-c1"]);
        assert!(controller_names(&two, "b", 0).is_empty());
        assert!(check_cluster_name("b").is_ok());
        for bad in ["", "b1", "B", "a-b"] {
            let e = check_cluster_name(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
