//! Clients and workloads. A [`Client`] is one logical process's view of the cluster and performs
//! one op at a time; a [`Workload`] bundles what a kind of test needs: how to prepare the
//! database, how to open clients, the schedule of ops, the final reads, and how to check.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::dial::Dialer;
use crate::generator::Generator;
use crate::op::{Completion, Invocation};
use crate::runtime::Node;

/// Where a client can reach one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddr {
    /// Node name.
    pub name: String,
    /// Cluster name.
    pub cluster: String,
    /// The broker's node id.
    pub id: u32,
    /// Client address.
    pub addr: SocketAddr,
}

/// Everything the clients of one cluster share: its nodes, how to dial them and the per-request
/// timeout. Each cluster of a test has its own.
#[derive(Clone)]
pub struct ClientContext {
    /// The cluster.
    pub cluster: String,
    /// Every node of the cluster.
    pub nodes: Vec<NodeAddr>,
    /// Opens connections from the harness to nodes.
    pub dialer: Arc<dyn Dialer>,
    /// The longest any single request may take before its op ends `info`.
    pub timeout: Duration,
}

impl ClientContext {
    /// The context for the cluster of `nodes` (all of one cluster, not empty), each reached at
    /// `endpoint(node)` (the database's [`endpoint`](crate::db::Db::endpoint)), dialed through
    /// `dialer`, with `timeout` per request.
    pub fn new(
        nodes: &[Node],
        endpoint: impl Fn(&Node) -> SocketAddr,
        dialer: Arc<dyn Dialer>,
        timeout: Duration,
    ) -> Self {
        let cluster = nodes.first().map(|n| n.cluster.clone()).unwrap_or_default();
        assert!(
            nodes.iter().all(|n| n.cluster == cluster),
            "a client context is for the nodes of one cluster"
        );
        ClientContext {
            cluster,
            nodes: nodes
                .iter()
                .map(|n| NodeAddr {
                    name: n.name.clone(),
                    cluster: n.cluster.clone(),
                    id: n.id,
                    addr: endpoint(n),
                })
                .collect(),
            dialer,
            timeout,
        }
    }

    /// The node of this cluster with broker id `id` (ids are only unique within a cluster).
    pub fn node_by_id(&self, id: i32) -> Option<&NodeAddr> {
        self.nodes.iter().find(|n| n.id as i32 == id)
    }
}

/// One logical process's client.
///
/// Contract (Jepsen's `Client`):
/// - [`invoke`](Client::invoke) performs one op and completes `ok` only if it took effect,
///   `fail` only if it certainly did not, and `info` when unsure (timeouts, lost connections,
///   errors that do not prove failure). It never retries behind the caller's back and returns
///   within a bounded time.
/// - The runner calls `invoke` for one op at a time; after an `info` it drops the client and opens
///   a new one for a new process. Dropping a client closes its connections.
pub trait Client: Send {
    /// Performs `op`.
    fn invoke<'a>(&'a mut self, op: &'a Invocation) -> BoxFuture<'a, Completion>;
}

/// What a workload's setup may use: every cluster's client side (the workload's own cluster
/// first) and the database's abilities (e.g. [`Mirror`](crate::db::Mirror)).
pub struct SetupContext<'a> {
    /// Every cluster, the workload's first.
    pub clusters: &'a [ClientContext],
    /// The database.
    pub db: &'a dyn Db,
}

/// A kind of test.
///
/// Contract:
/// - [`setup`](Workload::setup) prepares the database once all nodes serve (e.g. creates topics)
///   and returns once every node agrees the preparation is visible, or an error.
/// - [`open`](Workload::open) makes a client for a fresh process bound to node index `node` of
///   the first of `clusters` (the workload's own; a workload of several clusters, such as
///   mirroring, may use the others too); it must not block (connections are made on first use).
/// - A client op is recorded with the cluster its invocation value names (`"cluster": "b"`),
///   else with the workload's cluster; the generator chooses it.
/// - [`generator`](Workload::generator) is the main phase's client schedule, run under the test's
///   time limit and rate by the runner. [`final_generator`](Workload::final_generator) runs after
///   every fault is healed, with fresh processes, to read everything back.
///
/// The verdict is not the workload's to choose: the checkers crate picks the checker from the
/// `workload` name the history header records ([`tidemark_checkers::check_run`]).
pub trait Workload: Send + Sync {
    /// Name, e.g. `queue`.
    fn name(&self) -> &'static str;

    /// The workload's resolved options, for test.json.
    fn options(&self) -> Value;

    /// Prepares the database.
    fn setup<'a>(&'a self, cx: SetupContext<'a>) -> BoxFuture<'a, anyhow::Result<()>>;

    /// Opens a client for a new process talking first to node `node` of the first cluster.
    fn open(&self, clusters: &[ClientContext], node: usize) -> Box<dyn Client>;

    /// The main phase's client ops.
    fn generator(&self) -> Box<dyn Generator>;

    /// The final reads, after healing.
    fn final_generator(&self) -> Box<dyn Generator>;
}
