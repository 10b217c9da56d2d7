//! The ack-below-min-isr check. An acks=all send is answered once every replica in the ISR
//! holds its records, and Kafka refuses it (`NOT_ENOUGH_REPLICAS`) while the ISR is smaller
//! than `min.insync.replicas`. A follower holds only what it fetched, and it fetches over the
//! network from a node that has the records. So when, from a send's invocation to its
//! acknowledgement, the acknowledging node could exchange nothing with enough of its cluster's
//! other brokers to make up `min.insync.replicas`, the acknowledgement is proven wrong by the
//! history alone: the records were written after the invocation, and no other replica could
//! have fetched them before the answer.
//!
//! What cuts two brokers apart is read from the nemesis's own record, conservatively: a
//! partition's grudge from its `start-partition` completing until the next `stop-partition` is
//! invoked (a grudge on ports only when they include both brokers' client listeners, where
//! followers fetch), a `kill` from its completion until a `start` naming the node is invoked, a
//! `pause` until a `resume` naming it is, and a `strand`'s cut of its leader from every other
//! broker: it records when its last cut began and how long the op took, which with the op's
//! own invocation and completion times bound when the cut surely held, so the
//! acknowledgements that complete while a strand is under way are kept until it completes; and
//! likewise a `last-stand`'s leader from the moment its last follower had left (stopped, lost
//! power or cut off from every other broker) to its kill, when those followers were every other
//! broker of its cluster.
//! Other faults that stop and start nodes themselves (rolls, handoffs, power losses, ...) are
//! not read, and since any of them may start a node the record has down or paused, none is
//! held stopped past such a fault's invocation. A node that answers a client is running,
//! whatever the record says. Replicas are the brokers the final replica states list for the
//! partition when they name at least the test's replication factor of them, the acknowledging
//! node among them (records flow only between a partition's replicas; a cluster of more brokers
//! than the replication factor keeps most of them out of it; a node whose state could not be
//! read is listed for every partition), else every broker of the node's cluster; and reach is
//! transitive: a broker that could fetch from one that could have the records could have them
//! too.

use rustc_hash::FxHashMap;
use serde::Deserialize;
use serde_json::Value;

use super::event::{Leaving, StandBody};

/// The nemesis ops [`Reach::nemesis`] reads.
pub(super) const READ: [&str; 8] = [
    "start-partition",
    "stop-partition",
    "kill",
    "pause",
    "start",
    "resume",
    "strand",
    "last-stand",
];

/// Ops that start no broker process; any other op not read here may start a node the record has
/// down or paused (a power loss or a wipe boots its nodes, a roll restarts them, a disk heal
/// reboots or starts the ones that stopped). A failing disk may stop a broker, never start one.
const LEAVE_PROCESSES: [&str; 6] = [
    "clock-skew",
    "clock-strobe",
    "clock-reset",
    "start-loss",
    "stop-loss",
    "disk-fault",
];

/// A broker as `test.json` lists it.
#[derive(Debug, Deserialize)]
struct NodeEntry {
    name: String,
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    role: Option<String>,
    /// Its client listener's port (tests before 2026-12-06 did not record it).
    #[serde(default)]
    port: Option<u16>,
}

/// The parts of a `start-partition` completion read here.
#[derive(Debug, Deserialize)]
struct CutBody {
    #[serde(default)]
    grudge: FxHashMap<String, Vec<String>>,
    #[serde(default)]
    ports: Option<Vec<u16>>,
}

/// The nodes a `kill`, `pause`, `start` or `resume` names; absent: every node.
#[derive(Debug, Deserialize)]
struct NodesBody {
    #[serde(default)]
    nodes: Option<Vec<String>>,
}

/// The parts of a `strand` completion that bound when its cut held.
#[derive(Debug, Deserialize)]
struct StrandBody {
    #[serde(default)]
    killed: Option<String>,
    #[serde(default)]
    ports: Option<Vec<u16>>,
    #[serde(default)]
    cut_ms: Option<u64>,
    #[serde(default)]
    cut_from_ms: Option<u64>,
    #[serde(default)]
    elapsed_ms: Option<u64>,
}

/// An acknowledgement completed while a strand was under way, with what to report of it.
#[derive(Debug)]
struct HeldAck {
    node: usize,
    /// Nanoseconds since the test began: the send's invocation and its acknowledgement.
    invoked_at: u64,
    done_at: u64,
    min_insync: u64,
    what: Value,
}

/// An acknowledgement its node could not have shared with enough replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Unshared {
    /// The brokers that could hold the records (the acknowledging node among them).
    pub reachable: Vec<String>,
    /// Every other broker of the cluster, and the op index since which it was cut off.
    pub cut_off: Vec<(String, u64)>,
}

/// Which brokers could exchange records, as the faults recorded so far left them.
#[derive(Debug, Default)]
pub(super) struct Reach {
    names: Vec<String>,
    clusters: Vec<String>,
    ports: Vec<Option<u16>>,
    ids: FxHashMap<String, usize>,
    /// Per pair (row-major, both orders kept equal): cut by a partition's grudge.
    cut: Vec<bool>,
    down: Vec<bool>,
    paused: Vec<bool>,
    /// Per pair: the op index since which the two could exchange nothing, while they cannot.
    apart_since: Vec<Option<u64>>,
    /// Some pair is apart now.
    any_apart: bool,
    /// The strand or last stand under way: its invocation's op index and time.
    strand: Option<(u64, u64)>,
    held: Vec<HeldAck>,
    /// Per topic and partition: the brokers holding a replica of it, as bits.
    replicas: FxHashMap<String, FxHashMap<i64, u64>>,
    /// `default_replication_factor` of the test's broker config: fewer replicas listed for a
    /// partition are a partial list.
    replication_factor: Option<u32>,
}

const MS: u64 = 1_000_000;

/// Most brokers a test may have for its acknowledgements to be judged (one bit each).
const MAX_BROKERS: usize = 64;

/// When a state an op brought about surely held, in history time: it began `from_ms` after the
/// op started and lasted `held_ms`; the op, invoked at `invoked` and completed at `done`, started
/// no earlier than its invocation and took `elapsed_ms` up to no later than its completion. So
/// from `elapsed_ms - from_ms` before the completion (a millisecond more, for the rounding down
/// of `from_ms`) to `from_ms + held_ms` after the invocation.
fn bounds((invoked, done): (u64, u64), from_ms: u64, held_ms: u64, elapsed_ms: u64) -> (u64, u64) {
    let from = (done + from_ms * MS + MS).saturating_sub(elapsed_ms * MS);
    (from, invoked + (from_ms + held_ms) * MS)
}

impl Reach {
    /// The brokers of `test.json`'s `nodes` (dedicated controllers hold no replicas).
    pub fn from_test(test: &Value) -> Self {
        let entries: Vec<NodeEntry> = test
            .get("nodes")
            .and_then(|n| Vec::<NodeEntry>::deserialize(n).ok())
            .unwrap_or_default();
        let mut brokers: Vec<NodeEntry> = entries
            .into_iter()
            .filter(|e| e.role.as_deref() != Some("controller"))
            .collect();
        if brokers.len() > MAX_BROKERS {
            brokers.clear();
        }
        let n = brokers.len();
        let mut reach = Reach {
            cut: vec![false; n * n],
            down: vec![false; n],
            paused: vec![false; n],
            apart_since: vec![None; n * n],
            ..Reach::default()
        };
        reach.replication_factor = test
            .pointer("/broker/config/default_replication_factor")
            .and_then(Value::as_u64)
            .and_then(|f| u32::try_from(f).ok());
        for (i, b) in brokers.into_iter().enumerate() {
            reach.ids.insert(b.name.clone(), i);
            reach.names.push(b.name);
            reach.clusters.push(b.cluster);
            reach.ports.push(b.port);
        }
        reach
    }

    /// Takes each partition's replicas from the final replica states (a replica whose dump
    /// failed is one all the same).
    pub fn learn_replicas(&mut self, states: &[crate::ReplicaState]) {
        for s in states {
            if let Some(&i) = self.ids.get(&s.node) {
                *self
                    .replicas
                    .entry(s.topic.clone())
                    .or_default()
                    .entry(s.partition)
                    .or_default() |= 1 << i;
            }
        }
    }

    fn pair(&self, a: usize, b: usize) -> usize {
        a * self.names.len() + b
    }

    /// The brokers `nodes` names (absent: all), skipping names that are not brokers.
    fn named(&self, nodes: Option<Vec<String>>) -> Vec<usize> {
        match nodes {
            None => (0..self.names.len()).collect(),
            Some(list) => list
                .iter()
                .filter_map(|n| self.ids.get(n).copied())
                .collect(),
        }
    }

    /// Takes in a nemesis op at op `index` and `time` (`invoke`: its invocation, else its
    /// completion; `failed`: it recorded an error). A strand's completion returns what it
    /// proves of the acknowledgements held while it was under way: each one's report, and
    /// why.
    pub fn nemesis(
        &mut self,
        (index, time): (u64, u64),
        f: &str,
        invoke: bool,
        failed: bool,
        value: &Value,
    ) -> Result<Vec<(Value, Unshared)>, String> {
        match (f, invoke) {
            ("strand", true) => {
                self.strand = Some((index, time));
                return Ok(Vec::new());
            }
            ("strand", false) => {
                let body = StrandBody::deserialize(value)
                    .map_err(|e| format!("malformed strand value: {e}"))?;
                return Ok(self.strand_done(time, body));
            }
            // It starts again only the followers it stopped, which were running before.
            ("last-stand", true) => {
                self.strand = Some((index, time));
                return Ok(Vec::new());
            }
            ("last-stand", false) => {
                let body = StandBody::deserialize(value)
                    .map_err(|e| format!("malformed last-stand value: {e}"))?;
                return Ok(self.last_stand_done(time, body));
            }
            ("start-partition", false) if !failed => {
                let body = CutBody::deserialize(value)
                    .map_err(|e| format!("malformed start-partition value: {e}"))?;
                for (a, froms) in &body.grudge {
                    let Some(&a) = self.ids.get(a) else { continue };
                    for b in froms.iter().filter_map(|b| self.ids.get(b).copied()) {
                        if self.cuts_fetches(body.ports.as_deref(), a, b) {
                            let (ab, ba) = (self.pair(a, b), self.pair(b, a));
                            self.cut[ab] = true;
                            self.cut[ba] = true;
                        }
                    }
                }
            }
            ("stop-partition", true) => self.cut.iter_mut().for_each(|c| *c = false),
            ("kill" | "pause", false) => {
                let body = NodesBody::deserialize(value)
                    .map_err(|e| format!("malformed {f} value: {e}"))?;
                // The completion names the nodes it succeeded on; none named, none known.
                let flags = if f == "kill" {
                    &mut self.down
                } else {
                    &mut self.paused
                };
                for n in body.nodes.unwrap_or_default() {
                    if let Some(&i) = self.ids.get(&n) {
                        flags[i] = true;
                    }
                }
            }
            ("start" | "resume", true) => {
                let body = NodesBody::deserialize(value)
                    .map_err(|e| format!("malformed {f} value: {e}"))?;
                for i in self.named(body.nodes) {
                    if f == "start" {
                        self.down[i] = false;
                    } else {
                        self.paused[i] = false;
                    }
                }
            }
            _ => return Ok(Vec::new()),
        }
        self.settle(index);
        Ok(Vec::new())
    }

    /// Keeps an acknowledgement by `node` of a send invoked at `invoked_at` and answered at
    /// `done_at`, under `min_insync`, while a strand or last stand is under way; `what` is its
    /// report.
    pub fn hold(
        &mut self,
        node: &str,
        (invoked_at, done_at): (u64, u64),
        min_insync: u64,
        what: impl FnOnce() -> Value,
    ) {
        if let (Some(_), Some(&node)) = (self.strand, self.ids.get(node)) {
            self.held.push(HeldAck {
                node,
                invoked_at,
                done_at,
                min_insync,
                what: what(),
            });
        }
    }

    /// A strand completed at `time`: the held acknowledgements by its leader that fall within
    /// the time its cut surely held ([`bounds`]: it began `cut_from_ms` after the op started and
    /// held `cut_ms`), when the cut kept every other broker of the cluster from fetching.
    fn strand_done(&mut self, time: u64, body: StrandBody) -> Vec<(Value, Unshared)> {
        let held = std::mem::take(&mut self.held);
        let Some((invoke_index, invoked)) = self.strand.take() else {
            return Vec::new();
        };
        let (Some(leader), Some(cut_ms), Some(from_ms), Some(elapsed_ms)) = (
            body.killed.as_ref().and_then(|k| self.ids.get(k).copied()),
            body.cut_ms,
            body.cut_from_ms,
            body.elapsed_ms,
        ) else {
            return Vec::new();
        };
        let others = self.others(leader);
        if !others
            .iter()
            .all(|&o| self.cuts_fetches(body.ports.as_deref(), leader, o))
        {
            return Vec::new();
        }
        let window = bounds((invoked, time), from_ms, cut_ms, elapsed_ms);
        self.alone(held, leader, window, invoke_index)
    }

    /// A last stand completed at `time`: the held acknowledgements by its leader within the
    /// time it surely stood alone, when the followers that left were every other broker of its
    /// cluster. Its last follower was gone `alone_from_ms` after the op started, and the leader
    /// was killed `alone_ms` later; bounded as a strand's cut is.
    fn last_stand_done(&mut self, time: u64, body: StandBody) -> Vec<(Value, Unshared)> {
        let held = std::mem::take(&mut self.held);
        let Some((invoke_index, invoked)) = self.strand.take() else {
            return Vec::new();
        };
        let (Some(leader), Some(from_ms), Some(alone_ms), Some(elapsed_ms)) = (
            body.killed.as_ref().and_then(|k| self.ids.get(k).copied()),
            body.alone_from_ms,
            body.alone_ms,
            body.elapsed_ms,
        ) else {
            return Vec::new();
        };
        let gone = |o: usize| {
            body.left.iter().any(|d| {
                self.ids.get(&d.node) == Some(&o)
                    && (d.how.stopped()
                        || d.how == Leaving::Cut
                            && self.cuts_fetches(body.ports.as_deref(), leader, o))
            })
        };
        if !self.others(leader).into_iter().all(gone) {
            return Vec::new();
        }
        let window = bounds((invoked, time), from_ms, alone_ms, elapsed_ms);
        self.alone(held, leader, window, invoke_index)
    }

    /// Every other broker of `leader`'s cluster.
    fn others(&self, leader: usize) -> Vec<usize> {
        (0..self.names.len())
            .filter(|&i| i != leader && self.clusters[i] == self.clusters[leader])
            .collect()
    }

    /// The `held` acknowledgements by `leader` invoked and answered within `(from, until)`,
    /// while it could exchange nothing with any other broker of its cluster, since the op at
    /// `invoke_index`.
    fn alone(
        &self,
        held: Vec<HeldAck>,
        leader: usize,
        (from, until): (u64, u64),
        invoke_index: u64,
    ) -> Vec<(Value, Unshared)> {
        let others = self.others(leader);
        held.into_iter()
            .filter(|h| h.node == leader && h.min_insync > 1)
            .filter(|h| from <= h.invoked_at && h.done_at <= until)
            .map(|h| {
                let unshared = Unshared {
                    reachable: vec![self.names[leader].clone()],
                    cut_off: others
                        .iter()
                        .map(|&o| (self.names[o].clone(), invoke_index))
                        .collect(),
                };
                (h.what, unshared)
            })
            .collect()
    }

    /// Whether a grudge between `a` and `b` on `ports` (absent: every port) stops them
    /// fetching from each other: both listeners' ports must be among them.
    fn cuts_fetches(&self, ports: Option<&[u16]>, a: usize, b: usize) -> bool {
        match ports {
            None => true,
            Some(ports) => [a, b]
                .iter()
                .all(|&i| self.ports[i].is_some_and(|p| ports.contains(&p))),
        }
    }

    /// The invocation of a nemesis op `f` not read here, at op `index`: unless it leaves the
    /// processes as they are, no node is known to be down or paused any more.
    pub fn other_fault(&mut self, index: u64, f: &str) {
        let stopped = self.down.iter().chain(&self.paused).any(|s| *s);
        if stopped && !LEAVE_PROCESSES.contains(&f) {
            self.down.iter_mut().for_each(|d| *d = false);
            self.paused.iter_mut().for_each(|p| *p = false);
            self.settle(index);
        }
    }

    /// A client op answered by `node` at op `index`: it is running.
    pub fn answered(&mut self, node: &str, index: u64) {
        // A stopped node leaves every pair it is in apart: nothing to look up otherwise.
        if !self.any_apart {
            return;
        }
        if let Some(&i) = self.ids.get(node) {
            if self.down[i] || self.paused[i] {
                self.down[i] = false;
                self.paused[i] = false;
                self.settle(index);
            }
        }
    }

    /// Whether an acknowledgement now could be judged: some brokers are apart, or a strand or
    /// last stand is under way.
    pub fn judges(&self) -> bool {
        self.any_apart || self.strand.is_some()
    }

    /// Brings each pair's `apart_since` up to date at op `index`.
    fn settle(&mut self, index: u64) {
        let n = self.names.len();
        for a in 0..n {
            for b in 0..n {
                let ab = self.pair(a, b);
                let stopped = |i: usize| self.down[i] || self.paused[i];
                let apart = a != b && (self.cut[ab] || stopped(a) || stopped(b));
                self.apart_since[ab] = match (apart, self.apart_since[ab]) {
                    (true, Some(since)) => Some(since),
                    (true, None) => Some(index),
                    (false, _) => None,
                };
            }
        }
        self.any_apart = self.apart_since.iter().any(Option::is_some);
    }

    /// For a send to `topic`/`partition` invoked at op `invoked` and acknowledged now by
    /// `node`: what proves the acknowledgement held fewer than `min_insync` replicas, if
    /// anything does.
    pub fn unshared(
        &self,
        node: &str,
        (topic, partition): (&str, i64),
        invoked: u64,
        min_insync: u64,
    ) -> Option<Unshared> {
        let &acker = self.ids.get(node)?;
        let n = self.names.len();
        // Replica states that leave out the acknowledging node, or name fewer replicas than
        // the replication factor, say nothing of this partition.
        let replicas = self
            .replicas
            .get(topic)
            .and_then(|p| p.get(&partition))
            .copied()
            .filter(|bits| bits & (1 << acker) != 0)
            .filter(|bits| {
                self.replication_factor
                    .is_some_and(|f| bits.count_ones() >= f)
            });
        let peer = |i: usize| {
            self.clusters[i] == self.clusters[acker]
                && replicas.is_none_or(|bits| bits & (1 << i) != 0)
        };
        let apart = |a: usize, b: usize| {
            self.apart_since[self.pair(a, b)].is_some_and(|since| since < invoked)
        };
        // The brokers that could hold the records, as bits (at most MAX_BROKERS), grown until
        // they are enough or nothing more is reached: most acknowledgements stop at the first
        // follower.
        let mut holders: u64 = 1 << acker;
        let mut grew = true;
        while grew && u64::from(holders.count_ones()) < min_insync {
            grew = false;
            for p in 0..n {
                let held = holders;
                if held & (1 << p) == 0
                    && peer(p)
                    && (0..n).any(|h| held & (1 << h) != 0 && !apart(h, p))
                {
                    holders |= 1 << p;
                    grew = true;
                }
            }
        }
        if u64::from(holders.count_ones()) >= min_insync {
            return None;
        }
        let held = |i: usize| holders & (1 << i) != 0;
        let cut_off = (0..n)
            .filter(|&p| peer(p) && !held(p))
            .map(|p| {
                let since = self.apart_since[self.pair(acker, p)].unwrap_or(invoked);
                (self.names[p].clone(), since)
            })
            .collect();
        Some(Unshared {
            reachable: (0..n)
                .filter(|&h| held(h))
                .map(|h| self.names[h].clone())
                .collect(),
            cut_off,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The partition every acknowledgement here is of.
    const T: (&str, i64) = ("t", 0);

    /// `r` takes in the completion of fault `f` at op `index`.
    fn done(r: &mut Reach, index: u64, f: &str, value: Value) {
        r.nemesis((index, 0), f, false, false, &value).unwrap();
    }

    /// `r` takes in the invocation of `f` at op `index`.
    fn invoked(r: &mut Reach, index: u64, f: &str, value: Value) {
        r.nemesis((index, 0), f, true, false, &value).unwrap();
    }

    fn three() -> Reach {
        Reach::from_test(&json!({"nodes": [
            {"name": "n1", "cluster": "a", "port": 9092},
            {"name": "n2", "cluster": "a", "port": 9092},
            {"name": "n3", "cluster": "a", "port": 9092},
        ]}))
    }

    fn isolate_n1(r: &mut Reach, index: u64, ports: Option<Vec<u16>>) {
        let mut v = json!({"grudge": {"n1": ["n2", "n3"], "n2": ["n1"], "n3": ["n1"]}});
        if let Some(p) = ports {
            v["ports"] = json!(p);
        }
        done(r, index, "start-partition", v);
    }

    #[test]
    fn a_leader_cut_off_from_both_followers_shares_with_none() {
        let mut r = three();
        isolate_n1(&mut r, 10, Some(vec![9092]));
        let u = r.unshared("n1", T, 11, 2).expect("cut off");
        assert_eq!(u.reachable, ["n1"]);
        assert_eq!(u.cut_off, [("n2".to_string(), 10), ("n3".to_string(), 10)]);
        // Invoked before the cut was in force: its records may have been fetched.
        assert_eq!(r.unshared("n1", T, 9, 2), None);
        // With min.insync.replicas 1 the leader alone is enough.
        assert_eq!(r.unshared("n1", T, 11, 1), None);
        // The followers still reach each other, and not the leader.
        assert_eq!(r.unshared("n2", T, 11, 2), None);
    }

    #[test]
    fn a_heal_invoked_or_a_cut_on_other_ports_lets_records_through() {
        let mut r = three();
        isolate_n1(&mut r, 10, Some(vec![9093]));
        assert_eq!(r.unshared("n1", T, 11, 2), None);
        isolate_n1(&mut r, 12, None);
        invoked(&mut r, 20, "stop-partition", json!({}));
        assert_eq!(r.unshared("n1", T, 13, 2), None);
        // A start-partition that recorded an error is not trusted.
        r.nemesis(
            (21, 0),
            "start-partition",
            false,
            true,
            &json!({"grudge": {"n1": ["n2", "n3"]}}),
        )
        .unwrap();
        assert_eq!(r.unshared("n1", T, 22, 2), None);
    }

    #[test]
    fn killed_and_paused_followers_hold_nothing_until_started() {
        let mut r = three();
        done(&mut r, 5, "kill", json!({"nodes": ["n2"]}));
        done(&mut r, 6, "pause", json!({"nodes": ["n3"]}));
        let u = r.unshared("n1", T, 7, 2).expect("both followers stopped");
        assert_eq!(u.cut_off, [("n2".to_string(), 5), ("n3".to_string(), 6)]);
        invoked(&mut r, 8, "resume", json!({}));
        assert_eq!(r.unshared("n1", T, 7, 2), None);
        // Min ISR 3 needs n2 too, which is still down.
        assert!(r.unshared("n1", T, 9, 3).is_some());
        invoked(&mut r, 10, "start", json!({"nodes": ["n2"]}));
        assert_eq!(r.unshared("n1", T, 11, 3), None);
    }

    #[test]
    fn a_fault_that_may_start_nodes_ends_what_kills_and_pauses_left_stopped() {
        let mut r = three();
        done(&mut r, 5, "kill", json!({"nodes": ["n2", "n3"]}));
        r.other_fault(6, "clock-skew");
        r.other_fault(6, "disk-fault");
        assert!(r.unshared("n1", T, 7, 2).is_some());
        r.other_fault(8, "power-loss");
        assert_eq!(r.unshared("n1", T, 9, 2), None);
    }

    #[test]
    fn a_node_that_answers_a_client_is_running() {
        let mut r = three();
        done(&mut r, 5, "kill", json!({"nodes": ["n2", "n3"]}));
        r.answered("n3", 6);
        assert_eq!(r.unshared("n1", T, 7, 2), None);
    }

    #[test]
    fn reach_is_transitive_and_stays_within_the_cluster() {
        // n1 reaches only n2, n2 reaches n3: a bridge leaves three holders.
        let mut r = three();
        done(
            &mut r,
            1,
            "start-partition",
            json!({"grudge": {"n1": ["n3"], "n3": ["n1"]}}),
        );
        assert_eq!(r.unshared("n1", T, 2, 3), None);
        // Another cluster's brokers are no replicas of this one's partitions.
        let mut two = Reach::from_test(&json!({"nodes": [
            {"name": "a1", "cluster": "a"}, {"name": "a2", "cluster": "a"},
            {"name": "b1", "cluster": "b"}, {"name": "c1", "cluster": "a", "role": "controller"},
        ]}));
        done(
            &mut two,
            1,
            "start-partition",
            json!({"grudge": {"a1": ["a2"]}}),
        );
        let u = two
            .unshared("a1", T, 2, 2)
            .expect("a1 alone in its cluster");
        assert_eq!(u.reachable, ["a1"]);
        assert_eq!(u.cut_off, [("a2".to_string(), 1)]);
    }

    /// Five brokers, t/0 on three of them: with both of its followers killed its leader shares
    /// with no replica, though two other brokers run; the partition's replicas come from the
    /// final replica states, and states that leave out the acknowledging node, or name fewer
    /// replicas than the replication factor, say nothing.
    #[test]
    fn replicas_are_the_partitions_where_the_final_states_name_them() {
        let five = || {
            let mut r = Reach::from_test(&json!({
                "nodes": (1..=5)
                    .map(|i| json!({"name": format!("n{i}"), "cluster": "a"}))
                    .collect::<Vec<_>>(),
                "broker": {"config": {"default_replication_factor": 3}}}));
            done(&mut r, 5, "kill", json!({"nodes": ["n2", "n3"]}));
            r
        };
        let state = |node: &str, partition: i64| -> crate::ReplicaState {
            serde_json::from_value(
                json!({"cluster": "a", "node": node, "topic": "t", "partition": partition}),
            )
            .unwrap()
        };
        let mut r = five();
        assert_eq!(r.unshared("n1", T, 7, 2), None, "n4 and n5 may hold it");
        r.learn_replicas(&[
            state("n1", 0),
            state("n2", 0),
            state("n3", 0),
            state("n4", 1),
        ]);
        let u = r.unshared("n1", T, 7, 2).expect("both followers down");
        assert_eq!(u.reachable, ["n1"]);
        assert_eq!(u.cut_off, [("n2".to_string(), 5), ("n3".to_string(), 5)]);
        assert_eq!(
            r.unshared("n4", ("t", 1), 7, 2),
            None,
            "t/1's list is partial"
        );
        let mut r = five();
        r.learn_replicas(&[state("n2", 0), state("n3", 0), state("n4", 0)]);
        assert_eq!(
            r.unshared("n1", T, 7, 2),
            None,
            "states without n1 say nothing"
        );
    }

    const MS: u64 = 1_000_000;

    /// A strand invoked at 1 s and completed at 6 s, whose last cut began 0.5 s into the op and
    /// held 4 s, the op taking 4.8 s: the cut surely held from 1.701 s to 5.5 s.
    fn strand_of_n1(r: &mut Reach, value: Value) -> Vec<(Value, Unshared)> {
        r.nemesis((10, 1000 * MS), "strand", true, false, &json!({}))
            .unwrap();
        let held = [
            ("inside", "n1", 2000, 3000),
            ("invoked before the cut held", "n1", 1500, 3000),
            ("answered after", "n1", 2000, 5600),
            ("another node", "n2", 2000, 3000),
        ];
        for (what, node, from, to) in held {
            r.hold(node, (from * MS, to * MS), 2, || json!(what));
        }
        r.nemesis((20, 6000 * MS), "strand", false, false, &value)
            .unwrap()
    }

    fn strand_value() -> Value {
        json!({"killed": "n1", "nodes": ["n1"], "ports": [9092],
               "cut_ms": 4000, "cut_from_ms": 500, "elapsed_ms": 4800})
    }

    #[test]
    fn a_strand_proves_what_its_leader_acknowledged_while_the_cut_surely_held() {
        let mut r = three();
        let found = strand_of_n1(&mut r, strand_value());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, json!("inside"));
        assert_eq!(found[0].1.reachable, ["n1"]);
        assert_eq!(
            found[0].1.cut_off,
            [("n2".to_string(), 10), ("n3".to_string(), 10)]
        );
        // Nothing is held once no strand is under way.
        r.hold("n1", (7000 * MS, 8000 * MS), 2, || json!("later"));
        r.nemesis((30, 9000 * MS), "strand", false, false, &strand_value())
            .unwrap();
        assert!(r.held.is_empty());
    }

    /// A last stand of n1 invoked at 1 s and completed at 9 s, taking 7.5 s (so it started
    /// between 1 s and 1.5 s), whose last follower was gone 4.5 s into the op and its leader
    /// killed 2 s later: n1 surely stood alone from 6.001 s to 7.5 s.
    fn last_stand_of_n1(r: &mut Reach, value: Value) -> Vec<(Value, Unshared)> {
        r.nemesis((10, 1000 * MS), "last-stand", true, false, &json!({}))
            .unwrap();
        let held = [
            ("alone", "n1", 6100, 7400),
            ("invoked while n3 may still have been in", "n1", 5800, 7000),
            ("answered after the kill", "n1", 6500, 7600),
            ("another node", "n2", 6500, 7000),
        ];
        for (what, node, from, to) in held {
            r.hold(node, (from * MS, to * MS), 2, || json!(what));
        }
        r.nemesis((20, 9000 * MS), "last-stand", false, false, &value)
            .unwrap()
    }

    fn last_stand_value() -> Value {
        json!({"killed": "n1", "nodes": ["n1"], "ports": [9092],
               "left": [{"node": "n2", "how": "crash", "held_ms": 3000},
                        {"node": "n3", "how": "cut", "held_ms": 1500}],
               "alone_from_ms": 4500, "alone_ms": 2000, "elapsed_ms": 7500})
    }

    #[test]
    fn a_last_stand_proves_what_its_leader_acknowledged_while_it_surely_stood_alone() {
        let found = last_stand_of_n1(&mut three(), last_stand_value());
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, json!("alone"));
        assert_eq!(found[0].1.reachable, ["n1"]);
        assert_eq!(
            found[0].1.cut_off,
            [("n2".to_string(), 10), ("n3".to_string(), 10)]
        );
        // A follower stopped cleanly or by a power loss is gone as a crashed one is.
        for how in ["stop", "power-loss"] {
            let mut v = last_stand_value();
            v["left"][0]["how"] = json!(how);
            assert_eq!(last_stand_of_n1(&mut three(), v).len(), 1, "{how}");
        }
    }

    #[test]
    fn a_last_stand_that_left_a_broker_or_its_times_out_proves_nothing() {
        let mut old = last_stand_value();
        old.as_object_mut().unwrap().remove("alone_ms");
        assert!(last_stand_of_n1(&mut three(), old).is_empty());
        // n3 was cut on ports that are not its listener's: it could still fetch.
        let mut other_port = last_stand_value();
        other_port["ports"] = json!([9093]);
        assert!(last_stand_of_n1(&mut three(), other_port).is_empty());
        // Only n2 left: n3 was still there.
        let mut one = last_stand_value();
        one["left"].as_array_mut().unwrap().pop();
        assert!(last_stand_of_n1(&mut three(), one).is_empty());
    }

    #[test]
    fn a_strand_without_its_times_or_on_other_ports_proves_nothing() {
        let mut old = strand_value();
        old.as_object_mut().unwrap().remove("cut_from_ms");
        assert!(strand_of_n1(&mut three(), old).is_empty());
        let mut other_port = strand_value();
        other_port["ports"] = json!([9093]);
        assert!(strand_of_n1(&mut three(), other_port).is_empty());
    }
}
