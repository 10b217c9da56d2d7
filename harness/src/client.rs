//! Clients: a [`Client`] is one logical process's view of the cluster and performs one op at a
//! time; [`ClientContext`] is what the clients of one cluster share. Workloads, which also need
//! the database, are in [`crate::workload`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::dial::Dialer;
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
