//! Network partitions as grudges (Jepsen's `nemesis.clj`): for each node, the nodes whose
//! packets it drops. A grudge is plain data, so the history records it and a replay applies it
//! again; grudges need not be symmetric. Every construction here is pure given the node names,
//! the leaders and the RNG.

use std::collections::{BTreeMap, BTreeSet};

use rand::seq::SliceRandom;
use rand::RngExt;
use tidemark_harness::generator::Rng;
use tidemark_harness::net::Grudge;

use crate::targets::{majority, minority, minority_third};

/// How to cut the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PartitionKind {
    /// The first half of the nodes (the smaller, by name) against the rest.
    Halves,
    /// Shuffled, then halves.
    RandomHalves,
    /// One random node alone.
    One,
    /// A random majority against the minority left over.
    Majority,
    /// About a third of the nodes against the rest.
    MinorityThird,
    /// Every node sees a majority, no two the same one.
    MajoritiesRing,
    /// Two halves that both see one bridge node.
    Bridge,
    /// The leader of one random partition alone.
    Leader,
    /// The leader of one random partition cut from the other nodes on the brokers' listeners
    /// only, where followers fetch: the controllers' quorum still reaches it, so it stays
    /// leader while its followers fall behind and its ISR shrinks to itself, and clients still
    /// write to it (a replication network lost, the control network up).
    LeaderReplication,
    /// The leader of one random partition cut from the other nodes on the controller listeners
    /// only: it can neither heartbeat nor hear new metadata, so the controllers fence it and
    /// elect another leader, while clients and followers still reach it and it still believes
    /// it leads (KRaft's zombie leader; the control network lost, the data network up).
    LeaderControl,
    /// A random non-empty subset of the current leaders, each alone, at most a minority of the
    /// nodes (the rest must be able to elect).
    Leaders,
    /// Every node alone.
    All,
    /// The metadata quorum's active controller alone, cut off from every node (dedicated
    /// controllers included): a broker and the controller in combined mode.
    Controller,
}

impl PartitionKind {
    /// Every kind.
    pub const ALL: [PartitionKind; 13] = [
        PartitionKind::Halves,
        PartitionKind::RandomHalves,
        PartitionKind::One,
        PartitionKind::Majority,
        PartitionKind::MinorityThird,
        PartitionKind::MajoritiesRing,
        PartitionKind::Bridge,
        PartitionKind::Leader,
        PartitionKind::LeaderReplication,
        PartitionKind::LeaderControl,
        PartitionKind::Leaders,
        PartitionKind::All,
        PartitionKind::Controller,
    ];

    /// The name ops and the CLI use.
    pub fn name(self) -> &'static str {
        match self {
            PartitionKind::Halves => "halves",
            PartitionKind::RandomHalves => "random-halves",
            PartitionKind::One => "one",
            PartitionKind::Majority => "majority",
            PartitionKind::MinorityThird => "minority-third",
            PartitionKind::MajoritiesRing => "majorities-ring",
            PartitionKind::Bridge => "bridge",
            PartitionKind::Leader => "leader",
            PartitionKind::LeaderReplication => "leader-replication",
            PartitionKind::LeaderControl => "leader-control",
            PartitionKind::Leaders => "leaders",
            PartitionKind::All => "all",
            PartitionKind::Controller => "controller",
        }
    }

    /// The kind called `name`; `minority` is another name for `majority` (the same cut).
    pub fn parse(name: &str) -> Option<Self> {
        if name == "minority" {
            return Some(PartitionKind::Majority);
        }
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether building the grudge needs the current leaders.
    pub fn needs_leaders(self) -> bool {
        matches!(
            self,
            PartitionKind::Leader
                | PartitionKind::LeaderReplication
                | PartitionKind::LeaderControl
                | PartitionKind::Leaders
                | PartitionKind::Controller
        )
    }

    /// Whether the cut may involve dedicated controllers, not only the brokers.
    pub fn reaches_controllers(self) -> bool {
        matches!(
            self,
            PartitionKind::LeaderControl | PartitionKind::Controller
        )
    }

    /// Which traffic the cut drops.
    pub fn traffic(self) -> Traffic {
        match self {
            PartitionKind::LeaderReplication => Traffic::Listeners,
            PartitionKind::LeaderControl => Traffic::Control,
            _ => Traffic::All,
        }
    }

    /// Builds the grudge over `nodes`. `leaders` lists, per partition, the current leader, or for
    /// `Controller` the active controller alone; only the leader kinds and `Controller` read it.
    pub fn grudge(
        self,
        nodes: &[String],
        leaders: &[String],
        rng: &mut Rng,
    ) -> Result<Grudge, String> {
        let mut sorted = nodes.to_vec();
        sorted.sort();
        let mut shuffled = sorted.clone();
        shuffled.shuffle(rng);
        let split = |v: &[String], at: usize| vec![v[..at].to_vec(), v[at..].to_vec()];
        Ok(match self {
            PartitionKind::Halves => complete(&bisect(&sorted)),
            PartitionKind::RandomHalves => complete(&bisect(&shuffled)),
            PartitionKind::One => complete(&split(&shuffled, 1)),
            PartitionKind::Majority => complete(&split(&shuffled, majority(sorted.len()))),
            PartitionKind::MinorityThird => {
                complete(&split(&shuffled, minority_third(sorted.len())))
            }
            PartitionKind::MajoritiesRing => majorities_ring(&shuffled),
            PartitionKind::Bridge => bridge(&shuffled),
            PartitionKind::All => {
                complete(&sorted.iter().map(|n| vec![n.clone()]).collect::<Vec<_>>())
            }
            PartitionKind::Controller => {
                let controller = leaders.first().ok_or("no active controller is known")?;
                isolate(&sorted, std::slice::from_ref(controller))
            }
            PartitionKind::Leader
            | PartitionKind::LeaderReplication
            | PartitionKind::LeaderControl
            | PartitionKind::Leaders => {
                let mut distinct: Vec<String> = leaders
                    .iter()
                    .cloned()
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                if distinct.is_empty() {
                    return Err("no partition has a leader".into());
                }
                let chosen: Vec<String> = if self != PartitionKind::Leaders {
                    let i = rng.random_range(0..leaders.len());
                    vec![leaders[i].clone()]
                } else {
                    // At most a minority alone, so the rest can still elect.
                    distinct.shuffle(rng);
                    let k = rng.random_range(1..=distinct.len().min(minority(sorted.len())));
                    distinct.truncate(k);
                    distinct
                };
                isolate(&sorted, &chosen)
            }
        })
    }
}

/// The traffic a partition kind cuts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Traffic {
    All,
    /// The brokers' client listeners, where followers fetch.
    Listeners,
    /// The controller listeners: the metadata quorum and the brokers' heartbeats.
    Control,
}

/// Each of `alone` in a component of its own, every other node in one component.
pub fn isolate(nodes: &[String], alone: &[String]) -> Grudge {
    let mut components: Vec<Vec<String>> = alone.iter().map(|n| vec![n.clone()]).collect();
    components.push(
        nodes
            .iter()
            .filter(|n| !alone.contains(n))
            .cloned()
            .collect(),
    );
    complete(&components)
}

/// Splits at half, the smaller half first (Jepsen's `bisect`).
pub fn bisect(nodes: &[String]) -> Vec<Vec<String>> {
    let at = nodes.len() / 2;
    vec![nodes[..at].to_vec(), nodes[at..].to_vec()]
}

/// The grudge in which every node drops traffic from every node outside its component (Jepsen's
/// `complete-grudge`). Nodes that drop nothing are left out.
pub fn complete(components: &[Vec<String>]) -> Grudge {
    let all: BTreeSet<&String> = components.iter().flatten().collect();
    let mut grudge = Grudge::new();
    for component in components {
        for node in component {
            let others: BTreeSet<String> = all
                .iter()
                .filter(|n| !component.contains(n))
                .map(|n| (*n).clone())
                .collect();
            if !others.is_empty() {
                grudge.insert(node.clone(), others);
            }
        }
    }
    grudge
}

/// Every node sees a majority: the nodes sit on a ring, and the node in the middle of each run of
/// a majority of consecutive nodes sees exactly that run (Jepsen's `majorities-ring-perfect`).
/// Runs differ, so no two nodes see the same majority; for three nodes the grudge is one-way.
pub fn majorities_ring(ring: &[String]) -> Grudge {
    let n = ring.len();
    let m = majority(n);
    let mut grudge = Grudge::new();
    for start in 0..n {
        let run: Vec<&String> = (0..m).map(|i| &ring[(start + i) % n]).collect();
        let middle = run[m / 2];
        let others: BTreeSet<String> = ring.iter().filter(|x| !run.contains(x)).cloned().collect();
        if !others.is_empty() {
            grudge.insert(middle.clone(), others);
        }
    }
    grudge
}

/// Two halves cut from each other, except that the first node of the second half (the bridge)
/// sees, and is seen by, everyone (Jepsen's `bridge`).
pub fn bridge(nodes: &[String]) -> Grudge {
    let halves = bisect(nodes);
    let Some(bridge) = halves[1].first().cloned() else {
        return Grudge::new();
    };
    let rest: Vec<String> = halves[1][1..].to_vec();
    let mut grudge = complete(&[halves[0].clone(), rest]);
    grudge.remove(&bridge);
    for from in grudge.values_mut() {
        from.remove(&bridge);
    }
    grudge.retain(|_, from| !from.is_empty());
    grudge
}

/// A grudge as an op writes it (node -> the nodes it drops traffic from), checked against the
/// test's `nodes`; errors name the field under `field`. Empty lists are dropped.
pub fn known(
    raw: &BTreeMap<String, Vec<String>>,
    nodes: &[String],
    field: &str,
) -> Result<Grudge, String> {
    let mut grudge: Grudge = BTreeMap::new();
    for (node, from) in raw {
        crate::targets::known_node(node, nodes, &format!("{field}.{node}"))?;
        let list = crate::targets::known_nodes(from, nodes, &format!("{field}.{node}"))?;
        if !list.is_empty() {
            grudge.insert(node.clone(), list.into_iter().collect());
        }
    }
    Ok(grudge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tidemark_harness::generator::rng;

    fn names(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("n{i}")).collect()
    }

    fn set(xs: &[&str]) -> BTreeSet<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    /// Whether `a` can hear `b` under the grudge.
    fn hears(g: &Grudge, a: &str, b: &str) -> bool {
        !g.get(a).is_some_and(|from| from.contains(b))
    }

    #[test]
    fn halves_cut_the_smaller_first_half_from_the_rest() {
        let g = PartitionKind::Halves
            .grudge(&names(5), &[], &mut rng(1))
            .unwrap();
        assert_eq!(g["n1"], set(&["n3", "n4", "n5"]));
        assert_eq!(g["n2"], set(&["n3", "n4", "n5"]));
        assert_eq!(g["n5"], set(&["n1", "n2"]));
    }

    #[test]
    fn one_and_majority_make_two_components_of_the_right_sizes() {
        for seed in 0..20 {
            let g = PartitionKind::One
                .grudge(&names(5), &[], &mut rng(seed))
                .unwrap();
            let alone: Vec<_> = g.iter().filter(|(_, f)| f.len() == 4).collect();
            assert_eq!(alone.len(), 1, "{g:?}");
            let g = PartitionKind::Majority
                .grudge(&names(5), &[], &mut rng(seed))
                .unwrap();
            assert_eq!(g.values().filter(|f| f.len() == 2).count(), 3, "{g:?}");
            assert_eq!(g.values().filter(|f| f.len() == 3).count(), 2, "{g:?}");
        }
    }

    #[test]
    fn the_majorities_ring_gives_each_node_a_different_majority() {
        for n in [3, 5, 7] {
            let nodes = names(n);
            let g = PartitionKind::MajoritiesRing
                .grudge(&nodes, &[], &mut rng(n as u64))
                .unwrap();
            let mut seen = BTreeSet::new();
            for a in &nodes {
                let view: BTreeSet<&String> = nodes.iter().filter(|b| hears(&g, a, b)).collect();
                assert_eq!(view.len(), majority(n), "{a} in {g:?}");
                assert!(view.contains(a));
                assert!(seen.insert(view), "two nodes see the same majority: {g:?}");
            }
        }
        // Three nodes: each drops exactly one other, and no drop is mutual.
        let g = majorities_ring(&names(3));
        assert_eq!(g.len(), 3);
        for (a, from) in &g {
            assert_eq!(from.len(), 1);
            let b = from.iter().next().unwrap();
            assert!(hears(&g, b, a), "{g:?}");
        }
    }

    #[test]
    fn the_bridge_node_sees_and_is_seen_by_everyone() {
        let nodes = names(5);
        let g = bridge(&nodes);
        // Halves [n1 n2] and [n3 n4 n5]; n3 is the bridge.
        for x in &nodes {
            assert!(hears(&g, "n3", x) && hears(&g, x, "n3"), "{g:?}");
        }
        assert!(!hears(&g, "n1", "n4") && !hears(&g, "n5", "n2"));
        assert!(hears(&g, "n1", "n2") && hears(&g, "n4", "n5"));
    }

    #[test]
    fn leader_kinds_isolate_leaders_each_on_their_own() {
        let nodes = names(5);
        let leaders = vec!["n2".to_string(), "n4".to_string(), "n2".to_string()];
        for seed in 0..20 {
            let g = PartitionKind::Leaders
                .grudge(&nodes, &leaders, &mut rng(seed))
                .unwrap();
            let alone: BTreeSet<&String> = g
                .iter()
                .filter(|(_, f)| f.len() == 4)
                .map(|(n, _)| n)
                .collect();
            assert!(!alone.is_empty());
            assert!(alone.iter().all(|n| *n == "n2" || *n == "n4"), "{g:?}");
            for one in [
                PartitionKind::Leader,
                PartitionKind::LeaderReplication,
                PartitionKind::LeaderControl,
            ] {
                let g = one.grudge(&nodes, &leaders, &mut rng(seed)).unwrap();
                let alone: Vec<&String> = g
                    .iter()
                    .filter(|(_, f)| f.len() == 4)
                    .map(|(n, _)| n)
                    .collect();
                assert!(alone == ["n2"] || alone == ["n4"], "{g:?}");
            }
        }
        // With three nodes, one leader alone at a time, whichever two lead.
        let two = vec!["n1".to_string(), "n2".to_string()];
        for seed in 0..20 {
            let g = PartitionKind::Leaders
                .grudge(&names(3), &two, &mut rng(seed))
                .unwrap();
            assert_eq!(g.values().filter(|f| f.len() == 2).count(), 1, "{g:?}");
        }
        let err = PartitionKind::Leaders
            .grudge(&nodes, &[], &mut rng(1))
            .unwrap_err();
        assert!(err.contains("leader"));
    }

    #[test]
    fn all_isolates_everyone_and_names_parse() {
        let g = PartitionKind::All
            .grudge(&names(3), &[], &mut rng(1))
            .unwrap();
        assert!(g.values().all(|f| f.len() == 2));
        for k in PartitionKind::ALL {
            assert_eq!(PartitionKind::parse(k.name()), Some(k));
        }
        assert_eq!(
            PartitionKind::parse("minority"),
            Some(PartitionKind::Majority)
        );
    }

    #[test]
    fn the_controller_kind_isolates_the_controller_it_is_given() {
        let nodes: Vec<String> = ["n1", "n2", "c1", "c2", "c3"].map(String::from).to_vec();
        let g = PartitionKind::Controller
            .grudge(&nodes, &["c2".to_string()], &mut rng(1))
            .unwrap();
        assert_eq!(g["c2"].len(), 4, "{g:?}");
        assert!(["n1", "n2", "c1", "c3"]
            .iter()
            .all(|n| g[*n].len() == 1 && g[*n].contains("c2")));
        let err = PartitionKind::Controller
            .grudge(&nodes, &[], &mut rng(1))
            .unwrap_err();
        assert!(err.contains("active controller"), "{err}");
    }

    #[test]
    fn grudges_read_from_json_are_checked_and_may_be_one_way() {
        let nodes = names(3);
        let raw = |v| crate::fault::parse::<BTreeMap<String, Vec<String>>>(&v).unwrap();
        let g = known(&raw(json!({"n1": ["n2"], "n3": []})), &nodes, "grudge").unwrap();
        assert_eq!(g.len(), 1);
        assert_eq!(g["n1"], set(&["n2"]));
        let e = known(&raw(json!({"n1": ["n7"]})), &nodes, "grudge").unwrap_err();
        assert!(e.contains("`grudge.n1[0]`"), "{e}");
        let e = known(&raw(json!({"n8": []})), &nodes, "grudge").unwrap_err();
        assert!(e.contains("`grudge.n8`"), "{e}");
    }
}
