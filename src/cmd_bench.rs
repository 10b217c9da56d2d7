//! `tidemark bench-detection`: how well the default faults find each injectable one-cluster bug,
//! and whether they ever accuse the correct broker. Runs `tidemark test` (this executable) for
//! every bug over `--seeds` seeds and for the correct broker over `--correct-seeds`, then prints
//! a Markdown table: caught runs, the median seconds into a run until its first anomaly, and
//! false alarms.
//!
//! When an anomaly happened comes from the history, not from when the checker noticed it: the
//! earliest anomaly entry's ops (the acknowledgement of a lost write, the observations of an
//! offset that disagree) give the time it was evidenced, and the fault that exposed it is the
//! one in force then, else the next to begin; the anomaly exists once both happened.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tidemark_checkers::{read_history, Op, OpType, Process};

/// The catalogue's one-cluster bugs (broker/src/faults.rs); the mirroring bugs need two
/// clusters and a failover schedule.
const ONE_CLUSTER_BUGS: &[&str] = &[
    "hw-truncation",
    "ack-before-replication",
    "accept-stale-epoch",
    "no-strict-min-isr",
    "read-past-high-watermark",
    "isr-join-before-caught-up",
    "hw-from-sent-records",
    "ack-on-leadership-loss",
];

/// Fault ops that undo themselves before their `info`.
const SELF_HEALING: &[&str] = &["bounce", "handoff", "power-loss", "unclean-election"];

/// Ops that undo a fault (or heal at the end): they start nothing.
const UNDOING: &[&str] = &[
    "stop-partition",
    "start",
    "resume",
    "clock-reset",
    "stop-loss",
];

/// Arguments of `tidemark bench-detection`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Main phase of every run, seconds.
    #[arg(long, default_value_t = 30, value_name = "S")]
    time_limit: u64,
    /// Seeds per bug (1, 2, ... from --first-seed).
    #[arg(long, default_value_t = 5, value_name = "N")]
    seeds: u64,
    /// Seeds of the correct broker (1, 2, ... from --first-seed).
    #[arg(long, default_value_t = 20, value_name = "N")]
    correct_seeds: u64,
    /// The first seed of every series, to extend an earlier matrix with more seeds.
    #[arg(long, default_value_t = 1, value_name = "N")]
    first_seed: u64,
    /// Time limit of the correct broker's runs (default: --time-limit).
    #[arg(long, value_name = "S")]
    correct_time_limit: Option<u64>,
    /// Bugs to run, comma separated (default: every one-cluster bug of the catalogue).
    #[arg(long, value_delimiter = ',', value_name = "NAMES")]
    bugs: Option<Vec<String>>,
    /// The tidemark executable whose `test` is measured (default: this one), to measure an
    /// older build side by side with the same judging.
    #[arg(long, value_name = "PATH")]
    tidemark: Option<PathBuf>,
    /// Where run directories go.
    #[arg(long, default_value = "store-bench", value_name = "DIR")]
    store: PathBuf,
    /// Also write the table to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// More `tidemark test` arguments for every run, after `--`.
    #[arg(last = true)]
    test_args: Vec<String>,
}

/// How one run ended.
struct Outcome {
    valid: Option<bool>,
    anomalies: Vec<String>,
    first_anomaly_s: Option<f64>,
    wall_s: f64,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let exe = match args.tidemark.clone().map_or_else(std::env::current_exe, Ok) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("tidemark bench-detection: cannot find this executable: {e}");
            return crate::EXIT_HARNESS_FAILED;
        }
    };
    let bugs: Vec<String> = args
        .bugs
        .clone()
        .unwrap_or_else(|| ONE_CLUSTER_BUGS.iter().map(|b| b.to_string()).collect());
    let mut rows = Vec::new();
    for bug in &bugs {
        let mut outcomes = Vec::new();
        for seed in args.first_seed..args.first_seed + args.seeds {
            match one_run(&exe, &args, Some(bug), seed, args.time_limit) {
                Ok(o) => outcomes.push(o),
                Err(e) => {
                    eprintln!("tidemark bench-detection: {bug} seed {seed}: {e}");
                    return crate::EXIT_HARNESS_FAILED;
                }
            }
        }
        rows.push(bug_row(bug, &outcomes));
    }
    let limit = args.correct_time_limit.unwrap_or(args.time_limit);
    let mut alarms = Vec::new();
    for seed in args.first_seed..args.first_seed + args.correct_seeds {
        match one_run(&exe, &args, None, seed, limit) {
            Ok(o) => alarms.push(o),
            Err(e) => {
                eprintln!("tidemark bench-detection: correct broker seed {seed}: {e}");
                return crate::EXIT_HARNESS_FAILED;
            }
        }
    }
    let table = render(&args, &rows, &alarms, limit);
    println!("{table}");
    if let Some(out) = &args.out {
        if let Err(e) = std::fs::write(out, &table) {
            eprintln!("tidemark bench-detection: {}: {e}", out.display());
            return crate::EXIT_HARNESS_FAILED;
        }
    }
    0
}

/// One `tidemark test` run, judged from its run directory.
fn one_run(
    exe: &Path,
    args: &Args,
    bug: Option<&str>,
    seed: u64,
    limit: u64,
) -> Result<Outcome, String> {
    let store = args
        .store
        .join(format!("{}-{seed}", bug.unwrap_or("correct")));
    let started = std::time::Instant::now();
    let mut cmd = Command::new(exe);
    cmd.arg("test")
        .args([
            "--time-limit",
            &limit.to_string(),
            "--seed",
            &seed.to_string(),
        ])
        .arg("--quiet")
        .arg("--store")
        .arg(&store)
        .args(&args.test_args);
    if let Some(b) = bug {
        cmd.args(["--inject-bug", b]);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run tidemark test: {e}"))?;
    let wall_s = started.elapsed().as_secs_f64();
    let dir = std::fs::canonicalize(store.join("latest"))
        .map_err(|e| format!("{}: no run directory: {e}", store.display()))?;
    let results: Value = std::fs::read(dir.join("results.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            format!(
                "{}: no results.json (exit {:?}): {}",
                dir.display(),
                out.status.code(),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let history =
        File::open(dir.join("history.jsonl")).map_err(|e| format!("{}: {e}", dir.display()))?;
    let ops: Vec<Op> = read_history(BufReader::new(history))
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let outcome = Outcome {
        valid: results["valid"].as_bool(),
        anomalies: strings(&results["bad_anomaly_types"]),
        first_anomaly_s: first_anomaly(&ops, &results).map(|ns| ns as f64 / 1e9),
        wall_s,
    };
    eprintln!(
        "{} seed {seed}: valid {:?} {:?} first anomaly {:?} s, {:.0} s wall, {}",
        bug.unwrap_or("correct"),
        outcome.valid,
        outcome.anomalies,
        outcome.first_anomaly_s,
        outcome.wall_s,
        dir.display()
    );
    Ok(outcome)
}

fn strings(v: &Value) -> Vec<String> {
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

/// Nanoseconds into the main phase at which the first forbidden anomaly existed: its entry's
/// last named op, or the start of the fault that exposed it when that came later. `None` when
/// the run is valid or no entry names an op (a divergence seen only in the final replicas).
fn first_anomaly(ops: &[Op], results: &Value) -> Option<u64> {
    let time_of = |i: u64| ops.get(i as usize).filter(|o| o.index == i).map(|o| o.time);
    let mut evidenced: Option<u64> = None;
    for kind in strings(&results["bad_anomaly_types"]) {
        for entry in results["anomalies"][&kind].as_array().into_iter().flatten() {
            let mut idx = Vec::new();
            op_indices(entry, &mut idx);
            if let Some(t) = idx.into_iter().filter_map(time_of).max() {
                evidenced = Some(evidenced.map_or(t, |e| e.min(t)));
            }
        }
    }
    let at = evidenced?;
    Some(exposing_fault(ops, at).map_or(at, |f| f.max(at)))
}

/// The start of the fault in force at `at`, else of the first one to begin after it.
fn exposing_fault(ops: &[Op], at: u64) -> Option<u64> {
    let faults: Vec<&Op> = ops
        .iter()
        .filter(|o| o.process == Process::Nemesis && o.kind == OpType::Invoke)
        .filter(|o| !UNDOING.contains(&o.f.as_str()))
        .collect();
    let in_force = faults.iter().rev().find(|f| f.time <= at).filter(|f| {
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
    });
    in_force
        .or_else(|| faults.iter().find(|f| f.time > at))
        .map(|f| f.time)
}

struct Row {
    bug: String,
    caught: usize,
    runs: usize,
    median_s: Option<f64>,
    anomalies: Vec<String>,
    wall_s: f64,
}

fn bug_row(bug: &str, outcomes: &[Outcome]) -> Row {
    let caught: Vec<&Outcome> = outcomes.iter().filter(|o| o.valid == Some(false)).collect();
    let mut times: Vec<f64> = caught.iter().filter_map(|o| o.first_anomaly_s).collect();
    times.sort_by(f64::total_cmp);
    let mut anomalies: Vec<String> = caught.iter().flat_map(|o| o.anomalies.clone()).collect();
    anomalies.sort();
    anomalies.dedup();
    Row {
        bug: bug.to_string(),
        caught: caught.len(),
        runs: outcomes.len(),
        median_s: median(&times),
        anomalies,
        wall_s: outcomes.iter().map(|o| o.wall_s).sum(),
    }
}

fn median(sorted: &[f64]) -> Option<f64> {
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[n / 2]),
        n => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn render(args: &Args, rows: &[Row], correct: &[Outcome], limit: u64) -> String {
    let mut s = format!(
        "Detection with the default faults, --time-limit {} (correct broker: {} s){}\n\n\
         | bug | caught | median s to first anomaly | anomalies | wall s |\n|---|---|---|---|---|\n",
        args.time_limit,
        limit,
        if args.test_args.is_empty() {
            String::new()
        } else {
            format!(", extra test arguments `{}`", args.test_args.join(" "))
        }
    );
    for r in rows {
        s += &format!(
            "| `{}` | {}/{} | {} | {} | {:.0} |\n",
            r.bug,
            r.caught,
            r.runs,
            r.median_s.map_or("—".into(), |m| format!("{m:.1}")),
            r.anomalies.join(", "),
            r.wall_s
        );
    }
    let alarms: Vec<String> = correct
        .iter()
        .filter(|o| o.valid != Some(true))
        .flat_map(|o| o.anomalies.clone())
        .collect();
    s += &format!(
        "\nCorrect broker: false alarms {}/{} (not valid: {}){}\n",
        correct.iter().filter(|o| o.valid == Some(false)).count(),
        correct.len(),
        correct.iter().filter(|o| o.valid != Some(true)).count(),
        if alarms.is_empty() {
            String::new()
        } else {
            format!("; anomalies {}", alarms.join(", "))
        }
    );
    s
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
        assert_eq!(first_anomaly(&history(), &results), Some(2_500_000_000));
    }

    #[test]
    fn an_ack_before_the_fault_that_loses_it_counts_from_that_fault() {
        let results = json!({"valid": false, "bad_anomaly_types": ["lost-write"],
            "anomalies": {"lost-write": [{"op_index": 7}]}});
        assert_eq!(first_anomaly(&history(), &results), Some(7_000_000_000));
    }

    #[test]
    fn observations_count_from_the_later_one_and_replicas_alone_have_no_time() {
        let results = json!({"valid": false,
            "bad_anomaly_types": ["inconsistent-offsets", "divergence"],
            "anomalies": {
                "inconsistent-offsets": [{"values": [{"value": 1, "seen_by": {"send": 3}},
                                                     {"value": 2, "seen_by": {"poll": 7}}]}],
                "divergence": [{"replicas": [{"node": "n1"}, {"node": "n2"}]}]}});
        assert_eq!(first_anomaly(&history(), &results), Some(7_000_000_000));
        let only_replicas = json!({"valid": false, "bad_anomaly_types": ["divergence"],
            "anomalies": {"divergence": [{"replicas": []}]}});
        assert_eq!(first_anomaly(&history(), &only_replicas), None);
        assert_eq!(first_anomaly(&history(), &json!({"valid": true})), None);
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
    }
}
