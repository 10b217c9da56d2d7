//! When a run's anomaly happened, from its history rather than from when the checker noticed
//! it: the earliest anomaly entry's ops (the acknowledgement of a lost write, the observations of
//! an offset that disagree) give the time it was evidenced, and the fault that exposed it is the
//! one in force then, else the next to begin; the anomaly exists once both happened. An anomaly
//! its responses prove on their own (`AnomalyKind::shown_by_responses`: a read past the high
//! watermark its response reported) existed when they completed, with or without a fault; the
//! fault in force then, if any, is named.
//! `tidemark bench-detection` reports that time and that fault, and `tidemark shrink` cuts a
//! run's faults and time limit to just past it. `tidemark test` prints the tally of the faults a
//! run began beside its verdict, and `tidemark check` too.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;
use tidemark_checkers::{AnomalyKind, Op, OpType, Process};

/// Fault ops that undo themselves before their `info`.
const SELF_HEALING: &[&str] = &[
    "bounce",
    "handoff",
    "roll",
    "power-loss",
    "unclean-election",
];

/// Ops that undo a fault (or heal at the end): they start nothing.
const UNDOING: &[&str] = &[
    "stop-partition",
    "start",
    "resume",
    "clock-reset",
    "stop-loss",
    "disk-heal",
    "converge",
];

/// The strings of a JSON list (none for anything else).
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The op indices an anomaly entry names: `op_index` and every `{"send": i}` or `{"poll": i}`.
fn op_indices(entry: &Value, out: &mut Vec<u64>) {
    match entry {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v.as_u64()) {
                    ("op_index" | "send" | "poll", Some(i)) => out.push(i),
                    _ => op_indices(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| op_indices(v, out)),
        _ => {}
    }
}

/// The values an anomaly entry saw only in a final log (`{"value": v, "seen_by": {"final_log":
/// ..}}`): what was written at an offset after another value was seen there.
fn final_log_values(entry: &Value, out: &mut Vec<u64>) {
    match entry {
        Value::Object(m) => {
            if m.get("seen_by")
                .is_some_and(|s| s.get("final_log").is_some())
            {
                out.extend(m.get("value").and_then(Value::as_u64));
            }
            m.values().for_each(|v| final_log_values(v, out));
        }
        Value::Array(a) => a.iter().for_each(|v| final_log_values(v, out)),
        _ => {}
    }
}

/// When each sent value was last known written: its send's completion (else its invocation). A
/// value the final log holds at an offset another value was seen at makes the offsets disagree
/// only once it was written, not when the first value was acknowledged.
fn written_at(ops: &[Op]) -> HashMap<u64, u64> {
    let mut at = HashMap::new();
    for o in ops
        .iter()
        .filter(|o| o.f == "send" && o.process != Process::Nemesis)
    {
        for v in o.value["values"].as_array().into_iter().flatten() {
            if let Some(v) = v.as_u64() {
                at.insert(v, o.time);
            }
        }
    }
    at
}

/// When a run's first forbidden anomaly existed, and what exposed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirstAnomaly {
    /// Nanoseconds into the main phase: its entry's last named op, or the start of the fault
    /// that exposed it when that came later.
    pub at: u64,
    /// The fault that exposed it (its op and aim, as [`faults_begun`] names it): what a bug
    /// needed, read off the runs that caught it. `None` when none of the run's faults was in
    /// force then or began after.
    pub exposed_by: Option<String>,
}

/// The run's first forbidden anomaly. `None` when the run is valid or no entry names an op (a
/// divergence seen only in the final replicas).
pub fn first_anomaly(ops: &[Op], results: &Value) -> Option<FirstAnomaly> {
    strings(&results["bad_anomaly_types"])
        .iter()
        .filter_map(|kind| exposed_of_kind(ops, results, kind))
        .min_by_key(|(at, _)| *at)
        .map(|(at, fault)| FirstAnomaly {
            at,
            exposed_by: fault.map(fault_name),
        })
}

/// As [`first_anomaly`]'s time, for the anomalies of one type (`lost-write`) only.
pub fn first_of_kind(ops: &[Op], results: &Value, kind: &str) -> Option<u64> {
    exposed_of_kind(ops, results, kind).map(|(at, _)| at)
}

/// When the first anomaly of `kind` existed, and the fault that exposed it (by name: see
/// [`exposing_fault_named`]).
fn exposed_of_kind<'a>(
    ops: &'a [Op],
    results: &Value,
    kind: &str,
) -> Option<(u64, Option<&'a Op>)> {
    let time_of = |i: u64| ops.get(i as usize).filter(|o| o.index == i).map(|o| o.time);
    let mut evidenced: Option<u64> = None;
    let mut written: Option<HashMap<u64, u64>> = None;
    for entry in results["anomalies"][kind].as_array().into_iter().flatten() {
        let mut idx = Vec::new();
        op_indices(entry, &mut idx);
        let mut finals = Vec::new();
        final_log_values(entry, &mut finals);
        let finals_written: Vec<u64> = if finals.is_empty() {
            Vec::new()
        } else {
            let at = written.get_or_insert_with(|| written_at(ops));
            finals.iter().filter_map(|v| at.get(v).copied()).collect()
        };
        let times = idx.into_iter().filter_map(time_of);
        if let Some(t) = times.chain(finals_written).max() {
            evidenced = Some(evidenced.map_or(t, |e| e.min(t)));
        }
    }
    let at = evidenced?;
    // What the responses alone prove existed then; a fault in force may have opened the window.
    if AnomalyKind::parse(kind).is_some_and(AnomalyKind::shown_by_responses) {
        return Some((at, in_force_named(ops, at)));
    }
    let exposed = exposing_fault(ops, at).map_or(at, |f| f.time.max(at));
    Some((exposed, exposing_fault_named(ops, at)))
}

/// The fault in force at `at`, else the first one to begin after it.
fn exposing_fault(ops: &[Op], at: u64) -> Option<&Op> {
    let faults = begun(ops, |_| true);
    in_force(ops, &faults, at).or_else(|| next_after(&faults, at))
}

/// As [`exposing_fault`], but a fault that stops something (a partition, a kill, a pause, a
/// failover) before a clock fault, in force or beginning next: the clock faults run on a
/// timeline of their own across the others and stop nothing.
fn exposing_fault_named(ops: &[Op], at: u64) -> Option<&Op> {
    in_force_named(ops, at).or_else(|| {
        let stopping = begun(ops, |o| !o.f.starts_with("clock-"));
        next_after(&stopping, at).or_else(|| next_after(&begun(ops, |_| true), at))
    })
}

/// The fault in force at `at`, one that stops something before a clock fault.
fn in_force_named(ops: &[Op], at: u64) -> Option<&Op> {
    let stopping = begun(ops, |o| !o.f.starts_with("clock-"));
    in_force(ops, &stopping, at).or_else(|| in_force(ops, &begun(ops, |_| true), at))
}

/// The first of `faults` to begin after `at`.
fn next_after<'a>(faults: &[&'a Op], at: u64) -> Option<&'a Op> {
    faults.iter().find(|f| f.time > at).copied()
}

/// The fault ops begun (invoked, not undoings) that `keep` keeps, in order.
fn begun(ops: &[Op], keep: impl Fn(&Op) -> bool) -> Vec<&Op> {
    ops.iter()
        .filter(|o| o.process == Process::Nemesis && o.kind == OpType::Invoke)
        .filter(|o| !UNDOING.contains(&o.f.as_str()) && keep(o))
        .collect()
}

/// The last of `faults` begun at or before `at`, if it was still in force then.
fn in_force<'a>(ops: &[Op], faults: &[&'a Op], at: u64) -> Option<&'a Op> {
    faults
        .iter()
        .rev()
        .find(|f| f.time <= at)
        .filter(|f| {
            let end = if SELF_HEALING.contains(&f.f.as_str()) {
                ops.iter()
                    .find(|o| o.index > f.index && o.process == Process::Nemesis)
                    .map(|o| o.time)
            } else {
                ops.iter()
                    .find(|o| {
                        o.index > f.index
                            && o.process == Process::Nemesis
                            && o.kind == OpType::Invoke
                            && UNDOING.contains(&o.f.as_str())
                    })
                    .map(|o| o.time)
            };
            end.is_none_or(|e| e >= at)
        })
        .copied()
}

/// A fault op as a reader names it: its op, and what it was aimed at (a partition's kind, a
/// kill's or pause's targets) when the op says.
fn fault_name(o: &Op) -> String {
    let aim = ["kind", "targets"]
        .iter()
        .find_map(|k| o.value.get(*k).and_then(Value::as_str));
    match aim {
        Some(aim) => format!("{} {aim}", o.f),
        None => o.f.clone(),
    }
}

/// The faults the nemesis began within the first `until` nanoseconds, in order, each as its
/// seconds into the run and its op, with what it was aimed at (a partition's kind, a kill's or
/// pause's targets) and `catch-up` for a node brought back catching up: what a run drew, to read
/// a miss against.
pub fn faults_begun(ops: &[Op], until: u64) -> Vec<String> {
    ops.iter()
        .filter(|o| o.process == Process::Nemesis && o.kind == OpType::Invoke && o.time <= until)
        .filter_map(|o| {
            let at = o.time as f64 / 1e9;
            if UNDOING.contains(&o.f.as_str()) {
                return o
                    .value
                    .get("catch_up")
                    .map(|_| format!("{at:.1} {} catching up", o.f));
            }
            Some(format!("{at:.1} {}", fault_name(o)))
        })
        .collect()
}

/// The fault ops (`handoff`, `start-partition`, ...) begun within the first `until`
/// nanoseconds, each once: what a schedule drew, without aims.
pub fn fault_ops_begun(ops: &[Op], until: u64) -> BTreeSet<String> {
    begun(ops, |o| o.time <= until)
        .into_iter()
        .map(|o| o.f.clone())
        .collect()
}

/// What the nemesis did in a run, for a person judging a verdict by what it survived: each fault
/// named as [`faults_begun`] names it, with how many times it began, in order of its first
/// beginning ("none" when no fault began).
pub fn faults_tally(ops: &[Op]) -> String {
    let mut tally: Vec<(String, usize)> = Vec::new();
    for o in begun(ops, |_| true) {
        let name = fault_name(o);
        match tally.iter_mut().find(|(f, _)| *f == name) {
            Some((_, n)) => *n += 1,
            None => tally.push((name, 1)),
        }
    }
    if tally.is_empty() {
        return "none".into();
    }
    tally
        .iter()
        .map(|(f, n)| format!("{f} ×{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn op(index: u64, time_s: f64, process: Process, kind: OpType, f: &str) -> Op {
        serde_json::from_value(json!({
            "index": index, "time": (time_s * 1e9) as u64,
            "process": match process { Process::Nemesis => json!("nemesis"), Process::Client(p) => json!(p) },
            "type": match kind { OpType::Invoke => "invoke", OpType::Ok => "ok", OpType::Fail => "fail", OpType::Info => "info" },
            "f": f, "value": {}
        }))
        .unwrap()
    }

    /// When the first anomaly existed.
    fn first_at(ops: &[Op], results: &Value) -> Option<u64> {
        first_anomaly(ops, results).map(|a| a.at)
    }

    /// The fault that exposed the first anomaly.
    fn exposed_by(ops: &[Op], results: &Value) -> Option<String> {
        first_anomaly(ops, results).and_then(|a| a.exposed_by)
    }

    /// A nemesis invocation aimed as `value` says.
    fn fault(index: u64, time_s: f64, f: &str, value: Value) -> Op {
        let mut o = op(index, time_s, Process::Nemesis, OpType::Invoke, f);
        o.value = value;
        o
    }

    fn history() -> Vec<Op> {
        let (n, c) = (Process::Nemesis, Process::Client(0));
        vec![
            op(0, 1.0, n, OpType::Invoke, "start-partition"),
            op(1, 1.1, n, OpType::Info, "start-partition"),
            op(2, 2.0, c, OpType::Invoke, "send"),
            op(3, 2.5, c, OpType::Ok, "send"),
            op(4, 4.0, n, OpType::Invoke, "stop-partition"),
            op(5, 4.1, n, OpType::Info, "stop-partition"),
            op(6, 5.0, c, OpType::Invoke, "send"),
            op(7, 5.5, c, OpType::Ok, "send"),
            op(8, 7.0, n, OpType::Invoke, "bounce"),
            op(9, 9.0, n, OpType::Info, "bounce"),
        ]
    }

    #[test]
    fn an_ack_during_a_fault_is_an_anomaly_when_acknowledged() {
        let results = json!({"valid": false, "bad_anomaly_types": ["lost-write"],
            "anomalies": {"lost-write": [{"op_index": 7}, {"op_index": 3}]}});
        assert_eq!(first_at(&history(), &results), Some(2_500_000_000));
    }

    #[test]
    fn an_ack_before_the_fault_that_loses_it_counts_from_that_fault() {
        let results = json!({"valid": false, "bad_anomaly_types": ["lost-write"],
            "anomalies": {"lost-write": [{"op_index": 7}]}});
        assert_eq!(first_at(&history(), &results), Some(7_000_000_000));
    }

    #[test]
    fn observations_count_from_the_later_one_and_replicas_alone_have_no_time() {
        let results = json!({"valid": false,
            "bad_anomaly_types": ["inconsistent-offsets", "divergence"],
            "anomalies": {
                "inconsistent-offsets": [{"values": [{"value": 1, "seen_by": {"send": 3}},
                                                     {"value": 2, "seen_by": {"poll": 7}}]}],
                "divergence": [{"replicas": [{"node": "n1"}, {"node": "n2"}]}]}});
        assert_eq!(first_at(&history(), &results), Some(7_000_000_000));
        let only_replicas = json!({"valid": false, "bad_anomaly_types": ["divergence"],
            "anomalies": {"divergence": [{"replicas": []}]}});
        assert_eq!(first_at(&history(), &only_replicas), None);
        assert_eq!(first_at(&history(), &json!({"valid": true})), None);
    }

    #[test]
    fn an_offset_disagreeing_with_the_final_log_counts_from_when_the_other_value_was_written() {
        let mut ops = history();
        ops[2].value = json!({"values": [10]});
        ops[3].value = json!({"offset": 4, "values": [10]});
        ops[6].value = json!({"values": [11, 12]});
        ops[7].value = json!({"offset": 4, "values": [11, 12]});
        let results = json!({"valid": false,
            "bad_anomaly_types": ["inconsistent-offsets", "lost-write"],
            "anomalies": {
                "inconsistent-offsets": [{"offset": 4, "values": [
                    {"value": 11, "seen_by": {"final_log": {"cluster": "a", "node": "n1"}}},
                    {"value": 10, "seen_by": {"send": 3}}]}],
                "lost-write": [{"op_index": 3, "value": 10,
                                "final_log": {"high_watermark": 9, "node": "n1"}}]}});
        assert_eq!(
            first_of_kind(&ops, &results, "inconsistent-offsets"),
            Some(7_000_000_000),
            "11 was acknowledged at 5.5 s, when no fault was in force; the next began at 7 s"
        );
        assert_eq!(
            first_of_kind(&ops, &results, "lost-write"),
            Some(2_500_000_000)
        );
    }

    #[test]
    fn one_type_counts_from_its_own_entries() {
        let results = json!({"valid": false,
            "bad_anomaly_types": ["inconsistent-offsets", "lost-write"],
            "anomalies": {
                "inconsistent-offsets": [{"values": [{"value": 1, "seen_by": {"send": 3}}]}],
                "lost-write": [{"op_index": 7}]}});
        assert_eq!(first_at(&history(), &results), Some(2_500_000_000));
        assert_eq!(
            first_of_kind(&history(), &results, "lost-write"),
            Some(7_000_000_000)
        );
        assert_eq!(first_of_kind(&history(), &results, "duplicate"), None);
    }

    #[test]
    fn what_responses_prove_exists_when_they_complete_with_or_without_a_fault() {
        let mut ops = history();
        ops[0].value = json!({"kind": "leader"});
        // A poll completed in the calm at 5.5 s: no fault in force, none to wait for.
        let calm = json!({"valid": false, "bad_anomaly_types": ["read-above-high-watermark"],
            "anomalies": {"read-above-high-watermark": [{"op_index": 7}]}});
        assert_eq!(first_at(&ops, &calm), Some(5_500_000_000));
        assert_eq!(exposed_by(&ops, &calm), None);
        // One completed during the partition names it.
        let during = json!({"valid": false, "bad_anomaly_types": ["ack-above-high-watermark"],
            "anomalies": {"ack-above-high-watermark": [{"op_index": 3, "send": {"op_index": 2}}]}});
        assert_eq!(first_at(&ops, &during), Some(2_500_000_000));
        assert_eq!(
            exposed_by(&ops, &during).as_deref(),
            Some("start-partition leader")
        );
    }

    #[test]
    fn the_exposing_fault_is_the_one_in_force_or_the_next_to_begin() {
        let mut ops = history();
        ops[0].value = json!({"kind": "leader"});
        let during = json!({"valid": false, "bad_anomaly_types": ["lost-write"],
            "anomalies": {"lost-write": [{"op_index": 3}]}});
        assert_eq!(
            exposed_by(&ops, &during).as_deref(),
            Some("start-partition leader")
        );
        // Acknowledged in the calm after the partition: lost by the bounce that came next.
        let after = json!({"valid": false, "bad_anomaly_types": ["lost-write"],
            "anomalies": {"lost-write": [{"op_index": 7}]}});
        assert_eq!(exposed_by(&ops, &after).as_deref(), Some("bounce"));
        // The earliest anomaly of any type names the fault.
        let both = json!({"valid": false,
            "bad_anomaly_types": ["lost-write", "inconsistent-offsets"],
            "anomalies": {"lost-write": [{"op_index": 7}],
                          "inconsistent-offsets": [{"values": [{"value": 1, "seen_by": {"send": 3}}]}]}});
        assert_eq!(
            exposed_by(&ops, &both).as_deref(),
            Some("start-partition leader")
        );
        // After the last fault there is none to name; nor in a valid run.
        let late = op(10, 12.0, Process::Client(0), OpType::Ok, "send");
        ops.push(late);
        let unexposed = json!({"valid": false, "bad_anomaly_types": ["lost-write"],
            "anomalies": {"lost-write": [{"op_index": 10}]}});
        assert_eq!(exposed_by(&ops, &unexposed), None);
        assert_eq!(exposed_by(&ops, &json!({"valid": true})), None);
    }

    #[test]
    fn a_clock_fault_is_named_only_when_nothing_that_stops_anything_is_in_force() {
        let (n, c) = (Process::Nemesis, Process::Client(0));
        let mut ops = vec![
            op(0, 1.0, n, OpType::Invoke, "start-partition"),
            op(1, 1.5, n, OpType::Invoke, "clock-strobe"),
            op(2, 2.0, c, OpType::Invoke, "send"),
            op(3, 2.5, c, OpType::Ok, "send"),
            op(4, 4.0, n, OpType::Invoke, "stop-partition"),
            op(5, 4.5, n, OpType::Invoke, "clock-skew"),
            op(6, 5.0, c, OpType::Invoke, "send"),
            op(7, 5.5, c, OpType::Ok, "send"),
        ];
        ops[0].value = json!({"kind": "leader"});
        let lost = |i: u64| {
            json!({"valid": false, "bad_anomaly_types": ["lost-write"],
                   "anomalies": {"lost-write": [{"op_index": i}]}})
        };
        assert_eq!(
            exposed_by(&ops, &lost(3)).as_deref(),
            Some("start-partition leader")
        );
        assert_eq!(exposed_by(&ops, &lost(7)).as_deref(), Some("clock-skew"));
        assert_eq!(first_at(&ops, &lost(3)), Some(2_500_000_000));
        // Acknowledged in a calm: the next fault that stops something, not the clock's.
        ops.truncate(5);
        ops.extend([
            op(5, 5.0, c, OpType::Invoke, "send"),
            op(6, 5.5, c, OpType::Ok, "send"),
            op(7, 6.0, n, OpType::Invoke, "clock-strobe"),
            op(8, 7.0, n, OpType::Invoke, "handoff"),
        ]);
        assert_eq!(exposed_by(&ops, &lost(6)).as_deref(), Some("handoff"));
    }

    #[test]
    fn the_fault_ops_begun_are_named_once_without_aims_or_undoings() {
        let ops = history();
        let begun: Vec<String> = fault_ops_begun(&ops, 30_000_000_000).into_iter().collect();
        assert_eq!(begun, ["bounce", "start-partition"]);
        let early: Vec<String> = fault_ops_begun(&ops, 5_000_000_000).into_iter().collect();
        assert_eq!(early, ["start-partition"]);
    }

    #[test]
    fn the_tally_counts_each_fault_by_its_aim_and_leaves_out_undoings() {
        let mut ops = history();
        ops[0].value = json!({"kind": "leader"});
        ops.extend([
            fault(10, 10.0, "start-partition", json!({"kind": "leader"})),
            fault(11, 12.0, "start-partition", json!({"kind": "halves"})),
        ]);
        assert_eq!(
            faults_tally(&ops),
            "start-partition leader ×2, bounce ×1, start-partition halves ×1"
        );
        assert_eq!(faults_tally(&ops[2..4]), "none");
    }

    #[test]
    fn the_faults_begun_name_their_aim_and_catch_ups_but_not_their_undoings() {
        let mut ops = history();
        ops[0].value = json!({"kind": "majority"});
        ops.extend([
            fault(10, 10.0, "kill", json!({"targets": "leader"})),
            fault(11, 14.25, "start", json!({"nodes": ["n1"], "catch_up": {}})),
            fault(12, 31.0, "pause", json!({})),
        ]);
        assert_eq!(
            faults_begun(&ops, 30_000_000_000),
            [
                "1.0 start-partition majority",
                "7.0 bounce",
                "10.0 kill leader",
                "14.2 start catching up"
            ]
        );
        assert!(faults_begun(&ops, 0).is_empty());
    }
}
