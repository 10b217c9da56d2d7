//! Cutting and healing links between nodes. A [`Grudge`] says, for each node, which nodes it
//! drops traffic from (so asymmetric partitions are expressible, as in Jepsen); [`Iptables`]
//! applies one with rules inside each node, in a chain of its own so healing never touches rules
//! that are not ours.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context as _;

use crate::prerequisites::Requirement;
use crate::remote::{self, command_line};
use crate::runtime::Node;

/// For each node, the nodes whose packets it drops.
pub type Grudge = BTreeMap<String, BTreeSet<String>>;

/// The iptables chain that holds every rule the harness adds.
pub const CHAIN: &str = "TIDEMARK";

/// The nftables table (family `inet`) that holds every nftables rule the nemeses add (packet
/// loss, controller fencing); deleting it removes them all.
pub const NFT_TABLE: &str = "tidemark";

/// Changes the network between nodes.
///
/// Contract:
/// - [`drop_on_ports`](Net::drop_on_ports) makes each node in the grudge drop every packet from
///   each node it holds a grudge against, or with `ports` only those to or from one of them (a
///   service's listeners: the brokers' replication cut while the controllers' quorum still
///   talks), adding to faults already in force; nodes absent from the grudge are left as they
///   are. Traffic between the harness's clients and the nodes is unaffected unless a grudge
///   names it.
/// - [`heal`](Net::heal) removes every fault this `Net` applied on the given nodes and nothing
///   else. Healing a healed network is fine.
/// - Both return once the rules are in force on every node, or the first error.
pub trait Net: Send + Sync {
    /// Applies a whole grudge to all traffic.
    fn drop_all(&self, nodes: &[Node], grudge: &Grudge) -> anyhow::Result<()> {
        self.drop_on_ports(nodes, grudge, &[])
    }

    /// Applies a whole grudge to traffic to or from `ports` (all traffic when empty).
    fn drop_on_ports(&self, nodes: &[Node], grudge: &Grudge, ports: &[u16]) -> anyhow::Result<()>;

    /// Removes all faults on `nodes`.
    fn heal(&self, nodes: &[Node]) -> anyhow::Result<()>;
}

/// Partitions with iptables on each node (inbound drops, like Jepsen's `net/iptables`).
#[derive(Debug, Clone, Default)]
pub struct Iptables;

impl Iptables {
    /// What the nodes need for these partitions.
    pub fn requirements() -> Vec<Requirement> {
        vec![Requirement::program(
            "iptables",
            "iptables",
            "network partitions",
        )]
    }

    /// The shell command that makes `CHAIN` exist, hooked first in INPUT, and empty.
    pub fn reset_command() -> String {
        format!(
            "iptables -w -N {CHAIN} 2>/dev/null; \
             iptables -w -C INPUT -j {CHAIN} 2>/dev/null || iptables -w -I INPUT 1 -j {CHAIN}; \
             iptables -w -F {CHAIN}"
        )
    }

    /// The commands that make `node` drop traffic from `from` (after [`reset_command`]), only
    /// that to or from `ports` when there are any.
    ///
    /// [`reset_command`]: Iptables::reset_command
    pub fn drop_commands(
        nodes: &[Node],
        from: &BTreeSet<String>,
        ports: &[u16],
    ) -> anyhow::Result<Vec<String>> {
        let mut ips = Vec::new();
        for name in from {
            let n = nodes
                .iter()
                .find(|n| &n.name == name)
                .with_context(|| format!("grudge names unknown node {name}"))?;
            ips.push(n.ip.to_string());
        }
        if ips.is_empty() {
            return Ok(Vec::new());
        }
        let sources = ips.join(",");
        let mut words = vec!["iptables", "-w", "-A", CHAIN, "-s", &sources];
        // `--ports` matches either end: requests to the node's listeners and answers from its
        // peers' listeners.
        let port_list = ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        if !ports.is_empty() {
            words.extend(["-p", "tcp", "-m", "multiport", "--ports", &port_list]);
        }
        words.extend(["-j", "DROP"]);
        Ok(vec![command_line(&words)])
    }
}

impl Net for Iptables {
    fn drop_on_ports(&self, nodes: &[Node], grudge: &Grudge, ports: &[u16]) -> anyhow::Result<()> {
        for (name, from) in grudge {
            let node = nodes
                .iter()
                .find(|n| &n.name == name)
                .with_context(|| format!("grudge names unknown node {name}"))?;
            let mut script = vec![format!(
                "iptables -w -N {CHAIN} 2>/dev/null; \
                 iptables -w -C INPUT -j {CHAIN} 2>/dev/null || iptables -w -I INPUT 1 -j {CHAIN}"
            )];
            script.extend(Self::drop_commands(nodes, from, ports)?);
            remote::run(node.remote.as_ref(), &script.join(" && "))?;
        }
        Ok(())
    }

    fn heal(&self, nodes: &[Node]) -> anyhow::Result<()> {
        for node in nodes {
            remote::run(node.remote.as_ref(), &Self::reset_command())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Local;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    fn node(i: u8) -> Node {
        Node {
            role: crate::runtime::NodeRole::Combined,
            name: format!("n{i}"),
            cluster: "a".into(),
            id: i as u32,
            ip: IpAddr::V4(Ipv4Addr::new(10, 211, 0, 10 + i)),
            dir: "/tmp".into(),
            remote: Arc::new(Local::host()),
        }
    }

    #[test]
    fn a_grudge_becomes_one_inbound_drop_rule_per_node() {
        let nodes = [node(1), node(2), node(3)];
        let from: BTreeSet<String> = ["n2".to_string(), "n3".to_string()].into();
        assert_eq!(
            Iptables::drop_commands(&nodes, &from, &[]).unwrap(),
            vec!["iptables -w -A TIDEMARK -s 10.211.0.12,10.211.0.13 -j DROP".to_string()]
        );
        assert_eq!(
            Iptables::drop_commands(&nodes, &from, &[9092, 9093]).unwrap(),
            vec![
                "iptables -w -A TIDEMARK -s 10.211.0.12,10.211.0.13 -p tcp -m multiport \
                  --ports 9092,9093 -j DROP"
                    .to_string()
            ]
        );
        assert!(Iptables::drop_commands(&nodes, &BTreeSet::new(), &[])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn unknown_nodes_in_a_grudge_are_errors() {
        let nodes = [node(1)];
        let from: BTreeSet<String> = ["n9".to_string()].into();
        let err = Iptables::drop_commands(&nodes, &from, &[]).unwrap_err();
        assert!(err.to_string().contains("n9"), "{err}");
    }

    #[test]
    fn heal_only_flushes_our_chain() {
        let cmd = Iptables::reset_command();
        assert!(cmd.contains("-F TIDEMARK"));
        assert!(!cmd.contains("-F INPUT"));
    }
}
