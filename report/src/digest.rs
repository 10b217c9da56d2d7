//! One streaming pass over `history.jsonl` that keeps what the report draws: a compact row per
//! operation (invocation and completion paired), the nemesis fault intervals, the full ops that
//! anomalies name as proof, and what sends and polls saw at the offsets under scrutiny. Nothing
//! kept grows with op values or offsets, only with the number of ops (one short row each).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use anyhow::Context as _;
use serde::Deserialize;
use serde_json::Value;
use tidemark_checkers::{read_history, Op, OpType, PollValue, Process, SendValue};

use crate::anomalies::PartKey;
use crate::text::{clip, json_clip, one_line};

/// History lines per timeline page: a page holds the ops completed within its range of lines.
pub const PAGE_LINES: u64 = 1000;
/// Longest op summary in the timeline.
const SUMMARY_CHARS: usize = 160;
/// Distinct sends and poll values kept per watched offset.
const MAX_SEEN_PER_OFFSET: usize = 6;

/// How an op ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Fail,
    Info,
    /// Invoked and never completed (a run cut short): counts as `info`.
    Pending,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
            Outcome::Pending => "pending",
        }
    }

    fn of(kind: OpType) -> Self {
        match kind {
            OpType::Ok => Outcome::Ok,
            OpType::Fail => Outcome::Fail,
            OpType::Info | OpType::Invoke => Outcome::Info,
        }
    }
}

/// One operation as the timeline shows it.
pub struct OpRow {
    /// The completion's line index, or the invocation's when it never completed.
    pub index: u64,
    pub invoke: Option<u64>,
    pub process: Process,
    /// Index into [`Digest::fs`].
    pub f: u16,
    pub outcome: Outcome,
    /// Invocation time (ns since the test started).
    pub start: u64,
    /// Completion time.
    pub end: Option<u64>,
    pub node: Option<Box<str>>,
    pub summary: Box<str>,
}

impl OpRow {
    pub fn latency(&self) -> Option<u64> {
        self.end.map(|e| e.saturating_sub(self.start))
    }
}

/// A fault the nemesis injected: an interval (start-partition..stop-partition, kill..start,
/// pause..resume, clock-skew..clock-reset) or an instant (anything else, failovers and failbacks
/// among them, labelled with their direction).
pub struct Fault {
    pub label: String,
    /// Which kind of fault, for its colour: an index into [`FAULT_KINDS`], or its length.
    pub kind: usize,
    pub start: u64,
    /// `None` for an instantaneous fault.
    pub end: Option<u64>,
    /// Never healed within the history: `end` is the history's end.
    pub open_ended: bool,
}

/// The fault intervals: the ops that open one, the op that closes it, and its name (an opening
/// op other than the first names its interval itself: a `strand`, a `lapse` or a `last-stand`
/// is a kill).
pub const FAULT_KINDS: [(&[&str], &str, &str); 4] = [
    (&["start-partition"], "stop-partition", "partition"),
    (&["kill", "strand", "lapse", "last-stand"], "start", "kill"),
    (&["pause"], "resume", "pause"),
    (&["clock-skew"], "clock-reset", "clock skew"),
];

/// A stretch of the run with one mirroring topology: which cluster took writes and which
/// mirrored from it, from the test's clusters and each `failover` and `failback`.
pub struct Band {
    pub start: u64,
    pub end: u64,
    /// The cluster taking writes.
    pub writable: String,
    /// The clusters mirroring from it (none between a failover and its failback).
    pub mirrors: Vec<String>,
}

impl Band {
    /// `a → b`, or `b writable, not mirrored`.
    pub fn label(&self) -> String {
        if self.mirrors.is_empty() {
            format!("{} writable, not mirrored", self.writable)
        } else {
            format!("{} → {}", self.writable, self.mirrors.join(", "))
        }
    }
}

/// The mirroring topology as the run goes: the open band, closed as each change arrives.
struct Topology {
    open: Option<Band>,
}

impl Topology {
    /// The starting topology: in the `mirror` workload with two or more `clusters`, the
    /// `workload_cluster` (else the first) takes writes and the others mirror from it. Other
    /// runs have no band until a failover or failback.
    fn new(test: &Value) -> Self {
        if test.get("workload").and_then(Value::as_str) != Some("mirror") {
            return Topology { open: None };
        }
        let clusters: Vec<String> = test
            .get("clusters")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let writable = test
            .get("workload_cluster")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| clusters.first().cloned());
        let open = writable.filter(|_| clusters.len() > 1).map(|w| Band {
            start: 0,
            end: 0,
            mirrors: clusters.iter().filter(|c| **c != w).cloned().collect(),
            writable: w,
        });
        Topology { open }
    }

    /// A failover makes `to` writable and stops its mirroring; a failback makes `to` mirror
    /// from `from` again.
    fn change(&mut self, bands: &mut Vec<Band>, f: &str, value: &Value, at: u64) {
        let name = |k: &str| value.get(k).and_then(Value::as_str).map(str::to_owned);
        let (Some(from), Some(to)) = (name("from"), name("to")) else {
            return;
        };
        let prev = self.open.take();
        let mut next = match (f, &prev) {
            ("failover", _) => Band {
                start: at,
                end: at,
                writable: to,
                mirrors: Vec::new(),
            },
            (_, Some(b)) if b.writable == from => Band {
                start: at,
                end: at,
                mirrors: b.mirrors.iter().cloned().chain([to]).collect(),
                writable: from,
            },
            _ => Band {
                start: at,
                end: at,
                writable: from,
                mirrors: vec![to],
            },
        };
        next.mirrors.sort();
        next.mirrors.dedup();
        if let Some(mut b) = prev {
            b.end = at;
            bands.push(b);
        }
        self.open = Some(next);
    }

    /// Closes the open band at the end of the history.
    fn finish(&mut self, bands: &mut Vec<Band>, end: u64) {
        if let Some(mut b) = self.open.take() {
            b.end = end.max(b.start);
            bands.push(b);
        }
    }
}

/// The full lines of an op an anomaly names.
pub struct Evidence {
    pub invoke: Option<Op>,
    pub completion: Option<Op>,
}

/// What the history saw at one watched offset.
#[derive(Default)]
pub struct Seen {
    /// `(value, op)` of acknowledged sends that put a value there.
    pub sends: Vec<(i64, u64)>,
    /// Distinct values polls returned there.
    pub polls: Vec<PollSeen>,
}

/// One value polls returned at an offset.
pub struct PollSeen {
    pub value: i64,
    pub epoch: Option<i64>,
    pub count: u64,
    pub first_op: u64,
}

/// What the report needs from the history.
pub struct Digest {
    /// The header's test map.
    pub test: Value,
    /// Every op, in order of completion (never-completed ones last).
    pub ops: Vec<OpRow>,
    /// Interned op names.
    pub fs: Vec<String>,
    /// Op lines read.
    pub lines: u64,
    /// The latest time in the history.
    pub end: u64,
    pub faults: Vec<Fault>,
    /// The mirroring topology over time, in order; empty for a run of one cluster.
    pub bands: Vec<Band>,
    /// Ops named by anomalies, by the index of their row.
    pub evidence: BTreeMap<u64, Evidence>,
    /// Watched offsets and what sends and polls saw there.
    pub seen: BTreeMap<PartKey, BTreeMap<i64, Seen>>,
    pub warnings: Vec<String>,
}

/// What to look for while reading.
pub struct Watch<'a> {
    /// Op indices whose full lines to keep.
    pub ops: &'a BTreeSet<u64>,
    /// Offset ranges (inclusive) per partition.
    pub windows: &'a BTreeMap<PartKey, Vec<(i64, i64)>>,
    /// The cluster of ops that name none.
    pub default_cluster: &'a str,
}

impl Watch<'_> {
    fn watched(&self, key: &PartKey, offset: i64) -> bool {
        self.windows
            .get(key)
            .is_some_and(|w| w.iter().any(|&(lo, hi)| lo <= offset && offset <= hi))
    }
}

struct Open {
    kind: usize,
    fault: usize,
}

/// Reads the history at `path`.
pub fn read(path: &Path, watch: &Watch<'_>) -> anyhow::Result<Digest> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut reader = read_history(BufReader::with_capacity(1 << 16, file))
        .map_err(|e| anyhow::anyhow!("{}", e.in_file(path.display().to_string())))?;
    let mut d = Digest {
        test: reader.test().clone(),
        ops: Vec::new(),
        fs: Vec::new(),
        lines: 0,
        end: 0,
        faults: Vec::new(),
        bands: Vec::new(),
        evidence: BTreeMap::new(),
        seen: BTreeMap::new(),
        warnings: Vec::new(),
    };
    let mut f_ids: HashMap<String, u16> = HashMap::new();
    let mut pending: HashMap<Process, Op> = HashMap::new();
    let mut open: Vec<Open> = Vec::new();
    let mut topology = Topology::new(&d.test);
    for op in reader.by_ref() {
        let op = match op {
            Ok(op) => op,
            Err(e) => {
                d.warnings.push(format!(
                    "the history stops being readable at {e}; the report shows the ops before it"
                ));
                break;
            }
        };
        d.lines += 1;
        d.end = d.end.max(op.time);
        if op.process == Process::Nemesis
            && op.kind != OpType::Invoke
            && matches!(op.f.as_str(), "failover" | "failback")
        {
            topology.change(&mut d.bands, &op.f, &op.value, op.time);
        }
        if op.kind == OpType::Invoke {
            if let Some(prev) = pending.insert(op.process, op) {
                d.finish(prev, None, &mut f_ids, &mut open, watch);
            }
            continue;
        }
        let invoke = pending.remove(&op.process);
        d.finish_pair(invoke, op, &mut f_ids, &mut open, watch);
    }
    d.warnings.extend(reader.warnings().iter().cloned());
    let mut left: Vec<Op> = pending.into_values().collect();
    left.sort_by_key(|o| o.index);
    for op in left {
        d.finish(op, None, &mut f_ids, &mut open, watch);
    }
    for o in open {
        let f = &mut d.faults[o.fault];
        f.end = Some(d.end.max(f.start));
        f.open_ended = true;
    }
    topology.finish(&mut d.bands, d.end);
    Ok(d)
}

impl Digest {
    fn finish_pair(
        &mut self,
        invoke: Option<Op>,
        done: Op,
        f_ids: &mut HashMap<String, u16>,
        open: &mut Vec<Open>,
        watch: &Watch<'_>,
    ) {
        match invoke {
            Some(inv) if inv.f == done.f => self.finish(inv, Some(done), f_ids, open, watch),
            Some(inv) => {
                // A completion of another op: both are shown alone rather than mispaired.
                self.finish(inv, None, f_ids, open, watch);
                self.finish_alone(done, f_ids, open, watch);
            }
            None => self.finish_alone(done, f_ids, open, watch),
        }
    }

    fn finish_alone(
        &mut self,
        done: Op,
        f_ids: &mut HashMap<String, u16>,
        open: &mut Vec<Open>,
        watch: &Watch<'_>,
    ) {
        let row = row(None, Some(&done), self.intern(&done.f, f_ids));
        self.keep(row, None, Some(done), open, watch);
    }

    /// Records an invocation and its completion (`None`: never completed).
    fn finish(
        &mut self,
        inv: Op,
        done: Option<Op>,
        f_ids: &mut HashMap<String, u16>,
        open: &mut Vec<Open>,
        watch: &Watch<'_>,
    ) {
        let row = row(Some(&inv), done.as_ref(), self.intern(&inv.f, f_ids));
        self.keep(row, Some(inv), done, open, watch);
    }

    fn keep(
        &mut self,
        row: OpRow,
        inv: Option<Op>,
        done: Option<Op>,
        open: &mut Vec<Open>,
        watch: &Watch<'_>,
    ) {
        let some = inv.as_ref().or(done.as_ref()).expect("an op has a line");
        if some.process == Process::Nemesis {
            self.fault(&row, inv.as_ref(), done.as_ref(), open);
        } else if let Some(done) = done.as_ref().filter(|d| d.kind == OpType::Ok) {
            self.observe(done, watch);
        }
        let named = |o: &Option<Op>| o.as_ref().is_some_and(|o| watch.ops.contains(&o.index));
        if named(&inv) || named(&done) {
            self.evidence.insert(
                row.index,
                Evidence {
                    invoke: inv,
                    completion: done,
                },
            );
        }
        self.ops.push(row);
    }

    fn intern(&mut self, f: &str, ids: &mut HashMap<String, u16>) -> u16 {
        if let Some(&id) = ids.get(f) {
            return id;
        }
        // Past 65,535 distinct names (a hostile history), the rest share the last name.
        let id = u16::try_from(self.fs.len()).unwrap_or(u16::MAX);
        if usize::from(id) == self.fs.len() {
            self.fs.push(clip(&one_line(f), 40));
            ids.insert(f.to_owned(), id);
        }
        id
    }

    fn fault(&mut self, row: &OpRow, inv: Option<&Op>, done: Option<&Op>, open: &mut Vec<Open>) {
        let Some(op) = done.or(inv) else { return };
        let at_end = row.end.unwrap_or(row.start);
        if let Some(kind) = FAULT_KINDS.iter().position(|k| k.1 == op.f) {
            open.retain(|o| {
                if o.kind == kind {
                    self.faults[o.fault].end = Some(at_end);
                }
                o.kind != kind
            });
            return;
        }
        let value = done
            .filter(|d| !d.value.is_null())
            .or(inv)
            .map_or(&Value::Null, |o| &o.value);
        let Some(kind) = FAULT_KINDS
            .iter()
            .position(|k| k.0.contains(&op.f.as_str()))
        else {
            self.faults.push(Fault {
                label: clip(&one_line(&instant_label(&op.f, value)), 40),
                kind: FAULT_KINDS.len(),
                start: at_end,
                end: None,
                open_ended: false,
            });
            return;
        };
        open.push(Open {
            kind,
            fault: self.faults.len(),
        });
        self.faults.push(Fault {
            label: clip(&fault_label(kind, &op.f, value), 60),
            kind,
            start: row.start,
            end: Some(at_end),
            open_ended: false,
        });
    }

    fn observe(&mut self, done: &Op, watch: &Watch<'_>) {
        let cluster = done.cluster.as_deref().unwrap_or(watch.default_cluster);
        match done.f.as_str() {
            "send" => {
                let Ok(v) = SendValue::deserialize(&done.value) else {
                    return;
                };
                let (Some(first), key) = (v.offset, (cluster.to_owned(), v.topic, v.partition))
                else {
                    return;
                };
                for (i, value) in v.values.iter().enumerate() {
                    let offset = first.saturating_add(i as i64);
                    if watch.watched(&key, offset) {
                        let seen = self.seen_at(&key, offset);
                        if seen.sends.len() < MAX_SEEN_PER_OFFSET {
                            seen.sends.push((*value, done.index));
                        }
                    }
                }
            }
            "poll" => {
                let Ok(v) = PollValue::deserialize(&done.value) else {
                    return;
                };
                let key = (cluster.to_owned(), v.topic, v.partition);
                for r in &v.records {
                    if !watch.watched(&key, r.offset) {
                        continue;
                    }
                    let seen = self.seen_at(&key, r.offset);
                    let full = seen.polls.len() >= MAX_SEEN_PER_OFFSET;
                    match seen.polls.iter_mut().find(|p| p.value == r.value) {
                        Some(p) => p.count += 1,
                        None if !full => seen.polls.push(PollSeen {
                            value: r.value,
                            epoch: r.epoch,
                            count: 1,
                            first_op: done.index,
                        }),
                        None => {}
                    }
                }
            }
            _ => {}
        }
    }

    fn seen_at(&mut self, key: &PartKey, offset: i64) -> &mut Seen {
        if !self.seen.contains_key(key) {
            self.seen.insert(key.clone(), BTreeMap::new());
        }
        self.seen
            .get_mut(key)
            .expect("inserted above")
            .entry(offset)
            .or_default()
    }
}

/// An instantaneous fault's name; a failover or failback also says its direction.
fn instant_label(f: &str, value: &Value) -> String {
    match (f, value.get("from"), value.get("to")) {
        ("failover" | "failback", Some(Value::String(a)), Some(Value::String(b))) => {
            format!("{f} {a}→{b}")
        }
        _ => f.to_owned(),
    }
}

fn fault_label(kind: usize, f: &str, value: &Value) -> String {
    let (opens, _, name) = FAULT_KINDS[kind];
    let name = if opens.first() == Some(&f) { name } else { f };
    let nodes = value.get("nodes").and_then(Value::as_array).map(|n| {
        n.iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_owned))
            .collect::<Vec<_>>()
            .join(",")
    });
    let detail = match kind {
        0 => value.get("kind").and_then(Value::as_str).map(str::to_owned),
        _ => nodes,
    };
    one_line(&match detail {
        Some(d) => format!("{name} {d}"),
        None => name.to_owned(),
    })
}

fn row(inv: Option<&Op>, done: Option<&Op>, f: u16) -> OpRow {
    let first = inv.or(done).expect("an op has a line");
    OpRow {
        index: done.map_or(first.index, |d| d.index),
        invoke: inv.map(|i| i.index),
        process: first.process,
        f,
        outcome: done.map_or(Outcome::Pending, |d| Outcome::of(d.kind)),
        start: first.time,
        end: done.map(|d| d.time),
        node: first
            .node
            .as_deref()
            .map(|n| clip(&one_line(n), 30).into_boxed_str()),
        summary: summary(inv, done).into_boxed_str(),
    }
}

/// A short description of what an op did, e.g. `t/0 [17, 18] → @42`.
fn summary(inv: Option<&Op>, done: Option<&Op>) -> String {
    let op = inv.or(done).expect("an op has a line");
    let mut s = match op.f.as_str() {
        "send" if op.process != Process::Nemesis => send_summary(inv, done),
        "poll" if op.process != Process::Nemesis => poll_summary(inv, done),
        _ => None,
    }
    .unwrap_or_else(|| {
        let v = done
            .filter(|d| !d.value.is_null())
            .or(inv)
            .map_or(&Value::Null, |o| &o.value);
        if v.is_null() {
            String::new()
        } else {
            json_clip(v, 100)
        }
    });
    if let Some(e) = done.and_then(|d| d.error.as_deref()) {
        s.push_str(" ! ");
        s.push_str(&clip(e, 80));
    }
    clip(&one_line(&s), SUMMARY_CHARS)
}

fn send_summary(inv: Option<&Op>, done: Option<&Op>) -> Option<String> {
    let v = SendValue::deserialize(&inv.or(done)?.value).ok()?;
    let mut values: Vec<String> = v.values.iter().take(6).map(i64::to_string).collect();
    if v.values.len() > 6 {
        values.push(format!("…+{}", v.values.len() - 6));
    }
    let mut s = format!(
        "{}/{} [{}]",
        clip(&v.topic, 40),
        v.partition,
        values.join(", ")
    );
    let offset = done.and_then(|d| SendValue::deserialize(&d.value).ok()?.offset);
    if let Some(o) = offset {
        s.push_str(&format!(" → @{o}"));
    }
    Some(s)
}

fn poll_summary(inv: Option<&Op>, done: Option<&Op>) -> Option<String> {
    let v = PollValue::deserialize(&inv.or(done)?.value).ok()?;
    let mut s = format!("{}/{} from {}", clip(&v.topic, 40), v.partition, v.from);
    if let Some(r) = done.and_then(|d| PollValue::deserialize(&d.value).ok()) {
        match (r.records.first(), r.records.last()) {
            (Some(a), Some(b)) => s.push_str(&format!(
                " → {} recs @{}..{}",
                r.records.len(),
                a.offset,
                b.offset
            )),
            _ => s.push_str(" → none"),
        }
        if let Some(hw) = r.high_watermark {
            s.push_str(&format!(" hw {hw}"));
        }
        // Tiered topics: the records below the leader's local log start came from the remote
        // store.
        if let Some(local) = r.local_log_start {
            let remote = r.records.iter().filter(|x| x.offset < local).count();
            if remote > 0 {
                s.push_str(&format!(" ({remote} from remote, local from {local})"));
            }
        }
    }
    Some(s)
}
