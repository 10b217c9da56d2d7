//! A run directory loaded for display: the test, the verdict, the history digest, the final
//! replica states, the offset views and the node log excerpts. Loading decides every bound
//! (which anomaly entries, which offsets, which log lines), so rendering only formats.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidemark_checkers::{check_run, read_replicas, ReplicaState, Results};

use crate::anomalies::{self, Kind, PartKey};
use crate::digest::{self, Digest, Watch};
use crate::limits::{Embed, MAX_FOCUS, WINDOW};
use crate::logs::{self, Moment, NodeLogs, Start};
use crate::offsets::{self, View};

/// Anomaly moments whose node logs are excerpted.
pub const MAX_MOMENTS: usize = 8;

/// Where the verdict came from.
pub enum Verdict {
    /// `results.json`.
    File(Box<Results>),
    /// The checkers, run by the report because `results.json` is missing.
    Computed(Box<Results>),
    /// No verdict: why.
    None(String),
}

impl Verdict {
    pub fn results(&self) -> Option<&Results> {
        match self {
            Verdict::File(r) | Verdict::Computed(r) => Some(r),
            Verdict::None(_) => None,
        }
    }
}

/// A run directory, loaded.
pub struct Run {
    /// The run directory, links resolved where they can be.
    pub dir: PathBuf,
    /// `test/stamp`, how the store names the run.
    pub store_path: String,
    pub name: String,
    pub test: Value,
    pub test_source: &'static str,
    pub verdict: Verdict,
    pub kinds: Vec<Kind>,
    pub digest: Digest,
    pub replicas: Option<Vec<ReplicaState>>,
    pub offsets: Vec<View>,
    pub logs: Vec<NodeLogs>,
    /// Nodes whose logs are not shown.
    pub logs_left_out: usize,
    pub start: Option<Start>,
    pub embed: Embed,
    pub warnings: Vec<String>,
    pub load_time: Duration,
}

impl Run {
    /// Loads `dir`.
    pub fn load(dir: &Path, embed: Embed) -> anyhow::Result<Run> {
        let began = Instant::now();
        let history = dir.join("history.jsonl");
        if !history.is_file() {
            anyhow::bail!("{}: no history.jsonl: not a run directory", dir.display());
        }
        let mut warnings = Vec::new();
        let test_json = read_json(&dir.join("test.json"), &mut warnings);
        let replicas = match File::open(dir.join("replicas.jsonl")) {
            Ok(f) => match read_replicas(BufReader::new(f)) {
                Ok(r) => Some(r),
                Err(e) => {
                    warnings.push(format!("replicas.jsonl is unreadable: {e}"));
                    None
                }
            },
            Err(_) => None,
        };
        let verdict = verdict(dir, &mut warnings);
        let default_cluster = default_cluster(replicas.as_deref());
        let kinds = verdict
            .results()
            .map(|r| anomalies::shown(r, &default_cluster))
            .unwrap_or_default();
        let refs = anomalies::referenced_ops(&kinds);
        let mut focus = anomalies::focus(&kinds);
        offsets::side_by_side(&mut focus, replicas.as_deref());
        let windows = windows(&focus);
        let watch = Watch {
            ops: &refs,
            windows: &windows,
            default_cluster: &default_cluster,
        };
        let digest = digest::read(&history, &watch)?;
        let offsets = offsets::build(&focus, &windows, &digest, replicas.as_deref());
        let (test, test_source) = match test_json {
            Some(t) => (t, "test.json"),
            None => (digest.test.clone(), "the history header"),
        };
        let store_path = store_path(dir);
        let name = test
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| store_path.split('/').next().unwrap_or_default().to_owned());
        let start = start(&test, dir);
        let moments = moments(&kinds, &digest);
        let (logs, logs_left_out) = logs::excerpts(&dir.join("nodes"), &moments, start.as_ref());
        Ok(Run {
            dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
            store_path,
            name,
            test,
            test_source,
            verdict,
            kinds,
            digest,
            replicas,
            offsets,
            logs,
            logs_left_out,
            start,
            embed,
            warnings,
            load_time: began.elapsed(),
        })
    }
}

fn read_json(path: &Path, warnings: &mut Vec<String>) -> Option<Value> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(v) => Some(v),
        Err(e) => {
            warnings.push(format!("{} is unreadable: {e}", path.display()));
            None
        }
    }
}

/// `results.json`, or else the verdict computed the one way every tidemark command checks a run.
fn verdict(dir: &Path, warnings: &mut Vec<String>) -> Verdict {
    let path = dir.join("results.json");
    if let Ok(bytes) = std::fs::read(&path) {
        match serde_json::from_slice::<Results>(&bytes) {
            Ok(r) => return Verdict::File(Box::new(r)),
            Err(e) => warnings.push(format!("results.json is unreadable ({e}): checked again")),
        }
    }
    match check_run(dir) {
        Ok(r) => Verdict::Computed(Box::new(r)),
        Err(e) => Verdict::None(format!("the history cannot be checked: {e}")),
    }
}

/// The cluster of ops that name none, as the checkers choose it: the replicas' one cluster.
fn default_cluster(replicas: Option<&[ReplicaState]>) -> String {
    let clusters: BTreeSet<&str> = replicas
        .unwrap_or_default()
        .iter()
        .map(|r| r.cluster.as_str())
        .collect();
    match clusters.iter().next() {
        Some(c) if clusters.len() == 1 => (*c).to_owned(),
        _ => String::new(),
    }
}

/// Merged offset windows around the first [`MAX_FOCUS`] anomalous offsets of each partition.
fn windows(focus: &BTreeMap<PartKey, BTreeSet<i64>>) -> BTreeMap<PartKey, Vec<(i64, i64)>> {
    let mut out = BTreeMap::new();
    for (key, offsets) in focus {
        let mut w: Vec<(i64, i64)> = Vec::new();
        for &o in offsets.iter().take(MAX_FOCUS) {
            let (lo, hi) = (o.saturating_sub(WINDOW).max(0), o.saturating_add(WINDOW));
            match w.last_mut() {
                Some(last) if lo <= last.1 + 1 => last.1 = last.1.max(hi),
                _ => w.push((lo, hi)),
            }
        }
        out.insert(key.clone(), w);
    }
    out
}

/// `test/stamp` from the last two components of the directory, as the store lays runs out.
fn store_path(dir: &Path) -> String {
    let abs = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let parts: Vec<String> = abs
        .components()
        .rev()
        .take(2)
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

/// The wall-clock start: `started_at_unix_ms` in the test map when the engine records it,
/// otherwise the run directory's name (`yyyyMMddTHHmmss.SSSZ`, made just before the history
/// starts, so log matching is then approximate).
fn start(test: &Value, dir: &Path) -> Option<Start> {
    if let Some(ms) = test.get("started_at_unix_ms").and_then(Value::as_f64) {
        return Some(Start {
            unix_ns: (ms * 1e6) as i128,
            source: "started_at_unix_ms in the test map",
        });
    }
    let abs = std::fs::canonicalize(dir).ok()?;
    let name = abs.file_name()?.to_str()?;
    let stamp = name.split('-').next()?;
    let b = stamp.as_bytes();
    if b.len() != 20 || b[8] != b'T' || b[15] != b'.' || b[19] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| stamp.get(r)?.parse::<i64>().ok();
    let unix_ns = logs::unix_ns(
        num(0..4)?,
        num(4..6)?,
        num(6..8)?,
        num(9..11)? * 3600 + num(11..13)? * 60 + num(13..15)?,
        num(16..19)? * 1_000_000,
    )?;
    Some(Start {
        unix_ns,
        source: "the run directory's name (approximate: the directory is made just before the test starts)",
    })
}

/// When each shown anomaly happened: the latest time of the ops it names.
fn moments(kinds: &[Kind], digest: &Digest) -> Vec<Moment> {
    let times: BTreeMap<u64, u64> = digest
        .evidence
        .values()
        .flat_map(|e| [&e.invoke, &e.completion])
        .flatten()
        .map(|o| (o.index, o.time))
        .collect();
    let mut out: Vec<Moment> = Vec::new();
    'kinds: for k in kinds {
        for e in &k.entries {
            let Some(t) = e.ops.iter().filter_map(|i| times.get(i)).max() else {
                continue;
            };
            // Anomalies within a second of one another share an excerpt.
            if out.iter().any(|m| m.time.abs_diff(*t) < 1_000_000_000) {
                continue;
            }
            out.push(Moment {
                label: format!("{} ({})", k.name, e.headline()),
                time: *t,
            });
            if out.len() == MAX_MOMENTS {
                break 'kinds;
            }
        }
    }
    out.sort_by_key(|m| m.time);
    out
}
