//! tidemark's nemeses: the fault kinds, how they combine into a schedule, and scripted schedules.
//!
//! - [`Fault`](fault::Fault) is one kind of fault's ops: [`partition`] (grudges through the
//!   engine's iptables `Net`), [`process`] (kill, start, pause, resume, leader-chasing bounce,
//!   leader handoff onto a frozen successor, stranded leader, lapsed follower), [`stand`]
//!   (followers leaving their leader one by one, Kafka's eligible leader replicas test),
//!   [`clock`] (libfaketime skews and strobes), [`loss`] (nftables random drop, or netem),
//!   [`corrupt`] (truncated or bit-flipped segments on stopped nodes) and [`unclean`] (a forced
//!   unclean leader election) and [`power`] (a power cut under the data directories, dropping
//!   what was not fsynced), [`disk`] (fsyncs that fail and drop what they would have made
//!   durable, as Linux's do, or a full disk), [`tiered`] (a wiped log directory, a remote store outage, KIP-1023's flag turned), and
//!   between two clusters [`mirror`] (failover, failback, and the mirror's unclean-election
//!   flag). Every op's `info` records what was actually done, in a
//!   form the same op accepts again, so histories replay.
//! - [`targets`] and [`grudge`] are the pure parts: which nodes, which cuts; [`aim`] says which
//!   of two mirrored clusters, by its role.
//! - [`cluster`] reads leaders and ISRs from Metadata and asks for elections.
//! - [`package`] gives each kind a cycle of ops, final heals and a plot colour, and combines them
//!   on one staggered schedule, like Jepsen's combined package.
//! - [`schedule`] reads a timed list of ops (or a recorded history) and replays it.
//! - [`shrink`] is the pure part of `tidemark shrink`: a recorded history's faults as a schedule
//!   that does them again, paired into faults to drop or shorten, and delta debugging.
//!
//! [`Nemeses`] puts it together as the engine's [`Nemesis`].

pub mod aim;
pub mod clock;
pub mod cluster;
pub mod corrupt;
pub mod disk;
pub mod fault;
pub mod grudge;
pub mod loss;
pub mod mirror;
pub mod package;
pub mod partition;
pub mod power;
pub mod process;
pub mod roll;
pub mod schedule;
pub mod shrink;
pub mod stand;
pub mod targets;
pub mod tiered;
pub mod unclean;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::SeedableRng;
use serde_json::{json, Value};
use tidemark_harness::generator::{Generator, Rng};
use tidemark_harness::nemesis::{Nemesis, NemesisContext};
use tidemark_harness::op::{Completion, Invocation, Outcome};
use tidemark_harness::prerequisites::Requirement;

use crate::fault::{Env, Failed, Faults};
use crate::grudge::PartitionKind;
use crate::package::{package, Combined, Package};
use crate::schedule::Schedule;
use crate::targets::NodeSpec;

/// A fault kind as the CLI names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// Network partitions.
    Partition,
    /// kill -9 and restart, leader bounces.
    Kill,
    /// SIGSTOP and SIGCONT.
    Pause,
    /// Wall-clock skew and strobes.
    Clock,
    /// Random packet loss between nodes.
    Loss,
    /// Rolling restarts: nodes stopped cleanly one after another, each waited for.
    Roll,
    /// Truncated or bit-flipped segments.
    Corrupt,
    /// Forced unclean leader elections.
    Unclean,
    /// Power loss under the data directories.
    Power,
    /// A failing disk: fsyncs that fail with EIO and drop what they would have made durable, or
    /// a full disk.
    Disk,
    /// Mirror failover and failback between two clusters.
    Failover,
    /// Flips `mirror.support.unclean.leader.election` on a topic.
    MirrorConfig,
    /// A node loses its whole log directory and starts empty.
    Wipe,
    /// The remote store of tiered storage becomes unreachable for a while.
    RemoteOutage,
    /// Turns KIP-1023's dynamic flag `follower.fetch.last.tiered.offset.enable`.
    TieredConfig,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 15] = [
        Kind::Partition,
        Kind::Kill,
        Kind::Pause,
        Kind::Clock,
        Kind::Loss,
        Kind::Roll,
        Kind::Corrupt,
        Kind::Unclean,
        Kind::Power,
        Kind::Disk,
        Kind::Failover,
        Kind::MirrorConfig,
        Kind::Wipe,
        Kind::RemoteOutage,
        Kind::TieredConfig,
    ];

    /// The default mix: everything that loses no data by design.
    pub const DEFAULT: [Kind; 6] = [
        Kind::Partition,
        Kind::Kill,
        Kind::Pause,
        Kind::Clock,
        Kind::Loss,
        Kind::Roll,
    ];

    /// The CLI's name.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Partition => "partition",
            Kind::Kill => "kill",
            Kind::Pause => "pause",
            Kind::Clock => "clock",
            Kind::Loss => "loss",
            Kind::Roll => "roll",
            Kind::Corrupt => "corrupt",
            Kind::Unclean => "unclean",
            Kind::Power => "power",
            Kind::Disk => "disk",
            Kind::Failover => "failover",
            Kind::MirrorConfig => "mirror-config",
            Kind::Wipe => "wipe",
            Kind::RemoteOutage => "remote-outage",
            Kind::TieredConfig => "tiered-config",
        }
    }

    /// Whether the kind acts on cluster mirroring (and so needs the mirror workload).
    pub fn mirrors(self) -> bool {
        matches!(self, Kind::Failover | Kind::MirrorConfig)
    }

    /// Whether the kind acts on tiered storage's remote store or flag (and so needs the tiered
    /// workload).
    pub fn tiers(self) -> bool {
        matches!(self, Kind::RemoteOutage | Kind::TieredConfig)
    }

    /// The kind called `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind whose package schedules op `f`.
    pub fn of_op(f: &str) -> Option<Self> {
        Some(match f {
            "start-partition" | "stop-partition" => Kind::Partition,
            "kill" | "start" | "bounce" | "handoff" | "strand" | "lapse" | "last-stand" => {
                Kind::Kill
            }
            "roll" => Kind::Roll,
            "pause" | "resume" => Kind::Pause,
            "clock-skew" | "clock-strobe" | "clock-reset" => Kind::Clock,
            "start-loss" | "stop-loss" => Kind::Loss,
            "corrupt-file" => Kind::Corrupt,
            "unclean-election" => Kind::Unclean,
            "power-loss" => Kind::Power,
            "disk-fault" | "disk-heal" => Kind::Disk,
            "failover" | "failback" => Kind::Failover,
            "config" => Kind::MirrorConfig,
            "wipe" => Kind::Wipe,
            "remote-outage" | "remote-restore" => Kind::RemoteOutage,
            "tiered-config" => Kind::TieredConfig,
            _ => return None,
        })
    }

    /// The target names this kind understands (with the mirror's roles of [`aim`]).
    pub fn target_names(self) -> Vec<&'static str> {
        let mut names = self.node_target_names();
        names.extend(aim::Aim::names_for(self));
        names
    }

    /// The target names of nodes within one cluster this kind understands.
    fn node_target_names(self) -> Vec<&'static str> {
        match self {
            Kind::Partition => {
                let mut v: Vec<&str> = PartitionKind::ALL.map(PartitionKind::name).to_vec();
                v.push("minority");
                v
            }
            Kind::Kill | Kind::Pause | Kind::Clock | Kind::Loss | Kind::Power | Kind::Disk => {
                NodeSpec::ALL.map(NodeSpec::name).to_vec()
            }
            // A controller holds no replica and reads no remote store.
            Kind::Wipe | Kind::RemoteOutage => NodeSpec::ALL
                .into_iter()
                .filter(|s| *s != NodeSpec::Controller)
                .map(NodeSpec::name)
                .collect(),
            Kind::Corrupt => vec!["one", "minority", "minority-third"],
            // A roll goes round the whole cluster, or two nodes of it.
            Kind::Roll
            | Kind::Unclean
            | Kind::Failover
            | Kind::MirrorConfig
            | Kind::TieredConfig => Vec::new(),
        }
    }

    /// What the nodes need for this kind's faults beyond what the runtime, net and broker need
    /// (libfaketime for clock faults is the broker's, since it starts the broker under it).
    pub fn requirements(self) -> Vec<Requirement> {
        match self {
            // A roll caps a restarted node's replication traffic with nftables.
            Kind::Loss | Kind::Unclean | Kind::Roll => {
                let by = format!("{} faults", self.name());
                vec![Requirement::program("nft", "nftables", &by)]
            }
            Kind::Power | Kind::Disk => {
                let by = format!("{} faults", self.name());
                vec![
                    Requirement::program("fusermount3", "fuse3", &by),
                    Requirement::device(std::path::Path::new("/dev/fuse"), "fuse3", &by),
                ]
            }
            Kind::Partition
            | Kind::Kill
            | Kind::Pause
            | Kind::Clock
            | Kind::Corrupt
            | Kind::Failover
            | Kind::MirrorConfig
            | Kind::Wipe
            | Kind::RemoteOutage
            | Kind::TieredConfig => Vec::new(),
        }
    }

    /// The targets a kind draws from unless told otherwise.
    pub fn default_targets(self) -> Vec<&'static str> {
        match self {
            Kind::Partition => vec![
                "one",
                "majority",
                "majorities-ring",
                "bridge",
                "controller",
                "leader",
                "leader-replication",
                "leader-control",
                "leaders",
            ],
            Kind::Kill => vec![
                "one",
                "minority",
                "majority",
                "controller",
                "leader",
                "leaders",
                "all",
            ],
            // A whole cluster paused only stands still.
            Kind::Pause => vec![
                "one",
                "minority",
                "majority",
                "controller",
                "leader",
                "leaders",
            ],
            Kind::Clock | Kind::Loss => vec!["one", "minority", "majority", "all"],
            Kind::Corrupt => vec!["one", "minority"],
            Kind::Roll | Kind::Unclean | Kind::Failover | Kind::MirrorConfig => Vec::new(),
            // One node (Kafka's replication must cover it) or the whole cluster at once (only
            // per-message flush covers that).
            Kind::Power => vec!["one", "all"],
            // One node, a leader (its log is what acknowledgements rest on), every node at
            // once (the whole ISR's copies with a hole in them), or the active controller (the
            // metadata quorum's log; a dedicated controller's is on no broker).
            Kind::Disk => vec!["one", "leader", "all", "controller"],
            // One replica at a time: a wiped minority must rebuild from the others and the
            // remote store; a wiped majority of one partition's replicas is data lost by design.
            Kind::Wipe => vec!["one", "leader"],
            // The whole store down (an object store outage), or one node cut off from it.
            Kind::RemoteOutage => vec!["all", "one", "leader"],
            // The flag is the cluster's.
            Kind::TieredConfig => Vec::new(),
        }
    }
}

/// Parses `--nemesis`: kind names separated by commas, `all`, or `none`.
pub fn parse_kinds(list: &str) -> Result<Vec<Kind>, String> {
    let mut kinds = Vec::new();
    let mut unknown = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match word {
            "none" => {}
            "all" => kinds.extend(Kind::ALL),
            "default" => kinds.extend(Kind::DEFAULT),
            w => match Kind::parse(w) {
                Some(k) => kinds.push(k),
                None => unknown.push(w.to_string()),
            },
        }
    }
    if !unknown.is_empty() {
        return Err(format!(
            "unknown fault kind(s): {}. Known: {}, or all, default, none",
            unknown.join(", "),
            Kind::ALL.map(Kind::name).join(", ")
        ));
    }
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// Parses `--nemesis-targets` for `kinds`: target names separated by commas, each either plain
/// (used by every chosen kind that understands it) or `kind:target` (for that kind only). A kind
/// given targets of its own uses only those; one that understands none of the plain ones keeps
/// its defaults.
pub fn parse_targets(list: &str, kinds: &[Kind]) -> Result<BTreeMap<Kind, Vec<String>>, String> {
    let mut plain: Vec<&str> = Vec::new();
    let mut own: BTreeMap<Kind, Vec<String>> = BTreeMap::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match word.split_once(':') {
            Some((k, t)) => {
                let kind = Kind::parse(k)
                    .ok_or_else(|| format!("--nemesis-targets {word}: unknown fault kind {k:?}"))?;
                if !kinds.contains(&kind) {
                    return Err(format!(
                        "--nemesis-targets {word}: {k} is not among the chosen fault kinds"
                    ));
                }
                if !kind.target_names().contains(&t) {
                    return Err(format!(
                        "--nemesis-targets {word}: {k} targets are {}",
                        if kind.target_names().is_empty() {
                            "not chosen (it picks its own partition)".to_string()
                        } else {
                            kind.target_names().join(", ")
                        }
                    ));
                }
                own.entry(kind).or_default().push(t.to_string());
            }
            None => {
                if !kinds.iter().any(|k| k.target_names().contains(&word)) {
                    return Err(format!(
                        "--nemesis-targets {word}: no chosen fault kind ({}) understands it",
                        kinds
                            .iter()
                            .map(|k| k.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
                plain.push(word);
            }
        }
    }
    Ok(kinds
        .iter()
        .map(|k| {
            let mine: Vec<String> = match own.remove(k) {
                Some(list) => list,
                None => {
                    let names = k.target_names();
                    let shared: Vec<String> = plain
                        .iter()
                        .filter(|p| names.contains(p))
                        .map(|p| p.to_string())
                        .collect();
                    if shared.is_empty() {
                        k.default_targets().into_iter().map(String::from).collect()
                    } else {
                        shared
                    }
                }
            };
            (*k, mine)
        })
        .collect())
}

/// How the nemeses are set up.
#[derive(Debug, Clone)]
pub struct NemesisOptions {
    /// The fault kinds of the generated schedule.
    pub kinds: Vec<Kind>,
    /// The mean gap between two ops of one kind.
    pub interval: Duration,
    /// Per kind, the targets it draws from (kinds missing here use their defaults).
    pub targets: BTreeMap<Kind, Vec<String>>,
    /// Seeds the nemesis's own choices (which nodes a spec resolves to).
    pub seed: u64,
    /// The forced unclean election's ports and timings.
    pub unclean: unclean::Unclean,
    /// What is mirrored between two clusters, when the test mirrors: the mirror faults act on
    /// it, and the other kinds' faults land on the source or the destination (at random, or
    /// as their targets aim them).
    pub mirror: Option<mirror::MirrorSetup>,
}

impl Default for NemesisOptions {
    fn default() -> Self {
        NemesisOptions {
            kinds: Kind::DEFAULT.to_vec(),
            interval: Duration::from_secs(10),
            targets: BTreeMap::new(),
            seed: 0,
            unclean: unclean::Unclean::default(),
            mirror: None,
        }
    }
}

/// Every fault kind, for routing ops and checking schedules (the mirror faults only when the
/// test mirrors).
pub fn all_faults(options: &NemesisOptions) -> Faults {
    let mut faults: Faults = vec![
        Arc::new(partition::Partition),
        Arc::new(process::Process),
        Arc::new(stand::LastStand),
        Arc::new(roll::Roll),
        Arc::new(clock::Clock::default()),
        Arc::new(loss::Loss),
        Arc::new(corrupt::Corrupt),
        Arc::new(options.unclean.clone()),
        Arc::new(power::Power),
        Arc::new(disk::Disk),
        Arc::new(tiered::Tiered),
    ];
    if let Some(setup) = &options.mirror {
        faults.push(Arc::new(mirror::MirrorFaults::new(setup.clone())));
    }
    faults
}

/// The nemesis of `tidemark test`: a combined package of the chosen kinds, or a scripted
/// schedule, performed by the fault kinds.
pub struct Nemeses {
    options: NemesisOptions,
    faults: Faults,
    mirror: Option<Arc<mirror::MirrorFaults>>,
    schedule: Option<Schedule>,
    rng: Mutex<Rng>,
}

impl Nemeses {
    /// Generated faults of `options.kinds`.
    pub fn new(options: NemesisOptions) -> Self {
        let rng = Mutex::new(Rng::seed_from_u64(options.seed ^ 0x6e65_6d65_7369_7321));
        let mut faults = all_faults(&options);
        // The mirror faults keep the mirror's direction, which settling needs: one instance.
        faults.retain(|f| !f.fs().contains(&"failover"));
        let mirror = options
            .mirror
            .clone()
            .map(|setup| Arc::new(mirror::MirrorFaults::new(setup)));
        if let Some(m) = &mirror {
            faults.push(m.clone());
        }
        Nemeses {
            faults,
            mirror,
            options,
            schedule: None,
            rng,
        }
    }

    /// Replays `schedule` instead of generating faults; its kinds replace `options.kinds`.
    pub fn scripted(mut options: NemesisOptions, schedule: Schedule) -> Self {
        options.kinds = schedule.kinds();
        let mut n = Self::new(options);
        n.schedule = Some(schedule);
        n
    }

    /// The fault kinds in use.
    pub fn kinds(&self) -> &[Kind] {
        &self.options.kinds
    }

    /// The packages of the kinds in use, their faults aimed at the mirror's roles their
    /// targets name.
    pub fn packages(&self) -> Vec<Package> {
        self.options
            .kinds
            .iter()
            .map(|k| {
                let targets =
                    self.options.targets.get(k).cloned().unwrap_or_else(|| {
                        k.default_targets().into_iter().map(String::from).collect()
                    });
                let (aims, specs) = aim::Aim::split(*k, &targets);
                let mut p = package(*k, specs, self.options.mirror.as_ref());
                p.aims = aims;
                p
            })
            .collect()
    }
}

impl Nemesis for Nemeses {
    fn fs(&self) -> Vec<&'static str> {
        self.faults
            .iter()
            .flat_map(|f| f.fs().iter().copied())
            .collect()
    }

    fn invoke(&self, cx: &NemesisContext<'_>, op: &Invocation) -> Completion {
        let Some(fault) = self.faults.iter().find(|f| f.fs().contains(&op.f.as_str())) else {
            let mut c = Completion::new(Outcome::Info, json!({}));
            c.error = Some(format!("no fault kind performs {:?}", op.f));
            return c;
        };
        let (value, burst) = match take_burst(&op.value) {
            Ok(split) => split,
            Err(error) => {
                let mut c = Completion::new(Outcome::Info, json!({}));
                c.error = Some(error);
                return c;
            }
        };
        // The clients send as fast as they can meanwhile: the fault lands on a leader with
        // writes in flight and just acknowledged.
        if let Some(ms) = burst {
            std::thread::sleep(Duration::from_millis(ms));
        }
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let mut env = Env {
            cx,
            rng: &mut rng,
            leaders: None,
        };
        let performed = fault
            .parse(&op.f, &value, &env.every_name())
            .map_err(Failed::nothing)
            .and_then(|parsed| parsed.invoke(&mut env));
        let (mut value, error) = match performed {
            Ok(value) => (value, None),
            Err(Failed { done, error }) => (done, Some(error)),
        };
        // The invocation records the burst; the info only what the fault did, so replaying it
        // acts at once.
        if let Value::Object(m) = &mut value {
            // An aimed fault's record keeps the role it was aimed at.
            if let Some(role) = op.value.get("role") {
                m.insert("role".into(), role.clone());
            }
            if let Some(leaders) = env.leaders.take() {
                m.entry("leaders").or_insert(json!(leaders));
            }
        }
        let mut c = Completion::new(Outcome::Info, value);
        c.error = error;
        c
    }

    fn generator(&self) -> Box<dyn Generator> {
        match &self.schedule {
            Some(s) => Box::new(s.generator()),
            None => {
                let combined =
                    Combined::new(self.packages(), self.options.interval.as_nanos() as u64);
                Box::new(match &self.options.mirror {
                    Some(m) => combined.between(&m.source, &m.destination),
                    None => combined,
                })
            }
        }
    }

    fn heal_ops(&self) -> Vec<Invocation> {
        self.packages().into_iter().flat_map(|p| p.heal).collect()
    }

    fn settle_ops(&self) -> Vec<Invocation> {
        self.mirror
            .as_ref()
            .map(|m| m.settle_ops())
            .unwrap_or_default()
    }

    fn describe(&self) -> Value {
        let packages = self.packages();
        json!({
            "kinds": self.options.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "interval_s": self.options.interval.as_secs_f64(),
            "targets": packages.iter().map(|p| {
                let t = self.options.targets.get(&p.kind).cloned().unwrap_or_else(|| {
                    p.kind.default_targets().into_iter().map(String::from).collect()
                });
                (p.kind.name().to_string(), json!(t))
            }).collect::<BTreeMap<String, Value>>(),
            "perf": packages.iter().map(|p| p.perf.clone()).collect::<Vec<_>>(),
            "scripted_ops": self.schedule.as_ref().map(|s| s.ops.len()),
            "mirror": self.options.mirror.as_ref().map(|m| json!({
                "source": m.source, "destination": m.destination, "topics": m.topics,
                "unclean_support": m.unclean_support,
            })),
        })
    }
}

/// The field of a fault op asking for a burst of client sends before it acts (milliseconds);
/// the queue workload's generator hears it on the op's invocation.
pub const BURST_KEY: &str = tidemark_harness::generator::BURST_KEY;

/// Splits the burst off an op's value: the value the fault parses, and the burst's length.
pub(crate) fn take_burst(value: &Value) -> Result<(Value, Option<u64>), String> {
    let mut value = value.clone();
    let burst = match &mut value {
        Value::Object(m) => m.remove(BURST_KEY),
        _ => None,
    };
    match burst {
        None => Ok((value, None)),
        Some(b) => match b.as_u64() {
            Some(ms) if ms <= 60_000 => Ok((value, Some(ms))),
            _ => Err(format!(
                "{BURST_KEY} must be a whole number of milliseconds up to 60000, not {b}"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_split_off_before_the_fault_parses_its_op() {
        let (v, b) = take_burst(&json!({"targets": "leader", "burst_ms": 800})).unwrap();
        assert_eq!((v, b), (json!({"targets": "leader"}), Some(800)));
        let (v, b) = take_burst(&json!({"targets": "one"})).unwrap();
        assert_eq!((v, b), (json!({"targets": "one"}), None));
        let e = take_burst(&json!({"burst_ms": "soon"})).unwrap_err();
        assert!(e.contains("burst_ms"), "{e}");
    }

    #[test]
    fn kinds_parse_with_all_none_and_default() {
        assert_eq!(parse_kinds("none").unwrap(), vec![]);
        assert_eq!(parse_kinds("").unwrap(), vec![]);
        assert_eq!(parse_kinds("all").unwrap(), Kind::ALL.to_vec());
        assert_eq!(parse_kinds("default").unwrap(), Kind::DEFAULT.to_vec());
        assert_eq!(
            parse_kinds("pause, kill,kill").unwrap(),
            vec![Kind::Kill, Kind::Pause]
        );
        let e = parse_kinds("kill,meteor-strike").unwrap_err();
        assert!(e.starts_with("unknown fault kind(s): meteor-strike"), "{e}");
    }

    #[test]
    fn every_op_belongs_to_one_kind_and_one_fault() {
        let faults = all_faults(&NemesisOptions::default());
        let mut seen = std::collections::BTreeSet::new();
        for f in faults.iter().flat_map(|f| f.fs().iter()) {
            assert!(seen.insert(*f), "{f} performed twice");
            assert!(Kind::of_op(f).is_some(), "{f}");
        }
        for k in Kind::ALL {
            for t in k.default_targets() {
                assert!(k.target_names().contains(&t), "{k:?} {t}");
            }
        }
    }

    #[test]
    fn targets_apply_to_the_kinds_that_understand_them() {
        let kinds = vec![Kind::Partition, Kind::Kill, Kind::Clock];
        let t = parse_targets("leaders,bridge", &kinds).unwrap();
        assert_eq!(t[&Kind::Partition], vec!["leaders", "bridge"]);
        assert_eq!(t[&Kind::Kill], vec!["leaders"]);
        assert_eq!(t[&Kind::Clock], vec!["leaders"]);
        let t = parse_targets("one,kill:all,kill:leader", &kinds).unwrap();
        assert_eq!(t[&Kind::Kill], vec!["all", "leader"]);
        assert_eq!(t[&Kind::Partition], vec!["one"]);
        let t = parse_targets("majorities-ring", &kinds).unwrap();
        assert_eq!(t[&Kind::Kill], Kind::Kill.default_targets());
        let e = parse_targets("bridge", &[Kind::Kill]).unwrap_err();
        assert!(e.contains("no chosen fault kind (kill)"), "{e}");
        let e = parse_targets("kill:bridge", &kinds).unwrap_err();
        assert!(e.contains("kill targets are one"), "{e}");
        let e = parse_targets("pause:one", &kinds).unwrap_err();
        assert!(e.contains("not among the chosen"), "{e}");
        let e = parse_targets("x:one", &kinds).unwrap_err();
        assert!(e.contains("unknown fault kind"), "{e}");
        // The mirror's roles mix with node specs; the unclean election takes clusters only.
        let kinds = vec![Kind::Kill, Kind::Unclean];
        let t = parse_targets("source-leaders,destination,kill:one", &kinds).unwrap();
        assert_eq!(t[&Kind::Kill], vec!["one"]);
        assert_eq!(t[&Kind::Unclean], vec!["destination"]);
        let t = parse_targets("kill:source,kill:leader", &kinds).unwrap();
        assert_eq!(t[&Kind::Kill], vec!["source", "leader"]);
        let e = parse_targets("unclean:source-leaders", &kinds).unwrap_err();
        assert!(e.contains("unclean targets are source, destination"), "{e}");
    }

    #[test]
    fn heal_ops_cover_what_the_engine_cannot_heal() {
        let n = Nemeses::new(NemesisOptions::default());
        let fs: Vec<String> = n.heal_ops().into_iter().map(|o| o.f).collect();
        assert_eq!(fs, vec!["clock-reset", "stop-loss"]);
        let d = n.describe();
        assert_eq!(
            d["kinds"],
            json!(["partition", "kill", "pause", "clock", "loss", "roll"])
        );
        assert_eq!(d["perf"][0]["start"], json!(["start-partition"]));
    }
}
