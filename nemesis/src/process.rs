//! Process faults through the database's [`Kill`] and [`Pause`] abilities: `kill` (SIGKILL) and
//! `start`, `pause` (SIGSTOP) and `resume` (SIGCONT) on resolved targets (`start` and `resume`
//! optionally bringing the nodes back catching up slowly, [`CatchUp`]), and `bounce`, which
//! chases one partition's leadership like Kafka's `hard_bounce`: kill whoever leads, restart it
//! at once, wait for the next election, and again, fast enough that a follower which has just
//! truncated may lead before it catches up; and `handoff`, which kills a leader while freezing
//! its successor, so the last replica takes over without having caught up; and `strand`, which
//! cuts a leader off from its followers on the brokers' listeners (the controllers still reach
//! it, clients still write to it) until its ISR has shrunk to itself, then kills it; and
//! `lapse`, which kills the follower first in a partition's replica order, brings it back
//! behind once the ISR has dropped it, and kills the leader while it still catches up.
//!
//! [`Kill`]: tidemark_harness::db::Kill
//! [`Pause`]: tidemark_harness::db::Pause

use std::time::{Duration, Instant};

use anyhow::Context as _;
use rand::seq::IndexedRandom;
use rand::RngExt;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::cluster::{ClusterView, PartitionView};
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{known_node, NodeSpec, TargetFields, Targets};

/// How long a bounce waits for the partition's next election.
pub(crate) const NEW_LEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Kill, start, pause, resume and bounce.
pub struct Process;

/// The value of `bounce`: a partition (or one chosen when performed), how many times, and in a
/// recorded `info` whom it killed, in order (a replay kills them again).
#[derive(Debug, Default, PartialEq, Deserialize)]
struct BounceValue {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    times: Option<u64>,
    #[serde(default)]
    killed: Option<Vec<String>>,
}

/// The value of `handoff`: a partition (or one chosen when performed), and in a recorded `info`
/// whom it killed and whom it froze.
#[derive(Debug, Default, PartialEq, Deserialize)]
struct HandoffValue {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    killed: Option<String>,
    #[serde(default)]
    paused: Option<String>,
}

/// The value of `strand`: a partition (or one chosen when performed), and in a recorded `info`
/// whom it cut off and killed and how long the cut held before the kill (a replay holds it as
/// long).
#[derive(Debug, Default, PartialEq, Deserialize)]
struct StrandValue {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    killed: Option<String>,
    #[serde(default)]
    cut_ms: Option<u64>,
}

/// The value of `lapse`: a partition (or one chosen when performed), and in a recorded `info`
/// the follower it left behind, the leader it killed, how long the follower was down and the
/// catch-up it came back with (a replay does the same).
#[derive(Debug, Default, PartialEq, Deserialize)]
struct LapseValue {
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    lagging: Option<String>,
    #[serde(default)]
    killed: Option<String>,
    #[serde(default)]
    down_ms: Option<u64>,
    #[serde(default)]
    behind_ms: Option<u64>,
    #[serde(default)]
    catch_up: Option<CatchUp>,
}

/// How long a strand waits at most for the leader to be alone in its ISR, and a lapse for the
/// ISR to drop the follower it killed.
pub(crate) const STRAND_MAX: Duration = Duration::from_secs(8);

/// How long a lapse waits at most for the restarted follower to answer again.
const BACK_MAX: Duration = Duration::from_secs(10);

/// How long a lapse leaves the restarted follower fetching, behind, before it kills the leader:
/// time for its fetchers to start and ask the leader, whose ISR must not take it in yet.
const BEHIND_MS: std::ops::RangeInclusive<u64> = 1500..=3500;

/// How long a stranded leader alone in its ISR goes on serving clients before it is killed.
pub(crate) const ALONE_MS: std::ops::RangeInclusive<u64> = 300..=1500;

/// The `catch_up` of a `start` or `resume`: what the nodes receive from the other brokers'
/// listeners (where followers fetch: the records they lack) is capped at `bytes_per_s` for
/// `ms`, and the cap then ends by itself; what they send (their fetch requests) is not held up.
/// A node back from a crash has to fetch everything written while it was down; in a test's
/// small cluster that takes one fetch, on a real one seconds to hours (a node thawed after a
/// stall is behind too), and that window (a replica catching up, whether the ISR lets it in,
/// whether a leader failure meanwhile can hand it leadership) is where replication bugs live.
/// An absent rate is [`CATCH_UP_BYTES_PER_S`], an absent time is drawn when performed; both are
/// recorded, so a replay caps the same.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CatchUp {
    #[serde(default)]
    bytes_per_s: Option<u32>,
    #[serde(default)]
    ms: Option<u64>,
}

/// The bandwidth (bytes/s) a catching-up node receives at when the op names none: far below
/// what the workloads write, so that hardly any fetched records get through and the node is
/// still behind when the cap ends. The default queue workload writes about 37 small batches a
/// second, some 3 kB; at 1 kB/s a restarted node's backlog of a few seconds (a couple of kB)
/// was through within two, and it stayed in step after that.
const CATCH_UP_BYTES_PER_S: u32 = 256;

/// How long a catch-up is capped when the op names no time: past the calm after the restart or
/// thaw, so the next fault lands while the node still catches up.
const CATCH_UP_MS: std::ops::RangeInclusive<u64> = 4000..=8000;

/// The value of `start` and `resume`: their targets and an optional slow catch-up.
#[derive(Debug, Default, Deserialize)]
struct ComeBackValue {
    #[serde(flatten)]
    targets: TargetFields,
    #[serde(default)]
    catch_up: Option<CatchUp>,
}

/// An op's optional `topic` and `partition`, which go together.
pub(crate) fn partition_of(
    topic: Option<String>,
    partition: Option<u32>,
) -> Result<Option<(String, i32)>, String> {
    match (topic, partition) {
        (None, None) => Ok(None),
        (Some(t), Some(p)) => i32::try_from(p)
            .map(|p| Some((t, p)))
            .map_err(|_| format!("field `partition`: {p} is out of range")),
        _ => Err("`topic` and `partition` go together".into()),
    }
}

/// A parsed process op.
#[derive(Debug, PartialEq)]
enum ProcessOp {
    /// `kill`, `start`, `pause` or `resume` on the targets.
    Signal(Signal, Targets),
    /// `start` or `resume` the targets, their replication capped a while.
    CatchingUp(Signal, Targets, CatchUp),
    /// Chase a partition's leadership `times` times, or kill exactly `replay`, in order.
    Bounce {
        at: Option<(String, i32)>,
        times: usize,
        replay: Option<Vec<String>>,
    },
    /// Kill a leader while freezing its successor.
    Handoff {
        at: Option<(String, i32)>,
        killed: Option<String>,
        paused: Option<String>,
    },
    /// Cut a leader off from its followers, then kill it (`killed` after `cut_ms` on replay).
    Strand {
        at: Option<(String, i32)>,
        killed: Option<String>,
        cut_ms: Option<u64>,
    },
    /// Leave a follower behind, then kill the leader.
    Lapse(Lapse),
}

/// A parsed `lapse`: what a recorded `info` fixes, the rest drawn when performed.
#[derive(Debug, Default, PartialEq)]
struct Lapse {
    at: Option<(String, i32)>,
    lagging: Option<String>,
    killed: Option<String>,
    down_ms: Option<u64>,
    behind_ms: Option<u64>,
    catch_up: CatchUp,
}

/// What a signal op does to a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Kill,
    Start,
    Pause,
    Resume,
}

impl ProcessOp {
    fn parse(f: &str, value: &Value, nodes: &[String]) -> Result<Self, String> {
        let signal = match f {
            "kill" => Signal::Kill,
            "start" | "resume" => {
                let signal = if f == "start" {
                    Signal::Start
                } else {
                    Signal::Resume
                };
                let v: ComeBackValue = parse(value)?;
                if v.catch_up.is_some_and(|c| c.bytes_per_s == Some(0)) {
                    return Err("field `catch_up.bytes_per_s`: must be at least 1".into());
                }
                // Restarting and thawing default to every node.
                let targets = v.targets.targets(nodes, Some(NodeSpec::All))?;
                return Ok(match v.catch_up {
                    Some(c) => ProcessOp::CatchingUp(signal, targets, c),
                    None => ProcessOp::Signal(signal, targets),
                });
            }
            "pause" => Signal::Pause,
            "bounce" => {
                let v: BounceValue = parse(value)?;
                if v.times == Some(0) {
                    return Err("field `times`: must be at least 1".into());
                }
                let replay = v
                    .killed
                    .map(|list| {
                        list.iter()
                            .enumerate()
                            .try_for_each(|(i, n)| known_node(n, nodes, &format!("killed[{i}]")))
                            .map(|()| list)
                    })
                    .transpose()?;
                let times = match &replay {
                    Some(list) => list.len(),
                    None => v.times.map_or(3, |t| t as usize),
                };
                return Ok(ProcessOp::Bounce {
                    at: partition_of(v.topic, v.partition)?,
                    times,
                    replay,
                });
            }
            "handoff" => {
                let v: HandoffValue = parse(value)?;
                for (field, name) in [("killed", &v.killed), ("paused", &v.paused)] {
                    if let Some(name) = name {
                        known_node(name, nodes, field)?;
                    }
                }
                return Ok(ProcessOp::Handoff {
                    at: partition_of(v.topic, v.partition)?,
                    killed: v.killed,
                    paused: v.paused,
                });
            }
            "strand" => {
                let v: StrandValue = parse(value)?;
                if let Some(name) = &v.killed {
                    known_node(name, nodes, "killed")?;
                }
                return Ok(ProcessOp::Strand {
                    at: partition_of(v.topic, v.partition)?,
                    killed: v.killed,
                    cut_ms: v.cut_ms,
                });
            }
            "lapse" => {
                let v: LapseValue = parse(value)?;
                for (field, name) in [("lagging", &v.lagging), ("killed", &v.killed)] {
                    if let Some(name) = name {
                        known_node(name, nodes, field)?;
                    }
                }
                if v.lagging.is_some() && v.lagging == v.killed {
                    return Err("fields `lagging` and `killed`: must be two nodes".into());
                }
                if v.catch_up.is_some_and(|c| c.bytes_per_s == Some(0)) {
                    return Err("field `catch_up.bytes_per_s`: must be at least 1".into());
                }
                return Ok(ProcessOp::Lapse(Lapse {
                    at: partition_of(v.topic, v.partition)?,
                    lagging: v.lagging,
                    killed: v.killed,
                    down_ms: v.down_ms,
                    behind_ms: v.behind_ms,
                    catch_up: v.catch_up.unwrap_or_default(),
                }));
            }
            other => return Err(format!("the process fault does not perform {other:?}")),
        };
        let targets = parse::<TargetFields>(value)?.targets(nodes, None)?;
        Ok(ProcessOp::Signal(signal, targets))
    }
}

impl FaultOp for ProcessOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        match *self {
            ProcessOp::Signal(signal, targets) => signal_nodes(env, signal, &targets),
            ProcessOp::CatchingUp(signal, targets, c) => catching_up(env, signal, &targets, c),
            ProcessOp::Bounce { at, times, replay } => bounce(env, at, times, replay),
            ProcessOp::Handoff { at, killed, paused } => handoff(env, at, killed, paused),
            ProcessOp::Strand { at, killed, cut_ms } => strand(env, at, killed, cut_ms),
            ProcessOp::Lapse(lapse) => self::lapse(env, lapse),
        }
    }
}

fn signal_nodes(env: &mut Env<'_>, signal: Signal, targets: &Targets) -> Result<Value, Failed> {
    let nodes = env.resolve(targets)?;
    let db = env.cx.db;
    let (done, errors) = match signal {
        Signal::Kill | Signal::Start => {
            let kill = env.kill()?;
            if signal == Signal::Kill {
                env.on_each(&nodes, |n| kill.kill(n))
            } else {
                env.on_each(&nodes, |n| kill.start(n))
            }
        }
        Signal::Pause | Signal::Resume => {
            let pause = db
                .as_pause()
                .ok_or_else(|| Failed::nothing("the database cannot be paused"))?;
            if signal == Signal::Pause {
                env.on_each(&nodes, |n| pause.pause(n))
            } else {
                env.on_each(&nodes, |n| pause.resume(n))
            }
        }
    };
    let mut record = json!({ "nodes": sorted(done) });
    if let Some(spec) = targets.spec_name() {
        record["targets"] = json!(spec);
    }
    Failed::partly(record, &errors)
}

/// Caps what the targets receive as `c` says, then starts or thaws them (`signal`) as
/// [`signal_nodes`] does: the cap is in force before their first fetch, and ends by itself. A
/// node the cap failed on comes back all the same, and the error is recorded.
fn catching_up(
    env: &mut Env<'_>,
    signal: Signal,
    targets: &Targets,
    c: CatchUp,
) -> Result<Value, Failed> {
    let bytes_per_s = c.bytes_per_s.unwrap_or(CATCH_UP_BYTES_PER_S);
    let ms = c.ms.unwrap_or_else(|| env.rng.random_range(CATCH_UP_MS));
    let nodes = env.resolve(targets)?;
    let ports = env.listener_ports();
    let (_, cap_errors) = env.on_each(&nodes, |n| {
        crate::loss::cap_on_ports_for(n, &env.peers_of(&n.name), &ports, bytes_per_s, ms)
            .context("bandwidth cap")
    });
    let (mut record, mut errors) = match signal_nodes(env, signal, &Targets::Nodes(nodes)) {
        Ok(record) => (record, Vec::new()),
        Err(failed) => (failed.done, vec![failed.error]),
    };
    errors.extend(cap_errors);
    record["catch_up"] = json!({"bytes_per_s": bytes_per_s, "ms": ms});
    if let Some(spec) = targets.spec_name() {
        record["targets"] = json!(spec);
    }
    Failed::partly(record, &errors)
}

/// Kills a partition's leader (restarting it at once) and, before it is back, freezes the
/// in-sync replica next in line to succeed it. The frozen successor is elected, the last
/// replica follows it without being able to fetch, and once the controller fences the
/// successor that replica leads; then the successor thaws. (KIP-101's scenario, with the
/// restart keeping a three-node quorum alive.)
fn handoff(
    env: &mut Env<'_>,
    at: Option<(String, i32)>,
    killed: Option<String>,
    paused: Option<String>,
) -> Result<Value, Failed> {
    let db = env.cx.db;
    let (Some(kill), Some(pause)) = (db.as_kill(), db.as_pause()) else {
        return Err(Failed::nothing("the database cannot be killed and paused"));
    };
    // A successor and one more in-sync replica to take over from it are needed.
    let (p, leader) = partition_and_leader(env, at, 3, killed)?;
    let (topic, partition) = (p.topic.clone(), p.partition);
    let heir = paused.or_else(|| {
        p.replicas
            .iter()
            .find(|r| **r != leader && p.isr.contains(r))
            .cloned()
    });
    let Some(heir) = heir else {
        return Err(Failed::nothing(format!(
            "{topic}/{partition} has no in-sync replica to succeed {leader}"
        )));
    };
    let mut record = json!({"topic": topic, "partition": partition, "killed": leader,
                            "paused": heir});
    // Kill first, so the last replica hears of no more commits; freeze the successor before
    // the restarted leader re-registers and the successor is elected.
    let mut errors = Vec::new();
    let (leader_node, heir_node) = (env.node(&leader)?, env.node(&heir)?);
    if let Err(e) = kill.kill(env.node(&leader)?) {
        return Err(Failed::nothing(format!("{leader}: {e:#}")));
    }
    if let Err(e) = pause.pause(heir_node) {
        errors.push(format!("{heir}: {e:#}"));
    }
    if let Err(e) = kill.start(leader_node) {
        errors.push(format!("{leader}: {e:#}"));
    }
    let elected = wait_for_election(env, &topic, partition, p.leader_epoch);
    // The successor leads first; wait for the election after it is fenced.
    let next = match elected {
        Some((l, e)) if l == heir => wait_for_election(env, &topic, partition, e),
        other => other,
    };
    match next {
        Some((l, _)) => record["elected"] = json!(l),
        None => errors.push(format!(
            "{topic}/{partition} elected no leader besides {heir} within {NEW_LEADER_TIMEOUT:?}"
        )),
    }
    if let Err(e) = pause.resume(env.node(&heir)?) {
        errors.push(format!("{heir}: {e:#}"));
    }
    Failed::partly(record, &errors)
}

/// Cuts a partition's leader off from every other node on the brokers' listeners, where
/// followers fetch (the controllers' quorum keeps its port, so the leader stays leader and its
/// ISR shrinks to itself while clients go on writing to it), waits until it is alone in the ISR
/// and a little longer, kills it, and heals the cut (a leadership that moves first takes the
/// cut along, once; after a second move the node cut is killed as it is). A leader whose
/// followers have fallen behind, then crashing: its successor comes from the replicas that fell
/// behind (KIP-966's eligible leader replicas, or the ISR if it never shrank), so nothing
/// acknowledged may have been acknowledged without them.
fn strand(
    env: &mut Env<'_>,
    at: Option<(String, i32)>,
    killed: Option<String>,
    cut_ms: Option<u64>,
) -> Result<Value, Failed> {
    let started = Instant::now();
    let kill = env.kill()?;
    let (topic, partition) = match at {
        Some(at) => at,
        None => partition_with_isr(env, 2)?,
    };
    let mut leader = match killed {
        Some(l) => l,
        None => ClusterView::read(env.cx)
            .map_err(Failed::from_error)?
            .partition(&topic, partition)
            .and_then(|p| p.leader.clone())
            .ok_or_else(|| Failed::nothing(format!("{topic}/{partition} has no leader")))?,
    };
    env.node(&leader)?;
    let alone_ms = env.rng.random_range(ALONE_MS);
    let ports = env.listener_ports();
    let mut moved_from: Option<String> = None;
    let (cut, hold) = loop {
        let grudge = crate::grudge::isolate(&env.names(), std::slice::from_ref(&leader));
        env.cx
            .net
            .drop_on_ports(env.cx.nodes, &grudge, &ports)
            .map_err(|e| Failed {
                done: json!({"topic": topic, "partition": partition}),
                error: format!("cutting {leader} off: {e:#}"),
            })?;
        let cut = Instant::now();
        if let Some(ms) = cut_ms {
            break (cut, Duration::from_millis(ms));
        }
        // Alone in its ISR, it goes on serving a while. A leadership gone elsewhere (a
        // controller moved it, or the view read before cutting was behind) moves the cut to
        // the new leader, once; after that there is nothing to wait for.
        let mut moved = None;
        while cut.elapsed() < STRAND_MAX {
            if let Some(p) = ClusterView::read(env.cx)
                .ok()
                .and_then(|v| v.partition(&topic, partition).cloned())
            {
                if p.isr == [leader.clone()] {
                    break;
                }
                if let Some(other) = p.leader.filter(|l| *l != leader) {
                    moved = Some(other);
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        match moved {
            Some(other) if moved_from.is_none() && env.node(&other).is_ok() => {
                if let Err(e) = env.cx.net.heal(env.cx.nodes) {
                    return Err(Failed {
                        done: json!({"topic": topic, "partition": partition}),
                        error: format!("healing the cut of {leader}: {e:#}"),
                    });
                }
                moved_from = Some(std::mem::replace(&mut leader, other));
                continue;
            }
            Some(_) => break (cut, cut.elapsed()),
            None => break (cut, cut.elapsed() + Duration::from_millis(alone_ms)),
        }
    };
    let node = env.node(&leader)?;
    let mut record = json!({"topic": topic, "partition": partition, "nodes": [leader],
                            "killed": leader, "ports": ports});
    if let Some(first) = &moved_from {
        record["moved_from"] = json!(first);
    }
    std::thread::sleep(hold.saturating_sub(cut.elapsed()));
    if let Ok(v) = ClusterView::read(env.cx) {
        if let Some(p) = v.partition(&topic, partition) {
            record["isr"] = json!(p.isr);
            record["leader_at_kill"] = json!(p.leader);
        }
    }
    record["cut_ms"] = json!(cut.elapsed().as_millis() as u64);
    record["cut_from_ms"] = json!(cut.duration_since(started).as_millis() as u64);
    let mut errors = Vec::new();
    if let Err(e) = kill.kill(node) {
        errors.push(format!("{leader}: {e:#}"));
        record["nodes"] = json!([]);
    }
    if let Err(e) = env.cx.net.heal(env.cx.nodes) {
        errors.push(format!("healing the cut: {e:#}"));
    }
    // With the op's own times, these tell when the cut was surely in force.
    record["elapsed_ms"] = json!(started.elapsed().as_millis() as u64);
    Failed::partly(record, &errors)
}

/// Kills the follower that comes first in a partition's replica order (before the other
/// in-sync follower; any bandwidth cap left on the others by an earlier catch-up lifted first),
/// waits until the ISR has dropped it and clients have written a moment more to the leader and
/// the last replica, starts it again catching up slowly (as a `start` with `catch_up` does),
/// and once it answers again and has fetched a moment (1.5–3.5 s), live but behind, kills the
/// leader. A clean election must pass over that live replica for the in-sync one after it: one
/// that picks the first live replica, or lets a replica back into the ISR before it has caught
/// up, hands leadership to the replica that lacks acknowledged records. The leader stays down
/// until the package's `start`.
fn lapse(env: &mut Env<'_>, lapse: Lapse) -> Result<Value, Failed> {
    let kill = env.kill()?;
    let (p, leader) = partition_and_leader(env, lapse.at, 3, lapse.killed)?;
    let (topic, partition) = (p.topic.clone(), p.partition);
    let lagging = lapse
        .lagging
        .or_else(|| p.replicas.iter().find(|r| **r != leader).cloned())
        .ok_or_else(|| Failed::nothing(format!("{topic}/{partition} has no follower")))?;
    env.node(&leader)?;
    let mut epoch = p.leader_epoch;
    let mut record = json!({"topic": topic, "partition": partition, "lagging": lagging,
                            "killed": leader, "nodes": []});
    // The move is about one replica falling behind: what is left of an earlier turn's catch-up
    // cap on the others would drop the in-sync survivor from the ISR too.
    let mut errors = Vec::new();
    let others: Vec<&String> = p.replicas.iter().filter(|r| **r != lagging).collect();
    lift_caps(env, others, &mut errors);
    let down = Instant::now();
    kill.kill(env.node(&lagging)?)
        .map_err(|e| Failed::nothing(format!("{lagging}: {e:#}")))?;
    let down_ms = lapse
        .down_ms
        .unwrap_or_else(|| hold_until_out_of_isr(env, (&topic, partition), &lagging, down));
    std::thread::sleep(Duration::from_millis(down_ms).saturating_sub(down.elapsed()));
    record["down_ms"] = json!(down_ms);
    let came_back = catching_up(
        env,
        Signal::Start,
        &Targets::Nodes(vec![lagging.clone()]),
        lapse.catch_up,
    );
    match came_back {
        Ok(v) => record["catch_up"] = v["catch_up"].clone(),
        Err(failed) => {
            record["catch_up"] = failed.done["catch_up"].clone();
            errors.push(failed.error);
        }
    }
    let back = Instant::now();
    while back.elapsed() < BACK_MAX {
        if ClusterView::read(env.cx).is_ok_and(|v| v.answered.contains(&lagging)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let behind_ms = lapse
        .behind_ms
        .unwrap_or_else(|| env.rng.random_range(BEHIND_MS));
    std::thread::sleep(Duration::from_millis(behind_ms));
    record["behind_ms"] = json!(behind_ms);
    if let Ok(v) = ClusterView::read(env.cx) {
        if let Some(p) = v.partition(&topic, partition) {
            record["isr_at_kill"] = json!(p.isr);
            record["leader_at_kill"] = json!(p.leader);
            epoch = epoch.max(p.leader_epoch);
        }
    }
    if let Err(e) = kill.kill(env.node(&leader)?) {
        errors.push(format!("{leader}: {e:#}"));
        return Failed::partly(record, &errors);
    }
    record["nodes"] = json!([leader]);
    match wait_for_election(env, &topic, partition, epoch) {
        Some((l, _)) => record["elected"] = json!(l),
        None => errors.push(format!(
            "{topic}/{partition} elected no leader after {leader} within {NEW_LEADER_TIMEOUT:?}"
        )),
    }
    Failed::partly(record, &errors)
}

fn bounce(
    env: &mut Env<'_>,
    at: Option<(String, i32)>,
    times: usize,
    replay: Option<Vec<String>>,
) -> Result<Value, Failed> {
    let kill = env.kill()?;
    let (topic, partition) = match at {
        Some(at) => at,
        None => any_led_partition(env)?,
    };
    let mut killed: Vec<String> = Vec::new();
    let mut errors = Vec::new();
    let record = |killed: &[String]| json!({"topic": topic, "partition": partition, "times": times, "killed": killed});
    // Each bounce waits for an election newer than the last one (the same node may win it).
    let mut after = -1;
    for i in 0..times {
        let Some((leader, epoch)) = wait_for_election(env, &topic, partition, after) else {
            errors.push(format!(
                "{topic}/{partition} elected no leader after epoch {after} within \
                 {NEW_LEADER_TIMEOUT:?}"
            ));
            break;
        };
        after = epoch;
        let victim = replay.as_ref().map_or(leader, |list| list[i].clone());
        let node = env.node(&victim)?;
        if let Err(e) = kill.kill(node).and_then(|()| kill.start(node)) {
            errors.push(format!("{victim}: {e:#}"));
            break;
        }
        killed.push(victim);
    }
    Failed::partly(record(&killed), &errors)
}

/// A random partition that has a leader.
fn any_led_partition(env: &mut Env<'_>) -> Result<(String, i32), Failed> {
    let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
    let led: Vec<_> = view
        .partitions
        .iter()
        .filter(|p| p.leader.is_some())
        .collect();
    let p = led
        .choose(env.rng)
        .ok_or_else(|| Failed::nothing("no partition has a leader"))?;
    Ok((p.topic.clone(), p.partition))
}

/// Partition `at` (else a random one with at least `isr` in-sync replicas) as the freshest view
/// has it, and the leader to act on: `leader` when a replay names it, else the partition's.
pub(crate) fn partition_and_leader(
    env: &mut Env<'_>,
    at: Option<(String, i32)>,
    isr: usize,
    leader: Option<String>,
) -> Result<(PartitionView, String), Failed> {
    let (topic, partition) = match at {
        Some(at) => at,
        None => partition_with_isr(env, isr)?,
    };
    let view = ClusterView::read(env.cx).map_err(Failed::from_error)?;
    let p = view
        .partition(&topic, partition)
        .cloned()
        .ok_or_else(|| Failed::nothing(format!("no partition {topic}/{partition}")))?;
    let leader = leader
        .or(p.leader.clone())
        .ok_or_else(|| Failed::nothing(format!("{topic}/{partition} has no leader")))?;
    Ok((p, leader))
}

/// A random partition with a leader and at least `isr` in-sync replicas, waiting for one while
/// the cluster recovers from other faults; at once an error when no partition has that many
/// replicas at all.
fn partition_with_isr(env: &mut Env<'_>, isr: usize) -> Result<(String, i32), Failed> {
    let deadline = Instant::now() + NEW_LEADER_TIMEOUT;
    loop {
        if let Ok(view) = ClusterView::read(env.cx) {
            let few = |p: &PartitionView| p.replicas.len() < isr;
            if !view.partitions.is_empty() && view.partitions.iter().all(few) {
                return Err(Failed::nothing(format!(
                    "no partition has {isr} replicas to take part"
                )));
            }
            let ready: Vec<_> = view
                .partitions
                .iter()
                .filter(|p| p.leader.is_some() && p.isr.len() >= isr)
                .collect();
            if let Some(p) = ready.choose(env.rng) {
                return Ok((p.topic.clone(), p.partition));
            }
        }
        if Instant::now() >= deadline {
            return Err(Failed::nothing(format!(
                "no partition had {isr} in-sync replicas within {NEW_LEADER_TIMEOUT:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Lifts what an earlier turn's catch-up cap left on each of `nodes`, adding an error for each
/// node it failed on to `errors`.
pub(crate) fn lift_caps<'n>(
    env: &Env<'_>,
    nodes: impl IntoIterator<Item = &'n String>,
    errors: &mut Vec<String>,
) {
    for name in nodes {
        if let Err(e) = env
            .node(name)
            .and_then(|n| crate::loss::lift(n, &env.peers_of(name)).map_err(Failed::from_error))
        {
            errors.push(format!("lifting {name}'s caps: {}", e.error));
        }
    }
}

/// How long, from `since`, to hold a replica that has left (killed, stopped or cut off) before
/// the next step: until the partition's ISR has dropped `node` (at most [`STRAND_MAX`]) and
/// 0.3–1.5 s more while clients write; in milliseconds, as recorded for a replay.
pub(crate) fn hold_until_out_of_isr(
    env: &mut Env<'_>,
    (topic, partition): (&str, i32),
    node: &str,
    since: Instant,
) -> u64 {
    while since.elapsed() < STRAND_MAX {
        let isr = ClusterView::read(env.cx)
            .ok()
            .and_then(|v| v.partition(topic, partition).map(|p| p.isr.clone()));
        if isr.is_some_and(|isr| !isr.iter().any(|r| r == node)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (since.elapsed() + Duration::from_millis(env.rng.random_range(ALONE_MS))).as_millis() as u64
}

/// Waits until the partition has a leader elected after `epoch`; returns it and its epoch.
pub(crate) fn wait_for_election(
    env: &Env<'_>,
    topic: &str,
    partition: i32,
    epoch: i32,
) -> Option<(String, i32)> {
    wait_for_election_within(env, (topic, partition), epoch, NEW_LEADER_TIMEOUT)
}

/// As [`wait_for_election`], waiting at most `timeout`.
pub(crate) fn wait_for_election_within(
    env: &Env<'_>,
    (topic, partition): (&str, i32),
    epoch: i32,
    timeout: Duration,
) -> Option<(String, i32)> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(view) = ClusterView::read(env.cx) {
            let elected = view
                .partition(topic, partition)
                .filter(|p| p.leader_epoch > epoch)
                .and_then(|p| Some((p.leader.clone()?, p.leader_epoch)));
            if elected.is_some() {
                return elected;
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        // Chase fast: a follower that just truncated should not have time to catch up.
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

impl Fault for Process {
    fn fs(&self) -> &'static [&'static str] {
        &[
            "kill", "start", "pause", "resume", "bounce", "handoff", "strand", "lapse",
        ]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(ProcessOp::parse(f, value, nodes)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_names_the_bad_field() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |f: &str, v: Value| ProcessOp::parse(f, &v, &nodes);
        assert_eq!(
            parse("kill", json!({"targets": "leaders"})),
            Ok(ProcessOp::Signal(
                Signal::Kill,
                Targets::Spec(NodeSpec::Leaders)
            ))
        );
        assert_eq!(
            parse("start", json!({})),
            Ok(ProcessOp::Signal(
                Signal::Start,
                Targets::Spec(NodeSpec::All)
            ))
        );
        // A recorded info: the names win over the spec.
        assert_eq!(
            parse("pause", json!({"nodes": ["n2"], "targets": "one"})),
            Ok(ProcessOp::Signal(
                Signal::Pause,
                Targets::Nodes(vec!["n2".into()])
            ))
        );
        // A start with a slow catch-up; what was drawn is recorded and replays as drawn.
        assert_eq!(
            parse("start", json!({"nodes": ["n3"], "catch_up": {}})),
            Ok(ProcessOp::CatchingUp(
                Signal::Start,
                Targets::Nodes(vec!["n3".into()]),
                CatchUp::default()
            ))
        );
        let recorded = json!({"nodes": ["n3"], "catch_up": {"bytes_per_s": 2048, "ms": 5000}});
        assert_eq!(
            parse("resume", recorded),
            Ok(ProcessOp::CatchingUp(
                Signal::Resume,
                Targets::Nodes(vec!["n3".into()]),
                CatchUp {
                    bytes_per_s: Some(2048),
                    ms: Some(5000)
                }
            ))
        );
        let e = parse("start", json!({"catch_up": {"kbytes_per_s": 2}})).unwrap_err();
        assert!(e.contains("unknown field `kbytes_per_s`"), "{e}");
        let e = parse("start", json!({"catch_up": {"bytes_per_s": 0}})).unwrap_err();
        assert!(e.starts_with("field `catch_up.bytes_per_s`"), "{e}");
        let e = parse("start", json!({"catch_up": {"ms": "soon"}})).unwrap_err();
        assert!(e.contains("invalid type"), "{e}");
        let e = parse("start", json!({"nodes": ["n9"], "catch_up": {}})).unwrap_err();
        assert!(e.contains("unknown node \"n9\""), "{e}");
        assert!(parse("kill", json!({})).is_err());
        assert!(parse("pause", json!([1])).is_err());
        let e = parse("kill", json!({"nodes": ["n1", "n7"]})).unwrap_err();
        assert!(
            e.starts_with("field `nodes[1]`: unknown node \"n7\""),
            "{e}"
        );
        let e = parse("pause", json!({"targets": 3})).unwrap_err();
        assert!(e.starts_with("field `targets`: invalid type"), "{e}");
        let e = parse("pause", json!({"targets": "most"})).unwrap_err();
        assert!(e.starts_with("field `targets`: unknown node spec"), "{e}");
        assert_eq!(
            parse("bounce", json!({"times": 2})),
            Ok(ProcessOp::Bounce {
                at: None,
                times: 2,
                replay: None
            })
        );
        let replay =
            json!({"topic": "t", "partition": 1, "times": 3, "killed": ["n1", "n2", "n1"]});
        assert_eq!(
            parse("bounce", replay),
            Ok(ProcessOp::Bounce {
                at: Some(("t".into(), 1)),
                times: 3,
                replay: Some(vec!["n1".into(), "n2".into(), "n1".into()])
            })
        );
        let e = parse("bounce", json!({"killed": ["n1", "n4"]})).unwrap_err();
        assert!(e.contains("`killed[1]`"), "{e}");
        let e = parse("bounce", json!({"topic": "t"})).unwrap_err();
        assert!(e.contains("together"), "{e}");
        let e = parse("bounce", json!({"topic": "t", "partition": -1})).unwrap_err();
        assert!(e.starts_with("field `partition`"), "{e}");
        let recorded = json!({"topic": "t", "partition": 0, "killed": "n1", "paused": "n2",
                              "elected": "n3"});
        assert_eq!(
            parse("handoff", recorded),
            Ok(ProcessOp::Handoff {
                at: Some(("t".into(), 0)),
                killed: Some("n1".into()),
                paused: Some("n2".into())
            })
        );
        let e = parse("handoff", json!({"killed": "n1", "paused": "n9"})).unwrap_err();
        assert!(e.contains("`paused`"), "{e}");
        let e = parse("bounce", json!({"times": 0})).unwrap_err();
        assert!(e.contains("`times`"), "{e}");
        assert_eq!(
            parse("strand", json!({})),
            Ok(ProcessOp::Strand {
                at: None,
                killed: None,
                cut_ms: None
            })
        );
        let recorded = json!({"topic": "t", "partition": 2, "nodes": ["n3"], "killed": "n3",
                              "ports": [9092], "isr": ["n3"], "cut_ms": 4210});
        assert_eq!(
            parse("strand", recorded),
            Ok(ProcessOp::Strand {
                at: Some(("t".into(), 2)),
                killed: Some("n3".into()),
                cut_ms: Some(4210)
            })
        );
        let e = parse("strand", json!({"killed": "n5"})).unwrap_err();
        assert!(e.contains("`killed`"), "{e}");
        let e = parse("strand", json!({"cut_ms": -3})).unwrap_err();
        assert!(e.starts_with("field `cut_ms`"), "{e}");
        assert_eq!(
            parse("lapse", json!({})),
            Ok(ProcessOp::Lapse(Lapse::default()))
        );
        let recorded = json!({"topic": "t", "partition": 1, "lagging": "n2", "killed": "n1",
                              "nodes": ["n1"], "down_ms": 3900, "behind_ms": 1700, "elected": "n3",
                              "catch_up": {"bytes_per_s": 256, "ms": 6000}});
        assert_eq!(
            parse("lapse", recorded),
            Ok(ProcessOp::Lapse(Lapse {
                at: Some(("t".into(), 1)),
                lagging: Some("n2".into()),
                killed: Some("n1".into()),
                down_ms: Some(3900),
                behind_ms: Some(1700),
                catch_up: CatchUp {
                    bytes_per_s: Some(256),
                    ms: Some(6000)
                }
            }))
        );
        let e = parse("lapse", json!({"lagging": "n1", "killed": "n1"})).unwrap_err();
        assert!(e.contains("two nodes"), "{e}");
        let e = parse("lapse", json!({"lagging": "n8"})).unwrap_err();
        assert!(e.starts_with("field `lagging`"), "{e}");
        let e = parse("lapse", json!({"catch_up": {"bytes_per_s": 0}})).unwrap_err();
        assert!(e.starts_with("field `catch_up.bytes_per_s`"), "{e}");
    }
}
