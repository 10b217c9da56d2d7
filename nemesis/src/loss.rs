//! Packet loss (and, where the kernel has netem, delay) between nodes. `start-loss` makes each
//! target node drop a random share of the packets it exchanges with the other nodes; traffic
//! with the harness's clients is untouched, as with partitions. `stop-loss` removes it.
//!
//! Where `tc qdisc … netem` works it is used (loss and delay, on the node's interface toward its
//! peers). This machine's kernel has no netem, so the fallback is nftables random drop
//! (`numgen random mod 1000 < k`) in base chains of the table [`NFT_TABLE`], inbound from and
//! outbound to the peers; delay cannot be emulated that way and is recorded as skipped.

use std::net::IpAddr;

use rand::seq::IndexedRandom;
use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_harness::net::NFT_TABLE;
use tidemark_harness::remote::{self, escape};
use tidemark_harness::runtime::Node;

use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{NodeSpec, TargetFields, Targets};

/// The loss fault.
pub struct Loss;

/// Shares of packets the generated faults drop.
const PROBABILITIES: [f64; 4] = [0.05, 0.1, 0.2, 0.3];

/// How a node's loss is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `tc qdisc netem`.
    Netem,
    /// nftables random drop.
    Nftables,
}

/// The commands that make `node` drop `probability` of its traffic with `peers` (nftables).
pub fn nft_commands(peers: &[IpAddr], probability: f64) -> String {
    let per_mille = (probability * 1000.0).round().clamp(0.0, 1000.0) as u32;
    nft_drop_commands(
        peers,
        &[],
        &format!("numgen random mod 1000 < {per_mille} drop"),
    )
}

/// The commands that make `node` drop what its traffic with `peers` (to or from `ports`, if
/// any: a service's listeners) sends beyond `kbytes_per_s` each way, as a link of that
/// bandwidth would (nftables).
pub fn nft_rate_commands(peers: &[IpAddr], ports: &[u16], kbytes_per_s: u32) -> String {
    nft_drop_commands(
        peers,
        ports,
        &format!("limit rate over {kbytes_per_s} kbytes/second drop"),
    )
}

/// Rules applying `verdict` to `node`'s traffic with `peers`, both ways.
fn nft_drop_commands(peers: &[IpAddr], ports: &[u16], verdict: &str) -> String {
    let set = |v4: bool| -> Option<String> {
        let ips: Vec<String> = peers
            .iter()
            .filter(|ip| ip.is_ipv4() == v4)
            .map(IpAddr::to_string)
            .collect();
        (!ips.is_empty()).then(|| format!("{{ {} }}", ips.join(", ")))
    };
    let port_set = format!(
        "{{ {} }}",
        ports
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Without ports one rule a direction; with them, one for each end the port may be on.
    let port_matches: Vec<String> = if ports.is_empty() {
        vec![String::new()]
    } else {
        vec![
            format!("th sport {port_set} "),
            format!("th dport {port_set} "),
        ]
    };
    let mut rules_in = Vec::new();
    let mut rules_out = Vec::new();
    for (family, v4) in [("ip", true), ("ip6", false)] {
        if let Some(s) = set(v4) {
            for ports in &port_matches {
                rules_in.push(format!("{family} saddr {s} {ports}{verdict};"));
                rules_out.push(format!("{family} daddr {s} {ports}{verdict};"));
            }
        }
    }
    // nft wants each chain on lines of its own.
    let ruleset = format!(
        "table inet {NFT_TABLE} {{\n\
         chain loss_in {{\ntype filter hook input priority -5; policy accept;\n{}\n}}\n\
         chain loss_out {{\ntype filter hook output priority -5; policy accept;\n{}\n}}\n}}",
        rules_in.join("\n"),
        rules_out.join("\n")
    );
    format!(
        "{}; printf '%s\\n' {} | nft -f -",
        nft_remove(),
        escape(&ruleset)
    )
}

/// The commands that cap what `node` receives from `peers`' `ports` (the answers to its
/// requests there: a follower's fetched records) at `bytes_per_s` for `ms` milliseconds; what it
/// sends is not held up. The peers are elements of nftables sets that time out, so the cap ends
/// in the kernel on its own: nothing has to be there to lift it, and a test that ends meanwhile
/// leaves nothing running. Replaces an earlier such cap.
pub fn nft_expiring_cap_commands(
    peers: &[IpAddr],
    ports: &[u16],
    bytes_per_s: u32,
    ms: u64,
) -> String {
    let ports = ports
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let mut sets = String::new();
    let mut rules = String::new();
    for (family, ty, v4) in [("ip", "ipv4_addr", true), ("ip6", "ipv6_addr", false)] {
        let elements: Vec<String> = peers
            .iter()
            .filter(|ip| ip.is_ipv4() == v4)
            .map(|ip| format!("{ip} timeout {ms}ms"))
            .collect();
        if elements.is_empty() {
            continue;
        }
        let set = format!("{CATCH_UP}{}", if v4 { 4 } else { 6 });
        sets.push_str(&format!(
            "set {set} {{\ntype {ty}; flags timeout;\nelements = {{ {} }}\n}}\n",
            elements.join(", ")
        ));
        rules.push_str(&format!(
            "{family} saddr @{set} th sport {{ {ports} }} limit rate over {bytes_per_s} \
             bytes/second drop;\n"
        ));
    }
    // nft wants each chain and set on lines of their own.
    let ruleset = format!(
        "table inet {NFT_TABLE} {{\n{sets}chain {CATCH_UP}_in {{\ntype filter hook input \
         priority -5; policy accept;\n{rules}}}\n}}"
    );
    format!(
        "nft delete chain inet {NFT_TABLE} {CATCH_UP}_in 2>/dev/null; \
         nft delete set inet {NFT_TABLE} {CATCH_UP}4 2>/dev/null; \
         nft delete set inet {NFT_TABLE} {CATCH_UP}6 2>/dev/null; true; \
         printf '%s\\n' {} | nft -f -",
        escape(&ruleset)
    )
}

/// The name of the chain and sets of a cap that ends on its own.
const CATCH_UP: &str = "catch_up";

/// Removes the nftables loss chains, if present.
pub fn nft_remove() -> String {
    format!(
        "nft delete chain inet {NFT_TABLE} loss_in 2>/dev/null; \
         nft delete chain inet {NFT_TABLE} loss_out 2>/dev/null; true"
    )
}

/// Whether the node's kernel has netem: adding a netem qdisc to a dummy-free interface (its
/// loopback) works, and is removed again at once.
const NETEM_PROBE: &str = "if tc qdisc add dev lo root netem delay 0ms 2>/dev/null; then \
     tc qdisc del dev lo root; echo yes; else echo no; fi";

/// The interface `node` reaches `peer` through.
fn interface_to(node: &Node, peer: IpAddr) -> anyhow::Result<String> {
    let out = remote::run(node.remote.as_ref(), &format!("ip -o route get {peer}"))?;
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "dev" {
            if let Some(dev) = words.next() {
                return Ok(dev.to_string());
            }
        }
    }
    anyhow::bail!("no interface toward {peer} in `{out}`")
}

/// The netem command for `dev`.
pub fn netem_command(dev: &str, probability: f64, delay: Option<(u64, u64)>) -> String {
    let mut cmd = format!(
        "tc qdisc replace dev {} root netem loss {:.1}%",
        escape(dev),
        probability * 100.0
    );
    if let Some((ms, jitter)) = delay {
        cmd.push_str(&format!(" delay {ms}ms {jitter}ms"));
    }
    cmd
}

/// Removes a netem qdisc from `dev`, and nothing else.
fn netem_remove(dev: &str) -> String {
    let dev = escape(dev);
    format!(
        "if tc qdisc show dev {dev} 2>/dev/null | grep -q netem; then \
         tc qdisc del dev {dev} root; fi"
    )
}

fn has_netem(node: &Node) -> bool {
    remote::run(node.remote.as_ref(), NETEM_PROBE).is_ok_and(|o| o.trim() == "yes")
}

/// Makes `node` drop `probability` of the packets it exchanges with `peers` (and delay them,
/// where netem can); returns how.
pub fn impose(
    node: &Node,
    peers: &[IpAddr],
    probability: f64,
    delay: Option<(u64, u64)>,
) -> anyhow::Result<Method> {
    let netem = has_netem(node);
    let cmd = match peers.first() {
        Some(peer) if netem => netem_command(&interface_to(node, *peer)?, probability, delay),
        _ => nft_commands(peers, probability),
    };
    remote::run(node.remote.as_ref(), &cmd)?;
    Ok(if netem {
        Method::Netem
    } else {
        Method::Nftables
    })
}

/// Caps what `node` exchanges with `peers` to or from `ports` at `kbytes_per_s` each way
/// (nftables; the cap drops the excess, which TCP then paces itself to). [`lift`] ends it.
pub fn cap_on_ports(
    node: &Node,
    peers: &[IpAddr],
    ports: &[u16],
    kbytes_per_s: u32,
) -> anyhow::Result<()> {
    remote::run(
        node.remote.as_ref(),
        &nft_rate_commands(peers, ports, kbytes_per_s),
    )?;
    Ok(())
}

/// Caps what `node` receives from `peers`' `ports` at `bytes_per_s` for `ms` milliseconds,
/// after which the cap is gone by itself (nftables set timeouts).
pub fn cap_on_ports_for(
    node: &Node,
    peers: &[IpAddr],
    ports: &[u16],
    bytes_per_s: u32,
    ms: u64,
) -> anyhow::Result<()> {
    remote::run(
        node.remote.as_ref(),
        &nft_expiring_cap_commands(peers, ports, bytes_per_s, ms),
    )?;
    Ok(())
}

/// Ends any loss or bandwidth cap `node` imposes on its traffic with `peers`.
pub fn lift(node: &Node, peers: &[IpAddr]) -> anyhow::Result<()> {
    let mut script = vec![nft_remove()];
    if let Some(peer) = peers.first() {
        if let Ok(dev) = interface_to(node, *peer) {
            script.push(netem_remove(&dev));
        }
    }
    remote::run(node.remote.as_ref(), &script.join("; "))?;
    Ok(())
}

/// The value of `start-loss` or `stop-loss`: the targets (`stop-loss` defaults to every node),
/// and for `start-loss` the share of packets to drop (chosen when absent) and a netem delay.
#[derive(Debug, Default, Deserialize)]
struct LossValue {
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(default)]
    targets: Option<NodeSpec>,
    #[serde(default)]
    probability: Option<f64>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    jitter_ms: Option<u64>,
}

/// A parsed loss op.
#[derive(Debug, PartialEq)]
enum LossOp {
    /// Drop `probability` of the targets' traffic with their peers (chosen when `None`), with a
    /// netem delay and jitter in ms when given.
    Start {
        targets: Targets,
        probability: Option<f64>,
        delay: Option<(u64, u64)>,
    },
    /// Remove the loss from the targets.
    Stop(Targets),
}

impl LossOp {
    fn parse(f: &str, value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: LossValue = parse(value)?;
        let fields = TargetFields {
            nodes: v.nodes,
            targets: v.targets,
        };
        if f == "stop-loss" {
            return fields.targets(nodes, Some(NodeSpec::All)).map(LossOp::Stop);
        }
        if let Some(p) = v.probability.filter(|p| !(0.0..=1.0).contains(p)) {
            return Err(format!(
                "field `probability`: expected a share between 0 and 1, got {p}"
            ));
        }
        Ok(LossOp::Start {
            targets: fields.targets(nodes, None)?,
            probability: v.probability,
            delay: v.delay_ms.map(|ms| (ms, v.jitter_ms.unwrap_or(0))),
        })
    }
}

impl FaultOp for LossOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let targets = match &*self {
            LossOp::Start { targets, .. } | LossOp::Stop(targets) => targets,
        };
        let nodes = env.resolve(targets)?;
        let LossOp::Start {
            targets,
            probability,
            delay,
        } = *self
        else {
            let (done, errors) = env.on_each(&nodes, |n| lift(n, &env.peers_of(&n.name)));
            return Failed::partly(json!({ "nodes": done }), &errors);
        };
        let probability = match probability {
            Some(p) => p,
            None => *PROBABILITIES.choose(env.rng).expect("non-empty"),
        };
        let methods = std::sync::Mutex::new(Vec::new());
        let (done, errors) = env.on_each(&nodes, |n| {
            let method = impose(n, &env.peers_of(&n.name), probability, delay)?;
            methods
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(method);
            Ok(())
        });
        let methods = methods.into_inner().unwrap_or_else(|p| p.into_inner());
        let netem = !methods.is_empty() && methods.iter().all(|m| *m == Method::Netem);
        let mut record = json!({
            "nodes": done,
            "probability": probability,
            "method": if netem { "netem" } else { "nftables" },
        });
        if let Some(spec) = targets.spec_name() {
            record["targets"] = json!(spec);
        }
        if let Some((ms, jitter)) = delay {
            if netem {
                record["delay_ms"] = json!(ms);
                record["jitter_ms"] = json!(jitter);
            } else {
                record["skipped"] = json!({"delay_ms": ms, "why": "no netem in this kernel"});
            }
        }
        Failed::partly(record, &errors)
    }
}

impl Fault for Loss {
    fn fs(&self) -> &'static [&'static str] {
        &["start-loss", "stop-loss"]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(LossOp::parse(f, value, nodes)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn nft_rules_drop_a_share_of_peer_traffic_both_ways() {
        let peers = [
            IpAddr::V4(Ipv4Addr::new(10, 211, 0, 12)),
            IpAddr::V4(Ipv4Addr::new(10, 211, 0, 13)),
        ];
        let cmd = nft_commands(&peers, 0.25);
        assert!(
            cmd.starts_with("nft delete chain inet tidemark loss_in"),
            "{cmd}"
        );
        assert!(
            cmd.contains(
                "ip saddr { 10.211.0.12, 10.211.0.13 } numgen random mod 1000 < 250 drop;"
            ),
            "{cmd}"
        );
        assert!(
            cmd.contains("ip daddr { 10.211.0.12, 10.211.0.13 }"),
            "{cmd}"
        );
        assert!(cmd.contains("| nft -f -"), "{cmd}");
        let v6 = nft_commands(&[IpAddr::V6(Ipv6Addr::LOCALHOST)], 0.1);
        assert!(
            v6.contains("ip6 saddr { ::1 } numgen random mod 1000 < 100 drop;"),
            "{v6}"
        );
        assert!(!v6.contains("ip saddr"), "{v6}");
    }

    #[test]
    fn a_bandwidth_cap_on_ports_limits_only_traffic_to_or_from_them() {
        let peers = [IpAddr::V4(Ipv4Addr::new(10, 211, 0, 12))];
        let cmd = nft_rate_commands(&peers, &[9092], 40);
        let verdict = "limit rate over 40 kbytes/second drop;";
        for ends in [
            "ip saddr { 10.211.0.12 } th sport { 9092 }",
            "ip saddr { 10.211.0.12 } th dport { 9092 }",
            "ip daddr { 10.211.0.12 } th sport { 9092 }",
            "ip daddr { 10.211.0.12 } th dport { 9092 }",
        ] {
            let rule = format!("{ends} {verdict}");
            assert!(cmd.contains(&rule), "{rule} in {cmd}");
        }
        assert!(!cmd.contains("{ 10.211.0.12 } limit"), "{cmd}");
        assert!(cmd.contains("| nft -f -"), "{cmd}");
    }

    #[test]
    fn a_cap_that_ends_by_itself_slows_what_peers_answer_and_names_them_in_sets_that_time_out() {
        let peers = [
            IpAddr::V4(Ipv4Addr::new(10, 211, 0, 12)),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ];
        let cmd = nft_expiring_cap_commands(&peers, &[9092], 1024, 4500);
        assert!(
            cmd.starts_with("nft delete chain inet tidemark catch_up_in"),
            "{cmd}"
        );
        for want in [
            "set catch_up4 {",
            "type ipv4_addr; flags timeout;",
            "elements = { 10.211.0.12 timeout 4500ms }",
            "set catch_up6 {",
            "elements = { ::1 timeout 4500ms }",
            "chain catch_up_in {",
            "ip saddr @catch_up4 th sport { 9092 } limit rate over 1024 bytes/second drop;",
            "ip6 saddr @catch_up6 th sport { 9092 } limit rate over 1024 bytes/second drop;",
        ] {
            assert!(cmd.contains(want), "{want} in {cmd}");
        }
        // What the node sends, and the loss chains, are left alone.
        assert!(!cmd.contains("daddr") && !cmd.contains("dport"), "{cmd}");
        assert!(
            !cmd.contains("catch_up_out") && !cmd.contains("loss_in"),
            "{cmd}"
        );
        let v4 = nft_expiring_cap_commands(&peers[..1], &[9092], 1024, 4500);
        assert!(!v4.contains("catch_up6 {"), "{v4}");
    }

    #[test]
    fn netem_gets_loss_and_optional_delay() {
        assert_eq!(
            netem_command("eth0", 0.2, None),
            "tc qdisc replace dev eth0 root netem loss 20.0%"
        );
        assert_eq!(
            netem_command("eth0", 0.05, Some((50, 10))),
            "tc qdisc replace dev eth0 root netem loss 5.0% delay 50ms 10ms"
        );
    }

    #[test]
    fn parsing_names_the_bad_field() {
        let nodes: Vec<String> = ["n1", "n2"].map(String::from).to_vec();
        let parse = |f: &str, v: Value| LossOp::parse(f, &v, &nodes);
        assert_eq!(
            parse("start-loss", json!({"targets": "all", "delay_ms": 5})),
            Ok(LossOp::Start {
                targets: Targets::Spec(NodeSpec::All),
                probability: None,
                delay: Some((5, 0))
            })
        );
        assert_eq!(
            parse("stop-loss", json!({})),
            Ok(LossOp::Stop(Targets::Spec(NodeSpec::All)))
        );
        let recorded = json!({"nodes": ["n2"], "probability": 0.1, "method": "nftables",
                              "targets": "one"});
        assert_eq!(
            parse("start-loss", recorded),
            Ok(LossOp::Start {
                targets: Targets::Nodes(vec!["n2".into()]),
                probability: Some(0.1),
                delay: None
            })
        );
        let e = parse("start-loss", json!({"nodes": ["n1"], "probability": 2})).unwrap_err();
        assert!(e.starts_with("field `probability`"), "{e}");
        let e = parse("start-loss", json!({"nodes": ["n1"], "delay_ms": -3})).unwrap_err();
        assert!(e.starts_with("field `delay_ms`"), "{e}");
        let e = parse("start-loss", json!({})).unwrap_err();
        assert!(e.contains("`targets`"), "{e}");
    }
}
