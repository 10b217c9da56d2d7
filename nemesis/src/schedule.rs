//! Scripted fault schedules: a JSON list of timed fault ops in the form the history records them,
//! so the faults of a recorded run can be replayed against a fresh cluster (`tidemark test
//! --nemesis-schedule FILE`).
//!
//! A schedule file is either
//!
//! - a JSON list of ops `{"time": NANOS, "f": "start-partition", "value": {...}}` (or `"time_s":
//!   SECONDS`), client ops skipped; or
//! - history ops, as a JSON list holding `info`s (every entry a history op) or as a
//!   `history.jsonl` (its main phase only),
//!   whose faults are done again the way `tidemark replay` does them
//!   ([`crate::shrink::recorded_schedule`]): each at the time it was invoked, with the value its
//!   `info` recorded (what was actually done) and the client burst its invocation asked for.
//!
//! Times are since the test started and must not decrease. Every op is checked against the fault
//! kind that performs it; errors name the file, the op's index and the field.
//!
//! An op acts on the cluster its value names (`"cluster": "b"`), else on the cluster a history
//! line records, else on the test's first cluster; its nodes are checked against that cluster's.

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;

use serde_json::Value;
use tidemark_harness::generator::{Context, Generator, Next, Planned, Rng, Worker};
use tidemark_harness::op::Invocation;

use tidemark_checkers::read_history;
use tidemark_harness::op::Op;

use crate::fault::Faults;
use crate::shrink::{recorded_schedule_from, ScheduledOp};
use crate::Kind;

/// One timed op of a schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct Timed {
    /// Nanoseconds since the test started.
    pub time: u64,
    /// The op.
    pub op: Invocation,
}

/// A checked schedule.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Schedule {
    /// The ops, in time order.
    pub ops: Vec<Timed>,
}

impl Schedule {
    /// Reads and checks the schedule at `path` for a test of `clusters` (each cluster's name and
    /// node names, the first the default), routing each op to the fault kind in `faults` that
    /// performs it.
    pub fn load(path: &Path, clusters: &[ClusterNodes], faults: &Faults) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        Self::parse(&text, clusters, faults).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses and checks schedule text (a JSON list or a history.jsonl).
    pub fn parse(text: &str, clusters: &[ClusterNodes], faults: &Faults) -> Result<Self, String> {
        let trimmed = text.trim_start();
        let (entries, what) = if trimmed.starts_with('[') {
            let list: Vec<Value> =
                serde_json::from_str(text).map_err(|e| format!("not a JSON list of ops: {e}"))?;
            let has_infos = list
                .iter()
                .any(|o| o.get("type").and_then(Value::as_str) == Some("info"));
            let entries = if has_infos {
                recorded_entries(list)?
            } else {
                list.into_iter()
                    .enumerate()
                    .filter(|(_, o)| o.get("process").is_none_or(|p| p == "nemesis"))
                    .collect()
            };
            (entries, "op")
        } else {
            (history_entries(text)?, "line")
        };
        let mut ops = Vec::with_capacity(entries.len());
        let mut last = 0u64;
        for (index, entry) in entries {
            let at = |e: String| format!("{what} {index}: {e}");
            let op = parse_op(&entry, clusters, faults).map_err(at)?;
            if op.time < last {
                return Err(at(format!(
                    "field `time`: {} ns is before the previous op's {last} ns; times must not \
                     decrease",
                    op.time
                )));
            }
            last = op.time;
            ops.push(op);
        }
        Ok(Schedule { ops })
    }

    /// The fault kinds the schedule uses (`power` too for a last stand that cuts a follower's
    /// power).
    pub fn kinds(&self) -> Vec<Kind> {
        let mut kinds: BTreeSet<Kind> = self
            .ops
            .iter()
            .filter_map(|t| Kind::of_op(&t.op.f))
            .collect();
        // A last stand asked to cut a follower's power needs the data where power can be lost.
        if self
            .ops
            .iter()
            .any(|t| t.op.f == "last-stand" && crate::stand::loses_power(&t.op.value))
        {
            kinds.insert(Kind::Power);
        }
        kinds.into_iter().collect()
    }

    /// Replays the schedule on the nemesis worker.
    pub fn generator(&self) -> Replay {
        Replay {
            ops: self.ops.iter().cloned().collect(),
        }
    }
}

/// The faults of a list of history ops, as the run did them ([`recorded_schedule_from`]), each
/// with its position in the list.
fn recorded_entries(list: Vec<Value>) -> Result<Vec<(usize, Value)>, String> {
    let ops = list
        .into_iter()
        .enumerate()
        .map(|(i, o)| {
            serde_json::from_value::<Op>(o).map_err(|e| format!("op {i}: not a history op: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(recorded_schedule_from(&ops, u64::MAX)
        .into_iter()
        .map(|(at, op)| (at, scheduled_value(&op)))
        .collect())
}

/// The faults of a history's main phase (those invoked at or before the header's time limit),
/// as the run did them ([`recorded_schedule_from`]), each with the line of its `info`.
fn history_entries(text: &str) -> Result<Vec<(usize, Value)>, String> {
    let mut reader = read_history(text.as_bytes()).map_err(|e| e.to_string())?;
    let limit_ns = reader
        .test()
        .get("time_limit_s")
        .and_then(Value::as_f64)
        .map_or(u64::MAX, |s| (s * 1e9) as u64);
    let (mut ops, mut lines) = (Vec::new(), Vec::new());
    while let Some(op) = reader.next() {
        ops.push(op.map_err(|e| e.to_string())?);
        lines.push(reader.line() as usize);
    }
    Ok(recorded_schedule_from(&ops, limit_ns)
        .into_iter()
        .map(|(at, op)| (lines[at], scheduled_value(&op)))
        .collect())
}

fn scheduled_value(op: &ScheduledOp) -> Value {
    serde_json::to_value(op).expect("a scheduled op is plain JSON")
}

/// A cluster's name and its nodes' names.
pub type ClusterNodes = (String, Vec<String>);

/// One op, checked by the fault kind that performs it against the nodes of its cluster.
fn parse_op(entry: &Value, clusters: &[ClusterNodes], faults: &Faults) -> Result<Timed, String> {
    if !entry.is_object() {
        return Err(format!(
            "expected an object with `time`, `f` and `value`, got {entry}"
        ));
    }
    let time = match (entry.get("time"), entry.get("time_s")) {
        (Some(t), _) => t.as_u64().ok_or_else(|| {
            format!("field `time`: expected nanoseconds as a non-negative integer, got {t}")
        })?,
        (None, Some(s)) => match s.as_f64() {
            Some(s) if s >= 0.0 && s.is_finite() => (s * 1e9) as u64,
            _ => {
                return Err(format!(
                    "field `time_s`: expected non-negative seconds, got {s}"
                ))
            }
        },
        (None, None) => return Err("field `time`: missing (nanoseconds since the start)".into()),
    };
    let f = match entry.get("f") {
        Some(Value::String(f)) => f.clone(),
        Some(other) => return Err(format!("field `f`: expected a string, got {other}")),
        None => return Err("field `f`: missing".into()),
    };
    let fault = faults
        .iter()
        .find(|k| k.fs().contains(&f.as_str()))
        .ok_or_else(|| {
            let known: Vec<&str> = faults.iter().flat_map(|k| k.fs().iter().copied()).collect();
            format!(
                "field `f`: unknown fault op {f:?}; known: {}",
                known.join(", ")
            )
        })?;
    let mut value = entry
        .get("value")
        .cloned()
        .unwrap_or(Value::Object(Default::default()));
    let named = match (value.get("cluster"), entry.get("cluster")) {
        (Some(Value::String(c)), _) => Some((c.clone(), "value.cluster")),
        (Some(other), _) => {
            return Err(format!(
                "field `value.cluster`: expected a cluster name, got {other}"
            ))
        }
        (None, Some(Value::String(c))) => Some((c.clone(), "cluster")),
        (None, _) => None,
    };
    let (cluster, nodes) = match &named {
        None => clusters.first().ok_or("the test has no cluster")?,
        Some((name, field)) => clusters.iter().find(|(c, _)| c == name).ok_or_else(|| {
            let known: Vec<&str> = clusters.iter().map(|(c, _)| c.as_str()).collect();
            format!(
                "field `{field}`: unknown cluster {name:?}; clusters: {}",
                known.join(", ")
            )
        })?,
    };
    // An op for another cluster than the first says so in its value, which is what the engine
    // reads when it performs the op.
    if Some(cluster) != clusters.first().map(|c| &c.0) {
        if let Some(map) = value.as_object_mut() {
            map.insert("cluster".into(), Value::String(cluster.clone()));
        }
    }
    let (fault_value, _) = crate::take_burst(&value).map_err(|e| format!("{f}: {e}"))?;
    fault
        .parse(&f, &fault_value, nodes)
        .map_err(|e| format!("{f}: {}", in_value(&e)))?;
    Ok(Timed {
        time,
        op: Invocation { f, value },
    })
}

/// Prefixes the fields an error names with `value.`, since they are inside the op's value.
fn in_value(e: &str) -> String {
    e.replace("field `", "field `value.")
}

/// The replaying generator: each op at its time on the nemesis worker, one at a time.
pub struct Replay {
    ops: VecDeque<Timed>,
}

impl Generator for Replay {
    fn next(&mut self, ctx: &Context, _rng: &mut Rng) -> Next {
        if self.ops.is_empty() {
            return Next::Done;
        }
        if !ctx.free.contains(&Worker::Nemesis) {
            return Next::Pending(None);
        }
        let t = self.ops.pop_front().expect("checked non-empty");
        Next::Op(Planned {
            worker: Worker::Nemesis,
            time: t.time.max(ctx.time),
            op: t.op,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nodes() -> Vec<ClusterNodes> {
        vec![("a".into(), ["n1", "n2", "n3"].map(String::from).to_vec())]
    }

    fn parse(text: &str) -> Result<Schedule, String> {
        Schedule::parse(text, &nodes(), &crate::all_faults(&Default::default()))
    }

    #[test]
    fn lists_of_ops_parse_with_times_in_ns_or_seconds() {
        let s = parse(
            r#"[{"time": 1000, "f": "start-partition", "value": {"kind": "one"}},
                {"time_s": 2.5, "f": "stop-partition"},
                {"time": 3000000000, "f": "kill", "value": {"nodes": ["n2"]}}]"#,
        )
        .unwrap();
        assert_eq!(s.ops.len(), 3);
        assert_eq!(s.ops[1].time, 2_500_000_000);
        assert_eq!(s.ops[1].op.value, json!({}));
        assert_eq!(s.kinds(), vec![Kind::Partition, Kind::Kill]);
    }

    #[test]
    fn history_lines_keep_nemesis_infos_only() {
        let s = parse(
            r#"[{"index": 0, "time": 5, "process": 0, "type": "invoke", "f": "send", "value": {}},
                {"index": 1, "time": 6, "process": "nemesis", "type": "invoke", "f": "kill",
                 "value": {"targets": "one"}},
                {"index": 2, "time": 9, "process": "nemesis", "type": "info", "f": "kill",
                 "value": {"nodes": ["n3"], "targets": "one"}}]"#,
        )
        .unwrap();
        assert_eq!(s.ops.len(), 1);
        assert_eq!(s.ops[0].op.value["nodes"], json!(["n3"]));
        assert_eq!(s.ops[0].time, 6, "the fault is done when it was invoked");
    }

    #[test]
    fn a_history_file_replays_its_main_phase_faults() {
        let text = [
            json!({"tidemark_history": 1, "test": {"time_limit_s": 10.0}}),
            json!({"index": 0, "time": 1_000_000_000u64, "process": "nemesis", "type": "invoke",
                   "f": "pause", "value": {"targets": "one", "burst_ms": 500}}),
            json!({"index": 1, "time": 1_100_000_000u64, "process": "nemesis", "type": "info",
                   "f": "pause", "value": {"nodes": ["n1"], "targets": "one"}}),
            json!({"index": 2, "time": 11_000_000_000u64, "process": "nemesis", "type": "info",
                   "f": "resume", "value": {"nodes": ["n1", "n2", "n3"]}}),
        ]
        .map(|v| v.to_string())
        .join("\n");
        let s = parse(&text).unwrap();
        assert_eq!(s.ops.len(), 1);
        assert_eq!(s.ops[0].op.f, "pause");
        // As `tidemark replay` does it: at its invocation, with the clients' burst before it.
        assert_eq!(s.ops[0].time, 1_000_000_000);
        assert_eq!(
            s.ops[0].op.value,
            json!({"nodes": ["n1"], "targets": "one", "burst_ms": 500})
        );
    }

    #[test]
    fn a_bad_history_line_is_named() {
        let text = [
            json!({"tidemark_history": 1, "test": {"time_limit_s": 10.0}}).to_string(),
            json!({"index": 0, "time": 1_000_000_000u64, "process": "nemesis", "type": "invoke",
                   "f": "kill", "value": {"targets": "one"}})
            .to_string(),
            json!({"index": 1, "time": 1_100_000_000u64, "process": "nemesis", "type": "info",
                   "f": "kill", "value": {"nodes": ["n7"]}})
            .to_string(),
        ]
        .join("\n");
        let e = parse(&text).unwrap_err();
        assert!(e.starts_with("line 3: kill: field `value.nodes[0]`"), "{e}");
        let e = parse(&format!("{text}\n{{\"index\": 2}}\n")).unwrap_err();
        assert!(e.starts_with("line 4:"), "{e}");
    }

    #[test]
    fn errors_name_the_index_and_the_field() {
        let e =
            parse(r#"[{"time": 1, "f": "kill", "value": {"nodes": ["n1", "n9"]}}]"#).unwrap_err();
        assert!(e.starts_with("op 0: kill: field `value.nodes[1]`"), "{e}");
        let e = parse(r#"[{"time": 1, "f": "stop-partition"}, {"time": 2, "f": "explode"}]"#)
            .unwrap_err();
        assert!(
            e.starts_with("op 1: field `f`: unknown fault op \"explode\""),
            "{e}"
        );
        assert!(e.contains("unclean-election"), "{e}");
        let e = parse(r#"[{"f": "stop-partition"}]"#).unwrap_err();
        assert!(e.contains("op 0: field `time`"), "{e}");
        let e =
            parse(r#"[{"time": 9, "f": "stop-partition"}, {"time": 3, "f": "stop-partition"}]"#)
                .unwrap_err();
        assert!(
            e.contains("op 1: field `time`") && e.contains("decrease"),
            "{e}"
        );
        let e = parse(r#"[{"time": -1, "f": "stop-partition"}]"#).unwrap_err();
        assert!(e.contains("op 0: field `time`"), "{e}");
        let e = parse(r#"{"ops": []}"#).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e =
            parse(r#"[{"time": 1, "f": "start-partition", "value": {"kind": "x"}}]"#).unwrap_err();
        assert!(e.contains("field `value.kind`"), "{e}");
    }

    #[test]
    fn an_op_acts_on_the_cluster_it_names_and_is_checked_against_its_nodes() {
        let clusters: Vec<ClusterNodes> = ["a", "b"]
            .map(|c| (c.to_string(), (1..=3).map(|i| format!("{c}{i}")).collect()))
            .to_vec();
        let faults = crate::all_faults(&Default::default());
        let parse = |text: &str| Schedule::parse(text, &clusters, &faults);
        let s = parse(
            r#"[{"time": 1, "f": "kill", "value": {"nodes": ["a2"]}},
                {"time": 2, "f": "kill", "value": {"cluster": "b", "nodes": ["b2"]}}]"#,
        )
        .unwrap();
        let values: Vec<&Value> = s.ops.iter().map(|t| &t.op.value).collect();
        assert_eq!(
            values,
            [
                &json!({"nodes": ["a2"]}),
                &json!({"cluster": "b", "nodes": ["b2"]}),
            ]
        );
        // History ops name their cluster beside the value.
        let s = parse(
            r#"[{"index": 0, "time": 3, "process": "nemesis", "type": "invoke", "cluster": "b",
                 "f": "start", "value": {"nodes": ["b2"]}},
                {"index": 1, "time": 4, "process": "nemesis", "type": "info", "cluster": "b",
                 "f": "start", "value": {"nodes": ["b2"]}}]"#,
        )
        .unwrap();
        assert_eq!(s.ops[0].op.value, json!({"cluster": "b", "nodes": ["b2"]}));
        let e = parse(
            r#"[{"time": 1, "f": "kill", "value": {"nodes": ["a2"]}},
                {"index": 1, "time": 4, "process": "nemesis", "type": "info", "f": "start"}]"#,
        )
        .unwrap_err();
        assert!(e.starts_with("op 0: not a history op"), "{e}");
        let e = parse(r#"[{"time": 1, "f": "kill", "value": {"nodes": ["b2"]}}]"#).unwrap_err();
        assert!(
            e.starts_with("op 0: kill: field `value.nodes[0]`: unknown node \"b2\""),
            "{e}"
        );
        let e = parse(r#"[{"time": 1, "f": "kill", "value": {"cluster": "c", "nodes": ["c1"]}}]"#)
            .unwrap_err();
        assert_eq!(
            e,
            "op 0: field `value.cluster`: unknown cluster \"c\"; clusters: a, b"
        );
        let e = parse(r#"[{"time": 1, "cluster": "z", "f": "stop-partition"}]"#).unwrap_err();
        assert!(
            e.starts_with("op 0: field `cluster`: unknown cluster \"z\""),
            "{e}"
        );
    }

    #[test]
    fn files_are_named_in_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.json");
        std::fs::write(
            &path,
            r#"[{"time": 1, "f": "pause", "value": {"targets": 3}}]"#,
        )
        .unwrap();
        let faults = crate::all_faults(&Default::default());
        let e = Schedule::load(&path, &nodes(), &faults).unwrap_err();
        assert!(
            e.starts_with(&format!(
                "{}: op 0: pause: field `value.targets`",
                path.display()
            )),
            "{e}"
        );
        let e = Schedule::load(&dir.path().join("missing.json"), &nodes(), &faults).unwrap_err();
        assert!(e.contains("cannot read"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn replay_emits_each_op_at_its_time_on_the_nemesis_worker() {
        let s = parse(
            r#"[{"time": 1000000, "f": "stop-partition"},
                {"time": 500000000, "f": "stop-partition"}]"#,
        )
        .unwrap();
        let mut g = s.generator();
        let h = tidemark_harness::interpreter::simulate(&mut g, 2, 1, 10, |_| {
            (tidemark_harness::op::Outcome::Info, json!({}), 10)
        })
        .await;
        let times: Vec<u64> = h
            .iter()
            .filter(|o| o.kind == tidemark_harness::op::OpType::Invoke)
            .map(|o| o.time)
            .collect();
        // Whole milliseconds: the interpreter waits on tokio's timers, which count in them.
        assert_eq!(times, vec![1_000_000, 500_000_000]);
    }
}
