//! Where nodes come from. A [`Runtime`] makes the nodes of a test exist and hands back a
//! [`Node`] for each: a name, an address, a working directory and a [`Remote`] to drive it.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::dial::Dialer;
use crate::remote::Remote;

/// One node of a test, as the runtime made it.
#[derive(Clone)]
pub struct Node {
    /// Its name in histories and the store, e.g. `n1`.
    pub name: String,
    /// The cluster it belongs to, e.g. `a`.
    pub cluster: String,
    /// Its 1-based number within its cluster (the broker's `node.id`).
    pub id: u32,
    /// The address brokers and clients use to reach it.
    pub ip: IpAddr,
    /// A directory on the node that belongs to this test (binaries, config, data, logs).
    pub dir: PathBuf,
    /// How to run commands on it.
    pub remote: Arc<dyn Remote>,
    /// What it runs in its cluster.
    pub role: NodeRole,
}

/// What a node runs in its cluster: every node both roles (KRaft's combined mode), or dedicated
/// controllers beside broker-only nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeRole {
    Combined,
    Broker,
    Controller,
}

impl NodeRole {
    /// Whether clients, replicas and most faults see this node.
    pub fn is_broker(self) -> bool {
        self != NodeRole::Controller
    }

    /// Whether it votes in the cluster's controller quorum.
    pub fn is_voter(self) -> bool {
        self != NodeRole::Broker
    }

    fn is_combined(&self) -> bool {
        *self == NodeRole::Combined
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("name", &self.name)
            .field("cluster", &self.cluster)
            .field("id", &self.id)
            .field("ip", &self.ip)
            .field("dir", &self.dir)
            .field("remote", &self.remote.describe())
            .field("role", &self.role)
            .finish()
    }
}

/// What test.json records about a node.
#[derive(Debug, Clone, Serialize)]
pub struct NodeRecord {
    /// Name.
    pub name: String,
    /// Cluster.
    pub cluster: String,
    /// Broker node id.
    pub id: u32,
    /// Address.
    pub ip: IpAddr,
    /// How it is reached.
    pub remote: String,
    /// Its role when the cluster has dedicated controllers.
    #[serde(skip_serializing_if = "NodeRole::is_combined")]
    pub role: NodeRole,
}

impl From<&Node> for NodeRecord {
    fn from(n: &Node) -> Self {
        NodeRecord {
            name: n.name.clone(),
            cluster: n.cluster.clone(),
            id: n.id,
            ip: n.ip,
            remote: n.remote.describe(),
            role: n.role,
        }
    }
}

/// Makes nodes exist and removes them again.
///
/// Contract:
/// - [`create`](Runtime::create) makes one node per requested name, each with its own address and
///   an empty working directory, all able to reach each other, and returns them in request order.
///   If it fails part way, [`destroy`](Runtime::destroy) still removes what it made. A test calls
///   it once per cluster, in the test's order of clusters; the nodes of every cluster get
///   distinct names and addresses and can all reach each other.
/// - [`dialer`](Runtime::dialer) reaches every node's address from the harness.
/// - [`destroy`](Runtime::destroy) removes everything `create` made, including processes started
///   on the nodes, and may be called more than once; it reports the first error but always tries
///   every step.
/// - Every name a runtime creates on a shared machine carries a fixed prefix or the run id, and
///   before creating anything the runtime records its owner and what it will make in
///   [`crate::leftovers::state_dir`], so `tidemark teardown` can find what a killed run left.
pub trait Runtime: Send {
    /// The runtime's name as the CLI spells it, e.g. `netns`.
    fn name(&self) -> &'static str;

    /// What test.json records about the runtime (its name and the names it created).
    fn describe(&self) -> serde_json::Value;

    /// Creates the nodes named `names` in `cluster`, numbered 1, 2, ... within it.
    fn create(&mut self, cluster: &str, names: &[String]) -> anyhow::Result<Vec<Node>>;

    /// Opens connections from the harness to the nodes.
    fn dialer(&self) -> Arc<dyn Dialer>;

    /// Removes the nodes and everything on them.
    fn destroy(&mut self) -> anyhow::Result<()>;
}
