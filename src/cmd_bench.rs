//! `tidemark bench-detection`: how well the default faults find each injectable one-cluster bug,
//! and whether they ever accuse the correct broker. Runs `tidemark test` (this executable) for
//! every bug over `--seeds` seeds and for the correct broker over `--correct-seeds`, then prints
//! a Markdown table: caught runs, the median seconds into a run until its first anomaly, the
//! faults that exposed the first anomaly in the runs that caught it, how many runs began each
//! fault, and false alarms. Each
//! run's line on stderr also lists the faults it began, so that a miss can be read against what
//! its schedule drew (no handoff, no roll, ...).
//!
//! When an anomaly happened comes from the history, not from when the checker noticed it
//! ([`crate::evidence`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tidemark_checkers::{read_history, Op};

use crate::evidence::{fault_ops_begun, faults_begun, first_anomaly, strings};

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
    /// The fault that exposed the first anomaly, as [`first_anomaly`] names it.
    exposed_by: Option<String>,
    /// The fault ops the run began within its time limit.
    began: BTreeSet<String>,
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
        if !outcomes.is_empty() {
            rows.push(bug_row(bug, &outcomes));
        }
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
    // A test refused before it began (bad arguments, no broker beside `exe`) says why on stderr.
    let dir = std::fs::canonicalize(store.join("latest")).map_err(|e| {
        format!(
            "{}: tidemark test made no run directory ({e}), exit {:?}: {}",
            store.display(),
            out.status.code(),
            crate::rerun::last_words(&out.stderr).unwrap_or("it printed nothing".into())
        )
    })?;
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
    let first = first_anomaly(&ops, &results);
    let outcome = Outcome {
        valid: results["valid"].as_bool(),
        anomalies: strings(&results["bad_anomaly_types"]),
        first_anomaly_s: first.as_ref().map(|a| a.at as f64 / 1e9),
        exposed_by: first.and_then(|a| a.exposed_by),
        began: fault_ops_begun(&ops, limit * 1_000_000_000),
        wall_s,
    };
    eprintln!(
        "{} seed {seed}: valid {:?} {:?} first anomaly {:?} s (exposed by {:?}), {:.0} s wall, {}\n  faults: {}",
        bug.unwrap_or("correct"),
        outcome.valid,
        outcome.anomalies,
        outcome.first_anomaly_s,
        outcome.exposed_by,
        outcome.wall_s,
        dir.display(),
        faults_begun(&ops, limit * 1_000_000_000).join(", ")
    );
    Ok(outcome)
}

struct Row {
    bug: String,
    caught: usize,
    runs: usize,
    median_s: Option<f64>,
    anomalies: Vec<String>,
    /// Each exposing fault of the caught runs and in how many it exposed the first anomaly.
    exposed_by: BTreeMap<String, usize>,
    /// Each fault op and how many of the runs began it.
    began: BTreeMap<String, usize>,
    wall_s: f64,
}

/// Each fault op and how many of `outcomes` began it.
fn count_began(outcomes: &[Outcome]) -> BTreeMap<String, usize> {
    count(outcomes.iter().flat_map(|o| &o.began))
}

/// How many times each name comes.
fn count<'a>(names: impl Iterator<Item = &'a String>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for name in names {
        *counts.entry(name.clone()).or_insert(0) += 1;
    }
    counts
}

/// Counts, the most first (then by name).
fn most_first(counts: &BTreeMap<String, usize>) -> Vec<(&String, usize)> {
    let mut v: Vec<(&String, usize)> = counts.iter().map(|(f, n)| (f, *n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    v
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
        exposed_by: count(caught.iter().filter_map(|o| o.exposed_by.as_ref())),
        began: count_began(outcomes),
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
        "Detection with the default faults, --time-limit {} (correct broker: {} s){}\n",
        args.time_limit,
        limit,
        if args.test_args.is_empty() {
            String::new()
        } else {
            format!(", extra test arguments `{}`", args.test_args.join(" "))
        }
    );
    if !rows.is_empty() {
        s += "\n| bug | caught | median s to first anomaly | anomalies | exposed by | wall s |\n|---|---|---|---|---|---|\n";
    }
    for r in rows {
        s += &format!(
            "| `{}` | {}/{} | {} | {} | {} | {:.0} |\n",
            r.bug,
            r.caught,
            r.runs,
            r.median_s.map_or("—".into(), |m| format!("{m:.1}")),
            r.anomalies.join(", "),
            most_first(&r.exposed_by)
                .iter()
                .map(|(f, n)| format!("{f} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
            r.wall_s
        );
    }
    let mut began = count_began(correct);
    for r in rows {
        for (f, n) in &r.began {
            *began.entry(f.clone()).or_insert(0) += n;
        }
    }
    let runs = rows.iter().map(|r| r.runs).sum::<usize>() + correct.len();
    if runs > 0 {
        let list: Vec<String> = most_first(&began)
            .iter()
            .map(|(f, n)| format!("{f} {n}/{runs}"))
            .collect();
        s += &format!(
            "\nRuns that began each fault (a seed deals one schedule whatever the bug): {}\n",
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
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

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, 2.0, 9.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 4.0, 9.0]), Some(3.0));
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn outcome(valid: bool, anomalies: &[&str]) -> Outcome {
        Outcome {
            valid: Some(valid),
            anomalies: anomalies.iter().map(|a| a.to_string()).collect(),
            first_anomaly_s: (!valid).then_some(12.5),
            exposed_by: (!valid).then(|| "handoff".to_string()),
            began: ["start-partition".to_string(), "handoff".to_string()]
                .into_iter()
                .take(if valid { 1 } else { 2 })
                .collect(),
            wall_s: 40.0,
        }
    }

    #[test]
    fn a_table_has_a_row_per_bug_run_and_counts_the_correct_broker_alarms() {
        use clap::Parser;
        let cli = Cli::parse_from(["bench", "--time-limit", "30", "--seeds", "0"]);
        let correct = [outcome(true, &[]), outcome(false, &["lost-write"])];
        let table = render(&cli.args, &[], &correct, 60);
        assert!(!table.contains("| bug |"), "{table}");
        assert!(
            table.contains("false alarms 1/2 (not valid: 1); anomalies lost-write"),
            "{table}"
        );
        let mut partitioned = outcome(false, &["lost-write"]);
        partitioned.exposed_by = Some("start-partition leader".into());
        let rows = [bug_row(
            "hw-truncation",
            &[
                outcome(false, &["lost-write"]),
                outcome(true, &[]),
                partitioned,
                outcome(false, &["lost-write"]),
            ],
        )];
        let table = render(&cli.args, &rows, &[], 30);
        assert!(
            table.contains(
                "| `hw-truncation` | 3/4 | 12.5 | lost-write | handoff ×2, start-partition leader ×1 | 160 |"
            ),
            "{table}"
        );
        assert!(
            table.contains("began each fault (a seed deals one schedule whatever the bug): start-partition 4/4, handoff 3/4\n"),
            "{table}"
        );
    }
}
