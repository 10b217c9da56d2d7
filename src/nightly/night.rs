//! A night as plain data: every case's verdict against the one it must have, how long it took,
//! its anomaly counts and where its run directory is (`night.json`, written after every case so
//! a crash of the night itself loses nothing recorded); the night's exit code, Jepsen's
//! test-all's; and the trend, which cases changed status since the nights before.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::matrix::{CaseId, Expected, Shard};

/// How a case's run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// results.json said `valid: true`.
    Valid,
    /// results.json said `valid: false`.
    Invalid,
    /// results.json said `valid: "unknown"`.
    Unknown,
    /// No verdict: the child failed, was refused, or left no results.json.
    Crashed,
    /// Not started: the budget ran out or the night was interrupted.
    NotRun,
}

/// A verdict held against the expected one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The verdict is the expected one.
    AsExpected,
    /// Valid where invalid was expected (a missed bug) or the reverse (a false alarm).
    Unexpected,
    /// The checker could not tell, or the case did not run.
    Unknown,
    /// The harness gave no verdict.
    Crashed,
}

impl Status {
    /// The status of `verdict` when `expected` was wanted.
    pub fn of(expected: Expected, verdict: Verdict) -> Status {
        match (expected, verdict) {
            (Expected::Valid, Verdict::Valid) | (Expected::Invalid, Verdict::Invalid) => {
                Status::AsExpected
            }
            (_, Verdict::Valid | Verdict::Invalid) => Status::Unexpected,
            (_, Verdict::Unknown | Verdict::NotRun) => Status::Unknown,
            (_, Verdict::Crashed) => Status::Crashed,
        }
    }

    /// `as-expected`, `unexpected`, `unknown`, `crashed`.
    pub fn name(self) -> &'static str {
        match self {
            Status::AsExpected => "as-expected",
            Status::Unexpected => "unexpected",
            Status::Unknown => "unknown",
            Status::Crashed => "crashed",
        }
    }
}

impl Verdict {
    /// `valid`, `invalid`, `unknown`, `crashed`, `not-run`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Valid => "valid",
            Verdict::Invalid => "invalid",
            Verdict::Unknown => "unknown",
            Verdict::Crashed => "crashed",
            Verdict::NotRun => "not-run",
        }
    }
}

/// One case of a night.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaseRecord {
    /// Which case.
    pub id: CaseId,
    /// The verdict it must have.
    pub expected: Expected,
    /// The verdict it had.
    pub verdict: Verdict,
    /// The two held against each other.
    pub status: Status,
    /// Wall time of its child `tidemark test`, seconds (0 when not run).
    pub duration_s: f64,
    /// results.json's `anomaly_counts`.
    pub anomaly_counts: BTreeMap<String, u64>,
    /// results.json's `bad_anomaly_types`.
    pub bad_anomaly_types: Vec<String>,
    /// Its run directory, relative to the store; `None` when it made none.
    pub run_dir: Option<PathBuf>,
    /// The child's exit code (`None`: not run, or killed by a signal).
    pub exit_code: Option<i32>,
    /// Why it crashed or did not run.
    pub message: Option<String>,
}

/// `night.json`: one night of one store (one shard, or the whole matrix).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Night {
    /// When it started, `yyyyMMddTHHmmss.SSSZ` (UTC); also its directory's name.
    pub started: String,
    /// The matrix file, as given.
    pub matrix: PathBuf,
    /// The shard this night ran, `None` for the whole matrix.
    pub shard: Option<Shard>,
    /// How many cases the whole matrix has (every shard's).
    pub matrix_cases: usize,
    /// The budget, minutes.
    pub budget_minutes: f64,
    /// This night's cases, in matrix order; those not yet run are absent until the night ends.
    pub cases: Vec<CaseRecord>,
    /// Seconds between one child's exit and the next one's start (the night's own work:
    /// reading the verdict, writing night.json, the index and the JUnit file).
    pub gaps_s: Vec<f64>,
    /// Whether the night went through every case of its slice (run or not run).
    pub finished: bool,
}

/// The exit code of a night, as Jepsen's test-all: 255 when some case crashed, else 2 when
/// some verdict is unknown (or a case did not run), else 1 when some verdict is not the
/// expected one, else 0.
pub fn exit_code<'a>(statuses: impl IntoIterator<Item = &'a Status>) -> u8 {
    let statuses: Vec<&Status> = statuses.into_iter().collect();
    if statuses.contains(&&Status::Crashed) {
        255
    } else if statuses.contains(&&Status::Unknown) {
        2
    } else if statuses.contains(&&Status::Unexpected) {
        1
    } else {
        0
    }
}

/// The largest and the mean of `gaps` (0 for none).
pub fn overhead(gaps: &[f64]) -> (f64, f64) {
    if gaps.is_empty() {
        return (0.0, 0.0);
    }
    let max = gaps.iter().copied().fold(0.0, f64::max);
    (max, gaps.iter().sum::<f64>() / gaps.len() as f64)
}

/// A case whose status changed since the previous night.
#[derive(Debug, Clone, PartialEq)]
pub struct Flip {
    /// The case.
    pub id: CaseId,
    /// Its status the previous night.
    pub before: Status,
    /// Its status this night.
    pub after: Status,
}

/// This night against the ones before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Trend {
    /// When the nights compared started, oldest first; the last is this night.
    pub nights: Vec<String>,
    /// Per case of this night, its status in each of `nights` (`None`: not in that night).
    pub history: Vec<(CaseId, Vec<Option<Status>>)>,
    /// Cases whose status differs from the previous night's (cases new tonight aside).
    pub flips: Vec<Flip>,
}

/// The trend of the last of `nights` (oldest first, not empty) against the others.
pub fn trend(nights: &[(String, Vec<CaseRecord>)]) -> Trend {
    let (_, now) = nights.last().expect("a night to judge");
    let status_in =
        |cases: &[CaseRecord], id: &CaseId| cases.iter().find(|c| &c.id == id).map(|c| c.status);
    let history = now
        .iter()
        .map(|case| {
            let row = nights
                .iter()
                .map(|(_, cases)| status_in(cases, &case.id))
                .collect();
            (case.id.clone(), row)
        })
        .collect();
    let flips = match nights.len().checked_sub(2).map(|i| &nights[i].1) {
        Some(previous) => now
            .iter()
            .filter_map(|case| {
                let before = status_in(previous, &case.id)?;
                (before != case.status).then(|| Flip {
                    id: case.id.clone(),
                    before,
                    after: case.status,
                })
            })
            .collect(),
        None => Vec::new(),
    };
    Trend {
        nights: nights.iter().map(|(s, _)| s.clone()).collect(),
        history,
        flips,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::nightly::matrix::RuntimeName;

    pub fn record(seed: u64, bug: Option<&str>, verdict: Verdict) -> CaseRecord {
        let id = CaseId {
            workload: "queue".into(),
            nemesis: "partition".into(),
            seed,
            bug: bug.map(String::from),
            runtime: RuntimeName::Netns,
            variant: None,
        };
        let expected = id.expected();
        CaseRecord {
            status: Status::of(expected, verdict),
            id,
            expected,
            verdict,
            duration_s: 12.5,
            anomaly_counts: if verdict == Verdict::Invalid {
                BTreeMap::from([("lost-write".to_string(), 3)])
            } else {
                BTreeMap::new()
            },
            bad_anomaly_types: Vec::new(),
            run_dir: Some(PathBuf::from(format!("q/2026010{seed}T000000.000Z"))),
            exit_code: Some(0),
            message: None,
        }
    }

    #[test]
    fn a_verdict_is_held_against_the_expected_one() {
        use Expected as E;
        assert_eq!(Status::of(E::Valid, Verdict::Valid), Status::AsExpected);
        assert_eq!(Status::of(E::Invalid, Verdict::Invalid), Status::AsExpected);
        assert_eq!(Status::of(E::Invalid, Verdict::Valid), Status::Unexpected);
        assert_eq!(Status::of(E::Valid, Verdict::Invalid), Status::Unexpected);
        assert_eq!(Status::of(E::Invalid, Verdict::Unknown), Status::Unknown);
        assert_eq!(Status::of(E::Valid, Verdict::NotRun), Status::Unknown);
        assert_eq!(Status::of(E::Valid, Verdict::Crashed), Status::Crashed);
    }

    #[test]
    fn the_exit_code_is_test_alls() {
        use Status::*;
        assert_eq!(exit_code(&[AsExpected, AsExpected]), 0);
        assert_eq!(exit_code(&[AsExpected, Unexpected]), 1);
        assert_eq!(exit_code(&[Unexpected, Unknown]), 2);
        assert_eq!(exit_code(&[Unknown, Crashed, Unexpected]), 255);
        assert_eq!(exit_code(&[]), 0);
    }

    #[test]
    fn the_trend_names_the_cases_that_flipped() {
        let bug = Some("ack-before-replication");
        let first = vec![record(1, None, Verdict::Valid)];
        let second = vec![
            record(1, None, Verdict::Valid),
            record(1, bug, Verdict::Invalid),
        ];
        let third = vec![
            record(1, None, Verdict::Crashed),
            record(1, bug, Verdict::Valid),
            record(2, None, Verdict::Valid),
        ];
        let nights = vec![
            ("n1".to_string(), first),
            ("n2".to_string(), second),
            ("n3".to_string(), third),
        ];
        let t = trend(&nights);
        assert_eq!(t.nights, ["n1", "n2", "n3"]);
        assert_eq!(
            t.flips,
            vec![
                Flip {
                    id: nights[2].1[0].id.clone(),
                    before: Status::AsExpected,
                    after: Status::Crashed
                },
                Flip {
                    id: nights[2].1[1].id.clone(),
                    before: Status::AsExpected,
                    after: Status::Unexpected
                },
            ]
        );
        assert_eq!(
            t.history[1].1,
            vec![None, Some(Status::AsExpected), Some(Status::Unexpected)]
        );
        assert_eq!(t.history[2].1, vec![None, None, Some(Status::AsExpected)]);
        assert!(trend(&nights[..1]).flips.is_empty());
    }

    #[test]
    fn overhead_is_the_largest_and_mean_gap() {
        assert_eq!(overhead(&[]), (0.0, 0.0));
        assert_eq!(overhead(&[0.5, 1.5]), (1.5, 1.0));
    }
}
