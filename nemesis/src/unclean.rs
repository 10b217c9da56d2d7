//! A forced unclean leader election (aphyr's 2013 Kafka scenario, through KIP-460's ElectLeaders
//! UNCLEAN), as one op that heals its own rules:
//!
//! 1. Cut one follower S of a partition off from fetching (every other node drops its packets to
//!    the client port) until the leader shrinks the ISR without it.
//! 2. Let acknowledged writes land on the smaller ISR.
//! 3. Take the ISR away without losing the metadata quorum: every node drops controller-port
//!    packets from the partition's other replicas, so they can neither lead the quorum nor
//!    heartbeat to whoever does, while connections the others open to them still work. The
//!    controller fences them and the partition goes leaderless.
//! 4. Elect S, which lacks those writes, with ElectLeaders UNCLEAN; then remove every rule, and
//!    the old ISR comes back to follow S and truncate.
//!
//! The history records `{"cluster", "topic", "partition", "leader"}` with the elected replica
//! (plus the old leader and ISR); the checkers allow `lost-write` on that partition. The
//! rules live in chains of the nftables table [`NFT_TABLE`].

use std::net::IpAddr;
use std::time::{Duration, Instant};

use anyhow::bail;
use rand::seq::IndexedRandom;
use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_harness::broker::{CLIENT_PORT, CONTROLLER_PORT};
use tidemark_harness::net::NFT_TABLE;
use tidemark_harness::remote::{self, escape};
use tidemark_harness::runtime::Node;

use crate::cluster::{elect_unclean, ClusterView, PartitionView};
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::known_node;

/// The forced unclean election.
#[derive(Debug, Clone)]
pub struct Unclean {
    /// The port followers fetch from (the client listener).
    pub client_port: u16,
    /// The port of the controller quorum and broker heartbeats.
    pub controller_port: u16,
    /// How long writes land on the shrunken ISR before it is taken away.
    pub dwell: Duration,
    /// How long each step may take.
    pub step_timeout: Duration,
}

impl Default for Unclean {
    fn default() -> Self {
        Unclean {
            client_port: CLIENT_PORT,
            controller_port: CONTROLLER_PORT,
            dwell: Duration::from_secs(2),
            step_timeout: Duration::from_secs(25),
        }
    }
}

/// The nftables command that installs `chain` dropping TCP packets from `from` to `port`.
pub fn drop_chain_command(chain: &str, from: &[IpAddr], port: u16) -> String {
    let mut rules = Vec::new();
    for (family, v4) in [("ip", true), ("ip6", false)] {
        let ips: Vec<String> = from
            .iter()
            .filter(|ip| ip.is_ipv4() == v4)
            .map(IpAddr::to_string)
            .collect();
        if !ips.is_empty() {
            rules.push(format!(
                "{family} saddr {{ {} }} tcp dport {port} drop;",
                ips.join(", ")
            ));
        }
    }
    // nft wants the chain on lines of its own.
    let ruleset = format!(
        "table inet {NFT_TABLE} {{\nchain {chain} {{\ntype filter hook input priority -5; \
         policy accept;\n{}\n}}\n}}",
        rules.join("\n")
    );
    format!(
        "{}; printf '%s\\n' {} | nft -f -",
        remove_chain_command(chain),
        escape(&ruleset)
    )
}

/// Removes `chain` from the table, if present.
pub fn remove_chain_command(chain: &str) -> String {
    format!("nft delete chain inet {NFT_TABLE} {chain} 2>/dev/null; true")
}

const STALE_CHAIN: &str = "unclean_stale";
const FENCE_CHAIN: &str = "unclean_fence";

/// Removes the op's chains from every node when dropped, whatever happened.
struct Rules<'a> {
    nodes: &'a [Node],
}

impl Drop for Rules<'_> {
    fn drop(&mut self) {
        let cmd = format!(
            "{}; {}",
            remove_chain_command(STALE_CHAIN),
            remove_chain_command(FENCE_CHAIN)
        );
        for n in self.nodes {
            let _ = remote::run(n.remote.as_ref(), &cmd);
        }
    }
}

/// Polls the cluster until `done` holds for the partition; returns its view then.
fn wait_for(
    env: &Env<'_>,
    topic: &str,
    partition: i32,
    timeout: Duration,
    what: &str,
    done: impl Fn(&PartitionView) -> bool,
) -> anyhow::Result<PartitionView> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(view) = ClusterView::read(env.cx) {
            if let Some(p) = view.partition(topic, partition).filter(|p| done(p)) {
                return Ok(p.clone());
            }
        }
        if Instant::now() >= deadline {
            bail!("{topic}/{partition}: {what} did not happen within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The value of `unclean-election`: optionally which topic, partition and replica to elect (a
/// recorded `info` names all three); the rest is chosen when performed.
#[derive(Debug, Default, PartialEq, Deserialize)]
pub struct UncleanValue {
    /// Only partitions of this topic.
    #[serde(default)]
    pub topic: Option<String>,
    /// Only this partition (with `topic`).
    #[serde(default)]
    pub partition: Option<u32>,
    /// The replica to elect.
    #[serde(default)]
    pub leader: Option<String>,
}

impl UncleanValue {
    fn parse(value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: UncleanValue = parse(value)?;
        if v.partition.is_some() && v.topic.is_none() {
            return Err("field `partition` needs `topic`".into());
        }
        if let Some(l) = &v.leader {
            known_node(l, nodes, "leader")?;
        }
        Ok(v)
    }
}

/// A parsed unclean election with the settings it runs under.
struct Election<'a> {
    unclean: &'a Unclean,
    value: UncleanValue,
}

impl FaultOp for Election<'_> {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        self.unclean.run(env, &self.value)
    }
}

impl Unclean {
    /// Chooses the partition and the stale replica to elect.
    fn choose(
        &self,
        env: &mut Env<'_>,
        value: &UncleanValue,
    ) -> Result<(PartitionView, String), Failed> {
        let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
        let wanted_topic = value.topic.as_deref();
        let wanted_partition = value.partition.map(i64::from);
        let wanted_stale = value.leader.as_deref();
        let candidates: Vec<&PartitionView> = view
            .partitions
            .iter()
            // Unless named, the workload's topics: the checkers see only those, and an
            // internal topic's election only takes the run's time.
            .filter(|p| wanted_topic.map_or(!p.topic.starts_with("__"), |t| t == p.topic))
            .filter(|p| wanted_partition.is_none_or(|i| i == p.partition as i64))
            .filter(|p| p.leader.is_some() && p.replicas.len() >= 2)
            .filter(|p| wanted_stale.is_none_or(|s| p.replicas.iter().any(|r| r == s)))
            .filter(|p| wanted_stale.is_none_or(|s| p.leader.as_deref() != Some(s)))
            .collect();
        let p = (*candidates.choose(env.rng).ok_or_else(|| {
            Failed::nothing(
                "no partition with a leader and another replica to elect (it needs a \
                 replication factor of at least 2)",
            )
        })?)
        .clone();
        let stale = match wanted_stale {
            Some(s) => s.to_string(),
            None => {
                let followers: Vec<&String> = p
                    .replicas
                    .iter()
                    .filter(|r| p.leader.as_ref() != Some(*r))
                    .collect();
                (*followers.choose(env.rng).expect("two replicas or more")).clone()
            }
        };
        Ok((p, stale))
    }

    fn run(&self, env: &mut Env<'_>, value: &UncleanValue) -> Result<Value, Failed> {
        let (p, stale) = self.choose(env, value)?;
        let (topic, partition) = (p.topic.clone(), p.partition);
        let previous = p.leader.clone().unwrap_or_default();
        let others: Vec<String> = p
            .replicas
            .iter()
            .filter(|r| **r != stale)
            .cloned()
            .collect();
        let stale_node = env.node(&stale)?.clone();
        let cluster = stale_node.cluster.clone();
        let mut record = json!({"cluster": cluster, "topic": topic, "partition": partition,
                                "stale": stale, "previous_leader": previous});
        let fail = |record: &Value, e: anyhow::Error| Failed {
            done: record.clone(),
            error: format!("{e:#}"),
        };
        let _rules = Rules {
            nodes: env.cx.nodes,
        };

        // 1. The stale replica stops fetching until the ISR no longer holds it.
        let cut: Vec<String> = env
            .cx
            .nodes
            .iter()
            .filter(|n| n.name != stale)
            .map(|n| n.name.clone())
            .collect();
        let stale_ip = [stale_node.ip];
        let (_, errors) = env.on_each(&cut, |n| {
            remote::run(
                n.remote.as_ref(),
                &drop_chain_command(STALE_CHAIN, &stale_ip, self.client_port),
            )?;
            Ok(())
        });
        if !errors.is_empty() {
            return Err(Failed {
                done: record,
                error: errors.join("; "),
            });
        }
        let shrunk = wait_for(
            env,
            &topic,
            partition,
            self.step_timeout,
            "the ISR shrink",
            |v| !v.isr.contains(&stale) && v.leader.is_some(),
        )
        .map_err(|e| fail(&record, e))?;
        record["isr"] = json!(shrunk.isr);

        // 2. Acknowledged writes land on the shrunken ISR only.
        std::thread::sleep(self.dwell);

        // 3. The rest of the replicas can open no controller connection: they are fenced.
        let all: Vec<String> = env.names();
        let (_, errors) = env.on_each(&all, |n| {
            let from: Vec<IpAddr> = env
                .cx
                .nodes
                .iter()
                .filter(|o| others.contains(&o.name) && o.name != n.name)
                .map(|o| o.ip)
                .collect();
            if from.is_empty() {
                return Ok(());
            }
            remote::run(
                n.remote.as_ref(),
                &drop_chain_command(FENCE_CHAIN, &from, self.controller_port),
            )?;
            Ok(())
        });
        if !errors.is_empty() {
            return Err(Failed {
                done: record,
                error: errors.join("; "),
            });
        }
        record["fenced"] = json!(others);
        wait_for(
            env,
            &topic,
            partition,
            self.step_timeout,
            "losing the leader",
            |v| v.leader.is_none(),
        )
        .map_err(|e| fail(&record, e))?;

        // 4. Elect the stale replica; the rules go when `_rules` drops.
        let deadline = Instant::now() + self.step_timeout;
        loop {
            match elect_unclean(env.cx, &stale_node, &topic, partition) {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => return Err(fail(&record, e)),
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
        wait_for(
            env,
            &topic,
            partition,
            self.step_timeout,
            "the election",
            |v| v.leader.as_deref() == Some(stale.as_str()),
        )
        .map_err(|e| fail(&record, e))?;
        record["leader"] = json!(stale);
        Ok(record)
    }
}

impl Fault for Unclean {
    fn fs(&self) -> &'static [&'static str] {
        &["unclean-election"]
    }

    fn parse<'a>(
        &'a self,
        _f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(Election {
            unclean: self,
            value: UncleanValue::parse(value, nodes)?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn chains_drop_tcp_to_one_port_from_the_named_sources() {
        let cmd = drop_chain_command(
            "unclean_fence",
            &[
                IpAddr::V4(Ipv4Addr::new(10, 211, 0, 11)),
                IpAddr::V4(Ipv4Addr::new(10, 211, 0, 12)),
            ],
            9093,
        );
        assert!(
            cmd.starts_with("nft delete chain inet tidemark unclean_fence"),
            "{cmd}"
        );
        assert!(
            cmd.contains("ip saddr { 10.211.0.11, 10.211.0.12 } tcp dport 9093 drop;"),
            "{cmd}"
        );
    }

    #[test]
    fn parsing_names_the_bad_field() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |v: Value| UncleanValue::parse(&v, &nodes);
        assert_eq!(parse(json!({})), Ok(UncleanValue::default()));
        let recorded = json!({"cluster": "a", "topic": "t", "partition": 0, "leader": "n3"});
        assert_eq!(
            parse(recorded),
            Ok(UncleanValue {
                topic: Some("t".into()),
                partition: Some(0),
                leader: Some("n3".into())
            })
        );
        let e = parse(json!({"topic": "t", "partition": "x"})).unwrap_err();
        assert!(e.starts_with("field `partition`"), "{e}");
        let e = parse(json!({"partition": 1})).unwrap_err();
        assert!(e.contains("needs `topic`"), "{e}");
        let e = parse(json!({"leader": "n7"})).unwrap_err();
        assert!(e.starts_with("field `leader`: unknown node"), "{e}");
    }
}
