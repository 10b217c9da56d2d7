//! Judging a run. The [`Checker`] boundary is the checkers crate's own trait; this module adds
//! what the runner needs around it: reading the streamed history back from disk and writing the
//! verdict.

use std::io::BufReader;
use std::path::Path;

use anyhow::Context as _;

pub use tidemark_checkers::{Checker, ReplicaState, Results, Validity};

/// Checks the history at `history_path` (as written by [`crate::history::HistoryWriter`]) with
/// the replica states, if any were collected.
pub fn check_file(
    checker: &dyn Checker,
    history_path: &Path,
    replicas: Option<&[ReplicaState]>,
) -> anyhow::Result<Results> {
    let file = std::fs::File::open(history_path)
        .with_context(|| format!("opening {}", history_path.display()))?;
    let mut reader = tidemark_checkers::read_history(BufReader::new(file))
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", history_path.display()))?;
    let test = reader.test().clone();
    let mut bad: Option<String> = None;
    let results = {
        let mut ops = std::iter::from_fn(|| match reader.next()? {
            Ok(op) => Some(op),
            Err(e) => {
                bad = Some(e.to_string());
                None
            }
        });
        checker.check(&test, &mut ops, replicas)
    };
    if let Some(e) = bad {
        anyhow::bail!("reading {}: {e}", history_path.display());
    }
    Ok(results)
}

/// Writes `results.json`.
pub fn write_results(path: &Path, results: &Results) -> anyhow::Result<()> {
    let mut bytes = serde_json::to_vec_pretty(results)?;
    bytes.push(b'\n');
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}
