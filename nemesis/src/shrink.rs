//! Shrinking a failing run's faults, as pure data: the schedule that does a recorded history's
//! faults again, the faults in it (each the op that starts it with the op that undoes it, so
//! that dropping one never leaves half of it behind), shorter versions of them, and delta
//! debugging over which to keep. Running the tests that judge each candidate is the caller's
//! (`tidemark shrink`): nothing here does I/O, so the minimisation can be checked against
//! literal predicates.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidemark_harness::op::{Op, OpType, Process};

use crate::BURST_KEY;

/// One op of a schedule file, in the form `--nemesis-schedule` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledOp {
    /// Nanoseconds since the main phase started.
    pub time: u64,
    /// The fault op, e.g. `kill`.
    pub f: String,
    /// What it does, with its nodes resolved.
    pub value: Value,
    /// The cluster it acts on, as its history line recorded it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
}

/// The main phase's faults of a recorded history (nemesis ops invoked at or before
/// `time_limit` ns) as a schedule that does them again: each op at its invocation's time, with
/// the value its `info` recorded (what was done: resolved nodes, the grudge, the leader hit,
/// never re-resolved) and the client burst its invocation asked for, so the clients are driven
/// as they were before it. An invocation without its `info` (a run cut short) is left out.
pub fn recorded_schedule(ops: &[Op], time_limit: u64) -> Vec<ScheduledOp> {
    recorded_schedule_from(ops, time_limit)
        .into_iter()
        .map(|(_, op)| op)
        .collect()
}

/// [`recorded_schedule`], each op with the position in `ops` of the `info` it was taken from, so
/// that a reader of a file can name the line an op came from.
pub fn recorded_schedule_from(ops: &[Op], time_limit: u64) -> Vec<(usize, ScheduledOp)> {
    let mut schedule = Vec::new();
    let mut invoked: Option<&Op> = None;
    for (at, op) in ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.process == Process::Nemesis)
    {
        match op.kind {
            OpType::Invoke => invoked = Some(op),
            _ => {
                let Some(invoke) = invoked.take().filter(|i| i.f == op.f) else {
                    continue;
                };
                if invoke.time > time_limit {
                    continue;
                }
                let mut value = op.value.clone();
                if let (Some(burst), Value::Object(map)) = (invoke.value.get(BURST_KEY), &mut value)
                {
                    map.insert(BURST_KEY.into(), burst.clone());
                }
                schedule.push((
                    at,
                    ScheduledOp {
                        time: invoke.time,
                        f: op.f.clone(),
                        value,
                        cluster: op.cluster.clone().or_else(|| invoke.cluster.clone()),
                    },
                ));
            }
        }
    }
    schedule
}

/// The ops that undo a fault, each with the ops whose fault it undoes.
const UNDOING: &[(&str, &[&str])] = &[
    ("stop-partition", &["start-partition"]),
    (
        "start",
        &["kill", "strand", "lapse", "last-stand", "corrupt-file"],
    ),
    ("resume", &["pause"]),
    ("clock-reset", &["clock-skew", "clock-strobe"]),
    ("stop-loss", &["start-loss"]),
    ("remote-restore", &["remote-outage"]),
    ("disk-heal", &["disk-fault"]),
    ("failback", &["failover"]),
];

/// One fault of a schedule: the op that starts it and the op that undoes it, which is absent for
/// a fault that undoes itself (a bounce, a handoff, an unclean election) or one the final phase
/// heals. An undoing op with no fault open before it is a fault of its own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// The op that starts it.
    pub start: ScheduledOp,
    /// The op that undoes it.
    pub end: Option<ScheduledOp>,
}

impl Fault {
    /// When it is undone: its undoing op's time, else its start's.
    pub fn end_time(&self) -> u64 {
        self.end.as_ref().map_or(self.start.time, |e| e.time)
    }

    /// The same fault undone after `keep` (0 to 1) of the time it lasted.
    pub fn shortened(&self, keep: f64) -> Fault {
        let lasted = self.end_time() - self.start.time;
        let end = self.end.clone().map(|mut e| {
            e.time = self.start.time + (lasted as f64 * keep.clamp(0.0, 1.0)) as u64;
            e
        });
        Fault {
            start: self.start.clone(),
            end,
        }
    }

    /// Whether shortening changes it: it has an undoing op after its start.
    pub fn can_shorten(&self) -> bool {
        self.end_time() > self.start.time
    }
}

/// Groups a schedule into faults: each undoing op goes with the latest fault it undoes that is
/// still open on the same cluster.
pub fn faults(schedule: &[ScheduledOp]) -> Vec<Fault> {
    let mut faults: Vec<Fault> = Vec::new();
    for op in schedule {
        let undoes = UNDOING
            .iter()
            .find(|(f, _)| *f == op.f)
            .map_or(&[][..], |(_, starts)| *starts);
        let open = faults.iter_mut().rev().find(|fault| {
            fault.end.is_none()
                && undoes.contains(&fault.start.f.as_str())
                && fault.start.cluster == op.cluster
        });
        match open {
            Some(fault) => fault.end = Some(op.clone()),
            None => faults.push(Fault {
                start: op.clone(),
                end: None,
            }),
        }
    }
    faults
}

/// The schedule that performs `faults`: their ops in time order (ties in the faults' order).
pub fn schedule(faults: &[Fault]) -> Vec<ScheduledOp> {
    let mut ops: Vec<ScheduledOp> = faults
        .iter()
        .flat_map(|f| std::iter::once(f.start.clone()).chain(f.end.clone()))
        .collect();
    ops.sort_by_key(|o| o.time);
    ops
}

/// Delta debugging (Zeller and Hildebrandt's ddmin): a 1-minimal subset of the items `0..n`
/// (dropping any one item of it makes `fails` false) for which `fails` holds, given that it
/// holds for all of them. Subsets are passed in increasing order; the whole set and any subset
/// already answered are not asked about again. `fails` answers `None` when no more tests may be
/// run (a budget spent): the smallest failing subset found so far is returned then.
pub fn ddmin(n: usize, mut fails: impl FnMut(&[usize]) -> Option<bool>) -> Vec<usize> {
    let mut current: Vec<usize> = (0..n).collect();
    let mut answered: HashMap<Vec<usize>, bool> = HashMap::new();
    answered.insert(current.clone(), true);
    let mut ask = |subset: &[usize]| -> Option<bool> {
        if let Some(&known) = answered.get(subset) {
            return Some(known);
        }
        let verdict = fails(subset)?;
        answered.insert(subset.to_vec(), verdict);
        Some(verdict)
    };
    let mut granularity = 2;
    'shrink: while current.len() >= 2 {
        let chunks = split(&current, granularity);
        for chunk in &chunks {
            match ask(chunk) {
                None => return current,
                Some(true) => {
                    current = chunk.clone();
                    granularity = 2;
                    continue 'shrink;
                }
                Some(false) => {}
            }
        }
        // With two chunks each complement is the other chunk, already asked about.
        if granularity > 2 {
            for chunk in &chunks {
                let complement: Vec<usize> = current
                    .iter()
                    .copied()
                    .filter(|i| !chunk.contains(i))
                    .collect();
                match ask(&complement) {
                    None => return current,
                    Some(true) => {
                        current = complement;
                        granularity = (granularity - 1).max(2);
                        continue 'shrink;
                    }
                    Some(false) => {}
                }
            }
        }
        if granularity >= current.len() {
            break;
        }
        granularity = (granularity * 2).min(current.len());
    }
    current
}

/// The shortest time limit found failing between `shortest` and `longest`, within `tries`
/// tests: `shortest` first (a cut just past the fault that exposed the anomaly usually keeps it),
/// then bisection towards `longest` while the gap is wider than `resolution` (what exposes a
/// bug may need time after the fault: a lost offset is written again only once a new leader
/// has its quorum back). `fails` answers `None` when no more tests may be run. `None` when no
/// limit tested failed; `longest` itself is never tested.
pub fn shortest_failing_time(
    shortest: u64,
    longest: u64,
    resolution: u64,
    tries: usize,
    mut fails: impl FnMut(u64) -> Option<bool>,
) -> Option<u64> {
    if tries == 0 || shortest >= longest {
        return None;
    }
    if fails(shortest)? {
        return Some(shortest);
    }
    let (mut passed, mut failed) = (shortest, None::<u64>);
    for _ in 1..tries {
        let upper = failed.unwrap_or(longest);
        if upper - passed <= resolution {
            break;
        }
        let mid = passed + (upper - passed) / 2;
        match fails(mid) {
            None => break,
            Some(true) => failed = Some(mid),
            Some(false) => passed = mid,
        }
    }
    failed
}

/// `items` cut into `parts` contiguous chunks whose lengths differ by at most one.
fn split(items: &[usize], parts: usize) -> Vec<Vec<usize>> {
    let (size, extra) = (items.len() / parts, items.len() % parts);
    let mut chunks = Vec::with_capacity(parts);
    let mut at = 0;
    for i in 0..parts {
        let len = size + usize::from(i < extra);
        chunks.push(items[at..at + len].to_vec());
        at += len;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The limits asked about, and the answer, for a bug that shows from `from` on.
    fn search(from: u64, tries: usize) -> (Vec<u64>, Option<u64>) {
        let mut asked = Vec::new();
        let found = shortest_failing_time(10, 30, 2, tries, |t| {
            asked.push(t);
            Some(t >= from)
        });
        (asked, found)
    }

    #[test]
    fn the_shortest_limit_is_tried_first_then_bisected_towards_the_longest() {
        assert_eq!(search(8, 3), (vec![10], Some(10)));
        assert_eq!(search(14, 3), (vec![10, 20, 15], Some(15)));
        assert_eq!(search(25, 3), (vec![10, 20, 25], Some(25)));
        // The longest is never tested: nothing below it failed, nothing is known.
        assert_eq!(search(31, 3), (vec![10, 20, 25], None));
        assert_eq!(search(14, 1), (vec![10], None));
        assert_eq!(search(14, 0), (vec![], None));
        // Bisection stops at the resolution.
        assert_eq!(search(11, 9), (vec![10, 20, 15, 12], Some(12)));
        // A spent budget ends the search with what failed so far.
        let mut n = 0;
        let found = shortest_failing_time(10, 30, 2, 5, |t| {
            n += 1;
            (n <= 2).then_some(t >= 14)
        });
        assert_eq!(found, Some(20));
    }

    /// ddmin with a predicate over literal subsets, returning the result and every subset asked.
    fn minimise(n: usize, fails: impl Fn(&[usize]) -> bool) -> (Vec<usize>, Vec<Vec<usize>>) {
        let mut asked = Vec::new();
        let result = ddmin(n, |s| {
            asked.push(s.to_vec());
            Some(fails(s))
        });
        (result, asked)
    }

    #[test]
    fn ddmin_finds_the_two_faults_that_fail_together() {
        let (result, asked) = minimise(8, |s| s.contains(&2) && s.contains(&5));
        assert_eq!(result, [2, 5]);
        let mut unique = asked.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), asked.len(), "asked twice: {asked:?}");
        assert!(!asked.contains(&(0..8).collect()), "asked the whole set");
        assert!(asked.iter().all(|s| s.windows(2).all(|w| w[0] < w[1])));
    }

    #[test]
    fn ddmin_keeps_one_fault_when_one_is_enough() {
        assert_eq!(minimise(6, |s| s.contains(&4)).0, [4]);
        assert_eq!(minimise(1, |_| true), ([0].to_vec(), vec![]));
        assert_eq!(minimise(0, |_| true), (vec![], vec![]));
    }

    #[test]
    fn ddmin_is_one_minimal_when_any_two_of_three_fail() {
        let fails = |s: &[usize]| [1, 3, 6].iter().filter(|i| s.contains(i)).count() >= 2;
        let (result, _) = minimise(7, fails);
        assert!(fails(&result), "{result:?}");
        assert_eq!(result.len(), 2, "{result:?}");
    }

    #[test]
    fn ddmin_keeps_every_fault_when_none_can_go() {
        assert_eq!(minimise(3, |s| s.len() == 3).0, [0, 1, 2]);
    }

    #[test]
    fn a_spent_budget_returns_the_smallest_failing_subset_found() {
        let fails = |s: &[usize]| s.contains(&2) && s.contains(&5);
        let mut budget = 2;
        let result = ddmin(8, |s| {
            if budget == 0 {
                return None;
            }
            budget -= 1;
            Some(fails(s))
        });
        // Halves first ([0..4], [4..8]): neither fails, and the budget is gone.
        assert_eq!(result, (0..8).collect::<Vec<_>>());
        // Then quarters (none fails alone) and the first complement, which fails.
        let mut budget = 7;
        let result = ddmin(8, |s| {
            if budget == 0 {
                return None;
            }
            budget -= 1;
            Some(fails(s))
        });
        assert_eq!(result, [2, 3, 4, 5, 6, 7]);
    }

    fn op(index: u64, time_s: f64, kind: OpType, f: &str, value: Value) -> Op {
        Op {
            index,
            cluster: Some("a".into()),
            ..Op::new((time_s * 1e9) as u64, Process::Nemesis, kind, f, value)
        }
    }

    #[test]
    fn a_recorded_schedule_does_what_the_infos_say_when_the_invocations_began() {
        let ops = [
            op(
                0,
                1.0,
                OpType::Invoke,
                "kill",
                json!({"targets": "leader", "burst_ms": 1000}),
            ),
            op(
                1,
                2.5,
                OpType::Info,
                "kill",
                json!({"nodes": ["n2"], "targets": "leader", "leaders": ["n2"]}),
            ),
            Op::new(
                2_600_000_000,
                Process::Client(3),
                OpType::Invoke,
                "send",
                json!({}),
            ),
            op(3, 6.0, OpType::Invoke, "start", json!({"nodes": ["n2"]})),
            op(4, 6.2, OpType::Info, "start", json!({"nodes": ["n2"]})),
            // The final phase's heal, after the time limit.
            op(5, 11.0, OpType::Invoke, "stop-partition", json!({})),
            op(6, 11.1, OpType::Info, "stop-partition", json!({})),
        ];
        let schedule = recorded_schedule(&ops, 10_000_000_000);
        assert_eq!(
            serde_json::to_value(&schedule).unwrap(),
            json!([
                {"time": 1_000_000_000u64, "f": "kill", "cluster": "a",
                 "value": {"nodes": ["n2"], "targets": "leader", "leaders": ["n2"],
                           "burst_ms": 1000}},
                {"time": 6_000_000_000u64, "f": "start", "cluster": "a",
                 "value": {"nodes": ["n2"]}},
            ])
        );
    }

    fn at(time_s: u64, f: &str) -> ScheduledOp {
        ScheduledOp {
            time: time_s * 1_000_000_000,
            f: f.into(),
            value: json!({}),
            cluster: Some("a".into()),
        }
    }

    #[test]
    fn faults_pair_each_start_with_its_undoing_and_shorten_from_their_start() {
        let ops = [
            at(1, "start-partition"),
            at(5, "stop-partition"),
            at(6, "bounce"),
            at(9, "kill"),
            at(10, "clock-skew"),
            at(13, "start"),
            at(14, "clock-reset"),
            at(15, "resume"),
            at(16, "disk-fault"),
            at(18, "disk-heal"),
        ];
        let faults = faults(&ops);
        let pairs: Vec<(&str, Option<&str>)> = faults
            .iter()
            .map(|f| (f.start.f.as_str(), f.end.as_ref().map(|e| e.f.as_str())))
            .collect();
        assert_eq!(
            pairs,
            [
                ("start-partition", Some("stop-partition")),
                ("bounce", None),
                ("kill", Some("start")),
                ("clock-skew", Some("clock-reset")),
                ("resume", None),
                ("disk-fault", Some("disk-heal")),
            ]
        );
        assert_eq!(schedule(&faults), ops);
        let half = faults[2].shortened(0.5);
        assert_eq!(half.end_time(), 11_000_000_000);
        assert!(faults[0].can_shorten() && !faults[1].can_shorten());
        // The shortened kill now ends before the clock skew starts.
        let shorter = [faults[2].shortened(0.0), faults[3].clone()];
        let times: Vec<u64> = schedule(&shorter)
            .iter()
            .map(|o| o.time / 1_000_000_000)
            .collect();
        assert_eq!(times, [9, 9, 10, 14]);
    }

    #[test]
    fn an_undoing_op_pairs_only_within_its_cluster() {
        let mut b = at(2, "start");
        b.cluster = Some("b".into());
        let faults = faults(&[at(1, "kill"), b, at(3, "start")]);
        assert_eq!(faults.len(), 2);
        assert_eq!(faults[0].end_time(), 3_000_000_000);
        assert_eq!(faults[1].start.cluster.as_deref(), Some("b"));
    }
}
