//! Pure analyses of tidemark histories: history and replica states in, verdict out.
//!
//! This crate reads and judges what `docs/history-format.md` defines: the ops of `history.jsonl`, the
//! final replica states of `replicas.jsonl`, and the verdict of `results.json`. The analyses do
//! no I/O, read no clock and run no async code; the readers in [`reader`] stream a history from
//! any [`BufRead`] so that checking needs memory in proportion to the distinct values written,
//! not to the number of ops.
//!
//! `tidemark test`, `tidemark check` and `tidemark report` all judge a recorded run the same
//! way, through [`check_run`] (the file boundary, in [`run`]):
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let results = tidemark_checkers::check_run(std::path::Path::new("store/latest"))?;
//! std::fs::write("store/latest/results.json", serde_json::to_vec_pretty(&results)?)?;
//! print!("{}", results.summary(5));
//! std::process::exit(results.valid.exit_code().into());
//! # }
//! ```
//!
//! The checker is the one the history header's `workload` names ([`WORKLOADS`]); tests call
//! [`check`] with ops they already hold. It writes histories with [`Op`] (and
//! [`SendValue`]/[`PollValue`] for queue values), replica states with [`ReplicaState`]. The
//! verdict policy is in [`policy`]; the anomalies are named by [`AnomalyKind`].

mod dense;
pub mod lineage;
mod mirror;
pub mod op;
pub mod policy;
mod producers;
pub mod queue;
pub mod reader;
pub mod results;
pub mod run;
pub mod tiered;

use std::io::BufRead;

use serde_json::Value;

pub use op::{
    EpochEntry, Op, OpType, PollValue, Process, ProducerState, Record, RemoteBootstrap,
    RemoteSegment, ReplicaState, SendValue, TieredSide, UncleanElection,
};
pub use policy::Policy;
pub use queue::{QueueAnalysis, QueueChecker};
pub use reader::{read_history, read_replicas, BadInput, HistoryReader};
pub use results::{AnomalyKind, OpStats, Results, SkippedCheck, Validity};
pub use run::{check_files, check_run, RunFiles};

/// The workloads whose histories this crate judges, by the name the history header's
/// `workload` gives: the queue checker judges all three (a mirror history names a cluster on
/// every op; a tiered one adds the remote store to the final logs, see [`tiered`]).
pub const WORKLOADS: &[&str] = &["queue", "mirror", "tiered"];

/// A checker judges one recorded run.
///
/// Contract: it is given the header's test map, every op of the history in file order, and the
/// final replica states when they were collected (`None` when `replicas.jsonl` is missing). It
/// returns the verdict and every anomaly found, each entry naming the op indices or replicas
/// that prove it. It is pure: no I/O, no clock, no randomness, no async, so the same input
/// always gives the same [`Results`]. It must not panic on any input: ops it cannot interpret
/// are reported as warnings, and checks it cannot run are listed in `skipped_checks`.
pub trait Checker {
    /// Judges the run.
    fn check(
        &self,
        test: &Value,
        history: &mut dyn Iterator<Item = Op>,
        replicas: Option<&[ReplicaState]>,
    ) -> Results;
}

/// Checks a queue or mirror history held as ops: [`QueueChecker`] with this crate's policy.
pub fn check<I: IntoIterator<Item = Op>>(
    test: &Value,
    ops: I,
    replicas: Option<&[ReplicaState]>,
) -> Results {
    QueueChecker.check(test, &mut ops.into_iter(), replicas)
}

/// Checks a history as it streams from its reader, with the checker its header's `workload`
/// names. An unknown workload, or a malformed op, is bad input naming its line; a header that
/// names no workload (a hand-written history) is checked as a queue history, with a warning;
/// what the reader tolerated (a truncated last line) becomes a warning in the results.
pub fn check_history<R: BufRead>(
    mut history: HistoryReader<R>,
    replicas: Option<&[ReplicaState]>,
) -> Result<Results, BadInput> {
    let test = history.test().clone();
    let unnamed = match test.get("workload") {
        None => true,
        Some(Value::String(w)) if WORKLOADS.contains(&w.as_str()) => false,
        Some(other) => {
            return Err(BadInput::at(
                history.header_line(),
                format!(
                    "unknown workload {other} in the history header (tidemark checks: {})",
                    WORKLOADS.join(", ")
                ),
            ))
        }
    };
    let mut analysis = QueueAnalysis::new(&test, replicas);
    history.for_each_line_op(|op| analysis.observe_line(op))?;
    let mut results = analysis.finish();
    if unnamed {
        results.warn("the history header names no workload: checked as a queue history");
    }
    for w in history.warnings() {
        results.warn(w.clone());
    }
    Ok(results)
}
