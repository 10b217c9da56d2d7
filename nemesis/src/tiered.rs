//! Faults for tiered storage (KIP-405, KIP-1023): a node that loses its whole log directory, and a
//! remote store that goes away for a while.
//!
//! - `wipe` kills each target, deletes everything in its data directory but the metadata quorum's
//!   own log (`__cluster_metadata`, which Kafka keeps apart in `metadata.log.dir`: a controller
//!   that forgot its votes would break the quorum, which is not what this fault tests), and
//!   starts it empty. Before the kill it asks each partition's leader for its tiered offsets
//!   (ListOffsets -2, -4, -5, -6); before the start it asks them again of the leader the node
//!   will rejoin under (a wiped leader's successor, which may know less of the remote store than
//!   the node did); after the start it waits until the node is back in the ISR of every
//!   partition it replicates and records its replicas as `dump-log` reads them, with the leader
//!   they followed. Those records are what the checkers judge the follower's start from the
//!   remote store by (T1, T3).
//! - `remote-outage` takes the remote store away from its targets ([`RemoteStore`]): uploads and
//!   remote reads fail there until `remote-restore` gives it back.
//! - `tiered-config` turns KIP-1023's flag, the dynamic cluster config
//!   `follower.fetch.last.tiered.offset.enable`, the other way (or to the value given), as an
//!   operator does at run time, and waits until every node that answers describes the new value.
//!   A wipe records the flag as the cluster described it, so the checkers hold each wiped node
//!   to the protocol the flag chose (T1 on, T2 off).
//!
//! Every `info` names the nodes, so replaying it acts on the same ones.
//!
//! [`RemoteStore`]: tidemark_harness::db::RemoteStore

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Value};
use tidemark_checkers::tiered::FETCH_LAST_TIERED_OFFSET_KEY;
use tidemark_harness::kafka::{error_name, Connection, ParseResponseErrorCode};
use tidemark_harness::nemesis::NemesisContext;
use tidemark_harness::remote;

use crate::cluster::{block_on, ClusterView};
use crate::fault::{parse, Env, Failed, Fault, FaultOp};
use crate::targets::{NodeSpec, TargetFields, Targets};

/// The directory a wipe keeps: the metadata quorum's log.
pub const KEPT: &str = "__cluster_metadata";

/// How long a wiped node gets to catch up and rejoin every ISR before the op records that it
/// did not.
const REJOIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a leader gets to answer the tiered offsets.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a wiped node stays down at most, waiting for every partition it replicates to be led
/// by another node with a choice to offer ([`offers_a_choice`]): the controller fences a killed
/// broker after `broker.session.timeout.ms` (3 s in tests), and a new leader learns the remote
/// store in its first round (`remote.log.manager.task.interval.ms`) and keeps a segment it
/// uploaded once one more has closed.
const RESTART_LEADER_WAIT: Duration = Duration::from_secs(12);

/// Long enough for the broker's checkpoints (written every 500 ms) to show the rejoined state.
const CHECKPOINT_WAIT: Duration = Duration::from_millis(1200);

/// How long every answering node gets to describe a new flag value (the controller commits it,
/// then each broker applies the metadata record).
const CONFIG_WAIT: Duration = Duration::from_secs(5);

/// The `wipe`, `remote-outage` and `remote-restore` faults.
pub struct Tiered;

/// A value of any of the three ops: a schedule's spec or a recorded `info`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TieredValue {
    #[serde(default)]
    nodes: Option<Vec<String>>,
    #[serde(default)]
    targets: Option<NodeSpec>,
    /// The cluster the op acts on (the engine reads it; the nodes are that cluster's).
    #[serde(default, rename = "cluster")]
    _cluster: Option<String>,
    /// The mirror role the op was aimed at, when it was (recorded only).
    #[serde(default, rename = "role")]
    _role: Option<String>,
    /// Written by an `info` aimed at leaders: whom the engine found leading (recorded only).
    #[serde(default, rename = "leaders")]
    _leaders: Option<Value>,
    /// Written by a wipe's `info`: what was deleted on each node.
    #[serde(default, rename = "deleted")]
    _deleted: Option<Value>,
    /// Written by a wipe's `info`: the partitions' tiered offsets and rejoined replicas.
    #[serde(default, rename = "partitions")]
    _partitions: Option<Value>,
    /// Written by a wipe's `info`: the directory kept.
    #[serde(default, rename = "kept")]
    _kept: Option<Value>,
    /// Written by a wipe's `info`: seconds until every wiped node was back in every ISR.
    #[serde(default, rename = "rejoined_after_s")]
    _rejoined_after_s: Option<Value>,
    /// Written by a wipe's `info`: KIP-1023's flag as the cluster described it.
    #[serde(default, rename = "fetch_last_tiered_offset")]
    _fetch_last_tiered_offset: Option<Value>,
    /// A `tiered-config`'s value to set: `{"follower.fetch.last.tiered.offset.enable": "true"}`
    /// or `"false"`; absent, the op turns the flag the other way.
    #[serde(default)]
    set: Option<BTreeMap<String, String>>,
    /// Written by a `tiered-config`'s `info`: the value before (recorded only).
    #[serde(default, rename = "was")]
    _was: Option<Value>,
    /// Written by a `tiered-config`'s `info`: which nodes described the new value in time, and
    /// what the others answered (recorded only).
    #[serde(default, rename = "described")]
    _described: Option<Value>,
}

/// A parsed op.
#[derive(Debug, PartialEq)]
struct TieredOp {
    f: TieredF,
    targets: Targets,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum TieredF {
    Wipe,
    Outage,
    Restore,
    /// Sets KIP-1023's flag to the value, or turns it the other way.
    Config(Option<bool>),
}

impl TieredOp {
    fn parse(f: &str, value: &Value, nodes: &[String]) -> Result<Self, String> {
        let v: TieredValue = parse(value)?;
        let f = match f {
            "wipe" => TieredF::Wipe,
            "remote-outage" => TieredF::Outage,
            "remote-restore" => TieredF::Restore,
            "tiered-config" => TieredF::Config(flag_to_set(v.set.as_ref())?),
            other => return Err(format!("not a tiered-storage fault: {other}")),
        };
        if v.set.is_some() && !matches!(f, TieredF::Config(_)) {
            return Err("field `set`: only a tiered-config sets a config".into());
        }
        // Giving the store back to every node is the final heal; a config is the cluster's.
        let default = matches!(f, TieredF::Restore | TieredF::Config(_)).then_some(NodeSpec::All);
        let targets = TargetFields {
            nodes: v.nodes,
            targets: v.targets,
        }
        .targets(nodes, default)?;
        Ok(TieredOp { f, targets })
    }
}

/// The value a `tiered-config`'s `set` field asks for: none (turn it the other way), or
/// KIP-1023's flag, `"true"` or `"false"`.
fn flag_to_set(set: Option<&BTreeMap<String, String>>) -> Result<Option<bool>, String> {
    let Some(set) = set else {
        return Ok(None);
    };
    match (
        set.len(),
        set.get(FETCH_LAST_TIERED_OFFSET_KEY).map(String::as_str),
    ) {
        (1, Some("true")) => Ok(Some(true)),
        (1, Some("false")) => Ok(Some(false)),
        _ => Err(format!(
            "field `set`: only {FETCH_LAST_TIERED_OFFSET_KEY} with \"true\" or \"false\""
        )),
    }
}

impl Fault for Tiered {
    fn fs(&self) -> &'static [&'static str] {
        &["wipe", "remote-outage", "remote-restore", "tiered-config"]
    }

    fn parse<'a>(
        &'a self,
        f: &str,
        value: &Value,
        nodes: &[String],
    ) -> Result<Box<dyn FaultOp + 'a>, String> {
        Ok(Box::new(TieredOp::parse(f, value, nodes)?))
    }
}

impl FaultOp for TieredOp {
    fn invoke(self: Box<Self>, env: &mut Env<'_>) -> Result<Value, Failed> {
        let nodes = env.resolve(&self.targets)?;
        let mut record = json!({ "nodes": nodes });
        if let Some(spec) = self.targets.spec_name() {
            record["targets"] = json!(spec);
        }
        match self.f {
            TieredF::Wipe => wipe(env, &nodes, record),
            TieredF::Config(wanted) => set_flag(env, &nodes, wanted),
            TieredF::Outage | TieredF::Restore => {
                let Some(store) = env.cx.db.as_remote_store() else {
                    return Err(Failed::nothing(
                        "the database has no remote store (run the tiered workload)",
                    ));
                };
                let cut = self.f == TieredF::Outage;
                let (_, errors) =
                    env.on_each(
                        &nodes,
                        |n| {
                            if cut {
                                store.cut(n)
                            } else {
                                store.restore(n)
                            }
                        },
                    );
                Failed::partly(record, &errors)
            }
        }
    }
}

fn wipe(env: &mut Env<'_>, nodes: &[String], mut record: Value) -> Result<Value, Failed> {
    let db = env.cx.db;
    let (Some(kill), Some(data)) = (db.as_kill(), db.as_data_dir()) else {
        return Err(Failed::nothing(
            "the database cannot be killed or has no data directory to wipe",
        ));
    };
    record["kept"] = json!([KEPT]);
    // The leaders' tiered offsets before anything is lost: the earliest pending upload only
    // grows along a leader's lineage, so a follower that starts from the remote store must start
    // at or after it.
    let view = ClusterView::read(env.cx).ok();
    // Nemesis ops run one at a time, so no `tiered-config` changes the flag before the node is
    // back; a node cut off from the quorum may still describe an older value, so the wiped
    // nodes are asked again once back (they replayed the quorum's log), and a flag the nodes
    // do not agree on is not recorded.
    let all: Vec<String> = env.cx.nodes.iter().map(|n| n.name.clone()).collect();
    if let Some(flag) = agreed_flag(&described_flags(env.cx, &all)) {
        record["fetch_last_tiered_offset"] = json!(flag);
    }
    let mut before: BTreeMap<(String, i32), Value> = BTreeMap::new();
    if let Some(v) = &view {
        for p in &v.partitions {
            if p.replicas.iter().any(|r| nodes.contains(r)) && !p.topic.starts_with("__") {
                let asked = leader_offsets(env.cx, v, &p.topic, p.partition);
                before.insert((p.topic.clone(), p.partition), asked);
            }
        }
    }
    let (_, errors) = env.on_each(nodes, |n| kill.kill(n));
    if !errors.is_empty() {
        return Err(Failed {
            done: json!({"killed": nodes}),
            error: errors.join("; "),
        });
    }
    let deleted: std::sync::Mutex<BTreeMap<String, Value>> = Default::default();
    let (_, mut errors) = env.on_each(nodes, |n| {
        let out = remote::run(n.remote.as_ref(), &wipe_command(&data.data_dir(n)))?;
        deleted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(n.name.clone(), parse_deleted(&out));
        Ok(())
    });
    let deleted = deleted.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut partitions = Vec::new();
    let mut keys = Vec::new();
    for (node, entries) in &deleted {
        for name in entries.as_object().into_iter().flat_map(|m| m.keys()) {
            let Some((topic, partition)) = partition_dir(name) else {
                continue;
            };
            let leader = before
                .get(&(topic.to_string(), partition))
                .cloned()
                .unwrap_or_else(|| json!({"error": "not in the metadata before the wipe"}));
            partitions.push(json!({
                "node": node, "topic": topic, "partition": partition, "leader": leader,
            }));
            keys.push((topic.to_string(), partition));
        }
    }
    record["deleted"] = json!(deleted);
    let at_restart = leaders_at_restart(env.cx, nodes, &keys);
    for (p, key) in partitions.iter_mut().zip(&keys) {
        if let Some(asked) = at_restart.get(key) {
            p["leader_at_restart"] = asked.clone();
        }
    }
    let (_, start_errors) = env.on_each(nodes, |n| kill.start(n));
    errors.extend(start_errors);
    if !errors.is_empty() {
        record["partitions"] = json!(partitions);
        return Failed::partly(record, &errors);
    }
    let started = Instant::now();
    let rejoined = db
        .as_replica_dump()
        .and_then(|dump| wait_for_rejoin(env, nodes, &partitions, dump));
    record["rejoined_after_s"] = json!(rejoined.as_ref().map(|_| started.elapsed().as_secs_f64()));
    let flag_back = rejoined
        .as_ref()
        .and_then(|_| agreed_flag(&described_flags(env.cx, nodes)));
    if let Some(flag) = flag_back {
        record["fetch_last_tiered_offset"] = json!(flag);
    }
    // Read after the replicas: each had fetched by then, so a leader and epoch unchanged since
    // the ask before the start is the leader it fetched from.
    let followed = rejoined
        .as_ref()
        .and_then(|_| ClusterView::read(env.cx).ok());
    for (name, replicas) in rejoined.into_iter().flatten() {
        for p in partitions.iter_mut().filter(|p| p["node"] == name.as_str()) {
            let r = replicas
                .iter()
                .find(|r| r.state.topic == p["topic"] && p["partition"] == r.state.partition);
            if let Some(r) = r {
                let mut state = rejoined_state(&r.state);
                let leader = followed
                    .as_ref()
                    .and_then(|v| v.partition(&r.state.topic, r.state.partition as i32));
                if let Some(l) = leader {
                    state["leader"] = json!(l.leader);
                    state["leader_epoch"] = json!(l.leader_epoch);
                }
                if let Some(v) = &followed {
                    // After the replica was read: the leader's local log start then bounds
                    // where the old protocol (flag off) may have started the node.
                    state["leader_offsets"] =
                        leader_offsets(env.cx, v, &r.state.topic, r.state.partition as i32);
                }
                p["rejoined"] = state;
            }
        }
    }
    record["partitions"] = json!(partitions);
    Failed::partly(record, &errors)
}

/// KIP-1023's flag as each of `nodes` describes it (DescribeConfigs of its broker resource; a
/// node without the key has Kafka's default, off), or why it did not answer.
fn described_flags(
    cx: &NemesisContext<'_>,
    nodes: &[String],
) -> BTreeMap<String, Result<bool, String>> {
    let answers = block_on(async {
        let asks = cx
            .nodes
            .iter()
            .filter(|n| nodes.contains(&n.name))
            .map(|n| async move {
                let addr = cx.db.endpoint(n);
                let ask = async {
                    let mut c =
                        Connection::connect(cx.client.dialer.clone(), addr, ASK_TIMEOUT).await?;
                    c.broker_config(n.id as i32, FETCH_LAST_TIERED_OFFSET_KEY)
                        .await
                };
                let answer = match tokio::time::timeout(ASK_TIMEOUT * 2, ask).await {
                    Err(_) => Err("timed out".to_string()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(Err((code, message)))) => Err(refusal(code, message)),
                    Ok(Ok(Ok(None))) => Ok(false),
                    Ok(Ok(Ok(Some(v)))) => v
                        .parse::<bool>()
                        .map_err(|_| format!("described as {v:?}, not true or false")),
                };
                (n.name.clone(), answer)
            });
        futures::future::join_all(asks).await
    });
    answers.into_iter().collect()
}

/// A config request's refusal: the error's name and the broker's message.
fn refusal(code: i16, message: Option<String>) -> String {
    match message {
        Some(m) => format!("{}: {m}", error_name(code)),
        None => error_name(code),
    }
}

/// The flag the answering nodes agree on, if they answered and agree.
fn agreed_flag(described: &BTreeMap<String, Result<bool, String>>) -> Option<bool> {
    let mut values = described.values().filter_map(|a| a.as_ref().ok());
    let first = *values.next()?;
    values.all(|v| *v == first).then_some(first)
}

fn described_json(described: &BTreeMap<String, Result<bool, String>>) -> Value {
    described
        .iter()
        .map(|(n, a)| {
            let v = match a {
                Ok(b) => json!(b),
                Err(e) => json!({ "error": e }),
            };
            (n.clone(), v)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `tiered-config`: sets KIP-1023's flag cluster-wide to `wanted`, or the other way from what
/// the answering nodes agree it is, then waits until every node of `nodes` that answers
/// describes the new value.
fn set_flag(env: &mut Env<'_>, nodes: &[String], wanted: Option<bool>) -> Result<Value, Failed> {
    let cx = env.cx;
    let before = described_flags(cx, nodes);
    let was = agreed_flag(&before);
    let Some(value) = wanted.or(was.map(|w| !w)) else {
        return Err(Failed::nothing(format!(
            "the nodes do not agree on {FETCH_LAST_TIERED_OFFSET_KEY}, nothing to turn: {}",
            described_json(&before)
        )));
    };
    let mut record = json!({"set": {FETCH_LAST_TIERED_OFFSET_KEY: value.to_string()}, "was": was});
    // Any node takes the request to the controller; the first that answers decides.
    let mut refusals = Vec::new();
    let mut sent = false;
    for n in cx.nodes.iter().filter(|n| nodes.contains(&n.name)) {
        let addr = cx.db.endpoint(n);
        let asked = block_on(async {
            let ask = async {
                let mut c =
                    Connection::connect(cx.client.dialer.clone(), addr, ASK_TIMEOUT).await?;
                c.set_cluster_config(FETCH_LAST_TIERED_OFFSET_KEY, &value.to_string())
                    .await
            };
            tokio::time::timeout(ASK_TIMEOUT * 2, ask).await
        });
        match asked {
            Ok(Ok((0, _))) => {
                sent = true;
                break;
            }
            Ok(Ok((code, message))) => {
                return Err(Failed::nothing(format!(
                    "{} refused the config: {}",
                    n.name,
                    refusal(code, message)
                )))
            }
            Ok(Err(e)) if !e.maybe_sent() => refusals.push(format!("{}: {e}", n.name)),
            unknown => {
                // It may have been committed: say so, and what the nodes describe now.
                let why = match unknown {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_string(),
                };
                record["described"] = described_json(&described_flags(cx, nodes));
                return Err(Failed {
                    done: record,
                    error: format!("{}: {why}; the config may have been set", n.name),
                });
            }
        }
    }
    if !sent {
        return Err(Failed::nothing(format!(
            "no node took the config: {}",
            refusals.join("; ")
        )));
    }
    let deadline = Instant::now() + CONFIG_WAIT;
    loop {
        let now = described_flags(cx, nodes);
        let settled = now
            .values()
            .all(|a| a.as_ref().map_or(true, |v| *v == value));
        if settled || Instant::now() >= deadline {
            record["described"] = described_json(&now);
            return if settled {
                Ok(record)
            } else {
                Err(Failed {
                    done: record,
                    error: format!("not every node described {value} within {CONFIG_WAIT:?}"),
                })
            };
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The tiered offsets of the leader each of `partitions` will be followed from, asked while the
/// wiped `nodes` are still down, as `leader_at_restart`.
///
/// Why this bounds where a wiped node must start (kips.md §2.3): an empty follower told its
/// offset is out of range or tiered asks its leader for the earliest pending upload (EPUO), and
/// starts right after the remote segment holding EPUO − 1, normally at EPUO itself. A leader's
/// EPUO, max(highest tiered offset + 1, log start), only grows while it leads in one epoch:
/// uploads raise the highest tiered offset, and the log start only moves up (an answer of -1,
/// not yet known, the follower does not start from, it asks again). So what the follower's
/// leader answers before the node is started, hence before its first fetch, is a lower bound of
/// where it must start, provided that leader is still the one, in the same epoch, once the node
/// is back (the `rejoined` record names it). The answer read before the kill is no such bound
/// for a wiped leader: its successor's view of the remote store can lag the node's own by a
/// round. So this waits (at most [`RESTART_LEADER_WAIT`]) until each partition has a leader
/// that is not wiped and [offers a choice](offers_a_choice), asking every leader anew each time
/// (the last answers are the closest to the node's first fetch, so the tightest bound), and
/// records the last answer, or why there was none.
fn leaders_at_restart(
    cx: &NemesisContext<'_>,
    nodes: &[String],
    partitions: &[(String, i32)],
) -> BTreeMap<(String, i32), Value> {
    let deadline = Instant::now() + RESTART_LEADER_WAIT;
    let mut asked: BTreeMap<(String, i32), Value> = BTreeMap::new();
    loop {
        let view = ClusterView::read(cx).ok();
        for (topic, p) in partitions {
            let key = (topic.clone(), *p);
            let answer = match view.as_ref().map(|v| (v, v.partition(topic, *p))) {
                None => json!({"error": "no node answered a metadata request"}),
                Some((_, None)) => json!({"error": "not in the metadata"}),
                Some((_, Some(pv))) if pv.leader.as_ref().is_some_and(|l| nodes.contains(l)) => {
                    json!({"node": pv.leader, "leader_epoch": pv.leader_epoch,
                           "error": "still led by a wiped node"})
                }
                Some((v, Some(_))) => leader_offsets(cx, v, topic, *p),
            };
            asked.insert(key, answer);
        }
        if asked.values().all(offers_a_choice) || Instant::now() >= deadline {
            return asked;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Whether a leader's answers show the state in which a follower starting from the remote store
/// has a choice to make, the one the tiered workload sets up (KIP-1023): part of the log is only
/// in the remote store (log start below the local log start) and part of what was uploaded is
/// still local (local log start below a known EPUO). A leader just elected, or catching up on
/// uploads after an outage, has not deleted what it uploaded yet, or has deleted all of it; a
/// node started then tests nothing of where it starts.
fn offers_a_choice(answer: &Value) -> bool {
    let offset = |k: &str| answer[k].as_i64();
    match (
        offset("log_start_offset"),
        offset("local_log_start_offset"),
        offset("earliest_pending_upload"),
    ) {
        (Some(start), Some(local), Some(epuo)) => {
            answer.get("error").is_none() && start < local && local < epuo
        }
        _ => false,
    }
}

/// Deletes every entry of the data directory but [`KEPT`], printing `<bytes>\t<name>` for each.
fn wipe_command(dir: &std::path::Path) -> String {
    format!(
        "cd {dir} 2>/dev/null || exit 0; for e in * .[!.]*; do [ -e \"$e\" ] || continue; \
         [ \"$e\" = {KEPT} ] && continue; \
         printf '%s\\t%s\\n' \"$(du -sb -- \"$e\" | cut -f1)\" \"$e\"; rm -rf -- \"$e\"; done",
        dir = remote::escape(&dir.display().to_string()),
    )
}

/// The wipe command's output as `{name: bytes}`.
fn parse_deleted(out: &str) -> Value {
    let entries: BTreeMap<&str, u64> = out
        .lines()
        .filter_map(|l| {
            let (bytes, name) = l.split_once('\t')?;
            Some((name, bytes.trim().parse().ok()?))
        })
        .collect();
    json!(entries)
}

/// A partition directory's topic and index (`t0-1`); internal topics (`__…`) are not the
/// workload's.
fn partition_dir(name: &str) -> Option<(&str, i32)> {
    let (topic, index) = name.rsplit_once('-')?;
    if topic.is_empty() || topic.starts_with("__") {
        return None;
    }
    Some((topic, index.parse().ok()?))
}

/// The tiered offsets of a partition's leader, with its leader epoch as `view` has it:
/// ListOffsets -6 first, then -5, so that the earliest pending upload is never newer than the
/// highest tiered offset read beside it; then -2, -4 and -1 (the high watermark, which a
/// rejoined replica must reach).
fn leader_offsets(cx: &NemesisContext<'_>, view: &ClusterView, topic: &str, p: i32) -> Value {
    let Some((leader, epoch)) = view
        .partition(topic, p)
        .and_then(|p| Some((p.leader.clone()?, p.leader_epoch)))
    else {
        return json!({"error": "no leader"});
    };
    let Some(node) = cx.nodes.iter().find(|n| n.name == leader) else {
        return json!({"node": leader, "error": "not a node of the test"});
    };
    let addr = cx.db.endpoint(node);
    let asked = block_on(async {
        let ask = async {
            let mut c = Connection::connect(cx.client.dialer.clone(), addr, ASK_TIMEOUT).await?;
            let mut answers = Vec::new();
            for ts in [-6, -5, -2, -4, -1] {
                answers.push(c.list_offsets(topic, p, ts).await?);
            }
            Ok::<_, tidemark_harness::kafka::KafkaError>(answers)
        };
        tokio::time::timeout(ASK_TIMEOUT * 2, ask).await
    });
    let answers = match asked {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => return json!({"node": leader, "error": e.to_string()}),
        Err(_) => return json!({"node": leader, "error": "timed out"}),
    };
    if let Some((code, _, _)) = answers.iter().find(|(c, _, _)| c.err().is_some()) {
        return json!({"node": leader, "error": error_name(*code)});
    }
    let (epuo, highest, start, local, end) =
        (answers[0], answers[1], answers[2], answers[3], answers[4]);
    json!({
        "node": leader,
        "leader_epoch": epoch,
        "high_watermark": end.1,
        "earliest_pending_upload": epuo.1,
        "earliest_pending_upload_epoch": epuo.2,
        "highest_tiered_offset": highest.1,
        "log_start_offset": start.1,
        "local_log_start_offset": local.1,
    })
}

/// Waits until each of `nodes` is in the ISR of every partition it replicates and holds every
/// partition of `partitions` up to the high watermark its leader had before the wipe (an ISR
/// read right after the start may still be the one from before the kill); then, once the
/// checkpoints had time to show it, returns each node's replicas.
fn wait_for_rejoin(
    env: &Env<'_>,
    nodes: &[String],
    partitions: &[Value],
    dump: &dyn tidemark_harness::db::ReplicaDump,
) -> Option<BTreeMap<String, Vec<tidemark_harness::db::DumpedReplica>>> {
    let wanted: BTreeSet<&String> = nodes.iter().collect();
    let deadline = Instant::now() + REJOIN_TIMEOUT;
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
        let in_isrs = ClusterView::read(env.cx).is_ok_and(|view| {
            view.partitions.iter().all(|p| {
                p.replicas
                    .iter()
                    .filter(|r| wanted.contains(r))
                    .all(|r| p.isr.contains(r))
            })
        });
        if !in_isrs {
            continue;
        }
        let caught_up = nodes.iter().all(|name| {
            let Ok(node) = env.node(name) else {
                return false;
            };
            let Ok(replicas) = dump.dump_replicas(node) else {
                return false;
            };
            partitions
                .iter()
                .filter(|p| p["node"] == name.as_str())
                .all(|p| {
                    let hw = p["leader"]["high_watermark"].as_i64().unwrap_or(0);
                    replicas.iter().any(|r| {
                        r.state.topic == p["topic"]
                            && p["partition"] == r.state.partition
                            && r.state.log_end_offset.unwrap_or(0) >= hw
                    })
                })
        });
        if caught_up {
            std::thread::sleep(CHECKPOINT_WAIT);
            let mut out = BTreeMap::new();
            for name in nodes {
                let node = env.node(name).ok()?;
                out.insert(name.clone(), dump.dump_replicas(node).ok()?);
            }
            return Some(out);
        }
    }
    None
}

/// What the checkers need of a rejoined replica: both log starts, where its local log began
/// when it started from the remote store (local retention may have moved its start since), its
/// end and its epoch cache (the leader it followed is added from the cluster's metadata).
fn rejoined_state(r: &tidemark_harness::db::ReplicaState) -> Value {
    let local = r.log_start_offset;
    let start = r.tiered.as_ref().and_then(|t| t.log_start_offset).or(local);
    let mut state = json!({
        "log_start_offset": start,
        "local_log_start_offset": local,
        "log_end_offset": r.log_end_offset,
        "epochs": r.epochs,
    });
    if let Some(b) = r.remote_bootstrap {
        state["remote_bootstrap"] = json!(b);
    }
    state
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_parse_specs_and_recorded_infos_and_name_bad_fields() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |f: &str, v: Value| TieredOp::parse(f, &v, &nodes);
        assert_eq!(
            parse("wipe", json!({"targets": "leader"})),
            Ok(TieredOp {
                f: TieredF::Wipe,
                targets: Targets::Spec(NodeSpec::Leader)
            })
        );
        let info = json!({"nodes": ["n2"], "targets": "one", "kept": [KEPT],
                          "deleted": {"n2": {"t0-0": 4096}}, "rejoined_after_s": 2.5,
                          "partitions": [{"node": "n2", "topic": "t0", "partition": 0}]});
        assert_eq!(
            parse("wipe", info),
            Ok(TieredOp {
                f: TieredF::Wipe,
                targets: Targets::Nodes(vec!["n2".into()])
            })
        );
        // Found replaying a tiered run: a leader-aimed outage's info names the leaders.
        let info = json!({"leaders": ["n2", "n3"], "nodes": ["n2"], "targets": "leader"});
        assert_eq!(
            parse("remote-outage", info).map(|o| o.targets),
            Ok(Targets::Nodes(vec!["n2".into()]))
        );
        assert_eq!(
            parse("remote-restore", json!({})).map(|o| o.targets),
            Ok(Targets::Spec(NodeSpec::All))
        );
        assert!(parse("remote-outage", json!({})).is_err());
        let e = parse("remote-outage", json!({"targets": "all", "nodez": []})).unwrap_err();
        assert!(e.contains("nodez"), "{e}");
        let e = parse("wipe", json!({"nodes": ["n9"]})).unwrap_err();
        assert!(e.contains("n9"), "{e}");
        let info = json!({"nodes": ["n3"], "fetch_last_tiered_offset": false,
                          "partitions": [{"node": "n3", "topic": "t0", "partition": 0,
                              "rejoined": {"leader": "n1", "leader_offsets": {"node": "n1"}}}]});
        assert!(parse("wipe", info).is_ok());
    }

    #[test]
    fn a_tiered_config_turns_the_flag_or_sets_the_value_its_info_recorded() {
        let nodes: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let parse = |v: Value| TieredOp::parse("tiered-config", &v, &nodes).map(|o| o.f);
        assert_eq!(parse(json!({})), Ok(TieredF::Config(None)));
        let info = json!({"set": {FETCH_LAST_TIERED_OFFSET_KEY: "false"}, "was": true,
                          "described": {"n1": false, "n2": {"error": "timed out"}}});
        assert_eq!(parse(info), Ok(TieredF::Config(Some(false))));
        for bad in [
            json!({"set": {FETCH_LAST_TIERED_OFFSET_KEY: "yes"}}),
            json!({"set": {"remote.storage.enable": "true"}}),
            json!({"set": {FETCH_LAST_TIERED_OFFSET_KEY: "true", "x": "y"}}),
        ] {
            let e = parse(bad.clone()).unwrap_err();
            assert!(e.contains("field `set`"), "{bad}: {e}");
        }
        let e = TieredOp::parse("wipe", &json!({"targets": "one", "set": {}}), &nodes).unwrap_err();
        assert!(e.contains("only a tiered-config"), "{e}");
    }

    #[test]
    fn the_flag_is_what_every_answering_node_describes() {
        let d = |answers: &[(&str, Result<bool, &str>)]| {
            answers
                .iter()
                .map(|(n, a)| (n.to_string(), a.map_err(String::from)))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(
            agreed_flag(&d(&[("n1", Ok(true)), ("n2", Err("down"))])),
            Some(true)
        );
        assert_eq!(
            agreed_flag(&d(&[("n1", Ok(true)), ("n2", Ok(false))])),
            None
        );
        assert_eq!(agreed_flag(&d(&[("n1", Err("down"))])), None);
    }

    #[test]
    fn the_wipe_lists_what_it_deleted_and_the_partitions_among_it() {
        let out = "4096\tt0-0\n12\tmeta.properties\n8192\t__consumer_offsets-3\nbad line\n";
        assert_eq!(
            parse_deleted(out),
            json!({"t0-0": 4096, "meta.properties": 12, "__consumer_offsets-3": 8192})
        );
        assert_eq!(partition_dir("t0-0"), Some(("t0", 0)));
        assert_eq!(partition_dir("my-topic-12"), Some(("my-topic", 12)));
        assert_eq!(partition_dir("__consumer_offsets-3"), None);
        assert_eq!(partition_dir("meta.properties"), None);
        assert_eq!(partition_dir("replication-offset-checkpoint"), None);
    }

    #[test]
    fn a_leader_offers_a_choice_once_it_keeps_part_of_what_it_uploaded() {
        let answer = |start: i64, local: i64, epuo: i64| {
            json!({"node": "n1", "leader_epoch": 2, "log_start_offset": start,
                   "local_log_start_offset": local, "earliest_pending_upload": epuo})
        };
        assert!(offers_a_choice(&answer(0, 120, 160)));
        // Nothing deleted locally yet (a new leader, or uploads catching up after an outage).
        assert!(!offers_a_choice(&answer(0, 0, 160)));
        // Everything uploaded already deleted locally: the two starts are the same.
        assert!(!offers_a_choice(&answer(0, 160, 160)));
        // A leader that has not learnt its tiered offsets.
        assert!(!offers_a_choice(&answer(0, 120, -1)));
        assert!(!offers_a_choice(
            &json!({"node": "n3", "leader_epoch": 4, "error": "still led by a wiped node"})
        ));
    }

    #[test]
    fn the_wipe_command_keeps_the_quorum_log_and_deletes_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("t0-0")).unwrap();
        std::fs::write(d.join("t0-0/00000000000000000000.log"), b"abc").unwrap();
        std::fs::create_dir_all(d.join(KEPT)).unwrap();
        std::fs::write(d.join(KEPT).join("log"), b"votes").unwrap();
        std::fs::write(d.join("meta.properties"), b"x").unwrap();
        std::fs::write(d.join(".lock"), b"").unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(wipe_command(d))
            .output()
            .unwrap();
        assert!(out.status.success());
        let deleted = parse_deleted(&String::from_utf8_lossy(&out.stdout));
        let names: Vec<&String> = deleted.as_object().unwrap().keys().collect();
        assert_eq!(names, vec![".lock", "meta.properties", "t0-0"]);
        let left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
            .collect();
        assert_eq!(left, vec![KEPT.to_string()]);
    }
}
