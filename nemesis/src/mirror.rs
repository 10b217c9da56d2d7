//! Faults of cluster mirroring (KIP-1279) between the test's two clusters: `failover` (the
//! mirror destination stops mirroring and becomes writable), `failback` (the cluster failed over
//! from mirrors the one that took over, truncating to the last mirrored leader epoch), and
//! `config` (the `mirror.support.unclean.leader.election` flag of one topic on one cluster).
//!
//! The mirror's direction is state: the first cluster is the source, the second mirrors it, and
//! each failover and failback moves it on. A generated `failover {}` or `failback {}` acts on the
//! direction as it is; the `info` names `from` and `to`, so a replay does the same again. The
//! mirror on cluster X copying from Y is named `Y-to-X` (both are created by the workload's
//! setup).
//!
//! What a failover or failback did is read back from the destination's describe and metadata:
//! per partition the LMLE, the log end offset when mirroring stopped (or, on failback, once
//! mirroring began), the leader epoch, and the mirror states before and after.
//!
//! A failback may run with a lagging replica (`{"lagging": true}`, which lags one only where the
//! flag is on for a topic of the cluster failing back, or the node's name in a recorded one): one
//! node of the cluster failing back stops fetching (its peers drop its packets to the client port)
//! until it leaves an ISR, mirroring starts while it is out, and it fetches again [`LAG_DWELL`]
//! later. Which replicas a truncation must wait for is what
//! `mirror.support.unclean.leader.election` decides (KIP-1279 §1.5, §1.10): only a replica out of
//! the ISR at that moment tells a truncation that waits for every replica from one that waits for
//! the ISR, and it comes back holding whatever the truncation should have removed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::seq::IndexedRandom;
use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_harness::broker::{CLIENT_PORT, MIRROR_UNCLEAN_KEY};
use tidemark_harness::client::ClientContext;
use tidemark_harness::db::Mirror;
use tidemark_harness::kafka::{Connection, PartitionInfo};
use tidemark_harness::mirror::{MirrorState, PartitionDescription};
use tidemark_harness::op::Invocation;
use tidemark_harness::remote::{self, escape};
use tidemark_harness::runtime::Node;

use crate::cluster::block_on;
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::unclean::{drop_chain_command, remove_chain_command};

/// How long a lagging replica stays cut off once mirroring started: long enough for a
/// truncation that waits for the ISR only to finish without it.
pub const LAG_DWELL: Duration = Duration::from_secs(5);

/// How long a lagging replica may take to leave an ISR (the brokers' replica lag time is 3 s).
const LAG_TIMEOUT: Duration = Duration::from_secs(12);

/// How long a failover waits for its partitions to be STOPPED (the broker's barrier wait is 10 s).
const STOP_WAIT: Duration = Duration::from_secs(12);

/// The nftables chain that cuts the lagging replica's fetches.
const LAG_CHAIN: &str = "failback_lag";

/// The name of the mirror on `destination` that copies `source`.
pub fn mirror_name(source: &str, destination: &str) -> String {
    format!("{source}-to-{destination}")
}

/// Which way the data flows now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Direction {
    /// `destination` mirrors `source`; only `source` is writable.
    Mirroring {
        /// The writable cluster.
        source: String,
        /// The mirror.
        destination: String,
    },
    /// `to` stopped mirroring `from`: both are writable until `from` fails back.
    FailedOver {
        /// The old source.
        from: String,
        /// The cluster that took over.
        to: String,
    },
}

impl Direction {
    /// The direction as a failover or failback records leaving it: the `source` clients write
    /// to (after a failover, the cluster that took over), the other cluster as `destination`,
    /// and whether it mirrors the source yet.
    pub fn record(&self) -> Value {
        match self {
            Direction::Mirroring {
                source,
                destination,
            } => json!({"source": source, "destination": destination, "mirroring": true}),
            Direction::FailedOver { from, to } => {
                json!({"source": to, "destination": from, "mirroring": false})
            }
        }
    }
}

/// What the mirror faults mirror.
#[derive(Debug, Clone, PartialEq)]
pub struct MirrorSetup {
    /// The first source (the test's first cluster).
    pub source: String,
    /// The first destination.
    pub destination: String,
    /// The mirrored topics.
    pub topics: Vec<String>,
    /// How long a failback waits for its partitions to mirror.
    pub failback_timeout: Duration,
    /// How long the final failback waits for the mirror to catch up.
    pub settle_timeout: Duration,
    /// `mirror.support.unclean.leader.election` on every topic at the start.
    pub unclean_support: bool,
}

impl MirrorSetup {
    /// Mirroring `topics` from `source` to `destination`, with the default waits and the flag
    /// off.
    pub fn new(source: &str, destination: &str, topics: Vec<String>) -> Self {
        MirrorSetup {
            source: source.into(),
            destination: destination.into(),
            topics,
            failback_timeout: Duration::from_secs(20),
            settle_timeout: Duration::from_secs(60),
            unclean_support: false,
        }
    }
}

/// The mirror faults and the direction they leave the mirror in.
#[derive(Debug)]
pub struct MirrorFaults {
    setup: MirrorSetup,
    direction: Mutex<Direction>,
    /// `mirror.support.unclean.leader.election` per cluster and topic as `config` ops set it
    /// (else the setup's).
    flags: Mutex<BTreeMap<(String, String), bool>>,
    /// A failover or failback failed after its request was sent: the brokers may still carry it
    /// out (a stop handed to a controller without a quorum commits once the quorum is back), so
    /// its outcome is unknown until that can no longer happen.
    indeterminate: Mutex<bool>,
}

impl MirrorFaults {
    /// Mirror faults over `setup`, starting with `setup.destination` mirroring `setup.source`.
    pub fn new(setup: MirrorSetup) -> Self {
        let direction = Mutex::new(Direction::Mirroring {
            source: setup.source.clone(),
            destination: setup.destination.clone(),
        });
        MirrorFaults {
            setup,
            direction,
            flags: Mutex::new(BTreeMap::new()),
            indeterminate: Mutex::new(false),
        }
    }

    fn mark_indeterminate(&self) {
        *self.indeterminate.lock().unwrap_or_else(|p| p.into_inner()) = true;
    }

    fn any_indeterminate(&self) -> bool {
        *self.indeterminate.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether any of `topics` has the flag on in `cluster`: only then must a truncation there
    /// wait for every replica, so only then does a lagging replica test anything (with it off,
    /// a replica out of the ISR keeping epochs above the LMLE is KIP-1279's documented
    /// limitation, which the verdict allows, and the divergence it allows hides other bugs).
    fn flag_on(&self, cluster: &str, topics: &[String]) -> bool {
        let flags = self.flags.lock().unwrap_or_else(|p| p.into_inner());
        topics.iter().any(|t| {
            *flags
                .get(&(cluster.to_string(), t.clone()))
                .unwrap_or(&self.setup.unclean_support)
        })
    }

    /// The direction now.
    pub fn direction(&self) -> Direction {
        self.direction
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn set_direction(&self, d: Direction) {
        *self.direction.lock().unwrap_or_else(|p| p.into_inner()) = d;
    }

    /// The ops that leave the mirror in a steady direction, caught up: one failback that waits
    /// for lag 0. A mirror that runs stays as it is; a failed-over one fails back, the cluster
    /// failed over from mirroring the one that took over, so what that one acknowledged since is
    /// kept (making it mirror the other instead would discard it as no failover abandons it).
    pub fn settle_ops(&self) -> Vec<Invocation> {
        let (from, to) = match self.direction() {
            Direction::Mirroring {
                source,
                destination,
            } => (source, destination),
            Direction::FailedOver { from, to } => (to, from),
        };
        vec![Invocation {
            f: "failback".into(),
            value: json!({"from": from, "to": to, "settle": true}),
        }]
    }
}

/// A `failover` or `failback` request: explicit clusters (a replay, the final phase) or none
/// (the direction decides).
#[derive(Debug, Clone, Deserialize)]
struct Move {
    from: Option<String>,
    to: Option<String>,
    topics: Option<Vec<String>>,
    #[serde(default)]
    settle: bool,
    /// Failback only: a replica of `to` lags while mirroring starts.
    #[serde(default)]
    lagging: Option<Lagging>,
}

/// Which replica lags: any (`true`, chosen when performed), none (`false`), or the named node.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
enum Lagging {
    Any(bool),
    Node(String),
}

/// A `config` op: one topic's flag on one cluster.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigOp {
    cluster: String,
    topic: String,
    set: BTreeMap<String, String>,
}

impl Fault for MirrorFaults {
    fn fs(&self) -> &'static [&'static str] {
        &["failover", "failback", "config"]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        _nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        match f {
            "failover" | "failback" => {
                let m: Move = parse(value)?;
                if m.from.is_some() != m.to.is_some() {
                    return Err("fields `from` and `to` go together".into());
                }
                if f == "failover" && m.lagging.is_some() {
                    return Err("field `lagging`: only a failback lags".into());
                }
                Ok(Box::new(MoveOp {
                    faults: self,
                    failover: f == "failover",
                    m,
                }))
            }
            "config" => {
                let c: ConfigOp = parse(value)?;
                let on = match (
                    c.set.len(),
                    c.set.get(MIRROR_UNCLEAN_KEY).map(String::as_str),
                ) {
                    (1, Some("true")) => true,
                    (1, Some("false")) => false,
                    _ => {
                        return Err(format!(
                            "field `set`: only {MIRROR_UNCLEAN_KEY} with \"true\" or \"false\""
                        ))
                    }
                };
                Ok(Box::new(Config {
                    faults: self,
                    c,
                    on,
                }))
            }
            other => Err(format!("mirror faults do not perform {other:?}")),
        }
    }
}

struct MoveOp<'a> {
    faults: &'a MirrorFaults,
    failover: bool,
    m: Move,
}

struct Config<'a> {
    faults: &'a MirrorFaults,
    c: ConfigOp,
    on: bool,
}

impl FaultOp for Config<'_> {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let mirror = mirror_of(env)?;
        let cx = cluster(env, &self.c.cluster)?;
        let done = json!({"cluster": self.c.cluster, "topic": self.c.topic,
                          "set": {MIRROR_UNCLEAN_KEY: self.on.to_string()}});
        block_on(mirror.set_unclean_support(cx, &self.c.topic, self.on))
            .map_err(|e| Failed::nothing(format!("{e:#}")))?;
        self.faults
            .flags
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((self.c.cluster.clone(), self.c.topic.clone()), self.on);
        Ok(done)
    }
}

fn mirror_of<'e>(env: &'e Env<'_>) -> Result<&'e dyn Mirror, Failed> {
    env.cx
        .db
        .as_mirror()
        .ok_or_else(|| Failed::nothing("the database cannot mirror clusters"))
}

fn cluster<'e>(env: &'e Env<'_>, name: &str) -> Result<&'e ClientContext, Failed> {
    env.cx.cluster(name).ok_or_else(|| {
        let known: Vec<&str> = env.cx.clusters.iter().map(|c| c.cluster.as_str()).collect();
        Failed::nothing(format!(
            "no cluster {name:?}; clusters: {}",
            known.join(", ")
        ))
    })
}

impl FaultOp for MoveOp<'_> {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let direction = self.faults.direction();
        let (from, to) = match (&self.m.from, &self.m.to, &direction) {
            (Some(f), Some(t), _) => (f.clone(), t.clone()),
            (
                _,
                _,
                Direction::Mirroring {
                    source,
                    destination,
                },
            ) if self.failover => (source.clone(), destination.clone()),
            (_, _, Direction::FailedOver { from, to }) if !self.failover => {
                (to.clone(), from.clone())
            }
            (_, _, d) => {
                return Err(Failed::nothing(format!(
                    "nothing to {}: {d:?}",
                    if self.failover {
                        "fail over"
                    } else {
                        "fail back"
                    }
                )))
            }
        };
        let topics = self
            .m
            .topics
            .clone()
            .unwrap_or_else(|| self.faults.setup.topics.clone());
        let mut indeterminate_wait = None;
        // The settle follows the mirror as it runs: a start whose answer was lost (the node
        // asked first was cut off and acted later) may have taken effect after its move was
        // recorded as failed, so the mirror running can be the reverse of the one believed.
        let (from, to, reversed) = if self.m.settle {
            let mirror = mirror_of(env)?;
            if self.faults.any_indeterminate() {
                // The settle runs once every fault is healed: a move given up as failed that the
                // brokers still carry out does so within a stop's barrier wait of the quorum's
                // return. Only once that is over does the mirror's state say which way it runs.
                let waited = Instant::now();
                let quiet = waited + STOP_WAIT;
                let until = waited + self.faults.setup.settle_timeout / 2;
                let name = mirror_name(&from, &to);
                let dst = cluster(env, &to)?;
                while Instant::now() < until {
                    let now = block_on(mirror.describe_mirror(dst, &name));
                    if Instant::now() >= quiet && !moving(&now) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
                indeterminate_wait = Some(waited.elapsed());
            }
            let running = |s| s != MirrorState::Stopped && s != MirrorState::Failed;
            let forward =
                block_on(mirror.describe_mirror(cluster(env, &to)?, &mirror_name(&from, &to)));
            let reverse =
                block_on(mirror.describe_mirror(cluster(env, &from)?, &mirror_name(&to, &from)));
            if !all_in(&forward, &topics, running) && all_in(&reverse, &topics, running) {
                (to, from, true)
            } else {
                (from, to, false)
            }
        } else {
            (from, to, false)
        };
        let lagging = match &self.m.lagging {
            None | Some(Lagging::Any(false)) => None,
            Some(Lagging::Any(true)) if !self.faults.flag_on(&to, &topics) => None,
            Some(Lagging::Any(true)) => {
                let infos = block_on(partition_infos(cluster(env, &to)?, &topics));
                let nodes: Vec<&Node> = env
                    .cx
                    .every_node
                    .iter()
                    .filter(|n| n.cluster == to)
                    .collect();
                followers(&nodes, &infos).choose(env.rng).cloned()
            }
            Some(Lagging::Node(n)) => Some(n.clone()),
        };
        let mirror = mirror_of(env)?;
        let dst = cluster(env, &to)?;
        cluster(env, &from)?;
        let name = mirror_name(&from, &to);
        let mut record = json!({"from": from, "to": to, "topics": topics});
        if self.m.settle {
            record["settle"] = json!(true);
        }
        if reversed {
            record["reversed"] = json!(true);
        }
        if let Some(waited) = indeterminate_wait {
            record["indeterminate_wait_s"] = json!(waited.as_secs_f64());
        }
        let before = block_on(mirror.describe_mirror(dst, &name));
        if self.failover {
            let stopped = block_on(mirror.stop_mirror(dst, &name, &topics));
            // A stop that failed may still have stopped some partitions, or be stopping them
            // (every node it was sent to timed out): what describe shows goes into the record
            // either way, and every partition STOPPED is a failover done, whatever the answer.
            // A stop under way is waited for (a while): every partition STOPPED, its barrier
            // written, before reading where the clusters parted.
            let until = Instant::now() + STOP_WAIT;
            let mut after = block_on(mirror.describe_mirror(dst, &name));
            while (stopped.is_ok() || moving(&after))
                && !all_in(&after, &topics, |s| s == MirrorState::Stopped)
                && Instant::now() < until
            {
                std::thread::sleep(Duration::from_millis(200));
                after = block_on(mirror.describe_mirror(dst, &name));
            }
            let stopped = stopped.or_else(|e| {
                if all_in(&after, &topics, |s| s == MirrorState::Stopped) {
                    record["stop_error"] = json!(format!("{e:#}"));
                    Ok(())
                } else {
                    Err(e)
                }
            });
            record["partitions"] = partitions(dst, &topics, &before, &after, "mirrored_offset");
            // Describe shows the LMLE a partition looked up when it started mirroring; the one
            // the stop persisted is what the old source's failback will look up.
            let src = cluster(env, &from)?;
            let mut kept_lmles = BTreeMap::new();
            for t in &topics {
                match block_on(mirror.kept_lmles(dst, src, &name, t)) {
                    Ok(kept) => {
                        set_lmles(&mut record["partitions"], t, &kept);
                        kept_lmles.extend(kept.into_iter().map(|(p, l)| ((t.clone(), p), l)));
                    }
                    Err(e) => record["lmle_error"] = json!(format!("{e:#}")),
                }
            }
            let described = (&before, &after);
            for (t, p, parted) in parted_out_of_step(src, dst, &topics, described, &kept_lmles) {
                set_parted(&mut record["partitions"], &t, p, parted);
            }
            if let Err(e) = stopped {
                self.faults.mark_indeterminate();
                record["direction"] = direction.record();
                return Err(Failed {
                    done: record,
                    error: format!("{e:#}"),
                });
            }
            let now = Direction::FailedOver { from, to };
            record["direction"] = now.record();
            self.faults.set_direction(now);
            return Ok(record);
        }
        let lag = match &lagging {
            Some(node) => {
                record["lagging"] = json!(node);
                let cut = Lag::start(env, &to, node).map_err(|error| Failed {
                    done: record.clone(),
                    error,
                })?;
                let out = cut.wait_out_of_isr(dst, &topics);
                record["lagging_out_of_isr"] = json!(out);
                Some(cut)
            }
            None => None,
        };
        // A failover that failed goes on retrying and stops its partitions once their cluster is
        // whole again (KIP-1279's FAILED retries): the settling failback waits for that to end
        // (STOPPED, which it then fails back from, or mirroring again) before it looks.
        let mut before = before;
        if self.m.settle {
            let until = Instant::now() + self.faults.setup.settle_timeout / 2;
            while moving(&before) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(500));
                before = block_on(mirror.describe_mirror(dst, &name));
            }
        }
        // Every topic must be there: a start that failed half way leaves some never started.
        let mirroring_already = all_in(&before, &topics, |s| {
            s != MirrorState::Stopped && s != MirrorState::Failed
        });
        let started = if mirroring_already {
            record["already_mirroring"] = json!(true);
            Ok(())
        } else {
            // As for a stop: a start retried on another node finds the partitions the first
            // started; none left STOPPED or FAILED is a start done.
            block_on(mirror.start_mirror(dst, &name, &topics)).or_else(|e| {
                let now = block_on(mirror.describe_mirror(dst, &name));
                if all_in(&now, &topics, |s| {
                    s != MirrorState::Stopped && s != MirrorState::Failed
                }) {
                    record["start_error"] = json!(format!("{e:#}"));
                    Ok(())
                } else {
                    Err(e)
                }
            })
        };
        if let Err(e) = started {
            self.faults.mark_indeterminate();
            record["partitions"] = partitions(dst, &topics, &before, &before, "log_end_offset");
            record["direction"] = direction.record();
            return Err(Failed {
                done: record,
                error: format!("{e:#}"),
            });
        }
        let now = Direction::Mirroring {
            source: from.clone(),
            destination: to.clone(),
        };
        record["direction"] = now.record();
        self.faults.set_direction(now);
        // Failback is in force once every partition mirrors (the LMLE truncation is done); the
        // final one also waits until the mirror has caught up.
        let (timeout, settle) = if self.m.settle {
            (self.faults.setup.settle_timeout, true)
        } else {
            (self.faults.setup.failback_timeout, false)
        };
        let deadline = Instant::now() + timeout;
        let mirroring = |now: &Described| {
            now.as_ref().is_ok_and(|ps| {
                ps.len() >= expected_partitions(&topics, ps)
                    && ps
                        .iter()
                        .all(|(_, p)| p.state == MirrorState::Mirroring && (!settle || p.lag == 0))
            })
        };
        if let Some(cut) = lag {
            // Whether every partition mirrored while the replica was still cut off: a
            // truncation that waits for every replica cannot have.
            let heal_at = Instant::now() + LAG_DWELL;
            let mut seen = false;
            let mut last = Err(anyhow::anyhow!("not described"));
            while !seen && Instant::now() < heal_at {
                last = block_on(mirror.describe_mirror(dst, &name));
                seen = mirroring(&last);
                std::thread::sleep(Duration::from_millis(200));
            }
            std::thread::sleep(heal_at.saturating_duration_since(Instant::now()));
            record["mirroring_while_lagging"] = json!(seen);
            // The lagging replica's epochs as the truncation left them: it fetched nothing
            // since it was cut off, so what it holds is what the truncation did to it.
            record["lagging_epochs"] = cut.epochs(dst, &topics, &last);
            drop(cut);
        }
        let after = loop {
            let now = block_on(mirror.describe_mirror(dst, &name));
            let done = mirroring(&now);
            if done || Instant::now() >= deadline {
                break (now, done);
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        record["partitions"] = partitions(dst, &topics, &before, &after.0, "log_end_offset");
        if !after.1 {
            return Err(Failed {
                done: record,
                error: format!(
                    "{name} on {to} not {} within {timeout:?}",
                    if settle {
                        "mirroring with lag 0"
                    } else {
                        "mirroring"
                    }
                ),
            });
        }
        Ok(record)
    }
}

/// Whether some partition is between states: STOPPING, or FAILED with retries to come.
fn moving(described: &Described) -> bool {
    described.as_ref().is_ok_and(|ps| {
        ps.iter().any(|(_, p)| {
            p.state == MirrorState::Stopping
                || (p.state == MirrorState::Failed && p.retry_attempt >= 0)
        })
    })
}

/// The nodes a lagging replica is drawn from: those leading the fewest of the partitions, counting
/// the ones they are about to lead again (the preferred replica, in sync, while another leads:
/// the controller's leader rebalance moves those back to it). A leader cut off from its peers'
/// client port still leads, so it never leaves the ISR and the lag shows nothing.
fn followers(nodes: &[&Node], infos: &BTreeMap<(String, i32), PartitionInfo>) -> Vec<String> {
    let leads = |n: &Node| {
        let id = n.id as i32;
        infos
            .values()
            .filter(|i| i.leader == id || (i.replicas.first() == Some(&id) && i.isr.contains(&id)))
            .count()
    };
    let fewest = nodes.iter().map(|n| leads(n)).min();
    nodes
        .iter()
        .filter(|n| Some(leads(n)) == fewest)
        .map(|n| n.name.clone())
        .collect()
}

/// A replica cut off from fetching on its cluster's other nodes until dropped.
struct Lag<'a> {
    /// The lagging node.
    node: &'a Node,
    /// Its peers, which hold the rule.
    peers: Vec<&'a Node>,
    /// Its broker id.
    id: i32,
}

impl<'a> Lag<'a> {
    /// Cuts `node` of `cluster` off.
    fn start(env: &Env<'a>, cluster: &str, node: &str) -> Result<Self, String> {
        let nodes: &'a [Node] = env.cx.every_node;
        let lagging = nodes
            .iter()
            .find(|n| n.name == node && n.cluster == cluster)
            .ok_or_else(|| format!("field `lagging`: no node {node:?} in cluster {cluster:?}"))?;
        let peers: Vec<&Node> = nodes
            .iter()
            .filter(|n| n.cluster == cluster && n.name != node)
            .collect();
        let lag = Lag {
            node: lagging,
            peers,
            id: lagging.id as i32,
        };
        let cmd = drop_chain_command(LAG_CHAIN, &[lagging.ip], CLIENT_PORT);
        for p in &lag.peers {
            remote::run(p.remote.as_ref(), &cmd).map_err(|e| format!("{}: {e:#}", p.name))?;
        }
        Ok(lag)
    }

    /// Waits until the replica is out of the ISR of some partition of `topics` (metadata of
    /// `cluster`, freshest leader epoch first); whether it got there within [`LAG_TIMEOUT`].
    fn wait_out_of_isr(&self, cluster: &ClientContext, topics: &[String]) -> bool {
        let deadline = Instant::now() + LAG_TIMEOUT;
        while Instant::now() < deadline {
            let infos = block_on(partition_infos(cluster, topics));
            if infos.values().any(|i| !i.isr.contains(&self.id)) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        false
    }
}

impl Lag<'_> {
    /// Per partition of `topics`: the lagging replica's epoch cache (its
    /// `leader-epoch-checkpoint`, `[epoch, start offset]` entries; null when unreadable), the
    /// leader and whether the lagging replica is in the ISR (freshest metadata of `cluster`),
    /// and the mirror state `described` shows.
    fn epochs(&self, cluster: &ClientContext, topics: &[String], described: &Described) -> Value {
        let infos = block_on(partition_infos(cluster, topics));
        let name = |id: i32| {
            std::iter::once(self.node)
                .chain(self.peers.iter().copied())
                .find(|n| n.id as i32 == id)
                .map(|n| n.name.clone())
        };
        let state = |t: &str, p: i32| {
            described.as_ref().ok().and_then(|ps| {
                ps.iter()
                    .find(|(topic, x)| topic == t && x.partition == p)
                    .map(|(_, x)| x.state)
            })
        };
        let entries: Vec<Value> = infos
            .iter()
            .map(|((topic, p), info)| {
                let path = self
                    .node
                    .dir
                    .join("data")
                    .join(format!("{topic}-{p}"))
                    .join("leader-epoch-checkpoint");
                let cmd = format!("cat {}", escape(&path.display().to_string()));
                let epochs = remote::run(self.node.remote.as_ref(), &cmd)
                    .ok()
                    .and_then(|text| parse_checkpoint(&text));
                json!({"topic": topic, "partition": p, "node": self.node.name,
                       "leader": name(info.leader), "in_isr": info.isr.contains(&self.id),
                       "state": state(topic, *p), "epochs": epochs})
            })
            .collect();
        Value::Array(entries)
    }
}

/// The `[epoch, start offset]` entries of a `leader-epoch-checkpoint` (Kafka's text format: a
/// version line, a count line, then one `epoch offset` line per entry).
fn parse_checkpoint(text: &str) -> Option<Vec<(i64, i64)>> {
    let mut lines = text.lines();
    lines.next()?;
    let count: usize = lines.next()?.trim().parse().ok()?;
    let entries: Option<Vec<(i64, i64)>> = lines
        .take(count)
        .map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
        })
        .collect();
    entries.filter(|e| e.len() == count)
}

impl Drop for Lag<'_> {
    fn drop(&mut self) {
        for p in &self.peers {
            let _ = remote::run(p.remote.as_ref(), &remove_chain_command(LAG_CHAIN));
        }
    }
}

/// Writes the kept LMLEs of `topic` into its partition entries.
fn set_lmles(partitions: &mut Value, topic: &str, kept: &[(i32, i32)]) {
    for entry in partitions.as_array_mut().into_iter().flatten() {
        if entry["topic"] != topic {
            continue;
        }
        if let Some((_, lmle)) = kept.iter().find(|(p, _)| entry["partition"] == *p) {
            entry["lmle"] = json!(lmle);
        }
    }
}

/// Whether describe answered with every partition of `topics` in a state `ok` accepts.
fn all_in(described: &Described, topics: &[String], ok: impl Fn(MirrorState) -> bool) -> bool {
    described.as_ref().is_ok_and(|ps| {
        !ps.is_empty()
            && ps.len() >= expected_partitions(topics, ps)
            && ps
                .iter()
                .filter(|(t, _)| topics.contains(t))
                .all(|(_, p)| ok(p.state))
    })
}

/// At least one partition per topic describe named: describe lists every partition of a topic
/// it knows, so a topic missing altogether is what to wait for.
fn expected_partitions(topics: &[String], ps: &[(String, PartitionDescription)]) -> usize {
    let seen: std::collections::BTreeSet<&str> = ps.iter().map(|(t, _)| t.as_str()).collect();
    if topics.iter().all(|t| seen.contains(t.as_str())) {
        ps.len()
    } else {
        usize::MAX
    }
}

type Described = anyhow::Result<Vec<(String, PartitionDescription)>>;

/// Per partition of `topics` on `cluster`: the LMLE, the destination's log end offset (under
/// `offset_key`) and the state as `after` shows them, the state `before`, and the leader epoch
/// metadata shows now. A failover records where the clusters part as `mirrored_offset`: the
/// offset of the producer-id reset barrier its stop wrote, else (a broker that writes none) the
/// log end; a failback's log end is past its truncation point, so it goes under another name.
fn partitions(
    cluster: &ClientContext,
    topics: &[String],
    before: &Described,
    after: &Described,
    offset_key: &str,
) -> Value {
    let epochs = block_on(leader_epochs(cluster, topics));
    let described_before = |t: &str, p: i32| {
        before.as_ref().ok().and_then(|ps| {
            ps.iter()
                .find(|(topic, x)| topic == t && x.partition == p)
                .map(|(_, x)| x)
        })
    };
    let state_before = |t: &str, p: i32| described_before(t, p).map(|x| x.state);
    match after {
        Ok(ps) => Value::Array(
            ps.iter()
                .filter(|(t, _)| topics.contains(t))
                .map(|(t, p)| {
                    let offset = match offset_key {
                        "mirrored_offset" => parted_at(p, described_before(t, p.partition)),
                        _ => Some(p.barrier_offset.unwrap_or(p.destination_offset)),
                    };
                    let mut entry = json!({
                        "topic": t, "partition": p.partition, "lmle": p.lmle,
                        offset_key: offset,
                        "epoch": epochs.get(&(t.clone(), p.partition)),
                        "state_before": state_before(t, p.partition), "state": p.state,
                        "source_offset": p.source_offset,
                    });
                    if let Some(e) = &p.last_error {
                        entry["last_error"] = json!(e);
                    }
                    entry
                })
                .collect(),
        ),
        Err(e) => json!({"error": format!("describe: {e:#}")}),
    }
}

/// Where a failover parted the clusters on partition `p`, stopped from `before`: its stop's
/// barrier (else its log end), known once the stop is done (a STOPPING partition may still lose
/// what its leader alone held), and only if its mirror was in step with the source. A mirror
/// that had FAILED did not finish its last fetch: its log may hold records the source's lineage
/// no longer has (an election there since) or its own from before the failback, which only the
/// next fetch's diverging epoch would have cut (kips.md §1.5, the second truncation). Found by
/// mirror runs under every fault kind (seeds 811, 817), whose source writes the destination never
/// fetched were judged lost below a barrier that claimed them. [`parted_out_of_step`] finds
/// that point from the epochs where it can.
fn parted_at(p: &PartitionDescription, before: Option<&PartitionDescription>) -> Option<i64> {
    if p.state != MirrorState::Stopped || before.is_some_and(out_of_step) {
        return None;
    }
    Some(p.barrier_offset.unwrap_or(p.destination_offset))
}

/// Whether a partition described before a stop may hold records its source no longer has: its
/// mirror had FAILED, or it ran without a fetch since it started (no source offset yet: a
/// failback's LMLE truncation leaves what only that first fetch's diverging epoch cuts, found by
/// a mirror run under kills, pauses and partitions, seed 2104, whose failback's leader was killed
/// before its first fetch and whose failover then claimed the old source's own records).
fn out_of_step(before: &PartitionDescription) -> bool {
    before.state == MirrorState::Failed
        || (before.state != MirrorState::Stopped && before.source_offset < 0)
}

/// Where a failover parted the clusters on the partitions of `topics` whose mirror was out of
/// step before the stop ([`out_of_step`]) and is `STOPPED` now, which [`parted_at`] leaves
/// unknown, as the next fetch's diverging epoch would have found it: the source's end offset for the LMLE the stop kept (the
/// destination's latest epoch), capped at the stop's barrier, and only where both clusters'
/// leaders hold the same record just below it (an epoch number both clusters used for their own
/// writes then shows as different records). Whatever the source or the destination cannot
/// answer stays unknown.
fn parted_out_of_step(
    src: &ClientContext,
    dst: &ClientContext,
    topics: &[String],
    (before, after): (&Described, &Described),
    kept_lmles: &BTreeMap<(String, i32), i32>,
) -> Vec<(String, i32, i64)> {
    let candidates = out_of_step_then_stopped(topics, before, after, kept_lmles);
    if candidates.is_empty() {
        return Vec::new();
    }
    // Both clusters' leaders, asked once for every partition to look up.
    let leaders = (
        &block_on(partition_infos(src, topics)),
        &block_on(partition_infos(dst, topics)),
    );
    let mut parted = Vec::new();
    for (t, p, lmle, barrier) in candidates {
        let asked = async {
            let within = src.timeout.max(dst.timeout) * 3;
            let lookup = parted_by_epoch((src, dst), leaders, &t, p, lmle, barrier);
            tokio::time::timeout(within, lookup).await.ok().flatten()
        };
        if let Some(offset) = block_on(asked) {
            parted.push((t, p, offset));
        }
    }
    parted
}

/// Partition leaders as [`partition_infos`] found them.
type Leaders = BTreeMap<(String, i32), PartitionInfo>;

/// The partitions of `topics` that were out of step before a stop and are `STOPPED` after it with
/// a barrier and a kept LMLE: `(topic, partition, LMLE, barrier offset)`.
fn out_of_step_then_stopped(
    topics: &[String],
    before: &Described,
    after: &Described,
    kept_lmles: &BTreeMap<(String, i32), i32>,
) -> Vec<(String, i32, i32, i64)> {
    let Ok(after) = after else {
        return Vec::new();
    };
    let out_of_step_before = |t: &str, partition: i32| {
        before.as_ref().is_ok_and(|ps| {
            ps.iter()
                .any(|(topic, x)| topic == t && x.partition == partition && out_of_step(x))
        })
    };
    after
        .iter()
        .filter(|(t, p)| {
            topics.contains(t)
                && p.state == MirrorState::Stopped
                && out_of_step_before(t, p.partition)
        })
        .filter_map(|(t, p)| {
            let lmle = *kept_lmles.get(&(t.clone(), p.partition))?;
            (lmle >= 0).then_some((t.clone(), p.partition, lmle, p.barrier_offset?))
        })
        .collect()
}

/// The source's end offset for `lmle`, capped at `barrier`, when the source knows that epoch
/// ([`parting_offset`]) and both leaders hold the same record just below that offset.
async fn parted_by_epoch(
    (src, dst): (&ClientContext, &ClientContext),
    (src_leaders, dst_leaders): (&Leaders, &Leaders),
    topic: &str,
    partition: i32,
    lmle: i32,
    barrier: i64,
) -> Option<i64> {
    let mut theirs = leader_connection(src, src_leaders, topic, partition).await?;
    let answer = theirs
        .offset_for_leader_epoch(topic, partition, lmle)
        .await
        .ok()?;
    let parted = parting_offset(answer, lmle, barrier)?;
    let their_record = record_at(&mut theirs, topic, partition, parted - 1).await?;
    let mut ours = leader_connection(dst, dst_leaders, topic, partition).await?;
    let our_record = record_at(&mut ours, topic, partition, parted - 1).await?;
    (their_record == our_record).then_some(parted)
}

/// From the source's OffsetForLeaderEpoch answer `(error code, epoch, end offset)` for `lmle`:
/// the end offset capped at `barrier`, when the source knows `lmle` itself (a lower epoch means
/// the destination's latest is not the source's) and something lies below it to compare.
fn parting_offset((code, epoch, end): (i16, i32, i64), lmle: i32, barrier: i64) -> Option<i64> {
    (code == 0 && epoch == lmle)
        .then_some(end.min(barrier))
        .filter(|&parted| parted > 0)
}

/// A connection to the leader of a partition of `cluster`, as `leaders` (its nodes' metadata)
/// says.
async fn leader_connection(
    cluster: &ClientContext,
    leaders: &Leaders,
    topic: &str,
    partition: i32,
) -> Option<Connection> {
    let leader = leaders.get(&(topic.to_string(), partition))?.leader;
    let node = cluster
        .nodes
        .iter()
        .find(|n| i64::from(n.id) == i64::from(leader))?;
    Connection::connect(cluster.dialer.clone(), node.addr, cluster.timeout)
        .await
        .ok()
}

/// The committed data record at `offset`, if the connected leader serves one there.
async fn record_at(
    c: &mut Connection,
    topic: &str,
    partition: i32,
    offset: i64,
) -> Option<tidemark_harness::kafka::FetchedRecord> {
    let read = c
        .fetch(topic, partition, offset, -1, 1 << 20, Duration::ZERO)
        .await
        .ok()?;
    if read.error_code != 0 {
        return None;
    }
    read.records.into_iter().find(|r| r.offset == offset)
}

/// Records where the failover parted the clusters on one partition, found from the epochs
/// ([`parted_out_of_step`]).
fn set_parted(partitions: &mut Value, topic: &str, partition: i32, offset: i64) {
    for entry in partitions.as_array_mut().into_iter().flatten() {
        if entry["topic"] == topic && entry["partition"] == partition {
            entry["mirrored_offset"] = json!(offset);
            entry["parted_by"] = json!("offset-for-leader-epoch");
        }
    }
}

/// The newest leader epoch of every partition of `topics` among the answers of `cluster`'s
/// nodes.
async fn leader_epochs(cluster: &ClientContext, topics: &[String]) -> BTreeMap<(String, i32), i32> {
    partition_infos(cluster, topics)
        .await
        .into_iter()
        .map(|(k, info)| (k, info.leader_epoch))
        .collect()
}

/// Every partition of `topics` as the answer of `cluster`'s nodes with its newest leader epoch
/// has it.
async fn partition_infos(
    cluster: &ClientContext,
    topics: &[String],
) -> BTreeMap<(String, i32), PartitionInfo> {
    // A paused node never answers; the others' answers are enough.
    let ask = Duration::from_secs(2).min(cluster.timeout);
    let asks = cluster.nodes.iter().map(|n| async move {
        let answer = async {
            let mut c = Connection::connect(cluster.dialer.clone(), n.addr, ask)
                .await
                .ok()?;
            c.metadata(Some(topics)).await.ok()
        };
        tokio::time::timeout(ask, answer).await.ok().flatten()
    });
    let mut infos: BTreeMap<(String, i32), PartitionInfo> = BTreeMap::new();
    for meta in futures::future::join_all(asks).await.into_iter().flatten() {
        for (topic, (_, parts)) in &meta.topics {
            for (p, info) in parts {
                if info.leader_epoch < 0 {
                    continue;
                }
                let e = infos
                    .entry((topic.clone(), *p))
                    .or_insert_with(|| info.clone());
                if info.leader_epoch > e.leader_epoch {
                    *e = info.clone();
                }
            }
        }
    }
    infos
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults() -> MirrorFaults {
        MirrorFaults::new(MirrorSetup::new("a", "b", vec!["t0".into()]))
    }

    /// Partition `partition` as describe shows it led by node 1 in epoch 5, 120 fetched of the
    /// source's 120, 121 in the destination's log.
    fn described(partition: i32, state: MirrorState, barrier: Option<i64>) -> PartitionDescription {
        PartitionDescription {
            partition,
            leader: 1,
            leader_epoch: 5,
            state,
            source_offset: 120,
            destination_offset: 121,
            lag: 0,
            lmle: 3,
            retry_attempt: 0,
            last_error: None,
            waiting_for: None,
            barrier_offset: barrier,
        }
    }

    #[test]
    fn a_failover_parts_the_clusters_at_the_barrier_of_a_partition_stopped_in_step() {
        let stopped = described(0, MirrorState::Stopped, Some(120));
        let mirroring = described(0, MirrorState::Mirroring, None);
        assert_eq!(parted_at(&stopped, Some(&mirroring)), Some(120));
        let no_barrier = PartitionDescription {
            barrier_offset: None,
            ..stopped.clone()
        };
        assert_eq!(parted_at(&no_barrier, Some(&mirroring)), Some(121));
        // A mirror that had failed is not known to hold the source's records below its barrier.
        let failed = described(0, MirrorState::Failed, None);
        assert_eq!(parted_at(&stopped, Some(&failed)), None);
        // Nor one that had not fetched since it started (a failback's first fetch cuts what
        // the LMLE truncation left).
        let unfetched = PartitionDescription {
            source_offset: -1,
            ..mirroring.clone()
        };
        assert_eq!(parted_at(&stopped, Some(&unfetched)), None);
        // A partition stopped before is parted where that stop put its barrier.
        let stopped_before = PartitionDescription {
            source_offset: -1,
            ..stopped.clone()
        };
        assert_eq!(parted_at(&stopped, Some(&stopped_before)), Some(120));
        let stopping = PartitionDescription {
            state: MirrorState::Stopping,
            ..stopped
        };
        assert_eq!(parted_at(&stopping, Some(&mirroring)), None);
    }

    #[test]
    fn only_a_partition_out_of_step_before_and_stopped_after_is_parted_from_the_epochs() {
        let t = |d: PartitionDescription| ("t0".to_string(), d);
        let before: Described = Ok(vec![
            t(described(0, MirrorState::Failed, None)),
            t(described(1, MirrorState::Mirroring, None)),
            t(described(2, MirrorState::Failed, None)),
            t(described(3, MirrorState::Failed, None)),
            t(described(4, MirrorState::Failed, None)),
            t(PartitionDescription {
                source_offset: -1,
                ..described(5, MirrorState::Mirroring, None)
            }),
        ]);
        let after: Described = Ok(vec![
            t(described(0, MirrorState::Stopped, Some(120))),
            t(described(1, MirrorState::Stopped, Some(130))),
            t(described(2, MirrorState::Stopping, None)),
            t(described(3, MirrorState::Stopped, Some(140))),
            t(described(4, MirrorState::Stopped, Some(150))),
            t(described(5, MirrorState::Stopped, Some(160))),
        ]);
        // Partition 3's LMLE is unknown (-1): nothing to look up.
        let kept: BTreeMap<(String, i32), i32> = [(0, 7), (1, 7), (2, 7), (3, -1), (4, 9), (5, 4)]
            .into_iter()
            .map(|(p, l)| (("t0".to_string(), p), l))
            .collect();
        let topics = ["t0".to_string()];
        assert_eq!(
            out_of_step_then_stopped(&topics, &before, &after, &kept),
            [
                ("t0".to_string(), 0, 7, 120),
                ("t0".to_string(), 4, 9, 150),
                ("t0".to_string(), 5, 4, 160)
            ]
        );
        assert!(out_of_step_then_stopped(&["t1".to_string()], &before, &after, &kept).is_empty());
        let unknown: Described = Err(anyhow::anyhow!("describe timed out"));
        assert!(out_of_step_then_stopped(&topics, &unknown, &after, &kept).is_empty());
    }

    #[test]
    fn the_parting_offset_is_the_sources_end_of_the_lmle_below_the_barrier() {
        // The source ends epoch 7 at 100, below the barrier: the destination's 100..120 were
        // never the source's (its lineage moved on, or they were the destination's own).
        assert_eq!(parting_offset((0, 7, 100), 7, 120), Some(100));
        // The source went on in epoch 7 past what the destination fetched.
        assert_eq!(parting_offset((0, 7, 180), 7, 120), Some(120));
        // The source does not know epoch 7: the destination's latest is not the source's.
        assert_eq!(parting_offset((0, 5, 90), 7, 120), None);
        // An error, or nothing below the point to compare.
        assert_eq!(parting_offset((6, -1, -1), 7, 120), None);
        assert_eq!(parting_offset((0, 7, 0), 7, 120), None);
    }

    #[test]
    fn ops_parse_with_or_without_clusters_and_infos_replay() {
        let f = faults();
        assert!(f.parse("failover", &json!({}), &[]).is_ok());
        let info = json!({"from": "a", "to": "b", "topics": ["t0"],
            "partitions": [{"topic": "t0", "partition": 0, "lmle": 3, "mirrored_offset": 120,
                            "epoch": 5, "state_before": "MIRRORING", "state": "STOPPED"}]});
        assert!(f.parse("failover", &info, &[]).is_ok());
        assert!(f.parse("failback", &info, &[]).is_ok());
        let e = f
            .parse("failback", &json!({"from": "a"}), &[])
            .err()
            .unwrap();
        assert!(e.contains("`from` and `to`"), "{e}");
        assert!(f.parse("failback", &json!({"lagging": true}), &[]).is_ok());
        let lagged = json!({"from": "b", "to": "a", "lagging": "a2", "lagging_out_of_isr": true,
                            "mirroring_while_lagging": false});
        assert!(f.parse("failback", &lagged, &[]).is_ok());
        let e = f
            .parse("failover", &json!({"lagging": true}), &[])
            .err()
            .unwrap();
        assert!(e.starts_with("field `lagging`"), "{e}");
        let config = json!({"cluster": "b", "topic": "t0",
                            "set": {"mirror.support.unclean.leader.election": "true"}});
        assert!(f.parse("config", &config, &[]).is_ok());
        for bad in [
            json!({"cluster": "b", "topic": "t0", "set": {"retention.ms": "1"}}),
            json!({"cluster": "b", "topic": "t0",
                   "set": {"mirror.support.unclean.leader.election": "yes"}}),
            json!({"topic": "t0", "set": {}}),
        ] {
            assert!(f.parse("config", &bad, &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_mirror_missing_a_topic_is_not_all_mirroring() {
        let p = |partition, state| PartitionDescription {
            partition,
            leader: 1,
            leader_epoch: 3,
            state,
            source_offset: 0,
            destination_offset: 0,
            lag: 0,
            lmle: -1,
            retry_attempt: 0,
            last_error: None,
            waiting_for: None,
            barrier_offset: None,
        };
        let topics = ["t0".to_string(), "t1".to_string()];
        let mirroring = |s| s == MirrorState::Mirroring;
        // A start that failed after its first topic: t0 never started.
        let half: Described = Ok(vec![
            ("t1".into(), p(0, MirrorState::Mirroring)),
            ("t1".into(), p(1, MirrorState::Mirroring)),
        ]);
        assert!(!all_in(&half, &topics, mirroring));
        let whole: Described = Ok(vec![
            ("t0".into(), p(0, MirrorState::Mirroring)),
            ("t1".into(), p(0, MirrorState::Mirroring)),
        ]);
        assert!(all_in(&whole, &topics, mirroring));
        let stopped: Described = Ok(vec![
            ("t0".into(), p(0, MirrorState::Stopped)),
            ("t1".into(), p(0, MirrorState::Mirroring)),
        ]);
        assert!(!all_in(&stopped, &topics, mirroring));
    }

    #[test]
    fn the_lagging_replica_leads_nothing_and_is_owed_nothing() {
        use std::net::{IpAddr, Ipv4Addr};
        use std::sync::Arc;
        let node = |i: u32| Node {
            role: tidemark_harness::runtime::NodeRole::Combined,
            name: format!("a{i}"),
            cluster: "a".into(),
            id: i,
            ip: IpAddr::V4(Ipv4Addr::new(10, 211, 0, 10 + i as u8)),
            dir: "/tmp".into(),
            remote: Arc::new(remote::Local::host()),
        };
        let info = |leader: i32, replicas: &[i32]| PartitionInfo {
            error_code: 0,
            leader,
            leader_epoch: 1,
            replicas: replicas.to_vec(),
            isr: replicas.to_vec(),
        };
        let nodes = [node(1), node(2), node(3)];
        let nodes: Vec<&Node> = nodes.iter().collect();
        // a2 was restarted: like a1 it leads nothing, but t0/1 prefers it and will move back.
        let infos: BTreeMap<(String, i32), PartitionInfo> = [
            (("t0".into(), 0), info(3, &[3, 1, 2])),
            (("t0".into(), 1), info(3, &[2, 3, 1])),
            (("t1".into(), 0), info(3, &[3, 1, 2])),
        ]
        .into();
        assert_eq!(followers(&nodes, &infos), ["a1"].map(String::from).to_vec());
        let infos: BTreeMap<(String, i32), PartitionInfo> = [
            (("t0".into(), 0), info(1, &[1, 2, 3])),
            (("t0".into(), 1), info(3, &[2, 3, 1])),
            (("t1".into(), 0), info(3, &[3, 1, 2])),
            (("t1".into(), 1), info(3, &[1, 2, 3])),
        ]
        .into();
        // a1 leads one and is owed one, a3 leads three: a2, owed t0/1, is the least busy.
        assert_eq!(followers(&nodes, &infos), ["a2"].map(String::from).to_vec());
        let infos: BTreeMap<(String, i32), PartitionInfo> =
            [(("t0".into(), 0), info(1, &[2, 1, 3]))].into();
        // a2 leads nothing but is owed t0/0: a3 lags.
        assert_eq!(followers(&nodes, &infos), ["a3"].map(String::from).to_vec());
    }

    #[test]
    fn the_flag_as_set_up_and_as_config_ops_left_it() {
        let f = faults();
        let topics = ["t0".to_string()];
        assert!(!f.flag_on("a", &topics));
        f.flags
            .lock()
            .unwrap()
            .insert(("a".into(), "t0".into()), true);
        assert!(f.flag_on("a", &topics));
        assert!(!f.flag_on("b", &topics));
        let mut on = MirrorSetup::new("a", "b", vec!["t0".into()]);
        on.unclean_support = true;
        assert!(MirrorFaults::new(on).flag_on("b", &topics));
    }

    #[test]
    fn epoch_checkpoints_parse_or_give_nothing() {
        assert_eq!(
            parse_checkpoint("0\n2\n0 0\n3 17\n"),
            Some(vec![(0, 0), (3, 17)])
        );
        assert_eq!(parse_checkpoint("0\n0\n"), Some(vec![]));
        assert_eq!(parse_checkpoint("0\n2\n0 0\n"), None, "short");
        assert_eq!(parse_checkpoint("0\n1\nx 0\n"), None);
        assert_eq!(parse_checkpoint(""), None);
    }

    #[test]
    fn settling_keeps_what_the_writable_cluster_acknowledged() {
        let f = faults();
        let fs = |ops: Vec<Invocation>| ops.into_iter().map(|o| (o.f, o.value)).collect::<Vec<_>>();
        let back = |from: &str, to: &str| {
            (
                "failback".to_string(),
                json!({"from": from, "to": to, "settle": true}),
            )
        };
        assert_eq!(fs(f.settle_ops()), vec![back("a", "b")]);
        f.set_direction(Direction::FailedOver {
            from: "b".into(),
            to: "a".into(),
        });
        assert_eq!(fs(f.settle_ops()), vec![back("a", "b")]);
        f.set_direction(Direction::FailedOver {
            from: "a".into(),
            to: "b".into(),
        });
        assert_eq!(fs(f.settle_ops()), vec![back("b", "a")]);
        f.set_direction(Direction::Mirroring {
            source: "b".into(),
            destination: "a".into(),
        });
        assert_eq!(fs(f.settle_ops()), vec![back("b", "a")]);
    }
}
