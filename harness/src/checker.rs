//! Judging a run. The verdict comes from the checkers crate's one way into checking,
//! [`tidemark_checkers::check_run`], the same one `tidemark check` and `tidemark report` use;
//! this module adds what the runner needs around it: writing the verdict.

use std::path::Path;

use anyhow::Context as _;

pub use tidemark_checkers::{check_run, ReplicaState, Results, Validity};

/// Writes `results.json`.
pub fn write_results(path: &Path, results: &Results) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(results)?;
    bytes.push(b'\n');
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}
