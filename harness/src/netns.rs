//! The embedded runtime: one network namespace per node on this machine, with no VMs and no
//! containers. The namespaces hang off a bridge that itself lives in a namespace, and the
//! harness's clients connect from one more namespace on that bridge, so the root namespace's
//! interfaces and firewall are never touched and every packet stays inside namespaces this run
//! created. Partitions are iptables rules inside the node namespaces.
//!
//! Layout for run `R` (addresses only ever assigned inside these namespaces):
//!
//! ```text
//! tdm-R-sw    bridge br0, one port p-<member> per member
//! tdm-R-ctl   eth0 10.211.0.2/24   the harness's client sockets
//! tdm-R-n1    eth0 10.211.0.11/24  broker n1
//! tdm-R-n2    eth0 10.211.0.12/24  broker n2 ...
//! ```
//!
//! Several clusters share the bridge, each in its own block of 50 addresses ([`node_address`]):
//! the first cluster's nodes from .11 (`a1`, `a2`, ...), the second's from .61 (`b1`, ...),
//! and so on; they can reach each other, as mirroring needs, but each runs its own quorum.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context as _};

use crate::dial::{Dialer, FromNetns};
use crate::leftovers::{self, Resources, RunState, PREFIX};
use crate::prerequisites::Requirement;
use crate::remote::Local;
use crate::runtime::{Node, NodeRole, Runtime};

/// The most nodes a one-cluster run may have (addresses .11 to .250).
pub const MAX_NODES: usize = 240;

/// The most nodes each cluster may have when there are several.
pub const MAX_CLUSTER_NODES: usize = 50;

/// The most clusters one run may have.
pub const MAX_CLUSTERS: usize = 4;

/// The address of node `node` (0-based) of the run's `cluster`th cluster (0-based): cluster `c`'s
/// block starts at 10.211.0.(11 + 50c). `None` past the last address or cluster. Only the first
/// cluster may run past its block, when it is the only one.
pub fn node_address(cluster: usize, node: usize) -> Option<Ipv4Addr> {
    let last = if cluster == 0 {
        MAX_NODES
    } else {
        MAX_CLUSTER_NODES
    };
    (cluster < MAX_CLUSTERS && node < last)
        .then(|| Ipv4Addr::new(10, 211, 0, (11 + MAX_CLUSTER_NODES * cluster + node) as u8))
}

/// Network namespaces on this machine.
pub struct NetnsRuntime {
    run: String,
    work_dir: PathBuf,
    state_dir: PathBuf,
    namespaces: Vec<String>,
    wrote_state: bool,
    /// The clusters made so far, in order, and the addresses their nodes took.
    clusters: Vec<(String, Vec<Ipv4Addr>)>,
}

impl NetnsRuntime {
    /// What this machine needs to build the namespaces and run commands in them.
    pub fn requirements() -> Vec<Requirement> {
        vec![Requirement::program("ip", "iproute2", "the netns runtime")]
    }

    /// A runtime for run `run` whose node directories live under `work_root/run`. Fails with a
    /// message that says what is needed when this process is not root.
    pub fn new(work_root: &std::path::Path, run: &str) -> anyhow::Result<Self> {
        if !leftovers::is_root() {
            bail!(
                "the netns runtime needs root: it creates network namespaces, veth pairs, a \
                 bridge and iptables rules (run tidemark as root, e.g. with sudo). It also needs \
                 iproute2 and iptables installed. Without root, run on machines you can reach \
                 over SSH instead: --runtime hosts --nodes-file FILE"
            );
        }
        Ok(NetnsRuntime {
            run: run.to_string(),
            work_dir: work_root.join(run),
            state_dir: leftovers::state_dir()?,
            namespaces: Vec::new(),
            wrote_state: false,
            clusters: Vec::new(),
        })
    }

    /// The namespace name for `what` (a node name, `sw` or `ctl`).
    pub fn namespace(&self, what: &str) -> String {
        format!("{PREFIX}{}-{what}", self.run)
    }

    fn ip(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .context("running ip (is iproute2 installed?)")?;
        if !out.status.success() {
            bail!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    fn add_namespace(&mut self, what: &str) -> anyhow::Result<String> {
        let ns = self.namespace(what);
        self.ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        self.ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Adds a member namespace with `ip` on the bridge.
    fn add_member(&mut self, what: &str, ip: Ipv4Addr) -> anyhow::Result<String> {
        let sw = self.namespace("sw");
        let ns = self.add_namespace(what)?;
        let port = format!("p-{what}");
        self.ip(&[
            "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        self.ip(&["-n", &sw, "link", "set", &port, "master", "br0"])?;
        self.ip(&["-n", &sw, "link", "set", &port, "up"])?;
        self.ip(&["-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
        self.ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        Ok(ns)
    }

    fn ensure_bridge(&mut self) -> anyhow::Result<()> {
        if !self.wrote_state {
            let made = Resources::Netns {
                work_dir: self.work_dir.clone(),
            };
            RunState::current(&self.run, made)?.write(&self.state_dir)?;
            self.wrote_state = true;
        }
        let sw = self.namespace("sw");
        if self.namespaces.contains(&sw) {
            return Ok(());
        }
        self.add_namespace("sw")?;
        self.ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        self.ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        self.add_member("ctl", Ipv4Addr::new(10, 211, 0, 2))?;
        Ok(())
    }
}

impl Runtime for NetnsRuntime {
    fn name(&self) -> &'static str {
        "netns"
    }

    fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "name": "netns",
            "run": self.run,
            "namespace_prefix": format!("{PREFIX}{}-", self.run),
            "work_dir": self.work_dir,
        })
    }

    fn create(&mut self, cluster: &str, names: &[String]) -> anyhow::Result<Vec<Node>> {
        if names.is_empty() || names.len() > MAX_NODES {
            bail!(
                "the netns runtime runs 1 to {MAX_NODES} nodes, not {}",
                names.len()
            );
        }
        if self.clusters.iter().any(|(c, _)| c == cluster) {
            bail!("cluster {cluster:?} was already created");
        }
        let index = self.clusters.len();
        let mut ips = Vec::with_capacity(names.len());
        for i in 0..names.len() {
            let ip = node_address(index, i)
                .filter(|ip| !self.clusters.iter().any(|(_, used)| used.contains(ip)));
            let Some(ip) = ip else {
                bail!(
                    "the netns runtime runs at most {MAX_CLUSTERS} clusters of at most \
                     {MAX_CLUSTER_NODES} nodes each when there are several; cluster {cluster:?} \
                     would be cluster {} with {} nodes (and the clusters before it have {:?})",
                    index + 1,
                    names.len(),
                    self.clusters
                        .iter()
                        .map(|(_, u)| u.len())
                        .collect::<Vec<_>>()
                );
            };
            ips.push(ip);
        }
        self.ensure_bridge()?;
        self.clusters.push((cluster.to_string(), ips.clone()));
        let mut nodes = Vec::with_capacity(names.len());
        for (i, (name, ip)) in names.iter().zip(ips).enumerate() {
            let ns = self.add_member(name, ip)?;
            let dir = self.work_dir.join(name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            nodes.push(Node {
                role: NodeRole::Combined,
                name: name.clone(),
                cluster: cluster.to_string(),
                id: i as u32 + 1,
                ip: IpAddr::V4(ip),
                dir,
                remote: Arc::new(Local::in_netns(ns)),
            });
        }
        Ok(nodes)
    }

    fn dialer(&self) -> Arc<dyn Dialer> {
        Arc::new(FromNetns::new(&self.namespace("ctl")))
    }

    fn destroy(&mut self) -> anyhow::Result<()> {
        leftovers::remove(&self.namespaces, Some(&self.work_dir))?;
        self.namespaces.clear();
        // The record goes last: if anything above failed, teardown finds the run by it.
        if self.wrote_state {
            RunState::remove(&self.state_dir, &self.run)?;
            self.wrote_state = false;
        }
        Ok(())
    }
}

impl Drop for NetnsRuntime {
    fn drop(&mut self) {
        // A panic or early return must not leave namespaces behind.
        if !self.namespaces.is_empty() || self.wrote_state {
            if let Err(e) = self.destroy() {
                eprintln!("tidemark: netns teardown: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_take_blocks_of_fifty_addresses() {
        let ip = |c, n| node_address(c, n).map(|a| a.to_string());
        assert_eq!(ip(0, 0).as_deref(), Some("10.211.0.11"));
        assert_eq!(ip(0, 2).as_deref(), Some("10.211.0.13"));
        assert_eq!(ip(1, 0).as_deref(), Some("10.211.0.61"));
        assert_eq!(ip(1, 2).as_deref(), Some("10.211.0.63"));
        assert_eq!(ip(3, 49).as_deref(), Some("10.211.0.210"));
        // A lone cluster may use every address up to .250; later clusters keep to their block.
        assert_eq!(ip(0, MAX_NODES - 1).as_deref(), Some("10.211.0.250"));
        assert_eq!(ip(0, MAX_NODES), None);
        assert_eq!(ip(1, MAX_CLUSTER_NODES), None);
        assert_eq!(ip(MAX_CLUSTERS, 0), None);
    }
}
