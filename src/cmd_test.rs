//! `tidemark test`: builds a [`Test`] from the command line — the netns runtime, the bundled
//! broker found beside this executable, the chosen workload — runs it, and exits like Jepsen:
//! 0 valid, 1 invalid, 2 unknown, 254 bad usage, 255 the harness failed.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tidemark_harness::broker::{BrokerConfig, TidemarkBroker, MIRROR_UNCLEAN_KEY};
use tidemark_harness::docker::{self, DockerRuntime, DEFAULT_IMAGE};
use tidemark_harness::hosts::{read_nodes_file, HostsRuntime};
use tidemark_harness::leftovers;
use tidemark_harness::nemesis::Nemesis;
use tidemark_harness::net::Iptables;
use tidemark_harness::netns::{self, NetnsRuntime};
use tidemark_harness::prerequisites::{self, Requirement};
use tidemark_harness::progress::Progress;
use tidemark_harness::runner::{self, CancellationToken, RunOutcome};
use tidemark_harness::runtime::Runtime;
use tidemark_harness::test::{cluster_names, controller_names, node_names, Test, TestOptions};
use tidemark_harness::workload::Workload;
use tidemark_nemesis::mirror::MirrorSetup;
use tidemark_nemesis::schedule::{ClusterNodes, Schedule};
use tidemark_nemesis::{
    aim, all_faults, parse_kinds, parse_targets, Kind, Nemeses, NemesisOptions,
};
use tidemark_workloads::group::SESSION_TIMEOUT;
use tidemark_workloads::mirror::{MirrorOptions, MirrorWorkload};
use tidemark_workloads::queue::{ConsumerMode, ProducerMode, Queue, QueueOptions};

use crate::hosts_args::HostsArgs;

/// Arguments of `tidemark test`.
#[derive(clap::Args, Debug)]
#[command(after_help = "The netns runtime needs root. Examples:\n  \
    tidemark test --time-limit 30\n  \
    tidemark test --nodes 5 --concurrency 20 --rate 500 --seed 7\n  \
    tidemark test --nemesis partition,kill --nemesis-targets leaders --nemesis-interval 3\n  \
    tidemark test --nemesis-schedule store/latest/history.jsonl --seed 7\n  \
    tidemark test --workload mirror --nemesis failover,partition,kill,unclean --time-limit 30\n  \
    tidemark test --workload tiered --nemesis wipe,kill,partition,remote-outage,tiered-config --time-limit 60\n  \
    tidemark test --runtime hosts --nodes-file vms.txt --ssh-key ~/.ssh/id_ed25519\n  \
    tidemark image build && tidemark test --runtime docker --nemesis partition,kill\n\
    Writes store/<test>/<time>/ (test.json, history.jsonl, replicas.jsonl, results.json, nodes/).")]
pub struct Args {
    /// The workload: what clients do and how the history is checked. `queue`; `mirror`:
    /// two clusters, the second mirroring the first, with the fault kinds `failover` and
    /// `mirror-config` available; or `tiered`: the queue on topics with tiered storage on (small
    /// segments, short local retention, a remote store the nodes share), with the fault kinds
    /// `remote-outage` and `tiered-config` available.
    #[arg(long, default_value = "queue", value_name = "NAME")]
    workload: String,
    /// With `--workload mirror`: `mirror.support.unclean.leader.election` on every topic at the
    /// start (the brokers' default; `mirror-config` faults flip it per topic).
    #[arg(long)]
    mirror_unclean_support: bool,
    /// With `--workload queue` or `tiered`: `plain` sends (one attempt each, no producer id) or
    /// `idempotent` ones (a producer id per process, a sequence per partition, a batch whose
    /// answer is lost sent again unchanged; a duplicate is then an anomaly) [default: plain;
    /// idempotent with `--workload tiered`, whose followers rebuild the producers' state from
    /// the remote store, and whose replicas are compared on it].
    #[arg(long, value_name = "MODE")]
    producer: Option<String>,
    /// With `--workload queue` or `tiered`: `assign` (each poll names its partition and offset) or `group`
    /// (every process a member of one consumer group: polls read the partitions it is assigned
    /// from the group's committed offsets, and commits move them).
    #[arg(long, default_value = "assign", value_name = "MODE")]
    consumer: String,
    /// Seconds of workload before healing and the final reads.
    #[arg(long, default_value_t = 60.0, value_name = "S")]
    time_limit: f64,
    /// Number of broker nodes of each cluster (default: 3, or every host of --nodes-file).
    #[arg(long, value_name = "N")]
    nodes: Option<usize>,
    /// Dedicated controller nodes of each cluster (KRaft's production layout: `c1`, `c2`, ...,
    /// or `a-c1`, ... with more than one cluster), beside --nodes broker-only nodes (with
    /// --nodes-file, the last N hosts of each cluster); 0: every node is both broker and
    /// controller. Faults drawn from target specs hit the brokers, but for `controller` (the
    /// active controller, a default target of partitions, kills and pauses) and
    /// `leader-control` (a leader cut off from the controllers, a default partition).
    #[arg(long, default_value_t = 0, value_name = "N")]
    controllers: usize,
    /// Number of independent clusters, `a`, `b`, ..., each with its own quorum of --nodes nodes
    /// (`a1`, `a2`, ..., `b1`, ... when more than one); the workload runs against the first, and
    /// so do faults (default: 1, 2 for `--workload mirror`, or the clusters of --nodes-file).
    #[arg(long, value_name = "N")]
    clusters: Option<usize>,
    /// Replicas per partition (default: min(3, nodes)).
    #[arg(long, value_name = "N")]
    replication_factor: Option<u32>,
    /// Number of concurrent client workers.
    #[arg(long, default_value_t = 10, value_name = "N")]
    concurrency: usize,
    /// Client ops per second over all workers; 0 for as fast as they go.
    #[arg(long, default_value_t = 100.0, value_name = "R")]
    rate: f64,
    /// Seed of every random choice of the schedule (default: from the clock, printed).
    #[arg(long, value_name = "N")]
    seed: Option<u64>,
    /// Where run directories go.
    #[arg(long, default_value = "store", value_name = "DIR")]
    store: PathBuf,
    /// Turn on a known broker bug (repeatable), to prove the checkers catch it.
    #[arg(long, value_name = "NAME")]
    inject_bug: Vec<String>,
    /// Where nodes come from: `netns` (namespaces on this machine, needs root), `hosts`
    /// (machines listed in --nodes-file, over SSH) or `docker` (a container per node from
    /// --docker-image, driven over SSH like hosts).
    #[arg(long, default_value = "netns", value_name = "NAME")]
    runtime: String,
    /// How to reach the machines of `--runtime hosts` (kept apart, and boxed, because most runs
    /// never use them).
    #[command(flatten)]
    hosts: Box<HostsArgs>,
    /// The node image of `--runtime docker` (made by `tidemark image build`).
    #[arg(long, default_value = DEFAULT_IMAGE, value_name = "NAME")]
    docker_image: String,
    /// The tidemark-broker binary to deploy (default: beside this executable). Power faults
    /// also deploy tidemark-powerfs from beside it.
    #[arg(long, value_name = "PATH")]
    broker_binary: Option<PathBuf>,
    /// Set a broker property on every node (repeatable), e.g.
    /// `--broker-config log.flush.interval.messages=1`; wins over tidemark's settings.
    #[arg(long, value_name = "KEY=VALUE")]
    broker_config: Vec<String>,
    /// Milliseconds one client op may take before it ends `info`.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    op_timeout_ms: u64,
    /// Seconds replicas get to converge after healing.
    #[arg(long, default_value_t = 10.0, value_name = "S")]
    converge_timeout: f64,
    /// Seconds the final reads may take.
    #[arg(long, default_value_t = 30.0, value_name = "S")]
    final_timeout: f64,
    /// The test's name in the store (default: the workload's).
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// Records that this run is a shrink of the run in RUN_DIR (test.json `shrunk_from`);
    /// `tidemark shrink` sets it on its runs.
    #[arg(long, value_name = "RUN_DIR")]
    shrunk_from: Option<PathBuf>,
    /// With `--shrunk-from`: the anomaly type the shrink keeps (test.json `shrunk_keeping`).
    #[arg(long, value_name = "TYPE", requires = "shrunk_from")]
    shrunk_keeping: Option<String>,
    /// The faults: which kinds, how often, on which nodes, or a scripted schedule (last, so
    /// their help heading covers only them).
    #[command(flatten)]
    faults: Box<NemesisArgs>,
}

/// The fault options.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Faults")]
struct NemesisArgs {
    /// Fault kinds, comma separated: partition, kill, pause, clock, loss, roll (rolling
    /// restarts), corrupt, unclean, power, disk (fsyncs fail and drop what they would have made
    /// durable, or the disk is full or nearly so), wipe (a node loses its log directory and
    /// starts empty), with `--workload mirror`
    /// failover (failover then failback) and mirror-config (flip
    /// mirror.support.unclean.leader.election), with `--workload tiered` remote-outage (the
    /// remote store unreachable for a while) and tiered-config (turn KIP-1023's
    /// follower.fetch.last.tiered.offset.enable at run time); or `all`, or `none`
    /// [default: partition,kill,pause,clock,loss,roll; with `--workload mirror` also failover;
    /// with `--workload tiered` also wipe and remote-outage]. Between mirrored clusters each
    /// fault lands on the mirror's source or destination at random, unless --nemesis-targets
    /// names roles.
    #[arg(long, value_name = "LIST")]
    nemesis: Option<String>,
    /// Seconds a fault lasts on average, from when it is in force; a calm of up to half this
    /// follows it. One fault at a time is in force (clock faults, failovers and failbacks aside,
    /// whose gaps last up to twice this).
    #[arg(long, default_value_t = 6.0, value_name = "S")]
    nemesis_interval: f64,
    /// Which nodes faults hit, comma separated: one, minority, majority, minority-third, leader,
    /// leaders, all, controller (the quorum's active controller, from DescribeQuorum); for
    /// partitions also halves, random-halves, majorities-ring, bridge,
    /// leader-replication (the leader cut off from the other brokers on their listeners only),
    /// leader-control (the leader cut off from the controllers, replication and clients up). With
    /// `--workload mirror` also which cluster, by its role when the fault happens: source (the
    /// one clients write to), destination, source-leaders, destination-leaders (unclean and
    /// corrupt: source, destination). A `kind:target` entry applies to that kind only.
    #[arg(long, value_name = "LIST")]
    nemesis_targets: Option<String>,
    /// Replay a scripted schedule instead: a JSON list of timed fault ops as the history records
    /// them, or a recorded history.jsonl.
    #[arg(long, value_name = "FILE")]
    nemesis_schedule: Option<PathBuf>,
    /// libfaketime on the nodes, for clock faults.
    #[arg(long, default_value = FAKETIME_LIBRARY, value_name = "PATH")]
    faketime_library: PathBuf,
}

/// Where Debian's `faketime` package puts the preload library.
const FAKETIME_LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// The nemesis a test asked for, and what the broker needs for it.
struct Faults {
    nemesis: Option<Arc<dyn Nemesis>>,
    kinds: Vec<String>,
    faketime: Option<PathBuf>,
    powerfs: bool,
}

/// The faults of a test that names none: the default mix, and the faults that exercise what its
/// workload adds: failovers between mirrored clusters (the move the mirror exists for), and for
/// tiered storage, replicas rebuilding from the remote store (wipes) and the store going away.
fn default_kinds(mirror: bool, tiered: bool) -> Vec<Kind> {
    let mut kinds = Kind::DEFAULT.to_vec();
    if mirror {
        kinds.push(Kind::Failover);
    }
    if tiered {
        kinds.extend([Kind::Wipe, Kind::RemoteOutage]);
    }
    kinds
}

/// Builds the nemesis. Kinds that need something this machine lacks are an error when asked for
/// and left out of the default mix (with a note); on SSH hosts nothing can be checked here.
fn faults(
    args: &NemesisArgs,
    clusters: &[ClusterNodes],
    seed: u64,
    local: bool,
    mirror: Option<MirrorSetup>,
    tiered: bool,
) -> Result<Faults, Problem> {
    let usage = |m: String| Problem::Usage(m);
    let interval = seconds("nemesis-interval", args.nemesis_interval)?;
    let explicit = args.nemesis.is_some();
    let mut kinds = match &args.nemesis {
        Some(list) => parse_kinds(list).map_err(usage)?,
        None => default_kinds(mirror.is_some(), tiered),
    };
    if mirror.is_none() {
        // `all` names them too; only a test that mirrors can use them.
        if let Some(list) = &args.nemesis {
            if let Some(k) = list
                .split(',')
                .filter_map(|w| Kind::parse(w.trim()))
                .find(|k| k.mirrors())
            {
                return Err(usage(format!(
                    "the {} fault kind needs --workload mirror",
                    k.name()
                )));
            }
        }
        kinds.retain(|k| !k.mirrors());
    }
    if !tiered {
        if let Some(list) = &args.nemesis {
            if let Some(k) = list
                .split(',')
                .filter_map(|w| Kind::parse(w.trim()))
                .find(|k| k.tiers())
            {
                return Err(usage(format!(
                    "the {} fault kind needs --workload tiered",
                    k.name()
                )));
            }
        }
        kinds.retain(|k| !k.tiers());
    }
    let mirroring = mirror.is_some();
    if args.nemesis_schedule.is_some() && explicit {
        return Err(usage(
            "--nemesis-schedule replays its own faults; leave out --nemesis".into(),
        ));
    }
    let missing = |k: Kind| -> Option<String> {
        if !local {
            return None;
        }
        let mut needs = k.requirements();
        if k == Kind::Clock {
            needs.push(Requirement::file(
                &args.faketime_library,
                "faketime",
                "clock faults (or point --faketime-library at libfaketime)",
            ));
        }
        prerequisites::report(&needs)
    };
    let mut options = NemesisOptions {
        interval,
        seed,
        mirror,
        ..NemesisOptions::default()
    };
    let nemesis = match &args.nemesis_schedule {
        Some(path) => {
            let schedule = Schedule::load(path, clusters, &all_faults(&options)).map_err(usage)?;
            Nemeses::scripted(options, schedule)
        }
        None => {
            let mut notes = Vec::new();
            kinds.retain(|k| match missing(*k) {
                Some(why) if !explicit => {
                    notes.push(why);
                    false
                }
                _ => true,
            });
            for why in notes {
                eprintln!("tidemark: left out of the default faults: {why}");
            }
            options.targets = match &args.nemesis_targets {
                Some(list) => parse_targets(list, &kinds).map_err(usage)?,
                None => Default::default(),
            };
            aim::check_mirrored(options.targets.values().flatten(), mirroring).map_err(usage)?;
            options.kinds = kinds;
            Nemeses::new(options)
        }
    };
    if let Some(why) = nemesis.kinds().iter().find_map(|k| missing(*k)) {
        return Err(usage(why));
    }
    let kinds: Vec<String> = nemesis
        .kinds()
        .iter()
        .map(|k| k.name().to_string())
        .collect();
    let faketime = nemesis
        .kinds()
        .contains(&Kind::Clock)
        .then(|| args.faketime_library.clone());
    let powerfs = nemesis
        .kinds()
        .iter()
        .any(|k| matches!(k, Kind::Power | Kind::Disk));
    Ok(Faults {
        // A mirrored test always has a nemesis: its final failback settles the mirror.
        nemesis: (!kinds.is_empty() || mirroring).then(|| Arc::new(nemesis) as Arc<dyn Nemesis>),
        kinds,
        faketime,
        powerfs,
    })
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    match build(args) {
        Ok((test, quiet)) => execute(test, quiet),
        Err(Problem::Usage(msg)) => {
            eprintln!("tidemark test: {msg}");
            crate::EXIT_BAD_INPUT
        }
        Err(Problem::Harness(msg)) => {
            eprintln!("tidemark test: {msg}");
            crate::EXIT_HARNESS_FAILED
        }
    }
}

enum Problem {
    Usage(String),
    Harness(String),
}

fn seconds(name: &str, s: f64) -> Result<Duration, Problem> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Problem::Usage(format!("--{name} must be a positive number of seconds")))
}

fn build(args: Args) -> Result<(Test, bool), Problem> {
    if !tidemark_workloads::NAMES.contains(&args.workload.as_str()) {
        return Err(Problem::Usage(format!(
            "unknown workload {:?}; available: {}",
            args.workload,
            tidemark_workloads::NAMES.join(", ")
        )));
    }
    let docker = args.runtime == "docker";
    let hosts = match (args.runtime.as_str(), &args.hosts.nodes_file) {
        ("netns" | "docker", None) => None,
        ("netns" | "docker", Some(_)) => {
            return Err(Problem::Usage(
                "--nodes-file goes with --runtime hosts".into(),
            ))
        }
        ("hosts", Some(f)) => Some((
            read_nodes_file(f).map_err(|e| Problem::Usage(format!("{e:#}")))?,
            args.hosts.login(f).map_err(Problem::Usage)?,
        )),
        ("hosts", None) => return Err(Problem::Usage("--runtime hosts needs --nodes-file".into())),
        (other, _) => {
            return Err(Problem::Usage(format!(
                "unknown runtime {other:?}; available: netns, hosts, docker"
            )))
        }
    };
    let mirror_workload = args.workload == "mirror";
    let tiered_workload = args.workload == tidemark_workloads::tiered::NAME;
    if tiered_workload && (hosts.is_some() || docker) {
        return Err(Problem::Usage(
            "--workload tiered keeps its remote store in a directory the nodes share, so it runs \
             on the netns runtime only"
                .into(),
        ));
    }
    if mirror_workload && args.clusters.is_some_and(|n| n != 2) {
        return Err(Problem::Usage(
            "--workload mirror runs on two clusters; leave out --clusters or give 2".into(),
        ));
    }
    if args.mirror_unclean_support && !mirror_workload {
        return Err(Problem::Usage(
            "--mirror-unclean-support goes with --workload mirror".into(),
        ));
    }
    let default_producer = if args.workload == tidemark_workloads::tiered::NAME {
        "idempotent"
    } else {
        "plain"
    };
    let producer = match args.producer.as_deref().unwrap_or(default_producer) {
        "plain" => ProducerMode::Plain,
        "idempotent" => ProducerMode::Idempotent,
        other => {
            return Err(Problem::Usage(format!(
                "--producer {other:?}: expected plain or idempotent"
            )))
        }
    };
    let consumer = match args.consumer.as_str() {
        "assign" => ConsumerMode::Assign,
        "group" => ConsumerMode::Group,
        other => {
            return Err(Problem::Usage(format!(
                "--consumer {other:?}: expected assign or group"
            )))
        }
    };
    if mirror_workload && (producer, consumer) != (ProducerMode::Plain, ConsumerMode::Assign) {
        return Err(Problem::Usage(
            "--producer and --consumer go with --workload queue".into(),
        ));
    }
    let clusters = match (&hosts, args.clusters) {
        (Some((file, _)), Some(n)) if n != file.clusters.len() => {
            return Err(Problem::Usage(format!(
                "--clusters {n}, but the nodes file lists {} cluster(s)",
                file.clusters.len()
            )))
        }
        (Some((file, _)), _) => file.clusters.iter().map(|(c, _)| c.clone()).collect(),
        (None, n) => {
            let n = n.unwrap_or(if mirror_workload { 2 } else { 1 });
            if n == 0 || n > netns::MAX_CLUSTERS {
                return Err(Problem::Usage(format!(
                    "--clusters must be 1 to {}",
                    netns::MAX_CLUSTERS
                )));
            }
            cluster_names(n)
        }
    };
    let nodes = match (&hosts, args.nodes) {
        (Some((file, _)), n) => {
            let sizes: Vec<String> = file
                .clusters
                .iter()
                .map(|(c, h)| format!("[{c}] {}", h.len()))
                .collect();
            let size = file.clusters[0].1.len();
            if file.clusters.iter().any(|(_, h)| h.len() != size) {
                return Err(Problem::Usage(format!(
                    "every cluster needs as many hosts as the others, but the nodes file lists {}",
                    sizes.join(", ")
                )));
            }
            // With dedicated controllers, the last hosts of each cluster are its controllers.
            let Some(brokers) = size.checked_sub(args.controllers).filter(|b| *b > 0) else {
                return Err(Problem::Usage(format!(
                    "--controllers {} leaves no broker among the nodes file's hosts per cluster \
                     ({}): the last {} of each cluster are its controllers",
                    args.controllers,
                    sizes.join(", "),
                    args.controllers
                )));
            };
            match n {
                Some(n) if n != brokers => {
                    return Err(Problem::Usage(format!(
                        "--nodes {n}, but the nodes file lists {} hosts per cluster{}",
                        sizes.join(", "),
                        if args.controllers > 0 {
                            format!(", {} of them controllers", args.controllers)
                        } else {
                            String::new()
                        }
                    )))
                }
                _ => brokers,
            }
        }
        (None, n) => n.unwrap_or(3),
    };
    let max_nodes = if clusters.len() > 1 {
        netns::MAX_CLUSTER_NODES
    } else {
        netns::MAX_NODES
    };
    if nodes == 0 || nodes > max_nodes {
        return Err(Problem::Usage(format!(
            "--nodes must be 1 to {max_nodes}{}",
            if clusters.len() > 1 {
                " when there are several clusters"
            } else {
                ""
            }
        )));
    }
    if nodes + args.controllers > max_nodes {
        return Err(Problem::Usage(format!(
            "--nodes {nodes} and --controllers {} make more than the {max_nodes} nodes a cluster may have",
            args.controllers
        )));
    }
    if args.concurrency == 0 {
        return Err(Problem::Usage("--concurrency must be at least 1".into()));
    }
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err(Problem::Usage("--rate must be 0 or more".into()));
    }
    let rf = args.replication_factor.unwrap_or(nodes.min(3) as u32);
    if rf == 0 || rf as usize > nodes {
        return Err(Problem::Usage(format!(
            "--replication-factor must be 1 to the number of nodes ({nodes})"
        )));
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    // Faults act on the workload's cluster, the first, unless a scripted op names another.
    let cluster_nodes: Vec<ClusterNodes> = clusters
        .iter()
        .map(|c| {
            let mut names = node_names(&clusters, c, nodes);
            names.extend(controller_names(&clusters, c, args.controllers));
            (c.clone(), names)
        })
        .collect();
    if mirror_workload && clusters.len() != 2 {
        return Err(Problem::Usage(format!(
            "--workload mirror runs on two clusters, but the nodes file lists {}",
            clusters.len()
        )));
    }
    let mirror_options = MirrorOptions::new(rf as i16, args.mirror_unclean_support);
    let mirror_setup = mirror_workload.then(|| MirrorSetup {
        unclean_support: args.mirror_unclean_support,
        ..MirrorSetup::new(
            &clusters[0],
            &clusters[1],
            mirror_options.queue.topics.clone(),
        )
    });
    let faults = faults(
        &args.faults,
        &cluster_nodes,
        seed,
        hosts.is_none() && !docker,
        mirror_setup,
        tiered_workload,
    )?;
    let time_limit = seconds("time-limit", args.time_limit)?;
    let converge_timeout = seconds("converge-timeout", args.converge_timeout)?;
    let final_timeout = seconds("final-timeout", args.final_timeout)?;
    if args.op_timeout_ms == 0 {
        return Err(Problem::Usage("--op-timeout-ms must be positive".into()));
    }
    let broker = match args.broker_binary {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| Problem::Harness(format!("cannot locate this executable: {e}")))?
            .with_file_name("tidemark-broker"),
    };
    if !broker.is_file() {
        return Err(Problem::Usage(format!(
            "no broker binary at {}; build it with `cargo build -p tidemark-broker` or pass \
             --broker-binary PATH",
            broker.display()
        )));
    }
    let broker = std::fs::canonicalize(&broker).unwrap_or(broker);

    let mut config = BrokerConfig::for_replication(rf);
    for setting in &args.broker_config {
        match setting.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                config
                    .overrides
                    .insert(k.trim().to_string(), v.trim().to_string());
            }
            _ => {
                return Err(Problem::Usage(format!(
                    "--broker-config {setting:?}: expected KEY=VALUE"
                )))
            }
        }
    }
    if mirror_workload {
        // The brokers' default, so the mirror topics B creates have the flag too.
        config
            .overrides
            .entry(MIRROR_UNCLEAN_KEY.to_string())
            .or_insert_with(|| args.mirror_unclean_support.to_string());
    }
    if tiered_workload {
        for (key, value) in tidemark_workloads::tiered::broker_settings() {
            config
                .overrides
                .entry(key.to_string())
                .or_insert_with(|| value.to_string());
        }
    }
    if consumer == ConsumerMode::Group {
        // The members' session timeout is allowed (it is short, so that a crashed member is
        // expired within a short test), the first rebalance is not held back, and the offsets
        // topic fits the cluster.
        for (key, value) in [
            (
                "group.min.session.timeout.ms",
                SESSION_TIMEOUT.as_millis().to_string(),
            ),
            ("group.initial.rebalance.delay.ms", "0".to_string()),
            ("offsets.topic.replication.factor", rf.to_string()),
        ] {
            config.overrides.entry(key.to_string()).or_insert(value);
        }
    }
    let powerfs = broker.with_file_name("tidemark-powerfs");
    let mut db = TidemarkBroker::new(broker, config, args.inject_bug);
    if let Some(lib) = faults.faketime {
        db = db.with_faketime(lib);
    }
    if tiered_workload {
        db = db.with_remote_store();
    }
    if faults.powerfs {
        if !powerfs.is_file() {
            return Err(Problem::Usage(format!(
                "power faults need tidemark-powerfs beside the broker, at {}; build it with \
                 `cargo build -p tidemark-powerfs`",
                powerfs.display()
            )));
        }
        db = db.with_powerfs(powerfs);
    }
    // What the nodes need; on the netns runtime the nodes are this machine, checked now, and
    // SSH hosts are checked when the runtime first connects, before anything is made there.
    let mut node_needs = Iptables::requirements();
    node_needs.extend(db.requirements());
    for kind in &faults.kinds {
        node_needs.extend(
            Kind::parse(kind)
                .map(Kind::requirements)
                .unwrap_or_default(),
        );
    }
    if docker {
        if let Some(why) = prerequisites::report(&DockerRuntime::requirements()) {
            return Err(Problem::Harness(why));
        }
    } else if hosts.is_none() {
        let mut needs = NetnsRuntime::requirements();
        needs.extend(node_needs.iter().cloned());
        if let Some(why) = prerequisites::report(&needs) {
            return Err(Problem::Harness(why));
        }
    }
    // Runs are recorded in one fixed place whichever runtime made them. A dead run's brokers and
    // firewall chain on a host this run needs would collide with it: refuse. Anything else it
    // left (namespaces carry their run's id) is named, and this run goes on.
    let state_dir = leftovers::state_dir().map_err(|e| Problem::Harness(format!("{e:#}")))?;
    let found = docker::labelled_runs()
        .and_then(|labelled| leftovers::find(&state_dir, labelled))
        .map_err(|e| Problem::Harness(format!("{e:#}")))?;
    let these_hosts = hosts.as_ref().map(|(h, _)| h.hosts());
    let (blocking, other): (Vec<_>, Vec<_>) = found
        .iter()
        .partition(|l| l.collides_with(these_hosts.as_deref()));
    if !blocking.is_empty() {
        let list: Vec<String> = blocking.iter().map(|l| format!("  {l}")).collect();
        return Err(Problem::Harness(format!(
            "a killed run left resources behind on these hosts:\n{}\nremove them with \
             `tidemark teardown` and start again",
            list.join("\n")
        )));
    }
    for l in other {
        if l.owner_known() {
            eprintln!(
                "tidemark: note: {l} was killed and left resources behind; `tidemark teardown` \
                 removes them"
            );
        } else {
            eprintln!(
                "tidemark: note: {l} has no owner on record; `tidemark teardown --force --run {}` \
                 removes it",
                l.run
            );
        }
    }
    let run_id = leftovers::new_run_id();
    let runtime: Box<dyn Runtime> = match hosts {
        None if docker => Box::new(
            DockerRuntime::new(
                &std::env::temp_dir().join("tidemark"),
                &run_id,
                &args.docker_image,
            )
            .requiring(node_needs),
        ),
        None => Box::new(
            NetnsRuntime::new(&std::env::temp_dir().join("tidemark"), &run_id)
                .map_err(|e| Problem::Harness(format!("{e:#}")))?,
        ),
        Some((hosts, login)) => {
            Box::new(HostsRuntime::new(&run_id, hosts, login).requiring(node_needs))
        }
    };

    let options = TestOptions {
        name: args.name.unwrap_or_else(|| args.workload.clone()),
        seed,
        nodes,
        controllers: args.controllers,
        clusters,
        concurrency: args.concurrency,
        time_limit,
        rate: args.rate,
        nemesis: faults.kinds,
        runtime: args.runtime,
        store: args.store,
        op_timeout: Duration::from_millis(args.op_timeout_ms),
        ready_timeout: Duration::from_secs(30),
        converge_timeout,
        final_timeout,
        argv: std::env::args().collect(),
        shrunk_from: args.shrunk_from,
        shrunk_keeping: args.shrunk_keeping,
    };
    let workload: Arc<dyn Workload> = if mirror_workload {
        let (a, b) = (options.clusters[0].clone(), options.clusters[1].clone());
        Arc::new(MirrorWorkload::new(mirror_options, &a, &b))
    } else {
        let options = QueueOptions {
            producer,
            consumer,
            ..QueueOptions::new(rf as i16)
        };
        if tiered_workload {
            Arc::new(tidemark_workloads::tiered::workload(options))
        } else {
            Arc::new(Queue::new(options))
        }
    };
    let test = Test {
        runtime,
        db: Arc::new(db),
        net: Arc::new(Iptables),
        workload,
        nemesis: faults.nemesis,
        options,
    };
    Ok((test, args.quiet))
}

fn execute(test: Test, quiet: bool) -> u8 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tidemark test: starting the async runtime: {e}");
            return crate::EXIT_HARNESS_FAILED;
        }
    };
    if !quiet {
        let o = &test.options;
        let nodes = match o.clusters.len() {
            1 => format!("{} nodes", o.nodes),
            n => format!("{n} clusters of {} nodes", o.nodes),
        };
        eprintln!(
            "tidemark: test {} seed {} ({nodes}, {} workers, {} s)",
            test.options.name,
            test.options.seed,
            test.options.concurrency,
            test.options.time_limit.as_secs_f64()
        );
    }
    let mut progress = Progress::new(test.options.time_limit, quiet);
    let cancel = CancellationToken::new();
    let report = rt.block_on(async {
        let watcher = tokio::spawn(cancel_on_signal(cancel.clone()));
        let report = runner::run(test, cancel.clone(), &mut progress).await;
        watcher.abort();
        report
    });
    if let Some(dir) = &report.run_dir {
        eprintln!("tidemark: run directory {}", dir.display());
        // A run cut short still gets a report of what it recorded; a failed report never
        // changes the verdict.
        match tidemark_report::write_report(dir) {
            Ok(path) => eprintln!("tidemark: report {}", path.display()),
            Err(e) => eprintln!("tidemark: could not write the report: {e:#}"),
        }
    }
    match &report.outcome {
        RunOutcome::Checked(results) => {
            print!("{}", results.summary(5));
            let history = report.run_dir.as_ref().map(|d| d.join("history.jsonl"));
            if let Some(tally) = history.as_deref().and_then(faults_of) {
                println!("faults: {tally}");
            }
            println!();
        }
        RunOutcome::Interrupted => {
            eprintln!("tidemark: interrupted; the history so far is in the run directory")
        }
        RunOutcome::Failed(e) => eprintln!("tidemark test: {e:#}"),
    }
    report.exit_code()
}

/// The faults a history records (see [`crate::evidence::faults_tally`]); none when it cannot be
/// read, which the verdict has already said. `tidemark check` prints them too. Only the
/// nemesis's ops are kept: a long run's client ops are most of its history.
pub fn faults_of(history: &std::path::Path) -> Option<String> {
    let file = std::fs::File::open(history).ok()?;
    let ops: Vec<tidemark_checkers::Op> =
        tidemark_checkers::read_history(std::io::BufReader::new(file))
            .ok()?
            .filter(|o| {
                o.as_ref()
                    .map_or(true, |o| o.process == tidemark_checkers::Process::Nemesis)
            })
            .collect::<Result<_, _>>()
            .ok()?;
    Some(crate::evidence::faults_tally(&ops))
}

/// Cancels the run on the first SIGINT or SIGTERM; teardown then runs as usual.
async fn cancel_on_signal(cancel: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    eprintln!("tidemark: stopping: healing nothing, tearing down");
    cancel.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_test_naming_no_faults_gets_the_ones_its_workload_is_about() {
        assert_eq!(default_kinds(false, false), Kind::DEFAULT.to_vec());
        let mirror = default_kinds(true, false);
        assert!(mirror.contains(&Kind::Failover), "{mirror:?}");
        assert!(!mirror.iter().any(|k| k.tiers()), "{mirror:?}");
        let tiered = default_kinds(false, true);
        assert!(tiered.contains(&Kind::Wipe) && tiered.contains(&Kind::RemoteOutage));
        assert!(!tiered.iter().any(|k| k.mirrors()), "{tiered:?}");
        for kinds in [mirror, tiered] {
            assert!(Kind::DEFAULT.iter().all(|k| kinds.contains(k)), "{kinds:?}");
        }
    }
}
