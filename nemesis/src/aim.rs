//! Mirror-aware targets: between two mirrored clusters, a fault can be aimed at a cluster by its
//! role rather than its name (`--nemesis-targets source,destination-leaders`), because failovers
//! and failbacks swap the roles during a run and the faults worth having follow them: a
//! partition of the source's leaders while clients write to it, a paused destination replica
//! while it truncates to the last mirrored epoch.
//!
//! The source is the cluster clients write to (after a failover, the cluster that took over),
//! the destination the other one (mirroring it, or, between a failover and its failback, the old
//! source that will mirror it). An aim is resolved when its fault is generated, from the
//! direction the mirror faults recorded last; nothing else runs on the nemesis worker between
//! then and the fault, so that is the direction in force when the fault happens. The op records
//! both the aim (`"role": "source-leaders"`) and the cluster it resolved to (`"cluster": "b"`);
//! its undoing goes to the same cluster whatever the roles are by then.

use serde_json::{json, Value};
use tidemark_harness::op::Invocation;

use crate::Kind;

/// A cluster's role in the mirror.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// The cluster clients write to.
    Source,
    /// The other cluster.
    Destination,
}

/// Where a fault lands: the cluster of `role`, and with `leaders` the nodes leading some
/// partition there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Aim {
    /// The cluster's role.
    pub role: Role,
    /// Whether the fault takes that cluster's partition leaders.
    pub leaders: bool,
}

impl Aim {
    /// Every aim.
    pub const ALL: [Aim; 4] = [
        Aim::new(Role::Source, false),
        Aim::new(Role::Destination, false),
        Aim::new(Role::Source, true),
        Aim::new(Role::Destination, true),
    ];

    const fn new(role: Role, leaders: bool) -> Self {
        Aim { role, leaders }
    }

    /// The name `--nemesis-targets` and the op's `role` use.
    pub fn name(self) -> &'static str {
        match (self.role, self.leaders) {
            (Role::Source, false) => "source",
            (Role::Destination, false) => "destination",
            (Role::Source, true) => "source-leaders",
            (Role::Destination, true) => "destination-leaders",
        }
    }

    /// The aim called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The aims `kind` understands: every kind that acts on one cluster's nodes.
    pub fn names_for(kind: Kind) -> Vec<&'static str> {
        match kind {
            Kind::Partition
            | Kind::Kill
            | Kind::Pause
            | Kind::Clock
            | Kind::Loss
            | Kind::Power
            | Kind::Disk => Self::ALL.map(Aim::name).to_vec(),
            // Corruption stops its nodes, a few at most; an unclean election picks its own
            // partition and replica; a roll goes round its cluster.
            Kind::Corrupt | Kind::Unclean | Kind::Roll => vec!["source", "destination"],
            Kind::Failover | Kind::MirrorConfig => Vec::new(),
            // Tiered storage is tested on one cluster.
            Kind::Wipe | Kind::RemoteOutage | Kind::TieredConfig => Vec::new(),
        }
    }

    /// Splits a kind's targets into its aims and its node specs (the kind's defaults when none
    /// is given).
    pub fn split(kind: Kind, targets: &[String]) -> (Vec<Aim>, Vec<String>) {
        let aims: Vec<Aim> = targets.iter().filter_map(|t| Aim::parse(t)).collect();
        let specs: Vec<String> = targets
            .iter()
            .filter(|t| Aim::parse(t).is_none())
            .cloned()
            .collect();
        if specs.is_empty() {
            let defaults = kind.default_targets().into_iter().map(String::from);
            (aims, defaults.collect())
        } else {
            (aims, specs)
        }
    }

    /// The cluster this aim names, given the mirror's `source` and `destination` now.
    pub fn cluster<'a>(self, source: &'a str, destination: &'a str) -> &'a str {
        match self.role {
            Role::Source => source,
            Role::Destination => destination,
        }
    }

    /// Aims `op` (a fault, not its undoing) at `cluster`, recording the aim; a leaders aim
    /// replaces the op's node spec or partition kind with `leaders` (ops without one, bounces
    /// and handoffs, act on leaders already).
    pub fn apply(self, op: &mut Invocation, cluster: &str) {
        let Value::Object(m) = &mut op.value else {
            return;
        };
        m.insert("cluster".into(), json!(cluster));
        m.insert("role".into(), json!(self.name()));
        if self.leaders {
            for field in ["targets", "kind"] {
                if m.contains_key(field) {
                    m.insert(field.into(), json!("leaders"));
                }
            }
        }
    }
}

/// Checks that `targets` (per kind, as `parse_targets` gives them) aim at roles only when the
/// test mirrors: one cluster has no source or destination.
pub fn check_mirrored<'a>(
    mut targets: impl Iterator<Item = &'a String>,
    mirroring: bool,
) -> Result<(), String> {
    match targets.find(|t| Aim::parse(t).is_some()) {
        Some(t) if !mirroring => Err(format!(
            "--nemesis-targets {t}: aiming at a mirror's source or destination needs \
             --workload mirror"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn names_round_trip_and_every_aimable_kind_understands_them() {
        for a in Aim::ALL {
            assert_eq!(Aim::parse(a.name()), Some(a));
        }
        assert_eq!(Aim::parse("sources"), None);
        for k in Kind::ALL {
            for name in Aim::names_for(k) {
                assert!(k.target_names().contains(&name), "{k:?} {name}");
            }
        }
        assert_eq!(Aim::names_for(Kind::Unclean), ["source", "destination"]);
        assert!(Aim::names_for(Kind::Failover).is_empty());
    }

    #[test]
    fn targets_split_into_aims_and_specs_with_defaults_when_only_aims_are_given() {
        let (aims, specs) = Aim::split(Kind::Kill, &strings(&["source-leaders", "one"]));
        assert_eq!(aims, [Aim::new(Role::Source, true)]);
        assert_eq!(specs, ["one"]);
        let (aims, specs) = Aim::split(Kind::Pause, &strings(&["destination"]));
        assert_eq!(aims, [Aim::new(Role::Destination, false)]);
        assert_eq!(specs, Kind::Pause.default_targets());
        let (aims, specs) = Aim::split(Kind::Kill, &strings(&["leader"]));
        assert!(aims.is_empty());
        assert_eq!(specs, ["leader"]);
    }

    #[test]
    fn an_aim_names_the_cluster_of_its_role_and_leaders_replace_the_spec() {
        let aim = Aim::parse("destination-leaders").unwrap();
        assert_eq!(aim.cluster("b", "a"), "a");
        let mut kill = Invocation {
            f: "kill".into(),
            value: json!({"targets": "one"}),
        };
        aim.apply(&mut kill, "a");
        assert_eq!(
            kill.value,
            json!({"targets": "leaders", "cluster": "a", "role": "destination-leaders"})
        );
        let mut cut = Invocation {
            f: "start-partition".into(),
            value: json!({"kind": "bridge"}),
        };
        aim.apply(&mut cut, "a");
        assert_eq!(cut.value["kind"], "leaders");
        let mut bounce = Invocation {
            f: "bounce".into(),
            value: json!({"times": 2}),
        };
        Aim::parse("source").unwrap().apply(&mut bounce, "b");
        assert_eq!(
            bounce.value,
            json!({"times": 2, "cluster": "b", "role": "source"})
        );
    }

    #[test]
    fn aims_need_a_mirrored_test() {
        let t = strings(&["one", "source"]);
        assert!(check_mirrored(t.iter(), true).is_ok());
        let e = check_mirrored(t.iter(), false).unwrap_err();
        assert!(
            e.starts_with("--nemesis-targets source:") && e.contains("--workload mirror"),
            "{e}"
        );
        assert!(check_mirrored(strings(&["leaders"]).iter(), false).is_ok());
    }
}
