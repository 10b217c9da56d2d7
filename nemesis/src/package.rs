//! Fault packages, as in Jepsen's combined package: each fault kind contributes a cycle of ops
//! (a fault, then its undoing, then another fault ...), the ops that heal it at the end, and a
//! label and colour for plots. [`Combined`] runs them on the single nemesis worker: the
//! disruptive kinds take turns from a shuffled deck, one fault in force at a time (overlapping
//! them, as Jepsen's `gen/any` of staggered flip-flops does, left a three-node cluster with no
//! majority to elect from and caught less: docs/detection.md), and the kinds that stop nothing
//! run on staggered timelines of their own across them.
//!
//! Between two mirrored clusters ([`Combined::between`]) each fault that names no cluster lands
//! where its package's aims ([`aim`](crate::aim)) say, else on the mirror's source or its
//! destination at random (as the direction is when it starts), and its undoing on the same
//! cluster. Between a failover and its failback, the first fault and then three in four land on
//! the cluster failed over from: it still takes writes from clients not yet redirected, and what
//! it writes in new leader epochs there is what its failback's LMLE truncation has to remove. As
//! an operator does after a disaster, a failback waits until the cluster failed over from has had
//! an outage (a disruptive fault there undone, or one that is over once performed, such as a
//! bounce), when there are disruptive faults at all, and comes half an interval after it, before
//! the next fault.

use rand::seq::{IndexedRandom, SliceRandom};
use rand::RngExt;
use serde::Serialize;
use serde_json::{json, Value};
use tidemark_harness::db::DiskFault;
use tidemark_harness::generator::{Context, Generator, Next, Planned, Rng, Worker};
use tidemark_harness::op::{Invocation, Op, OpType};

use crate::aim::Aim;
use crate::mirror::MirrorSetup;
use crate::Kind;

/// How plots label and shade a fault kind: intervals open with a `start` op and close with a
/// `stop` op.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Perf {
    /// Label.
    pub name: &'static str,
    /// Ops that open an interval.
    pub start: Vec<&'static str>,
    /// Ops that close it.
    pub stop: Vec<&'static str>,
    /// Fill colour.
    pub color: &'static str,
}

/// The ops of one fault kind, one after another.
///
/// Contract: [`next`](Cycle::next) is pure given the cycle's state and the draws from `rng`;
/// [`done`](Cycle::done) hears the `info` value of each op the cycle produced, before it is
/// asked for the next; [`in_force`](Cycle::in_force) says whether the last op left a fault in
/// force that the next op undoes.
pub trait Cycle: Send {
    /// The next op.
    fn next(&mut self, rng: &mut Rng) -> Invocation;

    /// Whether a fault is in force until the cycle's next op.
    fn in_force(&self) -> bool {
        false
    }

    /// What the nemesis actually did for the cycle's last op.
    fn done(&mut self, info: &Value) {
        let _ = info;
    }
}

/// One fault kind's part of the schedule.
pub struct Package {
    /// The fault kind.
    pub kind: Kind,
    /// Its ops in the main phase.
    pub cycle: Box<dyn Cycle>,
    /// Ops that heal it in the final phase beyond what the engine heals.
    pub heal: Vec<Invocation>,
    /// Plot label and colour.
    pub perf: Perf,
    /// Between mirrored clusters, the roles its faults are aimed at (none: either cluster).
    pub aims: Vec<Aim>,
}

fn op(f: &str, value: Value) -> Invocation {
    Invocation {
        f: f.to_string(),
        value,
    }
}

/// Faults then their undoing: `start` draws a fault (and says whether it needs undoing), `stop`
/// builds the undoing from what the fault recorded.
struct FlipFlop<S, T> {
    start: S,
    stop: T,
    undo_next: bool,
    last: Value,
}

impl<S, T> Cycle for FlipFlop<S, T>
where
    S: FnMut(&mut Rng) -> (Invocation, bool) + Send,
    T: Fn(&Value) -> Invocation + Send,
{
    fn next(&mut self, rng: &mut Rng) -> Invocation {
        if self.undo_next {
            self.undo_next = false;
            return (self.stop)(&self.last);
        }
        let (op, undo) = (self.start)(rng);
        self.undo_next = undo;
        op
    }

    fn done(&mut self, info: &Value) {
        self.last = info.clone();
    }

    fn in_force(&self) -> bool {
        self.undo_next
    }
}

fn flip_flop<S, T>(start: S, stop: T) -> Box<dyn Cycle>
where
    S: FnMut(&mut Rng) -> (Invocation, bool) + Send + 'static,
    T: Fn(&Value) -> Invocation + Send + 'static,
{
    Box::new(FlipFlop {
        start,
        stop,
        undo_next: false,
        last: json!({}),
    })
}

/// The same op again and again, for faults that undo themselves.
struct Repeat(Invocation);

impl Cycle for Repeat {
    fn next(&mut self, _rng: &mut Rng) -> Invocation {
        self.0.clone()
    }
}

/// The nodes a fault recorded: `nodes`, or the keys of `offsets_ms`.
fn recorded_nodes(info: &Value) -> Value {
    if let Some(n) = info.get("nodes") {
        return n.clone();
    }
    match info.get("offsets_ms").and_then(Value::as_object) {
        Some(m) => json!(m.keys().collect::<Vec<_>>()),
        None => json!([]),
    }
}

fn pick(choices: &[String], rng: &mut Rng) -> String {
    choices.choose(rng).cloned().unwrap_or_default()
}

/// Draws as from a shuffled deck rather than with dice: in every round each card comes up as
/// many times as it has copies, in a random order, so that a short run sees the whole mix
/// rather than one kind again and again (a 30 s run has about five turns).
struct Deck<T> {
    cards: Vec<T>,
    left: Vec<T>,
}

impl<T: Clone> Deck<T> {
    /// A deck holding each card as many times as its count.
    fn new(counts: impl IntoIterator<Item = (T, u32)>) -> Self {
        let cards = counts
            .into_iter()
            .flat_map(|(card, n)| std::iter::repeat_n(card, n as usize))
            .collect();
        Deck {
            cards,
            left: Vec::new(),
        }
    }

    /// The next card, shuffling a new round when the last one is dealt; `None` for an empty deck.
    fn draw(&mut self, rng: &mut Rng) -> Option<T> {
        if self.left.is_empty() {
            self.left = self.cards.clone();
            self.left.shuffle(rng);
        }
        self.left.pop()
    }
}

/// The kill package's moves: a leader chased through elections, a leader killed with its
/// successor frozen, a leader cut off from its followers and then killed, a follower left
/// behind and the leader killed, followers leaving one by one until the leader stands alone and
/// is killed, or a kill; all but the first two undone by a start.
#[derive(Clone, Copy)]
enum KillMove {
    Bounce,
    Handoff,
    Strand,
    Lapse,
    LastStand,
    Kill,
}

/// The share of faults aimed at partition leaders when a kind's targets include leader specs:
/// replication bugs live where a leader acknowledges, fails or hands over.
pub const LEADER_SHARE: f64 = 0.5;

/// How long clients send as fast as they can before a fault aimed at leaders acts, so it lands
/// on a leader with writes just acknowledged and in flight.
pub const BURST_MS: u64 = 1000;

fn is_leader_target(name: &str) -> bool {
    matches!(
        name,
        "leader" | "leader-replication" | "leader-control" | "leaders"
    )
}

/// A fault op's value naming its targets under `key`: a leader spec with [`LEADER_SHARE`]
/// (and a burst before it) when `targets` has one, else one of the others.
fn aimed(key: &str, targets: &[String], rng: &mut Rng) -> Value {
    let (leader, other): (Vec<String>, Vec<String>) =
        targets.iter().cloned().partition(|t| is_leader_target(t));
    if !leader.is_empty() && (other.is_empty() || rng.random_bool(LEADER_SHARE)) {
        json!({ key: pick(&leader, rng), crate::BURST_KEY: BURST_MS })
    } else {
        json!({ key: pick(&other, rng) })
    }
}

/// Failover, then failback, then failover again ...: each resolved against the mirror's
/// direction when performed, each failback asking for a lagging replica ([`crate::mirror`]; the
/// final phase's failback has none). The next move follows the direction the last one recorded:
/// a failover that was refused is tried again, not followed by a failback of nothing.
struct Alternate {
    next_failover: bool,
}

impl Cycle for Alternate {
    fn next(&mut self, _rng: &mut Rng) -> Invocation {
        let failover = self.next_failover;
        self.next_failover = !failover;
        if failover {
            op("failover", json!({}))
        } else {
            op("failback", json!({"lagging": true}))
        }
    }

    fn done(&mut self, info: &Value) {
        if let Some(mirroring) = info["direction"]["mirroring"].as_bool() {
            self.next_failover = mirroring;
        }
    }
}

/// Flips `mirror.support.unclean.leader.election` of a random topic on a random cluster of the
/// mirror, each (cluster, topic) starting from the setup's value.
struct FlagFlips {
    clusters: Vec<String>,
    topics: Vec<String>,
    initial: bool,
    flags: std::collections::BTreeMap<(String, String), bool>,
}

impl Cycle for FlagFlips {
    fn next(&mut self, rng: &mut Rng) -> Invocation {
        let cluster = pick(&self.clusters, rng);
        let topic = pick(&self.topics, rng);
        let flag = self
            .flags
            .entry((cluster.clone(), topic.clone()))
            .or_insert(self.initial);
        *flag = !*flag;
        op(
            "config",
            json!({"cluster": cluster, "topic": topic,
                   "set": {tidemark_harness::broker::MIRROR_UNCLEAN_KEY: flag.to_string()}}),
        )
    }
}

/// The package of `kind`, drawing targets from `targets` (spec names the kind understands);
/// the mirror kinds act on `mirror`.
pub fn package(kind: Kind, targets: Vec<String>, mirror: Option<&MirrorSetup>) -> Package {
    let undo =
        |f: &'static str| move |info: &Value| op(f, json!({ "nodes": recorded_nodes(info) }));
    let (cycle, heal, perf): (Box<dyn Cycle>, Vec<Invocation>, Perf) = match kind {
        Kind::Partition => (
            flip_flop(
                move |rng| (op("start-partition", aimed("kind", &targets, rng)), true),
                |_| op("stop-partition", json!({})),
            ),
            Vec::new(),
            perf(
                "partition",
                &["start-partition"],
                &["stop-partition"],
                "#E9DCA0",
            ),
        ),
        Kind::Kill => (
            flip_flop(
                {
                    // Of every twenty kill turns: three bounces, five handoffs, three strands,
                    // four lapses, two last stands, three kills.
                    let mut deck = Deck::new([
                        (KillMove::Bounce, 3),
                        (KillMove::Handoff, 5),
                        (KillMove::Strand, 3),
                        (KillMove::Lapse, 4),
                        (KillMove::LastStand, 2),
                        (KillMove::Kill, 3),
                    ]);
                    move |rng| match deck.draw(rng).unwrap_or(KillMove::Kill) {
                        KillMove::Bounce => {
                            let times = rng.random_range(2..=4);
                            let v = json!({ "times": times, crate::BURST_KEY: BURST_MS });
                            (op("bounce", v), false)
                        }
                        KillMove::Handoff => {
                            (op("handoff", json!({ crate::BURST_KEY: BURST_MS })), false)
                        }
                        // No burst: clients write to the stranded leader while its cut holds.
                        KillMove::Strand => (op("strand", json!({})), true),
                        // Nor a lapse: clients write while its follower is down and behind.
                        KillMove::Lapse => (op("lapse", json!({})), true),
                        // Nor a last stand: clients write between its followers' departures.
                        KillMove::LastStand => (op("last-stand", json!({})), true),
                        KillMove::Kill => (op("kill", aimed("targets", &targets, rng)), true),
                    }
                },
                // A killed node comes back behind and catches up slowly, as on a real cluster:
                // the next fault may land while it does.
                |info: &Value| {
                    op(
                        "start",
                        json!({ "nodes": recorded_nodes(info), "catch_up": {} }),
                    )
                },
            ),
            Vec::new(),
            perf(
                "kill",
                &["kill", "strand", "lapse", "last-stand"],
                &["start"],
                "#E9A4A0",
            ),
        ),
        // An operator's roll goes round the whole cluster, stopping every leader in turn
        // (after a burst, as other faults at leaders); half of them stop after two nodes, as
        // an upgrade interrupted or a roll of a few hosts does. The roll starts its nodes again
        // itself.
        Kind::Roll => (
            flip_flop(
                |rng| {
                    let v = if rng.random_bool(0.5) {
                        json!({ crate::BURST_KEY: BURST_MS })
                    } else {
                        json!({ "count": 2 })
                    };
                    (op("roll", v), false)
                },
                undo("start"),
            ),
            Vec::new(),
            perf("rolling restart", &["roll"], &[], "#E9C4A0"),
        ),
        Kind::Pause => (
            flip_flop(
                move |rng| (op("pause", aimed("targets", &targets, rng)), true),
                // Thawed, the node is behind and catches up slowly, as a killed one does.
                |info: &Value| {
                    op(
                        "resume",
                        json!({ "nodes": recorded_nodes(info), "catch_up": {} }),
                    )
                },
            ),
            Vec::new(),
            perf("pause", &["pause"], &["resume"], "#C5A0E9"),
        ),
        Kind::Clock => (
            flip_flop(
                move |rng| {
                    let f = if rng.random_bool(0.5) {
                        "clock-skew"
                    } else {
                        "clock-strobe"
                    };
                    (op(f, json!({"targets": pick(&targets, rng)})), true)
                },
                undo("clock-reset"),
            ),
            vec![op("clock-reset", json!({}))],
            perf(
                "clock skew",
                &["clock-skew", "clock-strobe"],
                &["clock-reset"],
                "#A0E9DB",
            ),
        ),
        Kind::Loss => (
            flip_flop(
                move |rng| {
                    (
                        op("start-loss", json!({"targets": pick(&targets, rng)})),
                        true,
                    )
                },
                undo("stop-loss"),
            ),
            vec![op("stop-loss", json!({}))],
            perf("packet loss", &["start-loss"], &["stop-loss"], "#A0C8E9"),
        ),
        Kind::Corrupt => (
            flip_flop(
                move |rng| {
                    (
                        op("corrupt-file", json!({"targets": pick(&targets, rng)})),
                        true,
                    )
                },
                undo("start"),
            ),
            Vec::new(),
            perf("disk corruption", &["corrupt-file"], &["start"], "#99D98C"),
        ),
        Kind::Unclean => (
            Box::new(Repeat(op("unclean-election", json!({})))),
            Vec::new(),
            perf("unclean election", &["unclean-election"], &[], "#E9A0CF"),
        ),
        Kind::Failover => (
            Box::new(Alternate {
                next_failover: true,
            }),
            Vec::new(),
            perf("failed over", &["failover"], &["failback"], "#F2C48D"),
        ),
        Kind::MirrorConfig => (
            Box::new(FlagFlips {
                clusters: mirror
                    .map(|m| vec![m.source.clone(), m.destination.clone()])
                    .unwrap_or_default(),
                topics: mirror.map(|m| m.topics.clone()).unwrap_or_default(),
                initial: mirror.is_some_and(|m| m.unclean_support),
                flags: Default::default(),
            }),
            Vec::new(),
            perf("mirror flag", &["config"], &[], "#8DE0F2"),
        ),
        // A power loss boots its nodes again itself: nothing to undo or heal.
        Kind::Power => (
            flip_flop(
                move |rng| {
                    (
                        op("power-loss", json!({"targets": pick(&targets, rng)})),
                        false,
                    )
                },
                undo("start"),
            ),
            Vec::new(),
            perf("power loss", &["power-loss"], &[], "#B0B0B0"),
        ),
        // A failing disk, healed after its turn (a node that stopped on it is rebooted): its
        // fsyncs failing, or full.
        Kind::Disk => (
            flip_flop(
                move |rng| {
                    let mut v = aimed("targets", &targets, rng);
                    v["mode"] = json!(DiskFault::ALL.choose(rng).copied());
                    (op("disk-fault", v), true)
                },
                undo("disk-heal"),
            ),
            vec![op("disk-heal", json!({}))],
            perf("failing disk", &["disk-fault"], &["disk-heal"], "#7A6A5A"),
        ),
        // A wipe starts its nodes again itself, as a power loss does.
        Kind::Wipe => (
            flip_flop(
                move |rng| (op("wipe", aimed("targets", &targets, rng)), false),
                undo("start"),
            ),
            Vec::new(),
            perf("log dir wiped", &["wipe"], &[], "#8C8C8C"),
        ),
        // Each turns the flag the other way; where it ends is where the run leaves it.
        Kind::TieredConfig => (
            Box::new(Repeat(op("tiered-config", json!({})))),
            Vec::new(),
            perf("KIP-1023 flag turned", &["tiered-config"], &[], "#A0C4E9"),
        ),
        Kind::RemoteOutage => (
            flip_flop(
                move |rng| {
                    (
                        op("remote-outage", json!({"targets": pick(&targets, rng)})),
                        true,
                    )
                },
                undo("remote-restore"),
            ),
            vec![op("remote-restore", json!({}))],
            perf(
                "remote store outage",
                &["remote-outage"],
                &["remote-restore"],
                "#D9B38C",
            ),
        ),
    };
    Package {
        kind,
        cycle,
        heal,
        perf,
        aims: Vec::new(),
    }
}

fn perf(
    name: &'static str,
    start: &[&'static str],
    stop: &[&'static str],
    color: &'static str,
) -> Perf {
    Perf {
        name,
        start: start.to_vec(),
        stop: stop.to_vec(),
        color,
    }
}

/// How often a kind's turn comes among the disruptive kinds. Leader failovers are where
/// log-replication bugs live, so the kinds that bring them about get more shares: kills (kill,
/// bounce, handoff, strand) and partitions three, since a leader cut off from its followers while
/// clients still reach it is the failover in which the old leader goes on acknowledging and
/// serving; pauses two (the old leader wakes up still believing it leads, with requests
/// waiting). A wiped log directory three too: a replica rebuilding from the remote store is
/// where tiered storage's bugs live, and nothing else brings it about. A rolling restart, which
/// holds the turn while it goes round the cluster (11–15 s), packet loss, which rarely moves a
/// leader, and a remote-store outage, one.
fn weight(kind: Kind) -> u32 {
    match kind {
        Kind::Kill | Kind::Partition | Kind::Wipe => 3,
        Kind::Pause => 2,
        _ => 1,
    }
}

/// Whether a kind runs on its own timeline across the disruptive turns rather than taking one:
/// clock skew stops nothing, and mirror failovers and failbacks are an operator's moves, made
/// during outages as often as between them (a failover is what one does when the source is
/// down). A failback into a cluster with a replica down, cut off or lagging is where a
/// truncation that must reach every replica (KIP-1279's LMLE truncation with
/// `mirror.support.unclean.leader.election`, ULE_RECOVERY) can leave one out. Turning KIP-1023's
/// flag stops nothing either, and is an operator's move too.
fn own_timeline(kind: Kind) -> bool {
    matches!(kind, Kind::Clock | Kind::Failover | Kind::TieredConfig)
}

/// The packages, performed by the nemesis worker one op at a time (an op due while another runs
/// waits for it).
///
/// Disruptive kinds take turns, one fault in force at a time: the next kind of a shuffled deck
/// holding each kind as many times as its share ([`weight`]; Jepsen's `mix` draws with dice,
/// which in a short run repeats one kind and leaves others out) starts its fault, which lasts
/// ⅔ to 1⅓ of an interval from when it is in force (long enough to outlast failure detection),
/// then is undone, and after a calm of up to half an interval from the undoing's end the next
/// turn comes. Stacked faults mostly leave nothing available; one at a time, each fault, leader
/// failovers above all, starts from a cluster that works. Clock skew, which stops nothing,
/// mirror failovers and failbacks, and turns of KIP-1023's flag ([`own_timeline`]) run on their
/// own staggered timelines (gaps uniform in [0, 2·interval]) across them, so they land inside
/// faults as well as between them; a mirrored test's first failover comes before the first
/// disruptive turn.
pub struct Combined {
    cycles: Vec<Box<dyn Cycle>>,
    /// For each cycle: its share of the disruptive turns, or `None` for its own timeline.
    shares: Vec<Option<u32>>,
    /// The disruptive cycles, each as many times as its share.
    turns: Deck<usize>,
    /// When each own-timeline cycle is next due.
    due: Vec<Option<u64>>,
    /// When the next disruptive turn (or undo) is due, and which cycle has a fault in force.
    turn_due: Option<u64>,
    in_force: Option<usize>,
    interval: u64,
    waiting_for: Option<usize>,
    /// How long after the awaited op completes its cycle's next op (or the next turn) is due.
    gap_after: u64,
    /// Between mirrored clusters: the source and destination now (the destination is the
    /// cluster failed over from when it does not mirror), and the cluster each cycle's fault in
    /// force was stamped with.
    roles: Option<Roles>,
    stamped: Vec<Option<String>>,
    /// The cluster the awaited op leaves with no fault in force (an undoing, or a fault over
    /// once performed), if it is a disruptive one.
    undoing_on: Option<String>,
    /// The kinds whose ops are not stamped (the mirror's own name their clusters).
    kinds: Vec<Kind>,
    /// Each cycle's aims.
    aims: Vec<Vec<Aim>>,
}

/// Where the mirror stands, as the last failover or failback left it.
#[derive(Clone, Debug)]
struct Roles {
    source: String,
    destination: String,
    /// Whether the destination mirrors the source (false between a failover and its failback).
    mirroring: bool,
    /// Disruptive faults on the cluster failed over from that are over (undone, or over once
    /// performed) since the failover.
    outages_over: u32,
}

impl Combined {
    /// Combines `packages` with faults lasting `interval` nanoseconds on average.
    pub fn new(packages: Vec<Package>, interval: u64) -> Self {
        let shares: Vec<Option<u32>> = packages
            .iter()
            .map(|p| (!own_timeline(p.kind)).then(|| weight(p.kind)))
            .collect();
        let turns = Deck::new(
            shares
                .iter()
                .enumerate()
                .filter_map(|(i, share)| share.map(|w| (i, w))),
        );
        let kinds = packages.iter().map(|p| p.kind).collect();
        let aims = packages.iter().map(|p| p.aims.clone()).collect();
        let cycles: Vec<Box<dyn Cycle>> = packages.into_iter().map(|p| p.cycle).collect();
        Combined {
            due: vec![None; cycles.len()],
            stamped: vec![None; cycles.len()],
            undoing_on: None,
            shares,
            turns,
            cycles,
            turn_due: None,
            in_force: None,
            interval,
            waiting_for: None,
            gap_after: 0,
            roles: None,
            kinds,
            aims,
        }
    }

    /// Faults land on the mirror's `source` or `destination` (as failovers and failbacks move
    /// them), the undoing of each on its fault's cluster.
    pub fn between(mut self, source: &str, destination: &str) -> Self {
        self.roles = Some(Roles {
            source: source.to_string(),
            destination: destination.to_string(),
            mirroring: true,
            outages_over: 0,
        });
        self
    }

    /// Names the cluster of cycle `i`'s op `op` (`undo`: it undoes the cycle's fault in force).
    fn stamp(&mut self, i: usize, undo: bool, mut op: Invocation, rng: &mut Rng) -> Invocation {
        let Some(Roles {
            source,
            destination,
            mirroring,
            outages_over,
        }) = &self.roles
        else {
            return op;
        };
        // Failed over, the old source's first outage is what the failback waits for.
        let on_source = match (*mirroring, *outages_over) {
            (true, _) => 0.5,
            (false, 0) => 0.0,
            (false, _) => 0.25,
        };
        if self.kinds[i].mirrors() || op.value.get("cluster").is_some() {
            return op;
        }
        let cluster = match (&self.stamped[i], undo) {
            (Some(c), true) => c.clone(),
            _ => match self.aims[i].choose(rng) {
                Some(aim) => {
                    let cluster = aim.cluster(source, destination).to_string();
                    aim.apply(&mut op, &cluster);
                    cluster
                }
                None if rng.random_bool(on_source) => source.clone(),
                None => destination.clone(),
            },
        };
        if let Value::Object(m) = &mut op.value {
            m.insert("cluster".into(), json!(cluster));
        }
        self.stamped[i] = Some(cluster);
        op
    }

    /// Follows the mirror's direction through the `direction` each failover and failback
    /// records leaving (whether or not it fell short: a failback that started mirroring and
    /// timed out waiting has moved it, a failover whose stop was refused has not).
    fn follow(&mut self, op: &Op) {
        if !matches!(op.f.as_str(), "failover" | "failback") {
            return;
        }
        self.follow_direction(&op.value["direction"]);
    }

    /// Takes the roles from a recorded `direction`.
    fn follow_direction(&mut self, direction: &Value) {
        let (Some(roles), Some(source), Some(destination)) = (
            self.roles.as_mut(),
            direction["source"].as_str(),
            direction["destination"].as_str(),
        ) else {
            return;
        };
        *roles = Roles {
            source: source.to_string(),
            destination: destination.to_string(),
            mirroring: direction["mirroring"].as_bool().unwrap_or(true),
            outages_over: 0,
        };
    }

    /// Whether cycle `i` is a failback that must wait: the mirror is failed over, the cluster
    /// failed over from has not yet come back from an outage since, and there are disruptive
    /// faults to bring one.
    fn failback_waits(&self, i: usize) -> bool {
        self.kinds[i] == Kind::Failover
            && self.shares.iter().any(Option::is_some)
            && self
                .roles
                .as_ref()
                .is_some_and(|r| !r.mirroring && r.outages_over == 0)
    }

    /// The cycle whose turn it is: the one with a fault in force, else the next of the deck.
    fn turn(&mut self, rng: &mut Rng) -> Option<usize> {
        if self.in_force.is_some() {
            return self.in_force;
        }
        self.turns.draw(rng)
    }
}

impl Generator for Combined {
    fn next(&mut self, ctx: &Context, rng: &mut Rng) -> Next {
        if self.cycles.is_empty() {
            return Next::Done;
        }
        if !ctx.free.contains(&Worker::Nemesis) || self.waiting_for.is_some() {
            return Next::Pending(None);
        }
        let interval = self.interval;
        let first = self.due.iter().all(Option::is_none) && self.turn_due.is_none();
        for i in 0..self.cycles.len() {
            if self.shares[i].is_none() && self.due[i].is_none() {
                self.due[i] = Some(ctx.time + rng.random_range(0..=2 * interval));
            }
        }
        if self.turn_due.is_none() && self.shares.iter().any(Option::is_some) {
            self.turn_due = Some(ctx.time + rng.random_range(0..=interval));
        }
        // A mirrored test fails over first: every run, however short, then has a failover and
        // the faults that follow land on a mirror that has moved.
        let failover = self.kinds.iter().position(|k| *k == Kind::Failover);
        if let (true, Some(_), Some(i)) = (first, &self.roles, failover) {
            let at = ctx.time + rng.random_range(0..=interval);
            self.due[i] = Some(at);
            self.turn_due = self.turn_due.map(|t| t.max(at + 1));
        }
        let own = (0..self.cycles.len())
            .filter(|&i| !self.failback_waits(i))
            .filter_map(|i| self.due[i].map(|t| (t, i)))
            .min();
        let (time, i) = match (own, self.turn_due) {
            (Some((t, i)), Some(turn)) if t < turn => (t, i),
            (_, Some(turn)) => match self.turn(rng) {
                Some(i) => (turn, i),
                None => return Next::Done,
            },
            (Some((t, i)), None) => (t, i),
            (None, None) => return Next::Done,
        };
        let time = time.max(ctx.time);
        let undo = self.cycles[i].in_force();
        let op = self.cycles[i].next(rng);
        let op = self.stamp(i, undo, op, rng);
        let in_force = self.cycles[i].in_force();
        // An undoing, or a fault over once performed (a bounce, a handoff): its cluster is
        // back in service when the op completes.
        self.undoing_on = match (in_force, self.shares[i]) {
            (false, Some(_)) => op
                .value
                .get("cluster")
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        };
        // A fault lasts from when it is in force: a burst before it, or a slow op, must not
        // eat into it (a leader paused for less than the session timeout is never replaced).
        self.gap_after = if in_force {
            rng.random_range(2 * interval / 3..=4 * interval / 3)
        } else if self.shares[i].is_some() {
            // A short calm: a fault that lands while the last one's node is still catching up
            // (a freshly restarted follower, a new leader) is where recovery bugs show.
            rng.random_range(0..=interval / 2)
        } else {
            rng.random_range(0..=2 * interval)
        };
        if self.shares[i].is_some() {
            self.in_force = in_force.then_some(i);
        }
        self.waiting_for = Some(i);
        Next::Op(Planned {
            worker: Worker::Nemesis,
            time,
            op,
        })
    }

    fn update(&mut self, _ctx: &Context, worker: Worker, op: &Op) {
        if worker == Worker::Nemesis && op.kind == OpType::Info {
            self.follow(op);
            let mut failback_at = None;
            if let (Some(r), Some(c)) = (self.roles.as_mut(), self.undoing_on.take()) {
                if !r.mirroring && r.destination == c {
                    r.outages_over += 1;
                    // Half an interval back in service, clients not yet redirected writing to
                    // it in the leader epochs the outage moved it to, then the failback, in
                    // the calm before the next fault.
                    let at = op.time + self.interval / 2;
                    for (due, kind) in self.due.iter_mut().zip(&self.kinds) {
                        if *kind == Kind::Failover {
                            *due = Some(at);
                            failback_at = Some(at);
                        }
                    }
                }
            }
            if let Some(i) = self.waiting_for.take() {
                self.cycles[i].done(&op.value);
                let next = op.time + self.gap_after;
                if self.shares[i].is_some() {
                    self.turn_due = Some(failback_at.map_or(next, |at| next.max(at + 1)));
                } else {
                    self.due[i] = Some(next);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_harness::generator::rng;
    use tidemark_harness::interpreter::simulate;
    use tidemark_harness::op::Outcome;

    const S: u64 = 1_000_000_000;

    #[test]
    fn faults_alternate_with_their_undoing_which_names_the_recorded_nodes() {
        let mut p = package(Kind::Pause, vec!["one".into()], None);
        let mut r = rng(1);
        let first = p.cycle.next(&mut r);
        assert_eq!(first, op("pause", json!({"targets": "one"})));
        p.cycle.done(&json!({"nodes": ["n2"], "targets": "one"}));
        assert_eq!(
            p.cycle.next(&mut r),
            op("resume", json!({"nodes": ["n2"], "catch_up": {}}))
        );
        p.cycle.done(&json!({"nodes": ["n2"]}));
        assert_eq!(p.cycle.next(&mut r).f, "pause");

        let mut c = package(Kind::Clock, vec!["all".into()], None);
        let skew = c.cycle.next(&mut r);
        assert!(skew.f.starts_with("clock-"));
        c.cycle.done(&json!({"offsets_ms": {"n1": 5, "n3": -7}}));
        assert_eq!(
            c.cycle.next(&mut r),
            op("clock-reset", json!({"nodes": ["n1", "n3"]}))
        );
        assert_eq!(c.heal, vec![op("clock-reset", json!({}))]);
    }

    #[test]
    fn mirror_moves_follow_the_recorded_direction() {
        let mut c = Alternate {
            next_failover: true,
        };
        let mut r = rng(1);
        let mut moves = Vec::new();
        for mirroring in [true, false, false, true, false] {
            moves.push(c.next(&mut r).f);
            c.done(&json!({"direction": {"mirroring": mirroring}}));
        }
        // A refused failover is tried again; a failback that left it failed over too.
        assert_eq!(
            moves,
            ["failover", "failover", "failback", "failback", "failover"]
        );
    }

    #[test]
    fn kills_sometimes_bounce_hand_off_strand_lapse_or_leave_leaders_and_the_killed_come_back_catching_up(
    ) {
        let mut p = package(Kind::Kill, vec!["leaders".into()], None);
        let mut r = rng(2);
        let mut seen = std::collections::BTreeMap::new();
        for _ in 0..200 {
            let o = p.cycle.next(&mut r);
            p.cycle.done(&json!({"nodes": ["n1"]}));
            if o.f == "start" {
                // The node killed comes back catching up slowly, the cap drawn when performed.
                assert_eq!(o.value, json!({"nodes": ["n1"], "catch_up": {}}));
            }
            *seen.entry(o.f).or_insert(0) += 1;
        }
        assert!(
            ["bounce", "handoff", "strand", "lapse", "last-stand"]
                .iter()
                .all(|f| seen[*f] > 10),
            "{seen:?}"
        );
        assert!(!seen.contains_key("roll"), "{seen:?}");
        assert!(
            seen["kill"] + seen["strand"] + seen["lapse"] + seen["last-stand"] - seen["start"] <= 1,
            "{seen:?}"
        );
    }

    #[test]
    fn rolls_go_round_the_whole_cluster_or_two_nodes_and_need_no_undoing() {
        let mut p = package(Kind::Roll, Vec::new(), None);
        let mut r = rng(3);
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..100 {
            let o = p.cycle.next(&mut r);
            assert_eq!(o.f, "roll");
            assert!(!p.cycle.in_force());
            p.cycle.done(&json!({"nodes": ["n1", "n2"]}));
            *counts.entry(o.value["count"].as_u64()).or_insert(0) += 1;
        }
        // No count: every node, and every leader in turn.
        assert!(counts[&None] > 30 && counts[&Some(2)] > 30, "{counts:?}");
        assert_eq!(counts.len(), 2, "{counts:?}");
    }

    #[test]
    fn a_deck_deals_every_card_its_count_in_each_round() {
        let mut deck = Deck::new([("a", 3), ("b", 1), ("c", 2)]);
        let mut r = rng(7);
        let mut orders = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let mut round: Vec<&str> = (0..6).map(|_| deck.draw(&mut r).unwrap()).collect();
            orders.insert(round.clone());
            round.sort_unstable();
            assert_eq!(round, ["a", "a", "a", "b", "c", "c"]);
        }
        assert!(orders.len() > 5, "rounds are shuffled: {orders:?}");
        assert_eq!(Deck::<u8>::new([]).draw(&mut r), None);
    }

    /// The default kinds with their default targets, faults lasting 2 s.
    fn default_mix() -> Combined {
        let packages: Vec<Package> = crate::Kind::DEFAULT
            .iter()
            .map(|k| {
                let targets = k.default_targets().into_iter().map(String::from).collect();
                package(*k, targets, None)
            })
            .collect();
        Combined::new(packages, 2 * S)
    }

    #[tokio::test(start_paused = true)]
    async fn every_round_of_ten_turns_gives_each_default_kind_its_share() {
        let mut gen = default_mix();
        let history = simulate(&mut gen, 0, 1, 600, |_| {
            (Outcome::Info, json!({"nodes": ["n1"]}), 100_000_000)
        })
        .await;
        let faults: Vec<Kind> = history
            .iter()
            .filter(|o| o.kind == OpType::Invoke)
            .filter(|o| {
                !matches!(
                    o.f.as_str(),
                    "start" | "resume" | "stop-partition" | "stop-loss"
                )
            })
            .filter_map(|o| Kind::of_op(&o.f))
            .filter(|k| *k != Kind::Clock)
            .collect();
        assert!(faults.len() >= 30, "{}", faults.len());
        for round in faults.chunks_exact(10).take(3) {
            let count = |k: Kind| round.iter().filter(|f| **f == k).count();
            assert_eq!(
                [
                    Kind::Partition,
                    Kind::Kill,
                    Kind::Pause,
                    Kind::Loss,
                    Kind::Roll
                ]
                .map(count),
                [3, 3, 2, 1, 1],
                "{round:?}"
            );
        }
    }

    /// Whether a fault op is aimed at partition leaders: a roll of the whole cluster stops each
    /// leader in turn (and records which it led).
    fn at_leaders(o: &Invocation) -> bool {
        matches!(
            o.f.as_str(),
            "bounce" | "handoff" | "strand" | "lapse" | "last-stand"
        ) || (o.f == "roll" && o.value.get("count").is_none())
            || ["targets", "kind"]
                .iter()
                .any(|k| o.value[k].as_str().is_some_and(is_leader_target))
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_mix_aims_at_least_half_its_faults_at_leaders_after_a_burst() {
        let mut gen = default_mix();
        let history = simulate(&mut gen, 0, 1, 600, |op| {
            let value = match op.f.as_str() {
                "kill" | "pause" | "start-loss" | "clock-skew" | "clock-strobe" => {
                    json!({"nodes": ["n1"]})
                }
                _ => op.value.clone(),
            };
            (Outcome::Info, value, 100_000_000)
        })
        .await;
        let faults: Vec<Invocation> = history
            .iter()
            .filter(|o| o.kind == OpType::Invoke)
            .filter(|o| {
                matches!(
                    o.f.as_str(),
                    "start-partition"
                        | "kill"
                        | "bounce"
                        | "handoff"
                        | "strand"
                        | "lapse"
                        | "last-stand"
                        | "roll"
                        | "pause"
                        | "start-loss"
                )
            })
            .map(|o| op(&o.f, o.value.clone()))
            .collect();
        let aimed: Vec<&Invocation> = faults.iter().filter(|o| at_leaders(o)).collect();
        assert!(faults.len() > 100, "{}", faults.len());
        assert!(
            aimed.len() * 2 >= faults.len(),
            "{} of {} faults at leaders",
            aimed.len(),
            faults.len()
        );
        // Every kind that can aim at leaders does, and so do the rest of the time.
        for f in ["start-partition", "kill", "pause"] {
            let of_f = |o: &&Invocation| o.f == f;
            assert!(aimed.iter().any(of_f), "{f}");
            assert!(
                faults.iter().filter(|o| !at_leaders(o)).any(|o| o.f == f),
                "{f}"
            );
        }
        // A strand's own cut, a lapse's follower down or a last stand's departures hold for
        // seconds while clients write: they need no burst before.
        assert!(aimed
            .iter()
            .filter(|o| !matches!(o.f.as_str(), "strand" | "lapse" | "last-stand"))
            .all(|o| o.value[crate::BURST_KEY] == BURST_MS));
        assert!(faults
            .iter()
            .filter(|o| !at_leaders(o))
            .all(|o| o.value.get(crate::BURST_KEY).is_none()));
    }

    #[test]
    fn targets_without_leader_specs_are_drawn_as_before() {
        let mut p = package(Kind::Pause, vec!["one".into(), "all".into()], None);
        let mut r = rng(4);
        for _ in 0..50 {
            let o = p.cycle.next(&mut r);
            p.cycle.done(&json!({"nodes": ["n1"]}));
            assert!(
                !at_leaders(&o) && o.value.get(crate::BURST_KEY).is_none(),
                "{o:?}"
            );
        }
        let mut p = package(Kind::Pause, vec!["leader".into()], None);
        assert_eq!(
            p.cycle.next(&mut r).value,
            json!({"targets": "leader", "burst_ms": BURST_MS})
        );
    }

    #[tokio::test(start_paused = true)]
    async fn combined_packages_take_turns_on_one_worker_with_one_disruptive_fault_at_a_time() {
        let packages = vec![
            package(Kind::Partition, vec!["one".into()], None),
            package(Kind::Pause, vec!["one".into()], None),
            package(Kind::Clock, vec!["one".into()], None),
        ];
        let mut gen = Combined::new(packages, 2 * S);
        let history = simulate(&mut gen, 0, 1, 40, |op| {
            let value = match op.f.as_str() {
                "pause" => json!({"nodes": ["n1"]}),
                _ => op.value.clone(),
            };
            (Outcome::Info, value, 100_000_000)
        })
        .await;
        let invokes: Vec<&Op> = history
            .iter()
            .filter(|o| o.kind == OpType::Invoke)
            .collect();
        assert_eq!(invokes.len(), 40);
        assert!(invokes
            .iter()
            .all(|o| o.process == tidemark_harness::op::Process::Nemesis));
        // One op at a time: every invoke follows the previous op's completion.
        for w in history.windows(2) {
            assert_ne!(w[0].kind, w[1].kind, "{:?}", w);
        }
        let fs: Vec<&str> = invokes.iter().map(|o| o.f.as_str()).collect();
        let starts = fs.iter().position(|f| *f == "start-partition").unwrap();
        let stops = fs.iter().position(|f| *f == "stop-partition").unwrap();
        assert!(starts < stops);
        // Each kind alternates within itself.
        let pauses: Vec<&&str> = fs
            .iter()
            .filter(|f| **f == "pause" || **f == "resume")
            .collect();
        for w in pauses.windows(2) {
            assert_ne!(w[0], w[1]);
        }
        let resumes: Vec<&&Op> = invokes.iter().filter(|o| o.f == "resume").collect();
        assert!(resumes
            .iter()
            .all(|o| o.value == json!({"nodes": ["n1"], "catch_up": {}})));
        // A partition and a pause are never in force together; clock skew may overlap either.
        let (mut cut, mut paused, mut skewed_while_disrupted) = (false, false, 0);
        for f in &fs {
            match *f {
                "start-partition" => cut = true,
                "stop-partition" => cut = false,
                "pause" => paused = true,
                "resume" => paused = false,
                "clock-skew" | "clock-strobe" if cut || paused => skewed_while_disrupted += 1,
                _ => {}
            }
            assert!(!(cut && paused), "{fs:?}");
        }
        assert!(skewed_while_disrupted > 0, "{fs:?}");
        let end = invokes.last().unwrap().time;
        assert!(end > 10 * S && end < 150 * S, "{end}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fault_lasts_from_when_it_is_in_force_however_long_it_took_to_start() {
        let mut gen = Combined::new(vec![package(Kind::Pause, vec!["one".into()], None)], 2 * S);
        // Each pause takes 3 s to be in force (a long burst before it), more than the 1⅓–2⅔ s
        // it then lasts.
        let history = simulate(&mut gen, 0, 1, 20, |op| {
            let (value, latency) = match op.f.as_str() {
                "pause" => (json!({"nodes": ["n1"]}), 3 * S),
                _ => (op.value.clone(), S / 10),
            };
            (Outcome::Info, value, latency)
        })
        .await;
        let mut in_force_at = None;
        let mut held = Vec::new();
        for o in &history {
            match (o.f.as_str(), o.kind) {
                ("pause", OpType::Info) => in_force_at = Some(o.time),
                ("resume", OpType::Invoke) => held.push(o.time - in_force_at.take().unwrap()),
                _ => {}
            }
        }
        assert!(held.len() >= 5, "{held:?}");
        assert!(
            held.iter().all(|h| (4 * S / 3..=8 * S / 3).contains(h)),
            "{held:?}"
        );
    }

    /// `kind`'s faults and mirror moves between clusters a and b, `ops` of them, performed as the
    /// nemesis does: failovers and failbacks resolved against the direction it keeps and
    /// recording it, each fault on its cluster recording node x1.
    async fn simulate_mirrored(kind: Kind, ops: usize) -> Vec<Op> {
        let setup = MirrorSetup::new("a", "b", vec!["t0".into()]);
        let packages = vec![
            package(kind, vec!["one".into()], Some(&setup)),
            package(Kind::Failover, Vec::new(), Some(&setup)),
        ];
        let mut gen = Combined::new(packages, 2 * S).between("a", "b");
        let mut source = "a".to_string();
        simulate(&mut gen, 0, 3, ops, move |op| {
            let other = if source == "a" { "b" } else { "a" };
            let value = match op.f.as_str() {
                "pause" | "kill" => json!({"nodes": ["x1"], "cluster": op.value["cluster"]}),
                "failover" => {
                    let v = json!({"from": source, "to": other, "direction":
                                   {"source": other, "destination": source, "mirroring": false}});
                    source = other.to_string();
                    v
                }
                "failback" => json!({"from": source, "to": other, "direction":
                                     {"source": source, "destination": other, "mirroring": true}}),
                _ => op.value.clone(),
            };
            (Outcome::Info, value, 100_000_000)
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn between_mirrored_clusters_faults_land_on_either_moves_land_inside_them_and_failover_comes_first(
    ) {
        let history = simulate_mirrored(Kind::Pause, 60).await;
        let invokes: Vec<&Op> = history
            .iter()
            .filter(|o| o.kind == OpType::Invoke)
            .collect();
        assert_eq!(invokes[0].f, "failover");
        let mut clusters = std::collections::BTreeSet::new();
        let mut paused_on = None;
        let mut moved_while_paused = 0;
        for o in &invokes {
            match o.f.as_str() {
                "failover" | "failback" => {
                    assert!(o.value.get("cluster").is_none(), "{o:?}");
                    moved_while_paused += usize::from(paused_on.is_some());
                    if o.f == "failback" {
                        assert_eq!(o.value["lagging"], true, "{o:?}");
                    }
                }
                "pause" => {
                    let c = o.value["cluster"].as_str().unwrap().to_string();
                    clusters.insert(c.clone());
                    paused_on = Some(c);
                }
                "resume" => assert_eq!(
                    o.value["cluster"].as_str().map(String::from),
                    paused_on.take(),
                    "{o:?}"
                ),
                other => panic!("{other}"),
            }
        }
        assert_eq!(clusters.len(), 2, "{clusters:?}");
        assert!(invokes.iter().any(|o| o.f == "failback"));
        // Mirror moves run on their own timeline: some land while a fault is in force.
        assert!(moved_while_paused > 0, "{invokes:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failback_waits_until_the_cluster_failed_over_from_came_back_from_an_outage() {
        let history = simulate_mirrored(Kind::Kill, 120).await;
        // After each failover, the failback comes half an interval after the cluster failed
        // over from is back from a fault (a kill undone, or a bounce or handoff over), before
        // any other fault starts.
        let (mut failed_over_from, mut recovered, mut failbacks) = (None, None, 0);
        for o in &history {
            match (o.kind, o.f.as_str()) {
                (OpType::Info, "failover") => {
                    failed_over_from = o.value["from"].as_str().map(String::from);
                    recovered = None;
                }
                (OpType::Info, "start" | "bounce" | "handoff" | "roll")
                    if o.value["cluster"].as_str() == failed_over_from.as_deref() =>
                {
                    recovered = Some(o.time);
                }
                (OpType::Invoke, "kill" | "bounce" | "handoff" | "roll") => {
                    assert!(recovered.is_none(), "a fault before the failback: {o:?}");
                }
                (OpType::Invoke, "failback") => {
                    let back = recovered.take().unwrap_or_else(|| {
                        panic!("a failback before {failed_over_from:?} recovered: {history:?}")
                    });
                    assert!(o.time >= back + S, "{o:?} {back}");
                    failbacks += 1;
                    failed_over_from = None;
                }
                _ => {}
            }
        }
        assert!(failbacks >= 2, "{failbacks} failbacks in {history:?}");
    }

    #[test]
    fn between_a_failover_and_its_failback_most_faults_land_on_the_cluster_failed_over_from() {
        let setup = MirrorSetup::new("a", "b", vec!["t0".into()]);
        let packages = vec![package(Kind::Pause, vec!["one".into()], Some(&setup))];
        let mut gen = Combined::new(packages, 2 * S).between("a", "b");
        let mut r = rng(3);
        let mut share_on = |gen: &mut Combined, cluster: &str| {
            let on = (0..2000)
                .filter(|_| {
                    gen.stamped[0] = None;
                    let pause = gen.stamp(0, false, op("pause", json!({})), &mut r);
                    pause.value["cluster"] == cluster
                })
                .count();
            on as f64 / 2000.0
        };
        let mirroring = share_on(&mut gen, "a");
        assert!((0.45..0.55).contains(&mirroring), "{mirroring}");
        gen.follow_direction(&json!({"source": "b", "destination": "a", "mirroring": false}));
        assert_eq!(
            share_on(&mut gen, "a"),
            1.0,
            "the first outage is the old source's"
        );
        gen.roles.as_mut().unwrap().outages_over = 1;
        let failed_over = share_on(&mut gen, "a");
        assert!((0.7..0.8).contains(&failed_over), "{failed_over}");
        gen.follow_direction(&json!({"source": "b", "destination": "a", "mirroring": true}));
        let back = share_on(&mut gen, "a");
        assert!((0.45..0.55).contains(&back), "{back}");
    }

    #[tokio::test(start_paused = true)]
    async fn aimed_faults_land_on_the_role_as_the_recorded_direction_has_it() {
        let setup = MirrorSetup::new("a", "b", vec!["t0".into()]);
        let mut pause = package(Kind::Pause, vec!["one".into()], Some(&setup));
        pause.aims = vec![Aim::parse("destination-leaders").unwrap()];
        let packages = vec![pause, package(Kind::Failover, Vec::new(), Some(&setup))];
        let mut gen = Combined::new(packages, 2 * S).between("a", "b");
        // Every second failover is refused and records the direction unchanged: the aims must
        // follow what was recorded, not what was asked.
        let (mut source, mut refused) = ("a".to_string(), false);
        let history = simulate(&mut gen, 0, 3, 80, move |op| {
            let other = if source == "a" { "b" } else { "a" };
            let value = match op.f.as_str() {
                "pause" => json!({"nodes": ["x1"], "cluster": op.value["cluster"]}),
                "failover" if refused => {
                    refused = false;
                    json!({"from": source, "to": other,
                           "direction": {"source": source, "destination": other}})
                }
                "failover" => {
                    refused = true;
                    let v = json!({"from": source, "to": other,
                                   "direction": {"source": other, "destination": source}});
                    source = other.to_string();
                    v
                }
                "failback" => json!({"from": source, "to": other,
                                     "direction": {"source": source, "destination": other}}),
                _ => op.value.clone(),
            };
            (Outcome::Info, value, 100_000_000)
        })
        .await;
        let mut destination = "b".to_string();
        let mut aimed = std::collections::BTreeSet::new();
        for o in history.iter().filter(|o| o.kind == OpType::Info) {
            let d = &o.value["direction"];
            if let Some(dst) = d["destination"].as_str() {
                destination = dst.to_string();
            }
            if o.f == "pause" {
                assert_eq!(o.value["cluster"], destination.as_str(), "{o:?}");
            }
        }
        for o in history.iter().filter(|o| o.kind == OpType::Invoke) {
            match o.f.as_str() {
                "pause" => {
                    assert_eq!(o.value["targets"], "leaders", "{o:?}");
                    assert_eq!(o.value["role"], "destination-leaders", "{o:?}");
                    aimed.insert(o.value["cluster"].as_str().unwrap().to_string());
                }
                "resume" => assert!(o.value.get("role").is_none(), "{o:?}"),
                _ => {}
            }
        }
        // Failovers and failbacks moved the destination both ways during the run.
        assert_eq!(aimed.len(), 2, "{aimed:?}");
    }
}
