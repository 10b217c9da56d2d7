//! The one way into checking a recorded run. `tidemark test` (after its final reads),
//! `tidemark check` and `tidemark report` (when a run has no `results.json`) all judge a run
//! here, so a verdict never depends on which of them computed it.
//!
//! This module is the crate's file boundary: it finds a run's files and opens them, and every
//! problem it meets is [`BadInput`] naming the file (and line). What it reads goes to the pure
//! analyses unchanged; the checker is the one the history header's `workload` names.

use std::fs::File;
use std::io::{BufReader, ErrorKind};
use std::path::{Path, PathBuf};

use crate::op::ReplicaState;
use crate::reader::{read_history, read_replicas, BadInput};
use crate::results::Results;

/// The history of a run, in its directory.
pub const HISTORY_FILE: &str = "history.jsonl";
/// The final replica states of a run, in its directory.
pub const REPLICAS_FILE: &str = "replicas.jsonl";

/// The files a check reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFiles {
    /// `history.jsonl`.
    pub history: PathBuf,
    /// `replicas.jsonl`, when the run has one.
    pub replicas: Option<PathBuf>,
}

impl RunFiles {
    /// The files of a run directory: its history, and its replica states when there are any.
    /// A `replicas.jsonl` that is there but cannot be followed (a dangling symlink) is bad
    /// input, not a run without replica states.
    pub fn in_dir(dir: &Path) -> Result<RunFiles, BadInput> {
        let replicas = dir.join(REPLICAS_FILE);
        let name = || replicas.display().to_string();
        let present = match std::fs::symlink_metadata(&replicas) {
            Ok(_) => true,
            Err(e) if e.kind() == ErrorKind::NotFound => false,
            Err(e) => return Err(BadInput::whole(format!("cannot read: {e}")).in_file(name())),
        };
        if present {
            if let Err(e) = std::fs::metadata(&replicas) {
                let target = std::fs::read_link(&replicas)
                    .map(|t| format!(" (a link to {})", t.display()))
                    .unwrap_or_default();
                return Err(BadInput::whole(format!("cannot follow{target}: {e}")).in_file(name()));
            }
        }
        Ok(RunFiles {
            history: dir.join(HISTORY_FILE),
            replicas: present.then_some(replicas),
        })
    }
}

/// Checks the run in `dir`: [`RunFiles::in_dir`] then [`check_files`].
pub fn check_run(dir: &Path) -> Result<Results, BadInput> {
    check_files(&RunFiles::in_dir(dir)?)
}

/// Reads the replica states (when given) and streams the history through the checker its
/// header's `workload` names.
pub fn check_files(files: &RunFiles) -> Result<Results, BadInput> {
    let replicas = files.replicas.as_deref().map(load_replicas).transpose()?;
    let name = files.history.display().to_string();
    let history = read_history(open(&files.history)?).map_err(|e| e.in_file(name.clone()))?;
    crate::check_history(history, replicas.as_deref()).map_err(|e| match e.file {
        Some(_) => e,
        None => e.in_file(name),
    })
}

fn open(path: &Path) -> Result<BufReader<File>, BadInput> {
    File::open(path)
        .map(|f| BufReader::with_capacity(1 << 16, f))
        .map_err(|e| {
            BadInput::whole(format!("cannot open: {e}")).in_file(path.display().to_string())
        })
}

fn load_replicas(path: &Path) -> Result<Vec<ReplicaState>, BadInput> {
    read_replicas(open(path)?).map_err(|e| e.in_file(path.display().to_string()))
}
