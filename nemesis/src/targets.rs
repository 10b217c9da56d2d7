//! Which nodes a fault acts on. An op names its targets as a spec (`"targets": "minority"`) when
//! the schedule generates it and as explicit names (`"nodes": ["n2"]`) once the nemesis has
//! resolved it; the `info` records the names, so the history says exactly what happened and a
//! replay of it does the same thing again.

use std::collections::BTreeSet;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::RngExt;
use serde::Deserialize;
use tidemark_harness::generator::Rng;

use crate::cluster::ClusterView;

/// A node spec: which nodes, chosen when the op is performed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub enum NodeSpec {
    /// One random node.
    One,
    /// The largest minority, at random.
    Minority,
    /// The smallest majority, at random.
    Majority,
    /// About a third of the nodes (at least one), at random.
    MinorityThird,
    /// The leader of one random partition.
    Leader,
    /// A random non-empty subset of the nodes leading some partition, at most a minority of
    /// the cluster: the others must still be able to elect new leaders, or a fault on them is
    /// no failover, only a stall (with three nodes, two leaders down leave no quorum).
    Leaders,
    /// Every node.
    All,
    /// The active controller of the metadata quorum (DescribeQuorum): a broker in combined
    /// mode, a dedicated controller otherwise.
    Controller,
}

impl NodeSpec {
    /// Every spec with its name.
    pub const ALL: [NodeSpec; 8] = [
        NodeSpec::One,
        NodeSpec::Minority,
        NodeSpec::Majority,
        NodeSpec::MinorityThird,
        NodeSpec::Leader,
        NodeSpec::Leaders,
        NodeSpec::All,
        NodeSpec::Controller,
    ];

    /// The name ops and the CLI use.
    pub fn name(self) -> &'static str {
        match self {
            NodeSpec::One => "one",
            NodeSpec::Minority => "minority",
            NodeSpec::Majority => "majority",
            NodeSpec::MinorityThird => "minority-third",
            NodeSpec::Leader => "leader",
            NodeSpec::Leaders => "leaders",
            NodeSpec::All => "all",
            NodeSpec::Controller => "controller",
        }
    }

    /// The spec called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Whether resolving needs the cluster's view (partition leaders, the active controller).
    pub fn needs_leaders(self) -> bool {
        matches!(
            self,
            NodeSpec::Leader | NodeSpec::Leaders | NodeSpec::Controller
        )
    }

    /// Resolves to node names, sorted. `view` is only read for leader specs.
    pub fn resolve(
        self,
        nodes: &[String],
        view: Option<&ClusterView>,
        rng: &mut Rng,
    ) -> Result<Vec<String>, String> {
        let n = nodes.len();
        let mut shuffled = nodes.to_vec();
        shuffled.shuffle(rng);
        let take = |k: usize, mut v: Vec<String>| {
            v.truncate(k.clamp(1, n));
            v.sort();
            v
        };
        Ok(match self {
            NodeSpec::One => take(1, shuffled),
            NodeSpec::Minority => take(minority(n), shuffled),
            NodeSpec::Majority => take(majority(n), shuffled),
            NodeSpec::MinorityThird => take(minority_third(n), shuffled),
            NodeSpec::All => take(n, shuffled),
            NodeSpec::Leader => {
                let view = view.ok_or("no cluster view to find leaders in")?;
                let led: Vec<&String> = view.partitions.iter().flat_map(|p| &p.leader).collect();
                let leader = led.choose(rng).ok_or("no partition has a leader")?;
                vec![(*leader).clone()]
            }
            NodeSpec::Leaders => {
                let view = view.ok_or("no cluster view to find leaders in")?;
                let mut leaders: Vec<String> = view.leaders().into_iter().collect();
                if leaders.is_empty() {
                    return Err("no partition has a leader".into());
                }
                leaders.shuffle(rng);
                let k = rng.random_range(1..=leaders.len().min(minority(n)));
                take(k, leaders)
            }
            NodeSpec::Controller => {
                let view = view.ok_or("no cluster view to find the controller in")?;
                vec![view
                    .controller
                    .clone()
                    .ok_or("no broker named an active controller")?]
            }
        })
    }
}

impl TryFrom<String> for NodeSpec {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        NodeSpec::parse(&s)
            .ok_or_else(|| format!("unknown node spec {s:?}; known: {}", spec_names()))
    }
}

/// The largest minority of `n` (at least 1).
pub fn minority(n: usize) -> usize {
    (n.saturating_sub(1) / 2).max(1)
}

/// The smallest majority of `n`.
pub fn majority(n: usize) -> usize {
    n / 2 + 1
}

/// About a third of `n`, strictly less than a third when possible (at least 1).
pub fn minority_third(n: usize) -> usize {
    (n.saturating_sub(1) / 3).max(1)
}

/// The targets of an op: a spec still to resolve, or resolved names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Targets {
    /// Chosen when performed.
    Spec(NodeSpec),
    /// Exactly these nodes.
    Nodes(Vec<String>),
}

/// The fields of an op value that name its targets: `nodes` (names, which win) or `targets` (a
/// spec).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TargetFields {
    /// Resolved names.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
    /// A spec.
    #[serde(default)]
    pub targets: Option<NodeSpec>,
}

impl TargetFields {
    /// The targets, checking names against `nodes`; `default` when neither field is present.
    pub fn targets(&self, nodes: &[String], default: Option<NodeSpec>) -> Result<Targets, String> {
        if let Some(list) = &self.nodes {
            return known_nodes(list, nodes, "nodes").map(Targets::Nodes);
        }
        self.targets
            .or(default)
            .map(Targets::Spec)
            .ok_or_else(|| "needs `nodes` (a list of node names) or `targets`".to_string())
    }
}

impl Targets {
    /// Whether resolving needs the current partition leaders.
    pub fn needs_leaders(&self) -> bool {
        matches!(self, Targets::Spec(s) if s.needs_leaders())
    }

    /// Whether resolving needs the active controller.
    pub fn needs_controller(&self) -> bool {
        *self == Targets::Spec(NodeSpec::Controller)
    }

    /// The node names, resolving a spec.
    pub fn resolve(
        &self,
        nodes: &[String],
        view: Option<&ClusterView>,
        rng: &mut Rng,
    ) -> Result<Vec<String>, String> {
        match self {
            Targets::Nodes(list) => Ok(list.clone()),
            Targets::Spec(s) => s.resolve(nodes, view, rng),
        }
    }

    /// The spec's name, for the record.
    pub fn spec_name(&self) -> Option<&'static str> {
        match self {
            Targets::Spec(s) => Some(s.name()),
            Targets::Nodes(_) => None,
        }
    }
}

/// The names of every node spec, for messages.
pub fn spec_names() -> String {
    NodeSpec::ALL.map(NodeSpec::name).join(", ")
}

/// Checks that every name of `list` (at `field`) is one of `nodes`; returns them distinct and
/// sorted.
pub fn known_nodes(list: &[String], nodes: &[String], field: &str) -> Result<Vec<String>, String> {
    for (i, name) in list.iter().enumerate() {
        known_node(name, nodes, &format!("{field}[{i}]"))?;
    }
    let set: BTreeSet<String> = list.iter().cloned().collect();
    Ok(set.into_iter().collect())
}

/// Checks that `name` (at `field`) is one of `nodes`.
pub fn known_node(name: &str, nodes: &[String], field: &str) -> Result<(), String> {
    if nodes.iter().any(|n| n == name) {
        Ok(())
    } else {
        Err(format!(
            "field `{field}`: unknown node {name:?}; nodes: {}",
            nodes.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use tidemark_harness::generator::rng;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn sizes_follow_jepsen() {
        assert_eq!((minority(3), majority(3), minority_third(3)), (1, 2, 1));
        assert_eq!((minority(5), majority(5), minority_third(5)), (2, 3, 1));
        assert_eq!((minority(4), majority(4), minority_third(7)), (1, 3, 2));
        assert_eq!((minority(1), majority(1)), (1, 1));
    }

    #[test]
    fn specs_resolve_to_sorted_distinct_nodes_of_the_right_size() {
        let nodes = names(5);
        let mut r = rng(7);
        for (spec, size) in [
            (NodeSpec::One, 1),
            (NodeSpec::Minority, 2),
            (NodeSpec::Majority, 3),
            (NodeSpec::MinorityThird, 1),
            (NodeSpec::All, 5),
        ] {
            for _ in 0..20 {
                let got = spec.resolve(&nodes, None, &mut r).unwrap();
                assert_eq!(got.len(), size, "{spec:?}");
                let mut sorted = got.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(sorted, got);
            }
        }
        let err = NodeSpec::Leaders.resolve(&nodes, None, &mut r).unwrap_err();
        assert!(err.contains("leaders"), "{err}");
    }

    #[test]
    fn leaders_are_at_most_a_minority_so_the_rest_can_elect() {
        let led_by = |nodes: &[&str]| ClusterView {
            partitions: nodes
                .iter()
                .enumerate()
                .map(|(i, n)| crate::cluster::PartitionView {
                    topic: "t".into(),
                    partition: i as i32,
                    leader: Some(n.to_string()),
                    leader_epoch: 1,
                    replicas: Vec::new(),
                    isr: Vec::new(),
                })
                .collect(),
            answered: Default::default(),
            controller: None,
        };
        let mut r = rng(3);
        let three = led_by(&["n1", "n2", "n1", "n3"]);
        let five = led_by(&["n1", "n2", "n4", "n5"]);
        let mut sizes = BTreeSet::new();
        for _ in 0..50 {
            let got = NodeSpec::Leaders
                .resolve(&names(3), Some(&three), &mut r)
                .unwrap();
            assert_eq!(got.len(), 1, "{got:?}");
            let got = NodeSpec::Leaders
                .resolve(&names(5), Some(&five), &mut r)
                .unwrap();
            assert!(got.iter().all(|n| n != "n3"), "{got:?}");
            sizes.insert(got.len());
        }
        assert_eq!(sizes, BTreeSet::from([1, 2]));
    }

    #[test]
    fn the_controller_spec_is_the_active_controller_whatever_its_role() {
        let mut view = ClusterView::default();
        let err = NodeSpec::Controller
            .resolve(&names(3), Some(&view), &mut rng(1))
            .unwrap_err();
        assert!(err.contains("active controller"), "{err}");
        view.controller = Some("c2".into());
        assert_eq!(
            NodeSpec::Controller.resolve(&names(3), Some(&view), &mut rng(1)),
            Ok(vec!["c2".to_string()])
        );
        assert!(NodeSpec::Controller.needs_leaders());
    }

    #[test]
    fn names_win_over_specs_and_bad_fields_are_named() {
        let nodes = names(3);
        let targets = |v: Value, default| {
            crate::fault::parse::<TargetFields>(&v).and_then(|t| t.targets(&nodes, default))
        };
        assert_eq!(
            targets(json!({"nodes": ["n3", "n1"], "targets": "all"}), None),
            Ok(Targets::Nodes(vec!["n1".into(), "n3".into()]))
        );
        assert_eq!(
            targets(json!({"targets": "majority"}), None),
            Ok(Targets::Spec(NodeSpec::Majority))
        );
        assert_eq!(
            targets(json!({}), Some(NodeSpec::All)),
            Ok(Targets::Spec(NodeSpec::All))
        );
        let e = targets(json!({"nodes": ["n1", "n9"]}), None).unwrap_err();
        assert!(
            e.starts_with("field `nodes[1]`: unknown node \"n9\""),
            "{e}"
        );
        let e = targets(json!({"targets": "most"}), None).unwrap_err();
        assert!(
            e.starts_with("field `targets`: unknown node spec") && e.contains("minority"),
            "{e}"
        );
        let e = targets(json!({}), None).unwrap_err();
        assert!(e.contains("nodes"), "{e}");
    }
}
