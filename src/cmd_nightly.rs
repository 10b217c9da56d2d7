//! `tidemark nightly MATRIX.toml`: every case of a matrix (or of one shard of it), one after
//! another as child `tidemark test`s ([`crate::rerun::Trials`], as replay and shrink run
//! theirs), within a budget of minutes, going on after a case that failed or crashed. After
//! every case it writes the night into the store, `STORE/nightly/<stamp>/`: `night.json`, the
//! index page and the JUnit file, so whatever stops the night, what ran is recorded.
//! `tidemark nightly merge STORE...` makes one index, one JUnit file and one trend of the shards'
//! stores. Exits like Jepsen's test-all (`night::exit_code`).

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::time::{Instant, SystemTime};

use serde_json::Value;
use tidemark_harness::store::utc_stamp;

use crate::nightly::index::{self, Row, Summary};
use crate::nightly::junit;
use crate::nightly::matrix::{Case, Matrix, Shard};
use crate::nightly::night::{self, CaseRecord, Night, Status, Verdict};
use crate::rerun::{ChildTest, TrialError, Trials};

/// Nights the trend shows, this one included.
const TREND_NIGHTS: usize = 7;

/// Arguments of `tidemark nightly`.
#[derive(clap::Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Examples:\n  \
    tidemark nightly examples/nightly.toml --store /var/lib/tidemark/store\n  \
    tidemark nightly examples/nightly.toml --shard 2/4 --store store-2\n  \
    tidemark nightly examples/nightly.toml --list\n  \
    tidemark nightly merge store-1 store-2 store-3 store-4 --out night\n\
    Exit: 0 every case as expected, 1 an unexpected verdict, 2 an unknown one (or a case not \
    run), 255 a crash."
)]
pub struct Args {
    /// Build one index, JUnit file and trend from the stores of a night's shards.
    #[command(subcommand)]
    merge: Option<Merge>,
    /// The matrix file (TOML; see examples/nightly.toml).
    #[arg(required = true, value_name = "MATRIX")]
    matrix: Option<PathBuf>,
    /// Run only the I-th of N stable slices of the matrix (case k goes to shard k mod N + 1).
    #[arg(long, value_name = "I/N")]
    shard: Option<Shard>,
    /// The store: run directories, and the nights under `nightly/`.
    #[arg(long, default_value = "store", value_name = "DIR")]
    store: PathBuf,
    /// Minutes the night may take, instead of the matrix's `budget_minutes`.
    #[arg(long, value_name = "M")]
    budget_minutes: Option<f64>,
    /// Print the cases the matrix (or shard) expands to, each with its `tidemark test`
    /// arguments, and the minutes their main phases add up to; run nothing, write nothing.
    #[arg(long)]
    list: bool,
}

#[derive(clap::Subcommand, Debug)]
enum Merge {
    /// Merge the latest night of each shard's store (and the nights before, for the trend).
    Merge(MergeArgs),
}

#[derive(clap::Args, Debug)]
struct MergeArgs {
    /// The shards' stores.
    #[arg(required = true, value_name = "STORE")]
    stores: Vec<PathBuf>,
    /// Where index.html, junit.xml and night.json go.
    #[arg(long, default_value = "nightly-merged", value_name = "DIR")]
    out: PathBuf,
}

/// Runs the subcommand and returns the process exit code.
pub fn run(args: Args) -> u8 {
    let result = match (&args.merge, &args.matrix) {
        (Some(Merge::Merge(m)), _) => merge(m),
        (None, Some(matrix)) => run_night(&args, matrix),
        (None, None) => Err((crate::EXIT_BAD_INPUT, "a matrix file is needed".into())),
    };
    result.unwrap_or_else(|(code, msg)| {
        eprintln!("tidemark nightly: {msg}");
        code
    })
}

type Failure = (u8, String);

fn bad_input(msg: String) -> Failure {
    (crate::EXIT_BAD_INPUT, msg)
}

fn harness(msg: String) -> Failure {
    (crate::EXIT_HARNESS_FAILED, msg)
}

/// `--list`: a case a line, its label and arguments, then the sum of the main phases against the
/// budget (set-up, healing, final reads and teardown come on top, about 15–40 s a case).
fn list(cases: &[Case], matrix_cases: usize, budget_minutes: f64) {
    for case in cases {
        println!(
            "{}: tidemark test {}",
            case.id.label(),
            case.test_args().join(" ")
        );
    }
    let main_minutes: f64 = cases.iter().map(|c| c.time_limit_s).sum::<f64>() / 60.0;
    println!(
        "{} of the matrix's {matrix_cases} cases; main phases {main_minutes:.1} min (each case also \
         takes about 15-40 s of set-up, healing, final reads and teardown); budget {budget_minutes} min",
        cases.len()
    );
}

fn run_night(args: &Args, matrix_path: &Path) -> Result<u8, Failure> {
    let text = std::fs::read_to_string(matrix_path)
        .map_err(|e| bad_input(format!("{}: {e}", matrix_path.display())))?;
    let matrix = Matrix::parse(matrix_path, &text).map_err(bad_input)?;
    let budget_minutes = args.budget_minutes.unwrap_or(matrix.budget_minutes);
    if !(budget_minutes.is_finite() && budget_minutes > 0.0) {
        return Err(bad_input(
            "--budget-minutes must be a positive number of minutes".into(),
        ));
    }
    let all = matrix.cases();
    let matrix_cases = all.len();
    let cases = match args.shard {
        Some(shard) => shard.slice(all),
        None => all,
    };
    if args.list {
        list(&cases, matrix_cases, budget_minutes);
        return Ok(0);
    }
    let store = &args.store;
    let (started, night_dir) = new_night_dir(store)?;
    let store =
        std::fs::canonicalize(store).map_err(|e| harness(format!("{}: {e}", store.display())))?;
    let mut trials = Trials::new().map_err(harness)?;
    let mut night = Night {
        started,
        matrix: matrix_path.to_path_buf(),
        shard: args.shard,
        matrix_cases,
        budget_minutes,
        cases: Vec::new(),
        gaps_s: Vec::new(),
        finished: false,
    };
    eprintln!(
        "tidemark nightly: {} cases{}, budget {budget_minutes} min, night {}",
        cases.len(),
        args.shard
            .map(|s| format!(" (shard {s})"))
            .unwrap_or_default(),
        night_dir.display()
    );
    write_night(&store, &night_dir, &night)?;
    let began = Instant::now();
    let mut last_exit: Option<Instant> = None;
    let mut interrupted = false;
    for (k, case) in cases.iter().enumerate() {
        let elapsed_min = began.elapsed().as_secs_f64() / 60.0;
        let record = if interrupted {
            not_run(case, "the night was interrupted")
        } else if elapsed_min + case.time_limit_s / 60.0 > budget_minutes {
            not_run(
                case,
                &format!(
                    "the budget of {budget_minutes} min: {elapsed_min:.1} min gone, the case's \
                     time limit is {} s",
                    case.time_limit_s
                ),
            )
        } else {
            let mut test_args: Vec<OsString> =
                case.test_args().into_iter().map(OsString::from).collect();
            test_args.extend([
                "--store".into(),
                store.clone().into_os_string(),
                "--quiet".into(),
            ]);
            match trials.run_test(&test_args) {
                Ok(child) => {
                    if let Some(prev) = last_exit {
                        night.gaps_s.push((child.started - prev).as_secs_f64());
                    }
                    last_exit = Some(child.ended);
                    judge(case, &child, &store)
                }
                Err(TrialError::Interrupted) => {
                    interrupted = true;
                    eprintln!("tidemark nightly: interrupted; starting no more cases");
                    crashed(
                        case,
                        "interrupted by SIGINT or SIGTERM (a running child tore its cluster down)",
                    )
                }
                Err(TrialError::Failed(e)) => crashed(case, &e),
            }
        };
        eprintln!(
            "tidemark nightly: [{}/{}] {}: {} ({}) {:.1} s",
            k + 1,
            cases.len(),
            case.id.label(),
            record.verdict.name(),
            record.status.name(),
            record.duration_s
        );
        night.cases.push(record);
        night.finished = k + 1 == cases.len() && !interrupted;
        write_night(&store, &night_dir, &night)?;
    }
    if cases.is_empty() {
        night.finished = true;
        write_night(&store, &night_dir, &night)?;
    }
    let (max, mean) = night::overhead(&night.gaps_s);
    let code = night::exit_code(night.cases.iter().map(|c| &c.status));
    eprintln!(
        "tidemark nightly: index {}, JUnit {}; overhead between runs max {max:.3} s, mean \
         {mean:.3} s; exit {code}",
        night_dir.join("index.html").display(),
        night_dir.join("junit.xml").display()
    );
    Ok(if interrupted {
        crate::EXIT_HARNESS_FAILED
    } else {
        code
    })
}

/// Makes `STORE/nightly/<stamp>/` for a night starting now.
fn new_night_dir(store: &Path) -> Result<(String, PathBuf), Failure> {
    let stamp = utc_stamp(SystemTime::now());
    let nights = store.join("nightly");
    std::fs::create_dir_all(&nights).map_err(|e| harness(format!("{}: {e}", nights.display())))?;
    let mut n = 0;
    loop {
        let name = if n == 0 {
            stamp.clone()
        } else {
            format!("{stamp}-{n}")
        };
        match std::fs::create_dir(nights.join(&name)) {
            Ok(()) => return Ok((name.clone(), nights.join(name))),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(harness(format!("{}: {e}", nights.join(name).display()))),
        }
    }
}

fn not_run(case: &Case, why: &str) -> CaseRecord {
    record(case, Verdict::NotRun, None, Some(why.to_string()))
}

fn crashed(case: &Case, why: &str) -> CaseRecord {
    record(case, Verdict::Crashed, None, Some(why.to_string()))
}

fn record(case: &Case, verdict: Verdict, exit: Option<i32>, message: Option<String>) -> CaseRecord {
    let expected = case.id.expected();
    CaseRecord {
        id: case.id.clone(),
        expected,
        verdict,
        status: Status::of(expected, verdict),
        duration_s: 0.0,
        anomaly_counts: Default::default(),
        bad_anomaly_types: Vec::new(),
        run_dir: None,
        exit_code: exit,
        message,
    }
}

/// The case's record from its child's exit and the run directory it left.
fn judge(case: &Case, child: &ChildTest, store: &Path) -> CaseRecord {
    let exit = child.output.status.code();
    let last_line = crate::rerun::last_words(&child.output.stderr);
    let why = |what: &str| {
        format!(
            "{what} (tidemark test exited {}){}",
            exit.map_or("on a signal".into(), |c| c.to_string()),
            last_line.map(|l| format!(": {l}")).unwrap_or_default()
        )
    };
    let dir = child.run_dir();
    let results: Option<Value> = dir
        .as_ref()
        .and_then(|d| std::fs::read(d.join("results.json")).ok())
        .and_then(|b| serde_json::from_slice(&b).ok());
    let verdict = match results.as_ref().map(|r| &r["valid"]) {
        Some(Value::Bool(true)) => Verdict::Valid,
        Some(Value::Bool(false)) => Verdict::Invalid,
        Some(Value::String(s)) if s == "unknown" => Verdict::Unknown,
        _ => Verdict::Crashed,
    };
    let mut r = record(
        case,
        verdict,
        exit,
        (verdict == Verdict::Crashed).then(|| {
            why(if dir.is_none() {
                "no run directory"
            } else {
                "no verdict in results.json"
            })
        }),
    );
    r.duration_s = (child.ended - child.started).as_secs_f64();
    r.run_dir = dir.and_then(|d| {
        let d = std::fs::canonicalize(d).ok()?;
        d.strip_prefix(store).ok().map(Path::to_path_buf)
    });
    if let Some(results) = results {
        if let Some(counts) = results["anomaly_counts"].as_object() {
            r.anomaly_counts = counts
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect();
        }
        r.bad_anomaly_types = crate::evidence::strings(&results["bad_anomaly_types"]);
    }
    r
}

/// Writes night.json, junit.xml and index.html of `night` into `dir`, each through a temporary
/// file and a rename, so a reader never sees half of one.
fn write_night(store: &Path, dir: &Path, night: &Night) -> Result<(), Failure> {
    let json = serde_json::to_string_pretty(night).expect("plain data serializes");
    write_atomically(&dir.join("night.json"), &json)?;
    let mut nights: Vec<(String, Vec<CaseRecord>)> = match load_nights(store) {
        Ok(nights) => nights
            .into_iter()
            .filter(|n| n.started < night.started)
            .map(|n| (n.started, n.cases))
            .collect(),
        Err(e) => {
            eprintln!("tidemark nightly: the trend leaves the earlier nights out: {e}");
            Vec::new()
        }
    };
    nights.push((night.started.clone(), night.cases.clone()));
    let trend = night::trend(&nights[nights.len().saturating_sub(TREND_NIGHTS)..]);
    let rows: Vec<Row> = night
        .cases
        .iter()
        .map(|c| Row {
            case: c,
            report: c
                .run_dir
                .as_ref()
                .map(|d| format!("../../{}/report.html", d.display())),
        })
        .collect();
    let overhead = night::overhead(&night.gaps_s);
    let title = format!("tidemark nightly {}", night.started);
    let summary = Summary {
        title: &title,
        started: &night.started,
        scope: night
            .shard
            .map_or("the whole matrix".into(), |s| format!("shard {s}")),
        matrix_cases: night.matrix_cases,
        exit_code: night::exit_code(night.cases.iter().map(|c| &c.status)),
        finished: night.finished,
        overhead_s: overhead,
        warning: None,
    };
    write_atomically(
        &dir.join("index.html"),
        &index::render(&summary, &rows, &trend),
    )?;
    write_atomically(
        &dir.join("junit.xml"),
        &junit::render(&title, &night.started, &night.cases, overhead.0),
    )
}

fn write_atomically(path: &Path, text: &str) -> Result<(), Failure> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| harness(format!("{}: {e}", path.display())))
}

/// Every night of `store`, oldest first.
fn load_nights(store: &Path) -> Result<Vec<Night>, String> {
    let dir = store.join("nightly");
    let mut names: Vec<String> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.path().join("night.json").is_file())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    };
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let path = dir.join(name).join("night.json");
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(&text))
                .map_err(|e| format!("{}: field `{}`: {}", path.display(), e.path(), e.inner()))
        })
        .collect()
}

fn merge(args: &MergeArgs) -> Result<u8, Failure> {
    let mut stores = Vec::new();
    for store in &args.stores {
        let canon = std::fs::canonicalize(store)
            .map_err(|e| bad_input(format!("{}: {e}", store.display())))?;
        let nights = load_nights(&canon).map_err(bad_input)?;
        if nights.is_empty() {
            return Err(bad_input(format!(
                "{}: no night in this store (no nightly/*/night.json)",
                store.display()
            )));
        }
        stores.push((canon, nights));
    }
    std::fs::create_dir_all(&args.out)
        .map_err(|e| harness(format!("{}: {e}", args.out.display())))?;
    let out = std::fs::canonicalize(&args.out)
        .map_err(|e| harness(format!("{}: {e}", args.out.display())))?;
    let latest: Vec<&Night> = stores
        .iter()
        .map(|(_, n)| n.last().expect("not empty"))
        .collect();
    let shards: Vec<Option<Shard>> = latest.iter().map(|n| n.shard).collect();
    let missing = missing_shards(&shards);
    // The merged nights, newest last: the k-th from the end of every store together.
    let depth = stores
        .iter()
        .map(|(_, n)| n.len())
        .max()
        .unwrap_or(0)
        .min(TREND_NIGHTS);
    let mut merged: Vec<(String, Vec<CaseRecord>)> = Vec::new();
    for back in (0..depth).rev() {
        let mut started = String::new();
        let mut cases = Vec::new();
        for (_, nights) in &stores {
            if let Some(n) = nights.len().checked_sub(back + 1).map(|i| &nights[i]) {
                started = started.max(n.started.clone());
                cases.extend(n.cases.iter().cloned());
            }
        }
        merged.push((started, cases));
    }
    let trend = night::trend(&merged);
    let mut cases: Vec<CaseRecord> = Vec::new();
    let mut rows_links = Vec::new();
    for ((store, _), night) in stores.iter().zip(&latest) {
        for c in &night.cases {
            if cases.iter().any(|seen| seen.id == c.id) {
                continue;
            }
            rows_links.push(c.run_dir.as_ref().map(|d| {
                relative(&out, &store.join(d).join("report.html"))
                    .display()
                    .to_string()
            }));
            cases.push(c.clone());
        }
    }
    let rows: Vec<Row> = cases
        .iter()
        .zip(rows_links)
        .map(|(case, report)| Row { case, report })
        .collect();
    let gaps: Vec<f64> = latest
        .iter()
        .flat_map(|n| n.gaps_s.iter().copied())
        .collect();
    let overhead = night::overhead(&gaps);
    let started = merged.last().map(|(s, _)| s.clone()).unwrap_or_default();
    let mut code = night::exit_code(cases.iter().map(|c| &c.status));
    let warning = (!missing.is_empty()).then(|| {
        if code == 0 || code == 1 {
            code = 2;
        }
        format!("Shards missing from this night: {}", missing.join(", "))
    });
    let title = format!("tidemark nightly {started} (merged)");
    let summary = Summary {
        title: &title,
        started: &started,
        scope: format!(
            "shards {}",
            shards
                .iter()
                .map(|s| s.map_or("(whole matrix)".into(), |s| s.to_string()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        matrix_cases: latest.iter().map(|n| n.matrix_cases).max().unwrap_or(0),
        exit_code: code,
        finished: latest.iter().all(|n| n.finished) && missing.is_empty(),
        overhead_s: overhead,
        warning,
    };
    write_atomically(
        &out.join("index.html"),
        &index::render(&summary, &rows, &trend),
    )?;
    write_atomically(
        &out.join("junit.xml"),
        &junit::render(&title, &started, &cases, overhead.0),
    )?;
    let night = Night {
        started: started.clone(),
        matrix: latest[0].matrix.clone(),
        shard: None,
        matrix_cases: summary.matrix_cases,
        budget_minutes: latest[0].budget_minutes,
        cases,
        gaps_s: gaps,
        finished: summary.finished,
    };
    write_atomically(
        &out.join("night.json"),
        &serde_json::to_string_pretty(&night).expect("plain data serializes"),
    )?;
    eprintln!(
        "tidemark nightly merge: {} cases from {} stores: index {}, JUnit {}; exit {code}",
        night.cases.len(),
        stores.len(),
        out.join("index.html").display(),
        out.join("junit.xml").display()
    );
    Ok(code)
}

/// The shards (`I/N`) a merge lacks, when its stores ran shards of one N.
fn missing_shards(shards: &[Option<Shard>]) -> Vec<String> {
    let Some(of) = shards.iter().flatten().map(|s| s.of).max() else {
        return Vec::new();
    };
    (1..=of)
        .filter(|i| !shards.iter().flatten().any(|s| s.index == *i && s.of == of))
        .map(|i| format!("{i}/{of}"))
        .collect()
}

/// `to` as a path relative to the directory `from`; both absolute.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_to_the_common_ancestor() {
        assert_eq!(
            relative(Path::new("/ci/out"), Path::new("/ci/s1/q/r/report.html")),
            PathBuf::from("../s1/q/r/report.html")
        );
        assert_eq!(
            relative(Path::new("/a"), Path::new("/a/b")),
            PathBuf::from("b")
        );
    }

    #[test]
    fn a_merge_names_the_shards_it_lacks() {
        let s = |index, of| Some(Shard { index, of });
        assert_eq!(missing_shards(&[s(1, 3), s(3, 3)]), ["2/3"]);
        assert!(missing_shards(&[s(2, 2), s(1, 2)]).is_empty());
        assert!(missing_shards(&[None]).is_empty());
    }
}
